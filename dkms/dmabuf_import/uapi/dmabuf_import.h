/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * UAPI of the dmabuf_import module (/dev/dmabuf_import, package upcie-dmabuf-import-dkms): import a
 * dma-buf and learn the device addresses of its backing store.
 *
 * One file serves the module and user space: the module compiles it from its own tree, upcie's
 * wrapper (upcie/kmod/dmabuf_import.h) includes it as upcie/kmod/uapi/dmabuf_import.h, which in
 * the upcie tree is a symbolic link to this file and is installed from it.
 *
 * Model. Each ATTACH makes a new attachment of the dma-buf, pins it, maps it for DMA and returns
 * a handle. Attachments belong to the open file (not to a process, not to an fd number): DETACH
 * ends one, closing the file ends all of them; nothing survives the file. Attaching the same
 * dma-buf twice through one file gives two independent attachments and two handles. Handles
 * are per file, start at 1 and are never reused by that file.
 *
 * The device the attachment is made for:
 * - by default the module's own device, which has a 64-bit DMA mask and no IOMMU: the addresses
 *   are CPU physical (bus) addresses, what a controller on uio_pci_generic with the IOMMU off or
 *   in passthrough uses, and what iommu_map_pa maps into a user-owned IOMMU domain;
 * - with UPCIE_DMABUF_IMPORT_F_PCI the named PCI function: the exporter sees the real importer
 *   (exporters that place memory by the peer-to-peer distance between exporter and importer
 *   keep it in device memory only for a PCI importer), and the addresses are right for that
 *   function in its kernel DMA domain (IOVAs under a translating IOMMU). The function must be
 *   bound to uio_pci_generic (unbound, nothing keeps its DMA domain: a write of its IOMMU
 *   group's sysfs type would free it under the attachment), every other function of its IOMMU
 *   group unbound or on uio_pci_generic (a PCIe port may be on pcieport), in a kernel DMA
 *   domain: under vfio-pci the addresses would belong to a domain the function is not attached
 *   to, under another kernel driver the domain is that driver's.
 *   A driver binding later in the group, or the function's own driver unbinding, ends the
 *   attachment (GET answers ENODEV). The function's DMA mask is 64 bits while it has
 *   attachments, restored after.
 *
 * The attachment is a dynamic, peer-to-peer capable importer (allow_peer2peer). It pins the
 * buffer where the exporter can (a pin op), so its addresses stay valid until DETACH. An
 * exporter that cannot pin may revoke (vfio-pci's BAR dma-bufs do, on reset, memory disable or
 * close): such a buffer is only attached for a named function, and when the exporter revokes
 * it the module stops that function (bus mastering off) and removes the mapping before the
 * exporter goes on; GET then answers ESTALE. Exporters that never move or revoke a buffer
 * (module parameter static_exporters) are accepted for the module's own device too. Needs
 * CAP_SYS_ADMIN for open, ATTACH and DETACH; GET and INFO change nothing. Refused under kernel
 * lockdown. Every request carries reserved fields that must be zero; unknown requests are
 * ENOTTY.
 */
#ifndef UPCIE_KMOD_UAPI_DMABUF_IMPORT_H
#define UPCIE_KMOD_UAPI_DMABUF_IMPORT_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define UPCIE_DMABUF_IMPORT_DEVICE "/dev/dmabuf_import"
#define UPCIE_DMABUF_IMPORT_ABI	   1

/*
 * Identity: the module's read-only parameter /sys/module/dmabuf_import/parameters/abi reads
 * "upcie-dmabuf_import <ABI>". Another project ships a module of the same name and device
 * node with another interface (uPCIe's upcie-experimental-dkms): user space reads this before
 * opening the device, and a module without it is not this one.
 */
#define UPCIE_DMABUF_IMPORT_IDENT "upcie-dmabuf_import"

/* One segment of the scatter list: `len` bytes at device address `addr`, in buffer order. */
struct upcie_dmabuf_import_seg {
	__u64 addr;
	__u64 len;
};

/* Attach for the PCI function in `pci` instead of the module's own device. */
#define UPCIE_DMABUF_IMPORT_F_PCI (1u << 0)

/* A PCI function: segment (domain), bus, device/function number. */
struct upcie_dmabuf_import_pci {
	__u32 segment;
	__u8 bus;
	__u8 devfn; /* device << 3 | function */
	__u16 reserved;
};

/*
 * ATTACH: attach dmabuf_fd, map it, and copy up to `cap` segments to `segs`. `nsegs` is always
 * the full count: when it exceeds cap the attachment exists all the same and GET reads the rest.
 * Errors: EBADF (not an fd), EINVAL (not a dma-buf, reserved bits, cap without segs), EMFILE
 * (the file holds max_attachments), ENFILE (all files hold max_total_attachments), EDQUOT (all
 * attachments would pin more than max_total_mib), EBUSY (the function or its group is owned by
 * user space or a kernel driver, or not in a kernel DMA domain), ENODEV (no such function, no
 * driver bound to it, it is being removed, or the exporter revoked the buffer meanwhile),
 * EOPNOTSUPP (an exporter
 * that may revoke, for the module's own device; DMA to this device would bounce), and what the
 * exporter answers (e.g. EINVAL, ENOMEM, EREMOTEIO for an impossible peer-to-peer path).
 */
struct upcie_dmabuf_import_attach {
	__s32 dmabuf_fd;		    /* in */
	__u32 flags;			    /* in: UPCIE_DMABUF_IMPORT_F_* */
	struct upcie_dmabuf_import_pci pci; /* in, with UPCIE_DMABUF_IMPORT_F_PCI */
	__u64 segs;   /* in: user pointer to cap segments, may be 0 when cap is 0 */
	__u32 cap;    /* in */
	__u32 nsegs;  /* out: segments in the scatter list */
	__u64 size;   /* out: the dma-buf's size in bytes */
	__u64 handle; /* out */
	__u64 reserved[2];
};

/*
 * GET: copy segments [first, first + cap) of an attachment; `nsegs` returns the full count.
 * Errors: ENOENT (no such handle in this file), ENODEV (the function went away or a driver bound
 * in its group), ESTALE (the exporter revoked the buffer; the function was stopped and the
 * addresses are no longer valid), EINVAL.
 */
struct upcie_dmabuf_import_get {
	__u64 handle; /* in */
	__u64 segs;   /* in: user pointer */
	__u32 first;  /* in */
	__u32 cap;    /* in */
	__u32 nsegs;  /* out */
	__u32 reserved;
};

/* Module facts: ABI version and this module's live attachments over all files. */
struct upcie_dmabuf_import_info {
	__u32 abi;	       /* out: UPCIE_DMABUF_IMPORT_ABI */
	__u32 max_attachments; /* out: per open file */
	__u64 attachments;     /* out: live attachments, all files */
	__u64 reserved[2];
};

#define UPCIE_DMABUF_IMPORT_IOC_TYPE 0xE7
#define UPCIE_DMABUF_IMPORT_IOC_INFO                                                               \
	_IOR(UPCIE_DMABUF_IMPORT_IOC_TYPE, 0x00, struct upcie_dmabuf_import_info)
#define UPCIE_DMABUF_IMPORT_IOC_ATTACH                                                             \
	_IOWR(UPCIE_DMABUF_IMPORT_IOC_TYPE, 0x01, struct upcie_dmabuf_import_attach)
#define UPCIE_DMABUF_IMPORT_IOC_GET                                                                \
	_IOWR(UPCIE_DMABUF_IMPORT_IOC_TYPE, 0x02, struct upcie_dmabuf_import_get)
/* DETACH: the argument is a pointer to the __u64 handle. ENOENT when the file has no such one,
 * EPERM without CAP_SYS_ADMIN. */
#define UPCIE_DMABUF_IMPORT_IOC_DETACH _IOW(UPCIE_DMABUF_IMPORT_IOC_TYPE, 0x03, __u64)

#endif /* UPCIE_KMOD_UAPI_DMABUF_IMPORT_H */
