/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Served VFs: isolation by the hardware. A server whose controller is an SR-IOV physical
 * function (struct upcie_served_opts `vfs`) enables that many virtual functions and gives each
 * client that asks (OP_VF) one of its own: a secondary controller brought online with queue and
 * interrupt resources, with exactly the namespaces the client's grants name attached to it, in
 * its own IOMMU group. The client receives the group's file (SCM_RIGHTS), the VF's address and
 * the VF token, and drives the VF as its own controller through the type1 path
 * (struct upcie_nvme_dev_opts vfio_group_fd, vf_token) in a container of its own: the IOMMU
 * confines the VF's DMA to the memory that client mapped (pinned against its own
 * RLIMIT_MEMLOCK), and the controller gives it no namespace it was not granted. Nothing the
 * client does reaches the server, another client's memory or another namespace; the server
 * never maps client memory for a VF.
 *
 * When it is taken: a client asks for a VF (upcie_served_vf_get()); the server gives one only
 * where every grant that names the client is read-write and covers a whole namespace (a VF
 * cannot enforce an LBA range or read-only access: those clients keep isolated queue pairs),
 * -EPERM otherwise; -EBUSY when every VF is held; one VF per connection.
 *
 * Lifecycle:
 * - Setup (upcie_served_init()): the PF must be under vfio (type1 or iommufd) with vfio-pci
 *   loaded with enable_sriov=1, and its primary must hold no flexible resources (the daemon
 *   gives them back and resets the PF before: upcie_nvme_ctrl_virt_release_primary()). The
 *   server sets a random VF token on the PF, enables the VFs (bound to vfio-pci, which claims
 *   the VFs of a PF it drives), takes every secondary offline and detaches every namespace from
 *   it.
 * - Given: namespaces attached (exactly the granted set), online; the group file is opened by
 *   the server (the open is exclusive: a group someone still holds is not given) and handed over;
 *   the server keeps no copy.
 * - Back: when the connection goes (exit, kill -9, hang-up) the secondary is taken offline at
 *   once (the controller stops: no fetch, no DMA, whatever process still holds the group file)
 *   and its namespaces are detached. It is given again only once its group can be opened, that
 *   is when every file of it is closed (vfio then resets the VF).
 * - Server gone: the kernel closes the PF's device file, vfio-pci resets the PF, and a PF reset
 *   disables its VFs in the device: every VF controller stops. The VFs stay enabled in the
 *   kernel; a new server disables and enables them again, when none is still open (-EBUSY
 *   otherwise, naming the VF).
 * Not done: VFs on the uio path (uio_pci_generic cannot enable VFs) or through the vfio cdev
 * (the client side is type1; a cdev bind of a VF needs the VF token in the bind, Linux 6.17).
 */
#ifndef UPCIE_SERVED_SERVER_VF_H
#define UPCIE_SERVED_SERVER_VF_H

#include <upcie/served/server_state.h>

#include <upcie/pci/driver.h>
#include <upcie/pci/sriov.h>
#include <upcie/vfio/type1.h>

/* Offline secondary `v` and detach its namespaces. Lock held (or no client yet). */
static inline int upcie_served_vf_quiet_(struct upcie_served *s, struct upcie_served_vf_ *v)
{
	int err = upcie_nvme_ctrl_sec_offline(s->c, v->cntlid);

	if (!err)
		err = upcie_nvme_ctrl_ns_attach_only(s->c, v->cntlid, NULL, 0);
	return err;
}

/*
 * Enable the VFs afresh. VFs left enabled (an earlier server) may be dead in the device: the
 * reset of the PF when that server's file closed disabled them there. They are disabled first,
 * but only when no process holds one: each VF's group is opened here (exclusive: -EBUSY naming
 * the VF when someone has it) and held while the VFs go, so nothing can open them meanwhile
 * (vfio would make the disable wait for that user).
 */
static inline int upcie_served_vf_recreate_(struct upcie_served *s)
{
	const struct upcie_nvme_dev *d = &s->c->dev;
	unsigned cur = 0, k;
	int fds[256], err;

	err = upcie_pci_sriov_num(&d->bdf, &cur);
	if (err || !cur)
		return err ? err : upcie_pci_sriov_set(&d->bdf, s->o.vfs);
	for (k = 0; k < cur && k < 256; k++) {
		struct upcie_pci_bdf vf;
		char path[64], name[UPCIE_PCI_BDF_STRLEN];
		int g;

		fds[k] = -1;
		err = upcie_pci_sriov_vf(&d->bdf, k, &vf);
		if (err)
			break;
		g = upcie_vfio_group_id(&vf);
		if (g < 0)
			continue; /* not under an IOMMU group: no vfio user can hold it */
		snprintf(path, sizeof(path), "/dev/vfio/%d", g);
		fds[k] = open(path, O_RDWR | O_CLOEXEC);
		if (fds[k] < 0 && errno != ENOENT) {
			err = -errno;
			upcie_pci_bdf_format(&vf, name, sizeof(name));
			UPCIE_ERR("served: VF %s (group %d) is in use (%s): its VFs cannot be made "
				  "afresh",
				  name, g, strerror(errno));
			break;
		}
	}
	if (!err)
		err = upcie_pci_sriov_set(&d->bdf, 0);
	for (unsigned i = 0; i < k && i < 256; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return err ? err : upcie_pci_sriov_set(&d->bdf, s->o.vfs);
}

/* Enable and quiet the VFs (see the header). Called by upcie_served_init(). */
static inline int upcie_served_vf_setup_(struct upcie_served *s)
{
	struct upcie_nvme_pri_ctrl_cap *cap;
	const struct upcie_nvme_dev *d = &s->c->dev;
	unsigned total = 0;
	bool reset;
	int err, fd;

	if (!s->o.vfs)
		return 0;
	if (!d->open || (d->path != UPCIE_NVME_PATH_TYPE1 && d->path != UPCIE_NVME_PATH_IOMMUFD))
		return UPCIE_FAIL(-EOPNOTSUPP, "served: VFs need the PF on a vfio path");
	err = upcie_pci_sriov_total(&d->bdf, &total);
	if (err || total < s->o.vfs)
		return UPCIE_FAIL(err ? err : -ERANGE, "served: %s: %u VFs asked, %u supported",
				  d->name, s->o.vfs, err ? 0 : total);
	cap = (struct upcie_nvme_pri_ctrl_cap *)malloc(sizeof(*cap));
	if (!cap)
		return -ENOMEM;
	err = upcie_nvme_ctrl_virt_release_primary(s->c, &reset);
	if (!err && reset)
		err =
		    UPCIE_FAIL(-EAGAIN,
			       "served: %s: the primary controller holds flexible resources until "
			       "its next function reset (give them back and reset the PF first)",
			       d->name);
	if (!err)
		err = upcie_nvme_ctrl_pri_cap(s->c, cap);
	if (!err) {
		unsigned q = cap->vqfrsm, i = cap->vifrsm;

		if (s->o.vf_nvq && s->o.vf_nvq < q)
			q = s->o.vf_nvq;
		if (s->o.vf_nvi && s->o.vf_nvi < i)
			i = s->o.vf_nvi;
		if (q < 2 || i < 1 || (uint64_t)q * s->o.vfs > cap->vqfrt ||
		    (uint64_t)i * s->o.vfs > cap->vifrt)
			err =
			    UPCIE_FAIL(-ENOSPC,
				       "served: %s: %u VFs of %u queue and %u interrupt resources "
				       "do not fit (flexible %u and %u, at most %u and %u per VF)",
				       d->name, s->o.vfs, q, i, cap->vqfrt, cap->vifrt, cap->vqfrsm,
				       cap->vifrsm);
		s->o.vf_nvq = (uint16_t)q;
		s->o.vf_nvi = (uint16_t)i;
	}
	free(cap);
	if (err)
		return err;
	fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || read(fd, s->vf_token, sizeof(s->vf_token)) != (ssize_t)sizeof(s->vf_token))
		err = UPCIE_FAIL(-EIO, "served: no random VF token");
	if (fd >= 0)
		close(fd);
	/* RFC 4122 version 4 */
	s->vf_token[6] = (uint8_t)((s->vf_token[6] & 0x0f) | 0x40);
	s->vf_token[8] = (uint8_t)((s->vf_token[8] & 0x3f) | 0x80);
	upcie_vfio_vf_token_format(s->vf_token, s->vf_token_str);
	if (!err)
		err = upcie_vfio_device_set_vf_token(&d->vdev, s->vf_token);
	if (!err)
		err = upcie_served_vf_recreate_(s);
	if (err)
		return err;
	s->vfs = (struct upcie_served_vf_ *)calloc(s->o.vfs, sizeof(*s->vfs));
	if (!s->vfs)
		return -ENOMEM;
	for (uint32_t k = 0; !err && k < s->o.vfs; k++) {
		struct upcie_served_vf_ *v = &s->vfs[k];
		struct upcie_nvme_sec_ctrl sc;
		char drv[32] = "";

		v->vfn = (uint16_t)(k + 1);
		err = upcie_pci_sriov_vf(&d->bdf, k, &v->bdf);
		if (err)
			break;
		upcie_pci_bdf_format(&v->bdf, v->name, sizeof(v->name));
		upcie_pci_driver_get(&v->bdf, drv, sizeof(drv));
		if (strcmp(drv, "vfio-pci"))
			err = upcie_pci_driver_bind(&v->bdf, "vfio-pci");
		if (!err)
			err = v->group = upcie_vfio_group_id(&v->bdf);
		if (err >= 0)
			err = upcie_nvme_ctrl_sec_of_vf(s->c, v->vfn, &sc);
		if (!err) {
			v->cntlid = sc.scid;
			err = upcie_served_vf_quiet_(s, v);
		}
		if (!err)
			UPCIE_INFO("served: VF %u: %s, IOMMU group %d, controller %u", v->vfn,
				   v->name, v->group, v->cntlid);
	}
	return err;
}

/*
 * OP_VF: give client `cn` a VF of its own. *sfd gets the group's file (the response carries it;
 * the caller closes its copy after sending). Lock held; the caller recovers the controller after
 * a failed admin command (upcie_served_after_()).
 */
static inline int upcie_served_vf_give_(struct upcie_served *s, struct upcie_served_conn_ *cn,
					struct upcie_served_rsp *rp, int *sfd)
{
	uint32_t nsids[UPCIE_SERVED_MAX_GRANTS], nns = 0;
	char path[64];
	int err = 0;

	if (!s->o.vfs || !s->vfs)
		return UPCIE_FAIL(-EOPNOTSUPP, "served: client %d: this server hands out no VFs",
				  (int)cn->pid);
	if (cn->vf)
		return UPCIE_FAIL(-EALREADY, "served: client %d holds a VF already", (int)cn->pid);
	for (uint32_t g = 0; g < cn->ngrant; g++) {
		const struct upcie_served_grant *gr = cn->grant[g];
		uint64_t nsze = 0;
		bool seen = false;

		for (uint32_t k = 0; k < s->nns; k++)
			if (s->ns[k].nsid == gr->nsid && s->ns[k].ok)
				nsze = s->ns[k].nsze;
		if (gr->access != (UPCIE_SERVED_READ | UPCIE_SERVED_WRITE) || gr->slba ||
		    (gr->nlb && gr->nlb < nsze) || !nsze)
			return UPCIE_FAIL(
			    -EPERM,
			    "served: client %d (uid %u): its grant on namespace %u is "
			    "%s: a VF can only be given whole namespaces, read-write",
			    (int)cn->pid, (unsigned)cn->uid, gr->nsid,
			    !nsze ? "on a namespace not served"
			    : gr->access != (UPCIE_SERVED_READ | UPCIE_SERVED_WRITE)
				? "read-only"
				: "an LBA range");
		for (uint32_t k = 0; k < nns; k++)
			seen = seen || nsids[k] == gr->nsid;
		if (!seen)
			nsids[nns++] = gr->nsid;
	}
	if (!nns)
		return UPCIE_FAIL(-EPERM, "served: client %d (uid %u): no grant names it",
				  (int)cn->pid, (unsigned)cn->uid);
	err = -EBUSY;
	for (uint32_t k = 0; err == -EBUSY && k < s->o.vfs; k++) {
		struct upcie_served_vf_ *v = &s->vfs[k];
		bool taken = false;
		int fd;

		for (uint32_t i = 0; i < s->o.max_clients; i++)
			taken = taken || (s->conns[i] && s->conns[i]->vf == k + 1);
		if (taken)
			continue;
		snprintf(path, sizeof(path), "/dev/vfio/%d", v->group);
		/* exclusive: fails while any file of the group is still open somewhere */
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			continue;
		if (s->failed) {
			close(fd);
			err = UPCIE_FAIL(-ENODEV,
					 "served: the controller failed (restart the server)");
			break;
		}
		err = upcie_nvme_ctrl_ns_attach_only(s->c, v->cntlid, nsids, nns);
		if (!err)
			err = upcie_nvme_ctrl_sec_online(s->c, v->cntlid, s->o.vf_nvq, s->o.vf_nvi);
		if (err) {
			upcie_served_vf_quiet_(s, v);
			close(fd);
			break;
		}
		cn->vf = k + 1;
		*sfd = fd;
		snprintf(rp->u.vf.bdf, sizeof(rp->u.vf.bdf), "%.15s", v->name);
		snprintf(rp->u.vf.token, sizeof(rp->u.vf.token), "%.39s", s->vf_token_str);
		rp->u.vf.group = v->group;
		rp->u.vf.cntlid = v->cntlid;
		rp->u.vf.nvq = s->o.vf_nvq;
		rp->u.vf.nvi = s->o.vf_nvi;
		rp->u.vf.nns = (uint16_t)nns;
		s->st.vf_given++;
		UPCIE_INFO("served: client %d (uid %u) gets VF %s (controller %u, %u namespaces)",
			   (int)cn->pid, (unsigned)cn->uid, v->name, v->cntlid, nns);
	}
	if (err == -EBUSY)
		UPCIE_ERR("served: client %d: every VF (%u) is held", (int)cn->pid, s->o.vfs);
	return err;
}

/* The connection went: its VF offline at once, namespaces detached. Lock held (the caller
 * recovers the controller after a failure). */
static inline void upcie_served_vf_back_(struct upcie_served *s, struct upcie_served_conn_ *cn)
{
	struct upcie_served_vf_ *v;

	if (!cn->vf || !s->vfs)
		return;
	v = &s->vfs[cn->vf - 1];
	cn->vf = 0;
#ifdef UPCIE_SERVED_TEST_VF_KEEP
	/* tests only (the negative control of the rule): the VF is left online */
	s->st.vf_back++;
	return;
#endif
	if (upcie_served_vf_quiet_(s, v))
		UPCIE_ERR("served: VF %s could not be taken offline", v->name);
	s->st.vf_back++;
}

#endif /* UPCIE_SERVED_SERVER_VF_H */
