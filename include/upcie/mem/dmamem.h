/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dmamem: one object for every kind of memory a device can DMA to or from.
 *
 * A dmamem is an optional CPU view, a size, and a translator from byte offsets to device (bus)
 * addresses. The translator is either arithmetic (one base IOVA, for memory mapped contiguously
 * into an IOMMU domain) or a LUT (one device address per granule, for memory the device sees by
 * physical or bus address: hugepages under uio, a dma-buf's scatter list, a peer BAR). Translation
 * is one add or one table lookup. Constructors for the concrete sources live in other mem/
 * headers; they fill this object and set `release` so upcie_dmamem_destroy() undoes them.
 *
 * A dmamem is immutable after construction and may be translated from any thread; creating and
 * destroying it are the owner's business. It may be moved by value (upcie_dmamem_move()) until
 * something holds it by address (a heap does): `release` works from `priv` and `fd` only, never
 * from the struct's own address. upcie_dmamem_destroy() leaves `fd` to `release`, which owns it.
 * The CPU view may be NULL (device memory the CPU cannot touch); everything here works on offsets
 * and never dereferences the memory.
 *
 * Memory a device may still write must never go back to the system: when a device could not be
 * stopped (its controller did not disable), upcie_dmamem_keep() moves the dmamem to a
 * process-wide list where it stays, mapped and owned, until the process exits.
 */
#ifndef UPCIE_MEM_DMAMEM_H
#define UPCIE_MEM_DMAMEM_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/bits.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>

struct upcie_dmamem;

/* Undo what a constructor set up (unmap, unpin, close). Called once by upcie_dmamem_destroy(). */
typedef void (*upcie_dmamem_release_fn)(struct upcie_dmamem *mem);

struct upcie_dmamem {
	void *vaddr;		/* CPU view of offset 0, or NULL when there is none */
	size_t size;		/* bytes */
	uint64_t iova;		/* arithmetic translator: device address of offset 0 */
	uint64_t *lut;		/* LUT translator (non-NULL selects it): address per granule */
	size_t nlut;		/* LUT entries: size / granule, rounded up */
	unsigned granule_shift; /* LUT granule is 1 << granule_shift bytes */
	bool lut_owned;		/* free(lut) on destroy */
	upcie_dmamem_release_fn release;
	void *priv;	  /* constructor-private state, used by `release` */
	int fd;		  /* constructor's file descriptor (memfd, dma-buf, ...) or -1 */
	const char *kind; /* constructor name, for messages */
};

/*
 * Fill `mem` as arithmetic memory: device address = iova + offset. Returns 0, or -EINVAL for a
 * zero size or an address range that wraps.
 */
static inline int upcie_dmamem_init_arith(struct upcie_dmamem *mem, void *vaddr, size_t size,
					  uint64_t iova)
{
	uint64_t end;

	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	if (!size || upcie_add_overflow(iova, size - 1, &end))
		return UPCIE_FAIL(-EINVAL, "dmamem: bad arithmetic range iova=0x%llx size=%zu",
				  (unsigned long long)iova, size);
	mem->vaddr = vaddr;
	mem->size = size;
	mem->iova = iova;
	mem->kind = "arith";
	return 0;
}

/*
 * Fill `mem` as LUT memory: offset o is at lut[o >> granule_shift] + (o & (granule - 1)).
 * `lut` has div_round_up(size, granule) entries, each granule-aligned; when `take` is true the
 * dmamem owns the array (allocated with malloc) and frees it on destroy, also on failure here.
 * Returns 0, or -EINVAL (zero size, granule below 4 KiB or above 1 GiB, misaligned entry).
 */
static inline int upcie_dmamem_init_lut(struct upcie_dmamem *mem, void *vaddr, size_t size,
					unsigned granule_shift, uint64_t *lut, bool take)
{
	uint64_t granule = UINT64_C(1) << (granule_shift & 63);
	size_t n;

	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	if (!size || !lut || granule_shift < 12 || granule_shift > 30) {
		if (take)
			free(lut);
		return UPCIE_FAIL(-EINVAL, "dmamem: bad LUT (size=%zu granule_shift=%u)", size,
				  granule_shift);
	}
	n = (size_t)upcie_div_round_up(size, granule);
	for (size_t i = 0; i < n; i++) {
		if (!upcie_is_aligned(lut[i], granule)) {
			UPCIE_ERR("dmamem: LUT entry %zu (0x%llx) not aligned to granule 0x%llx", i,
				  (unsigned long long)lut[i], (unsigned long long)granule);
			if (take)
				free(lut);
			return -EINVAL;
		}
	}
	mem->vaddr = vaddr;
	mem->size = size;
	mem->lut = lut;
	mem->nlut = n;
	mem->granule_shift = granule_shift;
	mem->lut_owned = take;
	mem->kind = "lut";
	return 0;
}

/* Release everything the constructor set up and zero `mem`. A zeroed dmamem is a no-op. */
static inline void upcie_dmamem_destroy(struct upcie_dmamem *mem)
{
	if (!mem)
		return;
	if (mem->release)
		mem->release(mem);
	if (mem->lut_owned)
		free(mem->lut);
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
}

/* One kept dmamem (upcie_dmamem_keep()); the list only grows. */
struct upcie_dmamem_kept_ {
	struct upcie_dmamem mem;
	struct upcie_dmamem_kept_ *next;
};

struct upcie_dmamem_kept_list {
	struct upcie_dmamem_kept_ *head;
	uint64_t bytes;
};

UPCIE_WEAK struct upcie_dmamem_kept_list upcie_dmamem_kept_g = { NULL, 0 };

/*
 * Keep `mem` for the rest of the process instead of destroying it: for memory a device may still
 * write because it could not be stopped. Its release never runs (the pages stay mapped and
 * owned, IOMMU mappings stay until their container goes), and `mem` is zeroed. Any thread.
 */
static inline void upcie_dmamem_keep(struct upcie_dmamem *mem)
{
	struct upcie_dmamem_kept_ *k;

	if (!mem || (!mem->size && !mem->priv && !mem->release))
		return;
	k = (struct upcie_dmamem_kept_ *)calloc(1, sizeof(*k));
	if (k) {
		k->mem = *mem;
		k->next = __atomic_load_n(&upcie_dmamem_kept_g.head, __ATOMIC_RELAXED);
		while (!__atomic_compare_exchange_n(&upcie_dmamem_kept_g.head, &k->next, k, true,
						    __ATOMIC_RELEASE, __ATOMIC_RELAXED))
			;
	}
	__atomic_fetch_add(&upcie_dmamem_kept_g.bytes, (uint64_t)mem->size, __ATOMIC_RELAXED);
	UPCIE_WARN("dmamem: keeping %zu bytes of %s memory for good: a device may still write it",
		   mem->size, mem->kind ? mem->kind : "DMA");
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
}

/* Bytes kept by upcie_dmamem_keep() in this process so far. */
static inline uint64_t upcie_dmamem_kept_bytes(void)
{
	return __atomic_load_n(&upcie_dmamem_kept_g.bytes, __ATOMIC_RELAXED);
}

/* Move *src into *dst (which must not hold a live dmamem) and leave *src zeroed. */
static inline void upcie_dmamem_move(struct upcie_dmamem *dst, struct upcie_dmamem *src)
{
	*dst = *src;
	memset(src, 0, sizeof(*src));
	src->fd = -1;
}

/* Device address of `off`, no bounds check: the hot path. */
UPCIE_HD static inline uint64_t upcie_dmamem_iova_fast(const struct upcie_dmamem *mem, uint64_t off)
{
	if (mem->lut)
		return mem->lut[off >> mem->granule_shift] +
		       (off & ((UINT64_C(1) << mem->granule_shift) - 1));
	return mem->iova + off;
}

/* Device address of `off` into *iova; -ERANGE when off is outside the memory. */
static inline int upcie_dmamem_iova(const struct upcie_dmamem *mem, uint64_t off, uint64_t *iova)
{
	if (off >= mem->size)
		return -ERANGE;
	*iova = upcie_dmamem_iova_fast(mem, off);
	return 0;
}

/*
 * Bytes from `off` that are contiguous in device address space as far as the translator promises:
 * to the end of the granule for a LUT, to the end of the memory for arithmetic. 0 when off is out
 * of range. (Adjacent LUT granules may happen to be contiguous; callers never rely on it.)
 */
static inline uint64_t upcie_dmamem_contig(const struct upcie_dmamem *mem, uint64_t off)
{
	uint64_t left, gran;

	if (off >= mem->size)
		return 0;
	left = mem->size - off;
	if (!mem->lut)
		return left;
	gran =
	    (UINT64_C(1) << mem->granule_shift) - (off & ((UINT64_C(1) << mem->granule_shift) - 1));
	return gran < left ? gran : left;
}

/* Offset of CPU pointer `p` inside `mem`; -EINVAL without a CPU view, -ERANGE outside. */
static inline int upcie_dmamem_offset_of(const struct upcie_dmamem *mem, const void *p,
					 uint64_t *off)
{
	uintptr_t base = (uintptr_t)mem->vaddr, ptr = (uintptr_t)p;

	if (!mem->vaddr)
		return -EINVAL;
	if (ptr < base || ptr - base >= mem->size)
		return -ERANGE;
	*off = ptr - base;
	return 0;
}

/* The translator's granule in bytes: the LUT granule, or the whole size for arithmetic memory. */
static inline uint64_t upcie_dmamem_granule(const struct upcie_dmamem *mem)
{
	return mem->lut ? UINT64_C(1) << mem->granule_shift : mem->size;
}

#endif /* UPCIE_MEM_DMAMEM_H */
