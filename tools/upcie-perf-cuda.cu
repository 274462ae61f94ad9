// SPDX-License-Identifier: BSD-3-Clause
// upcie-perf with its GPU-initiated mode (tools/upcie-perf-gpu.cuh): the same program as
// tools/upcie-perf.c, compiled by nvcc with UPCIE_PERF_GPU.
#define UPCIE_PERF_GPU 1
#include "upcie-perf.c"
