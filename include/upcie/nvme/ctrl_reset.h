/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shutdown, reset and close of an NVMe controller: normal shutdown bounded by RTD3E, the Flush
 * of a volatile write cache, controller reset and NVM subsystem reset with every I/O queue
 * recreated in place, and close, which frees memory only once the controller has let go of it.
 *
 * Reset (upcie_nvme_ctrl_reset()) disables the controller first (a controller still becoming
 * ready is given CAP.TO to get there: CC.EN is never cleared while CSTS.RDY = 0), then ends
 * what was in flight (completions still in the CQs with their status, the rest -ECANCELED),
 * re-enables it and recreates every I/O queue in place (same identifier, depth and memory; the
 * caller's struct stays valid); commands that callbacks submit during the reset run on the
 * recreated queues. upcie_nvme_ctrl_subsystem_reset() does the same after an NVM subsystem
 * reset (NSSR). Close writes a volatile write cache back (Flush), deletes the I/O queues still
 * open, shuts the controller down (CC.SHN normal, CSTS.SHST complete, bounded by RTD3E) and
 * disables it. The CMB works from NVMe 1.2 on (CMBMSC only from 1.4).
 */
#ifndef UPCIE_NVME_CTRL_RESET_H
#define UPCIE_NVME_CTRL_RESET_H

#include <upcie/nvme/ctrl_cmb.h>

/*
 * Normal shutdown: CC.SHN = 01b and wait for CSTS.SHST = complete, bounded by RTD3E (at least
 * 5 s, at most 60 s). The controller then processes nothing until reset. Lock held.
 */
static inline int upcie_nvme_ctrl_shutdown_locked_(struct upcie_nvme_ctrl *c)
{
	uint32_t cc = upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CC), csts = 0;
	int err;

	if (!upcie_nvme_cc_en(cc))
		return 0; /* nothing to shut down */
	upcie_nvme_ctrl_wr32(c, UPCIE_NVME_REG_CC,
			     upcie_nvme_cc_set_shn(cc, UPCIE_NVME_CC_SHN_NORMAL));
	err = upcie_nvme_ctrl_csts_wait_(c, 3u << 2, UPCIE_NVME_CSTS_SHST_COMPLETE << 2,
					 c->shutdown_timeout_ns, true, &csts);
	if (err)
		return UPCIE_FAIL(
		    err, "nvme %s: shutdown not complete after %" PRIu64 " ms (CSTS 0x%08x)",
		    c->name, c->shutdown_timeout_ns / UPCIE_NSEC_PER_MSEC, csts);
	c->state = UPCIE_NVME_CTRL_SHUTDOWN;
	return 0;
}

/* One Flush of namespace `nsid` on `q`, waited for. */
static inline int upcie_nvme_ctrl_flush_one_(struct upcie_nvme_ctrl *c, struct upcie_nvme_ioq *q,
					     uint32_t nsid)
{
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_cqe cqe;
	int err;

	upcie_nvme_cmd_flush(&sqe, nsid);
	memset(&cqe, 0, sizeof(cqe));
	err = upcie_nvme_qpair_submit_sync(&q->qp, &sqe, c->admin_timeout_ns, &cqe, NULL);
	if (err == -EIO)
		UPCIE_ERR("nvme %s: Flush of namespace 0x%x: %s (status 0x%03x)", c->name, nsid,
			  upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)),
			  upcie_nvme_cqe_code(&cqe));
	else if (err && err != -EBUSY)
		UPCIE_ERR("nvme %s: Flush of namespace 0x%x: %s", c->name, nsid,
			  upcie_errno_name(err));
	return err;
}

/*
 * With a volatile write cache (Identify VWC), write it back before the controller is shut down:
 * one Flush of every namespace at once (NSID FFFFFFFFh) where VWC bits 2:1 say the controller
 * takes that, else one Flush per active namespace; on a live I/O queue (no other thread may use
 * it now, as for close), or on a temporary one when none is live or it is full. A shutdown that
 * then times out has the data in media all the same. Lock not held. Returns 0 or the first
 * error.
 */
static inline int upcie_nvme_ctrl_flush_(struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_ioq_opts o;
	struct upcie_nvme_ioq tmp, *q = NULL;
	uint32_t *ids = NULL, n = 0;
	bool all;
	int err = 0;

	/* an admin-only controller never took a write from us; a stopped one lost its cache */
	if (!c->vwc || c->state != UPCIE_NVME_CTRL_READY || !c->nqueues || c->stopped)
		return 0;
	err = upcie_nvme_ctrl_dead_(c);
	if (err)
		return err; /* no Flush to a dead controller: what its cache held is lost */
	all = ((c->id.vwc >> 1) & 3u) == 3u;
	if (!all) {
		ids = (uint32_t *)calloc(UPCIE_NVME_NS_SCAN_MAX, sizeof(*ids));
		if (!ids)
			return UPCIE_FAIL(-ENOMEM, "nvme %s: out of memory", c->name);
		err = upcie_nvme_ctrl_ns_list(c, ids, UPCIE_NVME_NS_SCAN_MAX, &n);
		if (n > UPCIE_NVME_NS_SCAN_MAX)
			n = UPCIE_NVME_NS_SCAN_MAX;
	}
	pthread_mutex_lock(&c->lock);
	for (uint32_t k = 1; c->ioqs && k <= c->nslots && !q; k++)
		if (c->ioqs[k] && c->ioqs[k]->live && !c->ioqs[k]->ext &&
		    upcie_nvme_qpair_room(&c->ioqs[k]->qp))
			q = c->ioqs[k];
	pthread_mutex_unlock(&c->lock);
	memset(&tmp, 0, sizeof(tmp));
	if (!q && !err) {
		memset(&o, 0, sizeof(o));
		o.depth = 2;
		err = upcie_nvme_ioq_create(&tmp, c, &o);
		q = &tmp;
	}
	for (uint32_t i = 0; !err && i < (all ? 1u : n); i++)
		err = upcie_nvme_ctrl_flush_one_(c, q, all ? UPCIE_NVME_NSID_ALL : ids[i]);
	upcie_nvme_ioq_delete(&tmp);
	free(ids);
	if (!err)
		UPCIE_DBG("nvme %s: volatile write cache flushed (%s)", c->name,
			  all ? "all namespaces at once" : "namespace by namespace");
	return err;
}

/*
 * Shut the controller down (as close does, but keeping the object): write the volatile write
 * cache back (Flush, when Identify VWC says there is one), then CC.SHN normal and wait for
 * CSTS.SHST complete. The I/O queues stay allocated; upcie_nvme_ctrl_reset() brings the
 * controller and them back. No other thread may use the queues meanwhile. Returns 0,
 * -ETIMEDOUT, -ENODEV, or the Flush's error (the shutdown is done regardless).
 */
static inline int upcie_nvme_ctrl_shutdown(struct upcie_nvme_ctrl *c)
{
	int err, e2;

	if (!c || !c->lock_live)
		return UPCIE_FAIL(-EINVAL, "nvme: shutdown: controller not open");
	e2 = upcie_nvme_ctrl_flush_(c);
	pthread_mutex_lock(&c->lock);
	err = upcie_nvme_ctrl_shutdown_locked_(c);
	pthread_mutex_unlock(&c->lock);
	return err ? err : e2;
}

/*
 * Controller reset: CC.EN is cleared first (a controller level reset: the controller lets go of
 * every queue and buffer), then what the CQs still hold is processed (callbacks with err 0) and
 * every command still in flight on the admin and I/O queues ends with -ECANCELED; the admin queue
 * is set up again, the controller enabled, Set Features Number of Queues repeated, and every I/O
 * queue recreated in place with its identifier, depth, memory and interrupt vector: the callers'
 * ioq structs stay valid and usable. The callbacks of the commands that ended run after all that,
 * with no lock held, once the open namespaces were revalidated (a namespace that changed refuses
 * I/O with -ESTALE from then on: nvme/ctrl_ns.h) and the Asynchronous Event Requests sent again:
 * a callback may issue admin commands and submit on the recreated queues. Works from any
 * state, also after a shutdown, a fatal status or an escalation. A controller that cannot be
 * disabled (CSTS.RDY stays 1) keeps its commands (they end with it: close); one that is gone
 * ends them all. No other thread may use the queues meanwhile. Returns 0 or the first error
 * (state FAILED: close, or reset again).
 */
static inline int upcie_nvme_ctrl_reset(struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_defer_ d;
	int err;

	if (!c || !c->lock_live)
		return UPCIE_FAIL(-EINVAL, "nvme: reset: controller not open");
	memset(&d, 0, sizeof(d));
	pthread_mutex_lock(&c->lock);
	/* the callbacks of what ends here run after the lock, once the queues are back */
	if (upcie_nvme_defer_arm_all_locked_(&d, c)) {
		pthread_mutex_unlock(&c->lock);
		return -ENOMEM; /* nothing done */
	}
	err = upcie_nvme_ctrl_halt_locked_(c);
	if (err) {
		c->state = UPCIE_NVME_CTRL_FAILED;
		pthread_mutex_unlock(&c->lock);
		upcie_nvme_defer_finish_(&d); /* nothing ended: the callbacks go back */
		return UPCIE_FAIL(err, "nvme %s: reset failed: the controller did not stop",
				  c->name);
	}
	/* it let go: end what it held */
	for (uint32_t q = 1; c->ioqs && q <= c->nslots; q++)
		if (c->ioqs[q])
			upcie_nvme_qpair_stop(&c->ioqs[q]->qp, !c->gone);
	upcie_nvme_admin_take_locked_(c, NULL, 0); /* the AERs the halt ended */
	if (!c->gone && c->bm_off) {
		/* bus mastering back on only for a disabled controller (as at open) */
		err = upcie_nvme_ctrl_quiesce_(c);
		if (!err)
			err = upcie_nvme_dev_bus_master(&c->dev, true);
		if (!err) {
			c->bm_off = false;
		} else {
			c->state = UPCIE_NVME_CTRL_FAILED; /* as documented for a failed reset */
			UPCIE_ERR("nvme %s: reset: the controller does not disable: bus mastering "
				  "stays off",
				  c->name);
		}
	}
	if (!err)
		err = c->gone ? -ENODEV : upcie_nvme_ctrl_enable_(c);
	if (!err)
		err = upcie_nvme_ctrl_set_queues_locked_(c);
	for (uint32_t q = 1; c->ioqs && q <= c->nslots; q++) {
		struct upcie_nvme_ioq *io = c->ioqs[q];
		int e2 = 0;

		if (!io)
			continue;
		if (io->ext) {
			/* its driver's ring state is not ours to restore: the queue is gone */
			io->lost = true;
			upcie_nvme_qpair_stop(&io->qp, false);
			continue;
		}
		if (!err && q > c->nqueues) {
			/* the controller now grants fewer queues than before the reset */
			err = UPCIE_FAIL(-ENOSPC,
					 "nvme %s: queue %u beyond the %u granted after reset",
					 c->name, q, c->nqueues);
			c->state = UPCIE_NVME_CTRL_FAILED;
		}
		if (!err) {
			e2 = upcie_nvme_qpair_restart(&io->qp);
			if (e2 >= 0)
				e2 = upcie_nvme_ioq_hw_create_(io);
			if (!e2) {
				upcie_nvme_qpair_ring(&io->qp); /* the kept commands */
				continue;
			}
			err = e2;
			c->state = UPCIE_NVME_CTRL_FAILED;
		}
		/* the queue is not back: what was kept for it ends here */
		upcie_nvme_qpair_stop(&io->qp, false);
	}
	if (!err) {
		upcie_nvme_ctrl_acre_locked_(c);
		c->aer_out = 0;
		upcie_nvme_ctrl_aer_fill_locked_(c);
	}
	pthread_mutex_unlock(&c->lock);
	/* the namespaces first: a callback that submits again must meet their new geometry */
	if (!err)
		upcie_nvme_ctrl_ns_revalidate(c, UPCIE_NVME_NSID_ALL);
	upcie_nvme_defer_finish_(&d);
	upcie_nvme_ctrl_admin_deliver_(c);
	if (err)
		return UPCIE_FAIL(err, "nvme %s: reset failed", c->name);
	return 0;
}

/*
 * NVM Subsystem Reset (CAP.NSSRS): "NVMe" written to NSSR resets every controller of the NVM
 * subsystem, as a power cycle would, without the caller's commands completing (they end with
 * -ECANCELED, as in a reset). The controller is then waited for (CSTS readable again, RDY 0;
 * on PCIe the link retrains meanwhile) and brought back as upcie_nvme_ctrl_reset() does, I/O
 * queues included; CSTS.NSSRO, which the subsystem reset sets, is acknowledged on the way
 * (c->nssr_seen counts it). Other controllers of the subsystem, in other processes, are reset
 * too: theirs to recover. Only for controllers given by upcie_nvme_ctrl_init() (a transport
 * whose link survives it): on a PCI function upcie opened it is refused, since on PCIe the link
 * goes down and the function's configuration space comes back reset. No other thread may use
 * the queues meanwhile. Returns 0, -EOPNOTSUPP (CAP.NSSRS clear, or a PCI function), -ENODEV (the function did not come back within CAP.TO), or the reset's
 * error.
 */
static inline int upcie_nvme_ctrl_subsystem_reset(struct upcie_nvme_ctrl *c)
{
	struct upcie_deadline dl;
	uint32_t csts;

	if (!c || !c->lock_live)
		return UPCIE_FAIL(-EINVAL, "nvme: subsystem reset: controller not open");
	if (!upcie_nvme_cap_nssrs(c->cap))
		return UPCIE_FAIL(-EOPNOTSUPP, "nvme %s: no NVM subsystem reset (CAP.NSSRS 0)",
				  c->name);
	if (c->dev.open)
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "nvme %s: an NVM subsystem reset on PCIe takes the link down and "
				  "resets the function's configuration space (BARs, memory space, "
				  "bus mastering), which upcie does not restore: refused (a "
				  "controller reset, upcie_nvme_ctrl_reset(), recovers without it)",
				  c->name);
	pthread_mutex_lock(&c->lock);
	upcie_nvme_ctrl_wr32(c, UPCIE_NVME_REG_NSSR, UPCIE_NVME_NSSR_RESET);
	c->state = UPCIE_NVME_CTRL_FAILED; /* until the reset below brings it back */
	upcie_deadline_set(&dl, c->ready_timeout_ns);
	for (;;) {
		csts = upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CSTS);
		if (csts != UPCIE_NVME_REG_GONE && !upcie_nvme_csts_rdy(csts))
			break;
		if (upcie_deadline_passed(&dl)) {
			pthread_mutex_unlock(&c->lock);
			return UPCIE_FAIL(-ENODEV,
					  "nvme %s: not back %" PRIu64
					  " ms after the NVM subsystem reset (CSTS 0x%08x)",
					  c->name, c->ready_timeout_ns / UPCIE_NSEC_PER_MSEC, csts);
		}
		upcie_sleep_ns(UPCIE_NVME_CTRL_REG_POLL_NS);
	}
	pthread_mutex_unlock(&c->lock);
	return upcie_nvme_ctrl_reset(c);
}

/*
 * Write the volatile write cache back (Flush, when Identify VWC says there is one), delete the
 * I/O queues still open (their structs must still exist; no thread may use them), disable the
 * CMB and interrupts, shut the controller down (CC.SHN normal, wait for CSTS.SHST complete) and
 * disable it, turn bus mastering off, then release memory and the PCI function. A dead
 * controller (all ones, CSTS.CFS) or one already stopped is sent no Flush, no deletes and no
 * shutdown: it is disabled, which is quick. Returns 0, or the shutdown's or disable's error
 * (-ETIMEDOUT, -ENODEV, -EIO), or the Flush's, or -EBUSY when the controller did not disable
 * (CSTS.RDY still 1): it may still write memory it was given, bus mastering off or not, so the
 * host memory open allocated is kept (upcie_dmamem_keep()), and memory the caller gave it
 * (queues, buffers) must not be reused either. Everything else is released regardless. A
 * zeroed controller is a no-op returning 0.
 */
static inline int upcie_nvme_ctrl_close(struct upcie_nvme_ctrl *c)
{
	bool stopped = true;
	int err = 0, eflush = 0;

	if (!c)
		return 0;
	if (c->lock_live) {
		struct upcie_nvme_defer_ d;

		upcie_nvme_ctrl_events_stop(c);
		eflush = upcie_nvme_ctrl_flush_(c);
		memset(&d, 0, sizeof(d));
		pthread_mutex_lock(&c->lock);
		/* no memory for it: the callbacks run under the lock, as they must end */
		upcie_nvme_defer_arm_all_locked_(&d, c);
		for (uint32_t q = 1; c->ioqs && q <= c->nslots; q++)
			if (c->ioqs[q] && upcie_nvme_ioq_delete_locked_(c->ioqs[q]) == -EBUSY)
				upcie_nvme_ioq_release_(c->ioqs[q], false);
		if (eflush == -ENOSPC || eflush == -EBUSY) {
			/* every queue was full and no identifier free for a temporary one: now
			 * that the queues are gone, one can be made for the Flush */
			pthread_mutex_unlock(&c->lock);
			eflush = upcie_nvme_ctrl_flush_(c);
			pthread_mutex_lock(&c->lock);
		}
		upcie_vfio_irq_disable(&c->irqs);
		upcie_nvme_ctrl_cmb_disable_(c);
		if (c->state == UPCIE_NVME_CTRL_READY && !c->stopped) {
			err = upcie_nvme_ctrl_dead_(c);
			if (!err)
				err = upcie_nvme_ctrl_shutdown_locked_(c);
		}
		if (c->state != UPCIE_NVME_CTRL_CLOSED && c->regs) {
			int e2 = upcie_nvme_ctrl_halt_locked_(c);
			uint32_t csts = upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CSTS);

			if (!err && !c->gone)
				err = e2;
			/* halt's fallback (bus mastering off) does not free memory: a controller that
			 * never disabled may still finish what it had taken (QEMU's NVMe model does) */
			if (!c->gone && csts != UPCIE_NVME_REG_GONE && (e2 || (csts & 1))) {
				stopped = false;
				err = -EBUSY;
			}
		}
		pthread_mutex_unlock(&c->lock);
		upcie_nvme_defer_finish_(&d);
		upcie_nvme_ctrl_admin_deliver_(c);
		pthread_mutex_destroy(&c->lock);
		if (!err)
			err = eflush;
	}
	free(c->arec);
	upcie_nvme_ns_recs_free_(c);
	/* no DMA from here on, before any memory goes back */
	if (c->dev.open && upcie_nvme_dev_bus_master(&c->dev, false))
		UPCIE_ERR("nvme %s: bus mastering could not be turned off", c->name);
	upcie_nvme_qpair_fini(&c->admin);
	upcie_heap_fini(&c->heap);
	if (stopped) {
		upcie_dmamem_destroy(&c->host_own);
	} else if (c->host_own.size) {
		UPCIE_ERR("nvme %s: the controller did not stop: its %zu bytes of host memory are "
			  "kept, not freed",
			  c->name, c->host_own.size);
		upcie_dmamem_keep(&c->host_own);
	}
	free(c->ioqs);
	upcie_nvme_dev_close(&c->dev);
	upcie_nvme_ctrl_zero_(c);
	return err;
}

#endif /* UPCIE_NVME_CTRL_RESET_H */
