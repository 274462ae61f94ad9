/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A controller model with host memory and a data buffer, for the unit tests of nvme/ctrl.h and
 * nvme/ns.h: 16 MiB of host DMA memory (arithmetic translation), 4 MiB of data memory with
 * 4 KiB granules at shuffled device addresses, namespace 1 of 8192 blocks of 512 bytes, and an
 * optional namespace table (nvme_ns_model.h). Knobs of the model are set between setup and
 * start. A test instrument.
 */
#ifndef UPCIE_TEST_NVME_CTRL_RIG_H
#define UPCIE_TEST_NVME_CTRL_RIG_H

#include <upcie/base/feature.h>

#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#include "nvme_ctrl_model.h"

#define RIG_MiB	      (UINT64_C(1) << 20)
#define RIG_HOST_IOVA UINT64_C(0x40000000)
#define RIG_DATA_IOVA UINT64_C(0x80000000)
#define RIG_NS_BLOCKS 8192u
#define RIG_LBA	      512u
#define RIG_DATA_SIZE (4 * RIG_MiB)

struct rig {
	struct nvme_cmodel cm;
	struct nvme_nsm nsm;
	struct nvme_model_iomap im;
	struct nvme_model_rng rng;
	uint8_t *ns;
	void *host_va, *data_va;
	struct upcie_dmamem host, data; /* data: 4 KiB granules, shuffled */
	struct upcie_nvme_ctrl c;
	bool started;
};

static inline void rig_log(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	printf("#   log: %s\n", msg);
}

static inline void rig_setup(struct rig *r)
{
	memset(r, 0, sizeof(*r));
	r->rng.s = 0x1234567;
	r->ns = (uint8_t *)calloc(RIG_NS_BLOCKS, RIG_LBA);
	r->host_va = aligned_alloc(2 * RIG_MiB, 16 * RIG_MiB);
	r->data_va = aligned_alloc(2 * RIG_MiB, RIG_DATA_SIZE);
	memset(r->host_va, 0, 16 * RIG_MiB);
	upcie_dmamem_init_arith(&r->host, r->host_va, 16 * RIG_MiB, RIG_HOST_IOVA);
	nvme_model_mem_lut(&r->data, r->data_va, RIG_DATA_SIZE, 12, RIG_DATA_IOVA, true, &r->rng);
	nvme_model_iomap_add(&r->im, &r->host);
	nvme_model_iomap_add(&r->im, &r->data);
	nvme_cmodel_init(&r->cm, &r->im, r->ns, RIG_NS_BLOCKS, RIG_LBA);
}

/* Serve namespaces from the table (fill it with nvme_nsm_add() before start). */
static inline void rig_use_nsm(struct rig *r)
{
	r->cm.nsm = &r->nsm;
}

static inline int rig_start(struct rig *r)
{
	r->started = nvme_cmodel_start(&r->cm) == 0;
	return r->started ? 0 : -1;
}

static inline int rig_ctrl(struct rig *r, const struct upcie_nvme_ctrl_opts *o)
{
	return upcie_nvme_ctrl_init(&r->c, r->cm.regs, r->cm.regs_size, &r->host, o);
}

/*
 * Wait (up to 1 s) until the model holds `n` admin commands it has not completed (the
 * Asynchronous Event Requests the driver keeps, and any held on purpose). False on the timeout.
 */
static inline bool rig_admin_held(struct rig *r, uint32_t n)
{
	uint64_t t0 = upcie_time_ns();

	while (__atomic_load_n(&r->cm.admin.nheld, __ATOMIC_ACQUIRE) != n) {
		if (upcie_time_ns() - t0 > UPCIE_NSEC_PER_SEC)
			return false;
		sched_yield();
	}
	return true;
}

static inline void rig_teardown(struct rig *r)
{
	upcie_nvme_ctrl_close(&r->c);
	if (r->started)
		nvme_cmodel_stop(&r->cm);
	nvme_cmodel_fini(&r->cm);
	nvme_nsm_fini(&r->nsm);
	upcie_dmamem_destroy(&r->data);
	upcie_dmamem_destroy(&r->host);
	nvme_model_iomap_fini(&r->im);
	free(r->ns);
	free(r->host_va);
	free(r->data_va);
}

/* Pattern byte of (tag, byte offset). */
/* A request of a test with its callback count (req.ctx = the struct, req.cb = rig_one_cb). */
struct rig_one {
	struct upcie_nvme_req req;
	int calls;
	int err;
};

static inline void rig_one_cb(struct upcie_nvme_req *req)
{
	struct rig_one *o = (struct rig_one *)req->ctx;

	o->calls++;
	o->err = req->err;
}

static inline uint8_t rig_pat(uint32_t tag, uint64_t off)
{
	uint64_t x = (off >> 3) * 0x9e3779b97f4a7c15ull + tag;

	return (uint8_t)((x >> 29) ^ off);
}

static inline void rig_fill(void *p, uint64_t len, uint32_t tag)
{
	for (uint64_t i = 0; i < len; i++)
		((uint8_t *)p)[i] = rig_pat(tag, i);
}

static inline bool rig_same(const void *p, uint64_t len, uint32_t tag)
{
	for (uint64_t i = 0; i < len; i++)
		if (((const uint8_t *)p)[i] != rig_pat(tag, i))
			return false;
	return true;
}

#endif /* UPCIE_TEST_NVME_CTRL_RIG_H */
