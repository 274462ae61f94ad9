/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Completion-queue mirror for AMD GPUs: the protocol and the code that copies. A controller that
 * writes its payloads into GPU memory completes into a CQ in GPU memory too (one destination, so
 * the root complex never holds a completion behind data bound elsewhere); a resident kernel copies
 * each entry, as its phase tag turns, into the host CQ that the CPU's queue pair reads. The CPU
 * keeps the queue (submissions, doorbells, reaping); the GPU never touches the controller. The
 * HIP counterpart of gpuq/cqmirror_cuda.h, with the same slot protocol; gpuq/cqmirror_host_hip.h
 * allocates, launches and retires it.
 *
 * Protocol. The host and the kernel share a table with a slot per queue: the two CQ addresses, the
 * depth and a generation, written by the host; an acknowledgement and a take-up word per slot,
 * written by the kernel. The host fills a slot and raises its generation to an odd value; the
 * wavefront serving the slot writes that value to `taken` when it starts copying, copies until the
 * generation changes, copies what turned before it saw the change (at most one lap), then writes
 * the value it worked under to `ack`. The host frees neither CQ before it sees that. A wavefront
 * that finds an even generation acknowledges the odd value before it, since a queue detached
 * before the wavefront took it up has nothing to drain. `taken` is what lets attach find out that
 * no wavefront is serving (the GPU full of other persistent kernels): the host waits for it,
 * bounded, and otherwise withdraws the slot.
 *
 * Host rules (upcie_nvme_cqmirror_hip_ctl_*, plain C): a stop raises the generation to even once;
 * a stop that timed out and is retried only waits again, so a retry can never make the
 * generation odd, which would hand the slot back to the wavefront. A withdrawn attach, or a stop
 * whose wavefront never answers, keeps the slot and its memory until the acknowledgement comes or
 * the kernel is known to have exited. Every wait is bounded.
 *
 * Copying, per wavefront (one slot): each lane polls one entry's phase-tag word from the head on
 * (64 or 32 entries a round), loaded together with the slot's generation; the run of entries whose
 * tag turned is copied after a system-scope acquire (each lane one 16-byte load of its entry,
 * after its tag: a controller need not write an entry in one transfer), stored to the host CQ with
 * the tag still showing the old phase, then the tag word itself with a release store (the
 * doorbell store of base/arch_hip.h, also used for `ack` and `taken`: on RDNA a plain store may
 * linger in the GPU's write path). So the CPU, which reads the tag first, never sees a new tag
 * before the rest of the entry. A
 * controller does not reuse a slot before the CPU's head doorbell passed it, which needs this
 * copy first, so an entry with the current lap's phase is never stale. The loads are the poll
 * loads of base/arch_hip.h (every cache-policy bit the target has; the device CQ is uncached
 * memory).
 *
 * The table lives in host memory both sides reach (fine-grained), not in VRAM: the host then
 * writes it with plain stores, never through a copy that would queue behind the resident
 * kernel, and each poll of the generation is one PCIe read issued beside the CQ poll.
 *
 * Everything but the kernel is UPCIE_HD and compiles as plain C: a CPU thread running
 * upcie_nvme_cqmirror_hip_serve() (or upcie_nvme_cqmirror_hip_step() round by round) is a
 * wavefront of one lane. That is how tests/hip/test_cqmirror_model.c and the guest case
 * hip_mirror drive this very code. The kernel (upcie_nvme_cqmirror_hip_kernel) needs hipcc and no
 * device library.
 *
 * UPCIE_NVME_CQMIRROR_HIP_TEST_* macros exist for the tests' negative controls only: each removes
 * one rule, and a test must then fail. Never define them in a build that runs.
 */
#ifndef UPCIE_GPUQ_CQMIRROR_HIP_H
#define UPCIE_GPUQ_CQMIRROR_HIP_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <upcie/base/barrier.h>
#include <upcie/base/clock.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/nvme/qpair_port.h>
#include <upcie/nvme/spec.h>

#define UPCIE_NVME_CQMIRROR_HIP_SLOTS 64

/* Empty rounds after which an idle wavefront sleeps between polls. */
#ifndef UPCIE_NVME_CQMIRROR_HIP_IDLE_ROUNDS
#define UPCIE_NVME_CQMIRROR_HIP_IDLE_ROUNDS 4096
#endif
/* How long attach waits for a wavefront to take the slot up, and stop for its acknowledgement. */
#ifndef UPCIE_NVME_CQMIRROR_HIP_ATTACH_TIMEOUT_NS
#define UPCIE_NVME_CQMIRROR_HIP_ATTACH_TIMEOUT_NS (2 * UPCIE_NSEC_PER_SEC)
#endif
#ifndef UPCIE_NVME_CQMIRROR_HIP_ACK_TIMEOUT_NS
#define UPCIE_NVME_CQMIRROR_HIP_ACK_TIMEOUT_NS (2 * UPCIE_NSEC_PER_SEC)
#endif

struct upcie_nvme_cqmirror_hip_slot {
	uint64_t dev_cq;  /* GPU address of the CQ the controller writes */
	uint64_t host_cq; /* GPU address of the host CQ the CPU reads */
	uint32_t depth;	  /* entries of both, 2..65536 */
	uint32_t gen;	  /* odd: attached; written last */
	uint64_t rsvd;
};

/* The shared table: host-written words first, kernel-written ones on lines of their own. */
struct upcie_nvme_cqmirror_hip_table {
	struct upcie_nvme_cqmirror_hip_slot slot[UPCIE_NVME_CQMIRROR_HIP_SLOTS];
	uint32_t stop; /* non-zero: every wavefront returns (set only with no slot in use) */
	uint32_t rsvd[31];
	uint32_t ack[UPCIE_NVME_CQMIRROR_HIP_SLOTS];   /* odd generation finished, or g - 1 */
	uint32_t taken[UPCIE_NVME_CQMIRROR_HIP_SLOTS]; /* odd generation taken up */
};

/* One wavefront's state between rounds (registers on the GPU). */
struct upcie_nvme_cqmirror_hip_wave {
	const struct upcie_nvme_cqe *dev; /* the slot's CQs while serving */
	struct upcie_nvme_cqe *host;
	uint32_t g;	 /* generation served (odd), 0: not serving */
	uint32_t depth;	 /* of both CQs */
	uint32_t head;	 /* next entry to look at */
	uint32_t phase;	 /* phase tag of new entries at head */
	uint32_t acked;	 /* last value written to ack */
	uint32_t idle;	 /* rounds without work */
	uint64_t copied; /* entries copied, for tests and diagnostics */
};

/* Round results of upcie_nvme_cqmirror_hip_step(). */
#define UPCIE_NVME_CQMIRROR_HIP_BUSY 0 /* did something: poll again at once */
#define UPCIE_NVME_CQMIRROR_HIP_IDLE 1 /* nothing to do this round */
#define UPCIE_NVME_CQMIRROR_HIP_STOP 2 /* the table's stop flag: return */

/* Lanes of a wavefront; a CPU thread standing in for one is a wavefront of one lane. */
#if defined(__HIP_DEVICE_COMPILE__)
#define UPCIE_NVME_CQMIRROR_HIP_LANES __AMDGCN_WAVEFRONT_SIZE
#else
#define UPCIE_NVME_CQMIRROR_HIP_LANES 1
#endif

UPCIE_HD static inline uint32_t upcie_nvme_cqmirror_hip_lane_(void)
{
#if defined(__HIP_DEVICE_COMPILE__) && __AMDGCN_WAVEFRONT_SIZE == 64
	return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
#elif defined(__HIP_DEVICE_COMPILE__)
	return __builtin_amdgcn_mbcnt_lo(~0u, 0u);
#else
	return 0;
#endif
}

/* Bit L set where lane L's `pred` holds (ICMP_NE against 0; clang 15 has no ballot builtin). */
UPCIE_HD static inline uint64_t upcie_nvme_cqmirror_hip_ballot_(bool pred)
{
#if defined(__HIP_DEVICE_COMPILE__)
	return __builtin_amdgcn_uicmp((uint32_t)pred, 0u, 33);
#else
	return pred ? 1u : 0u;
#endif
}

UPCIE_HD static inline uint32_t upcie_nvme_cqmirror_hip_ld32_(const volatile uint32_t *p)
{
	return upcie_nvme_port_load32((const uint32_t *)p);
}

/* Two words polled together (one latency on the GPU). */
UPCIE_HD static inline void upcie_nvme_cqmirror_hip_ld32x2_(const volatile uint32_t *a,
							    const volatile uint32_t *b,
							    uint32_t *va, uint32_t *vb)
{
#if defined(__HIP_DEVICE_COMPILE__)
	upcie_gpu_hip_poll_load32x2((const uint32_t *)a, (const uint32_t *)b, va, vb);
#else
	*va = *a;
	*vb = *b;
#endif
}

UPCIE_HD static inline uint64_t upcie_nvme_cqmirror_hip_ld64_(const volatile uint64_t *p)
{
	uint32_t lo, hi;

	upcie_nvme_cqmirror_hip_ld32x2_((const volatile uint32_t *)p,
					(const volatile uint32_t *)p + 1, &lo, &hi);
	return lo | ((uint64_t)hi << 32);
}

/* The entry at `src` (16-byte aligned) as two 64-bit halves. */
UPCIE_HD static inline void upcie_nvme_cqmirror_hip_ld128_(const struct upcie_nvme_cqe *src,
							   uint64_t *lo, uint64_t *hi)
{
#if defined(__HIP_DEVICE_COMPILE__)
	upcie_gpu_hip_u32x4 v = upcie_gpu_hip_poll_load128(src);

	*lo = v.x | ((uint64_t)v.y << 32);
	*hi = v.z | ((uint64_t)v.w << 32);
#else
	const volatile uint32_t *w = (const volatile uint32_t *)src;

	*lo = w[0] | ((uint64_t)w[1] << 32);
	*hi = w[2] | ((uint64_t)w[3] << 32);
#endif
}

/* System-scope acquire: what the controller wrote before the tags seen is visible after it. */
UPCIE_HD static inline void upcie_nvme_cqmirror_hip_acquire_(void)
{
#if !defined(UPCIE_NVME_CQMIRROR_HIP_TEST_NO_ACQUIRE) /* negative control only */
	upcie_nvme_port_dma_rmb();
#endif
}

/* The 16-byte entry stored to the host CQ (glc slc dlc on RDNA: see base/arch_hip.h). */
UPCIE_HD static inline void upcie_nvme_cqmirror_hip_st128_(struct upcie_nvme_cqe *dst, uint64_t lo,
							   uint64_t hi)
{
#if defined(__HIP_DEVICE_COMPILE__)
	upcie_gpu_hip_u32x4 v;

	v.x = (uint32_t)lo;
	v.y = (uint32_t)(lo >> 32);
	v.z = (uint32_t)hi;
	v.w = (uint32_t)(hi >> 32);
	upcie_gpu_hip_store128_sys(dst, v);
#else
	upcie_nvme_port_store16(dst, lo, hi);
#endif
}

/*
 * A release store of a word the host polls (an entry's tag, ack, taken): everything this
 * wavefront stored before reaches the host first. On the GPU the doorbell store of
 * base/arch_hip.h (RDNA: drain, store past every cache level, invalidate; elsewhere a system
 * fence and the store).
 */
UPCIE_HD static inline void upcie_nvme_cqmirror_hip_st32_(volatile uint32_t *p, uint32_t v)
{
#if defined(UPCIE_NVME_CQMIRROR_HIP_TEST_PLAIN_TAG) /* negative control only */
	*p = v;
#elif defined(__HIP_DEVICE_COMPILE__)
	upcie_gpu_hip_doorbell_store(p, v);
#else
	upcie_wmb();
	*p = v;
#endif
}

/* Lane 0 publishes `v` at `p` with a release store. */
UPCIE_HD static inline void upcie_nvme_cqmirror_hip_signal_(volatile uint32_t *p, uint32_t v)
{
	if (upcie_nvme_cqmirror_hip_lane_() == 0)
		upcie_nvme_cqmirror_hip_st32_(p, v);
}

/* Spin hint between idle rounds. */
UPCIE_HD static inline void upcie_nvme_cqmirror_hip_nap_(void)
{
#if defined(__HIP_DEVICE_COMPILE__)
	__builtin_amdgcn_s_sleep(8);
#elif defined(__HIPCC__)
	/* host pass of hipcc: parsed, never run */
#else
	upcie_sleep_ns(10 * UPCIE_NSEC_PER_USEC);
#endif
}

/*
 * One round on the slot's CQs: poll the entries from the head (with the generation when `gen` is
 * given, its value in *g2), copy the run whose tags turned. Returns how many were copied.
 */
UPCIE_HD static inline uint32_t
upcie_nvme_cqmirror_hip_copy_(struct upcie_nvme_cqmirror_hip_wave *w, const volatile uint32_t *gen,
			      uint32_t *g2)
{
	uint32_t lane = upcie_nvme_cqmirror_hip_lane_(), idx = w->head + lane, want = w->phase;
	uint32_t dw3 = 0, n;
	bool valid = lane < w->depth;
	uint64_t m, lo, hi;

	if (idx >= w->depth) {
		idx -= w->depth;
		want ^= 1u;
	}
	if (!valid)
		idx = w->head; /* a harmless address; the lane takes no part */
	if (gen)
		upcie_nvme_cqmirror_hip_ld32x2_(gen, &w->dev[idx].dw3, g2, &dw3);
	else
		dw3 = upcie_nvme_cqmirror_hip_ld32_(&w->dev[idx].dw3);
	m = upcie_nvme_cqmirror_hip_ballot_(valid && ((dw3 >> 16) & 1u) == want);
	n = ~m ? (uint32_t)__builtin_ctzll(~m) : 64u;
	if (!n)
		return 0;
	upcie_nvme_cqmirror_hip_acquire_();
	if (lane < n) {
		/* The whole entry, read after its tag; stored with the tag still old, then the tag
		 * with a release store. */
		upcie_nvme_cqmirror_hip_ld128_(&w->dev[idx], &lo, &hi);
		upcie_nvme_cqmirror_hip_st128_(&w->host[idx], lo, hi ^ (UINT64_C(1) << 48));
		upcie_nvme_cqmirror_hip_st32_(&w->host[idx].dw3, dw3);
	}
	w->head += n;
	if (w->head >= w->depth) {
		w->head -= w->depth;
		w->phase ^= 1u;
	}
	w->copied += n;
	return n;
}

/* A wavefront starting (or restarting) on slot `s`: it has acknowledged what ack[s] says. */
UPCIE_HD static inline void
upcie_nvme_cqmirror_hip_wave_init(struct upcie_nvme_cqmirror_hip_wave *w,
				  struct upcie_nvme_cqmirror_hip_table *t, uint32_t s)
{
	w->dev = (const struct upcie_nvme_cqe *)0;
	w->host = (struct upcie_nvme_cqe *)0;
	w->g = 0;
	w->depth = 0;
	w->head = 0;
	w->phase = 1;
	w->idle = 0;
	w->copied = 0;
	w->acked = upcie_nvme_cqmirror_hip_ld32_(&t->ack[s]);
}

/*
 * One round of the wavefront serving slot `s`: take up an odd generation, copy, or, once the
 * generation moved, drain at most one lap and acknowledge. Returns UPCIE_NVME_CQMIRROR_HIP_BUSY,
 * _IDLE or _STOP.
 */
UPCIE_HD static inline int upcie_nvme_cqmirror_hip_step(struct upcie_nvme_cqmirror_hip_table *t,
							uint32_t s,
							struct upcie_nvme_cqmirror_hip_wave *w)
{
	struct upcie_nvme_cqmirror_hip_slot *sl = &t->slot[s];
	uint32_t g, n, c;

	if (!w->g) {
		g = upcie_nvme_cqmirror_hip_ld32_(&sl->gen);
		if (!(g & 1u)) {
			if (upcie_nvme_cqmirror_hip_ld32_(&t->stop))
				return UPCIE_NVME_CQMIRROR_HIP_STOP;
			if (g && w->acked != g - 1) {
				/* Detached before it was taken up: nothing to drain. */
				upcie_nvme_cqmirror_hip_signal_(&t->ack[s], g - 1);
				w->acked = g - 1;
				return UPCIE_NVME_CQMIRROR_HIP_BUSY;
			}
			return UPCIE_NVME_CQMIRROR_HIP_IDLE;
		}
		upcie_nvme_cqmirror_hip_acquire_(); /* the slot's fields were written before gen */
		w->dev = (const struct upcie_nvme_cqe *)(uintptr_t)upcie_nvme_cqmirror_hip_ld64_(
		    &sl->dev_cq);
		w->host =
		    (struct upcie_nvme_cqe *)(uintptr_t)upcie_nvme_cqmirror_hip_ld64_(&sl->host_cq);
		w->depth = upcie_nvme_cqmirror_hip_ld32_(&sl->depth);
		w->head = 0;
		w->phase = 1;
		w->g = g;
		upcie_nvme_cqmirror_hip_signal_(&t->taken[s], g);
		return UPCIE_NVME_CQMIRROR_HIP_BUSY;
	}
	g = w->g;
	n = upcie_nvme_cqmirror_hip_copy_(w, &sl->gen, &g);
	if (g == w->g)
		return n ? UPCIE_NVME_CQMIRROR_HIP_BUSY : UPCIE_NVME_CQMIRROR_HIP_IDLE;
		/* The generation moved: what turned before the change is copied, then acknowledged. */
#if !defined(UPCIE_NVME_CQMIRROR_HIP_TEST_NO_DRAIN) /* negative control only */
	for (c = 0; c < w->depth; c += n) {
		n = upcie_nvme_cqmirror_hip_copy_(w, (const volatile uint32_t *)0, (uint32_t *)0);
		if (!n)
			break;
	}
#else
	(void)c;
#endif
	upcie_nvme_cqmirror_hip_signal_(&t->ack[s], w->g);
	w->acked = w->g;
	w->g = 0;
	return UPCIE_NVME_CQMIRROR_HIP_BUSY;
}

/* Serve slot `s` until the table's stop flag is set (one wavefront, or one CPU thread). */
UPCIE_HD static inline void upcie_nvme_cqmirror_hip_serve(struct upcie_nvme_cqmirror_hip_table *t,
							  uint32_t s)
{
	struct upcie_nvme_cqmirror_hip_wave w;
	int r;

	upcie_nvme_cqmirror_hip_wave_init(&w, t, s);
	while ((r = upcie_nvme_cqmirror_hip_step(t, s, &w)) != UPCIE_NVME_CQMIRROR_HIP_STOP) {
		if (r == UPCIE_NVME_CQMIRROR_HIP_BUSY) {
			w.idle = 0;
		} else if (++w.idle > UPCIE_NVME_CQMIRROR_HIP_IDLE_ROUNDS) {
			w.idle = UPCIE_NVME_CQMIRROR_HIP_IDLE_ROUNDS;
			upcie_nvme_cqmirror_hip_nap_();
		}
	}
}

#if defined(__HIPCC__)
/*
 * The resident kernel: one workgroup of one wavefront per slot (grid = slots served, block = the
 * wavefront size). A template so that every translation unit may carry it without clashing.
 */
template <int upcie_instance_>
__global__ void __launch_bounds__(64)
    upcie_nvme_cqmirror_hip_kernel(struct upcie_nvme_cqmirror_hip_table *t)
{
	/* One wavefront a slot, whatever block size it was launched with. */
	if (__builtin_amdgcn_workitem_id_x() < UPCIE_NVME_CQMIRROR_HIP_LANES)
		upcie_nvme_cqmirror_hip_serve(t, __builtin_amdgcn_workgroup_id_x());
}
#endif

/* ---- Host side of the protocol (plain C; the caller owns memory and the kernel). ---- */

/* Slot states as the host sees them. */
#define UPCIE_NVME_CQMIRROR_HIP_FREE	 0 /* unused */
#define UPCIE_NVME_CQMIRROR_HIP_LIVE	 1 /* odd generation */
#define UPCIE_NVME_CQMIRROR_HIP_STOPPING 2 /* even, acknowledgement pending: memory held */
#define UPCIE_NVME_CQMIRROR_HIP_STOPPED	 3 /* acknowledged: the owner may free and release */
#define UPCIE_NVME_CQMIRROR_HIP_ORPHAN	 4 /* withdrawn attach, acknowledgement pending */

struct upcie_nvme_cqmirror_hip_ctl {
	struct upcie_nvme_cqmirror_hip_table *t; /* CPU address of the shared table */
	uint32_t nslots;			 /* slots the kernel serves (its wavefronts) */
	uint64_t attach_timeout_ns, ack_timeout_ns;
	uint32_t gen[UPCIE_NVME_CQMIRROR_HIP_SLOTS];
	uint8_t state[UPCIE_NVME_CQMIRROR_HIP_SLOTS];
};

/*
 * Take over a zeroed table served by `nslots` wavefronts (1..64). Timeouts 0: the defaults.
 * Returns 0 or -EINVAL.
 */
static inline int upcie_nvme_cqmirror_hip_ctl_init(struct upcie_nvme_cqmirror_hip_ctl *c,
						   struct upcie_nvme_cqmirror_hip_table *t,
						   uint32_t nslots, uint64_t attach_timeout_ns,
						   uint64_t ack_timeout_ns)
{
	if (!c || !t || !nslots || nslots > UPCIE_NVME_CQMIRROR_HIP_SLOTS)
		return UPCIE_FAIL(-EINVAL, "nvme: cqmirror hip: bad table or %u slots", nslots);
	memset(c, 0, sizeof(*c));
	c->t = t;
	c->nslots = nslots;
	c->attach_timeout_ns =
	    attach_timeout_ns ? attach_timeout_ns : UPCIE_NVME_CQMIRROR_HIP_ATTACH_TIMEOUT_NS;
	c->ack_timeout_ns =
	    ack_timeout_ns ? ack_timeout_ns : UPCIE_NVME_CQMIRROR_HIP_ACK_TIMEOUT_NS;
	return 0;
}

static inline void upcie_nvme_cqmirror_hip_ctl_gen_(struct upcie_nvme_cqmirror_hip_ctl *c, int s,
						    uint32_t g)
{
	upcie_mb(); /* the slot's fields (and the CQs' zeroing) before the generation */
	*(volatile uint32_t *)&c->t->slot[s].gen = g;
	upcie_mb();
	c->gen[s] = g;
}

static inline uint32_t upcie_nvme_cqmirror_hip_ctl_rd_(const uint32_t *p)
{
	uint32_t v = *(const volatile uint32_t *)p;

	upcie_rmb();
	return v;
}

/* Whether any slot is in use (not FREE). */
static inline bool upcie_nvme_cqmirror_hip_ctl_busy(const struct upcie_nvme_cqmirror_hip_ctl *c)
{
	for (uint32_t s = 0; s < c->nslots; s++)
		if (c->state[s] != UPCIE_NVME_CQMIRROR_HIP_FREE)
			return true;
	return false;
}

/*
 * Fill a free slot with the two CQs (GPU addresses; both zeroed by the caller) and raise its
 * generation to odd. Returns 0 (*slot, *gen), -EINVAL, -ENOSPC (no free slot). The wavefront
 * takes it up asynchronously: see upcie_nvme_cqmirror_hip_ctl_taken().
 */
static inline int upcie_nvme_cqmirror_hip_ctl_attach_begin(struct upcie_nvme_cqmirror_hip_ctl *c,
							   uint64_t dev_cq, uint64_t host_cq,
							   uint32_t depth, int *slot, uint32_t *gen)
{
	struct upcie_nvme_cqmirror_hip_slot *sl;
	int s = -1;

	if (!c || !c->t || !dev_cq || !host_cq || depth < 2 || depth > 65536 || !slot || !gen)
		return UPCIE_FAIL(-EINVAL, "nvme: cqmirror hip: bad attach (depth %u)", depth);
	for (uint32_t i = 0; i < c->nslots && s < 0; i++)
		if (c->state[i] == UPCIE_NVME_CQMIRROR_HIP_FREE)
			s = (int)i;
	if (s < 0)
		return UPCIE_FAIL(-ENOSPC, "nvme: cqmirror hip: all %u slots in use", c->nslots);
	sl = &c->t->slot[s];
	sl->dev_cq = dev_cq;
	sl->host_cq = host_cq;
	sl->depth = depth;
	upcie_nvme_cqmirror_hip_ctl_gen_(c, s, (c->gen[s] + 1) | 1u);
	c->state[s] = UPCIE_NVME_CQMIRROR_HIP_LIVE;
	*slot = s;
	*gen = c->gen[s];
	return 0;
}

/* Whether the wavefront took generation `gen` of slot `s` up. */
static inline bool upcie_nvme_cqmirror_hip_ctl_taken(const struct upcie_nvme_cqmirror_hip_ctl *c,
						     int s, uint32_t gen)
{
	return upcie_nvme_cqmirror_hip_ctl_rd_(&c->t->taken[s]) == gen;
}

/*
 * Withdraw an attach nobody took up: the generation goes even, and the slot and its memory stay
 * held (ORPHAN) until the wavefront acknowledges (upcie_nvme_cqmirror_hip_ctl_reclaim()) or the
 * kernel has exited (upcie_nvme_cqmirror_hip_ctl_exited()).
 */
static inline void upcie_nvme_cqmirror_hip_ctl_withdraw(struct upcie_nvme_cqmirror_hip_ctl *c,
							int s)
{
	if (c->state[s] != UPCIE_NVME_CQMIRROR_HIP_LIVE)
		return;
	upcie_nvme_cqmirror_hip_ctl_gen_(c, s, c->gen[s] + 1);
	c->state[s] = UPCIE_NVME_CQMIRROR_HIP_ORPHAN;
}

/*
 * Attach and wait (bounded) until a wavefront serves the slot. Returns 0 (*slot, *gen);
 * -ETIMEDOUT (nobody took it up within attach_timeout_ns: the attach is withdrawn, the slot is
 * an ORPHAN the caller's memory stays bound to); the errors of attach_begin.
 */
static inline int upcie_nvme_cqmirror_hip_ctl_attach(struct upcie_nvme_cqmirror_hip_ctl *c,
						     uint64_t dev_cq, uint64_t host_cq,
						     uint32_t depth, int *slot, uint32_t *gen)
{
	uint64_t t0;
	int err = upcie_nvme_cqmirror_hip_ctl_attach_begin(c, dev_cq, host_cq, depth, slot, gen);

	if (err)
		return err;
	t0 = upcie_time_ns();
	while (!upcie_nvme_cqmirror_hip_ctl_taken(c, *slot, *gen)) {
		if (upcie_time_ns() - t0 >= c->attach_timeout_ns) {
			upcie_nvme_cqmirror_hip_ctl_withdraw(c, *slot);
			return UPCIE_FAIL(
			    -ETIMEDOUT,
			    "nvme: cqmirror hip: slot %d: no wavefront took "
			    "generation %u up within %llu ms (is the GPU full of "
			    "other persistent kernels?); attach withdrawn",
			    *slot, *gen,
			    (unsigned long long)(c->attach_timeout_ns / UPCIE_NSEC_PER_MSEC));
		}
		sched_yield();
	}
	return 0;
}

/*
 * Begin stopping slot `s` (generation `gen`): LIVE raises the generation to even, once; a stop
 * already under way changes nothing (a retry must never make the generation odd again).
 * Returns 0, -EINVAL (not this attach).
 */
static inline int upcie_nvme_cqmirror_hip_ctl_stop_begin(struct upcie_nvme_cqmirror_hip_ctl *c,
							 int s, uint32_t gen)
{
	if (!c || s < 0 || (uint32_t)s >= c->nslots || !(gen & 1u) ||
	    (c->gen[s] != gen && c->gen[s] != gen + 1))
		return UPCIE_FAIL(-EINVAL, "nvme: cqmirror hip: slot %d has no generation %u", s,
				  gen);
	if (c->state[s] == UPCIE_NVME_CQMIRROR_HIP_LIVE) {
		upcie_nvme_cqmirror_hip_ctl_gen_(c, s, gen + 1);
		c->state[s] = UPCIE_NVME_CQMIRROR_HIP_STOPPING;
	}
#if defined(UPCIE_NVME_CQMIRROR_HIP_TEST_RETRY_BUMPS) /* negative control only */
	else if (c->state[s] == UPCIE_NVME_CQMIRROR_HIP_STOPPING)
		upcie_nvme_cqmirror_hip_ctl_gen_(c, s, c->gen[s] + 1);
#endif
	return 0;
}

/* STOPPING slot `s` acknowledged? Then STOPPED. Returns whether it is STOPPED. */
static inline bool upcie_nvme_cqmirror_hip_ctl_stop_poll(struct upcie_nvme_cqmirror_hip_ctl *c,
							 int s)
{
	if (c->state[s] == UPCIE_NVME_CQMIRROR_HIP_STOPPING &&
	    upcie_nvme_cqmirror_hip_ctl_rd_(&c->t->ack[s]) == c->gen[s] - 1)
		c->state[s] = UPCIE_NVME_CQMIRROR_HIP_STOPPED;
	return c->state[s] == UPCIE_NVME_CQMIRROR_HIP_STOPPED;
}

/*
 * Stop slot `s` (generation `gen`) and wait (bounded) for the acknowledgement: afterwards the
 * host CQ holds every entry the controller wrote before the stop, and the wavefront writes
 * nothing more to either CQ. Returns 0 (STOPPED: the owner may free the CQs, then release);
 * -ETIMEDOUT (no acknowledgement within ack_timeout_ns: the memory stays held, and calling again
 * waits again); -EINVAL.
 */
static inline int upcie_nvme_cqmirror_hip_ctl_stop(struct upcie_nvme_cqmirror_hip_ctl *c, int s,
						   uint32_t gen)
{
	uint64_t t0;
	int err = upcie_nvme_cqmirror_hip_ctl_stop_begin(c, s, gen);

	if (err)
		return err;
	t0 = upcie_time_ns();
	while (!upcie_nvme_cqmirror_hip_ctl_stop_poll(c, s)) {
		if (upcie_time_ns() - t0 >= c->ack_timeout_ns)
			return UPCIE_FAIL(
			    -ETIMEDOUT,
			    "nvme: cqmirror hip: slot %d: no acknowledgement of "
			    "generation %u within %llu ms; its CQs stay allocated",
			    s, c->gen[s] - 1,
			    (unsigned long long)(c->ack_timeout_ns / UPCIE_NSEC_PER_MSEC));
		sched_yield();
	}
	return 0;
}

/* Give a STOPPED slot back (after its memory was freed). Returns 0 or -EBUSY (not stopped). */
static inline int upcie_nvme_cqmirror_hip_ctl_release(struct upcie_nvme_cqmirror_hip_ctl *c, int s)
{
	if (c->state[s] != UPCIE_NVME_CQMIRROR_HIP_STOPPED)
		return UPCIE_FAIL(-EBUSY, "nvme: cqmirror hip: slot %d released before it stopped",
				  s);
	c->state[s] = UPCIE_NVME_CQMIRROR_HIP_FREE;
	return 0;
}

/*
 * An ORPHAN slot whose wavefront has acknowledged becomes FREE: returns true, and the caller frees
 * the memory it left bound to the slot.
 */
static inline bool upcie_nvme_cqmirror_hip_ctl_reclaim(struct upcie_nvme_cqmirror_hip_ctl *c, int s)
{
	if (c->state[s] != UPCIE_NVME_CQMIRROR_HIP_ORPHAN ||
	    upcie_nvme_cqmirror_hip_ctl_rd_(&c->t->ack[s]) != c->gen[s] - 1)
		return false;
	c->state[s] = UPCIE_NVME_CQMIRROR_HIP_FREE;
	return true;
}

/* Ask every wavefront to return. Only with no slot in use: -EBUSY otherwise. */
static inline int upcie_nvme_cqmirror_hip_ctl_retire(struct upcie_nvme_cqmirror_hip_ctl *c)
{
	if (upcie_nvme_cqmirror_hip_ctl_busy(c))
		return UPCIE_FAIL(-EBUSY, "nvme: cqmirror hip: retire with slots in use");
	upcie_mb();
	*(volatile uint32_t *)&c->t->stop = 1;
	upcie_mb();
	return 0;
}

/*
 * The kernel has exited (every wavefront returned, or none ever ran and none ever will): nothing
 * reads or writes the CQs any more. STOPPING and LIVE slots become STOPPED (their owners free and
 * release), ORPHANs FREE: the mask of those is returned, their memory to be freed by the caller.
 * The stop flag is cleared for the next launch.
 */
static inline uint64_t upcie_nvme_cqmirror_hip_ctl_exited(struct upcie_nvme_cqmirror_hip_ctl *c)
{
	uint64_t orphans = 0;

	for (uint32_t s = 0; s < c->nslots; s++) {
		if (c->state[s] == UPCIE_NVME_CQMIRROR_HIP_ORPHAN) {
			c->state[s] = UPCIE_NVME_CQMIRROR_HIP_FREE;
			orphans |= UINT64_C(1) << s;
		} else if (c->state[s] == UPCIE_NVME_CQMIRROR_HIP_LIVE ||
			   c->state[s] == UPCIE_NVME_CQMIRROR_HIP_STOPPING) {
			if (c->state[s] == UPCIE_NVME_CQMIRROR_HIP_LIVE)
				upcie_nvme_cqmirror_hip_ctl_gen_(c, (int)s, c->gen[s] + 1);
			c->state[s] = UPCIE_NVME_CQMIRROR_HIP_STOPPED;
		}
	}
	*(volatile uint32_t *)&c->t->stop = 0;
	upcie_mb();
	return orphans;
}

#endif /* UPCIE_GPUQ_CQMIRROR_HIP_H */
