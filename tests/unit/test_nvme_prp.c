/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * nvme/prp.h against an independent reference: for thousands of random transfers (sizes, first
 * offsets, segment lists, LUT granules 4 KiB..2 MiB with shuffled LUTs, arithmetic memory with
 * unaligned base addresses, page sizes 4..64 KiB) the command is decoded the way a controller
 * walks it (tests/unit/nvme_model.h) and compared page by page with the device addresses a
 * plain division-based walk expects. Plus list chaining at exact boundaries, the split helper,
 * and every error case (with the command left untouched).
 */
#include <upcie/nvme/prp.h>

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nvme_model.h"

#define FAKE_VADDR ((void *)(uintptr_t)0x100000000000ull) /* data is never dereferenced */
#define MAX_ENT	   (1u << 16)

/* Device address of byte `off`, computed the slow, obvious way. */
static uint64_t ref_iova(const struct upcie_dmamem *m, uint64_t off)
{
	if (m->lut) {
		uint64_t g = UINT64_C(1) << m->granule_shift;

		return m->lut[off / g] + off % g;
	}
	return m->iova + off;
}

/* Expected PRP entries: the device address of the first byte and of every byte of the transfer
 * that starts a device page. */
static size_t ref_entries(const struct upcie_nvme_dseg *segs, unsigned n, uint64_t page,
			  uint64_t *out)
{
	size_t k = 0;

	for (unsigned i = 0; i < n; i++) {
		for (uint64_t b = 0; b < segs[i].len;) {
			uint64_t a = ref_iova(segs[i].mem, segs[i].off + b);
			uint64_t to_boundary = page - a % page;

			if (k == 0 || a % page == 0)
				out[k++] = a;
			b += to_boundary; /* next byte that can start a page */
		}
	}
	return k;
}

struct decoded {
	uint64_t iova[MAX_ENT];
	uint64_t len[MAX_ENT];
	size_t n;
	uint64_t bytes;
};

static int decode_emit(void *ctx, uint64_t iova, uint64_t len)
{
	struct decoded *d = (struct decoded *)ctx;

	if (d->n == MAX_ENT)
		return 0x7ff;
	d->iova[d->n] = iova;
	d->len[d->n++] = len;
	d->bytes += len;
	return 0;
}

static struct decoded dec;
static uint64_t expect[MAX_ENT];

struct env {
	struct nvme_model_rng rng;
	struct upcie_dmamem data[2];
	struct upcie_dmamem lmem;
	void *lbuf;
	size_t lsize;
	struct nvme_model_iomap im;
};

static void env_init(struct env *e, unsigned gshift, bool arith, uint64_t seed, bool list_lut)
{
	size_t dsize = (size_t)64 << 20;

	memset(e, 0, sizeof(*e));
	e->rng.s = seed;
	for (int i = 0; i < 2; i++) {
		if (arith) {
			/* dword-aligned, deliberately not page-aligned base for one of them */
			uint64_t base = (UINT64_C(0x40000000) << i) + (i ? 0x804 : 0);

			upcie_dmamem_init_arith(&e->data[i], FAKE_VADDR, dsize, base);
		} else {
			nvme_model_mem_lut(&e->data[i], FAKE_VADDR, dsize, gshift,
					   UINT64_C(0x7f0000000000) + (UINT64_C(1) << 36) * i, true,
					   &e->rng);
		}
		nvme_model_iomap_add(&e->im, &e->data[i]);
	}
	e->lsize = (size_t)64 << 16; /* 64 pages of up to 64 KiB */
	e->lbuf = aligned_alloc(1 << 16, e->lsize);
	memset(e->lbuf, 0xa5, e->lsize);
	if (list_lut)
		nvme_model_mem_lut(&e->lmem, e->lbuf, e->lsize, 16, UINT64_C(0x3000000000), true,
				   &e->rng);
	else
		upcie_dmamem_init_arith(&e->lmem, e->lbuf, e->lsize, UINT64_C(0x2000000000));
	nvme_model_iomap_add(&e->im, &e->lmem);
}

static void env_fini(struct env *e)
{
	upcie_dmamem_destroy(&e->data[0]);
	upcie_dmamem_destroy(&e->data[1]);
	upcie_dmamem_destroy(&e->lmem);
	free(e->lbuf);
	nvme_model_iomap_fini(&e->im);
}

/* An offset in `m` whose device address is aligned to `align` (page or dword). */
static uint64_t pick_off(struct env *e, const struct upcie_dmamem *m, uint64_t align,
			 uint64_t max_off)
{
	uint64_t off = nvme_model_rng_range(&e->rng, 0, max_off);
	uint64_t a = ref_iova(m, off);

	return off + (align - a % align) % align;
}

/* Decode `sqe` like a controller and compare with the reference. Returns true on a match. */
static bool verify(struct env *e, const struct upcie_nvme_sqe *sqe,
		   const struct upcie_nvme_dseg *segs, unsigned n, unsigned shift)
{
	uint64_t total = 0;
	size_t k;
	int st;

	for (unsigned i = 0; i < n; i++)
		total += segs[i].len;
	memset(&dec, 0, sizeof(dec.n) + sizeof(dec.bytes));
	dec.n = 0;
	dec.bytes = 0;
	st = nvme_model_prp_walk(&e->im, sqe->prp1, sqe->prp2, total, shift, decode_emit, &dec);
	if (st) {
		printf("# walk status 0x%x\n", st);
		return false;
	}
	k = ref_entries(segs, n, UINT64_C(1) << shift, expect);
	if (k != dec.n || dec.bytes != total) {
		printf("# entries %zu want %zu, bytes %llu want %llu\n", dec.n, k,
		       (unsigned long long)dec.bytes, (unsigned long long)total);
		return false;
	}
	for (size_t i = 0; i < k; i++) {
		if (expect[i] != dec.iova[i]) {
			printf("# entry %zu: 0x%llx want 0x%llx\n", i,
			       (unsigned long long)dec.iova[i], (unsigned long long)expect[i]);
			return false;
		}
	}
	return upcie_nvme_sqe_psdt(sqe) == UPCIE_NVME_PSDT_PRP;
}

static uint32_t ref_list_pages(uint64_t nprp, unsigned shift)
{
	uint64_t per = (UINT64_C(1) << shift) / 8, m = nprp - 1, k = 0;

	if (m <= 1)
		return 0;
	while (k * (per - 1) + 1 < m)
		k++;
	return (uint32_t)(k ? k : 1);
}

static void test_random(unsigned iters)
{
	static const unsigned gshifts[] = { 12, 13, 16, 21 };
	unsigned fail = 0, runs = 0, errs_ok = 0;

	for (unsigned cfgi = 0; cfgi < 10; cfgi++) {
		struct env e;
		bool arith = cfgi >= 8;
		unsigned gshift = gshifts[cfgi % 4];

		env_init(&e, gshift, arith, 0x1234567ull + cfgi * 7919, cfgi & 1);
		for (unsigned it = 0; it < iters; it++) {
			struct upcie_nvme_dptr_cfg cfg;
			struct upcie_nvme_lists lists;
			struct upcie_nvme_dseg segs[6];
			struct upcie_nvme_sqe sqe, before;
			unsigned shift, n;
			uint64_t page, total = 0;
			uint32_t need;
			int ret, want = 0;
			bool big = nvme_model_rng_range(&e.rng, 0, 9) == 0;

			shift = (unsigned)nvme_model_rng_range(&e.rng, 12, arith ? 16 : gshift);
			if (shift > 16)
				shift = 16;
			page = UINT64_C(1) << shift;
			n = (unsigned)nvme_model_rng_range(&e.rng, 1, 6);
			for (unsigned i = 0; i < n; i++) {
				const struct upcie_dmamem *m =
				    &e.data[nvme_model_rng_next(&e.rng) & 1];
				uint64_t maxpages = big ? 512 : 4;

				segs[i].mem = m;
				if (i == 0) {
					segs[i].off = pick_off(&e, m, 4, m->size / 2);
					segs[i].len =
					    n == 1
						? nvme_model_rng_range(&e.rng, 1, maxpages * page)
						: page - ref_iova(m, segs[i].off) % page +
						      page *
							  nvme_model_rng_range(&e.rng, 0, maxpages);
				} else {
					segs[i].off = pick_off(&e, m, page, m->size / 2);
					segs[i].len =
					    i + 1 == n
						? nvme_model_rng_range(&e.rng, 1, maxpages * page)
						: page * nvme_model_rng_range(&e.rng, 1, maxpages);
				}
				total += segs[i].len;
			}
			memset(&cfg, 0, sizeof(cfg));
			cfg.page_shift = shift;
			cfg.max_bytes = UINT64_MAX;
			need = ref_list_pages(ref_entries(segs, n, page, expect), shift);
			lists.mem = &e.lmem;
			lists.off = 0;
			lists.npages = (uint32_t)(e.lsize >> shift);
			/* Error injection, one kind at a time. */
			switch (nvme_model_rng_range(&e.rng, 0, 23)) {
			case 0:
				cfg.max_bytes = total - 1;
				want = total > 1 ? -EINVAL : 0;
				if (!want)
					cfg.max_bytes = total;
				break;
			case 1:
				if (need) {
					lists.npages = need - 1;
					want = -ENOSPC;
				}
				break;
			case 2:
				if (n > 1) {
					segs[n - 1].off +=
					    4; /* last segment no longer page aligned */
					want = -EINVAL;
				}
				break;
			case 3:
				segs[0].off |= 1; /* not dword aligned */
				want = -EINVAL;
				break;
			case 4:
				segs[nvme_model_rng_range(&e.rng, 0, n - 1)].len = 0;
				want = -EINVAL;
				break;
			case 5:
				segs[n - 1].off = segs[n - 1].mem->size - 4;
				segs[n - 1].len = 8;
				want = -EINVAL;
				break;
			case 6:
				if (n > 1) {
					segs[0].len -= 4; /* first segment ends unaligned */
					want = -EINVAL;
				}
				break;
			case 7:
				cfg.max_bytes = total;
				break;
			default:
				lists.npages = need; /* exactly enough */
				break;
			}
			memset(&before, 0x5a, sizeof(before));
			sqe = before;
			ret = n == 1 && nvme_model_rng_next(&e.rng) % 2
				  ? upcie_nvme_prp_build_buf(&sqe, segs[0].mem, segs[0].off,
							     segs[0].len, &cfg, &lists)
				  : upcie_nvme_prp_build(&sqe, segs, n, &cfg, &lists);
			runs++;
			if (want) {
				if (ret != want || memcmp(&sqe, &before, sizeof(sqe))) {
					printf("# it %u cfg %u: ret %d want %d\n", it, cfgi, ret,
					       want);
					fail++;
				} else {
					errs_ok++;
				}
				continue;
			}
			if (ret != (int)need || !verify(&e, &sqe, segs, n, shift)) {
				printf("# it %u cfg %u: ret %d need %u shift %u n %u total %llu\n",
				       it, cfgi, ret, need, shift, n, (unsigned long long)total);
				fail++;
			}
			/* Command bytes outside the data pointer untouched. */
			if (sqe.cdw10 != before.cdw10 || sqe.nsid != before.nsid || sqe.opc != 0x5a)
				fail++;
		}
		env_fini(&e);
	}
	CHECK_EQ(fail, 0, "%u random PRP transfers match the reference (%u error cases)", runs,
		 errs_ok);
	CHECK(errs_ok > runs / 20, "error cases were exercised (%u)", errs_ok);
}

static void test_chaining(void)
{
	static const uint64_t ms[] = { 1,    2,	   3,	 510,  511,  512,  513,	 514,  1021,
				       1022, 1023, 1024, 1025, 1533, 1534, 1535, 1536, 4000 };
	struct env e;

	env_init(&e, 21, false, 99, true);
	for (unsigned s = 12; s <= 13; s++) {
		uint64_t page = UINT64_C(1) << s;

		for (size_t i = 0; i < UPCIE_ARRAY_SIZE(ms); i++) {
			for (int unaligned = 0; unaligned < 2; unaligned++) {
				struct upcie_nvme_dptr_cfg cfg = { UINT64_MAX, s, false };
				struct upcie_nvme_lists lists = { &e.lmem, 0, 0 };
				struct upcie_nvme_dseg seg;
				struct upcie_nvme_sqe sqe;
				uint32_t need;
				int ret;

				memset(&sqe, 0, sizeof(sqe));
				seg.mem = &e.data[0];
				seg.off = (UINT64_C(1) << 21) + (unaligned ? 512 : 0);
				/* m + 1 entries: m + 1 whole pages, or the same count unaligned */
				seg.len = (ms[i] + 1) * page - (unaligned ? 1024 : 0);
				need = ref_list_pages(ms[i] + 1, s);
				lists.npages = need;
				ret = upcie_nvme_prp_build_buf(&sqe, seg.mem, seg.off, seg.len,
							       &cfg, &lists);
				CHECK(
				    ret == (int)need && verify(&e, &sqe, &seg, 1, s),
				    "page %llu, %llu entries after PRP1%s: %d list pages (want %u)",
				    (unsigned long long)page, (unsigned long long)ms[i],
				    unaligned ? ", unaligned" : "", ret, need);
				if (need) {
					lists.npages = need - 1;
					CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, seg.mem, seg.off,
									  seg.len, &cfg, &lists),
						 -ENOSPC, "one list page short: -ENOSPC");
				}
			}
		}
	}
	CHECK_EQ(upcie_nvme_prp_lists_needed(513, 12), 1, "513 entries: 1 list page");
	CHECK_EQ(upcie_nvme_prp_lists_needed(514, 12), 2, "514 entries: 2 list pages");
	CHECK_EQ(upcie_nvme_prp_lists_needed(2, 12), 0, "2 entries: no list");
	env_fini(&e);
}

static void test_errors(void)
{
	struct env e;
	struct upcie_nvme_dptr_cfg cfg = { UINT64_MAX, 12, false };
	struct upcie_nvme_lists lists;
	struct upcie_nvme_sqe sqe;
	struct upcie_dmamem small_lut, nocpu;
	struct upcie_nvme_dseg seg = { NULL, 0, 0 };
	uint64_t lut[4] = { 0x10000, 0x20000, 0x30000, 0x40000 };

	env_init(&e, 12, false, 5, false);
	memset(&sqe, 0, sizeof(sqe));
	lists.mem = &e.lmem;
	lists.off = 0;
	lists.npages = 8;
	CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, NULL, 0, 4096, &cfg, &lists), -EINVAL, "no memory");
	CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, &e.data[0], 0, 4096, NULL, &lists), -EINVAL,
		 "no config");
	cfg.page_shift = 11;
	CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, &e.data[0], 0, 4096, &cfg, &lists), -EINVAL,
		 "page shift 11");
	cfg.page_shift = 28;
	CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, &e.data[0], 0, 4096, &cfg, &lists), -EINVAL,
		 "page shift 28");
	cfg.page_shift = 12;
	cfg.max_bytes = 0;
	CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, &e.data[0], 0, 4096, &cfg, &lists), -EINVAL,
		 "max_bytes 0");
	cfg.max_bytes = UINT64_MAX;
	CHECK_EQ(upcie_nvme_prp_build(&sqe, NULL, 1, &cfg, &lists), -EINVAL, "no segments");
	CHECK_EQ(upcie_nvme_prp_build(NULL, &seg, 0, &cfg, &lists), -EINVAL, "zero segments");
	/* LUT granule (4 KiB) below the page size (8 KiB). */
	upcie_dmamem_init_lut(&small_lut, FAKE_VADDR, 4 * 4096, 12, lut, false);
	cfg.page_shift = 13;
	CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, &small_lut, 0, 512, &cfg, &lists), -EINVAL,
		 "granule below page size");
	cfg.page_shift = 12;
	CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, &small_lut, 0, 8192, &cfg, &lists), 0,
		 "two 4 KiB granules, two entries");
	CHECK(sqe.prp1 == 0x10000 && sqe.prp2 == 0x20000, "PRP1/PRP2 from two granules");
	/* List memory without CPU view, unaligned list pages, list outside its memory. */
	upcie_dmamem_init_arith(&nocpu, NULL, 1 << 20, 0x1000);
	lists.mem = &nocpu;
	CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, &e.data[0], 0, 3 * 4096, &cfg, &lists), -EINVAL,
		 "list memory without CPU view");
	lists.mem = &e.lmem;
	lists.off = 8;
	CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, &e.data[0], 0, 3 * 4096, &cfg, &lists), -EINVAL,
		 "list page not page aligned");
	lists.off = e.lsize - 4096;
	lists.npages = 2;
	CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, &e.data[0], 0, 600 * 4096, &cfg, &lists), -EINVAL,
		 "list pages beyond the list memory");
	lists.off = 0;
	CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, &e.data[0], 0, 3 * 4096, &cfg, NULL), -ENOSPC,
		 "no list given, 3 pages");
	CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, &e.data[0], 0, 2 * 4096, &cfg, NULL), 0,
		 "no list needed for 2 pages");
	cfg.max_bytes = 8192;
	CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, &e.data[0], 0, 8193, &cfg, NULL), -EINVAL,
		 "above MDTS");
	CHECK_EQ(upcie_nvme_prp_build_buf(&sqe, &e.data[0], 0, 8192, &cfg, NULL), 0,
		 "exactly MDTS");
	upcie_dmamem_destroy(&nocpu);
	upcie_dmamem_destroy(&small_lut);
	env_fini(&e);
}

/* upcie_nvme_prp_mem_build() against upcie_nvme_prp_build_buf(): same results and errors. */
static void test_prp_mem_random(unsigned iters)
{
	static const unsigned gshifts[] = { 12, 13, 16, 21 };
	unsigned fail = 0, runs = 0, errs = 0, fast = 0, lists_used = 0;

	for (unsigned cfgi = 0; cfgi < 10; cfgi++) {
		struct env e;
		bool arith = cfgi >= 8;
		unsigned gshift = gshifts[cfgi % 4];

		env_init(&e, gshift, arith, 0xabcdefull + cfgi * 31, cfgi & 1);
		for (unsigned it = 0; it < iters; it++) {
			const struct upcie_dmamem *m = &e.data[it & 1];
			struct upcie_nvme_dptr_cfg cfg;
			struct upcie_nvme_prp_mem pm;
			struct upcie_nvme_lists lists;
			struct upcie_nvme_dseg seg;
			struct upcie_nvme_sqe a, b, before;
			unsigned shift;
			uint64_t page, off, len;
			int ra, rb;

			shift = (unsigned)nvme_model_rng_range(&e.rng, 12, arith ? 16 : gshift);
			if (shift > 16)
				shift = 16;
			page = UINT64_C(1) << shift;
			memset(&cfg, 0, sizeof(cfg));
			cfg.page_shift = shift;
			cfg.max_bytes = nvme_model_rng_range(&e.rng, 0, 3)
					    ? UINT64_MAX
					    : page * nvme_model_rng_range(&e.rng, 1, 3);
			off = pick_off(&e, m, nvme_model_rng_range(&e.rng, 0, 1) ? page : 4,
				       m->size - 8 * page);
			len = nvme_model_rng_range(&e.rng, 1, 4 * page);
			switch (nvme_model_rng_range(&e.rng, 0, 15)) {
			case 0:
				len = 0;
				break;
			case 1:
				off |= 1; /* not dword aligned */
				break;
			case 2:
				off = m->size - nvme_model_rng_range(&e.rng, 0, 3);
				break;
			case 3:
				off = m->size - len + nvme_model_rng_range(&e.rng, 1, 3);
				break;
			case 4:
				/* dword aligned, so only the range check can refuse it */
				off = (UINT64_MAX - nvme_model_rng_range(&e.rng, 0, 3 * page)) &
				      ~3ull;
				break;
			case 5:
				len = UINT64_MAX - nvme_model_rng_range(&e.rng, 0, 3);
				break;
			default:
				break;
			}
			lists.mem = &e.lmem;
			lists.off = 0;
			lists.npages = (uint32_t)nvme_model_rng_range(&e.rng, 0, 2);
			if (upcie_nvme_prp_mem_init(&pm, m, &cfg) != 0) {
				fail++;
				continue;
			}
			memset(&before, 0x5a, sizeof(before));
			a = before;
			b = before;
			ra = upcie_nvme_prp_build_buf(&a, m, off, len, &cfg, &lists);
			rb = upcie_nvme_prp_mem_build(&b, &pm, off, len, &lists);
			runs++;
			if (ra != rb) {
				printf("# it %u cfg %u: off %llu len %llu: ret %d, build_buf %d\n",
				       it, cfgi, (unsigned long long)off, (unsigned long long)len,
				       rb, ra);
				fail++;
				continue;
			}
			if (rb < 0) {
				errs++;
				fail += memcmp(&b, &before, sizeof(b)) != 0;
				continue;
			}
			lists_used += rb > 0;
			fast += rb == 0;
			seg.mem = m;
			seg.off = off;
			seg.len = len;
			/* Same pointers; flags stored whole (PSDT PRP, FUSE 0); nothing else touched. */
			if (a.prp1 != b.prp1 || a.prp2 != b.prp2 || b.flags != 0 ||
			    !verify(&e, &b, &seg, 1, shift) || b.opc != 0x5a || b.cid != 0x5a5a ||
			    b.nsid != before.nsid || b.mptr != before.mptr ||
			    b.cdw10 != before.cdw10 || b.cdw15 != before.cdw15) {
				printf("# it %u cfg %u: command differs\n", it, cfgi);
				fail++;
			}
		}
		env_fini(&e);
	}
	CHECK_EQ(fail, 0, "%u transfers: prp_mem_build matches prp_build_buf (%u errors)", runs,
		 errs);
	CHECK(errs > runs / 10 && fast > runs / 10 && lists_used > 0,
	      "errors (%u), one/two-page (%u) and list (%u) transfers exercised", errs, fast,
	      lists_used);
}

static void test_prp_mem_errors(void)
{
	struct env e;
	struct upcie_nvme_dptr_cfg cfg = { 16384, 12, false };
	struct upcie_nvme_prp_mem pm;
	struct upcie_nvme_sqe sqe, before;
	struct upcie_dmamem small_lut, arith;
	uint64_t lut[4] = { 0x10000, 0x20000, 0x30000, 0x40000 };
	const struct upcie_dmamem *m;

	env_init(&e, 12, false, 11, false);
	m = &e.data[0];
	memset(&before, 0x5a, sizeof(before));
#define BUILD_FAILS(pmp, off, len, want, what)                                                     \
	do {                                                                                       \
		sqe = before;                                                                      \
		CHECK_EQ(upcie_nvme_prp_mem_build(&sqe, (pmp), (off), (len), NULL), (want), what); \
		CHECK(!memcmp(&sqe, &before, sizeof(sqe)), what ": command untouched");            \
	} while (0)

	CHECK_EQ(upcie_nvme_prp_mem_init(NULL, m, &cfg), -EINVAL, "init: no binding");
	CHECK_EQ(upcie_nvme_prp_mem_init(&pm, m, NULL), -EINVAL, "init: no config");
	BUILD_FAILS(&pm, 0, 4096, -EINVAL, "after init without config");
	cfg.page_shift = 11;
	CHECK_EQ(upcie_nvme_prp_mem_init(&pm, m, &cfg), -EINVAL, "init: page shift 11");
	BUILD_FAILS(&pm, 0, 4096, -EINVAL, "after init with page shift 11");
	cfg.page_shift = 28;
	CHECK_EQ(upcie_nvme_prp_mem_init(&pm, m, &cfg), -EINVAL, "init: page shift 28");
	cfg.page_shift = 12;
	cfg.max_bytes = 0;
	CHECK_EQ(upcie_nvme_prp_mem_init(&pm, m, &cfg), -EINVAL, "init: max_bytes 0");
	BUILD_FAILS(&pm, 0, 4096, -EINVAL, "after init with max_bytes 0");
	cfg.max_bytes = 16384;
	CHECK_EQ(upcie_nvme_prp_mem_init(&pm, NULL, &cfg), -EINVAL, "init: no memory");
	BUILD_FAILS(&pm, 0, 4096, -EINVAL, "after init without memory");
	upcie_dmamem_init_lut(&small_lut, FAKE_VADDR, 4 * 4096, 12, lut, false);
	cfg.page_shift = 13;
	CHECK_EQ(upcie_nvme_prp_mem_init(&pm, &small_lut, &cfg), -EINVAL,
		 "init: granule below page size");
	BUILD_FAILS(&pm, 0, 512, -EINVAL, "after init with granule below page size");
	cfg.page_shift = 12;
	BUILD_FAILS(NULL, 0, 4096, -EINVAL, "no binding");

	CHECK_EQ(upcie_nvme_prp_mem_init(&pm, m, &cfg), 0, "init");
	BUILD_FAILS(&pm, 0, 0, -EINVAL, "empty");
	BUILD_FAILS(&pm, 0, 16385, -EINVAL, "above max_bytes");
	BUILD_FAILS(&pm, 2, 4096, -EINVAL, "not dword aligned");
	BUILD_FAILS(&pm, m->size, 4, -EINVAL, "offset at the end");
	BUILD_FAILS(&pm, m->size - 4, 8, -EINVAL, "running past the end");
	BUILD_FAILS(&pm, UINT64_MAX - 3, 4, -EINVAL, "offset + length wraps to 0");
	BUILD_FAILS(&pm, UINT64_MAX - 4095, 8192, -EINVAL, "offset + length wraps past 0");
	BUILD_FAILS(&pm, UINT64_MAX, 1, -EINVAL, "offset UINT64_MAX");
	BUILD_FAILS(&pm, 0, 3 * 4096, -ENOSPC, "three pages, no list");
	sqe = before;
	sqe.flags = 0xff;
	CHECK_EQ(upcie_nvme_prp_mem_build(&sqe, &pm, 16384, 16384, NULL), -ENOSPC,
		 "exactly max_bytes passes the checks (needs a list)");
	CHECK_EQ(upcie_nvme_prp_mem_build(&sqe, &pm, m->size - 4096, 4096, NULL), 0, "last page");
	CHECK(sqe.flags == 0 && sqe.prp1 == ref_iova(m, m->size - 4096) && sqe.prp2 == 0,
	      "PRP1 translated, PRP2 0, flags byte stored whole (PSDT PRP, FUSE 0)");
	CHECK(sqe.opc == 0x5a && sqe.cid == 0x5a5a && sqe.cdw10 == before.cdw10,
	      "rest of the command untouched");
	CHECK_EQ(upcie_nvme_prp_mem_build(&sqe, &pm, 4096 + 2048, 4096, NULL), 0, "two pages");
	CHECK(sqe.prp1 == ref_iova(m, 4096 + 2048) && sqe.prp2 == ref_iova(m, 8192),
	      "PRP2: the second page");

	/* Arithmetic memory at an unaligned base: lut = &iova, shift 63. */
	upcie_dmamem_init_arith(&arith, FAKE_VADDR, (size_t)1 << 30, UINT64_C(0x123400000804));
	CHECK_EQ(upcie_nvme_prp_mem_init(&pm, &arith, &cfg), 0, "init, arithmetic memory");
	CHECK(pm.gshift == 63 && pm.lut == &arith.iova, "one 2^63-byte granule at mem->iova");
	CHECK_EQ(upcie_nvme_prp_mem_build(&sqe, &pm, (1 << 30) - 8192, 4096, NULL), 0,
		 "crossing a page");
	CHECK(sqe.prp1 == UINT64_C(0x123400000804) + (1 << 30) - 8192 &&
		  sqe.prp2 == ((sqe.prp1 + 4096) & ~UINT64_C(4095)),
	      "PRP1 = iova + off, PRP2 the next page boundary");
	BUILD_FAILS(&pm, (1 << 30) - 4096, 4096 + 4, -EINVAL, "past the end of arithmetic memory");
	upcie_dmamem_destroy(&arith);
	/* Beyond 2^63 bytes the one-granule trick does not hold: general path, still right. */
	upcie_dmamem_init_arith(&arith, NULL, ((size_t)1 << 63) + (1 << 20), 0x1000);
	CHECK_EQ(upcie_nvme_prp_mem_init(&pm, &arith, &cfg), 0, "init, memory above 2^63 bytes");
	CHECK_EQ(pm.lim, 0, "no fast path there");
	CHECK_EQ(upcie_nvme_prp_mem_build(&sqe, &pm, (UINT64_C(1) << 63) + 4096, 4096, NULL), 0,
		 "build at offset 2^63 + 4096");
	CHECK(sqe.prp1 == 0x1000 + (UINT64_C(1) << 63) + 4096 && sqe.prp2 == 0,
	      "PRP1 = iova + off above 2^63");
#undef BUILD_FAILS
	upcie_dmamem_destroy(&arith);
	upcie_dmamem_destroy(&small_lut);
	env_fini(&e);
}

static void test_split(void)
{
	struct env e;
	struct upcie_nvme_dseg segs[3], piece[3];
	struct upcie_nvme_split sp;
	struct upcie_nvme_dptr_cfg cfg = { 128 * 1024, 12, false };
	struct upcie_nvme_lists lists;
	uint64_t off, len, expect_off = 0, covered = 0;
	int n, cmds = 0, bad = 0;

	env_init(&e, 12, false, 77, false);
	lists.mem = &e.lmem;
	lists.off = 0;
	lists.npages = 4;
	segs[0].mem = &e.data[0];
	segs[0].off = 512; /* starts unaligned, ends on a page */
	segs[0].len = 3 * 4096 - 512;
	segs[1].mem = &e.data[1];
	segs[1].off = 40 * 4096;
	segs[1].len = 100 * 4096;
	segs[2].mem = &e.data[0];
	segs[2].off = 1000 * 4096;
	segs[2].len = 50 * 4096 + 1024;
	CHECK_EQ(upcie_nvme_split_init(&sp, segs, 3, cfg.max_bytes, 512), 0, "split init");
	while ((n = upcie_nvme_split_next(&sp, piece, 3, &off, &len)) > 0) {
		struct upcie_nvme_sqe sqe;
		uint64_t sum = 0;

		for (int i = 0; i < n; i++)
			sum += piece[i].len;
		if (off != expect_off || sum != len || len > cfg.max_bytes || len % 512)
			bad++;
		if (upcie_nvme_prp_build(&sqe, piece, (unsigned)n, &cfg, &lists) < 0 ||
		    !verify(&e, &sqe, piece, (unsigned)n, 12))
			bad++;
		expect_off += len;
		covered += len;
		cmds++;
	}
	CHECK(n == 0 && bad == 0, "split pieces are valid PRP transfers (%d commands)", cmds);
	CHECK_EQ(covered, segs[0].len + segs[1].len + segs[2].len, "split covers the request");
	CHECK_EQ(cmds, 5, "ceil(%llu / 128 KiB) = 5 commands",
		 (unsigned long long)(segs[0].len + segs[1].len + segs[2].len));
	CHECK_EQ(upcie_nvme_split_init(&sp, segs, 3, 256, 512), -EINVAL, "max below one block");
	segs[2].len += 1;
	CHECK_EQ(upcie_nvme_split_init(&sp, segs, 3, 1 << 20, 512), -EINVAL, "not whole blocks");
	segs[2].len -= 1;
	/* 65536-block cap: 512-byte blocks, no MDTS: 32 MiB per command. */
	CHECK_EQ(upcie_nvme_split_init(&sp, segs, 3, UINT64_MAX, 512), 0, "split init, no MDTS");
	CHECK_EQ(sp.chunk, 65536 * 512, "at most 65536 blocks per command");
	CHECK_EQ(upcie_nvme_split_init(&sp, segs, 3, 4096, 512), 0, "split init 4 KiB");
	CHECK_EQ(upcie_nvme_split_next(&sp, piece, 0, &off, &len), -ENOSPC, "no room for pieces");
	env_fini(&e);
}

int main(int argc, char **argv)
{
	unsigned iters = argc > 1 ? (unsigned)atoi(argv[1]) : 1000;

	upcie_log_set_level(UPCIE_LOG_NONE); /* error cases are expected here */
	test_random(iters);
	test_chaining();
	test_errors();
	test_prp_mem_random(iters);
	test_prp_mem_errors();
	test_split();
	return check_done();
}
