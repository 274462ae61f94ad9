/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Namespaces as real controllers report them, against the controller model with a namespace
 * table (nvme_ns_model.h): NSID gaps and the Active Namespace List, the sequential scan when
 * there is none (bounded, also for an absurd NN), a list that never ends, more than 16 LBA
 * formats, extended LBAs, protection information (PRACT with the controller making and checking
 * the PI, refused with a clear error where a metadata buffer is needed; the application tag
 * and its mask in CDW15, inserted by PRACT and checked by PRCHK), zoned namespaces (the I/O
 * command set from the descriptor list, the zone size, plain Writes refused, zoned Writes at
 * the write pointer, zone reset and report, named zoned statuses; Zone Append with the LBA the
 * controller assigned, its refusals, the Zone Append Size Limit, PI remapped), and Identify
 * data with absurd values: each one logged, counted in nbad_id, then clamped or refused.
 */
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#include "check.h"
#include "nvme_ctrl_rig.h"
#include "nvme_eo.h"

/* The namespaces of the example controller, plus a few. */
static void add_namespaces(struct rig *r)
{
	struct nvme_nsm_ns *n;

	nvme_nsm_add(&r->nsm, 3, 1024, 512, 8, true, 0, 0);			  /* extended LBA */
	nvme_nsm_add(&r->nsm, 5, 512, 4096, 8, false, UPCIE_NVME_DPS_PIT_1, 0);	  /* PI, separate */
	nvme_nsm_add(&r->nsm, 9, 512, 4096, 0, false, 0, 64);			  /* zoned */
	nvme_nsm_add(&r->nsm, 12, 2048, 4096, 0, false, 0, 0);			  /* plain */
	nvme_nsm_add(&r->nsm, 14, 256, 4096, 16, false, UPCIE_NVME_DPS_PIT_1, 0); /* PI + more */
	nvme_nsm_add(&r->nsm, 7, 256, 512, 8, true, UPCIE_NVME_DPS_PIT_3, 0);	  /* PI, extended */
	n = nvme_nsm_add(&r->nsm, 20, 256, 4096, 0, false, 0, 0); /* 41 formats, #35 in use */
	n->nlbaf = 40;
	n->lbaf = 35;
	r->cm.nn = 32;
}

/* The rig with every namespace of add_namespaces() in the model, started, controller up. */
static void rig_up_nsm(struct rig *r)
{
	rig_setup(r);
	add_namespaces(r);
	rig_use_nsm(r);
	rig_start(r);
	rig_ctrl(r, NULL);
}

static void t_list_and_open(void)
{
	struct upcie_nvme_ns ns;
	uint32_t ids[16], n = 0;
	struct rig r;
	int err;

	rig_setup(&r);
	add_namespaces(&r);
	rig_use_nsm(&r);
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	CHECK_EQ(err, 0, "bring-up with namespaces 3, 5, 7, 9, 12, 14, 20 of NN 32");
	err = upcie_nvme_ctrl_ns_list(&r.c, ids, 16, &n);
	CHECK(err == 0 && n == 7 && ids[0] == 3 && ids[1] == 5 && ids[2] == 7 && ids[3] == 9 &&
		  ids[4] == 12 && ids[5] == 14 && ids[6] == 20,
	      "active list with gaps: 7 namespaces, ascending (%d, %u)", err, n);

	err = upcie_nvme_ns_open(&ns, &r.c, 3);
	CHECK(err == 0 && ns.ext && ns.ms == 8 && ns.block_bytes == 520 && !ns.pi && !ns.zoned &&
		  ns.csi == UPCIE_NVME_CSI_NVM,
	      "nsid 3: extended LBA, 520-byte blocks in the data buffer");
	err = upcie_nvme_ns_open(&ns, &r.c, 5);
	CHECK(err == 0 && ns.pi == 1 && ns.pract && ns.block_bytes == 4096 && ns.slow,
	      "nsid 5: PI type 1, 8 bytes of metadata: driven with PRACT, 4096-byte blocks");
	err = upcie_nvme_ns_open(&ns, &r.c, 7);
	CHECK(err == 0 && ns.pi == 3 && ns.pract && ns.ext && ns.block_bytes == 512,
	      "nsid 7: PI type 3 as extended LBA: PRACT, no metadata in the data buffer");
	err = upcie_nvme_ns_open(&ns, &r.c, 9);
	CHECK(err == 0 && ns.zoned && ns.csi == UPCIE_NVME_CSI_ZNS && ns.zone_blocks == 64,
	      "nsid 9: zoned (CSI 2 from the descriptor list), 64-block zones (CNS 05h)");
	err = upcie_nvme_ns_open(&ns, &r.c, 14);
	CHECK(err == 0 && ns.pi == 1 && !ns.pract && ns.ms == 16,
	      "nsid 14: PI in 16 bytes of metadata: the caller's metadata buffer carries it");
	err = upcie_nvme_ns_open(&ns, &r.c, 20);
	CHECK(err == 0 && ns.lbaf == 35 && ns.lba_bytes == 4096,
	      "nsid 20: 41 LBA formats, format 35 in use (FLBAS bits 6:5), 4 KiB");
	err = upcie_nvme_ns_open(&ns, &r.c, 4);
	CHECK_EQ(err, -ENODEV, "nsid 4 (a gap below NN): not active");
	err = upcie_nvme_ns_open(&ns, &r.c, 33);
	CHECK_EQ(err, -EIO, "nsid 33 (beyond NN): Invalid Namespace");
	CHECK_EQ(r.c.nbad_id, 0, "nothing absurd counted for sane namespaces");
	rig_teardown(&r);
}

static void t_list_scan(void)
{
	uint32_t ids[16], n = 0;
	struct rig r;
	int err;

	/* NVMe 1.0: no Active Namespace List; NN 32 */
	rig_setup(&r);
	add_namespaces(&r);
	r.nsm.no_active_list = true;
	rig_use_nsm(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	r.nsm.n_identify_ns = 0;
	err = upcie_nvme_ctrl_ns_list(&r.c, ids, 16, &n);
	CHECK(err == 0 && n == 7 && ids[0] == 3 && ids[6] == 20,
	      "no Active Namespace List: the scan finds the same 7 (%d, %u)", err, n);
	CHECK_EQ(r.nsm.n_identify_ns, 32, "by asking NSIDs 1..NN");
	rig_teardown(&r);

	/* absurd NN: the scan stops at UPCIE_NVME_NS_SCAN_MAX */
	rig_setup(&r);
	add_namespaces(&r);
	r.nsm.no_active_list = true;
	r.cm.nn = 0xfffffffe;
	rig_use_nsm(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	r.nsm.n_identify_ns = 0;
	err = upcie_nvme_ctrl_ns_list(&r.c, ids, 16, &n);
	CHECK(err == 0 && n == 7 && r.nsm.n_identify_ns == UPCIE_NVME_NS_SCAN_MAX,
	      "NN 0xfffffffe: %u Identify commands, not four billion (%d, %u)", r.nsm.n_identify_ns,
	      err, n);
	rig_teardown(&r);

	/* an Active Namespace List that never ends: the same full page for any start */
	rig_setup(&r);
	add_namespaces(&r);
	r.nsm.endless_list = true;
	rig_use_nsm(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	err = upcie_nvme_ctrl_ns_list(&r.c, ids, 16, &n);
	CHECK(err == 0 && n == 1024 && r.nsm.n_list == 2,
	      "endless list: the second page does not ascend, the walk ends (%d, %u, %u pages)",
	      err, n, r.nsm.n_list);
	CHECK_EQ(r.c.nbad_id, 1, "and the bad page is counted");
	rig_teardown(&r);
}

static void over_nlbaf(struct upcie_nvme_id_ns *id)
{
	id->nlbaf = 200;
}
static void over_lbads(struct upcie_nvme_id_ns *id)
{
	id->lbaf[id->flbas & 0xf].lbads = 70;
}
static void over_lbads_small(struct upcie_nvme_id_ns *id)
{
	id->lbaf[id->flbas & 0xf].lbads = 3;
}
static void over_flbas(struct upcie_nvme_id_ns *id)
{
	id->nlbaf = 1;
	id->flbas = 7;
}
static void over_nsze(struct upcie_nvme_id_ns *id)
{
	id->nsze = id->ncap = UINT64_C(1) << 60; /* 2^72 bytes of 4 KiB blocks */
}
static void over_ncap(struct upcie_nvme_id_ns *id)
{
	id->ncap = id->nsze + 100;
}
static void over_dps(struct upcie_nvme_id_ns *id)
{
	id->dps = 5;
}
static void over_pi_ms(struct upcie_nvme_id_ns *id)
{
	id->dps = 1; /* PI without room for it */
}

static void t_absurd_ns(void)
{
	static const struct {
		void (*fn)(struct upcie_nvme_id_ns *);
		int err;
		const char *what;
	} cases[] = {
		{ over_nlbaf, 0, "NLBAF 200: clamped to 63, namespace usable" },
		{ over_lbads, -EINVAL, "LBADS 70: refused" },
		{ over_lbads_small, -EINVAL, "LBADS 3: refused" },
		{ over_flbas, -EINVAL, "FLBAS index 7 of 2 formats: refused" },
		{ over_nsze, -EINVAL, "NSZE 2^60 blocks of 4 KiB: refused" },
		{ over_ncap, 0, "NCAP above NSZE: clamped, usable" },
		{ over_dps, -EINVAL, "protection type 5: refused" },
		{ over_pi_ms, -EINVAL, "PI type 1 without metadata: refused" },
	};
	struct upcie_nvme_ns ns;
	struct rig r;

	for (size_t i = 0; i < UPCIE_ARRAY_SIZE(cases); i++) {
		int err;

		rig_setup(&r);
		add_namespaces(&r);
		r.nsm.over_nsid = 12;
		r.nsm.over = cases[i].fn;
		rig_use_nsm(&r);
		rig_start(&r);
		rig_ctrl(&r, NULL);
		err = upcie_nvme_ns_open(&ns, &r.c, 12);
		CHECK(err == cases[i].err && r.c.nbad_id == 1, "%s (%d, counted %u)", cases[i].what,
		      err, r.c.nbad_id);
		if (!err)
			CHECK(ns.ncap <= ns.nsze && ns.lba_bytes == 4096,
			      "  and what was kept is sane");
		rig_teardown(&r);
	}

	/* command sets: a malformed descriptor list, none at all, an unknown set */
	rig_setup(&r);
	add_namespaces(&r);
	r.nsm.bad_desc_list = true;
	rig_use_nsm(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	CHECK(upcie_nvme_ns_open(&ns, &r.c, 12) == -EPROTO && r.c.nbad_id == 1,
	      "a descriptor that runs past the page: -EPROTO, counted");
	rig_teardown(&r);

	rig_setup(&r);
	add_namespaces(&r);
	r.nsm.no_desc_list = true;
	rig_use_nsm(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	CHECK(upcie_nvme_ns_open(&ns, &r.c, 12) == 0 && ns.csi == UPCIE_NVME_CSI_NVM,
	      "no descriptor list (before NVMe 1.3): the NVM command set");
	rig_teardown(&r);

	rig_setup(&r);
	add_namespaces(&r);
	nvme_nsm_find(&r.nsm, 12)->csi = UPCIE_NVME_CSI_KV;
	rig_use_nsm(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	CHECK_EQ(upcie_nvme_ns_open(&ns, &r.c, 12), -EOPNOTSUPP,
		 "a Key Value namespace: -EOPNOTSUPP, never driven as NVM");
	rig_teardown(&r);

	/* CC.CSS = NVM (CAP.CSS without bit 6): no descriptor list is asked for */
	rig_setup(&r);
	add_namespaces(&r);
	nvme_cmodel_set_cap(&r.cm, nvme_cmodel_cap(2048, 8, 0x01, 0, 0));
	rig_use_nsm(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	CHECK(upcie_nvme_ns_open(&ns, &r.c, 12) == 0 && r.nsm.n_desc == 0,
	      "CC.CSS = NVM: only NVM namespaces are active, no CNS 03h sent");
	rig_teardown(&r);
}

static void t_absurd_ctrl(void)
{
	static struct upcie_nvme_ctrl c;

	memset(&c, 0, sizeof(c));
	snprintf(c.name, sizeof(c.name), "fake");
	c.cap = 0; /* MPSMIN 4 KiB */
	c.id.sqes = 0x66;
	c.id.cqes = 0x44;
	c.id.mdts = 7;
	c.id.nn = 3;
	memcpy(c.id.mn, "model\x1b[2Jx\x01", 11);
	CHECK_EQ(upcie_nvme_ctrl_id_apply_(&c), 0, "sane Identify Controller");
	CHECK(c.max_xfer == 512 * 1024 && c.nn == 3 && c.nbad_id == 0 &&
		  c.admin_dptr.max_bytes == 512 * 1024,
	      "MDTS 7: 512 KiB, admin transfers at most that");
	CHECK(!strcmp(c.mn, "model?[2Jx?"), "escape and control bytes in MN print as '?': '%s'",
	      c.mn);
	c.id.mdts = 255;
	c.id.nn = UPCIE_NVME_NSID_ALL;
	c.id.sgls = 3;
	CHECK_EQ(upcie_nvme_ctrl_id_apply_(&c), 0, "absurd MDTS, NN and SGLS");
	CHECK(c.max_xfer == UINT64_MAX && c.nn == 0xfffffffe && !c.sgl && c.nbad_id == 3,
	      "MDTS 255: no limit; NN 0xffffffff: 0xfffffffe; SGLS 3: no SGLs; 3 counted (%u)",
	      c.nbad_id);
	c.id.mdts = 1;
	upcie_nvme_ctrl_id_apply_(&c);
	CHECK(c.max_xfer == 8192 && c.admin_dptr.max_bytes == 8192,
	      "MDTS 1: 8 KiB, for the admin queue too");
	c.id.sqes = 0x77;
	CHECK_EQ(upcie_nvme_ctrl_id_apply_(&c), -EOPNOTSUPP, "SQ entries of 128 bytes: refused");
}

/* Write then read `len` bytes at `slba` of `ns` through data memory offset 0 / len. */
static int wr_rd(struct rig *r, struct upcie_nvme_ioq *q, struct upcie_nvme_ns *ns, uint64_t slba,
		 uint64_t len, uint32_t tag)
{
	uint8_t *va = (uint8_t *)r->data_va;
	int err;

	rig_fill(va, len, tag);
	memset(va + len, 0, len);
	err = upcie_nvme_ioq_write_sync(q, ns, slba, &r->data, 0, len, NULL);
	if (!err)
		err = upcie_nvme_ioq_read_sync(q, ns, slba, &r->data, len, len, NULL);
	if (!err && !rig_same(va + len, len, tag))
		err = -EBADMSG;
	return err;
}

/* A 4 KiB Write from the start of the data memory, its metadata at 8 MiB of host memory. */
static void md_write(struct upcie_nvme_io *io, struct upcie_nvme_dseg *seg, struct rig *r)
{
	memset(io, 0, sizeof(*io));
	seg->mem = &r->data;
	seg->off = 0;
	seg->len = 4096;
	io->opc = UPCIE_NVME_NVM_WRITE;
	io->segs = seg;
	io->nsegs = 1;
	io->md = &r->host;
	io->md_off = 8 * RIG_MiB;
}

static void t_pi(void)
{
	struct upcie_nvme_ns ns5, ns7, ns14;
	struct upcie_nvme_ioq q;
	struct nvme_nsm_ns *m5, *m7;
	struct upcie_nvme_cqe cqe;
	struct upcie_nvme_io io;
	struct upcie_nvme_dseg seg;
	uint8_t *pi;
	struct rig r;
	int err;

	memset(&cqe, 0, sizeof(cqe)); /* the sync calls fill it only once they submitted */
	rig_up_nsm(&r);
	upcie_nvme_ns_open(&ns5, &r.c, 5);
	upcie_nvme_ns_open(&ns7, &r.c, 7);
	upcie_nvme_ns_open(&ns14, &r.c, 14);
	err = upcie_nvme_ioq_create(&q, &r.c, NULL);
	CHECK_EQ(err, 0, "I/O queue");
	m5 = nvme_nsm_find(&r.nsm, 5);
	m7 = nvme_nsm_find(&r.nsm, 7);

	err = wr_rd(&r, &q, &ns5, 10, 3 * 4096, 55);
	CHECK_EQ(err, 0, "PI type 1 namespace without a metadata buffer: write, read, verified");
	CHECK(m5->n_pract == 2 &&
		  (m5->last_cdw12 &
		   (UPCIE_NVME_RW_PRACT | UPCIE_NVME_RW_PRCHK_GUARD | UPCIE_NVME_RW_PRCHK_REF)) ==
		      (UPCIE_NVME_RW_PRACT | UPCIE_NVME_RW_PRCHK_GUARD | UPCIE_NVME_RW_PRCHK_REF) &&
		  m5->last_cdw14 == 10 && m5->last_mptr == 0,
	      "both with PRACT, guard and reference checks, ILBRT = SLBA 10, no MPTR");
	pi = nvme_nsm_pi_at_(m5, 11);
	CHECK((uint16_t)(pi[0] << 8 | pi[1]) == nvme_nsm_crc16(m5->data + 11 * 4096, 4096) &&
		  pi[7] == 11 && pi[6] == 0,
	      "the controller stored a CRC guard and reference tag 11 for LBA 11");
	/* negative control: data changed under the PI is caught by the read's guard check */
	m5->data[11 * 4096 + 7] ^= 1;
	err = upcie_nvme_ioq_read_sync(&q, &ns5, 10, &r.data, 0, 3 * 4096, &cqe);
	CHECK(err == -EIO && upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_GUARD_CHECK,
	      "a corrupted block reads as a guard check error (0x%03x), never as data",
	      upcie_nvme_cqe_code(&cqe));

	err = wr_rd(&r, &q, &ns7, 3, 4 * 512, 77);
	CHECK(err == 0 && m7->n_pract == 2 && !(m7->last_cdw12 & UPCIE_NVME_RW_PRCHK_REF),
	      "PI type 3, extended LBA: 512-byte blocks in the buffer, PRACT, no reference check");

	err = upcie_nvme_ioq_write_sync(&q, &ns14, 0, &r.data, 0, 4096, NULL);
	CHECK_EQ(err, -EINVAL, "PI inside 16 bytes of separate metadata, no md: refused");
	md_write(&io, &seg, &r);
	err = upcie_nvme_ioq_io_sync(&q, &ns14, &io, 0, NULL);
	CHECK(err == 0 && !(nvme_nsm_find(&r.nsm, 14)->last_cdw12 & UPCIE_NVME_RW_PRACT) &&
		  nvme_nsm_find(&r.nsm, 14)->last_mptr == RIG_HOST_IOVA + 8 * RIG_MiB,
	      "with a metadata buffer: the caller's PI travels through MPTR, no PRACT");
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

/*
 * Extended LBA formats (CNS 05h, CSI 00h, CTRATT.ELBAS): a PI namespace whose format has a
 * storage tag, or a 64-bit guard, gets no I/O that asks the controller to read PI fields upcie
 * lays out for the 16-bit guard format only (the reference tag would land in storage tag
 * bits); the control is the same namespace without them. I/O without PRACT/PRCHK, the PI in a
 * metadata buffer, still works.
 */
static void t_elbaf(void)
{
	static const struct {
		uint8_t pif, sts;
		int err;
	} cases[] = { { 0, 0, 0 }, { 0, 16, -EOPNOTSUPP }, { 2, 0, -EOPNOTSUPP } };

	for (unsigned i = 0; i < UPCIE_ARRAY_SIZE(cases); i++) {
		struct upcie_nvme_ns ns, ns16;
		struct upcie_nvme_ioq q;
		struct nvme_nsm_ns *m, *m16;
		struct upcie_nvme_io io;
		struct upcie_nvme_dseg seg;
		struct upcie_nvme_req wz;
		struct rig r;
		uint32_t io0;
		int err;

		rig_setup(&r);
		r.cm.oncs = UPCIE_NVME_ONCS_WRITE_ZEROES;
		m = nvme_nsm_add(&r.nsm, 5, 512, 4096, 8, false, UPCIE_NVME_DPS_PIT_1, 0);
		m16 = nvme_nsm_add(&r.nsm, 6, 512, 4096, 16, false, UPCIE_NVME_DPS_PIT_1, 0);
		m->pif = m16->pif = cases[i].pif;
		m->sts = m16->sts = cases[i].sts;
		rig_use_nsm(&r);
		r.cm.ctratt = UPCIE_NVME_CTRATT_ELBAS;
		rig_start(&r);
		rig_ctrl(&r, NULL);
		err = upcie_nvme_ns_open(&ns, &r.c, 5);
		if (!err)
			err = upcie_nvme_ns_open(&ns16, &r.c, 6);
		if (!err)
			err = upcie_nvme_ioq_create(&q, &r.c, NULL);
		CHECK(err == 0 && ns.pif == cases[i].pif && ns.sts == cases[i].sts &&
			  r.nsm.n_cs_ns >= 2,
		      "ELBAF read: PIF %u, STS %u (%d)", ns.pif, ns.sts, err);
		io0 = m->n_io;
		err = upcie_nvme_ioq_write_sync(&q, &ns, 0, &r.data, 0, 4096, NULL);
		CHECK(err == cases[i].err && m->n_io == io0 + (cases[i].err ? 0 : 1),
		      "%sPI with PIF %u, STS %u: a PRACT Write %s (%d)",
		      cases[i].err ? "" : "control: ", cases[i].pif, cases[i].sts,
		      cases[i].err ? "refused, nothing sent" : "goes", err);
		memset(&wz, 0, sizeof(wz));
		io0 = m->n_io;
		err = upcie_nvme_ioq_sync(&q, upcie_nvme_ioq_write_zeroes(&q, &ns, 0, 1, 0, &wz),
					  &wz, 0, NULL);
		CHECK(err == cases[i].err && m->n_io == io0 + (cases[i].err ? 0 : 1),
		      "PIF %u, STS %u: Write Zeroes (PRACT) %s (%d)", cases[i].pif, cases[i].sts,
		      cases[i].err ? "refused" : "goes", err);
		md_write(&io, &seg, &r);
		io0 = m16->n_io;
		err = upcie_nvme_ioq_io_sync(&q, &ns16, &io, 0, NULL);
		CHECK(err == 0 && m16->n_io == io0 + 1,
		      "PIF %u, STS %u: a Write with the PI in the metadata buffer, no PRCHK, goes "
		      "(%d)",
		      cases[i].pif, cases[i].sts, err);
		io.flags = UPCIE_NVME_RW_PRCHK_REF;
		err = upcie_nvme_ioq_io_sync(&q, &ns16, &io, 0, NULL);
		CHECK(err == (cases[i].err ? cases[i].err : 0) &&
			  m16->n_io == io0 + (cases[i].err ? 1 : 2),
		      "PIF %u, STS %u: with a reference tag check: %s (%d)", cases[i].pif,
		      cases[i].sts, cases[i].err ? "refused" : "goes", err);
		upcie_nvme_ioq_delete(&q);
		rig_teardown(&r);
	}
}

static void t_zoned(void)
{
	struct upcie_nvme_ns ns;
	struct upcie_nvme_ioq q;
	struct nvme_nsm_ns *m;
	struct upcie_nvme_cqe cqe;
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_req req;
	struct upcie_nvme_io io;
	struct upcie_nvme_dseg seg;
	const struct upcie_nvme_zone_desc *zd;
	uint8_t *va;
	uint32_t n_io;
	struct rig r;
	int err;

	rig_up_nsm(&r);
	upcie_nvme_ns_open(&ns, &r.c, 9);
	upcie_nvme_ioq_create(&q, &r.c, NULL);
	m = nvme_nsm_find(&r.nsm, 9);
	va = (uint8_t *)r.data_va;

	n_io = m->n_io;
	err = upcie_nvme_ioq_write_sync(&q, &ns, 0, &r.data, 0, 4096, NULL);
	CHECK(err == -EOPNOTSUPP && m->n_io == n_io,
	      "a plain Write to a zoned namespace: refused before it reaches the drive");
	memset(&req, 0, sizeof(req));
	CHECK_EQ(upcie_nvme_ioq_write_zeroes(&q, &ns, 0, 1, 0, &req), -EOPNOTSUPP,
		 "Write Zeroes too");

	rig_fill(va, 8192, 9);
	memset(&io, 0, sizeof(io));
	seg.mem = &r.data;
	seg.off = 0;
	seg.len = 8192;
	io.opc = UPCIE_NVME_NVM_WRITE;
	io.slba = 64; /* zone 1 */
	io.segs = &seg;
	io.nsegs = 1;
	io.zoned = true;
	err = upcie_nvme_ioq_io_sync(&q, &ns, &io, 0, NULL);
	CHECK(err == 0 && m->wp[1] == 66, "zoned Write at zone 1's write pointer: wp 66");
	err = upcie_nvme_ioq_read_sync(&q, &ns, 64, &r.data, 8192, 8192, NULL);
	CHECK(err == 0 && rig_same(va + 8192, 8192, 9), "read back verified");
	err = upcie_nvme_ioq_io_sync(&q, &ns, &io, 0, &cqe);
	CHECK(err == -EIO && upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_ZONE_INVALID_WRITE,
	      "the same Write again, behind the write pointer: %s",
	      upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)));

	/* report zones from zone 1 into host memory, then reset zone 1 */
	upcie_nvme_cmd_zone_report(&sqe, ns.nsid, 64, 4096, true);
	seg.mem = &r.host;
	seg.off = 9 * RIG_MiB;
	seg.len = 4096;
	memset(&req, 0, sizeof(req));
	err = upcie_nvme_ioq_sync(&q, upcie_nvme_ioq_submit_cmd(&q, &sqe, &seg, 1, &req), &req, 0,
				  NULL);
	zd = (const struct upcie_nvme_zone_desc *)((uint8_t *)r.host_va + 9 * RIG_MiB + 64);
	CHECK(err == 0 &&
		  upcie_nvme_zone_report_count((uint8_t *)r.host_va + 9 * RIG_MiB, 4096) == 7 &&
		  zd[0].zslba == 64 && zd[0].wp == 66 && (zd[0].zs >> 4) == UPCIE_NVME_ZS_IOPEN &&
		  (zd[1].zs >> 4) == UPCIE_NVME_ZS_EMPTY,
	      "Report Zones: 7 zones from 64, zone 1 open at 66, zone 2 empty");
	upcie_nvme_cmd_zone_mgmt_send(&sqe, ns.nsid, 64, UPCIE_NVME_ZSA_RESET, false);
	memset(&req, 0, sizeof(req));
	err = upcie_nvme_ioq_sync(&q, upcie_nvme_ioq_submit_cmd(&q, &sqe, NULL, 0, &req), &req, 0,
				  NULL);
	CHECK(err == 0 && m->wp[1] == 64, "zone 1 reset: write pointer back at 64");
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

/* One request through the synchronous helper; the completion into *cqe (may be NULL). */
static int io_sync(struct upcie_nvme_ioq *q, struct upcie_nvme_ns *ns, uint8_t opc, uint64_t slba,
		   const struct upcie_dmamem *mem, uint64_t off, uint64_t len, uint32_t flags,
		   uint16_t apptag, uint16_t mask, struct upcie_nvme_cqe *cqe)
{
	struct upcie_nvme_dseg seg = { .mem = mem, .off = off, .len = len };
	struct upcie_nvme_io io;

	memset(&io, 0, sizeof(io));
	io.opc = opc;
	io.slba = slba;
	io.segs = &seg;
	io.nsegs = 1;
	io.flags = flags;
	io.apptag = apptag;
	io.apptag_mask = mask;
	if (cqe)
		memset(cqe, 0, sizeof(*cqe));
	return upcie_nvme_ioq_io_sync(q, ns, &io, 0, cqe);
}

/*
 * The application tag (CDW15): zero by default on every path, carried as given, inserted by
 * PRACT on writes, checked under its mask by reads with PRCHK for the application tag; a read
 * expecting another tag fails with the controller's application tag check status (negative
 * control), and a mask that leaves the differing bits out lets it through.
 */
static void t_apptag(void)
{
	struct upcie_nvme_ns ns5, ns12;
	struct upcie_nvme_ioq q;
	struct nvme_nsm_ns *m5, *m12;
	struct upcie_nvme_cqe cqe;
	uint8_t *pi;
	struct rig r;
	int err;

	rig_up_nsm(&r);
	upcie_nvme_ns_open(&ns5, &r.c, 5);
	upcie_nvme_ns_open(&ns12, &r.c, 12);
	err = upcie_nvme_ioq_create(&q, &r.c, NULL);
	CHECK_EQ(err, 0, "apptag: I/O queue");
	m5 = nvme_nsm_find(&r.nsm, 5);
	m12 = nvme_nsm_find(&r.nsm, 12);

	/* the defaults: the one-call helpers (a zeroed struct) send CDW15 0 */
	m12->last_cdw15 = 0xdeadbeef;
	err = upcie_nvme_ioq_write_sync(&q, &ns12, 0, &r.data, 0, 4096, NULL);
	CHECK(err == 0 && m12->last_cdw15 == 0, "a plain Write (the fast path): CDW15 0 (0x%x)",
	      m12->last_cdw15);
	m5->last_cdw15 = 0xdeadbeef;
	err = upcie_nvme_ioq_write_sync(&q, &ns5, 40, &r.data, 0, 4096, NULL);
	pi = nvme_nsm_pi_at_(m5, 40);
	CHECK(err == 0 && m5->last_cdw15 == 0 && pi[2] == 0 && pi[3] == 0,
	      "a PRACT Write without a tag: CDW15 0, application tag 0 stored (0x%x)",
	      m5->last_cdw15);

	/* carried as given, also where no PI reads it (the fast path too) */
	err = io_sync(&q, &ns12, UPCIE_NVME_NVM_READ, 0, &r.data, 0, 4096, 0, 0xbeef, 0x0ff0, NULL);
	CHECK(err == 0 && m12->last_cdw15 == 0x0ff0beef,
	      "a Read with apptag 0xbeef, mask 0x0ff0: CDW15 0x0ff0beef (0x%x)", m12->last_cdw15);

	/* PRACT inserts the tag; PRCHK checks it */
	rig_fill(r.data_va, 3 * 4096, 21);
	err = io_sync(&q, &ns5, UPCIE_NVME_NVM_WRITE, 50, &r.data, 0, 3 * 4096, 0, 0x1234, 0xffff,
		      NULL);
	pi = nvme_nsm_pi_at_(m5, 52);
	CHECK(err == 0 && m5->last_cdw15 == 0xffff1234 && pi[2] == 0x12 && pi[3] == 0x34 &&
		  (m5->last_cdw12 & UPCIE_NVME_RW_PRACT),
	      "a PRACT Write with apptag 0x1234: CDW15 0xffff1234, tag 0x1234 stored with LBA 52");
	err = io_sync(&q, &ns5, UPCIE_NVME_NVM_READ, 50, &r.data, 3 * 4096, 3 * 4096,
		      UPCIE_NVME_RW_PRCHK_APP, 0x1234, 0xffff, &cqe);
	CHECK(err == 0 && (m5->last_cdw12 & UPCIE_NVME_RW_PRCHK_APP) &&
		  rig_same((uint8_t *)r.data_va + 3 * 4096, 3 * 4096, 21),
	      "a Read checking apptag 0x1234: passes, data verified (%d)", err);
	err = io_sync(&q, &ns5, UPCIE_NVME_NVM_READ, 50, &r.data, 3 * 4096, 3 * 4096,
		      UPCIE_NVME_RW_PRCHK_APP, 0x4321, 0xffff, &cqe);
	CHECK(err == -EIO && upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_APPTAG_CHECK,
	      "negative control: expecting apptag 0x4321 fails with %s (0x%03x)",
	      upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)), upcie_nvme_cqe_code(&cqe));
	err = io_sync(&q, &ns5, UPCIE_NVME_NVM_READ, 50, &r.data, 3 * 4096, 3 * 4096, 0, 0x4321,
		      0xffff, &cqe);
	CHECK_EQ(err, 0, "the same Read without PRCHK for the tag: not checked, passes");
	err = io_sync(&q, &ns5, UPCIE_NVME_NVM_READ, 50, &r.data, 3 * 4096, 3 * 4096,
		      UPCIE_NVME_RW_PRCHK_APP, 0x12ff, 0xff00, &cqe);
	CHECK_EQ(err, 0, "expecting 0x12ff under mask 0xff00: only the high byte compared, passes");
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

/* A request whose callback reads the LBA its Zone Append was given. */
struct append_req {
	struct upcie_nvme_req req;
	int calls, err, lba_err;
	uint64_t lba;
};

static void append_cb(struct upcie_nvme_req *req)
{
	struct append_req *a = (struct append_req *)req->ctx;

	a->calls++;
	a->err = req->err;
	a->lba = UINT64_MAX;
	a->lba_err = upcie_nvme_req_append_lba(req, &a->lba);
}

/* Zone Append of `len` bytes at `off` of `mem` to the zone at `zslba`, waited for. Returns the
 * submission's error, else the wait's. */
static int append(struct upcie_nvme_ioq *q, struct upcie_nvme_ns *ns, uint64_t zslba,
		  const struct upcie_dmamem *mem, uint64_t off, uint64_t len, struct append_req *a)
{
	struct upcie_nvme_dseg seg = { .mem = mem, .off = off, .len = len };
	struct upcie_nvme_io io;
	int err;

	memset(a, 0, sizeof(*a));
	a->req.cb = append_cb;
	a->req.ctx = a;
	a->lba_err = 1;
	memset(&io, 0, sizeof(io));
	io.opc = UPCIE_NVME_ZNS_APPEND;
	io.slba = zslba;
	io.segs = &seg;
	io.nsegs = 1;
	err = upcie_nvme_ioq_submit_io(q, ns, &io, &a->req);
	if (err)
		return err;
	return upcie_nvme_ioq_wait(q, &a->req, UPCIE_NSEC_PER_SEC);
}

/*
 * Zone Append: the command names the zone (ZSLBA, opcode 0x7d); the controller writes at the
 * write pointer and the callback reads the LBA it assigned, which the data really went to;
 * an LBA the controller gets wrong reaches the caller as such (the caller's check is the
 * guard). Refused before anything is sent: not a zone's first LBA, a namespace that is not
 * zoned, more than one command. ZASL: read from the zoned Identify Controller (0: MDTS), and a
 * larger append fails at the controller. On PI type 1 the reference tags are remapped from
 * the zone's start to where the data landed (PIREMAP), so a read with the reference check
 * passes.
 */
static void t_zone_append(void)
{
	struct upcie_nvme_ns ns, ns12, nspi;
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ioq q, q8k;
	struct nvme_nsm_ns *m, *mpi;
	struct upcie_nvme_cqe cqe;
	struct append_req a;
	uint64_t max = 0;
	uint8_t *va, *pi;
	uint32_t n_io;
	struct rig r;
	int err;

	rig_setup(&r);
	add_namespaces(&r);
	mpi = nvme_nsm_add(&r.nsm, 10, 256, 4096, 8, false, UPCIE_NVME_DPS_PIT_1, 64);
	rig_use_nsm(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	upcie_nvme_ns_open(&ns, &r.c, 9);
	upcie_nvme_ns_open(&ns12, &r.c, 12);
	err = upcie_nvme_ns_open(&nspi, &r.c, 10);
	CHECK(err == 0 && nspi.zoned && nspi.pract, "a zoned namespace with PI type 1 (%d)", err);
	err = upcie_nvme_ioq_create(&q, &r.c, NULL);
	CHECK_EQ(err, 0, "append: I/O queue");
	m = nvme_nsm_find(&r.nsm, 9);
	va = (uint8_t *)r.data_va;

	rig_fill(va, 8192, 31);
	err = append(&q, &ns, 128, &r.data, 0, 8192, &a);
	CHECK(err == 0 && m->last_opc == UPCIE_NVME_ZNS_APPEND && m->last_slba == 128 &&
		  m->n_append == 1,
	      "Zone Append to zone 2: opcode 0x7d, ZSLBA 128 (%d)", err);
	CHECK(a.calls == 1 && a.err == 0 && a.lba_err == 0 && a.lba == 128 && m->wp[2] == 130,
	      "the callback reads the assigned LBA 128 (%llu), write pointer 130",
	      (unsigned long long)a.lba);
	rig_fill(va + 8192, 3 * 4096, 32);
	err = append(&q, &ns, 128, &r.data, 8192, 3 * 4096, &a);
	CHECK(err == 0 && a.lba_err == 0 && a.lba == 130 && m->wp[2] == 133,
	      "a second append lands at the write pointer: LBA 130 (%llu)",
	      (unsigned long long)a.lba);
	memset(va + 65536, 0, 5 * 4096);
	err = upcie_nvme_ioq_read_sync(&q, &ns, 128, &r.data, 65536, 5 * 4096, NULL);
	CHECK(err == 0 && rig_same(va + 65536, 8192, 31) && rig_same(va + 65536 + 8192, 12288, 32),
	      "read back from 128: both appends where their LBAs say");
	err = io_sync(&q, &ns, UPCIE_NVME_ZNS_APPEND, 128, &r.data, 0, 4096, 0, 0, 0, &cqe);
	CHECK(err == 0 && upcie_nvme_zone_append_lba(&cqe) == 133,
	      "the synchronous helper: the completion says LBA 133 (%llu)",
	      (unsigned long long)upcie_nvme_zone_append_lba(&cqe));

	/* the controller's word reaches the caller as it is: a wrong LBA is the caller's to catch */
	r.nsm.append_lba_skew = 5;
	err = append(&q, &ns, 128, &r.data, 0, 4096, &a);
	CHECK(err == 0 && a.lba == 139 && m->wp[2] == 135,
	      "a controller that reports LBA 139 for data at 134: the caller sees 139 (%llu)",
	      (unsigned long long)a.lba);
	r.nsm.append_lba_skew = 0;

	/* refused before anything goes out */
	n_io = m->n_io;
	err = append(&q, &ns, 129, &r.data, 0, 4096, &a);
	CHECK(err == -EINVAL && m->n_io == n_io && a.calls == 0,
	      "Zone Append at LBA 129 (not a zone's first LBA): -EINVAL, nothing sent (%d)", err);
	n_io = nvme_nsm_find(&r.nsm, 12)->n_io;
	err = append(&q, &ns12, 0, &r.data, 0, 4096, &a);
	CHECK(err == -EOPNOTSUPP && nvme_nsm_find(&r.nsm, 12)->n_io == n_io,
	      "Zone Append to a namespace that is not zoned: -EOPNOTSUPP, nothing sent (%d)", err);
	memset(&qo, 0, sizeof(qo));
	qo.max_xfer = 8192;
	err = upcie_nvme_ioq_create(&q8k, &r.c, &qo);
	n_io = m->n_io;
	if (!err)
		err = append(&q8k, &ns, 192, &r.data, 0, 16384, &a);
	CHECK(err == -EINVAL && m->n_io == n_io && a.calls == 0,
	      "16 KiB on a queue of 8 KiB commands: an append is never split, -EINVAL (%d)", err);
	err = append(&q8k, &ns, 192, &r.data, 0, 8192, &a);
	CHECK(err == 0 && a.lba == 192, "8 KiB on that queue: one command, LBA 192 (%d)", err);
	upcie_nvme_ioq_delete(&q8k);
	{
		struct upcie_nvme_req rq;

		memset(&rq, 0, sizeof(rq));
		CHECK_EQ(upcie_nvme_req_append_lba(&rq, &max), -EINVAL,
			 "the assigned LBA of a request that has not ended: -EINVAL");
		rq.done = true;
		rq.err = -EIO;
		CHECK_EQ(upcie_nvme_req_append_lba(&rq, &max), -EIO,
			 "of a failed request: its error, no LBA");
	}

	/* the Zone Append Size Limit */
	err = upcie_nvme_ns_zone_append_max(&ns, &max);
	CHECK(err == 0 && max == 512 * 1024 && r.nsm.n_cs_ctrl_zns == 1,
	      "ZASL 0: the limit is MDTS, 512 KiB (%llu, %d)", (unsigned long long)max, err);
	r.nsm.zasl = 1;
	err = upcie_nvme_ns_zone_append_max(&ns, &max);
	CHECK(err == 0 && max == 8192, "ZASL 1: 2 minimum pages, 8 KiB (%llu)",
	      (unsigned long long)max);
	r.nsm.zasl = 30;
	err = upcie_nvme_ns_zone_append_max(&ns, &max);
	CHECK(err == 0 && max == 512 * 1024, "ZASL 30 (above MDTS): bounded by MDTS (%llu)",
	      (unsigned long long)max);
	CHECK_EQ(upcie_nvme_ns_zone_append_max(&ns12, &max), -EOPNOTSUPP,
		 "the limit of a namespace that is not zoned: -EOPNOTSUPP");
	CHECK_EQ(upcie_nvme_ns_zone_append_max(&ns, NULL), -EINVAL, "NULL out-parameter: -EINVAL");
	r.nsm.zasl = 1;
	err = io_sync(&q, &ns, UPCIE_NVME_ZNS_APPEND, 192, &r.data, 0, 16384, 0, 0, 0, &cqe);
	CHECK(err == -EIO && upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_INVALID_FIELD,
	      "16 KiB above ZASL 1: the controller refuses it (%s)",
	      upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)));
	r.nsm.zasl = 0;

	/* PI type 1: ILBRT for the zone's start, PIREMAP, tags of the LBAs the data went to */
	err = append(&q, &nspi, 64, &r.data, 0, 4096, &a);
	if (!err)
		err = append(&q, &nspi, 64, &r.data, 4096, 2 * 4096, &a);
	pi = nvme_nsm_pi_at_(mpi, 66);
	CHECK(err == 0 && a.lba == 65 && (mpi->last_cdw12 & UPCIE_NVME_ZA_PIREMAP) &&
		  (mpi->last_cdw12 & UPCIE_NVME_RW_PRACT) && mpi->last_cdw14 == 64 && pi[7] == 66,
	      "PI type 1: PRACT, PIREMAP, ILBRT 64 (the zone); LBA 66 stored with reference tag "
	      "%u (%d)",
	      pi[7], err);
	err = upcie_nvme_ioq_read_sync(&q, &nspi, 64, &r.data, 65536, 3 * 4096, &cqe);
	CHECK(err == 0 && (mpi->last_cdw12 & UPCIE_NVME_RW_PRCHK_REF),
	      "a Read with the reference check over the appended blocks passes (%d)", err);
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

/* Found by fuzz_identify: an extended LBA format whose blocks are not a dword multiple. */
static void t_odd_metadata(void)
{
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct rig r;
	uint8_t *va;
	int err;

	CHECK(upcie_nvme_split_chunk(4096, 518) == 3108 &&
		  upcie_nvme_split_chunk(4096, 513) == 2052 &&
		  upcie_nvme_split_chunk(1024, 513) == 0 &&
		  upcie_nvme_split_chunk(4096, 512) == 4096,
	      "chunks are whole blocks and whole dwords: 518-byte blocks 6 a command, 513-byte 4");
	rig_setup(&r);
	nvme_nsm_add(&r.nsm, 1, 256, 512, 6, true, 0, 0); /* 518-byte blocks */
	rig_use_nsm(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	err = upcie_nvme_ns_open(&ns, &r.c, 1);
	CHECK(err == 0 && ns.block_bytes == 518, "extended LBA with 6 bytes of metadata");
	memset(&qo, 0, sizeof(qo));
	qo.max_xfer = 4096;
	upcie_nvme_ioq_create(&q, &r.c, &qo);
	va = (uint8_t *)r.data_va;
	rig_fill(va, 20 * 518, 61);
	err = upcie_nvme_ioq_write_sync(&q, &ns, 3, &r.data, 0, 20 * 518, NULL);
	memset(va, 0, 20 * 518);
	if (!err)
		err = upcie_nvme_ioq_read_sync(&q, &ns, 3, &r.data, 0, 20 * 518, NULL);
	CHECK(err == 0 && rig_same(va, 20 * 518, 61),
	      "20 blocks through a 4 KiB limit: every piece starts dword aligned, verified (%d)",
	      err);
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

/*
 * The namespace model reports its data and metadata accesses to the exactly-once checker, as
 * nvme_model.h promises for every access (else an exactly-once test over metadata, PI, zoned or
 * several namespaces would be blind). A Write with a separate metadata buffer (MPTR), three
 * times: both buffers lent (no violation, both accesses seen), the metadata buffer handed back
 * (exactly one violation, on it), the data buffer handed back (exactly one, on it).
 */
static void t_eo_sees_nsm(void)
{
	static const char *what[3] = { "both lent", "metadata handed back", "data handed back" };
	struct upcie_nvme_ns ns14;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_io io;
	struct nvme_eo eo;
	struct rig r;
	int32_t rd, rm;
	int err;

	rig_setup(&r);
	add_namespaces(&r);
	rig_use_nsm(&r);
	nvme_eo_init(&eo);
	r.cm.dma = nvme_eo_dma;
	r.cm.dma_ctx = &eo;
	rd = nvme_eo_region(&eo, r.data_va, 4096);
	rm = nvme_eo_region(&eo, (uint8_t *)r.host_va + 8 * RIG_MiB, 4096);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	upcie_nvme_ns_open(&ns14, &r.c, 14);
	err = upcie_nvme_ioq_create(&q, &r.c, NULL);
	CHECK_EQ(err, 0, "eo: I/O queue");
	for (int k = 0; k < 3; k++) {
		uint64_t od = nvme_eo_op(&eo), om = nvme_eo_op(&eo), seen, bad;

		pthread_mutex_lock(&eo.lock);
		seen = eo.dma_checked;
		bad = eo.late_reads + eo.late_writes + eo.foreign;
		eo.first[0] = '\0';
		pthread_mutex_unlock(&eo.lock);
		if (k != 2)
			nvme_eo_lend(&eo, od, rd, (int32_t)q.qid, NVME_EO_NOCID);
		if (k != 1)
			nvme_eo_lend(&eo, om, rm, (int32_t)q.qid, NVME_EO_NOCID);
		md_write(&io, &seg, &r);
		err = upcie_nvme_ioq_io_sync(&q, &ns14, &io, 0, NULL);
		nvme_eo_done(&eo, od, err);
		nvme_eo_done(&eo, om, err);
		pthread_mutex_lock(&eo.lock);
		seen = eo.dma_checked - seen;
		bad = eo.late_reads + eo.late_writes + eo.foreign - bad;
		pthread_mutex_unlock(&eo.lock);
		if (k == 0)
			CHECK(err == 0 && seen >= 2 && bad == 0,
			      "eo, %s: the Write's data and metadata accesses reported (%llu), no "
			      "violation (%d)",
			      what[k], (unsigned long long)seen, err);
		else
			CHECK(bad == 1 && strstr(eo.first, k == 1 ? "region 1 " : "region 0 "),
			      "eo, %s: exactly that buffer's access is a violation (%llu: %s)",
			      what[k], (unsigned long long)bad, eo.first);
	}
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
	nvme_eo_fini(&eo);
}

int main(void)
{
	upcie_log_set_handler(rig_log, NULL);
	t_list_and_open();
	t_list_scan();
	t_absurd_ns();
	t_absurd_ctrl();
	t_pi();
	t_eo_sees_nsm();
	t_elbaf();
	t_zoned();
	t_apptag();
	t_zone_append();
	t_odd_metadata();
	return check_done();
}
