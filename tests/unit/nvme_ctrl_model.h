/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A controller-level model for unit tests of nvme/ctrl.h and nvme/ns.h: BAR0 registers in
 * memory (CAP, VS, CC, CSTS, AQA, ASQ, ACQ, CRTO, doorbells with DSTRD 0), the enable /
 * disable / shutdown handshakes, an admin queue and I/O queues built on nvme_model.h. A test
 * instrument, never evidence of hardware behaviour.
 *
 * Admin commands: Identify (controller, namespace 1, active list), Set Features Number of
 * Queues, Create/Delete I/O CQ and SQ (checked like a controller: identifiers, sizes, CQ
 * before SQ, SQ before CQ on delete), Abort (of commands the model holds), Asynchronous Event
 * Request (held forever). Commands take effect when they complete (a slow Create I/O CQ creates
 * its queue late). Disabling (CC.EN = 0) forgets every queue and command, as a controller level
 * reset does.
 *
 * Knobs for what real controllers do: ready delay or never ready, a controller found enabling
 * (CC.EN = 1, CSTS.RDY = 0) at takeover, CSTS.CFS on enable or after some I/O commands, vanishing
 * (every register reads all ones) after some I/O commands, VS/CRTO, MDTS, SGLS, queues granted, a
 * failing Create I/O SQ or Delete I/O SQ/CQ, admin commands of one opcode held or delayed, I/O
 * commands of one opcode held until aborted or released (late completion), completions of held
 * commands posted after a reset into the recreated queue, Abort that does or does not abort or
 * fails with a status; CAP.DSTRD != 0 (the doorbells move with it), CAP.MPSMIN and CC.MPS (PRPs
 * walked at the page the host chose), a BAR0 of any size (exactly that much memory, so an access
 * beyond it is a reported overflow), NN, VWC (with the Flushes that came before the shutdown
 * counted), a shutdown that never completes, NVM subsystem reset (CAP.NSSRS, NSSR, CSTS.NSSRO), a
 * failing Set Features Number of Queues, a CMB's registers, a controller that ignores CC.EN = 0
 * until a function level reset, a Bus Master Enable the test keeps (no DMA while it is off),
 * registers in the test's memory (a BAR0 file), CSTS.CFS raised from another thread, firmware
 * activation without reset (Firmware Activation Starting, CSTS.PP for a while, MTFA, the
 * Firmware Slot log), error events with the Error Information log, and through nvme_ns_model.h
 * namespaces of any NSID, LBA format, metadata, protection information and zones. Records what a
 * controller could hold against its host: CC.EN cleared while enabling. Every host memory access
 * of the NVM command set on namespace 1 and of the admin commands is reported to `dma`
 * (nvme_eo.h). One thread steps
 * everything (nvme_cmodel_start/stop).
 */
#ifndef UPCIE_TEST_NVME_CTRL_MODEL_H
#define UPCIE_TEST_NVME_CTRL_MODEL_H

#include <upcie/base/feature.h>

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/clock.h>
#include <upcie/nvme/spec.h>

#include "nvme_model.h"
#include "nvme_ns_model.h"

#define NVME_CMODEL_REGS   0x4000
#define NVME_CMODEL_MAXQ   64
#define NVME_CMODEL_MAXHLD 64 /* held commands carried over a reset, per queue */

struct nvme_cmodel;

struct nvme_cmodel_q {
	struct nvme_cmodel *cm;
	bool cq, sq;
	uint64_t cq_iova;
	uint32_t cq_depth;
	bool ien;
	uint16_t iv;
	struct nvme_model m;				   /* live while sq */
	struct nvme_model_pend sticky[NVME_CMODEL_MAXHLD]; /* held across a reset */
	uint32_t nsticky;
};

struct nvme_cmodel {
	uint32_t *regs; /* NVME_CMODEL_REGS bytes, 4 KiB aligned */
	/* knobs, set before start */
	uint32_t ready_delay_ms;
	bool never_ready;
	bool cfs_on_enable;
	uint32_t crto;
	uint8_t mdts;
	uint32_t sgls;
	uint16_t oncs;
	uint32_t nqueues;	  /* granted by Set Features */
	uint16_t fail_create_sq;  /* status for Create I/O SQ, 0: succeed */
	uint16_t fail_delete_sq;  /* status for Delete I/O SQ, 0: succeed */
	uint16_t fail_delete_cq;  /* status for Delete I/O CQ, 0: succeed */
	uint8_t hold_opc;	  /* I/O opcode held until aborted or released; 0: none */
	uint32_t io_delay_us;	  /* I/O commands complete (and move data) this long after fetch */
	bool abort_on_sq_delete;  /* Delete I/O SQ posts "aborted: SQ deleted" for what it held */
	uint8_t hold_admin_opc;	  /* admin opcode held likewise; 0: none */
	uint8_t delay_admin_opc;  /* admin opcode completed (and effective) only after ... */
	uint32_t delay_admin_ms;  /* ... this many ms */
	bool abort_aborts;	  /* Abort completes a held command (dw0 0) or not (dw0 1) */
	uint16_t abort_status;	  /* status the Abort command itself completes with; 0: success */
	bool late_after_reset;	  /* held I/O commands complete after a reset, in the new queue */
	uint64_t cfs_after_io;	  /* CSTS.CFS once this many I/O commands were fetched; 0: never */
	uint64_t vanish_after_io; /* all registers read all ones after this many; 0: never */
	bool vanish;		  /* gone now */
	uint32_t rtd3e;
	uint32_t nn;		  /* Identify NN; 0: 1 (or the namespace table's highest NSID) */
	uint8_t vwc;		  /* Identify VWC */
	uint16_t fail_set_queues; /* status for Set Features Number of Queues, 0: succeed */
	size_t regs_size;	  /* BAR0 bytes (nvme_cmodel_set_regs_size()) */
	bool hold_shutdown;	  /* CC.SHN is never answered with SHST complete */
	/* a controller that ignores CC.EN = 0 (CSTS.RDY stays 1, its queues go on) until a
	 * function reset (nvme_cmodel_flr()), which ends the hang */
	bool no_disable;
	/* the PCI function's Bus Master Enable as the test keeps it (config space): while it
	 * returns false the model fetches, moves and posts nothing; NULL: always on */
	bool (*bus_master)(void *ctx);
	void *bus_master_ctx;
	/* firmware activation (nvme_cmodel_fw_activate()): Identify MTFA (100 ms units) and FR,
	 * which the Firmware Slot log reports as slot 1's (the active one) */
	uint16_t mtfa;
	char fw_rev[8]; /* "" until init: "1.0" */
	/* asynchronous events: Identify AERL, OAES, LPA; the effects log (LPA bit 1) */
	uint8_t aerl;
	uint32_t oaes;
	uint8_t lpa;
	uint32_t effects[256];
	uint16_t temp_k; /* composite temperature (K); 0: 300 */
	/* transient I/O failures: the next io_fail_n I/O commands fetched complete with
	 * io_fail_code (DNR io_fail_dnr, CRD io_fail_crd), unexecuted; and every I/O command
	 * fetched before io_notready_until_ns (upcie_time_ns()) with Namespace Not Ready */
	uint32_t io_fail_n;
	uint16_t io_fail_code;
	bool io_fail_dnr;
	uint8_t io_fail_crd;
	uint64_t io_notready_until_ns;
	uint16_t crdt[3]; /* Identify CRDT1..3 (100 ms units) */
	uint32_t ctratt;  /* Identify CTRATT (bit 15: extended LBA formats) */
	/* NVM command set Identify Controller (CNS 06h): WZSL, DMRL, DMRSL; 0: no limit */
	uint8_t wzsl, dmrl;
	uint32_t dmrsl;
	struct nvme_nsm *nsm;  /* namespaces of any NSID, format, PI, zones; NULL: ns 1 */
	nvme_model_dma_fn dma; /* DMA observer of every queue */
	void *dma_ctx;
	/* namespace 1 */
	uint8_t *ns;
	uint64_t ns_blocks;
	uint32_t lba_bytes;
	uint16_t ms;
	struct nvme_model_iomap *iomap;
	/* state */
	struct nvme_model admin;
	bool admin_live;
	bool rdy;
	bool cfs; /* fatal: processes nothing until disabled */
	uint64_t en_at_ns;
	uint32_t en_aqa;	 /* AQA, ASQ, ACQ when enabling began: the host may not */
	uint64_t en_asq, en_acq; /* change them unless it cleared CC.EN */
	uint64_t io_fetched;	 /* I/O commands fetched since start, all queues */
	int release_req; /* nvme_cmodel_release(): complete held commands at the next step */
	struct nvme_cmodel_q q[NVME_CMODEL_MAXQ + 1];
	/* records (read after stop, or with care) */
	uint32_t n_enable, n_disable, n_shutdown, n_create_cq, n_create_sq, n_delete_sq,
	    n_delete_cq, n_abort, n_set_queues, n_identify;
	uint32_t n_en_cleared_enabling; /* CC.EN cleared while enabling (CSTS.RDY still 0) */
	uint32_t n_abort_fetched;	/* Aborts fetched (n_abort: executed) */
	uint64_t abort_first_ns, abort_last_ns; /* when the first and the last were fetched */
	uint16_t last_abort_sqid, last_abort_cid;
	uint64_t io_fetch_ns[64]; /* when I/O command n (0..63, fetch order) was fetched */
	uint32_t n_hbs;		  /* Set Features Host Behavior Support */
	uint8_t hbs_acre;	  /* its ACRE byte, as last set */
	uint32_t last_cc, last_aqa;
	uint64_t last_asq, last_acq;
	uint32_t cq_ien_iv; /* last created CQ: ien << 16 | iv */
	uint32_t last_create_sq_cdw11, last_create_cq_cdw11;
	/* Flushes, and how many preceded the first CC.SHN */
	uint32_t n_flush, last_flush_nsid, flushes_at_shutdown;
	uint32_t n_nssr; /* NVM subsystem resets */
	bool nssro;	 /* CSTS.NSSRO, set by a subsystem reset */
	/* events: raised by nvme_cmodel_event() / a threshold / a detach, completed into a held
	 * Asynchronous Event Request while their type is not masked; a type stays masked until
	 * its log page is read with RAE clear */
	uint32_t aec;	      /* Set Features 0Bh */
	uint16_t tmpth;	      /* Set Features 04h over-temperature threshold; 0: none */
	uint8_t smart_cw;     /* SMART critical warning */
	uint32_t ev_pend[16]; /* events waiting for an AER */
	uint32_t nev_pend;
	uint32_t ev_masked;	 /* bit per event type */
	uint32_t changed_ns[16]; /* Changed Namespace List */
	uint32_t nchanged_ns;
	int ev_req; /* from other threads: raise ev_req_dw0 at the next step */
	uint32_t ev_req_dw0;
	uint32_t detach_req; /* from other threads: detach this NSID at the next step */
	uint32_t attach_req; /* from other threads: attach this NSID at the next step */
	uint32_t resize_req; /* from other threads: this NSID gets resize_blocks at the next step */
	uint64_t resize_blocks;
	/* Error Information log: the newest entry first; nvme_cmodel_error() adds one */
	uint8_t err_log[8][64];
	uint32_t nerr_log;
	uint64_t err_count;
	int err_req; /* from other threads: add err_req_ent and raise an error event */
	uint8_t err_req_info;
	uint8_t err_req_ent[64];
	/* firmware activation: requested, notice raised (waiting for its AER to be posted),
	 * processing paused (CSTS.PP) until pp_until_ns */
	int fw_req;
	uint32_t fw_req_ms;
	char fw_req_rev[8];
	int fw_phase; /* 0: none, 1: notice raised, 2: paused */
	uint64_t pp_until_ns;
	uint64_t pp_set_ns, pp_clear_ns; /* records: when CSTS.PP was last set and cleared */
	uint32_t n_fw_act;		 /* activations done (CSTS.PP cleared at their end) */
	uint64_t pp_steps;		 /* steps in which processing was paused */
	int cfs_req;			 /* from other threads: CSTS.CFS at the next step */
	int flr_req;			 /* from other threads: a function level reset */
	uint32_t n_flr;			 /* function level resets */
	bool disable_ignored;		 /* CC.EN = 0 was ignored (no_disable) */
	uint64_t bm_off_steps;		 /* steps in which Bus Master Enable was off */
	bool regs_ext;			 /* regs are the test's (nvme_cmodel_use_regs()) */
	uint32_t n_aer_fetched, n_aer_done, n_get_log, last_log_lid, last_log_rae, n_format, n_aec;
	pthread_t thread;
	int run;
};

static inline uint32_t nvme_cmodel_rd(struct nvme_cmodel *cm, uint32_t off)
{
	return __atomic_load_n(&cm->regs[off / 4], __ATOMIC_ACQUIRE);
}

static inline void nvme_cmodel_wr(struct nvme_cmodel *cm, uint32_t off, uint32_t v)
{
	__atomic_store_n(&cm->regs[off / 4], v, __ATOMIC_RELEASE);
}

static inline uint64_t nvme_cmodel_rd64(struct nvme_cmodel *cm, uint32_t off)
{
	return nvme_cmodel_rd(cm, off) | ((uint64_t)nvme_cmodel_rd(cm, off + 4) << 32);
}

/*
 * Write CSTS as the controller: `v`, plus NSSRO once a subsystem reset set it. (NSSRO is RW1C;
 * a host's write of 1 cannot be told from the 1 already there in a register held in memory, so
 * the model never sees it cleared.)
 */
static inline void nvme_cmodel_csts_(struct nvme_cmodel *cm, uint32_t v)
{
	nvme_cmodel_wr(cm, UPCIE_NVME_REG_CSTS, v | (cm->nssro ? UPCIE_NVME_CSTS_NSSRO : 0));
}

/* CAP: MQES, CQR, TO, DSTRD 0, CSS, MPSMIN 0, MPSMAX, CRMS. */
static inline uint64_t nvme_cmodel_cap(uint32_t mqes_entries, uint32_t to, uint32_t css,
				       uint32_t mpsmin, uint32_t crms)
{
	return (uint64_t)(mqes_entries - 1) | (UINT64_C(1) << 16) | ((uint64_t)to << 24) |
	       ((uint64_t)css << 37) | ((uint64_t)mpsmin << 48) | ((uint64_t)4 << 52) |
	       ((uint64_t)crms << 59);
}

/* Defaults: QEMU-like CAP (MQES 2048, TO 1 = 500 ms, CSS 0xc1), VS 1.4, 8 queues. */
static inline void nvme_cmodel_init(struct nvme_cmodel *cm, struct nvme_model_iomap *im,
				    uint8_t *ns, uint64_t blocks, uint32_t lba_bytes)
{
	uint64_t cap = nvme_cmodel_cap(2048, 1, 0xc1, 0, 0);

	memset(cm, 0, sizeof(*cm));
	cm->regs = (uint32_t *)aligned_alloc(4096, NVME_CMODEL_REGS);
	memset(cm->regs, 0, NVME_CMODEL_REGS);
	cm->regs_size = NVME_CMODEL_REGS;
	cm->regs[0] = (uint32_t)cap;
	cm->regs[1] = (uint32_t)(cap >> 32);
	cm->regs[UPCIE_NVME_REG_VS / 4] = UPCIE_NVME_VS(1, 4, 0);
	cm->mdts = 7;
	cm->sgls = 1;
	cm->oncs = UPCIE_NVME_ONCS_COMPARE | UPCIE_NVME_ONCS_DSM | UPCIE_NVME_ONCS_WRITE_ZEROES;
	cm->nqueues = 8;
	cm->ns = ns;
	cm->ns_blocks = blocks;
	cm->lba_bytes = lba_bytes;
	cm->iomap = im;
	cm->abort_aborts = true;
	memcpy(cm->fw_rev, "1.0", 4);
}

/* The admin queue registers as they are now, as the ones enabling started with. */
static inline void nvme_cmodel_en_snap_(struct nvme_cmodel *cm)
{
	cm->en_aqa = nvme_cmodel_rd(cm, UPCIE_NVME_REG_AQA);
	cm->en_asq = nvme_cmodel_rd64(cm, UPCIE_NVME_REG_ASQ);
	cm->en_acq = nvme_cmodel_rd64(cm, UPCIE_NVME_REG_ACQ);
}

/*
 * Found enabling at takeover: CC.EN = 1, CSTS.RDY = 0 (another driver set CC.EN), ready
 * `ready_ms` from now. Call before start.
 */
static inline void nvme_cmodel_takeover_enabling(struct nvme_cmodel *cm, uint32_t ready_ms)
{
	cm->regs[UPCIE_NVME_REG_CC / 4] = 1u | (6u << 16) | (4u << 20);
	cm->regs[UPCIE_NVME_REG_CSTS / 4] = 0;
	cm->ready_delay_ms = ready_ms;
	cm->en_at_ns = upcie_time_ns();
	nvme_cmodel_en_snap_(cm);
}

static inline void nvme_cmodel_set_cap(struct nvme_cmodel *cm, uint64_t cap)
{
	cm->regs[0] = (uint32_t)cap;
	cm->regs[1] = (uint32_t)(cap >> 32);
}

/* CAP.DSTRD (doorbell stride 4 << dstrd bytes); before start. */
static inline void nvme_cmodel_set_dstrd(struct nvme_cmodel *cm, uint32_t dstrd)
{
	uint64_t cap = nvme_cmodel_rd64(cm, UPCIE_NVME_REG_CAP) & ~(UINT64_C(0xf) << 32);

	nvme_cmodel_set_cap(cm, cap | ((uint64_t)dstrd << 32));
}

/*
 * BAR0 of `size` bytes (a multiple of 4 KiB): the register block is reallocated to exactly that,
 * so an access beyond it is a heap overflow the sanitizers report. Before start.
 */
static inline void nvme_cmodel_set_regs_size(struct nvme_cmodel *cm, size_t size)
{
	uint32_t *r = (uint32_t *)aligned_alloc(4096, size);
	size_t keep = size < cm->regs_size ? size : cm->regs_size;

	memset(r, 0, size);
	memcpy(r, cm->regs, keep);
	free(cm->regs);
	cm->regs = r;
	cm->regs_size = size;
}

/*
 * A controller memory buffer: CAP.CMBS, and CMBLOC/CMBSZ as given. The registers hold their
 * values whatever CMBMSC.CRE says (a register model cannot answer a write before the read that
 * follows it); what the host writes to CMBMSC stays in the register for the test to read.
 * Queues in the CMB work when the test maps its controller addresses in the iomap.
 */
static inline void nvme_cmodel_set_cmb(struct nvme_cmodel *cm, uint32_t cmbloc, uint32_t cmbsz)
{
	nvme_cmodel_set_cap(cm, nvme_cmodel_rd64(cm, UPCIE_NVME_REG_CAP) | (UINT64_C(1) << 57));
	cm->regs[UPCIE_NVME_REG_CMBLOC / 4] = cmbloc;
	cm->regs[UPCIE_NVME_REG_CMBSZ / 4] = cmbsz;
}

/* Byte offset of doorbell `cq` (0: SQ tail, 1: CQ head) of queue `qid` with the CAP stride. */
static inline size_t nvme_cmodel_db_off(struct nvme_cmodel *cm, uint16_t qid, int cq)
{
	uint32_t dstrd = upcie_nvme_cap_dstrd(nvme_cmodel_rd64(cm, UPCIE_NVME_REG_CAP));

	return 0x1000 + ((size_t)(2u * qid + (unsigned)cq) << (2 + dstrd));
}

/* The controller memory page CC.MPS selects, as a shift. */
static inline unsigned nvme_cmodel_page_shift(struct nvme_cmodel *cm)
{
	return 12 + upcie_nvme_cc_mps(nvme_cmodel_rd(cm, UPCIE_NVME_REG_CC));
}

/* Copy `len` bytes of `src` to wherever the command's PRPs point. */
struct nvme_cmodel_copy_ {
	struct nvme_model_iomap *im;
	struct nvme_model *m;
	const struct nvme_model_pend *p;
	const uint8_t *src;
};

static inline int nvme_cmodel_copy_emit_(void *ctx, uint64_t iova, uint64_t len)
{
	struct nvme_cmodel_copy_ *c = (struct nvme_cmodel_copy_ *)ctx;

	while (len) {
		uint64_t contig, take;
		uint8_t *p = nvme_model_iomap_find(c->im, iova, &contig);

		if (!p)
			return UPCIE_NVME_SC_DATA_XFER_ERROR;
		take = contig < len ? contig : len;
		nvme_model_dma_(c->m, c->p, 0, NVME_MODEL_DMA_DATA, p, take);
		memcpy(p, c->src, take);
		c->src += take;
		iova += take;
		len -= take;
	}
	return 0;
}

static inline uint16_t nvme_cmodel_out_(struct nvme_cmodel *cm, struct nvme_model *m,
					const struct nvme_model_pend *p,
					const struct upcie_nvme_sqe *sqe, const void *buf,
					uint64_t len)
{
	struct nvme_cmodel_copy_ c;

	c.im = cm->iomap;
	c.m = m;
	c.p = p;
	c.src = (const uint8_t *)buf;
	return (uint16_t)nvme_model_prp_walk(cm->iomap, sqe->prp1, sqe->prp2, len,
					     nvme_cmodel_page_shift(cm), nvme_cmodel_copy_emit_,
					     &c);
}

static inline void nvme_cmodel_pad_(char *dst, size_t n, const char *s)
{
	memset(dst, ' ', n);
	memcpy(dst, s, strlen(s) < n ? strlen(s) : n);
}

static inline uint32_t nvme_cmodel_nn_(const struct nvme_cmodel *cm)
{
	uint32_t nn = 1;

	if (cm->nn)
		return cm->nn;
	for (uint32_t i = 0; cm->nsm && i < cm->nsm->n; i++)
		if (cm->nsm->ns[i].nsid > nn)
			nn = cm->nsm->ns[i].nsid;
	return nn;
}

static inline uint16_t nvme_cmodel_identify_(struct nvme_cmodel *cm, struct nvme_model *m,
					     const struct nvme_model_pend *p,
					     const struct upcie_nvme_sqe *sqe)
{
	uint8_t buf[4096];
	uint32_t cns = sqe->cdw10 & 0xff;

	memset(buf, 0, sizeof(buf));
	cm->n_identify++;
	if (cm->nsm && cns != UPCIE_NVME_CNS_CTRL) {
		int st = nvme_nsm_identify(cm->nsm, nvme_cmodel_nn_(cm), sqe, buf);

		if (st > 0)
			return (uint16_t)st;
		if (st == 0)
			return nvme_cmodel_out_(cm, m, p, sqe, buf, sizeof(buf));
		return UPCIE_NVME_SC_INVALID_FIELD;
	}
	if (cns == UPCIE_NVME_CNS_CTRL) {
		struct upcie_nvme_id_ctrl *id = (struct upcie_nvme_id_ctrl *)buf;

		id->vid = 0x1b36;
		nvme_cmodel_pad_(id->sn, sizeof(id->sn), "MODEL0001");
		nvme_cmodel_pad_(id->mn, sizeof(id->mn), "upcie model");
		memset(id->fr, ' ', sizeof(id->fr));
		memcpy(id->fr, cm->fw_rev, strnlen(cm->fw_rev, sizeof(cm->fw_rev)));
		id->mdts = cm->mdts;
		id->sgls = cm->sgls;
		id->oncs = cm->oncs;
		id->nn = nvme_cmodel_nn_(cm);
		id->vwc = cm->vwc;
		id->sqes = 0x66;
		id->cqes = 0x44;
		id->acl = 3;
		id->rtd3e = cm->rtd3e;
		id->aerl = cm->aerl;
		id->oaes = cm->oaes;
		id->lpa = cm->lpa;
		memcpy(id->crdt, cm->crdt, sizeof(id->crdt));
		id->ctratt = cm->ctratt;
		memcpy(buf + 270, &cm->mtfa, sizeof(cm->mtfa)); /* MTFA */
	} else if (cns == UPCIE_NVME_CNS_NS) {
		struct upcie_nvme_id_ns *ns = (struct upcie_nvme_id_ns *)buf;
		uint8_t lbads = 0;

		if (sqe->nsid == 0 || (sqe->nsid > 1 && sqe->nsid != UPCIE_NVME_NSID_ALL))
			return UPCIE_NVME_SC_INVALID_NS;
		while ((UINT32_C(1) << lbads) < cm->lba_bytes)
			lbads++;
		ns->nsze = ns->ncap = ns->nuse = cm->ns_blocks;
		ns->nlbaf = 0;
		ns->flbas = 0;
		ns->lbaf[0].lbads = lbads;
		ns->lbaf[0].ms = cm->ms;
	} else if (cns == UPCIE_NVME_CNS_NS_ACTIVE_LIST) {
		uint32_t *l = (uint32_t *)buf;

		if (sqe->nsid < 1)
			l[0] = 1;
	} else if (cns == UPCIE_NVME_CNS_NS_DESC_LIST) {
		if (sqe->nsid != 1)
			return UPCIE_NVME_SC_INVALID_NS;
		buf[0] = UPCIE_NVME_NIDT_CSI;
		buf[1] = 1;
		buf[4] = UPCIE_NVME_CSI_NVM;
	} else if (cns == UPCIE_NVME_CNS_CS_CTRL && (sqe->cdw11 >> 24) == UPCIE_NVME_CSI_NVM) {
		/* the NVM command set's limits: WZSL, DMRL, DMRSL */
		buf[1] = cm->wzsl;
		buf[3] = cm->dmrl;
		memcpy(buf + 4, &cm->dmrsl, sizeof(cm->dmrsl));
	} else {
		return UPCIE_NVME_SC_INVALID_FIELD;
	}
	return nvme_cmodel_out_(cm, m, p, sqe, buf, sizeof(buf));
}

/* Hold I/O commands of hold_opc (they complete only when aborted or released). */
static inline void nvme_cmodel_io_inject_(void *ctx, const struct upcie_nvme_sqe *sqe,
					  struct nvme_model_action *act)
{
	struct nvme_cmodel_q *q = (struct nvme_cmodel_q *)ctx;
	struct nvme_cmodel *cm = q->cm;

	if (sqe->opc == UPCIE_NVME_NVM_FLUSH) {
		cm->n_flush++;
		cm->last_flush_nsid = sqe->nsid;
	}
	if (cm->io_fetched < 64)
		cm->io_fetch_ns[cm->io_fetched] = upcie_time_ns();
	cm->io_fetched++;
	if (cm->io_notready_until_ns && upcie_time_ns() < cm->io_notready_until_ns) {
		act->code = UPCIE_NVME_SC_NS_NOT_READY;
		return;
	}
	if (cm->io_fail_n) {
		cm->io_fail_n--;
		act->code = cm->io_fail_code;
		act->dnr = cm->io_fail_dnr;
		act->crd = cm->io_fail_crd;
		return;
	}
	if (cm->hold_opc && sqe->opc == cm->hold_opc)
		act->hold = true;
	if (cm->io_delay_us)
		act->due_ns = upcie_time_ns() + (uint64_t)cm->io_delay_us * 1000;
}

static inline uint16_t nvme_cmodel_create_sq_(struct nvme_cmodel *cm,
					      const struct upcie_nvme_sqe *sqe)
{
	uint16_t qid = (uint16_t)sqe->cdw10, cqid = (uint16_t)(sqe->cdw11 >> 16);
	uint32_t depth = (sqe->cdw10 >> 16) + 1;
	struct nvme_cmodel_q *q;
	uint64_t contig;
	uint8_t *sq, *cq;

	cm->n_create_sq++;
	cm->last_create_sq_cdw11 = sqe->cdw11;
	if (cm->fail_create_sq)
		return cm->fail_create_sq;
	if (!qid || qid > cm->nqueues || qid > NVME_CMODEL_MAXQ || cm->q[qid].sq ||
	    nvme_cmodel_db_off(cm, qid, 1) + 4 > cm->regs_size)
		return UPCIE_NVME_SC_QID_INVALID;
	if (cqid != qid || !cm->q[cqid].cq)
		return UPCIE_NVME_SC_CQ_INVALID;
	if (depth < 2 || depth > 2048)
		return UPCIE_NVME_SC_QUEUE_SIZE;
	q = &cm->q[qid];
	sq = nvme_model_iomap_find(cm->iomap, sqe->prp1, &contig);
	if (!sq || contig < (uint64_t)depth * 64)
		return UPCIE_NVME_SC_DATA_XFER_ERROR;
	cq = nvme_model_iomap_find(cm->iomap, q->cq_iova, &contig);
	if (!cq || contig < (uint64_t)q->cq_depth * 16)
		return UPCIE_NVME_SC_DATA_XFER_ERROR;
	nvme_model_init(&q->m, sq, depth, cq, q->cq_depth, qid, cm->ns, cm->ns_blocks,
			cm->lba_bytes, nvme_cmodel_page_shift(cm), cm->iomap);
	q->m.dma = cm->dma;
	q->m.dma_ctx = cm->dma_ctx;
	/* a broken controller: commands held before the reset complete into the new queue */
	for (uint32_t i = 0; i < q->nsticky && q->m.nheld < q->m.held_cap; i++)
		q->m.held[q->m.nheld++] = q->sticky[i];
	q->nsticky = 0;
	q->m.sqdbp = &cm->regs[nvme_cmodel_db_off(cm, qid, 0) / 4];
	q->m.cqdbp = &cm->regs[nvme_cmodel_db_off(cm, qid, 1) / 4];
	/* a new queue starts at head = tail = 0, whatever its doorbells last held */
	__atomic_store_n(q->m.sqdbp, 0, __ATOMIC_RELEASE);
	__atomic_store_n(q->m.cqdbp, 0, __ATOMIC_RELEASE);
	if (cm->nsm) {
		q->m.exec = nvme_nsm_exec;
		q->m.exec_ctx = cm->nsm;
	}
	q->m.inject = nvme_cmodel_io_inject_;
	q->m.inject_ctx = q;
	q->cm = cm;
	q->sq = true;
	return 0;
}

static inline uint16_t nvme_cmodel_abort_(struct nvme_cmodel *cm, const struct upcie_nvme_sqe *sqe,
					  struct nvme_model_pend *p)
{
	uint16_t sqid = (uint16_t)sqe->cdw10, cid = (uint16_t)(sqe->cdw10 >> 16);
	struct nvme_model *m = NULL;

	cm->n_abort++;
	cm->last_abort_sqid = sqid;
	cm->last_abort_cid = cid;
	p->dw0 = 1; /* not aborted */
	if (cm->abort_status)
		return cm->abort_status;
	if (sqid == 0)
		m = &cm->admin;
	else if (sqid <= NVME_CMODEL_MAXQ && cm->q[sqid].sq)
		m = &cm->q[sqid].m;
	else
		return UPCIE_NVME_SC_INVALID_FIELD;
	if (cm->abort_aborts && nvme_model_abort_held(m, cid))
		p->dw0 = 0;
	return 0;
}

/* An event for the host: queued until an AER can carry it (nvme_cmodel_events_()). */
static inline void nvme_cmodel_raise_(struct nvme_cmodel *cm, uint32_t dw0)
{
	for (uint32_t i = 0; i < cm->nev_pend; i++)
		if ((cm->ev_pend[i] & 7u) == (dw0 & 7u) &&
		    ((cm->ev_pend[i] >> 8) & 0xff) == ((dw0 >> 8) & 0xff))
			return; /* one of its kind is waiting already */
	if (cm->nev_pend < 16)
		cm->ev_pend[cm->nev_pend++] = dw0;
}

/* Namespace `id` of the nsm table detached (how 0), attached (1) or shrunk to `blocks` (2), in
 * the Changed Namespace List, with a Namespace Attribute Changed notice when enabled. */
static inline void nvme_cmodel_ns_change_(struct nvme_cmodel *cm, uint32_t id, int how,
					  uint64_t blocks)
{
	for (uint32_t i = 0; cm->nsm && i < cm->nsm->n; i++) {
		struct nvme_nsm_ns *n = &cm->nsm->ns[i];

		if (n->nsid != id)
			continue;
		if (how == 0)
			n->detached = true;
		else if (how == 1)
			n->detached = false;
		else if (blocks <= n->blocks)
			n->blocks = blocks;
	}
	if (cm->nchanged_ns < 16)
		cm->changed_ns[cm->nchanged_ns++] = id;
	if (cm->aec & UPCIE_NVME_AEC_NS_ATTR)
		nvme_cmodel_raise_(cm, UPCIE_NVME_AE_TYPE_NOTICE |
					   (UPCIE_NVME_AE_NOTICE_NS_CHANGED << 8) |
					   (UPCIE_NVME_LOG_CHANGED_NS << 16));
}

/* Complete held AERs with the events waiting, while their types are not masked. */
static inline void nvme_cmodel_events_(struct nvme_cmodel *cm)
{
	struct nvme_model *m = &cm->admin;

	for (uint32_t e = 0; e < cm->nev_pend;) {
		uint32_t dw0 = cm->ev_pend[e], k;

		if (cm->ev_masked & (1u << (dw0 & 7u))) {
			e++;
			continue;
		}
		for (k = 0; k < m->nheld && m->held[k].sqe.opc != UPCIE_NVME_ADMIN_ASYNC_EVENT; k++)
			;
		if (k == m->nheld || m->npend >= m->pend_cap)
			return; /* no AER outstanding: the event waits */
		m->pend[m->npend] = m->held[k];
		m->held[k] = m->held[--m->nheld];
		m->pend[m->npend].exec = false;
		m->pend[m->npend].code = 0;
		m->pend[m->npend].dw0 = dw0;
		m->pend[m->npend].due = m->steps;
		m->pend[m->npend].due_ns = 0;
		m->npend++;
		cm->n_aer_done++;
		cm->ev_masked |= 1u << (dw0 & 7u);
		memmove(&cm->ev_pend[e], &cm->ev_pend[e + 1], (cm->nev_pend - e - 1) * 4);
		cm->nev_pend--;
	}
}

/* Raise event `dw0` (type | info << 8 | log page << 16) at the next step. From any thread. */
static inline void nvme_cmodel_event(struct nvme_cmodel *cm, uint32_t dw0)
{
	cm->ev_req_dw0 = dw0;
	__atomic_store_n(&cm->ev_req, 1, __ATOMIC_RELEASE);
	while (__atomic_load_n(&cm->ev_req, __ATOMIC_ACQUIRE) && cm->run)
		sched_yield();
}

/* Detach namespace `nsid` (the nsm table's) at the next step: it goes inactive, and a
 * Namespace Attribute Changed notice is raised when enabled. From any thread. */
static inline void nvme_cmodel_ns_detach(struct nvme_cmodel *cm, uint32_t nsid)
{
	__atomic_store_n(&cm->detach_req, nsid, __ATOMIC_RELEASE);
	while (__atomic_load_n(&cm->detach_req, __ATOMIC_ACQUIRE) && cm->run)
		sched_yield();
}

/* Attach namespace `nsid` of the nsm table (added, then marked detached) at the next step: it
 * becomes active, and a Namespace Attribute Changed notice is raised when enabled. */
static inline void nvme_cmodel_ns_attach(struct nvme_cmodel *cm, uint32_t nsid)
{
	__atomic_store_n(&cm->attach_req, nsid, __ATOMIC_RELEASE);
	while (__atomic_load_n(&cm->attach_req, __ATOMIC_ACQUIRE) && cm->run)
		sched_yield();
}

/* Namespace `nsid` shrinks to `blocks` (NSZE, NCAP, NUSE; at most its size: its data stays) at
 * the next step, with a Namespace Attribute Changed notice when enabled. */
static inline void nvme_cmodel_ns_resize(struct nvme_cmodel *cm, uint32_t nsid, uint64_t blocks)
{
	cm->resize_blocks = blocks;
	__atomic_store_n(&cm->resize_req, nsid, __ATOMIC_RELEASE);
	while (__atomic_load_n(&cm->resize_req, __ATOMIC_ACQUIRE) && cm->run)
		sched_yield();
}

/*
 * Firmware activation without a reset, from any thread: at the next step Firmware Activation
 * Starting is raised (when AEC bit 9 enables it; log page 03h), and once an AER carried it to
 * the host, CSTS.PP is set for `pause_ms`: no command of any queue is fetched or completed
 * meanwhile (admin commands included). Then the firmware `rev` is the running one (Identify FR,
 * the Firmware Slot log) and CSTS.PP clears. A disable or function reset ends the pause.
 */
static inline void nvme_cmodel_fw_activate(struct nvme_cmodel *cm, const char *rev,
					   uint32_t pause_ms)
{
	memset(cm->fw_req_rev, 0, sizeof(cm->fw_req_rev));
	memcpy(cm->fw_req_rev, rev, strnlen(rev, sizeof(cm->fw_req_rev)));
	cm->fw_req_ms = pause_ms;
	__atomic_store_n(&cm->fw_req, 1, __ATOMIC_RELEASE);
	while (__atomic_load_n(&cm->fw_req, __ATOMIC_ACQUIRE) && cm->run)
		sched_yield();
}

/*
 * An error the controller logs, from any thread: an Error Information log entry (SQID, CID,
 * status field as in a CQE's upper half: status << 1, NSID) becomes the newest, and an error
 * event of `info` (for example 04h, transient internal error) is raised, at the next step.
 */
static inline void nvme_cmodel_error(struct nvme_cmodel *cm, uint8_t info, uint16_t sqid,
				     uint16_t cid, uint16_t status, uint32_t nsid)
{
	uint16_t sf = (uint16_t)(status << 1);

	memset(cm->err_req_ent, 0, sizeof(cm->err_req_ent));
	memcpy(cm->err_req_ent + 8, &sqid, 2);
	memcpy(cm->err_req_ent + 10, &cid, 2);
	memcpy(cm->err_req_ent + 12, &sf, 2);
	cm->err_req_ent[14] = 0xff; /* parameter error location: none */
	cm->err_req_ent[15] = 0xff;
	memcpy(cm->err_req_ent + 24, &nsid, 4);
	cm->err_req_info = info;
	__atomic_store_n(&cm->err_req, 1, __ATOMIC_RELEASE);
	while (__atomic_load_n(&cm->err_req, __ATOMIC_ACQUIRE) && cm->run)
		sched_yield();
}

/* The controller fails (CSTS.CFS) at the next step, from any thread. */
static inline void nvme_cmodel_fatal(struct nvme_cmodel *cm)
{
	__atomic_store_n(&cm->cfs_req, 1, __ATOMIC_RELEASE);
	while (__atomic_load_n(&cm->cfs_req, __ATOMIC_ACQUIRE) && cm->run)
		sched_yield();
}

/* A function level reset at the next step (every register and queue as after power-on; a
 * no_disable hang ends), from any thread. */
static inline void nvme_cmodel_flr(struct nvme_cmodel *cm)
{
	__atomic_store_n(&cm->flr_req, 1, __ATOMIC_RELEASE);
	while (__atomic_load_n(&cm->flr_req, __ATOMIC_ACQUIRE) && cm->run)
		sched_yield();
}

/*
 * Serve the registers from `regs` (`size` bytes, at least NVME_CMODEL_REGS, 4-byte aligned;
 * for example a BAR0 file the driver maps too) instead of the model's own: what the model's
 * registers hold now is copied there. The memory stays the caller's. Before start.
 */
static inline void nvme_cmodel_use_regs(struct nvme_cmodel *cm, void *regs, size_t size)
{
	memcpy(regs, cm->regs, cm->regs_size < size ? cm->regs_size : size);
	if (!cm->regs_ext)
		free(cm->regs);
	cm->regs = (uint32_t *)regs;
	cm->regs_size = size;
	cm->regs_ext = true;
}

/* Get Log Page: error (the entries of nvme_cmodel_error(), newest first; else one empty entry),
 * SMART, firmware slot (slot 1 active, its revision fw_rev), Changed Namespace List (cleared by
 * the read), effects (when LPA bit 1). RAE clear unmasks the event type of the page. */
static inline uint16_t nvme_cmodel_get_log_(struct nvme_cmodel *cm, struct nvme_model *m,
					    struct nvme_model_pend *p,
					    const struct upcie_nvme_sqe *sqe)
{
	uint8_t buf[4096];
	uint32_t lid = sqe->cdw10 & 0xff, rae = (sqe->cdw10 >> 15) & 1;
	uint64_t len = ((((uint64_t)sqe->cdw11 & 0xffff) << 16 | (sqe->cdw10 >> 16)) + 1) * 4;
	uint16_t st;

	cm->n_get_log++;
	cm->last_log_lid = lid;
	cm->last_log_rae = rae;
	if (len > sizeof(buf) || sqe->cdw12 || sqe->cdw13)
		return UPCIE_NVME_SC_INVALID_FIELD;
	memset(buf, 0, sizeof(buf));
	switch (lid) {
	case UPCIE_NVME_LOG_ERROR:
		memcpy(buf, cm->err_log, (size_t)cm->nerr_log * 64);
		break;
	case UPCIE_NVME_LOG_FW_SLOT:
		buf[0] = 1; /* AFI: slot 1 active */
		memcpy(buf + 8, cm->fw_rev, strnlen(cm->fw_rev, sizeof(cm->fw_rev)));
		break;
	case UPCIE_NVME_LOG_SMART: {
		uint16_t t = cm->temp_k ? cm->temp_k : 300;

		buf[0] = cm->smart_cw;
		buf[1] = (uint8_t)t;
		buf[2] = (uint8_t)(t >> 8);
		break;
	}
	case UPCIE_NVME_LOG_CHANGED_NS:
		memcpy(buf, cm->changed_ns, cm->nchanged_ns * 4);
		if (!rae)
			cm->nchanged_ns = 0;
		break;
	case UPCIE_NVME_LOG_CMD_EFFECTS:
		if (!(cm->lpa & 2))
			return UPCIE_NVME_SC_INVALID_LOG_PAGE;
		memcpy(buf, cm->effects, sizeof(cm->effects));
		break;
	default:
		return UPCIE_NVME_SC_INVALID_LOG_PAGE;
	}
	st = nvme_cmodel_out_(cm, m, p, sqe, buf, len);
	if (!st && !rae)
		cm->ev_masked &=
		    ~(1u << (lid == UPCIE_NVME_LOG_ERROR   ? UPCIE_NVME_AE_TYPE_ERROR
			     : lid == UPCIE_NVME_LOG_SMART ? UPCIE_NVME_AE_TYPE_SMART
							   : UPCIE_NVME_AE_TYPE_NOTICE));
	return st;
}

static inline uint16_t nvme_cmodel_admin_exec_(void *ctx, struct nvme_model *m,
					       const struct upcie_nvme_sqe *sqe,
					       struct nvme_model_pend *p)
{
	struct nvme_cmodel *cm = (struct nvme_cmodel *)ctx;
	uint16_t qid = (uint16_t)sqe->cdw10;

	switch (sqe->opc) {
	case UPCIE_NVME_ADMIN_IDENTIFY:
		return nvme_cmodel_identify_(cm, m, p, sqe);
	case UPCIE_NVME_ADMIN_GET_LOG_PAGE:
		return nvme_cmodel_get_log_(cm, m, p, sqe);
	case UPCIE_NVME_ADMIN_FORMAT_NVM: {
		struct nvme_nsm_ns *n = cm->nsm ? nvme_nsm_find(cm->nsm, sqe->nsid) : NULL;

		cm->n_format++;
		if (!n)
			return UPCIE_NVME_SC_INVALID_NS;
		return nvme_nsm_format(n, sqe->cdw10 & 0xf);
	}
	case UPCIE_NVME_ADMIN_SET_FEATURES:
		if ((sqe->cdw10 & 0xff) == UPCIE_NVME_FEAT_ASYNC_EVENT) {
			cm->aec = sqe->cdw11;
			cm->n_aec++;
			return 0;
		}
		if ((sqe->cdw10 & 0xff) == UPCIE_NVME_FEAT_TEMP_THRESH) {
			/* composite, over-temperature threshold: crossing it is a SMART event */
			cm->tmpth = (uint16_t)sqe->cdw11;
			if (cm->tmpth && (cm->temp_k ? cm->temp_k : 300) > cm->tmpth &&
			    !(cm->smart_cw & 2)) {
				cm->smart_cw |= 2;
				if (cm->aec & 2)
					nvme_cmodel_raise_(cm, UPCIE_NVME_AE_TYPE_SMART |
								   (1u << 8) |
								   (UPCIE_NVME_LOG_SMART << 16));
			}
			return 0;
		}
		if ((sqe->cdw10 & 0xff) == UPCIE_NVME_FEAT_HOST_BEHAVIOR) {
			uint64_t contig;
			const uint8_t *d = nvme_model_iomap_find(cm->iomap, sqe->prp1, &contig);

			if (!d || contig < 1)
				return UPCIE_NVME_SC_DATA_XFER_ERROR;
			cm->n_hbs++;
			cm->hbs_acre = d[0];
			return 0;
		}
		if ((sqe->cdw10 & 0xff) != UPCIE_NVME_FEAT_NUM_QUEUES)
			return UPCIE_NVME_SC_INVALID_FIELD;
		cm->n_set_queues++;
		if (cm->fail_set_queues)
			return cm->fail_set_queues;
		p->dw0 = (cm->nqueues - 1) | ((cm->nqueues - 1) << 16);
		return 0;
	case UPCIE_NVME_ADMIN_CREATE_CQ:
		cm->n_create_cq++;
		cm->last_create_cq_cdw11 = sqe->cdw11;
		if (!qid || qid > cm->nqueues || qid > NVME_CMODEL_MAXQ || cm->q[qid].cq)
			return UPCIE_NVME_SC_QID_INVALID;
		if ((sqe->cdw10 >> 16) + 1 > 2048)
			return UPCIE_NVME_SC_QUEUE_SIZE;
		cm->q[qid].cq = true;
		cm->q[qid].cq_iova = sqe->prp1;
		cm->q[qid].cq_depth = (sqe->cdw10 >> 16) + 1;
		cm->q[qid].ien = (sqe->cdw11 >> 1) & 1;
		cm->q[qid].iv = (uint16_t)(sqe->cdw11 >> 16);
		cm->cq_ien_iv = ((uint32_t)cm->q[qid].ien << 16) | cm->q[qid].iv;
		return 0;
	case UPCIE_NVME_ADMIN_CREATE_SQ:
		return nvme_cmodel_create_sq_(cm, sqe);
	case UPCIE_NVME_ADMIN_DELETE_SQ:
		cm->n_delete_sq++;
		if (cm->fail_delete_sq)
			return cm->fail_delete_sq;
		if (!qid || qid > NVME_CMODEL_MAXQ || !cm->q[qid].sq)
			return UPCIE_NVME_SC_QID_INVALID;
		if (cm->abort_on_sq_delete) {
			/* what it fetched ends in its CQ before the deletion completes */
			struct nvme_model *qm = &cm->q[qid].m;

			nvme_model_release_held(qm);
			for (uint32_t i = 0; i < qm->npend; i++) {
				qm->pend[i].exec = false;
				qm->pend[i].code = UPCIE_NVME_SC_ABORT_SQ_DELETED;
				qm->pend[i].dnr = false;
				qm->pend[i].due = qm->steps;
				qm->pend[i].due_ns = 0;
			}
			nvme_model_post_(qm);
		}
		nvme_model_fini(&cm->q[qid].m);
		cm->q[qid].sq = false;
		return 0;
	case UPCIE_NVME_ADMIN_DELETE_CQ:
		cm->n_delete_cq++;
		if (cm->fail_delete_cq)
			return cm->fail_delete_cq;
		if (!qid || qid > NVME_CMODEL_MAXQ || !cm->q[qid].cq)
			return UPCIE_NVME_SC_QID_INVALID;
		if (cm->q[qid].sq)
			return UPCIE_NVME_SC_INVALID_QUEUE_DELETE;
		cm->q[qid].cq = false;
		return 0;
	case UPCIE_NVME_ADMIN_ABORT:
		return nvme_cmodel_abort_(cm, sqe, p);
	default:
		return UPCIE_NVME_SC_INVALID_OPCODE;
	}
}

/* Asynchronous Event Requests are held (an event never comes); so is hold_admin_opc. */
static inline void nvme_cmodel_admin_inject_(void *ctx, const struct upcie_nvme_sqe *sqe,
					     struct nvme_model_action *act)
{
	struct nvme_cmodel *cm = (struct nvme_cmodel *)ctx;

	if (sqe->opc == UPCIE_NVME_ADMIN_ABORT) {
		cm->abort_last_ns = upcie_time_ns();
		if (!cm->n_abort_fetched++)
			cm->abort_first_ns = cm->abort_last_ns;
	}
	if (sqe->opc == UPCIE_NVME_ADMIN_ASYNC_EVENT)
		cm->n_aer_fetched++;
	if (sqe->opc == UPCIE_NVME_ADMIN_ASYNC_EVENT ||
	    (cm->hold_admin_opc && sqe->opc == cm->hold_admin_opc))
		act->hold = true;
	if (cm->delay_admin_opc && sqe->opc == cm->delay_admin_opc)
		act->due_ns = upcie_time_ns() + (uint64_t)cm->delay_admin_ms * 1000000;
}

/* Forget every queue (controller reset); with late_after_reset, keep the held I/O commands. */
static inline void nvme_cmodel_reset_(struct nvme_cmodel *cm)
{
	if (cm->admin_live)
		nvme_model_fini(&cm->admin);
	cm->admin_live = false;
	for (uint32_t i = 1; i <= NVME_CMODEL_MAXQ; i++) {
		struct nvme_cmodel_q *q = &cm->q[i];
		struct nvme_model_pend keep[NVME_CMODEL_MAXHLD];
		uint32_t nkeep = 0;

		if (q->sq && cm->late_after_reset)
			for (uint32_t k = 0; k < q->m.nheld && nkeep < NVME_CMODEL_MAXHLD; k++) {
				keep[nkeep] = q->m.held[k];
				keep[nkeep].exec = false; /* the completion only: no data */
				keep[nkeep].code = 0;
				nkeep++;
			}
		if (q->sq)
			nvme_model_fini(&q->m);
		memset(q, 0, sizeof(*q));
		memcpy(q->sticky, keep, nkeep * sizeof(keep[0]));
		q->nsticky = nkeep;
	}
}

/* Complete every held command at the next step (late completions). From any thread. */
static inline void nvme_cmodel_release(struct nvme_cmodel *cm)
{
	__atomic_store_n(&cm->release_req, 1, __ATOMIC_RELEASE);
}

static inline void nvme_cmodel_enable_(struct nvme_cmodel *cm)
{
	uint32_t aqa = nvme_cmodel_rd(cm, UPCIE_NVME_REG_AQA);
	uint64_t asq = nvme_cmodel_rd64(cm, UPCIE_NVME_REG_ASQ);
	uint64_t acq = nvme_cmodel_rd64(cm, UPCIE_NVME_REG_ACQ), contig;
	uint32_t sqd = (aqa & 0xfff) + 1, cqd = ((aqa >> 16) & 0xfff) + 1;
	uint8_t *sq = nvme_model_iomap_find(cm->iomap, asq, &contig);
	uint8_t *cq = nvme_model_iomap_find(cm->iomap, acq, &contig);

	cm->last_aqa = aqa;
	cm->last_asq = asq;
	cm->last_acq = acq;
	cm->rdy = true;
	cm->n_enable++;
	if (!sq || !cq) {
		/* ready, but every admin command it fetched would fault: none is rung here */
		nvme_cmodel_csts_(cm, 1);
		return;
	}
	nvme_model_init(&cm->admin, sq, sqd, cq, cqd, 0, NULL, 0, 512, nvme_cmodel_page_shift(cm),
			cm->iomap);
	cm->admin.dma = cm->dma;
	cm->admin.dma_ctx = cm->dma_ctx;
	cm->admin.sqdbp = &cm->regs[nvme_cmodel_db_off(cm, 0, 0) / 4];
	cm->admin.cqdbp = &cm->regs[nvme_cmodel_db_off(cm, 0, 1) / 4];
	*cm->admin.sqdbp = *cm->admin.cqdbp = 0;
	cm->admin.exec = nvme_cmodel_admin_exec_;
	cm->admin.exec_ctx = cm;
	cm->admin.inject = nvme_cmodel_admin_inject_;
	cm->admin.inject_ctx = cm;
	cm->admin_live = true;
	nvme_cmodel_csts_(cm, 1); /* ready last: the queue is set up */
}

/* CSTS.PP set: no command is processed until fw_req_ms from now. */
static inline void nvme_cmodel_pp_set_(struct nvme_cmodel *cm)
{
	cm->fw_phase = 2;
	cm->pp_set_ns = upcie_time_ns();
	cm->pp_until_ns = cm->pp_set_ns + (uint64_t)cm->fw_req_ms * 1000000;
	nvme_cmodel_csts_(cm, (nvme_cmodel_rd(cm, UPCIE_NVME_REG_CSTS) | UPCIE_NVME_CSTS_PP) &
				  ~UPCIE_NVME_CSTS_NSSRO);
}

/* The Firmware Activation Starting notice is not yet posted in the admin CQ. */
static inline bool nvme_cmodel_fw_notice_waits_(const struct nvme_cmodel *cm)
{
	for (uint32_t i = 0; i < cm->nev_pend; i++)
		if ((cm->ev_pend[i] & 7u) == UPCIE_NVME_AE_TYPE_NOTICE &&
		    ((cm->ev_pend[i] >> 8) & 0xffu) == UPCIE_NVME_AE_NOTICE_FW_ACTIVATE)
			return true;
	return cm->admin_live && cm->admin.npend;
}

static inline void nvme_cmodel_step(struct nvme_cmodel *cm)
{
	uint32_t cc, csts;

	if (cm->vanish || (cm->vanish_after_io && cm->io_fetched >= cm->vanish_after_io)) {
		/* surprise removal: reads return all ones, nothing is processed any more */
		cm->vanish = true;
		memset(cm->regs, 0xff, cm->regs_size);
		return;
	}
	/* NVM subsystem reset: every queue gone, CC cleared, CSTS.NSSRO set */
	if (nvme_cmodel_rd(cm, UPCIE_NVME_REG_NSSR) == UPCIE_NVME_NSSR_RESET &&
	    upcie_nvme_cap_nssrs(nvme_cmodel_rd64(cm, UPCIE_NVME_REG_CAP))) {
		nvme_cmodel_wr(cm, UPCIE_NVME_REG_NSSR, 0);
		cm->n_nssr++;
		nvme_cmodel_reset_(cm);
		cm->rdy = false;
		cm->cfs = false;
		cm->en_at_ns = 0;
		cm->nssro = true;
		nvme_cmodel_wr(cm, UPCIE_NVME_REG_CC, 0);
		nvme_cmodel_csts_(cm, 0);
	}

	/* function level reset: the controller and its registers as after power-on */
	if (__atomic_exchange_n(&cm->flr_req, 0, __ATOMIC_ACQ_REL)) {
		cm->n_flr++;
		nvme_cmodel_reset_(cm);
		cm->rdy = false;
		cm->cfs = false;
		cm->en_at_ns = 0;
		cm->no_disable = false;
		cm->fw_phase = 0;
		nvme_cmodel_wr(cm, UPCIE_NVME_REG_CC, 0);
		nvme_cmodel_wr(cm, UPCIE_NVME_REG_AQA, 0);
		for (uint32_t o = 0; o < 8; o += 4) {
			nvme_cmodel_wr(cm, UPCIE_NVME_REG_ASQ + o, 0);
			nvme_cmodel_wr(cm, UPCIE_NVME_REG_ACQ + o, 0);
		}
		nvme_cmodel_csts_(cm, 0);
		return;
	}

	cc = nvme_cmodel_rd(cm, UPCIE_NVME_REG_CC);
	csts = nvme_cmodel_rd(cm, UPCIE_NVME_REG_CSTS);
	if (!(cc & 1) && cm->no_disable && cm->rdy && !cm->cfs) {
		/* hung: the disable is not seen, CSTS.RDY stays 1 and the queues go on */
		cm->disable_ignored = true;
	} else if (!(cc & 1)) {
		if (cm->en_at_ns && !cm->rdy && !(csts & 2))
			cm->n_en_cleared_enabling++;
		if (csts & 1 || cm->rdy || cm->cfs) {
			nvme_cmodel_reset_(cm);
			cm->rdy = false;
			cm->cfs = false;
			cm->n_disable++;
		}
		cm->en_at_ns = 0;
		cm->fw_phase = 0;
		if (csts)
			nvme_cmodel_csts_(cm, 0);
		return;
	}
	if (cm->cfs)
		return; /* fatal: nothing until CC.EN = 0 */
	if (__atomic_exchange_n(&cm->cfs_req, 0, __ATOMIC_ACQ_REL)) {
		cm->cfs = true;
		nvme_cmodel_wr(cm, UPCIE_NVME_REG_CSTS, csts | 2);
		return;
	}
	if (cm->cfs_after_io && cm->io_fetched >= cm->cfs_after_io) {
		cm->cfs = true;
		nvme_cmodel_wr(cm, UPCIE_NVME_REG_CSTS, csts | 2);
		return;
	}
	if (!cm->rdy) {
		if (csts & 2)
			return; /* fatal */
		cm->last_cc = cc;
		if (cm->cfs_on_enable) {
			nvme_cmodel_csts_(cm, 2);
			return;
		}
		if (!cm->en_at_ns) {
			cm->en_at_ns = upcie_time_ns();
			nvme_cmodel_en_snap_(cm);
		} else if (nvme_cmodel_rd(cm, UPCIE_NVME_REG_AQA) != cm->en_aqa ||
			   nvme_cmodel_rd64(cm, UPCIE_NVME_REG_ASQ) != cm->en_asq ||
			   nvme_cmodel_rd64(cm, UPCIE_NVME_REG_ACQ) != cm->en_acq) {
			/* admin queue reprogrammed while enabling: the host cleared CC.EN and set
			 * it again faster than this model steps (or wrote them while enabled) */
			cm->n_en_cleared_enabling++;
			cm->en_at_ns = upcie_time_ns();
			nvme_cmodel_en_snap_(cm);
		}
		if (cm->never_ready ||
		    upcie_time_ns() - cm->en_at_ns < (uint64_t)cm->ready_delay_ms * 1000000)
			return;
		nvme_cmodel_enable_(cm);
		return;
	}
	if (((cc >> 14) & 3) && ((csts >> 2) & 3) != UPCIE_NVME_CSTS_SHST_COMPLETE &&
	    !cm->hold_shutdown) {
		if (!cm->n_shutdown)
			cm->flushes_at_shutdown = cm->n_flush;
		cm->n_shutdown++;
		nvme_cmodel_csts_(cm, (csts & ~(3u << 2) & ~UPCIE_NVME_CSTS_NSSRO) |
					  (UPCIE_NVME_CSTS_SHST_COMPLETE << 2));
	}
	if (__atomic_exchange_n(&cm->release_req, 0, __ATOMIC_ACQ_REL)) {
		if (cm->admin_live)
			nvme_model_release_held(&cm->admin);
		for (uint32_t i = 1; i <= NVME_CMODEL_MAXQ; i++)
			if (cm->q[i].sq)
				nvme_model_release_held(&cm->q[i].m);
	}
	if (__atomic_load_n(&cm->ev_req, __ATOMIC_ACQUIRE)) {
		nvme_cmodel_raise_(cm, cm->ev_req_dw0);
		__atomic_store_n(&cm->ev_req, 0, __ATOMIC_RELEASE);
	}
	if (__atomic_load_n(&cm->detach_req, __ATOMIC_ACQUIRE)) {
		nvme_cmodel_ns_change_(cm, cm->detach_req, 0, 0);
		__atomic_store_n(&cm->detach_req, 0, __ATOMIC_RELEASE);
	}
	if (__atomic_load_n(&cm->attach_req, __ATOMIC_ACQUIRE)) {
		nvme_cmodel_ns_change_(cm, cm->attach_req, 1, 0);
		__atomic_store_n(&cm->attach_req, 0, __ATOMIC_RELEASE);
	}
	if (__atomic_load_n(&cm->resize_req, __ATOMIC_ACQUIRE)) {
		nvme_cmodel_ns_change_(cm, cm->resize_req, 2, cm->resize_blocks);
		__atomic_store_n(&cm->resize_req, 0, __ATOMIC_RELEASE);
	}
	if (__atomic_load_n(&cm->err_req, __ATOMIC_ACQUIRE)) {
		/* an error the controller logs: the newest entry first, and an error event */
		uint64_t count = ++cm->err_count;

		memmove(cm->err_log[1], cm->err_log[0], sizeof(cm->err_log) - 64);
		memcpy(cm->err_log[0], cm->err_req_ent, 64);
		memcpy(cm->err_log[0], &count, sizeof(count));
		if (cm->nerr_log < 8)
			cm->nerr_log++;
		nvme_cmodel_raise_(cm, UPCIE_NVME_AE_TYPE_ERROR |
					   ((uint32_t)cm->err_req_info << 8) |
					   (UPCIE_NVME_LOG_ERROR << 16));
		__atomic_store_n(&cm->err_req, 0, __ATOMIC_RELEASE);
	}
	if (__atomic_load_n(&cm->fw_req, __ATOMIC_ACQUIRE)) {
		/* Firmware Activation Starting, when enabled; the pause begins once it was posted */
		if (cm->aec & UPCIE_NVME_AEC_FW_ACTIVATE) {
			nvme_cmodel_raise_(cm, UPCIE_NVME_AE_TYPE_NOTICE |
						   (UPCIE_NVME_AE_NOTICE_FW_ACTIVATE << 8) |
						   (UPCIE_NVME_LOG_FW_SLOT << 16));
			cm->fw_phase = 1;
		} else {
			nvme_cmodel_pp_set_(cm);
		}
		__atomic_store_n(&cm->fw_req, 0, __ATOMIC_RELEASE);
	}
	if (cm->bus_master && !cm->bus_master(cm->bus_master_ctx)) {
		cm->bm_off_steps++; /* no DMA: nothing fetched, moved or posted */
		return;
	}
	if (cm->fw_phase == 2) {
		if (upcie_time_ns() < cm->pp_until_ns) {
			cm->pp_steps++; /* processing paused: no command of any queue */
			return;
		}
		memcpy(cm->fw_rev, cm->fw_req_rev, sizeof(cm->fw_rev));
		cm->fw_phase = 0;
		cm->n_fw_act++;
		cm->pp_clear_ns = upcie_time_ns();
		nvme_cmodel_csts_(cm, nvme_cmodel_rd(cm, UPCIE_NVME_REG_CSTS) &
					  ~UPCIE_NVME_CSTS_PP & ~UPCIE_NVME_CSTS_NSSRO);
	}
	if (cm->admin_live) {
		nvme_model_step(&cm->admin);
		nvme_cmodel_events_(cm);
	}
	if (cm->fw_phase == 1 && !nvme_cmodel_fw_notice_waits_(cm)) {
		nvme_cmodel_pp_set_(cm);
		return;
	}
	for (uint32_t i = 1; i <= NVME_CMODEL_MAXQ && !cm->cfs; i++)
		if (cm->q[i].sq)
			nvme_model_step(&cm->q[i].m);
}

static inline void *nvme_cmodel_thread_(void *arg)
{
	struct nvme_cmodel *cm = (struct nvme_cmodel *)arg;

	while (__atomic_load_n(&cm->run, __ATOMIC_ACQUIRE)) {
		nvme_cmodel_step(cm);
		sched_yield();
	}
	return NULL;
}

static inline int nvme_cmodel_start(struct nvme_cmodel *cm)
{
	__atomic_store_n(&cm->run, 1, __ATOMIC_RELEASE);
	return pthread_create(&cm->thread, NULL, nvme_cmodel_thread_, cm) ? -1 : 0;
}

static inline void nvme_cmodel_stop(struct nvme_cmodel *cm)
{
	__atomic_store_n(&cm->run, 0, __ATOMIC_RELEASE);
	pthread_join(cm->thread, NULL);
}

static inline void nvme_cmodel_fini(struct nvme_cmodel *cm)
{
	nvme_cmodel_reset_(cm);
	if (!cm->regs_ext)
		free(cm->regs);
	memset(cm, 0, sizeof(*cm));
}

#endif /* UPCIE_TEST_NVME_CTRL_MODEL_H */
