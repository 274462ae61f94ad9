/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * MMIO register accessors for mapped device BARs.
 *
 * Each access is exactly one load or store of the stated width through a volatile pointer, so
 * the compiler neither merges, splits nor elides it. The accessors do not order themselves against
 * normal memory: put upcie_wmb() (barrier.h) between filling a descriptor and ringing a doorbell.
 * 64-bit registers that a device only accepts as two 32-bit halves (low first) have _lohi variants.
 * `base` is the mapping of the BAR, `off` the byte offset of the register.
 */
#ifndef UPCIE_BASE_MMIO_H
#define UPCIE_BASE_MMIO_H

#include <upcie/base/feature.h>

#include <stddef.h>
#include <stdint.h>

/* One 32-bit load of the register at `off`. */
static inline uint32_t upcie_mmio_read32(const volatile void *base, size_t off)
{
	return *(const volatile uint32_t *)((const volatile char *)base + off);
}

/* One 32-bit store to the register at `off`; not ordered after normal memory (upcie_wmb()). */
static inline void upcie_mmio_write32(volatile void *base, size_t off, uint32_t val)
{
	*(volatile uint32_t *)((volatile char *)base + off) = val;
}

/* One 64-bit load; for devices that accept 64-bit accesses (else the _lohi variant). */
static inline uint64_t upcie_mmio_read64(const volatile void *base, size_t off)
{
	return *(const volatile uint64_t *)((const volatile char *)base + off);
}

/* One 64-bit store; for devices that accept 64-bit accesses (else the _lohi variant). */
static inline void upcie_mmio_write64(volatile void *base, size_t off, uint64_t val)
{
	*(volatile uint64_t *)((volatile char *)base + off) = val;
}

/* 64-bit register as two 32-bit reads, low half first. */
static inline uint64_t upcie_mmio_read64_lohi(const volatile void *base, size_t off)
{
	uint64_t lo = upcie_mmio_read32(base, off);
	uint64_t hi = upcie_mmio_read32(base, off + 4);

	return lo | (hi << 32);
}

/* 64-bit register as two 32-bit writes, low half first. */
static inline void upcie_mmio_write64_lohi(volatile void *base, size_t off, uint64_t val)
{
	upcie_mmio_write32(base, off, (uint32_t)val);
	upcie_mmio_write32(base, off + 4, (uint32_t)(val >> 32));
}

#endif /* UPCIE_BASE_MMIO_H */
