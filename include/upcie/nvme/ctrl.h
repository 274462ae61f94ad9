/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * An NVMe controller driven from user space: bring-up, admin commands, Identify, I/O queue
 * pairs, the controller memory buffer, interrupts, abort, reset and orderly shutdown.
 *
 * One object whatever the path (nvme/dev.h: uio, vfio type1, vfio cdev + iommufd): the
 * controller sees a register mapping and dmamem objects only. upcie_nvme_ctrl_open() takes a
 * PCI function; upcie_nvme_ctrl_init() takes registers and host DMA memory the caller already
 * has (another driver framework, or a controller model in tests).
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
 *
 * I/O queue pairs (struct upcie_nvme_ioq): any depth up to CAP.MQES + 1, memory sized from the
 * depth and taken from any heap (host memory by default, the CMB's heap for a CMB-resident SQ),
 * per-CID PRP list / SGL segment pages, the queue identifier allocated on create and released
 * on delete. Commands go through the queue-pair core (nvme/qpair.h); nvme/ns.h has the I/O
 * helpers. Completions are polled by default; with MSI-X vectors enabled (vfio paths) a queue
 * created with `irq` can sleep on its vector's eventfd instead.
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
 *
 * Bus mastering and memory (upcie_nvme_ctrl_open()/close()): open finds bus mastering off
 * (nvme/dev.h), stops whatever the last owner left running (CC.EN = 0 and CSTS.RDY = 0, or a
 * function reset when the controller does not disable) and only then turns bus mastering on, so
 * a controller a crashed process left enabled cannot DMA into addresses it still holds; then
 * (uio) the DMA memory files that process left behind are freed (upcie_nvme_dev_reclaim()). Close
 * disables the controller, turns bus mastering off and checks it, then frees the host memory;
 * when the disable failed the controller may still write that memory, so it is kept for the
 * life of the process (upcie_dmamem_keep()) instead of freed.
 *
 * Threading: admin commands, queue create/delete, CMB and interrupt setup take the controller's
 * mutex, so threads may create their queues concurrently. Each I/O queue has one owner thread.
 * Reset and close must not run while other threads use queues. The struct holds pointers into
 * itself: keep it in place while open. Needs what nvme/dev.h needs for the path.
 * Does not: handle namespace management, firmware, keep alive or asynchronous events beyond
 * submitting the command; multiple processes sharing a controller.
 */
#ifndef UPCIE_NVME_CTRL_H
#define UPCIE_NVME_CTRL_H

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
#define UPCIE_NVME_IOQ_DEPTH	      256u
#define UPCIE_NVME_IOQ_MAX_XFER	      ((uint64_t)512 << 10)
#define UPCIE_NVME_CTRL_REG_POLL_NS   (50 * UPCIE_NSEC_PER_USEC)
#define UPCIE_NVME_CTRL_DELETE_DRAIN  (1 * UPCIE_NSEC_PER_SEC)

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
};

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
	 * or an escalation, cleared when it is enabled again. Under `lock`.
	 */
	bool stopped;
	bool gone; /* registers read all ones */
	/* from Identify Controller */
	struct upcie_nvme_id_ctrl id;
	char sn[21], mn[41], fr[9]; /* trimmed copies, unprintable bytes as '?' */
	uint64_t max_xfer;	    /* MDTS in bytes; UINT64_MAX: no limit */
	bool sgl;		    /* SGLs supported for NVM commands */
	bool sgl_dword;		    /* ... with dword-aligned data blocks */
	bool vwc;		    /* a volatile write cache is present */
	uint32_t nn;		    /* highest namespace ID (NN, at most 0xfffffffe) */
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
};

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
		c->stopped = true;
		return UPCIE_FAIL(err, "nvme %s: registers read all ones: device gone", c->name);
	}
	if (err)
		return UPCIE_FAIL(err,
				  "nvme %s: CSTS.RDY still 1 %" PRIu64 " ms after clearing CC.EN "
				  "(CSTS 0x%08x)",
				  c->name, c->ready_timeout_ns / UPCIE_NSEC_PER_MSEC, csts);
	c->stopped = true;
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
 * Make the controller let go of all host memory: reset it (CC.EN = 0), or, if it does not even
 * do that and we hold the PCI function, turn its bus mastering off. Then the admin commands
 * still outstanding end with -ECANCELED; the I/O queues' owners end theirs (their waits see
 * c->stopped), and upcie_nvme_ctrl_reset() brings the controller back. Lock held. Returns 0 when
 * the controller has let go (c->stopped), else the disable's error.
 *
 * upcie_nvme_ctrl_fail_locked_() is the escalation: a command that owns memory did not end (or
 * the controller is dead); it logs why and sets state FAILED first.
 */
static inline int upcie_nvme_ctrl_halt_locked_(struct upcie_nvme_ctrl *c)
{
	int err = 0;

	if (!c->stopped) {
		err = upcie_nvme_ctrl_disable_(c);
		if (err == -ENODEV)
			err = 0; /* gone: it cannot reach our memory either */
	}
	if (err && c->dev.open && !upcie_nvme_dev_bus_master(&c->dev, false)) {
		UPCIE_ERR("nvme %s: not disabled: bus mastering turned off instead", c->name);
		c->stopped = true;
		err = 0;
	}
	if (!c->stopped)
		return UPCIE_FAIL(err,
				  "nvme %s: the controller did not let go: its queues' memory "
				  "stays allocated",
				  c->name);
	upcie_nvme_qpair_stop(&c->admin, false);
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
	c->stopped = false;
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

/*
 * Run admin command `sqe` (the CID is assigned here) with data in `nsegs` segments (PRPs; may be
 * NULL), waiting up to timeout_ns (0: the controller's admin timeout). The completion goes to
 * *cqe (may be NULL): on -EIO it holds the error status. Returns 0, -EIO (error status),
 * -ETIMEDOUT (aborted and cancelled), -ENODEV (controller not ready), -EINVAL (data).
 */
static inline int upcie_nvme_ctrl_admin(struct upcie_nvme_ctrl *c, const struct upcie_nvme_sqe *sqe,
					const struct upcie_nvme_dseg *data, unsigned nsegs,
					uint64_t timeout_ns, struct upcie_nvme_cqe *cqe)
{
	int err;

	if (!c || !c->lock_live || !sqe)
		return UPCIE_FAIL(-EINVAL, "nvme: admin: controller not open or NULL command");
	pthread_mutex_lock(&c->lock);
	err = upcie_nvme_ctrl_admin_locked_(c, sqe, data, nsegs, timeout_ns, cqe);
	pthread_mutex_unlock(&c->lock);
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

	if (err)
		return UPCIE_FAIL(err, "nvme %s: Identify Controller failed", c->name);
	return upcie_nvme_ctrl_id_apply_(c);
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
	UPCIE_DBG("nvme %s: ready: %s %s %s, VS %u.%u, MDTS %" PRIu64 " B, %u I/O queues, SGL %d",
		  c->name, c->mn, c->sn, c->fr, upcie_nvme_vs_mjr(c->vs), upcie_nvme_vs_mnr(c->vs),
		  c->max_xfer, c->nqueues, c->sgl);
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

static inline int upcie_nvme_ctrl_close(struct upcie_nvme_ctrl *c);

/*
 * Bring up a controller whose registers are mapped at `regs` (regs_size bytes of BAR0) with
 * host DMA memory `host` (borrowed: queues, lists and admin buffers are carved from it; it
 * needs a CPU view and must outlive the controller). Bus mastering must already be on. Options
 * may be NULL (defaults; the dev member is ignored; interrupts need upcie_nvme_ctrl_open()).
 * Returns 0, or -EINVAL, -ENOMEM, -ENODEV, -EOPNOTSUPP (CAP), -ETIMEDOUT (not ready within
 * CAP.TO), -EIO (CSTS.CFS, or an error status of Identify or Set Features); `c` is closed
 * and zeroed on failure.
 */
static inline int upcie_nvme_ctrl_init(struct upcie_nvme_ctrl *c, volatile void *regs,
				       size_t regs_size, const struct upcie_dmamem *host,
				       const struct upcie_nvme_ctrl_opts *opts)
{
	struct upcie_nvme_ctrl_opts def;
	int err;

	if (!c)
		return UPCIE_FAIL(-EINVAL, "nvme: init: NULL controller");
	upcie_nvme_ctrl_zero_(c);
	if (!regs || regs_size < 0x2000 || !host || !host->vaddr)
		return UPCIE_FAIL(-EINVAL,
				  "nvme: init: registers (%zu bytes) or host memory "
				  "missing",
				  regs_size);
	if (!opts) {
		memset(&def, 0, sizeof(def));
		opts = &def;
	}
	snprintf(c->name, sizeof(c->name), "ctrl");
	c->regs = (volatile uint8_t *)regs;
	c->regs_size = regs_size;
	c->host = host;
	err = upcie_nvme_ctrl_setup_(c, opts);
	if (err)
		upcie_nvme_ctrl_close(c);
	return err;
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

/*
 * Open NVMe function `bdf` on the path in opts->dev (nvme/dev.h), stop the controller (bus
 * mastering still off), turn bus mastering on, allocate opts->host_mem bytes of host DMA memory
 * (on the function's NUMA node) and bring the controller up as upcie_nvme_ctrl_init() does;
 * with opts->irq_vectors, also enable that many MSI-X vectors. Returns 0 or the first error
 * (see dev and init; -ETIMEDOUT when the controller cannot be stopped); `c` is zeroed on
 * failure.
 */
static inline int upcie_nvme_ctrl_open(struct upcie_nvme_ctrl *c, const struct upcie_pci_bdf *bdf,
				       const struct upcie_nvme_ctrl_opts *opts)
{
	struct upcie_nvme_ctrl_opts def;
	size_t host;
	int err;

	if (!c)
		return UPCIE_FAIL(-EINVAL, "nvme: open: NULL controller");
	upcie_nvme_ctrl_zero_(c);
	if (!opts) {
		memset(&def, 0, sizeof(def));
		opts = &def;
	}
	err = upcie_nvme_dev_open(&c->dev, bdf, &opts->dev);
	if (err)
		return err;
	memcpy(c->name, c->dev.name, sizeof(c->name));
	c->regs = (volatile uint8_t *)c->dev.regs;
	c->regs_size = c->dev.regs_size;
	err = upcie_nvme_ctrl_quiesce_(c);
	if (err)
		goto fail;
	/* stopped: memory a driver that died left to it can go back now */
	upcie_nvme_dev_reclaim(&c->dev);
	/* the kernel driver left it off (unbind) and uio_pci_generic does not set it: without it
	 * every DMA is dropped and commands time out silently */
	err = upcie_nvme_dev_bus_master(&c->dev, true);
	if (err)
		goto fail;
	host = opts->host_mem ? opts->host_mem : UPCIE_NVME_CTRL_HOST_MEM;
	err = upcie_nvme_dev_dmamem(&c->dev, host, &c->host_own);
	if (err)
		goto fail;
	c->host = &c->host_own;
	err = upcie_nvme_ctrl_setup_(c, opts);
	if (err)
		goto fail;
	return 0;
fail:
	upcie_nvme_ctrl_close(c);
	return err;
}

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
		/* the CQ exists: its memory is free only once it is deleted */
		return upcie_nvme_ioq_hw_delete_(q, false) ? -EBUSY : err;
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
 * ready for commands (nvme/ns.h). The caller's thread owns `q` afterwards. Returns 0; -EINVAL
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
	if (!q->tables) {
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
	if (!q->tables) {
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
 * controller let go) and its error returned, the queue released. Call from the owner thread.
 * Returns 0, a delete command's error, or -EBUSY (the queue could not be deleted nor the
 * controller stopped: the queue stays, its memory the controller's). A zeroed or deleted queue
 * is a no-op.
 */
static inline int upcie_nvme_ioq_delete(struct upcie_nvme_ioq *q)
{
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
	if (!err && !q->ext)
		upcie_nvme_qpair_drain(&q->qp, UPCIE_NVME_CTRL_DELETE_DRAIN);
	pthread_mutex_lock(&c->lock);
	err = upcie_nvme_ioq_delete_locked_(q);
	pthread_mutex_unlock(&c->lock);
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
 * `irq`). Returns 0 (interrupts arrived; reap), -ETIMEDOUT, -EINVAL (no interrupt queue).
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
 * (upcie_nvme_qpair_cid_ctx()); if not, its memory is still the controller's. -ENODEV / -EIO:
 * the controller is dead (reset, the command cancelled). Returns 0 otherwise.
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

		if (upcie_nvme_qpair_cid_ctx(&q->qp, cid, &ctx))
			return 0;
		if (n > 0)
			continue;
		/* the clock can cost microseconds in a VM: look at it every 16th empty poll */
		if (!(spins & 15) && upcie_deadline_passed(&dl))
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

/*
 * Read CMBLOC and CMBSZ (from NVMe 1.4 they read 0 until CMBMSC.CRE is set; before 1.4 they are
 * always valid and CMBMSC does not exist) and check them: a size, SQ support. *ofst gets the
 * CMB's byte offset in its BAR. Lock held.
 */
static inline int upcie_nvme_ctrl_cmb_read_(struct upcie_nvme_ctrl *c, uint64_t *ofst)
{
	struct upcie_nvme_cmb *m = &c->cmb;

	if (!upcie_nvme_cap_cmbs(c->cap))
		return UPCIE_FAIL(-EOPNOTSUPP, "nvme %s: no controller memory buffer (CAP.CMBS 0)",
				  c->name);
	upcie_nvme_ctrl_cmbmsc_write_(c, 1); /* CRE */
	m->cmbloc = upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CMBLOC);
	m->cmbsz = upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CMBSZ);
	m->size = upcie_nvme_cmbsz_bytes(m->cmbsz);
	*ofst = (uint64_t)upcie_nvme_cmbloc_ofst(m->cmbloc) * upcie_nvme_cmbsz_unit_bytes(m->cmbsz);
	if (!m->size || !upcie_nvme_cmbsz_sqs(m->cmbsz))
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "nvme %s: CMB of %" PRIu64 " bytes without SQ support (CMBSZ "
				  "0x%08x)",
				  c->name, m->size, m->cmbsz);
	return 0;
}

/* Fit the CMB into its BAR of `bar_size` bytes. */
static inline int upcie_nvme_ctrl_cmb_fit_(struct upcie_nvme_ctrl *c, uint64_t ofst,
					   size_t bar_size)
{
	struct upcie_nvme_cmb *m = &c->cmb;

	if (ofst >= bar_size || m->size > bar_size - ofst) {
		/* controllers behind a bridge may report more than the BAR holds */
		m->size = ofst < bar_size ? bar_size - ofst : 0;
		if (!m->size)
			return UPCIE_FAIL(
			    -EINVAL, "nvme %s: CMB offset 0x%" PRIx64 " beyond BAR%u (%zu bytes)",
			    c->name, ofst, upcie_nvme_cmbloc_bir(m->cmbloc), bar_size);
	}
	return 0;
}

/*
 * Program the CMB's controller address m->cba (CMBMSC.CBA with CRE and CMSE, NVMe >= 1.4;
 * before 1.4 the CMB simply sits at its BAR's address) and make the dmamem and heap over the
 * CPU view `cpu`. Lock held.
 */
static inline int upcie_nvme_ctrl_cmb_finish_(struct upcie_nvme_ctrl *c, void *cpu)
{
	struct upcie_nvme_cmb *m = &c->cmb;
	int err;

	upcie_nvme_ctrl_cmbmsc_write_(c, m->cba | 3u); /* CRE | CMSE | CBA */
	if (c->vs >= UPCIE_NVME_VS(1, 4, 0) &&
	    upcie_nvme_cmbsts_cbai(upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CMBSTS)))
		return UPCIE_FAIL(
		    -EIO, "nvme %s: controller refused CMB base 0x%" PRIx64 " (CMBSTS.CBAI)",
		    c->name, m->cba);
	err = upcie_dmamem_init_arith(&m->mem, cpu, m->size, m->cba);
	if (!err)
		err = upcie_heap_init(&m->heap, &m->mem);
	if (err)
		return err;
	m->mem.kind = "nvme-cmb";
	m->on = true;
	UPCIE_DBG("nvme %s: CMB %" PRIu64 " KiB in BAR%u at controller address 0x%" PRIx64
		  " (NVMe %u.%u)",
		  c->name, m->size >> 10, upcie_nvme_cmbloc_bir(m->cmbloc), m->cba,
		  upcie_nvme_vs_mjr(c->vs), upcie_nvme_vs_mnr(c->vs));
	return 0;
}

/* Undo a failed enable. Lock held. */
static inline void upcie_nvme_ctrl_cmb_undo_(struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_cmb *m = &c->cmb;

	upcie_heap_fini(&m->heap);
	upcie_dmamem_destroy(&m->mem);
	upcie_nvme_ctrl_cmbmsc_write_(c, 0);
	if (m->reserved)
		upcie_nvme_dev_addr_release(&c->dev, m->cba, m->reserved);
	if (m->claimed)
		upcie_nvme_dev_addr_unclaim(&c->dev, m->cba, m->size);
	upcie_nvme_dev_bar_unmap(&m->bar);
	memset(m, 0, sizeof(*m));
}

/*
 * Enable the controller memory buffer: read CMBLOC/CMBSZ (setting CMBMSC.CRE first from NVMe
 * 1.4 on), map its BAR, pick the controller address and give c->cmb.mem (CPU view through the
 * BAR) and c->cmb.heap. From NVMe 1.4 the address is programmed in CMBMSC (with CMSE): the BAR's
 * bus address under uio, a reserved range of the device address space, where no host memory can
 * ever be mapped, under vfio. Before 1.4 there is no CMBMSC: the CMB is where its BAR is, and
 * under vfio that range is claimed in the IOVA space (type1), or must lie outside what the IOAS
 * may map (iommufd). Needs upcie_nvme_ctrl_open() (upcie_nvme_ctrl_cmb_enable_at() otherwise).
 * Returns 0, -EOPNOTSUPP (no CAP.CMBS, or CMBSZ says no SQ support, or a pre-1.4 CMB whose
 * address the IOAS may map), -EIO (CMBSTS.CBAI: the controller refused the address), or the
 * mapping's error. Disabled by close.
 */
static inline int upcie_nvme_ctrl_cmb_enable(struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_cmb *m;
	uint64_t ofst, span;
	int err;

	if (!c || !c->lock_live || !c->dev.open)
		return UPCIE_FAIL(-EINVAL,
				  "nvme: CMB: needs a controller from upcie_nvme_ctrl_open()");
	m = &c->cmb;
	if (m->on)
		return 0;
	pthread_mutex_lock(&c->lock);
	err = upcie_nvme_ctrl_cmb_read_(c, &ofst);
	if (!err)
		err = upcie_nvme_dev_bar_map(&c->dev, upcie_nvme_cmbloc_bir(m->cmbloc), &m->bar);
	if (!err)
		err = upcie_nvme_ctrl_cmb_fit_(c, ofst, m->bar.size);
	if (err)
		goto fail;
	if (c->vs < UPCIE_NVME_VS(1, 4, 0)) {
		m->cba = m->bar.bus + ofst;
		err = upcie_nvme_dev_addr_claim(&c->dev, m->cba, m->size);
		m->claimed = !err;
	} else {
		span = UINT64_C(1) << (upcie_log2(m->size) + (upcie_is_pow2(m->size) ? 0 : 1));
		err = upcie_nvme_dev_addr_reserve(&c->dev, span, &m->cba);
		if (err == -EOPNOTSUPP) {
			m->cba = m->bar.bus + ofst;
			err = 0;
		} else if (!err) {
			m->reserved = span;
		}
	}
	if (!err)
		err = upcie_nvme_ctrl_cmb_finish_(c, (char *)m->bar.addr + ofst);
	if (err)
		goto fail;
	pthread_mutex_unlock(&c->lock);
	return 0;
fail:
	upcie_nvme_ctrl_cmb_undo_(c);
	pthread_mutex_unlock(&c->lock);
	return err;
}

/*
 * Enable the controller memory buffer of a controller brought up with upcie_nvme_ctrl_init(),
 * whose BARs the caller maps: `bar` describes the BAR CMBLOC.BIR names (read c->cmb.cmbloc
 * after a first call that fails with -EINVAL, or know it) and the controller address to use. As
 * upcie_nvme_ctrl_cmb_enable() otherwise; keeping no host memory mapped for the device at the
 * CMB's controller address is the caller's part. Returns 0, -EINVAL (another BAR, or no mapping),
 * -EOPNOTSUPP, -EIO.
 */
static inline int upcie_nvme_ctrl_cmb_enable_at(struct upcie_nvme_ctrl *c,
						const struct upcie_nvme_cmb_bar *bar)
{
	struct upcie_nvme_cmb *m;
	uint64_t ofst;
	int err;

	if (!c || !c->lock_live || !bar || !bar->addr)
		return UPCIE_FAIL(-EINVAL, "nvme: CMB: controller not open or no BAR mapping");
	m = &c->cmb;
	if (m->on)
		return 0;
	pthread_mutex_lock(&c->lock);
	err = upcie_nvme_ctrl_cmb_read_(c, &ofst);
	if (!err && upcie_nvme_cmbloc_bir(m->cmbloc) != bar->bir)
		err = UPCIE_FAIL(-EINVAL, "nvme %s: the CMB is in BAR%u, not BAR%u", c->name,
				 upcie_nvme_cmbloc_bir(m->cmbloc), bar->bir);
	if (!err)
		err = upcie_nvme_ctrl_cmb_fit_(c, ofst, bar->size);
	if (!err) {
		m->cba = c->vs >= UPCIE_NVME_VS(1, 4, 0) && bar->cba ? bar->cba : bar->bus + ofst;
		err = upcie_nvme_ctrl_cmb_finish_(c, (char *)bar->addr + ofst);
	}
	if (err) {
		uint32_t cmbloc = m->cmbloc;

		upcie_nvme_ctrl_cmb_undo_(c);
		m->cmbloc = cmbloc; /* so the caller can learn the BIR */
	}
	pthread_mutex_unlock(&c->lock);
	return err;
}

/* Undo upcie_nvme_ctrl_cmb_enable(). Queues in the CMB must be deleted first. Lock held. */
static inline void upcie_nvme_ctrl_cmb_disable_(struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_cmb *m = &c->cmb;

	if (!m->on)
		return;
	upcie_heap_fini(&m->heap);
	upcie_dmamem_destroy(&m->mem);
	if (c->state != UPCIE_NVME_CTRL_CLOSED)
		upcie_nvme_ctrl_cmbmsc_write_(c, 0);
	if (m->reserved)
		upcie_nvme_dev_addr_release(&c->dev, m->cba, m->reserved);
	if (m->claimed)
		upcie_nvme_dev_addr_unclaim(&c->dev, m->cba, m->size);
	upcie_nvme_dev_bar_unmap(&m->bar);
	memset(m, 0, sizeof(*m));
}

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

static inline int upcie_nvme_ioq_create(struct upcie_nvme_ioq *q, struct upcie_nvme_ctrl *c,
					const struct upcie_nvme_ioq_opts *opts);
static inline int upcie_nvme_ioq_delete(struct upcie_nvme_ioq *q);

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
 * ioq structs stay valid and usable. Commands that callbacks submit during the reset are kept and
 * run on the recreated queue (or end with -ECANCELED if it cannot be recreated). Works from any
 * state, also after a shutdown, a fatal status or an escalation. A controller that cannot be
 * disabled (CSTS.RDY stays 1) keeps its commands (they end with it: close); one that is gone
 * ends them all. No other thread may use the queues meanwhile. Returns 0 or the first error
 * (state FAILED: close, or reset again).
 */
static inline int upcie_nvme_ctrl_reset(struct upcie_nvme_ctrl *c)
{
	int err;

	if (!c || !c->lock_live)
		return UPCIE_FAIL(-EINVAL, "nvme: reset: controller not open");
	pthread_mutex_lock(&c->lock);
	err = upcie_nvme_ctrl_halt_locked_(c);
	if (err) {
		c->state = UPCIE_NVME_CTRL_FAILED;
		pthread_mutex_unlock(&c->lock);
		return UPCIE_FAIL(err, "nvme %s: reset failed: the controller did not stop",
				  c->name);
	}
	/* it let go: end what it held, keep what the callbacks submit meanwhile */
	for (uint32_t q = 1; c->ioqs && q <= c->nslots; q++)
		if (c->ioqs[q])
			upcie_nvme_qpair_stop(&c->ioqs[q]->qp, !c->gone);
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
	pthread_mutex_unlock(&c->lock);
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
 * too: theirs to recover. No other thread may use the queues meanwhile. Returns 0, -EOPNOTSUPP
 * (CAP.NSSRS clear), -ENODEV (the function did not come back within CAP.TO), or the reset's
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
		eflush = upcie_nvme_ctrl_flush_(c);
		pthread_mutex_lock(&c->lock);
		for (uint32_t q = 1; c->ioqs && q <= c->nslots; q++)
			if (c->ioqs[q] && upcie_nvme_ioq_delete_locked_(c->ioqs[q]) == -EBUSY)
				upcie_nvme_ioq_release_(c->ioqs[q], false);
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
		pthread_mutex_destroy(&c->lock);
		if (!err)
			err = eflush;
	}
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

#endif /* UPCIE_NVME_CTRL_H */
