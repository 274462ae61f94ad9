/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dmamem through an iommufd IOAS: memory mapped into the IOAS at a fixed IOVA from the IOAS's
 * allocator (vfio/iommufd.h: inside the allowed ranges, at or above 4 GiB where possible, never in
 * the first MiB, naturally aligned up to 1 GiB; memory this header allocates is aligned to its
 * page size, so 1 GiB pages can get 1 GiB IOPTEs); translation is arithmetic (iova + offset).
 *
 * Three ways in: a CPU range of this process (IOMMU_IOAS_MAP; Linux 6.2+), a file by descriptor
 * (IOMMU_IOAS_MAP_FILE: a memfd from Linux 6.13, a vfio-pci BAR dma-buf from 6.19; see
 * mem/dmamem_bar.h for the BAR case), and memory this header allocates itself (mem/hugepage.h)
 * and maps either way. Pages mapped from a file are pinned through the file, so the memory
 * needs no CPU mapping and no mlock. upcie_dmamem_destroy() unmaps the IOVA range and frees or
 * closes what the constructor allocated or opened; caller-owned memory and descriptors stay.
 *
 * Needs: an IOAS from upcie_vfio_ioas_alloc() (vfio/iommufd.h) that outlives the dmamem; the
 * device that DMAs attached to it (vfio/cdev.h), before or after mapping. Other mappings in the
 * same IOAS should take their IOVAs from its allocator too (a kernel-chosen one may sit where the
 * allocator hands out next: the fixed map then fails with the kernel's -EEXIST). A dmamem
 * destroyed after its IOAS was destroyed and allocated again in the same struct does not unmap
 * (its IOVA may be the new IOAS's). The kernel's refusals (MAP_FILE on older kernels, a dma-buf
 * it cannot import) come back as its -errno with a message naming the kernel needed.
 */
#ifndef UPCIE_MEM_DMAMEM_IOMMUFD_H
#define UPCIE_MEM_DMAMEM_IOMMUFD_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>
#include <upcie/mem/hugepage.h>
#include <upcie/vfio/iommufd.h>

/* What the release callback undoes. */
struct upcie_dmamem_iommufd_priv_ {
	struct upcie_vfio_ioas *ioas;
	uint64_t gen;	    /* ioas->iovas.gen at map time */
	uint64_t iova, len; /* the mapping and its IOVA allocation; len 0: not mapped */
	void *unmap_va;	    /* CPU mapping to munmap (a BAR slice), or NULL */
	size_t unmap_len;
	int close_fd;		  /* descriptor to close (an exported dma-buf), or -1 */
	struct upcie_hugepage hp; /* memory the constructor allocated (vaddr NULL: none) */
};

static inline void upcie_dmamem_iommufd_release_(struct upcie_dmamem *mem)
{
	struct upcie_dmamem_iommufd_priv_ *p = (struct upcie_dmamem_iommufd_priv_ *)mem->priv;

	if (!p)
		return;
	if (p->len && (p->ioas->fd <= 0 || !p->ioas->iovas.ready || p->ioas->iovas.gen != p->gen))
		UPCIE_ERR(
		    "dmamem: iommufd: the IOAS of IOVA 0x%llx (+0x%llx) was destroyed or "
		    "allocated again before this memory was destroyed; not unmapping what may "
		    "now be another mapping",
		    (unsigned long long)p->iova, (unsigned long long)p->len);
	else if (p->len && !upcie_vfio_ioas_unmap(p->ioas, p->iova, p->len))
		upcie_vfio_ioas_iova_free(p->ioas, p->iova, p->len);
	else if (p->len)
		UPCIE_ERR("dmamem: iommufd: IOVA 0x%llx stays reserved after the failed unmap",
			  (unsigned long long)p->iova);
	if (p->unmap_va)
		munmap(p->unmap_va, p->unmap_len);
	if (p->close_fd > 0)
		close(p->close_fd);
	upcie_hugepage_free(&p->hp);
	free(p);
	mem->priv = NULL;
}

static inline struct upcie_dmamem_iommufd_priv_ *upcie_dmamem_iommufd_priv_new_(void)
{
	struct upcie_dmamem_iommufd_priv_ *p =
	    (struct upcie_dmamem_iommufd_priv_ *)calloc(1, sizeof(*p));

	if (p) {
		p->close_fd = -1;
		p->hp.fd = -1;
	}
	return p;
}

static inline int upcie_dmamem_iommufd_args_(struct upcie_dmamem *mem,
					     const struct upcie_vfio_ioas *ioas, const char *what)
{
	if (!mem)
		return UPCIE_FAIL(-EINVAL, "dmamem: %s: NULL dmamem", what);
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	if (!ioas || ioas->fd <= 0 || !ioas->id)
		return UPCIE_FAIL(-EINVAL, "dmamem: %s: IOAS not allocated", what);
	return 0;
}

/*
 * Map (fd < 0: the CPU range vaddr; else `fd` from `start`) at an IOVA from the IOAS's allocator
 * aligned to `align` (0: natural) and describe; takes ownership of p (released on failure). mem
 * is zeroed (fd -1) on failure.
 */
static inline int upcie_dmamem_iommufd_setup_(struct upcie_dmamem *mem,
					      struct upcie_vfio_ioas *ioas, int fd, uint64_t start,
					      void *vaddr, size_t size, uint64_t align,
					      struct upcie_dmamem_iommufd_priv_ *p,
					      const char *kind)
{
	uint64_t iova = 0;
	int err;

	p->ioas = ioas;
	err = upcie_vfio_ioas_iova_alloc(ioas, size, align, &iova);
	if (err)
		goto fail;
	if (fd >= 0)
		err = upcie_vfio_ioas_map_file(ioas, fd, start, size,
					       UPCIE_VFIO_IOAS_MAP_FIXED_IOVA, &iova);
	else
		err = upcie_vfio_ioas_map(ioas, vaddr, size, UPCIE_VFIO_IOAS_MAP_FIXED_IOVA, &iova);
	if (err) {
		upcie_vfio_ioas_iova_free(ioas, iova, size);
		goto fail;
	}
	p->gen = ioas->iovas.gen;
	p->iova = iova;
	p->len = size;
	err = upcie_dmamem_init_arith(mem, vaddr, size, iova);
	if (err)
		goto fail;
	mem->release = upcie_dmamem_iommufd_release_;
	mem->priv = p;
	mem->kind = kind;
	mem->fd = fd >= 0 ? fd : -1;
	return 0;
fail:
	mem->priv = p;
	upcie_dmamem_iommufd_release_(mem);
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	return err;
}

/*
 * Map the caller's CPU memory [vaddr, vaddr+size) into the IOAS (the kernel pins the pages; BAR
 * mmaps are refused with -EFAULT) and describe it as arithmetic memory. The memory stays the
 * caller's and must outlive the dmamem. mem is zeroed on failure.
 */
static inline int upcie_dmamem_iommufd_map(struct upcie_dmamem *mem, struct upcie_vfio_ioas *ioas,
					   void *vaddr, size_t size)
{
	struct upcie_dmamem_iommufd_priv_ *p;
	int err = upcie_dmamem_iommufd_args_(mem, ioas, "iommufd map");

	if (err)
		return err;
	if (!vaddr || !size)
		return UPCIE_FAIL(-EINVAL, "dmamem: iommufd map of an empty range");
	p = upcie_dmamem_iommufd_priv_new_();
	if (!p)
		return UPCIE_FAIL(-ENOMEM, "dmamem: out of host memory");
	return upcie_dmamem_iommufd_setup_(mem, ioas, -1, 0, vaddr, size, 0, p, "iommufd");
}

/*
 * Map `size` bytes of the caller's file `fd` from byte `start` (a memfd, or a dma-buf the kernel
 * imports) with IOMMU_IOAS_MAP_FILE. vaddr is the caller's CPU view of the same bytes, or NULL.
 * The descriptor stays the caller's (mem->fd shows it; destroy does not close it) and must stay
 * open as long as the dmamem. mem is zeroed on failure.
 */
static inline int upcie_dmamem_iommufd_map_file(struct upcie_dmamem *mem,
						struct upcie_vfio_ioas *ioas, int fd,
						uint64_t start, size_t size, void *vaddr)
{
	struct upcie_dmamem_iommufd_priv_ *p;
	int err = upcie_dmamem_iommufd_args_(mem, ioas, "iommufd map_file");

	if (err)
		return err;
	if (fd < 0 || !size)
		return UPCIE_FAIL(-EINVAL, "dmamem: iommufd map_file: bad fd %d or zero size", fd);
	p = upcie_dmamem_iommufd_priv_new_();
	if (!p)
		return UPCIE_FAIL(-ENOMEM, "dmamem: out of host memory");
	return upcie_dmamem_iommufd_setup_(mem, ioas, fd, start, vaddr, size, 0, p, "iommufd-file");
}

/*
 * Allocate `size` bytes with upcie_hugepage_alloc() and map the memory into the IOAS: through
 * its memfd with IOMMU_IOAS_MAP_FILE when `by_file` (Linux >= 6.13), else through its CPU
 * mapping with IOMMU_IOAS_MAP. opts NULL means a plain memfd without mlock (the IOMMU pins the
 * pages); pass hugepage options for hugetlb memory. mem->size is rounded up to the page size,
 * mem->fd is the memfd (owned by the dmamem). mem is zeroed on failure.
 */
static inline int upcie_dmamem_iommufd_memfd(struct upcie_dmamem *mem, struct upcie_vfio_ioas *ioas,
					     size_t size, const struct upcie_hugepage_opts *opts,
					     bool by_file)
{
	struct upcie_hugepage_opts plain;
	struct upcie_dmamem_iommufd_priv_ *p;
	int err = upcie_dmamem_iommufd_args_(mem, ioas, "iommufd memfd");

	if (err)
		return err;
	if (!opts) {
		memset(&plain, 0, sizeof(plain));
		plain.src = UPCIE_HUGEPAGE_PLAIN;
		plain.no_mlock = true;
		opts = &plain;
	}
	p = upcie_dmamem_iommufd_priv_new_();
	if (!p)
		return UPCIE_FAIL(-ENOMEM, "dmamem: out of host memory");
	err = upcie_hugepage_alloc(&p->hp, size, opts);
	if (err) {
		free(p);
		return err;
	}
	/* hugepages: at least page-aligned so the IOMMU can use pages as large as the CPU's */
	err = upcie_dmamem_iommufd_setup_(
	    mem, ioas, by_file ? p->hp.fd : -1, 0, p->hp.vaddr, p->hp.size,
	    p->hp.pagesize > UPCIE_VFIO_IOVA_MAX_NATURAL_ALIGN ? UPCIE_VFIO_IOVA_MAX_NATURAL_ALIGN
							       : p->hp.pagesize,
	    p, by_file ? "iommufd-memfd" : "iommufd-mem");
	if (!err)
		mem->fd = ((struct upcie_dmamem_iommufd_priv_ *)mem->priv)->hp.fd;
	return err;
}

#endif /* UPCIE_MEM_DMAMEM_IOMMUFD_H */
