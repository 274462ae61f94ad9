/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests for vfio/iova.h: range-list checks and carving, and the IOVA allocator against range
 * lists with gaps, the MSI hole, the low MiB, alignment, exhaustion (-ENOSPC), free/reuse,
 * updates of the ranges while allocations are live (also ones that raise the page size), and
 * exclusions that survive those updates. No kernel involved.
 */
#include <upcie/kmod/iommu_map_pa.h>
#include <upcie/vfio/iova.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define KiB(x) ((uint64_t)(x) << 10)
#define MiB(x) ((uint64_t)(x) << 20)
#define GiB(x) ((uint64_t)(x) << 30)

static struct upcie_vfio_iova_ranges mk(uint64_t align, int n, const uint64_t *pairs)
{
	struct upcie_vfio_iova_ranges r;

	memset(&r, 0, sizeof(r));
	r.align = align;
	for (int i = 0; i < n; i++) {
		r.r[i].start = pairs[2 * i];
		r.r[i].last = pairs[2 * i + 1];
	}
	r.n = (uint32_t)n;
	return r;
}

static int overlaps_msi(uint64_t iova, uint64_t size)
{
	return iova <= UPCIE_VFIO_IOVA_MSI_LAST && iova + size - 1 >= UPCIE_VFIO_IOVA_MSI_START;
}

static void test_ranges(void)
{
	const uint64_t good[] = { 0, 0xfedfffff, 0xfef00000, 0x7fffffffffULL };
	const uint64_t rev[] = { 0x2000, 0x1000 };
	const uint64_t ovl[] = { 0, 0x2000, 0x2000, 0x3000 };
	const uint64_t uns[] = { 0x5000, 0x6000, 0x1000, 0x2000 };
	struct upcie_vfio_iova_ranges r;

	r = mk(4096, 2, good);
	CHECK_EQ(upcie_vfio_iova_ranges_check(&r), 0, "the 7.2 guest's ranges are valid");
	r = mk(4096, 1, rev);
	CHECK_EQ(upcie_vfio_iova_ranges_check(&r), -EINVAL, "reversed range -> -EINVAL");
	r = mk(4096, 2, ovl);
	CHECK_EQ(upcie_vfio_iova_ranges_check(&r), -EINVAL, "overlapping ranges -> -EINVAL");
	r = mk(4096, 2, uns);
	CHECK_EQ(upcie_vfio_iova_ranges_check(&r), -EINVAL, "unsorted ranges -> -EINVAL");
	r = mk(3000, 2, good);
	CHECK_EQ(upcie_vfio_iova_ranges_check(&r), -EINVAL,
		 "non-power-of-two alignment -> -EINVAL");
	r = mk(4096, 0, good);
	r.n = UPCIE_VFIO_IOVA_RANGES_MAX + 1;
	CHECK_EQ(upcie_vfio_iova_ranges_check(&r), -EINVAL, "too many ranges -> -EINVAL");
	CHECK_EQ(upcie_vfio_iova_ranges_check(NULL), -EINVAL, "NULL list -> -EINVAL");

	/* exclusion: middle split, edge trims, whole removal */
	r = mk(4096, 1, (const uint64_t[]){ 0, GiB(8) - 1 });
	CHECK_EQ(
	    upcie_vfio_iova_ranges_exclude(&r, UPCIE_VFIO_IOVA_MSI_START, UPCIE_VFIO_IOVA_MSI_LAST),
	    0, "exclude the MSI window from [0, 8 GiB)");
	CHECK(r.n == 2 && r.r[0].last == UPCIE_VFIO_IOVA_MSI_START - 1 &&
		  r.r[1].start == UPCIE_VFIO_IOVA_MSI_LAST + 1 && r.r[1].last == GiB(8) - 1,
	      "split into [0, 0x%llx] and [0x%llx, 0x%llx]", (unsigned long long)r.r[0].last,
	      (unsigned long long)r.r[1].start, (unsigned long long)r.r[1].last);
	CHECK_EQ(upcie_vfio_iova_ranges_exclude(&r, 0, MiB(1) - 1), 0, "exclude the low MiB");
	CHECK(r.n == 2 && r.r[0].start == MiB(1), "first range now starts at 1 MiB");
	CHECK_EQ(upcie_vfio_iova_ranges_exclude(&r, 0, UINT64_MAX), 0, "exclude everything");
	CHECK_EQ(r.n, 0, "nothing left");
	CHECK_EQ(upcie_vfio_iova_ranges_exclude(&r, 5, 4), -EINVAL,
		 "reversed exclusion -> -EINVAL");

	/* append: order enforced, capacity enforced */
	memset(&r, 0, sizeof(r));
	CHECK_EQ(upcie_vfio_iova_ranges_add(&r, 0x1000, 0x1fff), 0, "append a range");
	CHECK_EQ(upcie_vfio_iova_ranges_add(&r, 0x1000, 0x2fff), -EINVAL,
		 "append out of order -> -EINVAL");
	for (uint32_t i = 1; i < UPCIE_VFIO_IOVA_RANGES_MAX; i++)
		upcie_vfio_iova_ranges_add(&r, 0x1000 + i * 0x2000, 0x1fff + i * 0x2000);
	CHECK_EQ(r.n, UPCIE_VFIO_IOVA_RANGES_MAX, "list filled to the maximum");
	CHECK_EQ(upcie_vfio_iova_ranges_add(&r, GiB(1), GiB(2)), -E2BIG, "one more -> -E2BIG");
	CHECK_EQ(upcie_vfio_iova_ranges_exclude(&r, 0x1800, 0x1800), -E2BIG,
		 "a split of a full list -> -E2BIG");
}

static void test_alloc_basic(void)
{
	/* what the 7.2 guest with intel-iommu reports */
	const uint64_t k72[] = { 0, 0xfedfffff, 0xfef00000, 0x7fffffffffULL };
	struct upcie_vfio_iova_ranges r = mk(4096, 2, k72);
	struct upcie_vfio_iova_space s;
	uint64_t a = 0, b = 0, c = 0, d = 0;

	CHECK_EQ(upcie_vfio_iova_space_init(&s, &r), 0, "init over the 7.2 guest's ranges");
	CHECK_EQ(s.pgsize, 4096, "page size from the alignment");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, MiB(2), 0, &a), 0, "alloc 2 MiB");
	CHECK(a >= GiB(4), "first allocation is high (0x%llx >= 4 GiB)", (unsigned long long)a);
	CHECK(a % MiB(2) == 0, "2 MiB naturally aligned (0x%llx)", (unsigned long long)a);
	CHECK_EQ(upcie_vfio_iova_alloc(&s, 4096, 0, &b), 0, "alloc 4 KiB");
	CHECK(b >= a + MiB(2) || b + 4096 <= a, "no overlap with the first");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, 100, 0, &c), 0, "alloc 100 bytes (rounded to a page)");
	CHECK(c % 4096 == 0 && (c >= b + 4096 || c + 4096 <= b), "page aligned, disjoint");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, GiB(3), 0, &d), 0, "alloc 3 GiB");
	CHECK(d % GiB(1) == 0, "large allocation aligned to 1 GiB at most (0x%llx)",
	      (unsigned long long)d);
	CHECK_EQ(upcie_vfio_iova_free(&s, b, 4096), 0, "free the 4 KiB");
	CHECK_EQ(upcie_vfio_iova_free(&s, b, 4096), -ENOENT, "double free -> -ENOENT");
	CHECK_EQ(upcie_vfio_iova_free(&s, a, MiB(1)), -ENOENT,
		 "free with the wrong size -> -ENOENT");
	CHECK_EQ(upcie_vfio_iova_free(&s, a + 4096, MiB(2)), -ENOENT,
		 "free of an interior address -> -ENOENT");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, 4096, 0, &b), 0, "alloc 4 KiB again");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, 8192, KiB(64), &b), 0, "alloc aligned to 64 KiB");
	CHECK(b % KiB(64) == 0, "64 KiB alignment honoured (0x%llx)", (unsigned long long)b);
	CHECK_EQ(upcie_vfio_iova_alloc(&s, 8192, 3000, &b), -EINVAL,
		 "non-power-of-two alignment -> -EINVAL");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, 0, 0, &b), -EINVAL, "zero size -> -EINVAL");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, UINT64_MAX, 0, &b), -EINVAL, "huge size -> -EINVAL");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, 4096, 0, NULL), -EINVAL, "NULL output -> -EINVAL");
	upcie_vfio_iova_space_fini(&s);
	CHECK(!s.ready && !s.used, "fini clears the space");
	upcie_vfio_iova_space_fini(&s);
	CHECK(1, "second fini is a no-op");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, 4096, 0, &b), -EINVAL, "alloc after fini -> -EINVAL");
	memset(&s, 0, sizeof(s));
	upcie_vfio_iova_space_fini(&s);
	CHECK(1, "fini of a zeroed space is a no-op");
	CHECK_EQ(upcie_vfio_iova_space_init(NULL, &r), -EINVAL, "init NULL space -> -EINVAL");
	CHECK_EQ(upcie_vfio_iova_space_init(&s, NULL), -EINVAL, "init NULL ranges -> -EINVAL");
}

static void test_alloc_low_and_msi(void)
{
	/* a 32-bit IOMMU aperture that (wrongly) reports the MSI window as usable */
	const uint64_t low[] = { 0, 0xffffffffULL };
	struct upcie_vfio_iova_ranges r = mk(4096, 1, low);
	struct upcie_vfio_iova_space s;
	uint64_t iova = 0;
	int err = 0, n = 0, bad_msi = 0, bad_low = 0;

	CHECK_EQ(upcie_vfio_iova_space_init(&s, &r), 0, "init over [0, 4 GiB)");
	while ((err = upcie_vfio_iova_alloc(&s, MiB(64), MiB(64), &iova)) == 0) {
		n++;
		bad_msi += overlaps_msi(iova, MiB(64));
		bad_low += iova < UPCIE_VFIO_IOVA_LOW_LIMIT;
	}
	CHECK_EQ(err, -ENOSPC, "exhaustion -> -ENOSPC");
	/* aligned 64 MiB blocks in [1 MiB, 0xfee00000): 64 MiB .. 62 * 64 MiB; none at 0 */
	CHECK_EQ(n, 62, "62 aligned 64 MiB blocks fit below the MSI window and above 1 MiB");
	CHECK_EQ(bad_msi, 0, "none overlaps the MSI window");
	CHECK_EQ(bad_low, 0, "none is in the low MiB");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, MiB(1), 0, &iova), 0, "1 MiB still fits");
	CHECK(!overlaps_msi(iova, MiB(1)) && iova >= MiB(1), "and avoids MSI and the low MiB");
	upcie_vfio_iova_space_fini(&s);

	/* the MSI hole with small pages: fill every page, none is in the window */
	r = mk(4096, 1, (const uint64_t[]){ 0xfe000000ULL, 0xffffffffULL });
	CHECK_EQ(upcie_vfio_iova_space_init(&s, &r), 0, "init over [0xfe000000, 4 GiB)");
	n = 0;
	bad_msi = 0;
	while (upcie_vfio_iova_alloc(&s, 4096, 0, &iova) == 0) {
		n++;
		bad_msi += overlaps_msi(iova, 4096);
	}
	CHECK_EQ(n, (int)((MiB(32) - MiB(1)) / 4096), "every page but the MSI window's handed out");
	CHECK_EQ(bad_msi, 0, "no page in the MSI window");
	upcie_vfio_iova_space_fini(&s);
}

static void test_alloc_gaps(void)
{
	/* small gaps; the second range is too small for 2 MiB aligned, the third fits */
	const uint64_t gaps[] = { MiB(1),	   MiB(3) - 1,	    GiB(4) + KiB(4),
				  GiB(4) + MiB(2), GiB(5) + MiB(1), GiB(5) + MiB(5) - 1 };
	struct upcie_vfio_iova_ranges r = mk(4096, 3, gaps);
	struct upcie_vfio_iova_space s;
	uint64_t a = 0, b = 0, c = 0;

	CHECK_EQ(upcie_vfio_iova_space_init(&s, &r), 0, "init over three gapped ranges");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, MiB(2), MiB(2), &a), 0, "2 MiB aligned alloc");
	CHECK_EQ(a, GiB(5) + MiB(2), "skips the high range without an aligned 2 MiB slot");
	/* [1 MiB, 3 MiB) has no aligned 2 MiB slot, nor has what is left of the third range */
	CHECK_EQ(upcie_vfio_iova_alloc(&s, MiB(2), MiB(2), &b), -ENOSPC,
		 "no second aligned 2 MiB slot anywhere -> -ENOSPC");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, MiB(2), 4096, &c), 0, "unaligned-ish 2 MiB fits low");
	CHECK_EQ(c, MiB(1), "at 1 MiB");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, KiB(8), 0, &c), 0, "8 KiB fits high");
	CHECK_EQ(c, GiB(4) + KiB(8), "in the small high range, 8 KiB aligned");
	upcie_vfio_iova_space_fini(&s);
}

static void test_update(void)
{
	const uint64_t wide[] = { 0, (1ULL << 39) - 1 };
	const uint64_t narrow[] = { 0, GiB(6) - 1 };
	const uint64_t tiny[] = { 0, GiB(4) - 1 };
	struct upcie_vfio_iova_ranges r = mk(4096, 1, wide);
	struct upcie_vfio_iova_space s;
	uint64_t a = 0, b = 0;

	CHECK_EQ(upcie_vfio_iova_space_init(&s, &r), 0, "init over 39 bits");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, GiB(1), 0, &a), 0, "alloc 1 GiB");
	CHECK_EQ(a, GiB(4), "at 4 GiB");
	r = mk(KiB(64), 1, narrow);
	CHECK_EQ(upcie_vfio_iova_space_update(&s, &r), 0, "narrow to 6 GiB keeps the allocation");
	CHECK_EQ(s.pgsize, KiB(64), "page size grows with the new alignment");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, 4096, 0, &b), 0, "alloc after the update");
	CHECK_EQ(b % KiB(64), 0, "aligned to the new page size");
	CHECK_EQ(upcie_vfio_iova_free(&s, b, 4096), 0, "free it with its original size");
	r = mk(4096, 1, tiny);
	CHECK_EQ(upcie_vfio_iova_space_update(&s, &r), -EBUSY,
		 "narrowing below a live allocation -> -EBUSY");
	CHECK_EQ(s.avail.r[s.avail.n - 1].last, GiB(6) - 1, "ranges unchanged after -EBUSY");
	upcie_vfio_iova_space_fini(&s);
	CHECK_EQ(upcie_vfio_iova_space_update(&s, &r), -EINVAL, "update after fini -> -EINVAL");
}

/* A group with a larger minimum IOMMU page joins: allocations made before keep their size. */
static void test_free_after_raise(void)
{
	const uint64_t wide[] = { 0, (1ULL << 39) - 1 };
	struct upcie_vfio_iova_ranges r = mk(4096, 1, wide);
	struct upcie_vfio_iova_space s;
	uint64_t a = 0, b = 0, c = 0;

	CHECK_EQ(upcie_vfio_iova_space_init(&s, &r), 0, "raise: init at 4 KiB pages");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, KiB(5), 0, &a), 0, "raise: 5 KiB (8 KiB rounded)");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, KiB(4), 0, &b), 0, "raise: 4 KiB");
	r = mk(MiB(2), 1, wide);
	CHECK_EQ(upcie_vfio_iova_space_update(&s, &r), 0, "raise: a group with 2 MiB pages joins");
	CHECK_EQ(s.pgsize, MiB(2), "raise: the space now rounds to 2 MiB");
	CHECK_EQ(upcie_vfio_iova_free(&s, b, KiB(4)), 0,
		 "raise: a 4 KiB allocation made before frees with its own size");
	CHECK_EQ(upcie_vfio_iova_free(&s, a, KiB(12)), -ENOENT,
		 "raise: a size that is not the allocation's is still refused");
	CHECK_EQ(upcie_vfio_iova_free(&s, a, KiB(5)), 0, "raise: the 5 KiB one too");
	CHECK_EQ(s.nused, 0, "raise: nothing leaked");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, KiB(4), 0, &c), 0, "raise: 4 KiB after the raise");
	CHECK_EQ(upcie_vfio_iova_free(&s, c, MiB(2)), 0, "raise: frees with the rounded size");
	upcie_vfio_iova_space_fini(&s);
}

/* The module's IOVA window stays out of the allocator when later groups refresh its ranges. */
static void test_exclusion_persists(void)
{
	const uint64_t wide[] = { 0, (1ULL << 39) - 1 };
	struct upcie_vfio_iova_ranges r = mk(4096, 1, wide);
	struct upcie_kmod_iova_window w;
	struct upcie_vfio_iova_space s;
	uint64_t iova = 0, wlast, n = 0, inside = 0;

	unsetenv("UPCIE_IOVA_BASE");
	unsetenv("UPCIE_IOVA_SIZE");
	CHECK_EQ(upcie_vfio_iova_space_init(&s, &r), 0, "excl: a container after its first group");
	CHECK_EQ(upcie_kmod_iova_window_init(&w, 4096), 0, "excl: the module's window");
	CHECK_EQ(upcie_kmod_iova_window_reserve(&w, &s), 0,
		 "excl: window kept out of the allocator");
	wlast = w.base + w.size - 1;
	/* what upcie_vfio_group_open() does when a second group joins the container */
	CHECK_EQ(upcie_vfio_iova_space_update(&s, &r), 0,
		 "excl: a second group refreshes the ranges");
	while (upcie_vfio_iova_alloc(&s, GiB(1), 0, &iova) == 0) {
		n++;
		inside += iova <= wlast && iova + GiB(1) - 1 >= w.base;
	}
	CHECK(n > 400, "excl: the space filled with %" PRIu64 " 1 GiB allocations", n);
	CHECK_EQ(inside, 0, "excl: none of them inside the window [0x%" PRIx64 ", 0x%" PRIx64 "]",
		 w.base, wlast);
	upcie_vfio_iova_space_fini(&s);

	/* the call itself: refused over a live allocation, kept across init-time updates */
	CHECK_EQ(upcie_vfio_iova_space_init(&s, &r), 0, "excl: fresh space");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, GiB(1), 0, &iova), 0, "excl: 1 GiB at 4 GiB");
	CHECK_EQ(upcie_vfio_iova_space_exclude(&s, GiB(4), GiB(5) - 1), -EBUSY,
		 "excl: over a live allocation -> -EBUSY");
	CHECK_EQ(upcie_vfio_iova_space_exclude(&s, GiB(8), GiB(16) - 1), 0, "excl: [8, 16) GiB");
	CHECK_EQ(upcie_vfio_iova_space_update(&s, &r), 0, "excl: update");
	CHECK_EQ(upcie_vfio_iova_alloc(&s, GiB(4), 0, &iova), 0, "excl: 4 GiB");
	CHECK(iova >= GiB(16), "excl: lands above the exclusion (0x%" PRIx64 ")", iova);
	CHECK_EQ(upcie_vfio_iova_space_exclude(&s, 0, GiB(1) - 1), 0,
		 "excl: a range the kernel never offered is fine too");
	upcie_vfio_iova_space_fini(&s);
	upcie_kmod_iova_window_fini(&w);
}

/* A space that was torn down and set up again is told apart from the one before. */
static void test_generation(void)
{
	const uint64_t wide[] = { 0, (1ULL << 39) - 1 };
	struct upcie_vfio_iova_ranges r = mk(4096, 1, wide);
	struct upcie_vfio_iova_space s;
	uint64_t g1, g2;

	CHECK_EQ(upcie_vfio_iova_space_init(&s, &r), 0, "gen: init");
	g1 = s.gen;
	CHECK_EQ(upcie_vfio_iova_space_update(&s, &r), 0, "gen: update");
	CHECK_EQ(s.gen, g1, "gen: an update keeps the generation");
	upcie_vfio_iova_space_fini(&s);
	CHECK_EQ(s.gen, 0, "gen: fini clears it");
	CHECK_EQ(upcie_vfio_iova_space_init(&s, &r), 0, "gen: init again");
	g2 = s.gen;
	CHECK(g1 && g2 && g1 != g2,
	      "gen: a new space, a new generation (%" PRIu64 " -> %" PRIu64 ")", g1, g2);
	upcie_vfio_iova_space_fini(&s);
}

static void test_many(void)
{
	const uint64_t k72[] = { 0, 0xfedfffff, 0xfef00000, 0x7fffffffffULL };
	struct upcie_vfio_iova_ranges r = mk(4096, 2, k72);
	struct upcie_vfio_iova_space s;
	uint64_t iova[300];
	int ok = 1;

	upcie_vfio_iova_space_init(&s, &r);
	for (int i = 0; i < 300; i++)
		ok &= upcie_vfio_iova_alloc(&s, (uint64_t)(i % 7 + 1) * 4096, 0, &iova[i]) == 0;
	CHECK(ok, "300 allocations of mixed sizes");
	for (int i = 0; i < 300 && ok; i++)
		for (int j = i + 1; j < 300; j++) {
			uint64_t li = iova[i] + (uint64_t)(i % 7 + 1) * 4096 - 1;
			uint64_t lj = iova[j] + (uint64_t)(j % 7 + 1) * 4096 - 1;

			if (iova[i] <= lj && iova[j] <= li)
				ok = 0;
		}
	CHECK(ok, "pairwise disjoint");
	for (int i = 0; i < 300; i += 2)
		ok &= upcie_vfio_iova_free(&s, iova[i], (uint64_t)(i % 7 + 1) * 4096) == 0;
	CHECK(ok, "every other one freed");
	CHECK_EQ(s.nused, 150, "150 left");
	upcie_vfio_iova_space_fini(&s);
}

int main(void)
{
	upcie_log_set_level(UPCIE_LOG_NONE);
	test_ranges();
	test_alloc_basic();
	test_alloc_low_and_msi();
	test_alloc_gaps();
	test_update();
	test_free_after_raise();
	test_exclusion_persists();
	test_generation();
	test_many();
	return check_done();
}
