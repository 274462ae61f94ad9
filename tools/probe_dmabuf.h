/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The dma-buf export probe, common to every runtime flavour: what a GPU runtime's dma-buf export
 * of device memory actually describes.
 *
 * The flavour contract. A flavour (probe_dmabuf_cuda.cu, probe_dmabuf_hip.hip, and
 * probe_dmabuf_udmabuf.c, the kernel's own exporter as the control) includes this
 * header, defines the three functions prototyped below, and from its main() brings its runtime
 * up, fills a struct probe_dmabuf_rt and returns probe_dmabuf_run(). The prototypes are static
 * declarations, so a flavour that leaves one out is diagnosed at the prototype when it compiles
 * ("used but never defined", "declared static but never defined"), and one defined with another
 * signature is too ("conflicting types" in C; in C++ the declared one is still never defined),
 * rather than at the call or when it links. Each returns 0 or a negative errno and, on failure,
 * writes the runtime's own name for its error (CUDA_ERROR_INVALID_VALUE, hipErrorInvalidValue)
 * to rt->why.
 *
 * The questions, for allocations of 4 KiB, 2 MiB, 3 MiB + 4 KiB and 64 MiB (granule multiples and
 * not): what size the runtime reports for the allocation, from an interior pointer and from the
 * last byte (is the base recoverable from any pointer into it?); whether the export of the whole
 * allocation, of the reported size, of the size rounded up to the granularity and of sub-ranges
 * at offsets honours the range (the size the dma-buf reports, lseek(fd, 0, SEEK_END)) and the
 * offset (where its first segment lies, compared with the whole export's address at that
 * offset); how many segments and contiguous runs describe each export; whether lengths and
 * offsets that are not page multiples are refused; and whether iommufd's IOMMU_IOAS_MAP_FILE
 * takes the export. Segments need the dmabuf_import module (dkms/dmabuf_import) through
 * upcie/kmod/dmabuf_import.h; where that header is missing at build time or the module is not
 * loaded, the probe says it could not look, and why.
 *
 * Allocations are never freed: the probe makes a handful and exits. C11 and C++17 (nvcc, hipcc).
 */
#ifndef UPCIE_TOOLS_PROBE_DMABUF_H
#define UPCIE_TOOLS_PROBE_DMABUF_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <upcie/mem/sglut.h>
#include <upcie/vfio/iommufd.h>

#include "probe_common.h"

#if defined(__has_include)
#if __has_include(<upcie/kmod/dmabuf_import.h>)
#include <upcie/kmod/dmabuf_import.h>
#define PROBE_HAVE_IMPORTER 1
#endif
#endif
#ifndef PROBE_HAVE_IMPORTER
#define PROBE_HAVE_IMPORTER 0
#endif

struct probe_dmabuf_rt {
	const char *name;	  /* "CUDA", "HIP" */
	const char *probe;	  /* the program's name, for the report */
	char runtime[160];	  /* driver and runtime versions, in the runtime's words */
	char device[160];	  /* device name, PCI address, dma-buf support */
	uint64_t granularity;	  /* minimum allocation granularity reported; 0: unknown */
	uint64_t granularity_rec; /* recommended granularity reported; 0: unknown */
	char why[128];		  /* the runtime's name for the last error */
};

/* The flavour's three functions (see above). */

/* Allocate `size` bytes of device memory; *ptr its device address. */
static int probe_dmabuf_alloc(struct probe_dmabuf_rt *rt, uint64_t size, uint64_t *ptr);
/* Export [ptr, ptr + len) as a dma-buf; *fd the new descriptor, the caller's to close. */
static int probe_dmabuf_export(struct probe_dmabuf_rt *rt, uint64_t ptr, uint64_t len, int *fd);
/* The allocation that holds ptr, as the runtime reports it: *base and *size. */
static int probe_dmabuf_range(struct probe_dmabuf_rt *rt, uint64_t ptr, uint64_t *base,
			      uint64_t *size);

/* --- the runner ----------------------------------------------------------------------------- */

#define PROBE_DMABUF_SEGS_MAX 65536

/* What one export gave: the runtime's answer, the descriptor's size and, when the importer could
 * look, its scatter list in short. */
struct probe_dmabuf_export {
	int err;
	int64_t size; /* lseek(SEEK_END), or -errno */
	char exporter[64];
	int looked; /* 1: segments below are valid; 0: could not look */
	uint64_t nsegs, nruns, bytes, shortest, first_addr;
};

/* The scatter-list reader: dmabuf_import where it was built in and is loaded. */
struct probe_importer {
	int ready;
	char why[160]; /* why not, when not ready */
#if PROBE_HAVE_IMPORTER
	struct upcie_kmod_dmabuf_import ctx;
#endif
	struct upcie_sg_seg *segs; /* scratch of PROBE_DMABUF_SEGS_MAX */
};

/* The counters behind the summary at the end. */
struct probe_dmabuf_tally {
	unsigned exports, honoured_len, looked_off, honoured_off, ranges, ranges_ok;
	unsigned unaligned, unaligned_refused;
};

static inline void probe_importer_open(struct probe_importer *imp)
{
	memset(imp, 0, sizeof(*imp));
#if PROBE_HAVE_IMPORTER
	{
		int err = upcie_kmod_dmabuf_import_open(&imp->ctx);

		if (err) {
			snprintf(imp->why, sizeof(imp->why),
				 "opening the dmabuf_import module: %s%s", probe_err(err),
				 err == -ENOENT
				     ? ", the module is not loaded (upcie-dmabuf-import-dkms; "
				       "modprobe dmabuf_import)"
				     : "");
			return;
		}
	}
	imp->segs = (struct upcie_sg_seg *)calloc(PROBE_DMABUF_SEGS_MAX, sizeof(*imp->segs));
	if (!imp->segs) {
		snprintf(imp->why, sizeof(imp->why), "out of memory for the segment list");
		upcie_kmod_dmabuf_import_close(&imp->ctx);
		return;
	}
	imp->ready = 1;
#else
	snprintf(imp->why, sizeof(imp->why),
		 "built without upcie/kmod/dmabuf_import.h, so no importer to read segments with");
#endif
}

static inline void probe_importer_close(struct probe_importer *imp)
{
#if PROBE_HAVE_IMPORTER
	if (imp->ready)
		upcie_kmod_dmabuf_import_close(&imp->ctx);
#endif
	free(imp->segs);
	memset(imp, 0, sizeof(*imp));
}

/* Attach, copy the scatter list to imp->segs, detach. *nsegs the count. */
static inline int probe_importer_read(struct probe_importer *imp, int fd, size_t *nsegs)
{
#if PROBE_HAVE_IMPORTER
	uint64_t handle = 0;
	int err;

	*nsegs = 0;
	if (!imp->ready)
		return -ENODEV;
	err = upcie_kmod_dmabuf_attach(&imp->ctx, fd, imp->segs, PROBE_DMABUF_SEGS_MAX, nsegs,
				       &handle);
	if (err == -ENOSPC)
		probe_say("    segments: %zu, more than the %d this probe reads", *nsegs,
			  PROBE_DMABUF_SEGS_MAX);
	if (err)
		return err;
	upcie_kmod_dmabuf_detach(&imp->ctx, handle);
	return 0;
#else
	(void)imp;
	(void)fd;
	*nsegs = 0;
	return -ENODEV;
#endif
}

/* The device address of byte `off` of a buffer described by segs; UINT64_MAX if outside. */
static inline uint64_t probe_segs_addr_at(const struct upcie_sg_seg *segs, size_t n, uint64_t off)
{
	for (size_t i = 0; i < n; i++) {
		if (off < segs[i].len)
			return segs[i].addr + off;
		off -= segs[i].len;
	}
	return UINT64_MAX;
}

/*
 * Export [ptr + off, + len) and report what came back. When `whole` (the export of the whole
 * allocation, read through the importer) is given, the first segment's address is compared with
 * the whole export's address at `off`: that is whether the offset was honoured.
 */
static inline void probe_dmabuf_one(struct probe_dmabuf_rt *rt, struct probe_importer *imp,
				    struct probe_dmabuf_tally *t, const char *what, uint64_t ptr,
				    uint64_t off, uint64_t len, const struct upcie_sg_seg *whole,
				    size_t nwhole, struct probe_dmabuf_export *out, int *keep_fd)
{
	struct probe_dmabuf_export e;
	size_t n = 0;
	int fd = -1, err;

	memset(&e, 0, sizeof(e));
	rt->why[0] = '\0';
	e.err = probe_dmabuf_export(rt, ptr + off, len, &fd);
	if (e.err) {
		probe_say("  export %-22s [+0x%" PRIx64 ", %s): refused, %s (%s)", what, off,
			  probe_size(len), rt->why[0] ? rt->why : "?", probe_err(e.err));
		if (out)
			*out = e;
		return;
	}
	t->exports++;
	probe_dmabuf_facts(fd, &e.size, e.exporter, sizeof(e.exporter));
	if (e.size == (int64_t)len)
		t->honoured_len++;
	probe_say("  export %-22s [+0x%" PRIx64 ", %s): ok, exporter %s, dma-buf size %s: %s", what,
		  off, probe_size(len), e.exporter[0] ? e.exporter : "?",
		  e.size < 0 ? probe_err((int)e.size) : probe_size((uint64_t)e.size),
		  e.size == (int64_t)len  ? "the length asked for"
		  : e.size < 0		  ? "size unknown"
		  : e.size > (int64_t)len ? "MORE than asked"
					  : "LESS than asked");
	err = imp->ready ? probe_importer_read(imp, fd, &n) : -ENODEV;
	if (err) {
		if (err != -ENODEV)
			probe_say("    segments: the importer refused it: %s", probe_err(err));
	} else {
		uint64_t end = 0;

		e.looked = 1;
		e.nsegs = n;
		e.shortest = UINT64_MAX;
		for (size_t i = 0; i < n; i++) {
			e.bytes += imp->segs[i].len;
			if (imp->segs[i].len < e.shortest)
				e.shortest = imp->segs[i].len;
			if (!i || imp->segs[i].addr != end)
				e.nruns++;
			end = imp->segs[i].addr + imp->segs[i].len;
		}
		e.first_addr = n ? imp->segs[0].addr : 0;
		probe_say("    segments: %" PRIu64 " in %" PRIu64
			  " contiguous run(s), %s described, "
			  "shortest %s, first at 0x%" PRIx64,
			  e.nsegs, e.nruns, probe_size(e.bytes), n ? probe_size(e.shortest) : "-",
			  e.first_addr);
		if (whole && nwhole && n) {
			uint64_t want = probe_segs_addr_at(whole, nwhole, off);

			t->looked_off++;
			if (want == e.first_addr)
				t->honoured_off++;
			probe_say("    offset: the whole export has 0x%" PRIx64 " at +0x%" PRIx64
				  ": %s",
				  want, off,
				  want == e.first_addr ? "honoured"
				  : e.first_addr == whole[0].addr
				      ? "IGNORED (the export starts at the allocation's base)"
				      : "NOT honoured");
		}
	}
	if (out)
		*out = e;
	if (keep_fd)
		*keep_fd = fd;
	else
		close(fd);
}

/* The runtime's answer for the allocation holding ptr + at. */
static inline void probe_dmabuf_range_q(struct probe_dmabuf_rt *rt, struct probe_dmabuf_tally *t,
					const char *what, uint64_t ptr, uint64_t size, uint64_t at)
{
	uint64_t base = 0, rsize = 0;
	int err;

	rt->why[0] = '\0';
	err = probe_dmabuf_range(rt, ptr + at, &base, &rsize);
	t->ranges++;
	if (err) {
		probe_say("  range from %-19s (+0x%" PRIx64 "): refused, %s (%s)", what, at,
			  rt->why[0] ? rt->why : "?", probe_err(err));
		return;
	}
	if (base == ptr)
		t->ranges_ok++;
	probe_say("  range from %-19s (+0x%" PRIx64 "): base %s, size %s%s", what, at,
		  base == ptr ? "= the pointer allocated" : "DIFFERENT", probe_size(rsize),
		  rsize == size	 ? " (as asked)"
		  : rsize > size ? " (MORE than asked)"
				 : " (LESS)");
}

/* IOMMU_IOAS_MAP_FILE of one export, where the kernel has iommufd. */
static inline void probe_dmabuf_map_file(int fd, uint64_t len)
{
	struct upcie_vfio_iommufd ictx;
	struct upcie_vfio_ioas ioas;
	uint64_t iova = 0;
	int err;

	memset(&ictx, 0, sizeof(ictx));
	memset(&ioas, 0, sizeof(ioas));
	if (access("/dev/iommu", F_OK)) {
		probe_say("  IOMMU_IOAS_MAP_FILE of this export: not asked, no /dev/iommu (this "
			  "kernel has no iommufd, or the module is not loaded)");
		return;
	}
	err = upcie_vfio_iommufd_open(&ictx);
	if (!err)
		err = upcie_vfio_ioas_alloc(&ioas, &ictx);
	if (!err)
		err = upcie_vfio_ioas_map_file(&ioas, fd, 0, len, 0, &iova);
	probe_say("  IOMMU_IOAS_MAP_FILE of this export: %s", err ? probe_err(err) : "ok");
	if (!err)
		upcie_vfio_ioas_unmap(&ioas, iova, len);
	upcie_vfio_iommufd_close(&ictx);
}

static inline void probe_dmabuf_alloc_q(struct probe_dmabuf_rt *rt, struct probe_importer *imp,
					struct probe_dmabuf_tally *t, unsigned idx, unsigned count,
					uint64_t size, int unaligned_q, int map_file_q)
{
	struct probe_dmabuf_export whole;
	struct upcie_sg_seg *wsegs = NULL;
	uint64_t ptr = 0, rbase = 0, rsize = 0, gran = rt->granularity, len;
	size_t nw = 0;
	int fd = -1, err;

	probe_say("allocation %u of %u: %s (0x%" PRIx64 ")", idx, count, probe_size(size), size);
	rt->why[0] = '\0';
	err = probe_dmabuf_alloc(rt, size, &ptr);
	if (err) {
		probe_say("  alloc: refused, %s (%s)", rt->why[0] ? rt->why : "?", probe_err(err));
		return;
	}
	probe_say("  alloc: ok, device address 0x%" PRIx64 " (aligned to %s)", ptr,
		  probe_size(probe_align_of(ptr)));
	probe_dmabuf_range_q(rt, t, "an interior pointer", ptr, size, size / 2);
	probe_dmabuf_range_q(rt, t, "the last byte", ptr, size, size - 1);
	if (probe_dmabuf_range(rt, ptr, &rbase, &rsize))
		rsize = 0;

	probe_dmabuf_one(rt, imp, t, "of the whole", ptr, 0, size, NULL, 0, &whole, &fd);
	if (whole.looked && whole.nsegs) {
		/* keep the whole export's scatter list to judge the offsets against */
		wsegs = (struct upcie_sg_seg *)calloc(whole.nsegs, sizeof(*wsegs));
		if (wsegs) {
			memcpy(wsegs, imp->segs, whole.nsegs * sizeof(*wsegs));
			nw = whole.nsegs;
		}
	}
	if (!whole.err && map_file_q)
		probe_dmabuf_map_file(fd, size);
	if (fd >= 0)
		close(fd);
	if (rsize && rsize != size)
		probe_dmabuf_one(rt, imp, t, "of the reported size", ptr, 0, rsize, wsegs, nw, NULL,
				 NULL);
	if (gran && size % gran)
		probe_dmabuf_one(rt, imp, t, "to the granularity", ptr, 0,
				 upcie_align_up(size, gran), wsegs, nw, NULL, NULL);
	if (size >= 128 * PROBE_KiB)
		probe_dmabuf_one(rt, imp, t, "64 KiB at 64 KiB", ptr, 64 * PROBE_KiB,
				 64 * PROBE_KiB, wsegs, nw, NULL, NULL);
	if (size >= 2 * PROBE_MiB)
		probe_dmabuf_one(rt, imp, t, "1 MiB at 1 MiB", ptr, PROBE_MiB, PROBE_MiB, wsegs, nw,
				 NULL, NULL);
	if (size >= 8 * PROBE_KiB) {
		probe_dmabuf_one(rt, imp, t, "4 KiB at 4 KiB", ptr, 4 * PROBE_KiB, 4 * PROBE_KiB,
				 wsegs, nw, NULL, NULL);
		len = upcie_align_down(size - 1, 4 * PROBE_KiB);
		probe_dmabuf_one(rt, imp, t, "the last 4 KiB", ptr, len, 4 * PROBE_KiB, wsegs, nw,
				 NULL, NULL);
	}
	if (unaligned_q) {
		static const uint64_t q[3][2] = { { 0, 4096 + 128 }, { 0, 128 }, { 128, 4096 } };
		static const char *const name[3] = { "of 4 KiB + 128 B", "of 128 B",
						     "of 4 KiB at +128 B" };

		for (int i = 0; i < 3; i++) {
			struct probe_dmabuf_export e;

			probe_dmabuf_one(rt, imp, t, name[i], ptr, q[i][0], q[i][1], wsegs, nw, &e,
					 NULL);
			t->unaligned++;
			if (e.err)
				t->unaligned_refused++;
		}
	}
	free(wsegs);
}

/* Run every question and print the summary. Returns the exit status for main(). */
static inline int probe_dmabuf_run(struct probe_dmabuf_rt *rt)
{
	static const uint64_t sizes[] = { 4 * PROBE_KiB, 2 * PROBE_MiB,
					  3 * PROBE_MiB + 4 * PROBE_KiB, 64 * PROBE_MiB };
	struct probe_importer imp;
	struct probe_dmabuf_tally t;
	unsigned n = (unsigned)UPCIE_ARRAY_SIZE(sizes);

	memset(&t, 0, sizeof(t));
	probe_say("runtime: %s %s", rt->name, rt->runtime);
	probe_say("device:  %s", rt->device);
	probe_say("granularity: minimum %s, recommended %s",
		  rt->granularity ? probe_size(rt->granularity) : "unknown",
		  rt->granularity_rec ? probe_size(rt->granularity_rec) : "unknown");
	probe_importer_open(&imp);
	if (imp.ready)
		probe_say("importer: dmabuf_import, the module's own device (bus addresses)");
	else
		probe_say("importer: could not look at segments: %s", imp.why);
	for (unsigned i = 0; i < n; i++)
		probe_dmabuf_alloc_q(rt, &imp, &t, i + 1, n, sizes[i], sizes[i] == 2 * PROBE_MiB,
				     sizes[i] == 2 * PROBE_MiB);
	probe_say("summary (%s):", rt->name);
	probe_say("  length: %u of %u exports report the size asked for", t.honoured_len,
		  t.exports);
	if (t.looked_off)
		probe_say("  offset: %u of %u sub-range exports start where the whole export has "
			  "that offset",
			  t.honoured_off, t.looked_off);
	else
		probe_say("  offset: could not look (%s)",
			  imp.ready ? "no sub-range export to compare" : imp.why);
	probe_say("  base from a pointer into the allocation: %u of %u queries gave the base",
		  t.ranges_ok, t.ranges);
	probe_say("  lengths or offsets off the page: %u of %u refused", t.unaligned_refused,
		  t.unaligned);
	probe_importer_close(&imp);
	return PROBE_EXIT_OK;
}

#endif /* UPCIE_TOOLS_PROBE_DMABUF_H */
