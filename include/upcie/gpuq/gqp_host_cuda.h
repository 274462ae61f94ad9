/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Host side of GPU-resident queue pairs (gpuq/gqp_cuda.h): the memory and the device-resident
 * state of a queue pair that CUDA kernels drive.
 *
 * upcie_nvme_gqp_create() places the CQ in the device heap and the SQ there too, or with
 * UPCIE_NVME_GQP_SQ_HOSTMEM in the host heap (mapped into the GPU): a controller fetches entries
 * from host DRAM faster than across the root complex from the GPU, and the GPU's posted 16-byte
 * stores cost it little. PRP list pages (UPCIE_NVME_GQP_PRP_LISTS, one 4 KiB page per CID) go
 * where the SQ goes. The doorbells are the caller's: addresses GPU code can store to (device or
 * mapped host memory, as with the test controller), or, with UPCIE_NVME_GQP_DB_IOMEM, addresses
 * in the process's mapping of the controller's BAR0, mapped for the GPU here
 * (upcie_gpu_cuda_iomem_map(): cuMemHostRegister with CU_MEMHOSTREGISTER_IOMEMORY).
 * What it returns (sq_iova, cq_iova, depth) is what Create I/O CQ and Create I/O SQ take; issuing
 * those (and deleting the queues before destroy) is the controller layer's job. `dq` is the
 * device address to hand to kernels.
 *
 * Creation refuses a GPU that does not promise ordered peer writes into its memory
 * (upcie_gpu_cuda_dev_peer_order(): -EOPNOTSUPP), since GPU code takes a completion as the sign
 * that its payload is there. The state and CQ are initialised by copies on a stream of the queue's
 * own (copy engine, no kernel) that creation waits for, bounded: when it returns, no kernel on any
 * stream can find an old entry in the CQ, also where persistent kernels fill every SM.
 *
 * Destruction never waits for the whole context (a resident kernel would hold that forever): the
 * queue state counts the warps between upcie_nvme_gqp_begin() and _end(), and destroy frees
 * nothing while that count stays non-zero (-EBUSY after UPCIE_NVME_GQP_DESTROY_TIMEOUT_NS). Kernels
 * launched with the queue that have not begun it yet are the caller's to finish or stop first.
 *
 * A GPU-issued queue pair and a mirrored completion queue (gpuq/cqmirror_host_cuda.h) exclude each
 * other in a process (-EBUSY). Creation and destruction are host calls from any thread; the queue
 * pair itself has one owner warp at a time (see gqp_cuda.h).
 *
 * Limits: with the LUT heap (IMPORT) an SQ of 1024 entries and a CQ of 4096 fill one 64 KiB
 * granule, the most a physically contiguous queue can be there.
 */
#ifndef UPCIE_GPUQ_GQP_HOST_CUDA_H
#define UPCIE_GPUQ_GQP_HOST_CUDA_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include <upcie/base/clock.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/gpu/dev_cuda.h>
#include <upcie/gpu/heap_cuda.h>
#include <upcie/mem/heap.h>
#include <upcie/gpuq/gqp_cuda.h>
#include <upcie/nvme/spec.h>

/* Flags UPCIE_NVME_GQP_SQ_HOSTMEM, _DB_IOMEM, _PRP_LISTS, _SQ_COOP_STORES, _HOST_DATA:
 * gpuq/gqp_cuda.h. */

/* How long creation waits for its copies, and destroy for warps to leave the queue. */
#ifndef UPCIE_NVME_GQP_SETUP_TIMEOUT_NS
#define UPCIE_NVME_GQP_SETUP_TIMEOUT_NS (2 * UPCIE_NSEC_PER_SEC)
#endif
#ifndef UPCIE_NVME_GQP_DESTROY_TIMEOUT_NS
#define UPCIE_NVME_GQP_DESTROY_TIMEOUT_NS (1 * UPCIE_NSEC_PER_SEC)
#endif

struct upcie_nvme_gqp_cfg {
	uint16_t qid;		 /* for messages and synthesized fields */
	uint32_t depth;		 /* SQ and CQ entries, 2..65536 */
	uint32_t ncids;		 /* outstanding commands, 1..depth - 1; 0: depth - 1 */
	unsigned flags;		 /* UPCIE_NVME_GQP_* */
	volatile uint32_t *sqdb; /* SQ tail doorbell (see DB_IOMEM) */
	volatile uint32_t *cqdb; /* CQ head doorbell */
};

struct upcie_nvme_gqp_host {
	struct upcie_nvme_gqp *dq; /* device address of the queue state: pass to kernels */
	uint64_t sq_iova;	   /* Create I/O SQ: PRP1 */
	uint64_t cq_iova;	   /* Create I/O CQ: PRP1 */
	uint32_t depth;
	uint16_t qid;
	unsigned flags;
	struct upcie_gpu_cuda gpu; /* borrowed: the caller's handle stays open */
	struct upcie_heap_buf sq, cq, lists, tab;
	bool have_sq, have_cq, have_lists, have_tab, counted;
	CUdeviceptr tables;			  /* the state and the per-CID tables */
	volatile uint32_t *sqdb_host, *cqdb_host; /* DB_IOMEM: as passed in, to unmap */
};

/* Bytes of the device-resident block: state, then per-CID completions, states, free stack, list
 * addresses. */
static inline size_t upcie_nvme_gqp_tables_size_(uint32_t ncids, size_t *o_cpl, size_t *o_state,
						 size_t *o_free, size_t *o_list)
{
	size_t o = (sizeof(struct upcie_nvme_gqp) + 255) & ~(size_t)255;

	*o_cpl = o;
	o += (size_t)ncids * 16;
	*o_state = o;
	o += ((size_t)ncids * 4 + 15) & ~(size_t)15;
	*o_free = o;
	o += ((size_t)ncids * 2 + 15) & ~(size_t)15;
	*o_list = o;
	o += (size_t)ncids * 8;
	return o;
}

static inline void upcie_nvme_gqp_release_(struct upcie_nvme_gqp_host *h)
{
	struct upcie_gpu_cuda *gpu = &h->gpu;

	if (h->have_tab)
		upcie_gpu_cuda_free(gpu, &h->tab);
	if (h->have_lists) {
		if (h->flags & UPCIE_NVME_GQP_SQ_HOSTMEM)
			upcie_gpu_cuda_host_free(gpu, &h->lists);
		else
			upcie_gpu_cuda_free(gpu, &h->lists);
	}
	if (h->have_sq) {
		if (h->flags & UPCIE_NVME_GQP_SQ_HOSTMEM)
			upcie_gpu_cuda_host_free(gpu, &h->sq);
		else
			upcie_gpu_cuda_free(gpu, &h->sq);
	}
	if (h->have_cq)
		upcie_gpu_cuda_free(gpu, &h->cq);
	if (h->sqdb_host)
		upcie_gpu_cuda_iomem_unmap(gpu, h->sqdb_host);
	if (h->cqdb_host)
		upcie_gpu_cuda_iomem_unmap(gpu, h->cqdb_host);
	if (h->counted) {
		pthread_mutex_lock(&upcie_gpu_cuda_lock_g);
		gpu->p->ngqp--;
		pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
	}
	memset(h, 0, sizeof(*h));
}

/* One copy between host memory and the device, for upcie_nvme_gqp_xfer_(). */
struct upcie_nvme_gqp_copy_ {
	CUdeviceptr dev;
	void *host;
	size_t len;
	bool to_dev;
};

/*
 * Run `n` copies in order on a stream of their own (copy engine; no kernel, so no SM needed) and
 * wait for them at most `timeout_ns`. Returns 0, -ETIMEDOUT, a CUDA error.
 */
static inline int upcie_nvme_gqp_xfer_(struct upcie_gpu_cuda *gpu,
				       const struct upcie_nvme_gqp_copy_ *c, int n,
				       uint64_t timeout_ns, const char *what)
{
	struct upcie_gpu_cuda_ctx_save save;
	CUstream s = NULL;
	CUresult r;
	int err = upcie_gpu_cuda_dev_enter(&gpu->p->dev, &save);

	if (err)
		return err;
	r = cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	for (int i = 0; i < n && r == CUDA_SUCCESS; i++)
		r = c[i].to_dev ? cuMemcpyHtoDAsync(c[i].dev, c[i].host, c[i].len, s)
				: cuMemcpyDtoHAsync(c[i].host, c[i].dev, c[i].len, s);
	if (r != CUDA_SUCCESS)
		err = UPCIE_GPU_CUDA_FAIL(r, "cuStreamCreate/cuMemcpyAsync", "%s", what);
	if (!err)
		err = upcie_gpu_cuda_stream_wait(s, timeout_ns, what);
	if (s)
		cuStreamDestroy(s);
	upcie_gpu_cuda_dev_leave(&gpu->p->dev, &save);
	return err;
}

/*
 * Create the memory and device state of a GPU-resident queue pair (see above). The CQ is zeroed;
 * the state starts at tail 0, head 0, phase 1, matching queues the controller is about to create.
 * Returns 0; -EINVAL (bad depth, CIDs or doorbells); -EBUSY (a mirrored completion queue is
 * open); -EOPNOTSUPP (the GPU does not promise ordered peer writes); -ENOMEM (heap full);
 * -ETIMEDOUT (the initial copies did not finish: the memory stays allocated, since they may
 * still land); a CUDA error. `h` is zeroed on failure.
 */
static inline int upcie_nvme_gqp_create(struct upcie_nvme_gqp_host *h, struct upcie_gpu_cuda *gpu,
					const struct upcie_nvme_gqp_cfg *cfg)
{
	size_t o_cpl, o_state, o_free, o_list, tsize;
	struct upcie_nvme_gqp_copy_ cp[2];
	bool hostsq;
	struct upcie_nvme_gqp st;
	CUdeviceptr sqdb, cqdb;
	uint32_t ncids;
	char *tab = NULL, *zero = NULL;
	int err;

	if (!h || !gpu || !gpu->p || !cfg)
		return UPCIE_FAIL(-EINVAL, "nvme: gqp: NULL argument or closed provider");
	memset(h, 0, sizeof(*h));
	ncids = cfg->ncids ? cfg->ncids : cfg->depth - 1;
	if (cfg->depth < 2 || cfg->depth > 65536 || !ncids || ncids > cfg->depth - 1 ||
	    ncids > 65535)
		return UPCIE_FAIL(-EINVAL, "nvme: gqp %u: depth %u with %u CIDs", cfg->qid,
				  cfg->depth, ncids);
	if (cfg->flags &
	    ~(UPCIE_NVME_GQP_SQ_HOSTMEM | UPCIE_NVME_GQP_DB_IOMEM | UPCIE_NVME_GQP_PRP_LISTS |
	      UPCIE_NVME_GQP_SQ_COOP_STORES | UPCIE_NVME_GQP_HOST_DATA))
		return UPCIE_FAIL(-EINVAL, "nvme: gqp %u: unknown flags 0x%x", cfg->qid,
				  cfg->flags);
	if (cfg->flags & UPCIE_NVME_GQP_HOST_DATA)
		UPCIE_WARN(
		    "nvme: gqp %u: payloads in host memory accepted on the caller's word that "
		    "the platform orders the controller's host-memory writes before its "
		    "completions in GPU memory",
		    cfg->qid);
	if (!cfg->sqdb || !cfg->cqdb || (((uintptr_t)cfg->sqdb | (uintptr_t)cfg->cqdb) & 3))
		return UPCIE_FAIL(-EINVAL, "nvme: gqp %u: doorbells missing or misaligned",
				  cfg->qid);
	err = upcie_gpu_cuda_dev_peer_order(&gpu->p->dev, "a GPU-issued queue pair");
	if (err)
		return err;
	h->gpu = *gpu;
	h->flags = cfg->flags;
	h->qid = cfg->qid;
	h->depth = cfg->depth;
	hostsq = cfg->flags & UPCIE_NVME_GQP_SQ_HOSTMEM;

	pthread_mutex_lock(&upcie_gpu_cuda_lock_g);
	err = gpu->p->nmirror ? -EBUSY : 0;
	if (!err)
		gpu->p->ngqp++;
	pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
	if (err)
		return UPCIE_FAIL(err,
				  "nvme: gqp %u: a mirrored completion queue is open; GPU-issued "
				  "and mirrored queues exclude each other",
				  cfg->qid);
	h->counted = true;

	/* Rings: each one physically contiguous (one granule of LUT memory), page aligned. */
	err = upcie_heap_alloc_array(&gpu->p->dheap, 1, (uint64_t)cfg->depth * 16, 4096, &h->cq);
	if (err)
		goto fail;
	h->have_cq = true;
	err = upcie_heap_alloc_array(hostsq ? &gpu->p->hheap : &gpu->p->dheap, 1,
				     (uint64_t)cfg->depth * 64, 4096, &h->sq);
	if (err)
		goto fail;
	h->have_sq = true;
	if (cfg->flags & UPCIE_NVME_GQP_PRP_LISTS) {
		err = upcie_heap_alloc_array(hostsq ? &gpu->p->hheap : &gpu->p->dheap, ncids,
					     UPCIE_NVME_GQP_PAGE, UPCIE_NVME_GQP_PAGE, &h->lists);
		if (err)
			goto fail;
		h->have_lists = true;
	}
	h->sq_iova = h->sq.iova;
	h->cq_iova = h->cq.iova;

	if (cfg->flags & UPCIE_NVME_GQP_DB_IOMEM) {
		err = upcie_gpu_cuda_iomem_map(gpu, cfg->sqdb, 4, &sqdb);
		if (err)
			goto fail;
		h->sqdb_host = cfg->sqdb;
		err = upcie_gpu_cuda_iomem_map(gpu, cfg->cqdb, 4, &cqdb);
		if (err)
			goto fail;
		h->cqdb_host = cfg->cqdb;
	} else {
		sqdb = (CUdeviceptr)(uintptr_t)cfg->sqdb;
		cqdb = (CUdeviceptr)(uintptr_t)cfg->cqdb;
	}

	tsize = upcie_nvme_gqp_tables_size_(ncids, &o_cpl, &o_state, &o_free, &o_list);
	tab = (char *)calloc(1, tsize);
	zero = (char *)calloc(1, (size_t)cfg->depth * 16);
	if (!tab || !zero) {
		err = UPCIE_FAIL(-ENOMEM, "nvme: gqp %u: out of host memory", cfg->qid);
		goto fail;
	}
	/* From the device heap, not cuMemAlloc: cuMemFree waits for a context with resident
	 * kernels to go idle, which destroy must not. */
	err = upcie_gpu_cuda_alloc(gpu, tsize, 256, &h->tab);
	if (err)
		goto fail;
	h->have_tab = true;
	h->tables = (CUdeviceptr)(uintptr_t)h->tab.vaddr;
	memset(&st, 0, sizeof(st));
	st.sq = hostsq ? (struct upcie_nvme_sqe *)(uintptr_t)upcie_gpu_cuda_host_devptr(gpu,
											h->sq.vaddr)
		       : (struct upcie_nvme_sqe *)h->sq.vaddr;
	st.cq = (struct upcie_nvme_cqe *)h->cq.vaddr;
	st.sqdb = (volatile uint32_t *)(uintptr_t)sqdb;
	st.cqdb = (volatile uint32_t *)(uintptr_t)cqdb;
	st.cpl = (struct upcie_nvme_cqe *)(uintptr_t)(h->tables + o_cpl);
	st.state = (uint32_t *)(uintptr_t)(h->tables + o_state);
	st.cid_free = (uint16_t *)(uintptr_t)(h->tables + o_free);
	if (h->have_lists) {
		uint64_t *li = (uint64_t *)(tab + o_list);
		const struct upcie_heap *lh = hostsq ? &gpu->p->hheap : &gpu->p->dheap;

		for (uint32_t c = 0; c < ncids; c++)
			li[c] = upcie_dmamem_iova_fast(lh->mem, h->lists.off + c * h->lists.stride);
		st.list_va =
		    hostsq ? (char *)(uintptr_t)upcie_gpu_cuda_host_devptr(gpu, h->lists.vaddr)
			   : (char *)h->lists.vaddr;
		st.list_iova = (const uint64_t *)(uintptr_t)(h->tables + o_list);
		st.list_stride = h->lists.stride;
	}
	st.depth = cfg->depth;
	st.ncids = ncids;
	st.qid = cfg->qid;
	st.flags = (uint16_t)cfg->flags;
	st.phase = 1;
	st.nfree = ncids;
	for (uint32_t i = 0; i < ncids; i++) /* lowest CID on top, as in the core */
		((uint16_t *)(tab + o_free))[i] = (uint16_t)(ncids - 1 - i);
	memcpy(tab, &st, sizeof(st));
	/*
	 * The CQ is cleared and the state written by copies waited for here, not by cuMemsetD8 on
	 * the legacy stream: that one is asynchronous for device memory and does not order against
	 * non-blocking streams, so a kernel already running could poll the CQ before the clear.
	 */
	cp[0].dev = (CUdeviceptr)(uintptr_t)h->cq.vaddr;
	cp[0].host = zero;
	cp[0].len = (size_t)cfg->depth * 16;
	cp[0].to_dev = true;
	cp[1].dev = h->tables;
	cp[1].host = tab;
	cp[1].len = tsize;
	cp[1].to_dev = true;
#if defined(UPCIE_NVME_GQP_TEST_CLEAR_UNORDERED)
	/* Negative control of the test: the clear as it was (legacy stream, not waited for). */
	if (cuMemsetD8((CUdeviceptr)(uintptr_t)h->cq.vaddr, 0, (size_t)cfg->depth * 16) !=
	    CUDA_SUCCESS)
		err = -EIO;
	if (!err)
		err = upcie_nvme_gqp_xfer_(gpu, cp + 1, 1, UPCIE_NVME_GQP_SETUP_TIMEOUT_NS,
					   "gqp: initial state");
#else
	err = upcie_nvme_gqp_xfer_(gpu, cp, 2, UPCIE_NVME_GQP_SETUP_TIMEOUT_NS,
				   "gqp: CQ clear and initial state");
#endif
	if (err == -ETIMEDOUT) {
		UPCIE_ERR("nvme: gqp %u: the initial copies may still land: its memory stays "
			  "allocated",
			  cfg->qid);
		free(tab);
		free(zero);
		memset(h, 0, sizeof(*h));
		return err;
	}
	if (err)
		goto fail;
	free(tab);
	free(zero);
	h->dq = (struct upcie_nvme_gqp *)(uintptr_t)h->tables;
	return 0;
fail:
	free(tab);
	free(zero);
	upcie_nvme_gqp_release_(h);
	return err;
}

/*
 * Copy the queue pair's device state (ring indices, counters) into *st, for diagnostics once no
 * kernel drives it. Returns 0 or a CUDA error.
 */
static inline int upcie_nvme_gqp_read(struct upcie_nvme_gqp_host *h, struct upcie_nvme_gqp *st)
{
	struct upcie_nvme_gqp_copy_ c;

	c.dev = h->tables;
	c.host = st;
	c.len = sizeof(*st);
	c.to_dev = false;
	return upcie_nvme_gqp_xfer_(&h->gpu, &c, 1, UPCIE_NVME_GQP_SETUP_TIMEOUT_NS,
				    "gqp: reading the queue state");
}

/*
 * Free the queue pair. The controller must have deleted its queues, and kernels that may still
 * begin the queue must have finished. Waits up to UPCIE_NVME_GQP_DESTROY_TIMEOUT_NS for warps
 * between upcie_nvme_gqp_begin() and _end() to leave; never for the whole context, so kernels
 * that do not use the queue (a resident one too) do not hold it. Returns 0; -EBUSY (a warp still
 * holds the queue: nothing freed, call again once it has ended); a CUDA error (nothing freed). A
 * zeroed `h` is a no-op.
 */
static inline int upcie_nvme_gqp_destroy(struct upcie_nvme_gqp_host *h)
{
	uint64_t t0;
	int err;

	if (!h || !h->gpu.p)
		return 0;
	t0 = upcie_time_ns();
	for (;;) {
		struct upcie_nvme_gqp st;

		err = upcie_nvme_gqp_read(h, &st);
		if (err)
			return err;
		if (!st.users)
			break;
		if (upcie_time_ns() - t0 >= UPCIE_NVME_GQP_DESTROY_TIMEOUT_NS)
			return UPCIE_FAIL(-EBUSY,
					  "nvme: gqp %u: %u warps still hold the queue (between "
					  "upcie_nvme_gqp_begin and _end) after %" PRIu64
					  " ms; nothing freed",
					  h->qid, st.users,
					  (uint64_t)(UPCIE_NVME_GQP_DESTROY_TIMEOUT_NS / 1000000));
		sched_yield();
	}
	upcie_nvme_gqp_release_(h);
	return 0;
}

#endif /* UPCIE_GPUQ_GQP_HOST_CUDA_H */
