/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A peer device's BAR as DMA memory: another device (an NVMe controller) reads and writes a
 * slice of this BAR directly, peer to peer. One constructor per way the DMA-ing device is driven:
 *
 * - uio / no IOMMU (or passthrough): the device sees bus addresses. The address comes from the
 *   peer's sysfs "resource", which lists CPU physical addresses; using them as bus addresses
 *   assumes the host bridge does not translate (true on x86 PCs). It breaks where the bridge
 *   has a CPU-to-bus offset (several arm64, POWER and multi-segment systems), under a translating
 *   IOMMU (the DMA faults; use vfio), and where the root complex or an ACS-enabled switch does not
 *   route peer-to-peer traffic between the two devices (the DMA is dropped or reaches the wrong
 *   target; nothing in software can tell). Translation is arithmetic (a BAR is contiguous).
 * - vfio type1: the BAR slice is mmapped through the peer's vfio device fd and that mapping is
 *   mapped into the container (VFIO_IOMMU_MAP_DMA accepts PFNMAP memory) at an allocated IOVA.
 * - iommufd: the BAR slice is exported as a vfio dma-buf (Linux >= 6.19) and imported with
 *   IOMMU_IOAS_MAP_FILE at an IOVA from the IOAS's allocator; IOMMU_IOAS_MAP of the BAR mmap
 *   is refused (EFAULT), so there is no iommufd way on older kernels (use type1 there).
 *
 * The CPU view (mem->vaddr) is a mapping of the same slice where the BAR can be mmapped, else
 * NULL. Offsets and sizes are page multiples inside the BAR. Needs: root or access to sysfs
 * resources (uio), the peer bound to vfio-pci (type1, iommufd). Does not: check that the platform
 * routes peer-to-peer traffic, or set up the peer device itself.
 */
#ifndef UPCIE_MEM_DMAMEM_BAR_H
#define UPCIE_MEM_DMAMEM_BAR_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <upcie/base/bits.h>
#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>
#include <upcie/mem/dmamem_iommufd.h>
#include <upcie/mem/dmamem_type1.h>
#include <upcie/pci/bar.h>
#include <upcie/vfio/device.h>
#include <upcie/vfio/dmabuf.h>
#include <upcie/vfio/iommufd.h>
#include <upcie/vfio/type1.h>

/* Check offset/size against a BAR of bar_size bytes: page multiples, inside, non-zero. */
static inline int upcie_dmamem_bar_range_(const char *name, uint32_t bar, uint64_t bar_size,
					  uint64_t offset, size_t size)
{
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);

	if (!size || !upcie_is_aligned(offset, pg) || !upcie_is_aligned(size, pg) ||
	    offset > bar_size || size > bar_size - offset)
		return UPCIE_FAIL(-EINVAL,
				  "dmamem: %s BAR%u: slice [0x%" PRIx64
				  ", +0x%zx) must be non-empty, "
				  "page aligned and inside the BAR (0x%" PRIx64 " bytes)",
				  name, bar, offset, size, bar_size);
	return 0;
}

static inline void upcie_dmamem_bar_uio_release_(struct upcie_dmamem *mem)
{
	struct upcie_pci_bar *b = (struct upcie_pci_bar *)mem->priv;

	if (!b)
		return;
	upcie_pci_bar_unmap(b);
	free(b);
	mem->priv = NULL;
}

/*
 * BAR `bar` of `bdf` from `offset`, `size` bytes, for a device that sees bus addresses (uio,
 * no IOMMU): device address = the BAR's sysfs address + offset (see the caveats above). The CPU
 * view maps the BAR through sysfs. Returns 0, -EINVAL, -ENODEV/-ENOENT (no such function or
 * BAR), -EACCES (needs root), -EOPNOTSUPP (I/O BAR). mem is zeroed on failure.
 */
static inline int upcie_dmamem_bar_uio(struct upcie_dmamem *mem, const struct upcie_pci_bdf *bdf,
				       uint32_t bar, uint64_t offset, size_t size)
{
	struct upcie_pci_bar *b;
	char name[UPCIE_PCI_BDF_STRLEN] = "?";
	int err;

	if (!mem)
		return UPCIE_FAIL(-EINVAL, "dmamem: bar uio: NULL dmamem");
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	if (!bdf || bar >= UPCIE_PCI_NUM_BARS)
		return UPCIE_FAIL(-EINVAL, "dmamem: bar uio: NULL address or BAR %u", bar);
	upcie_pci_bdf_format(bdf, name, sizeof(name));
	b = (struct upcie_pci_bar *)calloc(1, sizeof(*b));
	if (!b)
		return UPCIE_FAIL(-ENOMEM, "dmamem: out of host memory");
	err = upcie_pci_bar_map(bdf, (int)bar, 0, b);
	if (err)
		goto fail;
	err = upcie_dmamem_bar_range_(name, bar, b->size, offset, size);
	if (!err && !b->phys)
		err = UPCIE_FAIL(-EINVAL, "dmamem: %s BAR%u has no address in sysfs", name, bar);
	if (!err)
		err =
		    upcie_dmamem_init_arith(mem, (char *)b->addr + offset, size, b->phys + offset);
	if (err) {
		upcie_pci_bar_unmap(b);
		goto fail;
	}
	mem->release = upcie_dmamem_bar_uio_release_;
	mem->priv = b;
	mem->kind = "bar-uio";
	return 0;
fail:
	free(b);
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	return err;
}

/*
 * mmap [offset, +size) of region `bar` of a vfio device into *va. -EOPNOTSUPP when the region
 * cannot be mmapped. Checks the slice against the region.
 */
static inline int upcie_dmamem_bar_mmap_(const struct upcie_vfio_device *dev, uint32_t bar,
					 uint64_t offset, size_t size, void **va)
{
	struct vfio_region_info info;
	void *addr;
	int err;

	*va = NULL;
	if (bar > VFIO_PCI_BAR5_REGION_INDEX)
		return UPCIE_FAIL(-EINVAL, "dmamem: BAR index %u out of range (0-5)", bar);
	err = upcie_vfio_region_info(dev, bar, &info);
	if (err)
		return err;
	if (!info.size)
		return UPCIE_FAIL(-ENOENT, "dmamem: %s BAR%u is not implemented", dev->name, bar);
	err = upcie_dmamem_bar_range_(dev->name, bar, info.size, offset, size);
	if (err)
		return err;
	if (!(info.flags & VFIO_REGION_INFO_FLAG_MMAP))
		return -EOPNOTSUPP;
	addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, dev->fd,
		    (off_t)(info.offset + offset));
	if (addr == MAP_FAILED) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "dmamem: %s: mmap BAR%u [0x%" PRIx64 ", +0x%zx): %s",
				  dev->name, bar, offset, size, strerror(-err));
	}
	*va = addr;
	return 0;
}

/*
 * BAR `bar` of the vfio device `peer` from `offset`, `size` bytes, mapped into type1 container c
 * at an allocated IOVA: the mmap of the slice through the peer's device fd is what gets mapped.
 * The peer's group needs a container (usually the same one c; any works, since only the
 * mapping counts). Returns 0, -EINVAL, -ENOENT (BAR not implemented), -EOPNOTSUPP (BAR cannot be
 * mmapped), -ENOSPC (no IOVA space), or the kernel's error. mem is zeroed on failure.
 */
static inline int upcie_dmamem_bar_type1(struct upcie_dmamem *mem, struct upcie_vfio_container *c,
					 const struct upcie_vfio_device *peer, uint32_t bar,
					 uint64_t offset, size_t size)
{
	struct upcie_dmamem_type1_priv_ *p;
	void *va;
	int err = upcie_dmamem_type1_args_(mem, c, "bar type1");

	if (err)
		return err;
	err = upcie_vfio_device_check_(peer, "bar type1");
	if (err)
		return err;
	err = upcie_dmamem_bar_mmap_(peer, bar, offset, size, &va);
	if (err == -EOPNOTSUPP)
		return UPCIE_FAIL(err, "dmamem: %s BAR%u cannot be mmapped, so type1 cannot map it",
				  peer->name, bar);
	if (err)
		return err;
	p = (struct upcie_dmamem_type1_priv_ *)calloc(1, sizeof(*p));
	if (!p) {
		munmap(va, size);
		return UPCIE_FAIL(-ENOMEM, "dmamem: out of host memory");
	}
	p->hp.fd = -1;
	p->unmap_va = va;
	p->unmap_len = size;
	return upcie_dmamem_type1_setup_(mem, c, va, size, 0, p, "bar-type1");
}

/*
 * BAR `bar` of the vfio device `peer` from `offset`, `size` bytes, exported as a dma-buf
 * (vfio/dmabuf.h) and mapped into `ioas` with IOMMU_IOAS_MAP_FILE at an IOVA from the IOAS's
 * allocator. The peer may be opened through a group or a cdev and need not be attached to this
 * IOAS. mem->fd is the dma-buf (owned by the dmamem); the CPU view is an mmap of the slice
 * through the peer's device fd, or NULL where the BAR cannot be mmapped. Returns 0, -EINVAL, -ENOENT,
 * -ENOTTY/-EOPNOTSUPP (no dma-buf export or import on this kernel, with a message), or the
 * kernel's error. mem is zeroed on failure.
 */
static inline int upcie_dmamem_bar_iommufd(struct upcie_dmamem *mem, struct upcie_vfio_ioas *ioas,
					   const struct upcie_vfio_device *peer, uint32_t bar,
					   uint64_t offset, size_t size)
{
	struct upcie_dmamem_iommufd_priv_ *p;
	void *va = NULL;
	int err = upcie_dmamem_iommufd_args_(mem, ioas, "bar iommufd");
	int fd;

	if (err)
		return err;
	err = upcie_vfio_device_check_(peer, "bar iommufd");
	if (err)
		return err;
	err = upcie_dmamem_bar_mmap_(peer, bar, offset, size, &va);
	if (err && err != -EOPNOTSUPP)
		return err;
	err = upcie_vfio_dmabuf_export(peer, bar, offset, size, &fd);
	if (err) {
		if (va)
			munmap(va, size);
		return err;
	}
	p = upcie_dmamem_iommufd_priv_new_();
	if (!p) {
		close(fd);
		if (va)
			munmap(va, size);
		return UPCIE_FAIL(-ENOMEM, "dmamem: out of host memory");
	}
	p->close_fd = fd;
	p->unmap_va = va;
	p->unmap_len = size;
	return upcie_dmamem_iommufd_setup_(mem, ioas, fd, 0, va, size, 0, p, "bar-iommufd");
}

#endif /* UPCIE_MEM_DMAMEM_BAR_H */
