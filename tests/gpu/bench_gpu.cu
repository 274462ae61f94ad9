/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * GPU benchmarks against the GPU null controller (docs/results/gpu-queues.md has the figures and
 * the commands that produced them). Parts, chosen by the arguments (default: all but mirrorlat;
 * BENCH_WATCHDOG=seconds overrides the 19 s watchdog):
 *   rate    commands/s of GPU-resident queue pairs (Flush, no data), 1..128 queue pairs, several
 *           depths, SQ in device memory; pipelined submission and reaping by one warp per queue
 *   hostsq  the same with the SQ in host memory (UPCIE_NVME_GQP_SQ_HOSTMEM)
 *   stores  SQEs written into host memory by N warps: 4 x 16-byte stores (the library's
 *           upcie_nvme_port_sqe_store) against 16 x 4-byte volatile stores
 *   mirror  completion mirror: what the mirror hop adds (the same entries written into a host CQ
 *           and into a mirrored device CQ, arrival times on the CPU's clock), a GPU -> CPU ->
 *           GPU ping-pong through each path, and completions/s to CPU threads
 *   mirrorlat  the latency rows of "mirror" only
 *   qd32    one queue pair at QD 32 and 128: submission batch sizes, and the null controller's
 *           ordering (system fences vs GPU-scope acquire/release, "lean")
 *   qd      one queue pair at QD 1, 32 and 128 with either controller ordering: the rows that
 *           compare the reap's acquire fence with the code before it (built against both)
 *   bare    the library's path beside a bare ring of the same shape (no library, no fences) and
 *           the bare ring with the library's release, then also its acquire, at the shapes of
 *           "rate", with either controller ordering, in one call
 *   l2lat   one-way latency between two SMs through device memory, per load/store flavour
 *   fence   cost of the fences a submitter can publish a batch with
 * Built a second time as bench_gpu_store4 with the SQE stores of the queue path made 4-byte ones
 * (BENCH_STORE4) to compare "hostsq" at the queue level; BENCH_SCFENCE publishes batches with
 * __threadfence_system() (fence.sc.sys) instead of the library's fence.release.sys. BENCH_PROF
 * (bench_gpu_prof) adds to "bare" the SM cycles of each phase of the loop (enqueue, ring, reap) of
 * queue pair 0, to place the time. The queue loops pass the command by value
 * (upcie_nvme_gqp_enqueue_cmd()); BENCH_PTR_ENQUEUE passes it through a pointer NULL in the lanes
 * without one (upcie_nvme_gqp_enqueue(), the only form before, and what bench_gpu_before builds).
 * Prints tables; CI only compiles this.
 */
#include <upcie/gpu/heap_cuda.h>
#include <upcie/nvme/cmd.h>
#include <upcie/gpuq/cqmirror_host_cuda.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef BENCH_STORE4
/* Sixteen 4-byte volatile stores per SQE: what the queue path would cost without 16-byte ones. */
__device__ static inline void bench_sqe_store4(struct upcie_nvme_sqe *dst,
					       const struct upcie_nvme_sqe *src, uint16_t cid)
{
	volatile uint32_t *d = (volatile uint32_t *)dst;

	d[0] = src->opc | ((uint32_t)src->flags << 8) | ((uint32_t)cid << 16);
	d[1] = src->nsid;
	d[2] = src->cdw2;
	d[3] = src->cdw3;
	d[4] = (uint32_t)src->mptr;
	d[5] = (uint32_t)(src->mptr >> 32);
	d[6] = (uint32_t)src->prp1;
	d[7] = (uint32_t)(src->prp1 >> 32);
	d[8] = (uint32_t)src->prp2;
	d[9] = (uint32_t)(src->prp2 >> 32);
	d[10] = src->cdw10;
	d[11] = src->cdw11;
	d[12] = src->cdw12;
	d[13] = src->cdw13;
	d[14] = src->cdw14;
	d[15] = src->cdw15;
}
#define UPCIE_NVME_GQP_SQE_STORE(dst, src, cid) bench_sqe_store4(dst, src, cid)
#endif

#ifdef BENCH_SCFENCE
#define UPCIE_NVME_GQP_WMB() __threadfence_system()
#endif

#include <upcie/gpuq/gqp_cuda.h>
#include <upcie/gpuq/gqp_host_cuda.h>

#include "rig.cuh"

#define MiB (UINT64_C(1) << 20)

__device__ static inline uint64_t gnow(void)
{
	return upcie_nvme_port_time_ns();
}

/* ---------------- rate ---------------- */

struct bres {
	unsigned long long n, bad, t_ns;
	/* BENCH_PROF (bench_gpu_prof): SM cycles in enqueue, ring, reaps that found entries, reaps
	 * that found none; how many of each reap. */
	unsigned long long p[4], nhit, nmiss;
};

/* SM clock for BENCH_PROF's phase times; 0 (and the sums folded away) otherwise. */
__device__ static inline long long pclk(void)
{
#ifdef BENCH_PROF
	return clock64();
#else
	return 0;
#endif
}

__device__ static inline void prof_add(unsigned long long *p, unsigned long long *nh,
				       unsigned long long *nm, long long a0, long long a1,
				       long long a2, long long a3, uint32_t got)
{
#ifndef BENCH_PROF
	return;
#endif
	p[0] += a1 - a0;
	p[1] += a2 - a1;
	if (got) {
		p[2] += a3 - a2;
		(*nh)++;
	} else {
		p[3] += a3 - a2;
		(*nm)++;
	}
}

__device__ static inline void prof_store(struct bres *res, const unsigned long long *p,
					 unsigned long long nh, unsigned long long nm)
{
	for (int i = 0; i < 4; i++)
		res->p[i] = p[i];
	res->nhit = nh;
	res->nmiss = nm;
}

struct okcount {
	unsigned *bad;
	__device__ void operator()(const struct upcie_nvme_cqe &e) const
	{
		if (!upcie_nvme_cqe_ok(&e))
			(*bad)++;
	}
};

/* batch: most commands enqueued between two rings (0: up to QD at once). */
__global__ void rate_kernel(struct upcie_nvme_gqp **qs, uint32_t qd, uint32_t batch,
			    uint64_t dur_ns, struct bres *res)
{
	uint32_t lane = threadIdx.x & 31, inflight = 0;
	struct upcie_nvme_gqp_warp w;
	struct upcie_nvme_sqe sqe;
	unsigned bad = 0;
	struct okcount f = { &bad };
	unsigned long long n = 0, pt[4] = { 0, 0, 0, 0 }, nh = 0, nm = 0;
	uint64_t t0, deadline, t1;

	upcie_nvme_cmd_flush(&sqe, 1);
	upcie_nvme_gqp_begin(&w, qs[blockIdx.x], false);
	t0 = __shfl_sync(0xffffffffu, gnow(), 0);
	deadline = t0 + dur_ns;
	for (;;) {
		uint32_t added = 0;
		long long a0 = pclk(), a1, a2, a3;

		while (inflight < qd) {
			uint32_t k = qd - inflight < 32 ? qd - inflight : 32, g;
			uint16_t cid;
			int r;

			if (batch && k > batch - added)
				k = batch - added;
#ifdef BENCH_PTR_ENQUEUE
			r = upcie_nvme_gqp_enqueue(&w, lane < k ? &sqe : NULL, &cid);
#else
			r = upcie_nvme_gqp_enqueue_cmd(&w, lane < k, sqe, &cid);
#endif
			g = __popc(__ballot_sync(0xffffffffu, lane < k && r == 0));
			inflight += g;
			if (g < k)
				break;
			if (batch && (added += g) >= batch)
				break;
		}
		a1 = pclk();
		upcie_nvme_gqp_ring(&w);
		a2 = pclk();
		{
			uint32_t c = upcie_nvme_gqp_reap_each(&w, f);

			a3 = pclk();
			prof_add(pt, &nh, &nm, a0, a1, a2, a3, c);
			inflight -= c;
			n += c;
		}
		if (__shfl_sync(0xffffffffu, gnow(), 0) >= deadline)
			break;
	}
	t1 = __shfl_sync(0xffffffffu, gnow(), 0);
	while (inflight && __shfl_sync(0xffffffffu, gnow(), 0) < t1 + 100 * UPCIE_NSEC_PER_MSEC)
		inflight -= upcie_nvme_gqp_reap_each(&w, f);
	upcie_nvme_gqp_end(&w);
	for (int o = 16; o; o >>= 1)
		bad += __shfl_down_sync(0xffffffffu, bad, o);
	if (lane == 0) {
		res[blockIdx.x].n = n;
		res[blockIdx.x].bad = bad + inflight;
		res[blockIdx.x].t_ns = t1 - t0;
		prof_store(&res[blockIdx.x], pt, nh, nm);
	}
}

static void rate_case(struct rig *r, struct bres *res, int nq, uint32_t depth, uint32_t qd,
		      uint32_t batch, uint32_t lean, unsigned flags, const char *label)
{
	unsigned long long n = 0, bad = 0, tmax = 0;
	double mps;
	int err = rig_queues_create(r, nq, depth, flags);

	if (err) {
		printf("| %s | %d | %u | %u | - | - | create failed %d |\n", label, nq, depth, qd,
		       err);
		return;
	}
	r->c.lean = lean;
	rig_ctl_start(r, 0, 0);
	rate_kernel<<<nq, 32, 0, r->s_run>>>(r->dqs, qd, batch, 100 * UPCIE_NSEC_PER_MSEC, res);
	rig_sync(r->s_run, "bench kernel");
	rig_ctl_stop(r);
	r->c.lean = 0;
	for (int i = 0; i < nq; i++) {
		n += res[i].n;
		bad += res[i].bad;
		if (res[i].t_ns > tmax)
			tmax = res[i].t_ns;
	}
	mps = tmax ? n * 1e3 / tmax : 0;
	printf("| %s | %d | %u | %u | %.3f | %.3f | %llu |\n", label, nq, depth, qd, mps, mps / nq,
	       bad);
	rig_queues_destroy(r);
}

static void part_rate(struct rig *r, unsigned flags, const char *label)
{
	struct bres *res;
	static const struct {
		int nq;
		uint32_t depth, qd;
	} cases[] = { { 1, 64, 32 },	{ 1, 256, 128 },   { 1, 1024, 1023 },
		      { 64, 256, 128 }, { 128, 256, 128 }, { 128, 1024, 1023 } };

	res = (struct bres *)rig_pinned(128 * sizeof(*res));
	printf("\n| SQ | queue pairs | depth | QD | Mcmd/s total | Mcmd/s per queue pair | "
	       "errors |\n|---|---|---|---|---|---|---|\n");
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		if ((flags & UPCIE_NVME_GQP_SQ_HOSTMEM) && cases[i].nq > 64)
			continue;
		rate_case(r, res, cases[i].nq, cases[i].depth, cases[i].qd, 0, 0, flags, label);
	}
	cudaFreeHost(res);
}

/* One queue pair at QD 32 and 128: batch sizes and the controller's ordering. */
static void part_qd32(struct rig *r)
{
	struct bres *res = (struct bres *)rig_pinned(128 * sizeof(*res));
	static const struct {
		uint32_t depth, qd, batch;
	} cases[] = {
		{ 64, 32, 0 }, { 64, 32, 16 }, { 64, 32, 8 }, { 256, 128, 0 }, { 256, 128, 32 }
	};
	char label[96];

	printf(
	    "\n| SQ, controller ordering, batch | queue pairs | depth | QD | Mcmd/s total | Mcmd/s "
	    "per queue pair | errors |\n|---|---|---|---|---|---|---|\n");
	for (uint32_t lean = 0; lean < 2; lean++)
		for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			snprintf(label, sizeof(label), "device, %s, batch %u%s",
				 lean ? "lean (acquire/release)" : "system fences",
				 cases[i].batch ? cases[i].batch : cases[i].qd,
#ifdef BENCH_SCFENCE
				 ", submitter fence.sc.sys"
#else
				 ""
#endif
			);
			rate_case(r, res, 1, cases[i].depth, cases[i].qd, cases[i].batch, lean, 0,
				  label);
		}
	cudaFreeHost(res);
}

/* One queue pair at QD 1, 32, 128, each controller ordering. */
static void part_qd(struct rig *r)
{
	struct bres *res = (struct bres *)rig_pinned(128 * sizeof(*res));
	static const struct {
		uint32_t depth, qd;
	} cases[] = { { 64, 1 }, { 64, 32 }, { 256, 128 } };

	printf(
	    "\n| controller ordering | queue pairs | depth | QD | Mcmd/s total | Mcmd/s per queue "
	    "pair | errors |\n|---|---|---|---|---|---|---|\n");
	for (uint32_t lean = 0; lean < 2; lean++)
		for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
			rate_case(r, res, 1, cases[i].depth, cases[i].qd, 0, lean, 0,
				  lean ? "lean (acquire/release)" : "system fences");
	cudaFreeHost(res);
}

/* ---------------- bare ---------------- */

/*
 * The bare ring: the same shape as rate_kernel (one warp per queue pair, Flush commands, up to 32
 * per enqueue round, one doorbell per round, up to 4 x 32 CQEs polled per reap) on the same queue
 * memory, written by hand with no library: the slot index is the CID, no per-CID state, no checks.
 * Rel adds the library's release fence before each SQ doorbell, Acq its acquire after each poll
 * that found entries: the steps between the bare ring and the library, to place the time.
 */
template <bool Rel, bool Acq>
__global__ void bare_kernel(struct upcie_nvme_gqp **qs, uint32_t qd, uint64_t dur_ns,
			    struct bres *res)
{
	const struct upcie_nvme_gqp *q = qs[blockIdx.x];
	struct upcie_nvme_sqe *sq = q->sq;
	const struct upcie_nvme_cqe *cq = q->cq;
	volatile uint32_t *sqdb = q->sqdb, *cqdb = q->cqdb;
	uint32_t depth = q->depth, lane = threadIdx.x & 31;
	uint32_t tail = 0, head = 0, cqh = 0, phase = 1, inflight = 0;
	struct upcie_nvme_sqe sqe;
	unsigned long long n = 0, pt[4] = { 0, 0, 0, 0 }, nh = 0, nm = 0;
	uint64_t t0, deadline, t1;

	upcie_nvme_cmd_flush(&sqe, 1);
	t0 = __shfl_sync(0xffffffffu, gnow(), 0);
	deadline = t0 + dur_ns;
	for (;;) {
		bool rung = false;
		long long a0 = pclk(), a1, a2, a3;

		while (inflight < qd) {
			uint32_t used = tail >= head ? tail - head : tail + depth - head;
			uint32_t room = depth - 1 - used, k = qd - inflight;

			k = k < 32 ? k : 32;
			k = k < room ? k : room;
			if (!k)
				break;
			if (lane < k) {
				uint32_t slot = tail + lane;

				if (slot >= depth)
					slot -= depth;
				upcie_nvme_port_sqe_store(&sq[slot], &sqe, (uint16_t)slot);
			}
			tail += k;
			if (tail >= depth)
				tail -= depth;
			inflight += k;
			rung = true;
		}
		a1 = pclk();
		if (rung) {
			if (Rel)
				UPCIE_NVME_GQP_WMB();
			__syncwarp();
			if (lane == 0)
				*sqdb = tail;
		}
		a2 = pclk();
		{
			uint4 v[4];
			uint32_t got = 0, m;
			bool stop = false;

#pragma unroll
			for (uint32_t r = 0; r < 4; r++) {
				uint32_t idx = cqh + r * 32 + lane;

				if (idx >= depth)
					idx -= depth;
				v[r] = r * 32 + lane < depth ? upcie_nvme_port_ld16(&cq[idx])
							     : make_uint4(0, 0, 0, 0);
			}
#pragma unroll
			for (uint32_t r = 0; r < 4; r++) {
				uint32_t pos = r * 32 + lane,
					 ph = phase ^ (cqh + pos >= depth ? 1u : 0u);

				m = __ballot_sync(0xffffffffu,
						  pos < depth && ((v[r].w >> 16) & 1u) == ph);
				if (!stop) {
					if (m == 0xffffffffu) {
						got += 32;
					} else {
						got += __ffs(~m) - 1;
						stop = true;
					}
				}
			}
			if (got) {
				uint32_t lr = (got - 1) >> 5, ll = (got - 1) & 31, d2 = 0;

				if (Acq)
					UPCIE_NVME_GQP_ACQUIRE();
#pragma unroll
				for (uint32_t r = 0; r < 4; r++)
					if (r == lr)
						d2 = v[r].z;
				head = __shfl_sync(0xffffffffu, d2, ll) & 0xffffu;
				cqh += got;
				if (cqh >= depth) {
					cqh -= depth;
					phase ^= 1u;
				}
				if (lane == 0)
					*cqdb = cqh;
				inflight -= got;
				n += got;
			}
			a3 = pclk();
			prof_add(pt, &nh, &nm, a0, a1, a2, a3, got);
		}
		if (__shfl_sync(0xffffffffu, gnow(), 0) >= deadline)
			break;
	}
	t1 = __shfl_sync(0xffffffffu, gnow(), 0);
	if (lane == 0) {
		res[blockIdx.x].n = n;
		res[blockIdx.x].bad = 0;
		res[blockIdx.x].t_ns = t1 - t0;
		prof_store(&res[blockIdx.x], pt, nh, nm);
	}
}

/*
 * The bare ring (and its two fenced steps) beside the library's path, same queues, same
 * controller, one after the other in this call: the figures of gpu-queues.md's "fenced path"
 * table. kind: 0 library (rate_kernel), 1 bare, 2 bare + release, 3 bare + release + acquire.
 */
static double bare_case(struct rig *r, struct bres *res, int kind, int nq, uint32_t depth,
			uint32_t qd, uint32_t lean)
{
	unsigned long long n = 0, tmax = 0;
	int err = rig_queues_create(r, nq, depth, 0);

	if (err)
		return -1;
	r->c.lean = lean;
	rig_ctl_start(r, 0, 0);
	switch (kind) {
	case 0:
		rate_kernel<<<nq, 32, 0, r->s_run>>>(r->dqs, qd, 0, 100 * UPCIE_NSEC_PER_MSEC, res);
		break;
	case 1:
		bare_kernel<false, false>
		    <<<nq, 32, 0, r->s_run>>>(r->dqs, qd, 100 * UPCIE_NSEC_PER_MSEC, res);
		break;
	case 2:
		bare_kernel<true, false>
		    <<<nq, 32, 0, r->s_run>>>(r->dqs, qd, 100 * UPCIE_NSEC_PER_MSEC, res);
		break;
	default:
		bare_kernel<true, true>
		    <<<nq, 32, 0, r->s_run>>>(r->dqs, qd, 100 * UPCIE_NSEC_PER_MSEC, res);
		break;
	}
	rig_sync(r->s_run, "bench kernel");
	rig_ctl_stop(r);
	r->c.lean = 0;
	for (int i = 0; i < nq; i++) {
		n += res[i].n;
		if (res[i].t_ns > tmax)
			tmax = res[i].t_ns;
	}
#ifdef BENCH_PROF
	/* Queue pair 0: SM cycles per reap that found entries, by phase of the loop. */
	if (res[0].nhit)
		printf("# prof kind %d, %d x depth %u QD %u, lean %u: per hit round cycles enqueue "
		       "%.0f ring %.0f reap %.0f, misses %.0f x %.0f\n",
		       kind, nq, depth, qd, lean, (double)res[0].p[0] / res[0].nhit,
		       (double)res[0].p[1] / res[0].nhit, (double)res[0].p[2] / res[0].nhit,
		       (double)res[0].nmiss / res[0].nhit,
		       res[0].nmiss ? (double)res[0].p[3] / res[0].nmiss : 0.0);
#endif
	rig_queues_destroy(r);
	return tmax ? n * 1e3 / tmax : 0;
}

static void part_bare(struct rig *r)
{
	struct bres *res = (struct bres *)rig_pinned(128 * sizeof(*res));
	static const struct {
		int nq;
		uint32_t depth, qd;
	} cases[] = { { 1, 64, 32 },	{ 1, 256, 128 },   { 1, 1024, 1023 },
		      { 64, 256, 128 }, { 128, 256, 128 }, { 128, 1024, 1023 } };

	printf("\n| controller ordering | queue pairs | depth | QD | bare ring Mcmd/s | bare + "
	       "release "
	       "| bare + release + acquire | library | library / bare |\n"
	       "|---|---|---|---|---|---|---|---|---|\n");
	for (uint32_t lean = 0; lean < 2; lean++)
		for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			double m[4];

			for (int k = 0; k < 4; k++)
				m[k] = bare_case(r, res, k == 3 ? 0 : k + 1, cases[i].nq,
						 cases[i].depth, cases[i].qd, lean);
			printf("| %s | %d | %u | %u | %.3f | %.3f | %.3f | %.3f | %.3f |\n",
			       lean ? "lean (acquire/release)" : "system fences", cases[i].nq,
			       cases[i].depth, cases[i].qd, m[0], m[1], m[2], m[3],
			       m[0] > 0 ? m[3] / m[0] : 0);
		}
	cudaFreeHost(res);
}

/* ---------------- stores ---------------- */

template <int W>
__global__ void store_kernel(struct upcie_nvme_sqe *rings, uint64_t dur_ns,
			     unsigned long long *count, unsigned long long *tns)
{
	uint32_t warp = blockIdx.x, lane = threadIdx.x & 31;
	struct upcie_nvme_sqe *ring = rings + (uint64_t)warp * 1024;
	struct upcie_nvme_sqe sqe;
	unsigned long long it = 0;
	uint64_t t0 = gnow(), t1;

	upcie_nvme_cmd_read(&sqe, 1, lane, 1, 0);
	for (;;) {
		for (int k = 0; k < 64; k++) {
			struct upcie_nvme_sqe *d = &ring[((it + k) * 32 + lane) & 1023];

			sqe.cdw2 = (uint32_t)(it + k);
			if (W == 17) {
				/* Cooperative: instruction j writes entries 8j..8j+7 of the 32, lane L
				 * quarter L % 4 of entry L / 4. */
				for (int j = 0; j < 4; j++) {
					char *e = (char *)&ring[((it + k) * 32 + j * 8 + lane / 4) &
								1023];

					upcie_nvme_port_store16(e + 16 * (lane & 3), sqe.prp1 + j,
								sqe.cdw2);
				}
			} else if (W == 5) {
				/* Cooperative 4-byte: instruction j writes entries 2j, 2j+1, lane L
				 * dword L % 16 of entry L / 16. */
				for (int j = 0; j < 16; j++) {
					volatile uint32_t *e =
					    (volatile uint32_t
						 *)&ring[((it + k) * 32 + j * 2 + lane / 16) &
							 1023];

					e[lane & 15] = sqe.cdw2 + j;
				}
			} else if (W == 16) {
				upcie_nvme_port_sqe_store(d, &sqe, (uint16_t)lane);
			} else {
				volatile uint32_t *v = (volatile uint32_t *)d;

				v[0] = sqe.opc | (lane << 16);
				v[1] = sqe.nsid;
				v[2] = sqe.cdw2;
				v[3] = sqe.cdw3;
				v[4] = 0;
				v[5] = 0;
				v[6] = (uint32_t)sqe.prp1;
				v[7] = (uint32_t)(sqe.prp1 >> 32);
				v[8] = (uint32_t)sqe.prp2;
				v[9] = (uint32_t)(sqe.prp2 >> 32);
				v[10] = sqe.cdw10;
				v[11] = sqe.cdw11;
				v[12] = sqe.cdw12;
				v[13] = sqe.cdw13;
				v[14] = sqe.cdw14;
				v[15] = sqe.cdw15;
			}
		}
		it += 64;
		if (__shfl_sync(0xffffffffu, gnow(), 0) - t0 >= dur_ns)
			break;
	}
	__threadfence_system();
	t1 = gnow();
	if (lane == 0) {
		count[warp] = it * 32;
		tns[warp] = t1 - t0;
	}
}

static void part_stores(struct rig *r)
{
	static const int warps[] = { 1, 4, 32, 132, 264, 528 };
	const uint64_t dur = 40 * UPCIE_NSEC_PER_MSEC;
	struct upcie_heap_buf hb;
	unsigned long long *cnt, *tns;
	struct upcie_nvme_sqe *rings;
	double rate[4][6];
	static const int wv[4] = { 16, 4, 17, 5 };

	if (upcie_gpu_cuda_host_alloc(&r->gpu, 528 * 1024 * 64, 4096, &hb)) {
		printf("stores: host heap too small\n");
		return;
	}
	rings = (struct upcie_nvme_sqe *)upcie_gpu_cuda_host_devptr(&r->gpu, hb.vaddr);
	cnt = (unsigned long long *)rig_pinned(528 * sizeof(*cnt));
	tns = (unsigned long long *)rig_pinned(528 * sizeof(*tns));
	for (int v = 0; v < 4; v++)
		for (int i = 0; i < 6; i++) {
			unsigned long long n = 0, t = 0;

			if (wv[v] == 16)
				store_kernel<16>
				    <<<warps[i], 32, 0, r->s_run>>>(rings, dur, cnt, tns);
			else if (wv[v] == 4)
				store_kernel<4>
				    <<<warps[i], 32, 0, r->s_run>>>(rings, dur, cnt, tns);
			else if (wv[v] == 17)
				store_kernel<17>
				    <<<warps[i], 32, 0, r->s_run>>>(rings, dur, cnt, tns);
			else
				store_kernel<5>
				    <<<warps[i], 32, 0, r->s_run>>>(rings, dur, cnt, tns);
			rig_sync(r->s_run, "bench kernel");
			for (int k = 0; k < warps[i]; k++) {
				n += cnt[k];
				if (tns[k] > t)
					t = tns[k];
			}
			rate[v][i] = n * 1e3 / t;
		}
	printf("\n| writer warps | 4 x 16-B stores: M SQE/s | GB/s | 16 x 4-B stores: M SQE/s | "
	       "GB/s | ratio |\n|---|---|---|---|---|---|\n");
	for (int i = 0; i < 6; i++)
		printf("| %d | %.1f | %.2f | %.1f | %.2f | %.2f |\n", warps[i], rate[0][i],
		       rate[0][i] * 64 / 1e3, rate[1][i], rate[1][i] * 64 / 1e3,
		       rate[0][i] / rate[1][i]);
	printf("\n| writer warps | cooperative 16-B: M SQE/s | GB/s | cooperative 4-B: M SQE/s | "
	       "GB/s | coop 16-B / per-lane 4-B | coop 16-B / coop 4-B |\n"
	       "|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < 6; i++)
		printf("| %d | %.1f | %.2f | %.1f | %.2f | %.2f | %.2f |\n", warps[i], rate[2][i],
		       rate[2][i] * 64 / 1e3, rate[3][i], rate[3][i] * 64 / 1e3,
		       rate[2][i] / rate[1][i], rate[2][i] / rate[3][i]);
	cudaFreeHost(cnt);
	cudaFreeHost(tns);
	upcie_gpu_cuda_host_free(&r->gpu, &hb);
}

/* ---------------- mirror ---------------- */

__device__ static inline void st16(void *p, uint4 v)
{
	asm volatile("st.global.cg.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
		     "r"(v.z), "r"(v.w)
		     : "memory");
}

/* One thread: write CQE i, wait for the CPU's reply i + 1, record the round trip. */
__global__ void pingpong_kernel(struct upcie_nvme_cqe *cq, uint32_t depth, volatile uint32_t *reply,
				uint32_t iters, uint64_t *rt, unsigned long long *timeouts)
{
	uint32_t phase = 1, slot = 0;

	for (uint32_t i = 0; i < iters; i++) {
		uint64_t t0 = gnow(), t;
		uint4 e = make_uint4(i, 0, 0, (i & 0xffffu) | (phase << 16));

		st16(&cq[slot], e);
		__threadfence_system();
		while (*reply != i + 1) {
			if (gnow() - t0 > 100 * UPCIE_NSEC_PER_MSEC) {
				(*timeouts)++;
				return;
			}
		}
		t = gnow();
		rt[i] = t - t0;
		if (++slot == depth) {
			slot = 0;
			phase ^= 1;
		}
	}
}

/*
 * A CPU thread consuming `iters` entries of a CQ in order: waits for each phase tag to turn (1 s
 * limit), checks that dw0 carries the entry's number, then records the time (t non-NULL) and
 * answers with the number + 1 (reply non-NULL). Entries not seen count as bad.
 */
struct cq_reader {
	const struct upcie_nvme_cqe *cq;
	uint32_t depth, iters;
	volatile uint32_t *reply;
	uint64_t *t;
	unsigned long long bad;
};

static void *cq_reader_thread(void *arg)
{
	struct cq_reader *p = (struct cq_reader *)arg;
	uint32_t phase = 1, slot = 0;

	for (uint32_t i = 0; i < p->iters; i++) {
		const volatile uint32_t *dw3 = &p->cq[slot].dw3;
		uint64_t t0 = upcie_time_ns();

		while (((*dw3 >> 16) & 1u) != phase) {
			if (upcie_time_ns() - t0 > UPCIE_NSEC_PER_SEC) {
				p->bad += p->iters - i;
				return NULL;
			}
		}
		if (p->t)
			p->t[i] = upcie_time_ns();
		upcie_dma_rmb();
		if (p->cq[slot].dw0 != i)
			p->bad++;
		if (p->reply)
			*p->reply = i + 1;
		if (++slot == p->depth) {
			slot = 0;
			phase ^= 1;
		}
	}
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * Pinned buffers of the mirror part, allocated before the first attach and freed after the last
 * detach: freeing pinned memory (cudaFreeHost) while the mirror kernel runs waits for it forever.
 */
struct mbufs {
	volatile uint32_t *reply;
	uint32_t *reply_dev;
	uint64_t *rt;
	unsigned long long *to;
	volatile uint32_t *heads;
	uint32_t *heads_dev;
	struct upcie_nvme_cqe **cqs_dev;
};

#define PP_ITERS 10000

/* Median and p99 round trip (ns) through `gpu_cq` (what the GPU writes) / `cpu_cq` (read). */
static void pingpong(struct rig *r, struct mbufs *b, struct upcie_nvme_cqe *gpu_cq,
		     const struct upcie_nvme_cqe *cpu_cq, uint32_t depth, const char *label,
		     double *median)
{
	const uint32_t iters = PP_ITERS;
	struct cq_reader p;
	pthread_t th;

	*b->reply = 0;
	*b->to = 0;
	memset(&p, 0, sizeof(p));
	p.cq = cpu_cq;
	p.depth = depth;
	p.iters = iters;
	p.reply = b->reply;
	pthread_create(&th, NULL, cq_reader_thread, &p);
	pingpong_kernel<<<1, 1, 0, r->s_run>>>(gpu_cq, depth, b->reply_dev, iters, b->rt, b->to);
	rig_sync(r->s_run, "bench kernel");
	pthread_join(th, NULL);
	qsort(b->rt, iters, sizeof(*b->rt), cmp_u64);
	*median = b->rt[iters / 2] / 1e3;
	printf("| %s | %.2f | %.2f | %.2f | %.2f | %llu |\n", label, b->rt[iters / 100] / 1e3,
	       b->rt[iters / 2] / 1e3, b->rt[iters * 99 / 100] / 1e3, b->rt[iters - 1] / 1e3,
	       p.bad + *b->to);
}

/* Throughput: a producer warp fills the CQ at full speed, flow-controlled by the CPU's head. */
__global__ void producer_kernel(struct upcie_nvme_cqe **cqs, uint32_t depth,
				volatile uint32_t *heads, unsigned long long total)
{
	struct upcie_nvme_cqe *cq = cqs[blockIdx.x];
	volatile uint32_t *head = heads + 32 * blockIdx.x;
	uint32_t lane = threadIdx.x & 31, tail = 0, phase = 1, hs = 0;
	unsigned long long seq = 0;
	uint64_t waited = 0;

	while (seq < total) {
		uint32_t used = tail >= hs ? tail - hs : tail + depth - hs, slot, ph;

		if (depth - 1 - used < 32) {
			uint64_t t = __shfl_sync(0xffffffffu, gnow(), 0);

			if (!waited)
				waited = t;
			else if (t - waited > 2 * UPCIE_NSEC_PER_SEC)
				return; /* the consumer gave up */
			hs = __shfl_sync(0xffffffffu, lane == 0 ? *head : 0u, 0);
			continue;
		}
		waited = 0;
		slot = tail + lane;
		ph = phase;
		if (slot >= depth) {
			slot -= depth;
			ph ^= 1;
		}
		st16(&cq[slot], make_uint4((uint32_t)(seq + lane), 0, 0,
					   ((uint32_t)(seq + lane) & 0xffffu) | (ph << 16)));
		tail += 32;
		if (tail >= depth) {
			tail -= depth;
			phase ^= 1;
		}
		seq += 32;
	}
}

struct tp_cpu {
	const struct upcie_nvme_cqe *cq;
	uint32_t depth;
	volatile uint32_t *head;
	unsigned long long total, bad;
	uint64_t t0, t1;
};

static void *tp_cpu_thread(void *arg)
{
	struct tp_cpu *p = (struct tp_cpu *)arg;
	uint32_t phase = 1, slot = 0;
	uint64_t last = upcie_time_ns();

	for (unsigned long long i = 0; i < p->total; i++) {
		const volatile uint32_t *dw3 = &p->cq[slot].dw3;

		while (((*dw3 >> 16) & 1u) != phase) {
			if (upcie_time_ns() - last > UPCIE_NSEC_PER_SEC) {
				p->bad += p->total - i;
				p->t1 = upcie_time_ns();
				return NULL;
			}
		}
		last = upcie_time_ns();
		if (i == 0)
			p->t0 = last;
		upcie_dma_rmb();
		if (p->cq[slot].dw0 != (uint32_t)i)
			p->bad++;
		if (++slot == p->depth) {
			slot = 0;
			phase ^= 1;
		}
		if ((slot & 31) == 0)
			*p->head = slot;
	}
	p->t1 = upcie_time_ns();
	return NULL;
}

static void throughput(struct rig *r, struct mbufs *b, int nq, struct upcie_nvme_cqe **gpu_cqs,
		       const struct upcie_nvme_cqe **cpu_cqs, uint32_t depth, const char *label)
{
	const unsigned long long total = 4ull << 20;
	volatile uint32_t *heads = b->heads;
	struct upcie_nvme_cqe **cqs_dev = b->cqs_dev;
	struct tp_cpu p[8];
	pthread_t th[8];
	uint64_t t0 = UINT64_MAX, t1 = 0;
	unsigned long long bad = 0;

	memset((void *)heads, 0, 4096);
	for (int i = 0; i < nq; i++) {
		cqs_dev[i] = gpu_cqs[i];
		memset(&p[i], 0, sizeof(p[i]));
		p[i].cq = cpu_cqs[i];
		p[i].depth = depth;
		p[i].head = heads + 32 * i;
		p[i].total = total;
		pthread_create(&th[i], NULL, tp_cpu_thread, &p[i]);
	}
	producer_kernel<<<nq, 32, 0, r->s_run>>>(cqs_dev, depth, b->heads_dev, total);
	rig_sync(r->s_run, "bench kernel");
	for (int i = 0; i < nq; i++) {
		pthread_join(th[i], NULL);
		bad += p[i].bad;
		if (p[i].t0 < t0)
			t0 = p[i].t0;
		if (p[i].t1 > t1)
			t1 = p[i].t1;
	}
	printf("| %s | %d | %.1f | %.1f | %llu |\n", label, nq, total * nq * 1e3 / (t1 - t0),
	       total * 1e3 / (t1 - t0), bad);
}

/*
 * Mirror delay on one clock: one GPU thread writes entry i into a host CQ (direct) and into a
 * mirrored device CQ at the same moment, every DELTA_PERIOD_NS, alternating which store goes
 * first; one CPU thread per CQ records when it sees the entry turn (CLOCK_MONOTONIC). The
 * difference of the two arrival times is what the mirror hop adds, with no GPU poll across PCIe
 * in the measurement (which quantises the ping-pong to reads of about a microsecond).
 */
#define DELTA_ITERS	20000
#define DELTA_PERIOD_NS 5000

__global__ void delta_kernel(struct upcie_nvme_cqe *direct, struct upcie_nvme_cqe *dev,
			     uint32_t depth, uint32_t iters)
{
	uint32_t phase = 1, slot = 0;
	uint64_t t0 = gnow();

	for (uint32_t i = 0; i < iters; i++) {
		uint4 e = make_uint4(i, 0, 0, (i & 0xffffu) | (phase << 16));

		while (gnow() < t0 + (uint64_t)i * DELTA_PERIOD_NS)
			;
		if (i & 1) {
			st16(&dev[slot], e);
			st16(&direct[slot], e);
		} else {
			st16(&direct[slot], e);
			st16(&dev[slot], e);
		}
		__threadfence_system();
		if (++slot == depth) {
			slot = 0;
			phase ^= 1;
		}
	}
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

static void delta_row(const char *label, int64_t *d, uint32_t n)
{
	qsort(d, n, sizeof(*d), cmp_i64);
	printf("| %s | %u | %.2f | %.2f | %.2f | %.2f |\n", label, n, d[n / 100] / 1e3,
	       d[n / 2] / 1e3, d[n * 99 / 100] / 1e3, d[n - 1] / 1e3);
}

static void mirror_delta(struct rig *r, struct upcie_heap_buf *direct, uint32_t depth)
{
	struct upcie_nvme_cqmirror_cq m;
	struct cq_reader p[2];
	pthread_t th[2];
	int64_t *d[3];
	uint32_t n[3] = { 0, 0, 0 };

	memset(direct->vaddr, 0, depth * 16);
	if (upcie_nvme_cqmirror_attach(&m, &r->gpu, depth)) {
		printf("mirror attach failed\n");
		return;
	}
	for (int k = 0; k < 2; k++) {
		memset(&p[k], 0, sizeof(p[k]));
		p[k].cq = k ? m.host_cq : (const struct upcie_nvme_cqe *)direct->vaddr;
		p[k].depth = depth;
		p[k].iters = DELTA_ITERS;
		p[k].t = (uint64_t *)calloc(DELTA_ITERS, sizeof(uint64_t));
		pthread_create(&th[k], NULL, cq_reader_thread, &p[k]);
	}
	delta_kernel<<<1, 1, 0, r->s_run>>>(
	    (struct upcie_nvme_cqe *)upcie_gpu_cuda_host_devptr(&r->gpu, direct->vaddr),
	    (struct upcie_nvme_cqe *)rig_ptr(m.dev_cq_iova), depth, DELTA_ITERS);
	rig_sync(r->s_run, "bench kernel");
	for (int k = 0; k < 2; k++)
		pthread_join(th[k], NULL);
	upcie_nvme_cqmirror_detach(&m);
	for (int k = 0; k < 3; k++)
		d[k] = (int64_t *)calloc(DELTA_ITERS, sizeof(int64_t));
	for (uint32_t i = 0; i < DELTA_ITERS; i++) {
		int64_t v = (int64_t)p[1].t[i] - (int64_t)p[0].t[i];

		d[0][n[0]++] = v;
		d[1 + (i & 1)][n[1 + (i & 1)]++] = v;
	}
	printf(
	    "\n| mirrored arrival - direct arrival (CPU clock), %u entries %u ns apart | entries | "
	    "p1 us | median us | p99 us | max us |\n|---|---|---|---|---|---|\n",
	    DELTA_ITERS, DELTA_PERIOD_NS);
	if (p[0].bad || p[1].bad) {
		printf("| errors: direct %llu, mirrored %llu | - | - | - | - | - |\n", p[0].bad,
		       p[1].bad);
	} else {
		delta_row("all", d[0], n[0]);
		delta_row("direct store issued first", d[1], n[1]);
		delta_row("device store issued first", d[2], n[2]);
	}
	for (int k = 0; k < 3; k++)
		free(d[k]);
	for (int k = 0; k < 2; k++)
		free(p[k].t);
}

static void part_mirror(struct rig *r, bool lat_only)
{
	const uint32_t depth = 1024;
	struct upcie_nvme_cqmirror_cq m[4];
	struct upcie_heap_buf direct[4];
	struct upcie_nvme_cqe *gq[4];
	const struct upcie_nvme_cqe *cq[4];
	double d_med = 0, m_med = 0, mf_med = 0;
	struct mbufs b;

	b.reply = (volatile uint32_t *)rig_pinned(4096);
	b.reply_dev = (uint32_t *)(uintptr_t)b.reply;
	b.rt = (uint64_t *)rig_pinned(PP_ITERS * sizeof(uint64_t));
	b.to = (unsigned long long *)rig_pinned(sizeof(unsigned long long));
	b.heads = (volatile uint32_t *)rig_pinned(4096);
	b.heads_dev = (uint32_t *)(uintptr_t)b.heads;
	b.cqs_dev = (struct upcie_nvme_cqe **)rig_pinned(8 * sizeof(void *));

	for (int i = 0; i < 4; i++) {
		upcie_gpu_cuda_host_alloc(&r->gpu, depth * 16, 4096, &direct[i]);
		memset(direct[i].vaddr, 0, depth * 16);
		gq[i] =
		    (struct upcie_nvme_cqe *)upcie_gpu_cuda_host_devptr(&r->gpu, direct[i].vaddr);
		cq[i] = (const struct upcie_nvme_cqe *)direct[i].vaddr;
	}
	printf("\n| path | RT min-ish (p1) us | median us | p99 us | max us | errors |\n"
	       "|---|---|---|---|---|---|\n");
	memset(direct[0].vaddr, 0, depth * 16);
	pingpong(r, &b, gq[0], cq[0], depth, "direct: GPU writes the host CQ (+ system fence)",
		 &d_med);
	for (int f = 0; f < 2; f++) {
		double *med = f ? &mf_med : &m_med;

		upcie_nvme_cqmirror_set_flags(&r->gpu, f ? UPCIE_NVME_CQMIRROR_F_FENCE : 0);
		if (upcie_nvme_cqmirror_attach(&m[0], &r->gpu, depth)) {
			printf("mirror attach failed\n");
			return;
		}
		pingpong(
		    r, &b, (struct upcie_nvme_cqe *)rig_ptr(m[0].dev_cq_iova), m[0].host_cq, depth,
		    f ? "mirrored (fence after each copy step)" : "mirrored (default, no fence)",
		    med);
		upcie_nvme_cqmirror_detach(&m[0]);
	}
	printf(
	    "\nround trip difference (median - median; quantised by the GPU's reply polls, reads "
	    "of ~1 us across PCIe): %.2f us (default), %.2f us (fence)\n",
	    m_med - d_med, mf_med - d_med);
	upcie_nvme_cqmirror_set_flags(&r->gpu, 0);
	mirror_delta(r, &direct[1], depth);
	if (lat_only)
		goto out;

	printf("\n| path | queues (CPU threads) | M completions/s total | per queue | errors "
	       "|\n|---|---|---|---|---|\n");
	for (int nq = 1; nq <= 4; nq *= 4) {
		for (int i = 0; i < nq; i++)
			memset(direct[i].vaddr, 0, depth * 16);
		throughput(r, &b, nq, gq, cq, depth, "direct: producer writes the host CQ");
	}
	for (int nq = 1; nq <= 4; nq *= 4) {
		struct upcie_nvme_cqe *mg[4];
		const struct upcie_nvme_cqe *mc[4];

		for (int i = 0; i < nq; i++) {
			if (upcie_nvme_cqmirror_attach(&m[i], &r->gpu, depth)) {
				printf("mirror attach failed\n");
				return;
			}
			mg[i] = (struct upcie_nvme_cqe *)rig_ptr(m[i].dev_cq_iova);
			mc[i] = m[i].host_cq;
		}
		throughput(r, &b, nq, mg, mc, depth, "mirrored: producer writes device memory");
		for (int i = 0; i < nq; i++)
			upcie_nvme_cqmirror_detach(&m[i]);
	}
out:
	for (int i = 0; i < 4; i++)
		upcie_gpu_cuda_host_free(&r->gpu, &direct[i]);
	/* Every mirrored queue is detached: the kernel is gone, freeing is safe again. */
	cudaFreeHost((void *)b.reply);
	cudaFreeHost(b.rt);
	cudaFreeHost(b.to);
	cudaFreeHost((void *)b.heads);
	cudaFreeHost(b.cqs_dev);
}

/* ---------------- l2lat, fence ---------------- */

/* Load/store flavours of the one-way latency test. */
template <int F> __device__ static inline uint32_t lat_ld(const uint32_t *p)
{
	uint32_t v;

	if (F == 1)
		asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	else if (F == 2)
		asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	else if (F == 3)
		asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	else if (F == 5)
		asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	else
		asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}

template <int F> __device__ static inline void lat_st(uint32_t *p, uint32_t v)
{
	if (F == 1)
		asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
	else if (F == 2)
		asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
	else if (F == 3)
		asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
	else if (F == 4)
		asm volatile("st.global.cg.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
	else
		asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
	if (F == 6)
		__threadfence_system();
}

/* Blocks 0 and 1 (two SMs) bounce a counter through device memory `iters` times. */
template <int F>
__global__ void l2lat_kernel(uint32_t *a2b, uint32_t *b2a, uint32_t iters, unsigned long long *res)
{
	uint64_t t0 = gnow();

	if (threadIdx.x)
		return;
	for (uint32_t i = 1; i <= iters; i++) {
		uint32_t *out = blockIdx.x ? b2a : a2b, *in = blockIdx.x ? a2b : b2a;
		unsigned spins = 0;

		if (!blockIdx.x)
			lat_st<F>(out, i);
		while (lat_ld<F>(in) != i)
			if ((++spins & 1023) == 0 && gnow() - t0 > UPCIE_NSEC_PER_SEC) {
				res[1] = 1;
				return;
			}
		if (blockIdx.x)
			lat_st<F>(out, i);
	}
	if (!blockIdx.x)
		res[0] = gnow() - t0;
}

static void part_l2lat(struct rig *r)
{
	static const char *names[] = {
		"ld.volatile / st.volatile",
		"ld.relaxed.gpu / st.relaxed.gpu",
		"ld.acquire.gpu / st.release.gpu",
		"ld.relaxed.sys / st.relaxed.sys",
		"ld.volatile / st.global.cg",
		"ld.global.cg / st.volatile",
		"ld.volatile / st.volatile + __threadfence_system()",
	};
	static void (*const lk[])(uint32_t *, uint32_t *, uint32_t, unsigned long long *) = {
		l2lat_kernel<0>, l2lat_kernel<1>, l2lat_kernel<2>, l2lat_kernel<3>,
		l2lat_kernel<4>, l2lat_kernel<5>, l2lat_kernel<6>
	};
	const uint32_t iters = 20000;
	unsigned long long *res = (unsigned long long *)rig_pinned(2 * sizeof(*res));
	uint32_t *mem;

	RIG_CK(cudaMalloc((void **)&mem, 4096));
	printf("\n| poll / store flavour | one-way ns (round trip / 2, mean of %u) | errors |\n"
	       "|---|---|---|\n",
	       iters);
	for (int f = 0; f < 7; f++) {
		RIG_CK(cudaMemset(mem, 0, 4096));
		res[0] = res[1] = 0;
		lk[f]<<<2, 32, 0, r->s_run>>>(mem, mem + 256, iters, res);
		rig_sync(r->s_run, "bench kernel");
		printf("| %s | %.0f | %llu |\n", names[f], res[0] / 2.0 / iters, res[1]);
	}
	RIG_CK(cudaFree(mem));
	cudaFreeHost(res);
}

/* One thread: `iters` x (16-byte st.global.cg to `p`, then fence F); mean ns per iteration. */
template <int F> __global__ void fence_kernel(uint4 *p, uint32_t iters, unsigned long long *res)
{
	uint64_t t0 = gnow();

	for (uint32_t i = 0; i < iters; i++) {
		upcie_nvme_port_store16(&p[i & 63], i, i);
		if (F == 1)
			__threadfence();
		else if (F == 2)
			asm volatile("fence.acq_rel.gpu;" ::: "memory");
		else if (F == 3)
			__threadfence_system();
		else if (F == 4)
			asm volatile("fence.acq_rel.sys;" ::: "memory");
		else if (F == 5)
			asm volatile("fence.release.gpu;" ::: "memory");
		else if (F == 6)
			asm volatile("fence.release.sys;" ::: "memory");
	}
	*res = gnow() - t0;
}

static void part_fence(struct rig *r)
{
	static const char *names[] = { "none",
				       "__threadfence() (fence.sc.gpu)",
				       "fence.acq_rel.gpu",
				       "__threadfence_system() (fence.sc.sys)",
				       "fence.acq_rel.sys",
				       "fence.release.gpu",
				       "fence.release.sys" };
	static void (*const fk[])(uint4 *, uint32_t, unsigned long long *) = {
		fence_kernel<0>, fence_kernel<1>, fence_kernel<2>, fence_kernel<3>,
		fence_kernel<4>, fence_kernel<5>, fence_kernel<6>
	};
	const uint32_t iters = 20000;
	unsigned long long *res = (unsigned long long *)rig_pinned(sizeof(*res));
	uint4 *dev, *host;

	RIG_CK(cudaMalloc((void **)&dev, 4096));
	host = (uint4 *)rig_pinned(4096);
	printf(
	    "\n| fence after a 16-B store | store to device memory: ns per store+fence | store to "
	    "host memory: ns |\n|---|---|---|\n");
	for (int f = 0; f < 7; f++) {
		double ns[2];

		for (int h = 0; h < 2; h++) {
			uint4 *p = h ? host : dev;

			fk[f]<<<1, 1, 0, r->s_run>>>(p, iters, res);
			rig_sync(r->s_run, "bench kernel");
			ns[h] = (double)*res / iters;
		}
		printf("| %s | %.1f | %.1f |\n", names[f], ns[0], ns[1]);
	}
	RIG_CK(cudaFree(dev));
	cudaFreeHost(host);
	cudaFreeHost(res);
}

int main(int argc, char **argv)
{
	struct rig r;
	bool all = argc < 2;
	int err;

	setvbuf(stdout, NULL, _IOLBF, 0);
	rig_eager();
	rig_watchdog(getenv("BENCH_WATCHDOG") ? atoi(getenv("BENCH_WATCHDOG")) : 19);
	err = rig_open(&r, 2048 * MiB, 256 * MiB, 64 * MiB);
	if (err) {
		printf("provider open failed: %d\n", err);
		return 1;
	}
	for (int i = 1; i < argc || all; i++) {
		const char *p = all ? "all" : argv[i];

		if (!strcmp(p, "rate") || !strcmp(p, "all"))
			part_rate(&r, 0, "device");
		if (!strcmp(p, "hostsq") || !strcmp(p, "all")) {
#ifdef BENCH_STORE4
			part_rate(&r, UPCIE_NVME_GQP_SQ_HOSTMEM, "host, per-lane 16 x 4-B stores");
#else
			part_rate(&r, UPCIE_NVME_GQP_SQ_HOSTMEM,
				  "host, per-lane 4 x 16-B stores (default)");
			part_rate(&r, UPCIE_NVME_GQP_SQ_HOSTMEM | UPCIE_NVME_GQP_SQ_COOP_STORES,
				  "host, warp-cooperative 16-B stores");
#endif
		}
		if (!strcmp(p, "stores") || !strcmp(p, "all"))
			part_stores(&r);
		if (!strcmp(p, "mirror") || !strcmp(p, "all"))
			part_mirror(&r, false);
		if (!strcmp(p, "mirrorlat"))
			part_mirror(&r, true);
		if (!strcmp(p, "qd32") || !strcmp(p, "all"))
			part_qd32(&r);
		if (!strcmp(p, "qd"))
			part_qd(&r);
		if (!strcmp(p, "bare"))
			part_bare(&r);
		if (!strcmp(p, "l2lat") || !strcmp(p, "all"))
			part_l2lat(&r);
		if (!strcmp(p, "fence") || !strcmp(p, "all"))
			part_fence(&r);
		if (all)
			break;
	}
	rig_close(&r);
	return 0;
}
