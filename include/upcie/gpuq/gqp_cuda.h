/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * GPU-resident NVMe queue pair: commands submitted and completions reaped by CUDA device code.
 *
 * Model. A queue pair has one owner warp at a time (the GPU form of the core's one owner thread,
 * nvme/qpair.h). Every function below is warp-collective: all 32 lanes of the owning warp call it
 * together, converged, with the same `struct upcie_nvme_gqp_warp`; each lane brings its own
 * command (or none) and gets its own result. Lanes claim SQ slots and CIDs by rank within the
 * warp, so a lane may keep any number of commands outstanding and the queue depth is independent
 * of the block size. Warps share a queue pair by taking its lock (upcie_nvme_gqp_begin(..., true));
 * a kernel gets throughput from several queue pairs, one warp each.
 *
 * Protocol, as in the portable core (qpair_port.h primitives): an SQE is written as four 16-byte
 * stores cached at L2 only (st.global.cg; for an SQ in host memory the warp may write eight
 * entries per store instruction instead, UPCIE_NVME_GQP_SQ_COOP_STORES), a batch is published with one
 * system-scope release fence and one doorbell write (upcie_nvme_gqp_ring()); completions are found by phase tag, 32 entries per
 * load round, and matched by CID, so a controller may complete in any order; the CQ head doorbell
 * is written once per reap; each CQE records the SQ head the controller reported, which bounds
 * the free SQ slots. Submission is pipelined: enqueue, ring and reap interleave freely, nothing
 * waits for a round of commands to drain. Deadlines use %globaltimer (nanoseconds), not SM clocks.
 *
 * Completions before data: the CQ is polled with loads that bypass the SM's L1 (ld.volatile.v4),
 * which makes the entry fresh but not what the controller wrote before it: a plain load of a
 * payload line the SM still holds in L1 would return the old bytes. So every reap that finds
 * entries executes one acquire fence (UPCIE_NVME_GQP_ACQUIRE(): fence.acquire.sys, on sm_90 the
 * single instruction CCTL.IVALL, no MEMBAR; docs/results/gpu-queues.md shows the SASS and the
 * cost) after the poll and before it hands anything on: reap_each's callbacks, and
 * complete()/wait() returning a completion reaped by the same warp, are ordered after it, so the
 * caller's ordinary loads of the payload see what the controller wrote before the completion.
 * The controller's writes arrive in order only on a GPU that promises ordered peer writes
 * (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING at least OWNER, which
 * upcie_nvme_gqp_create() checks). A warp that takes the queue over (begin) after another warp
 * reaped sees those completions through begin's fence.
 *
 * Readers outside the owning warp. The reap's fence orders the owning warp's loads only. Every
 * other thread that reads a payload after learning of its completion executes its own acquire
 * after it learnt and before its first load of the payload, whatever told it:
 *   - a thread of the same block, told by __syncthreads() (or a named barrier) after the owner
 *     reaped: upcie_nvme_gqp_data_acquire() after the barrier. On the H200 the owner's fence has
 *     already invalidated the L1 the block shares, but the PTX model orders a barrier at CTA scope
 *     only, and the controller is outside it;
 *   - a thread of another block, told by a flag: the owner publishes with
 *     upcie_nvme_gqp_signal() (a system-scope release, then the flag store), the reader waits with
 *     upcie_nvme_gqp_signal_wait() (relaxed polls, then the acquire); a reader that polls a flag
 *     of its own making calls upcie_nvme_gqp_data_acquire() once it saw the flag. A relaxed or
 *     volatile poll alone gives the flag, not the data behind it: without the acquire the reader's
 *     plain loads return what its SM's L1 held (measured: docs/results/gpu-queues.md);
 *   - a resident kernel told by the CPU (the CPU reaped, e.g. through the completion mirror, and
 *     wrote a flag the kernel polls): the same, upcie_nvme_gqp_signal_wait() or a poll followed by
 *     upcie_nvme_gqp_data_acquire(). The CPU's own order (completion, then its flag store) is the
 *     host core's business (nvme/qpair.h).
 * Read-only loads: a payload that a device or another SM writes while the kernel runs is read
 * with ordinary loads (ld.global, ld.weak), never through const __restrict__ pointers the
 * compiler turns into ld.global.nc nor __ldg(): the PTX model gives the non-coherent path no
 * ordering with fences at all, so no acquire makes it fresh (on sm_90 it shares the L1 that
 * fence.acquire invalidates; nothing promises that elsewhere). tests/gpu/check-nc-ptx.sh finds
 * ld.global.nc in kernels that also reap or acquire (run it on a user's PTX, a debug check).
 *
 * Data of a write command: upcie_nvme_gqp_ring()'s release fence orders what the ringing warp
 * wrote or observed before the doorbell. When other threads produced the payload, each of them
 * publishes it with upcie_nvme_gqp_signal() (or calls upcie_nvme_gqp_data_release() after its
 * last store and before whatever tells the ringing warp), and the ringing warp, once told,
 * executes upcie_nvme_gqp_data_acquire() (upcie_nvme_gqp_signal_wait() does) before it enqueues
 * and rings: the release fence before the doorbell covers the producers' stores only when the
 * ringing warp has synchronised with them, and the acquire also makes what it reads of their data
 * (an LBA, a length) fresh. A __syncthreads() alone orders the stores at CTA scope, which is not
 * what a device reading them across PCIe is promised.
 *
 * Payload placement. Payloads must be GPU memory: a translation of host memory
 * (UPCIE_GPU_XLATE_HOSTMEM, the host heap) is refused with -EXDEV unless the queue was created
 * with UPCIE_NVME_GQP_HOST_DATA. The GPU's ordering promise covers the controller's writes into
 * GPU memory; a read into host memory goes to DRAM through the root complex while its completion
 * goes to the CQ in VRAM, two destinations that PCIe does not order against each other, so the
 * completion can be seen before the data. Set the flag only when the platform is known to order
 * them; upcie cannot check it.
 *
 * CQE loads. The CQ is polled with 16-byte loads (ld.volatile.v4). PTX models a vector load as
 * one load per element in unspecified order, so the phase tag (dw3) can be newer than dw0..dw2
 * of the same load. After the acquire, dw0..dw2 of every consumed entry are loaded again; dw3 is
 * kept from the poll (the CID and the status live in the same dword as the phase tag). A
 * controller writes the entry's last dword no earlier than the others (one 16-byte write, or in
 * address order), and its writes arrive in order (the peer-write promise above), so the second
 * load sees the dwords written before the tag. The re-loads are ordinary loads issued together,
 * together with the CID claims (what they cost: docs/results/gpu-queues.md). Tested with polls that tear on purpose (tests/gpu/test_gpu.cu, group "tear"):
 * torn entries reach the caller only without the re-load (UPCIE_NVME_GQP_CQE_RELOAD 0, the
 * negative control). A single 16-byte load was never seen torn on the H200
 * (docs/results/gpu-tests.md), which the code does not rely on.
 *
 * Untrusted completions: an entry for a CID that is not outstanding, a late one for a cancelled
 * CID, and a CID posted twice in one reap are counted (q->nbad, q->nlate) and free nothing twice,
 * so the free-CID stack never outgrows its table: the reap claims each entry's CID with one
 * atomicCAS on its state (PENDING to FREE or DONE), and only the entry that wins it acts.
 *
 * Where the time goes (docs/results/gpu-queues.md, "fenced path"): a warp's round trip is a chain
 * of dependent steps, so the library keeps memory round trips off it. The top 32 entries of the
 * free-CID stack are kept in registers (one per lane, upcie_nvme_gqp_push_()), so enqueue takes
 * CIDs without a load (the stack in memory is still written, and read past the window); the CID
 * claims of all reap rounds are issued at once, beside the re-load, instead of one dependent
 * state load per round; upcie_nvme_gqp_enqueue_cmd() takes the command by value, so that it
 * stays in registers. The fences themselves (the release before the doorbell, the
 * acquire after the poll) are what a controller outside the GPU needs and stay.
 *
 * Memory: `struct upcie_nvme_gqp` and its per-CID tables live in device memory, set up by the host
 * (gpuq/gqp_host_cuda.h). Between upcie_nvme_gqp_begin() and _end() the warp keeps the ring indices
 * (and the top of the free-CID stack) in registers; _end() writes the indices back. PRP lists, when enabled, are one 4 KiB page per CID
 * (512 entries: with PRP1 at most 513 pages, about 2 MiB, per command).
 *
 * Kernels that drive a queue pair while another kernel spins waiting for them (a test controller,
 * a resident consumer) must be loaded before that kernel starts: with lazy module loading the
 * first launch may wait for the device to go idle (CUDA_MODULE_LOADING=EAGER, or
 * cudaFuncGetAttributes() first), and the same holds for growing the local-memory reservation
 * (cudaDeviceSetLimit(cudaLimitStackSize) first). A command passed through a pointer that some
 * lanes set to NULL lives in local memory (64 bytes of stack per thread).
 *
 * The struct compiles as C for the host; the device functions only under nvcc.
 */
#ifndef UPCIE_GPUQ_GQP_CUDA_H
#define UPCIE_GPUQ_GQP_CUDA_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include <upcie/base/compiler.h>
#include <upcie/gpu/xlate_cuda.h>
#include <upcie/nvme/qpair_port.h>
#include <upcie/nvme/spec.h>

#define UPCIE_NVME_GQP_CID_NONE 0xffffu /* "this lane has no command" */

/* Per-CID states. */
#define UPCIE_NVME_GQP_FREE	 0u
#define UPCIE_NVME_GQP_PENDING	 1u /* submitted, no completion yet */
#define UPCIE_NVME_GQP_DONE	 2u /* completion in cpl[cid], not yet taken */
#define UPCIE_NVME_GQP_CANCELLED 3u /* given up; a late completion frees it */

#define UPCIE_NVME_GQP_PAGE_SHIFT      12 /* PRPs at 4 KiB */
#define UPCIE_NVME_GQP_PAGE	       (1u << UPCIE_NVME_GQP_PAGE_SHIFT)
#define UPCIE_NVME_GQP_LIST_ENTRIES    512u
#define UPCIE_NVME_GQP_MAX_XFER_NOLIST (2u * UPCIE_NVME_GQP_PAGE)

/* CQ entries examined per reap: UPCIE_NVME_GQP_REAP_ROUNDS loads of 32. */
#ifndef UPCIE_NVME_GQP_REAP_ROUNDS
#define UPCIE_NVME_GQP_REAP_ROUNDS 4
#endif

/* Queue flags (struct upcie_nvme_gqp.flags; set at creation, gpuq/gqp_host_cuda.h). */
#define UPCIE_NVME_GQP_SQ_HOSTMEM 0x1u /* SQ (and PRP lists) in the host heap */
#define UPCIE_NVME_GQP_DB_IOMEM	  0x2u /* sqdb/cqdb are in a host mapping of BAR0 */
#define UPCIE_NVME_GQP_PRP_LISTS  0x4u /* one PRP list page per CID */
/*
 * Host-memory SQ: the warp writes its entries together, eight per 16-byte store instruction
 * (upcie_nvme_gqp_coop_store_()), instead of each lane its own. Measured on the H200
 * (docs/results/gpu-queues.md): raw SQE writes into host memory hold 52.7 GB/s at any number of
 * writer warps (per-lane 16-byte stores: 12-52 GB/s, falling past 32 warps), but a single queue
 * pair at QD 32 runs 12 % slower; at the queue level with many pairs both are equal there.
 */
#define UPCIE_NVME_GQP_SQ_COOP_STORES 0x8u
/*
 * Accept payloads in host memory (UPCIE_GPU_XLATE_HOSTMEM): the caller asserts that the platform
 * orders the controller's writes into host memory before its completions in GPU memory (see
 * "Payload placement" above). Without it enqueue_data() refuses them with -EXDEV.
 */
#define UPCIE_NVME_GQP_HOST_DATA 0x10u

/*
 * The poll's 16-byte CQ load, and whether dw0..dw2 are loaded again after the acquire; a test
 * substitutes a load that tears on purpose, and its negative control turns the re-load off.
 */
#ifndef UPCIE_NVME_GQP_CQ_LOAD
#define UPCIE_NVME_GQP_CQ_LOAD(p) upcie_nvme_port_ld16(p)
#endif
#ifndef UPCIE_NVME_GQP_CQE_RELOAD
#define UPCIE_NVME_GQP_CQE_RELOAD 1
#endif
/*
 * The re-load itself: an ordinary 16-byte load, ordered by the acquire like the caller's payload
 * loads (a strong system-scope load, as the poll's, measured slower on the H200:
 * docs/results/gpu-queues.md).
 */
#ifndef UPCIE_NVME_GQP_CQE_RELOAD_LD
#define UPCIE_NVME_GQP_CQE_RELOAD_LD(p) (*(const uint4 *)(p))
#endif

/*
 * How an SQE reaches its slot when a lane writes its own; a test may substitute another store
 * sequence (which then also replaces the warp-cooperative stores).
 */
#ifndef UPCIE_NVME_GQP_SQE_STORE
#define UPCIE_NVME_GQP_SQE_STORE(dst, src, cid) upcie_nvme_port_sqe_store(dst, src, cid)
#define UPCIE_NVME_GQP_COOP_STORES_		1
#else
#define UPCIE_NVME_GQP_COOP_STORES_ 0
#endif

/*
 * The fence that publishes a batch before its doorbell write; a test may substitute another. A
 * system-scope release fence where the toolchain has one (PTX ISA 8.6: CUDA 12.8, sm_90): it
 * orders the entries before the doorbell like __threadfence_system() but, being release-only,
 * compiles to MEMBAR.ALL.SYS without the L1 invalidation (CCTL.IVALL) of the full fence.
 */
#ifndef UPCIE_NVME_GQP_WMB
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 &&                                              \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 8))
#define UPCIE_NVME_GQP_WMB() asm volatile("fence.release.sys;" ::: "memory")
#else
#define UPCIE_NVME_GQP_WMB() upcie_nvme_port_wmb()
#endif
#endif

/*
 * The ordering point between finding completions and handing them on (see above); a test may
 * substitute another (the negative control of the stale-read test defines it empty). PTX ISA 8.6
 * (CUDA 12.8) has acquire-only fences; older toolchains and GPUs take the full system fence.
 */
#ifndef UPCIE_NVME_GQP_ACQUIRE
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 &&                                              \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 8))
#define UPCIE_NVME_GQP_ACQUIRE() asm volatile("fence.acquire.sys;" ::: "memory")
#else
#define UPCIE_NVME_GQP_ACQUIRE() __threadfence_system()
#endif
#endif

/* The acquire of readers outside the owning warp (upcie_nvme_gqp_data_acquire()); a test's
 * negative control defines it empty. */
#ifndef UPCIE_NVME_GQP_DATA_ACQUIRE
#define UPCIE_NVME_GQP_DATA_ACQUIRE() UPCIE_NVME_GQP_ACQUIRE()
#endif

/* One queue pair, in device memory. Addresses are as GPU code uses them. */
struct upcie_nvme_gqp {
	struct upcie_nvme_sqe *sq;  /* SQ ring (device memory, or host memory mapped) */
	struct upcie_nvme_cqe *cq;  /* CQ ring */
	volatile uint32_t *sqdb;    /* SQ tail doorbell */
	volatile uint32_t *cqdb;    /* CQ head doorbell */
	struct upcie_nvme_cqe *cpl; /* [ncids] completion of each CID in state DONE */
	uint32_t *state;	    /* [ncids] UPCIE_NVME_GQP_* (claimed by atomicCAS) */
	uint16_t *cid_free;	    /* [ncids] stack of free CIDs */
	char *list_va;		    /* PRP list page of CID c at list_va + c * list_stride */
	const uint64_t *list_iova;  /* [ncids] device address of each list page; NULL: none */
	uint64_t list_stride;
	uint32_t depth; /* SQ and CQ entries */
	uint32_t ncids; /* at most depth - 1 */
	uint16_t qid;
	uint16_t flags;
	uint32_t lock;
	uint32_t users; /* warps between upcie_nvme_gqp_begin() and _end() */
	/* Ring state, kept by the owner warp (written back by upcie_nvme_gqp_end()). */
	uint32_t sq_tail, sq_db, sq_head, cq_head, phase, nfree;
	/* Completions for CIDs not outstanding; SQ heads outside the ring; late completions. */
	unsigned long long nbad, nbad_sqhd, nlate;
};

#if defined(__CUDACC__)

/* The owner warp's view: constants and ring indices in registers, identical in every lane. */
struct upcie_nvme_gqp_warp {
	struct upcie_nvme_gqp *q;
	struct upcie_nvme_sqe *sq;
	struct upcie_nvme_cqe *cq;
	volatile uint32_t *sqdb;
	volatile uint32_t *cqdb;
	struct upcie_nvme_cqe *cpl;
	uint32_t *state;
	uint16_t *cid_free;
	char *list_va;
	const uint64_t *list_iova;
	uint64_t list_stride;
	uint32_t depth, ncids;
	uint32_t sq_tail, sq_db, sq_head, cq_head, phase, nfree;
	uint32_t nbad, nbad_sqhd, nlate;
	/* The top of the free-CID stack in registers: lane i holds cid_free[nfree - 1 - i] for
	 * i < cwin (cwin warp-uniform, at most 32). Memory stays authoritative: every push is
	 * also stored; the window only spares enqueue the load of the CIDs it takes. */
	uint32_t ctop, cwin;
	bool locked;
	bool coop;     /* warp-cooperative SQE stores (UPCIE_NVME_GQP_SQ_COOP_STORES) */
	bool hostdata; /* payloads in host memory accepted (UPCIE_NVME_GQP_HOST_DATA) */
};

#define UPCIE_NVME_GQP_FULL_ 0xffffffffu

__device__ static inline uint32_t upcie_nvme_gqp_lane_(void)
{
	uint32_t l;

	asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
	return l;
}

/*
 * Take the queue pair for this warp: with `lock`, wait for the queue's lock first (for queue
 * pairs shared by several warps). Loads the ring state into *w.
 */
__device__ static inline void upcie_nvme_gqp_begin(struct upcie_nvme_gqp_warp *w,
						   struct upcie_nvme_gqp *q, bool lock)
{
	if (upcie_nvme_gqp_lane_() == 0) {
		if (lock)
			while (atomicCAS(&q->lock, 0u, 1u) != 0u)
				__nanosleep(64);
		atomicAdd(&q->users, 1u); /* upcie_nvme_gqp_destroy() refuses while non-zero */
	}
	__syncwarp();
	__threadfence(); /* acquire: see what the previous owner wrote */
	w->q = q;
	w->sq = q->sq;
	w->cq = q->cq;
	w->sqdb = q->sqdb;
	w->cqdb = q->cqdb;
	w->cpl = q->cpl;
	w->state = q->state;
	w->cid_free = q->cid_free;
	w->list_va = q->list_va;
	w->list_iova = q->list_iova;
	w->list_stride = q->list_stride;
	w->depth = q->depth;
	w->ncids = q->ncids;
	w->sq_tail = q->sq_tail;
	w->sq_db = q->sq_db;
	w->sq_head = q->sq_head;
	w->cq_head = q->cq_head;
	w->phase = q->phase;
	w->nfree = q->nfree;
	w->nbad = w->nbad_sqhd = w->nlate = 0;
	w->cwin = w->nfree < 32u ? w->nfree : 32u;
	w->ctop = upcie_nvme_gqp_lane_() < w->cwin
		      ? w->cid_free[w->nfree - 1 - upcie_nvme_gqp_lane_()]
		      : 0u;
	w->locked = lock;
	w->coop = UPCIE_NVME_GQP_COOP_STORES_ &&
		  (q->flags & (UPCIE_NVME_GQP_SQ_HOSTMEM | UPCIE_NVME_GQP_SQ_COOP_STORES)) ==
		      (UPCIE_NVME_GQP_SQ_HOSTMEM | UPCIE_NVME_GQP_SQ_COOP_STORES);
	w->hostdata = (q->flags & UPCIE_NVME_GQP_HOST_DATA) != 0;
	__syncwarp();
}

/* Write the ring state back and release the lock if begin took it. */
__device__ static inline void upcie_nvme_gqp_end(struct upcie_nvme_gqp_warp *w)
{
	struct upcie_nvme_gqp *q = w->q;

	__syncwarp();
	if (upcie_nvme_gqp_lane_() == 0) {
		q->sq_tail = w->sq_tail;
		q->sq_db = w->sq_db;
		q->sq_head = w->sq_head;
		q->cq_head = w->cq_head;
		q->phase = w->phase;
		q->nfree = w->nfree;
		if (w->nbad)
			atomicAdd(&q->nbad, (unsigned long long)w->nbad);
		if (w->nbad_sqhd)
			atomicAdd(&q->nbad_sqhd, (unsigned long long)w->nbad_sqhd);
		if (w->nlate)
			atomicAdd(&q->nlate, (unsigned long long)w->nlate);
		__threadfence(); /* release */
		if (w->locked)
			atomicExch(&q->lock, 0u);
		atomicSub(&q->users, 1u);
	}
	__syncwarp();
}

/* Commands that could be enqueued now: free SQ slots (per the last SQ head) and free CIDs. */
__device__ static inline uint32_t upcie_nvme_gqp_room(const struct upcie_nvme_gqp_warp *w)
{
	uint32_t used =
	    w->sq_tail >= w->sq_head ? w->sq_tail - w->sq_head : w->sq_tail + w->depth - w->sq_head;
	uint32_t room = w->depth - 1 - used;

	return room < w->nfree ? room : w->nfree;
}

/* Commands outstanding: CIDs taken and not yet returned (DONE ones not taken count too). */
__device__ static inline uint32_t upcie_nvme_gqp_inflight(const struct upcie_nvme_gqp_warp *w)
{
	return w->ncids - w->nfree;
}

/* Fill PRP1/PRP2 of *sqe for `len` bytes at `buf` (list page of `cid` when needed). */
__device__ static inline void upcie_nvme_gqp_prp_fill_(const struct upcie_nvme_gqp_warp *w,
						       struct upcie_nvme_sqe *sqe, uint16_t cid,
						       const struct upcie_gpu_xlate *x,
						       const char *buf, uint32_t len)
{
	uint64_t a = upcie_gpu_xlate_iova(x, buf);
	uint32_t first = UPCIE_NVME_GQP_PAGE - (uint32_t)(a & (UPCIE_NVME_GQP_PAGE - 1));

	sqe->flags &= 0x3f; /* PSDT = PRP */
	sqe->prp1 = a;
	sqe->prp2 = 0;
	if (len <= first)
		return;
	if (len - first <= UPCIE_NVME_GQP_PAGE) {
		sqe->prp2 = upcie_gpu_xlate_iova(x, buf + first);
		return;
	}
	{
		uint64_t *list = (uint64_t *)(w->list_va + (uint64_t)cid * w->list_stride);
		uint32_t n = (len - first + UPCIE_NVME_GQP_PAGE - 1) >> UPCIE_NVME_GQP_PAGE_SHIFT;

		for (uint32_t i = 0; i < n; i++)
			list[i] = upcie_gpu_xlate_iova(
			    x, buf + first + ((uint64_t)i << UPCIE_NVME_GQP_PAGE_SHIFT));
		sqe->prp2 = w->list_iova[cid];
	}
}

/* Whether `len` bytes at `buf` can be described for this queue (0, -EINVAL, -EXDEV). */
__device__ static inline int upcie_nvme_gqp_prp_check_(const struct upcie_nvme_gqp_warp *w,
						       const struct upcie_gpu_xlate *x,
						       const void *buf, uint32_t len)
{
	uint64_t a, pages;

	if (!x)
		return 0;
	if ((x->flags & UPCIE_GPU_XLATE_HOSTMEM) && !w->hostdata)
		return -EXDEV; /* "Payload placement" above */
	if (!len || !upcie_gpu_xlate_contains(x, buf, len))
		return -EINVAL;
	a = upcie_gpu_xlate_iova(x, buf);
	if (a & 3)
		return -EINVAL; /* PRP1 must be dword aligned */
	pages = ((a & (UPCIE_NVME_GQP_PAGE - 1)) + len + UPCIE_NVME_GQP_PAGE - 1) >>
		UPCIE_NVME_GQP_PAGE_SHIFT;
	if (pages > 2 && (!w->list_iova || pages - 1 > UPCIE_NVME_GQP_LIST_ENTRIES))
		return -EINVAL;
	return 0;
}

/* What the lanes of one enqueue call claim: a lane wants a slot when it brings a command whose
 * data pointer can be built; slots and CIDs go by rank among those lanes, up to the room. */
struct upcie_nvme_gqp_claim_ {
	int ret;	/* per lane: 0, or -EINVAL from the data-pointer check */
	bool want;	/* per lane */
	uint32_t m;	/* lanes that want */
	uint32_t rank;	/* per lane: rank among them */
	uint32_t grant; /* how many get a slot */
};

__device__ static inline struct upcie_nvme_gqp_claim_
upcie_nvme_gqp_claim_(const struct upcie_nvme_gqp_warp *w, bool has,
		      const struct upcie_gpu_xlate *x, const void *buf, uint32_t len)
{
	uint32_t lane = upcie_nvme_gqp_lane_(), lt = (1u << lane) - 1;
	struct upcie_nvme_gqp_claim_ k;
	uint32_t n, room;

	k.ret = has ? upcie_nvme_gqp_prp_check_(w, x, buf, len) : 0;
	k.want = has && !k.ret;
	k.m = __ballot_sync(UPCIE_NVME_GQP_FULL_, k.want);
	n = __popc(k.m);
	k.rank = __popc(k.m & lt);
	room = upcie_nvme_gqp_room(w);
	k.grant = n < room ? n : room;
	return k;
}

/* Move the SQ tail past and take the CIDs of the `grant` commands just written. */
__device__ static inline void upcie_nvme_gqp_advance_(struct upcie_nvme_gqp_warp *w, uint32_t grant)
{
	w->sq_tail += grant;
	if (w->sq_tail >= w->depth)
		w->sq_tail -= w->depth;
	w->nfree -= grant;
	/* The window loses its top `grant` entries (grant is at most 32). */
	w->ctop = __shfl_down_sync(UPCIE_NVME_GQP_FULL_, w->ctop, grant & 31u);
	w->cwin = w->cwin > grant ? w->cwin - grant : 0u;
}

/* The CID that the lane of rank `rank` takes (rank < grant <= nfree): from the window, or past
 * its end from the stack in memory. `wc` is __shfl_sync(ctop, rank), taken by every lane. */
__device__ static inline uint16_t upcie_nvme_gqp_take_(const struct upcie_nvme_gqp_warp *w,
						       uint32_t rank, uint32_t wc)
{
	return rank < w->cwin ? (uint16_t)wc : w->cid_free[w->nfree - 1 - rank];
}

/*
 * Warp-collective. Push the CIDs of the lanes with `freeing` (fm: their ballot) onto the free
 * stack, in lane order, in memory and in the register window: the last pushed is the new top.
 */
__device__ static inline void upcie_nvme_gqp_push_(struct upcie_nvme_gqp_warp *w, bool freeing,
						   uint16_t c, uint32_t fm)
{
	uint32_t lane = upcie_nvme_gqp_lane_(), k = __popc(fm), src = 0, p, o;

	if (freeing)
		w->cid_free[w->nfree + __popc(fm & ((1u << lane) - 1))] = c;
	if (!k) /* warp-uniform */
		return;
	/* Window lane i < k takes the pushed CID of rank k - 1 - i, lanes past k the old lane i - k. */
	if (lane < k)
		src = fm == (k == 32 ? UPCIE_NVME_GQP_FULL_ : (1u << k) - 1)
			  ? k - 1 - lane
			  : (uint32_t)__fns(fm, 0, (int)(k - lane));
	p = __shfl_sync(UPCIE_NVME_GQP_FULL_, (uint32_t)c, (int)src);
	o = __shfl_up_sync(UPCIE_NVME_GQP_FULL_, w->ctop, k & 31u);
	w->ctop = lane < k ? p : o;
	w->cwin = w->cwin + k < 32u ? w->cwin + k : 32u;
	w->nfree += k;
}

/*
 * Warp-cooperative SQE stores: the `grant` commands of this round, held by the lanes of `m` in rank
 * order (lane words `wd`), written eight entries per store instruction, lane L storing 16-byte
 * quarter L % 4 of entry L / 4. A store instruction then covers 512 contiguous bytes (when the slots
 * do not wrap) instead of 32 scattered 16-byte pieces, which is what posted writes into host memory
 * across PCIe need to merge into full lines.
 */
__device__ static inline void upcie_nvme_gqp_coop_store_(const struct upcie_nvme_gqp_warp *w,
							 uint32_t m, uint32_t grant,
							 const uint64_t wd[8])
{
	uint32_t lane = upcie_nvme_gqp_lane_(), q = lane & 3;

	for (uint32_t base = 0; base < grant; base += 8) {
		uint32_t r = base + (lane >> 2);
		uint32_t src = r < grant ? __fns(m, 0, (int)r + 1) : 0;
		uint64_t lo = 0, hi = 0;

#pragma unroll
		for (uint32_t j = 0; j < 4; j++) {
			uint64_t a = __shfl_sync(UPCIE_NVME_GQP_FULL_, wd[2 * j], (int)src);
			uint64_t b = __shfl_sync(UPCIE_NVME_GQP_FULL_, wd[2 * j + 1], (int)src);

			if (q == j) {
				lo = a;
				hi = b;
			}
		}
		if (r < grant) {
			uint32_t slot = w->sq_tail + r;

			if (slot >= w->depth)
				slot -= w->depth;
			upcie_nvme_port_store16((char *)&w->sq[slot] + 16 * q, lo, hi);
		}
	}
}

/* upcie_nvme_gqp_enqueue_() for UPCIE_NVME_GQP_SQ_COOP_STORES queues (kept apart so that the
 * per-lane path stays as lean as it was). */
__device__ static inline int upcie_nvme_gqp_enqueue_coop_(struct upcie_nvme_gqp_warp *w, bool has,
							  const struct upcie_nvme_sqe &sqe,
							  const struct upcie_gpu_xlate *x,
							  const void *buf, uint32_t len,
							  uint16_t *cid)
{
	struct upcie_nvme_gqp_claim_ k = upcie_nvme_gqp_claim_(w, has, x, buf, len);
	uint32_t wc = __shfl_sync(UPCIE_NVME_GQP_FULL_, w->ctop, (int)(k.rank & 31u));
	int ret = k.ret;
	uint64_t wd[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };

	if (k.want) {
		if (k.rank < k.grant) {
			uint16_t c = upcie_nvme_gqp_take_(w, k.rank, wc);
			struct upcie_nvme_sqe s = sqe;

			w->state[c] = UPCIE_NVME_GQP_PENDING;
			if (x)
				upcie_nvme_gqp_prp_fill_(w, &s, c, x, (const char *)buf, len);
			wd[0] = s.opc | ((uint64_t)s.flags << 8) | ((uint64_t)c << 16) |
				((uint64_t)s.nsid << 32);
			wd[1] = s.cdw2 | ((uint64_t)s.cdw3 << 32);
			wd[2] = s.mptr;
			wd[3] = s.prp1;
			wd[4] = s.prp2;
			wd[5] = s.cdw10 | ((uint64_t)s.cdw11 << 32);
			wd[6] = s.cdw12 | ((uint64_t)s.cdw13 << 32);
			wd[7] = s.cdw14 | ((uint64_t)s.cdw15 << 32);
			if (cid)
				*cid = c;
		} else {
			ret = -EBUSY;
		}
	}
	if (k.grant)
		upcie_nvme_gqp_coop_store_(w, k.m, k.grant, wd);
	upcie_nvme_gqp_advance_(w, k.grant);
	return ret;
}

__device__ static inline int upcie_nvme_gqp_enqueue_(struct upcie_nvme_gqp_warp *w, bool has,
						     const struct upcie_nvme_sqe &sqe,
						     const struct upcie_gpu_xlate *x,
						     const void *buf, uint32_t len, uint16_t *cid)
{
	if (w->coop) /* warp-uniform */
		return upcie_nvme_gqp_enqueue_coop_(w, has, sqe, x, buf, len, cid);
	struct upcie_nvme_gqp_claim_ k = upcie_nvme_gqp_claim_(w, has, x, buf, len);
	uint32_t wc = __shfl_sync(UPCIE_NVME_GQP_FULL_, w->ctop, (int)(k.rank & 31u));
	int ret = k.ret;

	if (k.want) {
		if (k.rank < k.grant) {
			uint16_t c = upcie_nvme_gqp_take_(w, k.rank, wc);
			uint32_t slot = w->sq_tail + k.rank;

			if (slot >= w->depth)
				slot -= w->depth;
			w->state[c] = UPCIE_NVME_GQP_PENDING;
			if (x) {
				struct upcie_nvme_sqe s = sqe;

				upcie_nvme_gqp_prp_fill_(w, &s, c, x, (const char *)buf, len);
				UPCIE_NVME_GQP_SQE_STORE(&w->sq[slot], &s, c);
			} else {
				UPCIE_NVME_GQP_SQE_STORE(&w->sq[slot], &sqe, c);
			}
			if (cid)
				*cid = c;
		} else {
			ret = -EBUSY;
		}
	}
	upcie_nvme_gqp_advance_(w, k.grant);
	return ret;
}

/* The command a lane without one passes on. */
__device__ static inline struct upcie_nvme_sqe
upcie_nvme_gqp_sqe_of_(const struct upcie_nvme_sqe *p)
{
	struct upcie_nvme_sqe s = {};

	if (p)
		s = *p;
	return s;
}

/*
 * Warp-collective. Each lane with `sqe` non-NULL gets an SQ slot and a CID (in *cid); the command
 * is copied with that CID, not yet visible to the controller (upcie_nvme_gqp_ring()). Lanes claim
 * in lane order; those beyond the room get -EBUSY (reap, then retry). Returns 0, -EBUSY; lanes
 * with sqe NULL return 0 and take nothing. A command passed through a pointer that some lanes set
 * to NULL lives in local memory, which each enqueue after a reap then reads back from L2 on the
 * H200 (docs/results/gpu-queues.md): upcie_nvme_gqp_enqueue_cmd() keeps it in registers.
 */
__device__ static inline int upcie_nvme_gqp_enqueue(struct upcie_nvme_gqp_warp *w,
						    const struct upcie_nvme_sqe *sqe, uint16_t *cid)
{
	return upcie_nvme_gqp_enqueue_(w, sqe != NULL, upcie_nvme_gqp_sqe_of_(sqe), NULL, NULL, 0,
				       cid);
}

/* As upcie_nvme_gqp_enqueue(), the command by value: `has` says whether this lane brings one. */
__device__ static inline int upcie_nvme_gqp_enqueue_cmd(struct upcie_nvme_gqp_warp *w, bool has,
							struct upcie_nvme_sqe sqe, uint16_t *cid)
{
	return upcie_nvme_gqp_enqueue_(w, has, sqe, NULL, NULL, 0, cid);
}

/*
 * As upcie_nvme_gqp_enqueue(), with the data pointer of the command filled for `len` bytes at
 * `buf`, translated through `x` (gpu/xlate_cuda.h): PRP1/PRP2 at 4 KiB, a PRP list in the CID's
 * list page beyond two pages. -EINVAL for a lane whose buffer is outside `x`, not dword aligned,
 * empty, or longer than the queue's lists allow (2 pages without lists, 513 with); -EXDEV for a
 * buffer in host memory on a queue without UPCIE_NVME_GQP_HOST_DATA.
 */
__device__ static inline int upcie_nvme_gqp_enqueue_data(struct upcie_nvme_gqp_warp *w,
							 const struct upcie_nvme_sqe *sqe,
							 const struct upcie_gpu_xlate *x,
							 const void *buf, uint32_t len,
							 uint16_t *cid)
{
	bool bad = sqe && !x;
	int r =
	    upcie_nvme_gqp_enqueue_(w, sqe && !bad, upcie_nvme_gqp_sqe_of_(sqe), x, buf, len, cid);

	return bad ? -EINVAL : r;
}

/* As upcie_nvme_gqp_enqueue_data(), the command by value (see upcie_nvme_gqp_enqueue_cmd()). */
__device__ static inline int upcie_nvme_gqp_enqueue_data_cmd(struct upcie_nvme_gqp_warp *w,
							     bool has, struct upcie_nvme_sqe sqe,
							     const struct upcie_gpu_xlate *x,
							     const void *buf, uint32_t len,
							     uint16_t *cid)
{
	bool bad = has && !x;
	int r = upcie_nvme_gqp_enqueue_(w, has && !bad, sqe, x, buf, len, cid);

	return bad ? -EINVAL : r;
}

/*
 * Warp-collective. Publish everything enqueued since the last ring: a system-scope fence in
 * every lane (the SQEs and PRP lists reach memory the controller reads), then one doorbell write.
 * Nothing when nothing new was enqueued.
 */
__device__ static inline void upcie_nvme_gqp_ring(struct upcie_nvme_gqp_warp *w)
{
	if (w->sq_tail == w->sq_db)
		return;
	UPCIE_NVME_GQP_WMB();
	__syncwarp();
	if (upcie_nvme_gqp_lane_() == 0)
		upcie_nvme_port_doorbell(w->sqdb, w->sq_tail);
	w->sq_db = w->sq_tail;
	__syncwarp();
}

/*
 * Per thread, not collective. Make this thread's stores of a write command's payload visible to
 * the controller before another warp rings the doorbell of that command: call it after the last
 * store and before telling the ringing warp (barrier, flag). Not needed when the ringing warp
 * wrote the payload itself. A system-scope release fence (UPCIE_NVME_GQP_WMB(), as before the
 * doorbell).
 */
__device__ static inline void upcie_nvme_gqp_data_release(void)
{
	UPCIE_NVME_GQP_WMB();
}

/*
 * Per thread, not collective. The acquire of a thread that reads data behind a completion (or a
 * producer's data) it learnt of from someone else: after it learnt (a barrier, a flag it polled,
 * a word the CPU wrote) and before its first load of the data. See "Readers outside the owning
 * warp" above. A system-scope acquire fence (on sm_90 one CCTL.IVALL: the SM's L1 invalidated).
 */
__device__ static inline void upcie_nvme_gqp_data_acquire(void)
{
	UPCIE_NVME_GQP_DATA_ACQUIRE();
}

/*
 * Per thread, not collective. Tell readers in other blocks (or the ringing warp) that data is
 * ready: a system-scope release fence, then `v` stored into *flag with a relaxed system-scope
 * store (the flag may live in host memory the CPU watches). Use a sequence number for `v`.
 */
__device__ static inline void upcie_nvme_gqp_signal(uint32_t *flag, uint32_t v)
{
	UPCIE_NVME_GQP_WMB();
	asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(v) : "memory");
}

/*
 * Per thread, not collective. Wait until *flag reaches `v` (sequence order: (int32_t)(*flag - v)
 * >= 0) or `timeout_ns` has passed, then acquire (upcie_nvme_gqp_data_acquire()). The flag is
 * polled with relaxed loads, which cost half an acquire load per poll on the H200; the acquire is
 * paid once. Returns 0, -ETIMEDOUT (nothing acquired: the data must not be read).
 */
__device__ static inline int upcie_nvme_gqp_signal_wait(const uint32_t *flag, uint32_t v,
							uint64_t timeout_ns)
{
	uint64_t t0 = upcie_nvme_port_time_ns();

	for (;;) {
		uint32_t f;

		asm volatile("ld.relaxed.sys.global.u32 %0, [%1];"
			     : "=r"(f)
			     : "l"(flag)
			     : "memory");
		if ((int32_t)(f - v) >= 0)
			break;
		if (upcie_nvme_port_time_ns() - t0 >= timeout_ns)
			return -ETIMEDOUT;
		upcie_nvme_port_relax();
	}
	UPCIE_NVME_GQP_DATA_ACQUIRE();
	return 0;
}

/* What reap does with a completion it keeps for upcie_nvme_gqp_complete(). */
struct upcie_nvme_gqp_keep_ {
	__device__ void operator()(const struct upcie_nvme_cqe &) const
	{
	}
};

template <bool Each, typename F>
__device__ static inline uint32_t upcie_nvme_gqp_reap_(struct upcie_nvme_gqp_warp *w, F &f)
{
	const uint32_t R = UPCIE_NVME_GQP_REAP_ROUNDS;
	uint32_t lane = upcie_nvme_gqp_lane_();
	uint4 v[UPCIE_NVME_GQP_REAP_ROUNDS];
	uint32_t m[UPCIE_NVME_GQP_REAP_ROUNDS], st[UPCIE_NVME_GQP_REAP_ROUNDS];
	uint32_t n = 0, last_dw2;
	/* Rounds worth loading: no more completions can be due than commands are outstanding
	 * (at least one round, so entries for CIDs not outstanding are still found). */
	uint32_t rounds = (w->ncids - w->nfree + 31) >> 5;
	bool stop = false;

	if (!rounds)
		rounds = 1;
#pragma unroll
	for (uint32_t r = 0; r < R; r++) { /* every load issued before any result is used */
		uint32_t pos = r * 32 + lane, idx = w->cq_head + pos;

		if (idx >= w->depth)
			idx -= w->depth;
		v[r] = r < rounds && pos < w->depth ? UPCIE_NVME_GQP_CQ_LOAD(&w->cq[idx])
						    : make_uint4(0, 0, 0, 0);
	}
#pragma unroll
	for (uint32_t r = 0; r < R; r++) {
		uint32_t pos = r * 32 + lane,
			 ph = w->phase ^ (w->cq_head + pos >= w->depth ? 1u : 0u);

		m[r] = r < rounds ? __ballot_sync(UPCIE_NVME_GQP_FULL_,
						  pos < w->depth && ((v[r].w >> 16) & 1u) == ph)
				  : 0u;
	}
#pragma unroll
	for (uint32_t r = 0; r < R; r++) {
		if (stop)
			break;
		if (m[r] == UPCIE_NVME_GQP_FULL_) {
			n += 32;
		} else {
			n += __ffs(~m[r]) - 1;
			stop = true;
		}
	}
	if (!n)
		return 0;
	/* What the controller wrote before these entries is visible to this warp's loads after. */
	UPCIE_NVME_GQP_ACQUIRE();
	/*
	 * After the fence, issued together: dw0..dw2 again (the poll's vector load may have torn,
	 * "CQE loads"), and the claim of every consumed entry's CID, all rounds at once: PENDING
	 * becomes FREE (reap_each) or DONE in one atomicCAS per entry, so a CID posted twice (in one
	 * round or across rounds) is taken by one entry only and the others see it taken. One round
	 * trip for both instead of a dependent state load per round (docs/results/gpu-queues.md).
	 */
#pragma unroll
	for (uint32_t r = 0; r < R; r++) {
		uint32_t pos = r * 32 + lane, idx = w->cq_head + pos, c = v[r].w & 0xffffu;

		if (idx >= w->depth)
			idx -= w->depth;
		if (UPCIE_NVME_GQP_CQE_RELOAD && pos < n) {
			uint4 e = UPCIE_NVME_GQP_CQE_RELOAD_LD(&w->cq[idx]);

			v[r].x = e.x;
			v[r].y = e.y;
			v[r].z = e.z;
		}
		st[r] = UPCIE_NVME_GQP_FREE;
		if (pos < n && c < w->ncids)
			st[r] = atomicCAS(&w->state[c], UPCIE_NVME_GQP_PENDING,
					  Each ? UPCIE_NVME_GQP_FREE : UPCIE_NVME_GQP_DONE);
	}
#pragma unroll
	for (uint32_t r = 0; r < R; r++) {
		uint32_t pos = r * 32 + lane;
		uint16_t c = (uint16_t)v[r].w;
		bool freeing = false, bad = false, late = false;

		if (r * 32 >= n)
			break;
		if (pos < n) {
			if (st[r] == UPCIE_NVME_GQP_PENDING) {
				if (Each) {
					struct upcie_nvme_cqe e;

					e.dw0 = v[r].x;
					e.dw1 = v[r].y;
					e.dw2 = v[r].z;
					e.dw3 = v[r].w;
					freeing = true;
					f(e);
				} else {
					*(uint4 *)&w->cpl[c] = v[r];
				}
			} else if (st[r] == UPCIE_NVME_GQP_CANCELLED &&
				   atomicCAS(&w->state[c], UPCIE_NVME_GQP_CANCELLED,
					     UPCIE_NVME_GQP_FREE) == UPCIE_NVME_GQP_CANCELLED) {
				freeing = true; /* a late completion: the CID is free again */
				late = true;
			} else {
				bad = true; /* not outstanding, or taken by another entry */
			}
		}
		upcie_nvme_gqp_push_(w, freeing, c, __ballot_sync(UPCIE_NVME_GQP_FULL_, freeing));
		w->nbad += __popc(__ballot_sync(UPCIE_NVME_GQP_FULL_, bad));
		w->nlate += __popc(__ballot_sync(UPCIE_NVME_GQP_FULL_, late));
	}
	/* The SQ head the controller reported last: in the newest entry consumed. */
	{
		uint32_t lr = (n - 1) >> 5, ll = (n - 1) & 31, mine_dw2 = 0;

#pragma unroll
		for (uint32_t r = 0; r < R; r++)
			if (r == lr)
				mine_dw2 = v[r].z;
		last_dw2 = __shfl_sync(UPCIE_NVME_GQP_FULL_, mine_dw2, ll);
	}
	if ((last_dw2 & 0xffffu) < w->depth)
		w->sq_head = last_dw2 & 0xffffu;
	else
		w->nbad_sqhd++;
	w->cq_head += n;
	if (w->cq_head >= w->depth) {
		w->cq_head -= w->depth;
		w->phase ^= 1u;
	}
	__syncwarp();
	if (lane == 0)
		upcie_nvme_port_doorbell(w->cqdb, w->cq_head);
	return n;
}

/*
 * Warp-collective. Consume the completions that have arrived, up to 32 x
 * UPCIE_NVME_GQP_REAP_ROUNDS: each goes to its CID's slot (state DONE; take it with
 * upcie_nvme_gqp_complete()); a late completion of a cancelled CID frees that CID; a completion
 * for a CID not outstanding is counted (q->nbad). Writes the CQ head doorbell once. Returns the
 * number of entries consumed (the same in every lane).
 */
__device__ static inline uint32_t upcie_nvme_gqp_reap(struct upcie_nvme_gqp_warp *w)
{
	struct upcie_nvme_gqp_keep_ keep;

	return upcie_nvme_gqp_reap_<false>(w, keep);
}

/*
 * Warp-collective. As upcie_nvme_gqp_reap(), but each completion of an outstanding command is
 * handed to f(const struct upcie_nvme_cqe &) in the lane that found it, and its CID is freed at
 * once: the GPU form of the core's completion callbacks, for code that does not wait on
 * particular CIDs. `f` runs divergently (some lanes only) and must not call collective functions.
 */
template <typename F>
__device__ static inline uint32_t upcie_nvme_gqp_reap_each(struct upcie_nvme_gqp_warp *w, F f)
{
	return upcie_nvme_gqp_reap_<true>(w, f);
}

/*
 * Warp-collective. Each lane passing an outstanding `cid` learns whether it has completed: 1 and
 * the completion in *cqe (the CID is then free again), or 0 (not yet; also for
 * UPCIE_NVME_GQP_CID_NONE). -EINVAL for a CID out of range or not outstanding. Reaps nothing
 * itself: call upcie_nvme_gqp_reap() in the same loop.
 */
__device__ static inline int upcie_nvme_gqp_complete(struct upcie_nvme_gqp_warp *w, uint16_t cid,
						     struct upcie_nvme_cqe *cqe)
{
	bool has = cid != UPCIE_NVME_GQP_CID_NONE;
	uint32_t st = has && cid < w->ncids ? w->state[cid] : UPCIE_NVME_GQP_FREE;
	bool done = st == UPCIE_NVME_GQP_DONE;
	int ret = 0;

	if (done) {
		uint4 e = *(const uint4 *)&w->cpl[cid];

		cqe->dw0 = e.x;
		cqe->dw1 = e.y;
		cqe->dw2 = e.z;
		cqe->dw3 = e.w;
		w->state[cid] = UPCIE_NVME_GQP_FREE;
		ret = 1;
	} else if (has && st != UPCIE_NVME_GQP_PENDING) {
		ret = -EINVAL;
	}
	upcie_nvme_gqp_push_(w, done, cid, __ballot_sync(UPCIE_NVME_GQP_FULL_, done));
	return ret;
}

/*
 * Warp-collective. Reap until every lane's `cid` has completed or `timeout_ns` has passed since the
 * call (on %globaltimer). Returns per lane 0 (completion in *cqe, CID free again), -ETIMEDOUT (the
 * command is still outstanding: cancel it), -EINVAL (bad CID); lanes passing
 * UPCIE_NVME_GQP_CID_NONE return 0 at once. Rings nothing: ring before waiting.
 */
__device__ static inline int upcie_nvme_gqp_wait(struct upcie_nvme_gqp_warp *w, uint16_t cid,
						 uint64_t timeout_ns, struct upcie_nvme_cqe *cqe)
{
	uint64_t t0 = __shfl_sync(UPCIE_NVME_GQP_FULL_, upcie_nvme_port_time_ns(), 0);
	bool pending = cid != UPCIE_NVME_GQP_CID_NONE;
	int ret = 0;

	for (;;) {
		int r = upcie_nvme_gqp_complete(
		    w, pending ? cid : (uint16_t)UPCIE_NVME_GQP_CID_NONE, cqe);
		uint64_t now;

		if (pending && r != 0) {
			ret = r < 0 ? r : 0;
			pending = false;
		}
		if (!__any_sync(UPCIE_NVME_GQP_FULL_, pending))
			return ret;
		if (!upcie_nvme_gqp_reap(w))
			upcie_nvme_port_relax();
		now = __shfl_sync(UPCIE_NVME_GQP_FULL_, upcie_nvme_port_time_ns(), 0);
		if (now - t0 >= timeout_ns)
			return pending ? -ETIMEDOUT : ret;
	}
}

/*
 * Warp-collective. Give up on each lane's outstanding `cid` (after a timeout, and after asking the
 * controller to abort it): the CID stays reserved until its late completion arrives, so it can
 * never be taken for a newer command's; a completion already reaped is discarded and the CID
 * freed. Returns 0, -EINVAL (not outstanding), 0 for UPCIE_NVME_GQP_CID_NONE.
 */
__device__ static inline int upcie_nvme_gqp_cancel(struct upcie_nvme_gqp_warp *w, uint16_t cid)
{
	bool has = cid != UPCIE_NVME_GQP_CID_NONE;
	uint32_t st = has && cid < w->ncids ? w->state[cid] : UPCIE_NVME_GQP_FREE;
	bool done = st == UPCIE_NVME_GQP_DONE;
	int ret = 0;

	if (st == UPCIE_NVME_GQP_PENDING) {
		w->state[cid] = UPCIE_NVME_GQP_CANCELLED;
	} else if (done) {
		w->state[cid] = UPCIE_NVME_GQP_FREE;
	} else if (has) {
		ret = -EINVAL;
	}
	upcie_nvme_gqp_push_(w, done, cid, __ballot_sync(UPCIE_NVME_GQP_FULL_, done));
	return ret;
}

/*
 * Warp-collective. Free every cancelled CID: only once the controller can no longer complete them
 * (the queue was deleted, the controller reset). Returns how many were freed.
 */
__device__ static inline uint32_t upcie_nvme_gqp_reclaim(struct upcie_nvme_gqp_warp *w)
{
	uint32_t lane = upcie_nvme_gqp_lane_(), total = 0;

	for (uint32_t base = 0; base < w->ncids; base += 32) {
		uint32_t c = base + lane;
		bool canc = c < w->ncids && w->state[c] == UPCIE_NVME_GQP_CANCELLED;
		uint32_t m = __ballot_sync(UPCIE_NVME_GQP_FULL_, canc);

		if (canc)
			w->state[c] = UPCIE_NVME_GQP_FREE;
		upcie_nvme_gqp_push_(w, canc, (uint16_t)c, m);
		total += __popc(m);
	}
	__syncwarp();
	return total;
}

#endif /* __CUDACC__ */

#endif /* UPCIE_GPUQ_GQP_CUDA_H */
