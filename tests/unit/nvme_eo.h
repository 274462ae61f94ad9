/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Exactly-once checker for tests against the controller models (nvme_model.h,
 * nvme_ctrl_model.h). A test instrument.
 *
 * The test registers its data buffers as regions once, then for every operation it submits
 * lends a region to it (with the queue and CID when one command carries it) and reports the
 * operation's callback. The model reports every host memory access it makes (the DMA observer,
 * nvme_eo_dma): an access to a region that is not lent at that moment, or lent to another
 * command, is a violation: the controller touched memory the driver had already handed back.
 * At the end nvme_eo_check() asserts that every operation got exactly one callback and that no
 * violation happened. The observer runs on the model's thread: everything takes the lock.
 * Accesses outside registered regions (queues, list pages) are not judged here.
 */
#ifndef UPCIE_TEST_NVME_EO_H
#define UPCIE_TEST_NVME_EO_H

#include <upcie/base/feature.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nvme_model.h"

#define NVME_EO_NOCID (-1)

struct nvme_eo_region {
	const uint8_t *lo, *hi;
	int64_t op;  /* operation it is lent to, -1: with the host */
	int32_t qid; /* queue of the command carrying it, -1: any */
	int32_t cid; /* its CID, NVME_EO_NOCID: any (a request of several commands) */
};

struct nvme_eo_op {
	int calls;
	int err;
	int32_t region;
};

struct nvme_eo {
	pthread_mutex_t lock;
	struct nvme_eo_region *reg; /* by region number, disjoint */
	uint32_t *ord;		    /* region numbers sorted by address */
	uint32_t nreg, reg_cap;
	struct nvme_eo_op *ops;
	uint64_t nops, ops_cap;
	uint64_t late_writes, late_reads, foreign, dma_checked, lend_errors;
	char first[256]; /* the first violation, for the failure message */
};

static inline void nvme_eo_init(struct nvme_eo *eo)
{
	memset(eo, 0, sizeof(*eo));
	pthread_mutex_init(&eo->lock, NULL);
}

static inline void nvme_eo_fini(struct nvme_eo *eo)
{
	pthread_mutex_destroy(&eo->lock);
	free(eo->reg);
	free(eo->ord);
	free(eo->ops);
	memset(eo, 0, sizeof(*eo));
}

/* Register buffer [p, p + len) (disjoint from the others). Returns its region number. */
static inline int32_t nvme_eo_region(struct nvme_eo *eo, const void *p, uint64_t len)
{
	struct nvme_eo_region r;
	uint32_t i;

	pthread_mutex_lock(&eo->lock);
	if (eo->nreg == eo->reg_cap) {
		eo->reg_cap = eo->reg_cap ? eo->reg_cap * 2 : 64;
		eo->reg = (struct nvme_eo_region *)realloc(eo->reg, eo->reg_cap * sizeof(*eo->reg));
		eo->ord = (uint32_t *)realloc(eo->ord, eo->reg_cap * sizeof(*eo->ord));
		if (!eo->reg || !eo->ord)
			abort();
	}
	r.lo = (const uint8_t *)p;
	r.hi = r.lo + len;
	r.op = -1;
	r.qid = -1;
	r.cid = NVME_EO_NOCID;
	eo->reg[eo->nreg] = r;
	for (i = eo->nreg; i > 0 && eo->reg[eo->ord[i - 1]].lo > r.lo; i--)
		eo->ord[i] = eo->ord[i - 1];
	eo->ord[i] = eo->nreg;
	i = eo->nreg++;
	pthread_mutex_unlock(&eo->lock);
	return (int32_t)i;
}

/* A new operation id. */
static inline uint64_t nvme_eo_op(struct nvme_eo *eo)
{
	uint64_t id;

	pthread_mutex_lock(&eo->lock);
	if (eo->nops == eo->ops_cap) {
		eo->ops_cap = eo->ops_cap ? eo->ops_cap * 2 : 1024;
		eo->ops = (struct nvme_eo_op *)realloc(eo->ops, eo->ops_cap * sizeof(*eo->ops));
		if (!eo->ops)
			abort();
	}
	id = eo->nops++;
	memset(&eo->ops[id], 0, sizeof(eo->ops[id]));
	eo->ops[id].region = -1;
	pthread_mutex_unlock(&eo->lock);
	return id;
}

/* Lend region `reg` to operation `op`, carried by command (qid, cid) when known. Call before the
 * command can reach the controller (before the ring). */
static inline void nvme_eo_lend(struct nvme_eo *eo, uint64_t op, int32_t reg, int32_t qid,
				int32_t cid)
{
	pthread_mutex_lock(&eo->lock);
	if (reg < 0 || (uint32_t)reg >= eo->nreg || eo->reg[reg].op >= 0) {
		eo->lend_errors++;
	} else {
		eo->reg[reg].op = (int64_t)op;
		eo->reg[reg].qid = qid;
		eo->reg[reg].cid = cid;
		eo->ops[op].region = reg;
	}
	pthread_mutex_unlock(&eo->lock);
}

/* The lend did not happen after all (submission refused): take the region back, no callback
 * is expected. */
static inline void nvme_eo_unlend(struct nvme_eo *eo, uint64_t op)
{
	pthread_mutex_lock(&eo->lock);
	if (eo->ops[op].region >= 0)
		eo->reg[eo->ops[op].region].op = -1;
	eo->ops[op].region = -1;
	eo->ops[op].calls = -1; /* never submitted */
	pthread_mutex_unlock(&eo->lock);
}

/* Operation `op` called back with `err`: its region goes back to the host. */
static inline void nvme_eo_done(struct nvme_eo *eo, uint64_t op, int err)
{
	pthread_mutex_lock(&eo->lock);
	eo->ops[op].calls++;
	eo->ops[op].err = err;
	if (eo->ops[op].region >= 0 && eo->reg[eo->ops[op].region].op == (int64_t)op)
		eo->reg[eo->ops[op].region].op = -1;
	pthread_mutex_unlock(&eo->lock);
}

/* The DMA observer (struct nvme_model's dma / struct nvme_cmodel's dma, ctx = the checker). */
static inline void nvme_eo_dma(void *ctx, struct nvme_model *m, const struct nvme_model_pend *p,
			       int dir, int kind, const uint8_t *ptr, uint64_t len)
{
	struct nvme_eo *eo = (struct nvme_eo *)ctx;
	uint32_t lo = 0, hi;

	if (kind != NVME_MODEL_DMA_DATA)
		return;
	pthread_mutex_lock(&eo->lock);
	eo->dma_checked++;
	hi = eo->nreg;
	while (lo < hi) {
		uint32_t mid = (lo + hi) / 2;
		const struct nvme_eo_region *r = &eo->reg[eo->ord[mid]];

		if (ptr < r->lo)
			hi = mid;
		else if (ptr >= r->hi)
			lo = mid + 1;
		else {
			bool foreign =
			    r->op >= 0 && ((r->qid >= 0 && r->qid != m->sqid) ||
					   (r->cid != NVME_EO_NOCID && r->cid != p->cid));

			if (r->op < 0 || foreign || ptr + len > r->hi) {
				if (r->op < 0 && dir == 0)
					eo->late_writes++;
				else if (r->op < 0)
					eo->late_reads++;
				else
					eo->foreign++;
				if (!eo->first[0])
					snprintf(
					    eo->first, sizeof(eo->first),
					    "model %s %llu bytes of region %u (%s) for queue %u "
					    "CID 0x%04x (fetch %llu)",
					    dir ? "read" : "wrote", (unsigned long long)len,
					    eo->ord[mid],
					    r->op < 0 ? "already handed back"
						      : "lent to another command",
					    m->sqid, p->cid, (unsigned long long)p->serial);
			}
			break;
		}
	}
	pthread_mutex_unlock(&eo->lock);
}

/* Assert: every operation got exactly one callback; the model never touched a region that was
 * not lent to the command it worked for. */
static inline void nvme_eo_check(struct nvme_eo *eo, const char *what)
{
	uint64_t zero = 0, twice = 0, n = 0;

	pthread_mutex_lock(&eo->lock);
	for (uint64_t i = 0; i < eo->nops; i++) {
		if (eo->ops[i].calls < 0)
			continue;
		n++;
		zero += eo->ops[i].calls == 0;
		twice += eo->ops[i].calls > 1;
	}
	CHECK(zero == 0 && twice == 0 && !eo->lend_errors,
	      "%s: exactly once: %llu operations, %llu without callback, %llu with several", what,
	      (unsigned long long)n, (unsigned long long)zero, (unsigned long long)twice);
	CHECK(eo->late_writes == 0 && eo->late_reads == 0 && eo->foreign == 0,
	      "%s: no DMA into handed-back memory (%llu accesses checked; %llu late writes, %llu "
	      "late reads, %llu for another command)%s%s",
	      what, (unsigned long long)eo->dma_checked, (unsigned long long)eo->late_writes,
	      (unsigned long long)eo->late_reads, (unsigned long long)eo->foreign,
	      eo->first[0] ? ": " : "", eo->first);
	pthread_mutex_unlock(&eo->lock);
}

#endif /* UPCIE_TEST_NVME_EO_H */
