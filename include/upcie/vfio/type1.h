/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vfio with the type1 IOMMU backend (VFIO_TYPE1v2_IOMMU): container, groups, devices, regions,
 * DMA mappings. Works on every kernel upcie supports (6.1+).
 *
 * Needs: the function bound to vfio-pci, its IOMMU group viable (every function in the group
 * bound to vfio-pci or unbound), read/write access to /dev/vfio/vfio and /dev/vfio/<group>, and
 * RLIMIT_MEMLOCK covering the memory that gets mapped. Several groups (an NVMe controller and a
 * peer device whose BAR receives its DMA) share one container and so one IOVA space.
 * Does not: choose IOVAs (mem/ does, inside the ranges the IOMMU reports), or handle IRQs.
 */
#ifndef UPCIE_VFIO_TYPE1_H
#define UPCIE_VFIO_TYPE1_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/vfio.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/pci/func.h>

struct upcie_vfio_container {
	int fd;	       /* /dev/vfio/vfio, or -1 */
	int iommu_set; /* VFIO_SET_IOMMU done (after the first group joined) */
};

struct upcie_vfio_group {
	int fd; /* /dev/vfio/<id>, or -1 */
	int id;
	struct upcie_vfio_container *container;
};

struct upcie_vfio_device {
	int fd; /* device fd, or -1 */
	struct upcie_pci_bdf bdf;
	char name[UPCIE_PCI_BDF_STRLEN];
	uint32_t flags;
	uint32_t num_regions;
	uint32_t num_irqs;
};

struct upcie_vfio_region {
	void *addr; /* NULL when not mapped */
	size_t size;
	uint64_t offset; /* offset of the region in the device fd */
	uint32_t flags;	 /* VFIO_REGION_INFO_FLAG_* */
	uint32_t index;
};

/* Open the container and check the API version and type1v2 support. */
static inline int upcie_vfio_container_open(struct upcie_vfio_container *c)
{
	int fd, ver;

	c->fd = -1;
	c->iommu_set = 0;
	fd = open("/dev/vfio/vfio", O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		int err = -errno;

		return UPCIE_FAIL(err, "vfio: open /dev/vfio/vfio: %s (modprobe vfio-pci)",
				  strerror(-err));
	}
	ver = ioctl(fd, VFIO_GET_API_VERSION);
	if (ver != VFIO_API_VERSION) {
		close(fd);
		return UPCIE_FAIL(-EPROTO, "vfio: API version %d, want %d", ver, VFIO_API_VERSION);
	}
	if (ioctl(fd, VFIO_CHECK_EXTENSION, VFIO_TYPE1v2_IOMMU) <= 0) {
		close(fd);
		return UPCIE_FAIL(-EOPNOTSUPP, "vfio: the type1v2 IOMMU backend is not available "
					       "(modprobe vfio_iommu_type1)");
	}
	c->fd = fd;
	return 0;
}

static inline void upcie_vfio_container_close(struct upcie_vfio_container *c)
{
	if (c && c->fd > 0)
		close(c->fd);
	if (c) {
		c->fd = -1;
		c->iommu_set = 0;
	}
}

/*
 * Open IOMMU group `id`, check that it is viable and attach it to the container; the first group
 * attached also selects the type1v2 backend. -ENOENT: no such group; -EBUSY: not viable (some
 * function of the group is still under a kernel driver); -EPERM from VFIO_SET_IOMMU usually means
 * interrupt remapping is missing (QEMU: intel-iommu,intremap=on).
 */
static inline int upcie_vfio_group_open(struct upcie_vfio_group *g, struct upcie_vfio_container *c,
					int id)
{
	struct vfio_group_status st;
	char path[64];
	int fd, err;

	g->fd = -1;
	g->id = id;
	g->container = NULL;
	if (!c || c->fd < 0 || id < 0)
		return UPCIE_FAIL(-EINVAL, "vfio: group %d: invalid container or group id", id);
	snprintf(path, sizeof(path), "/dev/vfio/%d", id);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		return UPCIE_FAIL(err, "vfio: open %s: %s%s", path, strerror(-err),
				  err == -ENOENT ? " (is the function bound to vfio-pci?)" : "");
	}
	memset(&st, 0, sizeof(st));
	st.argsz = sizeof(st);
	if (ioctl(fd, VFIO_GROUP_GET_STATUS, &st)) {
		err = upcie_neg_errno();
		UPCIE_ERR("vfio: group %d: GET_STATUS: %s", id, strerror(-err));
		goto fail;
	}
	if (!(st.flags & VFIO_GROUP_FLAGS_VIABLE)) {
		err = -EBUSY;
		UPCIE_ERR("vfio: group %d is not viable: bind every function in "
			  "/sys/kernel/iommu_groups/%d/devices to vfio-pci",
			  id, id);
		goto fail;
	}
	if (ioctl(fd, VFIO_GROUP_SET_CONTAINER, &c->fd)) {
		err = upcie_neg_errno();
		UPCIE_ERR("vfio: group %d: SET_CONTAINER: %s", id, strerror(-err));
		goto fail;
	}
	if (!c->iommu_set) {
		if (ioctl(c->fd, VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU)) {
			err = upcie_neg_errno();
			UPCIE_ERR("vfio: VFIO_SET_IOMMU(type1v2): %s%s", strerror(-err),
				  err == -EPERM
				      ? " (no interrupt remapping? allow_unsafe_interrupts)"
				      : "");
			ioctl(fd, VFIO_GROUP_UNSET_CONTAINER);
			goto fail;
		}
		c->iommu_set = 1;
	}
	g->fd = fd;
	g->container = c;
	return 0;
fail:
	close(fd);
	return err;
}

static inline void upcie_vfio_group_close(struct upcie_vfio_group *g)
{
	if (g && g->fd > 0) {
		ioctl(g->fd, VFIO_GROUP_UNSET_CONTAINER);
		close(g->fd);
	}
	if (g) {
		g->fd = -1;
		g->container = NULL;
	}
}

/* IOMMU group id of bdf from sysfs: >= 0, or -ENODEV / -ENXIO (function has no IOMMU group). */
static inline int upcie_vfio_group_id(const struct upcie_pci_bdf *bdf)
{
	struct upcie_pci_func fn;
	int err = upcie_pci_func_read(bdf, &fn);

	if (err)
		return err;
	if (fn.iommu_group < 0)
		return UPCIE_FAIL(-ENXIO, "vfio: %s has no IOMMU group (IOMMU disabled?)", fn.name);
	return fn.iommu_group;
}

/* Get the device fd for bdf from an open group. */
static inline int upcie_vfio_device_open(struct upcie_vfio_device *dev, struct upcie_vfio_group *g,
					 const struct upcie_pci_bdf *bdf)
{
	struct vfio_device_info info;
	int fd, err;

	memset(dev, 0, sizeof(*dev));
	dev->fd = -1;
	dev->bdf = *bdf;
	upcie_pci_bdf_format(bdf, dev->name, sizeof(dev->name));
	if (!g || g->fd < 0)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: group not open", dev->name);
	fd = ioctl(g->fd, VFIO_GROUP_GET_DEVICE_FD, dev->name);
	if (fd < 0) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: %s: GET_DEVICE_FD: %s", dev->name, strerror(-err));
	}
	memset(&info, 0, sizeof(info));
	info.argsz = sizeof(info);
	if (ioctl(fd, VFIO_DEVICE_GET_INFO, &info)) {
		err = upcie_neg_errno();
		close(fd);
		return UPCIE_FAIL(err, "vfio: %s: GET_INFO: %s", dev->name, strerror(-err));
	}
	if (!(info.flags & VFIO_DEVICE_FLAGS_PCI)) {
		close(fd);
		return UPCIE_FAIL(-ENODEV, "vfio: %s is not a PCI device", dev->name);
	}
	dev->fd = fd;
	dev->flags = info.flags;
	dev->num_regions = info.num_regions;
	dev->num_irqs = info.num_irqs;
	return 0;
}

static inline void upcie_vfio_device_close(struct upcie_vfio_device *dev)
{
	if (dev && dev->fd > 0)
		close(dev->fd);
	if (dev)
		dev->fd = -1;
}

/* Region info of region `index` (VFIO_PCI_BAR0_REGION_INDEX.., VFIO_PCI_CONFIG_REGION_INDEX). */
static inline int upcie_vfio_region_info(const struct upcie_vfio_device *dev, uint32_t index,
					 struct vfio_region_info *info)
{
	memset(info, 0, sizeof(*info));
	info->argsz = sizeof(*info);
	info->index = index;
	if (index >= dev->num_regions)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: region %u out of range (%u regions)",
				  dev->name, index, dev->num_regions);
	if (ioctl(dev->fd, VFIO_DEVICE_GET_REGION_INFO, info)) {
		int err = upcie_neg_errno();

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
		err = -errno;
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
	int err = upcie_vfio_region_info(dev, index, &info);

	if (err)
		return err;
	if (off > info.size || len > info.size - off)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: region %u access [0x%llx, +%zu) out of range",
				  dev->name, index, (unsigned long long)off, len);
	n = write ? pwrite(dev->fd, buf, len, (off_t)(info.offset + off))
		  : pread(dev->fd, buf, len, (off_t)(info.offset + off));
	if (n < 0)
		return UPCIE_FAIL(-errno, "vfio: %s: region %u %s: %s", dev->name, index,
				  write ? "write" : "read", strerror(errno));
	return (size_t)n == len ? 0 : -EIO;
}

/* Map [vaddr, vaddr+size) at iova in the container's IOMMU domain, readable and writable. */
static inline int upcie_vfio_dma_map(struct upcie_vfio_container *c, void *vaddr, uint64_t size,
				     uint64_t iova)
{
	struct vfio_iommu_type1_dma_map map;

	memset(&map, 0, sizeof(map));
	map.argsz = sizeof(map);
	map.flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE;
	map.vaddr = (uintptr_t)vaddr;
	map.size = size;
	map.iova = iova;
	if (ioctl(c->fd, VFIO_IOMMU_MAP_DMA, &map)) {
		int err = upcie_neg_errno();

		return UPCIE_FAIL(err, "vfio: MAP_DMA iova=0x%llx size=0x%llx: %s%s",
				  (unsigned long long)iova, (unsigned long long)size,
				  strerror(-err),
				  err == -ENOMEM ? " (RLIMIT_MEMLOCK too low? ulimit -l)" : "");
	}
	return 0;
}

static inline int upcie_vfio_dma_unmap(struct upcie_vfio_container *c, uint64_t size, uint64_t iova)
{
	struct vfio_iommu_type1_dma_unmap unmap;

	memset(&unmap, 0, sizeof(unmap));
	unmap.argsz = sizeof(unmap);
	unmap.size = size;
	unmap.iova = iova;
	if (ioctl(c->fd, VFIO_IOMMU_UNMAP_DMA, &unmap)) {
		int err = upcie_neg_errno();

		return UPCIE_FAIL(err, "vfio: UNMAP_DMA iova=0x%llx: %s", (unsigned long long)iova,
				  strerror(-err));
	}
	return unmap.size == size ? 0 : -EIO;
}

#endif /* UPCIE_VFIO_TYPE1_H */
