/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Command builders: fill a submission queue entry for the admin and NVM commands a driver needs.
 *
 * Each builder zeroes the entry, sets opcode, NSID and command dwords, and returns 0 or -EINVAL
 * for arguments the command cannot express. The data pointer is left zero: fill it with the PRP
 * or SGL builders (prp.h, sgl.h) for commands that move data; the CID is assigned by the queue
 * pair. Counts are given naturally (blocks, entries, bytes) and converted to the spec's 0's
 * based fields here. Anything not covered stays possible: struct upcie_nvme_sqe is public.
 * Pure functions, usable in device code; they do not log (device code cannot).
 */
#ifndef UPCIE_NVME_CMD_H
#define UPCIE_NVME_CMD_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <upcie/base/compiler.h>
#include <upcie/nvme/spec.h>
#include <upcie/nvme/spec_id.h>

UPCIE_HD static inline void upcie_nvme_cmd_init_(struct upcie_nvme_sqe *sqe, uint8_t opc,
						 uint32_t nsid)
{
	memset(sqe, 0, sizeof(*sqe));
	sqe->opc = opc;
	sqe->nsid = nsid;
}

/*
 * Identify with any CNS. `cntid` goes to CDW10 bits 31:16, `csi` to CDW11 bits 31:24 (2.0).
 * Data: 4096 bytes.
 */
UPCIE_HD static inline int upcie_nvme_cmd_identify(struct upcie_nvme_sqe *sqe, uint8_t cns,
						   uint32_t nsid, uint16_t cntid, uint8_t csi)
{
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_ADMIN_IDENTIFY, nsid);
	sqe->cdw10 = cns | ((uint32_t)cntid << 16);
	sqe->cdw11 = (uint32_t)csi << 24;
	return 0;
}

/* Identify Controller (CNS 01h). */
UPCIE_HD static inline int upcie_nvme_cmd_identify_ctrl(struct upcie_nvme_sqe *sqe)
{
	return upcie_nvme_cmd_identify(sqe, UPCIE_NVME_CNS_CTRL, 0, 0, 0);
}

/* Identify Namespace (CNS 00h) for `nsid` (1..0xfffffffe, or UPCIE_NVME_NSID_ALL for common). */
UPCIE_HD static inline int upcie_nvme_cmd_identify_ns(struct upcie_nvme_sqe *sqe, uint32_t nsid)
{
	if (!nsid)
		return -EINVAL;
	return upcie_nvme_cmd_identify(sqe, UPCIE_NVME_CNS_NS, nsid, 0, 0);
}

/* Active namespace ID list (CNS 02h): NSIDs greater than `after`. */
UPCIE_HD static inline int upcie_nvme_cmd_identify_ns_list(struct upcie_nvme_sqe *sqe,
							   uint32_t after)
{
	if (after >= 0xfffffffeu)
		return -EINVAL;
	return upcie_nvme_cmd_identify(sqe, UPCIE_NVME_CNS_NS_ACTIVE_LIST, after, 0, 0);
}

/* I/O command set specific Identify Namespace (CNS 05h) / Controller (CNS 06h). */
UPCIE_HD static inline int upcie_nvme_cmd_identify_cs_ns(struct upcie_nvme_sqe *sqe, uint32_t nsid,
							 uint8_t csi)
{
	if (!nsid)
		return -EINVAL;
	return upcie_nvme_cmd_identify(sqe, UPCIE_NVME_CNS_CS_NS, nsid, 0, csi);
}

/* Identify the controller for command set `csi` (CNS 06h): the I/O command set's controller data. */
UPCIE_HD static inline int upcie_nvme_cmd_identify_cs_ctrl(struct upcie_nvme_sqe *sqe, uint8_t csi)
{
	return upcie_nvme_cmd_identify(sqe, UPCIE_NVME_CNS_CS_CTRL, 0, 0, csi);
}

/* Get Features: `fid`, select `sel` (UPCIE_NVME_FEAT_SEL_*), feature-specific `cdw11`. */
UPCIE_HD static inline int upcie_nvme_cmd_get_features(struct upcie_nvme_sqe *sqe, uint8_t fid,
						       uint8_t sel, uint32_t nsid, uint32_t cdw11)
{
	if (sel > 3)
		return -EINVAL;
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_ADMIN_GET_FEATURES, nsid);
	sqe->cdw10 = fid | ((uint32_t)sel << 8);
	sqe->cdw11 = cdw11;
	return 0;
}

/* Set Features: `fid` to `cdw11` (and cdw12..15 by hand where a feature needs them). */
UPCIE_HD static inline int upcie_nvme_cmd_set_features(struct upcie_nvme_sqe *sqe, uint8_t fid,
						       uint32_t nsid, uint32_t cdw11, bool save)
{
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_ADMIN_SET_FEATURES, nsid);
	sqe->cdw10 = fid | (save ? 1u << 31 : 0u);
	sqe->cdw11 = cdw11;
	return 0;
}

/*
 * Set Features, Number of Queues: ask for `nsq` I/O SQs and `ncq` I/O CQs (1..65535 each).
 * The completion's dw0 holds what was granted: upcie_nvme_num_queues_sq/cq().
 */
UPCIE_HD static inline int upcie_nvme_cmd_set_num_queues(struct upcie_nvme_sqe *sqe, uint32_t nsq,
							 uint32_t ncq)
{
	if (!nsq || !ncq || nsq > 65535 || ncq > 65535)
		return -EINVAL;
	return upcie_nvme_cmd_set_features(sqe, UPCIE_NVME_FEAT_NUM_QUEUES, 0,
					   (nsq - 1) | ((ncq - 1) << 16), false);
}

/* Get Features Number of Queues (current value): decode dw0 with upcie_nvme_num_queues_sq/cq(). */
UPCIE_HD static inline int upcie_nvme_cmd_get_num_queues(struct upcie_nvme_sqe *sqe)
{
	return upcie_nvme_cmd_get_features(sqe, UPCIE_NVME_FEAT_NUM_QUEUES,
					   UPCIE_NVME_FEAT_SEL_CURRENT, 0, 0);
}

/* I/O SQs / CQs granted, from the Number of Queues completion dw0. */
UPCIE_HD static inline uint32_t upcie_nvme_num_queues_sq(uint32_t dw0)
{
	return (dw0 & 0xffffu) + 1;
}

/* I/O CQs granted, from the Number of Queues completion dw0 (0's based in the field). */
UPCIE_HD static inline uint32_t upcie_nvme_num_queues_cq(uint32_t dw0)
{
	return (dw0 >> 16) + 1;
}

/*
 * Get Log Page `lid`: `len` bytes (a multiple of 4, at most 2^32 dwords) from byte `offset`
 * (dword aligned), log specific field `lsp` (7 bits), retain asynchronous event `rae`.
 */
UPCIE_HD static inline int upcie_nvme_cmd_get_log_page(struct upcie_nvme_sqe *sqe, uint8_t lid,
						       uint32_t nsid, uint64_t offset, uint64_t len,
						       uint8_t lsp, bool rae)
{
	uint64_t numd;

	if (!len || (len & 3) || (offset & 3) || lsp > 0x7f || len / 4 > UINT64_C(0x100000000))
		return -EINVAL;
	numd = len / 4 - 1;
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_ADMIN_GET_LOG_PAGE, nsid);
	sqe->cdw10 =
	    lid | ((uint32_t)lsp << 8) | (rae ? 1u << 15 : 0u) | ((uint32_t)(numd & 0xffff) << 16);
	sqe->cdw11 = (uint32_t)(numd >> 16);
	sqe->cdw12 = (uint32_t)offset;
	sqe->cdw13 = (uint32_t)(offset >> 32);
	return 0;
}

/*
 * Create I/O Completion Queue `qid` (1..65535) of `entries` (2..65536) at device address `iova`
 * (physically contiguous, page aligned), interrupts enabled on vector `iv` when `ien`.
 */
UPCIE_HD static inline int upcie_nvme_cmd_create_io_cq(struct upcie_nvme_sqe *sqe, uint16_t qid,
						       uint32_t entries, uint64_t iova, bool ien,
						       uint16_t iv)
{
	if (!qid || entries < 2 || entries > 65536 || (iova & 0xfff))
		return -EINVAL;
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_ADMIN_CREATE_CQ, 0);
	sqe->prp1 = iova;
	sqe->cdw10 = qid | ((entries - 1) << 16);
	sqe->cdw11 = 1u /* PC */ | (ien ? 2u : 0u) | ((uint32_t)iv << 16);
	return 0;
}

/*
 * Create I/O Submission Queue `qid` of `entries` at `iova`, completing to CQ `cqid`, priority
 * `qprio` (0 urgent .. 3 low; only with weighted round robin).
 */
UPCIE_HD static inline int upcie_nvme_cmd_create_io_sq(struct upcie_nvme_sqe *sqe, uint16_t qid,
						       uint32_t entries, uint64_t iova,
						       uint16_t cqid, uint8_t qprio)
{
	if (!qid || !cqid || entries < 2 || entries > 65536 || (iova & 0xfff) || qprio > 3)
		return -EINVAL;
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_ADMIN_CREATE_SQ, 0);
	sqe->prp1 = iova;
	sqe->cdw10 = qid | ((entries - 1) << 16);
	sqe->cdw11 = 1u /* PC */ | ((uint32_t)qprio << 1) | ((uint32_t)cqid << 16);
	return 0;
}

/* Delete I/O SQ `qid`; -EINVAL for qid 0 (the admin queue is not deleted with a command). */
UPCIE_HD static inline int upcie_nvme_cmd_delete_io_sq(struct upcie_nvme_sqe *sqe, uint16_t qid)
{
	if (!qid)
		return -EINVAL;
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_ADMIN_DELETE_SQ, 0);
	sqe->cdw10 = qid;
	return 0;
}

/* Delete I/O CQ `qid` (after its SQs); -EINVAL for qid 0. */
UPCIE_HD static inline int upcie_nvme_cmd_delete_io_cq(struct upcie_nvme_sqe *sqe, uint16_t qid)
{
	if (!qid)
		return -EINVAL;
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_ADMIN_DELETE_CQ, 0);
	sqe->cdw10 = qid;
	return 0;
}

/*
 * Abort command `cid` submitted on SQ `sqid`. Completion dw0 bit 0 is 0 when the command was
 * aborted (it then completes with Command Abort Requested), 1 when it was not.
 */
UPCIE_HD static inline int upcie_nvme_cmd_abort(struct upcie_nvme_sqe *sqe, uint16_t sqid,
						uint16_t cid)
{
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_ADMIN_ABORT, 0);
	sqe->cdw10 = sqid | ((uint32_t)cid << 16);
	return 0;
}

/* Flags for read/write/compare/write zeroes (CDW12). */
#define UPCIE_NVME_RW_FUA  (1u << 30) /* force unit access */
#define UPCIE_NVME_RW_LR   (1u << 31) /* limited retry */
#define UPCIE_NVME_WZ_DEAC (1u << 25) /* write zeroes: deallocate */
/* Protection information (PRINFO, CDW12 29:26) for namespaces formatted with PI. */
#define UPCIE_NVME_RW_PRACT	  (1u << 29) /* the controller inserts / strips the PI */
#define UPCIE_NVME_RW_PRCHK_GUARD (1u << 28) /* check the guard (CRC) */
#define UPCIE_NVME_RW_PRCHK_APP	  (1u << 27) /* check the application tag */
#define UPCIE_NVME_RW_PRCHK_REF	  (1u << 26) /* check the reference tag */

/* Zone Append only (CDW12 bit 25): PI types 1 and 2, the controller remaps the reference tags
 * from ILBRT (given for the zone's first LBA) to the LBAs the data lands at. */
#define UPCIE_NVME_ZA_PIREMAP (1u << 25)

/*
 * CDW15 of Read, Write, Compare and Zone Append on a namespace with protection information:
 * the application tag (LBAT, bits 15:0) that PRACT inserts on writes and that reads and
 * compares with UPCIE_NVME_RW_PRCHK_APP expect, and the mask of the bits they compare (LBATM,
 * bits 31:16; 0xffff: all).
 */
UPCIE_HD static inline uint32_t upcie_nvme_cdw15_apptag(uint16_t apptag, uint16_t mask)
{
	return apptag | ((uint32_t)mask << 16);
}

/* Read/Write/Compare share one layout: SLBA in CDW10-11, NLB (0's based) in CDW12 15:0. */
UPCIE_HD static inline int upcie_nvme_cmd_rw_(struct upcie_nvme_sqe *sqe, uint8_t opc,
					      uint32_t nsid, uint64_t slba, uint32_t nlb,
					      uint32_t flags)
{
	if (!nlb || nlb > 65536 || (flags & 0xffffu))
		return -EINVAL;
	upcie_nvme_cmd_init_(sqe, opc, nsid);
	sqe->cdw10 = (uint32_t)slba;
	sqe->cdw11 = (uint32_t)(slba >> 32);
	sqe->cdw12 = (nlb - 1) | flags;
	return 0;
}

/* Read `nlb` blocks (1..65536) at `slba`; flags: UPCIE_NVME_RW_FUA, UPCIE_NVME_RW_LR. */
UPCIE_HD static inline int upcie_nvme_cmd_read(struct upcie_nvme_sqe *sqe, uint32_t nsid,
					       uint64_t slba, uint32_t nlb, uint32_t flags)
{
	return upcie_nvme_cmd_rw_(sqe, UPCIE_NVME_NVM_READ, nsid, slba, nlb, flags);
}

/* Write `nlb` blocks (1-based count) from `slba`, flags as for upcie_nvme_cmd_read(). */
UPCIE_HD static inline int upcie_nvme_cmd_write(struct upcie_nvme_sqe *sqe, uint32_t nsid,
						uint64_t slba, uint32_t nlb, uint32_t flags)
{
	return upcie_nvme_cmd_rw_(sqe, UPCIE_NVME_NVM_WRITE, nsid, slba, nlb, flags);
}

/*
 * Compare `nlb` blocks (1-based count) at `slba` with the data buffer; a mismatch is the
 * command's status (Compare Failure), not an error of this call.
 */
UPCIE_HD static inline int upcie_nvme_cmd_compare(struct upcie_nvme_sqe *sqe, uint32_t nsid,
						  uint64_t slba, uint32_t nlb, uint32_t flags)
{
	return upcie_nvme_cmd_rw_(sqe, UPCIE_NVME_NVM_COMPARE, nsid, slba, nlb, flags);
}

/* Write Zeroes: no data pointer; flags may add UPCIE_NVME_WZ_DEAC. */
UPCIE_HD static inline int upcie_nvme_cmd_write_zeroes(struct upcie_nvme_sqe *sqe, uint32_t nsid,
						       uint64_t slba, uint32_t nlb, uint32_t flags)
{
	return upcie_nvme_cmd_rw_(sqe, UPCIE_NVME_NVM_WRITE_ZEROES, nsid, slba, nlb, flags);
}

/* Flush namespace `nsid`'s volatile write cache (0xffffffff: all, where the controller allows). */
UPCIE_HD static inline int upcie_nvme_cmd_flush(struct upcie_nvme_sqe *sqe, uint32_t nsid)
{
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_NVM_FLUSH, nsid);
	return 0;
}

#define UPCIE_NVME_DSM_IDR (1u << 0) /* integral dataset for read */
#define UPCIE_NVME_DSM_IDW (1u << 1) /* integral dataset for write */
#define UPCIE_NVME_DSM_AD  (1u << 2) /* deallocate */

/*
 * Dataset Management over `nr` ranges (1..256 struct upcie_nvme_dsm_range, the data buffer of
 * nr * 16 bytes) with attributes `attrs` (UPCIE_NVME_DSM_AD to deallocate, "trim").
 */
UPCIE_HD static inline int upcie_nvme_cmd_dsm(struct upcie_nvme_sqe *sqe, uint32_t nsid,
					      uint32_t nr, uint32_t attrs)
{
	if (!nr || nr > 256 || (attrs & ~7u))
		return -EINVAL;
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_NVM_DSM, nsid);
	sqe->cdw10 = nr - 1;
	sqe->cdw11 = attrs;
	return 0;
}

/* Fill one Dataset Management range: `nlb` blocks (1..2^32-1) at `slba`. */
UPCIE_HD static inline int upcie_nvme_dsm_range_set(struct upcie_nvme_dsm_range *r, uint64_t slba,
						    uint32_t nlb, uint32_t cattr)
{
	if (!nlb)
		return -EINVAL;
	r->cattr = cattr;
	r->nlb = nlb;
	r->slba = slba;
	return 0;
}

/*
 * Zone Management Send (Zoned Namespace Command Set): action `zsa` (UPCIE_NVME_ZSA_*) on the
 * zone starting at `zslba`, or on every zone when `all`. No data.
 */
UPCIE_HD static inline int upcie_nvme_cmd_zone_mgmt_send(struct upcie_nvme_sqe *sqe, uint32_t nsid,
							 uint64_t zslba, uint8_t zsa, bool all)
{
	if (!zsa || zsa > UPCIE_NVME_ZSA_RESET)
		return -EINVAL;
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_ZNS_MGMT_SEND, nsid);
	sqe->cdw10 = (uint32_t)zslba;
	sqe->cdw11 = (uint32_t)(zslba >> 32);
	sqe->cdw13 = zsa | (all ? 1u << 8 : 0u);
	return 0;
}

/*
 * Zone Management Receive, Report Zones: descriptors of the zones from `zslba` on into a buffer
 * of `len` bytes (a multiple of 4, at least the 64-byte header). `partial`: the header counts
 * only the zones that fit.
 */
UPCIE_HD static inline int upcie_nvme_cmd_zone_report(struct upcie_nvme_sqe *sqe, uint32_t nsid,
						      uint64_t zslba, uint64_t len, bool partial)
{
	if (len < 64 || (len & 3) || len / 4 > UINT64_C(0x100000000))
		return -EINVAL;
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_ZNS_MGMT_RECV, nsid);
	sqe->cdw10 = (uint32_t)zslba;
	sqe->cdw11 = (uint32_t)(zslba >> 32);
	sqe->cdw12 = (uint32_t)(len / 4 - 1);
	sqe->cdw13 = UPCIE_NVME_ZRA_REPORT | (partial ? 1u << 16 : 0u);
	return 0;
}

/*
 * Zone Append (Zoned Namespace Command Set): write `nlb` blocks (1..65536) into the zone whose
 * first LBA is `zslba`, at whatever its write pointer is when the controller executes it; the
 * completion says where the data went (upcie_nvme_zone_append_lba()). Flags as for
 * upcie_nvme_cmd_write(), plus UPCIE_NVME_ZA_PIREMAP; the application tag goes to CDW15
 * (upcie_nvme_cdw15_apptag()). The transfer may not exceed the controller's Zone Append Size
 * Limit (ZASL; upcie_nvme_ns_zone_append_max() in nvme/ctrl_ns.h reads it).
 */
UPCIE_HD static inline int upcie_nvme_cmd_zone_append(struct upcie_nvme_sqe *sqe, uint32_t nsid,
						      uint64_t zslba, uint32_t nlb, uint32_t flags)
{
	return upcie_nvme_cmd_rw_(sqe, UPCIE_NVME_ZNS_APPEND, nsid, zslba, nlb, flags);
}

/* The first LBA a successful Zone Append wrote: its completion's DW0 (low) and DW1 (high). */
UPCIE_HD static inline uint64_t upcie_nvme_zone_append_lba(const struct upcie_nvme_cqe *cqe)
{
	return cqe->dw0 | ((uint64_t)cqe->dw1 << 32);
}

/*
 * Virtualization Management (SR-IOV): action `act` (UPCIE_NVME_VIRT_*) on controller `cntlid`
 * for resource type `rt` (UPCIE_NVME_VIRT_RT_*), `nr` resources (assign and allocate). The
 * completion's DW0 is the number of resources the controller now has of that type.
 */
UPCIE_HD static inline int upcie_nvme_cmd_virt_mgmt(struct upcie_nvme_sqe *sqe, uint8_t act,
						    uint8_t rt, uint16_t cntlid, uint16_t nr)
{
	if (act > 0xf || rt > 0x7)
		return -EINVAL;
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_ADMIN_VIRT_MGMT, 0);
	sqe->cdw10 = act | ((uint32_t)rt << 8) | ((uint32_t)cntlid << 16);
	sqe->cdw11 = nr;
	return 0;
}

/*
 * Namespace Attachment: attach (`attach` true) or detach namespace `nsid` to or from the
 * controllers of a Controller List (struct upcie_nvme_ctrl_list, 4096 bytes, the data).
 */
UPCIE_HD static inline int upcie_nvme_cmd_ns_attach(struct upcie_nvme_sqe *sqe, uint32_t nsid,
						    bool attach)
{
	if (!nsid || nsid == UPCIE_NVME_NSID_ALL)
		return -EINVAL;
	upcie_nvme_cmd_init_(sqe, UPCIE_NVME_ADMIN_NS_ATTACH, nsid);
	sqe->cdw10 = attach ? 0u : 1u;
	return 0;
}

#endif /* UPCIE_NVME_CMD_H */
