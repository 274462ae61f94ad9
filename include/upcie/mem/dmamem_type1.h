/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dmamem through a vfio type1 container: CPU memory mapped into the container's IOMMU domain at an
 * IOVA from the container's allocator (vfio/iova.h), so the device sees one contiguous range and
 * translation is arithmetic (iova + offset).
 *
 * Sources: any page-aligned CPU range the kernel can pin (hugepage or memfd memory from
 * mem/hugepage.h, anonymous memory), and a peer device's BAR mmapped through its vfio device fd
 * (type1 maps such PFNMAP ranges; iommufd does not, see mem/dmamem_bar.h). IOVAs come from the
 * ranges the kernel reports, never from physical addresses. upcie_dmamem_destroy() unmaps the
 * IOVA range and returns it to the allocator; memory the constructor allocated is freed too.
 *
 * Needs: a container with at least one group attached (vfio/type1.h), RLIMIT_MEMLOCK for the
 * pinned pages. The container must outlive the dmamem. Does not: share one mapping between
 * containers (map it once per container).
 */
#ifndef UPCIE_MEM_DMAMEM_TYPE1_H
#define UPCIE_MEM_DMAMEM_TYPE1_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <upcie/base/bits.h>
#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>
#include <upcie/mem/hugepage.h>
#include <upcie/vfio/iova.h>
#include <upcie/vfio/type1.h>

/* What the release callback undoes. */
struct upcie_dmamem_type1_priv_ {
	struct upcie_vfio_container *c;
	uint64_t iova, len; /* DMA mapping and IOVA allocation */
	void *unmap_va;	    /* CPU mapping to munmap (a BAR slice), or NULL */
	size_t unmap_len;
	struct upcie_hugepage hp; /* memory the constructor allocated (vaddr NULL: none) */
};

static inline void upcie_dmamem_type1_release_(struct upcie_dmamem *mem)
{
	struct upcie_dmamem_type1_priv_ *p = (struct upcie_dmamem_type1_priv_ *)mem->priv;

	if (!p)
		return;
	/* unmap before the IOVA goes back, so no new mapping can meet a stale one */
	if (!upcie_vfio_dma_unmap(p->c, p->len, p->iova))
		upcie_vfio_iova_free(&p->c->iovas, p->iova, p->len);
	else
		UPCIE_ERR("dmamem: type1: IOVA 0x%llx stays reserved after the failed unmap",
			  (unsigned long long)p->iova);
	if (p->unmap_va)
		munmap(p->unmap_va, p->unmap_len);
	upcie_hugepage_free(&p->hp);
	free(p);
	mem->priv = NULL;
}

/*
 * Map and describe; takes ownership of p (freed on failure, with p->hp and p->unmap_va). mem is
 * zeroed (fd -1) on failure.
 */
static inline int upcie_dmamem_type1_setup_(struct upcie_dmamem *mem,
					    struct upcie_vfio_container *c, void *vaddr,
					    size_t size, uint64_t align,
					    struct upcie_dmamem_type1_priv_ *p, const char *kind)
{
	uint64_t iova = 0;
	int err;

	err = upcie_vfio_iova_alloc(&c->iovas, size, align, &iova);
	if (err)
		goto fail;
	err = upcie_vfio_dma_map(c, vaddr, size, iova);
	if (err) {
		upcie_vfio_iova_free(&c->iovas, iova, size);
		goto fail;
	}
	err = upcie_dmamem_init_arith(mem, vaddr, size, iova);
	if (err) {
		upcie_vfio_dma_unmap(c, size, iova);
		upcie_vfio_iova_free(&c->iovas, iova, size);
		goto fail;
	}
	p->c = c;
	p->iova = iova;
	p->len = size;
	mem->release = upcie_dmamem_type1_release_;
	mem->priv = p;
	mem->kind = kind;
	mem->fd = p->hp.vaddr ? p->hp.fd : -1;
	return 0;
fail:
	if (p->unmap_va)
		munmap(p->unmap_va, p->unmap_len);
	upcie_hugepage_free(&p->hp);
	free(p);
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	return err;
}

static inline int upcie_dmamem_type1_args_(struct upcie_dmamem *mem,
					   const struct upcie_vfio_container *c, const char *what)
{
	if (!mem)
		return UPCIE_FAIL(-EINVAL, "dmamem: %s: NULL dmamem", what);
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	if (!c || c->fd <= 0 || !c->iommu_set || !c->iovas.ready)
		return UPCIE_FAIL(-EINVAL,
				  "dmamem: %s: container not open or no group attached yet", what);
	return 0;
}

/*
 * Map the caller's CPU memory [vaddr, vaddr+size) into container c at a newly allocated IOVA
 * (aligned to `align`, a power of two; 0: natural alignment up to 1 GiB) and describe it in mem
 * as arithmetic memory. vaddr and size must be multiples of the IOMMU page size (the kernel
 * pins whole pages). The memory stays the caller's and must outlive the dmamem. Returns 0,
 * -EINVAL, -ENOSPC (no IOVA space), -ENOMEM, or MAP_DMA's error. mem is zeroed on failure.
 */
static inline int upcie_dmamem_type1_map(struct upcie_dmamem *mem, struct upcie_vfio_container *c,
					 void *vaddr, size_t size, uint64_t align)
{
	struct upcie_dmamem_type1_priv_ *p;
	int err = upcie_dmamem_type1_args_(mem, c, "type1 map");

	if (err)
		return err;
	if (!vaddr || !size || !upcie_is_aligned((uintptr_t)vaddr, c->iovas.pgsize) ||
	    !upcie_is_aligned(size, c->iovas.pgsize))
		return UPCIE_FAIL(-EINVAL,
				  "dmamem: type1 map of %p +%zu: address and size must be non-zero "
				  "multiples of the IOMMU page size 0x%llx",
				  vaddr, size, (unsigned long long)c->iovas.pgsize);
	p = (struct upcie_dmamem_type1_priv_ *)calloc(1, sizeof(*p));
	if (!p)
		return UPCIE_FAIL(-ENOMEM, "dmamem: out of host memory");
	p->hp.fd = -1;
	return upcie_dmamem_type1_setup_(mem, c, vaddr, size, align, p, "type1");
}

/*
 * Allocate `size` bytes with upcie_hugepage_alloc() (opts NULL: hugetlb memfd of the default
 * size; UPCIE_HUGEPAGE_PLAIN works too, the kernel pins the pages) and map them into container c
 * at an IOVA aligned to the page size: the usual DMA memory under vfio. mem->size is the size
 * rounded up to the page size, mem->fd the memory's file descriptor (owned by the dmamem).
 */
static inline int upcie_dmamem_type1_hugepage(struct upcie_dmamem *mem,
					      struct upcie_vfio_container *c, size_t size,
					      const struct upcie_hugepage_opts *opts)
{
	struct upcie_dmamem_type1_priv_ *p;
	uint64_t align;
	int err = upcie_dmamem_type1_args_(mem, c, "type1 hugepage");

	if (err)
		return err;
	p = (struct upcie_dmamem_type1_priv_ *)calloc(1, sizeof(*p));
	if (!p)
		return UPCIE_FAIL(-ENOMEM, "dmamem: out of host memory");
	err = upcie_hugepage_alloc(&p->hp, size, opts);
	if (err) {
		free(p);
		return err;
	}
	align = p->hp.pagesize > UPCIE_VFIO_IOVA_MAX_NATURAL_ALIGN
		    ? UPCIE_VFIO_IOVA_MAX_NATURAL_ALIGN
		    : p->hp.pagesize;
	return upcie_dmamem_type1_setup_(mem, c, p->hp.vaddr, p->hp.size, align, p,
					 "type1-hugepage");
}

#endif /* UPCIE_MEM_DMAMEM_TYPE1_H */
