/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vfio device cdev (/dev/vfio/devices/vfioN) bound to an iommufd: open + bind, attach to an IOAS,
 * detach. The result is an ordinary struct upcie_vfio_device, so regions, reset, IRQs and dma-buf
 * export (vfio/device.h, vfio/irq.h, vfio/dmabuf.h) work on it as on a type1 device.
 *
 * Needs: Linux >= 6.6 with CONFIG_VFIO_DEVICE_CDEV (which needs CONFIG_IOMMUFD; no Debian kernel
 * has it up to 7.x), the function bound to vfio-pci, read/write access to the cdev and to
 * /dev/iommu. N is found in sysfs (<sysfs>/bus/pci/devices/<bdf>/vfio-dev/vfioN; the root is
 * upcie_sysfs_root()). Note that sysfs has vfio-dev entries even on kernels without the cdev;
 * then the node in /dev/vfio/devices is missing and open says so. Groups do not matter on this
 * path: devices from different IOMMU groups can share one IOAS. Does not: use VF tokens or PASIDs.
 */
#ifndef UPCIE_VFIO_CDEV_H
#define UPCIE_VFIO_CDEV_H

#include <upcie/base/feature.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/base/sysfs.h>
#include <upcie/pci/bdf.h>
#include <upcie/pci/func.h>
#include <upcie/vfio/device.h>
#include <upcie/vfio/iommufd.h>
#include <upcie/vfio/uapi.h>

/* "vfio" followed by decimal digits only. */
static inline int upcie_vfio_cdev_name_ok_(const char *s)
{
	if (strncmp(s, "vfio", 4) || !s[4])
		return 0;
	for (s += 4; *s; s++)
		if (*s < '0' || *s > '9')
			return 0;
	return 1;
}

/*
 * Name of the function's vfio cdev ("vfio3") into buf. Returns 0; -ENODEV when the function does
 * not exist; -ENOENT when it has no vfio-dev entry (not bound to vfio-pci, or a kernel before
 * 6.6); -ENAMETOOLONG when buf is too small.
 */
static inline int upcie_vfio_cdev_find(const struct upcie_pci_bdf *bdf, char *buf, size_t len)
{
	char path[PATH_MAX], name[UPCIE_PCI_BDF_STRLEN];
	struct dirent *de;
	DIR *d;
	int err;

	if (!bdf || !buf || !len)
		return UPCIE_FAIL(-EINVAL, "vfio: cdev find: NULL argument");
	buf[0] = '\0';
	err = upcie_pci_func_exists(bdf);
	if (err)
		return err;
	upcie_pci_bdf_format(bdf, name, sizeof(name));
	err = upcie_pci_func_path(bdf, "vfio-dev", path, sizeof(path));
	if (err)
		return UPCIE_FAIL(err, "vfio: %s: sysfs path too long", name);
	d = opendir(path);
	if (!d) {
		err = upcie_neg_errno();
		if (err == -ENOENT)
			return UPCIE_FAIL(err,
					  "vfio: %s has no vfio device cdev (%s missing): bind it "
					  "to vfio-pci; the cdev needs Linux >= 6.6",
					  name, path);
		return UPCIE_FAIL(err, "vfio: %s: cannot list %s: %s", name, path, strerror(-err));
	}
	err = -ENOENT;
	while ((de = readdir(d))) {
		if (!upcie_vfio_cdev_name_ok_(de->d_name))
			continue;
		if (strlen(de->d_name) >= len) {
			err = -ENAMETOOLONG;
			break;
		}
		strcpy(buf, de->d_name);
		err = 0;
		break;
	}
	closedir(d);
	if (err == -ENOENT)
		return UPCIE_FAIL(err, "vfio: %s: no vfioN entry in %s", name, path);
	if (err)
		return UPCIE_FAIL(err, "vfio: %s: cdev name does not fit %zu bytes", name, len);
	return 0;
}

/*
 * Open the vfio cdev of `bdf` and bind it to the iommufd `ctx` (VFIO_DEVICE_BIND_IOMMUFD), then
 * read the device info. The device can do nothing DMA-related until attached to an IOAS.
 * Returns 0; -ENOENT with a message when the function has no cdev (not bound to vfio-pci; a
 * kernel without CONFIG_VFIO_DEVICE_CDEV); -EBUSY when the device is in use, e.g. opened
 * through its group; or the failing call's error. Close with upcie_vfio_device_close().
 */
static inline int upcie_vfio_cdev_open(struct upcie_vfio_device *dev,
				       const struct upcie_vfio_iommufd *ctx,
				       const struct upcie_pci_bdf *bdf)
{
	struct upcie_vfio_device_bind_iommufd bind;
	char cdev[32], path[64];
	int fd, err;

	if (!dev || !bdf)
		return UPCIE_FAIL(-EINVAL, "vfio: cdev open: NULL argument");
	memset(dev, 0, sizeof(*dev));
	dev->fd = -1;
	dev->bdf = *bdf;
	upcie_pci_bdf_format(bdf, dev->name, sizeof(dev->name));
	if (!ctx || ctx->fd <= 0)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: iommufd not open", dev->name);
	err = upcie_vfio_cdev_find(bdf, cdev, sizeof(cdev));
	if (err)
		return err;
	snprintf(path, sizeof(path), "/dev/vfio/devices/%s", cdev);
	fd = upcie_vfio_fd_not_zero_(open(path, O_RDWR | O_CLOEXEC));
	if (fd < 0) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: %s: open %s: %s%s", dev->name, path, strerror(-err),
				  err == -ENOENT ? " (kernel without CONFIG_VFIO_DEVICE_CDEV: "
						   "use the type1 group path)"
						 : "");
	}
	/* argsz ends at out_devid: the token field is only read on kernels that know it. */
	memset(&bind, 0, sizeof(bind));
	bind.argsz =
	    offsetof(struct upcie_vfio_device_bind_iommufd, out_devid) + sizeof(bind.out_devid);
	bind.iommufd = ctx->fd;
	if (ioctl(fd, UPCIE_VFIO_DEVICE_BIND_IOMMUFD, &bind)) {
		err = upcie_neg_errno();
		close(fd);
		return UPCIE_FAIL(
		    err, "vfio: %s: VFIO_DEVICE_BIND_IOMMUFD: %s%s", dev->name, strerror(-err),
		    err == -EBUSY ? " (device in use, e.g. opened through its group)" : "");
	}
	dev->fd = fd;
	dev->devid = bind.out_devid;
	err = upcie_vfio_device_info_(dev);
	if (err)
		upcie_vfio_device_close(dev);
	return err;
}

/*
 * Attach the bound device to `ioas` (VFIO_DEVICE_ATTACH_IOMMUFD_PT): from now on its DMA is
 * translated by the IOAS's mappings; dev->hwpt_id is the page table the kernel chose. Attaching
 * again moves the device to the new IOAS. The IOAS's allowed IOVA ranges may shrink by the
 * device's reserved regions.
 */
static inline int upcie_vfio_cdev_attach(struct upcie_vfio_device *dev,
					 const struct upcie_vfio_ioas *ioas)
{
	struct upcie_vfio_device_attach_iommufd_pt a;
	int err = upcie_vfio_device_check_(dev, "attach");

	if (err)
		return err;
	if (!dev->devid)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: attach: not a cdev bound to an iommufd",
				  dev->name);
	err = upcie_vfio_ioas_check_(ioas, "attach");
	if (err)
		return err;
	memset(&a, 0, sizeof(a));
	a.argsz = offsetof(struct upcie_vfio_device_attach_iommufd_pt, pt_id) + sizeof(a.pt_id);
	a.pt_id = ioas->id;
	if (ioctl(dev->fd, UPCIE_VFIO_DEVICE_ATTACH_IOMMUFD_PT, &a)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: %s: VFIO_DEVICE_ATTACH_IOMMUFD_PT(ioas %u): %s",
				  dev->name, ioas->id, strerror(-err));
	}
	dev->hwpt_id = a.pt_id;
	return 0;
}

/* Detach the device from its IOAS: its DMA is blocked until it is attached again. */
static inline int upcie_vfio_cdev_detach(struct upcie_vfio_device *dev)
{
	struct upcie_vfio_device_detach_iommufd_pt d;
	int err = upcie_vfio_device_check_(dev, "detach");

	if (err)
		return err;
	if (!dev->devid)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: detach: not a cdev bound to an iommufd",
				  dev->name);
	memset(&d, 0, sizeof(d));
	d.argsz = offsetof(struct upcie_vfio_device_detach_iommufd_pt, flags) + sizeof(d.flags);
	if (ioctl(dev->fd, UPCIE_VFIO_DEVICE_DETACH_IOMMUFD_PT, &d)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: %s: VFIO_DEVICE_DETACH_IOMMUFD_PT: %s", dev->name,
				  strerror(-err));
	}
	dev->hwpt_id = 0;
	return 0;
}

#endif /* UPCIE_VFIO_CDEV_H */
