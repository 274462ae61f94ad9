/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Ordering probe: which load or fence after an L1-bypassing poll makes data that another agent
 * wrote before the polled flag visible to a plain load that had the old line in its L1, and what
 * each costs. Writers: a warp on another SM (stores cached at L2, __threadfence, flag) and the copy
 * engine (cuMemcpyHtoDAsync of the data, then of the flag, on one stream, issued by a CPU thread).
 * Prints the device's GPUDirect RDMA ordering attributes too. A measuring instrument for
 * docs/results/gpu-queues.md, not a test.
 */
#include <cuda.h>
#include <cuda_runtime.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CK(x)                                                                                      \
	do {                                                                                       \
		cudaError_t e_ = (x);                                                              \
		if (e_ != cudaSuccess) {                                                           \
			printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_));    \
			exit(2);                                                                   \
		}                                                                                  \
	} while (0)

#define ITERS 500
#define WORDS 128 /* 512 bytes of data per iteration: lane L reads words 4L..4L+3 */

__device__ static inline uint64_t now(void)
{
	uint64_t t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/* The poll (V: 0 volatile, 1 ld.acquire.gpu, 2 ld.acquire.sys), then the ordering point. */
template <int V> __device__ static inline uint32_t poll(const uint32_t *p)
{
	uint32_t v;

	if (V == 5)
		asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	else if (V == 6)
		asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	else
		asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}

template <int V> __device__ static inline void order(void)
{
	if (V == 1)
		asm volatile("fence.acquire.gpu;" ::: "memory");
	else if (V == 2)
		asm volatile("fence.acquire.sys;" ::: "memory");
	else if (V == 3)
		asm volatile("fence.acq_rel.gpu;" ::: "memory");
	else if (V == 4)
		__threadfence();
	else if (V == 7)
		__threadfence_system();
	else if (V == 8)
		asm volatile("fence.acq_rel.sys;" ::: "memory");
	else
		asm volatile("" ::: "memory");
}

/*
 * Reader: warm the buffer into L1 with plain loads, ask for iteration i, poll for it, order, read
 * the buffer with plain loads again; count lanes that saw a word other than i.
 */
template <int V>
__global__ void reader(const uint32_t *buf, uint32_t *req, const uint32_t *done,
		       volatile uint32_t *req_host, unsigned long long *res)
{
	uint32_t lane = threadIdx.x & 31;
	unsigned long long stale = 0, sum = 0, timeouts = 0;

	for (uint32_t i = 1; i <= ITERS; i++) {
		uint4 w = ((const uint4 *)buf)[lane]; /* plain: cached in L1 */
		uint64_t t0;

		sum += w.x + w.y + w.z + w.w;
		__syncwarp();
		if (lane == 0) {
			asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(req), "r"(i)
				     : "memory");
			if (req_host)
				*req_host = i;
		}
		t0 = now();
		while (poll<V>(done) != i)
			if (now() - t0 > 20000000ull) {
				timeouts++;
				break;
			}
		order<V>();
		w = ((const uint4 *)buf)[lane];
		stale += (w.x != i) + (w.y != i) + (w.z != i) + (w.w != i) > 0;
		__syncwarp();
	}
	for (int o = 16; o; o >>= 1) {
		stale += __shfl_down_sync(0xffffffffu, stale, o);
		sum += __shfl_down_sync(0xffffffffu, sum, o);
	}
	if (lane == 0) {
		res[0] = stale;
		res[1] = timeouts;
		res[2] = sum;
	}
}

/* Writer warp on another SM: stores cached at L2, a GPU fence, the flag. */
__global__ void writer(uint32_t *buf, const uint32_t *req, uint32_t *done)
{
	uint32_t lane = threadIdx.x & 31;

	for (uint32_t i = 1; i <= ITERS; i++) {
		uint64_t t0 = now();

		while (poll<0>(req) != i)
			if (now() - t0 > 20000000ull)
				return;
		for (uint32_t k = lane; k < WORDS; k += 32)
			asm volatile("st.global.cg.u32 [%0], %1;" ::"l"(buf + k), "r"(i)
				     : "memory");
		__threadfence();
		__syncwarp();
		if (lane == 0)
			asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(done), "r"(i)
				     : "memory");
	}
}

struct ce_arg {
	volatile uint32_t *req_host;
	CUdeviceptr buf, done;
	uint32_t *stage; /* pinned: ITERS x (WORDS + 1) words */
	CUstream s;
	CUcontext ctx;
	int fails;
};

/* Copy-engine writer: for each request, the data then the flag, on one stream. */
static void *ce_writer(void *p)
{
	struct ce_arg *a = (struct ce_arg *)p;

	cuCtxSetCurrent(a->ctx);
	for (uint32_t i = 1; i <= ITERS; i++) {
		uint32_t *st = a->stage + (size_t)(i - 1) * (WORDS + 1);
		int spins = 0;

		while (*a->req_host != i) {
			if (++spins > 20000000) {
				a->fails++;
				return NULL;
			}
		}
		for (int k = 0; k < WORDS; k++)
			st[k] = i;
		st[WORDS] = i;
		if (cuMemcpyHtoDAsync(a->buf, st, WORDS * 4, a->s) != CUDA_SUCCESS ||
		    cuMemcpyHtoDAsync(a->done, st + WORDS, 4, a->s) != CUDA_SUCCESS)
			a->fails++;
	}
	cuStreamSynchronize(a->s);
	return NULL;
}

typedef void (*reader_fn)(const uint32_t *, uint32_t *, const uint32_t *, volatile uint32_t *,
			  unsigned long long *);

/* Cost: one warp, n x (poll of a word that is there, ordering, one plain 16-byte load). */
template <int V>
__global__ void cost(const uint32_t *flag, const uint32_t *data, uint32_t n,
		     unsigned long long *res)
{
	uint32_t lane = threadIdx.x & 31;
	unsigned long long sum = 0;
	uint64_t t0 = now();

	for (uint32_t i = 0; i < n; i++) {
		sum += poll<V>(flag);
		order<V>();
		uint4 w = ((const uint4 *)data)[(lane + i) & 255];
		sum += w.x;
	}
	if (lane == 0) {
		res[0] = now() - t0;
		res[1] = sum;
	}
}

int main(void)
{
	static const char *names[] = { "ld.volatile, nothing",
				       "ld.volatile, fence.acquire.gpu",
				       "ld.volatile, fence.acquire.sys",
				       "ld.volatile, fence.acq_rel.gpu",
				       "ld.volatile, __threadfence() (fence.sc.gpu)",
				       "ld.acquire.gpu poll",
				       "ld.acquire.sys poll",
				       "ld.volatile, __threadfence_system() (fence.sc.sys)",
				       "ld.volatile, fence.acq_rel.sys" };
	static reader_fn rk[] = { reader<0>, reader<1>, reader<2>, reader<3>, reader<4>,
				  reader<5>, reader<6>, reader<7>, reader<8> };
	static void (*const ck[])(const uint32_t *, const uint32_t *, uint32_t,
				  unsigned long long *) = { cost<0>, cost<1>, cost<2>,
							    cost<3>, cost<4>, cost<5>,
							    cost<6>, cost<7>, cost<8> };
	const int NV = 9;
	uint32_t *buf, *req, *done, *data;
	volatile uint32_t *req_host;
	unsigned long long *res;
	cudaStream_t s_r, s_w;
	CUdevice dev;
	int v = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	/* Lazy loading would make the first launch of a kernel wait for the other to end. */
	setenv("CUDA_MODULE_LOADING", "EAGER", 1);
	CK(cudaSetDevice(0));
	cuDeviceGet(&dev, 0);
	cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING, dev);
	printf(
	    "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING = %d (0 none, 100 owner, 200 all "
	    "devices)\n",
	    v);
	cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, dev);
	printf("CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = %d\n", v);
	cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS, dev);
	printf("CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS = 0x%x\n", v);
	cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
	printf("multiprocessors = %d\n", v);
	cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, dev);
	printf("max blocks per multiprocessor = %d\n", v);

	CK(cudaMalloc(&buf, 4096));
	CK(cudaMalloc(&req, 4096));
	CK(cudaMalloc(&done, 4096));
	CK(cudaMalloc(&data, 65536));
	CK(cudaMemset(data, 0, 65536));
	CK(cudaHostAlloc((void **)&req_host, 4096, cudaHostAllocMapped));
	CK(cudaHostAlloc((void **)&res, 4096, cudaHostAllocMapped));
	CK(cudaStreamCreateWithFlags(&s_r, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&s_w, cudaStreamNonBlocking));

	printf("\n| poll, ordering | writer | stale reads of %d | timeouts |\n|---|---|---|---|\n",
	       ITERS);
	for (int w = 0; w < 2; w++)
		for (int i = 0; i < NV; i++) {
			CK(cudaMemset(buf, 0, 4096));
			CK(cudaMemset(req, 0, 4096));
			CK(cudaMemset(done, 0, 4096));
			CK(cudaDeviceSynchronize());
			*req_host = 0;
			memset(res, 0, 64);
			if (w == 0) {
				writer<<<1, 32, 0, s_w>>>(buf, req, done);
				rk[i]<<<1, 32, 0, s_r>>>(buf, req, done, NULL, res);
				CK(cudaDeviceSynchronize());
			} else {
				struct ce_arg a;
				pthread_t th;

				memset(&a, 0, sizeof(a));
				a.req_host = req_host;
				a.buf = (CUdeviceptr)buf;
				a.done = (CUdeviceptr)done;
				CK(cudaHostAlloc((void **)&a.stage, ITERS * (WORDS + 1) * 4, 0));
				a.s = (CUstream)s_w;
				cuCtxGetCurrent(&a.ctx);
				volatile uint32_t *rh_dev;
				CK(cudaHostGetDevicePointer((void **)&rh_dev, (void *)req_host, 0));
				rk[i]<<<1, 32, 0, s_r>>>(buf, req, done, rh_dev, res);
				pthread_create(&th, NULL, ce_writer, &a);
				pthread_join(th, NULL);
				CK(cudaDeviceSynchronize());
				CK(cudaFreeHost(a.stage));
				res[1] += a.fails;
			}
			printf("| %s | %s | %llu | %llu |\n", names[i],
			       w ? "copy engine (cuMemcpyHtoDAsync)" : "warp on another SM", res[0],
			       res[1]);
		}

	printf("\n| poll, ordering | ns per (poll + ordering + 16-B plain load), 1 warp, 20000 |\n"
	       "|---|---|\n");
	for (int i = 0; i < NV; i++) {
		const uint32_t n = 20000;

		CK(cudaMemset(done, 0, 4096));
		ck[i]<<<1, 32, 0, s_r>>>(done, data, n, res);
		CK(cudaDeviceSynchronize());
		printf("| %s | %.1f |\n", names[i], (double)res[0] / n);
	}
	return 0;
}
