/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The controller memory buffer (CMB) of an NVMe controller: CMBLOC/CMBSZ read and checked, the
 * CMB mapped through its BAR (upcie_nvme_ctrl_cmb_enable() on a controller from
 * upcie_nvme_ctrl_open(), upcie_nvme_ctrl_cmb_enable_at() on one from upcie_nvme_ctrl_init()),
 * CMBMSC programmed from NVMe 1.4 on, and a heap over it for CMB-resident SQs. The CMB works from
 * NVMe 1.2 on; needs a BAR the path can map (vfio region or uio resource file).
 */
#ifndef UPCIE_NVME_CTRL_CMB_H
#define UPCIE_NVME_CTRL_CMB_H

#include <upcie/nvme/ctrl_ioq.h>

/*
 * Read CMBLOC and CMBSZ (from NVMe 1.4 they read 0 until CMBMSC.CRE is set; before 1.4 they are
 * always valid and CMBMSC does not exist) and check them: a size, SQ support. *ofst gets the
 * CMB's byte offset in its BAR. Lock held.
 */
static inline int upcie_nvme_ctrl_cmb_read_(struct upcie_nvme_ctrl *c, uint64_t *ofst)
{
	struct upcie_nvme_cmb *m = &c->cmb;

	if (!upcie_nvme_cap_cmbs(c->cap))
		return UPCIE_FAIL(-EOPNOTSUPP, "nvme %s: no controller memory buffer (CAP.CMBS 0)",
				  c->name);
	upcie_nvme_ctrl_cmbmsc_write_(c, 1); /* CRE */
	m->cmbloc = upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CMBLOC);
	m->cmbsz = upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CMBSZ);
	m->size = upcie_nvme_cmbsz_bytes(m->cmbsz);
	*ofst = (uint64_t)upcie_nvme_cmbloc_ofst(m->cmbloc) * upcie_nvme_cmbsz_unit_bytes(m->cmbsz);
	if (!m->size || !upcie_nvme_cmbsz_sqs(m->cmbsz))
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "nvme %s: CMB of %" PRIu64 " bytes without SQ support (CMBSZ "
				  "0x%08x)",
				  c->name, m->size, m->cmbsz);
	return 0;
}

/* Fit the CMB into its BAR of `bar_size` bytes. */
static inline int upcie_nvme_ctrl_cmb_fit_(struct upcie_nvme_ctrl *c, uint64_t ofst,
					   size_t bar_size)
{
	struct upcie_nvme_cmb *m = &c->cmb;

	if (ofst >= bar_size || m->size > bar_size - ofst) {
		/* controllers behind a bridge may report more than the BAR holds */
		m->size = ofst < bar_size ? bar_size - ofst : 0;
		if (!m->size)
			return UPCIE_FAIL(
			    -EINVAL, "nvme %s: CMB offset 0x%" PRIx64 " beyond BAR%u (%zu bytes)",
			    c->name, ofst, upcie_nvme_cmbloc_bir(m->cmbloc), bar_size);
	}
	return 0;
}

/*
 * Program the CMB's controller address m->cba (CMBMSC.CBA with CRE and CMSE, NVMe >= 1.4;
 * before 1.4 the CMB simply sits at its BAR's address) and make the dmamem and heap over the
 * CPU view `cpu`. Lock held.
 */
static inline int upcie_nvme_ctrl_cmb_finish_(struct upcie_nvme_ctrl *c, void *cpu)
{
	struct upcie_nvme_cmb *m = &c->cmb;
	int err;

	upcie_nvme_ctrl_cmbmsc_write_(c, m->cba | 3u); /* CRE | CMSE | CBA */
	if (c->vs >= UPCIE_NVME_VS(1, 4, 0) &&
	    upcie_nvme_cmbsts_cbai(upcie_nvme_ctrl_rd32(c, UPCIE_NVME_REG_CMBSTS)))
		return UPCIE_FAIL(
		    -EIO, "nvme %s: controller refused CMB base 0x%" PRIx64 " (CMBSTS.CBAI)",
		    c->name, m->cba);
	err = upcie_dmamem_init_arith(&m->mem, cpu, m->size, m->cba);
	if (!err)
		err = upcie_heap_init(&m->heap, &m->mem);
	if (err)
		return err;
	m->mem.kind = "nvme-cmb";
	m->on = true;
	UPCIE_DBG("nvme %s: CMB %" PRIu64 " KiB in BAR%u at controller address 0x%" PRIx64
		  " (NVMe %u.%u)",
		  c->name, m->size >> 10, upcie_nvme_cmbloc_bir(m->cmbloc), m->cba,
		  upcie_nvme_vs_mjr(c->vs), upcie_nvme_vs_mnr(c->vs));
	return 0;
}

/* Undo a failed enable. Lock held. */
static inline void upcie_nvme_ctrl_cmb_undo_(struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_cmb *m = &c->cmb;

	upcie_heap_fini(&m->heap);
	upcie_dmamem_destroy(&m->mem);
	upcie_nvme_ctrl_cmbmsc_write_(c, 0);
	if (m->reserved)
		upcie_nvme_dev_addr_release(&c->dev, m->cba, m->reserved);
	if (m->claimed)
		upcie_nvme_dev_addr_unclaim(&c->dev, m->cba, m->size);
	upcie_nvme_dev_bar_unmap(&m->bar);
	memset(m, 0, sizeof(*m));
}

/*
 * Enable the controller memory buffer: read CMBLOC/CMBSZ (setting CMBMSC.CRE first from NVMe
 * 1.4 on), map its BAR, pick the controller address and give c->cmb.mem (CPU view through the
 * BAR) and c->cmb.heap. From NVMe 1.4 the address is programmed in CMBMSC (with CMSE): the BAR's
 * bus address under uio, a reserved range of the device address space, where no host memory can
 * ever be mapped, under vfio. Before 1.4 there is no CMBMSC: the CMB is where its BAR is, and
 * under vfio that range is claimed in the IOVA space (type1), or must lie outside what the IOAS
 * may map (iommufd). Needs upcie_nvme_ctrl_open() (upcie_nvme_ctrl_cmb_enable_at() otherwise).
 * Returns 0, -EOPNOTSUPP (no CAP.CMBS, or CMBSZ says no SQ support, or a pre-1.4 CMB whose
 * address the IOAS may map), -EIO (CMBSTS.CBAI: the controller refused the address), or the
 * mapping's error. Disabled by close.
 */
static inline int upcie_nvme_ctrl_cmb_enable(struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_cmb *m;
	uint64_t ofst, span;
	int err;

	if (!c || !c->lock_live || !c->dev.open)
		return UPCIE_FAIL(-EINVAL,
				  "nvme: CMB: needs a controller from upcie_nvme_ctrl_open()");
	m = &c->cmb;
	if (m->on)
		return 0;
	pthread_mutex_lock(&c->lock);
	err = upcie_nvme_ctrl_cmb_read_(c, &ofst);
	if (!err)
		err = upcie_nvme_dev_bar_map(&c->dev, upcie_nvme_cmbloc_bir(m->cmbloc), &m->bar);
	if (!err)
		err = upcie_nvme_ctrl_cmb_fit_(c, ofst, m->bar.size);
	if (err)
		goto fail;
	if (c->vs < UPCIE_NVME_VS(1, 4, 0)) {
		m->cba = m->bar.bus + ofst;
		err = upcie_nvme_dev_addr_claim(&c->dev, m->cba, m->size);
		m->claimed = !err;
	} else {
		span = UINT64_C(1) << (upcie_log2(m->size) + (upcie_is_pow2(m->size) ? 0 : 1));
		err = upcie_nvme_dev_addr_reserve(&c->dev, span, &m->cba);
		if (err == -EOPNOTSUPP) {
			m->cba = m->bar.bus + ofst;
			err = 0;
		} else if (!err) {
			m->reserved = span;
		}
	}
	if (!err)
		err = upcie_nvme_ctrl_cmb_finish_(c, (char *)m->bar.addr + ofst);
	if (err)
		goto fail;
	pthread_mutex_unlock(&c->lock);
	return 0;
fail:
	upcie_nvme_ctrl_cmb_undo_(c);
	pthread_mutex_unlock(&c->lock);
	return err;
}

/*
 * Enable the controller memory buffer of a controller brought up with upcie_nvme_ctrl_init(),
 * whose BARs the caller maps: `bar` describes the BAR CMBLOC.BIR names (read c->cmb.cmbloc
 * after a first call that fails with -EINVAL, or know it) and the controller address to use. As
 * upcie_nvme_ctrl_cmb_enable() otherwise; keeping no host memory mapped for the device at the
 * CMB's controller address is the caller's part. Returns 0, -EINVAL (another BAR, or no mapping),
 * -EOPNOTSUPP, -EIO.
 */
static inline int upcie_nvme_ctrl_cmb_enable_at(struct upcie_nvme_ctrl *c,
						const struct upcie_nvme_cmb_bar *bar)
{
	struct upcie_nvme_cmb *m;
	uint64_t ofst;
	int err;

	if (!c || !c->lock_live || !bar || !bar->addr)
		return UPCIE_FAIL(-EINVAL, "nvme: CMB: controller not open or no BAR mapping");
	m = &c->cmb;
	if (m->on)
		return 0;
	pthread_mutex_lock(&c->lock);
	err = upcie_nvme_ctrl_cmb_read_(c, &ofst);
	if (!err && upcie_nvme_cmbloc_bir(m->cmbloc) != bar->bir)
		err = UPCIE_FAIL(-EINVAL, "nvme %s: the CMB is in BAR%u, not BAR%u", c->name,
				 upcie_nvme_cmbloc_bir(m->cmbloc), bar->bir);
	if (!err)
		err = upcie_nvme_ctrl_cmb_fit_(c, ofst, bar->size);
	if (!err) {
		m->cba = c->vs >= UPCIE_NVME_VS(1, 4, 0) && bar->cba ? bar->cba : bar->bus + ofst;
		err = upcie_nvme_ctrl_cmb_finish_(c, (char *)bar->addr + ofst);
	}
	if (err) {
		uint32_t cmbloc = m->cmbloc;

		upcie_nvme_ctrl_cmb_undo_(c);
		m->cmbloc = cmbloc; /* so the caller can learn the BIR */
	}
	pthread_mutex_unlock(&c->lock);
	return err;
}

/* Undo upcie_nvme_ctrl_cmb_enable(). Queues in the CMB must be deleted first. Lock held. */
static inline void upcie_nvme_ctrl_cmb_disable_(struct upcie_nvme_ctrl *c)
{
	struct upcie_nvme_cmb *m = &c->cmb;

	if (!m->on)
		return;
	upcie_heap_fini(&m->heap);
	upcie_dmamem_destroy(&m->mem);
	if (c->state != UPCIE_NVME_CTRL_CLOSED)
		upcie_nvme_ctrl_cmbmsc_write_(c, 0);
	if (m->reserved)
		upcie_nvme_dev_addr_release(&c->dev, m->cba, m->reserved);
	if (m->claimed)
		upcie_nvme_dev_addr_unclaim(&c->dev, m->cba, m->size);
	upcie_nvme_dev_bar_unmap(&m->bar);
	memset(m, 0, sizeof(*m));
}

#endif /* UPCIE_NVME_CTRL_CMB_H */
