/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Memory barriers for host code that shares memory with devices.
 *
 * upcie_wmb()/upcie_rmb()/upcie_mb() order CPU accesses against device-visible accesses of any
 * memory type, including MMIO and write-combining mappings (use upcie_wmb() before a doorbell).
 * upcie_dma_wmb()/upcie_dma_rmb() order accesses to coherent DMA memory only (descriptor
 * contents, completion entries); they are cheaper and enough between "read the phase bit" and
 * "read the rest of the completion". x86-64 and aarch64 are supported; other targets fail to
 * compile rather than run without barriers.
 */
#ifndef UPCIE_BASE_BARRIER_H
#define UPCIE_BASE_BARRIER_H

#include <upcie/base/feature.h>

#define upcie_barrier() __asm__ __volatile__("" ::: "memory")

#if defined(__x86_64__)
#define upcie_mb()  __asm__ __volatile__("mfence" ::: "memory")
#define upcie_rmb() __asm__ __volatile__("lfence" ::: "memory")
#define upcie_wmb() __asm__ __volatile__("sfence" ::: "memory")
/* x86-64 is TSO for write-back memory: compiler ordering is enough. */
#define upcie_dma_rmb()	  upcie_barrier()
#define upcie_dma_wmb()	  upcie_barrier()
#define upcie_cpu_relax() __asm__ __volatile__("pause" ::: "memory")
#elif defined(__aarch64__)
#define upcie_mb()	  __asm__ __volatile__("dsb sy" ::: "memory")
#define upcie_rmb()	  __asm__ __volatile__("dsb ld" ::: "memory")
#define upcie_wmb()	  __asm__ __volatile__("dsb st" ::: "memory")
#define upcie_dma_rmb()	  __asm__ __volatile__("dmb oshld" ::: "memory")
#define upcie_dma_wmb()	  __asm__ __volatile__("dmb oshst" ::: "memory")
#define upcie_cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#error "upcie: barriers are only defined for x86-64 and aarch64"
#endif

#endif /* UPCIE_BASE_BARRIER_H */
