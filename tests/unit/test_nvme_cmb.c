/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The controller memory buffer against the controller model, on the BAR-agnostic path
 * (upcie_nvme_ctrl_cmb_enable_at(), "the BAR" being host memory the model reaches at the
 * controller addresses the test maps): CMBMSC written (CRE, CMSE, CBA) only from NVMe 1.4 on, a
 * pre-1.4 CMB used at its BAR's address; CMBLOC honoured (CDPCILS: lists in the CMB only for
 * commands there; queues physically contiguous in one memory, as CQPDS and CQMMS clear ask),
 * CMBSZ honoured (CQS, LISTS); I/O through CMB-resident SQs, CQs and lists verified.
 */
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#include "check.h"
#include "nvme_ctrl_rig.h"

#define BAR_BUS	 UINT64_C(0xc0000000)
#define CBA	 UINT64_C(0xd0000000)
#define BAR_OFF	 (12 * RIG_MiB) /* the "BAR": host memory from 12 MiB, 4 MiB */
#define CMB_OFST 0x2000u	/* CMBLOC.OFST 2 units of 4 KiB */

/* CMBLOC: BIR 2, OFST 2; CMBSZ: 1 MiB in 4 KiB units with SQ, CQ, lists, read and write data. */
#define CMBLOC(bits) ((2u << 12) | (bits) | 2u)
#define CMBSZ_ALL    ((256u << 12) | 0x1fu)

static void rig_cmb(struct rig *r, uint32_t vs, uint32_t cmbloc, uint32_t cmbsz)
{
	rig_setup(r);
	r->cm.regs[UPCIE_NVME_REG_VS / 4] = vs;
	nvme_cmodel_set_cmb(&r->cm, cmbloc, cmbsz);
	/* the controller reaches its CMB at the BAR address (before 1.4) or at CBA */
	nvme_model_iomap_add_range(&r->im, BAR_BUS, 4 * RIG_MiB, (uint8_t *)r->host_va + BAR_OFF);
	nvme_model_iomap_add_range(&r->im, CBA, RIG_MiB,
				   (uint8_t *)r->host_va + BAR_OFF + CMB_OFST);
	rig_start(r);
	rig_ctrl(r, NULL);
}

static int enable(struct rig *r, uint32_t bir)
{
	struct upcie_nvme_cmb_bar b;

	memset(&b, 0, sizeof(b));
	b.bir = bir;
	b.addr = (uint8_t *)r->host_va + BAR_OFF;
	b.size = 4 * RIG_MiB;
	b.bus = BAR_BUS;
	b.cba = CBA;
	return upcie_nvme_ctrl_cmb_enable_at(&r->c, &b);
}

static uint64_t cmbmsc(struct rig *r)
{
	return nvme_cmodel_rd64(&r->cm, UPCIE_NVME_REG_CMBMSC);
}

/* Create a queue with the given heaps (NULL: host) and verify 16 KiB through it. */
static int queue_io(struct rig *r, struct upcie_heap *sq, struct upcie_heap *cq,
		    struct upcie_heap *lists, uint32_t tag)
{
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	uint8_t *va = (uint8_t *)r->data_va;
	int err;

	memset(&qo, 0, sizeof(qo));
	qo.depth = 16;
	qo.sq_heap = sq;
	qo.cq_heap = cq;
	qo.list_heap = lists;
	err = upcie_nvme_ioq_create(&q, &r->c, &qo);
	if (err)
		return err;
	rig_fill(va, 16384, tag);
	err = upcie_nvme_ns_open(&ns, &r->c, 1);
	if (!err)
		err = upcie_nvme_ioq_write_sync(&q, &ns, 64, &r->data, 0, 16384, NULL);
	if (!err)
		err = upcie_nvme_ioq_read_sync(&q, &ns, 64, &r->data, 16384, 16384, NULL);
	if (!err && !rig_same(va + 16384, 16384, tag))
		err = -EBADMSG;
	upcie_nvme_ioq_delete(&q);
	return err;
}

static void t_version(void)
{
	struct rig r;
	int err;

	/* NVMe 1.4: CRE, then CBA | CMSE | CRE */
	rig_cmb(&r, UPCIE_NVME_VS(1, 4, 0), CMBLOC(0x1f8u), CMBSZ_ALL);
	err = enable(&r, 2);
	CHECK(err == 0 && r.c.cmb.on && r.c.cmb.size == RIG_MiB && r.c.cmb.cba == CBA,
	      "NVMe 1.4: CMB of 1 MiB at the controller address given (%d)", err);
	CHECK_EQ(cmbmsc(&r), CBA | 3u, "CMBMSC = CBA | CMSE | CRE");
	CHECK_EQ(queue_io(&r, &r.c.cmb.heap, &r.c.cmb.heap, NULL, 1), 0,
		 "I/O through an SQ and CQ in the CMB, verified");
	CHECK(r.cm.last_create_sq_cdw11 & 1, "the CMB SQ created physically contiguous (PC)");
	rig_teardown(&r);

	/* NVMe 1.3: no CMBMSC; the CMB is at its BAR's address */
	rig_cmb(&r, UPCIE_NVME_VS(1, 3, 0), CMBLOC(0x1f8u), CMBSZ_ALL);
	err = enable(&r, 2);
	CHECK(err == 0 && r.c.cmb.cba == BAR_BUS + CMB_OFST,
	      "NVMe 1.3: CMB at BAR address + offset 0x%llx (%d)", (unsigned long long)r.c.cmb.cba,
	      err);
	CHECK_EQ(cmbmsc(&r), 0, "CMBMSC (reserved before 1.4) never written");
	CHECK_EQ(queue_io(&r, &r.c.cmb.heap, &r.c.cmb.heap, NULL, 2), 0,
		 "I/O through the 1.3 CMB, verified");
	upcie_nvme_ctrl_close(&r.c);
	CHECK_EQ(cmbmsc(&r), 0, "nor on close");
	rig_teardown(&r);

	rig_cmb(&r, UPCIE_NVME_VS(1, 4, 0), CMBLOC(0), CMBSZ_ALL);
	CHECK_EQ(enable(&r, 4), -EINVAL, "a BAR other than CMBLOC.BIR: refused");
	CHECK(!r.c.cmb.on && upcie_nvme_cmbloc_bir(r.c.cmb.cmbloc) == 2,
	      "and the BIR to use is left in c->cmb.cmbloc");
	rig_teardown(&r);
}

static void t_cmbloc(void)
{
	uint32_t creates;
	struct rig r;

	/* every CMBLOC restriction enforced (CQMMS, CQPDS, CDPMLS, CDPCILS, CDMMMS clear) */
	rig_cmb(&r, UPCIE_NVME_VS(1, 4, 0), CMBLOC(0), CMBSZ_ALL);
	enable(&r, 2);
	creates = r.cm.n_create_cq;
	CHECK_EQ(queue_io(&r, NULL, NULL, &r.c.cmb.heap, 3), -EOPNOTSUPP,
		 "CDPCILS 0: PRP lists in the CMB for commands in host memory refused");
	CHECK_EQ(r.cm.n_create_cq, creates, "before anything reached the controller");
	CHECK_EQ(queue_io(&r, &r.c.cmb.heap, NULL, NULL, 3), 0,
		 "an SQ in the CMB with its CQ in host memory (each queue in one contiguous "
		 "memory: CQMMS 0 and CQPDS 0 hold), verified");
	CHECK((r.cm.last_create_sq_cdw11 & 1) && (r.cm.last_create_cq_cdw11 & 1),
	      "queues created physically contiguous (PC)");
	CHECK_EQ(queue_io(&r, &r.c.cmb.heap, &r.c.cmb.heap, &r.c.cmb.heap, 3), 0,
		 "SQ, CQ and lists in the CMB: verified");
	rig_teardown(&r);

	/* CDPCILS set (QEMU's CMB) */
	rig_cmb(&r, UPCIE_NVME_VS(1, 4, 0), CMBLOC((1u << 5) | (1u << 6)), CMBSZ_ALL);
	enable(&r, 2);
	CHECK_EQ(queue_io(&r, NULL, NULL, &r.c.cmb.heap, 4), 0,
		 "CDPCILS 1: lists in the CMB for host commands, verified");
	rig_teardown(&r);

	/* CMBSZ without CQ or list support */
	rig_cmb(&r, UPCIE_NVME_VS(1, 4, 0), CMBLOC(0x1f8u), (256u << 12) | 0x1u);
	enable(&r, 2);
	CHECK_EQ(queue_io(&r, &r.c.cmb.heap, &r.c.cmb.heap, NULL, 5), -EOPNOTSUPP,
		 "CMBSZ.CQS 0: no CQ in the CMB");
	CHECK_EQ(queue_io(&r, &r.c.cmb.heap, NULL, &r.c.cmb.heap, 5), -EOPNOTSUPP,
		 "CMBSZ.LISTS 0: no lists in the CMB");
	CHECK_EQ(queue_io(&r, &r.c.cmb.heap, NULL, NULL, 5), 0, "an SQ alone: verified");
	rig_teardown(&r);
}

int main(void)
{
	upcie_log_set_handler(rig_log, NULL);
	t_version();
	t_cmbloc();
	return check_done();
}
