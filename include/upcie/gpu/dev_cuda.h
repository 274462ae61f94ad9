/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A CUDA GPU for upcie: the GPU by ordinal or by PCI address, the context its memory is allocated in, the check that
 * its BAR1 window covers all of its memory, and CUresult-to-errno mapping.
 *
 * GPU choice: an ordinal is a position among the GPUs this process sees, which
 * CUDA_VISIBLE_DEVICES filters and reorders (by index, UUID or MIG name); a PCI address
 * (upcie_gpu_cuda_ordinal_by_pci(), upcie_gpu_cuda_dev_open_pci()) names one GPU whatever the
 * order, and is -ENODEV when CUDA_VISIBLE_DEVICES hides it.
 *
 * Context choice: the context current on the opening thread when there is one (it must belong to
 * the chosen GPU, else -EINVAL); otherwise the GPU's primary context, retained and made current
 * on that thread, as a runtime-API application would find it. A current context that is the
 * GPU's active primary context is retained as well, so the device memory upcie allocates in it
 * survives until upcie_gpu_cuda_dev_close() even if the application releases its own reference.
 * Calls made later from other threads push the context for their duration
 * (upcie_gpu_cuda_dev_enter()/leave()).
 *
 * BAR1: a peer (an NVMe controller) reaches VRAM through the GPU's BAR1 window, so the window must
 * map all of VRAM (resizable BAR). Its size is read from the sysfs "resource" file of the GPU's PCI
 * function (the bus id from cuDeviceGetPCIBusId; the largest memory BAR, which is the framebuffer
 * aperture: BAR 1 on bare metal, elsewhere under some hypervisors) and compared with
 * cuDeviceTotalMem: no NVML. A window smaller than VRAM is -EOPNOTSUPP.
 * UPCIE_SYSFS_ROOT moves the sysfs root, as everywhere in upcie.
 *
 * Ordering of peer writes: upcie_gpu_cuda_dev_peer_order() says whether the GPU promises that a
 * peer's (an NVMe controller's) writes into its memory become visible to its own threads in the
 * order they were issued (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING at least OWNER):
 * without it a completion written after its payload may be seen first. Waits on streams that
 * must end in bounded time poll the stream (upcie_gpu_cuda_stream_wait()): cuStreamSynchronize()
 * cannot be bounded, and a resident kernel that never ends would hold it forever.
 *
 * Needs: the CUDA driver API (<cuda.h>, link with -lcuda), a readable sysfs. Errors are -errno;
 * the CUDA error name is logged, never returned. C or C++ host code; no device code here.
 */
#ifndef UPCIE_GPU_DEV_CUDA_H
#define UPCIE_GPU_DEV_CUDA_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include <upcie/base/clock.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/pci/bdf.h>
#include <upcie/pci/func.h>

/* -errno for a CUresult (0 for CUDA_SUCCESS). */
static inline int upcie_gpu_cuda_errno(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS:
		return 0;
	case CUDA_ERROR_INVALID_VALUE:
	case CUDA_ERROR_INVALID_HANDLE:
	case CUDA_ERROR_INVALID_CONTEXT:
	case CUDA_ERROR_INVALID_DEVICE:
	case CUDA_ERROR_CONTEXT_IS_DESTROYED:
		return -EINVAL;
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_NOT_INITIALIZED:
	case CUDA_ERROR_DEINITIALIZED:
	case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
		return -ENODEV;
	case CUDA_ERROR_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	case CUDA_ERROR_NOT_PERMITTED:
		return -EPERM;
	case CUDA_ERROR_NOT_FOUND:
	case CUDA_ERROR_FILE_NOT_FOUND:
	case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED:
		return -ENOENT;
	case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
	case CUDA_ERROR_ALREADY_MAPPED:
	case CUDA_ERROR_CONTEXT_ALREADY_IN_USE:
		return -EEXIST;
	case CUDA_ERROR_NOT_READY:
		return -EAGAIN;
	case CUDA_ERROR_LAUNCH_TIMEOUT:
		return -ETIMEDOUT;
	case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
		return -ENOSPC;
	case CUDA_ERROR_INVALID_PTX:
	case CUDA_ERROR_INVALID_IMAGE:
	case CUDA_ERROR_NO_BINARY_FOR_GPU:
	case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
	case CUDA_ERROR_JIT_COMPILER_NOT_FOUND:
		return -ENOEXEC;
	default:
		return -EIO;
	}
}

/* Name of a CUresult ("CUDA_ERROR_INVALID_VALUE"), never NULL. */
static inline const char *upcie_gpu_cuda_strerror(CUresult r)
{
	const char *name = NULL;

	if (cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
		return "CUDA_ERROR_UNKNOWN_CODE";
	return name;
}

/*
 * Log a failed driver call and evaluate to its -errno: `return UPCIE_GPU_CUDA_FAIL(r,
 * "cuMemAlloc", "device heap of %zu bytes", n);`. `r` must not be CUDA_SUCCESS.
 */
#define UPCIE_GPU_CUDA_FAIL(r, call, fmt, ...)                                                     \
	(UPCIE_ERR("gpu: " fmt ": %s: %s", ##__VA_ARGS__, call, upcie_gpu_cuda_strerror(r)),       \
	 upcie_gpu_cuda_errno(r))

struct upcie_gpu_cuda_dev {
	CUdevice dev;
	CUcontext ctx;	   /* the context upcie allocates in */
	int ordinal;	   /* CUDA device ordinal */
	bool primary;	   /* ctx is the primary context, retained by upcie */
	bool made_current; /* upcie made ctx current on the opening thread */
	bool live;	   /* opened */
	uint64_t vram;	   /* bytes of device memory (cuDeviceTotalMem) */
	uint64_t bar1;	   /* bytes of the BAR1 window (sysfs) */
	int bar1_index;	   /* its index in sysfs "resource" */
	char pci_name[32]; /* PCI function, sysfs form ("0000:2b:00.0") */
};

/* Token for upcie_gpu_cuda_dev_enter()/leave(). */
struct upcie_gpu_cuda_ctx_save {
	bool pushed;
};

/* The PCI function of `dev` and the size and sysfs index of its BAR1 window. */
static inline int upcie_gpu_cuda_bar1_read(CUdevice dev, char *name, size_t len, uint64_t *bar1,
					   int *index)
{
	struct upcie_pci_resource res[UPCIE_PCI_NUM_RES];
	struct upcie_pci_bdf bdf;
	char busid[64];
	CUresult r;
	int err;

	r = cuDeviceGetPCIBusId(busid, (int)sizeof(busid), dev);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuDeviceGetPCIBusId", "GPU %d", (int)dev);
	err = upcie_pci_bdf_parse(busid, &bdf);
	if (err)
		return UPCIE_FAIL(
		    err, "gpu: CUDA reports the PCI bus id \"%s\", which is not a BDF", busid);
	upcie_pci_bdf_format(&bdf, name, len);
	err = upcie_pci_func_resources(&bdf, res);
	if (err)
		return UPCIE_FAIL(
		    err,
		    "gpu: cannot read the BAR sizes of GPU %s from %s/bus/pci/devices/"
		    "%s/resource: %s",
		    name, upcie_sysfs_root(), name, strerror(-err));
	/* The framebuffer aperture is the largest memory BAR (BAR 1 on bare metal; a hypervisor
	 * may lay the BARs out differently). */
	*bar1 = 0;
	for (int i = 0; i < UPCIE_PCI_NUM_BARS; i++)
		if ((res[i].flags & UPCIE_PCI_RES_MEM) && res[i].size > *bar1) {
			*bar1 = res[i].size;
			*index = i;
		}
	if (!*bar1)
		return UPCIE_FAIL(-EOPNOTSUPP, "gpu: GPU %s has no memory BAR", name);
	return 0;
}

/* Pick the context as described above. Called with no upcie state yet. */
static inline int upcie_gpu_cuda_ctx_choose_(struct upcie_gpu_cuda_dev *d)
{
	CUcontext cur = NULL, prim = NULL;
	CUdevice cdev;
	unsigned flags = 0;
	int active = 0;
	CUresult r;

	r = cuCtxGetCurrent(&cur);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuCtxGetCurrent", "GPU %d", d->ordinal);
	if (cur) {
		r = cuCtxGetDevice(&cdev);
		if (r != CUDA_SUCCESS)
			return UPCIE_GPU_CUDA_FAIL(r, "cuCtxGetDevice", "current context");
		if (cdev != d->dev)
			return UPCIE_FAIL(-EINVAL,
					  "gpu: the context current on this thread belongs to GPU "
					  "%d, not to GPU %d that was asked for",
					  (int)cdev, d->ordinal);
		d->ctx = cur;
		/* Hold the primary context if that is what the application uses. */
		r = cuDevicePrimaryCtxGetState(d->dev, &flags, &active);
		if (r == CUDA_SUCCESS && active) {
			r = cuDevicePrimaryCtxRetain(&prim, d->dev);
			if (r != CUDA_SUCCESS)
				return UPCIE_GPU_CUDA_FAIL(r, "cuDevicePrimaryCtxRetain", "GPU %d",
							   d->ordinal);
			if (prim == cur)
				d->primary = true;
			else
				cuDevicePrimaryCtxRelease(d->dev);
		}
		return 0;
	}
	r = cuDevicePrimaryCtxRetain(&prim, d->dev);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuDevicePrimaryCtxRetain", "GPU %d", d->ordinal);
	r = cuCtxSetCurrent(prim);
	if (r != CUDA_SUCCESS) {
		cuDevicePrimaryCtxRelease(d->dev);
		return UPCIE_GPU_CUDA_FAIL(r, "cuCtxSetCurrent", "primary context of GPU %d",
					   d->ordinal);
	}
	d->ctx = prim;
	d->primary = true;
	d->made_current = true;
	return 0;
}

/*
 * Open GPU `ordinal`: initialise the driver, choose the context, check that BAR1 covers VRAM.
 * Returns 0; -ENODEV (no such GPU, no driver); -EINVAL (a current context of another GPU);
 * -EOPNOTSUPP (BAR1 smaller than VRAM, or no dma-buf export support); a sysfs or CUDA error.
 * `d` is zeroed on failure; closing a zeroed one is a no-op.
 */
static inline int upcie_gpu_cuda_dev_open(struct upcie_gpu_cuda_dev *d, int ordinal)
{
	int n = 0, dmabuf = 0;
	size_t vram = 0;
	CUresult r;
	int err;

	if (!d)
		return UPCIE_FAIL(-EINVAL, "gpu: NULL device");
	memset(d, 0, sizeof(*d));
	r = cuInit(0);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuInit", "CUDA driver");
	r = cuDeviceGetCount(&n);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuDeviceGetCount", "CUDA driver");
	if (ordinal < 0 || ordinal >= n)
		return UPCIE_FAIL(-ENODEV, "gpu: no GPU %d (this system has %d)", ordinal, n);
	d->ordinal = ordinal;
	r = cuDeviceGet(&d->dev, ordinal);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuDeviceGet", "GPU %d", ordinal);
	r = cuDeviceTotalMem(&vram, d->dev);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuDeviceTotalMem", "GPU %d", ordinal);
	d->vram = vram;
	r = cuDeviceGetAttribute(&dmabuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d->dev);
	if (r != CUDA_SUCCESS || !dmabuf)
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "gpu: GPU %d cannot export its memory as a dma-buf "
				  "(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0; needs the open "
				  "kernel modules of the NVIDIA driver)",
				  ordinal);
	err = upcie_gpu_cuda_bar1_read(d->dev, d->pci_name, sizeof(d->pci_name), &d->bar1,
				       &d->bar1_index);
	if (err)
		return err;
	if (d->bar1 < d->vram)
		return UPCIE_FAIL(
		    -EOPNOTSUPP,
		    "gpu: GPU %d (%s) maps %" PRIu64 " MiB of its %" PRIu64
		    " MiB through BAR1; a peer needs all of it (enable resizable BAR)",
		    ordinal, d->pci_name, d->bar1 >> 20, d->vram >> 20);
	err = upcie_gpu_cuda_ctx_choose_(d);
	if (err) {
		memset(d, 0, sizeof(*d));
		return err;
	}
	d->live = true;
	return 0;
}

/*
 * The ordinal of the GPU at PCI address `pci` (as upcie_pci_bdf_parse() reads it, e.g.
 * "0000:41:00.0") among the GPUs this process sees. 0; -EINVAL (not a PCI address); -ENODEV (no
 * visible GPU there: absent, or hidden by CUDA_VISIBLE_DEVICES, which the message names); a CUDA
 * error. Initialises the driver.
 */
static inline int upcie_gpu_cuda_ordinal_by_pci(const char *pci, int *ordinal)
{
	struct upcie_pci_bdf bdf;
	char name[UPCIE_PCI_BDF_STRLEN], why[160] = "";
	const char *vis = getenv("CUDA_VISIBLE_DEVICES");
	CUdevice dev;
	CUresult r;
	int err;

	if (!pci || !ordinal)
		return UPCIE_FAIL(-EINVAL, "gpu: ordinal_by_pci needs an address and an output");
	err = upcie_pci_bdf_parse(pci, &bdf);
	if (err)
		return err;
	upcie_pci_bdf_format(&bdf, name, sizeof(name));
	if (vis)
		snprintf(why, sizeof(why), " (CUDA_VISIBLE_DEVICES=\"%.120s\")", vis);
	r = cuInit(0);
	if (r == CUDA_ERROR_NO_DEVICE)
		return UPCIE_FAIL(-ENODEV, "gpu: no GPU at %s: this process sees none%s", name,
				  why);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuInit", "CUDA driver");
	r = cuDeviceGetByPCIBusId(&dev, name);
	if (r == CUDA_ERROR_INVALID_DEVICE || r == CUDA_ERROR_INVALID_VALUE ||
	    r == CUDA_ERROR_NO_DEVICE)
		return UPCIE_FAIL(-ENODEV, "gpu: no GPU at %s among the GPUs this process sees%s",
				  name, why);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuDeviceGetByPCIBusId", "GPU at %s", name);
	*ordinal = (int)dev; /* a CUdevice is its ordinal */
	return 0;
}

/* upcie_gpu_cuda_dev_open() of the GPU at PCI address `pci` (upcie_gpu_cuda_ordinal_by_pci()). */
static inline int upcie_gpu_cuda_dev_open_pci(struct upcie_gpu_cuda_dev *d, const char *pci)
{
	int ordinal = -1, err;

	if (!d)
		return UPCIE_FAIL(-EINVAL, "gpu: NULL device");
	memset(d, 0, sizeof(*d));
	err = upcie_gpu_cuda_ordinal_by_pci(pci, &ordinal);
	return err ? err : upcie_gpu_cuda_dev_open(d, ordinal);
}

/*
 * Release the primary context if upcie retained it; where upcie made it current and it still is
 * on the calling thread, leave no context current there (a released primary context may be
 * destroyed, and a later open would find it current). A zeroed device is a no-op.
 */
static inline void upcie_gpu_cuda_dev_close(struct upcie_gpu_cuda_dev *d)
{
	CUcontext cur = NULL;

	if (!d || !d->live)
		return;
	if (d->made_current && cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == d->ctx)
		cuCtxSetCurrent(NULL);
	if (d->primary)
		cuDevicePrimaryCtxRelease(d->dev);
	memset(d, 0, sizeof(*d));
}

/* Make d->ctx current for a call from any thread; undo with upcie_gpu_cuda_dev_leave(). */
static inline int upcie_gpu_cuda_dev_enter(const struct upcie_gpu_cuda_dev *d,
					   struct upcie_gpu_cuda_ctx_save *save)
{
	CUcontext cur = NULL;
	CUresult r;

	save->pushed = false;
	r = cuCtxGetCurrent(&cur);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuCtxGetCurrent", "GPU %d", d->ordinal);
	if (cur == d->ctx)
		return 0;
	r = cuCtxPushCurrent(d->ctx);
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuCtxPushCurrent", "GPU %d", d->ordinal);
	save->pushed = true;
	return 0;
}

/*
 * Undo upcie_gpu_cuda_dev_enter(): pop the context it pushed, if it pushed one, so the
 * calling thread gets back whatever context it had.
 */
static inline void upcie_gpu_cuda_dev_leave(const struct upcie_gpu_cuda_dev *d,
					    struct upcie_gpu_cuda_ctx_save *save)
{
	CUcontext popped;

	(void)d;
	if (save->pushed)
		cuCtxPopCurrent(&popped);
	save->pushed = false;
}

/* How the device attribute is read; a test may substitute a function that reports another GPU. */
#ifndef UPCIE_GPU_CUDA_DEVICE_ATTRIBUTE
#define UPCIE_GPU_CUDA_DEVICE_ATTRIBUTE(v, attr, dev) cuDeviceGetAttribute(v, attr, dev)
#endif

/*
 * Whether `d` promises that peer writes into its memory become visible to its own threads in
 * issue order (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING >= OWNER). Returns 0, or
 * -EOPNOTSUPP with an error naming `what` (the setup refused) when it does not, or the attribute
 * cannot be read.
 */
static inline int upcie_gpu_cuda_dev_peer_order(const struct upcie_gpu_cuda_dev *d,
						const char *what)
{
	int v = 0;
	CUresult r = UPCIE_GPU_CUDA_DEVICE_ATTRIBUTE(
	    &v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING, d->dev);

	if (r != CUDA_SUCCESS)
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "gpu: GPU %d: cannot read CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_"
				  "WRITES_ORDERING (%s); %s refused",
				  d->ordinal, upcie_gpu_cuda_strerror(r), what);
	if (v < CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER)
		return UPCIE_FAIL(
		    -EOPNOTSUPP,
		    "gpu: GPU %d does not promise that a device's writes into its "
		    "memory reach its own threads in order "
		    "(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING %d, below "
		    "OWNER %d): a completion could be seen before its data; %s refused",
		    d->ordinal, v, (int)CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER, what);
	return 0;
}

/*
 * Wait until the work queued on `s` has finished, at most `timeout_ns`, polling
 * (cuStreamQuery). Returns 0; -ETIMEDOUT (still running: an error naming `what` is logged); the
 * stream's error.
 */
static inline int upcie_gpu_cuda_stream_wait(CUstream s, uint64_t timeout_ns, const char *what)
{
	uint64_t t0 = upcie_time_ns();
	CUresult r;

	while ((r = cuStreamQuery(s)) == CUDA_ERROR_NOT_READY) {
		if (upcie_time_ns() - t0 >= timeout_ns)
			return UPCIE_FAIL(-ETIMEDOUT, "gpu: %s: not finished after %" PRIu64 " ms",
					  what, timeout_ns / 1000000);
		sched_yield();
	}
	if (r != CUDA_SUCCESS)
		return UPCIE_GPU_CUDA_FAIL(r, "cuStreamQuery", "%s", what);
	return 0;
}

#endif /* UPCIE_GPU_DEV_CUDA_H */
