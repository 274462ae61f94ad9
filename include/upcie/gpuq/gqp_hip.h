/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * GPU-issued NVMe queue pair for HIP: the portable queue-pair core (nvme/qpair.h) compiled as
 * HIP device code, plus waits on the GPU's wall clock. One GPU thread owns a queue pair at a
 * time, as one CPU thread owns one in host code; the state lives in memory that outlives a
 * kernel (device memory, set up by gpuq/gqp_host_hip.h), so a queue pair is driven by one
 * kernel launch after another with no host work in between.
 *
 * The same code serves both placements the host side sets up:
 * - bridged: the SQ in host memory, the doorbells `sqdb`/`cqdb` are shadow cells in host memory
 *   that a host poller mirrors to the controller's doorbells, and `cq` is the shadow CQ the
 *   poller relays completions into (gpuq/bridge_hip.h: GPUs that cannot map a peer's BAR, and
 *   CQs whose peer writes the GPU would not see);
 * - direct: the doorbells are the controller's own (BAR0 mapped for the GPU with
 *   hipHostRegisterIoMemory) and the CQ lives in device memory.
 * The GPU code cannot tell them apart. The doorbell store, the completion poll load, the fences
 * and the clock are those of nvme/qpair_port.h through base/arch_hip.h (the RDNA store sequence
 * on GFX10/GFX11, GL0/GL1 invalidation before each completion load there).
 *
 * Payloads that GPU code reads after a completion it reaped: the acquire after the phase-tag load
 * (base/arch_hip.h) invalidates L0/L1 and, on gfx90a/gfx940, only the L2 lines the L2 does not
 * keep coherent, so ordinary coarse-grained VRAM can be read stale from the L2 after the
 * completion. Such payloads are uncached or fine-grained device memory
 * (upcie_gpu_hip_polled_alloc(), or hipExtMallocWithFlags with hipDeviceMallocUncached /
 * hipDeviceMallocFinegrained); upcie_gpu_hip_payload_check() (gpu/heap_hip.h) refuses the rest,
 * and memory whose allocation the runtime does not describe. HIP has no counterpart of CUDA's
 * peer-write ordering attribute: that a controller's data reaches VRAM before its completion is
 * the PCIe ordering of one requester's posted writes into one destination, which can hold in
 * direct mode (data and CQ both in VRAM) and nothing promises in bridged mode: the completion goes
 * to host memory and the data to VRAM, two destinations, and the host poller seeing the entry
 * says nothing about the peer write. Bridged queues are therefore for payloads in host memory (one
 * destination with the CQ) or for commands without data into VRAM. The host checks a payload
 * where its device address is set up (upcie_nvme_gqp_hip_data_iova(), gpuq/gqp_host_hip.h):
 * coarse-grained VRAM on any queue, host memory on a direct queue and VRAM on a bridged one are
 * refused there, the last two unless the queue was created with the flag by which the caller
 * vouches for the platform. None of this ran on an AMD GPU (none here): the sequences are checked
 * in the disassembly (tests/hip/check-disasm.sh) and the host code compiled.
 *
 * Readers outside the owning thread. Reap's acquire orders the owner thread's loads only. Every
 * other thread that reads a payload after learning of its completion executes its own acquire
 * (upcie_nvme_gqp_hip_data_acquire()) after it learnt and before its first load of the payload,
 * whatever told it:
 *   - a thread of the owner's work-group, told by __syncthreads() after the owner reaped: the
 *     acquire after the barrier. The barrier's fences are work-group scope, which the controller
 *     is outside of, and the owner's invalidation of the L1 it shares with the reader is no
 *     promise (gfx90a and gfx940 in tgsplit mode run one work-group's wavefronts on several CUs);
 *   - a thread of another work-group, told by a flag: the owner publishes with
 *     upcie_nvme_gqp_hip_signal() (its stores, then the flag, as a doorbell is stored), the reader
 *     waits with upcie_nvme_gqp_hip_signal_wait() (poll loads, then the acquire); a reader that
 *     polls a flag of its own making calls upcie_nvme_gqp_hip_data_acquire() once it saw it. A
 *     poll alone gives the flag, not the data behind it;
 *   - a resident kernel told by the CPU (the CPU reaped, e.g. through the completion mirror,
 *     gpuq/cqmirror_host_hip.h, and wrote a flag the kernel polls): the same; the flag lives in
 *     fine-grained host memory (hipHostMalloc with hipHostMallocCoherent, as the bridge's cells).
 *     The CPU's own order (completion, then its flag store) is the host core's (nvme/qpair.h).
 * Data of a write command: ring's fence orders what the owner thread wrote or observed before the
 * doorbell. When other threads produced the payload, each calls upcie_nvme_gqp_hip_data_release()
 * after its last store and before it tells the owner (or publishes with signal()), and the owner,
 * once told, acquires (signal_wait() does) before it enqueues and rings: the fence before the
 * doorbell covers the producers' stores only when the owner has synchronised with them.
 * What the acquire makes fresh, as compiled (system scope; tests/hip/check-disasm.sh): on RDNA
 * s_waitcnt, buffer_gl0_inv, buffer_gl1_inv (the GL2 is not invalidated); on gfx90a
 * buffer_wbl2, s_waitcnt, buffer_invl2, buffer_wbinvl1_vol (the L1, and the L2 lines of memory
 * the L2 does not keep coherent); on gfx940 buffer_wbl2 sc0 sc1, s_waitcnt, buffer_inv sc0 sc1.
 * No target invalidates L2 lines of coarse-grained VRAM, which a controller's write went around:
 * hence the placement rule above, for every reader. Agent scope would not do: on gfx90a it
 * compiles to s_waitcnt and buffer_wbinvl1_vol alone. The release is the compiler's system-scope
 * release: buffer_wbl2 (gfx940: buffer_wbl2 sc0 sc1) and s_waitcnt on CDNA, the store drain
 * (s_waitcnt vmcnt(0), s_waitcnt_vscnt) on RDNA.
 * Scalar loads: a payload that a device or another thread writes while the kernel runs is read with
 * ordinary vector loads, never through a `const T *__restrict__` kernel parameter. clang 15 makes a
 * load of a uniform address a scalar load (s_load, through the scalar cache, which no fence orders
 * or invalidates; it is invalidated between dispatches) where it takes the memory as unchanged
 * since the dispatch began, which is where LLVM's memory model uses scalar loads: behind const
 * __restrict__ (stores before it or not; issued before the acquire, memory clobber or not), and for
 * a plain load or a __builtin_nontemporal_load() of const memory where nothing that may write
 * memory (a store, a call, inline assembly that clobbers memory) comes before the load in the
 * kernel. The acquire fence does not count as such a write: a reader that polls its flag with a
 * volatile load, runs the fence and then reads data[i] gets an s_load after the fence on gfx90a,
 * gfx940, gfx1030 and gfx1101, and no acquire makes that load fresh. Hence
 * upcie_nvme_gqp_hip_data_acquire() ends with a compiler memory clobber (an empty asm statement
 * that clobbers memory) after the fence: the loads after it are vector loads. The library's own
 * polls (the completion poll load that reap and signal_wait() use) are inline assembly that
 * clobbers memory, which does the same for the loads after reap's acquire and signal_wait(); the
 * clobber matters to readers that poll with loads of their own. tests/hip/check-disasm.sh keeps
 * such a reader (upcie_hipchk_reader_volatile), whose data load must be a vector load and is an
 * s_load when built without the clobber, and a reader whose payload sits behind a const
 * __restrict__ parameter, which its data rule must reject.
 *
 * Timeouts: a wait converts its nanoseconds into ticks of the wall clock with `wall_khz`, the
 * rate hipDeviceAttributeWallClockRate reported (kHz; never clock64()), and the core's own timed
 * waits (upcie_nvme_qpair_wait()/drain()) get the same rate through qp.clock_khz, which the
 * host side sets. Every wait here is capped at `max_wait_ns` (default 2 s), well under the GPU
 * watchdog (~10 s), so a lost completion fails the wait instead of hanging the GPU into a
 * reset. A clock that does not move at all (as ROCm 5.2's wall_clock64() on GFX11 would) ends
 * the wait with -EOPNOTSUPP rather than spinning forever.
 *
 * Everything here is UPCIE_HD and also compiles as plain C: on the host the clock
 * (upcie_nvme_port_clock()) is CLOCK_MONOTONIC at UPCIE_NVME_GQP_HIP_HOST_KHZ, which is how the
 * guest tests run this very code in CPU threads that play the GPU
 * (tests/guest/progs/t_hip_bridge.c).
 */
#ifndef UPCIE_GPUQ_GQP_HIP_H
#define UPCIE_GPUQ_GQP_HIP_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include <upcie/base/barrier.h>
#include <upcie/base/compiler.h>
#include <upcie/nvme/qpair.h>
#include <upcie/nvme/qpair_port.h>
#include <upcie/nvme/spec.h>

/* The cap on every wait: well under the GPU's hang watchdog (about 10 s). */
#ifndef UPCIE_NVME_GQP_HIP_WAIT_MAX_NS
#define UPCIE_NVME_GQP_HIP_WAIT_MAX_NS (UINT64_C(2) * 1000000000u)
#endif
/* Rounds of an unmoving clock after which a wait gives up (-EOPNOTSUPP). */
#ifndef UPCIE_NVME_GQP_HIP_CLOCK_STUCK
#define UPCIE_NVME_GQP_HIP_CLOCK_STUCK (UINT32_C(1) << 20)
#endif
/* The host stand-in's clock: nanoseconds, 10^6 kHz. */
#define UPCIE_NVME_GQP_HIP_HOST_KHZ UINT64_C(1000000)

#define UPCIE_NVME_GQP_HIP_BRIDGED 0x1u /* doorbells are shadow cells (gpuq/bridge_hip.h) */
#define UPCIE_NVME_GQP_HIP_RELAYED 0x2u /* cq is the relayed shadow of a host CQ */

/* One queue pair as GPU code drives it; every address in `qp` is a GPU address. */
struct upcie_nvme_gqp_hip {
	struct upcie_nvme_qpair qp;
	uint64_t wall_khz; /* wall-clock ticks per millisecond (hipDeviceAttributeWallClockRate) */
	uint64_t max_wait_ns;  /* cap on every wait; 0: UPCIE_NVME_GQP_HIP_WAIT_MAX_NS */
	uint32_t flags;	       /* UPCIE_NVME_GQP_HIP_* */
	uint32_t nclock_stuck; /* waits ended because the clock did not move */
};

/* Where one command's completion lands (the queue pair's callback context). */
struct upcie_nvme_gqp_hip_cpl {
	struct upcie_nvme_cqe cqe;
	int err; /* 0: completed (status in cqe); -ECANCELED: cancelled */
	uint32_t done;
};

/* Ticks of a wait of `ns`, after the cap; 0 when the rate is unknown. */
UPCIE_HD static inline uint64_t upcie_nvme_gqp_hip_ticks_(const struct upcie_nvme_gqp_hip *q,
							  uint64_t ns)
{
	uint64_t cap = q->max_wait_ns ? q->max_wait_ns : UPCIE_NVME_GQP_HIP_WAIT_MAX_NS;

	if (ns > cap)
		ns = cap;
	if (!q->wall_khz)
		return 0;
	return upcie_nvme_port_ticks(ns, (uint32_t)q->wall_khz);
}

UPCIE_HD static inline void upcie_nvme_gqp_hip_cpl_cb_(void *ctx, const struct upcie_nvme_cqe *cqe,
						       int err)
{
	struct upcie_nvme_gqp_hip_cpl *c = (struct upcie_nvme_gqp_hip_cpl *)ctx;

	c->cqe = *cqe;
	c->err = err;
	c->done = 1;
}

/*
 * Copy `sqe` into the SQ with a fresh CID; its completion will land in *c. Not visible to the
 * controller before upcie_nvme_gqp_hip_ring(). Returns 0 (CID in *cid when not NULL), -EBUSY
 * (queue full: reap and retry), -EINVAL.
 */
UPCIE_HD static inline int upcie_nvme_gqp_hip_enqueue(struct upcie_nvme_gqp_hip *q,
						      const struct upcie_nvme_sqe *sqe,
						      struct upcie_nvme_gqp_hip_cpl *c,
						      uint16_t *cid)
{
	if (!c)
		return -EINVAL;
	c->done = 0;
	c->err = 0;
	return upcie_nvme_qpair_enqueue(&q->qp, sqe, upcie_nvme_gqp_hip_cpl_cb_, c, cid);
}

/* Publish what was enqueued: one fence and one doorbell store, none when nothing is new. */
UPCIE_HD static inline int upcie_nvme_gqp_hip_ring(struct upcie_nvme_gqp_hip *q)
{
	return upcie_nvme_qpair_ring(&q->qp);
}

/* Process up to `max` completions (see upcie_nvme_qpair_reap()). */
UPCIE_HD static inline int upcie_nvme_gqp_hip_reap(struct upcie_nvme_gqp_hip *q, unsigned max)
{
	return upcie_nvme_qpair_reap(&q->qp, max);
}

/*
 * Reap until `done` says so (cpl non-NULL: that command; NULL: nothing outstanding) or the wait
 * of timeout_ns (capped) ends. Returns 0, -ETIMEDOUT, -EOPNOTSUPP (the clock does not move),
 * -EINVAL (no clock rate).
 */
UPCIE_HD static inline int upcie_nvme_gqp_hip_wait_(struct upcie_nvme_gqp_hip *q,
						    const struct upcie_nvme_gqp_hip_cpl *cpl,
						    uint64_t timeout_ns)
{
	uint64_t ticks = upcie_nvme_gqp_hip_ticks_(q, timeout_ns);
	uint64_t t0 = upcie_nvme_port_clock(), now;
	uint32_t still = 0;

	if (!q->wall_khz)
		return -EINVAL;
	for (;;) {
		if (upcie_nvme_qpair_reap(&q->qp, 0xffffffffu) == 0)
			upcie_nvme_port_relax();
		if (cpl ? *(const volatile uint32_t *)&cpl->done != 0
			: upcie_nvme_qpair_inflight(&q->qp) == 0)
			return 0;
		now = upcie_nvme_port_clock();
		if (now - t0 >= ticks)
			return -ETIMEDOUT;
		if (now == t0 && ++still >= UPCIE_NVME_GQP_HIP_CLOCK_STUCK) {
			q->nclock_stuck++;
			return -EOPNOTSUPP;
		}
	}
}

/*
 * Wait for the command whose completion goes to *c. On -ETIMEDOUT the command is cancelled in
 * the queue pair (its CID stays reserved until a late completion or reclaim) and *c holds the
 * synthesized abort completion. Returns 0 (check upcie_nvme_cqe_ok(&c->cqe)), -ETIMEDOUT,
 * -EOPNOTSUPP, -EINVAL.
 */
UPCIE_HD static inline int upcie_nvme_gqp_hip_wait(struct upcie_nvme_gqp_hip *q, uint16_t cid,
						   struct upcie_nvme_gqp_hip_cpl *c,
						   uint64_t timeout_ns)
{
	int err = upcie_nvme_gqp_hip_wait_(q, c, timeout_ns);

	if (err == -ETIMEDOUT || err == -EOPNOTSUPP)
		upcie_nvme_qpair_cancel(&q->qp, cid);
	return err;
}

/* Reap until nothing is outstanding or the wait ends: 0, -ETIMEDOUT, -EOPNOTSUPP, -EINVAL. */
UPCIE_HD static inline int upcie_nvme_gqp_hip_drain(struct upcie_nvme_gqp_hip *q,
						    uint64_t timeout_ns)
{
	return upcie_nvme_gqp_hip_wait_(q, (const struct upcie_nvme_gqp_hip_cpl *)0, timeout_ns);
}

/*
 * One command, submitted and waited for. Returns 0, -EIO (completed with an error status: see
 * *cqe), -EBUSY (queue full), -ETIMEDOUT, -EOPNOTSUPP, -EINVAL. *cqe (may be NULL) gets the
 * completion.
 */
UPCIE_HD static inline int upcie_nvme_gqp_hip_io(struct upcie_nvme_gqp_hip *q,
						 const struct upcie_nvme_sqe *sqe,
						 uint64_t timeout_ns, struct upcie_nvme_cqe *cqe)
{
	struct upcie_nvme_gqp_hip_cpl c;
	uint16_t cid = 0;
	int err;

	err = upcie_nvme_gqp_hip_enqueue(q, sqe, &c, &cid);
	if (err)
		return err;
	upcie_nvme_gqp_hip_ring(q);
	err = upcie_nvme_gqp_hip_wait(q, cid, &c, timeout_ns);
	if (cqe && c.done)
		*cqe = c.cqe;
	if (err)
		return err;
	return upcie_nvme_cqe_ok(&c.cqe) ? 0 : -EIO;
}

/*
 * Per thread, any thread. Make this thread's stores of a write command's payload visible to the
 * controller before the owner thread rings the doorbell of that command: call it after the last
 * store and before telling the owner (barrier, flag). Not needed when the owner wrote the payload
 * itself. A system-scope release fence (see "Readers outside the owning thread" above); on the
 * host (the CPU stand-in of the guest tests) a full barrier. UPCIE_NVME_GQP_HIP_TEST_NO_DATA_RELEASE
 * removes it, for a negative control of tests/hip/check-disasm.sh only: never in a build that runs.
 */
UPCIE_HD static inline void upcie_nvme_gqp_hip_data_release(void)
{
#if defined(UPCIE_NVME_GQP_HIP_TEST_NO_DATA_RELEASE) /* negative control only */
#elif defined(UPCIE_NVME_PORT_HIP_DEVICE)
	__builtin_amdgcn_fence(__ATOMIC_RELEASE, "");
#elif defined(UPCIE_NVME_PORT_CUDA_DEVICE)
	__threadfence_system();
#else
	upcie_mb();
#endif
}

/*
 * Per thread, any thread. The acquire of a thread that reads data behind a completion (or a
 * producer's data) it learnt of from someone else: after it learnt (a barrier, a flag it polled,
 * a word the CPU wrote) and before its first load of the data, with ordinary vector loads (see
 * "Scalar loads" above). A system-scope acquire fence, then a compiler memory clobber (see
 * "Scalar loads" above: without it clang 15 may make a plain uniform load after the fence a
 * scalar load); on the host a DMA read barrier. It does not make coarse-grained VRAM fresh (see
 * above: payloads are fine-grained or uncached).
 * UPCIE_NVME_GQP_HIP_TEST_NO_DATA_ACQUIRE removes both (a reader with no acquire at all), and
 * UPCIE_NVME_GQP_HIP_TEST_NO_ACQUIRE_CLOBBER the clobber alone, each for a negative control of
 * tests/hip/check-disasm.sh only: never in a build that runs.
 */
UPCIE_HD static inline void upcie_nvme_gqp_hip_data_acquire(void)
{
#if defined(UPCIE_NVME_GQP_HIP_TEST_NO_DATA_ACQUIRE) /* negative control only */
#elif defined(UPCIE_NVME_PORT_HIP_DEVICE)
	__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "");
#if !defined(UPCIE_NVME_GQP_HIP_TEST_NO_ACQUIRE_CLOBBER) /* negative control only */
	__asm__ __volatile__("" ::: "memory");
#endif
#elif defined(UPCIE_NVME_PORT_CUDA_DEVICE)
	__threadfence_system();
#else
	upcie_dma_rmb();
#endif
}

/*
 * Per thread, any thread. Tell readers in other work-groups (or the owner thread) that data is
 * ready: `v` stored into *flag as a doorbell is (base/arch_hip.h: on RDNA the drain, a store past
 * every cache level, the GL1/GL0 invalidate; elsewhere a system fence, then the store), so what
 * this thread stored before reaches memory first and the flag leaves the GPU now. The flag may be
 * in fine-grained host memory the CPU watches. Use a sequence number for `v`.
 */
UPCIE_HD static inline void upcie_nvme_gqp_hip_signal(uint32_t *flag, uint32_t v)
{
#if !defined(UPCIE_NVME_PORT_HIP_DEVICE) && !defined(UPCIE_NVME_PORT_CUDA_DEVICE)
	upcie_mb();
#elif defined(UPCIE_NVME_PORT_CUDA_DEVICE)
	__threadfence_system();
#endif
	upcie_nvme_port_doorbell((volatile uint32_t *)flag, v);
}

/*
 * Per thread, any thread. Wait until *flag reaches `v` (sequence order: (int32_t)(*flag - v) >=
 * 0) or `timeout_ns` (capped at UPCIE_NVME_GQP_HIP_WAIT_MAX_NS) has passed, then acquire
 * (upcie_nvme_gqp_hip_data_acquire()). The flag is read with the completion poll load (every
 * cache-policy bit the target has; RDNA invalidates GL0/GL1 first); the acquire is paid once.
 * `wall_khz` is the wall clock's rate (a queue's `wall_khz`, or what the host read from
 * hipDeviceAttributeWallClockRate; UPCIE_NVME_GQP_HIP_HOST_KHZ for the host stand-in). Returns 0,
 * -ETIMEDOUT, -EOPNOTSUPP (the clock does not move), -EINVAL (no rate); on an error nothing was
 * acquired and the data must not be read.
 */
UPCIE_HD static inline int upcie_nvme_gqp_hip_signal_wait(const uint32_t *flag, uint32_t v,
							  uint64_t timeout_ns, uint64_t wall_khz)
{
	uint64_t ticks, t0, now;
	uint32_t still = 0;

	if (!wall_khz || wall_khz > UINT32_MAX)
		return -EINVAL;
	if (timeout_ns > UPCIE_NVME_GQP_HIP_WAIT_MAX_NS)
		timeout_ns = UPCIE_NVME_GQP_HIP_WAIT_MAX_NS;
	ticks = upcie_nvme_port_ticks(timeout_ns, (uint32_t)wall_khz);
	t0 = upcie_nvme_port_clock();
	while ((int32_t)(upcie_nvme_port_load32(flag) - v) < 0) {
		now = upcie_nvme_port_clock();
		if (now - t0 >= ticks)
			return -ETIMEDOUT;
		if (now == t0 && ++still >= UPCIE_NVME_GQP_HIP_CLOCK_STUCK)
			return -EOPNOTSUPP;
		upcie_nvme_port_relax();
	}
	upcie_nvme_gqp_hip_data_acquire();
	return 0;
}

#endif /* UPCIE_GPUQ_GQP_HIP_H */
