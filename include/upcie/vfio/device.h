/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A vfio device file descriptor, however it was obtained: regions (BARs, config space), reset.
 *
 * The descriptor comes from a type1 group (vfio/type1.h, every kernel) or from the device cdev
 * bound to an iommufd (vfio/cdev.h, Linux 6.6+ with CONFIG_VFIO_DEVICE_CDEV); everything here
 * works the same on both. Interrupts are in vfio/irq.h, BAR dma-buf export in vfio/dmabuf.h.
 * Needs: the function bound to vfio-pci. Does not: map DMA (the container or the IOAS does).
 *
 * File descriptors: a struct that was zeroed and never opened must close as a no-op, so every
 * close here treats fd <= 0 as "not open". To keep that true for a process that closed its
 * stdin, descriptors that upcie opens are moved off 0 (upcie_vfio_fd_not_zero_()).
 */
#ifndef UPCIE_VFIO_DEVICE_H
#define UPCIE_VFIO_DEVICE_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/vfio.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/pci/bdf.h>

struct upcie_vfio_device {
	int fd; /* device fd, or -1 */
	struct upcie_pci_bdf bdf;
	char name[UPCIE_PCI_BDF_STRLEN];
	uint32_t flags; /* VFIO_DEVICE_FLAGS_* */
	uint32_t num_regions;
	uint32_t num_irqs;
	/* cdev path only (vfio/cdev.h); 0 for a device opened through a group */
	uint32_t devid;	  /* iommufd device object id after VFIO_DEVICE_BIND_IOMMUFD */
	uint32_t hwpt_id; /* page table the device is attached to; 0 when detached */
};

struct upcie_vfio_region {
	void *addr; /* NULL when not mapped */
	size_t size;
	uint64_t offset; /* offset of the region in the device fd */
	uint32_t flags;	 /* VFIO_REGION_INFO_FLAG_* */
	uint32_t index;
};

/*
 * Return `fd` unless it is 0, in which case it is moved to a descriptor >= 3 (fd 0 is closed).
 * -1 passes through; a failed move also returns -1, with errno set, so callers read errno.
 */
static inline int upcie_vfio_fd_not_zero_(int fd)
{
	int nfd, saved;

	if (fd != 0)
		return fd;
	nfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	saved = errno;
	close(fd);
	errno = saved;
	return nfd;
}

/* Release of the running kernel ("6.12.117+deb13-amd64"), for messages naming versions. */
static inline const char *upcie_vfio_kernel_(char *buf, size_t len)
{
	struct utsname u;

	if (uname(&u) == 0)
		snprintf(buf, len, "%s", u.release);
	else
		snprintf(buf, len, "unknown");
	return buf;
}

static inline int upcie_vfio_device_check_(const struct upcie_vfio_device *dev, const char *what)
{
	if (!dev || dev->fd <= 0)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: device not open", what);
	return 0;
}

/* VFIO_DEVICE_GET_INFO into dev (fd already set); checks that it is a PCI device. */
static inline int upcie_vfio_device_info_(struct upcie_vfio_device *dev)
{
	struct vfio_device_info info;
	int err;

	memset(&info, 0, sizeof(info));
	info.argsz = sizeof(info);
	if (ioctl(dev->fd, VFIO_DEVICE_GET_INFO, &info)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: %s: GET_INFO: %s", dev->name, strerror(-err));
	}
	if (!(info.flags & VFIO_DEVICE_FLAGS_PCI))
		return UPCIE_FAIL(-ENODEV, "vfio: %s is not a PCI device", dev->name);
	dev->flags = info.flags;
	dev->num_regions = info.num_regions;
	dev->num_irqs = info.num_irqs;
	return 0;
}

/* Close the device fd (which also releases a cdev's iommufd binding). Zeroed: no-op. */
static inline void upcie_vfio_device_close(struct upcie_vfio_device *dev)
{
	if (dev && dev->fd > 0)
		close(dev->fd);
	if (dev) {
		dev->fd = -1;
		dev->devid = 0;
		dev->hwpt_id = 0;
	}
}

/* Region info of region `index` (VFIO_PCI_BAR0_REGION_INDEX.., VFIO_PCI_CONFIG_REGION_INDEX). */
static inline int upcie_vfio_region_info(const struct upcie_vfio_device *dev, uint32_t index,
					 struct vfio_region_info *info)
{
	int err;

	if (!info)
		return UPCIE_FAIL(-EINVAL, "vfio: region info: NULL output");
	memset(info, 0, sizeof(*info));
	info->argsz = sizeof(*info);
	info->index = index;
	err = upcie_vfio_device_check_(dev, "region info");
	if (err)
		return err;
	if (index >= dev->num_regions)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: region %u out of range (%u regions)",
				  dev->name, index, dev->num_regions);
	if (ioctl(dev->fd, VFIO_DEVICE_GET_REGION_INFO, info)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: %s: region %u info: %s", dev->name, index,
				  strerror(-err));
	}
	return 0;
}

/*
 * mmap region `index` (a BAR) whole. -ENOENT: region not implemented (size 0); -EOPNOTSUPP: the
 * region cannot be mmapped (access it with pread/pwrite on the device fd instead).
 */
static inline int upcie_vfio_region_map(const struct upcie_vfio_device *dev, uint32_t index,
					struct upcie_vfio_region *r)
{
	struct vfio_region_info info;
	void *addr;
	int err;

	if (!r)
		return UPCIE_FAIL(-EINVAL, "vfio: region map: NULL region");
	memset(r, 0, sizeof(*r));
	err = upcie_vfio_region_info(dev, index, &info);
	if (err)
		return err;
	if (!info.size)
		return UPCIE_FAIL(-ENOENT, "vfio: %s: region %u is not implemented", dev->name,
				  index);
	if (!(info.flags & VFIO_REGION_INFO_FLAG_MMAP))
		return UPCIE_FAIL(-EOPNOTSUPP, "vfio: %s: region %u cannot be mmapped", dev->name,
				  index);
	addr = mmap(NULL, info.size,
		    ((info.flags & VFIO_REGION_INFO_FLAG_READ) ? PROT_READ : 0) |
			((info.flags & VFIO_REGION_INFO_FLAG_WRITE) ? PROT_WRITE : 0),
		    MAP_SHARED, dev->fd, (off_t)info.offset);
	if (addr == MAP_FAILED) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: %s: mmap region %u: %s", dev->name, index,
				  strerror(-err));
	}
	r->addr = addr;
	r->size = info.size;
	r->offset = info.offset;
	r->flags = info.flags;
	r->index = index;
	return 0;
}

/* Unmap a region of upcie_vfio_region_map(); a zeroed one is a no-op. */
static inline void upcie_vfio_region_unmap(struct upcie_vfio_region *r)
{
	if (r && r->addr)
		munmap(r->addr, r->size);
	if (r)
		memset(r, 0, sizeof(*r));
}

/* pread/pwrite a region (works for regions that cannot be mmapped, e.g. config space). */
static inline int upcie_vfio_region_rw(const struct upcie_vfio_device *dev, uint32_t index,
				       uint64_t off, void *buf, size_t len, int write)
{
	struct vfio_region_info info;
	ssize_t n;
	int err;

	if (!buf && len)
		return UPCIE_FAIL(-EINVAL, "vfio: region access: NULL buffer");
	err = upcie_vfio_region_info(dev, index, &info);
	if (err)
		return err;
	if (off > info.size || len > info.size - off)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: region %u access [0x%llx, +%zu) out of range",
				  dev->name, index, (unsigned long long)off, len);
	n = write ? pwrite(dev->fd, buf, len, (off_t)(info.offset + off))
		  : pread(dev->fd, buf, len, (off_t)(info.offset + off));
	if (n < 0) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: %s: region %u %s: %s", dev->name, index,
				  write ? "write" : "read", strerror(-err));
	}
	return (size_t)n == len ? 0 : -EIO;
}

/* A VF token (UUID) as text: 36 characters and a NUL, the form vfio-pci parses. */
#define UPCIE_VFIO_VF_TOKEN_STRLEN 37

/* Format the 16 bytes of a VF token as 8-4-4-4-12 lower-case hex into buf (>= 37 bytes). */
static inline void upcie_vfio_vf_token_format(const uint8_t uuid[16], char *buf)
{
	static const char hex[] = "0123456789abcdef";
	int i, o = 0;

	for (i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			buf[o++] = '-';
		buf[o++] = hex[uuid[i] >> 4];
		buf[o++] = hex[uuid[i] & 15];
	}
	buf[o] = '\0';
}

/*
 * Set the VF token of an SR-IOV physical function opened through vfio-pci
 * (VFIO_DEVICE_FEATURE_PCI_VF_TOKEN): the UUID that whoever opens one of its VFs must present
 * (upcie_vfio_device_open_token()), so that a user-space PF driver consents to each VF user.
 * While a VF is open the PF can be opened again only with the same token. -EOPNOTSUPP: not an
 * SR-IOV PF under vfio-pci (or a kernel before 5.7).
 */
static inline int upcie_vfio_device_set_vf_token(const struct upcie_vfio_device *pf,
						 const uint8_t uuid[16])
{
	union {
		struct vfio_device_feature f;
		uint8_t b[sizeof(struct vfio_device_feature) + 16];
	} a;
	int err = upcie_vfio_device_check_(pf, "set VF token");

	if (err)
		return err;
	if (!uuid)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: NULL VF token", pf->name);
	memset(&a, 0, sizeof(a));
	a.f.argsz = sizeof(a);
	a.f.flags = VFIO_DEVICE_FEATURE_SET | VFIO_DEVICE_FEATURE_PCI_VF_TOKEN;
	memcpy(a.b + sizeof(struct vfio_device_feature), uuid, 16);
	if (ioctl(pf->fd, VFIO_DEVICE_FEATURE, a.b)) {
		err = upcie_neg_errno();
		if (err == -ENOTTY || err == -EINVAL)
			err = -EOPNOTSUPP;
		return UPCIE_FAIL(err, "vfio: %s: set VF token: %s%s", pf->name, strerror(-err),
				  err == -EOPNOTSUPP ? " (not an SR-IOV PF bound to vfio-pci?)"
						     : "");
	}
	return 0;
}

/*
 * Function-level reset (VFIO_DEVICE_RESET): whatever reset the kernel found for the function
 * (FLR, PM, slot or bus reset where the whole bus is owned). -EOPNOTSUPP when the kernel reports
 * no reset method for it. The kernel saves the config space, holds the command register at
 * INTx-disable during the reset and restores everything after (pci_try_reset_function():
 * pci_dev_save_and_disable(), pci_dev_restore(); Linux 6.1 to 7.3): the command register comes
 * back as it was, bus mastering included, and so do the BARs and the MSI-X setup vfio made. The
 * device's own state is gone (an NVMe controller is disabled, its queues forgotten), so a
 * device that had bus mastering on is live again at once: turn it off before the reset where
 * nothing may DMA until the device is set up again.
 */
static inline int upcie_vfio_device_reset(const struct upcie_vfio_device *dev)
{
	int err = upcie_vfio_device_check_(dev, "reset");

	if (err)
		return err;
	if (!(dev->flags & VFIO_DEVICE_FLAGS_RESET))
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "vfio: %s: the kernel has no reset method for this function "
				  "(no FLR, PM or exclusive bus reset)",
				  dev->name);
	if (ioctl(dev->fd, VFIO_DEVICE_RESET)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: %s: VFIO_DEVICE_RESET: %s", dev->name,
				  strerror(-err));
	}
	return 0;
}

#endif /* UPCIE_VFIO_DEVICE_H */
