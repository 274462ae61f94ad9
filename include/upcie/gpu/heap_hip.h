/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The HIP provider: the process's device heap, host heap and registry of GPU memory, so that an
 * NVMe controller can move data straight to and from AMD GPU memory. The HIP counterpart of
 * gpu/heap_cuda.h, with ROCm's export behaviour designed in.
 *
 * ROCm's dma-buf export (hipMemGetHandleForAddressRange, ROCm 7.0 and newer) ignores the range
 * it is asked for: it exports the whole buffer object from the allocation's base and describes
 * the object, which may be larger than the allocation (3 MiB + 4 KiB allocated, a 4 MiB object
 * exported). Trusting the first segment for an interior range, or a chunk's export for the
 * chunk, puts the DMA beside where the caller pointed, silently. So here every export is of
 * one whole allocation, asked from its base (hipMemGetAddressRange recovers base and size from
 * any interior pointer): byte 0 of the dma-buf is then the allocation's base whether the runtime
 * honours the range or not. The dma-buf's own size (what it describes) must cover the allocation
 * (else -EINVAL) and must not exceed it by more than one buffer object's rounding
 * (UPCIE_GPU_HIP_BO_ROUND, 2 MiB): more would mean the allocation is a piece of a larger object
 * whose offset in it nobody reports, and that is refused (-EOPNOTSUPP) rather than guessed.
 * Translation is then by offset from the allocation's base, bounded by the allocation (the
 * registry's range), inside what the export describes (the dmamem).
 *
 * Device heap (1 GiB by default, rounded up to 2 MiB): one allocation, exported as above,
 * resolved to bus addresses by the dmabuf_import module (kmod/dmabuf_import.h) into a LUT dmamem
 * at the largest granule the scatter list allows (2 MiB, 64 KiB or 4 KiB), a upcie heap on top.
 * Its memory is chosen when the first open creates it (opts.device_heap_flags): coarse-grained
 * (0, a plain hipMalloc, which the GPU's L2 caches: a controller's write can be served stale from
 * the L2 after the completion, so no payload that GPU code reads after reaping), or
 * UPCIE_GPU_HIP_HEAP_FINEGRAINED / UPCIE_GPU_HIP_HEAP_UNCACHED (hipExtMallocWithFlags with
 * hipDeviceMallocFinegrained / hipDeviceMallocUncached), the memory such payloads need. The open
 * then runs upcie_gpu_hip_payload_check() on the heap and fails with its error where the runtime
 * does not report the heap as that memory, so every buffer of such a heap passes the check. An
 * uncached heap is refused, not downgraded, by a runtime that does not know the flag (ROCm 5.2's
 * headers do not name it): open with UPCIE_GPU_HIP_HEAP_FINEGRAINED there.
 * Host heap (1 GiB by default): hugepages with physical addresses (the uio_pci_generic case),
 * registered with HIP (hipHostRegister, mapped) so GPU code reaches them: SQs, host CQs, PRP
 * lists. Both are set up by the first upcie_gpu_hip_open() of the process (its sizes and GPU take
 * effect), referenced by later opens, freed by the last close.
 *
 * Caller memory: upcie_gpu_hip_buf_register() takes any pointer into a hipMalloc allocation and
 * registers the whole allocation, exported as above, refcounted, in the same registry.
 *
 * Polled memory (upcie_gpu_hip_polled_alloc()): device memory that another agent writes and GPU
 * code polls, a completion queue in VRAM above all. Ordinary VRAM is cached in the GPU's L2, and
 * a controller's write arrives from PCIe beside it, so a poll may keep reading an old line; no
 * GFX9-GFX11 load bypasses the L2 (base/arch_hip.h). So each such range is an allocation of its
 * own made uncached (hipExtMallocWithFlags, hipDeviceMallocUncached: the L2 does not hold it),
 * or fine-grained where the runtime refuses that flag (ROCm 5.2 does not know it; logged, since
 * the L2 may then still hold lines), registered as caller memory is, and checked to be
 * contiguous for the controller. Payloads that GPU code reads after a completion belong in such
 * memory too: polled memory (2 MiB at most), a fine-grained or uncached device heap, or the
 * caller's own hipExtMallocWithFlags allocation, registered (upcie_gpu_hip_payload_check() says
 * whether a buffer is such memory). IMPORT exports are checked
 * to lie inside the GPU's memory BAR and outside system RAM (gpu/p2p_check.h): amdgpu can satisfy
 * an attach by placing the buffer in GTT, host memory, which is then refused with -EXDEV.
 *
 * Translation (opts.xlate): IMPORT (default) needs /dev/dmabuf_import (package
 * upcie-dmabuf-import-dkms) and an export, so ROCm 7.0 or newer: built against an older HIP (Debian
 * 12 ships 5.2) the device heap and registrations fail with -EOPNOTSUPP naming that. OFFSET
 * makes every device address the virtual address plus opts.iova_offset (a controller reaching
 * the process's memory through such a mapping, or a GPU-side test controller); it needs no
 * module, no root and no export.
 *
 * Locking: open/close take a process-wide mutex; the heaps and the registry lock themselves.
 * Needs: the HIP runtime, a BAR covering VRAM, hugepages (IMPORT: root for pagemap). Does not:
 * map memory into an IOMMU (vfio layers do), create NVMe queues (gpuq/gqp_host_hip.h).
 * C++ host code (hipcc, or g++/clang++ with the HIP headers).
 */
#ifndef UPCIE_GPU_HEAP_HIP_H
#define UPCIE_GPU_HEAP_HIP_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <upcie/base/bits.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/gpu/dev_hip.h>
#include <upcie/gpu/p2p_check.h>
#include <upcie/kmod/dmabuf_import.h>
#include <upcie/mem/dmamem.h>
#include <upcie/mem/heap.h>
#include <upcie/mem/hugepage.h>
#include <upcie/mem/registry.h>
#include <upcie/mem/sglut.h>

/* hipMemGetHandleForAddressRange (dma-buf export of device memory) arrived with ROCm 7.0. */
#if HIP_VERSION_MAJOR >= 7
#define UPCIE_GPU_HIP_HAVE_EXPORT 1
#else
#define UPCIE_GPU_HIP_HAVE_EXPORT 0
#endif

/* hipExtMallocWithFlags' uncached device memory; by value where the headers lack the name. */
#define UPCIE_GPU_HIP_MALLOC_UNCACHED	 0x3u
#define UPCIE_GPU_HIP_MALLOC_FINEGRAINED 0x1u /* hipDeviceMallocFinegrained */
#if defined(hipDeviceMallocUncached)
UPCIE_STATIC_ASSERT(hipDeviceMallocUncached == UPCIE_GPU_HIP_MALLOC_UNCACHED,
		    "hipDeviceMallocUncached moved");
#endif

/*
 * The device heap's memory (upcie_gpu_hip_opts.device_heap_flags; 0: coarse-grained, hipMalloc).
 * At most one of the two: see the header's comment.
 */
#define UPCIE_GPU_HIP_HEAP_FINEGRAINED 0x1u /* hipExtMallocWithFlags(hipDeviceMallocFinegrained) */
#define UPCIE_GPU_HIP_HEAP_UNCACHED    0x2u /* hipExtMallocWithFlags(hipDeviceMallocUncached) */

#define UPCIE_GPU_HIP_PAGE	   UINT64_C(4096)
#define UPCIE_GPU_HIP_BO_ROUND	   (UINT64_C(2) << 20) /* a buffer object's size rounding */
#define UPCIE_GPU_HIP_HEAP_DEFAULT (UINT64_C(1) << 30)
#define UPCIE_GPU_HIP_HEAP_ALIGN   (UINT64_C(2) << 20)

enum upcie_gpu_hip_xlate {
	UPCIE_GPU_HIP_XLATE_IMPORT = 0, /* bus addresses from the dma-buf import module */
	UPCIE_GPU_HIP_XLATE_OFFSET = 1, /* device address = virtual address + iova_offset */
};

struct upcie_gpu_hip_opts {
	int gpu_id;		    /* HIP device ordinal */
	uint64_t device_heap_size;  /* 0: 1 GiB; rounded up to 2 MiB */
	unsigned device_heap_flags; /* UPCIE_GPU_HIP_HEAP_*; 0: coarse-grained */
	uint64_t host_heap_size;    /* 0: 1 GiB; rounded up to the hugepage size */
	enum upcie_gpu_hip_xlate xlate;
	uint64_t iova_offset;			      /* OFFSET only */
	const struct upcie_hugepage_opts *host_pages; /* NULL: hugetlb memfd, default size */
	uint32_t wall_khz; /* the wall-clock rate when the runtime does not report it; 0: ask */
};

/* Page ranges of device registers (doorbells) mapped for the GPU, shared by reference. */
#define UPCIE_GPU_HIP_IOMEM_MAX 16
struct upcie_gpu_hip_iomem_ {
	uintptr_t start;
	size_t len;
	void *dptr;
	unsigned refs;
};

/* The process-wide state behind every handle. */
struct upcie_gpu_hip_proc {
	unsigned refs;
	struct upcie_gpu_hip_dev dev;
	enum upcie_gpu_hip_xlate xlate;
	uint64_t iova_offset;
	struct upcie_kmod_dmabuf_import kmod;
	bool kmod_open;
	struct upcie_registry reg;
	void *dbase; /* device heap allocation */
	uint64_t dsize;
	unsigned dflags; /* UPCIE_GPU_HIP_HEAP_* it was made with */
	struct upcie_heap dheap;
	bool have_dheap;
	void *hbase; /* host heap memory */
	uint64_t hsize;
	void *hbase_dev; /* the same memory as GPU code addresses it */
	bool hregistered;
	struct upcie_heap hheap;
	struct upcie_gpu_hip_iomem_ iomem[UPCIE_GPU_HIP_IOMEM_MAX];
	unsigned ngqp;	  /* GPU-issued queue pairs (gpuq/gqp_host_hip.h) */
	unsigned nmirror; /* mirrored completion queues (gpuq/cqmirror_host_hip.h) */
	void *mirror;	  /* the mirror's state, and how to tear it down */
	void (*mirror_fini)(struct upcie_gpu_hip_proc *p);
};

/* A reference to the process's provider; zeroed when closed. */
struct upcie_gpu_hip {
	struct upcie_gpu_hip_proc *p;
};

UPCIE_WEAK struct upcie_gpu_hip_proc upcie_gpu_hip_proc_g;
UPCIE_WEAK pthread_mutex_t upcie_gpu_hip_lock_g = PTHREAD_MUTEX_INITIALIZER;

/*
 * The allocation containing device pointer `ptr`: its base and size (hipMemGetAddressRange).
 * Returns 0 or -EINVAL (not device memory the runtime knows).
 */
static inline int upcie_gpu_hip_range(const void *ptr, uint64_t *base, uint64_t *size)
{
	hipDeviceptr_t b = NULL;
	size_t n = 0;
	hipError_t r = hipMemGetAddressRange(&b, &n, (hipDeviceptr_t)(uintptr_t)ptr);

	if (r != hipSuccess || !b || !n)
		return UPCIE_FAIL(-EINVAL, "gpu: %p is not HIP device memory (%s)", ptr,
				  upcie_gpu_hip_strerror(r));
	*base = (uint64_t)(uintptr_t)b;
	*size = (uint64_t)n;
	return 0;
}

/*
 * Check what an export describes against the allocation it was asked for (see the file
 * comment). `size` is the allocation rounded up to the page, `described` the dma-buf's size.
 * Returns 0, -EINVAL (describes less: it cannot be the allocation), -EOPNOTSUPP (describes more
 * than one object's rounding: the allocation's place in it is unknown).
 */
static inline int upcie_gpu_hip_export_check(uint64_t base, uint64_t size, uint64_t described)
{
	if (described < size)
		return UPCIE_FAIL(-EINVAL,
				  "gpu: the export of the allocation at 0x%" PRIx64 " (%" PRIu64
				  " bytes) describes only %" PRIu64 " bytes",
				  base, size, described);
	if (described > upcie_align_up(size, UPCIE_GPU_HIP_BO_ROUND))
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "gpu: the export of the allocation at 0x%" PRIx64 " (%" PRIu64
				  " bytes) describes %" PRIu64
				  " bytes, more than a buffer object of its own: the allocation is "
				  "part of a larger object at an offset nobody reports; refused",
				  base, size, described);
	return 0;
}

/*
 * Export the whole allocation containing `ptr` as a dma-buf into *fd, asked from the
 * allocation's base: *base and *size (rounded up to 4 KiB) say what it is, *described what the
 * dma-buf describes (its size), checked by upcie_gpu_hip_export_check(). Returns 0; -EINVAL;
 * -EOPNOTSUPP (ROCm older than 7.0, or the check); the mapped HIP error.
 */
static inline int upcie_gpu_hip_export(const void *ptr, int *fd, uint64_t *base, uint64_t *size,
				       uint64_t *described)
{
	uint64_t b, n;
	int err;

	if (!fd || !base || !size || !described)
		return UPCIE_FAIL(-EINVAL, "gpu: export: NULL argument");
	*fd = -1;
	err = upcie_gpu_hip_range(ptr, &b, &n);
	if (err)
		return err;
	n = upcie_align_up(n, UPCIE_GPU_HIP_PAGE);
	*base = b;
	*size = n;
#if UPCIE_GPU_HIP_HAVE_EXPORT
	{
		int h = -1;
		off_t end;
		hipError_t r;

		r = hipMemGetHandleForAddressRange(&h, (hipDeviceptr_t)(uintptr_t)b, (size_t)n,
						   hipMemRangeHandleTypeDmaBufFd, 0);
		if (r != hipSuccess)
			return UPCIE_GPU_HIP_FAIL(r, "hipMemGetHandleForAddressRange",
						  "export of 0x%" PRIx64 " + 0x%" PRIx64, b, n);
		end = lseek(h, 0, SEEK_END);
		if (end <= 0) {
			err =
			    UPCIE_FAIL(end < 0 ? upcie_neg_errno() : -EIO,
				       "gpu: the export of 0x%" PRIx64 " does not say its size", b);
			close(h);
			return err;
		}
		*described = (uint64_t)end;
		err = upcie_gpu_hip_export_check(b, n, *described);
		if (err) {
			close(h);
			return err;
		}
		*fd = h;
		return 0;
	}
#else
	*described = 0;
	return UPCIE_FAIL(-EOPNOTSUPP,
			  "gpu: exporting device memory as a dma-buf needs "
			  "hipMemGetHandleForAddressRange (ROCm 7.0); this build has HIP %d.%d",
			  HIP_VERSION_MAJOR, HIP_VERSION_MINOR);
#endif
}

/*
 * The largest LUT granule (2 MiB, 64 KiB or 4 KiB) at which `segs` tile `size` bytes (see
 * mem/sglut.h): runs of contiguous segments must start granule aligned and be whole granules
 * except the last. Pure arithmetic, no logging.
 */
static inline unsigned upcie_gpu_hip_granule_pick(const struct upcie_sg_seg *segs, size_t nsegs,
						  uint64_t size)
{
	static const unsigned shifts[] = { 21, 16, 12 };

	for (unsigned k = 0; k < UPCIE_ARRAY_SIZE(shifts); k++) {
		uint64_t g = UINT64_C(1) << shifts[k], done = 0;
		bool fits = true;
		size_t i = 0;

		while (fits && i < nsegs && done < size) {
			uint64_t a = segs[i].addr, len = 0;

			while (i < nsegs && segs[i].addr == a + len && done + len < size)
				len += segs[i++].len;
			if (done + len > size)
				len = size - done;
			fits = upcie_is_aligned(a, g) &&
			       (upcie_is_aligned(len, g) || done + len == size);
			done += len;
		}
		if (fits && done == size)
			return shifts[k];
	}
	return 12;
}

/* Chained onto a dmamem: the constructor's release, then close the exported dma-buf. */
struct upcie_gpu_hip_rel_ {
	upcie_dmamem_release_fn release;
	void *priv;
	int fd;
};

static inline void upcie_gpu_hip_release_(struct upcie_dmamem *mem)
{
	struct upcie_gpu_hip_rel_ *w = (struct upcie_gpu_hip_rel_ *)mem->priv;

	mem->priv = w->priv;
	if (w->release)
		w->release(mem);
	if (w->fd >= 0)
		close(w->fd);
	free(w);
}

/*
 * IMPORT translation: every segment's bus address inside this GPU's memory BAR and none in system
 * RAM (gpu/p2p_check.h). A test may stand in other addresses (UPCIE_GPU_HIP_P2P_CHECK).
 */
#ifndef UPCIE_GPU_HIP_P2P_CHECK
#define UPCIE_GPU_HIP_P2P_CHECK(p, mem, what) upcie_gpu_hip_p2p_check_(p, mem, what)
#endif
static inline int upcie_gpu_hip_p2p_check_(const struct upcie_gpu_hip_proc *p,
					   const struct upcie_dmamem *mem, const char *what)
{
	struct upcie_gpu_p2p_window w;
	struct upcie_gpu_p2p_sysram *s;
	int err;

	err = upcie_gpu_p2p_window_read(p->dev.pci_name, p->dev.bar_index, &w);
	if (err)
		return err;
	s = (struct upcie_gpu_p2p_sysram *)malloc(sizeof(*s));
	if (!s)
		return UPCIE_FAIL(-ENOMEM, "gpu: out of host memory");
	err = upcie_gpu_p2p_sysram_load(s);
	if (!err)
		err = upcie_gpu_p2p_check_dmamem(&w, s, mem, what);
	free(s);
	return err;
}

/* The dmamem of the allocation containing `ptr`: exported and imported (IMPORT), or offset. */
static inline int upcie_gpu_hip_dmamem_(struct upcie_gpu_hip_proc *p, const void *ptr,
					uint64_t *base, uint64_t *size, struct upcie_dmamem *mem)
{
	struct upcie_gpu_hip_rel_ *w;
	uint64_t described = 0;
	int fd = -1, err;

	if (p->xlate == UPCIE_GPU_HIP_XLATE_OFFSET) {
		err = upcie_gpu_hip_range(ptr, base, size);
		if (err)
			return err;
		*size = upcie_align_up(*size, UPCIE_GPU_HIP_PAGE);
		err = upcie_dmamem_init_arith(mem, (void *)(uintptr_t)*base, (size_t)*size,
					      *base + p->iova_offset);
		if (!err)
			mem->kind = "hip-offset";
		return err;
	}
	w = (struct upcie_gpu_hip_rel_ *)malloc(sizeof(*w));
	if (!w)
		return UPCIE_FAIL(-ENOMEM, "gpu: out of host memory");
	err = upcie_gpu_hip_export(ptr, &fd, base, size, &described);
	if (!err) {
		/* The scatter list decides the granule; nothing stays attached from this look. */
		struct upcie_sg_seg *segs = NULL;
		size_t n = 0;
		uint64_t h = 0;
		unsigned shift = 12;

		if (upcie_kmod_dmabuf_attach(&p->kmod, fd, NULL, 0, &n, &h) == -ENOSPC && n) {
			segs = (struct upcie_sg_seg *)calloc(n, sizeof(*segs));
			if (segs && !upcie_kmod_dmabuf_attach(&p->kmod, fd, segs, n, &n, &h)) {
				shift = upcie_gpu_hip_granule_pick(segs, n, *size);
				upcie_kmod_dmabuf_detach(&p->kmod, h);
			}
			free(segs);
		}
		/* Only the allocation's bytes: byte 0 of the export is its base (see above). */
		err = upcie_dmamem_dmabuf_import(mem, &p->kmod, fd, (void *)(uintptr_t)*base, *size,
						 shift);
		/* amdgpu may satisfy the attach by moving the buffer to GTT (host memory): the
		 * addresses must be VRAM behind the BAR (gpu/p2p_check.h). */
		if (!err) {
			err = UPCIE_GPU_HIP_P2P_CHECK(p, mem, "HIP dma-buf export");
			if (err)
				upcie_dmamem_destroy(mem);
		}
	}
	if (err) {
		if (fd >= 0)
			close(fd);
		free(w);
		return err;
	}
	w->release = mem->release;
	w->priv = mem->priv;
	w->fd = fd;
	mem->release = upcie_gpu_hip_release_;
	mem->priv = w;
	mem->kind = "hip-dmabuf-lut";
	return 0;
}

/* Register the whole allocation containing `ptr` with a freshly built dmamem. */
static inline int upcie_gpu_hip_reg_new_(struct upcie_gpu_hip_proc *p, const void *ptr)
{
	struct upcie_dmamem mem;
	uint64_t base = 0, size = 0;
	int err = upcie_gpu_hip_dmamem_(p, ptr, &base, &size, &mem);

	if (err)
		return err;
	err =
	    upcie_registry_register(&p->reg, (const void *)(uintptr_t)base, (size_t)size, &mem, 0);
	if (err)
		upcie_dmamem_destroy(&mem);
	return err;
}

static inline void upcie_gpu_hip_unreg_(struct upcie_gpu_hip_proc *p, const void *base)
{
	struct upcie_dmamem hb;

	if (!upcie_registry_unregister(&p->reg, base, &hb))
		upcie_dmamem_destroy(&hb);
}

/* The verdict of upcie_gpu_hip_payload_check() on the attributes the runtime reported for `ptr`:
 * 0, -EXDEV, -EOPNOTSUPP (see there). */
static inline int upcie_gpu_hip_payload_verdict(const hipPointerAttribute_t *attr, const void *ptr,
						const char *what)
{
	hipPointerAttribute_t a = *attr;

	if (a.memoryType == hipMemoryTypeHost)
		return UPCIE_FAIL(
		    -EXDEV,
		    "gpu: %s at %p is host memory: a GPU-side completion does not vouch "
		    "for it",
		    what, ptr);
	if (a.memoryType != hipMemoryTypeDevice || a.isManaged)
		return UPCIE_FAIL(-EOPNOTSUPP, "gpu: %s at %p: not plain device memory (type %d)",
				  what, ptr, (int)a.memoryType);
	if (a.allocationFlags != UPCIE_GPU_HIP_MALLOC_UNCACHED &&
	    a.allocationFlags != UPCIE_GPU_HIP_MALLOC_FINEGRAINED)
		return UPCIE_FAIL(
		    -EOPNOTSUPP,
		    "gpu: %s at %p is coarse-grained VRAM (allocation flags 0x%x): the "
		    "GPU's L2 may serve it stale after a completion; allocate it with "
		    "hipExtMallocWithFlags(hipDeviceMallocUncached or "
		    "hipDeviceMallocFinegrained), or from a device heap opened with "
		    "UPCIE_GPU_HIP_HEAP_FINEGRAINED",
		    what, ptr, a.allocationFlags);
	return 0;
}

/*
 * Whether GPU code that acquires after a completion reads fresh payload at `ptr`. The HIP acquire
 * (base/arch_hip.h) invalidates L0/L1 but the L2 only for lines it does not keep coherent
 * (gfx90a: buffer_invl2 drops non-coherent lines; gfx940: buffer_inv sc0 sc1), so an ordinary
 * (coarse-grained) VRAM line that a peer's PCIe write went around can still be served stale from
 * the L2 after the completion. Payloads that GPU code reads after a GPU-side completion must be
 * uncached (hipExtMallocWithFlags hipDeviceMallocUncached) or fine-grained
 * (hipDeviceMallocFinegrained), as a device heap opened with UPCIE_GPU_HIP_HEAP_FINEGRAINED or
 * UPCIE_GPU_HIP_HEAP_UNCACHED is (the open runs this check on it). Returns 0; -EOPNOTSUPP
 * (coarse-grained, or the runtime does not say how it was allocated: the setup refuses where it
 * cannot know); -EXDEV (host memory: on a
 * direct queue, whose CQ is in VRAM, its completion and its data take two paths; a bridged queue
 * may take it, see gpuq/gqp_hip.h); a HIP error.
 * Not run on an AMD GPU here (none was available): compiled, and the acquire sequences it relies
 * on are checked in the disassembly (tests/hip/check-disasm.sh).
 */
static inline int upcie_gpu_hip_payload_check(const void *ptr, const char *what)
{
	hipPointerAttribute_t a;
	hipError_t r;

	memset(&a, 0, sizeof(a));
	r = hipPointerGetAttributes(&a, ptr);
	if (r != hipSuccess)
		return UPCIE_GPU_HIP_FAIL(r, "hipPointerGetAttributes", "%s at %p", what, ptr);
	return upcie_gpu_hip_payload_verdict(&a, ptr, what);
}

/*
 * The hipExtMallocWithFlags flags of a device heap made with `flags` (UPCIE_GPU_HIP_HEAP_*) into
 * *malloc_flags; 0 there means a plain hipMalloc (coarse-grained). Returns 0, or -EINVAL (unknown
 * bits, or both kinds at once; *malloc_flags untouched).
 */
static inline int upcie_gpu_hip_heap_flags_check(unsigned flags, unsigned *malloc_flags)
{
	if (flags & ~(UPCIE_GPU_HIP_HEAP_FINEGRAINED | UPCIE_GPU_HIP_HEAP_UNCACHED))
		return UPCIE_FAIL(-EINVAL, "gpu: unknown device heap flags 0x%x", flags);
	if ((flags & UPCIE_GPU_HIP_HEAP_FINEGRAINED) && (flags & UPCIE_GPU_HIP_HEAP_UNCACHED))
		return UPCIE_FAIL(-EINVAL,
				  "gpu: a device heap is fine-grained or uncached, not both "
				  "(flags 0x%x)",
				  flags);
	if (malloc_flags)
		*malloc_flags =
		    flags == UPCIE_GPU_HIP_HEAP_FINEGRAINED ? UPCIE_GPU_HIP_MALLOC_FINEGRAINED
		    : flags == UPCIE_GPU_HIP_HEAP_UNCACHED  ? UPCIE_GPU_HIP_MALLOC_UNCACHED
							    : 0u;
	return 0;
}

/* The device heap's allocation of `size` bytes, of the memory `flags` asks for (checked). */
static inline int upcie_gpu_hip_dheap_open_(struct upcie_gpu_hip_proc *p, uint64_t size,
					    unsigned flags)
{
	const char *kind = flags == UPCIE_GPU_HIP_HEAP_FINEGRAINED ? "fine-grained"
			   : flags == UPCIE_GPU_HIP_HEAP_UNCACHED  ? "uncached"
								   : "coarse-grained";
	struct upcie_registry_hit hit;
	unsigned mflags = 0;
	hipError_t r;
	int err;

	err = upcie_gpu_hip_heap_flags_check(flags, &mflags);
	if (err)
		return err;
	if (mflags)
		r = hipExtMallocWithFlags(&p->dbase, (size_t)size, mflags);
	else
		r = hipMalloc(&p->dbase, (size_t)size);
	if (r != hipSuccess) {
		p->dbase = NULL;
		return UPCIE_GPU_HIP_FAIL(
		    r, mflags ? "hipExtMallocWithFlags" : "hipMalloc",
		    "%s device heap of %" PRIu64 " MiB%s", kind, size >> 20,
		    flags == UPCIE_GPU_HIP_HEAP_UNCACHED
			? " (a runtime that does not know hipDeviceMallocUncached refuses it: "
			  "UPCIE_GPU_HIP_HEAP_FINEGRAINED is the other memory payloads may use)"
			: "");
	}
	p->dsize = size;
	p->dflags = flags;
	/* The heap is for payloads GPU code reads after a completion: the check must take it. */
	err = mflags ? upcie_gpu_hip_payload_check(p->dbase, "the device heap") : 0;
	if (err) {
		upcie_gpu_hip_check_(hipFree(p->dbase), "hipFree");
		p->dbase = NULL;
		return UPCIE_FAIL(err,
				  "gpu: the runtime does not report the %s device heap as memory "
				  "payloads may be read from; refused",
				  kind);
	}
	err = upcie_gpu_hip_reg_new_(p, p->dbase);
	if (!err)
		err = upcie_registry_lookup(&p->reg, p->dbase, &hit);
	if (!err)
		err = upcie_heap_init(&p->dheap, hit.mem);
	if (err) {
		upcie_gpu_hip_unreg_(p, p->dbase);
		upcie_gpu_hip_check_(hipFree(p->dbase), "hipFree");
		p->dbase = NULL;
		return UPCIE_FAIL(err, "gpu: device heap of %" PRIu64 " MiB not set up",
				  size >> 20);
	}
	p->have_dheap = true;
	return 0;
}

static inline void upcie_gpu_hip_dheap_close_(struct upcie_gpu_hip_proc *p)
{
	if (!p->dbase)
		return;
	if (p->have_dheap)
		upcie_heap_fini(&p->dheap);
	p->have_dheap = false;
	upcie_gpu_hip_unreg_(p, p->dbase);
	upcie_gpu_hip_check_(hipFree(p->dbase), "hipFree");
	p->dbase = NULL;
}

static inline void upcie_gpu_hip_hp_release_(struct upcie_dmamem *mem)
{
	struct upcie_hugepage *hp = (struct upcie_hugepage *)mem->priv;

	upcie_hugepage_free(hp);
	free(hp);
	mem->priv = NULL;
}

/* OFFSET host memory: hugepages where the caller gave options, else plain pages. */
static inline int upcie_gpu_hip_host_offset_(struct upcie_gpu_hip_proc *p, uint64_t size,
					     const struct upcie_hugepage_opts *opts,
					     struct upcie_dmamem *mem)
{
	struct upcie_hugepage_opts plain;
	struct upcie_hugepage *hp;
	int err;

	hp = (struct upcie_hugepage *)calloc(1, sizeof(*hp));
	if (!hp)
		return UPCIE_FAIL(-ENOMEM, "gpu: out of host memory");
	memset(&plain, 0, sizeof(plain));
	plain.src = UPCIE_HUGEPAGE_PLAIN;
	plain.no_mlock = true; /* hipHostRegister pins it */
	err = upcie_hugepage_alloc(hp, (size_t)size, opts ? opts : &plain);
	if (!err)
		err = upcie_dmamem_init_arith(mem, hp->vaddr, hp->size,
					      (uint64_t)(uintptr_t)hp->vaddr + p->iova_offset);
	if (err) {
		upcie_hugepage_free(hp);
		free(hp);
		return err;
	}
	mem->release = upcie_gpu_hip_hp_release_;
	mem->priv = hp;
	mem->kind = "host-offset";
	return 0;
}

static inline int upcie_gpu_hip_hheap_open_(struct upcie_gpu_hip_proc *p, uint64_t size,
					    const struct upcie_hugepage_opts *opts)
{
	struct upcie_registry_hit hit;
	struct upcie_dmamem mem;
	hipError_t r;
	int err;

	if (p->xlate == UPCIE_GPU_HIP_XLATE_IMPORT)
		err = upcie_dmamem_hugepage_lut(&mem, (size_t)size, opts);
	else
		err = upcie_gpu_hip_host_offset_(p, size, opts, &mem);
	if (err)
		return UPCIE_FAIL(err, "gpu: no host heap of %" PRIu64 " MiB", size >> 20);
	p->hbase = mem.vaddr;
	p->hsize = mem.size;
	r = hipHostRegister(p->hbase, (size_t)p->hsize, hipHostRegisterMapped);
	if (r == hipSuccess)
		p->hregistered = true;
	if (r == hipSuccess)
		r = hipHostGetDevicePointer(&p->hbase_dev, p->hbase, 0);
	if (r != hipSuccess) {
		err = UPCIE_GPU_HIP_FAIL(r, "hipHostRegister/hipHostGetDevicePointer",
					 "host heap of %" PRIu64 " MiB", size >> 20);
		goto fail;
	}
	err = upcie_registry_register(&p->reg, p->hbase, (size_t)p->hsize, &mem, 0);
	if (err)
		goto fail;
	err = upcie_registry_lookup(&p->reg, p->hbase, &hit);
	if (!err)
		err = upcie_heap_init(&p->hheap, hit.mem);
	if (err) {
		upcie_gpu_hip_check_(hipHostUnregister(p->hbase), "hipHostUnregister");
		p->hregistered = false;
		upcie_gpu_hip_unreg_(p, p->hbase);
		p->hbase = NULL;
		return err;
	}
	return 0;
fail:
	if (p->hregistered)
		upcie_gpu_hip_check_(hipHostUnregister(p->hbase), "hipHostUnregister");
	p->hregistered = false;
	upcie_dmamem_destroy(&mem);
	p->hbase = NULL;
	return err;
}

static inline void upcie_gpu_hip_hheap_close_(struct upcie_gpu_hip_proc *p)
{
	if (!p->hbase)
		return;
	upcie_heap_fini(&p->hheap);
	if (p->hregistered)
		upcie_gpu_hip_check_(hipHostUnregister(p->hbase), "hipHostUnregister");
	p->hregistered = false;
	upcie_gpu_hip_unreg_(p, p->hbase);
	p->hbase = NULL;
}

/* Tear down everything; called with the lock held. */
static inline void upcie_gpu_hip_proc_fini_(struct upcie_gpu_hip_proc *p)
{
	struct upcie_gpu_hip_dev_save save;
	bool entered = p->dev.live && !upcie_gpu_hip_dev_enter(&p->dev, &save);

	if (p->mirror_fini)
		p->mirror_fini(p);
	if (p->ngqp || p->nmirror)
		UPCIE_WARN("gpu: last close with %u GPU-issued and %u mirrored queues left",
			   p->ngqp, p->nmirror);
	for (unsigned i = 0; i < UPCIE_GPU_HIP_IOMEM_MAX; i++)
		if (p->iomem[i].refs && entered)
			upcie_gpu_hip_check_(hipHostUnregister((void *)p->iomem[i].start),
					     "hipHostUnregister");
	upcie_gpu_hip_hheap_close_(p);
	upcie_gpu_hip_dheap_close_(p);
	upcie_registry_fini(&p->reg);
	if (p->kmod_open)
		upcie_kmod_dmabuf_import_close(&p->kmod);
	if (entered)
		upcie_gpu_hip_dev_leave(&p->dev, &save);
	upcie_gpu_hip_dev_close(&p->dev);
	memset(p, 0, sizeof(*p));
}

static inline int upcie_gpu_hip_proc_init_(struct upcie_gpu_hip_proc *p,
					   const struct upcie_gpu_hip_opts *o)
{
	uint64_t dsize = o->device_heap_size ? o->device_heap_size : UPCIE_GPU_HIP_HEAP_DEFAULT;
	uint64_t hsize = o->host_heap_size ? o->host_heap_size : UPCIE_GPU_HIP_HEAP_DEFAULT;
	struct upcie_gpu_hip_dev_save save;
	bool entered = false;
	int err;

	memset(p, 0, sizeof(*p));
	p->xlate = o->xlate;
	p->iova_offset = o->iova_offset;
	if (o->xlate != UPCIE_GPU_HIP_XLATE_IMPORT && o->xlate != UPCIE_GPU_HIP_XLATE_OFFSET)
		return UPCIE_FAIL(-EINVAL, "gpu: unknown translation %d", (int)o->xlate);
	err = upcie_gpu_hip_heap_flags_check(o->device_heap_flags, NULL);
	if (err)
		return err;
	dsize = upcie_align_up(dsize, UPCIE_GPU_HIP_HEAP_ALIGN);
	if (p->xlate == UPCIE_GPU_HIP_XLATE_IMPORT) {
		if (!UPCIE_GPU_HIP_HAVE_EXPORT)
			return UPCIE_FAIL(
			    -EOPNOTSUPP,
			    "gpu: the device heap is exported as a dma-buf, which "
			    "needs hipMemGetHandleForAddressRange (ROCm 7.0); this "
			    "build has HIP %d.%d: use UPCIE_GPU_HIP_XLATE_OFFSET or a "
			    "newer ROCm",
			    HIP_VERSION_MAJOR, HIP_VERSION_MINOR);
		err = upcie_kmod_dmabuf_import_open(&p->kmod);
		if (err)
			return UPCIE_FAIL(err,
					  "gpu: the device heap needs the dma-buf import module "
					  "(package upcie-dmabuf-import-dkms); or open with "
					  "UPCIE_GPU_HIP_XLATE_OFFSET where a mapping provides the "
					  "addresses");
		p->kmod_open = true;
	}
	err = upcie_gpu_hip_dev_open(&p->dev, o->gpu_id);
	if (err)
		goto fail;
	if (!p->dev.wall_khz)
		p->dev.wall_khz = o->wall_khz;
	err = upcie_gpu_hip_dev_enter(&p->dev, &save);
	if (err)
		goto fail;
	entered = true;
	err = upcie_registry_init(&p->reg);
	if (!err)
		err = upcie_gpu_hip_dheap_open_(p, dsize, o->device_heap_flags);
	if (!err)
		err = upcie_gpu_hip_hheap_open_(p, hsize, o->host_pages);
	if (err)
		goto fail;
	upcie_gpu_hip_dev_leave(&p->dev, &save);
	p->refs = 1;
	return 0;
fail:
	if (entered)
		upcie_gpu_hip_dev_leave(&p->dev, &save);
	upcie_gpu_hip_proc_fini_(p);
	return err;
}

/*
 * Open the provider on GPU opts->gpu_id. The first open in the process sets up the GPU, both
 * heaps and the registry with these options; later opens take a reference and must name the same
 * GPU and translation, and device heap flags of 0 or those the heap was made with (-EINVAL
 * otherwise). Returns 0; -EINVAL (unknown translation or device heap flags, both heap kinds);
 * -EOPNOTSUPP (IMPORT with a ROCm older than 7.0, a BAR smaller than VRAM, a fine-grained or
 * uncached heap the runtime does not report as such); -ENOENT (IMPORT without the module);
 * -ENODEV (no GPU or runtime); -ENOMEM; a hugepage or HIP error (a runtime refusing the heap's
 * memory kind). `gpu` is zeroed on failure.
 */
static inline int upcie_gpu_hip_open(struct upcie_gpu_hip *gpu,
				     const struct upcie_gpu_hip_opts *opts)
{
	struct upcie_gpu_hip_proc *p = &upcie_gpu_hip_proc_g;
	struct upcie_gpu_hip_opts def;
	int err = 0;

	if (!gpu)
		return UPCIE_FAIL(-EINVAL, "gpu: NULL handle");
	gpu->p = NULL;
	if (!opts) {
		memset(&def, 0, sizeof(def));
		opts = &def;
	}
	err = upcie_gpu_hip_heap_flags_check(opts->device_heap_flags, NULL);
	if (err)
		return err;
	pthread_mutex_lock(&upcie_gpu_hip_lock_g);
	if (p->refs) {
		if (opts->gpu_id != p->dev.ordinal || opts->xlate != p->xlate)
			err = UPCIE_FAIL(-EINVAL,
					 "gpu: the provider is open on GPU %d (translation %d); "
					 "asked for GPU %d (translation %d): one GPU per process",
					 p->dev.ordinal, (int)p->xlate, opts->gpu_id,
					 (int)opts->xlate);
		else if (opts->device_heap_flags && opts->device_heap_flags != p->dflags)
			err = UPCIE_FAIL(-EINVAL,
					 "gpu: the device heap was made with flags 0x%x; asked for "
					 "0x%x: the first open chooses its memory",
					 p->dflags, opts->device_heap_flags);
		else
			p->refs++;
	} else {
		err = upcie_gpu_hip_proc_init_(p, opts);
	}
	pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
	if (!err)
		gpu->p = p;
	return err;
}

/* Drop the reference; the last one frees both heaps and the registry. A zeroed handle: no-op. */
static inline void upcie_gpu_hip_close(struct upcie_gpu_hip *gpu)
{
	if (!gpu || !gpu->p)
		return;
	pthread_mutex_lock(&upcie_gpu_hip_lock_g);
	if (--gpu->p->refs == 0)
		upcie_gpu_hip_proc_fini_(gpu->p);
	pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
	gpu->p = NULL;
}

/* Accessors (valid while the handle is open). */
static inline struct upcie_heap *upcie_gpu_hip_heap(const struct upcie_gpu_hip *gpu)
{
	return &gpu->p->dheap;
}

/* The UPCIE_GPU_HIP_HEAP_* flags the device heap was made with (0: coarse-grained). */
static inline unsigned upcie_gpu_hip_heap_flags(const struct upcie_gpu_hip *gpu)
{
	return gpu->p->dflags;
}

/* The host heap (pinned host memory the GPU maps), for allocations by offset. */
static inline struct upcie_heap *upcie_gpu_hip_host_heap(const struct upcie_gpu_hip *gpu)
{
	return &gpu->p->hheap;
}

/* The registry resolving pointers into both heaps and registered buffers to device addresses. */
static inline struct upcie_registry *upcie_gpu_hip_registry(const struct upcie_gpu_hip *gpu)
{
	return &gpu->p->reg;
}

/* The GPU the handle was opened on (for upcie_gpu_hip_dev_enter()). */
static inline const struct upcie_gpu_hip_dev *upcie_gpu_hip_device(const struct upcie_gpu_hip *gpu)
{
	return &gpu->p->dev;
}

/* The address GPU code uses for host-heap memory at CPU address `vaddr`, or NULL outside it. */
static inline void *upcie_gpu_hip_host_devptr(const struct upcie_gpu_hip *gpu, const void *vaddr)
{
	uintptr_t v = (uintptr_t)vaddr, b = (uintptr_t)gpu->p->hbase;

	if (v < b || v - b >= gpu->p->hsize)
		return NULL;
	return (char *)gpu->p->hbase_dev + (v - b);
}

/*
 * Device heap: `size` bytes aligned to `align` (buf->vaddr is the GPU address), of the memory the
 * heap was made with (upcie_gpu_hip_heap_flags()).
 */
static inline int upcie_gpu_hip_alloc(struct upcie_gpu_hip *gpu, uint64_t size, uint64_t align,
				      struct upcie_heap_buf *buf)
{
	return upcie_heap_alloc(&gpu->p->dheap, size, align, buf);
}

/*
 * Return a device-heap buffer of upcie_gpu_hip_alloc(). 0, or -EINVAL for a buffer not allocated
 * there (nothing changed). Only once no device can still DMA into it.
 */
static inline int upcie_gpu_hip_free(struct upcie_gpu_hip *gpu, const struct upcie_heap_buf *buf)
{
	return upcie_heap_free(&gpu->p->dheap, buf->off);
}

/* Host heap: `size` bytes aligned to `align` (buf->vaddr is the CPU address). */
static inline int upcie_gpu_hip_host_alloc(struct upcie_gpu_hip *gpu, uint64_t size, uint64_t align,
					   struct upcie_heap_buf *buf)
{
	return upcie_heap_alloc(&gpu->p->hheap, size, align, buf);
}

/* Return a host-heap buffer of upcie_gpu_hip_host_alloc(); as upcie_gpu_hip_free(). */
static inline int upcie_gpu_hip_host_free(struct upcie_gpu_hip *gpu,
					  const struct upcie_heap_buf *buf)
{
	return upcie_heap_free(&gpu->p->hheap, buf->off);
}

/*
 * Map device registers at host address [addr, addr + len) (inside an mmap of a PCI BAR, e.g. NVMe
 * doorbells in BAR0) into the GPU: hipHostRegister with hipHostRegisterIoMemory over the whole
 * pages, shared by reference. *dptr receives the address GPU code stores to for `addr`. Returns
 * 0; -EEXIST (overlaps a mapping of other pages); -ENOSPC (table full); the mapped HIP error
 * (ROCm on consumer RDNA refuses a peer's BAR here with hipErrorInvalidValue, on 7.1 and 7.2:
 * use the doorbell bridge, gpuq/bridge_hip.h).
 */
static inline int upcie_gpu_hip_iomem_map(struct upcie_gpu_hip *gpu, volatile void *addr,
					  size_t len, void **dptr)
{
	struct upcie_gpu_hip_proc *p = gpu->p;
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)addr;
	uintptr_t start = upcie_align_down(a, pg), end = upcie_align_up(a + len, pg);
	struct upcie_gpu_hip_dev_save save;
	struct upcie_gpu_hip_iomem_ *e, *slot = NULL;
	void *d = NULL;
	hipError_t r = hipSuccess;
	int err = 0;

	if (!len)
		return UPCIE_FAIL(-EINVAL, "gpu: empty register range");
	pthread_mutex_lock(&upcie_gpu_hip_lock_g);
	for (unsigned i = 0; i < UPCIE_GPU_HIP_IOMEM_MAX; i++) {
		e = &p->iomem[i];
		if (!e->refs) {
			if (!slot)
				slot = e;
			continue;
		}
		if (start >= e->start && end <= e->start + e->len) {
			e->refs++;
			*dptr = (char *)e->dptr + (a - e->start);
			pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
			return 0;
		}
		if (start < e->start + e->len && e->start < end)
			err = -EEXIST;
	}
	if (!err && !slot)
		err = -ENOSPC;
	if (!err)
		err = upcie_gpu_hip_dev_enter(&p->dev, &save);
	if (!err) {
		r = hipHostRegister((void *)start, end - start,
				    hipHostRegisterIoMemory | hipHostRegisterMapped);
		if (r == hipSuccess) {
			r = hipHostGetDevicePointer(&d, (void *)start, 0);
			if (r != hipSuccess)
				upcie_gpu_hip_check_(hipHostUnregister((void *)start),
						     "hipHostUnregister");
		}
		upcie_gpu_hip_dev_leave(&p->dev, &save);
		if (r == hipSuccess) {
			slot->start = start;
			slot->len = end - start;
			slot->dptr = d;
			slot->refs = 1;
			*dptr = (char *)d + (a - start);
		}
	}
	pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
	if (err == -EEXIST)
		return UPCIE_FAIL(err, "gpu: registers at %p overlap other mapped registers",
				  (void *)a);
	if (err == -ENOSPC)
		return UPCIE_FAIL(err, "gpu: more than %d register ranges mapped",
				  UPCIE_GPU_HIP_IOMEM_MAX);
	if (err)
		return err;
	if (r != hipSuccess)
		return UPCIE_GPU_HIP_FAIL(r, "hipHostRegister(IoMemory)",
					  "mapping registers at %p for the GPU", (void *)a);
	return 0;
}

/* Drop a reference taken by upcie_gpu_hip_iomem_map() for `addr`. 0 or -ENOENT. */
static inline int upcie_gpu_hip_iomem_unmap(struct upcie_gpu_hip *gpu, volatile void *addr)
{
	struct upcie_gpu_hip_proc *p = gpu->p;
	struct upcie_gpu_hip_dev_save save;
	uintptr_t a = (uintptr_t)addr;
	int err = -ENOENT;

	pthread_mutex_lock(&upcie_gpu_hip_lock_g);
	for (unsigned i = 0; i < UPCIE_GPU_HIP_IOMEM_MAX; i++) {
		struct upcie_gpu_hip_iomem_ *e = &p->iomem[i];

		if (!e->refs || a < e->start || a >= e->start + e->len)
			continue;
		err = 0;
		if (--e->refs)
			break;
		if (!upcie_gpu_hip_dev_enter(&p->dev, &save)) {
			upcie_gpu_hip_check_(hipHostUnregister((void *)e->start),
					     "hipHostUnregister");
			upcie_gpu_hip_dev_leave(&p->dev, &save);
		}
		memset(e, 0, sizeof(*e));
		break;
	}
	pthread_mutex_unlock(&upcie_gpu_hip_lock_g);
	if (err)
		return UPCIE_FAIL(err, "gpu: registers at %p are not mapped", (void *)a);
	return 0;
}

/*
 * Register the hipMalloc allocation containing `ptr` (any interior pointer; `size` bytes from
 * ptr must lie inside it, 0 for no check): the whole allocation is exported from its base and
 * entered in the registry, or an existing registration gains a reference. Returns 0; -EINVAL
 * (not device memory, size beyond the allocation, an export describing less); -EOPNOTSUPP (ROCm
 * older than 7.0, or an allocation inside a larger buffer object); -EEXIST (overlaps another
 * registration); -ENOENT (module gone).
 */
static inline int upcie_gpu_hip_buf_register(struct upcie_gpu_hip *gpu, const void *ptr,
					     size_t size)
{
	struct upcie_gpu_hip_dev_save save;
	struct upcie_registry_hit hit;
	uint64_t base, rsize;
	int err;

	if (!gpu || !gpu->p)
		return UPCIE_FAIL(-EINVAL, "gpu: register on a closed provider");
	err = upcie_gpu_hip_dev_enter(&gpu->p->dev, &save);
	if (err)
		return err;
	err = upcie_gpu_hip_range(ptr, &base, &rsize);
	upcie_gpu_hip_dev_leave(&gpu->p->dev, &save);
	if (err)
		return err;
	if (size && ((uintptr_t)ptr - base > rsize || size > rsize - ((uintptr_t)ptr - base)))
		return UPCIE_FAIL(-EINVAL, "gpu: %p + %zu reaches past its allocation", ptr, size);
	if (!upcie_registry_lookup(&gpu->p->reg, ptr, &hit) &&
	    (uint64_t)(uintptr_t)hit.base == base) {
		err = upcie_registry_register(&gpu->p->reg, hit.base, hit.size, NULL, 0);
		if (err != -ENOENT)
			return err;
	}
	err = upcie_gpu_hip_dev_enter(&gpu->p->dev, &save);
	if (err)
		return err;
	err = upcie_gpu_hip_reg_new_(gpu->p, ptr);
	upcie_gpu_hip_dev_leave(&gpu->p->dev, &save);
	return err;
}

/*
 * Drop one reference of the registration containing `ptr`; the last releases the export. Call
 * before hipFree. Returns 0, -ENOENT (not registered), -EBUSY (a heap, which the provider owns).
 */
static inline int upcie_gpu_hip_buf_unregister(struct upcie_gpu_hip *gpu, const void *ptr)
{
	struct upcie_registry_hit hit;
	int err;

	if (!gpu || !gpu->p)
		return UPCIE_FAIL(-EINVAL, "gpu: unregister on a closed provider");
	err = upcie_registry_lookup(&gpu->p->reg, ptr, &hit);
	if (err)
		return UPCIE_FAIL(err, "gpu: unregister of %p, which is not registered", ptr);
	if (hit.base == gpu->p->dbase || hit.base == gpu->p->hbase) {
		struct upcie_registry_node *nd;

		pthread_rwlock_rdlock(&gpu->p->reg.lock);
		nd = upcie_registry_find_(&gpu->p->reg, (uint64_t)(uintptr_t)ptr);
		err = nd && nd->refs > 1 ? 0 : -EBUSY;
		pthread_rwlock_unlock(&gpu->p->reg.lock);
		if (err)
			return UPCIE_FAIL(err, "gpu: %p is heap memory, not a registration", ptr);
	}
	return upcie_registry_unregister(&gpu->p->reg, hit.base, NULL);
}

/* Device address of `ptr` in any registered range (heaps included). 0 or -ENOENT. */
static inline int upcie_gpu_hip_iova(struct upcie_gpu_hip *gpu, const void *ptr, uint64_t *iova)
{
	return upcie_registry_iova(&gpu->p->reg, ptr, iova);
}

/* Polled device memory: see the header's comment. */
struct upcie_gpu_hip_polled {
	void *ptr;     /* GPU address */
	uint64_t size; /* bytes asked for */
	uint64_t iova; /* the controller's address of ptr; contiguous over size */
	bool uncached; /* hipDeviceMallocUncached; false: fine-grained */
	bool registered;
};

/* Free polled memory; a zeroed one is a no-op. */
static inline void upcie_gpu_hip_polled_free(struct upcie_gpu_hip *gpu,
					     struct upcie_gpu_hip_polled *m)
{
	struct upcie_gpu_hip_dev_save save;

	if (!m || !m->ptr || !gpu || !gpu->p)
		return;
	if (m->registered)
		upcie_gpu_hip_buf_unregister(gpu, m->ptr);
	if (!upcie_gpu_hip_dev_enter(&gpu->p->dev, &save)) {
		upcie_gpu_hip_check_(hipFree(m->ptr), "hipFree");
		upcie_gpu_hip_dev_leave(&gpu->p->dev, &save);
	}
	memset(m, 0, sizeof(*m));
}

/*
 * `size` bytes (at most 2 MiB) of polled device memory, zeroed on `stream` (0: the null stream),
 * registered, contiguous for the controller from m->iova. Returns 0; -EINVAL; -EOPNOTSUPP (not
 * contiguous for the controller: smaller LUT granules than the range); a HIP or registration
 * error. `m` is zeroed on failure. hipFree, which upcie_gpu_hip_polled_free() calls, waits for
 * the device: free none while a resident kernel runs.
 */
static inline int upcie_gpu_hip_polled_alloc(struct upcie_gpu_hip *gpu, uint64_t size,
					     hipStream_t stream, struct upcie_gpu_hip_polled *m)
{
	struct upcie_gpu_hip_dev_save save;
	hipError_t r;
	int err;

	if (!m)
		return UPCIE_FAIL(-EINVAL, "gpu: NULL polled memory");
	memset(m, 0, sizeof(*m));
	if (!gpu || !gpu->p || !size || size > UPCIE_GPU_HIP_BO_ROUND)
		return UPCIE_FAIL(-EINVAL, "gpu: polled memory of %" PRIu64 " bytes (1..2 MiB)",
				  size);
	err = upcie_gpu_hip_dev_enter(&gpu->p->dev, &save);
	if (err)
		return err;
	r = hipExtMallocWithFlags(&m->ptr, (size_t)size, UPCIE_GPU_HIP_MALLOC_UNCACHED);
	m->uncached = r == hipSuccess;
	if (r != hipSuccess) {
		UPCIE_WARN(
		    "gpu: uncached device memory refused (%s); polled memory is fine-grained, "
		    "which the GPU's L2 may still cache",
		    upcie_gpu_hip_strerror(r));
		m->ptr = NULL;
		r = hipExtMallocWithFlags(&m->ptr, (size_t)size, hipDeviceMallocFinegrained);
	}
	if (r == hipSuccess)
		r = hipMemsetAsync(m->ptr, 0, (size_t)size, stream);
	if (r == hipSuccess)
		r = hipStreamSynchronize(stream);
	upcie_gpu_hip_dev_leave(&gpu->p->dev, &save);
	if (r != hipSuccess) {
		err = UPCIE_GPU_HIP_FAIL(r, "hipExtMallocWithFlags/hipMemset",
					 "%" PRIu64 " bytes of polled device memory", size);
		if (m->ptr)
			upcie_gpu_hip_polled_free(gpu, m);
		memset(m, 0, sizeof(*m));
		return err;
	}
	m->size = size;
	err = upcie_gpu_hip_buf_register(gpu, m->ptr, (size_t)size);
	m->registered = !err;
	if (!err)
		err = upcie_gpu_hip_iova(gpu, m->ptr, &m->iova);
	for (uint64_t o = UPCIE_GPU_HIP_PAGE; !err && o < size; o += UPCIE_GPU_HIP_PAGE) {
		uint64_t a = 0;

		err = upcie_gpu_hip_iova(gpu, (char *)m->ptr + o, &a);
		if (!err && a != m->iova + o)
			err = UPCIE_FAIL(-EOPNOTSUPP,
					 "gpu: polled memory at %p is not contiguous for the "
					 "controller (page %" PRIu64 ")",
					 m->ptr, o / UPCIE_GPU_HIP_PAGE);
	}
	if (err) {
		upcie_gpu_hip_polled_free(gpu, m);
		return err;
	}
	return 0;
}

#endif /* UPCIE_GPU_HEAP_HIP_H */
