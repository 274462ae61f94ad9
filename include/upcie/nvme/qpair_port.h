/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The few operations through which the queue-pair core (qpair.h) touches memory shared with the
 * controller, so the same protocol code runs on the CPU and in CUDA or HIP device code.
 *
 * Host (C, C++, and the host pass of nvcc/hipcc): upcie barriers, plain 16-byte-capable copies,
 * volatile 32-bit loads/stores, CLOCK_MONOTONIC. CUDA device code (__CUDA_ARCH__): system-scope
 * fences (__threadfence_system), 16-byte vector stores, %globaltimer (ns). HIP device code
 * (__HIP_DEVICE_COMPILE__): system-scope fences, 16-byte vector stores, wall_clock64() at
 * UPCIE_NVME_HIP_WALLCLOCK_NS_PER_TICK ns per tick (default 10, a 100 MHz counter: check
 * hipDeviceAttributeWallClockRate on your GPU and define the macro before including).
 *
 * A device layer may replace the doorbell store by defining UPCIE_NVME_PORT_DOORBELL(db, v)
 * before this header, for instance with the cache-bypassing store sequence consumer RDNA GPUs
 * need (a fence plus a plain store can linger in their write path). Does not allocate, lock or
 * sleep; upcie_nvme_port_relax() is a spin hint only.
 */
#ifndef UPCIE_NVME_QPAIR_PORT_H
#define UPCIE_NVME_QPAIR_PORT_H

#include <upcie/base/feature.h>

#include <stdint.h>
#include <string.h>

#include <upcie/base/barrier.h>
#include <upcie/base/clock.h>
#include <upcie/base/compiler.h>
#include <upcie/nvme/spec.h>

#if defined(__CUDA_ARCH__)
#define UPCIE_NVME_PORT_CUDA_DEVICE 1
#elif defined(__HIP_DEVICE_COMPILE__)
#define UPCIE_NVME_PORT_HIP_DEVICE 1
#endif

#ifndef UPCIE_NVME_HIP_WALLCLOCK_NS_PER_TICK
#define UPCIE_NVME_HIP_WALLCLOCK_NS_PER_TICK 10
#endif

/* Order the queue-entry stores before the doorbell store that publishes them. */
UPCIE_HD static inline void upcie_nvme_port_wmb(void)
{
#if defined(UPCIE_NVME_PORT_CUDA_DEVICE) || defined(UPCIE_NVME_PORT_HIP_DEVICE)
	__threadfence_system();
#else
	upcie_wmb();
#endif
}

/* Order the phase-tag load before the loads of the rest of the completion entry. */
UPCIE_HD static inline void upcie_nvme_port_dma_rmb(void)
{
#if defined(UPCIE_NVME_PORT_CUDA_DEVICE) || defined(UPCIE_NVME_PORT_HIP_DEVICE)
	__threadfence_system();
#else
	upcie_dma_rmb();
#endif
}

/* A load the compiler must emit and, on a GPU, that bypasses the non-coherent L1. */
UPCIE_HD static inline uint32_t upcie_nvme_port_load32(const uint32_t *p)
{
	return *(const volatile uint32_t *)p;
}

#ifndef UPCIE_NVME_PORT_DOORBELL
#define UPCIE_NVME_PORT_DOORBELL(db, v) (*(db) = (v))
#endif

UPCIE_HD static inline void upcie_nvme_port_doorbell(volatile uint32_t *db, uint32_t v)
{
	UPCIE_NVME_PORT_DOORBELL(db, v);
}

/* Copy a command into its SQ slot with `cid` in place: four 16-byte stores. */
UPCIE_HD static inline void upcie_nvme_port_sqe_store(struct upcie_nvme_sqe *dst,
						      const struct upcie_nvme_sqe *src,
						      uint16_t cid)
{
#if defined(UPCIE_NVME_PORT_CUDA_DEVICE) || defined(UPCIE_NVME_PORT_HIP_DEVICE)
	const uint64_t *s = (const uint64_t *)src;
	ulonglong2 *d = (ulonglong2 *)dst;
	uint64_t w0 = (s[0] & ~(UINT64_C(0xffff) << 16)) | ((uint64_t)cid << 16);

	d[0] = make_ulonglong2(w0, s[1]);
	d[1] = make_ulonglong2(s[2], s[3]);
	d[2] = make_ulonglong2(s[4], s[5]);
	d[3] = make_ulonglong2(s[6], s[7]);
#else
	memcpy(dst, src, sizeof(*dst));
	dst->cid = cid;
#endif
}

/* Read the rest of a completion entry (after upcie_nvme_port_dma_rmb()); dw3 already read. */
UPCIE_HD static inline void upcie_nvme_port_cqe_load(struct upcie_nvme_cqe *dst,
						     const struct upcie_nvme_cqe *src, uint32_t dw3)
{
#if defined(UPCIE_NVME_PORT_CUDA_DEVICE) || defined(UPCIE_NVME_PORT_HIP_DEVICE)
	/* Volatile: a plain load could be served by a stale L1 line. */
	dst->dw0 = upcie_nvme_port_load32(&src->dw0);
	dst->dw1 = upcie_nvme_port_load32(&src->dw1);
	dst->dw2 = upcie_nvme_port_load32(&src->dw2);
	dst->dw3 = dw3;
#else
	/* Coherent host memory, ordered by the barrier: one 16-byte copy. The controller does not
	 * rewrite an entry before the head doorbell passes it, so dw3 reads the same again. */
	(void)dw3;
	memcpy(dst, src, sizeof(*dst));
#endif
}

/* Monotonic nanoseconds, for deadlines. */
UPCIE_HD static inline uint64_t upcie_nvme_port_time_ns(void)
{
#if defined(UPCIE_NVME_PORT_CUDA_DEVICE)
	uint64_t t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
#elif defined(UPCIE_NVME_PORT_HIP_DEVICE)
	return (uint64_t)wall_clock64() * UPCIE_NVME_HIP_WALLCLOCK_NS_PER_TICK;
#else
	return upcie_time_ns();
#endif
}

/* Spin-loop hint. */
UPCIE_HD static inline void upcie_nvme_port_relax(void)
{
#if defined(UPCIE_NVME_PORT_CUDA_DEVICE)
	__nanosleep(32);
#elif defined(UPCIE_NVME_PORT_HIP_DEVICE)
	__builtin_amdgcn_s_sleep(1);
#else
	upcie_cpu_relax();
#endif
}

#endif /* UPCIE_NVME_QPAIR_PORT_H */
