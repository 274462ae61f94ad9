/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vfio with the type1 IOMMU backend (VFIO_TYPE1v2_IOMMU): container, groups, devices through a
 * group, the container's IOVA ranges, DMA mappings. Works on every kernel upcie supports (6.1+).
 *
 * Needs: the function bound to vfio-pci, its IOMMU group viable (every function in the group
 * bound to vfio-pci or unbound), read/write access to /dev/vfio/vfio and /dev/vfio/<group>, and
 * RLIMIT_MEMLOCK covering the memory that gets mapped. Several groups (an NVMe controller and a
 * peer device whose BAR receives its DMA) share one container and so one IOVA space.
 * The container carries an IOVA allocator (vfio/iova.h) over the ranges VFIO_IOMMU_GET_INFO
 * reports, refreshed whenever a group joins; mem/dmamem_type1.h maps memory through it. Region,
 * reset and IRQ code works on the device fd and lives in vfio/device.h and vfio/irq.h.
 * Does not: handle the iommufd/cdev path (vfio/cdev.h, vfio/iommufd.h).
 *
 * File descriptors: see vfio/device.h (fd <= 0 in a zeroed struct means "not open").
 */
#ifndef UPCIE_VFIO_TYPE1_H
#define UPCIE_VFIO_TYPE1_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/vfio.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/pci/func.h>
#include <upcie/vfio/device.h>
#include <upcie/vfio/iova.h>

struct upcie_vfio_container {
	int fd;	       /* /dev/vfio/vfio, or -1 */
	int iommu_set; /* VFIO_SET_IOMMU done (after the first group joined) */
	int ngroups;   /* groups attached; the kernel drops the IOMMU with the last one */
	/* IOVAs for mappings into this container; ready once the first group joined */
	struct upcie_vfio_iova_space iovas;
};

struct upcie_vfio_group {
	int fd; /* /dev/vfio/<id>, or -1 */
	int id;
	struct upcie_vfio_container *container;
};

/* What VFIO_IOMMU_GET_INFO says about a type1 container. */
struct upcie_vfio_type1_info {
	uint64_t pgsizes;   /* bitmap of IOMMU page sizes */
	uint32_t dma_avail; /* mappings the container may still create; UINT32_MAX: not reported */
	bool have_ranges;   /* the IOVA-range capability was present */
	struct upcie_vfio_iova_ranges ranges;
};

/* Open the container and check the API version and type1v2 support. */
static inline int upcie_vfio_container_open(struct upcie_vfio_container *c)
{
	int fd, ver;

	if (!c)
		return UPCIE_FAIL(-EINVAL, "vfio: NULL container");
	memset(c, 0, sizeof(*c));
	c->fd = -1;
	fd = upcie_vfio_fd_not_zero_(open("/dev/vfio/vfio", O_RDWR | O_CLOEXEC));
	if (fd < 0) {
		int err = upcie_neg_errno();

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

/* Close the container (the kernel drops its mappings). Zeroed or closed: no-op. */
static inline void upcie_vfio_container_close(struct upcie_vfio_container *c)
{
	if (!c)
		return;
	if (c->fd > 0)
		close(c->fd);
	upcie_vfio_iova_space_fini(&c->iovas);
	c->fd = -1;
	c->iommu_set = 0;
	c->ngroups = 0;
}

static inline int upcie_vfio_container_check_(const struct upcie_vfio_container *c,
					      const char *what)
{
	if (!c || c->fd <= 0)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: container not open", what);
	if (!c->iommu_set)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: no group attached to the container yet",
				  what);
	return 0;
}

/*
 * Parse a VFIO_IOMMU_GET_INFO answer of `len` bytes: page sizes, the IOVA-range capability and
 * the DMA-mapping budget. A capability chain must lie inside the buffer with strictly increasing
 * offsets (the kernel appends capabilities, so a chain that goes back is a loop); anything else
 * is -EPROTO. More ranges than UPCIE_VFIO_IOVA_RANGES_MAX is -E2BIG.
 */
static inline int upcie_vfio_type1_info_parse(const void *buf, size_t len,
					      struct upcie_vfio_type1_info *out)
{
	struct vfio_iommu_type1_info info;
	const unsigned char *p = (const unsigned char *)buf;
	bool seen_avail = false;
	uint32_t off;

	if (!buf || !out)
		return UPCIE_FAIL(-EINVAL, "vfio: type1 info: NULL argument");
	memset(out, 0, sizeof(*out));
	out->dma_avail = UINT32_MAX;
	if (len < sizeof(info))
		return UPCIE_FAIL(-EPROTO, "vfio: type1 info: %zu bytes, want at least %zu", len,
				  sizeof(info));
	memcpy(&info, p, sizeof(info));
	if (info.flags & VFIO_IOMMU_INFO_PGSIZES)
		out->pgsizes = info.iova_pgsizes;
	if (out->pgsizes)
		out->ranges.align = out->pgsizes & (~out->pgsizes + 1); /* lowest set bit */
	if (!(info.flags & VFIO_IOMMU_INFO_CAPS) || !info.cap_offset)
		return 0;
	for (off = info.cap_offset; off;) {
		struct vfio_info_cap_header hdr;

		if (off < sizeof(info) || off > len || len - off < sizeof(hdr))
			return UPCIE_FAIL(-EPROTO,
					  "vfio: type1 info: capability at offset %u outside the "
					  "%zu-byte answer",
					  off, len);
		memcpy(&hdr, p + off, sizeof(hdr));
		if (hdr.next && hdr.next <= off)
			return UPCIE_FAIL(-EPROTO,
					  "vfio: type1 info: capability chain goes back from %u to "
					  "%u (a loop)",
					  off, hdr.next);
		if (hdr.id == VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE) {
			struct vfio_iommu_type1_info_cap_iova_range cap;
			size_t end = hdr.next ? hdr.next : len, need;

			if (end > len)
				end = len;
			if (out->have_ranges)
				return UPCIE_FAIL(-EPROTO,
						  "vfio: type1 info: two IOVA-range capabilities");
			if (end - off < sizeof(cap))
				return UPCIE_FAIL(
				    -EPROTO, "vfio: type1 info: truncated IOVA-range capability");
			memcpy(&cap, p + off, sizeof(cap));
			need = sizeof(cap) + (size_t)cap.nr_iovas * sizeof(struct vfio_iova_range);
			if (cap.nr_iovas > (end - off) / sizeof(struct vfio_iova_range) ||
			    need > end - off)
				return UPCIE_FAIL(
				    -EPROTO,
				    "vfio: type1 info: %u IOVA ranges do not fit in the "
				    "capability at offset %u",
				    cap.nr_iovas, off);
			if (cap.nr_iovas > UPCIE_VFIO_IOVA_RANGES_MAX)
				return UPCIE_FAIL(-E2BIG,
						  "vfio: type1 info: %u IOVA ranges, at most %d "
						  "supported",
						  cap.nr_iovas, UPCIE_VFIO_IOVA_RANGES_MAX);
			for (uint32_t i = 0; i < cap.nr_iovas; i++) {
				struct vfio_iova_range r;

				memcpy(&r, p + off + sizeof(cap) + i * sizeof(r), sizeof(r));
				out->ranges.r[i].start = r.start;
				out->ranges.r[i].last = r.end;
			}
			out->ranges.n = cap.nr_iovas;
			if (upcie_vfio_iova_ranges_check(&out->ranges))
				return UPCIE_FAIL(-EPROTO,
						  "vfio: type1 info: malformed IOVA ranges");
			out->have_ranges = true;
		} else if (hdr.id == VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL) {
			struct vfio_iommu_type1_info_dma_avail cap;

			if (seen_avail || len - off < sizeof(cap) ||
			    (hdr.next && hdr.next - off < sizeof(cap)))
				return UPCIE_FAIL(-EPROTO,
						  "vfio: type1 info: bad DMA-available capability");
			memcpy(&cap, p + off, sizeof(cap));
			out->dma_avail = cap.avail;
			seen_avail = true;
		}
		off = hdr.next;
	}
	return 0;
}

/*
 * VFIO_IOMMU_GET_INFO of the container (a group must have joined): page sizes, IOVA ranges, DMA
 * mapping budget. Returns 0, -EINVAL, -ENOMEM, -EPROTO for a malformed answer, or the ioctl's
 * error.
 */
static inline int upcie_vfio_container_info(const struct upcie_vfio_container *c,
					    struct upcie_vfio_type1_info *out)
{
	struct vfio_iommu_type1_info head;
	unsigned char *buf;
	size_t len;
	int err;

	if (!out)
		return UPCIE_FAIL(-EINVAL, "vfio: container info: NULL output");
	err = upcie_vfio_container_check_(c, "container info");
	if (err)
		return err;
	memset(&head, 0, sizeof(head));
	head.argsz = sizeof(head);
	if (ioctl(c->fd, VFIO_IOMMU_GET_INFO, &head)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: VFIO_IOMMU_GET_INFO: %s", strerror(-err));
	}
	len = head.argsz > sizeof(head) ? head.argsz : sizeof(head);
	/* The capability chain only comes back when argsz covers it: ask again with room. */
	buf = (unsigned char *)calloc(1, len);
	if (!buf)
		return UPCIE_FAIL(-ENOMEM, "vfio: out of memory for %zu bytes of IOMMU info", len);
	((struct vfio_iommu_type1_info *)(void *)buf)->argsz = (uint32_t)len;
	if (len > sizeof(head) && ioctl(c->fd, VFIO_IOMMU_GET_INFO, buf)) {
		err = upcie_neg_errno();
		free(buf);
		return UPCIE_FAIL(err, "vfio: VFIO_IOMMU_GET_INFO (%zu bytes): %s", len,
				  strerror(-err));
	}
	if (len == sizeof(head))
		memcpy(buf, &head, sizeof(head));
	err = upcie_vfio_type1_info_parse(buf, len, out);
	free(buf);
	return err;
}

/* Ranges to allocate from: the reported ones, or 4 KiB pages up to 39 bits when none were. */
static inline int upcie_vfio_container_iova_refresh_(struct upcie_vfio_container *c)
{
	struct upcie_vfio_type1_info info;
	int err = upcie_vfio_container_info(c, &info);

	if (err)
		return err;
	if (!info.have_ranges) {
		UPCIE_WARN("vfio: the kernel reports no IOVA ranges; assuming [0x%" PRIx64
			   ", 0x%" PRIx64 "]",
			   UPCIE_VFIO_IOVA_LOW_LIMIT, UPCIE_VFIO_IOVA_DEFAULT_LAST);
		info.ranges.n = 0;
		upcie_vfio_iova_ranges_add(&info.ranges, 0, UPCIE_VFIO_IOVA_DEFAULT_LAST);
	}
	if (c->iovas.ready)
		return upcie_vfio_iova_space_update(&c->iovas, &info.ranges);
	return upcie_vfio_iova_space_init(&c->iovas, &info.ranges);
}

/*
 * Open IOMMU group `id`, check that it is viable and attach it to the container; the first group
 * attached also selects the type1v2 backend. The container's IOVA allocator then follows the
 * ranges the kernel reports for all its groups. -ENOENT: no such group; -EBUSY: not viable (some
 * function of the group is still under a kernel driver); -EPERM from VFIO_SET_IOMMU usually
 * means interrupt remapping is missing (QEMU: intel-iommu,intremap=on).
 */
static inline int upcie_vfio_group_open(struct upcie_vfio_group *g, struct upcie_vfio_container *c,
					int id)
{
	struct vfio_group_status st;
	char path[64];
	int fd, err;

	if (!g)
		return UPCIE_FAIL(-EINVAL, "vfio: NULL group");
	g->fd = -1;
	g->id = id;
	g->container = NULL;
	if (!c || c->fd <= 0 || id < 0)
		return UPCIE_FAIL(-EINVAL, "vfio: group %d: invalid container or group id", id);
	snprintf(path, sizeof(path), "/dev/vfio/%d", id);
	fd = upcie_vfio_fd_not_zero_(open(path, O_RDWR | O_CLOEXEC));
	if (fd < 0) {
		err = upcie_neg_errno();
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
			goto fail_unset;
		}
		c->iommu_set = 1;
	}
	err = upcie_vfio_container_iova_refresh_(c);
	if (err) {
		UPCIE_ERR("vfio: group %d: cannot take the container's IOVA ranges", id);
		goto fail_unset;
	}
	g->fd = fd;
	g->container = c;
	c->ngroups++;
	return 0;
fail_unset:
	ioctl(fd, VFIO_GROUP_UNSET_CONTAINER);
	if (!c->ngroups) {
		/* that was the only group: the kernel released the container's IOMMU */
		c->iommu_set = 0;
		upcie_vfio_iova_space_fini(&c->iovas);
	}
fail:
	close(fd);
	return err;
}

/*
 * Detach the group from its container and close it. When the last group leaves, the kernel
 * releases the container's IOMMU and with it every mapping; the container's IOVA allocator is
 * reset too, and the next group to join selects the IOMMU again. Zeroed or closed: no-op.
 */
static inline void upcie_vfio_group_close(struct upcie_vfio_group *g)
{
	if (g && g->fd > 0) {
		ioctl(g->fd, VFIO_GROUP_UNSET_CONTAINER);
		close(g->fd);
		if (g->container && g->container->ngroups > 0 && --g->container->ngroups == 0) {
			g->container->iommu_set = 0;
			upcie_vfio_iova_space_fini(&g->container->iovas);
		}
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
	int err;

	if (!bdf)
		return UPCIE_FAIL(-EINVAL, "vfio: group id: NULL address");
	err = upcie_pci_func_read(bdf, &fn);
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
	int fd, err;

	if (!dev || !bdf)
		return UPCIE_FAIL(-EINVAL, "vfio: device open: NULL argument");
	memset(dev, 0, sizeof(*dev));
	dev->fd = -1;
	dev->bdf = *bdf;
	upcie_pci_bdf_format(bdf, dev->name, sizeof(dev->name));
	if (!g || g->fd <= 0)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: group not open", dev->name);
	fd = upcie_vfio_fd_not_zero_(ioctl(g->fd, VFIO_GROUP_GET_DEVICE_FD, dev->name));
	if (fd < 0) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: %s: GET_DEVICE_FD: %s", dev->name, strerror(-err));
	}
	dev->fd = fd;
	err = upcie_vfio_device_info_(dev);
	if (err) {
		close(fd);
		dev->fd = -1;
	}
	return err;
}

/* Map [vaddr, vaddr+size) at iova in the container's IOMMU domain, readable and writable. */
static inline int upcie_vfio_dma_map(struct upcie_vfio_container *c, void *vaddr, uint64_t size,
				     uint64_t iova)
{
	struct vfio_iommu_type1_dma_map map;
	int err = upcie_vfio_container_check_(c, "MAP_DMA");

	if (err)
		return err;
	if (!vaddr || !size)
		return UPCIE_FAIL(-EINVAL, "vfio: MAP_DMA of an empty range");
	memset(&map, 0, sizeof(map));
	map.argsz = sizeof(map);
	map.flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE;
	map.vaddr = (uintptr_t)vaddr;
	map.size = size;
	map.iova = iova;
	if (ioctl(c->fd, VFIO_IOMMU_MAP_DMA, &map)) {
		err = upcie_neg_errno();
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
	int err = upcie_vfio_container_check_(c, "UNMAP_DMA");

	if (err)
		return err;
	if (!size)
		return UPCIE_FAIL(-EINVAL, "vfio: UNMAP_DMA of an empty range");
	memset(&unmap, 0, sizeof(unmap));
	unmap.argsz = sizeof(unmap);
	unmap.size = size;
	unmap.iova = iova;
	if (ioctl(c->fd, VFIO_IOMMU_UNMAP_DMA, &unmap)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: UNMAP_DMA iova=0x%llx: %s", (unsigned long long)iova,
				  strerror(-err));
	}
	return unmap.size == size ? 0 : -EIO;
}

#endif /* UPCIE_VFIO_TYPE1_H */
