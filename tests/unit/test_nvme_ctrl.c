/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * nvme/ctrl.h and nvme/ns.h against the controller model (nvme_ctrl_model.h): bring-up from a
 * controller the kernel left enabled and shut down (disable first, CC/AQA/ASQ/ACQ as the spec
 * wants, Identify parsed, queues granted), ready timeout bounded by CAP.TO, CRTO honoured only
 * from NVMe 2.0, CSTS.CFS as -EIO, CAP checks; I/O queue identifier bookkeeping (lowest free,
 * explicit, exhaustion, release on delete and on a failed create, no leaked memory); I/O with
 * data verified through PRPs (lists, unaligned starts, segments) and SGLs, requests split above
 * max_xfer and fed through a shallow queue, typed error statuses; Abort of a timed-out I/O
 * command and of an admin command; a command the controller does not abort stays pending
 * until a reset ends it; reset with commands in flight, shutdown then reset, close deleting
 * open queues; queues driven by several threads at once. The faults of real drives are in
 * test_nvme_faults.c.
 */
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nvme_ctrl_rig.h"

#define MiB	   RIG_MiB
#define HOST_IOVA  RIG_HOST_IOVA
#define NS_BLOCKS  RIG_NS_BLOCKS
#define LBA	   RIG_LBA
#define SHORT_WAIT (50 * UPCIE_NSEC_PER_MSEC)

static void fill(void *p, uint64_t len, uint32_t tag, uint64_t base)
{
	for (uint64_t i = 0; i < len; i++)
		((uint8_t *)p)[i] = rig_pat(tag, base + i);
}

static bool same(const void *p, uint64_t len, uint32_t tag, uint64_t base)
{
	for (uint64_t i = 0; i < len; i++)
		if (((const uint8_t *)p)[i] != rig_pat(tag, base + i))
			return false;
	return true;
}

static void t_bringup(void)
{
	struct upcie_nvme_ctrl_opts o;
	struct rig r;
	uint32_t cc, nsids[4], n = 0;
	uint64_t heap_free;
	struct upcie_heap_stats st;
	int err;

	rig_setup(&r);
	/* what the kernel nvme driver leaves behind: enabled, shut down */
	r.cm.regs[UPCIE_NVME_REG_CC / 4] =
	    1u | (UPCIE_NVME_CC_SHN_NORMAL << 14) | (6u << 16) | (4u << 20);
	r.cm.regs[UPCIE_NVME_REG_CSTS / 4] = 1u | (UPCIE_NVME_CSTS_SHST_COMPLETE << 2);
	r.cm.rdy = true;
	rig_start(&r);
	memset(&o, 0, sizeof(o));
	o.admin_depth = 16;
	err = rig_ctrl(&r, &o);
	CHECK_EQ(err, 0, "bring-up of a controller left enabled and shut down");
	CHECK(r.c.state == UPCIE_NVME_CTRL_READY, "state READY");
	CHECK(r.cm.n_disable >= 1 && r.cm.n_enable == 1, "disabled first, then enabled once");
	cc = r.cm.last_cc;
	CHECK(upcie_nvme_cc_en(cc) && upcie_nvme_cc_css(cc) == UPCIE_NVME_CC_CSS_IOCS &&
		  upcie_nvme_cc_mps(cc) == 0 && upcie_nvme_cc_iosqes(cc) == 6 &&
		  upcie_nvme_cc_iocqes(cc) == 4 && upcie_nvme_cc_shn(cc) == 0 &&
		  upcie_nvme_cc_ams(cc) == 0,
	      "CC 0x%08x: EN, CSS all I/O sets (CAP.CSS bit 6), 4 KiB pages, 64/16 B entries", cc);
	CHECK_EQ(r.cm.last_aqa, 15u | (15u << 16), "AQA holds 16 entries each (0's based)");
	CHECK(r.cm.last_asq == r.c.asq.iova && r.cm.last_acq == r.c.acq.iova &&
		  r.c.asq.iova >= HOST_IOVA && !(r.c.asq.iova & 0xfff),
	      "ASQ/ACQ are page-aligned device addresses in the host memory");
	CHECK(!strcmp(r.c.sn, "MODEL0001") && !strcmp(r.c.mn, "upcie model") &&
		  !strcmp(r.c.fr, "1.0"),
	      "Identify strings trimmed: '%s' '%s' '%s'", r.c.sn, r.c.mn, r.c.fr);
	CHECK_EQ(r.c.max_xfer, 512 * 1024, "MDTS 7 with 4 KiB MPSMIN is 512 KiB");
	CHECK(r.c.sgl && !r.c.sgl_dword, "SGLS 1: SGLs without alignment rule");
	CHECK_EQ(r.c.nqueues, 8, "Set Features Number of Queues: 8 granted");
	CHECK_EQ(r.cm.n_set_queues, 1, "Set Features issued once");
	CHECK_EQ(r.c.ready_timeout_ns, 500 * UPCIE_NSEC_PER_MSEC, "ready timeout from CAP.TO");
	CHECK_EQ(r.c.mqes, 2048, "MQES 2048 entries");
	err = upcie_nvme_ctrl_ns_list(&r.c, nsids, 4, &n);
	CHECK(err == 0 && n == 1 && nsids[0] == 1, "active namespace list: {1} (%d, %u)", err, n);
	upcie_heap_stats_get(&r.c.heap, &st);
	heap_free = st.free_bytes;
	CHECK(heap_free > 15 * MiB, "admin queues, scratch and lists take little host memory");
	err = upcie_nvme_ctrl_close(&r.c);
	CHECK_EQ(err, 0, "close");
	CHECK(r.cm.n_shutdown == 1, "close shut the controller down (CC.SHN, CSTS.SHST)");
	CHECK((nvme_cmodel_rd(&r.cm, UPCIE_NVME_REG_CC) & 1) == 0, "and disabled it");
	CHECK(r.c.state == UPCIE_NVME_CTRL_CLOSED && !r.c.regs, "the struct is zeroed");
	CHECK_EQ(upcie_nvme_ctrl_close(&r.c), 0, "closing it again is a no-op");
	rig_teardown(&r);
}

static void t_bringup_errors(void)
{
	struct upcie_nvme_ctrl_opts o;
	struct upcie_nvme_ioq q;
	struct rig r;
	uint64_t t0, ms;
	int err;

	/* never ready: bounded by CAP.TO (500 ms) */
	rig_setup(&r);
	r.cm.never_ready = true;
	rig_start(&r);
	t0 = upcie_time_ns();
	err = rig_ctrl(&r, NULL);
	ms = (upcie_time_ns() - t0) / UPCIE_NSEC_PER_MSEC;
	CHECK_EQ(err, -ETIMEDOUT, "never ready: -ETIMEDOUT");
	CHECK(ms >= 450 && ms < 3000, "after CAP.TO (%llu ms)", (unsigned long long)ms);
	CHECK(r.c.state == UPCIE_NVME_CTRL_CLOSED && !r.c.lock_live, "and nothing left open");
	rig_teardown(&r);

	/* fatal status while enabling */
	rig_setup(&r);
	r.cm.cfs_on_enable = true;
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	CHECK_EQ(err, -EIO, "CSTS.CFS during enable: -EIO");
	rig_teardown(&r);

	/* NVMe 2.0 with CRWMS: CRTO.CRWMT (2 s) outranks CAP.TO (500 ms) */
	rig_setup(&r);
	nvme_cmodel_set_cap(&r.cm, nvme_cmodel_cap(2048, 1, 0xc1, 0, 1));
	r.cm.regs[UPCIE_NVME_REG_VS / 4] = UPCIE_NVME_VS(2, 0, 0);
	r.cm.regs[UPCIE_NVME_REG_CRTO / 4] = 4; /* CRWMT 4 * 500 ms */
	r.cm.ready_delay_ms = 1000;
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	CHECK_EQ(err, 0, "NVMe 2.0: ready after 1 s, inside CRTO.CRWMT");
	CHECK_EQ(r.c.ready_timeout_ns, 2 * UPCIE_NSEC_PER_SEC, "ready timeout from CRTO");
	rig_teardown(&r);

	/* NVMe 1.4: CRTO is not looked at */
	rig_setup(&r);
	nvme_cmodel_set_cap(&r.cm, nvme_cmodel_cap(2048, 1, 0xc1, 0, 1));
	r.cm.regs[UPCIE_NVME_REG_CRTO / 4] = 4;
	r.cm.ready_delay_ms = 1000;
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	CHECK_EQ(err, -ETIMEDOUT, "NVMe 1.4: CRTO ignored, CAP.TO applies");
	rig_teardown(&r);

	/* MPSMIN above the host page */
	rig_setup(&r);
	nvme_cmodel_set_cap(&r.cm, nvme_cmodel_cap(2048, 1, 0xc1, 1, 0));
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	CHECK_EQ(err, -EOPNOTSUPP, "CAP.MPSMIN 8 KiB on a 4 KiB host: -EOPNOTSUPP");
	rig_teardown(&r);

	/* NVM command set only: CC.CSS 0. CAP.TO 4 s here and below: these checks are about the
	 * command set, and a loaded machine must not turn them into ready timeouts. */
	rig_setup(&r);
	nvme_cmodel_set_cap(&r.cm, nvme_cmodel_cap(2048, 8, 0x01, 0, 0));
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	CHECK(err == 0 && upcie_nvme_cc_css(r.cm.last_cc) == UPCIE_NVME_CC_CSS_NVM,
	      "CAP.CSS 0x01: CC.CSS 0 (NVM) (%d)", err);
	rig_teardown(&r);

	/* admin only: no I/O queues */
	rig_setup(&r);
	nvme_cmodel_set_cap(&r.cm, nvme_cmodel_cap(2048, 8, 0x80, 0, 0));
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	CHECK(err == 0 && upcie_nvme_cc_css(r.cm.last_cc) == UPCIE_NVME_CC_CSS_ADMIN &&
		  r.c.nqueues == 0,
	      "CAP.CSS 0x80: CC.CSS 7, no I/O queues asked for (%d)", err);
	CHECK_EQ(upcie_nvme_ioq_create(&q, &r.c, NULL), -EOPNOTSUPP,
		 "I/O queue on an admin-only controller: -EOPNOTSUPP");
	rig_teardown(&r);

	/* bad arguments */
	memset(&o, 0, sizeof(o));
	o.admin_depth = 4097;
	rig_setup(&r);
	rig_start(&r);
	CHECK_EQ(rig_ctrl(&r, &o), -EINVAL, "admin depth 4097: -EINVAL");
	CHECK_EQ(upcie_nvme_ctrl_init(&r.c, NULL, 0, &r.host, NULL), -EINVAL, "no registers");
	rig_teardown(&r);
}

static void t_queues(void)
{
	struct upcie_nvme_ioq q[9], extra;
	struct upcie_nvme_ioq_opts o;
	struct upcie_heap_stats st0, st1;
	struct rig r;
	int err, ok;

	rig_setup(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	upcie_heap_stats_get(&r.c.heap, &st0);
	err = upcie_nvme_ioq_create(&q[0], &r.c, NULL);
	CHECK(err == 0 && q[0].qid == 1 && q[0].depth == 256 && q[0].live,
	      "default queue: qid 1, depth 256 (%d)", err);
	CHECK(q[0].sqb.iova % 4096 == 0 && q[0].cqb.iova % 4096 == 0 && q[0].sqb.size >= 256 * 64 &&
		  q[0].cqb.size >= 256 * 16,
	      "SQ and CQ memory sized from the depth, page aligned");
	CHECK_EQ(q[0].lpages, 1, "512 KiB max_xfer: one PRP list page per CID");
	CHECK(r.cm.q[1].sq && r.cm.q[1].cq && r.cm.q[1].cq_depth == 256,
	      "the controller has CQ and SQ 1");
	CHECK_EQ(r.cm.cq_ien_iv, 0, "polled CQ: interrupts disabled");
	memset(&o, 0, sizeof(o));
	o.depth = 2;
	err = upcie_nvme_ioq_create(&q[1], &r.c, &o);
	CHECK(err == 0 && q[1].qid == 2 && q[1].qp.ncids == 1, "depth 2: qid 2, 1 CID (%d)", err);
	o.depth = 2048;
	err = upcie_nvme_ioq_create(&q[2], &r.c, &o);
	CHECK(err == 0 && q[2].qid == 3, "depth 2048 = CAP.MQES + 1: qid 3 (%d)", err);
	o.depth = 2049;
	CHECK_EQ(upcie_nvme_ioq_create(&extra, &r.c, &o), -EINVAL, "depth 2049: -EINVAL");
	CHECK(!extra.live && !r.c.ioqs[4], "no identifier taken by the refusal");
	o.depth = 1;
	CHECK_EQ(upcie_nvme_ioq_create(&extra, &r.c, &o), -EINVAL, "depth 1: -EINVAL");
	err = upcie_nvme_ioq_delete(&q[1]);
	CHECK(err == 0 && !q[1].live && !r.c.ioqs[2] && !r.cm.q[2].sq && !r.cm.q[2].cq,
	      "delete qid 2: SQ and CQ deleted on the controller (%d)", err);
	memset(&o, 0, sizeof(o));
	err = upcie_nvme_ioq_create(&q[1], &r.c, &o);
	CHECK(err == 0 && q[1].qid == 2, "the next create reuses qid 2 (%d)", err);
	o.qid = 6;
	err = upcie_nvme_ioq_create(&q[3], &r.c, &o);
	CHECK(err == 0 && q[3].qid == 6, "explicit qid 6 (%d)", err);
	CHECK_EQ(upcie_nvme_ioq_create(&extra, &r.c, &o), -ENOSPC, "qid 6 again: -ENOSPC");
	o.qid = 9;
	CHECK_EQ(upcie_nvme_ioq_create(&extra, &r.c, &o), -ENOSPC,
		 "qid 9 beyond the 8 granted: -ENOSPC");
	o.qid = 0;
	ok = 1;
	for (int i = 4; i < 8; i++)
		ok &= upcie_nvme_ioq_create(&q[i], &r.c, &o) == 0;
	CHECK(ok && q[4].qid == 4 && q[7].qid == 8, "queues 4, 5, 7, 8 fill the gaps");
	CHECK_EQ(upcie_nvme_ioq_create(&q[8], &r.c, &o), -ENOSPC, "a ninth: -ENOSPC");
	ok = 1;
	for (int i = 0; i < 8; i++)
		ok &= upcie_nvme_ioq_delete(&q[i]) == 0;
	CHECK(ok, "all deleted");
	CHECK_EQ(upcie_nvme_ioq_delete(&q[0]), 0, "deleting again is a no-op");
	upcie_heap_stats_get(&r.c.heap, &st1);
	CHECK(st1.free_bytes == st0.free_bytes && st1.nalloc == st0.nalloc,
	      "host memory back to where it was (%llu free)", (unsigned long long)st1.free_bytes);

	/* Create I/O SQ fails: the CQ is deleted, the identifier and memory released */
	r.cm.fail_create_sq = UPCIE_NVME_SC_INVALID_FIELD;
	r.cm.n_delete_cq = 0;
	err = upcie_nvme_ioq_create(&extra, &r.c, NULL);
	CHECK_EQ(err, -EIO, "Create I/O SQ fails with a status: -EIO");
	CHECK(r.cm.n_delete_cq == 1 && !r.cm.q[1].cq, "its CQ was deleted again");
	upcie_heap_stats_get(&r.c.heap, &st1);
	CHECK(st1.free_bytes == st0.free_bytes && !r.c.ioqs[1] && !extra.live,
	      "identifier and memory released");
	r.cm.fail_create_sq = 0;
	err = upcie_nvme_ioq_create(&extra, &r.c, NULL);
	CHECK(err == 0 && extra.qid == 1, "and qid 1 is handed out again (%d)", err);
	upcie_nvme_ioq_delete(&extra);

	memset(&o, 0, sizeof(o));
	o.irq = true;
	CHECK_EQ(upcie_nvme_ioq_create(&extra, &r.c, &o), -EINVAL,
		 "interrupts without enabled vectors: -EINVAL");
	r.c.sgl = false;
	o.irq = false;
	o.sgl = true;
	CHECK_EQ(upcie_nvme_ioq_create(&extra, &r.c, &o), -EOPNOTSUPP,
		 "SGLs on a controller without: -EOPNOTSUPP");
	r.c.sgl = true;
	rig_teardown(&r);
}

/* Write [woff, +len) of mem to slba, read it back into [roff, +len). */
static int wr_rd(struct upcie_nvme_ioq *q, struct upcie_nvme_ns *ns, uint64_t slba,
		 const struct upcie_dmamem *mem, uint64_t woff, uint64_t roff, uint64_t len)
{
	int err = upcie_nvme_ioq_write_sync(q, ns, slba, mem, woff, len, NULL);

	return err ? err : upcie_nvme_ioq_read_sync(q, ns, slba, mem, roff, len, NULL);
}

static bool nonzero(const uint8_t *p, uint64_t len)
{
	for (uint64_t i = 0; i < len; i++)
		if (p[i])
			return true;
	return false;
}

static void t_io(void)
{
	struct upcie_nvme_ioq q, qs, small;
	struct upcie_nvme_ioq_opts o;
	struct upcie_nvme_ns ns, bad;
	struct upcie_nvme_cqe cqe;
	struct upcie_nvme_dseg segs[3];
	struct upcie_nvme_io io;
	struct upcie_nvme_req req;
	struct upcie_nvme_dsm_range *rg;
	uint8_t *d;
	struct rig r;
	int err;
	static const struct {
		uint64_t slba, off, len;
	} cases[] = {
		{ 0, 0, 512 },		    /* one block */
		{ 1, 0, 4096 },		    /* one page */
		{ 100, 512, 3 * 4096 },	    /* unaligned start, 4 pages: a PRP list */
		{ 200, 4096 - 512, 8192 },  /* PRP1 partial, 3 pages */
		{ 1000, 0, 512 * 1024 },    /* exactly MDTS */
		{ 2000, 1536, 1536 * 1024 } /* 1.5 MiB unaligned: split into 4 commands */
	};

	rig_setup(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	d = (uint8_t *)r.data.vaddr;
	err = upcie_nvme_ns_open(&ns, &r.c, 1);
	CHECK(err == 0 && ns.nsid == 1 && ns.lba_bytes == 512 && ns.nsze == NS_BLOCKS &&
		  ns.ms == 0 && ns.block_bytes == 512,
	      "namespace 1: 512 B blocks, %u blocks (%d)", NS_BLOCKS, err);
	CHECK_EQ(ns.block_shift, 9, "block shift 9: the hot path divides by shifting");
	CHECK_EQ(upcie_nvme_ns_open(&bad, &r.c, 2), -EIO,
		 "Identify Namespace 2: -EIO (invalid namespace)");
	upcie_nvme_ioq_create(&q, &r.c, NULL);
	for (unsigned i = 0; i < UPCIE_ARRAY_SIZE(cases); i++) {
		uint64_t len = cases[i].len, woff = cases[i].off, roff = 2 * MiB + cases[i].off;

		fill(d + woff, len, i + 1, 0);
		memset(d + roff, 0, len);
		err = wr_rd(&q, &ns, cases[i].slba, &r.data, woff, roff, len);
		CHECK(err == 0 && same(d + roff, len, i + 1, 0) &&
			  same(r.ns + cases[i].slba * LBA, len, i + 1, 0),
		      "write/read %llu bytes at LBA %llu from offset %llu: data verified (%d)",
		      (unsigned long long)len, (unsigned long long)cases[i].slba,
		      (unsigned long long)woff, err);
	}
	CHECK(r.cm.q[1].m.fetched == 2 * (UPCIE_ARRAY_SIZE(cases) + 2),
	      "the 1.5 MiB request went as 3 commands of 512 KiB each way (%llu fetched)",
	      (unsigned long long)r.cm.q[1].m.fetched);

	/* three segments: unaligned first, page-aligned middle and last */
	fill(d + 100 * 4096 + 1024, 3072, 77, 0);
	fill(d + 300 * 4096, 8192, 77, 3072);
	fill(d + 500 * 4096, 1024, 77, 3072 + 8192);
	segs[0].mem = segs[1].mem = segs[2].mem = &r.data;
	segs[0].off = 100 * 4096 + 1024;
	segs[0].len = 3072;
	segs[1].off = 300 * 4096;
	segs[1].len = 8192;
	segs[2].off = 500 * 4096;
	segs[2].len = 1024;
	memset(&io, 0, sizeof(io));
	io.opc = UPCIE_NVME_NVM_WRITE;
	io.slba = 3000;
	io.segs = segs;
	io.nsegs = 3;
	err = upcie_nvme_ioq_io_sync(&q, &ns, &io, 0, NULL);
	CHECK(err == 0 && same(r.ns + 3000 * LBA, 3072 + 8192 + 1024, 77, 0),
	      "write from three segments lands contiguously (%d)", err);
	segs[1].off = 301 * 4096 + 100; /* middle segment not page aligned */
	CHECK_EQ(upcie_nvme_ioq_io_sync(&q, &ns, &io, 0, NULL), -EINVAL,
		 "PRP rules: unaligned middle segment refused before submission");

	/* SGL queue */
	memset(&o, 0, sizeof(o));
	o.sgl = true;
	err = upcie_nvme_ioq_create(&qs, &r.c, &o);
	CHECK(err == 0 && qs.sgl, "SGL queue (%d)", err);
	fill(d + 777, 64 * 1024, 9, 0);
	err = wr_rd(&qs, &ns, 4000, &r.data, 777, 2 * MiB + 3, 64 * 1024);
	CHECK(err == 0 && same(d + 2 * MiB + 3, 64 * 1024, 9, 0),
	      "SGL write/read of 64 KiB at odd offsets across 17 granules (%d)", err);
	upcie_nvme_ioq_delete(&qs);

	/* typed errors */
	memset(&cqe, 0, sizeof(cqe));
	err = upcie_nvme_ioq_read_sync(&q, &ns, NS_BLOCKS, &r.data, 0, 512, &cqe);
	CHECK(err == -EIO && upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_LBA_RANGE,
	      "read past the end: -EIO, status LBA out of range (0x%03x)",
	      upcie_nvme_cqe_code(&cqe));
	bad = ns;
	bad.nsid = 2;
	err = upcie_nvme_ioq_read_sync(&q, &bad, 0, &r.data, 0, 512, &cqe);
	CHECK(err == -EIO && upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_INVALID_NS,
	      "read of namespace 2: -EIO, status invalid namespace (0x%03x)",
	      upcie_nvme_cqe_code(&cqe));
	CHECK_EQ(upcie_nvme_ioq_read_sync(&q, &ns, 0, &r.data, 0, 100, NULL), -EINVAL,
		 "100 bytes is not whole blocks: -EINVAL");

	/* flush, write zeroes, dsm, compare */
	memset(&req, 0, sizeof(req));
	err = upcie_nvme_ioq_sync(&q, upcie_nvme_ioq_flush(&q, &ns, &req), &req, 0, NULL);
	CHECK_EQ(err, 0, "flush");
	err = upcie_nvme_ioq_sync(&q, upcie_nvme_ioq_write_zeroes(&q, &ns, 1000, 8, 0, &req), &req,
				  0, NULL);
	CHECK(err == 0 && r.ns[1000 * LBA] == 0 && r.ns[1008 * LBA - 1] == 0 &&
		  r.ns[1008 * LBA] == rig_pat(5, 8 * 512),
	      "write zeroes of 8 blocks (%d)", err);
	rg = (struct upcie_nvme_dsm_range *)(d + 3 * MiB);
	upcie_nvme_dsm_range_set(&rg[0], 1010, 4, 0);
	upcie_nvme_dsm_range_set(&rg[1], 1020, 2, 0);
	err = upcie_nvme_ioq_sync(
	    &q, upcie_nvme_ioq_dsm(&q, &ns, &r.data, 3 * MiB, 2, UPCIE_NVME_DSM_AD, &req), &req, 0,
	    NULL);
	CHECK(err == 0 && r.ns[1010 * LBA] == 0 && r.ns[1022 * LBA - 1] == 0 &&
		  nonzero(r.ns + 1014 * LBA, LBA),
	      "dataset management deallocates two ranges (%d)", err);
	fill(d, 4096, 1234, 0);
	upcie_nvme_ioq_write_sync(&q, &ns, 5000, &r.data, 0, 4096, NULL);
	io.opc = UPCIE_NVME_NVM_COMPARE;
	io.slba = 5000;
	segs[0].mem = &r.data;
	segs[0].off = 0;
	segs[0].len = 4096;
	io.nsegs = 1;
	CHECK_EQ(upcie_nvme_ioq_io_sync(&q, &ns, &io, 0, NULL), 0, "compare equal data: 0");
	d[100] ^= 1;
	err = upcie_nvme_ioq_io_sync(&q, &ns, &io, 0, &cqe);
	CHECK(err == -EIO && upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_COMPARE_FAILED,
	      "compare different data: -EIO, compare failure (0x%03x)", upcie_nvme_cqe_code(&cqe));

	/* a shallow queue: async needs room for the whole request, sync feeds it */
	memset(&o, 0, sizeof(o));
	o.depth = 4;
	o.max_xfer = 64 * 1024;
	upcie_nvme_ioq_create(&small, &r.c, &o);
	CHECK_EQ(small.qp.ncids, 3, "depth 4: 3 commands in flight");
	fill(d, 2 * MiB, 55, 0);
	err = upcie_nvme_ioq_write_sync(&small, &ns, 0, &r.data, 0, 2 * MiB, NULL);
	CHECK(err == 0 && same(r.ns, 2 * MiB, 55, 0),
	      "2 MiB as 32 commands of 64 KiB through 3 slots (%d)", err);
	err = upcie_nvme_ioq_read(&small, &ns, 0, &r.data, 0, 192 * 1024, &req);
	CHECK_EQ(err, 0, "async 192 KiB = 3 commands fits");
	CHECK_EQ(upcie_nvme_ioq_read(&small, &ns, 0, &r.data, 0, 4096, &req), -EBUSY,
		 "while they are in flight the next request is -EBUSY");
	CHECK_EQ(upcie_nvme_ioq_wait(&small, &req, UPCIE_NSEC_PER_SEC), 0, "the 3 complete");
	CHECK_EQ(upcie_nvme_ioq_read(&small, &ns, 0, &r.data, 0, 256 * 1024, &req), -EINVAL,
		 "async 256 KiB = 4 commands can never fit: -EINVAL");
	upcie_nvme_ioq_delete(&small);
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

static void t_prp_chain(void)
{
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ioq_opts o;
	struct upcie_nvme_ns ns;
	uint8_t *d;
	struct rig r;
	int err;

	rig_setup(&r);
	r.cm.mdts = 0; /* unlimited */
	rig_start(&r);
	rig_ctrl(&r, NULL);
	d = (uint8_t *)r.data.vaddr;
	CHECK_EQ(r.c.max_xfer, UINT64_MAX, "MDTS 0: no limit");
	upcie_nvme_ns_open(&ns, &r.c, 1);
	memset(&o, 0, sizeof(o));
	o.max_xfer = 3 * MiB;
	o.depth = 8;
	err = upcie_nvme_ioq_create(&q, &r.c, &o);
	CHECK(err == 0 && q.lpages == 2, "3 MiB per command: two chained list pages per CID (%u)",
	      q.lpages);
	fill(d + 512, 3 * MiB, 31, 0);
	memset(r.ns, 0, 3 * MiB + 4096);
	err = upcie_nvme_ioq_write_sync(&q, &ns, 0, &r.data, 512, 3 * MiB, NULL);
	CHECK(err == 0 && same(r.ns, 3 * MiB, 31, 0) && r.cm.q[q.qid].m.fetched == 1,
	      "one Write of 3 MiB from an unaligned start: 769 PRP entries over 2 list pages (%d)",
	      err);
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

static int n_cb;
static void count_cb(struct upcie_nvme_req *req)
{
	(void)req;
	n_cb++;
}

static void t_abort(void)
{
	struct upcie_nvme_ctrl_opts o;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct upcie_nvme_req req;
	struct upcie_nvme_sqe sqe;
	struct rig r;
	uint16_t cid = 0;
	int err;

	rig_setup(&r);
	rig_start(&r);
	memset(&o, 0, sizeof(o));
	o.abort_timeout_ns = 200 * UPCIE_NSEC_PER_MSEC;
	rig_ctrl(&r, &o);
	upcie_nvme_ns_open(&ns, &r.c, 1);
	upcie_nvme_ioq_create(&q, &r.c, NULL);

	/* the controller holds the Read; Abort makes it complete with Abort Requested */
	r.cm.hold_opc = UPCIE_NVME_NVM_READ;
	memset(&req, 0, sizeof(req));
	req.cb = count_cb;
	n_cb = 0;
	upcie_nvme_qpair_next_cid(&q.qp, &cid);
	err = upcie_nvme_ioq_read(&q, &ns, 0, &r.data, 0, 4096, &req);
	CHECK_EQ(err, 0, "read submitted");
	err = upcie_nvme_ioq_wait(&q, &req, SHORT_WAIT);
	CHECK_EQ(err, -ETIMEDOUT, "held read: wait -ETIMEDOUT");
	CHECK(r.cm.n_abort == 1 && r.cm.last_abort_sqid == q.qid && r.cm.last_abort_cid == cid,
	      "admin Abort sent with SQID %u and CID %u", r.cm.last_abort_sqid,
	      r.cm.last_abort_cid);
	CHECK(req.done && req.err == -EIO &&
		  upcie_nvme_cqe_code(&req.cqe) == UPCIE_NVME_SC_ABORT_REQ && n_cb == 1,
	      "the request ended once, with the controller's Abort Requested status");
	CHECK(q.qp.ncancelled == 0 && upcie_nvme_qpair_inflight(&q.qp) == 0,
	      "nothing left cancelled or in flight");

	/* the controller does not abort: the command stays the controller's, the request pending */
	r.cm.abort_aborts = false;
	memset(&req, 0, sizeof(req));
	req.cb = count_cb;
	n_cb = 0;
	upcie_nvme_ioq_read(&q, &ns, 0, &r.data, 0, 4096, &req);
	err = upcie_nvme_ioq_wait(&q, &req, SHORT_WAIT);
	CHECK(err == -ETIMEDOUT && !req.done && n_cb == 0 && upcie_nvme_qpair_inflight(&q.qp) == 1,
	      "not aborted: -ETIMEDOUT, the request still pending, its buffer the controller's "
	      "(%d)",
	      err);
	r.cm.hold_opc = 0;

	/* the driver keeps its AERs: the caller's are refused */
	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = UPCIE_NVME_ADMIN_ASYNC_EVENT;
	err = upcie_nvme_ctrl_admin(&r.c, &sqe, NULL, 0, SHORT_WAIT, NULL);
	CHECK_EQ(err, -EINVAL, "a caller's AER while the driver keeps its own: refused");

	/* an admin command that never completes (held by the controller) */
	r.cm.abort_aborts = true;
	r.cm.hold_admin_opc = UPCIE_NVME_ADMIN_GET_FEATURES;
	upcie_nvme_cmd_get_num_queues(&sqe);
	err = upcie_nvme_ctrl_admin(&r.c, &sqe, NULL, 0, SHORT_WAIT, NULL);
	r.cm.hold_admin_opc = 0;
	CHECK(err == -ETIMEDOUT && r.cm.n_abort == 3 && r.cm.last_abort_sqid == 0,
	      "admin command times out: aborted on SQID 0 (%d)", err);
	CHECK(r.c.admin.ncancelled == 0 && upcie_nvme_qpair_inflight(&r.c.admin) == r.c.aer_out,
	      "and ended on the admin queue (only the driver's AERs outstanding)");
	err = upcie_nvme_ctrl_identify(&r.c, UPCIE_NVME_CNS_CTRL, 0, &r.c.id);
	CHECK_EQ(err, 0, "the admin queue keeps working");

	/* reset ends it: after the disable, with -ECANCELED */
	err = upcie_nvme_ctrl_reset(&r.c);
	CHECK(err == 0 && req.done && req.err == -ECANCELED && n_cb == 1 && q.qp.ncancelled == 0 &&
		  q.qp.nfree == q.qp.ncids,
	      "reset ends the pending request once with -ECANCELED, every CID free (%d)", err);
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

static void t_reset(void)
{
	struct upcie_nvme_ioq q1, q2, q3;
	struct upcie_nvme_ns ns;
	struct upcie_nvme_req req;
	struct upcie_nvme_ioq_opts o;
	uint8_t *d;
	struct rig r;
	uint64_t fetched, t0;
	uint32_t creates;
	int err;

	rig_setup(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	d = (uint8_t *)r.data.vaddr;
	upcie_nvme_ns_open(&ns, &r.c, 1);
	upcie_nvme_ioq_create(&q1, &r.c, NULL);
	memset(&o, 0, sizeof(o));
	o.depth = 16;
	o.qid = 5;
	upcie_nvme_ioq_create(&q2, &r.c, &o);
	r.cm.hold_opc = UPCIE_NVME_NVM_READ;
	memset(&req, 0, sizeof(req));
	req.cb = count_cb;
	n_cb = 0;
	fetched = __atomic_load_n(&r.cm.io_fetched, __ATOMIC_ACQUIRE);
	upcie_nvme_ioq_read(&q1, &ns, 0, &r.data, 0, 4096, &req);
	upcie_nvme_ioq_poll(&q1, 16);
	/* The model thread decides to hold a command when it fetches it: let it, or a loaded
	 * machine has it fetched after hold_opc is cleared, and the read simply completes. */
	t0 = upcie_time_ns();
	while (__atomic_load_n(&r.cm.io_fetched, __ATOMIC_ACQUIRE) == fetched &&
	       upcie_time_ns() - t0 < 5 * UPCIE_NSEC_PER_SEC)
		sched_yield();
	creates = r.cm.n_create_sq;
	r.cm.hold_opc = 0;
	err = upcie_nvme_ctrl_reset(&r.c);
	CHECK_EQ(err, 0, "reset with a command in flight");
	CHECK(req.done && req.err == -ECANCELED && n_cb == 1,
	      "the command in flight ended with -ECANCELED");
	CHECK(r.cm.n_enable == 2 && r.cm.n_set_queues == 2 && r.cm.n_create_sq == creates + 2,
	      "controller re-enabled, queues asked for and both I/O queues recreated");
	CHECK(q1.live && q1.qid == 1 && q2.live && q2.qid == 5 && r.cm.q[5].sq,
	      "same identifiers (1, 5)");
	fill(d, 8192, 81, 0);
	err = upcie_nvme_ioq_write_sync(&q2, &ns, 10, &r.data, 0, 8192, NULL);
	memset(d + MiB, 0, 8192);
	if (!err)
		err = upcie_nvme_ioq_read_sync(&q1, &ns, 10, &r.data, MiB, 8192, NULL);
	CHECK(err == 0 && same(d + MiB, 8192, 81, 0), "I/O on both queues after reset (%d)", err);

	/* shutdown, then reset brings everything back */
	err = upcie_nvme_ctrl_shutdown(&r.c);
	CHECK(err == 0 && r.c.state == UPCIE_NVME_CTRL_SHUTDOWN && r.cm.n_shutdown == 1,
	      "shutdown: CSTS.SHST complete (%d)", err);
	CHECK_EQ(upcie_nvme_ctrl_identify(&r.c, UPCIE_NVME_CNS_CTRL, 0, &r.c.id), -ENODEV,
		 "admin commands after shutdown: -ENODEV");
	err = upcie_nvme_ctrl_reset(&r.c);
	CHECK(err == 0 && r.c.state == UPCIE_NVME_CTRL_READY, "reset after shutdown (%d)", err);
	memset(d + MiB, 0, 8192);
	err = upcie_nvme_ioq_read_sync(&q2, &ns, 10, &r.data, MiB, 8192, NULL);
	CHECK(err == 0 && same(d + MiB, 8192, 81, 0), "I/O after shutdown and reset (%d)", err);

	/* the controller grants fewer queues after a reset: queue 5 cannot come back */
	r.cm.nqueues = 4;
	err = upcie_nvme_ctrl_reset(&r.c);
	CHECK(err == -ENOSPC && r.c.state == UPCIE_NVME_CTRL_FAILED && r.c.nslots == 8,
	      "reset with 4 queues granted, queue 5 open: -ENOSPC, state FAILED (%d)", err);
	r.cm.nqueues = 8;
	err = upcie_nvme_ctrl_reset(&r.c);
	CHECK(err == 0 && r.c.state == UPCIE_NVME_CTRL_READY && r.cm.q[5].sq,
	      "granted 8 again: the next reset brings queue 5 back (%d)", err);

	/* close deletes what is still open */
	upcie_nvme_ioq_create(&q3, &r.c, NULL);
	r.cm.n_delete_sq = 0;
	upcie_nvme_ctrl_close(&r.c);
	CHECK(!q1.live && !q2.live && !q3.live && r.cm.n_delete_sq == 3 && r.cm.n_shutdown == 2,
	      "close deleted the three open queues, then shut down");
	CHECK_EQ(upcie_nvme_ioq_delete(&q1), 0, "deleting a queue close took is a no-op");
	rig_teardown(&r);
}

struct worker {
	struct rig *r;
	struct upcie_nvme_ns *ns;
	int idx, errors, done;
};

static void *worker_fn(void *arg)
{
	struct worker *w = (struct worker *)arg;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ioq_opts o;
	uint8_t *d = (uint8_t *)w->r->data.vaddr + (uint64_t)w->idx * 256 * 1024;
	uint64_t off = (uint64_t)w->idx * 256 * 1024;

	memset(&o, 0, sizeof(o));
	o.depth = 8; /* wraps every 8 commands */
	if (upcie_nvme_ioq_create(&q, &w->r->c, &o)) {
		w->errors++;
		return NULL;
	}
	for (int i = 0; i < 100; i++) {
		uint64_t slba = (uint64_t)w->idx * 1024 + (uint64_t)(i % 16) * 16;

		fill(d, 8192, (uint32_t)(w->idx * 1000 + i), 0);
		memset(d + 65536, 0, 8192);
		if (upcie_nvme_ioq_write_sync(&q, w->ns, slba, &w->r->data, off, 8192, NULL) ||
		    upcie_nvme_ioq_read_sync(&q, w->ns, slba, &w->r->data, off + 65536, 8192,
					     NULL) ||
		    !same(d + 65536, 8192, (uint32_t)(w->idx * 1000 + i), 0))
			w->errors++;
		else
			w->done++;
	}
	if (upcie_nvme_ioq_delete(&q))
		w->errors++;
	return NULL;
}

static void t_threads(void)
{
	struct worker w[4];
	pthread_t th[4];
	struct upcie_nvme_ns ns;
	struct rig r;
	int errors = 0, done = 0;

	rig_setup(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	upcie_nvme_ns_open(&ns, &r.c, 1);
	for (int i = 0; i < 4; i++) {
		w[i].r = &r;
		w[i].ns = &ns;
		w[i].idx = i;
		w[i].errors = w[i].done = 0;
		pthread_create(&th[i], NULL, worker_fn, &w[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		errors += w[i].errors;
		done += w[i].done;
	}
	CHECK(errors == 0 && done == 400,
	      "4 threads, each creating its queue and doing 100 write/read pairs: %d verified, "
	      "%d errors",
	      done, errors);
	rig_teardown(&r);
}

int main(void)
{
	upcie_log_set_handler(rig_log, NULL);
	t_bringup();
	t_bringup_errors();
	t_queues();
	t_io();
	t_prp_chain();
	t_abort();
	t_reset();
	t_threads();
	return check_done();
}
