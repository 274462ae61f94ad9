/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer harness: Identify data as a device writes it, and what consumes it.
 *
 * The first byte picks the target, the next bytes are parameters, the rest is the 4096-byte page
 * (zero-padded):
 *   0  Identify Controller through upcie_nvme_ctrl_id_apply_() with a fuzzed CAP.MPSMIN: MDTS
 *      in bytes (a power of two of at least two minimum pages, or no limit), admin transfers
 *      within 2 MiB and MDTS, NN never the broadcast ID, strings terminated and printable.
 *   1  Identify Namespace through upcie_nvme_ns_parse(), then a Read, Write or Compare of a
 *      fuzzed length and LBA submitted on an I/O queue pair built over memory rings, with a
 *      fuzzed transfer limit, PRPs or SGLs, extended or separate metadata, PI, zoned or not:
 *      the LBA format in range, the sizes without overflow; every command in the SQ names the
 *      namespace, stays within 65536 blocks, covers the request's LBAs in order exactly once,
 *      sets PRACT only where the namespace is driven that way, and its data pointer, walked as
 *      a controller would, moves exactly its blocks' bytes.
 *   2  Active Namespace List pages through the list walk, each page offered twice as a device
 *      repeating itself would: NSIDs strictly ascending, never 0 or 0xffffffff, and the walk
 *      ends.
 *   3  Namespace Identification Descriptor list through upcie_nvme_ns_desc_csi().
 *   4  Report Zones data through upcie_nvme_zone_report_count(), every counted descriptor read.
 */
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvme_model.h"

#define PAGE 4096

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

static uint64_t take64(struct fz *f)
{
	return take32(f) | ((uint64_t)take32(f) << 32);
}

static void die(const char *what)
{
	fprintf(stderr, "fuzz_identify: invariant broken: %s\n", what);
	abort();
}

static void quiet(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)msg;
	(void)ctx;
}

/* The rest of the input as a zero-padded page. */
static void page_of(struct fz *f, void *page)
{
	size_t n = f->n < PAGE ? f->n : PAGE;

	memset(page, 0, PAGE);
	memcpy(page, f->p, n);
	f->p += n;
	f->n -= n;
}

static void t_ctrl(struct fz *f)
{
	static struct upcie_nvme_ctrl c;
	unsigned mps;
	int err;

	memset(&c, 0, sizeof(c));
	snprintf(c.name, sizeof(c.name), "fuzz");
	mps = take8(f) & 0xf;
	c.cap = (uint64_t)mps << 48 | (uint64_t)(take8(f) & 0xf) << 52;
	c.page_shift = 12 + mps;
	page_of(f, &c.id);
	err = upcie_nvme_ctrl_id_apply_(&c);
	if (err && err != -EOPNOTSUPP)
		die("ctrl: unexpected error");
	if (err)
		return;
	if (c.max_xfer != UINT64_MAX &&
	    (!upcie_is_pow2(c.max_xfer) || c.max_xfer < (UINT64_C(2) << (12 + mps))))
		die("ctrl: MDTS bytes not a power of two of at least two minimum pages");
	if (!c.admin_dptr.max_bytes || c.admin_dptr.max_bytes > (UINT64_C(2) << 20) ||
	    c.admin_dptr.max_bytes > c.max_xfer)
		die("ctrl: admin transfer limit beyond 2 MiB or MDTS");
	if (c.nn == UPCIE_NVME_NSID_ALL)
		die("ctrl: NN is the broadcast ID");
	if (strlen(c.sn) > 20 || strlen(c.mn) > 40 || strlen(c.fr) > 8)
		die("ctrl: string not terminated inside its field");
	for (const char *s = c.mn; *s; s++)
		if (*s < 0x20 || *s > 0x7e)
			die("ctrl: unprintable byte kept in a string");
	if (c.sgl_dword && !c.sgl)
		die("ctrl: dword SGLs without SGLs");
}

/* I/O over the parsed namespace on a queue pair with memory rings and a fake controller. */
static struct upcie_nvme_ctrl fc;
static struct upcie_nvme_ioq q;
static struct upcie_nvme_sqe sq[64] __attribute__((aligned(64)));
static struct upcie_nvme_cqe cq[64] __attribute__((aligned(64)));
static struct upcie_nvme_sqe shadow[64] __attribute__((aligned(64))); /* per CID slot */
static struct upcie_nvme_retry_ retry[64];
static volatile uint32_t sqdb, cqdb;
static uint8_t *lists; /* 63 CIDs x up to 16 pages */
static struct upcie_dmamem lmem, dmem, mmem;
static struct nvme_model_iomap im;

#define LPAGES	 16
#define DATA_IOV UINT64_C(0x100000000)
#define DATA_SZ	 (UINT64_C(1) << 36)
#define MD_IOV	 UINT64_C(0x2000000000)
#define LIST_IOV UINT64_C(0x3000000000)

struct walk {
	uint64_t expect; /* next device address expected */
	uint64_t bytes;
	bool ok;
};

static int walk_emit(void *ctx, uint64_t iova, uint64_t len)
{
	struct walk *w = (struct walk *)ctx;

	/* data memory is arithmetic: a transfer's bytes are device-contiguous from its start */
	if (iova != w->expect)
		w->ok = false;
	w->expect = iova + len;
	w->bytes += len;
	return 0;
}

static void io_once(void)
{
	static bool done;

	if (done)
		return;
	done = true;
	lists = (uint8_t *)aligned_alloc(PAGE, (size_t)63 * LPAGES * PAGE);
	upcie_dmamem_init_arith(&lmem, lists, (size_t)63 * LPAGES * PAGE, LIST_IOV);
	/* data and metadata: translation only, the builders never touch their bytes */
	upcie_dmamem_init_arith(&dmem, NULL, DATA_SZ, DATA_IOV);
	upcie_dmamem_init_arith(&mmem, NULL, UINT64_C(1) << 30, MD_IOV);
	nvme_model_iomap_add_range(&im, LIST_IOV, (uint64_t)63 * LPAGES * PAGE, lists);
}

static void t_ns(struct fz *f)
{
	static struct upcie_nvme_id_ns id;
	struct upcie_nvme_qpair_cfg qc;
	struct upcie_nvme_ns ns;
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_req req;
	struct upcie_nvme_io io;
	uint32_t nbad = 0, nblocks, nsid = take32(f);
	uint8_t mode = take8(f), opc = take8(f);
	uint64_t slba = take64(f), max = take32(f), zone = take64(f), off = take32(f);
	uint64_t total, done_blocks = 0;
	uint16_t tail0;
	int err;

	nblocks = 1 + take32(f) % 4096;
	page_of(f, &id);
	err = upcie_nvme_ns_parse(&ns, &id, nsid, &nbad);
	if (err && err != -ENODEV && err != -EINVAL)
		die("ns: unexpected error");
	if (err)
		return;
	if (ns.nsid != nsid || ns.lbaf > 63 || ns.lbaf > (id.nlbaf > 63 ? 63 : id.nlbaf) ||
	    !upcie_is_pow2(ns.lba_bytes) || ns.lba_bytes < 512 ||
	    ns.lba_bytes > (UINT32_C(1) << UPCIE_NVME_LBA_SHIFT_MAX) || ns.ncap > ns.nsze ||
	    ns.block_bytes < ns.lba_bytes || ns.block_bytes > ns.lba_bytes + ns.ms ||
	    ns.nsze > UINT64_MAX / (ns.lba_bytes + ns.ms) || ns.pi > 3 ||
	    (ns.pract && (!ns.pi || ns.ms != UPCIE_NVME_PI_BYTES)) ||
	    (ns.block_shift && (UINT32_C(1) << ns.block_shift) != ns.block_bytes))
		die("ns: parsed fields out of range");

	/* what ns_open would add for a zoned namespace */
	if (mode & 1) {
		ns.zoned = true;
		ns.csi = UPCIE_NVME_CSI_ZNS;
		ns.zone_blocks = zone % ns.nsze + 1;
		ns.slow = true;
	}
	io_once();
	memset(&fc, 0, sizeof(fc));
	snprintf(fc.name, sizeof(fc.name), "fuzz");
	fc.id.oncs = 0xffff;
	ns.ctrl = &fc;

	memset(&q, 0, sizeof(q));
	q.ctrl = &fc;
	q.live = true;
	q.qid = 1;
	q.sgl = mode & 2;
	q.dptr.page_shift = 12;
	q.dptr.sgl_dword = mode & 4;
	q.dptr.max_bytes = max ? max : UPCIE_NVME_IOQ_MAX_XFER;
	if (q.dptr.max_bytes > (UINT64_C(8) << 20))
		q.dptr.max_bytes = UINT64_C(8) << 20;
	q.lmem = &lmem;
	q.loff = 0;
	q.lpages = LPAGES; /* 8 MiB / 4 KiB + 1 entries fit in 5 PRP or 9 SGL list pages */
	q.depth = 64;
	q.shadow = shadow;
	q.retry = retry;
	memset(&qc, 0, sizeof(qc));
	qc.sq = sq;
	qc.cq = cq;
	qc.sqdb = &sqdb;
	qc.cqdb = &cqdb;
	qc.sq_depth = 64;
	qc.qid = 1;
	if (upcie_nvme_qpair_init(&q.qp, &qc))
		die("qpair init");

	total = (uint64_t)nblocks * ns.block_bytes;
	memset(&io, 0, sizeof(io));
	io.opc = opc % 3 == 0	? UPCIE_NVME_NVM_READ
		 : opc % 3 == 1 ? UPCIE_NVME_NVM_WRITE
				: UPCIE_NVME_NVM_COMPARE;
	io.slba = slba;
	seg.mem = &dmem;
	seg.off = (off & ~UINT64_C(3)) % (DATA_SZ / 2);
	seg.len = total;
	io.segs = &seg;
	io.nsegs = 1;
	io.zoned = mode & 8;
	if (mode & 16) {
		io.md = &mmem;
		io.md_off = 0;
	}
	memset(&req, 0, sizeof(req));
	tail0 = q.qp.sq_tail;
	err = upcie_nvme_ioq_submit_io(&q, &ns, &io, &req);
	if (err && err != -EINVAL && err != -EBUSY && err != -EOPNOTSUPP)
		die("io: unexpected error");
	if (!err && req.err)
		die("io: the request was accepted, then failed half way through its commands");
	if (!err && io.opc == UPCIE_NVME_NVM_WRITE && ns.zoned && !io.zoned)
		die("io: a plain Write to a zoned namespace went out");
	for (uint16_t t = tail0; !err && t != q.qp.sq_tail; t = (uint16_t)((t + 1) % 64)) {
		const struct upcie_nvme_sqe *e = &sq[t];
		uint32_t nlb = (e->cdw12 & 0xffff) + 1;
		uint64_t s = e->cdw10 | (uint64_t)e->cdw11 << 32;
		struct walk w;

		if (e->nsid != ns.nsid || e->opc != io.opc)
			die("io: command for another namespace or opcode");
		if (s != io.slba + done_blocks)
			die("io: commands do not cover the LBAs in order");
		if ((e->cdw12 & UPCIE_NVME_RW_PRACT) && !(ns.pract && !io.md))
			die("io: PRACT on a namespace not driven with it");
		if (ns.pract && !io.md && !(e->cdw12 & UPCIE_NVME_RW_PRACT))
			die("io: PI namespace without PRACT and without metadata");
		w.expect = upcie_dmamem_iova_fast(&dmem, seg.off) + done_blocks * ns.block_bytes;
		w.bytes = 0;
		w.ok = true;
		err =
		    upcie_nvme_sqe_psdt(e) == UPCIE_NVME_PSDT_PRP
			? nvme_model_prp_walk(&im, e->prp1, e->prp2, (uint64_t)nlb * ns.block_bytes,
					      12, walk_emit, &w)
			: nvme_model_sgl_walk(&im, upcie_nvme_sqe_sgl1_addr(e),
					      upcie_nvme_sqe_sgl1_len(e), upcie_nvme_sqe_sgl1_id(e),
					      (uint64_t)nlb * ns.block_bytes, walk_emit, &w);
		if (err || !w.ok || w.bytes != (uint64_t)nlb * ns.block_bytes)
			die("io: the data pointer does not describe the command's blocks");
		if ((uint64_t)nlb * ns.block_bytes > q.dptr.max_bytes)
			die("io: a command above the transfer limit");
		done_blocks += nlb;
	}
	if (!err && done_blocks != nblocks) {
		fprintf(stderr,
			"fuzz_identify: %" PRIu64
			" blocks in commands, %u asked, %u-byte blocks, max %" PRIu64
			", tail %u -> %u\n",
			done_blocks, nblocks, ns.block_bytes, q.dptr.max_bytes, tail0,
			q.qp.sq_tail);
		die("io: commands do not add up to the request");
	}
	upcie_nvme_qpair_fini(&q.qp);
}

static void t_list(struct fz *f)
{
	static struct upcie_nvme_ns_list l;
	uint32_t after = take32(f) % 4, nsids[64], n = 0, nbad = 0, last = 0, pages = 0;

	while (f->n && pages < 64) {
		page_of(f, &l);
		for (int rep = 0; rep < 2; rep++) {
			uint32_t n0 = n, a0 = after;
			int more = upcie_nvme_ns_list_take_(&l, &after, nsids, 64, &n, &nbad);

			pages++;
			if (n < n0 || (n > n0 && after <= a0) || after == UPCIE_NVME_NSID_ALL)
				die("list: the walk went backwards or took the broadcast ID");
			for (uint32_t i = n0; i < n && i < 64; i++) {
				if (!nsids[i] || nsids[i] <= last ||
				    nsids[i] == UPCIE_NVME_NSID_ALL)
					die("list: NSIDs not strictly ascending");
				last = nsids[i];
			}
			if (!more)
				return;
		}
	}
}

static void t_desc(struct fz *f)
{
	static uint8_t page[PAGE];
	size_t len = 4 + take32(f) % PAGE;
	uint8_t csi = 0xee;
	int err;

	page_of(f, page);
	err = upcie_nvme_ns_desc_csi(page, len, &csi);
	if (err && err != -ENOENT && err != -EPROTO)
		die("desc: unexpected error");
	if (!err) {
		const void *hit = memchr(page, UPCIE_NVME_NIDT_CSI, len);

		if (!hit)
			die("desc: a CSI without a CSI descriptor");
	}
}

static volatile uint64_t sink;

static void t_report(struct fz *f)
{
	size_t len = take32(f) % (PAGE + 1);
	uint8_t *buf = (uint8_t *)malloc(len ? len : 1);
	uint64_t n, sum = 0;

	memcpy(buf, f->p, f->n < len ? f->n : len);
	if (f->n < len)
		memset(buf + f->n, 0, len - f->n);
	n = upcie_nvme_zone_report_count(buf, len);
	if (n && 64 + n * 64 > len)
		die("report: counted more descriptors than the buffer holds");
	for (uint64_t i = 0; i < n; i++) {
		const struct upcie_nvme_zone_desc *d =
		    (const struct upcie_nvme_zone_desc *)(buf + 64 + i * 64);

		sum += d->wp + d->zslba + d->zcap + d->zs;
	}
	free(buf);
	sink = sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz f = { data, size };

	upcie_log_set_handler(quiet, NULL);
	switch (take8(&f) % 5) {
	case 0:
		t_ctrl(&f);
		break;
	case 1:
		t_ns(&f);
		break;
	case 2:
		t_list(&f);
		break;
	case 3:
		t_desc(&f);
		break;
	default:
		t_report(&f);
		break;
	}
	return 0;
}
