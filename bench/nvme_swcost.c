/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Software cost of the upcie NVMe I/O path on the CPU: build a 4 KiB Read, fill its PRP, enqueue,
 * ring, reap, run the completion callback. The "controller" is a minimal in-process responder
 * that turns each new SQE into a successful CQE (same thread, no data movement), so what is
 * measured is the driver's own work plus the responder's; the responder is also timed alone and
 * subtracted.
 *
 *   nvme_swcost [--ios N] [--runs R] [--qd Q]...
 *     default: QD 1, 32, 128; N = 4,000,000 IOs per run; best of R = 5 runs.
 *   nvme_swcost --ios N --qd Q --once
 *     exactly N IOs at QD Q, no timing: for valgrind --tool=callgrind. Everything but the
 *     responder (bench_respond, inclusive) is the driver's cost: the I/O loop (run_ios), the
 *     driver functions (bench_submit per command, bench_reap per round), the callback (bench_cb).
 *
 * Build options: -DBENCH_INLINE inlines bench_submit and bench_reap into the loop, as a real
 * driver's loop inlines the header functions; -DBENCH_COPY builds the command on the stack and
 * copies it (prp_build_buf + enqueue) instead of building it in the SQ slot (prp_mem + commit).
 */
#include <upcie/nvme/cmd.h>
#include <upcie/nvme/prp.h>
#include <upcie/nvme/qpair.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -DBENCH_INLINE folds the driver functions into the I/O loop (callgrind then attributes them to
 * run_ios: count program minus responder). */
#ifdef BENCH_INLINE
#define BENCH_DRIVER_FN __attribute__((always_inline)) inline
#else
#define BENCH_DRIVER_FN __attribute__((noinline))
#endif

#define DEPTH 256 /* ring entries; QD up to 255 */
#define NBUF  128 /* distinct 4 KiB buffers cycled through */

struct responder {
	struct upcie_nvme_sqe *sq;
	struct upcie_nvme_cqe *cq;
	volatile uint32_t *sqdb;
	uint32_t head, tail, phase;
};

/* The controller stand-in: one CQE per new SQE, in order, success. */
__attribute__((noinline)) static void bench_respond(struct responder *r)
{
	uint32_t db = *r->sqdb;

	while (r->head != db) {
		struct upcie_nvme_cqe *e = &r->cq[r->tail];
		uint16_t cid = r->sq[r->head].cid;

		r->head = r->head + 1 == DEPTH ? 0 : r->head + 1;
		e->dw0 = 0;
		e->dw2 = r->head | (1u << 16);
		__atomic_store_n(&e->dw3, cid | (r->phase << 16), __ATOMIC_RELEASE);
		if (++r->tail == DEPTH) {
			r->tail = 0;
			r->phase ^= 1;
		}
	}
}

struct bench {
	struct upcie_nvme_qpair qp;
	struct responder rsp;
	struct upcie_dmamem data;
	struct upcie_nvme_dptr_cfg cfg;
	struct upcie_nvme_prp_mem pm; /* data memory checked once against cfg */
	uint64_t lut[4];
	uint32_t sqdb, cqdb;
	uint64_t done; /* successful completions, counted by the callback */
	void *sq, *cq;
};

__attribute__((noinline)) static void bench_cb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct bench *b = (struct bench *)ctx;

	if (err == 0 && upcie_nvme_cqe_ok(cqe))
		b->done++;
}

/* Report a failure of the I/O loop (out of line: the loop only branches here). Returns -1. */
__attribute__((noinline, cold)) static int bench_fail(const char *what, uint64_t val)
{
	fprintf(stderr, "nvme_swcost: %s failed (%llu)\n", what, (unsigned long long)val);
	return -1;
}

/*
 * Driver side, part 1: build read number `seq` and enqueue it (no ring). By default the command
 * is built in place in the SQ slot and committed, its PRP filled from a data memory checked once
 * (upcie_nvme_prp_mem_build()). -DBENCH_COPY uses the copying path instead: build on the stack,
 * upcie_nvme_prp_build_buf() (config checked per call), upcie_nvme_qpair_enqueue() (64-byte copy).
 */
BENCH_DRIVER_FN static int bench_submit(struct bench *b, uint64_t seq)
{
	/* LBA and buffer cycle through 128 slots: cache-resident, like a busy driver. */
	uint64_t k = seq & (NBUF - 1);
#ifdef BENCH_COPY
	struct upcie_nvme_sqe sqe;

	if (upcie_nvme_cmd_read(&sqe, 1, k * 8, 8, 0) ||
	    upcie_nvme_prp_build_buf(&sqe, &b->data, k * 4096, 4096, &b->cfg, NULL) ||
	    upcie_nvme_qpair_enqueue(&b->qp, &sqe, bench_cb, b, NULL))
		return -1;
#else
	struct upcie_nvme_sqe *sqe = upcie_nvme_qpair_sqe_slot(&b->qp);

	if (upcie_nvme_cmd_read(sqe, 1, k * 8, 8, 0) ||
	    upcie_nvme_prp_mem_build(sqe, &b->pm, k * 4096, 4096, NULL) ||
	    upcie_nvme_qpair_commit(&b->qp, bench_cb, b, NULL))
		return -1;
#endif
	return 0;
}

/* Driver side, part 2: reap everything that is there (callbacks included, one CQ doorbell). */
BENCH_DRIVER_FN static int bench_reap(struct bench *b)
{
	return upcie_nvme_qpair_reap(&b->qp, DEPTH);
}

static int bench_init(struct bench *b)
{
	struct upcie_nvme_qpair_cfg qc;

	memset(b, 0, sizeof(*b));
	b->sq = aligned_alloc(4096, DEPTH * 64);
	b->cq = aligned_alloc(4096, DEPTH * 16);
	if (!b->sq || !b->cq)
		return -1;
	memset(b->sq, 0, DEPTH * 64);
	/* Data in 2 MiB "hugepages" at scattered bus addresses: the LUT translator path. */
	for (int i = 0; i < 4; i++)
		b->lut[i] = UINT64_C(0x100000000) + (uint64_t)(3 - i) * (UINT64_C(1) << 21);
	if (upcie_dmamem_init_lut(&b->data, NULL, 4 << 21, 21, b->lut, false))
		return -1;
	b->cfg.page_shift = 12;
	b->cfg.max_bytes = 512 * 1024;
	if (upcie_nvme_prp_mem_init(&b->pm, &b->data, &b->cfg))
		return -1;
	memset(&qc, 0, sizeof(qc));
	qc.sq = b->sq;
	qc.cq = b->cq;
	qc.sqdb = &b->sqdb;
	qc.cqdb = &b->cqdb;
	qc.sq_depth = DEPTH;
	qc.qid = 1;
	if (upcie_nvme_qpair_init(&b->qp, &qc))
		return -1;
	b->rsp.sq = (struct upcie_nvme_sqe *)b->sq;
	b->rsp.cq = (struct upcie_nvme_cqe *)b->cq;
	b->rsp.sqdb = &b->sqdb;
	b->rsp.phase = 1;
	return 0;
}

static void bench_fini(struct bench *b)
{
	upcie_nvme_qpair_fini(&b->qp);
	upcie_dmamem_destroy(&b->data);
	free(b->sq);
	free(b->cq);
}

/*
 * Run `ios` reads at queue depth `qd`: submit qd, then per round ring, let the responder answer,
 * reap what it answered (every completion goes through bench_cb) and submit as many new reads as
 * completed (fewer at the end, so that exactly `ios` are submitted). A round that reaps nothing
 * ends the run: with this responder that happens exactly when nothing is outstanding any more.
 * Returns 0 when all `ios` completed successfully.
 */
static int run_ios(struct bench *b, uint64_t ios, unsigned qd)
{
	/* Reads still to submit, counting down (the next one is number todo - 1); submit while
	 * todo > stop. */
	uint64_t todo = ios, stop = ios > qd ? ios - qd : 0;

	for (;;) {
		int n;

		if (todo > stop) {
			if (bench_submit(b, --todo))
				return bench_fail("build/enqueue", todo);
			continue;
		}
		upcie_nvme_qpair_ring(&b->qp); /* one doorbell write for the batch */
		bench_respond(&b->rsp);
		n = bench_reap(b);
		if (n <= 0) {
			if (n < 0)
				return bench_fail("reap", (uint64_t)n);
			break; /* nothing was outstanding */
		}
		stop = todo > (unsigned)n ? todo - (unsigned)n : 0;
	}
	return b->done == ios ? 0 : -1;
}

/* The responder alone over the same volume: SQEs stay in the ring, the doorbell is moved by
 * hand in the same batch sizes, nobody reaps. */
static double responder_alone_ns(uint64_t ios, unsigned qd)
{
	struct bench b;
	uint64_t t0, t1, n = 0;

	bench_init(&b);
	for (unsigned i = 0; i < DEPTH - 1; i++)
		bench_submit(&b, i);
	upcie_nvme_qpair_ring(&b.qp);
	b.sqdb = 0;
	t0 = upcie_time_ns();
	while (n < ios) {
		b.sqdb = (b.sqdb + qd) % DEPTH;
		bench_respond(&b.rsp);
		n += qd;
	}
	t1 = upcie_time_ns();
	bench_fini(&b);
	return (double)(t1 - t0) / (double)n;
}

int main(int argc, char **argv)
{
	unsigned qds[8] = { 1, 32, 128 }, nqd = 3, runs = 5;
	uint64_t ios = 4000000;
	int once = 0, user_qd = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--ios") && i + 1 < argc)
			ios = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
			runs = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--qd") && i + 1 < argc && user_qd < 8)
			qds[user_qd++] = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--once"))
			once = 1;
		else {
			fprintf(stderr, "usage: %s [--ios N] [--runs R] [--qd Q]... [--once]\n",
				argv[0]);
			return 2;
		}
	}
	if (user_qd)
		nqd = (unsigned)user_qd;
	for (unsigned q = 0; q < nqd; q++) {
		if (!qds[q] || qds[q] >= DEPTH) {
			fprintf(stderr, "QD must be 1..%d\n", DEPTH - 1);
			return 2;
		}
	}
	if (once) {
		struct bench b;
		int err;

		if (bench_init(&b))
			return 1;
		err = run_ios(&b, ios, qds[0]);
		printf("qd %u: %llu IOs %s\n", qds[0], (unsigned long long)b.done,
		       err ? "FAILED" : "ok");
		bench_fini(&b);
		return err ? 1 : 0;
	}
	printf("# 4 KiB read, PRP from a LUT dmamem, in-process responder; best of %u runs of %llu "
	       "IOs\n",
	       runs, (unsigned long long)ios);
	printf("# %4s %12s %14s %12s\n", "qd", "total ns/IO", "responder ns", "driver ns/IO");
	for (unsigned q = 0; q < nqd; q++) {
		double best = 1e30, rbest = 1e30;

		for (unsigned r = 0; r < runs; r++) {
			struct bench b;
			uint64_t t0, t1;
			double ns, rns;

			if (bench_init(&b))
				return 1;
			t0 = upcie_time_ns();
			if (run_ios(&b, ios, qds[q])) {
				fprintf(stderr, "run failed\n");
				return 1;
			}
			t1 = upcie_time_ns();
			bench_fini(&b);
			ns = (double)(t1 - t0) / (double)ios;
			best = ns < best ? ns : best;
			rns = responder_alone_ns(ios, qds[q]);
			rbest = rns < rbest ? rns : rbest;
		}
		printf("  %4u %12.1f %14.1f %12.1f\n", qds[q], best, rbest, best - rbest);
	}
	return 0;
}
