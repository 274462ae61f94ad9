/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * upcie-perf's GPU-initiated mode (the CUDA build, upcie-perf-cuda): every queue pair is driven
 * by one warp of a kernel (gpuq/gqp_cuda.h), its SQ in VRAM or, with --sq-host, in host memory
 * mapped into the GPU, its CQ in VRAM. Each lane keeps requests in flight up to QD per queue;
 * a request's latency is taken on the GPU (%globaltimer) from its enqueue to the reap that finds
 * its completion, into a histogram in device memory. The host prints progress each second from
 * counters the warps publish, stops the kernel after --time and drains.
 *
 *   --gpu null   against the GPU null controller of the tests (tests/gpu/nullctl.cuh, one
 *                warp per queue on the same GPU, data moved to and from a namespace buffer in
 *                VRAM): the queue machinery's own cost, no NVMe needed.
 *   --gpu BDF    against a real controller opened as the CPU mode does (--path, --bind): queues
 *                created by admin commands on the top queue identifiers, doorbells in BAR0
 *                mapped for the GPU, data in the device heap exported through the dmabuf_import
 *                module (bus addresses: the uio path, IOMMU off or identity).
 *
 * Data buffers: one of BS bytes per lane and queue, shared by that lane's requests (the load is
 * measured, not the data). --gpu-id picks the GPU (CUDA ordinal or PCI address; the results name
 * its PCI address). --ramp: completions count only once the host raised the measuring flag that
 * the warps read beside the stop flag. Reads and writes go to histograms of their own (the
 * submit time of a CID carries the direction in its lowest bit). A combination that cannot run
 * (more queues than the controller or the null controller has, a block size the GPU queues
 * cannot carry) is reported as a failed run naming the reason, never dropped silently.
 * Needs CUDA (-lcuda -lcudart) and, for a controller, root.
 */
#ifndef UPCIE_TOOLS_PERF_GPU_CUH
#define UPCIE_TOOLS_PERF_GPU_CUH

#include <upcie/gpu/heap_cuda.h>
#include <upcie/gpuq/gqp_cuda.h>
#include <upcie/gpuq/gqp_host_cuda.h>

#include "../tests/gpu/rig.cuh"

struct pg_stat {
	unsigned long long b[PERF_HBUCKETS];
	unsigned long long n, sum, min, max, errors;
};

struct pg_args {
	struct upcie_nvme_gqp **qs;
	struct upcie_gpu_xlate x;
	uint8_t *buf;
	uint64_t bs, nblocks; /* request bytes; requests that fit in the region */
	uint32_t qd, mix, seq, lba_shift, nsid, ncids;
	volatile uint32_t *stop;	   /* host-mapped: [0] end the run, [1] measuring */
	volatile unsigned long long *prog; /* host-mapped: completions per queue */
	struct pg_stat *st;		   /* per queue: [2q] writes, [2q + 1] reads */
	unsigned long long *t0;		   /* per queue: submit time per CID, bit 0 = read */
	unsigned long long seed;
};

__device__ static inline unsigned long long pg_now(void)
{
	unsigned long long t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

__device__ static inline unsigned long long pg_rand(unsigned long long *s)
{
	unsigned long long x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

struct pg_cpl {
	unsigned long long *t0;
	struct pg_stat *st; /* this queue's pair: writes, reads */
	uint32_t measure;
	__device__ void operator()(const struct upcie_nvme_cqe &e) const
	{
		unsigned long long t = t0[upcie_nvme_cqe_cid(&e)];
		unsigned long long lat = pg_now() - (t & ~1ull);
		struct pg_stat *st = &this->st[t & 1];

		if (!upcie_nvme_cqe_ok(&e))
			atomicAdd(&st->errors, 1ull);
		if (!measure)
			return;
		atomicAdd(&st->b[perf_bucket(lat)], 1ull);
		atomicAdd(&st->n, 1ull);
		atomicAdd(&st->sum, lat);
		atomicMin(&st->min, lat);
		atomicMax(&st->max, lat);
	}
};

__global__ void pg_kernel(struct pg_args a)
{
	uint32_t lane = threadIdx.x & 31, q = blockIdx.x, inflight = 0;
	unsigned long long rng = a.seed ^ (0x9e3779b97f4a7c15ull * (q * 32 + lane + 1)), done = 0;
	unsigned long long seq_next = (a.nblocks / gridDim.x) * q + lane, stop_t = 0;
	unsigned long long *t0 = a.t0 + (size_t)q * a.ncids;
	struct pg_cpl f = { t0, &a.st[2 * q], 0 };
	uint8_t *data = a.buf + ((size_t)q * 32 + lane) * a.bs;
	uint32_t nlb = (uint32_t)(a.bs >> a.lba_shift);
	struct upcie_nvme_gqp_warp w;

	upcie_nvme_gqp_begin(&w, a.qs[q], false);
	for (;;) {
		uint32_t stop = __shfl_sync(0xffffffffu, lane == 0 ? a.stop[0] : 0u, 0);

		f.measure = __shfl_sync(0xffffffffu, lane == 0 ? a.stop[1] : 0u, 0);

		if (!stop) {
			while (inflight < a.qd) {
				uint32_t k = a.qd - inflight < 32 ? a.qd - inflight : 32, g;
				struct upcie_nvme_sqe sqe;
				uint64_t blk;
				uint16_t cid = UPCIE_NVME_GQP_CID_NONE;
				bool rd;
				int r;

				if (a.seq) {
					blk = seq_next % a.nblocks;
					seq_next += 32;
				} else {
					blk = pg_rand(&rng) % a.nblocks;
				}
				rd = a.mix >= 100 || (uint32_t)(pg_rand(&rng) % 100) < a.mix;
				upcie_nvme_cmd_rw_(&sqe,
						   rd ? UPCIE_NVME_NVM_READ : UPCIE_NVME_NVM_WRITE,
						   a.nsid, blk * nlb, nlb, 0);
				r = upcie_nvme_gqp_enqueue_data(&w, lane < k ? &sqe : NULL, &a.x,
								data, (uint32_t)a.bs, &cid);
				if (lane < k && r == 0)
					t0[cid] = (pg_now() & ~1ull) | (rd ? 1ull : 0ull);
				g = __popc(__ballot_sync(0xffffffffu, lane < k && r == 0));
				inflight += g;
				if (g < k)
					break;
			}
			upcie_nvme_gqp_ring(&w);
		} else if (!stop_t) {
			stop_t = pg_now();
		}
		{
			uint32_t c = upcie_nvme_gqp_reap_each(&w, f);

			inflight -= c;
			done += c;
		}
		if (lane == 0)
			a.prog[q] = done;
		if (stop && (!inflight || pg_now() - stop_t > 2 * UPCIE_NSEC_PER_SEC))
			break;
	}
	if (lane == 0 && inflight)
		atomicAdd(&a.st[2 * q].errors, (unsigned long long)inflight); /* never completed */
	upcie_nvme_gqp_end(&w);
}

/*
 * Memory of the runs, allocated once before any controller kernel starts and freed after the
 * last one stopped: cudaFree() and cudaFreeHost() wait for the whole device, which a resident
 * controller kernel never leaves.
 */
struct pg_scratch {
	struct pg_stat *st_d, *st_h;
	unsigned long long *t0;
	volatile uint32_t *stop_h, *stop_d;
	volatile unsigned long long *prog_h, *prog_d;
	unsigned maxq;
	uint32_t maxcids;
};

static void pg_scratch_init(struct pg_scratch *x, unsigned maxq, uint32_t maxcids)
{
	memset(x, 0, sizeof(*x));
	x->maxq = maxq;
	x->maxcids = maxcids;
	x->stop_h = (volatile uint32_t *)rig_pinned(4096);
	x->prog_h = (volatile unsigned long long *)rig_pinned(maxq * sizeof(unsigned long long));
	x->st_h = (struct pg_stat *)calloc(2 * maxq, sizeof(*x->st_h));
	if (!x->st_h)
		exit(2);
	RIG_CK(cudaMalloc(&x->st_d, 2 * maxq * sizeof(*x->st_d)));
	RIG_CK(cudaMalloc(&x->t0, (size_t)maxq * maxcids * sizeof(unsigned long long)));
	RIG_CK(cudaHostGetDevicePointer((void **)&x->stop_d, (void *)x->stop_h, 0));
	RIG_CK(cudaHostGetDevicePointer((void **)&x->prog_d, (void *)x->prog_h, 0));
}

static void pg_scratch_fini(struct pg_scratch *x)
{
	cudaFree(x->t0);
	cudaFree(x->st_d);
	free(x->st_h);
	cudaFreeHost((void *)x->stop_h);
	cudaFreeHost((void *)x->prog_h);
	memset(x, 0, sizeof(*x));
}

/*
 * One run on queues already created (their device states in qs). With `r` (the null
 * controller), its kernel runs from after the setup copies to before the result copy.
 */
static int pg_run(const struct perf_opts *o, struct upcie_gpu_cuda *gpu, struct rig *r,
		  struct pg_scratch *x, struct upcie_nvme_gqp **qs, unsigned nq, uint32_t ncids,
		  unsigned qd, uint64_t bs, unsigned seq, unsigned mix, uint32_t lba_shift,
		  uint32_t nsid, uint64_t region, cudaStream_t s, struct perf_result *res)
{
	struct upcie_heap_buf buf;
	struct pg_args a;
	uint64_t t0, tm0 = 0, ramp_end, end, last = 0, last_t;
	char why[160];
	int err;

	if (nq > x->maxq || ncids > x->maxcids)
		return perf_fail(res, -EINVAL, "more queues or CIDs than the run's scratch memory");
	memset(&a, 0, sizeof(a));
	/* device heap: host bookkeeping only, no CUDA call that waits for the device */
	err = upcie_gpu_cuda_alloc(gpu, (uint64_t)nq * 32 * bs, 4096, &buf);
	if (err) {
		snprintf(why, sizeof(why),
			 "%" PRIu64 " bytes of data buffers in the device heap: %s",
			 (uint64_t)nq * 32 * bs, strerror(-err));
		return perf_fail(res, err, why);
	}
	err = upcie_gpu_cuda_xlate_create(gpu, buf.vaddr, &a.x);
	if (err) {
		upcie_gpu_cuda_free(gpu, &buf);
		snprintf(why, sizeof(why), "translating the data buffers: %s", strerror(-err));
		return perf_fail(res, err, why);
	}
	x->stop_h[0] = 0;
	x->stop_h[1] = 0;
	for (unsigned i = 0; i < 2 * nq; i++) {
		memset(&x->st_h[i], 0, sizeof(x->st_h[i]));
		x->st_h[i].min = ~0ull;
	}
	for (unsigned i = 0; i < nq; i++)
		x->prog_h[i] = 0;
	RIG_CK(cudaMemcpy(x->st_d, x->st_h, 2 * nq * sizeof(*x->st_d), cudaMemcpyHostToDevice));
	a.qs = qs;
	a.buf = (uint8_t *)buf.vaddr;
	a.bs = bs;
	a.nblocks = region / bs;
	a.qd = qd, a.mix = mix, a.seq = seq, a.lba_shift = lba_shift, a.nsid = nsid;
	a.ncids = ncids;
	a.st = x->st_d;
	a.t0 = x->t0;
	a.stop = x->stop_d;
	a.prog = x->prog_d;
	a.seed = upcie_time_ns();

	if (r)
		rig_ctl_start(r, 0, 0);
	t0 = last_t = upcie_time_ns();
	ramp_end = t0 + (uint64_t)(o->ramp * 1e9);
	end = ramp_end + (uint64_t)(o->secs * 1e9);
	if (ramp_end == t0) {
		x->stop_h[1] = 1;
		tm0 = t0;
	}
	__sync_synchronize();
	pg_kernel<<<nq, 32, 0, s>>>(a);
	RIG_CK(cudaGetLastError());
	for (unsigned sec = 1;; sec++) {
		uint64_t tick = t0 + (uint64_t)sec * UPCIE_NSEC_PER_SEC, now, n = 0;
		bool ramping = !tm0;

		if (ramping && ramp_end < tick) {
			perf_sleep_until(ramp_end);
			x->stop_h[1] = 1;
			__sync_synchronize();
			tm0 = upcie_time_ns();
		}
		perf_sleep_until(tick < end ? tick : end);
		now = upcie_time_ns();
		for (unsigned i = 0; i < nq; i++)
			n += x->prog_h[i];
		perf_progress(res, sec, ramping && !tm0, (double)(now - last_t) / 1e9, n - last);
		last = n, last_t = now;
		if (now >= end || cudaStreamQuery(s) != cudaErrorNotReady)
			break;
	}
	/* the window closes when the warps stop counting */
	x->stop_h[1] = 0;
	__sync_synchronize();
	res->secs = tm0 ? (double)(upcie_time_ns() - tm0) / 1e9 : 0;
	x->stop_h[0] = 1;
	__sync_synchronize();
	rig_sync(s, "perf kernel");
	if (r)
		rig_ctl_stop(r);
	RIG_CK(cudaMemcpy(x->st_h, x->st_d, 2 * nq * sizeof(*x->st_d), cudaMemcpyDeviceToHost));
	res->q = (struct perf_qres *)calloc(nq, sizeof(*res->q));
	res->nq = res->q ? nq : 0;
	for (unsigned i = 0; i < 2 * nq; i++) {
		const struct pg_stat *q = &x->st_h[i];
		struct perf_hist *h = (i & 1) ? &res->rd : &res->wr;
		struct perf_qres *qr = res->q ? &res->q[i / 2] : NULL;
		struct perf_hist *qh = qr ? ((i & 1) ? &qr->rd : &qr->wr) : NULL;

		if (qr && !(i & 1)) {
			snprintf(qr->target, sizeof(qr->target), "%.47s", res->target);
			qr->thread = i / 2; /* the block whose warp drove it */
			qr->cpu = -1;
			perf_hist_init(&qr->rd);
			perf_hist_init(&qr->wr);
		}
		res->errors += q->errors;
		if (qr)
			qr->errors += q->errors;
		for (int k = 0; k < (qh ? 2 : 1); k++) {
			struct perf_hist *d = k ? qh : h;

			d->n += q->n;
			d->sum += q->sum;
			if (q->n && q->min < d->min)
				d->min = q->min;
			if (q->max > d->max)
				d->max = q->max;
			for (unsigned b = 0; b < PERF_HBUCKETS; b++)
				d->b[b] += q->b[b];
		}
		if (qr) {
			qr->ios += q->n;
			qr->bytes += q->n * bs;
		}
	}
	res->ios = res->rd.n + res->wr.n;
	res->bytes = res->ios * bs;
	upcie_gpu_cuda_xlate_destroy(gpu, &a.x);
	upcie_gpu_cuda_free(gpu, &buf);
	return 0;
}

/* The queue flags a run needs: PRP lists beyond two pages, the SQ where asked. */
static unsigned pg_flags(const struct perf_opts *o, uint64_t bs)
{
	return (o->gpu_sq_host ? UPCIE_NVME_GQP_SQ_HOSTMEM : 0u) |
	       (bs > UPCIE_NVME_GQP_MAX_XFER_NOLIST ? UPCIE_NVME_GQP_PRP_LISTS : 0u);
}

/* Why a block size cannot run on GPU queues, or NULL. */
static const char *pg_check_bs(uint64_t bs, uint32_t lba, char *why, size_t len)
{
	if (!bs || bs % lba || bs > (uint64_t)(UPCIE_NVME_GQP_LIST_ENTRIES + 1) * 4096) {
		snprintf(why, len,
			 "bs %" PRIu64 ": GPU queues need whole %u-byte blocks, at most %u KiB", bs,
			 lba, (UPCIE_NVME_GQP_LIST_ENTRIES + 1) * 4);
		return why;
	}
	return NULL;
}

/* The GPU of --gpu-id into the provider's options: an ordinal, or a PCI address. */
static void pg_gpu_choice(const struct perf_opts *o, struct upcie_gpu_cuda_opts *go)
{
	uint64_t x;

	if (!o->gpu_id)
		go->gpu_id = 0;
	else if (!opt_u64_range(o->gpu_id, 0, 255, &x))
		go->gpu_id = (int)x;
	else
		go->gpu_pci = o->gpu_id;
}

/*
 * rig_open() of the tests on the GPU of --gpu-id: the provider on that GPU, the runtime's
 * current device the same, then the null controller's state.
 */
static int pg_rig_open(const struct perf_opts *o, struct rig *r, uint64_t dheap, uint64_t hheap,
		       uint64_t ns_bytes)
{
	struct upcie_gpu_cuda_opts go;
	int err;

	memset(r, 0, sizeof(*r));
	memset(&go, 0, sizeof(go));
	pg_gpu_choice(o, &go);
	go.device_heap_size = dheap;
	go.host_heap_size = hheap;
	go.xlate = UPCIE_GPU_CUDA_XLATE_OFFSET;
	go.iova_offset = RIG_IOVA_OFFSET;
	err = upcie_gpu_cuda_open(&r->gpu, &go);
	if (err)
		return err;
	RIG_CK(cudaSetDevice(r->gpu.p->dev.ordinal));
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

/* Against the null controller. */
static int pg_main_null(const struct perf_opts *o, struct perf_out *out)
{
	static struct perf_result res;
	uint64_t region = o->size ? o->size : (uint64_t)64 << 20, maxbs = 0;
	unsigned maxq = 0, run = 0,
		 nruns = o->queues.n * o->qd.n * o->bs.n * o->pattern.n * o->mix.n;
	struct pg_scratch x;
	struct rig r;
	bool failed = false;
	char why[200];
	int err;

	for (unsigned i = 0; i < o->bs.n; i++)
		if (o->bs.v[i] > maxbs)
			maxbs = o->bs.v[i];
	for (unsigned i = 0; i < o->queues.n; i++)
		if (o->queues.v[i] > maxq)
			maxq = (unsigned)o->queues.v[i];
	if (maxq > NULLCTL_MAX_Q)
		maxq = NULLCTL_MAX_Q;
	err = pg_rig_open(o, &r, (uint64_t)maxq * 32 * maxbs + ((uint64_t)256 << 20),
			  (uint64_t)256 << 20, region);
	if (err) {
		fprintf(stderr, "upcie-perf: GPU %s: %s\n", o->gpu_id ? o->gpu_id : "0",
			strerror(-err));
		return 1;
	}
	pg_scratch_init(&x, maxq, 4096);
	if (out->json)
		perf_json_begin(out, UPCIE_TOOLS_VERSION, o->argc, o->argv);
	for (unsigned a = 0; a < o->queues.n; a++)
		for (unsigned b = 0; b < o->qd.n; b++)
			for (unsigned s = 0; s < o->bs.n; s++)
				for (unsigned p = 0; p < o->pattern.n; p++)
					for (unsigned m = 0; m < o->mix.n; m++) {
						unsigned nq = (unsigned)o->queues.v[a];
						unsigned qd = (unsigned)o->qd.v[b];
						uint64_t bs = o->bs.v[s];
						uint32_t depth = qd + 1 < 64 ? 64 : qd + 1;

						perf_result_init(
						    &res, "gpu-null",
						    o->gpu_sq_host ? "sq-host" : "sq-vram", nq, qd,
						    bs, (unsigned)o->pattern.v[p],
						    (unsigned)o->mix.v[m]);
						res.run = ++run, res.nruns = nruns;
						res.threads = nq, res.ntargets = 1,
						res.ramp = o->ramp;
						snprintf(res.target, sizeof(res.target), "null");
						snprintf(res.gpu, sizeof(res.gpu), "%s",
							 r.gpu.p->dev.pci_name);
						if (nq > NULLCTL_MAX_Q) {
							snprintf(
							    why, sizeof(why),
							    "queues=%u: the null controller serves "
							    "%u queue pairs at most",
							    nq, NULLCTL_MAX_Q);
							perf_fail(&res, -ENOSPC, why);
						} else if (pg_check_bs(bs, 512, why, sizeof(why))) {
							perf_fail(&res, -EINVAL, why);
						} else if (bs > region) {
							snprintf(why, sizeof(why),
								 "bs %" PRIu64
								 " exceeds the %" PRIu64
								 "-byte namespace",
								 bs, region);
							perf_fail(&res, -EINVAL, why);
						} else {
							err = rig_queues_create(&r, (int)nq, depth,
										pg_flags(o, bs));
							if (err) {
								snprintf(
								    why, sizeof(why),
								    "creating %u GPU queue pairs "
								    "of depth %u: %s",
								    nq, depth, strerror(-err));
								perf_fail(&res, err, why);
							} else {
								pg_run(o, &r.gpu, &r, &x, r.dqs, nq,
								       depth - 1, qd, bs,
								       (unsigned)o->pattern.v[p],
								       (unsigned)o->mix.v[m], 9, 1,
								       region, r.s_run, &res);
								rig_queues_destroy(&r);
							}
						}
						if (res.err || res.errors)
							failed = true;
						perf_emit(out, &res);
						free(res.q);
						res.q = NULL;
					}
	if (out->json)
		perf_json_end(out, failed ? 1 : 0);
	pg_scratch_fini(&x);
	rig_close(&r);
	return failed ? 1 : 0;
}

/*
 * The controller lets go of a GPU queue before its memory goes: a queue it may still have
 * (-EBUSY, or -ENOMEM: nothing done) keeps its memory.
 */
static void pg_queue_drop(struct upcie_nvme_ioq *hq, struct upcie_nvme_gqp_host *gq)
{
	int err = upcie_nvme_ioq_delete(hq);

	if (err == -EBUSY || err == -ENOMEM) {
		fprintf(stderr, "upcie-perf-cuda: queue not deleted (%s): its GPU memory is kept\n",
			strerror(-err));
		return;
	}
	upcie_nvme_gqp_destroy(gq);
}

/* Against a real controller: GPU-resident queues created on it by admin commands. */
static int pg_main_ctrl(const struct perf_opts *o, struct perf_out *out)
{
	static struct perf_result res;
	struct upcie_nvme_ctrl_opts co;
	struct upcie_gpu_cuda_opts go;
	struct upcie_gpu_cuda gpu;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ns ns;
	struct upcie_pci_bdf bdf;
	enum upcie_nvme_path path = UPCIE_NVME_PATH_AUTO;
	struct upcie_nvme_gqp_host gq[PERF_MAX_Q];
	struct upcie_nvme_ioq hq[PERF_MAX_Q]; /* the controller's side of each GPU queue */
	struct upcie_nvme_gqp **dqs;
	unsigned run = 0, nruns = o->queues.n * o->qd.n * o->bs.n * o->pattern.n * o->mix.n;
	cudaStream_t s;
	bool failed = false;
	char why[200];
	int err;

	if (upcie_pci_bdf_parse(o->gpu_target, &bdf) ||
	    (o->path && upcie_nvme_path_parse(o->path, &path)))
		return 2;
	memset(&co, 0, sizeof(co));
	co.dev.path = path;
	co.dev.bind = o->bind;
	co.dev.bind_any_class = o->bind_any_class;
	err = upcie_nvme_ctrl_open(&c, &bdf, &co);
	if (err) {
		fprintf(stderr, "upcie-perf: cannot open %s: %s\n", o->gpu_target, strerror(-err));
		return 1;
	}
	err = upcie_nvme_ns_open(&ns, &c, (uint32_t)o->nsid.v[0]);
	if (err) {
		fprintf(stderr, "upcie-perf: %s: namespace %u: %s\n", o->gpu_target,
			(unsigned)o->nsid.v[0], strerror(-err));
		upcie_nvme_ctrl_close(&c);
		return 1;
	}
	memset(&go, 0, sizeof(go));
	pg_gpu_choice(o, &go);
	err = upcie_gpu_cuda_open(&gpu, &go);
	if (err) {
		fprintf(stderr,
			"upcie-perf: GPU %s (the provider needs the dmabuf_import module): %s\n",
			o->gpu_id ? o->gpu_id : "0", strerror(-err));
		upcie_nvme_ns_close(&ns);
		upcie_nvme_ctrl_close(&c);
		return 1;
	}
	struct pg_scratch x;

	RIG_CK(cudaSetDevice(gpu.p->dev.ordinal));
	RIG_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	RIG_CK(cudaMalloc(&dqs, PERF_MAX_Q * sizeof(void *)));
	pg_scratch_init(&x, PERF_MAX_Q, 4096);
	if (out->json)
		perf_json_begin(out, UPCIE_TOOLS_VERSION, o->argc, o->argv);
	for (unsigned a = 0; a < o->queues.n; a++)
		for (unsigned b = 0; b < o->qd.n; b++)
			for (unsigned si = 0; si < o->bs.n; si++)
				for (unsigned p = 0; p < o->pattern.n; p++)
					for (unsigned m = 0; m < o->mix.n; m++) {
						unsigned nq = (unsigned)o->queues.v[a], made = 0;
						unsigned qd = (unsigned)o->qd.v[b];
						uint64_t bs = o->bs.v[si];
						uint64_t all = ns.nsze * ns.lba_bytes;
						uint64_t region =
						    o->size && o->size < all ? o->size : all;
						uint32_t depth = qd + 1 < 64 ? 64 : qd + 1;
						struct upcie_nvme_gqp *dq[PERF_MAX_Q];

						if (depth > c.mqes)
							depth = c.mqes;
						perf_result_init(
						    &res, "gpu-ctrl",
						    o->gpu_sq_host ? "sq-host" : "sq-vram", nq, qd,
						    bs, (unsigned)o->pattern.v[p],
						    (unsigned)o->mix.v[m]);
						res.run = ++run, res.nruns = nruns;
						res.threads = nq, res.ntargets = 1,
						res.ramp = o->ramp;
						snprintf(res.target, sizeof(res.target), "%s/%u",
							 c.name, ns.nsid);
						snprintf(res.gpu, sizeof(res.gpu), "%s",
							 gpu.p->dev.pci_name);
						err = 0;
						if (nq > c.nqueues) {
							snprintf(why, sizeof(why),
								 "queues=%u, but the controller "
								 "granted %u "
								 "I/O queue pairs",
								 nq, c.nqueues);
							err = perf_fail(&res, -ENOSPC, why);
						} else if (pg_check_bs(bs, ns.lba_bytes, why,
								       sizeof(why))) {
							err = perf_fail(&res, -EINVAL, why);
						} else if (bs > region) {
							snprintf(why, sizeof(why),
								 "bs %" PRIu64
								 " exceeds the %" PRIu64
								 "-byte region",
								 bs, region);
							err = perf_fail(&res, -EINVAL, why);
						} else if (qd >= depth) {
							snprintf(why, sizeof(why),
								 "qd %u: the controller's queues "
								 "hold %u "
								 "entries (CAP.MQES)",
								 qd, c.mqes);
							err = perf_fail(&res, -EINVAL, why);
						}
						for (unsigned i = 0; i < nq && !err; i++) {
							struct upcie_nvme_gqp_cfg cfg;
							struct upcie_nvme_ioq_ext ext;
							uint16_t qid = (uint16_t)(c.nqueues - i);

							memset(&cfg, 0, sizeof(cfg));
							cfg.qid = qid;
							cfg.depth = depth;
							cfg.flags = pg_flags(o, bs) |
								    UPCIE_NVME_GQP_DB_IOMEM;
							cfg.sqdb =
							    (volatile uint32_t
								 *)(c.regs + upcie_nvme_sq_tdbl_off(
										 qid, c.dstrd));
							cfg.cqdb =
							    (volatile uint32_t
								 *)(c.regs + upcie_nvme_cq_hdbl_off(
										 qid, c.dstrd));
							err = upcie_nvme_gqp_create(&gq[i], &gpu,
										    &cfg);
							if (err) {
								snprintf(
								    why, sizeof(why),
								    "GPU queue pair qid %u: %s",
								    qid, strerror(-err));
								perf_fail(&res, err, why);
								break;
							}
							memset(&ext, 0, sizeof(ext));
							ext.depth = depth;
							ext.sq_iova = gq[i].sq_iova;
							ext.cq_iova = gq[i].cq_iova;
							ext.qid = qid;
							err = upcie_nvme_ioq_create_ext(&hq[i], &c,
											&ext);
							if (err) {
								snprintf(
								    why, sizeof(why),
								    "creating I/O queue pair "
								    "qid %u on the controller: "
								    "%s",
								    qid, strerror(-err));
								perf_fail(&res, err, why);
								/* -EBUSY: the controller may
								 * still have the CQ, its memory
								 * stays */
								if (err != -EBUSY)
									upcie_nvme_gqp_destroy(
									    &gq[i]);
								break;
							}
							dq[i] = gq[i].dq;
							made++;
						}
						if (!err) {
							RIG_CK(cudaMemcpy(dqs, dq,
									  nq * sizeof(void *),
									  cudaMemcpyHostToDevice));
							pg_run(
							    o, &gpu, NULL, &x, dqs, nq, depth - 1,
							    qd, bs, (unsigned)o->pattern.v[p],
							    (unsigned)o->mix.v[m],
							    (uint32_t)__builtin_ctz(ns.lba_bytes),
							    ns.nsid, region, s, &res);
							for (unsigned i = 0; i < res.nq; i++)
								res.q[i].qid =
								    (unsigned)(c.nqueues - i);
						}
						for (unsigned i = 0; i < made; i++)
							pg_queue_drop(&hq[i], &gq[i]);
						if (res.err || res.errors)
							failed = true;
						perf_emit(out, &res);
						free(res.q);
						res.q = NULL;
					}
	if (out->json)
		perf_json_end(out, failed ? 1 : 0);
	pg_scratch_fini(&x);
	cudaFree(dqs);
	cudaStreamDestroy(s);
	upcie_gpu_cuda_close(&gpu);
	upcie_nvme_ns_close(&ns);
	upcie_nvme_ctrl_close(&c);
	return failed ? 1 : 0;
}

static int perf_gpu_main(const struct perf_opts *o, struct perf_out *out)
{
	rig_eager();
	rig_watchdog((unsigned)(o->secs + o->ramp + 30) * o->queues.n * o->qd.n * o->bs.n *
			 o->pattern.n * o->mix.n +
		     60);
	if (!strcmp(o->gpu_target, "null"))
		return pg_main_null(o, out);
	return pg_main_ctrl(o, out);
}

#endif /* UPCIE_TOOLS_PERF_GPU_CUH */
