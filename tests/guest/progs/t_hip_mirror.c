/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest test of the HIP completion mirror (gpuq/cqmirror_hip.h) against QEMU's emulated NVMe, with
 * CPU threads playing the resident kernel's wavefronts on the memory layout the mirror gives a
 * real GPU: the controller's CQ and the data buffers in device memory (here the ivshmem BAR,
 * "VRAM", reached peer to peer), the host CQ in host memory, read by the CPU's own queue pair as a
 * user's code would. Each "wavefront" is a thread stepping upcie_nvme_cqmirror_hip_step() on its
 * slot exactly as upcie_nvme_cqmirror_hip_serve() does, which the test can hold still (a stuck
 * wavefront) or never start (one that never became resident).
 *
 * Cases (c0, namespace 1, 512 B blocks): writes from VRAM and reads back into VRAM through the
 * mirror, data verified in the guest and in the backing files by the host script; the host CQ
 * equal to the device CQ entry for entry; three queues on three slots at once; a depth-8 queue
 * wrapped many times; a stop while completions still arrive (every entry written before it
 * mirrored, nothing written after the acknowledgement, every command ending once after the queue
 * is deleted); a stop that times out and is retried while the wavefront is stuck (the generation
 * stays even, the slot is never taken up again; it stops once the wavefront runs); an attach no
 * wavefront takes up (withdrawn within its bound, reclaimed when one answers).
 *
 * Usage: t_hip_mirror PATH   (uio, type1 or iommufd; TB_C0_BDF, TB_VRAM_BDF, TB_NONCE)
 */
// testbed-ldflags: -lpthread
#include <upcie/base/feature.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/clock.h>
#include <upcie/mem/heap.h>
#include <upcie/nvme/cmd.h>
#include <upcie/gpuq/cqmirror_hip.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/dev.h>
#include <upcie/nvme/ns.h>
#include <upcie/pci/func.h>

#include "t_nvme_util.h"

#define BLK	  512u
#define CMD_BYTES 4096u /* one command: 8 blocks, one page, PRP1 only */
#define MAXCMD	  64
#define NS_ID	  1
#define NSLOT	  4
#define VOFF	  (16 * MiB) /* the slice of vram.img this test uses */
#define VSIZE	  (4 * MiB)
#define TMO_NS	  (300 * UPCIE_NSEC_PER_MSEC) /* attach and stop bounds */

static struct upcie_nvme_ctrl g_c;
static struct upcie_nvme_ns g_ns;
static enum upcie_nvme_path g_path;
static struct upcie_pci_bdf g_vram_bdf;
static struct upcie_nvme_peer g_vram;
static struct upcie_heap g_vheap; /* device CQs and data buffers, in the BAR */
static bool g_in_vram;
static uint64_t g_slba = 1024;
static int g_nranges;

/* The mirror: the shared table (host memory) and the "kernel" of NSLOT wavefront threads. */
static struct upcie_nvme_cqmirror_hip_table g_tab __attribute__((aligned(4096)));
static struct upcie_nvme_cqmirror_hip_ctl g_ctl;
struct wave {
	uint32_t s;
	pthread_t t;
	int hold; /* 1: stand still (stuck, or not resident yet) */
	int quit;
	bool started;
	struct upcie_nvme_cqmirror_hip_wave w;
};
static struct wave g_wave[NSLOT];

static void *wave_main(void *arg)
{
	struct wave *wv = (struct wave *)arg;
	int r = UPCIE_NVME_CQMIRROR_HIP_BUSY;

	upcie_nvme_cqmirror_hip_wave_init(&wv->w, &g_tab, wv->s);
	while (!__atomic_load_n(&wv->quit, __ATOMIC_ACQUIRE)) {
		if (__atomic_load_n(&wv->hold, __ATOMIC_ACQUIRE)) {
			upcie_sleep_ns(UPCIE_NSEC_PER_MSEC);
			continue;
		}
		/* what upcie_nvme_cqmirror_hip_serve() does, one round at a time */
		r = upcie_nvme_cqmirror_hip_step(&g_tab, wv->s, &wv->w);
		if (r == UPCIE_NVME_CQMIRROR_HIP_STOP)
			break;
		if (r == UPCIE_NVME_CQMIRROR_HIP_BUSY) {
			wv->w.idle = 0;
		} else if (++wv->w.idle > 64) {
			wv->w.idle = 64;
			upcie_sleep_ns(20 * UPCIE_NSEC_PER_USEC);
		}
	}
	return NULL;
}

static int wave_start(uint32_t s, bool hold)
{
	struct wave *wv = &g_wave[s];

	memset(wv, 0, sizeof(*wv));
	wv->s = s;
	wv->hold = hold;
	if (pthread_create(&wv->t, NULL, wave_main, wv))
		return -EAGAIN;
	wv->started = true;
	return 0;
}

static void wave_hold(uint32_t s, int hold)
{
	__atomic_store_n(&g_wave[s].hold, hold, __ATOMIC_RELEASE);
}

/* Blocks for n commands, never reused within a run (the host script checks every range). */
static uint64_t take(unsigned n)
{
	return __atomic_fetch_add(&g_slba, (uint64_t)n * (CMD_BYTES / BLK), __ATOMIC_RELAXED);
}

/* One mirrored queue: the controller's queues from nvme/ctrl.h (CQ in VRAM), the CPU's queue
 * pair over the same SQ and the host CQ, data buffers in VRAM. */
struct mq {
	struct upcie_nvme_ioq ioq;
	struct upcie_nvme_cqe *hcq; /* host CQ */
	struct upcie_nvme_qpair qp;
	void *tables;
	struct upcie_heap_buf wb; /* VRAM: write source, MAXCMD pages */
	uint32_t depth;
	int slot;
	uint32_t gen;
	unsigned ncb, nok, ncancel;
};

static int mq_open(struct mq *q, uint32_t depth)
{
	struct upcie_nvme_ioq_opts o;
	struct upcie_nvme_qpair_cfg qc;
	struct upcie_heap *dh = g_in_vram ? &g_vheap : &g_c.heap;
	int err;

	memset(q, 0, sizeof(*q));
	q->depth = depth;
	q->slot = -1;
	memset(&o, 0, sizeof(o));
	o.depth = depth;
	o.max_xfer = CMD_BYTES;
	o.cq_heap = dh; /* the controller completes into device memory */
	err = upcie_nvme_ioq_create(&q->ioq, &g_c, &o);
	if (err)
		return err;
	err = upcie_heap_alloc(dh, (uint64_t)MAXCMD * CMD_BYTES, 4096, &q->wb);
	if (err)
		return err;
	q->hcq = (struct upcie_nvme_cqe *)aligned_alloc(4096, (size_t)depth * 16);
	q->tables = aligned_alloc(16, upcie_nvme_qpair_tables_size(depth - 1));
	if (!q->hcq || !q->tables)
		return -ENOMEM;
	memset(&qc, 0, sizeof(qc));
	qc.sq = q->ioq.sqb.vaddr;
	qc.cq = q->hcq;
	qc.sqdb = q->ioq.qp.sqdb;
	qc.cqdb = q->ioq.qp.cqdb;
	qc.sq_depth = depth;
	qc.qid = q->ioq.qid;
	qc.tables = q->tables;
	return upcie_nvme_qpair_init(&q->qp, &qc);
}

static int mq_attach(struct mq *q)
{
	return upcie_nvme_cqmirror_hip_ctl_attach(&g_ctl, (uint64_t)(uintptr_t)q->ioq.cqb.vaddr,
						  (uint64_t)(uintptr_t)q->hcq, q->depth, &q->slot,
						  &q->gen);
}

/*
 * Delete the queues on the controller: the controller's queue pair takes over the CPU's
 * positions first (so its doorbell writes stay in order), then what is still outstanding in the
 * CPU's queue pair ends with -ECANCELED.
 */
static void mq_close(struct mq *q)
{
	if (q->ioq.live) {
		q->ioq.qp.sq_tail = q->qp.sq_tail;
		q->ioq.qp.sq_db = q->qp.sq_db;
		q->ioq.qp.sq_head = q->qp.sq_head;
		q->ioq.qp.cq_head = q->qp.cq_head;
		q->ioq.qp.phase = q->qp.phase;
		upcie_nvme_ioq_delete(&q->ioq);
	}
	upcie_nvme_qpair_fini(&q->qp);
	if (q->wb.size)
		upcie_heap_free(g_in_vram ? &g_vheap : &g_c.heap, q->wb.off);
	free(q->hcq);
	free(q->tables);
	q->hcq = NULL;
	q->tables = NULL;
}

static int mq_detach(struct mq *q)
{
	int err;

	if (q->slot < 0)
		return 0;
	err = upcie_nvme_cqmirror_hip_ctl_stop(&g_ctl, q->slot, q->gen);
	if (!err)
		err = upcie_nvme_cqmirror_hip_ctl_release(&g_ctl, q->slot);
	if (!err)
		q->slot = -1;
	return err;
}

static void cb_count(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct mq *q = (struct mq *)ctx;

	q->ncb++;
	q->nok += !err && upcie_nvme_cqe_ok(cqe);
	q->ncancel += err == -ECANCELED;
}

/* n commands on pages [0, n) of `b`, submitted at once, reaped from the host CQ. */
static int io_batch(struct mq *q, bool write, uint64_t slba, const struct upcie_heap_buf *b,
		    unsigned n)
{
	unsigned want = q->ncb + n, ok0 = q->nok;
	uint64_t t0;

	for (unsigned i = 0; i < n; i++) {
		struct upcie_nvme_sqe sqe;
		uint64_t s = slba + (uint64_t)i * (CMD_BYTES / BLK);
		int err = write ? upcie_nvme_cmd_write(&sqe, NS_ID, s, CMD_BYTES / BLK, 0)
				: upcie_nvme_cmd_read(&sqe, NS_ID, s, CMD_BYTES / BLK, 0);

		sqe.prp1 = b->iova + (uint64_t)i * CMD_BYTES;
		if (!err)
			err = upcie_nvme_qpair_submit(&q->qp, &sqe, cb_count, q, NULL);
		if (err)
			return err;
	}
	for (t0 = upcie_time_ns(); q->ncb < want && upcie_time_ns() - t0 < 5 * UPCIE_NSEC_PER_SEC;)
		if (upcie_nvme_qpair_reap(&q->qp, 0xffffffffu) <= 0)
			upcie_cpu_relax();
	if (q->ncb != want)
		return -ETIMEDOUT;
	return q->nok - ok0 == n ? 0 : -EIO;
}

/* The CPU view of a buffer page (VRAM through the BAR mapping, or host memory). */
static uint8_t *page(const struct upcie_heap_buf *b, unsigned i)
{
	return (uint8_t *)b->vaddr + (size_t)i * CMD_BYTES;
}

/*
 * Write n commands' worth at slba from VRAM, read it back into fresh VRAM (kept, so that the
 * host script finds every read in vram.img), compare; report both ranges.
 */
static bool write_read(struct mq *q, const char *name, uint64_t slba, unsigned n)
{
	struct upcie_heap_buf rb;
	char tag[9];
	int err;
	int64_t d;

	tn_tag(tag, name);
	err =
	    upcie_heap_alloc(g_in_vram ? &g_vheap : &g_c.heap, (uint64_t)n * CMD_BYTES, 4096, &rb);
	if (err) {
		DIAG("%s: no memory for the read-back (%d)", name, err);
		return false;
	}
	tn_pat(page(&q->wb, 0), (uint64_t)n * CMD_BYTES, tag, slba * BLK);
	memset(page(&rb, 0), 0, (size_t)n * CMD_BYTES);
	err = io_batch(q, true, slba, &q->wb, n);
	if (!err)
		err = io_batch(q, false, slba, &rb, n);
	if (err) {
		DIAG("%s: %d (%u callbacks, %u ok)", name, err, q->ncb, q->nok);
		return false;
	}
	d = tn_pat_diff(page(&rb, 0), (uint64_t)n * CMD_BYTES, tag, slba * BLK);
	if (d >= 0) {
		DIAG("%s: read-back differs at byte %lld", name, (long long)d);
		return false;
	}
	INFO("w_c0n1", "%llu+%u+%s", (unsigned long long)(slba * BLK), n * CMD_BYTES, tag);
	if (g_in_vram)
		INFO("r_vram", "%llu+%u+%llu+%s", (unsigned long long)(VOFF + rb.off),
		     n * CMD_BYTES, (unsigned long long)(slba * BLK), tag);
	__atomic_add_fetch(&g_nranges, 1, __ATOMIC_RELAXED);
	return true;
}

static void t_single(void)
{
	static struct mq q;
	int err = mq_open(&q, 64);
	bool same = true;

	TAP(!err, "single: queue of depth 64, CQ in %s (%d)", g_in_vram ? "VRAM" : "host memory",
	    err);
	if (!err)
		err = mq_attach(&q);
	TAP(!err && q.slot >= 0 && g_tab.taken[q.slot] == q.gen,
	    "single: attached on slot %d, generation %u, taken up by its wavefront (%d)", q.slot,
	    q.gen, err);
	if (!err) {
		TAP(write_read(&q, "hms0", take(16), 16),
		    "single: 16 writes from VRAM and 16 reads into VRAM through the mirror, data "
		    "verified");
		for (uint32_t i = 0; i < 32; i++)
			same =
			    same && !memcmp(&q.hcq[i], (const char *)q.ioq.cqb.vaddr + i * 16, 16);
		TAP(same, "single: the host CQ holds the device CQ's 32 entries, tags included");
		TAP(!mq_detach(&q), "single: detached (acknowledged)");
	}
	mq_close(&q);
}

struct mt_arg {
	struct mq *q;
	char name[8];
	bool ok;
};

static void *mt_main(void *arg)
{
	struct mt_arg *a = (struct mt_arg *)arg;

	a->ok = true;
	for (unsigned r = 0; r < 4; r++)
		a->ok = a->ok && write_read(a->q, a->name, take(8), 8);
	return NULL;
}

static void t_multi(void)
{
	static struct mq q[3];
	struct mt_arg a[3];
	pthread_t t[3];
	unsigned nok = 0, nup = 0;

	for (int i = 0; i < 3; i++)
		nup += !mq_open(&q[i], 32) && !mq_attach(&q[i]);
	TAP(nup == 3, "multi: 3 queues attached on 3 slots (%d %d %d)", q[0].slot, q[1].slot,
	    q[2].slot);
	for (int i = 0; nup == 3 && i < 3; i++) {
		a[i].q = &q[i];
		snprintf(a[i].name, sizeof(a[i].name), "hmm%d", i);
		pthread_create(&t[i], NULL, mt_main, &a[i]);
	}
	for (int i = 0; nup == 3 && i < 3; i++) {
		pthread_join(t[i], NULL);
		nok += a[i].ok;
	}
	TAP(nok == 3, "multi: 4 rounds of 8 + 8 on each queue at once, data verified on %u", nok);
	for (int i = 0; i < 3; i++) {
		TAP(!mq_detach(&q[i]), "multi: queue %d detached", i);
		mq_close(&q[i]);
	}
}

static void t_wrap(void)
{
	static struct mq q;
	unsigned nok = 0;
	uint64_t c0 = 0, c1 = 0;
	int err = mq_open(&q, 8);

	if (!err)
		err = mq_attach(&q);
	TAP(!err, "wrap: depth-8 queue attached (%d)", err);
	if (!err)
		c0 = __atomic_load_n(&g_wave[q.slot].w.copied, __ATOMIC_RELAXED);
	for (unsigned r = 0; !err && r < 8; r++)
		nok += write_read(&q, "hmw", take(6), 6);
	if (!err)
		c1 = __atomic_load_n(&g_wave[q.slot].w.copied, __ATOMIC_RELAXED);
	TAP(nok == 8 && c1 - c0 == 96,
	    "wrap: 8 rounds of 6 + 6 on 8 slots (12 laps), data verified in %u, %llu entries "
	    "mirrored",
	    nok, (unsigned long long)(c1 - c0));
	TAP(!err && !mq_detach(&q), "wrap: detached");
	mq_close(&q);
}

/* The tag word of device CQ entry i, as the controller wrote it. */
static uint32_t dev_dw3(const struct mq *q, unsigned i)
{
	return ((const volatile uint32_t *)q->ioq.cqb.vaddr)[i * 4 + 3];
}

struct rd {
	struct mq *q;
	int st; /* 0 outstanding, 1 completed, -1 cancelled */
};

static void cb_rd(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct rd *r = (struct rd *)ctx;

	r->st = err == -ECANCELED ? -1 : 1;
	cb_count(r->q, cqe, err);
}

/* A stop while the controller is still completing. */
static void t_stop_traffic(void)
{
	static struct mq q;
	static struct upcie_nvme_cqe snap[64];
	struct rd rd[48];
	struct upcie_heap_buf rb;
	unsigned landed = 0, mirrored = 0, dev_after = 0, done, bad = 0;
	bool same = true;
	uint64_t slba = take(48 * 2);
	char tag[9];
	int err = mq_open(&q, 64);

	memset(&rb, 0, sizeof(rb));
	if (!err)
		err = mq_attach(&q);
	if (!err)
		err = upcie_heap_alloc(&g_vheap, 48 * 2 * CMD_BYTES, 4096, &rb);
	/* 48 reads of 8 KiB (PRP1 and PRP2): the first 24 rung at once, the other 24 enqueued */
	for (unsigned i = 0; !err && i < 48; i++) {
		struct upcie_nvme_sqe sqe;

		rd[i].q = &q;
		rd[i].st = 0;
		upcie_nvme_cmd_read(&sqe, NS_ID, slba + (uint64_t)i * 16, 16, 0);
		sqe.prp1 = rb.iova + (uint64_t)i * 2 * CMD_BYTES;
		sqe.prp2 = sqe.prp1 + CMD_BYTES;
		err = upcie_nvme_qpair_enqueue(&q.qp, &sqe, cb_rd, &rd[i], NULL);
		if (!err && i == 23)
			err = upcie_nvme_qpair_ring(&q.qp);
	}
	/* the first 24 complete; the stop starts; then the other 24 are rung, so they complete
	 * while the stop is under way or after it was acknowledged */
	for (uint64_t t0 = upcie_time_ns(); !err && upcie_time_ns() - t0 < UPCIE_NSEC_PER_SEC;)
		if ((dev_dw3(&q, 23) >> 16) & 1u)
			break;
	for (unsigned i = 0; i < 64; i++)
		landed += (dev_dw3(&q, i) >> 16) & 1u;
	err = err ? err : upcie_nvme_cqmirror_hip_ctl_stop_begin(&g_ctl, q.slot, q.gen);
	if (!err)
		err = upcie_nvme_qpair_ring(&q.qp);
	for (uint64_t t0 = upcie_time_ns();
	     !err && !upcie_nvme_cqmirror_hip_ctl_stop_poll(&g_ctl, q.slot);)
		if (upcie_time_ns() - t0 > TMO_NS)
			err = -ETIMEDOUT;
	TAP(!err,
	    "stop under traffic: 24 reads completed, stop begun, 24 more rung, stop acknowledged "
	    "(%u had landed before it) (%d)",
	    landed, err);
	memcpy(snap, q.hcq, sizeof(snap));
	for (unsigned i = 0; i < 64; i++) {
		bool t = (snap[i].dw3 >> 16) & 1u;

		mirrored += t;
		if (t && memcmp(&snap[i], (const char *)q.ioq.cqb.vaddr + i * 16, 16))
			same = false;
	}
	TAP(!err && landed == 24 && mirrored >= landed && same,
	    "stop under traffic: every entry written before the stop is mirrored (%u landed, %u "
	    "mirrored, identical to the device CQ: %d)",
	    landed, mirrored, same);
	upcie_sleep_ns(200 * UPCIE_NSEC_PER_MSEC); /* the controller finishes the rest */
	for (unsigned i = 0; i < 64; i++)
		dev_after += (dev_dw3(&q, i) >> 16) & 1u;
	TAP(!memcmp(snap, q.hcq, sizeof(snap)) && dev_after == 48,
	    "stop under traffic: nothing written to the host CQ after the acknowledgement while "
	    "the controller completed the rest (%u in the device CQ)",
	    dev_after);
	/* The owner reaps what was mirrored; the completed reads' data (c0n1 never written there:
	 * the test bed's pattern) is in VRAM. */
	upcie_nvme_qpair_reap(&q.qp, 0xffffffffu);
	done = q.nok;
	tn_tag(tag, "c0n1");
	for (unsigned i = 0; i < 48; i++)
		if (rd[i].st == 1 && tn_pat_diff(page(&rb, 2 * i), 2 * CMD_BYTES, tag,
						 (slba + (uint64_t)i * 16) * BLK) >= 0)
			bad++;
	TAP(done == mirrored && !bad,
	    "stop under traffic: the %u mirrored completions reaped, their data in VRAM verified "
	    "(%u differ)",
	    done, bad);
	mq_close(&q); /* deletes the queues; the rest ends with -ECANCELED */
	TAP(q.ncb == 48 && q.nok == done && q.ncancel == 48 - done,
	    "stop under traffic: after the queue's deletion each of the 48 commands ended once "
	    "(%u completed through the mirror, %u cancelled)",
	    done, q.ncancel);
	TAP(!upcie_nvme_cqmirror_hip_ctl_release(&g_ctl, q.slot), "stop under traffic: released");
}

/* A stuck wavefront: the stop times out, the retry must not hand the slot back. */
static void t_stuck(void)
{
	static struct mq q;
	uint64_t t0, dt;
	uint32_t g1, g2;
	int err = mq_open(&q, 16), e1, e2, e3;

	if (!err)
		err = mq_attach(&q);
	TAP(!err && write_read(&q, "hmk", take(4), 4), "stuck: queue served, data verified (%d)",
	    err);
	if (err) {
		mq_close(&q);
		return;
	}
	wave_hold((uint32_t)q.slot, 1);
	upcie_sleep_ns(10 * UPCIE_NSEC_PER_MSEC);
	t0 = upcie_time_ns();
	e1 = upcie_nvme_cqmirror_hip_ctl_stop(&g_ctl, q.slot, q.gen);
	dt = upcie_time_ns() - t0;
	g1 = g_tab.slot[q.slot].gen;
	e2 = upcie_nvme_cqmirror_hip_ctl_stop(&g_ctl, q.slot, q.gen);
	g2 = g_tab.slot[q.slot].gen;
	TAP(e1 == -ETIMEDOUT && dt < 2 * TMO_NS,
	    "stuck: the stop gives up within its bound (%d after %llu ms)", e1,
	    (unsigned long long)(dt / UPCIE_NSEC_PER_MSEC));
	TAP(e2 == -ETIMEDOUT && g1 == q.gen + 1 && g2 == q.gen + 1,
	    "stuck: retried, the generation stays even (%u, %u after %u)", g1, g2, q.gen);
	wave_hold((uint32_t)q.slot, 0);
	e3 = upcie_nvme_cqmirror_hip_ctl_stop(&g_ctl, q.slot, q.gen);
	upcie_sleep_ns(10 * UPCIE_NSEC_PER_MSEC);
	TAP(e3 == 0 && g_tab.ack[q.slot] == q.gen && g_tab.taken[q.slot] == q.gen &&
		g_wave[q.slot].w.g == 0,
	    "stuck: once it runs, the stop is acknowledged and the wavefront serves nothing (%d)",
	    e3);
	TAP(!upcie_nvme_cqmirror_hip_ctl_release(&g_ctl, q.slot), "stuck: released");
	q.slot = -1;
	mq_close(&q);
}

/* No wavefront is resident: attach gives up, the slot comes back when one answers. */
static void t_not_resident(void)
{
	static struct mq q;
	uint64_t t0, dt;
	int err = mq_open(&q, 16), e;
	bool back = false;

	for (uint32_t s = 0; s < NSLOT; s++)
		wave_hold(s, 1);
	upcie_sleep_ns(10 * UPCIE_NSEC_PER_MSEC);
	t0 = upcie_time_ns();
	e = err ? err : mq_attach(&q);
	dt = upcie_time_ns() - t0;
	TAP(e == -ETIMEDOUT && dt < 2 * TMO_NS && q.slot >= 0 &&
		g_ctl.state[q.slot] == UPCIE_NVME_CQMIRROR_HIP_ORPHAN,
	    "not resident: attach gives up within its bound (%d after %llu ms), withdrawn", e,
	    (unsigned long long)(dt / UPCIE_NSEC_PER_MSEC));
	for (uint32_t s = 0; s < NSLOT; s++)
		wave_hold(s, 0);
	for (int i = 0; q.slot >= 0 && i < 1000 && !back; i++) {
		back = upcie_nvme_cqmirror_hip_ctl_reclaim(&g_ctl, q.slot);
		upcie_sleep_ns(UPCIE_NSEC_PER_MSEC);
	}
	TAP(back && g_tab.taken[q.slot] != q.gen,
	    "not resident: the wavefront, once running, acknowledges without serving; slot %d "
	    "reclaimed",
	    q.slot);
	q.slot = -1;
	err = err ? err : mq_attach(&q);
	TAP(!err && write_read(&q, "hmr", take(4), 4) && !mq_detach(&q),
	    "not resident: attached again and served, data verified (%d)", err);
	mq_close(&q);
}

static int vram_open(void)
{
	char drv[64] = "";
	int err;

	if (g_path == UPCIE_NVME_PATH_UIO) {
		upcie_pci_driver_get(&g_vram_bdf, drv, sizeof(drv));
		err = drv[0] ? upcie_pci_driver_unbind(&g_vram_bdf) : 0;
	} else {
		err = upcie_pci_driver_bind(&g_vram_bdf, "vfio-pci");
	}
	if (!err)
		err = upcie_nvme_peer_open(&g_vram, &g_c.dev, &g_vram_bdf, 2, VOFF, VSIZE);
	if (!err && !g_vram.mem.vaddr) {
		upcie_nvme_peer_close(&g_vram);
		err = -EOPNOTSUPP;
	}
	if (!err)
		err = upcie_heap_init(&g_vheap, &g_vram.mem);
	return err;
}

int main(int argc, char **argv)
{
	struct upcie_nvme_ctrl_opts o;
	struct upcie_pci_bdf bdf;
	unsigned nw = 0;
	int err;

	setvbuf(stdout, NULL, _IOLBF, 0);
	upcie_log_set_handler(tn_log, NULL);
	if (argc != 2 || upcie_nvme_path_parse(argv[1], &g_path) ||
	    g_path == UPCIE_NVME_PATH_AUTO || tn_bdf_env("TB_C0_BDF", &bdf) ||
	    tn_bdf_env("TB_VRAM_BDF", &g_vram_bdf)) {
		fprintf(stderr, "usage: t_hip_mirror uio|type1|iommufd (TB_C0_BDF, TB_VRAM_BDF)\n");
		return 2;
	}
	tn_prefix = argv[1][0] == 'u' ? "[uio] " : argv[1][0] == 't' ? "[type1] " : "[iommufd] ";
	memset(&o, 0, sizeof(o));
	o.dev.path = g_path;
	o.dev.bind = true;
	o.host_mem = 32 * MiB;
	err = upcie_nvme_ctrl_open(&g_c, &bdf, &o);
	TAP(!err, "c0 opened (%d), %u I/O queues granted", err, g_c.nqueues);
	if (err) {
		printf("1..%d\n", tn_n);
		return 1;
	}
	err = upcie_nvme_ns_open(&g_ns, &g_c, NS_ID);
	TAP(!err && g_ns.lba_bytes == BLK, "c0n1: %u-byte blocks", g_ns.lba_bytes);
	err = vram_open();
	g_in_vram = !err;
	TAP(!err,
	    "ivshmem BAR2 [%llu MiB, +%llu MiB) as device memory for CQs and data (%s, "
	    "device address 0x%llx) (%d)",
	    (unsigned long long)(VOFF >> 20), (unsigned long long)(VSIZE >> 20),
	    g_vram.mem.kind ? g_vram.mem.kind : "?",
	    (unsigned long long)(err ? 0 : upcie_dmamem_iova_fast(&g_vram.mem, 0)), err);
	upcie_nvme_cqmirror_hip_ctl_init(&g_ctl, &g_tab, NSLOT, TMO_NS, TMO_NS);
	for (uint32_t s = 0; s < NSLOT; s++)
		nw += !wave_start(s, false);
	TAP(nw == NSLOT, "%u wavefront threads serving %u slots", nw, NSLOT);
	if (g_in_vram && nw == NSLOT) {
		t_single();
		t_multi();
		t_wrap();
		t_stop_traffic();
		t_stuck();
		t_not_resident();
	}
	err = upcie_nvme_cqmirror_hip_ctl_retire(&g_ctl);
	for (uint32_t s = 0; s < NSLOT; s++)
		if (g_wave[s].started)
			pthread_join(g_wave[s].t, NULL);
	TAP(!err, "retired: every slot free, every wavefront thread returned (%d)", err);
	upcie_nvme_cqmirror_hip_ctl_exited(&g_ctl);
	if (g_in_vram)
		upcie_heap_fini(&g_vheap);
	upcie_nvme_peer_close(&g_vram);
	upcie_nvme_ctrl_close(&g_c);
	INFO("nranges", "%d", g_nranges);
	printf("1..%d\n", tn_n);
	return tn_failed ? 1 : 0;
}
