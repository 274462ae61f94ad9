/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Kernels that tests/gpu/check-order-ptx.sh compiles to PTX to check the ordering points of the
 * completion paths: the GPU-resident queue pair's reap (both forms) and the portable core's reap
 * in device code. Each reads a word of a buffer after the completion, as a caller would.
 */
#include <upcie/gpuq/gqp_cuda.h>
#include <upcie/nvme/qpair.h>

struct upcie_ordchk_sink {
	uint32_t *out;
	const uint32_t *data;
	__device__ void operator()(const struct upcie_nvme_cqe &e) const
	{
		*out += data[e.dw0 & 63];
	}
};

extern "C" __global__ void upcie_ordchk_gqp_reap(struct upcie_nvme_gqp *q, const uint32_t *data,
						 uint32_t *out)
{
	struct upcie_nvme_gqp_warp w;
	uint32_t n;

	upcie_nvme_gqp_begin(&w, q, false);
	n = upcie_nvme_gqp_reap(&w);
	upcie_nvme_gqp_end(&w);
	out[threadIdx.x] = n + data[threadIdx.x];
}

extern "C" __global__ void upcie_ordchk_gqp_reap_each(struct upcie_nvme_gqp *q,
						      const uint32_t *data, uint32_t *out)
{
	struct upcie_nvme_gqp_warp w;
	struct upcie_ordchk_sink f = { out + threadIdx.x, data };

	upcie_nvme_gqp_begin(&w, q, false);
	upcie_nvme_gqp_reap_each(&w, f);
	upcie_nvme_gqp_end(&w);
}

extern "C" __global__ void upcie_ordchk_core_reap(struct upcie_nvme_qpair *qp, const uint32_t *data,
						  uint32_t *out)
{
	int n = upcie_nvme_qpair_reap(qp, 1);

	out[0] = (uint32_t)n + data[0];
}

/* A user's kernel that breaks the read-only-load rule: the payload through __ldg after the reap
 * (tests/gpu/check-nc-ptx.sh must report it, and only it). */
extern "C" __global__ void upcie_ordchk_nc_user(struct upcie_nvme_gqp *q,
						const uint32_t *__restrict__ data, uint32_t *out)
{
	struct upcie_nvme_gqp_warp w;
	uint32_t n;

	upcie_nvme_gqp_begin(&w, q, false);
	n = upcie_nvme_gqp_reap(&w);
	upcie_nvme_gqp_end(&w);
	out[threadIdx.x] = n + __ldg(&data[threadIdx.x]);
}
