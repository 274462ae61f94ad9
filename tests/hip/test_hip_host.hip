// SPDX-License-Identifier: BSD-3-Clause
/*
 * Host test of the HIP provider (gpu/dev_hip.h, gpu/heap_hip.h, gpuq/gqp_host_hip.h,
 * gpuq/cqmirror_host_hip.h) on a machine with the HIP runtime and no AMD GPU: what can be decided
 * without one. The whole-BO rule for exports (an export must cover the allocation and may exceed
 * it by one buffer object's rounding only), the LUT granule picked from a scatter list,
 * hipError_t to errno, what opening the provider answers without a GPU (-ENODEV with the HIP
 * error logged) and, for IMPORT translation, without ROCm 7.0 (-EOPNOTSUPP), and the queue and
 * mirror calls on a closed provider, the payload placement rule's verdict on the attributes the
 * runtime reports, and the GPU-issued queue's placement rules on top of it (direct: no host
 * memory; bridged: no VRAM; each unless the queue's flag vouches for the platform), with the
 * flags creation accepts; the device heap's memory flags (fine-grained or uncached: bad flags
 * -EINVAL before the runtime is asked, without a GPU the runtime's error, a later open that asks
 * for another kind than the heap's refused). Nothing here claims GPU behaviour.
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
	/* The device heap's memory (opts.device_heap_flags) */
	{
		static struct upcie_gpu_hip_proc proc;
		struct upcie_gpu_hip gpu2;
		unsigned mf = 77;

		CHECK(upcie_gpu_hip_heap_flags_check(0, &mf) == 0 && mf == 0,
		      "heap flags 0: coarse-grained, a plain hipMalloc (no allocation flags)");
		CHECK(upcie_gpu_hip_heap_flags_check(UPCIE_GPU_HIP_HEAP_FINEGRAINED, &mf) == 0 &&
			  mf == 1,
		      "UPCIE_GPU_HIP_HEAP_FINEGRAINED: hipDeviceMallocFinegrained (1)");
		CHECK(upcie_gpu_hip_heap_flags_check(UPCIE_GPU_HIP_HEAP_UNCACHED, &mf) == 0 &&
			  mf == 3,
		      "UPCIE_GPU_HIP_HEAP_UNCACHED: hipDeviceMallocUncached (3)");
		mf = 77;
		CHECK(upcie_gpu_hip_heap_flags_check(UPCIE_GPU_HIP_HEAP_FINEGRAINED |
							 UPCIE_GPU_HIP_HEAP_UNCACHED,
						     &mf) == -EINVAL &&
			  mf == 77,
		      "both heap kinds at once: -EINVAL, nothing returned");
		CHECK(upcie_gpu_hip_heap_flags_check(0x80u, &mf) == -EINVAL && mf == 77,
		      "an unknown heap flag: -EINVAL");

		memset(&o, 0, sizeof(o));
		o.xlate = UPCIE_GPU_HIP_XLATE_OFFSET;
		o.device_heap_flags = 0x80u;
		g_last[0] = 0;
		err = upcie_gpu_hip_open(&gpu2, &o);
		CHECK(
		    err == -EINVAL && !gpu2.p && strstr(g_last, "unknown device heap flags"),
		    "open with an unknown heap flag: -EINVAL before the runtime is asked (%s: %s)",
		    upcie_errno_name(err), g_last);
		o.device_heap_flags = UPCIE_GPU_HIP_HEAP_FINEGRAINED | UPCIE_GPU_HIP_HEAP_UNCACHED;
		err = upcie_gpu_hip_open(&gpu2, &o);
		CHECK(err == -EINVAL && !gpu2.p, "open with both heap kinds: -EINVAL (%s)",
		      upcie_errno_name(err));
		o.device_heap_flags = UPCIE_GPU_HIP_HEAP_FINEGRAINED;
		err = upcie_gpu_hip_open(&gpu2, &o);
		CHECK(err == -ENODEV && !gpu2.p,
		      "open of a fine-grained heap without a GPU: the runtime's error, -ENODEV, "
		      "never a pass (%s: %s)",
		      upcie_errno_name(err), g_last);
		o.device_heap_flags = UPCIE_GPU_HIP_HEAP_UNCACHED;
		err = upcie_gpu_hip_open(&gpu2, &o);
		CHECK(err == -ENODEV && !gpu2.p,
		      "open of an uncached heap without a GPU: -ENODEV (%s)",
		      upcie_errno_name(err));

		/* the heap's own allocation, asked of the runtime without a GPU */
		memset(&proc, 0, sizeof(proc));
		CHECK_EQ(upcie_registry_init(&proc.reg), 0, "a registry for the heap");
		g_last[0] = 0;
		err = upcie_gpu_hip_dheap_open_(&proc, UPCIE_GPU_HIP_HEAP_ALIGN,
						UPCIE_GPU_HIP_HEAP_FINEGRAINED);
		CHECK(err < 0 && !proc.dbase && !proc.have_dheap &&
			  strstr(g_last, "hipExtMallocWithFlags") && strstr(g_last, "fine-grained"),
		      "a fine-grained heap's allocation without a GPU: refused with the runtime's "
		      "error (%s: %s), nothing left",
		      upcie_errno_name(err), g_last);
		g_last[0] = 0;
		err = upcie_gpu_hip_dheap_open_(&proc, UPCIE_GPU_HIP_HEAP_ALIGN,
						UPCIE_GPU_HIP_HEAP_UNCACHED);
		CHECK(err < 0 && !proc.dbase && strstr(g_last, "hipExtMallocWithFlags") &&
			  strstr(g_last, "UPCIE_GPU_HIP_HEAP_FINEGRAINED"),
		      "an uncached heap's allocation without a GPU: refused with the runtime's "
		      "error, naming the fine-grained heap as the other choice (%s)",
		      upcie_errno_name(err));
		CHECK_EQ(upcie_gpu_hip_dheap_open_(&proc, UPCIE_GPU_HIP_HEAP_ALIGN, 0x40u), -EINVAL,
			 "the heap's allocation with an unknown flag: -EINVAL");
		upcie_registry_fini(&proc.reg);

		/* A later open meets the heap the first one made (the provider's state stood in:
		 * one reference, a fine-grained heap, GPU 0, OFFSET) */
		upcie_gpu_hip_proc_g.refs = 1;
		upcie_gpu_hip_proc_g.xlate = UPCIE_GPU_HIP_XLATE_OFFSET;
		upcie_gpu_hip_proc_g.dflags = UPCIE_GPU_HIP_HEAP_FINEGRAINED;
		o.device_heap_flags = UPCIE_GPU_HIP_HEAP_UNCACHED;
		g_last[0] = 0;
		err = upcie_gpu_hip_open(&gpu2, &o);
		CHECK(err == -EINVAL && !gpu2.p && upcie_gpu_hip_proc_g.refs == 1 &&
			  strstr(g_last, "first open"),
		      "a later open asking for an uncached heap where the first made a "
		      "fine-grained one: -EINVAL, no reference taken");
		o.device_heap_flags = UPCIE_GPU_HIP_HEAP_FINEGRAINED;
		err = upcie_gpu_hip_open(&gpu2, &o);
		CHECK(err == 0 && gpu2.p && upcie_gpu_hip_proc_g.refs == 2 &&
			  upcie_gpu_hip_heap_flags(&gpu2) == UPCIE_GPU_HIP_HEAP_FINEGRAINED,
		      "control: a later open asking for the heap's own kind takes a reference");
		o.device_heap_flags = 0;
		err = upcie_gpu_hip_open(&gpu2, &o);
		CHECK(err == 0 && upcie_gpu_hip_proc_g.refs == 3,
		      "a later open with heap flags 0 takes the heap as it is");
		memset(&upcie_gpu_hip_proc_g, 0, sizeof(upcie_gpu_hip_proc_g));
		gpu2.p = NULL;
	}
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
	/* The GPU-issued queue's placement rules (gpuq/gqp_host_hip.h) */
	{
		const unsigned D = UPCIE_NVME_GQP_HIP_DIRECT;
		hipPointerAttribute_t host, fine, coarse;
		static char buf[64];

		memset(&host, 0, sizeof(host));
		host.memoryType = hipMemoryTypeHost;
		memset(&fine, 0, sizeof(fine));
		fine.memoryType = hipMemoryTypeDevice;
		fine.allocationFlags = UPCIE_GPU_HIP_MALLOC_UNCACHED;
		coarse = fine;
		coarse.allocationFlags = 0;

		g_last[0] = 0;
		CHECK(upcie_nvme_gqp_hip_data_verdict(0, 3, &fine, buf) == -EXDEV &&
			  strstr(g_last, "bridged") && strstr(g_last, "direct queue"),
		      "bridged queue, payload in (uncached) VRAM: -EXDEV, naming the direct queue "
		      "to use instead");
		CHECK_EQ(
		    upcie_nvme_gqp_hip_data_verdict(UPCIE_NVME_GQP_HIP_VRAM_DATA, 3, &fine, buf), 0,
		    "control: bridged queue with UPCIE_NVME_GQP_HIP_VRAM_DATA takes it");
		CHECK_EQ(
		    upcie_nvme_gqp_hip_data_verdict(UPCIE_NVME_GQP_HIP_VRAM_DATA, 3, &coarse, buf),
		    -EOPNOTSUPP,
		    "bridged queue with UPCIE_NVME_GQP_HIP_VRAM_DATA, coarse-grained VRAM: still "
		    "-EOPNOTSUPP (the flag vouches for ordering, not for the L2)");
		CHECK_EQ(upcie_nvme_gqp_hip_data_verdict(0, 3, &host, buf), 0,
			 "bridged queue, payload in host memory: accepted (one destination with "
			 "the CQ)");
		g_last[0] = 0;
		CHECK(upcie_nvme_gqp_hip_data_verdict(D, 4, &host, buf) == -EXDEV &&
			  strstr(g_last, "UPCIE_NVME_GQP_HIP_HOST_DATA"),
		      "direct queue, payload in host memory: -EXDEV, naming the flag");
		CHECK_EQ(upcie_nvme_gqp_hip_data_verdict(D | UPCIE_NVME_GQP_HIP_HOST_DATA, 4, &host,
							 buf),
			 0, "control: direct queue with UPCIE_NVME_GQP_HIP_HOST_DATA takes it");
		CHECK_EQ(upcie_nvme_gqp_hip_data_verdict(D, 4, &fine, buf), 0,
			 "direct queue, uncached VRAM: accepted");
		CHECK_EQ(upcie_nvme_gqp_hip_data_verdict(D | UPCIE_NVME_GQP_HIP_HOST_DATA, 4,
							 &coarse, buf),
			 -EOPNOTSUPP,
			 "direct queue, coarse-grained VRAM: -EOPNOTSUPP whatever the flags");

		CHECK_EQ(upcie_nvme_gqp_hip_flags_check_(5, UPCIE_NVME_GQP_HIP_HOST_DATA), -EINVAL,
			 "creation: UPCIE_NVME_GQP_HIP_HOST_DATA on a bridged queue: -EINVAL");
		CHECK_EQ(upcie_nvme_gqp_hip_flags_check_(5, D | UPCIE_NVME_GQP_HIP_VRAM_DATA),
			 -EINVAL,
			 "creation: UPCIE_NVME_GQP_HIP_VRAM_DATA on a direct queue: -EINVAL");
		CHECK_EQ(upcie_nvme_gqp_hip_flags_check_(5, 0x8000u), -EINVAL,
			 "creation: an unknown flag: -EINVAL");
		g_last[0] = 0;
		CHECK(
		    upcie_nvme_gqp_hip_flags_check_(5, D | UPCIE_NVME_GQP_HIP_HOST_DATA) == 0 &&
			strstr(g_last, "caller's word"),
		    "creation: direct with UPCIE_NVME_GQP_HIP_HOST_DATA accepted, with a warning");
		g_last[0] = 0;
		CHECK(
		    upcie_nvme_gqp_hip_flags_check_(5, UPCIE_NVME_GQP_HIP_VRAM_DATA) == 0 &&
			strstr(g_last, "caller's word"),
		    "creation: bridged with UPCIE_NVME_GQP_HIP_VRAM_DATA accepted, with a warning");
		CHECK(upcie_nvme_gqp_hip_flags_check_(5, 0) == 0 &&
			  upcie_nvme_gqp_hip_flags_check_(5, D) == 0,
		      "creation: bridged and direct without payload flags accepted");
	}
	/* The queue's payload check without a GPU: the runtime cannot describe memory */
	{
		struct upcie_nvme_gqp_hip_host h;
		static struct upcie_gpu_hip_proc proc;
		static char buf[8192];
		uint64_t iova = 1;

		memset(&h, 0, sizeof(h));
		CHECK_EQ(upcie_nvme_gqp_hip_data_check(&h, buf, sizeof(buf)), -EINVAL,
			 "payload check on a zeroed (closed) queue: -EINVAL");
		h.gpu.p = &proc; /* only the flags and qid are read before the runtime is asked */
		h.flags = UPCIE_NVME_GQP_HIP_DIRECT | UPCIE_NVME_GQP_HIP_HOST_DATA;
		CHECK_EQ(upcie_nvme_gqp_hip_data_check(&h, buf, 0), -EINVAL,
			 "payload check of an empty range: -EINVAL");
		err = upcie_nvme_gqp_hip_data_check(&h, buf, sizeof(buf));
		CHECK(err < 0,
		      "payload check without a GPU, even with the opt-out flag: refused "
		      "(%d), never taken on trust",
		      err);
		err = upcie_nvme_gqp_hip_data_iova(&h, buf, sizeof(buf), &iova);
		CHECK(err < 0 && iova == 1,
		      "payload translation without a GPU: refused before any translation (%d)",
		      err);
	}
	printf("1..%d\n", check_n_);
	return check_failed_ ? 1 : 0;
}
