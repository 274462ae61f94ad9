/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest test for how upcie states and checks the IOMMU mode and keeps its IOMMU bookkeeping,
 * on NVMe c0 (c0n1 holds the test bed pattern). What runs depends on the configuration:
 *
 *   no IOMMU (A)        vfio in no-IOMMU mode (enable_unsafe_noiommu_mode, c0 on vfio-pci):
 *                       opening c0 on the type1 path is refused with a message that says so.
 *   translating (B, C)  the uio path is refused for a function whose IOMMU group translates
 *                       (instead of every DMA faulting); the type1 DMA-mapping budget
 *                       (dma_entry_limit made small) runs out with -ENOSPC and a message naming
 *                       it; plain memory mapped through type1 is charged to RLIMIT_MEMLOCK once
 *                       (VmLck grows by its size, not twice); a dmamem destroyed after its
 *                       controller was closed and opened again does not unmap the new owner's
 *                       mapping at the same IOVA (the new memory still receives a read); a
 *                       function reset through vfio leaves bus mastering as it was.
 *   iommufd (C)         dmamem through the IOAS gets IOVAs from upcie's allocator: at or above
 *                       4 GiB, never in the first MiB (the kernel's own choice starts at 4 KiB),
 *                       hugepage memory aligned to its page size.
 *
 * Usage: t_mem_iommu noiommu|translating|iommufd...   (TB_C0_BDF, TB_NONCE; root)
 */
#include <upcie/mem/dmamem_iommufd.h>
#include <upcie/mem/dmamem_type1.h>
#include <upcie/mem/hugepage.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>
#include <upcie/pci/config.h>
#include <upcie/pci/driver.h>
#include <upcie/vfio/cdev.h>
#include <upcie/vfio/iommufd.h>
#include <upcie/vfio/type1.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "t_nvme_util.h"

static struct upcie_pci_bdf g_c0;
static char g_msg[1024]; /* the last error upcie logged */

static void log_cb(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)ctx;
	if (level == UPCIE_LOG_ERROR)
		snprintf(g_msg, sizeof(g_msg), "%s", msg);
	printf("# upcie %s: %s\n", level == UPCIE_LOG_ERROR ? "error" : "log", msg);
	fflush(stdout);
}

static int done(void)
{
	printf("1..%d\n", tn_n);
	return tn_failed ? 1 : 0;
}

static long vm_lck_kb(void)
{
	char line[256];
	long kb = -1;
	FILE *fp = fopen("/proc/self/status", "r");

	while (fp && fgets(line, sizeof(line), fp))
		if (sscanf(line, "VmLck: %ld kB", &kb) == 1)
			break;
	if (fp)
		fclose(fp);
	return kb;
}

static int open_ctrl(struct upcie_nvme_ctrl *c, enum upcie_nvme_path path)
{
	struct upcie_nvme_ctrl_opts o;

	memset(&o, 0, sizeof(o));
	o.dev.path = path;
	o.dev.bind = true;
	o.host_mem = 4 * MiB;
	return upcie_nvme_ctrl_open(c, &g_c0, &o);
}

/* vfio without an IOMMU: refused, saying why. */
static void test_noiommu(void)
{
	struct upcie_nvme_dev_opts o;
	struct upcie_nvme_dev d;
	int err;

	memset(&o, 0, sizeof(o));
	o.path = UPCIE_NVME_PATH_TYPE1;
	g_msg[0] = '\0';
	err = upcie_nvme_dev_open(&d, &g_c0, &o);
	TAP(err == -EOPNOTSUPP, "no-IOMMU vfio: the type1 path is refused with -EOPNOTSUPP (%d)",
	    err);
	TAP(strstr(g_msg, "no-IOMMU") && strstr(g_msg, "uio"),
	    "no-IOMMU vfio: the message says vfio has no IOMMU here and points to uio (%s)", g_msg);
	if (!err)
		upcie_nvme_dev_close(&d);
}

static void test_uio_refused(void)
{
	struct upcie_nvme_dev_opts o;
	struct upcie_nvme_dev d;
	int err;

	memset(&o, 0, sizeof(o));
	o.path = UPCIE_NVME_PATH_UIO;
	o.bind = true;
	g_msg[0] = '\0';
	err = upcie_nvme_dev_open(&d, &g_c0, &o);
	TAP(err == -EOPNOTSUPP,
	    "uio under a translating IOMMU: refused at open with -EOPNOTSUPP (%d)", err);
	TAP(strstr(g_msg, "translates") && strstr(g_msg, "vfio"),
	    "uio under a translating IOMMU: the message names the IOMMU and the vfio paths (%s)",
	    g_msg);
	if (!err)
		upcie_nvme_dev_close(&d);
}

/* Map 4 KiB pages one by one until the container's budget (made small) is used up. */
static void test_budget(void)
{
	const char *param = "/sys/module/vfio_iommu_type1/parameters/dma_entry_limit";
	char saved[32] = "";
	struct upcie_vfio_type1_info info;
	struct upcie_vfio_container c;
	struct upcie_vfio_group g;
	struct upcie_dmamem mem[8];
	int n = 0, err = 0, gid;
	void *pages;

	if (upcie_file_read_str(param, saved, sizeof(saved)) <= 0 ||
	    upcie_file_write_str(param, "6")) {
		TAP(0, "budget: set %s to 6", param);
		return;
	}
	memset(&info, 0, sizeof(info));
	pages = mmap(NULL, 8 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	gid = upcie_vfio_group_id(&g_c0);
	err = upcie_vfio_container_open(&c);
	if (!err)
		err = upcie_vfio_group_open(&g, &c, gid);
	if (!err)
		err = upcie_vfio_container_info(&c, &info);
	TAP(!err && info.dma_avail == 6,
	    "budget: the container reports dma_avail %u of dma_entry_limit 6 (%d)", info.dma_avail,
	    err);
	while (!err && n < 8) {
		err = upcie_dmamem_type1_map(&mem[n], &c, (char *)pages + n * 4096, 4096, 0);
		n += !err;
	}
	TAP(n == 6 && err == -ENOSPC, "budget: 6 mappings made, the 7th is -ENOSPC (%d made, %d)",
	    n, err);
	TAP(strstr(g_msg, "dma_entry_limit") && strstr(g_msg, "budget"),
	    "budget: the message names the budget and its limit (%s)", g_msg);
	if (n)
		upcie_dmamem_destroy(&mem[--n]);
	err = upcie_dmamem_type1_map(&mem[n], &c, (char *)pages + n * 4096, 4096, 0);
	TAP(!err, "budget: one unmapped, one more fits again (%d)", err);
	n += !err;
	while (n)
		upcie_dmamem_destroy(&mem[--n]);
	upcie_vfio_group_close(&g);
	upcie_vfio_container_close(&c);
	munmap(pages, 8 * 4096);
	upcie_file_write_str(param, saved);
}

/* Plain memory through type1: vfio pins and charges it; an mlock on top would charge it twice. */
static void test_memlock(void)
{
	struct upcie_hugepage_opts plain = { .src = UPCIE_HUGEPAGE_PLAIN };
	struct upcie_vfio_container c;
	struct upcie_vfio_group g;
	struct upcie_dmamem mem;
	long before, after;
	int err;

	err = upcie_vfio_container_open(&c);
	if (!err)
		err = upcie_vfio_group_open(&g, &c, upcie_vfio_group_id(&g_c0));
	before = vm_lck_kb();
	if (!err)
		err = upcie_dmamem_type1_hugepage(&mem, &c, 8 * MiB, &plain);
	after = vm_lck_kb();
	TAP(!err, "memlock: 8 MiB of plain memory mapped through type1 (%d)", err);
	TAP(after - before == 8192,
	    "memlock: RLIMIT_MEMLOCK charged once: VmLck %ld kB -> %ld kB (+%ld, want +8192)",
	    before, after, after - before);
	if (!err)
		upcie_dmamem_destroy(&mem);
	upcie_vfio_group_close(&g);
	upcie_vfio_container_close(&c);
}

/* Memory destroyed after its controller was closed and opened again: the new mapping lives. */
static void test_generation(void)
{
	static struct upcie_nvme_ctrl c;
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct upcie_dmamem a, b;
	char tag[9];
	int64_t diff = 0;
	int err;

	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	err = open_ctrl(&c, UPCIE_NVME_PATH_TYPE1);
	if (!err)
		err = upcie_nvme_dev_dmamem(&c.dev, 2 * MiB, &a);
	upcie_nvme_ctrl_close(&c);
	TAP(!err && a.size, "gen: memory A mapped at IOVA 0x%" PRIx64 ", then c0 closed (%d)",
	    a.iova, err);
	if (err)
		return;
	err = open_ctrl(&c, UPCIE_NVME_PATH_TYPE1);
	if (!err)
		err = upcie_nvme_dev_dmamem(&c.dev, 2 * MiB, &b);
	TAP(!err && b.iova == a.iova,
	    "gen: c0 opened again, memory B mapped at the same IOVA 0x%" PRIx64 " (%d)", b.iova,
	    err);
	g_msg[0] = '\0';
	upcie_dmamem_destroy(&a);
	TAP(strstr(g_msg, "not unmapping") != NULL, "gen: destroying A now refuses to unmap (%s)",
	    g_msg);
	memset(&qo, 0, sizeof(qo));
	qo.depth = 16;
	if (!err)
		err = upcie_nvme_ns_open(&ns, &c, 1);
	if (!err)
		err = upcie_nvme_ioq_create(&q, &c, &qo);
	if (!err) {
		memset(b.vaddr, 0, 64 * KiB);
		err = upcie_nvme_ioq_read_sync(&q, &ns, 0, &b, 0, 64 * KiB, NULL);
		tn_tag(tag, "c0n1");
		diff = tn_pat_diff(b.vaddr, 64 * KiB, tag, 0);
		upcie_nvme_ioq_delete(&q);
	}
	TAP(!err && diff < 0,
	    "gen: B still receives DMA: c0n1 [0, 64 KiB) read into it intact (%d, first "
	    "difference %" PRId64 ")",
	    err, diff);
	upcie_dmamem_destroy(&b);
	upcie_nvme_ctrl_close(&c);
}

/* VFIO_DEVICE_RESET: the kernel restores the command register, bus mastering included. */
static void test_reset(void)
{
	static struct upcie_nvme_ctrl c;
	uint16_t cmd = 0;
	int err;

	err = open_ctrl(&c, UPCIE_NVME_PATH_TYPE1);
	if (err) {
		TAP(0, "reset: c0 up on type1 (%d)", err);
		return;
	}
	if (!(c.dev.vdev.flags & VFIO_DEVICE_FLAGS_RESET)) {
		SKIP("the kernel has no reset method for c0", "reset: bus mastering after a reset");
		upcie_nvme_ctrl_close(&c);
		return;
	}
	err = upcie_vfio_device_reset(&c.dev.vdev);
	if (!err)
		err = upcie_vfio_region_rw(&c.dev.vdev, VFIO_PCI_CONFIG_REGION_INDEX,
					   UPCIE_PCI_CFG_COMMAND, &cmd, 2, 0);
	TAP(!err && (cmd & UPCIE_PCI_CMD_MASTER),
	    "reset: after VFIO_DEVICE_RESET bus mastering is on again, as before (command 0x%04x, "
	    "%d)",
	    cmd, err);
	TAP(!(upcie_nvme_ctrl_rd32(&c, UPCIE_NVME_REG_CSTS) & 1),
	    "reset: and the controller itself is reset (CSTS.RDY 0)");
	upcie_nvme_ctrl_close(&c);
}

/* iommufd: IOVAs from upcie's allocator, not the kernel's lowest free one. */
static void test_iommufd(void)
{
	struct upcie_hugepage_opts huge = { .src = UPCIE_HUGEPAGE_MEMFD };
	struct upcie_vfio_iommufd ctx;
	struct upcie_vfio_ioas ioas;
	struct upcie_vfio_device dev;
	struct upcie_dmamem small, big;
	int err;

	memset(&small, 0, sizeof(small));
	memset(&big, 0, sizeof(big));
	memset(&ioas, 0, sizeof(ioas));
	memset(&dev, 0, sizeof(dev));
	ioas.fd = dev.fd = -1;
	err = upcie_vfio_iommufd_open(&ctx);
	if (!err)
		err = upcie_vfio_ioas_alloc(&ioas, &ctx);
	if (!err)
		err = upcie_vfio_cdev_open(&dev, &ctx, &g_c0);
	if (!err)
		err = upcie_vfio_cdev_attach(&dev, &ioas);
	TAP(!err, "iommufd: c0 attached to a new IOAS (%d)", err);
	if (err)
		goto out;
	err = upcie_dmamem_iommufd_memfd(&small, &ioas, 4096, NULL, false);
	TAP(!err && small.iova >= UPCIE_VFIO_IOVA_HIGH_START,
	    "iommufd: a 4 KiB buffer at IOVA 0x%" PRIx64 ", at or above 4 GiB (%d)", small.iova,
	    err);
	err = upcie_dmamem_iommufd_memfd(&big, &ioas, 8 * MiB, &huge, false);
	/* 2 MiB: the default hugepage size the case reserved; an IOPTE is never larger */
	TAP(!err && big.iova >= UPCIE_VFIO_IOVA_HIGH_START && big.iova % (2 * MiB) == 0,
	    "iommufd: an 8 MiB buffer of 2 MiB hugepages at IOVA 0x%" PRIx64 ", at or above 4 GiB "
	    "and aligned to its pages (%d)",
	    big.iova, err);
	upcie_dmamem_destroy(&big);
	upcie_dmamem_destroy(&small);
out:
	upcie_vfio_device_close(&dev);
	upcie_vfio_ioas_destroy(&ioas);
	upcie_vfio_iommufd_close(&ctx);
}

int main(int argc, char **argv)
{
	const char *bdf = getenv("TB_C0_BDF");

	if (argc < 2 || !bdf || upcie_pci_bdf_parse(bdf, &g_c0)) {
		fprintf(stderr, "usage: t_mem_iommu noiommu|translating|iommufd... (TB_C0_BDF)\n");
		return 2;
	}
	upcie_log_set_handler(log_cb, NULL);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "noiommu")) {
			test_noiommu();
		} else if (!strcmp(argv[i], "translating")) {
			test_uio_refused();
			TAP(!upcie_pci_driver_bind(&g_c0, "vfio-pci"), "c0 bound to vfio-pci");
			test_budget();
			test_memlock();
			test_generation();
			test_reset();
		} else if (!strcmp(argv[i], "iommufd")) {
			test_iommufd();
		} else {
			fprintf(stderr, "t_mem_iommu: unknown part '%s'\n", argv[i]);
			return 2;
		}
	}
	return done();
}
