/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The heap against a reference model: long random alloc/free sequences with fixed seeds over LUT
 * and arithmetic memory. Every allocation is checked for overlap with the live ones, alignment
 * (offset, device address, CPU address), the granule promise of arrays, and the device address;
 * every -ENOMEM is checked against an independent search for a free place, so the heap never
 * refuses what fits; counters are compared with the model, and at the end everything coalesces
 * into one free block of the whole size. Then error cases and a threaded run.
 */
#include <upcie/mem/heap.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static char last_msg[512];

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	snprintf(last_msg, sizeof(last_msg), "%s", msg);
}

/* posix_memalign: C11 aligned_alloc wants a size that is a multiple of the alignment. */
static void *alloc_aligned(size_t align, size_t size)
{
	void *p = NULL;

	return posix_memalign(&p, align, size) == 0 ? p : NULL;
}

static uint64_t rng_next(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * UINT64_C(0x2545F4914F6CDD1D);
}

static uint64_t rng_range(uint64_t *s, uint64_t lo, uint64_t hi)
{
	return lo + rng_next(s) % (hi - lo + 1);
}

struct live {
	uint64_t off, size, stride, count, elem;
	uint8_t tag;
};

struct model {
	struct live *v;
	size_t n;
	uint64_t size, gran; /* gran 0: arithmetic */
	uint64_t used;
};

static int cmp_live(const void *a, const void *b)
{
	const struct live *x = (const struct live *)a, *y = (const struct live *)b;

	return x->off < y->off ? -1 : x->off > y->off;
}

/* Is there an aligned start for len bytes in a gap, optionally inside one granule? Written
 * independently of the heap: walk the granules of the gap one by one. */
static int gap_fits(uint64_t lo, uint64_t hi, uint64_t len, uint64_t align, uint64_t gran)
{
	if (!gran) {
		uint64_t s = (lo + align - 1) / align * align;

		return s >= lo && s <= hi && hi - s >= len;
	}
	for (uint64_t g = lo / gran * gran; g < hi; g += gran) {
		uint64_t a = lo > g ? lo : g, b = hi < g + gran ? hi : g + gran;
		uint64_t s = (a + align - 1) / align * align;

		if (s <= b && b - s >= len)
			return 1;
	}
	return 0;
}

static int model_fits(struct model *m, uint64_t len, uint64_t align, uint64_t gran)
{
	uint64_t at = 0;

	qsort(m->v, m->n, sizeof(*m->v), cmp_live);
	for (size_t i = 0; i <= m->n; i++) {
		uint64_t end = i < m->n ? m->v[i].off : m->size;

		if (end > at && gap_fits(at, end, len, align, gran))
			return 1;
		if (i < m->n)
			at = m->v[i].off + m->v[i].size;
	}
	return 0;
}

static uint64_t pow2_ceil(uint64_t x)
{
	uint64_t p = 1;

	while (p < x)
		p <<= 1;
	return p;
}

struct cfg {
	const char *name;
	uint64_t size;
	unsigned shift; /* 0: arithmetic */
	uint64_t iova;	/* arithmetic base */
	int cpu;	/* give the dmamem a CPU view and check contents */
	uint64_t max_plain, max_elem, max_count, max_align;
	uint64_t seed;
	unsigned ops;
};

struct run_stats {
	unsigned allocs, arrays, enomem, frees, bad;
};

/* Failed checks are counted and reported once per category so a broken run stays readable. */
struct fails {
	unsigned overlap, align, granule, iova, stride, enomem, content, counters, validate, other;
};

static void fill(uint8_t *base, const struct live *l)
{
	if (base)
		memset(base + l->off, l->tag, l->size);
}

static int verify(const uint8_t *base, const struct live *l)
{
	if (!base)
		return 1;
	for (uint64_t i = 0; i < l->size; i++)
		if (base[l->off + i] != l->tag)
			return 0;
	return 1;
}

static void run_cfg(const struct cfg *c)
{
	struct upcie_dmamem mem;
	struct upcie_heap heap;
	struct upcie_heap_stats st = { 0 };
	struct model m = { 0 };
	struct fails f = { 0 };
	struct run_stats rs = { 0 };
	uint8_t *cpu = NULL;
	uint64_t seed = c->seed, gran = 0;
	int err;

	if (c->cpu) {
		cpu = (uint8_t *)alloc_aligned((size_t)1 << 21, c->size);
		memset(cpu, 0, c->size);
	}
	if (c->shift) {
		size_t n = (size_t)((c->size + (UINT64_C(1) << c->shift) - 1) >> c->shift);
		uint64_t *lut = (uint64_t *)malloc(n * sizeof(*lut));

		gran = UINT64_C(1) << c->shift;
		for (size_t i = 0; i < n; i++) /* scattered, reversed */
			lut[i] = UINT64_C(0x10000000000) + (uint64_t)(n - 1 - i) * 2 * gran;
		err = upcie_dmamem_init_lut(&mem, cpu, c->size, c->shift, lut, true);
	} else {
		err = upcie_dmamem_init_arith(&mem, cpu, c->size, c->iova);
	}
	CHECK_EQ(err, 0, "%s: dmamem", c->name);
	CHECK_EQ(upcie_heap_init(&heap, &mem), 0, "%s: heap init", c->name);
	m.v = (struct live *)calloc(c->ops + 1, sizeof(*m.v));
	m.size = c->size;
	m.gran = gran;

	for (unsigned op = 0; op < c->ops; op++) {
		uint64_t r = rng_range(&seed, 0, 99);

		if (r < 55) {
			struct upcie_heap_buf b;
			struct live l = { 0 };
			int is_array = rng_range(&seed, 0, 1);
			uint64_t align = UINT64_C(1)
					 << rng_range(&seed, 0, upcie_log2(c->max_align));
			uint64_t tight = 0, p2 = 0;

			if (is_array) {
				l.elem = rng_range(&seed, 1, c->max_elem);
				l.count = rng_range(&seed, 1, c->max_count);
				err = upcie_heap_alloc_array(&heap, l.count, l.elem, align, &b);
				tight = (l.elem + align - 1) / align * align;
				p2 = pow2_ceil(tight);
			} else {
				l.elem = rng_range(&seed, 1, c->max_plain);
				l.count = 1;
				err = upcie_heap_alloc(&heap, l.elem, align, &b);
			}
			if (err == -ENOMEM) {
				int fits;

				rs.enomem++;
				if (!is_array)
					fits = model_fits(&m, l.elem, align, 0);
				else if (!gran)
					fits = model_fits(&m, l.count * tight, align, 0);
				else
					fits = (tight != p2 && l.count * tight <= gran &&
						model_fits(&m, l.count * tight, align, gran)) ||
					       model_fits(&m, l.count * p2, p2, 0);
				if (fits && f.enomem++ == 0)
					CHECK(0,
					      "%s: op %u: -ENOMEM although %" PRIu64 " x %" PRIu64
					      " (align %" PRIu64 ") fits",
					      c->name, op, l.count, l.elem, align);
				continue;
			}
			if (err) {
				if (f.other++ == 0)
					CHECK(0, "%s: op %u: alloc returned %d", c->name, op, err);
				continue;
			}
			l.off = b.off;
			l.size = b.size;
			l.stride = b.stride;
			l.tag = (uint8_t)(op * 7 + 1);
			if (is_array)
				rs.arrays++;
			else
				rs.allocs++;

			if (b.off % align || b.iova % align || (cpu && (uintptr_t)b.vaddr % align))
				f.align++;
			if (b.size != b.count * b.stride || b.count != l.count ||
			    b.stride < l.elem || b.off + b.size > c->size ||
			    b.off + b.size < b.off || (is_array && b.stride % align) ||
			    (is_array && gran && b.stride != tight && b.stride != p2) ||
			    (is_array && !gran && b.stride != tight) ||
			    (!is_array && (b.size != l.elem || b.stride != l.elem)))
				f.stride++;
			if (b.iova != upcie_dmamem_iova_fast(&mem, b.off) ||
			    (cpu && b.vaddr != cpu + b.off) || (!cpu && b.vaddr))
				f.iova++;
			if (is_array && gran)
				for (uint64_t i = 0; i < l.count; i++) {
					uint64_t o = b.off + i * b.stride;

					if (o / gran != (o + l.elem - 1) / gran ||
					    upcie_dmamem_contig(&mem, o) < l.elem) {
						f.granule++;
						break;
					}
				}
			for (size_t i = 0; i < m.n; i++)
				if (l.off < m.v[i].off + m.v[i].size &&
				    m.v[i].off < l.off + l.size) {
					f.overlap++;
					break;
				}
			fill(cpu, &l);
			m.v[m.n++] = l;
			m.used += l.size;
		} else if (m.n) {
			size_t i = (size_t)rng_range(&seed, 0, m.n - 1);
			struct live l = m.v[i];

			if (!verify(cpu, &l))
				f.content++;
			/* Sometimes try a bad free first: interior offset, then the real one. */
			if (l.size > 1 && rng_range(&seed, 0, 9) == 0) {
				if (upcie_heap_free(&heap, l.off + 1) != -EINVAL)
					f.other++;
				rs.bad++;
			}
			if (upcie_heap_free(&heap, l.off) != 0)
				f.other++;
			m.v[i] = m.v[--m.n];
			m.used -= l.size;
			rs.frees++;
			/* And sometimes free it again: a double free changes nothing. */
			if (rng_range(&seed, 0, 9) == 0) {
				if (upcie_heap_free(&heap, l.off) != -EINVAL)
					f.other++;
				rs.bad++;
			}
		}
		if (op % 64 == 0) {
			upcie_heap_stats_get(&heap, &st);
			if (st.free_bytes != c->size - m.used || st.nalloc != m.n)
				f.counters++;
			if (upcie_heap_validate(&heap) != 0)
				f.validate++;
		}
	}
	CHECK(rs.allocs > c->ops / 10 && rs.arrays > c->ops / 10 && rs.frees > c->ops / 10,
	      "%s: exercised %u allocs, %u arrays, %u frees, %u -ENOMEM, %u bad frees", c->name,
	      rs.allocs, rs.arrays, rs.frees, rs.enomem, rs.bad);
	CHECK(rs.enomem > 0, "%s: the heap ran full at times (%u)", c->name, rs.enomem);
	CHECK_EQ(f.overlap, 0, "%s: no allocation overlaps a live one", c->name);
	CHECK_EQ(f.align, 0, "%s: offset, device and CPU addresses aligned", c->name);
	CHECK_EQ(f.granule, 0, "%s: no array element crosses a granule", c->name);
	CHECK_EQ(f.stride, 0, "%s: sizes and strides as promised", c->name);
	CHECK_EQ(f.iova, 0, "%s: device addresses and CPU pointers match the dmamem", c->name);
	CHECK_EQ(f.enomem, 0, "%s: -ENOMEM only when nothing fits (model)", c->name);
	CHECK_EQ(f.content, 0, "%s: allocation contents intact until freed", c->name);
	CHECK_EQ(f.counters, 0, "%s: counters match the model", c->name);
	CHECK_EQ(f.validate, 0, "%s: bookkeeping valid throughout", c->name);
	CHECK_EQ(f.other, 0, "%s: frees and bad frees answered as expected", c->name);

	/* Free what is left, in random order: everything must coalesce. */
	while (m.n) {
		size_t i = (size_t)rng_range(&seed, 0, m.n - 1);

		if (upcie_heap_free(&heap, m.v[i].off) != 0)
			f.other++;
		m.v[i] = m.v[--m.n];
	}
	CHECK_EQ(f.other, 0, "%s: final frees succeed", c->name);
	CHECK_EQ(upcie_heap_stats_get(&heap, &st), 0, "%s: stats", c->name);
	CHECK_EQ(st.nfree_blocks, 1, "%s: one free block at the end", c->name);
	CHECK_EQ(st.largest_free, c->size, "%s: the free block is the whole heap", c->name);
	CHECK_EQ(st.free_bytes, c->size, "%s: all bytes free", c->name);
	CHECK_EQ(st.nalloc, 0, "%s: no allocations", c->name);
	CHECK_EQ(upcie_heap_validate(&heap), 0, "%s: valid at the end", c->name);
	CHECK_EQ(heap.nblk, 1, "%s: one block of bookkeeping", c->name);

	upcie_heap_fini(&heap);
	upcie_dmamem_destroy(&mem);
	free(m.v);
	free(cpu);
}

static void test_model(void)
{
	static const struct cfg cfgs[] = {
		{ "lut4k", 256 * 1024, 12, 0, 0, 10000, 4096, 20, 4096, 1, 20000 },
		{ "lut4k-seed2", 256 * 1024, 12, 0, 0, 3000, 700, 40, 512, 2, 20000 },
		{ "lut64k-cpu", 4 << 20, 16, 0, 1, 200000, 65536, 24, 65536, 3, 12000 },
		{ "lut64k-small", 1 << 20, 16, 0, 1, 9000, 3000, 64, 256, 4, 20000 },
		{ "lut2m", 32 << 20, 21, 0, 0, 3 << 20, 1 << 20, 8, 1 << 21, 5, 8000 },
		{ "arith", (1 << 20) + 12345, 0, 0x10000000, 0, 40000, 5000, 16, 4096, 6, 20000 },
		{ "arith-cpu", 2 << 20, 0, 0x200000, 1, 100000, 9000, 16, 1 << 16, 7, 12000 },
	};

	for (size_t i = 0; i < UPCIE_ARRAY_SIZE(cfgs); i++)
		run_cfg(&cfgs[i]);
}

/* Worked examples of the array promise. */
static void test_array_promise(void)
{
	struct upcie_dmamem mem;
	struct upcie_heap heap;
	struct upcie_heap_buf b;
	uint64_t *lut = (uint64_t *)malloc(64 * sizeof(*lut));

	for (int i = 0; i < 64; i++)
		lut[i] = (uint64_t)i << 20;
	upcie_dmamem_init_lut(&mem, NULL, 64 << 16, 16, lut, true);
	upcie_heap_init(&heap, &mem);

	CHECK_EQ(upcie_heap_alloc_array(&heap, 10, 3072, 1024, &b), 0, "promise: 10 x 3K");
	CHECK_EQ(b.stride, 3072, "promise: fits one granule, so the stride is tight");
	CHECK(b.off / 65536 == (b.off + b.size - 1) / 65536, "promise: tight array in one granule");
	upcie_heap_free(&heap, b.off);

	CHECK_EQ(upcie_heap_alloc_array(&heap, 100, 3072, 1024, &b), 0, "promise: 100 x 3K");
	CHECK_EQ(b.stride, 4096, "promise: spans granules, so the stride is a power of two");
	CHECK_EQ(b.off % 4096, 0, "promise: array aligned to its stride");
	upcie_heap_free(&heap, b.off);

	CHECK_EQ(upcie_heap_alloc_array(&heap, 1, 65536, 4096, &b), 0, "promise: one 64K queue");
	CHECK_EQ(b.off % 65536, 0, "promise: a granule-sized element fills a granule");
	upcie_heap_free(&heap, b.off);

	/* A 48K plain allocation at 0, then a 40K element: it goes to the next granule. */
	{
		struct upcie_heap_buf p;

		CHECK_EQ(upcie_heap_alloc(&heap, 48 << 10, 4096, &p), 0, "promise: plain 48K");
		CHECK_EQ(upcie_heap_alloc(&heap, 40 << 10, 4096, &b), 0, "promise: plain 40K");
		CHECK_EQ(b.off, 48 << 10, "promise: a plain allocation may cross a granule");
		upcie_heap_free(&heap, b.off);
		CHECK_EQ(upcie_heap_alloc_array(&heap, 1, 40 << 10, 4096, &b), 0,
			 "promise: 40K element");
		CHECK_EQ(b.off, 64 << 10, "promise: an element does not cross: next granule");
		upcie_heap_free(&heap, b.off);
		upcie_heap_free(&heap, p.off);
	}
	upcie_heap_fini(&heap);
	upcie_dmamem_destroy(&mem);
}

static void test_errors(void)
{
	struct upcie_dmamem mem, arith;
	struct upcie_heap heap, zero;
	struct upcie_heap_buf b, a;
	struct upcie_heap_stats st = { 0 };
	uint64_t *lut = (uint64_t *)malloc(16 * sizeof(*lut));
	static char cpu[16 * 4096] __attribute__((aligned(4096)));

	for (int i = 0; i < 16; i++)
		lut[i] = (uint64_t)(i + 1) << 12;
	upcie_dmamem_init_lut(&mem, NULL, 16 * 4096, 12, lut, true);

	memset(&zero, 0, sizeof(zero));
	upcie_heap_fini(&zero);
	CHECK(1, "errors: fini of a zeroed heap is a no-op");
	CHECK_EQ(upcie_heap_alloc(&zero, 1, 1, &b), -EINVAL, "errors: alloc on a zeroed heap");
	CHECK_EQ(upcie_heap_free(&zero, 0), -EINVAL, "errors: free on a zeroed heap");
	CHECK_EQ(upcie_heap_init(&heap, NULL), -EINVAL, "errors: init without memory");
	memset(&arith, 0, sizeof(arith));
	CHECK_EQ(upcie_heap_init(&heap, &arith), -EINVAL, "errors: init on an empty dmamem");
	upcie_heap_fini(&heap); /* zeroed by the failed init */

	CHECK_EQ(upcie_heap_init(&heap, &mem), 0, "errors: init");
	CHECK_EQ(upcie_heap_alloc(&heap, 0, 1, &b), -EINVAL, "errors: zero size");
	CHECK_EQ(upcie_heap_alloc(&heap, 8, 0, &b), -EINVAL, "errors: alignment 0");
	CHECK_EQ(upcie_heap_alloc(&heap, 8, 3, &b), -EINVAL, "errors: alignment 3");
	CHECK_EQ(upcie_heap_alloc(&heap, 8, 8192, &b), -EINVAL,
		 "errors: alignment above the 4K granule");
	CHECK(strstr(last_msg, "exceeds") != NULL, "errors: says why (%s)", last_msg);
	CHECK_EQ(upcie_heap_alloc(&heap, 16 * 4096 + 1, 1, &b), -ENOMEM,
		 "errors: larger than heap");
	CHECK_EQ(upcie_heap_alloc(&heap, UINT64_MAX, 1, &b), -ENOMEM, "errors: UINT64_MAX bytes");
	CHECK_EQ(upcie_heap_alloc_array(&heap, 0, 8, 8, &b), -EINVAL, "errors: zero count");
	CHECK_EQ(upcie_heap_alloc_array(&heap, 1, 0, 8, &b), -EINVAL, "errors: zero element");
	CHECK_EQ(upcie_heap_alloc_array(&heap, 1, 4097, 8, &b), -EINVAL,
		 "errors: element larger than the granule");
	CHECK_EQ(upcie_heap_alloc_array(&heap, UINT64_MAX / 2, 4096, 8, &b), -EINVAL,
		 "errors: count x size overflows");
	CHECK_EQ(upcie_heap_alloc_array(&heap, 17, 4096, 4096, &b), -ENOMEM,
		 "errors: 17 pages in 16");

	CHECK_EQ(upcie_heap_alloc(&heap, 100, 64, &b), 0, "errors: alloc 100");
	CHECK_EQ(upcie_heap_alloc(&heap, 100, 64, &a), 0, "errors: alloc another 100");
	CHECK_EQ(upcie_heap_free(&heap, b.off + 1), -EINVAL, "errors: interior free");
	CHECK(strstr(last_msg, "inside the allocation") != NULL, "errors: says interior (%s)",
	      last_msg);
	CHECK_EQ(upcie_heap_free(&heap, 16 * 4096), -EINVAL, "errors: free past the end");
	CHECK_EQ(upcie_heap_free(&heap, UINT64_MAX), -EINVAL, "errors: free of UINT64_MAX");
	CHECK_EQ(upcie_heap_free(&heap, 8000), -EINVAL, "errors: free of a free range");
	CHECK_EQ(upcie_heap_free(&heap, b.off), 0, "errors: free");
	CHECK_EQ(upcie_heap_free(&heap, b.off), -EINVAL, "errors: double free");
	CHECK(strstr(last_msg, "double free") != NULL, "errors: says double free (%s)", last_msg);
	CHECK_EQ(upcie_heap_validate(&heap), 0, "errors: bad frees changed nothing");
	upcie_heap_stats_get(&heap, &st);
	CHECK_EQ(st.nalloc, 1, "errors: one allocation left");
	CHECK_EQ(upcie_heap_free(&heap, a.off), 0, "errors: free the other");
	upcie_heap_fini(&heap);
	upcie_heap_fini(&heap);
	CHECK(1, "errors: fini twice is a no-op");
	CHECK_EQ(upcie_heap_alloc(&heap, 1, 1, &b), -EINVAL, "errors: alloc after fini");
	upcie_dmamem_destroy(&mem);

	/* Alignment is honoured in every address space, or refused. */
	upcie_dmamem_init_arith(&arith, NULL, 1 << 20, 0x3000);
	upcie_heap_init(&heap, &arith);
	CHECK_EQ(upcie_heap_alloc(&heap, 64, 4096, &b), 0, "align: 4K on a 4K-aligned IOVA");
	CHECK_EQ(b.iova % 4096, 0, "align: device address aligned");
	CHECK_EQ(upcie_heap_alloc(&heap, 64, 8192, &a), -EINVAL,
		 "align: 8K refused on a 4K-aligned IOVA");
	upcie_heap_fini(&heap);
	upcie_dmamem_destroy(&arith);

	upcie_dmamem_init_arith(&arith, cpu + 64, 4096, 0);
	upcie_heap_init(&heap, &arith);
	CHECK_EQ(upcie_heap_alloc(&heap, 64, 64, &b), 0, "align: 64 on a 64-aligned CPU view");
	CHECK_EQ((uintptr_t)b.vaddr % 64, 0, "align: CPU pointer aligned");
	CHECK(upcie_heap_ptr(&heap, b.off) == b.vaddr, "align: heap_ptr agrees");
	CHECK_EQ(upcie_heap_alloc(&heap, 64, 128, &a), -EINVAL,
		 "align: 128 refused on a 64-aligned CPU view");
	upcie_heap_fini(&heap);
	upcie_dmamem_destroy(&arith);
}

/* Threads share one heap; each fills its allocations with its own byte and checks it. */
struct thr {
	struct upcie_heap *heap;
	uint8_t *cpu;
	uint64_t seed;
	int bad;
};

static void *thr_main(void *arg)
{
	struct thr *t = (struct thr *)arg;
	struct upcie_heap_buf held[32];
	size_t n = 0;
	uint8_t tag = (uint8_t)(t->seed * 37 + 1);

	for (int op = 0; op < 3000; op++) {
		if (n < 32 && rng_range(&t->seed, 0, 1)) {
			struct upcie_heap_buf b;
			int err =
			    rng_range(&t->seed, 0, 1)
				? upcie_heap_alloc(t->heap, rng_range(&t->seed, 1, 9000),
						   UINT64_C(1) << rng_range(&t->seed, 0, 12), &b)
				: upcie_heap_alloc_array(t->heap, rng_range(&t->seed, 1, 8),
							 rng_range(&t->seed, 1, 5000), 64, &b);

			if (err == -ENOMEM)
				continue;
			if (err) {
				t->bad++;
				continue;
			}
			memset(b.vaddr, tag, b.size);
			held[n++] = b;
		} else if (n) {
			size_t i = (size_t)rng_range(&t->seed, 0, n - 1);
			const uint8_t *p = (const uint8_t *)held[i].vaddr;

			for (uint64_t k = 0; k < held[i].size; k++)
				if (p[k] != tag) {
					t->bad++;
					break;
				}
			if (upcie_heap_free(t->heap, held[i].off) != 0)
				t->bad++;
			held[i] = held[--n];
		}
	}
	while (n)
		if (upcie_heap_free(t->heap, held[--n].off) != 0)
			t->bad++;
	return NULL;
}

static void test_threads(void)
{
	const uint64_t size = 4 << 20;
	struct upcie_dmamem mem;
	struct upcie_heap heap;
	struct upcie_heap_stats st = { 0 };
	struct thr t[4];
	pthread_t tid[4];
	uint8_t *cpu = (uint8_t *)alloc_aligned(65536, size);
	uint64_t *lut = (uint64_t *)malloc(64 * sizeof(*lut));
	int bad = 0;

	for (int i = 0; i < 64; i++)
		lut[i] = (uint64_t)i << 16;
	upcie_dmamem_init_lut(&mem, cpu, size, 16, lut, true);
	upcie_heap_init(&heap, &mem);
	for (int i = 0; i < 4; i++) {
		t[i].heap = &heap;
		t[i].cpu = cpu;
		t[i].seed = (uint64_t)i + 11;
		t[i].bad = 0;
		pthread_create(&tid[i], NULL, thr_main, &t[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(tid[i], NULL);
		bad += t[i].bad;
	}
	CHECK_EQ(bad, 0, "threads: no overlap, no failed free across 4 threads");
	upcie_heap_stats_get(&heap, &st);
	CHECK_EQ(st.nfree_blocks, 1, "threads: coalesced into one block");
	CHECK_EQ(st.free_bytes, size, "threads: all free");
	CHECK_EQ(upcie_heap_validate(&heap), 0, "threads: valid");
	upcie_heap_fini(&heap);
	upcie_dmamem_destroy(&mem);
	free(cpu);
}

int main(void)
{
	upcie_log_set_handler(capture, NULL);
	test_model();
	test_array_promise();
	test_errors();
	test_threads();
	return check_done();
}
