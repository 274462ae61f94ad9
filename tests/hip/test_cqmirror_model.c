/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The HIP completion mirror's protocol and copying (gpuq/cqmirror_hip.h) on the host: the
 * wavefronts are played by upcie_nvme_cqmirror_hip_step() calls (one lane each), in an order the
 * test chooses, so every interleaving below is exact rather than hoped for; the controller is
 * the unit tests' model (a test instrument) writing the device CQ, and the CPU's queue pair
 * reads the host CQ as a user's would. One case runs the wavefronts as threads (serve()).
 *
 * Checks: commands through the mirror with data verified, out of order and wrapping; entries
 * written before a stop are all mirrored, nothing is written after the acknowledgement; a stop
 * that times out and is retried never makes the generation odd and the slot is never taken up
 * again; an attach nobody takes up is withdrawn within its bound and reclaimed when a wavefront
 * acknowledges; retire only with no slot in use, and what a kernel exit frees; bad input.
 * Built also with UPCIE_NVME_CQMIRROR_HIP_TEST_NO_DRAIN and _TEST_RETRY_BUMPS (check-hip.sh):
 * each must fail the check named for its rule. No GPU.
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/clock.h>
#include <upcie/nvme/cmd.h>
#include <upcie/gpuq/cqmirror_hip.h>
#include <upcie/nvme/qpair.h>

#include "../unit/check.h"
#include "../unit/nvme_model.h"

#define LBA   512u
#define NBLK  4096u
#define CMDB  4096u
#define MAXC  64
#define NSLOT 4

static struct upcie_nvme_cqmirror_hip_table tab_ __attribute__((aligned(4096)));
static struct upcie_nvme_cqmirror_hip_ctl ctl_;
static struct upcie_nvme_cqmirror_hip_wave wv_[NSLOT];

static void *zalloc(size_t n)
{
	void *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);

	if (p)
		memset(p, 0, n);
	return p;
}

/* One mirrored queue: SQ and device CQ the model serves, host CQ the queue pair reads. */
struct mq {
	uint32_t depth;
	struct upcie_nvme_sqe *sq;
	struct upcie_nvme_cqe *dcq, *hcq;
	uint32_t bar[2];
	uint8_t *ns, *buf;
	struct upcie_dmamem bufmem;
	struct nvme_model_iomap im;
	struct nvme_model m;
	struct upcie_nvme_qpair qp;
	int slot;
	uint32_t gen;
	unsigned ncb, nok;
};

static int mq_open(struct mq *q, uint32_t depth, uint16_t qid)
{
	struct upcie_nvme_qpair_cfg qc;
	int err;

	memset(q, 0, sizeof(*q));
	q->depth = depth;
	q->slot = -1;
	q->sq = (struct upcie_nvme_sqe *)zalloc((size_t)depth * 64);
	q->dcq = (struct upcie_nvme_cqe *)zalloc((size_t)depth * 16);
	q->hcq = (struct upcie_nvme_cqe *)zalloc((size_t)depth * 16);
	q->ns = (uint8_t *)zalloc((size_t)NBLK * LBA);
	q->buf = (uint8_t *)zalloc((size_t)2 * MAXC * CMDB);
	if (!q->sq || !q->dcq || !q->hcq || !q->ns || !q->buf)
		return -ENOMEM;
	err = upcie_dmamem_init_arith(&q->bufmem, q->buf, (size_t)2 * MAXC * CMDB,
				      (uint64_t)(uintptr_t)q->buf);
	if (err)
		return err;
	nvme_model_iomap_add(&q->im, &q->bufmem);
	if (nvme_model_init(&q->m, q->sq, depth, q->dcq, depth, qid, q->ns, NBLK, LBA, 12, &q->im))
		return -ENOMEM;
	q->m.sqdbp = &q->bar[0];
	q->m.cqdbp = &q->bar[1];
	memset(&qc, 0, sizeof(qc));
	qc.sq = q->sq;
	qc.cq = q->hcq;
	qc.sqdb = &q->bar[0];
	qc.cqdb = &q->bar[1];
	qc.sq_depth = depth;
	qc.qid = qid;
	return upcie_nvme_qpair_init(&q->qp, &qc);
}

static void mq_close(struct mq *q)
{
	upcie_nvme_qpair_fini(&q->qp);
	nvme_model_fini(&q->m);
	nvme_model_iomap_fini(&q->im);
	free(q->sq);
	free(q->dcq);
	free(q->hcq);
	free(q->ns);
	free(q->buf);
}

static int mq_attach(struct mq *q)
{
	return upcie_nvme_cqmirror_hip_ctl_attach_begin(&ctl_, (uint64_t)(uintptr_t)q->dcq,
							(uint64_t)(uintptr_t)q->hcq, q->depth,
							&q->slot, &q->gen);
}

/* Step slot s's wavefront until it has nothing to do (at most `max` rounds). */
static unsigned run_wave(int s, unsigned max)
{
	unsigned n = 0;

	while (n < max && upcie_nvme_cqmirror_hip_step(&tab_, (uint32_t)s, &wv_[s]) ==
			      UPCIE_NVME_CQMIRROR_HIP_BUSY)
		n++;
	return n;
}

static void cb_count(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct mq *q = (struct mq *)ctx;

	q->ncb++;
	q->nok += !err && upcie_nvme_cqe_ok(cqe);
}

/* n commands (write or read, 8 blocks each, buffer page i), stepped to completion. */
static bool io_batch(struct mq *q, bool write, uint64_t slba, unsigned n)
{
	uint8_t *base = q->buf + (write ? 0 : (size_t)MAXC * CMDB);
	unsigned want = q->ncb + n;

	for (unsigned i = 0; i < n; i++) {
		struct upcie_nvme_sqe sqe;
		uint64_t s = slba + (uint64_t)i * (CMDB / LBA);

		if (write)
			upcie_nvme_cmd_write(&sqe, 1, s, CMDB / LBA, 0);
		else
			upcie_nvme_cmd_read(&sqe, 1, s, CMDB / LBA, 0);
		sqe.prp1 = (uint64_t)(uintptr_t)(base + (size_t)i * CMDB);
		if (upcie_nvme_qpair_submit(&q->qp, &sqe, cb_count, q, NULL))
			return false;
	}
	for (unsigned r = 0; r < 100000 && q->ncb < want; r++) {
		nvme_model_step(&q->m);
		run_wave(q->slot, 1000);
		upcie_nvme_qpair_reap(&q->qp, 0xffffffffu);
	}
	return q->ncb == want;
}

static bool write_read(struct mq *q, uint64_t slba, unsigned n, uint8_t seed)
{
	unsigned ok0 = q->nok;

	for (size_t i = 0; i < (size_t)n * CMDB; i++)
		q->buf[i] = (uint8_t)(seed + i * 13 + (i >> 9));
	memset(q->buf + (size_t)MAXC * CMDB, 0, (size_t)n * CMDB);
	if (!io_batch(q, true, slba, n) || !io_batch(q, false, slba, n))
		return false;
	return q->nok - ok0 == 2 * n &&
	       !memcmp(q->buf, q->buf + (size_t)MAXC * CMDB, (size_t)n * CMDB);
}

/* Detach: stop stepped to its acknowledgement, release. */
static int mq_detach(struct mq *q)
{
	int err = upcie_nvme_cqmirror_hip_ctl_stop_begin(&ctl_, q->slot, q->gen);

	for (int i = 0; !err && i < 100 && !upcie_nvme_cqmirror_hip_ctl_stop_poll(&ctl_, q->slot);
	     i++)
		run_wave(q->slot, 1000);
	if (!err)
		err = upcie_nvme_cqmirror_hip_ctl_release(&ctl_, q->slot);
	return err;
}

/* A fresh table, control and wavefronts. */
static void reset_all(void)
{
	memset(&tab_, 0, sizeof(tab_));
	upcie_nvme_cqmirror_hip_ctl_init(&ctl_, &tab_, NSLOT, 20 * UPCIE_NSEC_PER_MSEC,
					 20 * UPCIE_NSEC_PER_MSEC);
	for (uint32_t s = 0; s < NSLOT; s++)
		upcie_nvme_cqmirror_hip_wave_init(&wv_[s], &tab_, s);
}

static void t_basic(void)
{
	static struct mq q;
	int err = mq_open(&q, 32, 1);
	bool ok;

	reset_all();
	if (!err)
		err = mq_attach(&q);
	CHECK(!err && q.slot == 0 && (q.gen & 1) && tab_.slot[0].gen == q.gen,
	      "attach fills slot 0 with an odd generation (%d, gen %u)", err, q.gen);
	CHECK(!upcie_nvme_cqmirror_hip_ctl_taken(&ctl_, q.slot, q.gen),
	      "not taken up before the wavefront ran");
	run_wave(q.slot, 1);
	CHECK(upcie_nvme_cqmirror_hip_ctl_taken(&ctl_, q.slot, q.gen) && wv_[0].g == q.gen &&
		  wv_[0].depth == 32,
	      "the wavefront takes it up and says so (taken = %u)", tab_.taken[0]);
	ok = write_read(&q, 8, 16, 3);
	CHECK(ok && wv_[0].copied == 32,
	      "16 writes and 16 reads through the mirror, data verified, %llu entries copied",
	      (unsigned long long)wv_[0].copied);
	CHECK(!memcmp(q.dcq, q.hcq, 32 * 16),
	      "the host CQ is the device CQ entry for entry (tags included)");
	q.m.ooo = true;
	q.m.delay = 3;
	ok = true;
	for (unsigned r = 0; r < 6; r++)
		ok = ok && write_read(&q, 256 + r * 32 * 8, 24, (uint8_t)(r + 11));
	CHECK(ok && q.ncb == 32 + 288 && q.qp.nbad == 0,
	      "6 rounds of 24 + 24, out of order and delayed, wrapping the depth-32 CQs 9 times: "
	      "%u callbacks, data verified, no bad entry",
	      q.ncb);
	err = mq_detach(&q);
	CHECK(!err && tab_.ack[0] == q.gen && (tab_.slot[0].gen & 1) == 0 &&
		  !upcie_nvme_cqmirror_hip_ctl_busy(&ctl_),
	      "detach: acknowledged generation %u, slot free (%d)", tab_.ack[0], err);
	mq_close(&q);
}

static void t_multi(void)
{
	static struct mq q[3];
	unsigned nok = 0;
	int nopen = 0;

	reset_all();
	for (int i = 0; i < 3; i++)
		nopen += !mq_open(&q[i], 16, (uint16_t)(2 + i)) && !mq_attach(&q[i]);
	CHECK(nopen == 3 && q[0].slot == 0 && q[1].slot == 1 && q[2].slot == 2,
	      "3 queues on slots 0, 1, 2");
	for (int r = 0; r < 4 && nopen == 3; r++)
		for (int i = 0; i < 3; i++)
			nok += write_read(&q[i], 64 + (uint64_t)(r * 3 + i) * 64, 8,
					  (uint8_t)(r * 3 + i));
	CHECK(nok == 12, "4 rounds on each, interleaved: data verified in %u of 12", nok);
	for (int i = 0; i < 3; i++) {
		CHECK(!mq_detach(&q[i]), "queue %d detached", i);
		mq_close(&q[i]);
	}
}

static void cb_note(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	unsigned *n = (unsigned *)ctx;

	(void)cqe;
	if (err == -ECANCELED)
		n[1]++;
	else
		n[0]++;
}

/* Entries written before a stop are mirrored; nothing is written after the acknowledgement. */
static void t_stop_under_traffic(void)
{
	static struct mq q;
	static uint8_t snap[64 * 16];
	unsigned n[2] = { 0, 0 }, landed = 0;
	uint64_t posted;
	int err = mq_open(&q, 64, 5);

	reset_all();
	if (!err)
		err = mq_attach(&q);
	run_wave(q.slot, 1);
	for (unsigned i = 0; !err && i < 40; i++) {
		struct upcie_nvme_sqe sqe;

		upcie_nvme_cmd_flush(&sqe, 1);
		err = upcie_nvme_qpair_submit(&q.qp, &sqe, cb_note, n, NULL);
	}
	q.m.post_max = 12; /* 12 completions a step: the controller is mid-stream */
	nvme_model_step(&q.m);
	upcie_nvme_cqmirror_hip_step(&tab_, (uint32_t)q.slot, &wv_[q.slot]); /* copies one */
	nvme_model_step(&q.m);
	for (unsigned i = 0; i < 64; i++)
		landed += ((q.dcq[i].dw3 >> 16) & 1u) == 1;
	err = err ? err : upcie_nvme_cqmirror_hip_ctl_stop_begin(&ctl_, q.slot, q.gen);
	nvme_model_step(&q.m); /* more arrive after the stop */
	while (!err && !upcie_nvme_cqmirror_hip_ctl_stop_poll(&ctl_, q.slot))
		if (upcie_nvme_cqmirror_hip_step(&tab_, (uint32_t)q.slot, &wv_[q.slot]) !=
		    UPCIE_NVME_CQMIRROR_HIP_BUSY)
			break;
	{
		unsigned mirrored = 0;
		bool same = true;

		for (unsigned i = 0; i < 64; i++) {
			bool t = ((q.hcq[i].dw3 >> 16) & 1u) == 1;

			mirrored += t;
			if (t && memcmp(&q.hcq[i], &q.dcq[i], 16))
				same = false;
		}
		CHECK(!err && landed == 24 && mirrored >= landed && same,
		      "stop under traffic: every entry written before the stop is mirrored "
		      "(%u landed before, %u mirrored, identical: %d)",
		      landed, mirrored, same);
		CHECK(upcie_nvme_cqmirror_hip_ctl_stop_poll(&ctl_, q.slot) &&
			  tab_.ack[q.slot] == q.gen,
		      "stop under traffic: acknowledged generation %u", tab_.ack[q.slot]);
	}
	memcpy(snap, q.hcq, sizeof(snap));
	posted = q.m.posted;
	for (int r = 0; r < 4; r++) {
		nvme_model_step(&q.m);
		run_wave(q.slot, 100);
	}
	CHECK(!memcmp(snap, q.hcq, sizeof(snap)) && q.m.posted == 40 && posted < 40,
	      "stop under traffic: nothing written to the host CQ after the acknowledgement while "
	      "the controller posted %llu more",
	      (unsigned long long)(q.m.posted - posted));
	/* The owner reaps what was mirrored, then the queue goes away: every command ends once. */
	upcie_nvme_qpair_reap(&q.qp, 0xffffffffu);
	upcie_nvme_qpair_fini(&q.qp);
	CHECK(n[0] + n[1] == 40 && n[0] >= 24,
	      "stop under traffic: 40 commands, each ended once (%u completed, %u cancelled)", n[0],
	      n[1]);
	upcie_nvme_cqmirror_hip_ctl_release(&ctl_, q.slot);
	mq_close(&q);
}

/* A stop that times out and is retried never hands the slot back to the wavefront. */
static void t_stop_retry(void)
{
	static struct mq q;
	uint64_t t0, dt;
	int err = mq_open(&q, 16, 6), e1 = 0, e2 = 0, e3 = 0;
	uint32_t g1, g2, g3;

	reset_all();
	if (!err)
		err = mq_attach(&q);
	run_wave(q.slot, 1);
	CHECK(!err && write_read(&q, 8, 4, 7), "retry: queue served, data verified");
	/* The wavefront is stuck (not stepped): the stop times out, twice. */
	t0 = upcie_time_ns();
	e1 = upcie_nvme_cqmirror_hip_ctl_stop(&ctl_, q.slot, q.gen);
	dt = upcie_time_ns() - t0;
	g1 = tab_.slot[q.slot].gen;
	e2 = upcie_nvme_cqmirror_hip_ctl_stop(&ctl_, q.slot, q.gen);
	g2 = tab_.slot[q.slot].gen;
	CHECK(e1 == -ETIMEDOUT && dt < UPCIE_NSEC_PER_SEC,
	      "retry: a stuck wavefront's stop times out within its bound (%d after %llu ms)", e1,
	      (unsigned long long)(dt / UPCIE_NSEC_PER_MSEC));
	CHECK(e2 == -ETIMEDOUT && g1 == q.gen + 1 && g2 == q.gen + 1,
	      "retry: the retried stop leaves the generation even (%u, %u after generation %u): "
	      "the slot is never re-attached",
	      g1, g2, q.gen);
	/* Unstuck: the wavefront drains, acknowledges, and does not take the slot up again. */
	run_wave(q.slot, 100);
	run_wave(q.slot, 100);
	e3 = upcie_nvme_cqmirror_hip_ctl_stop(&ctl_, q.slot, q.gen);
	g3 = tab_.slot[q.slot].gen;
	CHECK(e3 == 0 && tab_.taken[q.slot] == q.gen && tab_.ack[q.slot] == q.gen && !(g3 & 1) &&
		  wv_[q.slot].g == 0,
	      "retry: once the wavefront runs, the third stop returns 0; taken stays %u, the "
	      "wavefront serves nothing (%d)",
	      tab_.taken[q.slot], e3);
	CHECK(upcie_nvme_cqmirror_hip_ctl_release(&ctl_, q.slot) == 0, "retry: slot released");
	mq_close(&q);
}

/* An attach nobody takes up (the wavefront never became resident). */
static void t_not_resident(void)
{
	static struct mq q;
	uint64_t t0, dt;
	int err = mq_open(&q, 16, 7);
	bool back;

	reset_all();
	t0 = upcie_time_ns();
	if (!err)
		err = upcie_nvme_cqmirror_hip_ctl_attach(&ctl_, (uint64_t)(uintptr_t)q.dcq,
							 (uint64_t)(uintptr_t)q.hcq, 16, &q.slot,
							 &q.gen);
	dt = upcie_time_ns() - t0;
	CHECK(err == -ETIMEDOUT && dt < UPCIE_NSEC_PER_SEC &&
		  ctl_.state[0] == UPCIE_NVME_CQMIRROR_HIP_ORPHAN && !(tab_.slot[0].gen & 1),
	      "not resident: attach gives up within its bound (%d after %llu ms), withdrawn "
	      "(even generation), the slot held",
	      err, (unsigned long long)(dt / UPCIE_NSEC_PER_MSEC));
	back = upcie_nvme_cqmirror_hip_ctl_reclaim(&ctl_, 0);
	CHECK(!back && upcie_nvme_cqmirror_hip_ctl_busy(&ctl_),
	      "not resident: the orphan is not reclaimed before a wavefront answers");
	CHECK(upcie_nvme_cqmirror_hip_ctl_retire(&ctl_) == -EBUSY,
	      "not resident: retire refused while the orphan is held");
	/* The wavefront finally runs: it acknowledges without taking the slot up. */
	run_wave(0, 10);
	back = upcie_nvme_cqmirror_hip_ctl_reclaim(&ctl_, 0);
	CHECK(back && tab_.taken[0] != tab_.slot[0].gen - 1 && wv_[0].g == 0 &&
		  !upcie_nvme_cqmirror_hip_ctl_busy(&ctl_),
	      "not resident: a late wavefront acknowledges generation %u without serving it; the "
	      "slot is reclaimed",
	      tab_.ack[0]);
	/* Taken up just after the attach gave up: it drains and acknowledges. */
	err = mq_attach(&q);
	run_wave(q.slot, 1);
	upcie_nvme_cqmirror_hip_ctl_withdraw(&ctl_, q.slot);
	run_wave(q.slot, 10);
	CHECK(!err && upcie_nvme_cqmirror_hip_ctl_reclaim(&ctl_, q.slot) &&
		  tab_.taken[q.slot] == q.gen,
	      "not resident: a withdrawal racing the take-up is acknowledged and reclaimed");
	mq_close(&q);
}

/* Retire only with nothing in use; a kernel exit settles every slot. */
static void t_retire(void)
{
	static struct mq q[2];
	uint64_t orphans;
	int e0 = 0, e1 = 0;

	reset_all();
	e0 = mq_open(&q[0], 8, 8) || mq_attach(&q[0]);
	e1 = mq_open(&q[1], 8, 9) || mq_attach(&q[1]);
	run_wave(q[0].slot, 1); /* slot 1's wavefront never runs */
	CHECK(!e0 && !e1 && upcie_nvme_cqmirror_hip_ctl_retire(&ctl_) == -EBUSY && !tab_.stop,
	      "retire is refused while slots are in use");
	upcie_nvme_cqmirror_hip_ctl_withdraw(&ctl_, q[1].slot);
	upcie_nvme_cqmirror_hip_ctl_stop_begin(&ctl_, q[0].slot, q[0].gen);
	/* The kernel is torn down from outside (a stuck wavefront, the process ending): it has
	 * exited, so nothing touches the CQs; the orphan's memory is the caller's to free. */
	orphans = upcie_nvme_cqmirror_hip_ctl_exited(&ctl_);
	CHECK(orphans == (UINT64_C(1) << q[1].slot) &&
		  ctl_.state[q[0].slot] == UPCIE_NVME_CQMIRROR_HIP_STOPPED && !tab_.stop,
	      "after the kernel exited: the orphan is freed (mask 0x%llx), the stopping slot is "
	      "stopped for its owner",
	      (unsigned long long)orphans);
	CHECK(!upcie_nvme_cqmirror_hip_ctl_release(&ctl_, q[0].slot) &&
		  !upcie_nvme_cqmirror_hip_ctl_retire(&ctl_) && tab_.stop,
	      "with every slot free, retire sets the stop flag");
	/* A next launch's wavefronts, started on this table: each returns at once. */
	for (uint32_t s = 0; s < NSLOT; s++)
		upcie_nvme_cqmirror_hip_wave_init(&wv_[s], &tab_, s);
	CHECK(upcie_nvme_cqmirror_hip_step(&tab_, 0, &wv_[0]) == UPCIE_NVME_CQMIRROR_HIP_STOP &&
		  upcie_nvme_cqmirror_hip_step(&tab_, 1, &wv_[1]) == UPCIE_NVME_CQMIRROR_HIP_STOP,
	      "idle wavefronts return on the stop flag");
	mq_close(&q[0]);
	mq_close(&q[1]);
}

static void t_bad(void)
{
	static struct mq q;
	int s = -1, err;
	uint32_t g = 0;

	reset_all();
	mq_open(&q, 8, 10);
	CHECK(upcie_nvme_cqmirror_hip_ctl_init(&ctl_, &tab_, 65, 0, 0) == -EINVAL &&
		  upcie_nvme_cqmirror_hip_ctl_init(&ctl_, &tab_, 0, 0, 0) == -EINVAL,
	      "init refuses 0 or more than 64 slots");
	reset_all();
	CHECK(upcie_nvme_cqmirror_hip_ctl_attach_begin(&ctl_, 1, 2, 1, &s, &g) == -EINVAL &&
		  upcie_nvme_cqmirror_hip_ctl_attach_begin(&ctl_, 1, 2, 65537, &s, &g) == -EINVAL &&
		  upcie_nvme_cqmirror_hip_ctl_attach_begin(&ctl_, 0, 2, 8, &s, &g) == -EINVAL,
	      "attach refuses depth 1 or 65537 and a missing CQ");
	for (int i = 0; i < NSLOT; i++)
		upcie_nvme_cqmirror_hip_ctl_attach_begin(&ctl_, (uint64_t)(uintptr_t)q.dcq,
							 (uint64_t)(uintptr_t)q.hcq, 8, &s, &g);
	err = upcie_nvme_cqmirror_hip_ctl_attach_begin(&ctl_, (uint64_t)(uintptr_t)q.dcq,
						       (uint64_t)(uintptr_t)q.hcq, 8, &s, &g);
	CHECK(err == -ENOSPC, "a fifth attach on 4 slots: -ENOSPC (%d)", err);
	CHECK(upcie_nvme_cqmirror_hip_ctl_stop_begin(&ctl_, 0, 3) == -EINVAL &&
		  upcie_nvme_cqmirror_hip_ctl_stop_begin(&ctl_, 9, 1) == -EINVAL &&
		  upcie_nvme_cqmirror_hip_ctl_release(&ctl_, 0) == -EBUSY,
	      "stop of a generation the slot never had, of a slot beyond the table, release of a "
	      "live slot: refused");
	mq_close(&q);
}

struct server {
	uint32_t s;
	pthread_t t;
};

static void *server_main(void *arg)
{
	struct server *sv = (struct server *)arg;

	upcie_nvme_cqmirror_hip_serve(&tab_, sv->s);
	return NULL;
}

/* Wavefronts as threads (serve()), the controller model as a thread, the owner reaping. */
static void t_threads(void)
{
	static struct mq q[2];
	struct server sv[NSLOT];
	unsigned nok = 0;
	bool all = true;

	reset_all();
	for (uint32_t s = 0; s < NSLOT; s++) {
		sv[s].s = s;
		all = all && !pthread_create(&sv[s].t, NULL, server_main, &sv[s]);
	}
	for (int i = 0; i < 2; i++)
		all = all && !mq_open(&q[i], 32, (uint16_t)(11 + i)) &&
		      !upcie_nvme_cqmirror_hip_ctl_attach(&ctl_, (uint64_t)(uintptr_t)q[i].dcq,
							  (uint64_t)(uintptr_t)q[i].hcq, 32,
							  &q[i].slot, &q[i].gen) &&
		      !nvme_model_start(&q[i].m);
	CHECK(all, "threads: 4 serving threads, 2 queues attached (taken up), 2 controllers");
	for (int r = 0; all && r < 20; r++)
		for (int i = 0; i < 2; i++) {
			struct upcie_nvme_sqe sqe;
			unsigned want = q[i].ncb + 24;

			for (unsigned k = 0; k < 24; k++) {
				upcie_nvme_cmd_write(&sqe, 1, (uint64_t)k * 8, 8, 0);
				sqe.prp1 = (uint64_t)(uintptr_t)(q[i].buf + (size_t)k * CMDB);
				upcie_nvme_qpair_submit(&q[i].qp, &sqe, cb_count, &q[i], NULL);
			}
			for (uint64_t t0 = upcie_time_ns();
			     q[i].ncb < want && upcie_time_ns() - t0 < UPCIE_NSEC_PER_SEC;)
				if (upcie_nvme_qpair_reap(&q[i].qp, 0xffffffffu) <= 0)
					upcie_cpu_relax();
			nok += q[i].ncb == want;
		}
	CHECK(nok == 40, "threads: 20 rounds of 24 commands on 2 queues, %u of 40 complete", nok);
	for (int i = 0; i < 2; i++) {
		if (q[i].m.pend)
			nvme_model_stop(&q[i].m);
		CHECK(all && !upcie_nvme_cqmirror_hip_ctl_stop(&ctl_, q[i].slot, q[i].gen) &&
			  !upcie_nvme_cqmirror_hip_ctl_release(&ctl_, q[i].slot),
		      "threads: queue %d detached", i);
		mq_close(&q[i]);
	}
	CHECK(!upcie_nvme_cqmirror_hip_ctl_retire(&ctl_), "threads: retired");
	for (uint32_t s = 0; s < NSLOT; s++)
		pthread_join(sv[s].t, NULL);
	upcie_nvme_cqmirror_hip_ctl_exited(&ctl_);
	CHECK(!tab_.stop, "threads: every serving thread returned");
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	t_basic();
	t_multi();
	t_stop_under_traffic();
	t_stop_retry();
	t_not_resident();
	t_retire();
	t_bad();
	t_threads();
	return check_done();
}
