/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests for the parsing of VFIO_IOMMU_GET_INFO answers (vfio/type1.h): hand-built buffers
 * with page sizes and capability chains (IOVA ranges, DMA-mapping budget, unknown capabilities),
 * and malformed ones: capability offsets out of bounds or inside the fixed header, truncated
 * capabilities, range counts that overflow the buffer, chains that loop or go back, duplicate
 * capabilities, bad range lists (-EPROTO), more ranges than supported (-E2BIG).
 */
#include <upcie/vfio/type1.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

struct buf {
	unsigned char b[4096];
	size_t len;
	uint32_t last_cap; /* offset of the last capability appended, 0: none */
};

static void info_init(struct buf *b, uint32_t flags, uint64_t pgsizes)
{
	struct vfio_iommu_type1_info info;

	memset(b, 0, sizeof(*b));
	memset(&info, 0, sizeof(info));
	info.argsz = sizeof(info);
	info.flags = flags;
	info.iova_pgsizes = pgsizes;
	memcpy(b->b, &info, sizeof(info));
	b->len = sizeof(info);
}

static struct vfio_iommu_type1_info *info_of(struct buf *b)
{
	return (struct vfio_iommu_type1_info *)(void *)b->b;
}

static struct vfio_info_cap_header *hdr_at(struct buf *b, uint32_t off)
{
	return (struct vfio_info_cap_header *)(void *)(b->b + off);
}

/* Append a capability of `len` bytes (8-byte aligned like the kernel) and chain it. */
static uint32_t cap_add(struct buf *b, uint16_t id, uint16_t version, const void *body,
			size_t body_len)
{
	uint32_t off = (uint32_t)((b->len + 7) & ~(size_t)7);
	struct vfio_info_cap_header h;

	memset(&h, 0, sizeof(h));
	h.id = id;
	h.version = version;
	memcpy(b->b + off, &h, sizeof(h));
	memcpy(b->b + off + sizeof(h), body, body_len);
	b->len = off + sizeof(h) + body_len;
	if (b->last_cap)
		hdr_at(b, b->last_cap)->next = off;
	else
		info_of(b)->cap_offset = off;
	info_of(b)->flags |= VFIO_IOMMU_INFO_CAPS;
	info_of(b)->argsz = (uint32_t)b->len;
	b->last_cap = off;
	return off;
}

static uint32_t cap_iova(struct buf *b, uint32_t nr, const uint64_t *pairs, uint32_t nr_claimed)
{
	unsigned char body[8 + 16 * 80];
	uint32_t zero = 0;

	memcpy(body, &nr_claimed, 4);
	memcpy(body + 4, &zero, 4);
	for (uint32_t i = 0; i < nr; i++) {
		struct vfio_iova_range r = { pairs[2 * i], pairs[2 * i + 1] };

		memcpy(body + 8 + 16 * i, &r, sizeof(r));
	}
	return cap_add(b, VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE, 1, body, 8 + 16 * (size_t)nr);
}

static uint32_t cap_avail(struct buf *b, uint32_t avail)
{
	return cap_add(b, VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL, 1, &avail, sizeof(avail));
}

static const uint64_t k72[] = { 0, 0xfedfffff, 0xfef00000, 0x7fffffffffULL };

static void test_good(void)
{
	struct upcie_vfio_type1_info out;
	struct upcie_vfio_iova_space s;
	struct buf b;
	uint64_t iova = 0;
	unsigned char mig[24] = { 0 };

	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x40201000);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), 0, "no capabilities");
	CHECK(out.pgsizes == 0x40201000 && out.ranges.align == 0x1000 && !out.have_ranges &&
		  out.dma_avail == UINT32_MAX,
	      "page sizes 4K|2M|1G, alignment 4 KiB, no ranges, no budget");

	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x40201000);
	cap_iova(&b, 2, k72, 2);
	cap_avail(&b, 65535);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), 0, "IOVA ranges then DMA budget");
	CHECK(out.have_ranges && out.ranges.n == 2 && out.ranges.r[0].start == 0 &&
		  out.ranges.r[0].last == 0xfedfffff && out.ranges.r[1].start == 0xfef00000 &&
		  out.ranges.r[1].last == 0x7fffffffffULL,
	      "two ranges as in the 7.2 guest");
	CHECK_EQ(out.dma_avail, 65535, "DMA budget 65535");
	CHECK_EQ(upcie_vfio_iova_space_init(&s, &out.ranges), 0,
		 "allocator over the parsed ranges");
	CHECK(upcie_vfio_iova_alloc(&s, 1 << 21, 0, &iova) == 0 && iova >= (1ULL << 32),
	      "first IOVA 0x%llx is above 4 GiB", (unsigned long long)iova);
	upcie_vfio_iova_space_fini(&s);

	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_avail(&b, 7);
	cap_add(&b, 2 /* migration */, 1, mig, sizeof(mig));
	cap_iova(&b, 2, k72, 2);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), 0,
		 "budget, an unknown capability, then ranges");
	CHECK(out.have_ranges && out.ranges.n == 2 && out.dma_avail == 7,
	      "both known capabilities found around the unknown one");

	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_iova(&b, 0, k72, 0);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), 0, "an empty range list parses");
	CHECK(out.have_ranges && out.ranges.n == 0, "and says so");

	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_iova(&b, 2, k72, 2);
	info_of(&b)->flags &= ~VFIO_IOMMU_INFO_CAPS;
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), 0, "chain without the CAPS flag");
	CHECK(!out.have_ranges, "is ignored");

	info_init(&b, 0, 0);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), 0, "no page sizes reported");
	CHECK(out.pgsizes == 0 && out.ranges.align == 0, "alignment unknown (0)");
}

static void test_bad(void)
{
	struct upcie_vfio_type1_info out;
	struct buf b;
	uint32_t c1, c2;
	uint64_t many[2 * 70];

	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, 8, &out), -EPROTO,
		 "answer shorter than the fixed header -> -EPROTO");
	CHECK_EQ(upcie_vfio_type1_info_parse(NULL, 64, &out), -EINVAL, "NULL buffer -> -EINVAL");
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, NULL), -EINVAL, "NULL output -> -EINVAL");

	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_iova(&b, 2, k72, 2);
	info_of(&b)->cap_offset = (uint32_t)b.len + 64;
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "first capability beyond the answer -> -EPROTO");
	info_of(&b)->cap_offset = 8;
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "first capability inside the fixed header -> -EPROTO");
	info_of(&b)->cap_offset = (uint32_t)b.len - 4;
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "capability header cut by the end -> -EPROTO");
	info_of(&b)->cap_offset = 0xfffffff8u;
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "capability offset near 4 GiB -> -EPROTO");

	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	c1 = cap_iova(&b, 2, k72, 2);
	hdr_at(&b, c1)->next = c1;
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "capability pointing at itself (loop) -> -EPROTO");

	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	c1 = cap_avail(&b, 3);
	c2 = cap_iova(&b, 2, k72, 2);
	hdr_at(&b, c2)->next = c1;
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "chain going back to an earlier capability (loop) -> -EPROTO");
	hdr_at(&b, c2)->next = (uint32_t)b.len + 8;
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "next beyond the answer -> -EPROTO");

	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_iova(&b, 2, k72, 3);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "range count one beyond the buffer -> -EPROTO");
	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_iova(&b, 2, k72, 0xffffffffu);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "range count 0xffffffff (size overflow) -> -EPROTO");
	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_iova(&b, 0, k72, 0);
	b.len -= 4; /* cut the nr_iovas/reserved words */
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "IOVA capability shorter than its fixed part -> -EPROTO");

	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_iova(&b, 2, k72, 2);
	cap_avail(&b, 1);
	/* let the IOVA capability claim the DMA-budget capability's bytes */
	memcpy(b.b + info_of(&b)->cap_offset + 8, &(uint32_t){ 3 }, 4);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "ranges running into the next capability -> -EPROTO");

	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_iova(&b, 2, (const uint64_t[]){ 0x2000, 0x1000, 0x3000, 0x4000 }, 2);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "reversed range -> -EPROTO");
	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_iova(&b, 2, (const uint64_t[]){ 0x1000, 0x5000, 0x3000, 0x8000 }, 2);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "overlapping ranges -> -EPROTO");

	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_iova(&b, 2, k72, 2);
	cap_iova(&b, 2, k72, 2);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "two IOVA-range capabilities -> -EPROTO");

	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_avail(&b, 1);
	b.len -= 4;
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "truncated DMA-budget capability -> -EPROTO");
	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_avail(&b, 1);
	cap_avail(&b, 2);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -EPROTO,
		 "two DMA-budget capabilities -> -EPROTO");

	for (int i = 0; i < 70; i++) {
		many[2 * i] = (uint64_t)i << 24;
		many[2 * i + 1] = ((uint64_t)i << 24) + 0xfff;
	}
	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_iova(&b, 70, many, 70);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), -E2BIG,
		 "70 ranges (more than %d) -> -E2BIG", UPCIE_VFIO_IOVA_RANGES_MAX);
	info_init(&b, VFIO_IOMMU_INFO_PGSIZES, 0x1000);
	cap_iova(&b, UPCIE_VFIO_IOVA_RANGES_MAX, many, UPCIE_VFIO_IOVA_RANGES_MAX);
	CHECK_EQ(upcie_vfio_type1_info_parse(b.b, b.len, &out), 0, "exactly %d ranges parse",
		 UPCIE_VFIO_IOVA_RANGES_MAX);
}

int main(void)
{
	upcie_log_set_level(UPCIE_LOG_NONE);
	test_good();
	test_bad();
	return check_done();
}
