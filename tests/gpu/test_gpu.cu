/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * GPU tests on a real CUDA driver (the lent H200): the provider (context choice, BAR1 check,
 * heaps, dma-buf export of whole allocations and of sub-ranges, base recovery from interior
 * pointers, the registry), GPU-resident queue pairs against the GPU null controller (wrap-around
 * and phase, out-of-order completions, error status, dropped completions and timeouts, delays, SQ
 * in device and in host memory, 1 to 64 queues, a queue shared by warps, data verified end to
 * end), and the completion mirror (CPU-driven queues whose CQ the controller writes in GPU memory;
 * attach/detach while the warp runs, many times; exclusion with GPU-issued queues).
 *
 * The dma-buf import module is not on the H200: where it is absent the import path is checked to
 * fail naming its package, and everything else runs with the tests' own address scheme
 * (UPCIE_GPU_CUDA_XLATE_OFFSET). TAP output, "N passed, N failed" last. CI only compiles this.
 */
#include <upcie/gpu/dev_cuda.h>
#include <upcie/gpu/heap_cuda.h>
#include <upcie/nvme/cmd.h>
#include <upcie/nvme/cqmirror_host_cuda.h>
#include <upcie/nvme/gqp_cuda.h>
#include <upcie/nvme/gqp_host_cuda.h>
#include <upcie/nvme/qpair.h>

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../unit/check.h"
#include "rig.cuh"

#define MiB (UINT64_C(1) << 20)

static int nskip_;
#define SKIP(...)                                                                                  \
	do {                                                                                       \
		CHECK_SKIP(__VA_ARGS__);                                                           \
		nskip_++;                                                                          \
	} while (0)

/* ---- log capture: the last error message, to check that it names what it should ---- */
static char last_err[512];

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)ctx;
	if (level == UPCIE_LOG_ERROR)
		snprintf(last_err, sizeof(last_err), "%s", msg);
	fprintf(stderr, "upcie: %s\n", msg);
}

/* ---- device side ---- */

struct tres {
	unsigned long long ok, bad, busy, einval, timeouts, late, mism;
	unsigned long long t_ns, t2_ns;
	int ret[32];
	uint32_t code[32];
	uint32_t inflight_after, reclaimed;
};

__device__ static inline uint64_t now_ns(void)
{
	return upcie_nvme_port_time_ns();
}

/*
 * Every lane keeps at most one command outstanding; the warp issues `total` flushes tagged
 * (warp << 24 | seq) and checks every completion's tag and status. `lock`: the queue is shared
 * and each iteration holds its lock.
 */
__global__ void traffic_kernel(struct upcie_nvme_gqp **qs, int qdiv, uint32_t total, bool lock,
			       struct tres *res)
{
	uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x & 31;
	struct upcie_nvme_gqp *q = qs[warp / qdiv];
	struct upcie_nvme_gqp_warp w;
	struct tres *t = &res[warp];
	uint16_t cid = UPCIE_NVME_GQP_CID_NONE;
	uint32_t issued = 0, done = 0, mytag = 0;
	unsigned long long ok = 0, bad = 0, busy = 0;
	uint64_t t0 = now_ns();

	if (!lock)
		upcie_nvme_gqp_begin(&w, q, false);
	while (done < total) {
		struct upcie_nvme_sqe sqe;
		struct upcie_nvme_cqe cqe;
		uint16_t nc = 0;
		bool want = cid == UPCIE_NVME_GQP_CID_NONE;
		uint32_t wm = __ballot_sync(0xffffffffu, want);
		uint32_t rank = __popc(wm & ((1u << lane) - 1));
		int r;

		want = want && issued + rank < total;
		if (lock)
			upcie_nvme_gqp_begin(&w, q, true);
		upcie_nvme_cmd_flush(&sqe, 1);
		sqe.cdw2 = (warp << 24) | (issued + rank);
		r = upcie_nvme_gqp_enqueue(&w, want ? &sqe : NULL, &nc);
		if (want && r == 0) {
			cid = nc;
			mytag = sqe.cdw2;
		}
		busy += want && r == -EBUSY;
		/* Issued in rank order: the granted ones are a prefix of the wanting lanes. */
		issued += __popc(__ballot_sync(0xffffffffu, want && r == 0));
		upcie_nvme_gqp_ring(&w);
		upcie_nvme_gqp_reap(&w);
		r = upcie_nvme_gqp_complete(&w, cid, &cqe);
		if (r == 1) {
			if (cqe.dw0 == mytag && upcie_nvme_cqe_ok(&cqe))
				ok++;
			else
				bad++;
			cid = UPCIE_NVME_GQP_CID_NONE;
		} else if (r < 0) {
			bad++;
			cid = UPCIE_NVME_GQP_CID_NONE;
		}
		done += __popc(__ballot_sync(0xffffffffu, r != 0));
		if (lock)
			upcie_nvme_gqp_end(&w);
		if (__shfl_sync(0xffffffffu, now_ns() - t0 > 5 * UPCIE_NSEC_PER_SEC, 0)) {
			bad += 1000000;
			break;
		}
	}
	if (!lock)
		upcie_nvme_gqp_end(&w);
	for (int o = 16; o; o >>= 1) {
		ok += __shfl_down_sync(0xffffffffu, ok, o);
		bad += __shfl_down_sync(0xffffffffu, bad, o);
		busy += __shfl_down_sync(0xffffffffu, busy, o);
	}
	if (lane == 0) {
		t->ok = ok;
		t->bad = bad;
		t->busy = busy;
		t->t_ns = now_ns() - t0;
	}
}

/* Error status, dropped completion (timeout, cancel, late-free), delay. One warp. */
__global__ void faults_kernel(struct upcie_nvme_gqp *q, uint64_t delay_ns, struct tres *t)
{
	uint32_t lane = threadIdx.x & 31;
	struct upcie_nvme_gqp_warp w;
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_cqe cqe;
	uint16_t cid = UPCIE_NVME_GQP_CID_NONE;
	uint64_t t0;
	int r;

	upcie_nvme_gqp_begin(&w, q, false);
	/* 1: statuses. Lanes 0 mod 4: LBA out of range; 1 mod 4: unrecovered read error. */
	upcie_nvme_cmd_flush(&sqe, 1);
	sqe.cdw2 = lane;
	if (lane % 4 == 0)
		sqe.cdw3 = NULLCTL_TAG_ERROR | ((uint32_t)UPCIE_NVME_SC_LBA_RANGE << 16);
	else if (lane % 4 == 1)
		sqe.cdw3 = NULLCTL_TAG_ERROR | ((uint32_t)UPCIE_NVME_SC_UNRECOVERED_READ << 16);
	r = upcie_nvme_gqp_enqueue(&w, &sqe, &cid);
	upcie_nvme_gqp_ring(&w);
	r = r ? r : upcie_nvme_gqp_wait(&w, cid, 100 * UPCIE_NSEC_PER_MSEC, &cqe);
	t->ret[lane] = r;
	t->code[lane] = r ? 0xffff : upcie_nvme_cqe_code(&cqe) | (cqe.dw0 == lane ? 0 : 0x8000);

	/* 2: lane 0's completion is dropped: wait times out for it alone, after 2 ms. */
	upcie_nvme_cmd_flush(&sqe, 1);
	sqe.cdw2 = 100 + lane;
	sqe.cdw3 = lane == 0 ? NULLCTL_TAG_DROP : 0;
	r = upcie_nvme_gqp_enqueue(&w, &sqe, &cid);
	upcie_nvme_gqp_ring(&w);
	t0 = now_ns();
	r = r ? r : upcie_nvme_gqp_wait(&w, cid, 2 * UPCIE_NSEC_PER_MSEC, &cqe);
	{
		unsigned tm = __ballot_sync(0xffffffffu, r == -ETIMEDOUT);
		unsigned okm = __ballot_sync(0xffffffffu, r == 0 && cqe.dw0 == 100 + lane);

		if (lane == 0) {
			t->timeouts = __popc(tm);
			t->ok = __popc(okm);
			t->bad = (tm != 1u) + (okm != 0xfffffffeu);
			t->t_ns = now_ns() - t0;
		}
	}
	/* Cancel it: the CID stays reserved; complete() on it is then -EINVAL. */
	r = upcie_nvme_gqp_cancel(&w, lane == 0 ? cid : (uint16_t)UPCIE_NVME_GQP_CID_NONE);
	if (lane == 0)
		t->einval = (r == 0) + 2 * (upcie_nvme_gqp_inflight(&w) == 1);
	r = upcie_nvme_gqp_complete(&w, lane == 0 ? cid : (uint16_t)UPCIE_NVME_GQP_CID_NONE, &cqe);
	if (lane == 0)
		t->einval += 4 * (r == -EINVAL);

	/* 3: the queue keeps working: 64 more commands, and one delayed batch. */
	for (int i = 0; i < 2; i++) {
		upcie_nvme_cmd_flush(&sqe, 1);
		sqe.cdw2 = 200 + 32 * i + lane;
		sqe.cdw3 = (i == 1 && lane == 7) ? NULLCTL_TAG_DELAY : 0;
		r = upcie_nvme_gqp_enqueue(&w, &sqe, &cid);
		upcie_nvme_gqp_ring(&w);
		t0 = now_ns();
		r = r ? r : upcie_nvme_gqp_wait(&w, cid, 100 * UPCIE_NSEC_PER_MSEC, &cqe);
		if (__popc(__ballot_sync(0xffffffffu, r == 0 && cqe.dw0 == 200 + 32 * i + lane)) ==
		    32) {
			if (lane == 0)
				t->late++;
		}
		if (i == 1 && lane == 0)
			t->t2_ns = now_ns() - t0;
	}
	/* 4: the queue was "deleted": reclaim frees the cancelled CID. */
	r = (int)upcie_nvme_gqp_reclaim(&w);
	if (lane == 0) {
		t->reclaimed = (uint32_t)r;
		t->inflight_after = upcie_nvme_gqp_inflight(&w);
	}
	upcie_nvme_gqp_end(&w);
	(void)delay_ns;
}

/*
 * Data end to end: warp q writes a pattern from its source buffer to its namespace region, reads
 * it back into its destination buffer, and compares. Lane l moves sizes[l % 5] bytes at a
 * dword-aligned offset off[l % 5] of its 64 KiB + 4 KiB slice.
 */
#define SLICE (UINT64_C(68) * 1024)
__device__ static const uint32_t dsz[5] = { 512, 4096, 8192, 65536, 12288 };
__device__ static const uint32_t doff[5] = { 4, 0, 512, 0, 2048 };

__device__ static inline uint8_t pat(uint32_t q, uint32_t lane, uint32_t i)
{
	return (uint8_t)(i * 7 + lane * 13 + q * 31 + (i >> 9));
}

__global__ void data_kernel(struct upcie_nvme_gqp **qs, struct upcie_gpu_xlate x, uint8_t *src,
			    uint8_t *dst, uint64_t ns_per_q, struct tres *res)
{
	uint32_t q = blockIdx.x, lane = threadIdx.x & 31;
	uint8_t *s = src + (uint64_t)q * 32 * SLICE + lane * SLICE + doff[lane % 5];
	uint8_t *d = dst + (uint64_t)q * 32 * SLICE + lane * SLICE + doff[lane % 5];
	uint32_t len = dsz[lane % 5];
	uint64_t slba = (q * ns_per_q + (uint64_t)lane * SLICE) >> 9;
	struct upcie_nvme_gqp_warp w;
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_cqe cqe;
	uint16_t cid = UPCIE_NVME_GQP_CID_NONE;
	unsigned long long mism = 0;
	int r;

	for (uint32_t i = 0; i < len; i++) {
		s[i] = pat(q, lane, i);
		d[i] = 0xee;
	}
	__threadfence();
	upcie_nvme_gqp_begin(&w, qs[q], false);
	upcie_nvme_cmd_write(&sqe, 1, slba, len >> 9, 0);
	r = upcie_nvme_gqp_enqueue_data(&w, &sqe, &x, s, len, &cid);
	upcie_nvme_gqp_ring(&w);
	r = r ? r : upcie_nvme_gqp_wait(&w, cid, 500 * UPCIE_NSEC_PER_MSEC, &cqe);
	res[q].ret[lane] = r;
	res[q].code[lane] = r ? 0xffff : upcie_nvme_cqe_code(&cqe);
	upcie_nvme_cmd_read(&sqe, 1, slba, len >> 9, 0);
	r = upcie_nvme_gqp_enqueue_data(&w, &sqe, &x, d, len, &cid);
	upcie_nvme_gqp_ring(&w);
	r = r ? r : upcie_nvme_gqp_wait(&w, cid, 500 * UPCIE_NSEC_PER_MSEC, &cqe);
	if (r || !upcie_nvme_cqe_ok(&cqe))
		res[q].code[lane] |= 0x10000;
	/* What the controller wrote into d must be visible here (it fenced before the CQE). */
	__threadfence();
	for (uint32_t i = 0; i < len; i++)
		mism += ((volatile uint8_t *)d)[i] != pat(q, lane, i);
	/* A buffer outside the translation is refused without taking a slot. */
	upcie_nvme_cmd_read(&sqe, 1, slba, 1, 0);
	r = upcie_nvme_gqp_enqueue_data(&w, lane == 3 ? &sqe : NULL, &x, (void *)(uintptr_t)16, 512,
					&cid);
	if (lane == 3)
		res[q].einval = r == -EINVAL;
	upcie_nvme_gqp_end(&w);
	for (int o = 16; o; o >>= 1)
		mism += __shfl_down_sync(0xffffffffu, mism, o);
	if (lane == 0)
		res[q].mism = mism;
}

/* ---- host side ---- */

static struct tres *tres_alloc(int n)
{
	return (struct tres *)rig_pinned(n * sizeof(struct tres));
}

static bool is_dmabuf_fd(int fd)
{
	char path[64], target[256];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, target, sizeof(target) - 1);
	if (n <= 0)
		return false;
	target[n] = 0;
	return strstr(target, "dmabuf") != NULL;
}

static void test_import_path(void)
{
	struct upcie_gpu_cuda gpu;
	struct upcie_gpu_cuda_opts o;
	int err;

	memset(&o, 0, sizeof(o));
	o.device_heap_size = 64 * MiB;
	o.host_heap_size = 8 * MiB;
	last_err[0] = 0;
	err = upcie_gpu_cuda_open(&gpu, &o);
	if (access("/dev/dmabuf_import", F_OK) != 0) {
		CHECK(err == -ENOENT && strstr(last_err, "dmabuf-import-dkms"),
		      "import path without /dev/dmabuf_import: -ENOENT naming the package (got %d: "
		      "\"%s\")",
		      err, last_err);
	} else {
		CHECK(err == 0, "import path with the module present: open %d", err);
		upcie_gpu_cuda_close(&gpu);
	}
	CHECK(gpu.p == NULL, "failed open leaves the handle zeroed");
}

static void test_context(void)
{
	struct upcie_gpu_cuda gpu, gpu2;
	struct upcie_gpu_cuda_opts o;
	CUcontext cur = NULL, prim = NULL, mine = NULL, popped;
	CUdevice dev;
	int err;

	memset(&o, 0, sizeof(o));
	o.xlate = UPCIE_GPU_CUDA_XLATE_OFFSET;
	o.iova_offset = RIG_IOVA_OFFSET;
	o.device_heap_size = 64 * MiB + 1;
	o.host_heap_size = 8 * MiB;

	cuInit(0);
	cuDeviceGet(&dev, 0);
	o.gpu_id = 99;
	err = upcie_gpu_cuda_open(&gpu, &o);
	CHECK(err == -ENODEV, "GPU 99: -ENODEV (got %d)", err);
	o.gpu_id = 0;

	/* No current context: the primary context, retained and made current. */
	cuCtxGetCurrent(&cur);
	CHECK(cur == NULL, "no context current before the first open");
	err = upcie_gpu_cuda_open(&gpu, &o);
	CHECK(err == 0, "open (offset translation) %d", err);
	if (err)
		return;
	cuCtxGetCurrent(&cur);
	cuDevicePrimaryCtxRetain(&prim, dev);
	CHECK(cur == prim && gpu.p->dev.ctx == prim && gpu.p->dev.primary,
	      "no current context: heap in the primary context, now current");
	cuDevicePrimaryCtxRelease(dev);
	printf("# GPU %s: VRAM %" PRIu64 " MiB, BAR1 %" PRIu64 " MiB (sysfs resource, index %d)\n",
	       gpu.p->dev.pci_name, gpu.p->dev.vram >> 20, gpu.p->dev.bar1 >> 20,
	       gpu.p->dev.bar1_index);
	CHECK(gpu.p->dev.bar1 >= gpu.p->dev.vram,
	      "BAR1 covers VRAM (%" PRIu64 " >= %" PRIu64 " MiB)", gpu.p->dev.bar1 >> 20,
	      gpu.p->dev.vram >> 20);
	CHECK(gpu.p->dsize == 64 * MiB + 64 * 1024,
	      "device heap rounded up to 64 KiB (%" PRIu64 ")", gpu.p->dsize);
	{
		CUcontext hctx = NULL;
		CUresult r =
		    cuPointerGetAttribute(&hctx, CU_POINTER_ATTRIBUTE_CONTEXT, gpu.p->dbase);

		CHECK(r == CUDA_SUCCESS && hctx == prim, "device heap allocated in that context");
	}
	o.gpu_id = 1;
	err = upcie_gpu_cuda_open(&gpu2, &o);
	CHECK(err == -EINVAL, "a later open naming another GPU: -EINVAL (%d)", err);
	o.gpu_id = 0;
	o.device_heap_size = 8 * MiB;
	err = upcie_gpu_cuda_open(&gpu2, &o);
	CHECK(err == 0 && gpu2.p == gpu.p && gpu.p->refs == 2 && gpu.p->dsize == 64 * MiB + 65536,
	      "a later open takes a reference; the first open's sizes stay");
	upcie_gpu_cuda_close(&gpu2);
	upcie_gpu_cuda_close(&gpu);
	upcie_gpu_cuda_close(&gpu); /* zeroed: no-op */
	CHECK(upcie_gpu_cuda_proc_g.refs == 0 && upcie_gpu_cuda_proc_g.dbase == 0,
	      "the last close frees the heaps");

	/* A current context of our own: the heap goes there and it stays current. */
	popped = NULL;
	cuCtxPopCurrent(&popped);
	{
		CUctxCreateParams cp;

		memset(&cp, 0, sizeof(cp));
		err = cuCtxCreate(&mine, &cp, 0, dev) == CUDA_SUCCESS ? 0 : -1;
	}
	if (!err) {
		err = upcie_gpu_cuda_open(&gpu, &o);
		cuCtxGetCurrent(&cur);
		CHECK(err == 0 && gpu.p->dev.ctx == mine && !gpu.p->dev.primary && cur == mine,
		      "a current context of the right GPU: the heap goes into it");
		if (!err) {
			CUcontext hctx = NULL;

			cuPointerGetAttribute(&hctx, CU_POINTER_ATTRIBUTE_CONTEXT, gpu.p->dbase);
			CHECK(hctx == mine, "device heap allocated in the caller's context");
			upcie_gpu_cuda_close(&gpu);
		}
		cuCtxDestroy(mine);
	} else {
		SKIP("cuCtxCreate failed: caller-context case not run");
	}
	SKIP("a current context of another GPU (-EINVAL): one GPU on this machine");
	cuCtxSetCurrent(NULL);
}

/* Raw driver behaviour of exports, then the provider's export, registration and lookups. */
static void test_export_registry(struct upcie_gpu_cuda *gpu)
{
	CUdeviceptr a = 0, small = 0, b;
	uint64_t sz;
	size_t n0, asz;
	int fd = -1, err;
	CUresult r;
	struct upcie_registry_hit hit;
	uint64_t iova;

	RIG_CK(cudaMalloc((void **)&a, 8 * MiB));
	/* Whole allocation, with the PCIe mapping flag the provider asks for. */
	r = cuMemGetHandleForAddressRange(&fd, a, 8 * MiB, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
					  CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE);
	printf("# driver: export with CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE: %s\n",
	       upcie_gpu_cuda_strerror(r));
	if (r == CUDA_SUCCESS)
		close(fd);
	err = upcie_gpu_cuda_export(a, 8 * MiB, &fd);
	CHECK(err == 0 && fd >= 0 && is_dmabuf_fd(fd), "export of a whole 8 MiB allocation: a "
						       "dma-buf fd");
	if (!err)
		close(fd);
	err = upcie_gpu_cuda_export(a + 65536, 65536, &fd);
	CHECK(err == 0 && is_dmabuf_fd(fd), "export of a 64 KiB sub-range at offset 64 KiB");
	if (!err)
		close(fd);
	err = upcie_gpu_cuda_export(a + 3 * MiB, 2 * MiB, &fd);
	CHECK(err == 0, "export of a 2 MiB sub-range at offset 3 MiB");
	if (!err)
		close(fd);
	r = cuMemGetHandleForAddressRange(&fd, a + 4096, 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
					  0);
	printf("# driver: export of 4 KiB at offset 4 KiB (host-page aligned, inside a 64 KiB "
	       "page): %s\n",
	       upcie_gpu_cuda_strerror(r));
	if (r == CUDA_SUCCESS)
		close(fd);
	err = upcie_gpu_cuda_export(a + 4096, 65536, &fd);
	CHECK(err == -EINVAL, "provider refuses an export not on 64 KiB pages (%d)", err);
	r = cuMemGetHandleForAddressRange(&fd, a, 8 * MiB + 65536,
					  CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	printf("# driver: export reaching 64 KiB past the allocation: %s\n",
	       upcie_gpu_cuda_strerror(r));
	if (r == CUDA_SUCCESS)
		close(fd);
	err = upcie_gpu_cuda_export(a, 8 * MiB + 65536, &fd);
	CHECK(err < 0 || (close(fd), true), "export past the allocation: %d (%s)", err,
	      err ? "refused" : "the driver accepts it");

	/* Base recovery and registration. */
	n0 = upcie_registry_count(upcie_gpu_cuda_registry(gpu));
	err = upcie_gpu_cuda_range(gpu, (void *)(a + 3 * MiB + 123), &b, &sz);
	CHECK(err == 0 && b == a && sz == 8 * MiB,
	      "base and size recovered from an interior pointer");
	err = upcie_gpu_cuda_buf_register(gpu, (void *)(a + MiB + 123), 4096);
	CHECK(err == 0 && upcie_registry_count(upcie_gpu_cuda_registry(gpu)) == n0 + 1,
	      "register by an interior pointer: one new range (%d)", err);
	err = upcie_registry_lookup(upcie_gpu_cuda_registry(gpu), (void *)(a + 5 * MiB + 7), &hit);
	CHECK(err == 0 && hit.base == (void *)a && hit.size == 8 * MiB && hit.off == 5 * MiB + 7,
	      "lookup of another interior pointer: the whole allocation, offset 5 MiB + 7");
	err = upcie_gpu_cuda_iova(gpu, (void *)(a + 5 * MiB + 7), &iova);
	CHECK(err == 0 && iova == a + 5 * MiB + 7 + RIG_IOVA_OFFSET, "device address by the "
								     "offset scheme");
	err = upcie_gpu_cuda_buf_register(gpu, (void *)(a + 7 * MiB), 0);
	CHECK(err == 0 && upcie_registry_count(upcie_gpu_cuda_registry(gpu)) == n0 + 1,
	      "registering again is a reference, not a new range");
	err = upcie_gpu_cuda_buf_register(gpu, (void *)(a + 7 * MiB), 2 * MiB);
	CHECK(err == -EINVAL, "a size reaching past the allocation: -EINVAL (%d)", err);
	err = upcie_gpu_cuda_buf_unregister(gpu, (void *)(a + 2));
	CHECK(err == 0 && upcie_registry_count(upcie_gpu_cuda_registry(gpu)) == n0 + 1,
	      "first unregister drops a reference");
	err = upcie_gpu_cuda_buf_unregister(gpu, (void *)(a + 8 * MiB - 1));
	CHECK(err == 0 && upcie_registry_count(upcie_gpu_cuda_registry(gpu)) == n0,
	      "last unregister removes the range");
	err = upcie_gpu_cuda_buf_unregister(gpu, (void *)a);
	CHECK(err == -ENOENT, "unregister of an unregistered range: -ENOENT (%d)", err);
	{
		char host[64];

		err = upcie_gpu_cuda_buf_register(gpu, host, sizeof(host));
		CHECK(err == -EINVAL, "host memory is refused: -EINVAL (%d)", err);
	}
	/* A heap pointer shares the heap's registration. */
	{
		struct upcie_heap_buf hb;

		err = upcie_gpu_cuda_alloc(gpu, 65536, 4096, &hb);
		CHECK(err == 0, "device heap alloc");
		err = upcie_gpu_cuda_buf_register(gpu, hb.vaddr, 4096);
		CHECK(err == 0 && upcie_registry_count(upcie_gpu_cuda_registry(gpu)) == n0,
		      "registering heap memory takes a reference on the heap's range");
		err = upcie_gpu_cuda_buf_unregister(gpu, hb.vaddr);
		CHECK(err == 0, "and drops it");
		err = upcie_gpu_cuda_buf_unregister(gpu, hb.vaddr);
		CHECK(err == -EBUSY, "the heap's own reference is not the caller's (-EBUSY: %d)",
		      err);
		CHECK(hb.iova == (uint64_t)(uintptr_t)hb.vaddr + RIG_IOVA_OFFSET &&
			  upcie_gpu_cuda_free(gpu, &hb) == 0,
		      "heap buffer's device address; free");
	}
	/* A small allocation: where it sits decides whether it can be registered. */
	RIG_CK(cudaMalloc((void **)&small, 100000));
	cuMemGetAddressRange(&b, &asz, small);
	printf("# driver: cudaMalloc(100000) at 0x%llx: %s 64 KiB aligned, range %zu bytes\n",
	       (unsigned long long)small, (small & 65535) ? "not" : "", asz);
	err = upcie_gpu_cuda_buf_register(gpu, (void *)small, 100000);
	printf("# registering it: %d (%s)\n", err, err ? upcie_errno_name(err) : "ok");
	if (!err) {
		err = upcie_gpu_cuda_iova(gpu, (void *)(small + 99999), &iova);
		CHECK(err == 0 && iova == small + 99999 + RIG_IOVA_OFFSET,
		      "small allocation registered as whole 64 KiB pages");
		upcie_gpu_cuda_buf_unregister(gpu, (void *)small);
	} else {
		CHECK(err < 0, "small allocation refused with an error, never a wrong address");
	}
	/* Translation for GPU code. */
	{
		struct upcie_gpu_xlate x;
		struct upcie_heap_buf hb;

		upcie_gpu_cuda_alloc(gpu, 4096, 4096, &hb);
		err = upcie_gpu_cuda_xlate_create(gpu, hb.vaddr, &x);
		CHECK(err == 0 && upcie_gpu_xlate_iova(&x, hb.vaddr) == hb.iova &&
			  x.base == (uint64_t)gpu->p->dbase,
		      "GPU translation of the device heap");
		upcie_gpu_cuda_xlate_destroy(gpu, &x);
		upcie_gpu_cuda_free(gpu, &hb);
		upcie_gpu_cuda_host_alloc(gpu, 4096, 4096, &hb);
		err = upcie_gpu_cuda_xlate_create(gpu, hb.vaddr, &x);
		CHECK(err == 0 && upcie_gpu_xlate_iova(&x, (void *)upcie_gpu_cuda_host_devptr(
							       gpu, hb.vaddr)) == hb.iova,
		      "GPU translation of the host heap");
		upcie_gpu_cuda_xlate_destroy(gpu, &x);
		upcie_gpu_cuda_host_free(gpu, &hb);
	}
	/* Registers for the GPU: CUDA refuses plain memory as I/O memory. */
	{
		void *pg = aligned_alloc(4096, 4096);
		CUdeviceptr d = 0;

		last_err[0] = 0;
		err = upcie_gpu_cuda_iomem_map(gpu, (volatile void *)pg, 4, &d);
		CHECK(
		    err < 0 && strstr(last_err, "CUDA_ERROR"),
		    "IOMEMORY registration of ordinary memory fails with -errno, CUDA name logged "
		    "(%d: %s)",
		    err, last_err);
		if (!err)
			upcie_gpu_cuda_iomem_unmap(gpu, (volatile void *)pg);
		free(pg);
		SKIP("IOMEMORY mapping of an NVMe BAR0: no NVMe on this machine");
	}
	cudaFree((void *)small);
	cudaFree((void *)a);
}

static unsigned long long sum_ok(struct tres *t, int n, unsigned long long *bad,
				 unsigned long long *busy)
{
	unsigned long long ok = 0;

	*bad = 0;
	*busy = 0;
	for (int i = 0; i < n; i++) {
		ok += t[i].ok;
		*bad += t[i].bad;
		*busy += t[i].busy;
	}
	return ok;
}

static void test_queues(struct rig *r)
{
	struct tres *t = tres_alloc(NULLCTL_MAX_Q);
	unsigned long long ok, bad, busy;
	struct upcie_nvme_gqp st;
	int err;

	/* Wrap-around and phase: depth 8, 20000 commands through one warp. */
	err = rig_queues_create(r, 1, 8, 0);
	CHECK(err == 0, "queue pair of depth 8 created (%d)", err);
	if (err)
		return;
	rig_ctl_start(r, 0, 0);
	traffic_kernel<<<1, 32, 0, r->s_run>>>(r->dqs, 1, 20000, false, t);
	rig_sync(r->s_run, "kernel");
	rig_ctl_stop(r);
	ok = sum_ok(t, 1, &bad, &busy);
	upcie_nvme_gqp_read(&r->gq[0], &st);
	CHECK(ok == 20000 && bad == 0 && st.nbad == 0 && r->c.q[0].ncpl == 20000,
	      "depth 8: 20000 commands, %llu ok, %llu bad, %llu -EBUSY; %u laps of the CQ", ok, bad,
	      busy, 20000 / 8);
	CHECK(st.cq_head == 20000 % 8 && st.phase == ((20000 / 8) % 2 ? 0u : 1u) &&
		  st.nfree == st.ncids,
	      "ring state after: CQ head %u, phase %u, all %u CIDs free", st.cq_head, st.phase,
	      st.nfree);
	rig_queues_destroy(r);

	/*
	 * SQ in host memory, entries written by the warp together (UPCIE_NVME_GQP_SQ_COOP_STORES,
	 * eight per store instruction) from lanes that want in any pattern and with grants cut
	 * short by the room; depth 13 wraps inside a group of eight. Every completion's dw0 must
	 * echo the tag its own lane put in CDW2, so an entry assembled from the wrong lane or
	 * quarter fails. Then per-lane stores (the default), and four warps sharing one queue.
	 */
	{
		static const struct {
			uint32_t depth;
			unsigned flags;
			int warps;
		} hc[] = { { 8, UPCIE_NVME_GQP_SQ_COOP_STORES, 1 },
			   { 13, UPCIE_NVME_GQP_SQ_COOP_STORES, 1 },
			   { 13, 0, 1 },
			   { 256, UPCIE_NVME_GQP_SQ_COOP_STORES, 4 } };

		for (unsigned i = 0; i < sizeof(hc) / sizeof(hc[0]); i++) {
			uint32_t total = hc[i].warps > 1 ? 3000 : 20000;

			memset(t, 0, 4 * sizeof(*t));
			err = rig_queues_create(r, 1, hc[i].depth,
						UPCIE_NVME_GQP_SQ_HOSTMEM | hc[i].flags);
			if (!err) {
				rig_ctl_start(r, 0, 0);
				traffic_kernel<<<hc[i].warps, 32, 0, r->s_run>>>(
				    r->dqs, hc[i].warps, total, hc[i].warps > 1, t);
				rig_sync(r->s_run, "kernel");
				rig_ctl_stop(r);
				upcie_nvme_gqp_read(&r->gq[0], &st);
			}
			ok = sum_ok(t, hc[i].warps, &bad, &busy);
			CHECK(err == 0 && ok == total * hc[i].warps && bad == 0 && st.nbad == 0 &&
				  st.nfree == st.ncids,
			      "SQ in host memory, %s stores, depth %u, %d warp(s): %llu ok, %llu "
			      "bad, %llu -EBUSY",
			      hc[i].flags ? "warp-cooperative" : "per-lane", hc[i].depth,
			      hc[i].warps, ok, bad, busy);
			if (!err)
				rig_queues_destroy(r);
		}
	}

	/* Out of order: the controller posts each batch reversed. */
	memset(t, 0, sizeof(*t));
	err = rig_queues_create(r, 1, 64, 0);
	rig_ctl_start(r, 1, 0);
	traffic_kernel<<<1, 32, 0, r->s_run>>>(r->dqs, 1, 50000, false, t);
	rig_sync(r->s_run, "kernel");
	rig_ctl_stop(r);
	ok = sum_ok(t, 1, &bad, &busy);
	CHECK(err == 0 && ok == 50000 && bad == 0,
	      "out-of-order completions matched by CID: %llu ok, %llu bad (%llu batches)", ok, bad,
	      r->c.q[0].nbatch);
	rig_queues_destroy(r);

	/* Errors, dropped completion, timeout, cancel, delay, reclaim. */
	memset(t, 0, sizeof(*t));
	err = rig_queues_create(r, 1, 256, 0);
	rig_ctl_start(r, 0, 200 * UPCIE_NSEC_PER_USEC);
	faults_kernel<<<1, 32, 0, r->s_run>>>(r->gq[0].dq, 0, t);
	rig_sync(r->s_run, "kernel");
	rig_ctl_stop(r);
	{
		int good = 0;

		for (int l = 0; l < 32; l++) {
			uint32_t want = l % 4 == 0   ? UPCIE_NVME_SC_LBA_RANGE
					: l % 4 == 1 ? UPCIE_NVME_SC_UNRECOVERED_READ
						     : 0;

			good += t->ret[l] == 0 && t->code[l] == want;
		}
		CHECK(err == 0 && good == 32, "error statuses reach the submitting lane (%d/32)",
		      good);
	}
	CHECK(t->timeouts == 1 && t->ok == 31 && t->bad == 0 &&
		  t->t_ns >= 2 * UPCIE_NSEC_PER_MSEC && t->t_ns < 50 * UPCIE_NSEC_PER_MSEC,
	      "dropped completion: -ETIMEDOUT for that lane only, after %.2f ms (deadline 2 ms, "
	      "%%globaltimer)",
	      t->t_ns / 1e6);
	CHECK(t->einval == 7,
	      "cancel keeps the CID reserved (1 in flight); complete() on it is "
	      "-EINVAL (%llu)",
	      t->einval);
	CHECK(t->late == 2, "the queue keeps working after a timeout (%llu of 2 rounds)", t->late);
	CHECK(t->t2_ns >= 200 * UPCIE_NSEC_PER_USEC,
	      "delayed completion arrives after the delay (%.1f us >= 200 us)", t->t2_ns / 1e3);
	CHECK(t->reclaimed == 1 && t->inflight_after == 0,
	      "reclaim frees the cancelled CID once the queue is gone (%u, %u in flight)",
	      t->reclaimed, t->inflight_after);
	CHECK(r->c.q[0].ndrop == 1 && r->c.q[0].nerr == 16, "controller: 1 dropped, 16 errors");
	rig_queues_destroy(r);

	/* 1, 8, 64 queues, one warp each; then 4 warps sharing one queue under its lock. */
	for (int nq : { 1, 8, 64 }) {
		memset(t, 0, nq * sizeof(*t));
		err = rig_queues_create(r, nq, 128, 0);
		rig_ctl_start(r, nq == 8, 0);
		traffic_kernel<<<nq, 32, 0, r->s_run>>>(r->dqs, 1, 10000, false, t);
		rig_sync(r->s_run, "kernel");
		rig_ctl_stop(r);
		ok = sum_ok(t, nq, &bad, &busy);
		CHECK(err == 0 && ok == 10000ull * nq && bad == 0,
		      "%d queue pairs x 10000 commands%s: %llu ok, %llu bad", nq,
		      nq == 8 ? " (out of order)" : "", ok, bad);
		rig_queues_destroy(r);
	}
	memset(t, 0, 4 * sizeof(*t));
	err = rig_queues_create(r, 1, 256, 0);
	rig_ctl_start(r, 0, 0);
	traffic_kernel<<<4, 32, 0, r->s_run>>>(r->dqs, 4, 3000, true, t);
	rig_sync(r->s_run, "kernel");
	rig_ctl_stop(r);
	ok = sum_ok(t, 4, &bad, &busy);
	upcie_nvme_gqp_read(&r->gq[0], &st);
	CHECK(err == 0 && ok == 12000 && bad == 0 && st.nfree == st.ncids && st.lock == 0,
	      "4 warps share one queue pair through its lock: %llu ok, %llu bad", ok, bad);
	rig_queues_destroy(r);
	cudaFreeHost(t);
}

static void test_data(struct rig *r, int nq, unsigned flags)
{
	struct tres *t = tres_alloc(nq);
	struct upcie_heap_buf src, dst;
	struct upcie_gpu_xlate x;
	uint64_t bytes = (uint64_t)nq * 32 * SLICE, ns_per_q = 32 * SLICE;
	const char *where =
	    flags & UPCIE_NVME_GQP_SQ_HOSTMEM ? "SQ in host memory" : "SQ in device memory";
	unsigned long long mism = 0, einval = 0;
	int err, bad = 0;

	err = rig_queues_create(r, nq, 64, flags | UPCIE_NVME_GQP_PRP_LISTS);
	if (!err)
		err = upcie_gpu_cuda_alloc(&r->gpu, bytes, 65536, &src);
	if (!err)
		err = upcie_gpu_cuda_alloc(&r->gpu, bytes, 65536, &dst);
	if (!err)
		err = upcie_gpu_cuda_xlate_create(&r->gpu, src.vaddr, &x);
	CHECK(err == 0, "%d queues (%s), %" PRIu64 " MiB of buffers from the device heap", nq,
	      where, bytes >> 20);
	if (err)
		return;
	rig_ctl_start(r, 0, 0);
	data_kernel<<<nq, 32, 0, r->s_run>>>(r->dqs, x, (uint8_t *)src.vaddr, (uint8_t *)dst.vaddr,
					     ns_per_q, t);
	rig_sync(r->s_run, "kernel");
	rig_ctl_stop(r);
	for (int q = 0; q < nq; q++) {
		mism += t[q].mism;
		einval += t[q].einval;
		for (int l = 0; l < 32; l++)
			bad += t[q].ret[l] != 0 || t[q].code[l] != 0;
	}
	CHECK(bad == 0 && mism == 0,
	      "data end to end, %s, %d queues: writes then reads of 512 B..64 KiB (PRP1, PRP2, PRP "
	      "lists) at dword offsets: %d failed commands, %llu bytes differ",
	      where, nq, bad, mism);
	CHECK(einval == (unsigned long long)nq, "a buffer outside the translation: -EINVAL");
	/* The host checks what landed in the namespace for queue nq - 1, lane 3 (64 KiB). */
	{
		static uint8_t buf[65536];
		uint32_t q = nq - 1, lane = 3;
		uint64_t off = q * ns_per_q + lane * SLICE;
		int diff = 0;

		RIG_CK(cudaMemcpy(buf, r->ns + off, 65536, cudaMemcpyDeviceToHost));
		for (uint32_t i = 0; i < 65536; i++)
			diff += buf[i] != (uint8_t)(i * 7 + lane * 13 + q * 31 + (i >> 9));
		CHECK(diff == 0,
		      "namespace holds the written pattern (host check, %d bytes differ)", diff);
	}
	upcie_gpu_cuda_xlate_destroy(&r->gpu, &x);
	upcie_gpu_cuda_free(&r->gpu, &src);
	upcie_gpu_cuda_free(&r->gpu, &dst);
	rig_queues_destroy(r);
	cudaFreeHost(t);
}

/* ---- completion mirror: CPU-driven queue pairs ---- */

struct mq {
	struct upcie_nvme_cqmirror_cq m;
	struct upcie_heap_buf sq;
	struct upcie_nvme_qpair qp;
	volatile uint32_t *db; /* pinned, mapped: [0] SQ tail, [1] CQ head */
	uint32_t *db_dev;
};

struct cb_state {
	unsigned long long ok, bad;
	uint32_t expect_base;
};

static void mq_cb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct cb_state *s = (struct cb_state *)ctx;

	if (!err && upcie_nvme_cqe_ok(cqe))
		s->ok++;
	else
		s->bad++;
}

static int mq_open(struct rig *r, struct mq *q, volatile uint32_t *db, uint32_t *db_dev,
		   uint32_t depth, int slot_ctl)
{
	struct upcie_nvme_qpair_cfg cfg;
	struct nullctl_queue *cq = &r->c.q[slot_ctl];
	int err;

	memset(q, 0, sizeof(*q));
	q->db = db;
	q->db_dev = db_dev;
	db[0] = db[1] = 0;
	err = upcie_nvme_cqmirror_attach(&q->m, &r->gpu, depth);
	if (err)
		return err;
	err = upcie_gpu_cuda_host_alloc(&r->gpu, (uint64_t)depth * 64, 4096, &q->sq);
	if (err) {
		upcie_nvme_cqmirror_detach(&q->m);
		return err;
	}
	memset(&cfg, 0, sizeof(cfg));
	cfg.sq = q->sq.vaddr;
	cfg.cq = q->m.host_cq;
	cfg.sqdb = db;
	cfg.cqdb = db + 1;
	cfg.sq_depth = depth;
	cfg.qid = (uint16_t)(slot_ctl + 1);
	err = upcie_nvme_qpair_init(&q->qp, &cfg);
	if (err)
		return err;
	memset(cq, 0, sizeof(*cq));
	cq->sq = (const struct upcie_nvme_sqe *)rig_ptr(q->sq.iova);
	cq->cq = (struct upcie_nvme_cqe *)rig_ptr(q->m.dev_cq_iova);
	cq->sqdb = db_dev;
	cq->cqdb = db_dev + 1;
	cq->depth = depth;
	cq->qid = cfg.qid;
	cq->phase = 1;
	return 0;
}

static int mq_close(struct rig *r, struct mq *q)
{
	upcie_nvme_qpair_fini(&q->qp);
	upcie_gpu_cuda_host_free(&r->gpu, &q->sq);
	return upcie_nvme_cqmirror_detach(&q->m);
}

/* Run `n` flushes through q at up to `qd` in flight; returns completions seen (ok). */
static unsigned long long mq_run(struct mq *q, unsigned n, unsigned qd, struct cb_state *s)
{
	struct upcie_nvme_sqe sqe;
	unsigned sent = 0;
	uint64_t t0 = upcie_time_ns();

	upcie_nvme_cmd_flush(&sqe, 1);
	while (s->ok + s->bad < n) {
		while (sent < n && upcie_nvme_qpair_inflight(&q->qp) < qd) {
			sqe.cdw2 = sent;
			if (upcie_nvme_qpair_enqueue(&q->qp, &sqe, mq_cb, s, NULL))
				break;
			sent++;
		}
		upcie_nvme_qpair_ring(&q->qp);
		upcie_nvme_qpair_reap(&q->qp, 64);
		if (upcie_time_ns() - t0 > 5 * UPCIE_NSEC_PER_SEC)
			break;
	}
	return s->ok;
}

static void test_mirror(struct rig *r)
{
	volatile uint32_t *db;
	uint32_t *db_dev;
	struct mq a, b;
	struct upcie_nvme_cqmirror_cq c;
	struct upcie_nvme_gqp_host g;
	struct upcie_nvme_gqp_cfg gcfg;
	struct cb_state s;
	int err, fails = 0, nack = 0;

	RIG_CK(cudaHostAlloc((void **)&db, 4096, cudaHostAllocMapped));
	RIG_CK(cudaHostGetDevicePointer((void **)&db_dev, (void *)db, 0));

	/* Exclusion with GPU-issued queues, both ways. */
	memset(&gcfg, 0, sizeof(gcfg));
	gcfg.qid = 1;
	gcfg.depth = 16;
	gcfg.sqdb = r->dbs;
	gcfg.cqdb = r->dbs + 1;
	gcfg.flags = 0x80;
	err = upcie_nvme_gqp_create(&g, &r->gpu, &gcfg);
	CHECK(err == -EINVAL, "GPU-issued queue pair with an unknown flag: -EINVAL (%d)", err);
	gcfg.flags = 0;
	err = upcie_nvme_gqp_create(&g, &r->gpu, &gcfg);
	CHECK(err == 0, "GPU-issued queue pair created");
	err = upcie_nvme_cqmirror_attach(&c, &r->gpu, 64);
	CHECK(err == -EBUSY, "mirror attach while a GPU-issued queue is open: -EBUSY (%d)", err);
	upcie_nvme_gqp_destroy(&g);
	err = upcie_nvme_cqmirror_attach(&c, &r->gpu, 64);
	CHECK(err == 0 && upcie_nvme_cqmirror_running(&r->gpu),
	      "first attach launches the mirror kernel (%d)", err);
	err = upcie_nvme_gqp_create(&g, &r->gpu, &gcfg);
	CHECK(err == -EBUSY, "GPU-issued queue while a mirrored CQ is open: -EBUSY (%d)", err);
	err = upcie_nvme_cqmirror_detach(&c);
	CHECK(err == 0 && !upcie_nvme_cqmirror_running(&r->gpu),
	      "last detach retires the kernel (%d)", err);

	/* Traffic through the mirror: a CPU queue pair whose CQ the controller writes in VRAM. */
	err = mq_open(r, &a, db, db_dev, 256, 0);
	CHECK(err == 0, "mirrored queue (depth 256) attached, CPU queue pair on it (%d)", err);
	if (err)
		return;
	r->c.nq = 1;
	rig_ctl_start(r, 1, 0);
	memset(&s, 0, sizeof(s));
	mq_run(&a, 50000, 128, &s);
	rig_ctl_stop(r);
	CHECK(s.ok == 50000 && s.bad == 0 && a.qp.nbad == 0,
	      "50000 commands at QD 128 complete through the mirror, out of order (%llu ok, %llu "
	      "bad)",
	      s.ok, s.bad);

	/* Attach/detach while the warps run: a keeps the kernel alive, b comes and goes. */
	for (int i = 0; i < 200; i++) {
		err = mq_open(r, &b, db + 16, db_dev + 16, 64, 1);
		if (err) {
			fails++;
			break;
		}
		r->c.nq = 2;
		r->c.q[0].depth = 0; /* queue a idle this round: controller warp 0 skips it */
		rig_ctl_start(r, 0, 0);
		memset(&s, 0, sizeof(s));
		mq_run(&b, 100, 32, &s);
		rig_ctl_stop(r);
		fails += s.ok != 100;
		err = mq_close(r, &b);
		nack += err != 0;
		fails += !upcie_nvme_cqmirror_running(&r->gpu);
	}
	CHECK(fails == 0 && nack == 0,
	      "200 x (attach, 100 commands, detach) beside a running queue: %d failures, %d "
	      "detaches unacknowledged",
	      fails, nack);
	fails = 0;
	for (int i = 0; i < 2000; i++) {
		err = upcie_nvme_cqmirror_attach(&c, &r->gpu, 16 + (i % 8) * 16);
		fails += err != 0;
		err = upcie_nvme_cqmirror_detach(&c);
		fails += err != 0;
	}
	CHECK(fails == 0 && upcie_nvme_cqmirror_running(&r->gpu),
	      "2000 x attach/detach with no traffic (generation raced past the warp): %d failures",
	      fails);
	{
		struct upcie_nvme_cqmirror_cq many[UPCIE_NVME_CQMIRROR_SLOTS];
		int n = 0;

		for (int i = 0; i < UPCIE_NVME_CQMIRROR_SLOTS; i++)
			n += upcie_nvme_cqmirror_attach(&many[i], &r->gpu, 32) == 0;
		err = upcie_nvme_cqmirror_attach(&c, &r->gpu, 32);
		CHECK(n == UPCIE_NVME_CQMIRROR_SLOTS - 1 && err == -ENOSPC,
		      "63 more slots fill the table; the 65th attach: -ENOSPC (%d, %d)", n, err);
		for (int i = 0; i < UPCIE_NVME_CQMIRROR_SLOTS; i++)
			upcie_nvme_cqmirror_detach(&many[i]);
	}
	/* Queue a again after all that. */
	r->c.nq = 1;
	r->c.q[0].depth = 256;
	r->c.q[0].qid = 1;
	rig_ctl_start(r, 0, 0);
	memset(&s, 0, sizeof(s));
	mq_run(&a, 10000, 32, &s);
	rig_ctl_stop(r);
	CHECK(s.ok == 10000, "the long-lived mirrored queue still works (%llu)", s.ok);
	err = mq_close(r, &a);
	CHECK(err == 0 && !upcie_nvme_cqmirror_running(&r->gpu),
	      "last detach retires the kernel again (%d)", err);
	err = upcie_nvme_cqmirror_attach(&c, &r->gpu, 64);
	CHECK(err == 0 && upcie_nvme_cqmirror_running(&r->gpu), "and a new attach relaunches it");
	upcie_nvme_cqmirror_detach(&c);
	cudaFreeHost((void *)db);
}

int main(void)
{
	struct rig r;
	int err, ndev = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	rig_eager();
	upcie_log_set_handler(capture, NULL);
	rig_watchdog(21);
	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&ndev) != CUDA_SUCCESS || !ndev) {
		printf("1..0 # SKIP no CUDA device\n0 passed, 0 failed, 0 skipped\n");
		return 0;
	}
	test_import_path();
	test_context();
	err = rig_open(&r, 1024 * MiB, 64 * MiB, 256 * MiB);
	CHECK(err == 0, "provider open for the queue tests (offset translation) %d", err);
	if (!err) {
		int attr = 0;

		cuDeviceGetAttribute(&attr,
				     CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
				     r.gpu.p->dev.dev);
		printf("# host heap: %" PRIu64
		       " MiB at %p, GPU address 0x%llx (same pointer: %d)\n",
		       r.gpu.p->hsize >> 20, r.gpu.p->hbase, (unsigned long long)r.gpu.p->hbase_dev,
		       attr);
		test_export_registry(&r.gpu);
		test_queues(&r);
		test_data(&r, 1, 0);
		test_data(&r, 64, 0);
		test_data(&r, 8, UPCIE_NVME_GQP_SQ_HOSTMEM);
		test_mirror(&r);
		rig_close(&r);
	}
	{
		int failed = check_failed_, total = check_n_;
		int rc = check_done();

		printf("%d passed, %d failed, %d skipped\n", total - failed - nskip_, failed,
		       nskip_);
		return rc;
	}
}
