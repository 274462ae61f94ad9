/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * SR-IOV from the physical function's controller: the primary controller's flexible resources,
 * its secondary (virtual function) controllers, Virtualization Management, and the attachment of
 * namespaces to controllers. With these a process that owns the PF gives each virtual function a
 * controller of its own (queue and interrupt resources, online) and exactly the namespaces it
 * may reach; whoever then owns the VF (through its own IOMMU group) holds a controller whose DMA
 * the IOMMU confines to that owner's memory. pci/sriov.h creates the VFs; served/ hands them out.
 *
 * The order the specification sets and QEMU's emulation enforces:
 *   1. the primary gives up its flexible resources (UPCIE_NVME_VIRT_PRI_ALLOC with 0); this takes
 *      effect at the PF's next function-level reset, which also disables its VFs, so it comes
 *      before the VFs are enabled (upcie_nvme_ctrl_virt_release_primary() says whether the reset
 *      is needed);
 *   2. the VFs are enabled (sysfs sriov_numvfs); each secondary controller starts offline with no
 *      resources, and its VF's controller cannot be enabled (CSTS.CFS) until it is online;
 *   3. per secondary: assign queue (VQ, at least 2: admin + one I/O queue) and interrupt (VI, at
 *      least 1) resources while offline, then online (upcie_nvme_ctrl_sec_online());
 *   4. offline (upcie_nvme_ctrl_sec_offline()) stops the secondary at once: its queues are gone,
 *      it fetches and writes nothing more, its resources go back to the pool. This is the
 *      revocation a PF owner has over a VF whose owner it cannot reach.
 * Namespaces of an NVM subsystem may be attached to any of its controllers (shared namespaces);
 * upcie_nvme_ctrl_ns_attach_only() makes a controller's attached set exactly the given one.
 *
 * Needs an enabled controller that supports Virtualization Management (OACS bit 7, or opcode 1Ch
 * supported in its Commands Supported and Effects log) for the secondary functions, Namespace
 * Management (OACS bit 3, or opcode 15h in the log) for attachment; -EOPNOTSUPP otherwise.
 * Status errors are -EIO with the completion logged (the status names the reason: invalid
 * secondary controller state, number of resources, controller list). Each call is one or a few
 * admin commands under the controller's mutex (nvme/ctrl_admin.h).
 */
#ifndef UPCIE_NVME_CTRL_VIRT_H
#define UPCIE_NVME_CTRL_VIRT_H

#include <upcie/nvme/ctrl_admin.h>

#include <stdlib.h>

/*
 * -EOPNOTSUPP with a message unless the controller has OACS `bits`, or its Commands Supported and
 * Effects log says admin opcode `opc` is supported (CSUPP): QEMU 7.2's nvme
 * implements Virtualization Management and lists it there without setting OACS bit 7.
 */
static inline int upcie_nvme_ctrl_oacs_need_(struct upcie_nvme_ctrl *c, uint16_t bits,
					     const char *what)
{
	uint8_t opc =
	    bits == UPCIE_NVME_OACS_VIRT ? UPCIE_NVME_ADMIN_VIRT_MGMT : UPCIE_NVME_ADMIN_NS_ATTACH;

	if (!c || !c->lock_live)
		return UPCIE_FAIL(-EINVAL, "nvme: %s: controller not open", what);
	if ((c->id.oacs & bits) != bits && !(c->effects_read && (c->effects[opc] & 1u)))
		return UPCIE_FAIL(-EOPNOTSUPP, "nvme %s: %s: not supported (OACS 0x%04x)", c->name,
				  what, c->id.oacs);
	return 0;
}

/* Primary Controller Capabilities (CNS 14h) into *cap. */
static inline int upcie_nvme_ctrl_pri_cap(struct upcie_nvme_ctrl *c,
					  struct upcie_nvme_pri_ctrl_cap *cap)
{
	int err;

	if (!cap)
		return UPCIE_FAIL(-EINVAL, "nvme: primary capabilities: NULL argument");
	err = upcie_nvme_ctrl_oacs_need_(c, UPCIE_NVME_OACS_VIRT, "Virtualization Management");
	if (err)
		return err;
	return upcie_nvme_ctrl_identify(c, UPCIE_NVME_CNS_PRI_CTRL_CAP, 0, cap);
}

/*
 * The secondary controllers of this primary (CNS 15h, page by page) into sc[0..max): *count gets
 * how many there are. Entries a controller reports out of order or twice end the walk (logged).
 */
static inline int upcie_nvme_ctrl_sec_list(struct upcie_nvme_ctrl *c,
					   struct upcie_nvme_sec_ctrl *sc, unsigned max,
					   unsigned *count)
{
	struct upcie_nvme_sec_ctrl_list *l;
	uint32_t from = 0;
	unsigned n = 0;
	int err;

	if (!count || (max && !sc))
		return UPCIE_FAIL(-EINVAL, "nvme: secondary list: bad arguments");
	*count = 0;
	err = upcie_nvme_ctrl_oacs_need_(c, UPCIE_NVME_OACS_VIRT, "Virtualization Management");
	if (err)
		return err;
	l = (struct upcie_nvme_sec_ctrl_list *)malloc(sizeof(*l));
	if (!l)
		return UPCIE_FAIL(-ENOMEM, "nvme: out of memory");
	for (;;) {
		struct upcie_nvme_sqe sqe;
		unsigned i, got;

		upcie_nvme_cmd_identify(&sqe, UPCIE_NVME_CNS_SEC_CTRL_LIST, 0, (uint16_t)from, 0);
		err = upcie_nvme_ctrl_admin_buf(c, &sqe, l, sizeof(*l), UPCIE_NVME_XFER_FROM_DEV, 0,
						NULL);
		if (err)
			break;
		got = l->numid < 127 ? l->numid : 127;
		for (i = 0; i < got; i++) {
			if (l->sc[i].scid < from) {
				UPCIE_WARN(
				    "nvme %s: secondary controller list: CNTLID %u after %u; "
				    "the list ends there",
				    c->name, l->sc[i].scid, from);
				got = 0;
				break;
			}
			if (n < max)
				sc[n] = l->sc[i];
			n++;
			from = (uint32_t)l->sc[i].scid + 1;
		}
		if (got < 127 || from > 0xffff)
			break;
	}
	free(l);
	*count = n;
	return err;
}

/* The secondary controller of virtual function `vfn` (1-based) into *sc; -ENOENT: none. */
static inline int upcie_nvme_ctrl_sec_of_vf(struct upcie_nvme_ctrl *c, uint16_t vfn,
					    struct upcie_nvme_sec_ctrl *sc)
{
	struct upcie_nvme_sec_ctrl *all;
	unsigned n, i;
	int err;

	if (!sc || !vfn)
		return UPCIE_FAIL(-EINVAL, "nvme: secondary of VF: bad arguments");
	all = (struct upcie_nvme_sec_ctrl *)calloc(256, sizeof(*all));
	if (!all)
		return UPCIE_FAIL(-ENOMEM, "nvme: out of memory");
	err = upcie_nvme_ctrl_sec_list(c, all, 256, &n);
	if (!err) {
		err = -ENOENT;
		for (i = 0; i < n && i < 256; i++)
			if (all[i].vfn == vfn) {
				*sc = all[i];
				err = 0;
				break;
			}
		if (err)
			UPCIE_ERR("nvme %s: no secondary controller for VF %u (%u listed)", c->name,
				  vfn, n);
	}
	free(all);
	return err;
}

/*
 * One Virtualization Management command; *nrm (may be NULL) gets the completion's DW0 (the
 * resources the controller now has of that type, for assign and allocate).
 */
static inline int upcie_nvme_ctrl_virt_mgmt(struct upcie_nvme_ctrl *c, uint8_t act, uint8_t rt,
					    uint16_t cntlid, uint16_t nr, uint32_t *nrm)
{
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_cqe cqe;
	int err;

	err = upcie_nvme_ctrl_oacs_need_(c, UPCIE_NVME_OACS_VIRT, "Virtualization Management");
	if (err)
		return err;
	if (upcie_nvme_cmd_virt_mgmt(&sqe, act, rt, cntlid, nr))
		return UPCIE_FAIL(-EINVAL, "nvme: virtualization management: action %u type %u",
				  act, rt);
	memset(&cqe, 0, sizeof(cqe));
	err = upcie_nvme_ctrl_admin(c, &sqe, NULL, 0, 0, &cqe);
	if (err == -EIO)
		UPCIE_ERR(
		    "nvme %s: virtualization management (action 0x%x, %s, controller %u, %u): "
		    "%s",
		    c->name, act, rt == UPCIE_NVME_VIRT_RT_VI ? "VI" : "VQ", cntlid, nr,
		    upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)));
	if (!err && nrm)
		*nrm = cqe.dw0;
	return err;
}

/*
 * Give every flexible resource of the primary back to the pool (step 1 above). *reset_needed
 * gets whether the primary still holds some until its next function-level reset (the caller
 * resets the PF, e.g. sysfs `reset` or VFIO_DEVICE_RESET, with its VFs disabled). 0 when the
 * primary already holds none.
 */
static inline int upcie_nvme_ctrl_virt_release_primary(struct upcie_nvme_ctrl *c,
						       bool *reset_needed)
{
	struct upcie_nvme_pri_ctrl_cap *cap;
	int err;

	if (!reset_needed)
		return UPCIE_FAIL(-EINVAL, "nvme: release primary: NULL argument");
	*reset_needed = false;
	cap = (struct upcie_nvme_pri_ctrl_cap *)malloc(sizeof(*cap));
	if (!cap)
		return UPCIE_FAIL(-ENOMEM, "nvme: out of memory");
	err = upcie_nvme_ctrl_pri_cap(c, cap);
	if (!err && (cap->crt & 1u) && cap->vqrfap)
		err = upcie_nvme_ctrl_virt_mgmt(c, UPCIE_NVME_VIRT_PRI_ALLOC, UPCIE_NVME_VIRT_RT_VQ,
						cap->cntlid, 0, NULL);
	if (!err && (cap->crt & 2u) && cap->virfap)
		err = upcie_nvme_ctrl_virt_mgmt(c, UPCIE_NVME_VIRT_PRI_ALLOC, UPCIE_NVME_VIRT_RT_VI,
						cap->cntlid, 0, NULL);
	if (!err)
		*reset_needed =
		    ((cap->crt & 1u) && cap->vqrfap) || ((cap->crt & 2u) && cap->virfap);
	free(cap);
	return err;
}

/* Take secondary `cntlid` offline (step 4): it stops, its resources go back to the pool. */
static inline int upcie_nvme_ctrl_sec_offline(struct upcie_nvme_ctrl *c, uint16_t cntlid)
{
	return upcie_nvme_ctrl_virt_mgmt(c, UPCIE_NVME_VIRT_SEC_OFFLINE, UPCIE_NVME_VIRT_RT_VQ,
					 cntlid, 0, NULL);
}

/*
 * Bring secondary `cntlid` online with `nvq` queue resources (>= 2: the admin queue and nvq - 1
 * I/O queue pairs) and `nvi` interrupt resources (>= 1). A secondary that is online is taken
 * offline first (its owner loses its queues). On failure it is left offline with no resources.
 */
static inline int upcie_nvme_ctrl_sec_online(struct upcie_nvme_ctrl *c, uint16_t cntlid,
					     uint16_t nvq, uint16_t nvi)
{
	uint32_t got = 0;
	int err;

	if (nvq < 2 || nvi < 1)
		return UPCIE_FAIL(-EINVAL,
				  "nvme: secondary %u: %u queue and %u interrupt resources (at "
				  "least 2 and 1)",
				  cntlid, nvq, nvi);
	err = upcie_nvme_ctrl_sec_offline(c, cntlid);
	if (err)
		return err;
	err = upcie_nvme_ctrl_virt_mgmt(c, UPCIE_NVME_VIRT_SEC_ASSIGN, UPCIE_NVME_VIRT_RT_VQ,
					cntlid, nvq, &got);
	if (!err && got != nvq)
		err = UPCIE_FAIL(-ENOSPC, "nvme %s: secondary %u got %u of %u queue resources",
				 c->name, cntlid, got, nvq);
	if (!err)
		err = upcie_nvme_ctrl_virt_mgmt(c, UPCIE_NVME_VIRT_SEC_ASSIGN,
						UPCIE_NVME_VIRT_RT_VI, cntlid, nvi, &got);
	if (!err && got != nvi)
		err = UPCIE_FAIL(-ENOSPC, "nvme %s: secondary %u got %u of %u interrupt resources",
				 c->name, cntlid, got, nvi);
	if (!err)
		err = upcie_nvme_ctrl_virt_mgmt(c, UPCIE_NVME_VIRT_SEC_ONLINE,
						UPCIE_NVME_VIRT_RT_VQ, cntlid, 0, NULL);
	if (err)
		upcie_nvme_ctrl_sec_offline(c, cntlid);
	return err;
}

/*
 * A Controller List Identify (CNS 12h: controllers namespace `nsid` is attached to; 13h: all
 * controllers of the subsystem, nsid 0) into ids[0..max), ascending; *count gets how many.
 */
static inline int upcie_nvme_ctrl_ids(struct upcie_nvme_ctrl *c, uint8_t cns, uint32_t nsid,
				      uint16_t *ids, unsigned max, unsigned *count)
{
	struct upcie_nvme_ctrl_list *l;
	uint32_t from = 0;
	unsigned n = 0;
	int err;

	if (!count || (max && !ids) ||
	    (cns != UPCIE_NVME_CNS_NS_CTRL_LIST && cns != UPCIE_NVME_CNS_CTRL_LIST))
		return UPCIE_FAIL(-EINVAL, "nvme: controller list: bad arguments");
	*count = 0;
	err = upcie_nvme_ctrl_oacs_need_(c, UPCIE_NVME_OACS_NS_MGMT, "Namespace Management");
	if (err)
		return err;
	l = (struct upcie_nvme_ctrl_list *)malloc(sizeof(*l));
	if (!l)
		return UPCIE_FAIL(-ENOMEM, "nvme: out of memory");
	for (;;) {
		struct upcie_nvme_sqe sqe;
		unsigned i, got;

		upcie_nvme_cmd_identify(&sqe, cns, nsid, (uint16_t)from, 0);
		err = upcie_nvme_ctrl_admin_buf(c, &sqe, l, sizeof(*l), UPCIE_NVME_XFER_FROM_DEV, 0,
						NULL);
		if (err)
			break;
		got = l->numid < 2047 ? l->numid : 2047;
		for (i = 0; i < got; i++) {
			if (l->id[i] < from) {
				UPCIE_WARN("nvme %s: controller list: CNTLID %u after %u; the list "
					   "ends there",
					   c->name, l->id[i], from);
				got = 0;
				break;
			}
			if (n < max)
				ids[n] = l->id[i];
			n++;
			from = (uint32_t)l->id[i] + 1;
		}
		if (got < 2047 || from > 0xffff)
			break;
	}
	free(l);
	*count = n;
	return err;
}

/* Attach (or detach) namespace `nsid` to (from) controller `cntlid`. */
static inline int upcie_nvme_ctrl_ns_attach(struct upcie_nvme_ctrl *c, uint32_t nsid,
					    uint16_t cntlid, bool attach)
{
	struct upcie_nvme_ctrl_list *l;
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_cqe cqe;
	int err;

	err = upcie_nvme_ctrl_oacs_need_(c, UPCIE_NVME_OACS_NS_MGMT, "Namespace Management");
	if (err)
		return err;
	if (upcie_nvme_cmd_ns_attach(&sqe, nsid, attach))
		return UPCIE_FAIL(-EINVAL, "nvme: namespace attachment: NSID 0x%x", nsid);
	l = (struct upcie_nvme_ctrl_list *)calloc(1, sizeof(*l));
	if (!l)
		return UPCIE_FAIL(-ENOMEM, "nvme: out of memory");
	l->numid = 1;
	l->id[0] = cntlid;
	memset(&cqe, 0, sizeof(cqe));
	err = upcie_nvme_ctrl_admin_buf(c, &sqe, l, sizeof(*l), UPCIE_NVME_XFER_TO_DEV, 0, &cqe);
	free(l);
	if (err == -EIO)
		UPCIE_ERR("nvme %s: %s namespace %u %s controller %u: %s", c->name,
			  attach ? "attach" : "detach", nsid, attach ? "to" : "from", cntlid,
			  upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)));
	return err;
}

/*
 * Make the namespaces attached to controller `cntlid` exactly nsids[0..n) among the namespaces
 * of the subsystem `c` belongs to (Identify CNS 10h lists them, CNS 12h says where each is
 * attached): each other one is detached from it, each of these attached where it is not. A
 * namespace of nsids[] the subsystem does not have is -ENOENT, before anything changes.
 */
static inline int upcie_nvme_ctrl_ns_attach_only(struct upcie_nvme_ctrl *c, uint16_t cntlid,
						 const uint32_t *nsids, unsigned n)
{
	struct upcie_nvme_ns_list *alloc;
	uint16_t *ids;
	unsigned i, j, k, nids;
	int err;

	if (n && !nsids)
		return UPCIE_FAIL(-EINVAL, "nvme: attach only: NULL namespace list");
	err = upcie_nvme_ctrl_oacs_need_(c, UPCIE_NVME_OACS_NS_MGMT, "Namespace Management");
	if (err)
		return err;
	alloc = (struct upcie_nvme_ns_list *)malloc(sizeof(*alloc));
	ids = (uint16_t *)malloc(2047 * sizeof(*ids));
	if (!alloc || !ids) {
		free(alloc);
		free(ids);
		return UPCIE_FAIL(-ENOMEM, "nvme: out of memory");
	}
	/* one page of allocated NSIDs: 1024 namespaces, more than any subsystem served here */
	err = upcie_nvme_ctrl_identify(c, UPCIE_NVME_CNS_NS_ALLOC_LIST, 0, alloc);
	for (j = 0; !err && j < n; j++) {
		for (i = 0; i < 1024 && alloc->nsid[i] && alloc->nsid[i] != nsids[j]; i++)
			;
		if (i == 1024 || !alloc->nsid[i])
			err = UPCIE_FAIL(-ENOENT, "nvme %s: namespace %u is not in the subsystem",
					 c->name, nsids[j]);
	}
	for (i = 0; !err && i < 1024 && alloc->nsid[i]; i++) {
		uint32_t nsid = alloc->nsid[i];
		bool want = false, has = false;

		for (j = 0; j < n; j++)
			want = want || nsids[j] == nsid;
		err = upcie_nvme_ctrl_ids(c, UPCIE_NVME_CNS_NS_CTRL_LIST, nsid, ids, 2047, &nids);
		for (k = 0; !err && k < nids && k < 2047; k++)
			has = has || ids[k] == cntlid;
		if (!err && want != has)
			err = upcie_nvme_ctrl_ns_attach(c, nsid, cntlid, want);
	}
	free(alloc);
	free(ids);
	return err;
}

#endif /* UPCIE_NVME_CTRL_VIRT_H */
