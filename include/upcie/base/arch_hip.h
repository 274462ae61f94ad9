/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * AMD GPU instruction-level helpers for HIP device code: the GPU family, the wall clock, the
 * system-scope fence, the doorbell store and the completion poll load. The queue-pair core
 * (nvme/qpair_port.h) and the HIP device layer (gpuq/gqp_hip.h) use these; nothing else should
 * need to know the family. It sits in base/ because the host driver's portable queue core needs
 * it whenever hipcc compiles it (the host pass parses device functions too), and the host
 * driver includes nothing from gpu/; it needs only the compiler and, under hipcc,
 * <hip/hip_runtime.h>. The names keep the upcie_gpu_hip_ prefix: they are GPU instructions.
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
 * upcie_gpu_hip_threadfence_system() and a volatile store.
 *
 * GFX12 (RDNA4, gfx1200/gfx1201): refused at compile time. Its memory model is not GFX11's with
 * new names: loads and stores carry a scope (SCOPE_SYS) and temporal hints instead of glc slc
 * dlc, and the cache invalidates are global_inv/global_wb, so each sequence here would have to
 * be written anew. Only LLVM 18 and newer compile for GFX12; clang 15 (ROCm 5.2, Debian 12's
 * hipcc, the compiler this project builds and checks HIP code with) rejects gfx1200 and
 * gfx12-generic, so such sequences could be neither compiled nor proven in the disassembly
 * check. A GFX12 build stops with an error naming this, rather than falling back to the GFX11
 * sequence (whose glc slc dlc bits do not exist there) or to the unchecked CDNA one.
 *
 * Poll loads (upcie_gpu_hip_poll_load32(), _load32x2(), _load128()): how GPU code reads what
 * another agent (a controller, the CPU) writes: a completion entry, a flag. Written in inline
 * assembly with every cache-policy bit the target has for it, because the compiler gives either
 * volatile (glc dlc) or non-temporal (slc), never both, and turns a non-temporal load of
 * read-only memory into a scalar load through the constant cache:
 *   GFX10, GFX11  glc slc dlc: GL0 and GL1 miss-evict, GL2 stream; preceded by buffer_gl1_inv
 *                 and buffer_gl0_inv (on gfx1101 neither a system-scope atomic load nor a
 *                 non-temporal one was enough to see a CPU's update of a relayed completion)
 *   gfx940        sc0 sc1 nt: system scope, non-temporal
 *   other GFX9    glc slc: L1 miss, L2 stream
 * No GFX9-GFX11 load bypasses the L2 itself (LLVM's AMDGPU memory model: "there is no L2 cache
 * bypass control at the ISA level"). For a CQ in VRAM the L2 is kept out by the memory's type:
 * gpuq/gqp_host_hip.h and the completion mirror allocate such CQs uncached
 * (hipDeviceMallocUncached, else fine-grained). Each load waits for itself (s_waitcnt
 * vmcnt(0)) inside the assembly, since the compiler does not track loads it did not emit.
 * GFX6-GFX8 have no global memory instructions and are refused.
 *
 * Stores another agent polls (a completion entry relayed to host memory, then its tag):
 * upcie_gpu_hip_store128_sys() for the entry (glc slc dlc on RDNA), then
 * upcie_gpu_hip_doorbell_store() for the word the reader polls, whose leading drain (RDNA) or
 * system fence (elsewhere) orders the entry before it.
 *
 * Acquire (upcie_gpu_hip_acquire_system()): a system-scope acquire fence, what orders the loads
 * of a completion entry, and of the data the controller wrote before it, after the load that saw
 * its phase tag: on RDNA s_waitcnt then buffer_gl0_inv, buffer_gl1_inv (that order; the poll's
 * own invalidates come the other way round); on gfx90a buffer_invl2, buffer_wbinvl1_vol; on
 * gfx940 buffer_inv sc0 sc1.
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
 * tests/hip/check-disasm.sh compiles these for gfx90a, gfx940, gfx1030 and gfx1101 and checks
 * the instructions in the disassembly; trust that, not the #if. Host code sees only the macros.
 * UPCIE_GPU_HIP_TEST_* macros exist for that check's negative controls only: each removes one
 * rule, and the check must then fail. Never define them in a build that runs.
 */
#ifndef UPCIE_BASE_ARCH_HIP_H
#define UPCIE_BASE_ARCH_HIP_H

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
    "upcie: cannot tell the GPU family of this target (no __GFXnn__ and no known __gfxNNNN__ macro): refusing to pick a doorbell sequence by default; extend base/arch_hip.h"
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

#if UPCIE_GPU_HIP_GFX != 0 && UPCIE_GPU_HIP_GFX < 9
#error                                                                                             \
    "upcie: GFX6-GFX8 are not supported: no global memory instructions for the completion poll loads, and nothing here was checked on them; see base/arch_hip.h"
#endif

/* The poll loads' mnemonics and cache-policy bits (see above). */
#if UPCIE_GPU_HIP_GFX == 11
#define UPCIE_GPU_HIP_LD32_  "global_load_b32"
#define UPCIE_GPU_HIP_LD128_ "global_load_b128"
#define UPCIE_GPU_HIP_ST128_ "global_store_b128"
#else
#define UPCIE_GPU_HIP_LD32_  "global_load_dword"
#define UPCIE_GPU_HIP_LD128_ "global_load_dwordx4"
#define UPCIE_GPU_HIP_ST128_ "global_store_dwordx4"
#endif
#if defined(UPCIE_GPU_HIP_TEST_POLL_PLAIN)
#define UPCIE_GPU_HIP_POLL_BITS_ "" /* negative control only */
#elif UPCIE_GPU_HIP_RDNA
#define UPCIE_GPU_HIP_POLL_BITS_ "glc slc dlc"
#elif defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || defined(__gfx950__) ||  \
    defined(__gfx9_4_generic__)
#define UPCIE_GPU_HIP_POLL_BITS_ "sc0 sc1 nt"
#else
#define UPCIE_GPU_HIP_POLL_BITS_ "glc slc"
#endif
#if UPCIE_GPU_HIP_RDNA
#define UPCIE_GPU_HIP_POLL_INV_ "buffer_gl1_inv\n\tbuffer_gl0_inv\n\t"
#else
#define UPCIE_GPU_HIP_POLL_INV_ ""
#endif

#if UPCIE_GPU_HIP_GFX >= 12
#error                                                                                             \
    "upcie: GFX12 (RDNA4) is not supported: its doorbell store, completion poll and fence sequences (SCOPE_SYS loads/stores, global_inv/global_wb) are not written, because the compiler upcie is checked with (clang 15, ROCm 5.2) cannot target GFX12 (LLVM 18 and newer can), so they could not be proven in disassembly; see base/arch_hip.h"
#endif

#if defined(__HIPCC__)

/* Four 32-bit words, as one 16-byte load returns them. */
typedef uint32_t upcie_gpu_hip_u32x4 __attribute__((ext_vector_type(4)));

#if defined(__HIP_DEVICE_COMPILE__)

/* What __threadfence_system() is: a sequentially consistent fence at system scope. */
__device__ static inline void upcie_gpu_hip_threadfence_system(void)
{
	__builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "");
}

/* The fixed-frequency wall clock (rate: hipDeviceAttributeWallClockRate, kHz). */
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

/*
 * Store `v` to the doorbell (or a flag another agent polls) so that it leaves the GPU now and
 * after everything before it (see above for the RDNA sequence).
 */
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

/* Load a word another agent writes, past the GPU's caches (see above); waits for itself. */
__device__ static inline uint32_t upcie_gpu_hip_poll_load32(const uint32_t *p)
{
	uint32_t v;

	__asm__ __volatile__(UPCIE_GPU_HIP_POLL_INV_ UPCIE_GPU_HIP_LD32_
			     " %0, %1, off " UPCIE_GPU_HIP_POLL_BITS_ "\n\t"
			     "s_waitcnt vmcnt(0)"
			     : "=v"(v)
			     : "v"(p)
			     : "memory");
	return v;
}

/* Two poll loads in flight at once (one latency): *va = *a, *vb = *b. */
__device__ static inline void upcie_gpu_hip_poll_load32x2(const uint32_t *a, const uint32_t *b,
							  uint32_t *va, uint32_t *vb)
{
	uint32_t x, y;

	__asm__ __volatile__(UPCIE_GPU_HIP_POLL_INV_ UPCIE_GPU_HIP_LD32_
			     " %0, %2, off " UPCIE_GPU_HIP_POLL_BITS_ "\n\t" UPCIE_GPU_HIP_LD32_
			     " %1, %3, off " UPCIE_GPU_HIP_POLL_BITS_ "\n\t"
			     "s_waitcnt vmcnt(0)"
			     : "=&v"(x), "=&v"(y)
			     : "v"(a), "v"(b)
			     : "memory");
	*va = x;
	*vb = y;
}

/* One 16-byte poll load of a 16-byte aligned address (a whole completion entry). */
__device__ static inline upcie_gpu_hip_u32x4 upcie_gpu_hip_poll_load128(const void *p)
{
	upcie_gpu_hip_u32x4 v;

	__asm__ __volatile__(UPCIE_GPU_HIP_POLL_INV_ UPCIE_GPU_HIP_LD128_
			     " %0, %1, off " UPCIE_GPU_HIP_POLL_BITS_ "\n\t"
			     "s_waitcnt vmcnt(0)"
			     : "=v"(v)
			     : "v"(p)
			     : "memory");
	return v;
}

/*
 * A 16-byte store another agent will read, to a 16-byte aligned address: on RDNA with glc slc dlc
 * (past every cache level, as the doorbell store; a plain store may linger in the write path),
 * elsewhere a plain vector store. Ordered before a later reader's flag only by
 * upcie_gpu_hip_doorbell_store() of that flag, whose leading drain or fence covers it.
 */
__device__ static inline void upcie_gpu_hip_store128_sys(void *p, upcie_gpu_hip_u32x4 v)
{
#if UPCIE_GPU_HIP_RDNA
	__asm__ __volatile__(UPCIE_GPU_HIP_ST128_ " %0, %1, off glc slc dlc" ::"v"(p), "v"(v)
			     : "memory");
#else
	*(upcie_gpu_hip_u32x4 *)p = v;
#endif
}

/* System-scope acquire: later loads see what was visible to the agent whose write was seen. */
__device__ static inline void upcie_gpu_hip_acquire_system(void)
{
#if !defined(UPCIE_GPU_HIP_TEST_NO_ACQUIRE) /* negative control only */
	__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "");
#endif
}

#else /* the host pass of hipcc parses device functions but never emits them */

/* Host-pass stand-in, never emitted: hipcc's host pass needs a definition to parse callers. */
__device__ static inline void upcie_gpu_hip_threadfence_system(void)
{
}

/* Host-pass stand-in, never emitted: hipcc's host pass needs a definition to parse callers. */
__device__ static inline uint64_t upcie_gpu_hip_wall_clock(void)
{
	return 0;
}

/* Host-pass stand-in, never emitted: hipcc's host pass needs a definition to parse callers. */
__device__ static inline void upcie_gpu_hip_doorbell_store(volatile uint32_t *db, uint32_t v)
{
	*db = v;
}

/* Host-pass stand-in, never emitted: hipcc's host pass needs a definition to parse callers. */
__device__ static inline uint32_t upcie_gpu_hip_poll_load32(const uint32_t *p)
{
	return *(const volatile uint32_t *)p;
}

/* Host-pass stand-in, never emitted: hipcc's host pass needs a definition to parse callers. */
__device__ static inline void upcie_gpu_hip_poll_load32x2(const uint32_t *a, const uint32_t *b,
							  uint32_t *va, uint32_t *vb)
{
	*va = *(const volatile uint32_t *)a;
	*vb = *(const volatile uint32_t *)b;
}

/* Host-pass stand-in, never emitted: hipcc's host pass needs a definition to parse callers. */
__device__ static inline upcie_gpu_hip_u32x4 upcie_gpu_hip_poll_load128(const void *p)
{
	return *(const volatile upcie_gpu_hip_u32x4 *)p;
}

/* Host-pass stand-in, never emitted: hipcc's host pass needs a definition to parse callers. */
__device__ static inline void upcie_gpu_hip_acquire_system(void)
{
}

/* Host-pass stand-in, never emitted: hipcc's host pass needs a definition to parse callers. */
__device__ static inline void upcie_gpu_hip_store128_sys(void *p, upcie_gpu_hip_u32x4 v)
{
	*(upcie_gpu_hip_u32x4 *)p = v;
}

#endif /* __HIP_DEVICE_COMPILE__ */

#endif /* __HIPCC__ */

#endif /* UPCIE_BASE_ARCH_HIP_H */
