/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Namespaces and I/O: Identify Namespace and the active namespace list, and the NVM commands
 * (Read, Write, Compare, Flush, Write Zeroes, Dataset Management) and the zoned Zone Append on
 * an I/O queue pair of nvme/ctrl.h, asynchronous with a completion callback or synchronous on
 * top of the same path.
 *
 * Data is given as (dmamem, offset, length) or as a list of such segments (struct
 * upcie_nvme_dseg), so host hugepages, IOMMU-mapped memory, the CMB or a peer device's BAR all
 * work alike. PRPs by default; SGLs on a queue created with `sgl` (when the controller supports
 * them). Each command takes its PRP list / SGL segment pages from its queue's per-CID pages, so
 * transfers need no allocation. A request larger than the queue's max_xfer (MDTS or less) is
 * split with the split helper (nvme/dptr.h) into several commands that complete as one request.
 * Namespaces with metadata in a separate buffer (ms > 0, not extended LBAs) need a contiguous
 * metadata buffer of nlb * ms bytes for Read, Write and Compare (MPTR); with extended LBAs the
 * metadata travels inside the data buffer (block_bytes = lba_bytes + ms). A namespace whose
 * metadata is exactly its protection information (8 bytes) is driven with PRACT and the guard
 * and reference checks: no metadata anywhere, the controller makes and checks the PI. PI inside
 * larger metadata travels in the caller's metadata buffer, untouched. The PI fields a command
 * carries (PRACT, PRCHK, the reference tag in CDW14, the application tag and its mask in CDW15:
 * io.apptag, io.apptag_mask) are those of the 16-bit guard format:
 * where the extended LBA format (CNS 05h) gives a 32/64-bit guard or a storage tag, I/O asking
 * for them is refused (-EOPNOTSUPP); without them it goes. Identify Namespace is
 * device-written data: it is checked before use (upcie_nvme_ns_parse()). The namespace's I/O
 * command set is identified: NVM, or Zoned Namespace, whose zone size is kept and to which
 * plain Writes are refused unless the request says it keeps the zone semantics (io.zoned); other
 * command sets are refused. Zone Append (io.opc UPCIE_NVME_ZNS_APPEND) names a zone, not an
 * LBA: the controller writes at the zone's write pointer and the completion says where
 * (upcie_nvme_req_append_lba()); it is one command, never split, within the Zone Append Size
 * Limit (upcie_nvme_ns_zone_append_max(), nvme/ctrl_ns.h).
 *
 * Requests (struct upcie_nvme_req, caller-allocated) complete once, through their callback,
 * when every command of theirs did: err 0, -EIO (the first error status in req->cqe:
 * upcie_nvme_cqe_code(), upcie_nvme_status_str()) or -ECANCELED. Asynchronous submission
 * returns -EBUSY, with nothing submitted, when the queue has no room for every command of the
 * request now; the synchronous helpers instead feed commands as room frees, so a request of any
 * size works on a queue of any depth. Same threading as the queue: one owner thread.
 */
#ifndef UPCIE_NVME_NS_H
#define UPCIE_NVME_NS_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/bits.h>
#include <upcie/base/clock.h>
#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>
#include <upcie/nvme/cmd.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ctrl_ns.h>
#include <upcie/nvme/dptr.h>
#include <upcie/nvme/prp.h>
#include <upcie/nvme/qpair.h>
#include <upcie/nvme/sgl.h>
#include <upcie/nvme/spec.h>

/* Default timeout of the synchronous helpers. */
#define UPCIE_NVME_IO_TIMEOUT (30 * UPCIE_NSEC_PER_SEC)

struct upcie_nvme_req;
typedef void (*upcie_nvme_req_fn)(struct upcie_nvme_req *req);

/* One request: one or more commands that complete together. */
struct upcie_nvme_req {
	upcie_nvme_req_fn cb;	   /* called once when the request is done; may be NULL */
	void *ctx;		   /* for the callback */
	int err;		   /* 0, -EIO (status in cqe), -ECANCELED */
	struct upcie_nvme_cqe cqe; /* the first failing completion, else the last one */
	uint32_t pending;	   /* commands not completed (plus one while submitting) */
	bool done;
	/* set at submission, for retries */
	uint32_t gen_;
	struct upcie_nvme_ioq *q_;
	const struct upcie_nvme_ns_rec_ *rec_; /* the namespace's record, NULL: none */
};

/*
 * One Read, Write, Compare or Zone Append request (data as segments; Read, Write and Compare
 * are split when larger than max_xfer). Zero it, then set what it needs: every field left zero
 * keeps the command as upcie always built it (CDW15 0).
 */
struct upcie_nvme_io {
	uint8_t opc; /* UPCIE_NVME_NVM_READ, _WRITE, _COMPARE, or UPCIE_NVME_ZNS_APPEND (zoned
			namespaces; slba is then the zone's first LBA, and the request one command:
			at most max_xfer, and at most the Zone Append Size Limit, which the
			controller enforces: upcie_nvme_ns_zone_append_max()) */
	uint64_t slba;
	const struct upcie_nvme_dseg *segs; /* a whole number of blocks in total */
	unsigned nsegs;
	const struct upcie_dmamem *md; /* separate metadata: nlb * ms contiguous bytes, or NULL */
	uint64_t md_off;
	uint32_t flags; /* UPCIE_NVME_RW_FUA, UPCIE_NVME_RW_LR, UPCIE_NVME_RW_PR* */
	bool zoned;	/* a Write to a zoned namespace, at the zone's write pointer: the caller
			   keeps the zone semantics (plain Writes to zoned namespaces are refused) */
	/* protection information (CDW15): the application tag a PRACT Write or Zone Append
	   inserts, and that a Read or Compare with UPCIE_NVME_RW_PRCHK_APP expects in the bits
	   of apptag_mask (0xffff: all; 0: none). Carried as given on any namespace; only a
	   namespace with PI reads them. */
	uint16_t apptag;
	uint16_t apptag_mask;
};

/*
 * Identify namespace `nsid` of `c` into `ns`: sizes and LBA format (upcie_nvme_ns_parse()),
 * then its I/O command set (zoned namespaces: the zone size); the controller records what it
 * saw, so that a later change of the namespace makes this handle refuse I/O (-ESTALE, -ENODEV:
 * nvme/ctrl_ns.h). Returns 0; -ENODEV when the namespace is not active (size 0); -EINVAL when
 * its Identify data is unusable (logged, counted in c->nbad_id); -EOPNOTSUPP for an I/O command
 * set upcie does not drive; -EIO with the status logged (for example Invalid Namespace);
 * -ENOMEM. `ns` is zeroed on failure.
 */
static inline int upcie_nvme_ns_open(struct upcie_nvme_ns *ns, struct upcie_nvme_ctrl *c,
				     uint32_t nsid)
{
	struct upcie_nvme_ns_rec_ *r;
	int err;

	if (!ns)
		return UPCIE_FAIL(-EINVAL, "nvme: ns open: NULL namespace");
	memset(ns, 0, sizeof(*ns));
	if (!c || !c->lock_live || !nsid || nsid == UPCIE_NVME_NSID_ALL)
		return UPCIE_FAIL(-EINVAL, "nvme: ns open: no controller or NSID %u", nsid);
	err = upcie_nvme_ns_read_(ns, c, nsid);
	if (err)
		return err;
	pthread_mutex_lock(&c->lock);
	r = upcie_nvme_ns_rec_get_locked_(c, nsid);
	if (r) {
		/* what was just read is the newest word on the namespace */
		upcie_nvme_ns_rec_take_locked_(r, ns);
		ns->rec = r;
		ns->gen = r->gen;
	}
	pthread_mutex_unlock(&c->lock);
	if (!r) {
		memset(ns, 0, sizeof(*ns));
		return UPCIE_FAIL(-ENOMEM, "nvme: out of memory");
	}
	return 0;
}

/* Nothing to release; zeroes `ns`. */
static inline void upcie_nvme_ns_close(struct upcie_nvme_ns *ns)
{
	if (ns)
		memset(ns, 0, sizeof(*ns));
}

/* Start a request on `q` for `ns` (NULL: a command of no namespace): no commands yet, one
 * "submitting" reference. */
static inline void upcie_nvme_req_begin_(struct upcie_nvme_req *r, struct upcie_nvme_ioq *q,
					 const struct upcie_nvme_ns *ns)
{
	r->err = 0;
	r->done = false;
	r->pending = 1;
	memset(&r->cqe, 0, sizeof(r->cqe));
	r->q_ = q;
	r->rec_ = ns ? ns->rec : NULL;
	r->gen_ = ns ? ns->gen : 0;
}

static inline void upcie_nvme_req_put_(struct upcie_nvme_req *r)
{
	if (--r->pending)
		return;
	r->done = true;
	if (r->cb)
		r->cb(r);
}

/* One command of request `r` ended: its status counts, and the request's reference goes. */
static inline void upcie_nvme_req_end_cmd_(struct upcie_nvme_req *r,
					   const struct upcie_nvme_cqe *cqe, int err)
{
	if (!r->err) {
		if (err)
			r->err = err;
		else if (UPCIE_UNLIKELY(!upcie_nvme_cqe_ok(cqe)))
			r->err = -EIO;
		r->cqe = *cqe;
	}
	upcie_nvme_req_put_(r);
}

/*
 * Retries. A command of a request that the controller completes with an error status and DNR
 * clear is sent again, as it was built (the queue keeps each CID slot's command: q->shadow), on
 * the same CID slot (so its PRP list / SGL pages are still its own), after the delay the
 * controller asked for (CQE CRD: Identify CRDT1..3, in 100 ms units, once ACRE is set), at most
 * c->io_retries times (opts.io_retries; 5 by default). Namespace Not Ready is waited out
 * instead, from the first failure for up to CAP.TO, at growing intervals of up to 100 ms.
 * Never retried: DNR set, a command ended on purpose (Command Abort Requested, aborted by SQ
 * deletion, Host Aborted), a request that already failed, and a namespace that changed since
 * the request was submitted (never with the old geometry: the request ends with the status
 * the controller gave, -EIO). The
 * waiting retries are sent by whoever polls the queue (upcie_nvme_ioq_poll(), the waits and
 * the synchronous helpers), not by a bare upcie_nvme_qpair_reap(). While a retry waits its CID
 * is held: the command is outstanding, and cancel, abort, reset and delete end it as any other
 * (-ECANCELED, once).
 */
static inline void upcie_nvme_retry_cpl_(void *ctx, const struct upcie_nvme_cqe *cqe, int err);

/* When to send retry n + 1 of a command that completed with `cqe` (*due); false: not at all. */
static inline bool upcie_nvme_retry_plan_(const struct upcie_nvme_ctrl *c,
					  const struct upcie_nvme_cqe *cqe, unsigned n,
					  uint64_t first_ns, uint64_t now, uint64_t *due)
{
	struct upcie_nvme_status st = upcie_nvme_status_decode(cqe->dw3);
	uint16_t code = upcie_nvme_cqe_code(cqe);
	uint64_t delay = 0, step;

	if (st.dnr || c->io_retries == UPCIE_NVME_CTRL_RETRIES_OFF ||
	    code == UPCIE_NVME_SC_ABORT_REQ || code == UPCIE_NVME_SC_ABORT_SQ_DELETED ||
	    code == UPCIE_NVME_SC_HOST_ABORTED)
		return false;
	if (st.crd && c->acre)
		delay = (uint64_t)c->id.crdt[st.crd - 1] * 100 * UPCIE_NSEC_PER_MSEC;
	if (code == UPCIE_NVME_SC_NS_NOT_READY) {
		if (now - first_ns >= c->ready_timeout_ns)
			return false;
		step = (UINT64_C(1) << (n < 7 ? n : 7)) * UPCIE_NSEC_PER_MSEC;
		if (step > 100 * UPCIE_NSEC_PER_MSEC)
			step = 100 * UPCIE_NSEC_PER_MSEC;
		if (delay < step)
			delay = step;
	} else if (n >= c->io_retries) {
		return false;
	}
	*due = now + delay;
	return true;
}

/* Whether the namespace of request `r` changed since it was submitted. */
static inline bool upcie_nvme_req_stale_(const struct upcie_nvme_req *r)
{
	return r->rec_ && __atomic_load_n(&r->rec_->gen, __ATOMIC_ACQUIRE) != r->gen_;
}

/* Send held retry `cid` (CID slot `idx`) of request `r` now; when the namespace changed
 * meanwhile, end it instead with the failure that asked for the retry. */
static inline void upcie_nvme_retry_send_(struct upcie_nvme_ioq *q, uint32_t idx, uint16_t cid,
					  struct upcie_nvme_req *r)
{
	if (upcie_nvme_req_stale_(r)) {
		if (upcie_nvme_qpair_drop_held_(&q->qp, cid))
			return;
		UPCIE_WARN("nvme %s: queue %u: a retry not sent: namespace %u changed since the "
			   "request was submitted",
			   q->ctrl->name, q->qid, q->shadow[idx].nsid);
		upcie_nvme_req_end_cmd_(r, &q->retry[idx].cqe, 0);
		return;
	}
	if (upcie_nvme_qpair_send_held_(&q->qp, cid, &q->shadow[idx]))
		return;
	__atomic_fetch_add(&q->ctrl->nretried, 1, __ATOMIC_RELAXED);
	upcie_nvme_qpair_ring(&q->qp);
}

/* Hold CID slot `idx` (just freed by the completion `cqe` of request `r`) for retry n + 1;
 * sent at once when due. Returns whether the command goes on (else it ends now). Only on a
 * live queue: a callback delivered after the queue's deletion began does not retry. */
static inline bool upcie_nvme_retry_hold_(struct upcie_nvme_ioq *q, uint32_t idx,
					  struct upcie_nvme_req *r,
					  const struct upcie_nvme_cqe *cqe, unsigned n,
					  uint64_t first_ns, uint64_t now)
{
	struct upcie_nvme_retry_ *rt;
	uint64_t due;
	uint16_t cid;

	/*
	 * Only a completion reap is handing over from the queue's own CQ: then the CID it just
	 * freed is on top and nothing ran since, so slot `idx` and its shadow are still this
	 * command's. A completion delivered later (a reset's, a deletion's deferred callbacks, after
	 * other callbacks may have built into that slot) is not retried.
	 */
	if (!q->qp.cq || (uintptr_t)cqe < (uintptr_t)q->qp.cq ||
	    (uintptr_t)cqe > (uintptr_t)&q->qp.cq[q->qp.cq_last])
		return false;
	if (!q->live || !q->retry || upcie_nvme_req_stale_(r) ||
	    !upcie_nvme_retry_plan_(q->ctrl, cqe, n, first_ns, now, &due) ||
	    upcie_nvme_qpair_hold_(&q->qp, idx, upcie_nvme_retry_cpl_, r, &cid))
		return false;
	rt = &q->retry[idx];
	rt->n = (uint16_t)(n + 1);
	rt->first_ns = first_ns;
	rt->due_ns = due;
	rt->cqe = *cqe;
	q->nparked++;
	if (n == 0 || upcie_nvme_cqe_code(cqe) != UPCIE_NVME_SC_NS_NOT_READY)
		UPCIE_DBG("nvme %s: queue %u: command 0x%02x: %s (status 0x%03x): retry %u in "
			  "%" PRIu64 " ms",
			  q->ctrl->name, q->qid, q->shadow[idx].opc,
			  upcie_nvme_status_str(upcie_nvme_cqe_code(cqe)), upcie_nvme_cqe_code(cqe),
			  n + 1, (due - now) / UPCIE_NSEC_PER_MSEC);
	if (due <= now)
		upcie_nvme_retry_send_(q, idx, cid, r);
	return true;
}

/* The queue-pair callback of a held or re-sent command (context: its request). Touches the
 * queue only for a completion the controller gave, on a live queue. */
static inline void upcie_nvme_retry_cpl_(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct upcie_nvme_req *r = (struct upcie_nvme_req *)ctx;
	struct upcie_nvme_ioq *q = r->q_;
	uint32_t idx;

	if (!err && !upcie_nvme_cqe_ok(cqe) && !r->err && q->live && q->retry) {
		idx = upcie_nvme_qpair_cid_index(&q->qp, (uint16_t)cqe->dw3);
		if (upcie_nvme_retry_hold_(q, idx, r, cqe, q->retry[idx].n, q->retry[idx].first_ns,
					   upcie_time_ns()))
			return;
	}
	upcie_nvme_req_end_cmd_(r, cqe, err);
}

/* A request's command failed: retried (true) or not. Off the hot path. */
__attribute__((noinline, cold, unused)) static bool
upcie_nvme_req_retry_(struct upcie_nvme_req *r, const struct upcie_nvme_cqe *cqe)
{
	struct upcie_nvme_ioq *q = r->q_;
	uint64_t now;

	if (r->err || !q)
		return false;
	now = upcie_time_ns();
	return upcie_nvme_retry_hold_(q, upcie_nvme_qpair_cid_index(&q->qp, (uint16_t)cqe->dw3), r,
				      cqe, 0, now, now);
}

/* Send the retries that are due (q->nparked > 0: some may wait); q->nparked is then what still
 * waits, plus what callbacks held meanwhile. */
__attribute__((noinline, cold, unused)) static void
upcie_nvme_ioq_retry_run_(struct upcie_nvme_ioq *q)
{
	uint32_t n = upcie_nvme_qpair_nslots_(q->qp.ncids), left = 0;
	uint64_t now = upcie_time_ns();

	q->nparked = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct upcie_nvme_cid_slot *s = &q->qp.slots[i];
		uint32_t tag = s->tag;

		if (!upcie_nvme_qpair_tag_held_(tag) || s->cb != upcie_nvme_retry_cpl_)
			continue;
		if (q->retry[i].due_ns <= now)
			upcie_nvme_retry_send_(q, i, (uint16_t)tag,
					       (struct upcie_nvme_req *)s->ctx);
		else
			left++;
	}
	q->nparked += left;
}

/* Queue-pair callback of every command of a request. */
static inline void upcie_nvme_req_cpl_(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct upcie_nvme_req *r = (struct upcie_nvme_req *)ctx;

	if (UPCIE_UNLIKELY(!err && !upcie_nvme_cqe_ok(cqe)) && upcie_nvme_req_retry_(r, cqe))
		return;
	upcie_nvme_req_end_cmd_(r, cqe, err);
}

/*
 * Enqueue one prepared command with data `segs` (may be NULL for none) for request `r`, `sqe`
 * being the shadow of the CID the queue hands out next (upcie_nvme_ioq_next_sqe_()); fills the
 * data pointer from that CID's list pages. Does not ring. The queue must have room.
 */
static inline int upcie_nvme_ioq_enqueue_(struct upcie_nvme_ioq *q, struct upcie_nvme_sqe *sqe,
					  uint16_t cid, const struct upcie_nvme_dseg *segs,
					  unsigned nsegs, struct upcie_nvme_req *r)
{
	struct upcie_nvme_lists lists;
	int err;

	if (nsegs) {
		lists = upcie_nvme_ioq_lists(q, cid);
		if (q->sgl)
			err = upcie_nvme_sgl_build(sqe, segs, nsegs, &q->dptr, &lists);
		else if (nsegs == 1)
			err = upcie_nvme_prp_build_buf(sqe, segs[0].mem, segs[0].off, segs[0].len,
						       &q->dptr, &lists);
		else
			err = upcie_nvme_prp_build(sqe, segs, nsegs, &q->dptr, &lists);
		if (UPCIE_UNLIKELY(err < 0))
			return err;
	}
	err = upcie_nvme_qpair_enqueue(&q->qp, sqe, upcie_nvme_req_cpl_, r, NULL);
	if (UPCIE_UNLIKELY(err))
		return err;
	r->pending++;
	return 0;
}

/* Where to build the next command of `q`: the shadow of the CID enqueue hands out next (*cid).
 * NULL when no CID is free. */
static inline struct upcie_nvme_sqe *upcie_nvme_ioq_next_sqe_(struct upcie_nvme_ioq *q,
							      uint16_t *cid)
{
	if (UPCIE_UNLIKELY(upcie_nvme_qpair_next_cid(&q->qp, cid)))
		return NULL;
	return &q->shadow[upcie_nvme_qpair_cid_index(&q->qp, *cid)];
}

/* upcie_nvme_ioq_submit_cmd() for a command of namespace `ns` (NULL: none): a retry of it is
 * not sent once the namespace changed. */
static inline int upcie_nvme_ioq_submit_cmd_ns_(struct upcie_nvme_ioq *q,
						const struct upcie_nvme_ns *ns,
						const struct upcie_nvme_sqe *sqe,
						const struct upcie_nvme_dseg *segs, unsigned nsegs,
						struct upcie_nvme_req *r)
{
	struct upcie_nvme_sqe *cmd;
	uint16_t cid;
	int err;

	if (!q || !q->live || !sqe || !r)
		return UPCIE_FAIL(-EINVAL, "nvme: submit: queue not live or NULL argument");
	cmd = upcie_nvme_ioq_next_sqe_(q, &cid);
	if (!cmd)
		return -EBUSY;
	*cmd = *sqe;
	upcie_nvme_req_begin_(r, q, ns);
	err = upcie_nvme_ioq_enqueue_(q, cmd, cid, segs, segs ? nsegs : 0, r);
	if (err) {
		r->pending = 0;
		return err;
	}
	upcie_nvme_qpair_ring(&q->qp);
	upcie_nvme_req_put_(r);
	return 0;
}

/*
 * Submit any command `sqe` (opcode, NSID and command dwords filled; the data pointer is built
 * here from `segs`, which may be NULL) as a one-command request. For commands this header has
 * no helper for. Returns 0 (the callback comes), -EBUSY (queue full: reap and retry), -EINVAL.
 */
static inline int upcie_nvme_ioq_submit_cmd(struct upcie_nvme_ioq *q,
					    const struct upcie_nvme_sqe *sqe,
					    const struct upcie_nvme_dseg *segs, unsigned nsegs,
					    struct upcie_nvme_req *r)
{
	return upcie_nvme_ioq_submit_cmd_ns_(q, NULL, sqe, segs, nsegs, r);
}

/* Bytes per command for `ns` on `q` (upcie_nvme_split_chunk(): whole blocks, dword multiple). */
static inline uint64_t upcie_nvme_ioq_chunk_(const struct upcie_nvme_ioq *q,
					     const struct upcie_nvme_ns *ns)
{
	return upcie_nvme_split_chunk(q->dptr.max_bytes, ns->block_bytes);
}

/* Checks of a whole request that every piece of it then passes. Sets *total. */
static inline int upcie_nvme_io_check_(const struct upcie_nvme_ioq *q,
				       const struct upcie_nvme_ns *ns,
				       const struct upcie_nvme_io *io, uint64_t *total)
{
	uint64_t sum = 0, nlb, first, pages;
	int err;

	if (!io->segs || !io->nsegs)
		return UPCIE_FAIL(-EINVAL, "nvme: I/O without data segments");
	if (io->opc != UPCIE_NVME_NVM_READ && io->opc != UPCIE_NVME_NVM_WRITE &&
	    io->opc != UPCIE_NVME_NVM_COMPARE && io->opc != UPCIE_NVME_ZNS_APPEND)
		return UPCIE_FAIL(
		    -EINVAL, "nvme: I/O opcode 0x%02x is not Read, Write, Compare or Zone Append",
		    io->opc);
	if (io->opc == UPCIE_NVME_ZNS_APPEND && !ns->zoned)
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "nvme %s: Zone Append on namespace %u, which is not zoned",
				  ns->ctrl->name, ns->nsid);
	if (io->opc == UPCIE_NVME_ZNS_APPEND && io->slba % ns->zone_blocks)
		return UPCIE_FAIL(-EINVAL,
				  "nvme %s: Zone Append at LBA %" PRIu64
				  " of namespace %u: not the first LBA of a zone (%" PRIu64
				  " blocks a zone)",
				  ns->ctrl->name, io->slba, ns->nsid, ns->zone_blocks);
	/* the reference tags of an append are remapped from the zone's start (PIREMAP), which
	   upcie builds for the 16-bit guard format only */
	if (io->opc == UPCIE_NVME_ZNS_APPEND && ns->pi) {
		err = upcie_nvme_ns_pi_fmt_check_(ns, UPCIE_NVME_RW_PRACT);
		if (err)
			return err;
	}
	if (io->opc == UPCIE_NVME_NVM_COMPARE && !(ns->ctrl->id.oncs & UPCIE_NVME_ONCS_COMPARE))
		return UPCIE_FAIL(-EOPNOTSUPP, "nvme %s: Compare not supported (ONCS)",
				  ns->ctrl->name);
	if (io->opc == UPCIE_NVME_NVM_WRITE && ns->zoned && !io->zoned)
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "nvme %s: namespace %u is zoned (%" PRIu64
				  " blocks a zone): a Write must land at its zone's write pointer; "
				  "submit it with io.zoned set if that is what you do",
				  ns->ctrl->name, ns->nsid, ns->zone_blocks);
	/* the PI fields io_piece_() fills: PRINFO as given, plus PRACT without a metadata buffer */
	err = upcie_nvme_ns_pi_fmt_check_(ns, io->flags | (ns->pract && !io->md ? ns->prinfo : 0));
	if (err)
		return err;
	if (!upcie_nvme_ioq_chunk_(q, ns))
		return UPCIE_FAIL(
		    -EINVAL,
		    "nvme %s: namespace %u's %u-byte blocks do not fit queue %u's %" PRIu64
		    "-byte transfer limit (MDTS or max_xfer) in whole dwords",
		    ns->ctrl->name, ns->nsid, ns->block_bytes, q->qid, q->dptr.max_bytes);
	for (unsigned i = 0; i < io->nsegs; i++) {
		if (q->sgl) {
			err = upcie_nvme_dseg_check_(&io->segs[i], i);
			if (!err && q->dptr.sgl_dword &&
			    ((upcie_dmamem_iova_fast(io->segs[i].mem, io->segs[i].off) |
			      io->segs[i].len) &
			     3))
				err = UPCIE_FAIL(
				    -EINVAL, "nvme: SGL segment %u not dword aligned and sized", i);
		} else {
			err = upcie_nvme_prp_seg_check_(&io->segs[i], i, io->nsegs,
							q->dptr.page_shift, &first, &pages);
		}
		if (err)
			return err;
		sum += io->segs[i].len;
	}
	if (sum % ns->block_bytes)
		return UPCIE_FAIL(-EINVAL,
				  "nvme: %" PRIu64 " bytes is not a whole number of %u-byte blocks",
				  sum, ns->block_bytes);
	nlb = sum / ns->block_bytes;
	/* the controller picks where each Zone Append lands: pieces of one would not be one
	   contiguous write */
	if (io->opc == UPCIE_NVME_ZNS_APPEND && sum > upcie_nvme_ioq_chunk_(q, ns))
		return UPCIE_FAIL(-EINVAL,
				  "nvme %s: Zone Append of %" PRIu64
				  " bytes: more than one command holds on queue %u (%" PRIu64
				  " bytes: max_xfer, MDTS, 65536 blocks), and an append is never "
				  "split",
				  ns->ctrl->name, sum, q->qid, upcie_nvme_ioq_chunk_(q, ns));
	if (io->slba >= ns->nsze || nlb > ns->nsze - io->slba)
		UPCIE_DBG("nvme: LBA %" PRIu64 " + %" PRIu64 " beyond namespace %u (%" PRIu64
			  " blocks): the controller will say so",
			  io->slba, nlb, ns->nsid, ns->nsze);
	if (ns->ms && !ns->ext && !(ns->pract && !io->md)) {
		uint64_t mlen = nlb * ns->ms, a;

		if (!io->md)
			return UPCIE_FAIL(
			    -EINVAL,
			    "nvme: namespace %u has %u bytes of metadata per block in a "
			    "separate buffer%s: give one (md)",
			    ns->nsid, ns->ms, ns->pi ? ", protection information included" : "");
		if (io->md_off >= io->md->size || mlen > io->md->size - io->md_off ||
		    upcie_dmamem_contig(io->md, io->md_off) < mlen)
			return UPCIE_FAIL(-EINVAL,
					  "nvme: metadata buffer must hold %" PRIu64
					  " device-contiguous bytes at offset %" PRIu64,
					  mlen, io->md_off);
		a = upcie_dmamem_iova_fast(io->md, io->md_off);
		if (a & 3)
			return UPCIE_FAIL(-EINVAL, "nvme: metadata buffer not dword aligned");
	}
	*total = sum;
	return 0;
}

/* Whole blocks in `bytes` (a shift for the usual power-of-two block sizes). */
static inline uint64_t upcie_nvme_ns_blocks_(const struct upcie_nvme_ns *ns, uint64_t bytes)
{
	return ns->block_shift ? bytes >> ns->block_shift : bytes / ns->block_bytes;
}

/*
 * Build and enqueue the command for [off, off + len) of the request. `pi`: the namespace may
 * want PRINFO (the hot path passes false: it never serves such namespaces).
 */
static inline int upcie_nvme_io_piece_(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns,
				       const struct upcie_nvme_io *io,
				       const struct upcie_nvme_dseg *segs, unsigned nsegs,
				       uint64_t off, uint64_t len, struct upcie_nvme_req *r,
				       bool pi)
{
	uint64_t blk = upcie_nvme_ns_blocks_(ns, off);
	uint32_t flags = io->flags;
	struct upcie_nvme_sqe *sqe;
	uint16_t cid;
	int err;

	sqe = upcie_nvme_ioq_next_sqe_(q, &cid);
	if (UPCIE_UNLIKELY(!sqe))
		return -EBUSY;
	/* without a metadata buffer the controller makes and checks the PI (PRACT) */
	if (pi && ns->pract && !io->md)
		flags |= ns->prinfo;
	/* an append's reference tags are given for the zone's first LBA (ILBRT below) and
	   remapped by the controller to where the data lands (types 1 and 2 only) */
	if (pi && io->opc == UPCIE_NVME_ZNS_APPEND &&
	    (ns->pi == UPCIE_NVME_DPS_PIT_1 || ns->pi == UPCIE_NVME_DPS_PIT_2))
		flags |= UPCIE_NVME_ZA_PIREMAP;
	err = upcie_nvme_cmd_rw_(sqe, io->opc, ns->nsid, io->slba + blk,
				 (uint32_t)upcie_nvme_ns_blocks_(ns, len), flags);
	if (UPCIE_UNLIKELY(err))
		return UPCIE_FAIL(err, "nvme: bad Read/Write fields");
	sqe->cdw15 = upcie_nvme_cdw15_apptag(io->apptag, io->apptag_mask);
	if (pi && (flags & (UPCIE_NVME_RW_PRCHK_REF | UPCIE_NVME_ZA_PIREMAP)))
		sqe->cdw14 = (uint32_t)(io->slba + blk); /* initial reference tag: the LBA */
	if (io->md && ns->ms && !ns->ext)
		sqe->mptr = upcie_dmamem_iova_fast(io->md, io->md_off + blk * ns->ms);
	return upcie_nvme_ioq_enqueue_(q, sqe, cid, segs, nsegs, r);
}

/*
 * An SGL queue's per-command list pages hold a bounded number of descriptors, one per
 * device-contiguous run: check every piece of the request against them before any is submitted
 * (a request of many small segments would otherwise fail part-way, its first pieces sent).
 * `sp` is rewound. Returns 0 or -EINVAL.
 */
static inline int upcie_nvme_io_sgl_fit_(const struct upcie_nvme_ioq *q,
					 struct upcie_nvme_split *sp, struct upcie_nvme_dseg *piece,
					 unsigned max)
{
	struct upcie_nvme_split dry = *sp;
	uint64_t off, len;
	uint32_t need;
	int n;

	while ((n = upcie_nvme_split_next(&dry, piece, max, &off, &len)) > 0) {
		need = upcie_nvme_sgl_lists_needed(piece, (unsigned)n, q->dptr.page_shift);
		if (need > q->lpages)
			return UPCIE_FAIL(
			    -EINVAL,
			    "nvme %s: queue %u: the command for bytes %" PRIu64 "..%" PRIu64
			    " of the request needs %u SGL list pages, the queue has %u per "
			    "command: "
			    "use fewer, larger segments (device-contiguous runs) or a PRP queue",
			    q->ctrl->name, q->qid, off, off + len, need, q->lpages);
	}
	return n < 0 ? n : 0;
}

/*
 * The engine of both submission styles. wait_ns == 0: everything must fit now (-EBUSY
 * otherwise, nothing submitted); else commands are fed as room frees, until wait_ns passes.
 */
static inline int upcie_nvme_io_submit_(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns,
					const struct upcie_nvme_io *io, struct upcie_nvme_req *r,
					uint64_t wait_ns)
{
	struct upcie_nvme_dseg stack[8], *piece = stack;
	struct upcie_nvme_split sp;
	struct upcie_deadline dl;
	uint64_t total = 0, chunk, npieces, off, len;
	int n, err;

	if (!q || !q->live || !ns || !ns->ctrl || !io || !r)
		return UPCIE_FAIL(-EINVAL, "nvme: I/O: queue not live or NULL argument");
	err = upcie_nvme_ns_check_(ns); /* never with a geometry the namespace lost */
	if (UPCIE_UNLIKELY(err))
		return err;
	/* the hot path: one segment, one command, power-of-two blocks, no division */
	if (io->nsegs == 1 && io->segs && ns->block_shift && !wait_ns && !q->sgl && !ns->slow &&
	    (io->opc == UPCIE_NVME_NVM_READ || io->opc == UPCIE_NVME_NVM_WRITE) &&
	    io->segs[0].len && !(io->segs[0].len & (ns->block_bytes - 1)) &&
	    io->segs[0].len <= q->dptr.max_bytes &&
	    (io->segs[0].len >> ns->block_shift) <= UPCIE_NVME_MAX_BLOCKS_PER_CMD) {
		if (UPCIE_UNLIKELY(!upcie_nvme_qpair_room(&q->qp)))
			return -EBUSY;
		upcie_nvme_req_begin_(r, q, ns);
		err = upcie_nvme_io_piece_(q, ns, io, io->segs, 1, 0, io->segs[0].len, r, false);
		if (UPCIE_UNLIKELY(err)) {
			r->pending = 0;
			return err;
		}
		upcie_nvme_qpair_ring(&q->qp);
		upcie_nvme_req_put_(r);
		return 0;
	}
	err = upcie_nvme_io_check_(q, ns, io, &total);
	if (err)
		return err;
	chunk = upcie_nvme_ioq_chunk_(q, ns); /* at least one block: checked above */
	npieces = (total + chunk - 1) / chunk;
	if (!wait_ns && npieces > upcie_nvme_qpair_room(&q->qp)) {
		if (npieces > q->qp.ncids)
			return UPCIE_FAIL(-EINVAL,
					  "nvme: request of %" PRIu64 " bytes needs %" PRIu64
					  " commands, the queue holds %u: use the sync helper, a "
					  "deeper queue or a larger max_xfer",
					  total, npieces, q->qp.ncids);
		return -EBUSY;
	}
	if (io->nsegs > UPCIE_ARRAY_SIZE(stack)) {
		piece = (struct upcie_nvme_dseg *)malloc(io->nsegs * sizeof(*piece));
		if (!piece)
			return UPCIE_FAIL(-ENOMEM, "nvme: out of memory");
	}
	err = upcie_nvme_split_init(&sp, io->segs, io->nsegs, chunk, ns->block_bytes);
	if (!err && q->sgl)
		err = upcie_nvme_io_sgl_fit_(q, &sp, piece, io->nsegs);
	if (err)
		goto out;
	upcie_nvme_req_begin_(r, q, ns);
	upcie_deadline_set(&dl, wait_ns);
	while ((n = upcie_nvme_split_next(&sp, piece, io->nsegs, &off, &len)) > 0) {
		while (!upcie_nvme_qpair_room(&q->qp)) {
			/* sync path only (the async path checked the room): let the controller
			 * see what is queued and make room */
			upcie_nvme_qpair_ring(&q->qp);
			if (upcie_nvme_qpair_reap(&q->qp, 0xffffffffu) > 0)
				continue;
			if (q->nparked)
				upcie_nvme_ioq_retry_run_(q);
			/* a controller that let go (an escalation elsewhere) makes no room: the
			 * request ends now, not at the deadline (the wait that follows cancels what
			 * was submitted and returns the halt's error) */
			if (__atomic_load_n(&q->ctrl->stopped, __ATOMIC_ACQUIRE)) {
				err = upcie_nvme_ctrl_stopped_err_(q->ctrl);
				break;
			}
			if (upcie_deadline_passed(&dl)) {
				err = -ETIMEDOUT;
				break;
			}
			upcie_cpu_relax();
		}
		if (!err)
			err =
			    upcie_nvme_io_piece_(q, ns, io, piece, (unsigned)n, off, len, r, true);
		if (err) {
			/* cannot happen after the checks above; the request ends with it */
			if (!r->err)
				r->err = err;
			break;
		}
	}
	upcie_nvme_qpair_ring(&q->qp);
	if (r->pending == 1 && err) {
		/* nothing was submitted: no callback */
		r->pending = 0;
		goto out;
	}
	err = 0;
	upcie_nvme_req_put_(r);
out:
	if (piece != stack)
		free(piece);
	return err;
}

/*
 * Submit Read/Write/Compare/Zone Append request `io` on `q` for `ns`; `r` completes (callback)
 * when all its commands did (a Zone Append's one command: upcie_nvme_req_append_lba() in the
 * callback says where its data went). Returns 0 (the callback will come, also for errors of a
 * request that was partly submitted), -EBUSY (not enough room now: reap and retry; nothing
 * submitted), -EINVAL (request that breaks the PRP/SGL rules, not whole blocks, missing
 * metadata buffer, more commands than the queue can ever hold, on an SGL queue a command
 * needing more descriptors than its list pages hold, a Zone Append that is not at a zone's
 * first LBA or needs more than one command: all checked before anything is submitted),
 * -EOPNOTSUPP (among others a Zone Append to a namespace that is not zoned).
 */
static inline int upcie_nvme_ioq_submit_io(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns,
					   const struct upcie_nvme_io *io, struct upcie_nvme_req *r)
{
	return upcie_nvme_io_submit_(q, ns, io, r, 0);
}

/*
 * Where the Zone Append of request `r` wrote its data: the first LBA, from the completion's
 * DW0/DW1 (the request is one command), into *lba. For the request's callback or after its
 * wait; the caller knows the request was a Zone Append. The LBA is the controller's word:
 * compare it with what the caller expects (the zone, the write pointer) before trusting it.
 * Returns 0; -EINVAL for a NULL argument or a request that has not ended; the request's own
 * error (-EIO, -ECANCELED, ...) when it failed, which placed nothing.
 */
static inline int upcie_nvme_req_append_lba(const struct upcie_nvme_req *r, uint64_t *lba)
{
	if (!r || !lba || !r->done)
		return UPCIE_FAIL(-EINVAL, "nvme: append LBA: NULL argument or request not ended");
	if (r->err)
		return r->err;
	*lba = upcie_nvme_zone_append_lba(&r->cqe);
	return 0;
}

/* `io` for one contiguous transfer: opcode `opc`, `len` bytes at `off` in `mem`, from `slba`. */
static inline void upcie_nvme_io_one_(struct upcie_nvme_io *io, struct upcie_nvme_dseg *seg,
				      uint8_t opc, uint64_t slba, const struct upcie_dmamem *mem,
				      uint64_t off, uint64_t len)
{
	seg->mem = mem;
	seg->off = off;
	seg->len = len;
	memset(io, 0, sizeof(*io));
	io->opc = opc;
	io->slba = slba;
	io->segs = seg;
	io->nsegs = 1;
}

/* Read `len` bytes (whole blocks) at `slba` into [off, off + len) of `mem`. */
static inline int upcie_nvme_ioq_read(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns,
				      uint64_t slba, const struct upcie_dmamem *mem, uint64_t off,
				      uint64_t len, struct upcie_nvme_req *r)
{
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_io io;

	upcie_nvme_io_one_(&io, &seg, UPCIE_NVME_NVM_READ, slba, mem, off, len);
	return upcie_nvme_io_submit_(q, ns, &io, r, 0);
}

/* Write `len` bytes (whole blocks) at `slba` from [off, off + len) of `mem`. */
static inline int upcie_nvme_ioq_write(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns,
				       uint64_t slba, const struct upcie_dmamem *mem, uint64_t off,
				       uint64_t len, struct upcie_nvme_req *r)
{
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_io io;

	upcie_nvme_io_one_(&io, &seg, UPCIE_NVME_NVM_WRITE, slba, mem, off, len);
	return upcie_nvme_io_submit_(q, ns, &io, r, 0);
}

/* Flush the namespace's volatile write cache. */
static inline int upcie_nvme_ioq_flush(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns,
				       struct upcie_nvme_req *r)
{
	struct upcie_nvme_sqe sqe;

	int err;

	if (!ns)
		return UPCIE_FAIL(-EINVAL, "nvme: flush: NULL namespace");
	err = upcie_nvme_ns_check_(ns);
	if (err)
		return err;
	upcie_nvme_cmd_flush(&sqe, ns->nsid);
	return upcie_nvme_ioq_submit_cmd_ns_(q, ns, &sqe, NULL, 0, r);
}

/* Write Zeroes of `nlb` blocks (1..65536) at `slba`; flags may add UPCIE_NVME_WZ_DEAC. */
static inline int upcie_nvme_ioq_write_zeroes(struct upcie_nvme_ioq *q,
					      const struct upcie_nvme_ns *ns, uint64_t slba,
					      uint32_t nlb, uint32_t flags,
					      struct upcie_nvme_req *r)
{
	struct upcie_nvme_sqe sqe;
	int err;

	if (!ns || !ns->ctrl)
		return UPCIE_FAIL(-EINVAL, "nvme: write zeroes: NULL namespace");
	err = upcie_nvme_ns_check_(ns);
	if (err)
		return err;
	if (!(ns->ctrl->id.oncs & UPCIE_NVME_ONCS_WRITE_ZEROES))
		return UPCIE_FAIL(-EOPNOTSUPP, "nvme %s: Write Zeroes not supported (ONCS)",
				  ns->ctrl->name);
	if (ns->zoned)
		return UPCIE_FAIL(
		    -EOPNOTSUPP,
		    "nvme %s: namespace %u is zoned: Write Zeroes must land at a "
		    "zone's write pointer (build it and use upcie_nvme_ioq_submit_cmd)",
		    ns->ctrl->name, ns->nsid);
	/* with PI, the controller writes valid protection information for the zeroes */
	if (ns->pi)
		flags |= UPCIE_NVME_RW_PRACT;
	err = upcie_nvme_ns_pi_fmt_check_(ns, flags);
	if (err)
		return err;
	if (ns->ctrl->wz_max_bytes && (uint64_t)nlb * ns->lba_bytes > ns->ctrl->wz_max_bytes)
		return UPCIE_FAIL(
		    -EINVAL,
		    "nvme %s: write zeroes of %u blocks (%" PRIu64
		    " bytes) above the controller's limit of %" PRIu64 " bytes (WZSL)",
		    ns->ctrl->name, nlb, (uint64_t)nlb * ns->lba_bytes, ns->ctrl->wz_max_bytes);
	err = upcie_nvme_cmd_write_zeroes(&sqe, ns->nsid, slba, nlb, flags);
	if (err)
		return UPCIE_FAIL(err, "nvme: write zeroes: %u blocks (1..65536)", nlb);
	if (ns->pi && ns->pi != UPCIE_NVME_DPS_PIT_3)
		sqe.cdw14 = (uint32_t)slba;
	return upcie_nvme_ioq_submit_cmd_ns_(q, ns, &sqe, NULL, 0, r);
}

/*
 * Dataset Management over `nr` ranges (struct upcie_nvme_dsm_range, filled by the caller) at
 * [off, off + nr * 16) of `mem`, attributes `attrs` (UPCIE_NVME_DSM_AD: deallocate).
 */
static inline int upcie_nvme_ioq_dsm(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns,
				     const struct upcie_dmamem *mem, uint64_t off, uint32_t nr,
				     uint32_t attrs, struct upcie_nvme_req *r)
{
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_sqe sqe;
	int err;

	if (!ns || !ns->ctrl)
		return UPCIE_FAIL(-EINVAL, "nvme: dsm: NULL namespace");
	err = upcie_nvme_ns_check_(ns);
	if (err)
		return err;
	if (!(ns->ctrl->id.oncs & UPCIE_NVME_ONCS_DSM))
		return UPCIE_FAIL(-EOPNOTSUPP, "nvme %s: Dataset Management not supported (ONCS)",
				  ns->ctrl->name);
	if (ns->ctrl->dmrl && nr > ns->ctrl->dmrl)
		return UPCIE_FAIL(
		    -EINVAL, "nvme %s: dsm: %u ranges above the controller's limit of %u (DMRL)",
		    ns->ctrl->name, nr, ns->ctrl->dmrl);
	if (ns->ctrl->dmrsl && mem && mem->vaddr && off + (uint64_t)nr * 16 <= mem->size)
		for (uint32_t i = 0; i < nr; i++) {
			const struct upcie_nvme_dsm_range *rg =
			    (const struct upcie_nvme_dsm_range *)((const uint8_t *)mem->vaddr +
								  off) +
			    i;

			if (rg->nlb > ns->ctrl->dmrsl)
				return UPCIE_FAIL(-EINVAL,
						  "nvme %s: dsm: range %u of %u blocks above the "
						  "controller's limit of %u (DMRSL)",
						  ns->ctrl->name, i, rg->nlb, ns->ctrl->dmrsl);
		}
	err = upcie_nvme_cmd_dsm(&sqe, ns->nsid, nr, attrs);
	if (err)
		return UPCIE_FAIL(err, "nvme: dsm: %u ranges (1..256)", nr);
	seg.mem = mem;
	seg.off = off;
	seg.len = (uint64_t)nr * sizeof(struct upcie_nvme_dsm_range);
	return upcie_nvme_ioq_submit_cmd_ns_(q, ns, &sqe, &seg, 1, r);
}

/* Process up to `max` completions of `q`, and send the retries that are due; returns how many
 * commands completed, or -EPROTO. */
static inline int upcie_nvme_ioq_poll(struct upcie_nvme_ioq *q, unsigned max)
{
	int n = upcie_nvme_qpair_reap(&q->qp, max);

	if (UPCIE_UNLIKELY(q->nparked))
		upcie_nvme_ioq_retry_run_(q);
	return n;
}

/*
 * After a timeout: end the commands of request `r` still outstanding on `q`, never returning
 * memory the controller may still write. They are aborted together (upcie_nvme_ioq_abort_set_());
 * with `escalate`, commands the Abort did not end reset the controller
 * (upcie_nvme_ctrl_fail_locked_()), after which they are cancelled. Returns 0, or -ENODEV /
 * -EIO for a dead controller.
 */
static inline int upcie_nvme_ioq_end_req_(struct upcie_nvme_ioq *q, struct upcie_nvme_req *r,
					  bool escalate)
{
	struct upcie_nvme_ctrl *c = q->ctrl;
	uint16_t cids[UPCIE_NVME_QPAIR_MAX_CIDS];
	unsigned n = 0;
	int err;

	/* the request's commands are the outstanding CIDs whose context is r */
	for (uint32_t i = 0; i < q->qp.ncids; i++) {
		uint32_t tag = q->qp.slots[i].tag;
		void *ctx;

		if (upcie_nvme_qpair_cid_ctx(&q->qp, (uint16_t)tag, &ctx))
			continue;
		if (ctx != r)
			continue;
		if (upcie_nvme_qpair_tag_held_(tag))
			upcie_nvme_qpair_cancel(&q->qp, (uint16_t)tag); /* not sent: ends now */
		else
			cids[n++] = (uint16_t)tag;
	}
	err = upcie_nvme_ioq_abort_set_(q, cids, n, NULL);
	if (err == -ETIMEDOUT && escalate) {
		pthread_mutex_lock(&c->lock);
		upcie_nvme_ctrl_fail_locked_(c, "I/O command not ended by Abort");
		if (!c->stopped)
			UPCIE_ERR("nvme %s: the request's buffers may still be written by the "
				  "controller",
				  c->name);
		pthread_mutex_unlock(&c->lock);
		/* a controller that did not even stop leaves nothing better than this */
		upcie_nvme_ioq_cancel_set_(q, cids, n);
	}
	return err == -ETIMEDOUT ? 0 : err;
}

/*
 * The error a wait returns when the controller let go of everything (c->stopped) and request
 * `r` ended: a dead controller's (-ENODEV, -EIO: c->stop_err), as on the timeout path, for a
 * request that ended because of it; else the request's own.
 */
static inline int upcie_nvme_ioq_stopped_err_(const struct upcie_nvme_ioq *q,
					      const struct upcie_nvme_req *r)
{
	int err = r->done ? r->err : -ECANCELED;

	return err == -ECANCELED ? upcie_nvme_ctrl_stopped_err_(q->ctrl) : err;
}

static inline int upcie_nvme_ioq_wait_(struct upcie_nvme_ioq *q, struct upcie_nvme_req *r,
				       uint64_t timeout_ns, bool escalate)
{
	struct upcie_deadline dl;
	bool timed_out = false, stopped = false;
	int err;

	if (!q || !q->live || !r)
		return UPCIE_FAIL(-EINVAL, "nvme: wait: queue not live or NULL request");
	upcie_deadline_set(&dl, timeout_ns);
	for (unsigned spins = 0; !r->done; spins++) {
		bool sleep, look;

		if (upcie_nvme_qpair_reap(&q->qp, 0xffffffffu) > 0)
			continue;
		if (r->done)
			break;
		if (q->nparked) {
			upcie_nvme_ioq_retry_run_(q);
			if (r->done)
				break;
		}
		/* polling: the clock and the controller's state every 16th empty poll; before
		 * every sleep on the interrupt, since a halt after this look raises the eventfd
		 * (upcie_nvme_ctrl_wake_waiters_locked_()) and one before it is seen here */
		sleep = q->irq && !q->nparked;
		look = sleep || !(spins & 15);
		/* an escalation elsewhere (another thread reset the controller): seen at once */
		if (look && __atomic_load_n(&q->ctrl->stopped, __ATOMIC_ACQUIRE)) {
			stopped = true;
			break;
		}
		if (look && upcie_deadline_passed(&dl)) {
			timed_out = true;
			break;
		}
		if (sleep)
			upcie_nvme_ioq_irq_wait(q, upcie_deadline_remaining_ns(&dl));
		else
			upcie_cpu_relax();
	}
	if (stopped) {
		/* the controller let go of everything: what is left of the request ends here */
		upcie_nvme_qpair_reap(&q->qp, 0xffffffffu);
		upcie_nvme_ioq_end_req_(q, r, false);
		return upcie_nvme_ioq_stopped_err_(q, r);
	}
	if (!timed_out)
		return r->err;
	UPCIE_ERR("nvme %s: request on queue %u not done after %" PRIu64 " us: aborting its "
		  "outstanding commands",
		  q->ctrl->name, q->qid, timeout_ns / UPCIE_NSEC_PER_USEC);
	err = upcie_nvme_ioq_end_req_(q, r, escalate);
	return err ? err : -ETIMEDOUT;
}

/*
 * Wait until request `r` is done or timeout_ns passed (polling; sleeping on the interrupt for
 * an `irq` queue). On a timeout its commands still outstanding are aborted together and given
 * the controller's abort timeout to end, and this returns -ETIMEDOUT: r->done says whether the
 * request ended (late completion, or aborted: r->err). If not, the controller still holds its
 * commands: `r` and its buffers stay in use until its callback, which comes with their late
 * completion, or with -ECANCELED from upcie_nvme_ctrl_reset() or the queue's deletion. When the
 * controller lets go of everything meanwhile (another thread's escalation or reset: c->stopped),
 * the wait ends at once, polling or asleep on the interrupt (the halt wakes it), and what is
 * left of the request is cancelled. Returns -ENODEV / -EIO when the controller is dead (reset;
 * the request ended with -ECANCELED), and r->err otherwise (0, -EIO, -ECANCELED).
 */
static inline int upcie_nvme_ioq_wait(struct upcie_nvme_ioq *q, struct upcie_nvme_req *r,
				      uint64_t timeout_ns)
{
	return upcie_nvme_ioq_wait_(q, r, timeout_ns, false);
}

/* Describe a failed synchronous request in the log: what, where, and the status. */
static inline int upcie_nvme_io_report_(const struct upcie_nvme_ioq *q,
					const struct upcie_nvme_ns *ns, const char *what,
					uint64_t slba, const struct upcie_nvme_req *r, int err)
{
	uint16_t code = upcie_nvme_cqe_code(&r->cqe);

	/* -EIO with a status from the controller; without one (a dead controller) the errno */
	if (err == -EIO && code)
		UPCIE_ERR("nvme %s: %s on namespace %u at LBA %" PRIu64 " (queue %u): %s (status "
			  "0x%03x%s)",
			  q->ctrl->name, what, ns->nsid, slba, q->qid, upcie_nvme_status_str(code),
			  code, upcie_nvme_cqe_dnr(&r->cqe) ? ", DNR" : "");
	else if (err)
		UPCIE_ERR("nvme %s: %s on namespace %u at LBA %" PRIu64 " (queue %u): %s",
			  q->ctrl->name, what, ns->nsid, slba, q->qid, upcie_errno_name(err));
	return err;
}

/*
 * Synchronous Read/Write/Compare: submits `io` (feeding commands as room frees, so any size
 * works) and waits, the whole call bounded by timeout_ns (0: 30 s) before the abort. The completion goes to *cqe (may be NULL): on
 * -EIO it is the first error status. Returns 0, -EIO (status logged), -EINVAL, -EOPNOTSUPP, or
 * -ETIMEDOUT: its commands were aborted, and those the Abort did not end reset the controller
 * (state FAILED: upcie_nvme_ctrl_reset() brings it back); either way the buffers are the
 * caller's again when this returns. -ENODEV / -EIO: the controller is dead. -ECANCELED: another
 * thread's escalation or reset stopped the controller meanwhile (seen at once, also while the
 * call waits for queue room; the request's commands cancelled, the buffers the caller's). Other
 * commands in flight on `q` keep completing through their own callbacks meanwhile.
 */
static inline int upcie_nvme_ioq_io_sync(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns,
					 const struct upcie_nvme_io *io, uint64_t timeout_ns,
					 struct upcie_nvme_cqe *cqe)
{
	struct upcie_nvme_req r;
	uint64_t t0, used;
	int err;

	if (!timeout_ns)
		timeout_ns = UPCIE_NVME_IO_TIMEOUT;
	memset(&r, 0, sizeof(r));
	t0 = upcie_time_ns();
	err = upcie_nvme_io_submit_(q, ns, io, &r, timeout_ns);
	if (err)
		return err;
	/* one deadline for the whole call: feeding the commands used part of it */
	used = upcie_time_ns() - t0;
	err = upcie_nvme_ioq_wait_(q, &r, used < timeout_ns ? timeout_ns - used : 1, true);
	if (cqe)
		*cqe = r.cqe;
	return upcie_nvme_io_report_(q, ns,
				     io->opc == UPCIE_NVME_NVM_READ	? "Read"
				     : io->opc == UPCIE_NVME_NVM_WRITE	? "Write"
				     : io->opc == UPCIE_NVME_ZNS_APPEND ? "Zone Append"
									: "Compare",
				     io->slba, &r, err);
}

static inline int upcie_nvme_ioq_rw_sync_(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns,
					  uint8_t opc, uint64_t slba,
					  const struct upcie_dmamem *mem, uint64_t off,
					  uint64_t len, struct upcie_nvme_cqe *cqe)
{
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_io io;

	upcie_nvme_io_one_(&io, &seg, opc, slba, mem, off, len);
	return upcie_nvme_ioq_io_sync(q, ns, &io, 0, cqe);
}

/* Synchronous Read of `len` bytes at `slba` into [off, off + len) of `mem`. */
static inline int upcie_nvme_ioq_read_sync(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns,
					   uint64_t slba, const struct upcie_dmamem *mem,
					   uint64_t off, uint64_t len, struct upcie_nvme_cqe *cqe)
{
	return upcie_nvme_ioq_rw_sync_(q, ns, UPCIE_NVME_NVM_READ, slba, mem, off, len, cqe);
}

/* Synchronous Write of `len` bytes at `slba` from [off, off + len) of `mem`. */
static inline int upcie_nvme_ioq_write_sync(struct upcie_nvme_ioq *q,
					    const struct upcie_nvme_ns *ns, uint64_t slba,
					    const struct upcie_dmamem *mem, uint64_t off,
					    uint64_t len, struct upcie_nvme_cqe *cqe)
{
	return upcie_nvme_ioq_rw_sync_(q, ns, UPCIE_NVME_NVM_WRITE, slba, mem, off, len, cqe);
}

/*
 * Synchronous form of a one-command request made by a submit function (flush, write zeroes,
 * dsm, submit_cmd): pass the submit's return value and the request. Returns as
 * upcie_nvme_ioq_io_sync(): when it returns, `r` has ended.
 */
static inline int upcie_nvme_ioq_sync(struct upcie_nvme_ioq *q, int submit_err,
				      struct upcie_nvme_req *r, uint64_t timeout_ns,
				      struct upcie_nvme_cqe *cqe)
{
	int err = submit_err;

	if (err)
		return err;
	err = upcie_nvme_ioq_wait_(q, r, timeout_ns ? timeout_ns : UPCIE_NVME_IO_TIMEOUT, true);
	if (cqe)
		*cqe = r->cqe;
	if (err == -EIO)
		UPCIE_ERR("nvme %s: command on queue %u: %s (status 0x%03x)", q->ctrl->name, q->qid,
			  upcie_nvme_status_str(upcie_nvme_cqe_code(&r->cqe)),
			  upcie_nvme_cqe_code(&r->cqe));
	return err;
}

#endif /* UPCIE_NVME_NS_H */
