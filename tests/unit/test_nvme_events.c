/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The controller changing beneath the driver, against the controller model: namespace geometry
 * that changes (a reformat, a Format NVM through the driver, a detached namespace) and what
 * revalidation does to open handles; asynchronous events (AERs kept outstanding, the log page
 * read to unmask, SMART on a temperature threshold, namespace attribute notices); asynchronous
 * admin commands; and callbacks that use the controller while a reset or a queue deletion ends
 * their commands.
 */
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#include "check.h"
#include "nvme_ctrl_rig.h"

#define KiB 1024u

/* Bring-up, an I/O queue, namespace `nsid` open. */
static int up(struct rig *r, struct upcie_nvme_ioq *q, struct upcie_nvme_ns *ns, uint32_t nsid)
{
	int err = rig_ctrl(r, NULL);

	if (!err)
		err = upcie_nvme_ioq_create(q, &r->c, NULL);
	if (!err)
		err = upcie_nvme_ns_open(ns, &r->c, nsid);
	return err;
}

/* Namespace 1 of 8192 blocks of 512 bytes, with a second format of 4 KiB (set before start). */
static struct nvme_nsm_ns *add_fmt_ns(struct rig *r)
{
	struct nvme_nsm_ns *n = nvme_nsm_add(&r->nsm, 1, 8192, 512, 0, false, 0, 0);

	n->nlbaf = 1;
	n->fmt_bytes[1] = 4096;
	rig_use_nsm(r);
	return n;
}

static bool until_true(bool (*f)(struct rig *), struct rig *r, uint64_t ns)
{
	uint64_t t0 = upcie_time_ns();

	while (!f(r)) {
		if (upcie_time_ns() - t0 > ns)
			return false;
		sched_yield();
	}
	return true;
}

static bool q1_holds_one(struct rig *r)
{
	return __atomic_load_n(&r->cm.q[1].m.nheld, __ATOMIC_ACQUIRE) == 1;
}

static uint8_t *va(struct rig *r, uint64_t off)
{
	return (uint8_t *)r->data_va + off;
}

/* Bytes of [off, off + len) of the data memory that no longer hold pattern `tag`. */
static uint64_t changed(struct rig *r, uint64_t off, uint64_t len, uint32_t tag)
{
	uint64_t n = 0;

	for (uint64_t i = 0; i < len; i++)
		n += va(r, off)[i] != rig_pat(tag, i);
	return n;
}

/* The data memory is 4 KiB granules at shuffled device addresses: each buffer is one span. */
static int read_at(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns, uint64_t slba,
		   struct rig *r, uint64_t off, uint64_t len)
{
	return upcie_nvme_ioq_read_sync(q, ns, slba, &r->data, off, len, NULL);
}

/*
 * The case: a namespace of 512-byte blocks, a 128 KiB read into B, the namespace
 * reformatted to 4 KiB blocks and the controller reset, then a 16 KiB read into C. With the old
 * geometry the 16 KiB read asks for 32 blocks, now 128 KiB: the controller walks the PRP list
 * past its 3 valid entries into the ones B's read left in that CID's list page, and writes into
 * B. Revalidation at the reset makes the handle refuse the read; the negative control forges a
 * current generation on the stale handle (a driver without the check) and sees B overwritten.
 */
static void t_stale_geometry(void)
{
	const uint64_t B = 0, C = 1024 * KiB;
	struct upcie_nvme_ns ns, forged, ns2;
	struct upcie_nvme_ioq q;
	struct nvme_nsm_ns *n;
	struct rig r;
	uint32_t io0;
	uint64_t hit;
	int err;

	rig_setup(&r);
	n = add_fmt_ns(&r);
	rig_start(&r);
	err = up(&r, &q, &ns, 1);
	CHECK(err == 0 && ns.lba_bytes == 512 && ns.rec, "namespace 1 open: 512-byte blocks (%d)",
	      err);
	err = read_at(&q, &ns, 0, &r, B, 128 * KiB);
	CHECK_EQ(err, 0, "128 KiB read into B (one command, a 31-entry PRP list)");
	rig_fill(va(&r, B), 128 * KiB, 7);

	/* reformatted behind the driver's back (another host, a firmware activation) */
	nvme_nsm_format(n, 1);
	memset(n->data, 0x5a, (size_t)n->blocks * n->lba_bytes);
	err = upcie_nvme_ctrl_reset(&r.c);
	CHECK(err == 0 && r.c.nrevalidated == 1,
	      "reset: namespace 1 found changed by the revalidation (%d, %llu)", err,
	      (unsigned long long)r.c.nrevalidated);
	io0 = n->n_io;
	err = read_at(&q, &ns, 0, &r, C, 16 * KiB);
	CHECK(err == -ESTALE && n->n_io == io0 && changed(&r, B, 128 * KiB, 7) == 0,
	      "the stale handle's 16 KiB read: -ESTALE, nothing submitted, B untouched (%d)", err);
	err = upcie_nvme_ioq_write_zeroes(&q, &ns, 0, 1, 0, NULL);
	CHECK_EQ(err, -ESTALE, "its Write Zeroes too");

	/* negative control: the same read without the check */
	forged = ns;
	forged.gen = ns.rec->gen;
	err = read_at(&q, &forged, 0, &r, C, 16 * KiB);
	hit = changed(&r, B, 128 * KiB, 7);
	CHECK(err == 0 && hit > 0,
	      "control: unchecked, the read completes (%d) and the controller wrote %llu bytes "
	      "into B",
	      err, (unsigned long long)hit);

	rig_fill(va(&r, B), 128 * KiB, 8);
	err = upcie_nvme_ns_open(&ns2, &r.c, 1);
	CHECK(err == 0 && ns2.lba_bytes == 4096 && ns2.nsze == 1024,
	      "re-opened: 1024 blocks of 4 KiB (%d)", err);
	memset(va(&r, C), 0, 16 * KiB);
	err = read_at(&q, &ns2, 0, &r, C, 16 * KiB);
	CHECK(err == 0 && va(&r, C)[0] == 0x5a && va(&r, C)[16 * KiB - 1] == 0x5a &&
		  changed(&r, B, 128 * KiB, 8) == 0,
	      "the new handle reads 16 KiB (4 blocks) into C, B untouched (%d)", err);
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

/* Format NVM through the driver: revalidated by itself; the effects log decides where there is
 * one (the control: an effects entry without LBCC leaves the handle as it was). */
static void t_format_through_driver(void)
{
	struct upcie_nvme_ns ns, ns2;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_sqe sqe;
	struct rig r;
	int err;

	for (int effects = 0; effects < 3; effects++) {
		rig_setup(&r);
		add_fmt_ns(&r);
		if (effects) {
			r.cm.lpa = 2; /* Commands Supported and Effects log */
			/* CSUPP, and LBCC (logical block content change) in the first run */
			r.cm.effects[UPCIE_NVME_ADMIN_FORMAT_NVM] = effects == 1 ? 0x3u : 0x1u;
		}
		rig_start(&r);
		err = up(&r, &q, &ns, 1);
		memset(&sqe, 0, sizeof(sqe));
		sqe.opc = UPCIE_NVME_ADMIN_FORMAT_NVM;
		sqe.nsid = 1;
		sqe.cdw10 = 1; /* LBA format 1: 4 KiB */
		if (!err)
			err = upcie_nvme_ctrl_admin(&r.c, &sqe, NULL, 0, 0, NULL);
		if (effects == 2) {
			CHECK(err == 0 && r.cm.n_format == 1 && r.c.effects_read &&
				  r.c.nrevalidated == 0 &&
				  read_at(&q, &ns, 0, &r, 0, 4096) != -ESTALE,
			      "control: effects log says Format NVM changes nothing: not "
			      "revalidated, the handle is not refused (%d)",
			      err);
		} else {
			CHECK(err == 0 && r.cm.n_format == 1 &&
				  r.c.effects_read == (effects == 1) && r.c.nrevalidated == 1,
			      "Format NVM through upcie_nvme_ctrl_admin() (%s): namespace "
			      "revalidated (%d)",
			      effects ? "effects log: LBCC" : "no effects log: Format NVM listed",
			      err);
			err = read_at(&q, &ns, 0, &r, 0, 4096);
			CHECK_EQ(err, -ESTALE, "the handle opened before refuses I/O");
			err = upcie_nvme_ns_open(&ns2, &r.c, 1);
			CHECK(err == 0 && ns2.lba_bytes == 4096 &&
				  read_at(&q, &ns2, 0, &r, 0, 4096) == 0,
			      "re-opened with 4 KiB blocks, I/O works (%d)", err);
		}
		upcie_nvme_ioq_delete(&q);
		rig_teardown(&r);
	}
}

/* Format NVM through upcie_nvme_ctrl_admin_async(): revalidated as the synchronous path is,
 * before its callback runs, so the callback's own read on the handle opened before is refused;
 * the effects log decides where there is one (the control: an effects entry without LBCC leaves
 * the handle as it was). */
struct fmt_cb {
	struct rig *r;
	struct upcie_nvme_ioq *q;
	const struct upcie_nvme_ns *ns;
	int calls;
	int err;
	uint16_t code;
	int read_err; /* the callback's read on the old handle */
};

static void format_cb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct fmt_cb *f = (struct fmt_cb *)ctx;

	f->calls++;
	f->err = err;
	f->code = upcie_nvme_cqe_code(cqe);
	/* delivered by the test's own admin poll: the thread that owns the queue */
	f->read_err = read_at(f->q, f->ns, 0, f->r, 0, 4096);
}

static void t_format_async(void)
{
	struct upcie_nvme_ns ns, ns2;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_sqe sqe;
	struct fmt_cb f;
	struct rig r;
	uint64_t t0;
	int err;

	for (int effects = 0; effects < 3; effects++) {
		memset(&f, 0, sizeof(f));
		rig_setup(&r);
		add_fmt_ns(&r);
		if (effects) {
			r.cm.lpa = 2; /* Commands Supported and Effects log */
			/* CSUPP, and LBCC (logical block content change) in the first run */
			r.cm.effects[UPCIE_NVME_ADMIN_FORMAT_NVM] = effects == 1 ? 0x3u : 0x1u;
		}
		rig_start(&r);
		err = up(&r, &q, &ns, 1);
		f.r = &r;
		f.q = &q;
		f.ns = &ns;
		memset(&sqe, 0, sizeof(sqe));
		sqe.opc = UPCIE_NVME_ADMIN_FORMAT_NVM;
		sqe.nsid = 1;
		sqe.cdw10 = 1; /* LBA format 1: 4 KiB */
		if (!err)
			err = upcie_nvme_ctrl_admin_async(&r.c, &sqe, NULL, 0, format_cb, &f, NULL);
		t0 = upcie_time_ns();
		while (!err && !f.calls && upcie_time_ns() - t0 < 2 * UPCIE_NSEC_PER_SEC)
			upcie_nvme_ctrl_admin_poll(&r.c);
		if (effects == 2) {
			CHECK(err == 0 && f.calls == 1 && r.cm.n_format == 1 && r.c.effects_read &&
				  r.c.nrevalidated == 0 && f.read_err != -ESTALE,
			      "control: async Format NVM, effects log says it changes nothing: not "
			      "revalidated, the handle is not refused (%d, %d calls, %d)",
			      err, f.calls, f.read_err);
		} else {
			CHECK(err == 0 && f.calls == 1 && f.err == 0 && f.code == 0 &&
				  r.cm.n_format == 1 && r.c.effects_read == (effects == 1) &&
				  r.c.nrevalidated == 1 && f.read_err == -ESTALE,
			      "Format NVM through upcie_nvme_ctrl_admin_async() (%s): namespace "
			      "revalidated before the callback, whose read on the handle opened "
			      "before is refused with -ESTALE (%d, %d calls, %d, %d)",
			      effects ? "effects log: LBCC" : "no effects log: Format NVM listed",
			      err, f.calls, f.err, f.read_err);
			err = read_at(&q, &ns, 0, &r, 0, 4096);
			CHECK_EQ(err, -ESTALE,
				 "after the callback the old handle still refuses I/O");
			err = upcie_nvme_ns_open(&ns2, &r.c, 1);
			CHECK(err == 0 && ns2.lba_bytes == 4096 &&
				  read_at(&q, &ns2, 0, &r, 0, 4096) == 0,
			      "re-opened with 4 KiB blocks, I/O works (%d)", err);
		}
		upcie_nvme_ioq_delete(&q);
		rig_teardown(&r);
	}
}

/* Events. */
struct evlog {
	int n;
	struct upcie_nvme_event ev[8];
	uint8_t log0[8];
	bool lock_free[8];
};

static void on_event(void *ctx, struct upcie_nvme_ctrl *c, const struct upcie_nvme_event *ev)
{
	struct evlog *l = (struct evlog *)ctx;

	if (l->n < 8) {
		l->ev[l->n] = *ev;
		l->log0[l->n] = ev->log_len ? ev->log[0] : 0xff;
		l->lock_free[l->n] = pthread_mutex_trylock(&c->lock) == 0;
		if (l->lock_free[l->n])
			pthread_mutex_unlock(&c->lock);
	}
	l->n++;
}

static int poll_for(struct rig *r, struct evlog *l, int want)
{
	uint64_t t0 = upcie_time_ns();

	while (l->n < want && upcie_time_ns() - t0 < 2 * UPCIE_NSEC_PER_SEC) {
		upcie_nvme_ctrl_admin_poll(&r->c);
		sched_yield();
	}
	return l->n;
}

/* AERs from bring-up on; SMART over a temperature threshold; one event per type until its
 * log page is read. */
static void t_aer_smart(void)
{
	struct upcie_nvme_sqe sqe;
	struct evlog l;
	struct rig r;
	uint32_t logs;
	int err;

	memset(&l, 0, sizeof(l));
	rig_setup(&r);
	r.cm.aerl = 5; /* 6 allowed: the driver keeps 4 */
	r.cm.temp_k = 310;
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	CHECK(err == 0 && rig_admin_held(&r, 4) && r.c.aer_out == 4 && r.cm.n_aec == 1 &&
		  (r.cm.aec & 0xff) == 0xff,
	      "bring-up: 4 AERs outstanding (AERL 5), SMART warnings enabled (%d, AEC 0x%x)", err,
	      r.cm.aec);
	upcie_nvme_ctrl_set_event_handler(&r.c, on_event, &l);
	upcie_nvme_cmd_set_features(&sqe, UPCIE_NVME_FEAT_TEMP_THRESH, 0, 300, false);
	err = upcie_nvme_ctrl_admin(&r.c, &sqe, NULL, 0, 0, NULL);
	CHECK_EQ(err, 0, "over-temperature threshold 300 K set below the 310 K the drive has");
	logs = r.cm.n_get_log;
	poll_for(&r, &l, 1);
	CHECK(l.n == 1 && l.ev[0].type == UPCIE_NVME_AE_TYPE_SMART && l.ev[0].info == 1 &&
		  l.ev[0].lid == UPCIE_NVME_LOG_SMART && l.ev[0].log_len == 512 &&
		  !l.ev[0].log_err && (l.log0[0] & 2) && l.lock_free[0],
	      "SMART event handed on: temperature, log page 02h read (critical warning 0x%02x), "
	      "no lock held (%d events)",
	      l.log0[0], l.n);
	CHECK(r.cm.n_get_log == logs + 1 && r.cm.last_log_lid == 2 && r.cm.last_log_rae == 0 &&
		  rig_admin_held(&r, 4),
	      "the log read with RAE clear (unmasks), the AER sent again: 4 outstanding");

	/* two SMART events: the second waits, masked, until the first one's log is read */
	nvme_cmodel_event(&r.cm, UPCIE_NVME_AE_TYPE_SMART | (2u << 8) | (2u << 16));
	nvme_cmodel_event(&r.cm, UPCIE_NVME_AE_TYPE_SMART | (0u << 8) | (2u << 16));
	until_true(q1_holds_one, &r, 20 * UPCIE_NSEC_PER_MSEC); /* give the model time */
	CHECK(r.cm.n_aer_done == 2 && r.cm.nev_pend == 1,
	      "control: with the first unread, the second event is held back (%u AERs completed, "
	      "%u waiting)",
	      r.cm.n_aer_done, r.cm.nev_pend);
	poll_for(&r, &l, 3);
	CHECK(l.n == 3 && l.ev[1].info == 2 && l.ev[2].info == 0 && r.cm.nev_pend == 0,
	      "each read unmasks the next: both handed on in order (%d)", l.n);
	rig_teardown(&r);
}

/* A namespace detached: Namespace Attribute Changed, revalidated (gone), its pending read ends
 * once. */
static void t_ns_detach(void)
{
	struct upcie_nvme_ns ns1, ns2;
	struct upcie_nvme_ioq q;
	struct evlog l;
	struct rig_one o;
	struct rig r;
	int err;

	memset(&l, 0, sizeof(l));
	memset(&o, 0, sizeof(o));
	rig_setup(&r);
	nvme_nsm_add(&r.nsm, 1, 4096, 512, 0, false, 0, 0);
	nvme_nsm_add(&r.nsm, 2, 4096, 512, 0, false, 0, 0);
	rig_use_nsm(&r);
	r.cm.oaes = UPCIE_NVME_AEC_NS_ATTR;
	rig_start(&r);
	err = up(&r, &q, &ns1, 1);
	if (!err)
		err = upcie_nvme_ns_open(&ns2, &r.c, 2);
	CHECK(err == 0 && (r.cm.aec & UPCIE_NVME_AEC_NS_ATTR),
	      "two namespaces open, namespace attribute notices enabled (%d)", err);
	upcie_nvme_ctrl_set_event_handler(&r.c, on_event, &l);
	r.cm.hold_opc = UPCIE_NVME_NVM_READ;
	o.req.cb = rig_one_cb;
	o.req.ctx = &o;
	err = upcie_nvme_ioq_read(&q, &ns2, 0, &r.data, 0, 4096, &o.req);
	CHECK(err == 0 && until_true(q1_holds_one, &r, UPCIE_NSEC_PER_SEC),
	      "a read of namespace 2 the controller holds (%d)", err);
	r.cm.hold_opc = 0;
	nvme_cmodel_ns_detach(&r.cm, 2);
	poll_for(&r, &l, 1);
	CHECK(l.n == 1 && l.ev[0].type == UPCIE_NVME_AE_TYPE_NOTICE &&
		  l.ev[0].info == UPCIE_NVME_AE_NOTICE_NS_CHANGED && l.ev[0].nchanged == 1,
	      "Namespace Attribute Changed handed on, the Changed Namespace List names 1 (%d)",
	      l.n);
	err = read_at(&q, &ns2, 0, &r, 0, 4096);
	CHECK_EQ(err, -ENODEV, "namespace 2's handle refuses I/O: gone");
	err = read_at(&q, &ns1, 0, &r, 0, 4096);
	CHECK_EQ(err, 0, "namespace 1 goes on");
	nvme_cmodel_release(&r.cm);
	err = upcie_nvme_ioq_wait(&q, &o.req, UPCIE_NSEC_PER_SEC);
	CHECK(err == -EIO && o.calls == 1 && o.err == -EIO &&
		  upcie_nvme_cqe_code(&o.req.cqe) == UPCIE_NVME_SC_INVALID_NS,
	      "its pending read ends once, Invalid Namespace (%d, %d calls)", err, o.calls);
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

/*
 * A namespace attached while the controller runs shows up after its notice (listed, opens,
 * reads); a namespace that shrank makes the handle opened before refuse I/O with -ESTALE, and a
 * new handle has the new size. Control: with namespace notices off nothing tells the driver, and
 * the handle opened before still submits with the old size (a read past the new end reaches the
 * controller, which refuses it: LBA out of range).
 */
static void t_ns_attach_resize(void)
{
	for (int notices = 1; notices >= 0; notices--) {
		struct upcie_nvme_ns ns1, ns1b, ns2;
		struct upcie_nvme_cqe cqe;
		struct upcie_nvme_ioq q;
		uint32_t ids[4], n = 0;
		struct evlog l;
		struct rig r;
		const char *k = notices ? "" : "control, notices off: ";
		uint32_t nio;
		int err;

		memset(&l, 0, sizeof(l));
		memset(&cqe, 0, sizeof(cqe));
		rig_setup(&r);
		nvme_nsm_add(&r.nsm, 1, 4096, 512, 0, false, 0, 0);
		nvme_nsm_add(&r.nsm, 2, 2048, 512, 0, false, 0, 0)->detached = true;
		rig_use_nsm(&r);
		r.cm.oaes = notices ? UPCIE_NVME_AEC_NS_ATTR : 0;
		rig_start(&r);
		err = up(&r, &q, &ns1, 1);
		if (!err)
			err = upcie_nvme_ctrl_ns_list(&r.c, ids, 4, &n);
		CHECK(
		    err == 0 && n == 1 && ids[0] == 1 && upcie_nvme_ns_open(&ns2, &r.c, 2) < 0,
		    "%snamespace 1 open; namespace 2 not attached: not listed, does not open (%d)",
		    k, err);
		upcie_nvme_ctrl_set_event_handler(&r.c, on_event, &l);
		nvme_cmodel_ns_attach(&r.cm, 2);
		if (notices) {
			poll_for(&r, &l, 1);
			err = upcie_nvme_ctrl_ns_list(&r.c, ids, 4, &n);
			CHECK(l.n == 1 && l.ev[0].info == UPCIE_NVME_AE_NOTICE_NS_CHANGED &&
				  l.ev[0].nchanged == 1 && err == 0 && n == 2 && ids[1] == 2,
			      "attached: the notice handed on, namespace 2 listed (%d events, %u)",
			      l.n, n);
			err = upcie_nvme_ns_open(&ns2, &r.c, 2);
			if (!err)
				err = read_at(&q, &ns2, 2047, &r, 0, 512);
			CHECK(err == 0 && ns2.nsze == 2048,
			      "namespace 2 opens with 2048 blocks and reads its last block (%d)",
			      err);
		}
		nvme_cmodel_ns_resize(&r.cm, 1, 1024);
		poll_for(&r, &l,
			 notices ? 2 : 1); /* without notices: 2 s with nothing to hand on */
		nio = nvme_nsm_find(&r.nsm, 1)->n_io;
		err = upcie_nvme_ioq_read_sync(&q, &ns1, 2000, &r.data, 0, 512, &cqe);
		if (notices) {
			CHECK(
			    l.n == 2 && err == -ESTALE && nvme_nsm_find(&r.nsm, 1)->n_io == nio,
			    "namespace 1 shrank to 1024 blocks: the handle opened before refuses a "
			    "read at block 2000 with -ESTALE, nothing submitted (%d, %d events)",
			    err, l.n);
			err = upcie_nvme_ns_open(&ns1b, &r.c, 1);
			CHECK(err == 0 && ns1b.nsze == 1024 &&
				  read_at(&q, &ns1b, 1023, &r, 0, 512) == 0,
			      "re-opened: 1024 blocks, block 1023 reads (%d)", err);
		} else {
			CHECK(l.n == 0 && err == -EIO &&
				  upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_LBA_RANGE,
			      "%sno event, the stale handle submits the read at block 2000 and the "
			      "controller refuses it: LBA out of range (%d, 0x%03x)",
			      k, err, upcie_nvme_cqe_code(&cqe));
		}
		upcie_nvme_ioq_delete(&q);
		rig_teardown(&r);
	}
}

/* Asynchronous admin: the callback once, from the poll, without a lock; -ECANCELED once when a
 * reset ends it. */
struct acb {
	int calls;
	int err;
	uint32_t dw0;
	bool lock_free;
	struct upcie_nvme_ctrl *c;
};

static void admin_cb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct acb *a = (struct acb *)ctx;

	a->calls++;
	a->err = err;
	a->dw0 = cqe->dw0;
	a->lock_free = pthread_mutex_trylock(&a->c->lock) == 0;
	if (a->lock_free)
		pthread_mutex_unlock(&a->c->lock);
}

static void t_admin_async(void)
{
	struct upcie_nvme_sqe sqe;
	struct acb a, b;
	struct rig r;
	uint64_t t0;
	int err;

	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	rig_setup(&r);
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	a.c = b.c = &r.c;
	upcie_nvme_cmd_set_num_queues(&sqe, 4, 4);
	if (!err)
		err = upcie_nvme_ctrl_admin_async(&r.c, &sqe, NULL, 0, admin_cb, &a, NULL);
	t0 = upcie_time_ns();
	while (!a.calls && upcie_time_ns() - t0 < UPCIE_NSEC_PER_SEC)
		upcie_nvme_ctrl_admin_poll(&r.c);
	CHECK(err == 0 && a.calls == 1 && a.err == 0 && a.lock_free &&
		  upcie_nvme_num_queues_sq(a.dw0) == r.cm.nqueues,
	      "async Set Features: one callback from the poll, no lock held, dw0 0x%08x (%d)",
	      a.dw0, err);
	upcie_nvme_ctrl_admin_poll(&r.c);
	CHECK_EQ(a.calls, 1, "and only one");
	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = UPCIE_NVME_ADMIN_ASYNC_EVENT;
	err = upcie_nvme_ctrl_admin_async(&r.c, &sqe, NULL, 0, admin_cb, &b, NULL);
	CHECK_EQ(err, -EINVAL, "an AER of the caller's: refused (the driver keeps its own)");

	r.cm.hold_admin_opc = UPCIE_NVME_ADMIN_GET_FEATURES;
	upcie_nvme_cmd_get_num_queues(&sqe);
	err = upcie_nvme_ctrl_admin_async(&r.c, &sqe, NULL, 0, admin_cb, &b, NULL);
	/* held once the model fetched it: the AER and it */
	CHECK(err == 0 && rig_admin_held(&r, 2), "a held async Get Features (%d)", err);
	upcie_nvme_ctrl_admin_poll(&r.c);
	CHECK_EQ(b.calls, 0, "no callback yet");
	err = upcie_nvme_ctrl_reset(&r.c);
	r.cm.hold_admin_opc = 0;
	upcie_nvme_ctrl_admin_poll(&r.c);
	CHECK(err == 0 && b.calls == 1 && b.err == -ECANCELED && b.lock_free && r.c.aer_out == 1,
	      "reset ends it once with -ECANCELED, no lock held; the AER is back (%d)", err);
	rig_teardown(&r);
}

/* A callback that issues an admin command while a reset or a queue deletion ends its command. */
struct ucb {
	struct upcie_nvme_req req;
	struct rig *r;
	int calls;
	int err;
	int admin_err;
	bool lock_free;
};

static void uses_ctrl_cb(struct upcie_nvme_req *req)
{
	struct ucb *u = (struct ucb *)req->ctx;
	uint8_t *id = (uint8_t *)malloc(4096);

	u->calls++;
	u->err = req->err;
	u->lock_free = pthread_mutex_trylock(&u->r->c.lock) == 0;
	if (u->lock_free)
		pthread_mutex_unlock(&u->r->c.lock);
	/* would deadlock if the lock were held: only tried when it is free */
	u->admin_err =
	    u->lock_free && id ? upcie_nvme_ctrl_identify(&u->r->c, UPCIE_NVME_CNS_CTRL, 0, id) : 1;
	free(id);
}

static void t_callbacks_use_ctrl(void)
{
	struct upcie_nvme_ns ns;
	struct upcie_nvme_ioq q;
	struct ucb u;
	struct rig r;
	int err;

	for (int del = 0; del < 2; del++) {
		memset(&u, 0, sizeof(u));
		rig_setup(&r);
		u.r = &r;
		rig_start(&r);
		err = up(&r, &q, &ns, 1);
		r.cm.hold_opc = UPCIE_NVME_NVM_READ;
		r.cm.abort_on_sq_delete = true;
		u.req.cb = uses_ctrl_cb;
		u.req.ctx = &u;
		if (!err)
			err = upcie_nvme_ioq_read(&q, &ns, 0, &r.data, 0, 4096, &u.req);
		if (!err && !until_true(q1_holds_one, &r, UPCIE_NSEC_PER_SEC))
			err = -ETIMEDOUT;
		r.cm.hold_opc = 0;
		err = err ? err : del ? upcie_nvme_ioq_delete(&q) : upcie_nvme_ctrl_reset(&r.c);
		CHECK(err == 0 && u.calls == 1 && u.req.err != 0 && u.lock_free && u.admin_err == 0,
		      "%s: the read's callback ran once (err %d), no lock held, its Identify "
		      "worked (%d)",
		      del ? "queue deletion" : "reset", u.req.err, err);
		if (!del)
			upcie_nvme_ioq_delete(&q);
		rig_teardown(&r);
	}
	/* the probe can fail: under the lock it says so */
	memset(&u, 0, sizeof(u));
	rig_setup(&r);
	u.r = &r;
	rig_start(&r);
	rig_ctrl(&r, NULL);
	pthread_mutex_lock(&r.c.lock);
	u.lock_free = pthread_mutex_trylock(&r.c.lock) == 0;
	pthread_mutex_unlock(&r.c.lock);
	CHECK(!u.lock_free, "control: with the lock held, the callback's probe sees it held");
	rig_teardown(&r);
}

/* Close with a volatile write cache while the only queue is full: the Flush still goes out (on
 * a temporary queue once the queues are deleted), before the shutdown. */
static void t_close_flushes_full(void)
{
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ns ns;
	struct upcie_nvme_ioq q;
	struct rig_one o;
	struct rig r;
	int err;

	memset(&o, 0, sizeof(o));
	rig_setup(&r);
	r.cm.vwc = 1;
	r.cm.nqueues = 1;
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	memset(&qo, 0, sizeof(qo));
	qo.depth = 2; /* one command fills it */
	if (!err)
		err = upcie_nvme_ioq_create(&q, &r.c, &qo);
	if (!err)
		err = upcie_nvme_ns_open(&ns, &r.c, 1);
	r.cm.hold_opc = UPCIE_NVME_NVM_READ;
	o.req.cb = rig_one_cb;
	o.req.ctx = &o;
	if (!err)
		err = upcie_nvme_ioq_read(&q, &ns, 0, &r.data, 0, 4096, &o.req);
	CHECK(err == 0 && until_true(q1_holds_one, &r, UPCIE_NSEC_PER_SEC) &&
		  upcie_nvme_qpair_room(&q.qp) == 0 && r.c.nqueues == 1,
	      "the only I/O queue full (one held read), no identifier free (%d)", err);
	r.cm.hold_opc = 0;
	err = upcie_nvme_ctrl_close(&r.c);
	CHECK(err == 0 && r.cm.n_shutdown >= 1 && r.cm.flushes_at_shutdown == 1 && o.calls == 1,
	      "close: one Flush before the shutdown, the held read ended once (%d, %u flushes)",
	      err, r.cm.flushes_at_shutdown);
	memset(&q, 0, sizeof(q));
	rig_teardown(&r);
}

/* Create I/O SQ fails, then deleting its CQ fails: the controller is reset, the queue memory
 * goes back, and after a reset queues can be created again. */
static void t_create_cleanup(void)
{
	struct upcie_nvme_ioq q;
	struct rig r;
	uint64_t free0;
	int err;

	rig_setup(&r);
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	free0 = r.c.heap.free_bytes;
	r.cm.fail_create_sq = UPCIE_NVME_SC_INTERNAL;
	r.cm.fail_delete_cq = UPCIE_NVME_SC_INTERNAL;
	if (!err)
		err = upcie_nvme_ioq_create(&q, &r.c, NULL);
	CHECK(err == -EIO && r.c.stopped && r.c.heap.free_bytes == free0 && !r.c.ioqs[1],
	      "Create SQ and then Delete CQ fail: the controller reset, the queue memory and "
	      "identifier given back (%d, %llu of %llu bytes free)",
	      err, (unsigned long long)r.c.heap.free_bytes, (unsigned long long)free0);
	r.cm.fail_create_sq = 0;
	r.cm.fail_delete_cq = 0;
	err = upcie_nvme_ctrl_reset(&r.c);
	if (!err)
		err = upcie_nvme_ioq_create(&q, &r.c, NULL);
	CHECK_EQ(err, 0, "after a reset a queue is created");
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

/* Interrupt queues never share an MSI-X vector (one eventfd, two waiters lose wakeups). */
static void t_vectors_not_shared(void)
{
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ioq a, b;
	struct rig r;
	int err, e2;

	rig_setup(&r);
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	r.c.irqs.count = 3; /* as if three vectors were enabled (the model has no MSI-X) */
	memset(&qo, 0, sizeof(qo));
	qo.irq = true;
	qo.vector = 1;
	if (!err)
		err = upcie_nvme_ioq_create(&a, &r.c, &qo);
	e2 = upcie_nvme_ioq_create(&b, &r.c, &qo);
	CHECK(err == 0 && e2 == -EBUSY && !b.live && r.cm.n_create_cq == 1,
	      "a second interrupt queue on vector 1: -EBUSY, nothing sent (%d, %d)", err, e2);
	qo.vector = 2;
	e2 = upcie_nvme_ioq_create(&b, &r.c, &qo);
	CHECK_EQ(e2, 0, "on vector 2 it is created");
	upcie_nvme_ioq_delete(&b);
	upcie_nvme_ioq_delete(&a);
	r.c.irqs.count = 0;
	rig_teardown(&r);
}

/* Write Zeroes and Dataset Management limits of the NVM command set's Identify Controller
 * (CNS 06h): refused before anything is sent. */
static void t_nvm_limits(void)
{
	struct upcie_nvme_dsm_range *rg;
	struct upcie_nvme_ns ns;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_req req;
	struct rig r;
	uint64_t io0;
	int err, e2, e3, e4;

	rig_setup(&r);
	r.cm.oncs = UPCIE_NVME_ONCS_WRITE_ZEROES | UPCIE_NVME_ONCS_DSM;
	r.cm.wzsl = 1;	 /* 2 minimum pages: 8 KiB */
	r.cm.dmrl = 2;	 /* ranges per command */
	r.cm.dmrsl = 64; /* blocks per range */
	rig_start(&r);
	err = up(&r, &q, &ns, 1);
	CHECK(err == 0 && r.c.wz_max_bytes == 8192 && r.c.dmrl == 2 && r.c.dmrsl == 64,
	      "CNS 06h read at bring-up: Write Zeroes up to 8 KiB, 2 DSM ranges of 64 blocks (%d)",
	      err);
	io0 = r.cm.q[1].m.fetched;
	memset(&req, 0, sizeof(req));
	err = upcie_nvme_ioq_write_zeroes(&q, &ns, 0, 17, 0, &req);
	rg = (struct upcie_nvme_dsm_range *)r.data_va;
	memset(rg, 0, 3 * sizeof(*rg));
	rg[0].nlb = rg[1].nlb = rg[2].nlb = 8;
	e2 = upcie_nvme_ioq_dsm(&q, &ns, &r.data, 0, 3, UPCIE_NVME_DSM_AD, &req);
	rg[1].nlb = 65;
	e3 = upcie_nvme_ioq_dsm(&q, &ns, &r.data, 0, 2, UPCIE_NVME_DSM_AD, &req);
	CHECK(err == -EINVAL && e2 == -EINVAL && e3 == -EINVAL && r.cm.q[1].m.fetched == io0,
	      "17 blocks of Write Zeroes, 3 ranges, a range of 65 blocks: refused, nothing sent "
	      "(%d %d %d)",
	      err, e2, e3);
	err = upcie_nvme_ioq_sync(&q, upcie_nvme_ioq_write_zeroes(&q, &ns, 0, 16, 0, &req), &req, 0,
				  NULL);
	rg[1].nlb = 64;
	e4 = upcie_nvme_ioq_sync(
	    &q, upcie_nvme_ioq_dsm(&q, &ns, &r.data, 0, 2, UPCIE_NVME_DSM_AD, &req), &req, 0, NULL);
	CHECK(err == 0 && e4 == 0, "within the limits both go through (%d, %d)", err, e4);
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

/* opts.aers = UPCIE_NVME_CTRL_AERS_OFF: the driver sends none; a caller's AER goes through. */
static void t_aers_off(void)
{
	struct upcie_nvme_ctrl_opts o;
	struct upcie_nvme_sqe sqe;
	struct rig r;
	int err, e2;

	rig_setup(&r);
	r.cm.aerl = 3;
	rig_start(&r);
	memset(&o, 0, sizeof(o));
	o.aers = UPCIE_NVME_CTRL_AERS_OFF;
	err = rig_ctrl(&r, &o);
	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = UPCIE_NVME_ADMIN_ASYNC_EVENT;
	e2 = upcie_nvme_ctrl_admin(&r.c, &sqe, NULL, 0, 20 * UPCIE_NSEC_PER_MSEC, NULL);
	CHECK(err == 0 && r.c.aer_want == 0 && r.cm.n_aer_fetched == 1 && e2 == -ETIMEDOUT,
	      "AERs off: none from the driver; the caller's own is sent (and, never answered, "
	      "times out: %d, %d)",
	      err, e2);
	rig_teardown(&r);
}

/* An escalation in one thread (an admin command with data that no Abort ends resets the
 * controller) is seen at once by another thread's wait, not at its own deadline. */
struct esc {
	struct rig *r;
	int err;
};

static void *escalate_thread(void *arg)
{
	struct esc *e = (struct esc *)arg;
	uint8_t *id = (uint8_t *)malloc(4096);

	e->err = id ? upcie_nvme_ctrl_identify(&e->r->c, UPCIE_NVME_CNS_CTRL, 0, id) : -ENOMEM;
	free(id);
	return NULL;
}

static void t_escalation_seen(void)
{
	struct upcie_nvme_ctrl_opts o;
	struct upcie_nvme_ns ns;
	struct upcie_nvme_ioq q;
	struct esc e;
	struct rig_one w;
	struct rig r;
	pthread_t t;
	uint64_t t0, took;
	bool started;
	int err;

	memset(&w, 0, sizeof(w));
	rig_setup(&r);
	rig_start(&r);
	memset(&o, 0, sizeof(o));
	o.admin_timeout_ns = 50 * UPCIE_NSEC_PER_MSEC;
	o.abort_timeout_ns = 50 * UPCIE_NSEC_PER_MSEC;
	err = rig_ctrl(&r, &o);
	if (!err)
		err = upcie_nvme_ioq_create(&q, &r.c, NULL);
	if (!err)
		err = upcie_nvme_ns_open(&ns, &r.c, 1);
	r.cm.hold_opc = UPCIE_NVME_NVM_READ;
	r.cm.hold_admin_opc = UPCIE_NVME_ADMIN_IDENTIFY;
	r.cm.abort_aborts = false; /* and no Abort ends it */
	w.req.cb = rig_one_cb;
	w.req.ctx = &w;
	if (!err)
		err = upcie_nvme_ioq_read(&q, &ns, 0, &r.data, 0, 4096, &w.req);
	e.r = &r;
	e.err = 0;
	t0 = upcie_time_ns();
	if (!err)
		err = pthread_create(&t, NULL, escalate_thread, &e) ? -EAGAIN : 0;
	started = !err;
	if (!err)
		err = upcie_nvme_ioq_wait(&q, &w.req, 10 * UPCIE_NSEC_PER_SEC);
	took = upcie_time_ns() - t0;
	if (started)
		pthread_join(t, NULL);
	r.cm.hold_opc = 0;
	r.cm.hold_admin_opc = 0;
	CHECK(err == -ECANCELED && w.calls == 1 && e.err == -ETIMEDOUT && r.c.stopped &&
		  took < 5 * UPCIE_NSEC_PER_SEC,
	      "the other thread's escalation ends the wait in %llu ms (deadline 10 s), the read "
	      "once with -ECANCELED (%d, %d)",
	      (unsigned long long)(took / UPCIE_NSEC_PER_MSEC), err, e.err);
	err = upcie_nvme_ctrl_reset(&r.c);
	if (!err)
		err = read_at(&q, &ns, 0, &r, 0, 4096);
	CHECK_EQ(err, 0, "after the reset the queue reads again");
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

int main(void)
{
	upcie_log_set_handler(rig_log, NULL);
	t_stale_geometry();
	t_format_through_driver();
	t_format_async();
	t_aer_smart();
	t_ns_detach();
	t_ns_attach_resize();
	t_admin_async();
	t_callbacks_use_ctrl();
	t_close_flushes_full();
	t_create_cleanup();
	t_vectors_not_shared();
	t_nvm_limits();
	t_aers_off();
	t_escalation_seen();
	return check_done();
}
