/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Export a slice of a vfio-pci device's BAR as a dma-buf (VFIO_DEVICE_FEATURE with the DMA_BUF
 * feature): the way to give another device's IOMMU domain access to that BAR under iommufd,
 * which refuses to pin a BAR's mmap (PFNMAP) but imports this dma-buf with IOMMU_IOAS_MAP_FILE
 * (vfio/iommufd.h, mem/dmamem_bar.h).
 *
 * Needs: Linux >= 6.19 with CONFIG_VFIO_PCI_DMABUF (Debian's 7.x kernels have it; the device may
 * be opened through a type1 group or a cdev) and a memory BAR. Older kernels answer -ENOTTY, and
 * devices whose vfio driver cannot export answer -EOPNOTSUPP; both come with a message. The
 * dma-buf cannot be mmapped (the kernel answers EINVAL): use the region mmap for CPU access.
 * The kernel revokes the dma-buf when the device is reset or its memory decoding is disabled.
 * Does not: export several ranges in one dma-buf (iommufd imports single-range ones only).
 */
#ifndef UPCIE_VFIO_DMABUF_H
#define UPCIE_VFIO_DMABUF_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/vfio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <upcie/base/bits.h>
#include <upcie/base/log.h>
#include <upcie/vfio/device.h>
#include <upcie/vfio/uapi.h>

/*
 * The VFIO_DEVICE_FEATURE argument: struct vfio_device_feature, then the DMA_BUF feature with one
 * range. Built in a byte buffer because both headers end in flexible arrays, which C++ does not
 * allow inside another struct.
 */
#define UPCIE_VFIO_DMABUF_ARG_DB_ sizeof(struct vfio_device_feature)
#define UPCIE_VFIO_DMABUF_ARG_RANGE_                                                               \
	(UPCIE_VFIO_DMABUF_ARG_DB_ + sizeof(struct upcie_vfio_device_feature_dma_buf))
#define UPCIE_VFIO_DMABUF_ARG_LEN_                                                                 \
	(UPCIE_VFIO_DMABUF_ARG_RANGE_ + sizeof(struct upcie_vfio_region_dma_range))

union upcie_vfio_dmabuf_arg_ {
	uint64_t align;
	unsigned char b[UPCIE_VFIO_DMABUF_ARG_LEN_];
};

static inline void upcie_vfio_dmabuf_arg_fill_(union upcie_vfio_dmabuf_arg_ *a, uint32_t flags,
					       const struct upcie_vfio_device_feature_dma_buf *db,
					       const struct upcie_vfio_region_dma_range *range)
{
	struct vfio_device_feature feat;

	memset(a, 0, sizeof(*a));
	memset(&feat, 0, sizeof(feat));
	feat.argsz = (uint32_t)UPCIE_VFIO_DMABUF_ARG_LEN_;
	feat.flags = flags;
	memcpy(a->b, &feat, sizeof(feat));
	if (db)
		memcpy(a->b + UPCIE_VFIO_DMABUF_ARG_DB_, db, sizeof(*db));
	if (range)
		memcpy(a->b + UPCIE_VFIO_DMABUF_ARG_RANGE_, range, sizeof(*range));
}

static inline int upcie_vfio_dmabuf_explain_(const struct upcie_vfio_device *dev, int err,
					     const char *what)
{
	char kv[128];

	upcie_vfio_kernel_(kv, sizeof(kv));
	if (err == -ENOTTY)
		return UPCIE_FAIL(err,
				  "vfio: %s: %s: Linux %s has no vfio BAR dma-buf export "
				  "(VFIO_DEVICE_FEATURE_DMA_BUF needs Linux >= 6.19 with "
				  "CONFIG_VFIO_PCI_DMABUF); map the BAR through vfio type1 instead",
				  dev->name, what, kv);
	if (err == -EOPNOTSUPP)
		return UPCIE_FAIL(err,
				  "vfio: %s: %s: the device's vfio driver does not export dma-bufs "
				  "(Linux %s)",
				  dev->name, what, kv);
	return UPCIE_FAIL(err, "vfio: %s: %s: %s", dev->name, what, strerror(-err));
}

/*
 * 0 when the kernel can export dma-bufs of this device's BARs; otherwise -ENOTTY (kernel too
 * old), -EOPNOTSUPP (driver cannot), with a message.
 */
static inline int upcie_vfio_dmabuf_probe(const struct upcie_vfio_device *dev)
{
	union upcie_vfio_dmabuf_arg_ a;
	int err = upcie_vfio_device_check_(dev, "dma-buf probe");

	if (err)
		return err;
	upcie_vfio_dmabuf_arg_fill_(&a,
				    VFIO_DEVICE_FEATURE_PROBE | VFIO_DEVICE_FEATURE_GET |
					UPCIE_VFIO_DEVICE_FEATURE_DMA_BUF,
				    NULL, NULL);
	if (ioctl(dev->fd, VFIO_DEVICE_FEATURE, a.b))
		return upcie_vfio_dmabuf_explain_(dev, upcie_neg_errno(), "dma-buf probe");
	return 0;
}

/*
 * Export [offset, offset+length) of BAR `bar` (0-5) as a new dma-buf; *fd receives it (O_RDWR,
 * close-on-exec; the caller closes it). offset and length must be page aligned and inside the
 * BAR. Returns 0, -EINVAL (bad arguments), -ENOENT (BAR not implemented), -ENOTTY/-EOPNOTSUPP
 * (no export on this kernel or device), or the kernel's error.
 */
static inline int upcie_vfio_dmabuf_export(const struct upcie_vfio_device *dev, uint32_t bar,
					   uint64_t offset, uint64_t length, int *fd)
{
	struct upcie_vfio_device_feature_dma_buf db;
	struct upcie_vfio_region_dma_range range;
	union upcie_vfio_dmabuf_arg_ a;
	struct vfio_region_info info;
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
	int err, nfd;

	if (fd)
		*fd = -1;
	err = upcie_vfio_device_check_(dev, "dma-buf export");
	if (err)
		return err;
	if (!fd || bar > VFIO_PCI_BAR5_REGION_INDEX)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: dma-buf export: bad BAR %u or NULL fd",
				  dev->name, bar);
	if (!length || !upcie_is_aligned(offset, pg) || !upcie_is_aligned(length, pg))
		return UPCIE_FAIL(-EINVAL,
				  "vfio: %s: dma-buf export of BAR%u [0x%" PRIx64 ", +0x%" PRIx64
				  "): offset and length must be non-zero multiples of 0x%" PRIx64,
				  dev->name, bar, offset, length, pg);
	err = upcie_vfio_region_info(dev, bar, &info);
	if (err)
		return err;
	if (!info.size)
		return UPCIE_FAIL(-ENOENT, "vfio: %s: BAR%u is not implemented", dev->name, bar);
	if (offset > info.size || length > info.size - offset)
		return UPCIE_FAIL(-EINVAL,
				  "vfio: %s: dma-buf export [0x%" PRIx64 ", +0x%" PRIx64
				  ") outside BAR%u (0x%llx bytes)",
				  dev->name, offset, length, bar, (unsigned long long)info.size);
	memset(&db, 0, sizeof(db));
	db.region_index = bar;
	db.open_flags = O_RDWR | O_CLOEXEC;
	db.nr_ranges = 1;
	range.offset = offset;
	range.length = length;
	upcie_vfio_dmabuf_arg_fill_(&a, VFIO_DEVICE_FEATURE_GET | UPCIE_VFIO_DEVICE_FEATURE_DMA_BUF,
				    &db, &range);
	nfd = upcie_vfio_fd_not_zero_(ioctl(dev->fd, VFIO_DEVICE_FEATURE, a.b));
	if (nfd < 0)
		return upcie_vfio_dmabuf_explain_(dev, upcie_neg_errno(), "dma-buf export");
	*fd = nfd;
	return 0;
}

#endif /* UPCIE_VFIO_DMABUF_H */
