/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * probe_dmabuf_udmabuf: the dma-buf export probe (probe_dmabuf.h) with the kernel's own exporter,
 * udmabuf, as the flavour: the control for the GPU flavours.
 *
 * An "allocation" is a sealed memfd mapped into this process (its CPU address stands in for the
 * device address), an export is UDMABUF_CREATE over [offset, offset + length) of it, and the
 * range answers come from this probe's own table, since udmabuf has no allocation lookup: they
 * show the runner, not a runtime. udmabuf honours range and offset by construction and refuses
 * lengths and offsets off the page, so where the dmabuf_import module is loaded, a run that says
 * otherwise is a fault of the probe or of the importer, not a finding about an exporter. That
 * makes it the check on the segment reading that the GPU flavours depend on, runnable in a
 * guest with no GPU.
 *
 * Needs /dev/udmabuf (Linux 4.20 with CONFIG_UDMABUF; Debian's 6.12 and 7.x kernels, not 6.1);
 * the segments need the dmabuf_import module and root.
 * Usage: probe_dmabuf_udmabuf   (also -h/--help, --version; tools/opt.h parses)
 * Prints findings and exits 0; 2 for usage errors (with a message naming the argument), 1 when
 * there is no /dev/udmabuf.
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/udmabuf.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "opt.h"
#include "probe_common.h"
#include "probe_dmabuf.h"

#define MAX_ALLOCS 16

static struct {
	int memfd;
	uint64_t base; /* where the memfd is mapped here */
	uint64_t size;
} allocs[MAX_ALLOCS];
static int nallocs, udmabuf_dev = -1;

static int probe_dmabuf_alloc(struct probe_dmabuf_rt *rt, uint64_t size, uint64_t *ptr)
{
	void *va;
	int fd, err;

	if (nallocs == MAX_ALLOCS) {
		snprintf(rt->why, sizeof(rt->why), "table full");
		return -ENOMEM;
	}
	err = probe_memfd(size, &fd);
	if (err) {
		snprintf(rt->why, sizeof(rt->why), "memfd_create/ftruncate");
		return err;
	}
	va = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (va == MAP_FAILED) {
		err = -errno;
		close(fd);
		snprintf(rt->why, sizeof(rt->why), "mmap");
		return err;
	}
	allocs[nallocs].memfd = fd;
	allocs[nallocs].base = (uint64_t)(uintptr_t)va;
	allocs[nallocs].size = size;
	nallocs++;
	*ptr = (uint64_t)(uintptr_t)va;
	return 0;
}

static int probe_dmabuf_range(struct probe_dmabuf_rt *rt, uint64_t ptr, uint64_t *base,
			      uint64_t *size)
{
	for (int i = 0; i < nallocs; i++) {
		if (ptr >= allocs[i].base && ptr - allocs[i].base < allocs[i].size) {
			*base = allocs[i].base;
			*size = allocs[i].size;
			return 0;
		}
	}
	snprintf(rt->why, sizeof(rt->why), "not in the probe's table");
	return -ENOENT;
}

static int probe_dmabuf_export(struct probe_dmabuf_rt *rt, uint64_t ptr, uint64_t len, int *fd)
{
	struct udmabuf_create cr;
	uint64_t base, size;
	int err = probe_dmabuf_range(rt, ptr, &base, &size);

	*fd = -1;
	if (err)
		return err;
	memset(&cr, 0, sizeof(cr));
	for (int i = 0; i < nallocs; i++)
		if (allocs[i].base == base)
			cr.memfd = (uint32_t)allocs[i].memfd;
	cr.flags = UDMABUF_FLAGS_CLOEXEC;
	cr.offset = ptr - base;
	cr.size = len;
	*fd = ioctl(udmabuf_dev, UDMABUF_CREATE, &cr);
	if (*fd < 0) {
		err = -errno;
		snprintf(rt->why, sizeof(rt->why), "UDMABUF_CREATE");
		return err;
	}
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: probe_dmabuf_udmabuf\n"
		   "  -h, --help this text; --version the version\n"
		   "Asks udmabuf (/dev/udmabuf) what its dma-bufs describe; the segments need the\n"
		   "dmabuf_import module. Exits 0; 2 for usage errors, 1 without /dev/udmabuf.\n");
}

enum { UDMABUF_O_VERSION = 256 };

static const struct option udmabuf_long_opts[] = {
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, UDMABUF_O_VERSION },
	{ NULL, 0, NULL, 0 },
};

int main(int argc, char **argv)
{
	struct probe_dmabuf_rt rt;
	int c;

	opt_tool = "probe_dmabuf_udmabuf";
	argv[0] = (char *)opt_tool; /* getopt's own messages name the probe */
	while ((c = getopt_long(argc, argv, "h", udmabuf_long_opts, NULL)) != -1) {
		switch (c) {
		case 'h':
			usage(stdout);
			return PROBE_EXIT_OK;
		case UDMABUF_O_VERSION:
			return opt_version();
		default:
			return opt_unknown();
		}
	}
	if (optind < argc)
		return opt_bad("argument", argv[optind], "no arguments");
	memset(&rt, 0, sizeof(rt));
	rt.name = "udmabuf";
	probe_begin("probe_dmabuf_udmabuf", "the dma-buf export probe with udmabuf as the exporter "
					    "(the control for the GPU flavours)");
	udmabuf_dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	if (udmabuf_dev < 0) {
		probe_say(
		    "no /dev/udmabuf to ask: %s (kernel without CONFIG_UDMABUF, e.g. Debian's "
		    "6.1, or modprobe udmabuf)",
		    probe_err(errno));
		return PROBE_EXIT_CANNOT;
	}
	snprintf(rt.runtime, sizeof(rt.runtime), "(the kernel's udmabuf over sealed memfds)");
	snprintf(rt.device, sizeof(rt.device),
		 "none: CPU addresses of the memfd mappings stand in for device addresses, and "
		 "range answers come from the probe's table");
	rt.granularity = (uint64_t)sysconf(_SC_PAGESIZE);
	probe_dmabuf_run(&rt);
	close(udmabuf_dev);
	return PROBE_EXIT_OK;
}
