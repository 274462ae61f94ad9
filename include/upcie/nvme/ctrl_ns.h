/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Namespaces of an NVMe controller as the controller sees them: struct upcie_nvme_ns, the checked
 * parse of Identify Namespace, the I/O command set, revalidation, and what the controller says
 * of a zoned namespace's Zone Append limit (upcie_nvme_ns_zone_append_max()).
 *
 * The controller keeps one record per namespace ID that was opened (upcie_nvme_ns_open()): the
 * geometry last read (size, LBA format, metadata, protection, command set, zone size) and a
 * generation. Revalidation (upcie_nvme_ctrl_ns_revalidate()) reads Identify Namespace again and
 * advances the generation when anything of that changed or the namespace is no longer active. It
 * runs after every controller reset, on a Namespace Attribute Changed event, and after an admin
 * command that may change a namespace (upcie_nvme_ctrl_admin()). A namespace handle opened
 * before the change is stale from then on: every I/O call on it returns -ESTALE (-ENODEV once the
 * namespace is gone) without submitting anything, so no command ever goes out with a block
 * size, size or format the namespace no longer has; upcie_nvme_ns_open() again gives a handle
 * with the new geometry. Commands already submitted end as the controller ends them (a detached
 * namespace's with Invalid Namespace or Format), each once. The records belong to the controller
 * and go with upcie_nvme_ctrl_close(); a handle needs no closing.
 */
#ifndef UPCIE_NVME_CTRL_NS_H
#define UPCIE_NVME_CTRL_NS_H

#include <upcie/nvme/ctrl_admin.h>

struct upcie_nvme_ns {
	struct upcie_nvme_ctrl *ctrl;
	uint32_t nsid;
	uint64_t nsze;	      /* size in logical blocks */
	uint64_t ncap;	      /* capacity in logical blocks */
	uint32_t lba_bytes;   /* data bytes per logical block */
	uint32_t ms;	      /* metadata bytes per logical block */
	bool ext;	      /* metadata interleaved with the data (extended LBA) */
	uint32_t block_bytes; /* bytes per block in a data buffer: lba_bytes (+ ms when ext and
				 the metadata travels, see pract) */
	uint8_t block_shift;  /* log2(block_bytes) when a power of two, else 0 */
	uint8_t lbaf;	      /* LBA format index in use */
	uint8_t dps;	      /* end-to-end protection settings */
	uint8_t pi;	      /* protection information type 1..3 (DPS), 0: none */
	bool pract;	      /* PI is all the metadata (ms 8): the controller inserts and strips
				 it (PRACT), no metadata buffer, block_bytes = lba_bytes */
	uint8_t csi;	      /* I/O command set: UPCIE_NVME_CSI_NVM or UPCIE_NVME_CSI_ZNS */
	bool zoned;	      /* Zoned Namespace: writes only at a zone's write pointer */
	uint64_t zone_blocks; /* zoned: logical blocks per zone */
	uint32_t prinfo;      /* PRINFO bits upcie sets on Read/Write/Compare without md */
	uint8_t pif;	      /* protection information format (ELBAF: UPCIE_NVME_PIF_*) */
	uint8_t sts;	      /* storage tag bits (ELBAF STS); 0: none */
	bool slow;	      /* needs the general I/O path (metadata buffer, PI, zones) */
	/* what the controller last saw of this namespace (upcie_nvme_ns_open()); NULL: never
	   checked (filled by upcie_nvme_ns_parse() alone) */
	const struct upcie_nvme_ns_rec_ *rec;
	uint32_t gen; /* rec->gen when opened: I/O is refused once it moved on */
};

/* Largest logical block upcie accepts (LBADS 24); formats beyond are refused as absurd. */
#define UPCIE_NVME_LBA_SHIFT_MAX 24

/* An absurd Identify Namespace field: logged (an error when refused), counted in *nbad. */
UPCIE_PRINTF(4, 5)
static inline void upcie_nvme_ns_bad_(uint32_t *nbad, uint32_t nsid, bool refused, const char *fmt,
				      ...)
{
	char msg[192];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (nbad)
		(*nbad)++;
	upcie_log(refused ? UPCIE_LOG_ERROR : UPCIE_LOG_WARN,
		  "nvme: namespace %u: Identify reports %s%s", nsid, msg,
		  refused ? ": refused" : "");
}

/*
 * Fill `ns` (nsid, sizes, LBA format, metadata, protection information) from Identify
 * Namespace data `id` as the device wrote it; ctrl, csi and the zone fields are left to the
 * caller. Every field is checked before use: NLBAF above 63 is clamped, NCAP above NSZE is
 * clamped to it; an FLBAS index beyond NLBAF, an LBA size outside 512 B..16 MiB, a size whose
 * bytes overflow 64 bits, an unknown PI type or PI without room for it are refused. Each such
 * value is logged and counted in *nbad (may be NULL). Returns 0; -ENODEV for an inactive
 * namespace (NSZE 0); -EINVAL for data upcie refuses.
 */
static inline int upcie_nvme_ns_parse(struct upcie_nvme_ns *ns, const struct upcie_nvme_id_ns *id,
				      uint32_t nsid, uint32_t *nbad)
{
	struct upcie_nvme_id_ns v;
	const struct upcie_nvme_lbaf *f;
	unsigned idx;

	memset(ns, 0, sizeof(*ns));
	if (!id->nsze)
		return -ENODEV;
	v.nlbaf = id->nlbaf;
	v.flbas = id->flbas;
	if (v.nlbaf > 63) {
		upcie_nvme_ns_bad_(nbad, nsid, false, "NLBAF %u (at most 63, 64 formats); clamped",
				   v.nlbaf);
		v.nlbaf = 63;
	}
	idx = upcie_nvme_id_ns_lbaf_index(&v);
	if (idx > v.nlbaf) {
		upcie_nvme_ns_bad_(nbad, nsid, true, "LBA format %u in use beyond the %u formats",
				   idx, v.nlbaf + 1u);
		return -EINVAL;
	}
	f = &id->lbaf[idx];
	if (f->lbads < 9 || f->lbads > UPCIE_NVME_LBA_SHIFT_MAX) {
		upcie_nvme_ns_bad_(nbad, nsid, true,
				   "LBA format %u with LBADS %u (512 B..16 MiB usable)", idx,
				   f->lbads);
		return -EINVAL;
	}
	ns->nsid = nsid;
	ns->lbaf = (uint8_t)idx;
	ns->lba_bytes = UINT32_C(1) << f->lbads;
	ns->ms = f->ms;
	ns->ext = ns->ms && upcie_nvme_id_ns_extended_lba(&v);
	ns->nsze = id->nsze;
	ns->ncap = id->ncap;
	if (ns->ncap > ns->nsze) {
		upcie_nvme_ns_bad_(nbad, nsid, false,
				   "NCAP %" PRIu64 " above NSZE %" PRIu64 "; clamped", ns->ncap,
				   ns->nsze);
		ns->ncap = ns->nsze;
	}
	if (ns->nsze > UINT64_MAX / (ns->lba_bytes + ns->ms)) {
		upcie_nvme_ns_bad_(nbad, nsid, true,
				   "NSZE %" PRIu64 " of %u-byte blocks: beyond 2^64 bytes",
				   ns->nsze, ns->lba_bytes + ns->ms);
		memset(ns, 0, sizeof(*ns));
		return -EINVAL;
	}
	ns->dps = id->dps;
	ns->pi = id->dps & UPCIE_NVME_DPS_PIT_MASK;
	if (ns->pi > UPCIE_NVME_DPS_PIT_3 || (ns->pi && ns->ms < UPCIE_NVME_PI_BYTES)) {
		upcie_nvme_ns_bad_(nbad, nsid, true, "protection type %u with %u bytes of metadata",
				   ns->pi, ns->ms);
		memset(ns, 0, sizeof(*ns));
		return -EINVAL;
	}
	if (ns->pi && ns->ms == UPCIE_NVME_PI_BYTES) {
		/* the metadata is the PI alone: let the controller make and check it */
		ns->pract = true;
		ns->prinfo = UPCIE_NVME_RW_PRACT | UPCIE_NVME_RW_PRCHK_GUARD;
		if (ns->pi != UPCIE_NVME_DPS_PIT_3)
			ns->prinfo |= UPCIE_NVME_RW_PRCHK_REF;
	}
	ns->block_bytes = ns->lba_bytes + (ns->ext && !ns->pract ? ns->ms : 0);
	ns->block_shift = upcie_is_pow2(ns->block_bytes) ? (uint8_t)upcie_log2(ns->block_bytes) : 0;
	ns->csi = UPCIE_NVME_CSI_NVM;
	ns->slow = (ns->ms && !ns->ext) || ns->pi;
	return 0;
}

/*
 * The I/O command set of namespace `ns` (and its zone size when zoned). With CC.CSS = NVM only
 * NVM namespaces are active, so there is nothing to ask; otherwise the Namespace
 * Identification Descriptor list says (CNS 03h), and a zoned namespace's I/O command set
 * specific Identify (CNS 05h) gives the zone size of the LBA format in use.
 */
static inline int upcie_nvme_ns_csi_(struct upcie_nvme_ns *ns, struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_id_ns_zns *z;
	uint8_t csi = UPCIE_NVME_CSI_NVM;
	int err;

	if (upcie_nvme_cc_css(c->cc) != UPCIE_NVME_CC_CSS_IOCS)
		return 0;
	z = (struct upcie_nvme_id_ns_zns *)malloc(sizeof(*z));
	if (!z)
		return UPCIE_FAIL(-ENOMEM, "nvme: out of memory");
	err = upcie_nvme_ctrl_identify(c, UPCIE_NVME_CNS_NS_DESC_LIST, ns->nsid, z);
	if (!err) {
		err = upcie_nvme_ns_desc_csi(z, sizeof(*z), &csi);
		if (err == -EPROTO) {
			pthread_mutex_lock(&c->lock);
			upcie_nvme_ns_bad_(&c->nbad_id, ns->nsid, true,
					   "a malformed Namespace Identification Descriptor list");
			pthread_mutex_unlock(&c->lock);
			err = UPCIE_FAIL(-EPROTO,
					 "nvme %s: namespace %u: its I/O command set is unknown",
					 c->name, ns->nsid);
			goto out;
		}
		err = 0; /* -ENOENT: no CSI descriptor, an NVM namespace */
	} else if (err == -EIO) {
		err = 0; /* CNS 03h not supported (before NVMe 1.3): NVM */
	}
	if (err)
		goto out;
	ns->csi = csi;
	if (csi == UPCIE_NVME_CSI_NVM)
		goto out;
	if (csi != UPCIE_NVME_CSI_ZNS) {
		err = UPCIE_FAIL(-EOPNOTSUPP,
				 "nvme %s: namespace %u uses I/O command set %u, which upcie does "
				 "not drive",
				 c->name, ns->nsid, csi);
		goto out;
	}
	err =
	    upcie_nvme_ctrl_identify_csi(c, UPCIE_NVME_CNS_CS_NS, ns->nsid, UPCIE_NVME_CSI_ZNS, z);
	if (err) {
		err = UPCIE_FAIL(err, "nvme %s: namespace %u: zoned Identify Namespace failed",
				 c->name, ns->nsid);
		goto out;
	}
	ns->zone_blocks = z->lbafe[ns->lbaf].zsze;
	if (!ns->zone_blocks || ns->zone_blocks > ns->nsze) {
		pthread_mutex_lock(&c->lock);
		upcie_nvme_ns_bad_(&c->nbad_id, ns->nsid, true,
				   "a zone size of %" PRIu64 " blocks (namespace: %" PRIu64 ")",
				   ns->zone_blocks, ns->nsze);
		pthread_mutex_unlock(&c->lock);
		err = -EINVAL;
		goto out;
	}
	ns->zoned = true;
	ns->slow = true;
out:
	free(z);
	return err;
}

/*
 * The extended LBA format of an NVM namespace (CNS 05h, CSI 00h, where CTRATT.ELBAS says the
 * controller has it): the protection information format and the storage tag size, which decide
 * what the PI fields of a command mean. Without it: 16-bit guard, no storage tag (NVMe 1.x).
 * A reserved PIF is counted as absurd and kept (protected I/O is then refused).
 */
static inline int upcie_nvme_ns_elbaf_(struct upcie_nvme_ns *ns, struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_id_ns_nvm *id;
	uint32_t e;
	int err;

	if (ns->csi != UPCIE_NVME_CSI_NVM || !(c->id.ctratt & UPCIE_NVME_CTRATT_ELBAS) ||
	    upcie_nvme_cc_css(c->cc) != UPCIE_NVME_CC_CSS_IOCS)
		return 0;
	id = (struct upcie_nvme_id_ns_nvm *)malloc(sizeof(*id));
	if (!id)
		return UPCIE_FAIL(-ENOMEM, "nvme: out of memory");
	err =
	    upcie_nvme_ctrl_identify_csi(c, UPCIE_NVME_CNS_CS_NS, ns->nsid, UPCIE_NVME_CSI_NVM, id);
	if (!err) {
		e = id->elbaf[ns->lbaf & 63];
		ns->sts = UPCIE_NVME_ELBAF_STS(e);
		ns->pif = UPCIE_NVME_ELBAF_PIF(e);
		if (ns->pif == 3) {
			pthread_mutex_lock(&c->lock);
			upcie_nvme_ns_bad_(&c->nbad_id, ns->nsid, false,
					   "a reserved protection information format (PIF 3)");
			pthread_mutex_unlock(&c->lock);
		}
	}
	free(id);
	return err == -EIO ? 0 : err; /* refused: taken as NVMe 1.x formats */
}

/*
 * Whether the controller would read PI fields of a command on `ns` (PRACT or PRCHK in `flags`)
 * that upcie cannot fill: it builds the 16-bit guard format with the reference tag in CDW14,
 * which a 32/64-bit guard format or a storage tag lay out otherwise. 0 or -EOPNOTSUPP (logged).
 */
static inline int upcie_nvme_ns_pi_fmt_check_(const struct upcie_nvme_ns *ns, uint32_t flags)
{
	if (!ns->pi || (!ns->pif && !ns->sts) ||
	    !(flags & (UPCIE_NVME_RW_PRACT | UPCIE_NVME_RW_PRCHK_GUARD | UPCIE_NVME_RW_PRCHK_APP |
		       UPCIE_NVME_RW_PRCHK_REF)))
		return 0;
	return UPCIE_FAIL(-EOPNOTSUPP,
			  "nvme: namespace %u: protection information with a %u-bit guard and %u "
			  "storage tag bits: upcie fills the PI fields of the 16-bit guard format "
			  "only; protected I/O refused (send it without PRACT/PRCHK, the PI in the "
			  "metadata buffer)",
			  ns->nsid,
			  ns->pif == UPCIE_NVME_PIF_16 ? 16u
			  : ns->pif == 1	       ? 32u
						       : 64u,
			  ns->sts);
}

/* The record of `nsid` (lock held), created when absent. NULL: out of memory. */
static inline struct upcie_nvme_ns_rec_ *upcie_nvme_ns_rec_get_locked_(struct upcie_nvme_ctrl *c,
								       uint32_t nsid)
{
	struct upcie_nvme_ns_rec_ *r, **v;

	for (uint32_t i = 0; i < c->nnsrec; i++)
		if (c->nsrec[i]->nsid == nsid)
			return c->nsrec[i];
	if (c->nnsrec == c->nsrec_cap) {
		uint32_t cap = c->nsrec_cap ? 2 * c->nsrec_cap : 8;

		v = (struct upcie_nvme_ns_rec_ **)realloc(c->nsrec, cap * sizeof(*v));
		if (!v)
			return NULL;
		c->nsrec = v;
		c->nsrec_cap = cap;
	}
	r = (struct upcie_nvme_ns_rec_ *)calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->nsid = nsid;
	r->gone = true; /* no geometry yet: the first look sets it */
	c->nsrec[c->nnsrec++] = r;
	return r;
}

/* Whether `ns` has the geometry `r` holds. */
static inline bool upcie_nvme_ns_rec_same_(const struct upcie_nvme_ns_rec_ *r,
					   const struct upcie_nvme_ns *ns)
{
	return !r->gone && r->nsze == ns->nsze && r->lba_bytes == ns->lba_bytes &&
	       r->ms == ns->ms && r->lbaf == ns->lbaf && r->dps == ns->dps && r->csi == ns->csi &&
	       r->ext == ns->ext && r->zone_blocks == ns->zone_blocks && r->pif == ns->pif &&
	       r->sts == ns->sts;
}

/* Take what `ns` says (NULL: gone) into `r`, advancing its generation when that differs. Lock
 * held. Returns true when it differed. */
static inline bool upcie_nvme_ns_rec_take_locked_(struct upcie_nvme_ns_rec_ *r,
						  const struct upcie_nvme_ns *ns)
{
	if (ns ? upcie_nvme_ns_rec_same_(r, ns) : r->gone)
		return false;
	r->gone = !ns;
	if (ns) {
		r->nsze = ns->nsze;
		r->lba_bytes = ns->lba_bytes;
		r->ms = ns->ms;
		r->lbaf = ns->lbaf;
		r->dps = ns->dps;
		r->csi = ns->csi;
		r->ext = ns->ext;
		r->zone_blocks = ns->zone_blocks;
		r->pif = ns->pif;
		r->sts = ns->sts;
	}
	__atomic_store_n(&r->gen, r->gen + 1, __ATOMIC_RELEASE);
	return true;
}

/*
 * Identify namespace `nsid` of `c` into `ns`: sizes and LBA format (upcie_nvme_ns_parse()),
 * then its I/O command set. Not registered. Returns as upcie_nvme_ns_open().
 */
static inline int upcie_nvme_ns_read_(struct upcie_nvme_ns *ns, struct upcie_nvme_ctrl *c,
				      uint32_t nsid)
{
	struct upcie_nvme_id_ns *id;
	uint32_t nbad = 0;
	int err;

	memset(ns, 0, sizeof(*ns));
	id = (struct upcie_nvme_id_ns *)malloc(sizeof(*id));
	if (!id)
		return UPCIE_FAIL(-ENOMEM, "nvme: out of memory");
	err = upcie_nvme_ctrl_identify(c, UPCIE_NVME_CNS_NS, nsid, id);
	if (err)
		goto out;
	err = upcie_nvme_ns_parse(ns, id, nsid, &nbad);
	if (nbad) {
		pthread_mutex_lock(&c->lock);
		c->nbad_id += nbad;
		pthread_mutex_unlock(&c->lock);
	}
	if (err == -ENODEV)
		err = UPCIE_FAIL(-ENODEV, "nvme %s: namespace %u is not active", c->name, nsid);
	else if (err)
		err = UPCIE_FAIL(err, "nvme %s: namespace %u: unusable Identify Namespace data",
				 c->name, nsid);
	if (err)
		goto out;
	ns->ctrl = c;
	err = upcie_nvme_ns_csi_(ns, c);
	if (!err)
		err = upcie_nvme_ns_elbaf_(ns, c);
out:
	free(id);
	if (err)
		memset(ns, 0, sizeof(*ns));
	return err;
}

/*
 * Re-read Identify Namespace of namespace `nsid` (UPCIE_NVME_NSID_ALL: of every namespace
 * opened on `c`) and compare it with what the controller last saw: a namespace whose size, LBA
 * format, metadata, protection, command set or zone size changed, or that is not active any more
 * (Invalid Namespace, size 0), is marked changed, and its handles opened before refuse I/O with
 * -ESTALE (-ENODEV when gone) until it is opened again. Runs by itself after a reset, on a
 * Namespace Attribute Changed event, and after admin commands that change namespaces; call it
 * after changing a namespace some other way. Returns the number of namespaces found changed
 * (>= 0), or -EINVAL, or the first error other than the namespace being gone (those records are
 * left as they were).
 */
static inline int upcie_nvme_ctrl_ns_revalidate(struct upcie_nvme_ctrl *c, uint32_t nsid)
{
	struct upcie_nvme_ns ns;
	uint32_t n, changed = 0;
	int first = 0;

	if (!c || !c->lock_live)
		return UPCIE_FAIL(-EINVAL, "nvme: revalidate: controller not open");
	pthread_mutex_lock(&c->lock);
	n = c->nnsrec;
	pthread_mutex_unlock(&c->lock);
	for (uint32_t i = 0; i < n; i++) {
		struct upcie_nvme_ns_rec_ *r;
		uint32_t id;
		bool gone, diff;
		int err;

		pthread_mutex_lock(&c->lock);
		r = c->nsrec[i];
		id = r->nsid;
		pthread_mutex_unlock(&c->lock);
		if (nsid != UPCIE_NVME_NSID_ALL && id != nsid)
			continue;
		err = upcie_nvme_ns_read_(&ns, c, id);
		/* not active, Invalid Namespace (or Format) in Identify: the namespace went */
		gone = err == -ENODEV || err == -EIO;
		if (err && !gone) {
			if (!first)
				first = err;
			continue;
		}
		pthread_mutex_lock(&c->lock);
		diff = upcie_nvme_ns_rec_take_locked_(r, gone ? NULL : &ns);
		c->nrevalidated += diff;
		pthread_mutex_unlock(&c->lock);
		if (!diff)
			continue;
		changed++;
		if (gone)
			UPCIE_WARN("nvme %s: namespace %u is gone: its open handles refuse I/O "
				   "(-ENODEV)",
				   c->name, id);
		else
			UPCIE_WARN(
			    "nvme %s: namespace %u changed (now %" PRIu64 " blocks of %u "
			    "bytes, %u metadata, LBA format %u, PI type %u, command set "
			    "%u): handles opened before refuse I/O (-ESTALE) until re-opened",
			    c->name, id, ns.nsze, ns.lba_bytes, ns.ms, ns.lbaf, ns.pi, ns.csi);
	}
	return first ? first : (int)changed;
}

/*
 * Why I/O on `ns` may not go out, into `*err`: 0, or -ESTALE (the namespace changed since it was
 * opened: re-open it), -ENODEV (it is gone), logged. The answer goes through memory, not the
 * return value: clang before 17 restores RAX on return from a preserve_most function
 * (nvme/ctrl_ns.h's check got a stray value back), so UPCIE_COLD_CALL functions return void.
 */
UPCIE_COLD_CALL __attribute__((noinline, cold, unused)) static void
upcie_nvme_ns_stale_(const struct upcie_nvme_ns *ns, int *err)
{
	const struct upcie_nvme_ns_rec_ *r = ns->rec;

	if (__atomic_load_n(&r->gen, __ATOMIC_ACQUIRE) == ns->gen)
		*err = 0;
	else if (r->gone)
		*err = UPCIE_FAIL(-ENODEV, "nvme: namespace %u is gone: I/O refused", ns->nsid);
	else
		*err = UPCIE_FAIL(-ESTALE,
				  "nvme: namespace %u changed since it was opened (format, size or "
				  "command set): I/O refused; open it again",
				  ns->nsid);
}

/* The I/O check of every call: one load and compare when nothing changed. Handles without a
 * record pass. */
static inline int upcie_nvme_ns_check_(const struct upcie_nvme_ns *ns)
{
	int err;

	if (UPCIE_LIKELY(!ns->rec || __atomic_load_n(&ns->rec->gen, __ATOMIC_RELAXED) == ns->gen))
		return 0;
	upcie_nvme_ns_stale_(ns, &err);
	return err;
}

/* Free the namespace records (close). Lock held or the controller going away. */
static inline void upcie_nvme_ns_recs_free_(struct upcie_nvme_ctrl *c)
{
	for (uint32_t i = 0; i < c->nnsrec; i++)
		free(c->nsrec[i]);
	free(c->nsrec);
	c->nsrec = NULL;
	c->nnsrec = c->nsrec_cap = 0;
}

/*
 * The largest Zone Append zoned namespace `ns` takes, in bytes of data transfer, into *bytes:
 * the controller's Zone Append Size Limit (ZASL, zoned Identify Controller: CNS 06h, CSI 02h;
 * 2^ZASL minimum memory pages), bounded by MDTS (c->max_xfer); ZASL 0 means MDTS, and no
 * MDTS either gives UINT64_MAX. Asks the controller each time (an admin command): call it at
 * setup. Returns 0; -EINVAL for a NULL argument; -EOPNOTSUPP when `ns` is not zoned; -EIO
 * (status logged), -ENOMEM, -ESTALE / -ENODEV for a namespace that changed or went.
 */
static inline int upcie_nvme_ns_zone_append_max(const struct upcie_nvme_ns *ns, uint64_t *bytes)
{
	struct upcie_nvme_id_ctrl_zns *z;
	struct upcie_nvme_ctrl *c;
	unsigned shift;
	uint64_t max;
	int err;

	if (!ns || !ns->ctrl || !bytes)
		return UPCIE_FAIL(-EINVAL, "nvme: zone append limit: NULL argument");
	c = ns->ctrl;
	if (!ns->zoned)
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "nvme %s: namespace %u is not zoned: it has no Zone Append",
				  c->name, ns->nsid);
	err = upcie_nvme_ns_check_(ns);
	if (err)
		return err;
	z = (struct upcie_nvme_id_ctrl_zns *)malloc(sizeof(*z));
	if (!z)
		return UPCIE_FAIL(-ENOMEM, "nvme: out of memory");
	err = upcie_nvme_ctrl_identify_csi(c, UPCIE_NVME_CNS_CS_CTRL, 0, UPCIE_NVME_CSI_ZNS, z);
	if (err) {
		free(z);
		return UPCIE_FAIL(err, "nvme %s: zoned Identify Controller (ZASL) failed", c->name);
	}
	/* device data: a shift beyond 64 bits is no limit of its own, MDTS still bounds it */
	shift = upcie_nvme_cap_mpsmin_shift(c->cap) + z->zasl;
	max = z->zasl && shift < 64 ? UINT64_C(1) << shift : UINT64_MAX;
	free(z);
	*bytes = max < c->max_xfer ? max : c->max_xfer;
	return 0;
}

#endif /* UPCIE_NVME_CTRL_NS_H */
