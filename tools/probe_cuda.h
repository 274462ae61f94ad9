/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the CUDA probes share: the driver API brought up on one device (its primary context), the
 * versions a report names, and CUresult turned into a negative errno plus the driver's own name.
 *
 * Needs the CUDA driver (libcuda) and a GPU at run time; nvcc to build. Tools only.
 */
#ifndef UPCIE_TOOLS_PROBE_CUDA_H
#define UPCIE_TOOLS_PROBE_CUDA_H

#include <upcie/base/feature.h>

#include <cuda.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "probe_common.h"

/* -errno for a CUresult; the driver's name for it ("CUDA_ERROR_NOT_SUPPORTED") into why. */
static inline int probe_cu(CUresult r, char *why, size_t len)
{
	const char *name = NULL;

	if (r == CUDA_SUCCESS)
		return 0;
	if (why && len) {
		if (cuGetErrorName(r, &name) == CUDA_SUCCESS && name)
			snprintf(why, len, "%s", name);
		else
			snprintf(why, len, "CUresult %d", (int)r);
	}
	switch (r) {
	case CUDA_ERROR_INVALID_VALUE:
		return -EINVAL;
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	case CUDA_ERROR_NOT_PERMITTED:
		return -EPERM;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_INVALID_DEVICE:
		return -ENODEV;
	case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
		return -EEXIST;
	case CUDA_ERROR_OPERATING_SYSTEM:
		return -EIO;
	default:
		return -EIO;
	}
}

/* The kernel module's version line ("NVRM version: ... 580.159.04 ..."), or "?". */
static inline void probe_cu_kmod_version(char *buf, size_t len)
{
	char line[256];
	FILE *f = fopen("/proc/driver/nvidia/version", "re");

	snprintf(buf, len, "?");
	if (!f)
		return;
	if (fgets(line, sizeof(line), f)) {
		char *v = strstr(line, "Kernel Module");

		line[strcspn(line, "\n")] = '\0';
		probe_strcpy(buf, len, v ? v : line);
	}
	fclose(f);
}

/*
 * cuInit, device `ordinal`, its primary context made current. runtime/device get the words a
 * report starts with. Returns 0 or -errno (the driver's error name in why).
 */
static inline int probe_cu_up(int ordinal, CUdevice *dev, CUcontext *ctx, char *runtime,
			      size_t rlen, char *device, size_t dlen, char *why, size_t wlen)
{
	char name[128] = "?", bus[32] = "?", kmod[128];
	int drv = 0, dmabuf = 0, err;

	err = probe_cu(cuInit(0), why, wlen);
	if (!err)
		err = probe_cu(cuDeviceGet(dev, ordinal), why, wlen);
	if (!err)
		err = probe_cu(cuDevicePrimaryCtxRetain(ctx, *dev), why, wlen);
	if (!err)
		err = probe_cu(cuCtxSetCurrent(*ctx), why, wlen);
	if (err)
		return err;
	cuDriverGetVersion(&drv);
	probe_cu_kmod_version(kmod, sizeof(kmod));
	snprintf(runtime, rlen, "driver API %d.%d (built against %d.%d), %.100s", drv / 1000,
		 (drv % 1000) / 10, CUDA_VERSION / 1000, (CUDA_VERSION % 1000) / 10, kmod);
	cuDeviceGetName(name, (int)sizeof(name), *dev);
	cuDeviceGetPCIBusId(bus, (int)sizeof(bus), *dev);
	cuDeviceGetAttribute(&dmabuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, *dev);
	snprintf(device, dlen, "%.80s at %.20s, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED %d", name,
		 bus, dmabuf);
	return 0;
}

#endif /* UPCIE_TOOLS_PROBE_CUDA_H */
