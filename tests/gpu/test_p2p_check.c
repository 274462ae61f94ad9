/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The P2P placement check (gpu/p2p_check.h) against a fake sysfs tree and a fake /proc/iomem:
 * segments inside the GPU's BAR window pass; a segment in System RAM (what an exporter that moved
 * the buffer to host memory hands out) and one outside the window are refused with -EXDEV and a
 * message naming which; /proc/iomem read without privilege (every address 0) is -EPERM, never
 * "no system RAM". Runs on any machine (tests/gpu/check-p2p.sh); TAP output.
 */
#include <upcie/gpu/p2p_check.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../unit/check.h"

static char last[512];

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	snprintf(last, sizeof(last), "%s", msg);
}

static void put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f || fputs(text, f) < 0 || fclose(f)) {
		perror(path);
		exit(2);
	}
}

int main(void)
{
	char root[] = "/tmp/upcie-p2p-XXXXXX", p[512], iomem[600], hidden[600];
	struct upcie_gpu_p2p_window w;
	struct upcie_gpu_p2p_sysram *s = malloc(sizeof(*s));
	struct upcie_dmamem mem;
	uint64_t lut[4];
	int err;

	if (!s || !mkdtemp(root))
		return 2;
	upcie_log_set_handler(capture, NULL);
	snprintf(p, sizeof(p), "%s/bus", root);
	mkdir(p, 0755);
	snprintf(p, sizeof(p), "%s/bus/pci", root);
	mkdir(p, 0755);
	snprintf(p, sizeof(p), "%s/bus/pci/devices", root);
	mkdir(p, 0755);
	snprintf(p, sizeof(p), "%s/bus/pci/devices/0000:2b:00.0", root);
	mkdir(p, 0755);
	snprintf(p, sizeof(p), "%s/bus/pci/devices/0000:2b:00.0/resource", root);
	/* BAR0 16 MiB registers, BAR1 256 GiB prefetchable window at 0x38000000000. */
	put(p, "0x00000000fa000000 0x00000000faffffff 0x0000000000040200\n"
	       "0x0000038000000000 0x0000039fffffffff 0x000000000014220c\n"
	       "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
	       "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
	       "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
	       "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
	       "0x0000000000000000 0x0000000000000000 0x0000000000000000\n");
	snprintf(iomem, sizeof(iomem), "%s/iomem", root);
	put(iomem, "00000000-00000fff : Reserved\n"
		   "00001000-0009ffff : System RAM\n"
		   "00100000-7fffffff : System RAM\n"
		   "  01000000-01ffffff : Kernel code\n"
		   "fa000000-faffffff : 0000:2b:00.0\n"
		   "100000000-207fffffff : System RAM\n"
		   "38000000000-39fffffffff : PCI Bus 0000:2b\n"
		   "  38000000000-39fffffffff : 0000:2b:00.0\n");
	snprintf(hidden, sizeof(hidden), "%s/iomem-hidden", root);
	put(hidden, "00000000-00000000 : Reserved\n"
		    "00000000-00000000 : System RAM\n"
		    "00000000-00000000 : PCI Bus 0000:2b\n");
	setenv("UPCIE_SYSFS_ROOT", root, 1);

	err = upcie_gpu_p2p_window_read("0000:2b:00.0", 1, &w);
	CHECK(err == 0 && w.start == 0x38000000000ull && w.size == 0x2000000000ull,
	      "BAR1 window from sysfs resource: %d, 0x%" PRIx64 " + 0x%" PRIx64, err, w.start,
	      w.size);
	err = upcie_gpu_p2p_window_read("0000:2b:00.0", 2, &w);
	CHECK(err == -ENODEV, "a BAR the function does not have: %d", err);
	upcie_gpu_p2p_window_read("0000:2b:00.0", 1, &w);

	setenv("UPCIE_IOMEM_PATH", iomem, 1);
	err = upcie_gpu_p2p_sysram_load(s);
	CHECK(err == 0 && s->n == 3 && s->start[2] == 0x100000000ull &&
		  s->end[2] == 0x207fffffffull,
	      "System RAM from iomem: top-level ranges only (%d, %u ranges)", err, s->n);

	memset(&mem, 0, sizeof(mem));
	mem.size = 4 * 65536 - 4096; /* last granule partial */
	mem.lut = lut;
	mem.nlut = 4;
	mem.granule_shift = 16;
	lut[0] = 0x38000000000ull;
	lut[1] = 0x38000100000ull;
	lut[2] = 0x38000010000ull;
	lut[3] = 0x39fffff0000ull; /* the window's last granule */
	err = upcie_gpu_p2p_check_dmamem(&w, s, &mem, "test LUT");
	CHECK(err == 0, "LUT of granules inside BAR1, the last one at its end: %d", err);

	/* The negative control: host pages presented as the GPU's (a GTT placement). */
	lut[2] = 0x1234560000ull;
	last[0] = 0;
	err = upcie_gpu_p2p_check_dmamem(&w, s, &mem, "test LUT");
	CHECK(err == -EXDEV && strstr(last, "system RAM") && strstr(last, "host memory"),
	      "one granule in System RAM: %d (\"%s\")", err, last);
	lut[2] = 0x40000000000ull;
	last[0] = 0;
	err = upcie_gpu_p2p_check_dmamem(&w, s, &mem, "test LUT");
	CHECK(err == -EXDEV && strstr(last, "outside BAR1"),
	      "one granule past the window: %d (\"%s\")", err, last);
	lut[2] = 0x38000010000ull;
	lut[3] = 0x39ffffff000ull; /* straddles the window's end by 60 KiB - 4 KiB */
	mem.size = 4 * 65536;
	err = upcie_gpu_p2p_check_dmamem(&w, s, &mem, "test LUT");
	CHECK(err == -EXDEV, "a granule straddling the window's end: %d", err);

	/* Arithmetic memory: one segment. */
	memset(&mem, 0, sizeof(mem));
	mem.size = 1 << 20;
	mem.iova = 0x38000000000ull;
	CHECK(upcie_gpu_p2p_check_dmamem(&w, s, &mem, "arith") == 0, "arithmetic range in BAR1");
	mem.iova = 0x7ff00000ull; /* straddles the end of System RAM */
	CHECK(upcie_gpu_p2p_check_dmamem(&w, s, &mem, "arith") == -EXDEV,
	      "arithmetic range touching System RAM");

	setenv("UPCIE_IOMEM_PATH", hidden, 1);
	err = upcie_gpu_p2p_sysram_load(s);
	CHECK(err == -EPERM && strstr(last, "CAP_SYS_ADMIN"),
	      "iomem with hidden addresses: %d, not \"no system RAM\"", err);

	snprintf(p, sizeof(p), "rm -rf '%s'", root);
	if (system(p))
		return 2;
	free(s);
	printf("1..%d\n", check_n_);
	return check_failed_ ? 1 : 0;
}
