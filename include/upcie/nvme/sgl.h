/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * SGL builder: fills the data pointer of a command with NVMe Scatter Gather List descriptors
 * from a buffer or a list of segments (the same inputs as the PRP builder).
 *
 * Each device-contiguous run becomes one Data Block descriptor: a segment is split where its
 * translation is not contiguous (LUT granule boundaries) and neighbouring runs whose device
 * addresses happen to meet are merged, also across segments. One descriptor goes straight into
 * the command (SGL1). More go into list pages (page/16 descriptors each) reached through a Last
 * Segment descriptor, or, beyond one page, a chain of Segment descriptors, each occupying the
 * last slot of a full page. Segments may have any alignment unless cfg->sgl_dword asks for dword
 * addresses and lengths (Identify SGLS bits 1:0 = 2).
 *
 * Use SGLs only when Identify Controller SGLS says the controller supports them for NVM
 * commands; the caller decides (upcie never switches between PRP and SGL by itself).
 * Errors leave the command untouched (list pages may have been written). Host code only.
 */
#ifndef UPCIE_NVME_SGL_H
#define UPCIE_NVME_SGL_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <upcie/base/bits.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>
#include <upcie/nvme/dptr.h>
#include <upcie/nvme/spec.h>

/* Largest Data Block length emitted: the 32-bit length field, kept page and dword aligned. */
#define UPCIE_NVME_SGL_MAX_DESC_LEN UINT64_C(0xfffff000)

/* Walk state shared by the counting pass and the writing pass, so both see the same runs. */
struct upcie_nvme_sgl_walk_ {
	uint64_t addr, len;   /* pending (not yet emitted) descriptor */
	uint64_t count;	      /* descriptors emitted */
	uint64_t addr0, len0; /* the first one: SGL1 when it is the only one */
	/* writing pass only */
	const struct upcie_nvme_lists *lists;
	unsigned shift;
	uint64_t total; /* descriptors overall */
	uint32_t per;	/* descriptors per list page */
	uint32_t left;	/* free slots in the current page */
	uint32_t lp;	/* current list page */
	struct upcie_nvme_sgl_desc *slot;
	bool write;
};

static inline void upcie_nvme_sgl_desc_put_(struct upcie_nvme_sgl_desc *d, uint64_t addr,
					    uint32_t len, uint8_t type)
{
	d->addr = addr;
	d->len = len;
	d->rsvd[0] = d->rsvd[1] = d->rsvd[2] = 0;
	d->id = UPCIE_NVME_SGL_ID(type, UPCIE_NVME_SGL_SUB_ADDRESS);
}

static inline void upcie_nvme_sgl_flush_(struct upcie_nvme_sgl_walk_ *w)
{
	if (!w->len)
		return;
	if (w->write && w->total > 1) {
		uint64_t remaining = w->total - w->count;

		if (w->left == 1 && remaining > 1) {
			/* Full page: its last slot links to the next page, which is the last
			 * segment when the rest fits in it. */
			bool last = remaining <= w->per;
			uint32_t len = (uint32_t)((last ? remaining : w->per) * 16);

			w->lp++;
			upcie_nvme_sgl_desc_put_(
			    w->slot, upcie_nvme_lists_iova_(w->lists, w->shift, w->lp), len,
			    last ? UPCIE_NVME_SGL_LAST_SEGMENT : UPCIE_NVME_SGL_SEGMENT);
			w->slot = (struct upcie_nvme_sgl_desc *)upcie_nvme_lists_page_(
			    w->lists, w->shift, w->lp);
			w->left = w->per;
		}
		upcie_nvme_sgl_desc_put_(w->slot++, w->addr, (uint32_t)w->len,
					 UPCIE_NVME_SGL_DATA_BLOCK);
		w->left--;
	}
	if (!w->count) {
		w->addr0 = w->addr;
		w->len0 = w->len;
	}
	w->count++;
	w->len = 0;
}

/* Add a device-contiguous run, merging with the pending one when they meet. */
static inline void upcie_nvme_sgl_run_(struct upcie_nvme_sgl_walk_ *w, uint64_t addr, uint64_t len)
{
	while (len) {
		uint64_t take;

		if (w->len && w->addr + w->len == addr && w->len < UPCIE_NVME_SGL_MAX_DESC_LEN) {
			take = UPCIE_NVME_SGL_MAX_DESC_LEN - w->len;
			take = take < len ? take : len;
			w->len += take;
		} else {
			upcie_nvme_sgl_flush_(w);
			take =
			    len < UPCIE_NVME_SGL_MAX_DESC_LEN ? len : UPCIE_NVME_SGL_MAX_DESC_LEN;
			w->addr = addr;
			w->len = take;
		}
		addr += take;
		len -= take;
	}
}

static inline void upcie_nvme_sgl_walk_segs_(struct upcie_nvme_sgl_walk_ *w,
					     const struct upcie_nvme_dseg *segs, unsigned nsegs)
{
	for (unsigned i = 0; i < nsegs; i++) {
		uint64_t o = segs[i].off, rem = segs[i].len;

		while (rem) {
			uint64_t run = upcie_dmamem_contig(segs[i].mem, o);

			run = run < rem ? run : rem;
			upcie_nvme_sgl_run_(w, upcie_dmamem_iova_fast(segs[i].mem, o), run);
			o += run;
			rem -= run;
		}
	}
	upcie_nvme_sgl_flush_(w);
}

/*
 * List pages an SGL for `nsegs` segments (checked as upcie_nvme_sgl_build() checks them) needs
 * with `page_shift` pages: 0 when one descriptor (SGL1) holds it. The count of the build's own
 * first pass, for checking a request before any of it is submitted.
 */
static inline uint32_t upcie_nvme_sgl_lists_needed(const struct upcie_nvme_dseg *segs,
						   unsigned nsegs, unsigned page_shift)
{
	struct upcie_nvme_sgl_walk_ w;

	memset(&w, 0, sizeof(w));
	upcie_nvme_sgl_walk_segs_(&w, segs, nsegs);
	if (w.count <= 1)
		return 0;
	return upcie_nvme_lists_needed_(w.count, (uint32_t)((UINT64_C(1) << page_shift) / 16));
}

/*
 * Fill the data pointer of `sqe` with an SGL (PSDT = SGL, MPTR untouched) for `nsegs`
 * segments. `lists` provides list pages when more than one descriptor is needed (may be NULL
 * otherwise). Returns the number of list pages used, or:
 *   -EINVAL  bad config or segment (empty, out of bounds, not dword aligned/sized when
 *            cfg->sgl_dword), total above cfg->max_bytes, unusable list pages;
 *   -ENOSPC  more list pages needed than `lists` has.
 */
static inline int upcie_nvme_sgl_build(struct upcie_nvme_sqe *sqe,
				       const struct upcie_nvme_dseg *segs, unsigned nsegs,
				       const struct upcie_nvme_dptr_cfg *cfg,
				       const struct upcie_nvme_lists *lists)
{
	struct upcie_nvme_sgl_walk_ w;
	uint64_t total = 0;
	uint32_t need = 0;
	int err;

	err = upcie_nvme_dptr_cfg_check_(cfg);
	if (err)
		return err;
	if (!sqe || !segs || !nsegs)
		return UPCIE_FAIL(-EINVAL, "nvme: SGL: no command or no segments");
	for (unsigned i = 0; i < nsegs; i++) {
		err = upcie_nvme_dseg_check_(&segs[i], i);
		if (err)
			return err;
		if (cfg->sgl_dword &&
		    ((upcie_dmamem_iova_fast(segs[i].mem, segs[i].off) | segs[i].len) & 3))
			return UPCIE_FAIL(-EINVAL,
					  "nvme: SGL: segment %u not dword aligned and sized", i);
		if (upcie_add_overflow(total, segs[i].len, &total))
			return UPCIE_FAIL(-EINVAL, "nvme: SGL: transfer length overflows");
	}
	if (total > cfg->max_bytes)
		return UPCIE_FAIL(-EINVAL,
				  "nvme: SGL: %llu bytes above the %llu-byte transfer limit",
				  (unsigned long long)total, (unsigned long long)cfg->max_bytes);

	memset(&w, 0, sizeof(w));
	upcie_nvme_sgl_walk_segs_(&w, segs, nsegs); /* count */
	if (w.count == 1) {
		upcie_nvme_sqe_set_sgl1(
		    sqe, w.addr0, (uint32_t)w.len0,
		    UPCIE_NVME_SGL_ID(UPCIE_NVME_SGL_DATA_BLOCK, UPCIE_NVME_SGL_SUB_ADDRESS));
		return 0;
	}
	w.per = (uint32_t)((UINT64_C(1) << cfg->page_shift) / 16);
	need = upcie_nvme_lists_needed_(w.count, w.per);
	err = upcie_nvme_lists_check_(lists, cfg->page_shift, need);
	if (err)
		return err;

	w.total = w.count;
	w.count = 0;
	w.len = 0;
	w.write = true;
	w.lists = lists;
	w.shift = cfg->page_shift;
	w.left = w.per;
	w.lp = 0;
	w.slot = (struct upcie_nvme_sgl_desc *)upcie_nvme_lists_page_(lists, w.shift, 0);
	upcie_nvme_sgl_walk_segs_(&w, segs, nsegs); /* write */

	if (w.total <= w.per)
		upcie_nvme_sqe_set_sgl1(
		    sqe, upcie_nvme_lists_iova_(lists, w.shift, 0), (uint32_t)(w.total * 16),
		    UPCIE_NVME_SGL_ID(UPCIE_NVME_SGL_LAST_SEGMENT, UPCIE_NVME_SGL_SUB_ADDRESS));
	else
		upcie_nvme_sqe_set_sgl1(
		    sqe, upcie_nvme_lists_iova_(lists, w.shift, 0), w.per * 16,
		    UPCIE_NVME_SGL_ID(UPCIE_NVME_SGL_SEGMENT, UPCIE_NVME_SGL_SUB_ADDRESS));
	return (int)need;
}

/* As upcie_nvme_sgl_build() for one contiguous buffer: `len` bytes at `off` in `mem`. */
static inline int upcie_nvme_sgl_build_buf(struct upcie_nvme_sqe *sqe,
					   const struct upcie_dmamem *mem, uint64_t off,
					   uint64_t len, const struct upcie_nvme_dptr_cfg *cfg,
					   const struct upcie_nvme_lists *lists)
{
	struct upcie_nvme_dseg seg;

	/* One device-contiguous run: a single Data Block in the command. */
	if (UPCIE_LIKELY(cfg && mem && len && off < mem->size && len <= mem->size - off &&
			 len <= cfg->max_bytes && len <= UPCIE_NVME_SGL_MAX_DESC_LEN &&
			 cfg->page_shift >= UPCIE_NVME_PAGE_SHIFT_MIN &&
			 cfg->page_shift <= UPCIE_NVME_PAGE_SHIFT_MAX &&
			 upcie_dmamem_contig(mem, off) >= len)) {
		uint64_t a = upcie_dmamem_iova_fast(mem, off);

		if (UPCIE_LIKELY(!cfg->sgl_dword || !((a | len) & 3))) {
			upcie_nvme_sqe_set_sgl1(sqe, a, (uint32_t)len,
						UPCIE_NVME_SGL_ID(UPCIE_NVME_SGL_DATA_BLOCK,
								  UPCIE_NVME_SGL_SUB_ADDRESS));
			return 0;
		}
	}
	seg.mem = mem;
	seg.off = off;
	seg.len = len;
	return upcie_nvme_sgl_build(sqe, &seg, 1, cfg, lists);
}

#endif /* UPCIE_NVME_SGL_H */
