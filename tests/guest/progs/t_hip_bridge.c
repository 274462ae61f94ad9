/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest test of the HIP doorbell bridge and completion relay (gpuq/bridge_hip.h) against QEMU's
 * emulated NVMe, with CPU threads playing the GPU on the memory layout a consumer RDNA GPU gets
 * (gpuq/gqp_host_hip.h): the SQ in host memory, the controller's CQ in host memory relayed into
 * a shadow CQ, the SQ tail and CQ head written into shadow cells that one poller per queue
 * mirrors to the controller's doorbells. The "GPU" runs the HIP device layer's own code
 * (gpuq/gqp_hip.h, compiled as C): each "kernel launch" is a thread that picks the queue state
 * up where the last one left it, while the poller lives as long as the queue.
 *
 * Cases (c0, namespace 1, 512 B blocks): one I/O; 2 and 4 queues at once, a thread and a poller
 * each; 8 rounds (launches) on one queue; a depth-8 queue wrapped by batches of 6 across 6
 * launches, the stale-doorbell sequence of the field report (a batch, then a wrapping batch in a
 * new launch); every write read back and compared, every range reported for t_hip_bridge's host
 * script. Doorbells: each poller's trace of MMIO writes must be exactly the tails the launches
 * published (one write per ring, never the same value twice in a row, never a stale one), the
 * poller must go idle without writing, and a poller restarted with the controller's values
 * writes nothing, while one that forgot them (the field report's per-launch poller, here
 * against a fake doorbell) re-emits the stale tail.
 *
 * Usage: t_hip_bridge PATH   (uio, type1 or iommufd; TB_C0_BDF and TB_NONCE from the test bed)
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

#include <upcie/gpuq/bridge_hip.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/dev.h>
#include <upcie/gpuq/gqp_hip.h>
#include <upcie/nvme/ns.h>

#include "t_nvme_util.h"

#define TRACE_CAP 1024
#define MAXCMD	  64
#define BLK	  512u
#define CMD_BYTES 4096u /* one command: 8 blocks, one page, PRP1 only */
#define WAIT_NS	  (2 * UPCIE_NSEC_PER_SEC)
#define NS_ID	  1

static struct upcie_nvme_ctrl g_c;
static struct upcie_nvme_ns g_ns;
static enum upcie_nvme_path g_path;
static uint64_t g_slba = 1024; /* next unused block of c0n1 */
static int g_nwrites;	       /* ranges reported for the host script */

/* Blocks for n commands, never reused within a run (the host script checks every range). */
static uint64_t take(unsigned n)
{
	uint64_t s = g_slba;

	g_slba += (uint64_t)n * (CMD_BYTES / BLK);
	return s;
}

/* One bridged queue: what the host sets up, and the state the "GPU" keeps between launches. */
struct hq {
	struct upcie_nvme_ioq ioq; /* memory, identifier, the controller's queues */
	struct upcie_nvme_bridge_cells *cells;
	struct upcie_nvme_cqe *shadow;
	struct upcie_nvme_gqp_hip g; /* "device memory" */
	struct upcie_nvme_bridge br;
	struct upcie_nvme_bridge_write trace[TRACE_CAP];
	struct upcie_nvme_bridge_stats st;
	struct upcie_heap_buf wb, rb; /* data: write and read-back buffers, MAXCMD pages each */
	uint32_t depth;
	/* what the launches published, for the trace check */
	uint32_t rings[TRACE_CAP];
	uint32_t nrings;
};

static int hq_open(struct hq *h, uint32_t depth)
{
	struct upcie_nvme_ioq_opts o;
	struct upcie_nvme_qpair_cfg qc;
	struct upcie_nvme_bridge_cfg bc;
	int err;

	memset(h, 0, sizeof(*h));
	h->depth = depth;
	memset(&o, 0, sizeof(o));
	o.depth = depth;
	o.max_xfer = CMD_BYTES;
	err = upcie_nvme_ioq_create(&h->ioq, &g_c, &o);
	if (err)
		return err;
	err = upcie_heap_alloc(&g_c.heap, (uint64_t)MAXCMD * CMD_BYTES, 4096, &h->wb);
	if (!err)
		err = upcie_heap_alloc(&g_c.heap, (uint64_t)MAXCMD * CMD_BYTES, 4096, &h->rb);
	if (err)
		return err;
	/* GPU-coherent host memory in the real thing (gpuq/gqp_host_hip.h) */
	h->cells = (struct upcie_nvme_bridge_cells *)aligned_alloc(64, sizeof(*h->cells));
	h->shadow = (struct upcie_nvme_cqe *)aligned_alloc(4096, (size_t)depth * 16);
	if (!h->cells || !h->shadow)
		return -ENOMEM;
	/* The GPU's queue pair: the controller's SQ, the shadow CQ, the shadow cells. */
	memset(&qc, 0, sizeof(qc));
	qc.sq = h->ioq.sqb.vaddr;
	qc.cq = h->shadow;
	qc.sqdb = &h->cells->sq_tail;
	qc.cqdb = &h->cells->cq_head;
	qc.sq_depth = depth;
	qc.qid = h->ioq.qid;
	err = upcie_nvme_qpair_init(&h->g.qp, &qc);
	if (err)
		return err;
	h->g.wall_khz = UPCIE_NVME_GQP_HIP_HOST_KHZ;
	h->g.flags = UPCIE_NVME_GQP_HIP_BRIDGED | UPCIE_NVME_GQP_HIP_RELAYED;
	memset(&bc, 0, sizeof(bc));
	bc.qid = h->ioq.qid;
	bc.depth = depth;
	bc.sqdb = (volatile uint32_t *)(g_c.regs + upcie_nvme_sq_tdbl_off(h->ioq.qid, g_c.dstrd));
	bc.cqdb = (volatile uint32_t *)(g_c.regs + upcie_nvme_cq_hdbl_off(h->ioq.qid, g_c.dstrd));
	bc.sq_cell = &h->cells->sq_tail;
	bc.cq_cell = &h->cells->cq_head;
	bc.cq = (const struct upcie_nvme_cqe *)h->ioq.cqb.vaddr;
	bc.cq_shadow = h->shadow;
	bc.trace = h->trace;
	bc.trace_cap = TRACE_CAP;
	return upcie_nvme_bridge_start(&h->br, &bc);
}

static void hq_close(struct hq *h)
{
	if (h->br.live)
		upcie_nvme_bridge_stop(&h->br, &h->st);
	if (h->ioq.live) {
		if (upcie_nvme_bridge_handback(&h->br, &h->ioq.qp))
			DIAG("queue %u: handback refused", h->ioq.qid);
		upcie_nvme_ioq_delete(&h->ioq);
	}
	upcie_nvme_qpair_fini(&h->g.qp);
	if (h->wb.size)
		upcie_heap_free(&g_c.heap, h->wb.off);
	if (h->rb.size)
		upcie_heap_free(&g_c.heap, h->rb.off);
	free(h->cells);
	free(h->shadow);
	h->cells = NULL;
	h->shadow = NULL;
}

/* One "kernel launch": a batch of n commands on slots [first, first + n) of the buffers. */
struct launch {
	struct hq *h;
	bool write;
	uint64_t slba; /* of the first command; each command covers 8 blocks */
	unsigned first, n;
	int err;
	unsigned ok;
};

static void *launch_main(void *arg)
{
	struct launch *l = (struct launch *)arg;
	struct hq *h = l->h;
	struct upcie_nvme_gqp_hip_cpl cpl[MAXCMD];
	uint16_t cid[MAXCMD];
	const struct upcie_heap_buf *b = l->write ? &h->wb : &h->rb;

	l->err = 0;
	l->ok = 0;
	for (unsigned i = 0; i < l->n; i++) {
		struct upcie_nvme_sqe sqe;
		uint64_t slba = l->slba + (uint64_t)i * (CMD_BYTES / BLK);
		int err = l->write ? upcie_nvme_cmd_write(&sqe, NS_ID, slba, CMD_BYTES / BLK, 0)
				   : upcie_nvme_cmd_read(&sqe, NS_ID, slba, CMD_BYTES / BLK, 0);

		sqe.prp1 = b->iova + (uint64_t)(l->first + i) * CMD_BYTES;
		if (!err)
			err = upcie_nvme_gqp_hip_enqueue(&h->g, &sqe, &cpl[i], &cid[i]);
		if (err) {
			l->err = err;
			l->n = i;
			break;
		}
	}
	upcie_nvme_gqp_hip_ring(&h->g);
	/* What this launch published: the tail the poller should write, once. */
	if (h->nrings < TRACE_CAP && l->n)
		h->rings[h->nrings++] = h->g.qp.sq_tail;
	for (unsigned i = 0; i < l->n; i++) {
		int err = upcie_nvme_gqp_hip_wait(&h->g, cid[i], &cpl[i], WAIT_NS);

		if (!err && upcie_nvme_cqe_ok(&cpl[i].cqe))
			l->ok++;
		else if (!l->err)
			l->err = err ? err : -EIO;
	}
	return NULL;
}

/* Run launches one after another, each in a fresh thread (state carried in h->g only). */
static int run_launch(struct launch *l)
{
	pthread_t t;

	if (pthread_create(&t, NULL, launch_main, l))
		return -EAGAIN;
	pthread_join(t, NULL);
	return l->err;
}

/* Fill write buffer pages [first, +n) with tag's pattern at the image offset of slba. */
static void fill(struct hq *h, const char *tag, uint64_t slba, unsigned first, unsigned n)
{
	tn_pat((char *)h->wb.vaddr + (uint64_t)first * CMD_BYTES, (uint64_t)n * CMD_BYTES, tag,
	       slba * BLK);
	memset((char *)h->rb.vaddr + (uint64_t)first * CMD_BYTES, 0, (uint64_t)n * CMD_BYTES);
}

static bool verify(struct hq *h, const char *tag, uint64_t slba, unsigned first, unsigned n)
{
	int64_t d = tn_pat_diff((char *)h->rb.vaddr + (uint64_t)first * CMD_BYTES,
				(uint64_t)n * CMD_BYTES, tag, slba * BLK);

	if (d >= 0)
		DIAG("read-back differs at byte %lld of [%llu, +%u)", (long long)d,
		     (unsigned long long)(slba * BLK), n * CMD_BYTES);
	else
		INFO("w_c0n1", "%llu+%u+%s", (unsigned long long)(slba * BLK), n * CMD_BYTES, tag);
	if (d < 0)
		__atomic_add_fetch(&g_nwrites, 1, __ATOMIC_RELAXED);
	return d < 0;
}

/* Write then read back n commands' worth at slba as two launches; data verified. */
static bool write_read(struct hq *h, const char *tag, uint64_t slba, unsigned first, unsigned n)
{
	struct launch w = { h, true, slba, first, n, 0, 0 };
	struct launch r = { h, false, slba, first, n, 0, 0 };

	fill(h, tag, slba, first, n);
	if (run_launch(&w) || w.ok != n) {
		DIAG("write launch: %d, %u of %u ok", w.err, w.ok, n);
		return false;
	}
	if (run_launch(&r) || r.ok != n) {
		DIAG("read launch: %d, %u of %u ok", r.err, r.ok, n);
		return false;
	}
	return verify(h, tag, slba, first, n);
}

/*
 * The poller's trace against what the launches published: SQ writes exactly the rung tails in
 * order (one per ring, nothing stale), no doorbell written twice in a row with one value, the
 * last CQ head the GPU's.
 */
static void check_trace(struct hq *h, const char *what)
{
	uint32_t nsq = 0, prev_sq = 0, prev_cq = 0, ndup = 0, nmis = 0;
	struct upcie_nvme_bridge_stats st;

	/* The GPU's last head write reaches the poller asynchronously: give it up to a second. */
	for (int i = 0; i < 1000; i++) {
		upcie_nvme_bridge_stats_get(&h->br, &st);
		if (st.cq_last == h->g.qp.cq_head)
			break;
		upcie_sleep_ns(UPCIE_NSEC_PER_MSEC);
	}
	for (uint64_t i = 0; i < st.ntrace && i < TRACE_CAP; i++) {
		const struct upcie_nvme_bridge_write *w = &h->trace[i];

		if (w->cq) {
			ndup += w->value == prev_cq;
			prev_cq = w->value;
			continue;
		}
		ndup += w->value == prev_sq;
		prev_sq = w->value;
		if (nsq >= h->nrings || h->rings[nsq] != w->value)
			nmis++;
		nsq++;
	}
	TAP(st.ntrace <= TRACE_CAP && st.ntrace == st.sq_writes + st.cq_writes,
	    "%s: every doorbell write traced (%llu: %llu SQ, %llu CQ)", what,
	    (unsigned long long)st.ntrace, (unsigned long long)st.sq_writes,
	    (unsigned long long)st.cq_writes);
	TAP(nsq == h->nrings && !nmis,
	    "%s: SQ doorbell written exactly once per ring with the tail rung (%u rings, %u "
	    "writes, %u out of place)",
	    what, h->nrings, nsq, nmis);
	TAP(!ndup, "%s: no doorbell written twice in a row with the same value (%u)", what, ndup);
	TAP(st.cq_last == h->g.qp.cq_head && st.relay_head == h->g.qp.cq_head,
	    "%s: CQ head doorbell %u = GPU head %u = relay position %u", what, st.cq_last,
	    h->g.qp.cq_head, st.relay_head);
	TAP(st.sq_bad == 0 && st.cq_bad == 0, "%s: no out-of-range shadow value", what);
	DIAG("%s: %llu poll rounds, %llu sleeps, %llu relayed", what, (unsigned long long)st.rounds,
	     (unsigned long long)st.sleeps, (unsigned long long)st.relayed);
}

static void t_single(void)
{
	struct hq *h = (struct hq *)calloc(1, sizeof(*h));
	char tag[9];
	int err = h ? hq_open(h, 64) : -ENOMEM;

	TAP(!err, "single: bridged queue of depth 64 set up (%d)", err);
	if (!err) {
		struct upcie_nvme_sqe sqe;
		struct upcie_nvme_cqe cqe;
		uint64_t slba;

		tn_tag(tag, "hsgl");
		/* one 512-byte block, submitted and waited for by upcie_nvme_gqp_hip_io() */
		slba = take(1);
		tn_pat(h->wb.vaddr, BLK, tag, slba * BLK);
		memset(h->rb.vaddr, 0, BLK);
		upcie_nvme_cmd_write(&sqe, NS_ID, slba, 1, 0);
		sqe.prp1 = h->wb.iova;
		err = upcie_nvme_gqp_hip_io(&h->g, &sqe, WAIT_NS, &cqe);
		h->rings[h->nrings++] = h->g.qp.sq_tail;
		TAP(!err, "single: one-block write through the bridge (%d, status 0x%x)", err,
		    upcie_nvme_cqe_code(&cqe));
		upcie_nvme_cmd_read(&sqe, NS_ID, slba, 1, 0);
		sqe.prp1 = h->rb.iova;
		err = upcie_nvme_gqp_hip_io(&h->g, &sqe, WAIT_NS, &cqe);
		h->rings[h->nrings++] = h->g.qp.sq_tail;
		TAP(!err && tn_pat_diff(h->rb.vaddr, BLK, tag, slba * BLK) < 0,
		    "single: read back through the relay, data verified (%d)", err);
		if (!err) {
			INFO("w_c0n1", "%llu+%u+%s", (unsigned long long)(slba * BLK), BLK, tag);
			g_nwrites++;
		}
		check_trace(h, "single");
	}
	if (h)
		hq_close(h);
	free(h);
}

struct mq_arg {
	struct hq *h;
	char tag[9];
	uint64_t slba;
	bool ok;
};

static void *mq_main(void *arg)
{
	struct mq_arg *a = (struct mq_arg *)arg;

	a->ok = write_read(a->h, a->tag, a->slba, 0, 16);
	return NULL;
}

static void t_multi(unsigned nq)
{
	struct hq *h = (struct hq *)calloc(nq, sizeof(*h));
	struct mq_arg a[4];
	pthread_t t[4];
	unsigned nok = 0, nopen = 0;
	char what[32];

	for (unsigned i = 0; h && i < nq; i++)
		nopen += hq_open(&h[i], 32) == 0;
	TAP(h && nopen == nq, "multi-queue %u: %u bridged queues of depth 32, a poller each", nq,
	    nopen);
	if (h && nopen == nq) {
		/* every queue driven by its own "GPU" thread at the same time */
		for (unsigned i = 0; i < nq; i++) {
			char name[8];

			snprintf(name, sizeof(name), "hm%u%u", nq, i);
			a[i].h = &h[i];
			tn_tag(a[i].tag, name);
			a[i].slba = take(16);
			a[i].ok = false;
			pthread_create(&t[i], NULL, mq_main, &a[i]);
		}
		for (unsigned i = 0; i < nq; i++) {
			pthread_join(t[i], NULL);
			nok += a[i].ok;
		}
		TAP(nok == nq,
		    "multi-queue %u: 16 writes + 16 reads per queue, data verified on %u", nq, nok);
		for (unsigned i = 0; i < nq; i++) {
			snprintf(what, sizeof(what), "multi-queue %u, queue %u", nq, h[i].ioq.qid);
			check_trace(&h[i], what);
		}
	}
	for (unsigned i = 0; h && i < nq; i++)
		hq_close(&h[i]);
	free(h);
}

static void t_rounds(void)
{
	struct hq *h = (struct hq *)calloc(1, sizeof(*h));
	unsigned nok = 0;
	int err = h ? hq_open(h, 32) : -ENOMEM;

	TAP(!err, "rounds: bridged queue of depth 32 (%d)", err);
	if (!err) {
		for (unsigned r = 0; r < 8; r++) {
			char tag[9], name[8];

			snprintf(name, sizeof(name), "hr%u", r);
			tn_tag(tag, name);
			nok += write_read(h, tag, take(8), 0, 8);
		}
		TAP(nok == 8,
		    "rounds: 8 rounds of 8 writes + 8 reads on one queue, 16 launches, "
		    "data verified in %u",
		    nok);
		check_trace(h, "rounds");
	}
	if (h)
		hq_close(h);
	free(h);
}

/* Depth 8, batches of 6 alternating write/read launches: tails 6 4 2 0 6 4 (wrapping). */
static void t_wrap(void)
{
	struct hq *h = (struct hq *)calloc(1, sizeof(*h));
	static const uint32_t want[6] = { 6, 4, 2, 0, 6, 4 };
	unsigned nok = 0;
	bool seq = true;
	int err = h ? hq_open(h, 8) : -ENOMEM;

	TAP(!err, "wrap: bridged queue of depth 8 (%d)", err);
	if (!err) {
		for (unsigned k = 0; k < 3; k++) {
			char tag[9], name[8];

			snprintf(name, sizeof(name), "hw%u", k);
			tn_tag(tag, name);
			/* a batch of 6, then a batch of 6 that wraps the ring, in a new launch */
			nok += write_read(h, tag, take(6), 0, 6);
		}
		for (unsigned i = 0; i < 6; i++)
			seq = seq && i < h->nrings && h->rings[i] == want[i];
		TAP(nok == 3 && h->nrings == 6 && seq,
		    "wrap: 6 launches of 6 commands on 8 slots (tails 6 4 2 0 6 4), all completed, "
		    "data verified in %u of 3",
		    nok);
		check_trace(h, "wrap");
	}
	if (h)
		hq_close(h);
	free(h);
}

/* The poller stays quiet when nothing changes, and a restart must know the controller's values. */
static void t_quiet(void)
{
	struct hq *h = (struct hq *)calloc(1, sizeof(*h));
	struct upcie_nvme_bridge_stats a, b;
	int err = h ? hq_open(h, 16) : -ENOMEM;

	TAP(!err, "quiet: bridged queue of depth 16 (%d)", err);
	if (!err) {
		char tag[9];

		tn_tag(tag, "hq00");
		TAP(write_read(h, tag, take(4), 0, 4), "quiet: 4 writes + 4 reads verified");
		/*
		 * The GPU side is done once it has its completions, but the poller may still owe the
		 * controller the last CQ head: let it settle (no write for 20 ms, at most 1 s) before
		 * the quiet window starts.
		 */
		upcie_nvme_bridge_stats_get(&h->br, &a);
		for (int i = 0; i < 50; i++) {
			upcie_sleep_ns(20 * UPCIE_NSEC_PER_MSEC);
			upcie_nvme_bridge_stats_get(&h->br, &b);
			if (b.sq_writes == a.sq_writes && b.cq_writes == a.cq_writes)
				break;
			a = b;
		}
		upcie_nvme_bridge_stats_get(&h->br, &a);
		upcie_sleep_ns(200 * UPCIE_NSEC_PER_MSEC);
		upcie_nvme_bridge_stats_get(&h->br, &b);
		TAP(b.sq_writes == a.sq_writes && b.cq_writes == a.cq_writes && b.rounds > a.rounds,
		    "quiet: 200 ms without a change: %llu more poll rounds, 0 doorbell writes "
		    "(%llu)",
		    (unsigned long long)(b.rounds - a.rounds),
		    (unsigned long long)(b.sq_writes + b.cq_writes - a.sq_writes - a.cq_writes));
		TAP(b.sleeps > a.sleeps, "quiet: the idle poller sleeps (%llu sleeps)",
		    (unsigned long long)(b.sleeps - a.sleeps));
		upcie_nvme_bridge_stop(&h->br, &h->st);
		{
			/* The lifetime poller's successor, restarted with what the controller holds: the
			 * cells still say the same, so nothing is written. */
			struct upcie_nvme_bridge nb;
			struct upcie_nvme_bridge_cfg bc = h->br.cfg;
			struct upcie_nvme_bridge_stats s;
			uint32_t fake = 0xffffffffu;

			bc.flags = UPCIE_NVME_BRIDGE_MANUAL;
			bc.sq_db0 = h->st.sq_last;
			bc.cq_db0 = h->st.cq_last;
			bc.cq = NULL; /* relay position is the old bridge's */
			bc.trace = NULL;
			bc.trace_cap = 0;
			err = upcie_nvme_bridge_start(&nb, &bc);
			for (int i = 0; !err && i < 100; i++)
				upcie_nvme_bridge_poll(&nb);
			upcie_nvme_bridge_stop(&nb, &s);
			TAP(!err && s.sq_writes == 0 && s.cq_writes == 0,
			    "quiet: a poller restarted with the controller's doorbell values "
			    "writes "
			    "nothing in 100 rounds (%llu)",
			    (unsigned long long)(s.sq_writes + s.cq_writes));
			/* The field report's per-launch poller, which forgets what it wrote (0), while
			 * the GPU's cell still holds the last launch's tail: it re-emits that stale
			 * tail. Against a fake doorbell, never the controller. */
			bc.sqdb = &fake;
			bc.cqdb = &fake;
			bc.sq_db0 = 0;
			bc.cq_db0 = 0;
			err = upcie_nvme_bridge_start(&nb, &bc);
			h->cells->sq_tail = h->st.sq_last; /* what the GPU left there */
			for (int i = 0; !err && i < 100; i++)
				upcie_nvme_bridge_poll(&nb);
			upcie_nvme_bridge_stop(&nb, &s);
			TAP(!err && h->st.sq_last != 0 && s.sq_writes == 1 && fake == h->st.sq_last,
			    "quiet: control: a poller that forgot what it wrote re-emits the stale "
			    "tail "
			    "%u (%llu writes) -- the hazard a lifetime poller avoids",
			    h->st.sq_last, (unsigned long long)s.sq_writes);
			h->cells->sq_tail = h->st.sq_last;
			h->cells->cq_head = h->st.cq_last;
		}
	}
	if (h)
		hq_close(h);
	free(h);
}

int main(int argc, char **argv)
{
	struct upcie_nvme_ctrl_opts o;
	struct upcie_pci_bdf bdf;
	int err;

	setvbuf(stdout, NULL, _IOLBF, 0);
	upcie_log_set_handler(tn_log, NULL);
	if (argc != 2 || upcie_nvme_path_parse(argv[1], &g_path) ||
	    g_path == UPCIE_NVME_PATH_AUTO || tn_bdf_env("TB_C0_BDF", &bdf)) {
		fprintf(stderr, "usage: t_hip_bridge uio|type1|iommufd (TB_C0_BDF set)\n");
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
	if (!err) {
		t_single();
		t_multi(2);
		t_multi(4);
		t_rounds();
		t_wrap();
		t_quiet();
	}
	upcie_nvme_ctrl_close(&g_c);
	INFO("nwrites", "%d", g_nwrites);
	printf("1..%d\n", tn_n);
	return tn_failed ? 1 : 0;
}
