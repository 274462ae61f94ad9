/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * GPU null controller: a kernel that plays an NVMe controller for the GPU tests and benchmarks on
 * a machine without NVMe. One warp serves one queue pair: it watches the SQ tail doorbell, fetches
 * entries (from device memory or from host memory mapped into the GPU), moves data between a
 * namespace buffer in device memory and the command's PRPs (PRP1, PRP2, PRP lists with chaining),
 * translating device addresses by the tests' own scheme (address = virtual address + offset),
 * and posts completions with phase tags, honouring the CQ head doorbell for room.
 *
 * Commands: Flush (no data), Write, Read (NLB in CDW12, SLBA in CDW10/11, block size 512 B
 * or 4 KiB), anything else completes with Invalid Opcode. CQE dw0 echoes CDW2 (a tag the tests
 * check). Knobs: CDW3 bit 0 drops the completion, bit 1 completes with the status code in CDW3
 * bits 26:16 (and DNR), bit 2 delays the completion by `delay_ns`; `ooo` posts each fetched batch
 * in reverse order; `lean` (benchmarks) orders with GPU-scope acquire/release instead of two
 * system-scope fences per batch, valid when every party but the controller is this GPU (it
 * reads the doorbell with ld.acquire.gpu, and fences before the completions only when the batch
 * moved data); `split_ns` writes each completion as dw0..dw2, a fence, `split_ns` of waiting,
 * then dw3 (the CQE tear tests). A test instrument: it checks what a real controller checks only where the
 * tests need it (PRP alignment, LBA range).
 */
#ifndef UPCIE_TEST_NULLCTL_CUH
#define UPCIE_TEST_NULLCTL_CUH

#include <stdint.h>

#include <upcie/nvme/qpair_port.h>
#include <upcie/nvme/spec.h>

#define NULLCTL_MAX_Q	  128
#define NULLCTL_TAG_DROP  0x1u
#define NULLCTL_TAG_ERROR 0x2u
#define NULLCTL_TAG_DELAY 0x4u

struct nullctl_queue {
	const struct upcie_nvme_sqe *sq; /* as the controller reaches it */
	struct upcie_nvme_cqe *cq;
	volatile uint32_t *sqdb;
	volatile uint32_t *cqdb;
	uint32_t depth; /* 0: not served */
	uint16_t qid;
	uint16_t smid; /* the SM the serving warp ran on (written at the end) */
	/* Controller state, kept across launches (start a new queue with phase 1, rest 0). */
	uint32_t sq_head, cq_tail, cq_head, phase;
	unsigned long long ncmd, ncpl, ndrop, nerr, nbytes, nbatch;
};

struct nullctl {
	struct nullctl_queue q[NULLCTL_MAX_Q];
	uint32_t nq;
	uint32_t ooo;
	uint32_t lba_shift;
	uint32_t lean;
	volatile uint32_t *stop; /* host-mapped: non-zero ends every warp */
	uint64_t iova_offset;	 /* device address = virtual address + iova_offset */
	uint8_t *ns;
	uint64_t ns_bytes;
	uint64_t delay_ns;
	uint32_t split_ns;
};

__device__ static inline uint64_t nullctl_now(void)
{
	uint64_t t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

__device__ static inline uint8_t *nullctl_ptr(const struct nullctl *c, uint64_t iova)
{
	return (uint8_t *)(uintptr_t)(iova - c->iova_offset);
}

/*
 * Data stores cached at L2 only, as a device's writes arrive there. (Volatile stores, which this
 * used before, left no stale line in a reader's L1 on the H200: with them the stale-read tests saw
 * 0 of 16000 stale reads without the reader's acquire fence, the copy engine 16000.)
 */
__device__ static inline void nullctl_st16(void *p, uint4 v)
{
	asm volatile("st.global.cg.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
		     "r"(v.z), "r"(v.w)
		     : "memory");
}

__device__ static inline void nullctl_copy(uint8_t *dst, const uint8_t *src, uint64_t n)
{
	if (!(((uintptr_t)dst | (uintptr_t)src | n) & 15)) {
		for (uint64_t i = 0; i < n; i += 16)
			nullctl_st16(dst + i, upcie_nvme_port_ld16(src + i));
		return;
	}
	for (uint64_t i = 0; i < n; i++)
		((volatile uint8_t *)dst)[i] = ((const volatile uint8_t *)src)[i];
}

/* Move `bytes` between the namespace at `nsp` and the command's PRPs. 0 or an NVMe status. */
__device__ static inline uint16_t nullctl_xfer(const struct nullctl *c,
					       const struct upcie_nvme_sqe *e, uint8_t *nsp,
					       uint64_t bytes, bool to_ns)
{
	uint64_t prp1 = e->prp1, prp2 = e->prp2, first, rem;
	const uint64_t *list;
	uint32_t i = 0;

	if (prp1 & 3)
		return UPCIE_NVME_SC_PRP_INVALID_OFFSET;
	first = 4096 - (prp1 & 4095);
	if (first > bytes)
		first = bytes;
	if (to_ns)
		nullctl_copy(nsp, nullctl_ptr(c, prp1), first);
	else
		nullctl_copy(nullctl_ptr(c, prp1), nsp, first);
	rem = bytes - first;
	nsp += first;
	if (!rem)
		return 0;
	if (rem <= 4096) {
		if (prp2 & 4095)
			return UPCIE_NVME_SC_PRP_INVALID_OFFSET;
		if (to_ns)
			nullctl_copy(nsp, nullctl_ptr(c, prp2), rem);
		else
			nullctl_copy(nullctl_ptr(c, prp2), nsp, rem);
		return 0;
	}
	if (prp2 & 7)
		return UPCIE_NVME_SC_PRP_INVALID_OFFSET;
	list = (const uint64_t *)nullctl_ptr(c, prp2);
	while (rem) {
		uint64_t ent = ((const volatile uint64_t *)list)[i], n = rem < 4096 ? rem : 4096;

		if (i == 511 && rem > 4096) { /* chained to the next list page */
			list = (const uint64_t *)nullctl_ptr(c, ent);
			i = 0;
			continue;
		}
		if (ent & 4095)
			return UPCIE_NVME_SC_PRP_INVALID_OFFSET;
		if (to_ns)
			nullctl_copy(nsp, nullctl_ptr(c, ent), n);
		else
			nullctl_copy(nullctl_ptr(c, ent), nsp, n);
		nsp += n;
		rem -= n;
		i++;
	}
	return 0;
}

/* Execute one command: the status code (SCT << 8 | SC). */
__device__ static inline uint16_t
nullctl_exec(const struct nullctl *c, const struct upcie_nvme_sqe *e, unsigned long long *bytes)
{
	uint64_t slba = e->cdw10 | ((uint64_t)e->cdw11 << 32);
	uint64_t nlb = (e->cdw12 & 0xffffu) + 1, off, len;

	if (e->cdw3 & NULLCTL_TAG_ERROR)
		return (uint16_t)((e->cdw3 >> 16) & 0x7ffu);
	switch (e->opc) {
	case UPCIE_NVME_NVM_FLUSH:
		return 0;
	case UPCIE_NVME_NVM_WRITE:
	case UPCIE_NVME_NVM_READ:
		off = slba << c->lba_shift;
		len = nlb << c->lba_shift;
		if (off >= c->ns_bytes || len > c->ns_bytes - off)
			return UPCIE_NVME_SC_LBA_RANGE;
		*bytes += len;
		return nullctl_xfer(c, e, c->ns + off, len, e->opc == UPCIE_NVME_NVM_WRITE);
	default:
		return UPCIE_NVME_SC_INVALID_OPCODE;
	}
}

/* One warp serving queue q until *stop (Lean: c->lean, compiled apart so the fenced loop stays
 * as it was). */
template <bool Lean, bool Split>
__device__ static inline void nullctl_serve(struct nullctl *c, struct nullctl_queue *q)
{
	uint32_t lane = threadIdx.x & 31, depth = q->depth;
	uint32_t sq_head = q->sq_head, cq_tail = q->cq_tail, cq_head = q->cq_head;
	uint32_t phase = q->phase, idle = 0;
	unsigned long long ncmd = 0, ncpl = 0, ndrop = 0, nerr = 0, nbytes = 0, nbatch = 0;

	for (;;) {
		uint32_t tail, n, room, used, slot, ncq, rank, pos, ph;
		struct upcie_nvme_sqe e;
		uint16_t status = 0;
		bool act, drop = false, delay = false, moved = false;
		uint32_t keep, dm;

		if (Lean)
			asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
				     : "=r"(tail)
				     : "l"(q->sqdb)
				     : "memory");
		else
			tail = *q->sqdb;

		if (tail == sq_head || tail >= depth) {
			if ((++idle & 255) == 0 && *c->stop)
				break;
			continue;
		}
		idle = 0;
		n = tail >= sq_head ? tail - sq_head : tail + depth - sq_head;
		if (n > 32)
			n = 32;
		used = cq_tail >= cq_head ? cq_tail - cq_head : cq_tail + depth - cq_head;
		room = depth - 1 - used;
		if (room < n) {
			cq_head = *q->cqdb;
			used = cq_tail >= cq_head ? cq_tail - cq_head : cq_tail + depth - cq_head;
			room = depth - 1 - used;
			if (!room) {
				if ((++idle & 255) == 0 && *c->stop)
					break;
				continue;
			}
			if (room < n)
				n = room;
		}
		if (!Lean)
			__threadfence_system(); /* entries behind the doorbell value we read */
		act = lane < n;
		if (act) {
			const uint4 *src;
			uint4 *dst = (uint4 *)&e;

			slot = sq_head + lane;
			if (slot >= depth)
				slot -= depth;
			src = (const uint4 *)&q->sq[slot];
			dst[0] = upcie_nvme_port_ld16(src);
			dst[1] = upcie_nvme_port_ld16(src + 1);
			dst[2] = upcie_nvme_port_ld16(src + 2);
			dst[3] = upcie_nvme_port_ld16(src + 3);
			drop = e.cdw3 & NULLCTL_TAG_DROP;
			delay = e.cdw3 & NULLCTL_TAG_DELAY;
			if (Lean) {
				unsigned long long b0 = nbytes;

				status = nullctl_exec(c, &e, &nbytes);
				moved = nbytes != b0;
			} else {
				status = nullctl_exec(c, &e, &nbytes);
			}
		}
		sq_head += n;
		if (sq_head >= depth)
			sq_head -= depth;
		if (__any_sync(0xffffffffu, delay)) {
			uint64_t until = nullctl_now() + c->delay_ns;

			while (nullctl_now() < until)
				;
		}
		if (!Lean)
			__threadfence_system(); /* data before completions */
		else if (__any_sync(0xffffffffu, moved))
			__threadfence();
		keep = __ballot_sync(0xffffffffu, act && !drop);
		dm = __ballot_sync(0xffffffffu, act && drop);
		ncq = __popc(keep);
		rank = __popc(keep & ((1u << lane) - 1));
		if (act && !drop) {
			uint4 cqe;

			pos = c->ooo ? ncq - 1 - rank : rank;
			slot = cq_tail + pos;
			ph = phase;
			if (slot >= depth) {
				slot -= depth;
				ph ^= 1u;
			}
			cqe.x = e.cdw2;
			cqe.y = 0;
			cqe.z = sq_head | ((uint32_t)q->qid << 16);
			cqe.w = upcie_nvme_cqe_dw3_make(e.cid, ph, status, status != 0);
			if (Split) {
				uint32_t *d = (uint32_t *)&q->cq[slot];
				uint64_t until;

				asm volatile("st.global.cg.v2.u32 [%0], {%1, %2};" ::"l"(d),
					     "r"(cqe.x), "r"(cqe.y)
					     : "memory");
				asm volatile("st.global.cg.u32 [%0], %1;" ::"l"(d + 2), "r"(cqe.z)
					     : "memory");
				__threadfence();
				until = nullctl_now() + c->split_ns;
				while (nullctl_now() < until)
					;
				asm volatile("st.global.cg.u32 [%0], %1;" ::"l"(d + 3), "r"(cqe.w)
					     : "memory");
			} else
				asm volatile("st.global.cg.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(
						 &q->cq[slot]),
					     "r"(cqe.x), "r"(cqe.y), "r"(cqe.z), "r"(cqe.w)
					     : "memory");
		}
		cq_tail += ncq;
		if (cq_tail >= depth) {
			cq_tail -= depth;
			phase ^= 1u;
		}
		ncmd += n;
		ncpl += ncq;
		ndrop += __popc(dm);
		nerr += __popc(__ballot_sync(0xffffffffu, act && !drop && status));
		nbatch++;
	}
	/* Per-lane byte counts summed. */
	for (int o = 16; o; o >>= 1)
		nbytes += __shfl_down_sync(0xffffffffu, nbytes, o);
	__syncwarp();
	if (lane == 0) {
		uint32_t sm;

		asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
		q->smid = (uint16_t)sm;
		q->sq_head = sq_head;
		q->cq_tail = cq_tail;
		q->cq_head = cq_head;
		q->phase = phase;
		q->ncmd = ncmd;
		q->ncpl = ncpl;
		q->ndrop = ndrop;
		q->nerr = nerr;
		q->nbytes = nbytes;
		q->nbatch = nbatch;
	}
}

/* Grid: one block of 32 threads per queue. */
__global__ void nullctl_kernel(struct nullctl *c)
{
	if (blockIdx.x >= c->nq)
		return;
	if (c->split_ns)
		nullctl_serve<false, true>(c, &c->q[blockIdx.x]);
	else if (c->lean)
		nullctl_serve<true, false>(c, &c->q[blockIdx.x]);
	else
		nullctl_serve<false, false>(c, &c->q[blockIdx.x]);
}

#endif /* UPCIE_TEST_NULLCTL_CUH */
