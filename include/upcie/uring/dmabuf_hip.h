/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * HIP glue for io_uring dma-buf buffers (uring/dmabuf.h): register the hipMalloc allocation that
 * holds `ptr` with a ring's dma-buf table for I/O on an NVMe block device. ROCm's export
 * (gpu/heap_hip.h, ROCm 7.0 and newer) describes the whole allocation, so the whole allocation
 * is registered and b->size says how large it is; offsets in I/O are from the allocation's base
 * (*base). The IOMMU rule and the teardown are uring/dmabuf_iommu.h's
 * (upcie_uring_dmabuf_unregister_gpu()). Not run against a real NVMe + GPU pair.
 */
#ifndef UPCIE_URING_DMABUF_HIP_H
#define UPCIE_URING_DMABUF_HIP_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <upcie/base/log.h>
#include <upcie/gpu/heap_hip.h>
#include <upcie/uring/dmabuf.h>
#include <upcie/uring/dmabuf_iommu.h>

/*
 * Register the allocation holding `ptr` (its base in *base) for I/O on block device `target_fd`
 * (O_DIRECT). 0, or the export's (-EOPNOTSUPP before ROCm 7.0), the IOMMU rule's or the
 * registration's error (-EOPNOTSUPP on a kernel without the series).
 */
static inline int upcie_uring_dmabuf_register_hip(struct upcie_uring_dmabufs *t, const void *ptr,
						  int target_fd, uint64_t *base,
						  struct upcie_uring_gpu_buf *b)
{
	uint64_t size = 0, described = 0;
	int fd = -1, err;

	if (!t || !b || !base)
		return UPCIE_FAIL(-EINVAL,
				  "uring: register_hip needs a table, a buffer and a base");
	memset(b, 0, sizeof(*b));
	b->dmabuf_fd = -1;
	err = upcie_uring_dmabuf_probe();
	if (err)
		return err;
	err = upcie_gpu_hip_export(ptr, &fd, base, &size, &described);
	if (err)
		return err;
	return upcie_uring_dmabuf_register_gpu_fd(t, fd, described, target_fd, b);
}

#endif /* UPCIE_URING_DMABUF_HIP_H */
