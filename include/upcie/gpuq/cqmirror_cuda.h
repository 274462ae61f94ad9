/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Completion-queue mirror, device side: the resident kernel that copies completion entries a
 * controller writes into GPU memory over to the host CQ that the CPU's queue pair reads.
 *
 * Why: a controller that writes payloads into the GPU and completions into host memory changes
 * destination at every command, and the root complex holds each write until the one ahead of it
 * is accepted at the other; with the CQ beside the data the controller has one destination again.
 * The CPU still owns the queue (builds submissions, rings doorbells, reaps the host CQ); the GPU
 * never touches the controller.
 *
 * One kernel serves up to UPCIE_NVME_CQMIRROR_SLOTS queues, one warp (one block) per slot. The
 * host and the kernel share a table with a slot per queue: the two CQ addresses, the depth, a
 * generation and an acknowledgement. The host fills a slot and raises its generation to an odd
 * value (attached); the warp copies until the generation changes, then acknowledges the value it
 * worked under, and the host frees nothing before it sees that. A warp finding an even generation
 * acknowledges the odd value before it, since a queue detached before the warp took it up has
 * nothing to drain. A warp taking up an odd generation first reports it as started (ack[SLOTS +
 * slot] = the generation), so that attach learns whether the warp runs at all: a warp that never
 * became resident (every SM filled by other kernels) starts nothing. The host-written half
 * (addresses, depth, generation, stop) is in device memory, where the warps poll it at L2 cost;
 * the acknowledgements are in host memory, where the host polls them at no PCIe cost.
 *
 * Payload ordering: the warp copies an entry only after it saw it in GPU memory; on a GPU that
 * orders peer writes for its own threads (the host side checks), the payload the controller
 * wrote into GPU memory before the entry is then visible to this GPU's threads and copy engines,
 * so GPU work the CPU starts after reaping the entry reads it. A payload in host memory with its
 * completion mirrored is not ordered by this, nor is a CPU that reads the payload through BAR1.
 *
 * Copying: the warp keeps two polls of the 32 entries from its head in flight (each lane one
 * 16-byte load), issuing the next before it examines the last, so the ring is sampled about twice
 * per load latency instead of once per loop; the run of entries whose phase tag turned is stored
 * to the host CQ as 16-byte stores, one entry per store, so the CPU sees each entry whole, as a
 * controller would write it. The generation and stop flag are loaded with each poll, not after it.
 * (On the H200 this took the mirror's added round trip from about 1 us to below what a round trip
 * can resolve; docs/results/gpu-queues.md.) A controller does not overwrite an entry before the
 * CPU's head doorbell passed it, so the host slot is free whenever the device slot turns, and an
 * entry carrying the phase of the current lap can never be stale. An idle warp backs off
 * (__nanosleep) after UPCIE_NVME_CQMIRROR_IDLE_STEPS empty rounds. Detach drains with one step of
 * UPCIE_NVME_CQMIRROR_ROUNDS x 32 entries.
 *
 * The kernel is compiled once to PTX (tests/gpu/gen-cqmirror-ptx.sh writes
 * gpuq/cqmirror_ptx_cuda.h) and loaded by the host side (gpuq/cqmirror_host_cuda.h) through the
 * driver API, so users of the mirror need no nvcc. The table layout below is shared with that
 * C code.
 */
#ifndef UPCIE_GPUQ_CQMIRROR_CUDA_H
#define UPCIE_GPUQ_CQMIRROR_CUDA_H

#include <upcie/base/feature.h>

#include <stdint.h>

#include <upcie/base/compiler.h>
#include <upcie/nvme/qpair_port.h>

#define UPCIE_NVME_CQMIRROR_SLOTS 64

#ifndef UPCIE_NVME_CQMIRROR_ROUNDS
#define UPCIE_NVME_CQMIRROR_ROUNDS 4
#endif
#ifndef UPCIE_NVME_CQMIRROR_IDLE_STEPS
#define UPCIE_NVME_CQMIRROR_IDLE_STEPS 4096
#endif
/* Table flags (host-set before launch). */
#define UPCIE_NVME_CQMIRROR_F_FENCE 0x1u /* system-scope fence after each step's copies */

struct upcie_nvme_cqmirror_slot {
	uint64_t dev_cq;  /* GPU address of the CQ the controller writes */
	uint64_t host_cq; /* GPU address of the host CQ the CPU reads */
	uint32_t depth;	  /* entries of both */
	uint32_t gen;	  /* odd: attached; written last */
	uint64_t rsvd;
};

struct upcie_nvme_cqmirror_table {
	struct upcie_nvme_cqmirror_slot slot[UPCIE_NVME_CQMIRROR_SLOTS];
	uint32_t stop;	/* non-zero: every warp returns */
	uint32_t flags; /* UPCIE_NVME_CQMIRROR_F_* */
};

#if defined(__CUDACC__)

__device__ static inline uint32_t upcie_nvme_cqmirror_ld32_(const void *p)
{
	uint32_t v;

	asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}

__device__ static inline uint64_t upcie_nvme_cqmirror_ld64_(const void *p)
{
	uint64_t v;

	asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
	return v;
}

__device__ static inline void upcie_nvme_cqmirror_st16_(void *p, uint4 v)
{
	asm volatile("st.global.cg.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
		     "r"(v.z), "r"(v.w)
		     : "memory");
}

/* One step: copy the run of turned entries from *head on. Returns the count (warp-uniform). */
__device__ static inline uint32_t upcie_nvme_cqmirror_step_(const uint4 *dev, uint4 *host,
							    uint32_t depth, uint32_t *head,
							    uint32_t *phase, uint32_t flags)
{
	const uint32_t R = UPCIE_NVME_CQMIRROR_ROUNDS;
	uint32_t lane = threadIdx.x & 31, n = 0;
	uint4 v[UPCIE_NVME_CQMIRROR_ROUNDS];
	uint32_t idx[UPCIE_NVME_CQMIRROR_ROUNDS], m[UPCIE_NVME_CQMIRROR_ROUNDS];
	bool stop = false;

#pragma unroll
	for (uint32_t r = 0; r < R; r++) {
		uint32_t pos = r * 32 + lane, ph = *phase;
		bool valid = pos < depth;

		idx[r] = *head + pos;
		if (idx[r] >= depth) {
			idx[r] -= depth;
			ph ^= 1u;
		}
		v[r] = valid ? upcie_nvme_port_ld16(&dev[idx[r]]) : make_uint4(0, 0, 0, 0);
		m[r] = __ballot_sync(0xffffffffu, valid && ((v[r].w >> 16) & 1u) == ph);
	}
#pragma unroll
	for (uint32_t r = 0; r < R; r++) {
		if (stop)
			break;
		if (m[r] == 0xffffffffu) {
			n += 32;
		} else {
			n += __ffs(~m[r]) - 1;
			stop = true;
		}
	}
	if (!n)
		return 0;
#pragma unroll
	for (uint32_t r = 0; r < R; r++)
		if (r * 32 + lane < n)
			upcie_nvme_cqmirror_st16_(&host[idx[r]], v[r]);
	if (flags & UPCIE_NVME_CQMIRROR_F_FENCE)
		__threadfence_system();
	*head += n;
	if (*head >= depth) {
		*head -= depth;
		*phase ^= 1u;
	}
	return n;
}

/* Poll the 32 entries from `head`: lane L loads entry head + L (none when L >= depth). */
__device__ static inline uint4 upcie_nvme_cqmirror_poll32_(const uint4 *dev, uint32_t depth,
							   uint32_t head)
{
	uint32_t lane = threadIdx.x & 31, idx = head + lane;

	if (lane >= depth)
		return make_uint4(0, 0, 0, 0);
	if (idx >= depth)
		idx -= depth;
	return upcie_nvme_port_ld16(&dev[idx]);
}

/*
 * Copy until the slot's generation is no longer `g` or the stop flag is set, with two polls in
 * flight: each round issues a poll at the current head, then examines the poll issued the round
 * before (at the head before that round's copies; shifted down by the entries copied since).
 * An entry with the phase of the current lap cannot be stale: the controller does not write the
 * next lap into a slot before the CPU's head doorbell passed it, which needs this copy first.
 */
__device__ static inline void upcie_nvme_cqmirror_pipe_(struct upcie_nvme_cqmirror_table *t,
							struct upcie_nvme_cqmirror_slot *sl,
							uint32_t g, const uint4 *dev, uint4 *host,
							uint32_t depth, uint32_t *head,
							uint32_t *phase, uint32_t flags)
{
	uint32_t lane = threadIdx.x & 31, idle = 0, h = *head, ph = *phase;
	uint4 nxt = upcie_nvme_cqmirror_poll32_(dev, depth, h);
	uint32_t nh = h;

	for (;;) {
		uint32_t g2 = upcie_nvme_cqmirror_ld32_(&sl->gen);
		uint32_t st = upcie_nvme_cqmirror_ld32_(&t->stop);
		uint4 cur = nxt;
		uint32_t d = h >= nh ? h - nh : h + depth - nh, m, n, want;
		bool valid;

		nxt = upcie_nvme_cqmirror_poll32_(dev, depth, h);
		nh = h;
		/* Entry h + lane is in lane lane + d of `cur`. */
		cur.x = __shfl_down_sync(0xffffffffu, cur.x, d);
		cur.y = __shfl_down_sync(0xffffffffu, cur.y, d);
		cur.z = __shfl_down_sync(0xffffffffu, cur.z, d);
		cur.w = __shfl_down_sync(0xffffffffu, cur.w, d);
		valid = lane + d < 32 && lane + d < depth; /* lanes >= depth loaded nothing */
		want = ph ^ (h + lane >= depth ? 1u : 0u);
		m = __ballot_sync(0xffffffffu, valid && ((cur.w >> 16) & 1u) == want);
		n = m == 0xffffffffu ? 32 : __ffs(~m) - 1;
		if (n) {
			if (lane < n) {
				uint32_t idx = h + lane;

				if (idx >= depth)
					idx -= depth;
				upcie_nvme_cqmirror_st16_(&host[idx], cur);
			}
			if (flags & UPCIE_NVME_CQMIRROR_F_FENCE)
				__threadfence_system();
			h += n;
			if (h >= depth) {
				h -= depth;
				ph ^= 1u;
			}
			idle = 0;
		} else if (++idle > UPCIE_NVME_CQMIRROR_IDLE_STEPS) {
			__nanosleep(256);
			idle = UPCIE_NVME_CQMIRROR_IDLE_STEPS;
		}
		if (g2 != g || st)
			break;
	}
	*head = h;
	*phase = ph;
}

/* The warp serving slot `s` until the table's stop flag is set. */
__device__ static inline void upcie_nvme_cqmirror_warp(struct upcie_nvme_cqmirror_table *t,
						       volatile uint32_t *ack, uint32_t s)
{
	struct upcie_nvme_cqmirror_slot *sl = &t->slot[s];
	uint32_t lane = threadIdx.x & 31;
	uint32_t flags = upcie_nvme_cqmirror_ld32_(&t->flags);
	uint32_t acked = __shfl_sync(0xffffffffu, lane == 0 ? ack[s] : 0u, 0);

	while (!upcie_nvme_cqmirror_ld32_(&t->stop)) {
		uint32_t g = upcie_nvme_cqmirror_ld32_(&sl->gen);
		const uint4 *dev;
		uint4 *host;
		uint32_t depth, head = 0, phase = 1;

		if (!(g & 1u)) {
			/* Detached, or never attached: acknowledge the odd value before it. */
			if (g && acked != g - 1) {
				if (lane == 0) {
					ack[s] = g - 1;
					__threadfence_system();
				}
				acked = g - 1;
			}
			__nanosleep(1000);
			continue;
		}
		if (lane == 0) {
			ack[UPCIE_NVME_CQMIRROR_SLOTS + s] = g; /* started: see attach */
			__threadfence_system();
		}
		__threadfence(); /* the slot's fields were written before its generation */
		dev = (const uint4 *)upcie_nvme_cqmirror_ld64_(&sl->dev_cq);
		host = (uint4 *)upcie_nvme_cqmirror_ld64_(&sl->host_cq);
		depth = upcie_nvme_cqmirror_ld32_(&sl->depth);
		upcie_nvme_cqmirror_pipe_(t, sl, g, dev, host, depth, &head, &phase, flags);
		upcie_nvme_cqmirror_step_(dev, host, depth, &head, &phase, flags);
		__syncwarp();
		if (lane == 0) {
			__threadfence_system(); /* the copies land before the acknowledgement */
			ack[s] = g;
			__threadfence_system();
		}
		acked = g;
	}
}

#if defined(UPCIE_NVME_CQMIRROR_KERNEL)
/*
 * The resident kernel: grid = UPCIE_NVME_CQMIRROR_SLOTS blocks of 32 threads; `ack` holds
 * 2 x UPCIE_NVME_CQMIRROR_SLOTS words (acknowledged, then started generations).
 */
extern "C" __global__ void __launch_bounds__(32)
    upcie_nvme_cqmirror_kernel(struct upcie_nvme_cqmirror_table *t, volatile uint32_t *ack)
{
	upcie_nvme_cqmirror_warp(t, ack, blockIdx.x);
}
#endif

#endif /* __CUDACC__ */

#endif /* UPCIE_GPUQ_CQMIRROR_CUDA_H */
