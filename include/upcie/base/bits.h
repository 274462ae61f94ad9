/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Bit-field, alignment and overflow helpers.
 *
 * Pure integer arithmetic with no dependencies; usable in host and device code (UPCIE_HD).
 * Alignment helpers require a power-of-two alignment; upcie_is_pow2() checks one.
 */
#ifndef UPCIE_BASE_BITS_H
#define UPCIE_BASE_BITS_H

#include <upcie/base/feature.h>

#include <stdbool.h>
#include <stdint.h>

#include <upcie/base/compiler.h>

/* Extract the field of `width` bits at `shift` from `val`. */
UPCIE_HD static inline uint64_t upcie_bits_get(uint64_t val, unsigned shift, unsigned width)
{
	if (width >= 64)
		return val >> shift;
	return (val >> shift) & ((UINT64_C(1) << width) - 1);
}

/* Return `val` with the `width`-bit field at `shift` replaced by `field` (truncated to width). */
UPCIE_HD static inline uint64_t upcie_bits_set(uint64_t val, unsigned shift, unsigned width,
					       uint64_t field)
{
	uint64_t mask = (width >= 64) ? ~UINT64_C(0) : ((UINT64_C(1) << width) - 1);

	return (val & ~(mask << shift)) | ((field & mask) << shift);
}

/* True for a power of two; 0 is not one (align and size checks rely on that). */
UPCIE_HD static inline bool upcie_is_pow2(uint64_t x)
{
	return x && !(x & (x - 1));
}

/* `x` rounded down to a multiple of `align`, which must be a power of two. */
UPCIE_HD static inline uint64_t upcie_align_down(uint64_t x, uint64_t align)
{
	return x & ~(align - 1);
}

/*
 * `x` rounded up to a multiple of `align` (a power of two); wraps to 0 past UINT64_MAX, so
 * callers that take sizes from outside check with upcie_add_overflow() first.
 */
UPCIE_HD static inline uint64_t upcie_align_up(uint64_t x, uint64_t align)
{
	return (x + align - 1) & ~(align - 1);
}

/* True when `x` is a multiple of `align` (a power of two). */
UPCIE_HD static inline bool upcie_is_aligned(uint64_t x, uint64_t align)
{
	return (x & (align - 1)) == 0;
}

/* x / d rounded up, without the overflow of (x + d - 1) / d near UINT64_MAX; `d` non-zero. */
UPCIE_HD static inline uint64_t upcie_div_round_up(uint64_t x, uint64_t d)
{
	return x / d + (x % d != 0);
}

/* Floor of log2(x); x must be non-zero. */
UPCIE_HD static inline unsigned upcie_log2(uint64_t x)
{
	return 63u - (unsigned)__builtin_clzll(x);
}

/* *sum = a + b; returns true when that overflowed (then *sum is unspecified). */
static inline bool upcie_add_overflow(uint64_t a, uint64_t b, uint64_t *sum)
{
	return __builtin_add_overflow(a, b, sum);
}

/* *prod = a * b; returns true when that overflowed (then *prod is unspecified). */
static inline bool upcie_mul_overflow(uint64_t a, uint64_t b, uint64_t *prod)
{
	return __builtin_mul_overflow(a, b, prod);
}

#endif /* UPCIE_BASE_BITS_H */
