/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A registry of caller-owned memory ranges (buffers the application allocated itself, such as GPU
 * allocations), each with the dmamem that translates it for a device.
 *
 * A range is keyed by its address in the process (a CPU or GPU virtual address; the registry never
 * dereferences it) and maps to a dmamem plus the offset of its first byte in that dmamem (the
 * dmamem may cover more than the range, e.g. a whole exported buffer object). Registering the same
 * base and size again only takes a reference; a range that overlaps a registered one otherwise is
 * refused with -EEXIST. Any interior address resolves to (dmamem, offset) and to a device
 * address, translated exactly as heap memory is.
 *
 * Ownership: on a successful registration the registry takes the dmamem (the caller's struct is
 * zeroed); on failure the caller keeps it. The last unregister destroys the dmamem, or hands it
 * back when asked to, for callers that must tear down in a particular order (unmap from the
 * IOMMU before freeing the GPU memory). A dmamem must therefore be movable: constructors keep
 * their state in `priv`, never pointers to the struct itself.
 *
 * Locking: a rwlock per registry; lookups and translations run concurrently, registration and
 * unregistration exclude them briefly (dmamem construction and destruction happen outside the
 * lock). A pointer returned by a lookup stays valid while the caller holds a registration of the
 * range, as using a buffer requires anyway.
 */
#ifndef UPCIE_MEM_REGISTRY_H
#define UPCIE_MEM_REGISTRY_H

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

struct upcie_registry_node {
	uint64_t base;	  /* first address of the range */
	uint64_t size;	  /* bytes */
	uint64_t mem_off; /* offset of `base` in mem */
	uint32_t refs;
	struct upcie_dmamem mem; /* owned */
};

struct upcie_registry {
	pthread_rwlock_t lock;
	struct upcie_registry_node **nodes; /* sorted by base; ranges never overlap */
	size_t n, cap;
	bool live;
};

/* What a lookup found. `mem` is valid while the caller holds a registration of the range. */
struct upcie_registry_hit {
	const struct upcie_dmamem *mem;
	uint64_t off;	  /* offset of the looked-up address in mem */
	const void *base; /* the registered range */
	size_t size;
	size_t avail; /* bytes from the looked-up address to the end of the range */
};

/* Returns 0, or -ENOMEM / the rwlock's error; `reg` is zeroed on failure. */
static inline int upcie_registry_init(struct upcie_registry *reg)
{
	pthread_rwlockattr_t attr;
	int err;

	if (!reg)
		return UPCIE_FAIL(-EINVAL, "registry: NULL registry");
	memset(reg, 0, sizeof(*reg));
	err = pthread_rwlockattr_init(&attr);
	if (err)
		return UPCIE_FAIL(-err, "registry: pthread_rwlockattr_init: %s", strerror(err));
#ifdef PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP
	/* glibc prefers readers by default; a steady stream of lookups from I/O threads would then
	 * starve a registration for as long as the I/O runs. */
	pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
	err = pthread_rwlock_init(&reg->lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	if (err)
		return UPCIE_FAIL(-err, "registry: pthread_rwlock_init: %s", strerror(err));
	reg->live = true;
	return 0;
}

/* Destroy every dmamem still registered and the registry. A zeroed registry is a no-op. */
static inline void upcie_registry_fini(struct upcie_registry *reg)
{
	if (!reg || !reg->live)
		return;
	if (reg->n)
		UPCIE_DBG("registry: fini with %zu ranges registered", reg->n);
	for (size_t i = 0; i < reg->n; i++) {
		upcie_dmamem_destroy(&reg->nodes[i]->mem);
		free(reg->nodes[i]);
	}
	free(reg->nodes);
	pthread_rwlock_destroy(&reg->lock);
	memset(reg, 0, sizeof(*reg));
}

/* Number of ranges with base <= key (the index where a range at `key` would be inserted). */
static inline size_t upcie_registry_upper_(const struct upcie_registry *reg, uint64_t key)
{
	size_t lo = 0, hi = reg->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (reg->nodes[mid]->base <= key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The range containing `key`, or NULL. Called with the lock held. */
static inline struct upcie_registry_node *upcie_registry_find_(const struct upcie_registry *reg,
							       uint64_t key)
{
	size_t i = upcie_registry_upper_(reg, key);
	struct upcie_registry_node *nd;

	if (!i)
		return NULL;
	nd = reg->nodes[i - 1];
	return key - nd->base < nd->size ? nd : NULL;
}

/*
 * Register [base, base + size), translated by `mem` from offset `mem_off` on.
 *
 * With `mem` non-NULL: a new range is inserted with one reference and the registry takes the
 * dmamem (*mem is zeroed). If the same base and size is registered already (another thread won a
 * race), that registration gains a reference and *mem is destroyed and zeroed; the registered
 * dmamem stays in use. With `mem` NULL only an existing registration of the same base and size
 * gains a reference: the cheap path for registering a buffer again, -ENOENT when there is none
 * (then build a dmamem and call again).
 *
 * Returns 0; -EINVAL (zero size, a range that wraps, or mem_off + size beyond the dmamem);
 * -EEXIST (overlaps a registered range with a different base or size); -ENOENT (mem NULL, not
 * registered); -EOVERFLOW (reference count full); -ENOMEM. On failure *mem is untouched and still
 * the caller's.
 */
static inline int upcie_registry_register(struct upcie_registry *reg, const void *base, size_t size,
					  struct upcie_dmamem *mem, uint64_t mem_off)
{
	uint64_t key = (uint64_t)(uintptr_t)base, end, mend, ob = 0, os = 0;
	struct upcie_registry_node *nd = NULL, *prev, *next;
	bool dup = false;
	size_t i;
	int err = 0;

	if (!reg || !reg->live)
		return UPCIE_FAIL(-EINVAL, "registry: not initialised");
	if (!size || upcie_add_overflow(key, size - 1, &end))
		return UPCIE_FAIL(-EINVAL, "registry: bad range %p + %zu", base, size);
	if (mem) {
		if (!mem->size || upcie_add_overflow(mem_off, size, &mend) || mend > mem->size)
			return UPCIE_FAIL(-EINVAL,
					  "registry: range %p + %zu at offset 0x%" PRIx64
					  " does not "
					  "fit its dmamem of %zu bytes",
					  base, size, mem_off, mem->size);
		nd = (struct upcie_registry_node *)malloc(sizeof(*nd));
		if (!nd)
			return UPCIE_FAIL(-ENOMEM, "registry: out of host memory");
		nd->base = key;
		nd->size = size;
		nd->mem_off = mem_off;
		nd->refs = 1;
		nd->mem = *mem;
	}

	pthread_rwlock_wrlock(&reg->lock);
	i = upcie_registry_upper_(reg, key);
	prev = i ? reg->nodes[i - 1] : NULL;
	next = i < reg->n ? reg->nodes[i] : NULL;
	if (prev && prev->base == key && prev->size == size) {
		if (prev->refs == UINT32_MAX)
			err = -EOVERFLOW;
		else
			prev->refs++;
		dup = true;
	} else if (prev && key - prev->base < prev->size) {
		err = -EEXIST;
		ob = prev->base;
		os = prev->size;
	} else if (next && next->base <= end) {
		err = -EEXIST;
		ob = next->base;
		os = next->size;
	} else if (!nd) {
		err = -ENOENT;
	} else if (reg->n == reg->cap) {
		size_t cap = reg->cap ? reg->cap * 2 : 16;
		struct upcie_registry_node **nodes;

		nodes = (struct upcie_registry_node **)realloc(reg->nodes, cap * sizeof(*nodes));
		if (nodes) {
			reg->nodes = nodes;
			reg->cap = cap;
		} else {
			err = -ENOMEM;
		}
	}
	if (!err && !dup) {
		memmove(&reg->nodes[i + 1], &reg->nodes[i], (reg->n - i) * sizeof(*reg->nodes));
		reg->nodes[i] = nd;
		reg->n++;
	}
	pthread_rwlock_unlock(&reg->lock);

	if (err) {
		free(nd);
		switch (err) {
		case -EEXIST:
			return UPCIE_FAIL(err,
					  "registry: %p + %zu overlaps the registered range "
					  "0x%" PRIx64 " + %" PRIu64,
					  base, size, ob, os);
		case -ENOENT:
			UPCIE_DBG("registry: %p + %zu is not registered", base, size);
			return err;
		case -EOVERFLOW:
			return UPCIE_FAIL(err, "registry: %p + %zu registered too often", base,
					  size);
		default:
			return UPCIE_FAIL(err, "registry: out of host memory");
		}
	}
	if (dup && mem) {
		/* Registered already (a racing registration won): ours is not needed. */
		free(nd);
		upcie_dmamem_destroy(mem);
	}
	if (mem) {
		memset(mem, 0, sizeof(*mem));
		mem->fd = -1;
	}
	return 0;
}

/*
 * Drop one reference to the range registered at exactly `base`. The last one removes the range
 * and destroys its dmamem, or, when `handback` is non-NULL, moves the dmamem into *handback for
 * the caller to destroy. *handback is zeroed when references remain, so handback->size != 0 tells
 * the caller it now owns the dmamem (and upcie_dmamem_destroy() of it is always safe).
 * Returns 0; -EINVAL (`base` inside a range rather than its start); -ENOENT (not registered).
 */
static inline int upcie_registry_unregister(struct upcie_registry *reg, const void *base,
					    struct upcie_dmamem *handback)
{
	uint64_t key = (uint64_t)(uintptr_t)base;
	struct upcie_registry_node *nd;
	size_t i;

	if (handback) {
		memset(handback, 0, sizeof(*handback));
		handback->fd = -1;
	}
	if (!reg || !reg->live)
		return UPCIE_FAIL(-EINVAL, "registry: not initialised");
	pthread_rwlock_wrlock(&reg->lock);
	nd = upcie_registry_find_(reg, key);
	if (!nd || nd->base != key) {
		uint64_t nb = nd ? nd->base : 0;

		pthread_rwlock_unlock(&reg->lock);
		if (nd)
			return UPCIE_FAIL(-EINVAL,
					  "registry: unregister of %p, inside the range at "
					  "0x%" PRIx64 " rather than its base",
					  base, nb);
		return UPCIE_FAIL(-ENOENT, "registry: unregister of %p, which is not registered",
				  base);
	}
	if (--nd->refs) {
		pthread_rwlock_unlock(&reg->lock);
		return 0;
	}
	i = upcie_registry_upper_(reg, key) - 1;
	memmove(&reg->nodes[i], &reg->nodes[i + 1], (reg->n - i - 1) * sizeof(*reg->nodes));
	reg->n--;
	pthread_rwlock_unlock(&reg->lock);

	if (handback)
		*handback = nd->mem;
	else
		upcie_dmamem_destroy(&nd->mem);
	free(nd);
	return 0;
}

/*
 * Resolve any address inside a registered range. Returns 0 and fills *hit, or -ENOENT when no
 * range contains `ptr` (not logged above debug level: probing is a legitimate use).
 */
static inline int upcie_registry_lookup(struct upcie_registry *reg, const void *ptr,
					struct upcie_registry_hit *hit)
{
	uint64_t key = (uint64_t)(uintptr_t)ptr;
	const struct upcie_registry_node *nd;

	if (!reg || !reg->live || !hit)
		return -EINVAL;
	pthread_rwlock_rdlock(&reg->lock);
	nd = upcie_registry_find_(reg, key);
	if (nd) {
		hit->mem = &nd->mem;
		hit->off = nd->mem_off + (key - nd->base);
		hit->base = (const void *)(uintptr_t)nd->base;
		hit->size = (size_t)nd->size;
		hit->avail = (size_t)(nd->size - (key - nd->base));
	}
	pthread_rwlock_unlock(&reg->lock);
	if (!nd) {
		UPCIE_DBG("registry: %p is in no registered range", ptr);
		return -ENOENT;
	}
	return 0;
}

/*
 * Device address of the byte at `ptr`, through the dmamem of the range containing it. Returns 0,
 * or -ENOENT (not registered).
 */
static inline int upcie_registry_iova(struct upcie_registry *reg, const void *ptr, uint64_t *iova)
{
	uint64_t key = (uint64_t)(uintptr_t)ptr;
	const struct upcie_registry_node *nd;
	int err;

	if (!reg || !reg->live || !iova)
		return -EINVAL;
	pthread_rwlock_rdlock(&reg->lock);
	nd = upcie_registry_find_(reg, key);
	err = nd ? upcie_dmamem_iova(&nd->mem, nd->mem_off + (key - nd->base), iova) : -ENOENT;
	pthread_rwlock_unlock(&reg->lock);
	if (err == -ENOENT)
		UPCIE_DBG("registry: %p is in no registered range", ptr);
	return err;
}

/* Number of registered ranges (a snapshot). */
static inline size_t upcie_registry_count(struct upcie_registry *reg)
{
	size_t n;

	if (!reg || !reg->live)
		return 0;
	pthread_rwlock_rdlock(&reg->lock);
	n = reg->n;
	pthread_rwlock_unlock(&reg->lock);
	return n;
}

#endif /* UPCIE_MEM_REGISTRY_H */
