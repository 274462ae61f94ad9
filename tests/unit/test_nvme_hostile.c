/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Regression tests for what the fuzzers (tests/fuzz) found in the handling of device-written
 * data, each replaying the finding by hand: a broken controller that refills the completion
 * queue behind the entries one reap consumes, so the head comes full circle within that reap
 * (through the completion of a command a callback submits again, posted at once, or through a
 * late and a bad entry): the reap must still tell the controller the head.
 */
#include <upcie/nvme/qpair.h>

#include <string.h>

#include "check.h"

#define SENTINEL 0xdeadbeefu

static struct upcie_nvme_qpair qp;
static struct upcie_nvme_sqe sq[4] __attribute__((aligned(64)));
static struct upcie_nvme_cqe cq[2] __attribute__((aligned(64)));
static volatile uint32_t sqdb, cqdb;
static unsigned calls;
static bool again;

static void post(unsigned idx, uint16_t cid, uint32_t phase)
{
	cq[idx].dw0 = cq[idx].dw1 = 0;
	cq[idx].dw2 = 0;
	cq[idx].dw3 = upcie_nvme_cqe_dw3_make(cid, phase, 0, false);
}

static void cb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct upcie_nvme_sqe sqe;

	(void)ctx;
	(void)cqe;
	(void)err;
	calls++;
	memset(&sqe, 0, sizeof(sqe));
	if (again && calls == 1) {
		uint16_t cid = 0xffff;

		/* the device completes the new command at once, in the entry behind this one */
		if (!upcie_nvme_qpair_submit(&qp, &sqe, cb, NULL, &cid))
			post(1, cid, 1);
	}
}

static void setup(void)
{
	struct upcie_nvme_qpair_cfg cfg;

	memset(&cfg, 0, sizeof(cfg));
	memset(sq, 0, sizeof(sq));
	cfg.sq = sq;
	cfg.cq = cq;
	cfg.sqdb = &sqdb;
	cfg.cqdb = &cqdb;
	cfg.sq_depth = 4;
	cfg.cq_depth = 2; /* one CID */
	cfg.qid = 1;
	upcie_nvme_qpair_init(&qp, &cfg);
	calls = 0;
}

static void t_full_circle(void)
{
	struct upcie_nvme_sqe sqe;
	uint16_t cid = 0;
	int n;

	/* callbacks submit again; the device has already posted the next completion */
	setup();
	again = true;
	memset(&sqe, 0, sizeof(sqe));
	upcie_nvme_qpair_submit(&qp, &sqe, cb, NULL, &cid);
	post(0, cid, 1);
	post(1, (uint16_t)(cid ^ 0x8000), 0); /* not yet posted: the callback's command takes it */
	cqdb = SENTINEL;
	n = upcie_nvme_qpair_reap(&qp, 0xffffffffu);
	CHECK(n == 2 && calls == 2 && qp.cq_head == 0 && qp.phase == 0,
	      "two completions in a two-entry CQ: the head comes full circle (%d)", n);
	CHECK(cqdb == 0, "and the controller is told the head: doorbell 0x%x", cqdb);
	again = false;
	upcie_nvme_qpair_fini(&qp);

	/* a late completion of a cancelled command, then a bad entry for the same CID */
	setup();
	upcie_nvme_qpair_submit(&qp, &sqe, cb, NULL, NULL);
	upcie_nvme_qpair_cancel(&qp, 0);
	post(0, 0, 1);
	post(1, 0, 1);
	cqdb = SENTINEL;
	n = upcie_nvme_qpair_reap(&qp, 0xffffffffu);
	CHECK(n == -EPROTO && qp.nlate == 1 && qp.nbad == 1 && qp.cq_head == 0,
	      "a late entry and a bad one: full circle, -EPROTO (%d)", n);
	CHECK(cqdb == 0, "the doorbell is written here too: 0x%x", cqdb);
	upcie_nvme_qpair_fini(&qp);
}

int main(void)
{
	t_full_circle();
	return check_done();
}
