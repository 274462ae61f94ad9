/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * NVMe definitions from the NVM Express Base Specification 1.4 / 2.0 and the NVM Command Set
 * Specification: controller registers and their fields, doorbell offsets, the submission and
 * completion queue entry layouts, opcodes and status codes. The Identify data structures, CNS,
 * feature and log page identifiers are in nvme/spec_id.h.
 *
 * Needs nothing at run time; every accessor is pure arithmetic, usable in CUDA/HIP device code
 * (UPCIE_HD). Field accessors take the raw register or dword value and return the field as the
 * spec defines it: a "0's based" field is returned as stored (MQES = 2047 means 2048 entries);
 * helpers that convert to natural units say so in their name (_bytes, _ms, _entries).
 * Little-endian hosts only (x86-64, aarch64): structures are the wire layout, used in place.
 * Does not access hardware: reading and writing the registers is the controller layer's job.
 */
#ifndef UPCIE_NVME_SPEC_H
#define UPCIE_NVME_SPEC_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <upcie/base/compiler.h>

#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "upcie: NVMe structures are used in place and assume a little-endian host"
#endif
#endif

/*
 * Controller registers (byte offsets into BAR0).
 */
#define UPCIE_NVME_REG_CAP     0x0000 /* 64 bit: controller capabilities */
#define UPCIE_NVME_REG_VS      0x0008 /* version */
#define UPCIE_NVME_REG_INTMS   0x000c /* interrupt mask set */
#define UPCIE_NVME_REG_INTMC   0x0010 /* interrupt mask clear */
#define UPCIE_NVME_REG_CC      0x0014 /* controller configuration */
#define UPCIE_NVME_REG_CSTS    0x001c /* controller status */
#define UPCIE_NVME_REG_NSSR    0x0020 /* NVM subsystem reset */
#define UPCIE_NVME_REG_AQA     0x0024 /* admin queue attributes */
#define UPCIE_NVME_REG_ASQ     0x0028 /* 64 bit: admin SQ base */
#define UPCIE_NVME_REG_ACQ     0x0030 /* 64 bit: admin CQ base */
#define UPCIE_NVME_REG_CMBLOC  0x0038 /* controller memory buffer location */
#define UPCIE_NVME_REG_CMBSZ   0x003c /* controller memory buffer size */
#define UPCIE_NVME_REG_BPINFO  0x0040 /* boot partition information */
#define UPCIE_NVME_REG_BPRSEL  0x0044 /* boot partition read select */
#define UPCIE_NVME_REG_BPMBL   0x0048 /* 64 bit: boot partition memory buffer location */
#define UPCIE_NVME_REG_CMBMSC  0x0050 /* 64 bit: CMB memory space control */
#define UPCIE_NVME_REG_CMBSTS  0x0058 /* CMB status */
#define UPCIE_NVME_REG_CRTO    0x0068 /* controller ready timeouts (2.0) */
#define UPCIE_NVME_REG_PMRCAP  0x0e00 /* persistent memory region capabilities */
#define UPCIE_NVME_REG_PMRCTL  0x0e04 /* PMR control */
#define UPCIE_NVME_REG_PMRSTS  0x0e08 /* PMR status */
#define UPCIE_NVME_REG_PMREBS  0x0e0c /* PMR elasticity buffer size */
#define UPCIE_NVME_REG_PMRSWTP 0x0e10 /* PMR sustained write throughput */
#define UPCIE_NVME_REG_PMRMSCL 0x0e14 /* PMR memory space control, lower */
#define UPCIE_NVME_REG_PMRMSCU 0x0e18 /* PMR memory space control, upper */
#define UPCIE_NVME_REG_DBS     0x1000 /* first doorbell */

/*
 * Field accessors. UPCIE_NVME_FIELD_(reg, name, type, shift, width) defines
 * upcie_nvme_<reg>_<name>(value): the field of `width` bits at bit `shift`.
 */
#define UPCIE_NVME_FIELD_(reg, name, type, shift, width)                                           \
	UPCIE_HD static inline uint32_t upcie_nvme_##reg##_##name(type v)                          \
	{                                                                                          \
		return (uint32_t)((v >> (shift)) & ((UINT64_C(1) << (width)) - 1));                \
	}

/* CAP (64 bit) */
UPCIE_NVME_FIELD_(cap, mqes, uint64_t, 0, 16)	/* max queue entries, 0's based */
UPCIE_NVME_FIELD_(cap, cqr, uint64_t, 16, 1)	/* contiguous queues required */
UPCIE_NVME_FIELD_(cap, ams, uint64_t, 17, 2)	/* arbitration: bit0 WRR+urgent, bit1 vendor */
UPCIE_NVME_FIELD_(cap, to, uint64_t, 24, 8)	/* ready timeout, 500 ms units */
UPCIE_NVME_FIELD_(cap, dstrd, uint64_t, 32, 4)	/* doorbell stride: 4 << DSTRD bytes */
UPCIE_NVME_FIELD_(cap, nssrs, uint64_t, 36, 1)	/* NVM subsystem reset supported */
UPCIE_NVME_FIELD_(cap, css, uint64_t, 37, 8)	/* command sets supported (UPCIE_NVME_CAP_CSS_*) */
UPCIE_NVME_FIELD_(cap, bps, uint64_t, 45, 1)	/* boot partition support */
UPCIE_NVME_FIELD_(cap, cps, uint64_t, 46, 2)	/* controller power scope (2.0) */
UPCIE_NVME_FIELD_(cap, mpsmin, uint64_t, 48, 4) /* min memory page size: 4 KiB << MPSMIN */
UPCIE_NVME_FIELD_(cap, mpsmax, uint64_t, 52, 4) /* max memory page size: 4 KiB << MPSMAX */
UPCIE_NVME_FIELD_(cap, pmrs, uint64_t, 56, 1)	/* persistent memory region supported */
UPCIE_NVME_FIELD_(cap, cmbs, uint64_t, 57, 1)	/* controller memory buffer supported */
UPCIE_NVME_FIELD_(cap, nsss, uint64_t, 58, 1)	/* NVM subsystem shutdown supported (2.0) */
UPCIE_NVME_FIELD_(cap, crms, uint64_t, 59, 2)	/* controller ready modes: bit0 CRWMS, bit1 CRIMS */

#define UPCIE_NVME_CAP_CSS_NVM	  0x01 /* NVM command set */
#define UPCIE_NVME_CAP_CSS_IOCS	  0x40 /* one or more I/O command sets (CC.CSS = 6) */
#define UPCIE_NVME_CAP_CSS_NOIO	  0x80 /* admin command set only (CC.CSS = 7) */
#define UPCIE_NVME_CAP_CRMS_CRWMS 0x1  /* controller ready with media */
#define UPCIE_NVME_CAP_CRMS_CRIMS 0x2  /* controller ready independent of media */

/* Queue entries the controller allows per I/O queue (MQES is 0's based). */
UPCIE_HD static inline uint32_t upcie_nvme_cap_mqes_entries(uint64_t cap)
{
	return upcie_nvme_cap_mqes(cap) + 1;
}

/* CAP.TO in milliseconds: the worst case for CSTS.RDY to follow CC.EN. */
UPCIE_HD static inline uint32_t upcie_nvme_cap_to_ms(uint64_t cap)
{
	return upcie_nvme_cap_to(cap) * 500u;
}

/* Doorbell stride in bytes (4 << CAP.DSTRD). */
UPCIE_HD static inline uint32_t upcie_nvme_cap_dstrd_bytes(uint64_t cap)
{
	return 4u << upcie_nvme_cap_dstrd(cap);
}

/* log2 of the minimum / maximum memory page size (12 = 4 KiB). */
UPCIE_HD static inline unsigned upcie_nvme_cap_mpsmin_shift(uint64_t cap)
{
	return 12u + upcie_nvme_cap_mpsmin(cap);
}

/* log2 of the maximum memory page size the controller supports. */
UPCIE_HD static inline unsigned upcie_nvme_cap_mpsmax_shift(uint64_t cap)
{
	return 12u + upcie_nvme_cap_mpsmax(cap);
}

/* VS */
UPCIE_NVME_FIELD_(vs, ter, uint32_t, 0, 8)
UPCIE_NVME_FIELD_(vs, mnr, uint32_t, 8, 8)
UPCIE_NVME_FIELD_(vs, mjr, uint32_t, 16, 16)
#define UPCIE_NVME_VS(mjr, mnr, ter) (((uint32_t)(mjr) << 16) | ((uint32_t)(mnr) << 8) | (ter))

/* CC */
UPCIE_NVME_FIELD_(cc, en, uint32_t, 0, 1)
UPCIE_NVME_FIELD_(cc, css, uint32_t, 4, 3)
UPCIE_NVME_FIELD_(cc, mps, uint32_t, 7, 4)
UPCIE_NVME_FIELD_(cc, ams, uint32_t, 11, 3)
UPCIE_NVME_FIELD_(cc, shn, uint32_t, 14, 2)
UPCIE_NVME_FIELD_(cc, iosqes, uint32_t, 16, 4)
UPCIE_NVME_FIELD_(cc, iocqes, uint32_t, 20, 4)
UPCIE_NVME_FIELD_(cc, crime, uint32_t, 24, 1)

#define UPCIE_NVME_CC_CSS_NVM	 0 /* NVM command set */
#define UPCIE_NVME_CC_CSS_IOCS	 6 /* all supported I/O command sets (CAP.CSS bit 6) */
#define UPCIE_NVME_CC_CSS_ADMIN	 7 /* admin only (CAP.CSS bit 7) */
#define UPCIE_NVME_CC_AMS_RR	 0
#define UPCIE_NVME_CC_AMS_WRRU	 1
#define UPCIE_NVME_CC_AMS_VS	 7
#define UPCIE_NVME_CC_SHN_NONE	 0
#define UPCIE_NVME_CC_SHN_NORMAL 1
#define UPCIE_NVME_CC_SHN_ABRUPT 2

/* Fields of CC for upcie_nvme_cc_build(); each must fit its field. */
struct upcie_nvme_cc_fields {
	uint8_t en;	/* 1: enable */
	uint8_t css;	/* UPCIE_NVME_CC_CSS_* */
	uint8_t mps;	/* memory page size = 4 KiB << mps */
	uint8_t ams;	/* UPCIE_NVME_CC_AMS_* */
	uint8_t shn;	/* UPCIE_NVME_CC_SHN_* */
	uint8_t iosqes; /* log2 of the I/O SQ entry size: 6 (64 B) */
	uint8_t iocqes; /* log2 of the I/O CQ entry size: 4 (16 B) */
	uint8_t crime;	/* controller ready independent of media enable (2.0) */
};

/* Shift `v` into a `width`-bit field at `shift`; false when v does not fit. */
UPCIE_HD static inline bool upcie_nvme_field_put_(uint32_t *reg, uint32_t v, unsigned shift,
						  unsigned width)
{
	if (v >> width)
		return false;
	*reg |= v << shift;
	return true;
}

/* Compose a CC value. Returns 0, or -EINVAL when a field does not fit its width. */
UPCIE_HD static inline int upcie_nvme_cc_build(const struct upcie_nvme_cc_fields *f, uint32_t *cc)
{
	uint32_t v = 0;
	bool ok =
	    upcie_nvme_field_put_(&v, f->en, 0, 1) && upcie_nvme_field_put_(&v, f->css, 4, 3) &&
	    upcie_nvme_field_put_(&v, f->mps, 7, 4) && upcie_nvme_field_put_(&v, f->ams, 11, 3) &&
	    upcie_nvme_field_put_(&v, f->shn, 14, 2) &&
	    upcie_nvme_field_put_(&v, f->iosqes, 16, 4) &&
	    upcie_nvme_field_put_(&v, f->iocqes, 20, 4) &&
	    upcie_nvme_field_put_(&v, f->crime, 24, 1);

	if (!ok)
		return -EINVAL;
	*cc = v;
	return 0;
}

/* CC with EN replaced (read-modify-write of enable / disable). */
UPCIE_HD static inline uint32_t upcie_nvme_cc_set_en(uint32_t cc, bool en)
{
	return (cc & ~UINT32_C(1)) | (en ? 1u : 0u);
}

/* CC with SHN replaced (shutdown notification). */
UPCIE_HD static inline uint32_t upcie_nvme_cc_set_shn(uint32_t cc, uint32_t shn)
{
	return (cc & ~(UINT32_C(3) << 14)) | ((shn & 3u) << 14);
}

/* CSTS */
UPCIE_NVME_FIELD_(csts, rdy, uint32_t, 0, 1)
UPCIE_NVME_FIELD_(csts, cfs, uint32_t, 1, 1)
UPCIE_NVME_FIELD_(csts, shst, uint32_t, 2, 2)
UPCIE_NVME_FIELD_(csts, nssro, uint32_t, 4, 1)
UPCIE_NVME_FIELD_(csts, pp, uint32_t, 5, 1)
UPCIE_NVME_FIELD_(csts, st, uint32_t, 6, 1)
#define UPCIE_NVME_CSTS_SHST_NORMAL   0
#define UPCIE_NVME_CSTS_SHST_OCCURING 1
#define UPCIE_NVME_CSTS_SHST_COMPLETE 2
/* CSTS.NSSRO: an NVM subsystem reset occurred; write 1 to clear it (RW1C). */
#define UPCIE_NVME_CSTS_NSSRO (UINT32_C(1) << 4)
/* The value written to NSSR to reset the NVM subsystem ("NVMe" in ASCII). */
#define UPCIE_NVME_NSSR_RESET UINT32_C(0x4e564d65)
/* A register read of all ones means the device is gone (surprise removal, failed link). */
#define UPCIE_NVME_REG_GONE UINT32_C(0xffffffff)

/* AQA: admin queue sizes, 0's based, 12 bits each. */
UPCIE_NVME_FIELD_(aqa, asqs, uint32_t, 0, 12)
UPCIE_NVME_FIELD_(aqa, acqs, uint32_t, 16, 12)

/* Compose AQA from entry counts (2..4096 each). Returns 0 or -EINVAL. */
UPCIE_HD static inline int upcie_nvme_aqa_build(uint32_t sq_entries, uint32_t cq_entries,
						uint32_t *aqa)
{
	if (sq_entries < 2 || sq_entries > 4096 || cq_entries < 2 || cq_entries > 4096)
		return -EINVAL;
	*aqa = (sq_entries - 1) | ((cq_entries - 1) << 16);
	return 0;
}

/* CMBLOC */
UPCIE_NVME_FIELD_(cmbloc, bir, uint32_t, 0, 3)
UPCIE_NVME_FIELD_(cmbloc, cqmms, uint32_t, 3, 1)
UPCIE_NVME_FIELD_(cmbloc, cqpds, uint32_t, 4, 1)
UPCIE_NVME_FIELD_(cmbloc, cdpmls, uint32_t, 5, 1)
UPCIE_NVME_FIELD_(cmbloc, cdpcils, uint32_t, 6, 1)
UPCIE_NVME_FIELD_(cmbloc, cdmmms, uint32_t, 7, 1)
UPCIE_NVME_FIELD_(cmbloc, cqda, uint32_t, 8, 1)
UPCIE_NVME_FIELD_(cmbloc, ofst, uint32_t, 12, 20) /* in CMBSZ.SZU units */

/* CMBSZ */
UPCIE_NVME_FIELD_(cmbsz, sqs, uint32_t, 0, 1)
UPCIE_NVME_FIELD_(cmbsz, cqs, uint32_t, 1, 1)
UPCIE_NVME_FIELD_(cmbsz, lists, uint32_t, 2, 1)
UPCIE_NVME_FIELD_(cmbsz, rds, uint32_t, 3, 1)
UPCIE_NVME_FIELD_(cmbsz, wds, uint32_t, 4, 1)
UPCIE_NVME_FIELD_(cmbsz, szu, uint32_t, 8, 4) /* size unit: 4 KiB << (4 * SZU) */
UPCIE_NVME_FIELD_(cmbsz, sz, uint32_t, 12, 20)

/* CMB size unit in bytes (0 for a reserved SZU). */
UPCIE_HD static inline uint64_t upcie_nvme_cmbsz_unit_bytes(uint32_t cmbsz)
{
	uint32_t szu = upcie_nvme_cmbsz_szu(cmbsz);

	return szu > 6 ? 0 : UINT64_C(4096) << (4 * szu);
}

/* CMB size in bytes (SZ units of the size unit; 0 for a reserved SZU). */
UPCIE_HD static inline uint64_t upcie_nvme_cmbsz_bytes(uint32_t cmbsz)
{
	return upcie_nvme_cmbsz_unit_bytes(cmbsz) * upcie_nvme_cmbsz_sz(cmbsz);
}

/* BPINFO */
UPCIE_NVME_FIELD_(bpinfo, bpsz, uint32_t, 0, 15) /* 128 KiB units */
UPCIE_NVME_FIELD_(bpinfo, brs, uint32_t, 24, 2)
UPCIE_NVME_FIELD_(bpinfo, abpid, uint32_t, 31, 1)

/* CMBMSC (64 bit) */
UPCIE_NVME_FIELD_(cmbmsc, cre, uint64_t, 0, 1)
UPCIE_NVME_FIELD_(cmbmsc, cmse, uint64_t, 1, 1)
/* Controller base address of the CMB (bits 63:12, returned in place). */
UPCIE_HD static inline uint64_t upcie_nvme_cmbmsc_cba(uint64_t v)
{
	return v & ~UINT64_C(0xfff);
}

/* CMBSTS */
UPCIE_NVME_FIELD_(cmbsts, cbai, uint32_t, 0, 1)

/* CRTO (2.0): ready timeouts in 500 ms units, with and independent of media. */
UPCIE_NVME_FIELD_(crto, crwmt, uint32_t, 0, 16)
UPCIE_NVME_FIELD_(crto, crimt, uint32_t, 16, 16)

/* PMRCAP */
UPCIE_NVME_FIELD_(pmrcap, rds, uint32_t, 3, 1)
UPCIE_NVME_FIELD_(pmrcap, wds, uint32_t, 4, 1)
UPCIE_NVME_FIELD_(pmrcap, bir, uint32_t, 5, 3)
UPCIE_NVME_FIELD_(pmrcap, pmrtu, uint32_t, 8, 2) /* 0: 500 ms, 1: minutes */
UPCIE_NVME_FIELD_(pmrcap, pmrwbm, uint32_t, 10, 4)
UPCIE_NVME_FIELD_(pmrcap, pmrto, uint32_t, 16, 8)
UPCIE_NVME_FIELD_(pmrcap, cmss, uint32_t, 24, 1)

/* PMRCTL */
UPCIE_NVME_FIELD_(pmrctl, en, uint32_t, 0, 1)

/* PMRSTS */
UPCIE_NVME_FIELD_(pmrsts, err, uint32_t, 0, 8)
UPCIE_NVME_FIELD_(pmrsts, nrdy, uint32_t, 8, 1)
UPCIE_NVME_FIELD_(pmrsts, hsts, uint32_t, 9, 3)
UPCIE_NVME_FIELD_(pmrsts, cbai, uint32_t, 12, 1)

/* PMREBS */
UPCIE_NVME_FIELD_(pmrebs, pmrszu, uint32_t, 0, 4) /* 0 B, 1 KiB, 2 MiB, 3 GiB */
UPCIE_NVME_FIELD_(pmrebs, rbb, uint32_t, 4, 1)
UPCIE_NVME_FIELD_(pmrebs, pmrwbz, uint32_t, 8, 24)

/* PMRSWTP */
UPCIE_NVME_FIELD_(pmrswtp, pmrswtu, uint32_t, 0, 4) /* 0 B/s, 1 KiB/s, 2 MiB/s, 3 GiB/s */
UPCIE_NVME_FIELD_(pmrswtp, pmrswtv, uint32_t, 8, 24)

/* PMRMSCL / PMRMSCU */
UPCIE_NVME_FIELD_(pmrmscl, cmse, uint32_t, 1, 1)
/* Controller base address of the PMR from PMRMSCU:PMRMSCL. */
UPCIE_HD static inline uint64_t upcie_nvme_pmrmsc_cba(uint32_t pmrmscl, uint32_t pmrmscu)
{
	return ((uint64_t)pmrmscu << 32) | (pmrmscl & ~UINT32_C(0xfff));
}

/*
 * Doorbells: SQ y tail at 0x1000 + (2y) * stride, CQ y head at 0x1000 + (2y + 1) * stride,
 * stride = 4 << CAP.DSTRD.
 */
UPCIE_HD static inline size_t upcie_nvme_sq_tdbl_off(uint16_t qid, uint32_t dstrd)
{
	return UPCIE_NVME_REG_DBS + ((size_t)(2u * qid) << (2 + dstrd));
}

/* Offset of CQ `qid`'s head doorbell, `dstrd` being CAP.DSTRD. */
UPCIE_HD static inline size_t upcie_nvme_cq_hdbl_off(uint16_t qid, uint32_t dstrd)
{
	return UPCIE_NVME_REG_DBS + ((size_t)(2u * qid + 1u) << (2 + dstrd));
}

/*
 * Identify MDTS (a power of two in units of the minimum memory page size) in bytes.
 * MDTS 0 means no limit: UINT64_MAX.
 */
UPCIE_HD static inline uint64_t upcie_nvme_mdts_bytes(uint8_t mdts, uint64_t cap)
{
	unsigned shift = upcie_nvme_cap_mpsmin_shift(cap) + mdts;

	if (!mdts || shift >= 64)
		return UINT64_MAX;
	return UINT64_C(1) << shift;
}

/*
 * Submission queue entry: 64 bytes. Command dword 0 is split into opc, flags (FUSE in bits 1:0,
 * PSDT in bits 7:6) and cid, so the queue code can place a CID with one 16-bit store.
 * The data pointer holds PRP1/PRP2, or the 16-byte SGL descriptor SGL1 (address in prp1,
 * length | identifier << 56 in prp2).
 */
struct upcie_nvme_sqe {
	uint8_t opc;
	uint8_t flags;
	uint16_t cid;
	uint32_t nsid;
	uint32_t cdw2;
	uint32_t cdw3;
	uint64_t mptr;
	uint64_t prp1;
	uint64_t prp2;
	uint32_t cdw10;
	uint32_t cdw11;
	uint32_t cdw12;
	uint32_t cdw13;
	uint32_t cdw14;
	uint32_t cdw15;
};
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_sqe) == 64, "SQE is 64 bytes");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_sqe, cid) == 2, "CID at byte 2");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_sqe, nsid) == 4, "NSID at byte 4");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_sqe, mptr) == 16, "MPTR at byte 16");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_sqe, prp1) == 24, "DPTR at byte 24");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_sqe, cdw10) == 40, "CDW10 at byte 40");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_sqe, cdw15) == 60, "CDW15 at byte 60");

#define UPCIE_NVME_FUSE_NONE   0
#define UPCIE_NVME_FUSE_FIRST  1
#define UPCIE_NVME_FUSE_SECOND 2
#define UPCIE_NVME_PSDT_PRP    0 /* PRPs */
#define UPCIE_NVME_PSDT_SGL    1 /* SGL, MPTR is the address of a contiguous metadata buffer */
#define UPCIE_NVME_PSDT_SGL_MS 2 /* SGL, MPTR is the address of an SGL segment for metadata */

/* Command dword 0 as the controller sees it: opcode, flags (FUSE, PSDT) and CID. */
UPCIE_HD static inline uint32_t upcie_nvme_sqe_cdw0(const struct upcie_nvme_sqe *sqe)
{
	return sqe->opc | ((uint32_t)sqe->flags << 8) | ((uint32_t)sqe->cid << 16);
}

/* The FUSE field (0: normal command; 1, 2: first, second of a fused pair). */
UPCIE_HD static inline uint32_t upcie_nvme_sqe_fuse(const struct upcie_nvme_sqe *sqe)
{
	return sqe->flags & 3u;
}

/* The PSDT field: UPCIE_NVME_PSDT_PRP or one of the SGL kinds. */
UPCIE_HD static inline uint32_t upcie_nvme_sqe_psdt(const struct upcie_nvme_sqe *sqe)
{
	return (uint32_t)(sqe->flags >> 6) & 3u;
}

/* Set FUSE, leaving the other flag bits alone. */
UPCIE_HD static inline void upcie_nvme_sqe_set_fuse(struct upcie_nvme_sqe *sqe, uint32_t fuse)
{
	sqe->flags = (uint8_t)((sqe->flags & ~3u) | (fuse & 3u));
}

/* Set PSDT, leaving the other flag bits alone. */
UPCIE_HD static inline void upcie_nvme_sqe_set_psdt(struct upcie_nvme_sqe *sqe, uint32_t psdt)
{
	sqe->flags = (uint8_t)((sqe->flags & 0x3fu) | ((psdt & 3u) << 6));
}

/*
 * SGL descriptors (16 bytes): address, length, and an identifier byte with the type in bits 7:4
 * and the subtype in bits 3:0.
 */
struct upcie_nvme_sgl_desc {
	uint64_t addr;
	uint32_t len;
	uint8_t rsvd[3];
	uint8_t id;
};
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_sgl_desc) == 16, "SGL descriptor is 16 bytes");

#define UPCIE_NVME_SGL_DATA_BLOCK    0x0
#define UPCIE_NVME_SGL_BIT_BUCKET    0x1
#define UPCIE_NVME_SGL_SEGMENT	     0x2
#define UPCIE_NVME_SGL_LAST_SEGMENT  0x3
#define UPCIE_NVME_SGL_KEYED	     0x4
#define UPCIE_NVME_SGL_SUB_ADDRESS   0x0
#define UPCIE_NVME_SGL_SUB_OFFSET    0x1
#define UPCIE_NVME_SGL_ID(type, sub) ((uint8_t)(((type) << 4) | (sub)))

/* Place an SGL descriptor in the SQE's data pointer (SGL1); sets PSDT to SGL. */
UPCIE_HD static inline void upcie_nvme_sqe_set_sgl1(struct upcie_nvme_sqe *sqe, uint64_t addr,
						    uint32_t len, uint8_t id)
{
	sqe->prp1 = addr;
	sqe->prp2 = (uint64_t)len | ((uint64_t)id << 56);
	upcie_nvme_sqe_set_psdt(sqe, UPCIE_NVME_PSDT_SGL);
}

/* SGL1's address, where PSDT selects SGLs (the same bytes as PRP1). */
UPCIE_HD static inline uint64_t upcie_nvme_sqe_sgl1_addr(const struct upcie_nvme_sqe *sqe)
{
	return sqe->prp1;
}

/* SGL1's length in bytes (descriptor bytes 8-11, in PRP2's place). */
UPCIE_HD static inline uint32_t upcie_nvme_sqe_sgl1_len(const struct upcie_nvme_sqe *sqe)
{
	return (uint32_t)sqe->prp2;
}

/* SGL1's identifier byte: type in bits 7:4, subtype in 3:0. */
UPCIE_HD static inline uint8_t upcie_nvme_sqe_sgl1_id(const struct upcie_nvme_sqe *sqe)
{
	return (uint8_t)(sqe->prp2 >> 56);
}

/*
 * Completion queue entry: 16 bytes. dw2 holds SQHD (15:0) and SQID (31:16); dw3 holds CID (15:0),
 * the phase tag (16) and the status field (31:17). dw3 is read as one 32-bit load so the phase
 * and the CID come from the same access.
 */
struct upcie_nvme_cqe {
	uint32_t dw0;
	uint32_t dw1;
	uint32_t dw2;
	uint32_t dw3;
};
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_cqe) == 16, "CQE is 16 bytes");

/* SQ head pointer: how far the controller has consumed the SQ, which frees SQ slots. */
UPCIE_HD static inline uint16_t upcie_nvme_cqe_sqhd(const struct upcie_nvme_cqe *cqe)
{
	return (uint16_t)cqe->dw2;
}

/* The SQ whose command this entry completes (a CQ may serve several SQs). */
UPCIE_HD static inline uint16_t upcie_nvme_cqe_sqid(const struct upcie_nvme_cqe *cqe)
{
	return (uint16_t)(cqe->dw2 >> 16);
}

/* The command identifier; the controller wrote it, so check it is outstanding before use. */
UPCIE_HD static inline uint16_t upcie_nvme_cqe_cid(const struct upcie_nvme_cqe *cqe)
{
	return (uint16_t)cqe->dw3;
}

/* The phase tag (0 or 1): the entry is new when it matches the phase the CQ expects. */
UPCIE_HD static inline uint32_t upcie_nvme_cqe_phase(const struct upcie_nvme_cqe *cqe)
{
	return (cqe->dw3 >> 16) & 1u;
}

/*
 * Status. The 15-bit status field (dw3 bits 31:17) is SC (7:0), SCT (10:8), CRD (12:11),
 * More (13) and DNR (14). upcie names a status by its code, (SCT << 8) | SC, one value per
 * meaning, so a switch over upcie_nvme_cqe_code() reads like the spec's tables.
 */
#define UPCIE_NVME_SCT_GENERIC 0x0
#define UPCIE_NVME_SCT_CMD     0x1 /* command specific */
#define UPCIE_NVME_SCT_MEDIA   0x2 /* media and data integrity errors */
#define UPCIE_NVME_SCT_PATH    0x3 /* path related */
#define UPCIE_NVME_SCT_VENDOR  0x7

#define UPCIE_NVME_CODE(sct, sc) ((uint16_t)(((sct) << 8) | (sc)))

enum upcie_nvme_code {
	/* generic */
	UPCIE_NVME_SC_SUCCESS = 0x000,
	UPCIE_NVME_SC_INVALID_OPCODE = 0x001,
	UPCIE_NVME_SC_INVALID_FIELD = 0x002,
	UPCIE_NVME_SC_CID_CONFLICT = 0x003,
	UPCIE_NVME_SC_DATA_XFER_ERROR = 0x004,
	UPCIE_NVME_SC_POWER_LOSS = 0x005,
	UPCIE_NVME_SC_INTERNAL = 0x006,
	UPCIE_NVME_SC_ABORT_REQ = 0x007,
	UPCIE_NVME_SC_ABORT_SQ_DELETED = 0x008,
	UPCIE_NVME_SC_ABORT_FUSE_FAIL = 0x009,
	UPCIE_NVME_SC_ABORT_FUSE_MISSING = 0x00a,
	UPCIE_NVME_SC_INVALID_NS = 0x00b,
	UPCIE_NVME_SC_CMD_SEQ_ERROR = 0x00c,
	UPCIE_NVME_SC_SGL_INVALID_LAST = 0x00d,
	UPCIE_NVME_SC_SGL_INVALID_COUNT = 0x00e,
	UPCIE_NVME_SC_SGL_INVALID_DATA_LEN = 0x00f,
	UPCIE_NVME_SC_SGL_INVALID_MD_LEN = 0x010,
	UPCIE_NVME_SC_SGL_INVALID_TYPE = 0x011,
	UPCIE_NVME_SC_CMB_INVALID_USE = 0x012,
	UPCIE_NVME_SC_PRP_INVALID_OFFSET = 0x013,
	UPCIE_NVME_SC_ATOMIC_WU_EXCEEDED = 0x014,
	UPCIE_NVME_SC_OP_DENIED = 0x015,
	UPCIE_NVME_SC_SGL_INVALID_OFFSET = 0x016,
	UPCIE_NVME_SC_HOSTID_INCONSISTENT = 0x018,
	UPCIE_NVME_SC_KA_EXPIRED = 0x019,
	UPCIE_NVME_SC_KA_INVALID = 0x01a,
	UPCIE_NVME_SC_ABORT_PREEMPT = 0x01b,
	UPCIE_NVME_SC_SANITIZE_FAILED = 0x01c,
	UPCIE_NVME_SC_SANITIZE_IN_PROGRESS = 0x01d,
	UPCIE_NVME_SC_SGL_INVALID_GRANULARITY = 0x01e,
	UPCIE_NVME_SC_CMD_NOT_SUP_CMB_QUEUE = 0x01f,
	UPCIE_NVME_SC_NS_WRITE_PROTECTED = 0x020,
	UPCIE_NVME_SC_CMD_INTERRUPTED = 0x021,
	UPCIE_NVME_SC_TRANSIENT_TR_ERR = 0x022,
	UPCIE_NVME_SC_LBA_RANGE = 0x080,
	UPCIE_NVME_SC_CAP_EXCEEDED = 0x081,
	UPCIE_NVME_SC_NS_NOT_READY = 0x082,
	UPCIE_NVME_SC_RESERVATION_CONFLICT = 0x083,
	UPCIE_NVME_SC_FORMAT_IN_PROGRESS = 0x084,
	/* command specific */
	UPCIE_NVME_SC_CQ_INVALID = 0x100,
	UPCIE_NVME_SC_QID_INVALID = 0x101,
	UPCIE_NVME_SC_QUEUE_SIZE = 0x102,
	UPCIE_NVME_SC_ABORT_LIMIT = 0x103,
	UPCIE_NVME_SC_AER_LIMIT = 0x105,
	UPCIE_NVME_SC_FW_SLOT = 0x106,
	UPCIE_NVME_SC_FW_IMAGE = 0x107,
	UPCIE_NVME_SC_INVALID_VECTOR = 0x108,
	UPCIE_NVME_SC_INVALID_LOG_PAGE = 0x109,
	UPCIE_NVME_SC_INVALID_FORMAT = 0x10a,
	UPCIE_NVME_SC_FW_NEEDS_RESET = 0x10b,
	UPCIE_NVME_SC_INVALID_QUEUE_DELETE = 0x10c,
	UPCIE_NVME_SC_FEATURE_NOT_SAVEABLE = 0x10d,
	UPCIE_NVME_SC_FEATURE_NOT_CHANGEABLE = 0x10e,
	UPCIE_NVME_SC_FEATURE_NOT_PER_NS = 0x10f,
	UPCIE_NVME_SC_NS_ALREADY_ATTACHED = 0x118,
	UPCIE_NVME_SC_NS_PRIVATE = 0x119,
	UPCIE_NVME_SC_NS_NOT_ATTACHED = 0x11a,
	UPCIE_NVME_SC_CTRL_LIST_INVALID = 0x11c,
	UPCIE_NVME_SC_CTRL_ID_INVALID = 0x11f,
	UPCIE_NVME_SC_SEC_CTRL_STATE = 0x120,
	UPCIE_NVME_SC_NUM_RESOURCES = 0x121,
	UPCIE_NVME_SC_RESOURCE_ID = 0x122,
	UPCIE_NVME_SC_CONFLICTING_ATTRS = 0x180,
	UPCIE_NVME_SC_INVALID_PI = 0x181,
	UPCIE_NVME_SC_READ_ONLY = 0x182,
	/* command specific, Zoned Namespace Command Set */
	UPCIE_NVME_SC_ZONE_BOUNDARY = 0x1b8,
	UPCIE_NVME_SC_ZONE_FULL = 0x1b9,
	UPCIE_NVME_SC_ZONE_READ_ONLY = 0x1ba,
	UPCIE_NVME_SC_ZONE_OFFLINE = 0x1bb,
	UPCIE_NVME_SC_ZONE_INVALID_WRITE = 0x1bc,
	UPCIE_NVME_SC_ZONE_TOO_MANY_ACTIVE = 0x1bd,
	UPCIE_NVME_SC_ZONE_TOO_MANY_OPEN = 0x1be,
	UPCIE_NVME_SC_ZONE_INVALID_TRANSITION = 0x1bf,
	/* media and data integrity */
	UPCIE_NVME_SC_WRITE_FAULT = 0x280,
	UPCIE_NVME_SC_UNRECOVERED_READ = 0x281,
	UPCIE_NVME_SC_GUARD_CHECK = 0x282,
	UPCIE_NVME_SC_APPTAG_CHECK = 0x283,
	UPCIE_NVME_SC_REFTAG_CHECK = 0x284,
	UPCIE_NVME_SC_COMPARE_FAILED = 0x285,
	UPCIE_NVME_SC_ACCESS_DENIED = 0x286,
	UPCIE_NVME_SC_DEALLOCATED_BLOCK = 0x287,
	/* path related */
	UPCIE_NVME_SC_INTERNAL_PATH = 0x300,
	UPCIE_NVME_SC_ANA_PERSISTENT_LOSS = 0x301,
	UPCIE_NVME_SC_ANA_INACCESSIBLE = 0x302,
	UPCIE_NVME_SC_ANA_TRANSITION = 0x303,
	UPCIE_NVME_SC_CTRL_PATH_ERROR = 0x360,
	UPCIE_NVME_SC_HOST_PATH_ERROR = 0x370,
	UPCIE_NVME_SC_HOST_ABORTED = 0x371,
};

/* A decoded status field. */
struct upcie_nvme_status {
	uint8_t sc;  /* status code */
	uint8_t sct; /* status code type (UPCIE_NVME_SCT_*) */
	uint8_t crd; /* command retry delay selector (0: none, 1..3: Identify CRDT1..3) */
	bool more;   /* more information in the Error Information log page */
	bool dnr;    /* do not retry: the same command will fail again */
	bool phase;  /* phase tag of the entry */
};

/* Split dw3's status field (and phase tag) into its parts, for logs and retry decisions. */
UPCIE_HD static inline struct upcie_nvme_status upcie_nvme_status_decode(uint32_t dw3)
{
	struct upcie_nvme_status s;
	uint32_t sf = dw3 >> 17;

	s.sc = (uint8_t)sf;
	s.sct = (uint8_t)((sf >> 8) & 7u);
	s.crd = (uint8_t)((sf >> 11) & 3u);
	s.more = (sf >> 13) & 1u;
	s.dnr = (sf >> 14) & 1u;
	s.phase = (dw3 >> 16) & 1u;
	return s;
}

/* (SCT << 8) | SC of a completion: an enum upcie_nvme_code value, 0 for success. */
UPCIE_HD static inline uint16_t upcie_nvme_cqe_code(const struct upcie_nvme_cqe *cqe)
{
	return (uint16_t)((cqe->dw3 >> 17) & 0x7ffu);
}

/* True for a successful completion (status code 0 of type 0). */
UPCIE_HD static inline bool upcie_nvme_cqe_ok(const struct upcie_nvme_cqe *cqe)
{
	return upcie_nvme_cqe_code(cqe) == 0;
}

/* Do Not Retry: the controller says the same command would fail again. */
UPCIE_HD static inline bool upcie_nvme_cqe_dnr(const struct upcie_nvme_cqe *cqe)
{
	return (cqe->dw3 >> 31) & 1u;
}

/* Build dw3 from its parts (for controller models and synthesized completions). */
UPCIE_HD static inline uint32_t upcie_nvme_cqe_dw3_make(uint16_t cid, uint32_t phase, uint16_t code,
							bool dnr)
{
	return cid | ((phase & 1u) << 16) | ((uint32_t)(code & 0x7ffu) << 17) |
	       ((dnr ? 1u : 0u) << 31);
}

/* Name of a status code (SCT << 8 | SC), as the spec words it; never NULL. */
UPCIE_HD static inline const char *upcie_nvme_status_str(uint16_t code)
{
	switch (code) {
	case UPCIE_NVME_SC_SUCCESS:
		return "successful completion";
	case UPCIE_NVME_SC_INVALID_OPCODE:
		return "invalid command opcode";
	case UPCIE_NVME_SC_INVALID_FIELD:
		return "invalid field in command";
	case UPCIE_NVME_SC_CID_CONFLICT:
		return "command ID conflict";
	case UPCIE_NVME_SC_DATA_XFER_ERROR:
		return "data transfer error";
	case UPCIE_NVME_SC_POWER_LOSS:
		return "commands aborted due to power loss notification";
	case UPCIE_NVME_SC_INTERNAL:
		return "internal error";
	case UPCIE_NVME_SC_ABORT_REQ:
		return "command abort requested";
	case UPCIE_NVME_SC_ABORT_SQ_DELETED:
		return "command aborted due to SQ deletion";
	case UPCIE_NVME_SC_ABORT_FUSE_FAIL:
		return "command aborted due to failed fused command";
	case UPCIE_NVME_SC_ABORT_FUSE_MISSING:
		return "command aborted due to missing fused command";
	case UPCIE_NVME_SC_INVALID_NS:
		return "invalid namespace or format";
	case UPCIE_NVME_SC_CMD_SEQ_ERROR:
		return "command sequence error";
	case UPCIE_NVME_SC_SGL_INVALID_LAST:
		return "invalid SGL segment descriptor";
	case UPCIE_NVME_SC_SGL_INVALID_COUNT:
		return "invalid number of SGL descriptors";
	case UPCIE_NVME_SC_SGL_INVALID_DATA_LEN:
		return "data SGL length invalid";
	case UPCIE_NVME_SC_SGL_INVALID_MD_LEN:
		return "metadata SGL length invalid";
	case UPCIE_NVME_SC_SGL_INVALID_TYPE:
		return "SGL descriptor type invalid";
	case UPCIE_NVME_SC_CMB_INVALID_USE:
		return "invalid use of controller memory buffer";
	case UPCIE_NVME_SC_PRP_INVALID_OFFSET:
		return "PRP offset invalid";
	case UPCIE_NVME_SC_ATOMIC_WU_EXCEEDED:
		return "atomic write unit exceeded";
	case UPCIE_NVME_SC_OP_DENIED:
		return "operation denied";
	case UPCIE_NVME_SC_SGL_INVALID_OFFSET:
		return "SGL offset invalid";
	case UPCIE_NVME_SC_HOSTID_INCONSISTENT:
		return "host identifier inconsistent format";
	case UPCIE_NVME_SC_KA_EXPIRED:
		return "keep alive timer expired";
	case UPCIE_NVME_SC_KA_INVALID:
		return "keep alive timeout invalid";
	case UPCIE_NVME_SC_ABORT_PREEMPT:
		return "command aborted due to preempt and abort";
	case UPCIE_NVME_SC_SANITIZE_FAILED:
		return "sanitize failed";
	case UPCIE_NVME_SC_SANITIZE_IN_PROGRESS:
		return "sanitize in progress";
	case UPCIE_NVME_SC_SGL_INVALID_GRANULARITY:
		return "SGL data block granularity invalid";
	case UPCIE_NVME_SC_CMD_NOT_SUP_CMB_QUEUE:
		return "command not supported for queue in CMB";
	case UPCIE_NVME_SC_NS_WRITE_PROTECTED:
		return "namespace is write protected";
	case UPCIE_NVME_SC_CMD_INTERRUPTED:
		return "command interrupted";
	case UPCIE_NVME_SC_TRANSIENT_TR_ERR:
		return "transient transport error";
	case UPCIE_NVME_SC_LBA_RANGE:
		return "LBA out of range";
	case UPCIE_NVME_SC_CAP_EXCEEDED:
		return "capacity exceeded";
	case UPCIE_NVME_SC_NS_NOT_READY:
		return "namespace not ready";
	case UPCIE_NVME_SC_RESERVATION_CONFLICT:
		return "reservation conflict";
	case UPCIE_NVME_SC_FORMAT_IN_PROGRESS:
		return "format in progress";
	case UPCIE_NVME_SC_CQ_INVALID:
		return "completion queue invalid";
	case UPCIE_NVME_SC_QID_INVALID:
		return "invalid queue identifier";
	case UPCIE_NVME_SC_QUEUE_SIZE:
		return "invalid queue size";
	case UPCIE_NVME_SC_ABORT_LIMIT:
		return "abort command limit exceeded";
	case UPCIE_NVME_SC_AER_LIMIT:
		return "asynchronous event request limit exceeded";
	case UPCIE_NVME_SC_FW_SLOT:
		return "invalid firmware slot";
	case UPCIE_NVME_SC_FW_IMAGE:
		return "invalid firmware image";
	case UPCIE_NVME_SC_INVALID_VECTOR:
		return "invalid interrupt vector";
	case UPCIE_NVME_SC_INVALID_LOG_PAGE:
		return "invalid log page";
	case UPCIE_NVME_SC_INVALID_FORMAT:
		return "invalid format";
	case UPCIE_NVME_SC_FW_NEEDS_RESET:
		return "firmware activation requires conventional reset";
	case UPCIE_NVME_SC_INVALID_QUEUE_DELETE:
		return "invalid queue deletion";
	case UPCIE_NVME_SC_FEATURE_NOT_SAVEABLE:
		return "feature identifier not saveable";
	case UPCIE_NVME_SC_FEATURE_NOT_CHANGEABLE:
		return "feature not changeable";
	case UPCIE_NVME_SC_FEATURE_NOT_PER_NS:
		return "feature not namespace specific";
	case UPCIE_NVME_SC_NS_ALREADY_ATTACHED:
		return "namespace already attached";
	case UPCIE_NVME_SC_NS_PRIVATE:
		return "namespace is private";
	case UPCIE_NVME_SC_NS_NOT_ATTACHED:
		return "namespace not attached";
	case UPCIE_NVME_SC_CTRL_LIST_INVALID:
		return "controller list invalid";
	case UPCIE_NVME_SC_CTRL_ID_INVALID:
		return "invalid controller identifier";
	case UPCIE_NVME_SC_SEC_CTRL_STATE:
		return "invalid secondary controller state";
	case UPCIE_NVME_SC_NUM_RESOURCES:
		return "invalid number of controller resources";
	case UPCIE_NVME_SC_RESOURCE_ID:
		return "invalid resource identifier";
	case UPCIE_NVME_SC_CONFLICTING_ATTRS:
		return "conflicting attributes";
	case UPCIE_NVME_SC_INVALID_PI:
		return "invalid protection information";
	case UPCIE_NVME_SC_READ_ONLY:
		return "attempted write to read only range";
	case UPCIE_NVME_SC_ZONE_BOUNDARY:
		return "zone boundary error";
	case UPCIE_NVME_SC_ZONE_FULL:
		return "zone is full";
	case UPCIE_NVME_SC_ZONE_READ_ONLY:
		return "zone is read only";
	case UPCIE_NVME_SC_ZONE_OFFLINE:
		return "zone is offline";
	case UPCIE_NVME_SC_ZONE_INVALID_WRITE:
		return "zone invalid write (not at the write pointer)";
	case UPCIE_NVME_SC_ZONE_TOO_MANY_ACTIVE:
		return "too many active zones";
	case UPCIE_NVME_SC_ZONE_TOO_MANY_OPEN:
		return "too many open zones";
	case UPCIE_NVME_SC_ZONE_INVALID_TRANSITION:
		return "invalid zone state transition";
	case UPCIE_NVME_SC_WRITE_FAULT:
		return "write fault";
	case UPCIE_NVME_SC_UNRECOVERED_READ:
		return "unrecovered read error";
	case UPCIE_NVME_SC_GUARD_CHECK:
		return "end-to-end guard check error";
	case UPCIE_NVME_SC_APPTAG_CHECK:
		return "end-to-end application tag check error";
	case UPCIE_NVME_SC_REFTAG_CHECK:
		return "end-to-end reference tag check error";
	case UPCIE_NVME_SC_COMPARE_FAILED:
		return "compare failure";
	case UPCIE_NVME_SC_ACCESS_DENIED:
		return "access denied";
	case UPCIE_NVME_SC_DEALLOCATED_BLOCK:
		return "deallocated or unwritten logical block";
	case UPCIE_NVME_SC_INTERNAL_PATH:
		return "internal path error";
	case UPCIE_NVME_SC_ANA_PERSISTENT_LOSS:
		return "asymmetric access persistent loss";
	case UPCIE_NVME_SC_ANA_INACCESSIBLE:
		return "asymmetric access inaccessible";
	case UPCIE_NVME_SC_ANA_TRANSITION:
		return "asymmetric access transition";
	case UPCIE_NVME_SC_CTRL_PATH_ERROR:
		return "controller pathing error";
	case UPCIE_NVME_SC_HOST_PATH_ERROR:
		return "host pathing error";
	case UPCIE_NVME_SC_HOST_ABORTED:
		return "command aborted by host";
	default:
		break;
	}
	switch (code >> 8) {
	case UPCIE_NVME_SCT_GENERIC:
		return "unknown generic status";
	case UPCIE_NVME_SCT_CMD:
		return "unknown command specific status";
	case UPCIE_NVME_SCT_MEDIA:
		return "unknown media error";
	case UPCIE_NVME_SCT_PATH:
		return "unknown path related status";
	case UPCIE_NVME_SCT_VENDOR:
		return "vendor specific status";
	default:
		return "reserved status code type";
	}
}

/*
 * Opcodes.
 */
enum upcie_nvme_admin_opc {
	UPCIE_NVME_ADMIN_DELETE_SQ = 0x00,
	UPCIE_NVME_ADMIN_CREATE_SQ = 0x01,
	UPCIE_NVME_ADMIN_GET_LOG_PAGE = 0x02,
	UPCIE_NVME_ADMIN_DELETE_CQ = 0x04,
	UPCIE_NVME_ADMIN_CREATE_CQ = 0x05,
	UPCIE_NVME_ADMIN_IDENTIFY = 0x06,
	UPCIE_NVME_ADMIN_ABORT = 0x08,
	UPCIE_NVME_ADMIN_SET_FEATURES = 0x09,
	UPCIE_NVME_ADMIN_GET_FEATURES = 0x0a,
	UPCIE_NVME_ADMIN_ASYNC_EVENT = 0x0c,
	UPCIE_NVME_ADMIN_NS_MGMT = 0x0d,
	UPCIE_NVME_ADMIN_FW_COMMIT = 0x10,
	UPCIE_NVME_ADMIN_FW_DOWNLOAD = 0x11,
	UPCIE_NVME_ADMIN_SELF_TEST = 0x14,
	UPCIE_NVME_ADMIN_NS_ATTACH = 0x15,
	UPCIE_NVME_ADMIN_KEEP_ALIVE = 0x18,
	UPCIE_NVME_ADMIN_DIRECTIVE_SEND = 0x19,
	UPCIE_NVME_ADMIN_DIRECTIVE_RECV = 0x1a,
	UPCIE_NVME_ADMIN_VIRT_MGMT = 0x1c,
	UPCIE_NVME_ADMIN_DBBUF_CONFIG = 0x7c,
	UPCIE_NVME_ADMIN_FORMAT_NVM = 0x80,
	UPCIE_NVME_ADMIN_SECURITY_SEND = 0x81,
	UPCIE_NVME_ADMIN_SECURITY_RECV = 0x82,
	UPCIE_NVME_ADMIN_SANITIZE = 0x84,
	UPCIE_NVME_ADMIN_GET_LBA_STATUS = 0x86,
};

enum upcie_nvme_nvm_opc {
	UPCIE_NVME_NVM_FLUSH = 0x00,
	UPCIE_NVME_NVM_WRITE = 0x01,
	UPCIE_NVME_NVM_READ = 0x02,
	UPCIE_NVME_NVM_WRITE_UNCOR = 0x04,
	UPCIE_NVME_NVM_COMPARE = 0x05,
	UPCIE_NVME_NVM_WRITE_ZEROES = 0x08,
	UPCIE_NVME_NVM_DSM = 0x09,
	UPCIE_NVME_NVM_VERIFY = 0x0c,
	UPCIE_NVME_NVM_RESV_REGISTER = 0x0d,
	UPCIE_NVME_NVM_RESV_REPORT = 0x0e,
	UPCIE_NVME_NVM_RESV_ACQUIRE = 0x11,
	UPCIE_NVME_NVM_RESV_RELEASE = 0x15,
	UPCIE_NVME_NVM_COPY = 0x19,
	/* Zoned Namespace Command Set */
	UPCIE_NVME_ZNS_MGMT_SEND = 0x79,
	UPCIE_NVME_ZNS_MGMT_RECV = 0x7a,
	UPCIE_NVME_ZNS_APPEND = 0x7d,
};

#endif /* UPCIE_NVME_SPEC_H */
