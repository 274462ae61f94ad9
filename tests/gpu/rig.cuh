/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Test rig shared by the GPU tests and benchmarks: the provider opened with the tests' own address
 * scheme (device address = virtual address + RIG_IOVA_OFFSET, UPCIE_GPU_CUDA_XLATE_OFFSET), a
 * namespace buffer, doorbells in device memory, GPU-resident queue pairs created through
 * gpuq/gqp_host_cuda.h and described to the null controller as Create I/O SQ/CQ would (from their
 * device addresses), and start/stop of the controller kernel on a stream of its own.
 */
#ifndef UPCIE_TEST_RIG_CUH
#define UPCIE_TEST_RIG_CUH

#include <cuda_runtime.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <upcie/gpu/heap_cuda.h>
#include <upcie/gpuq/gqp_host_cuda.h>

#include "nullctl.cuh"

#define RIG_IOVA_OFFSET (UINT64_C(1) << 56)

#define RIG_CK(call)                                                                               \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess) {                                                           \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,              \
				cudaGetErrorName(e_));                                             \
			exit(2);                                                                   \
		}                                                                                  \
	} while (0)

/*
 * Results shared with kernels live in pinned host memory, never managed memory: where the GPU
 * cannot migrate managed memory while kernels run, a launch that touches it would wait for the
 * persistent controller kernel, forever.
 */
static inline void *rig_pinned(size_t n)
{
	void *p;

	RIG_CK(cudaHostAlloc(&p, n, cudaHostAllocMapped));
	memset(p, 0, n);
	return p;
}

/* Where a run that hangs was: printed by the watchdog (alarm) before it ends the process. */
static const char *volatile rig_stage = "start";

static void rig_watchdog_(int sig)
{
	char msg[256];
	int n = snprintf(msg, sizeof(msg), "\nnot ok - watchdog: stuck at \"%s\"\n", rig_stage);

	(void)sig;
	if (write(1, msg, n) < 0)
		_exit(4);
	_exit(4);
}

/*
 * Before any CUDA call: load every kernel at start. With lazy loading (the default since CUDA
 * 12.2) the first launch of a kernel may wait for the device to go idle, which it never does while
 * the persistent controller (or the completion mirror) runs.
 */
static inline void rig_eager(void)
{
	setenv("CUDA_MODULE_LOADING", "EAGER", 1);
}

static inline void rig_watchdog(unsigned seconds)
{
	signal(SIGALRM, rig_watchdog_);
	alarm(seconds);
}

/* Wait for a stream, at most `seconds`; a hang ends the process with the stage named. */
static inline void rig_sync(cudaStream_t s, const char *what)
{
	uint64_t t0 = upcie_time_ns();
	cudaError_t e;

	rig_stage = what;
	while ((e = cudaStreamQuery(s)) == cudaErrorNotReady) {
		if (upcie_time_ns() - t0 > 8 * UPCIE_NSEC_PER_SEC) {
			printf("not ok - %s: still running after 8 s\n", what);
			fflush(stdout);
			_exit(3);
		}
		usleep(50);
	}
	if (e != cudaSuccess) {
		printf("not ok - %s: %s\n", what, cudaGetErrorName(e));
		fflush(stdout);
		_exit(3);
	}
}

struct rig {
	struct upcie_gpu_cuda gpu;
	struct nullctl c; /* host staging of the controller's state */
	struct nullctl *c_dev;
	volatile uint32_t *stop_h;
	uint32_t *stop_d;
	uint8_t *ns;
	uint64_t ns_bytes;
	uint32_t *dbs; /* device memory: SQ tail and CQ head doorbell per queue */
	cudaStream_t s_ctl, s_run;
	struct upcie_nvme_gqp_host gq[NULLCTL_MAX_Q];
	struct upcie_nvme_gqp **dqs; /* device array of the queues' device state */
	int nq;
	bool running;
	uint32_t ctl_smem; /* dynamic shared memory of the controller's blocks (placement) */
};

static inline int rig_open(struct rig *r, uint64_t dheap, uint64_t hheap, uint64_t ns_bytes)
{
	struct upcie_gpu_cuda_opts o;
	int err;

	memset(r, 0, sizeof(*r));
	memset(&o, 0, sizeof(o));
	o.gpu_id = 0;
	o.device_heap_size = dheap;
	o.host_heap_size = hheap;
	o.xlate = UPCIE_GPU_CUDA_XLATE_OFFSET;
	o.iova_offset = RIG_IOVA_OFFSET;
	err = upcie_gpu_cuda_open(&r->gpu, &o);
	if (err)
		return err;
	/* Reserve local memory before the first persistent kernel: a later kernel that needed the
	 * reservation grown would wait for the device to go idle, which it never does. */
	RIG_CK(cudaDeviceSetLimit(cudaLimitStackSize, 4096));
	RIG_CK(cudaMalloc(&r->c_dev, sizeof(struct nullctl)));
	RIG_CK(cudaHostAlloc((void **)&r->stop_h, 4096, cudaHostAllocMapped));
	*r->stop_h = 0;
	RIG_CK(cudaHostGetDevicePointer((void **)&r->stop_d, (void *)r->stop_h, 0));
	r->ns_bytes = ns_bytes;
	RIG_CK(cudaMalloc(&r->ns, ns_bytes));
	RIG_CK(cudaMemset(r->ns, 0, ns_bytes));
	RIG_CK(cudaMalloc(&r->dbs, 2 * NULLCTL_MAX_Q * sizeof(uint32_t)));
	RIG_CK(cudaMalloc(&r->dqs, NULLCTL_MAX_Q * sizeof(void *)));
	RIG_CK(cudaStreamCreateWithFlags(&r->s_ctl, cudaStreamNonBlocking));
	RIG_CK(cudaStreamCreateWithFlags(&r->s_run, cudaStreamNonBlocking));
	r->c.stop = r->stop_d;
	r->c.iova_offset = RIG_IOVA_OFFSET;
	r->c.ns = r->ns;
	r->c.ns_bytes = ns_bytes;
	r->c.lba_shift = 9;
	return 0;
}

static inline void rig_close(struct rig *r)
{
	cudaFree(r->dqs);
	cudaFree(r->dbs);
	cudaFree(r->ns);
	cudaFreeHost((void *)r->stop_h);
	cudaFree(r->c_dev);
	cudaStreamDestroy(r->s_ctl);
	cudaStreamDestroy(r->s_run);
	upcie_gpu_cuda_close(&r->gpu);
	memset(r, 0, sizeof(*r));
}

/* The controller's view of a queue: device address back to a pointer. */
static inline void *rig_ptr(uint64_t iova)
{
	return (void *)(uintptr_t)(iova - RIG_IOVA_OFFSET);
}

static inline int rig_queues_create(struct rig *r, int nq, uint32_t depth, unsigned flags)
{
	struct upcie_nvme_gqp *dq[NULLCTL_MAX_Q];

	RIG_CK(cudaMemset(r->dbs, 0, 2 * NULLCTL_MAX_Q * sizeof(uint32_t)));
	for (int i = 0; i < nq; i++) {
		struct upcie_nvme_gqp_cfg cfg;
		struct nullctl_queue *cq = &r->c.q[i];
		int err;

		memset(&cfg, 0, sizeof(cfg));
		cfg.qid = (uint16_t)(i + 1);
		cfg.depth = depth;
		cfg.flags = flags;
		cfg.sqdb = r->dbs + 2 * i;
		cfg.cqdb = r->dbs + 2 * i + 1;
		err = upcie_nvme_gqp_create(&r->gq[i], &r->gpu, &cfg);
		if (err) {
			for (int k = 0; k < i; k++)
				upcie_nvme_gqp_destroy(&r->gq[k]);
			return err;
		}
		dq[i] = r->gq[i].dq;
		memset(cq, 0, sizeof(*cq));
		cq->sq = (const struct upcie_nvme_sqe *)rig_ptr(r->gq[i].sq_iova);
		cq->cq = (struct upcie_nvme_cqe *)rig_ptr(r->gq[i].cq_iova);
		cq->sqdb = cfg.sqdb;
		cq->cqdb = cfg.cqdb;
		cq->depth = depth;
		cq->qid = cfg.qid;
		cq->phase = 1;
	}
	RIG_CK(cudaMemcpy(r->dqs, dq, nq * sizeof(void *), cudaMemcpyHostToDevice));
	r->nq = nq;
	r->c.nq = (uint32_t)nq;
	return 0;
}

static inline void rig_queues_destroy(struct rig *r)
{
	for (int i = 0; i < r->nq; i++)
		upcie_nvme_gqp_destroy(&r->gq[i]);
	r->nq = 0;
}

static inline void rig_ctl_start(struct rig *r, uint32_t ooo, uint64_t delay_ns)
{
	r->c.ooo = ooo;
	r->c.delay_ns = delay_ns;
	*r->stop_h = 0;
	rig_stage = "controller start";
	RIG_CK(cudaMemcpy(r->c_dev, &r->c, sizeof(r->c), cudaMemcpyHostToDevice));
	nullctl_kernel<<<r->c.nq, 32, r->ctl_smem, r->s_ctl>>>(r->c_dev);
	RIG_CK(cudaGetLastError());
	r->running = true;
}

/* Stop the controller, wait for it, and copy its counters back into r->c. */
static inline void rig_ctl_stop(struct rig *r)
{
	if (!r->running)
		return;
	*r->stop_h = 1;
	__sync_synchronize();
	rig_sync(r->s_ctl, "controller stop");
	RIG_CK(cudaMemcpy(&r->c, r->c_dev, sizeof(r->c), cudaMemcpyDeviceToHost));
	*r->stop_h = 0;
	r->running = false;
}

#endif /* UPCIE_TEST_RIG_CUH */
