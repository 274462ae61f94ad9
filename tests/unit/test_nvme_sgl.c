/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * nvme/sgl.h against an independent reference: random segment lists over shuffled LUTs
 * (granules 4 KiB..2 MiB), identity LUTs (long coalesced runs) and arithmetic memory; the SGL is
 * decoded as a controller walks it (tests/unit/nvme_model.h) and compared descriptor by
 * descriptor with a plain byte-run walk that merges device-contiguous runs. Plus chaining at
 * exact page boundaries, the 32-bit length limit, dword rules and every error case.
 */
#include <upcie/nvme/sgl.h>

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nvme_model.h"

#define FAKE_VADDR ((void *)(uintptr_t)0x100000000000ull)
#define MAX_DESC   (1u << 16)
#define DESC_MAX   UINT64_C(0xfffff000)

static uint64_t ref_iova(const struct upcie_dmamem *m, uint64_t off)
{
	if (m->lut) {
		uint64_t g = UINT64_C(1) << m->granule_shift;

		return m->lut[off / g] + off % g;
	}
	return m->iova + off;
}

/* Expected descriptors: runs that stop at granule ends, merged when device-contiguous. */
static size_t ref_descs(const struct upcie_nvme_dseg *segs, unsigned n, uint64_t *addr,
			uint64_t *len)
{
	size_t k = 0;

	for (unsigned i = 0; i < n; i++) {
		const struct upcie_dmamem *m = segs[i].mem;
		uint64_t g = m->lut ? UINT64_C(1) << m->granule_shift : UINT64_MAX;

		for (uint64_t b = 0; b < segs[i].len;) {
			uint64_t off = segs[i].off + b, a = ref_iova(m, off);
			uint64_t run = m->lut ? g - off % g : segs[i].len - b;

			if (run > segs[i].len - b)
				run = segs[i].len - b;
			b += run;
			while (run) {
				uint64_t take;

				if (k && addr[k - 1] + len[k - 1] == a && len[k - 1] < DESC_MAX) {
					take = DESC_MAX - len[k - 1] < run ? DESC_MAX - len[k - 1]
									   : run;
					len[k - 1] += take;
				} else {
					take = run < DESC_MAX ? run : DESC_MAX;
					addr[k] = a;
					len[k++] = take;
				}
				a += take;
				run -= take;
			}
		}
	}
	return k;
}

struct decoded {
	uint64_t addr[MAX_DESC], len[MAX_DESC];
	size_t n;
};

static int decode_emit(void *ctx, uint64_t iova, uint64_t len)
{
	struct decoded *d = (struct decoded *)ctx;

	if (d->n == MAX_DESC)
		return 0x7ff;
	d->addr[d->n] = iova;
	d->len[d->n++] = len;
	return 0;
}

static struct decoded dec;
static uint64_t exp_addr[MAX_DESC], exp_len[MAX_DESC];

struct env {
	struct nvme_model_rng rng;
	struct upcie_dmamem data[2];
	struct upcie_dmamem lmem;
	void *lbuf;
	size_t lsize;
	struct nvme_model_iomap im;
};

static void env_init(struct env *e, unsigned gshift, int kind, uint64_t seed)
{
	size_t dsize = (size_t)64 << 20;

	memset(e, 0, sizeof(*e));
	e->rng.s = seed;
	for (int i = 0; i < 2; i++) {
		if (kind == 2)
			upcie_dmamem_init_arith(&e->data[i], FAKE_VADDR, dsize,
						(UINT64_C(0x40000000) << i) + 3 * i);
		else
			nvme_model_mem_lut(&e->data[i], FAKE_VADDR, dsize, gshift,
					   UINT64_C(0x7f0000000000) + (UINT64_C(1) << 36) * i,
					   kind == 0, &e->rng);
		nvme_model_iomap_add(&e->im, &e->data[i]);
	}
	e->lsize = (size_t)1024 << 12;
	e->lbuf = aligned_alloc(4096, e->lsize);
	memset(e->lbuf, 0xa5, e->lsize);
	nvme_model_mem_lut(&e->lmem, e->lbuf, e->lsize, 12, UINT64_C(0x3000000000), true, &e->rng);
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

static uint32_t ref_list_pages(size_t ndesc, unsigned shift)
{
	uint64_t per = (UINT64_C(1) << shift) / 16, k = 0;

	if (ndesc <= 1)
		return 0;
	while (k * (per - 1) + 1 < ndesc)
		k++;
	return (uint32_t)(k ? k : 1);
}

static bool verify(struct env *e, const struct upcie_nvme_sqe *sqe,
		   const struct upcie_nvme_dseg *segs, unsigned n, size_t *ndesc)
{
	uint64_t total = 0;
	size_t k;
	int st;

	for (unsigned i = 0; i < n; i++)
		total += segs[i].len;
	dec.n = 0;
	if (upcie_nvme_sqe_psdt(sqe) != UPCIE_NVME_PSDT_SGL)
		return false;
	st =
	    nvme_model_sgl_walk(&e->im, upcie_nvme_sqe_sgl1_addr(sqe), upcie_nvme_sqe_sgl1_len(sqe),
				upcie_nvme_sqe_sgl1_id(sqe), total, decode_emit, &dec);
	if (st) {
		printf("# SGL walk status 0x%x\n", st);
		return false;
	}
	k = ref_descs(segs, n, exp_addr, exp_len);
	*ndesc = k;
	if (k != dec.n) {
		printf("# %zu descriptors, want %zu\n", dec.n, k);
		return false;
	}
	for (size_t i = 0; i < k; i++) {
		if (exp_addr[i] != dec.addr[i] || exp_len[i] != dec.len[i]) {
			printf("# desc %zu: 0x%llx+%llu want 0x%llx+%llu\n", i,
			       (unsigned long long)dec.addr[i], (unsigned long long)dec.len[i],
			       (unsigned long long)exp_addr[i], (unsigned long long)exp_len[i]);
			return false;
		}
	}
	return true;
}

static void test_random(unsigned iters)
{
	static const unsigned gshifts[] = { 12, 13, 16, 21 };
	unsigned fail = 0, runs = 0, errs = 0, chained = 0;

	for (unsigned cfgi = 0; cfgi < 10; cfgi++) {
		struct env e;
		int kind = cfgi < 6 ? 0 : cfgi < 8 ? 1 : 2; /* shuffled, identity, arithmetic */
		unsigned gshift = gshifts[cfgi % 4];

		env_init(&e, gshift, kind, 0xabcdefull + cfgi * 104729);
		for (unsigned it = 0; it < iters; it++) {
			struct upcie_nvme_dptr_cfg cfg = { UINT64_MAX, 12, false };
			struct upcie_nvme_lists lists = { &e.lmem, 0, 0 };
			struct upcie_nvme_dseg segs[8];
			struct upcie_nvme_sqe sqe, before;
			unsigned n = (unsigned)nvme_model_rng_range(&e.rng, 1, 8);
			uint64_t total = 0,
				 maxlen = nvme_model_rng_range(&e.rng, 0, 7) ? 65536 : 4 << 20;
			size_t want_desc, got_desc = 0;
			uint32_t need;
			int ret, want = 0;
			bool dword = nvme_model_rng_range(&e.rng, 0, 3) == 0;

			for (unsigned i = 0; i < n; i++) {
				segs[i].mem = &e.data[nvme_model_rng_next(&e.rng) & 1];
				segs[i].len = nvme_model_rng_range(&e.rng, 1, maxlen);
				segs[i].off = nvme_model_rng_range(&e.rng, 0, (32 << 20));
				if (nvme_model_rng_range(&e.rng, 0, 3) == 0 && i) {
					/* continue where the previous one ended: must merge */
					segs[i].mem = segs[i - 1].mem;
					segs[i].off = segs[i - 1].off + segs[i - 1].len;
				}
				if (dword) {
					segs[i].off &= ~UINT64_C(3);
					segs[i].len = (segs[i].len + 3) & ~UINT64_C(3);
					if (segs[i].mem->iova & 3) /* arithmetic base +3 */
						segs[i].off += 4 - (segs[i].mem->iova & 3);
				}
				total += segs[i].len;
			}
			cfg.sgl_dword = dword;
			want_desc = ref_descs(segs, n, exp_addr, exp_len);
			need = ref_list_pages(want_desc, 12);
			lists.npages = need;
			switch (nvme_model_rng_range(&e.rng, 0, 15)) {
			case 0:
				cfg.max_bytes = total - 1;
				want = total > 1 ? -EINVAL : 0;
				if (!want)
					cfg.max_bytes = UINT64_MAX;
				break;
			case 1:
				if (need) {
					lists.npages = need - 1;
					want = -ENOSPC;
				}
				break;
			case 2:
				segs[n - 1].len = 0;
				want = -EINVAL;
				break;
			case 3:
				segs[0].off = segs[0].mem->size - 1;
				segs[0].len = 2;
				want = -EINVAL;
				break;
			case 4:
				if (dword) {
					segs[n - 1].len += 1;
					want = -EINVAL;
				}
				break;
			default:
				break;
			}
			memset(&before, 0x5a, sizeof(before));
			sqe = before;
			ret = n == 1 && (nvme_model_rng_next(&e.rng) & 1)
				  ? upcie_nvme_sgl_build_buf(&sqe, segs[0].mem, segs[0].off,
							     segs[0].len, &cfg, &lists)
				  : upcie_nvme_sgl_build(&sqe, segs, n, &cfg, &lists);
			runs++;
			if (want) {
				if (ret != want || memcmp(&sqe, &before, sizeof(sqe))) {
					printf("# it %u cfg %u: ret %d want %d\n", it, cfgi, ret,
					       want);
					fail++;
				}
				errs++;
				continue;
			}
			if (ret != (int)need || !verify(&e, &sqe, segs, n, &got_desc)) {
				printf("# it %u cfg %u: ret %d need %u n %u\n", it, cfgi, ret, need,
				       n);
				fail++;
			}
			chained += need > 1;
			if (sqe.cdw10 != before.cdw10 || sqe.mptr != before.mptr)
				fail++;
		}
		env_fini(&e);
	}
	CHECK_EQ(fail, 0, "%u random SGL transfers match the reference (%u error cases)", runs,
		 errs);
	CHECK(chained > 0, "chained segments exercised (%u)", chained);
}

/* Exact descriptor counts: a LUT with a gap after every granule never merges. */
static void test_chaining(void)
{
	static const size_t counts[] = { 1,   2,   3,	255, 256, 257, 258, 510,
					 511, 512, 513, 766, 767, 768, 2000 };
	struct env e;
	struct upcie_dmamem gappy;
	size_t ng = 4096;
	uint64_t *lut = (uint64_t *)malloc(ng * sizeof(*lut));

	env_init(&e, 12, 0, 3);
	for (size_t i = 0; i < ng; i++)
		lut[i] = UINT64_C(0x5000000000) + (uint64_t)i * 2 * 4096;
	upcie_dmamem_init_lut(&gappy, FAKE_VADDR, ng * 4096, 12, lut, true);
	nvme_model_iomap_add(&e.im, &gappy);
	for (size_t i = 0; i < UPCIE_ARRAY_SIZE(counts); i++) {
		struct upcie_nvme_dptr_cfg cfg = { UINT64_MAX, 12, false };
		struct upcie_nvme_lists lists = { &e.lmem, 0, 0 };
		struct upcie_nvme_sqe sqe;
		struct upcie_nvme_dseg seg = { &gappy, 100, counts[i] * 4096 - 200 };
		uint32_t need = ref_list_pages(counts[i], 12);
		size_t nd = 0;
		int ret;

		if (counts[i] == 1)
			seg.len = 1000;
		lists.npages = need;
		memset(&sqe, 0, sizeof(sqe));
		ret = upcie_nvme_sgl_build(&sqe, &seg, 1, &cfg, &lists);
		CHECK(ret == (int)need && verify(&e, &sqe, &seg, 1, &nd) && nd == counts[i],
		      "%zu descriptors: %d list pages (want %u), SGL1 type %u", counts[i], ret,
		      need, upcie_nvme_sqe_sgl1_id(&sqe) >> 4);
		if (counts[i] == 1)
			CHECK_EQ(upcie_nvme_sqe_sgl1_id(&sqe) >> 4, UPCIE_NVME_SGL_DATA_BLOCK,
				 "one descriptor sits in the command");
		else if (counts[i] <= 256)
			CHECK_EQ(upcie_nvme_sqe_sgl1_id(&sqe) >> 4, UPCIE_NVME_SGL_LAST_SEGMENT,
				 "one page: Last Segment in the command");
		else
			CHECK_EQ(upcie_nvme_sqe_sgl1_id(&sqe) >> 4, UPCIE_NVME_SGL_SEGMENT,
				 "chain: Segment in the command");
		if (need) {
			lists.npages = need - 1;
			CHECK_EQ(upcie_nvme_sgl_build(&sqe, &seg, 1, &cfg, &lists), -ENOSPC,
				 "one page short: -ENOSPC");
		}
	}
	upcie_dmamem_destroy(&gappy);
	env_fini(&e);
}

static void test_limits(void)
{
	struct env e;
	struct upcie_dmamem huge;
	struct upcie_nvme_dptr_cfg cfg = { UINT64_MAX, 12, false };
	struct upcie_nvme_lists lists;
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_dseg seg;
	size_t nd = 0;

	env_init(&e, 12, 0, 11);
	lists.mem = &e.lmem;
	lists.off = 0;
	lists.npages = 4;
	/* 9 GiB contiguous: three descriptors of at most 0xfffff000 bytes. */
	upcie_dmamem_init_arith(&huge, FAKE_VADDR, (size_t)10 << 30, UINT64_C(0x10000000000));
	nvme_model_iomap_add(&e.im, &huge);
	seg.mem = &huge;
	seg.off = 4096;
	seg.len = (uint64_t)9 << 30;
	CHECK_EQ(upcie_nvme_sgl_build_buf(&sqe, &huge, seg.off, seg.len, &cfg, &lists), 1,
		 "9 GiB: one list page");
	CHECK(verify(&e, &sqe, &seg, 1, &nd) && nd == 3, "9 GiB: 3 descriptors (%zu)", nd);
	CHECK_EQ(upcie_nvme_sgl_build_buf(&sqe, &huge, 3, 1 << 20, &cfg, NULL), 0,
		 "contiguous buffer: no list needed");
	CHECK(upcie_nvme_sqe_sgl1_addr(&sqe) == UINT64_C(0x10000000003) &&
		  upcie_nvme_sqe_sgl1_len(&sqe) == (1 << 20),
	      "byte-aligned data block in SGL1");
	cfg.sgl_dword = true;
	CHECK_EQ(upcie_nvme_sgl_build_buf(&sqe, &huge, 3, 1 << 20, &cfg, NULL), -EINVAL,
		 "dword rule: unaligned address refused");
	CHECK_EQ(upcie_nvme_sgl_build_buf(&sqe, &huge, 4, 1022, &cfg, NULL), -EINVAL,
		 "dword rule: length not a dword multiple");
	CHECK_EQ(upcie_nvme_sgl_build_buf(&sqe, &huge, 4, 1024, &cfg, NULL), 0, "dword aligned ok");
	cfg.sgl_dword = false;
	CHECK_EQ(upcie_nvme_sgl_build_buf(&sqe, &e.data[0], 0, 16384, &cfg, NULL), -ENOSPC,
		 "shuffled granules need a list");
	CHECK_EQ(upcie_nvme_sgl_build(&sqe, NULL, 1, &cfg, &lists), -EINVAL, "no segments");
	CHECK_EQ(upcie_nvme_sgl_build(&sqe, &seg, 1, NULL, &lists), -EINVAL, "no config");
	cfg.max_bytes = 4096;
	CHECK_EQ(upcie_nvme_sgl_build_buf(&sqe, &huge, 0, 4097, &cfg, NULL), -EINVAL, "above MDTS");
	upcie_dmamem_destroy(&huge);
	env_fini(&e);
}

int main(int argc, char **argv)
{
	unsigned iters = argc > 1 ? (unsigned)atoi(argv[1]) : 1000;

	upcie_log_set_level(UPCIE_LOG_NONE);
	test_random(iters);
	test_chaining();
	test_limits();
	return check_done();
}
