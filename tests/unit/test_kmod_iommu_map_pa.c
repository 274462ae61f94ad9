/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests for kmod/iommu_map_pa.h without the module: the UAPI layout, the open errors (and the
 * module identity the wrapper checks, against a fake sysfs tree), closed contexts and argument
 * checks, and the IOVA window: defaults and environment overrides (bad
 * numbers, alignment, wrap), checking against a controller's usable ranges (-ERANGE outside,
 * across a hole, past the end), carving it out of ranges and out of a vfio allocator, allocation
 * with alignment, exhaustion (-ENOSPC), free and reuse. The module itself is tested in the
 * guests (tests/guest/cases/kmod_iommu.sh).
 */
#include <upcie/kmod/iommu_map_pa.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define MiB(x) ((uint64_t)(x) << 20)
#define GiB(x) ((uint64_t)(x) << 30)

static char last_msg[1024];

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	snprintf(last_msg, sizeof(last_msg), "%s", msg);
}

static void test_layout(void)
{
	CHECK_EQ(sizeof(struct upcie_iommu_map_pa_pci), 8, "PCI address: 8 bytes");
	CHECK_EQ(sizeof(struct upcie_iommu_map_pa_map), 96, "MAP: 96 bytes");
	CHECK_EQ(offsetof(struct upcie_iommu_map_pa_map, source), 8, "MAP.source at 8");
	CHECK_EQ(offsetof(struct upcie_iommu_map_pa_map, owner_fd), 16, "MAP.owner_fd at 16");
	CHECK_EQ(offsetof(struct upcie_iommu_map_pa_map, iova), 32, "MAP.iova at 32");
	CHECK_EQ(offsetof(struct upcie_iommu_map_pa_map, lifetime_fd), 64, "MAP.lifetime_fd at 64");
	CHECK_EQ(offsetof(struct upcie_iommu_map_pa_map, handle), 72, "MAP.handle at 72");
	CHECK_EQ(offsetof(struct upcie_iommu_map_pa_translate, owner_fd), 28,
		 "TRANSLATE.owner_fd at 28");
	CHECK_EQ(UPCIE_IOMMU_MAP_PA_ABI, 3,
		 "ABI 3: MAP pins its lifetime dma-buf, raw pages by flag");
	CHECK_EQ(UPCIE_IOMMU_MAP_PA_F_RAW_PAGES, 4u, "MAP flag RAW_PAGES is bit 2");
	CHECK(!(UPCIE_IOMMU_MAP_PA_F_RAW_PAGES &
		(UPCIE_IOMMU_MAP_PA_F_SHARE | UPCIE_IOMMU_MAP_PA_F_OUTSIDE_WINDOW)),
	      "no MAP flag shares a bit with a MAP_BAR flag");
	CHECK_EQ(sizeof(struct upcie_iommu_map_pa_map_bar), 96, "MAP_BAR: 96 bytes");
	CHECK_EQ(offsetof(struct upcie_iommu_map_pa_map_bar, iova), 56, "MAP_BAR.iova at 56");
	CHECK_EQ(sizeof(struct upcie_iommu_map_pa_translate), 72, "TRANSLATE: 72 bytes");
	CHECK_EQ(sizeof(struct upcie_iommu_map_pa_info), 40, "INFO: 40 bytes");
	CHECK(_IOC_TYPE(UPCIE_IOMMU_MAP_PA_IOC_MAP) == 0xE7 &&
		  _IOC_NR(UPCIE_IOMMU_MAP_PA_IOC_INFO) == 0x10 &&
		  _IOC_NR(UPCIE_IOMMU_MAP_PA_IOC_MAP) == 0x11 &&
		  _IOC_NR(UPCIE_IOMMU_MAP_PA_IOC_UNMAP) == 0x12 &&
		  _IOC_NR(UPCIE_IOMMU_MAP_PA_IOC_MAP_BAR) == 0x13 &&
		  _IOC_NR(UPCIE_IOMMU_MAP_PA_IOC_TRANSLATE) == 0x14,
	      "request numbers 0xE7/0x10..0x14, apart from dmabuf_import's");
	CHECK(_IOC_SIZE(UPCIE_IOMMU_MAP_PA_IOC_MAP) == 96 &&
		  _IOC_SIZE(UPCIE_IOMMU_MAP_PA_IOC_MAP_BAR) == 96 &&
		  _IOC_DIR(UPCIE_IOMMU_MAP_PA_IOC_UNMAP) == _IOC_WRITE,
	      "request sizes and directions");
}

/* The identity check is kmod/device.h's (tested in full with dmabuf_import): here, that this
 * wrapper asks for its own module's identity. Called with the path set to /dev/null. */
static void test_identity(void)
{
	char root[] = "/tmp/upcie-kmod-ident-XXXXXX", path[256], cmd[256];
	struct upcie_kmod_iommu_map_pa ctx;
	FILE *fp;

	memset(&ctx, 0, sizeof(ctx));
	if (!mkdtemp(root)) {
		CHECK(0, "identity: mkdtemp");
		return;
	}
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s/module/iommu_map_pa/parameters'", root);
	CHECK(system(cmd) == 0, "identity: fake sysfs tree");
	setenv("UPCIE_SYSFS_ROOT", root, 1);
	last_msg[0] = 0;
	CHECK_EQ(upcie_kmod_iommu_map_pa_open(&ctx), -EPROTO,
		 "identity: iommu_map_pa without parameters/abi: -EPROTO");
	CHECK(strstr(last_msg, "/dev/null is not upcie's module") &&
		  strstr(last_msg, "rmmod iommu_map_pa") &&
		  strstr(last_msg, UPCIE_KMOD_IOMMU_MAP_PA_PACKAGE),
	      "the message names the node, the module and the package: %s", last_msg);
	snprintf(path, sizeof(path), "%s/module/iommu_map_pa/parameters/abi", root);
	fp = fopen(path, "w");
	if (fp) {
		fprintf(fp, "%s %d\n", UPCIE_IOMMU_MAP_PA_IDENT, UPCIE_IOMMU_MAP_PA_ABI);
		fclose(fp);
	}
	last_msg[0] = 0;
	CHECK_EQ(upcie_kmod_iommu_map_pa_open(&ctx), -EPROTO,
		 "identity \"" UPCIE_IOMMU_MAP_PA_IDENT " <ABI>\" matches: on to INFO (-EPROTO)");
	CHECK(strstr(last_msg, "does not answer") != NULL, "from the INFO request: %s", last_msg);
	unsetenv("UPCIE_SYSFS_ROOT");
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	CHECK(system(cmd) == 0, "identity: fake tree removed");
}

static void test_open_closed(void)
{
	struct upcie_kmod_iommu_map_pa ctx;
	struct upcie_kmod_iova_window w;
	struct upcie_kmod_bar_map bm;
	struct upcie_pci_bdf bdf = { 0, 1, 0, 0 }, bad = { 0, 1, 32, 0 };
	struct upcie_kmod_iommu_target t = { { 0, 1, 0, 0 }, 3 }, tbad = { { 0, 1, 32, 0 }, 3 };
	struct upcie_dmamem mem;
	uint64_t page = 0x80000000, h = 9, phys;

	setenv("UPCIE_KMOD_IOMMU_MAP_PA_PATH", "/nonexistent/iommu_map_pa", 1);
	last_msg[0] = 0;
	CHECK_EQ(upcie_kmod_iommu_map_pa_open(&ctx), -ENOENT, "missing node: -ENOENT");
	CHECK(strstr(last_msg, "upcie-iommu-map-pa-dkms") != NULL,
	      "the message names the package: %s", last_msg);
	setenv("UPCIE_KMOD_IOMMU_MAP_PA_PATH", "/dev/null", 1);
	CHECK_EQ(upcie_kmod_iommu_map_pa_open(&ctx), -EPROTO, "/dev/null: -EPROTO");
	test_identity();
	unsetenv("UPCIE_KMOD_IOMMU_MAP_PA_PATH");
	CHECK_EQ(ctx.fd, 0, "closed after failures");
	upcie_kmod_iommu_map_pa_close(&ctx);
	upcie_kmod_iommu_map_pa_close(NULL);
	CHECK_EQ(upcie_kmod_iommu_map_pa_map(&ctx, &t, &bdf, 0, &page, 1, 4096, 0,
					     UPCIE_KMOD_IOMMU_RAW_PAGES, &h, NULL),
		 -EBADF, "map on a closed context: -EBADF");
	CHECK_EQ(h, 9, "handle untouched");
	CHECK_EQ(upcie_kmod_iommu_map_pa_unmap(&ctx, 1), -EBADF, "unmap: -EBADF");
	CHECK_EQ(upcie_kmod_iommu_map_pa_map_bar(&ctx, &bdf, &bdf, 0, 0, 0, 0, &bm), -EBADF,
		 "map_bar: -EBADF");
	CHECK_EQ(upcie_kmod_iommu_map_pa_translate(&ctx, &bdf, -1, 0, &phys, NULL), -EBADF,
		 "translate: -EBADF");
	ctx.fd = 1; /* "open", wrong arguments */
	CHECK_EQ(upcie_kmod_iommu_map_pa_map(&ctx, &tbad, &bdf, 0, &page, 1, 4096, 0,
					     UPCIE_KMOD_IOMMU_RAW_PAGES, &h, NULL),
		 -EINVAL, "device number 32: -EINVAL");
	CHECK_EQ(upcie_kmod_iommu_map_pa_map(&ctx, &t, &bad, 0, &page, 1, 4096, 0,
					     UPCIE_KMOD_IOMMU_RAW_PAGES, &h, NULL),
		 -EINVAL, "source device number 32: -EINVAL");
	CHECK_EQ(upcie_kmod_iommu_map_pa_map(&ctx, &t, NULL, 0, &page, 1, 4096, 0,
					     UPCIE_KMOD_IOMMU_RAW_PAGES, &h, NULL),
		 -EINVAL, "no source: -EINVAL");
	CHECK_EQ(upcie_kmod_iommu_map_pa_map(&ctx, NULL, &bdf, 0, &page, 1, 4096, 0,
					     UPCIE_KMOD_IOMMU_RAW_PAGES, &h, NULL),
		 -EINVAL, "no target: -EINVAL");
	CHECK_EQ(upcie_kmod_iommu_map_pa_map(&ctx, &t, &bdf, 0, NULL, 1, 4096, 0,
					     UPCIE_KMOD_IOMMU_RAW_PAGES, &h, NULL),
		 -EINVAL, "no pages: -EINVAL");
	/* stdout is no module file: an ioctl would answer -ENOTTY, so -EINVAL is the wrapper's */
	last_msg[0] = 0;
	CHECK_EQ(upcie_kmod_iommu_map_pa_map(&ctx, &t, &bdf, 0, &page, 1, 4096, 0, -1, &h, NULL),
		 -EINVAL,
		 "map with no lifetime dma-buf and no RAW_PAGES: -EINVAL before the module");
	CHECK(strstr(last_msg, "UPCIE_KMOD_IOMMU_RAW_PAGES") != NULL,
	      "the message names the explicit choice: %s", last_msg);
	CHECK_EQ(
	    upcie_kmod_iommu_map_pa_map(&ctx, &t, &bdf, 0, &page, 1, 4096, 0, -ENOENT, &h, NULL),
	    -EINVAL, "map with lifetime_fd -ENOENT (a failed call passed on): -EINVAL");
	CHECK_EQ(upcie_kmod_iommu_map_pa_map(&ctx, &t, &bdf, 0, &page, 1, 4096, 0,
					     UPCIE_KMOD_IOMMU_RAW_PAGES, &h, NULL),
		 -ENOTTY, "control: with RAW_PAGES the request reaches the file (-ENOTTY)");
	CHECK_EQ(h, 9, "handle untouched");
	CHECK_EQ(upcie_kmod_iommu_map_pa_map_bar(&ctx, &bdf, &bdf, 0, 0, 0, 0, NULL), -EINVAL,
		 "map_bar without an outcome: -EINVAL");
	CHECK_EQ(upcie_kmod_iommu_map_pa_doorbells(&ctx, &bdf, &bdf, 0, 0, &bm), -EINVAL,
		 "doorbells of no queues: -EINVAL");
	CHECK_EQ(upcie_kmod_iommu_map_pa_doorbells(&ctx, &bdf, &bdf, 2, 16, &bm), -EINVAL,
		 "doorbell stride 16: -EINVAL");
	ctx.fd = 0;
	memset(&w, 0, sizeof(w));
	memset(&mem, 0x5a, sizeof(mem));
	CHECK_EQ(upcie_dmamem_iommu_map_pa(&mem, &ctx, &w, &t, 1, &bdf, NULL, &page, 1, 4096,
					   UPCIE_KMOD_IOMMU_RAW_PAGES),
		 -EINVAL, "dmamem without context or window: -EINVAL");
	CHECK(mem.release == NULL && mem.fd == -1 && mem.size == 0, "dmamem zeroed");
	CHECK_EQ(upcie_dmamem_iommu_map_pa_add(&mem, &t), -EINVAL,
		 "add to a dmamem that is not iommu_map_pa's: -EINVAL");
	CHECK_EQ(upcie_dmamem_iommu_map_pa_lut(&mem, &ctx, &w, &t, 1, &bdf, &mem, 3), -EINVAL,
		 "lut form of a non-LUT dmamem: -EINVAL");
}

static struct upcie_vfio_iova_ranges vtd(void)
{
	/* what QEMU's VT-d reports: 39 bits with the interrupt window cut out */
	struct upcie_vfio_iova_ranges r;

	memset(&r, 0, sizeof(r));
	upcie_vfio_iova_ranges_add(&r, 0, 0xfedfffff);
	upcie_vfio_iova_ranges_add(&r, 0xfef00000, 0x7fffffffffULL);
	return r;
}

static void test_window_env(void)
{
	struct upcie_kmod_iova_window w;
	struct upcie_vfio_iova_ranges r = vtd();

	unsetenv("UPCIE_IOVA_BASE");
	unsetenv("UPCIE_IOVA_SIZE");
	CHECK(!upcie_kmod_iova_window_init(&w, 0) && w.base == GiB(256) && w.size == GiB(64),
	      "default: 64 GiB at 256 GiB");
	CHECK_EQ(upcie_kmod_iova_window_check(&w, &r), 0, "inside a 39-bit domain");
	upcie_kmod_iova_window_fini(&w);
	upcie_kmod_iova_window_fini(&w);
	CHECK(1, "fini twice: a no-op");

	setenv("UPCIE_IOVA_BASE", "0x2000000000", 1);
	setenv("UPCIE_IOVA_SIZE", "0x400000000", 1);
	CHECK(!upcie_kmod_iova_window_init(&w, 4096) && w.base == GiB(128) && w.size == GiB(16),
	      "UPCIE_IOVA_BASE/SIZE as in the seed: 16 GiB at 128 GiB");
	upcie_kmod_iova_window_fini(&w);
	setenv("UPCIE_IOVA_BASE", "137438953472", 1);
	CHECK(!upcie_kmod_iova_window_init(&w, 4096) && w.base == GiB(128), "decimal works too");
	upcie_kmod_iova_window_fini(&w);

	setenv("UPCIE_IOVA_BASE", "0x2000000000x", 1);
	last_msg[0] = 0;
	CHECK_EQ(upcie_kmod_iova_window_init(&w, 4096), -EINVAL, "trailing junk: -EINVAL");
	CHECK(strstr(last_msg, "UPCIE_IOVA_BASE") != NULL, "the message names the variable");
	setenv("UPCIE_IOVA_BASE", "-4096", 1);
	CHECK_EQ(upcie_kmod_iova_window_init(&w, 4096), -EINVAL, "negative: -EINVAL");
	setenv("UPCIE_IOVA_BASE", "0x2000001000", 1);
	CHECK_EQ(upcie_kmod_iova_window_init(&w, 4096), -EINVAL, "base not 2 MiB aligned: -EINVAL");
	setenv("UPCIE_IOVA_BASE", "0x2000000000", 1);
	setenv("UPCIE_IOVA_SIZE", "0", 1);
	CHECK_EQ(upcie_kmod_iova_window_init(&w, 4096), -EINVAL, "size 0: -EINVAL");
	setenv("UPCIE_IOVA_BASE", "0xffffffffffe00000", 1);
	setenv("UPCIE_IOVA_SIZE", "0x400000", 1);
	CHECK_EQ(upcie_kmod_iova_window_init(&w, 4096), -EINVAL, "wrapping past 2^64: -EINVAL");
	unsetenv("UPCIE_IOVA_SIZE");
	setenv("UPCIE_IOVA_BASE", "0x2000000000", 1);
	CHECK_EQ(upcie_kmod_iova_window_init(&w, 3000), -EINVAL, "page size 3000: -EINVAL");
	unsetenv("UPCIE_IOVA_BASE");
}

static void test_window_check(void)
{
	struct upcie_kmod_iova_window w;
	struct upcie_vfio_iova_ranges r = vtd(), ex;

	setenv("UPCIE_IOVA_BASE", "0x8000000000", 1); /* 512 GiB: past a 39-bit domain */
	upcie_kmod_iova_window_init(&w, 4096);
	last_msg[0] = 0;
	CHECK_EQ(upcie_kmod_iova_window_check(&w, &r), -ERANGE, "past the end: -ERANGE");
	CHECK(strstr(last_msg, "UPCIE_IOVA_BASE") != NULL, "the message says how to move it");
	upcie_kmod_iova_window_fini(&w);
	setenv("UPCIE_IOVA_BASE", "0x7fc0000000", 1);
	setenv("UPCIE_IOVA_SIZE", "0x80000000", 1); /* straddles the end */
	upcie_kmod_iova_window_init(&w, 4096);
	CHECK_EQ(upcie_kmod_iova_window_check(&w, &r), -ERANGE, "straddling the end: -ERANGE");
	upcie_kmod_iova_window_fini(&w);
	setenv("UPCIE_IOVA_BASE", "0xfe000000", 1);
	setenv("UPCIE_IOVA_SIZE", "0x2000000", 1); /* across the interrupt hole */
	upcie_kmod_iova_window_init(&w, 4096);
	CHECK_EQ(upcie_kmod_iova_window_check(&w, &r), -ERANGE, "across a hole: -ERANGE");
	upcie_kmod_iova_window_fini(&w);
	unsetenv("UPCIE_IOVA_BASE");
	unsetenv("UPCIE_IOVA_SIZE");

	upcie_kmod_iova_window_init(&w, 4096);
	ex = r;
	CHECK(!upcie_kmod_iova_window_exclude(&w, &ex) && ex.n == 3 &&
		  ex.r[1].last == GiB(256) - 1 && ex.r[2].start == GiB(320) &&
		  ex.r[2].last == 0x7fffffffffULL,
	      "exclude: the window is cut out of the second range");
	CHECK_EQ(upcie_kmod_iova_window_check(&w, &ex), -ERANGE,
		 "and no longer fits the carved ranges");
	upcie_kmod_iova_window_fini(&w);
}

static void test_window_alloc(void)
{
	struct upcie_kmod_iova_window w;
	struct upcie_vfio_iova_ranges r = vtd();
	struct upcie_vfio_iova_space s;
	uint64_t a, b, c, d;
	int err = 0;

	setenv("UPCIE_IOVA_SIZE", "0x1000000", 1); /* 16 MiB */
	upcie_kmod_iova_window_init(&w, 4096);
	unsetenv("UPCIE_IOVA_SIZE");
	CHECK(!upcie_kmod_iova_window_alloc(&w, MiB(4), 0, &a) && a == GiB(256),
	      "4 MiB at the window's base");
	CHECK(!upcie_kmod_iova_window_alloc(&w, 4096, 0, &b) && b == GiB(256) + MiB(4),
	      "4 KiB right after");
	CHECK(!upcie_kmod_iova_window_alloc(&w, MiB(2), MiB(2), &c) &&
		  upcie_is_aligned(c, MiB(2)) && c >= b + 4096,
	      "2 MiB aligned to 2 MiB (0x%" PRIx64 ")", c);
	CHECK(!upcie_kmod_iova_window_alloc(&w, 5000, 0, &d) && d == b + 8192 && d + 8192 <= c,
	      "5000 bytes: 8 KiB, naturally aligned, into the gap");
	last_msg[0] = 0;
	err = upcie_kmod_iova_window_alloc(&w, MiB(16), 0, &d);
	CHECK_EQ(err, -ENOSPC, "16 MiB more: the window is full, -ENOSPC");
	CHECK(strstr(last_msg, "UPCIE_IOVA_SIZE") != NULL, "the message names the knob: %s",
	      last_msg);
	CHECK_EQ(upcie_kmod_iova_window_free(&w, a, MiB(4)), 0, "free the first 4 MiB");
	CHECK(!upcie_kmod_iova_window_alloc(&w, MiB(4), 0, &d) && d == a, "and get them again");
	CHECK_EQ(upcie_kmod_iova_window_free(&w, a + 4096, 4096), -ENOENT,
		 "free of something never allocated: -ENOENT");
	upcie_kmod_iova_window_fini(&w);

	/* a controller's vfio allocator keeps out of the window */
	upcie_kmod_iova_window_init(&w, 4096);
	r.align = 4096;
	upcie_vfio_iova_space_init(&s, &r);
	CHECK_EQ(upcie_kmod_iova_window_reserve(&w, &s), 0, "window reserved in a vfio allocator");
	err = 0;
	for (int i = 0; i < 4 && !err; i++) {
		/* 64 GiB chunks: three below the window, the fourth past it */
		err = upcie_vfio_iova_alloc(&s, GiB(64), GiB(1), &a);
		if (!err && a < GiB(320) && a + GiB(64) > GiB(256))
			err = -1;
	}
	CHECK(!err, "no allocation of the vfio allocator lands in the window");
	upcie_vfio_iova_space_fini(&s);
	upcie_vfio_iova_space_init(&s, &r);
	upcie_vfio_iova_alloc(&s, GiB(250), GiB(1), &a); /* [4, 254) GiB */
	upcie_vfio_iova_alloc(&s, GiB(8), GiB(1), &b);	 /* reaches into the window */
	CHECK_EQ(upcie_kmod_iova_window_reserve(&w, &s), -EBUSY,
		 "reserving over a live allocation: -EBUSY");
	upcie_vfio_iova_space_fini(&s);
	upcie_kmod_iova_window_fini(&w);
}

int main(void)
{
	upcie_log_set_handler(capture, NULL);
	test_layout();
	test_open_closed();
	test_window_env();
	test_window_check();
	test_window_alloc();
	return check_done();
}
