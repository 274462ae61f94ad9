/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Completion-queue mirror, host side: attach a completion queue whose entries the controller
 * writes into GPU memory and that the CPU reads from host memory (see gpuq/cqmirror_cuda.h for
 * why and how the copying works).
 *
 * upcie_nvme_cqmirror_attach() takes a CQ from the device heap (what the controller writes: give
 * dev_cq_iova to Create I/O CQ) and one from the host heap (what the CPU's queue pair reads: give
 * host_cq to nvme/qpair.h as cfg.cq), fills a free slot of the shared table and raises its
 * generation to an odd value. The first attach loads the kernel (PTX through the driver API, so C
 * callers need no nvcc) and launches it on a stream of its own, one warp per slot; the last
 * detach stops it. upcie_nvme_cqmirror_detach() raises the generation to even and waits for the
 * warp's acknowledgement before freeing either CQ; detach after the controller deleted the queue.
 *
 * Every wait is bounded (UPCIE_NVME_CQMIRROR_ACK_TIMEOUT_NS) and nothing is freed that the warp may
 * still write: attach waits for the slot's warp to report that it started, and when it does not
 * (its block never became resident: persistent kernels fill every SM) attach fails with
 * -ETIMEDOUT, the slot taken back to even and kept with its CQs ("parked") until the warp
 * acknowledges or the kernel has ended, both noticed by later calls; a detach that timed out can
 * be called again and waits for the same acknowledgement; stopping the kernel (last detach,
 * provider close) polls its stream instead of cuStreamSynchronize, and when it does not end the
 * kernel's memory and the provider's heaps stay allocated (an error says so). Attach refuses a GPU
 * that does not promise ordered peer writes into its memory (-EOPNOTSUPP): the mirror's point is
 * that a completion copied out of GPU memory vouches for the payload before it.
 *
 * While the kernel runs, anything that waits for the context to go idle waits for it and does not
 * return: cuCtxSynchronize()/cudaDeviceSynchronize(), cuMemFree()/cudaFree(), and (seen on the
 * H200 with driver 580) cudaFreeHost(). Synchronise on streams, and free memory once the last
 * mirrored queue is detached. Two less obvious cases, both seen as hangs on the H200: with lazy
 * module loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2) the first launch of a
 * kernel may wait for the context to go idle, so load kernels before the first attach
 * (cudaFuncGetAttributes(), cuModuleGetFunction()) or run with CUDA_MODULE_LOADING=EAGER; and a
 * kernel needing more per-thread local memory than the context has reserved waits for the
 * reservation to grow, so raise CU_LIMIT_STACK_SIZE before the first attach when kernels use
 * local memory. For the same reason a mirrored queue and a GPU-issued queue pair
 * (gpuq/gqp_host_cuda.h) refuse each other with -EBUSY.
 *
 * Locking: attach and detach take the provider's mutex; a mirrored CQ has one owner. Needs a
 * driver that JIT-compiles the PTX of gpuq/cqmirror_ptx_cuda.h (CUDA 13.0 or newer).
 */
#ifndef UPCIE_GPUQ_CQMIRROR_HOST_CUDA_H
#define UPCIE_GPUQ_CQMIRROR_HOST_CUDA_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include <upcie/base/clock.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/gpu/dev_cuda.h>
#include <upcie/gpu/heap_cuda.h>
#include <upcie/gpuq/cqmirror_cuda.h>
/* The kernel's PTX; a test may substitute a variant by defining UPCIE_NVME_CQMIRROR_PTX. */
#ifndef UPCIE_NVME_CQMIRROR_PTX
#include <upcie/gpuq/cqmirror_ptx_cuda.h>
#define UPCIE_NVME_CQMIRROR_PTX upcie_nvme_cqmirror_ptx
#endif
#include <upcie/nvme/spec.h>

/* How long attach, detach and the kernel's stop wait for the warps, and table updates and CQ
 * clears for the copy engine. */
#ifndef UPCIE_NVME_CQMIRROR_ACK_TIMEOUT_NS
#define UPCIE_NVME_CQMIRROR_ACK_TIMEOUT_NS (2 * UPCIE_NSEC_PER_SEC)
#endif
#ifndef UPCIE_NVME_CQMIRROR_COPY_TIMEOUT_NS
#define UPCIE_NVME_CQMIRROR_COPY_TIMEOUT_NS (2 * UPCIE_NSEC_PER_SEC)
#endif
/* A table write that fails (a test's stand-in for a copy engine error): 0, or the error. */
#ifndef UPCIE_NVME_CQMIRROR_PUT_FAIL
#define UPCIE_NVME_CQMIRROR_PUT_FAIL(off, src, len) 0
#endif
/* Whether slot s acknowledged the generation before even g; a test may stand in a slow warp. */
#ifndef UPCIE_NVME_CQMIRROR_ACKED
#define UPCIE_NVME_CQMIRROR_ACKED(ms, s, g) ((ms)->ack[s] == (g)-1)
#endif

/* One mirrored completion queue. */
struct upcie_nvme_cqmirror_cq {
	uint64_t dev_cq_iova;		/* Create I/O CQ: PRP1 (the controller writes here) */
	struct upcie_nvme_cqe *host_cq; /* CPU address: the queue pair's cfg.cq */
	uint32_t depth;
	int slot;
	struct upcie_gpu_cuda gpu; /* borrowed */
	struct upcie_heap_buf dev, host;
};

/* Per-process mirror state, hung off the provider. */
struct upcie_nvme_cqmirror_state_ {
	CUmodule mod;
	CUfunction fn;
	CUstream stream; /* the kernel's */
	CUstream ctl;	 /* table updates */
	CUdeviceptr table;
	struct upcie_nvme_cqmirror_slot *stage; /* pinned staging for table writes */
	volatile uint32_t *ack;			/* pinned, mapped: [SLOTS] */
	CUdeviceptr ack_dev;
	void *pinned;
	uint32_t gen[UPCIE_NVME_CQMIRROR_SLOTS];
	bool used[UPCIE_NVME_CQMIRROR_SLOTS];
	bool parked[UPCIE_NVME_CQMIRROR_SLOTS]; /* attach timed out: CQs kept until acknowledged */
	/* The table still holds an odd generation because writing the even one failed: the slot
	 * is not free until a later call writes it (a warp would serve it on the next launch). */
	bool regen[UPCIE_NVME_CQMIRROR_SLOTS];
	struct upcie_heap_buf park_dev[UPCIE_NVME_CQMIRROR_SLOTS],
	    park_host[UPCIE_NVME_CQMIRROR_SLOTS];
	unsigned nused;
	bool running;
	bool stopping;	/* stop flag set, the kernel not yet seen to end */
	uint32_t flags; /* UPCIE_NVME_CQMIRROR_F_* for the next launch */
};

/* Write `len` bytes at table offset `off` from the staging buffer, in order, and wait. */
static inline int upcie_nvme_cqmirror_put_(struct upcie_nvme_cqmirror_state_ *ms, size_t off,
					   const void *src, size_t len)
{
	CUresult r;
	int err = UPCIE_NVME_CQMIRROR_PUT_FAIL(off, src, len);

	if (err)
		return UPCIE_FAIL(err, "nvme: cqmirror: table update at %zu failed", off);
	memcpy(ms->stage, src, len);
	r = cuMemcpyHtoDAsync(ms->table + off, ms->stage, len, ms->ctl);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuMemcpyHtoDAsync", "mirror table update");
	return upcie_gpu_cuda_stream_wait(ms->ctl, UPCIE_NVME_CQMIRROR_COPY_TIMEOUT_NS,
					  "nvme: cqmirror: table update");
}

/* Take slot s's generation to even if it is odd; on failure the slot is marked to retry. */
static inline int upcie_nvme_cqmirror_close_gen_(struct upcie_nvme_cqmirror_state_ *ms, int s)
{
	size_t off = offsetof(struct upcie_nvme_cqmirror_table, slot) +
		     (size_t)s * sizeof(struct upcie_nvme_cqmirror_slot) +
		     offsetof(struct upcie_nvme_cqmirror_slot, gen);
	uint32_t e = ms->gen[s] + 1;
	int err;

	if (!(ms->gen[s] & 1u)) {
		ms->regen[s] = false;
		return 0;
	}
	err = upcie_nvme_cqmirror_put_(ms, off, &e, sizeof(e));
	ms->regen[s] = err != 0;
	if (!err)
		ms->gen[s] = e;
	return err;
}

/*
 * Write the even generations that failed before, then free the CQs of parked slots whose warp
 * acknowledged (all: the kernel has ended, so none can write any more). A slot whose table entry
 * is still odd stays taken: the next launch would serve it.
 */
static inline void upcie_nvme_cqmirror_unpark_(struct upcie_gpu_cuda_proc *p,
					       struct upcie_nvme_cqmirror_state_ *ms, bool all)
{
	for (int s = 0; s < UPCIE_NVME_CQMIRROR_SLOTS; s++) {
		if (ms->regen[s] && !upcie_nvme_cqmirror_close_gen_(ms, s) && !ms->parked[s]) {
			/* Nothing ran under it (the launch had failed): free now. */
			ms->used[s] = false;
			ms->nused--;
			continue;
		}
		if (!ms->parked[s] || (!all && (ms->regen[s] || ms->ack[s] != ms->gen[s] - 1)))
			continue;
		upcie_heap_free(&p->hheap, ms->park_host[s].off);
		upcie_heap_free(&p->dheap, ms->park_dev[s].off);
		ms->parked[s] = false;
		if (ms->regen[s])
			continue; /* kernel ended, CQs freed; the slot waits for its even write */
		ms->used[s] = false;
		ms->nused--;
	}
}

/*
 * Stop the kernel and wait for it, bounded; called again after a timeout, it waits again. Called
 * with the lock held, in the heap's context.
 */
static inline int upcie_nvme_cqmirror_retire_(struct upcie_gpu_cuda_proc *p,
					      struct upcie_nvme_cqmirror_state_ *ms)
{
	uint32_t v = 1, z = 0;
	int err;

	if (!ms->running)
		return 0;
	if (!ms->stopping) {
		err = upcie_nvme_cqmirror_put_(ms, offsetof(struct upcie_nvme_cqmirror_table, stop),
					       &v, sizeof(v));
		if (err)
			return err;
		ms->stopping = true;
	}
	err = upcie_gpu_cuda_stream_wait(ms->stream, UPCIE_NVME_CQMIRROR_ACK_TIMEOUT_NS,
					 "nvme: cqmirror: kernel exit");
	if (err)
		return UPCIE_FAIL(err,
				  "nvme: cqmirror: the mirror kernel did not end (a warp that "
				  "never became resident, or one that is stuck); its memory stays "
				  "allocated");
	ms->running = false;
	ms->stopping = false;
	upcie_nvme_cqmirror_unpark_(p, ms, true);
	return upcie_nvme_cqmirror_put_(ms, offsetof(struct upcie_nvme_cqmirror_table, stop), &z,
					sizeof(z));
}

static inline void upcie_nvme_cqmirror_fini_(struct upcie_gpu_cuda_proc *p)
{
	struct upcie_nvme_cqmirror_state_ *ms = (struct upcie_nvme_cqmirror_state_ *)p->mirror;

	if (!ms)
		return;
	if (upcie_nvme_cqmirror_retire_(p, ms)) {
		/* The kernel may still run and use all of it: leave it, and p->mirror set, so the
		 * provider does not free what the kernel reads either. */
		UPCIE_ERR("nvme: cqmirror: kernel not stopped; its memory is left allocated");
		return;
	}
	if (ms->table)
		cuMemFree(ms->table);
	if (ms->pinned)
		cuMemFreeHost(ms->pinned);
	if (ms->mod)
		cuModuleUnload(ms->mod);
	if (ms->ctl)
		cuStreamDestroy(ms->ctl);
	if (ms->stream)
		cuStreamDestroy(ms->stream);
	free(ms);
	p->mirror = NULL;
	p->mirror_fini = NULL;
}

/* Load the kernel and allocate the table. Called with the lock held, in the heap's context. */
static inline int upcie_nvme_cqmirror_init_(struct upcie_gpu_cuda_proc *p)
{
	struct upcie_nvme_cqmirror_state_ *ms;
	size_t tsz = sizeof(struct upcie_nvme_cqmirror_table);
	CUresult r;

	ms = (struct upcie_nvme_cqmirror_state_ *)calloc(1, sizeof(*ms));
	if (!ms)
		return UPCIE_FAIL(-ENOMEM, "nvme: cqmirror: out of host memory");
	p->mirror = ms;
	p->mirror_fini = upcie_nvme_cqmirror_fini_;
	r = cuModuleLoadData(&ms->mod, UPCIE_NVME_CQMIRROR_PTX);
	if (r == CUDA_SUCCESS)
		r = cuModuleGetFunction(&ms->fn, ms->mod, "upcie_nvme_cqmirror_kernel");
	if (r != CUDA_SUCCESS)
		goto fail;
	r = cuStreamCreate(&ms->stream, CU_STREAM_NON_BLOCKING);
	if (r == CUDA_SUCCESS)
		r = cuStreamCreate(&ms->ctl, CU_STREAM_NON_BLOCKING);
	if (r == CUDA_SUCCESS)
		r = cuMemAlloc(&ms->table, tsz);
	if (r == CUDA_SUCCESS)
		r = cuMemsetD8(ms->table, 0, tsz);
	if (r == CUDA_SUCCESS)
		r = cuMemHostAlloc(&ms->pinned, 4096,
				   CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
	if (r != CUDA_SUCCESS)
		goto fail;
	memset(ms->pinned, 0, 4096);
	ms->ack = (volatile uint32_t *)ms->pinned; /* acknowledged, then started generations */
	ms->stage = (struct upcie_nvme_cqmirror_slot *)((char *)ms->pinned + 1024);
	r = cuMemHostGetDevicePointer(&ms->ack_dev, ms->pinned, 0);
	if (r != CUDA_SUCCESS)
		goto fail;
	return 0;
fail:
	upcie_nvme_cqmirror_fini_(p);
	return UPCIE_GPU_CUDA_FAIL(r, "cuModuleLoadData/cuStreamCreate/cuMemAlloc",
				   "setting up the completion mirror");
}

/* Launch the kernel. Called with the lock held, in the heap's context. */
static inline int upcie_nvme_cqmirror_launch_(struct upcie_nvme_cqmirror_state_ *ms)
{
	void *args[2] = { &ms->table, &ms->ack_dev };
	CUresult r;
	int err;

	CUmoduleLoadingMode mode;

	err = upcie_nvme_cqmirror_put_(ms, offsetof(struct upcie_nvme_cqmirror_table, flags),
				       &ms->flags, sizeof(ms->flags));
	if (err)
		return err;
	if (cuModuleGetLoadingMode(&mode) == CUDA_SUCCESS && mode == CU_MODULE_LAZY_LOADING)
		UPCIE_WARN(
		    "nvme: cqmirror: lazy module loading: a kernel launched for the first time "
		    "while the mirror runs may wait for it forever; load kernels first or set "
		    "CUDA_MODULE_LOADING=EAGER");
	r = cuLaunchKernel(ms->fn, UPCIE_NVME_CQMIRROR_SLOTS, 1, 1, 32, 1, 1, 0, ms->stream, args,
			   NULL);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuLaunchKernel", "completion mirror kernel");
	ms->running = true;
	return 0;
}

/*
 * Set UPCIE_NVME_CQMIRROR_F_* for the next launch of the kernel (takes effect when no mirrored
 * queue is attached). Returns 0 or -EINVAL.
 */
static inline int upcie_nvme_cqmirror_set_flags(struct upcie_gpu_cuda *gpu, uint32_t flags)
{
	struct upcie_gpu_cuda_ctx_save save;
	int err = 0;

	if (!gpu || !gpu->p)
		return UPCIE_FAIL(-EINVAL, "nvme: cqmirror: closed provider");
	pthread_mutex_lock(&upcie_gpu_cuda_lock_g);
	if (!gpu->p->mirror)
		err = upcie_gpu_cuda_dev_enter(&gpu->p->dev, &save);
	if (!err && !gpu->p->mirror) {
		err = upcie_nvme_cqmirror_init_(gpu->p);
		upcie_gpu_cuda_dev_leave(&gpu->p->dev, &save);
	}
	if (!err)
		((struct upcie_nvme_cqmirror_state_ *)gpu->p->mirror)->flags = flags;
	pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
	return err;
}

/* Whether the mirror kernel is running (for tests and diagnostics). */
static inline bool upcie_nvme_cqmirror_running(const struct upcie_gpu_cuda *gpu)
{
	const struct upcie_nvme_cqmirror_state_ *ms;
	bool running;

	pthread_mutex_lock(&upcie_gpu_cuda_lock_g);
	ms = (const struct upcie_nvme_cqmirror_state_ *)gpu->p->mirror;
	running = ms && ms->running;
	pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
	return running;
}

/*
 * Attach a mirrored CQ of `depth` entries (2..65536; with the LUT heap at most 4096, one 64 KiB
 * granule): both CQs zeroed, a slot filled, the kernel launched if this is the first, and the
 * slot's warp seen to start. Returns 0; -EINVAL; -EBUSY (a GPU-issued queue pair is open);
 * -EOPNOTSUPP (the GPU does not promise ordered peer writes); -ENOSPC (all slots in use); -ENOMEM
 * (a heap is full); -ETIMEDOUT (the slot's warp did not start: no room on the GPU for the
 * kernel's block; the slot stays parked until it acknowledges); a CUDA error. `m` is zeroed on
 * failure.
 */
static inline int upcie_nvme_cqmirror_attach(struct upcie_nvme_cqmirror_cq *m,
					     struct upcie_gpu_cuda *gpu, uint32_t depth)
{
	struct upcie_nvme_cqmirror_state_ *ms;
	struct upcie_nvme_cqmirror_slot sl;
	struct upcie_gpu_cuda_ctx_save save;
	struct upcie_gpu_cuda_proc *p;
	bool have_dev = false, have_host = false;
	void *zero = NULL;
	size_t off;
	uint64_t t0;
	uint32_t g;
	CUresult r;
	int s = -1, err;

	if (!m || !gpu || !gpu->p || depth < 2 || depth > 65536)
		return UPCIE_FAIL(-EINVAL, "nvme: cqmirror: bad arguments (depth %u)", depth);
	memset(m, 0, sizeof(*m));
	m->slot = -1;
	p = gpu->p;
	pthread_mutex_lock(&upcie_gpu_cuda_lock_g);
	if (p->ngqp) {
		pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
		return UPCIE_FAIL(-EBUSY,
				  "nvme: cqmirror: %u GPU-issued queue pairs are open; "
				  "GPU-issued and mirrored queues exclude each other",
				  p->ngqp);
	}
	err = upcie_gpu_cuda_dev_peer_order(&p->dev, "a mirrored completion queue");
	if (err) {
		pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
		return err;
	}
	err = upcie_gpu_cuda_dev_enter(&p->dev, &save);
	if (err) {
		pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
		return err;
	}
	if (!p->mirror)
		err = upcie_nvme_cqmirror_init_(p);
	if (err)
		goto out;
	ms = (struct upcie_nvme_cqmirror_state_ *)p->mirror;
	upcie_nvme_cqmirror_unpark_(p, ms, false);
	for (int i = 0; i < UPCIE_NVME_CQMIRROR_SLOTS; i++)
		if (ms->regen[i] && !ms->running) {
			/* A launch now would let slot i's warp serve CQs that are gone. */
			err =
			    UPCIE_FAIL(-EIO,
				       "nvme: cqmirror: slot %d keeps an odd generation (its even "
				       "write failed again); no launch until it is written",
				       i);
			goto out;
		}
	if (ms->stopping) { /* an earlier stop timed out: the kernel must end first */
		err = upcie_nvme_cqmirror_retire_(p, ms);
		if (err)
			goto out;
	}
	for (int i = 0; i < UPCIE_NVME_CQMIRROR_SLOTS && s < 0; i++)
		if (!ms->used[i])
			s = i;
	if (s < 0) {
		err = UPCIE_FAIL(-ENOSPC, "nvme: cqmirror: all %d slots in use",
				 UPCIE_NVME_CQMIRROR_SLOTS);
		goto out;
	}
	err = upcie_heap_alloc_array(&p->dheap, 1, (uint64_t)depth * 16, 4096, &m->dev);
	if (err)
		goto out;
	have_dev = true;
	err = upcie_heap_alloc_array(&p->hheap, 1, (uint64_t)depth * 16, 4096, &m->host);
	if (err)
		goto out;
	have_host = true;
	memset(m->host.vaddr, 0, (size_t)depth * 16);
	/* A copy, not a memset: the copy engine clears it also when kernels fill every SM. */
	zero = calloc(1, (size_t)depth * 16);
	if (!zero) {
		err = UPCIE_FAIL(-ENOMEM, "nvme: cqmirror: out of host memory");
		goto out;
	}
	r = cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)m->dev.vaddr, zero, (size_t)depth * 16,
			      ms->ctl);
	if (r != CUDA_SUCCESS) {
		err = UPCIE_GPU_CUDA_FAIL(r, "cuMemcpyHtoDAsync", "mirror CQ of %u entries", depth);
		goto out;
	}
	err = upcie_gpu_cuda_stream_wait(ms->ctl, UPCIE_NVME_CQMIRROR_COPY_TIMEOUT_NS,
					 "nvme: cqmirror: CQ clear");
	if (err)
		goto out;
	memset(&sl, 0, sizeof(sl));
	sl.dev_cq = (uint64_t)(uintptr_t)m->dev.vaddr;
	sl.host_cq = (uint64_t)upcie_gpu_cuda_host_devptr(gpu, m->host.vaddr);
	sl.depth = depth;
	off = offsetof(struct upcie_nvme_cqmirror_table, slot) + (size_t)s * sizeof(sl);
	/* Fields first, then the odd generation: the warp reads them after seeing it. */
	err =
	    upcie_nvme_cqmirror_put_(ms, off, &sl, offsetof(struct upcie_nvme_cqmirror_slot, gen));
	if (err)
		goto out;
	g = ms->gen[s] + 1;
	err = upcie_nvme_cqmirror_put_(ms, off + offsetof(struct upcie_nvme_cqmirror_slot, gen), &g,
				       sizeof(g));
	if (err)
		goto out;
	ms->gen[s] = g;
	ms->used[s] = true;
	ms->nused++;
	p->nmirror++;
	if (!ms->running) {
		err = upcie_nvme_cqmirror_launch_(ms);
		if (err) {
			/* Nothing runs: take the slot back as the warp would have. If the even
			 * write fails too, the slot stays taken until unpark_ writes it. */
			if (!upcie_nvme_cqmirror_close_gen_(ms, s)) {
				ms->ack[s] = ms->gen[s] - 1;
				ms->used[s] = false;
				ms->nused--;
			}
			p->nmirror--;
			goto out;
		}
	}
	/* The warp reports the generation it took up: a block that is not resident never does. */
	t0 = upcie_time_ns();
	while (ms->ack[UPCIE_NVME_CQMIRROR_SLOTS + s] != g) {
		if (upcie_time_ns() - t0 > UPCIE_NVME_CQMIRROR_ACK_TIMEOUT_NS) {
			err =
			    UPCIE_FAIL(-ETIMEDOUT,
				       "nvme: cqmirror: slot %d: the mirror warp did not start "
				       "within %" PRIu64
				       " ms (no room on the GPU for its block: kernels filling "
				       "every SM?); the slot is parked until it acknowledges",
				       s, (uint64_t)(UPCIE_NVME_CQMIRROR_ACK_TIMEOUT_NS / 1000000));
			/* Even again (or marked to retry: the slot would otherwise stay odd, and
			 * taken, until the kernel ends). Kept with its CQs: the warp may still start
			 * and copy under g. */
			upcie_nvme_cqmirror_close_gen_(ms, s);
			ms->parked[s] = true;
			ms->park_dev[s] = m->dev;
			ms->park_host[s] = m->host;
			have_dev = have_host = false;
			p->nmirror--;
			goto out;
		}
		sched_yield();
	}
	m->slot = s;
	m->depth = depth;
	m->gpu = *gpu;
	m->dev_cq_iova = m->dev.iova;
	m->host_cq = (struct upcie_nvme_cqe *)m->host.vaddr;
out:
	free(zero);
	if (err) {
		if (have_host)
			upcie_heap_free(&p->hheap, m->host.off);
		if (have_dev)
			upcie_heap_free(&p->dheap, m->dev.off);
		memset(m, 0, sizeof(*m));
		m->slot = -1;
	}
	upcie_gpu_cuda_dev_leave(&p->dev, &save);
	pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
	return err;
}

/*
 * Detach: raise the slot's generation to even, wait for the warp to acknowledge the odd value it
 * served, free both CQs; the last detach stops the kernel. Call after the controller deleted the
 * queue. Returns 0; -ETIMEDOUT (no acknowledgement within UPCIE_NVME_CQMIRROR_ACK_TIMEOUT_NS: the
 * CQs and the slot stay allocated, since the warp may still write; call detach again, which waits
 * for the same acknowledgement; or no stop of the kernel after the last detach, whose CQs are
 * freed); a CUDA error. A zeroed `m` (slot -1 or no provider) is a no-op.
 */
static inline int upcie_nvme_cqmirror_detach(struct upcie_nvme_cqmirror_cq *m)
{
	struct upcie_nvme_cqmirror_state_ *ms;
	struct upcie_gpu_cuda_ctx_save save;
	struct upcie_gpu_cuda_proc *p;
	uint64_t t0;
	uint32_t g;
	size_t off;
	int s, err;

	if (!m || !m->gpu.p || m->slot < 0)
		return 0;
	p = m->gpu.p;
	s = m->slot;
	pthread_mutex_lock(&upcie_gpu_cuda_lock_g);
	ms = (struct upcie_nvme_cqmirror_state_ *)p->mirror;
	err = upcie_gpu_cuda_dev_enter(&p->dev, &save);
	if (err) {
		pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
		return err;
	}
	off = offsetof(struct upcie_nvme_cqmirror_table, slot) +
	      (size_t)s * sizeof(struct upcie_nvme_cqmirror_slot) +
	      offsetof(struct upcie_nvme_cqmirror_slot, gen);
	g = ms->gen[s];
	if (g & 1u) { /* a retry after a timeout finds it even already */
		g++;
		err = upcie_nvme_cqmirror_put_(ms, off, &g, sizeof(g));
		if (err)
			goto out;
		ms->gen[s] = g;
	}
	t0 = upcie_time_ns();
	while (!UPCIE_NVME_CQMIRROR_ACKED(ms, s, g)) {
		if (upcie_time_ns() - t0 > UPCIE_NVME_CQMIRROR_ACK_TIMEOUT_NS) {
			err =
			    UPCIE_FAIL(-ETIMEDOUT,
				       "nvme: cqmirror: slot %d: no acknowledgement of generation "
				       "%u from the mirror warp; its CQs stay allocated",
				       s, g - 1);
			goto out;
		}
		sched_yield();
	}
	upcie_heap_free(&p->hheap, m->host.off);
	upcie_heap_free(&p->dheap, m->dev.off);
	ms->used[s] = false;
	ms->nused--;
	p->nmirror--;
	memset(m, 0, sizeof(*m));
	m->slot = -1;
	upcie_nvme_cqmirror_unpark_(p, ms, false);
	if (!ms->nused)
		err = upcie_nvme_cqmirror_retire_(p, ms);
out:
	upcie_gpu_cuda_dev_leave(&p->dev, &save);
	pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
	return err;
}

#endif /* UPCIE_GPUQ_CQMIRROR_HOST_CUDA_H */
