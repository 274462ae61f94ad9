/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * nvme/qpair.h against the controller model (tests/unit/nvme_model.h): ring wrap-around and
 * phase flips at depths 2, 3, 64 and 1024, out-of-order completion, CID-exhaustion
 * back-pressure (-EBUSY, also with an SQ shallower than the CQ), error status with DNR, a
 * completion that never arrives (timeout, outstanding list, cancel, reclaim), a late completion
 * after cancel, unknown CIDs (-EPROTO), data verified end to end through PRPs and SGLs, a
 * threaded controller, fini with commands in flight, submit_sync while a callback takes its
 * CID's slot again, what a hostile device writes into the CQ (duplicates after and before the
 * slot was reused, CIDs beyond the table, SQ heads going backwards or past the tail: counted,
 * logged a few times, no callback for the wrong command), and an SQ head reported late.
 * Throughout: every submitted command ends in exactly one callback.
 */
#include <upcie/nvme/cmd.h>
#include <upcie/nvme/prp.h>
#include <upcie/nvme/qpair.h>
#include <upcie/nvme/sgl.h>

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nvme_model.h"

/* One record per submitted command: how it ended. */
struct rec {
	uint32_t tag;
	int calls;
	int err;
	uint16_t code;
	bool dnr;
	uint32_t dw0;
	uint16_t cid;
};

static uint64_t n_submitted, n_callbacks, n_mismatch;

static void rec_cb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct rec *r = (struct rec *)ctx;

	r->calls++;
	r->err = err;
	r->code = upcie_nvme_cqe_code(cqe);
	r->dnr = upcie_nvme_cqe_dnr(cqe);
	r->dw0 = cqe->dw0;
	if (upcie_nvme_cqe_cid(cqe) != r->cid || (!err && r->dw0 != r->tag && !r->code))
		n_mismatch++;
	n_callbacks++;
}

struct rig {
	struct upcie_nvme_qpair qp;
	struct nvme_model m;
	void *sq, *cq;
	uint32_t sq_depth, cq_depth;
};

static int rig_init(struct rig *r, uint32_t sq_depth, uint32_t cq_depth, uint32_t ncids)
{
	struct upcie_nvme_qpair_cfg cfg;

	memset(r, 0, sizeof(*r));
	r->sq = aligned_alloc(64, (size_t)sq_depth * 64);
	r->cq = aligned_alloc(64, ((size_t)cq_depth * 16 + 63) & ~(size_t)63);
	r->sq_depth = sq_depth;
	r->cq_depth = cq_depth;
	nvme_model_init(&r->m, r->sq, sq_depth, r->cq, cq_depth, 1, NULL, 0, 512, 12, NULL);
	memset(&cfg, 0, sizeof(cfg));
	cfg.sq = r->sq;
	cfg.cq = r->cq;
	cfg.sqdb = &r->m.sqdb;
	cfg.cqdb = &r->m.cqdb;
	cfg.sq_depth = sq_depth;
	cfg.cq_depth = cq_depth;
	cfg.ncids = ncids;
	cfg.qid = 1;
	return upcie_nvme_qpair_init(&r->qp, &cfg);
}

static void rig_fini(struct rig *r)
{
	upcie_nvme_qpair_fini(&r->qp);
	nvme_model_fini(&r->m);
	free(r->sq);
	free(r->cq);
}

static int submit_echo(struct rig *r, struct rec *rc, uint32_t tag)
{
	struct upcie_nvme_sqe sqe;
	int err;

	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = NVME_MODEL_OPC_ECHO;
	sqe.nsid = 1;
	sqe.cdw2 = tag;
	rc->tag = tag;
	rc->calls = 0;
	err = upcie_nvme_qpair_enqueue(&r->qp, &sqe, rec_cb, rc, &rc->cid);
	if (!err)
		n_submitted++;
	return err;
}

/* As submit_echo(), built in place in the SQ slot and committed. */
static int commit_echo(struct rig *r, struct rec *rc, uint32_t tag)
{
	struct upcie_nvme_sqe *sqe = upcie_nvme_qpair_sqe_slot(&r->qp);
	int err;

	memset(sqe, 0, sizeof(*sqe));
	sqe->opc = NVME_MODEL_OPC_ECHO;
	sqe->nsid = 1;
	sqe->cdw2 = tag;
	rc->tag = tag;
	rc->calls = 0;
	err = upcie_nvme_qpair_commit(&r->qp, rec_cb, rc, &rc->cid);
	if (!err)
		n_submitted++;
	return err;
}

static void test_wrap(void)
{
	static const uint32_t depths[] = { 2, 3, 64, 1024 };

	for (size_t d = 0; d < UPCIE_ARRAY_SIZE(depths); d++) {
		for (int ooo = 0; ooo < 2; ooo++) {
			struct rig r;
			uint32_t depth = depths[d], total = depth < 64 ? 5000 : depth * 40,
				 next = 0;
			struct rec *recs = (struct rec *)calloc(total, sizeof(*recs));
			struct nvme_model_rng rng = { 0x5eed + d * 2 + (uint64_t)ooo };
			uint64_t sub0 = n_submitted, cb0 = n_callbacks, flips = 0;
			uint8_t last_phase;
			int bad = 0;

			CHECK_EQ(rig_init(&r, depth, depth, 0), 0, "init depth %u", depth);
			r.m.ooo = ooo;
			r.m.post_max = (uint32_t)nvme_model_rng_range(&rng, 0, 3);
			last_phase = r.qp.phase;
			while (next < total || upcie_nvme_qpair_inflight(&r.qp)) {
				uint32_t batch = (uint32_t)nvme_model_rng_range(&rng, 1, depth);
				int n;

				for (uint32_t i = 0; i < batch && next < total; i++) {
					if (submit_echo(&r, &recs[next], next) != 0)
						break;
					next++;
				}
				upcie_nvme_qpair_ring(&r.qp);
				nvme_model_step(&r.m);
				n = upcie_nvme_qpair_reap(
				    &r.qp, (unsigned)nvme_model_rng_range(&rng, 1, depth));
				if (n < 0)
					bad++;
				if (r.qp.phase != last_phase) {
					flips++;
					last_phase = r.qp.phase;
				}
			}
			for (uint32_t i = 0; i < total; i++)
				if (recs[i].calls != 1 || recs[i].err || recs[i].code)
					bad++;
			CHECK(bad == 0 && n_submitted - sub0 == total && n_callbacks - cb0 == total,
			      "depth %u%s: %u commands, each completed once", depth,
			      ooo ? " out of order" : "", total);
			CHECK(flips >= total / depth - 1, "depth %u: %llu phase flips (%u wraps)",
			      depth, (unsigned long long)flips, total / depth);
			CHECK_EQ(r.qp.nfree, depth - 1, "all CIDs free again");
			CHECK_EQ(r.qp.nbad + r.qp.nbad_sqhd + r.m.bad_doorbell, 0,
				 "no protocol errors");
			rig_fini(&r);
			free(recs);
		}
	}
}

static void inject_delay(void *ctx, const struct upcie_nvme_sqe *sqe, struct nvme_model_action *a)
{
	struct nvme_model_rng *rng = (struct nvme_model_rng *)ctx;

	(void)sqe;
	a->delay = (uint32_t)nvme_model_rng_range(rng, 0, 6);
}

static void test_out_of_order(void)
{
	struct rig r;
	struct rec recs[2000];
	struct nvme_model_rng rng = { 42 };
	uint32_t next = 0, order_breaks = 0;
	uint16_t prev_cid = 0;
	int bad = 0;

	rig_init(&r, 128, 128, 0);
	r.m.ooo = true;
	r.m.inject = inject_delay;
	r.m.inject_ctx = &rng;
	while (next < 2000 || upcie_nvme_qpair_inflight(&r.qp)) {
		while (next < 2000 && submit_echo(&r, &recs[next], next + 1000) == 0)
			next++;
		upcie_nvme_qpair_ring(&r.qp);
		nvme_model_step(&r.m);
		for (;;) {
			uint32_t h = r.qp.cq_head;
			uint16_t cid = upcie_nvme_cqe_cid(&((struct upcie_nvme_cqe *)r.cq)[h]);
			int n = upcie_nvme_qpair_reap(&r.qp, 1);

			if (n <= 0)
				break;
			order_breaks += cid < prev_cid;
			prev_cid = cid;
		}
	}
	for (int i = 0; i < 2000; i++)
		bad += recs[i].calls != 1 || recs[i].dw0 != recs[i].tag;
	CHECK(bad == 0 && n_mismatch == 0, "2000 out-of-order completions matched by CID");
	CHECK(order_breaks > 100, "completions really came out of order (%u reorderings)",
	      order_breaks);
	rig_fini(&r);
}

static void test_backpressure(void)
{
	struct rig r;
	struct rec recs[32];
	uint16_t tail, nfree, cid = 0;
	uint8_t slot_before[64];

	/* SQ of 4 in front of a CQ of 16: 3 CIDs, fewer than SQ slots, so the SQ never fills. */
	rig_init(&r, 4, 16, 0);
	r.m.fetch_stall = true;
	for (int i = 0; i < 3; i++)
		CHECK_EQ(submit_echo(&r, &recs[i], (uint32_t)i), 0, "SQ slot %d", i);
	tail = r.qp.sq_tail;
	nfree = r.qp.nfree;
	memcpy(slot_before, (char *)r.sq + 64 * tail, 64);
	CHECK_EQ(submit_echo(&r, &recs[3], 3), -EBUSY, "SQ full: -EBUSY");
	CHECK(r.qp.sq_tail == tail && r.qp.nfree == nfree &&
		  !memcmp(slot_before, (char *)r.sq + 64 * tail, 64),
	      "refused enqueue changed nothing");
	upcie_nvme_qpair_ring(&r.qp);
	r.m.delay = 5; /* fetched but not completed: SQHD still unknown to the host */
	r.m.fetch_stall = false;
	nvme_model_step(&r.m);
	CHECK_EQ(r.m.sq_head, 3, "controller fetched all three");
	CHECK_EQ(submit_echo(&r, &recs[3], 3), -EBUSY,
		 "still -EBUSY until a completion reports the new SQ head");
	for (int i = 0; i < 6; i++)
		nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 16), 3, "three completions");
	CHECK_EQ(r.qp.sq_head, 3, "SQHD 3 seen");
	for (int i = 3; i < 6; i++)
		CHECK_EQ(submit_echo(&r, &recs[i], (uint32_t)i), 0, "SQ slot reusable after SQHD");
	upcie_nvme_qpair_ring(&r.qp);
	for (int i = 0; i < 8; i++)
		nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 16), 3, "wrapped SQ commands complete");
	rig_fini(&r);

	/* CQ of 4 (3 CIDs) behind an SQ of 64: CIDs are the limit. */
	rig_init(&r, 64, 4, 0);
	for (int i = 0; i < 3; i++)
		CHECK_EQ(submit_echo(&r, &recs[i], (uint32_t)i), 0, "CID %d", i);
	CHECK_EQ(upcie_nvme_qpair_next_cid(&r.qp, &cid), -EBUSY, "no CID to peek");
	CHECK_EQ(submit_echo(&r, &recs[3], 3), -EBUSY, "all CIDs in use: -EBUSY");
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 1), 1, "reap one");
	CHECK_EQ(upcie_nvme_qpair_next_cid(&r.qp, &cid), 0, "a CID is free");
	CHECK_EQ(submit_echo(&r, &recs[3], 3), 0, "enqueue after reap");
	CHECK_EQ(recs[3].cid, cid, "next_cid predicted the CID");
	upcie_nvme_qpair_ring(&r.qp);
	CHECK_EQ(upcie_nvme_qpair_drain(&r.qp, 0), -ETIMEDOUT, "drain with zero timeout");
	nvme_model_step(&r.m);
	nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_drain(&r.qp, UPCIE_NSEC_PER_SEC), 0, "drained");
	rig_fini(&r);
}

static void inject_media_error(void *ctx, const struct upcie_nvme_sqe *sqe,
			       struct nvme_model_action *a)
{
	(void)ctx;
	if (sqe->cdw2 == 7) {
		a->code = UPCIE_NVME_SC_UNRECOVERED_READ;
		a->dnr = true;
	}
}

static void test_error_status(void)
{
	struct rig r;
	struct rec recs[10];
	struct upcie_nvme_cqe cqe;
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_status st;

	rig_init(&r, 16, 16, 0);
	r.m.inject = inject_media_error;
	for (int i = 0; i < 10; i++)
		submit_echo(&r, &recs[i], (uint32_t)i);
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 64), 10, "ten completions");
	CHECK(recs[7].calls == 1 && recs[7].err == 0, "error completion is a completion (err 0)");
	CHECK_EQ(recs[7].code, UPCIE_NVME_SC_UNRECOVERED_READ, "status: unrecovered read error");
	CHECK(recs[7].dnr, "DNR surfaced");
	CHECK(recs[6].code == 0 && !recs[6].dnr, "neighbours succeed");
	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = NVME_MODEL_OPC_ECHO;
	sqe.cdw2 = 7;
	/* submit_sync: the model must run while we spin, so use the threaded mode. */
	nvme_model_start(&r.m);
	CHECK_EQ(upcie_nvme_qpair_submit_sync(&r.qp, &sqe, UPCIE_NSEC_PER_SEC, &cqe, NULL), -EIO,
		 "sync: error status gives -EIO");
	st = upcie_nvme_status_decode(cqe.dw3);
	CHECK(st.sct == UPCIE_NVME_SCT_MEDIA && st.sc == 0x81 && st.dnr,
	      "sync: typed status SCT %u SC 0x%x DNR %d", st.sct, st.sc, st.dnr);
	sqe.cdw2 = 8;
	CHECK_EQ(upcie_nvme_qpair_submit_sync(&r.qp, &sqe, UPCIE_NSEC_PER_SEC, &cqe, NULL), 0,
		 "sync: success");
	CHECK_EQ(cqe.dw0, 8, "sync: result dw0");
	nvme_model_stop(&r.m);
	rig_fini(&r);
}

static void inject_drop_or_delay(void *ctx, const struct upcie_nvme_sqe *sqe,
				 struct nvme_model_action *a)
{
	(void)ctx;
	if (sqe->cdw2 == 666)
		a->drop = true;
	if (sqe->cdw2 == 777)
		a->delay = 1000;
}

static void test_timeout_cancel(void)
{
	struct rig r;
	struct rec recs[8], lost, late;
	struct upcie_nvme_sqe sqe;
	uint16_t out[8], cid = 0;
	uint64_t t0;
	int n;

	rig_init(&r, 8, 8, 0);
	r.m.inject = inject_drop_or_delay;
	for (int i = 0; i < 3; i++)
		submit_echo(&r, &recs[i], (uint32_t)i);
	submit_echo(&r, &lost, 666);
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	t0 = upcie_time_ns();
	CHECK_EQ(upcie_nvme_qpair_wait(&r.qp, lost.cid, 20 * UPCIE_NSEC_PER_MSEC), -ETIMEDOUT,
		 "wait for a dropped completion times out");
	CHECK(upcie_time_ns() - t0 >= 20 * UPCIE_NSEC_PER_MSEC, "after the deadline, not before");
	CHECK(recs[0].calls == 1 && recs[2].calls == 1, "the others completed while waiting");
	n = upcie_nvme_qpair_outstanding(&r.qp, out, 8);
	CHECK(n == 1 && out[0] == lost.cid, "outstanding reports CID %u", lost.cid);
	CHECK_EQ(lost.calls, 0, "no callback yet");
	CHECK_EQ(upcie_nvme_qpair_cancel(&r.qp, lost.cid), 0, "cancel");
	CHECK(lost.calls == 1 && lost.err == -ECANCELED, "exactly one error callback (-ECANCELED)");
	CHECK(lost.code == UPCIE_NVME_SC_ABORT_REQ && lost.dnr,
	      "synthesized status: command abort requested, DNR");
	CHECK_EQ(upcie_nvme_qpair_cancel(&r.qp, lost.cid), -ENOENT, "second cancel: -ENOENT");
	CHECK_EQ(upcie_nvme_qpair_cancel(&r.qp, 7), -EINVAL,
		 "cancel of a CID whose index is beyond the 7 CIDs");
	CHECK_EQ(upcie_nvme_qpair_cancel(&r.qp, (uint16_t)(lost.cid + 8)), -ENOENT,
		 "cancel of the next generation of the cancelled CID: not outstanding");
	CHECK_EQ(upcie_nvme_qpair_inflight(&r.qp), 0, "nothing in flight");
	CHECK_EQ(upcie_nvme_qpair_outstanding(&r.qp, out, 8), 0, "nothing outstanding");
	CHECK_EQ(r.qp.nfree, 6, "cancelled CID stays reserved");
	/* The queue is deleted and recreated: the controller forgot the command. */
	nvme_model_reset_queue(&r.m);
	r.qp.sq_tail = r.qp.sq_head = r.qp.sq_db = r.qp.cq_head = 0;
	r.qp.phase = 1;
	CHECK_EQ(upcie_nvme_qpair_reclaim(&r.qp), 1, "reclaim returns the CID");
	CHECK_EQ(r.qp.nfree, 7, "no CID leaked");
	CHECK_EQ(lost.calls, 1, "still one callback");

	/* A late completion after cancel is consumed silently and frees the CID. */
	submit_echo(&r, &late, 777);
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_wait(&r.qp, late.cid, UPCIE_NSEC_PER_MSEC), -ETIMEDOUT,
		 "delayed command times out");
	upcie_nvme_qpair_cancel(&r.qp, late.cid);
	for (int i = 0; i < 1001; i++)
		nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 8), 0, "late completion is not counted");
	CHECK(r.qp.nlate == 1 && late.calls == 1 && r.qp.nfree == 7 && r.qp.ncancelled == 0,
	      "late completion: no second callback, CID freed");

	/* submit_sync cancels its own command on timeout and reports the CID. */
	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = NVME_MODEL_OPC_ECHO;
	sqe.cdw2 = 666;
	upcie_nvme_qpair_enqueue(&r.qp, &sqe, NULL, NULL, NULL); /* placeholder, then drop it */
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	nvme_model_start(&r.m);
	CHECK_EQ(upcie_nvme_qpair_submit_sync(&r.qp, &sqe, 5 * UPCIE_NSEC_PER_MSEC, NULL, &cid),
		 -ETIMEDOUT, "sync: -ETIMEDOUT");
	nvme_model_stop(&r.m);
	CHECK(upcie_nvme_qpair_cid_index(&r.qp, cid) < 7 &&
		  r.qp.slots[upcie_nvme_qpair_cid_index(&r.qp, cid)].tag ==
		      (cid | UPCIE_NVME_CID_CANCELLED_),
	      "sync: CID %u reported and parked", cid);
	rig_fini(&r);
}

static void test_unknown_cid(void)
{
	struct rig r;
	struct rec recs[4];

	rig_init(&r, 16, 16, 0);
	submit_echo(&r, &recs[0], 1);
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	nvme_model_post_raw(&r.m, 9, 0, false);	     /* never submitted */
	nvme_model_post_raw(&r.m, 0xfffe, 0, false); /* beyond the CID table */
	submit_echo(&r, &recs[1], 2);
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 16), 1, "good completion before the bad ones");
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 16), -EPROTO, "CID 9 not outstanding: -EPROTO");
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 16), -EPROTO, "CID 0xfffe out of range: -EPROTO");
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 16), 1, "the next good one still completes");
	CHECK_EQ(r.qp.nbad, 2, "two bad entries counted");
	CHECK(recs[0].calls == 1 && recs[1].calls == 1 && n_mismatch == 0, "no harm done");
	CHECK_EQ(r.qp.nfree, 15, "CIDs intact");
	rig_fini(&r);
}

/* Building in the SQ slot: upcie_nvme_qpair_sqe_slot() + upcie_nvme_qpair_commit(). */
static void test_commit(void)
{
	static const uint32_t depths[] = { 2, 3, 64 };
	struct rig r;
	struct rec recs[8];
	uint8_t pattern[64], now[64];
	struct upcie_nvme_sqe *slot;
	uint16_t tail, nfree, cid = 0xffff;

	/* Commit writes the CID (bytes 2-3) and nothing else, takes a CID, steps the tail. */
	rig_init(&r, 8, 8, 0);
	slot = upcie_nvme_qpair_sqe_slot(&r.qp);
	CHECK(slot == (struct upcie_nvme_sqe *)r.sq + r.qp.sq_tail,
	      "slot: the SQ entry at the tail");
	memset(pattern, 0xa5, sizeof(pattern));
	memcpy(slot, pattern, sizeof(pattern));
	CHECK_EQ(upcie_nvme_qpair_commit(&r.qp, NULL, NULL, &cid), 0, "commit");
	memcpy(now, slot, sizeof(now));
	CHECK(cid < 7 && now[2] == (cid & 0xff) && now[3] == (cid >> 8) &&
		  !memcmp(now, pattern, 2) && !memcmp(now + 4, pattern + 4, 60),
	      "commit stored CID %u into the slot, no other byte", cid);
	CHECK(r.qp.sq_tail == 1 && r.qp.nfree == 6 && upcie_nvme_qpair_inflight(&r.qp) == 1,
	      "tail stepped, one CID taken");
	CHECK(upcie_nvme_qpair_sqe_slot(&r.qp) == slot + 1, "next slot");
	rig_fini(&r); /* never rung: the 0xa5 command never reaches the model */

	/* Full: -EBUSY, nothing changed, the slot still writable. */
	rig_init(&r, 4, 16, 0);
	r.m.fetch_stall = true;
	for (int i = 0; i < 3; i++)
		CHECK_EQ(commit_echo(&r, &recs[i], 100u + (uint32_t)i), 0, "commit into SQ slot %d",
			 i);
	tail = r.qp.sq_tail;
	nfree = r.qp.nfree;
	slot = upcie_nvme_qpair_sqe_slot(&r.qp);
	memset(slot, 0xa5, sizeof(*slot));
	memcpy(pattern, slot, sizeof(pattern));
	CHECK_EQ(upcie_nvme_qpair_commit(&r.qp, rec_cb, &recs[3], NULL), -EBUSY, "SQ full: -EBUSY");
	CHECK(r.qp.sq_tail == tail && r.qp.nfree == nfree && !memcmp(slot, pattern, 64),
	      "refused commit changed nothing, not even the slot");
	upcie_nvme_qpair_ring(&r.qp);
	r.m.fetch_stall = false;
	nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 16), 3, "the committed commands complete");
	CHECK(recs[0].calls == 1 && recs[0].dw0 == 100 && recs[2].calls == 1 && recs[2].dw0 == 102,
	      "with their own tags (built in the slot while the next slot was scribbled on)");
	rig_fini(&r);
	rig_init(&r, 64, 4, 0);
	for (int i = 0; i < 3; i++)
		commit_echo(&r, &recs[i], (uint32_t)i);
	CHECK_EQ(commit_echo(&r, &recs[3], 3), -EBUSY, "all CIDs in use: -EBUSY");
	CHECK_EQ(r.qp.sq_tail, 3, "refused commit left the tail");
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 16), 3, "three completions");
	rig_fini(&r);

	/* Enqueue and commit mixed, many wraps, in and out of order. */
	for (size_t d = 0; d < UPCIE_ARRAY_SIZE(depths); d++) {
		for (int ooo = 0; ooo < 2; ooo++) {
			uint32_t depth = depths[d], total = 3000, next = 0;
			struct rec *rs = (struct rec *)calloc(total, sizeof(*rs));
			struct nvme_model_rng rng = { 0xc0117 + d * 2 + (uint64_t)ooo };
			uint64_t cb0 = n_callbacks;
			int bad = 0;

			rig_init(&r, depth, depth, 0);
			r.m.ooo = ooo;
			while (next < total || upcie_nvme_qpair_inflight(&r.qp)) {
				uint32_t batch = (uint32_t)nvme_model_rng_range(&rng, 1, depth);

				for (uint32_t i = 0; i < batch && next < total; i++) {
					int err = nvme_model_rng_next(&rng) & 1
						      ? commit_echo(&r, &rs[next], next)
						      : submit_echo(&r, &rs[next], next);

					if (err)
						break;
					next++;
				}
				upcie_nvme_qpair_ring(&r.qp);
				nvme_model_step(&r.m);
				if (upcie_nvme_qpair_reap(&r.qp, depth) < 0)
					bad++;
			}
			for (uint32_t i = 0; i < total; i++)
				bad += rs[i].calls != 1 || rs[i].err || rs[i].dw0 != i;
			CHECK(bad == 0 && n_callbacks - cb0 == total,
			      "depth %u%s: %u commands by enqueue and commit, each completed once",
			      depth, ooo ? " out of order" : "", total);
			rig_fini(&r);
			free(rs);
		}
	}
}

static struct rig *chain_rig;
static struct rec chain_recs[2];

/* Callback that commits and rings a follow-up command from inside reap. */
static void chain_cb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	rec_cb(ctx, cqe, err);
	if (ctx == &chain_recs[0] && commit_echo(chain_rig, &chain_recs[1], 2) == 0)
		upcie_nvme_qpair_ring(&chain_rig->qp);
}

/*
 * Reap stops without polling the next entry when nothing is outstanding: the same results as
 * polling it (a bad entry after good ones ends the batch anyway), and never while a cancelled
 * command's late completion or a command enqueued by a callback may still come.
 */
static void test_reap_stop(void)
{
	struct rig r;
	struct rec a, b;
	struct upcie_nvme_sqe sqe;

	rig_init(&r, 16, 16, 0);
	submit_echo(&r, &a, 1);
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	nvme_model_post_raw(&r.m, 9, 0, false); /* never submitted */
	nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 16), 1, "last outstanding command completes");
	CHECK_EQ(r.qp.nbad, 0, "the bad entry behind it is not consumed");
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 16), -EPROTO, "the next call reports it");
	CHECK_EQ(r.qp.nbad, 1, "counted once");
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 16), 0, "then nothing");

	/* A command without callback counts as completed and ends outstanding work too. */
	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = NVME_MODEL_OPC_ECHO;
	CHECK_EQ(upcie_nvme_qpair_enqueue(&r.qp, &sqe, NULL, NULL, NULL), 0, "no-callback command");
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 16), 1, "no-callback completion counted");
	CHECK_EQ(r.qp.nfree, 15, "its CID freed");
	rig_fini(&r);

	/* A completes, B was cancelled and completes late, behind A: both go in one call. */
	rig_init(&r, 8, 8, 0);
	r.m.inject = inject_drop_or_delay;
	submit_echo(&r, &a, 1);
	submit_echo(&r, &b, 777); /* delayed 1000 steps */
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_cancel(&r.qp, b.cid), 0, "cancel B");
	for (int i = 0; i < 1001; i++)
		nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 8), 1, "A completes");
	CHECK(r.qp.nlate == 1 && r.qp.ncancelled == 0 && r.qp.nfree == 7 && a.calls == 1 &&
		  b.calls == 1,
	      "B's late completion consumed in the same call (its CID was still taken)");
	rig_fini(&r);

	/* A callback commits and rings C: reap goes on polling for it. */
	rig_init(&r, 8, 8, 0);
	chain_rig = &r;
	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = NVME_MODEL_OPC_ECHO;
	sqe.cdw2 = 1;
	chain_recs[0].tag = 1;
	chain_recs[0].calls = 0;
	CHECK_EQ(
	    upcie_nvme_qpair_enqueue(&r.qp, &sqe, chain_cb, &chain_recs[0], &chain_recs[0].cid), 0,
	    "enqueue A");
	n_submitted++;
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	/* Post C's completion as soon as it is rung: the model runs in its own thread. */
	nvme_model_start(&r.m);
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 8), 1, "A completes, its callback submits C");
	CHECK_EQ(upcie_nvme_qpair_wait(&r.qp, chain_recs[1].cid, UPCIE_NSEC_PER_SEC), 0,
		 "C completes");
	nvme_model_stop(&r.m);
	CHECK(chain_recs[0].calls == 1 && chain_recs[1].calls == 1 && chain_recs[1].dw0 == 2,
	      "both once, C with its tag");
	CHECK_EQ(r.qp.nfree, 7, "all CIDs free");
	rig_fini(&r);
}

/* Data end to end: writes through PRPs (split by MDTS), reads back through SGLs and PRPs. */
static void test_data(void)
{
	const uint32_t lba = 512;
	const size_t ns_bytes = (size_t)8 << 20, buf_bytes = (size_t)8 << 20;
	struct nvme_model_rng rng = { 0xda7a };
	struct nvme_model_iomap im;
	struct upcie_dmamem data, lmem;
	struct upcie_nvme_dptr_cfg cfg = { 128 * 1024, 12, false };
	struct upcie_nvme_qpair_cfg qcfg;
	struct upcie_nvme_qpair qp;
	struct nvme_model m;
	uint8_t *ns = (uint8_t *)calloc(1, ns_bytes);
	uint8_t *buf = (uint8_t *)aligned_alloc(4096, buf_bytes);
	uint8_t *expect = (uint8_t *)malloc(buf_bytes);
	uint8_t *lbuf = (uint8_t *)aligned_alloc(4096, 64 * 4096);
	void *sq = aligned_alloc(64, 64 * 64), *cq = aligned_alloc(64, 64 * 16);
	int bad = 0, cmds = 0, sgl_cmds = 0;
	uint64_t moved = 0;

	memset(&im, 0, sizeof(im));
	nvme_model_mem_lut(&data, buf, buf_bytes, 12, UINT64_C(0x880000000), true, &rng);
	nvme_model_mem_lut(&lmem, lbuf, 64 * 4096, 12, UINT64_C(0x990000000), true, &rng);
	nvme_model_iomap_add(&im, &data);
	nvme_model_iomap_add(&im, &lmem);
	nvme_model_init(&m, sq, 64, cq, 64, 1, ns, ns_bytes / lba, lba, 12, &im);
	memset(&qcfg, 0, sizeof(qcfg));
	qcfg.sq = sq;
	qcfg.cq = cq;
	qcfg.sqdb = &m.sqdb;
	qcfg.cqdb = &m.cqdb;
	qcfg.sq_depth = qcfg.cq_depth = 64;
	qcfg.qid = 1;
	upcie_nvme_qpair_init(&qp, &qcfg);

	for (int round = 0; round < 60; round++) {
		/* A random request: 1..3 non-overlapping segments following the PRP rules. */
		struct upcie_nvme_dseg segs[3], piece[3];
		struct upcie_nvme_split sp;
		uint64_t total = 0, slba, off, len;
		unsigned n = (unsigned)nvme_model_rng_range(&rng, 1, 3);
		int pn;

		for (unsigned i = 0; i < n; i++) {
			uint64_t pages = nvme_model_rng_range(&rng, 1, round % 10 ? 16 : 300);

			segs[i].mem = &data;
			segs[i].off =
			    (uint64_t)i * (2 << 20) + 4096 * nvme_model_rng_range(&rng, 0, 64);
			segs[i].len = pages * 4096;
			if (i == 0 && nvme_model_rng_range(&rng, 0, 1)) {
				uint64_t skew = 512 * nvme_model_rng_range(&rng, 1, 7);

				segs[i].off += skew;
				segs[i].len -= skew;
			}
			if (i + 1 == n && segs[i].len > 4096 && nvme_model_rng_range(&rng, 0, 1))
				segs[i].len -= 512 * nvme_model_rng_range(&rng, 1, 7);
			total += segs[i].len;
		}
		slba = nvme_model_rng_range(&rng, 0, ns_bytes / lba - total / lba);
		for (uint64_t b = 0; b < total; b++)
			expect[b] = (uint8_t)(nvme_model_rng_next(&rng) >> 24);
		for (int write = 1; write >= 0; write--) {
			/* write: the pattern goes out of the buffer; read: the buffer is cleared first */
			for (unsigned i = 0, p = 0; i < n; p += (unsigned)segs[i].len, i++)
				if (write)
					memcpy(buf + segs[i].off, expect + p, segs[i].len);
				else
					memset(buf + segs[i].off, 0, segs[i].len);
			upcie_nvme_split_init(&sp, segs, n, cfg.max_bytes, lba);
			while ((pn = upcie_nvme_split_next(&sp, piece, 3, &off, &len)) > 0) {
				struct upcie_nvme_sqe sqe;
				struct upcie_nvme_lists lists = { &lmem, 0, 32 };
				struct rec rc;
				uint16_t cid = 0;
				int ret;
				bool sgl = !write && (round & 1);

				if (write)
					upcie_nvme_cmd_write(&sqe, 1, slba + off / lba,
							     (uint32_t)(len / lba), 0);
				else
					upcie_nvme_cmd_read(&sqe, 1, slba + off / lba,
							    (uint32_t)(len / lba), 0);
				upcie_nvme_qpair_next_cid(&qp, &cid);
				lists.off =
				    (uint64_t)(cid % 2) * 32 * 4096; /* per-CID list pages */
				ret = sgl ? upcie_nvme_sgl_build(&sqe, piece, (unsigned)pn, &cfg,
								 &lists)
					  : upcie_nvme_prp_build(&sqe, piece, (unsigned)pn, &cfg,
								 &lists);
				if (ret < 0) {
					bad++;
					continue;
				}
				sgl_cmds += sgl;
				memset(&rc, 0, sizeof(rc));
				if (upcie_nvme_qpair_enqueue(&qp, &sqe, rec_cb, &rc, &rc.cid)) {
					bad++;
					continue;
				}
				n_submitted++;
				upcie_nvme_qpair_ring(&qp);
				nvme_model_step(&m);
				if (upcie_nvme_qpair_reap(&qp, 4) != 1 || rc.calls != 1 || rc.code)
					bad++;
				cmds++;
				moved += len;
			}
		}
		if (memcmp(ns + slba * lba, expect, total))
			bad++; /* the namespace holds what was written */
		for (unsigned i = 0, p = 0; i < n; p += (unsigned)segs[i].len, i++)
			if (memcmp(buf + segs[i].off, expect + p, segs[i].len))
				bad++; /* the buffer holds what was read */
	}
	CHECK(bad == 0, "data end to end: %d commands (%d SGL reads), %llu bytes, all verified",
	      cmds, sgl_cmds, (unsigned long long)moved);
	upcie_nvme_qpair_fini(&qp);
	nvme_model_fini(&m);
	nvme_model_iomap_fini(&im);
	upcie_dmamem_destroy(&data);
	upcie_dmamem_destroy(&lmem);
	free(ns);
	free(buf);
	free(expect);
	free(lbuf);
	free(sq);
	free(cq);
}

static void test_threaded(void)
{
	struct rig r;
	const uint32_t total = 200000;
	struct rec *recs = (struct rec *)calloc(total, sizeof(*recs));
	struct nvme_model_rng rng = { 777 };
	uint32_t next = 0;
	uint64_t cb0 = n_callbacks, t0;
	int bad = 0, n;

	rig_init(&r, 32, 32, 0);
	r.m.ooo = true;
	nvme_model_start(&r.m);
	t0 = upcie_time_ns();
	while ((next < total || upcie_nvme_qpair_inflight(&r.qp)) &&
	       upcie_time_ns() - t0 < 60 * UPCIE_NSEC_PER_SEC) {
		uint32_t batch = (uint32_t)nvme_model_rng_range(&rng, 1, 16);

		for (uint32_t i = 0; i < batch && next < total; i++, next++)
			if (submit_echo(&r, &recs[next], next))
				break;
		upcie_nvme_qpair_ring(&r.qp);
		n = upcie_nvme_qpair_reap(&r.qp, 32);
		bad += n < 0;
	}
	nvme_model_stop(&r.m);
	for (uint32_t i = 0; i < total; i++)
		bad += recs[i].calls != 1 || recs[i].dw0 != i;
	CHECK(bad == 0 && n_callbacks - cb0 == total && n_mismatch == 0,
	      "threaded controller: %u commands, each completed once, matched by CID", total);
	rig_fini(&r);
	free(recs);
}

static void test_fini_and_config(void)
{
	struct rig r;
	struct rec recs[5];
	struct upcie_nvme_qpair qp;
	struct upcie_nvme_qpair_cfg cfg;
	uint32_t db[2];
	static uint8_t ring[4096] __attribute__((aligned(64)));
	static uint8_t tables[1024] __attribute__((aligned(16)));

	rig_init(&r, 8, 8, 0);
	for (int i = 0; i < 5; i++)
		submit_echo(&r, &recs[i], (uint32_t)i);
	upcie_nvme_qpair_ring(&r.qp);
	upcie_nvme_qpair_fini(&r.qp);
	CHECK(recs[0].calls == 1 && recs[4].calls == 1 && recs[2].err == -ECANCELED,
	      "fini ends commands in flight with -ECANCELED, once each");
	upcie_nvme_qpair_fini(&r.qp); /* zeroed: no-op */
	CHECK(recs[0].calls == 1, "second fini is a no-op");
	rig_fini(&r);

	memset(&cfg, 0, sizeof(cfg));
	cfg.sq = ring;
	cfg.cq = ring + 2048;
	cfg.sqdb = &db[0];
	cfg.cqdb = &db[1];
	cfg.sq_depth = 1;
	CHECK_EQ(upcie_nvme_qpair_init(&qp, &cfg), -EINVAL, "depth 1 refused");
	cfg.sq_depth = 65537;
	CHECK_EQ(upcie_nvme_qpair_init(&qp, &cfg), -EINVAL, "depth 65537 refused");
	cfg.sq_depth = 16;
	cfg.ncids = 16;
	CHECK_EQ(upcie_nvme_qpair_init(&qp, &cfg), -EINVAL, "16 CIDs with a 16-deep CQ refused");
	cfg.ncids = 0;
	cfg.cqdb = NULL;
	CHECK_EQ(upcie_nvme_qpair_init(&qp, &cfg), -EINVAL, "missing doorbell refused");
	cfg.cqdb = &db[1];
	cfg.cq = ring + 8;
	CHECK_EQ(upcie_nvme_qpair_init(&qp, &cfg), -EINVAL, "misaligned CQ refused");
	cfg.cq = ring + 2048;
	CHECK_EQ(upcie_nvme_qpair_init(NULL, &cfg), -EINVAL, "no qpair");
	cfg.tables = tables;
	CHECK(upcie_nvme_qpair_tables_size(15) <= sizeof(tables), "tables fit");
	CHECK_EQ(upcie_nvme_qpair_init(&qp, &cfg), 0, "caller-provided tables");
	CHECK(qp.tables_owned == NULL && qp.ncids == 15 && qp.phase == 1, "15 CIDs, phase 1");
	CHECK_EQ(upcie_nvme_qpair_enqueue(&qp, NULL, NULL, NULL, NULL), -EINVAL, "NULL command");
	CHECK_EQ(qp.nfree, 15, "refused command took no CID");
	upcie_nvme_qpair_fini(&qp);
}

/* A callback that submits two commands: the second gets the CID freed just before it. */
static struct rig *reuse_rig;
static struct rec reuse_recs[2];

static void reuse_cb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	rec_cb(ctx, cqe, err);
	submit_echo(reuse_rig, &reuse_recs[0], 501);
	submit_echo(reuse_rig, &reuse_recs[1], 502);
	upcie_nvme_qpair_ring(&reuse_rig->qp);
}

/*
 * submit_sync waits for its own command, not for its CID: X completes, then Y, whose callback
 * submits two commands, the second of which gets X's CID slot back.
 */
static void test_cid_reuse_sync(void)
{
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_cqe cqe;
	struct rig r;
	struct rec y;
	uint16_t x = 0, cid = 0;
	int err;

	rig_init(&r, 16, 16, 0);
	reuse_rig = &r;
	memset(reuse_recs, 0, sizeof(reuse_recs));
	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = NVME_MODEL_OPC_ECHO;
	sqe.cdw2 = 9;
	y.tag = 9;
	y.calls = 0;
	upcie_nvme_qpair_enqueue(&r.qp, &sqe, reuse_cb, &y, &y.cid);
	n_submitted++;
	upcie_nvme_qpair_next_cid(&r.qp, &x);
	/* X's completion (predicted CID) goes before Y's into the CQ */
	nvme_model_post_raw(&r.m, x, 0, false);
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	sqe.cdw2 = 7;
	err = upcie_nvme_qpair_submit_sync(&r.qp, &sqe, 20 * UPCIE_NSEC_PER_MSEC, &cqe, &cid);
	CHECK(err == 0 && cid == x && upcie_nvme_cqe_cid(&cqe) == x,
	      "cid reuse: submit_sync returns when its command completed (%d), although a callback "
	      "in the same reap took its CID slot again",
	      err);
	CHECK(y.calls == 1 && reuse_recs[0].calls == 0 && reuse_recs[1].calls == 0,
	      "the commands the callback submitted are still outstanding, not cancelled");
	n_submitted += 2;
	for (int i = 0; i < 4; i++)
		nvme_model_step(&r.m);
	/* the model also completes X itself: a duplicate of the completion X had */
	while ((err = upcie_nvme_qpair_reap(&r.qp, 16)) != 0)
		;
	CHECK(reuse_recs[0].calls == 1 && reuse_recs[1].calls == 1 && reuse_recs[0].dw0 == 501 &&
		  reuse_recs[1].dw0 == 502,
	      "and complete later, once each, with their own results");
	rig_fini(&r);
}

static int n_logs;
static void count_log(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	(void)msg;
	n_logs++;
}

/*
 * What a broken or hostile device writes into the CQ: a duplicate completion after the CID was
 * handed out again, a duplicate while it is free, a CID out of range, an SQ head that goes
 * backwards or beyond the tail. Each is detected and counted, logged a few times only, and no
 * callback runs for the wrong command.
 */
static void test_hostile_cq(void)
{
	struct rig r;
	struct rec a, b, e, f;
	uint64_t bad0, mismatch0;
	uint16_t h;
	int n, logs0;

	upcie_log_set_handler(count_log, NULL);
	upcie_log_set_level(UPCIE_LOG_WARN);
	n_logs = 0;
	rig_init(&r, 8, 8, 0);
	r.m.inject = inject_drop_or_delay;
	submit_echo(&r, &a, 1);
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	CHECK_EQ(upcie_nvme_qpair_reap(&r.qp, 8), 1, "hostile: A completes");
	/* B is delayed; the device repeats A's completion meanwhile */
	submit_echo(&r, &b, 777);
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	nvme_model_post_raw(&r.m, a.cid, 0, false);
	nvme_model_step(&r.m);
	n = upcie_nvme_qpair_reap(&r.qp, 8);
	CHECK(n == -EPROTO && b.calls == 0 && a.calls == 1 && r.qp.nbad == 1,
	      "A's duplicate completion, after B got A's CID slot: -EPROTO, B not completed by it "
	      "(%d, B %d calls, %llu bad)",
	      n, b.calls, (unsigned long long)r.qp.nbad);
	for (int i = 0; i < 1001; i++)
		nvme_model_step(&r.m);
	CHECK(upcie_nvme_qpair_reap(&r.qp, 8) == 1 && b.calls == 1 && b.dw0 == 777,
	      "B completes with its own completion");
	nvme_model_post_raw(&r.m, b.cid, 0, false);
	nvme_model_step(&r.m);
	CHECK(upcie_nvme_qpair_reap(&r.qp, 8) == -EPROTO && b.calls == 1 && r.qp.nbad == 2,
	      "B's duplicate while its CID is free: -EPROTO");
	nvme_model_post_raw(&r.m, 0xfff0, 0, false);
	nvme_model_step(&r.m);
	CHECK(upcie_nvme_qpair_reap(&r.qp, 8) == -EPROTO && r.qp.nbad == 3,
	      "CID 0xfff0, beyond the table: -EPROTO");

	/* SQ head going backwards: E never completes by itself, the device posts for it (a raw
	 * completion carries no echo result: not a mismatch here) */
	mismatch0 = n_mismatch;
	submit_echo(&r, &e, 666);
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	h = r.qp.sq_head;
	nvme_model_post_raw_sqhd(&r.m, e.cid, 0, false, (int32_t)((h + 8 - 2) % 8));
	nvme_model_step(&r.m);
	n = upcie_nvme_qpair_reap(&r.qp, 8);
	CHECK(
	    n == 1 && e.calls == 1 && r.qp.nbad_sqhd == 1 && r.qp.sq_head == h,
	    "an SQ head 2 entries back (%u -> %u): counted, not taken (%llu bad SQ heads, head %u)",
	    h, (h + 8 - 2) % 8, (unsigned long long)r.qp.nbad_sqhd, r.qp.sq_head);
	/* ... and beyond the tail the host rang */
	submit_echo(&r, &f, 666);
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	h = r.qp.sq_head;
	nvme_model_post_raw_sqhd(&r.m, f.cid, 0, false, (int32_t)((r.qp.sq_db + 2) % 8));
	nvme_model_step(&r.m);
	n = upcie_nvme_qpair_reap(&r.qp, 8);
	CHECK(n == 1 && f.calls == 1 && r.qp.nbad_sqhd == 2 && r.qp.sq_head == h,
	      "an SQ head 2 entries beyond the rung tail %u: counted, not taken (%llu bad)",
	      r.qp.sq_db, (unsigned long long)r.qp.nbad_sqhd);
	n_mismatch = mismatch0;

	/* a flood of bad entries is logged a few times, not once each */
	logs0 = n_logs;
	bad0 = r.qp.nbad;
	for (int k = 0; k < 100; k++) {
		for (int i = 0; i < 5; i++)
			nvme_model_post_raw(&r.m, (uint16_t)(0x8000 + k * 5 + i), 0, false);
		nvme_model_step(&r.m);
		while (upcie_nvme_qpair_reap(&r.qp, 8) < 0)
			;
	}
	CHECK(r.qp.nbad - bad0 == 500 && n_logs - logs0 >= 1 && n_logs - logs0 <= 16,
	      "500 bad entries: counted, logged %d times", n_logs - logs0);
	CHECK(logs0 >= 3, "the earlier bad entries were logged (%d)", logs0);
	submit_echo(&r, &a, 3);
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	CHECK(upcie_nvme_qpair_reap(&r.qp, 8) == 1 && a.calls == 1 && a.dw0 == 3 &&
		  r.qp.nfree == 7 && r.qp.ndup == 1,
	      "the queue pair still works: a new command completes; one bad entry repeated the "
	      "last completion of its slot (%llu), A's came after its slot moved on",
	      (unsigned long long)r.qp.ndup);
	rig_fini(&r);
	upcie_log_set_handler(NULL, NULL);
	upcie_log_set_level(UPCIE_LOG_NONE);
}

/* An SQ head reported late (but never backwards) is legal: less room, nothing lost. */
static void test_sqhd_lag(void)
{
	struct rig r;
	const uint32_t total = 5000;
	struct rec *recs = (struct rec *)calloc(total, sizeof(*recs));
	uint32_t next = 0;
	int bad = 0;

	rig_init(&r, 8, 8, 0);
	r.m.sqhd_lag = 3;
	while (next < total || upcie_nvme_qpair_inflight(&r.qp)) {
		while (next < total && submit_echo(&r, &recs[next], next) == 0)
			next++;
		upcie_nvme_qpair_ring(&r.qp);
		nvme_model_step(&r.m);
		bad += upcie_nvme_qpair_reap(&r.qp, 8) < 0;
	}
	for (uint32_t i = 0; i < total; i++)
		bad += recs[i].calls != 1 || recs[i].dw0 != i;
	CHECK(bad == 0 && r.qp.nbad_sqhd == 0,
	      "SQ head lagging 3 entries: %u commands, each completed once, no SQ head refused",
	      total);
	rig_fini(&r);
	free(recs);
}

/*
 * No command is ever CID FFFFh (the Error Information log's "no command"): with a power-of-two
 * number of CIDs, every slot's CIDs, generation after generation, stay below it; the negative
 * control walks the same generations with as many slots as CIDs (the old table size) and meets
 * FFFFh.
 */
static void test_cid_never_ffff(void)
{
	static const uint32_t counts[] = { 1, 2, 4, 16, 64, 255, 256, 1024, 2047 };
	uint32_t hits = 0, ctl = 0;

	for (unsigned k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
		struct rig r;
		uint32_t n = counts[k];

		if (rig_init(&r, n + 1 < 4 ? 4 : n + 1, n + 1 < 4 ? 4 : n + 1, n)) {
			CHECK(0, "qpair with %u CIDs", n);
			continue;
		}
		for (uint32_t c = 0; c < n; c++) {
			uint16_t cid = (uint16_t)c;

			for (uint32_t g = 0; g < 65536u / (r.qp.cid_mask + 1u) + 1; g++) {
				hits += cid == 0xffff;
				cid = upcie_nvme_qpair_cid_next_(&r.qp, cid);
			}
		}
		rig_fini(&r);
		/* the control: n slots for n CIDs, when n is a power of two */
		if (n & (n - 1))
			continue;
		for (uint32_t c = 0; c < n; c++) {
			uint16_t cid = (uint16_t)c;

			for (uint32_t g = 0; g < 65536u / n + 1; g++) {
				ctl += cid == 0xffff;
				cid = (uint16_t)(cid + n);
			}
		}
	}
	CHECK_EQ(hits, 0, "no CID is FFFFh, for 1..2047 CIDs (power of two or not)");
	CHECK(ctl > 0, "control: as many slots as CIDs meets FFFFh (%u times)", ctl);
}

/* A completion naming another SQ is counted (nbad_sqid), logged, and taken by its CID. */
static void test_sqid_checked(void)
{
	struct rec rc[2];
	struct rig r;
	int n;

	rig_init(&r, 8, 8, 0);
	submit_echo(&r, &rc[0], 11);
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	n = upcie_nvme_qpair_reap(&r.qp, 8);
	CHECK(n == 1 && r.qp.nbad_sqid == 0, "own SQ identifier: not counted (%d)", n);
	r.m.sqid = 7; /* a controller that names the wrong SQ */
	submit_echo(&r, &rc[1], 12);
	upcie_nvme_qpair_ring(&r.qp);
	nvme_model_step(&r.m);
	n = upcie_nvme_qpair_reap(&r.qp, 8);
	CHECK(n == 1 && r.qp.nbad_sqid == 1 && rc[1].calls == 1,
	      "CQE SQID 7 on queue 1: counted in nbad_sqid, the command completed once (%d, %llu)",
	      n, (unsigned long long)r.qp.nbad_sqid);
	rig_fini(&r);
}

int main(void)
{
	upcie_log_set_level(UPCIE_LOG_NONE);
	test_wrap();
	test_out_of_order();
	test_backpressure();
	test_error_status();
	test_timeout_cancel();
	test_unknown_cid();
	test_commit();
	test_reap_stop();
	test_data();
	test_threaded();
	test_fini_and_config();
	test_cid_reuse_sync();
	test_hostile_cq();
	test_sqhd_lag();
	test_cid_never_ffff();
	test_sqid_checked();
	CHECK_EQ(n_mismatch, 0, "no completion was matched to the wrong command");
	return check_done();
}
