/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Host side of GPU-issued queue pairs on AMD GPUs (gpuq/gqp_hip.h): the memory, the device
 * state and, where the GPU needs it, the doorbell bridge of a queue pair that HIP kernels drive.
 * The HIP counterpart of gpuq/gqp_host_cuda.h.
 *
 * Two placements, chosen by the caller (the GPU code is the same for both):
 * - bridged (default; consumer RDNA, where hipHostRegister refuses a peer's BAR and a peer's DMA
 *   into host memory does not snoop the GPU's caches): the SQ in the host heap (mapped for the
 *   GPU), the CQ in the host heap where the controller writes it, a shadow CQ and the two
 *   doorbell shadow cells in fine-grained host memory (hipHostMalloc coherent, touched by CPU and
 *   GPU only), and one poller thread for the queue's whole life (gpuq/bridge_hip.h) that relays
 *   completions into the shadow and mirrors the cells to the controller's doorbells on change;
 * - direct (UPCIE_NVME_GQP_HIP_DIRECT; where the runtime maps the BAR, e.g. CDNA): the
 *   doorbells mapped for the GPU with hipHostRegisterIoMemory, the CQ in polled device memory
 *   (gpu/heap_hip.h: an uncached allocation of its own, so the GPU's L2 cannot serve a poll an
 *   old line; the poll load itself carries every cache-policy bit the target has,
 *   base/arch_hip.h), the SQ in the host heap; no bridge.
 * What it returns (sq_iova, cq_iova, depth) is what Create I/O CQ and Create I/O SQ take; the
 * controller layer issues those (and deletes the queues before destroy). `dq` is the device
 * address to hand to kernels; it stays valid across launches, which continue where the last one
 * left the queue, so nothing here is per launch.
 *
 * The device state is the core's struct upcie_nvme_qpair, initialised on the host
 * (upcie_nvme_qpair_init() on a host image whose pointers are GPU addresses) and copied into
 * device memory with the per-CID tables, plus the wall-clock rate of gpu/dev_hip.h: a GPU
 * whose runtime does not report hipDeviceAttributeWallClockRate (ROCm 5.2) gets no queue
 * unless opts.wall_khz of the provider gave one (-EOPNOTSUPP).
 *
 * Payloads: upcie_nvme_gqp_hip_data_iova() gives the device address of a payload for a command
 * on this queue (PRP1, or the pages of a PRP list) after upcie_nvme_gqp_hip_data_check() has
 * placed it against the queue's rules (gpuq/gqp_hip.h), so that GPU code which reads it after
 * reaping, with its acquire, reads what the controller wrote:
 * - any queue: VRAM must be fine-grained or uncached (upcie_gpu_hip_payload_check(): the acquire
 *   leaves L2 lines of coarse-grained VRAM, hipMalloc's and the provider's device heap's, as they
 *   were; -EOPNOTSUPP), and memory the runtime does not describe is refused;
 * - direct (CQ in VRAM): host memory is refused (-EXDEV: the controller's write into host DRAM
 *   and its completion into VRAM take two paths that PCIe does not order) unless the queue was
 *   created with UPCIE_NVME_GQP_HIP_HOST_DATA, the HIP counterpart of CUDA's
 *   UPCIE_NVME_GQP_HOST_DATA;
 * - bridged (CQ in host memory): VRAM is refused (-EXDEV: now the completion goes to host memory
 *   and the data to VRAM, the same two unordered destinations; use a direct queue for VRAM, or
 *   a host-memory payload) unless the queue was created with UPCIE_NVME_GQP_HIP_VRAM_DATA.
 * Each flag is the caller's word that the platform orders the two destinations; upcie cannot
 * check it, and creation logs a warning naming it. A queue that never reads payloads on the GPU
 * after reaping still gets the rules: the check cannot tell reads from writes.
 * Not run on an AMD GPU (none was available): compiled, and the refusals tested on the
 * attributes the runtime would report (tests/hip/test_hip_host.hip).
 *
 * Creation and destruction are host calls from any thread; the queue pair has one owner GPU
 * thread at a time. C++ host code with the HIP headers.
 */
#ifndef UPCIE_GPUQ_GQP_HOST_HIP_H
#define UPCIE_GPUQ_GQP_HOST_HIP_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/gpu/dev_hip.h>
#include <upcie/gpu/heap_hip.h>
#include <upcie/mem/heap.h>
#include <upcie/gpuq/bridge_hip.h>
#include <upcie/gpuq/gqp_hip.h>
#include <upcie/nvme/qpair.h>
#include <upcie/nvme/spec.h>

#define UPCIE_NVME_GQP_HIP_DIRECT 0x100u /* doorbells mapped for the GPU, CQ in device memory */
/*
 * Direct queues: accept payloads in host memory. The caller asserts that the platform orders the
 * controller's writes into host memory before its completions in VRAM (see above).
 */
#define UPCIE_NVME_GQP_HIP_HOST_DATA 0x200u
/*
 * Bridged queues: accept payloads in (fine-grained or uncached) VRAM. The caller asserts that the
 * platform orders the controller's writes into VRAM before its completions in host memory, which
 * PCIe does not: a direct queue is what keeps data and completion in one destination.
 */
#define UPCIE_NVME_GQP_HIP_VRAM_DATA 0x400u

struct upcie_nvme_gqp_hip_cfg {
	uint16_t qid;		 /* for messages and synthesized fields */
	uint32_t depth;		 /* SQ and CQ entries, 2..65536 */
	uint32_t ncids;		 /* outstanding commands, 1..depth - 1; 0: depth - 1 */
	unsigned flags;		 /* UPCIE_NVME_GQP_HIP_DIRECT, _HOST_DATA, _VRAM_DATA */
	volatile uint32_t *sqdb; /* the controller's SQ tail doorbell in the process's BAR0 map */
	volatile uint32_t *cqdb; /* the controller's CQ head doorbell */
	uint64_t spin_ns, sleep_ns; /* bridge poller idle policy; 0: defaults */
	uint64_t max_wait_ns;	    /* cap on device-side waits; 0: 2 s */
};

struct upcie_nvme_gqp_hip_host {
	struct upcie_nvme_gqp_hip *dq; /* device address of the queue state: pass to kernels */
	uint64_t sq_iova;	       /* Create I/O SQ: PRP1 */
	uint64_t cq_iova;	       /* Create I/O CQ: PRP1 */
	uint32_t depth;
	uint16_t qid;
	unsigned flags;
	struct upcie_gpu_hip gpu;	 /* borrowed: the caller's handle stays open */
	struct upcie_heap_buf sq, cq;	 /* cq: bridged only */
	struct upcie_gpu_hip_polled dcq; /* direct: the CQ */
	bool have_sq, have_cq, counted;
	void *state;  /* device memory: struct upcie_nvme_gqp_hip + CID tables */
	void *shadow; /* bridged: hipHostMalloc'd cells + shadow CQ (CPU address) */
	struct upcie_nvme_bridge br;
	volatile uint32_t *sqdb_host, *cqdb_host; /* direct: as passed in, to unmap */
};

static inline void upcie_nvme_gqp_hip_release_(struct upcie_nvme_gqp_hip_host *h)
{
	struct upcie_gpu_hip *gpu = &h->gpu;
	struct upcie_gpu_hip_dev_save save;
	bool entered = !upcie_gpu_hip_dev_enter(&gpu->p->dev, &save);

	upcie_nvme_bridge_stop(&h->br, NULL);
	if (entered) {
		if (h->state)
			upcie_gpu_hip_check_(hipFree(h->state), "hipFree");
		if (h->shadow)
			upcie_gpu_hip_check_(hipHostFree(h->shadow), "hipHostFree");
		upcie_gpu_hip_dev_leave(&gpu->p->dev, &save);
	}
	if (h->have_sq)
		upcie_gpu_hip_host_free(gpu, &h->sq);
	if (h->have_cq)
		upcie_gpu_hip_host_free(gpu, &h->cq);
	upcie_gpu_hip_polled_free(gpu, &h->dcq);
	if (h->sqdb_host)
		upcie_gpu_hip_iomem_unmap(gpu, h->sqdb_host);
	if (h->cqdb_host)
		upcie_gpu_hip_iomem_unmap(gpu, h->cqdb_host);
	if (h->counted) {
		pthread_mutex_lock(&upcie_gpu_hip_lock_g);
		gpu->p->ngqp--;
		pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
	}
	memset(h, 0, sizeof(*h));
}

/* Creation's check of cfg->flags: known bits, each payload flag on the placement it is for. */
static inline int upcie_nvme_gqp_hip_flags_check_(uint16_t qid, unsigned flags)
{
	bool direct = flags & UPCIE_NVME_GQP_HIP_DIRECT;

	if (flags & ~(UPCIE_NVME_GQP_HIP_DIRECT | UPCIE_NVME_GQP_HIP_HOST_DATA |
		      UPCIE_NVME_GQP_HIP_VRAM_DATA))
		return UPCIE_FAIL(-EINVAL, "nvme: gqp hip %u: unknown flags 0x%x", qid, flags);
	if (!direct && (flags & UPCIE_NVME_GQP_HIP_HOST_DATA))
		return UPCIE_FAIL(-EINVAL,
				  "nvme: gqp hip %u: UPCIE_NVME_GQP_HIP_HOST_DATA is for direct "
				  "queues; a bridged queue takes host-memory payloads anyway",
				  qid);
	if (direct && (flags & UPCIE_NVME_GQP_HIP_VRAM_DATA))
		return UPCIE_FAIL(-EINVAL,
				  "nvme: gqp hip %u: UPCIE_NVME_GQP_HIP_VRAM_DATA is for bridged "
				  "queues; a direct queue takes fine-grained VRAM payloads anyway",
				  qid);
	if (flags & UPCIE_NVME_GQP_HIP_HOST_DATA)
		UPCIE_WARN(
		    "nvme: gqp hip %u: payloads in host memory accepted on the caller's word "
		    "that the platform orders the controller's host-memory writes before its "
		    "completions in VRAM",
		    qid);
	if (flags & UPCIE_NVME_GQP_HIP_VRAM_DATA)
		UPCIE_WARN("nvme: gqp hip %u: payloads in VRAM accepted on a bridged queue on the "
			   "caller's word that the platform orders the controller's VRAM writes "
			   "before its completions in host memory",
			   qid);
	return 0;
}

/*
 * Create the memory, device state and (bridged) poller of a GPU-issued queue pair. The rings
 * start at tail 0, head 0, phase 1, matching queues the controller is about to create. Returns
 * 0; -EINVAL (bad depth, CIDs or doorbells); -EOPNOTSUPP (no wall-clock rate); -EBUSY (a
 * mirrored completion queue is open: gpuq/cqmirror_host_hip.h); -ENOMEM (heap full); a HIP error
 * (direct: hipHostRegister refusing the BAR). `h` is zeroed on failure.
 */
static inline int upcie_nvme_gqp_hip_create(struct upcie_nvme_gqp_hip_host *h,
					    struct upcie_gpu_hip *gpu,
					    const struct upcie_nvme_gqp_hip_cfg *cfg)
{
	struct upcie_gpu_hip_dev_save save;
	struct upcie_nvme_qpair_cfg qc;
	struct upcie_nvme_gqp_hip st;
	struct upcie_nvme_bridge_cells *cells = NULL;
	struct upcie_nvme_cqe *shadow = NULL;
	size_t tsz, ssz;
	void *sqdb_dev = NULL, *cqdb_dev = NULL, *sq_dev, *cq_dev, *sh_dev = NULL;
	char *img = NULL;
	bool direct, entered = false;
	uint32_t ncids;
	hipError_t r;
	int err;

	if (!h || !gpu || !gpu->p || !cfg)
		return UPCIE_FAIL(-EINVAL, "nvme: gqp hip: NULL argument or closed provider");
	memset(h, 0, sizeof(*h));
	ncids = cfg->ncids ? cfg->ncids : cfg->depth - 1;
	if (cfg->depth < 2 || cfg->depth > 65536 || !ncids || ncids > cfg->depth - 1 ||
	    ncids > 65535)
		return UPCIE_FAIL(-EINVAL, "nvme: gqp hip %u: depth %u with %u CIDs", cfg->qid,
				  cfg->depth, ncids);
	if (!cfg->sqdb || !cfg->cqdb || (((uintptr_t)cfg->sqdb | (uintptr_t)cfg->cqdb) & 3))
		return UPCIE_FAIL(-EINVAL, "nvme: gqp hip %u: doorbells missing or misaligned",
				  cfg->qid);
	err = upcie_nvme_gqp_hip_flags_check_(cfg->qid, cfg->flags);
	if (err)
		return err;
	if (!gpu->p->dev.wall_khz)
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "nvme: gqp hip %u: no wall-clock rate for device-side timeouts "
				  "(the runtime does not report hipDeviceAttributeWallClockRate; "
				  "give upcie_gpu_hip_opts.wall_khz)",
				  cfg->qid);
	direct = cfg->flags & UPCIE_NVME_GQP_HIP_DIRECT;
	pthread_mutex_lock(&upcie_gpu_hip_lock_g);
	if (gpu->p->nmirror) {
		pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
		/* destroy synchronises the device, which waits for the mirror's kernel forever */
		return UPCIE_FAIL(-EBUSY,
				  "nvme: gqp hip %u: %u mirrored completion queues are open; "
				  "GPU-issued and mirrored queues exclude each other",
				  cfg->qid, gpu->p->nmirror);
	}
	gpu->p->ngqp++;
	pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
	h->gpu = *gpu;
	h->flags = cfg->flags;
	h->qid = cfg->qid;
	h->depth = cfg->depth;
	h->counted = true;

	/* Rings: each physically contiguous (one LUT granule), page aligned. */
	err = upcie_heap_alloc_array(&gpu->p->hheap, 1, (uint64_t)cfg->depth * 64, 4096, &h->sq);
	if (err)
		goto fail;
	h->have_sq = true;
	if (direct) {
		err = upcie_gpu_hip_polled_alloc(gpu, (uint64_t)cfg->depth * 16, 0, &h->dcq);
		if (err)
			goto fail;
		h->cq_iova = h->dcq.iova;
	} else {
		err = upcie_heap_alloc_array(&gpu->p->hheap, 1, (uint64_t)cfg->depth * 16, 4096,
					     &h->cq);
		if (err)
			goto fail;
		h->have_cq = true;
		h->cq_iova = h->cq.iova;
	}
	h->sq_iova = h->sq.iova;
	sq_dev = upcie_gpu_hip_host_devptr(gpu, h->sq.vaddr);

	err = upcie_gpu_hip_dev_enter(&gpu->p->dev, &save);
	if (err)
		goto fail;
	entered = true;
	if (direct) {
		err = upcie_gpu_hip_iomem_map(gpu, cfg->sqdb, 4, &sqdb_dev);
		if (err)
			goto fail;
		h->sqdb_host = cfg->sqdb;
		err = upcie_gpu_hip_iomem_map(gpu, cfg->cqdb, 4, &cqdb_dev);
		if (err)
			goto fail;
		h->cqdb_host = cfg->cqdb;
		cq_dev = h->dcq.ptr; /* zeroed by the allocation */
	} else {
		/* Cells and shadow CQ: fine-grained host memory, CPU and GPU only. */
		ssz = sizeof(*cells) + (size_t)cfg->depth * 16;
		r = hipHostMalloc(&h->shadow, ssz, hipHostMallocMapped | hipHostMallocCoherent);
		if (r == hipSuccess)
			r = hipHostGetDevicePointer(&sh_dev, h->shadow, 0);
		if (r != hipSuccess) {
			err = UPCIE_GPU_HIP_FAIL(r, "hipHostMalloc(coherent)",
						 "gqp hip %u: %zu bytes of shadows", cfg->qid, ssz);
			goto fail;
		}
		cells = (struct upcie_nvme_bridge_cells *)h->shadow;
		shadow = (struct upcie_nvme_cqe *)(cells + 1);
		sqdb_dev = (char *)sh_dev + offsetof(struct upcie_nvme_bridge_cells, sq_tail);
		cqdb_dev = (char *)sh_dev + offsetof(struct upcie_nvme_bridge_cells, cq_head);
		cq_dev = (char *)sh_dev + sizeof(*cells);
		memset(h->cq.vaddr, 0, (size_t)cfg->depth * 16);
	}

	/* The core's state on a host image, pointers rebased to GPU addresses, then copied. */
	tsz = (sizeof(st) + 15) & ~(size_t)15;
	img = (char *)aligned_alloc(16, tsz + upcie_nvme_qpair_tables_size(ncids));
	r = hipMalloc(&h->state, tsz + upcie_nvme_qpair_tables_size(ncids));
	if (!img || r != hipSuccess) {
		h->state = r == hipSuccess ? h->state : NULL;
		err = img ? UPCIE_GPU_HIP_FAIL(r, "hipMalloc", "gqp hip %u: queue state", cfg->qid)
			  : UPCIE_FAIL(-ENOMEM, "nvme: gqp hip %u: out of host memory", cfg->qid);
		goto fail;
	}
	memset(&qc, 0, sizeof(qc));
	qc.sq = sq_dev;
	qc.cq = cq_dev;
	qc.sqdb = (volatile uint32_t *)sqdb_dev;
	qc.cqdb = (volatile uint32_t *)cqdb_dev;
	qc.sq_depth = cfg->depth;
	qc.ncids = ncids;
	qc.qid = cfg->qid;
	qc.flags = UPCIE_NVME_QPAIR_NO_CQ_CLEAR; /* a GPU address: zeroed above */
	qc.clock_khz = gpu->p->dev.wall_khz;	 /* the core's timed waits run on the GPU */
	qc.tables = img + tsz;
	memset(&st, 0, sizeof(st));
	err = upcie_nvme_qpair_init(&st.qp, &qc);
	if (err)
		goto fail;
	upcie_nvme_qpair_tables_rebase(&st.qp, (char *)h->state + tsz);
	st.wall_khz = gpu->p->dev.wall_khz;
	st.max_wait_ns = cfg->max_wait_ns;
	st.flags = direct ? 0 : UPCIE_NVME_GQP_HIP_BRIDGED | UPCIE_NVME_GQP_HIP_RELAYED;
	memcpy(img, &st, sizeof(st));
	r = hipMemcpy(h->state, img, tsz + upcie_nvme_qpair_tables_size(ncids),
		      hipMemcpyHostToDevice);
	if (r != hipSuccess) {
		err = UPCIE_GPU_HIP_FAIL(r, "hipMemcpy", "gqp hip %u: initial state", cfg->qid);
		goto fail;
	}
	if (!direct) {
		struct upcie_nvme_bridge_cfg bc;

		memset(&bc, 0, sizeof(bc));
		bc.qid = cfg->qid;
		bc.depth = cfg->depth;
		bc.sqdb = cfg->sqdb;
		bc.cqdb = cfg->cqdb;
		bc.sq_cell = &cells->sq_tail;
		bc.cq_cell = &cells->cq_head;
		bc.cq = (const struct upcie_nvme_cqe *)h->cq.vaddr;
		bc.cq_shadow = shadow;
		bc.spin_ns = cfg->spin_ns;
		bc.sleep_ns = cfg->sleep_ns;
		err = upcie_nvme_bridge_start(&h->br, &bc);
		if (err)
			goto fail;
	}
	upcie_gpu_hip_dev_leave(&gpu->p->dev, &save);
	free(img);
	h->dq = (struct upcie_nvme_gqp_hip *)h->state;
	return 0;
fail:
	if (entered)
		upcie_gpu_hip_dev_leave(&gpu->p->dev, &save);
	free(img);
	upcie_nvme_gqp_hip_release_(h);
	return err;
}

/*
 * The placement verdict of a payload for a queue created with `flags`, on the attributes the
 * runtime reported for `ptr` (see the header's comment): 0, -EXDEV, -EOPNOTSUPP.
 */
static inline int upcie_nvme_gqp_hip_data_verdict(unsigned flags, uint16_t qid,
						  const hipPointerAttribute_t *attr,
						  const void *ptr)
{
	bool direct = flags & UPCIE_NVME_GQP_HIP_DIRECT;

	if (attr->memoryType == hipMemoryTypeHost) {
		if (!direct || (flags & UPCIE_NVME_GQP_HIP_HOST_DATA))
			return 0;
		return UPCIE_FAIL(
		    -EXDEV,
		    "nvme: gqp hip %u: payload at %p is host memory on a direct "
		    "queue: the controller's write into host DRAM and its completion "
		    "into the CQ in VRAM take two paths PCIe does not order; put it in "
		    "fine-grained or uncached VRAM, or create the queue with "
		    "UPCIE_NVME_GQP_HIP_HOST_DATA if the platform orders them",
		    qid, ptr);
	}
	if (attr->memoryType == hipMemoryTypeDevice && !direct &&
	    !(flags & UPCIE_NVME_GQP_HIP_VRAM_DATA))
		return UPCIE_FAIL(
		    -EXDEV,
		    "nvme: gqp hip %u: payload at %p is VRAM on a bridged queue: the "
		    "completion goes to the CQ in host memory and the data to VRAM, two "
		    "destinations PCIe does not order, so GPU code can see the "
		    "completion before the data; use a direct queue "
		    "(UPCIE_NVME_GQP_HIP_DIRECT) or a host-memory payload, or create the "
		    "queue with UPCIE_NVME_GQP_HIP_VRAM_DATA if the platform orders them",
		    qid, ptr);
	return upcie_gpu_hip_payload_verdict(attr, ptr, "payload");
}

/*
 * Whether the `len` bytes at `ptr` (a CPU or GPU address the runtime describes) may be the data
 * of commands on queue `h`: both ends are asked of the runtime (hipPointerGetAttributes) and
 * judged by upcie_nvme_gqp_hip_data_verdict(). Returns 0; -EXDEV (host memory on a direct
 * queue, VRAM on a bridged one, unless the queue's flag allows it); -EOPNOTSUPP (coarse-grained
 * VRAM, managed memory); -EINVAL; a HIP error (memory the runtime does not describe).
 */
static inline int upcie_nvme_gqp_hip_data_check(const struct upcie_nvme_gqp_hip_host *h,
						const void *ptr, uint64_t len)
{
	const char *end;
	int k;

	if (!h || !h->gpu.p || !ptr || !len || len - 1 > UINTPTR_MAX - (uintptr_t)ptr)
		return UPCIE_FAIL(-EINVAL,
				  "nvme: gqp hip: payload check of %p + %" PRIu64
				  " on a closed queue, or an empty or wrapping range",
				  ptr, len);
	end = (const char *)ptr + (len - 1);
	for (k = 0; k < (len > 1 ? 2 : 1); k++) {
		const void *p = k ? (const void *)end : ptr;
		hipPointerAttribute_t a;
		hipError_t r;
		int err;

		memset(&a, 0, sizeof(a));
		r = hipPointerGetAttributes(&a, p);
		if (r != hipSuccess)
			return UPCIE_GPU_HIP_FAIL(r, "hipPointerGetAttributes",
						  "gqp hip %u: payload at %p: the runtime cannot "
						  "say where it lives, so it is refused",
						  h->qid, p);
		err = upcie_nvme_gqp_hip_data_verdict(h->flags, h->qid, &a, p);
		if (err)
			return err;
	}
	return 0;
}

/*
 * The device address the controller uses for `ptr` (in a registered range: a heap, a
 * registration, polled memory), after upcie_nvme_gqp_hip_data_check() of its `len` bytes on
 * queue `h`: where the PRPs of a command on this queue are set up. Returns 0 (*iova set); the
 * check's error; -ENOENT (not registered).
 */
static inline int upcie_nvme_gqp_hip_data_iova(struct upcie_nvme_gqp_hip_host *h, const void *ptr,
					       uint64_t len, uint64_t *iova)
{
	int err = upcie_nvme_gqp_hip_data_check(h, ptr, len);

	if (err)
		return err;
	err = upcie_gpu_hip_iova(&h->gpu, ptr, iova);
	if (err)
		return UPCIE_FAIL(err,
				  "nvme: gqp hip %u: payload at %p is not in a registered range",
				  h->qid, ptr);
	return 0;
}

/* The bridge's counters (bridged queues; zeros for direct ones). */
static inline void upcie_nvme_gqp_hip_bridge_stats(const struct upcie_nvme_gqp_hip_host *h,
						   struct upcie_nvme_bridge_stats *st)
{
	memset(st, 0, sizeof(*st));
	if (h->br.live)
		upcie_nvme_bridge_stats_get(&h->br, st);
}

/* Copy the queue pair's device state into *st, for diagnostics once no kernel drives it. */
static inline int upcie_nvme_gqp_hip_read(struct upcie_nvme_gqp_hip_host *h,
					  struct upcie_nvme_gqp_hip *st)
{
	struct upcie_gpu_hip_dev_save save;
	hipError_t r;
	int err = upcie_gpu_hip_dev_enter(&h->gpu.p->dev, &save);

	if (err)
		return err;
	r = hipMemcpy(st, h->state, sizeof(*st), hipMemcpyDeviceToHost);
	upcie_gpu_hip_dev_leave(&h->gpu.p->dev, &save);
	if (r != hipSuccess)
		return UPCIE_GPU_HIP_FAIL(r, "hipMemcpy", "gqp hip %u: state", h->qid);
	return 0;
}

/*
 * Free the queue pair: waits for the device's work (hipDeviceSynchronize) so no kernel still
 * uses it, stops the poller after a last round, frees the memory. The controller must have
 * deleted its queues, or delete them right after. A zeroed `h` is a no-op.
 */
static inline void upcie_nvme_gqp_hip_destroy(struct upcie_nvme_gqp_hip_host *h)
{
	struct upcie_gpu_hip_dev_save save;

	if (!h || !h->gpu.p)
		return;
	if (!upcie_gpu_hip_dev_enter(&h->gpu.p->dev, &save)) {
		upcie_gpu_hip_check_(hipDeviceSynchronize(), "hipDeviceSynchronize");
		upcie_gpu_hip_dev_leave(&h->gpu.p->dev, &save);
	}
	upcie_nvme_gqp_hip_release_(h);
}

#endif /* UPCIE_GPUQ_GQP_HOST_HIP_H */
