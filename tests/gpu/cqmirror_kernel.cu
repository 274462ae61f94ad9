/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The completion-mirror kernel as its own translation unit: gen-cqmirror-ptx.sh compiles this to
 * the PTX in include/upcie/gpuq/cqmirror_ptx_cuda.h, and CI compiles it like every CUDA source.
 */
#define UPCIE_NVME_CQMIRROR_KERNEL 1
#include <upcie/gpuq/cqmirror_cuda.h>
