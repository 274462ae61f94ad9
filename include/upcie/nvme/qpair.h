/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * NVMe queue pair: the submission/completion protocol for one SQ and its CQ.
 *
 * Commands are copied into the SQ ring (enqueue) or built in place there and committed (no
 * copy: upcie_nvme_qpair_sqe_slot()), published with one doorbell write per batch (ring), and
 * completed by polling phase tags (reap), which writes the CQ head doorbell once per call.
 * Completions are matched by command identifier, not by slot, so a controller may complete in
 * any order. Each command carries a callback and a context; every command that enqueue or
 * commit accepted ends in exactly one callback: from reap (err 0, the controller's status in
 * the CQE) or from cancel (err -ECANCELED, a synthesized "Command Abort Requested" CQE).
 *
 * Flow control: a command is refused with -EBUSY when all CIDs are in use or the SQ ring is
 * full as far as the last SQ head pointer (CQE.SQHD) tells; reaping frees both. An SQ slot is
 * never reused before the controller reported it fetched. At most cq_depth - 1 commands are
 * outstanding, so the CQ cannot overflow.
 *
 * Threading: a queue pair has one owner (one CPU thread, or one GPU thread) that calls every
 * function; there are no locks and no atomics. The hot path touches the first 64 bytes of the
 * struct, one SQ slot, one CQ entry and one 16-byte CID slot per command, with no division.
 * Callbacks run inside reap and may enqueue and ring on the same queue pair, but must not reap,
 * wait, cancel-all or fini it.
 *
 * The protocol functions (UPCIE_HD) compile for the host and for CUDA/HIP device code through
 * qpair_port.h. init/fini are host code. The queue pair does not create queues on a controller
 * (the admin commands in cmd.h do); it needs the ring memory, zeroed CQ, and doorbell pointers.
 */
#ifndef UPCIE_NVME_QPAIR_H
#define UPCIE_NVME_QPAIR_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/nvme/qpair_port.h>
#include <upcie/nvme/spec.h>

/*
 * Completion callback. `cqe` is the completion entry, valid during the call only (on the host
 * it points into the CQ ring, which the controller does not reuse before reap has returned; in
 * device code, and for cancel, it is a copy). err is 0 when the controller completed the command
 * (check upcie_nvme_cqe_ok(cqe)), or -ECANCELED when upcie_nvme_qpair_cancel() or
 * upcie_nvme_qpair_fini() ended it.
 */
typedef void (*upcie_nvme_cpl_fn)(void *ctx, const struct upcie_nvme_cqe *cqe, int err);

/* Per-CID state. cb also encodes the state: free, cancelled, no callback (small values). */
struct upcie_nvme_cid_slot {
	upcie_nvme_cpl_fn cb;
	void *ctx;
};

#define UPCIE_NVME_CID_FREE_	  ((upcie_nvme_cpl_fn)(uintptr_t)0)
#define UPCIE_NVME_CID_CANCELLED_ ((upcie_nvme_cpl_fn)(uintptr_t)1)
#define UPCIE_NVME_CID_NOCB_	  ((upcie_nvme_cpl_fn)(uintptr_t)2)

/* Do not zero the CQ at init (memory the CPU cannot write; the caller zeroed it). */
#define UPCIE_NVME_QPAIR_NO_CQ_CLEAR 0x1u

struct upcie_nvme_qpair_cfg {
	void *sq;		 /* SQ ring, sq_depth * 64 bytes, 16-byte aligned */
	void *cq;		 /* CQ ring, cq_depth * 16 bytes, 16-byte aligned */
	volatile uint32_t *sqdb; /* SQ tail doorbell (BAR0 + upcie_nvme_sq_tdbl_off()) */
	volatile uint32_t *cqdb; /* CQ head doorbell (BAR0 + upcie_nvme_cq_hdbl_off()) */
	uint32_t sq_depth;	 /* entries, 2..65536 (at most CAP.MQES + 1) */
	uint32_t cq_depth;	 /* entries, 2..65536; 0: same as sq_depth */
	uint32_t ncids;		 /* outstanding commands, 1..cq_depth - 1; 0: cq_depth - 1 */
	uint16_t qid;		 /* queue identifier, for synthesized completions */
	unsigned flags;		 /* UPCIE_NVME_QPAIR_* */
	void *tables; /* upcie_nvme_qpair_tables_size() bytes, 16-byte aligned; NULL: malloc */
};

struct upcie_nvme_qpair {
	/* Hot: everything enqueue/ring/reap touch, one cache line. */
	struct upcie_nvme_sqe *sq;
	struct upcie_nvme_cqe *cq;
	volatile uint32_t *sqdb;
	volatile uint32_t *cqdb;
	struct upcie_nvme_cid_slot *slots; /* indexed by CID */
	uint16_t *cid_free;		   /* stack of free CIDs */
	uint16_t sq_tail;		   /* next SQ slot to fill */
	uint16_t sq_head;		   /* SQ head as last reported by the controller */
	uint16_t sq_db;			   /* tail value last written to the doorbell */
	uint16_t sq_last;		   /* sq_depth - 1 */
	uint16_t cq_head;		   /* next CQ entry to look at */
	uint16_t cq_last;		   /* cq_depth - 1 */
	uint16_t nfree;			   /* CIDs on the free stack */
	uint8_t phase;			   /* phase tag of new entries at cq_head */
	uint8_t flags;
	/* Cold. */
	uint16_t qid;
	uint16_t ncids;
	uint32_t ncancelled; /* cancelled CIDs waiting for a late completion or reclaim */
	uint64_t nbad;	     /* completions for CIDs not outstanding (reap returned -EPROTO) */
	uint64_t nlate;	     /* completions of cancelled commands, consumed silently */
	uint64_t nbad_sqhd;  /* completions with an SQ head outside the ring (ignored) */
	void *tables_owned;  /* malloc'd CID tables, freed by fini */
};

/* Bytes of CID tables (slots and free stack) for `ncids` CIDs. */
static inline size_t upcie_nvme_qpair_tables_size(uint32_t ncids)
{
	size_t n = (size_t)ncids * sizeof(struct upcie_nvme_cid_slot) + (size_t)ncids * 2;

	return (n + 15) & ~(size_t)15;
}

/*
 * Set up `qp` over the rings and doorbells in `cfg`. Zeroes the CQ (unless
 * UPCIE_NVME_QPAIR_NO_CQ_CLEAR) and starts with SQ tail and CQ head 0, phase 1, matching a
 * queue the controller just created. Returns 0, -EINVAL for a bad config, -ENOMEM.
 */
static inline int upcie_nvme_qpair_init(struct upcie_nvme_qpair *qp,
					const struct upcie_nvme_qpair_cfg *cfg)
{
	uint32_t cq_depth, ncids;
	void *tables;

	if (!qp || !cfg)
		return UPCIE_FAIL(-EINVAL, "nvme: qpair: no qpair or config");
	memset(qp, 0, sizeof(*qp));
	cq_depth = cfg->cq_depth ? cfg->cq_depth : cfg->sq_depth;
	ncids = cfg->ncids ? cfg->ncids : cq_depth - 1;
	if (!cfg->sq || !cfg->cq || !cfg->sqdb || !cfg->cqdb)
		return UPCIE_FAIL(-EINVAL, "nvme: qpair %u: missing ring or doorbell", cfg->qid);
	if (((uintptr_t)cfg->sq | (uintptr_t)cfg->cq | (uintptr_t)cfg->tables) & 15)
		return UPCIE_FAIL(
		    -EINVAL, "nvme: qpair %u: rings and tables need 16-byte alignment", cfg->qid);
	if (cfg->sq_depth < 2 || cfg->sq_depth > 65536 || cq_depth < 2 || cq_depth > 65536)
		return UPCIE_FAIL(-EINVAL, "nvme: qpair %u: depth sq %u cq %u outside 2..65536",
				  cfg->qid, cfg->sq_depth, cq_depth);
	if (ncids > cq_depth - 1 || ncids > 65535)
		return UPCIE_FAIL(-EINVAL, "nvme: qpair %u: %u CIDs exceed CQ depth %u - 1",
				  cfg->qid, ncids, cq_depth);
	tables = cfg->tables;
	if (!tables) {
		tables = aligned_alloc(16, upcie_nvme_qpair_tables_size(ncids));
		if (!tables)
			return UPCIE_FAIL(-ENOMEM, "nvme: qpair %u: no memory for %u CIDs",
					  cfg->qid, ncids);
		qp->tables_owned = tables;
	}
	qp->slots = (struct upcie_nvme_cid_slot *)tables;
	qp->cid_free = (uint16_t *)(qp->slots + ncids);
	memset(qp->slots, 0, ncids * sizeof(*qp->slots));
	/* Lowest CID on top: a lightly loaded queue keeps reusing the same few slots. */
	for (uint32_t i = 0; i < ncids; i++)
		qp->cid_free[i] = (uint16_t)(ncids - 1 - i);
	qp->nfree = (uint16_t)ncids;
	qp->ncids = (uint16_t)ncids;
	qp->sq = (struct upcie_nvme_sqe *)cfg->sq;
	qp->cq = (struct upcie_nvme_cqe *)cfg->cq;
	qp->sqdb = cfg->sqdb;
	qp->cqdb = cfg->cqdb;
	qp->sq_last = (uint16_t)(cfg->sq_depth - 1);
	qp->cq_last = (uint16_t)(cq_depth - 1);
	qp->phase = 1;
	qp->qid = cfg->qid;
	qp->flags = (uint8_t)cfg->flags;
	if (!(cfg->flags & UPCIE_NVME_QPAIR_NO_CQ_CLEAR))
		memset(cfg->cq, 0, (size_t)cq_depth * sizeof(struct upcie_nvme_cqe));
	return 0;
}

/*
 * The CID the next successful enqueue will assign (to pick per-command resources such as PRP
 * list pages before building the command). Valid until the next enqueue, reap, cancel or
 * reclaim. Returns 0, or -EBUSY when no CID is free.
 */
UPCIE_HD static inline int upcie_nvme_qpair_next_cid(const struct upcie_nvme_qpair *qp,
						     uint16_t *cid)
{
	if (!qp->nfree)
		return -EBUSY;
	*cid = qp->cid_free[qp->nfree - 1];
	return 0;
}

/*
 * The SQ tail after one more command (0..sq_last), or -EBUSY when the SQ ring is full as far
 * as the last reported SQ head tells, or no CID is free.
 */
UPCIE_HD static inline int upcie_nvme_qpair_next_tail_(const struct upcie_nvme_qpair *qp)
{
	uint16_t next = (uint16_t)(qp->sq_tail + 1);

	if (UPCIE_UNLIKELY(qp->sq_tail == qp->sq_last))
		next = 0;
	if (UPCIE_UNLIKELY(next == qp->sq_head || !qp->nfree))
		return -EBUSY;
	return next;
}

/* Give the command going into the next SQ slot a CID with callback cb and context ctx. */
UPCIE_HD static inline uint16_t upcie_nvme_qpair_take_(struct upcie_nvme_qpair *qp,
						       upcie_nvme_cpl_fn cb, void *ctx)
{
	uint32_t top = qp->nfree - 1u; /* the caller checked nfree >= 1 */
	uint16_t c = qp->cid_free[top];
	struct upcie_nvme_cid_slot *slot = &qp->slots[c];

	qp->nfree = (uint16_t)top;
	slot->cb = cb ? cb : UPCIE_NVME_CID_NOCB_;
	slot->ctx = ctx;
	return c;
}

/*
 * Copy `sqe` into the next SQ slot with a fresh CID (written into the slot, not into `sqe`),
 * to complete through cb(ctx, ...) (cb may be NULL: the completion is then only consumed).
 * Not visible to the controller until upcie_nvme_qpair_ring(). Returns 0 (the CID in *cid
 * when cid is not NULL), -EBUSY when the queue pair is full (reap and retry), -EINVAL for a
 * NULL sqe.
 */
UPCIE_HD static inline int upcie_nvme_qpair_enqueue(struct upcie_nvme_qpair *qp,
						    const struct upcie_nvme_sqe *sqe,
						    upcie_nvme_cpl_fn cb, void *ctx, uint16_t *cid)
{
	uint16_t tail = qp->sq_tail, c;
	int next = upcie_nvme_qpair_next_tail_(qp);

	if (UPCIE_UNLIKELY(next < 0))
		return next;
	if (UPCIE_UNLIKELY(!sqe))
		return -EINVAL;
	c = upcie_nvme_qpair_take_(qp, cb, ctx);
	upcie_nvme_port_sqe_store(&qp->sq[tail], sqe, c);
	qp->sq_tail = (uint16_t)next;
	if (cid)
		*cid = c;
	return 0;
}

/*
 * Building a command in place, without the copy of upcie_nvme_qpair_enqueue(): write the
 * command into the slot upcie_nvme_qpair_sqe_slot() returns, then upcie_nvme_qpair_commit()
 * enqueues it as it stands there. The slot is the one after the last enqueued command: the
 * controller does not own it before a ring publishes it, so it may be written at any time, also
 * when the queue pair is full (commit then fails with -EBUSY and the next command simply
 * overwrites the slot). The pointer is valid until the next enqueue, commit or reap (a reap's
 * callbacks may enqueue). An SQ in controller memory is write-combining MMIO: fill the slot with
 * stores only and never read it back. The cmd.h builders and upcie_nvme_prp_mem_build() only
 * store; other data pointer builders read the flags byte back (use them on a command built
 * elsewhere, with enqueue).
 *
 *	struct upcie_nvme_sqe *sqe = upcie_nvme_qpair_sqe_slot(qp);
 *
 *	if (upcie_nvme_cmd_read(sqe, nsid, slba, nlb, 0) ||
 *	    upcie_nvme_prp_mem_build(sqe, &pm, off, len, NULL) ||
 *	    upcie_nvme_qpair_commit(qp, cb, ctx, NULL))
 *		// not enqueued: nothing to undo
 */
UPCIE_HD static inline struct upcie_nvme_sqe *
upcie_nvme_qpair_sqe_slot(const struct upcie_nvme_qpair *qp)
{
	return &qp->sq[qp->sq_tail];
}

/*
 * Enqueue the command written into upcie_nvme_qpair_sqe_slot(): as upcie_nvme_qpair_enqueue()
 * (a fresh CID, stored into the slot's CID field with one 16-bit store; the rest of the slot is
 * neither read nor written). Returns 0 (the CID in *cid when cid is not NULL), or -EBUSY when
 * the queue pair is full (nothing enqueued).
 */
UPCIE_HD static inline int upcie_nvme_qpair_commit(struct upcie_nvme_qpair *qp,
						   upcie_nvme_cpl_fn cb, void *ctx, uint16_t *cid)
{
	uint16_t tail = qp->sq_tail, c;
	int next = upcie_nvme_qpair_next_tail_(qp);

	if (UPCIE_UNLIKELY(next < 0))
		return next;
	c = upcie_nvme_qpair_take_(qp, cb, ctx);
	qp->sq[tail].cid = c;
	qp->sq_tail = (uint16_t)next;
	if (cid)
		*cid = c;
	return 0;
}

/*
 * Publish enqueued commands: one write barrier and one doorbell write, skipped when nothing
 * was enqueued since the last ring. Returns 0.
 */
UPCIE_HD static inline int upcie_nvme_qpair_ring(struct upcie_nvme_qpair *qp)
{
	uint16_t tail = qp->sq_tail;

	if (tail != qp->sq_db) {
		upcie_nvme_port_wmb();
		upcie_nvme_port_doorbell(qp->sqdb, tail);
		qp->sq_db = tail;
	}
	return 0;
}

/* Enqueue and ring. */
UPCIE_HD static inline int upcie_nvme_qpair_submit(struct upcie_nvme_qpair *qp,
						   const struct upcie_nvme_sqe *sqe,
						   upcie_nvme_cpl_fn cb, void *ctx, uint16_t *cid)
{
	int err = upcie_nvme_qpair_enqueue(qp, sqe, cb, ctx, cid);

	if (err)
		return err;
	return upcie_nvme_qpair_ring(qp);
}

/* Return a CID to the free stack. */
UPCIE_HD static inline void upcie_nvme_qpair_cid_put_(struct upcie_nvme_qpair *qp, uint16_t cid)
{
	qp->slots[cid].cb = UPCIE_NVME_CID_FREE_;
	qp->cid_free[qp->nfree++] = cid;
}

/*
 * Step past the CQ entry at *head (its view `cqe`): advance head, flip the phase on a wrap (in
 * qp->phase right away, and in *phase16, the copy at bit 16 where dw3 has it), take the SQ head
 * the entry reports (one outside the ring is counted in qp->nbad_sqhd and ignored).
 */
UPCIE_HD static inline void upcie_nvme_qpair_cqe_pass_(struct upcie_nvme_qpair *qp,
						       const struct upcie_nvme_cqe *cqe,
						       uint16_t *head, uint32_t *phase16)
{
	uint16_t sqhd = upcie_nvme_cqe_sqhd(cqe);

	if (UPCIE_UNLIKELY(*head == qp->cq_last)) {
		*head = 0;
		*phase16 ^= 1u << 16;
		qp->phase ^= 1u;
	} else {
		(*head)++;
	}
	if (UPCIE_LIKELY(sqhd <= qp->sq_last))
		qp->sq_head = sqhd;
	else
		qp->nbad_sqhd++;
}

/*
 * Process up to `max` new completions: call each command's callback and free its CID, then
 * write the CQ head doorbell once. Returns the number of commands completed (0 when none was
 * ready), or -EPROTO when the first new entry names a CID that is not outstanding: that entry
 * is consumed and counted in qp->nbad (a bad entry after good ones ends the batch; the next
 * call reports it). A late completion of a cancelled command is consumed silently (qp->nlate)
 * and frees its CID.
 */
UPCIE_HD static inline int upcie_nvme_qpair_reap(struct upcie_nvme_qpair *qp, unsigned max)
{
	uint16_t head = qp->cq_head;
	uint32_t phase16 = (uint32_t)qp->phase << 16;
	unsigned n = 0;
	int ret;

	while (n < max) {
		const struct upcie_nvme_cqe *e = &qp->cq[head];
		/* dw3 with the phase tag flipped to 0 for a new entry; the CID is untouched. */
		uint32_t x = upcie_nvme_port_load32(&e->dw3) ^ phase16;
		uint16_t cid = (uint16_t)x;
		const struct upcie_nvme_cqe *cqe;
		struct upcie_nvme_cqe copy;
		struct upcie_nvme_cid_slot *slot;
		upcie_nvme_cpl_fn cb;
		void *ctx;

		if (x & (1u << 16))
			break;
		upcie_nvme_port_dma_rmb();
		/* Fast path: an outstanding CID with a callback (cb above the state values). */
		if (UPCIE_UNLIKELY(cid >= qp->ncids || (uintptr_t)(cb = qp->slots[cid].cb) <=
							   (uintptr_t)UPCIE_NVME_CID_NOCB_)) {
			cb = cid < qp->ncids ? qp->slots[cid].cb : UPCIE_NVME_CID_FREE_;
			/* A bad entry after good ones ends the batch; the next call reports it. */
			if (cb == UPCIE_NVME_CID_FREE_ && n > 0)
				break;
			cqe = upcie_nvme_port_cqe_view(&copy, e, x ^ phase16);
			upcie_nvme_qpair_cqe_pass_(qp, cqe, &head, &phase16);
			if (cb == UPCIE_NVME_CID_FREE_) {
				qp->nbad++;
				ret = -EPROTO;
				goto moved; /* consumed: the head moved, or came full circle */
			}
			if (cb == UPCIE_NVME_CID_CANCELLED_) {
				qp->ncancelled--;
				qp->nlate++;
			} else {
				n++; /* no callback */
			}
			upcie_nvme_qpair_cid_put_(qp, cid);
			continue;
		}
		slot = &qp->slots[cid];
		cqe = upcie_nvme_port_cqe_view(&copy, e, x ^ phase16);
		upcie_nvme_qpair_cqe_pass_(qp, cqe, &head, &phase16);
		ctx = slot->ctx;
		/* Free the CID before the callback, which may submit again. */
		slot->cb = UPCIE_NVME_CID_FREE_;
		qp->cid_free[qp->nfree++] = cid;
		cb(ctx, cqe, 0);
		n++;
		/*
		 * Nothing outstanding (no CID taken, none cancelled): a next entry could only be a
		 * bad one, which ends the batch after good ones unconsumed anyway (see above), so
		 * stop without polling it. The callback may have enqueued: nfree is read after it.
		 */
		if (qp->nfree == qp->ncids) {
			ret = (int)n;
			goto moved; /* this entry was consumed: the head moved */
		}
	}
	ret = (int)n;
	/*
	 * Nothing consumed: no doorbell. Not "head unchanged" alone: a conforming controller posts
	 * at most cq_depth - 1 entries past the head it was last told, but a broken one can fill
	 * the ring again behind the entries consumed here and bring the head full circle. Such a
	 * circle holds an entry counted in n (late completions alone cannot make one: fewer CIDs
	 * are cancelled than the ring has entries), or it ends in a bad entry, which goes to moved.
	 */
	if (head == qp->cq_head && !n)
		return ret;
moved:
	/* One doorbell write for the batch (qp->phase already follows every wrap). */
	qp->cq_head = head;
	upcie_nvme_port_doorbell(qp->cqdb, head);
	return ret;
}

/* Commands outstanding: enqueued and neither completed nor cancelled. */
UPCIE_HD static inline uint32_t upcie_nvme_qpair_inflight(const struct upcie_nvme_qpair *qp)
{
	return (uint32_t)qp->ncids - qp->nfree - qp->ncancelled;
}

UPCIE_HD static inline bool upcie_nvme_qpair_cid_outstanding_(const struct upcie_nvme_qpair *qp,
							      uint16_t cid)
{
	upcie_nvme_cpl_fn cb = qp->slots[cid].cb;

	return cb != UPCIE_NVME_CID_FREE_ && cb != UPCIE_NVME_CID_CANCELLED_;
}

/*
 * Commands that can be enqueued right now: the smaller of the free CIDs and the free SQ slots
 * (as far as the last reported SQ head tells). A request that needs n commands fits when this is
 * at least n.
 */
UPCIE_HD static inline uint32_t upcie_nvme_qpair_room(const struct upcie_nvme_qpair *qp)
{
	uint32_t depth = (uint32_t)qp->sq_last + 1;
	uint32_t used = qp->sq_tail >= qp->sq_head ? (uint32_t)(qp->sq_tail - qp->sq_head)
						   : qp->sq_tail + depth - qp->sq_head;
	uint32_t sq_free = depth - 1 - used;

	return sq_free < qp->nfree ? sq_free : qp->nfree;
}

/*
 * The context an outstanding command `cid` was enqueued with, into *ctx. Returns 0, -EINVAL for
 * a CID out of range, -ENOENT when `cid` is not outstanding. (To find the commands of one
 * request after a timeout.)
 */
UPCIE_HD static inline int upcie_nvme_qpair_cid_ctx(const struct upcie_nvme_qpair *qp, uint16_t cid,
						    void **ctx)
{
	if (cid >= qp->ncids)
		return -EINVAL;
	if (!upcie_nvme_qpair_cid_outstanding_(qp, cid))
		return -ENOENT;
	*ctx = qp->slots[cid].ctx;
	return 0;
}

/*
 * Store up to `max` outstanding CIDs in `cids` (for Abort after a timeout). Returns how many
 * are outstanding (may exceed max).
 */
UPCIE_HD static inline int upcie_nvme_qpair_outstanding(const struct upcie_nvme_qpair *qp,
							uint16_t *cids, unsigned max)
{
	unsigned n = 0;

	for (uint32_t c = 0; c < qp->ncids; c++) {
		if (!upcie_nvme_qpair_cid_outstanding_(qp, (uint16_t)c))
			continue;
		if (n < max)
			cids[n] = (uint16_t)c;
		n++;
	}
	return (int)n;
}

/*
 * End outstanding command `cid` now: its callback runs once, with err -ECANCELED and a
 * synthesized CQE (status Command Abort Requested, DNR set). The CID stays reserved until the
 * controller's late completion arrives (consumed silently by reap) or upcie_nvme_qpair_reclaim()
 * is called once the controller can no longer complete it (queue deleted, controller reset);
 * so a late completion can never be taken for a newer command. Returns 0, -EINVAL for a CID
 * out of range, -ENOENT when `cid` is not outstanding.
 */
UPCIE_HD static inline int upcie_nvme_qpair_cancel(struct upcie_nvme_qpair *qp, uint16_t cid)
{
	struct upcie_nvme_cqe cqe;
	upcie_nvme_cpl_fn cb;
	void *ctx;

	if (cid >= qp->ncids)
		return -EINVAL;
	if (!upcie_nvme_qpair_cid_outstanding_(qp, cid))
		return -ENOENT;
	cb = qp->slots[cid].cb;
	ctx = qp->slots[cid].ctx;
	qp->slots[cid].cb = UPCIE_NVME_CID_CANCELLED_;
	qp->ncancelled++;
	cqe.dw0 = 0;
	cqe.dw1 = 0;
	cqe.dw2 = qp->sq_head | ((uint32_t)qp->qid << 16);
	cqe.dw3 = upcie_nvme_cqe_dw3_make(cid, 0, UPCIE_NVME_SC_ABORT_REQ, true);
	if (cb != UPCIE_NVME_CID_NOCB_)
		cb(ctx, &cqe, -ECANCELED);
	return 0;
}

/*
 * Return every cancelled CID to the free stack. Only when the controller cannot complete those
 * commands any more: after the queue was deleted or the controller reset. Returns the number
 * of CIDs reclaimed.
 */
UPCIE_HD static inline int upcie_nvme_qpair_reclaim(struct upcie_nvme_qpair *qp)
{
	int n = 0;

	for (uint32_t c = 0; c < qp->ncids && qp->ncancelled; c++) {
		if (qp->slots[c].cb != UPCIE_NVME_CID_CANCELLED_)
			continue;
		upcie_nvme_qpair_cid_put_(qp, (uint16_t)c);
		qp->ncancelled--;
		n++;
	}
	return n;
}

/*
 * Reap until command `cid` has completed or been cancelled, or `timeout_ns` passed
 * (UINT64_MAX: no limit). Spins; never sleeps. Other completions are processed on the way;
 * bad entries (-EPROTO) are counted in qp->nbad and do not end the wait. Returns 0, -EINVAL
 * for a CID out of range, -ETIMEDOUT (the command is still outstanding: abort and cancel it,
 * see upcie_nvme_qpair_outstanding()).
 */
UPCIE_HD static inline int upcie_nvme_qpair_wait(struct upcie_nvme_qpair *qp, uint16_t cid,
						 uint64_t timeout_ns)
{
	uint64_t start = upcie_nvme_port_time_ns();

	if (cid >= qp->ncids)
		return -EINVAL;
	for (;;) {
		if (upcie_nvme_qpair_reap(qp, 0xffffffffu) == 0)
			upcie_nvme_port_relax();
		if (!upcie_nvme_qpair_cid_outstanding_(qp, cid))
			return 0;
		/* Checked every round, so other commands' traffic cannot postpone the deadline. */
		if (upcie_nvme_port_time_ns() - start >= timeout_ns)
			return -ETIMEDOUT;
	}
}

/* As upcie_nvme_qpair_wait() until no command is outstanding. */
UPCIE_HD static inline int upcie_nvme_qpair_drain(struct upcie_nvme_qpair *qp, uint64_t timeout_ns)
{
	uint64_t start = upcie_nvme_port_time_ns();

	for (;;) {
		if (upcie_nvme_qpair_reap(qp, 0xffffffffu) == 0)
			upcie_nvme_port_relax();
		if (!upcie_nvme_qpair_inflight(qp))
			return 0;
		if (upcie_nvme_port_time_ns() - start >= timeout_ns)
			return -ETIMEDOUT;
	}
}

struct upcie_nvme_sync_ {
	struct upcie_nvme_cqe cqe;
	int err;
	bool done;
};

UPCIE_HD static inline void upcie_nvme_sync_cb_(void *ctx, const struct upcie_nvme_cqe *cqe,
						int err)
{
	struct upcie_nvme_sync_ *s = (struct upcie_nvme_sync_ *)ctx;

	s->cqe = *cqe;
	s->err = err;
	s->done = true;
}

/*
 * Submit one command and spin until it completes or `timeout_ns` passes. The completion goes
 * to *cqe (may be NULL; on timeout it receives the synthesized abort completion). Returns 0 on success, -EIO when the controller completed it with an
 * error status (see *cqe), -EBUSY when the queue pair is full, -ETIMEDOUT when no completion
 * came: the command is then cancelled here (its CID, in *cid when not NULL, stays reserved
 * until a late completion or reclaim) and the controller layer should Abort it.
 */
UPCIE_HD static inline int upcie_nvme_qpair_submit_sync(struct upcie_nvme_qpair *qp,
							const struct upcie_nvme_sqe *sqe,
							uint64_t timeout_ns,
							struct upcie_nvme_cqe *cqe, uint16_t *cid)
{
	struct upcie_nvme_sync_ s;
	uint16_t c;
	int err;

	s.done = false;
	s.err = 0;
	err = upcie_nvme_qpair_submit(qp, sqe, upcie_nvme_sync_cb_, &s, &c);
	if (err)
		return err;
	if (cid)
		*cid = c;
	err = upcie_nvme_qpair_wait(qp, c, timeout_ns);
	if (err == -ETIMEDOUT)
		upcie_nvme_qpair_cancel(qp, c); /* our frame must not outlive the callback */
	if (cqe && s.done)
		*cqe = s.cqe;
	if (err)
		return err;
	return upcie_nvme_cqe_ok(&s.cqe) ? 0 : -EIO;
}

/*
 * Tear down: every command still outstanding completes with -ECANCELED (so each submitted
 * command still gets exactly one callback), owned tables are freed, `qp` is zeroed. Call after
 * the controller stopped using the queues. A zeroed qpair is a no-op.
 */
static inline void upcie_nvme_qpair_fini(struct upcie_nvme_qpair *qp)
{
	if (!qp || !qp->slots) {
		if (qp)
			memset(qp, 0, sizeof(*qp));
		return;
	}
	for (uint32_t c = 0; c < qp->ncids; c++)
		if (upcie_nvme_qpair_cid_outstanding_(qp, (uint16_t)c))
			upcie_nvme_qpair_cancel(qp, (uint16_t)c);
	free(qp->tables_owned);
	memset(qp, 0, sizeof(*qp));
}

#endif /* UPCIE_NVME_QPAIR_H */
