/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Completion-queue mirror for AMD GPUs, host side: attach a completion queue that the controller
 * writes into GPU memory and the CPU reads from host memory (gpuq/cqmirror_hip.h says why and how
 * the copying works). The HIP counterpart of gpuq/cqmirror_host_cuda.h.
 *
 * upcie_nvme_cqmirror_hip_attach() gives a CQ in polled device memory (gpu/heap_hip.h: uncached,
 * so the GPU's L2 cannot serve a poll an old line; give dev_cq_iova to Create I/O CQ) and one from
 * the host heap (what the CPU's queue pair reads: host_cq as cfg.cq of nvme/qpair.h), fills a
 * slot of the shared table and waits, bounded, until a wavefront has taken it up. The first
 * attach launches the kernel on a stream of its own, one wavefront per slot; the last detach
 * retires it. upcie_nvme_cqmirror_hip_stop() stops the copying (bounded; retried, it only waits
 * again); upcie_nvme_cqmirror_hip_detach() stops and frees. Detach after the controller deleted
 * the queue: until then the controller may still write the device CQ.
 *
 * Bounded: attach (no wavefront took the slot up: the GPU is full of other persistent kernels),
 * stop (a wavefront that does not answer) and retire (a kernel that does not exit) each give up
 * with -ETIMEDOUT after their timeout and keep whatever a wavefront might still write, never
 * freeing it early; a later call picks up where that one left off.
 *
 * While the kernel runs, anything that waits for the device to go idle waits for it and does not
 * return: hipDeviceSynchronize(), and hipFree() (ROCm synchronises the device before freeing).
 * So the device CQs of this mirror are freed only once the kernel has exited, being kept per slot
 * and reused until then; free other device memory after the last detach, and synchronise on
 * streams. For the same reason a mirrored queue and a GPU-issued queue pair
 * (gpuq/gqp_host_hip.h, whose destroy synchronises the device) refuse each other with -EBUSY.
 *
 * The kernel is compiled into the translation unit that includes this header, so that unit is
 * built by hipcc (the kernel needs no device library). Locking: attach, stop and detach take the
 * provider's mutex; a mirrored CQ has one owner.
 */
#ifndef UPCIE_GPUQ_CQMIRROR_HOST_HIP_H
#define UPCIE_GPUQ_CQMIRROR_HOST_HIP_H

#include <upcie/base/feature.h>

#if !defined(__HIPCC__)
#error "upcie: gpuq/cqmirror_host_hip.h launches the mirror's kernel: compile this unit with hipcc"
#endif

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <hip/hip_runtime.h>

#include <upcie/base/clock.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/gpu/dev_hip.h>
#include <upcie/gpu/heap_hip.h>
#include <upcie/mem/heap.h>
#include <upcie/gpuq/cqmirror_hip.h>
#include <upcie/nvme/spec.h>

/* How long the last detach waits for the kernel to exit. */
#ifndef UPCIE_NVME_CQMIRROR_HIP_RETIRE_TIMEOUT_NS
#define UPCIE_NVME_CQMIRROR_HIP_RETIRE_TIMEOUT_NS (2 * UPCIE_NSEC_PER_SEC)
#endif

/* One mirrored completion queue. */
struct upcie_nvme_cqmirror_hip_cq {
	uint64_t dev_cq_iova;		/* Create I/O CQ: PRP1 (the controller writes here) */
	struct upcie_nvme_cqe *host_cq; /* CPU address: the queue pair's cfg.cq */
	uint32_t depth;
	int slot; /* -1: none */
	uint32_t gen;
	struct upcie_gpu_hip gpu; /* borrowed */
};

/* Per-process mirror state, hung off the provider. */
struct upcie_nvme_cqmirror_hip_state_ {
	struct upcie_nvme_cqmirror_hip_ctl ctl;
	struct upcie_nvme_cqmirror_hip_table *table; /* CPU address */
	void *table_dev;			     /* the same, as the GPU addresses it */
	hipStream_t stream;			     /* the kernel's */
	hipStream_t aux;			     /* zeroing the device CQs */
	uint32_t lanes;				     /* wavefront size: the block size */
	bool running, retiring;
	/* per slot: the device CQ (kept until the kernel exited), the host CQ (while in use) */
	struct upcie_gpu_hip_polled dev[UPCIE_NVME_CQMIRROR_HIP_SLOTS];
	struct upcie_heap_buf host[UPCIE_NVME_CQMIRROR_HIP_SLOTS];
	bool have_host[UPCIE_NVME_CQMIRROR_HIP_SLOTS];
	/* device CQs outgrown while the kernel ran, freed once it has exited */
	struct upcie_gpu_hip_polled old[UPCIE_NVME_CQMIRROR_HIP_SLOTS];
};

/* Free what only an exited kernel lets go of: the device CQs. Lock held, device entered. */
static inline void upcie_nvme_cqmirror_hip_free_dev_(struct upcie_gpu_hip_proc *p,
						     struct upcie_nvme_cqmirror_hip_state_ *ms)
{
	struct upcie_gpu_hip gpu = { p };

	for (int s = 0; s < UPCIE_NVME_CQMIRROR_HIP_SLOTS; s++) {
		if (ms->ctl.state[s] == UPCIE_NVME_CQMIRROR_HIP_FREE)
			upcie_gpu_hip_polled_free(&gpu, &ms->dev[s]);
		upcie_gpu_hip_polled_free(&gpu, &ms->old[s]);
	}
}

static inline void upcie_nvme_cqmirror_hip_free_host_(struct upcie_gpu_hip_proc *p,
						      struct upcie_nvme_cqmirror_hip_state_ *ms,
						      int s)
{
	if (ms->have_host[s])
		upcie_heap_free(&p->hheap, ms->host[s].off);
	ms->have_host[s] = false;
}

/* The kernel has exited: settle the slots, free what it held. Lock held, device entered. */
static inline void upcie_nvme_cqmirror_hip_exited_(struct upcie_gpu_hip_proc *p,
						   struct upcie_nvme_cqmirror_hip_state_ *ms)
{
	uint64_t orphans = upcie_nvme_cqmirror_hip_ctl_exited(&ms->ctl);

	for (int s = 0; s < UPCIE_NVME_CQMIRROR_HIP_SLOTS; s++)
		if (orphans & (UINT64_C(1) << s)) {
			upcie_nvme_cqmirror_hip_free_host_(p, ms, s);
			p->nmirror--;
		}
	ms->running = false;
	ms->retiring = false;
	upcie_nvme_cqmirror_hip_free_dev_(p, ms);
}

/* Wait (bounded) for the kernel to exit after the stop flag. Lock held, device entered. */
static inline int upcie_nvme_cqmirror_hip_reap_kernel_(struct upcie_gpu_hip_proc *p,
						       struct upcie_nvme_cqmirror_hip_state_ *ms,
						       uint64_t timeout_ns)
{
	uint64_t t0 = upcie_time_ns();
	hipError_t r;

	for (;;) {
		r = hipStreamQuery(ms->stream);
		if (r == hipSuccess) {
			upcie_nvme_cqmirror_hip_exited_(p, ms);
			return 0;
		}
		if (r != hipErrorNotReady)
			return UPCIE_GPU_HIP_FAIL(r, "hipStreamQuery", "mirror kernel");
		if (upcie_time_ns() - t0 >= timeout_ns) {
			ms->retiring = true;
			return UPCIE_FAIL(-ETIMEDOUT,
					  "nvme: cqmirror hip: the kernel did not exit within %llu "
					  "ms of its stop flag (a wavefront never became resident, "
					  "or one is stuck); its memory stays allocated",
					  (unsigned long long)(timeout_ns / UPCIE_NSEC_PER_MSEC));
		}
		sched_yield();
	}
}

/* Retire the kernel when no slot is in use. Lock held, device entered. */
static inline int upcie_nvme_cqmirror_hip_retire_(struct upcie_gpu_hip_proc *p,
						  struct upcie_nvme_cqmirror_hip_state_ *ms)
{
	int err;

	if (!ms->running || upcie_nvme_cqmirror_hip_ctl_busy(&ms->ctl))
		return 0;
	if (!ms->retiring) {
		err = upcie_nvme_cqmirror_hip_ctl_retire(&ms->ctl);
		if (err)
			return err;
	}
	return upcie_nvme_cqmirror_hip_reap_kernel_(p, ms,
						    UPCIE_NVME_CQMIRROR_HIP_RETIRE_TIMEOUT_NS);
}

/* ORPHAN slots a wavefront has acknowledged: free them. Lock held. */
static inline void upcie_nvme_cqmirror_hip_reclaim_(struct upcie_gpu_hip_proc *p,
						    struct upcie_nvme_cqmirror_hip_state_ *ms)
{
	for (int s = 0; s < (int)ms->ctl.nslots; s++)
		if (upcie_nvme_cqmirror_hip_ctl_reclaim(&ms->ctl, s)) {
			upcie_nvme_cqmirror_hip_free_host_(p, ms, s);
			p->nmirror--;
		}
}

/*
 * The provider's last close: stop every slot, retire the kernel (bounded), free everything; if the
 * kernel does not exit, its memory is left allocated rather than freed under it.
 */
static inline void upcie_nvme_cqmirror_hip_fini_(struct upcie_gpu_hip_proc *p)
{
	struct upcie_nvme_cqmirror_hip_state_ *ms =
	    (struct upcie_nvme_cqmirror_hip_state_ *)p->mirror;
	struct upcie_gpu_hip_dev_save save;
	bool entered;

	if (!ms)
		return;
	entered = !upcie_gpu_hip_dev_enter(&p->dev, &save);
	if (ms->running) {
		for (int s = 0; s < (int)ms->ctl.nslots; s++)
			if (ms->ctl.state[s] == UPCIE_NVME_CQMIRROR_HIP_LIVE)
				upcie_nvme_cqmirror_hip_ctl_stop_begin(&ms->ctl, s, ms->ctl.gen[s]);
		*(volatile uint32_t *)&ms->table->stop = 1;
		upcie_mb();
		if (!entered || upcie_nvme_cqmirror_hip_reap_kernel_(
				    p, ms, UPCIE_NVME_CQMIRROR_HIP_RETIRE_TIMEOUT_NS)) {
			UPCIE_ERR("nvme: cqmirror hip: kernel not stopped at the last close; its "
				  "memory is left allocated");
			if (entered)
				upcie_gpu_hip_dev_leave(&p->dev, &save);
			p->mirror = NULL;
			p->mirror_fini = NULL;
			return;
		}
	}
	for (int s = 0; s < UPCIE_NVME_CQMIRROR_HIP_SLOTS; s++)
		upcie_nvme_cqmirror_hip_free_host_(p, ms, s);
	if (entered) {
		upcie_nvme_cqmirror_hip_free_dev_(p, ms);
		for (int s = 0; s < UPCIE_NVME_CQMIRROR_HIP_SLOTS; s++) {
			struct upcie_gpu_hip gpu = { p };

			upcie_gpu_hip_polled_free(&gpu, &ms->dev[s]);
		}
		if (ms->table)
			upcie_gpu_hip_check_(hipHostFree(ms->table), "hipHostFree");
		if (ms->aux)
			upcie_gpu_hip_check_(hipStreamDestroy(ms->aux), "hipStreamDestroy");
		if (ms->stream)
			upcie_gpu_hip_check_(hipStreamDestroy(ms->stream), "hipStreamDestroy");
		upcie_gpu_hip_dev_leave(&p->dev, &save);
	}
	free(ms);
	p->mirror = NULL;
	p->mirror_fini = NULL;
}

/* Set up the table and streams. Lock held, device entered. */
static inline int upcie_nvme_cqmirror_hip_init_(struct upcie_gpu_hip_proc *p)
{
	struct upcie_nvme_cqmirror_hip_state_ *ms;
	int lanes = 0;
	hipError_t r;
	int err;

	ms = (struct upcie_nvme_cqmirror_hip_state_ *)calloc(1, sizeof(*ms));
	if (!ms)
		return UPCIE_FAIL(-ENOMEM, "nvme: cqmirror hip: out of host memory");
	p->mirror = ms;
	p->mirror_fini = upcie_nvme_cqmirror_hip_fini_;
	r = hipDeviceGetAttribute(&lanes, hipDeviceAttributeWarpSize, p->dev.ordinal);
	if (r == hipSuccess && lanes != 32 && lanes != 64)
		r = hipErrorInvalidValue;
	ms->lanes = (uint32_t)lanes;
	/* Fine-grained host memory: plain CPU stores reach the GPU's polls, and back. */
	if (r == hipSuccess)
		r = hipHostMalloc((void **)&ms->table, sizeof(*ms->table),
				  hipHostMallocMapped | hipHostMallocCoherent);
	if (r == hipSuccess) {
		memset(ms->table, 0, sizeof(*ms->table));
		r = hipHostGetDevicePointer(&ms->table_dev, ms->table, 0);
	}
	if (r == hipSuccess)
		r = hipStreamCreateWithFlags(&ms->stream, hipStreamNonBlocking);
	if (r == hipSuccess)
		r = hipStreamCreateWithFlags(&ms->aux, hipStreamNonBlocking);
	if (r != hipSuccess) {
		err = UPCIE_GPU_HIP_FAIL(r, "hipHostMalloc/hipStreamCreateWithFlags",
					 "setting up the completion mirror");
		upcie_nvme_cqmirror_hip_fini_(p);
		return err;
	}
	return upcie_nvme_cqmirror_hip_ctl_init(&ms->ctl, ms->table, UPCIE_NVME_CQMIRROR_HIP_SLOTS,
						0, 0);
}

/* The device CQ of slot `s`, at least `bytes`, zeroed. Lock held, device entered. */
static inline int upcie_nvme_cqmirror_hip_dev_cq_(struct upcie_gpu_hip_proc *p,
						  struct upcie_nvme_cqmirror_hip_state_ *ms, int s,
						  uint64_t bytes)
{
	struct upcie_gpu_hip gpu = { p };
	hipError_t r;

	if (ms->dev[s].ptr && ms->dev[s].size >= bytes) {
		r = hipMemsetAsync(ms->dev[s].ptr, 0, (size_t)bytes, ms->aux);
		if (r == hipSuccess)
			r = hipStreamSynchronize(ms->aux);
		if (r != hipSuccess)
			return UPCIE_GPU_HIP_FAIL(r, "hipMemsetAsync", "mirror CQ of slot %d", s);
		return 0;
	}
	if (ms->dev[s].ptr) {
		/* Too small, and hipFree would wait for the running kernel: kept until it exits. */
		if (ms->running && ms->old[s].ptr)
			return UPCIE_FAIL(-ENOMEM,
					  "nvme: cqmirror hip: slot %d outgrew its device CQ twice "
					  "while the kernel runs; detach every queue once",
					  s);
		if (ms->running)
			ms->old[s] = ms->dev[s];
		else
			upcie_gpu_hip_polled_free(&gpu, &ms->dev[s]);
		memset(&ms->dev[s], 0, sizeof(ms->dev[s]));
	}
	/* 64 KiB at least: a later, deeper queue on this slot still fits */
	return upcie_gpu_hip_polled_alloc(&gpu, bytes > 65536 ? bytes : 65536, ms->aux,
					  &ms->dev[s]);
}

/*
 * Attach a mirrored CQ of `depth` entries (2..65536): both CQs zeroed, a slot filled, the kernel
 * launched if this is the first, and a wavefront serving the slot before this returns. Returns
 * 0; -EINVAL; -EBUSY (a GPU-issued queue pair is open, or the last kernel has not exited yet);
 * -ENOSPC (all slots in use); -ENOMEM; -ETIMEDOUT (no wavefront took the slot up within
 * UPCIE_NVME_CQMIRROR_HIP_ATTACH_TIMEOUT_NS: the GPU is full; the attach is withdrawn and its
 * memory freed once a wavefront acknowledges or the kernel has exited); a HIP or heap error. `m`
 * is zeroed (slot -1) on failure.
 */
static inline int upcie_nvme_cqmirror_hip_attach(struct upcie_nvme_cqmirror_hip_cq *m,
						 struct upcie_gpu_hip *gpu, uint32_t depth)
{
	struct upcie_nvme_cqmirror_hip_state_ *ms;
	struct upcie_gpu_hip_dev_save save;
	struct upcie_gpu_hip_proc *p;
	uint64_t host_dev;
	int s = -1, s2 = -1, err;
	uint32_t g = 0;
	hipError_t r;

	if (!m)
		return UPCIE_FAIL(-EINVAL, "nvme: cqmirror hip: NULL queue");
	memset(m, 0, sizeof(*m));
	m->slot = -1;
	if (!gpu || !gpu->p || depth < 2 || depth > 65536)
		return UPCIE_FAIL(-EINVAL, "nvme: cqmirror hip: closed provider or depth %u",
				  depth);
	p = gpu->p;
	pthread_mutex_lock(&upcie_gpu_hip_lock_g);
	if (p->ngqp) {
		pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
		return UPCIE_FAIL(-EBUSY,
				  "nvme: cqmirror hip: %u GPU-issued queue pairs are open; "
				  "GPU-issued and mirrored queues exclude each other",
				  p->ngqp);
	}
	err = upcie_gpu_hip_dev_enter(&p->dev, &save);
	if (err) {
		pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
		return err;
	}
	if (!p->mirror)
		err = upcie_nvme_cqmirror_hip_init_(p);
	if (err)
		goto out;
	ms = (struct upcie_nvme_cqmirror_hip_state_ *)p->mirror;
	if (ms->retiring) {
		err = upcie_nvme_cqmirror_hip_reap_kernel_(p, ms, 0);
		if (err) {
			err = UPCIE_FAIL(-EBUSY, "nvme: cqmirror hip: the last kernel has not "
						 "exited; try again later");
			goto out;
		}
	}
	upcie_nvme_cqmirror_hip_reclaim_(p, ms);
	for (int i = 0; i < (int)ms->ctl.nslots && s < 0; i++)
		if (ms->ctl.state[i] == UPCIE_NVME_CQMIRROR_HIP_FREE)
			s = i;
	if (s < 0) {
		err =
		    UPCIE_FAIL(-ENOSPC, "nvme: cqmirror hip: all %u slots in use", ms->ctl.nslots);
		goto out;
	}
	err = upcie_nvme_cqmirror_hip_dev_cq_(p, ms, s, (uint64_t)depth * 16);
	if (err)
		goto out;
	err = upcie_heap_alloc_array(&p->hheap, 1, (uint64_t)depth * 16, 4096, &ms->host[s]);
	if (err)
		goto out;
	ms->have_host[s] = true;
	memset(ms->host[s].vaddr, 0, (size_t)depth * 16);
	host_dev = (uint64_t)(uintptr_t)upcie_gpu_hip_host_devptr(gpu, ms->host[s].vaddr);
	err = upcie_nvme_cqmirror_hip_ctl_attach_begin(
	    &ms->ctl, (uint64_t)(uintptr_t)ms->dev[s].ptr, host_dev, depth, &s2, &g);
	if (err || s2 != s) {
		err = err ? err : UPCIE_FAIL(-EIO, "nvme: cqmirror hip: slot %d, not %d", s2, s);
		upcie_nvme_cqmirror_hip_free_host_(p, ms, s);
		goto out;
	}
	p->nmirror++;
	if (!ms->running) {
		hipLaunchKernelGGL(upcie_nvme_cqmirror_hip_kernel<0>,
				   dim3(UPCIE_NVME_CQMIRROR_HIP_SLOTS), dim3(ms->lanes), 0,
				   ms->stream,
				   (struct upcie_nvme_cqmirror_hip_table *)ms->table_dev);
		r = hipGetLastError();
		if (r != hipSuccess) {
			/* Nothing runs: nothing can have taken the slot up. */
			err =
			    UPCIE_GPU_HIP_FAIL(r, "hipLaunchKernelGGL", "completion mirror kernel");
			upcie_nvme_cqmirror_hip_ctl_withdraw(&ms->ctl, s);
			upcie_nvme_cqmirror_hip_ctl_exited(&ms->ctl);
			upcie_nvme_cqmirror_hip_free_host_(p, ms, s);
			p->nmirror--;
			goto out;
		}
		ms->running = true;
	}
	for (uint64_t t0 = upcie_time_ns(); !upcie_nvme_cqmirror_hip_ctl_taken(&ms->ctl, s, g);) {
		if (upcie_time_ns() - t0 >= ms->ctl.attach_timeout_ns) {
			upcie_nvme_cqmirror_hip_ctl_withdraw(&ms->ctl, s);
			err = UPCIE_FAIL(
			    -ETIMEDOUT,
			    "nvme: cqmirror hip: slot %d: no wavefront took it up "
			    "within %llu ms (is the GPU full of other persistent "
			    "kernels?); attach withdrawn",
			    s,
			    (unsigned long long)(ms->ctl.attach_timeout_ns / UPCIE_NSEC_PER_MSEC));
			goto out;
		}
		sched_yield();
	}
	m->slot = s;
	m->gen = g;
	m->depth = depth;
	m->gpu = *gpu;
	m->dev_cq_iova = ms->dev[s].iova;
	m->host_cq = (struct upcie_nvme_cqe *)ms->host[s].vaddr;
out:
	upcie_gpu_hip_dev_leave(&p->dev, &save);
	pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
	return err;
}

/*
 * Stop copying: raise the slot's generation to even (once) and wait for the wavefront's
 * acknowledgement. Afterwards the host CQ holds every entry the controller wrote before the
 * stop, and nothing more is written to it. Returns 0; -ETIMEDOUT (no acknowledgement within
 * UPCIE_NVME_CQMIRROR_HIP_ACK_TIMEOUT_NS: both CQs stay allocated; calling again waits again and
 * never restarts the copying); -EINVAL. A zeroed `m` is a no-op.
 */
static inline int upcie_nvme_cqmirror_hip_stop(struct upcie_nvme_cqmirror_hip_cq *m)
{
	struct upcie_nvme_cqmirror_hip_state_ *ms;
	int err;

	if (!m || !m->gpu.p || m->slot < 0)
		return 0;
	pthread_mutex_lock(&upcie_gpu_hip_lock_g);
	ms = (struct upcie_nvme_cqmirror_hip_state_ *)m->gpu.p->mirror;
	err = ms ? upcie_nvme_cqmirror_hip_ctl_stop(&ms->ctl, m->slot, m->gen)
		 : UPCIE_FAIL(-EINVAL, "nvme: cqmirror hip: no mirror");
	pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
	return err;
}

/*
 * Detach: stop (as upcie_nvme_cqmirror_hip_stop()), give the host CQ back and the slot free; the
 * last detach retires the kernel and frees the device CQs. Call after the controller deleted the
 * queue. Returns 0; -ETIMEDOUT (the stop, `m` still attached: call again; or the retire, `m`
 * detached and the kernel's memory kept until a later attach or close finds it exited); a HIP
 * error. A zeroed `m` (slot -1) is a no-op.
 */
static inline int upcie_nvme_cqmirror_hip_detach(struct upcie_nvme_cqmirror_hip_cq *m)
{
	struct upcie_nvme_cqmirror_hip_state_ *ms;
	struct upcie_gpu_hip_dev_save save;
	struct upcie_gpu_hip_proc *p;
	int err;

	if (!m || !m->gpu.p || m->slot < 0)
		return 0;
	p = m->gpu.p;
	pthread_mutex_lock(&upcie_gpu_hip_lock_g);
	ms = (struct upcie_nvme_cqmirror_hip_state_ *)p->mirror;
	err = ms ? upcie_nvme_cqmirror_hip_ctl_stop(&ms->ctl, m->slot, m->gen)
		 : UPCIE_FAIL(-EINVAL, "nvme: cqmirror hip: no mirror");
	if (err) {
		pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
		return err;
	}
	upcie_nvme_cqmirror_hip_free_host_(p, ms, m->slot);
	upcie_nvme_cqmirror_hip_ctl_release(&ms->ctl, m->slot);
	p->nmirror--;
	memset(m, 0, sizeof(*m));
	m->slot = -1;
	upcie_nvme_cqmirror_hip_reclaim_(p, ms);
	err = upcie_gpu_hip_dev_enter(&p->dev, &save);
	if (!err) {
		err = upcie_nvme_cqmirror_hip_retire_(p, ms);
		upcie_gpu_hip_dev_leave(&p->dev, &save);
	}
	pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
	return err;
}

/* Whether the mirror kernel is running (for tests and diagnostics). */
static inline bool upcie_nvme_cqmirror_hip_running(const struct upcie_gpu_hip *gpu)
{
	const struct upcie_nvme_cqmirror_hip_state_ *ms;
	bool running;

	if (!gpu || !gpu->p)
		return false;
	pthread_mutex_lock(&upcie_gpu_hip_lock_g);
	ms = (const struct upcie_nvme_cqmirror_hip_state_ *)gpu->p->mirror;
	running = ms && ms->running;
	pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
	return running;
}

#endif /* UPCIE_GPUQ_CQMIRROR_HOST_HIP_H */
