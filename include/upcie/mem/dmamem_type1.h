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
 * pinned pages (vfio charges them; plain memory allocated here is therefore not mlocked as well,
 * which would charge it twice). The container must outlive the dmamem. A dmamem destroyed after
 * its container's domain went away and came back (the container closed and opened again in the
 * same struct, or all its groups left and one joined again: a device closed and reopened) does
 * not unmap: its IOVA may be a new mapping's by then; the kernel dropped its own mapping with
 * the old domain. Does not: share one mapping between containers (map it once per container).
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
	uint64_t gen;	    /* c->iovas.gen at map time: the domain the mapping lives in */
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
	if (p->c->fd <= 0 || !p->c->iovas.ready || p->c->iovas.gen != p->gen) {
		/* the old domain and its mapping are gone; the IOVA may be someone else's now */
		UPCIE_ERR("dmamem: type1: the container of IOVA 0x%llx (+0x%llx) was closed or "
			  "set up again before this memory was destroyed; not unmapping what may "
			  "now be another mapping (destroy memory before closing its device)",
			  (unsigned long long)p->iova, (unsigned long long)p->len);
	} else if (!upcie_vfio_dma_unmap(p->c, p->len, p->iova)) {
		/* unmap before the IOVA goes back, so no new mapping can meet a stale one */
		upcie_vfio_iova_free(&p->c->iovas, p->iova, p->len);
	} else {
		UPCIE_ERR("dmamem: type1: IOVA 0x%llx stays reserved after the failed unmap",
			  (unsigned long long)p->iova);
	}
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
	p->gen = c->iovas.gen;
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
 * size; UPCIE_HUGEPAGE_PLAIN works too: the kernel pins the pages, so they are not mlocked, and
 * RLIMIT_MEMLOCK is charged once) and map them into container c at an IOVA aligned to the page
 * size: the usual DMA memory under vfio. mem->size is the size rounded up to the page size,
 * mem->fd the memory's file descriptor (owned by the dmamem).
 */
static inline int upcie_dmamem_type1_hugepage(struct upcie_dmamem *mem,
					      struct upcie_vfio_container *c, size_t size,
					      const struct upcie_hugepage_opts *opts)
{
	struct upcie_dmamem_type1_priv_ *p;
	struct upcie_hugepage_opts o;
	uint64_t align;
	int err = upcie_dmamem_type1_args_(mem, c, "type1 hugepage");

	if (err)
		return err;
	if (opts && opts->src == UPCIE_HUGEPAGE_PLAIN && !opts->no_mlock) {
		/* MAP_DMA pins and charges the pages to RLIMIT_MEMLOCK (locked_vm); an mlock
		 * would charge the same pages a second time */
		o = *opts;
		o.no_mlock = true;
		opts = &o;
	}
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
