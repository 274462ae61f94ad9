/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_gpu.cu with batches published by __threadfence_system() (fence.sc.sys, which adds an L1
 * invalidation) instead of the library's fence.release.sys: `bench_gpu_scfence qd32` beside
 * `bench_gpu qd32`.
 */
#define BENCH_SCFENCE 1
#include "bench_gpu.cu"
