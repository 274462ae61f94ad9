/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * I/O queue pairs of an NVMe controller: queue identifiers, create (memory from any heap, or rings
 * at addresses the caller mapped: upcie_nvme_ioq_create_ext()), delete, interrupts, and the
 * abort of one command or of a set of commands with the wait that follows.
 *
 * I/O queue pairs (struct upcie_nvme_ioq): any depth up to CAP.MQES + 1, memory sized from the
 * depth and taken from any heap (host memory by default, the CMB's heap for a CMB-resident SQ),
 * per-CID PRP list / SGL segment pages, the queue identifier allocated on create and released
 * on delete. Commands go through the queue-pair core (nvme/qpair.h); nvme/ns.h has the I/O
 * helpers. Completions are polled by default; with MSI-X vectors enabled (vfio paths) a queue
 * created with `irq` can sleep on its vector's eventfd instead.
 */
#ifndef UPCIE_NVME_CTRL_IOQ_H
#define UPCIE_NVME_CTRL_IOQ_H

#include <upcie/nvme/ctrl_setup.h>

/* Lowest free queue identifier, or `want` when it is free; 0 when none. Lock held. */
static inline uint16_t upcie_nvme_ctrl_qid_get_(struct upcie_nvme_ctrl *c, uint16_t want)
{
	uint32_t n = c->nqueues < c->nslots ? c->nqueues : c->nslots;

	if (want)
		return want <= n && !c->ioqs[want] ? want : 0;
	for (uint32_t q = 1; q <= n; q++)
		if (!c->ioqs[q])
			return (uint16_t)q;
	return 0;
}

/*
 * Delete SQ (when `sq`) and CQ `q->qid` on the controller. Returns 0 when the controller no
 * longer has them: deleted, or the controller let go of everything (stopped, dead, or reset here
 * because a deletion failed: the queue may still exist then, so only a reset frees its memory).
 * Otherwise the error: the queue memory must stay allocated. Lock held.
 */
static inline int upcie_nvme_ioq_hw_delete_(struct upcie_nvme_ioq *q, bool sq)
{
	struct upcie_nvme_ctrl *c = q->ctrl;
	struct upcie_nvme_sqe sqe;
	int err = 0;

	if (c->stopped)
		return 0;
	if (c->state == UPCIE_NVME_CTRL_READY && !upcie_nvme_ctrl_dead_(c)) {
		if (sq) {
			upcie_nvme_cmd_delete_io_sq(&sqe, q->qid);
			err = upcie_nvme_ctrl_admin_locked_(c, &sqe, NULL, 0, 0, NULL);
			/* completions the deletion produced (commands aborted with the SQ); an
			 * ext queue's belong to whoever drives it */
			if (!err && !q->ext)
				upcie_nvme_qpair_reap(&q->qp, 0xffffffffu);
		}
		if (!err) {
			upcie_nvme_cmd_delete_io_cq(&sqe, q->qid);
			err = upcie_nvme_ctrl_admin_locked_(c, &sqe, NULL, 0, 0, NULL);
		}
		if (!err || c->stopped)
			return err;
		upcie_nvme_ctrl_fail_locked_(c, "deleting an I/O queue failed");
	} else if (c->state == UPCIE_NVME_CTRL_READY) {
		upcie_nvme_ctrl_fail_locked_(c, "dead controller");
	} else {
		/* shut down or failed: no commands, but the queue may exist: reset it */
		upcie_nvme_ctrl_halt_locked_(c);
	}
	if (c->stopped)
		return err;
	return err ? err : -EIO;
}

/* Create CQ then SQ for `q` on the controller (memory and qpair ready). Lock held. */
static inline int upcie_nvme_ioq_hw_create_(struct upcie_nvme_ioq *q)
{
	struct upcie_nvme_ctrl *c = q->ctrl;
	struct upcie_nvme_sqe sqe;
	int err;

	err = upcie_nvme_cmd_create_io_cq(&sqe, q->qid, q->depth, q->cqb.iova, q->irq, q->vector);
	if (!err)
		err = upcie_nvme_ctrl_admin_locked_(c, &sqe, NULL, 0, 0, NULL);
	if (err)
		return UPCIE_FAIL(err, "nvme %s: Create I/O CQ %u (%u entries) failed", c->name,
				  q->qid, q->depth);
	err = upcie_nvme_cmd_create_io_sq(&sqe, q->qid, q->depth, q->sqb.iova, q->qid, 0);
	if (!err)
		err = upcie_nvme_ctrl_admin_locked_(c, &sqe, NULL, 0, 0, NULL);
	if (err) {
		UPCIE_ERR("nvme %s: Create I/O SQ %u (%u entries) failed", c->name, q->qid,
			  q->depth);
		/* the CQ exists: its memory is free only once it is deleted, or once the
		 * controller let go of everything (a failed delete resets it) */
		return upcie_nvme_ioq_hw_delete_(q, false) && !c->stopped ? -EBUSY : err;
	}
	return 0;
}

/* (Re)start the queue pair of `q` on its rings: indices 0, phase 1, CQ zeroed. */
static inline int upcie_nvme_ioq_qpair_start_(struct upcie_nvme_ioq *q)
{
	struct upcie_nvme_ctrl *c = q->ctrl;
	struct upcie_nvme_qpair_cfg qc;

	memset(&qc, 0, sizeof(qc));
	qc.sq = q->sqb.vaddr;
	qc.cq = q->cqb.vaddr;
	qc.sqdb = (volatile uint32_t *)(c->regs + upcie_nvme_sq_tdbl_off(q->qid, c->dstrd));
	qc.cqdb = (volatile uint32_t *)(c->regs + upcie_nvme_cq_hdbl_off(q->qid, c->dstrd));
	qc.sq_depth = q->depth;
	qc.qid = q->qid;
	qc.tables = q->tables;
	return upcie_nvme_qpair_init(&q->qp, &qc);
}

/*
 * Give back the memory and the identifier of `q` (its commands end with -ECANCELED: the
 * controller must not have the queue any more). Without `mem` the queue memory is not given
 * back: the controller kept a queue on it that could not be deleted. Lock held.
 */
static inline void upcie_nvme_ioq_release_(struct upcie_nvme_ioq *q, bool mem)
{
	struct upcie_nvme_ctrl *c = q->ctrl;

	upcie_nvme_qpair_fini(&q->qp);
	if (!mem)
		UPCIE_ERR("nvme %s: I/O queue %u: its memory stays allocated (the controller may "
			  "still use it)",
			  c ? c->name : "?", q->qid);
	if (mem && q->sqb.size)
		upcie_heap_free(q->sq_heap, q->sqb.off);
	if (mem && q->cqb.size)
		upcie_heap_free(q->cq_heap, q->cqb.off);
	if (mem && q->lb.size)
		upcie_heap_free(q->list_heap, q->lb.off);
	free(q->tables);
	free(q->shadow);
	free(q->retry);
	if (c && c->ioqs && q->qid && q->qid <= c->nslots && c->ioqs[q->qid] == q)
		c->ioqs[q->qid] = NULL;
	memset(q, 0, sizeof(*q));
}

/*
 * What CMBSZ and CMBLOC allow for the queue's memory in the CMB: CQs (CMBSZ.CQS) and PRP lists /
 * SGLs (CMBSZ.LISTS) only where supported; with CMBLOC.CDPCILS clear, lists in the CMB only for
 * commands in the CMB. The rest holds by construction: each queue is one physically contiguous
 * range (PC set) of one memory, so it is neither discontiguous (what CQPDS clear forbids) nor
 * partly in the CMB and partly outside (CQMMS clear); it is page aligned (what CQDA clear asks);
 * and a command's list pages come from one memory (CDPMLS clear).
 */
static inline int upcie_nvme_ioq_cmb_check_(const struct upcie_nvme_ioq *q)
{
	const struct upcie_nvme_ctrl *c = q->ctrl;
	const struct upcie_nvme_cmb *m = &c->cmb;
	bool sq = m->on && q->sq_heap == &m->heap, cq = m->on && q->cq_heap == &m->heap;
	bool l = m->on && q->list_heap == &m->heap;

	if (cq && !upcie_nvme_cmbsz_cqs(m->cmbsz))
		return UPCIE_FAIL(-EOPNOTSUPP, "nvme %s: the CMB holds no CQs (CMBSZ.CQS 0)",
				  c->name);
	if (l && !upcie_nvme_cmbsz_lists(m->cmbsz))
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "nvme %s: the CMB holds no PRP lists or SGLs (CMBSZ.LISTS 0)",
				  c->name);
	if (l && !sq && !upcie_nvme_cmbloc_cdpcils(m->cmbloc))
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "nvme %s: PRP lists in the CMB for commands outside it are not "
				  "supported (CMBLOC.CDPCILS 0)",
				  c->name);
	return 0;
}

/*
 * Create an I/O queue pair on `c` as `opts` says (NULL: defaults): memory for SQ, CQ and the
 * per-CID list pages from the given heaps, CQ then SQ created on the controller, the queue pair
 * ready for commands (nvme/ns.h). The caller's thread owns `q` afterwards. An interrupt queue
 * (`irq`) needs a vector of its own: two queues waiting on one eventfd would take each other's
 * wakeups. Returns 0; -EBUSY (the vector wakes another queue already); -EINVAL
 * (depth beyond CAP.MQES + 1, a queue too big for one granule of its memory, an interrupt
 * vector that is not enabled, a CQ heap without CPU view); -EOPNOTSUPP (SGLs asked for but not
 * supported, an admin-only controller); -ENOSPC (every granted queue identifier in use, or the
 * one asked for is); -ENOMEM; or the create commands' errors (-EIO with the status logged).
 * `q` is zeroed on failure and nothing is left allocated.
 */
static inline int upcie_nvme_ioq_create(struct upcie_nvme_ioq *q, struct upcie_nvme_ctrl *c,
					const struct upcie_nvme_ioq_opts *opts)
{
	struct upcie_nvme_ioq_opts def;
	uint64_t page, nprp;
	uint32_t ncids;
	int err;

	if (!q)
		return UPCIE_FAIL(-EINVAL, "nvme: ioq create: NULL queue");
	memset(q, 0, sizeof(*q));
	if (!c || !c->lock_live || c->state != UPCIE_NVME_CTRL_READY)
		return UPCIE_FAIL(-EINVAL, "nvme: ioq create: controller not ready");
	if (!opts) {
		memset(&def, 0, sizeof(def));
		opts = &def;
	}
	q->ctrl = c;
	q->depth = opts->depth ? opts->depth : UPCIE_NVME_IOQ_DEPTH;
	if (!opts->depth && q->depth > c->mqes)
		q->depth = c->mqes;
	if (q->depth < 2 || q->depth > c->mqes || q->depth > 65536)
		return UPCIE_FAIL(-EINVAL, "nvme %s: I/O queue depth %u outside 2..%u (CAP.MQES)",
				  c->name, q->depth, c->mqes);
	if (opts->sgl && !c->sgl)
		return UPCIE_FAIL(-EOPNOTSUPP, "nvme %s: SGLs asked for, but Identify SGLS is 0",
				  c->name);
	if (opts->irq && (!c->irqs.count || opts->vector >= c->irqs.count))
		return UPCIE_FAIL(-EINVAL, "nvme %s: interrupt vector %u not enabled (%u vectors)",
				  c->name, opts->vector, c->irqs.count);
	q->sgl = opts->sgl;
	q->irq = opts->irq;
	q->vector = opts->irq ? opts->vector : 0;
	q->sq_heap = opts->sq_heap ? opts->sq_heap : &c->heap;
	q->cq_heap = opts->cq_heap ? opts->cq_heap : &c->heap;
	q->list_heap = opts->list_heap ? opts->list_heap : &c->heap;
	err = upcie_nvme_ioq_cmb_check_(q);
	if (err) {
		memset(q, 0, sizeof(*q));
		return err;
	}
	page = UINT64_C(1) << c->page_shift;
	q->dptr.page_shift = c->page_shift;
	q->dptr.sgl_dword = c->sgl_dword;
	/* never above MDTS, whatever the caller asked for or the page size is */
	q->dptr.max_bytes = opts->max_xfer ? opts->max_xfer : UPCIE_NVME_IOQ_MAX_XFER;
	if (q->dptr.max_bytes > c->max_xfer)
		q->dptr.max_bytes = c->max_xfer;
	/*
	 * A piece of max_bytes starting anywhere touches max_bytes / page + 1 pages: that many PRP
	 * entries (page / 8 a list page), or as many SGL Data Blocks where each page is its own
	 * device-contiguous run (page / 16 a list page).
	 */
	nprp = q->dptr.max_bytes / page + 1;
	if (q->sgl)
		q->lpages = nprp > 1 ? upcie_nvme_lists_needed_(nprp, (uint32_t)(page / 16)) : 1;
	else
		q->lpages = upcie_nvme_prp_lists_needed(nprp, c->page_shift);
	if (!q->lpages)
		q->lpages = 1;
	ncids = q->depth - 1;

	pthread_mutex_lock(&c->lock);
	if (!c->nqueues) {
		pthread_mutex_unlock(&c->lock);
		memset(q, 0, sizeof(*q));
		return UPCIE_FAIL(-EOPNOTSUPP, "nvme %s: no I/O queues (admin-only controller)",
				  c->name);
	}
	q->qid = upcie_nvme_ctrl_qid_get_(c, opts->qid);
	if (!q->qid) {
		err = opts->qid ? UPCIE_FAIL(-ENOSPC,
					     "nvme %s: queue %u in use or beyond the %u "
					     "granted",
					     c->name, opts->qid, c->nqueues)
				: UPCIE_FAIL(-ENOSPC, "nvme %s: all %u I/O queues in use", c->name,
					     c->nqueues);
		goto fail;
	}
	for (uint32_t k = 1; q->irq && k <= c->nslots; k++)
		if (c->ioqs[k] && c->ioqs[k]->irq && c->ioqs[k]->vector == q->vector) {
			/* one eventfd, two waiters: one would drain the wakeup the other needs */
			err =
			    UPCIE_FAIL(-EBUSY,
				       "nvme %s: MSI-X vector %u already wakes queue %u: give each "
				       "interrupt queue its own vector",
				       c->name, q->vector, k);
			pthread_mutex_unlock(&c->lock);
			memset(q, 0, sizeof(*q));
			return err;
		}
	c->ioqs[q->qid] = q; /* claims the identifier */
	err = upcie_heap_alloc_array(q->cq_heap, 1, (uint64_t)q->depth * 16, page, &q->cqb);
	if (err)
		goto fail;
	err = upcie_heap_alloc_array(q->sq_heap, 1, (uint64_t)q->depth * 64, page, &q->sqb);
	if (err)
		goto fail;
	err = upcie_heap_alloc_array(q->list_heap, (uint64_t)ncids * q->lpages, page, page, &q->lb);
	if (err)
		goto fail;
	if (!q->cqb.vaddr || !q->sqb.vaddr || !q->lb.vaddr) {
		err = UPCIE_FAIL(-EINVAL, "nvme %s: queue memory needs a CPU view", c->name);
		goto fail;
	}
	/* PRP1 of Create I/O CQ/SQ must be aligned to the controller page (CC.MPS); a heap over
	 * memory whose device address is not page aligned cannot give that. (In the CMB,
	 * CMBLOC.CQDA set would allow a dword: page alignment satisfies both settings.) */
	if ((q->cqb.iova | q->sqb.iova) & (page - 1)) {
		err = UPCIE_FAIL(-EINVAL,
				 "nvme %s: queue memory at device addresses 0x%" PRIx64
				 " (CQ) / 0x%" PRIx64 " (SQ) is not aligned to the %" PRIu64
				 "-byte controller page (CC.MPS)",
				 c->name, q->cqb.iova, q->sqb.iova, page);
		goto fail;
	}
	q->lmem = q->list_heap->mem;
	q->loff = q->lb.off;
	q->tables = aligned_alloc(16, upcie_nvme_qpair_tables_size(ncids));
	/* one per CID slot: the index bits of a CID address them (upcie_nvme_qpair_cid_index()) */
	q->shadow = (struct upcie_nvme_sqe *)aligned_alloc(
	    64, (size_t)upcie_nvme_qpair_nslots_(ncids) * sizeof(*q->shadow));
	q->retry =
	    (struct upcie_nvme_retry_ *)calloc(upcie_nvme_qpair_nslots_(ncids), sizeof(*q->retry));
	if (!q->tables || !q->shadow || !q->retry) {
		err = UPCIE_FAIL(-ENOMEM, "nvme %s: out of memory", c->name);
		goto fail;
	}
	err = upcie_nvme_ioq_qpair_start_(q);
	if (err)
		goto fail;
	err = upcie_nvme_ioq_hw_create_(q);
	if (err)
		goto fail;
	q->live = true;
	pthread_mutex_unlock(&c->lock);
	return 0;
fail:
	upcie_nvme_ioq_release_(q, err != -EBUSY);
	pthread_mutex_unlock(&c->lock);
	return err;
}

/*
 * Create, on `c`, a queue pair whose rings the caller placed at device addresses x->sq_iova and
 * x->cq_iova (memory mapped for the controller, which must stay mapped until the queue is
 * deleted) and whose commands are driven elsewhere: this object holds the identifier and the
 * controller's side of the queue, its own queue pair core stays idle. The CQ must be zeroed
 * before the first command (done here through x->cq when given). A reset of the controller
 * does not bring such a queue back: it marks it `lost`, and the driver must stop using it.
 * Delete it with upcie_nvme_ioq_delete(): 0 means the controller confirmed the deletion or let
 * go of everything (then, and only then, the memory may go). Returns 0; -EINVAL (depth, an
 * address not aligned to the controller page); -ENOSPC (no identifier); -ENOMEM; or the create
 * commands' errors. `q` is zeroed on failure; -EBUSY means the CQ could not be deleted again
 * and its memory stays the controller's.
 */
static inline int upcie_nvme_ioq_create_ext(struct upcie_nvme_ioq *q, struct upcie_nvme_ctrl *c,
					    const struct upcie_nvme_ioq_ext *x)
{
	static uint32_t dummy_db[2];
	struct upcie_nvme_qpair_cfg qc;
	uint64_t page;
	int err;

	if (!q)
		return UPCIE_FAIL(-EINVAL, "nvme: ioq create_ext: NULL queue");
	memset(q, 0, sizeof(*q));
	if (!c || !c->lock_live || c->state != UPCIE_NVME_CTRL_READY || !x)
		return UPCIE_FAIL(-EINVAL, "nvme: ioq create_ext: controller not ready");
	page = UINT64_C(1) << c->page_shift;
	if (x->depth < 2 || x->depth > c->mqes || x->depth > 65536)
		return UPCIE_FAIL(-EINVAL, "nvme %s: I/O queue depth %u outside 2..%u (CAP.MQES)",
				  c->name, x->depth, c->mqes);
	if ((x->sq_iova | x->cq_iova) & (page - 1))
		return UPCIE_FAIL(-EINVAL,
				  "nvme %s: queue rings at 0x%" PRIx64 " / 0x%" PRIx64
				  " are not aligned to the %" PRIu64 "-byte controller page",
				  c->name, x->sq_iova, x->cq_iova, page);
	q->ctrl = c;
	q->ext = true;
	q->depth = x->depth;
	q->sqb.iova = x->sq_iova;
	q->cqb.iova = x->cq_iova;
	q->tables = aligned_alloc(16, upcie_nvme_qpair_tables_size(1));
	q->shadow = (struct upcie_nvme_sqe *)aligned_alloc(64, 2 * sizeof(*q->shadow));
	q->retry = (struct upcie_nvme_retry_ *)calloc(2, sizeof(*q->retry));
	if (!q->tables || !q->shadow || !q->retry) {
		free(q->tables);
		free(q->shadow);
		free(q->retry);
		memset(q, 0, sizeof(*q));
		return UPCIE_FAIL(-ENOMEM, "nvme %s: out of memory", c->name);
	}
	if (x->cq)
		memset(x->cq, 0, (size_t)x->depth * sizeof(struct upcie_nvme_cqe));
	/* the idle core: rings it never touches (no CPU view needed), doorbells it never rings */
	memset(&qc, 0, sizeof(qc));
	qc.sq = x->sq ? x->sq : (void *)dummy_db;
	qc.cq = x->cq ? x->cq : (void *)dummy_db;
	qc.sqdb = &dummy_db[0];
	qc.cqdb = &dummy_db[1];
	qc.sq_depth = x->depth;
	qc.ncids = 1;
	qc.tables = q->tables;
	qc.flags = UPCIE_NVME_QPAIR_NO_CQ_CLEAR;

	pthread_mutex_lock(&c->lock);
	if (!c->nqueues) {
		err = UPCIE_FAIL(-EOPNOTSUPP, "nvme %s: no I/O queues (admin-only controller)",
				 c->name);
		goto fail;
	}
	q->qid = upcie_nvme_ctrl_qid_get_(c, x->qid);
	if (!q->qid) {
		err = UPCIE_FAIL(-ENOSPC, "nvme %s: no free I/O queue identifier (%u granted)",
				 c->name, c->nqueues);
		goto fail;
	}
	qc.qid = q->qid;
	c->ioqs[q->qid] = q;
	err = upcie_nvme_qpair_init(&q->qp, &qc);
	if (!err)
		err = upcie_nvme_ioq_hw_create_(q);
	if (err)
		goto fail;
	q->live = true;
	pthread_mutex_unlock(&c->lock);
	return 0;
fail:
	upcie_nvme_ioq_release_(q, true);
	pthread_mutex_unlock(&c->lock);
	return err;
}

/*
 * Delete SQ then CQ on the controller and release `q`. A controller that is dead, stopped or not
 * ready is not sent the deletes; a deletion that fails resets the controller (the queue memory
 * is free only once the controller let go of it). Lock held. Returns 0, or the error of a
 * delete command (`q` released regardless, unless the controller could not be stopped: then
 * `q` stays live with its memory, and this returns -EBUSY).
 */
static inline int upcie_nvme_ioq_delete_locked_(struct upcie_nvme_ioq *q)
{
	struct upcie_nvme_ctrl *c = q->ctrl;
	/* a lost ext queue went with a reset: the controller no longer has it */
	int err = q->lost ? 0 : upcie_nvme_ioq_hw_delete_(q, true);

	if (err && !c->stopped)
		return UPCIE_FAIL(-EBUSY,
				  "nvme %s: I/O queue %u could not be deleted and the controller "
				  "not stopped: the queue stays",
				  c->name, q->qid);
	/* the controller no longer has the queue: whatever is left ends here */
	upcie_nvme_qpair_stop(&q->qp, false);
	upcie_nvme_ioq_release_(q, true);
	return err;
}

/*
 * Delete the queue pair: wait briefly (1 s) for commands in flight, delete SQ then CQ on the
 * controller, end whatever is still outstanding with -ECANCELED, free its memory and release
 * its identifier. A dead or stopped controller is not sent the deletes. When a delete command
 * fails, the controller is reset (the queue may still exist: its memory is free only once the
 * controller let go) and its error returned, the queue released. The callbacks of the commands
 * ended here run after the controller's lock is released (they may issue admin commands). Call
 * from the owner thread. Returns 0, a delete command's error, -ENOMEM (nothing done), or -EBUSY (the queue could not be deleted nor the
 * controller stopped: the queue stays, its memory the controller's). A zeroed or deleted queue
 * is a no-op.
 */
static inline int upcie_nvme_ioq_delete(struct upcie_nvme_ioq *q)
{
	struct upcie_nvme_defer_ d;
	struct upcie_nvme_ctrl *c;
	int err;

	if (!q || !q->live) {
		if (q)
			memset(q, 0, sizeof(*q));
		return 0;
	}
	c = q->ctrl;
	pthread_mutex_lock(&c->lock);
	err = c->state == UPCIE_NVME_CTRL_READY && !c->stopped ? upcie_nvme_ctrl_dead_(c) : 1;
	pthread_mutex_unlock(&c->lock);
	/* retries waiting for their delay (nvme/ns.h) end here, never sent to a queue going away */
	for (uint32_t i = 0; q->nparked && i <= q->qp.cid_mask; i++) {
		uint32_t tag = q->qp.slots[i].tag;

		if (upcie_nvme_qpair_tag_held_(tag))
			upcie_nvme_qpair_cancel(&q->qp, (uint16_t)tag);
	}
	q->nparked = 0;
	if (!err && !q->ext)
		upcie_nvme_qpair_drain(&q->qp, UPCIE_NVME_CTRL_DELETE_DRAIN);
	memset(&d, 0, sizeof(d));
	if (upcie_nvme_defer_reserve_(&d, upcie_nvme_defer_count_(&q->qp)))
		return -ENOMEM; /* nothing done: the queue is as it was */
	pthread_mutex_lock(&c->lock);
	upcie_nvme_defer_arm_(&d, &q->qp); /* callbacks after the lock, not under it */
	err = upcie_nvme_ioq_delete_locked_(q);
	pthread_mutex_unlock(&c->lock);
	upcie_nvme_defer_finish_(&d);
	upcie_nvme_ctrl_admin_deliver_(c);
	return err;
}

/* List pages for command `cid` of `q`. */
static inline struct upcie_nvme_lists upcie_nvme_ioq_lists(const struct upcie_nvme_ioq *q,
							   uint16_t cid)
{
	struct upcie_nvme_lists l;

	l.mem = q->lmem;
	l.off = q->loff + (((uint64_t)upcie_nvme_qpair_cid_index(&q->qp, cid) * q->lpages)
			   << q->dptr.page_shift);
	l.npages = q->lpages;
	return l;
}

/*
 * Sleep until the queue's interrupt vector fires or timeout_ns passes (queues created with
 * `irq`). A halt of the controller (a reset, an escalation, a fatal status) wakes the sleeper too,
 * since no interrupt will come then: look at c->stopped after waking (the waits of nvme/ns.h
 * and upcie_nvme_ioq_wait_cid() do). Returns 0 (interrupts arrived, or a halt: reap and look),
 * -ETIMEDOUT, -EINVAL (no interrupt queue).
 */
static inline int upcie_nvme_ioq_irq_wait(const struct upcie_nvme_ioq *q, uint64_t timeout_ns)
{
	const struct upcie_nvme_ctrl *c;
	struct pollfd pfd;
	struct timespec ts, *tsp = NULL;
	uint64_t v;
	int n;

	if (!q || !q->live || !q->irq)
		return -EINVAL;
	c = q->ctrl;
	pfd.fd = c->irqs.efd[q->vector];
	pfd.events = POLLIN;
	pfd.revents = 0;
	if (timeout_ns != UPCIE_TIMEOUT_INF) {
		ts.tv_sec = (time_t)(timeout_ns / UPCIE_NSEC_PER_SEC);
		ts.tv_nsec = (long)(timeout_ns % UPCIE_NSEC_PER_SEC);
		tsp = &ts;
	}
	n = ppoll(&pfd, 1, tsp, NULL);
	if (n < 0)
		return errno == EINTR ? 0 : upcie_neg_errno();
	if (!n)
		return -ETIMEDOUT;
	/* clear the counter: it says how many interrupts, the CQ says what completed */
	if (read(pfd.fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		return upcie_neg_errno();
	return 0;
}

#define UPCIE_NVME_CTRL_ABORTS_MAX 16u /* Abort commands sent together, at most */

/*
 * Abort commands cids[0..n) of submission queue `sqid` together: all Abort commands submitted
 * first (at most ACL + 1 of them, Identify Controller's limit, and what the admin queue takes),
 * then awaited until `dl` passes; one not answered is cancelled (it owns no memory).
 * aborted[i] (may be NULL) says whether the controller said it aborted cids[i]. Lock held.
 * Returns the number of Aborts sent (0 when the controller is not ready), -ENODEV or -EIO for
 * a dead controller (reset here).
 */
static inline int upcie_nvme_ctrl_abort_many_locked_(struct upcie_nvme_ctrl *c, uint16_t sqid,
						     const uint16_t *cids, unsigned n,
						     bool *aborted, struct upcie_deadline *dl)
{
	struct upcie_nvme_sync_ s[UPCIE_NVME_CTRL_ABORTS_MAX];
	uint16_t acid[UPCIE_NVME_CTRL_ABORTS_MAX];
	unsigned limit = (unsigned)c->id.acl + 1, sent = 0, done;
	int dead;

	for (unsigned i = 0; i < n; i++)
		if (aborted)
			aborted[i] = false;
	dead = upcie_nvme_ctrl_dead_(c);
	if (dead) {
		upcie_nvme_ctrl_fail_locked_(c, "dead controller");
		return dead;
	}
	if (c->state != UPCIE_NVME_CTRL_READY)
		return 0;
	if (limit > UPCIE_NVME_CTRL_ABORTS_MAX)
		limit = UPCIE_NVME_CTRL_ABORTS_MAX;
	for (; sent < n && sent < limit; sent++) {
		struct upcie_nvme_sqe sqe;

		upcie_nvme_cmd_abort(&sqe, sqid, cids[sent]);
		s[sent].done = false;
		s[sent].err = 0;
		if (upcie_nvme_qpair_enqueue(&c->admin, &sqe, upcie_nvme_sync_cb_, &s[sent],
					     &acid[sent]))
			break;
	}
	upcie_nvme_qpair_ring(&c->admin);
	for (;;) {
		done = 0;
		for (unsigned i = 0; i < sent; i++)
			done += s[i].done;
		if (done == sent || upcie_deadline_passed(dl))
			break;
		if (upcie_nvme_qpair_reap(&c->admin, 0xffffffffu) == 0)
			upcie_cpu_relax();
	}
	if (done < sent) {
		UPCIE_ERR("nvme %s: %u of %u Abort commands not answered after %" PRIu64 " ms",
			  c->name, sent - done, sent, c->abort_timeout_ns / UPCIE_NSEC_PER_MSEC);
		dead = upcie_nvme_ctrl_dead_(c);
		if (dead)
			upcie_nvme_ctrl_fail_locked_(c, "dead controller");
		for (unsigned i = 0; i < sent; i++)
			if (!s[i].done)
				upcie_nvme_qpair_cancel(&c->admin, acid[i]);
		if (dead)
			return dead;
	}
	for (unsigned i = 0; i < sent && aborted; i++)
		aborted[i] = !s[i].err && upcie_nvme_cqe_ok(&s[i].cqe) && !(s[i].cqe.dw0 & 1u);
	return (int)sent;
}

/* How many of cids[0..n) are still outstanding on `q`. */
static inline unsigned upcie_nvme_ioq_pending_(const struct upcie_nvme_ioq *q, const uint16_t *cids,
					       unsigned n)
{
	unsigned k = 0;

	for (unsigned i = 0; i < n; i++)
		k += upcie_nvme_qpair_cid_outstanding_(&q->qp, cids[i]);
	return k;
}

/* Cancel those of cids[0..n) still outstanding (the controller let go of them). */
static inline void upcie_nvme_ioq_cancel_set_(struct upcie_nvme_ioq *q, const uint16_t *cids,
					      unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		upcie_nvme_qpair_cancel(&q->qp, cids[i]);
}

/*
 * End commands cids[0..n) of `q` after a timeout, the way that never returns memory the
 * controller may still write: a controller that has let go (stopped, dead) lets them be
 * cancelled at once; else they are aborted together and, Aborts included, given one abort
 * timeout to end (completed, or aborted by the controller). Returns 0 when all ended, -ETIMEDOUT when some are
 * still outstanding (the controller neither completed nor aborted them: they stay its own until
 * their late completion, a reset or the queue's deletion), -ENODEV / -EIO for a dead controller
 * (reset; the commands cancelled). Owner thread.
 */
static inline int upcie_nvme_ioq_abort_set_(struct upcie_nvme_ioq *q, const uint16_t *cids,
					    unsigned n, bool *aborted)
{
	struct upcie_nvme_ctrl *c = q->ctrl;
	struct upcie_deadline dl;
	bool stopped;
	int err = 0;

	upcie_deadline_set(&dl, c->abort_timeout_ns);
	pthread_mutex_lock(&c->lock);
	if (!c->stopped)
		err = upcie_nvme_ctrl_abort_many_locked_(c, q->qid, cids, n, aborted, &dl);
	stopped = c->stopped;
	pthread_mutex_unlock(&c->lock);
	if (!stopped && err >= 0) {
		while (upcie_nvme_ioq_pending_(q, cids, n) && !upcie_deadline_passed(&dl))
			if (upcie_nvme_qpair_reap(&q->qp, 0xffffffffu) == 0)
				upcie_cpu_relax();
		pthread_mutex_lock(&c->lock);
		stopped = c->stopped; /* reset meanwhile by an escalation elsewhere */
		pthread_mutex_unlock(&c->lock);
	}
	if (stopped)
		upcie_nvme_ioq_cancel_set_(q, cids, n);
	if (err < 0 && err != -ENODEV && err != -EIO)
		err = 0;
	if (err < 0)
		return err;
	return upcie_nvme_ioq_pending_(q, cids, n) ? -ETIMEDOUT : 0;
}

/*
 * End outstanding command `cid` of `q`: admin Abort with this SQID and CID, then up to the abort
 * timeout for the command to end (its completion, or Command Abort Requested when the controller
 * aborts it). *aborted (may be NULL) says whether the controller said it aborted it. The command
 * is never ended while the controller may still write its memory: when it does not end, it
 * stays outstanding (late completion, or -ECANCELED from upcie_nvme_ctrl_reset() or the queue's
 * deletion). Call from the owner thread. Returns 0 (ended), -ETIMEDOUT (still outstanding),
 * -ENOENT when `cid` is not outstanding, -ENODEV / -EIO for a dead controller (reset, the command
 * cancelled).
 */
static inline int upcie_nvme_ioq_abort(struct upcie_nvme_ioq *q, uint16_t cid, bool *aborted)
{
	void *ctx;

	if (aborted)
		*aborted = false;
	if (!q || !q->live)
		return UPCIE_FAIL(-EINVAL, "nvme: abort: queue not live");
	if (upcie_nvme_qpair_cid_ctx(&q->qp, cid, &ctx))
		return -ENOENT;
	return upcie_nvme_ioq_abort_set_(q, &cid, 1, aborted);
}

/*
 * Reap `q` until command `cid` has completed (or was cancelled) or timeout_ns passed: spinning,
 * or for an `irq` queue sleeping on its vector between empty reaps. On a timeout the command is
 * aborted (upcie_nvme_ioq_abort()) and -ETIMEDOUT returned: check whether it ended
 * (upcie_nvme_qpair_cid_ctx()); if not, its memory is still the controller's. When the
 * controller lets go of everything meanwhile (an escalation or reset in another thread:
 * c->stopped), the wait ends at once, asleep or not, and the command is cancelled: -ECANCELED.
 * -ENODEV / -EIO: the controller is dead (reset, the command cancelled). Returns 0 otherwise.
 */
static inline int upcie_nvme_ioq_wait_cid(struct upcie_nvme_ioq *q, uint16_t cid,
					  uint64_t timeout_ns)
{
	struct upcie_deadline dl;
	void *ctx;
	int err;

	upcie_deadline_set(&dl, timeout_ns);
	for (unsigned spins = 0;; spins++) {
		int n = upcie_nvme_qpair_reap(&q->qp, 0xffffffffu);
		bool look;

		if (upcie_nvme_qpair_cid_ctx(&q->qp, cid, &ctx))
			return 0;
		if (n > 0)
			continue;
		/* the clock can cost microseconds in a VM: look at it, and at the controller's
		 * state, every 16th empty poll, and before every sleep (a halt after this look
		 * wakes the sleep: upcie_nvme_ctrl_wake_waiters_locked_()) */
		look = q->irq || !(spins & 15);
		if (look && __atomic_load_n(&q->ctrl->stopped, __ATOMIC_ACQUIRE)) {
			/* the controller let go: what it posted before is in the CQ; else the
			 * command ends here (the abort of a stopped controller cancels it) */
			upcie_nvme_qpair_reap(&q->qp, 0xffffffffu);
			if (upcie_nvme_qpair_cid_ctx(&q->qp, cid, &ctx))
				return 0;
			upcie_nvme_ioq_abort(q, cid, NULL);
			return upcie_nvme_ctrl_stopped_err_(q->ctrl);
		}
		if (look && upcie_deadline_passed(&dl))
			break;
		if (q->irq)
			upcie_nvme_ioq_irq_wait(q, upcie_deadline_remaining_ns(&dl));
		else
			upcie_cpu_relax();
	}
	UPCIE_ERR("nvme %s: command 0x%04x on queue %u not completed after %" PRIu64
		  " us: aborting",
		  q->ctrl->name, cid, q->qid, timeout_ns / UPCIE_NSEC_PER_USEC);
	err = upcie_nvme_ioq_abort(q, cid, NULL);
	return err == -ENODEV || err == -EIO ? err : -ETIMEDOUT;
}

#endif /* UPCIE_NVME_CTRL_IOQ_H */
