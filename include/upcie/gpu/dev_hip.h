/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * An AMD GPU for upcie through HIP: the GPU by ordinal, the facts the queue code needs (the
 * wall-clock rate, the architecture name, fine-grained memory support), the check that its BAR
 * covers all of its memory, and hipError_t-to-errno mapping. The HIP counterpart of
 * gpu/dev_cuda.h.
 *
 * Device choice: HIP has no context stack; the device current on the opening thread is left as
 * it was, and calls upcie makes later set the GPU for their duration
 * (upcie_gpu_hip_dev_enter()/leave()).
 *
 * BAR: a peer (an NVMe controller) reaches VRAM through the GPU's memory BAR, so the BAR must
 * map all of VRAM (resizable/large BAR). Its size is read from the sysfs "resource" file of the
 * GPU's PCI function (hipDeviceGetPCIBusId; the largest memory BAR) and compared with
 * hipDeviceTotalMem; a smaller window is -EOPNOTSUPP. UPCIE_SYSFS_ROOT moves the sysfs root.
 *
 * Wall clock: device code times its waits with the counter wall_clock64() reads
 * (base/arch_hip.h), at the rate hipDeviceAttributeWallClockRate reports in kHz. That attribute
 * is not in ROCm 5.2's headers; it is asked for by its value (10017, the slot after
 * hipDeviceAttributeFineGrainSupport), so a build against 5.2 still asks a newer runtime. A
 * runtime that does not know it leaves wall_khz 0: GPU-issued queues then refuse to start
 * (gpuq/gqp_host_hip.h) unless the caller sets a measured rate.
 *
 * Fine-grained memory: consumer RDNA GPUs reach host memory fine-grained only with
 * HSA_FORCE_FINE_GRAIN_PCIE=1 in the environment; without it a kernel faults on the host
 * memory the bridge needs. Open warns when the attribute says 0 and the variable is unset.
 *
 * Needs: the HIP runtime (<hip/hip_runtime_api.h>, link libamdhip64), a readable sysfs. Errors
 * are -errno; the HIP error name is logged, never returned. C++ host code (hipcc or any C++
 * compiler with the HIP headers); no device code here.
 */
#ifndef UPCIE_GPU_DEV_HIP_H
#define UPCIE_GPU_DEV_HIP_H

#include <upcie/base/feature.h>

#if !defined(__HIP_PLATFORM_AMD__) && !defined(__HIP_PLATFORM_NVIDIA__)
#define __HIP_PLATFORM_AMD__ 1
#endif

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <hip/hip_runtime_api.h>
#include <hip/hip_version.h>

#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/pci/bdf.h>
#include <upcie/pci/func.h>

/* hipDeviceAttributeWallClockRate (kHz), by value where the headers lack the name (ROCm 5.2). */
#define UPCIE_GPU_HIP_ATTR_WALL_CLOCK_RATE ((hipDeviceAttribute_t)10017)
#if HIP_VERSION_MAJOR >= 6
UPCIE_STATIC_ASSERT((int)hipDeviceAttributeWallClockRate == 10017,
		    "hipDeviceAttributeWallClockRate moved");
#endif

/* -errno for a hipError_t (0 for hipSuccess). */
static inline int upcie_gpu_hip_errno(hipError_t r)
{
	switch (r) {
	case hipSuccess:
		return 0;
	case hipErrorInvalidValue:
	case hipErrorInvalidHandle:
	case hipErrorInvalidContext:
	case hipErrorInvalidDevice:
	case hipErrorInvalidDevicePointer:
	case hipErrorContextIsDestroyed:
		return -EINVAL;
	case hipErrorOutOfMemory:
	case hipErrorRuntimeMemory:
		return -ENOMEM;
	case hipErrorNoDevice:
	case hipErrorNotInitialized:
	case hipErrorDeinitialized:
	case hipErrorInsufficientDriver:
		return -ENODEV;
	case hipErrorNotSupported:
		return -EOPNOTSUPP;
	case hipErrorNotFound:
	case hipErrorFileNotFound:
	case hipErrorHostMemoryNotRegistered:
		return -ENOENT;
	case hipErrorHostMemoryAlreadyRegistered:
	case hipErrorAlreadyMapped:
	case hipErrorContextAlreadyInUse:
		return -EEXIST;
	case hipErrorNotReady:
		return -EAGAIN;
	case hipErrorLaunchTimeOut:
		return -ETIMEDOUT;
	case hipErrorLaunchOutOfResources:
		return -ENOSPC;
	case hipErrorInvalidImage:
	case hipErrorNoBinaryForGpu:
	case hipErrorInvalidKernelFile:
		return -ENOEXEC;
	default:
		return -EIO;
	}
}

/* Name of a hipError_t ("hipErrorInvalidValue"), never NULL. */
static inline const char *upcie_gpu_hip_strerror(hipError_t r)
{
	const char *name = hipGetErrorName(r);

	return name ? name : "hipErrorUnknownCode";
}

/* A teardown call whose failure changes nothing but deserves a line in the log. */
static inline void upcie_gpu_hip_check_(hipError_t r, const char *call)
{
	if (r != hipSuccess)
		UPCIE_WARN("gpu: %s: %s", call, upcie_gpu_hip_strerror(r));
}

/*
 * Log a failed runtime call and evaluate to its -errno: `return UPCIE_GPU_HIP_FAIL(r, "hipMalloc",
 * "device heap of %zu bytes", n);`. `r` must not be hipSuccess.
 */
#define UPCIE_GPU_HIP_FAIL(r, call, fmt, ...)                                                      \
	(UPCIE_ERR("gpu: " fmt ": %s: %s", ##__VA_ARGS__, call, upcie_gpu_hip_strerror(r)),        \
	 upcie_gpu_hip_errno(r))

struct upcie_gpu_hip_dev {
	int ordinal;	   /* HIP device ordinal */
	bool live;	   /* opened */
	bool large_bar;	   /* hipDeviceAttributeIsLargeBar */
	bool fine_grain;   /* hipDeviceAttributeFineGrainSupport */
	uint32_t wall_khz; /* hipDeviceAttributeWallClockRate; 0: the runtime does not say */
	uint64_t vram;	   /* bytes of device memory (hipDeviceTotalMem) */
	uint64_t bar;	   /* bytes of the largest memory BAR (sysfs) */
	int bar_index;	   /* its index in sysfs "resource" */
	char arch[64];	   /* gcnArchName ("gfx1101", "gfx90a:sramecc+:xnack-") */
	char pci_name[32]; /* PCI function, sysfs form ("0000:03:00.0") */
};

/* Token for upcie_gpu_hip_dev_enter()/leave(). */
struct upcie_gpu_hip_dev_save {
	int prev;
	bool changed;
};

/* The PCI function of device `ordinal` and the size and sysfs index of its largest memory BAR. */
static inline int upcie_gpu_hip_bar_read(int ordinal, char *name, size_t len, uint64_t *bar,
					 int *index)
{
	struct upcie_pci_resource res[UPCIE_PCI_NUM_RES];
	struct upcie_pci_bdf bdf;
	char busid[64];
	hipError_t r;
	int err;

	r = hipDeviceGetPCIBusId(busid, (int)sizeof(busid), ordinal);
	if (r != hipSuccess)
		return UPCIE_GPU_HIP_FAIL(r, "hipDeviceGetPCIBusId", "GPU %d", ordinal);
	err = upcie_pci_bdf_parse(busid, &bdf);
	if (err)
		return UPCIE_FAIL(err, "gpu: HIP reports the PCI bus id \"%s\", which is not a BDF",
				  busid);
	upcie_pci_bdf_format(&bdf, name, len);
	err = upcie_pci_func_resources(&bdf, res);
	if (err)
		return UPCIE_FAIL(
		    err,
		    "gpu: cannot read the BAR sizes of GPU %s from %s/bus/pci/devices/"
		    "%s/resource: %s",
		    name, upcie_sysfs_root(), name, strerror(-err));
	*bar = 0;
	for (int i = 0; i < UPCIE_PCI_NUM_BARS; i++)
		if ((res[i].flags & UPCIE_PCI_RES_MEM) && res[i].size > *bar) {
			*bar = res[i].size;
			*index = i;
		}
	if (!*bar)
		return UPCIE_FAIL(-EOPNOTSUPP, "gpu: GPU %s has no memory BAR", name);
	return 0;
}

/*
 * Open GPU `ordinal`: initialise the runtime, read the device's facts, check that its BAR covers
 * VRAM. Returns 0; -ENODEV (no such GPU, no runtime or driver: the HIP error is logged);
 * -EOPNOTSUPP (BAR smaller than VRAM); a sysfs or HIP error. `d` is zeroed on failure; closing
 * a zeroed one is a no-op. A missing wall-clock rate is not an error here (wall_khz 0, logged).
 */
static inline int upcie_gpu_hip_dev_open(struct upcie_gpu_hip_dev *d, int ordinal)
{
	hipDeviceProp_t prop;
	size_t vram = 0;
	int n = 0, v = 0;
	hipError_t r;
	int err;

	if (!d)
		return UPCIE_FAIL(-EINVAL, "gpu: NULL device");
	memset(d, 0, sizeof(*d));
	r = hipInit(0);
	if (r != hipSuccess) /* no usable GPU or driver, whatever the runtime calls it */
		return UPCIE_FAIL(-ENODEV, "gpu: HIP runtime: hipInit: %s",
				  upcie_gpu_hip_strerror(r));
	r = hipGetDeviceCount(&n);
	if (r != hipSuccess)
		return UPCIE_GPU_HIP_FAIL(r, "hipGetDeviceCount", "HIP runtime");
	if (ordinal < 0 || ordinal >= n)
		return UPCIE_FAIL(-ENODEV, "gpu: no GPU %d (this system has %d)", ordinal, n);
	d->ordinal = ordinal;
	r = hipDeviceTotalMem(&vram, ordinal);
	if (r != hipSuccess)
		return UPCIE_GPU_HIP_FAIL(r, "hipDeviceTotalMem", "GPU %d", ordinal);
	d->vram = vram;
	memset(&prop, 0, sizeof(prop));
	r = hipGetDeviceProperties(&prop, ordinal);
	if (r != hipSuccess)
		return UPCIE_GPU_HIP_FAIL(r, "hipGetDeviceProperties", "GPU %d", ordinal);
	snprintf(d->arch, sizeof(d->arch), "%.63s", prop.gcnArchName);
	if (hipDeviceGetAttribute(&v, hipDeviceAttributeIsLargeBar, ordinal) == hipSuccess)
		d->large_bar = v != 0;
	v = 0;
	if (hipDeviceGetAttribute(&v, hipDeviceAttributeFineGrainSupport, ordinal) == hipSuccess)
		d->fine_grain = v != 0;
	v = 0;
	r = hipDeviceGetAttribute(&v, UPCIE_GPU_HIP_ATTR_WALL_CLOCK_RATE, ordinal);
	if (r == hipSuccess && v > 0)
		d->wall_khz = (uint32_t)v;
	else
		UPCIE_WARN("gpu: GPU %d (%s): the runtime does not report "
			   "hipDeviceAttributeWallClockRate (%s; needs a ROCm newer than 5.2): "
			   "GPU-issued queues need the rate set by hand",
			   ordinal, d->arch, r == hipSuccess ? "0" : upcie_gpu_hip_strerror(r));
	if (!d->fine_grain && !getenv("HSA_FORCE_FINE_GRAIN_PCIE"))
		UPCIE_WARN("gpu: GPU %d (%s) reports no fine-grained memory; on consumer RDNA set "
			   "HSA_FORCE_FINE_GRAIN_PCIE=1, or kernels fault on host memory",
			   ordinal, d->arch);
	err = upcie_gpu_hip_bar_read(ordinal, d->pci_name, sizeof(d->pci_name), &d->bar,
				     &d->bar_index);
	if (err) {
		memset(d, 0, sizeof(*d));
		return err;
	}
	if (d->bar < d->vram) {
		err = UPCIE_FAIL(
		    -EOPNOTSUPP,
		    "gpu: GPU %d (%s) maps %" PRIu64 " MiB of its %" PRIu64
		    " MiB through its BAR; a peer needs all of it (enable resizable BAR)",
		    ordinal, d->pci_name, d->bar >> 20, d->vram >> 20);
		memset(d, 0, sizeof(*d));
		return err;
	}
	d->live = true;
	return 0;
}

/* Nothing to release; zeroes `d`. A zeroed device is a no-op. */
static inline void upcie_gpu_hip_dev_close(struct upcie_gpu_hip_dev *d)
{
	if (d)
		memset(d, 0, sizeof(*d));
}

/* Make d's GPU current for a call from any thread; undo with upcie_gpu_hip_dev_leave(). */
static inline int upcie_gpu_hip_dev_enter(const struct upcie_gpu_hip_dev *d,
					  struct upcie_gpu_hip_dev_save *save)
{
	hipError_t r;

	save->changed = false;
	save->prev = -1;
	r = hipGetDevice(&save->prev);
	if (r != hipSuccess)
		return UPCIE_GPU_HIP_FAIL(r, "hipGetDevice", "GPU %d", d->ordinal);
	if (save->prev == d->ordinal)
		return 0;
	r = hipSetDevice(d->ordinal);
	if (r != hipSuccess)
		return UPCIE_GPU_HIP_FAIL(r, "hipSetDevice", "GPU %d", d->ordinal);
	save->changed = true;
	return 0;
}

/* Undo upcie_gpu_hip_dev_enter(): restore the thread's previous device if it was changed. */
static inline void upcie_gpu_hip_dev_leave(const struct upcie_gpu_hip_dev *d,
					   struct upcie_gpu_hip_dev_save *save)
{
	(void)d;
	if (save->changed)
		upcie_gpu_hip_check_(hipSetDevice(save->prev), "hipSetDevice");
	save->changed = false;
}

#endif /* UPCIE_GPU_DEV_HIP_H */
