/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * NVMe admin-side definitions from the NVM Express Base Specification and the NVM and Zoned
 * Namespace Command Set Specifications: namespace IDs, Identify CNS values, feature and log page
 * identifiers, the optional-command bits of Identify Controller, and the Identify data structures
 * (controller, namespace, namespace lists and descriptors, the command-set-specific ones) with
 * their field accessors. Registers, queue entries, opcodes and status codes are in nvme/spec.h.
 *
 * Needs nothing at run time; pure arithmetic, usable in CUDA/HIP device code (UPCIE_HD). The
 * structures are what the controller wrote: check a field before it sizes or indexes anything.
 * Little-endian hosts only; structures are the wire layout, used in place.
 */
#ifndef UPCIE_NVME_SPEC_ID_H
#define UPCIE_NVME_SPEC_ID_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <upcie/base/compiler.h>
#include <upcie/nvme/spec.h>

/* Broadcast namespace ID (all namespaces / controller scope). */
#define UPCIE_NVME_NSID_ALL UINT32_C(0xffffffff)

/* Identify CNS values. */
#define UPCIE_NVME_CNS_NS		 0x00 /* Identify Namespace (NVM) */
#define UPCIE_NVME_CNS_CTRL		 0x01 /* Identify Controller */
#define UPCIE_NVME_CNS_NS_ACTIVE_LIST	 0x02 /* active namespace ID list */
#define UPCIE_NVME_CNS_NS_DESC_LIST	 0x03 /* namespace identification descriptors */
#define UPCIE_NVME_CNS_CS_NS		 0x05 /* I/O command set specific namespace (2.0) */
#define UPCIE_NVME_CNS_CS_CTRL		 0x06 /* I/O command set specific controller (2.0) */
#define UPCIE_NVME_CNS_CS_NS_ACTIVE_LIST 0x07 /* I/O command set specific active list (2.0) */
#define UPCIE_NVME_CNS_NS_ALLOC_LIST	 0x10 /* allocated namespace ID list (subsystem) */
#define UPCIE_NVME_CNS_NS_CTRL_LIST	 0x12 /* controllers a namespace is attached to */
#define UPCIE_NVME_CNS_CTRL_LIST	 0x13 /* controllers of the NVM subsystem */
#define UPCIE_NVME_CNS_PRI_CTRL_CAP	 0x14 /* primary controller capabilities (SR-IOV) */
#define UPCIE_NVME_CNS_SEC_CTRL_LIST	 0x15 /* secondary controller list (SR-IOV) */
#define UPCIE_NVME_CSI_NVM		 0x00
#define UPCIE_NVME_CSI_KV		 0x01
#define UPCIE_NVME_CSI_ZNS		 0x02

/* Namespace Identification Descriptor types (CNS 03h). */
#define UPCIE_NVME_NIDT_EUI64 0x1 /* 8 bytes */
#define UPCIE_NVME_NIDT_NGUID 0x2 /* 16 bytes */
#define UPCIE_NVME_NIDT_UUID  0x3 /* 16 bytes */
#define UPCIE_NVME_NIDT_CSI   0x4 /* 1 byte: the namespace's I/O command set */

/* Feature identifiers. */
#define UPCIE_NVME_FEAT_ARBITRATION   0x01
#define UPCIE_NVME_FEAT_POWER_MGMT    0x02
#define UPCIE_NVME_FEAT_TEMP_THRESH   0x04
#define UPCIE_NVME_FEAT_ERR_RECOVERY  0x05
#define UPCIE_NVME_FEAT_VOLATILE_WC   0x06
#define UPCIE_NVME_FEAT_NUM_QUEUES    0x07
#define UPCIE_NVME_FEAT_IRQ_COALESCE  0x08
#define UPCIE_NVME_FEAT_IRQ_CONFIG    0x09
#define UPCIE_NVME_FEAT_WRITE_ATOMIC  0x0a
#define UPCIE_NVME_FEAT_ASYNC_EVENT   0x0b
#define UPCIE_NVME_FEAT_APST	      0x0c
#define UPCIE_NVME_FEAT_TIMESTAMP     0x0e
#define UPCIE_NVME_FEAT_KEEP_ALIVE    0x0f
#define UPCIE_NVME_FEAT_HOST_BEHAVIOR 0x16 /* Host Behavior Support: 512 bytes, byte 0 ACRE */

/* Get Features select (CDW10.SEL). */
#define UPCIE_NVME_FEAT_SEL_CURRENT 0
#define UPCIE_NVME_FEAT_SEL_DEFAULT 1
#define UPCIE_NVME_FEAT_SEL_SAVED   2
#define UPCIE_NVME_FEAT_SEL_CAPS    3

/* Log page identifiers. */
/* Asynchronous event types (AER completion dw0 bits 2:0) and notice kinds (bits 15:8). */
#define UPCIE_NVME_AE_TYPE_ERROR	 0u
#define UPCIE_NVME_AE_TYPE_SMART	 1u
#define UPCIE_NVME_AE_TYPE_NOTICE	 2u
#define UPCIE_NVME_AE_TYPE_IMMEDIATE	 3u
#define UPCIE_NVME_AE_TYPE_IOCS		 6u
#define UPCIE_NVME_AE_TYPE_VENDOR	 7u
#define UPCIE_NVME_AE_NOTICE_NS_CHANGED	 0x00u
#define UPCIE_NVME_AE_NOTICE_FW_ACTIVATE 0x01u
#define UPCIE_NVME_AE_NOTICE_TELEMETRY	 0x02u
#define UPCIE_NVME_AE_NOTICE_ANA	 0x03u
/* Asynchronous Event Configuration (Set Features 0Bh) bits upcie turns on where OAES has them:
 * SMART critical warnings (bits 7:0), namespace attribute (8) and firmware activation (9)
 * notices. */
#define UPCIE_NVME_AEC_SMART_ALL   0xffu
#define UPCIE_NVME_AEC_NS_ATTR	   (1u << 8)
#define UPCIE_NVME_AEC_FW_ACTIVATE (1u << 9)
/* CSTS.PP: processing paused (firmware activation). */
#define UPCIE_NVME_CSTS_PP (UINT32_C(1) << 5)

#define UPCIE_NVME_LOG_ERROR	   0x01
#define UPCIE_NVME_LOG_SMART	   0x02
#define UPCIE_NVME_LOG_FW_SLOT	   0x03
#define UPCIE_NVME_LOG_CHANGED_NS  0x04
#define UPCIE_NVME_LOG_CMD_EFFECTS 0x05
#define UPCIE_NVME_LOG_SELF_TEST   0x06

/* Identify Controller ONCS bits (optional NVM commands). */
#define UPCIE_NVME_ONCS_COMPARE	     (1u << 0)
#define UPCIE_NVME_ONCS_WRITE_UNCOR  (1u << 1)
#define UPCIE_NVME_ONCS_DSM	     (1u << 2)
#define UPCIE_NVME_ONCS_WRITE_ZEROES (1u << 3)
#define UPCIE_NVME_ONCS_SAVE_FEAT    (1u << 4)
#define UPCIE_NVME_ONCS_RESERVATIONS (1u << 5)
#define UPCIE_NVME_ONCS_TIMESTAMP    (1u << 6)
#define UPCIE_NVME_ONCS_VERIFY	     (1u << 7)
#define UPCIE_NVME_ONCS_COPY	     (1u << 8)

/* Identify Controller OACS bits (optional admin commands). */
#define UPCIE_NVME_OACS_SECURITY  (1u << 0)
#define UPCIE_NVME_OACS_FORMAT	  (1u << 1)
#define UPCIE_NVME_OACS_FW	  (1u << 2)
#define UPCIE_NVME_OACS_NS_MGMT	  (1u << 3)
#define UPCIE_NVME_OACS_SELF_TEST (1u << 4)
#define UPCIE_NVME_OACS_DIRECTIVE (1u << 5)
#define UPCIE_NVME_OACS_MI	  (1u << 6)
#define UPCIE_NVME_OACS_VIRT	  (1u << 7)
#define UPCIE_NVME_OACS_DBBUF	  (1u << 8)

/* Identify Controller VWC: a volatile write cache is present (bit 0). */
#define UPCIE_NVME_VWC_PRESENT 0x1u

/* Identify Namespace DPS: protection information type (bits 2:0), PI in the first bytes (3). */
#define UPCIE_NVME_DPS_PIT_MASK 0x7u
#define UPCIE_NVME_DPS_PIT_NONE 0u
#define UPCIE_NVME_DPS_PIT_1	1u
#define UPCIE_NVME_DPS_PIT_2	2u
#define UPCIE_NVME_DPS_PIT_3	3u
#define UPCIE_NVME_DPS_PIP	0x8u
/* Bytes of one protection information tuple with the 16-bit guard (guard, app tag, ref tag). */
#define UPCIE_NVME_PI_BYTES 8u

/* Identify Controller SGLS bits 1:0. */
#define UPCIE_NVME_SGLS_NONE	  0u /* SGLs not supported for NVM commands */
#define UPCIE_NVME_SGLS_ANY_ALIGN 1u /* supported, no alignment or granularity requirement */
#define UPCIE_NVME_SGLS_DWORD	  2u /* supported, data blocks dword aligned and sized */

/*
 * Identify Controller data structure (CNS 01h), 4096 bytes. Named fields are the ones a driver
 * uses; the rest is kept as reserved bytes at the right offsets.
 */
struct upcie_nvme_id_ctrl {
	uint16_t vid;	 /* 0: PCI vendor ID */
	uint16_t ssvid;	 /* 2: PCI subsystem vendor ID */
	char sn[20];	 /* 4: serial number, ASCII, space padded */
	char mn[40];	 /* 24: model number */
	char fr[8];	 /* 64: firmware revision */
	uint8_t rab;	 /* 72: recommended arbitration burst */
	uint8_t ieee[3]; /* 73 */
	uint8_t cmic;	 /* 76 */
	uint8_t mdts;	 /* 77: max data transfer, 2^n * CAP.MPSMIN, 0 = no limit */
	uint16_t cntlid; /* 78 */
	uint32_t ver;	 /* 80: same layout as VS */
	uint32_t rtd3r;	 /* 84 */
	uint32_t rtd3e;	 /* 88 */
	uint32_t oaes;	 /* 92 */
	uint32_t ctratt; /* 96 */
	uint16_t rrls;	 /* 100 */
	uint8_t rsvd102[9];
	uint8_t cntrltype; /* 111 */
	uint8_t fguid[16]; /* 112 */
	uint16_t crdt[3];  /* 128: command retry delay times, 100 ms units */
	uint8_t rsvd134[122];
	uint16_t oacs;	 /* 256: UPCIE_NVME_OACS_* */
	uint8_t acl;	 /* 258: abort command limit, 0's based */
	uint8_t aerl;	 /* 259 */
	uint8_t frmw;	 /* 260 */
	uint8_t lpa;	 /* 261 */
	uint8_t elpe;	 /* 262 */
	uint8_t npss;	 /* 263 */
	uint8_t avscc;	 /* 264 */
	uint8_t apsta;	 /* 265 */
	uint16_t wctemp; /* 266 */
	uint16_t cctemp; /* 268 */
	uint8_t rsvd270[50];
	uint16_t kas; /* 320: keep alive granularity, 100 ms units */
	uint8_t rsvd322[190];
	uint8_t sqes;	 /* 512: bits 3:0 required, 7:4 max log2 SQ entry size */
	uint8_t cqes;	 /* 513: bits 3:0 required, 7:4 max log2 CQ entry size */
	uint16_t maxcmd; /* 514 */
	uint32_t nn;	 /* 516: number of namespaces (highest NSID) */
	uint16_t oncs;	 /* 520: UPCIE_NVME_ONCS_* */
	uint16_t fuses;	 /* 522 */
	uint8_t fna;	 /* 524 */
	uint8_t vwc;	 /* 525: volatile write cache present (bit 0) */
	uint16_t awun;	 /* 526 */
	uint16_t awupf;	 /* 528 */
	uint8_t icsvscc; /* 530 */
	uint8_t nwpc;	 /* 531 */
	uint16_t acwu;	 /* 532 */
	uint16_t ocfs;	 /* 534 */
	uint32_t sgls;	 /* 536: SGL support, bits 1:0 UPCIE_NVME_SGLS_* */
	uint32_t mnan;	 /* 540 */
	uint8_t rsvd544[224];
	char subnqn[256]; /* 768 */
	uint8_t rsvd1024[1024];
	uint8_t psd[32][32]; /* 2048: power state descriptors */
	uint8_t vs[1024];    /* 3072: vendor specific */
};

/* LBA format descriptor. */
struct upcie_nvme_lbaf {
	uint16_t ms;   /* metadata bytes per LBA */
	uint8_t lbads; /* LBA data size, log2 */
	uint8_t rp;    /* relative performance, bits 1:0 */
};

/* Identify Namespace data structure (CNS 00h, NVM command set), 4096 bytes. */
struct upcie_nvme_id_ns {
	uint64_t nsze;	    /* 0: size in LBAs */
	uint64_t ncap;	    /* 8: capacity in LBAs */
	uint64_t nuse;	    /* 16: utilization in LBAs */
	uint8_t nsfeat;	    /* 24 */
	uint8_t nlbaf;	    /* 25: number of LBA formats, 0's based */
	uint8_t flbas;	    /* 26: format index (3:0, and 6:5 in 2.0), extended LBA (4) */
	uint8_t mc;	    /* 27: metadata capabilities */
	uint8_t dpc;	    /* 28: end-to-end data protection capabilities */
	uint8_t dps;	    /* 29: end-to-end data protection settings */
	uint8_t nmic;	    /* 30 */
	uint8_t rescap;	    /* 31 */
	uint8_t fpi;	    /* 32 */
	uint8_t dlfeat;	    /* 33 */
	uint16_t nawun;	    /* 34 */
	uint16_t nawupf;    /* 36 */
	uint16_t nacwu;	    /* 38 */
	uint16_t nabsn;	    /* 40 */
	uint16_t nabo;	    /* 42 */
	uint16_t nabspf;    /* 44 */
	uint16_t noiob;	    /* 46: optimal I/O boundary in LBAs */
	uint8_t nvmcap[16]; /* 48 */
	uint16_t npwg;	    /* 64 */
	uint16_t npwa;	    /* 66 */
	uint16_t npdg;	    /* 68 */
	uint16_t npda;	    /* 70 */
	uint16_t nows;	    /* 72 */
	uint16_t mssrl;	    /* 74 */
	uint32_t mcl;	    /* 76 */
	uint8_t msrc;	    /* 80 */
	uint8_t rsvd81[11];
	uint32_t anagrpid; /* 92 */
	uint8_t rsvd96[3];
	uint8_t nsattr;			 /* 99 */
	uint16_t nvmsetid;		 /* 100 */
	uint16_t endgid;		 /* 102 */
	uint8_t nguid[16];		 /* 104 */
	uint8_t eui64[8];		 /* 120 */
	struct upcie_nvme_lbaf lbaf[64]; /* 128: 16 in NVMe 1.4, 64 in 2.0 */
	uint8_t rsvd384[3328];
	uint8_t vs[384]; /* 3712 */
};

/* Active namespace ID list (CNS 02h): ascending NSIDs, 0-terminated. */
struct upcie_nvme_ns_list {
	uint32_t nsid[1024];
};

/*
 * Controller List (CNS 12h, 13h; the data of Namespace Attachment): NUMID identifiers, ascending,
 * at most 2047.
 */
struct upcie_nvme_ctrl_list {
	uint16_t numid;
	uint16_t id[2047];
};
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_ctrl_list) == 4096, "Controller List size");

/*
 * Primary Controller Capabilities (CNS 14h): the flexible resources of an SR-IOV physical
 * function that Virtualization Management hands to its secondary (virtual function) controllers.
 * VQ = queue resources (one per submission/completion queue pair, the admin queue included), VI =
 * interrupt resources (MSI-X vectors). "Flexible" ones move between the primary and secondaries;
 * the primary's share (VQRFAP/VIRFAP) changes at its next function-level reset only.
 */
struct upcie_nvme_pri_ctrl_cap {
	uint16_t cntlid; /* 0 */
	uint16_t portid; /* 2 */
	uint8_t crt;	 /* 4: resource types supported: bit 0 VQ, bit 1 VI */
	uint8_t rsvd5[27];
	uint32_t vqfrt;	 /* 32: VQ flexible resources, total */
	uint32_t vqrfa;	 /* 36: VQ flexible resources assigned to secondaries */
	uint16_t vqrfap; /* 40: VQ flexible resources allocated to the primary */
	uint16_t vqprt;	 /* 42: VQ private resources of the primary */
	uint16_t vqfrsm; /* 44: VQ flexible resources a secondary may have, at most */
	uint16_t vqgran; /* 46: VQ granularity */
	uint8_t rsvd48[16];
	uint32_t vifrt;	 /* 64 */
	uint32_t virfa;	 /* 68 */
	uint16_t virfap; /* 72 */
	uint16_t viprt;	 /* 74 */
	uint16_t vifrsm; /* 76 */
	uint16_t vigran; /* 78 */
	uint8_t rsvd80[4016];
};
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_pri_ctrl_cap, vifrt) == 64, "VIFRT");
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_pri_ctrl_cap) == 4096, "CNS 14h size");

/* One Secondary Controller Entry of CNS 15h. */
struct upcie_nvme_sec_ctrl {
	uint16_t scid; /* 0: the secondary controller's CNTLID */
	uint16_t pcid; /* 2: its primary's CNTLID */
	uint8_t scs;   /* 4: bit 0: online */
	uint8_t rsvd5[3];
	uint16_t vfn; /* 8: its virtual function number (1-based; 0: not a VF) */
	uint16_t nvq; /* 10: VQ flexible resources assigned */
	uint16_t nvi; /* 12: VI flexible resources assigned */
	uint8_t rsvd14[18];
};
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_sec_ctrl) == 32, "Secondary Controller Entry");

/* Secondary Controller List (CNS 15h): NUMID entries from the CNTID of the command on. */
struct upcie_nvme_sec_ctrl_list {
	uint8_t numid;
	uint8_t rsvd1[31];
	struct upcie_nvme_sec_ctrl sc[127];
};
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_sec_ctrl_list) == 4096, "CNS 15h size");

/* Virtualization Management actions (CDW10 ACT) and resource types (RT). */
#define UPCIE_NVME_VIRT_PRI_ALLOC   0x1 /* primary flexible allocation (after its next FLR) */
#define UPCIE_NVME_VIRT_SEC_OFFLINE 0x7 /* secondary offline: stops it, frees its resources */
#define UPCIE_NVME_VIRT_SEC_ASSIGN  0x8 /* secondary assign (offline secondaries only) */
#define UPCIE_NVME_VIRT_SEC_ONLINE  0x9 /* secondary online */
#define UPCIE_NVME_VIRT_RT_VQ	    0x0
#define UPCIE_NVME_VIRT_RT_VI	    0x1

/*
 * Namespace Identification Descriptor list (CNS 03h): descriptors of a 4-byte header (type NIDT,
 * length NIDL) followed by NIDL bytes, back to back in a 4096-byte page; a NIDT of 0 ends it.
 */
struct upcie_nvme_ns_desc {
	uint8_t nidt;
	uint8_t nidl;
	uint8_t rsvd[2];
};
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_ns_desc) == 4, "descriptor header is 4 bytes");

/*
 * The Command Set Identifier in a Namespace Identification Descriptor list of `len` bytes (the
 * data a controller wrote: every length is checked before it is used). Returns 0 with *csi set;
 * -ENOENT when the list holds no CSI descriptor (an NVMe 1.x controller: the NVM command set);
 * -EPROTO when a descriptor runs past the end or a known type has the wrong length.
 */
UPCIE_HD static inline int upcie_nvme_ns_desc_csi(const void *list, size_t len, uint8_t *csi)
{
	const uint8_t *p = (const uint8_t *)list;
	size_t off = 0;

	while (off + 4 <= len) {
		uint8_t nidt = p[off], nidl = p[off + 1];

		if (!nidt)
			return -ENOENT;
		if (nidl > len - off - 4)
			return -EPROTO;
		if ((nidt == UPCIE_NVME_NIDT_EUI64 && nidl != 8) ||
		    ((nidt == UPCIE_NVME_NIDT_NGUID || nidt == UPCIE_NVME_NIDT_UUID) &&
		     nidl != 16) ||
		    (nidt == UPCIE_NVME_NIDT_CSI && nidl != 1))
			return -EPROTO;
		if (nidt == UPCIE_NVME_NIDT_CSI) {
			*csi = p[off + 4];
			return 0;
		}
		off += 4 + (size_t)nidl;
	}
	return -ENOENT;
}

/* Zoned Namespace Command Set: LBA format extension (zone size of each LBA format). */
struct upcie_nvme_zns_lbafe {
	uint64_t zsze; /* zone size in logical blocks */
	uint8_t zdes;  /* zone descriptor extension size, 64-byte units */
	uint8_t rsvd[7];
};

/*
 * I/O command set specific Identify Namespace for the NVM command set (CNS 05h, CSI 00h; Identify
 * Controller CTRATT bit 15, ELBAS): the extended LBA formats, one dword per LBA format.
 */
struct upcie_nvme_id_ns_nvm {
	uint64_t lbstm;	    /* 0: logical block storage tag mask */
	uint8_t pic;	    /* 8: protection information capabilities */
	uint8_t rsvd9[3];   /* 9 */
	uint32_t elbaf[64]; /* 12: STS (6:0), PIF (8:7) per LBA format */
	uint8_t rsvd268[3828];
};
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ns_nvm, elbaf) == 12, "ELBAF0");
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_id_ns_nvm) == 4096, "NVM Identify Namespace size");

#define UPCIE_NVME_CTRATT_ELBAS (1u << 15)	       /* extended LBA formats (CNS 05h for NVM) */
#define UPCIE_NVME_ELBAF_STS(x) ((uint8_t)((x)&0x7fu)) /* storage tag bits */
#define UPCIE_NVME_ELBAF_PIF(x) ((uint8_t)(((x) >> 7) & 3u)) /* protection info format */
#define UPCIE_NVME_PIF_16	0 /* 16-bit guard: the 8-byte PI of NVMe 1.x */
#define UPCIE_NVME_PIF_32	1 /* 32-bit guard */
#define UPCIE_NVME_PIF_64	2 /* 64-bit guard */

/* I/O command set specific Identify Namespace for the Zoned Namespace set (CNS 05h, CSI 02h). */
struct upcie_nvme_id_ns_zns {
	uint16_t zoc;  /* 0: zone operation characteristics */
	uint16_t ozcs; /* 2: optional zoned command support */
	uint32_t mar;  /* 4: maximum active resources, 0's based (0xffffffff: no limit) */
	uint32_t mor;  /* 8: maximum open resources, 0's based */
	uint32_t rrl;  /* 12: reset recommended limit */
	uint32_t frl;  /* 16: finish recommended limit */
	uint8_t rsvd20[2796];
	struct upcie_nvme_zns_lbafe lbafe[64]; /* 2816 */
	uint8_t vs[256];		       /* 3840 */
};
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_zns_lbafe) == 16, "LBA format extension size");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ns_zns, lbafe) == 2816, "LBAFE0");
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_id_ns_zns) == 4096, "ZNS Identify Namespace size");

/*
 * I/O command set specific Identify Controller for the Zoned Namespace set (CNS 06h, CSI 02h):
 * the Zone Append Size Limit, a power of two in units of the minimum memory page size
 * (CAP.MPSMIN); 0: the controller's MDTS.
 */
struct upcie_nvme_id_ctrl_zns {
	uint8_t zasl; /* 0 */
	uint8_t rsvd1[4095];
};
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_id_ctrl_zns) == 4096, "ZNS Identify Controller size");

/* Zone Management Send actions (CDW13 bits 7:0). */
#define UPCIE_NVME_ZSA_CLOSE  0x1
#define UPCIE_NVME_ZSA_FINISH 0x2
#define UPCIE_NVME_ZSA_OPEN   0x3
#define UPCIE_NVME_ZSA_RESET  0x4
/* Zone Management Receive action (CDW13 bits 7:0): report zones. */
#define UPCIE_NVME_ZRA_REPORT 0x0
/* Zone states (descriptor byte 1, bits 7:4). */
#define UPCIE_NVME_ZS_EMPTY	0x1
#define UPCIE_NVME_ZS_IOPEN	0x2
#define UPCIE_NVME_ZS_EOPEN	0x3
#define UPCIE_NVME_ZS_CLOSED	0x4
#define UPCIE_NVME_ZS_READ_ONLY 0xd
#define UPCIE_NVME_ZS_FULL	0xe
#define UPCIE_NVME_ZS_OFFLINE	0xf

/* Report Zones data: a 64-byte header, then 64-byte zone descriptors. */
struct upcie_nvme_zone_report_hdr {
	uint64_t nr_zones; /* zones that match, which may be more than the buffer holds */
	uint8_t rsvd[56];
};

struct upcie_nvme_zone_desc {
	uint8_t zt;  /* zone type: 2 = sequential write required */
	uint8_t zs;  /* zone state in bits 7:4 (UPCIE_NVME_ZS_*) */
	uint8_t za;  /* zone attributes */
	uint8_t zai; /* zone attributes information */
	uint8_t rsvd4[4];
	uint64_t zcap;	/* zone capacity in logical blocks */
	uint64_t zslba; /* first logical block of the zone */
	uint64_t wp;	/* write pointer */
	uint8_t rsvd32[32];
};
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_zone_report_hdr) == 64, "report header size");
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_zone_desc) == 64, "zone descriptor size");

/*
 * Zone descriptors a Report Zones buffer of `len` bytes really holds: the controller's count,
 * but never more than fit after the header (the count says how many zones match, and a device
 * may claim anything).
 */
UPCIE_HD static inline uint64_t upcie_nvme_zone_report_count(const void *buf, size_t len)
{
	const struct upcie_nvme_zone_report_hdr *h = (const struct upcie_nvme_zone_report_hdr *)buf;
	uint64_t fit;

	if (len < sizeof(*h))
		return 0;
	fit = (len - sizeof(*h)) / sizeof(struct upcie_nvme_zone_desc);
	return h->nr_zones < fit ? h->nr_zones : fit;
}

/* Dataset Management range (16 bytes each, up to 256 per command). */
struct upcie_nvme_dsm_range {
	uint32_t cattr; /* context attributes */
	uint32_t nlb;	/* length in LBAs (not 0's based) */
	uint64_t slba;
};

UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_id_ctrl) == 4096, "Identify Controller size");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, ssvid) == 2, "SSVID");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, sn) == 4, "SN");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, mn) == 24, "MN");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, fr) == 64, "FR");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, mdts) == 77, "MDTS");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, cntlid) == 78, "CNTLID");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, ver) == 80, "VER");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, cntrltype) == 111, "CNTRLTYPE");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, crdt) == 128, "CRDT1");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, oacs) == 256, "OACS");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, npss) == 263, "NPSS");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, kas) == 320, "KAS");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, sqes) == 512, "SQES");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, cqes) == 513, "CQES");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, nn) == 516, "NN");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, oncs) == 520, "ONCS");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, vwc) == 525, "VWC");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, sgls) == 536, "SGLS");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, subnqn) == 768, "SUBNQN");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, psd) == 2048, "PSD0");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ctrl, vs) == 3072, "VS");
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_lbaf) == 4, "LBA format is 4 bytes");
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_id_ns) == 4096, "Identify Namespace size");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ns, ncap) == 8, "NCAP");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ns, nuse) == 16, "NUSE");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ns, nlbaf) == 25, "NLBAF");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ns, flbas) == 26, "FLBAS");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ns, mc) == 27, "MC");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ns, dpc) == 28, "DPC");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ns, noiob) == 46, "NOIOB");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ns, anagrpid) == 92, "ANAGRPID");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ns, nguid) == 104, "NGUID");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ns, eui64) == 120, "EUI64");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ns, lbaf) == 128, "LBAF0");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_nvme_id_ns, vs) == 3712, "VS");
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_ns_list) == 4096, "namespace list size");
UPCIE_STATIC_ASSERT(sizeof(struct upcie_nvme_dsm_range) == 16, "DSM range is 16 bytes");

/*
 * Index of the LBA format in use. NVMe 2.0 extends FLBAS with bits 6:5 as the upper two bits
 * of the index, meaningful only when the namespace reports more than 16 formats.
 */
UPCIE_HD static inline unsigned upcie_nvme_id_ns_lbaf_index(const struct upcie_nvme_id_ns *ns)
{
	unsigned idx = ns->flbas & 0xfu;

	if (ns->nlbaf >= 16)
		idx |= ((ns->flbas >> 5) & 3u) << 4;
	return idx;
}

/* The LBA format in use; NULL when FLBAS names a format beyond NLBAF (corrupt data). */
UPCIE_HD static inline const struct upcie_nvme_lbaf *
upcie_nvme_id_ns_lbaf(const struct upcie_nvme_id_ns *ns)
{
	unsigned idx = upcie_nvme_id_ns_lbaf_index(ns);

	if (idx > ns->nlbaf || idx >= 64)
		return NULL;
	return &ns->lbaf[idx];
}

/* LBA data size in bytes of the format in use, 0 when it is invalid. */
UPCIE_HD static inline uint64_t upcie_nvme_id_ns_lba_bytes(const struct upcie_nvme_id_ns *ns)
{
	const struct upcie_nvme_lbaf *f = upcie_nvme_id_ns_lbaf(ns);

	if (!f || f->lbads < 9 || f->lbads > 63)
		return 0;
	return UINT64_C(1) << f->lbads;
}

/* Metadata bytes per LBA of the format in use. */
UPCIE_HD static inline uint32_t upcie_nvme_id_ns_ms(const struct upcie_nvme_id_ns *ns)
{
	const struct upcie_nvme_lbaf *f = upcie_nvme_id_ns_lbaf(ns);

	return f ? f->ms : 0;
}

/* True when metadata is interleaved with the data (extended LBA), false for a separate buffer. */
UPCIE_HD static inline bool upcie_nvme_id_ns_extended_lba(const struct upcie_nvme_id_ns *ns)
{
	return (ns->flbas >> 4) & 1u;
}

#endif /* UPCIE_NVME_SPEC_ID_H */
