/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * AMD GPU instruction-level helpers for HIP device code: the GPU family, the wall clock, the
 * system-scope fence, the doorbell store and the completion poll load. The queue-pair core
 * (nvme/qpair_port.h) and the HIP device layer (nvme/gqp_hip.h) use these; nothing else should
 * need to know the family.
 *
 * Family. Decided once, here: UPCIE_GPU_HIP_GFX is 6..12 in device code (0 in host code) and
 * UPCIE_GPU_HIP_RDNA is 1 for GFX10 and GFX11. It comes from clang's family macros
 * (__GFX9__, __GFX10__, __GFX11__, __GFX12__), which clang defines for the specific targets
 * (gfx1101) and for the generic ones (gfx11-generic, clang 19 and newer) alike; clang 15, the
 * ROCm 5.2 compiler of Debian 12, defines __GFX11__ for gfx1101. Only a compiler without family
 * macros falls back to the specific __gfxNNNN__ macros; a target recognised by neither is a
 * compile error, never a silent fall-through to the weaker non-RDNA sequences.
 *
 * Doorbell store (upcie_gpu_hip_doorbell_store()). On consumer RDNA (GFX10/GFX11) a system fence
 * plus a plain store can linger in the GPU's write path until the kernel exits, unseen by the CPU
 * poller that relays it or by a peer. The store is therefore: wait for every outstanding memory
 * operation (s_waitcnt vmcnt/lgkmcnt and vscnt), store with glc slc dlc (bypassing every cache
 * level), wait again, then invalidate GL1 and GL0. Elsewhere (CDNA, GCN) it is
 * upcie_gpu_hip_threadfence_system() and a volatile store. GFX12 changed the cache-policy bits
 * and the invalidate instructions; no compiler available here targets it, so the sequence for it
 * is not written and GFX12 device code does not compile (an error, not a weaker store).
 *
 * Poll load (upcie_gpu_hip_poll_load32()). A peer's DMA into host memory does not snoop the GPU's
 * caches, and on gfx1101 neither a system-scope atomic load nor a non-temporal one was enough to
 * see a CPU's update of a relayed completion: on RDNA the load is preceded by buffer_gl1_inv and
 * buffer_gl0_inv. Elsewhere it is a relaxed system-scope atomic load (glc).
 *
 * Wall clock (upcie_gpu_hip_wall_clock()). The fixed-frequency counter wall_clock64() reads, whose
 * rate hipDeviceAttributeWallClockRate reports (kHz); never clock64(), which on gfx1101 counts
 * at a fraction of hipDeviceAttributeClockRate. ROCm 5.2's wall_clock64() compiles to the
 * constant -1 on GFX11 (its only source, s_memrealtime, is gone there), so on GFX11 and newer the
 * counter is read with s_sendmsg_rtn_b64 MSG_RTN_GET_REALTIME; elsewhere wall_clock64() is used.
 *
 * Fence (upcie_gpu_hip_threadfence_system()). What __threadfence_system() is: a sequentially
 * consistent fence at system scope. Spelled as the compiler builtin because ROCm 5.2's
 * __threadfence_system() is a call into the device library, which ROCm 5.2 does not ship for
 * GFX11: the device code here needs no device library at all (it builds with -nogpulib).
 *
 * tests/hip/check-disasm.sh compiles these for gfx90a, gfx1030 and gfx1101 and checks the
 * instructions in the disassembly; trust that, not the #if. Host code sees only the macros.
 */
#ifndef UPCIE_GPU_ARCH_HIP_H
#define UPCIE_GPU_ARCH_HIP_H

#include <upcie/base/feature.h>

#include <stdint.h>

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#endif

#if defined(__HIP_DEVICE_COMPILE__) && defined(__AMDGCN__)
#if defined(__GFX12__)
#define UPCIE_GPU_HIP_GFX 12
#elif defined(__GFX11__)
#define UPCIE_GPU_HIP_GFX 11
#elif defined(__GFX10__)
#define UPCIE_GPU_HIP_GFX 10
#elif defined(__GFX9__)
#define UPCIE_GPU_HIP_GFX 9
#elif defined(__GFX8__)
#define UPCIE_GPU_HIP_GFX 8
#elif defined(__GFX7__)
#define UPCIE_GPU_HIP_GFX 7
#elif defined(__GFX6__)
#define UPCIE_GPU_HIP_GFX 6
/* A compiler without family macros: the specific targets, the only fallback. */
#elif defined(__gfx1200__) || defined(__gfx1201__)
#define UPCIE_GPU_HIP_GFX 12
#elif defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) ||                      \
    defined(__gfx1103__) || defined(__gfx1150__) || defined(__gfx1151__) ||                        \
    defined(__gfx1152__) || defined(__gfx1153__)
#define UPCIE_GPU_HIP_GFX 11
#elif defined(__gfx1010__) || defined(__gfx1011__) || defined(__gfx1012__) ||                      \
    defined(__gfx1013__) || defined(__gfx1030__) || defined(__gfx1031__) ||                        \
    defined(__gfx1032__) || defined(__gfx1033__) || defined(__gfx1034__) ||                        \
    defined(__gfx1035__) || defined(__gfx1036__)
#define UPCIE_GPU_HIP_GFX 10
#elif defined(__gfx900__) || defined(__gfx902__) || defined(__gfx904__) || defined(__gfx906__) ||  \
    defined(__gfx908__) || defined(__gfx909__) || defined(__gfx90a__) || defined(__gfx90c__) ||    \
    defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || defined(__gfx950__)
#define UPCIE_GPU_HIP_GFX 9
#else
#error                                                                                             \
    "upcie: cannot tell the GPU family of this target (no __GFXnn__ and no known __gfxNNNN__ macro): refusing to pick a doorbell sequence by default; extend gpu/arch_hip.h"
#endif
#else
#define UPCIE_GPU_HIP_GFX 0 /* host code */
#endif

#if UPCIE_GPU_HIP_GFX == 10 || UPCIE_GPU_HIP_GFX == 11
#define UPCIE_GPU_HIP_RDNA 1
#else
#define UPCIE_GPU_HIP_RDNA 0
#endif

/*
 * For tests/hip/check-disasm.sh only: compile an RDNA target as if the gate had not matched (what
 * gating on a specific __gfxNNNN__ macro does on a generic target), to prove that the check
 * reports the missing sequence. Never define it in a build that runs.
 */
#if defined(UPCIE_GPU_HIP_TEST_GATE_OFF)
#undef UPCIE_GPU_HIP_RDNA
#define UPCIE_GPU_HIP_RDNA 0
#endif

#if UPCIE_GPU_HIP_GFX >= 12
#error                                                                                             \
    "upcie: GFX12 device code: the doorbell store and completion poll sequences for GFX12 (new cache-policy bits, global_inv) are not written, since no compiler here targets it; see gpu/arch_hip.h"
#endif

#if defined(__HIPCC__)

#if defined(__HIP_DEVICE_COMPILE__)

__device__ static inline void upcie_gpu_hip_threadfence_system(void)
{
	__builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "");
}

__device__ static inline uint64_t upcie_gpu_hip_wall_clock(void)
{
#if UPCIE_GPU_HIP_GFX >= 11
	uint64_t t;

	__asm__ __volatile__("s_sendmsg_rtn_b64 %0, sendmsg(MSG_RTN_GET_REALTIME)\n\t"
			     "s_waitcnt lgkmcnt(0)"
			     : "=s"(t)
			     :
			     : "memory");
	return t;
#else
	return (uint64_t)wall_clock64();
#endif
}

__device__ static inline void upcie_gpu_hip_doorbell_store(volatile uint32_t *db, uint32_t v)
{
#if UPCIE_GPU_HIP_RDNA
	__asm__ __volatile__("s_waitcnt vmcnt(0) lgkmcnt(0)\n\t"
			     "s_waitcnt_vscnt null, 0x0\n\t"
			     "global_store_dword %0, %1, off glc slc dlc\n\t"
			     "s_waitcnt vmcnt(0) lgkmcnt(0)\n\t"
			     "s_waitcnt_vscnt null, 0x0\n\t"
			     "buffer_gl1_inv\n\t"
			     "buffer_gl0_inv"
			     :
			     : "v"(db), "v"(v)
			     : "memory");
#else
	upcie_gpu_hip_threadfence_system();
	*db = v;
#endif
}

__device__ static inline uint32_t upcie_gpu_hip_poll_load32(const uint32_t *p)
{
#if UPCIE_GPU_HIP_RDNA
	__asm__ __volatile__("buffer_gl1_inv\n\tbuffer_gl0_inv" ::: "memory");
	return *(const volatile uint32_t *)p;
#else
	return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
#endif
}

#else /* the host pass of hipcc parses device functions but never emits them */

__device__ static inline void upcie_gpu_hip_threadfence_system(void)
{
}

__device__ static inline uint64_t upcie_gpu_hip_wall_clock(void)
{
	return 0;
}

__device__ static inline void upcie_gpu_hip_doorbell_store(volatile uint32_t *db, uint32_t v)
{
	*db = v;
}

__device__ static inline uint32_t upcie_gpu_hip_poll_load32(const uint32_t *p)
{
	return *(const volatile uint32_t *)p;
}

#endif /* __HIP_DEVICE_COMPILE__ */

#endif /* __HIPCC__ */

#endif /* UPCIE_GPU_ARCH_HIP_H */
