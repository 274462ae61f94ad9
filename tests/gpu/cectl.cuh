/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Copy-engine test controller: a CPU thread plays an NVMe controller the way a drive does it from
 * outside the SMs. It polls the SQ tail doorbells (host memory the GPU stores to), fetches the
 * entries from host-memory SQs, moves data between a namespace in pinned host memory and the
 * commands' PRPs with cuMemcpyHtoDAsync / cuMemcpyDtoHAsync, and posts completions into the CQ in
 * GPU memory with cuMemcpyHtoDAsync, all on one stream, so every write reaches VRAM through the
 * GPU's copy engines in the order a drive issues it: a command's data before its completion.
 *
 * Behaviours a drive may show, each a knob: `lag` reports in each completion the SQ head of the
 * round before (a stale SQHD); `ooo` posts each round's completions in reverse order and holds
 * every seventh command back one round; `fill` holds completions until the CQ can be filled to
 * depth - 1 (or 200 us passed), so the host meets a nearly full CQ; `split` writes each completion
 * as two copies, dw0..dw2 and then dw3. CDW3 knobs as the warp null controller (nullctl.cuh): bit
 * 0 drops the completion, bit 1 completes with the status in CDW3 bits 26:16, bit 2 delays it by
 * `delay_ns`. CQE dw0 echoes CDW2. Device addresses of data are GPU addresses + iova_offset (the
 * tests' scheme); PRP lists must be in the host heap (host_base..). A test instrument.
 */
#ifndef UPCIE_TEST_CECTL_CUH
#define UPCIE_TEST_CECTL_CUH

#include <cuda.h>

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <upcie/base/barrier.h>
#include <upcie/base/clock.h>
#include <upcie/nvme/spec.h>

#define CECTL_MAX_Q    8
#define CECTL_MAX_PEND 1024

struct cectl_pend {
	uint16_t cid, status;
	uint32_t dw0;
	uint64_t due; /* earliest post time (delay) */
	bool held;    /* held back one round (ooo) */
};

struct cectl_queue {
	const struct upcie_nvme_sqe *sq; /* CPU address (host memory) */
	CUdeviceptr cq;			 /* GPU address */
	volatile uint32_t *sqdb, *cqdb;	 /* CPU addresses */
	uint32_t depth;
	uint16_t qid;
	/* state */
	uint32_t sq_head, prev_head, cq_tail, cq_head, phase;
	struct upcie_nvme_cqe *stage; /* pinned, one per CQ slot */
	struct cectl_pend pend[CECTL_MAX_PEND];
	uint32_t npend;
	uint64_t fill_since;
	/* counters */
	unsigned long long ncmd, ncpl, ndrop, nerr, nbytes, nheld, maxfill, nfull, nlagged;
};

struct cectl {
	struct cectl_queue q[CECTL_MAX_Q];
	int nq;
	uint8_t *ns; /* pinned */
	uint64_t ns_bytes;
	uint32_t lba_shift;
	uint64_t iova_offset;
	const uint8_t *host_base; /* host heap: CPU address and its GPU address */
	CUdeviceptr host_base_dev;
	uint64_t host_size;
	uint32_t lag, ooo, fill, split;
	uint64_t delay_ns;
	CUcontext ctx;
	CUstream s;
	pthread_t th;
	volatile int stop;
	bool running;
	unsigned long long nfail; /* driver calls that failed, doorbells out of range */
};

/* The CPU address of host-heap memory at GPU address `d`, or NULL. */
static inline const void *cectl_host_ptr(const struct cectl *c, uint64_t d)
{
	if (d < c->host_base_dev || d - c->host_base_dev >= c->host_size)
		return NULL;
	return c->host_base + (d - c->host_base_dev);
}

/* One data segment: `n` bytes at device address `iova` <-> namespace offset `nso`. */
static inline int cectl_seg(struct cectl *c, uint64_t iova, uint64_t nso, uint64_t n, bool to_ns)
{
	CUdeviceptr d = (CUdeviceptr)(iova - c->iova_offset);
	CUresult r = to_ns ? cuMemcpyDtoHAsync(c->ns + nso, d, n, c->s)
			   : cuMemcpyHtoDAsync(d, c->ns + nso, n, c->s);

	if (r != CUDA_SUCCESS) {
		c->nfail++;
		return -1;
	}
	return 0;
}

static inline uint16_t cectl_xfer(struct cectl *c, const struct upcie_nvme_sqe *e, uint64_t nso,
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
	if (cectl_seg(c, prp1, nso, first, to_ns))
		return UPCIE_NVME_SC_DATA_XFER_ERROR;
	rem = bytes - first;
	nso += first;
	if (!rem)
		return 0;
	if (rem <= 4096) {
		if (prp2 & 4095)
			return UPCIE_NVME_SC_PRP_INVALID_OFFSET;
		return cectl_seg(c, prp2, nso, rem, to_ns) ? UPCIE_NVME_SC_DATA_XFER_ERROR : 0;
	}
	list = (const uint64_t *)cectl_host_ptr(c, prp2 - c->iova_offset);
	if ((prp2 & 7) || !list)
		return UPCIE_NVME_SC_PRP_INVALID_OFFSET;
	while (rem) {
		uint64_t ent = ((const volatile uint64_t *)list)[i], n = rem < 4096 ? rem : 4096;

		if (i == 511 && rem > 4096) {
			list = (const uint64_t *)cectl_host_ptr(c, ent - c->iova_offset);
			if (!list)
				return UPCIE_NVME_SC_PRP_INVALID_OFFSET;
			i = 0;
			continue;
		}
		if (ent & 4095)
			return UPCIE_NVME_SC_PRP_INVALID_OFFSET;
		if (cectl_seg(c, ent, nso, n, to_ns))
			return UPCIE_NVME_SC_DATA_XFER_ERROR;
		nso += n;
		rem -= n;
		i++;
	}
	return 0;
}

static inline uint16_t cectl_exec(struct cectl *c, struct cectl_queue *q,
				  const struct upcie_nvme_sqe *e)
{
	uint64_t slba = e->cdw10 | ((uint64_t)e->cdw11 << 32);
	uint64_t nlb = (e->cdw12 & 0xffffu) + 1, off, len;

	if (e->cdw3 & 0x2u)
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
		q->nbytes += len;
		return cectl_xfer(c, e, off, len, e->opc == UPCIE_NVME_NVM_WRITE);
	default:
		return UPCIE_NVME_SC_INVALID_OPCODE;
	}
}

/* Post what may be posted now, as far as the CQ has room. */
static inline void cectl_post(struct cectl *c, struct cectl_queue *q, uint64_t now)
{
	uint32_t used, room, n = 0, start, k, keep = 0, order[CECTL_MAX_PEND];
	uint16_t sqhd = (uint16_t)(c->lag ? q->prev_head : q->sq_head);

	if (!q->npend)
		return;
	q->cq_head = *q->cqdb;
	if (q->cq_head >= q->depth) {
		c->nfail++;
		return;
	}
	used =
	    q->cq_tail >= q->cq_head ? q->cq_tail - q->cq_head : q->cq_tail + q->depth - q->cq_head;
	room = q->depth - 1 - used;
	if (c->fill) {
		/* Hold until the CQ can be filled to depth - 1, or 200 us passed. */
		if (!q->fill_since)
			q->fill_since = now;
		if (q->npend < room && now - q->fill_since < 200 * UPCIE_NSEC_PER_USEC)
			return;
		q->fill_since = 0;
	}
	/* Postable, in posting order: reversed when ooo; held and not yet due ones stay. */
	for (uint32_t i = 0; i < q->npend; i++) {
		uint32_t j = c->ooo ? q->npend - 1 - i : i;
		struct cectl_pend *p = &q->pend[j];

		if (p->held || p->due > now || n >= room)
			continue;
		order[n++] = j;
	}
	if (!n) {
		for (uint32_t i = 0; i < q->npend; i++)
			q->pend[i].held = false;
		return;
	}
	start = q->cq_tail;
	for (k = 0; k < n; k++) {
		struct cectl_pend *p = &q->pend[order[k]];
		struct upcie_nvme_cqe *e = &q->stage[q->cq_tail];

		e->dw0 = p->dw0;
		e->dw1 = 0;
		e->dw2 = sqhd | ((uint32_t)q->qid << 16);
		e->dw3 =
		    upcie_nvme_cqe_dw3_make(p->cid, (uint8_t)q->phase, p->status, p->status != 0);
		q->nerr += p->status != 0;
		p->cid = 0xffff; /* posted */
		if (++q->cq_tail == q->depth) {
			q->cq_tail = 0;
			q->phase ^= 1u;
		}
	}
	if (sqhd != q->sq_head)
		q->nlagged++;
	/* Copies of contiguous runs (two at a wrap), or each entry in two parts. */
	for (k = 0; k < n;) {
		uint32_t slot = (start + k) % q->depth, run = n - k;
		CUresult r;

		if (run > q->depth - slot)
			run = q->depth - slot;
		if (c->split) {
			run = 1;
			r = cuMemcpyHtoDAsync(q->cq + slot * 16, &q->stage[slot], 12, c->s);
			if (r == CUDA_SUCCESS)
				r = cuMemcpyHtoDAsync(q->cq + slot * 16 + 12, &q->stage[slot].dw3,
						      4, c->s);
		} else {
			r = cuMemcpyHtoDAsync(q->cq + slot * 16, &q->stage[slot], run * 16, c->s);
		}
		if (r != CUDA_SUCCESS)
			c->nfail++;
		k += run;
	}
	q->ncpl += n;
	used += n;
	if (used > q->maxfill)
		q->maxfill = used;
	q->nfull += used == q->depth - 1;
	/* Keep the unposted ones; release the held ones for the next round. */
	for (uint32_t i = 0; i < q->npend; i++)
		if (q->pend[i].cid != 0xffff) {
			q->pend[keep] = q->pend[i];
			q->pend[keep].held = false;
			keep++;
		}
	q->npend = keep;
}

static inline void cectl_round(struct cectl *c, struct cectl_queue *q)
{
	uint32_t tail = *q->sqdb, fetched = 0;
	uint64_t now = upcie_time_ns();

	upcie_rmb(); /* entries behind the doorbell value read */
	if (tail >= q->depth) {
		c->nfail++;
		return;
	}
	q->prev_head = q->sq_head;
	while (q->sq_head != tail && fetched < 32 && q->npend < CECTL_MAX_PEND) {
		struct upcie_nvme_sqe e = q->sq[q->sq_head];
		uint16_t st;

		if (++q->sq_head == q->depth)
			q->sq_head = 0;
		fetched++;
		q->ncmd++;
		st = cectl_exec(c, q, &e);
		if (e.cdw3 & 0x1u) {
			q->ndrop++;
			continue;
		}
		q->pend[q->npend].cid = e.cid;
		q->pend[q->npend].status = st;
		q->pend[q->npend].dw0 = e.cdw2;
		q->pend[q->npend].due = (e.cdw3 & 0x4u) ? now + c->delay_ns : 0;
		q->pend[q->npend].held = c->ooo && q->ncmd % 7 == 3;
		q->nheld += q->pend[q->npend].held;
		q->npend++;
	}
	cectl_post(c, q, now);
}

static inline void *cectl_thread(void *arg)
{
	struct cectl *c = (struct cectl *)arg;

	cuCtxSetCurrent(c->ctx);
	while (!c->stop)
		for (int i = 0; i < c->nq; i++)
			if (c->q[i].depth)
				cectl_round(c, &c->q[i]);
	cuStreamSynchronize(c->s);
	return NULL;
}

/*
 * Staging for queue `q` of `depth` entries. Call before a resident kernel (the completion mirror)
 * starts: a pinned allocation or free may wait for it. 0 or -1.
 */
static inline int cectl_stage(struct cectl_queue *q, uint32_t depth)
{
	if (q->stage)
		return 0;
	return cuMemHostAlloc((void **)&q->stage, (size_t)depth * 16, 0) == CUDA_SUCCESS ? 0 : -1;
}

/* Set up `c` (zeroed by the caller, queues filled in); staging and the stream. 0 or -1. */
static inline int cectl_start(struct cectl *c)
{
	if (cuCtxGetCurrent(&c->ctx) != CUDA_SUCCESS ||
	    cuStreamCreate(&c->s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
		return -1;
	for (int i = 0; i < c->nq; i++) {
		struct cectl_queue *q = &c->q[i];

		if (!q->depth)
			continue;
		if (cectl_stage(q, q->depth))
			return -1;
		q->phase = q->phase ? q->phase : 1;
	}
	c->stop = 0;
	if (pthread_create(&c->th, NULL, cectl_thread, c))
		return -1;
	c->running = true;
	return 0;
}

/* Stop the thread and wait for its copies. Staging stays for a restart (cectl_free). */
static inline void cectl_stop(struct cectl *c)
{
	if (!c->running)
		return;
	c->stop = 1;
	pthread_join(c->th, NULL);
	cuStreamDestroy(c->s);
	c->s = NULL;
	c->running = false;
}

static inline void cectl_free(struct cectl *c)
{
	cectl_stop(c);
	for (int i = 0; i < CECTL_MAX_Q; i++)
		if (c->q[i].stage)
			cuMemFreeHost(c->q[i].stage);
	memset(c, 0, sizeof(*c));
}

#endif /* UPCIE_TEST_CECTL_CUH */
