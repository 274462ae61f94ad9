/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * nvme/qpair.h as CUDA device code. Block 0 drives a queue pair (enqueue, ring, reap, wait,
 * submit_sync, cancel) from one GPU thread; block 1 is a device-side responder that consumes
 * SQEs when the doorbell moves and posts CQEs with phase tags, dropping commands tagged 0xdeadbeef.
 * CI only compiles this file (nvcc -x cu -arch=sm_90 -c); on a GPU machine it runs and prints TAP.
 */
#include <upcie/nvme/cmd.h>
#include <upcie/nvme/qpair.h>

#include <cstdio>
#include <cstring>

#define DEPTH	 64
#define TOTAL	 100000u
#define DROP_TAG 0xdeadbeefu /* above every sequence number used */

struct shared_state {
	struct upcie_nvme_qpair qp;
	uint32_t sqdb, cqdb;
	int stop;
	unsigned long long completed, mismatched, cancelled;
	int sync_ok, sync_timeout, wait_timeout, cancel_ret, outstanding_after;
	unsigned long long elapsed_ns;
};

__device__ static void respond(struct shared_state *s)
{
	struct upcie_nvme_sqe *sq = s->qp.sq;
	struct upcie_nvme_cqe *cq = s->qp.cq;
	volatile uint32_t *db = &s->sqdb;
	volatile int *stop = &s->stop;
	uint32_t head = 0, tail = 0, phase = 1;

	while (!*stop) {
		uint32_t t = *db;

		__threadfence_system();
		while (head != t) {
			const volatile struct upcie_nvme_sqe *e = &sq[head];
			uint16_t cid = e->cid;
			uint32_t tag = e->cdw2;
			volatile struct upcie_nvme_cqe *c;

			head = head + 1 == DEPTH ? 0 : head + 1;
			if (tag == DROP_TAG)
				continue;
			c = &cq[tail];
			c->dw0 = tag;
			c->dw1 = 0;
			c->dw2 = head | (1u << 16);
			__threadfence_system();
			c->dw3 = upcie_nvme_cqe_dw3_make(cid, phase, 0, false);
			if (++tail == DEPTH) {
				tail = 0;
				phase ^= 1;
			}
		}
	}
}

struct tag_ctx {
	struct shared_state *s;
	uint32_t tag;
};

__device__ static void on_done(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct shared_state *s = (struct shared_state *)ctx;

	if (err == -ECANCELED) {
		s->cancelled++;
		return;
	}
	s->completed++;
	if (!upcie_nvme_cqe_ok(cqe))
		s->mismatched++;
}

__device__ static void drive(struct shared_state *s)
{
	struct upcie_nvme_qpair *qp = &s->qp;
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_cqe cqe;
	uint32_t sent = 0;
	uint16_t cid = 0;
	uint64_t t0 = upcie_nvme_port_time_ns();

	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = 0x80;
	while (sent < TOTAL || upcie_nvme_qpair_inflight(qp)) {
		while (sent < TOTAL) {
			sqe.cdw2 = sent;
			if (upcie_nvme_qpair_enqueue(qp, &sqe, on_done, s, NULL))
				break;
			sent++;
		}
		upcie_nvme_qpair_ring(qp);
		if (upcie_nvme_qpair_reap(qp, DEPTH) < 0)
			s->mismatched++;
		if (upcie_nvme_port_time_ns() - t0 > 10 * UPCIE_NSEC_PER_SEC) {
			s->mismatched++; /* never hang the GPU: give up after 10 s */
			break;
		}
	}
	s->elapsed_ns = upcie_nvme_port_time_ns() - t0;
	sqe.cdw2 = 7;
	s->sync_ok =
	    upcie_nvme_qpair_submit_sync(qp, &sqe, 100 * UPCIE_NSEC_PER_MSEC, &cqe, NULL) == 0 &&
	    cqe.dw0 == 7;
	sqe.cdw2 = DROP_TAG;
	s->sync_timeout = upcie_nvme_qpair_submit_sync(qp, &sqe, 2 * UPCIE_NSEC_PER_MSEC, &cqe,
						       &cid) == -ETIMEDOUT;
	upcie_nvme_qpair_submit(qp, &sqe, on_done, s, &cid);
	s->wait_timeout = upcie_nvme_qpair_wait(qp, cid, UPCIE_NSEC_PER_MSEC) == -ETIMEDOUT;
	s->cancel_ret = upcie_nvme_qpair_cancel(qp, cid);
	s->outstanding_after = upcie_nvme_qpair_outstanding(qp, &cid, 1);
	s->stop = 1;
	__threadfence_system();
}

__global__ void qpair_kernel(struct shared_state *s)
{
	if (threadIdx.x != 0)
		return;
	if (blockIdx.x == 0)
		drive(s);
	else
		respond(s);
}

int main(void)
{
	struct shared_state *s;
	void *sq, *cq, *tables;
	struct upcie_nvme_qpair_cfg cfg;
	int n = 0, fail = 0;

	if (cudaMallocManaged(&s, sizeof(*s)) != cudaSuccess ||
	    cudaMallocManaged(&sq, DEPTH * 64) != cudaSuccess ||
	    cudaMallocManaged(&cq, DEPTH * 16) != cudaSuccess ||
	    cudaMallocManaged(&tables, upcie_nvme_qpair_tables_size(DEPTH - 1)) != cudaSuccess) {
		printf("1..0 # SKIP no CUDA device\n");
		return 0;
	}
	memset(s, 0, sizeof(*s));
	memset(&cfg, 0, sizeof(cfg));
	cfg.sq = sq;
	cfg.cq = cq;
	cfg.sqdb = &s->sqdb;
	cfg.cqdb = &s->cqdb;
	cfg.sq_depth = DEPTH;
	cfg.qid = 1;
	cfg.tables = tables;
	if (upcie_nvme_qpair_init(&s->qp, &cfg)) {
		printf("not ok 1 - qpair init\n1..1\n");
		return 1;
	}
	qpair_kernel<<<2, 32>>>(s);
	if (cudaDeviceSynchronize() != cudaSuccess) {
		printf("not ok 1 - kernel failed\n1..1\n");
		return 1;
	}
#define T(cond, ...)                                                                               \
	do {                                                                                       \
		n++;                                                                               \
		fail += !(cond);                                                                   \
		printf("%s %d - ", (cond) ? "ok" : "not ok", n);                                   \
		printf(__VA_ARGS__);                                                               \
		printf("\n");                                                                      \
	} while (0)
	T(s->completed == TOTAL && s->mismatched == 0,
	  "GPU-driven queue pair: %llu of %u commands completed, %llu errors", s->completed, TOTAL,
	  s->mismatched);
	T(s->sync_ok, "submit_sync from device code");
	T(s->sync_timeout, "submit_sync times out on a dropped command (globaltimer deadline)");
	T(s->wait_timeout && s->cancel_ret == 0 && s->cancelled == 1 && s->outstanding_after == 0,
	  "wait timeout, cancel, exactly one -ECANCELED callback");
	printf("# %.1f ns per command at QD %d (one driver and one responder GPU thread, managed "
	       "memory, system-scope fences)\n",
	       (double)s->elapsed_ns / TOTAL, DEPTH - 1);
	printf("# inflight %u, free %u, cancelled %u, bad %llu, late %llu\n",
	       upcie_nvme_qpair_inflight(&s->qp), s->qp.nfree, s->qp.ncancelled,
	       (unsigned long long)s->qp.nbad, (unsigned long long)s->qp.nlate);
	printf("1..%d\n", n);
	fflush(stdout);
	/* No fini: the callbacks are device functions the host must not call. The tables are
	 * caller-provided, so there is nothing else to release. */
	cudaFree(tables);
	cudaFree(cq);
	cudaFree(sq);
	cudaFree(s);
	return fail ? 1 : 0;
}
