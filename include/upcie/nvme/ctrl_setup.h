/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The bring-up sequence of an NVMe controller after its registers and host memory are known:
 * Identify Controller checked and applied, Set Features Number of Queues, the steps init and open
 * share, and the quiesce of a controller the last owner left running. upcie_nvme_ctrl_init() and
 * upcie_nvme_ctrl_open() (nvme/ctrl.h) call it; a reset (nvme/ctrl_reset.h) repeats parts of it.
 *
 * Bring-up: disable and wait for CSTS.RDY = 0 (the kernel driver leaves the controller enabled
 * and shut down), check CAP (MPSMIN/MPSMAX against the host page, MQES, CSS, DSTRD) and take the
 * ready timeout from CAP.TO, or from CRTO.CRWMT where VS >= 2.0 and CAP.CRMS says CRTO is
 * valid; admin queues from a heap over host DMA memory; enable with CC.CSS = all I/O command
 * sets when CAP.CSS bit 6 is set; wait for RDY, with CSTS.CFS reported as -EIO. Then Identify
 * Controller (MDTS, SGLS, ONCS, NN, VWC, SN/MN/FR kept in the object; it is device-written data:
 * absurd values are logged, counted in nbad_id, and clamped or refused) and Set Features Number
 * of Queues, whose answer, bounded by the doorbells BAR0 holds, bounds the queue identifiers
 * handed out (a controller that refuses it is brought up admin-only).
 */
#ifndef UPCIE_NVME_CTRL_SETUP_H
#define UPCIE_NVME_CTRL_SETUP_H

#include <upcie/nvme/ctrl_events.h>

/* A device-written Identify field out of range: logged, counted in c->nbad_id. */
UPCIE_PRINTF(2, 3)
static inline void upcie_nvme_ctrl_id_bad_(struct upcie_nvme_ctrl *c, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	c->nbad_id++;
	UPCIE_WARN("nvme %s: Identify reports %s", c->name, msg);
}

/*
 * Derive what the driver uses from c->id (Identify Controller as the device wrote it) and
 * c->cap: MDTS in bytes, SGL support, NN, the volatile write cache, the shutdown timeout and
 * the strings. Absurd values are logged and counted (c->nbad_id), then clamped: an MDTS beyond
 * 64-bit byte counts means no limit, reserved SGLS bits mean no SGLs, NN 0xffffffff (the
 * broadcast ID) means 0xfffffffe. Returns 0, or -EOPNOTSUPP when the entry sizes upcie uses
 * (64-byte SQ, 16-byte CQ entries) are not allowed.
 */
static inline int upcie_nvme_ctrl_id_apply_(struct upcie_nvme_ctrl *c)
{
	const struct upcie_nvme_id_ctrl *id = &c->id;
	uint64_t shutdown;

	upcie_nvme_ctrl_str_(c->sn, id->sn, sizeof(id->sn));
	upcie_nvme_ctrl_str_(c->mn, id->mn, sizeof(id->mn));
	upcie_nvme_ctrl_str_(c->fr, id->fr, sizeof(id->fr));
	c->max_xfer = upcie_nvme_mdts_bytes(id->mdts, c->cap);
	if (id->mdts && c->max_xfer == UINT64_MAX)
		upcie_nvme_ctrl_id_bad_(c, "MDTS %u: 2^%u bytes; taken as no limit", id->mdts,
					upcie_nvme_cap_mpsmin_shift(c->cap) + id->mdts);
	c->sgl = false;
	c->sgl_dword = false;
	if ((id->sgls & 3u) == 3u)
		upcie_nvme_ctrl_id_bad_(c, "SGLS 0x%08x (reserved support value 3); no SGLs",
					id->sgls);
	else {
		c->sgl = (id->sgls & 3u) != UPCIE_NVME_SGLS_NONE;
		c->sgl_dword = (id->sgls & 3u) == UPCIE_NVME_SGLS_DWORD;
	}
	c->nn = id->nn;
	if (c->nn == UPCIE_NVME_NSID_ALL) {
		upcie_nvme_ctrl_id_bad_(c, "NN 0xffffffff (the broadcast namespace ID)");
		c->nn = UPCIE_NVME_NSID_ALL - 1;
	}
	c->vwc = id->vwc & UPCIE_NVME_VWC_PRESENT;
	if ((id->sqes & 0xf) > 6 || (id->cqes & 0xf) > 4)
		return UPCIE_FAIL(
		    -EOPNOTSUPP,
		    "nvme %s: needs SQ/CQ entries of 2^%u/2^%u bytes; upcie uses 64/16", c->name,
		    id->sqes & 0xf, id->cqes & 0xf);
	if ((id->sqes >> 4) < (id->sqes & 0xf) || (id->cqes >> 4) < (id->cqes & 0xf))
		upcie_nvme_ctrl_id_bad_(c, "SQES 0x%02x / CQES 0x%02x: maximum below required",
					id->sqes, id->cqes);
	shutdown = (uint64_t)id->rtd3e * UPCIE_NSEC_PER_USEC;
	if (shutdown < UPCIE_NVME_CTRL_SHUTDOWN_MIN)
		shutdown = UPCIE_NVME_CTRL_SHUTDOWN_MIN;
	if (shutdown > UPCIE_NVME_CTRL_SHUTDOWN_MAX)
		shutdown = UPCIE_NVME_CTRL_SHUTDOWN_MAX;
	c->shutdown_timeout_ns = shutdown;
	/* admin data: what the admin list pages can describe, at most 2 MiB, never above MDTS */
	c->admin_dptr.max_bytes = UINT64_C(2) << 20;
	if (c->admin_dptr.max_bytes > c->max_xfer)
		c->admin_dptr.max_bytes = c->max_xfer;
	return 0;
}

/* Identify Controller and keep what the driver needs. Lock not needed (bring-up). */
static inline int upcie_nvme_ctrl_identify_ctrl_(struct upcie_nvme_ctrl *c)
{
	int err = upcie_nvme_ctrl_identify(c, UPCIE_NVME_CNS_CTRL, 0, &c->id);
	uint8_t *nvm;

	if (err)
		return UPCIE_FAIL(err, "nvme %s: Identify Controller failed", c->name);
	err = upcie_nvme_ctrl_id_apply_(c);
	if (err)
		return err;
	/*
	 * The NVM command set's own Identify Controller (NVMe 2.0; earlier controllers answer it
	 * with an error, and have no such limits): VSL, WZSL, WUSL, DMRL at bytes 0..3, DMRSL at
	 * 4, DMSL at 8. Known up front, so a request is refused before it is sent, never halfway.
	 */
	if (upcie_nvme_cc_css(c->cc) != UPCIE_NVME_CC_CSS_IOCS && c->vs < UPCIE_NVME_VS(2, 0, 0))
		return 0; /* no I/O command set specific Identify before those */
	nvm = (uint8_t *)calloc(1, 4096);
	if (nvm &&
	    !upcie_nvme_ctrl_identify_csi(c, UPCIE_NVME_CNS_CS_CTRL, 0, UPCIE_NVME_CSI_NVM, nvm)) {
		unsigned min_shift = upcie_nvme_cap_mpsmin_shift(c->cap);

		c->wz_max_bytes =
		    nvm[1] && nvm[1] + min_shift < 64 ? UINT64_C(1) << (nvm[1] + min_shift) : 0;
		c->dmrl = nvm[3];
		memcpy(&c->dmrsl, nvm + 4, sizeof(c->dmrsl));
	}
	free(nvm);
	return 0;
}

/*
 * I/O queue identifiers whose doorbells lie inside BAR0: queue q's CQ head doorbell ends at
 * 0x1000 + (2q + 2) * stride. A controller may grant more queues than its BAR0 has doorbells
 * for (or BAR0 may be mapped short); Linux then uses fewer queues, and so does upcie.
 */
static inline uint32_t upcie_nvme_ctrl_bar_queues_(const struct upcie_nvme_ctrl *c)
{
	uint64_t stride = UINT64_C(4) << c->dstrd, room;

	if (c->regs_size < UPCIE_NVME_REG_DBS + 2 * stride)
		return 0;
	room = (c->regs_size - UPCIE_NVME_REG_DBS) / (2 * stride); /* doorbell pairs, admin too */
	return room - 1 > 65535 ? 65535 : (uint32_t)(room - 1);
}

/* Set Features Number of Queues; record the grant (both counts' minimum, at most asked). */
static inline int upcie_nvme_ctrl_set_queues_locked_(struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_cqe cqe;
	uint32_t nsq, ncq;
	int err;

	if (upcie_nvme_cc_css(c->cc) == UPCIE_NVME_CC_CSS_ADMIN) {
		c->nqueues = 0;
		return 0;
	}
	upcie_nvme_cmd_set_num_queues(&sqe, c->want_queues, c->want_queues);
	err = upcie_nvme_ctrl_admin_locked_(c, &sqe, NULL, 0, 0, &cqe);
	if (err == -EIO) {
		/* the controller answered, and said no: it still works for admin commands */
		UPCIE_WARN("nvme %s: Set Features Number of Queues failed (status 0x%03x): "
			   "admin-only controller, no I/O queues",
			   c->name, upcie_nvme_cqe_code(&cqe));
		c->nqueues = 0;
		return 0;
	}
	if (err)
		return UPCIE_FAIL(err, "nvme %s: Set Features Number of Queues failed", c->name);
	nsq = upcie_nvme_num_queues_sq(cqe.dw0);
	ncq = upcie_nvme_num_queues_cq(cqe.dw0);
	nsq = nsq < ncq ? nsq : ncq;
	c->nqueues = nsq < c->want_queues ? nsq : c->want_queues;
	if (c->nqueues > upcie_nvme_ctrl_bar_queues_(c)) {
		UPCIE_WARN(
		    "nvme %s: %u I/O queues granted, BAR0 (%zu bytes, doorbell stride %u) has "
		    "doorbells for %u: using %u",
		    c->name, c->nqueues, c->regs_size, 4u << c->dstrd,
		    upcie_nvme_ctrl_bar_queues_(c), upcie_nvme_ctrl_bar_queues_(c));
		c->nqueues = upcie_nvme_ctrl_bar_queues_(c);
	}
	return 0;
}

/* Everything after registers and host memory are known: shared by init and open. */
static inline int upcie_nvme_ctrl_setup_(struct upcie_nvme_ctrl *c,
					 const struct upcie_nvme_ctrl_opts *o)
{
	uint64_t page;
	int err;

	c->admin_depth = o->admin_depth ? o->admin_depth : UPCIE_NVME_CTRL_ADMIN_DEPTH;
	c->admin_timeout_ns =
	    o->admin_timeout_ns ? o->admin_timeout_ns : UPCIE_NVME_CTRL_ADMIN_TIMEOUT;
	c->abort_timeout_ns =
	    o->abort_timeout_ns ? o->abort_timeout_ns : UPCIE_NVME_CTRL_ABORT_TIMEOUT;
	c->want_queues = o->io_queues ? o->io_queues : UPCIE_NVME_CTRL_IO_QUEUES;
	c->aer_opt = o->aers;
	c->io_retries = o->io_retries ? o->io_retries : UPCIE_NVME_CTRL_IO_RETRIES;
	c->shutdown_timeout_ns = UPCIE_NVME_CTRL_SHUTDOWN_MIN;
	if (c->admin_depth < 2 || c->admin_depth > 4096 || c->want_queues > 65535)
		return UPCIE_FAIL(-EINVAL, "nvme %s: admin depth %u (2..4096), %u I/O queues",
				  c->name, c->admin_depth, c->want_queues);
	err = pthread_mutex_init(&c->lock, NULL);
	if (err)
		return UPCIE_FAIL(-err, "nvme %s: mutex: %s", c->name, strerror(err));
	c->lock_live = true;
	err = upcie_heap_init(&c->heap, c->host);
	if (err)
		return err;
	/* host-page aligned: the controller page is never larger (see upcie_nvme_ctrl_caps_()) */
	page = (uint64_t)sysconf(_SC_PAGESIZE);
	if (page < 4096)
		page = 4096;
	err = upcie_heap_alloc_array(&c->heap, 1, (uint64_t)c->admin_depth * 64, page, &c->asq);
	if (!err)
		err = upcie_heap_alloc_array(&c->heap, 1, (uint64_t)c->admin_depth * 16, page,
					     &c->acq);
	if (!err)
		err = upcie_heap_alloc(&c->heap, UPCIE_NVME_CTRL_SCRATCH, page, &c->scratch);
	if (!err)
		err = upcie_heap_alloc_array(&c->heap, UPCIE_NVME_CTRL_ADMIN_LISTS, page, page,
					     &c->alists);
	if (err)
		return UPCIE_FAIL(err, "nvme %s: host memory too small for the admin queues",
				  c->name);
	if (!c->asq.vaddr || !c->acq.vaddr)
		return UPCIE_FAIL(-EINVAL, "nvme %s: host memory has no CPU view", c->name);
	pthread_mutex_lock(&c->lock);
	err = upcie_nvme_ctrl_enable_(c);
	pthread_mutex_unlock(&c->lock);
	if (err)
		return err;
	/* admin data until Identify Controller tells MDTS (never below 2 pages): one page */
	c->admin_dptr.page_shift = c->page_shift;
	c->admin_dptr.max_bytes = UINT64_C(1) << c->page_shift;
	c->admin_dptr.sgl_dword = false;
	err = upcie_nvme_ctrl_identify_ctrl_(c);
	if (err)
		return err;
	pthread_mutex_lock(&c->lock);
	err = upcie_nvme_ctrl_set_queues_locked_(c);
	pthread_mutex_unlock(&c->lock);
	if (err)
		return err;
	c->ioqs = (struct upcie_nvme_ioq **)calloc((size_t)c->nqueues + 1, sizeof(*c->ioqs));
	if (!c->ioqs)
		return UPCIE_FAIL(-ENOMEM, "nvme %s: out of memory", c->name);
	c->nslots = c->nqueues;
	if (o->irq_vectors) {
		if (!c->dev.open)
			return UPCIE_FAIL(-EOPNOTSUPP,
					  "nvme %s: interrupts need a controller opened with "
					  "upcie_nvme_ctrl_open() on a vfio path",
					  c->name);
		err = upcie_nvme_dev_irq_enable(&c->dev, o->irq_vectors, &c->irqs);
		if (err)
			return err;
	}
	upcie_nvme_ctrl_events_setup_(c);
	UPCIE_DBG("nvme %s: ready: %s %s %s, VS %u.%u, MDTS %" PRIu64 " B, %u I/O queues, SGL %d",
		  c->name, c->mn, c->sn, c->fr, upcie_nvme_vs_mjr(c->vs), upcie_nvme_vs_mnr(c->vs),
		  c->max_xfer, c->nqueues, c->sgl);
	return 0;
}

/*
 * Stop the controller the dev was opened on, bus mastering still off: CC.EN = 0 and wait for
 * CSTS.RDY = 0; a controller that does not stop gets a function reset and another try. The
 * controller then processes nothing, so bus mastering can be turned on. -ETIMEDOUT (with the
 * reset's failure logged) when it still does not stop, -ENODEV when it is gone.
 */
static inline int upcie_nvme_ctrl_quiesce_(struct upcie_nvme_ctrl *c)
{
	uint32_t css = 0;
	int err, e2;

	err = upcie_nvme_ctrl_caps_(c, &css);
	if (err)
		return err;
	err = upcie_nvme_ctrl_disable_(c);
	if (!err || err == -ENODEV)
		return err;
	UPCIE_WARN("nvme %s: the controller does not disable; resetting the function", c->name);
	e2 = upcie_nvme_dev_reset(&c->dev);
	/* the reset restores the command register as saved: bus mastering off; make sure */
	if (!e2)
		e2 = upcie_nvme_dev_bus_master(&c->dev, false);
	if (!e2)
		e2 = upcie_nvme_ctrl_disable_(c);
	if (e2)
		return UPCIE_FAIL(err,
				  "nvme %s: the controller cannot be stopped (disable and function "
				  "reset failed): bus mastering stays off",
				  c->name);
	return 0;
}

#endif /* UPCIE_NVME_CTRL_SETUP_H */
