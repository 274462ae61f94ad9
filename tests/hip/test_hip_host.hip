// SPDX-License-Identifier: BSD-3-Clause
/*
 * Host test of the HIP provider (gpu/dev_hip.h, gpu/heap_hip.h, gpuq/gqp_host_hip.h,
 * gpuq/cqmirror_host_hip.h) on a machine with the HIP runtime and no AMD GPU: what can be decided
 * without one. The whole-BO rule for exports (an export must cover the allocation and may exceed
 * it by one buffer object's rounding only), the LUT granule picked from a scatter list,
 * hipError_t to errno, what opening the provider answers without a GPU (-ENODEV with the HIP
 * error logged) and, for IMPORT translation, without ROCm 7.0 (-EOPNOTSUPP), and the queue and
 * mirror calls on a closed provider, the payload placement rule's verdict on the attributes the
 * runtime reports. Nothing here claims GPU behaviour.
 */
#include <upcie/gpu/heap_hip.h>
#include <upcie/gpuq/cqmirror_host_hip.h>
#include <upcie/gpuq/gqp_host_hip.h>

#include "../unit/check.h"

static char g_last[512];

static void grab(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	snprintf(g_last, sizeof(g_last), "%s", msg);
	printf("# log: %s\n", msg);
}

int main(void)
{
	const uint64_t M = UINT64_C(1) << 20, K = 1024;
	struct upcie_sg_seg segs[4];
	struct upcie_gpu_hip gpu;
	struct upcie_gpu_hip_opts o;
	int err;

	setvbuf(stdout, NULL, _IOLBF, 0);
	upcie_log_set_handler(grab, NULL);
	upcie_log_set_level(UPCIE_LOG_WARN);

	/* ROCm exports the whole buffer object from the allocation's base */
	CHECK_EQ(upcie_gpu_hip_export_check(0x7f0000000000, 3 * M + 4 * K, 4 * M), 0,
		 "3 MiB + 4 KiB allocation exported as its 4 MiB object: accepted");
	CHECK_EQ(upcie_gpu_hip_export_check(0x7f0000000000, 64 * M, 64 * M), 0,
		 "an export of exactly the allocation: accepted");
	CHECK_EQ(upcie_gpu_hip_export_check(0x7f0000000000, 4 * M, 2 * M), -EINVAL,
		 "an export describing less than the allocation: -EINVAL");
	CHECK_EQ(upcie_gpu_hip_export_check(0x7f0000000000, 4 * K, 64 * M), -EOPNOTSUPP,
		 "a 4 KiB allocation whose export describes 64 MiB (a piece of a larger object at "
		 "an unknown offset): refused, -EOPNOTSUPP");
	CHECK_EQ(upcie_gpu_hip_export_check(0x7f0000000000, 4 * K, 2 * M), 0,
		 "a 4 KiB allocation in its own 2 MiB object: accepted");

	/* granule from the scatter list */
	segs[0].addr = 0x100000000;
	segs[0].len = 2 * M;
	segs[1].addr = 0x100200000;
	segs[1].len = 2 * M;
	segs[2].addr = 0x300000000;
	segs[2].len = 4 * M;
	CHECK_EQ(upcie_gpu_hip_granule_pick(segs, 3, 8 * M), 21, "2 MiB runs: 2 MiB granule");
	CHECK_EQ(upcie_gpu_hip_granule_pick(segs, 3, 3 * M + 4 * K), 21,
		 "trimmed to a 3 MiB + 4 KiB allocation: still 2 MiB (the last run may end short)");
	segs[2].addr = 0x300010000;
	CHECK_EQ(upcie_gpu_hip_granule_pick(segs, 3, 8 * M), 16, "a run at 64 KiB: 64 KiB granule");
	segs[2].addr = 0x300001000;
	CHECK_EQ(upcie_gpu_hip_granule_pick(segs, 3, 8 * M), 12, "a run at 4 KiB: 4 KiB granule");

	/* errno mapping */
	CHECK_EQ(upcie_gpu_hip_errno(hipSuccess), 0, "hipSuccess -> 0");
	CHECK_EQ(upcie_gpu_hip_errno(hipErrorInvalidValue), -EINVAL,
		 "hipErrorInvalidValue -> -EINVAL");
	CHECK_EQ(upcie_gpu_hip_errno(hipErrorOutOfMemory), -ENOMEM,
		 "hipErrorOutOfMemory -> -ENOMEM");
	CHECK_EQ(upcie_gpu_hip_errno(hipErrorNoDevice), -ENODEV, "hipErrorNoDevice -> -ENODEV");
	CHECK_EQ(upcie_gpu_hip_errno(hipErrorNotSupported), -EOPNOTSUPP,
		 "hipErrorNotSupported -> -EOPNOTSUPP");
	CHECK(strcmp(upcie_gpu_hip_strerror(hipErrorInvalidValue), "hipErrorInvalidValue") == 0,
	      "the HIP error name is what gets logged (%s)",
	      upcie_gpu_hip_strerror(hipErrorInvalidValue));

	/* the provider on a machine with no AMD GPU */
	memset(&o, 0, sizeof(o));
	o.xlate = UPCIE_GPU_HIP_XLATE_OFFSET;
	err = upcie_gpu_hip_open(&gpu, &o);
	CHECK(err == -ENODEV, "OFFSET open without a GPU: %s (%s)", upcie_errno_name(err), g_last);
	CHECK(!gpu.p, "the handle is zeroed on failure");
	upcie_gpu_hip_close(&gpu);
	o.xlate = UPCIE_GPU_HIP_XLATE_IMPORT;
	err = upcie_gpu_hip_open(&gpu, &o);
	if (UPCIE_GPU_HIP_HAVE_EXPORT)
		CHECK(err != 0, "IMPORT open without a GPU fails (%s)", upcie_errno_name(err));
	else
		CHECK(err == -EOPNOTSUPP && strstr(g_last, "ROCm 7.0"),
		      "IMPORT built against HIP %d.%d: -EOPNOTSUPP naming ROCm 7.0",
		      HIP_VERSION_MAJOR, HIP_VERSION_MINOR);
	{
		struct upcie_nvme_gqp_hip_host h;
		struct upcie_nvme_gqp_hip_cfg c;

		memset(&c, 0, sizeof(c));
		c.depth = 16;
		CHECK_EQ(upcie_nvme_gqp_hip_create(&h, &gpu, &c), -EINVAL,
			 "a GPU-issued queue on a closed provider: -EINVAL");
	}
	{
		struct upcie_nvme_cqmirror_hip_cq m;
		struct upcie_gpu_hip_polled pm;

		m.slot = 5;
		CHECK(upcie_nvme_cqmirror_hip_attach(&m, &gpu, 64) == -EINVAL && m.slot == -1 &&
			  !m.host_cq,
		      "a mirrored CQ on a closed provider: -EINVAL, the handle zeroed (slot -1)");
		CHECK(upcie_nvme_cqmirror_hip_stop(&m) == 0 &&
			  upcie_nvme_cqmirror_hip_detach(&m) == 0 &&
			  !upcie_nvme_cqmirror_hip_running(&gpu),
		      "stop and detach of a zeroed mirrored CQ: no-ops");
		CHECK(upcie_gpu_hip_polled_alloc(&gpu, 4096, 0, &pm) == -EINVAL && !pm.ptr,
		      "polled device memory on a closed provider: -EINVAL");
		upcie_gpu_hip_polled_free(&gpu, &pm);
	}
	/* The payload placement rule on the attributes the runtime would report */
	{
		hipPointerAttribute_t pa;
		static char buf[64];

		memset(&pa, 0, sizeof(pa));
		pa.memoryType = hipMemoryTypeHost;
		CHECK_EQ(upcie_gpu_hip_payload_verdict(&pa, buf, "payload"), -EXDEV,
			 "payload in host memory: -EXDEV (completion and data take two paths)");
		pa.memoryType = hipMemoryTypeDevice;
		pa.allocationFlags = 0;
		g_last[0] = 0;
		CHECK(upcie_gpu_hip_payload_verdict(&pa, buf, "payload") == -EOPNOTSUPP &&
			  strstr(g_last, "coarse-grained"),
		      "payload in coarse-grained VRAM (hipMalloc): -EOPNOTSUPP, says why");
		pa.allocationFlags = UPCIE_GPU_HIP_MALLOC_FINEGRAINED;
		CHECK_EQ(upcie_gpu_hip_payload_verdict(&pa, buf, "payload"), 0,
			 "payload in fine-grained VRAM: accepted");
		pa.allocationFlags = UPCIE_GPU_HIP_MALLOC_UNCACHED;
		CHECK_EQ(upcie_gpu_hip_payload_verdict(&pa, buf, "payload"), 0,
			 "payload in uncached VRAM: accepted");
		pa.isManaged = 1;
		CHECK_EQ(upcie_gpu_hip_payload_verdict(&pa, buf, "payload"), -EOPNOTSUPP,
			 "managed memory, whatever its flags: -EOPNOTSUPP");
		err = upcie_gpu_hip_payload_check(buf, "payload");
		CHECK(err < 0, "payload_check without a GPU (the runtime cannot say): refused (%d)",
		      err);
	}
	printf("1..%d\n", check_n_);
	return check_failed_ ? 1 : 0;
}
