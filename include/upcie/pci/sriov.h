/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * SR-IOV virtual functions of a PCI physical function, through sysfs: how many it can have, how
 * many it has, turning them on and off, and the address of each (virtfnN links).
 *
 * The PF's driver decides whether VFs can be enabled: the kernel's nvme driver can; vfio-pci only
 * when loaded with enable_sriov=1 (otherwise the write fails, -ENOENT, with that hint), and then
 * every VF is bound to vfio-pci and can be opened only with the VF token its PF's owner set
 * (vfio/device.h: upcie_vfio_device_set_vf_token()); uio_pci_generic cannot. The count changes
 * only from 0 or to 0 (the kernel's rule): upcie_pci_sriov_set() takes the count to 0 first when
 * another one is asked for. Needs root for the writes.
 */
#ifndef UPCIE_PCI_SRIOV_H
#define UPCIE_PCI_SRIOV_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <upcie/base/log.h>
#include <upcie/base/sysfs.h>
#include <upcie/pci/bdf.h>
#include <upcie/pci/func.h>

/* Read sysfs attribute `attr` of the PF as a number; -EOPNOTSUPP when it has no SR-IOV. */
static inline int upcie_pci_sriov_read_(const struct upcie_pci_bdf *pf, const char *attr,
					unsigned *val)
{
	char path[PATH_MAX];
	uint64_t v;
	int err = upcie_pci_func_path(pf, attr, path, sizeof(path));

	if (err)
		return err;
	err = upcie_file_read_u64(path, &v);
	if (err == -ENOENT) {
		err = upcie_pci_func_exists(pf);
		return err ? err : -EOPNOTSUPP;
	}
	if (!err && v > 0xffff)
		err = -EINVAL;
	if (!err)
		*val = (unsigned)v;
	return err;
}

/* How many VFs the PF supports (sriov_totalvfs). -EOPNOTSUPP: no SR-IOV capability. */
static inline int upcie_pci_sriov_total(const struct upcie_pci_bdf *pf, unsigned *total)
{
	if (!pf || !total)
		return UPCIE_FAIL(-EINVAL, "pci: sriov: NULL argument");
	return upcie_pci_sriov_read_(pf, "sriov_totalvfs", total);
}

/* How many VFs the PF has enabled now (sriov_numvfs). */
static inline int upcie_pci_sriov_num(const struct upcie_pci_bdf *pf, unsigned *num)
{
	if (!pf || !num)
		return UPCIE_FAIL(-EINVAL, "pci: sriov: NULL argument");
	return upcie_pci_sriov_read_(pf, "sriov_numvfs", num);
}

/*
 * Enable `num` VFs (0: disable them all). A different count already enabled is disabled first.
 * -EOPNOTSUPP: no SR-IOV; -ERANGE: above sriov_totalvfs; -ENOENT: the PF's driver cannot enable
 * VFs (vfio-pci without enable_sriov=1, uio_pci_generic, no driver); -EBUSY: a VF is in use
 * (vfio refuses to disable VFs that are open).
 */
static inline int upcie_pci_sriov_set(const struct upcie_pci_bdf *pf, unsigned num)
{
	char path[PATH_MAX], val[16], name[UPCIE_PCI_BDF_STRLEN];
	unsigned total = 0, cur = 0;
	int err;

	if (!pf)
		return UPCIE_FAIL(-EINVAL, "pci: sriov: NULL address");
	upcie_pci_bdf_format(pf, name, sizeof(name));
	err = upcie_pci_sriov_total(pf, &total);
	if (!err)
		err = upcie_pci_sriov_num(pf, &cur);
	if (err == -EOPNOTSUPP)
		return UPCIE_FAIL(err, "pci: %s has no SR-IOV capability", name);
	if (err)
		return UPCIE_FAIL(err, "pci: %s: sriov: %s", name, strerror(-err));
	if (num > total)
		return UPCIE_FAIL(-ERANGE, "pci: %s supports %u VFs, not %u", name, total, num);
	if (cur == num)
		return 0;
	err = upcie_pci_func_path(pf, "sriov_numvfs", path, sizeof(path));
	if (err)
		return err;
	if (cur && num)
		err = upcie_file_write_str(path, "0");
	snprintf(val, sizeof(val), "%u", num);
	if (!err)
		err = upcie_file_write_str(path, val);
	if (err) {
		char drv[64] = "";

		upcie_pci_func_link_name(pf, "driver", drv, sizeof(drv));
		return UPCIE_FAIL(
		    err, "pci: %s: sriov_numvfs %u -> %u: %s%s", name, cur, num, strerror(-err),
		    err != -ENOENT	       ? ""
		    : !strcmp(drv, "vfio-pci") ? " (load vfio-pci with enable_sriov=1)"
		    : drv[0]		       ? " (the PF's driver cannot enable VFs)"
					       : " (no driver bound to the PF)");
	}
	return 0;
}

/* The address of VF `index` (0-based: the virtfn<index> link) of the PF into *vf. */
static inline int upcie_pci_sriov_vf(const struct upcie_pci_bdf *pf, unsigned index,
				     struct upcie_pci_bdf *vf)
{
	char attr[32], target[UPCIE_PCI_BDF_STRLEN + 8], name[UPCIE_PCI_BDF_STRLEN];
	int err;

	if (!pf || !vf)
		return UPCIE_FAIL(-EINVAL, "pci: sriov: NULL argument");
	snprintf(attr, sizeof(attr), "virtfn%u", index);
	err = upcie_pci_func_link_name(pf, attr, target, sizeof(target));
	if (!err && !target[0]) {
		upcie_pci_bdf_format(pf, name, sizeof(name));
		return UPCIE_FAIL(-ENOENT, "pci: %s has no VF %u enabled", name, index);
	}
	if (err)
		return err;
	return upcie_pci_bdf_parse(target, vf);
}

#endif /* UPCIE_PCI_SRIOV_H */
