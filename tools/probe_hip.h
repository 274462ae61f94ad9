/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the HIP probes share: the runtime brought up on one device, the versions a report names,
 * and hipError_t turned into a negative errno plus the runtime's own name for it.
 *
 * Host code only (no kernels: this project has no ROCm device-code path), so it builds with
 * hipcc from ROCm 5.2 on and with any C++17 compiler given the HIP headers and
 * -D__HIP_PLATFORM_AMD__. hipMemGetHandleForAddressRange needs ROCm 7.0 (PROBE_HIP_HAVE_EXPORT).
 * Tools only.
 */
#ifndef UPCIE_TOOLS_PROBE_HIP_H
#define UPCIE_TOOLS_PROBE_HIP_H

#include <upcie/base/feature.h>

#if !defined(__HIP_PLATFORM_AMD__) && !defined(__HIP_PLATFORM_NVIDIA__)
#define __HIP_PLATFORM_AMD__ 1
#endif

#include <errno.h>
#include <hip/hip_runtime_api.h>
#include <hip/hip_version.h>
#include <stdio.h>
#include <string.h>

#include "probe_common.h"

/* dma-buf export of device memory (hipMemGetHandleForAddressRange) arrived with ROCm 7.0. */
#if HIP_VERSION_MAJOR >= 7
#define PROBE_HIP_HAVE_EXPORT 1
#else
#define PROBE_HIP_HAVE_EXPORT 0
#endif

/* -errno for a hipError_t; the runtime's name for it ("hipErrorInvalidValue") into why. */
static inline int probe_hip(hipError_t r, char *why, size_t len)
{
	const char *name;

	if (r == hipSuccess)
		return 0;
	name = hipGetErrorName(r);
	if (why && len) {
		if (name)
			snprintf(why, len, "%s", name);
		else
			snprintf(why, len, "hipError_t %d", (int)r);
	}
	switch (r) {
	case hipErrorInvalidValue:
		return -EINVAL;
	case hipErrorOutOfMemory:
		return -ENOMEM;
	case hipErrorNotSupported:
		return -EOPNOTSUPP;
	case hipErrorNoDevice:
	case hipErrorInvalidDevice:
		return -ENODEV;
	case hipErrorHostMemoryAlreadyRegistered:
		return -EEXIST;
	default:
		return -EIO;
	}
}

/*
 * Device `ordinal` made current. runtime/device get the words a report starts with; busid the
 * device's PCI address. Returns 0 or -errno (the runtime's error name in why).
 */
static inline int probe_hip_up(int ordinal, char *runtime, size_t rlen, char *device, size_t dlen,
			       char *busid, size_t blen, char *why, size_t wlen)
{
	hipDeviceProp_t prop;
	int drv = 0, rtv = 0, n = 0, err;

	err = probe_hip(hipInit(0), why, wlen);
	if (!err)
		err = probe_hip(hipGetDeviceCount(&n), why, wlen);
	if (!err && ordinal >= n) {
		snprintf(why, wlen, "only %d HIP device(s)", n);
		err = -ENODEV;
	}
	if (!err)
		err = probe_hip(hipSetDevice(ordinal), why, wlen);
	if (err)
		return err;
	if (hipDriverGetVersion(&drv) != hipSuccess)
		drv = -1;
	if (hipRuntimeGetVersion(&rtv) != hipSuccess)
		rtv = -1;
	snprintf(runtime, rlen, "driver %d, runtime %d (built against HIP %d.%d.%d)", drv, rtv,
		 HIP_VERSION_MAJOR, HIP_VERSION_MINOR, HIP_VERSION_PATCH);
	memset(&prop, 0, sizeof(prop));
	if (hipGetDeviceProperties(&prop, ordinal) != hipSuccess)
		snprintf(prop.name, sizeof(prop.name), "?");
	if (hipDeviceGetPCIBusId(busid, (int)blen, ordinal) != hipSuccess)
		snprintf(busid, blen, "?");
	snprintf(device, dlen, "%.80s (%.40s) at %.20s", prop.name, prop.gcnArchName, busid);
	return 0;
}

#endif /* UPCIE_TOOLS_PROBE_HIP_H */
