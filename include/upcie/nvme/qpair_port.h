/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The few operations through which the queue-pair core (qpair.h) touches memory shared with the
 * controller, so the same protocol code runs on the CPU and in CUDA or HIP device code.
 *
 * Host (C, C++, and the host pass of nvcc/hipcc): upcie barriers, plain 16-byte-capable copies,
 * volatile 32-bit loads/stores, CLOCK_MONOTONIC. CUDA device code (__CUDA_ARCH__): system-scope
 * fences (__threadfence_system), 16-byte vector stores cached at L2 only (st.global.cg),
 * %globaltimer (ns). HIP device code
 * (__HIP_DEVICE_COMPILE__), through base/arch_hip.h: system-scope fences (the builtin
 * __threadfence_system() stands for, so no device library is needed) and a system-scope acquire
 * after the phase tag, 16-byte vector stores, doorbell stores with the RDNA cache-bypassing
 * sequence on GFX10/GFX11, completion loads with every cache-policy bit the target has
 * (invalidating GL0/GL1 first on RDNA), and the wall clock (wall_clock64()'s counter, never
 * clock64()).
 *
 * Time: upcie_nvme_port_clock() reads the target's clock in its own ticks and
 * upcie_nvme_port_ticks() turns nanoseconds into ticks at a rate in kHz, which the caller
 * carries: nanoseconds (UPCIE_NVME_PORT_NS_KHZ) on the host and in CUDA, and on HIP the rate
 * hipDeviceAttributeWallClockRate reports, which differs between GPUs, so no rate is assumed
 * here (a queue pair keeps it in clock_khz). upcie_nvme_port_time_ns() exists only where the
 * clock counts nanoseconds, so HIP device code cannot call it.
 *
 * A device layer may replace the doorbell store by defining UPCIE_NVME_PORT_DOORBELL(db, v)
 * before this header, and a test the clock by defining UPCIE_NVME_PORT_CLOCK() (ticks, as
 * upcie_nvme_port_clock()). Does not allocate, lock or sleep; upcie_nvme_port_relax() is a
 * spin hint only.
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

#if defined(__HIPCC__)
#include <upcie/base/arch_hip.h>
#endif

#if defined(__CUDA_ARCH__)
#define UPCIE_NVME_PORT_CUDA_DEVICE 1
#elif defined(__HIP_DEVICE_COMPILE__)
#define UPCIE_NVME_PORT_HIP_DEVICE 1
#endif

/* The rate of a clock counting nanoseconds, in ticks per millisecond. */
#define UPCIE_NVME_PORT_NS_KHZ UINT32_C(1000000)

/* Order the queue-entry stores before the doorbell store that publishes them. */
UPCIE_HD static inline void upcie_nvme_port_wmb(void)
{
#if defined(UPCIE_NVME_PORT_CUDA_DEVICE)
	__threadfence_system();
#elif defined(UPCIE_NVME_PORT_HIP_DEVICE)
	upcie_gpu_hip_threadfence_system();
#else
	upcie_wmb();
#endif
}

/*
 * Order the phase-tag load before the loads of the rest of the completion entry, and before the
 * callback's loads of what the controller wrote ahead of the entry. In CUDA device code the
 * system fence is MEMBAR.SC.SYS and CCTL.IVALL (L1 invalidated: the callback's plain loads of a
 * payload are not served from stale L1 lines); in HIP device code a system-scope acquire
 * (base/arch_hip.h). A test may substitute another through UPCIE_NVME_PORT_DMA_RMB() (the
 * negative control of the stale-read test defines it empty).
 */
UPCIE_HD static inline void upcie_nvme_port_dma_rmb(void)
{
#if defined(UPCIE_NVME_PORT_DMA_RMB)
	UPCIE_NVME_PORT_DMA_RMB();
#elif defined(UPCIE_NVME_PORT_CUDA_DEVICE)
	__threadfence_system();
#elif defined(UPCIE_NVME_PORT_HIP_DEVICE)
	upcie_gpu_hip_acquire_system();
#else
	upcie_dma_rmb();
#endif
}

/*
 * Order the loads of the completion entries just processed (the callbacks' included) before the
 * CQ head doorbell store that lets the controller reuse them. On aarch64 a load may otherwise be
 * satisfied after a later store is visible (dmb oshld orders earlier loads before later loads and
 * stores); x86-64 never reorders a load after a later store, so there it is a compiler barrier.
 * Device code reads each entry through volatile loads into a copy before the callbacks run and
 * keeps the doorbell store as it was: no fence.
 */
UPCIE_HD static inline void upcie_nvme_port_cq_release(void)
{
#if !defined(UPCIE_NVME_PORT_CUDA_DEVICE) && !defined(UPCIE_NVME_PORT_HIP_DEVICE)
	upcie_dma_rmb();
#endif
}

/*
 * A load the compiler must emit and, on a GPU, that bypasses the non-coherent L1 (on RDNA after
 * invalidating GL0/GL1: an entry another agent wrote into host memory is not snooped there).
 */
UPCIE_HD static inline uint32_t upcie_nvme_port_load32(const uint32_t *p)
{
#if defined(UPCIE_NVME_PORT_HIP_DEVICE)
	return upcie_gpu_hip_poll_load32(p);
#else
	return *(const volatile uint32_t *)p;
#endif
}

#ifndef UPCIE_NVME_PORT_DOORBELL
#if defined(UPCIE_NVME_PORT_HIP_DEVICE)
#define UPCIE_NVME_PORT_DOORBELL(db, v) upcie_gpu_hip_doorbell_store((db), (v))
#else
#define UPCIE_NVME_PORT_DOORBELL(db, v) (*(db) = (v))
#endif
#endif

/*
 * Ring a doorbell: store `v` to `db` as the device layer defines it (UPCIE_NVME_PORT_DOORBELL),
 * so one core serves host, CUDA and HIP queues. Ordering against the entries is the caller's.
 */
UPCIE_HD static inline void upcie_nvme_port_doorbell(volatile uint32_t *db, uint32_t v)
{
	UPCIE_NVME_PORT_DOORBELL(db, v);
}

/*
 * One 16-byte store of (lo, hi) to a 16-byte aligned address. In CUDA device code it is
 * st.global.cg.v2.u64: cached at L2 only, so the L2 merges the stores of one entry into whole
 * sectors before a device fetches them (or before they cross PCIe, for host memory), rather than
 * each store travelling on its own. `dst` must be global memory (device memory or host memory
 * mapped into the GPU), never shared or local memory.
 */
UPCIE_HD static inline void upcie_nvme_port_store16(void *dst, uint64_t lo, uint64_t hi)
{
#if defined(UPCIE_NVME_PORT_CUDA_DEVICE)
	asm volatile("st.global.cg.v2.u64 [%0], {%1, %2};" ::"l"(dst), "l"(lo), "l"(hi) : "memory");
#elif defined(UPCIE_NVME_PORT_HIP_DEVICE)
	*(ulonglong2 *)dst = make_ulonglong2(lo, hi);
#else
	uint64_t v[2] = { lo, hi };

	memcpy(dst, v, sizeof(v));
#endif
}

/* Copy a command into its SQ slot with `cid` in place: four 16-byte stores. */
UPCIE_HD static inline void upcie_nvme_port_sqe_store(struct upcie_nvme_sqe *dst,
						      const struct upcie_nvme_sqe *src,
						      uint16_t cid)
{
#if defined(UPCIE_NVME_PORT_CUDA_DEVICE) || defined(UPCIE_NVME_PORT_HIP_DEVICE)
	/* Field by field, not through a cast: a command built in registers stays there (no local
	 * memory, which a kernel launched beside a resident one may have to wait for). */
	char *d = (char *)dst;
	uint64_t w0 = src->opc | ((uint64_t)src->flags << 8) | ((uint64_t)cid << 16) |
		      ((uint64_t)src->nsid << 32);

	upcie_nvme_port_store16(d, w0, src->cdw2 | ((uint64_t)src->cdw3 << 32));
	upcie_nvme_port_store16(d + 16, src->mptr, src->prp1);
	upcie_nvme_port_store16(d + 32, src->prp2, src->cdw10 | ((uint64_t)src->cdw11 << 32));
	upcie_nvme_port_store16(d + 48, src->cdw12 | ((uint64_t)src->cdw13 << 32),
				src->cdw14 | ((uint64_t)src->cdw15 << 32));
#else
	memcpy(dst, src, sizeof(*dst));
	dst->cid = cid;
#endif
}

#if defined(__CUDACC__)
/*
 * One 16-byte volatile load from global memory (ld.volatile.global.v4.u32: past the L1, so an
 * entry another agent wrote is seen; a controller's 16-byte CQE write arrives whole in the L2,
 * so all four words come from the same write). CUDA device code only.
 */
__device__ static inline uint4 upcie_nvme_port_ld16(const void *p)
{
	uint4 v;

	asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
		     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
		     : "l"(p)
		     : "memory");
	return v;
}

#endif

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

/*
 * The completion entry `src` as reap hands it to a callback (after upcie_nvme_port_dma_rmb(); dw3
 * already read). Host: `src` itself, in coherent memory, ordered by the barrier; the controller
 * does not rewrite an entry before the head doorbell passes it, which reap writes only after the
 * callbacks. Device code: a copy in *tmp through upcie_nvme_port_cqe_load() (volatile loads).
 */
UPCIE_HD static inline const struct upcie_nvme_cqe *
upcie_nvme_port_cqe_view(struct upcie_nvme_cqe *tmp, const struct upcie_nvme_cqe *src, uint32_t dw3)
{
#if defined(UPCIE_NVME_PORT_CUDA_DEVICE) || defined(UPCIE_NVME_PORT_HIP_DEVICE)
	upcie_nvme_port_cqe_load(tmp, src, dw3);
	return tmp;
#else
	(void)tmp;
	(void)dw3;
	return src;
#endif
}

#if !defined(UPCIE_NVME_PORT_HIP_DEVICE)
/* Monotonic nanoseconds (host and CUDA; HIP device code has ticks at a reported rate only). */
UPCIE_HD static inline uint64_t upcie_nvme_port_time_ns(void)
{
#if defined(UPCIE_NVME_PORT_CUDA_DEVICE)
	uint64_t t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
#else
	return upcie_time_ns();
#endif
}
#endif

/* The deadline clock in its own ticks: nanoseconds, or HIP's wall-clock counter. */
UPCIE_HD static inline uint64_t upcie_nvme_port_clock(void)
{
#if defined(UPCIE_NVME_PORT_CLOCK)
	return UPCIE_NVME_PORT_CLOCK();
#elif defined(UPCIE_NVME_PORT_HIP_DEVICE)
	return upcie_gpu_hip_wall_clock();
#else
	return upcie_nvme_port_time_ns();
#endif
}

/*
 * Ticks of a clock running at `khz` (ticks per millisecond) in `ns` nanoseconds, rounded down,
 * saturating at UINT64_MAX (a timeout of UINT64_MAX stays "no limit"). A rate of 0 is taken as
 * nanoseconds.
 */
UPCIE_HD static inline uint64_t upcie_nvme_port_ticks(uint64_t ns, uint32_t khz)
{
	uint64_t ms = ns / 1000000u, rest = ns % 1000000u;

	if (!khz || khz == UPCIE_NVME_PORT_NS_KHZ || ns == UINT64_MAX)
		return ns;
	if (ms > (UINT64_MAX - UINT64_C(0xffffffff)) / khz)
		return UINT64_MAX;
	return ms * khz + rest * khz / 1000000u;
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
