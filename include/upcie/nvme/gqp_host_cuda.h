/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Host side of GPU-resident queue pairs (nvme/gqp_cuda.h): the memory and the device-resident
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
 * A GPU-issued queue pair and a mirrored completion queue (nvme/cqmirror_host_cuda.h) exclude each
 * other in a process (-EBUSY), because destroying a GPU-issued queue pair synchronises the
 * context (cuCtxSynchronize, so that no kernel still uses it), which would wait forever for the
 * resident mirror kernel. Creation and destruction are host calls from any thread; the queue pair
 * itself has one owner warp at a time (see gqp_cuda.h).
 *
 * Limits: with the LUT heap (IMPORT) an SQ of 1024 entries and a CQ of 4096 fill one 64 KiB
 * granule, the most a physically contiguous queue can be there.
 */
#ifndef UPCIE_NVME_GQP_HOST_CUDA_H
#define UPCIE_NVME_GQP_HOST_CUDA_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/gpu/dev_cuda.h>
#include <upcie/gpu/heap_cuda.h>
#include <upcie/mem/heap.h>
#include <upcie/nvme/gqp_cuda.h>
#include <upcie/nvme/spec.h>

/* Flags UPCIE_NVME_GQP_SQ_HOSTMEM, _DB_IOMEM, _PRP_LISTS, _SQ_COOP_STORES: nvme/gqp_cuda.h. */

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
	struct upcie_heap_buf sq, cq, lists;
	bool have_sq, have_cq, have_lists, counted;
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
	o += ((size_t)ncids + 15) & ~(size_t)15;
	*o_free = o;
	o += ((size_t)ncids * 2 + 15) & ~(size_t)15;
	*o_list = o;
	o += (size_t)ncids * 8;
	return o;
}

static inline void upcie_nvme_gqp_release_(struct upcie_nvme_gqp_host *h)
{
	struct upcie_gpu_cuda *gpu = &h->gpu;
	struct upcie_gpu_cuda_ctx_save save;
	bool entered = !upcie_gpu_cuda_dev_enter(&gpu->p->dev, &save);

	if (h->tables && entered)
		cuMemFree(h->tables);
	if (entered)
		upcie_gpu_cuda_dev_leave(&gpu->p->dev, &save);
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

/*
 * Create the memory and device state of a GPU-resident queue pair (see above). The CQ is zeroed;
 * the state starts at tail 0, head 0, phase 1, matching queues the controller is about to create.
 * Returns 0; -EINVAL (bad depth, CIDs or doorbells); -EBUSY (a mirrored completion queue is
 * open); -ENOMEM (heap full); a CUDA error. `h` is zeroed on failure.
 */
static inline int upcie_nvme_gqp_create(struct upcie_nvme_gqp_host *h, struct upcie_gpu_cuda *gpu,
					const struct upcie_nvme_gqp_cfg *cfg)
{
	size_t o_cpl, o_state, o_free, o_list, tsize;
	struct upcie_gpu_cuda_ctx_save save;
	bool hostsq, entered = false;
	struct upcie_nvme_gqp st;
	CUdeviceptr sqdb, cqdb;
	uint32_t ncids;
	char *tab = NULL;
	CUresult r;
	int err;

	if (!h || !gpu || !gpu->p || !cfg)
		return UPCIE_FAIL(-EINVAL, "nvme: gqp: NULL argument or closed provider");
	memset(h, 0, sizeof(*h));
	ncids = cfg->ncids ? cfg->ncids : cfg->depth - 1;
	if (cfg->depth < 2 || cfg->depth > 65536 || !ncids || ncids > cfg->depth - 1 ||
	    ncids > 65535)
		return UPCIE_FAIL(-EINVAL, "nvme: gqp %u: depth %u with %u CIDs", cfg->qid,
				  cfg->depth, ncids);
	if (cfg->flags & ~(UPCIE_NVME_GQP_SQ_HOSTMEM | UPCIE_NVME_GQP_DB_IOMEM |
			   UPCIE_NVME_GQP_PRP_LISTS | UPCIE_NVME_GQP_SQ_COOP_STORES))
		return UPCIE_FAIL(-EINVAL, "nvme: gqp %u: unknown flags 0x%x", cfg->qid,
				  cfg->flags);
	if (!cfg->sqdb || !cfg->cqdb || (((uintptr_t)cfg->sqdb | (uintptr_t)cfg->cqdb) & 3))
		return UPCIE_FAIL(-EINVAL, "nvme: gqp %u: doorbells missing or misaligned",
				  cfg->qid);
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
	if (!tab) {
		err = UPCIE_FAIL(-ENOMEM, "nvme: gqp %u: out of host memory", cfg->qid);
		goto fail;
	}
	err = upcie_gpu_cuda_dev_enter(&gpu->p->dev, &save);
	if (err)
		goto fail;
	entered = true;
	r = cuMemAlloc(&h->tables, tsize);
	if (r != CUDA_SUCCESS) {
		h->tables = 0;
		err = UPCIE_GPU_CUDA_FAIL(r, "cuMemAlloc", "gqp %u: %zu bytes of queue state",
					  cfg->qid, tsize);
		goto fail;
	}
	memset(&st, 0, sizeof(st));
	st.sq = hostsq ? (struct upcie_nvme_sqe *)(uintptr_t)upcie_gpu_cuda_host_devptr(gpu,
											h->sq.vaddr)
		       : (struct upcie_nvme_sqe *)h->sq.vaddr;
	st.cq = (struct upcie_nvme_cqe *)h->cq.vaddr;
	st.sqdb = (volatile uint32_t *)(uintptr_t)sqdb;
	st.cqdb = (volatile uint32_t *)(uintptr_t)cqdb;
	st.cpl = (struct upcie_nvme_cqe *)(uintptr_t)(h->tables + o_cpl);
	st.state = (uint8_t *)(uintptr_t)(h->tables + o_state);
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
	r = cuMemcpyHtoD(h->tables, tab, tsize);
	if (r == CUDA_SUCCESS)
		r = cuMemsetD8((CUdeviceptr)(uintptr_t)h->cq.vaddr, 0, (size_t)cfg->depth * 16);
	if (r != CUDA_SUCCESS) {
		err = UPCIE_GPU_CUDA_FAIL(r, "cuMemcpyHtoD/cuMemsetD8", "gqp %u: initial state",
					  cfg->qid);
		goto fail;
	}
	upcie_gpu_cuda_dev_leave(&gpu->p->dev, &save);
	free(tab);
	h->dq = (struct upcie_nvme_gqp *)(uintptr_t)h->tables;
	return 0;
fail:
	if (entered)
		upcie_gpu_cuda_dev_leave(&gpu->p->dev, &save);
	free(tab);
	upcie_nvme_gqp_release_(h);
	return err;
}

/*
 * Copy the queue pair's device state (ring indices, counters) into *st, for diagnostics once no
 * kernel drives it. Returns 0 or a CUDA error.
 */
static inline int upcie_nvme_gqp_read(struct upcie_nvme_gqp_host *h, struct upcie_nvme_gqp *st)
{
	struct upcie_gpu_cuda_ctx_save save;
	CUresult r;
	int err = upcie_gpu_cuda_dev_enter(&h->gpu.p->dev, &save);

	if (err)
		return err;
	r = cuMemcpyDtoH(st, h->tables, sizeof(*st));
	upcie_gpu_cuda_dev_leave(&h->gpu.p->dev, &save);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuMemcpyDtoH", "gqp %u: state", h->qid);
	return 0;
}

/*
 * Free the queue pair. The controller must have deleted its queues; this waits for the context's
 * work to finish (cuCtxSynchronize) so no kernel still uses the memory. A zeroed `h` is a no-op.
 */
static inline void upcie_nvme_gqp_destroy(struct upcie_nvme_gqp_host *h)
{
	struct upcie_gpu_cuda_ctx_save save;

	if (!h || !h->gpu.p)
		return;
	if (!upcie_gpu_cuda_dev_enter(&h->gpu.p->dev, &save)) {
		CUresult r = cuCtxSynchronize();

		if (r != CUDA_SUCCESS)
			UPCIE_WARN("nvme: gqp %u: cuCtxSynchronize: %s", h->qid,
				   upcie_gpu_cuda_strerror(r));
		upcie_gpu_cuda_dev_leave(&h->gpu.p->dev, &save);
	}
	upcie_nvme_gqp_release_(h);
}

#endif /* UPCIE_NVME_GQP_HOST_CUDA_H */
