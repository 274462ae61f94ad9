/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Kernel UAPI definitions that older system headers lack: iommufd (linux/iommufd.h, Linux 6.2+),
 * the vfio device cdev ioctls (6.6+), IOMMU_IOAS_MAP_FILE (6.13+) and the vfio BAR dma-buf export
 * feature (6.19+). Debian bookworm's linux-libc-dev (6.1) has none of them.
 *
 * Every name carries the upcie prefix (IOMMU_IOAS_MAP is UPCIE_IOMMU_IOAS_MAP, struct
 * iommu_ioas_map is struct upcie_iommu_ioas_map), so these never clash with a newer system
 * header included in the same translation unit. Numbers and layouts are the kernel's;
 * scripts/check-uapi.sh compares every one of them against a current linux-libc-dev. Reserved
 * fields are named `reserved` rather than the kernel's `__reserved`. Defining a request here does
 * not make the running kernel support it: the wrappers in vfio/ turn ENOTTY and friends into
 * messages naming the kernel version needed.
 */
#ifndef UPCIE_VFIO_UAPI_H
#define UPCIE_VFIO_UAPI_H

#include <upcie/base/feature.h>

#include <linux/types.h>
#include <linux/vfio.h>
#include <sys/ioctl.h>

/* --- iommufd (/dev/iommu) ------------------------------------------------------------------ */

#define UPCIE_IOMMUFD_TYPE ';'

#define UPCIE_IOMMUFD_CMD_DESTROY	   0x80
#define UPCIE_IOMMUFD_CMD_IOAS_ALLOC	   0x81
#define UPCIE_IOMMUFD_CMD_IOAS_ALLOW_IOVAS 0x82
#define UPCIE_IOMMUFD_CMD_IOAS_COPY	   0x83
#define UPCIE_IOMMUFD_CMD_IOAS_IOVA_RANGES 0x84
#define UPCIE_IOMMUFD_CMD_IOAS_MAP	   0x85
#define UPCIE_IOMMUFD_CMD_IOAS_UNMAP	   0x86
#define UPCIE_IOMMUFD_CMD_OPTION	   0x87
#define UPCIE_IOMMUFD_CMD_IOAS_MAP_FILE	   0x8f

struct upcie_iommu_destroy {
	__u32 size;
	__u32 id;
};
#define UPCIE_IOMMU_DESTROY _IO(UPCIE_IOMMUFD_TYPE, UPCIE_IOMMUFD_CMD_DESTROY)

struct upcie_iommu_ioas_alloc {
	__u32 size;
	__u32 flags;
	__u32 out_ioas_id;
};
#define UPCIE_IOMMU_IOAS_ALLOC _IO(UPCIE_IOMMUFD_TYPE, UPCIE_IOMMUFD_CMD_IOAS_ALLOC)

/* Inclusive range: `last` is the last usable byte. */
struct upcie_iommu_iova_range {
	__aligned_u64 start;
	__aligned_u64 last;
};

struct upcie_iommu_ioas_iova_ranges {
	__u32 size;
	__u32 ioas_id;
	__u32 num_iovas; /* in: entries at allowed_iovas; out: entries the IOAS has */
	__u32 reserved;
	__aligned_u64 allowed_iovas; /* user pointer to struct upcie_iommu_iova_range[] */
	__aligned_u64 out_iova_alignment;
};
#define UPCIE_IOMMU_IOAS_IOVA_RANGES _IO(UPCIE_IOMMUFD_TYPE, UPCIE_IOMMUFD_CMD_IOAS_IOVA_RANGES)

struct upcie_iommu_ioas_allow_iovas {
	__u32 size;
	__u32 ioas_id;
	__u32 num_iovas;
	__u32 reserved;
	__aligned_u64 allowed_iovas;
};
#define UPCIE_IOMMU_IOAS_ALLOW_IOVAS _IO(UPCIE_IOMMUFD_TYPE, UPCIE_IOMMUFD_CMD_IOAS_ALLOW_IOVAS)

/* Flags of IOAS_MAP, IOAS_MAP_FILE and IOAS_COPY. */
#define UPCIE_IOMMU_IOAS_MAP_FIXED_IOVA (1u << 0)
#define UPCIE_IOMMU_IOAS_MAP_WRITEABLE	(1u << 1)
#define UPCIE_IOMMU_IOAS_MAP_READABLE	(1u << 2)

struct upcie_iommu_ioas_map {
	__u32 size;
	__u32 flags;
	__u32 ioas_id;
	__u32 reserved;
	__aligned_u64 user_va;
	__aligned_u64 length;
	__aligned_u64 iova; /* in with FIXED_IOVA, else out */
};
#define UPCIE_IOMMU_IOAS_MAP _IO(UPCIE_IOMMUFD_TYPE, UPCIE_IOMMUFD_CMD_IOAS_MAP)

/* Linux 6.13+: memfd; 6.19+ also single-range vfio-pci BAR dma-bufs. */
struct upcie_iommu_ioas_map_file {
	__u32 size;
	__u32 flags;
	__u32 ioas_id;
	__s32 fd;
	__aligned_u64 start; /* byte offset into the file */
	__aligned_u64 length;
	__aligned_u64 iova;
};
#define UPCIE_IOMMU_IOAS_MAP_FILE _IO(UPCIE_IOMMUFD_TYPE, UPCIE_IOMMUFD_CMD_IOAS_MAP_FILE)

struct upcie_iommu_ioas_copy {
	__u32 size;
	__u32 flags;
	__u32 dst_ioas_id;
	__u32 src_ioas_id;
	__aligned_u64 length;
	__aligned_u64 dst_iova;
	__aligned_u64 src_iova;
};
#define UPCIE_IOMMU_IOAS_COPY _IO(UPCIE_IOMMUFD_TYPE, UPCIE_IOMMUFD_CMD_IOAS_COPY)

struct upcie_iommu_ioas_unmap {
	__u32 size;
	__u32 ioas_id;
	__aligned_u64 iova;
	__aligned_u64 length; /* in: bytes to unmap; out: bytes unmapped */
};
#define UPCIE_IOMMU_IOAS_UNMAP _IO(UPCIE_IOMMUFD_TYPE, UPCIE_IOMMUFD_CMD_IOAS_UNMAP)

#define UPCIE_IOMMU_OPTION_RLIMIT_MODE 0
#define UPCIE_IOMMU_OPTION_HUGE_PAGES  1
#define UPCIE_IOMMU_OPTION_OP_SET      0
#define UPCIE_IOMMU_OPTION_OP_GET      1

struct upcie_iommu_option {
	__u32 size;
	__u32 option_id;
	__u16 op;
	__u16 reserved;
	__u32 object_id;
	__aligned_u64 val64;
};
#define UPCIE_IOMMU_OPTION _IO(UPCIE_IOMMUFD_TYPE, UPCIE_IOMMUFD_CMD_OPTION)

/* --- vfio device cdev (/dev/vfio/devices/vfioN), Linux 6.6+ -------------------------------- */

#define UPCIE_VFIO_DEVICE_BIND_FLAG_TOKEN (1u << 0)

struct upcie_vfio_device_bind_iommufd {
	__u32 argsz;
	__u32 flags;
	__s32 iommufd;
	__u32 out_devid;
	__aligned_u64 token_uuid_ptr; /* with BIND_FLAG_TOKEN (VF token), newer kernels */
};
#define UPCIE_VFIO_DEVICE_BIND_IOMMUFD _IO(VFIO_TYPE, VFIO_BASE + 18)

#define UPCIE_VFIO_DEVICE_ATTACH_PASID (1u << 0)

struct upcie_vfio_device_attach_iommufd_pt {
	__u32 argsz;
	__u32 flags;
	__u32 pt_id; /* in: IOAS or HWPT id; out: the HWPT the device ended up in */
	__u32 pasid;
};
#define UPCIE_VFIO_DEVICE_ATTACH_IOMMUFD_PT _IO(VFIO_TYPE, VFIO_BASE + 19)

#define UPCIE_VFIO_DEVICE_DETACH_PASID (1u << 0)

struct upcie_vfio_device_detach_iommufd_pt {
	__u32 argsz;
	__u32 flags;
	__u32 pasid;
};
#define UPCIE_VFIO_DEVICE_DETACH_IOMMUFD_PT _IO(VFIO_TYPE, VFIO_BASE + 20)

/* --- vfio-pci BAR dma-buf export (VFIO_DEVICE_FEATURE), Linux 6.19+ ----------------------- */

#define UPCIE_VFIO_DEVICE_FEATURE_DMA_BUF 11

struct upcie_vfio_region_dma_range {
	__u64 offset; /* into the region; page aligned */
	__u64 length; /* page aligned, non-zero */
};

/* Follows struct vfio_device_feature in the VFIO_DEVICE_FEATURE argument. */
struct upcie_vfio_device_feature_dma_buf {
	__u32 region_index; /* BAR number */
	__u32 open_flags;   /* O_RDWR, O_CLOEXEC for the new file */
	__u32 flags;	    /* must be 0 */
	__u32 nr_ranges;
	struct upcie_vfio_region_dma_range dma_ranges[];
};

#endif /* UPCIE_VFIO_UAPI_H */
