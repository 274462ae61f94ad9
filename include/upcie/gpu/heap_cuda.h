/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The CUDA provider: the process's device heap, host heap and registry of GPU memory, so that an
 * NVMe controller can move data straight to and from GPU memory.
 *
 * Device heap (1 GiB by default, rounded up to 64 KiB): one cuMemAlloc, exported as a dma-buf
 * (cuMemGetHandleForAddressRange, asking for a PCIe BAR1 mapping where the driver knows the flag),
 * resolved to bus addresses by the dmabuf_import module (kmod/dmabuf_import.h) and described by a
 * LUT dmamem of 64 KiB granules, the granule the CUDA exporter works in; a upcie heap on top.
 * Every granule's bus address is checked to lie inside this GPU's BAR1 and outside system RAM
 * (gpu/p2p_check.h), here and for every registration: an export that landed in host memory is
 * refused with -EXDEV instead of handing the controller addresses of pages that are not VRAM.
 * PRPs are built at 4 KiB inside each 64 KiB entry (a LUT granule is device contiguous).
 * Host heap (1 GiB by default, rounded up to the hugepage size): hugepages for SQs, CQs and PRP
 * lists, described by physical addresses (the uio_pci_generic case), registered with CUDA
 * (cuMemHostRegister, DEVICEMAP) so GPU code and the completion mirror can reach it.
 * Both heaps are allocated once per process, by the first upcie_gpu_cuda_open(): the sizes and
 * the GPU given to that open take effect; later opens take a reference; the last close frees.
 * The heap lives in the context gpu/dev_cuda.h chooses (the caller's, or the primary context).
 *
 * Caller memory: upcie_gpu_cuda_buf_register() takes any pointer into a cuMemAlloc allocation,
 * recovers the allocation's base and size (cuMemGetAddressRange), exports its whole 64 KiB
 * granules and records the range in the same registry as the heaps, refcounted, so every interior
 * pointer resolves to a device address (upcie_gpu_cuda_iova()). Unregister before cuMemFree.
 *
 * Translation (opts.xlate): IMPORT (default) is the above and needs /dev/dmabuf_import (package
 * upcie-dmabuf-import-dkms; without it the first open fails with -ENOENT naming the package).
 * OFFSET
 * makes every device address the virtual address plus opts.iova_offset: for a controller that
 * reaches the process's memory through a mapping laid out that way, and for the GPU-side test
 * controller (tests/gpu); it needs no module and no root, exports all the same (so the driver's
 * export behaviour is exercised), and takes the host heap from hugepages when there are free ones,
 * else from plain pages.
 *
 * Locking: open/close take a process-wide mutex; the heaps and the registry lock themselves.
 * Needs: CUDA driver API (-lcuda), BAR1 covering VRAM, hugepages (IMPORT: also root, for
 * pagemap). Does not: map memory into an IOMMU (vfio layers do), create NVMe queues
 * (gpuq/gqp_host_cuda.h, gpuq/cqmirror_host_cuda.h).
 */
#ifndef UPCIE_GPU_HEAP_CUDA_H
#define UPCIE_GPU_HEAP_CUDA_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>

#include <upcie/base/bits.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/gpu/dev_cuda.h>
#include <upcie/gpu/p2p_check.h>
#include <upcie/gpu/xlate_cuda.h>
#include <upcie/kmod/dmabuf_import.h>
#include <upcie/mem/dmamem.h>
#include <upcie/mem/heap.h>
#include <upcie/mem/hugepage.h>
#include <upcie/mem/registry.h>

#define UPCIE_GPU_CUDA_GRANULE_SHIFT 16 /* the CUDA exporter's page: 64 KiB */
#define UPCIE_GPU_CUDA_GRANULE	     (UINT64_C(1) << UPCIE_GPU_CUDA_GRANULE_SHIFT)
#define UPCIE_GPU_CUDA_HEAP_DEFAULT  (UINT64_C(1) << 30)

enum upcie_gpu_cuda_xlate {
	UPCIE_GPU_CUDA_XLATE_IMPORT = 0, /* bus addresses from the dma-buf import module */
	UPCIE_GPU_CUDA_XLATE_OFFSET = 1, /* device address = virtual address + iova_offset */
};

struct upcie_gpu_cuda_opts {
	int gpu_id;		   /* CUDA device ordinal (when gpu_pci is NULL) */
	uint64_t device_heap_size; /* 0: 1 GiB; rounded up to 64 KiB */
	uint64_t host_heap_size;   /* 0: 1 GiB; rounded up to the hugepage size */
	enum upcie_gpu_cuda_xlate xlate;
	uint64_t iova_offset;			      /* OFFSET only */
	const struct upcie_hugepage_opts *host_pages; /* NULL: hugetlb memfd, default size */
	const char *gpu_pci; /* NULL: gpu_id; else the GPU's PCI address ("0000:41:00.0") */
};

/* Page ranges of device registers (doorbells) mapped for the GPU, shared by reference. */
#define UPCIE_GPU_CUDA_IOMEM_MAX 16
struct upcie_gpu_cuda_iomem_ {
	uintptr_t start;
	size_t len;
	CUdeviceptr dptr;
	unsigned refs;
};

/* The process-wide state behind every handle. */
struct upcie_gpu_cuda_proc {
	unsigned refs;
	struct upcie_gpu_cuda_dev dev;
	enum upcie_gpu_cuda_xlate xlate;
	uint64_t iova_offset;
	struct upcie_kmod_dmabuf_import kmod;
	bool kmod_open;
	struct upcie_registry reg;
	CUdeviceptr dbase; /* device heap allocation */
	uint64_t dsize;
	struct upcie_heap dheap;
	void *hbase; /* host heap memory */
	uint64_t hsize;
	CUdeviceptr hbase_dev; /* the same memory as GPU code addresses it */
	bool hregistered;
	struct upcie_heap hheap;
	struct upcie_gpu_cuda_iomem_ iomem[UPCIE_GPU_CUDA_IOMEM_MAX];
	unsigned ngqp;	  /* GPU-issued queue pairs (gpuq/gqp_host_cuda.h) */
	unsigned nmirror; /* mirrored completion queues (gpuq/cqmirror_host_cuda.h) */
	void *mirror;	  /* the mirror's state, and how to tear it down */
	void (*mirror_fini)(struct upcie_gpu_cuda_proc *p);
};

/* A reference to the process's provider; zeroed when closed. */
struct upcie_gpu_cuda {
	struct upcie_gpu_cuda_proc *p;
};

UPCIE_WEAK struct upcie_gpu_cuda_proc upcie_gpu_cuda_proc_g;
UPCIE_WEAK pthread_mutex_t upcie_gpu_cuda_lock_g = PTHREAD_MUTEX_INITIALIZER;

/* Chained onto a dmamem: the constructor's release, then close the exported dma-buf. */
struct upcie_gpu_cuda_rel_ {
	upcie_dmamem_release_fn release;
	void *priv;
	int fd;
};

static inline void upcie_gpu_cuda_release_(struct upcie_dmamem *mem)
{
	struct upcie_gpu_cuda_rel_ *w = (struct upcie_gpu_cuda_rel_ *)mem->priv;

	mem->priv = w->priv;
	if (w->release)
		w->release(mem);
	if (w->fd >= 0)
		close(w->fd);
	free(w);
}

/*
 * Export [ptr, ptr + size) of a cuMemAlloc allocation as a dma-buf into *fd. Both must be
 * multiples of 64 KiB (the exporter's page). A PCIe (BAR1) mapping is asked for first; drivers
 * that do not know that flag get the request without it. The current context must own the
 * memory. Returns 0, -EINVAL (misaligned, not an allocation of this context), or the mapped CUDA
 * error.
 */
static inline int upcie_gpu_cuda_export(CUdeviceptr ptr, uint64_t size, int *fd)
{
	int h = -1;
	CUresult r;

	if (!fd || !size || !upcie_is_aligned(ptr, UPCIE_GPU_CUDA_GRANULE) ||
	    !upcie_is_aligned(size, UPCIE_GPU_CUDA_GRANULE))
		return UPCIE_FAIL(-EINVAL,
				  "gpu: export of 0x%llx + 0x%" PRIx64
				  ": needs whole 64 KiB pages of device memory",
				  (unsigned long long)ptr, size);
	r = cuMemGetHandleForAddressRange(&h, ptr, (size_t)size,
					  CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
					  CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
	if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED) {
		UPCIE_DBG("gpu: export with the PCIe mapping flag: %s; again without it",
			  upcie_gpu_cuda_strerror(r));
		r = cuMemGetHandleForAddressRange(&h, ptr, (size_t)size,
						  CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	}
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuMemGetHandleForAddressRange",
					   "export of 0x%llx + 0x%" PRIx64 " as a dma-buf",
					   (unsigned long long)ptr, size);
	*fd = h;
	return 0;
}

/*
 * IMPORT translation: every granule's bus address inside this GPU's BAR1 and none in system RAM
 * (gpu/p2p_check.h). A test may stand in other addresses (UPCIE_GPU_CUDA_P2P_CHECK).
 */
#ifndef UPCIE_GPU_CUDA_P2P_CHECK
#define UPCIE_GPU_CUDA_P2P_CHECK(p, mem, what) upcie_gpu_cuda_p2p_check_(p, mem, what)
#endif
static inline int upcie_gpu_cuda_p2p_check_(const struct upcie_gpu_cuda_proc *p,
					    const struct upcie_dmamem *mem, const char *what)
{
	struct upcie_gpu_p2p_window w;
	struct upcie_gpu_p2p_sysram *s;
	int err;

	err = upcie_gpu_p2p_window_read(p->dev.pci_name, p->dev.bar1_index, &w);
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

/* Export [base, base + size) and build its dmamem by the process's translation. */
static inline int upcie_gpu_cuda_dmamem_(struct upcie_gpu_cuda_proc *p, CUdeviceptr base,
					 uint64_t size, struct upcie_dmamem *mem)
{
	struct upcie_gpu_cuda_rel_ *w;
	int fd = -1, err;

	w = (struct upcie_gpu_cuda_rel_ *)malloc(sizeof(*w));
	if (!w)
		return UPCIE_FAIL(-ENOMEM, "gpu: out of host memory");
	err = upcie_gpu_cuda_export(base, size, &fd);
	if (err)
		goto fail;
	if (p->xlate == UPCIE_GPU_CUDA_XLATE_IMPORT) {
		err = upcie_dmamem_dmabuf_import(mem, &p->kmod, fd, (void *)(uintptr_t)base, size,
						 UPCIE_GPU_CUDA_GRANULE_SHIFT);
		/* What the exporter handed out must be VRAM behind BAR1, at heap creation and
		 * at every registration alike (both come through here). */
		if (!err) {
			err = UPCIE_GPU_CUDA_P2P_CHECK(p, mem, "CUDA dma-buf export");
			if (err)
				upcie_dmamem_destroy(mem);
		}
	} else
		err = upcie_dmamem_init_arith(mem, (void *)(uintptr_t)base, (size_t)size,
					      (uint64_t)base + p->iova_offset);
	if (err)
		goto fail;
	w->release = mem->release;
	w->priv = mem->priv;
	w->fd = fd;
	mem->release = upcie_gpu_cuda_release_;
	mem->priv = w;
	mem->kind = p->xlate == UPCIE_GPU_CUDA_XLATE_IMPORT ? "cuda-dmabuf-lut" : "cuda-offset";
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	free(w);
	return err;
}

/* Register [base, base + size) with a freshly built dmamem. */
static inline int upcie_gpu_cuda_reg_new_(struct upcie_gpu_cuda_proc *p, CUdeviceptr base,
					  uint64_t size)
{
	struct upcie_dmamem mem;
	int err = upcie_gpu_cuda_dmamem_(p, base, size, &mem);

	if (err)
		return err;
	err =
	    upcie_registry_register(&p->reg, (const void *)(uintptr_t)base, (size_t)size, &mem, 0);
	if (err)
		upcie_dmamem_destroy(&mem);
	return err;
}

static inline void upcie_gpu_cuda_unreg_(struct upcie_gpu_cuda_proc *p, const void *base)
{
	struct upcie_dmamem hb;

	if (!upcie_registry_unregister(&p->reg, base, &hb))
		upcie_dmamem_destroy(&hb);
}

static inline int upcie_gpu_cuda_dheap_open_(struct upcie_gpu_cuda_proc *p, uint64_t size)
{
	struct upcie_registry_hit hit;
	CUresult r;
	int err;

	r = cuMemAlloc(&p->dbase, (size_t)size);
	if (r != CUDA_SUCCESS) {
		p->dbase = 0;
		return UPCIE_GPU_CUDA_FAIL(r, "cuMemAlloc", "device heap of %" PRIu64 " MiB",
					   size >> 20);
	}
	p->dsize = size;
	err = upcie_gpu_cuda_reg_new_(p, p->dbase, size);
	if (!err)
		err = upcie_registry_lookup(&p->reg, (const void *)(uintptr_t)p->dbase, &hit);
	if (!err)
		err = upcie_heap_init(&p->dheap, hit.mem);
	if (err) {
		upcie_gpu_cuda_unreg_(p, (const void *)(uintptr_t)p->dbase);
		cuMemFree(p->dbase);
		p->dbase = 0;
		return UPCIE_FAIL(err, "gpu: device heap of %" PRIu64 " MiB not set up",
				  size >> 20);
	}
	return 0;
}

static inline void upcie_gpu_cuda_dheap_close_(struct upcie_gpu_cuda_proc *p)
{
	if (!p->dbase)
		return;
	upcie_heap_fini(&p->dheap);
	upcie_gpu_cuda_unreg_(p, (const void *)(uintptr_t)p->dbase);
	cuMemFree(p->dbase);
	p->dbase = 0;
}

static inline void upcie_gpu_cuda_hp_release_(struct upcie_dmamem *mem)
{
	struct upcie_hugepage *hp = (struct upcie_hugepage *)mem->priv;

	upcie_hugepage_free(hp);
	free(hp);
	mem->priv = NULL;
}

/* Bytes of free default-size hugepages per /proc/meminfo (0 when unknown), without logging. */
static inline uint64_t upcie_gpu_cuda_hugepages_free_(void)
{
	unsigned long long nfree = 0, kb = 0, v;
	char line[256];
	FILE *fp = fopen("/proc/meminfo", "re");

	if (!fp)
		return 0;
	while (fgets(line, sizeof(line), fp)) {
		if (sscanf(line, "HugePages_Free: %llu", &v) == 1)
			nfree = v;
		else if (sscanf(line, "Hugepagesize: %llu kB", &v) == 1)
			kb = v;
	}
	fclose(fp);
	return (uint64_t)nfree * kb * 1024;
}

/* OFFSET mode host memory: hugepages if enough are free, else plain pages. */
static inline int upcie_gpu_cuda_host_offset_(struct upcie_gpu_cuda_proc *p, uint64_t size,
					      const struct upcie_hugepage_opts *opts,
					      struct upcie_dmamem *mem)
{
	struct upcie_hugepage_opts plain;
	struct upcie_hugepage *hp;
	int err = -ENOMEM;

	hp = (struct upcie_hugepage *)calloc(1, sizeof(*hp));
	if (!hp)
		return UPCIE_FAIL(-ENOMEM, "gpu: out of host memory");
	if (opts || upcie_gpu_cuda_hugepages_free_() >= size)
		err = upcie_hugepage_alloc(hp, (size_t)size, opts);
	if (err) {
		UPCIE_INFO("gpu: no hugepages for the host heap; using plain pages");
		memset(&plain, 0, sizeof(plain));
		plain.src = UPCIE_HUGEPAGE_PLAIN;
		plain.no_mlock = true; /* cuMemHostRegister pins it */
		err = upcie_hugepage_alloc(hp, (size_t)size, &plain);
	}
	if (err) {
		free(hp);
		return err;
	}
	err = upcie_dmamem_init_arith(mem, hp->vaddr, hp->size,
				      (uint64_t)(uintptr_t)hp->vaddr + p->iova_offset);
	if (err) {
		upcie_hugepage_free(hp);
		free(hp);
		return err;
	}
	mem->release = upcie_gpu_cuda_hp_release_;
	mem->priv = hp;
	mem->kind = "host-offset";
	return 0;
}

static inline int upcie_gpu_cuda_hheap_open_(struct upcie_gpu_cuda_proc *p, uint64_t size,
					     const struct upcie_hugepage_opts *opts)
{
	struct upcie_registry_hit hit;
	struct upcie_dmamem mem;
	CUresult r;
	int err;

	if (p->xlate == UPCIE_GPU_CUDA_XLATE_IMPORT)
		err = upcie_dmamem_hugepage_lut(&mem, (size_t)size, opts);
	else
		err = upcie_gpu_cuda_host_offset_(p, size, opts, &mem);
	if (err)
		return UPCIE_FAIL(err, "gpu: no host heap of %" PRIu64 " MiB", size >> 20);
	p->hbase = mem.vaddr;
	p->hsize = mem.size;
	r = cuMemHostRegister(p->hbase, (size_t)p->hsize,
			      CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
	if (r != CUDA_SUCCESS) {
		upcie_dmamem_destroy(&mem);
		p->hbase = NULL;
		return UPCIE_GPU_CUDA_FAIL(r, "cuMemHostRegister", "host heap of %" PRIu64 " MiB",
					   size >> 20);
	}
	p->hregistered = true;
	r = cuMemHostGetDevicePointer(&p->hbase_dev, p->hbase, 0);
	if (r != CUDA_SUCCESS) {
		err = UPCIE_GPU_CUDA_FAIL(r, "cuMemHostGetDevicePointer", "host heap");
		goto fail_unreg;
	}
	err = upcie_registry_register(&p->reg, p->hbase, (size_t)p->hsize, &mem, 0);
	if (err)
		goto fail_unreg;
	err = upcie_registry_lookup(&p->reg, p->hbase, &hit);
	if (!err)
		err = upcie_heap_init(&p->hheap, hit.mem);
	if (err) {
		cuMemHostUnregister(p->hbase);
		p->hregistered = false;
		upcie_gpu_cuda_unreg_(p, p->hbase);
		p->hbase = NULL;
		return err;
	}
	return 0;
fail_unreg:
	cuMemHostUnregister(p->hbase);
	p->hregistered = false;
	upcie_dmamem_destroy(&mem);
	p->hbase = NULL;
	return err;
}

static inline void upcie_gpu_cuda_hheap_close_(struct upcie_gpu_cuda_proc *p)
{
	if (!p->hbase)
		return;
	upcie_heap_fini(&p->hheap);
	if (p->hregistered)
		cuMemHostUnregister(p->hbase);
	p->hregistered = false;
	upcie_gpu_cuda_unreg_(p, p->hbase);
	p->hbase = NULL;
}

/* Tear down everything; called with the lock held, in the heap's context. */
static inline void upcie_gpu_cuda_proc_fini_(struct upcie_gpu_cuda_proc *p)
{
	struct upcie_gpu_cuda_ctx_save save = { 0 };
	bool entered = p->dev.live && !upcie_gpu_cuda_dev_enter(&p->dev, &save);
	bool stuck;

	if (p->mirror_fini)
		p->mirror_fini(p);
	/* A mirror kernel that did not end still reads the heaps, and freeing them (or the
	 * context) would wait for it forever: leave them allocated. */
	stuck = p->mirror != NULL;
	if (stuck)
		UPCIE_ERR("gpu: closing with the completion mirror kernel still running: the heaps "
			  "and the context stay allocated");
	if (p->ngqp || p->nmirror)
		UPCIE_WARN("gpu: last close with %u GPU-issued and %u mirrored queues left",
			   p->ngqp, p->nmirror);
	for (unsigned i = 0; i < UPCIE_GPU_CUDA_IOMEM_MAX && !stuck; i++)
		if (p->iomem[i].refs && entered)
			cuMemHostUnregister((void *)p->iomem[i].start);
	if (!stuck) {
		upcie_gpu_cuda_hheap_close_(p);
		upcie_gpu_cuda_dheap_close_(p);
	}
	if (!stuck)
		upcie_registry_fini(&p->reg);
	if (p->kmod_open && !stuck)
		upcie_kmod_dmabuf_import_close(&p->kmod);
	if (entered)
		upcie_gpu_cuda_dev_leave(&p->dev, &save);
	if (!stuck)
		upcie_gpu_cuda_dev_close(&p->dev);
	memset(p, 0, sizeof(*p));
}

static inline int upcie_gpu_cuda_proc_init_(struct upcie_gpu_cuda_proc *p,
					    const struct upcie_gpu_cuda_opts *o)
{
	uint64_t dsize = o->device_heap_size ? o->device_heap_size : UPCIE_GPU_CUDA_HEAP_DEFAULT;
	uint64_t hsize = o->host_heap_size ? o->host_heap_size : UPCIE_GPU_CUDA_HEAP_DEFAULT;
	int err;

	memset(p, 0, sizeof(*p));
	p->xlate = o->xlate;
	p->iova_offset = o->iova_offset;
	if (o->xlate != UPCIE_GPU_CUDA_XLATE_IMPORT && o->xlate != UPCIE_GPU_CUDA_XLATE_OFFSET)
		return UPCIE_FAIL(-EINVAL, "gpu: unknown translation %d", (int)o->xlate);
	dsize = upcie_align_up(dsize, UPCIE_GPU_CUDA_GRANULE);
	/* Before any allocation: without the module nothing else is worth doing. */
	if (p->xlate == UPCIE_GPU_CUDA_XLATE_IMPORT) {
		err = upcie_kmod_dmabuf_import_open(&p->kmod);
		if (err)
			return UPCIE_FAIL(err,
					  "gpu: the device heap needs the dma-buf import module "
					  "(package upcie-dmabuf-import-dkms); or open with "
					  "UPCIE_GPU_CUDA_XLATE_OFFSET where a mapping provides "
					  "the addresses");
		p->kmod_open = true;
	}
	err = upcie_gpu_cuda_dev_open(&p->dev, o->gpu_id);
	if (err)
		goto fail;
	err = upcie_registry_init(&p->reg);
	if (err)
		goto fail;
	err = upcie_gpu_cuda_dheap_open_(p, dsize);
	if (err)
		goto fail;
	err = upcie_gpu_cuda_hheap_open_(p, hsize, o->host_pages);
	if (err)
		goto fail;
	p->refs = 1;
	return 0;
fail:
	upcie_gpu_cuda_proc_fini_(p);
	return err;
}

/*
 * Open the provider on GPU opts->gpu_id, or on the GPU at PCI address opts->gpu_pci when that is
 * set (-ENODEV when the process does not see it: CUDA_VISIBLE_DEVICES). The first open in the process sets up the GPU, both
 * heaps and the registry with these options; later opens take a reference and must name the same
 * GPU and translation (-EINVAL otherwise). Returns 0; -ENOENT (IMPORT without the module);
 * -ENODEV, -EINVAL, -EOPNOTSUPP (gpu/dev_cuda.h); -ENOMEM; a hugepage or CUDA error.
 * `gpu` is zeroed on failure.
 */
static inline int upcie_gpu_cuda_open(struct upcie_gpu_cuda *gpu,
				      const struct upcie_gpu_cuda_opts *opts)
{
	struct upcie_gpu_cuda_proc *p = &upcie_gpu_cuda_proc_g;
	struct upcie_gpu_cuda_opts def;
	int err = 0;

	if (!gpu)
		return UPCIE_FAIL(-EINVAL, "gpu: NULL handle");
	gpu->p = NULL;
	memset(&def, 0, sizeof(def));
	if (opts)
		def = *opts;
	if (def.gpu_pci) {
		err = upcie_gpu_cuda_ordinal_by_pci(def.gpu_pci, &def.gpu_id);
		if (err)
			return err;
	}
	opts = &def;
	pthread_mutex_lock(&upcie_gpu_cuda_lock_g);
	if (p->refs) {
		if (opts->gpu_id != p->dev.ordinal || opts->xlate != p->xlate)
			err = UPCIE_FAIL(-EINVAL,
					 "gpu: the provider is open on GPU %d (translation %d); "
					 "asked for GPU %d (translation %d): one GPU per process",
					 p->dev.ordinal, (int)p->xlate, opts->gpu_id,
					 (int)opts->xlate);
		else
			p->refs++;
	} else {
		err = upcie_gpu_cuda_proc_init_(p, opts);
	}
	pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
	if (!err)
		gpu->p = p;
	return err;
}

/* Drop the reference; the last one frees both heaps and the registry. A zeroed handle: no-op. */
static inline void upcie_gpu_cuda_close(struct upcie_gpu_cuda *gpu)
{
	if (!gpu || !gpu->p)
		return;
	pthread_mutex_lock(&upcie_gpu_cuda_lock_g);
	if (--gpu->p->refs == 0)
		upcie_gpu_cuda_proc_fini_(gpu->p);
	pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
	gpu->p = NULL;
}

/* Accessors (valid while the handle is open). */
static inline struct upcie_heap *upcie_gpu_cuda_heap(const struct upcie_gpu_cuda *gpu)
{
	return &gpu->p->dheap;
}

/* The host heap (pinned host memory the GPU maps), for allocations by offset. */
static inline struct upcie_heap *upcie_gpu_cuda_host_heap(const struct upcie_gpu_cuda *gpu)
{
	return &gpu->p->hheap;
}

/* The registry resolving pointers into both heaps and registered buffers to device addresses. */
static inline struct upcie_registry *upcie_gpu_cuda_registry(const struct upcie_gpu_cuda *gpu)
{
	return &gpu->p->reg;
}

/* The GPU and context the handle was opened on (for upcie_gpu_cuda_dev_enter()). */
static inline const struct upcie_gpu_cuda_dev *
upcie_gpu_cuda_device(const struct upcie_gpu_cuda *gpu)
{
	return &gpu->p->dev;
}

/* The address GPU code uses for host-heap memory at CPU address `vaddr`, or 0 outside the heap. */
static inline CUdeviceptr upcie_gpu_cuda_host_devptr(const struct upcie_gpu_cuda *gpu,
						     const void *vaddr)
{
	uintptr_t v = (uintptr_t)vaddr, b = (uintptr_t)gpu->p->hbase;

	if (v < b || v - b >= gpu->p->hsize)
		return 0;
	return gpu->p->hbase_dev + (v - b);
}

/* Device heap: `size` bytes aligned to `align` (buf->vaddr is the GPU address). */
static inline int upcie_gpu_cuda_alloc(struct upcie_gpu_cuda *gpu, uint64_t size, uint64_t align,
				       struct upcie_heap_buf *buf)
{
	return upcie_heap_alloc(&gpu->p->dheap, size, align, buf);
}

/*
 * Return a device-heap buffer of upcie_gpu_cuda_alloc(). 0, or -EINVAL for a buffer not allocated
 * there (nothing changed). Only once no device can still DMA into it.
 */
static inline int upcie_gpu_cuda_free(struct upcie_gpu_cuda *gpu, const struct upcie_heap_buf *buf)
{
	return upcie_heap_free(&gpu->p->dheap, buf->off);
}

/* Host heap: `size` bytes aligned to `align` (buf->vaddr is the CPU address). */
static inline int upcie_gpu_cuda_host_alloc(struct upcie_gpu_cuda *gpu, uint64_t size,
					    uint64_t align, struct upcie_heap_buf *buf)
{
	return upcie_heap_alloc(&gpu->p->hheap, size, align, buf);
}

/* Return a host-heap buffer of upcie_gpu_cuda_host_alloc(); as upcie_gpu_cuda_free(). */
static inline int upcie_gpu_cuda_host_free(struct upcie_gpu_cuda *gpu,
					   const struct upcie_heap_buf *buf)
{
	return upcie_heap_free(&gpu->p->hheap, buf->off);
}

/*
 * Map device registers at host address [addr, addr + len) (inside an mmap of a PCI BAR, e.g. NVMe
 * doorbells in BAR0) into the GPU: cuMemHostRegister with CU_MEMHOSTREGISTER_IOMEMORY over the
 * whole pages, shared by reference with other mappings of the same pages (one per doorbell page,
 * however many queues ring there). *dptr receives the address GPU code stores to for `addr`.
 * Returns 0; -EEXIST (overlaps a mapping of other pages); -ENOSPC (table full); the mapped CUDA
 * error (CUDA refuses memory that is not device registers; of a vfio region mapping it takes only
 * the first page, so map the BAR through its sysfs resource file instead).
 */
static inline int upcie_gpu_cuda_iomem_map(struct upcie_gpu_cuda *gpu, volatile void *addr,
					   size_t len, CUdeviceptr *dptr)
{
	struct upcie_gpu_cuda_proc *p = gpu->p;
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)addr;
	uintptr_t start = upcie_align_down(a, pg), end = upcie_align_up(a + len, pg);
	struct upcie_gpu_cuda_ctx_save save;
	struct upcie_gpu_cuda_iomem_ *e, *slot = NULL;
	CUdeviceptr d = 0;
	CUresult r = CUDA_SUCCESS;
	int err = 0;

	if (!len)
		return UPCIE_FAIL(-EINVAL, "gpu: empty register range");
	pthread_mutex_lock(&upcie_gpu_cuda_lock_g);
	for (unsigned i = 0; i < UPCIE_GPU_CUDA_IOMEM_MAX; i++) {
		e = &p->iomem[i];
		if (!e->refs) {
			if (!slot)
				slot = e;
			continue;
		}
		if (start >= e->start && end <= e->start + e->len) {
			e->refs++;
			*dptr = e->dptr + (a - e->start);
			pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
			return 0;
		}
		if (start < e->start + e->len && e->start < end)
			err = -EEXIST;
	}
	if (!err && !slot)
		err = -ENOSPC;
	if (!err)
		err = upcie_gpu_cuda_dev_enter(&p->dev, &save);
	if (!err) {
		r = cuMemHostRegister((void *)start, end - start,
				      CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_DEVICEMAP |
					  CU_MEMHOSTREGISTER_PORTABLE);
		if (r == CUDA_SUCCESS) {
			r = cuMemHostGetDevicePointer(&d, (void *)start, 0);
			if (r != CUDA_SUCCESS)
				cuMemHostUnregister((void *)start);
		}
		upcie_gpu_cuda_dev_leave(&p->dev, &save);
		if (r == CUDA_SUCCESS) {
			slot->start = start;
			slot->len = end - start;
			slot->dptr = d;
			slot->refs = 1;
			*dptr = d + (a - start);
		}
	}
	pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
	if (err == -EEXIST)
		return UPCIE_FAIL(err, "gpu: registers at %p overlap other mapped registers", addr);
	if (err == -ENOSPC)
		return UPCIE_FAIL(err, "gpu: more than %d register ranges mapped",
				  UPCIE_GPU_CUDA_IOMEM_MAX);
	if (err)
		return err;
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuMemHostRegister(IOMEMORY)",
					   "mapping registers at %p for the GPU", addr);
	return 0;
}

/* Drop a reference taken by upcie_gpu_cuda_iomem_map() for `addr`. 0 or -ENOENT. */
static inline int upcie_gpu_cuda_iomem_unmap(struct upcie_gpu_cuda *gpu, volatile void *addr)
{
	struct upcie_gpu_cuda_proc *p = gpu->p;
	struct upcie_gpu_cuda_ctx_save save;
	uintptr_t a = (uintptr_t)addr;
	int err = -ENOENT;

	pthread_mutex_lock(&upcie_gpu_cuda_lock_g);
	for (unsigned i = 0; i < UPCIE_GPU_CUDA_IOMEM_MAX; i++) {
		struct upcie_gpu_cuda_iomem_ *e = &p->iomem[i];

		if (!e->refs || a < e->start || a >= e->start + e->len)
			continue;
		err = 0;
		if (--e->refs)
			break;
		if (!upcie_gpu_cuda_dev_enter(&p->dev, &save)) {
			cuMemHostUnregister((void *)e->start);
			upcie_gpu_cuda_dev_leave(&p->dev, &save);
		}
		memset(e, 0, sizeof(*e));
		break;
	}
	pthread_mutex_unlock(&upcie_gpu_cuda_lock_g);
	if (err)
		return UPCIE_FAIL(err, "gpu: registers at %p are not mapped", addr);
	return 0;
}

/*
 * The allocation containing device pointer `ptr`, as registered: its base (cuMemGetAddressRange)
 * rounded down, and its end rounded up, to 64 KiB. Returns 0, -EINVAL (not device memory of this
 * provider's GPU).
 */
static inline int upcie_gpu_cuda_range(struct upcie_gpu_cuda *gpu, const void *ptr,
				       CUdeviceptr *base, uint64_t *size)
{
	struct upcie_gpu_cuda_ctx_save save;
	CUdeviceptr b = 0;
	size_t n = 0;
	unsigned type = 0;
	int ord = -1, err;
	CUresult r;

	err = upcie_gpu_cuda_dev_enter(&gpu->p->dev, &save);
	if (err)
		return err;
	r = cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
				  (CUdeviceptr)(uintptr_t)ptr);
	if (r == CUDA_SUCCESS && type != CU_MEMORYTYPE_DEVICE)
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS)
		r = cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
					  (CUdeviceptr)(uintptr_t)ptr);
	if (r == CUDA_SUCCESS)
		r = cuMemGetAddressRange(&b, &n, (CUdeviceptr)(uintptr_t)ptr);
	upcie_gpu_cuda_dev_leave(&gpu->p->dev, &save);
	if (r != CUDA_SUCCESS)
		return UPCIE_FAIL(-EINVAL, "gpu: %p is not CUDA device memory (%s)", ptr,
				  upcie_gpu_cuda_strerror(r));
	if (ord != gpu->p->dev.ordinal)
		return UPCIE_FAIL(-EINVAL, "gpu: %p is memory of GPU %d, the provider is on GPU %d",
				  ptr, ord, gpu->p->dev.ordinal);
	*base = (CUdeviceptr)upcie_align_down(b, UPCIE_GPU_CUDA_GRANULE);
	*size = upcie_align_up((uint64_t)b + n, UPCIE_GPU_CUDA_GRANULE) - *base;
	return 0;
}

/*
 * Register the cuMemAlloc allocation containing `ptr` (any interior pointer; `size` bytes from
 * ptr must lie inside it, 0 for no check): its whole 64 KiB pages are exported and entered in the
 * registry, or the existing registration gains a reference. Returns 0; -EINVAL (not device
 * memory of this GPU, or size beyond the allocation); -EEXIST (overlaps another registration);
 * -ENOENT (IMPORT: module gone); an export error (the driver refuses ranges that cross
 * allocations: small allocations share 64 KiB pages, allocate at least 2 MiB or use the heap).
 */
static inline int upcie_gpu_cuda_buf_register(struct upcie_gpu_cuda *gpu, const void *ptr,
					      size_t size)
{
	struct upcie_gpu_cuda_ctx_save save;
	struct upcie_registry_hit hit;
	CUdeviceptr base;
	uint64_t rsize;
	int err;

	if (!gpu || !gpu->p)
		return UPCIE_FAIL(-EINVAL, "gpu: register on a closed provider");
	err = upcie_gpu_cuda_range(gpu, ptr, &base, &rsize);
	if (err)
		return err;
	if (size && ((uintptr_t)ptr - base > rsize || size > rsize - ((uintptr_t)ptr - base)))
		return UPCIE_FAIL(-EINVAL, "gpu: %p + %zu reaches past its allocation", ptr, size);
	/* Cheap path: registered already (the heap, or an earlier registration), as it was. */
	if (!upcie_registry_lookup(&gpu->p->reg, ptr, &hit) &&
	    (CUdeviceptr)(uintptr_t)hit.base == base) {
		err = upcie_registry_register(&gpu->p->reg, hit.base, hit.size, NULL, 0);
		if (err != -ENOENT)
			return err;
	}
	err = upcie_gpu_cuda_dev_enter(&gpu->p->dev, &save);
	if (err)
		return err;
	err = upcie_gpu_cuda_reg_new_(gpu->p, base, rsize);
	upcie_gpu_cuda_dev_leave(&gpu->p->dev, &save);
	return err;
}

/*
 * Drop one reference of the registration containing `ptr` (any interior pointer); the last one
 * releases the export. Call before freeing the memory. Returns 0, -ENOENT (not registered),
 * -EBUSY (that is a heap, which the provider owns).
 */
static inline int upcie_gpu_cuda_buf_unregister(struct upcie_gpu_cuda *gpu, const void *ptr)
{
	struct upcie_registry_hit hit;
	int err;

	if (!gpu || !gpu->p)
		return UPCIE_FAIL(-EINVAL, "gpu: unregister on a closed provider");
	err = upcie_registry_lookup(&gpu->p->reg, ptr, &hit);
	if (err)
		return UPCIE_FAIL(err, "gpu: unregister of %p, which is not registered", ptr);
	if (hit.base == (const void *)(uintptr_t)gpu->p->dbase || hit.base == gpu->p->hbase) {
		/* The heap's own registration holds one reference that only close drops. */
		struct upcie_registry_node *nd = NULL;

		pthread_rwlock_rdlock(&gpu->p->reg.lock);
		nd = upcie_registry_find_(&gpu->p->reg, (uint64_t)(uintptr_t)ptr);
		err = nd && nd->refs > 1 ? 0 : -EBUSY;
		pthread_rwlock_unlock(&gpu->p->reg.lock);
		if (err)
			return UPCIE_FAIL(err, "gpu: %p is heap memory, not a registration", ptr);
	}
	err = upcie_registry_unregister(&gpu->p->reg, hit.base, NULL);
	return err;
}

/* Device address of `ptr` in any registered range (heaps included). 0 or -ENOENT. */
static inline int upcie_gpu_cuda_iova(struct upcie_gpu_cuda *gpu, const void *ptr, uint64_t *iova)
{
	return upcie_registry_iova(&gpu->p->reg, ptr, iova);
}

/*
 * Fill *x so GPU code can translate the registered range containing `ptr` (the device heap, the
 * host heap or a registration; for the host heap `base` is its GPU address). A LUT is copied into
 * device memory, released by upcie_gpu_cuda_xlate_destroy(). The range must stay registered while
 * *x is used. The host heap's translation carries UPCIE_GPU_XLATE_HOSTMEM. Returns 0, -ENOENT
 * (not registered), -ENOMEM, a CUDA error.
 */
static inline int upcie_gpu_cuda_xlate_create(struct upcie_gpu_cuda *gpu, const void *ptr,
					      struct upcie_gpu_xlate *x)
{
	struct upcie_gpu_cuda_ctx_save save;
	struct upcie_registry_hit hit;
	CUdeviceptr lut = 0;
	uint64_t base;
	CUresult r;
	int err;

	memset(x, 0, sizeof(*x));
	err = upcie_registry_lookup(&gpu->p->reg, ptr, &hit);
	if (err)
		return UPCIE_FAIL(err, "gpu: translation for %p, which is not registered", ptr);
	base = (uint64_t)(uintptr_t)hit.base;
	if (hit.base == gpu->p->hbase)
		base = (uint64_t)gpu->p->hbase_dev;
	x->base = base;
	x->size = hit.size;
	/* Registrations are cuMemAlloc memory (buf_register checks): only the host heap is host
	 * memory, and GPU-issued queues must know it (gpuq/gqp_cuda.h, "Payload placement"). */
	if (hit.base == gpu->p->hbase)
		x->flags |= UPCIE_GPU_XLATE_HOSTMEM;
	if (!hit.mem->lut) {
		x->iova = upcie_dmamem_iova_fast(hit.mem,
						 hit.off - ((uintptr_t)ptr - (uintptr_t)hit.base));
		return 0;
	}
	/* A LUT range starts on a granule of its dmamem (registrations start at offset 0). */
	err = upcie_gpu_cuda_dev_enter(&gpu->p->dev, &save);
	if (err)
		return err;
	r = cuMemAlloc(&lut, hit.mem->nlut * sizeof(uint64_t));
	if (r == CUDA_SUCCESS)
		r = cuMemcpyHtoD(lut, hit.mem->lut, hit.mem->nlut * sizeof(uint64_t));
	if (r != CUDA_SUCCESS && lut)
		cuMemFree(lut);
	upcie_gpu_cuda_dev_leave(&gpu->p->dev, &save);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuMemAlloc/cuMemcpyHtoD",
					   "device copy of a %zu-entry LUT", hit.mem->nlut);
	x->lut = (const uint64_t *)(uintptr_t)lut;
	x->shift = hit.mem->granule_shift;
	return 0;
}

/* Release what upcie_gpu_cuda_xlate_create() allocated; a zeroed *x is a no-op. */
static inline void upcie_gpu_cuda_xlate_destroy(struct upcie_gpu_cuda *gpu,
						struct upcie_gpu_xlate *x)
{
	struct upcie_gpu_cuda_ctx_save save;

	if (!x)
		return;
	if (x->lut && gpu && gpu->p && !upcie_gpu_cuda_dev_enter(&gpu->p->dev, &save)) {
		cuMemFree((CUdeviceptr)(uintptr_t)x->lut);
		upcie_gpu_cuda_dev_leave(&gpu->p->dev, &save);
	}
	memset(x, 0, sizeof(*x));
}

#endif /* UPCIE_GPU_HEAP_CUDA_H */
