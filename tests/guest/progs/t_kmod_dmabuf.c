/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest test of the dmabuf_import module and upcie/kmod/dmabuf_import.h.
 *
 * dma-bufs: vgem dumb buffers (every kernel) and udmabuf (7.x). For each: the scatter list the
 * module reports for its own device equals the physical addresses pagemap gives for the
 * buffer's CPU view, page by page; the LUT dmamem built from it agrees; a second attachment of
 * the same buffer gets its own handle; GET reads any window of the list; a too-small array is
 * never overrun (guard page) and the wrapper answers -ENOSPC with the count needed.
 * Refusals: unprivileged open (EACCES by the node's mode, EPERM by the capability check), bad
 * and non-dma-buf descriptors, reserved bits, unknown and mis-sized requests, double detach,
 * handles of another file. Lifetime: a child's attachments go when it exits; a forked child
 * shares the parent's file; the module cannot be unloaded while an attachment exists and can
 * once it is gone. Named function (the NVMe, NVME_BDF): refused under the kernel nvme driver and
 * vfio-pci, accepted on uio_pci_generic (addresses = physical without an IOMMU, IOVAs of the
 * function's DMA domain with one); the function's removal with an attachment live.
 * Data: the NVMe on uio_pci_generic reads a namespace into the imported buffer through the LUT
 * (pattern checked in the guest) and writes from it (checked on the host, kmod_dmabuf.host.sh):
 * without an IOMMU the buffer is attached for the module's device (physical addresses, queues
 * in hugepages); under the translating vIOMMU everything the controller touches (queues and
 * data) is in dma-bufs attached for the controller itself.
 *
 * The function's state: with no driver bound it is refused (ENODEV: nothing keeps its DMA
 * domain); on uio_pci_generic its DMA mask is 64 bits only while it has attachments (the
 * default 32 otherwise); uio_pci_generic unbinding ends them, vfio-pci taking the function
 * over ends them before it probes. The IOMMU group: with
 * another function of the group on vfio-pci (q35's ICH9 functions share one) the attachment is
 * refused, and that function binding vfio-pci later ends it. Capability: GET without
 * CAP_SYS_ADMIN works, DETACH is EPERM. Bounds over all files: max_total_attachments (ENFILE),
 * max_total_mib (EDQUOT). Last, kernel lockdown closes the module (EPERM on open).
 *
 * Usage: t_kmod_dmabuf NVME_BDF VRAM_BDF   (modules dmabuf_import, vgem, uio_pci_generic)
 */
#include <upcie/base/feature.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <upcie/kmod/dmabuf_import.h>
#include <upcie/mem/hugepage.h>
#include <upcie/pci/bar.h>
#include <upcie/pci/config.h>
#include <upcie/pci/driver.h>

#include "t_kmod.h"

#define DEV UPCIE_DMABUF_IMPORT_DEVICE

static struct upcie_pci_bdf nvme, vram;
static char nvme_name[UPCIE_PCI_BDF_STRLEN], vram_name[UPCIE_PCI_BDF_STRLEN];
static bool iommu;

static uint64_t live(struct upcie_kmod_dmabuf_import *ctx)
{
	struct upcie_dmabuf_import_info info;

	return upcie_kmod_dmabuf_import_info(ctx, &info) ? UINT64_MAX : info.attachments;
}

/* Raw ATTACH: 0 or -errno; a->... filled by the module. */
static int raw_attach(int fd, struct upcie_dmabuf_import_attach *a)
{
	return tk_ioctl(fd, UPCIE_DMABUF_IMPORT_IOC_ATTACH, a);
}

static void test_basics(void)
{
	struct upcie_kmod_dmabuf_import ctx = { 0 };
	struct upcie_dmabuf_import_info info;
	struct stat st;
	pid_t pid;
	int status, err;

	TAP(!stat(DEV, &st) && S_ISCHR(st.st_mode) && (st.st_mode & 0777) == 0600 && !st.st_uid,
	    "%s is a character device, mode 0600, owner root", DEV);
	err = upcie_kmod_dmabuf_import_open(&ctx);
	TAP(!err && ctx.fd > 0, "open (%d)", err);
	TAP(!upcie_kmod_dmabuf_import_info(&ctx, &info) && info.abi == UPCIE_DMABUF_IMPORT_ABI &&
		info.max_attachments > 0,
	    "INFO: ABI %u, max_attachments %u, %" PRIu64 " live", info.abi, info.max_attachments,
	    (uint64_t)info.attachments);
	upcie_kmod_dmabuf_import_close(&ctx);
	upcie_kmod_dmabuf_import_close(&ctx);
	TAP(ctx.fd == 0, "close twice: a no-op the second time");

	/* Unprivileged: the mode keeps others out; with the mode opened up, the module does. */
	for (int open_mode = 0; open_mode < 2; open_mode++) {
		if (open_mode)
			chmod(DEV, 0666);
		fflush(stdout);
		pid = fork();
		if (pid == 0) {
			int fd;

			if (setgid(65534) || setuid(65534))
				_exit(99);
			fd = open(DEV, O_RDWR);
			_exit(fd >= 0 ? 0 : errno);
		}
		waitpid(pid, &status, 0);
		if (open_mode)
			chmod(DEV, 0600);
		if (open_mode)
			TAP(WIFEXITED(status) && WEXITSTATUS(status) == EPERM,
			    "unprivileged open with mode 0666: EPERM from the module (got %d)",
			    WEXITSTATUS(status));
		else
			TAP(WIFEXITED(status) && WEXITSTATUS(status) == EACCES,
			    "unprivileged open with mode 0600: EACCES (got %d)",
			    WEXITSTATUS(status));
	}
}

/* The attachment checks on one buffer kind. */
static void test_buffer(struct upcie_kmod_dmabuf_import *ctx, struct tk_buf *b)
{
	struct upcie_sg_seg *segs, *again, one;
	struct upcie_dmamem mem;
	size_t n = 0, n2 = 0, cap = b->size / 4096, bad;
	uint64_t h = 0, h2 = 0, first, total = 0, before = live(ctx);
	bool lut_ok = true;
	int err;

	segs = calloc(cap, sizeof(*segs));
	again = calloc(cap, sizeof(*again));
	err = upcie_kmod_dmabuf_attach(ctx, b->fd, segs, cap, &n, &h);
	TAP(!err && n > 0 && h, "%s: attach: %zu segments, handle %" PRIu64, b->kind, n, h);
	for (size_t i = 0; i < n; i++)
		total += segs[i].len;
	TAP(total == b->size, "%s: the segments cover the buffer (%" PRIu64 " of %zu bytes)",
	    b->kind, total, b->size);
	if (b->memfd > 0) {
		bad = tk_segs_vs_pagemap(b, segs, n, &first);
		TAP(!bad,
		    "%s: every 4 KiB page's address = pagemap of the CPU view (%zu differ, first "
		    "at 0x%" PRIx64 ")",
		    b->kind, bad, first);
	} else {
		SKIPPED("vgem maps its pages VM_PFNMAP, which pagemap reports as holes; the "
			"addresses are proven by DMA in config A instead",
			"%s: every page's address = pagemap", b->kind);
	}
	DIAG("%s: segment 0: 0x%" PRIx64 " +0x%" PRIx64, b->kind, segs[0].addr, segs[0].len);

	err = upcie_kmod_dmabuf_attach(ctx, b->fd, again, cap, &n2, &h2);
	TAP(!err && h2 && h2 != h && n2 == n && !memcmp(segs, again, n * sizeof(*segs)),
	    "%s: the same buffer attached twice: a second handle (%" PRIu64 "), same list", b->kind,
	    h2);
	TAP(live(ctx) == before + 2, "%s: INFO counts both attachments", b->kind);

	/* GET: a window in the middle, and past the end */
	if (n >= 2) {
		size_t got = 0;

		memset(again, 0, cap * sizeof(*again));
		err = upcie_kmod_dmabuf_segs(ctx, h, 1, again, 1, &got);
		TAP(!err && got == n && !memcmp(&again[0], &segs[1], sizeof(*segs)) &&
			!again[1].len,
		    "%s: GET [1, 2): segment 1 only, full count %zu", b->kind, got);
	} else {
		SKIPPED("one segment", "%s: GET [1, 2)", b->kind);
	}
	{
		struct upcie_dmabuf_import_get g = { .handle = h, .first = (uint32_t)n + 1 };

		TAP(tk_ioctl(ctx->fd, UPCIE_DMABUF_IMPORT_IOC_GET, &g) == -EINVAL,
		    "%s: GET starting past the end: EINVAL", b->kind);
	}

	/* Capacity: the module writes cap entries at most (guard page right after them). */
	{
		long pg = sysconf(_SC_PAGESIZE);
		char *area =
		    mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		struct upcie_sg_seg *last = (struct upcie_sg_seg *)(area + pg) - 1;
		struct upcie_dmabuf_import_attach a;

		mprotect(area + pg, pg, PROT_NONE);
		memset(&a, 0, sizeof(a));
		a.dmabuf_fd = b->fd;
		a.segs = (uint64_t)(uintptr_t)last;
		a.cap = 1;
		err = raw_attach(ctx->fd, &a);
		TAP(!err && a.nsegs == n && last->addr == segs[0].addr,
		    "%s: raw ATTACH with cap 1 in front of a guard page: no overrun, nsegs %u",
		    b->kind, a.nsegs);
		if (!err)
			upcie_kmod_dmabuf_detach(ctx, a.handle);
		memset(&a, 0, sizeof(a));
		a.dmabuf_fd = b->fd;
		a.segs = (uint64_t)(uintptr_t)last;
		a.cap = UINT32_MAX; /* more room claimed than there is */
		err = raw_attach(ctx->fd, &a);
		TAP((n > 1 ? err == -EFAULT : !err) && live(ctx) == before + 2 + !err,
		    "%s: raw ATTACH claiming more room than mapped: %s", b->kind,
		    n > 1 ? "EFAULT, nothing kept" : "fits");
		if (!err)
			upcie_kmod_dmabuf_detach(ctx, a.handle);
		munmap(area, 2 * pg);
	}
	if (n > 1) {
		size_t need = 0;
		uint64_t hx = 0, was = live(ctx);

		err = upcie_kmod_dmabuf_attach(ctx, b->fd, &one, 1, &need, &hx);
		TAP(err == -ENOSPC && need == n && live(ctx) == was,
		    "%s: wrapper with room for 1: -ENOSPC, %zu needed, nothing left attached",
		    b->kind, need);
	} else {
		SKIPPED("one segment", "%s: wrapper with room for 1: -ENOSPC", b->kind);
	}

	/* the LUT dmamem */
	err = upcie_dmamem_dmabuf_import(&mem, ctx, b->fd, b->va, b->size, 12);
	if (!err) {
		size_t s = 0;
		uint64_t segoff = 0;

		for (uint64_t off = 0; off < b->size && lut_ok; off += 4096) {
			uint64_t phys = 0, dev = 0;

			while (s < n && off >= segoff + segs[s].len)
				segoff += segs[s++].len;
			lut_ok = s < n && !upcie_dmamem_iova(&mem, off, &dev) &&
				 dev == segs[s].addr + (off - segoff);
			if (lut_ok && b->memfd > 0)
				lut_ok =
				    !upcie_pagemap_phys((char *)b->va + off, &phys) && dev == phys;
		}
	}
	TAP(!err && lut_ok && mem.nlut == b->size / 4096,
	    "%s: LUT dmamem at 4 KiB: every entry = the scatter list%s", b->kind,
	    b->memfd > 0 ? " = pagemap" : "");
	TAP(live(ctx) == before + 3, "%s: the dmamem holds an attachment", b->kind);
	upcie_dmamem_destroy(&mem);
	TAP(live(ctx) == before + 2, "%s: destroying the dmamem detaches it", b->kind);
	err = upcie_dmamem_dmabuf_import(&mem, ctx, b->fd, b->va, b->size + 4096, 12);
	TAP(err == -EINVAL && live(ctx) == before + 2,
	    "%s: dmamem larger than the buffer: -EINVAL, nothing attached", b->kind);

	TAP(!upcie_kmod_dmabuf_detach(ctx, h) && !upcie_kmod_dmabuf_detach(ctx, h2),
	    "%s: detach both", b->kind);
	TAP(upcie_kmod_dmabuf_detach(ctx, h) == -ENOENT, "%s: detach again: -ENOENT", b->kind);
	TAP(live(ctx) == before, "%s: nothing left attached", b->kind);
	free(segs);
	free(again);
}

static void test_refusals(struct upcie_kmod_dmabuf_import *ctx, const struct tk_buf *b)
{
	struct upcie_dmabuf_import_attach a;
	struct upcie_sg_seg seg;
	size_t n;
	uint64_t h, was = live(ctx);
	int fd, pfd[2];

	TAP(upcie_kmod_dmabuf_attach(ctx, -1, &seg, 1, &n, &h) == -EBADF, "fd -1: -EBADF");
	TAP(upcie_kmod_dmabuf_attach(ctx, 1000, &seg, 1, &n, &h) == -EBADF, "unused fd: -EBADF");
	fd = open("/dev/null", O_RDWR);
	TAP(upcie_kmod_dmabuf_attach(ctx, fd, &seg, 1, &n, &h) == -EINVAL,
	    "/dev/null (not a dma-buf): -EINVAL");
	close(fd);
	fd = memfd_create("x", 0);
	TAP(upcie_kmod_dmabuf_attach(ctx, fd, &seg, 1, &n, &h) == -EINVAL, "a memfd: -EINVAL");
	close(fd);
	if (!pipe(pfd)) {
		TAP(upcie_kmod_dmabuf_attach(ctx, pfd[0], &seg, 1, &n, &h) == -EINVAL,
		    "a pipe: -EINVAL");
		close(pfd[0]);
		close(pfd[1]);
	}
	TAP(upcie_kmod_dmabuf_attach(ctx, ctx->fd, &seg, 1, &n, &h) == -EINVAL,
	    "the import file itself: -EINVAL");

	memset(&a, 0, sizeof(a));
	a.dmabuf_fd = b->fd;
	a.reserved[1] = 1;
	TAP(raw_attach(ctx->fd, &a) == -EINVAL, "reserved field set: EINVAL");
	memset(&a, 0, sizeof(a));
	a.dmabuf_fd = b->fd;
	a.flags = 0x80;
	TAP(raw_attach(ctx->fd, &a) == -EINVAL, "unknown flag: EINVAL");
	memset(&a, 0, sizeof(a));
	a.dmabuf_fd = b->fd;
	a.pci.bus = 1; /* a function named without F_PCI */
	TAP(raw_attach(ctx->fd, &a) == -EINVAL, "PCI function without F_PCI: EINVAL");
	memset(&a, 0, sizeof(a));
	a.dmabuf_fd = b->fd;
	a.cap = 4; /* room claimed, no array */
	TAP(raw_attach(ctx->fd, &a) == -EINVAL, "cap without an array: EINVAL");
	memset(&a, 0, sizeof(a));
	a.dmabuf_fd = b->fd;
	a.segs = 16; /* an address nobody maps */
	a.cap = 4;
	TAP(raw_attach(ctx->fd, &a) == -EFAULT, "array at an unmapped address: EFAULT");
	TAP(tk_ioctl(ctx->fd, _IOWR(UPCIE_DMABUF_IMPORT_IOC_TYPE, 0x09, struct upcie_sg_seg),
		     &seg) == -ENOTTY,
	    "unknown request: ENOTTY");
	TAP(tk_ioctl(ctx->fd, _IOWR(UPCIE_DMABUF_IMPORT_IOC_TYPE, 0x01, struct upcie_sg_seg),
		     &seg) == -ENOTTY,
	    "ATTACH with the wrong size: ENOTTY");
	TAP(tk_ioctl(ctx->fd, UPCIE_DMABUF_IMPORT_IOC_ATTACH, NULL) == -EFAULT,
	    "ATTACH with a NULL argument: EFAULT");
	TAP(upcie_kmod_dmabuf_detach(ctx, 0) == -ENOENT &&
		upcie_kmod_dmabuf_detach(ctx, 999999) == -ENOENT,
	    "detach of handles never made: -ENOENT");
	TAP(upcie_kmod_dmabuf_segs(ctx, 999999, 0, &seg, 1, &n) == -ENOENT,
	    "segments of a handle never made: -ENOENT");
	TAP(live(ctx) == was, "no attachment left by the refusals");
}

static void test_files(struct upcie_kmod_dmabuf_import *ctx, const struct tk_buf *b)
{
	struct upcie_kmod_dmabuf_import other = { 0 };
	struct upcie_sg_seg seg[1024];
	uint64_t h = 0, was = live(ctx);
	size_t n = 0;
	pid_t pid;
	int status;

	/* another file cannot see this file's handles */
	upcie_kmod_dmabuf_attach(ctx, b->fd, seg, 1024, &n, &h);
	upcie_kmod_dmabuf_import_open(&other);
	TAP(upcie_kmod_dmabuf_detach(&other, h) == -ENOENT && live(ctx) == was + 1,
	    "another open file cannot detach this file's handle %" PRIu64, h);
	upcie_kmod_dmabuf_import_close(&other);
	/* a dmamem keeps its own reference to the import file: the context may close first */
	{
		struct upcie_kmod_dmabuf_import c2 = { 0 };
		struct upcie_dmamem mem;
		uint64_t base = live(ctx);
		int err = upcie_kmod_dmabuf_import_open(&c2);

		if (!err)
			err = upcie_dmamem_dmabuf_import(&mem, &c2, b->fd, b->va, b->size, 12);
		upcie_kmod_dmabuf_import_close(&c2);
		TAP(!err && live(ctx) == base + 1,
		    "a dmamem outlives the closed context it came from (attachment kept)");
		upcie_dmamem_destroy(&mem);
		TAP(live(ctx) == base, "destroying it then detaches and lets the file go");
	}
	/* a forked child shares the file (same open file description) */
	fflush(stdout);
	pid = fork();
	if (pid == 0)
		_exit(upcie_kmod_dmabuf_detach(ctx, h) ? 1 : 0);
	waitpid(pid, &status, 0);
	TAP(WIFEXITED(status) && !WEXITSTATUS(status) && live(ctx) == was,
	    "a forked child detaches through the inherited file");
	/* a child's own file: its attachments go when it exits without detaching */
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct upcie_kmod_dmabuf_import mine = { 0 };
		uint64_t hh;
		size_t nn;

		if (upcie_kmod_dmabuf_import_open(&mine))
			_exit(1);
		for (int i = 0; i < 3; i++)
			if (upcie_kmod_dmabuf_attach(&mine, b->fd, seg, 1024, &nn, &hh))
				_exit(2);
		_exit(live(&mine) == was + 3 ? 0 : 3);
	}
	waitpid(pid, &status, 0);
	TAP(WIFEXITED(status) && !WEXITSTATUS(status) && live(ctx) == was,
	    "a child's 3 attachments go when it exits without detaching (status %d)",
	    WEXITSTATUS(status));
}

/* The NVMe moves data through the LUT of an imported buffer. */
static void test_nvme(struct upcie_kmod_dmabuf_import *ctx, const struct upcie_dmamem *host,
		      const struct upcie_dmamem *data, const struct tk_buf *b, const char *how)
{
	struct upcie_pci_bar bar0;
	struct tk_nvme nv;
	char tag[9], wtag[9];
	const uint64_t roff = 0x3000, rlen = 16 * KiB, woff = 0x10000, wlen = 12 * KiB;
	const uint64_t wdst = 1 * MiB; /* byte offset in c0n1 */
	int64_t diff;
	int err;

	(void)ctx;
	tk_tag(tag, "c0n1");
	tk_tag(wtag, "kdb1");
	err = upcie_pci_bar_map(&nvme, 0, 0, &bar0);
	if (!err)
		err = upcie_pci_bus_master_enable(&nvme);
	if (!err)
		err = tk_nvme_up(&nv, (volatile void *)bar0.addr, bar0.size, host, 1);
	TAP(!err, "%s: controller up, namespace 1, one I/O queue (%d)", how, err);
	if (err) {
		upcie_pci_bar_unmap(&bar0);
		return;
	}
	memset(b->va, 0xee, b->size);
	err = tk_nvme_rw(&nv, false, 0, data, 0, b->size);
	diff = tk_pat_diff(b->va, b->size, tag, 0);
	TAP(!err && diff < 0,
	    "%s: Read of c0n1 [0, %zu KiB) into the whole imported buffer through its LUT: every "
	    "page holds its part (first difference %" PRId64 ")",
	    how, b->size / 1024, diff);
	memset((char *)b->va + roff, 0xee, rlen);
	err = tk_nvme_rw(&nv, false, 64, data, roff, rlen);
	diff = tk_pat_diff((char *)b->va + roff, rlen, tag, 64 * 512);
	TAP(!err && diff < 0,
	    "%s: Read of c0n1 [32, 48) KiB to buffer offset 0x%" PRIx64
	    ", across granules (first difference %" PRId64 ")",
	    how, roff, diff);
	tk_pat((char *)b->va + woff, wlen, wtag, wdst);
	err = tk_nvme_rw(&nv, true, wdst / 512, data, woff, wlen);
	TAP(!err, "%s: Write of the buffer at 0x%" PRIx64 " to c0n1 at %" PRIu64 " MiB", how, woff,
	    wdst / MiB);
	INFO("write_c0n1", "%" PRIu64 "+%" PRIu64 "+%s", wdst, wlen, wtag);
	tk_nvme_down(&nv);
	upcie_pci_bar_unmap(&bar0);
}

static void test_function(struct upcie_kmod_dmabuf_import *ctx, struct tk_buf *bufs, int nbufs)
{
	struct upcie_pci_bdf none = { .domain = 0, .bus = 0xfe, .dev = 31, .fn = 7 };
	struct upcie_sg_seg *segs;
	struct upcie_dmamem host, data;
	struct tk_buf hostbuf;
	size_t n = 0, cap = 4096;
	uint64_t h = 0, first;
	char drv[64] = "";
	int err;

	segs = calloc(cap, sizeof(*segs));
	TAP(upcie_kmod_dmabuf_attach_pci(ctx, &none, bufs[0].fd, segs, cap, &n, &h) == -ENODEV,
	    "attach for a function that does not exist: -ENODEV");
	upcie_pci_driver_get(&nvme, drv, sizeof(drv));
	if (strcmp(drv, "nvme"))
		upcie_pci_driver_bind(&nvme, "nvme");
	upcie_pci_driver_get(&nvme, drv, sizeof(drv));
	TAP(!strcmp(drv, "nvme") &&
		upcie_kmod_dmabuf_attach_pci(ctx, &nvme, bufs[0].fd, segs, cap, &n, &h) == -EBUSY,
	    "attach for %s under the kernel nvme driver: -EBUSY", nvme_name);
	if (iommu) {
		err = upcie_pci_driver_bind(&nvme, "vfio-pci");
		TAP(!err && upcie_kmod_dmabuf_attach_pci(ctx, &nvme, bufs[0].fd, segs, cap, &n,
							 &h) == -EBUSY,
		    "attach for %s on vfio-pci (DMA owned by user space): -EBUSY", nvme_name);
	} else {
		SKIPPED("vfio-pci needs an IOMMU", "attach for %s on vfio-pci: -EBUSY", nvme_name);
	}
	err = upcie_pci_driver_bind(&nvme, "uio_pci_generic");
	TAP(!err, "%s bound to uio_pci_generic", nvme_name);
	if (err) {
		free(segs);
		return;
	}
	for (int i = 0; i < nbufs; i++) {
		struct tk_buf *b = &bufs[i];
		struct upcie_sg_seg *own = calloc(cap, sizeof(*own));
		size_t bad = 0, nown = 0;
		uint64_t hown = 0;

		/* the physical list, from the module's own device */
		if (upcie_kmod_dmabuf_attach(ctx, b->fd, own, cap, &nown, &hown))
			nown = 0;
		else
			upcie_kmod_dmabuf_detach(ctx, hown);
		err = upcie_kmod_dmabuf_attach_pci(ctx, &nvme, b->fd, segs, cap, &n, &h);
		TAP(!err, "%s: attach for %s on uio_pci_generic: %zu segments, first 0x%" PRIx64,
		    b->kind, nvme_name, n, err ? 0 : segs[0].addr);
		if (err) {
			free(own);
			continue;
		}
		for (uint64_t off = 0; off < b->size; off += 4096)
			bad += tk_seg_addr(segs, n, off) != tk_seg_addr(own, nown, off);
		if (iommu)
			TAP(nown && bad == b->size / 4096,
			    "%s: under the IOMMU the addresses are %s's IOVAs: all %zu pages "
			    "differ "
			    "from the physical list",
			    b->kind, nvme_name, bad);
		else
			TAP(nown && !bad,
			    "%s: without an IOMMU the addresses are the physical ones (the module "
			    "device's list)",
			    b->kind);
		if (!iommu && b->memfd > 0)
			TAP(!tk_segs_vs_pagemap(b, segs, n, &first), "%s: = pagemap", b->kind);
		upcie_kmod_dmabuf_detach(ctx, h);
		free(own);
	}

	/* data through the LUT */
	if (!iommu) {
		err = upcie_dmamem_hugepage_lut(&host, 4 * MiB, NULL);
		TAP(!err, "A: host memory for the queues: hugepages, physical LUT");
		if (!err) {
			err = upcie_dmamem_dmabuf_import(&data, ctx, bufs[0].fd, bufs[0].va,
							 bufs[0].size, 12);
			TAP(!err, "A: %s imported for the module's device: LUT at 4 KiB",
			    bufs[0].kind);
			if (!err) {
				test_nvme(ctx, &host, &data, &bufs[0], "uio, no IOMMU");
				upcie_dmamem_destroy(&data);
			}
			upcie_dmamem_destroy(&host);
		}
	} else {
		struct tk_buf *db = &bufs[nbufs - 1]; /* udmabuf where there is one */

		err = tk_buf_vgem(&hostbuf, 4 * MiB);
		if (!err)
			err =
			    upcie_kmod_dmabuf_attach_pci(ctx, &nvme, hostbuf.fd, segs, cap, &n, &h);
		if (!err) {
			unsigned g = tk_granule(segs, n);

			upcie_kmod_dmabuf_detach(ctx, h);
			err = upcie_dmamem_dmabuf_import_pci(&host, ctx, &nvme, hostbuf.fd,
							     hostbuf.va, hostbuf.size, g);
			TAP(!err,
			    "%s: host memory for the queues: vgem imported for %s, %zu "
			    "segment(s), LUT at %u KiB",
			    "vIOMMU", nvme_name, n, 1u << (g - 10));
		} else {
			TAP(0, "vIOMMU: host memory from vgem for %s (%d)", nvme_name, err);
		}
		if (!err) {
			err = upcie_kmod_dmabuf_attach_pci(ctx, &nvme, db->fd, segs, cap, &n, &h);
			if (!err) {
				unsigned g = tk_granule(segs, n);

				upcie_kmod_dmabuf_detach(ctx, h);
				err = upcie_dmamem_dmabuf_import_pci(&data, ctx, &nvme, db->fd,
								     db->va, db->size, g);
			}
			TAP(!err, "vIOMMU: %s imported for %s: LUT dmamem", db->kind, nvme_name);
			if (!err) {
				test_nvme(ctx, &host, &data, db, "uio under the vIOMMU");
				upcie_dmamem_destroy(&data);
			}
			upcie_dmamem_destroy(&host);
		}
		tk_buf_free(&hostbuf);
	}

	/* the function goes away with an attachment live */
	err = upcie_kmod_dmabuf_attach_pci(ctx, &nvme, bufs[0].fd, segs, cap, &n, &h);
	if (!err) {
		uint64_t was = live(ctx);
		size_t got;
		int rc = tk_sh("echo 1 > /sys/bus/pci/devices/%s/remove", nvme_name);

		TAP(!rc && upcie_kmod_dmabuf_segs(ctx, h, 0, segs, cap, &got) == -ENODEV &&
			live(ctx) == was,
		    "%s removed with an attachment live: torn down, the handle answers -ENODEV",
		    nvme_name);
		TAP(!upcie_kmod_dmabuf_detach(ctx, h) &&
			upcie_kmod_dmabuf_detach(ctx, h) == -ENOENT && live(ctx) == was - 1,
		    "the dead handle detaches once");
		tk_sh("echo 1 > /sys/bus/pci/rescan");
		TAP(!upcie_pci_func_exists(&nvme), "%s back after a rescan", nvme_name);
	} else {
		TAP(0, "attach before removing %s (%d)", nvme_name, err);
	}
	free(segs);
}

static int mask_bits(const char *name)
{
	char path[128], buf[16] = "";
	FILE *f;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/dma_mask_bits", name);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	return atoi(buf);
}

static int set_param(const char *name, unsigned long v)
{
	return tk_sh("echo %lu > /sys/module/dmabuf_import/parameters/%s", v, name);
}

/*
 * The function must have uio_pci_generic bound (unbound: ENODEV). Its state follows its
 * attachments: its DMA mask is raised to 64 bits while it has some and restored after the last
 * (vram on uio_pci_generic, which sets none: the default 32-bit mask); another driver taking
 * the function over ends them before it probes, uio_pci_generic unbinding ends them too.
 */
static void test_function_state(struct upcie_kmod_dmabuf_import *ctx, const struct tk_buf *b)
{
	struct upcie_sg_seg *segs = calloc(1024, sizeof(*segs));
	int before = -1, during = -1;
	uint64_t h = 0, h2 = 0, was = live(ctx);
	size_t n = 0, got;
	int err;

	/* no driver bound: nothing keeps its DMA domain (a sysfs type write would free it) */
	upcie_pci_driver_unbind(&vram);
	err = upcie_kmod_dmabuf_attach_pci(ctx, &vram, b->fd, segs, 1024, &n, &h);
	TAP(err == -ENODEV && live(ctx) == was, "%s with no driver bound as importer: -ENODEV (%d)",
	    vram_name, err);
	err = upcie_pci_driver_bind(&vram, "uio_pci_generic");
	TAP(!err, "%s bound to uio_pci_generic (%d)", vram_name, err);
	if (err) {
		free(segs);
		return;
	}
	before = mask_bits(vram_name);
	err = upcie_kmod_dmabuf_attach_pci(ctx, &vram, b->fd, segs, 1024, &n, &h);
	if (!err)
		during = mask_bits(vram_name);
	TAP(!err && before == 32 && during == 64,
	    "%s on uio_pci_generic as importer: DMA mask %d bits, %d while attached", vram_name,
	    before, during);
	err = upcie_kmod_dmabuf_attach_pci(ctx, &vram, b->fd, segs, 1024, &n, &h2);
	TAP(!err && !upcie_kmod_dmabuf_detach(ctx, h) && mask_bits(vram_name) == 64,
	    "a second attachment, the first detached: still 64 bits");
	TAP(!upcie_kmod_dmabuf_detach(ctx, h2) && mask_bits(vram_name) == before,
	    "the last one detached: the mask is back at %d bits", mask_bits(vram_name));

	err = upcie_kmod_dmabuf_attach_pci(ctx, &vram, b->fd, segs, 1024, &n, &h);
	TAP(!err && !upcie_kmod_dmabuf_segs(ctx, h, 0, segs, 1024, &got),
	    "attached again: GET answers");
	if (iommu) {
		err = upcie_pci_driver_bind(&vram, "vfio-pci");
		TAP(!err && upcie_kmod_dmabuf_segs(ctx, h, 0, segs, 1024, &got) == -ENODEV &&
			mask_bits(vram_name) == before && live(ctx) == was + 1,
		    "%s moved to vfio-pci while attached: torn down before it probed (mask %d "
		    "bits), the handle answers -ENODEV",
		    vram_name, mask_bits(vram_name));
		TAP(!upcie_kmod_dmabuf_detach(ctx, h) && live(ctx) == was &&
			mask_bits(vram_name) == before,
		    "its handle detaches; the mask stays the new driver's");
	} else {
		SKIPPED("vfio-pci needs an IOMMU", "%s bound to vfio-pci while attached",
			vram_name);
		upcie_kmod_dmabuf_detach(ctx, h);
	}
	upcie_pci_driver_unbind(&vram);
	tk_sh("echo > /sys/bus/pci/devices/%s/driver_override", vram_name);

	err = upcie_pci_driver_bind(&vram, "uio_pci_generic");
	if (!err)
		err = upcie_kmod_dmabuf_attach_pci(ctx, &vram, b->fd, segs, 1024, &n, &h);
	if (!err)
		err = upcie_pci_driver_unbind(&vram);
	TAP(!err && upcie_kmod_dmabuf_segs(ctx, h, 0, segs, 1024, &got) == -ENODEV &&
		mask_bits(vram_name) == before && !upcie_kmod_dmabuf_detach(ctx, h) &&
		live(ctx) == was,
	    "uio_pci_generic unbinding from %s: the attachment ends with it (the handle answers "
	    "-ENODEV, mask %d bits) and detaches",
	    vram_name, mask_bits(vram_name));
	tk_sh("echo > /sys/bus/pci/devices/%s/driver_override", vram_name);
	free(segs);
}

/*
 * Two functions of one IOMMU group, neither bound to a driver (q35's ICH9 functions share one
 * without ACS). 0 and their names, or -ENOENT.
 */
static int find_group_pair(struct upcie_pci_bdf *a, struct upcie_pci_bdf *b)
{
	char path[512], drv[512];
	struct dirent *g, *d;
	DIR *groups, *devs;
	int n;

	groups = opendir("/sys/kernel/iommu_groups");
	if (!groups)
		return -ENOENT;
	while ((g = readdir(groups))) {
		if (g->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/sys/kernel/iommu_groups/%s/devices", g->d_name);
		devs = opendir(path);
		if (!devs)
			continue;
		n = 0;
		while (n < 2 && (d = readdir(devs))) {
			if (d->d_name[0] == '.')
				continue;
			snprintf(drv, sizeof(drv), "/sys/bus/pci/devices/%s/driver", d->d_name);
			if (!access(drv, F_OK) || tk_bdf(d->d_name, n ? b : a))
				continue;
			n++;
		}
		closedir(devs);
		if (n == 2) {
			closedir(groups);
			return 0;
		}
	}
	closedir(groups);
	return -ENOENT;
}

/* PCI_COMMAND's Bus Master Enable of `b`: 1, 0, or -1 when unreadable. */
static int master_bit(const struct upcie_pci_bdf *b)
{
	uint16_t cmd;

	return upcie_pci_config_read16(b, 4, &cmd) ? -1 : (cmd & 4) != 0;
}

/* Is the module's file readable now (poll, no wait)? */
static int readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLPRI };

	return poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLPRI));
}

/*
 * The IOMMU group, not just the function: a sibling under vfio-pci owns the group's DMA, so an
 * attachment for the other function is refused, and a sibling binding vfio-pci later ends the
 * attachments (before vfio-pci probes), stopping the function first: its Bus Master Enable is
 * clear afterwards (negative control: the module parameter test_no_stop leaves it set). The
 * file is readable (poll) while it has a handle the module took down. A file closed with
 * attachments live stops their function too.
 */
static void test_group(struct upcie_kmod_dmabuf_import *ctx, const struct tk_buf *b)
{
	struct upcie_sg_seg segs[1024];
	struct upcie_pci_bdf fn, sib;
	char fn_name[UPCIE_PCI_BDF_STRLEN], sib_name[UPCIE_PCI_BDF_STRLEN];
	uint64_t h = 0, was = live(ctx);
	size_t n = 0, got;
	int err;

	if (!iommu) {
		SKIPPED("no IOMMU groups without an IOMMU",
			"a sibling in the IOMMU group on vfio-pci");
		return;
	}
	if (find_group_pair(&fn, &sib)) {
		SKIPPED("no IOMMU group with two unbound functions",
			"a sibling in the IOMMU group on vfio-pci");
		return;
	}
	upcie_pci_bdf_format(&fn, fn_name, sizeof(fn_name));
	upcie_pci_bdf_format(&sib, sib_name, sizeof(sib_name));
	TAP(upcie_kmod_dmabuf_attach_pci(ctx, &fn, b->fd, segs, 1024, &n, &h) == -ENODEV &&
		live(ctx) == was,
	    "%s with no driver bound as importer: -ENODEV", fn_name);
	err = upcie_pci_driver_bind(&fn, "uio_pci_generic");
	if (err) {
		SKIPPED("uio_pci_generic does not bind to the group's first unbound function",
			"a sibling in the IOMMU group on vfio-pci (%s: %d)", fn_name, err);
		tk_sh("echo > /sys/bus/pci/devices/%s/driver_override", fn_name);
		return;
	}
	err = upcie_kmod_dmabuf_attach_pci(ctx, &fn, b->fd, segs, 1024, &n, &h);
	TAP(!err, "%s on uio_pci_generic (its group's other functions unbound) as importer (%d)",
	    fn_name, err);
	if (!err) {
		int before = readable(ctx->fd);

		upcie_pci_bus_master_set(&fn, true, NULL);
		TAP(master_bit(&fn) == 1, "%s mastering the bus (Bus Master Enable set)", fn_name);
		err = upcie_pci_driver_bind(&sib, "vfio-pci");
		TAP(!err && upcie_kmod_dmabuf_segs(ctx, h, 0, segs, 1024, &got) == -ENODEV,
		    "%s of the same IOMMU group bound to vfio-pci: %s's attachment torn down, the "
		    "handle answers -ENODEV (%d)",
		    sib_name, fn_name, err);
		TAP(master_bit(&fn) == 0,
		    "... and %s was stopped first: its PCI_COMMAND Bus Master Enable reads 0",
		    fn_name);
		TAP(!before && readable(ctx->fd),
		    "the module's file: not readable before, readable (poll) with the handle taken "
		    "down");
		TAP(!upcie_kmod_dmabuf_detach(ctx, h) && live(ctx) == was && !readable(ctx->fd),
		    "its handle detaches; the file is no longer readable");
		upcie_pci_driver_unbind(&sib);
		tk_sh("echo > /sys/bus/pci/devices/%s/driver_override", sib_name);
		/* the negative control: the stop removed, the bit stays set */
		err = upcie_kmod_dmabuf_attach_pci(ctx, &fn, b->fd, segs, 1024, &n, &h);
		if (!err)
			err = tk_sh("echo 1 > /sys/module/dmabuf_import/parameters/test_no_stop");
		upcie_pci_bus_master_set(&fn, true, NULL);
		if (!err)
			err = upcie_pci_driver_bind(&sib, "vfio-pci");
		TAP(!err && upcie_kmod_dmabuf_segs(ctx, h, 0, segs, 1024, &got) == -ENODEV &&
			master_bit(&fn) == 1,
		    "negative control (test_no_stop=1): torn down the same way, Bus Master Enable "
		    "stays 1 (%d)",
		    err);
		tk_sh("echo 0 > /sys/module/dmabuf_import/parameters/test_no_stop");
		upcie_kmod_dmabuf_detach(ctx, h);
		upcie_pci_driver_unbind(&sib);
		tk_sh("echo > /sys/bus/pci/devices/%s/driver_override", sib_name);
		/* a file closed with an attachment live */
		{
			struct upcie_kmod_dmabuf_import c2 = { .fd = -1 };

			err = upcie_kmod_dmabuf_import_open(&c2);
			if (!err)
				err = upcie_kmod_dmabuf_attach_pci(&c2, &fn, b->fd, segs, 1024, &n,
								   &h);
			upcie_pci_bus_master_set(&fn, true, NULL);
			if (!err && master_bit(&fn) == 1) {
				upcie_kmod_dmabuf_import_close(&c2);
				TAP(master_bit(&fn) == 0 && live(ctx) == was,
				    "a second file with an attachment for %s closed: %s stopped "
				    "(Bus "
				    "Master Enable 0), the attachment gone",
				    fn_name, fn_name);
			} else {
				TAP(0, "a second file with an attachment for %s (%d)", fn_name,
				    err);
				upcie_kmod_dmabuf_import_close(&c2);
			}
		}
		upcie_pci_bus_master_set(&fn, false, NULL);
	}
	err = upcie_pci_driver_bind(&sib, "vfio-pci");
	TAP(!err && upcie_kmod_dmabuf_attach_pci(ctx, &fn, b->fd, segs, 1024, &n, &h) == -EBUSY &&
		live(ctx) == was,
	    "attach for %s while %s of its IOMMU group is on vfio-pci: -EBUSY", fn_name, sib_name);
	upcie_pci_driver_unbind(&sib);
	tk_sh("echo > /sys/bus/pci/devices/%s/driver_override", sib_name);
	err = upcie_kmod_dmabuf_attach_pci(ctx, &fn, b->fd, segs, 1024, &n, &h);
	TAP(!err && !upcie_kmod_dmabuf_detach(ctx, h) && live(ctx) == was,
	    "%s unbound again: the attachment for %s is accepted (%d)", sib_name, fn_name, err);
	upcie_pci_driver_unbind(&fn);
	tk_sh("echo > /sys/bus/pci/devices/%s/driver_override", fn_name);
}

/* GET changes nothing; DETACH does and needs the capability, like ATTACH. */
static void test_capability(struct upcie_kmod_dmabuf_import *ctx, const struct tk_buf *b)
{
	struct upcie_sg_seg seg[1024];
	uint64_t h = 0;
	size_t n = 0;
	pid_t pid;
	int status;

	if (upcie_kmod_dmabuf_attach(ctx, b->fd, seg, 1024, &n, &h)) {
		TAP(0, "attach for the capability test");
		return;
	}
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		uint64_t hh = h;
		size_t got;
		int r = 0;

		if (setgid(65534) || setuid(65534))
			_exit(99);
		if (upcie_kmod_dmabuf_segs(ctx, h, 0, seg, 1024, &got))
			r |= 1;
		if (ioctl(ctx->fd, UPCIE_DMABUF_IMPORT_IOC_DETACH, &hh) == 0 || errno != EPERM)
			r |= 2;
		_exit(r);
	}
	waitpid(pid, &status, 0);
	TAP(WIFEXITED(status) && WEXITSTATUS(status) == 0 && !upcie_kmod_dmabuf_detach(ctx, h),
	    "without CAP_SYS_ADMIN on the inherited file: GET works, DETACH is EPERM (status %d)",
	    WEXITSTATUS(status));
}

/* The bounds over all files: attachments and pinned bytes. */
static void test_limits(struct upcie_kmod_dmabuf_import *ctx, const struct tk_buf *b)
{
	struct upcie_kmod_dmabuf_import other = { 0 };
	struct upcie_sg_seg seg[1024];
	uint64_t h[3] = { 0, 0, 0 }, was = live(ctx);
	size_t n;
	int err;

	upcie_kmod_dmabuf_import_open(&other);
	TAP(!set_param("max_total_attachments", was + 2) &&
		!upcie_kmod_dmabuf_attach(ctx, b->fd, seg, 1024, &n, &h[0]) &&
		!upcie_kmod_dmabuf_attach(&other, b->fd, seg, 1024, &n, &h[1]) &&
		upcie_kmod_dmabuf_attach(ctx, b->fd, seg, 1024, &n, &h[2]) == -ENFILE &&
		upcie_kmod_dmabuf_attach(&other, b->fd, seg, 1024, &n, &h[2]) == -ENFILE,
	    "max_total_attachments %" PRIu64 ": the third attachment over two files is -ENFILE",
	    was + 2);
	upcie_kmod_dmabuf_detach(ctx, h[0]);
	upcie_kmod_dmabuf_detach(&other, h[1]);
	set_param("max_total_attachments", 16384);
	err = set_param("max_total_mib", b->size / MiB + b->size / MiB / 2);
	TAP(!err && !upcie_kmod_dmabuf_attach(ctx, b->fd, seg, 1024, &n, &h[0]) &&
		upcie_kmod_dmabuf_attach(&other, b->fd, seg, 1024, &n, &h[1]) == -EDQUOT,
	    "max_total_mib %zu: a second %zu MiB buffer is -EDQUOT", b->size / MiB * 3 / 2,
	    b->size / MiB);
	upcie_kmod_dmabuf_detach(ctx, h[0]);
	set_param("max_total_mib", 1UL << 20);
	TAP(live(ctx) == was, "nothing left attached by the limit tests");
	upcie_kmod_dmabuf_import_close(&other);
}

/* Last: kernel lockdown (one way) closes the module to new users. */
static void test_lockdown(void)
{
	struct upcie_kmod_dmabuf_import ctx = { 0 };

	tk_sh("mountpoint -q /sys/kernel/security || mount -t securityfs securityfs "
	      "/sys/kernel/security");
	if (access("/sys/kernel/security/lockdown", W_OK)) {
		SKIPPED("no lockdown LSM on this kernel", "open under kernel lockdown: EPERM");
		return;
	}
	TAP(!tk_sh("echo integrity > /sys/kernel/security/lockdown") &&
		upcie_kmod_dmabuf_import_open(&ctx) == -EPERM,
	    "open under kernel lockdown (integrity): -EPERM");
	upcie_kmod_dmabuf_import_close(&ctx);
}

static void test_unload(struct tk_buf *b)
{
	struct upcie_kmod_dmabuf_import ctx = { 0 };
	struct upcie_sg_seg seg[1024];
	uint64_t h;
	size_t n;
	int err;

	upcie_kmod_dmabuf_import_open(&ctx);
	err = upcie_kmod_dmabuf_attach(&ctx, b->fd, seg, 1024, &n, &h);
	TAP(!err && tk_rmmod("dmabuf_import") == -EWOULDBLOCK && !access(DEV, F_OK),
	    "rmmod with an attachment live: refused (module in use), node still there");
	upcie_kmod_dmabuf_import_close(&ctx);
	err = tk_rmmod("dmabuf_import");
	TAP(!err && access(DEV, F_OK), "rmmod once the file is closed: gone (%d)", err);
	TAP(!tk_sh("modprobe dmabuf_import") && !upcie_kmod_dmabuf_import_open(&ctx),
	    "loaded again, opens");
	upcie_kmod_dmabuf_import_close(&ctx);
}

int main(int argc, char **argv)
{
	struct upcie_kmod_dmabuf_import ctx = { 0 };
	struct tk_buf bufs[2];
	int nbufs = 0, err;

	upcie_log_set_handler(tk_log, NULL);
	if (argc < 3 || tk_bdf(argv[1], &nvme) || tk_bdf(argv[2], &vram))
		return 2;
	upcie_pci_bdf_format(&nvme, nvme_name, sizeof(nvme_name));
	upcie_pci_bdf_format(&vram, vram_name, sizeof(vram_name));
	iommu = getenv("TB_IOMMU") && !strcmp(getenv("TB_IOMMU"), "1");

	test_basics();
	if (upcie_kmod_dmabuf_import_open(&ctx)) {
		TAP(0, "open for the remaining tests");
		return tap_done();
	}
	err = tk_buf_vgem(&bufs[nbufs], 2 * MiB);
	TAP(!err, "vgem dumb buffer exported as a dma-buf, 2 MiB, mmapped (%d)", err);
	if (!err)
		nbufs++;
	err = tk_buf_udmabuf(&bufs[nbufs], 2 * MiB);
	if (err == -ENODEV) {
		SKIPPED("no /dev/udmabuf on this kernel", "udmabuf of a 2 MiB memfd");
	} else {
		TAP(!err, "udmabuf of a 2 MiB memfd, mmapped (%d)", err);
		if (!err)
			nbufs++;
	}
	if (!nbufs)
		return tap_done();
	for (int i = 0; i < nbufs; i++)
		test_buffer(&ctx, &bufs[i]);
	test_refusals(&ctx, &bufs[0]);
	test_files(&ctx, &bufs[0]);
	test_function(&ctx, bufs, nbufs);
	test_function_state(&ctx, &bufs[0]);
	test_group(&ctx, &bufs[0]);
	test_capability(&ctx, &bufs[0]);
	test_limits(&ctx, &bufs[0]);
	upcie_kmod_dmabuf_import_close(&ctx);
	test_unload(&bufs[0]);
	test_lockdown();
	for (int i = 0; i < nbufs; i++)
		tk_buf_free(&bufs[i]);
	return tap_done();
}
