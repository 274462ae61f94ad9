/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Translation at granule boundaries, for LUT and arithmetic dmamems, directly and through the heap
 * and the registry: last byte of a granule, first byte of the next, a short last granule, and
 * -ERANGE past the end.
 */
#include <upcie/mem/dmamem.h>
#include <upcie/mem/heap.h>
#include <upcie/mem/registry.h>

#include <stdint.h>
#include <stdlib.h>

#include "check.h"

#define G64K (UINT64_C(1) << 16)

static void quiet(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)msg;
	(void)ctx;
}

/* LUT entries deliberately out of order and far apart, so a stray linear stride shows. */
static uint64_t lut_addr(size_t i, size_t n)
{
	return UINT64_C(0x4000000000) + (uint64_t)(n - 1 - i) * 3 * G64K;
}

static void test_lut(void)
{
	const size_t n = 4;
	const uint64_t size = 3 * G64K + 0x1234; /* short last granule */
	struct upcie_dmamem mem;
	uint64_t *lut = (uint64_t *)malloc(n * sizeof(*lut)), iova = 0;

	for (size_t i = 0; i < n; i++)
		lut[i] = lut_addr(i, n);
	CHECK_EQ(upcie_dmamem_init_lut(&mem, NULL, size, 16, lut, true), 0, "lut: init");
	CHECK_EQ(mem.nlut, n, "lut: %zu entries for a short last granule", n);

	CHECK_EQ(upcie_dmamem_iova(&mem, 0, &iova), 0, "lut: offset 0");
	CHECK_EQ(iova, lut_addr(0, n), "lut: offset 0 -> entry 0");
	for (size_t g = 0; g + 1 < n; g++) {
		uint64_t last = (g + 1) * G64K - 1, next = (g + 1) * G64K;

		CHECK_EQ(upcie_dmamem_iova(&mem, last, &iova), 0, "lut: last byte of granule %zu",
			 g);
		CHECK_EQ(iova, lut_addr(g, n) + G64K - 1, "lut: last byte of granule %zu", g);
		CHECK_EQ(upcie_dmamem_contig(&mem, last), 1,
			 "lut: 1 contiguous byte at the end of %zu", g);
		CHECK_EQ(upcie_dmamem_iova(&mem, next, &iova), 0, "lut: first byte of granule %zu",
			 g + 1);
		CHECK_EQ(iova, lut_addr(g + 1, n), "lut: first byte of granule %zu", g + 1);
	}
	CHECK_EQ(upcie_dmamem_contig(&mem, 3 * G64K), 0x1234, "lut: short last granule contig");
	CHECK_EQ(upcie_dmamem_contig(&mem, 5), G64K - 5, "lut: contig to the granule end");
	CHECK_EQ(upcie_dmamem_iova(&mem, size - 1, &iova), 0, "lut: last byte");
	CHECK_EQ(iova, lut_addr(3, n) + 0x1233, "lut: last byte translates into the short granule");
	iova = 0xdead;
	CHECK_EQ(upcie_dmamem_iova(&mem, size, &iova), -ERANGE, "lut: one past the end is -ERANGE");
	CHECK_EQ(iova, 0xdead, "lut: -ERANGE leaves the output alone");
	CHECK_EQ(upcie_dmamem_iova(&mem, UINT64_MAX, &iova), -ERANGE, "lut: UINT64_MAX is -ERANGE");
	CHECK_EQ(upcie_dmamem_contig(&mem, size), 0, "lut: contig past the end is 0");
	CHECK_EQ(upcie_dmamem_granule(&mem), G64K, "lut: granule");
	upcie_dmamem_destroy(&mem);
	upcie_dmamem_destroy(&mem); /* a destroyed (zeroed) dmamem is a no-op */
}

static void test_arith(void)
{
	struct upcie_dmamem mem;
	uint64_t iova = 0;
	static char buf[8192];

	CHECK_EQ(upcie_dmamem_init_arith(&mem, buf, sizeof(buf), UINT64_C(0x100000)), 0,
		 "arith: init");
	CHECK_EQ(upcie_dmamem_iova(&mem, 0, &iova), 0, "arith: offset 0");
	CHECK_EQ(iova, 0x100000, "arith: offset 0");
	CHECK_EQ(upcie_dmamem_iova(&mem, 4095, &iova), 0, "arith: 4095");
	CHECK_EQ(iova, 0x100fff, "arith: last byte of the first page");
	CHECK_EQ(upcie_dmamem_iova(&mem, 4096, &iova), 0, "arith: 4096");
	CHECK_EQ(iova, 0x101000, "arith: first byte of the second page");
	CHECK_EQ(upcie_dmamem_iova(&mem, 8191, &iova), 0, "arith: last byte");
	CHECK_EQ(iova, 0x101fff, "arith: last byte");
	CHECK_EQ(upcie_dmamem_iova(&mem, 8192, &iova), -ERANGE, "arith: one past the end");
	CHECK_EQ(upcie_dmamem_contig(&mem, 100), 8192 - 100, "arith: contiguous to the end");
	upcie_dmamem_destroy(&mem);

	CHECK_EQ(upcie_dmamem_init_arith(&mem, NULL, 4096, UINT64_MAX - 4094), -EINVAL,
		 "arith: a range that wraps is refused");
	CHECK_EQ(upcie_dmamem_init_arith(&mem, NULL, 4096, UINT64_MAX - 4095), 0,
		 "arith: a range ending at the top is fine");
	CHECK_EQ(upcie_dmamem_iova(&mem, 4095, &iova), 0, "arith: top byte");
	CHECK_EQ(iova, UINT64_MAX, "arith: top byte is UINT64_MAX");
	upcie_dmamem_destroy(&mem);
}

/* The heap hands out device addresses through the dmamem; arrays never cross granules. */
static void test_heap_translate(void)
{
	const size_t n = 8;
	struct upcie_dmamem mem;
	struct upcie_heap heap;
	struct upcie_heap_buf a, b;
	uint64_t *lut = (uint64_t *)malloc(n * sizeof(*lut)), iova = 0;

	for (size_t i = 0; i < n; i++)
		lut[i] = lut_addr(i, n);
	CHECK_EQ(upcie_dmamem_init_lut(&mem, NULL, n * G64K, 16, lut, true), 0, "heap: lut");
	CHECK_EQ(upcie_heap_init(&heap, &mem), 0, "heap: init");
	/* 48 KiB then 48 KiB: the second cannot start at 48K (it would cross) if it is an array
	 * element; a plain allocation may. */
	CHECK_EQ(upcie_heap_alloc(&heap, 48 * 1024, 4096, &a), 0, "heap: plain 48K");
	CHECK_EQ(upcie_heap_alloc_array(&heap, 1, 48 * 1024, 4096, &b), 0, "heap: 48K element");
	CHECK_EQ(b.off, G64K, "heap: element placed at the next granule");
	CHECK_EQ(b.iova, lut_addr(1, n), "heap: element's device address is entry 1");
	CHECK_EQ(upcie_heap_iova(&heap, b.off + 48 * 1024 - 1, &iova), 0, "heap: last byte");
	CHECK_EQ(iova, lut_addr(1, n) + 48 * 1024 - 1, "heap: last byte of element in entry 1");
	CHECK(upcie_dmamem_contig(&mem, b.off) >= 48 * 1024, "heap: element contiguous");
	CHECK_EQ(upcie_heap_iova(&heap, n * G64K, &iova), -ERANGE, "heap: past the end");
	CHECK(upcie_heap_ptr(&heap, 0) == NULL, "heap: no CPU view, no pointer");
	upcie_heap_fini(&heap);
	upcie_dmamem_destroy(&mem);
}

static void test_registry_translate(void)
{
	const size_t n = 4;
	struct upcie_registry reg;
	struct upcie_dmamem mem;
	struct upcie_registry_hit hit = { 0 };
	uint64_t *lut = (uint64_t *)malloc(n * sizeof(*lut)), iova = 0;
	/* A fake GPU virtual address: the registry never dereferences it. */
	const char *base = (const char *)(uintptr_t)UINT64_C(0x7f0000000000);
	const uint64_t off = G64K / 2, size = 2 * G64K;

	for (size_t i = 0; i < n; i++)
		lut[i] = lut_addr(i, n);
	CHECK_EQ(upcie_dmamem_init_lut(&mem, NULL, n * G64K, 16, lut, true), 0, "reg: lut");
	CHECK_EQ(upcie_registry_init(&reg), 0, "reg: init");
	/* The range starts half a granule into its dmamem (an export of a larger object). */
	CHECK_EQ(upcie_registry_register(&reg, base, size, &mem, off), 0, "reg: register");
	CHECK_EQ(upcie_registry_iova(&reg, base, &iova), 0, "reg: base");
	CHECK_EQ(iova, lut_addr(0, n) + off, "reg: base is half a granule into entry 0");
	CHECK_EQ(upcie_registry_iova(&reg, base + G64K / 2 - 1, &iova), 0, "reg: end of entry 0");
	CHECK_EQ(iova, lut_addr(0, n) + G64K - 1, "reg: last byte of entry 0");
	CHECK_EQ(upcie_registry_iova(&reg, base + G64K / 2, &iova), 0, "reg: start of entry 1");
	CHECK_EQ(iova, lut_addr(1, n), "reg: first byte of entry 1");
	CHECK_EQ(upcie_registry_iova(&reg, base + size - 1, &iova), 0, "reg: last byte");
	CHECK_EQ(iova, lut_addr(2, n) + G64K / 2 - 1, "reg: last byte in entry 2");
	CHECK_EQ(upcie_registry_iova(&reg, base + size, &iova), -ENOENT, "reg: one past the end");
	CHECK_EQ(upcie_registry_lookup(&reg, base + 10, &hit), 0, "reg: lookup");
	CHECK_EQ(hit.off, off + 10, "reg: lookup offset");
	CHECK_EQ(hit.avail, size - 10, "reg: lookup avail");
	CHECK_EQ(upcie_registry_unregister(&reg, base, NULL), 0, "reg: unregister");
	upcie_registry_fini(&reg);
}

int main(void)
{
	upcie_log_set_handler(quiet, NULL);
	test_lut();
	test_arith();
	test_heap_translate();
	test_registry_translate();
	return check_done();
}
