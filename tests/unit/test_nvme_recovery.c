/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Recovery paths and events against the controller model (nvme_ctrl_model.h), driven as a user
 * drives the driver:
 *   - upcie_nvme_ioq_io_sync() on a queue full of commands the controller holds, the controller
 *     failing (CSTS.CFS) while the call waits for room: an error within about the call's
 *     timeout, not twice it, and a log line that names the errno (not "successful completion");
 *   - the event thread (upcie_nvme_ctrl_events_start()/_stop()): a SMART temperature event is
 *     reaped and handed to the handler on that thread while the test never polls (the control:
 *     without the thread nothing is handed on); stop joins it and nothing is handed on after;
 *   - Firmware Activation Starting: CSTS.PP set for a while (no command of any queue processed),
 *     waited out within MTFA without an Abort or a reset, a read submitted meanwhile fetched
 *     after the pause and completed, the event with its Firmware Slot log handed on after the
 *     pause; a pause beyond MTFA reported as -ETIMEDOUT at MTFA;
 *   - error events: the Error Information log entry read (RAE clear: the next one comes) and
 *     handed on decoded, and logged with its queue, command and status;
 *   - on a fake PCI function (fake_machine.h, uio path, the model serving its BAR0 file): a
 *     controller that ignores CC.EN = 0, so halt turns bus mastering off (command register),
 *     its held commands end once and it reaches none of their memory, the failed reset leaves
 *     state FAILED, a later reset that stops it turns bus mastering on again, and close keeps
 *     the host memory of a controller that never disabled (-EBUSY) but gives back that of one
 *     that did; NVM Subsystem Reset refused on a PCI function (-EOPNOTSUPP, NSSR not written).
 *     These need root and 2 free 2 MiB hugepages (the uio path's host memory); else skipped.
 */
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#include <pthread.h>

#include "check.h"
#include "fake_machine.h"
#include "nvme_ctrl_rig.h"

#define MS UPCIE_NSEC_PER_MSEC

/* The log, captured (the handler runs on any thread): each line with when it came. */
#define NLOG 256
static struct {
	pthread_mutex_t mu;
	char line[NLOG][512];
	uint64_t at[NLOG];
	int n;
} lg = { PTHREAD_MUTEX_INITIALIZER, { { 0 } }, { 0 }, 0 };

static void log_cap(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	pthread_mutex_lock(&lg.mu);
	if (lg.n < NLOG) {
		snprintf(lg.line[lg.n], sizeof(lg.line[0]), "%s", msg);
		lg.at[lg.n] = upcie_time_ns();
		lg.n++;
	}
	pthread_mutex_unlock(&lg.mu);
	printf("#   log: %s\n", msg);
}

static void log_clear(void)
{
	pthread_mutex_lock(&lg.mu);
	lg.n = 0;
	pthread_mutex_unlock(&lg.mu);
}

/* The first captured line holding `a` (and `b` when not NULL) into out; false: none. */
static bool log_find(const char *a, const char *b, char *out, size_t len, uint64_t *at)
{
	bool found = false;

	pthread_mutex_lock(&lg.mu);
	for (int i = 0; i < lg.n && !found; i++)
		if (strstr(lg.line[i], a) && (!b || strstr(lg.line[i], b))) {
			snprintf(out, len, "%s", lg.line[i]);
			if (at)
				*at = lg.at[i];
			found = true;
		}
	pthread_mutex_unlock(&lg.mu);
	if (!found)
		snprintf(out, len, "(none)");
	return found;
}

static bool data_ok(struct rig *r, uint64_t off, uint64_t slba, uint64_t len)
{
	return !memcmp((uint8_t *)r->data_va + off, r->ns + slba * RIG_LBA, len);
}

/* Until `n` commands of I/O queue 1 are held by the model (1 s at most). */
static bool q1_holds(struct rig *r, uint32_t n)
{
	uint64_t t0 = upcie_time_ns();

	while (__atomic_load_n(&r->cm.q[1].m.nheld, __ATOMIC_ACQUIRE) != n) {
		if (upcie_time_ns() - t0 > UPCIE_NSEC_PER_SEC)
			return false;
		sched_yield();
	}
	return true;
}

/* 1. The controller dies while io_sync waits for queue room. */
struct killer {
	struct rig *r;
	uint64_t after_ns, at_ns;
};

static void *kill_thread(void *arg)
{
	struct killer *k = (struct killer *)arg;

	upcie_sleep_ns(k->after_ns);
	nvme_cmodel_fatal(&k->r->cm);
	k->at_ns = upcie_time_ns();
	return NULL;
}

static void t_io_sync_dead_while_full(void)
{
	const uint64_t timeout = 800 * MS;
	struct upcie_nvme_ctrl_opts o;
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct upcie_nvme_io io;
	struct rig_one held[2];
	struct killer k;
	struct rig r;
	pthread_t t;
	char line[512];
	uint64_t t0, took;
	bool started = false;
	int err;

	memset(held, 0, sizeof(held));
	rig_setup(&r);
	rig_start(&r);
	memset(&o, 0, sizeof(o));
	o.admin_timeout_ns = 100 * MS;
	o.abort_timeout_ns = 100 * MS;
	err = rig_ctrl(&r, &o);
	memset(&qo, 0, sizeof(qo));
	qo.depth = 4;	    /* three commands in flight at most */
	qo.max_xfer = 4096; /* an 8 KiB read is two commands */
	if (!err)
		err = upcie_nvme_ioq_create(&q, &r.c, &qo);
	if (!err)
		err = upcie_nvme_ns_open(&ns, &r.c, 1);
	r.cm.hold_opc = UPCIE_NVME_NVM_READ;
	for (int i = 0; i < 2 && !err; i++) {
		held[i].req.cb = rig_one_cb;
		held[i].req.ctx = &held[i];
		err = upcie_nvme_ioq_read(&q, &ns, 0, &r.data, (uint64_t)i * 4096, 4096,
					  &held[i].req);
	}
	CHECK(err == 0 && q1_holds(&r, 2),
	      "io_sync, controller dies: two reads held by the controller, one slot left (%d)",
	      err);
	seg.mem = &r.data;
	seg.off = 64 * 1024;
	seg.len = 8192;
	memset(&io, 0, sizeof(io));
	io.opc = UPCIE_NVME_NVM_READ;
	io.slba = 64;
	io.segs = &seg;
	io.nsegs = 1;
	k.r = &r;
	k.after_ns = 200 * MS;
	k.at_ns = 0;
	log_clear();
	t0 = upcie_time_ns();
	if (!err)
		started = !pthread_create(&t, NULL, kill_thread, &k);
	/* the first command takes the last slot, the second waits for room that never comes */
	err = started ? upcie_nvme_ioq_io_sync(&q, &ns, &io, timeout, NULL) : -EAGAIN;
	took = upcie_time_ns() - t0;
	if (started)
		pthread_join(t, NULL);
	CHECK(err < 0 && took < timeout + timeout / 2,
	      "io_sync, controller dies: an error (%d) after %llu ms, CSTS.CFS set at %llu ms: "
	      "within about the call's timeout of %llu ms, not twice it",
	      err, (unsigned long long)(took / MS),
	      (unsigned long long)(k.at_ns > t0 ? (k.at_ns - t0) / MS : 0),
	      (unsigned long long)(timeout / MS));
	CHECK_EQ(err, -EIO, "io_sync, controller dies: the dead controller's -EIO (CSTS.CFS)");
	CHECK(log_find("Read on namespace 1", NULL, line, sizeof(line), NULL) &&
		  strstr(line, upcie_errno_name(err)) && !strstr(line, "successful completion") &&
		  !strstr(line, "status 0x000"),
	      "io_sync, controller dies: the failed read's log line names %s, not a successful "
	      "status: \"%s\"",
	      upcie_errno_name(err), line);

	r.cm.hold_opc = 0;
	err = upcie_nvme_ctrl_reset(&r.c);
	CHECK(err == 0 && held[0].calls == 1 && held[1].calls == 1 && held[0].err == -ECANCELED &&
		  held[1].err == -ECANCELED,
	      "io_sync, controller dies: the reset brings it back, the held reads end once with "
	      "-ECANCELED (%d; %d, %d calls)",
	      err, held[0].calls, held[1].calls);
	err = upcie_nvme_ioq_read_sync(&q, &ns, 64, &r.data, 64 * 1024, 8192, NULL);
	CHECK(err == 0 && data_ok(&r, 64 * 1024, 64, 8192),
	      "io_sync, controller dies: the same read works after the reset (%d)", err);
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

/* Events, as the handler saw them (it may run on the event thread). */
struct evrec {
	pthread_mutex_t mu;
	int n;
	struct upcie_nvme_event ev[8];
	uint8_t log[8][512];
	bool on_main[8];
	bool lock_free[8];
	uint32_t csts[8];   /* CSTS when the handler ran */
	uint64_t at[8];	    /* when */
	uint32_t ndis[8];   /* the model's disables then */
	uint32_t nident[8]; /* Identify commands the model executed by then */
	pthread_t main;
	struct rig *r;
};

static void evrec_init(struct evrec *e, struct rig *r)
{
	memset(e, 0, sizeof(*e));
	pthread_mutex_init(&e->mu, NULL);
	e->main = pthread_self();
	e->r = r;
}

static void on_event(void *ctx, struct upcie_nvme_ctrl *c, const struct upcie_nvme_event *ev)
{
	struct evrec *e = (struct evrec *)ctx;
	bool lock_free = pthread_mutex_trylock(&c->lock) == 0;

	if (lock_free)
		pthread_mutex_unlock(&c->lock);
	pthread_mutex_lock(&e->mu);
	if (e->n < 8) {
		int i = e->n;

		e->ev[i] = *ev;
		e->ev[i].log = NULL; /* valid during the call only: copied */
		memcpy(e->log[i], ev->log, ev->log_len < 512 ? ev->log_len : 512);
		e->on_main[i] = pthread_equal(pthread_self(), e->main);
		e->lock_free[i] = lock_free;
		e->csts[i] = nvme_cmodel_rd(&e->r->cm, UPCIE_NVME_REG_CSTS);
		e->at[i] = upcie_time_ns();
		e->ndis[i] = __atomic_load_n(&e->r->cm.n_disable, __ATOMIC_ACQUIRE);
		e->nident[i] = __atomic_load_n(&e->r->cm.n_identify, __ATOMIC_ACQUIRE);
	}
	e->n++;
	pthread_mutex_unlock(&e->mu);
}

static int evrec_n(struct evrec *e)
{
	int n;

	pthread_mutex_lock(&e->mu);
	n = e->n;
	pthread_mutex_unlock(&e->mu);
	return n;
}

/* Sleep (never polling the controller) until `want` events were handed on, or `ns` passed. */
static int evrec_wait(struct evrec *e, int want, uint64_t ns)
{
	uint64_t t0 = upcie_time_ns();

	while (evrec_n(e) < want && upcie_time_ns() - t0 < ns)
		upcie_sleep_ns(2 * MS);
	return evrec_n(e);
}

/* 4a. The event thread hands events on without the caller polling; stop joins it. */
static void t_events_thread(void)
{
	const uint32_t smart_temp =
	    UPCIE_NVME_AE_TYPE_SMART | (1u << 8) | ((uint32_t)UPCIE_NVME_LOG_SMART << 16);
	struct evrec e;
	struct rig r;
	uint64_t t0, took;
	int err, n;

	rig_setup(&r);
	r.cm.aerl = 3;	     /* the driver keeps 4 */
	r.cm.temp_k = 345;   /* 72 C */
	r.cm.smart_cw = 0x2; /* over its temperature threshold */
	rig_start(&r);
	evrec_init(&e, &r);
	err = rig_ctrl(&r, NULL);
	if (!err)
		err = upcie_nvme_ctrl_set_event_handler(&r.c, on_event, &e);
	CHECK(err == 0 && rig_admin_held(&r, 4), "events thread: 4 AERs outstanding (%d)", err);

	/* the control: with nobody reaping the admin queue, the event is not handed on */
	nvme_cmodel_event(&r.cm, smart_temp);
	n = evrec_wait(&e, 1, 300 * MS);
	CHECK(n == 0 && r.cm.n_aer_done == 1,
	      "events thread, control: the controller completed an AER, but without the thread "
	      "and without polling nothing is handed on (%d events)",
	      n);

	t0 = upcie_time_ns();
	err = upcie_nvme_ctrl_events_start(&r.c, 10 * MS);
	CHECK_EQ(err, 0, "events thread: started (10 ms interval)");
	CHECK_EQ(upcie_nvme_ctrl_events_start(&r.c, 10 * MS), -EALREADY,
		 "events thread: a second start is -EALREADY");
	n = evrec_wait(&e, 1, 2 * UPCIE_NSEC_PER_SEC);
	took = upcie_time_ns() - t0;
	CHECK(n == 1 && e.ev[0].type == UPCIE_NVME_AE_TYPE_SMART && e.ev[0].info == 1 &&
		  e.ev[0].lid == UPCIE_NVME_LOG_SMART && !e.ev[0].log_err &&
		  e.ev[0].log_len == 512 && (e.log[0][0] & 2) &&
		  (e.log[0][1] | e.log[0][2] << 8) == 345,
	      "events thread: the SMART temperature event handed on in %llu ms, decoded (type "
	      "%u, info %u, log page 0x%02x: critical warning 0x%02x, %d K), the test never "
	      "polling (%d events)",
	      (unsigned long long)(took / MS), e.ev[0].type, e.ev[0].info, e.ev[0].lid, e.log[0][0],
	      e.log[0][1] | e.log[0][2] << 8, n);
	CHECK(n >= 1 && !e.on_main[0] && e.lock_free[0],
	      "events thread: the handler ran on the event thread, no driver lock held");
	CHECK(rig_admin_held(&r, 4) && r.cm.last_log_lid == UPCIE_NVME_LOG_SMART &&
		  !r.cm.last_log_rae,
	      "events thread: the log read with RAE clear, the AER sent again: 4 outstanding");

	t0 = upcie_time_ns();
	err = upcie_nvme_ctrl_events_stop(&r.c);
	took = upcie_time_ns() - t0;
	CHECK(err == 0 && took < 500 * MS,
	      "events thread: stop returns 0 and joins the thread in %llu ms",
	      (unsigned long long)(took / MS));
	nvme_cmodel_event(&r.cm, UPCIE_NVME_AE_TYPE_SMART | (0u << 8) |
				     ((uint32_t)UPCIE_NVME_LOG_SMART << 16));
	n = evrec_wait(&e, 2, 300 * MS);
	CHECK(n == 1 && r.cm.n_aer_done == 2,
	      "events thread: stopped, so the next event (its AER completed) is not handed on "
	      "(%d events)",
	      n);
	t0 = upcie_time_ns();
	while (evrec_n(&e) < 2 && upcie_time_ns() - t0 < 2 * UPCIE_NSEC_PER_SEC)
		upcie_nvme_ctrl_admin_poll(&r.c);
	CHECK(evrec_n(&e) == 2 && e.ev[1].info == 0 && e.on_main[1],
	      "events thread: the caller's own poll then hands it on, on the caller's thread");
	CHECK(upcie_nvme_ctrl_events_stop(&r.c) == 0 && upcie_nvme_ctrl_events_start(&r.c, 0) == 0,
	      "events thread: a second stop is a no-op; the thread starts again");
	rig_teardown(&r); /* close stops it */
	pthread_mutex_destroy(&e.mu);
}

/* The I/O command the model fetched as number `n` (0..63) came after CSTS.PP cleared. */
static bool fetched_after_pause(struct rig *r, uint64_t n)
{
	return n < 64 && r->cm.io_fetched > n && r->cm.pp_clear_ns &&
	       r->cm.io_fetch_ns[n] >= r->cm.pp_clear_ns;
}

/*
 * 4b. Firmware Activation Starting, the pause (CSTS.PP) within MTFA but longer than the admin
 * and abort timeouts: no command is processed meanwhile, admin commands included, so the
 * driver must wait for CSTS.PP to clear (as Linux does before it reads the Firmware Slot log)
 * and must neither abort nor reset the controller; I/O submitted meanwhile waits in its queue.
 */
static void t_fw_activation(void)
{
	const uint32_t pause_ms = 800;
	struct upcie_nvme_ctrl_opts o;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct evrec e;
	struct rig r;
	uint32_t ndis, aborts, ident;
	uint64_t t0, nio;
	bool pp = false;
	int err, n;

	rig_setup(&r);
	r.cm.oaes = UPCIE_NVME_AEC_FW_ACTIVATE;
	r.cm.mtfa = 30; /* 3 s */
	rig_start(&r);
	evrec_init(&e, &r);
	memset(&o, 0, sizeof(o));
	o.admin_timeout_ns = 250 * MS;
	o.abort_timeout_ns = 250 * MS;
	err = rig_ctrl(&r, &o);
	if (!err)
		err = upcie_nvme_ioq_create(&q, &r.c, NULL);
	if (!err)
		err = upcie_nvme_ns_open(&ns, &r.c, 1);
	if (!err)
		err = upcie_nvme_ctrl_set_event_handler(&r.c, on_event, &e);
	if (!err)
		err = upcie_nvme_ctrl_events_start(&r.c, 10 * MS);
	CHECK(err == 0 && (r.cm.aec & UPCIE_NVME_AEC_FW_ACTIVATE) && rig_admin_held(&r, 1),
	      "firmware activation: notices enabled (AEC 0x%x), an AER outstanding, the event "
	      "thread running (%d)",
	      r.cm.aec, err);
	ndis = r.cm.n_disable;
	aborts = r.cm.n_abort_fetched;
	ident = r.cm.n_identify;
	log_clear();
	nvme_cmodel_fw_activate(&r.cm, "2.0", pause_ms);
	t0 = upcie_time_ns();
	while (!pp && upcie_time_ns() - t0 < UPCIE_NSEC_PER_SEC) {
		pp = nvme_cmodel_rd(&r.cm, UPCIE_NVME_REG_CSTS) & UPCIE_NVME_CSTS_PP;
		sched_yield();
	}
	/* a read during the pause: the controller fetches it only afterwards */
	nio = r.cm.io_fetched;
	err = pp ? upcie_nvme_ioq_read_sync(&q, &ns, 32, &r.data, 0, 4096, NULL) : -EAGAIN;
	CHECK(err == 0 && data_ok(&r, 0, 32, 4096) && fetched_after_pause(&r, nio),
	      "firmware activation: a read submitted while CSTS.PP is set waits in its queue, "
	      "is fetched after the pause and completes with the data (%d)",
	      err);
	n = evrec_wait(&e, 1, 5 * UPCIE_NSEC_PER_SEC);
	CHECK(n == 1 && e.ev[0].type == UPCIE_NVME_AE_TYPE_NOTICE &&
		  e.ev[0].info == UPCIE_NVME_AE_NOTICE_FW_ACTIVATE &&
		  e.ev[0].lid == UPCIE_NVME_LOG_FW_SLOT && !e.ev[0].log_err &&
		  e.ev[0].log_len >= 16 && e.log[0][0] == 1 && !memcmp(e.log[0] + 8, "2.0", 4),
	      "firmware activation: Firmware Activation Starting handed on, its Firmware Slot "
	      "log read (slot %u active, revision \"%.8s\"; log error %d, %d events)",
	      e.log[0][0], (const char *)e.log[0] + 8, e.ev[0].log_err, n);
	CHECK(n == 1 && e.ev[0].fw_paused && e.ev[0].fw_err == 0 &&
		  !(e.csts[0] & UPCIE_NVME_CSTS_PP) && e.at[0] >= r.cm.pp_clear_ns &&
		  r.cm.n_fw_act == 1,
	      "firmware activation: CSTS.PP seen set and waited out (fw_paused %d, fw_err %d), "
	      "the handler called after it cleared (CSTS 0x%08x)",
	      n ? e.ev[0].fw_paused : 0, n ? e.ev[0].fw_err : 0, e.csts[0]);
	CHECK(r.cm.n_abort_fetched == aborts && r.cm.n_disable == ndis &&
		  (n < 1 || e.ndis[0] == ndis) && r.c.state == UPCIE_NVME_CTRL_READY &&
		  r.cm.pp_steps > 0,
	      "firmware activation: a pause of %u ms within MTFA (3 s), longer than the admin "
	      "timeout (250 ms): no Abort sent, no controller reset (%u Aborts, %u disables)",
	      pause_ms, r.cm.n_abort_fetched - aborts, r.cm.n_disable - ndis);
	CHECK(n == 1 && e.nident[0] > ident && e.ndis[0] == ndis,
	      "firmware activation: the namespaces re-identified after the activation (%u "
	      "Identify commands)",
	      n ? e.nident[0] - ident : 0);
	upcie_nvme_ctrl_events_stop(&r.c);
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
	pthread_mutex_destroy(&e.mu);
}

/* 4b. A pause beyond MTFA: reported at MTFA (fw_err -ETIMEDOUT), not after the pause. */
static void t_fw_beyond_mtfa(void)
{
	const uint32_t pause_ms = 1500;
	struct evrec e;
	struct rig r;
	char line[512];
	uint64_t at = 0, after;
	int err, n;

	rig_setup(&r);
	r.cm.oaes = UPCIE_NVME_AEC_FW_ACTIVATE;
	r.cm.mtfa = 3; /* 300 ms */
	rig_start(&r);
	evrec_init(&e, &r);
	err = rig_ctrl(&r, NULL);
	if (!err)
		err = upcie_nvme_ctrl_set_event_handler(&r.c, on_event, &e);
	if (!err)
		err = upcie_nvme_ctrl_events_start(&r.c, 10 * MS);
	CHECK_EQ(err, 0, "firmware activation beyond MTFA: controller up, event thread running");
	log_clear();
	nvme_cmodel_fw_activate(&r.cm, "3.0", pause_ms);
	n = evrec_wait(&e, 1, 5 * UPCIE_NSEC_PER_SEC);
	CHECK(n == 1 && e.ev[0].info == UPCIE_NVME_AE_NOTICE_FW_ACTIVATE && e.ev[0].fw_paused &&
		  e.ev[0].fw_err == -ETIMEDOUT,
	      "firmware activation beyond MTFA: handed on with fw_err -ETIMEDOUT (fw_paused %d, "
	      "fw_err %d)",
	      n ? e.ev[0].fw_paused : 0, n ? e.ev[0].fw_err : 0);
	log_find("still paused", "MTFA", line, sizeof(line), &at);
	after = at > r.cm.pp_set_ns && r.cm.pp_set_ns ? (at - r.cm.pp_set_ns) / MS : 0;
	CHECK(at && after >= 300 && after < pause_ms - 300,
	      "firmware activation beyond MTFA: \"still paused\" logged %llu ms into the pause "
	      "(MTFA 300 ms, the pause %u ms): \"%s\"",
	      (unsigned long long)after, pause_ms, line);
	upcie_nvme_ctrl_events_stop(&r.c);
	rig_teardown(&r);
	pthread_mutex_destroy(&e.mu);
}

/* 4c. Error events: the Error Information log entry read and handed on, decoded and logged. */
static void t_error_event(void)
{
	struct evrec e;
	struct rig r;
	char line[512];
	uint64_t count0 = 0, count1 = 0;
	uint16_t sqid = 0, cid = 0, sf = 0;
	int err, n;

	rig_setup(&r);
	rig_start(&r);
	evrec_init(&e, &r);
	err = rig_ctrl(&r, NULL);
	if (!err)
		err = upcie_nvme_ctrl_set_event_handler(&r.c, on_event, &e);
	if (!err)
		err = upcie_nvme_ctrl_events_start(&r.c, 10 * MS);
	CHECK_EQ(err, 0, "error event: controller up, event thread running");
	log_clear();
	/* transient internal error on queue 1, command 0x0012, Data Transfer Error */
	nvme_cmodel_error(&r.cm, 0x04, 1, 0x0012, UPCIE_NVME_SC_DATA_XFER_ERROR, 1);
	n = evrec_wait(&e, 1, 2 * UPCIE_NSEC_PER_SEC);
	if (n >= 1) {
		memcpy(&count0, e.log[0], 8);
		memcpy(&sqid, e.log[0] + 8, 2);
		memcpy(&cid, e.log[0] + 10, 2);
		memcpy(&sf, e.log[0] + 12, 2);
	}
	CHECK(n == 1 && e.ev[0].type == UPCIE_NVME_AE_TYPE_ERROR && e.ev[0].info == 0x04 &&
		  e.ev[0].lid == UPCIE_NVME_LOG_ERROR && !e.ev[0].log_err &&
		  e.ev[0].log_len == 64 && count0 == 1 && sqid == 1 && cid == 0x0012 &&
		  (sf >> 1) == UPCIE_NVME_SC_DATA_XFER_ERROR,
	      "error event: handed on decoded (type %u, info 0x%02x, log page 0x%02x, %zu "
	      "bytes: error count %llu, queue %u, command 0x%04x, status 0x%03x)",
	      e.ev[0].type, e.ev[0].info, e.ev[0].lid, e.ev[0].log_len, (unsigned long long)count0,
	      sqid, cid, (unsigned)(sf >> 1));
	CHECK(log_find("error event 0x04", "queue 1, command 0x0012", line, sizeof(line), NULL) &&
		  strstr(line, "status 0x004"),
	      "error event: logged with its queue, command and status: \"%s\"", line);
	CHECK(r.cm.last_log_lid == UPCIE_NVME_LOG_ERROR && !r.cm.last_log_rae,
	      "error event: the Error Information log read with RAE clear (unmasks the type)");
	/* the next error comes, since the first one's log was read */
	nvme_cmodel_error(&r.cm, 0x05, 0, 0x0003, UPCIE_NVME_SC_INVALID_FIELD, 0);
	n = evrec_wait(&e, 2, 2 * UPCIE_NSEC_PER_SEC);
	if (n >= 2)
		memcpy(&count1, e.log[1], 8);
	CHECK(n == 2 && e.ev[1].type == UPCIE_NVME_AE_TYPE_ERROR && e.ev[1].info == 0x05 &&
		  count1 == 2,
	      "error event: a second one handed on, its entry the newest (error count %llu)",
	      (unsigned long long)count1);
	upcie_nvme_ctrl_events_stop(&r.c);
	rig_teardown(&r);
	pthread_mutex_destroy(&e.mu);
}

/*
 * A whole controller on a fake PCI function (fake_machine.h, uio path): the controller model
 * serves the function's BAR0 file, which the driver maps, and fetches, moves and posts nothing
 * while the fake config space's bus master bit is clear; it starts when the driver first sets
 * CC.EN (by then open has allocated the host memory, whose hugepage LUT it translates through).
 * A write of the function's sysfs reset file is a function level reset of the model while
 * `flr_works`. Opening needs root (physical addresses) and 2 free 2 MiB hugepages.
 */
#define MR_BDF	     "0000:00:0a.0"
#define MR_REGS	     16384u
#define MR_DATA_IOVA (UINT64_C(1) << 52) /* above any physical address of the host memory */
#define MR_DATA_SIZE (1u << 20)

struct mrig {
	struct nvme_cmodel cm;
	struct nvme_model_iomap im;
	uint8_t *ns;
	void *data_va;
	struct upcie_dmamem data;
	volatile uint32_t *bar;
	struct upcie_nvme_ctrl c;
	bool opened;
	int flr_works;
	int started; /* the model runs */
	int run;
	pthread_t watch;
};

static bool mr_bus_master(void *ctx)
{
	(void)ctx;
	return (fm_cfg_cmd(MR_BDF) & UPCIE_PCI_CMD_MASTER) != 0;
}

/* Whether the driver wrote the function's reset file since the last look (then emptied). */
static bool mr_reset_written(void)
{
	char path[512], c = 0;
	bool w = false;
	int fd;

	fm_path(FM_DEV MR_BDF "/reset", path, sizeof(path));
	fd = open(path, O_RDWR);
	if (fd >= 0) {
		w = pread(fd, &c, 1, 0) == 1 && c == '1';
		if (w && ftruncate(fd, 0))
			w = false;
		close(fd);
	}
	return w;
}

static void *mr_watch(void *arg)
{
	struct mrig *m = (struct mrig *)arg;

	while (__atomic_load_n(&m->run, __ATOMIC_ACQUIRE)) {
		if (!m->started &&
		    (__atomic_load_n(&m->bar[UPCIE_NVME_REG_CC / 4], __ATOMIC_ACQUIRE) & 1)) {
			/* the driver enables: its host memory exists now */
			nvme_model_iomap_add(&m->im, &m->c.host_own);
			if (nvme_cmodel_start(&m->cm))
				exit(2);
			__atomic_store_n(&m->started, 1, __ATOMIC_RELEASE);
		}
		if (mr_reset_written() && __atomic_load_n(&m->flr_works, __ATOMIC_ACQUIRE) &&
		    m->started)
			nvme_cmodel_flr(&m->cm);
		usleep(50);
	}
	return NULL;
}

/* The model on the fake function's BAR0, `cap_or` ORed into its CAP; the watcher running. */
static void mr_setup(struct mrig *m, uint64_t cap_or)
{
	char path[512];
	void *va;
	int fd;

	memset(m, 0, sizeof(*m));
	m->ns = (uint8_t *)calloc(RIG_NS_BLOCKS, RIG_LBA);
	m->data_va = aligned_alloc(4096, MR_DATA_SIZE);
	if (!m->ns || !m->data_va)
		exit(2);
	for (uint64_t i = 0; i < (uint64_t)RIG_NS_BLOCKS * RIG_LBA; i++)
		m->ns[i] = (uint8_t)(i * 13 + (i >> 9));
	memset(m->data_va, 0, MR_DATA_SIZE);
	upcie_dmamem_init_arith(&m->data, m->data_va, MR_DATA_SIZE, MR_DATA_IOVA);
	nvme_model_iomap_add(&m->im, &m->data);
	nvme_cmodel_init(&m->cm, &m->im, m->ns, RIG_NS_BLOCKS, RIG_LBA);
	nvme_cmodel_set_cap(&m->cm, nvme_cmodel_rd64(&m->cm, UPCIE_NVME_REG_CAP) | cap_or);
	fm_path(FM_DEV MR_BDF "/resource0", path, sizeof(path));
	fd = open(path, O_RDWR);
	va = fd < 0 ? MAP_FAILED : mmap(NULL, MR_REGS, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (va == MAP_FAILED)
		exit(2);
	close(fd);
	memset(va, 0, MR_REGS);
	m->bar = (volatile uint32_t *)va;
	nvme_cmodel_use_regs(&m->cm, va, MR_REGS);
	m->cm.bus_master = mr_bus_master;
	fm_put(FM_DEV MR_BDF "/reset", "");
	fm_cfg_cmd_set(MR_BDF, UPCIE_PCI_CMD_MEMORY); /* as uio_pci_generic leaves it */
	m->run = 1;
	if (pthread_create(&m->watch, NULL, mr_watch, m))
		exit(2);
}

/* Open the fake function on the uio path, as a user does. */
static int mr_open(struct mrig *m)
{
	struct upcie_nvme_ctrl_opts o;
	struct upcie_pci_bdf bdf;
	int err;

	memset(&o, 0, sizeof(o));
	o.dev.path = UPCIE_NVME_PATH_UIO;
	o.host_mem = 4u << 20;
	o.admin_timeout_ns = 200 * MS;
	o.abort_timeout_ns = 200 * MS;
	upcie_pci_bdf_parse(MR_BDF, &bdf);
	err = upcie_nvme_ctrl_open(&m->c, &bdf, &o);
	m->opened = !err;
	return err;
}

static void mr_teardown(struct mrig *m)
{
	if (m->opened)
		upcie_nvme_ctrl_close(&m->c);
	__atomic_store_n(&m->run, 0, __ATOMIC_RELEASE);
	pthread_join(m->watch, NULL);
	if (m->started)
		nvme_cmodel_stop(&m->cm);
	nvme_cmodel_fini(&m->cm);
	nvme_model_iomap_fini(&m->im);
	upcie_dmamem_destroy(&m->data);
	munmap((void *)m->bar, MR_REGS);
	free(m->ns);
	free(m->data_va);
}

/* kB of hugetlb memory this process has mapped (HugetlbPages in /proc/self/status); -1. */
static long hugetlb_kb(void)
{
	char line[256];
	long kb = -1;
	FILE *fp = fopen("/proc/self/status", "r");

	while (fp && fgets(line, sizeof(line), fp))
		if (sscanf(line, "HugetlbPages: %ld kB", &kb) == 1)
			break;
	if (fp)
		fclose(fp);
	return kb;
}

/* Whether a controller can be opened on the fake function here: root (physical addresses from
 * pagemap) and 2 free 2 MiB hugepages for its host memory. */
static bool mr_possible(void)
{
	static char probe[4096] __attribute__((aligned(4096)));
	uint64_t nfree = 0, phys;

	probe[0] = 1;
	return geteuid() == 0 && !upcie_pagemap_phys(probe, &phys) &&
	       !upcie_file_read_u64("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages",
				    &nfree) &&
	       nfree >= 2 && hugetlb_kb() >= 0;
}

static bool mr_q1_holds(struct mrig *m, uint32_t n)
{
	uint64_t t0 = upcie_time_ns();

	while (__atomic_load_n(&m->cm.q[1].m.nheld, __ATOMIC_ACQUIRE) != n) {
		if (upcie_time_ns() - t0 > UPCIE_NSEC_PER_SEC)
			return false;
		sched_yield();
	}
	return true;
}

static void skip_n(int n, const char *what, const char *why)
{
	for (int i = 0; i < n; i++)
		CHECK_SKIP("%s: %s", what, why);
}

/*
 * 2. The bus-mastering fallback: a controller that ignores CC.EN = 0 (CSTS.RDY stays 1). A
 * reset cannot disable it, so halt turns bus mastering off, which counts as stopped: the
 * commands it held end once (-ECANCELED) and it reaches none of their memory; the reset fails,
 * since neither the disable nor the function reset stops it, and bus mastering stays off.
 * `recover`: the function reset then works, and a later reset disables the controller, turns
 * bus mastering on again (the command register) and brings the queue back; close gives the
 * host memory back (the control). Else: the function has no reset method, and close of the
 * controller that never disabled keeps the host memory (it could resume once someone turns
 * bus mastering on) and says -EBUSY.
 */
static void t_bm_fallback(bool recover)
{
	const char *what = recover ? "bus master fallback, recovered" : "bus master fallback, kept";
	const int nchecks = recover ? 10 : 8;
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct rig_one op[2];
	struct mrig m;
	long kb_open, kb_close;
	int err;

	if (!mr_possible()) {
		skip_n(nchecks, what, "needs root and 2 free 2 MiB hugepages");
		return;
	}
	memset(op, 0, sizeof(op));
	mr_setup(&m, 0);
	err = mr_open(&m);
	if (err == -ENOMEM) {
		mr_teardown(&m);
		skip_n(nchecks, what, "the open did not get its hugepages");
		return;
	}
	kb_open = hugetlb_kb();
	memset(&qo, 0, sizeof(qo));
	qo.depth = 16;
	if (!err)
		err = upcie_nvme_ioq_create(&q, &m.c, &qo);
	if (!err)
		err = upcie_nvme_ns_open(&ns, &m.c, 1);
	m.cm.hold_opc = UPCIE_NVME_NVM_READ;
	for (int i = 0; i < 2 && !err; i++) {
		op[i].req.cb = rig_one_cb;
		op[i].req.ctx = &op[i];
		err = upcie_nvme_ioq_read(&q, &ns, 8 * (uint64_t)i, &m.data, 4096 * (uint64_t)i,
					  4096, &op[i].req);
	}
	CHECK(err == 0 && m.c.dev.open && (fm_cfg_cmd(MR_BDF) & UPCIE_PCI_CMD_MASTER) &&
		  mr_q1_holds(&m, 2),
	      "%s: opened on the fake function, bus mastering on, two reads held (%d)", what, err);

	/* it hangs: CC.EN = 0 is ignored, and a function reset does not help (or is missing) */
	m.cm.no_disable = true;
	if (!recover)
		fm_rm(FM_DEV MR_BDF "/reset");
	memset(m.data_va, 0x5a, 2 * 4096);
	err = upcie_nvme_ctrl_reset(&m.c);
	CHECK(err != 0 && m.cm.disable_ignored,
	      "%s: the reset fails: the controller ignored CC.EN = 0 and never disabled (%d)", what,
	      err);
	CHECK_EQ(m.c.state, UPCIE_NVME_CTRL_FAILED,
		 "%s: the failed reset leaves state FAILED (its contract: reset again or close)",
		 what);
	CHECK(!(fm_cfg_cmd(MR_BDF) & UPCIE_PCI_CMD_MASTER),
	      "%s: halt turned bus mastering off and it stays off (command register 0x%04x)", what,
	      fm_cfg_cmd(MR_BDF));
	CHECK(op[0].calls == 1 && op[1].calls == 1 && op[0].err == -ECANCELED &&
		  op[1].err == -ECANCELED,
	      "%s: bus mastering off counts as stopped: the held reads ended once with -ECANCELED "
	      "(%d, %d calls)",
	      what, op[0].calls, op[1].calls);
	nvme_cmodel_release(&m.cm); /* it would complete them now, could it reach memory */
	upcie_sleep_ns(50 * MS);
	CHECK(m.cm.bm_off_steps > 0 && m.cm.q[1].m.posted == 0 &&
		  ((uint8_t *)m.data_va)[0] == 0x5a && ((uint8_t *)m.data_va)[8191] == 0x5a,
	      "%s: the controller, still enabled, reaches none of their memory (%llu steps "
	      "without bus mastering, nothing posted, the buffers untouched)",
	      what, (unsigned long long)m.cm.bm_off_steps);

	if (recover) {
		/* the function reset works now: a later reset stops it and turns BME on */
		__atomic_store_n(&m.flr_works, 1, __ATOMIC_RELEASE);
		err = upcie_nvme_ctrl_reset(&m.c);
		CHECK(err == 0 && m.cm.n_flr == 1 && m.c.state == UPCIE_NVME_CTRL_READY,
		      "%s: a later reset succeeds, a function reset having stopped the controller "
		      "(%d, %u function resets)",
		      what, err, m.cm.n_flr);
		CHECK(fm_cfg_cmd(MR_BDF) & UPCIE_PCI_CMD_MASTER,
		      "%s: the reset turned bus mastering on again (command register 0x%04x)", what,
		      fm_cfg_cmd(MR_BDF));
		m.cm.hold_opc = 0;
		err = upcie_nvme_ioq_read_sync(&q, &ns, 16, &m.data, 0, 4096, NULL);
		CHECK(err == 0 && !memcmp(m.data_va, m.ns + 16 * RIG_LBA, 4096),
		      "%s: the recreated queue reads again (%d)", what, err);
		upcie_nvme_ioq_delete(&q);
		err = upcie_nvme_ctrl_close(&m.c);
		kb_close = hugetlb_kb();
		CHECK(err == 0 && kb_close == kb_open - 4096,
		      "%s, control: the controller disabled, so close gives its host memory back "
		      "(%d; HugetlbPages %ld kB -> %ld kB)",
		      what, err, kb_open, kb_close);
	} else {
		err = upcie_nvme_ctrl_close(&m.c);
		kb_close = hugetlb_kb();
		CHECK(err == -EBUSY && kb_close == kb_open,
		      "%s: close of the controller that never disabled: -EBUSY, its 4 MiB of host "
		      "memory kept (%d; HugetlbPages %ld kB -> %ld kB)",
		      what, err, kb_open, kb_close);
		CHECK(!(fm_cfg_cmd(MR_BDF) & UPCIE_PCI_CMD_MASTER),
		      "%s: bus mastering off after close", what);
		fm_put(FM_DEV MR_BDF "/reset", "");
	}
	m.opened = false;
	mr_teardown(&m);
}

/*
 * 3. NVM Subsystem Reset on a PCI function upcie opened: refused with -EOPNOTSUPP and a message
 * that says why (the link goes down, config space comes back reset) and what to use instead;
 * NSSR is not written and the controller goes on.
 */
static void t_nssr_pci(void)
{
	const char *what = "NSSR on a PCI function";
	struct mrig m;
	char line[512];
	uint8_t *id;
	int err;

	if (!mr_possible()) {
		skip_n(3, what, "needs root and 2 free 2 MiB hugepages");
		return;
	}
	mr_setup(&m, UINT64_C(1) << 36); /* CAP.NSSRS */
	err = mr_open(&m);
	if (err == -ENOMEM) {
		mr_teardown(&m);
		skip_n(3, what, "the open did not get its hugepages");
		return;
	}
	CHECK(err == 0 && m.c.dev.open && upcie_nvme_cap_nssrs(m.c.cap),
	      "%s: opened on the fake function, CAP.NSSRS set (%d)", what, err);
	log_clear();
	err = upcie_nvme_ctrl_subsystem_reset(&m.c);
	upcie_sleep_ns(20 * MS); /* time for the model to see an NSSR write */
	log_find("subsystem reset", "configuration space", line, sizeof(line), NULL);
	CHECK(err == -EOPNOTSUPP && m.cm.n_nssr == 0 &&
		  !nvme_cmodel_rd(&m.cm, UPCIE_NVME_REG_NSSR) &&
		  strstr(line, "upcie_nvme_ctrl_reset()"),
	      "%s: refused with -EOPNOTSUPP (%d), NSSR not written (%u resets), the message says "
	      "why and what to use: \"%s\"",
	      what, err, m.cm.n_nssr, line);
	id = (uint8_t *)malloc(4096);
	err = id ? upcie_nvme_ctrl_identify(&m.c, UPCIE_NVME_CNS_CTRL, 0, id) : -ENOMEM;
	CHECK(err == 0 && m.c.state == UPCIE_NVME_CTRL_READY && m.cm.n_disable == 0,
	      "%s: the controller goes on, untouched (Identify %d)", what, err);
	free(id);
	mr_teardown(&m);
}

int main(void)
{
	upcie_log_set_handler(log_cap, NULL);
	fm_machine();
	fm_uio_nvme(MR_BDF, 9, MR_REGS);
	t_io_sync_dead_while_full();
	t_events_thread();
	t_fw_activation();
	t_fw_beyond_mtfa();
	t_error_event();
	t_bm_fallback(true);
	t_nssr_pci();
	t_bm_fallback(false);
	fm_cleanup();
	return check_done();
}
