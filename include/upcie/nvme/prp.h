/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * PRP builder: fills PRP1/PRP2 of a command from a buffer or from a list of segments, with PRP
 * lists in caller-provided list pages, chained so a command can move any number of pages (MDTS
 * is the only limit).
 *
 * Rules (NVMe base spec, "Physical Region Page Entry and List"): PRP1 may start anywhere dword
 * aligned; every later entry is a whole page. For segment lists that means: the first segment
 * may start unaligned, every other segment starts on a page boundary, every segment but the last
 * ends on one. "Page" is the controller memory page (CC.MPS) in device address space. Every page
 * is translated through its dmamem once (one lookup per page, never a stride across a LUT
 * granule); LUT memory needs granules of at least one page, so no page straddles two.
 * A list page holds page/8 entries; when more entries follow a full page its last slot points to
 * the next list page.
 *
 * Errors leave the command untouched (list pages may have been written). Host code only.
 */
#ifndef UPCIE_NVME_PRP_H
#define UPCIE_NVME_PRP_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <upcie/base/bits.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>
#include <upcie/nvme/dptr.h>
#include <upcie/nvme/spec.h>

/* Check one PRP segment (i of n); on success its first device address and page count. */
static inline int upcie_nvme_prp_seg_check_(const struct upcie_nvme_dseg *seg, unsigned i,
					    unsigned n, unsigned page_shift, uint64_t *first,
					    uint64_t *pages)
{
	uint64_t pmask = (UINT64_C(1) << page_shift) - 1;
	uint64_t a;
	int err = upcie_nvme_dseg_check_(seg, i);

	if (err)
		return err;
	if (seg->mem->lut && seg->mem->granule_shift < page_shift)
		return UPCIE_FAIL(-EINVAL,
				  "nvme: PRP: segment %u memory granule 2^%u below page 2^%u", i,
				  seg->mem->granule_shift, page_shift);
	a = upcie_dmamem_iova_fast(seg->mem, seg->off);
	if (i == 0 && (a & 3))
		return UPCIE_FAIL(-EINVAL, "nvme: PRP: data starts at 0x%llx, not dword aligned",
				  (unsigned long long)a);
	if (i > 0 && (a & pmask))
		return UPCIE_FAIL(-EINVAL,
				  "nvme: PRP: segment %u starts at 0x%llx, not page aligned", i,
				  (unsigned long long)a);
	/* For LUT memory a ≡ off (mod page) because granules are page multiples, so a + len is
	 * the device end modulo the page even when the segment spans granules. */
	if (i + 1 < n && ((a + seg->len) & pmask))
		return UPCIE_FAIL(-EINVAL, "nvme: PRP: segment %u does not end on a page boundary",
				  i);
	*first = a;
	*pages = ((a & pmask) + seg->len + pmask) >> page_shift;
	return 0;
}

/*
 * Fill the data pointer of `sqe` (PRP1, PRP2, PSDT = PRP) for a transfer made of `nsegs`
 * segments. `lists` provides list pages when more than two pages are involved (may be NULL
 * otherwise). Returns the number of list pages used (0..lists->npages), or:
 *   -EINVAL  bad config, segment (empty, out of bounds, misaligned per the rules above,
 *            granule below page size), total above cfg->max_bytes, or unusable list pages;
 *   -ENOSPC  the transfer needs more list pages than `lists` has.
 */
static inline int upcie_nvme_prp_build(struct upcie_nvme_sqe *sqe,
				       const struct upcie_nvme_dseg *segs, unsigned nsegs,
				       const struct upcie_nvme_dptr_cfg *cfg,
				       const struct upcie_nvme_lists *lists)
{
	uint64_t total = 0, nprp = 0, first = 0, prp2 = 0;
	unsigned shift;
	uint64_t page, pmask;
	uint32_t per, need, left, lp = 0;
	uint64_t remaining, *slot = NULL;
	int err;

	err = upcie_nvme_dptr_cfg_check_(cfg);
	if (err)
		return err;
	if (!sqe || !segs || !nsegs)
		return UPCIE_FAIL(-EINVAL, "nvme: PRP: no command or no segments");
	shift = cfg->page_shift;
	page = UINT64_C(1) << shift;
	pmask = page - 1;
	for (unsigned i = 0; i < nsegs; i++) {
		uint64_t a, pages;

		err = upcie_nvme_prp_seg_check_(&segs[i], i, nsegs, shift, &a, &pages);
		if (err)
			return err;
		if (i == 0)
			first = a;
		if (upcie_add_overflow(total, segs[i].len, &total))
			return UPCIE_FAIL(-EINVAL, "nvme: PRP: transfer length overflows");
		nprp += pages;
	}
	if (total > cfg->max_bytes)
		return UPCIE_FAIL(-EINVAL,
				  "nvme: PRP: %llu bytes above the %llu-byte transfer limit",
				  (unsigned long long)total, (unsigned long long)cfg->max_bytes);

	/* Entries after PRP1 go to PRP2 directly (one) or to list pages (more). */
	remaining = nprp - 1;
	per = (uint32_t)(page / 8);
	need = remaining > 1 ? upcie_nvme_lists_needed_(remaining, per) : 0;
	if (need) {
		err = upcie_nvme_lists_check_(lists, shift, need);
		if (err)
			return err;
		slot = (uint64_t *)upcie_nvme_lists_page_(lists, shift, 0);
		prp2 = upcie_nvme_lists_iova_(lists, shift, 0);
	}
	left = per;
	for (unsigned i = 0; i < nsegs && remaining; i++) {
		const struct upcie_nvme_dseg *s = &segs[i];
		uint64_t o = s->off, end = s->off + s->len;

		if (i == 0) /* PRP1 covers up to the first page boundary */
			o += page - (first & pmask);
		for (; o < end && remaining; o += page) {
			uint64_t e = upcie_dmamem_iova_fast(s->mem, o);

			if (!need) {
				prp2 = e;
				remaining--;
				continue;
			}
			if (left == 1 && remaining > 1) {
				/* Last slot of a full page: link to the next list page. */
				lp++;
				*slot = upcie_nvme_lists_iova_(lists, shift, lp);
				slot = (uint64_t *)upcie_nvme_lists_page_(lists, shift, lp);
				left = per;
			}
			*slot++ = e;
			left--;
			remaining--;
		}
	}
	sqe->prp1 = first;
	sqe->prp2 = prp2;
	upcie_nvme_sqe_set_psdt(sqe, UPCIE_NVME_PSDT_PRP);
	return (int)need;
}

/*
 * As upcie_nvme_prp_build() for one contiguous buffer: `len` bytes at `off` in `mem`.
 * Transfers of one or two pages touch only the command (the hot path: one translation per page,
 * no list, no division).
 */
static inline int upcie_nvme_prp_build_buf(struct upcie_nvme_sqe *sqe,
					   const struct upcie_dmamem *mem, uint64_t off,
					   uint64_t len, const struct upcie_nvme_dptr_cfg *cfg,
					   const struct upcie_nvme_lists *lists)
{
	struct upcie_nvme_dseg seg;

	/* len - 1 < max_bytes: 1 <= len <= max_bytes in one compare. */
	if (UPCIE_LIKELY(cfg && mem && len - 1 < cfg->max_bytes && off < mem->size &&
			 len <= mem->size - off &&
			 cfg->page_shift - UPCIE_NVME_PAGE_SHIFT_MIN <=
			     UPCIE_NVME_PAGE_SHIFT_MAX - UPCIE_NVME_PAGE_SHIFT_MIN &&
			 !(mem->lut && mem->granule_shift < cfg->page_shift))) {
		uint64_t page = UINT64_C(1) << cfg->page_shift;
		uint64_t a = upcie_dmamem_iova_fast(mem, off);
		uint64_t first = page - (a & (page - 1));

		if (UPCIE_LIKELY(!(a & 3) && len <= first + page)) {
			sqe->prp1 = a;
			sqe->prp2 = len > first ? upcie_dmamem_iova_fast(mem, off + first) : 0;
			sqe->flags &= 0x3f; /* PSDT = PRP */
			return 0;
		}
	}
	/* Longer transfers, and every error with its message, take the general path. */
	seg.mem = mem;
	seg.off = off;
	seg.len = len;
	return upcie_nvme_prp_build(sqe, &seg, 1, cfg, lists);
}

/*
 * A data memory checked once against a controller's data pointer config, for the PRP hot path.
 * upcie_nvme_prp_build_buf() re-checks the config and the memory's LUT granule on every call;
 * upcie_nvme_prp_mem_init() does that once and keeps what the fast path needs, so
 * upcie_nvme_prp_mem_build() only checks the arguments of each transfer. `mem` is kept by
 * reference and must outlive this object (a dmamem is immutable after construction, so what
 * init derived from it stays true); the config is copied. Fill with upcie_nvme_prp_mem_init()
 * and do not change the fields.
 */
struct upcie_nvme_prp_mem {
	const uint64_t *lut; /* translation: lut[off >> gshift] + (off & gmask) */
	uint64_t gmask;	     /* (1 << gshift) - 1 */
	unsigned gshift;     /* LUT granule shift; 63 for arithmetic memory (lut: &mem->iova) */
	unsigned page_shift; /* cfg.page_shift */
	uint64_t pmask;	     /* page - 1 */
	uint64_t pmask2;     /* 2 * page - 1 */
	uint64_t lim;  /* min(cfg.max_bytes, mem->size); 0: every call takes the general path */
	uint64_t size; /* mem->size */
	const struct upcie_dmamem *mem;
	struct upcie_nvme_dptr_cfg cfg; /* copy, for the general path and its messages */
};

/* Store PRP1, PRP2 and the whole flags byte (PSDT = PRP, FUSE = 0); nothing is read. */
static inline void upcie_nvme_prp_set_(struct upcie_nvme_sqe *sqe, uint64_t prp1, uint64_t prp2)
{
	sqe->prp1 = prp1;
	sqe->prp2 = prp2;
	sqe->flags = 0;
}

/*
 * Check `cfg` (as upcie_nvme_prp_build() does) and `mem` against it (present, LUT granule at
 * least one page) once, for upcie_nvme_prp_mem_build(). Returns 0, or -EINVAL (bad config, no
 * memory, LUT granule below the page size). A failed init still leaves `pm` safe to build with:
 * every build then takes the general path, which fails with upcie_nvme_prp_build()'s error.
 */
static inline int upcie_nvme_prp_mem_init(struct upcie_nvme_prp_mem *pm,
					  const struct upcie_dmamem *mem,
					  const struct upcie_nvme_dptr_cfg *cfg)
{
	int err;

	if (!pm)
		return UPCIE_FAIL(-EINVAL, "nvme: PRP: no memory binding");
	memset(pm, 0, sizeof(*pm));
	pm->mem = mem;
	if (cfg)
		pm->cfg = *cfg;
	err = upcie_nvme_dptr_cfg_check_(cfg);
	if (err)
		return err;
	if (!mem)
		return UPCIE_FAIL(-EINVAL, "nvme: PRP: no memory");
	if (mem->lut && mem->granule_shift < cfg->page_shift)
		return UPCIE_FAIL(-EINVAL, "nvme: PRP: memory granule 2^%u below page 2^%u",
				  mem->granule_shift, cfg->page_shift);
	if (mem->lut) {
		pm->lut = mem->lut;
		pm->gshift = mem->granule_shift;
	} else {
		/* One "granule" of 2^63 bytes whose address is mem->iova: lut[0] + off. */
		pm->lut = &mem->iova;
		pm->gshift = 63;
	}
	pm->gmask = (UINT64_C(1) << pm->gshift) - 1;
	pm->page_shift = cfg->page_shift;
	pm->pmask = (UINT64_C(1) << cfg->page_shift) - 1;
	pm->pmask2 = 2 * pm->pmask + 1;
	pm->size = mem->size;
	/*
	 * Memory above 2^63 bytes (none exists) keeps lim 0, so in the fast path off < 2^63 (the
	 * arithmetic "granule" shift by 63 gives index 0) and in + len < 2^63 + page cannot wrap.
	 */
	if (mem->size && mem->size <= UINT64_C(1) << 63)
		pm->lim = cfg->max_bytes < mem->size ? cfg->max_bytes : mem->size;
	return 0;
}

/*
 * As upcie_nvme_prp_build_buf() for `len` bytes at `off` in the memory of `pm`, with the config
 * given to upcie_nvme_prp_mem_init(): same checks, errors, messages and data pointer. One
 * difference: the command is only written, never read (so it can be built in an SQ slot in
 * controller memory, see upcie_nvme_qpair_sqe_slot()): PRP1, PRP2 and the whole flags byte are
 * stored, PSDT = PRP and FUSE = 0 (set FUSE afterwards for a fused command). A transfer of one or
 * two pages costs two compares for the arguments, one translation per page and no list.
 */
static inline int upcie_nvme_prp_mem_build(struct upcie_nvme_sqe *sqe,
					   const struct upcie_nvme_prp_mem *pm, uint64_t off,
					   uint64_t len, const struct upcie_nvme_lists *lists)
{
	struct upcie_nvme_sqe tmp;
	struct upcie_nvme_dseg seg;
	int ret;

	/*
	 * The checks of upcie_nvme_prp_build_buf() that depend on the call:
	 *   1 <= len <= cfg.max_bytes, off < mem->size, len <= mem->size - off.
	 * len - 1 < lim (lim = min(max_bytes, size), see init) gives 1 <= len <= max_bytes and
	 * len <= size, so size - len does not wrap; then off <= size - len is off + len <= size,
	 * which with len >= 1 is exactly the two range checks. Config and granule were checked
	 * by init (lim stays 0 when they failed, sending every call to the general path).
	 */
	if (UPCIE_LIKELY(sqe && pm && len - 1 < pm->lim && off <= pm->size - len)) {
		uint64_t a = pm->lut[off >> pm->gshift] + (off & pm->gmask);
		uint64_t pmask = pm->pmask;

		/* Dword-aligned start, at most two pages: PRP1 and PRP2 in the command. */
		if (UPCIE_LIKELY(!(a & 3))) {
			uint64_t in = a & pmask;      /* start within its page */
			uint64_t last = in + len - 1; /* last byte, from that page's start */

			/*
			 * One page: first and last byte differ only in the offset bits. The same
			 * test as last <= pmask, one instruction shorter; an a + len - 1 that
			 * wraps past 2^64 (len <= 2^63) lands more than a page below a and fails
			 * it, as last <= pmask does.
			 */
			if (UPCIE_LIKELY((a ^ (a + len - 1)) <= pmask)) {
				upcie_nvme_prp_set_(sqe, a, 0);
				return 0;
			}
			if (last <= pm->pmask2) {
				uint64_t o2 = off + (pmask + 1) - in; /* second page */

				/*
				 * Stored in another order than prp_set_ does: a compiler that
				 * merges both paths' stores into one (of a selected PRP2) costs
				 * the one-page path the selection.
				 */
				sqe->flags = 0;
				sqe->prp2 = pm->lut[o2 >> pm->gshift] + (o2 & pm->gmask);
				sqe->prp1 = a;
				return 0;
			}
		}
	}
	/* Longer transfers, and every error with its message, take the general path. */
	if (!pm)
		return UPCIE_FAIL(-EINVAL, "nvme: PRP: no memory binding");
	seg.mem = pm->mem;
	seg.off = off;
	seg.len = len;
	/* Built aside and stored, so the command is not read here either. */
	memset(&tmp, 0, sizeof(tmp));
	ret = upcie_nvme_prp_build(sqe ? &tmp : NULL, &seg, 1, &pm->cfg, lists);
	if (ret >= 0)
		upcie_nvme_prp_set_(sqe, tmp.prp1, tmp.prp2);
	return ret;
}

/* List pages a transfer of `nprp` PRP entries needs with pages of 2^page_shift bytes. */
static inline uint32_t upcie_nvme_prp_lists_needed(uint64_t nprp, unsigned page_shift)
{
	return nprp > 2
		   ? upcie_nvme_lists_needed_(nprp - 1, (uint32_t)(UINT64_C(1) << page_shift) / 8)
		   : 0;
}

#endif /* UPCIE_NVME_PRP_H */
