/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * UAPI of the iommu_map_pa module (/dev/iommu_map_pa, package upcie-iommu-map-pa-dkms): map known
 * physical pages into the IOMMU domain of a PCI function.
 *
 * One file serves the module and user space: the module compiles it from its own tree, upcie's
 * wrapper (upcie/kmod/iommu_map_pa.h) includes it as upcie/kmod/uapi/iommu_map_pa.h, which in
 * the upcie tree is a symbolic link to this file and is installed from it.
 *
 * MAP puts a list of physical pages at a caller-chosen IOVA into the domain of a function whose
 * DMA user space owns (bound to vfio-pci, attached to a vfio type1 container or an iommufd IOAS).
 * The caller proves it owns that domain with the function's open vfio device descriptor
 * (owner_fd: from VFIO_GROUP_GET_DEVICE_FD, or the /dev/vfio/devices/vfioN cdev bound to
 * iommufd), which the module keeps open while the mapping exists: a type1 container cannot
 * drop its domain while one of its devices is open. The pages must be device memory of a named
 * source function: inside one of its assigned memory BARs, outside its MSI-X table and pending
 * bit array (so never system RAM, persistent memory or another device's registers). A function
 * under a kernel driver is refused. The range must lie inside the domain's aperture, outside
 * its reserved regions, and be unmapped: a page the domain already translates, at the domain's
 * smallest page size, is EEXIST. One exception makes several controllers cheap: when two
 * functions share a domain (one type1 container, one IOAS) a second MAP of exactly the same
 * pages at the same IOVA through the same file returns a new handle for the existing mapping,
 * which goes when its last handle does.
 *
 * MAP_BAR installs an identity mapping (IOVA = the BAR's bus address) of a range of one
 * function's BAR into the kernel DMA domain (DMA or DMA-FQ) of another, the target: how a GPU's
 * peer-to-peer writes to an NVMe doorbell get through a translating IOMMU. The target must
 * have a driver bound that uses the kernel's DMA API (its GPU driver, uio_pci_generic): that
 * binding is what keeps its kernel DMA domain (with no driver bound a write of the IOMMU
 * group's sysfs type frees it, unnoticed; vfio-pci and pci-stub do not hold it), and the
 * mapping goes when that driver unbinds (the handle then answers only UNMAP). The BAR must be
 * assigned, the range clear of the source's MSI-X table and pending bit array, and inside a
 * memory window of the target's host bridge, which the kernel's DMA IOVA allocator reserves for
 * the target (so it never hands these IOVAs out itself); outside them only with
 * UPCIE_IOMMU_MAP_PA_F_OUTSIDE_WINDOW. Declined with EEXIST when any page of the range is
 * already translated, unless UPCIE_IOMMU_MAP_PA_F_SHARE is given and every page is already
 * identity-mapped: the mapping is then someone else's (an earlier opener of the same controller
 * for the same GPU), the handle borrows it and unmapping the handle leaves it.
 *
 * Mappings belong to the open file: UNMAP ends one, closing the file ends all. Functions are
 * pinned while mapped. The owner of a user domain must keep it attached while mappings exist;
 * the module never touches a domain the function is no longer attached to (see the module's
 * README). Needs CAP_SYS_ADMIN. Reserved fields must be zero; unknown requests are ENOTTY.
 */
#ifndef UPCIE_KMOD_UAPI_IOMMU_MAP_PA_H
#define UPCIE_KMOD_UAPI_IOMMU_MAP_PA_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define UPCIE_IOMMU_MAP_PA_DEVICE "/dev/iommu_map_pa"
#define UPCIE_IOMMU_MAP_PA_ABI	  3

/*
 * Identity: the module's read-only parameter /sys/module/iommu_map_pa/parameters/abi reads
 * "upcie-iommu_map_pa <ABI>". Another project ships a module of the same name and device
 * node with another interface (uPCIe's upcie-experimental-dkms): user space reads this before
 * opening the device, and a module without it is not this one.
 */
#define UPCIE_IOMMU_MAP_PA_IDENT "upcie-iommu_map_pa"

/* A PCI function: segment (domain), bus, device/function number. */
struct upcie_iommu_map_pa_pci {
	__u32 segment;
	__u8 bus;
	__u8 devfn; /* device << 3 | function */
	__u16 reserved;
};

#define UPCIE_IOMMU_MAP_PA_READ	 (1u << 0) /* the device may read */
#define UPCIE_IOMMU_MAP_PA_WRITE (1u << 1) /* the device may write */

/*
 * MAP: `npages` pages of `page_size` bytes (a power of two, at least the CPU and the IOMMU page
 * size), physical addresses at user pointer `pages` (npages __u64, each page_size aligned), at
 * IOVA `iova` (page_size aligned), into the domain of function `pci`, whose open vfio device
 * descriptor is `owner_fd`. Every page lies in a memory BAR of function `source`. prot 0 means
 * read and write.
 * `lifetime_fd` names the dma-buf the pages belong to (the GPU memory dmabuf_import resolved):
 * the module attaches it for its own device (addresses: CPU physical), pins it where the
 * exporter has a pin op (else the exporter must be listed in the module parameter
 * static_exporters: one that never moves or revokes a buffer), checks that every page lies in
 * its scatter list, and keeps the pin and a reference until the handle goes: the memory cannot
 * move or be freed under the mapping, whatever else the caller closes first. Should an
 * exporter revoke it anyway, the mapping is removed at once (the handle then answers only
 * UNMAP). -1 with flag UPCIE_IOMMU_MAP_PA_F_RAW_PAGES maps the pages with nothing keeping the
 * memory behind them: the caller alone must keep it in place (and the memory's owner must not
 * reuse it) until UNMAP; a device may otherwise reach whatever is put there next.
 * Errors: EPERM (function not owned by user space; a page outside the source's BARs or in its
 * MSI-X structures; the domain is the blocking one: the owner detached the device), EBADF
 * (owner_fd not open), EACCES (owner_fd is not this function's vfio device, or one vfio has not
 * granted access to: a cdev opened but not bound), EAGAIN (another domain was attached while the
 * request ran: nothing mapped), ENODEV (no such function, or no IOMMU translates it), EINVAL (alignment, sizes,
 * flags, reserved fields, lifetime_fd not a dma-buf, lifetime_fd -1 without F_RAW_PAGES or >= 0
 * with it), ENXIO (a page outside the lifetime dma-buf's scatter list), EOPNOTSUPP (its exporter
 * can neither pin nor is listed as static), ESTALE (the exporter took the buffer back while the
 * request ran), E2BIG (npages above max_map_pages, or the range above
 * max_map_bytes), ERANGE (outside the aperture, or a reserved region), EEXIST (a page is already
 * translated, or overlaps a mapping of this file), EMFILE (the file holds max_mappings), ENFILE
 * (all files hold max_total_mappings), EFAULT, ENOMEM, and what iommu_map answers.
 */
struct upcie_iommu_map_pa_map {
	struct upcie_iommu_map_pa_pci pci;    /* in: the function whose domain gets the pages */
	struct upcie_iommu_map_pa_pci source; /* in: the function whose BARs hold the pages */
	__s32 owner_fd;			      /* in: pci's open vfio device */
	__u32 flags;			      /* in: UPCIE_IOMMU_MAP_PA_F_RAW_PAGES or 0 */
	__u32 prot;			      /* in: UPCIE_IOMMU_MAP_PA_READ | _WRITE, 0: both */
	__u32 shared;	   /* out: 1 when the handle joined an existing mapping */
	__u64 iova;	   /* in */
	__u64 page_size;   /* in */
	__u64 npages;	   /* in */
	__u64 pages;	   /* in: user pointer */
	__s32 lifetime_fd; /* in: the pages' dma-buf; -1 only with F_RAW_PAGES */
	__u32 reserved0;
	__u64 handle; /* out */
	__u64 reserved[2];
};

/* MAP flags: raw pages, no lifetime_fd (see MAP). */
#define UPCIE_IOMMU_MAP_PA_F_RAW_PAGES (1u << 2)

/* MAP_BAR flags. */
#define UPCIE_IOMMU_MAP_PA_F_SHARE (1u << 0) /* take an existing identity mapping as borrowed */
/* map outside the target's host-bridge windows, where the kernel's own DMA mappings for the
 * target may later want the same IOVAs: only for a target that makes no such mappings */
#define UPCIE_IOMMU_MAP_PA_F_OUTSIDE_WINDOW (1u << 1)

/* MAP_BAR results. */
#define UPCIE_IOMMU_MAP_PA_BAR_MAPPED	   1 /* installed; UNMAP of the handle removes it */
#define UPCIE_IOMMU_MAP_PA_BAR_BORROWED	   2 /* already identity-mapped (F_SHARE); left alone */
#define UPCIE_IOMMU_MAP_PA_BAR_PASSTHROUGH 3 /* the target's DMA is untranslated: nothing to do */

/* MAP_BAR result flags. */
/* The range lies in a memory window of the target's host bridge, which the kernel's DMA IOVA
 * allocator reserves for the target: the kernel never hands out these IOVAs itself. Without it
 * a later kernel DMA mapping for the target could want them (see the README). */
#define UPCIE_IOMMU_MAP_PA_BAR_IN_HOST_WINDOW (1u << 0)

/*
 * MAP_BAR: identity-map [offset, offset + length) of BAR `bar` of function `source` into the
 * kernel DMA domain of function `target`. length 0: to the end of the BAR. offset and length
 * page aligned. Errors: ENODEV (no such function, or no driver bound to the target), EINVAL
 * (not an assigned memory BAR, range, flags), EPERM (the target's domain is not a kernel DMA
 * domain: user-owned or blocked; its driver manages DMA itself: vfio-pci, pci-stub; the range
 * covers the source's MSI-X table or pending bits, or system RAM), ERANGE (outside the
 * target's host-bridge windows without F_OUTSIDE_WINDOW, outside the aperture, in a reserved
 * region), EEXIST (taken, see above), EAGAIN (another domain was attached while the request
 * ran), EMFILE, ENFILE, ENOMEM, and what iommu_map answers.
 */
struct upcie_iommu_map_pa_map_bar {
	struct upcie_iommu_map_pa_pci target; /* in: the function whose domain gets the mapping */
	struct upcie_iommu_map_pa_pci source; /* in: the function whose BAR is mapped */
	__u32 bar;			      /* in: 0..5 */
	__u32 flags;			      /* in: UPCIE_IOMMU_MAP_PA_F_* */
	__u64 offset;			      /* in */
	__u64 length;			      /* in */
	__u32 prot;			      /* in: 0: read and write */
	__u32 result;			      /* out: UPCIE_IOMMU_MAP_PA_BAR_* */
	__u32 result_flags;		      /* out: UPCIE_IOMMU_MAP_PA_BAR_IN_HOST_WINDOW */
	__u32 reserved0;
	__u64 iova;   /* out: the bus address of the range = its IOVA in the target's domain */
	__u64 size;   /* out: bytes mapped */
	__u64 handle; /* out: 0 for PASSTHROUGH */
	__u64 reserved[2];
};

/*
 * TRANSLATE: what the function's current domain maps `iova` to (iommu_iova_to_phys): `phys` 0
 * when nothing; `domain_type` one of the values below. For tests and diagnostics. A domain user
 * space owns is only read with the function's open vfio device as `owner_fd` (-1: none; then
 * phys, aperture and page sizes stay 0). The function must have a driver bound (ENODEV, as for
 * no such function): the domain is read while that binding is held.
 */
#define UPCIE_IOMMU_MAP_PA_DOMAIN_NONE	    0 /* no IOMMU translates the function */
#define UPCIE_IOMMU_MAP_PA_DOMAIN_BLOCKED   1
#define UPCIE_IOMMU_MAP_PA_DOMAIN_IDENTITY  2
#define UPCIE_IOMMU_MAP_PA_DOMAIN_DMA	    3 /* kernel DMA domain (also DMA-FQ) */
#define UPCIE_IOMMU_MAP_PA_DOMAIN_USER	    4 /* unmanaged, DMA owned by user space (vfio) */
#define UPCIE_IOMMU_MAP_PA_DOMAIN_UNMANAGED 5 /* unmanaged, owned by a kernel driver */
#define UPCIE_IOMMU_MAP_PA_DOMAIN_OTHER	    6

struct upcie_iommu_map_pa_translate {
	struct upcie_iommu_map_pa_pci pci; /* in */
	__u64 iova;			   /* in */
	__u64 phys;			   /* out */
	__u32 domain_type;		   /* out */
	__s32 owner_fd;			   /* in: for a user-owned domain, -1 none */
	__u64 aperture_start;		   /* out */
	__u64 aperture_end;		   /* out, inclusive */
	__u64 pgsize_bitmap;		   /* out: page sizes the domain supports */
	__u64 reserved[2];
};

/* Module facts: ABI version, limits and live handles over all files. */
struct upcie_iommu_map_pa_info {
	__u32 abi;	    /* out: UPCIE_IOMMU_MAP_PA_ABI */
	__u32 max_mappings; /* out: handles per open file */
	__u64 max_map_pages;
	__u64 mappings; /* out: live handles, all files */
	__u64 reserved[2];
};

#define UPCIE_IOMMU_MAP_PA_IOC_TYPE 0xE7
#define UPCIE_IOMMU_MAP_PA_IOC_INFO                                                                \
	_IOR(UPCIE_IOMMU_MAP_PA_IOC_TYPE, 0x10, struct upcie_iommu_map_pa_info)
#define UPCIE_IOMMU_MAP_PA_IOC_MAP                                                                 \
	_IOWR(UPCIE_IOMMU_MAP_PA_IOC_TYPE, 0x11, struct upcie_iommu_map_pa_map)
/* UNMAP: the argument is a pointer to the __u64 handle. ENOENT when the file has no such one. */
#define UPCIE_IOMMU_MAP_PA_IOC_UNMAP _IOW(UPCIE_IOMMU_MAP_PA_IOC_TYPE, 0x12, __u64)
#define UPCIE_IOMMU_MAP_PA_IOC_MAP_BAR                                                             \
	_IOWR(UPCIE_IOMMU_MAP_PA_IOC_TYPE, 0x13, struct upcie_iommu_map_pa_map_bar)
#define UPCIE_IOMMU_MAP_PA_IOC_TRANSLATE                                                           \
	_IOWR(UPCIE_IOMMU_MAP_PA_IOC_TYPE, 0x14, struct upcie_iommu_map_pa_translate)

#endif /* UPCIE_KMOD_UAPI_IOMMU_MAP_PA_H */
