/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Host-thread test of the HIP doorbell bridge and completion relay (gpuq/bridge_hip.h) with the
 * HIP device layer's queue code (gpuq/gqp_hip.h, compiled as C) played by CPU threads, against
 * the in-process controller model of tests/unit (a test instrument, not a controller: the guest
 * case hip_bridge runs the same against QEMU's NVMe). The model's doorbell "registers" are
 * words in a fake BAR page that only the bridge writes.
 *
 * Checks: one I/O with data; a depth-8 queue wrapped by batches of 6 across 6 launches (the
 * SQ doorbell trace must be exactly 6 4 2 0 6 4); 4 queues at once; no doorbell write while
 * nothing changes; an out-of-range shadow value counted, not written; a dropped completion
 * ending the device-side wait at the cap (not at the much longer timeout asked for) with the
 * command cancelled; a wait without a clock rate refused. No GPU, no root.
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/gpuq/bridge_hip.h>
#include <upcie/nvme/cmd.h>
#include <upcie/gpuq/gqp_hip.h>

#include "../unit/check.h"
#include "../unit/nvme_model.h"

#define LBA	 512u
#define NBLK	 4096u
#define CMDB	 4096u
#define MAXC	 32
#define TRACECAP 256

struct q {
	uint32_t depth;
	struct upcie_nvme_sqe *sq;
	struct upcie_nvme_cqe *cq, *shadow;
	struct upcie_nvme_bridge_cells cells;
	uint32_t bar[2]; /* the fake doorbell registers: SQ tail, CQ head */
	uint8_t *ns, *buf;
	struct upcie_dmamem bufmem;
	struct nvme_model_iomap im;
	struct nvme_model m;
	struct upcie_nvme_gqp_hip g;
	struct upcie_nvme_bridge br;
	struct upcie_nvme_bridge_write trace[TRACECAP];
	uint32_t rings[TRACECAP];
	uint32_t nrings;
};

static void *zalloc(size_t align, size_t n)
{
	void *p = aligned_alloc(align, (n + align - 1) / align * align);

	if (p)
		memset(p, 0, n);
	return p;
}

static int q_open(struct q *q, uint32_t depth, uint16_t qid, bool thread)
{
	struct upcie_nvme_qpair_cfg qc;
	struct upcie_nvme_bridge_cfg bc;
	int err;

	memset(q, 0, sizeof(*q));
	q->depth = depth;
	q->sq = (struct upcie_nvme_sqe *)zalloc(4096, (size_t)depth * 64);
	q->cq = (struct upcie_nvme_cqe *)zalloc(4096, (size_t)depth * 16);
	q->shadow = (struct upcie_nvme_cqe *)zalloc(4096, (size_t)depth * 16);
	q->ns = (uint8_t *)zalloc(4096, (size_t)NBLK * LBA);
	q->buf = (uint8_t *)zalloc(4096, (size_t)2 * MAXC * CMDB);
	if (!q->sq || !q->cq || !q->shadow || !q->ns || !q->buf)
		return -ENOMEM;
	/* device address = CPU address, as a model sees it */
	err = upcie_dmamem_init_arith(&q->bufmem, q->buf, (size_t)2 * MAXC * CMDB,
				      (uint64_t)(uintptr_t)q->buf);
	if (err)
		return err;
	nvme_model_iomap_add(&q->im, &q->bufmem);
	if (nvme_model_init(&q->m, q->sq, depth, q->cq, depth, qid, q->ns, NBLK, LBA, 12, &q->im))
		return -ENOMEM;
	q->m.sqdbp = &q->bar[0];
	q->m.cqdbp = &q->bar[1];
	memset(&qc, 0, sizeof(qc));
	qc.sq = q->sq;
	qc.cq = q->shadow;
	qc.sqdb = &q->cells.sq_tail;
	qc.cqdb = &q->cells.cq_head;
	qc.sq_depth = depth;
	qc.qid = qid;
	err = upcie_nvme_qpair_init(&q->g.qp, &qc);
	if (err)
		return err;
	q->g.wall_khz = UPCIE_NVME_GQP_HIP_HOST_KHZ;
	memset(&bc, 0, sizeof(bc));
	bc.qid = qid;
	bc.depth = depth;
	bc.sqdb = &q->bar[0];
	bc.cqdb = &q->bar[1];
	bc.sq_cell = &q->cells.sq_tail;
	bc.cq_cell = &q->cells.cq_head;
	bc.cq = q->cq;
	bc.cq_shadow = q->shadow;
	bc.trace = q->trace;
	bc.trace_cap = TRACECAP;
	bc.flags = thread ? 0 : UPCIE_NVME_BRIDGE_MANUAL;
	err = upcie_nvme_bridge_start(&q->br, &bc);
	if (!err)
		err = nvme_model_start(&q->m);
	return err;
}

static void q_close(struct q *q)
{
	if (q->m.pend)
		nvme_model_stop(&q->m);
	upcie_nvme_bridge_stop(&q->br, NULL);
	upcie_nvme_qpair_fini(&q->g.qp);
	nvme_model_fini(&q->m);
	nvme_model_iomap_fini(&q->im);
	free(q->sq);
	free(q->cq);
	free(q->shadow);
	free(q->ns);
	free(q->buf);
}

/* One "launch": n commands (write or read, 8 blocks each) from buffer page `first` on. */
struct launch {
	struct q *q;
	bool write;
	uint64_t slba;
	unsigned first, n, ok;
	int err;
};

static void *launch_main(void *arg)
{
	struct launch *l = (struct launch *)arg;
	struct upcie_nvme_gqp_hip_cpl cpl[MAXC];
	uint16_t cid[MAXC];
	uint8_t *base = l->q->buf + (l->write ? 0 : (size_t)MAXC * CMDB);

	l->ok = 0;
	l->err = 0;
	for (unsigned i = 0; i < l->n; i++) {
		struct upcie_nvme_sqe sqe;
		uint64_t s = l->slba + (uint64_t)i * (CMDB / LBA);

		if (l->write)
			upcie_nvme_cmd_write(&sqe, 1, s, CMDB / LBA, 0);
		else
			upcie_nvme_cmd_read(&sqe, 1, s, CMDB / LBA, 0);
		sqe.prp1 = (uint64_t)(uintptr_t)(base + (size_t)(l->first + i) * CMDB);
		if (upcie_nvme_gqp_hip_enqueue(&l->q->g, &sqe, &cpl[i], &cid[i])) {
			l->err = -EBUSY;
			l->n = i;
			break;
		}
	}
	upcie_nvme_gqp_hip_ring(&l->q->g);
	l->q->rings[l->q->nrings++] = l->q->g.qp.sq_tail;
	for (unsigned i = 0; i < l->n; i++)
		if (!upcie_nvme_gqp_hip_wait(&l->q->g, cid[i], &cpl[i], UPCIE_NSEC_PER_SEC) &&
		    upcie_nvme_cqe_ok(&cpl[i].cqe))
			l->ok++;
	return NULL;
}

static int launch(struct launch *l)
{
	pthread_t t;

	if (pthread_create(&t, NULL, launch_main, l))
		return -EAGAIN;
	pthread_join(t, NULL);
	return l->ok == l->n ? 0 : -EIO;
}

/* write then read back n commands at slba, compare */
static bool write_read(struct q *q, uint64_t slba, unsigned n, uint8_t seed)
{
	struct launch w = { q, true, slba, 0, n, 0, 0 }, r = { q, false, slba, 0, n, 0, 0 };

	for (size_t i = 0; i < (size_t)n * CMDB; i++)
		q->buf[i] = (uint8_t)(seed + i * 7 + (i >> 9));
	memset(q->buf + (size_t)MAXC * CMDB, 0, (size_t)n * CMDB);
	if (launch(&w) || launch(&r))
		return false;
	return !memcmp(q->buf, q->buf + (size_t)MAXC * CMDB, (size_t)n * CMDB);
}

/* Trace: SQ writes == rings in order, no value twice in a row, CQ head caught up. */
static bool trace_ok(struct q *q, char *why, size_t len)
{
	struct upcie_nvme_bridge_stats st;
	uint32_t nsq = 0, psq = UINT32_MAX, pcq = UINT32_MAX;

	for (int i = 0; i < 1000; i++) {
		upcie_nvme_bridge_stats_get(&q->br, &st);
		if (st.cq_last == q->g.qp.cq_head)
			break;
		upcie_sleep_ns(UPCIE_NSEC_PER_MSEC);
	}
	for (uint64_t i = 0; i < st.ntrace && i < TRACECAP; i++) {
		const struct upcie_nvme_bridge_write *w = &q->trace[i];

		if (w->cq) {
			if (w->value == pcq)
				return snprintf(why, len, "CQ head %u twice", w->value), false;
			pcq = w->value;
			continue;
		}
		if (w->value == psq || nsq >= q->nrings || q->rings[nsq] != w->value)
			return snprintf(why, len, "SQ write %u: %u", nsq, w->value), false;
		psq = w->value;
		nsq++;
	}
	snprintf(why, len, "%u SQ writes for %u rings, %llu CQ writes, %llu rounds", nsq, q->nrings,
		 (unsigned long long)st.cq_writes, (unsigned long long)st.rounds);
	return nsq == q->nrings && st.cq_last == q->g.qp.cq_head && st.ntrace <= TRACECAP;
}

struct mq {
	struct q *q;
	uint64_t slba;
	bool ok;
};

static void *mq_main(void *arg)
{
	struct mq *a = (struct mq *)arg;

	a->ok = write_read(a->q, a->slba, 16, (uint8_t)a->slba);
	return NULL;
}

/* the model drops the completion of the command whose CDW2 is this tag */
static void drop_tagged(void *ctx, const struct upcie_nvme_sqe *sqe, struct nvme_model_action *act)
{
	(void)ctx;
	if (sqe->cdw2 == 0xdead)
		act->drop = true;
}

int main(void)
{
	static struct q q1, q8, qm[4], qd;
	char why[128];
	int err;

	setvbuf(stdout, NULL, _IOLBF, 0);

	err = q_open(&q1, 64, 1, true);
	CHECK(!err, "bridged queue over the model, poller thread started (%d)", err);
	{
		struct upcie_nvme_sqe sqe;
		struct upcie_nvme_cqe cqe;

		memset(q1.buf, 0x5a, LBA);
		upcie_nvme_cmd_write(&sqe, 1, 7, 1, 0);
		sqe.prp1 = (uint64_t)(uintptr_t)q1.buf;
		err = upcie_nvme_gqp_hip_io(&q1.g, &sqe, UPCIE_NSEC_PER_SEC, &cqe);
		q1.rings[q1.nrings++] = q1.g.qp.sq_tail;
		CHECK(!err && q1.ns[7 * LBA] == 0x5a && q1.ns[8 * LBA - 1] == 0x5a,
		      "single I/O through the bridge and the relay (%d), data in the namespace",
		      err);
		CHECK(trace_ok(&q1, why, sizeof(why)), "single: doorbell trace exact (%s)", why);
	}
	{
		struct upcie_nvme_bridge_stats a, b;

		upcie_nvme_bridge_stats_get(&q1.br, &a);
		upcie_sleep_ns(50 * UPCIE_NSEC_PER_MSEC);
		upcie_nvme_bridge_stats_get(&q1.br, &b);
		CHECK(b.rounds > a.rounds && b.sq_writes == a.sq_writes &&
			  b.cq_writes == a.cq_writes,
		      "idle 50 ms: %llu rounds, no doorbell write",
		      (unsigned long long)(b.rounds - a.rounds));
		q1.cells.sq_tail = 70; /* beyond the ring */
		upcie_sleep_ns(10 * UPCIE_NSEC_PER_MSEC);
		upcie_nvme_bridge_stats_get(&q1.br, &b);
		CHECK(b.sq_bad == 1 && b.sq_writes == a.sq_writes && q1.bar[0] == a.sq_last,
		      "an out-of-range shadow tail is counted once and never written");
		q1.cells.sq_tail = a.sq_last;
	}
	q_close(&q1);

	err = q_open(&q8, 8, 2, true);
	CHECK(!err, "depth-8 bridged queue (%d)", err);
	{
		static const uint32_t want[6] = { 6, 4, 2, 0, 6, 4 };
		unsigned ok = 0;
		bool seq = true;

		for (unsigned k = 0; k < 3; k++)
			ok += write_read(&q8, 64 + k * 48, 6, (uint8_t)(k + 1));
		for (unsigned i = 0; i < 6; i++)
			seq = seq && q8.rings[i] == want[i];
		CHECK(ok == 3 && q8.nrings == 6 && seq,
		      "wrap: 6 launches of 6 on 8 slots (tails 6 4 2 0 6 4), data verified %u/3",
		      ok);
		CHECK(trace_ok(&q8, why, sizeof(why)), "wrap: doorbell trace exact (%s)", why);
	}
	q_close(&q8);

	{
		struct mq a[4];
		pthread_t t[4];
		unsigned nok = 0, nopen = 0, ntr = 0;

		for (unsigned i = 0; i < 4; i++)
			nopen += q_open(&qm[i], 32, (uint16_t)(3 + i), true) == 0;
		for (unsigned i = 0; i < 4 && nopen == 4; i++) {
			a[i].q = &qm[i];
			a[i].slba = 1024 + i * 256;
			pthread_create(&t[i], NULL, mq_main, &a[i]);
		}
		for (unsigned i = 0; i < 4 && nopen == 4; i++) {
			pthread_join(t[i], NULL);
			nok += a[i].ok;
			ntr += trace_ok(&qm[i], why, sizeof(why));
		}
		CHECK(nok == 4 && ntr == 4,
		      "4 queues at once, a poller each: data verified %u/4, traces exact %u/4", nok,
		      ntr);
		for (unsigned i = 0; i < 4; i++)
			q_close(&qm[i]);
	}

	err = q_open(&qd, 16, 9, true);
	CHECK(!err, "queue for the lost-completion case (%d)", err);
	{
		struct upcie_nvme_gqp_hip_cpl c;
		struct upcie_nvme_sqe sqe;
		uint16_t cid = 0;
		uint64_t t0;

		qd.m.inject = drop_tagged;
		upcie_nvme_cmd_flush(&sqe, 1);
		sqe.cdw2 = 0xdead;
		qd.g.max_wait_ns = 50 * UPCIE_NSEC_PER_MSEC;
		err = upcie_nvme_gqp_hip_enqueue(&qd.g, &sqe, &c, &cid);
		upcie_nvme_gqp_hip_ring(&qd.g);
		t0 = upcie_time_ns();
		if (!err)
			err = upcie_nvme_gqp_hip_wait(&qd.g, cid, &c, 10 * UPCIE_NSEC_PER_SEC);
		t0 = upcie_time_ns() - t0;
		CHECK(err == -ETIMEDOUT && t0 < 2 * UPCIE_NSEC_PER_SEC && c.done &&
			  c.err == -ECANCELED,
		      "a lost completion ends a 10 s wait at the 50 ms cap (%d after %llu ms), the "
		      "command cancelled",
		      err, (unsigned long long)(t0 / UPCIE_NSEC_PER_MSEC));
		qd.g.wall_khz = 0;
		CHECK(upcie_nvme_gqp_hip_drain(&qd.g, UPCIE_NSEC_PER_SEC) == -EINVAL,
		      "a wait without a clock rate is refused (-EINVAL), not run unbounded");
		qd.g.wall_khz = UPCIE_NVME_GQP_HIP_HOST_KHZ;
		qd.g.max_wait_ns = 0;
		CHECK(upcie_nvme_gqp_hip_ticks_(&qd.g, 60 * UPCIE_NSEC_PER_SEC) ==
			  UPCIE_NVME_GQP_HIP_WAIT_MAX_NS,
		      "waits are capped at UPCIE_NVME_GQP_HIP_WAIT_MAX_NS by default");
		qd.g.wall_khz = 100000; /* 100 MHz, the usual AMD wall clock */
		CHECK_EQ(upcie_nvme_gqp_hip_ticks_(&qd.g, 1500 * UPCIE_NSEC_PER_USEC), 150000,
			 "1.5 ms at 100000 kHz is 150000 ticks");
	}
	q_close(&qd);
	printf("1..%d\n", check_n_);
	return check_failed_ ? 1 : 0;
}
