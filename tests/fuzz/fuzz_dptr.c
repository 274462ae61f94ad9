/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer harness: the PRP and SGL builders (nvme/prp.h, nvme/sgl.h) and the request splitter
 * (nvme/dptr.h) with fuzzed segments, memories, list pages and limits.
 *
 * Memories: arithmetic ones at device addresses with fuzzed low bits, LUT ones with 4 KiB to
 * 2 MiB granules at shuffled addresses; controller pages of 4 KiB to 64 KiB; list pages in
 * memory that may be misaligned or too finely granular; transfer limits of any size. Whatever a
 * builder accepts is walked the way a controller walks it (the unit tests' model, reading the
 * list pages through their device addresses), and every byte it describes must be the
 * segments' bytes, in order, exactly once. A builder that refuses must leave the command as it
 * was. No builder touches memory outside the list pages it was given: the rest of the list
 * buffer is poisoned for ASan, so such an access is reported where it happens. For the splitter: pieces cover the request in order, each of at
 * most the chunk and whole blocks; and when the whole request satisfies the PRP rules, every
 * piece does too.
 */
#include <upcie/nvme/dptr.h>
#include <upcie/nvme/prp.h>
#include <upcie/nvme/sgl.h>

#include <sanitizer/asan_interface.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvme_model.h"

#define NMEM	  6
#define MAXSEG	  8
#define LIST_MAX  16
#define LIST_SZ	  (LIST_MAX * 65536 + 3 * 65536)
#define LIST_IOVA UINT64_C(0x7000000000)

struct fz {
	const uint8_t *p;
	size_t n;
};

static uint8_t take8(struct fz *f)
{
	uint8_t v = 0;

	if (f->n) {
		v = *f->p++;
		f->n--;
	}
	return v;
}

static uint32_t take32(struct fz *f)
{
	uint32_t v = take8(f);

	v |= (uint32_t)take8(f) << 8;
	v |= (uint32_t)take8(f) << 16;
	return v | (uint32_t)take8(f) << 24;
}

static void die(const char *what)
{
	fprintf(stderr, "fuzz_dptr: invariant broken: %s\n", what);
	abort();
}

static void quiet(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)msg;
	(void)ctx;
}

static struct upcie_dmamem mem[NMEM];
static struct upcie_dmamem lmem[3]; /* list memory: aligned, 2 KiB off, LUT of 4 KiB granules */
static uint8_t *lbuf;
static struct nvme_model_iomap im[3];

static void setup_once(void)
{
	static bool done;
	static const struct {
		unsigned gshift; /* 0: arithmetic */
		uint64_t size, iova;
	} m[NMEM] = {
		{ 0, UINT64_C(4) << 20, UINT64_C(0x100000000) },
		{ 0, UINT64_C(4) << 20, UINT64_C(0x200000004) }, /* dword, not page aligned */
		{ 0, UINT64_C(1) << 20, UINT64_C(0x300000001) }, /* not even dword aligned */
		{ 12, UINT64_C(1) << 20, UINT64_C(0x400000000) },
		{ 16, UINT64_C(4) << 20, UINT64_C(0x500000000) },
		{ 21, UINT64_C(8) << 20, UINT64_C(0x600000000) },
	};
	struct nvme_model_rng rng = { 0x5eed };

	if (done)
		return;
	done = true;
	for (int i = 0; i < NMEM; i++) {
		/* the builders translate data addresses only; no CPU view is needed */
		if (!m[i].gshift)
			upcie_dmamem_init_arith(&mem[i], NULL, m[i].size, m[i].iova);
		else
			nvme_model_mem_lut(&mem[i], NULL, m[i].size, m[i].gshift, m[i].iova, true,
					   &rng);
	}
	lbuf = (uint8_t *)aligned_alloc(65536, LIST_SZ);
	upcie_dmamem_init_arith(&lmem[0], lbuf, LIST_SZ, LIST_IOVA);
	upcie_dmamem_init_arith(&lmem[1], lbuf, LIST_SZ, LIST_IOVA + 0x800);
	nvme_model_mem_lut(&lmem[2], lbuf, LIST_SZ, 12, LIST_IOVA, true, &rng);
	for (int i = 0; i < 3; i++)
		nvme_model_iomap_add(&im[i], &lmem[i]);
}

/* The transfer as a sequence of device addresses, to check what a walk emits. */
struct want {
	const struct upcie_nvme_dseg *segs;
	unsigned nsegs, i;
	uint64_t pos; /* within segs[i] */
	uint64_t total;
	bool ok;
};

static int want_emit(void *ctx, uint64_t iova, uint64_t len)
{
	struct want *w = (struct want *)ctx;

	w->total += len;
	while (len) {
		const struct upcie_nvme_dseg *s;
		uint64_t c;

		if (w->i >= w->nsegs) {
			w->ok = false; /* more bytes than the segments hold */
			return 0;
		}
		s = &w->segs[w->i];
		c = upcie_dmamem_contig(s->mem, s->off + w->pos);
		if (c > s->len - w->pos)
			c = s->len - w->pos;
		if (c > len)
			c = len;
		if (iova != upcie_dmamem_iova_fast(s->mem, s->off + w->pos))
			w->ok = false;
		w->pos += c;
		iova += c;
		len -= c;
		if (w->pos == s->len) {
			w->i++;
			w->pos = 0;
		}
	}
	return 0;
}

static void check_walk(const struct upcie_nvme_sqe *sqe, const struct upcie_nvme_dseg *segs,
		       unsigned nsegs, unsigned page_shift, const struct nvme_model_iomap *map)
{
	struct want w;
	uint64_t total = 0;
	int err;

	for (unsigned i = 0; i < nsegs; i++)
		total += segs[i].len;
	memset(&w, 0, sizeof(w));
	w.segs = segs;
	w.nsegs = nsegs;
	w.ok = true;
	if (upcie_nvme_sqe_psdt(sqe) == UPCIE_NVME_PSDT_PRP)
		err = nvme_model_prp_walk(map, sqe->prp1, sqe->prp2, total, page_shift, want_emit,
					  &w);
	else
		err = nvme_model_sgl_walk(map, upcie_nvme_sqe_sgl1_addr(sqe),
					  upcie_nvme_sqe_sgl1_len(sqe), upcie_nvme_sqe_sgl1_id(sqe),
					  total, want_emit, &w);
	if (err) {
		fprintf(stderr, "fuzz_dptr: controller walk status 0x%x\n", err);
		die("an accepted data pointer is rejected by a controller's walk");
	}
	if (!w.ok || w.total != total || w.i != nsegs)
		die("the data pointer does not describe the segments' bytes in order");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz f = { data, size };
	struct upcie_nvme_dseg segs[MAXSEG];
	struct upcie_nvme_dptr_cfg cfg;
	struct upcie_nvme_lists lists;
	struct upcie_nvme_sqe sqe, before;
	unsigned nsegs, which, li;
	uint64_t lstart, lend;
	int ret;

	upcie_log_set_handler(quiet, NULL);
	setup_once();
	memset(&cfg, 0, sizeof(cfg));
	cfg.page_shift = 12 + take8(&f) % 5;
	cfg.max_bytes = take8(&f) & 1 ? UINT64_MAX : take32(&f) % (UINT64_C(16) << 20);
	cfg.sgl_dword = take8(&f) & 1;
	which = take8(&f) % 6;
	nsegs = 1 + take8(&f) % MAXSEG;
	for (unsigned i = 0; i < nsegs; i++) {
		const struct upcie_dmamem *m = &mem[take8(&f) % NMEM];
		uint32_t a = take32(&f), b = take32(&f);

		segs[i].mem = m;
		segs[i].off = a % (m->size + 16); /* sometimes outside */
		segs[i].len = b & 1 ? (uint64_t)(b >> 1) % (UINT64_C(3) << 20)
				    : (uint64_t)((b >> 1) % 8 + 1) << cfg.page_shift;
		if (take8(&f) & 1) /* page-aligned offsets, as real transfers mostly have */
			segs[i].off &= ~((UINT64_C(1) << cfg.page_shift) - 1);
	}
	li = take8(&f) % 3;
	lists.mem = &lmem[li];
	lists.npages = take8(&f) % (LIST_MAX + 1);
	lists.off = (uint64_t)(take8(&f) % 3) << 16;
	if (take8(&f) & 1)
		lists.off += take32(&f) % 65536;
	lstart = lists.off < LIST_SZ ? lists.off : LIST_SZ;
	lend = lists.off + ((uint64_t)lists.npages << cfg.page_shift);
	lend = lend < LIST_SZ ? lend : LIST_SZ;
	ASAN_POISON_MEMORY_REGION(lbuf, LIST_SZ);
	ASAN_UNPOISON_MEMORY_REGION(lbuf + lstart, lend - lstart);
	memset(&sqe, 0x5a, sizeof(sqe));
	before = sqe;

	switch (which) {
	case 0:
		ret = upcie_nvme_prp_build(&sqe, segs, nsegs, &cfg, &lists);
		break;
	case 1:
		nsegs = 1;
		ret = upcie_nvme_prp_build_buf(&sqe, segs[0].mem, segs[0].off, segs[0].len, &cfg,
					       &lists);
		break;
	case 2: {
		struct upcie_nvme_prp_mem pm;

		nsegs = 1;
		upcie_nvme_prp_mem_init(&pm, segs[0].mem, &cfg);
		ret = upcie_nvme_prp_mem_build(&sqe, &pm, segs[0].off, segs[0].len, &lists);
		break;
	}
	case 3:
		ret = upcie_nvme_sgl_build(&sqe, segs, nsegs, &cfg, &lists);
		break;
	case 4:
		nsegs = 1;
		ret = upcie_nvme_sgl_build_buf(&sqe, segs[0].mem, segs[0].off, segs[0].len, &cfg,
					       &lists);
		break;
	default: {
		/* the splitter: pieces of a request that satisfies the PRP rules satisfy them */
		struct upcie_nvme_dptr_cfg whole = cfg;
		struct upcie_nvme_dseg piece[MAXSEG];
		struct upcie_nvme_split sp;
		uint32_t block = 1 + take32(&f) % 70000;
		uint64_t off, len, at = 0, total = 0;
		int n, req_ok;

		whole.max_bytes = UINT64_MAX;
		lists.mem = &lmem[0];
		lists.off = 0;
		lists.npages = LIST_MAX;
		ASAN_UNPOISON_MEMORY_REGION(lbuf, (size_t)LIST_MAX << cfg.page_shift);
		req_ok = upcie_nvme_prp_build(&sqe, segs, nsegs, &whole, &lists) >= 0;
		for (unsigned i = 0; i < nsegs; i++)
			total += segs[i].len;
		if (upcie_nvme_split_init(&sp, segs, nsegs, cfg.max_bytes, block))
			return 0;
		while ((n = upcie_nvme_split_next(&sp, piece, MAXSEG, &off, &len)) > 0) {
			uint64_t sum = 0;

			if (off != at || !len || len > sp.chunk || len % block || sp.chunk % 4)
				die("split: piece out of order, too long, or not whole blocks");
			for (int k = 0; k < n; k++)
				sum += piece[k].len;
			if (sum != len)
				die("split: piece segments do not add up");
			if (req_ok) {
				struct upcie_nvme_dptr_cfg pc = cfg;

				pc.max_bytes = sp.chunk;
				if (upcie_nvme_prp_build(&sqe, piece, (unsigned)n, &pc, &lists) < 0)
					die("split: a piece of a valid PRP request is not valid");
				check_walk(&sqe, piece, (unsigned)n, cfg.page_shift, &im[0]);
			}
			at += len;
		}
		if (n < 0 || at != total)
			die("split: the pieces do not cover the request");
		return 0;
	}
	}
	if (ret < 0) {
		if (ret != -EINVAL && ret != -ENOSPC)
			die("unexpected error");
		if (memcmp(&sqe, &before, sizeof(sqe)))
			die("a refused command was changed");
		return 0;
	}
	if ((unsigned)ret > lists.npages)
		die("more list pages used than given");
	check_walk(&sqe, segs, nsegs, cfg.page_shift, &im[li]);
	return 0;
}
