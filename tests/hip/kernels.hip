// SPDX-License-Identifier: BSD-3-Clause
/*
 * Kernels that exist to be compiled and disassembled (check-disasm.sh) and to prove that the HIP
 * device layer builds: each isolates one instruction sequence the queue code relies on, and the
 * last one is the whole submit-and-wait path of gpuq/gqp_hip.h; the completion mirror's kernel is
 * instantiated too. Never launched here: no AMD GPU.
 */
#include <upcie/gpuq/cqmirror_hip.h>
#include <upcie/gpuq/gqp_hip.h>

/* The completion mirror's resident kernel (gpuq/cqmirror_hip.h), as the host side launches it. */
template __global__ void upcie_nvme_cqmirror_hip_kernel<0>(struct upcie_nvme_cqmirror_hip_table *);

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
	*out = upcie_nvme_port_clock();
}

/* The core's own timed wait in device code: the deadline clock at the queue pair's rate. */
extern "C" __global__ void upcie_hipchk_qpwait(struct upcie_nvme_qpair *qp, uint16_t cid,
					       uint64_t timeout_ns, int *ret)
{
	if (__builtin_amdgcn_workitem_id_x() == 0 && __builtin_amdgcn_workgroup_id_x() == 0)
		*ret = upcie_nvme_qpair_wait(qp, cid, timeout_ns);
}

/* The consumer of a read: wait for the completion, then read the data with a plain load, as a
 * user's kernel would (no fence of its own); data[21] is the load the check looks for. */
extern "C" __global__ void upcie_hipchk_consume(struct upcie_nvme_gqp_hip *q,
						const struct upcie_nvme_sqe *sqe,
						const uint32_t *data, uint32_t *out)
{
	if (__builtin_amdgcn_workitem_id_x() == 0 && __builtin_amdgcn_workgroup_id_x() == 0 &&
	    !upcie_nvme_gqp_hip_io(q, sqe, 1000000, (struct upcie_nvme_cqe *)0))
		*out = data[21];
}

/* Control for the check: the same consumer polling the phase tag by hand, with no reap and so no
 * acquire; the consumer rule must fail on it. */
extern "C" __global__ void upcie_hipchk_consume_bare(const struct upcie_nvme_cqe *cq,
						     const uint32_t *data, uint32_t *out)
{
	if (__builtin_amdgcn_workitem_id_x() == 0 && __builtin_amdgcn_workgroup_id_x() == 0) {
		while (!(upcie_nvme_port_load32(&cq->dw3) & (1u << 16)))
			;
		*out = data[21];
	}
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

/* Readers and producers outside the owner thread (gqp_hip.h, "Readers outside the owning
 * thread"); data[21] is the load or store the check looks for. */

/* A reader that polls a flag of its own, then acquires, then reads the data with a plain load. */
extern "C" __global__ void upcie_hipchk_reader(const uint32_t *flag, const uint32_t *data,
					       uint32_t *out)
{
	if (__builtin_amdgcn_workitem_id_x() == 0 && __builtin_amdgcn_workgroup_id_x() == 0) {
		while (!upcie_nvme_port_load32(flag)) {
		}
		upcie_nvme_gqp_hip_data_acquire();
		*out = data[21];
	}
}

/* A reader that polls a flag of its own with a volatile load (no memory clobber, unlike the
 * library's poll loads), then acquires, then reads the data with a plain load; nothing is stored
 * before that load. The clobber at the end of data_acquire() is what keeps it a vector load: the
 * fence alone leaves clang 15 free to make it a scalar load (s_load). */
extern "C" __global__ void upcie_hipchk_reader_volatile(const uint32_t *flag, const uint32_t *data,
							uint32_t *out)
{
	if (__builtin_amdgcn_workitem_id_x() == 0 && __builtin_amdgcn_workgroup_id_x() == 0) {
		while (!*(const volatile uint32_t *)flag) {
		}
		upcie_nvme_gqp_hip_data_acquire();
		*out = data[21];
	}
}

/* A reader told by a flag through signal_wait(), then a plain load. */
extern "C" __global__ void upcie_hipchk_sigwait(const uint32_t *flag, uint32_t v, uint64_t khz,
						const uint32_t *data, uint32_t *out, int *ret)
{
	if (__builtin_amdgcn_workitem_id_x() == 0 && __builtin_amdgcn_workgroup_id_x() == 0) {
		int r = upcie_nvme_gqp_hip_signal_wait(flag, v, 1000000, khz);

		*ret = r;
		if (!r)
			*out = data[21];
	}
}

/* Control for the check: the same reader with the data behind a const __restrict__ parameter,
 * which the compiler reads with a scalar load (s_load) no acquire orders; the data rule must
 * fail on it. Never write a reader like this. */
extern "C" __global__ void upcie_hipchk_sigwait_restrict(const uint32_t *flag, uint32_t v,
							 uint64_t khz,
							 const uint32_t *__restrict__ data,
							 uint32_t *out, int *ret)
{
	if (__builtin_amdgcn_workitem_id_x() == 0 && __builtin_amdgcn_workgroup_id_x() == 0) {
		int r = upcie_nvme_gqp_hip_signal_wait(flag, v, 1000000, khz);

		*ret = r;
		if (!r)
			*out = data[21];
	}
}

/* Control for the check: a reader whose acquire is agent scope, which on gfx90a leaves the L2
 * alone; the data rule must fail on it on CDNA (RDNA compiles both scopes alike). */
extern "C" __global__ void upcie_hipchk_reader_agent(const uint32_t *flag, const uint32_t *data,
						     uint32_t *out)
{
	if (__builtin_amdgcn_workitem_id_x() == 0 && __builtin_amdgcn_workgroup_id_x() == 0) {
		while (!upcie_nvme_port_load32(flag)) {
		}
		__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent");
		*out = data[21];
	}
}

/* A producer of a write command's payload: its store, data_release(), then a plain flag store. */
extern "C" __global__ void upcie_hipchk_producer(uint32_t *data, uint32_t v,
						 volatile uint32_t *flag)
{
	if (__builtin_amdgcn_workitem_id_x() == 0 && __builtin_amdgcn_workgroup_id_x() == 0) {
		data[21] = v;
		upcie_nvme_gqp_hip_data_release();
		*flag = 1;
	}
}

/* A producer that publishes with signal(). */
extern "C" __global__ void upcie_hipchk_signal(uint32_t *data, uint32_t v, uint32_t *flag)
{
	if (__builtin_amdgcn_workitem_id_x() == 0 && __builtin_amdgcn_workgroup_id_x() == 0) {
		data[21] = v;
		upcie_nvme_gqp_hip_signal(flag, v);
	}
}
