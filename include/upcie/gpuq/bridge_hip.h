/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The doorbell bridge and completion relay of a GPU-issued queue pair: host code that stands in
 * for what a GPU cannot do itself on consumer RDNA.
 *
 * Doorbell bridge: a GPU that cannot map a peer's BAR (hipHostRegister of an NVMe BAR fails on
 * those stacks) writes the SQ tail and the CQ head into two shadow cells in host memory; one
 * poller thread per queue, running for the queue's whole lifetime, mirrors a cell to the
 * controller's doorbell only when its value changes. It never writes the same value twice in a
 * row and never writes while nothing changes, because both hurt: a doorbell rewritten every
 * poll round floods the controller's PCIe ingress with MMIO and starves its completion DMA,
 * and a poller restarted per kernel launch that forgets what it wrote re-rings the previous
 * launch's stale tail right before a wrapped one, which a controller can take as one new entry
 * instead of many. So the "last written" values live in this object and start from what the
 * controller holds (0 for a new queue), and a kernel relaunch changes nothing here.
 *
 * Completion relay: the controller completes into a CQ in host memory that the CPU reads
 * coherently; a peer's DMA into host memory does not snoop the GPU's caches, so the poller copies
 * each entry, as its phase tag turns, into a shadow CQ of the same depth that the GPU polls
 * (dw0..dw2 first, the phase-carrying dw3 last). It never overwrites an entry the GPU has not
 * consumed: the controller can only reuse a slot after the CQ head doorbell passed it, and that
 * doorbell is the GPU's own head, relayed.
 *
 * Payloads: the completion lands in host memory, so a payload the controller writes into VRAM
 * goes to a second destination that PCIe does not order against the first; the poller seeing
 * the entry, and the GPU seeing the relayed one, say nothing about the data. A bridged queue is
 * for payloads in host memory (one destination with the CQ) and for commands that move no data
 * into VRAM. gpuq/gqp_host_hip.h enforces it where a payload's device address is set up
 * (upcie_nvme_gqp_hip_data_iova(): -EXDEV for VRAM on a bridged queue, unless the queue was
 * created with UPCIE_NVME_GQP_HIP_VRAM_DATA, the caller's word for the platform); VRAM payloads
 * belong on a direct queue (UPCIE_NVME_GQP_HIP_DIRECT), whose CQ is in VRAM beside them. Not run
 * on an AMD GPU (none was available).
 *
 * Plain C (pthreads): no HIP headers. gpuq/gqp_host_hip.h wires it to GPU memory; a test can
 * play the GPU with CPU threads on the same memory layout (tests/guest/progs/t_hip_bridge.c).
 * A bridge without its own thread (UPCIE_NVME_BRIDGE_MANUAL) is driven by
 * upcie_nvme_bridge_poll() from the caller's thread. Counters and an optional trace of every
 * doorbell write are kept so the mechanism can be checked rather than inferred.
 *
 * Threading: start/stop/handback from the owner; stats from any thread.
 */
#ifndef UPCIE_GPUQ_BRIDGE_HIP_H
#define UPCIE_GPUQ_BRIDGE_HIP_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <upcie/base/barrier.h>
#include <upcie/base/clock.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/base/mmio.h>
#include <upcie/nvme/qpair.h>
#include <upcie/nvme/spec.h>

#define UPCIE_NVME_BRIDGE_MANUAL 0x1u /* no thread: the caller polls */

/* Defaults of the poller's idle policy. */
#define UPCIE_NVME_BRIDGE_SPIN_NS  (50 * UPCIE_NSEC_PER_USEC)
#define UPCIE_NVME_BRIDGE_SLEEP_NS (20 * UPCIE_NSEC_PER_USEC)

/* The two shadow cells, one per 64-byte line (the GPU writes them, the poller reads them). */
struct upcie_nvme_bridge_cells {
	volatile uint32_t sq_tail;
	uint32_t rsvd0[15];
	volatile uint32_t cq_head;
	uint32_t rsvd1[15];
};

/* One doorbell write, as traced. */
struct upcie_nvme_bridge_write {
	uint32_t cq;	/* 0: SQ tail doorbell, 1: CQ head doorbell */
	uint32_t value; /* what was written */
};

struct upcie_nvme_bridge_cfg {
	uint16_t qid;
	uint32_t depth;		    /* SQ and CQ entries (both rings have this depth), 2..65536 */
	volatile uint32_t *sqdb;    /* the controller's SQ tail doorbell (BAR0 mapping) */
	volatile uint32_t *cqdb;    /* the controller's CQ head doorbell */
	volatile uint32_t *sq_cell; /* shadow the GPU writes its SQ tail to (CPU address) */
	volatile uint32_t *cq_cell; /* shadow the GPU writes its CQ head to */
	const struct upcie_nvme_cqe *cq;  /* relay source: the CQ the controller writes (CPU view);
					    NULL: no relay (the GPU reads the CQ itself) */
	struct upcie_nvme_cqe *cq_shadow; /* relay target: what the GPU polls (CPU view) */
	uint32_t sq_db0, cq_db0; /* doorbell values the controller holds now: 0 for a new queue */
	uint64_t spin_ns;	 /* busy-poll this long after the last change; 0: default */
	uint64_t sleep_ns;	 /* then sleep this long per idle round; 0: default */
	unsigned flags;		 /* UPCIE_NVME_BRIDGE_* */
	struct upcie_nvme_bridge_write *trace; /* optional: every doorbell write, in order */
	size_t trace_cap;
};

struct upcie_nvme_bridge_stats {
	uint64_t rounds;	       /* poll rounds */
	uint64_t sq_writes, cq_writes; /* MMIO doorbell writes */
	uint64_t relayed;	       /* completion entries copied to the shadow */
	uint64_t sq_bad, cq_bad;       /* shadow values outside the ring, not written */
	uint64_t sleeps;	       /* idle sleeps */
	uint64_t ntrace;	       /* writes traced (may exceed trace_cap: the rest dropped) */
	uint32_t sq_last, cq_last;     /* values last written (or the initial ones) */
	uint32_t relay_head, relay_phase; /* next host CQ entry the relay looks at */
};

struct upcie_nvme_bridge {
	struct upcie_nvme_bridge_cfg cfg;
	struct upcie_nvme_bridge_stats st; /* written by the poller, read with atomics */
	uint32_t sq_bad_val, cq_bad_val;   /* last bad value seen (counted once per change) */
	uint64_t last_active;
	pthread_t thread;
	int stop;
	bool running;
	bool live;
};

#define UPCIE_NVME_BRIDGE_RD_(p)    __atomic_load_n(&(p), __ATOMIC_RELAXED)
#define UPCIE_NVME_BRIDGE_WR_(p, v) __atomic_store_n(&(p), (v), __ATOMIC_RELAXED)
#define UPCIE_NVME_BRIDGE_INC_(p)   UPCIE_NVME_BRIDGE_WR_(p, UPCIE_NVME_BRIDGE_RD_(p) + 1)

static inline void upcie_nvme_bridge_ring_(struct upcie_nvme_bridge *b, uint32_t cq, uint32_t v)
{
	uint64_t nt = UPCIE_NVME_BRIDGE_RD_(b->st.ntrace);

	/* The GPU's stores that preceded its cell write reached memory before it (PCIe posted
	 * writes stay in order); order our read of the cell before the doorbell write. */
	upcie_mb();
	upcie_mmio_write32(cq ? b->cfg.cqdb : b->cfg.sqdb, 0, v);
	if (b->cfg.trace && nt < b->cfg.trace_cap) {
		b->cfg.trace[nt].cq = cq;
		b->cfg.trace[nt].value = v;
	}
	UPCIE_NVME_BRIDGE_WR_(b->st.ntrace, nt + 1);
	if (cq) {
		UPCIE_NVME_BRIDGE_INC_(b->st.cq_writes);
		UPCIE_NVME_BRIDGE_WR_(b->st.cq_last, v);
	} else {
		UPCIE_NVME_BRIDGE_INC_(b->st.sq_writes);
		UPCIE_NVME_BRIDGE_WR_(b->st.sq_last, v);
	}
}

/* Mirror one cell: write its value when it differs from the last one written. 1 if written. */
static inline int upcie_nvme_bridge_cell_(struct upcie_nvme_bridge *b, uint32_t cq)
{
	uint32_t v = *(cq ? b->cfg.cq_cell : b->cfg.sq_cell);
	uint32_t last = cq ? b->st.cq_last : b->st.sq_last;
	uint32_t *badv = cq ? &b->cq_bad_val : &b->sq_bad_val;

	if (v == last)
		return 0;
	if (v >= b->cfg.depth) {
		if (v != *badv) {
			*badv = v;
			if (cq)
				UPCIE_NVME_BRIDGE_INC_(b->st.cq_bad);
			else
				UPCIE_NVME_BRIDGE_INC_(b->st.sq_bad);
		}
		return 0;
	}
	upcie_nvme_bridge_ring_(b, cq, v);
	return 1;
}

/* Copy the completions whose phase turned into the shadow. Returns how many. */
static inline uint32_t upcie_nvme_bridge_relay_(struct upcie_nvme_bridge *b)
{
	const volatile struct upcie_nvme_cqe *cq = b->cfg.cq;
	volatile struct upcie_nvme_cqe *sh = b->cfg.cq_shadow;
	uint32_t h = b->st.relay_head, ph = b->st.relay_phase, n = 0;

	if (!cq)
		return 0;
	while (n < b->cfg.depth) {
		uint32_t dw3 = cq[h].dw3;

		if (((dw3 >> 16) & 1u) != ph)
			break;
		upcie_dma_rmb(); /* the rest of the entry after its phase tag */
		sh[h].dw0 = cq[h].dw0;
		sh[h].dw1 = cq[h].dw1;
		sh[h].dw2 = cq[h].dw2;
		upcie_dma_wmb(); /* the GPU must not see the phase before the rest */
		sh[h].dw3 = dw3;
		if (++h == b->cfg.depth) {
			h = 0;
			ph ^= 1u;
		}
		n++;
	}
	if (n) {
		UPCIE_NVME_BRIDGE_WR_(b->st.relay_head, h);
		UPCIE_NVME_BRIDGE_WR_(b->st.relay_phase, ph);
		UPCIE_NVME_BRIDGE_WR_(b->st.relayed, UPCIE_NVME_BRIDGE_RD_(b->st.relayed) + n);
	}
	return n;
}

/*
 * One poll round: SQ tail cell, relay, CQ head cell. Returns the number of things done (doorbell
 * writes plus entries relayed); 0 when nothing changed. For a MANUAL bridge, from its one
 * caller thread; a bridge with a thread polls itself.
 */
static inline uint32_t upcie_nvme_bridge_poll(struct upcie_nvme_bridge *b)
{
	uint32_t n = 0;

	n += (uint32_t)upcie_nvme_bridge_cell_(b, 0);
	n += upcie_nvme_bridge_relay_(b);
	n += (uint32_t)upcie_nvme_bridge_cell_(b, 1);
	UPCIE_NVME_BRIDGE_INC_(b->st.rounds);
	return n;
}

static inline void *upcie_nvme_bridge_main_(void *arg)
{
	struct upcie_nvme_bridge *b = (struct upcie_nvme_bridge *)arg;
	uint64_t idle_since = upcie_time_ns();

	for (;;) {
		/* Read the flag first: the round after it still delivers what came before. */
		int stop = __atomic_load_n(&b->stop, __ATOMIC_ACQUIRE);

		if (upcie_nvme_bridge_poll(b)) {
			idle_since = upcie_time_ns();
		} else if (!stop) {
			if (upcie_time_ns() - idle_since < b->cfg.spin_ns) {
				upcie_cpu_relax();
			} else {
				UPCIE_NVME_BRIDGE_INC_(b->st.sleeps);
				upcie_sleep_ns(b->cfg.sleep_ns);
			}
		}
		if (stop)
			break;
	}
	return NULL;
}

/*
 * Set up the bridge of one queue and, unless UPCIE_NVME_BRIDGE_MANUAL, start its poller. The
 * shadow cells are set to sq_db0/cq_db0 and the shadow CQ is zeroed, so do this before any
 * kernel uses the queue, and keep the bridge for the queue's whole lifetime (across kernel
 * launches). Returns 0, -EINVAL (bad config), or the pthread_create error. `b` is zeroed on
 * failure.
 */
static inline int upcie_nvme_bridge_start(struct upcie_nvme_bridge *b,
					  const struct upcie_nvme_bridge_cfg *cfg)
{
	int err;

	if (!b || !cfg)
		return UPCIE_FAIL(-EINVAL, "nvme: bridge: NULL bridge or config");
	memset(b, 0, sizeof(*b));
	if (cfg->depth < 2 || cfg->depth > 65536 || !cfg->sqdb || !cfg->cqdb || !cfg->sq_cell ||
	    !cfg->cq_cell || (cfg->cq && !cfg->cq_shadow) || cfg->sq_db0 >= cfg->depth ||
	    cfg->cq_db0 >= cfg->depth || (cfg->trace_cap && !cfg->trace))
		return UPCIE_FAIL(-EINVAL, "nvme: bridge of queue %u: bad configuration", cfg->qid);
	b->cfg = *cfg;
	if (!b->cfg.spin_ns)
		b->cfg.spin_ns = UPCIE_NVME_BRIDGE_SPIN_NS;
	if (!b->cfg.sleep_ns)
		b->cfg.sleep_ns = UPCIE_NVME_BRIDGE_SLEEP_NS;
	b->st.sq_last = cfg->sq_db0;
	b->st.cq_last = cfg->cq_db0;
	b->st.relay_phase = 1;
	b->sq_bad_val = b->cq_bad_val = UINT32_MAX;
	*cfg->sq_cell = cfg->sq_db0;
	*cfg->cq_cell = cfg->cq_db0;
	if (cfg->cq)
		memset((void *)cfg->cq_shadow, 0,
		       (size_t)cfg->depth * sizeof(struct upcie_nvme_cqe));
	upcie_mb();
	b->live = true;
	if (cfg->flags & UPCIE_NVME_BRIDGE_MANUAL)
		return 0;
	err = pthread_create(&b->thread, NULL, upcie_nvme_bridge_main_, b);
	if (err) {
		memset(b, 0, sizeof(*b));
		return UPCIE_FAIL(-err, "nvme: bridge of queue %u: no poller thread: %s", cfg->qid,
				  upcie_errno_name(err));
	}
	b->running = true;
	return 0;
}

/* A consistent-enough copy of the counters (each one read atomically), from any thread. */
static inline void upcie_nvme_bridge_stats_get(const struct upcie_nvme_bridge *b,
					       struct upcie_nvme_bridge_stats *st)
{
	st->rounds = UPCIE_NVME_BRIDGE_RD_(b->st.rounds);
	st->sq_writes = UPCIE_NVME_BRIDGE_RD_(b->st.sq_writes);
	st->cq_writes = UPCIE_NVME_BRIDGE_RD_(b->st.cq_writes);
	st->relayed = UPCIE_NVME_BRIDGE_RD_(b->st.relayed);
	st->sq_bad = UPCIE_NVME_BRIDGE_RD_(b->st.sq_bad);
	st->cq_bad = UPCIE_NVME_BRIDGE_RD_(b->st.cq_bad);
	st->sleeps = UPCIE_NVME_BRIDGE_RD_(b->st.sleeps);
	st->ntrace = UPCIE_NVME_BRIDGE_RD_(b->st.ntrace);
	st->sq_last = UPCIE_NVME_BRIDGE_RD_(b->st.sq_last);
	st->cq_last = UPCIE_NVME_BRIDGE_RD_(b->st.cq_last);
	st->relay_head = UPCIE_NVME_BRIDGE_RD_(b->st.relay_head);
	st->relay_phase = UPCIE_NVME_BRIDGE_RD_(b->st.relay_phase);
}

/*
 * Stop the poller after one last round (a cell written just before is still delivered), with
 * the final counters in *st (may be NULL). Call when no kernel uses the queue any more, before
 * or after the controller deleted it. The bridge keeps its positions for
 * upcie_nvme_bridge_handback(); a zeroed bridge is a no-op.
 */
static inline void upcie_nvme_bridge_stop(struct upcie_nvme_bridge *b,
					  struct upcie_nvme_bridge_stats *st)
{
	if (!b || !b->live)
		return;
	if (b->running) {
		__atomic_store_n(&b->stop, 1, __ATOMIC_RELEASE);
		pthread_join(b->thread, NULL);
		b->running = false;
	} else {
		upcie_nvme_bridge_poll(b);
	}
	if (st)
		upcie_nvme_bridge_stats_get(b, st);
	b->live = false;
}

/*
 * After upcie_nvme_bridge_stop(): give the queue back to a host queue pair over the same rings
 * and the real doorbells (for instance the one nvme/ctrl.h's upcie_nvme_ioq keeps, before
 * upcie_nvme_ioq_delete() reaps it): its SQ tail, doorbell and head become the last tail
 * written, its CQ head and phase the relay's position, so it neither reposts old entries nor
 * rewrites a doorbell. Only with the relay (cfg.cq set) and with no command outstanding in `qp`.
 * Returns 0, -EINVAL, -EBUSY (still running, or `qp` has commands outstanding).
 */
static inline int upcie_nvme_bridge_handback(const struct upcie_nvme_bridge *b,
					     struct upcie_nvme_qpair *qp)
{
	if (!b || !qp || !b->cfg.cq || (uint32_t)qp->sq_last + 1 != b->cfg.depth ||
	    (uint32_t)qp->cq_last + 1 != b->cfg.depth)
		return UPCIE_FAIL(-EINVAL, "nvme: bridge: handback needs a relayed bridge and a "
					   "queue pair of the same depth");
	if (b->running || upcie_nvme_qpair_inflight(qp))
		return UPCIE_FAIL(-EBUSY,
				  "nvme: bridge of queue %u: handback while running or "
				  "with commands outstanding",
				  b->cfg.qid);
	qp->sq_tail = (uint16_t)b->st.sq_last;
	qp->sq_db = (uint16_t)b->st.sq_last;
	qp->sq_head = (uint16_t)b->st.sq_last;
	qp->cq_head = (uint16_t)b->st.relay_head;
	qp->phase = (uint8_t)b->st.relay_phase;
	return 0;
}

#endif /* UPCIE_GPUQ_BRIDGE_HIP_H */
