/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * An in-process NVMe controller model for unit tests. A test instrument, never evidence of
 * hardware behaviour.
 *
 * One I/O queue pair and one namespace held in memory. The model fetches commands when the SQ
 * tail "doorbell" (a plain uint32_t the queue pair writes) moves, executes Read, Write, Compare,
 * Write Zeroes, Flush and Dataset Management by walking PRPs or SGLs the way a controller does
 * (device addresses resolved through an IOVA map the test fills), and posts completions with
 * the right phase tag and SQ head, never overrunning the CQ head doorbell. A command is executed
 * when it completes, right before its completion entry is written, so a command that completes
 * late also moves its data late. Opcode NVME_MODEL_OPC_ECHO completes with dw0 = CDW2,
 * dw1 = CDW3 (a tag for protocol tests).
 *
 * Fault knobs: out-of-order posting, error status (with DNR), dropped completions, delays in
 * steps or in time, commands held until released (late completion) or aborted, a fetch limit or
 * stall (SQ-full pressure), an SQ head reported late (sqhd_lag), an inject callback deciding per
 * command, and raw completions for arbitrary CIDs and SQ heads (a hostile device). Every access
 * of host memory is reported to a DMA observer (the exactly-once checker, nvme_eo.h). Stepped
 * explicitly (nvme_model_step), or by a thread (nvme_model_start/stop) for concurrency tests.
 */
#ifndef UPCIE_TEST_NVME_MODEL_H
#define UPCIE_TEST_NVME_MODEL_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/clock.h>
#include <upcie/mem/dmamem.h>
#include <upcie/nvme/spec.h>
#include <upcie/nvme/spec_id.h>

#define NVME_MODEL_OPC_ECHO 0x80

/*
 * IOVA map: device address ranges -> CPU pointers, built from dmamems (one entry per LUT
 * granule, one for arithmetic memory). Lookups by binary search.
 */
struct nvme_model_iomap_ent {
	uint64_t iova, len;
	uint8_t *ptr;
};

struct nvme_model_iomap {
	struct nvme_model_iomap_ent *ent;
	size_t n, cap;
};

static inline int nvme_model_iomap_cmp_(const void *a, const void *b)
{
	const struct nvme_model_iomap_ent *x = (const struct nvme_model_iomap_ent *)a;
	const struct nvme_model_iomap_ent *y = (const struct nvme_model_iomap_ent *)b;

	return x->iova < y->iova ? -1 : x->iova > y->iova;
}

static inline void nvme_model_iomap_push_(struct nvme_model_iomap *im, uint64_t iova, uint64_t len,
					  uint8_t *ptr)
{
	if (im->n == im->cap) {
		im->cap = im->cap ? im->cap * 2 : 64;
		im->ent =
		    (struct nvme_model_iomap_ent *)realloc(im->ent, im->cap * sizeof(*im->ent));
		if (!im->ent)
			abort();
	}
	im->ent[im->n].iova = iova;
	im->ent[im->n].len = len;
	im->ent[im->n].ptr = ptr;
	im->n++;
}

static inline void nvme_model_iomap_sort_(struct nvme_model_iomap *im)
{
	qsort(im->ent, im->n, sizeof(*im->ent), nvme_model_iomap_cmp_);
}

/* Map `len` bytes at device address `iova` to `ptr`. */
static inline void nvme_model_iomap_add_range(struct nvme_model_iomap *im, uint64_t iova,
					      uint64_t len, uint8_t *ptr)
{
	nvme_model_iomap_push_(im, iova, len, ptr);
	nvme_model_iomap_sort_(im);
}

/* Add every byte of `mem` (which needs a CPU view, or NULL ptrs are recorded). */
static inline void nvme_model_iomap_add(struct nvme_model_iomap *im, const struct upcie_dmamem *mem)
{
	uint64_t g = upcie_dmamem_granule(mem);

	for (uint64_t o = 0; o < mem->size; o += g) {
		uint64_t len = mem->size - o < g ? mem->size - o : g;

		nvme_model_iomap_push_(im, upcie_dmamem_iova_fast(mem, o), len,
				       mem->vaddr ? (uint8_t *)mem->vaddr + o : NULL);
	}
	nvme_model_iomap_sort_(im);
}

/* CPU pointer for `iova`, bytes contiguous from there in *contig; NULL when unmapped. */
static inline uint8_t *nvme_model_iomap_find(const struct nvme_model_iomap *im, uint64_t iova,
					     uint64_t *contig)
{
	size_t lo = 0, hi = im->n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		const struct nvme_model_iomap_ent *e = &im->ent[mid];

		if (iova < e->iova)
			hi = mid;
		else if (iova - e->iova >= e->len)
			lo = mid + 1;
		else {
			*contig = e->len - (iova - e->iova);
			return e->ptr ? e->ptr + (iova - e->iova) : NULL;
		}
	}
	return NULL;
}

static inline void nvme_model_iomap_fini(struct nvme_model_iomap *im)
{
	free(im->ent);
	memset(im, 0, sizeof(*im));
}

/*
 * Device-side data pointer walkers. They call emit(ctx, iova, len) for each piece of the
 * transfer, in order, and return 0 or the NVMe status code a controller would post. List
 * pages and SGL segments are read through the iomap.
 */
typedef int (*nvme_model_emit_fn)(void *ctx, uint64_t iova, uint64_t len);

static inline int nvme_model_prp_walk(const struct nvme_model_iomap *im, uint64_t prp1,
				      uint64_t prp2, uint64_t len, unsigned page_shift,
				      nvme_model_emit_fn emit, void *ctx)
{
	uint64_t page = UINT64_C(1) << page_shift, pmask = page - 1;
	uint64_t first, rem, n, per = page / 8, idx, contig;
	const uint64_t *list;
	int err;

	if (prp1 & 3)
		return UPCIE_NVME_SC_PRP_INVALID_OFFSET;
	first = page - (prp1 & pmask);
	first = first < len ? first : len;
	err = emit(ctx, prp1, first);
	if (err)
		return err;
	rem = len - first;
	if (!rem)
		return 0;
	if (rem <= page) {
		if (prp2 & pmask)
			return UPCIE_NVME_SC_PRP_INVALID_OFFSET;
		return emit(ctx, prp2, rem);
	}
	if (prp2 & 7)
		return UPCIE_NVME_SC_PRP_INVALID_OFFSET;
	n = (rem + pmask) >> page_shift;
	idx = (prp2 & pmask) / 8;
	list = (const uint64_t *)nvme_model_iomap_find(im, prp2 & ~pmask, &contig);
	if (!list || contig < page)
		return UPCIE_NVME_SC_DATA_XFER_ERROR;
	while (n) {
		uint64_t e, take;

		if (idx == per - 1 && n > 1) {
			e = list[idx];
			if (e & pmask)
				return UPCIE_NVME_SC_PRP_INVALID_OFFSET;
			list = (const uint64_t *)nvme_model_iomap_find(im, e, &contig);
			if (!list || contig < page)
				return UPCIE_NVME_SC_DATA_XFER_ERROR;
			idx = 0;
			continue;
		}
		e = list[idx++];
		if (e & pmask)
			return UPCIE_NVME_SC_PRP_INVALID_OFFSET;
		take = rem < page ? rem : page;
		err = emit(ctx, e, take);
		if (err)
			return err;
		rem -= take;
		n--;
	}
	return 0;
}

static inline int nvme_model_sgl_walk(const struct nvme_model_iomap *im, uint64_t sgl_addr,
				      uint32_t sgl_len, uint8_t sgl_id, uint64_t len,
				      nvme_model_emit_fn emit, void *ctx)
{
	struct upcie_nvme_sgl_desc d;
	uint64_t done = 0;
	int err, guard = 0;

	d.addr = sgl_addr;
	d.len = sgl_len;
	d.id = sgl_id;
	for (;;) {
		unsigned type = d.id >> 4;
		const struct upcie_nvme_sgl_desc *seg;
		uint64_t contig, nd;

		if ((d.id & 0xf) != UPCIE_NVME_SGL_SUB_ADDRESS)
			return UPCIE_NVME_SC_SGL_INVALID_TYPE;
		if (type == UPCIE_NVME_SGL_DATA_BLOCK) {
			if (d.len > len - done)
				return UPCIE_NVME_SC_SGL_INVALID_DATA_LEN;
			err = emit(ctx, d.addr, d.len);
			if (err)
				return err;
			done += d.len;
			break;
		}
		if (type != UPCIE_NVME_SGL_SEGMENT && type != UPCIE_NVME_SGL_LAST_SEGMENT)
			return UPCIE_NVME_SC_SGL_INVALID_TYPE;
		if (!d.len || (d.len & 15) || (d.addr & 7) || ++guard > 100000)
			return UPCIE_NVME_SC_SGL_INVALID_LAST;
		nd = d.len / 16;
		seg =
		    (const struct upcie_nvme_sgl_desc *)nvme_model_iomap_find(im, d.addr, &contig);
		if (!seg || contig < d.len)
			return UPCIE_NVME_SC_DATA_XFER_ERROR;
		for (uint64_t i = 0; i + 1 < nd; i++) {
			if ((seg[i].id >> 4) != UPCIE_NVME_SGL_DATA_BLOCK ||
			    (seg[i].id & 0xf) != UPCIE_NVME_SGL_SUB_ADDRESS)
				return UPCIE_NVME_SC_SGL_INVALID_LAST;
			if (seg[i].len > len - done)
				return UPCIE_NVME_SC_SGL_INVALID_DATA_LEN;
			err = emit(ctx, seg[i].addr, seg[i].len);
			if (err)
				return err;
			done += seg[i].len;
		}
		if (type == UPCIE_NVME_SGL_LAST_SEGMENT &&
		    (seg[nd - 1].id >> 4) != UPCIE_NVME_SGL_DATA_BLOCK)
			return UPCIE_NVME_SC_SGL_INVALID_LAST;
		d = seg[nd - 1];
	}
	return done == len ? 0 : UPCIE_NVME_SC_SGL_INVALID_DATA_LEN;
}

/*
 * Test memory helpers: a small PRNG and dmamem constructors with shuffled LUTs, so builders and
 * the model see realistic, non-identity translations.
 */
struct nvme_model_rng {
	uint64_t s;
};

static inline uint64_t nvme_model_rng_next(struct nvme_model_rng *r)
{
	r->s ^= r->s << 13;
	r->s ^= r->s >> 7;
	r->s ^= r->s << 17;
	return r->s;
}

/* Uniform in [lo, hi]. */
static inline uint64_t nvme_model_rng_range(struct nvme_model_rng *r, uint64_t lo, uint64_t hi)
{
	return lo + nvme_model_rng_next(r) % (hi - lo + 1);
}

/*
 * LUT dmamem of `size` bytes with granules of 2^gshift at device addresses base + a permutation
 * of granule slots (identity when !shuffle). The dmamem owns the LUT.
 */
static inline int nvme_model_mem_lut(struct upcie_dmamem *mem, void *vaddr, size_t size,
				     unsigned gshift, uint64_t base, bool shuffle,
				     struct nvme_model_rng *r)
{
	size_t n = (size + (UINT64_C(1) << gshift) - 1) >> gshift;
	uint64_t *lut = (uint64_t *)malloc(n * sizeof(*lut));

	if (!lut)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		lut[i] = base + ((uint64_t)i << gshift);
	for (size_t i = n; shuffle && i > 1; i--) {
		size_t j = (size_t)(nvme_model_rng_next(r) % i);
		uint64_t t = lut[i - 1];

		lut[i - 1] = lut[j];
		lut[j] = t;
	}
	return upcie_dmamem_init_lut(mem, vaddr, size, gshift, lut, true);
}

/* What the model does with one command; an inject callback may change it at fetch. */
struct nvme_model_action {
	uint16_t code; /* status to post (enum upcie_nvme_code); non-zero skips execution */
	bool dnr;
	uint8_t crd;	 /* command retry delay selector posted with `code` (0..3) */
	bool drop;	 /* never post a completion, forget the command */
	bool hold;	 /* keep it (held list) until released or aborted */
	uint32_t delay;	 /* steps between fetch and completion */
	uint64_t due_ns; /* and not before this time (upcie_time_ns(); 0: no time limit) */
};

typedef void (*nvme_model_inject_fn)(void *ctx, const struct upcie_nvme_sqe *sqe,
				     struct nvme_model_action *act);

/*
 * A fetched command waiting to complete. It is executed (data moved, admin effect applied)
 * when it completes, right before its completion entry is written: so a command completed late
 * also moves its data late, as a slow controller may.
 */
struct nvme_model_pend {
	struct upcie_nvme_sqe sqe;
	uint64_t serial; /* fetch order, 1.. (0: a raw completion) */
	uint32_t dw0, dw1;
	uint16_t cid, code;
	bool dnr;
	uint8_t crd;
	bool exec;    /* execute at completion (else post `code` as it is) */
	int32_t sqhd; /* SQ head to report; -1: the model's own */
	uint64_t due, due_ns;
};

struct nvme_model;

/*
 * DMA observer: called for every access of host memory the model makes on behalf of a command,
 * before it happens: dir 0 = the device writes host memory (read data, Identify data, and the
 * completion entry itself, with kind 1), dir 1 = it reads host memory (write data, lists are not
 * reported). `p` is the command (its CID, its fetch serial).
 */
#define NVME_MODEL_DMA_DATA 0
#define NVME_MODEL_DMA_CQE  1
typedef void (*nvme_model_dma_fn)(void *ctx, struct nvme_model *m, const struct nvme_model_pend *p,
				  int dir, int kind, const uint8_t *ptr, uint64_t len);

struct nvme_model {
	/* queue (set by nvme_model_init) */
	struct upcie_nvme_sqe *sq;
	struct upcie_nvme_cqe *cq;
	uint32_t sq_depth, cq_depth;
	uint32_t sqdb, cqdb; /* the doorbell "registers" */
	uint32_t sq_head, cq_tail, phase;
	uint32_t sqhd_rep; /* SQ head last reported */
	uint16_t sqid;
	/* namespace */
	uint8_t *ns;
	uint64_t ns_blocks;
	uint32_t lba_bytes;
	unsigned page_shift;
	struct nvme_model_iomap *iomap;
	/* knobs */
	bool ooo;	    /* post ready completions in random order */
	uint32_t fetch_max; /* commands fetched per step, 0: all */
	bool fetch_stall;   /* fetch nothing */
	uint32_t delay;	    /* default delay in steps */
	uint32_t post_max;  /* completions posted per step, 0: all */
	uint32_t sqhd_lag;  /* report an SQ head up to this many entries behind the fetch point */
	nvme_model_inject_fn inject;
	void *inject_ctx;
	nvme_model_dma_fn dma;
	void *dma_ctx;
	uint64_t seed;
	/* state */
	struct nvme_model_pend *pend;
	uint32_t npend, pend_cap;
	struct nvme_model_pend *held; /* commands kept by act.hold */
	uint32_t nheld, held_cap;
	uint64_t steps, serial;
	/* doorbell registers elsewhere (a BAR model); NULL: the sqdb/cqdb fields above */
	volatile uint32_t *sqdbp, *cqdbp;
	/* command execution other than the NVM set (an admin queue); NULL: NVM commands */
	uint16_t (*exec)(void *ctx, struct nvme_model *m, const struct upcie_nvme_sqe *sqe,
			 struct nvme_model_pend *p);
	void *exec_ctx;
	/* counters */
	uint64_t fetched, posted, dropped, bad_doorbell, executed_errors, dma_writes, dma_reads;
	/* threaded mode */
	pthread_t thread;
	int run;
};

/* Set up the model for a queue of the given rings and a namespace of `ns_blocks` blocks. */
static inline int nvme_model_init(struct nvme_model *m, void *sq, uint32_t sq_depth, void *cq,
				  uint32_t cq_depth, uint16_t sqid, uint8_t *ns, uint64_t ns_blocks,
				  uint32_t lba_bytes, unsigned page_shift,
				  struct nvme_model_iomap *im)
{
	memset(m, 0, sizeof(*m));
	m->sq = (struct upcie_nvme_sqe *)sq;
	m->cq = (struct upcie_nvme_cqe *)cq;
	m->sq_depth = sq_depth;
	m->cq_depth = cq_depth;
	m->phase = 1;
	m->sqid = sqid;
	m->ns = ns;
	m->ns_blocks = ns_blocks;
	m->lba_bytes = lba_bytes;
	m->page_shift = page_shift;
	m->iomap = im;
	m->seed = 0x9e3779b97f4a7c15ull;
	/* every fetched command, plus room for raw completions */
	m->pend_cap = sq_depth + cq_depth + 256;
	m->held_cap = sq_depth + 16;
	m->pend = (struct nvme_model_pend *)calloc(m->pend_cap, sizeof(*m->pend));
	m->held = (struct nvme_model_pend *)calloc(m->held_cap, sizeof(*m->held));
	return m->pend && m->held ? 0 : -1;
}

static inline void nvme_model_fini(struct nvme_model *m)
{
	free(m->pend);
	free(m->held);
	memset(m, 0, sizeof(*m));
}

static inline uint64_t nvme_model_rand_(struct nvme_model *m)
{
	m->seed ^= m->seed << 13;
	m->seed ^= m->seed >> 7;
	m->seed ^= m->seed << 17;
	return m->seed;
}

/* Copy between the namespace and device memory: dir 0 = device->ns (write), 1 = ns->device. */
struct nvme_model_xfer_ {
	struct nvme_model *m;
	const struct nvme_model_pend *p;
	uint8_t *nsp;
	int dir; /* 0: write (device memory to namespace), 1: read, 2: compare */
	bool miscompare;
	uint8_t *buf; /* DSM: ranges land here */
};

/* Report a host memory access of command `p` to the observer and the counters. */
static inline void nvme_model_dma_(struct nvme_model *m, const struct nvme_model_pend *p, int dir,
				   int kind, const uint8_t *ptr, uint64_t len)
{
	if (dir == 0)
		m->dma_writes++;
	else
		m->dma_reads++;
	if (m->dma)
		m->dma(m->dma_ctx, m, p, dir, kind, ptr, len);
}

static inline int nvme_model_xfer_emit_(void *ctx, uint64_t iova, uint64_t len)
{
	struct nvme_model_xfer_ *x = (struct nvme_model_xfer_ *)ctx;

	while (len) {
		uint64_t contig, take;
		uint8_t *p = nvme_model_iomap_find(x->m->iomap, iova, &contig);

		if (!p)
			return UPCIE_NVME_SC_DATA_XFER_ERROR;
		take = contig < len ? contig : len;
		if (x->dir == 0) {
			nvme_model_dma_(x->m, x->p, 1, NVME_MODEL_DMA_DATA, p, take);
			memcpy(x->nsp, p, take);
		} else if (x->dir == 1) {
			nvme_model_dma_(x->m, x->p, 0, NVME_MODEL_DMA_DATA, p, take);
			memcpy(p, x->nsp, take);
		} else {
			nvme_model_dma_(x->m, x->p, 1, NVME_MODEL_DMA_DATA, p, take);
			if (memcmp(x->nsp, p, take))
				x->miscompare = true;
		}
		x->nsp += take;
		iova += take;
		len -= take;
	}
	return 0;
}

static inline int nvme_model_dptr_walk_(struct nvme_model *m, const struct upcie_nvme_sqe *sqe,
					uint64_t len, nvme_model_emit_fn emit, void *ctx)
{
	if (upcie_nvme_sqe_psdt(sqe) == UPCIE_NVME_PSDT_PRP)
		return nvme_model_prp_walk(m->iomap, sqe->prp1, sqe->prp2, len, m->page_shift, emit,
					   ctx);
	if (upcie_nvme_sqe_psdt(sqe) == UPCIE_NVME_PSDT_SGL)
		return nvme_model_sgl_walk(m->iomap, upcie_nvme_sqe_sgl1_addr(sqe),
					   upcie_nvme_sqe_sgl1_len(sqe),
					   upcie_nvme_sqe_sgl1_id(sqe), len, emit, ctx);
	return UPCIE_NVME_SC_INVALID_FIELD;
}

/* Execute one command against the namespace; returns the status code. */
static inline uint16_t nvme_model_exec_(struct nvme_model *m, const struct upcie_nvme_sqe *sqe,
					struct nvme_model_pend *p)
{
	uint64_t slba = sqe->cdw10 | ((uint64_t)sqe->cdw11 << 32);
	uint32_t nlb = (sqe->cdw12 & 0xffff) + 1;
	struct nvme_model_xfer_ x;
	int err;

	memset(&x, 0, sizeof(x));
	x.m = m;
	x.p = p;
	switch (sqe->opc) {
	case NVME_MODEL_OPC_ECHO:
		p->dw0 = sqe->cdw2;
		p->dw1 = sqe->cdw3;
		return 0;
	case UPCIE_NVME_NVM_FLUSH:
		return 0;
	case UPCIE_NVME_NVM_READ:
	case UPCIE_NVME_NVM_WRITE:
	case UPCIE_NVME_NVM_COMPARE:
	case UPCIE_NVME_NVM_WRITE_ZEROES:
		if (sqe->nsid != 1)
			return UPCIE_NVME_SC_INVALID_NS;
		if (slba >= m->ns_blocks || nlb > m->ns_blocks - slba)
			return UPCIE_NVME_SC_LBA_RANGE;
		x.nsp = m->ns + slba * m->lba_bytes;
		if (sqe->opc == UPCIE_NVME_NVM_WRITE_ZEROES) {
			memset(x.nsp, 0, (size_t)nlb * m->lba_bytes);
			return 0;
		}
		x.dir = sqe->opc == UPCIE_NVME_NVM_WRITE  ? 0
			: sqe->opc == UPCIE_NVME_NVM_READ ? 1
							  : 2;
		err = nvme_model_dptr_walk_(m, sqe, (uint64_t)nlb * m->lba_bytes,
					    nvme_model_xfer_emit_, &x);
		if (err)
			return (uint16_t)err;
		return x.miscompare ? UPCIE_NVME_SC_COMPARE_FAILED : 0;
	case UPCIE_NVME_NVM_DSM: {
		struct upcie_nvme_dsm_range r[256];
		uint32_t nr = (sqe->cdw10 & 0xff) + 1;

		/* The ranges travel like write data, into `r` instead of the namespace. */
		x.nsp = (uint8_t *)r;
		x.dir = 0;
		err = nvme_model_dptr_walk_(m, sqe, (uint64_t)nr * 16, nvme_model_xfer_emit_, &x);
		if (err)
			return (uint16_t)err;
		for (uint32_t i = 0; i < nr; i++) {
			if (r[i].slba >= m->ns_blocks || r[i].nlb > m->ns_blocks - r[i].slba)
				return UPCIE_NVME_SC_LBA_RANGE;
			if (sqe->cdw11 & 4)
				memset(m->ns + r[i].slba * m->lba_bytes, 0,
				       (size_t)r[i].nlb * m->lba_bytes);
		}
		return 0;
	}
	default:
		return UPCIE_NVME_SC_INVALID_OPCODE;
	}
}

/*
 * Queue a completion for `cid` as if a command finished (any CID, e.g. one never submitted),
 * reporting SQ head `sqhd` (-1: the model's own). Returns 0, -1 when the model is full.
 */
static inline int nvme_model_post_raw_sqhd(struct nvme_model *m, uint16_t cid, uint16_t code,
					   bool dnr, int32_t sqhd)
{
	struct nvme_model_pend *p;

	if (m->npend >= m->pend_cap)
		return -1;
	p = &m->pend[m->npend++];
	memset(p, 0, sizeof(*p));
	p->cid = cid;
	p->code = code;
	p->dnr = dnr;
	p->sqhd = sqhd;
	p->due = m->steps;
	return 0;
}

/* Queue a completion for `cid` as if a command finished (any CID, e.g. one never submitted). */
static inline void nvme_model_post_raw(struct nvme_model *m, uint16_t cid, uint16_t code, bool dnr)
{
	nvme_model_post_raw_sqhd(m, cid, code, dnr, -1);
}

/* Complete every held command, oldest first: executed and posted from the next step on, as a
 * late controller would. Returns how many. */
static inline uint32_t nvme_model_release_held(struct nvme_model *m)
{
	uint32_t n = 0;

	while (n < m->nheld && m->npend < m->pend_cap) {
		m->pend[m->npend] = m->held[n++];
		m->pend[m->npend].due = m->steps;
		m->pend[m->npend].due_ns = 0;
		m->npend++;
	}
	memmove(m->held, m->held + n, (m->nheld - n) * sizeof(*m->held));
	m->nheld -= n;
	return n;
}

/* Abort held command `cid`: it completes with Command Abort Requested, unexecuted. Returns
 * whether it was held. */
static inline bool nvme_model_abort_held(struct nvme_model *m, uint16_t cid)
{
	for (uint32_t i = 0; i < m->nheld; i++) {
		if (m->held[i].cid != cid)
			continue;
		m->held[i] = m->held[--m->nheld];
		nvme_model_post_raw(m, cid, UPCIE_NVME_SC_ABORT_REQ, false);
		return true;
	}
	return false;
}

static inline uint32_t nvme_model_db_(struct nvme_model *m, bool sq)
{
	uint32_t *db = sq ? (m->sqdbp ? (uint32_t *)m->sqdbp : &m->sqdb)
			  : (m->cqdbp ? (uint32_t *)m->cqdbp : &m->cqdb);

	return __atomic_load_n(db, __ATOMIC_ACQUIRE);
}

static inline void nvme_model_fetch_(struct nvme_model *m)
{
	uint32_t tail = nvme_model_db_(m, true), n = 0;

	if (tail >= m->sq_depth) {
		m->bad_doorbell++;
		return;
	}
	while (!m->fetch_stall && m->sq_head != tail && (!m->fetch_max || n < m->fetch_max) &&
	       m->npend < m->pend_cap) {
		struct nvme_model_action act;
		struct nvme_model_pend p;

		memset(&p, 0, sizeof(p));
		p.sqe = m->sq[m->sq_head];
		m->sq_head = m->sq_head + 1 == m->sq_depth ? 0 : m->sq_head + 1;
		m->fetched++;
		n++;
		memset(&act, 0, sizeof(act));
		act.delay = m->delay;
		if (m->inject)
			m->inject(m->inject_ctx, &p.sqe, &act);
		if (act.drop) {
			m->dropped++;
			continue;
		}
		p.serial = ++m->serial;
		p.cid = p.sqe.cid;
		p.due = m->steps + act.delay;
		p.due_ns = act.due_ns;
		p.code = act.code;
		p.dnr = act.code ? act.dnr : false;
		p.crd = act.code ? (uint8_t)(act.crd & 3u) : 0;
		p.exec = !act.code;
		p.sqhd = -1;
		if (act.hold && m->nheld < m->held_cap)
			m->held[m->nheld++] = p;
		else
			m->pend[m->npend++] = p;
	}
}

/* The SQ head the next completion reports: the fetch point, or up to sqhd_lag behind it, never
 * behind what was reported before. */
static inline uint32_t nvme_model_sqhd_(struct nvme_model *m)
{
	uint32_t ahead = (m->sq_head + m->sq_depth - m->sqhd_rep) % m->sq_depth;

	if (ahead > m->sqhd_lag)
		m->sqhd_rep = (m->sq_head + m->sq_depth - m->sqhd_lag) % m->sq_depth;
	return m->sqhd_rep;
}

static inline void nvme_model_post_(struct nvme_model *m)
{
	uint32_t posted = 0;
	uint64_t now = 0;

	for (;;) {
		uint32_t head = nvme_model_db_(m, false);
		uint32_t next = m->cq_tail + 1 == m->cq_depth ? 0 : m->cq_tail + 1;
		uint32_t pick = m->npend, nready = 0;
		struct upcie_nvme_cqe *e;
		struct nvme_model_pend p;

		if (next == head || (m->post_max && posted == m->post_max))
			return; /* CQ full: wait for the host to move the head */
		for (uint32_t i = 0; i < m->npend; i++) {
			if (m->pend[i].due > m->steps)
				continue;
			if (m->pend[i].due_ns) {
				if (!now)
					now = upcie_time_ns();
				if (m->pend[i].due_ns > now)
					continue;
			}
			nready++;
			if (pick == m->npend || (m->ooo && nvme_model_rand_(m) % nready == 0))
				pick = i;
		}
		if (pick == m->npend)
			return;
		p = m->pend[pick];
		memmove(&m->pend[pick], &m->pend[pick + 1], (m->npend - pick - 1) * sizeof(p));
		m->npend--;
		if (p.exec) {
			p.code = m->exec ? m->exec(m->exec_ctx, m, &p.sqe, &p)
					 : nvme_model_exec_(m, &p.sqe, &p);
			if (p.code)
				m->executed_errors++;
		}
		e = &m->cq[m->cq_tail];
		nvme_model_dma_(m, &p, 0, NVME_MODEL_DMA_CQE, (const uint8_t *)e, sizeof(*e));
		e->dw0 = p.dw0;
		e->dw1 = p.dw1;
		e->dw2 = (p.sqhd >= 0 ? (uint32_t)p.sqhd : nvme_model_sqhd_(m)) |
			 ((uint32_t)m->sqid << 16);
		__atomic_store_n(&e->dw3,
				 upcie_nvme_cqe_dw3_make(p.cid, m->phase, p.code, p.dnr) |
				     ((uint32_t)p.crd << 28),
				 __ATOMIC_RELEASE);
		m->cq_tail = next;
		if (!next)
			m->phase ^= 1;
		m->posted++;
		posted++;
	}
}

/* One step: fetch what the doorbell published, post what is due. */
static inline void nvme_model_step(struct nvme_model *m)
{
	nvme_model_fetch_(m);
	nvme_model_post_(m);
	m->steps++;
}

/* Forget everything in flight and restart the queue empty (as after delete + create). */
static inline void nvme_model_reset_queue(struct nvme_model *m)
{
	m->npend = 0;
	m->nheld = 0;
	m->sq_head = m->cq_tail = m->sqhd_rep = 0;
	m->phase = 1;
	m->sqdb = m->cqdb = 0;
	memset(m->cq, 0, (size_t)m->cq_depth * sizeof(*m->cq));
}

static inline void *nvme_model_thread_(void *arg)
{
	struct nvme_model *m = (struct nvme_model *)arg;

	while (__atomic_load_n(&m->run, __ATOMIC_ACQUIRE))
		nvme_model_step(m);
	return NULL;
}

/* Threaded mode: step continuously until nvme_model_stop(). Set knobs before. */
static inline int nvme_model_start(struct nvme_model *m)
{
	__atomic_store_n(&m->run, 1, __ATOMIC_RELEASE);
	return pthread_create(&m->thread, NULL, nvme_model_thread_, m) ? -1 : 0;
}

static inline void nvme_model_stop(struct nvme_model *m)
{
	__atomic_store_n(&m->run, 0, __ATOMIC_RELEASE);
	pthread_join(m->thread, NULL);
}

#endif /* UPCIE_TEST_NVME_MODEL_H */
