/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * GPU tests on a real CUDA driver (an H200): the provider (context choice, BAR1 check,
 * heaps, dma-buf export of whole allocations and of sub-ranges, base recovery from interior
 * pointers, the registry), GPU-resident queue pairs against the GPU null controller (wrap-around
 * and phase, out-of-order completions, error status, dropped completions and timeouts, delays, SQ
 * in device and in host memory, 1 to 64 queues, a queue shared by warps, data verified end to
 * end), and the completion mirror (CPU-driven queues whose CQ the controller writes in GPU memory;
 * attach/detach while the warp runs, many times; exclusion with GPU-issued queues). Then the
 * ordering and lifecycle groups: the stale-read scenario (a buffer in the reader's L1, read into,
 * completion waited for, read back with plain loads) through the GPU queue pair and through the
 * portable core in device code; one 16-byte CQE load against entries written in two parts; the
 * queue, data, stale-read and mirror tests against the copy-engine controller (cectl.cuh: a CPU
 * thread posting through cuMemcpyHtoDAsync, lagging SQ head, out of order, CQ filled to depth - 1);
 * the CQ clear at creation under a persistent kernel filling every SM; a GPU without ordered peer
 * writes refused; gqp_destroy while a kernel holds the queue; mirror detach while completions
 * arrive, a detach that times out and its retry, attach with every SM taken, and provider close
 * with a mirror warp that never started, and an attach timeout whose even-generation write fails.
 * The readers group drives every reader kind of gpuq/gqp_cuda.h as a user's kernel would (same
 * block, another block, the ringing warp told by producers, a resident kernel told by the CPU);
 * the place group checks that host-memory payloads are refused and runs the P2P placement check
 * against this GPU's BAR1 and this machine's /proc/iomem with pinned host pages presented as device
 * memory. tests/gpu/run-controls.sh builds this with each ordering rule removed and checks that
 * the guarding test fails.
 *
 * The dma-buf import module is not on the H200: where it is absent the import path is checked to
 * fail naming its package, and everything else runs with the tests' own address scheme
 * (UPCIE_GPU_CUDA_XLATE_OFFSET). TAP output, "N passed, N failed" last. CI only compiles this.
 */
#include <cuda.h>

#include <stdint.h>

/*
 * Test hooks, set before the headers: timeouts that the lifecycle tests shorten at run time, and
 * the device attribute read through a function that can report a GPU without ordered peer writes.
 */
static uint64_t test_ack_timeout_ns = 300000000ull;
static uint64_t test_destroy_timeout_ns = 300000000ull;
static int test_peer_order = -1;      /* >= 0: reported instead of the real attribute */
static volatile int test_mirror_deaf; /* detach sees no acknowledgement (a stuck warp) */
#define UPCIE_NVME_CQMIRROR_ACK_TIMEOUT_NS  test_ack_timeout_ns
#define UPCIE_NVME_GQP_DESTROY_TIMEOUT_NS   test_destroy_timeout_ns
#define UPCIE_NVME_CQMIRROR_ACKED(ms, s, g) (!test_mirror_deaf && (ms)->ack[s] == (g)-1)

static inline CUresult test_attr(int *v, CUdevice_attribute a, CUdevice d)
{
	CUresult r = cuDeviceGetAttribute(v, a, d);

	if (r == CUDA_SUCCESS && a == CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING &&
	    test_peer_order >= 0)
		*v = test_peer_order;
	return r;
}
#define UPCIE_GPU_CUDA_DEVICE_ATTRIBUTE(v, a, d) test_attr(v, a, d)

/*
 * The mirror table's even-generation writes can be made to fail (a copy-engine error at the worst
 * moment): test_put_fail_even of them fail, then they work again.
 */
static int test_put_fail_even;
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <upcie/gpuq/cqmirror_cuda.h>
static inline int test_put_fail(size_t off, const void *src, size_t len)
{
	size_t base = offsetof(struct upcie_nvme_cqmirror_table, slot);
	uint32_t v;

	if (!test_put_fail_even || len != 4 || off < base ||
	    (off - base) % sizeof(struct upcie_nvme_cqmirror_slot) !=
		offsetof(struct upcie_nvme_cqmirror_slot, gen))
		return 0;
	memcpy(&v, src, 4);
	if (v & 1u)
		return 0;
	test_put_fail_even--;
	return -EIO;
}
#define UPCIE_NVME_CQMIRROR_PUT_FAIL(off, src, len) test_put_fail(off, src, len)

/*
 * CQE polls that tear on purpose (test_tear_poll_ns > 0: dw0..dw2 first, dw3 that many ns later,
 * its address made dependent on dw0), and the re-load after the acquire switchable at run time
 * (test_no_reload), so one binary shows both that the queue survives a torn poll and that the
 * harness can see one; run-controls.sh builds it with the re-load compiled out as well.
 */
__device__ unsigned test_tear_poll_ns;
__device__ unsigned test_no_reload;
__device__ static inline uint4 test_cq_load(const void *p)
{
	uint4 v;

	if (!test_tear_poll_ns) {
		asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
			     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
			     : "l"(p)
			     : "memory");
	} else {
		const uint32_t *q = (const uint32_t *)p;
		uint32_t z;

		asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];"
			     : "=r"(v.x), "=r"(v.y)
			     : "l"(q)
			     : "memory");
		asm volatile("ld.volatile.global.u32 %0, [%1];"
			     : "=r"(v.z)
			     : "l"(q + 2)
			     : "memory");
		asm volatile("and.b32 %0, %1, 0;" : "=r"(z) : "r"(v.x));
		__nanosleep(test_tear_poll_ns);
		asm volatile("ld.volatile.global.u32 %0, [%1];"
			     : "=r"(v.w)
			     : "l"(q + 3 + z)
			     : "memory");
	}
	return v;
}
#define UPCIE_NVME_GQP_CQ_LOAD(p) test_cq_load(p)
#ifndef UPCIE_NVME_GQP_CQE_RELOAD
#define UPCIE_NVME_GQP_CQE_RELOAD (!test_no_reload)
#endif

#include <upcie/gpu/dev_cuda.h>
#include <upcie/gpu/heap_cuda.h>
#include <upcie/gpu/p2p_check.h>
#include <upcie/mem/hugepage.h>
#include <upcie/nvme/cmd.h>
#include <upcie/gpuq/cqmirror_host_cuda.h>
#include <upcie/gpuq/gqp_cuda.h>
#include <upcie/gpuq/gqp_host_cuda.h>
#include <upcie/nvme/qpair.h>

#include <fcntl.h>
#include <pthread.h>
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

/* upcie_nvme_gqp_wait() after an enqueue that returned r: wait() is warp-collective, so a lane
 * whose enqueue failed still calls it, on no CID, and keeps its error. */
__device__ static inline int wait_after(struct upcie_nvme_gqp_warp *w, int r, uint16_t cid,
					uint64_t timeout_ns, struct upcie_nvme_cqe *cqe)
{
	int rw =
	    upcie_nvme_gqp_wait(w, r ? (uint16_t)UPCIE_NVME_GQP_CID_NONE : cid, timeout_ns, cqe);

	return r ? r : rw;
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
	r = wait_after(&w, r, cid, 100 * UPCIE_NSEC_PER_MSEC, &cqe);
	t->ret[lane] = r;
	t->code[lane] = r ? 0xffff : upcie_nvme_cqe_code(&cqe) | (cqe.dw0 == lane ? 0 : 0x8000);

	/* 2: lane 0's completion is dropped: wait times out for it alone, after 2 ms. */
	upcie_nvme_cmd_flush(&sqe, 1);
	sqe.cdw2 = 100 + lane;
	sqe.cdw3 = lane == 0 ? NULLCTL_TAG_DROP : 0;
	r = upcie_nvme_gqp_enqueue(&w, &sqe, &cid);
	upcie_nvme_gqp_ring(&w);
	t0 = now_ns();
	r = wait_after(&w, r, cid, 2 * UPCIE_NSEC_PER_MSEC, &cqe);
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
		r = wait_after(&w, r, cid, 100 * UPCIE_NSEC_PER_MSEC, &cqe);
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
	r = wait_after(&w, r, cid, 500 * UPCIE_NSEC_PER_MSEC, &cqe);
	res[q].ret[lane] = r;
	res[q].code[lane] = r ? 0xffff : upcie_nvme_cqe_code(&cqe);
	upcie_nvme_cmd_read(&sqe, 1, slba, len >> 9, 0);
	r = upcie_nvme_gqp_enqueue_data(&w, &sqe, &x, d, len, &cid);
	upcie_nvme_gqp_ring(&w);
	r = wait_after(&w, r, cid, 500 * UPCIE_NSEC_PER_MSEC, &cqe);
	if (r || !upcie_nvme_cqe_ok(&cqe))
		res[q].code[lane] |= 0x10000;
	/* As a user's kernel reads it: plain loads, no fence of its own. */
	for (uint32_t i = 0; i < len; i++)
		mism += d[i] != pat(q, lane, i);
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
		CHECK(err == -ENOENT && strstr(last_err, "upcie-dmabuf-import-dkms"),
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
	cur = NULL;
	cuCtxGetCurrent(&cur);
	CHECK(cur == NULL, "and leaves no context current (the open had made the primary current; "
			   "released, it may be destroyed)");

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

/* ---- completion -> data ordering: what a user's kernel reads after a completion ---- */

#include "cectl.cuh"

#define STALE_ITERS 500
#define STALE_WORDS 128 /* 512 bytes: LBA i holds STALE_WORDS words of value i + 1 */
#define STALE_SMEM  (120 * 1024)

__device__ static inline uint32_t smid(void)
{
	uint32_t v;

	asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
	return v;
}

/*
 * The stale-read scenario, through a GPU-resident queue pair: the warp has the buffer in its L1
 * (it read it, as a kernel that used the buffer before would), reads LBA i into it, waits for the
 * completion, and reads it again with plain loads, no fence of its own. Lane 0 issues the command.
 */
__global__ void stale_gqp_kernel(struct upcie_nvme_gqp *q, struct upcie_gpu_xlate x, uint32_t *buf,
				 uint32_t iters, struct tres *t)
{
	uint32_t lane = threadIdx.x & 31;
	struct upcie_nvme_gqp_warp w;
	unsigned long long stale = 0, sum = 0, errs = 0;

	upcie_nvme_gqp_begin(&w, q, false);
	for (uint32_t i = 0; i < iters; i++) {
		struct upcie_nvme_sqe sqe;
		struct upcie_nvme_cqe cqe;
		uint16_t cid = UPCIE_NVME_GQP_CID_NONE;
		uint4 v = ((const uint4 *)buf)[lane];
		int r;

		sum += v.x;
		upcie_nvme_cmd_read(&sqe, 1, i, 1, 0);
		r = upcie_nvme_gqp_enqueue_data(&w, lane == 0 ? &sqe : NULL, &x, buf, 512, &cid);
		upcie_nvme_gqp_ring(&w);
		r = wait_after(&w, r, cid, 500 * UPCIE_NSEC_PER_MSEC, &cqe);
		errs += lane == 0 && (r || !upcie_nvme_cqe_ok(&cqe));
		v = ((const uint4 *)buf)[lane];
		stale += v.x != i + 1 || v.y != i + 1 || v.z != i + 1 || v.w != i + 1;
	}
	upcie_nvme_gqp_end(&w);
	for (int o = 16; o; o >>= 1) {
		stale += __shfl_down_sync(0xffffffffu, stale, o);
		errs += __shfl_down_sync(0xffffffffu, errs, o);
		sum += __shfl_down_sync(0xffffffffu, sum, o);
	}
	if (lane == 0) {
		t->mism = stale;
		t->bad = errs;
		t->late = sum;
		t->code[0] = smid();
	}
}

/*
 * The same through the portable core (nvme/qpair.h) run by lane 0; the warp reads after. The core's
 * doorbell fence is __threadfence_system(), which invalidates the L1 itself, so the warp reads the
 * buffer into L1 after the submission, while the command is in flight.
 */
__global__ void stale_core_kernel(struct upcie_nvme_qpair *qp, uint64_t buf_iova, uint32_t *buf,
				  uint32_t iters, struct tres *t)
{
	uint32_t lane = threadIdx.x & 31;
	unsigned long long stale = 0, sum = 0, errs = 0;

	for (uint32_t i = 0; i < iters; i++) {
		uint16_t cid = 0;
		uint4 v;
		int r = 0;

		if (lane == 0) {
			struct upcie_nvme_sqe sqe;

			upcie_nvme_cmd_read(&sqe, 1, i, 1, 0);
			sqe.prp1 = buf_iova;
			r = upcie_nvme_qpair_submit(qp, &sqe, NULL, NULL, &cid);
		}
		__syncwarp();
		v = ((const uint4 *)buf)[lane];
		sum += v.x;
		__syncwarp();
		if (lane == 0) {
			r = r ? r : upcie_nvme_qpair_wait(qp, cid, 500 * UPCIE_NSEC_PER_MSEC);
			errs += r != 0;
		}
		__syncwarp();
		v = ((const uint4 *)buf)[lane];
		stale += v.x != i + 1 || v.y != i + 1 || v.z != i + 1 || v.w != i + 1;
	}
	for (int o = 16; o; o >>= 1) {
		stale += __shfl_down_sync(0xffffffffu, stale, o);
		sum += __shfl_down_sync(0xffffffffu, sum, o);
	}
	if (lane == 0) {
		t->mism = stale;
		t->bad = errs;
		t->late = sum;
		t->code[0] = smid();
	}
}

static void stale_pattern(uint32_t *h)
{
	for (uint32_t i = 0; i < STALE_ITERS; i++)
		for (uint32_t k = 0; k < STALE_WORDS; k++)
			h[i * STALE_WORDS + k] = i + 1;
}

/* Stale-read scenario against the warp null controller: GPU-resident queue pair, then core. */
static void test_stale_warp(struct rig *r)
{
	static uint32_t pat_h[STALE_ITERS * STALE_WORDS];
	struct tres *t = tres_alloc(2);
	struct upcie_heap_buf buf;
	struct upcie_gpu_xlate x;
	int err;

	stale_pattern(pat_h);
	RIG_CK(cudaMemcpy(r->ns, pat_h, sizeof(pat_h), cudaMemcpyHostToDevice));
	err = upcie_gpu_cuda_alloc(&r->gpu, 4096, 4096, &buf);
	if (!err)
		err = upcie_gpu_cuda_xlate_create(&r->gpu, buf.vaddr, &x);
	if (!err)
		err = rig_queues_create(r, 1, 64, 0);
	CHECK(err == 0, "stale read (warp controller): setup %d", err);
	if (err)
		return;
	/*
	 * First as the rig places them: the controller warp's own fences (MEMBAR + CCTL.IVALL)
	 * invalidate the L1 of its SM, so when the reader shares that SM no stale line survives.
	 * Then with the two kernels forced onto different SMs (each block takes 120 KiB of shared
	 * memory, two do not fit in one SM), as a drive is no SM at all: the checked run.
	 */
	RIG_CK(cudaFuncSetAttribute(nullctl_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
				    STALE_SMEM));
	RIG_CK(cudaFuncSetAttribute(stale_gqp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
				    STALE_SMEM));
	RIG_CK(cudaFuncSetAttribute(stale_core_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
				    STALE_SMEM));
	for (int sep = 0; sep < 2; sep++) {
		RIG_CK(cudaMemset(buf.vaddr, 0, 4096));
		memset(t, 0, sizeof(*t));
		r->ctl_smem = sep ? STALE_SMEM : 0;
		rig_ctl_start(r, 0, 0);
		stale_gqp_kernel<<<1, 32, r->ctl_smem, r->s_run>>>(
		    r->gq[0].dq, x, (uint32_t *)buf.vaddr, STALE_ITERS, t);
		rig_sync(r->s_run, "stale kernel");
		rig_ctl_stop(r);
		printf("# stale read, GPU queue pair, warp controller, %s: reader on SM %u, "
		       "controller on SM %u: %llu of %d lane-reads stale\n",
		       sep ? "kept apart" : "placed by the scheduler", t->code[0], r->c.q[0].smid,
		       t->mism, 32 * STALE_ITERS);
	}
	r->ctl_smem = 0;
	CHECK(
	    t->bad == 0 && t->mism == 0,
	    "stale read, GPU queue pair, warp controller: buffer in L1, read into it, wait, plain "
	    "loads: %llu of %d lane-reads stale, %llu failed commands",
	    t->mism, 32 * STALE_ITERS, t->bad);
	rig_queues_destroy(r);

	/* The portable core in device code: state and tables in mapped host memory. */
	{
		const uint32_t depth = 16;
		struct upcie_nvme_qpair *qp =
		    (struct upcie_nvme_qpair *)rig_pinned(sizeof(struct upcie_nvme_qpair));
		void *tables = rig_pinned(upcie_nvme_qpair_tables_size(depth - 1));
		struct upcie_heap_buf sq, cq;
		struct upcie_nvme_qpair_cfg cfg;
		struct nullctl_queue *nq = &r->c.q[0];

		err = upcie_gpu_cuda_alloc(&r->gpu, depth * 64, 4096, &sq);
		if (!err)
			err = upcie_gpu_cuda_alloc(&r->gpu, depth * 16, 4096, &cq);
		RIG_CK(cudaMemset(cq.vaddr, 0, depth * 16));
		RIG_CK(cudaMemset(r->dbs, 0, 8));
		memset(&cfg, 0, sizeof(cfg));
		cfg.sq = sq.vaddr;
		cfg.cq = cq.vaddr;
		cfg.sqdb = r->dbs;
		cfg.cqdb = r->dbs + 1;
		cfg.sq_depth = depth;
		cfg.qid = 1;
		cfg.flags = UPCIE_NVME_QPAIR_NO_CQ_CLEAR;
		cfg.tables = tables;
		if (!err)
			err = upcie_nvme_qpair_init(qp, &cfg);
		CHECK(err == 0, "stale read, core queue pair in device code: setup %d", err);
		if (!err) {
			memset(nq, 0, sizeof(*nq));
			nq->sq = (const struct upcie_nvme_sqe *)sq.vaddr;
			nq->cq = (struct upcie_nvme_cqe *)cq.vaddr;
			nq->sqdb = r->dbs;
			nq->cqdb = r->dbs + 1;
			nq->depth = depth;
			nq->qid = 1;
			nq->phase = 1;
			r->c.nq = 1;
			RIG_CK(cudaMemset(buf.vaddr, 0, 4096));
			memset(t, 0, sizeof(*t));
			r->ctl_smem = STALE_SMEM;
			rig_ctl_start(r, 0, 0);
			stale_core_kernel<<<1, 32, STALE_SMEM, r->s_run>>>(
			    qp, buf.iova, (uint32_t *)buf.vaddr, STALE_ITERS, t);
			rig_sync(r->s_run, "stale kernel");
			rig_ctl_stop(r);
			r->ctl_smem = 0;
			printf("# reader on SM %u, controller on SM %u\n", t->code[0],
			       r->c.q[0].smid);
			CHECK(t->bad == 0 && t->mism == 0,
			      "stale read, core queue pair (nvme/qpair.h) in device code, warp "
			      "controller: %llu of %d lane-reads stale, %llu failed commands",
			      t->mism, 32 * STALE_ITERS, t->bad);
			upcie_nvme_qpair_fini(qp);
		}
		upcie_gpu_cuda_free(&r->gpu, &sq);
		upcie_gpu_cuda_free(&r->gpu, &cq);
		cudaFreeHost(tables);
		cudaFreeHost(qp);
	}
	upcie_gpu_cuda_xlate_destroy(&r->gpu, &x);
	upcie_gpu_cuda_free(&r->gpu, &buf);
	cudaFreeHost(t);
}

/* ---- the copy-engine controller: queue, data, stale-read and mirror tests against it ---- */

struct cerig {
	struct cectl c;
	volatile uint32_t *db; /* pinned, mapped: per queue [0] SQ tail, [1] CQ head */
	uint32_t *db_dev;
	uint8_t *ns; /* pinned */
	uint64_t ns_bytes;
};

static void cerig_open(struct rig *r, struct cerig *ce, uint64_t ns_bytes)
{
	memset(ce, 0, sizeof(*ce));
	RIG_CK(cudaHostAlloc((void **)&ce->db, 4096, cudaHostAllocMapped));
	RIG_CK(cudaHostGetDevicePointer((void **)&ce->db_dev, (void *)ce->db, 0));
	RIG_CK(cudaHostAlloc((void **)&ce->ns, ns_bytes, 0));
	memset(ce->ns, 0, ns_bytes);
	ce->ns_bytes = ns_bytes;
	(void)r;
}

static void cerig_close(struct cerig *ce)
{
	cectl_free(&ce->c);
	cudaFreeHost((void *)ce->db);
	cudaFreeHost(ce->ns);
}

/* Controller state for a fresh run over `nq` queues (queues filled in by the caller). */
static void cerig_ctl_init(struct rig *r, struct cerig *ce, uint32_t lag, uint32_t ooo,
			   uint32_t fill, uint32_t split)
{
	cectl_free(&ce->c);
	ce->c.ns = ce->ns;
	ce->c.ns_bytes = ce->ns_bytes;
	ce->c.lba_shift = 9;
	ce->c.iova_offset = RIG_IOVA_OFFSET;
	ce->c.host_base = (const uint8_t *)r->gpu.p->hbase;
	ce->c.host_base_dev = r->gpu.p->hbase_dev;
	ce->c.host_size = r->gpu.p->hsize;
	ce->c.lag = lag;
	ce->c.ooo = ooo;
	ce->c.fill = fill;
	ce->c.split = split;
	ce->c.delay_ns = 20 * UPCIE_NSEC_PER_MSEC;
}

/* GPU-resident queue pairs (SQ in host memory) wired to the copy-engine controller. */
static int cerig_gqp_create(struct rig *r, struct cerig *ce, int nq, uint32_t depth, unsigned flags)
{
	struct upcie_nvme_gqp *dq[CECTL_MAX_Q];

	memset((void *)ce->db, 0, 4096);
	for (int i = 0; i < nq; i++) {
		struct upcie_nvme_gqp_cfg cfg;
		struct cectl_queue *q = &ce->c.q[i];
		int err;

		memset(&cfg, 0, sizeof(cfg));
		cfg.qid = (uint16_t)(i + 1);
		cfg.depth = depth;
		cfg.flags = flags | UPCIE_NVME_GQP_SQ_HOSTMEM;
		cfg.sqdb = ce->db_dev + 2 * i;
		cfg.cqdb = ce->db_dev + 2 * i + 1;
		err = upcie_nvme_gqp_create(&r->gq[i], &r->gpu, &cfg);
		if (err) {
			for (int k = 0; k < i; k++)
				upcie_nvme_gqp_destroy(&r->gq[k]);
			return err;
		}
		dq[i] = r->gq[i].dq;
		q->sq = (const struct upcie_nvme_sqe *)r->gq[i].sq.vaddr;
		q->cq = (CUdeviceptr)(uintptr_t)r->gq[i].cq.vaddr;
		q->sqdb = ce->db + 2 * i;
		q->cqdb = ce->db + 2 * i + 1;
		q->depth = depth;
		q->qid = cfg.qid;
	}
	RIG_CK(cudaMemcpy(r->dqs, dq, nq * sizeof(void *), cudaMemcpyHostToDevice));
	r->nq = nq;
	ce->c.nq = nq;
	return 0;
}

static void test_ce_queues(struct rig *r, struct cerig *ce)
{
	struct tres *t = tres_alloc(CECTL_MAX_Q);
	unsigned long long ok, bad, busy;
	struct upcie_nvme_gqp st;
	static const struct {
		uint32_t depth, lag, ooo, fill, split;
		const char *what;
	} cases[] = {
		{ 32, 1, 1, 1, 0, "lagging SQ head, out of order, CQ filled to depth - 1" },
		{ 64, 1, 0, 0, 1, "lagging SQ head, each CQE written as dw0..dw2 then dw3" },
		{ 256, 0, 1, 0, 0, "out of order, depth 256" },
	};
	int err;

	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		memset(t, 0, sizeof(*t));
		cerig_ctl_init(r, ce, cases[i].lag, cases[i].ooo, cases[i].fill, cases[i].split);
		err = cerig_gqp_create(r, ce, 1, cases[i].depth, 0);
		if (!err)
			err = cectl_start(&ce->c);
		if (!err) {
			traffic_kernel<<<1, 32, 0, r->s_run>>>(r->dqs, 1, 20000, false, t);
			rig_sync(r->s_run, "kernel");
			cectl_stop(&ce->c);
			upcie_nvme_gqp_read(&r->gq[0], &st);
		}
		ok = sum_ok(t, 1, &bad, &busy);
		CHECK(err == 0 && ok == 20000 && bad == 0 && st.nbad == 0 && st.nfree == st.ncids &&
			  ce->c.nfail == 0,
		      "copy-engine controller, %s: 20000 flushes, %llu ok, %llu bad (%llu SQHD "
		      "lagging, %llu held back, CQ full to depth - 1 %llu times)",
		      cases[i].what, ok, bad, ce->c.q[0].nlagged, ce->c.q[0].nheld,
		      ce->c.q[0].nfull);
		if (cases[i].fill)
			CHECK(ce->c.q[0].maxfill == cases[i].depth - 1,
			      "copy-engine controller filled the CQ to %llu of %u entries",
			      ce->c.q[0].maxfill, cases[i].depth);
		if (!err)
			rig_queues_destroy(r);
	}
	cudaFreeHost(t);
}

static void test_ce_data(struct rig *r, struct cerig *ce, int nq)
{
	struct tres *t = tres_alloc(nq);
	struct upcie_heap_buf src, dst, sbuf;
	struct upcie_gpu_xlate x, xs;
	uint64_t bytes = (uint64_t)nq * 32 * SLICE, ns_per_q = 32 * SLICE;
	unsigned long long mism = 0;
	int err, bad = 0;

	cerig_ctl_init(r, ce, 1, 1, 0, 0);
	err = cerig_gqp_create(r, ce, nq, 64, UPCIE_NVME_GQP_PRP_LISTS);
	if (!err)
		err = upcie_gpu_cuda_alloc(&r->gpu, bytes, 65536, &src);
	if (!err)
		err = upcie_gpu_cuda_alloc(&r->gpu, bytes, 65536, &dst);
	if (!err)
		err = upcie_gpu_cuda_xlate_create(&r->gpu, src.vaddr, &x);
	if (!err)
		err = cectl_start(&ce->c);
	CHECK(err == 0, "copy-engine controller: %d queues, data buffers (%d)", nq, err);
	if (err)
		return;
	data_kernel<<<nq, 32, 0, r->s_run>>>(r->dqs, x, (uint8_t *)src.vaddr, (uint8_t *)dst.vaddr,
					     ns_per_q, t);
	rig_sync(r->s_run, "kernel");
	cectl_stop(&ce->c);
	for (int q = 0; q < nq; q++) {
		mism += t[q].mism;
		for (int l = 0; l < 32; l++)
			bad += t[q].ret[l] != 0 || t[q].code[l] != 0;
	}
	CHECK(bad == 0 && mism == 0 && ce->c.nfail == 0,
	      "data end to end through the copy engines, %d queues (lagging SQ head, out of "
	      "order): writes then reads of 512 B..64 KiB, plain loads: %d failed commands, %llu "
	      "bytes differ",
	      nq, bad, mism);
	upcie_gpu_cuda_xlate_destroy(&r->gpu, &x);
	upcie_gpu_cuda_free(&r->gpu, &src);
	upcie_gpu_cuda_free(&r->gpu, &dst);
	rig_queues_destroy(r);

	/* The stale-read scenario with the copy engine as the writer. */
	stale_pattern((uint32_t *)ce->ns);
	cerig_ctl_init(r, ce, 0, 0, 0, 0);
	err = cerig_gqp_create(r, ce, 1, 64, 0);
	if (!err)
		err = upcie_gpu_cuda_alloc(&r->gpu, 4096, 4096, &sbuf);
	if (!err)
		err = upcie_gpu_cuda_xlate_create(&r->gpu, sbuf.vaddr, &xs);
	if (!err)
		err = cectl_start(&ce->c);
	if (!err) {
		RIG_CK(cudaMemset(sbuf.vaddr, 0, 4096));
		memset(t, 0, sizeof(*t));
		stale_gqp_kernel<<<1, 32, 0, r->s_run>>>(r->gq[0].dq, xs, (uint32_t *)sbuf.vaddr,
							 STALE_ITERS, t);
		rig_sync(r->s_run, "stale kernel");
		cectl_stop(&ce->c);
		upcie_gpu_cuda_xlate_destroy(&r->gpu, &xs);
		upcie_gpu_cuda_free(&r->gpu, &sbuf);
		rig_queues_destroy(r);
	}
	CHECK(err == 0 && t->bad == 0 && t->mism == 0,
	      "stale read, GPU queue pair, copy-engine controller: %llu of %d lane-reads stale, "
	      "%llu failed commands",
	      t->mism, 32 * STALE_ITERS, t->bad);
	cudaFreeHost(t);
}

/* A CPU queue pair whose CQ the copy engine writes in VRAM, mirrored to host memory. */
static void test_ce_mirror(struct rig *r, struct cerig *ce)
{
	struct upcie_nvme_qpair_cfg cfg;
	struct upcie_nvme_cqmirror_cq m;
	struct upcie_heap_buf sq;
	struct upcie_nvme_qpair qp;
	struct cb_state s;
	static const struct {
		uint32_t depth, fill;
	} cases[] = { { 256, 0 }, { 32, 1 } };
	int err;

	for (unsigned i = 0; i < 2; i++) {
		uint32_t depth = cases[i].depth;

		/* Pinned staging first: allocated while the mirror kernel runs, it would wait. */
		cerig_ctl_init(r, ce, 1, 1, cases[i].fill, 0);
		if (cectl_stage(&ce->c.q[0], depth)) {
			CHECK(0, "copy-engine controller staging");
			return;
		}
		err = upcie_nvme_cqmirror_attach(&m, &r->gpu, depth);
		if (!err)
			err = upcie_gpu_cuda_host_alloc(&r->gpu, (uint64_t)depth * 64, 4096, &sq);
		memset((void *)ce->db, 0, 64);
		memset(&cfg, 0, sizeof(cfg));
		cfg.sq = sq.vaddr;
		cfg.cq = m.host_cq;
		cfg.sqdb = ce->db;
		cfg.cqdb = ce->db + 1;
		cfg.sq_depth = depth;
		cfg.qid = 1;
		if (!err)
			err = upcie_nvme_qpair_init(&qp, &cfg);
		CHECK(err == 0, "mirrored queue for the copy-engine controller (%d)", err);
		if (err)
			return;
		ce->c.q[0].sq = (const struct upcie_nvme_sqe *)sq.vaddr;
		ce->c.q[0].cq = (CUdeviceptr)(uintptr_t)rig_ptr(m.dev_cq_iova);
		ce->c.q[0].sqdb = ce->db;
		ce->c.q[0].cqdb = ce->db + 1;
		ce->c.q[0].depth = depth;
		ce->c.q[0].qid = 1;
		ce->c.nq = 1;
		err = cectl_start(&ce->c);
		memset(&s, 0, sizeof(s));
		if (!err) {
			struct mq q;

			memset(&q, 0, sizeof(q));
			q.qp = qp;
			mq_run(&q, 20000, cases[i].fill ? depth - 1 : depth / 2, &s);
			qp = q.qp;
		}
		cectl_stop(&ce->c);
		CHECK(err == 0 && s.ok == 20000 && s.bad == 0 && qp.nbad == 0 && ce->c.nfail == 0,
		      "mirror, copy-engine controller, depth %u (lagging SQ head, out of order%s): "
		      "20000 commands, %llu ok, %llu bad",
		      depth, cases[i].fill ? ", CQ filled to depth - 1" : "", s.ok, s.bad);
		upcie_nvme_qpair_fini(&qp);
		upcie_gpu_cuda_host_free(&r->gpu, &sq);
		upcie_nvme_cqmirror_detach(&m);
		cectl_free(&ce->c); /* the kernel has ended with the last detach */
	}
}

/* ---- one 16-byte CQE load: can it see an entry torn? ---- */

#define TEAR_RING 64

__device__ static inline uint32_t ldv32(const uint32_t *p)
{
	uint32_t v;

	asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}

/* Writer thread: entry k gets dw0..dw2 = k, then (after a fence) dw3 = k. */
__global__ void tear_writer(uint32_t *ring, uint32_t n, const uint32_t *head)
{
	for (uint32_t k = 1; k <= n; k++) {
		uint32_t *e = ring + 4 * (k % TEAR_RING);
		uint64_t t0 = now_ns();

		/* Only once the reader polls entry k, so that it may catch the write half done. */
		while (ldv32(head) != k - 1)
			if (now_ns() - t0 > UPCIE_NSEC_PER_SEC)
				return;
		for (int i = 0; i < 3; i++)
			asm volatile("st.global.cg.u32 [%0], %1;" ::"l"(e + i), "r"(k) : "memory");
		__threadfence();
		asm volatile("st.global.cg.u32 [%0], %1;" ::"l"(e + 3), "r"(k) : "memory");
	}
}

/*
 * Reader thread: waits for dw3 of entry k to read k, then checks dw0..dw2. Split = 0: the queue
 * code's one 16-byte load; 1, the control: dw0..dw2 first, then about 1 us later dw3 (address
 * made dependent on dw0), a read that is not one access: the test must see it torn.
 */
template <int Split>
__global__ void tear_reader(const uint32_t *ring, uint32_t n, uint32_t *head, uint32_t *head_host,
			    unsigned long long *res)
{
	unsigned long long torn = 0, timeouts = 0;

	for (uint32_t k = 1; k <= n; k++) {
		const uint32_t *e = ring + 4 * (k % TEAR_RING);
		uint64_t t0 = now_ns();
		uint32_t a, b, c, d;

		for (;;) {
			if (Split) {
				uint32_t z;

				a = ldv32(e);
				b = ldv32(e + 1);
				c = ldv32(e + 2);
				asm volatile("and.b32 %0, %1, 0;" : "=r"(z) : "r"(a));
				__nanosleep(1000); /* a reader slower than the writer's two parts */
				d = ldv32(e + 3 + z);
			} else {
				uint4 v = upcie_nvme_port_ld16(e);

				a = v.x;
				b = v.y;
				c = v.z;
				d = v.w;
			}
			if (d == k)
				break;
			if (now_ns() - t0 > UPCIE_NSEC_PER_SEC) {
				timeouts++;
				break;
			}
		}
		torn += d == k && (a != k || b != k || c != k);
		asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(head), "r"(k) : "memory");
		if (head_host)
			*(volatile uint32_t *)head_host = k;
	}
	res[0] = torn;
	res[1] = timeouts;
}

struct tear_ce {
	volatile uint32_t *head;
	CUdeviceptr ring;
	uint32_t *stage; /* pinned, TEAR_RING x 4 */
	uint32_t n;
	CUcontext ctx;
	unsigned long long fail;
};

/* Copy-engine writer: entry k as two copies on one stream, 12 bytes then 4. */
static void *tear_ce_thread(void *arg)
{
	struct tear_ce *a = (struct tear_ce *)arg;
	CUstream s;

	cuCtxSetCurrent(a->ctx);
	if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
		a->fail++;
		return NULL;
	}
	for (uint32_t k = 1; k <= a->n; k++) {
		uint32_t slot = k % TEAR_RING, *st = a->stage + 4 * slot;
		uint64_t t0 = upcie_time_ns();

		while (*a->head != k - 1)
			if (upcie_time_ns() - t0 > UPCIE_NSEC_PER_SEC) {
				a->fail++;
				goto out;
			}
		st[0] = st[1] = st[2] = st[3] = k;
		if (cuMemcpyHtoDAsync(a->ring + 16 * slot, st, 12, s) != CUDA_SUCCESS ||
		    cuMemcpyHtoDAsync(a->ring + 16 * slot + 12, st + 3, 4, s) != CUDA_SUCCESS)
			a->fail++;
	}
out:
	cuStreamSynchronize(s);
	cuStreamDestroy(s);
	return NULL;
}

static void test_tear(struct rig *r)
{
	unsigned long long *res = (unsigned long long *)rig_pinned(64);
	uint32_t *hh = (uint32_t *)rig_pinned(64), *hh_dev;
	uint32_t *ring, *head;
	const uint32_t n_sm = 200000, n_ce = 20000;

	RIG_CK(cudaHostGetDevicePointer((void **)&hh_dev, hh, 0));
	RIG_CK(cudaMalloc(&ring, TEAR_RING * 16 + 256));
	head = ring + TEAR_RING * 4;
	for (int w = 0; w < 2; w++)
		for (int split = 0; split < 2; split++) {
			uint32_t n = w ? n_ce : n_sm;

			RIG_CK(cudaMemset(ring, 0, TEAR_RING * 16 + 256));
			RIG_CK(cudaDeviceSynchronize());
			res[0] = res[1] = 0;
			*(volatile uint32_t *)hh = 0;
			if (!w) {
				tear_writer<<<1, 1, 0, r->s_ctl>>>(ring, n, head);
				if (split)
					tear_reader<1>
					    <<<1, 1, 0, r->s_run>>>(ring, n, head, NULL, res);
				else
					tear_reader<0>
					    <<<1, 1, 0, r->s_run>>>(ring, n, head, NULL, res);
				rig_sync(r->s_run, "tear reader");
				rig_sync(r->s_ctl, "tear writer");
			} else {
				struct tear_ce a;
				pthread_t th;

				memset(&a, 0, sizeof(a));
				a.head = hh;
				a.ring = (CUdeviceptr)ring;
				a.stage = (uint32_t *)rig_pinned(TEAR_RING * 16);
				a.n = n;
				cuCtxGetCurrent(&a.ctx);
				if (split)
					tear_reader<1>
					    <<<1, 1, 0, r->s_run>>>(ring, n, head, hh_dev, res);
				else
					tear_reader<0>
					    <<<1, 1, 0, r->s_run>>>(ring, n, head, hh_dev, res);
				pthread_create(&th, NULL, tear_ce_thread, &a);
				pthread_join(th, NULL);
				rig_sync(r->s_run, "tear reader");
				res[1] += a.fail;
				cudaFreeHost(a.stage);
			}
			if (!split)
				CHECK(
				    res[0] == 0 && res[1] == 0,
				    "CQE written in two parts (%s), polled with one 16-byte load: "
				    "%llu of %u entries seen torn, %llu timeouts",
				    w ? "copy engine: 12 bytes, then 4"
				      : "warp: dw0..dw2, fence, dw3",
				    res[0], n, res[1]);
			else if (!w)
				CHECK(
				    res[0] > 0,
				    "control: the same polled as dw0..dw2, then 1 us later dw3, is "
				    "seen torn (warp: %llu of %u entries, %llu timeouts)",
				    res[0], n, res[1]);
			else
				printf("# the same polled as dw0..dw2, then 1 us later dw3 (copy "
				       "engine): "
				       "%llu of %u entries seen torn, %llu timeouts\n",
				       res[0], n, res[1]);
		}
	RIG_CK(cudaFree(ring));
	cudaFreeHost(hh);
	cudaFreeHost(res);
}

/* ---- persistent kernels filling every SM ---- */

/*
 * A user's persistent kernel: 2 blocks of 1024 threads per SM (2048 threads: nothing else fits).
 * Thread 0 of each block marks itself resident (ctl[16 + block]) and waits for ctl[0] (3 s at
 * most). Block 0's thread 0 also
 * reads a CQ when the host names one (ctl[2..3] address, ctl[4] entries): how many entries are
 * not zero (ctl[5]); then ctl[6] = 1.
 */
__global__ void __launch_bounds__(1024, 2) hog_kernel(volatile uint32_t *ctl)
{
	uint64_t t0 = now_ns();

	if (threadIdx.x == 0) {
		ctl[16 + blockIdx.x] = 1; /* resident */
		/* Ends by itself after 3 s, so that a test that waits for it cannot hang. */
		while (!ctl[0] && now_ns() - t0 < 3 * UPCIE_NSEC_PER_SEC) {
			if (blockIdx.x == 0 && ctl[4]) {
				const uint4 *cq =
				    (const uint4 *)(uintptr_t)(ctl[2] | ((uint64_t)ctl[3] << 32));
				uint32_t depth = ctl[4], dirty = 0;

				for (uint32_t i = 0; i < depth; i++) {
					uint4 v = upcie_nvme_port_ld16(&cq[i]);

					dirty += (v.x | v.y | v.z | v.w) != 0;
				}
				ctl[5] = dirty;
				ctl[4] = 0;
				__threadfence_system();
				ctl[6] = 1;
			}
			__nanosleep(2000);
		}
	}
	__syncthreads();
}

struct hog {
	volatile uint32_t *ctl;
	cudaStream_t s;
	int nsm;
	bool running;
};

/* Start the hog; true when every block became resident within 2 s. */
static bool hog_start(struct hog *h)
{
	uint64_t t0 = upcie_time_ns();

	if (!h->ctl) {
		RIG_CK(cudaHostAlloc((void **)&h->ctl, 4096, cudaHostAllocMapped));
		RIG_CK(cudaStreamCreateWithFlags(&h->s, cudaStreamNonBlocking));
		RIG_CK(cudaDeviceGetAttribute(&h->nsm, cudaDevAttrMultiProcessorCount, 0));
	}
	memset((void *)h->ctl, 0, 4096);
	hog_kernel<<<2 * h->nsm, 1024, 0, h->s>>>(h->ctl);
	RIG_CK(cudaGetLastError());
	h->running = true;
	for (;;) {
		int n = 0;

		for (int i = 0; i < 2 * h->nsm; i++)
			n += h->ctl[16 + i] != 0;
		if (n == 2 * h->nsm)
			return true;
		if (upcie_time_ns() - t0 > 2 * UPCIE_NSEC_PER_SEC)
			return false;
	}
}

static void hog_stop(struct hog *h)
{
	if (!h->running)
		return;
	h->ctl[0] = 1;
	rig_sync(h->s, "persistent kernel stop");
	h->running = false;
}

/*
 * The CQ clear at creation is done before create returns, for every stream: a persistent kernel
 * fills every SM and reads the CQ as soon as the host names it, right after create returned. The
 * CQ memory held old entries (the heap hands the same range out again).
 */
static void test_clear(struct rig *r, struct hog *h)
{
	struct upcie_nvme_gqp_cfg cfg;
	struct upcie_nvme_gqp_host g;
	const uint32_t depth = 4096;
	void *old;
	uint64_t t0;
	int err;

	memset(&cfg, 0, sizeof(cfg));
	cfg.qid = 1;
	cfg.depth = depth;
	cfg.sqdb = r->dbs;
	cfg.cqdb = r->dbs + 1;
	err = upcie_nvme_gqp_create(&g, &r->gpu, &cfg);
	CHECK(err == 0, "queue for the CQ clear test (%d)", err);
	if (err)
		return;
	old = g.cq.vaddr;
	RIG_CK(cudaMemset(old, 0xff, depth * 16));
	RIG_CK(cudaDeviceSynchronize());
	upcie_nvme_gqp_destroy(&g);
	if (!hog_start(h)) {
		hog_stop(h);
		SKIP("CQ clear under a persistent kernel: its blocks did not all become resident");
		return;
	}
	t0 = upcie_time_ns();
	err = upcie_nvme_gqp_create(&g, &r->gpu, &cfg);
	t0 = upcie_time_ns() - t0;
	if (!err && g.cq.vaddr == old) {
		uint64_t a = (uint64_t)(uintptr_t)g.cq.vaddr, t1 = upcie_time_ns();

		h->ctl[2] = (uint32_t)a;
		h->ctl[3] = (uint32_t)(a >> 32);
		__sync_synchronize();
		h->ctl[4] = depth;
		while (!h->ctl[6] && upcie_time_ns() - t1 < 2 * UPCIE_NSEC_PER_SEC)
			;
		CHECK(h->ctl[6] && h->ctl[5] == 0,
		      "CQ clear at creation ordered before any kernel: a persistent kernel filling "
		      "every SM read it right after create returned (%.1f ms): %u of %u entries "
		      "not zero",
		      t0 / 1e6, h->ctl[5], depth);
	} else {
		CHECK(err == 0, "create under a persistent kernel filling every SM (%d)", err);
		if (!err)
			SKIP("CQ clear: the heap placed the new CQ elsewhere");
	}
	/* Destroy while the persistent kernel (which does not use the queue) runs. */
	if (!err) {
		t0 = upcie_time_ns();
		err = upcie_nvme_gqp_destroy(&g);
		t0 = upcie_time_ns() - t0;
		CHECK(err == 0 && t0 < 100 * UPCIE_NSEC_PER_MSEC,
		      "gqp_destroy while a persistent kernel that does not use the queue runs: %d "
		      "after %.1f ms",
		      err, t0 / 1e6);
	}
	hog_stop(h);
}

/* ---- lifecycle under traffic ---- */

/* A persistent kernel that holds a queue pair (between begin and end) until *flag. */
__global__ void holder_kernel(struct upcie_nvme_gqp *q, volatile uint32_t *flag)
{
	struct upcie_nvme_gqp_warp w;

	upcie_nvme_gqp_begin(&w, q, false);
	while (!*flag)
		__nanosleep(1000);
	upcie_nvme_gqp_end(&w);
}

static void test_destroy_busy(struct rig *r)
{
	volatile uint32_t *flag = (volatile uint32_t *)rig_pinned(64);
	struct upcie_nvme_gqp_cfg cfg;
	struct upcie_nvme_gqp_host g;
	uint64_t t0;
	int err;

	memset(&cfg, 0, sizeof(cfg));
	cfg.qid = 1;
	cfg.depth = 64;
	cfg.sqdb = r->dbs;
	cfg.cqdb = r->dbs + 1;
	err = upcie_nvme_gqp_create(&g, &r->gpu, &cfg);
	if (err) {
		CHECK(err == 0, "queue for the destroy test (%d)", err);
		return;
	}
	holder_kernel<<<1, 32, 0, r->s_run>>>(g.dq, flag);
	usleep(20000);
	test_destroy_timeout_ns = 200 * UPCIE_NSEC_PER_MSEC;
	last_err[0] = 0;
	t0 = upcie_time_ns();
	err = upcie_nvme_gqp_destroy(&g);
	t0 = upcie_time_ns() - t0;
	CHECK(err == -EBUSY && g.dq && strstr(last_err, "hold the queue") &&
		  t0 < 400 * UPCIE_NSEC_PER_MSEC,
	      "gqp_destroy while a persistent kernel holds the queue: %d after %.0f ms (timeout "
	      "200 ms), nothing freed (\"%s\")",
	      err, t0 / 1e6, last_err);
	*flag = 1;
	rig_sync(r->s_run, "holder kernel");
	err = upcie_nvme_gqp_destroy(&g);
	CHECK(err == 0 && !g.dq, "and once the kernel has ended: 0 (%d)", err);
	test_destroy_timeout_ns = 300 * UPCIE_NSEC_PER_MSEC;
	cudaFreeHost((void *)flag);
}

static void test_peer_order_refused(struct rig *r)
{
	struct upcie_nvme_gqp_cfg cfg;
	struct upcie_nvme_gqp_host g;
	struct upcie_nvme_cqmirror_cq m;
	int v = 0, err;

	cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
			     r->gpu.p->dev.dev);
	printf("# CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING on this GPU: %d\n", v);
	memset(&cfg, 0, sizeof(cfg));
	cfg.qid = 1;
	cfg.depth = 16;
	cfg.sqdb = r->dbs;
	cfg.cqdb = r->dbs + 1;
	test_peer_order = CU_GPU_DIRECT_RDMA_WRITES_ORDERING_NONE;
	last_err[0] = 0;
	err = upcie_nvme_gqp_create(&g, &r->gpu, &cfg);
	CHECK(err == -EOPNOTSUPP && strstr(last_err, "WRITES_ORDERING") && !g.gpu.p,
	      "a GPU without ordered peer writes: GPU-issued queue refused, -EOPNOTSUPP (%d: "
	      "\"%s\")",
	      err, last_err);
	last_err[0] = 0;
	err = upcie_nvme_cqmirror_attach(&m, &r->gpu, 64);
	CHECK(err == -EOPNOTSUPP && strstr(last_err, "WRITES_ORDERING") && m.slot == -1,
	      "and the completion mirror refused, -EOPNOTSUPP (%d)", err);
	test_peer_order = -1;
	err = upcie_nvme_gqp_create(&g, &r->gpu, &cfg);
	CHECK(err == 0, "the real attribute (%d): created", v);
	upcie_nvme_gqp_destroy(&g);
}

static struct upcie_nvme_cqmirror_state_ *mstate(struct rig *r)
{
	return (struct upcie_nvme_cqmirror_state_ *)r->gpu.p->mirror;
}

/*
 * The attach timeout again, with the write that takes the slot back to an even generation failing:
 * the slot must not keep its odd generation (served, and taken, until the kernel ends). The next
 * call writes it; once the warp acknowledges, the slot is freed and the last detach retires the
 * kernel.
 */
static void test_mirror_regen(struct rig *r, struct hog *h)
{
	struct upcie_nvme_cqmirror_state_ *ms;
	struct upcie_nvme_cqmirror_cq c, c2;
	int err, s = -1, n = 0;

	if (!hog_start(h)) {
		hog_stop(h);
		SKIP("attach timeout with a failing generation write: the persistent kernel's "
		     "blocks were not all resident");
		return;
	}
	test_put_fail_even = 1;
	err = upcie_nvme_cqmirror_attach(&c, &r->gpu, 64);
	test_put_fail_even = 0;
	ms = mstate(r);
	for (int i = 0; i < UPCIE_NVME_CQMIRROR_SLOTS; i++)
		if (ms->parked[i])
			s = i;
	CHECK(err == -ETIMEDOUT && s >= 0 && ms->regen[s] && (ms->gen[s] & 1u),
	      "attach timeout whose even-generation write fails: %d, slot %d parked and marked "
	      "to retry (generation %u)",
	      err, s, s >= 0 ? ms->gen[s] : 0);
	hog_stop(h);
	usleep(20000);
	err = upcie_nvme_cqmirror_attach(&c2, &r->gpu, 64);
	/* Written, and then (the warp acknowledging at once) possibly the very slot attached. */
	CHECK(err == 0 && s >= 0 && !ms->regen[s] && ((ms->gen[s] & 1u) == (c2.slot == s)),
	      "the next attach writes it (%d): generation %u, slot %d now attached as %d", err,
	      s >= 0 ? ms->gen[s] : 0, s, c2.slot);
	usleep(5000);
	if (!err)
		err = upcie_nvme_cqmirror_detach(&c2);
	for (int i = 0; i < UPCIE_NVME_CQMIRROR_SLOTS; i++)
		n += ms->parked[i] || ms->used[i];
	CHECK(err == 0 && n == 0 && !upcie_nvme_cqmirror_running(&r->gpu),
	      "and once acknowledged the slot is free and the last detach retires the kernel "
	      "(%d, %d slots still taken)",
	      err, n);
}

static void test_mirror_life(struct rig *r, struct hog *h)
{
	volatile uint32_t *db;
	uint32_t *db_dev;
	struct mq a, b;
	struct upcie_nvme_cqmirror_cq c;
	struct upcie_nvme_cqmirror_state_ *ms;
	struct upcie_heap_buf canary;
	void *old_host;
	uint64_t t0;
	int err, n, s;

	RIG_CK(cudaHostAlloc((void **)&db, 4096, cudaHostAllocMapped));
	RIG_CK(cudaHostGetDevicePointer((void **)&db_dev, (void *)db, 0));
	/* a keeps the kernel running; b is detached while its completions still arrive. */
	err = mq_open(r, &a, db, db_dev, 64, 0);
	if (!err)
		err = mq_open(r, &b, db + 16, db_dev + 16, 64, 1);
	CHECK(err == 0, "two mirrored queues for the lifecycle tests (%d)", err);
	if (err)
		return;
	r->c.nq = 2;
	rig_ctl_start(r, 0, 20 * UPCIE_NSEC_PER_MSEC);
	{
		struct upcie_nvme_sqe sqe;
		struct cb_state cs;

		memset(&cs, 0, sizeof(cs));
		upcie_nvme_cmd_flush(&sqe, 1);
		sqe.cdw3 = NULLCTL_TAG_DELAY;
		for (int i = 0; i < 32; i++)
			upcie_nvme_qpair_enqueue(&b.qp, &sqe, mq_cb, &cs, NULL);
		upcie_nvme_qpair_ring(&b.qp);
		usleep(1000);
		old_host = b.m.host_cq;
		t0 = upcie_time_ns();
		err = mq_close(r, &b);
		t0 = upcie_time_ns() - t0;
	}
	/* The host CQ's memory goes to someone else; the warp must not write it any more. */
	n = upcie_gpu_cuda_host_alloc(&r->gpu, 64 * 16, 4096, &canary);
	if (!n)
		memset(canary.vaddr, 0x5a, 64 * 16);
	usleep(60000); /* the controller posts its 32 delayed completions into the old device CQ */
	rig_ctl_stop(r);
	s = 0;
	if (!n)
		for (int i = 0; i < 64 * 16; i++)
			s += ((uint8_t *)canary.vaddr)[i] != 0x5a;
	CHECK(err == 0 && t0 < 50 * UPCIE_NSEC_PER_MSEC && r->c.q[1].ncpl == 32,
	      "detach while completions still arrive: %d after %.2f ms, %llu completions posted "
	      "after it",
	      err, t0 / 1e6, r->c.q[1].ncpl);
	if (!n && canary.vaddr == old_host)
		CHECK(s == 0,
		      "and none of them reached the host CQ's memory, reused (%d bytes changed)",
		      s);
	else
		SKIP("the host heap did not hand the detached CQ's memory out again (%d)", n);
	if (!n)
		upcie_gpu_cuda_host_free(&r->gpu, &canary);

	/*
	 * A detach that times out (the acknowledgement hidden from detach, as from a stuck warp),
	 * then its retry.
	 */
	ms = mstate(r);
	err = upcie_nvme_cqmirror_attach(&c, &r->gpu, 64);
	if (!err) {
		test_mirror_deaf = 1;
		err = upcie_nvme_cqmirror_detach(&c);
		test_mirror_deaf = 0;
	}
	s = c.slot;
	CHECK(err == -ETIMEDOUT && s >= 0 && ms->used[s] && !(ms->gen[s] & 1u),
	      "detach that times out: -ETIMEDOUT, slot %d kept, generation %u even", s,
	      s >= 0 ? ms->gen[s] : 0);
	if (err == -ETIMEDOUT) {
		uint32_t g = ms->gen[s];

		err = upcie_nvme_cqmirror_detach(&c);
		usleep(5000);
		CHECK(err == 0 && ms->gen[s] == g && !ms->used[s] && ms->ack[s] == g - 1 &&
			  ms->ack[UPCIE_NVME_CQMIRROR_SLOTS + s] != g + 1,
		      "its retry waits for the same acknowledgement: %d, generation %u -> %u, "
		      "acknowledged %u, the warp took up nothing new",
		      err, g, ms->gen[s], ms->ack[s]);
	}
	mq_close(r, &a);
	CHECK(!upcie_nvme_cqmirror_running(&r->gpu), "last detach retired the mirror kernel");

	/* Attach while a persistent kernel fills every SM: the new mirror kernel cannot start. */
	if (!hog_start(h)) {
		hog_stop(h);
		SKIP("attach with every SM taken: the persistent kernel's blocks were not all "
		     "resident");
	} else {
		last_err[0] = 0;
		t0 = upcie_time_ns();
		err = upcie_nvme_cqmirror_attach(&c, &r->gpu, 64);
		t0 = upcie_time_ns() - t0;
		ms = mstate(r);
		n = 0;
		for (int i = 0; i < UPCIE_NVME_CQMIRROR_SLOTS; i++)
			n += ms->parked[i];
		CHECK(err == -ETIMEDOUT && strstr(last_err, "did not start") && n == 1 &&
			  t0 < 1000 * UPCIE_NSEC_PER_MSEC,
		      "attach while persistent kernels fill every SM: %d after %.0f ms (timeout "
		      "300 ms), slot parked (\"%s\")",
		      err, t0 / 1e6, last_err);
		hog_stop(h);
		usleep(20000);
		err = upcie_nvme_cqmirror_attach(&c, &r->gpu, 64);
		n = 0;
		for (int i = 0; i < UPCIE_NVME_CQMIRROR_SLOTS; i++)
			n += ms->parked[i];
		CHECK(err == 0 && n == 0,
		      "once they ended: the warp acknowledged, the parked slot was freed, attach "
		      "works (%d, %d parked)",
		      err, n);
		err = upcie_nvme_cqmirror_detach(&c);
		CHECK(err == 0 && !upcie_nvme_cqmirror_running(&r->gpu),
		      "and its detach retires the kernel (%d)", err);
	}
	test_mirror_regen(r, h);
	cudaFreeHost((void *)db);
}

/*
 * Provider close with a mirror warp that never starts (persistent kernels fill every SM): close
 * must return in bounded time, say so, and free nothing the kernel may use. Ends the provider:
 * the last test.
 */
static void test_shutdown_stuck(struct rig *r, struct hog *h)
{
	struct upcie_nvme_cqmirror_cq c;
	uint64_t t0;
	int err;

	if (!hog_start(h)) {
		hog_stop(h);
		SKIP("shutdown with a stuck mirror warp: the persistent kernel's blocks were not "
		     "all resident");
		upcie_gpu_cuda_close(&r->gpu);
		return;
	}
	err = upcie_nvme_cqmirror_attach(&c, &r->gpu, 64);
	last_err[0] = 0;
	t0 = upcie_time_ns();
	upcie_gpu_cuda_close(&r->gpu);
	t0 = upcie_time_ns() - t0;
	CHECK(err == -ETIMEDOUT && strstr(last_err, "still running") &&
		  t0 < 1500 * UPCIE_NSEC_PER_MSEC && upcie_gpu_cuda_proc_g.refs == 0,
	      "provider close with a mirror warp that never started: returns after %.0f ms, "
	      "heaps left allocated (\"%s\")",
	      t0 / 1e6, last_err);
	hog_stop(h);
	RIG_CK(cudaDeviceSynchronize()); /* the mirror kernel saw its stop flag and ended */
}

/* ---- readers outside the owning warp, CQE tearing, payload and P2P placement ---- */

/*
 * Every reader kind of gpuq/gqp_cuda.h ("Readers outside the owning warp"), written as a user's
 * kernel would: the reader holds the buffer in its L1 (it read it before), the owner reads LBA i
 * into it, and the reader, once told, executes its acquire and reads with plain loads. The blocks
 * take STALE_SMEM of shared memory each, so owner, reader and the warp controller run on three SMs.
 */

/* Same block: warp 0 owns the queue, warp 1 reads after __syncthreads() + data_acquire(). */
__global__ void rd_block_kernel(struct upcie_nvme_gqp *q, struct upcie_gpu_xlate x, uint32_t *buf,
				uint32_t iters, struct tres *t)
{
	uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	struct upcie_nvme_gqp_warp w;
	unsigned long long stale = 0, sum = 0, errs = 0;

	if (warp == 0)
		upcie_nvme_gqp_begin(&w, q, false);
	for (uint32_t i = 0; i < iters; i++) {
		if (warp == 1)
			sum += ((const uint4 *)buf)[lane].x; /* the lines now in L1 */
		__syncthreads();
		if (warp == 0) {
			struct upcie_nvme_sqe sqe;
			struct upcie_nvme_cqe cqe;
			uint16_t cid = UPCIE_NVME_GQP_CID_NONE;
			int r;

			upcie_nvme_cmd_read(&sqe, 1, i, 1, 0);
			r = upcie_nvme_gqp_enqueue_data(&w, lane == 0 ? &sqe : NULL, &x, buf, 512,
							&cid);
			upcie_nvme_gqp_ring(&w);
			r = wait_after(&w, r, cid, 500 * UPCIE_NSEC_PER_MSEC, &cqe);
			errs += lane == 0 && (r || !upcie_nvme_cqe_ok(&cqe));
		}
		__syncthreads();
		if (warp == 1) {
			uint4 v;

			upcie_nvme_gqp_data_acquire();
			v = ((const uint4 *)buf)[lane];
			stale += v.x != i + 1 || v.y != i + 1 || v.z != i + 1 || v.w != i + 1;
		}
	}
	if (warp == 0)
		upcie_nvme_gqp_end(&w);
	for (int o = 16; o; o >>= 1) {
		stale += __shfl_down_sync(0xffffffffu, stale, o);
		errs += __shfl_down_sync(0xffffffffu, errs, o);
	}
	if (lane == 0) {
		if (warp == 1) {
			t->mism = stale;
			t->late = sum;
		} else {
			t->bad = errs;
		}
	}
}

/*
 * Another block: block 0 owns the queue and publishes with upcie_nvme_gqp_signal(); block 1 says it
 * holds the old lines (flags[0]), waits with upcie_nvme_gqp_signal_wait() (flags[1]), reads.
 */
__global__ void rd_grid_kernel(struct upcie_nvme_gqp *q, struct upcie_gpu_xlate x, uint32_t *buf,
			       uint32_t *flags, uint32_t iters, struct tres *t)
{
	uint32_t lane = threadIdx.x & 31;
	unsigned long long stale = 0, sum = 0, errs = 0;

	if (blockIdx.x == 0) {
		struct upcie_nvme_gqp_warp w;

		upcie_nvme_gqp_begin(&w, q, false);
		for (uint32_t i = 0; i < iters; i++) {
			struct upcie_nvme_sqe sqe;
			struct upcie_nvme_cqe cqe;
			uint16_t cid = UPCIE_NVME_GQP_CID_NONE;
			int r = upcie_nvme_gqp_signal_wait(&flags[0], i + 1, UPCIE_NSEC_PER_SEC);

			upcie_nvme_cmd_read(&sqe, 1, i, 1, 0);
			r = r ? r
			      : upcie_nvme_gqp_enqueue_data(&w, lane == 0 ? &sqe : NULL, &x, buf,
							    512, &cid);
			upcie_nvme_gqp_ring(&w);
			r = wait_after(&w, r, cid, 500 * UPCIE_NSEC_PER_MSEC, &cqe);
			errs += lane == 0 && (r || !upcie_nvme_cqe_ok(&cqe));
			if (lane == 0)
				upcie_nvme_gqp_signal(&flags[1], i + 1);
			if (__any_sync(0xffffffffu, r != 0))
				break;
		}
		upcie_nvme_gqp_end(&w);
		if (lane == 0)
			t->bad = errs;
		return;
	}
	for (uint32_t i = 0; i < iters; i++) {
		uint4 v;
		int r;

		sum += ((const uint4 *)buf)[lane].x;
		__syncwarp();
		if (lane == 0)
			upcie_nvme_gqp_signal(&flags[0], i + 1);
		r = upcie_nvme_gqp_signal_wait(&flags[1], i + 1, UPCIE_NSEC_PER_SEC);
		if (r) {
			errs++;
			break;
		}
		v = ((const uint4 *)buf)[lane];
		stale += v.x != i + 1 || v.y != i + 1 || v.z != i + 1 || v.w != i + 1;
	}
	for (int o = 16; o; o >>= 1) {
		stale += __shfl_down_sync(0xffffffffu, stale, o);
		errs += __shfl_down_sync(0xffffffffu, errs, o);
	}
	if (lane == 0) {
		t->mism = stale;
		t->late = sum;
		t->timeouts = errs;
	}
}

/*
 * A resident kernel told by the CPU: the CPU (standing in for a host driver that reaped a
 * completion) has the copy engine write the buffer, waits for the copy, then raises a flag in
 * mapped host memory; the kernel waits with upcie_nvme_gqp_signal_wait() and reads.
 */
__global__ void rd_cpu_kernel(uint32_t *buf, uint32_t *flags, uint32_t iters, struct tres *t)
{
	uint32_t lane = threadIdx.x & 31;
	unsigned long long stale = 0, sum = 0, errs = 0;

	for (uint32_t i = 0; i < iters; i++) {
		uint4 v;

		sum += ((const uint4 *)buf)[lane].x;
		__syncwarp();
		if (lane == 0)
			upcie_nvme_gqp_signal(&flags[0], i + 1);
		if (upcie_nvme_gqp_signal_wait(&flags[1], i + 1, UPCIE_NSEC_PER_SEC)) {
			errs++;
			break;
		}
		v = ((const uint4 *)buf)[lane];
		stale += v.x != i + 1 || v.y != i + 1 || v.z != i + 1 || v.w != i + 1;
	}
	for (int o = 16; o; o >>= 1) {
		stale += __shfl_down_sync(0xffffffffu, stale, o);
		errs += __shfl_down_sync(0xffffffffu, errs, o);
	}
	if (lane == 0) {
		t->mism = stale;
		t->late = sum;
		t->timeouts = errs;
	}
}

struct rd_cpu {
	volatile uint32_t *flags; /* pinned, mapped */
	CUdeviceptr buf;
	uint32_t *stage; /* pinned: the pattern */
	uint32_t iters;
	CUcontext ctx;
	unsigned long long fail;
};

static void *rd_cpu_thread(void *arg)
{
	struct rd_cpu *a = (struct rd_cpu *)arg;
	CUstream s;

	cuCtxSetCurrent(a->ctx);
	if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
		a->fail++;
		return NULL;
	}
	for (uint32_t i = 0; i < a->iters; i++) {
		uint64_t t0 = upcie_time_ns();

		while (__atomic_load_n(&a->flags[0], __ATOMIC_ACQUIRE) != i + 1)
			if (upcie_time_ns() - t0 > UPCIE_NSEC_PER_SEC) {
				a->fail++;
				goto out;
			}
		if (cuMemcpyHtoDAsync(a->buf, a->stage + i * STALE_WORDS, 512, s) != CUDA_SUCCESS ||
		    cuStreamSynchronize(s) != CUDA_SUCCESS) {
			a->fail++;
			goto out;
		}
		__atomic_store_n(&a->flags[1], i + 1, __ATOMIC_RELEASE);
	}
out:
	cuStreamDestroy(s);
	return NULL;
}

/*
 * The ringing warp's acquire: a producer block writes the payload and a descriptor (the LBA) and
 * publishes with upcie_nvme_gqp_signal(); the ringing warp, which holds the descriptor's old line
 * in its L1, waits with upcie_nvme_gqp_signal_wait(), reads the LBA, writes the payload there.
 * A stale descriptor sends the data to the wrong LBA, which the host sees afterwards.
 */
__global__ void rd_ring_kernel(struct upcie_nvme_gqp *q, struct upcie_gpu_xlate x, uint32_t *buf,
			       uint32_t *desc, uint32_t *flags, uint32_t iters, struct tres *t)
{
	uint32_t lane = threadIdx.x & 31;
	unsigned long long errs = 0, sum = 0, wrong = 0;

	if (blockIdx.x == 1) { /* producer */
		for (uint32_t i = 0; i < iters; i++) {
			if (upcie_nvme_gqp_signal_wait(&flags[0], i + 1, UPCIE_NSEC_PER_SEC)) {
				errs++;
				break;
			}
			for (uint32_t k = lane; k < STALE_WORDS; k += 32)
				buf[k] = i + 1;
			if (lane == 0)
				desc[0] = i;
			__syncwarp();
			upcie_nvme_gqp_signal(&flags[1], i + 1); /* every lane: each released */
		}
		if (lane == 0)
			t->timeouts = errs;
		return;
	}
	{
		struct upcie_nvme_gqp_warp w;

		upcie_nvme_gqp_begin(&w, q, false);
		for (uint32_t i = 0; i < iters; i++) {
			struct upcie_nvme_sqe sqe;
			struct upcie_nvme_cqe cqe;
			uint16_t cid = UPCIE_NVME_GQP_CID_NONE;
			uint32_t lba;
			int r;

			sum += desc[0]; /* the old line in L1 */
			__syncwarp();
			if (lane == 0)
				upcie_nvme_gqp_signal(&flags[0], i + 1);
			r = upcie_nvme_gqp_signal_wait(&flags[1], i + 1, UPCIE_NSEC_PER_SEC);
			lba = desc[0];
			wrong += lane == 0 && lba != i;
			upcie_nvme_cmd_write(&sqe, 1, lba, 1, 0);
			r = r ? r
			      : upcie_nvme_gqp_enqueue_data(&w, lane == 0 ? &sqe : NULL, &x, buf,
							    512, &cid);
			upcie_nvme_gqp_ring(&w);
			r = wait_after(&w, r, cid, 500 * UPCIE_NSEC_PER_MSEC, &cqe);
			errs += lane == 0 && (r || !upcie_nvme_cqe_ok(&cqe));
			/* The producer rewrites buf next round: only after the write completed. */
			if (__any_sync(0xffffffffu, r != 0))
				break;
		}
		upcie_nvme_gqp_end(&w);
		for (int o = 16; o; o >>= 1) {
			errs += __shfl_down_sync(0xffffffffu, errs, o);
			wrong += __shfl_down_sync(0xffffffffu, wrong, o);
		}
		if (lane == 0) {
			t->bad = errs;
			t->mism = wrong;
			t->late = sum;
		}
	}
}

/*
 * Read-only loads (informational): the owner itself reads the buffer through __ldg
 * (ld.global.nc) before and after the completion. The rule in gqp_cuda.h does not depend on what
 * this shows: the PTX model promises nothing for that path.
 */
__global__ void rd_nc_kernel(struct upcie_nvme_gqp *q, struct upcie_gpu_xlate x,
			     const uint32_t *__restrict__ buf, uint32_t iters, struct tres *t)
{
	uint32_t lane = threadIdx.x & 31;
	struct upcie_nvme_gqp_warp w;
	unsigned long long stale = 0, sum = 0, errs = 0;

	upcie_nvme_gqp_begin(&w, q, false);
	for (uint32_t i = 0; i < iters; i++) {
		struct upcie_nvme_sqe sqe;
		struct upcie_nvme_cqe cqe;
		uint16_t cid = UPCIE_NVME_GQP_CID_NONE;
		uint4 v = __ldg((const uint4 *)buf + lane);
		int r;

		sum += v.x;
		upcie_nvme_cmd_read(&sqe, 1, i, 1, 0);
		r = upcie_nvme_gqp_enqueue_data(&w, lane == 0 ? &sqe : NULL, &x, buf, 512, &cid);
		upcie_nvme_gqp_ring(&w);
		r = wait_after(&w, r, cid, 500 * UPCIE_NSEC_PER_MSEC, &cqe);
		errs += lane == 0 && (r || !upcie_nvme_cqe_ok(&cqe));
		v = __ldg((const uint4 *)buf + lane);
		stale += v.x != i + 1 || v.y != i + 1 || v.z != i + 1 || v.w != i + 1;
	}
	upcie_nvme_gqp_end(&w);
	for (int o = 16; o; o >>= 1) {
		stale += __shfl_down_sync(0xffffffffu, stale, o);
		errs += __shfl_down_sync(0xffffffffu, errs, o);
	}
	if (lane == 0) {
		t->mism = stale;
		t->bad = errs;
		t->late = sum;
	}
}

/*
 * Namespace contents `ns` (STALE_ITERS LBAs), queue, then controller, for one reader run: the warp
 * controller (ce NULL) or the copy engine. Earlier memsets on the legacy stream are waited for
 * first (no persistent kernel runs yet).
 */
static int rd_setup(struct rig *r, struct cerig *ce, const uint32_t *ns)
{
	int err;

	RIG_CK(cudaStreamSynchronize(0));
	if (!ce) {
		RIG_CK(cudaMemcpy(r->ns, ns, STALE_ITERS * 512, cudaMemcpyHostToDevice));
		err = rig_queues_create(r, 1, 64, 0);
		if (!err) {
			r->ctl_smem = STALE_SMEM;
			rig_ctl_start(r, 0, 0);
		}
		return err;
	}
	memcpy(ce->ns, ns, STALE_ITERS * 512);
	cerig_ctl_init(r, ce, 0, 0, 0, 0);
	err = cerig_gqp_create(r, ce, 1, 64, 0);
	if (!err)
		err = cectl_start(&ce->c);
	return err;
}

static void rd_teardown(struct rig *r, struct cerig *ce)
{
	if (!ce) {
		rig_ctl_stop(r);
		r->ctl_smem = 0;
	} else {
		cectl_stop(&ce->c);
	}
	rig_queues_destroy(r);
}

static void test_readers(struct rig *r, struct cerig *ce)
{
	static uint32_t pat_h[STALE_ITERS * STALE_WORDS], zero_h[STALE_ITERS * STALE_WORDS];
	struct tres *t = tres_alloc(1);
	uint32_t *flags;
	struct upcie_heap_buf buf;
	struct upcie_gpu_xlate x;
	int err;

	stale_pattern(pat_h);
	RIG_CK(cudaMalloc(&flags, 256));
	err = upcie_gpu_cuda_alloc(&r->gpu, 4096, 4096, &buf);
	if (!err)
		err = upcie_gpu_cuda_xlate_create(&r->gpu, buf.vaddr, &x);
	CHECK(err == 0, "readers: buffer and translation (%d)", err);
	if (err)
		return;
	RIG_CK(cudaFuncSetAttribute(nullctl_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
				    STALE_SMEM));
	RIG_CK(cudaFuncSetAttribute(rd_block_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
				    STALE_SMEM));
	RIG_CK(cudaFuncSetAttribute(rd_grid_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
				    STALE_SMEM));
	RIG_CK(cudaFuncSetAttribute(rd_ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
				    STALE_SMEM));
	RIG_CK(cudaFuncSetAttribute(rd_nc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
				    STALE_SMEM));
	for (int c = 0; c < 2; c++) {
		struct cerig *cc = c ? ce : NULL;
		const char *who = c ? "copy-engine controller" : "warp controller";

		/* Same block. */
		RIG_CK(cudaMemset(buf.vaddr, 0, 4096));
		memset(t, 0, sizeof(*t));
		err = rd_setup(r, cc, pat_h);
		if (!err) {
			rd_block_kernel<<<1, 64, STALE_SMEM, r->s_run>>>(
			    r->gq[0].dq, x, (uint32_t *)buf.vaddr, STALE_ITERS, t);
			rig_sync(r->s_run, "reader kernel (block)");
			rd_teardown(r, cc);
		}
		CHECK(err == 0 && t->bad == 0 && t->mism == 0,
		      "reader in the owner's block (__syncthreads, data_acquire), %s: %llu of %d "
		      "lane-reads stale, %llu failed commands",
		      who, t->mism, 32 * STALE_ITERS, t->bad);

		/* Another block. */
		RIG_CK(cudaMemset(buf.vaddr, 0, 4096));
		RIG_CK(cudaMemset(flags, 0, 256));
		memset(t, 0, sizeof(*t));
		err = rd_setup(r, cc, pat_h);
		if (!err) {
			rd_grid_kernel<<<2, 32, STALE_SMEM, r->s_run>>>(
			    r->gq[0].dq, x, (uint32_t *)buf.vaddr, flags, STALE_ITERS, t);
			rig_sync(r->s_run, "reader kernel (grid)");
			rd_teardown(r, cc);
		}
		CHECK(err == 0 && t->bad == 0 && t->timeouts == 0 && t->mism == 0,
		      "reader in another block (signal, signal_wait), %s: %llu of %d lane-reads "
		      "stale, %llu failed commands, %llu timeouts",
		      who, t->mism, 32 * STALE_ITERS, t->bad, t->timeouts);

		/* The ringing warp told by a producer block. */
		RIG_CK(cudaMemset(flags, 0, 256));
		RIG_CK(cudaMemset(buf.vaddr, 0, 4096));
		RIG_CK(cudaMemset((char *)buf.vaddr + 2048, 0xff, 4)); /* desc[0]: no LBA yet */
		memset(t, 0, sizeof(*t));
		err = rd_setup(r, cc, zero_h);
		if (!err) {
			rd_ring_kernel<<<2, 32, STALE_SMEM, r->s_run>>>(
			    r->gq[0].dq, x, (uint32_t *)buf.vaddr,
			    (uint32_t *)((char *)buf.vaddr + 2048), flags, STALE_ITERS, t);
			rig_sync(r->s_run, "ringing kernel");
			rd_teardown(r, cc);
		}
		{
			static uint32_t got[STALE_ITERS * STALE_WORDS];
			unsigned long long bad_lba = 0;

			if (!c)
				RIG_CK(cudaMemcpy(got, r->ns, sizeof(got), cudaMemcpyDeviceToHost));
			else
				memcpy(got, ce->ns, sizeof(got));
			for (uint32_t i = 0; i < STALE_ITERS; i++)
				for (uint32_t k = 0; k < STALE_WORDS; k++)
					if (got[i * STALE_WORDS + k] != i + 1) {
						bad_lba++;
						break;
					}
			CHECK(err == 0 && t->bad == 0 && t->timeouts == 0 && t->mism == 0 &&
				  bad_lba == 0,
			      "ringing warp told by a producer block (signal, signal_wait), %s: "
			      "%llu stale descriptors, %llu of %d LBAs wrong, %llu failed "
			      "commands, %llu timeouts",
			      who, t->mism, bad_lba, STALE_ITERS, t->bad, t->timeouts);
		}

		/* ld.global.nc, informational. */
		RIG_CK(cudaMemset(buf.vaddr, 0, 4096));
		memset(t, 0, sizeof(*t));
		err = rd_setup(r, cc, pat_h);
		if (!err) {
			rd_nc_kernel<<<1, 32, STALE_SMEM, r->s_run>>>(
			    r->gq[0].dq, x, (const uint32_t *)buf.vaddr, STALE_ITERS, t);
			rig_sync(r->s_run, "nc kernel");
			rd_teardown(r, cc);
		}
		printf("# read-only loads (__ldg, ld.global.nc) after the completion, %s: %llu of "
		       "%d lane-reads stale, %llu failed commands (not relied on either way)\n",
		       who, t->mism, 32 * STALE_ITERS, t->bad);
	}

	/* A resident kernel told by the CPU. */
	{
		volatile uint32_t *hf = (volatile uint32_t *)rig_pinned(256);
		uint32_t *hf_dev;
		struct rd_cpu a;
		pthread_t th;

		RIG_CK(cudaHostGetDevicePointer((void **)&hf_dev, (void *)hf, 0));
		RIG_CK(cudaMemset(buf.vaddr, 0, 4096));
		RIG_CK(cudaStreamSynchronize(0));
		memset(t, 0, sizeof(*t));
		memset(&a, 0, sizeof(a));
		a.flags = hf;
		a.buf = (CUdeviceptr)(uintptr_t)buf.vaddr;
		a.stage = (uint32_t *)rig_pinned(sizeof(pat_h));
		memcpy(a.stage, pat_h, sizeof(pat_h));
		a.iters = STALE_ITERS;
		cuCtxGetCurrent(&a.ctx);
		rd_cpu_kernel<<<1, 32, 0, r->s_run>>>((uint32_t *)buf.vaddr, hf_dev, STALE_ITERS,
						      t);
		pthread_create(&th, NULL, rd_cpu_thread, &a);
		pthread_join(th, NULL);
		rig_sync(r->s_run, "reader kernel (CPU)");
		CHECK(a.fail == 0 && t->timeouts == 0 && t->mism == 0,
		      "resident kernel told by the CPU (copy engine wrote, CPU raised a flag, "
		      "signal_wait): %llu of %d lane-reads stale, %llu timeouts",
		      t->mism, 32 * STALE_ITERS, t->timeouts + a.fail);
		cudaFreeHost(a.stage);
		cudaFreeHost((void *)hf);
	}
	upcie_gpu_cuda_xlate_destroy(&r->gpu, &x);
	upcie_gpu_cuda_free(&r->gpu, &buf);
	cudaFree(flags);
	cudaFreeHost(t);
}

/*
 * CQE tearing at the queue level: the warp controller writes every completion as dw0..dw2, a
 * fence, 200 ns, dw3; the queue's polls tear on purpose (dw3 read about 8 us after dw0..dw2,
 * longer than the controller takes from the doorbell to the entry, so the first poll after a ring
 * reads dw0..dw2 before they are written and dw3 after). A user's
 * kernel submits tagged flushes and checks each completion's dw0 (the echoed tag) and dw2 (SQ
 * head, SQ id). With the re-load after the acquire no torn entry reaches it; without (the same
 * binary, test_no_reload), torn entries must be seen, or the test could not fail.
 */
__global__ void tear_q_kernel(struct upcie_nvme_gqp *q, uint32_t rounds, struct tres *t)
{
	uint32_t lane = threadIdx.x & 31;
	struct upcie_nvme_gqp_warp w;
	unsigned long long torn = 0, errs = 0, ok = 0;

	upcie_nvme_gqp_begin(&w, q, false);
	for (uint32_t i = 0; i < rounds; i++) {
		struct upcie_nvme_sqe sqe;
		struct upcie_nvme_cqe cqe;
		uint16_t cid = UPCIE_NVME_GQP_CID_NONE;
		uint32_t tag = (i << 5) | lane;
		int r;

		upcie_nvme_cmd_flush(&sqe, 1);
		sqe.cdw2 = tag;
		r = upcie_nvme_gqp_enqueue_cmd(&w, true, sqe, &cid); /* the by-value form */
		upcie_nvme_gqp_ring(&w);
		r = wait_after(&w, r, cid, 500 * UPCIE_NSEC_PER_MSEC, &cqe);
		if (r)
			errs++;
		else if (cqe.dw0 != tag || (cqe.dw2 >> 16) != 1u)
			torn++;
		else
			ok++;
		if (__any_sync(0xffffffffu, r != 0))
			break;
	}
	upcie_nvme_gqp_end(&w);
	for (int o = 16; o; o >>= 1) {
		torn += __shfl_down_sync(0xffffffffu, torn, o);
		errs += __shfl_down_sync(0xffffffffu, errs, o);
		ok += __shfl_down_sync(0xffffffffu, ok, o);
	}
	if (lane == 0) {
		t->mism = torn;
		t->bad = errs;
		t->ok = ok;
	}
}

static void test_tear_queue(struct rig *r)
{
	struct tres *t = tres_alloc(1);
	const uint32_t rounds = 2000;
	unsigned poll_ns = 8000, off = 0;

	for (int noreload = 0; noreload < 2; noreload++) {
		int err;

		RIG_CK(cudaMemcpyToSymbol(test_tear_poll_ns, &poll_ns, sizeof(poll_ns)));
		RIG_CK(cudaMemcpyToSymbol(test_no_reload, &noreload, sizeof(noreload)));
		memset(t, 0, sizeof(*t));
		err = rig_queues_create(r, 1, 64, 0);
		if (!err) {
			r->c.split_ns = 200;
			rig_ctl_start(r, 0, 0);
			tear_q_kernel<<<1, 32, 0, r->s_run>>>(r->gq[0].dq, rounds, t);
			rig_sync(r->s_run, "tear queue kernel");
			rig_ctl_stop(r);
			r->c.split_ns = 0;
			rig_queues_destroy(r);
		}
		if (!noreload)
			CHECK(
			    err == 0 && t->mism == 0 && t->bad == 0 && t->ok == 32ull * rounds,
			    "CQE written in two parts, polls that tear, re-load after the acquire: "
			    "%llu of %u completions torn, %llu failed",
			    t->mism, 32 * rounds, t->bad);
		else
			CHECK(
			    err == 0 && t->mism > 0,
			    "control: the same without the re-load hands torn entries on (%llu of "
			    "%u, %llu failed)",
			    t->mism, 32 * rounds, t->bad);
	}
	RIG_CK(cudaMemcpyToSymbol(test_tear_poll_ns, &off, sizeof(off)));
	RIG_CK(cudaMemcpyToSymbol(test_no_reload, &off, sizeof(off)));
	cudaFreeHost(t);
}

/* Lane 0 enqueues `len` bytes at buf; the command is then cancelled and reclaimed, never rung. */
__global__ void place_kernel(struct upcie_nvme_gqp *q, struct upcie_gpu_xlate x, const void *buf,
			     int *ret)
{
	uint32_t lane = threadIdx.x & 31;
	struct upcie_nvme_gqp_warp w;
	struct upcie_nvme_sqe sqe;
	uint16_t cid = UPCIE_NVME_GQP_CID_NONE;
	int r;

	upcie_nvme_gqp_begin(&w, q, false);
	upcie_nvme_cmd_read(&sqe, 1, 0, 1, 0);
	r = upcie_nvme_gqp_enqueue_data(&w, lane == 0 ? &sqe : NULL, &x, buf, 512, &cid);
	upcie_nvme_gqp_cancel(&w, r == 0 ? cid : (uint16_t)UPCIE_NVME_GQP_CID_NONE);
	upcie_nvme_gqp_reclaim(&w);
	upcie_nvme_gqp_end(&w);
	if (lane == 0)
		*ret = r;
}

/*
 * Payload placement: GPU-issued queues refuse host-memory payloads unless created with
 * UPCIE_NVME_GQP_HOST_DATA; and the P2P placement check with this GPU's real BAR1 and this
 * machine's /proc/iomem: granules inside BAR1 pass, pages of pinned host memory presented as
 * device memory (what an exporter that placed the buffer in host memory hands out) are refused.
 */
static void test_placement(struct rig *r)
{
	int *ret = (int *)rig_pinned(64);
	struct upcie_heap_buf hb, db;
	struct upcie_gpu_xlate hx, dx;
	int err;

	err = upcie_gpu_cuda_host_alloc(&r->gpu, 4096, 4096, &hb);
	if (!err)
		err = upcie_gpu_cuda_alloc(&r->gpu, 4096, 4096, &db);
	if (!err)
		err = upcie_gpu_cuda_xlate_create(&r->gpu, hb.vaddr, &hx);
	if (!err)
		err = upcie_gpu_cuda_xlate_create(&r->gpu, db.vaddr, &dx);
	CHECK(err == 0 && (hx.flags & UPCIE_GPU_XLATE_HOSTMEM) &&
		  !(dx.flags & UPCIE_GPU_XLATE_HOSTMEM),
	      "host heap translation marked host memory, device heap not (%d)", err);
	for (int f = 0; f < 2 && !err; f++) {
		int rh = 1, rd = 1;

		err = rig_queues_create(r, 1, 64, f ? UPCIE_NVME_GQP_HOST_DATA : 0);
		if (err)
			break;
		place_kernel<<<1, 32, 0, r->s_run>>>(
		    r->gq[0].dq, hx, (const void *)upcie_gpu_cuda_host_devptr(&r->gpu, hb.vaddr),
		    ret);
		rig_sync(r->s_run, "placement kernel");
		rh = *ret;
		place_kernel<<<1, 32, 0, r->s_run>>>(r->gq[0].dq, dx, db.vaddr, ret);
		rig_sync(r->s_run, "placement kernel");
		rd = *ret;
		rig_queues_destroy(r);
		if (!f)
			CHECK(rh == -EXDEV && rd == 0,
			      "GPU-issued queue: host-memory payload refused (%d), device-memory "
			      "payload taken (%d)",
			      rh, rd);
		else
			CHECK(rh == 0 && rd == 0,
			      "with UPCIE_NVME_GQP_HOST_DATA both are taken (%d, %d)", rh, rd);
	}
	upcie_gpu_cuda_xlate_destroy(&r->gpu, &hx);
	upcie_gpu_cuda_xlate_destroy(&r->gpu, &dx);
	upcie_gpu_cuda_host_free(&r->gpu, &hb);
	upcie_gpu_cuda_free(&r->gpu, &db);

	/* The P2P placement check on this machine. */
	{
		struct upcie_gpu_p2p_window w;
		struct upcie_gpu_p2p_sysram *s =
		    (struct upcie_gpu_p2p_sysram *)calloc(1, sizeof(*s));
		const size_t n = 32;
		uint64_t lut[32];
		struct upcie_dmamem mem;
		char *host = NULL;

		err =
		    upcie_gpu_p2p_window_read(r->gpu.p->dev.pci_name, r->gpu.p->dev.bar1_index, &w);
		CHECK(err == 0 && w.size >= r->gpu.p->dev.vram,
		      "this GPU's BAR1 from sysfs: %s BAR%d at 0x%" PRIx64 " + %" PRIu64
		      " GiB (%d)",
		      r->gpu.p->dev.pci_name, r->gpu.p->dev.bar1_index, w.start, w.size >> 30, err);
		if (!err)
			err = upcie_gpu_p2p_sysram_load(s);
		if (err == -EPERM || err == -EACCES) {
			SKIP("P2P placement check with the real /proc/iomem: its addresses are "
			     "hidden "
			     "(not root)");
		} else if (!err) {
			memset(&mem, 0, sizeof(mem));
			mem.size = n << 16;
			mem.lut = lut;
			mem.nlut = n;
			mem.granule_shift = 16;
			for (size_t i = 0; i < n; i++)
				lut[i] = w.start + (w.size - (n << 16)) * (i & 1) + (i << 16) / 2;
			for (size_t i = 0; i < n; i++)
				lut[i] &= ~UINT64_C(0xffff);
			err = upcie_gpu_p2p_check_dmamem(&w, s, &mem, "BAR1 granules");
			CHECK(err == 0,
			      "granules at both ends of this GPU's BAR1 pass (%d, %u System "
			      "RAM ranges)",
			      err, s->n);
			RIG_CK(cudaHostAlloc((void **)&host, n << 16, cudaHostAllocMapped));
			memset(host, 1, n << 16);
			err = 0;
			for (size_t i = 0; i < n && !err; i++)
				err = upcie_pagemap_phys(host + (i << 16), &lut[i]);
			if (err) {
				SKIP(
				    "P2P placement check against host pages: no physical addresses "
				    "(%d)",
				    err);
			} else {
				/* Each granule's first page stands for the granule. */
				last_err[0] = 0;
				err = upcie_gpu_p2p_check_dmamem(&w, s, &mem, "pinned host memory");
				CHECK(
				    err == -EXDEV && strstr(last_err, "system RAM"),
				    "pinned host memory presented as device memory is refused: %d "
				    "(\"%s\")",
				    err, last_err);
			}
			cudaFreeHost(host);
		} else {
			CHECK(0, "P2P placement check: /proc/iomem (%d)", err);
		}
		free(s);
	}
	cudaFreeHost(ret);
}

/*
 * A controller that posts one CID twice in a round: the kernel plays the controller itself, writing
 * three entries (CID a, CID a again, CID b) into the CQ of a queue with two outstanding flushes,
 * then reaps them with reap_each. The duplicate must be counted bad and the CID freed once: two
 * callbacks, and the free stack no larger than the CID table.
 */
struct dup_count {
	unsigned *n;
	__device__ void operator()(const struct upcie_nvme_cqe &) const
	{
		atomicAdd(n, 1u);
	}
};

__global__ void dup_kernel(struct upcie_nvme_gqp *q, unsigned *calls, struct tres *t)
{
	uint32_t lane = threadIdx.x & 31;
	struct upcie_nvme_gqp_warp w;
	struct upcie_nvme_sqe sqe;
	struct dup_count f = { calls };
	uint16_t cid = UPCIE_NVME_GQP_CID_NONE;
	uint32_t a, b, got;

	upcie_nvme_cmd_flush(&sqe, 1);
	upcie_nvme_gqp_begin(&w, q, false);
	upcie_nvme_gqp_enqueue(&w, lane < 2 ? &sqe : NULL, &cid);
	a = __shfl_sync(0xffffffffu, cid, 0);
	b = __shfl_sync(0xffffffffu, cid, 1);
	if (lane < 3) {
		uint32_t c = lane == 2 ? b : a;
		uint4 e = make_uint4(0, 0, 2u | (1u << 16), c | (w.phase << 16));

		nullctl_st16(&w.cq[w.cq_head + lane], e);
	}
	__threadfence();
	__syncwarp();
	got = upcie_nvme_gqp_reap_each(&w, f);
	if (lane == 0) {
		t->ok = got;
		t->bad = w.nbad;
		t->inflight_after = upcie_nvme_gqp_inflight(&w);
	}
	upcie_nvme_gqp_end(&w);
}

static void test_dup_cid(struct rig *r)
{
	struct tres *t = tres_alloc(1);
	unsigned *calls = (unsigned *)rig_pinned(64);
	struct upcie_nvme_gqp st;
	int err = rig_queues_create(r, 1, 64, 0);

	if (!err) {
		dup_kernel<<<1, 32, 0, r->s_run>>>(r->gq[0].dq, calls, t);
		rig_sync(r->s_run, "dup kernel");
		upcie_nvme_gqp_read(&r->gq[0], &st);
		rig_queues_destroy(r);
	}
	CHECK(err == 0 && t->ok == 3 && *calls == 2 && t->bad == 1 && st.nbad == 1 &&
		  st.nfree == st.ncids && t->inflight_after == 0,
	      "one CID posted twice in a round: %llu entries consumed, %u callbacks, %llu bad, "
	      "%u of %u CIDs free",
	      t->ok, *calls, t->bad, err ? 0 : st.nfree, err ? 0 : st.ncids);
	cudaFreeHost(calls);
	cudaFreeHost(t);
}

static bool want(int argc, char **argv, const char *g)
{
	if (argc < 2)
		return true;
	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], g))
			return true;
	return false;
}

/*
 * Groups (default: all, in this order): base (provider, queues, data, mirror against the warp
 * null controller), stale (the stale-read scenario against the warp null controller), tear (also
 * at the queue level, polls that tear on purpose), readers (every reader kind outside the owning
 * warp, warp and copy-engine controllers), place (payload placement, the P2P placement check, a
 * CID posted twice),
 * ce (queue, data, stale-read and mirror tests against the copy-engine controller), clear, life
 * (peer-write ordering refused, destroy and mirror lifecycle), shutdown (provider close with a
 * stuck mirror warp; ends the provider).
 */
int main(int argc, char **argv)
{
	struct rig r;
	struct hog h;
	int err, ndev = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	rig_eager();
	upcie_log_set_handler(capture, NULL);
	rig_watchdog(getenv("TEST_WATCHDOG") ? atoi(getenv("TEST_WATCHDOG")) : 60);
	memset(&h, 0, sizeof(h));
	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&ndev) != CUDA_SUCCESS || !ndev) {
		printf("1..0 # SKIP no CUDA device\n0 passed, 0 failed, 0 skipped\n");
		return 0;
	}
	if (want(argc, argv, "base")) {
		test_import_path();
		test_context();
	}
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
		if (want(argc, argv, "base")) {
			test_export_registry(&r.gpu);
			test_queues(&r);
			test_data(&r, 1, 0);
			test_data(&r, 64, 0);
			test_data(&r, 8, UPCIE_NVME_GQP_SQ_HOSTMEM);
			test_mirror(&r);
		}
		if (want(argc, argv, "stale"))
			test_stale_warp(&r);
		if (want(argc, argv, "tear")) {
			test_tear(&r);
			test_tear_queue(&r);
		}
		if (want(argc, argv, "readers")) {
			struct cerig ce;

			cerig_open(&r, &ce, 16 * MiB);
			test_readers(&r, &ce);
			cerig_close(&ce);
		}
		if (want(argc, argv, "place")) {
			test_placement(&r);
			test_dup_cid(&r);
		}
		if (want(argc, argv, "ce")) {
			struct cerig ce;

			cerig_open(&r, &ce, 16 * MiB);
			test_ce_queues(&r, &ce);
			test_ce_data(&r, &ce, 4);
			test_ce_mirror(&r, &ce);
			cerig_close(&ce);
		}
		if (want(argc, argv, "clear"))
			test_clear(&r, &h);
		if (want(argc, argv, "life")) {
			test_peer_order_refused(&r);
			test_destroy_busy(&r);
			test_mirror_life(&r, &h);
		}
		if (want(argc, argv, "shutdown"))
			test_shutdown_stuck(&r, &h);
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
