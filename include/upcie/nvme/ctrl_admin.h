/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Admin commands of an NVMe controller (nvme/ctrl_regs.h): submission and wait under the
 * controller's mutex, commands with data through the admin bounce buffer, Identify (any CNS, with
 * a command set), the active namespace list, and Abort. Needs an enabled controller.
 *
 * Errors: 0 or -errno. A command the controller completes with an error status is -EIO, and its
 * completion (status code type and code, upcie_nvme_cqe_code()) is handed to the caller, never
 * hidden.
 *
 * Timeouts never hand back memory the controller may still write (a command's buffers, its PRP
 * list pages, the admin data buffer, the memory of a queue being created or deleted). A command
 * that does not complete in time is aborted (admin Abort with its SQID and CID; the commands of
 * one request together) and given the abort timeout to end by its completion or by the abort.
 * One that still has not ended stays the controller's: an asynchronous wait returns -ETIMEDOUT
 * with its request pending; the synchronous helpers, an admin command with data and a queue that
 * cannot be deleted escalate to a controller reset (CC.EN = 0, state FAILED), after which the
 * commands end with -ECANCELED and upcie_nvme_ctrl_reset() brings the controller back, as the
 * Linux driver does. Every timeout path reads CSTS first: a controller gone (all ones) or fatal
 * (CSTS.CFS) is reset at once, not sent Aborts, deletes, a Flush or a shutdown (-ENODEV, -EIO).
 */
#ifndef UPCIE_NVME_CTRL_ADMIN_H
#define UPCIE_NVME_CTRL_ADMIN_H

#include <upcie/nvme/ctrl_regs.h>

/* nvme/ctrl_ns.h: re-read the open namespaces (after a command whose effects say so). */
static inline int upcie_nvme_ctrl_ns_revalidate(struct upcie_nvme_ctrl *c, uint32_t nsid);

/*
 * Completion of an admin command from upcie_nvme_ctrl_admin_async() or of one of the driver's
 * Asynchronous Event Requests: recorded, under the lock of whoever reaps the admin queue, and
 * handed on after that lock is released (upcie_nvme_ctrl_admin_deliver_()).
 */
static inline void upcie_nvme_admin_rec_cb_(void *ctx, const struct upcie_nvme_cqe *cqe, int err);

/*
 * Whether a completed admin command may have changed a namespace (its format, size, command set,
 * or whether it exists): from the Commands Supported and Effects log (LBCC, NCC, NIC), read at
 * bring-up, or, where the controller has no such log, for Format NVM, Sanitize, Namespace
 * Management and Attachment and Firmware Commit.
 */
static inline bool upcie_nvme_admin_changes_ns_(const struct upcie_nvme_ctrl *c, uint8_t opc)
{
	if (c->effects_read)
		return (c->effects[opc] & 1u) && (c->effects[opc] & (0x7u << 1));
	return opc == UPCIE_NVME_ADMIN_FORMAT_NVM || opc == UPCIE_NVME_ADMIN_SANITIZE ||
	       opc == UPCIE_NVME_ADMIN_NS_MGMT || opc == UPCIE_NVME_ADMIN_NS_ATTACH ||
	       opc == UPCIE_NVME_ADMIN_FW_COMMIT;
}

/*
 * Submit an admin command and wait for it with the lock held. On a timeout: a dead controller
 * (all ones, CSTS.CFS) is reset at once; else the command is aborted (Abort on SQID 0) and given
 * the abort timeout to end. A command that still has not ended and owns memory the controller
 * may write (data, or a queue it creates) escalates to a controller reset
 * (upcie_nvme_ctrl_fail_locked_()): only then is the memory free again. One without memory is
 * cancelled (its CID stays reserved until a late completion or a reset). The completion goes to
 * *cqe (may be NULL). Returns 0, -EIO for an error status (logged), -EBUSY, -ETIMEDOUT (aborted,
 * cancelled or reset), -ENODEV (not ready, or gone), -EIO (fatal status).
 */
static inline int upcie_nvme_ctrl_admin_locked_(struct upcie_nvme_ctrl *c,
						const struct upcie_nvme_sqe *sqe,
						const struct upcie_nvme_dseg *data, unsigned nsegs,
						uint64_t timeout_ns, struct upcie_nvme_cqe *cqe);

/* Admin Abort of (sqid, cid) with the lock held; *aborted from completion dw0 bit 0. */
static inline int upcie_nvme_ctrl_abort_locked_(struct upcie_nvme_ctrl *c, uint16_t sqid,
						uint16_t cid, bool *aborted)
{
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_cqe cqe;
	int err;

	upcie_nvme_cmd_abort(&sqe, sqid, cid);
	memset(&cqe, 0, sizeof(cqe));
	err = upcie_nvme_ctrl_admin_locked_(c, &sqe, NULL, 0, c->abort_timeout_ns, &cqe);
	if (aborted)
		*aborted = !err && !(cqe.dw0 & 1u);
	return err;
}

/* Whether the controller may write host memory for this admin command: a data pointer, or a
 * queue it creates. */
static inline bool upcie_nvme_admin_owns_memory_(const struct upcie_nvme_sqe *sqe)
{
	return sqe->prp1 || sqe->prp2 || sqe->opc == UPCIE_NVME_ADMIN_CREATE_CQ ||
	       sqe->opc == UPCIE_NVME_ADMIN_CREATE_SQ;
}

static inline int upcie_nvme_ctrl_admin_locked_(struct upcie_nvme_ctrl *c,
						const struct upcie_nvme_sqe *sqe,
						const struct upcie_nvme_dseg *data, unsigned nsegs,
						uint64_t timeout_ns, struct upcie_nvme_cqe *cqe)
{
	struct upcie_nvme_lists lists;
	struct upcie_nvme_sqe cmd = *sqe;
	struct upcie_nvme_sync_ s;
	uint16_t cid;
	bool aborted = false;
	int err, dead;

	if (c->state != UPCIE_NVME_CTRL_READY)
		return UPCIE_FAIL(-ENODEV,
				  "nvme %s: admin command 0x%02x: controller not ready "
				  "(state %d: reset it)",
				  c->name, sqe->opc, (int)c->state);
	if (data && nsegs) {
		/* admin commands take PRPs only */
		lists.mem = c->heap.mem;
		lists.off = c->alists.off;
		lists.npages = UPCIE_NVME_CTRL_ADMIN_LISTS;
		err = upcie_nvme_prp_build(&cmd, data, nsegs, &c->admin_dptr, &lists);
		if (err < 0)
			return err;
	}
	if (!timeout_ns)
		timeout_ns = c->admin_timeout_ns;
	s.done = false;
	s.err = 0;
	memset(&s.cqe, 0, sizeof(s.cqe));
	err = upcie_nvme_qpair_submit(&c->admin, &cmd, upcie_nvme_sync_cb_, &s, &cid);
	if (err)
		return UPCIE_FAIL(err, "nvme %s: admin queue full", c->name);
	err = upcie_nvme_qpair_wait(&c->admin, cid, timeout_ns);
	if (err == -ETIMEDOUT) {
		UPCIE_ERR("nvme %s: admin command 0x%02x (CID 0x%04x) not completed after %" PRIu64
			  " ms",
			  c->name, sqe->opc, cid, timeout_ns / UPCIE_NSEC_PER_MSEC);
		dead = upcie_nvme_ctrl_dead_(c);
		if (dead) {
			upcie_nvme_ctrl_fail_locked_(c, "dead controller");
			if (!s.done)
				upcie_nvme_qpair_cancel(&c->admin, cid); /* it did not let go */
			if (cqe)
				*cqe = s.cqe;
			return dead;
		}
		/* never abort an Abort */
		if (sqe->opc != UPCIE_NVME_ADMIN_ABORT) {
			upcie_nvme_ctrl_abort_locked_(c, 0, cid, &aborted);
			if (c->state == UPCIE_NVME_CTRL_READY)
				upcie_nvme_qpair_wait(&c->admin, cid, c->abort_timeout_ns);
		}
		if (!s.done) {
			if (upcie_nvme_admin_owns_memory_(&cmd))
				upcie_nvme_ctrl_fail_locked_(c, "admin command not ended by Abort");
			if (!s.done)
				upcie_nvme_qpair_cancel(&c->admin, cid);
		}
		if (cqe)
			*cqe = s.cqe;
		/* ended by itself after all: its own result */
		if (s.err || upcie_nvme_cqe_code(&s.cqe) == UPCIE_NVME_SC_ABORT_REQ)
			return -ETIMEDOUT;
		err = 0;
	}
	if (cqe)
		*cqe = s.cqe;
	if (s.err)
		return s.err;
	if (!upcie_nvme_cqe_ok(&s.cqe)) {
		uint16_t code = upcie_nvme_cqe_code(&s.cqe);

		UPCIE_ERR("nvme %s: admin command 0x%02x: %s (status 0x%03x%s)", c->name, sqe->opc,
			  upcie_nvme_status_str(code), code,
			  upcie_nvme_cqe_dnr(&s.cqe) ? ", DNR" : "");
		return -EIO;
	}
	return 0;
}

static inline void upcie_nvme_admin_rec_cb_(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct upcie_nvme_admin_rec_ *r = (struct upcie_nvme_admin_rec_ *)ctx;

	r->cqe = *cqe;
	r->err = err;
	r->state = UPCIE_NVME_AREC_DONE;
}

/*
 * The records of `c` that completed, lock held: an AER's event goes to the event queue (handled
 * by upcie_nvme_ctrl_admin_poll()), its record is freed; a caller's completion is copied into
 * out[0..max) and its record freed. Returns how many were copied.
 */
static inline unsigned upcie_nvme_admin_take_locked_(struct upcie_nvme_ctrl *c,
						     struct upcie_nvme_admin_rec_ *out,
						     unsigned max)
{
	unsigned n = 0;

	for (uint32_t i = 0; c->arec && i < c->admin_depth; i++) {
		struct upcie_nvme_admin_rec_ *r = &c->arec[i];

		if (r->state != UPCIE_NVME_AREC_DONE)
			continue;
		if (r->aer) {
			c->aer_out--;
			if (!r->err && upcie_nvme_cqe_ok(&r->cqe)) {
				if (c->nev < UPCIE_NVME_CTRL_EVENTS)
					c->ev_dw0[c->nev++] = r->cqe.dw0;
				else
					c->nev_dropped++;
			} else if (!r->err) {
				/* e.g. Asynchronous Event Request Limit Exceeded: not sent again */
				UPCIE_WARN("nvme %s: Asynchronous Event Request ended with %s "
					   "(status 0x%03x): not resubmitted",
					   c->name,
					   upcie_nvme_status_str(upcie_nvme_cqe_code(&r->cqe)),
					   upcie_nvme_cqe_code(&r->cqe));
				if (c->aer_want)
					c->aer_want--;
			}
			memset(r, 0, sizeof(*r));
			continue;
		}
		if (n == max)
			continue; /* the next call takes it; the AERs are all looked at */
		out[n++] = *r;
		memset(r, 0, sizeof(*r));
	}
	return n;
}

/*
 * Hand the completed asynchronous admin commands to their callbacks, with the lock released (a
 * callback may submit admin commands again). When one of them succeeded and may have changed a
 * namespace (upcie_nvme_admin_changes_ns_()), as the synchronous path does, the open namespaces
 * are revalidated first, still without the lock and on this thread (it issues Identify through
 * the synchronous path, which delivers what completed meanwhile), and only then do the callbacks
 * run: a callback, or a thread it signals, that submits I/O on a handle opened before meets
 * -ESTALE, never the old geometry. Not while the controller is not ready (a reset revalidates
 * everything once it is back). Returns how many were delivered.
 */
static inline int upcie_nvme_ctrl_admin_deliver_(struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_admin_rec_ batch[16];
	int total = 0;
	unsigned n;

	do {
		bool ready, reval = false;

		pthread_mutex_lock(&c->lock);
		n = upcie_nvme_admin_take_locked_(c, batch, UPCIE_ARRAY_SIZE(batch));
		ready = c->state == UPCIE_NVME_CTRL_READY && !c->stopped;
		pthread_mutex_unlock(&c->lock);
		for (unsigned i = 0; ready && i < n; i++)
			reval |= !batch[i].err && upcie_nvme_cqe_ok(&batch[i].cqe) &&
				 upcie_nvme_admin_changes_ns_(c, batch[i].opc);
		if (reval)
			upcie_nvme_ctrl_ns_revalidate(c, UPCIE_NVME_NSID_ALL);
		for (unsigned i = 0; i < n; i++)
			batch[i].cb(batch[i].ctx, &batch[i].cqe, batch[i].err);
		total += (int)n;
	} while (n == UPCIE_ARRAY_SIZE(batch));
	return total;
}

/*
 * An Asynchronous Event Request of the caller's: refused (-EINVAL) while the driver keeps its own
 * (opts.aers), passed through (0) when it keeps none and `off_ok`.
 */
static inline int upcie_nvme_admin_aer_check_(const struct upcie_nvme_ctrl *c, uint8_t opc,
					      bool off_ok)
{
	if (opc != UPCIE_NVME_ADMIN_ASYNC_EVENT ||
	    (off_ok && c->aer_opt == UPCIE_NVME_CTRL_AERS_OFF))
		return 0;
	return UPCIE_FAIL(-EINVAL,
			  "nvme %s: Asynchronous Event Requests are the driver's: register a "
			  "handler (upcie_nvme_ctrl_set_event_handler()), or open with "
			  "opts.aers = UPCIE_NVME_CTRL_AERS_OFF",
			  c->name);
}

/*
 * After a synchronous admin command, lock released: the asynchronous completions reaped
 * meanwhile go to their callbacks, and a command that succeeded and may have changed a
 * namespace is followed by a revalidation.
 */
static inline void upcie_nvme_admin_after_(struct upcie_nvme_ctrl *c, uint8_t opc, int err)
{
	upcie_nvme_ctrl_admin_deliver_(c);
	if (!err && upcie_nvme_admin_changes_ns_(c, opc))
		upcie_nvme_ctrl_ns_revalidate(c, UPCIE_NVME_NSID_ALL);
}

/* Submit `sqe` on the admin queue to complete through a record (lock held). */
static inline int upcie_nvme_admin_submit_rec_locked_(struct upcie_nvme_ctrl *c,
						      struct upcie_nvme_sqe *cmd, bool aer,
						      upcie_nvme_cpl_fn cb, void *ctx,
						      uint16_t *cid)
{
	struct upcie_nvme_admin_rec_ *r = NULL;
	uint16_t k;
	int err;

	if (c->state != UPCIE_NVME_CTRL_READY || !c->arec)
		return -ENODEV;
	for (uint32_t i = 0; i < c->admin_depth && !r; i++)
		if (c->arec[i].state == UPCIE_NVME_AREC_FREE)
			r = &c->arec[i];
	if (!r)
		return -EBUSY;
	r->cb = cb;
	r->ctx = ctx;
	r->aer = aer;
	r->opc = cmd->opc;
	r->err = 0;
	err = upcie_nvme_qpair_submit(&c->admin, cmd, upcie_nvme_admin_rec_cb_, r, &k);
	if (err)
		return err;
	r->cid = k;
	r->state = UPCIE_NVME_AREC_PENDING;
	if (cid)
		*cid = k;
	return 0;
}

/*
 * Submit admin command `sqe` without waiting: `cb(ctx, cqe, err)` is called once when it ends,
 * by whichever call of this controller next reaps the admin queue and releases the lock
 * (upcie_nvme_ctrl_admin_poll(), any synchronous admin command, the event thread of
 * upcie_nvme_ctrl_events_start(), a reset), never with a driver lock held: err 0 with the
 * controller's status in cqe, or -ECANCELED when a reset or close ended it. A command that
 * succeeded and may have changed a namespace (as for upcie_nvme_ctrl_admin(): Format NVM,
 * Sanitize, namespace management and attachment, firmware commit, or what the Commands Supported
 * and Effects log says) is followed by a revalidation of the open namespaces, run by that same
 * call before the callback (so the callback already finds handles opened before refusing I/O
 * with -ESTALE); the call that delivers it takes that much longer (one Identify per open
 * namespace). Data: `nsegs`
 * segments (PRPs) of at most two controller pages in all (no PRP list: the admin list pages
 * belong to the synchronous path), in memory the caller keeps until the callback. No timeout:
 * the caller decides (upcie_nvme_ctrl_abort() with the CID in *cid). Returns 0, -EBUSY (the
 * admin queue is full), -ENODEV (not ready), -EINVAL.
 */
static inline int upcie_nvme_ctrl_admin_async(struct upcie_nvme_ctrl *c,
					      const struct upcie_nvme_sqe *sqe,
					      const struct upcie_nvme_dseg *data, unsigned nsegs,
					      upcie_nvme_cpl_fn cb, void *ctx, uint16_t *cid)
{
	struct upcie_nvme_sqe cmd;
	struct upcie_nvme_lists none;
	int err;

	if (!c || !c->lock_live || !sqe || !cb || (nsegs && !data))
		return UPCIE_FAIL(-EINVAL, "nvme: admin async: controller not open, NULL command "
					   "or callback");
	err = upcie_nvme_admin_aer_check_(c, sqe->opc, false);
	if (err)
		return err;
	cmd = *sqe;
	if (nsegs) {
		memset(&none, 0, sizeof(none));
		none.mem = c->heap.mem;
		err = upcie_nvme_prp_build(&cmd, data, nsegs, &c->admin_dptr, &none);
		if (err < 0)
			return UPCIE_FAIL(err,
					  "nvme %s: admin async: data must fit two pages without "
					  "a PRP list",
					  c->name);
	}
	pthread_mutex_lock(&c->lock);
	err = upcie_nvme_admin_submit_rec_locked_(c, &cmd, false, cb, ctx, cid);
	pthread_mutex_unlock(&c->lock);
	if (err == -ENODEV)
		return UPCIE_FAIL(err, "nvme %s: admin async: controller not ready (state %d)",
				  c->name, (int)c->state);
	return err;
}

/*
 * Run admin command `sqe` (the CID is assigned here) with data in `nsegs` segments (PRPs; may be
 * NULL), waiting up to timeout_ns (0: the controller's admin timeout). The completion goes to
 * *cqe (may be NULL): on -EIO it holds the error status. A command that succeeded and may have
 * changed a namespace (Format NVM, Sanitize, namespace management and attachment, firmware
 * commit, or what the Commands Supported and Effects log says) is followed by a revalidation
 * of the open namespaces (upcie_nvme_ctrl_ns_revalidate()). Asynchronous completions reaped
 * meanwhile are delivered before returning. Returns 0, -EIO (error status), -ETIMEDOUT (aborted
 * and cancelled), -ENODEV (controller not ready), -EINVAL (data).
 */
static inline int upcie_nvme_ctrl_admin(struct upcie_nvme_ctrl *c, const struct upcie_nvme_sqe *sqe,
					const struct upcie_nvme_dseg *data, unsigned nsegs,
					uint64_t timeout_ns, struct upcie_nvme_cqe *cqe)
{
	int err;

	if (!c || !c->lock_live || !sqe)
		return UPCIE_FAIL(-EINVAL, "nvme: admin: controller not open or NULL command");
	err = upcie_nvme_admin_aer_check_(c, sqe->opc, true);
	if (err)
		return err;
	pthread_mutex_lock(&c->lock);
	err = upcie_nvme_ctrl_admin_locked_(c, sqe, data, nsegs, timeout_ns, cqe);
	pthread_mutex_unlock(&c->lock);
	upcie_nvme_admin_after_(c, sqe->opc, err);
	return err;
}

#define UPCIE_NVME_XFER_NONE	 0
#define UPCIE_NVME_XFER_FROM_DEV 1 /* the controller writes host memory (Identify, logs) */
#define UPCIE_NVME_XFER_TO_DEV	 2 /* the controller reads it */

/*
 * Admin command with data in an ordinary CPU buffer of up to 16 KiB, bounced through the
 * controller's DMA scratch buffer (dir: UPCIE_NVME_XFER_*). Otherwise as upcie_nvme_ctrl_admin().
 */
static inline int upcie_nvme_ctrl_admin_buf(struct upcie_nvme_ctrl *c,
					    const struct upcie_nvme_sqe *sqe, void *buf, size_t len,
					    int dir, uint64_t timeout_ns,
					    struct upcie_nvme_cqe *cqe)
{
	struct upcie_nvme_dseg seg;
	int err;

	if (c && sqe && upcie_nvme_admin_aer_check_(c, sqe->opc, true))
		return -EINVAL;
	if (!c || !c->lock_live || !sqe || (len && !buf) || len > UPCIE_NVME_CTRL_SCRATCH)
		return UPCIE_FAIL(-EINVAL, "nvme: admin: bad buffer (%zu bytes, at most %zu)", len,
				  (size_t)UPCIE_NVME_CTRL_SCRATCH);
	if (len > c->admin_dptr.max_bytes)
		return UPCIE_FAIL(-EINVAL,
				  "nvme %s: admin command 0x%02x: %zu bytes above the %" PRIu64
				  "-byte transfer limit (MDTS)",
				  c->name, sqe->opc, len, c->admin_dptr.max_bytes);
	seg.mem = c->heap.mem;
	seg.off = c->scratch.off;
	seg.len = len;
	pthread_mutex_lock(&c->lock);
	if (len && dir == UPCIE_NVME_XFER_TO_DEV)
		memcpy(c->scratch.vaddr, buf, len);
	else if (len)
		memset(c->scratch.vaddr, 0, len);
	err = upcie_nvme_ctrl_admin_locked_(c, sqe, len && dir ? &seg : NULL, len && dir ? 1 : 0,
					    timeout_ns, cqe);
	if (!err && len && dir == UPCIE_NVME_XFER_FROM_DEV)
		memcpy(buf, c->scratch.vaddr, len);
	pthread_mutex_unlock(&c->lock);
	upcie_nvme_admin_after_(c, sqe->opc, err);
	return err;
}

/* Identify with CNS `cns` for `nsid` into buf (4096 bytes). */
static inline int upcie_nvme_ctrl_identify(struct upcie_nvme_ctrl *c, uint8_t cns, uint32_t nsid,
					   void *buf)
{
	struct upcie_nvme_sqe sqe;

	upcie_nvme_cmd_identify(&sqe, cns, nsid, 0, 0);
	return upcie_nvme_ctrl_admin_buf(c, &sqe, buf, 4096, UPCIE_NVME_XFER_FROM_DEV, 0, NULL);
}

/* As upcie_nvme_ctrl_identify() for an I/O command set specific CNS with command set `csi`. */
static inline int upcie_nvme_ctrl_identify_csi(struct upcie_nvme_ctrl *c, uint8_t cns,
					       uint32_t nsid, uint8_t csi, void *buf)
{
	struct upcie_nvme_sqe sqe;

	upcie_nvme_cmd_identify(&sqe, cns, nsid, 0, csi);
	return upcie_nvme_ctrl_admin_buf(c, &sqe, buf, 4096, UPCIE_NVME_XFER_FROM_DEV, 0, NULL);
}

/* Namespaces the sequential scan (no Active Namespace List) visits at most. */
#define UPCIE_NVME_NS_SCAN_MAX 1024u

/*
 * Take the NSIDs of one Active Namespace List page (1024 entries, 0 ends it) that follow
 * *after: into nsids[*n] while *n < max, counting all in *n, *after following. The device
 * wrote the page: an entry that does not ascend, or the broadcast ID, ends the list there
 * (logged, counted in *nbad), so a device can neither loop the walk nor smuggle NSID
 * 0xffffffff in. Returns 1 when a full page ended and more may follow, else 0.
 */
static inline int upcie_nvme_ns_list_take_(const struct upcie_nvme_ns_list *l, uint32_t *after,
					   uint32_t *nsids, uint32_t max, uint32_t *n,
					   uint32_t *nbad)
{
	uint32_t i;

	for (i = 0; i < 1024 && l->nsid[i]; i++) {
		uint32_t id = l->nsid[i];

		if (id <= *after || id == UPCIE_NVME_NSID_ALL) {
			if (nbad)
				(*nbad)++;
			UPCIE_WARN("nvme: Active Namespace List entry %u is NSID 0x%x after 0x%x: "
				   "not ascending; the list ends there",
				   i, id, *after);
			return 0;
		}
		if (*n < max)
			nsids[*n] = id;
		(*n)++;
		*after = id;
	}
	return i == 1024 && *after < 0xfffffffeu;
}

/*
 * Active namespace IDs of `c`, ascending, into nsids[0..max): *count gets how many there are
 * (may exceed max). Reads the Active Namespace List (CNS 02h) page by page; a controller that
 * does not support it (NVMe 1.0) is scanned instead, Identify Namespace for NSIDs 1..NN, at
 * most UPCIE_NVME_NS_SCAN_MAX of them. Returns 0 or the Identify error.
 */
static inline int upcie_nvme_ctrl_ns_list(struct upcie_nvme_ctrl *c, uint32_t *nsids, uint32_t max,
					  uint32_t *count)
{
	struct upcie_nvme_ns_list *l;
	uint32_t after = 0, n = 0, nbad = 0, scan;
	int err = 0;

	if (!c || !count || (max && !nsids))
		return UPCIE_FAIL(-EINVAL, "nvme: ns list: bad arguments");
	*count = 0;
	l = (struct upcie_nvme_ns_list *)malloc(sizeof(*l));
	if (!l)
		return UPCIE_FAIL(-ENOMEM, "nvme: out of memory");
	for (;;) {
		struct upcie_nvme_sqe sqe;

		err = upcie_nvme_cmd_identify_ns_list(&sqe, after);
		if (!err)
			err = upcie_nvme_ctrl_admin_buf(c, &sqe, l, sizeof(*l),
							UPCIE_NVME_XFER_FROM_DEV, 0, NULL);
		if (err || !upcie_nvme_ns_list_take_(l, &after, nsids, max, &n, &nbad))
			break;
	}
	if (err == -EIO && !n) {
		/* no Active Namespace List: ask each NSID, as far as NN and the scan limit */
		scan = c->nn < UPCIE_NVME_NS_SCAN_MAX ? c->nn : UPCIE_NVME_NS_SCAN_MAX;
		if (c->nn > scan)
			UPCIE_WARN(
			    "nvme %s: no Active Namespace List; scanning NSIDs 1..%u of the %u "
			    "that NN allows",
			    c->name, scan, c->nn);
		err = 0;
		for (uint32_t id = 1; id <= scan && !err; id++) {
			struct upcie_nvme_id_ns *ins = (struct upcie_nvme_id_ns *)l;

			err = upcie_nvme_ctrl_identify(c, UPCIE_NVME_CNS_NS, id, ins);
			if (err == -EIO) {
				err = 0; /* Invalid Namespace: a gap */
				continue;
			}
			if (!err && ins->nsze) {
				if (n < max)
					nsids[n] = id;
				n++;
			}
		}
	}
	if (nbad) {
		pthread_mutex_lock(&c->lock);
		c->nbad_id += nbad;
		pthread_mutex_unlock(&c->lock);
	}
	free(l);
	*count = n;
	return err;
}

/*
 * Abort command `cid` on submission queue `sqid` (admin Abort). *aborted (may be NULL) is true
 * when the controller says it aborted the command (it then completes with Command Abort
 * Requested); false when it did not, in which case the command may still complete later.
 */
static inline int upcie_nvme_ctrl_abort(struct upcie_nvme_ctrl *c, uint16_t sqid, uint16_t cid,
					bool *aborted)
{
	int err;

	if (!c || !c->lock_live)
		return UPCIE_FAIL(-EINVAL, "nvme: abort: controller not open");
	pthread_mutex_lock(&c->lock);
	err = upcie_nvme_ctrl_abort_locked_(c, sqid, cid, aborted);
	pthread_mutex_unlock(&c->lock);
	return err;
}

/* The namespace records and their revalidation, which upcie_nvme_ctrl_admin() calls (the header
 * builds on this one). */
#include <upcie/nvme/ctrl_ns.h>

#endif /* UPCIE_NVME_CTRL_ADMIN_H */
