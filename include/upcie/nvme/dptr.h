/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Inputs shared by the PRP and SGL builders (prp.h, sgl.h), and the helper that cuts a large
 * request into commands the controller accepts.
 *
 * A transfer is a list of data segments, each (dmamem, offset, length); the builders translate
 * every page through the segment's dmamem, so the memory can be host hugepages, an IOMMU mapping
 * or GPU memory alike. PRP lists and SGL segments that do not fit in the command go into list
 * pages the caller provides (struct upcie_nvme_lists): the caller decides where they live (host
 * memory, CMB, ...) and how many a command may use. Host code only: it writes list pages through
 * the list dmamem's CPU view. Nothing here allocates or locks.
 */
#ifndef UPCIE_NVME_DPTR_H
#define UPCIE_NVME_DPTR_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <upcie/base/bits.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>

/* One piece of a transfer: `len` bytes at `off` in `mem`. */
struct upcie_nvme_dseg {
	const struct upcie_dmamem *mem;
	uint64_t off;
	uint64_t len;
};

/* What the controller accepts; fill once per controller. */
struct upcie_nvme_dptr_cfg {
	uint64_t max_bytes;  /* bytes per command: upcie_nvme_mdts_bytes(); UINT64_MAX: no limit */
	unsigned page_shift; /* controller memory page size, log2: 12 + CC.MPS (12..27) */
	bool sgl_dword;	     /* SGL data blocks must be dword aligned and sized (SGLS = 2) */
};

/*
 * List pages for one command: `npages` pages of the controller page size, starting at `off` in
 * `mem`. `mem` needs a CPU view; `off` must translate to a page-aligned device address and each
 * page must be device contiguous (a LUT granule of at least one page). May be NULL / 0 pages
 * for commands that need no list.
 */
struct upcie_nvme_lists {
	const struct upcie_dmamem *mem;
	uint64_t off;
	uint32_t npages;
};

#define UPCIE_NVME_PAGE_SHIFT_MIN 12
#define UPCIE_NVME_PAGE_SHIFT_MAX 27
/* NLB is a 16-bit 0's based field: one command moves at most 65536 blocks. */
#define UPCIE_NVME_MAX_BLOCKS_PER_CMD 65536u

static inline int upcie_nvme_dptr_cfg_check_(const struct upcie_nvme_dptr_cfg *cfg)
{
	if (!cfg || cfg->page_shift < UPCIE_NVME_PAGE_SHIFT_MIN ||
	    cfg->page_shift > UPCIE_NVME_PAGE_SHIFT_MAX || !cfg->max_bytes)
		return UPCIE_FAIL(
		    -EINVAL, "nvme: bad data pointer config (page_shift %u, max %llu)",
		    cfg ? cfg->page_shift : 0, cfg ? (unsigned long long)cfg->max_bytes : 0ULL);
	return 0;
}

/* Common segment checks: memory present, non-empty, inside the memory. */
static inline int upcie_nvme_dseg_check_(const struct upcie_nvme_dseg *seg, unsigned i)
{
	if (!seg->mem)
		return UPCIE_FAIL(-EINVAL, "nvme: segment %u has no memory", i);
	if (!seg->len)
		return UPCIE_FAIL(-EINVAL, "nvme: segment %u is empty", i);
	if (seg->off >= seg->mem->size || seg->len > seg->mem->size - seg->off)
		return UPCIE_FAIL(
		    -EINVAL, "nvme: segment %u (off %llu, len %llu) outside its memory (%zu bytes)",
		    i, (unsigned long long)seg->off, (unsigned long long)seg->len, seg->mem->size);
	return 0;
}

/*
 * Check that `need` list pages are available and usable. -ENOSPC when fewer are given, -EINVAL
 * for a region that breaks the rules of struct upcie_nvme_lists.
 */
static inline int upcie_nvme_lists_check_(const struct upcie_nvme_lists *l, unsigned page_shift,
					  uint32_t need)
{
	const struct upcie_dmamem *m;
	uint64_t bytes = (uint64_t)need << page_shift;

	if (!l || !l->mem || l->npages < need)
		return UPCIE_FAIL(-ENOSPC, "nvme: command needs %u list pages, %u given", need,
				  l && l->mem ? l->npages : 0);
	m = l->mem;
	if (!m->vaddr)
		return UPCIE_FAIL(-EINVAL, "nvme: list memory has no CPU view");
	if (m->lut && m->granule_shift < page_shift)
		return UPCIE_FAIL(-EINVAL,
				  "nvme: list memory granule (%u) below the page size (%u)",
				  m->granule_shift, page_shift);
	if (l->off >= m->size || bytes > m->size - l->off)
		return UPCIE_FAIL(-EINVAL, "nvme: list pages (off %llu, %u pages) outside memory",
				  (unsigned long long)l->off, need);
	if (!upcie_is_aligned(upcie_dmamem_iova_fast(m, l->off), UINT64_C(1) << page_shift))
		return UPCIE_FAIL(-EINVAL, "nvme: list pages not page aligned in device space");
	return 0;
}

/*
 * List pages needed for `n` entries when one page holds `per` and a full page that is followed
 * by more gives its last slot to the link: 0 for n <= 0, else 1 + (n - 2) / (per - 1).
 */
static inline uint32_t upcie_nvme_lists_needed_(uint64_t n, uint32_t per)
{
	uint64_t pages;

	if (!n)
		return 0;
	if (n <= per)
		return 1;
	pages = 1 + (n - 2) / (per - 1);
	return pages > UINT32_MAX ? UINT32_MAX : (uint32_t)pages;
}

/* CPU pointer to list page `k` of `l` (validated by upcie_nvme_lists_check_()). */
static inline void *upcie_nvme_lists_page_(const struct upcie_nvme_lists *l, unsigned page_shift,
					   uint32_t k)
{
	return (char *)l->mem->vaddr + l->off + ((uint64_t)k << page_shift);
}

static inline uint64_t upcie_nvme_lists_iova_(const struct upcie_nvme_lists *l, unsigned page_shift,
					      uint32_t k)
{
	return upcie_dmamem_iova_fast(l->mem, l->off + ((uint64_t)k << page_shift));
}

/*
 * Splitting a request into commands.
 *
 * A request larger than the controller takes (MDTS, or 65536 blocks) becomes several commands.
 * The split cuts at multiples of `chunk` bytes from the start of the request, `chunk` being
 * max_bytes rounded down to whole blocks (at most 65536) and to a multiple of 4 bytes. Every piece of a request
 * that satisfies the PRP rules satisfies them too: a piece may start where its predecessor
 * stopped (the first segment of a transfer may start anywhere dword aligned) and may stop
 * anywhere (the last segment may end unaligned). Typical use:
 *
 *	struct upcie_nvme_split sp;
 *	struct upcie_nvme_dseg piece[NSEGS];
 *	uint64_t off, len;
 *	int n;
 *
 *	upcie_nvme_split_init(&sp, segs, nsegs, cfg.max_bytes, lba_bytes);
 *	while ((n = upcie_nvme_split_next(&sp, piece, NSEGS, &off, &len)) > 0)
 *		// read (len / lba_bytes) blocks at slba + off / lba_bytes into piece[0..n)
 */
struct upcie_nvme_split {
	const struct upcie_nvme_dseg *segs;
	unsigned nsegs;
	unsigned idx;	/* segment the next piece starts in */
	uint64_t pos;	/* bytes of segs[idx] already handed out */
	uint64_t done;	/* bytes handed out */
	uint64_t total; /* bytes in the request */
	uint64_t chunk; /* bytes per command */
};

/*
 * Bytes per command when `max_bytes` is cut into whole blocks of `block_bytes`: at most 65536
 * blocks, and a multiple of 4 so that every piece starts dword aligned when the request does
 * (PRP1 and dword SGLs need that; an extended LBA format with, say, 6 bytes of metadata has
 * 518-byte blocks). 0 when not even that fits.
 */
static inline uint64_t upcie_nvme_split_chunk(uint64_t max_bytes, uint32_t block_bytes)
{
	uint64_t cap = (uint64_t)UPCIE_NVME_MAX_BLOCKS_PER_CMD * block_bytes, chunk;

	if (!block_bytes)
		return 0;
	chunk = max_bytes - max_bytes % block_bytes;
	if (chunk > cap)
		chunk = cap;
	/* chunk is k blocks; removing blocks reaches a multiple of 4 in at most 3 steps */
	while (chunk % 4)
		chunk -= block_bytes;
	return chunk;
}

/*
 * Prepare to split `segs` (nsegs entries, kept by reference) into commands of at most
 * `max_bytes` bytes, cut at multiples of `block_bytes` (the LBA size, metadata included for
 * extended LBAs), at most 65536 blocks, and at multiples of 4 bytes (upcie_nvme_split_chunk()).
 * Returns 0, or -EINVAL (no segments, an empty segment, a total that is not a whole number of
 * blocks, max_bytes below what one command needs).
 */
static inline int upcie_nvme_split_init(struct upcie_nvme_split *sp,
					const struct upcie_nvme_dseg *segs, unsigned nsegs,
					uint64_t max_bytes, uint32_t block_bytes)
{
	uint64_t total = 0, chunk = upcie_nvme_split_chunk(max_bytes, block_bytes);

	/* A failed init leaves a splitter that yields nothing, never stale state. */
	if (sp)
		memset(sp, 0, sizeof(*sp));
	if (!sp || !segs || !nsegs || !chunk)
		return UPCIE_FAIL(-EINVAL,
				  "nvme: split: bad arguments (nsegs %u, max %llu, block %u)",
				  nsegs, (unsigned long long)max_bytes, block_bytes);
	for (unsigned i = 0; i < nsegs; i++) {
		if (!segs[i].len || upcie_add_overflow(total, segs[i].len, &total))
			return UPCIE_FAIL(-EINVAL, "nvme: split: segment %u empty or too long", i);
	}
	if (total % block_bytes)
		return UPCIE_FAIL(-EINVAL,
				  "nvme: split: %llu bytes is not a whole number of %u-byte blocks",
				  (unsigned long long)total, block_bytes);
	sp->segs = segs;
	sp->nsegs = nsegs;
	sp->idx = 0;
	sp->pos = 0;
	sp->done = 0;
	sp->total = total;
	sp->chunk = chunk;
	return 0;
}

/*
 * The next command's share of the request: up to `max_out` segments into `out`, the byte offset
 * of the piece in the request into *off and its length into *len. Returns the number of
 * segments (>= 1), 0 when the whole request has been handed out, or -ENOSPC when the piece
 * needs more than `max_out` segments (nothing consumed; max_out = nsegs always suffices).
 */
static inline int upcie_nvme_split_next(struct upcie_nvme_split *sp, struct upcie_nvme_dseg *out,
					unsigned max_out, uint64_t *off, uint64_t *len)
{
	uint64_t want, left;
	unsigned idx = sp->idx, n = 0;
	uint64_t pos = sp->pos;

	if (sp->done >= sp->total)
		return 0;
	left = sp->total - sp->done;
	want = left < sp->chunk ? left : sp->chunk;
	for (uint64_t got = 0; got < want; n++) {
		const struct upcie_nvme_dseg *s = &sp->segs[idx];
		uint64_t take = s->len - pos;

		if (n == max_out)
			return UPCIE_FAIL(-ENOSPC, "nvme: split: piece needs more than %u segments",
					  max_out);
		if (take > want - got)
			take = want - got;
		out[n].mem = s->mem;
		out[n].off = s->off + pos;
		out[n].len = take;
		got += take;
		pos += take;
		if (pos == s->len) {
			idx++;
			pos = 0;
		}
	}
	*off = sp->done;
	*len = want;
	sp->done += want;
	sp->idx = idx;
	sp->pos = pos;
	return (int)n;
}

#endif /* UPCIE_NVME_DPTR_H */
