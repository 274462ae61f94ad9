/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Map a PCI BAR into the process through sysfs (resourceN / resourceN_wc).
 *
 * For functions bound to uio_pci_generic (or unbound); under vfio-pci map BARs through the vfio
 * region API instead (vfio/), since sysfs mappings bypass vfio's ownership. Needs root. Memory BARs
 * only: I/O-port BARs are -EOPNOTSUPP. The write-combining variant is for memory such as an NVMe
 * CMB; never map registers write-combining.
 */
#ifndef UPCIE_PCI_BAR_H
#define UPCIE_PCI_BAR_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/pci/func.h>

#define UPCIE_PCI_BAR_WC 0x1u /* map resourceN_wc (prefetchable BARs only) */

struct upcie_pci_bar {
	void *addr;	/* mapping of the whole BAR; NULL when not mapped */
	size_t size;	/* BAR size in bytes */
	uint64_t phys;	/* CPU physical address of the BAR (sysfs "resource") */
	uint64_t flags; /* UPCIE_PCI_RES_* */
	int index;
};

/*
 * Map BAR `index` (0-5) of bdf into *bar. Returns 0; -EINVAL for an index outside 0-5 or unknown
 * flags; -ENODEV for a missing function; -ENOENT when the BAR is not implemented (also the upper
 * half of a 64-bit BAR); -EOPNOTSUPP for an I/O BAR or WC on a non-prefetchable BAR; -errno from
 * open/mmap (EACCES: needs root).
 */
static inline int upcie_pci_bar_map(const struct upcie_pci_bdf *bdf, int index, unsigned flags,
				    struct upcie_pci_bar *bar)
{
	struct upcie_pci_resource res[UPCIE_PCI_NUM_RES];
	char path[PATH_MAX], attr[32], name[UPCIE_PCI_BDF_STRLEN];
	void *addr;
	int fd, err;

	memset(bar, 0, sizeof(*bar));
	bar->index = -1;
	upcie_pci_bdf_format(bdf, name, sizeof(name));
	if (index < 0 || index >= UPCIE_PCI_NUM_BARS || (flags & ~UPCIE_PCI_BAR_WC))
		return UPCIE_FAIL(-EINVAL, "pci: %s: BAR index %d out of range (0-%d)", name, index,
				  UPCIE_PCI_NUM_BARS - 1);
	err = upcie_pci_func_exists(bdf);
	if (err)
		return err;
	err = upcie_pci_func_resources(bdf, res);
	if (err)
		return UPCIE_FAIL(err, "pci: %s: cannot read resources: %s", name, strerror(-err));
	if (!res[index].size)
		return UPCIE_FAIL(-ENOENT, "pci: %s: BAR%d is not implemented", name, index);
	if (res[index].flags & UPCIE_PCI_RES_IO)
		return UPCIE_FAIL(-EOPNOTSUPP, "pci: %s: BAR%d is an I/O-port BAR", name, index);
	if ((flags & UPCIE_PCI_BAR_WC) && !(res[index].flags & UPCIE_PCI_RES_PREFETCH))
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "pci: %s: BAR%d is not prefetchable; refusing a WC mapping", name,
				  index);
	snprintf(attr, sizeof(attr), "resource%d%s", index,
		 (flags & UPCIE_PCI_BAR_WC) ? "_wc" : "");
	err = upcie_pci_func_path(bdf, attr, path, sizeof(path));
	if (err)
		return err;
	fd = open(path, O_RDWR | O_CLOEXEC | O_SYNC);
	if (fd < 0) {
		err = -errno;
		return UPCIE_FAIL(err, "pci: %s: open %s: %s%s", name, attr, strerror(-err),
				  err == -EACCES ? " (needs root)" : "");
	}
	addr = mmap(NULL, res[index].size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	err = addr == MAP_FAILED ? -errno : 0;
	close(fd); /* the mapping keeps the resource */
	if (err)
		return UPCIE_FAIL(err, "pci: %s: mmap BAR%d (%llu bytes): %s", name, index,
				  (unsigned long long)res[index].size, strerror(-err));
	bar->addr = addr;
	bar->size = res[index].size;
	bar->phys = res[index].start;
	bar->flags = res[index].flags;
	bar->index = index;
	return 0;
}

/* Unmap; a zeroed or already unmapped bar is a no-op. */
static inline void upcie_pci_bar_unmap(struct upcie_pci_bar *bar)
{
	if (bar && bar->addr)
		munmap(bar->addr, bar->size);
	if (bar) {
		memset(bar, 0, sizeof(*bar));
		bar->index = -1;
	}
}

#endif /* UPCIE_PCI_BAR_H */
