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
 * Command identity: a CID is a slot index in its low bits and, above them, a generation that
 * advances every time the slot is handed out again, so a CID names one command, not a slot. A
 * completion, a wait, a cancel or an Abort that names an older command of the same slot does
 * not reach the newer one. At most 2047 commands are outstanding per queue pair, which leaves
 * at least 5 generation bits (32 reuses of a slot before a CID repeats). There are more slots
 * than CIDs (the next power of two above their count), so the index bits of a CID are never all
 * ones and no command is ever CID FFFFh, the value the Error Information log page uses for "no
 * command".
 *
 * The device writes the CQ and is not trusted: a completion whose CID is out of range, not
 * outstanding (a duplicate, a stale generation) or whose SQ head goes backwards or past the
 * tail the host rang is counted (nbad, ndup, nbad_sqhd), logged on the host at counts 1, 2, 4,
 * 8, ..., and otherwise ignored; only the queue pair's own tables are indexed with what the
 * device wrote, and only after masking.
 *
 * Flow control: a command is refused with -EBUSY when all CIDs are in use; reaping frees them.
 * There are fewer CIDs than SQ slots (at most sq_depth - 1), so the slot a new command goes to
 * was fetched already: a command still waiting in the SQ holds a CID, and so do all commands
 * after it, and there cannot be sq_depth of them. So flow control does not depend on the SQ
 * head the controller reports (CQE.SQHD), which is only checked and recorded. There are fewer
 * CIDs than CQ entries too (at most cq_depth - 1), so the CQ cannot overflow.
 *
 * When the controller let go of a queue (disabled, or the queue deleted), upcie_nvme_qpair_stop()
 * ends what is left; upcie_nvme_qpair_restart() starts over on a recreated queue, carrying along
 * the commands callbacks submitted meanwhile (controller reset).
 *
 * Threading: a queue pair has one owner (one CPU thread, or one GPU thread) that calls every
 * function; there are no locks and no atomics. The hot path touches the first 64 bytes of the
 * struct and the two fields after them, one SQ slot, one CQ entry and one 32-byte CID slot per
 * command, with no division. Callbacks run inside reap and may enqueue and ring on the same
 * queue pair, but must not reap, wait, cancel, stop or fini it.
 *
 * The protocol functions (UPCIE_HD) compile for the host and for CUDA/HIP device code through
 * qpair_port.h. init/fini/stop/restart are host code. The queue pair does not create queues on
 * a controller (the admin commands in cmd.h do); it needs the ring memory, zeroed CQ, and
 * doorbell pointers.
 */
#ifndef UPCIE_NVME_QPAIR_H
#define UPCIE_NVME_QPAIR_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
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
 * (check upcie_nvme_cqe_ok(cqe)), or -ECANCELED when upcie_nvme_qpair_cancel(),
 * upcie_nvme_qpair_stop() or upcie_nvme_qpair_fini() ended it.
 */
typedef void (*upcie_nvme_cpl_fn)(void *ctx, const struct upcie_nvme_cqe *cqe, int err);

/* Per-slot state: the command holding it (tag) and how to complete it; 32 bytes on 64-bit
 * targets, so a slot's address is a shift of its index. */
struct upcie_nvme_cid_slot {
	uint32_t tag; /* the holder's CID, or'ed with UPCIE_NVME_CID_* state bits (first: its
			 address is the slot's) */
	uint32_t rsv_;
	upcie_nvme_cpl_fn cb;
	void *ctx;
	uint64_t rsv2_;
};

/* Tag state bits (above the 16-bit CID). A tag equal to the CID: outstanding, with a callback. */
#define UPCIE_NVME_CID_CANCELLED_ 0x10000u    /* cancelled; waits for its late completion */
#define UPCIE_NVME_CID_NOCB_	  0x20000u    /* outstanding without a callback */
#define UPCIE_NVME_CID_FREE_	  0x40000u    /* free; the CID is that of its last command */
#define UPCIE_NVME_CID_STOP_	  0x80000u    /* outstanding when upcie_nvme_qpair_stop() began */
#define UPCIE_NVME_CID_HELD_	  0x100000u   /* taken, not in the SQ yet (a retry waiting) */
#define UPCIE_NVME_CID_UNUSED_	  0xffffffffu /* never held a command (or beyond ncids) */

/* Most commands outstanding on one queue pair (at most 11 index bits, at least 5 generation
 * bits, index bits never all ones). */
#define UPCIE_NVME_QPAIR_MAX_CIDS 2047u

/* Do not zero the CQ at init (memory the CPU cannot write; the caller zeroed it). */
#define UPCIE_NVME_QPAIR_NO_CQ_CLEAR 0x1u

struct upcie_nvme_qpair_cfg {
	void *sq;		 /* SQ ring, sq_depth * 64 bytes, 16-byte aligned */
	void *cq;		 /* CQ ring, cq_depth * 16 bytes, 16-byte aligned */
	volatile uint32_t *sqdb; /* SQ tail doorbell (BAR0 + upcie_nvme_sq_tdbl_off()) */
	volatile uint32_t *cqdb; /* CQ head doorbell (BAR0 + upcie_nvme_cq_hdbl_off()) */
	uint32_t sq_depth;	 /* entries, 2..65536 (at most CAP.MQES + 1) */
	uint32_t cq_depth;	 /* entries, 2..65536; 0: same as sq_depth */
	uint32_t ncids;		 /* outstanding commands, 1..min(sq_depth - 1, cq_depth - 1,
				    2047); 0: that maximum */
	uint16_t qid;		 /* queue identifier, for synthesized completions */
	unsigned flags;		 /* UPCIE_NVME_QPAIR_* */
	void *tables; /* upcie_nvme_qpair_tables_size() bytes, 16-byte aligned; NULL: malloc */
	uint32_t clock_khz; /* rate of upcie_nvme_port_clock() where the queue pair is driven, in
			       ticks per ms; 0: nanoseconds (host, CUDA). HIP device code: the
			       rate hipDeviceAttributeWallClockRate reports */
};

struct upcie_nvme_qpair {
	/* Hot: what enqueue/ring/reap touch, one cache line. */
	struct upcie_nvme_sqe *sq;
	struct upcie_nvme_cqe *cq;
	volatile uint32_t *sqdb;
	volatile uint32_t *cqdb;
	struct upcie_nvme_cid_slot *slots; /* indexed by CID & cid_mask */
	uint16_t *cid_free;		   /* stack of the CIDs to hand out next */
	uint16_t sq_tail;		   /* next SQ slot to fill */
	uint16_t sq_head;  /* SQ head last reported (checked, not for flow control) */
	uint16_t sq_db;	   /* tail value last written to the doorbell */
	uint16_t sq_qid;   /* qid, right after sq_db: the 32 bits from sq_db are what CQE dw2
			      (SQ head, SQ identifier) says in the usual case */
	uint16_t sq_last;  /* sq_depth - 1 */
	uint16_t cq_head;  /* next CQ entry to look at */
	uint16_t cq_last;  /* cq_depth - 1 */
	uint16_t nfree;	   /* CIDs on the free stack */
	uint16_t cid_mask; /* slots - 1: the index bits of a CID */
	/* Read by reap once per call. */
	uint16_t ncids;
	uint8_t phase; /* phase tag of new entries at cq_head */
	uint8_t flags;
	/* Cold. */
	uint8_t closed; /* upcie_nvme_qpair_stop() without keep: CIDs not handed out */
	uint16_t qid;
	uint16_t keep_from;  /* upcie_nvme_qpair_stop(): first SQ slot of the kept commands */
	uint32_t ncancelled; /* cancelled CIDs waiting for a late completion or reclaim */
	uint32_t clock_khz;  /* deadline clock rate (cfg.clock_khz; never 0) */
	uint64_t nbad;	     /* completions for CIDs not outstanding (reap returned -EPROTO) */
	uint64_t ndup;	     /* ... of which repeated the last completion of their slot */
	uint64_t nlate;	     /* completions of cancelled commands, consumed silently */
	uint64_t nbad_sqhd;  /* completions whose SQ head went backwards or past the tail */
	uint64_t nbad_sqid;  /* completions naming another SQ (counted, logged) */
	void *tables_owned;  /* malloc'd CID tables, freed by fini */
};

/* CID slots for `ncids` CIDs: the next power of two above ncids (a CID's masked bits address
 * them all; slot `mask` is never used, so no CID is FFFFh). */
UPCIE_HD static inline uint32_t upcie_nvme_qpair_nslots_(uint32_t ncids)
{
	uint32_t n = 1;

	while (n <= ncids)
		n <<= 1;
	return n;
}

/* Bytes of CID tables (slots and free stack) for `ncids` CIDs. */
static inline size_t upcie_nvme_qpair_tables_size(uint32_t ncids)
{
	size_t n = (size_t)upcie_nvme_qpair_nslots_(ncids) * sizeof(struct upcie_nvme_cid_slot) +
		   (size_t)ncids * 2;

	return (n + 15) & ~(size_t)15;
}

/*
 * Point `qp` at a copy of its CID tables at `base` (same layout; for a queue pair whose state
 * was set up in one address space and copied into another, such as GPU memory).
 */
static inline void upcie_nvme_qpair_tables_rebase(struct upcie_nvme_qpair *qp, void *base)
{
	qp->slots = (struct upcie_nvme_cid_slot *)base;
	qp->cid_free = (uint16_t *)(qp->slots + (uint32_t)qp->cid_mask + 1);
}

/* The slot of `cid` (masked: any 16-bit value addresses the table). */
UPCIE_HD static inline struct upcie_nvme_cid_slot *
upcie_nvme_qpair_slot_(const struct upcie_nvme_qpair *qp, uint32_t cid)
{
	return &qp->slots[cid & qp->cid_mask];
}

/* The CID after `cid` in its slot: the generation (the bits above the index) advances; the
 * carry out of bit 15 drops. */
UPCIE_HD static inline uint16_t upcie_nvme_qpair_cid_next_(const struct upcie_nvme_qpair *qp,
							   uint32_t cid)
{
	return (uint16_t)(cid + qp->cid_mask + 1u);
}

/*
 * Set up `qp` over the rings and doorbells in `cfg`. Zeroes the CQ (unless
 * UPCIE_NVME_QPAIR_NO_CQ_CLEAR) and starts with SQ tail and CQ head 0, phase 1, matching a
 * queue the controller just created. Returns 0, -EINVAL for a bad config, -ENOMEM.
 */
static inline int upcie_nvme_qpair_init(struct upcie_nvme_qpair *qp,
					const struct upcie_nvme_qpair_cfg *cfg)
{
	uint32_t cq_depth, ncids, nslots;
	void *tables;

	if (!qp || !cfg)
		return UPCIE_FAIL(-EINVAL, "nvme: qpair: no qpair or config");
	memset(qp, 0, sizeof(*qp));
	cq_depth = cfg->cq_depth ? cfg->cq_depth : cfg->sq_depth;
	ncids = cfg->ncids;
	if (!ncids) {
		ncids = cq_depth - 1 < cfg->sq_depth - 1 ? cq_depth - 1 : cfg->sq_depth - 1;
		if (ncids > UPCIE_NVME_QPAIR_MAX_CIDS)
			ncids = UPCIE_NVME_QPAIR_MAX_CIDS;
	}
	if (!cfg->sq || !cfg->cq || !cfg->sqdb || !cfg->cqdb)
		return UPCIE_FAIL(-EINVAL, "nvme: qpair %u: missing ring or doorbell", cfg->qid);
	if (((uintptr_t)cfg->sq | (uintptr_t)cfg->cq | (uintptr_t)cfg->tables) & 15)
		return UPCIE_FAIL(
		    -EINVAL, "nvme: qpair %u: rings and tables need 16-byte alignment", cfg->qid);
	if (cfg->sq_depth < 2 || cfg->sq_depth > 65536 || cq_depth < 2 || cq_depth > 65536)
		return UPCIE_FAIL(-EINVAL, "nvme: qpair %u: depth sq %u cq %u outside 2..65536",
				  cfg->qid, cfg->sq_depth, cq_depth);
	if (ncids > cq_depth - 1 || ncids > cfg->sq_depth - 1 || ncids > UPCIE_NVME_QPAIR_MAX_CIDS)
		return UPCIE_FAIL(-EINVAL,
				  "nvme: qpair %u: %u CIDs exceed SQ depth %u - 1, CQ depth %u - 1 "
				  "or %u",
				  cfg->qid, ncids, cfg->sq_depth, cq_depth,
				  UPCIE_NVME_QPAIR_MAX_CIDS);
	nslots = upcie_nvme_qpair_nslots_(ncids);
	tables = cfg->tables;
	if (!tables) {
		tables = aligned_alloc(16, upcie_nvme_qpair_tables_size(ncids));
		if (!tables)
			return UPCIE_FAIL(-ENOMEM, "nvme: qpair %u: no memory for %u CIDs",
					  cfg->qid, ncids);
		qp->tables_owned = tables;
	}
	qp->cid_mask = (uint16_t)(nslots - 1);
	upcie_nvme_qpair_tables_rebase(qp, tables);
	memset(qp->slots, 0, nslots * sizeof(*qp->slots));
	for (uint32_t i = 0; i < nslots; i++)
		qp->slots[i].tag = UPCIE_NVME_CID_UNUSED_;
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
	qp->sq_qid = cfg->qid;
	qp->flags = (uint8_t)cfg->flags;
	qp->clock_khz = cfg->clock_khz ? cfg->clock_khz : UPCIE_NVME_PORT_NS_KHZ;
	if (!(cfg->flags & UPCIE_NVME_QPAIR_NO_CQ_CLEAR))
		memset(cfg->cq, 0, (size_t)cq_depth * sizeof(struct upcie_nvme_cqe));
	return 0;
}

/* The slot index of `cid` (0..ncids - 1 for a CID this queue pair handed out): for per-command
 * resources such as PRP list pages. */
UPCIE_HD static inline uint32_t upcie_nvme_qpair_cid_index(const struct upcie_nvme_qpair *qp,
							   uint16_t cid)
{
	return cid & qp->cid_mask;
}

/*
 * The CID the next successful enqueue will assign (to pick per-command resources such as PRP
 * list pages before building the command: index them with upcie_nvme_qpair_cid_index()). Valid
 * until the next enqueue, reap, cancel or reclaim. Returns 0, or -EBUSY when no CID is free.
 */
UPCIE_HD static inline int upcie_nvme_qpair_next_cid(const struct upcie_nvme_qpair *qp,
						     uint16_t *cid)
{
	if (!qp->nfree)
		return -EBUSY;
	*cid = qp->cid_free[qp->nfree - 1];
	return 0;
}

/* The SQ tail after one more command (0..sq_last), or -EBUSY when no CID is free (the SQ
 * slot is then free too: see flow control above). */
UPCIE_HD static inline int upcie_nvme_qpair_next_tail_(const struct upcie_nvme_qpair *qp)
{
	uint16_t next = (uint16_t)(qp->sq_tail + 1);

	if (UPCIE_UNLIKELY(qp->sq_tail == qp->sq_last))
		next = 0;
	if (UPCIE_UNLIKELY(!qp->nfree))
		return -EBUSY;
	return next;
}

/* Give the command going into the next SQ slot a CID with callback cb and context ctx. */
UPCIE_HD static inline uint16_t upcie_nvme_qpair_take_(struct upcie_nvme_qpair *qp,
						       upcie_nvme_cpl_fn cb, void *ctx)
{
	uint32_t top = qp->nfree - 1u; /* the caller checked nfree >= 1 */
	uint16_t c = qp->cid_free[top];
	struct upcie_nvme_cid_slot *slot = &qp->slots[c & qp->cid_mask];

	qp->nfree = (uint16_t)top;
	slot->cb = cb;
	slot->ctx = ctx;
	slot->tag = cb ? c : c | UPCIE_NVME_CID_NOCB_;
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
	uint32_t tail = qp->sq_tail;

	if (tail != qp->sq_db) {
		upcie_nvme_port_wmb();
		upcie_nvme_port_doorbell(qp->sqdb, tail);
		qp->sq_db = (uint16_t)tail;
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

/*
 * Hold a CID for a command that goes into the SQ later (upcie_nvme_qpair_send_held_()), taking
 * it only when it is the next generation of slot `index` (the CID a callback of that slot just
 * freed is on top of the free stack), so the command keeps its slot's per-CID resources (list
 * pages, a shadow copy). The held command is outstanding (inflight, cancel, stop and fini end it
 * with -ECANCELED) but has no SQ entry: a completion naming it is refused as not outstanding.
 * Returns 0 (the CID in *cid), -EBUSY (no CID free, or the top one is another slot's).
 */
UPCIE_HD static inline int upcie_nvme_qpair_hold_(struct upcie_nvme_qpair *qp, uint32_t index,
						  upcie_nvme_cpl_fn cb, void *ctx, uint16_t *cid)
{
	uint16_t c;

	if (!qp->nfree || (qp->cid_free[qp->nfree - 1] & qp->cid_mask) != index)
		return -EBUSY;
	c = upcie_nvme_qpair_take_(qp, cb, ctx);
	qp->slots[c & qp->cid_mask].tag |= UPCIE_NVME_CID_HELD_;
	*cid = c;
	return 0;
}

/*
 * Put held command `cid` into the next SQ slot (`sqe`, its CID field set here). There is always
 * an SQ slot for it: a held CID counts against the CIDs, which are fewer than the SQ slots.
 * Not visible to the controller until upcie_nvme_qpair_ring(). Returns 0, -ENOENT when `cid` is
 * not held (it was cancelled, or the queue pair stopped).
 */
UPCIE_HD static inline int upcie_nvme_qpair_send_held_(struct upcie_nvme_qpair *qp, uint16_t cid,
						       const struct upcie_nvme_sqe *sqe)
{
	struct upcie_nvme_cid_slot *slot = upcie_nvme_qpair_slot_(qp, cid);
	uint16_t tail = qp->sq_tail;

	if ((slot->tag & ~UPCIE_NVME_CID_NOCB_) != (cid | UPCIE_NVME_CID_HELD_))
		return -ENOENT;
	slot->tag &= ~UPCIE_NVME_CID_HELD_;
	upcie_nvme_port_sqe_store(&qp->sq[tail], sqe, cid);
	qp->sq_tail = (uint16_t)(tail == qp->sq_last ? 0 : tail + 1);
	return 0;
}

/*
 * Free the slot of `cid` (its command ended): the tag keeps the CID, so a repeat of this
 * completion is recognised, and the next command of the slot gets the next generation.
 */
UPCIE_HD static inline void upcie_nvme_qpair_cid_put_(struct upcie_nvme_qpair *qp,
						      struct upcie_nvme_cid_slot *slot,
						      uint16_t cid)
{
	slot->tag = cid | UPCIE_NVME_CID_FREE_;
	qp->cid_free[qp->nfree++] = upcie_nvme_qpair_cid_next_(qp, cid);
}

/*
 * Free held command `cid` without a callback (its owner ends it another way). Returns 0,
 * -ENOENT when `cid` is not held.
 */
UPCIE_HD static inline int upcie_nvme_qpair_drop_held_(struct upcie_nvme_qpair *qp, uint16_t cid)
{
	struct upcie_nvme_cid_slot *slot = upcie_nvme_qpair_slot_(qp, cid);

	if ((slot->tag & ~UPCIE_NVME_CID_NOCB_) != (cid | UPCIE_NVME_CID_HELD_))
		return -ENOENT;
	if (qp->closed)
		slot->tag = cid | UPCIE_NVME_CID_FREE_; /* not handed out before restart */
	else
		upcie_nvme_qpair_cid_put_(qp, slot, cid);
	return 0;
}

/*
 * A completion the queue pair refuses (what=0: CID not outstanding, 1: SQ head outside the
 * window; 2: it names another SQ, counted only). Logged on the host when the count is a power of two: a device flooding the CQ costs
 * a handful of lines. Device code only counts.
 */
#if defined(UPCIE_NVME_PORT_CUDA_DEVICE) || defined(UPCIE_NVME_PORT_HIP_DEVICE)
UPCIE_HD static inline void upcie_nvme_qpair_refused_(const struct upcie_nvme_qpair *qp, int what,
						      uint32_t v, uint64_t count)
{
	(void)qp;
	(void)what;
	(void)v;
	(void)count;
}
#else
UPCIE_COLD_CALL __attribute__((noinline, cold, unused)) UPCIE_HD static void
upcie_nvme_qpair_refused_(const struct upcie_nvme_qpair *qp, int what, uint32_t v, uint64_t count)
{
	if (count & (count - 1))
		return;
	if (what == 0)
		UPCIE_WARN(
		    "nvme: queue %u: completion for CID 0x%04x, which is %s: ignored (%" PRIu64
		    " so far)",
		    qp->qid, v & 0xffff,
		    upcie_nvme_qpair_cid_index(qp, (uint16_t)v) >= qp->ncids ? "out of range"
		    : v >> 16						     ? "a duplicate"
									     : "not outstanding",
		    count);
	else if (what == 1)
		UPCIE_WARN("nvme: queue %u: completion reports SQ head %u outside %u..%u: ignored "
			   "(%" PRIu64 " so far)",
			   qp->qid, v, qp->sq_head, qp->sq_db, count);
	else
		UPCIE_WARN("nvme: queue %u: completion names SQ %u, not this queue: ignored "
			   "(%" PRIu64 " so far)",
			   qp->qid, v, count);
}
#endif

/* An SQ head outside the window: counted, logged at counts 1, 2, 4, ... (out of line). */
#if defined(UPCIE_NVME_PORT_CUDA_DEVICE) || defined(UPCIE_NVME_PORT_HIP_DEVICE)
UPCIE_HD static inline void upcie_nvme_qpair_sqhd_bad_(struct upcie_nvme_qpair *qp, uint32_t sqhd)
{
	(void)sqhd;
	qp->nbad_sqhd++;
}
#else
UPCIE_COLD_CALL __attribute__((noinline, cold, unused)) UPCIE_HD static void
upcie_nvme_qpair_sqhd_bad_(struct upcie_nvme_qpair *qp, uint32_t sqhd)
{
	qp->nbad_sqhd++;
	upcie_nvme_qpair_refused_(qp, 1, sqhd, qp->nbad_sqhd);
}
#endif

/* A completion naming another SQ: counted in nbad_sqid, logged at counts 1, 2, 4, ... (out of
 * line). */
#if defined(UPCIE_NVME_PORT_CUDA_DEVICE) || defined(UPCIE_NVME_PORT_HIP_DEVICE)
UPCIE_HD static inline void upcie_nvme_qpair_sqid_bad_(struct upcie_nvme_qpair *qp, uint32_t sqid)
{
	(void)sqid;
	qp->nbad_sqid++;
}
#else
UPCIE_COLD_CALL __attribute__((noinline, cold, unused)) UPCIE_HD static void
upcie_nvme_qpair_sqid_bad_(struct upcie_nvme_qpair *qp, uint32_t sqid)
{
	qp->nbad_sqid++;
	upcie_nvme_qpair_refused_(qp, 2, sqid, qp->nbad_sqid);
}
#endif

/*
 * The SQ head a completion reports (sqhd) against the last one (h): taken when it lies between
 * h and the tail the host rang (the controller cannot have fetched further, nor go back),
 * counted otherwise. Most often the controller has fetched all that was rung: sqhd is that
 * tail. Else, in 16-bit arithmetic, sqhd - h <= db - h is exactly the window, wrapping or not,
 * for any sqhd within the ring; one above the ring passes it only when the window wraps, hence
 * the last test.
 */
UPCIE_HD static inline void upcie_nvme_qpair_sqhd_(struct upcie_nvme_qpair *qp, uint32_t dw2)
{
	uint16_t h = qp->sq_head, db = qp->sq_db, sqhd = (uint16_t)dw2;

	uint32_t rung;

	/* the usual case, both halves of dw2 in one compare: all that was rung fetched, own SQ
	 * (sq_db and sq_qid side by side; on a big-endian host this never matches: the checks
	 * below) */
	memcpy(&rung, &qp->sq_db, sizeof(rung));
	if (UPCIE_LIKELY(dw2 == rung)) {
		qp->sq_head = sqhd;
		return;
	}
	if (sqhd == db || ((uint16_t)(sqhd - h) <= (uint16_t)(db - h) && sqhd <= qp->sq_last))
		qp->sq_head = sqhd;
	else
		upcie_nvme_qpair_sqhd_bad_(qp, sqhd);
	if (UPCIE_UNLIKELY((uint16_t)(dw2 >> 16) != qp->sq_qid))
		upcie_nvme_qpair_sqid_bad_(qp, dw2 >> 16);
}

/* Step *head past the CQ entry there, flipping the phase on a wrap (in qp->phase right away, and
 * in *phase16, the copy at bit 16 where dw3 has it). */
UPCIE_HD static inline void upcie_nvme_qpair_cq_step_(struct upcie_nvme_qpair *qp, uint16_t *head,
						      uint32_t *phase16)
{
	if (UPCIE_UNLIKELY(*head == qp->cq_last)) {
		*head = 0;
		*phase16 ^= 1u << 16;
		qp->phase ^= 1u;
	} else {
		(*head)++;
	}
}

/*
 * Process up to `max` new completions: call each command's callback and free its CID, then
 * write the CQ head doorbell once. Returns the number of commands completed (0 when none was
 * ready), or -EPROTO when the first new entry names a CID that is not outstanding (out of range,
 * never submitted, already completed, an older generation of its slot): that entry is consumed
 * and counted in qp->nbad (a bad entry after good ones ends the batch; the next call reports
 * it). An entry naming another SQ (CQE SQID; each SQ here has a CQ of its own) is counted in
 * qp->nbad_sqid and logged, and otherwise taken by its CID, as a wrong SQ head is. A late
 * completion of a cancelled command is consumed silently (qp->nlate) and frees its CID. An SQ
 * head outside the window is ignored (qp->nbad_sqhd).
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
		uint32_t tag;

		if (x & (1u << 16))
			break;
		upcie_nvme_port_dma_rmb();
		/* The index is masked: whatever the device wrote, it addresses the table. */
		slot = upcie_nvme_qpair_slot_(qp, cid);
		tag = slot->tag;
		if (UPCIE_UNLIKELY(tag != cid)) {
			uint32_t state = tag ^ cid;

			/* the slot's command with a state bit set: late, no callback, or stopping */
			if (state == UPCIE_NVME_CID_CANCELLED_ || state == UPCIE_NVME_CID_NOCB_ ||
			    state == (UPCIE_NVME_CID_NOCB_ | UPCIE_NVME_CID_STOP_)) {
				cqe = upcie_nvme_port_cqe_view(&copy, e, x ^ phase16);
				upcie_nvme_qpair_cq_step_(qp, &head, &phase16);
				upcie_nvme_qpair_sqhd_(qp, cqe->dw2);
				if (state == UPCIE_NVME_CID_CANCELLED_) {
					qp->ncancelled--;
					qp->nlate++;
				} else {
					n++; /* no callback */
				}
				upcie_nvme_qpair_cid_put_(qp, slot, cid);
				continue;
			}
			if (state != UPCIE_NVME_CID_STOP_) {
				/* A bad entry after good ones ends the batch; the next call reports
				 * it. Its SQ head is not trusted. */
				if (n > 0)
					break;
				upcie_nvme_qpair_cq_step_(qp, &head, &phase16);
				qp->nbad++;
				qp->ndup += state == UPCIE_NVME_CID_FREE_;
				upcie_nvme_qpair_refused_(
				    qp, 0, cid | (state == UPCIE_NVME_CID_FREE_ ? 0x10000u : 0),
				    qp->nbad);
				ret = -EPROTO;
				goto moved; /* consumed: the head moved, or came full circle */
			}
			/* outstanding when a stop began: completes normally */
		}
		cqe = upcie_nvme_port_cqe_view(&copy, e, x ^ phase16);
		upcie_nvme_qpair_cq_step_(qp, &head, &phase16);
		upcie_nvme_qpair_sqhd_(qp, cqe->dw2);
		cb = slot->cb;
		ctx = slot->ctx;
		/* Free the CID before the callback, which may submit again (a new generation). */
		upcie_nvme_qpair_cid_put_(qp, slot, cid);
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
	/*
	 * One doorbell write for the batch (qp->phase already follows every wrap). The entries'
	 * loads (the callbacks' too) complete before the controller may reuse them.
	 */
	qp->cq_head = head;
	upcie_nvme_port_cq_release();
	upcie_nvme_port_doorbell(qp->cqdb, head);
	return ret;
}

/* Commands outstanding: enqueued and neither completed nor cancelled. */
UPCIE_HD static inline uint32_t upcie_nvme_qpair_inflight(const struct upcie_nvme_qpair *qp)
{
	return (uint32_t)qp->ncids - qp->nfree - qp->ncancelled;
}

/* Whether `tag` is that of an outstanding command (with or without callback, stopping or not). */
UPCIE_HD static inline bool upcie_nvme_qpair_tag_outstanding_(uint32_t tag)
{
	return !(tag & (UPCIE_NVME_CID_CANCELLED_ | UPCIE_NVME_CID_FREE_));
}

/* Whether `tag` is that of a held command (upcie_nvme_qpair_hold_(), not sent yet). */
UPCIE_HD static inline bool upcie_nvme_qpair_tag_held_(uint32_t tag)
{
	return upcie_nvme_qpair_tag_outstanding_(tag) && (tag & UPCIE_NVME_CID_HELD_);
}

/* The slot of outstanding command `cid`, or NULL (out of range: *range set; not outstanding). */
UPCIE_HD static inline struct upcie_nvme_cid_slot *
upcie_nvme_qpair_find_(const struct upcie_nvme_qpair *qp, uint16_t cid, bool *range)
{
	struct upcie_nvme_cid_slot *s = upcie_nvme_qpair_slot_(qp, cid);

	*range = upcie_nvme_qpair_cid_index(qp, cid) >= qp->ncids;
	if (*range || (s->tag & 0xffffu) != cid || !upcie_nvme_qpair_tag_outstanding_(s->tag))
		return (struct upcie_nvme_cid_slot *)0;
	return s;
}

UPCIE_HD static inline bool upcie_nvme_qpair_cid_outstanding_(const struct upcie_nvme_qpair *qp,
							      uint16_t cid)
{
	bool range;

	return upcie_nvme_qpair_find_(qp, cid, &range) != 0;
}

/* Commands that can be enqueued right now: the free CIDs (each has a free SQ slot). A request
 * that needs n commands fits when this is at least n. */
UPCIE_HD static inline uint32_t upcie_nvme_qpair_room(const struct upcie_nvme_qpair *qp)
{
	return qp->nfree;
}

/*
 * The context outstanding command `cid` was enqueued with, into *ctx. Returns 0, -EINVAL for a
 * CID out of range, -ENOENT when `cid` is not outstanding (completed, cancelled, or an older
 * command of its slot). (To find the commands of one request after a timeout.)
 */
UPCIE_HD static inline int upcie_nvme_qpair_cid_ctx(const struct upcie_nvme_qpair *qp, uint16_t cid,
						    void **ctx)
{
	bool range;
	const struct upcie_nvme_cid_slot *s = upcie_nvme_qpair_find_(qp, cid, &range);

	if (range)
		return -EINVAL;
	if (!s)
		return -ENOENT;
	*ctx = s->ctx;
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
		uint32_t tag = qp->slots[c].tag;

		if (!upcie_nvme_qpair_tag_outstanding_(tag))
			continue;
		if (n < max)
			cids[n] = (uint16_t)tag;
		n++;
	}
	return (int)n;
}

/* End the command of `slot` (outstanding) with -ECANCELED and a synthesized completion. */
UPCIE_HD static inline void upcie_nvme_qpair_cancel_(struct upcie_nvme_qpair *qp,
						     struct upcie_nvme_cid_slot *slot, bool reserve)
{
	struct upcie_nvme_cqe cqe;
	upcie_nvme_cpl_fn cb = slot->cb;
	void *ctx = slot->ctx;
	uint16_t cid = (uint16_t)slot->tag;
	bool nocb = slot->tag & UPCIE_NVME_CID_NOCB_;

	/* a held command never reached the controller: no late completion to wait for */
	if (slot->tag & UPCIE_NVME_CID_HELD_)
		reserve = false;
	if (reserve) {
		slot->tag = cid | UPCIE_NVME_CID_CANCELLED_;
		qp->ncancelled++;
	} else if (qp->closed) {
		slot->tag =
		    cid | UPCIE_NVME_CID_FREE_; /* free, but not handed out before restart */
	} else {
		upcie_nvme_qpair_cid_put_(qp, slot, cid);
	}
	cqe.dw0 = 0;
	cqe.dw1 = 0;
	cqe.dw2 = qp->sq_head | ((uint32_t)qp->qid << 16);
	cqe.dw3 = upcie_nvme_cqe_dw3_make(cid, 0, UPCIE_NVME_SC_ABORT_REQ, true);
	if (!nocb)
		cb(ctx, &cqe, -ECANCELED);
}

/*
 * End outstanding command `cid` now: its callback runs once, with err -ECANCELED and a
 * synthesized CQE (status Command Abort Requested, DNR set). The CID stays reserved until the
 * controller's late completion arrives (consumed silently by reap) or upcie_nvme_qpair_reclaim()
 * is called once the controller can no longer complete it (queue deleted, controller reset);
 * so a late completion can never be taken for a newer command. The controller may still be
 * executing the command: its memory stays the controller's until it completes it late, or
 * has let go of the queue. Returns 0, -EINVAL for a CID out of range, -ENOENT when `cid` is
 * not outstanding.
 */
UPCIE_HD static inline int upcie_nvme_qpair_cancel(struct upcie_nvme_qpair *qp, uint16_t cid)
{
	bool range;
	struct upcie_nvme_cid_slot *s = upcie_nvme_qpair_find_(qp, cid, &range);

	if (range)
		return -EINVAL;
	if (!s)
		return -ENOENT;
	upcie_nvme_qpair_cancel_(qp, s, true);
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
		struct upcie_nvme_cid_slot *s = &qp->slots[c];

		if (!(s->tag & UPCIE_NVME_CID_CANCELLED_) || (s->tag & UPCIE_NVME_CID_FREE_))
			continue;
		upcie_nvme_qpair_cid_put_(qp, s, (uint16_t)s->tag);
		qp->ncancelled--;
		n++;
	}
	return n;
}

/*
 * Reap until command `cid` has completed or been cancelled, or `timeout_ns` passed
 * (UINT64_MAX: no limit), counted on upcie_nvme_port_clock() at qp->clock_khz. Spins; never
 * sleeps. Other completions are processed on the way; bad entries (-EPROTO) are counted in
 * qp->nbad and do not end the wait. A callback that submits meanwhile may get `cid`'s slot,
 * never `cid` itself. Returns 0, -EINVAL for a CID out of range, -ETIMEDOUT (the command is
 * still outstanding: abort and cancel it, see upcie_nvme_qpair_outstanding()).
 */
UPCIE_HD static inline int upcie_nvme_qpair_wait(struct upcie_nvme_qpair *qp, uint16_t cid,
						 uint64_t timeout_ns)
{
	uint64_t start = upcie_nvme_port_clock();
	uint64_t ticks = upcie_nvme_port_ticks(timeout_ns, qp->clock_khz);

	if (upcie_nvme_qpair_cid_index(qp, cid) >= qp->ncids)
		return -EINVAL;
	for (;;) {
		if (upcie_nvme_qpair_reap(qp, 0xffffffffu) == 0)
			upcie_nvme_port_relax();
		if (!upcie_nvme_qpair_cid_outstanding_(qp, cid))
			return 0;
		/* Checked every round, so other commands' traffic cannot postpone the deadline. */
		if (upcie_nvme_port_clock() - start >= ticks)
			return -ETIMEDOUT;
	}
}

/* As upcie_nvme_qpair_wait() until no command is outstanding. */
UPCIE_HD static inline int upcie_nvme_qpair_drain(struct upcie_nvme_qpair *qp, uint64_t timeout_ns)
{
	uint64_t start = upcie_nvme_port_clock();
	uint64_t ticks = upcie_nvme_port_ticks(timeout_ns, qp->clock_khz);

	for (;;) {
		if (upcie_nvme_qpair_reap(qp, 0xffffffffu) == 0)
			upcie_nvme_port_relax();
		if (!upcie_nvme_qpair_inflight(qp))
			return 0;
		if (upcie_nvme_port_clock() - start >= ticks)
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
 * to *cqe (may be NULL; on timeout it receives the synthesized abort completion). Returns 0 on
 * success, -EIO when the controller completed it with an error status (see *cqe), -EBUSY when
 * the queue pair is full, -ETIMEDOUT when no completion came: the command is then cancelled
 * here (its CID, in *cid when not NULL, stays reserved until a late completion or reclaim), but
 * the controller may still be executing it: the memory the command names stays the
 * controller's until a late completion (qp->nlate) or the controller let go of the queue. The
 * controller layer (nvme/ctrl.h) aborts, and resets when an abort does not end it.
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
 * Refuse new commands (-EBUSY: no CID free) until upcie_nvme_qpair_restart(), which rebuilds the
 * free stack: CIDs freed meanwhile are not handed out, so a callback cannot keep the queue
 * pair going.
 */
static inline void upcie_nvme_qpair_close_(struct upcie_nvme_qpair *qp)
{
	qp->closed = 1;
	qp->nfree = 0;
	qp->keep_from = qp->sq_tail; /* nothing kept */
}

/*
 * The controller let go of this queue pair: it was disabled (CC.EN = 0 and CSTS.RDY = 0) or gone,
 * or its SQ and CQ were deleted, so it neither fetches, completes nor writes anything of it any
 * more. Process the completions still in the CQ (callbacks with err 0), then end every command
 * still outstanding with -ECANCELED and free every CID, cancelled ones included. With `keep`,
 * commands that callbacks enqueue meanwhile are kept, not ended: they wait, from the start of
 * the ring, for upcie_nvme_qpair_restart() on the recreated queue (a controller reset; to drop
 * them instead, stop again without keep). Without `keep`, the queue pair refuses new commands
 * (-EBUSY) until a restart, so callbacks cannot keep it going. Host code. Returns the number of
 * commands ended with -ECANCELED.
 */
static inline int upcie_nvme_qpair_stop(struct upcie_nvme_qpair *qp, bool keep)
{
	uint16_t from = qp->sq_tail;
	int n = 0;

	if (!qp->slots)
		return 0;
	for (uint32_t c = 0; c < qp->ncids; c++)
		if (upcie_nvme_qpair_tag_outstanding_(qp->slots[c].tag))
			qp->slots[c].tag |= UPCIE_NVME_CID_STOP_;
	while (upcie_nvme_qpair_reap(qp, 0xffffffffu) != 0)
		; /* -EPROTO entries are counted and skipped */
	upcie_nvme_qpair_reclaim(qp);
	if (!keep) {
		upcie_nvme_qpair_close_(qp);
	} else {
		/* nothing before `from` will be fetched: the kept commands start there */
		qp->sq_head = from;
		qp->keep_from = from;
	}
	for (uint32_t c = 0; c < qp->ncids; c++) {
		struct upcie_nvme_cid_slot *s = &qp->slots[c];

		if (!upcie_nvme_qpair_tag_outstanding_(s->tag) ||
		    (keep && !(s->tag & UPCIE_NVME_CID_STOP_)))
			continue;
		s->tag &= ~UPCIE_NVME_CID_STOP_;
		upcie_nvme_qpair_cancel_(qp, s, false);
		n++;
	}
	return n;
}

/*
 * Start over on the recreated queue (the controller starts with SQ head = tail = 0 and an
 * empty CQ): the commands kept by upcie_nvme_qpair_stop() move to the start of the SQ ring, with
 * their CIDs and callbacks; every other CID is free (its next generation); CQ zeroed (unless
 * UPCIE_NVME_QPAIR_NO_CQ_CLEAR), phase 1. Call after upcie_nvme_qpair_stop(), before the queue
 * is created on the controller; ring after. Host code. Returns the number of commands waiting
 * for the ring, or -ENOMEM (nothing changed).
 */
static inline int upcie_nvme_qpair_restart(struct upcie_nvme_qpair *qp)
{
	uint32_t depth = (uint32_t)qp->sq_last + 1;
	uint32_t k = (qp->sq_tail + depth - qp->keep_from) % depth;
	uint32_t nfree = 0;

	if (k && qp->keep_from) {
		/* through a copy: source and destination may overlap, in either direction */
		struct upcie_nvme_sqe *tmp =
		    (struct upcie_nvme_sqe *)malloc((size_t)k * sizeof(*tmp));

		if (!tmp)
			return UPCIE_FAIL(-ENOMEM, "nvme: qpair %u: out of memory", qp->qid);
		for (uint32_t i = 0; i < k; i++)
			tmp[i] = qp->sq[(qp->keep_from + i) % depth];
		memcpy(qp->sq, tmp, (size_t)k * sizeof(*tmp));
		free(tmp);
	}
	/* lowest slot on top, as after init */
	for (uint32_t c = qp->ncids; c-- > 0;) {
		uint32_t tag = qp->slots[c].tag;

		if (upcie_nvme_qpair_tag_outstanding_(tag))
			continue; /* kept */
		qp->cid_free[nfree++] = tag == UPCIE_NVME_CID_UNUSED_
					    ? (uint16_t)c
					    : upcie_nvme_qpair_cid_next_(qp, tag);
		if (tag & UPCIE_NVME_CID_CANCELLED_ && !(tag & UPCIE_NVME_CID_FREE_))
			qp->ncancelled--;
		if (tag != UPCIE_NVME_CID_UNUSED_)
			qp->slots[c].tag = (tag & 0xffffu) | UPCIE_NVME_CID_FREE_;
	}
	qp->nfree = (uint16_t)nfree;
	qp->closed = 0;
	qp->sq_tail = (uint16_t)k;
	qp->sq_head = 0;
	qp->sq_db = 0;
	qp->keep_from = 0;
	qp->cq_head = 0;
	qp->phase = 1;
	if (!(qp->flags & UPCIE_NVME_QPAIR_NO_CQ_CLEAR))
		memset(qp->cq, 0, ((size_t)qp->cq_last + 1) * sizeof(struct upcie_nvme_cqe));
	return (int)k;
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
	upcie_nvme_qpair_close_(qp); /* callbacks cannot enqueue into what is going away */
	for (uint32_t c = 0; c < qp->ncids; c++)
		if (upcie_nvme_qpair_tag_outstanding_(qp->slots[c].tag))
			upcie_nvme_qpair_cancel_(qp, &qp->slots[c], false);
	free(qp->tables_owned);
	memset(qp, 0, sizeof(*qp));
}

#endif /* UPCIE_NVME_QPAIR_H */
