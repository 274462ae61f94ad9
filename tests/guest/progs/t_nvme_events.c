// SPDX-License-Identifier: BSD-3-Clause
/*
 * t_nvme_events: QEMU's NVMe controller c1 changing beneath upcie's driver, for real.
 *   - From bring-up, Asynchronous Event Requests are outstanding (QEMU's AERL is 3: 4 of them).
 *   - An over-temperature threshold set below the temperature QEMU reports raises a SMART /
 *     health event: the handler gets it with the SMART log page read (critical warning bit 1),
 *     and the AER is sent again.
 *   - QEMU's smart_critical_warning set through QMP (the test bed's QMP hook, asked on the
 *     console): a SMART / health event (available spare), its log page with the warning bit.
 *   - Format NVM of c1n3 (512 B blocks) to the 4 KiB format, through upcie_nvme_ctrl_admin(): QEMU's
 *     Commands Supported and Effects log says it changes logical block content, the open
 *     handle is revalidated and refuses I/O (-ESTALE), a re-opened one has 4 KiB blocks; a write
 *     through it lands where nvme_events.host.sh looks in c1n3.img.
 *   - c3, a controller of an NVM subsystem (TB_C3_BDF): namespace 2 detached from it by Namespace
 *     Attachment while reads of it are in flight: QEMU raises Namespace Attribute Changed, the
 *     driver revalidates, the handle refuses I/O (-ENODEV), each read ended exactly once, and
 *     namespace 1 goes on.
 * Usage: t_nvme_events uio|type1|iommufd (TB_C1_BDF set; TB_C3_BDF on boots with c3).
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/nvme/cmd.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#include "t_nvme_util.h"
#include "tb_out.h"

#define FMT_NSID 3u
#define W_LBA	 8u /* 4 KiB blocks after the format */
#define W_BLOCKS 2u

struct seen {
	int n;
	struct upcie_nvme_event ev[4];
	uint8_t cw[4];
};

static void on_event(void *ctx, struct upcie_nvme_ctrl *c, const struct upcie_nvme_event *ev)
{
	struct seen *s = (struct seen *)ctx;

	(void)c;
	printf("# event: type %u info 0x%02x log 0x%02x (%zu bytes, err %d)\n", ev->type, ev->info,
	       ev->lid, ev->log_len, ev->log_err);
	if (s->n < 4) {
		s->ev[s->n] = *ev;
		s->cw[s->n] = ev->log_len ? ev->log[0] : 0xff;
	}
	s->n++;
}

static void poll_until(struct upcie_nvme_ctrl *c, struct seen *s, int want, uint64_t ms)
{
	struct upcie_deadline dl;

	upcie_deadline_set(&dl, ms * UPCIE_NSEC_PER_MSEC);
	while (s->n < want && !upcie_deadline_passed(&dl)) {
		upcie_nvme_ctrl_admin_poll(c);
		upcie_sleep_ns(UPCIE_NSEC_PER_MSEC);
	}
}

/* Ask the test bed's QMP hook for a command (tests/guest/tools/qmp_hook.py reads the console). */
static void qmp(const char *json)
{
	printf("# tb-qmp: %s\n", json);
	fflush(stdout);
}

/* smart_critical_warning through QMP: bit 0 (available spare below threshold). */
static void smart_qmp(struct upcie_nvme_ctrl *c, struct seen *s)
{
	int n0 = s->n, k;

	qmp("{\"execute\": \"qom-set\", \"arguments\": {\"path\": \"/machine/peripheral/c1\", "
	    "\"property\": \"smart_critical_warning\", \"value\": 1}}");
	poll_until(c, s, n0 + 1, 20000);
	k = n0 < 4 ? n0 : 3;
	TAP(s->n > n0 && s->ev[k].type == UPCIE_NVME_AE_TYPE_SMART && s->ev[k].info == 0x02 &&
		s->ev[k].lid == UPCIE_NVME_LOG_SMART && (s->cw[k] & 1),
	    "c1: smart_critical_warning = 1 through QMP: SMART / health event (available spare), "
	    "its log read (critical warning 0x%02x, %d events)",
	    s->n > n0 ? s->cw[k] : 0, s->n - n0);
}

/* The index of the 4 KiB format without metadata of namespace `nsid`, or -1. */
static int find_4k(struct upcie_nvme_ctrl *c, uint32_t nsid)
{
	struct upcie_nvme_id_ns *id = (struct upcie_nvme_id_ns *)calloc(1, sizeof(*id));
	int k = -1;

	if (id && !upcie_nvme_ctrl_identify(c, UPCIE_NVME_CNS_NS, nsid, id))
		for (unsigned f = 0; f <= id->nlbaf && f < 16 && k < 0; f++)
			if (id->lbaf[f].lbads == 12 && id->lbaf[f].ms == 0)
				k = (int)f;
	free(id);
	return k;
}

static void smart(struct upcie_nvme_ctrl *c, struct seen *s)
{
	struct upcie_nvme_sqe sqe;
	uint32_t aers = c->aer_out;
	int err;

	/* 0x143 (323 K) is QEMU's temperature: a threshold of 300 K is crossed at once */
	upcie_nvme_cmd_set_features(&sqe, UPCIE_NVME_FEAT_TEMP_THRESH, 0, 300, false);
	err = upcie_nvme_ctrl_admin(c, &sqe, NULL, 0, 0, NULL);
	TAP(err == 0, "c1: over-temperature threshold set to 300 K (%d)", err);
	poll_until(c, s, 1, 5000);
	TAP(s->n >= 1 && s->ev[0].type == UPCIE_NVME_AE_TYPE_SMART && s->ev[0].info == 0x01 &&
		s->ev[0].lid == UPCIE_NVME_LOG_SMART && s->ev[0].log_len == 512 && (s->cw[0] & 2),
	    "c1: SMART / health event: temperature threshold, SMART log read (critical warning "
	    "0x%02x, %d events)",
	    s->n ? s->cw[0] : 0, s->n);
	TAP(c->aer_out == aers, "c1: the AER sent again: %u outstanding", c->aer_out);
	/* back to QEMU's default threshold (343 K) */
	upcie_nvme_cmd_set_features(&sqe, UPCIE_NVME_FEAT_TEMP_THRESH, 0, 0x157, false);
	upcie_nvme_ctrl_admin(c, &sqe, NULL, 0, 0, NULL);
}

static void format(struct upcie_nvme_ctrl *c, struct upcie_nvme_ioq *q, struct upcie_dmamem *mem)
{
	struct upcie_nvme_ns ns, ns2;
	struct upcie_nvme_sqe sqe;
	uint64_t reval;
	char tag[9];
	int f, err;

	err = upcie_nvme_ns_open(&ns, c, FMT_NSID);
	TAP(err == 0 && ns.lba_bytes == 512, "c1n3: open, %u-byte blocks (%d)", ns.lba_bytes, err);
	f = find_4k(c, FMT_NSID);
	TAP(f >= 0, "c1n3: QEMU offers a 4 KiB format without metadata (index %d)", f);
	if (err || f < 0)
		return;
	TAP(c->effects_read && (c->effects[UPCIE_NVME_ADMIN_FORMAT_NVM] & 0x3u) == 0x3u,
	    "c1: Commands Supported and Effects log read: Format NVM changes logical blocks "
	    "(0x%08x)",
	    c->effects[UPCIE_NVME_ADMIN_FORMAT_NVM]);
	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = UPCIE_NVME_ADMIN_FORMAT_NVM;
	sqe.nsid = FMT_NSID;
	sqe.cdw10 = (uint32_t)(f & 0xf) | ((uint32_t)(f >> 4) << 12);
	reval = c->nrevalidated;
	err = upcie_nvme_ctrl_admin(c, &sqe, NULL, 0, 60 * UPCIE_NSEC_PER_SEC, NULL);
	TAP(err == 0 && c->nrevalidated == reval + 1,
	    "c1n3: Format NVM to format %d through the driver, the namespace revalidated (%d)", f,
	    err);
	err = upcie_nvme_ioq_read_sync(q, &ns, 0, mem, 0, 4096, NULL);
	TAP(err == -ESTALE, "c1n3: the handle opened before refuses I/O (%d)", err);
	err = upcie_nvme_ns_open(&ns2, c, FMT_NSID);
	TAP(err == 0 && ns2.lba_bytes == 4096 && ns2.nsze == ns.nsze / 8,
	    "c1n3: re-opened, %" PRIu64 " blocks of %u bytes (%d)", ns2.nsze, ns2.lba_bytes, err);
	if (err)
		return;
	tn_tag(tag, "fmt");
	tn_pat(mem->vaddr, W_BLOCKS * 4096, tag, 0);
	err = upcie_nvme_ioq_write_sync(q, &ns2, W_LBA, mem, 0, W_BLOCKS * 4096, NULL);
	if (!err) {
		memset(mem->vaddr, 0, 2 * W_BLOCKS * 4096);
		err = upcie_nvme_ioq_read_sync(q, &ns2, W_LBA, mem, W_BLOCKS * 4096,
					       W_BLOCKS * 4096, NULL);
	}
	TAP(err == 0 &&
		tn_pat_diff((uint8_t *)mem->vaddr + W_BLOCKS * 4096, W_BLOCKS * 4096, tag, 0) < 0,
	    "c1n3: 8 KiB written at 4 KiB-block %u and read back (%d)", W_LBA, err);
	INFO("format_c1n3", "%llu+%llu+%s", (unsigned long long)W_LBA * 4096,
	     (unsigned long long)W_BLOCKS * 4096, tag);
}

#define DET_READS 16

struct det_read {
	struct upcie_nvme_req req;
	int calls;
};

static void det_cb(struct upcie_nvme_req *req)
{
	((struct det_read *)req->ctx)->calls++;
}

/* c3: namespace 2 detached from the controller while reads of it are in flight. */
static void detach(const char *path, struct seen *s)
{
	static struct det_read rd[DET_READS];
	struct upcie_nvme_ctrl_opts o;
	struct upcie_nvme_ns ns1, ns2;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ioq q;
	struct upcie_dmamem mem;
	struct upcie_nvme_sqe sqe;
	struct upcie_pci_bdf bdf;
	struct upcie_deadline dl;
	uint16_t list[2048];
	int err, sent = 0, once = 0, ok = 0, bad = 0, n0;

	if (!getenv("TB_C3_BDF"))
		return;
	memset(&o, 0, sizeof(o));
	memset(&mem, 0, sizeof(mem));
	if (upcie_nvme_path_parse(path, &o.dev.path) || tn_bdf_env("TB_C3_BDF", &bdf))
		return;
	o.dev.bind = true;
	o.host_mem = 16 * MiB;
	err = upcie_nvme_ctrl_open(&c, &bdf, &o);
	TAP(err == 0 && (c.aen_config & UPCIE_NVME_AEC_NS_ATTR) &&
		(c.id.oacs & UPCIE_NVME_OACS_NS_MGMT),
	    "c3: opened (subsystem %.32s, controller %u), namespace notices enabled, namespace "
	    "management (%d)",
	    c.id.subnqn, c.id.cntlid, err);
	if (err)
		return;
	upcie_nvme_ctrl_set_event_handler(&c, on_event, s);
	err = upcie_nvme_dev_dmamem(&c.dev, 4 * MiB, &mem);
	if (!err)
		err = upcie_nvme_ioq_create(&q, &c, NULL);
	if (!err)
		err = upcie_nvme_ns_open(&ns1, &c, 1);
	if (!err)
		err = upcie_nvme_ns_open(&ns2, &c, 2);
	TAP(err == 0, "c3: an I/O queue, namespaces 1 and 2 open (%d)", err);
	if (err)
		goto out;
	for (int i = 0; i < DET_READS; i++) {
		rd[i].req.cb = det_cb;
		rd[i].req.ctx = &rd[i];
		if (!upcie_nvme_ioq_read(&q, &ns2, (uint64_t)i * 8, &mem, (uint64_t)i * 4096, 4096,
					 &rd[i].req))
			sent++;
	}
	n0 = s->n;
	/* Namespace Attachment, select 1 (detach), the controller list: this controller */
	memset(list, 0, sizeof(list));
	list[0] = 1;
	list[1] = c.id.cntlid;
	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = UPCIE_NVME_ADMIN_NS_ATTACH;
	sqe.nsid = 2;
	sqe.cdw10 = 1;
	err = upcie_nvme_ctrl_admin_buf(&c, &sqe, list, sizeof(list), UPCIE_NVME_XFER_TO_DEV, 0,
					NULL);
	TAP(err == 0, "c3: namespace 2 detached by Namespace Attachment, %d reads submitted (%d)",
	    sent, err);
	poll_until(&c, s, n0 + 1, 5000);
	TAP(s->n > n0 && s->ev[n0 < 4 ? n0 : 3].type == UPCIE_NVME_AE_TYPE_NOTICE &&
		s->ev[n0 < 4 ? n0 : 3].info == UPCIE_NVME_AE_NOTICE_NS_CHANGED,
	    "c3: Namespace Attribute Changed raised and handed on (%d events)", s->n - n0);
	upcie_deadline_set(&dl, 10 * UPCIE_NSEC_PER_SEC);
	while (!upcie_deadline_passed(&dl)) {
		int done = 0;

		upcie_nvme_ioq_poll(&q, 64);
		for (int i = 0; i < DET_READS; i++)
			done += rd[i].calls > 0;
		if (done == sent)
			break;
		upcie_sleep_ns(UPCIE_NSEC_PER_MSEC);
	}
	for (int i = 0; i < DET_READS; i++) {
		once += rd[i].calls == 1;
		ok += rd[i].calls == 1 && rd[i].req.err == 0;
		bad += rd[i].calls > 1;
	}
	TAP(once == sent && !bad,
	    "c3: every read of namespace 2 ended exactly once (%d of %d: %d before the detach, "
	    "%d with an error status)",
	    once, sent, ok, once - ok);
	err = upcie_nvme_ioq_read_sync(&q, &ns2, 0, &mem, 0, 4096, NULL);
	TAP(err == -ENODEV, "c3: namespace 2's handle refuses I/O: gone (%d)", err);
	err = upcie_nvme_ioq_read_sync(&q, &ns1, 0, &mem, 0, 4096, NULL);
	TAP(err == 0, "c3: namespace 1 goes on (%d)", err);
	upcie_nvme_ioq_delete(&q);
out:
	upcie_dmamem_destroy(&mem);
	err = upcie_nvme_ctrl_close(&c);
	TAP(err == 0, "c3: closed (%d)", err);
}

int main(int argc, char **argv)
{
	struct upcie_nvme_ctrl_opts o;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ioq q;
	struct upcie_dmamem mem;
	struct upcie_pci_bdf bdf;
	struct seen s;
	int err;

	setvbuf(stdout, NULL, _IOLBF, 0);
	upcie_log_set_handler(tn_log, NULL);
	memset(&o, 0, sizeof(o));
	memset(&s, 0, sizeof(s));
	if (argc != 2 || upcie_nvme_path_parse(argv[1], &o.dev.path) ||
	    tn_bdf_env("TB_C1_BDF", &bdf)) {
		fprintf(stderr, "usage: t_nvme_events uio|type1|iommufd (TB_C1_BDF set)\n");
		return 2;
	}
	o.dev.bind = true;
	o.host_mem = 16 * MiB;
	err = upcie_nvme_ctrl_open(&c, &bdf, &o);
	TAP(err == 0, "c1: opened on the %s path (%d)", argv[1], err);
	if (err)
		goto done;
	TAP(c.aer_out == c.aer_want && c.aer_want == (c.id.aerl + 1u < 4u ? c.id.aerl + 1u : 4u) &&
		(c.aen_config & 0xffu) == 0xffu,
	    "c1: %u Asynchronous Event Requests outstanding (AERL %u), SMART warnings enabled "
	    "(AEC 0x%x)",
	    c.aer_out, c.id.aerl, c.aen_config);
	upcie_nvme_ctrl_set_event_handler(&c, on_event, &s);
	smart(&c, &s);
	smart_qmp(&c, &s);
	memset(&mem, 0, sizeof(mem));
	err = upcie_nvme_dev_dmamem(&c.dev, 4 * MiB, &mem);
	if (!err)
		err = upcie_nvme_ioq_create(&q, &c, NULL);
	TAP(err == 0, "c1: DMA memory and an I/O queue (%d)", err);
	if (!err) {
		format(&c, &q, &mem);
		upcie_nvme_ioq_delete(&q);
	}
	upcie_dmamem_destroy(&mem);
	err = upcie_nvme_ctrl_close(&c);
	TAP(err == 0, "c1: closed (%d)", err);
	s.n = 0;
	detach(argv[1], &s);
done:
	printf("1..%d\n", tn_n);
	return tn_failed ? 1 : 0;
}
