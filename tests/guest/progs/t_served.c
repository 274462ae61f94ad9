/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * t_served: a client of upcie-served (served/client.h) for the guest case `served`.
 *
 *   t_served io --socket S --tag NAME --lba L --blocks N [--seconds T] [--qd Q] [--as UID]
 *               [--reconnect] [--trusted]   (--as works for every mode)
 *       Writes the test bed pattern of NAME over [L, L + N) of namespace 1, then random
 *       writes (the same pattern) and reads of 4..64 KiB until T seconds passed, every read
 *       checked; ends by reading the whole range back. Through an isolated queue pair (the
 *       server builds the commands), or a trusted one with --trusted. --as drops to that uid
 *       (and gid) before connecting. --reconnect: when the server goes away, connect again (up
 *       to 30 s) and go on. Exit 0: every read matched; 1: a mismatch; 2: an error.
 *   t_served perf (--socket S [--trusted [--direct]] | --bdf BDF --path P) --qd Q --ops N
 *                 [--lba L --blocks N]
 *       4 KiB random reads over the first 16 MiB (or [L, L + N)), polled: a served client (isolated; --trusted:
 *       its own queue, doorbells relayed; --direct: doorbells rung through the whole device
 *       the server handed out), or the same loop in the process that owns the controller.
 *       Prints mean latency (QD 1) or IOPS, and the CPU time per I/O of this process and of
 *       the whole guest (all vCPUs busy time: the server's poller too).
 *   t_served attack --socket S --lba L --blocks N
 *       An isolated client granted [L, L + N) tries what it must not: a trusted queue pair, a
 *       Write just past its grant (at L + N), a Write far outside (LBA 0 when L > 0), a Read
 *       into a region it does not have, data past its region, an opcode off the allow-list.
 *       Exit 0 when every one was refused, 1 when one was not.
 *   t_served scale --bdfs B0,B1,... --dir D --ctrls N [--queues 4] [--qd 8] [--seconds T]
 *                  [--trusted]
 *       One process, one thread, driving N controllers (served on D/<bdf>.sock) with Q queue
 *       pairs each (isolated; trusted ones with --trusted): every slot writes 4 KiB of the pattern of "sk<k>" (k: the controller's
 *       index) at a random LBA of its queue's 1 MiB range (queue j: LBA j * 2048), reads it back and checks it. Then
 *       every queue fills its range (--fill). Prints IOPS and the guest's CPU time per I/O.
 *   t_served dmabuf --socket S --vram BDF --lba L --blocks N
 *       Device memory as the data of a served queue: exports [16 MiB, +N * 512) of BAR 2 of the
 *       ivshmem function BDF (bound to vfio-pci; through this process's own iommufd and vfio
 *       cdev) as a dma-buf, registers it with the server (which imports it with
 *       IOMMU_IOAS_MAP_FILE), reads N blocks from LBA L of namespace 1 into it, and checks the
 *       BAR through its vfio mmap against c0n1's pattern.
 *   t_served sentinel --mb M --seconds T
 *       Takes M MiB of free hugepages, fills them with a pattern, waits T seconds and checks
 *       that nothing changed them: memory a killed client gave back must see no DMA.
 */
// testbed-ldflags: -lpthread
#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <upcie/base/clock.h>
#include <upcie/base/log.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/dev.h>
#include <upcie/nvme/ns.h>
#include <upcie/served/client.h>
#include <upcie/pci/bdf.h>
#include <upcie/vfio/cdev.h>
#include <upcie/vfio/dmabuf.h>
#include <upcie/vfio/iommufd.h>

#include "t_nvme_util.h"

#define TS_LBA	   512u
#define TS_BUF_OFF (1u << 20) /* data buffers from 1 MiB of the region */
#define TS_REGION  (8u << 20)
#define TS_MAXQ	   64u
#define TS_CHUNK   (64u * 1024)

struct ts_opts {
	const char *socket, *tag, *bdf, *path, *bdfs, *dir, *vram;
	unsigned ctrls, queues;
	bool fill, direct, trusted;
	uint64_t lba, blocks, ops;
	double secs;
	unsigned qd, mb;
	long as;
	bool reconnect;
};

struct ts_io {
	bool busy;
	bool rd;
	int err;
	uint64_t lba;
	uint32_t nlb;
	unsigned slot;
};

struct ts {
	struct upcie_served_client cl;
	struct upcie_served_mem mem;
	struct upcie_served_qp qp;
	struct upcie_served_iqp iq;
	bool up, iso;
};

static uint64_t ts_rand(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static void ts_cb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct ts_io *io = (struct ts_io *)ctx;

	io->busy = false;
	io->err = err ? err : upcie_nvme_cqe_ok(cqe) ? 0 : -EIO;
}

static void ts_icb(void *ctx, const struct upcie_served_cpl *c)
{
	struct ts_io *io = (struct ts_io *)ctx;

	io->busy = false;
	io->err = c->err ? c->err : c->status ? -EIO : 0;
}

static void ts_down(struct ts *t)
{
	if (t->iso)
		upcie_served_iqp_delete(&t->iq);
	else
		upcie_served_qp_delete(&t->qp);
	upcie_served_mem_free(&t->mem);
	upcie_served_disconnect(&t->cl);
	t->up = false;
}

static int ts_up(struct ts *t, const char *socket, unsigned depth, bool direct, bool trusted)
{
	struct upcie_served_qp_opts o;
	int err = upcie_served_connect(&t->cl, socket,
				       !trusted ? UPCIE_SERVED_ISOLATED
				       : direct ? UPCIE_SERVED_DIRECT_DB
						: 0);

	t->iso = !err && t->cl.info.isolated;
	if (!err && trusted && t->iso)
		DIAG("served: a trusted queue was asked for, the server isolates this client");
	if (!err)
		err = upcie_served_mem_alloc(&t->cl, TS_REGION, &t->mem);
	if (!err && t->iso) {
		err = upcie_served_iqp_create(&t->cl, &t->iq, depth);
	} else if (!err) {
		memset(&o, 0, sizeof(o));
		o.depth = depth;
		o.sq_off = 0;
		o.cq_off = 64 * 1024;
		o.list_off = 128 * 1024;
		err = upcie_served_qp_create(&t->cl, &t->qp, &t->mem, &o);
	}
	if (err)
		ts_down(t);
	t->up = !err;
	return err;
}

/* Submit io (a read or write of its lba/nlb from its slot's buffer). */
static int ts_submit(struct ts *t, struct ts_io *io, const char *tag)
{
	uint64_t off = TS_BUF_OFF + (uint64_t)io->slot * TS_CHUNK;
	uint8_t *buf = (uint8_t *)t->mem.vaddr + off;
	uint64_t len = (uint64_t)io->nlb * TS_LBA;

	if (io->rd)
		memset(buf, 0, len);
	else
		tn_pat(buf, len, tag, io->lba * TS_LBA);
	io->busy = true;
	io->err = 0;
	if (t->iso)
		return upcie_served_iqp_rw(&t->iq,
					   io->rd ? UPCIE_NVME_NVM_READ : UPCIE_NVME_NVM_WRITE, 1,
					   io->lba, io->nlb, &t->mem, off, len, ts_icb, io);
	return upcie_served_qp_rw(&t->qp, io->rd ? UPCIE_NVME_NVM_READ : UPCIE_NVME_NVM_WRITE, 1,
				  io->lba, io->nlb, &t->mem, off, len, ts_cb, io);
}

/* Wait for everything in flight; check the reads. 0, 1 (mismatch), or -errno. */
static int ts_drain(struct ts *t, struct ts_io *io, unsigned qd, const char *tag, uint64_t *ops)
{
	int err = t->iso ? upcie_served_iqp_wait(&t->iq, UINT64_C(20) * 1000000000)
			 : upcie_served_qp_wait(&t->qp, UINT64_C(20) * 1000000000);

	if (err)
		return err;
	for (unsigned k = 0; k < qd; k++) {
		uint64_t off = TS_BUF_OFF + (uint64_t)io[k].slot * TS_CHUNK;
		int64_t d;

		if (!io[k].nlb)
			continue;
		if (io[k].err)
			return io[k].err;
		(*ops)++;
		if (!io[k].rd) {
			io[k].nlb = 0;
			continue;
		}
		d = tn_pat_diff((uint8_t *)t->mem.vaddr + off, (uint64_t)io[k].nlb * TS_LBA, tag,
				io[k].lba * TS_LBA);
		if (d >= 0) {
			DIAG("read of LBA %" PRIu64 "+%u differs at byte %" PRId64, io[k].lba,
			     io[k].nlb, d);
			return 1;
		}
		io[k].nlb = 0;
	}
	return 0;
}

static int ts_io_main(const struct ts_opts *o)
{
	struct ts_io io[TS_MAXQ];
	struct ts t;
	char tag[9];
	uint64_t x = 0x9e3779b97f4a7c15ull ^ o->lba, ops = 0, end, reconnects = 0;
	unsigned qd = o->qd ? o->qd : 8;
	int err = 0;

	if (!o->socket || !o->tag || !o->blocks || qd > TS_MAXQ || o->blocks < 128)
		return 2;
	tn_tag(tag, o->tag);
	memset(&t, 0, sizeof(t));
	end = upcie_time_ns() + (uint64_t)(o->secs * 1e9);
	for (int phase = 0; phase < 3;) {
		memset(io, 0, sizeof(io));
		if (!t.up) {
			uint64_t give_up = upcie_time_ns() + UINT64_C(30) * 1000000000;

			while ((err = ts_up(&t, o->socket, 2 * qd + 2, false, o->trusted)) &&
			       o->reconnect && upcie_time_ns() < give_up)
				usleep(50000);
			if (err) {
				DIAG("client %s: no server: %s", o->tag, upcie_errno_name(err));
				return 2;
			}
		}
		/* phase 0: fill; 1: random until the end; 2: read everything back */
		if (phase == 0 || phase == 2) {
			for (uint64_t b = 0; b < o->blocks && !err;) {
				unsigned k;

				for (k = 0; k < qd && b < o->blocks; k++) {
					io[k].rd = phase == 2;
					io[k].lba = o->lba + b;
					io[k].nlb = (uint32_t)(o->blocks - b < TS_CHUNK / TS_LBA
								   ? o->blocks - b
								   : TS_CHUNK / TS_LBA);
					io[k].slot = k;
					b += io[k].nlb;
					err = ts_submit(&t, &io[k], tag);
					if (err)
						break;
				}
				if (!err)
					err = ts_drain(&t, io, qd, tag, &ops);
			}
		} else {
			while (!err && upcie_time_ns() < end) {
				for (unsigned k = 0; k < qd && !err; k++) {
					uint32_t nlb = 8u << (ts_rand(&x) % 4); /* 4..32 KiB */

					io[k].rd = ts_rand(&x) & 1;
					io[k].nlb = nlb;
					io[k].lba = o->lba + ts_rand(&x) % (o->blocks - nlb + 1);
					io[k].slot = k;
					err = ts_submit(&t, &io[k], tag);
				}
				if (!err)
					err = ts_drain(&t, io, qd, tag, &ops);
			}
		}
		if (err == 1) {
			TAP(0, "client %s: data read back matches what was written", o->tag);
			ts_down(&t);
			return 1;
		}
		if (err == -ENOTCONN && o->reconnect) {
			/* the server is gone and its device released: start the phase over */
			DIAG("client %s: server gone, reconnecting", o->tag);
			reconnects++;
			ts_down(&t);
			err = 0;
			if (phase == 1)
				continue;
			continue;
		}
		if (err) {
			DIAG("client %s: %s", o->tag, upcie_errno_name(err));
			ts_down(&t);
			return 2;
		}
		phase++;
	}
	ts_down(&t);
	printf("# tb: served_io_%s=%" PRIu64 " ops, %" PRIu64 " reconnects\n", o->tag, ops,
	       reconnects);
	return 0;
}

/* ---- perf: the same polled loop, served or owned ---- */

struct tp_slot {
	bool busy;
	int err;
};

static void tp_cb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct tp_slot *s = (struct tp_slot *)ctx;

	s->busy = false;
	s->err = err ? err : upcie_nvme_cqe_ok(cqe) ? 0 : -EIO;
}

static void tp_icb(void *ctx, const struct upcie_served_cpl *c)
{
	struct tp_slot *s = (struct tp_slot *)ctx;

	s->busy = false;
	s->err = c->err ? c->err : c->status ? -EIO : 0;
}

static void tp_req_cb(struct upcie_nvme_req *r)
{
	struct tp_slot *s = (struct tp_slot *)r->ctx;

	s->busy = false;
	s->err = r->err;
}

/* Idle time of the whole guest in ns (all CPUs: /proc/stat's idle and iowait) and the CPUs. */
static uint64_t tsc_idle_ns(unsigned *ncpu)
{
	unsigned long long v[10] = { 0 };
	uint64_t idle;
	char line[256];
	FILE *f = fopen("/proc/stat", "r");

	*ncpu = 0;
	if (!f)
		return 0;
	if (fgets(line, sizeof(line), f))
		sscanf(line, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
		       &v[3], &v[4], &v[5], &v[6], &v[7]);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "cpu", 3) && line[3] >= '0' && line[3] <= '9')
			(*ncpu)++;
	fclose(f);
	idle = (v[3] + v[4]) * (1000000000ull / (uint64_t)sysconf(_SC_CLK_TCK));
	return idle;
}

static int ts_perf_main(const struct ts_opts *o)
{
	static struct upcie_nvme_req req[TS_MAXQ];
	struct tp_slot sl[TS_MAXQ];
	unsigned qd = o->qd ? o->qd : 1;
	uint64_t x = 88172645463325252ull, done = 0, issued = 0, t0, t1;
	uint64_t n = o->ops ? o->ops : 20000, span = o->blocks ? o->blocks / 8 : (16u << 20) / 4096;
	uint64_t base = o->lba, idle0, idle1;
	unsigned ncpu;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct upcie_dmamem mem;
	struct ts t;
	bool served = o->socket != NULL;
	const char *who = "owner";
	struct timespec c0, c1;
	int err = 0;

	if (qd > TS_MAXQ)
		return 2;
	memset(&t, 0, sizeof(t));
	memset(&c, 0, sizeof(c));
	memset(&q, 0, sizeof(q));
	memset(&mem, 0, sizeof(mem));
	if (served) {
		err = ts_up(&t, o->socket, 64, o->direct, o->trusted || o->direct);
		if (!err && o->direct && !t.cl.db)
			DIAG("perf: the whole device not granted, relayed");
		who = t.iso ? "isolated" : t.cl.db ? "direct" : "relayed";
	} else {
		struct upcie_nvme_ctrl_opts co;
		struct upcie_nvme_ioq_opts qo;
		struct upcie_pci_bdf bdf;

		memset(&co, 0, sizeof(co));
		if (!o->bdf || upcie_pci_bdf_parse(o->bdf, &bdf) ||
		    upcie_nvme_path_parse(o->path ? o->path : "auto", &co.dev.path))
			return 2;
		err = upcie_nvme_ctrl_open(&c, &bdf, &co);
		if (!err)
			err = upcie_nvme_ns_open(&ns, &c, 1);
		if (!err) {
			memset(&qo, 0, sizeof(qo));
			qo.depth = 64;
			err = upcie_nvme_ioq_create(&q, &c, &qo);
		}
		if (!err)
			err = upcie_nvme_dev_dmamem(&c.dev, TS_REGION, &mem);
	}
	if (err) {
		DIAG("perf setup: %s", upcie_errno_name(err));
		return 2;
	}
	memset(sl, 0, sizeof(sl));
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
	idle0 = tsc_idle_ns(&ncpu);
	t0 = upcie_time_ns();
	while (done < n && !err) {
		for (unsigned k = 0; k < qd && issued < n; k++) {
			uint64_t blk = ts_rand(&x) % span;

			if (sl[k].busy)
				continue;
			sl[k].busy = true;
			issued++;
			if (served && t.iso) {
				err = upcie_served_iqp_rw(
				    &t.iq, UPCIE_NVME_NVM_READ, 1, base + blk * 8, 8, &t.mem,
				    TS_BUF_OFF + k * 4096, 4096, tp_icb, &sl[k]);
			} else if (served) {
				err = upcie_served_qp_rw(
				    &t.qp, UPCIE_NVME_NVM_READ, 1, base + blk * 8, 8, &t.mem,
				    TS_BUF_OFF + k * 4096, 4096, tp_cb, &sl[k]);
			} else {
				req[k].cb = tp_req_cb;
				req[k].ctx = &sl[k];
				err = upcie_nvme_ioq_read(&q, &ns, base + blk * 8, &mem, k * 4096,
							  4096, &req[k]);
			}
			if (err)
				break;
		}
		while (!err) {
			int r = !served ? upcie_nvme_ioq_poll(&q, 64)
				: t.iso ? upcie_served_iqp_poll(&t.iq, 64)
					: upcie_served_qp_poll(&t.qp, 64);

			if (r < 0)
				err = r;
			if (r > 0) {
				done += (uint64_t)r;
				break;
			}
		}
		for (unsigned k = 0; k < qd && !err; k++)
			if (!sl[k].busy && sl[k].err)
				err = sl[k].err;
	}
	t1 = upcie_time_ns();
	idle1 = tsc_idle_ns(&ncpu);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
	if (served) {
		ts_down(&t);
	} else {
		upcie_dmamem_destroy(&mem);
		upcie_nvme_ioq_delete(&q);
		upcie_nvme_ctrl_close(&c);
	}
	if (err) {
		DIAG("perf: %s", upcie_errno_name(err));
		return 2;
	}
	if (qd == 1)
		printf("# tb: served_perf_%s_qd1_mean_us=%.1f\n", who,
		       (double)(t1 - t0) / 1e3 / (double)done);
	else
		printf("# tb: served_perf_%s_qd%u_iops=%.0f\n", who, qd,
		       (double)done * 1e9 / (double)(t1 - t0));
	/* this process, and the whole guest (the server's poller included; both poll) */
	printf("# tb: served_perf_%s_qd%u_cpu_us_per_io=%.2f client, %.2f guest\n", who, qd,
	       ((double)(c1.tv_sec - c0.tv_sec) * 1e6 + (double)(c1.tv_nsec - c0.tv_nsec) / 1e3) /
		   (double)done,
	       ((double)ncpu * (double)(t1 - t0) - (double)(idle1 - idle0)) / 1e3 / (double)done);
	return 0;
}

/* ---- scale: many controllers, many queues, one thread ---- */

#define TSC_MAXC  8u
#define TSC_MAXQ  4u
#define TSC_SLOTS 16u

struct tsc_slot {
	int state; /* 0 idle, 1 writing, 2 write done, 3 reading, 4 read done */
	int err;
	uint64_t lba;
	uint64_t off;
};

struct tsc_q {
	struct upcie_served_qp qp;
	struct upcie_served_iqp iq;
	bool iso;
	unsigned ctrl;
	uint64_t lba0;
	struct tsc_slot sl[TSC_SLOTS];
};

static void tsc_cb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct tsc_slot *s = (struct tsc_slot *)ctx;

	s->err = err ? err : upcie_nvme_cqe_ok(cqe) ? 0 : -EIO;
	s->state++;
}

static void tsc_icb(void *ctx, const struct upcie_served_cpl *c)
{
	struct tsc_slot *s = (struct tsc_slot *)ctx;

	s->err = c->err ? c->err : c->status ? -EIO : 0;
	s->state++;
}

static int tsc_poll(struct tsc_q *tq)
{
	return tq->iso ? upcie_served_iqp_poll(&tq->iq, 64) : upcie_served_qp_poll(&tq->qp, 64);
}

static int tsc_wait(struct tsc_q *tq)
{
	if (tq->iso)
		return tq->iq.live ? upcie_served_iqp_wait(&tq->iq, UINT64_C(10) * 1000000000) : 0;
	return tq->qp.live ? upcie_served_qp_wait(&tq->qp, UINT64_C(10) * 1000000000) : 0;
}

static int ts_scale_main(const struct ts_opts *o)
{
	static struct ts cl[TSC_MAXC];
	static struct tsc_q q[TSC_MAXC * TSC_MAXQ];
	char tags[TSC_MAXC][9], list[512], *tok, *save = NULL;
	char bdf[TSC_MAXC][32];
	unsigned nc = o->ctrls, nq = o->queues ? o->queues : 4, qd = o->qd ? o->qd : 8, n = 0, ncpu;
	uint64_t x = 0x2545F4914F6CDD1Dull, ops = 0, t0, t1, idle0, idle1;
	int err = 0;

	if (!o->bdfs || !o->dir || !nc || nc > TSC_MAXC || nq > TSC_MAXQ || qd > TSC_SLOTS)
		return 2;
	snprintf(list, sizeof(list), "%s", o->bdfs);
	for (tok = strtok_r(list, ",", &save); tok && n < TSC_MAXC;
	     tok = strtok_r(NULL, ",", &save))
		snprintf(bdf[n++], sizeof(bdf[0]), "%s", tok);
	if (n < nc)
		return 2;
	for (unsigned k = 0; k < nc && !err; k++) {
		struct upcie_served_qp_opts qo;
		char path[256];

		snprintf(path, sizeof(path), "%s/%s.sock", o->dir, bdf[k]);
		snprintf(list, sizeof(list), "sk%u", k);
		tn_tag(tags[k], list);
		err = upcie_served_connect(&cl[k].cl, path, o->trusted ? 0 : UPCIE_SERVED_ISOLATED);
		if (!err)
			err = upcie_served_mem_alloc(&cl[k].cl, TS_REGION, &cl[k].mem);
		for (unsigned j = 0; j < nq && !err; j++) {
			struct tsc_q *tq = &q[k * nq + j];

			memset(&qo, 0, sizeof(qo));
			qo.depth = 2 * qd + 2;
			qo.sq_off = (uint64_t)j * 256 * 1024;
			qo.cq_off = qo.sq_off + 64 * 1024;
			qo.list_off = qo.sq_off + 128 * 1024;
			tq->iso = cl[k].cl.info.isolated;
			if (tq->iso)
				err = upcie_served_iqp_create(&cl[k].cl, &tq->iq, qo.depth);
			else
				err = upcie_served_qp_create(&cl[k].cl, &tq->qp, &cl[k].mem, &qo);
			tq->ctrl = k;
			tq->lba0 = (uint64_t)j * 2048;
			for (unsigned i = 0; i < qd; i++)
				tq->sl[i].off = TS_BUF_OFF + ((uint64_t)j * TSC_SLOTS + i) * 4096;
		}
		if (err)
			DIAG("scale: controller %s: %s", bdf[k], upcie_errno_name(err));
	}
	t0 = upcie_time_ns();
	idle0 = tsc_idle_ns(&ncpu);
	while (!err && upcie_time_ns() - t0 < (uint64_t)(o->secs * 1e9)) {
		for (unsigned i = 0; i < nc * nq && !err; i++) {
			struct tsc_q *tq = &q[i];
			struct ts *c = &cl[tq->ctrl];
			bool ring = false;
			int r = tsc_poll(tq);

			if (r < 0) {
				err = r;
				break;
			}
			for (unsigned s = 0; s < qd && !err; s++) {
				struct tsc_slot *sl = &tq->sl[s];
				uint8_t *buf = (uint8_t *)c->mem.vaddr + sl->off;

				if (sl->state == 1 || sl->state == 3)
					continue;
				if (sl->err) {
					err = sl->err;
					break;
				}
				if (sl->state == 4) {
					if (tn_pat_diff(buf, 4096, tags[tq->ctrl], sl->lba * 512) >=
					    0) {
						DIAG("scale: controller %u LBA %" PRIu64 " differs",
						     tq->ctrl, sl->lba);
						err = 1;
						break;
					}
					ops++;
				}
				if (sl->state == 2) {
					ops++;
					memset(buf, 0, 4096);
					sl->state = 3;
				} else {
					sl->lba = tq->lba0 + (ts_rand(&x) % 256) * 8;
					tn_pat(buf, 4096, tags[tq->ctrl], sl->lba * 512);
					sl->state = 1;
				}
				if (tq->iso) {
					struct upcie_served_sub u;

					memset(&u, 0, sizeof(u));
					u.opc = sl->state == 3 ? UPCIE_NVME_NVM_READ
							       : UPCIE_NVME_NVM_WRITE;
					u.nsid = 1;
					u.slba = sl->lba;
					u.nlb = 8;
					u.region = c->mem.id;
					u.off = sl->off;
					u.len = 4096;
					err = upcie_served_iqp_submit(&tq->iq, &u, tsc_icb, sl);
				} else {
					struct upcie_nvme_sqe sqe;

					memset(&sqe, 0, sizeof(sqe));
					sqe.opc = sl->state == 3 ? UPCIE_NVME_NVM_READ
								 : UPCIE_NVME_NVM_WRITE;
					sqe.nsid = 1;
					sqe.cdw10 = (uint32_t)sl->lba;
					sqe.cdw12 = 7;
					err = upcie_served_qp_enqueue(&tq->qp, &sqe, &c->mem,
								      sl->off, 4096, tsc_cb, sl);
				}
				ring = true;
			}
			if (ring && tq->iso)
				upcie_served_iqp_ring(&tq->iq);
			else if (ring)
				upcie_served_qp_ring(&tq->qp);
		}
	}
	t1 = upcie_time_ns();
	idle1 = tsc_idle_ns(&ncpu);
	for (unsigned i = 0; i < nc * nq; i++)
		if (tsc_wait(&q[i]) && !err)
			err = -ETIMEDOUT;
	if (!err) {
		double secs = (double)(t1 - t0) / 1e9;
		double busy = (double)ncpu * (double)(t1 - t0) - (double)(idle1 - idle0);

		printf("# tb: served_scale_%uctrl=%.0f IOPS, %.1f us guest CPU per I/O (%u queues, "
		       "QD %u each, %" PRIu64 " I/Os in %.1f s)\n",
		       nc, (double)ops / secs, busy / 1e3 / (double)(ops ? ops : 1), nc * nq, qd,
		       ops, secs);
	}
	/* fill: every queue's range holds its controller's pattern (the host checks it) */
	for (unsigned i = 0; o->fill && !err && i < nc * nq; i++) {
		struct tsc_q *tq = &q[i];
		struct ts *c = &cl[tq->ctrl];
		uint8_t *buf =
		    (uint8_t *)c->mem.vaddr + TS_BUF_OFF + (uint64_t)(i % nq) * 256 * 1024;
		struct ts_io io;

		for (uint64_t b = 0; b < 2048 && !err; b += 128) {
			tn_pat(buf, 65536, tags[tq->ctrl], (tq->lba0 + b) * 512);
			memset(&io, 0, sizeof(io));
			io.busy = true;
			if (tq->iso)
				err = upcie_served_iqp_rw(
				    &tq->iq, UPCIE_NVME_NVM_WRITE, 1, tq->lba0 + b, 128, &c->mem,
				    (uint64_t)(buf - (uint8_t *)c->mem.vaddr), 65536, ts_icb, &io);
			else
				err = upcie_served_qp_rw(
				    &tq->qp, UPCIE_NVME_NVM_WRITE, 1, tq->lba0 + b, 128, &c->mem,
				    (uint64_t)(buf - (uint8_t *)c->mem.vaddr), 65536, ts_cb, &io);
			if (!err)
				err = tsc_wait(tq);
			if (!err)
				err = io.err;
		}
	}
	for (unsigned i = 0; i < nc * nq; i++) {
		if (q[i].iso)
			upcie_served_iqp_delete(&q[i].iq);
		else
			upcie_served_qp_delete(&q[i].qp);
	}
	for (unsigned k = 0; k < nc; k++) {
		upcie_served_mem_free(&cl[k].mem);
		upcie_served_disconnect(&cl[k].cl);
	}
	if (err)
		DIAG("scale: %s", err == 1 ? "data mismatch" : upcie_errno_name(err));
	return err == 1 ? 1 : err ? 2 : 0;
}

/* ---- dmabuf: device memory as a served queue's data ---- */

#define TSD_BAR 2u
#define TSD_OFF (16u << 20)

static int ts_dmabuf_main(const struct ts_opts *o)
{
	struct upcie_vfio_iommufd ictx;
	struct upcie_vfio_device vdev;
	struct upcie_vfio_region bar;
	struct upcie_served_mem dm;
	struct upcie_pci_bdf bdf;
	uint64_t len = o->blocks * TS_LBA;
	struct ts t;
	char tag[9];
	int dfd = -1, err;

	memset(&ictx, 0, sizeof(ictx));
	memset(&vdev, 0, sizeof(vdev));
	memset(&bar, 0, sizeof(bar));
	memset(&t, 0, sizeof(t));
	memset(&dm, 0, sizeof(dm));
	vdev.fd = -1;
	if (!o->socket || !o->vram || !o->blocks || len % 4096 ||
	    upcie_pci_bdf_parse(o->vram, &bdf))
		return 2;
	tn_tag(tag, "c0n1");
	err = upcie_vfio_iommufd_open(&ictx);
	if (!err)
		err = upcie_vfio_cdev_open(&vdev, &ictx, &bdf);
	if (!err)
		err = upcie_vfio_dmabuf_export(&vdev, TSD_BAR, TSD_OFF, len, &dfd);
	TAP(!err, "a %" PRIu64 " KiB slice of BAR%u of %s exported as a dma-buf: %s", len >> 10,
	    TSD_BAR, o->vram, err ? upcie_errno_name(err) : "ok");
	if (!err)
		err = ts_up(&t, o->socket, 16, false, true);
	if (!err) {
		err = upcie_served_mem_register_dmabuf(&t.cl, dfd, len, &dm);
		TAP(!err && !dm.vaddr,
		    "the server imported it for the controller (IOVA 0x%" PRIx64 "): %s",
		    dm.dm.iova, err ? upcie_errno_name(err) : "ok");
	}
	if (!err) {
		struct upcie_served_qp_opts qo;
		struct upcie_served_qp bad;

		memset(&qo, 0, sizeof(qo));
		qo.depth = 16;
		qo.cq_off = 4096;
		qo.list_off = 8192;
		upcie_log_set_level(UPCIE_LOG_NONE);
		TAP(upcie_served_qp_create(&t.cl, &bad, &dm, &qo) == -EINVAL,
		    "rings in the dma-buf (no CPU view) are refused");
		upcie_log_set_level(UPCIE_LOG_ERROR);
	}
	for (uint64_t b = 0; !err && b < o->blocks; b += 256) {
		uint32_t nlb = (uint32_t)(o->blocks - b < 256 ? o->blocks - b : 256);
		struct ts_io io;

		memset(&io, 0, sizeof(io));
		io.busy = true;
		err = upcie_served_qp_rw(&t.qp, UPCIE_NVME_NVM_READ, 1, o->lba + b, nlb, &dm,
					 b * TS_LBA, (uint64_t)nlb * TS_LBA, ts_cb, &io);
		if (!err)
			err = upcie_served_qp_wait(&t.qp, UINT64_C(10) * 1000000000);
		if (!err)
			err = io.err;
	}
	if (!err) {
		TAP(1, "%" PRIu64 " blocks read from LBA %" PRIu64 " into the device memory",
		    o->blocks, o->lba);
		err = upcie_vfio_region_map(&vdev, TSD_BAR, &bar);
		if (!err) {
			int64_t d =
			    tn_pat_diff((uint8_t *)bar.addr + TSD_OFF, len, tag, o->lba * TS_LBA);

			TAP(d < 0, "the BAR holds c0n1's data (first difference: %" PRId64 ")", d);
			printf("# tb: served_dmabuf=%u+%" PRIu64 "+%" PRIu64 "\n", TSD_OFF, len,
			       o->lba * TS_LBA);
			err = d < 0 ? 0 : 1;
		}
	} else {
		DIAG("dmabuf: %s", upcie_errno_name(err));
	}
	upcie_served_qp_delete(&t.qp);
	upcie_served_mem_free(&dm);
	ts_down(&t);
	upcie_vfio_region_unmap(&bar);
	if (dfd >= 0)
		close(dfd);
	upcie_vfio_device_close(&vdev);
	upcie_vfio_iommufd_close(&ictx);
	return err ? (err == 1 ? 1 : 2) : 0;
}

/* ---- attack: what an isolated client must not get ---- */

static int ta_one(struct ts *t, const struct upcie_served_sub *u)
{
	struct ts_io io;
	int err;

	memset(&io, 0, sizeof(io));
	io.busy = true;
	err = upcie_served_iqp_submit(&t->iq, u, ts_icb, &io);
	if (!err)
		err = upcie_served_iqp_wait(&t->iq, UINT64_C(10) * 1000000000);
	return err ? err : io.err;
}

static int ts_attack_main(const struct ts_opts *o)
{
	struct upcie_served_qp_opts qo;
	struct upcie_served_qp qp;
	struct upcie_served_sub u;
	struct ts t;
	int bad = 0, err;

	if (!o->socket || !o->blocks)
		return 2;
	memset(&t, 0, sizeof(t));
	err = ts_up(&t, o->socket, 8, false, false);
	if (err || !t.iso) {
		DIAG("attack: no isolated queue: %s", upcie_errno_name(err));
		return 2;
	}
	memset(&qo, 0, sizeof(qo));
	qo.depth = 8;
	qo.cq_off = 64 * 1024;
	qo.list_off = 128 * 1024;
	/* the library refuses it; the server too (raw, the library's check bypassed) */
	t.cl.info.isolated = false;
	err = upcie_served_qp_create(&t.cl, &qp, &t.mem, &qo);
	t.cl.info.isolated = true;
	TAP(err == -EPERM, "attack: a trusted queue pair refused by the server (%s)",
	    upcie_errno_name(err));
	bad += err != -EPERM;
	memset(&u, 0, sizeof(u));
	u.opc = UPCIE_NVME_NVM_WRITE;
	u.nsid = 1;
	u.nlb = 8;
	u.region = t.mem.id;
	u.off = TS_BUF_OFF;
	u.len = 8 * TS_LBA;
	tn_pat((uint8_t *)t.mem.vaddr + TS_BUF_OFF, 8 * TS_LBA, "attack", 0);
	u.slba = o->lba + o->blocks;
	err = ta_one(&t, &u);
	TAP(err == -EPERM, "attack: a Write just past the grant refused (%s)",
	    upcie_errno_name(err));
	bad += err != -EPERM;
	u.slba = o->lba + o->blocks - 4;
	err = ta_one(&t, &u);
	TAP(err == -EPERM, "attack: a Write straddling the grant's end refused (%s)",
	    upcie_errno_name(err));
	bad += err != -EPERM;
	u.slba = o->lba + o->blocks + 3 * 1024 * 1024;
	err = ta_one(&t, &u);
	TAP(err == -EPERM || err == -EINVAL, "attack: a Write far outside refused (%s)",
	    upcie_errno_name(err));
	bad += err != -EPERM && err != -EINVAL;
	u.slba = o->lba;
	u.region = t.mem.id + 1;
	err = ta_one(&t, &u);
	TAP(err == -ENOENT, "attack: a region it does not have refused (%s)",
	    upcie_errno_name(err));
	bad += err != -ENOENT;
	u.region = t.mem.id;
	u.off = TS_REGION - 1024;
	err = ta_one(&t, &u);
	TAP(err == -EINVAL, "attack: data past its region refused (%s)", upcie_errno_name(err));
	bad += err != -EINVAL;
	u.off = TS_BUF_OFF;
	u.opc = 0x04; /* Write Uncorrectable */
	err = ta_one(&t, &u);
	TAP(err == -EPERM, "attack: Write Uncorrectable refused (%s)", upcie_errno_name(err));
	bad += err != -EPERM;
	u.opc = UPCIE_NVME_NVM_WRITE;
	err = ta_one(&t, &u);
	TAP(err == 0, "attack: its own Write inside the grant works (%s)", upcie_errno_name(err));
	bad += err != 0;
	ts_down(&t);
	return bad ? 1 : 0;
}

static int ts_sentinel_main(const struct ts_opts *o)
{
	size_t len = (size_t)(o->mb ? o->mb : 16) << 20;
	uint64_t *p =
	    (uint64_t *)mmap(NULL, len, PROT_READ | PROT_WRITE,
			     MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_POPULATE, -1, 0);
	uint64_t bad = 0;

	if (p == MAP_FAILED) {
		DIAG("sentinel: %zu MiB of hugepages: %s", len >> 20, strerror(errno));
		return 2;
	}
	for (size_t i = 0; i < len / 8; i++)
		p[i] = 0x5e17e1u ^ (i * 0x9e3779b97f4a7c15ull);
	usleep((useconds_t)(o->secs * 1e6));
	for (size_t i = 0; i < len / 8; i++)
		bad += p[i] != (0x5e17e1u ^ (i * 0x9e3779b97f4a7c15ull));
	printf("# tb: served_sentinel=%" PRIu64 " changed words in %zu MiB\n", bad, len >> 20);
	munmap(p, len);
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct ts_opts o;

	memset(&o, 0, sizeof(o));
	o.as = -1;
	o.secs = 2;
	if (argc < 2)
		return 2;
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";

		if (!strcmp(a, "--reconnect")) {
			o.reconnect = true;
			continue;
		}
		if (!strcmp(a, "--fill")) {
			o.fill = true;
			continue;
		}
		if (!strcmp(a, "--direct")) {
			o.direct = true;
			continue;
		}
		if (!strcmp(a, "--trusted")) {
			o.trusted = true;
			continue;
		}
		i++;
		if (!strcmp(a, "--socket"))
			o.socket = v;
		else if (!strcmp(a, "--tag"))
			o.tag = v;
		else if (!strcmp(a, "--bdf"))
			o.bdf = v;
		else if (!strcmp(a, "--path"))
			o.path = v;
		else if (!strcmp(a, "--lba"))
			o.lba = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--blocks"))
			o.blocks = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--ops"))
			o.ops = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--seconds"))
			o.secs = strtod(v, NULL);
		else if (!strcmp(a, "--qd"))
			o.qd = (unsigned)strtoul(v, NULL, 0);
		else if (!strcmp(a, "--mb"))
			o.mb = (unsigned)strtoul(v, NULL, 0);
		else if (!strcmp(a, "--vram"))
			o.vram = v;
		else if (!strcmp(a, "--bdfs"))
			o.bdfs = v;
		else if (!strcmp(a, "--dir"))
			o.dir = v;
		else if (!strcmp(a, "--ctrls"))
			o.ctrls = (unsigned)strtoul(v, NULL, 0);
		else if (!strcmp(a, "--queues"))
			o.queues = (unsigned)strtoul(v, NULL, 0);
		else if (!strcmp(a, "--as"))
			o.as = strtol(v, NULL, 0);
		else
			return 2;
	}
	upcie_log_set_handler(tn_log, NULL);
	if (o.as >= 0 && (setgid((gid_t)o.as) || setuid((uid_t)o.as))) {
		DIAG("cannot become uid %ld", o.as);
		return 2;
	}
	if (!strcmp(argv[1], "io"))
		return ts_io_main(&o);
	if (!strcmp(argv[1], "perf"))
		return ts_perf_main(&o);
	if (!strcmp(argv[1], "dmabuf"))
		return ts_dmabuf_main(&o);
	if (!strcmp(argv[1], "scale"))
		return ts_scale_main(&o);
	if (!strcmp(argv[1], "sentinel"))
		return ts_sentinel_main(&o);
	if (!strcmp(argv[1], "attack"))
		return ts_attack_main(&o);
	return 2;
}
