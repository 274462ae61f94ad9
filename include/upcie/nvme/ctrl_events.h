/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Asynchronous events of an NVMe controller: the Asynchronous Event Requests the driver keeps
 * outstanding, the events they bring (decoded, their log page read, which clears the event), the
 * driver's own handling of them, a handler the caller registers, the polling call that reaps the
 * admin queue, and an optional thread that does it. Also the Commands Supported and Effects log,
 * read at bring-up (nvme/ctrl_admin.h uses it to see which admin commands change namespaces).
 *
 * From bring-up to shutdown, and again after every reset, min(AERL + 1, 4) Asynchronous Event
 * Requests are outstanding, with the Asynchronous Event Configuration set for every SMART /
 * health critical warning and, where OAES has them, namespace attribute and firmware activation
 * notices. An AER completes when the controller has an event; whoever reaps the admin queue next
 * (any admin command, upcie_nvme_ctrl_admin_poll(), the thread of upcie_nvme_ctrl_events_start())
 * records it, and upcie_nvme_ctrl_admin_poll() handles it, with no lock held:
 *   - the log page the event names is read (Get Log Page, RAE clear: the event is unmasked),
 *   - Namespace Attribute Changed: the namespaces of the Changed Namespace List are revalidated
 *     (nvme/ctrl_ns.h), all of them when the list overflowed;
 *   - Firmware Activation Starting: CSTS.PP (processing paused) is waited out, bounded by MTFA
 *     (10 s when MTFA is 0), before the log page is read (no command runs while paused);
 *     commands submitted meanwhile wait in their queues; afterwards the namespaces are
 *     revalidated (new firmware can change them);
 *   - SMART / health and error events: logged (critical warning bits and temperature; the error
 *     entry's queue, command and status);
 *   - then the handler (upcie_nvme_ctrl_set_event_handler()) gets the event and the log page;
 *   - the AER is sent again (one whose completion was an error status is not: the controller's
 *     limit is then lower than AERL said).
 * A process that never polls still works: events wait in the controller (masked until their log
 * is read) and the I/O path is never slowed by them; but nothing is revalidated until something
 * polls, so a program that wants to learn of format changes by other hosts polls, or starts the
 * thread. Events beyond 16 between two polls are counted (c->nev_dropped), not handled.
 */
#ifndef UPCIE_NVME_CTRL_EVENTS_H
#define UPCIE_NVME_CTRL_EVENTS_H

#include <upcie/nvme/ctrl_ns.h>

/* Send Asynchronous Event Requests until c->aer_want are outstanding. Lock held. */
static inline void upcie_nvme_ctrl_aer_fill_locked_(struct upcie_nvme_ctrl *c)
{
	while (c->aer_out < c->aer_want && c->state == UPCIE_NVME_CTRL_READY) {
		struct upcie_nvme_sqe sqe;

		memset(&sqe, 0, sizeof(sqe));
		sqe.opc = UPCIE_NVME_ADMIN_ASYNC_EVENT;
		if (upcie_nvme_admin_submit_rec_locked_(c, &sqe, true, NULL, NULL, NULL))
			break;
		c->aer_out++;
	}
}

/*
 * Advanced Command Retry Enable (Host Behavior Support, byte 0): where Identify reports a
 * Command Retry Delay Time, the controller may then ask for a delay before a retry (CQE CRD);
 * retries honour it (nvme/ns.h). Features reset with the controller: bring-up and every reset.
 * A refusal only leaves c->acre clear. Lock held.
 */
static inline void upcie_nvme_ctrl_acre_locked_(struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_sqe sqe;

	c->acre = false;
	if (c->io_retries == UPCIE_NVME_CTRL_RETRIES_OFF ||
	    !(c->id.crdt[0] | c->id.crdt[1] | c->id.crdt[2]) || !c->scratch.vaddr)
		return;
	memset(c->scratch.vaddr, 0, 512);
	*(uint8_t *)c->scratch.vaddr = 1; /* ACRE */
	seg.mem = c->heap.mem;
	seg.off = c->scratch.off;
	seg.len = 512;
	upcie_nvme_cmd_set_features(&sqe, UPCIE_NVME_FEAT_HOST_BEHAVIOR, 0, 0, false);
	c->acre = !upcie_nvme_ctrl_admin_locked_(c, &sqe, &seg, 1, 0, NULL);
	if (!c->acre)
		UPCIE_DBG("nvme %s: Host Behavior Support (ACRE) refused: retries without the "
			  "controller's delays",
			  c->name);
}

/*
 * Bring-up part (lock not held): the Commands Supported and Effects log (when LPA says it is
 * there), the Asynchronous Event Configuration, the AERs. Nothing here is fatal: a controller
 * that refuses them works without events.
 */
static inline void upcie_nvme_ctrl_events_setup_(struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_sqe sqe;
	uint32_t *log, aec;

	if (!c->arec) {
		c->arec = (struct upcie_nvme_admin_rec_ *)calloc(c->admin_depth, sizeof(*c->arec));
		if (!c->arec) {
			UPCIE_WARN("nvme %s: out of memory: no asynchronous admin commands",
				   c->name);
			return;
		}
	}
	if ((c->id.lpa & 0x2u) && !c->effects_read) {
		log = (uint32_t *)malloc(4096);
		if (log &&
		    !upcie_nvme_cmd_get_log_page(&sqe, UPCIE_NVME_LOG_CMD_EFFECTS, 0, 0, 4096, 0,
						 false) &&
		    !upcie_nvme_ctrl_admin_buf(c, &sqe, log, 4096, UPCIE_NVME_XFER_FROM_DEV, 0,
					       NULL)) {
			memcpy(c->effects, log, sizeof(c->effects));
			c->effects_read = true;
		}
		free(log);
	}
	aec = UPCIE_NVME_AEC_SMART_ALL |
	      (c->id.oaes & (UPCIE_NVME_AEC_NS_ATTR | UPCIE_NVME_AEC_FW_ACTIVATE));
	upcie_nvme_cmd_set_features(&sqe, UPCIE_NVME_FEAT_ASYNC_EVENT, 0, aec, false);
	pthread_mutex_lock(&c->lock);
	if (!upcie_nvme_ctrl_admin_locked_(c, &sqe, NULL, 0, 0, NULL))
		c->aen_config = aec;
	upcie_nvme_ctrl_acre_locked_(c);
	c->aer_want = (uint32_t)c->id.aerl + 1;
	if (c->aer_want > UPCIE_NVME_CTRL_AERS)
		c->aer_want = UPCIE_NVME_CTRL_AERS;
	if (c->aer_opt == UPCIE_NVME_CTRL_AERS_OFF)
		c->aer_want = 0;
	else if (c->aer_opt && c->aer_opt < c->aer_want)
		c->aer_want = c->aer_opt;
	c->aer_out = 0;
	upcie_nvme_ctrl_aer_fill_locked_(c);
	pthread_mutex_unlock(&c->lock);
}

/*
 * Register `fn(ctx, c, ev)` for every event the controller reports from now on (NULL: none).
 * Called from upcie_nvme_ctrl_admin_poll() (so from the event thread when one runs), after the
 * driver's own handling, with no lock held. Returns 0 or -EINVAL.
 */
static inline int upcie_nvme_ctrl_set_event_handler(struct upcie_nvme_ctrl *c,
						    upcie_nvme_event_fn fn, void *ctx)
{
	if (!c || !c->lock_live)
		return UPCIE_FAIL(-EINVAL, "nvme: event handler: controller not open");
	pthread_mutex_lock(&c->lock);
	c->ev_fn = fn;
	c->ev_ctx = ctx;
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* Bytes of log page `lid` that an event's handling reads. */
static inline size_t upcie_nvme_event_log_len_(uint8_t lid)
{
	switch (lid) {
	case UPCIE_NVME_LOG_ERROR:
		return 64; /* the newest entry */
	case UPCIE_NVME_LOG_CHANGED_NS:
		return 4096;
	default:
		return 512; /* SMART / health, firmware slot, and others */
	}
}

/* Wait for CSTS.PP to clear (firmware activation), bounded by MTFA. */
static inline int upcie_nvme_ctrl_fw_wait_(struct upcie_nvme_ctrl *c, bool *paused)
{
	struct upcie_deadline dl;
	uint16_t mtfa;
	uint32_t csts;

	memcpy(&mtfa, (const uint8_t *)&c->id + 270, sizeof(mtfa)); /* MTFA, 100 ms units */
	upcie_deadline_set(&dl, (mtfa ? mtfa : 100) * 100 * UPCIE_NSEC_PER_MSEC);
	*paused = false;
	for (;;) {
		csts = upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CSTS);
		if (csts == UPCIE_NVME_REG_GONE)
			return -ENODEV;
		if (!(csts & UPCIE_NVME_CSTS_PP))
			return 0;
		*paused = true;
		if (upcie_deadline_passed(&dl))
			return UPCIE_FAIL(
			    -ETIMEDOUT,
			    "nvme %s: processing still paused (CSTS.PP) %u ms after "
			    "a firmware activation began (MTFA): reset the controller",
			    c->name, (mtfa ? mtfa : 100u) * 100u);
		upcie_sleep_ns(UPCIE_NVME_CTRL_REG_POLL_NS);
	}
}

/* Handle one event (no lock held): read its log page, the driver's part, the caller's part. */
static inline void upcie_nvme_ctrl_event_(struct upcie_nvme_ctrl *c, uint32_t dw0)
{
	struct upcie_nvme_event ev;
	struct upcie_nvme_sqe sqe;
	upcie_nvme_event_fn fn;
	uint8_t *log;
	void *ctx;

	memset(&ev, 0, sizeof(ev));
	ev.dw0 = dw0;
	ev.type = (uint8_t)(dw0 & 7u);
	ev.info = (uint8_t)(dw0 >> 8);
	ev.lid = (uint8_t)(dw0 >> 16);
	if (ev.type == UPCIE_NVME_AE_TYPE_NOTICE && ev.info == UPCIE_NVME_AE_NOTICE_FW_ACTIVATE) {
		/* While CSTS.PP is set the controller processes no command, admin included: the
		 * log page (Firmware Slot) is read once processing resumed, as Linux does, never
		 * during the pause (a read then would time out, and its Abort escalate to a reset
		 * in the middle of the activation). */
		UPCIE_WARN("nvme %s: firmware activation starting: waiting for processing to "
			   "resume",
			   c->name);
		ev.fw_err = upcie_nvme_ctrl_fw_wait_(c, &ev.fw_paused);
	}
	log = (uint8_t *)calloc(1, 4096);
	ev.log = log;
	if (!log)
		ev.log_err = -ENOMEM;
	else if (ev.lid) {
		ev.log_len = upcie_nvme_event_log_len_(ev.lid);
		ev.log_err = upcie_nvme_cmd_get_log_page(&sqe, ev.lid, UPCIE_NVME_NSID_ALL, 0,
							 ev.log_len, 0, false);
		if (!ev.log_err)
			ev.log_err = upcie_nvme_ctrl_admin_buf(c, &sqe, log, ev.log_len,
							       UPCIE_NVME_XFER_FROM_DEV, 0, NULL);
		if (ev.log_err)
			ev.log_len = 0;
	}
	if (ev.type == UPCIE_NVME_AE_TYPE_NOTICE && ev.info == UPCIE_NVME_AE_NOTICE_NS_CHANGED) {
		const uint32_t *l = (const uint32_t *)log;

		if (ev.log_err || l[0] == UPCIE_NVME_NSID_ALL) {
			/* unread or overflowed (more than 1024 changed): every namespace */
			upcie_nvme_ctrl_ns_revalidate(c, UPCIE_NVME_NSID_ALL);
		} else {
			for (uint32_t i = 0; i < 1024 && l[i]; i++) {
				upcie_nvme_ctrl_ns_revalidate(c, l[i]);
				ev.nchanged++;
			}
		}
	} else if (ev.type == UPCIE_NVME_AE_TYPE_NOTICE &&
		   ev.info == UPCIE_NVME_AE_NOTICE_FW_ACTIVATE) {
		if (!ev.fw_err)
			upcie_nvme_ctrl_ns_revalidate(c, UPCIE_NVME_NSID_ALL);
	} else if (ev.type == UPCIE_NVME_AE_TYPE_SMART) {
		UPCIE_WARN("nvme %s: SMART / health event 0x%02x: critical warning 0x%02x, "
			   "temperature %d K",
			   c->name, ev.info, ev.log_len ? log[0] : 0,
			   ev.log_len ? (int)(log[1] | log[2] << 8) : -1);
	} else if (ev.type == UPCIE_NVME_AE_TYPE_ERROR) {
		uint16_t sqid = 0, cid = 0, st = 0;

		if (ev.log_len >= 16) {
			memcpy(&sqid, log + 8, 2);
			memcpy(&cid, log + 10, 2);
			memcpy(&st, log + 12, 2);
		}
		UPCIE_ERR("nvme %s: error event 0x%02x: queue %u, command 0x%04x, status 0x%03x",
			  c->name, ev.info, sqid, cid, (unsigned)(st >> 1) & 0x7ffu);
	} else {
		UPCIE_DBG("nvme %s: event type %u info 0x%02x log 0x%02x", c->name, ev.type,
			  ev.info, ev.lid);
	}
	pthread_mutex_lock(&c->lock);
	fn = c->ev_fn;
	ctx = c->ev_ctx;
	c->nevents++;
	pthread_mutex_unlock(&c->lock);
	if (fn)
		fn(ctx, c, &ev);
	free(log);
}

/*
 * Reap the admin queue of `c`: completions of asynchronous admin commands go to their callbacks,
 * events to the driver's handling and the handler (see above), and the Asynchronous Event
 * Requests are sent again. No lock is held during any callback. Call it from any thread, as
 * often as events should be seen (or start the event thread). Returns the number of completions
 * and events handed on (>= 0), or -EINVAL.
 */
static inline int upcie_nvme_ctrl_admin_poll(struct upcie_nvme_ctrl *c)
{
	uint32_t ev[UPCIE_NVME_CTRL_EVENTS], nev;
	int n;

	if (!c || !c->lock_live)
		return UPCIE_FAIL(-EINVAL, "nvme: admin poll: controller not open");
	pthread_mutex_lock(&c->lock);
	if (c->state == UPCIE_NVME_CTRL_READY && !c->stopped)
		upcie_nvme_qpair_reap(&c->admin, 0xffffffffu);
	pthread_mutex_unlock(&c->lock);
	n = upcie_nvme_ctrl_admin_deliver_(c); /* also moves AER completions to the events */
	pthread_mutex_lock(&c->lock);
	nev = c->nev;
	memcpy(ev, c->ev_dw0, nev * sizeof(ev[0]));
	c->nev = 0;
	pthread_mutex_unlock(&c->lock);
	for (uint32_t i = 0; i < nev; i++)
		upcie_nvme_ctrl_event_(c, ev[i]);
	pthread_mutex_lock(&c->lock);
	upcie_nvme_ctrl_aer_fill_locked_(c);
	pthread_mutex_unlock(&c->lock);
	return n + (int)nev;
}

static inline void *upcie_nvme_ctrl_events_thread_(void *arg)
{
	struct upcie_nvme_ctrl *c = (struct upcie_nvme_ctrl *)arg;
	struct timespec ts;

	pthread_mutex_lock(&c->lock);
	while (!c->ev_stop) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += (time_t)(c->ev_interval_ns / UPCIE_NSEC_PER_SEC);
		ts.tv_nsec += (long)(c->ev_interval_ns % UPCIE_NSEC_PER_SEC);
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&c->ev_cond, &c->lock, &ts);
		if (c->ev_stop)
			break;
		pthread_mutex_unlock(&c->lock);
		upcie_nvme_ctrl_admin_poll(c);
		pthread_mutex_lock(&c->lock);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

/*
 * Start a thread that calls upcie_nvme_ctrl_admin_poll() every `interval_ns` (0: 100 ms), so
 * events are handled and asynchronous admin commands complete without the caller polling. The
 * handler and the callbacks then run on that thread. Returns 0, -EALREADY, -EINVAL, or the
 * thread's creation error.
 */
static inline int upcie_nvme_ctrl_events_start(struct upcie_nvme_ctrl *c, uint64_t interval_ns)
{
	pthread_condattr_t ca;
	int err;

	if (!c || !c->lock_live)
		return UPCIE_FAIL(-EINVAL, "nvme: events: controller not open");
	if (c->ev_live)
		return -EALREADY;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	err = pthread_cond_init(&c->ev_cond, &ca);
	pthread_condattr_destroy(&ca);
	if (err)
		return UPCIE_FAIL(-err, "nvme %s: events: %s", c->name, strerror(err));
	c->ev_interval_ns = interval_ns ? interval_ns : 100 * UPCIE_NSEC_PER_MSEC;
	c->ev_stop = false;
	err = pthread_create(&c->ev_thread, NULL, upcie_nvme_ctrl_events_thread_, c);
	if (err) {
		pthread_cond_destroy(&c->ev_cond);
		return UPCIE_FAIL(-err, "nvme %s: events thread: %s", c->name, strerror(err));
	}
	c->ev_live = true;
	return 0;
}

/* Stop the thread of upcie_nvme_ctrl_events_start() (close does it too). Returns 0. */
static inline int upcie_nvme_ctrl_events_stop(struct upcie_nvme_ctrl *c)
{
	if (!c || !c->ev_live)
		return 0;
	pthread_mutex_lock(&c->lock);
	c->ev_stop = true;
	pthread_cond_signal(&c->ev_cond);
	pthread_mutex_unlock(&c->lock);
	pthread_join(c->ev_thread, NULL);
	pthread_cond_destroy(&c->ev_cond);
	c->ev_live = false;
	return 0;
}

#endif /* UPCIE_NVME_CTRL_EVENTS_H */
