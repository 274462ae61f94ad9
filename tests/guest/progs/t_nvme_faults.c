/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest test of the NVMe driver (nvme/ctrl.h, nvme/ns.h) against the faulty controller c2 of the
 * test bed: c2n1 fails reads and writes at fixed sectors (QEMU blkdebug), c2n2 is throttled to a
 * few commands per second (QEMU throttling).
 *
 * Media errors: a read or write touching a bad sector ends once with -EIO and the status QEMU
 * posts (Unrecovered Read Error, Write Fault), its neighbours work, the queue keeps working and
 * the failed write left the image alone (checked on the host). Slow commands: a read given less
 * time than it takes is aborted and, QEMU never aborting, ends by its own late completion within
 * the abort timeout; a synchronous read that does not end even then resets the controller, and
 * its buffer is not written after it returned; requests queued behind it end with -ECANCELED at
 * the reset, exactly once, and I/O works after it. A soak: random reads, writes and flushes on
 * c2n1, bad sectors included, with resets and short-timeout waits thrown in, every request
 * ending exactly once and every read of known data verified. Prints TAP with one plan; # tb:
 * lines for nvme_faults.host.sh.
 *
 * Usage: t_nvme_faults PATH [SOAK_SECONDS]   (uio or type1; TB_C2_* give the controller)
 */
// testbed-ldflags: -lpthread
#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/clock.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/dev.h>
#include <upcie/nvme/ns.h>

#include "t_nvme_util.h"

#define MS	   UPCIE_NSEC_PER_MSEC
#define DATA_BYTES (16 * MiB)
#define NREG	   80	      /* soak regions */
#define REG_BYTES  (32 * KiB) /* one region: its buffer and its LBA range */
#define REG_LBA0   8000u      /* soak area of c2n1: LBA 8000..13119, both bad sectors */
#define MARK	   0x5a

static enum upcie_nvme_path g_path;
static struct upcie_pci_bdf g_c2;
static uint64_t g_rerr, g_werr, g_iops;

static int ctrl_open(struct upcie_nvme_ctrl *c, uint64_t abort_ms)
{
	struct upcie_nvme_ctrl_opts o;

	memset(&o, 0, sizeof(o));
	o.dev.path = g_path;
	o.dev.bind = true;
	o.host_mem = 16 * MiB;
	o.abort_timeout_ns = abort_ms * MS;
	o.admin_timeout_ns = 5000 * MS;
	return upcie_nvme_ctrl_open(c, &g_c2, &o);
}

struct done {
	struct upcie_nvme_req req;
	int calls;
	const uint8_t *buf; /* snapshot of it when the callback ran, for a later compare */
	uint8_t seen[4096];
};

static void done_cb(struct upcie_nvme_req *r)
{
	struct done *d = (struct done *)r->ctx;

	d->calls++;
	if (d->buf)
		memcpy(d->seen, d->buf, sizeof(d->seen));
}

static void done_init(struct done *d)
{
	memset(d, 0, sizeof(*d));
	d->req.cb = done_cb;
	d->req.ctx = d;
}

/* c2n1: reads and writes on bad sectors. */
static void part_media(struct upcie_nvme_ctrl *c, struct upcie_nvme_ioq *q,
		       const struct upcie_dmamem *mem)
{
	struct upcie_nvme_ns ns;
	struct upcie_nvme_cqe cqe;
	struct done d;
	uint8_t *b = (uint8_t *)mem->vaddr;
	char tag[9], wtag[9];
	int err;

	tn_tag(tag, "c2n1");
	err = upcie_nvme_ns_open(&ns, c, 1);
	TAP(err == 0 && ns.lba_bytes == 512, "c2n1: 512 B blocks, %llu blocks (%d)",
	    (unsigned long long)ns.nsze, err);
	if (err)
		return;
	memset(&cqe, 0, sizeof(cqe));
	done_init(&d);
	err = upcie_nvme_ioq_sync(q, upcie_nvme_ioq_read(q, &ns, g_rerr, mem, 0, 512, &d.req),
				  &d.req, 5000 * MS, &cqe);
	TAP(err == -EIO && d.calls == 1 &&
		upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_UNRECOVERED_READ,
	    "c2n1: read of bad sector %llu: -EIO, %s (0x%03x), one callback (%d, %d)",
	    (unsigned long long)g_rerr, upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)),
	    upcie_nvme_cqe_code(&cqe), err, d.calls);
	err = upcie_nvme_ioq_read_sync(q, &ns, g_rerr - 4, mem, 0, 8 * 512, &cqe);
	TAP(err == -EIO, "c2n1: a read across it fails too (%d)", err);
	memset(b, 0, 4096);
	err = upcie_nvme_ioq_read_sync(q, &ns, g_rerr + 64, mem, 0, 4096, NULL);
	TAP(err == 0 && tn_pat_diff(b, 4096, tag, (g_rerr + 64) * 512) == -1,
	    "c2n1: a read beside it returns the image's pattern (%d)", err);
	tn_tag(wtag, "W2");
	tn_pat(b, 4096, wtag, g_werr * 512);
	err = upcie_nvme_ioq_write_sync(q, &ns, g_werr, mem, 0, 4096, &cqe);
	TAP(err == -EIO && upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_WRITE_FAULT,
	    "c2n1: write of bad sector %llu: -EIO, %s (0x%03x) (%d)", (unsigned long long)g_werr,
	    upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)), upcie_nvme_cqe_code(&cqe), err);
	INFO("c2n1_werr", "%llu+4096", (unsigned long long)(g_werr * 512));
	tn_pat(b, 4096, wtag, 2048 * 512);
	err = upcie_nvme_ioq_write_sync(q, &ns, 2048, mem, 0, 4096, NULL);
	memset(b + 8192, 0, 4096);
	if (!err)
		err = upcie_nvme_ioq_read_sync(q, &ns, 2048, mem, 8192, 4096, NULL);
	TAP(err == 0 && tn_pat_diff(b + 8192, 4096, wtag, 2048 * 512) == -1,
	    "c2n1: a write beside them works and reads back (%d)", err);
	if (!err)
		INFO("c2n1_write", "%llu+4096+%s", (unsigned long long)(2048 * 512), wtag);
	TAP(c->state == UPCIE_NVME_CTRL_READY && upcie_nvme_qpair_inflight(&q->qp) == 0 &&
		q->qp.nbad == 0,
	    "c2: media errors need no reset: ready, nothing in flight, no bad completion");
}

/* c2n2 (throttled): late completions after an Abort, and an escalation. */
static void part_slow(void)
{
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct upcie_dmamem mem;
	static struct done d, queued[6];
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_io io;
	uint8_t *b, seen[4096];
	char tag[9];
	uint64_t t0, ms;
	int err, ok = 0, once = 0, late = 0;

	tn_tag(tag, "c2n2");
	memset(&mem, 0, sizeof(mem));
	/* an abort timeout long enough for a throttled command to end by itself */
	err = ctrl_open(&c, 2000);
	if (!err)
		err = upcie_nvme_ns_open(&ns, &c, 2);
	if (!err)
		err = upcie_nvme_dev_dmamem(&c.dev, DATA_BYTES, &mem);
	if (!err)
		err = upcie_nvme_ioq_create(&q, &c, NULL);
	TAP(err == 0, "c2n2: controller, namespace, memory and queue (%d)", err);
	if (err)
		goto out;
	b = (uint8_t *)mem.vaddr;
	t0 = upcie_time_ns();
	for (int i = 0; i < 10; i++)
		ok += upcie_nvme_ioq_read_sync(&q, &ns, (uint64_t)i * 8, &mem, 0, 4096, NULL) == 0;
	ms = (upcie_time_ns() - t0) / MS;
	TAP(ok == 10 && ms >= 10 * 1000 / g_iops / 2,
	    "c2n2: throttled: 10 reads in %llu ms (%llu per second allowed)",
	    (unsigned long long)ms, (unsigned long long)g_iops);
	INFO("c2n2_10_reads_ms", "%llu", (unsigned long long)ms);

	/* given 1 ms: aborted (QEMU does not abort), then its own completion within 2 s */
	done_init(&d);
	memset(b, 0, 4096);
	err = upcie_nvme_ioq_read(&q, &ns, 800, &mem, 0, 4096, &d.req);
	if (!err)
		err = upcie_nvme_ioq_wait(&q, &d.req, 1 * MS);
	TAP(err == -ETIMEDOUT && d.req.done && d.calls == 1 && d.req.err == 0 &&
		tn_pat_diff(b, 4096, tag, 800 * 512) == -1,
	    "c2n2: a read given 1 ms: -ETIMEDOUT, then it ended once by its late completion, data "
	    "intact (%d, %d calls, %d)",
	    err, d.calls, d.req.err);

	/*
	 * Commands queued behind the throttle, then a synchronous read that cannot end in time:
	 * Abort not performed, 1 ms abort timeout: the controller is reset. QEMU completes what it
	 * has in flight before it reports CSTS.RDY = 0; after that no buffer may change.
	 */
	c.abort_timeout_ns = 1 * MS;
	ok = 0;
	memset(b, MARK, 1 * MiB);
	for (int i = 0; i < 6; i++) {
		done_init(&queued[i]);
		queued[i].buf = b + (uint64_t)(i + 1) * 64 * KiB;
		upcie_nvme_ioq_read(&q, &ns, 1024 + (uint64_t)i * 8, &mem,
				    (uint64_t)(i + 1) * 64 * KiB, 4096, &queued[i].req);
	}
	seg.mem = &mem;
	seg.off = 0;
	seg.len = 4096;
	memset(&io, 0, sizeof(io));
	io.opc = UPCIE_NVME_NVM_READ;
	io.slba = 900;
	io.segs = &seg;
	io.nsegs = 1;
	err = upcie_nvme_ioq_io_sync(&q, &ns, &io, 20 * MS, NULL);
	memcpy(seen, b, sizeof(seen));
	TAP(err == -ETIMEDOUT && c.state == UPCIE_NVME_CTRL_FAILED,
	    "c2n2: a synchronous read that does not end within the abort timeout resets the "
	    "controller: -ETIMEDOUT, state FAILED (%d, %d)",
	    err, (int)c.state);
	upcie_sleep_ns(500 * MS); /* QEMU would have completed it by now */
	TAP(!memcmp(seen, b, sizeof(seen)), "c2n2: its buffer did not change after it returned");
	err = upcie_nvme_ctrl_reset(&c);
	upcie_sleep_ns(300 * MS);
	for (int i = 0; i < 6; i++) {
		once += queued[i].calls == 1;
		/* their own completion (QEMU finished them before it reported RDY = 0), or
		 * -ECANCELED; either way nothing changed after the callback */
		ok += (queued[i].req.err == -ECANCELED ||
		       (queued[i].req.err == 0 &&
			tn_pat_diff(queued[i].buf, 4096, tag, (1024 + (uint64_t)i * 8) * 512) ==
			    -1)) &&
		      !memcmp(queued[i].seen, queued[i].buf, 4096);
		late += queued[i].req.err == 0;
	}
	TAP(err == 0 && once == 6 && ok == 6,
	    "c2n2: the requests queued behind it ended once each (%d by their completion, the "
	    "rest -ECANCELED), no buffer changed after its callback (%d, %d, %d)",
	    late, err, once, ok);
	c.abort_timeout_ns = 2000 * MS;
	memset(b, 0, 4096);
	err = upcie_nvme_ioq_read_sync(&q, &ns, 900, &mem, 0, 4096, NULL);
	TAP(err == 0 && tn_pat_diff(b, 4096, tag, 900 * 512) == -1,
	    "c2n2: I/O after the reset reads the image's pattern (%d)", err);
	upcie_nvme_ioq_delete(&q);
out:
	upcie_dmamem_destroy(&mem);
	upcie_nvme_ctrl_close(&c);
}

/* The soak: one region per buffer and LBA range, one request at a time per region. */
struct sreg {
	struct upcie_nvme_req req;
	struct soak *s;
	int idx, kind, calls;
	uint32_t gen, len;
	bool busy, known;
	uint32_t known_gen;
};

struct soak {
	struct upcie_nvme_ioq *q;
	struct upcie_nvme_ns *ns;
	const struct upcie_dmamem *mem;
	struct sreg r[NREG];
	uint64_t rng, submitted, ended, ok, eio, cancelled, twice, mismatch, resets, timeouts;
	uint32_t gen;
};

static uint64_t rnd(struct soak *s, uint64_t n)
{
	s->rng ^= s->rng << 13;
	s->rng ^= s->rng >> 7;
	s->rng ^= s->rng << 17;
	return s->rng % n;
}

static uint8_t spat(uint32_t gen, uint64_t off)
{
	uint64_t x = (off >> 3) * 0x9e3779b97f4a7c15ull + gen;

	return (uint8_t)((x >> 29) ^ off);
}

static bool touches_bad(uint64_t lba, uint64_t n)
{
	return (g_rerr >= lba && g_rerr < lba + n) || (g_werr >= lba && g_werr < lba + n);
}

static void soak_cb(struct upcie_nvme_req *req)
{
	struct sreg *g = (struct sreg *)req->ctx;
	struct soak *s = g->s;
	const uint8_t *b = (const uint8_t *)s->mem->vaddr + (uint64_t)g->idx * REG_BYTES;

	if (++g->calls > 1)
		s->twice++;
	g->busy = false;
	s->ended++;
	if (req->err == 0) {
		s->ok++;
		if (g->kind == 1) {
			g->known = true;
			g->known_gen = g->gen;
		} else if (g->kind == 0 && g->known) {
			for (uint32_t i = 0; i < g->len; i++)
				if (b[i] != spat(g->known_gen, (uint64_t)g->idx * REG_BYTES + i)) {
					s->mismatch++;
					break;
				}
		}
	} else {
		s->eio += req->err == -EIO;
		s->cancelled += req->err == -ECANCELED;
		if (g->kind == 1)
			g->known = false;
	}
}

static void soak_submit(struct soak *s)
{
	struct sreg *g = &s->r[rnd(s, NREG)];
	uint64_t off = (uint64_t)g->idx * REG_BYTES, lba = REG_LBA0 + off / 512;
	uint8_t *b = (uint8_t *)s->mem->vaddr + off;
	int kind = (int)rnd(s, 10), err;

	if (g->busy)
		return;
	kind = kind < 5 ? 0 : kind < 9 ? 1 : 2;
	memset(&g->req, 0, sizeof(g->req));
	g->req.cb = soak_cb;
	g->req.ctx = g;
	g->kind = kind;
	g->calls = 0;
	g->len = REG_BYTES;
	if (kind == 1) {
		g->gen = ++s->gen;
		for (uint32_t i = 0; i < REG_BYTES; i++)
			b[i] = spat(g->gen, off + i);
		err = upcie_nvme_ioq_write(s->q, s->ns, lba, s->mem, off, REG_BYTES, &g->req);
	} else if (kind == 0) {
		memset(b, 0, REG_BYTES);
		err = upcie_nvme_ioq_read(s->q, s->ns, lba, s->mem, off, REG_BYTES, &g->req);
	} else {
		err = upcie_nvme_ioq_flush(s->q, s->ns, &g->req);
	}
	if (err)
		return;
	g->busy = true;
	s->submitted++;
	/* a region over a bad sector never holds known data */
	if (kind == 1 && touches_bad(lba, REG_BYTES / 512))
		g->known = false;
}

static void part_soak(uint64_t seconds)
{
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct upcie_dmamem mem;
	static struct soak s;
	uint64_t t0, busy;
	int err;

	memset(&mem, 0, sizeof(mem));
	memset(&s, 0, sizeof(s));
	err = ctrl_open(&c, 20);
	if (!err)
		err = upcie_nvme_ns_open(&ns, &c, 1);
	if (!err)
		err = upcie_nvme_dev_dmamem(&c.dev, DATA_BYTES, &mem);
	if (!err)
		err = upcie_nvme_ioq_create(&q, &c, NULL);
	TAP(err == 0, "soak: controller, c2n1, memory and queue (%d)", err);
	if (err)
		goto out;
	s.q = &q;
	s.ns = &ns;
	s.mem = &mem;
	s.rng = 0x50a45eedull ^ upcie_time_ns();
	for (int i = 0; i < NREG; i++) {
		s.r[i].s = &s;
		s.r[i].idx = i;
	}
	t0 = upcie_time_ns();
	while (upcie_time_ns() - t0 < seconds * UPCIE_NSEC_PER_SEC) {
		uint64_t k = rnd(&s, 1000);

		if (c.state != UPCIE_NVME_CTRL_READY || k == 0) {
			/*
			 * QEMU 7.2 crashed (a use-after-free of the SQ in nvme_rw_complete_cb) on
			 * resets that came right after a doorbell: let it fetch what was submitted
			 * first. The reset still finds commands in flight and completions unreaped.
			 */
			upcie_sleep_ns(10 * MS);
			s.resets++;
			upcie_nvme_ctrl_reset(&c);
		} else if (k < 5) {
			struct sreg *g = &s.r[rnd(&s, NREG)];

			if (g->busy)
				s.timeouts +=
				    upcie_nvme_ioq_wait(&q, &g->req, 50 * UPCIE_NSEC_PER_USEC) ==
				    -ETIMEDOUT;
		} else {
			soak_submit(&s);
		}
		upcie_nvme_ioq_poll(&q, 64);
	}
	/* let everything end, by completion or by a reset */
	for (int tries = 0; tries < 2000; tries++) {
		busy = 0;
		for (int i = 0; i < NREG; i++)
			busy += s.r[i].busy;
		if (!busy)
			break;
		upcie_nvme_ioq_poll(&q, 64);
		upcie_sleep_ns(1 * MS);
	}
	if (busy) {
		s.resets++;
		upcie_nvme_ctrl_reset(&c);
	}
	busy = 0;
	for (int i = 0; i < NREG; i++)
		busy += s.r[i].busy;
	TAP(s.submitted > 100 && s.ended == s.submitted && busy == 0 && s.twice == 0,
	    "soak: %llu s, %llu requests, each ended exactly once (%llu ended, %llu pending, %llu "
	    "twice)",
	    (unsigned long long)seconds, (unsigned long long)s.submitted,
	    (unsigned long long)s.ended, (unsigned long long)busy, (unsigned long long)s.twice);
	TAP(s.mismatch == 0 && s.eio > 0,
	    "soak: reads of known data verified (%llu mismatches); %llu ok, %llu media errors, "
	    "%llu cancelled, %llu resets, %llu waits timed out",
	    (unsigned long long)s.mismatch, (unsigned long long)s.ok, (unsigned long long)s.eio,
	    (unsigned long long)s.cancelled, (unsigned long long)s.resets,
	    (unsigned long long)s.timeouts);
	INFO("soak",
	     "seconds=%llu requests=%llu ok=%llu eio=%llu cancelled=%llu resets=%llu "
	     "timeouts=%llu lost=%llu twice=%llu mismatches=%llu",
	     (unsigned long long)seconds, (unsigned long long)s.submitted, (unsigned long long)s.ok,
	     (unsigned long long)s.eio, (unsigned long long)s.cancelled,
	     (unsigned long long)s.resets, (unsigned long long)s.timeouts, (unsigned long long)busy,
	     (unsigned long long)s.twice, (unsigned long long)s.mismatch);
	upcie_nvme_ioq_delete(&q);
out:
	upcie_dmamem_destroy(&mem);
	upcie_nvme_ctrl_close(&c);
}

int main(int argc, char **argv)
{
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ioq q;
	struct upcie_dmamem mem;
	const char *e;
	uint64_t soak = 20;
	int err;

	setvbuf(stdout, NULL, _IOLBF, 0);
	upcie_log_set_handler(tn_log, NULL);
	if (argc < 2 || tn_bdf_env("TB_C2_BDF", &g_c2) || upcie_nvme_path_parse(argv[1], &g_path) ||
	    g_path == UPCIE_NVME_PATH_AUTO) {
		fprintf(stderr, "usage: t_nvme_faults uio|type1|iommufd [SOAK_SECONDS] (TB_C2_* "
				"set)\n");
		return 2;
	}
	if (argc > 2)
		soak = strtoull(argv[2], NULL, 0);
	e = getenv("TB_C2_RERR");
	g_rerr = e ? strtoull(e, NULL, 0) : 8192;
	e = getenv("TB_C2_WERR");
	g_werr = e ? strtoull(e, NULL, 0) : 12288;
	e = getenv("TB_C2_IOPS");
	g_iops = e ? strtoull(e, NULL, 0) : 20;
	DIAG("kernel %s, path %s, bad sectors %llu (read) and %llu (write), %llu IOPS on c2n2",
	     tn_kernel(), argv[1], (unsigned long long)g_rerr, (unsigned long long)g_werr,
	     (unsigned long long)g_iops);

	memset(&mem, 0, sizeof(mem));
	err = ctrl_open(&c, 2000);
	TAP(err == 0, "c2: opened on the %s path (%d)", argv[1], err);
	if (!err) {
		err = upcie_nvme_dev_dmamem(&c.dev, DATA_BYTES, &mem);
		if (!err)
			err = upcie_nvme_ioq_create(&q, &c, NULL);
		TAP(err == 0, "c2: memory and I/O queue (%d)", err);
		if (!err) {
			part_media(&c, &q, &mem);
			upcie_nvme_ioq_delete(&q);
		}
		upcie_dmamem_destroy(&mem);
		upcie_nvme_ctrl_close(&c);
		part_slow();
		part_soak(soak);
	}
	printf("1..%d\n", tn_n);
	return tn_failed ? 1 : 0;
}
