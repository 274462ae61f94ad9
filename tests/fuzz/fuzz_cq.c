/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer harness: the completion side of the queue pair (nvme/qpair.h) with completion
 * queue memory the fuzzer writes, as a hostile or broken controller would.
 *
 * Each input is a program: the queue sizes, then operations. The host side submits commands
 * (copied, or built in the SQ slot and committed; some without a callback; callbacks that may
 * submit again), reaps, cancels, reclaims; the "device" side writes completion entries anywhere
 * in the ring with any CID (one outstanding, one cancelled, any 16-bit value), any SQ head, any
 * status, the expected phase tag or the other one. Checked after every step: no command's
 * callback runs twice, the CID tables add up (free + cancelled + outstanding = all), a slot's
 * next CID is never the one its last command had (the generation advanced), every
 * index stays inside its ring, a reap that consumed entries told the controller the new head
 * (and one that consumed none wrote no doorbell), and the queue's room never exceeds what is
 * free. At the end fini must give every command still owed exactly one callback. ASan and
 * UBSan report any access outside the rings and tables.
 */
#include <upcie/nvme/qpair.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXCMD	 4096
#define SENTINEL 0xdeadbeefu

struct cmd_rec {
	unsigned calls;
	int err;
	uint16_t cid;
	bool nocb;
};

struct fz {
	const uint8_t *p;
	size_t n;
};

static struct upcie_nvme_qpair qp;
static struct cmd_rec recs[MAXCMD];
static unsigned nrec;
static bool resubmit; /* callbacks submit one more command */
static volatile uint32_t sqdb, cqdb;

static uint8_t take8(struct fz *f)
{
	uint8_t v = 0;

	if (f->n) {
		v = *f->p++;
		f->n--;
	}
	return v;
}

static uint16_t take16(struct fz *f)
{
	return (uint16_t)(take8(f) | (take8(f) << 8));
}

static void die(const char *what)
{
	fprintf(stderr, "fuzz_cq: invariant broken: %s\n", what);
	abort();
}

static int submit_one(bool commit, bool nocb);

static void cb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct cmd_rec *r = (struct cmd_rec *)ctx;

	if (r < recs || r >= recs + nrec)
		die("callback context is not one of ours");
	if (++r->calls > 1)
		die("a command's callback ran twice");
	if (!cqe)
		die("callback without a completion entry");
	r->err = err;
	if (err == -ECANCELED && upcie_nvme_cqe_cid(cqe) != r->cid)
		die("synthesized completion carries another CID");
	if (resubmit)
		submit_one(nrec & 1, false);
}

static int submit_one(bool commit, bool nocb)
{
	struct upcie_nvme_sqe sqe;
	struct cmd_rec *r;
	uint16_t cid = 0xffff;
	int err;

	if (nrec == MAXCMD)
		return -ENOSPC;
	r = &recs[nrec];
	memset(r, 0, sizeof(*r));
	r->nocb = nocb;
	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = 0x80;
	sqe.cdw2 = nrec;
	if (commit) {
		struct upcie_nvme_sqe *slot = upcie_nvme_qpair_sqe_slot(&qp);

		if (slot < qp.sq || slot > qp.sq + qp.sq_last)
			die("SQ slot outside the ring");
		*slot = sqe;
		err = upcie_nvme_qpair_commit(&qp, nocb ? NULL : cb, r, &cid);
	} else {
		err = upcie_nvme_qpair_enqueue(&qp, &sqe, nocb ? NULL : cb, r, &cid);
	}
	if (err)
		return err;
	if (upcie_nvme_qpair_cid_index(&qp, cid) >= qp.ncids)
		die("CID beyond the table");
	r->cid = cid;
	nrec++;
	upcie_nvme_qpair_ring(&qp);
	if (sqdb > qp.sq_last)
		die("SQ tail doorbell beyond the ring");
	return 0;
}

static void check_tables(void)
{
	uint32_t out = 0, cancelled = 0, room;

	if (qp.nfree > qp.ncids || qp.sq_head > qp.sq_last || qp.sq_tail > qp.sq_last ||
	    qp.cq_head > qp.cq_last)
		die("index outside its ring or table");
	for (uint32_t c = 0; c < qp.ncids; c++) {
		uint32_t tag = qp.slots[c].tag;

		if (tag & UPCIE_NVME_CID_FREE_) /* free, or never used */
			continue;
		if (upcie_nvme_qpair_cid_index(&qp, (uint16_t)tag) != c)
			die("a slot holds a CID of another slot");
		if (tag & UPCIE_NVME_CID_CANCELLED_)
			cancelled++;
		else
			out++;
	}
	if (cancelled != qp.ncancelled)
		die("cancelled count differs from the table");
	if (out + cancelled + qp.nfree != qp.ncids)
		die("free + cancelled + outstanding != CIDs");
	for (uint32_t i = 0; i < qp.nfree; i++) {
		uint16_t cid = qp.cid_free[i];
		uint32_t idx = upcie_nvme_qpair_cid_index(&qp, cid), tag;

		if (idx >= qp.ncids)
			die("free stack holds a CID beyond the table");
		tag = qp.slots[idx].tag;
		if (!(tag & UPCIE_NVME_CID_FREE_))
			die("free stack holds a CID that is not free");
		/* the next command of a slot never gets the CID of its last one */
		if (tag != UPCIE_NVME_CID_UNUSED_ && (uint16_t)tag == cid)
			die("free stack hands out the CID the slot's last command had");
	}
	room = upcie_nvme_qpair_room(&qp);
	if (room > qp.nfree || room > qp.sq_last)
		die("room beyond free CIDs or SQ slots");
	if (upcie_nvme_qpair_inflight(&qp) != out)
		die("inflight differs from the table");
}

/* Index of a record whose command is still owed a callback, or of any record. */
static struct cmd_rec *pick_rec(struct fz *f, bool owed)
{
	unsigned start, i;

	if (!nrec)
		return NULL;
	start = take16(f) % nrec;
	for (i = 0; i < nrec; i++) {
		struct cmd_rec *r = &recs[(start + i) % nrec];

		if (!owed || (!r->calls && !r->nocb))
			return r;
	}
	return NULL;
}

static void device_post(struct fz *f)
{
	uint8_t mode = take8(f), off = take8(f);
	uint16_t raw = take16(f), sqhd = take16(f), code = take16(f);
	uint32_t idx = (qp.cq_head + off) % ((uint32_t)qp.cq_last + 1), phase, cid;
	struct cmd_rec *r;

	/* the phase a new entry at idx carries: the current one up to the wrap, then flipped */
	phase = idx >= qp.cq_head ? qp.phase : qp.phase ^ 1u;
	if (mode & 1)
		phase ^= 1u;
	switch ((mode >> 1) & 3) {
	case 0:
		r = pick_rec(f, true);
		cid = r ? r->cid : raw;
		break;
	case 1:
		r = pick_rec(f, false);
		cid = r ? r->cid : raw;
		break;
	default:
		cid = raw;
		break;
	}
	if (mode & 8)
		sqhd = (uint16_t)(sqhd % ((uint32_t)qp.sq_last + 1));
	qp.cq[idx].dw0 = raw;
	qp.cq[idx].dw1 = 0;
	qp.cq[idx].dw2 = sqhd | ((uint32_t)qp.qid << 16);
	qp.cq[idx].dw3 = upcie_nvme_cqe_dw3_make((uint16_t)cid, phase, code & 0x7ff, code >> 15);
}

static void do_reap(unsigned max)
{
	uint64_t bad0 = qp.nbad, late0 = qp.nlate;
	uint16_t head0 = qp.cq_head;
	uint64_t consumed;
	int n;

	cqdb = SENTINEL;
	n = upcie_nvme_qpair_reap(&qp, max);
	if (n < 0 && n != -EPROTO)
		die("reap returned an unexpected error");
	if (n == -EPROTO && qp.nbad == bad0)
		die("-EPROTO without counting the bad entry");
	consumed = (n > 0 ? (uint64_t)n : 0) + (qp.nbad - bad0) + (qp.nlate - late0);
	if (consumed && cqdb != qp.cq_head) {
		fprintf(stderr,
			"fuzz_cq: %llu consumed of a %u-entry CQ, head %u -> %u, doorbell 0x%x\n",
			(unsigned long long)consumed, qp.cq_last + 1u, head0, qp.cq_head, cqdb);
		die("entries consumed but the CQ head doorbell does not say where the head is");
	}
	if (!consumed && (cqdb != SENTINEL || qp.cq_head != head0))
		die("nothing consumed but the head moved or a doorbell was written");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct upcie_nvme_sqe sq[64] __attribute__((aligned(64)));
	static struct upcie_nvme_cqe cq[64] __attribute__((aligned(64)));
	struct upcie_nvme_qpair_cfg cfg;
	struct fz f = { data, size };
	unsigned steps = 0;

	memset(&cfg, 0, sizeof(cfg));
	cfg.sq = sq;
	cfg.cq = cq;
	cfg.sqdb = &sqdb;
	cfg.cqdb = &cqdb;
	cfg.sq_depth = 2 + take8(&f) % 63;
	cfg.cq_depth = 2 + take8(&f) % 63;
	/* 0: the default; fewer CIDs than SQ and CQ slots */
	cfg.ncids = take8(&f) % (cfg.sq_depth < cfg.cq_depth ? cfg.sq_depth : cfg.cq_depth);
	cfg.qid = 1;
	sqdb = cqdb = 0;
	nrec = 0;
	resubmit = false;
	if (upcie_nvme_qpair_init(&qp, &cfg))
		die("init refused a valid config");
	while (f.n && steps++ < 512) {
		uint8_t op = take8(&f);

		switch (op % 8) {
		case 0:
			for (unsigned k = take8(&f) % 8 + 1; k; k--)
				if (submit_one(false, false))
					break;
			break;
		case 1:
			submit_one(true, op & 0x10);
			break;
		case 2:
		case 3:
			device_post(&f);
			break;
		case 4:
			do_reap(take8(&f) % 4 ? 0xffffffffu : 1u + take8(&f) % 4);
			break;
		case 5: {
			struct cmd_rec *r = pick_rec(&f, true);
			uint16_t cid = r && (op & 0x10) ? r->cid : take16(&f);
			int err = upcie_nvme_qpair_cancel(&qp, cid);

			if (err && err != -ENOENT && err != -EINVAL)
				die("cancel returned an unexpected error");
			break;
		}
		case 6:
			/* only sound once the controller cannot complete them: the fuzzer's device
			 * still may, which is what the late-completion accounting must survive */
			if (op & 0x10)
				upcie_nvme_qpair_reclaim(&qp);
			break;
		default:
			resubmit = op & 0x10;
			break;
		}
		check_tables();
	}
	resubmit = false;
	upcie_nvme_qpair_fini(&qp);
	for (unsigned i = 0; i < nrec; i++)
		if (!recs[i].nocb && recs[i].calls != 1)
			die("after fini a command has not had exactly one callback");
	return 0;
}
