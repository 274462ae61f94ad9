/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * probe_dmabuf_hip: the dma-buf export probe (probe_dmabuf.h), HIP flavour.
 *
 * hipMalloc allocates, hipMemGetHandleForAddressRange(hipMemRangeHandleTypeDmaBufFd) exports
 * (ROCm 7.0 and later; built against an older HIP, every export answers that it needs 7.0),
 * hipMemGetAddressRange answers for a pointer. After the common questions it asks one of its own:
 * whether the export takes the PCIe mapping-type flag (hipMemRangeFlagDmaBufMappingTypePcie).
 *
 * Usage: probe_dmabuf_hip [--device ORDINAL]   (also -h/--help, --version; tools/opt.h parses)
 * Prints findings and exits 0; 2 for usage errors (with a message naming the argument), 1 when
 * there is no HIP device to ask.
 */
#include <upcie/base/feature.h>

#include <stdlib.h>
#include <string.h>

#include "opt.h"
#include "probe_common.h"
#include "probe_dmabuf.h"
#include "probe_hip.h"

static unsigned long long probe_export_flags;

static int probe_dmabuf_alloc(struct probe_dmabuf_rt *rt, uint64_t size, uint64_t *ptr)
{
	void *p = NULL;
	int err = probe_hip(hipMalloc(&p, (size_t)size), rt->why, sizeof(rt->why));

	*ptr = (uint64_t)(uintptr_t)p;
	return err;
}

static int probe_dmabuf_export(struct probe_dmabuf_rt *rt, uint64_t ptr, uint64_t len, int *fd)
{
#if PROBE_HIP_HAVE_EXPORT
	int f = -1;
	int err = probe_hip(
	    hipMemGetHandleForAddressRange(&f, (hipDeviceptr_t)(uintptr_t)ptr, (size_t)len,
					   hipMemRangeHandleTypeDmaBufFd, probe_export_flags),
	    rt->why, sizeof(rt->why));

	*fd = err ? -1 : f;
	return err;
#else
	(void)ptr;
	(void)len;
	*fd = -1;
	snprintf(rt->why, sizeof(rt->why),
		 "built against HIP %d.%d: hipMemGetHandleForAddressRange needs ROCm 7.0",
		 HIP_VERSION_MAJOR, HIP_VERSION_MINOR);
	return -EOPNOTSUPP;
#endif
}

static int probe_dmabuf_range(struct probe_dmabuf_rt *rt, uint64_t ptr, uint64_t *base,
			      uint64_t *size)
{
	hipDeviceptr_t b = NULL;
	size_t s = 0;
	int err = probe_hip(hipMemGetAddressRange(&b, &s, (hipDeviceptr_t)(uintptr_t)ptr), rt->why,
			    sizeof(rt->why));

	*base = (uint64_t)(uintptr_t)b;
	*size = (uint64_t)s;
	return err;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: probe_dmabuf_hip [--device ORDINAL]\n"
		   "  --device ORDINAL  the HIP device to ask, 0..255 (default 0)\n"
		   "  -h, --help        this text; --version the version\n"
		   "Asks HIP what a dma-buf export of its device memory describes. Exits 0; 2 for\n"
		   "usage errors, 1 when there is no HIP device to ask.\n");
}

enum { DMABUF_HIP_O_DEVICE = 256, DMABUF_HIP_O_VERSION };

static const struct option dmabuf_hip_long_opts[] = {
	{ "device", required_argument, NULL, DMABUF_HIP_O_DEVICE },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, DMABUF_HIP_O_VERSION },
	{ NULL, 0, NULL, 0 },
};

int main(int argc, char **argv)
{
	struct probe_dmabuf_rt rt;
	hipMemAllocationProp prop;
	char busid[32];
	size_t g = 0;
	unsigned ordinal = 0;
	int err, c;

	opt_tool = "probe_dmabuf_hip";
	argv[0] = (char *)opt_tool; /* getopt's own messages name the probe */
	while ((c = getopt_long(argc, argv, "h", dmabuf_hip_long_opts, NULL)) != -1) {
		switch (c) {
		case DMABUF_HIP_O_DEVICE:
			if (opt_unsigned(optarg, 0, 255, &ordinal))
				return opt_bad("--device", optarg, "a HIP device ordinal 0..255");
			break;
		case 'h':
			usage(stdout);
			return PROBE_EXIT_OK;
		case DMABUF_HIP_O_VERSION:
			return opt_version();
		default:
			return opt_unknown();
		}
	}
	if (optind < argc)
		return opt_bad("argument", argv[optind], "options only (--device ORDINAL)");
	memset(&rt, 0, sizeof(rt));
	rt.name = "HIP";
	probe_begin("probe_dmabuf_hip", "what a HIP dma-buf export of device memory describes");
	err = probe_hip_up((int)ordinal, rt.runtime, sizeof(rt.runtime), rt.device,
			   sizeof(rt.device), busid, sizeof(busid), rt.why, sizeof(rt.why));
	if (err) {
		probe_say("no HIP device %u to ask: %s (%s)", ordinal, rt.why, probe_err(err));
		return PROBE_EXIT_CANNOT;
	}
	memset(&prop, 0, sizeof(prop));
	prop.type = hipMemAllocationTypePinned;
	prop.location.type = hipMemLocationTypeDevice;
	prop.location.id = (int)ordinal;
	if (hipMemGetAllocationGranularity(&g, &prop, hipMemAllocationGranularityMinimum) ==
	    hipSuccess)
		rt.granularity = g;
	if (hipMemGetAllocationGranularity(&g, &prop, hipMemAllocationGranularityRecommended) ==
	    hipSuccess)
		rt.granularity_rec = g;
	probe_dmabuf_run(&rt);

	probe_say("HIP only: the export with the PCIe mapping-type flag");
	{
		uint64_t ptr = 0;
		int fd = -1;

		err = probe_dmabuf_alloc(&rt, 2 * PROBE_MiB, &ptr);
		if (!err) {
			probe_export_flags = 1; /* hipMemRangeFlagDmaBufMappingTypePcie */
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
	return PROBE_EXIT_OK;
}
