/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest test of the NVMe driver (nvme/dev.h, nvme/ctrl.h, nvme/ns.h) on QEMU's two emulated
 * controllers and the ivshmem "vram" BAR, on one or more memory paths (uio, vfio type1, vfio
 * cdev + iommufd), each a separate open of the same controllers through the same API.
 *
 * c0 (MDTS 512 KiB, c0n1 512 B blocks), taken from the kernel nvme driver, which leaves it
 * enabled and shut down: identity, the backing pattern read back, write/read verify from one
 * block to 3 MiB (split at MDTS) from unaligned buffer offsets, typed error statuses (LBA out
 * of range, invalid namespace), flush/write zeroes/DSM/compare, four queue pairs driven by four
 * threads at once, a depth-4 queue wrapped 400 times, MSI-X completion waits (vfio), shutdown +
 * reset then I/O, reset with a command in flight, close + reopen and the data still there.
 * c1 (MDTS 0, CMB, c1n1 4 KiB, c1n2 4 KiB + 16 B separate metadata, c1n3 512 B): 4 MiB in one
 * command (PRP list pages chained; QEMU maps at most 1024 entries per command), SGLs from three
 * segments split in two commands, metadata written and
 * read through MPTR (and the backing file's metadata read back), the SQ in the controller
 * memory buffer, an I/O command aborted after a timeout and an admin command (Asynchronous
 * Event Request) aborted, and peer-to-peer with the ivshmem BAR: Identify into it, Read into it
 * (also 2.5 MiB through PRP lists), Write from it.
 * Every write and every P2P placement is reported (# tb: lines) for nvme.host.sh, which checks
 * the namespace images and vram.img on the host. Prints TAP with one plan.
 *
 * Usage: t_nvme PATH...   (uio, type1, iommufd; TB_* variables give the devices and nonce)
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

#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/dev.h>
#include <upcie/nvme/ns.h>
#include <upcie/pci/driver.h>

#include "t_nvme_util.h"

static enum upcie_nvme_path g_path;
static const char *g_pname;
static int g_pi; /* path index: 0 uio, 1 type1, 2 iommufd */
static struct upcie_pci_bdf g_c0, g_c1, g_vram;
static char g_prefix[32];

#define DATA_BYTES (32 * MiB)

static int ctrl_open(struct upcie_nvme_ctrl *c, const struct upcie_pci_bdf *bdf, uint32_t irq)
{
	struct upcie_nvme_ctrl_opts o;

	memset(&o, 0, sizeof(o));
	o.dev.path = g_path;
	o.dev.bind = true;
	o.host_mem = 32 * MiB;
	o.irq_vectors = irq;
	/* c1's abort test sends its own AER (an admin command that never completes) */
	if (bdf == &g_c1)
		o.aers = UPCIE_NVME_CTRL_AERS_OFF;
	return upcie_nvme_ctrl_open(c, bdf, &o);
}

/* Tag of a write: 'w', path letter, index, then the nonce: 8 bytes. */
static void wtag(char tag[9], char kind, int k)
{
	char name[8];

	snprintf(name, sizeof(name), "%c%c%c", kind, "uti"[g_pi], "0123456789abcdefghijkl"[k % 22]);
	tn_tag(tag, name);
}

/* ---------------------------------------------------------------------------------------------
 * commands built in the SQ slot (upcie_nvme_qpair_sqe_slot/commit, upcie_nvme_prp_mem_build)
 */
struct slot_done {
	struct upcie_nvme_cqe cqe;
	int err;
};

static void slot_cb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct slot_done *s = (struct slot_done *)ctx;

	s->cqe = *cqe;
	s->err = err;
}

/* One Read or Write built in place in q's SQ slot and committed; waits for it (5 s). */
static int slot_io(struct upcie_nvme_ioq *q, const struct upcie_nvme_prp_mem *pm, bool write,
		   uint32_t nsid, uint64_t slba, uint32_t nlb, uint64_t off, uint64_t len)
{
	struct upcie_nvme_sqe *sqe = upcie_nvme_qpair_sqe_slot(&q->qp);
	struct slot_done s;
	uint16_t cid;
	int err;

	memset(&s, 0, sizeof(s));
	err = write ? upcie_nvme_cmd_write(sqe, nsid, slba, nlb, 0)
		    : upcie_nvme_cmd_read(sqe, nsid, slba, nlb, 0);
	if (!err)
		err = upcie_nvme_prp_mem_build(sqe, pm, off, len, NULL);
	if (!err)
		err = upcie_nvme_qpair_commit(&q->qp, slot_cb, &s, &cid);
	if (err)
		return err;
	upcie_nvme_qpair_ring(&q->qp);
	err = upcie_nvme_qpair_wait(&q->qp, cid, 5 * UPCIE_NSEC_PER_SEC);
	if (err == -ETIMEDOUT)
		upcie_nvme_qpair_cancel(&q->qp, cid); /* s must not outlive this frame */
	if (err)
		return err;
	return s.err ? s.err : upcie_nvme_cqe_ok(&s.cqe) ? 0 : -EIO;
}

/* Write [boff, +len) of mem (filled with tag's pattern for the image offset) to slba, read it
 * back into [roff, +len), verify; report the range for the host. With `pm` each way is one
 * command built in the SQ slot (slot_io), else the ioq layer's requests. */
static void wr_check_io(struct upcie_nvme_ioq *q, const struct upcie_nvme_prp_mem *pm,
			const struct upcie_nvme_ns *ns, const char *nsname,
			const struct upcie_dmamem *mem, uint64_t slba, uint64_t boff, uint64_t roff,
			uint64_t len, int k, const char *what)
{
	uint8_t *b = (uint8_t *)mem->vaddr;
	uint64_t img = slba * ns->lba_bytes;
	uint32_t nlb = (uint32_t)(len / ns->lba_bytes);
	struct upcie_nvme_cqe cqe;
	char tag[9], key[48];
	int64_t d = -2;
	int err;

	wtag(tag, 'w', k);
	tn_pat(b + boff, len, tag, img);
	memset(b + roff, 0, len);
	if (pm) {
		err = slot_io(q, pm, true, ns->nsid, slba, nlb, boff, len);
		if (!err)
			err = slot_io(q, pm, false, ns->nsid, slba, nlb, roff, len);
	} else {
		err = upcie_nvme_ioq_write_sync(q, ns, slba, mem, boff, len, &cqe);
		if (!err)
			err = upcie_nvme_ioq_read_sync(q, ns, slba, mem, roff, len, &cqe);
	}
	if (!err)
		d = tn_pat_diff(b + roff, len, tag, img);
	TAP(!err && d == -1,
	    "%s: %swrite/read %llu bytes at LBA %llu from buffer offset %llu: verified (%d, diff "
	    "at %lld)",
	    what, pm ? "built in the SQ slot: " : "", (unsigned long long)len,
	    (unsigned long long)slba, (unsigned long long)boff, err, (long long)d);
	if (!err) {
		snprintf(key, sizeof(key), "w_%s_%s_%d", nsname, g_pname, k);
		INFO(key, "%llu+%llu+%s", (unsigned long long)img, (unsigned long long)len, tag);
	}
}

static void wr_check(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns, const char *nsname,
		     const struct upcie_dmamem *mem, uint64_t slba, uint64_t boff, uint64_t roff,
		     uint64_t len, int k, const char *what)
{
	wr_check_io(q, NULL, ns, nsname, mem, slba, boff, roff, len, k, what);
}

static void slot_wr_check(struct upcie_nvme_ioq *q, const struct upcie_nvme_prp_mem *pm,
			  const struct upcie_nvme_ns *ns, const char *nsname, uint64_t slba,
			  uint64_t boff, uint64_t roff, uint64_t len, int k, const char *what)
{
	wr_check_io(q, pm, ns, nsname, pm->mem, slba, boff, roff, len, k, what);
}

/* Read `len` bytes at slba and compare with the backing file's pattern. */
static void pattern_check(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns,
			  const char *nsname, const struct upcie_dmamem *mem, uint64_t off,
			  uint64_t slba, uint64_t len)
{
	char tag[9];
	int64_t d = -2;
	int err;

	tn_tag(tag, nsname);
	memset((uint8_t *)mem->vaddr + off, 0xa5, len);
	err = upcie_nvme_ioq_read_sync(q, ns, slba, mem, off, len, NULL);
	if (!err)
		d = tn_pat_diff((uint8_t *)mem->vaddr + off, len, tag, slba * ns->lba_bytes);
	TAP(!err && d == -1, "%s: read %llu bytes at LBA %llu shows the backing pattern '%s' (%d)",
	    nsname, (unsigned long long)len, (unsigned long long)slba, tag, err);
}

/* ---------------------------------------------------------------------------------------------
 * threads: one queue pair each
 */
struct worker {
	struct upcie_nvme_ctrl *c;
	const struct upcie_nvme_ns *ns;
	const struct upcie_dmamem *mem;
	uint64_t boff, slba;
	int idx, ok, bad;
	uint16_t qid;
};

static void *worker_fn(void *arg)
{
	struct worker *w = (struct worker *)arg;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ioq_opts o;
	uint8_t *b = (uint8_t *)w->mem->vaddr + w->boff;
	char tag[9];

	memset(&o, 0, sizeof(o));
	o.depth = 16;
	if (upcie_nvme_ioq_create(&q, w->c, &o)) {
		w->bad++;
		return NULL;
	}
	w->qid = q.qid;
	wtag(tag, 't', w->idx);
	for (int i = 0; i < 64; i++) {
		uint64_t slba = w->slba + (uint64_t)(i % 16) * 32, len = 16 * KiB;

		tn_pat(b, len, tag, slba * 512 + (uint64_t)i);
		memset(b + 64 * KiB, 0, len);
		if (upcie_nvme_ioq_write_sync(&q, w->ns, slba, w->mem, w->boff, len, NULL) ||
		    upcie_nvme_ioq_read_sync(&q, w->ns, slba, w->mem, w->boff + 64 * KiB, len,
					     NULL) ||
		    tn_pat_diff(b + 64 * KiB, len, tag, slba * 512 + (uint64_t)i) != -1)
			w->bad++;
		else
			w->ok++;
	}
	if (upcie_nvme_ioq_delete(&q))
		w->bad++;
	return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * a shallow queue wrapped many times, completions verified in the callback
 */
struct wrap {
	const struct upcie_nvme_ns *ns;
	const struct upcie_dmamem *mem;
	char tag[9];
	int done, bad;
};

struct wrap_slot {
	struct upcie_nvme_req req;
	struct wrap *w;
	uint64_t off, slba;
};

static void wrap_cb(struct upcie_nvme_req *r)
{
	struct wrap_slot *s = (struct wrap_slot *)r->ctx;

	if (r->err ||
	    tn_pat_diff((uint8_t *)s->w->mem->vaddr + s->off, 4096, s->w->tag, s->slba * 512) != -1)
		s->w->bad++;
	s->w->done++;
}

static void wrap_test(struct upcie_nvme_ctrl *c, const struct upcie_nvme_ns *ns,
		      const struct upcie_dmamem *mem, uint64_t boff, uint64_t pat_lba)
{
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ioq_opts o;
	struct wrap w;
	struct wrap_slot slot[3];
	int submitted = 0, err = 0, total = 1200;

	memset(&o, 0, sizeof(o));
	o.depth = 4;
	err = upcie_nvme_ioq_create(&q, c, &o);
	TAP(err == 0 && q.qp.ncids == 3, "c0: depth-4 queue %u (%d)", q.qid, err);
	if (err)
		return;
	memset(&w, 0, sizeof(w));
	w.ns = ns;
	w.mem = mem;
	tn_tag(w.tag, "c0n1");
	for (int i = 0; i < 3; i++) {
		memset(&slot[i], 0, sizeof(slot[i]));
		slot[i].w = &w;
		slot[i].off = boff + (uint64_t)i * 4096;
		slot[i].req.cb = wrap_cb;
		slot[i].req.ctx = &slot[i];
		slot[i].req.done = true;
	}
	while (w.done < total && !err) {
		for (int i = 0; i < 3 && submitted < total; i++) {
			if (!slot[i].req.done)
				continue;
			slot[i].slba = pat_lba + (uint64_t)(submitted % 2000) * 8;
			memset((uint8_t *)mem->vaddr + slot[i].off, 0, 4096);
			err = upcie_nvme_ioq_read(&q, ns, slot[i].slba, mem, slot[i].off, 4096,
						  &slot[i].req);
			if (err)
				break;
			submitted++;
		}
		if (upcie_nvme_ioq_poll(&q, 16) < 0)
			err = -EPROTO;
	}
	TAP(!err && w.done == total && w.bad == 0 && q.qp.nbad == 0,
	    "c0: %d reads through a depth-4 queue (%d wraps), 3 in flight, every one verified "
	    "(%d bad, err %d)",
	    w.done, total / 4, w.bad, err);
	upcie_nvme_ioq_delete(&q);
}

/* ---------------------------------------------------------------------------------------------
 * c0
 */
static void part_c0(void)
{
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ioq q, qi;
	struct upcie_nvme_ioq_opts o;
	struct upcie_nvme_ns ns, ns_bad;
	struct upcie_nvme_cqe cqe;
	struct upcie_nvme_req req;
	struct upcie_dmamem mem;
	struct upcie_nvme_io io;
	struct upcie_nvme_dseg seg;
	struct worker w[4];
	pthread_t th[4];
	uint32_t nsids[8], n = 0;
	const char *sn = getenv("TB_C0_SN");
	uint64_t b = (uint64_t)g_pi * 16384,
		 pat_lba = 49152; /* c0n1: 8 MiB per path, last 8 MiB pristine */
	uint8_t *d;
	bool vfio = g_path != UPCIE_NVME_PATH_UIO;
	int err, ok, bad = 0;

	memset(&mem, 0, sizeof(mem));
	err = ctrl_open(&c, &g_c0, vfio ? 2 : 0);
	TAP(err == 0, "c0: opened on the %s path, bus mastering on, ready (%d)", g_pname, err);
	if (err)
		return;
	TAP(!strcmp(c.sn, sn ? sn : "deadbeef") && c.max_xfer == 512 * KiB && c.id.vid == 0x1b36,
	    "c0: Identify: SN '%s', MN '%s', FR '%s', MDTS %llu KiB, NN %u, VS %u.%u", c.sn, c.mn,
	    c.fr, (unsigned long long)(c.max_xfer >> 10), c.id.nn, upcie_nvme_vs_mjr(c.vs),
	    upcie_nvme_vs_mnr(c.vs));
	TAP(upcie_nvme_cc_css(c.cc) == UPCIE_NVME_CC_CSS_IOCS && c.mqes == 2048 && c.nqueues >= 4,
	    "c0: CC.CSS 6 (CAP.CSS 0x%02x), MQES %u, %u I/O queues granted",
	    upcie_nvme_cap_css(c.cap), c.mqes, c.nqueues);
	err = upcie_nvme_ctrl_ns_list(&c, nsids, 8, &n);
	TAP(err == 0 && n == 1 && nsids[0] == 1, "c0: active namespaces {1} (%d, %u)", err, n);
	err = upcie_nvme_ns_open(&ns, &c, 1);
	TAP(err == 0 && ns.lba_bytes == 512 && ns.nsze == 65536 && !ns.ms,
	    "c0n1: 512 B blocks, %llu blocks (%d)", (unsigned long long)ns.nsze, err);
	err = upcie_nvme_dev_dmamem(&c.dev, DATA_BYTES, &mem);
	TAP(err == 0, "c0: %llu MiB of %s DMA memory (%d)", (unsigned long long)(DATA_BYTES >> 20),
	    mem.kind ? mem.kind : "?", err);
	if (err)
		goto out;
	d = (uint8_t *)mem.vaddr;
	err = upcie_nvme_ioq_create(&q, &c, NULL);
	TAP(err == 0 && q.qid == 1 && q.depth == 256, "c0: I/O queue %u, depth %u (%d)", q.qid,
	    q.depth, err);
	if (err)
		goto out;

	pattern_check(&q, &ns, "c0n1", &mem, 0, pat_lba, 4096);
	pattern_check(&q, &ns, "c0n1", &mem, 0, 65535, 512);

	wr_check(&q, &ns, "c0n1", &mem, b + 0, 0, 16 * MiB, 512, 0, "c0n1 one block");
	wr_check(&q, &ns, "c0n1", &mem, b + 8, 512, 16 * MiB + 512, 4096, 1, "c0n1 unaligned");
	wr_check(&q, &ns, "c0n1", &mem, b + 64, 1028, 16 * MiB + 1028, 25 * 512, 2,
		 "c0n1 PRP list");
	wr_check(&q, &ns, "c0n1", &mem, b + 256, 3584, 16 * MiB + 3584, 128 * KiB, 3, "c0n1");
	wr_check(&q, &ns, "c0n1", &mem, b + 1024, 0, 16 * MiB, 512 * KiB, 4, "c0n1 = MDTS");
	wr_check(&q, &ns, "c0n1", &mem, b + 4096, 4096 + 8, 16 * MiB + 8, 3 * MiB + 512, 5,
		 "c0n1 split at MDTS");
	{
		struct upcie_nvme_prp_mem pm;
		uint16_t tail;

		err = upcie_nvme_prp_mem_init(&pm, &mem, &q.dptr);
		TAP(err == 0, "c0: data memory checked once for in-slot commands (%d)", err);
		slot_wr_check(&q, &pm, &ns, "c0n1", b + 11000, 20 * MiB, 22 * MiB, 8192, 6,
			      "c0n1 two pages");
		slot_wr_check(&q, &pm, &ns, "c0n1", b + 11016, 20 * MiB + 8192 + 1028,
			      22 * MiB + 8192 + 1028, 4096, 7, "c0n1 unaligned, two pages");
		tail = q.qp.sq_tail;
		err = slot_io(&q, &pm, false, ns.nsid, b + 11000, 24, 20 * MiB, 3 * 4096);
		TAP(err < 0 && err != -EIO && q.qp.sq_tail == tail && q.qp.nfree == q.qp.ncids,
		    "c0: a three-page command without list pages is refused in the slot (%d), "
		    "nothing enqueued",
		    err);
	}

	/* typed errors */
	memset(&cqe, 0, sizeof(cqe));
	err = upcie_nvme_ioq_read_sync(&q, &ns, ns.nsze, &mem, 0, 512, &cqe);
	TAP(err == -EIO && upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_LBA_RANGE,
	    "c0n1: read at LBA %llu: -EIO, status 0x%03x '%s'", (unsigned long long)ns.nsze,
	    upcie_nvme_cqe_code(&cqe), upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)));
	{
		/* beyond NN: not a valid NSID; 99 <= NN: valid but inactive */
		struct upcie_nvme_ns nsx = ns;

		nsx.nsid = c.id.nn + 1;
		memset(&cqe, 0, sizeof(cqe));
		err = upcie_nvme_ioq_read_sync(&q, &nsx, 0, &mem, 0, 512, &cqe);
		TAP(err == -EIO && upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_INVALID_NS,
		    "c0: read of namespace %u (NN + 1): -EIO, status 0x%03x '%s'", nsx.nsid,
		    upcie_nvme_cqe_code(&cqe), upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)));
		nsx.nsid = 99;
		memset(&cqe, 0, sizeof(cqe));
		err = upcie_nvme_ioq_read_sync(&q, &nsx, 0, &mem, 0, 512, &cqe);
		TAP(err == -EIO && upcie_nvme_cqe_code(&cqe) != 0,
		    "c0: read of inactive namespace 99: -EIO, status 0x%03x '%s'",
		    upcie_nvme_cqe_code(&cqe), upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)));
		err = upcie_nvme_ns_open(&ns_bad, &c, c.id.nn + 1);
		TAP(err == -EIO, "c0: Identify Namespace NN + 1: -EIO (%d)", err);
		err = upcie_nvme_ns_open(&ns_bad, &c, 99);
		TAP(err == -ENODEV, "c0: Identify Namespace 99 (inactive): -ENODEV (%d)", err);
	}

	/* flush, write zeroes, dataset management, compare */
	memset(&req, 0, sizeof(req));
	err = upcie_nvme_ioq_sync(&q, upcie_nvme_ioq_flush(&q, &ns, &req), &req, 0, NULL);
	TAP(err == 0, "c0n1: flush (%d)", err);
	tn_pat(d, 8 * 512, "zz", 0);
	upcie_nvme_ioq_write_sync(&q, &ns, b + 15000, &mem, 0, 8 * 512, NULL);
	err = upcie_nvme_ioq_sync(&q, upcie_nvme_ioq_write_zeroes(&q, &ns, b + 15000, 8, 0, &req),
				  &req, 0, NULL);
	memset(d, 0xff, 8 * 512);
	if (!err)
		err = upcie_nvme_ioq_read_sync(&q, &ns, b + 15000, &mem, 0, 8 * 512, NULL);
	ok = 1;
	for (int i = 0; i < 8 * 512; i++)
		ok &= d[i] == 0;
	TAP(err == 0 && ok, "c0n1: write zeroes of 8 blocks reads back zeros (%d)", err);
	{
		struct upcie_nvme_dsm_range *rg = (struct upcie_nvme_dsm_range *)(d + 4096);

		upcie_nvme_dsm_range_set(&rg[0], b + 15100, 8, 0);
		upcie_nvme_dsm_range_set(&rg[1], b + 15200, 16, 0);
		err = upcie_nvme_ioq_sync(
		    &q, upcie_nvme_ioq_dsm(&q, &ns, &mem, 4096, 2, UPCIE_NVME_DSM_AD, &req), &req,
		    0, NULL);
		TAP(err == 0, "c0n1: dataset management (deallocate, 2 ranges) (%d)", err);
	}
	memset(&io, 0, sizeof(io));
	seg.mem = &mem;
	seg.off = 0;
	seg.len = 4096;
	io.opc = UPCIE_NVME_NVM_COMPARE;
	io.slba = pat_lba;
	io.segs = &seg;
	io.nsegs = 1;
	{
		char tag[9];

		tn_tag(tag, "c0n1");
		tn_pat(d, 4096, tag, pat_lba * 512);
	}
	err = upcie_nvme_ioq_io_sync(&q, &ns, &io, 0, &cqe);
	TAP(err == 0, "c0n1: compare with the backing pattern: equal (%d)", err);
	d[1000] ^= 0x40;
	err = upcie_nvme_ioq_io_sync(&q, &ns, &io, 0, &cqe);
	TAP(err == -EIO && upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_COMPARE_FAILED,
	    "c0n1: compare with one bit flipped: -EIO, status 0x%03x '%s'",
	    upcie_nvme_cqe_code(&cqe), upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)));

	/* four threads, four queue pairs */
	ok = bad = 0;
	for (int i = 0; i < 4; i++) {
		w[i].c = &c;
		w[i].ns = &ns;
		w[i].mem = &mem;
		w[i].boff = 20 * MiB + (uint64_t)i * 256 * KiB;
		w[i].slba = b + 12288 + (uint64_t)i * 1024;
		w[i].idx = i;
		w[i].ok = w[i].bad = 0;
		w[i].qid = 0;
		pthread_create(&th[i], NULL, worker_fn, &w[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		ok += w[i].ok;
		bad += w[i].bad;
	}
	TAP(ok == 256 && bad == 0,
	    "c0n1: 4 threads on queues %u %u %u %u at once: %d write/read pairs verified, %d bad",
	    w[0].qid, w[1].qid, w[2].qid, w[3].qid, ok, bad);

	wrap_test(&c, &ns, &mem, 24 * MiB, pat_lba);

	/* MSI-X: a queue whose completions wake us through its vector's eventfd */
	if (vfio) {
		memset(&o, 0, sizeof(o));
		o.irq = true;
		o.vector = 1;
		o.depth = 32;
		err = upcie_nvme_ioq_create(&qi, &c, &o);
		TAP(err == 0 && c.irqs.count == 2,
		    "c0: queue %u with CQ interrupts on MSI-X vector 1 "
		    "(%d)",
		    qi.qid, err);
		if (!err) {
			struct upcie_nvme_req r2;
			int waited = -1, n_ok = 0;
			char tag[9];

			tn_tag(tag, "c0n1");
			memset(&r2, 0, sizeof(r2));
			err = upcie_nvme_ioq_read(&qi, &ns, pat_lba, &mem, 0, 4096, &r2);
			if (!err)
				waited = upcie_nvme_ioq_irq_wait(&qi, 5 * UPCIE_NSEC_PER_SEC);
			upcie_nvme_ioq_poll(&qi, 16);
			TAP(err == 0 && waited == 0 && r2.done && !r2.err,
			    "c0: the read's completion raised MSI-X vector 1 (eventfd) (%d, %d)",
			    err, waited);
			for (int i = 0; i < 100; i++) {
				memset(d + 4096, 0, 4096);
				err = upcie_nvme_ioq_read(&qi, &ns, pat_lba + (uint64_t)i * 8, &mem,
							  4096, 4096, &r2);
				if (!err)
					err = upcie_nvme_ioq_wait(&qi, &r2, 5 * UPCIE_NSEC_PER_SEC);
				if (!err && tn_pat_diff(d + 4096, 4096, tag,
							(pat_lba + (uint64_t)i * 8) * 512) == -1)
					n_ok++;
			}
			TAP(n_ok == 100, "c0: 100 reads waited for by interrupt, verified (%d)",
			    n_ok);
			upcie_nvme_ioq_delete(&qi);
		}
	} else {
		err = upcie_nvme_dev_irq_enable(&c.dev, 1, &c.irqs);
		TAP(err == -EOPNOTSUPP, "c0: MSI-X under uio: -EOPNOTSUPP (%d)", err);
	}

	/* shutdown, reset, I/O again; reset with a command in flight */
	err = upcie_nvme_ctrl_shutdown(&c);
	TAP(err == 0 && c.state == UPCIE_NVME_CTRL_SHUTDOWN &&
		upcie_nvme_csts_shst(upcie_nvme_ctrl_rd32(&c, UPCIE_NVME_REG_CSTS)) ==
		    UPCIE_NVME_CSTS_SHST_COMPLETE,
	    "c0: shutdown: CSTS.SHST complete (%d)", err);
	err = upcie_nvme_ctrl_reset(&c);
	TAP(err == 0 && c.state == UPCIE_NVME_CTRL_READY && q.live && q.qid == 1,
	    "c0: reset after shutdown: ready, queue 1 recreated in place (%d)", err);
	{
		char tag[9];

		wtag(tag, 'w', 4);
		memset(d + 16 * MiB, 0, 512 * KiB);
		err = upcie_nvme_ioq_read_sync(&q, &ns, b + 1024, &mem, 16 * MiB, 512 * KiB, NULL);
		TAP(err == 0 && tn_pat_diff(d + 16 * MiB, 512 * KiB, tag, (b + 1024) * 512) == -1,
		    "c0n1: I/O after shutdown and reset reads the data written before (%d)", err);
	}
	memset(&req, 0, sizeof(req));
	err = upcie_nvme_ioq_read(&q, &ns, 0, &mem, 0, 512 * KiB, &req);
	if (!err)
		err = upcie_nvme_ctrl_reset(&c);
	upcie_nvme_ioq_poll(&q, 64);
	TAP(err == 0 && req.done && (req.err == -ECANCELED || req.err == 0) &&
		upcie_nvme_qpair_inflight(&q.qp) == 0 && q.qp.ncancelled == 0,
	    "c0: reset with a read in flight: the read ended (%d), nothing left outstanding (%d)",
	    req.err, err);
	pattern_check(&q, &ns, "c0n1", &mem, 0, pat_lba + 64, 64 * KiB);

	upcie_nvme_ioq_delete(&q);
	upcie_dmamem_destroy(&mem);
	err = upcie_nvme_ctrl_close(&c);
	TAP(err == 0, "c0: closed: queues deleted, shut down, disabled (%d)", err);

	/* the data is still there for the next owner */
	err = ctrl_open(&c, &g_c0, 0);
	if (!err)
		err = upcie_nvme_ns_open(&ns, &c, 1);
	if (!err)
		err = upcie_nvme_dev_dmamem(&c.dev, 4 * MiB, &mem);
	if (!err)
		err = upcie_nvme_ioq_create(&q, &c, NULL);
	if (!err) {
		char tag[9];

		wtag(tag, 'w', 5);
		memset(mem.vaddr, 0, 3 * MiB + 512);
		err = upcie_nvme_ioq_read_sync(&q, &ns, b + 4096, &mem, 0, 3 * MiB + 512, NULL);
		TAP(err == 0 && tn_pat_diff(mem.vaddr, 3 * MiB + 512, tag, (b + 4096) * 512) == -1,
		    "c0: reopened: the 3 MiB written before reads back (%d)", err);
	} else {
		TAP(0, "c0: reopen (%d)", err);
	}
	upcie_nvme_ioq_delete(&q);
out:
	upcie_dmamem_destroy(&mem);
	upcie_nvme_ctrl_close(&c);
}

/* ---------------------------------------------------------------------------------------------
 * c1: large transfers, metadata, SGL, CMB, abort, P2P
 */
static void part_c1_meta(struct upcie_nvme_ctrl *c, struct upcie_nvme_ioq *q,
			 const struct upcie_dmamem *mem)
{
	struct upcie_nvme_ns ns;
	struct upcie_nvme_io io;
	struct upcie_nvme_dseg seg;
	uint8_t *d = (uint8_t *)mem->vaddr;
	uint64_t slba = (uint64_t)g_pi * 1024, pslba = 3500, mdoff;
	char tag[9], mtag[9], ptag[9];
	int64_t dd = -2, dm = -2;
	int err;

	err = upcie_nvme_ns_open(&ns, c, 2);
	TAP(err == 0 && ns.lba_bytes == 4096 && ns.ms == 16 && !ns.ext && ns.block_bytes == 4096,
	    "c1n2: 4 KiB blocks + 16 B metadata in a separate buffer, %llu blocks (%d)",
	    (unsigned long long)ns.nsze, err);
	if (err)
		return;
	mdoff = ns.nsze * 4096; /* QEMU keeps the metadata after all data in the image */
	TAP(upcie_nvme_ioq_read_sync(q, &ns, 0, mem, 0, 4096, NULL) == -EINVAL,
	    "c1n2: read without a metadata buffer: -EINVAL before submission");
	/* backing pattern: data and metadata of pristine blocks */
	memset(&io, 0, sizeof(io));
	seg.mem = mem;
	seg.off = 0;
	seg.len = 4 * 4096;
	io.opc = UPCIE_NVME_NVM_READ;
	io.slba = pslba;
	io.segs = &seg;
	io.nsegs = 1;
	io.md = mem;
	io.md_off = 1 * MiB;
	memset(d, 0, 4 * 4096);
	memset(d + MiB, 0, 64);
	err = upcie_nvme_ioq_io_sync(q, &ns, &io, 0, NULL);
	tn_tag(ptag, "c1n2");
	if (!err) {
		dd = tn_pat_diff(d, 4 * 4096, ptag, pslba * 4096);
		dm = tn_pat_diff(d + MiB, 4 * 16, ptag, mdoff + pslba * 16);
	}
	TAP(!err && dd == -1 && dm == -1,
	    "c1n2: read of 4 pristine blocks: data and metadata show the image's pattern (%d, "
	    "%lld, "
	    "%lld)",
	    err, (long long)dd, (long long)dm);
	/* write 8 blocks with metadata, read both back */
	wtag(tag, 'w', 0);
	wtag(mtag, 'm', 0);
	tn_pat(d, 8 * 4096, tag, slba * 4096);
	tn_pat(d + MiB, 8 * 16, mtag, mdoff + slba * 16);
	io.opc = UPCIE_NVME_NVM_WRITE;
	io.slba = slba;
	seg.len = 8 * 4096;
	err = upcie_nvme_ioq_io_sync(q, &ns, &io, 0, NULL);
	memset(d + 2 * MiB, 0, 8 * 4096);
	memset(d + 3 * MiB, 0, 8 * 16);
	io.opc = UPCIE_NVME_NVM_READ;
	seg.off = 2 * MiB;
	io.md_off = 3 * MiB;
	if (!err)
		err = upcie_nvme_ioq_io_sync(q, &ns, &io, 0, NULL);
	dd = dm = -2;
	if (!err) {
		dd = tn_pat_diff(d + 2 * MiB, 8 * 4096, tag, slba * 4096);
		dm = tn_pat_diff(d + 3 * MiB, 8 * 16, mtag, mdoff + slba * 16);
	}
	TAP(!err && dd == -1 && dm == -1,
	    "c1n2: write/read 8 blocks with 128 bytes of metadata (MPTR): both verified (%d)", err);
	if (!err) {
		char key[48];

		snprintf(key, sizeof(key), "w_c1n2_%s_0", g_pname);
		INFO(key, "%llu+%llu+%s", (unsigned long long)(slba * 4096),
		     (unsigned long long)(8 * 4096), tag);
		snprintf(key, sizeof(key), "w_c1n2_%s_m", g_pname);
		INFO(key, "%llu+%llu+%s", (unsigned long long)(mdoff + slba * 16),
		     (unsigned long long)(8 * 16), mtag);
	}
}

static void part_c1_p2p(struct upcie_nvme_ctrl *c, struct upcie_nvme_ioq *q,
			const struct upcie_nvme_ns *ns)
{
	struct upcie_nvme_peer peer;
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_dseg seg;
	uint64_t pv = (uint64_t)(g_pi + 1) * 8 * MiB; /* slice of vram per path */
	uint64_t rlba = 6144 + (uint64_t)g_pi * 64, wlba = (uint64_t)g_pi * 2048 + 1900;
	volatile uint8_t *v;
	char ntag[9], vtag[9], key[48], sn[21];
	int64_t dd = -2;
	int err;

	tn_tag(ntag, "c1n1");
	tn_tag(vtag, "vram");
	if (g_path == UPCIE_NVME_PATH_IOMMUFD && !tn_kernel_at_least(6, 19)) {
		SKIP("needs vfio BAR dma-buf (6.19)", "c1: P2P with the ivshmem BAR via iommufd");
		return;
	}
	err = upcie_nvme_peer_open(&peer, &c->dev, &g_vram, 2, pv, 4 * MiB);
	TAP(err == 0,
	    "c1: ivshmem BAR2 [%llu MiB, +4 MiB) as DMA memory (%s, device address "
	    "0x%llx) (%d)",
	    (unsigned long long)(pv >> 20), peer.mem.kind ? peer.mem.kind : "?",
	    (unsigned long long)upcie_dmamem_iova_fast(&peer.mem, 0), err);
	if (err)
		return;
	v = (volatile uint8_t *)peer.mem.vaddr;
	/* Identify Controller into the BAR */
	upcie_nvme_cmd_identify_ctrl(&sqe);
	seg.mem = &peer.mem;
	seg.off = 0;
	seg.len = 4096;
	err = upcie_nvme_ctrl_admin(c, &sqe, &seg, 1, 0, NULL);
	if (!err && v) {
		for (int i = 0; i < 20; i++)
			sn[i] = (char)v[4 + i];
		sn[20] = '\0';
		for (int i = 19; i >= 0 && sn[i] == ' '; i--)
			sn[i] = '\0';
	}
	TAP(err == 0 && (!v || (v[0] == 0x36 && v[1] == 0x1b && !strcmp(sn, c->sn))),
	    "c1: Identify Controller DMA'd into the BAR (vendor 1b36, SN '%s') (%d)",
	    v ? sn : "(no CPU view)", err);
	if (!err) {
		snprintf(key, sizeof(key), "p2p_identify_%s", g_pname);
		INFO(key, "%llu", (unsigned long long)pv);
	}
	/* Read c1n1 into the BAR: 64 KiB and 2.5 MiB (PRP lists pointing at device memory) */
	err = upcie_nvme_ioq_read_sync(q, ns, rlba, &peer.mem, 64 * KiB, 64 * KiB, NULL);
	if (!err && v) {
		uint8_t *tmp = (uint8_t *)malloc(64 * KiB);

		for (uint64_t i = 0; i < 64 * KiB; i++)
			tmp[i] = v[64 * KiB + i];
		dd = tn_pat_diff(tmp, 64 * KiB, ntag, rlba * 4096);
		free(tmp);
	}
	TAP(err == 0 && (!v || dd == -1),
	    "c1n1: Read of 64 KiB at LBA %llu into the BAR: the CPU view shows '%s' (%d)",
	    (unsigned long long)rlba, ntag, err);
	if (!err) {
		snprintf(key, sizeof(key), "p2p_read_%s_0", g_pname);
		INFO(key, "%llu+%llu+%llu", (unsigned long long)(pv + 64 * KiB),
		     (unsigned long long)(64 * KiB), (unsigned long long)(rlba * 4096));
	}
	err = upcie_nvme_ioq_read_sync(q, ns, 7000, &peer.mem, MiB, 2 * MiB + 512 * KiB, NULL);
	TAP(err == 0, "c1n1: Read of 2.5 MiB at LBA 7000 into the BAR in one command (%d)", err);
	if (!err) {
		snprintf(key, sizeof(key), "p2p_read_%s_1", g_pname);
		INFO(key, "%llu+%llu+%llu", (unsigned long long)(pv + MiB),
		     (unsigned long long)(2 * MiB + 512 * KiB), (unsigned long long)(7000 * 4096));
	}
	/* Write from the BAR: its own pattern goes to c1n1 */
	err = upcie_nvme_ioq_write_sync(q, ns, wlba, &peer.mem, 128 * KiB, 64 * KiB, NULL);
	TAP(err == 0, "c1n1: Write of 64 KiB from the BAR to LBA %llu (%d)",
	    (unsigned long long)wlba, err);
	if (!err) {
		snprintf(key, sizeof(key), "p2p_write_%s", g_pname);
		INFO(key, "%llu+%llu+%llu", (unsigned long long)(wlba * 4096),
		     (unsigned long long)(64 * KiB), (unsigned long long)(pv + 128 * KiB));
	}
	upcie_nvme_peer_close(&peer);
}

struct abort_ctx {
	int calls;
};

static void part_c1_abort(struct upcie_nvme_ctrl *c, const struct upcie_nvme_ns *ns,
			  const struct upcie_dmamem *mem)
{
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ioq_opts o;
	struct upcie_nvme_req req;
	struct upcie_nvme_sqe sqe;
	struct upcie_deadline dl;
	int err, waited;

	/* admin: an Asynchronous Event Request stays outstanding until an event comes */
	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = UPCIE_NVME_ADMIN_ASYNC_EVENT;
	err = upcie_nvme_ctrl_admin(c, &sqe, NULL, 0, 200 * UPCIE_NSEC_PER_MSEC, NULL);
	TAP(err == -ETIMEDOUT && c->admin.ncancelled <= 1 &&
		upcie_nvme_qpair_inflight(&c->admin) == 0,
	    "c1: admin command that does not complete: Abort sent, then cancelled (%d)", err);
	err = upcie_nvme_ctrl_identify(c, UPCIE_NVME_CNS_CTRL, 0, &c->id);
	TAP(err == 0, "c1: the admin queue keeps working (%d)", err);

	/* I/O: a 4 MiB read given 1 us */
	memset(&o, 0, sizeof(o));
	o.max_xfer = 4 * MiB;
	o.depth = 8;
	err = upcie_nvme_ioq_create(&q, c, &o);
	if (err) {
		TAP(0, "c1: queue for the abort test (%d)", err);
		return;
	}
	/*
	 * The read normally outlives 1 us by far, but a guest vCPU descheduled by a busy host between
	 * submit and wait can find it complete: that attempt proves nothing, so try again (at most 5).
	 */
	for (int attempt = 0; attempt < 5; attempt++) {
		memset(&req, 0, sizeof(req));
		err = upcie_nvme_ioq_read(&q, ns, 0, mem, 0, 4 * MiB, &req);
		waited = err ? err : upcie_nvme_ioq_wait(&q, &req, 1000);
		if (err || waited != 0)
			break;
	}
	if (err == 0 && waited == 0)
		SKIP("it completed in time in 5 tries (host busy)", "c1n1: 4 MiB read given 1 us");
	else
		/* QEMU 7.2 never aborts: the read ends with its own completion, within the
		 * abort timeout after the Abort */
		TAP(err == 0 && waited == -ETIMEDOUT && req.done &&
			(req.err == 0 || upcie_nvme_cqe_code(&req.cqe) == UPCIE_NVME_SC_ABORT_REQ),
		    "c1n1: 4 MiB read given 1 us: Abort (SQID %u), the request ended by its "
		    "completion, not cancelled (%d, %d)",
		    q.qid, waited, req.err);
	upcie_deadline_set(&dl, 10 * UPCIE_NSEC_PER_SEC);
	while (upcie_nvme_qpair_inflight(&q.qp) && !upcie_deadline_passed(&dl))
		upcie_nvme_ioq_poll(&q, 16);
	TAP(q.qp.ncancelled == 0 && q.qp.nbad == 0 && upcie_nvme_qpair_room(&q.qp) == 7,
	    "c1n1: nothing left outstanding or cancelled, every CID free again (%llu late)",
	    (unsigned long long)q.qp.nlate);
	upcie_nvme_ioq_delete(&q);
}

static void part_c1(void)
{
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ioq q, qs, qc;
	struct upcie_nvme_ioq_opts o;
	struct upcie_nvme_ns ns, ns3;
	struct upcie_dmamem mem;
	struct upcie_nvme_dseg segs[3];
	struct upcie_nvme_io io;
	uint32_t nsids[8], n = 0;
	const char *sn = getenv("TB_C1_SN");
	uint64_t b = (uint64_t)g_pi * 2048; /* c1n1: 8 MiB per path; last 8 MiB pristine */
	uint8_t *d;
	char tag[9];
	int err;

	memset(&mem, 0, sizeof(mem));
	err = ctrl_open(&c, &g_c1, 0);
	TAP(err == 0, "c1: opened on the %s path (%d)", g_pname, err);
	if (err)
		return;
	TAP(!strcmp(c.sn, sn ? sn : "cafe0001") && c.max_xfer == UINT64_MAX && c.sgl,
	    "c1: SN '%s', MDTS 0 (no limit), SGLs supported (SGLS 0x%x)", c.sn, c.id.sgls);
	err = upcie_nvme_ctrl_ns_list(&c, nsids, 8, &n);
	TAP(err == 0 && n == 5 && nsids[0] == 1 && nsids[1] == 2 && nsids[2] == 3 &&
		nsids[3] == 4 && nsids[4] == 5,
	    "c1: active namespaces {1, 2, 3, 4 (zoned), 5 (PI)} (%d, %u)", err, n);
	err = upcie_nvme_ns_open(&ns, &c, 1);
	TAP(err == 0 && ns.lba_bytes == 4096 && ns.nsze == 8192, "c1n1: 4 KiB blocks (%d)", err);
	err = upcie_nvme_dev_dmamem(&c.dev, DATA_BYTES, &mem);
	if (err)
		goto out;
	d = (uint8_t *)mem.vaddr;
	/* QEMU 7.2 maps at most 1024 PRP/SGL entries per command (IOV_MAX; beyond that: Internal
	 * Error) whatever MDTS says: 4 MiB of 4 KiB pages */
	memset(&o, 0, sizeof(o));
	o.max_xfer = 4 * MiB;
	o.depth = 32;
	err = upcie_nvme_ioq_create(&q, &c, &o);
	TAP(err == 0 && q.lpages == 3,
	    "c1: queue %u with 4 MiB per command: %u chained PRP list pages per CID (%d)", q.qid,
	    q.lpages, err);
	if (err)
		goto out;
	pattern_check(&q, &ns, "c1n1", &mem, 0, 6200, 64 * KiB);
	wr_check(&q, &ns, "c1n1", &mem, b, 0, 16 * MiB, 4096, 0, "c1n1 one block");
	wr_check(&q, &ns, "c1n1", &mem, b + 16, 512, 16 * MiB + 512, 4 * MiB - 4096, 1,
		 "c1n1 one command, 1024 PRP entries over 2 chained list pages");

	/* SGL from three segments, split in two commands */
	memset(&o, 0, sizeof(o));
	o.sgl = true;
	o.max_xfer = 512 * KiB;
	err = upcie_nvme_ioq_create(&qs, &c, &o);
	TAP(err == 0 && qs.sgl, "c1: SGL queue %u (%d)", qs.qid, err);
	if (!err) {
		uint64_t lens[3] = { 4096 + 1000, 256 * KiB, 1 * MiB - 4096 - 1000 - 256 * KiB };
		uint64_t offs[3] = { 3000, 2 * MiB + 17 * 4, 5 * MiB + 8 };
		uint64_t pos = 0, slba = b + 1560;
		int64_t dd = 0;

		wtag(tag, 'w', 3);
		memset(&io, 0, sizeof(io));
		for (int i = 0; i < 3; i++) {
			segs[i].mem = &mem;
			segs[i].off = offs[i];
			segs[i].len = lens[i];
			tn_pat(d + offs[i], lens[i], tag, slba * 4096 + pos);
			pos += lens[i];
		}
		io.opc = UPCIE_NVME_NVM_WRITE;
		io.slba = slba;
		io.segs = segs;
		io.nsegs = 3;
		err = upcie_nvme_ioq_io_sync(&qs, &ns, &io, 0, NULL);
		memset(d + 16 * MiB, 0, MiB);
		if (!err)
			err =
			    upcie_nvme_ioq_read_sync(&qs, &ns, slba, &mem, 16 * MiB + 4, MiB, NULL);
		if (!err)
			dd = tn_pat_diff(d + 16 * MiB + 4, MiB, tag, slba * 4096);
		TAP(err == 0 && dd == -1,
		    "c1n1: SGL write of 1 MiB from 3 unaligned segments, SGL read to an odd "
		    "offset, "
		    "two commands each: verified (%d)",
		    err);
		if (!err) {
			char key[48];

			snprintf(key, sizeof(key), "w_c1n1_%s_3", g_pname);
			INFO(key, "%llu+%llu+%s", (unsigned long long)(slba * 4096),
			     (unsigned long long)MiB, tag);
		}
		upcie_nvme_ioq_delete(&qs);
	}

	/* c1n3: 512 B blocks on the same controller */
	err = upcie_nvme_ns_open(&ns3, &c, 3);
	TAP(err == 0 && ns3.lba_bytes == 512 && ns3.nsze == 16384, "c1n3: 512 B blocks (%d)", err);
	if (!err) {
		pattern_check(&q, &ns3, "c1n3", &mem, 0, 16383, 512);
		wr_check(&q, &ns3, "c1n3", &mem, (uint64_t)g_pi * 4096 + 7, 2048, 16 * MiB + 2048,
			 40 * KiB, 0, "c1n3");
	}

	part_c1_meta(&c, &q, &mem);

	/* SQ in the controller memory buffer */
	err = upcie_nvme_ctrl_cmb_enable(&c);
	TAP(err == 0 && c.cmb.on && c.cmb.size >= MiB,
	    "c1: CMB enabled: %llu KiB in BAR%u, CMBSZ 0x%08x, controller address 0x%llx (%d)",
	    (unsigned long long)(c.cmb.size >> 10), upcie_nvme_cmbloc_bir(c.cmb.cmbloc),
	    c.cmb.cmbsz, (unsigned long long)c.cmb.cba, err);
	if (!err) {
		memset(&o, 0, sizeof(o));
		o.depth = 16;
		o.sq_heap = &c.cmb.heap;
		err = upcie_nvme_ioq_create(&qc, &c, &o);
		TAP(err == 0 && qc.sqb.iova >= c.cmb.cba && qc.sqb.iova < c.cmb.cba + c.cmb.size,
		    "c1: queue %u with its SQ in the CMB at 0x%llx (%d)", qc.qid,
		    (unsigned long long)qc.sqb.iova, err);
		if (!err) {
			int nok = 0;

			wtag(tag, 'c', 0);
			for (int i = 0; i < 40; i++) {
				uint64_t slba = b + 1820 + (uint64_t)(i % 20) * 4;

				tn_pat(d, 16 * KiB, tag, slba * 4096);
				memset(d + MiB, 0, 16 * KiB);
				if (!upcie_nvme_ioq_write_sync(&qc, &ns, slba, &mem, 0, 16 * KiB,
							       NULL) &&
				    !upcie_nvme_ioq_read_sync(&qc, &ns, slba, &mem, MiB, 16 * KiB,
							      NULL) &&
				    tn_pat_diff(d + MiB, 16 * KiB, tag, slba * 4096) == -1)
					nok++;
			}
			TAP(nok == 40,
			    "c1n1: 80 commands through the CMB-resident SQ (5 wraps), %d pairs "
			    "verified",
			    nok);
			if (nok == 40) {
				char key[48];

				snprintf(key, sizeof(key), "w_c1n1_%s_c", g_pname);
				INFO(key, "%llu+%llu+%s", (unsigned long long)((b + 1820) * 4096),
				     (unsigned long long)(80 * 4096), tag);
			}
			{
				/* Commands written straight into the CMB's write-combined slots
				 * (LBAs b + 1920..1959 and 1964; 1900..1915 belong to the P2P
				 * write below). */
				struct upcie_nvme_prp_mem pm;

				err = upcie_nvme_prp_mem_init(&pm, &mem, &qc.dptr);
				for (int i = 0; !err && i < 20; i++)
					slot_wr_check(&qc, &pm, &ns, "c1n1",
						      b + 1920 + (uint64_t)i * 2, 2 * MiB,
						      3 * MiB + (i & 1) * 4 * KiB, 8192,
						      4 + (i & 1), "c1n1 CMB SQ");
				if (!err)
					slot_wr_check(&qc, &pm, &ns, "c1n1", b + 1964,
						      2 * MiB + 8192 + 516, 3 * MiB + 8192 + 516,
						      4096, 6, "c1n1 CMB SQ unaligned");
				TAP(err == 0, "c1: data memory checked once for the CMB queue (%d)",
				    err);
			}
			upcie_nvme_ioq_delete(&qc);
		}
	}

	part_c1_abort(&c, &ns, &mem);
	part_c1_p2p(&c, &q, &ns);
	upcie_nvme_ioq_delete(&q);
out:
	upcie_dmamem_destroy(&mem);
	err = upcie_nvme_ctrl_close(&c);
	TAP(err == 0, "c1: closed (%d)", err);
}

/* The ivshmem function: unbound for uio (its BAR is reached through sysfs), vfio-pci else. */
static int vram_setup(void)
{
	char drv[64] = "";

	if (g_path == UPCIE_NVME_PATH_UIO) {
		upcie_pci_driver_get(&g_vram, drv, sizeof(drv));
		if (drv[0])
			return upcie_pci_driver_unbind(&g_vram);
		return 0;
	}
	return upcie_pci_driver_bind(&g_vram, "vfio-pci");
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	upcie_log_set_handler(tn_log, NULL);
	if (argc < 2 || tn_bdf_env("TB_C0_BDF", &g_c0) || tn_bdf_env("TB_C1_BDF", &g_c1) ||
	    tn_bdf_env("TB_VRAM_BDF", &g_vram)) {
		fprintf(stderr, "usage: t_nvme uio|type1|iommufd... (TB_C0_BDF, TB_C1_BDF, "
				"TB_VRAM_BDF set)\n");
		return 2;
	}
	DIAG("kernel %s", tn_kernel());
	for (int i = 1; i < argc; i++) {
		if (upcie_nvme_path_parse(argv[i], &g_path) || g_path == UPCIE_NVME_PATH_AUTO) {
			fprintf(stderr, "t_nvme: unknown path '%s'\n", argv[i]);
			return 2;
		}
		g_pi = g_path == UPCIE_NVME_PATH_UIO ? 0 : g_path == UPCIE_NVME_PATH_TYPE1 ? 1 : 2;
		g_pname = g_pi == 0 ? "uio" : g_pi == 1 ? "type1" : "iommufd";
		snprintf(g_prefix, sizeof(g_prefix), "[%s] ", g_pname);
		tn_prefix = g_prefix;
		TAP(vram_setup() == 0, "ivshmem function ready for the %s path", g_pname);
		part_c0();
		part_c1();
	}
	printf("1..%d\n", tn_n);
	return tn_failed ? 1 : 0;
}
