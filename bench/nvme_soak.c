/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Soak of the NVMe driver (nvme/ctrl.h, nvme/ns.h, nvme/qpair.h) against the controller model
 * (tests/unit/nvme_ctrl_model.h) misbehaving at random: a random mix of reads, writes and
 * flushes on two I/O queues, with commands held by the controller and completed late, Aborts
 * that the controller performs or not, Aborts that fail, an SQ head reported late, fatal
 * controller status, and controller resets, some of them with commands resubmitted from
 * completion callbacks. Every operation is checked by the exactly-once checker
 * (tests/unit/nvme_eo.h): exactly one callback each, and no DMA into a buffer after its callback
 * ran; data read back is compared with what was last written. Prints the figures and TAP lines.
 *
 *   nvme_soak [--seconds S] [--ops N] [--seed X]
 *     runs until S seconds (default 60) or N operations submitted (whichever comes first; 0:
 *     no limit), then ends everything outstanding and checks.
 *
 * The model is a test instrument: this is a proof of the driver's bookkeeping under faults,
 * not of any hardware's behaviour.
 */
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nvme_ctrl_model.h"
#include "nvme_eo.h"

#define MiB	  (UINT64_C(1) << 20)
#define HOST_IOVA UINT64_C(0x40000000)
#define DATA_IOVA UINT64_C(0x80000000)
#define LBA	  512u
#define NREG	  96	       /* buffers, each with its own LBA range */
#define REG_BYTES (64 * 1024u) /* a buffer */
#define REG_LBAS  (REG_BYTES / LBA)
#define NQ	  2
#define MS	  UPCIE_NSEC_PER_MSEC

enum { OP_READ, OP_WRITE, OP_FLUSH };

struct soak;

struct op {
	struct upcie_nvme_req req;
	struct soak *s;
	uint64_t id; /* checker operation */
	int kind, reg, q;
	uint32_t len, gen;
	bool busy;
	bool resubmit; /* submit again from its callback when it was cancelled */
};

struct region {
	struct op op; /* the operation holding it, if busy */
	uint32_t gen; /* pattern last written */
	bool known;   /* the namespace holds gen (no write of unknown outcome since) */
};

struct soak {
	struct nvme_cmodel cm;
	struct nvme_model_iomap im;
	struct nvme_model_rng rng;
	struct nvme_eo eo;
	uint8_t *ns;
	void *host_va, *data_va;
	struct upcie_dmamem host, data;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ns nsp;
	struct upcie_nvme_ioq q[NQ];
	struct region reg[NREG];
	int32_t eoreg[NREG];
	/* figures */
	uint64_t submitted, done_ok, done_err, cancelled, resubmitted, mismatches;
	uint64_t reads, writes, flushes, aborts, aborts_ended, resets, reset_fail, holds, releases;
	uint64_t cfs, lags, abort_fail_on, busy_refused, timeouts;
	uint32_t genctr;
};

/* The driver's log is kept quiet; its last message is shown when a reset fails. */
static char g_lastlog[256];

static void quiet(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	snprintf(g_lastlog, sizeof(g_lastlog), "%s", msg);
}

static uint8_t pat(uint32_t gen, uint64_t off)
{
	uint64_t x = (off >> 3) * 0x9e3779b97f4a7c15ull + gen;

	return (uint8_t)((x >> 29) ^ off);
}

static uint8_t *reg_buf(struct soak *s, int r)
{
	return (uint8_t *)s->data_va + (uint64_t)r * REG_BYTES;
}

static int submit(struct soak *s, int r, int kind, int q, bool resubmit);

static void op_cb(struct upcie_nvme_req *req)
{
	struct op *o = (struct op *)req->ctx;
	struct soak *s = o->s;
	struct region *g = &s->reg[o->reg];

	nvme_eo_done(&s->eo, o->id, req->err);
	o->busy = false;
	if (req->err == 0) {
		s->done_ok++;
		if (o->kind == OP_WRITE) {
			g->gen = o->gen;
			g->known = true;
		} else if (o->kind == OP_READ && g->known) {
			const uint8_t *b = reg_buf(s, o->reg);

			for (uint32_t i = 0; i < o->len; i++)
				if (b[i] != pat(g->gen, (uint64_t)o->reg * REG_BYTES + i)) {
					s->mismatches++;
					break;
				}
		}
	} else {
		s->done_err++;
		s->cancelled += req->err == -ECANCELED;
		if (o->kind == OP_WRITE)
			g->known = false; /* it may or may not have reached the namespace */
	}
	/* a driver that retries from its callback: the new command must end exactly once too */
	if (req->err == -ECANCELED && o->resubmit && submit(s, o->reg, o->kind, o->q, false) == 0)
		s->resubmitted++;
}

/* Submit `kind` on region r through queue q. Returns the submit result. */
static int submit(struct soak *s, int r, int kind, int q, bool resubmit)
{
	struct region *g = &s->reg[r];
	struct op *o = &g->op;
	uint64_t off = (uint64_t)r * REG_BYTES, slba = (uint64_t)r * REG_LBAS;
	uint32_t blocks = 1 + (uint32_t)nvme_model_rng_range(&s->rng, 0, REG_LBAS - 1);
	int err;

	if (o->busy)
		return -EBUSY;
	memset(o, 0, sizeof(*o));
	o->s = s;
	o->kind = kind;
	o->reg = r;
	o->q = q;
	o->len = blocks * LBA;
	o->resubmit = resubmit;
	o->req.cb = op_cb;
	o->req.ctx = o;
	o->id = nvme_eo_op(&s->eo);
	nvme_eo_lend(&s->eo, o->id, s->eoreg[r], s->q[q].qid, NVME_EO_NOCID);
	o->busy = true;
	if (kind == OP_WRITE) {
		o->gen = ++s->genctr;
		for (uint32_t i = 0; i < REG_BYTES; i++)
			reg_buf(s, r)[i] = pat(o->gen, off + i);
		o->len = REG_BYTES; /* whole region: what a read compares is all fresh */
		err = upcie_nvme_ioq_write(&s->q[q], &s->nsp, slba, &s->data, off, o->len, &o->req);
	} else if (kind == OP_READ) {
		memset(reg_buf(s, r), 0, o->len);
		err = upcie_nvme_ioq_read(&s->q[q], &s->nsp, slba, &s->data, off, o->len, &o->req);
	} else {
		err = upcie_nvme_ioq_flush(&s->q[q], &s->nsp, &o->req);
	}
	if (err) {
		o->busy = false;
		nvme_eo_unlend(&s->eo, o->id);
		if (err == -EBUSY)
			s->busy_refused++;
		return err;
	}
	s->submitted++;
	s->reads += kind == OP_READ;
	s->writes += kind == OP_WRITE;
	s->flushes += kind == OP_FLUSH;
	return 0;
}

static int setup(struct soak *s, uint64_t seed)
{
	struct upcie_nvme_ctrl_opts o;
	struct upcie_nvme_ioq_opts qo;
	uint64_t blocks = (uint64_t)NREG * REG_LBAS;
	int err;

	memset(s, 0, sizeof(*s));
	s->rng.s = seed ? seed : 1;
	s->ns = (uint8_t *)calloc(blocks, LBA);
	s->host_va = aligned_alloc(2 * MiB, 16 * MiB);
	s->data_va = aligned_alloc(2 * MiB, (size_t)NREG * REG_BYTES);
	if (!s->ns || !s->host_va || !s->data_va)
		return -ENOMEM;
	memset(s->host_va, 0, 16 * MiB);
	memset(s->data_va, 0, (size_t)NREG * REG_BYTES);
	upcie_dmamem_init_arith(&s->host, s->host_va, 16 * MiB, HOST_IOVA);
	nvme_model_mem_lut(&s->data, s->data_va, (size_t)NREG * REG_BYTES, 12, DATA_IOVA, true,
			   &s->rng);
	nvme_model_iomap_add(&s->im, &s->host);
	nvme_model_iomap_add(&s->im, &s->data);
	nvme_cmodel_init(&s->cm, &s->im, s->ns, blocks, LBA);
	nvme_eo_init(&s->eo);
	for (int i = 0; i < NREG; i++) {
		s->eoreg[i] = nvme_eo_region(&s->eo, reg_buf(s, i), REG_BYTES);
		s->reg[i].known = false; /* nothing written yet: reads compare nothing */
	}
	s->cm.dma = nvme_eo_dma;
	s->cm.dma_ctx = &s->eo;
	if (nvme_cmodel_start(&s->cm))
		return -EAGAIN;
	memset(&o, 0, sizeof(o));
	o.admin_timeout_ns = 200 * MS;
	o.abort_timeout_ns = 50 * MS;
	err = upcie_nvme_ctrl_init(&s->c, s->cm.regs, NVME_CMODEL_REGS, &s->host, &o);
	if (!err)
		err = upcie_nvme_ns_open(&s->nsp, &s->c, 1);
	memset(&qo, 0, sizeof(qo));
	qo.depth = 32;
	qo.max_xfer = 16 * 1024; /* requests of up to 4 commands */
	for (int i = 0; i < NQ && !err; i++)
		err = upcie_nvme_ioq_create(&s->q[i], &s->c, &qo);
	return err;
}

static uint64_t outstanding(struct soak *s)
{
	uint64_t n = 0;

	for (int i = 0; i < NREG; i++)
		n += s->reg[i].op.busy;
	return n;
}

/* A random outstanding command of queue q (a request's first one), or -1. */
static int random_cid(struct soak *s, int q)
{
	uint16_t cids[64];
	int n = upcie_nvme_qpair_outstanding(&s->q[q].qp, cids, 64);

	if (n <= 0)
		return -1;
	if (n > 64)
		n = 64;
	return cids[nvme_model_rng_range(&s->rng, 0, (uint64_t)n - 1)];
}

/* Reset the controller as an application would after a failure; count it. */
static void reset(struct soak *s)
{
	int err;

	s->resets++;
	__atomic_store_n(&s->cm.cfs_after_io, 0, __ATOMIC_RELEASE);
	err = upcie_nvme_ctrl_reset(&s->c);
	if (err && ++s->reset_fail <= 5)
		printf("# reset %llu failed (%d), the driver's last message: %s\n",
		       (unsigned long long)s->resets, err, g_lastlog);
}

static void step(struct soak *s)
{
	uint64_t r = nvme_model_rng_range(&s->rng, 0, 9999);
	int q = (int)nvme_model_rng_range(&s->rng, 0, NQ - 1);
	int reg = (int)nvme_model_rng_range(&s->rng, 0, NREG - 1);
	int cid;

	if (s->c.state != UPCIE_NVME_CTRL_READY) {
		reset(s); /* fatal status, an escalation, a failed reset */
		return;
	}
	if (r < 7000) {
		uint64_t k = nvme_model_rng_range(&s->rng, 0, 99);

		submit(s, reg,
		       k < 55	? OP_READ
		       : k < 95 ? OP_WRITE
				: OP_FLUSH,
		       q, nvme_model_rng_range(&s->rng, 0, 3) == 0);
	} else if (r < 7050) {
		/* the controller starts holding reads (late completions) */
		s->holds++;
		__atomic_store_n(&s->cm.hold_opc, UPCIE_NVME_NVM_READ, __ATOMIC_RELEASE);
	} else if (r < 7250) {
		s->releases++;
		__atomic_store_n(&s->cm.hold_opc, 0, __ATOMIC_RELEASE);
		nvme_cmodel_release(&s->cm);
	} else if (r < 7300) {
		cid = random_cid(s, q);
		if (cid >= 0) {
			s->aborts++;
			s->aborts_ended += upcie_nvme_ioq_abort(&s->q[q], (uint16_t)cid, NULL) == 0;
		}
	} else if (r < 7320) {
		__atomic_store_n(&s->cm.abort_aborts, !s->cm.abort_aborts, __ATOMIC_RELEASE);
	} else if (r < 7330) {
		s->abort_fail_on++;
		__atomic_store_n(&s->cm.abort_status,
				 s->cm.abort_status ? 0 : (uint16_t)UPCIE_NVME_SC_ABORT_LIMIT,
				 __ATOMIC_RELEASE);
	} else if (r < 7340) {
		s->lags++;
		__atomic_store_n(&s->cm.q[1].m.sqhd_lag,
				 (uint32_t)nvme_model_rng_range(&s->rng, 0, 4), __ATOMIC_RELEASE);
	} else if (r < 7345) {
		s->cfs++;
		__atomic_store_n(&s->cm.cfs_after_io,
				 __atomic_load_n(&s->cm.io_fetched, __ATOMIC_ACQUIRE) + 1 +
				     nvme_model_rng_range(&s->rng, 0, 20),
				 __ATOMIC_RELEASE);
	} else if (r < 7360) {
		reset(s);
	} else if (r < 7400) {
		/* a synchronous wait on one request, with a short timeout */
		struct op *o = &s->reg[reg].op;

		if (o->busy) {
			int err = upcie_nvme_ioq_wait(&s->q[o->q], &o->req, 2 * MS);

			s->timeouts += err == -ETIMEDOUT;
		}
	}
	for (int i = 0; i < NQ; i++)
		upcie_nvme_ioq_poll(&s->q[i], 64);
}

/* End everything: the controller completes what it holds, then a reset ends the rest. */
static void finish(struct soak *s)
{
	struct upcie_deadline dl;

	__atomic_store_n(&s->cm.hold_opc, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&s->cm.cfs_after_io, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&s->cm.abort_status, 0, __ATOMIC_RELEASE);
	nvme_cmodel_release(&s->cm);
	upcie_deadline_set(&dl, 2 * UPCIE_NSEC_PER_SEC);
	while (outstanding(s) && !upcie_deadline_passed(&dl))
		for (int i = 0; i < NQ; i++)
			upcie_nvme_ioq_poll(&s->q[i], 64);
	if (outstanding(s) || s->c.state != UPCIE_NVME_CTRL_READY)
		reset(s);
	for (int i = 0; i < NQ; i++)
		upcie_nvme_ioq_delete(&s->q[i]);
	upcie_nvme_ctrl_close(&s->c);
	nvme_cmodel_stop(&s->cm);
}

int main(int argc, char **argv)
{
	static struct soak s;
	uint64_t seconds = 60, ops = 0, seed = 0x50a4, t0, ns;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
			seconds = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--ops") && i + 1 < argc)
			ops = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
			seed = strtoull(argv[++i], NULL, 0);
		else {
			fprintf(stderr, "usage: %s [--seconds S] [--ops N] [--seed X]\n", argv[0]);
			return 2;
		}
	}
	upcie_log_set_handler(quiet, NULL);
	if (setup(&s, seed)) {
		printf("not ok 1 - soak: set-up failed\n1..1\n");
		return 1;
	}
	t0 = upcie_time_ns();
	while ((!ops || s.submitted < ops) &&
	       (!seconds || upcie_time_ns() - t0 < seconds * UPCIE_NSEC_PER_SEC))
		step(&s);
	finish(&s);
	ns = upcie_time_ns() - t0;
	printf("# seed 0x%llx, %.1f s, %llu operations (%.0f/s): %llu reads, %llu writes, %llu "
	       "flushes\n",
	       (unsigned long long)seed, (double)ns / 1e9, (unsigned long long)s.submitted,
	       (double)s.submitted * 1e9 / (double)ns, (unsigned long long)s.reads,
	       (unsigned long long)s.writes, (unsigned long long)s.flushes);
	printf("# ended: %llu ok, %llu with an error (%llu cancelled), %llu resubmitted from a "
	       "cancel callback\n",
	       (unsigned long long)s.done_ok, (unsigned long long)s.done_err,
	       (unsigned long long)s.cancelled, (unsigned long long)s.resubmitted);
	printf("# faults: %llu holds, %llu releases (late completions), %llu aborts (%llu ended by "
	       "it), %llu abort-failure toggles, %llu SQ head lags, %llu fatal statuses, %llu "
	       "resets (%llu failed), %llu waits timed out, %llu refused -EBUSY\n",
	       (unsigned long long)s.holds, (unsigned long long)s.releases,
	       (unsigned long long)s.aborts, (unsigned long long)s.aborts_ended,
	       (unsigned long long)s.abort_fail_on, (unsigned long long)s.lags,
	       (unsigned long long)s.cfs, (unsigned long long)s.resets,
	       (unsigned long long)s.reset_fail, (unsigned long long)s.timeouts,
	       (unsigned long long)s.busy_refused);
	printf("# model: %u enables, %u Aborts executed; DMA: %llu accesses checked\n",
	       s.cm.n_enable, s.cm.n_abort, (unsigned long long)s.eo.dma_checked);
	CHECK(s.submitted > 0 && s.resets > 0 && s.cancelled > 0 && s.done_ok > 0,
	      "soak: the faults happened (%llu resets, %llu cancelled)",
	      (unsigned long long)s.resets, (unsigned long long)s.cancelled);
	nvme_eo_check(&s.eo, "soak");
	CHECK_EQ(s.mismatches, 0, "soak: every read of known data returned what was written");
	nvme_cmodel_fini(&s.cm);
	nvme_eo_fini(&s.eo);
	upcie_dmamem_destroy(&s.data);
	upcie_dmamem_destroy(&s.host);
	nvme_model_iomap_fini(&s.im);
	free(s.ns);
	free(s.host_va);
	free(s.data_va);
	return check_done();
}
