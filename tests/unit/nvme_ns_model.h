/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Namespaces for the controller model (nvme_ctrl_model.h): a table of namespaces with any NSIDs
 * (gaps included), LBA formats (up to 64, any index in use), metadata (separate or extended),
 * protection information (types 1-3, generated and checked for PRACT, the application tag of
 * CDW15 included) and zoned namespaces (a write pointer per zone, Zone Management
 * Send/Receive, Zone Append with its assigned LBA and the Zone Append Size Limit, the zoned
 * status codes). It answers Identify for them (CNS 00h, 02h, 03h, 05h, and 06h for the zoned
 * command set) and executes their I/O commands. A test instrument, never evidence of hardware
 * behaviour.
 *
 * Knobs: no Active Namespace List (NVMe 1.0), no Namespace Identification Descriptor list, a
 * malformed descriptor list, an Active Namespace List that never ends (the same full page
 * whatever the start), Identify Namespace fields overridden after they are built.
 */
#ifndef UPCIE_TEST_NVME_NS_MODEL_H
#define UPCIE_TEST_NVME_NS_MODEL_H

#include <upcie/base/feature.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/nvme/cmd.h>
#include <upcie/nvme/spec.h>
#include <upcie/nvme/spec_id.h>

#include "nvme_model.h"

#define NVME_NSM_MAX 16

struct nvme_nsm_ns {
	uint32_t nsid;
	uint64_t blocks;
	uint32_t lba_bytes;
	uint16_t ms;
	bool ext;	      /* metadata interleaved with the data */
	uint8_t dps;	      /* PI type (and PIP) */
	uint8_t pif, sts;     /* extended LBA format of the format in use (CNS 05h, CSI 00h) */
	uint8_t csi;	      /* UPCIE_NVME_CSI_NVM or _ZNS */
	uint64_t zone_blocks; /* zoned */
	uint8_t nlbaf;	      /* formats reported, 0's based (the one in use is format lbaf) */
	uint8_t lbaf;
	bool detached; /* not attached to the controller: inactive, I/O refused (Invalid NS) */
	uint32_t fmt_bytes[16]; /* LBA data size of each format (0: 512 B); Format NVM picks one */
	uint8_t *data;		/* blocks * lba_bytes */
	uint8_t *meta; /* blocks * ms, 0xff (application tag ffffh: PI checks off) until written */
	uint64_t *wp;  /* zoned: write pointer per zone */
	uint32_t nzones;
	/* records */
	uint32_t n_io, n_pract, n_pi_errors, n_append;
	uint32_t last_cdw12, last_cdw14, last_cdw15;
	uint64_t last_mptr;
	uint8_t last_opc;
	uint64_t last_slba;
};

struct nvme_nsm {
	struct nvme_nsm_ns ns[NVME_NSM_MAX];
	uint32_t n;
	bool no_active_list; /* CNS 02h: Invalid Field in Command */
	bool no_desc_list;   /* CNS 03h: Invalid Field in Command */
	bool bad_desc_list;  /* CNS 03h: a descriptor that runs past the page */
	bool endless_list;   /* CNS 02h: NSIDs 1..1024 whatever the start */
	uint32_t n_cs_ns;    /* CNS 05h asked */
	uint8_t zasl;	     /* zoned Identify Controller (CNS 06h, CSI 02h): ZASL */
	uint32_t n_cs_ctrl_zns;
	/* Zone Append: the LBA a completion reports is this much beyond where the data went (a
	   controller that lies; 0: the truth) */
	int64_t append_lba_skew;
	/* Identify Namespace overrides for nsid `over_nsid` (fuzz-like absurd values) */
	uint32_t over_nsid;
	void (*over)(struct upcie_nvme_id_ns *id);
	uint32_t n_list, n_identify_ns, n_desc;
};

/* CRC-16 of the T10 DIF guard: polynomial 0x8bb7, initial value 0, not reflected. */
static inline uint16_t nvme_nsm_crc16(const uint8_t *p, size_t len)
{
	uint16_t crc = 0;

	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)(p[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x8bb7 : crc << 1);
	}
	return crc;
}

/* Add a namespace; returns it (zeroed data, metadata 0xff, zones empty) or NULL. */
static inline struct nvme_nsm_ns *nvme_nsm_add(struct nvme_nsm *t, uint32_t nsid, uint64_t blocks,
					       uint32_t lba_bytes, uint16_t ms, bool ext,
					       uint8_t dps, uint64_t zone_blocks)
{
	struct nvme_nsm_ns *n;

	if (t->n == NVME_NSM_MAX)
		return NULL;
	n = &t->ns[t->n++];
	memset(n, 0, sizeof(*n));
	n->nsid = nsid;
	n->blocks = blocks;
	n->lba_bytes = lba_bytes;
	n->ms = ms;
	n->ext = ext;
	n->dps = dps;
	n->csi = zone_blocks ? UPCIE_NVME_CSI_ZNS : UPCIE_NVME_CSI_NVM;
	n->zone_blocks = zone_blocks;
	n->data = (uint8_t *)calloc(blocks, lba_bytes);
	n->meta = ms ? (uint8_t *)malloc(blocks * ms) : NULL;
	if (n->meta)
		memset(n->meta, 0xff, blocks * ms);
	if (zone_blocks) {
		n->nzones = (uint32_t)(blocks / zone_blocks);
		n->wp = (uint64_t *)calloc(n->nzones, sizeof(*n->wp));
		for (uint32_t z = 0; z < n->nzones; z++)
			n->wp[z] = z * zone_blocks;
	}
	return n;
}

static inline void nvme_nsm_fini(struct nvme_nsm *t)
{
	for (uint32_t i = 0; i < t->n; i++) {
		free(t->ns[i].data);
		free(t->ns[i].meta);
		free(t->ns[i].wp);
	}
	memset(t, 0, sizeof(*t));
}

static inline struct nvme_nsm_ns *nvme_nsm_find(struct nvme_nsm *t, uint32_t nsid)
{
	for (uint32_t i = 0; i < t->n; i++)
		if (t->ns[i].nsid == nsid && !t->ns[i].detached)
			return &t->ns[i];
	return NULL;
}

/*
 * Format NVM of namespace `n` to LBA format `f` (its fmt_bytes, 512 B when 0): the same capacity
 * in bytes, in blocks of the new size, all zero, no metadata or protection. Returns the status.
 */
static inline uint16_t nvme_nsm_format(struct nvme_nsm_ns *n, uint32_t f)
{
	uint32_t bytes = n->fmt_bytes[f & 15] ? n->fmt_bytes[f & 15] : 512;
	uint64_t blocks = n->blocks * n->lba_bytes / bytes;
	uint8_t *d;

	if (f > n->nlbaf || n->zone_blocks)
		return UPCIE_NVME_SC_INVALID_FIELD;
	d = (uint8_t *)calloc(blocks, bytes);
	if (!d)
		return UPCIE_NVME_SC_INTERNAL;
	free(n->data);
	free(n->meta);
	n->data = d;
	n->meta = NULL;
	n->blocks = blocks;
	n->lba_bytes = bytes;
	n->ms = 0;
	n->ext = false;
	n->dps = 0;
	n->lbaf = (uint8_t)f;
	return 0;
}

static inline int nvme_nsm_nsid_cmp_(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * Identify for the namespaces into buf (4096 bytes). Returns the status, or -1 when the CNS is
 * not a namespace one (the controller model answers it).
 */
static inline int nvme_nsm_identify(struct nvme_nsm *t, uint32_t nn,
				    const struct upcie_nvme_sqe *sqe, uint8_t *buf)
{
	uint32_t cns = sqe->cdw10 & 0xff, csi = sqe->cdw11 >> 24;
	struct nvme_nsm_ns *n = nvme_nsm_find(t, sqe->nsid);

	switch (cns) {
	case UPCIE_NVME_CNS_NS: {
		struct upcie_nvme_id_ns *id = (struct upcie_nvme_id_ns *)buf;
		uint8_t lbads = 0;

		t->n_identify_ns++;
		if (!sqe->nsid || (sqe->nsid > nn && sqe->nsid != UPCIE_NVME_NSID_ALL))
			return UPCIE_NVME_SC_INVALID_NS;
		if (!n)
			return 0; /* inactive: zeroes */
		while ((UINT32_C(1) << lbads) < n->lba_bytes)
			lbads++;
		id->nsze = id->ncap = id->nuse = n->blocks;
		id->nlbaf = n->nlbaf;
		id->flbas =
		    (uint8_t)((n->lbaf & 0xf) | ((n->lbaf >> 4) << 5) | (n->ext ? 0x10 : 0));
		for (uint32_t f = 0; f <= n->nlbaf && f < 64; f++) {
			/* formats other than the one in use: fmt_bytes (512 B), no metadata */
			uint32_t b = f < 16 && n->fmt_bytes[f] ? n->fmt_bytes[f] : 512;
			uint8_t s = 9;

			while ((UINT32_C(1) << s) < b)
				s++;
			id->lbaf[f].lbads = s;
		}
		id->lbaf[n->lbaf].lbads = lbads;
		id->lbaf[n->lbaf].ms = n->ms;
		id->dps = n->dps;
		id->dpc = n->dps ? 0x1f : 0;
		if (t->over && sqe->nsid == t->over_nsid)
			t->over(id);
		return 0;
	}
	case UPCIE_NVME_CNS_NS_ACTIVE_LIST: {
		uint32_t *l = (uint32_t *)buf, ids[NVME_NSM_MAX], k = 0, na = 0;

		t->n_list++;
		if (t->no_active_list)
			return UPCIE_NVME_SC_INVALID_FIELD;
		if (t->endless_list) {
			for (uint32_t i = 0; i < 1024; i++)
				l[i] = i + 1;
			return 0;
		}
		for (uint32_t i = 0; i < t->n; i++)
			if (!t->ns[i].detached)
				ids[na++] = t->ns[i].nsid;
		qsort(ids, na, sizeof(ids[0]), nvme_nsm_nsid_cmp_);
		for (uint32_t i = 0; i < na; i++)
			if (ids[i] > sqe->nsid)
				l[k++] = ids[i];
		return 0;
	}
	case UPCIE_NVME_CNS_NS_DESC_LIST:
		t->n_desc++;
		if (t->no_desc_list)
			return UPCIE_NVME_SC_INVALID_FIELD;
		if (!n)
			return UPCIE_NVME_SC_INVALID_NS;
		if (t->bad_desc_list) {
			buf[0] = UPCIE_NVME_NIDT_NGUID;
			buf[1] = 250; /* 16 would be right; this one reaches past the CSI below */
			return 0;
		}
		buf[0] = UPCIE_NVME_NIDT_NGUID;
		buf[1] = 16;
		buf[4] = (uint8_t)n->nsid;
		buf[20] = UPCIE_NVME_NIDT_CSI;
		buf[21] = 1;
		buf[24] = n->csi;
		return 0;
	case UPCIE_NVME_CNS_CS_NS: {
		struct upcie_nvme_id_ns_zns *z = (struct upcie_nvme_id_ns_zns *)buf;

		if (!n)
			return UPCIE_NVME_SC_INVALID_NS;
		t->n_cs_ns++;
		if (csi == UPCIE_NVME_CSI_NVM && n->csi == UPCIE_NVME_CSI_NVM) {
			struct upcie_nvme_id_ns_nvm *v = (struct upcie_nvme_id_ns_nvm *)buf;

			v->elbaf[n->lbaf & 63] = (n->sts & 0x7fu) | ((uint32_t)(n->pif & 3u) << 7);
			return 0;
		}
		if (csi != UPCIE_NVME_CSI_ZNS || n->csi != UPCIE_NVME_CSI_ZNS)
			return UPCIE_NVME_SC_INVALID_FIELD;
		z->mar = z->mor = UINT32_MAX;
		z->lbafe[n->lbaf].zsze = n->zone_blocks;
		return 0;
	}
	case UPCIE_NVME_CNS_CS_CTRL:
		if (csi != UPCIE_NVME_CSI_ZNS)
			return -1;
		t->n_cs_ctrl_zns++;
		buf[0] = t->zasl;
		return 0;
	default:
		return -1;
	}
}

/* Data movement of one command, block by block through the data pointer. */
struct nvme_nsm_xfer_ {
	struct nvme_model *m;
	const struct nvme_model_pend *p; /* the command, for the DMA observer */
	uint8_t *buf;			 /* linear bounce of the whole transfer */
	int dir;			 /* 0: device memory to buf, 1: buf to device memory */
};

static inline int nvme_nsm_emit_(void *ctx, uint64_t iova, uint64_t len)
{
	struct nvme_nsm_xfer_ *x = (struct nvme_nsm_xfer_ *)ctx;

	while (len) {
		uint64_t contig, take;
		uint8_t *p = nvme_model_iomap_find(x->m->iomap, iova, &contig);

		if (!p)
			return UPCIE_NVME_SC_DATA_XFER_ERROR;
		take = contig < len ? contig : len;
		/* reported before it happens, as nvme_model.h promises for every access */
		nvme_model_dma_(x->m, x->p, x->dir == 0 ? 1 : 0, NVME_MODEL_DMA_DATA, p, take);
		if (x->dir == 0)
			memcpy(x->buf, p, take);
		else
			memcpy(p, x->buf, take);
		x->buf += take;
		iova += take;
		len -= take;
	}
	return 0;
}

/* PI tuple at `pi`: guard, application tag, reference tag, big-endian as T10 DIF has them. */
static inline void nvme_nsm_pi_put_(uint8_t *pi, uint16_t guard, uint16_t app, uint32_t ref)
{
	pi[0] = (uint8_t)(guard >> 8);
	pi[1] = (uint8_t)guard;
	pi[2] = (uint8_t)(app >> 8);
	pi[3] = (uint8_t)app;
	pi[4] = (uint8_t)(ref >> 24);
	pi[5] = (uint8_t)(ref >> 16);
	pi[6] = (uint8_t)(ref >> 8);
	pi[7] = (uint8_t)ref;
}

static inline uint8_t *nvme_nsm_pi_at_(struct nvme_nsm_ns *n, uint64_t lba)
{
	uint8_t *md = n->meta + lba * n->ms;

	return (n->dps & UPCIE_NVME_DPS_PIP) ? md : md + n->ms - UPCIE_NVME_PI_BYTES;
}

/* Check the stored PI of `lba` as a read with PRCHK bits (CDW12), application tag and mask
 * (CDW15) and reference `ref` would. */
static inline uint16_t nvme_nsm_pi_check_(struct nvme_nsm_ns *n, uint64_t lba, uint32_t cdw12,
					  uint32_t cdw15, uint32_t ref)
{
	uint8_t *pi = nvme_nsm_pi_at_(n, lba);
	uint16_t guard = (uint16_t)(pi[0] << 8 | pi[1]), app = (uint16_t)(pi[2] << 8 | pi[3]);
	uint32_t tag = (uint32_t)pi[4] << 24 | (uint32_t)pi[5] << 16 | (uint32_t)pi[6] << 8 | pi[7];

	if (app == 0xffff)
		return 0; /* never written: checks off */
	if ((cdw12 & UPCIE_NVME_RW_PRCHK_GUARD) &&
	    guard != nvme_nsm_crc16(n->data + lba * n->lba_bytes, n->lba_bytes))
		return UPCIE_NVME_SC_GUARD_CHECK;
	if ((cdw12 & UPCIE_NVME_RW_PRCHK_APP) && ((app ^ cdw15) & (cdw15 >> 16) & 0xffffu))
		return UPCIE_NVME_SC_APPTAG_CHECK;
	if ((cdw12 & UPCIE_NVME_RW_PRCHK_REF) && (n->dps & 7) != UPCIE_NVME_DPS_PIT_3 && tag != ref)
		return UPCIE_NVME_SC_REFTAG_CHECK;
	return 0;
}

static inline uint16_t nvme_nsm_zone_write_(struct nvme_nsm_ns *n, uint64_t slba, uint32_t nlb)
{
	uint32_t z = (uint32_t)(slba / n->zone_blocks);
	uint64_t end = (uint64_t)(z + 1) * n->zone_blocks;

	if (z >= n->nzones)
		return UPCIE_NVME_SC_LBA_RANGE;
	if (n->wp[z] == end)
		return UPCIE_NVME_SC_ZONE_FULL;
	if (slba != n->wp[z])
		return UPCIE_NVME_SC_ZONE_INVALID_WRITE;
	if (slba + nlb > end)
		return UPCIE_NVME_SC_ZONE_BOUNDARY;
	n->wp[z] += nlb;
	return 0;
}

/*
 * Zone Append of `nlb` blocks to the zone starting at `zslba`: the zone's write pointer is
 * where they go (*slba), the size limit ZASL (2^zasl 4 KiB pages, 0: none) and the zone's end
 * bound it.
 */
static inline uint16_t nvme_nsm_zone_append_(struct nvme_nsm *t, struct nvme_nsm_ns *n,
					     uint64_t zslba, uint32_t nlb, uint64_t *slba)
{
	uint32_t z = (uint32_t)(zslba / n->zone_blocks);

	if (zslba % n->zone_blocks)
		return UPCIE_NVME_SC_INVALID_FIELD;
	if (z >= n->nzones)
		return UPCIE_NVME_SC_LBA_RANGE;
	if (t->zasl && (uint64_t)nlb * n->lba_bytes > (UINT64_C(4096) << t->zasl))
		return UPCIE_NVME_SC_INVALID_FIELD;
	*slba = n->wp[z];
	return nvme_nsm_zone_write_(n, *slba, nlb);
}

static inline uint16_t nvme_nsm_zone_cmd_(struct nvme_model *m, const struct nvme_model_pend *p,
					  struct nvme_nsm_ns *n, const struct upcie_nvme_sqe *sqe)
{
	uint64_t slba = sqe->cdw10 | ((uint64_t)sqe->cdw11 << 32);
	uint32_t z = (uint32_t)(slba / n->zone_blocks);

	if (!n->zone_blocks)
		return UPCIE_NVME_SC_INVALID_OPCODE;
	if (sqe->opc == UPCIE_NVME_ZNS_MGMT_SEND) {
		if ((sqe->cdw13 & 0xff) != UPCIE_NVME_ZSA_RESET)
			return UPCIE_NVME_SC_INVALID_FIELD;
		for (uint32_t i = 0; i < n->nzones; i++)
			if ((sqe->cdw13 & 0x100) || i == z)
				n->wp[i] = (uint64_t)i * n->zone_blocks;
		return (sqe->cdw13 & 0x100) || z < n->nzones ? 0 : UPCIE_NVME_SC_LBA_RANGE;
	} else {
		uint64_t len = ((uint64_t)sqe->cdw12 + 1) * 4, k = 0;
		uint8_t *rep = (uint8_t *)calloc(1, len);
		struct nvme_nsm_xfer_ x;
		int err;

		for (uint32_t i = z; i < n->nzones && 64 + (k + 1) * 64 <= len; i++, k++) {
			struct upcie_nvme_zone_desc *d =
			    (struct upcie_nvme_zone_desc *)(rep + 64 + k * 64);
			uint64_t zs = (uint64_t)i * n->zone_blocks;

			d->zt = 2;
			d->zs = (uint8_t)((n->wp[i] == zs		     ? UPCIE_NVME_ZS_EMPTY
					   : n->wp[i] == zs + n->zone_blocks ? UPCIE_NVME_ZS_FULL
									     : UPCIE_NVME_ZS_IOPEN)
					  << 4);
			d->zcap = n->zone_blocks;
			d->zslba = zs;
			d->wp = n->wp[i];
		}
		((struct upcie_nvme_zone_report_hdr *)rep)->nr_zones = k;
		x.m = m;
		x.p = p;
		x.buf = rep;
		x.dir = 1;
		err = nvme_model_dptr_walk_(m, sqe, len, nvme_nsm_emit_, &x);
		free(rep);
		return (uint16_t)err;
	}
}

/*
 * Execute an I/O command on the namespace table (nvme_model exec hook: ctx is the table).
 * Read/Write/Compare move lba_bytes per block, plus ms interleaved for extended LBAs unless PI
 * is all the metadata and PRACT is set; separate metadata travels through MPTR. PRACT makes the
 * model generate PI (guard CRC, application tag CDW15 15:0, reference tag CDW14 + i) on writes
 * and check and strip it on reads (the application tag under the mask of CDW15 31:16). Zone
 * Append writes at its zone's write pointer and completes with that LBA in DW0/DW1.
 */
static inline uint16_t nvme_nsm_exec(void *ctx, struct nvme_model *m,
				     const struct upcie_nvme_sqe *sqe, struct nvme_model_pend *p)
{
	struct nvme_nsm *t = (struct nvme_nsm *)ctx;
	struct nvme_nsm_ns *n;
	uint64_t slba = sqe->cdw10 | ((uint64_t)sqe->cdw11 << 32);
	uint32_t nlb = (sqe->cdw12 & 0xffff) + 1, per, mlen, ref0 = sqe->cdw14;
	bool pract = sqe->cdw12 & UPCIE_NVME_RW_PRACT, strip, sep;
	uint8_t *buf, *mbuf = NULL;
	struct nvme_nsm_xfer_ x;
	uint16_t st = 0;
	int err;

	if (sqe->opc == NVME_MODEL_OPC_ECHO) {
		p->dw0 = sqe->cdw2;
		p->dw1 = sqe->cdw3;
		return 0;
	}
	n = nvme_nsm_find(t, sqe->nsid);
	if (!n)
		return UPCIE_NVME_SC_INVALID_NS;
	n->n_io++;
	n->last_cdw12 = sqe->cdw12;
	n->last_cdw14 = sqe->cdw14;
	n->last_cdw15 = sqe->cdw15;
	n->last_mptr = sqe->mptr;
	n->last_opc = sqe->opc;
	n->last_slba = slba;
	if (sqe->opc == UPCIE_NVME_NVM_FLUSH)
		return 0;
	if (sqe->opc == UPCIE_NVME_ZNS_MGMT_SEND || sqe->opc == UPCIE_NVME_ZNS_MGMT_RECV)
		return nvme_nsm_zone_cmd_(m, p, n, sqe);
	if (sqe->opc == UPCIE_NVME_ZNS_APPEND) {
		uint64_t zslba = slba;

		if (!n->zone_blocks)
			return UPCIE_NVME_SC_INVALID_OPCODE;
		if (pract && !n->dps)
			return UPCIE_NVME_SC_INVALID_FIELD;
		st = nvme_nsm_zone_append_(t, n, zslba, nlb, &slba);
		if (st)
			return st;
		n->n_append++;
		/* the LBA the data went to, in the completion (DW0 low, DW1 high) */
		p->dw0 = (uint32_t)(slba + (uint64_t)t->append_lba_skew);
		p->dw1 = (uint32_t)((slba + (uint64_t)t->append_lba_skew) >> 32);
		/* PIREMAP: reference tags from ILBRT (for the zone's start) to where it landed */
		if (sqe->cdw12 & UPCIE_NVME_ZA_PIREMAP)
			ref0 = sqe->cdw14 + (uint32_t)(slba - zslba);
	} else if (sqe->opc != UPCIE_NVME_NVM_READ && sqe->opc != UPCIE_NVME_NVM_WRITE &&
		   sqe->opc != UPCIE_NVME_NVM_COMPARE && sqe->opc != UPCIE_NVME_NVM_WRITE_ZEROES) {
		return UPCIE_NVME_SC_INVALID_OPCODE;
	}
	if (slba >= n->blocks || nlb > n->blocks - slba)
		return UPCIE_NVME_SC_LBA_RANGE;
	if (pract && !n->dps)
		return UPCIE_NVME_SC_INVALID_FIELD;
	if (n->zone_blocks &&
	    (sqe->opc == UPCIE_NVME_NVM_WRITE || sqe->opc == UPCIE_NVME_NVM_WRITE_ZEROES)) {
		st = nvme_nsm_zone_write_(n, slba, nlb);
		if (st)
			return st;
	}
	if (pract)
		n->n_pract++;
	if (sqe->opc == UPCIE_NVME_NVM_WRITE_ZEROES) {
		memset(n->data + slba * n->lba_bytes, 0, (size_t)nlb * n->lba_bytes);
		for (uint32_t i = 0; i < nlb && n->ms; i++) {
			memset(n->meta + (slba + i) * n->ms, 0, n->ms);
			if (pract)
				nvme_nsm_pi_put_(nvme_nsm_pi_at_(n, slba + i),
						 nvme_nsm_crc16(n->data + (slba + i) * n->lba_bytes,
								n->lba_bytes),
						 (uint16_t)sqe->cdw15, sqe->cdw14 + i);
		}
		return 0;
	}
	/* PI alone as metadata and PRACT: the metadata does not travel */
	strip = pract && n->ms == UPCIE_NVME_PI_BYTES;
	sep = n->ms && !n->ext && !strip;
	per = n->lba_bytes + (n->ms && n->ext && !strip ? n->ms : 0);
	buf = (uint8_t *)malloc((size_t)nlb * per);
	mlen = sep ? nlb * n->ms : 0;
	if (sep)
		mbuf = (uint8_t *)malloc(mlen);
	x.m = m;
	x.p = p;
	x.buf = buf;
	if (sqe->opc == UPCIE_NVME_NVM_READ) {
		for (uint32_t i = 0; i < nlb && !st; i++) {
			uint64_t lba = slba + i;

			if (pract)
				st = nvme_nsm_pi_check_(n, lba, sqe->cdw12, sqe->cdw15,
							sqe->cdw14 + i);
			memcpy(buf + (size_t)i * per, n->data + lba * n->lba_bytes, n->lba_bytes);
			if (per > n->lba_bytes)
				memcpy(buf + (size_t)i * per + n->lba_bytes, n->meta + lba * n->ms,
				       n->ms);
			if (sep)
				memcpy(mbuf + (size_t)i * n->ms, n->meta + lba * n->ms, n->ms);
		}
		if (st) {
			n->n_pi_errors++;
			goto out;
		}
		x.dir = 1;
		err = nvme_model_dptr_walk_(m, sqe, (uint64_t)nlb * per, nvme_nsm_emit_, &x);
		if (!err && sep) {
			x.buf = mbuf;
			err = nvme_nsm_emit_(&x, sqe->mptr, mlen);
		}
		st = (uint16_t)err;
		goto out;
	}
	x.dir = 0;
	err = nvme_model_dptr_walk_(m, sqe, (uint64_t)nlb * per, nvme_nsm_emit_, &x);
	if (!err && sep) {
		x.buf = mbuf;
		err = nvme_nsm_emit_(&x, sqe->mptr, mlen);
	}
	if (err) {
		st = (uint16_t)err;
		goto out;
	}
	for (uint32_t i = 0; i < nlb; i++) {
		uint64_t lba = slba + i;
		uint8_t *d = n->data + lba * n->lba_bytes;

		if (sqe->opc == UPCIE_NVME_NVM_COMPARE) {
			if (memcmp(d, buf + (size_t)i * per, n->lba_bytes)) {
				st = UPCIE_NVME_SC_COMPARE_FAILED;
				break;
			}
			continue;
		}
		memcpy(d, buf + (size_t)i * per, n->lba_bytes);
		if (per > n->lba_bytes)
			memcpy(n->meta + lba * n->ms, buf + (size_t)i * per + n->lba_bytes, n->ms);
		if (sep)
			memcpy(n->meta + lba * n->ms, mbuf + (size_t)i * n->ms, n->ms);
		if (pract)
			nvme_nsm_pi_put_(nvme_nsm_pi_at_(n, lba), nvme_nsm_crc16(d, n->lba_bytes),
					 (uint16_t)sqe->cdw15, ref0 + i);
	}
out:
	free(buf);
	free(mbuf);
	return st;
}

#endif /* UPCIE_TEST_NVME_NS_MODEL_H */
