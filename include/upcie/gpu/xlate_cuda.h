/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Address translation that GPU code can run: a registered range of GPU (or GPU-mapped host)
 * memory, described by its virtual base and either one base device address (arithmetic) or a
 * LUT of device addresses per granule held in device memory. Device code uses it to build PRPs
 * for the commands it submits (gpuq/gqp_cuda.h); the host fills it with
 * upcie_gpu_cuda_xlate_create() (gpu/heap_cuda.h).
 *
 * Plain data and one UPCIE_HD function: compiles as C, C++ and CUDA; needs nothing at run time.
 */
#ifndef UPCIE_GPU_XLATE_CUDA_H
#define UPCIE_GPU_XLATE_CUDA_H

#include <upcie/base/feature.h>

#include <stdint.h>

#include <upcie/base/compiler.h>

struct upcie_gpu_xlate {
	uint64_t base;	     /* virtual address of the range's first byte */
	uint64_t size;	     /* bytes */
	const uint64_t *lut; /* device pointer: device address per granule; NULL: arithmetic */
	uint64_t iova;	     /* arithmetic: device address of `base` */
	uint32_t shift;	     /* LUT granule, log2 */
	uint32_t flags;	     /* UPCIE_GPU_XLATE_* */
};

/*
 * The range is host memory mapped into the GPU, not GPU memory. GPU-issued queues refuse it as a
 * payload unless created with UPCIE_NVME_GQP_HOST_DATA (gpuq/gqp_cuda.h says why).
 */
#define UPCIE_GPU_XLATE_HOSTMEM 0x1u

/* Device address of `p`, no bounds check (the hot path). */
UPCIE_HD static inline uint64_t upcie_gpu_xlate_iova(const struct upcie_gpu_xlate *x, const void *p)
{
	uint64_t off = (uint64_t)(uintptr_t)p - x->base;

	if (x->lut)
		return x->lut[off >> x->shift] + (off & ((UINT64_C(1) << x->shift) - 1));
	return x->iova + off;
}

/* Whether [p, p + len) lies inside the range. */
UPCIE_HD static inline int upcie_gpu_xlate_contains(const struct upcie_gpu_xlate *x, const void *p,
						    uint64_t len)
{
	uint64_t off = (uint64_t)(uintptr_t)p - x->base;

	return (uint64_t)(uintptr_t)p >= x->base && off <= x->size && len <= x->size - off;
}

#endif /* UPCIE_GPU_XLATE_CUDA_H */
