/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Bind and unbind PCI functions to kernel drivers (nvme, uio_pci_generic, vfio-pci, ...).
 *
 * Binding goes through driver_override + drivers_probe, so exactly the named function moves
 * (new_id would grab every function with the same ids). Needs root. The driver's module must be
 * loaded (the setup tool loads it); a missing driver is -ENOENT naming the module to load.
 * Note: after the kernel nvme driver lets go, the controller is still enabled and bus mastering
 * is off; the NVMe layer and upcie_pci_bus_master_enable() deal with that.
 */
#ifndef UPCIE_PCI_DRIVER_H
#define UPCIE_PCI_DRIVER_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>

#include <upcie/base/log.h>
#include <upcie/base/sysfs.h>
#include <upcie/pci/func.h>

/* Name of the driver bound to bdf into buf ("" when none). 0, -ENODEV, or -errno. */
static inline int upcie_pci_driver_get(const struct upcie_pci_bdf *bdf, char *buf, size_t len)
{
	int err = upcie_pci_func_exists(bdf);

	return err ? err : upcie_pci_func_link_name(bdf, "driver", buf, len);
}

/* Module that provides a driver, for messages ("vfio-pci" lives in vfio_pci). */
static inline const char *upcie_pci_driver_module_(const char *driver, char *buf, size_t len)
{
	size_t i;

	for (i = 0; driver[i] && i + 1 < len; i++)
		buf[i] = driver[i] == '-' ? '_' : driver[i];
	buf[i] = '\0';
	return buf;
}

/* 0 when the driver is registered with the PCI bus, -ENOENT (with the fix in the message) if not. */
static inline int upcie_pci_driver_loaded(const char *driver)
{
	char path[PATH_MAX], mod[64];
	struct stat st;
	int err;

	if (!driver || !*driver || strchr(driver, '/'))
		return UPCIE_FAIL(-EINVAL, "pci: invalid driver name '%s'", driver ? driver : "");
	err =
	    upcie_path_fmt(path, sizeof(path), "%s/bus/pci/drivers/%s", upcie_sysfs_root(), driver);
	if (err)
		return err;
	if (stat(path, &st) == 0)
		return 0;
	return UPCIE_FAIL(-ENOENT, "pci: driver '%s' is not loaded (modprobe %s)", driver,
			  upcie_pci_driver_module_(driver, mod, sizeof(mod)));
}

/* Unbind whatever driver holds bdf. 0 also when none was bound. Root. */
static inline int upcie_pci_driver_unbind(const struct upcie_pci_bdf *bdf)
{
	char path[PATH_MAX], cur[64], name[UPCIE_PCI_BDF_STRLEN];
	int err = upcie_pci_driver_get(bdf, cur, sizeof(cur));

	if (err)
		return err;
	if (!cur[0])
		return 0;
	err = upcie_pci_func_path(bdf, "driver/unbind", path, sizeof(path));
	if (err)
		return err;
	upcie_pci_bdf_format(bdf, name, sizeof(name));
	err = upcie_file_write_str(path, name);
	if (err)
		return UPCIE_FAIL(err, "pci: %s: unbind from %s: %s%s", name, cur, strerror(-err),
				  upcie_pci_sysfs_hint_(err));
	return 0;
}

/*
 * Bind bdf to `driver`, moving it from its current driver if needed. 0 when it ends up bound to
 * `driver` (also when it already was); -ENODEV (no such function), -ENOENT (driver not loaded),
 * -EACCES (not root), -EIO (the driver refused the function: the message says why it may have,
 * e.g. vfio-pci without an IOMMU group).
 */
static inline int upcie_pci_driver_bind(const struct upcie_pci_bdf *bdf, const char *driver)
{
	char path[PATH_MAX], cur[64], name[UPCIE_PCI_BDF_STRLEN];
	int err;

	err = upcie_pci_driver_get(bdf, cur, sizeof(cur));
	if (err)
		return err;
	err = upcie_pci_driver_loaded(driver);
	if (err)
		return err;
	if (!strcmp(cur, driver))
		return 0;
	upcie_pci_bdf_format(bdf, name, sizeof(name));

	err = upcie_pci_func_path(bdf, "driver_override", path, sizeof(path));
	if (!err)
		err = upcie_file_write_str(path, driver);
	if (err)
		return UPCIE_FAIL(err, "pci: %s: set driver_override=%s: %s%s", name, driver,
				  strerror(-err), upcie_pci_sysfs_hint_(err));
	err = upcie_pci_driver_unbind(bdf);
	if (err)
		return err;
	err = upcie_path_fmt(path, sizeof(path), "%s/bus/pci/drivers_probe", upcie_sysfs_root());
	if (!err)
		err = upcie_file_write_str(path, name);
	if (err == -EROFS || err == -EACCES || err == -EPERM)
		return UPCIE_FAIL(err, "pci: %s: drivers_probe: %s%s", name, strerror(-err),
				  upcie_pci_sysfs_hint_(err));
	/* drivers_probe reports probe failures through errno; the link tells the truth. */
	if (upcie_pci_driver_get(bdf, cur, sizeof(cur)) == 0 && !strcmp(cur, driver))
		return 0;
	if (!strcmp(driver, "vfio-pci")) {
		char grp[32] = "";

		upcie_pci_func_link_name(bdf, "iommu_group", grp, sizeof(grp));
		if (!grp[0])
			return UPCIE_FAIL(-EIO,
					  "pci: %s: vfio-pci refused the function: it has no IOMMU "
					  "group (boot with intel_iommu=on / amd_iommu=on, or use "
					  "uio_pci_generic)",
					  name);
	}
	return UPCIE_FAIL(-EIO, "pci: %s: binding to %s failed (%s); see dmesg", name, driver,
			  err ? strerror(-err) : "driver did not take it");
}

/*
 * 0 when bdf is bound to `driver`; -ENODEV when there is no such function; -ENXIO, with a message,
 * when it is unbound or bound to another driver. The message names the fix (upcie-setup bind) for
 * an NVMe controller only: upcie-setup binds nothing else without --any-class, and a function of
 * another class (or one whose class cannot be read) is more likely a wrong address.
 */
static inline int upcie_pci_driver_require(const struct upcie_pci_bdf *bdf, const char *driver)
{
	char cur[64], name[UPCIE_PCI_BDF_STRLEN];
	uint64_t cls = 0;
	int err = upcie_pci_driver_get(bdf, cur, sizeof(cur));

	if (err)
		return err;
	if (!strcmp(cur, driver))
		return 0;
	upcie_pci_bdf_format(bdf, name, sizeof(name));
	if (upcie_pci_func_read_u64_(bdf, "class", &cls))
		return UPCIE_FAIL(-ENXIO, "pci: %s is %s%s, not %s (its class cannot be read)",
				  name, cur[0] ? "bound to " : "not bound to any driver", cur,
				  driver);
	if ((cls & 0xffffffu) != UPCIE_PCI_CLASS_NVME)
		return UPCIE_FAIL(-ENXIO,
				  "pci: %s is %s%s, not %s; it is not an NVMe controller (class "
				  "0x%06x): check the address",
				  name, cur[0] ? "bound to " : "not bound to any driver", cur,
				  driver, (unsigned)(cls & 0xffffffu));
	return UPCIE_FAIL(-ENXIO, "pci: %s is %s%s, not %s (upcie-setup bind %s %s)", name,
			  cur[0] ? "bound to " : "not bound to any driver", cur, driver, name,
			  driver);
}

#endif /* UPCIE_PCI_DRIVER_H */
