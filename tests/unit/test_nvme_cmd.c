/* SPDX-License-Identifier: BSD-3-Clause */
/* nvme/cmd.h: every builder's command dwords against hand-computed values, and its refusals. */
#include <upcie/nvme/cmd.h>

#include <string.h>

#include "check.h"

static struct upcie_nvme_sqe sqe;

static void dirty(void)
{
	memset(&sqe, 0xee, sizeof(sqe)); /* builders must zero what they do not set */
}

int main(void)
{
	struct upcie_nvme_dsm_range r;

	dirty();
	CHECK_EQ(upcie_nvme_cmd_identify_ctrl(&sqe), 0, "identify controller");
	CHECK(sqe.opc == 0x06 && sqe.cdw10 == 0x01 && sqe.nsid == 0 && sqe.prp1 == 0 &&
		  sqe.cdw11 == 0 && sqe.flags == 0 && sqe.cdw15 == 0,
	      "identify controller: CNS 1, rest zero");
	dirty();
	CHECK_EQ(upcie_nvme_cmd_identify_ns(&sqe, 5), 0, "identify namespace");
	CHECK(sqe.nsid == 5 && sqe.cdw10 == 0x00, "identify namespace: NSID 5, CNS 0");
	CHECK_EQ(upcie_nvme_cmd_identify_ns(&sqe, 0), -EINVAL, "NSID 0 refused");
	CHECK_EQ(upcie_nvme_cmd_identify_ns_list(&sqe, 7), 0, "active NS list");
	CHECK(sqe.nsid == 7 && sqe.cdw10 == 0x02, "NS list after NSID 7, CNS 2");
	CHECK_EQ(upcie_nvme_cmd_identify_ns_list(&sqe, 0xfffffffe), -EINVAL,
		 "NS list after 0xfffffffe");
	CHECK_EQ(upcie_nvme_cmd_identify_cs_ns(&sqe, 1, UPCIE_NVME_CSI_ZNS), 0, "CNS 5");
	CHECK(sqe.cdw10 == 0x05 && sqe.cdw11 == 0x02000000, "CNS 5, CSI 2 in CDW11 31:24");
	CHECK_EQ(upcie_nvme_cmd_identify_cs_ctrl(&sqe, UPCIE_NVME_CSI_ZNS), 0, "CNS 6");
	CHECK(sqe.cdw10 == 0x06 && sqe.cdw11 == 0x02000000, "CNS 6, CSI 2");
	CHECK_EQ(upcie_nvme_cmd_identify(&sqe, 0x01, 0, 0x1234, 0), 0, "identify with CNTID");
	CHECK_EQ(sqe.cdw10, 0x12340001, "CNTID in CDW10 31:16");

	dirty();
	CHECK_EQ(upcie_nvme_cmd_set_num_queues(&sqe, 4, 8), 0, "set number of queues");
	CHECK(sqe.opc == 0x09 && sqe.cdw10 == 0x07 && sqe.cdw11 == 0x00070003,
	      "FID 7, NSQR 3, NCQR 7 (0's based)");
	CHECK_EQ(upcie_nvme_cmd_set_num_queues(&sqe, 0, 8), -EINVAL, "0 queues refused");
	CHECK_EQ(upcie_nvme_cmd_set_num_queues(&sqe, 65536, 8), -EINVAL, "65536 queues refused");
	CHECK_EQ(upcie_nvme_num_queues_sq(0x003f001f), 32, "granted SQs");
	CHECK_EQ(upcie_nvme_num_queues_cq(0x003f001f), 64, "granted CQs");
	CHECK_EQ(upcie_nvme_cmd_get_num_queues(&sqe), 0, "get number of queues");
	CHECK(sqe.opc == 0x0a && sqe.cdw10 == 0x07, "Get Features FID 7, SEL current");
	CHECK_EQ(upcie_nvme_cmd_get_features(&sqe, UPCIE_NVME_FEAT_VOLATILE_WC,
					     UPCIE_NVME_FEAT_SEL_CAPS, 0, 0),
		 0, "get features, capabilities");
	CHECK_EQ(sqe.cdw10, 0x306, "SEL 3 in CDW10 10:8");
	CHECK_EQ(upcie_nvme_cmd_get_features(&sqe, 1, 4, 0, 0), -EINVAL, "SEL 4 refused");
	CHECK_EQ(upcie_nvme_cmd_set_features(&sqe, UPCIE_NVME_FEAT_VOLATILE_WC, 0, 1, true), 0,
		 "set features, save");
	CHECK(sqe.cdw10 == 0x80000006 && sqe.cdw11 == 1, "SV bit 31");

	dirty();
	/* 4096 bytes of SMART from offset 0x10000: NUMD 1023 = 0x3ff; 2^20 + 4 bytes splits. */
	CHECK_EQ(upcie_nvme_cmd_get_log_page(&sqe, UPCIE_NVME_LOG_SMART, UPCIE_NVME_NSID_ALL,
					     0x100000000ull, 4096, 0, true),
		 0, "get log page");
	CHECK(sqe.opc == 0x02 && sqe.nsid == 0xffffffff && sqe.cdw10 == 0x03ff8002 &&
		  sqe.cdw11 == 0 && sqe.cdw12 == 0 && sqe.cdw13 == 1,
	      "LID 2, RAE, NUMDL 0x3ff, LPO 2^32");
	CHECK_EQ(upcie_nvme_cmd_get_log_page(&sqe, 1, 0, 0, (1u << 20) + 8, 0x7f, false), 0,
		 "get log page 1 MiB + 8");
	CHECK(sqe.cdw10 == ((0x0001u << 16) | (0x7fu << 8) | 1) && sqe.cdw11 == 0x0004,
	      "0x40002 dwords: NUMD 0x40001 = NUMDL 1, NUMDU 4; LSP 0x7f");
	CHECK_EQ(upcie_nvme_cmd_get_log_page(&sqe, 1, 0, 0, 6, 0, false), -EINVAL, "length 6");
	CHECK_EQ(upcie_nvme_cmd_get_log_page(&sqe, 1, 0, 2, 8, 0, false), -EINVAL, "offset 2");
	CHECK_EQ(upcie_nvme_cmd_get_log_page(&sqe, 1, 0, 0, 0, 0, false), -EINVAL, "length 0");
	CHECK_EQ(upcie_nvme_cmd_get_log_page(&sqe, 1, 0, 0, 4, 0x80, false), -EINVAL, "LSP 0x80");

	dirty();
	CHECK_EQ(upcie_nvme_cmd_create_io_cq(&sqe, 3, 1024, 0x123456000ull, true, 5), 0,
		 "create I/O CQ");
	CHECK(sqe.opc == 0x05 && sqe.prp1 == 0x123456000ull && sqe.prp2 == 0 &&
		  sqe.cdw10 == 0x03ff0003 && sqe.cdw11 == 0x00050003,
	      "QID 3, QSIZE 1023, PC|IEN, IV 5");
	CHECK_EQ(upcie_nvme_cmd_create_io_cq(&sqe, 0, 16, 0, false, 0), -EINVAL, "QID 0 refused");
	CHECK_EQ(upcie_nvme_cmd_create_io_cq(&sqe, 1, 1, 0, false, 0), -EINVAL, "1 entry refused");
	CHECK_EQ(upcie_nvme_cmd_create_io_cq(&sqe, 1, 16, 0x800, false, 0), -EINVAL,
		 "unaligned queue refused");
	CHECK_EQ(upcie_nvme_cmd_create_io_sq(&sqe, 3, 65536, 0x2000, 3, 2), 0, "create I/O SQ");
	CHECK(sqe.opc == 0x01 && sqe.cdw10 == 0xffff0003 && sqe.cdw11 == 0x00030005,
	      "QSIZE 65535, CQID 3, QPRIO 2, PC");
	CHECK_EQ(upcie_nvme_cmd_create_io_sq(&sqe, 3, 65537, 0x2000, 3, 0), -EINVAL, "65537");
	CHECK_EQ(upcie_nvme_cmd_delete_io_sq(&sqe, 3), 0, "delete SQ");
	CHECK(sqe.opc == 0x00 && sqe.cdw10 == 3, "delete SQ 3");
	CHECK_EQ(upcie_nvme_cmd_delete_io_cq(&sqe, 3), 0, "delete CQ");
	CHECK(sqe.opc == 0x04 && sqe.cdw10 == 3, "delete CQ 3");
	CHECK_EQ(upcie_nvme_cmd_delete_io_cq(&sqe, 0), -EINVAL, "delete CQ 0 refused");
	CHECK_EQ(upcie_nvme_cmd_abort(&sqe, 2, 0x1234), 0, "abort");
	CHECK(sqe.opc == 0x08 && sqe.cdw10 == 0x12340002, "SQID 2, CID 0x1234");

	dirty();
	CHECK_EQ(upcie_nvme_cmd_read(&sqe, 1, 0x123456789aull, 8, UPCIE_NVME_RW_FUA), 0, "read");
	CHECK(sqe.opc == 0x02 && sqe.nsid == 1 && sqe.cdw10 == 0x3456789a && sqe.cdw11 == 0x12 &&
		  sqe.cdw12 == 0x40000007 && sqe.prp1 == 0 && sqe.cdw13 == 0,
	      "SLBA split, NLB 7 (0's based), FUA");
	CHECK_EQ(upcie_nvme_cmd_write(&sqe, 1, 0, 65536, 0), 0, "write 65536 blocks");
	CHECK(sqe.opc == 0x01 && sqe.cdw12 == 0xffff, "NLB 0xffff");
	CHECK_EQ(upcie_nvme_cmd_write(&sqe, 1, 0, 65537, 0), -EINVAL, "65537 blocks refused");
	CHECK_EQ(upcie_nvme_cmd_read(&sqe, 1, 0, 0, 0), -EINVAL, "0 blocks refused");
	CHECK_EQ(upcie_nvme_cmd_read(&sqe, 1, 0, 1, 0x1234), -EINVAL, "flags in NLB bits refused");
	CHECK_EQ(upcie_nvme_cmd_compare(&sqe, 1, 10, 1, 0), 0, "compare");
	CHECK(sqe.opc == 0x05 && sqe.cdw10 == 10, "compare opcode");
	CHECK_EQ(upcie_nvme_cmd_write_zeroes(&sqe, 1, 10, 16, UPCIE_NVME_WZ_DEAC), 0,
		 "write zeroes");
	CHECK(sqe.opc == 0x08 && sqe.cdw12 == 0x0200000f, "DEAC bit 25, NLB 15");
	CHECK_EQ(upcie_nvme_cmd_flush(&sqe, 1), 0, "flush");
	CHECK(sqe.opc == 0x00 && sqe.nsid == 1 && sqe.cdw10 == 0, "flush NSID 1");
	CHECK_EQ(upcie_nvme_cmd_dsm(&sqe, 1, 256, UPCIE_NVME_DSM_AD), 0, "DSM 256 ranges");
	CHECK(sqe.opc == 0x09 && sqe.cdw10 == 255 && sqe.cdw11 == 4, "NR 255, AD");
	CHECK_EQ(upcie_nvme_cmd_dsm(&sqe, 1, 257, UPCIE_NVME_DSM_AD), -EINVAL, "257 ranges");
	CHECK_EQ(upcie_nvme_cmd_dsm(&sqe, 1, 1, 8), -EINVAL, "unknown attribute");
	CHECK_EQ(upcie_nvme_dsm_range_set(&r, 100, 8, 0), 0, "DSM range");
	CHECK(r.slba == 100 && r.nlb == 8 && r.cattr == 0, "range fields");
	CHECK_EQ(upcie_nvme_dsm_range_set(&r, 100, 0, 0), -EINVAL, "empty range refused");

	dirty();
	CHECK_EQ(
	    upcie_nvme_cmd_read(&sqe, 1, 7, 1, UPCIE_NVME_RW_PRACT | UPCIE_NVME_RW_PRCHK_GUARD), 0,
	    "read with PRACT and guard check");
	CHECK(sqe.cdw12 == ((1u << 29) | (1u << 28)), "PRINFO in CDW12 bits 29:26");
	dirty();
	CHECK_EQ(upcie_nvme_cmd_zone_mgmt_send(&sqe, 9, 0x100000000ull | 0x800,
					       UPCIE_NVME_ZSA_RESET, false),
		 0, "zone reset");
	CHECK(sqe.opc == 0x79 && sqe.nsid == 9 && sqe.cdw10 == 0x800 && sqe.cdw11 == 1 &&
		  sqe.cdw13 == 4 && sqe.prp1 == 0,
	      "Zone Management Send: SLBA in CDW10-11, ZSA 4 in CDW13");
	CHECK_EQ(upcie_nvme_cmd_zone_mgmt_send(&sqe, 9, 0, UPCIE_NVME_ZSA_RESET, true), 0,
		 "reset all zones");
	CHECK(sqe.cdw13 == (4u | 1u << 8), "Select All bit 8");
	CHECK_EQ(upcie_nvme_cmd_zone_mgmt_send(&sqe, 9, 0, 0x10, false), -EINVAL,
		 "unknown zone action refused");
	dirty();
	CHECK_EQ(upcie_nvme_cmd_zone_report(&sqe, 9, 0, 4096, true), 0, "report zones");
	CHECK(sqe.opc == 0x7a && sqe.cdw12 == 1023 && sqe.cdw13 == (1u << 16),
	      "Zone Management Receive: NUMD 1023 (0's based), partial report");
	CHECK_EQ(upcie_nvme_cmd_zone_report(&sqe, 9, 0, 32, false), -EINVAL,
		 "a buffer without room for the header refused");

	/* Zone Append: the zone's first LBA where Read/Write have SLBA, the same NLB and PRINFO */
	dirty();
	CHECK_EQ(upcie_nvme_cmd_zone_append(&sqe, 9, 0x200000400ull, 16,
					    UPCIE_NVME_RW_PRACT | UPCIE_NVME_ZA_PIREMAP),
		 0, "zone append");
	CHECK(sqe.opc == 0x7d && sqe.nsid == 9 && sqe.cdw10 == 0x400 && sqe.cdw11 == 2 &&
		  sqe.cdw12 == ((1u << 29) | (1u << 25) | 15u) && sqe.cdw13 == 0 &&
		  sqe.cdw14 == 0 && sqe.cdw15 == 0 && sqe.prp1 == 0,
	      "Zone Append: opcode 0x7d, ZSLBA in CDW10-11, NLB 15, PRACT, PIREMAP bit 25");
	CHECK_EQ(upcie_nvme_cmd_zone_append(&sqe, 9, 0, 65537, 0), -EINVAL,
		 "zone append of 65537 blocks refused");
	CHECK_EQ(upcie_nvme_cdw15_apptag(0x1234, 0xff00), 0xff001234,
		 "CDW15: application tag in bits 15:0, its mask in 31:16");
	{
		struct upcie_nvme_cqe cqe = { 0x89abcdefu, 0x1234567u, 0, 0 };

		CHECK(upcie_nvme_zone_append_lba(&cqe) == 0x123456789abcdefull,
		      "the assigned LBA: CQE DW0 low, DW1 high");
	}
	return check_done();
}
