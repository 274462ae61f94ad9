/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Controller limits as real drives set them, against the controller model: a queue's transfer
 * size never above MDTS or what the caller asked (never raised to a page), blocks larger than
 * the transfer limit refused, admin transfers bounded by MDTS, SGL list pages sized for one
 * descriptor per page, doorbells placed with CAP.DSTRD and never beyond BAR0 (fewer queues used
 * instead, as Linux does; a BAR0 without room for the admin doorbells refused), Set Features
 * Number of Queues failing leaving an admin-only controller, and Create I/O CQ/SQ memory
 * aligned to the controller page in device address space.
 */
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#include "check.h"
#include "nvme_ctrl_rig.h"

static void t_max_xfer(void)
{
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct rig r;
	uint8_t *va;
	int err;

	rig_setup(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	upcie_nvme_ns_open(&ns, &r.c, 1);
	va = (uint8_t *)r.data_va;
	memset(&qo, 0, sizeof(qo));
	qo.max_xfer = 1024;
	err = upcie_nvme_ioq_create(&q, &r.c, &qo);
	CHECK(err == 0 && q.dptr.max_bytes == 1024,
	      "max_xfer 1024 asked, 1024 kept (not raised to the 4 KiB page): %llu",
	      (unsigned long long)q.dptr.max_bytes);
	rig_fill(va, 8192, 3);
	err = upcie_nvme_ioq_write_sync(&q, &ns, 100, &r.data, 0, 8192, NULL);
	if (!err)
		err = upcie_nvme_ioq_read_sync(&q, &ns, 100, &r.data, 8192, 8192, NULL);
	CHECK(err == 0 && rig_same(va + 8192, 8192, 3), "8 KiB in 1 KiB commands, verified");
	upcie_nvme_ioq_delete(&q);

	qo.max_xfer = 256;
	upcie_nvme_ioq_create(&q, &r.c, &qo);
	err = upcie_nvme_ioq_read_sync(&q, &ns, 0, &r.data, 0, 512, NULL);
	CHECK_EQ(err, -EINVAL,
		 "512-byte blocks through a 256-byte limit: refused, no division by 0");
	upcie_nvme_ioq_delete(&q);

	qo.max_xfer = 4 * RIG_MiB; /* above MDTS (512 KiB) */
	upcie_nvme_ioq_create(&q, &r.c, &qo);
	CHECK_EQ(q.dptr.max_bytes, 512 * 1024, "max_xfer above MDTS: MDTS");
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

static void t_admin_mdts(void)
{
	struct upcie_nvme_sqe sqe;
	static uint8_t buf[16384];
	uint32_t admin0;
	struct rig r;
	int err;

	rig_setup(&r);
	r.cm.mdts = 1; /* 8 KiB */
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	CHECK(err == 0 && r.c.max_xfer == 8192 && r.c.admin_dptr.max_bytes == 8192,
	      "MDTS 1: 8 KiB for I/O and admin transfers");
	upcie_nvme_cmd_get_log_page(&sqe, UPCIE_NVME_LOG_ERROR, UPCIE_NVME_NSID_ALL, 0, 12288, 0,
				    false);
	/* bring-up submits the AERs without waiting: the model may still be fetching them */
	CHECK(rig_admin_held(&r, r.c.aer_out), "the model holds the driver's AERs (%u)",
	      r.c.aer_out);
	admin0 = (uint32_t)r.cm.admin.fetched;
	err = upcie_nvme_ctrl_admin_buf(&r.c, &sqe, buf, 12288, UPCIE_NVME_XFER_FROM_DEV, 0, NULL);
	CHECK(err == -EINVAL && r.cm.admin.fetched == admin0,
	      "a 12 KiB admin transfer above MDTS: refused before it is sent (%d)", err);
	rig_teardown(&r);
}

static void t_sgl_lists(void)
{
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct rig r;
	uint8_t *va;
	int err;

	rig_setup(&r);
	r.cm.mdts = 0; /* no limit */
	rig_start(&r);
	rig_ctrl(&r, NULL);
	upcie_nvme_ns_open(&ns, &r.c, 1);
	va = (uint8_t *)r.data_va;
	memset(&qo, 0, sizeof(qo));
	qo.sgl = true;
	qo.max_xfer = 2 * RIG_MiB;
	qo.depth = 4;
	err = upcie_nvme_ioq_create(&q, &r.c, &qo);
	CHECK(err == 0 && q.lpages == 3,
	      "SGL queue of 2 MiB commands: 3 list pages per command (513 descriptors at 256 a "
	      "page), got %u",
	      q.lpages);
	/* 2 MiB from offset 512: 513 pages of shuffled 4 KiB granules, each its own descriptor */
	rig_fill(va + 512, 2 * RIG_MiB, 21);
	err = upcie_nvme_ioq_write_sync(&q, &ns, 0, &r.data, 512, 2 * RIG_MiB, NULL);
	memset(va, 0, RIG_DATA_SIZE);
	if (!err)
		err = upcie_nvme_ioq_read_sync(&q, &ns, 0, &r.data, 512, 2 * RIG_MiB, NULL);
	CHECK(err == 0 && rig_same(va + 512, 2 * RIG_MiB, 21),
	      "2 MiB in one SGL command over 513 scattered pages: written, read, verified (%d)",
	      err);
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

/*
 * A request of many small segments on an SGL queue of 512 KiB commands (one list page, 256
 * descriptors, per command): 512 KiB in one segment (the first command, 128 descriptors), then
 * 300 segments of 512 bytes, each in its own 4 KiB granule (the second command, 300
 * descriptors), is refused before anything is submitted, not part-way (-ENOSPC after the first
 * command went out). The control: the small part in 150 segments of 1 KiB fits.
 */
static void t_sgl_descriptor_budget(void)
{
	static struct upcie_nvme_dseg segs[301];
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct rig r;
	uint64_t f0;
	int err;

	rig_setup(&r);
	r.cm.mdts = 0;
	rig_start(&r);
	rig_ctrl(&r, NULL);
	upcie_nvme_ns_open(&ns, &r.c, 1);
	memset(&qo, 0, sizeof(qo));
	qo.sgl = true;
	qo.max_xfer = 512 * 1024;
	qo.depth = 8;
	err = upcie_nvme_ioq_create(&q, &r.c, &qo);
	for (int k = 0; k < 2 && !err; k++) {
		unsigned nsegs = k ? 150 : 300;
		uint64_t seg = k ? 1024 : 512;
		struct upcie_nvme_io io;

		segs[0].mem = &r.data;
		segs[0].off = 2 * RIG_MiB;
		segs[0].len = 512 * 1024;
		for (unsigned i = 1; i <= nsegs; i++) {
			segs[i].mem = &r.data;
			segs[i].off = (uint64_t)i * 4096;
			segs[i].len = seg;
		}
		memset(&io, 0, sizeof(io));
		io.opc = UPCIE_NVME_NVM_READ;
		io.segs = segs;
		io.nsegs = nsegs + 1;
		f0 = __atomic_load_n(&r.cm.io_fetched, __ATOMIC_ACQUIRE);
		err = upcie_nvme_ioq_io_sync(&q, &ns, &io, 0, NULL);
		if (!k)
			CHECK(err == -EINVAL &&
				  __atomic_load_n(&r.cm.io_fetched, __ATOMIC_ACQUIRE) == f0,
			      "SGL: 512 KiB, then 300 segments of 512 B (300 descriptors, 256 "
			      "fit): refused up front, nothing sent (%d)",
			      err);
		else
			CHECK(err == 0 &&
				  __atomic_load_n(&r.cm.io_fetched, __ATOMIC_ACQUIRE) == f0 + 2,
			      "SGL control: 512 KiB, then 150 segments of 1 KiB: two commands "
			      "(%d)",
			      err);
		err = 0;
	}
	upcie_nvme_ioq_delete(&q);
	rig_teardown(&r);
}

/* Create every granted queue and move 4 KiB through each. */
static int all_queues_io(struct rig *r, uint32_t n)
{
	static struct upcie_nvme_ioq q[16];
	struct upcie_nvme_ns ns;
	uint8_t *va = (uint8_t *)r->data_va;
	int err = upcie_nvme_ns_open(&ns, &r->c, 1);

	for (uint32_t i = 0; i < n && !err; i++) {
		err = upcie_nvme_ioq_create(&q[i], &r->c, NULL);
		rig_fill(va, 4096, 40 + i);
		if (!err)
			err = upcie_nvme_ioq_write_sync(&q[i], &ns, 8 * i, &r->data, 0, 4096, NULL);
		if (!err)
			err =
			    upcie_nvme_ioq_read_sync(&q[i], &ns, 8 * i, &r->data, 4096, 4096, NULL);
		if (!err && !rig_same(va + 4096, 4096, 40 + i))
			err = -EBADMSG;
	}
	for (uint32_t i = 0; i < n; i++)
		upcie_nvme_ioq_delete(&q[i]);
	return err;
}

static void t_doorbells(void)
{
	struct upcie_nvme_ioq q, q8;
	struct rig r;
	int err;

	/* a 16-byte stride: every queue's doorbells move */
	rig_setup(&r);
	nvme_cmodel_set_dstrd(&r.cm, 2);
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	CHECK(err == 0 && r.c.dstrd == 2 && r.c.nqueues == 8, "CAP.DSTRD 2 (16-byte stride)");
	CHECK_EQ(all_queues_io(&r, 8), 0, "I/O verified on all 8 queues with the stride");
	rig_teardown(&r);

	/* an 8 KiB BAR0 with a 256-byte stride holds doorbells for 7 I/O queues, not 8 */
	rig_setup(&r);
	nvme_cmodel_set_regs_size(&r.cm, 0x2000);
	nvme_cmodel_set_dstrd(&r.cm, 6);
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	CHECK(err == 0 && r.c.nqueues == 7,
	      "8 granted, BAR0 of 8 KiB with 256-byte stride: 7 used (%d, %u)", err, r.c.nqueues);
	CHECK_EQ(all_queues_io(&r, 7), 0, "I/O verified on the 7");
	err = upcie_nvme_ioq_create(&q, &r.c, NULL);
	CHECK_EQ(err, 0, "a queue");
	CHECK_EQ(upcie_nvme_ioq_create(&q8, &r.c, &(struct upcie_nvme_ioq_opts){ .qid = 8 }),
		 -ENOSPC, "queue 8, whose doorbells lie beyond BAR0: refused");
	rig_teardown(&r);

	/* no room even for the admin doorbells: refused before enabling */
	rig_setup(&r);
	nvme_cmodel_set_regs_size(&r.cm, 0x2000);
	nvme_cmodel_set_dstrd(&r.cm, 10); /* 4 KiB stride: CQ 0 head at 0x2000 */
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	CHECK(err == -ENODEV && r.cm.n_enable == 0,
	      "admin CQ doorbell beyond an 8 KiB BAR0: -ENODEV, never enabled (%d)", err);
	rig_teardown(&r);
}

static void t_admin_only(void)
{
	struct upcie_nvme_ioq q;
	uint32_t ids[4], n = 0;
	struct rig r;
	int err;

	rig_setup(&r);
	r.cm.fail_set_queues = UPCIE_NVME_SC_INVALID_FIELD;
	rig_start(&r);
	err = rig_ctrl(&r, NULL);
	CHECK(err == 0 && r.c.state == UPCIE_NVME_CTRL_READY && r.c.nqueues == 0,
	      "Set Features Number of Queues fails: brought up admin-only (%d)", err);
	CHECK_EQ(upcie_nvme_ioq_create(&q, &r.c, NULL), -EOPNOTSUPP, "no I/O queue: -EOPNOTSUPP");
	err = upcie_nvme_ctrl_ns_list(&r.c, ids, 4, &n);
	CHECK(err == 0 && n == 1, "admin commands still work");
	rig_teardown(&r);
}

static void t_queue_alignment(void)
{
	struct upcie_nvme_ioq_opts qo;
	struct upcie_dmamem odd;
	struct upcie_heap heap;
	struct upcie_nvme_ioq q;
	uint32_t creates;
	struct rig r;
	int err;

	rig_setup(&r);
	rig_start(&r);
	rig_ctrl(&r, NULL);
	/* 1 MiB of the host memory seen at a device address 2 KiB off a page boundary */
	upcie_dmamem_init_arith(&odd, (char *)r.host_va + 12 * RIG_MiB, RIG_MiB,
				UINT64_C(0x70000800));
	nvme_model_iomap_add_range(&r.im, UINT64_C(0x70000800), RIG_MiB,
				   (uint8_t *)r.host_va + 12 * RIG_MiB);
	upcie_heap_init(&heap, &odd);
	memset(&qo, 0, sizeof(qo));
	qo.cq_heap = &heap;
	creates = r.cm.n_create_cq;
	err = upcie_nvme_ioq_create(&q, &r.c, &qo);
	CHECK(err == -EINVAL && r.cm.n_create_cq == creates,
	      "CQ memory 2 KiB off the controller page: refused before Create I/O CQ (%d)", err);
	qo.cq_heap = NULL;
	qo.sq_heap = &heap;
	err = upcie_nvme_ioq_create(&q, &r.c, &qo);
	CHECK(err == -EINVAL && r.cm.n_create_cq == creates, "SQ memory too (%d)", err);
	upcie_heap_fini(&heap);
	upcie_dmamem_destroy(&odd);
	rig_teardown(&r);
}

int main(void)
{
	upcie_log_set_handler(rig_log, NULL);
	t_max_xfer();
	t_admin_mdts();
	t_sgl_lists();
	t_sgl_descriptor_budget();
	t_doorbells();
	t_admin_only();
	t_queue_alignment();
	return check_done();
}
