/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * nvme/spec.h: register field accessors against hand-computed values, CC/AQA builders, doorbell
 * offsets, SQE/CQE layouts, status decoding, Identify structure helpers.
 */
#include <upcie/nvme/spec.h>
#include <upcie/nvme/spec_id.h>

#include <string.h>

#include "check.h"

static void test_cap(void)
{
	/* QEMU's emulated controller (hw/nvme, NVMe 1.4). */
	uint64_t cap = UINT64_C(0x004018200f0107ff);

	CHECK_EQ(upcie_nvme_cap_mqes(cap), 2047, "CAP.MQES = 2047 (0's based)");
	CHECK_EQ(upcie_nvme_cap_mqes_entries(cap), 2048, "2048 entries per queue");
	CHECK_EQ(upcie_nvme_cap_cqr(cap), 1, "CAP.CQR = 1");
	CHECK_EQ(upcie_nvme_cap_ams(cap), 0, "CAP.AMS = 0");
	CHECK_EQ(upcie_nvme_cap_to(cap), 0x0f, "CAP.TO = 15");
	CHECK_EQ(upcie_nvme_cap_to_ms(cap), 7500, "CAP.TO = 7.5 s");
	CHECK_EQ(upcie_nvme_cap_dstrd(cap), 0, "CAP.DSTRD = 0");
	CHECK_EQ(upcie_nvme_cap_dstrd_bytes(cap), 4, "doorbell stride 4 bytes");
	CHECK_EQ(upcie_nvme_cap_nssrs(cap), 0, "CAP.NSSRS = 0");
	CHECK_EQ(upcie_nvme_cap_css(cap), 0xc1, "CAP.CSS = 0xc1");
	CHECK(upcie_nvme_cap_css(cap) & UPCIE_NVME_CAP_CSS_NVM, "NVM command set");
	CHECK(upcie_nvme_cap_css(cap) & UPCIE_NVME_CAP_CSS_IOCS, "I/O command sets");
	CHECK_EQ(upcie_nvme_cap_bps(cap), 0, "CAP.BPS = 0");
	CHECK_EQ(upcie_nvme_cap_mpsmin(cap), 0, "CAP.MPSMIN = 0 (4 KiB)");
	CHECK_EQ(upcie_nvme_cap_mpsmax(cap), 4, "CAP.MPSMAX = 4 (64 KiB)");
	CHECK_EQ(upcie_nvme_cap_mpsmin_shift(cap), 12, "min page 2^12");
	CHECK_EQ(upcie_nvme_cap_mpsmax_shift(cap), 16, "max page 2^16");
	CHECK_EQ(upcie_nvme_cap_pmrs(cap), 0, "CAP.PMRS = 0");
	CHECK_EQ(upcie_nvme_cap_cmbs(cap), 0, "CAP.CMBS = 0");
	CHECK_EQ(upcie_nvme_cap_crms(cap), 0, "CAP.CRMS = 0");

	/* Every field at its maximum, one at a time, hand-placed. */
	CHECK_EQ(upcie_nvme_cap_dstrd(UINT64_C(0xf) << 32), 0xf, "DSTRD bits 35:32");
	CHECK_EQ(upcie_nvme_cap_dstrd_bytes(UINT64_C(3) << 32), 32, "DSTRD 3 = 32 bytes");
	CHECK_EQ(upcie_nvme_cap_nssrs(UINT64_C(1) << 36), 1, "NSSRS bit 36");
	CHECK_EQ(upcie_nvme_cap_css(UINT64_C(0xff) << 37), 0xff, "CSS bits 44:37");
	CHECK_EQ(upcie_nvme_cap_bps(UINT64_C(1) << 45), 1, "BPS bit 45");
	CHECK_EQ(upcie_nvme_cap_cps(UINT64_C(3) << 46), 3, "CPS bits 47:46");
	CHECK_EQ(upcie_nvme_cap_pmrs(UINT64_C(1) << 56), 1, "PMRS bit 56");
	CHECK_EQ(upcie_nvme_cap_cmbs(UINT64_C(1) << 57), 1, "CMBS bit 57");
	CHECK_EQ(upcie_nvme_cap_nsss(UINT64_C(1) << 58), 1, "NSSS bit 58");
	CHECK_EQ(upcie_nvme_cap_crms(UINT64_C(3) << 59), 3, "CRMS bits 60:59");
	CHECK_EQ(upcie_nvme_cap_ams(UINT64_C(3) << 17), 3, "AMS bits 18:17");
	CHECK_EQ(upcie_nvme_cap_cqr(UINT64_C(0xfffe0000ffff)), 0, "CQR bit 16 only");
}

static void test_regs32(void)
{
	struct upcie_nvme_cc_fields f;
	uint32_t cc = 0xdeadbeef, aqa = 0;

	CHECK_EQ(upcie_nvme_vs_mjr(0x00010400), 1, "VS 1.4.0 major");
	CHECK_EQ(upcie_nvme_vs_mnr(0x00010400), 4, "VS 1.4.0 minor");
	CHECK_EQ(upcie_nvme_vs_ter(0x00020001), 1, "VS 2.0.1 tertiary");
	CHECK_EQ(UPCIE_NVME_VS(2, 0, 1), 0x00020001, "VS builder");

	/* CC for QEMU bring-up: EN, CSS 6, MPS 0, RR, IOSQES 6, IOCQES 4 = 0x00460061. */
	memset(&f, 0, sizeof(f));
	f.en = 1;
	f.css = UPCIE_NVME_CC_CSS_IOCS;
	f.iosqes = 6;
	f.iocqes = 4;
	CHECK_EQ(upcie_nvme_cc_build(&f, &cc), 0, "CC build");
	CHECK_EQ(cc, 0x00460061, "CC = 0x00460061");
	f.mps = 4;
	f.ams = UPCIE_NVME_CC_AMS_WRRU;
	f.shn = UPCIE_NVME_CC_SHN_NORMAL;
	f.crime = 1;
	f.en = 0;
	f.css = 0;
	CHECK_EQ(upcie_nvme_cc_build(&f, &cc), 0, "CC build, all fields");
	/* crime 1<<24 | iocqes 4<<20 | iosqes 6<<16 | shn 1<<14 | ams 1<<11 | mps 4<<7 */
	CHECK_EQ(cc, 0x01464a00, "CC = 0x01464a00");
	CHECK_EQ(upcie_nvme_cc_mps(cc), 4, "CC.MPS");
	CHECK_EQ(upcie_nvme_cc_ams(cc), 1, "CC.AMS");
	CHECK_EQ(upcie_nvme_cc_shn(cc), 1, "CC.SHN");
	CHECK_EQ(upcie_nvme_cc_iosqes(cc), 6, "CC.IOSQES bits 19:16");
	CHECK_EQ(upcie_nvme_cc_iocqes(cc), 4, "CC.IOCQES bits 23:20");
	CHECK_EQ(upcie_nvme_cc_crime(cc), 1, "CC.CRIME bit 24");
	CHECK_EQ(upcie_nvme_cc_en(cc), 0, "CC.EN");
	CHECK_EQ(upcie_nvme_cc_css(0x70), 7, "CC.CSS bits 6:4");
	CHECK_EQ(upcie_nvme_cc_set_en(cc, true), 0x01464a01, "CC set EN");
	CHECK_EQ(upcie_nvme_cc_set_shn(0x00464001, UPCIE_NVME_CC_SHN_ABRUPT), 0x00468001,
		 "CC set SHN");
	f.css = 8;
	cc = 0x1234;
	CHECK_EQ(upcie_nvme_cc_build(&f, &cc), -EINVAL, "CC.CSS 8 does not fit");
	CHECK_EQ(cc, 0x1234, "CC untouched on error");
	f.css = 0;
	f.mps = 16;
	CHECK_EQ(upcie_nvme_cc_build(&f, &cc), -EINVAL, "CC.MPS 16 does not fit");

	CHECK_EQ(upcie_nvme_csts_rdy(0x1), 1, "CSTS.RDY");
	CHECK_EQ(upcie_nvme_csts_cfs(0x2), 1, "CSTS.CFS");
	CHECK_EQ(upcie_nvme_csts_shst(0x9), UPCIE_NVME_CSTS_SHST_COMPLETE, "CSTS.SHST bits 3:2");
	CHECK_EQ(upcie_nvme_csts_nssro(0x10), 1, "CSTS.NSSRO");
	CHECK_EQ(upcie_nvme_csts_pp(0x20), 1, "CSTS.PP");
	CHECK_EQ(upcie_nvme_csts_st(0x40), 1, "CSTS.ST");

	CHECK_EQ(upcie_nvme_aqa_build(32, 64, &aqa), 0, "AQA build");
	CHECK_EQ(aqa, 0x003f001f, "AQA = 0x003f001f");
	CHECK_EQ(upcie_nvme_aqa_asqs(aqa), 31, "AQA.ASQS");
	CHECK_EQ(upcie_nvme_aqa_acqs(aqa), 63, "AQA.ACQS");
	CHECK_EQ(upcie_nvme_aqa_build(4096, 4096, &aqa), 0, "AQA 4096 entries");
	CHECK_EQ(aqa, 0x0fff0fff, "AQA = 0x0fff0fff");
	CHECK_EQ(upcie_nvme_aqa_build(1, 2, &aqa), -EINVAL, "AQA 1 entry refused");
	CHECK_EQ(upcie_nvme_aqa_build(2, 4097, &aqa), -EINVAL, "AQA 4097 entries refused");

	/* CMBLOC: BIR 2, CQMMS, CQDA, OFST 0x12345. CMBSZ: SQS, WDS, SZU 2 (1 MiB), SZ 16. */
	CHECK_EQ(upcie_nvme_cmbloc_bir(0x1234510a), 2, "CMBLOC.BIR");
	CHECK_EQ(upcie_nvme_cmbloc_cqmms(0x12345108), 1, "CMBLOC.CQMMS");
	CHECK_EQ(upcie_nvme_cmbloc_cqpds(0x10), 1, "CMBLOC.CQPDS");
	CHECK_EQ(upcie_nvme_cmbloc_cdpmls(0x20), 1, "CMBLOC.CDPMLS");
	CHECK_EQ(upcie_nvme_cmbloc_cdpcils(0x40), 1, "CMBLOC.CDPCILS");
	CHECK_EQ(upcie_nvme_cmbloc_cdmmms(0x80), 1, "CMBLOC.CDMMMS");
	CHECK_EQ(upcie_nvme_cmbloc_cqda(0x12345100), 1, "CMBLOC.CQDA");
	CHECK_EQ(upcie_nvme_cmbloc_ofst(0x12345100), 0x12345, "CMBLOC.OFST");
	CHECK_EQ(upcie_nvme_cmbsz_sqs(0x00010211), 1, "CMBSZ.SQS");
	CHECK_EQ(upcie_nvme_cmbsz_cqs(0x2), 1, "CMBSZ.CQS");
	CHECK_EQ(upcie_nvme_cmbsz_lists(0x4), 1, "CMBSZ.LISTS");
	CHECK_EQ(upcie_nvme_cmbsz_rds(0x8), 1, "CMBSZ.RDS");
	CHECK_EQ(upcie_nvme_cmbsz_wds(0x00010211), 1, "CMBSZ.WDS");
	CHECK_EQ(upcie_nvme_cmbsz_szu(0x00010211), 2, "CMBSZ.SZU");
	CHECK_EQ(upcie_nvme_cmbsz_sz(0x00010211), 16, "CMBSZ.SZ");
	CHECK_EQ(upcie_nvme_cmbsz_bytes(0x00010211), 16 << 20, "CMB 16 MiB");
	CHECK_EQ(upcie_nvme_cmbsz_bytes(0x00010711), 0, "reserved SZU gives 0");
	CHECK_EQ(upcie_nvme_bpinfo_bpsz(0x81000010), 0x10, "BPINFO.BPSZ");
	CHECK_EQ(upcie_nvme_bpinfo_brs(0x82000010), 2, "BPINFO.BRS");
	CHECK_EQ(upcie_nvme_bpinfo_abpid(0x80000000), 1, "BPINFO.ABPID");
	CHECK_EQ(upcie_nvme_cmbmsc_cre(UINT64_C(0xfedcb0003)), 1, "CMBMSC.CRE");
	CHECK_EQ(upcie_nvme_cmbmsc_cmse(UINT64_C(0xfedcb0003)), 1, "CMBMSC.CMSE");
	CHECK_EQ(upcie_nvme_cmbmsc_cba(UINT64_C(0xfedcb0003)), 0xfedcb0000, "CMBMSC.CBA");
	CHECK_EQ(upcie_nvme_cmbsts_cbai(1), 1, "CMBSTS.CBAI");
	CHECK_EQ(upcie_nvme_crto_crwmt(0x00280014), 0x14, "CRTO.CRWMT");
	CHECK_EQ(upcie_nvme_crto_crimt(0x00280014), 0x28, "CRTO.CRIMT");

	/* PMRCAP: RDS, WDS, BIR 4, PMRTU 1, PMRWBM 0x2, PMRTO 0x3c, CMSS. */
	CHECK_EQ(upcie_nvme_pmrcap_rds(0x013c0998), 1, "PMRCAP.RDS");
	CHECK_EQ(upcie_nvme_pmrcap_wds(0x013c0998), 1, "PMRCAP.WDS");
	CHECK_EQ(upcie_nvme_pmrcap_bir(0x013c0998), 4, "PMRCAP.BIR");
	CHECK_EQ(upcie_nvme_pmrcap_pmrtu(0x013c0998), 1, "PMRCAP.PMRTU");
	CHECK_EQ(upcie_nvme_pmrcap_pmrwbm(0x013c0998), 2, "PMRCAP.PMRWBM");
	CHECK_EQ(upcie_nvme_pmrcap_pmrto(0x013c0998), 0x3c, "PMRCAP.PMRTO");
	CHECK_EQ(upcie_nvme_pmrcap_cmss(0x013c0998), 1, "PMRCAP.CMSS");
	CHECK_EQ(upcie_nvme_pmrctl_en(1), 1, "PMRCTL.EN");
	CHECK_EQ(upcie_nvme_pmrsts_err(0x1f5a), 0x5a, "PMRSTS.ERR");
	CHECK_EQ(upcie_nvme_pmrsts_nrdy(0x1f5a), 1, "PMRSTS.NRDY");
	CHECK_EQ(upcie_nvme_pmrsts_hsts(0x1f5a), 7, "PMRSTS.HSTS");
	CHECK_EQ(upcie_nvme_pmrsts_cbai(0x1f5a), 1, "PMRSTS.CBAI");
	CHECK_EQ(upcie_nvme_pmrebs_pmrszu(0x00010012), 2, "PMREBS.PMRSZU");
	CHECK_EQ(upcie_nvme_pmrebs_rbb(0x00010012), 1, "PMREBS.RBB");
	CHECK_EQ(upcie_nvme_pmrebs_pmrwbz(0x00010012), 0x100, "PMREBS.PMRWBZ");
	CHECK_EQ(upcie_nvme_pmrswtp_pmrswtu(0x00000a02), 2, "PMRSWTP.PMRSWTU");
	CHECK_EQ(upcie_nvme_pmrswtp_pmrswtv(0x00000a02), 0xa, "PMRSWTP.PMRSWTV");
	CHECK_EQ(upcie_nvme_pmrmscl_cmse(0xabcde002), 1, "PMRMSCL.CMSE");
	CHECK_EQ(upcie_nvme_pmrmsc_cba(0xabcde002, 0x12), 0x12abcde000, "PMRMSC.CBA");

	CHECK_EQ(UPCIE_NVME_REG_CRTO, 0x68, "CRTO at 0x68");
	CHECK_EQ(UPCIE_NVME_REG_PMRMSCU, 0xe18, "PMRMSCU at 0xe18");
}

static void test_doorbells(void)
{
	CHECK_EQ(upcie_nvme_sq_tdbl_off(0, 0), 0x1000, "SQ0TDBL");
	CHECK_EQ(upcie_nvme_cq_hdbl_off(0, 0), 0x1004, "CQ0HDBL");
	CHECK_EQ(upcie_nvme_sq_tdbl_off(1, 0), 0x1008, "SQ1TDBL");
	CHECK_EQ(upcie_nvme_cq_hdbl_off(1, 0), 0x100c, "CQ1HDBL");
	CHECK_EQ(upcie_nvme_sq_tdbl_off(3, 2), 0x1000 + 6 * 16, "SQ3TDBL, stride 16");
	CHECK_EQ(upcie_nvme_cq_hdbl_off(3, 2), 0x1000 + 7 * 16, "CQ3HDBL, stride 16");
	CHECK_EQ(upcie_nvme_cq_hdbl_off(65535, 0), 0x1000 + 131071 * 4, "CQ65535HDBL");
	CHECK_EQ(upcie_nvme_mdts_bytes(7, UINT64_C(0x004018200f0107ff)), 512 * 1024,
		 "MDTS 7 = 512 KiB with 4 KiB MPSMIN");
	CHECK_EQ(upcie_nvme_mdts_bytes(5, UINT64_C(1) << 48), 256 * 1024,
		 "MDTS 5 with 8 KiB MPSMIN = 256 KiB");
	CHECK(upcie_nvme_mdts_bytes(0, 0) == UINT64_MAX, "MDTS 0 = no limit");
}

static void test_entries(void)
{
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_cqe cqe;
	struct upcie_nvme_status st;

	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = 0x02;
	sqe.cid = 0xbeef;
	upcie_nvme_sqe_set_fuse(&sqe, UPCIE_NVME_FUSE_SECOND);
	upcie_nvme_sqe_set_psdt(&sqe, UPCIE_NVME_PSDT_SGL_MS);
	CHECK_EQ(upcie_nvme_sqe_cdw0(&sqe), 0xbeef8202, "CDW0 = CID | PSDT 2 | FUSE 2 | OPC");
	CHECK_EQ(upcie_nvme_sqe_fuse(&sqe), 2, "FUSE");
	CHECK_EQ(upcie_nvme_sqe_psdt(&sqe), 2, "PSDT");
	{
		uint32_t raw[16];

		sqe.nsid = 1;
		sqe.mptr = UINT64_C(0x1122334455667788);
		sqe.prp1 = UINT64_C(0xaabbccdd00001000);
		sqe.cdw10 = 0x10;
		sqe.cdw15 = 0x15;
		memcpy(raw, &sqe, 64);
		CHECK_EQ(raw[0], 0xbeef8202, "dword 0");
		CHECK_EQ(raw[1], 1, "dword 1 NSID");
		CHECK_EQ(raw[4], 0x55667788, "dword 4 MPTR low");
		CHECK_EQ(raw[5], 0x11223344, "dword 5 MPTR high");
		CHECK_EQ(raw[6], 0x00001000, "dword 6 PRP1 low");
		CHECK_EQ(raw[7], 0xaabbccdd, "dword 7 PRP1 high");
		CHECK_EQ(raw[10], 0x10, "dword 10");
		CHECK_EQ(raw[15], 0x15, "dword 15");
	}
	upcie_nvme_sqe_set_sgl1(&sqe, 0x2000, 0x1234,
				UPCIE_NVME_SGL_ID(UPCIE_NVME_SGL_LAST_SEGMENT, 0));
	CHECK_EQ(upcie_nvme_sqe_psdt(&sqe), 1, "SGL1 sets PSDT 1");
	CHECK_EQ(upcie_nvme_sqe_sgl1_len(&sqe), 0x1234, "SGL1 length");
	CHECK_EQ(upcie_nvme_sqe_sgl1_id(&sqe), 0x30, "SGL1 identifier byte 15");
	{
		uint8_t raw[64];

		memcpy(raw, &sqe, 64);
		CHECK_EQ(raw[24 + 15], 0x30, "SGL identifier at SQE byte 39");
		CHECK_EQ(raw[24 + 8] | raw[24 + 9] << 8, 0x1234, "SGL length at byte 32");
	}

	/* dw2 = SQID 3, SQHD 17; dw3 = DNR | M | CRD 2 | SCT 2 | SC 0x81 | P | CID 0x0042 */
	cqe.dw0 = 7;
	cqe.dw1 = 0;
	cqe.dw2 = 0x00030011;
	cqe.dw3 =
	    (1u << 31) | (1u << 30) | (2u << 28) | (2u << 25) | (0x81u << 17) | (1u << 16) | 0x42;
	CHECK_EQ(upcie_nvme_cqe_sqhd(&cqe), 17, "SQHD");
	CHECK_EQ(upcie_nvme_cqe_sqid(&cqe), 3, "SQID");
	CHECK_EQ(upcie_nvme_cqe_cid(&cqe), 0x42, "CID");
	CHECK_EQ(upcie_nvme_cqe_phase(&cqe), 1, "phase");
	st = upcie_nvme_status_decode(cqe.dw3);
	CHECK_EQ(st.sc, 0x81, "SC");
	CHECK_EQ(st.sct, UPCIE_NVME_SCT_MEDIA, "SCT media");
	CHECK_EQ(st.crd, 2, "CRD");
	CHECK(st.more, "More");
	CHECK(st.dnr, "DNR");
	CHECK(st.phase, "phase bit in decode");
	CHECK_EQ(upcie_nvme_cqe_code(&cqe), UPCIE_NVME_SC_UNRECOVERED_READ, "code 0x281");
	CHECK(!upcie_nvme_cqe_ok(&cqe), "not ok");
	CHECK(upcie_nvme_cqe_dnr(&cqe), "cqe DNR");
	CHECK(!strcmp(upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)), "unrecovered read error"),
	      "status string: %s", upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)));
	cqe.dw3 = 0x00010005;
	st = upcie_nvme_status_decode(cqe.dw3);
	CHECK(st.sc == 0 && st.sct == 0 && !st.dnr && !st.more && st.crd == 0 && st.phase,
	      "success, phase 1");
	CHECK(upcie_nvme_cqe_ok(&cqe), "ok");
	cqe.dw3 = (1u << 25) | (0x02u << 17); /* SCT 1, SC 2, phase 0 */
	CHECK_EQ(upcie_nvme_cqe_code(&cqe), UPCIE_NVME_SC_QUEUE_SIZE, "invalid queue size");
	CHECK_EQ(upcie_nvme_cqe_phase(&cqe), 0, "phase 0");
	CHECK(!strcmp(upcie_nvme_status_str(0x7ff), "vendor specific status"), "vendor status");
	CHECK(!strcmp(upcie_nvme_status_str(0x0ff), "unknown generic status"), "unknown generic");
	CHECK(!strcmp(upcie_nvme_status_str(0x4ff), "reserved status code type"), "reserved SCT");
	CHECK_EQ(upcie_nvme_cqe_dw3_make(0x42, 1, UPCIE_NVME_SC_UNRECOVERED_READ, true),
		 (1u << 31) | (2u << 25) | (0x81u << 17) | (1u << 16) | 0x42, "dw3 builder");
}

static void test_identify(void)
{
	static struct upcie_nvme_id_ns ns;
	static struct upcie_nvme_id_ctrl ctrl;
	uint8_t *raw = (uint8_t *)&ctrl;

	memset(&ctrl, 0, sizeof(ctrl));
	raw[0] = 0x36;
	raw[1] = 0x1b; /* QEMU VID 0x1b36 */
	raw[77] = 7;
	raw[516] = 1;
	raw[536] = 1;
	memcpy(raw + 4, "deadbeef", 8);
	CHECK_EQ(ctrl.vid, 0x1b36, "VID from bytes 0-1");
	CHECK_EQ(ctrl.mdts, 7, "MDTS from byte 77");
	CHECK_EQ(ctrl.nn, 1, "NN from byte 516");
	CHECK_EQ(ctrl.sgls & 3, UPCIE_NVME_SGLS_ANY_ALIGN, "SGLS from byte 536");
	CHECK(!memcmp(ctrl.sn, "deadbeef", 8), "SN from byte 4");

	memset(&ns, 0, sizeof(ns));
	ns.nlbaf = 1; /* two formats */
	ns.lbaf[0].lbads = 9;
	ns.lbaf[1].lbads = 12;
	ns.lbaf[1].ms = 8;
	ns.flbas = 0x11; /* format 1, extended LBA */
	CHECK_EQ(upcie_nvme_id_ns_lbaf_index(&ns), 1, "format index 1");
	CHECK_EQ(upcie_nvme_id_ns_lba_bytes(&ns), 4096, "4 KiB LBA");
	CHECK_EQ(upcie_nvme_id_ns_ms(&ns), 8, "8 bytes metadata");
	CHECK(upcie_nvme_id_ns_extended_lba(&ns), "extended LBA");
	ns.flbas = 0x62; /* index bits 6:5 = 3 ignored with <= 16 formats */
	CHECK_EQ(upcie_nvme_id_ns_lbaf_index(&ns), 2,
		 "upper index bits ignored, 17 formats absent");
	CHECK(upcie_nvme_id_ns_lbaf(&ns) == NULL, "index beyond NLBAF is refused");
	CHECK_EQ(upcie_nvme_id_ns_lba_bytes(&ns), 0, "no LBA size for a bad index");
	ns.nlbaf = 63;		    /* 64 formats (NVMe 2.0) */
	ns.flbas = (2u << 5) | 0x3; /* index 0x23 = 35 */
	ns.lbaf[35].lbads = 13;
	CHECK_EQ(upcie_nvme_id_ns_lbaf_index(&ns), 35, "NVMe 2.0 index from bits 6:5 and 3:0");
	CHECK_EQ(upcie_nvme_id_ns_lba_bytes(&ns), 8192, "format 35: 8 KiB");
	CHECK(!upcie_nvme_id_ns_extended_lba(&ns), "separate metadata");
}

static void test_command_sets(void)
{
	static struct upcie_nvme_id_ns_zns zns;
	uint8_t list[4096], csi = 0xee, *raw = (uint8_t *)&zns;
	static uint8_t rep[64 + 3 * 64];
	struct upcie_nvme_zone_report_hdr *h = (struct upcie_nvme_zone_report_hdr *)rep;

	/* what QEMU reports: EUI-64 absent, NGUID (16), UUID (16), CSI (1) */
	memset(list, 0, sizeof(list));
	list[0] = UPCIE_NVME_NIDT_NGUID;
	list[1] = 16;
	list[20] = UPCIE_NVME_NIDT_UUID;
	list[21] = 16;
	list[40] = UPCIE_NVME_NIDT_CSI;
	list[41] = 1;
	list[44] = UPCIE_NVME_CSI_ZNS;
	CHECK_EQ(upcie_nvme_ns_desc_csi(list, sizeof(list), &csi), 0, "CSI descriptor found");
	CHECK_EQ(csi, UPCIE_NVME_CSI_ZNS, "CSI 2: zoned");
	list[40] = 0;
	CHECK_EQ(upcie_nvme_ns_desc_csi(list, sizeof(list), &csi), -ENOENT,
		 "no CSI descriptor before the end marker: -ENOENT");
	list[40] = UPCIE_NVME_NIDT_CSI;
	list[41] = 2;
	CHECK_EQ(upcie_nvme_ns_desc_csi(list, sizeof(list), &csi), -EPROTO,
		 "CSI descriptor of 2 bytes: -EPROTO");
	list[21] = 255;
	CHECK_EQ(upcie_nvme_ns_desc_csi(list, sizeof(list), &csi), -EPROTO,
		 "UUID descriptor of 255 bytes: -EPROTO");
	memset(list, 0, sizeof(list));
	list[4088] = 0x77; /* an unknown type whose body runs past the page */
	list[4089] = 8;
	memset(list, 0x77, 4088);
	for (size_t o = 0; o < 4088; o += 4 + 0x77)
		list[o + 1] = 0x77;
	CHECK_EQ(upcie_nvme_ns_desc_csi(list, 4092, &csi), -EPROTO,
		 "a descriptor past the end of the data: -EPROTO");
	CHECK_EQ(upcie_nvme_ns_desc_csi(list, 3, &csi), -ENOENT, "a list shorter than a header");

	memset(&zns, 0, sizeof(zns));
	raw[2816] = 0x00;
	raw[2817] = 0x01; /* LBAFE0.ZSZE = 256 */
	raw[2816 + 16 + 8] = 3;
	CHECK_EQ(zns.lbafe[0].zsze, 256, "ZNS LBAFE0.ZSZE from byte 2816");
	CHECK_EQ(zns.lbafe[1].zdes, 3, "LBAFE1.ZDES from byte 2840");

	memset(rep, 0, sizeof(rep));
	h->nr_zones = 1000;
	CHECK_EQ(upcie_nvme_zone_report_count(rep, sizeof(rep)), 3,
		 "a report claiming 1000 zones holds 3 in a 256-byte buffer");
	h->nr_zones = 2;
	CHECK_EQ(upcie_nvme_zone_report_count(rep, sizeof(rep)), 2, "2 zones reported");
	CHECK_EQ(upcie_nvme_zone_report_count(rep, 63), 0, "no room for the header");

	CHECK(!strcmp(upcie_nvme_status_str(0x1b9), "zone is full"), "0x1b9: zone is full");
	CHECK(!strcmp(upcie_nvme_status_str(UPCIE_NVME_SC_ZONE_INVALID_WRITE),
		      "zone invalid write (not at the write pointer)"),
	      "0x1bc: zone invalid write");
	for (uint16_t c = 0x1b8; c <= 0x1bf; c++)
		CHECK(strncmp(upcie_nvme_status_str(c), "unknown", 7), "status 0x%03x is named", c);
}

int main(void)
{
	test_cap();
	test_regs32();
	test_doorbells();
	test_entries();
	test_identify();
	test_command_sets();
	return check_done();
}
