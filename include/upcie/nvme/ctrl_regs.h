/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The NVMe controller object (struct upcie_nvme_ctrl, its options and I/O queue structs) and its
 * registers: 32/64-bit access, CSTS waits, enable and disable, halt (disable, else bus mastering
 * off) and failure (escalation to state FAILED), CAP checks and the admin queue registers. Every
 * other part of the controller (nvme/ctrl.h lists them) builds on this one.
 *
 * One object whatever the path (nvme/dev.h: uio, vfio type1, vfio cdev + iommufd): the
 * controller sees a register mapping and dmamem objects only. upcie_nvme_ctrl_open() takes a
 * PCI function; upcie_nvme_ctrl_init() takes registers and host DMA memory the caller already
 * has (another driver framework, or a controller model in tests).
 *
 * Bus mastering and memory (upcie_nvme_ctrl_open()/close()): open finds bus mastering off
 * (nvme/dev.h), stops whatever the last owner left running (CC.EN = 0 and CSTS.RDY = 0, or a
 * function reset when the controller does not disable) and only then turns bus mastering on, so
 * a controller a crashed process left enabled cannot DMA into addresses it still holds; then
 * (uio) the DMA memory files that process left behind are freed (upcie_nvme_dev_reclaim()). Close
 * disables the controller, turns bus mastering off and checks it, then frees the host memory;
 * when the disable failed the controller may still write that memory, so it is kept for the
 * life of the process (upcie_dmamem_keep()) instead of freed.
 */
#ifndef UPCIE_NVME_CTRL_REGS_H
#define UPCIE_NVME_CTRL_REGS_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <upcie/base/barrier.h>
#include <upcie/base/bits.h>
#include <upcie/base/clock.h>
#include <upcie/base/log.h>
#include <upcie/base/mmio.h>
#include <upcie/mem/dmamem.h>
#include <upcie/mem/heap.h>
#include <upcie/nvme/cmd.h>
#include <upcie/nvme/dev.h>
#include <upcie/nvme/dptr.h>
#include <upcie/nvme/prp.h>
#include <upcie/nvme/qpair.h>
#include <upcie/nvme/spec.h>
#include <upcie/nvme/spec_id.h>
#include <upcie/vfio/irq.h>

#define UPCIE_NVME_CTRL_ADMIN_DEPTH   32u
#define UPCIE_NVME_CTRL_ADMIN_TIMEOUT (10 * UPCIE_NSEC_PER_SEC)
#define UPCIE_NVME_CTRL_HOST_MEM      ((size_t)16 << 20)
#define UPCIE_NVME_CTRL_IO_QUEUES     64u
#define UPCIE_NVME_CTRL_SCRATCH	      ((size_t)16 << 10) /* bounce buffer for admin data */
#define UPCIE_NVME_CTRL_ADMIN_LISTS   4u		 /* PRP list pages for admin data */
#define UPCIE_NVME_CTRL_SHUTDOWN_MIN  (5 * UPCIE_NSEC_PER_SEC)
#define UPCIE_NVME_CTRL_SHUTDOWN_MAX  (60 * UPCIE_NSEC_PER_SEC)
#define UPCIE_NVME_CTRL_ABORT_TIMEOUT (2 * UPCIE_NSEC_PER_SEC)
/* Retries of an I/O command failed with DNR clear (opts.io_retries 0), as the Linux driver. */
#define UPCIE_NVME_CTRL_IO_RETRIES   5u
#define UPCIE_NVME_IOQ_DEPTH	     256u
#define UPCIE_NVME_IOQ_MAX_XFER	     ((uint64_t)512 << 10)
#define UPCIE_NVME_CTRL_REG_POLL_NS  (50 * UPCIE_NSEC_PER_USEC)
#define UPCIE_NVME_CTRL_DELETE_DRAIN (1 * UPCIE_NSEC_PER_SEC)

enum upcie_nvme_ctrl_state {
	UPCIE_NVME_CTRL_CLOSED = 0,
	UPCIE_NVME_CTRL_READY = 1,    /* enabled, admin queue working */
	UPCIE_NVME_CTRL_SHUTDOWN = 2, /* shut down (CSTS.SHST complete): reset to use it again */
	UPCIE_NVME_CTRL_FAILED = 3,   /* enable or a reset failed: reset or close */
};

struct upcie_nvme_ctrl_opts {
	struct upcie_nvme_dev_opts dev; /* upcie_nvme_ctrl_open(): path, binding, sharing */
	uint32_t admin_depth;		/* admin SQ/CQ entries, 2..4096; 0: 32 */
	uint64_t admin_timeout_ns;	/* per admin command; 0: 10 s */
	size_t host_mem;		/* host DMA memory for queues and lists; 0: 16 MiB */
	uint32_t io_queues;		/* I/O queue pairs asked for (Set Features); 0: 64 */
	uint32_t irq_vectors;		/* MSI-X vectors to enable (vfio paths); 0: none */
	uint64_t
	    abort_timeout_ns; /* after an Abort, how long the command may take to end; 0: 2 s */
	uint32_t aers;	      /* Asynchronous Event Requests the driver keeps: 0: min(AERL + 1, 4);
			  UPCIE_NVME_CTRL_AERS_OFF: none (the caller may send its own) */
	uint32_t io_retries;  /* retries of an I/O command that failed with DNR clear (nvme/ns.h):
				0: 5; UPCIE_NVME_CTRL_RETRIES_OFF: none */
};

/* opts.io_retries: I/O commands are never retried (Namespace Not Ready neither). */
#define UPCIE_NVME_CTRL_RETRIES_OFF UINT32_MAX

/* opts.aers: the driver sends no AERs and handles no events; upcie_nvme_ctrl_admin() then
 * passes the caller's Asynchronous Event Requests through. */
#define UPCIE_NVME_CTRL_AERS_OFF UINT32_MAX

/* The controller memory buffer once enabled (upcie_nvme_ctrl_cmb_enable()). */
struct upcie_nvme_cmb {
	struct upcie_dmamem mem; /* CPU view through the BAR; device address = cba + offset */
	struct upcie_heap heap;	 /* give &ctrl->cmb.heap as an I/O queue's sq_heap */
	struct upcie_nvme_dev_bar bar;
	uint64_t cba;		/* the CMB's controller address (CMBMSC.CBA from NVMe 1.4) */
	uint64_t size;		/* bytes (CMBSZ) */
	uint64_t reserved;	/* bytes of device address space reserved for cba (vfio) */
	uint32_t cmbloc, cmbsz; /* as read (after CMBMSC.CRE from NVMe 1.4) */
	bool claimed;		/* cba is the BAR's own address, claimed in the IOVA space */
	bool on;
};

/*
 * A BAR that holds the CMB, for upcie_nvme_ctrl_cmb_enable_at() (controllers from
 * upcie_nvme_ctrl_init(), whose BARs the caller maps).
 */
struct upcie_nvme_cmb_bar {
	uint32_t bir; /* the BAR's index: CMBLOC.BIR must name it */
	void *addr;   /* CPU mapping of the whole BAR; must outlive the CMB */
	size_t size;
	uint64_t bus; /* the BAR's address as the controller decodes it (before NVMe 1.4 the CMB
			 is there) */
	uint64_t cba; /* NVMe >= 1.4: the controller address to program in CMBMSC.CBA for the
			 CMB, where no host memory is mapped for the device; 0: bus + offset */
};

struct upcie_nvme_ioq;
struct upcie_nvme_ctrl;

/*
 * An asynchronous event the controller reported (an Asynchronous Event Request completed), with
 * the log page it names as read to clear it. Handed to the handler of
 * upcie_nvme_ctrl_set_event_handler() after the driver's own handling.
 */
struct upcie_nvme_event {
	uint32_t dw0;	    /* the AER completion's dword 0 */
	uint8_t type;	    /* UPCIE_NVME_AE_TYPE_*: dw0 bits 2:0 */
	uint8_t info;	    /* dw0 bits 15:8 (per type: UPCIE_NVME_AE_NOTICE_* for notices) */
	uint8_t lid;	    /* the log page: dw0 bits 23:16 */
	int log_err;	    /* 0: log[] holds log_len bytes of it; else reading it failed */
	size_t log_len;	    /* bytes in log[] */
	const uint8_t *log; /* the log page's first log_len bytes; valid during the call */
	uint32_t nchanged;  /* namespace attribute notice: NSIDs revalidated */
	bool fw_paused;	    /* firmware activation: CSTS.PP was seen set */
	int fw_err;	    /* ... 0: CSTS.PP cleared in time; -ETIMEDOUT: not within MTFA */
};

/* Called once per event, without a lock held; may issue admin commands. */
typedef void (*upcie_nvme_event_fn)(void *ctx, struct upcie_nvme_ctrl *c,
				    const struct upcie_nvme_event *ev);

/* Asynchronous Event Requests kept outstanding: min(AERL + 1, this). */
#define UPCIE_NVME_CTRL_AERS 4u
/* Events read and handed on per upcie_nvme_ctrl_admin_poll() call, at most. */
#define UPCIE_NVME_CTRL_EVENTS 16u
/* An admin command submitted by upcie_nvme_ctrl_admin_async() (or an AER of the driver's). */
struct upcie_nvme_admin_rec_ {
	upcie_nvme_cpl_fn cb;
	void *ctx;
	struct upcie_nvme_cqe cqe;
	int err;
	uint16_t cid;
	uint8_t opc;   /* the command's opcode: whether its success calls for a revalidation */
	uint8_t state; /* UPCIE_NVME_AREC_* */
	bool aer;      /* one of the driver's Asynchronous Event Requests */
};
#define UPCIE_NVME_AREC_FREE	0
#define UPCIE_NVME_AREC_PENDING 1
#define UPCIE_NVME_AREC_DONE	2

/* A namespace as the controller last saw it (nvme/ctrl_ns.h); owned by the controller. */
struct upcie_nvme_ns_rec_ {
	uint32_t nsid;
	uint32_t gen; /* advanced whenever what follows changed, or the namespace went */
	bool gone;    /* not active any more (detached, deleted) */
	uint64_t nsze;
	uint32_t lba_bytes, ms;
	uint8_t lbaf, dps, csi, pif, sts;
	bool ext;
	uint64_t zone_blocks;
};

/*
 * A completion whose callback is delivered once the controller's lock is released
 * (upcie_nvme_defer_*_()): the driver's stop paths (reset, delete, close) end commands with the
 * lock held and hand the callbacks on afterwards, so a callback can use the controller.
 */
struct upcie_nvme_defer_ent_ {
	upcie_nvme_cpl_fn cb;
	void *ctx;
	struct upcie_nvme_qpair *qp;
	uint32_t slot;
	int err;
	uint8_t state; /* 1: armed (outstanding), 2: ended, waiting for delivery */
	struct upcie_nvme_cqe cqe;
};
struct upcie_nvme_defer_ {
	struct upcie_nvme_defer_ent_ *e;
	uint32_t n, cap;
};

struct upcie_nvme_ctrl {
	struct upcie_nvme_qpair admin; /* polled with `lock` held */
	volatile uint8_t *regs;
	size_t regs_size;
	enum upcie_nvme_ctrl_state state;
	char name[UPCIE_PCI_BDF_STRLEN];
	/* from the registers */
	uint64_t cap;
	uint32_t vs;
	uint32_t dstrd;
	uint32_t cc;	     /* as written at enable */
	unsigned page_shift; /* controller memory page: 12 + CC.MPS */
	uint32_t mqes;	     /* I/O queue entries allowed: CAP.MQES + 1 */
	uint64_t ready_timeout_ns;
	uint64_t shutdown_timeout_ns;
	uint64_t admin_timeout_ns;
	uint64_t abort_timeout_ns;
	uint32_t admin_depth;
	/*
	 * The controller cannot touch host memory any more: disabled (CC.EN = 0 and CSTS.RDY = 0
	 * seen), gone (registers read all ones), or its bus mastering turned off. Set by a reset
	 * or an escalation, cleared when it is enabled again. Written under `lock` (release: see
	 * upcie_nvme_ctrl_stopped_()); the I/O queues' owners read it without the lock (acquire).
	 */
	bool stopped;
	/* Why the last halt stopped it, for those waits: -ENODEV (gone), -EIO (fatal status,
	 * CSTS.CFS), -ECANCELED (a reset or an escalation); 0 when no halt stopped it. Written
	 * before `stopped` is set, read after `stopped` was seen set. */
	int stop_err;
	bool gone;   /* registers read all ones */
	bool bm_off; /* halt turned bus mastering off (the controller did not disable) */
	/* from Identify Controller */
	struct upcie_nvme_id_ctrl id;
	char sn[21], mn[41], fr[9]; /* trimmed copies, unprintable bytes as '?' */
	uint64_t max_xfer;	    /* MDTS in bytes; UINT64_MAX: no limit */
	bool sgl;		    /* SGLs supported for NVM commands */
	bool sgl_dword;		    /* ... with dword-aligned data blocks */
	bool vwc;		    /* a volatile write cache is present */
	uint32_t nn;		    /* highest namespace ID (NN, at most 0xfffffffe) */
	/* NVM command set limits (Identify CNS 06h, CSI 0; 0: none reported) */
	uint64_t wz_max_bytes; /* Write Zeroes: 2^WZSL minimum memory pages */
	uint32_t dmrl;	       /* Dataset Management: ranges per command */
	uint32_t dmrsl;	       /* ... logical blocks per range */
	uint32_t nbad_id;   /* Identify fields out of range: each logged, then clamped or refused */
	uint32_t nssr_seen; /* NVM subsystem resets seen (CSTS.NSSRO at bring-up or reset) */
	/* I/O queues: granted by Set Features, identifiers 1..nqueues */
	uint32_t want_queues;
	uint32_t nqueues;	      /* granted by the last Set Features */
	uint32_t nslots;	      /* ioqs[1..nslots]: the first grant, fixed for the object */
	struct upcie_nvme_ioq **ioqs; /* by qid, NULL: free */
	/* memory */
	struct upcie_dmamem host_own; /* when open allocated it */
	const struct upcie_dmamem *host;
	struct upcie_heap heap; /* over *host: admin queues, I/O queues, list pages */
	struct upcie_heap_buf asq, acq, scratch, alists;
	struct upcie_nvme_dptr_cfg admin_dptr;
	struct upcie_nvme_cmb cmb;
	struct upcie_vfio_irqs irqs;
	/* the PCI function, when upcie_nvme_ctrl_open() reached it */
	struct upcie_nvme_dev dev;
	pthread_mutex_t lock;
	bool lock_live;
	/* asynchronous admin commands and events (nvme/ctrl_events.h); under `lock` */
	struct upcie_nvme_admin_rec_ *arec; /* admin_depth records */
	uint32_t aer_want;		    /* AERs to keep outstanding: min(AERL + 1, 4) */
	uint32_t aer_opt;		    /* opts.aers */
	uint32_t aer_out;		    /* outstanding now */
	uint32_t aen_config;		    /* Asynchronous Event Configuration set (0: none) */
	uint32_t ev_dw0[UPCIE_NVME_CTRL_EVENTS]; /* events completed, not yet handled */
	uint32_t nev;
	uint64_t nevents, nev_dropped; /* events handled; lost (queue of events full) */
	upcie_nvme_event_fn ev_fn;
	void *ev_ctx;
	pthread_t ev_thread; /* upcie_nvme_ctrl_events_start() */
	pthread_cond_t ev_cond;
	bool ev_live, ev_stop;
	uint64_t ev_interval_ns;
	uint32_t effects[256]; /* Commands Supported and Effects, admin opcodes (0: not read) */
	bool effects_read;
	/* namespaces seen by upcie_nvme_ns_open(), for revalidation (nvme/ctrl_ns.h) */
	struct upcie_nvme_ns_rec_ **nsrec;
	uint32_t nnsrec, nsrec_cap;
	uint64_t nrevalidated; /* namespaces found changed or gone */
	/* retries of I/O commands failed with DNR clear (nvme/ns.h) */
	uint32_t io_retries; /* per command (opts.io_retries) */
	bool acre;	     /* Host Behavior Support ACRE set: the controller may ask for delays */
	uint64_t nretried;   /* commands sent again (atomic: any queue's owner adds) */
};

/* The deferred completion's recorder (the slot's callback while armed). */
static inline void upcie_nvme_defer_cb_(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct upcie_nvme_defer_ent_ *e = (struct upcie_nvme_defer_ent_ *)ctx;

	e->cqe = *cqe;
	e->err = err;
	e->state = 2;
}

/* Outstanding commands of `qp` with a callback (what upcie_nvme_defer_arm_() takes). */
static inline uint32_t upcie_nvme_defer_count_(const struct upcie_nvme_qpair *qp)
{
	uint32_t n = 0;

	for (uint32_t c = 0; qp->slots && c < qp->ncids; c++)
		n += upcie_nvme_qpair_tag_outstanding_(qp->slots[c].tag) &&
		     !(qp->slots[c].tag & UPCIE_NVME_CID_NOCB_);
	return n;
}

/* Room for `n` deferred completions more. Returns 0 or -ENOMEM (nothing changed). */
static inline int upcie_nvme_defer_reserve_(struct upcie_nvme_defer_ *d, uint32_t n)
{
	struct upcie_nvme_defer_ent_ *e;

	if (d->n + n <= d->cap)
		return 0;
	if (d->n)
		return -ENOMEM; /* armed entries are pointed at: never moved */
	e = (struct upcie_nvme_defer_ent_ *)calloc(n ? n : 1, sizeof(*e));
	if (!e)
		return UPCIE_FAIL(-ENOMEM, "nvme: out of memory for %u completions", n);
	free(d->e);
	d->e = e;
	d->cap = n ? n : 1;
	return 0;
}

/*
 * Point every outstanding command of `qp` that has a callback at a recorder: whatever ends it
 * now (reap, stop, fini) records the completion instead of calling back. Lock held; the room was
 * reserved (upcie_nvme_defer_reserve_()).
 */
static inline void upcie_nvme_defer_arm_(struct upcie_nvme_defer_ *d, struct upcie_nvme_qpair *qp)
{
	for (uint32_t c = 0; qp->slots && c < qp->ncids && d->n < d->cap; c++) {
		struct upcie_nvme_cid_slot *s = &qp->slots[c];
		struct upcie_nvme_defer_ent_ *e;

		if (!upcie_nvme_qpair_tag_outstanding_(s->tag) || (s->tag & UPCIE_NVME_CID_NOCB_) ||
		    s->cb == upcie_nvme_defer_cb_)
			continue;
		e = &d->e[d->n++];
		e->cb = s->cb;
		e->ctx = s->ctx;
		e->qp = qp;
		e->slot = c;
		e->err = 0;
		e->state = 1;
		s->cb = upcie_nvme_defer_cb_;
		s->ctx = e;
	}
}

/*
 * Lock released: commands still outstanding get their own callbacks back, then the recorded
 * completions are delivered, each once, in the order of the queues and CIDs. Callbacks may use
 * the controller (admin commands, submissions on live queues, even a reset: it defers its own).
 * Returns the number delivered.
 */
static inline int upcie_nvme_defer_finish_(struct upcie_nvme_defer_ *d)
{
	int n = 0;

	for (uint32_t i = 0; i < d->n; i++) {
		struct upcie_nvme_defer_ent_ *e = &d->e[i];
		struct upcie_nvme_cid_slot *s;

		if (e->state != 1 || !e->qp->slots)
			continue;
		s = &e->qp->slots[e->slot];
		if (s->cb == upcie_nvme_defer_cb_ && s->ctx == e) {
			s->cb = e->cb;
			s->ctx = e->ctx;
		}
		e->state = 0;
	}
	for (uint32_t i = 0; i < d->n; i++) {
		struct upcie_nvme_defer_ent_ e = d->e[i];

		if (e.state != 2)
			continue;
		d->e[i].state = 0;
		e.cb(e.ctx, &e.cqe, e.err);
		n++;
	}
	free(d->e);
	memset(d, 0, sizeof(*d));
	return n;
}

struct upcie_nvme_ioq_opts {
	uint32_t depth;		    /* SQ and CQ entries, 2..CAP.MQES + 1; 0: min(256, MQES + 1) */
	uint64_t max_xfer;	    /* bytes per command; 0: min(MDTS, 512 KiB); larger requests
				       are split (nvme/ns.h) */
	struct upcie_heap *sq_heap; /* SQ memory; NULL: host memory; &ctrl->cmb.heap: the CMB */
	struct upcie_heap *cq_heap; /* CQ memory (needs a CPU view); NULL: host memory */
	struct upcie_heap *list_heap; /* PRP list / SGL segment pages; NULL: host memory */
	bool sgl;		      /* data pointers as SGLs (the controller must support them) */
	bool irq;		      /* CQ interrupts on MSI-X vector `vector` */
	uint16_t vector;
	uint16_t qid; /* 0: the lowest free identifier */
};

/* A command of a request that failed with DNR clear and is sent again (nvme/ns.h), per CID
 * slot of its queue; the CID slot's tag says whether it waits (UPCIE_NVME_CID_HELD_). */
struct upcie_nvme_retry_ {
	uint64_t due_ns;   /* when to send it (upcie_time_ns()) */
	uint64_t first_ns; /* its first failure: Namespace Not Ready is waited out from there */
	struct upcie_nvme_cqe cqe; /* the failure that asked for this retry */
	uint16_t n;		   /* retries so far */
};

struct upcie_nvme_ioq {
	struct upcie_nvme_qpair qp; /* hot: the protocol state */
	struct upcie_nvme_dptr_cfg dptr;
	const struct upcie_dmamem *lmem; /* per-CID list pages: lpages from loff + cid * lpages */
	uint64_t loff;
	uint32_t lpages;
	bool sgl;
	bool irq;
	uint16_t vector;
	uint16_t qid;
	uint32_t depth;
	struct upcie_nvme_ctrl *ctrl;
	struct upcie_heap *sq_heap, *cq_heap, *list_heap;
	struct upcie_heap_buf sqb, cqb, lb;
	void *tables;
	bool live;
	bool ext;  /* rings in memory given by upcie_nvme_ioq_create_ext(), driven elsewhere */
	bool lost; /* ext: a reset took the queue from the controller; only deletion is left */
	/* the command of each CID slot as built (sent again on a retry: nvme/ns.h), and the
	 * retries waiting for their delay; not for ext queues */
	struct upcie_nvme_sqe *shadow;
	struct upcie_nvme_retry_ *retry;
	uint32_t nparked; /* retries that may be waiting to be sent (0: none) */
};

/*
 * A queue pair whose rings live in memory the caller mapped for the controller and whose
 * commands another party drives (another process, through its own upcie_nvme_qpair on the same
 * memory): served/server.h creates its clients' queues with it.
 */
struct upcie_nvme_ioq_ext {
	uint32_t depth;	  /* SQ and CQ entries, 2..CAP.MQES + 1 */
	uint64_t sq_iova; /* device address of the SQ (depth * 64 bytes, controller-page aligned) */
	uint64_t cq_iova; /* device address of the CQ (depth * 16 bytes, controller-page aligned) */
	void *sq; /* CPU view of the SQ and CQ, where the caller has one; the CQ is zeroed */
	void *cq;
	uint16_t qid; /* 0: the lowest free identifier */
};

/*
 * Arm every I/O queue of `c` (lock held): room for all their commands with callbacks reserved
 * first. Returns 0 or -ENOMEM (nothing armed).
 */
static inline int upcie_nvme_defer_arm_all_locked_(struct upcie_nvme_defer_ *d,
						   struct upcie_nvme_ctrl *c)
{
	uint32_t n = 0;
	int err;

	for (uint32_t q = 1; c->ioqs && q <= c->nslots; q++)
		if (c->ioqs[q])
			n += upcie_nvme_defer_count_(&c->ioqs[q]->qp);
	err = upcie_nvme_defer_reserve_(d, n);
	if (err)
		return err;
	for (uint32_t q = 1; c->ioqs && q <= c->nslots; q++)
		if (c->ioqs[q])
			upcie_nvme_defer_arm_(d, &c->ioqs[q]->qp);
	return 0;
}

/* Register access. 64-bit registers as two 32-bit halves (low first), as every controller
 * accepts. */
static inline uint32_t upcie_nvme_ctrl_rd32(const struct upcie_nvme_ctrl *c, size_t off)
{
	return upcie_mmio_read32(c->regs, off);
}

/* Write the 32-bit register at `off`. */
static inline void upcie_nvme_ctrl_wr32(struct upcie_nvme_ctrl *c, size_t off, uint32_t v)
{
	upcie_mmio_write32(c->regs, off, v);
}

/* Read the 64-bit register at `off` as two 32-bit halves, low first. */
static inline uint64_t upcie_nvme_ctrl_rd64(const struct upcie_nvme_ctrl *c, size_t off)
{
	return upcie_mmio_read64_lohi(c->regs, off);
}

/* Write the 64-bit register at `off` as two 32-bit halves, low first. */
static inline void upcie_nvme_ctrl_wr64(struct upcie_nvme_ctrl *c, size_t off, uint64_t v)
{
	upcie_mmio_write64_lohi(c->regs, off, v);
}

/*
 * Copy a space-padded Identify string, trimmed, NUL terminated. The device wrote it: bytes
 * outside printable ASCII become '?', so a log line can never carry control sequences.
 */
static inline void upcie_nvme_ctrl_str_(char *dst, const char *src, size_t n)
{
	size_t len = n;

	while (len && (src[len - 1] == ' ' || src[len - 1] == '\0'))
		len--;
	for (size_t i = 0; i < len; i++)
		dst[i] = src[i] >= 0x20 && src[i] < 0x7f ? src[i] : '?';
	dst[len] = '\0';
}

/*
 * Wait until (CSTS & mask) == want, bounded by timeout_ns. CSTS.CFS ends the wait with -EIO
 * unless `cfs_ok` (a disable clears it), all ones with -ENODEV. *csts gets the last value.
 */
static inline int upcie_nvme_ctrl_csts_wait_(struct upcie_nvme_ctrl *c, uint32_t mask,
					     uint32_t want, uint64_t timeout_ns, bool cfs_ok,
					     uint32_t *csts)
{
	struct upcie_deadline dl;
	uint32_t v;

	upcie_deadline_set(&dl, timeout_ns);
	for (;;) {
		v = upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CSTS);
		*csts = v;
		if (v == UPCIE_NVME_REG_GONE)
			return -ENODEV;
		if (!cfs_ok && upcie_nvme_csts_cfs(v))
			return -EIO;
		if ((v & mask) == want)
			return 0;
		if (upcie_deadline_passed(&dl))
			return -ETIMEDOUT;
		upcie_sleep_ns(UPCIE_NVME_CTRL_REG_POLL_NS);
	}
}

/*
 * Set or clear c->stopped (lock held). The owners of the I/O queues read it without the lock
 * (nvme/ns.h): the release store makes what was written before it (c->stop_err, the admin queue
 * stopped) visible to a reader whose acquire load sees it set.
 */
static inline void upcie_nvme_ctrl_stopped_(struct upcie_nvme_ctrl *c, bool stopped)
{
	__atomic_store_n(&c->stopped, stopped, __ATOMIC_RELEASE);
}

/*
 * What a wait that saw c->stopped set (acquire) returns for the commands it ends: a dead
 * controller's error (-ENODEV, -EIO), as its timeout path would, else -ECANCELED.
 */
static inline int upcie_nvme_ctrl_stopped_err_(const struct upcie_nvme_ctrl *c)
{
	int why = __atomic_load_n(&c->stop_err, __ATOMIC_RELAXED);

	return why == -ENODEV || why == -EIO ? why : -ECANCELED;
}

/*
 * CC.EN = 0 and wait for CSTS.RDY = 0: a controller level reset, after which the controller
 * touches no host memory. A controller still becoming ready (CC.EN = 1, CSTS.RDY = 0: taken over
 * mid-enable, or our own enable timed out) is given its ready timeout to finish first: clearing
 * CC.EN before CSTS.RDY = 1 is not defined by the specification. A fatal status (CSTS.CFS) ends
 * that wait (it may never become ready; disabling is how it is reset). Sets c->stopped (and
 * c->gone for all ones). Returns 0, -ENODEV (all ones), -ETIMEDOUT (CSTS.RDY stays 1).
 */
static inline int upcie_nvme_ctrl_disable_(struct upcie_nvme_ctrl *c)
{
	uint32_t cc = upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CC);
	uint32_t csts = upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CSTS);
	int err = 0;

	if (csts == UPCIE_NVME_REG_GONE)
		err = -ENODEV;
	if (!err && upcie_nvme_cc_en(cc) && !(csts & 1) && !upcie_nvme_csts_cfs(csts)) {
		err = upcie_nvme_ctrl_csts_wait_(c, 1, 1, c->ready_timeout_ns, false, &csts);
		if (err == -ETIMEDOUT)
			UPCIE_ERR("nvme %s: CC.EN = 1 but not ready after %" PRIu64
				  " ms: disabling it anyway (CSTS 0x%08x)",
				  c->name, c->ready_timeout_ns / UPCIE_NSEC_PER_MSEC, csts);
		if (err != -ENODEV)
			err = 0;
	}
	if (!err) {
		if (upcie_nvme_cc_en(cc))
			upcie_nvme_ctrl_wr32(
			    c, UPCIE_NVME_REG_CC,
			    upcie_nvme_cc_set_shn(upcie_nvme_cc_set_en(cc, false), 0));
		err = upcie_nvme_ctrl_csts_wait_(c, 1, 0, c->ready_timeout_ns, true, &csts);
	}
	if (err == -ENODEV) {
		c->gone = true;
		upcie_nvme_ctrl_stopped_(c, true);
		return UPCIE_FAIL(err, "nvme %s: registers read all ones: device gone", c->name);
	}
	if (err)
		return UPCIE_FAIL(err,
				  "nvme %s: CSTS.RDY still 1 %" PRIu64 " ms after clearing CC.EN "
				  "(CSTS 0x%08x)",
				  c->name, c->ready_timeout_ns / UPCIE_NSEC_PER_MSEC, csts);
	upcie_nvme_ctrl_stopped_(c, true);
	return 0;
}

/*
 * Whether the controller is dead: -ENODEV when its registers read all ones (surprise removal),
 * -EIO for a fatal status (CSTS.CFS), 0 otherwise. Looked at on every timeout path.
 */
static inline int upcie_nvme_ctrl_dead_(struct upcie_nvme_ctrl *c)
{
	uint32_t csts;

	if (c->gone)
		return -ENODEV;
	csts = upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CSTS);
	if (csts == UPCIE_NVME_REG_GONE) {
		c->gone = true;
		return UPCIE_FAIL(-ENODEV, "nvme %s: registers read all ones: device gone",
				  c->name);
	}
	if (upcie_nvme_csts_cfs(csts))
		return UPCIE_FAIL(-EIO, "nvme %s: controller fatal status (CSTS 0x%08x)", c->name,
				  csts);
	return 0;
}

/*
 * Wake every owner of an interrupt queue that sleeps on its vector (upcie_nvme_ioq_irq_wait()):
 * the controller let go, and no interrupt will come from it, so without this a waiter sleeps to
 * its own deadline. One write to each such queue's eventfd, after c->stopped was set: a waiter
 * that looked at c->stopped before it was set and then sleeps finds the eventfd's counter
 * raised (it stays raised until read), so no wakeup is lost; and the write(2) orders the store
 * before the waiter's read(2) of the counter (the kernel's eventfd lock), so the waiter, looking
 * again once awake, sees c->stopped set. A queue's vector is its own (upcie_nvme_ioq_create()),
 * so the one extra count wakes its owner, who reads it as "look again". Lock held.
 *
 * UPCIE_NVME_TEST_NO_HALT_WAKE exists for the tests' negative control only: defined as an
 * expression, the wake is skipped while it is true (the rule removed).
 */
static inline void upcie_nvme_ctrl_wake_waiters_locked_(struct upcie_nvme_ctrl *c)
{
	const uint64_t one = 1;

#ifdef UPCIE_NVME_TEST_NO_HALT_WAKE
	if (UPCIE_NVME_TEST_NO_HALT_WAKE)
		return;
#endif
	for (uint32_t q = 1; c->ioqs && c->irqs.efd && q <= c->nslots; q++) {
		const struct upcie_nvme_ioq *io = c->ioqs[q];

		if (!io || !io->irq || io->vector >= c->irqs.count || c->irqs.efd[io->vector] < 0)
			continue;
		/* EAGAIN: the counter is full, so the waiter wakes anyway */
		if (write(c->irqs.efd[io->vector], &one, sizeof(one)) < 0 && errno != EAGAIN)
			UPCIE_WARN("nvme %s: waking the owner of queue %u (vector %u): %s", c->name,
				   q, io->vector, strerror(errno));
	}
}

/*
 * Make the controller let go of all host memory: reset it (CC.EN = 0), or, if it does not even
 * do that and we hold the PCI function, turn its bus mastering off. One rule for that fallback
 * everywhere: with bus mastering off the function cannot reach host memory, so it counts as
 * stopped (commands end, their memory goes back) for as long as bus mastering stays off; it is
 * turned on again only once the controller is disabled (upcie_nvme_ctrl_reset(): disable, else a
 * function reset, as at open), and close keeps the host memory of a controller that never
 * disabled (whoever turns bus mastering on next could let it resume). Then the admin commands
 * still outstanding end with -ECANCELED; the I/O queues' owners end theirs: their waits see
 * c->stopped at once, polling or asleep on an interrupt (upcie_nvme_ctrl_wake_waiters_locked_()),
 * and return c->stop_err's reason; upcie_nvme_ctrl_reset() brings the controller back. Lock
 * held. Returns 0 when the controller has let go (c->stopped), else the disable's error.
 *
 * upcie_nvme_ctrl_fail_locked_() is the escalation: a command that owns memory did not end (or
 * the controller is dead); it logs why and sets state FAILED first.
 */
static inline int upcie_nvme_ctrl_halt_locked_(struct upcie_nvme_ctrl *c)
{
	int err = 0;

	if (!c->stopped) {
		/* why, for the waiters: read before the disable clears CSTS.CFS */
		uint32_t csts =
		    c->gone ? UPCIE_NVME_REG_GONE : upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CSTS);

		__atomic_store_n(&c->stop_err,
				 csts == UPCIE_NVME_REG_GONE ? -ENODEV
				 : upcie_nvme_csts_cfs(csts) ? -EIO
							     : -ECANCELED,
				 __ATOMIC_RELAXED);
		err = upcie_nvme_ctrl_disable_(c);
		if (err == -ENODEV)
			err = 0; /* gone: it cannot reach our memory either */
	}
	if (err && c->dev.open && !upcie_nvme_dev_bus_master(&c->dev, false)) {
		UPCIE_ERR("nvme %s: not disabled: bus mastering turned off instead", c->name);
		upcie_nvme_ctrl_stopped_(c, true);
		c->bm_off = true;
		err = 0;
	}
	if (!c->stopped)
		return UPCIE_FAIL(err,
				  "nvme %s: the controller did not let go: its queues' memory "
				  "stays allocated",
				  c->name);
	upcie_nvme_qpair_stop(&c->admin, false);
	upcie_nvme_ctrl_wake_waiters_locked_(c);
	return 0;
}

static inline int upcie_nvme_ctrl_fail_locked_(struct upcie_nvme_ctrl *c, const char *why)
{
	UPCIE_ERR("nvme %s: %s: resetting the controller (CC.EN = 0)", c->name, why);
	c->state = UPCIE_NVME_CTRL_FAILED;
	return upcie_nvme_ctrl_halt_locked_(c);
}

/*
 * Read CAP/VS and derive what bring-up needs: page size, MQES, DSTRD, ready timeout, CC.CSS.
 * -ENODEV (all ones), -EOPNOTSUPP (no usable page size or command set).
 */
static inline int upcie_nvme_ctrl_caps_(struct upcie_nvme_ctrl *c, uint32_t *css)
{
	unsigned host_shift = upcie_log2((uint64_t)sysconf(_SC_PAGESIZE));
	unsigned lo, hi;
	uint32_t to;

	c->cap = upcie_nvme_ctrl_rd64(c, UPCIE_NVME_REG_CAP);
	c->vs = upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_VS);
	if (c->cap == UINT64_MAX || c->vs == UPCIE_NVME_REG_GONE)
		return UPCIE_FAIL(-ENODEV, "nvme %s: registers read all ones: device gone",
				  c->name);
	lo = upcie_nvme_cap_mpsmin_shift(c->cap);
	hi = upcie_nvme_cap_mpsmax_shift(c->cap);
	/* The host page is the natural controller page (PRP entries, queue alignment). A host
	 * page above MPSMAX still works at MPSMAX: our memory is aligned to the device page. A
	 * host page below MPSMIN would need every buffer aligned beyond what callers expect. */
	if (host_shift < lo)
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "nvme %s: CAP.MPSMIN is %u KiB, above the host page (%u KiB)",
				  c->name, (1u << lo) >> 10, (1u << host_shift) >> 10);
	c->page_shift = host_shift > hi ? hi : host_shift;
	c->mqes = upcie_nvme_cap_mqes_entries(c->cap);
	if (c->mqes < 2)
		return UPCIE_FAIL(-EOPNOTSUPP, "nvme %s: CAP.MQES allows %u entries", c->name,
				  c->mqes);
	c->dstrd = upcie_nvme_cap_dstrd(c->cap);
	if (upcie_nvme_cq_hdbl_off(0, c->dstrd) + 4 > c->regs_size)
		return UPCIE_FAIL(-ENODEV,
				  "nvme %s: BAR0 of %zu bytes ends before the admin doorbells "
				  "(stride %u bytes, CAP.DSTRD %u)",
				  c->name, c->regs_size, 4u << c->dstrd, c->dstrd);
	to = upcie_nvme_cap_to(c->cap);
	/* NVMe 2.0: CAP.TO is min(0xff, CRTO.CRWMT) when CRWMS is set, so CRTO may be longer. */
	if (c->vs >= UPCIE_NVME_VS(2, 0, 0) &&
	    (upcie_nvme_cap_crms(c->cap) & UPCIE_NVME_CAP_CRMS_CRWMS)) {
		uint32_t crwmt =
		    upcie_nvme_crto_crwmt(upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CRTO));

		if (crwmt > to)
			to = crwmt;
	}
	if (!to)
		to = 1;
	c->ready_timeout_ns = (uint64_t)to * 500 * UPCIE_NSEC_PER_MSEC;
	if (upcie_nvme_cap_css(c->cap) & UPCIE_NVME_CAP_CSS_IOCS)
		*css = UPCIE_NVME_CC_CSS_IOCS;
	else if (upcie_nvme_cap_css(c->cap) & UPCIE_NVME_CAP_CSS_NVM)
		*css = UPCIE_NVME_CC_CSS_NVM;
	else if (upcie_nvme_cap_css(c->cap) & UPCIE_NVME_CAP_CSS_NOIO)
		*css = UPCIE_NVME_CC_CSS_ADMIN;
	else
		return UPCIE_FAIL(-EOPNOTSUPP, "nvme %s: CAP.CSS 0x%02x names no command set",
				  c->name, upcie_nvme_cap_css(c->cap));
	return 0;
}

/* Zero the admin rings, (re)start the admin queue pair, program AQA/ASQ/ACQ. */
static inline int upcie_nvme_ctrl_admin_setup_(struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_qpair_cfg qc;
	uint32_t aqa = 0;
	int err;

	upcie_nvme_qpair_fini(&c->admin);
	memset(c->asq.vaddr, 0, (size_t)c->admin_depth * sizeof(struct upcie_nvme_sqe));
	memset(&qc, 0, sizeof(qc));
	qc.sq = c->asq.vaddr;
	qc.cq = c->acq.vaddr;
	qc.sqdb = (volatile uint32_t *)(c->regs + upcie_nvme_sq_tdbl_off(0, c->dstrd));
	qc.cqdb = (volatile uint32_t *)(c->regs + upcie_nvme_cq_hdbl_off(0, c->dstrd));
	qc.sq_depth = c->admin_depth;
	qc.qid = 0;
	err = upcie_nvme_qpair_init(&c->admin, &qc);
	if (err)
		return err;
	upcie_nvme_aqa_build(c->admin_depth, c->admin_depth, &aqa);
	/* ASQ, ACQ, then AQA: controllers latch the queue on AQA in some implementations */
	upcie_nvme_ctrl_wr64(c, UPCIE_NVME_REG_ASQ, c->asq.iova);
	upcie_nvme_ctrl_wr64(c, UPCIE_NVME_REG_ACQ, c->acq.iova);
	upcie_nvme_ctrl_wr32(c, UPCIE_NVME_REG_AQA, aqa);
	return 0;
}

/*
 * Re-program CMBMSC (upper half first: the controller evaluates the register on the lower).
 * CMBMSC exists from NVMe 1.4 on; before, its offset is reserved and nothing is written.
 */
static inline void upcie_nvme_ctrl_cmbmsc_write_(struct upcie_nvme_ctrl *c, uint64_t v)
{
	if (c->vs < UPCIE_NVME_VS(1, 4, 0))
		return;
	upcie_nvme_ctrl_wr32(c, UPCIE_NVME_REG_CMBMSC + 4, (uint32_t)(v >> 32));
	upcie_nvme_ctrl_wr32(c, UPCIE_NVME_REG_CMBMSC, (uint32_t)v);
}

/* Disable, set up the admin queue, enable, wait for ready. Lock held. */
static inline int upcie_nvme_ctrl_enable_(struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_cc_fields f;
	uint32_t css = 0, csts = 0;
	int err;

	c->state = UPCIE_NVME_CTRL_FAILED;
	err = upcie_nvme_ctrl_caps_(c, &css);
	if (err)
		return err;
	csts = upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CSTS);
	if (csts != UPCIE_NVME_REG_GONE && (csts & UPCIE_NVME_CSTS_NSSRO)) {
		/* RW1C: acknowledged, so the next subsystem reset is seen as new */
		c->nssr_seen++;
		UPCIE_WARN("nvme %s: an NVM subsystem reset happened (CSTS.NSSRO); clearing it",
			   c->name);
		upcie_nvme_ctrl_wr32(c, UPCIE_NVME_REG_CSTS, UPCIE_NVME_CSTS_NSSRO);
	}
	err = upcie_nvme_ctrl_disable_(c);
	if (err)
		return err;
	err = upcie_nvme_ctrl_admin_setup_(c);
	if (err)
		return err;
	if (c->cmb.on)
		upcie_nvme_ctrl_cmbmsc_write_(c, c->cmb.cba | 3u);
	memset(&f, 0, sizeof(f));
	f.en = 1;
	f.css = (uint8_t)css;
	f.mps = (uint8_t)(c->page_shift - 12);
	f.ams = UPCIE_NVME_CC_AMS_RR;
	f.iosqes = 6;
	f.iocqes = 4;
	err = upcie_nvme_cc_build(&f, &c->cc);
	if (err)
		return UPCIE_FAIL(err, "nvme %s: cannot compose CC", c->name);
	upcie_wmb(); /* queue memory before the enable */
	__atomic_store_n(&c->stop_err, 0, __ATOMIC_RELAXED);
	upcie_nvme_ctrl_stopped_(c, false);
	upcie_nvme_ctrl_wr32(c, UPCIE_NVME_REG_CC, c->cc);
	err = upcie_nvme_ctrl_csts_wait_(c, 1, 1, c->ready_timeout_ns, false, &csts);
	if (err == -EIO)
		return UPCIE_FAIL(-EIO,
				  "nvme %s: controller fatal status (CSTS.CFS) while enabling "
				  "(CSTS 0x%08x, CC 0x%08x)",
				  c->name, csts, c->cc);
	if (err == -ENODEV)
		return UPCIE_FAIL(err, "nvme %s: registers read all ones: device gone", c->name);
	if (err)
		return UPCIE_FAIL(err,
				  "nvme %s: not ready %" PRIu64 " ms after setting CC.EN (CSTS "
				  "0x%08x, CC 0x%08x); is bus mastering on?",
				  c->name, c->ready_timeout_ns / UPCIE_NSEC_PER_MSEC, csts, c->cc);
	c->state = UPCIE_NVME_CTRL_READY;
	return 0;
}

static inline void upcie_nvme_ctrl_zero_(struct upcie_nvme_ctrl *c)
{
	memset(c, 0, sizeof(*c));
	c->host_own.fd = -1;
	c->irqs.dev_fd = -1;
	c->dev.bar0.index = -1;
	c->dev.vdev.fd = -1;
	c->dev.group.fd = -1;
}

#endif /* UPCIE_NVME_CTRL_REGS_H */
