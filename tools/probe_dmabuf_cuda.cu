/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * probe_dmabuf_cuda: the dma-buf export probe (probe_dmabuf.h), CUDA flavour.
 *
 * cuMemAlloc allocates, cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)
 * exports, cuMemGetAddressRange answers for a pointer. After the common questions it asks one of
 * its own: whether the export takes CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE (CUDA 12.8+).
 *
 * Usage: probe_dmabuf_cuda [--device ORDINAL]   (also -h/--help, --version; tools/opt.h parses)
 * Prints findings and exits 0; 2 for usage errors (with a message naming the argument), 1 when
 * there is no CUDA device to ask.
 */
#include <upcie/base/feature.h>

#include <cuda.h>
#include <stdlib.h>
#include <string.h>

#include "opt.h"
#include "probe_common.h"
#include "probe_cuda.h"
#include "probe_dmabuf.h"

static unsigned long long probe_export_flags;

static int probe_dmabuf_alloc(struct probe_dmabuf_rt *rt, uint64_t size, uint64_t *ptr)
{
	CUdeviceptr p = 0;
	int err = probe_cu(cuMemAlloc(&p, (size_t)size), rt->why, sizeof(rt->why));

	*ptr = (uint64_t)p;
	return err;
}

static int probe_dmabuf_export(struct probe_dmabuf_rt *rt, uint64_t ptr, uint64_t len, int *fd)
{
	int f = -1;
	int err = probe_cu(cuMemGetHandleForAddressRange(&f, (CUdeviceptr)ptr, (size_t)len,
							 CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
							 probe_export_flags),
			   rt->why, sizeof(rt->why));

	*fd = err ? -1 : f;
	return err;
}

static int probe_dmabuf_range(struct probe_dmabuf_rt *rt, uint64_t ptr, uint64_t *base,
			      uint64_t *size)
{
	CUdeviceptr b = 0;
	size_t s = 0;
	int err =
	    probe_cu(cuMemGetAddressRange(&b, &s, (CUdeviceptr)ptr), rt->why, sizeof(rt->why));

	*base = (uint64_t)b;
	*size = (uint64_t)s;
	return err;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: probe_dmabuf_cuda [--device ORDINAL]\n"
		"  --device ORDINAL  the CUDA device to ask, 0..255 (default 0)\n"
		"  -h, --help        this text; --version the version\n"
		"Asks CUDA what a dma-buf export of its device memory describes. Exits 0; 2 for\n"
		"usage errors, 1 when there is no CUDA device to ask.\n");
}

enum { DMABUF_CUDA_O_DEVICE = 256, DMABUF_CUDA_O_VERSION };

static const struct option dmabuf_cuda_long_opts[] = {
	{ "device", required_argument, NULL, DMABUF_CUDA_O_DEVICE },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, DMABUF_CUDA_O_VERSION },
	{ NULL, 0, NULL, 0 },
};

int main(int argc, char **argv)
{
	struct probe_dmabuf_rt rt;
	CUmemAllocationProp prop;
	CUdevice dev = 0;
	CUcontext ctx = NULL;
	size_t g = 0;
	unsigned ordinal = 0;
	int err, c;

	opt_tool = "probe_dmabuf_cuda";
	argv[0] = (char *)opt_tool; /* getopt's own messages name the probe */
	while ((c = getopt_long(argc, argv, "h", dmabuf_cuda_long_opts, NULL)) != -1) {
		switch (c) {
		case DMABUF_CUDA_O_DEVICE:
			if (opt_unsigned(optarg, 0, 255, &ordinal))
				return opt_bad("--device", optarg, "a CUDA device ordinal 0..255");
			break;
		case 'h':
			usage(stdout);
			return PROBE_EXIT_OK;
		case DMABUF_CUDA_O_VERSION:
			return opt_version();
		default:
			return opt_unknown();
		}
	}
	if (optind < argc)
		return opt_bad("argument", argv[optind], "options only (--device ORDINAL)");
	memset(&rt, 0, sizeof(rt));
	rt.name = "CUDA";
	probe_begin("probe_dmabuf_cuda", "what a CUDA dma-buf export of device memory describes");
	err = probe_cu_up((int)ordinal, &dev, &ctx, rt.runtime, sizeof(rt.runtime), rt.device,
			  sizeof(rt.device), rt.why, sizeof(rt.why));
	if (err) {
		probe_say("no CUDA device %u to ask: %s (%s)", ordinal, rt.why, probe_err(err));
		return PROBE_EXIT_CANNOT;
	}
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = (int)dev;
	if (cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
	    CUDA_SUCCESS)
		rt.granularity = g;
	if (cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) ==
	    CUDA_SUCCESS)
		rt.granularity_rec = g;
	probe_dmabuf_run(&rt);

#if CUDA_VERSION >= 12080
	{
		uint64_t ptr = 0;
		int fd = -1;

		probe_say("CUDA only: the export with CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE");
		err = probe_dmabuf_alloc(&rt, 2 * PROBE_MiB, &ptr);
		if (!err) {
			probe_export_flags = CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE;
			err = probe_dmabuf_export(&rt, ptr, 2 * PROBE_MiB, &fd);
			probe_export_flags = 0;
		}
		if (err) {
			probe_say("  2 MiB: refused, %s (%s)", rt.why, probe_err(err));
		} else {
			int64_t size;
			char exp[64];

			probe_dmabuf_facts(fd, &size, exp, sizeof(exp));
			probe_say("  2 MiB: ok, exporter %s, dma-buf size %s", exp,
				  size < 0 ? probe_err((int)size) : probe_size((uint64_t)size));
			close(fd);
		}
	}
#endif
	cuDevicePrimaryCtxRelease(dev);
	return PROBE_EXIT_OK;
}
