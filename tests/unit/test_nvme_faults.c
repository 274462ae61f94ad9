/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * nvme/ctrl.h and nvme/ns.h against a controller model that misbehaves as real drives do
 * (nvme_ctrl_model.h): commands that never complete or complete late (after an abort, after a
 * reset), Aborts that fail or are never answered, a fatal status (CSTS.CFS) or a vanished device
 * (all ones) in the middle of I/O, a slow Create I/O CQ, a failing Delete I/O SQ, a controller
 * found enabling at takeover or slow to become ready, a completion posted after a reset into the
 * recreated queue, a controller with a write cache that vanishes while idle and is closed. Every
 * test ends with the exactly-once checker (nvme_eo.h): each submitted operation got exactly one
 * callback, and the model never touched a buffer after it was handed back. Also: a fatal status
 * found by another thread ends at once the wait of an interrupt queue's owner asleep on its
 * vector (the halt wakes it; the control removes that wake) and a synchronous call waiting for
 * queue room.
 */

/*
 * The negative control of the halt's wake (t_escalation_wakes_irq()): while set, a halt does
 * not wake the interrupt queues' owners (UPCIE_NVME_TEST_NO_HALT_WAKE, nvme/ctrl_regs.h). Only
 * that test sets it, before its threads start.
 */
static int no_halt_wake;
#define UPCIE_NVME_TEST_NO_HALT_WAKE no_halt_wake

#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "check.h"
#include "nvme_ctrl_model.h"
#include "nvme_eo.h"

#define MiB	  (UINT64_C(1) << 20)
#define HOST_IOVA UINT64_C(0x40000000)
#define DATA_IOVA UINT64_C(0x80000000)
#define NS_BLOCKS 8192u
#define LBA	  512u
#define DATA_SIZE (4 * MiB)
#define NBUF	  64 /* data buffers of 64 KiB, each an exactly-once region */
#define BUF	  (64 * 1024)
#define MS	  UPCIE_NSEC_PER_MSEC
#define ABORT_MS  300 /* the controllers' abort timeout here */

struct rig {
	struct nvme_cmodel cm;
	struct nvme_model_iomap im;
	struct nvme_model_rng rng;
	struct nvme_eo eo;
	uint8_t *ns;
	void *host_va, *data_va;
	struct upcie_dmamem host, data;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ns nsp;
	struct upcie_nvme_ioq q;
	int32_t region[NBUF];
	bool started;
};

static void log_print(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	printf("#   log: %s\n", msg);
}

static void rig_setup(struct rig *r)
{
	memset(r, 0, sizeof(*r));
	r->rng.s = 0xfa17;
	r->ns = (uint8_t *)calloc(NS_BLOCKS, LBA);
	r->host_va = aligned_alloc(2 * MiB, 16 * MiB);
	r->data_va = aligned_alloc(2 * MiB, DATA_SIZE);
	memset(r->host_va, 0, 16 * MiB);
	memset(r->data_va, 0, DATA_SIZE);
	upcie_dmamem_init_arith(&r->host, r->host_va, 16 * MiB, HOST_IOVA);
	nvme_model_mem_lut(&r->data, r->data_va, DATA_SIZE, 12, DATA_IOVA, true, &r->rng);
	nvme_model_iomap_add(&r->im, &r->host);
	nvme_model_iomap_add(&r->im, &r->data);
	nvme_cmodel_init(&r->cm, &r->im, r->ns, NS_BLOCKS, LBA);
	nvme_eo_init(&r->eo);
	for (int i = 0; i < NBUF; i++)
		r->region[i] =
		    nvme_eo_region(&r->eo, (uint8_t *)r->data_va + (uint64_t)i * BUF, BUF);
	r->cm.dma = nvme_eo_dma;
	r->cm.dma_ctx = &r->eo;
	for (uint64_t i = 0; i < (uint64_t)NS_BLOCKS * LBA; i++)
		r->ns[i] = (uint8_t)(i * 7 + (i >> 9));
}

/* Start the model, bring the controller up with `o` (NULL: defaults, a 100 ms admin timeout),
 * open namespace 1 and create one I/O queue with `qo`. */
static int rig_up(struct rig *r, const struct upcie_nvme_ctrl_opts *o,
		  const struct upcie_nvme_ioq_opts *qo)
{
	struct upcie_nvme_ctrl_opts def;
	int err;

	if (!o) {
		memset(&def, 0, sizeof(def));
		def.admin_timeout_ns = 100 * MS;
		def.abort_timeout_ns = ABORT_MS * MS;
		o = &def;
	}
	r->started = nvme_cmodel_start(&r->cm) == 0;
	err = upcie_nvme_ctrl_init(&r->c, r->cm.regs, NVME_CMODEL_REGS, &r->host, o);
	if (!err)
		err = upcie_nvme_ns_open(&r->nsp, &r->c, 1);
	if (!err)
		err = upcie_nvme_ioq_create(&r->q, &r->c, qo);
	return err;
}

static void rig_teardown(struct rig *r)
{
	upcie_nvme_ioq_delete(&r->q);
	upcie_nvme_ctrl_close(&r->c);
	if (r->started)
		nvme_cmodel_stop(&r->cm);
	nvme_cmodel_fini(&r->cm);
	nvme_eo_fini(&r->eo);
	upcie_dmamem_destroy(&r->data);
	upcie_dmamem_destroy(&r->host);
	nvme_model_iomap_fini(&r->im);
	free(r->ns);
	free(r->host_va);
	free(r->data_va);
}

/* An I/O of the test: a request on one data buffer, recorded by the checker. */
struct op {
	struct upcie_nvme_req req;
	struct rig *r;
	uint64_t id;
	int buf;
	int calls;
	uint32_t cc_at_cb, csts_at_cb; /* the controller's registers when the callback ran */
	uint32_t ndis_at_cb;	       /* the model's disables then */
	void (*then)(struct op *o);    /* called from the callback */
};

static void op_cb(struct upcie_nvme_req *req)
{
	struct op *o = (struct op *)req->ctx;

	o->calls++;
	o->cc_at_cb = nvme_cmodel_rd(&o->r->cm, UPCIE_NVME_REG_CC);
	o->csts_at_cb = nvme_cmodel_rd(&o->r->cm, UPCIE_NVME_REG_CSTS);
	o->ndis_at_cb = __atomic_load_n(&o->r->cm.n_disable, __ATOMIC_ACQUIRE);
	nvme_eo_done(&o->r->eo, o->id, req->err);
	if (o->then)
		o->then(o);
}

/* Read `len` bytes at `slba` into buffer `buf` asynchronously; `then` runs in its callback.
 * Returns the submit result. */
static int op_read(struct rig *r, struct op *o, int buf, uint64_t slba, uint64_t len,
		   void (*then)(struct op *o))
{
	int err;

	memset(o, 0, sizeof(*o));
	o->then = then;
	o->req.cb = op_cb;
	o->req.ctx = o;
	o->r = r;
	o->buf = buf;
	o->id = nvme_eo_op(&r->eo);
	nvme_eo_lend(&r->eo, o->id, r->region[buf], r->q.qid, NVME_EO_NOCID);
	err =
	    upcie_nvme_ioq_read(&r->q, &r->nsp, slba, &r->data, (uint64_t)buf * BUF, len, &o->req);
	if (err)
		nvme_eo_unlend(&r->eo, o->id);
	return err;
}

/* Hold Reads in the controller from now on, or not. */
static void r_hold(struct rig *r, bool on)
{
	__atomic_store_n(&r->cm.hold_opc, on ? UPCIE_NVME_NVM_READ : 0, __ATOMIC_RELEASE);
}

static bool data_ok(struct rig *r, int buf, uint64_t slba, uint64_t len)
{
	return !memcmp((uint8_t *)r->data_va + (uint64_t)buf * BUF, r->ns + slba * LBA, len);
}

/* Wait (bounded) until cond() holds; the model runs in its own thread. */
static bool until(bool (*cond)(struct rig *), struct rig *r, uint64_t ns)
{
	struct upcie_deadline dl;

	upcie_deadline_set(&dl, ns);
	while (!cond(r))
		if (upcie_deadline_passed(&dl))
			return false;
		else
			upcie_sleep_ns(100 * UPCIE_NSEC_PER_USEC);
	return true;
}

static bool q1_holds_one(struct rig *r)
{
	return __atomic_load_n(&r->cm.q[1].m.nheld, __ATOMIC_ACQUIRE) >= 1;
}

/* The model has nothing of queue 1 left to complete (or no queue 1 any more). */
static bool q1_idle(struct rig *r)
{
	return !__atomic_load_n(&r->cm.q[1].sq, __ATOMIC_ACQUIRE) ||
	       (!__atomic_load_n(&r->cm.q[1].m.nheld, __ATOMIC_ACQUIRE) &&
		!__atomic_load_n(&r->cm.q[1].m.npend, __ATOMIC_ACQUIRE) &&
		!__atomic_load_n(&r->cm.release_req, __ATOMIC_ACQUIRE));
}

/* The model's registers read all ones. */
static bool model_vanished(struct rig *r)
{
	return __atomic_load_n(&r->cm.vanish, __ATOMIC_ACQUIRE);
}

/* The model has seen CC.EN = 0 and is idle. */
static bool model_disabled(struct rig *r)
{
	return !__atomic_load_n(&r->cm.en_at_ns, __ATOMIC_ACQUIRE) &&
	       !__atomic_load_n(&r->cm.rdy, __ATOMIC_ACQUIRE);
}

/* A synchronous read of `len` bytes at `slba` into buffer `buf` on `q`, through the checker. */
static int read_checked(struct rig *r, struct upcie_nvme_ioq *q, int buf, uint64_t slba,
			uint64_t len)
{
	uint64_t id = nvme_eo_op(&r->eo);
	int err;

	nvme_eo_lend(&r->eo, id, r->region[buf], q->qid, NVME_EO_NOCID);
	err = upcie_nvme_ioq_read_sync(q, &r->nsp, slba, &r->data, (uint64_t)buf * BUF, len, NULL);
	nvme_eo_done(&r->eo, id, err);
	return err;
}

/* 1. Reset disables the controller before it ends the commands in flight. */
static void t_reset_disables_first(void)
{
	struct rig r;
	struct op a;
	uint32_t ndis;
	int err;

	rig_setup(&r);
	rig_up(&r, NULL, NULL);
	r.cm.hold_opc = UPCIE_NVME_NVM_READ;
	err = op_read(&r, &a, 0, 0, 4096, NULL);
	CHECK(err == 0 && until(q1_holds_one, &r, UPCIE_NSEC_PER_SEC),
	      "reset/disable: a read the controller holds (%d)", err);
	r.cm.hold_opc = 0;
	ndis = __atomic_load_n(&r.cm.n_disable, __ATOMIC_ACQUIRE);
	err = upcie_nvme_ctrl_reset(&r.c);
	CHECK(err == 0 && a.calls == 1 && a.req.err == -ECANCELED,
	      "reset ended the read once with -ECANCELED (%d, %d calls, %d)", err, a.calls,
	      a.req.err);
	/* the callback runs once the reset is over (no lock held), the disable long before it */
	CHECK(a.ndis_at_cb > ndis && upcie_nvme_cc_en(a.cc_at_cb),
	      "its callback ran after the controller was disabled (%u disables before, %u at the "
	      "callback) and brought back (CC 0x%08x)",
	      ndis, a.ndis_at_cb, a.cc_at_cb);
	nvme_cmodel_release(&r.cm);
	until(q1_idle, &r, UPCIE_NSEC_PER_SEC);
	nvme_eo_check(&r.eo, "reset/disable");
	rig_teardown(&r);
}

/* 2. A command submitted from a cancel callback during reset runs after the reset. */
static struct op resub_b;

static void resubmit(struct op *o)
{
	if (o->req.err == -ECANCELED)
		op_read(o->r, &resub_b, 1, 100, 4096, NULL);
}

static void t_reset_resubmit(void)
{
	struct upcie_nvme_req x;
	struct rig r;
	struct op a;
	uint32_t inflight;
	int err;

	rig_setup(&r);
	rig_up(&r, NULL, NULL);
	/* X (a Flush) and A (a held Read) go together; X completes, so its CID, below A's, is the
	 * one a new command gets */
	r.cm.hold_opc = UPCIE_NVME_NVM_READ;
	memset(&x, 0, sizeof(x));
	err = upcie_nvme_ioq_flush(&r.q, &r.nsp, &x);
	if (!err)
		err = op_read(&r, &a, 0, 0, 4096, resubmit);
	if (!err)
		err = upcie_nvme_ioq_wait(&r.q, &x, UPCIE_NSEC_PER_SEC);
	until(q1_holds_one, &r, UPCIE_NSEC_PER_SEC);
	r.cm.hold_opc = 0;
	memset(&resub_b, 0, sizeof(resub_b));
	err = upcie_nvme_ctrl_reset(&r.c);
	inflight = upcie_nvme_qpair_inflight(&r.q.qp);
	CHECK(err == 0 && a.calls == 1 && resub_b.id && (resub_b.calls == 1 || inflight == 1),
	      "reset/resubmit: A cancelled once, B submitted from its callback is accounted for "
	      "(%d in flight, B %d calls)",
	      inflight, resub_b.calls);
	err = resub_b.calls ? 0 : upcie_nvme_ioq_wait(&r.q, &resub_b.req, UPCIE_NSEC_PER_SEC);
	CHECK(err == 0 && resub_b.calls == 1 && resub_b.req.err == 0 && data_ok(&r, 1, 100, 4096),
	      "B ran after the reset: completed once with its data (%d, %d calls, %d)", err,
	      resub_b.calls, resub_b.req.err);
	nvme_eo_check(&r.eo, "reset/resubmit");
	rig_teardown(&r);
}

/* 3. Waiting for a command whose callback submitted another one, which got its CID. */
static struct op reuse_c;

static void submit_c(struct op *o)
{
	r_hold(o->r, true); /* C stays with the controller */
	op_read(o->r, &reuse_c, 2, 200, 4096, NULL);
}

static void t_cid_reuse_wait(void)
{
	struct rig r;
	struct op b;
	uint16_t cid_b = 0;
	uint64_t t0, ms;
	int err;

	rig_setup(&r);
	rig_up(&r, NULL, NULL);
	r.cm.abort_aborts = false;
	memset(&reuse_c, 0, sizeof(reuse_c));
	upcie_nvme_qpair_next_cid(&r.q.qp, &cid_b);
	err = op_read(&r, &b, 1, 8, 4096, submit_c);
	t0 = upcie_time_ns();
	if (!err)
		err = upcie_nvme_ioq_wait_cid(&r.q, cid_b, 200 * MS);
	ms = (upcie_time_ns() - t0) / MS;
	CHECK(err == 0 && b.calls == 1 && ms < 100,
	      "cid reuse: waiting for B returns when B completed (%d after %llu ms), although "
	      "B's callback submitted C, which got B's CID slot",
	      err, (unsigned long long)ms);
	CHECK(reuse_c.id && reuse_c.calls == 0,
	      "C, which the controller still holds, was not cancelled (%d calls, %d)",
	      reuse_c.calls, reuse_c.req.err);
	r_hold(&r, false);
	nvme_cmodel_release(&r.cm);
	err = reuse_c.calls ? 0 : upcie_nvme_ioq_wait(&r.q, &reuse_c.req, UPCIE_NSEC_PER_SEC);
	CHECK(err == 0 && reuse_c.calls == 1 && reuse_c.req.err == 0 && data_ok(&r, 2, 200, 4096),
	      "C completes later with its own status and data (%d, %d)", err, reuse_c.req.err);
	until(q1_idle, &r, UPCIE_NSEC_PER_SEC);
	nvme_eo_check(&r.eo, "cid reuse");
	rig_teardown(&r);
}

/* 4a. A synchronous read times out and the controller does not abort it. */
static void t_timeout_io(void)
{
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_io io;
	struct rig r;
	uint64_t id;
	int err;

	rig_setup(&r);
	rig_up(&r, NULL, NULL);
	r.cm.abort_aborts = false;
	r.cm.hold_opc = UPCIE_NVME_NVM_READ;
	seg.mem = &r.data;
	seg.off = 3 * BUF;
	seg.len = 4096;
	memset(&io, 0, sizeof(io));
	io.opc = UPCIE_NVME_NVM_READ;
	io.slba = 300;
	io.segs = &seg;
	io.nsegs = 1;
	id = nvme_eo_op(&r.eo);
	nvme_eo_lend(&r.eo, id, r.region[3], r.q.qid, NVME_EO_NOCID);
	err = upcie_nvme_ioq_io_sync(&r.q, &r.nsp, &io, 50 * MS, NULL);
	nvme_eo_done(&r.eo, id, err); /* returned: the buffer is the caller's again */
	CHECK(err == -ETIMEDOUT, "timeout/io: a held read times out (%d)", err);
	/* the controller completes it late, if it still can */
	r.cm.hold_opc = 0;
	nvme_cmodel_release(&r.cm);
	until(q1_idle, &r, UPCIE_NSEC_PER_SEC);
	nvme_eo_check(&r.eo, "timeout/io");
	err = upcie_nvme_ctrl_reset(&r.c);
	if (!err)
		err = upcie_nvme_ioq_read_sync(&r.q, &r.nsp, 300, &r.data, 3 * BUF, 4096, NULL);
	CHECK(err == 0 && data_ok(&r, 3, 300, 4096), "after a reset the queue works again (%d)",
	      err);
	rig_teardown(&r);
}

/* 4b. An admin command with data times out; the controller completes it late. */
static void t_timeout_admin(void)
{
	struct rig r;
	uint8_t id[4096];
	int32_t scratch;
	uint64_t op;
	int err;

	rig_setup(&r);
	rig_up(&r, NULL, NULL);
	/* the admin data buffer, lent to the Identify while it runs */
	scratch = nvme_eo_region(&r.eo, r.c.scratch.vaddr, r.c.scratch.size);
	r.cm.abort_aborts = false;
	r.cm.hold_admin_opc = UPCIE_NVME_ADMIN_IDENTIFY;
	op = nvme_eo_op(&r.eo);
	nvme_eo_lend(&r.eo, op, scratch, 0, NVME_EO_NOCID);
	err = upcie_nvme_ctrl_identify(&r.c, UPCIE_NVME_CNS_CTRL, 0, id);
	nvme_eo_done(&r.eo, op, err);
	CHECK(err == -ETIMEDOUT, "timeout/admin: a held Identify times out (%d)", err);
	r.cm.hold_admin_opc = 0;
	nvme_cmodel_release(&r.cm);
	upcie_sleep_ns(50 * MS); /* room for a late completion to land */
	nvme_eo_check(&r.eo, "timeout/admin");
	err = upcie_nvme_ctrl_reset(&r.c);
	if (!err)
		err = upcie_nvme_ctrl_identify(&r.c, UPCIE_NVME_CNS_CTRL, 0, id);
	CHECK(err == 0, "after a reset admin commands work again (%d)", err);
	rig_teardown(&r);
}

/* 4c. A slow Create I/O CQ: the controller may create the queue after the host gave up. */
static void t_slow_create_cq(void)
{
	struct upcie_heap_stats st0, st1;
	struct upcie_nvme_ioq q;
	struct rig r;
	bool live, released;
	int err;

	rig_setup(&r);
	rig_up(&r, NULL, NULL);
	upcie_nvme_ioq_delete(&r.q);
	upcie_heap_stats_get(&r.c.heap, &st0);
	r.cm.abort_aborts = false;
	r.cm.delay_admin_opc = UPCIE_NVME_ADMIN_CREATE_CQ;
	r.cm.delay_admin_ms = 1000; /* beyond admin timeout + abort timeout */
	err = upcie_nvme_ioq_create(&q, &r.c, NULL);
	CHECK(err == -ETIMEDOUT, "slow create: Create I/O CQ times out (%d)", err);
	upcie_sleep_ns(1200 * MS); /* the controller finishes the command now, if it still can */
	upcie_heap_stats_get(&r.c.heap, &st1);
	live = __atomic_load_n(&r.cm.q[1].cq, __ATOMIC_ACQUIRE);
	released = st1.free_bytes == st0.free_bytes;
	CHECK(!(live && released),
	      "no CQ exists on memory the host released (controller CQ 1 %s, memory %s)",
	      live ? "live" : "absent", released ? "released" : "kept");
	/* within the abort timeout: late, but created, and the queue is usable */
	r.cm.delay_admin_ms = ABORT_MS / 2 + 100;
	err = upcie_nvme_ctrl_reset(&r.c);
	if (!err)
		err = upcie_nvme_ioq_create(&q, &r.c, NULL);
	if (!err)
		err = read_checked(&r, &q, 0, 0, 4096);
	CHECK(err == 0 && data_ok(&r, 0, 0, 4096),
	      "a Create I/O CQ that ends within the abort timeout counts: queue created, I/O works "
	      "(%d)",
	      err);
	upcie_nvme_ioq_delete(&q);
	r.cm.delay_admin_opc = 0;
	nvme_eo_check(&r.eo, "slow create");
	rig_teardown(&r);
}

/* 5. Delete I/O SQ fails: the queue memory stays the controller's, and a read the controller
 * still holds ends exactly once, with nothing written after its callback. */
static void t_delete_fails(void)
{
	struct upcie_heap_stats st0, st1;
	struct op a;
	struct rig r;
	bool live, released;
	int err;

	rig_setup(&r);
	rig_up(&r, NULL, NULL);
	r_hold(&r, true);
	err = op_read(&r, &a, 3, 48, 4096, NULL);
	until(q1_holds_one, &r, UPCIE_NSEC_PER_SEC);
	CHECK(err == 0 && a.calls == 0, "delete fails: a read is held by the controller (%d)", err);
	upcie_heap_stats_get(&r.c.heap, &st0);
	r.cm.fail_delete_sq = UPCIE_NVME_SC_INTERNAL;
	err = upcie_nvme_ioq_delete(&r.q);
	upcie_heap_stats_get(&r.c.heap, &st1);
	live = __atomic_load_n(&r.cm.q[1].sq, __ATOMIC_ACQUIRE) ||
	       __atomic_load_n(&r.cm.q[1].cq, __ATOMIC_ACQUIRE);
	released = st1.free_bytes > st0.free_bytes;
	CHECK(err != 0, "delete fails: Delete I/O SQ fails with a status (%d)", err);
	CHECK(!(live && released),
	      "the queue's memory is not released while the controller has the queue (queue %s, "
	      "memory %s)",
	      live ? "live" : "gone", released ? "released" : "kept");
	/* a controller that still has the read completes it now, into its buffer */
	r_hold(&r, false);
	nvme_cmodel_release(&r.cm);
	until(q1_idle, &r, UPCIE_NSEC_PER_SEC);
	if (!a.calls && r.q.live)
		upcie_nvme_ioq_wait(&r.q, &a.req, 500 * MS);
	CHECK(a.calls == 1, "the held read ended once (%d calls, %d)", a.calls, a.req.err);
	r.cm.fail_delete_sq = 0;
	nvme_eo_check(&r.eo, "delete fails");
	rig_teardown(&r);
}

/* CC.EN is never cleared while the controller is still becoming ready. */
static void t_takeover_enabling(void)
{
	struct rig r;
	int err;

	/* found enabling: CC.EN = 1, CSTS.RDY = 0, ready after 200 ms */
	rig_setup(&r);
	nvme_cmodel_takeover_enabling(&r.cm, 200);
	err = rig_up(&r, NULL, NULL);
	CHECK(err == 0, "takeover of a controller that is enabling: up (%d)", err);
	CHECK_EQ(r.cm.n_en_cleared_enabling, 0, "CC.EN was not cleared before CSTS.RDY = 1");
	err = read_checked(&r, &r.q, 4, 64, 4096);
	CHECK(err == 0 && data_ok(&r, 4, 64, 4096), "and I/O works after the takeover (%d)", err);
	nvme_eo_check(&r.eo, "takeover");
	rig_teardown(&r);

	/* our own enable times out (CAP.TO 500 ms), the controller is ready at 800 ms */
	rig_setup(&r);
	r.cm.ready_delay_ms = 800;
	err = rig_up(&r, NULL, NULL);
	CHECK(err == -ETIMEDOUT, "enable slower than CAP.TO: -ETIMEDOUT (%d)", err);
	upcie_nvme_ctrl_close(&r.c);
	until(model_disabled, &r, UPCIE_NSEC_PER_SEC);
	CHECK_EQ(r.cm.n_en_cleared_enabling, 0,
		 "and the disable after it waited for CSTS.RDY = 1 before clearing CC.EN");
	nvme_eo_check(&r.eo, "slow enable");
	rig_teardown(&r);
}

/* A fatal controller (CSTS.CFS) or a vanished one (all ones) during I/O: detected on the
 * timeout path, no Abort, no Delete, no shutdown; fast. */
static void t_dead(bool vanish)
{
	const char *what = vanish ? "vanished" : "fatal";
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_io io;
	struct rig r;
	uint32_t aborts, deletes, shutdowns;
	uint16_t admin_tail;
	static uint8_t asq_before[4096 * 64];
	uint8_t *asq;
	size_t asq_len;
	uint64_t id, t0, ms;
	int err;

	rig_setup(&r);
	if (vanish)
		r.cm.vanish_after_io = 2;
	else
		r.cm.cfs_after_io = 2;
	rig_up(&r, NULL, NULL);
	id = nvme_eo_op(&r.eo);
	nvme_eo_lend(&r.eo, id, r.region[6], r.q.qid, NVME_EO_NOCID);
	err = upcie_nvme_ioq_read_sync(&r.q, &r.nsp, 0, &r.data, 6 * BUF, 4096, NULL);
	if (!err)
		err = upcie_nvme_ioq_read_sync(&r.q, &r.nsp, 8, &r.data, 6 * BUF, 4096, NULL);
	nvme_eo_done(&r.eo, id, err);
	CHECK_EQ(err, 0, "%s: two reads before", what);
	aborts = r.cm.n_abort_fetched;
	admin_tail = r.c.admin.sq_tail;
	deletes = r.cm.n_delete_sq;
	shutdowns = r.cm.n_shutdown;
	seg.mem = &r.data;
	seg.off = 5 * BUF;
	seg.len = 4096;
	memset(&io, 0, sizeof(io));
	io.opc = UPCIE_NVME_NVM_READ;
	io.slba = 16;
	io.segs = &seg;
	io.nsegs = 1;
	id = nvme_eo_op(&r.eo);
	nvme_eo_lend(&r.eo, id, r.region[5], r.q.qid, NVME_EO_NOCID);
	t0 = upcie_time_ns();
	err = upcie_nvme_ioq_io_sync(&r.q, &r.nsp, &io, 50 * MS, NULL);
	ms = (upcie_time_ns() - t0) / MS;
	nvme_eo_done(&r.eo, id, err);
	CHECK(err == (vanish ? -ENODEV : -EIO),
	      "%s: the third read fails on its timeout path with %s (%d after %llu ms)", what,
	      vanish ? "-ENODEV" : "-EIO", err, (unsigned long long)ms);
	CHECK(r.c.admin.sq_tail == admin_tail && r.cm.n_abort_fetched == aborts,
	      "%s: no Abort sent to a dead controller (%u admin commands)", what,
	      (r.c.admin.sq_tail + r.c.admin_depth - admin_tail) % r.c.admin_depth);
	/* what the host writes into the admin SQ from now on is what it sends */
	asq = (uint8_t *)r.c.asq.vaddr;
	asq_len = (size_t)r.c.admin_depth * 64;
	memcpy(asq_before, asq, asq_len);
	t0 = upcie_time_ns();
	upcie_nvme_ioq_delete(&r.q);
	upcie_nvme_ctrl_close(&r.c);
	ms = (upcie_time_ns() - t0) / MS;
	CHECK(ms < 2000 && !memcmp(asq_before, asq, asq_len) && r.cm.n_delete_sq == deletes &&
		  r.cm.n_shutdown == shutdowns,
	      "%s: close in %llu ms, without sending Delete I/O SQ/CQ or a shutdown", what,
	      (unsigned long long)ms);
	nvme_eo_check(&r.eo, what);
	rig_teardown(&r);
}

/* A controller that vanishes (all ones) while idle, with a write cache, closed with its I/O
 * queue still open: close notices it without any command timing out first and sends it
 * nothing: no Flush (on the open queue), no Delete, no shutdown. */
static void t_dead_idle(void)
{
	static uint8_t asq_before[4096 * 64], sq_before[4096 * 64];
	struct rig r;
	uint8_t *asq, *sq;
	size_t asq_len, sq_len;
	uint64_t t0, ms;
	int err;

	rig_setup(&r);
	r.cm.vanish_after_io = 2;
	r.cm.vwc = 1;
	rig_up(&r, NULL, NULL);
	err = read_checked(&r, &r.q, 7, 0, 4096);
	if (!err)
		err = read_checked(&r, &r.q, 7, 8, 4096);
	CHECK_EQ(err, 0, "vanished while idle: two reads before");
	until(model_vanished, &r, UPCIE_NSEC_PER_SEC);
	asq = (uint8_t *)r.c.asq.vaddr;
	asq_len = (size_t)r.c.admin_depth * 64;
	memcpy(asq_before, asq, asq_len);
	sq = (uint8_t *)r.q.qp.sq;
	sq_len = ((size_t)r.q.qp.sq_last + 1) * 64;
	memcpy(sq_before, sq, sq_len);
	t0 = upcie_time_ns();
	upcie_nvme_ctrl_close(&r.c); /* the queue still open: close deletes it */
	ms = (upcie_time_ns() - t0) / MS;
	CHECK(ms < 2000 && !memcmp(asq_before, asq, asq_len) && !memcmp(sq_before, sq, sq_len),
	      "vanished while idle: close in %llu ms, nothing written into the admin or I/O SQ "
	      "(no Flush, Delete or other command)",
	      (unsigned long long)ms);
	nvme_eo_check(&r.eo, "vanished while idle");
	rig_teardown(&r);
}

/* A request of four commands times out and the controller never answers Aborts: the four are
 * aborted together, not one after the other. */
static void t_multi_abort(void)
{
	struct upcie_nvme_ioq_opts qo;
	struct rig r;
	struct op a;
	uint64_t t0, ms;
	int err;

	rig_setup(&r);
	memset(&qo, 0, sizeof(qo));
	qo.depth = 8;
	qo.max_xfer = 4096;
	rig_up(&r, NULL, &qo);
	r.cm.hold_opc = UPCIE_NVME_NVM_READ;
	r.cm.hold_admin_opc = UPCIE_NVME_ADMIN_ABORT;
	err = op_read(&r, &a, 0, 0, 4 * 4096, NULL);
	t0 = upcie_time_ns();
	if (!err)
		err = upcie_nvme_ioq_wait(&r.q, &a.req, 50 * MS);
	ms = (upcie_time_ns() - t0) / MS;
	CHECK(err == -ETIMEDOUT && r.cm.n_abort_fetched == 4,
	      "multi abort: 4 commands, 4 Aborts (%d, %u Aborts)", err, r.cm.n_abort_fetched);
	CHECK(r.cm.n_abort_fetched == 4 &&
		  r.cm.abort_last_ns - r.cm.abort_first_ns < ABORT_MS * MS / 2,
	      "the 4 Aborts went out together: %llu ms from the first to the last",
	      (unsigned long long)((r.cm.abort_last_ns - r.cm.abort_first_ns) / MS));
	CHECK(ms < 50 + 3 * ABORT_MS,
	      "the wait ended after %llu ms: one abort timeout (%u ms) after the deadline, not "
	      "four",
	      (unsigned long long)ms, ABORT_MS);
	r.cm.hold_opc = 0;
	r.cm.hold_admin_opc = 0;
	err = upcie_nvme_ctrl_reset(&r.c);
	CHECK(err == 0 && a.calls == 1, "reset ends the request once (%d, %d calls)", err, a.calls);
	nvme_eo_check(&r.eo, "multi abort");
	rig_teardown(&r);
}

/* A broken controller posts, after a reset, the completion of a command held before it into
 * the recreated queue: it is refused (its CID is of an older generation), the new command that
 * got the same slot completes with its own. */
static void t_late_after_reset(void)
{
	struct rig r;
	struct op a, b;
	uint16_t cid_a = 0, cid_b = 0;
	int err;

	rig_setup(&r);
	rig_up(&r, NULL, NULL);
	r.cm.late_after_reset = true;
	upcie_nvme_qpair_next_cid(&r.q.qp, &cid_a);
	r_hold(&r, true);
	err = op_read(&r, &a, 0, 0, 4096, NULL);
	CHECK(err == 0 && until(q1_holds_one, &r, UPCIE_NSEC_PER_SEC),
	      "late after reset: a read the controller holds (%d)", err);
	r_hold(&r, false);
	err = upcie_nvme_ctrl_reset(&r.c);
	CHECK(err == 0 && a.calls == 1 && a.req.err == -ECANCELED,
	      "the reset ended it once with -ECANCELED (%d, %d)", err, a.req.err);
	r_hold(&r, true);
	upcie_nvme_qpair_next_cid(&r.q.qp, &cid_b);
	err = op_read(&r, &b, 1, 16, 4096, NULL);
	until(q1_holds_one, &r, UPCIE_NSEC_PER_SEC);
	CHECK(err == 0 && cid_b != cid_a &&
		  upcie_nvme_qpair_cid_index(&r.q.qp, cid_b) ==
		      upcie_nvme_qpair_cid_index(&r.q.qp, cid_a),
	      "the next read got the same CID slot, with another CID (0x%04x, 0x%04x: %d)", cid_a,
	      cid_b, err);
	r_hold(&r, false);
	nvme_cmodel_release(&r.cm); /* both: the stale one and the new one */
	err = upcie_nvme_ioq_wait(&r.q, &b.req, UPCIE_NSEC_PER_SEC);
	until(q1_idle, &r, UPCIE_NSEC_PER_SEC);
	upcie_nvme_ioq_poll(&r.q, 16);
	CHECK(err == 0 && b.calls == 1 && data_ok(&r, 1, 16, 4096) && a.calls == 1 &&
		  r.q.qp.nbad == 1,
	      "the stale completion was refused (%llu bad), the new read completed once with its "
	      "data (%d)",
	      (unsigned long long)r.q.qp.nbad, err);
	nvme_eo_check(&r.eo, "late after reset");
	rig_teardown(&r);
}

/* The Abort command itself fails: the command stays the controller's (asynchronous wait), or
 * the controller is reset (synchronous). */
static void t_abort_fails(void)
{
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_io io;
	struct rig r;
	struct op a;
	uint64_t id;
	int err;

	rig_setup(&r);
	rig_up(&r, NULL, NULL);
	r.cm.abort_status = UPCIE_NVME_SC_ABORT_LIMIT;
	r_hold(&r, true);
	err = op_read(&r, &a, 0, 0, 4096, NULL);
	if (!err)
		err = upcie_nvme_ioq_wait(&r.q, &a.req, 20 * MS);
	CHECK(err == -ETIMEDOUT && a.calls == 0 && r.cm.n_abort == 1,
	      "abort fails: an asynchronous wait times out, the Abort fails, the request stays "
	      "pending (%d, %d calls)",
	      err, a.calls);
	r_hold(&r, false);
	nvme_cmodel_release(&r.cm);
	err = upcie_nvme_ioq_wait(&r.q, &a.req, UPCIE_NSEC_PER_SEC);
	CHECK(err == 0 && a.calls == 1 && data_ok(&r, 0, 0, 4096),
	      "its late completion ends it once, with its data (%d)", err);
	r_hold(&r, true);
	seg.mem = &r.data;
	seg.off = 2 * BUF;
	seg.len = 4096;
	memset(&io, 0, sizeof(io));
	io.opc = UPCIE_NVME_NVM_READ;
	io.slba = 64;
	io.segs = &seg;
	io.nsegs = 1;
	id = nvme_eo_op(&r.eo);
	nvme_eo_lend(&r.eo, id, r.region[2], r.q.qid, NVME_EO_NOCID);
	err = upcie_nvme_ioq_io_sync(&r.q, &r.nsp, &io, 20 * MS, NULL);
	nvme_eo_done(&r.eo, id, err);
	CHECK(err == -ETIMEDOUT && r.c.state == UPCIE_NVME_CTRL_FAILED,
	      "a synchronous read whose Abort fails resets the controller (%d, state %d)", err,
	      (int)r.c.state);
	r_hold(&r, false);
	nvme_cmodel_release(&r.cm);
	until(q1_idle, &r, UPCIE_NSEC_PER_SEC);
	r.cm.abort_status = 0;
	err = upcie_nvme_ctrl_reset(&r.c);
	CHECK_EQ(err, 0, "reset");
	nvme_eo_check(&r.eo, "abort fails");
	rig_teardown(&r);
}

/* Arm the model: the next `n` I/O commands fail with `code`, DNR `dnr`, CRD `crd`. */
static void fail_next(struct rig *r, uint32_t n, uint16_t code, bool dnr, uint8_t crd)
{
	r->cm.io_fail_code = code;
	r->cm.io_fail_dnr = dnr;
	r->cm.io_fail_crd = crd;
	__atomic_store_n(&r->cm.io_fail_n, n, __ATOMIC_RELEASE);
}

static uint64_t fetched(struct rig *r)
{
	return __atomic_load_n(&r->cm.io_fetched, __ATOMIC_ACQUIRE);
}

static struct upcie_nvme_ctrl_opts opts_retries(uint32_t n)
{
	struct upcie_nvme_ctrl_opts o;

	memset(&o, 0, sizeof(o));
	o.admin_timeout_ns = 100 * MS;
	o.abort_timeout_ns = ABORT_MS * MS;
	o.io_retries = n;
	return o;
}

/* 15. A status with DNR clear is retried, as built, on the same CID slot (a 64 KiB read: its
 * PRP list page is the slot's): the data lands once. The control: DNR set is not retried. */
__attribute__((noinline)) static void t_retry_dnr(void)
{
	for (int dnr = 0; dnr < 2; dnr++) {
		struct rig r;
		uint64_t f0;
		int err;

		rig_setup(&r);
		rig_up(&r, NULL, NULL);
		f0 = fetched(&r);
		fail_next(&r, 1, UPCIE_NVME_SC_INTERNAL, dnr, 0);
		err = read_checked(&r, &r.q, 0, 64, BUF);
		if (!dnr)
			CHECK(err == 0 && data_ok(&r, 0, 64, BUF) && fetched(&r) - f0 == 2 &&
				  r.c.nretried == 1,
			      "retry: Internal Error with DNR clear: sent again once, the 64 KiB "
			      "read lands (%d, %llu fetched)",
			      err, (unsigned long long)(fetched(&r) - f0));
		else
			CHECK(err == -EIO && fetched(&r) - f0 == 1 && r.c.nretried == 0,
			      "retry control: DNR set: not retried, -EIO (%d, %llu fetched)", err,
			      (unsigned long long)(fetched(&r) - f0));
		until(q1_idle, &r, UPCIE_NSEC_PER_SEC);
		nvme_eo_check(&r.eo, dnr ? "retry: DNR set" : "retry: DNR clear");
		rig_teardown(&r);
	}
}

/* 16. The bound: a command that keeps failing is sent 1 + io_retries times (5 by default). */
__attribute__((noinline)) static void t_retry_bound(void)
{
	static const struct {
		uint32_t opt, sends;
	} cases[] = { { 0, 6 }, { 2, 3 }, { UPCIE_NVME_CTRL_RETRIES_OFF, 1 } };

	for (unsigned i = 0; i < UPCIE_ARRAY_SIZE(cases); i++) {
		struct upcie_nvme_ctrl_opts o = opts_retries(cases[i].opt);
		struct upcie_nvme_cqe cqe = { 0 };
		struct rig r;
		uint64_t f0;
		int err;

		rig_setup(&r);
		rig_up(&r, &o, NULL);
		f0 = fetched(&r);
		fail_next(&r, 100, UPCIE_NVME_SC_CMD_INTERRUPTED, false, 0);
		err = upcie_nvme_ioq_read_sync(&r.q, &r.nsp, 0, &r.data, 0, 4096, &cqe);
		CHECK(err == -EIO && upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_CMD_INTERRUPTED &&
			  fetched(&r) - f0 == cases[i].sends,
		      "retry bound: io_retries %d: sent %llu times (want %u), then -EIO with the "
		      "status (%d)",
		      (int)cases[i].opt, (unsigned long long)(fetched(&r) - f0), cases[i].sends,
		      err);
		fail_next(&r, 0, 0, false, 0);
		until(q1_idle, &r, UPCIE_NSEC_PER_SEC);
		rig_teardown(&r);
	}
}

/* 17. CRD: with CRDT1 reported, ACRE is set at bring-up and after a reset, and a retry waits
 * the delay the completion asked for. The control: no CRDT, no ACRE, no delay. */
__attribute__((noinline)) static void t_retry_crd(void)
{
	for (int crdt = 1; crdt >= 0; crdt--) {
		struct rig r;
		uint64_t f0, gap;
		int err;

		rig_setup(&r);
		r.cm.crdt[0] = crdt ? 3 : 0; /* 300 ms */
		rig_up(&r, NULL, NULL);
		CHECK(r.c.acre == (crdt == 1) && r.cm.n_hbs == (uint32_t)crdt &&
			  r.cm.hbs_acre == crdt,
		      "retry/CRD: CRDT1 %u: ACRE %s (%u Host Behavior Support)", r.cm.crdt[0],
		      r.c.acre ? "set" : "not set", r.cm.n_hbs);
		f0 = fetched(&r);
		fail_next(&r, 1, UPCIE_NVME_SC_INTERNAL, false, 1);
		err = read_checked(&r, &r.q, 1, 128, BUF);
		gap = r.cm.io_fetch_ns[f0 + 1] - r.cm.io_fetch_ns[f0];
		if (crdt)
			CHECK(err == 0 && data_ok(&r, 1, 128, BUF) && gap >= 300 * MS,
			      "retry/CRD 1: sent again %llu ms after the failure (CRDT1 300 ms), "
			      "the read lands (%d)",
			      (unsigned long long)(gap / MS), err);
		else
			CHECK(
			    err == 0 && gap < 300 * MS,
			    "retry/CRD control: without ACRE the retry does not wait (%llu ms, %d)",
			    (unsigned long long)(gap / MS), err);
		if (crdt) {
			err = upcie_nvme_ctrl_reset(&r.c);
			CHECK(err == 0 && r.c.acre && r.cm.n_hbs == 2,
			      "retry/CRD: ACRE set again after a reset (%d, %u)", err, r.cm.n_hbs);
		}
		until(q1_idle, &r, UPCIE_NSEC_PER_SEC);
		nvme_eo_check(&r.eo, "retry/CRD");
		rig_teardown(&r);
	}
}

/* 18. Namespace Not Ready is waited out within CAP.TO (500 ms here); the control: a namespace
 * not ready for longer ends with the status once CAP.TO passed. */
__attribute__((noinline)) static void t_retry_not_ready(void)
{
	for (int longer = 0; longer < 2; longer++) {
		struct upcie_nvme_cqe cqe = { 0 };
		struct rig r;
		uint64_t f0, t0, el;
		int err;

		rig_setup(&r);
		rig_up(&r, NULL, NULL);
		f0 = fetched(&r);
		t0 = upcie_time_ns();
		__atomic_store_n(&r.cm.io_notready_until_ns, t0 + (longer ? 5000 : 200) * MS,
				 __ATOMIC_RELEASE);
		err = upcie_nvme_ioq_read_sync(&r.q, &r.nsp, 8, &r.data, 0, 4096, &cqe);
		el = upcie_time_ns() - t0;
		if (!longer)
			CHECK(err == 0 && data_ok(&r, 0, 8, 4096) && el >= 200 * MS &&
				  fetched(&r) - f0 >= 2,
			      "retry/NNR: not ready for 200 ms: waited out in %llu ms, %llu sends "
			      "(%d)",
			      (unsigned long long)(el / MS), (unsigned long long)(fetched(&r) - f0),
			      err);
		else
			CHECK(err == -EIO &&
				  upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_NS_NOT_READY &&
				  el >= 500 * MS && el < 2000 * MS,
			      "retry/NNR control: not ready for 5 s: -EIO after %llu ms (CAP.TO "
			      "500 ms), %llu sends (%d)",
			      (unsigned long long)(el / MS), (unsigned long long)(fetched(&r) - f0),
			      err);
		__atomic_store_n(&r.cm.io_notready_until_ns, 0, __ATOMIC_RELEASE);
		until(q1_idle, &r, UPCIE_NSEC_PER_SEC);
		rig_teardown(&r);
	}
}

/* Poll queue 1 until a retry waits, for at most a second. */
static bool poll_until_parked(struct rig *r)
{
	struct upcie_deadline dl;

	upcie_deadline_set(&dl, UPCIE_NSEC_PER_SEC);
	while (!r->q.nparked && !upcie_deadline_passed(&dl)) {
		upcie_nvme_ioq_poll(&r->q, 64);
		upcie_sleep_ns(100 * UPCIE_NSEC_PER_USEC);
	}
	return r->q.nparked != 0;
}

/* 19. A retry waiting for its delay (CRDT1 1 s) is ended once, and never sent, by a reset, the
 * queue's deletion, or the wait's timeout; a namespace reformatted meanwhile ends it with the
 * failure it had (never sent with the old geometry). The control: left alone it is sent. */
__attribute__((noinline)) static void t_retry_parked_end(void)
{
	static const char *how_s[] = { "left alone (control)", "reset", "queue deleted",
				       "the wait's timeout", "namespace reformatted" };

	for (int how = 0; how < 5; how++) {
		struct upcie_nvme_ioq *q;
		struct rig r;
		struct op a;
		uint64_t f;
		int err;

		rig_setup(&r);
		r.cm.crdt[0] = 10;
		rig_up(&r, NULL, NULL);
		q = &r.q;
		fail_next(&r, 1, UPCIE_NVME_SC_INTERNAL, false, 1);
		err = op_read(&r, &a, 2, 256, BUF, NULL);
		CHECK(err == 0 && poll_until_parked(&r) && a.calls == 0,
		      "retry/%s: a failed read waits for its retry (CRD 1 s) (%d)", how_s[how],
		      err);
		f = fetched(&r);
		if (how == 1) {
			err = upcie_nvme_ctrl_reset(&r.c);
		} else if (how == 2) {
			err = upcie_nvme_ioq_delete(q);
		} else if (how == 3) {
			err = upcie_nvme_ioq_wait(q, &a.req, 100 * MS);
			err = err == -ETIMEDOUT ? 0 : err;
		} else if (how == 4) {
			/* the namespace shrinks behind the driver's back; revalidated */
			__atomic_store_n(&r.cm.ns_blocks, NS_BLOCKS / 2, __ATOMIC_RELEASE);
			err = upcie_nvme_ctrl_ns_revalidate(&r.c, 1);
			err = err == 1 ? 0 : err;
		}
		if (how == 0) {
			err = upcie_nvme_ioq_wait(q, &a.req, 3 * UPCIE_NSEC_PER_SEC);
			CHECK(err == 0 && a.calls == 1 && fetched(&r) == f + 1 &&
				  data_ok(&r, 2, 256, BUF),
			      "retry/%s: sent after its delay, the read lands once (%d, %d calls)",
			      how_s[how], err, a.calls);
		} else {
			if (how == 4)
				upcie_nvme_ioq_wait(q, &a.req, 3 * UPCIE_NSEC_PER_SEC);
			CHECK(err == 0 && a.calls == 1 &&
				  a.req.err == (how == 4 ? -EIO : -ECANCELED) &&
				  (how != 4 ||
				   upcie_nvme_cqe_code(&a.req.cqe) == UPCIE_NVME_SC_INTERNAL),
			      "retry/%s: the read ends once, %s (%d, %d calls, %d)", how_s[how],
			      how == 4 ? "-EIO with its Internal Error" : "-ECANCELED", err,
			      a.calls, a.req.err);
			upcie_sleep_ns(1200 * MS);
			if (how != 2)
				upcie_nvme_ioq_poll(q, 64);
			CHECK(fetched(&r) == f && r.c.nretried == 0 && (how == 2 || !q->nparked),
			      "retry/%s: and it is never sent (%llu fetched since)", how_s[how],
			      (unsigned long long)(fetched(&r) - f));
		}
		until(q1_idle, &r, UPCIE_NSEC_PER_SEC);
		nvme_eo_check(&r.eo, "retry parked");
		rig_teardown(&r);
	}
}

/* The model has posted `n` completions on queue 1. */
static bool q1_posted_one(struct rig *r)
{
	return __atomic_load_n(&r->cm.q[1].m.posted, __ATOMIC_ACQUIRE) >= 1;
}

/* 20. A failure with DNR clear that a reset finds in the CQ is delivered after the reset and
 * not retried (its CID slot may have been built into meanwhile): the request ends with its
 * status, nothing is sent again. */
__attribute__((noinline)) static void t_retry_not_after_reset(void)
{
	struct rig r;
	struct op a;
	uint64_t f;
	int err;

	rig_setup(&r);
	rig_up(&r, NULL, NULL);
	fail_next(&r, 1, UPCIE_NVME_SC_INTERNAL, false, 0);
	err = op_read(&r, &a, 3, 512, 4096, NULL);
	CHECK(
	    err == 0 && until(q1_posted_one, &r, UPCIE_NSEC_PER_SEC) && a.calls == 0,
	    "retry/reset: a read failed with DNR clear, its completion in the CQ, not reaped (%d)",
	    err);
	f = fetched(&r);
	err = upcie_nvme_ctrl_reset(&r.c);
	upcie_nvme_ioq_poll(&r.q, 64);
	upcie_sleep_ns(50 * MS);
	upcie_nvme_ioq_poll(&r.q, 64);
	CHECK(err == 0 && a.calls == 1 && a.req.err == -EIO &&
		  upcie_nvme_cqe_code(&a.req.cqe) == UPCIE_NVME_SC_INTERNAL && fetched(&r) == f &&
		  r.c.nretried == 0,
	      "retry/reset: delivered after the reset with its status, not sent again (%d, %d "
	      "calls, %d, %llu sent since)",
	      err, a.calls, a.req.err, (unsigned long long)(fetched(&r) - f));
	until(q1_idle, &r, UPCIE_NSEC_PER_SEC);
	nvme_eo_check(&r.eo, "retry/reset");
	rig_teardown(&r);
}

/*
 * MSI-X vectors as upcie_vfio_irq_enable() leaves them, without a device: `n` non-blocking
 * eventfds (the model raises no interrupts: here only a halt writes them). Returns 0 or -errno.
 */
static int fake_vectors(struct upcie_nvme_ctrl *c, uint32_t n)
{
	int *efd = (int *)malloc(n * sizeof(*efd));

	if (!efd)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		efd[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (efd[i] < 0) {
			int err = -errno;

			while (i--)
				close(efd[i]);
			free(efd);
			return err;
		}
	}
	c->irqs.efd = efd;
	c->irqs.count = n;
	return 0;
}

/* Close and forget them (before close, which would only free the array: no device fd). */
static void fake_vectors_fini(struct upcie_nvme_ctrl *c)
{
	for (uint32_t i = 0; c->irqs.efd && i < c->irqs.count; i++)
		close(c->irqs.efd[i]);
	free(c->irqs.efd);
	c->irqs.efd = NULL;
	c->irqs.count = 0;
}

struct esc_irq {
	struct rig *r;
	int err;
};

/* Another thread's admin command finds the controller dead (CSTS.CFS) on its timeout path and
 * escalates: halt, CC.EN = 0. It starts once the owner is asleep on its vector. */
static void *escalate_dead(void *arg)
{
	struct esc_irq *e = (struct esc_irq *)arg;
	uint8_t *id = (uint8_t *)malloc(4096);

	upcie_sleep_ns(100 * MS);
	e->err = id ? upcie_nvme_ctrl_identify(&e->r->c, UPCIE_NVME_CNS_CTRL, 0, id) : -ENOMEM;
	free(id);
	return NULL;
}

/* 21. The owner of an interrupt queue sleeps on its vector's eventfd (ppoll) for a read the
 * controller holds; the controller then reports a fatal status, which another thread's admin
 * command finds and escalates (halt: CC.EN = 0). The halt wakes the owner, which ends its read
 * once (-ECANCELED) and returns the escalation's error (-EIO) at once, not at its deadline (3 s).
 * The control: the same with the halt's wake removed (UPCIE_NVME_TEST_NO_HALT_WAKE): the owner
 * sleeps to its deadline. */
static void t_escalation_wakes_irq(void)
{
	const uint64_t deadline = 3 * UPCIE_NSEC_PER_SEC;

	for (int ctl = 0; ctl < 2; ctl++) {
		const char *what = ctl ? "escalation/irq control (no wake)" : "escalation/irq";
		struct upcie_nvme_ioq_opts qo;
		struct upcie_nvme_ioq qi;
		struct esc_irq e;
		struct rig r;
		struct op a;
		pthread_t t;
		uint64_t t0, ms;
		bool started = false;
		int err, werr = 1;

		memset(&qi, 0, sizeof(qi));
		memset(&a, 0, sizeof(a));
		rig_setup(&r);
		r.cm.cfs_after_io = 1; /* fatal once the read is fetched */
		err = rig_up(&r, NULL, NULL);
		if (!err)
			err = fake_vectors(&r.c, 2);
		memset(&qo, 0, sizeof(qo));
		qo.irq = true;
		qo.vector = 1;
		if (!err)
			err = upcie_nvme_ioq_create(&qi, &r.c, &qo);
		CHECK(err == 0 && qi.irq && qi.qid == 2, "%s: an interrupt queue on vector 1 (%d)",
		      what, err);
		r_hold(&r, true); /* the read stays with the controller */
		a.req.cb = op_cb;
		a.req.ctx = &a;
		a.r = &r;
		a.id = nvme_eo_op(&r.eo);
		nvme_eo_lend(&r.eo, a.id, r.region[9], qi.qid, NVME_EO_NOCID);
		if (!err)
			err = upcie_nvme_ioq_read(&qi, &r.nsp, 0, &r.data, 9 * BUF, 4096, &a.req);
		if (err)
			nvme_eo_unlend(&r.eo, a.id);
		no_halt_wake = ctl;
		e.r = &r;
		e.err = 0;
		t0 = upcie_time_ns();
		if (!err)
			started = pthread_create(&t, NULL, escalate_dead, &e) == 0;
		if (started)
			werr = upcie_nvme_ioq_wait(&qi, &a.req, deadline);
		ms = (upcie_time_ns() - t0) / MS;
		if (started)
			pthread_join(t, NULL);
		no_halt_wake = 0;
		if (!ctl)
			CHECK(
			    started && werr == -EIO && e.err == -EIO && r.c.stopped &&
				a.calls == 1 && a.req.err == -ECANCELED && ms < 1500,
			    "%s: the halt wakes the owner: its wait returns the escalation's -EIO "
			    "after %llu ms (deadline %llu ms), the read ended once with "
			    "-ECANCELED (%d, %d, %d calls, %d)",
			    what, (unsigned long long)ms, (unsigned long long)(deadline / MS), werr,
			    e.err, a.calls, a.req.err);
		else
			CHECK(started && e.err == -EIO && r.c.stopped && a.calls == 1 &&
				  ms >= deadline / MS - 50,
			      "%s: the controller halted all the same (%d), but the owner slept "
			      "%llu ms, to its deadline (%llu ms; %d)",
			      what, e.err, (unsigned long long)ms,
			      (unsigned long long)(deadline / MS), werr);
		r_hold(&r, false);
		upcie_nvme_ioq_delete(&qi);
		fake_vectors_fini(&r.c);
		nvme_eo_check(&r.eo, what);
		rig_teardown(&r);
	}
}

/* 22. A synchronous read of two commands on a queue with room for one: the first is held by the
 * controller, the call waits for room for the second; then another thread's admin command finds
 * the controller dead (CSTS.CFS) and escalates. The call ends at once with the escalation's -EIO,
 * not at its timeout (3 s), and its buffer is the caller's again. */
static void t_escalation_room(void)
{
	const uint64_t timeout = 3 * UPCIE_NSEC_PER_SEC;
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_io io;
	struct esc_irq e;
	struct rig r;
	pthread_t t;
	uint64_t id, t0, ms;
	bool started = false;
	int err;

	rig_setup(&r);
	r.cm.cfs_after_io = 1; /* fatal once the first command is fetched */
	memset(&qo, 0, sizeof(qo));
	qo.depth = 2;	    /* one command at a time */
	qo.max_xfer = 4096; /* 8 KiB: two commands */
	err = rig_up(&r, NULL, &qo);
	r_hold(&r, true);
	seg.mem = &r.data;
	seg.off = 10 * BUF;
	seg.len = 8192;
	memset(&io, 0, sizeof(io));
	io.opc = UPCIE_NVME_NVM_READ;
	io.slba = 0;
	io.segs = &seg;
	io.nsegs = 1;
	e.r = &r;
	e.err = 0;
	id = nvme_eo_op(&r.eo);
	nvme_eo_lend(&r.eo, id, r.region[10], r.q.qid, NVME_EO_NOCID);
	t0 = upcie_time_ns();
	if (!err)
		started = pthread_create(&t, NULL, escalate_dead, &e) == 0;
	err = started ? upcie_nvme_ioq_io_sync(&r.q, &r.nsp, &io, timeout, NULL) : -EAGAIN;
	ms = (upcie_time_ns() - t0) / MS;
	if (started)
		pthread_join(t, NULL);
	nvme_eo_done(&r.eo, id, err);
	CHECK(err == -EIO && e.err == -EIO && r.c.stopped && ms < 1500,
	      "escalation/room: a sync read waiting for queue room ends with the escalation's -EIO "
	      "after %llu ms (timeout %llu ms; %d, %d)",
	      (unsigned long long)ms, (unsigned long long)(timeout / MS), err, e.err);
	r_hold(&r, false);
	nvme_eo_check(&r.eo, "escalation/room");
	rig_teardown(&r);
}

int main(void)
{
	upcie_log_set_handler(log_print, NULL);
	t_reset_disables_first();
	t_reset_resubmit();
	t_cid_reuse_wait();
	t_timeout_io();
	t_timeout_admin();
	t_slow_create_cq();
	t_delete_fails();
	t_takeover_enabling();
	t_dead(false);
	t_dead(true);
	t_dead_idle();
	t_multi_abort();
	t_late_after_reset();
	t_abort_fails();
	t_retry_dnr();
	t_retry_bound();
	t_retry_crd();
	t_retry_not_ready();
	t_retry_parked_end();
	t_retry_not_after_reset();
	t_escalation_wakes_irq();
	t_escalation_room();
	return check_done();
}
