/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A granule-aware offset allocator over any dmamem.
 *
 * The heap hands out byte ranges of one dmamem as offsets, with the CPU pointer (when the dmamem
 * has a CPU view) and the device address of each. Its bookkeeping lives in malloc'd host memory,
 * never in the managed memory, so it works on memory the CPU cannot touch (GPU memory, a peer
 * BAR). upcie_heap_alloc() honours power-of-two alignments in offsets, device addresses and CPU
 * addresses alike, up to what the memory can give (its LUT granule, the alignment of its base IOVA
 * and of its CPU view); larger ones are refused, never silently weakened. upcie_heap_alloc_array() additionally keeps every element inside one
 * translator granule, so an element (a queue, a PRP list page) is contiguous for the device; see
 * there for exactly what is promised. Freed ranges coalesce with free neighbours; freeing an
 * offset that is not the start of a live allocation is -EINVAL and changes nothing.
 *
 * Locking: one mutex per heap, taken by every call, so a heap may be shared by threads.
 * Allocation is not a hot path (queues and buffers are allocated up front); cost is O(n) in the
 * number of blocks. The dmamem is borrowed by address: it must outlive the heap and stay where it
 * is (a dmamem handed to a registry moves; build a heap over a registry's copy, via the lookup, if
 * both are wanted).
 */
#ifndef UPCIE_MEM_HEAP_H
#define UPCIE_MEM_HEAP_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/bits.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>

/* One range of the heap. Blocks are sorted by offset and tile [0, size) without gaps. */
struct upcie_heap_blk {
	uint64_t off;
	uint64_t len;
	bool used;
};

struct upcie_heap {
	const struct upcie_dmamem *mem; /* borrowed */
	struct upcie_heap_blk *blk;	/* no two free blocks are adjacent */
	size_t nblk, cap;
	uint64_t size;	    /* = mem->size */
	uint64_t granule;   /* LUT granule, 0 for arithmetic memory (no boundaries) */
	uint64_t max_align; /* largest alignment honoured in every address space */
	uint64_t free_bytes;
	size_t nalloc;
	pthread_mutex_t lock;
	bool live;
};

/* One allocation. Free it with upcie_heap_free(heap, buf.off). */
struct upcie_heap_buf {
	uint64_t off;	 /* offset in the dmamem */
	uint64_t size;	 /* bytes reserved: the request, or count * stride for an array */
	uint64_t stride; /* array: distance between elements; plain allocation: size */
	uint64_t count;	 /* array: elements; plain allocation: 1 */
	void *vaddr;	 /* CPU pointer to offset `off`, NULL when the dmamem has no CPU view */
	uint64_t iova;	 /* device address of offset `off` (element 0) */
};

struct upcie_heap_stats {
	uint64_t size;	       /* bytes managed */
	uint64_t free_bytes;   /* bytes in free blocks */
	uint64_t largest_free; /* largest free block */
	size_t nalloc;	       /* live allocations */
	size_t nfree_blocks;   /* free blocks (1 when nothing is allocated) */
};

/*
 * Manage all of `mem`. Returns 0, -EINVAL (NULL or empty dmamem), -ENOMEM; `heap` is zeroed on
 * failure, and upcie_heap_fini() of a zeroed heap is a no-op.
 */
static inline int upcie_heap_init(struct upcie_heap *heap, const struct upcie_dmamem *mem)
{
	uint64_t ma = UINT64_C(1) << 63;
	int err;

	if (!heap)
		return UPCIE_FAIL(-EINVAL, "heap: NULL heap");
	memset(heap, 0, sizeof(*heap));
	if (!mem || !mem->size)
		return UPCIE_FAIL(-EINVAL, "heap: no memory to manage");
	/* Offsets map onto device addresses through LUT entries aligned to the granule, or
	 * through one base IOVA; an offset aligned beyond that, or beyond the CPU view's own
	 * alignment, would not give an aligned address, so such alignments are refused. */
	if (mem->lut) {
		heap->granule = UINT64_C(1) << mem->granule_shift;
		ma = heap->granule;
	} else if (mem->iova) {
		ma = mem->iova & (~mem->iova + 1);
	}
	if (mem->vaddr) {
		uint64_t va = (uint64_t)(uintptr_t)mem->vaddr, low = va & (~va + 1);

		if (low < ma)
			ma = low;
	}
	heap->blk = (struct upcie_heap_blk *)malloc(16 * sizeof(*heap->blk));
	if (!heap->blk)
		return UPCIE_FAIL(-ENOMEM, "heap: out of host memory");
	err = pthread_mutex_init(&heap->lock, NULL);
	if (err) {
		free(heap->blk);
		memset(heap, 0, sizeof(*heap));
		return UPCIE_FAIL(-err, "heap: pthread_mutex_init: %s", strerror(err));
	}
	heap->cap = 16;
	heap->nblk = 1;
	heap->blk[0].off = 0;
	heap->blk[0].len = mem->size;
	heap->blk[0].used = false;
	heap->mem = mem;
	heap->size = mem->size;
	heap->max_align = ma;
	heap->free_bytes = mem->size;
	heap->live = true;
	return 0;
}

/* Drop the bookkeeping (not the dmamem). Live allocations simply cease to exist. */
static inline void upcie_heap_fini(struct upcie_heap *heap)
{
	if (!heap || !heap->live)
		return;
	if (heap->nalloc)
		UPCIE_DBG("heap: fini with %zu allocations live", heap->nalloc);
	free(heap->blk);
	pthread_mutex_destroy(&heap->lock);
	memset(heap, 0, sizeof(*heap));
}

/*
 * Lowest start in the free range [off, off + blen) that is aligned to `align` and fits `len`
 * bytes; with `gran` non-zero (a power of two >= len) the bytes must also lie in one granule.
 */
static inline bool upcie_heap_place_(uint64_t off, uint64_t blen, uint64_t len, uint64_t align,
				     uint64_t gran, uint64_t *start)
{
	uint64_t s, end = off + blen, last;

	if (upcie_add_overflow(off, align - 1, &s))
		return false;
	s = upcie_align_down(s, align);
	/* If the first aligned start crosses a boundary, every start before that boundary does
	 * too; the boundary itself is aligned (align <= gran) and holds len <= gran bytes. */
	if (gran && !upcie_add_overflow(s, len - 1, &last) && s / gran != last / gran)
		s = upcie_align_up(s, gran);
	if (s < off || s > end || end - s < len)
		return false;
	*start = s;
	return true;
}

/* Carve [s, s + len) out of free block i. The caller ensured room for two more blocks. */
static inline void upcie_heap_split_(struct upcie_heap *heap, size_t i, uint64_t s, uint64_t len)
{
	struct upcie_heap_blk b = heap->blk[i];
	uint64_t pre = s - b.off, post = b.off + b.len - (s + len);
	size_t k = 1 + (pre != 0) + (post != 0), j = i;

	memmove(&heap->blk[i + k], &heap->blk[i + 1], (heap->nblk - i - 1) * sizeof(b));
	if (pre) {
		heap->blk[j].off = b.off;
		heap->blk[j].len = pre;
		heap->blk[j++].used = false;
	}
	heap->blk[j].off = s;
	heap->blk[j].len = len;
	heap->blk[j++].used = true;
	if (post) {
		heap->blk[j].off = s + len;
		heap->blk[j].len = post;
		heap->blk[j].used = false;
	}
	heap->nblk += k - 1;
	heap->free_bytes -= len;
	heap->nalloc++;
}

/* First fit. Called with the lock held; -ENOMEM leaves the heap unchanged. */
static inline int upcie_heap_alloc_locked_(struct upcie_heap *heap, uint64_t len, uint64_t align,
					   uint64_t gran, uint64_t *off)
{
	if (heap->nblk + 2 > heap->cap) {
		size_t cap = heap->cap * 2;
		struct upcie_heap_blk *blk;

		blk = (struct upcie_heap_blk *)realloc(heap->blk, cap * sizeof(*blk));
		if (!blk)
			return UPCIE_FAIL(-ENOMEM, "heap: out of host memory for bookkeeping");
		heap->blk = blk;
		heap->cap = cap;
	}
	for (size_t i = 0; i < heap->nblk; i++) {
		const struct upcie_heap_blk *b = &heap->blk[i];
		uint64_t s;

		if (b->used || b->len < len ||
		    !upcie_heap_place_(b->off, b->len, len, align, gran, &s))
			continue;
		upcie_heap_split_(heap, i, s, len);
		*off = s;
		return 0;
	}
	return -ENOMEM;
}

static inline uint64_t upcie_heap_largest_locked_(const struct upcie_heap *heap, size_t *nfree)
{
	uint64_t largest = 0;
	size_t n = 0;

	for (size_t i = 0; i < heap->nblk; i++)
		if (!heap->blk[i].used) {
			n++;
			if (heap->blk[i].len > largest)
				largest = heap->blk[i].len;
		}
	if (nfree)
		*nfree = n;
	return largest;
}

static inline void upcie_heap_fill_(const struct upcie_heap *heap, struct upcie_heap_buf *buf,
				    uint64_t off, uint64_t size, uint64_t stride, uint64_t count)
{
	buf->off = off;
	buf->size = size;
	buf->stride = stride;
	buf->count = count;
	buf->vaddr = heap->mem->vaddr ? (void *)((char *)heap->mem->vaddr + off) : NULL;
	buf->iova = upcie_dmamem_iova_fast(heap->mem, off);
}

static inline int upcie_heap_check_align_(const struct upcie_heap *heap, uint64_t align)
{
	if (!upcie_is_pow2(align))
		return UPCIE_FAIL(-EINVAL, "heap: alignment %" PRIu64 " is not a power of two",
				  align);
	if (align > heap->max_align)
		return UPCIE_FAIL(-EINVAL,
				  "heap: alignment 0x%" PRIx64 " exceeds what this %s memory can "
				  "give (0x%" PRIx64 ": its granule, base IOVA or CPU view)",
				  align, heap->mem->kind ? heap->mem->kind : "dmamem",
				  heap->max_align);
	return 0;
}

static inline int upcie_heap_enomem_(struct upcie_heap *heap, uint64_t size, uint64_t align)
{
	uint64_t largest = upcie_heap_largest_locked_(heap, NULL), nfree = heap->free_bytes;

	pthread_mutex_unlock(&heap->lock);
	return UPCIE_FAIL(-ENOMEM,
			  "heap: no room for %" PRIu64 " bytes aligned to 0x%" PRIx64 " (%" PRIu64
			  " of %" PRIu64 " bytes free, largest free block %" PRIu64 ")",
			  size, align, nfree, heap->size, largest);
}

/*
 * Allocate `size` bytes aligned to `align` (a power of two; the offset, device address and CPU
 * address are all multiples of it). No granule promise: a plain allocation may span LUT granules,
 * so walk it with upcie_dmamem_contig(). Returns 0 and fills *buf; -EINVAL (zero size, bad
 * alignment or one this memory cannot give); -ENOMEM (no room; the message gives free space).
 */
static inline int upcie_heap_alloc(struct upcie_heap *heap, uint64_t size, uint64_t align,
				   struct upcie_heap_buf *buf)
{
	uint64_t off;
	int err;

	if (!heap || !heap->live || !buf)
		return UPCIE_FAIL(-EINVAL, "heap: alloc on an uninitialised heap");
	if (!size)
		return UPCIE_FAIL(-EINVAL, "heap: zero-size allocation");
	err = upcie_heap_check_align_(heap, align);
	if (err)
		return err;
	pthread_mutex_lock(&heap->lock);
	err = size > heap->size ? -ENOMEM : upcie_heap_alloc_locked_(heap, size, align, 0, &off);
	if (err)
		return upcie_heap_enomem_(heap, size, align); /* unlocks */
	pthread_mutex_unlock(&heap->lock);
	upcie_heap_fill_(heap, buf, off, size, size, 1);
	return 0;
}

static inline uint64_t upcie_heap_pow2_ceil_(uint64_t x)
{
	return x <= 1 ? 1 : UINT64_C(1) << (upcie_log2(x - 1) + 1);
}

/*
 * Allocate `count` elements of `elem_size` bytes, each aligned to `align` (a power of two), none
 * crossing a translator granule. On success element i is [buf.off + i * buf.stride,
 * buf.off + i * buf.stride + elem_size), and:
 *   - that range lies in one granule of the dmamem (one LUT entry; always true for arithmetic
 *     memory), so it is contiguous for the device: upcie_dmamem_contig() of its first byte is at
 *     least elem_size;
 *   - its offset, device address and CPU address are multiples of `align`;
 *   - buf.stride is a multiple of `align`, at least elem_size, and the same for every element:
 *     it is align_up(elem_size, align) ("tight") for arithmetic memory, or when the whole array
 *     fits in one granule and a place inside one granule is free; otherwise it is that rounded
 *     up to a power of two, which divides the granule, with the array aligned to the stride.
 *     Callers must step by buf.stride, never by elem_size.
 *   - buf.size = count * buf.stride bytes are reserved.
 * Returns 0, -EINVAL (zero count or size, bad alignment, an element larger than the granule,
 * overflow), -ENOMEM (no room).
 */
static inline int upcie_heap_alloc_array(struct upcie_heap *heap, uint64_t count,
					 uint64_t elem_size, uint64_t align,
					 struct upcie_heap_buf *buf)
{
	uint64_t tight, p2, total, off;
	int err = -ENOMEM;

	if (!heap || !heap->live || !buf)
		return UPCIE_FAIL(-EINVAL, "heap: alloc_array on an uninitialised heap");
	if (!count || !elem_size)
		return UPCIE_FAIL(-EINVAL, "heap: array of %" PRIu64 " x %" PRIu64 " bytes", count,
				  elem_size);
	err = upcie_heap_check_align_(heap, align);
	if (err)
		return err;
	if (heap->granule && elem_size > heap->granule)
		return UPCIE_FAIL(-EINVAL,
				  "heap: element of %" PRIu64 " bytes cannot stay within one "
				  "%" PRIu64 "-byte granule",
				  elem_size, heap->granule);
	if (upcie_add_overflow(elem_size, align - 1, &tight))
		return UPCIE_FAIL(-EINVAL, "heap: element of %" PRIu64 " bytes overflows",
				  elem_size);
	tight = upcie_align_down(tight, align);
	if (upcie_mul_overflow(count, tight, &total))
		return UPCIE_FAIL(-EINVAL, "heap: array of %" PRIu64 " x %" PRIu64 " overflows",
				  count, tight);

	pthread_mutex_lock(&heap->lock);
	err = -ENOMEM;
	if (!heap->granule) {
		if (total <= heap->size)
			err = upcie_heap_alloc_locked_(heap, total, align, 0, &off);
		if (!err) {
			pthread_mutex_unlock(&heap->lock);
			upcie_heap_fill_(heap, buf, off, total, tight, count);
			return 0;
		}
		return upcie_heap_enomem_(heap, total, align);
	}
	/* A tight array inside one granule wastes nothing; a power-of-two stride wastes up to
	 * half of each element but lets the array span granules. tight == p2: the power-of-two
	 * placement is the more permissive of the two, so it alone is tried. tight <= granule,
	 * so p2 divides the granule. */
	p2 = upcie_heap_pow2_ceil_(tight);
	if (tight != p2 && total <= heap->granule) {
		err = upcie_heap_alloc_locked_(heap, total, align, heap->granule, &off);
		if (!err) {
			pthread_mutex_unlock(&heap->lock);
			upcie_heap_fill_(heap, buf, off, total, tight, count);
			return 0;
		}
	}
	if (upcie_mul_overflow(count, p2, &total)) {
		pthread_mutex_unlock(&heap->lock);
		return UPCIE_FAIL(-EINVAL, "heap: array of %" PRIu64 " x %" PRIu64 " overflows",
				  count, p2);
	}
	if (total <= heap->size)
		err = upcie_heap_alloc_locked_(heap, total, p2, 0, &off);
	if (err)
		return upcie_heap_enomem_(heap, total, p2);
	pthread_mutex_unlock(&heap->lock);
	upcie_heap_fill_(heap, buf, off, total, p2, count);
	return 0;
}

/* Index of the block containing `off` (off < size). Blocks tile the heap, so one always does. */
static inline size_t upcie_heap_find_locked_(const struct upcie_heap *heap, uint64_t off)
{
	size_t lo = 0, hi = heap->nblk;

	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;

		if (heap->blk[mid].off <= off)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

static inline void upcie_heap_remove_locked_(struct upcie_heap *heap, size_t i)
{
	memmove(&heap->blk[i], &heap->blk[i + 1], (heap->nblk - i - 1) * sizeof(heap->blk[0]));
	heap->nblk--;
}

/*
 * Free the allocation starting at `off` (buf.off) and merge it with free neighbours. Returns 0,
 * or -EINVAL with nothing changed for an offset outside the heap, inside an allocation, or not
 * allocated (a double free).
 */
static inline int upcie_heap_free(struct upcie_heap *heap, uint64_t off)
{
	struct upcie_heap_blk *b;
	size_t i;

	if (!heap || !heap->live)
		return UPCIE_FAIL(-EINVAL, "heap: free on an uninitialised heap");
	if (off >= heap->size)
		return UPCIE_FAIL(-EINVAL,
				  "heap: free of offset 0x%" PRIx64 " outside the heap (size "
				  "0x%" PRIx64 ")",
				  off, heap->size);
	pthread_mutex_lock(&heap->lock);
	i = upcie_heap_find_locked_(heap, off);
	b = &heap->blk[i];
	if (!b->used || b->off != off) {
		uint64_t boff = b->off;
		bool used = b->used;

		pthread_mutex_unlock(&heap->lock);
		if (used)
			return UPCIE_FAIL(-EINVAL,
					  "heap: free of offset 0x%" PRIx64 ", inside the "
					  "allocation at 0x%" PRIx64 " rather than its start",
					  off, boff);
		return UPCIE_FAIL(-EINVAL,
				  "heap: free of offset 0x%" PRIx64 ", which is not allocated "
				  "(double free, or not from this heap)",
				  off);
	}
	b->used = false;
	heap->free_bytes += b->len;
	heap->nalloc--;
	if (i + 1 < heap->nblk && !heap->blk[i + 1].used) {
		b->len += heap->blk[i + 1].len;
		upcie_heap_remove_locked_(heap, i + 1);
	}
	if (i > 0 && !heap->blk[i - 1].used) {
		heap->blk[i - 1].len += heap->blk[i].len;
		upcie_heap_remove_locked_(heap, i);
	}
	pthread_mutex_unlock(&heap->lock);
	return 0;
}

/* Device address of heap offset `off`; -ERANGE outside the memory. */
static inline int upcie_heap_iova(const struct upcie_heap *heap, uint64_t off, uint64_t *iova)
{
	if (!heap || !heap->live)
		return -EINVAL;
	return upcie_dmamem_iova(heap->mem, off, iova);
}

/* CPU pointer to heap offset `off`, or NULL without a CPU view or outside the memory. */
static inline void *upcie_heap_ptr(const struct upcie_heap *heap, uint64_t off)
{
	if (!heap || !heap->live || !heap->mem->vaddr || off >= heap->size)
		return NULL;
	return (char *)heap->mem->vaddr + off;
}

/* Usage counters and the largest free block (O(n)). Returns 0 or -EINVAL. */
static inline int upcie_heap_stats_get(struct upcie_heap *heap, struct upcie_heap_stats *st)
{
	if (!heap || !heap->live || !st)
		return -EINVAL;
	pthread_mutex_lock(&heap->lock);
	st->size = heap->size;
	st->free_bytes = heap->free_bytes;
	st->nalloc = heap->nalloc;
	st->largest_free = upcie_heap_largest_locked_(heap, &st->nfree_blocks);
	pthread_mutex_unlock(&heap->lock);
	return 0;
}

/*
 * Check the bookkeeping: blocks sorted, tiling [0, size), no two free blocks adjacent, counters
 * matching. Returns 0 or -EUCLEAN with a message naming the first broken block. For tests and
 * debugging; O(n).
 */
static inline int upcie_heap_validate(struct upcie_heap *heap)
{
	uint64_t at = 0, nfree = 0;
	size_t nused = 0;
	int err = 0;

	if (!heap || !heap->live)
		return -EINVAL;
	pthread_mutex_lock(&heap->lock);
	for (size_t i = 0; i < heap->nblk && !err; i++) {
		const struct upcie_heap_blk *b = &heap->blk[i];

		if (b->off != at || !b->len || b->len > heap->size - at)
			err = UPCIE_FAIL(-EUCLEAN,
					 "heap: block %zu [0x%" PRIx64 "+0x%" PRIx64 "] does not "
					 "follow 0x%" PRIx64,
					 i, b->off, b->len, at);
		else if (!b->used && i > 0 && !heap->blk[i - 1].used)
			err = UPCIE_FAIL(-EUCLEAN, "heap: free blocks %zu and %zu not merged",
					 i - 1, i);
		at = b->off + b->len;
		if (b->used)
			nused++;
		else
			nfree += b->len;
	}
	if (!err && (at != heap->size || nfree != heap->free_bytes || nused != heap->nalloc))
		err = UPCIE_FAIL(-EUCLEAN,
				 "heap: blocks end at 0x%" PRIx64 " (size 0x%" PRIx64 "), %" PRIu64
				 " bytes free (counted %" PRIu64 "), %zu allocations (counted %zu)",
				 at, heap->size, nfree, heap->free_bytes, nused, heap->nalloc);
	pthread_mutex_unlock(&heap->lock);
	return err;
}

#endif /* UPCIE_MEM_HEAP_H */
