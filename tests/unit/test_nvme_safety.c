/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Data safety against the controller model: with a volatile write cache (Identify VWC) close
 * and shutdown Flush before CC.SHN, namespace by namespace or once for all (VWC bits 2:1), on a
 * live I/O queue or a temporary one; a shutdown that never completes still had the Flush
 * before it; no Flush without a cache. NVM subsystem reset (CAP.NSSRS): the NSSR write, the
 * controller and its queues back, CSTS.NSSRO seen. (That the acknowledging write of 1 clears
 * NSSRO is beyond a model whose registers are plain memory.)
 */
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#include "check.h"
#include "nvme_ctrl_rig.h"

static int write_some(struct rig *r, struct upcie_nvme_ioq *q, uint32_t nsid)
{
	struct upcie_nvme_ns ns;
	int err = upcie_nvme_ns_open(&ns, &r->c, nsid);

	rig_fill(r->data_va, 4096, nsid);
	if (!err)
		err = upcie_nvme_ioq_write_sync(q, &ns, 0, &r->data, 0, 4096, NULL);
	return err;
}

static void t_flush(void)
{
	struct upcie_nvme_ioq q;
	uint32_t creates;
	uint64_t t0;
	struct rig r;
	int err;

	/* a cache, no flush-all: one Flush per active namespace, on the caller's queue */
	rig_setup(&r);
	nvme_nsm_add(&r.nsm, 1, 256, 512, 0, false, 0, 0);
	nvme_nsm_add(&r.nsm, 3, 256, 512, 0, false, 0, 0);
	rig_use_nsm(&r);
	r.cm.vwc = 1;
	rig_start(&r);
	rig_ctrl(&r, NULL);
	upcie_nvme_ioq_create(&q, &r.c, NULL);
	CHECK_EQ(write_some(&r, &q, 3), 0, "written into the cache");
	creates = r.cm.n_create_cq;
	err = upcie_nvme_ctrl_close(&r.c);
	CHECK(err == 0 && r.cm.n_flush == 2 && r.cm.flushes_at_shutdown == 2 &&
		  r.cm.n_shutdown == 1 && r.cm.n_create_cq == creates,
	      "close: 2 Flushes (namespaces 1 and 3) on the open queue, then the shutdown "
	      "(%u flushes, %u before CC.SHN)",
	      r.cm.n_flush, r.cm.flushes_at_shutdown);
	rig_teardown(&r);

	/* flush-all supported (VWC bits 2:1 = 11b), no queue open: a temporary one, one Flush */
	rig_setup(&r);
	r.cm.vwc = 7;
	rig_start(&r);
	rig_ctrl(&r, NULL);
	creates = r.cm.n_create_cq;
	err = upcie_nvme_ctrl_shutdown(&r.c);
	CHECK(err == 0 && r.cm.n_flush == 1 && r.cm.last_flush_nsid == UPCIE_NVME_NSID_ALL &&
		  r.cm.flushes_at_shutdown == 1 && r.cm.n_create_cq == creates + 1 &&
		  r.cm.n_delete_cq == r.cm.n_create_cq,
	      "shutdown with no queue open: one Flush of NSID FFFFFFFFh through a temporary "
	      "queue, deleted again");
	rig_teardown(&r);

	/* the shutdown never completes: the data was flushed before it */
	rig_setup(&r);
	r.cm.vwc = 7;
	r.cm.hold_shutdown = true;
	rig_start(&r);
	rig_ctrl(&r, NULL);
	t0 = upcie_time_ns();
	err = upcie_nvme_ctrl_close(&r.c);
	CHECK(err == -ETIMEDOUT && r.cm.n_flush == 1,
	      "shutdown timed out after %llu ms, the Flush had completed before it",
	      (unsigned long long)((upcie_time_ns() - t0) / UPCIE_NSEC_PER_MSEC));
	rig_teardown(&r);

	/* no cache, no Flush */
	rig_setup(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	upcie_nvme_ioq_create(&q, &r.c, NULL);
	write_some(&r, &q, 1);
	upcie_nvme_ctrl_close(&r.c);
	CHECK(r.cm.n_flush == 0 && r.cm.n_shutdown == 1, "no volatile write cache: no Flush");
	rig_teardown(&r);
}

static void t_nssr(void)
{
	struct upcie_nvme_ioq q;
	struct rig r;
	int err;

	rig_setup(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	CHECK_EQ(upcie_nvme_ctrl_subsystem_reset(&r.c), -EOPNOTSUPP,
		 "CAP.NSSRS clear: no subsystem reset");
	rig_teardown(&r);

	rig_setup(&r);
	nvme_cmodel_set_cap(&r.cm,
			    nvme_cmodel_rd64(&r.cm, UPCIE_NVME_REG_CAP) | (UINT64_C(1) << 36));
	rig_start(&r);
	rig_ctrl(&r, NULL);
	upcie_nvme_ioq_create(&q, &r.c, NULL);
	CHECK_EQ(write_some(&r, &q, 1), 0, "I/O before");
	err = upcie_nvme_ctrl_subsystem_reset(&r.c);
	CHECK(err == 0 && r.cm.n_nssr == 1 && r.c.state == UPCIE_NVME_CTRL_READY,
	      "NVM subsystem reset: NSSR written, controller back (%d)", err);
	CHECK_EQ(r.c.nssr_seen, 1,
		 "CSTS.NSSRO seen on the way back (and written back to clear it)");
	CHECK_EQ(write_some(&r, &q, 1), 0, "I/O after, on the same queue");
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

int main(void)
{
	upcie_log_set_handler(rig_log, NULL);
	t_flush();
	t_nssr();
	return check_done();
}
