// SPDX-License-Identifier: BSD-3-Clause
/*
 * Kernels that exist to be compiled and disassembled (check-disasm.sh) and to prove that the HIP
 * device layer builds: each isolates one instruction sequence the queue code relies on, and the
 * last one is the whole submit-and-wait path of nvme/gqp_hip.h. Never launched here: no AMD GPU.
 */
#include <upcie/nvme/gqp_hip.h>

/* The doorbell store (RDNA: drain, glc slc dlc store, GL1/GL0 invalidate). */
extern "C" __global__ void upcie_hipchk_doorbell(volatile uint32_t *db, uint32_t v)
{
	upcie_nvme_port_doorbell(db, v);
}

/* The completion poll load (RDNA: GL1/GL0 invalidate first). */
extern "C" __global__ void upcie_hipchk_poll(const uint32_t *p, uint32_t *out)
{
	*out = upcie_nvme_port_load32(p);
}

/* The wall clock (never clock64()). */
extern "C" __global__ void upcie_hipchk_clock(uint64_t *out)
{
	*out = upcie_nvme_port_time_ns();
}

/* Submit one command and wait for it: the whole device path. */
extern "C" __global__ void upcie_hipchk_io(struct upcie_nvme_gqp_hip *q,
					   const struct upcie_nvme_sqe *sqe, uint64_t timeout_ns,
					   struct upcie_nvme_cqe *cqe, int *ret)
{
	/* The builtins, not threadIdx/blockIdx: ROCm 5.2 implements those in the device library,
	 * which it does not ship for GFX11 (this file builds with -nogpulib). */
	if (__builtin_amdgcn_workitem_id_x() == 0 && __builtin_amdgcn_workgroup_id_x() == 0)
		*ret = upcie_nvme_gqp_hip_io(q, sqe, timeout_ns, cqe);
}
