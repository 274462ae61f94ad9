/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Scatter list -> LUT: the accepted shapes (exact granules, a short last segment, contiguous small
 * segments forming granules, runs split into several entries) and every refusal (gap, misaligned
 * start, zero length, wrap, size mismatch either way, discontiguous small segments), each with a
 * message naming the segment and never a LUT.
 */
#include <upcie/mem/sglut.h>

#include <stdint.h>
#include <string.h>

#include "check.h"

#define K64 (UINT64_C(1) << 16)
#define M2  (UINT64_C(1) << 21)

static char last_msg[512];

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	snprintf(last_msg, sizeof(last_msg), "%s", msg);
}

static int build(const struct upcie_sg_seg *segs, size_t n, uint64_t size, unsigned shift,
		 struct upcie_dmamem *mem)
{
	last_msg[0] = '\0';
	return upcie_dmamem_sglut(mem, NULL, size, shift, segs, n);
}

/* Expect -EINVAL, a message containing `word`, and a zeroed dmamem. */
static void refused(const struct upcie_sg_seg *segs, size_t n, uint64_t size, const char *word,
		    const char *what)
{
	struct upcie_dmamem mem;
	int err = build(segs, n, size, 16, &mem);

	CHECK_EQ(err, -EINVAL, "%s: -EINVAL", what);
	CHECK(strstr(last_msg, word) != NULL, "%s: message names '%s' (%s)", what, word, last_msg);
	CHECK(mem.lut == NULL && mem.size == 0 && mem.fd == -1, "%s: dmamem left zeroed", what);
	upcie_dmamem_destroy(&mem);
}

static void test_exact_granules(void)
{
	const struct upcie_sg_seg segs[] = { { 0x100000000, K64 }, { 0x300000, 2 * K64 } };
	struct upcie_dmamem mem;
	uint64_t iova = 0;

	CHECK_EQ(build(segs, 2, 3 * K64, 16, &mem), 0, "exact: two runs");
	CHECK_EQ(mem.nlut, 3, "exact: three entries");
	CHECK_EQ(mem.lut[0], 0x100000000, "exact: entry 0");
	CHECK_EQ(mem.lut[1], 0x300000, "exact: entry 1");
	CHECK_EQ(mem.lut[2], 0x300000 + K64, "exact: entry 2 continues the run");
	CHECK_EQ(upcie_dmamem_iova(&mem, K64 - 1, &iova), 0, "exact: last byte of granule 0");
	CHECK_EQ(iova, 0x100000000 + K64 - 1, "exact: last byte of granule 0 translates");
	CHECK_EQ(upcie_dmamem_iova(&mem, K64, &iova), 0, "exact: first byte of granule 1");
	CHECK_EQ(iova, 0x300000, "exact: first byte of granule 1 translates");
	CHECK(strcmp(mem.kind, "sglut") == 0, "exact: kind");
	upcie_dmamem_destroy(&mem);
}

static void test_one_granule(void)
{
	const struct upcie_sg_seg seg = { 0x200000, K64 };
	struct upcie_dmamem mem;

	CHECK_EQ(build(&seg, 1, K64, 16, &mem), 0, "one granule");
	CHECK_EQ(mem.nlut, 1, "one granule: one entry");
	upcie_dmamem_destroy(&mem);
}

static void test_2m_segment(void)
{
	const struct upcie_sg_seg seg = { 0x40000000, M2 };
	struct upcie_dmamem mem;
	int ok = 1;

	CHECK_EQ(build(&seg, 1, M2, 16, &mem), 0, "2 MiB at 64 KiB");
	CHECK_EQ(mem.nlut, 32, "2 MiB at 64 KiB: 32 entries");
	for (size_t i = 0; i < 32 && mem.lut; i++)
		ok &= mem.lut[i] == 0x40000000 + i * K64;
	CHECK(ok, "2 MiB at 64 KiB: entries step by the granule");
	upcie_dmamem_destroy(&mem);

	CHECK_EQ(build(&seg, 1, M2, 21, &mem), 0, "2 MiB at 2 MiB");
	CHECK_EQ(mem.nlut, 1, "2 MiB at 2 MiB: 1 entry");
	upcie_dmamem_destroy(&mem);
}

static void test_short_last(void)
{
	/* CUDA exports exactly the requested size: the last segment ends short. */
	const struct upcie_sg_seg segs[] = { { 0x10000, K64 }, { 0x80000, 0x1000 } };
	const struct upcie_sg_seg alone = { 0x80000, 0x3000 };
	struct upcie_dmamem mem;
	uint64_t iova = 0;

	CHECK_EQ(build(segs, 2, K64 + 0x1000, 16, &mem), 0, "short last: accepted");
	CHECK_EQ(mem.nlut, 2, "short last: two entries");
	CHECK_EQ(upcie_dmamem_iova(&mem, K64 + 0xfff, &iova), 0, "short last: last byte");
	CHECK_EQ(iova, 0x80fff, "short last: last byte translates");
	CHECK_EQ(upcie_dmamem_iova(&mem, K64 + 0x1000, &iova), -ERANGE, "short last: past the end");
	upcie_dmamem_destroy(&mem);

	CHECK_EQ(build(&alone, 1, 0x3000, 16, &mem), 0, "short only segment: accepted");
	upcie_dmamem_destroy(&mem);
}

/*
 * The rule for small segments: they merge into a granule only when contiguous and the run starts
 * aligned. 16 x 4 KiB at consecutive addresses from an aligned base make one 64 KiB entry.
 */
static void test_small_segments(void)
{
	struct upcie_sg_seg segs[32];
	struct upcie_dmamem mem;

	for (size_t i = 0; i < 32; i++) {
		segs[i].addr = 0x500000 + i * 0x1000;
		segs[i].len = 0x1000;
	}
	CHECK_EQ(build(segs, 32, 2 * K64, 16, &mem), 0, "small: contiguous aligned 4K segments");
	CHECK_EQ(mem.nlut, 2, "small: combine into two entries");
	CHECK_EQ(mem.lut[1], 0x500000 + K64, "small: second entry");
	upcie_dmamem_destroy(&mem);

	/* The same segments starting 4 KiB off a granule: the run is misaligned. */
	for (size_t i = 0; i < 32; i++)
		segs[i].addr = 0x501000 + i * 0x1000;
	refused(segs, 32, 2 * K64, "segment 0 starts", "small: misaligned run");

	/* Contiguous except one hole in the middle of the first granule. */
	for (size_t i = 0; i < 32; i++)
		segs[i].addr = 0x500000 + i * 0x1000 + (i >= 5 ? 0x100000 : 0);
	refused(segs, 32, 2 * K64, "segment 4 ends", "small: hole inside a granule");

	/* A hole exactly at a granule boundary is fine: runs of 16 pages each. */
	for (size_t i = 0; i < 32; i++)
		segs[i].addr = 0x500000 + i * 0x1000 + (i >= 16 ? 0x700000 : 0);
	CHECK_EQ(build(segs, 32, 2 * K64, 16, &mem), 0, "small: hole at a granule boundary");
	CHECK_EQ(mem.lut[1], 0x500000 + K64 + 0x700000, "small: second run's entry");
	upcie_dmamem_destroy(&mem);

	/* Mixed sizes, contiguous: 4K + 60K + 64K = 2 granules. */
	{
		const struct upcie_sg_seg mix[] = { { 0x900000, 0x1000 },
						    { 0x901000, 0xf000 },
						    { 0x910000, K64 } };

		CHECK_EQ(build(mix, 3, 2 * K64, 16, &mem), 0, "small: mixed contiguous sizes");
		CHECK_EQ(mem.nlut, 2, "small: mixed gives two entries");
		upcie_dmamem_destroy(&mem);
	}
}

static void test_refusals(void)
{
	{
		const struct upcie_sg_seg s[] = { { 0x10000, K64 },
						  { 0x30000, K64 / 2 },
						  { 0x50000, K64 / 2 } };
		refused(s, 3, 2 * K64, "segment 1 ends", "gap: short middle segment");
	}
	{
		const struct upcie_sg_seg s[] = { { 0x10000, K64 }, { 0x31000, K64 } };
		refused(s, 2, 2 * K64, "segment 1 starts", "misaligned start of segment 1");
	}
	{
		const struct upcie_sg_seg s[] = { { 0x10800, K64 } };
		refused(s, 1, K64, "segment 0 starts", "misaligned start of segment 0");
	}
	{
		const struct upcie_sg_seg s[] = { { 0x10000, K64 },
						  { 0x20000, 0 },
						  { 0x20000, K64 } };
		refused(s, 3, 2 * K64, "segment 1 has length 0", "zero-length segment");
	}
	{
		const struct upcie_sg_seg s[] = { { UINT64_MAX - K64 + 1, 2 * K64 } };
		refused(s, 1, 2 * K64, "segment 0", "segment wrapping the address space");
	}
	{
		/* Ends exactly at the top of the address space: legal, and nothing follows it. */
		const struct upcie_sg_seg s[] = { { UINT64_MAX - K64 + 1, K64 }, { 0, K64 } };
		struct upcie_dmamem mem;

		CHECK_EQ(build(s, 2, 2 * K64, 16, &mem), 0, "top of address space, then 0");
		CHECK_EQ(mem.lut[1], 0, "top: second run is its own entry");
		upcie_dmamem_destroy(&mem);
	}
	{
		const struct upcie_sg_seg s[] = { { 0x10000, K64 }, { 0x20000, K64 } };
		refused(s, 2, 3 * K64, "describe 0x20000 bytes", "too few bytes");
		refused(s, 2, K64, "segment 1", "too many bytes");
		refused(s, 2, K64 + 1, "segment 1", "too many bytes, short size");
	}
	{
		/* Short by a partial granule at the end: not at the buffer size, so refused. */
		const struct upcie_sg_seg s[] = { { 0x10000, K64 }, { 0x40000, 0x1000 } };
		refused(s, 2, 2 * K64, "describe", "short last segment not at the size");
	}
	{
		const struct upcie_sg_seg s[] = { { 0x10000, K64 } };
		struct upcie_dmamem mem;
		uint64_t lut[2];

		CHECK_EQ(build(s, 1, K64, 11, &mem), -EINVAL, "granule below 4 KiB");
		CHECK_EQ(build(s, 1, K64, 31, &mem), -EINVAL, "granule above 1 GiB");
		CHECK_EQ(build(s, 0, K64, 16, &mem), -EINVAL, "no segments");
		CHECK_EQ(build(s, 1, 0, 16, &mem), -EINVAL, "zero size");
		CHECK_EQ(build(NULL, 1, K64, 16, &mem), -EINVAL, "NULL segments");
		CHECK_EQ(upcie_sglut_fill(s, 1, K64, 16, lut, 2), -EINVAL,
			 "fill: wrong LUT length");
		CHECK_EQ(upcie_sglut_fill(s, 1, K64, 16, lut, 1), 0, "fill: right LUT length");
		CHECK_EQ(lut[0], 0x10000, "fill: entry");
	}
}

int main(void)
{
	upcie_log_set_handler(capture, NULL);
	test_exact_granules();
	test_one_granule();
	test_2m_segment();
	test_short_last();
	test_small_segments();
	test_refusals();
	return check_done();
}
