/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * IOVA ranges and an IOVA allocator for IOMMU domains where user space picks the addresses
 * (vfio type1; iommufd with fixed IOVAs).
 *
 * The kernel reports which IOVAs a domain may use (type1: the IOVA-range capability of
 * VFIO_IOMMU_GET_INFO; iommufd: IOMMU_IOAS_IOVA_RANGES); the holes are reserved regions such as
 * the x86 MSI window at 0xfee00000 and firmware (RMRR) ranges. The allocator hands out IOVAs
 * inside those ranges only, preferring addresses at or above 4 GiB and falling back to lower
 * ones, never the MSI window (also where the kernel forgot to report it) and never the first
 * MiB: a DMA to a zero or tiny address is what an uninitialised descriptor does, and it should
 * fault rather than land in a buffer. IOVAs are never derived from physical addresses.
 * Ranges a caller keeps for itself (upcie_vfio_iova_space_exclude(), e.g. the iommu_map_pa
 * window) stay excluded whenever the domain's ranges are replaced. Each allocation keeps the size
 * it was rounded to, so it frees the same after a later group raised the page size. A space
 * carries a generation, new on every init, so a mapping can tell whether the space it came from
 * is still the one in place (a container whose groups all left and joined again is a new domain).
 *
 * Thread safety: allocation and free take the space's mutex, so dmamem release callbacks may run
 * on any thread; init/update/fini are the owner's. Needs nothing from the kernel itself.
 */
#ifndef UPCIE_VFIO_IOVA_H
#define UPCIE_VFIO_IOVA_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <upcie/base/bits.h>
#include <upcie/base/log.h>

#define UPCIE_VFIO_IOVA_RANGES_MAX 64
/* x86 interrupt address window: DMA writes here are MSIs, never memory. */
#define UPCIE_VFIO_IOVA_MSI_START UINT64_C(0xfee00000)
#define UPCIE_VFIO_IOVA_MSI_LAST  UINT64_C(0xfeefffff)
/* Nothing below this is handed out (see above). */
#define UPCIE_VFIO_IOVA_LOW_LIMIT (UINT64_C(1) << 20)
/* Allocations start here when the domain allows it. */
#define UPCIE_VFIO_IOVA_HIGH_START (UINT64_C(1) << 32)
/* Range assumed when the kernel reports none: 39 bits, which every VT-d and AMD-Vi table maps. */
#define UPCIE_VFIO_IOVA_DEFAULT_LAST ((UINT64_C(1) << 39) - 1)
/* Largest natural alignment chosen for align 0 (a 1 GiB IOMMU page). */
#define UPCIE_VFIO_IOVA_MAX_NATURAL_ALIGN (UINT64_C(1) << 30)

/* Inclusive: `last` is the last usable byte, as the kernel reports it. */
struct upcie_vfio_iova_range {
	uint64_t start;
	uint64_t last;
};

struct upcie_vfio_iova_ranges {
	uint32_t n;
	uint64_t align; /* smallest IOMMU page size in bytes; 0: unknown (4 KiB assumed) */
	struct upcie_vfio_iova_range r[UPCIE_VFIO_IOVA_RANGES_MAX];
};

/* One allocation: [start, last], rounded to the page size in force when it was made. */
struct upcie_vfio_iova_used {
	uint64_t start;
	uint64_t last;
	uint64_t pgsize;
};

struct upcie_vfio_iova_space {
	struct upcie_vfio_iova_ranges avail; /* allowed minus MSI window, low MiB, exclusions */
	struct upcie_vfio_iova_ranges excl; /* caller exclusions, applied to every new range list */
	struct upcie_vfio_iova_used *used;  /* allocations, sorted by start */
	size_t nused, cap;
	uint64_t pgsize; /* new allocations are aligned to and a multiple of this */
	uint64_t gen;	 /* non-zero, new on every init; 0 after fini */
	pthread_mutex_t lock;
	bool ready;
};

/*
 * Check a range list: start <= last, sorted, not overlapping, align 0 or a power of two.
 * Returns 0 or -EINVAL (with a message naming the bad entry).
 */
static inline int upcie_vfio_iova_ranges_check(const struct upcie_vfio_iova_ranges *rs)
{
	if (!rs)
		return UPCIE_FAIL(-EINVAL, "iova: NULL range list");
	if (rs->n > UPCIE_VFIO_IOVA_RANGES_MAX)
		return UPCIE_FAIL(-EINVAL, "iova: %u ranges, at most %d", rs->n,
				  UPCIE_VFIO_IOVA_RANGES_MAX);
	if (rs->align && !upcie_is_pow2(rs->align))
		return UPCIE_FAIL(-EINVAL, "iova: alignment 0x%" PRIx64 " is not a power of two",
				  rs->align);
	for (uint32_t i = 0; i < rs->n; i++) {
		if (rs->r[i].start > rs->r[i].last)
			return UPCIE_FAIL(
			    -EINVAL, "iova: range %u [0x%" PRIx64 ", 0x%" PRIx64 "] is reversed", i,
			    rs->r[i].start, rs->r[i].last);
		if (i && rs->r[i].start <= rs->r[i - 1].last)
			return UPCIE_FAIL(-EINVAL,
					  "iova: range %u starts at 0x%" PRIx64
					  ", not after range %u (last 0x%" PRIx64 ")",
					  i, rs->r[i].start, i - 1, rs->r[i - 1].last);
	}
	return 0;
}

/* Append [start, last] (must follow the current last range). -E2BIG when the list is full. */
static inline int upcie_vfio_iova_ranges_add(struct upcie_vfio_iova_ranges *rs, uint64_t start,
					     uint64_t last)
{
	if (!rs || start > last || (rs->n && start <= rs->r[rs->n - 1].last))
		return UPCIE_FAIL(-EINVAL, "iova: cannot append [0x%" PRIx64 ", 0x%" PRIx64 "]",
				  start, last);
	if (rs->n >= UPCIE_VFIO_IOVA_RANGES_MAX)
		return UPCIE_FAIL(-E2BIG, "iova: more than %d IOVA ranges",
				  UPCIE_VFIO_IOVA_RANGES_MAX);
	rs->r[rs->n].start = start;
	rs->r[rs->n].last = last;
	rs->n++;
	return 0;
}

/* Remove [start, last] from the list, splitting a range where needed. -E2BIG when full. */
static inline int upcie_vfio_iova_ranges_exclude(struct upcie_vfio_iova_ranges *rs, uint64_t start,
						 uint64_t last)
{
	struct upcie_vfio_iova_ranges out;

	if (!rs || start > last || rs->n > UPCIE_VFIO_IOVA_RANGES_MAX)
		return UPCIE_FAIL(-EINVAL, "iova: bad exclusion [0x%" PRIx64 ", 0x%" PRIx64 "]",
				  start, last);
	memset(&out, 0, sizeof(out));
	out.align = rs->align;
	for (uint32_t i = 0; i < rs->n; i++) {
		const struct upcie_vfio_iova_range *r = &rs->r[i];
		int err = 0;

		if (r->last < start || r->start > last) {
			err = upcie_vfio_iova_ranges_add(&out, r->start, r->last);
		} else {
			if (r->start < start)
				err = upcie_vfio_iova_ranges_add(&out, r->start, start - 1);
			if (!err && r->last > last)
				err = upcie_vfio_iova_ranges_add(&out, last + 1, r->last);
		}
		if (err)
			return err;
	}
	*rs = out;
	return 0;
}

/* Copy of `in` with the MSI window, the low MiB and the exclusions `excl` removed, validated. */
static inline int upcie_vfio_iova_space_prepare_(const struct upcie_vfio_iova_ranges *in,
						 const struct upcie_vfio_iova_ranges *excl,
						 struct upcie_vfio_iova_ranges *out)
{
	int err = upcie_vfio_iova_ranges_check(in);

	if (err)
		return err;
	*out = *in;
	err = upcie_vfio_iova_ranges_exclude(out, 0, UPCIE_VFIO_IOVA_LOW_LIMIT - 1);
	if (!err)
		err = upcie_vfio_iova_ranges_exclude(out, UPCIE_VFIO_IOVA_MSI_START,
						     UPCIE_VFIO_IOVA_MSI_LAST);
	for (uint32_t i = 0; excl && !err && i < excl->n; i++)
		err = upcie_vfio_iova_ranges_exclude(out, excl->r[i].start, excl->r[i].last);
	return err;
}

/*
 * A generation for a new space: the monotonic clock in ns, kept strictly increasing per
 * translation unit. A space is set up, torn down and set up again far apart from one ns, so two
 * generations of the same struct never meet, whichever translation unit made them.
 */
static inline uint64_t upcie_vfio_iova_gen_new_(void)
{
	static uint64_t last;
	struct timespec ts;
	uint64_t g, prev;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	g = (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
	prev = __atomic_load_n(&last, __ATOMIC_RELAXED);
	do {
		if (g <= prev)
			g = prev + 1;
	} while (!__atomic_compare_exchange_n(&last, &prev, g, false, __ATOMIC_RELAXED,
					      __ATOMIC_RELAXED));
	return g;
}

/*
 * Set up an allocator over `ranges` (copied). The page size is ranges->align (4 KiB when 0).
 * Returns 0, -EINVAL for a malformed list, -E2BIG when carving out the reserved windows needs
 * more than UPCIE_VFIO_IOVA_RANGES_MAX ranges.
 */
static inline int upcie_vfio_iova_space_init(struct upcie_vfio_iova_space *s,
					     const struct upcie_vfio_iova_ranges *ranges)
{
	int err;

	if (!s)
		return UPCIE_FAIL(-EINVAL, "iova: NULL space");
	memset(s, 0, sizeof(*s));
	err = upcie_vfio_iova_space_prepare_(ranges, NULL, &s->avail);
	if (err) {
		memset(s, 0, sizeof(*s));
		return err;
	}
	s->pgsize = ranges->align ? ranges->align : 4096;
	if (s->pgsize < 4096)
		s->pgsize = 4096;
	s->gen = upcie_vfio_iova_gen_new_();
	pthread_mutex_init(&s->lock, NULL);
	s->ready = true;
	return 0;
}

/* Free the allocator's bookkeeping (not the IOMMU mappings) and its exclusions. Zeroed: no-op. */
static inline void upcie_vfio_iova_space_fini(struct upcie_vfio_iova_space *s)
{
	if (!s || !s->ready)
		return;
	free(s->used);
	pthread_mutex_destroy(&s->lock);
	memset(s, 0, sizeof(*s));
}

static inline bool upcie_vfio_iova_inside_(const struct upcie_vfio_iova_ranges *rs, uint64_t start,
					   uint64_t last)
{
	for (uint32_t i = 0; i < rs->n; i++)
		if (start >= rs->r[i].start && last <= rs->r[i].last)
			return true;
	return false;
}

/*
 * Replace the allowed ranges (the domain changed, e.g. another group joined the container and
 * brought reserved regions of its own). The exclusions stay in force. Current allocations stay;
 * -EBUSY when one of them is outside the new ranges (nothing changes then).
 */
static inline int upcie_vfio_iova_space_update(struct upcie_vfio_iova_space *s,
					       const struct upcie_vfio_iova_ranges *ranges)
{
	struct upcie_vfio_iova_ranges nr;
	int err;

	if (!s || !s->ready)
		return UPCIE_FAIL(-EINVAL, "iova: space not initialised");
	pthread_mutex_lock(&s->lock);
	err = upcie_vfio_iova_space_prepare_(ranges, &s->excl, &nr);
	if (err) {
		pthread_mutex_unlock(&s->lock);
		return err;
	}
	for (size_t i = 0; i < s->nused; i++) {
		if (!upcie_vfio_iova_inside_(&nr, s->used[i].start, s->used[i].last)) {
			pthread_mutex_unlock(&s->lock);
			return UPCIE_FAIL(-EBUSY,
					  "iova: allocation [0x%" PRIx64 ", 0x%" PRIx64
					  "] is outside the domain's new IOVA ranges",
					  s->used[i].start, s->used[i].last);
		}
	}
	s->avail = nr;
	if (ranges->align > s->pgsize)
		s->pgsize = ranges->align;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/*
 * Keep [start, last] out of every allocation from now on, also after later updates of the
 * ranges (groups joining), until fini: for IOVAs the caller maps itself, such as the
 * iommu_map_pa window. Returns 0; -EINVAL; -EBUSY when a live allocation overlaps the range;
 * -E2BIG when the exclusions, or the ranges carved by them, exceed UPCIE_VFIO_IOVA_RANGES_MAX.
 */
static inline int upcie_vfio_iova_space_exclude(struct upcie_vfio_iova_space *s, uint64_t start,
						uint64_t last)
{
	struct upcie_vfio_iova_ranges na, ne;
	bool added = false;
	uint32_t i = 0;
	int err = 0;

	if (!s || !s->ready || start > last)
		return UPCIE_FAIL(-EINVAL,
				  "iova: bad exclusion [0x%" PRIx64 ", 0x%" PRIx64 "] or space "
				  "not initialised",
				  start, last);
	pthread_mutex_lock(&s->lock);
	for (size_t k = 0; k < s->nused; k++) {
		if (s->used[k].start <= last && s->used[k].last >= start) {
			pthread_mutex_unlock(&s->lock);
			return UPCIE_FAIL(-EBUSY,
					  "iova: cannot exclude [0x%" PRIx64 ", 0x%" PRIx64
					  "]: allocation [0x%" PRIx64 ", 0x%" PRIx64 "] is in it",
					  start, last, s->used[k].start, s->used[k].last);
		}
	}
	/* the exclusion list stays sorted, with touching ranges merged */
	memset(&ne, 0, sizeof(ne));
	while (!err && (i < s->excl.n || !added)) {
		struct upcie_vfio_iova_range r;
		struct upcie_vfio_iova_range *prev = ne.n ? &ne.r[ne.n - 1] : NULL;

		if (!added && (i == s->excl.n || start < s->excl.r[i].start)) {
			r.start = start;
			r.last = last;
			added = true;
		} else {
			r = s->excl.r[i++];
		}
		if (prev && (prev->last == UINT64_MAX || r.start <= prev->last + 1)) {
			if (r.last > prev->last)
				prev->last = r.last;
		} else {
			err = upcie_vfio_iova_ranges_add(&ne, r.start, r.last);
		}
	}
	na = s->avail;
	for (uint32_t k = 0; k < ne.n && !err; k++)
		err = upcie_vfio_iova_ranges_exclude(&na, ne.r[k].start, ne.r[k].last);
	if (!err) {
		s->excl = ne;
		s->avail = na;
	}
	pthread_mutex_unlock(&s->lock);
	return err;
}

/* First aligned fit of `size` bytes in [lo, hi] that avoids every allocation; false if none. */
static inline bool upcie_vfio_iova_fit_(const struct upcie_vfio_iova_space *s, uint64_t lo,
					uint64_t hi, uint64_t size, uint64_t align, uint64_t *out)
{
	uint64_t cand, last;
	size_t i = 0;

	if (lo > UINT64_MAX - (align - 1))
		return false;
	cand = upcie_align_up(lo, align);
	while (true) {
		if (cand < lo || upcie_add_overflow(cand, size - 1, &last) || last > hi)
			return false;
		/* allocations are sorted and disjoint: skip those entirely below cand */
		while (i < s->nused && s->used[i].last < cand)
			i++;
		if (i == s->nused || s->used[i].start > last) {
			*out = cand;
			return true;
		}
		if (s->used[i].last > UINT64_MAX - align)
			return false;
		cand = upcie_align_up(s->used[i].last + 1, align);
	}
}

static inline int upcie_vfio_iova_insert_(struct upcie_vfio_iova_space *s, uint64_t start,
					  uint64_t last)
{
	size_t pos = 0;

	if (s->nused == s->cap) {
		size_t ncap = s->cap ? s->cap * 2 : 16;
		struct upcie_vfio_iova_used *nu =
		    (struct upcie_vfio_iova_used *)realloc(s->used, ncap * sizeof(*nu));

		if (!nu)
			return -ENOMEM;
		s->used = nu;
		s->cap = ncap;
	}
	while (pos < s->nused && s->used[pos].start < start)
		pos++;
	memmove(&s->used[pos + 1], &s->used[pos], (s->nused - pos) * sizeof(*s->used));
	s->used[pos].start = start;
	s->used[pos].last = last;
	s->used[pos].pgsize = s->pgsize;
	s->nused++;
	return 0;
}

/*
 * Reserve `size` bytes of IOVA (rounded up to the page size) aligned to `align` (a power of two;
 * 0: the size's natural alignment up to 1 GiB, so the IOMMU can use large pages; never below the
 * page size). Returns 0 with *iova set; -EINVAL for bad arguments; -ENOSPC when no allowed range
 * has room; -ENOMEM.
 */
static inline int upcie_vfio_iova_alloc(struct upcie_vfio_iova_space *s, uint64_t size,
					uint64_t align, uint64_t *iova)
{
	uint64_t sz, a, found = 0;
	bool ok = false;
	int err;

	if (!s || !s->ready || !iova)
		return UPCIE_FAIL(-EINVAL, "iova: alloc from an uninitialised space");
	if (!size || size > UINT64_MAX - s->pgsize)
		return UPCIE_FAIL(-EINVAL, "iova: bad size 0x%" PRIx64, size);
	if (align && !upcie_is_pow2(align))
		return UPCIE_FAIL(-EINVAL, "iova: alignment 0x%" PRIx64 " is not a power of two",
				  align);
	sz = upcie_align_up(size, s->pgsize);
	a = align;
	if (!a) {
		a = UINT64_C(1) << upcie_log2(sz);
		if (a > UPCIE_VFIO_IOVA_MAX_NATURAL_ALIGN)
			a = UPCIE_VFIO_IOVA_MAX_NATURAL_ALIGN;
	}
	if (a < s->pgsize)
		a = s->pgsize;

	pthread_mutex_lock(&s->lock);
	/* pass 0: at or above 4 GiB; pass 1: anywhere allowed */
	for (int pass = 0; pass < 2 && !ok; pass++) {
		for (uint32_t i = 0; i < s->avail.n && !ok; i++) {
			uint64_t lo = s->avail.r[i].start, hi = s->avail.r[i].last;

			if (pass == 0) {
				if (hi < UPCIE_VFIO_IOVA_HIGH_START)
					continue;
				if (lo < UPCIE_VFIO_IOVA_HIGH_START)
					lo = UPCIE_VFIO_IOVA_HIGH_START;
			}
			ok = upcie_vfio_iova_fit_(s, lo, hi, sz, a, &found);
		}
	}
	if (!ok) {
		pthread_mutex_unlock(&s->lock);
		return UPCIE_FAIL(-ENOSPC,
				  "iova: no room for 0x%" PRIx64 " bytes aligned to 0x%" PRIx64
				  " in the domain's IOVA ranges (%zu allocations)",
				  sz, a, s->nused);
	}
	err = upcie_vfio_iova_insert_(s, found, found + sz - 1);
	pthread_mutex_unlock(&s->lock);
	if (err)
		return UPCIE_FAIL(err, "iova: out of memory for allocator bookkeeping");
	*iova = found;
	return 0;
}

/*
 * Mark [iova, iova + size) as taken, at that address (a range the device decodes itself, such as
 * a BAR it must reach by its bus address, where no memory may be mapped). The range need not be
 * inside the allowed ranges; release it with upcie_vfio_iova_free() and the same size. Returns
 * 0; -EINVAL for a bad range; -EBUSY when it overlaps an allocation; -ENOMEM.
 */
static inline int upcie_vfio_iova_reserve_at(struct upcie_vfio_iova_space *s, uint64_t iova,
					     uint64_t size)
{
	uint64_t last;
	int err;

	if (!s || !s->ready || !size || size > UINT64_MAX - s->pgsize ||
	    upcie_add_overflow(iova, upcie_align_up(size, s->pgsize) - 1, &last) ||
	    (iova & (s->pgsize - 1)))
		return UPCIE_FAIL(-EINVAL, "iova: bad fixed range 0x%" PRIx64 " + 0x%" PRIx64, iova,
				  size);
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < s->nused; i++) {
		if (s->used[i].start <= last && s->used[i].last >= iova) {
			pthread_mutex_unlock(&s->lock);
			return UPCIE_FAIL(-EBUSY,
					  "iova: [0x%" PRIx64 ", 0x%" PRIx64 "] is already in use",
					  iova, last);
		}
	}
	err = upcie_vfio_iova_insert_(s, iova, last);
	pthread_mutex_unlock(&s->lock);
	return err ? UPCIE_FAIL(err, "iova: out of memory for allocator bookkeeping") : 0;
}

/*
 * Return an allocation made by upcie_vfio_iova_alloc() (or a range of
 * upcie_vfio_iova_reserve_at()) with the same size (or that size rounded up). The size is
 * rounded with the page size the allocation was made with, not the current one. -ENOENT when
 * [iova, +size) is not exactly one allocation.
 */
static inline int upcie_vfio_iova_free(struct upcie_vfio_iova_space *s, uint64_t iova,
				       uint64_t size)
{
	if (!s || !s->ready || !size || size > UINT64_MAX - s->pgsize)
		return UPCIE_FAIL(-EINVAL, "iova: bad free of 0x%" PRIx64, iova);
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < s->nused; i++) {
		if (s->used[i].start == iova &&
		    upcie_align_up(size, s->used[i].pgsize) - 1 == s->used[i].last - iova) {
			memmove(&s->used[i], &s->used[i + 1],
				(s->nused - i - 1) * sizeof(*s->used));
			s->nused--;
			pthread_mutex_unlock(&s->lock);
			return 0;
		}
	}
	pthread_mutex_unlock(&s->lock);
	return UPCIE_FAIL(
	    -ENOENT, "iova: [0x%" PRIx64 ", +0x%" PRIx64 ") is not an allocation of this space",
	    iova, size);
}

#endif /* UPCIE_VFIO_IOVA_H */
