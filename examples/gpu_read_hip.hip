// SPDX-License-Identifier: BSD-3-Clause
/*
 * gpu_read_hip: NVMe reads straight into memory that AMD GPU code then reads, two ways, each
 * checked by a kernel that reads the data as ordinary code would. The HIP counterpart of
 * examples/gpu_read_cuda.cu.
 *
 *   gpu_read_hip [--path uio|type1|iommufd] [--nsid N] [--lba L] [--queues Q] [--rounds R]
 *                [--direct] [--payload host|fine|uncached] BDF
 *
 * 1. GPU-issued (gpuq/gqp_hip.h): Q queue pairs driven by GPU threads, one thread per queue pair
 *    (the queue-pair core of nvme/qpair.h compiled for the GPU: one owner, as on the CPU). Each
 *    thread keeps 32 Reads of 4 KiB in flight into its part of the payload buffer, R rounds,
 *    reaps them, then compares what arrived with plain vector loads, ordered after the
 *    completion by reap's acquire. The queue kind decides where the payload may be, because the
 *    controller's data write and its completion must land in one destination for the completion
 *    to vouch for the data:
 *    - bridged (default; GPUs whose runtime cannot map a peer's BAR, consumer RDNA): the CQ is in
 *      host memory, a host thread relays doorbells and completions, and the payload is host
 *      memory (the provider's host heap, which the GPU reads through its mapping);
 *    - --direct (the controller's doorbells mapped for the GPU, the CQ in device memory: CDNA,
 *      e.g. gfx90a): the payload is VRAM from the provider's device heap, opened fine-grained
 *      (--payload uncached: uncached), never plain hipMalloc memory, whose lines the acquire
 *      leaves in the GPU's L2.
 *    --payload host|fine|uncached overrides the choice; every block's device address comes from
 *    upcie_nvme_gqp_hip_data_iova() for the queue that reads into it, so a payload that does
 *    not fit the queue (VRAM on a bridged queue, host memory on a direct one: -EXDEV; memory the
 *    runtime does not report as fine-grained or uncached: -EOPNOTSUPP) is refused before the
 *    queue exists on the controller, and the example stops saying why. It never opts out of the
 *    check (UPCIE_NVME_GQP_HIP_HOST_DATA, _VRAM_DATA).
 * 2. Completion mirror (gpuq/cqmirror_host_hip.h): a CPU queue pair whose completions the
 *    controller writes into VRAM beside the data, a VRAM payload from the same device heap
 *    (checked with upcie_gpu_hip_payload_check()); a resident kernel copies the completions to the
 *    host CQ the CPU reaps, and after reaping the CPU launches a kernel that compares the data.
 * Both compare with the same blocks read beforehand by the CPU into host memory, copied to VRAM;
 * the destination is filled with a marker first, so data that never arrived cannot pass. Only
 * reads: the namespace is not changed.
 *
 * The controller is taken as examples/nvme_driver.c does (root); the queues are created by admin
 * commands on the top queue identifiers. VRAM is reached through the dmabuf_import module
 * (package upcie-dmabuf-import-dkms): device addresses are bus addresses, so the uio path or an
 * IOMMU in passthrough. Free device memory only after the mirror's kernel has exited: hipFree()
 * waits for the device to go idle.
 *
 * Build: hipcc -std=c++17 -O2 --offload-arch=gfx90a -Iinclude examples/gpu_read_hip.hip
 *        -o gpu_read_hip -lpthread
 */
#include <upcie/base/feature.h>

#include <hip/hip_runtime.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/clock.h>
#include <upcie/gpu/heap_hip.h>
#include <upcie/gpuq/cqmirror_host_hip.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/gpuq/gqp_hip.h>
#include <upcie/gpuq/gqp_host_hip.h>
#include <upcie/nvme/ns.h>
#include <upcie/nvme/qpair.h>

#define BS	   4096u
#define MAXQ	   16u
#define DEPTH	   64u
#define QD	   32u
#define MARKER	   0xa5
#define TIMEOUT_NS (2 * UPCIE_NSEC_PER_SEC)

#define CK(call)                                                                                   \
	do {                                                                                       \
		hipError_t e_ = (call);                                                            \
		if (e_ != hipSuccess) {                                                            \
			fprintf(stderr, "gpu_read_hip: %s: %s\n", #call, hipGetErrorString(e_));   \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

struct target {
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ns ns;
	struct upcie_gpu_hip gpu;
	uint64_t slba;
	uint32_t lba_shift;
	hipStream_t s;
	uint8_t *marker; /* host: `bytes` of MARKER */
	unsigned long long *bad_dev;
	struct upcie_nvme_ioq ioq[MAXQ]; /* the controller's side of each queue, by slot */
};

/* Copies in and out on our stream (hipFree and device-wide waits would wait for the mirror). */
static void put(struct target *t, void *dev, const void *host, size_t n)
{
	CK(hipMemcpyAsync(dev, host, n, hipMemcpyHostToDevice, t->s));
	CK(hipStreamSynchronize(t->s));
}

static void get(struct target *t, void *host, const void *dev, size_t n)
{
	CK(hipMemcpyAsync(host, dev, n, hipMemcpyDeviceToHost, t->s));
	CK(hipStreamSynchronize(t->s));
}

static volatile uint32_t *db(struct target *t, uint16_t qid, bool cq)
{
	return (volatile uint32_t *)(t->c.regs + (cq ? upcie_nvme_cq_hdbl_off(qid, t->c.dstrd)
						     : upcie_nvme_sq_tdbl_off(qid, t->c.dstrd)));
}

static uint16_t qid_of(struct target *t, unsigned i)
{
	return (uint16_t)(t->c.nqueues - i);
}

/* Create I/O CQ, then SQ; on failure nothing stays created. */
static int queue_add(struct target *t, uint16_t qid, uint64_t sq_iova, uint64_t cq_iova)
{
	struct upcie_nvme_ioq_ext x;

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

	err = upcie_nvme_ioq_delete(&t->ioq[t->c.nqueues - qid]);
	if (err == -EBUSY || err == -ENOMEM) {
		fprintf(stderr, "queue %u not deleted (%s): its memory is kept\n", qid,
			strerror(-err));
		return false;
	}
	return true;
}

/* ---- part 1: GPU-issued reads, one thread per queue pair ---- */

struct gq_args {
	struct upcie_nvme_gqp_hip **qs;
	const uint64_t *iova; /* device address of each 4 KiB block of dst */
	uint8_t *dst;
	const uint8_t *ref;
	struct upcie_nvme_gqp_hip_cpl *cpl; /* QD per queue */
	uint64_t slba;
	uint32_t nsid, lba_shift, per_q, nq;
	unsigned long long *bad; /* device: [0] data mismatches, [1] failed commands */
};

__global__ void gq_kernel(struct gq_args a)
{
	/* the builtins, not blockIdx/threadIdx, which ROCm 5.2 implements in its device library */
	uint32_t q = __builtin_amdgcn_workgroup_id_x(), nq = a.nq;
	struct upcie_nvme_gqp_hip *qp = a.qs[q];
	struct upcie_nvme_gqp_hip_cpl *cpl = a.cpl + (size_t)q * QD;
	unsigned long long bad = 0, failed = 0;

	if (__builtin_amdgcn_workitem_id_x())
		return; /* the queue pair's one owner */
	for (uint32_t done = 0; done < a.per_q; done += QD) {
		uint32_t n = a.per_q - done < QD ? a.per_q - done : QD, sent = 0;

		for (uint32_t k = 0; k < n; k++) {
			uint64_t blk = (uint64_t)(done + k) * nq + q;
			struct upcie_nvme_sqe sqe;

			upcie_nvme_cmd_read(&sqe, a.nsid, a.slba + (blk * BS >> a.lba_shift),
					    BS >> a.lba_shift, 0);
			sqe.prp1 = a.iova[blk]; /* 4 KiB, page aligned: PRP1 alone */
			if (upcie_nvme_gqp_hip_enqueue(qp, &sqe, &cpl[k], NULL))
				break;
			sent++;
		}
		upcie_nvme_gqp_hip_ring(qp);
		if (upcie_nvme_gqp_hip_drain(qp, TIMEOUT_NS)) {
			failed += n; /* not all ended: stop here, the host tears down */
			break;
		}
		failed += n - sent;
		for (uint32_t k = 0; k < sent; k++) {
			uint64_t blk = (uint64_t)(done + k) * nq + q;
			const uint4 *d = (const uint4 *)(a.dst + blk * BS);
			const uint4 *f = (const uint4 *)(a.ref + blk * BS);

			if (cpl[k].err || !upcie_nvme_cqe_ok(&cpl[k].cqe)) {
				failed++;
				continue;
			}
			/* the data, with plain loads, after the reap that found its completion */
			for (uint32_t i = 0; i < BS / 16; i++)
				bad += d[i].x != f[i].x || d[i].y != f[i].y || d[i].z != f[i].z ||
				       d[i].w != f[i].w;
		}
	}
	if (bad)
		atomicAdd(&a.bad[0], bad);
	if (failed)
		atomicAdd(&a.bad[1], failed);
}

/* The payload of part 1: where the provider knows it (`addr`: the CPU address of host memory,
 * the GPU address of VRAM) and what kernels load (`dev`). */
struct payload {
	uint8_t *addr;
	uint8_t *dev;
	bool host;
	const char *what;
};

/* Why queue `qid` refused the payload, in the terms of the choices on the command line. */
static void refused(uint16_t qid, bool direct, const struct payload *pl, int err)
{
	fprintf(stderr, "gpu_read_hip: %s queue %u refuses a payload in %s: %s\n",
		direct ? "direct" : "bridged", qid, pl->what, strerror(-err));
	if (err == -EXDEV)
		fprintf(stderr, "gpu_read_hip: %s\n",
			direct
			    ? "a direct queue completes into VRAM: its payloads are fine-grained "
			      "or uncached VRAM (--payload fine|uncached)"
			    : "a bridged queue completes into host memory: its payloads are host "
			      "memory (--payload host); VRAM payloads need --direct");
	else if (err == -EOPNOTSUPP)
		fprintf(stderr, "gpu_read_hip: the runtime does not report this memory as "
				"fine-grained or uncached VRAM, which GPU code must read payloads "
				"from\n");
}

static int part_gqp(struct target *t, unsigned nq, uint32_t per_q, bool direct,
		    const struct payload *pl, const uint8_t *ref, unsigned long long *bad)
{
	static struct upcie_nvme_gqp_hip_host gq[MAXQ];
	struct upcie_nvme_gqp_hip *dq[MAXQ], **qs = NULL;
	struct upcie_nvme_gqp_hip_cpl *cpl = NULL;
	uint64_t bytes = (uint64_t)nq * per_q * BS, nblk = bytes / BS, t0;
	uint64_t *iova_h, *iova_d = NULL;
	unsigned made = 0;
	struct gq_args a;
	int err = 0;

	iova_h = (uint64_t *)calloc(nblk, sizeof(*iova_h));
	if (!iova_h)
		return -ENOMEM;
	CK(hipMalloc((void **)&qs, sizeof(dq)));
	CK(hipMalloc((void **)&cpl, (size_t)MAXQ * QD * sizeof(*cpl)));
	CK(hipMalloc((void **)&iova_d, nblk * sizeof(*iova_d)));
	for (unsigned i = 0; i < nq && !err; i++) {
		struct upcie_nvme_gqp_hip_cfg cfg;
		uint16_t qid = qid_of(t, i);

		memset(&cfg, 0, sizeof(cfg));
		cfg.qid = qid;
		cfg.depth = DEPTH;
		cfg.flags = direct ? UPCIE_NVME_GQP_HIP_DIRECT : 0;
		cfg.sqdb = db(t, qid, false);
		cfg.cqdb = db(t, qid, true);
		err = upcie_nvme_gqp_hip_create(&gq[i], &t->gpu, &cfg);
		if (err)
			break;
		/* The blocks this queue reads into (the kernel's blk % nq == i), each placed against
		 * the queue's rules where its PRP is set up; then the controller's side. */
		for (uint64_t b = i; !err && b < nblk; b += nq)
			err =
			    upcie_nvme_gqp_hip_data_iova(&gq[i], pl->addr + b * BS, BS, &iova_h[b]);
		if (err)
			refused(qid, direct, pl, err);
		else
			err = queue_add(t, qid, gq[i].sq_iova, gq[i].cq_iova);
		if (err) {
			upcie_nvme_gqp_hip_destroy(&gq[i]);
			break;
		}
		dq[i] = gq[i].dq;
		made++;
	}
	if (!err) {
		put(t, iova_d, iova_h, nblk * sizeof(*iova_d));
		put(t, qs, dq, nq * sizeof(dq[0]));
		if (pl->host)
			memset(pl->addr, MARKER, bytes); /* before the kernel runs */
		else
			put(t, pl->dev, t->marker, bytes);
		bad[0] = bad[1] = 0;
		put(t, t->bad_dev, bad, 2 * sizeof(*bad));
		memset(&a, 0, sizeof(a));
		a.qs = qs;
		a.iova = iova_d;
		a.dst = pl->dev;
		a.ref = ref;
		a.cpl = cpl;
		a.slba = t->slba;
		a.nsid = t->ns.nsid;
		a.lba_shift = t->lba_shift;
		a.per_q = per_q;
		a.nq = nq;
		a.bad = t->bad_dev;
		t0 = upcie_time_ns();
		hipLaunchKernelGGL(gq_kernel, dim3(nq), dim3(1), 0, t->s, a);
		CK(hipGetLastError());
		CK(hipStreamSynchronize(t->s));
		get(t, bad, t->bad_dev, 2 * sizeof(*bad));
		printf("GPU-issued (%s): %u queue pairs, %" PRIu64 " 4 KiB Reads into %s "
		       "(%.1f ms): %llu failed commands, %llu of %" PRIu64
		       " 16-byte chunks differ\n",
		       direct ? "direct" : "bridged", nq, (uint64_t)nq * per_q, pl->what,
		       (double)(upcie_time_ns() - t0) / 1e6, bad[1], bad[0], bytes / 16);
		if (bad[0] || bad[1])
			err = -EIO;
	}
	for (unsigned i = 0; i < made; i++)
		if (queue_del(t, qid_of(t, i)))
			upcie_nvme_gqp_hip_destroy(&gq[i]);
	CK(hipFree(iova_d));
	CK(hipFree(cpl));
	CK(hipFree(qs));
	free(iova_h);
	return err;
}

/* ---- part 2: CPU queue pairs, completions mirrored out of VRAM ---- */

#define CHECK_BLOCKS  64u
#define CHECK_THREADS 256u

__global__ void check_kernel(const uint8_t *dst, const uint8_t *ref, uint64_t bytes,
			     unsigned long long *bad)
{
	const uint4 *d = (const uint4 *)dst, *f = (const uint4 *)ref;
	unsigned long long n = 0;

	for (uint64_t i = (uint64_t)__builtin_amdgcn_workgroup_id_x() * CHECK_THREADS +
			  __builtin_amdgcn_workitem_id_x();
	     i < bytes / 16; i += (uint64_t)CHECK_BLOCKS * CHECK_THREADS)
		n += d[i].x != f[i].x || d[i].y != f[i].y || d[i].z != f[i].z || d[i].w != f[i].w;
	if (n)
		atomicAdd(bad, n);
}

struct mq {
	struct upcie_nvme_cqmirror_hip_cq m;
	struct upcie_heap_buf sq;
	struct upcie_nvme_qpair qp;
	unsigned long long failed;
};

static void on_cpl(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct mq *q = (struct mq *)ctx;

	if (err || !upcie_nvme_cqe_ok(cqe))
		q->failed++;
}

static int part_mirror(struct target *t, unsigned nq, uint32_t per_q, uint8_t *dst,
		       const uint8_t *ref, const uint64_t *iova_h, unsigned long long *bad)
{
	static struct mq q[MAXQ];
	uint64_t bytes = (uint64_t)nq * per_q * BS, t0, next[MAXQ] = { 0 }, left = nq * per_q;
	unsigned long long failed = 0;
	unsigned made = 0;
	int err = 0;

	put(t, dst, t->marker, bytes); /* before the mirror's kernel runs */
	for (unsigned i = 0; i < nq && !err; i++) {
		struct upcie_nvme_qpair_cfg cfg;
		uint16_t qid = qid_of(t, i);

		memset(&q[i], 0, sizeof(q[i]));
		err = upcie_nvme_cqmirror_hip_attach(&q[i].m, &t->gpu, DEPTH);
		if (err)
			break;
		err = upcie_gpu_hip_host_alloc(&t->gpu, DEPTH * 64, 4096, &q[i].sq);
		if (!err) {
			memset(&cfg, 0, sizeof(cfg));
			cfg.sq = q[i].sq.vaddr;
			cfg.cq = q[i].m.host_cq; /* the CPU reaps the host copy */
			cfg.sqdb = db(t, qid, false);
			cfg.cqdb = db(t, qid, true);
			cfg.sq_depth = DEPTH;
			cfg.qid = qid;
			err = upcie_nvme_qpair_init(&q[i].qp, &cfg);
			if (err)
				upcie_gpu_hip_host_free(&t->gpu, &q[i].sq);
		}
		if (!err) { /* the controller writes its completions into VRAM */
			err = queue_add(t, qid, q[i].sq.iova, q[i].m.dev_cq_iova);
			if (err) {
				upcie_nvme_qpair_fini(&q[i].qp);
				upcie_gpu_hip_host_free(&t->gpu, &q[i].sq);
			}
		}
		if (err) {
			upcie_nvme_cqmirror_hip_detach(&q[i].m);
			break;
		}
		made++;
	}
	if (!err) {
		t0 = upcie_time_ns();
		while (left && !err) {
			for (unsigned i = 0; i < nq && !err; i++) {
				int n;

				while (next[i] < per_q &&
				       upcie_nvme_qpair_inflight(&q[i].qp) < QD) {
					uint64_t blk = next[i] * nq + i;
					struct upcie_nvme_sqe sqe;

					upcie_nvme_cmd_read(&sqe, t->ns.nsid,
							    t->slba + (blk * BS >> t->lba_shift),
							    BS >> t->lba_shift, 0);
					sqe.prp1 = iova_h[blk];
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
					"gpu_read_hip: mirrored reads not done after 10 s\n");
				err = -ETIMEDOUT;
			}
		}
		/* every completion reaped: now GPU work may read the data, with plain loads */
		bad[0] = 0;
		put(t, t->bad_dev, bad, sizeof(*bad));
		hipLaunchKernelGGL(check_kernel, dim3(CHECK_BLOCKS), dim3(CHECK_THREADS), 0, t->s,
				   dst, ref, bytes, t->bad_dev);
		CK(hipGetLastError());
		CK(hipStreamSynchronize(t->s));
		get(t, bad, t->bad_dev, sizeof(*bad));
		for (unsigned i = 0; i < nq; i++)
			failed += q[i].failed;
		printf("mirrored: %u CPU queue pairs, completions written into VRAM and mirrored, "
		       "%" PRIu64 " 4 KiB Reads into VRAM (%.1f ms): %llu failed commands, %llu of "
		       "%" PRIu64 " 16-byte chunks differ\n",
		       nq, (uint64_t)nq * per_q, (double)(upcie_time_ns() - t0) / 1e6, failed,
		       bad[0], bytes / 16);
		if (!err && (failed || bad[0]))
			err = -EIO;
	}
	for (unsigned i = 0; i < made; i++) {
		bool gone = queue_del(t, qid_of(t, i)); /* the controller drops the queue first */

		upcie_nvme_qpair_fini(&q[i].qp);
		if (!gone)
			continue;
		upcie_gpu_hip_host_free(&t->gpu, &q[i].sq);
		upcie_nvme_cqmirror_hip_detach(&q[i].m);
	}
	return err;
}

enum payload_kind { PAY_DEFAULT, PAY_HOST, PAY_FINE, PAY_UNCACHED };

int main(int argc, char **argv)
{
	static struct target t;
	struct upcie_nvme_ctrl_opts co;
	struct upcie_gpu_hip_opts go;
	struct upcie_pci_bdf bdf;
	struct upcie_heap_buf vbuf, hbuf;
	struct upcie_nvme_ioq ioq;
	struct upcie_dmamem mem;
	struct payload pl;
	const char *bdf_s = NULL;
	static unsigned long long bad[2];
	uint64_t *iova_h = NULL, bytes;
	uint8_t *ref = NULL;
	enum payload_kind kind = PAY_DEFAULT;
	unsigned nq = 4;
	uint32_t rounds = 8, nsid = 1, per_q;
	bool direct = false, have_v = false, have_h = false;
	int err, e2;

	memset(&co, 0, sizeof(co));
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(argv[i], "--direct"))
			direct = true;
		else if (!strcmp(argv[i], "--path") && v && !upcie_nvme_path_parse(v, &co.dev.path))
			i++;
		else if (!strcmp(argv[i], "--nsid") && v)
			nsid = (uint32_t)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--lba") && v)
			t.slba = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--queues") && v)
			nq = (unsigned)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--rounds") && v)
			rounds = (uint32_t)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--payload") && v && !strcmp(v, "host"))
			kind = PAY_HOST, i++;
		else if (!strcmp(argv[i], "--payload") && v && !strcmp(v, "fine"))
			kind = PAY_FINE, i++;
		else if (!strcmp(argv[i], "--payload") && v && !strcmp(v, "uncached"))
			kind = PAY_UNCACHED, i++;
		else if (argv[i][0] != '-' && !bdf_s)
			bdf_s = argv[i];
		else
			nq = 0, i = argc;
	}
	if (!bdf_s || upcie_pci_bdf_parse(bdf_s, &bdf) || !nq || nq > MAXQ || !rounds ||
	    rounds > 1024) {
		fprintf(stderr,
			"usage: gpu_read_hip [--path uio|type1|iommufd] [--nsid N] [--lba L] "
			"[--queues 1..16] [--rounds 1..1024] [--direct] "
			"[--payload host|fine|uncached] BDF\n");
		return 2;
	}
	if (kind == PAY_DEFAULT) /* the payload the queue kind takes */
		kind = direct ? PAY_FINE : PAY_HOST;
	per_q = QD * rounds;
	bytes = (uint64_t)nq * per_q * BS;
	t.marker = (uint8_t *)malloc(bytes);
	if (!t.marker)
		return 1;
	memset(t.marker, MARKER, bytes);

	/* 1. the controller and the namespace (read only) */
	co.dev.bind = true;
	err = upcie_nvme_ctrl_open(&t.c, &bdf, &co);
	if (err) {
		fprintf(stderr, "gpu_read_hip: cannot bring up %s: %s\n", bdf_s, strerror(-err));
		return 1;
	}
	err = upcie_nvme_ns_open(&t.ns, &t.c, nsid);
	if (!err && (BS % t.ns.lba_bytes || t.ns.ms || t.ns.zoned || t.slba > t.ns.nsze ||
		     bytes / t.ns.lba_bytes > t.ns.nsze - t.slba || t.c.nqueues < nq)) {
		fprintf(stderr,
			"gpu_read_hip: namespace %u: needs blocks dividing 4 KiB, no metadata, "
			"not zoned, %" PRIu64 " bytes from LBA %" PRIu64 ", %u queues\n",
			nsid, bytes, t.slba, nq);
		err = -EINVAL;
	}
	if (err) {
		upcie_nvme_ctrl_close(&t.c);
		return 1;
	}
	t.lba_shift = (uint32_t)__builtin_ctz(t.ns.lba_bytes);
	printf("%s on the %s path: %s, namespace %u\n", t.c.name,
	       upcie_nvme_path_name(t.c.dev.path), t.c.mn, nsid);

	/* 2. the GPU provider. The device heap holds VRAM payloads, which GPU code reads after a
	 * completion: fine-grained or uncached, as the acquire needs (a plain hipMalloc heap
	 * would be refused by the payload checks). The host heap holds the SQs, the bridged CQs
	 * and, for a host-memory payload, the payload. */
	memset(&go, 0, sizeof(go));
	go.device_heap_size = bytes + (64 << 20);
	go.device_heap_flags =
	    kind == PAY_UNCACHED ? UPCIE_GPU_HIP_HEAP_UNCACHED : UPCIE_GPU_HIP_HEAP_FINEGRAINED;
	go.host_heap_size = (64 << 20) + (kind == PAY_HOST ? bytes : 0);
	err = upcie_gpu_hip_open(&t.gpu, &go);
	if (err) {
		fprintf(stderr,
			"gpu_read_hip: GPU provider with a%s device heap (needs the dmabuf_import "
			"module): %s\n",
			kind == PAY_UNCACHED ? "n uncached" : " fine-grained", strerror(-err));
		upcie_nvme_ctrl_close(&t.c);
		return 1;
	}
	CK(hipStreamCreateWithFlags(&t.s, hipStreamNonBlocking));
	CK(hipMalloc((void **)&t.bad_dev, sizeof(bad)));
	/* the reference is no payload: hipMemcpy fills it before any kernel reads it, so
	 * ordinary (coarse-grained) VRAM does */
	CK(hipMalloc((void **)&ref, bytes));
	err = upcie_gpu_hip_alloc(&t.gpu, bytes, 65536, &vbuf);
	have_v = !err;
	if (!err && kind == PAY_HOST) {
		err = upcie_gpu_hip_host_alloc(&t.gpu, bytes, 4096, &hbuf);
		have_h = !err;
	}
	memset(&pl, 0, sizeof(pl));
	if (have_h) {
		pl.addr = (uint8_t *)hbuf.vaddr;
		pl.dev = (uint8_t *)upcie_gpu_hip_host_devptr(&t.gpu, hbuf.vaddr);
		pl.host = true;
		pl.what = "host memory";
	} else if (have_v) {
		pl.addr = pl.dev = (uint8_t *)vbuf.vaddr;
		pl.what = kind == PAY_UNCACHED ? "uncached VRAM" : "fine-grained VRAM";
	}
	/* part 2's payload: the device heap's VRAM, checked as GPU code will read it after the
	 * CPU reaped; each 4 KiB block's device address, for the PRPs */
	if (!err)
		err = upcie_gpu_hip_payload_check(vbuf.vaddr, "the mirrored reads' payload");
	iova_h = (uint64_t *)calloc(bytes / BS, sizeof(uint64_t));
	if (!err && !iova_h)
		err = -ENOMEM;
	for (uint64_t b = 0; !err && b < bytes / BS; b++)
		err = upcie_gpu_hip_iova(&t.gpu, (uint8_t *)vbuf.vaddr + b * BS, &iova_h[b]);
	/* 3. the reference: the blocks as an ordinary CPU queue reads them into host memory */
	if (!err)
		err = upcie_nvme_dev_dmamem(&t.c.dev, bytes, &mem);
	if (!err) {
		err = upcie_nvme_ioq_create(&ioq, &t.c, NULL);
		if (!err) {
			err = upcie_nvme_ioq_read_sync(&ioq, &t.ns, t.slba, &mem, 0, bytes, NULL);
			upcie_nvme_ioq_delete(&ioq);
		}
		if (!err)
			CK(hipMemcpy(ref, mem.vaddr, bytes, hipMemcpyHostToDevice));
		upcie_dmamem_destroy(&mem);
	}

	/* 4. the two ways (they exclude each other in a process: one after the other) */
	if (!err)
		err = part_gqp(&t, nq, per_q, direct, &pl, ref, bad);
	if (!err) {
		e2 = part_mirror(&t, nq, per_q, (uint8_t *)vbuf.vaddr, ref, iova_h, bad);
		err = e2;
	}

	/* 5. the mirror's kernel has exited (last detach): memory can go */
	free(iova_h);
	if (have_h)
		upcie_gpu_hip_host_free(&t.gpu, &hbuf);
	if (have_v)
		upcie_gpu_hip_free(&t.gpu, &vbuf);
	CK(hipFree(ref));
	CK(hipFree(t.bad_dev));
	free(t.marker);
	CK(hipStreamDestroy(t.s));
	upcie_gpu_hip_close(&t.gpu);
	upcie_nvme_ctrl_close(&t.c);
	printf("%s\n", err ? "FAILED" : "both ways verified");
	return err ? 1 : 0;
}
