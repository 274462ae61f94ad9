/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Scatter list to LUT: turn the segments a dma-buf importer reports ({device address, length}
 * per segment, in buffer order) into a LUT dmamem at a chosen granule.
 *
 * The rule. Segments that follow each other in device address space (segment k + 1 starts where
 * segment k ends) are first merged into runs; a run is what the device sees as contiguous. Then
 * every run must start on a granule-aligned device address and be a whole number of granules
 * long, except the last run, which may end short exactly at the buffer size. Each granule of a
 * run becomes one LUT entry (a 2 MiB run at a 64 KiB granule gives 32). So small segments may
 * combine into a granule only when they are contiguous and the first is aligned; a discontinuity
 * inside a granule would need two addresses for one entry and is refused. The segments must
 * describe exactly `size` bytes. Zero-length segments, segments whose addresses wrap, and any
 * violation are -EINVAL with a message naming the segment: a scatter list that does not fit is
 * never turned into a wrong address.
 *
 * Needs nothing at run time (libc only). Does not: attach to or map a dma-buf (the importer
 * wrappers do), or own anything besides the LUT it allocates.
 */
#ifndef UPCIE_MEM_SGLUT_H
#define UPCIE_MEM_SGLUT_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/bits.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>

/* One scatter-list segment: `len` bytes at device (bus) address `addr`. */
struct upcie_sg_seg {
	uint64_t addr;
	uint64_t len;
};

/*
 * Fill lut[0..nlut) from `nsegs` segments describing a buffer of `size` bytes at granule
 * 1 << granule_shift (12..30), by the rule above; nlut must be div_round_up(size, granule).
 * Returns 0 or -EINVAL; lut is unspecified on failure.
 */
static inline int upcie_sglut_fill(const struct upcie_sg_seg *segs, size_t nsegs, uint64_t size,
				   unsigned granule_shift, uint64_t *lut, size_t nlut)
{
	uint64_t gran, done = 0;
	size_t i = 0, k = 0;

	if (!segs || !nsegs || !size || !lut)
		return UPCIE_FAIL(-EINVAL, "sglut: empty scatter list, buffer or LUT");
	if (granule_shift < 12 || granule_shift > 30)
		return UPCIE_FAIL(-EINVAL, "sglut: granule shift %u outside 12..30", granule_shift);
	gran = UINT64_C(1) << granule_shift;
	if (nlut != upcie_div_round_up(size, gran))
		return UPCIE_FAIL(-EINVAL,
				  "sglut: LUT of %zu entries for %" PRIu64 " bytes at granule "
				  "0x%" PRIx64,
				  nlut, size, gran);

	while (i < nsegs) {
		size_t first = i;
		uint64_t raddr = segs[i].addr, rlen = 0, rend;

		/* Gather the run: segments contiguous in device address space. */
		for (; i < nsegs; i++) {
			const struct upcie_sg_seg *s = &segs[i];
			uint64_t last, follow;

			if (!s->len)
				return UPCIE_FAIL(-EINVAL, "sglut: segment %zu has length 0", i);
			if (upcie_add_overflow(s->addr, s->len - 1, &last))
				return UPCIE_FAIL(-EINVAL,
						  "sglut: segment %zu (addr 0x%" PRIx64 " len "
						  "0x%" PRIx64 ") wraps the address space",
						  i, s->addr, s->len);
			/* A run ending at the top of the address space is followed by nothing. */
			if (i > first &&
			    (upcie_add_overflow(raddr, rlen, &follow) || s->addr != follow))
				break;
			if (s->len > size - done - rlen)
				return UPCIE_FAIL(-EINVAL,
						  "sglut: segment %zu (addr 0x%" PRIx64 " len "
						  "0x%" PRIx64
						  ") ends past the buffer size 0x%" PRIx64,
						  i, s->addr, s->len, size);
			rlen += s->len;
		}
		rend = done + rlen;
		if (!upcie_is_aligned(raddr, gran))
			return UPCIE_FAIL(-EINVAL,
					  "sglut: segment %zu starts at 0x%" PRIx64
					  " (buffer offset "
					  "0x%" PRIx64 "), not on a 0x%" PRIx64 " granule",
					  first, raddr, done, gran);
		if (!upcie_is_aligned(rlen, gran) && rend != size && i == nsegs) {
			done = rend; /* too few bytes: reported below */
			break;
		}
		if (!upcie_is_aligned(rlen, gran) && rend != size)
			return UPCIE_FAIL(-EINVAL,
					  "sglut: segment %zu ends at buffer offset 0x%" PRIx64
					  " inside a 0x%" PRIx64 " granule and segment %zu is not "
					  "contiguous with it",
					  i - 1, rend, gran, i);
		for (uint64_t o = 0; o < rlen; o += gran) {
			if (k >= nlut)
				return UPCIE_FAIL(-EINVAL, "sglut: more granules than LUT entries");
			lut[k++] = raddr + o;
		}
		done = rend;
	}
	if (done != size)
		return UPCIE_FAIL(-EINVAL,
				  "sglut: %zu segments describe 0x%" PRIx64
				  " bytes, the buffer has "
				  "0x%" PRIx64,
				  nsegs, done, size);
	return 0;
}

/*
 * Fill `mem` as a LUT dmamem of `size` bytes at granule 1 << granule_shift from a scatter list
 * (see upcie_sglut_fill()); `vaddr` is the CPU view or NULL. The dmamem owns only its LUT: the
 * dma-buf and its attachment stay the caller's and must outlive it. Returns 0, -EINVAL, -ENOMEM;
 * `mem` is zeroed on failure.
 */
static inline int upcie_dmamem_sglut(struct upcie_dmamem *mem, void *vaddr, uint64_t size,
				     unsigned granule_shift, const struct upcie_sg_seg *segs,
				     size_t nsegs)
{
	uint64_t n;
	uint64_t *lut;
	int err;

	if (!mem)
		return UPCIE_FAIL(-EINVAL, "sglut: NULL dmamem");
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	if (granule_shift < 12 || granule_shift > 30 || !size || size > SIZE_MAX)
		return UPCIE_FAIL(-EINVAL, "sglut: bad size 0x%" PRIx64 " or granule shift %u",
				  size, granule_shift);
	n = upcie_div_round_up(size, UINT64_C(1) << granule_shift);
	lut = (uint64_t *)malloc((size_t)n * sizeof(*lut));
	if (!lut)
		return UPCIE_FAIL(-ENOMEM, "sglut: out of host memory for %" PRIu64 " entries", n);
	err = upcie_sglut_fill(segs, nsegs, size, granule_shift, lut, (size_t)n);
	if (err) {
		free(lut);
		return err;
	}
	err = upcie_dmamem_init_lut(mem, vaddr, (size_t)size, granule_shift, lut, true);
	if (err)
		return err;
	mem->kind = "sglut";
	return 0;
}

#endif /* UPCIE_MEM_SGLUT_H */
