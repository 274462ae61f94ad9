/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_gpu.cu with the queue path's SQE stores made sixteen 4-byte volatile stores, to compare
 * SQ_HOSTMEM queues at the queue level: `bench_gpu_store4 hostsq` beside `bench_gpu hostsq`.
 */
#define BENCH_STORE4 1
#include "bench_gpu.cu"
