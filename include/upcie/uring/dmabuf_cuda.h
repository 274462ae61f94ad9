/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * CUDA glue for io_uring dma-buf buffers (uring/dmabuf.h): register a cuMemAlloc range with a
 * ring's dma-buf table for I/O on an NVMe block device, and unregister it.
 *
 * upcie_uring_dmabuf_register_cuda() exports [ptr, ptr + size) as a dma-buf (gpu/heap_cuda.h:
 * whole 64 KiB pages, the current context owning them), applies the IOMMU rule
 * (uring/dmabuf_iommu.h: nothing to do without a translating IOMMU; otherwise an identity
 * mapping of the pages into the controller's domain through the upcie modules, or -ENODEV where
 * the controller cannot be found) and registers the dma-buf. I/O then names b->slot and byte
 * offsets inside the range. upcie_uring_dmabuf_unregister_gpu() unregisters (-EBUSY while I/O on
 * the slot is in flight, nothing changed), then removes the mappings and closes the dma-buf;
 * the allocation may be freed after it returned 0. Not run against a real NVMe + GPU pair (see
 * docs/guide-iouring.md): the kernel path was run on a patched kernel with udmabuf and vfio-pci
 * dma-bufs.
 */
#ifndef UPCIE_URING_DMABUF_CUDA_H
#define UPCIE_URING_DMABUF_CUDA_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>

#include <upcie/base/log.h>
#include <upcie/gpu/heap_cuda.h>
#include <upcie/uring/dmabuf.h>
#include <upcie/uring/dmabuf_iommu.h>

/*
 * Register [ptr, ptr + size) of a cuMemAlloc allocation (the current context's) for I/O on block
 * device `target_fd` (O_DIRECT). 0 (b->slot names it), or the export's, the IOMMU rule's or the
 * registration's error (-EOPNOTSUPP on a kernel without the series).
 */
static inline int upcie_uring_dmabuf_register_cuda(struct upcie_uring_dmabufs *t, CUdeviceptr ptr,
						   uint64_t size, int target_fd,
						   struct upcie_uring_gpu_buf *b)
{
	int fd = -1, err;

	if (!t || !b)
		return UPCIE_FAIL(-EINVAL, "uring: register_cuda needs a table and a buffer");
	memset(b, 0, sizeof(*b));
	b->dmabuf_fd = -1;
	err = upcie_uring_dmabuf_probe();
	if (err)
		return err;
	err = upcie_gpu_cuda_export(ptr, size, &fd);
	if (err)
		return err;
	return upcie_uring_dmabuf_register_gpu_fd(t, fd, size, target_fd, b);
}

#endif /* UPCIE_URING_DMABUF_CUDA_H */
