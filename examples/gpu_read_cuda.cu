// SPDX-License-Identifier: BSD-3-Clause
/*
 * gpu_read_cuda: NVMe reads straight into GPU memory, two ways, each checked by a kernel that
 * reads the data as ordinary code would.
 *
 *   gpu_read_cuda [--path uio|type1|iommufd] [--nsid N] [--lba L] [--queues Q] [--rounds R] BDF
 *   gpu_read_cuda --null [--queues Q] [--rounds R]
 *
 * 1. GPU-issued (gpuq/gqp_cuda.h): Q queue pairs whose SQ and CQ live in VRAM, each driven by one
 *    warp of a kernel. Every lane submits a 4 KiB Read into its own place of a VRAM buffer, the
 *    warp rings the doorbell, waits for the completion (upcie_nvme_gqp_wait), and then the lane
 *    compares the 4 KiB it read with plain loads: the reap that found the completion is the
 *    ordering point the header promises, so no fence of the user's is needed. R rounds of
 *    32 reads per queue, 32 in flight per queue.
 * 2. Completion mirror (gpuq/cqmirror_host_cuda.h): a CPU queue pair as usual, its Reads into
 *    VRAM, but the controller writes the completions into VRAM beside the data; a resident kernel
 *    of upcie copies them to the host CQ the CPU reaps. After reaping, the CPU launches a kernel
 *    that compares the data with plain loads: on a GPU that orders peer writes (checked when the
 *    mirror is attached) the payload is visible before its completion could have been copied.
 *    The same Q x 32 x R reads, up to 64 in flight.
 * Both compare with a reference copy in VRAM: the blocks as read by the CPU beforehand (a drive),
 * or the pattern the program put into the null controller's namespace (--null). The destination
 * is filled with a marker first, so data that never arrived cannot pass.
 *
 * With BDF, a real controller (root): taken as examples/nvme_driver.c does; only reads, from LBA L
 * (default 0) of namespace N (default 1; its blocks must divide 4 KiB, no metadata);
 * VRAM reached through the dmabuf_import module (package upcie-dmabuf-import-dkms), so device
 * addresses are bus addresses: the uio path, or an IOMMU in passthrough. The queues are created
 * by admin commands on the top queue identifiers.
 * With --null, no NVMe at all: the GPU null controller of upcie's tests (tests/gpu/nullctl.cuh, a
 * kernel that plays a controller with a namespace in VRAM) serves the same queues, with device
 * addresses = virtual addresses + an offset (the provider's OFFSET translation). Any CUDA GPU
 * of sm_90 that promises ordered peer writes (the H200 does); no root.
 *
 * Persistent kernels (the null controller, the mirror) never let the device go idle, so this
 * program loads every kernel at start (CUDA_MODULE_LOADING=EAGER), reserves its stack first, and
 * frees CUDA memory only after they have stopped: cudaFree() would wait for them forever.
 *
 * Build: nvcc -std=c++17 -O2 -arch=sm_90 -Iinclude examples/gpu_read_cuda.cu -o gpu_read_cuda
 *        -lcuda -lpthread
 */
#include <upcie/base/feature.h>

#include <cuda_runtime.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <upcie/base/clock.h>
#include <upcie/gpu/heap_cuda.h>
#include <upcie/gpuq/cqmirror_host_cuda.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/gpuq/gqp_cuda.h>
#include <upcie/gpuq/gqp_host_cuda.h>
#include <upcie/nvme/ns.h>
#include <upcie/nvme/qpair.h>

#include "../tests/gpu/nullctl.cuh"

#define BS	   4096u
#define MAXQ	   16u
#define DEPTH	   64u
#define MARKER	   0xa5
#define NULL_IOVA  (UINT64_C(1) << 56) /* --null: device address = virtual address + this */
#define TIMEOUT_NS (2 * UPCIE_NSEC_PER_SEC)

#define CK(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess) {                                                           \
			fprintf(stderr, "gpu_read_cuda: %s: %s\n", #call, cudaGetErrorString(e_)); \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

/* What both parts need from "a controller": the null one or a real one. */
struct target {
	bool null;
	struct upcie_gpu_cuda gpu;
	uint32_t nsid, lba_shift;
	uint64_t slba;
	cudaStream_t s; /* our copies and kernels */
	/* --null */
	struct nullctl nc, *nc_dev;
	volatile uint32_t *stop, *db; /* pinned, mapped: stop flag; doorbells, 2 per queue */
	uint32_t *stop_dev, *db_dev;
	uint8_t *ns;
	cudaStream_t s_ctl;
	uint8_t *marker; /* host: `bytes` of MARKER */
	/* a drive */
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ns ns_;
	struct upcie_nvme_ioq ioq[MAXQ]; /* the controller's side of each queue, by slot */
};

/* The doorbells of queue `qid` as the CPU (host) and GPU (dev) write them. */
static void doorbells(struct target *t, uint16_t qid, volatile uint32_t **sq_host,
		      volatile uint32_t **cq_host, uint32_t **sq_dev)
{
	if (t->null) {
		*sq_host = t->db + 2 * (qid - 1);
		*cq_host = *sq_host + 1;
		*sq_dev = t->db_dev + 2 * (qid - 1);
		return;
	}
	*sq_host = (volatile uint32_t *)(t->c.regs + upcie_nvme_sq_tdbl_off(qid, t->c.dstrd));
	*cq_host = (volatile uint32_t *)(t->c.regs + upcie_nvme_cq_hdbl_off(qid, t->c.dstrd));
	*sq_dev = NULL; /* gqp_create maps BAR0 for the GPU itself (UPCIE_NVME_GQP_DB_IOMEM) */
}

/* Tell the controller about queue `qid`: Create I/O CQ and SQ, or the null controller's table. */
static int queue_add(struct target *t, uint16_t qid, uint64_t sq_iova, uint64_t cq_iova)
{
	struct upcie_nvme_ioq_ext x;

	if (t->null) {
		struct nullctl_queue *q = &t->nc.q[qid - 1];

		memset(q, 0, sizeof(*q));
		q->sq = (const struct upcie_nvme_sqe *)(uintptr_t)(sq_iova - NULL_IOVA);
		q->cq = (struct upcie_nvme_cqe *)(uintptr_t)(cq_iova - NULL_IOVA);
		q->sqdb = t->db_dev + 2 * (qid - 1);
		q->cqdb = q->sqdb + 1;
		q->depth = DEPTH;
		q->qid = qid;
		q->phase = 1;
		t->db[2 * (qid - 1)] = t->db[2 * (qid - 1) + 1] = 0;
		if (qid > t->nc.nq)
			t->nc.nq = qid;
		return 0;
	}
	memset(&x, 0, sizeof(x));
	x.depth = DEPTH;
	x.sq_iova = sq_iova;
	x.cq_iova = cq_iova;
	x.qid = qid;
	return upcie_nvme_ioq_create_ext(&t->ioq[t->c.nqueues - qid], &t->c, &x);
}

/* The controller forgets the queue before its memory goes; false: it may still have it, the
 * memory stays. */
static bool queue_del(struct target *t, uint16_t qid)
{
	int err;

	if (t->null)
		return true; /* the null controller is stopped before any queue memory goes */
	err = upcie_nvme_ioq_delete(&t->ioq[t->c.nqueues - qid]);
	if (err == -EBUSY || err == -ENOMEM) {
		fprintf(stderr, "queue %u not deleted (%s): its memory is kept\n", qid,
			strerror(-err));
		return false;
	}
	return true;
}

static uint16_t qid_of(struct target *t, unsigned i)
{
	return (uint16_t)(t->null ? i + 1 : t->c.nqueues - i); /* top identifiers on a drive */
}

/*
 * Copies in and out on our stream, never cudaMemset or a synchronous cudaMemcpy: the copy engine
 * does them also while persistent kernels (the null controller, the mirror) hold their SMs.
 */
static void put(struct target *t, void *dev, const void *host, size_t n)
{
	CK(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, t->s));
	CK(cudaStreamSynchronize(t->s));
}

static void get(struct target *t, void *host, const void *dev, size_t n)
{
	CK(cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, t->s));
	CK(cudaStreamSynchronize(t->s));
}

static void ctl_start(struct target *t)
{
	if (!t->null)
		return;
	*t->stop = 0;
	CK(cudaMemcpyAsync(t->nc_dev, &t->nc, sizeof(t->nc), cudaMemcpyHostToDevice, t->s));
	CK(cudaStreamSynchronize(t->s));
	nullctl_kernel<<<t->nc.nq, 32, 0, t->s_ctl>>>(t->nc_dev);
	CK(cudaGetLastError());
}

static void ctl_stop(struct target *t)
{
	if (!t->null)
		return;
	*t->stop = 1;
	__sync_synchronize();
	CK(cudaStreamSynchronize(t->s_ctl));
	t->nc.nq = 0;
}

/* ---- part 1: GPU-issued reads ---- */

struct gq_args {
	struct upcie_nvme_gqp **qs;
	struct upcie_gpu_xlate x;
	uint8_t *dst;
	const uint8_t *ref;
	uint64_t slba;
	uint32_t nsid, lba_shift, rounds;
	unsigned long long *bad; /* device: [0] data mismatches, [1] failed commands */
};

__global__ void gq_kernel(struct gq_args a)
{
	uint32_t lane = threadIdx.x & 31, q = blockIdx.x;
	struct upcie_nvme_gqp_warp w;
	unsigned long long bad = 0, failed = 0;

	upcie_nvme_gqp_begin(&w, a.qs[q], false);
	for (uint32_t r = 0; r < a.rounds; r++) {
		uint64_t blk = ((uint64_t)r * gridDim.x + q) * 32 + lane; /* 4 KiB block index */
		uint8_t *dst = a.dst + blk * BS;
		struct upcie_nvme_sqe sqe;
		struct upcie_nvme_cqe cqe;
		uint16_t cid = UPCIE_NVME_GQP_CID_NONE;
		int e, we;

		upcie_nvme_cmd_read(&sqe, a.nsid, a.slba + (blk * BS >> a.lba_shift),
				    BS >> a.lba_shift, 0);
		/* all 32 lanes at once (a queue of DEPTH 64 has room), one doorbell write */
		e = upcie_nvme_gqp_enqueue_data(&w, &sqe, &a.x, dst, BS, &cid);
		upcie_nvme_gqp_ring(&w);
		/* collective calls: every lane takes part, those without a command with CID_NONE */
		we = upcie_nvme_gqp_wait(&w, e ? (uint16_t)UPCIE_NVME_GQP_CID_NONE : cid,
					 TIMEOUT_NS, &cqe);
		upcie_nvme_gqp_cancel(
		    &w, !e && we == -ETIMEDOUT ? cid : (uint16_t)UPCIE_NVME_GQP_CID_NONE);
		if (e || we || !upcie_nvme_cqe_ok(&cqe)) {
			failed++;
		} else {
			/* the data, with plain loads, right after the completion */
			const uint4 *d = (const uint4 *)dst, *f = (const uint4 *)(a.ref + blk * BS);

			for (uint32_t i = 0; i < BS / 16; i++)
				bad += d[i].x != f[i].x || d[i].y != f[i].y || d[i].z != f[i].z ||
				       d[i].w != f[i].w;
		}
	}
	upcie_nvme_gqp_end(&w);
	if (bad)
		atomicAdd(&a.bad[0], bad);
	if (failed)
		atomicAdd(&a.bad[1], failed);
}

static int part_gqp(struct target *t, unsigned nq, uint32_t rounds, uint8_t *dst,
		    const uint8_t *ref, unsigned long long *bad, unsigned long long *bad_dev)
{
	struct upcie_nvme_gqp_host gq[MAXQ];
	struct upcie_nvme_gqp *dq[MAXQ], **qs;
	uint64_t bytes = (uint64_t)nq * 32 * rounds * BS, t0;
	unsigned made = 0;
	struct gq_args a;
	int err = 0;

	memset(&a, 0, sizeof(a));
	CK(cudaMalloc(&qs, sizeof(dq)));
	err = upcie_gpu_cuda_xlate_create(&t->gpu, dst, &a.x);
	for (unsigned i = 0; i < nq && !err; i++) {
		struct upcie_nvme_gqp_cfg cfg;
		volatile uint32_t *sqh, *cqh;
		uint32_t *sqd;
		uint16_t qid = qid_of(t, i);

		doorbells(t, qid, &sqh, &cqh, &sqd);
		memset(&cfg, 0, sizeof(cfg));
		cfg.qid = qid;
		cfg.depth = DEPTH;
		cfg.flags = t->null ? 0 : UPCIE_NVME_GQP_DB_IOMEM;
		cfg.sqdb = t->null ? (volatile uint32_t *)sqd : sqh;
		cfg.cqdb = t->null ? (volatile uint32_t *)(sqd + 1) : cqh;
		err = upcie_nvme_gqp_create(&gq[i], &t->gpu, &cfg);
		if (err)
			break;
		err = queue_add(t, qid, gq[i].sq_iova, gq[i].cq_iova);
		if (err) {
			upcie_nvme_gqp_destroy(&gq[i]);
			break;
		}
		dq[i] = gq[i].dq;
		made++;
	}
	if (!err) {
		put(t, qs, dq, nq * sizeof(dq[0]));
		put(t, dst, t->marker, bytes);
		bad[0] = bad[1] = 0;
		put(t, bad_dev, bad, 2 * sizeof(*bad));
		a.qs = qs;
		a.dst = dst;
		a.ref = ref;
		a.slba = t->slba;
		a.nsid = t->nsid;
		a.lba_shift = t->lba_shift;
		a.rounds = rounds;
		a.bad = bad_dev;
		ctl_start(t);
		t0 = upcie_time_ns();
		gq_kernel<<<nq, 32, 0, t->s>>>(a);
		CK(cudaGetLastError());
		CK(cudaStreamSynchronize(t->s));
		t0 = upcie_time_ns() - t0;
		ctl_stop(t);
		get(t, bad, bad_dev, 2 * sizeof(*bad));
		printf("GPU-issued: %u queues x 32 lanes x %u rounds of 4 KiB Reads into VRAM "
		       "(%.1f ms): %llu failed commands, %llu of %" PRIu64
		       " 16-byte chunks differ\n",
		       nq, rounds, (double)t0 / 1e6, bad[1], bad[0], bytes / 16);
		if (bad[0] || bad[1])
			err = -EIO;
	}
	for (unsigned i = 0; i < made; i++)
		if (queue_del(t, qid_of(t, i)))
			upcie_nvme_gqp_destroy(&gq[i]);
	upcie_gpu_cuda_xlate_destroy(&t->gpu, &a.x);
	CK(cudaFree(qs));
	return err;
}

/* ---- part 2: CPU queue pairs, completions mirrored out of VRAM ---- */

__global__ void check_kernel(const uint8_t *dst, const uint8_t *ref, uint64_t bytes,
			     unsigned long long *bad)
{
	const uint4 *d = (const uint4 *)dst, *f = (const uint4 *)ref;
	unsigned long long n = 0;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes / 16;
	     i += (uint64_t)gridDim.x * blockDim.x)
		n += d[i].x != f[i].x || d[i].y != f[i].y || d[i].z != f[i].z || d[i].w != f[i].w;
	if (n)
		atomicAdd(bad, n);
}

struct mq {
	struct upcie_nvme_cqmirror_cq m;
	struct upcie_heap_buf sq;
	struct upcie_nvme_qpair qp;
	unsigned long long done, failed;
};

static void on_cpl(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct mq *q = (struct mq *)ctx;

	q->done++;
	if (err || !upcie_nvme_cqe_ok(cqe))
		q->failed++;
}

static int part_mirror(struct target *t, unsigned nq, uint32_t rounds, uint8_t *dst,
		       const uint8_t *ref, unsigned long long *bad, unsigned long long *bad_dev)
{
	static struct mq q[MAXQ];
	uint64_t per_q = (uint64_t)32 * rounds, bytes = nq * per_q * BS, t0;
	unsigned made = 0;
	bool gone[MAXQ];
	unsigned long long failed = 0;
	int err = 0;

	put(t, dst, t->marker, bytes); /* before the mirror's kernel runs */
	for (unsigned i = 0; i < nq && !err; i++) {
		struct upcie_nvme_qpair_cfg cfg;
		volatile uint32_t *sqh, *cqh;
		uint32_t *sqd;
		uint16_t qid = qid_of(t, i);

		memset(&q[i], 0, sizeof(q[i]));
		err = upcie_nvme_cqmirror_attach(&q[i].m, &t->gpu, DEPTH);
		if (err)
			break;
		err = upcie_gpu_cuda_host_alloc(&t->gpu, DEPTH * 64, 4096, &q[i].sq);
		if (!err) {
			doorbells(t, qid, &sqh, &cqh, &sqd);
			memset(&cfg, 0, sizeof(cfg));
			cfg.sq = q[i].sq.vaddr;
			cfg.cq = q[i].m.host_cq; /* the CPU reaps the host copy */
			cfg.sqdb = sqh;
			cfg.cqdb = cqh;
			cfg.sq_depth = DEPTH;
			cfg.qid = qid;
			err = upcie_nvme_qpair_init(&q[i].qp, &cfg);
			if (err)
				upcie_gpu_cuda_host_free(&t->gpu, &q[i].sq);
		}
		/* the controller writes its completions into VRAM: dev_cq_iova */
		if (!err) {
			err = queue_add(t, qid, q[i].sq.iova, q[i].m.dev_cq_iova);
			if (err) {
				upcie_nvme_qpair_fini(&q[i].qp);
				upcie_gpu_cuda_host_free(&t->gpu, &q[i].sq);
			}
		}
		if (err) {
			upcie_nvme_cqmirror_detach(&q[i].m);
			break;
		}
		made++;
	}
	if (!err) {
		ctl_start(t);
		t0 = upcie_time_ns();
		/* One thread drives every queue here; each queue still has one owner. */
		uint64_t next[MAXQ] = { 0 }, left = nq * per_q;

		while (left && !err) {
			for (unsigned i = 0; i < nq && !err; i++) {
				int n;

				while (next[i] < per_q &&
				       upcie_nvme_qpair_inflight(&q[i].qp) < 32) {
					uint64_t blk = next[i] * nq + i, iova;
					struct upcie_nvme_sqe sqe;

					err = upcie_gpu_cuda_iova(&t->gpu, dst + blk * BS, &iova);
					if (err)
						break;
					upcie_nvme_cmd_read(&sqe, t->nsid,
							    t->slba + (blk * BS >> t->lba_shift),
							    BS >> t->lba_shift, 0);
					sqe.prp1 = iova; /* 4 KiB, page aligned: PRP1 alone */
					if (upcie_nvme_qpair_enqueue(&q[i].qp, &sqe, on_cpl, &q[i],
								     NULL))
						break;
					next[i]++;
				}
				upcie_nvme_qpair_ring(&q[i].qp);
				n = upcie_nvme_qpair_reap(&q[i].qp, 64);
				if (n < 0)
					err = n;
				else
					left -= (unsigned)n;
			}
			if (upcie_time_ns() - t0 > 10 * UPCIE_NSEC_PER_SEC) {
				fprintf(stderr,
					"gpu_read_cuda: mirrored reads not done after 10 s\n");
				err = -ETIMEDOUT;
			}
		}
		/* Every completion reaped: now GPU work may read the data, with plain loads. */
		bad[0] = 0;
		put(t, bad_dev, bad, sizeof(*bad));
		check_kernel<<<64, 256, 0, t->s>>>(dst, ref, bytes, bad_dev);
		CK(cudaGetLastError());
		CK(cudaStreamSynchronize(t->s));
		get(t, bad, bad_dev, sizeof(*bad));
		t0 = upcie_time_ns() - t0;
		for (unsigned i = 0; i < nq; i++)
			failed += q[i].failed;
		printf("mirrored: %u CPU queue pairs, completions written into VRAM and mirrored, "
		       "%" PRIu64 " 4 KiB Reads into VRAM (%.1f ms): %llu failed commands, %llu of "
		       "%" PRIu64 " 16-byte chunks differ\n",
		       nq, nq * per_q, (double)t0 / 1e6, failed, bad[0], bytes / 16);
		if (!err && (failed || bad[0]))
			err = -EIO;
	}
	/* the controller drops the queue first; what is still outstanding ends cancelled */
	for (unsigned i = 0; i < made; i++)
		gone[i] = queue_del(t, qid_of(t, i));
	ctl_stop(t);
	for (unsigned i = 0; i < made; i++) {
		upcie_nvme_qpair_fini(&q[i].qp);
		if (!gone[i])
			continue;
		upcie_gpu_cuda_host_free(&t->gpu, &q[i].sq);
		upcie_nvme_cqmirror_detach(&q[i].m);
	}
	return err;
}

/* ---- setup ---- */

static void pattern(uint8_t *p, uint64_t len, uint64_t pos)
{
	for (uint64_t i = 0; i < len; i++)
		p[i] = (uint8_t)(((pos + i) * 0x9e3779b97f4a7c15ull) >> 56);
}

/* The reference: what the region holds, in VRAM at `ref`. */
static int reference(struct target *t, uint8_t *ref, uint64_t bytes)
{
	struct upcie_nvme_ioq q;
	struct upcie_dmamem mem;
	int err;

	if (t->null) {
		uint8_t *h = (uint8_t *)malloc(bytes);

		if (!h)
			return -ENOMEM;
		pattern(h, bytes, t->slba << t->lba_shift);
		CK(cudaMemcpyAsync(t->ns + (t->slba << t->lba_shift), h, bytes,
				   cudaMemcpyHostToDevice, t->s));
		CK(cudaMemcpyAsync(ref, h, bytes, cudaMemcpyHostToDevice, t->s));
		CK(cudaStreamSynchronize(t->s));
		free(h);
		return 0;
	}
	/* a drive: read the blocks with an ordinary CPU queue into host memory first */
	err = upcie_nvme_dev_dmamem(&t->c.dev, bytes, &mem);
	if (err)
		return err;
	err = upcie_nvme_ioq_create(&q, &t->c, NULL);
	if (!err) {
		err = upcie_nvme_ioq_read_sync(&q, &t->ns_, t->slba, &mem, 0, bytes, NULL);
		upcie_nvme_ioq_delete(&q);
	}
	if (!err) {
		CK(cudaMemcpyAsync(ref, mem.vaddr, bytes, cudaMemcpyHostToDevice, t->s));
		CK(cudaStreamSynchronize(t->s));
	}
	upcie_dmamem_destroy(&mem);
	return err;
}

int main(int argc, char **argv)
{
	static struct target t;
	struct upcie_nvme_ctrl_opts co;
	struct upcie_gpu_cuda_opts go;
	struct upcie_pci_bdf bdf;
	struct upcie_heap_buf dbuf, rbuf;
	const char *bdf_s = NULL;
	static unsigned long long bad[2];
	unsigned long long *bad_dev;
	unsigned nq = 4;
	uint32_t rounds = 8;
	uint64_t bytes;
	int err, e2;

	/* before the first CUDA call: every kernel loaded now, none at a first launch later */
	setenv("CUDA_MODULE_LOADING", "EAGER", 1);
	memset(&co, 0, sizeof(co));
	t.nsid = 1;
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(argv[i], "--null"))
			t.null = true;
		else if (!strcmp(argv[i], "--path") && v && !upcie_nvme_path_parse(v, &co.dev.path))
			i++;
		else if (!strcmp(argv[i], "--nsid") && v)
			t.nsid = (uint32_t)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--lba") && v)
			t.slba = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--queues") && v)
			nq = (unsigned)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--rounds") && v)
			rounds = (uint32_t)strtoul(argv[++i], NULL, 0);
		else if (argv[i][0] != '-' && !bdf_s)
			bdf_s = argv[i];
		else
			nq = 0, i = argc;
	}
	if (t.null == !!bdf_s || (bdf_s && upcie_pci_bdf_parse(bdf_s, &bdf)) || !nq || nq > MAXQ ||
	    !rounds || rounds > 1024) {
		fprintf(stderr,
			"usage: gpu_read_cuda [--path uio|type1|iommufd] [--nsid N] [--lba L] "
			"[--queues 1..16] [--rounds 1..1024] BDF\n"
			"       gpu_read_cuda --null [--queues 1..16] [--rounds 1..1024]\n");
		return 2;
	}
	bytes = (uint64_t)nq * 32 * rounds * BS;
	t.marker = (uint8_t *)malloc(bytes);
	if (!t.marker)
		return 1;
	memset(t.marker, MARKER, bytes);

	/* 1. the controller, real or null */
	memset(&go, 0, sizeof(go));
	go.device_heap_size = 2 * bytes + (64 << 20);
	go.host_heap_size = 64 << 20;
	if (t.null) {
		t.slba = 0;
		go.xlate = UPCIE_GPU_CUDA_XLATE_OFFSET;
		go.iova_offset = NULL_IOVA;
		t.lba_shift = 12;
	} else {
		co.dev.bind = true;
		err = upcie_nvme_ctrl_open(&t.c, &bdf, &co);
		if (err) {
			fprintf(stderr, "gpu_read_cuda: cannot bring up %s: %s\n", bdf_s,
				strerror(-err));
			return 1;
		}
		err = upcie_nvme_ns_open(&t.ns_, &t.c, t.nsid);
		if (!err &&
		    (BS % t.ns_.lba_bytes || t.ns_.ms || t.ns_.zoned || t.slba > t.ns_.nsze ||
		     bytes / t.ns_.lba_bytes > t.ns_.nsze - t.slba)) {
			fprintf(stderr,
				"gpu_read_cuda: namespace %u: needs blocks dividing 4 KiB, no "
				"metadata, not zoned, and %" PRIu64 " bytes from LBA %" PRIu64 "\n",
				t.nsid, bytes, t.slba);
			err = -EINVAL;
		}
		if (!err && t.c.nqueues < nq) {
			fprintf(stderr, "gpu_read_cuda: %u I/O queues granted, %u asked\n",
				t.c.nqueues, nq);
			err = -EINVAL;
		}
		if (err) {
			upcie_nvme_ctrl_close(&t.c);
			return 1;
		}
		t.lba_shift = (uint32_t)__builtin_ctz(t.ns_.lba_bytes);
		printf("%s on the %s path: %s, namespace %u\n", t.c.name,
		       upcie_nvme_path_name(t.c.dev.path), t.c.mn, t.nsid);
	}
	err = upcie_gpu_cuda_open(&t.gpu, &go);
	if (err) {
		fprintf(stderr, "gpu_read_cuda: GPU provider: %s%s\n", strerror(-err),
			t.null ? "" : " (a drive needs the dmabuf_import module)");
		if (!t.null)
			upcie_nvme_ctrl_close(&t.c);
		return 1;
	}
	/* before any persistent kernel: a later launch growing it would wait for them forever */
	CK(cudaDeviceSetLimit(cudaLimitStackSize, 4096));
	CK(cudaStreamCreateWithFlags(&t.s, cudaStreamNonBlocking));
	CK(cudaMalloc(&bad_dev, sizeof(bad)));
	if (t.null) {
		CK(cudaStreamCreateWithFlags(&t.s_ctl, cudaStreamNonBlocking));
		CK(cudaMalloc(&t.nc_dev, sizeof(t.nc)));
		CK(cudaMalloc(&t.ns, bytes));
		CK(cudaHostAlloc((void **)&t.stop, 4096, cudaHostAllocMapped));
		CK(cudaHostGetDevicePointer((void **)&t.stop_dev, (void *)t.stop, 0));
		CK(cudaHostAlloc((void **)&t.db, 4096, cudaHostAllocMapped));
		CK(cudaHostGetDevicePointer((void **)&t.db_dev, (void *)t.db, 0));
		t.nc.stop = t.stop_dev;
		t.nc.iova_offset = NULL_IOVA;
		t.nc.ns = t.ns;
		t.nc.ns_bytes = bytes;
		t.nc.lba_shift = t.lba_shift;
		printf("GPU null controller: a %" PRIu64 " KiB namespace of 4 KiB blocks in VRAM\n",
		       bytes >> 10);
	}

	/* 2. destination and reference in the device heap (what the controller can reach) */
	err = upcie_gpu_cuda_alloc(&t.gpu, bytes, 65536, &dbuf);
	if (!err)
		err = upcie_gpu_cuda_alloc(&t.gpu, bytes, 65536, &rbuf);
	if (!err)
		err = reference(&t, (uint8_t *)rbuf.vaddr, bytes);

	/* 3. the two ways */
	if (!err)
		err = part_gqp(&t, nq, rounds, (uint8_t *)dbuf.vaddr, (const uint8_t *)rbuf.vaddr,
			       bad, bad_dev);
	e2 = part_mirror(&t, nq, rounds, (uint8_t *)dbuf.vaddr, (const uint8_t *)rbuf.vaddr, bad,
			 bad_dev);
	if (!err)
		err = e2;

	/* 4. nothing persistent runs any more: memory can go */
	if (t.null) {
		cudaFree(t.ns);
		cudaFree(t.nc_dev);
		cudaFreeHost((void *)t.stop);
		cudaFreeHost((void *)t.db);
		cudaStreamDestroy(t.s_ctl);
	}
	cudaFree(bad_dev);
	free(t.marker);
	cudaStreamDestroy(t.s);
	upcie_gpu_cuda_close(&t.gpu);
	if (!t.null)
		upcie_nvme_ctrl_close(&t.c);
	printf("%s\n", err ? "FAILED" : "both ways verified");
	return err ? 1 : 0;
}
