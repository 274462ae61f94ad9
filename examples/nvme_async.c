/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * nvme_async: asynchronous I/O on several queue pairs at once, one thread per queue pair.
 *
 *   nvme_async [--path auto|uio|type1|iommufd] [--nsid N] [--queues Q] [--qd D]
 *              [--io-size S] [--bytes B] [--lba L] BDF
 *
 * Brings the controller at BDF up as examples/nvme_driver.c does, then starts Q threads (default
 * 4, at most what the controller grants). Each thread creates its own I/O queue pair (the
 * controller's lock makes concurrent creation safe; from then on the thread is the queue's only
 * user, which is all the queue pair needs: no locks on the I/O path) and works on its own slice
 * of B bytes (default 256 KiB) of one namespace, from LBA L (default: the end of the namespace).
 * Five passes over the slice, each with up to D requests of S bytes in flight (default 16 of
 * 4 KiB), completed through callbacks: save the slice, write a pattern that depends on the
 * thread and the byte's place on the namespace (so a write landing at the wrong LBA is seen),
 * read it back and compare, write the saved data back, read that back and compare. The saved
 * data is written back whatever failed after it was saved, so the namespace is left as it was
 * found; zoned namespaces and namespaces with metadata are refused (as nvme_driver explains).
 *
 * What the asynchronous API asks of a program (nvme/ns.h, nvme/qpair.h):
 * - a request (struct upcie_nvme_req) and its buffer belong to the controller from a successful
 *   submit until its callback, which comes exactly once, from upcie_nvme_ioq_poll() on the
 *   thread that owns the queue;
 * - a submit returns -EBUSY when the queue has no room now: poll, then submit again;
 * - a request that does not complete in time is ended with upcie_nvme_ioq_wait(), which aborts
 *   it; if even that does not end it, its memory must never be freed (upcie_dmamem_keep()).
 *
 * Needs root and hugepages (upcie-setup hugepages reserve 64).
 */
// testbed-ldflags: -lpthread
#include <upcie/base/feature.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/clock.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#define MAX_QUEUES 64
#define MAX_QD	   256
/* No completion for this long: end what is in flight (Abort) and give up. */
#define STALL_NS (10 * UPCIE_NSEC_PER_SEC)

struct worker;

/* One request slot: what is in flight at one time. */
struct slot {
	struct upcie_nvme_req req;
	struct worker *w;
	uint64_t slba;
	bool busy;
};

struct worker {
	struct upcie_nvme_ctrl *c;
	const struct upcie_nvme_ns *ns;
	struct upcie_nvme_ioq q;
	const struct upcie_dmamem *mem;
	uint64_t save, data, back; /* offsets in mem of this thread's three buffers */
	uint64_t lba, bytes, io;   /* the slice and the request size */
	unsigned qd, id;
	uint16_t qid;
	struct slot slots[MAX_QD];
	unsigned inflight, max_inflight;
	uint64_t ncpl, nsub;
	int err;	  /* first error of the pass */
	uint64_t err_lba; /* where it happened */
	bool stuck;	  /* a request the controller never gave back: keep the memory */
	bool verified;	  /* pattern read back */
	bool restored;	  /* saved data written back and read back */
	int result;	  /* 0 or the first error */
};

/* The request callback: runs inside upcie_nvme_ioq_poll() on the owner thread. */
static void on_done(struct upcie_nvme_req *r)
{
	struct slot *s = (struct slot *)r->ctx;
	struct worker *w = s->w;

	s->busy = false;
	w->inflight--;
	w->ncpl++;
	if (r->err && !w->err) {
		w->err = r->err;
		w->err_lba = s->slba;
		if (r->err == -EIO)
			fprintf(stderr, "nvme_async: queue %u: LBA %" PRIu64 ": %s\n", w->q.qid,
				s->slba, upcie_nvme_status_str(upcie_nvme_cqe_code(&r->cqe)));
	}
}

/*
 * One pass: `opc` (read or write) over the whole slice, buffer at `off` in the DMA memory, up to
 * qd requests in flight. Returns 0 or the first error; when it returns nothing is in flight
 * (or w->stuck is set).
 */
static int pass(struct worker *w, uint8_t opc, uint64_t off)
{
	uint64_t n = w->bytes / w->io, next = 0, last = upcie_time_ns();
	uint32_t blocks = (uint32_t)(w->io / w->ns->lba_bytes);

	w->err = 0;
	while (next < n || w->inflight) {
		int got;

		/* fill every free slot (stop submitting after an error; let the rest finish) */
		for (unsigned i = 0; i < w->qd && next < n && !w->err; i++) {
			struct slot *s = &w->slots[i];
			int err;

			if (s->busy)
				continue;
			s->slba = w->lba + next * blocks;
			s->req.cb = on_done;
			s->req.ctx = s;
			err = opc == UPCIE_NVME_NVM_READ
				  ? upcie_nvme_ioq_read(&w->q, w->ns, s->slba, w->mem,
							off + next * w->io, w->io, &s->req)
				  : upcie_nvme_ioq_write(&w->q, w->ns, s->slba, w->mem,
							 off + next * w->io, w->io, &s->req);
			if (err == -EBUSY)
				break; /* no room in the queue now: poll first */
			if (err) {
				w->err = err;
				w->err_lba = s->slba;
				break;
			}
			s->busy = true;
			next++;
			w->nsub++;
			if (++w->inflight > w->max_inflight)
				w->max_inflight = w->inflight;
		}
		if (w->err && !w->inflight)
			break;
		got = upcie_nvme_ioq_poll(&w->q, 64);
		if (got < 0)
			return got; /* the controller wrote a completion the queue cannot accept */
		if (got > 0) {
			last = upcie_time_ns();
			continue;
		}
		if (upcie_time_ns() - last < STALL_NS) {
			upcie_cpu_relax();
			continue;
		}
		/* Stalled: upcie_nvme_ioq_wait() aborts each request still out, bounded. */
		fprintf(stderr, "nvme_async: queue %u: no completion for %u s, aborting\n",
			w->q.qid, (unsigned)(STALL_NS / UPCIE_NSEC_PER_SEC));
		for (unsigned i = 0; i < w->qd; i++)
			if (w->slots[i].busy)
				upcie_nvme_ioq_wait(&w->q, &w->slots[i].req, UPCIE_NSEC_PER_SEC);
		for (unsigned i = 0; i < w->qd; i++)
			w->stuck |= w->slots[i].busy;
		return -ETIMEDOUT;
	}
	return w->err;
}

/* Byte i of the slice: depends on its place on the namespace and on the thread. */
static void pattern(uint8_t *p, uint64_t len, uint64_t pos, unsigned id)
{
	for (uint64_t i = 0; i < len; i++) {
		uint64_t x = (pos + i) * 0x9e3779b97f4a7c15ull + id;

		p[i] = (uint8_t)(x >> 56);
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = (struct worker *)arg;
	uint8_t *base = (uint8_t *)w->mem->vaddr;
	int err, rerr;

	/* the queue is created by, and belongs to, this thread */
	w->result = upcie_nvme_ioq_create(&w->q, w->c, NULL);
	if (w->result)
		return NULL;
	w->qid = w->q.qid;
	pattern(base + w->data, w->bytes, w->lba * w->ns->lba_bytes, w->id);
	err = pass(w, UPCIE_NVME_NVM_READ, w->save);
	if (err) {
		w->result = err; /* nothing saved, so nothing may be written */
		goto out;
	}
	err = pass(w, UPCIE_NVME_NVM_WRITE, w->data);
	if (!err && !w->stuck)
		err = pass(w, UPCIE_NVME_NVM_READ, w->back);
	if (!err && memcmp(base + w->data, base + w->back, w->bytes))
		err = -EIO;
	w->verified = !err;
	/* write the saved data back, whatever happened after it was saved */
	rerr = w->stuck ? -ETIMEDOUT : pass(w, UPCIE_NVME_NVM_WRITE, w->save);
	if (!rerr && !w->stuck)
		rerr = pass(w, UPCIE_NVME_NVM_READ, w->back);
	if (!rerr && memcmp(base + w->save, base + w->back, w->bytes))
		rerr = -EIO;
	w->restored = !rerr;
	w->result = err ? err : rerr;
out:
	if (!w->stuck)
		upcie_nvme_ioq_delete(&w->q);
	return NULL;
}

/* Why the write/restore cycle cannot run on `ns`, or NULL when it can (as nvme_driver). */
static const char *unusable(const struct upcie_nvme_ns *ns)
{
	if (ns->zoned)
		return "zoned (writes only at a zone's write pointer: no restore in place)";
	if (ns->ms || ns->pi)
		return "formatted with metadata, which this example cannot save and restore";
	return NULL;
}

static int pick_ns(struct upcie_nvme_ctrl *c, uint32_t want, struct upcie_nvme_ns *out)
{
	uint32_t ids[64], n = 0;
	int err = upcie_nvme_ctrl_ns_list(c, ids, 64, &n);

	if (err)
		return err;
	for (uint32_t i = 0; i < n && i < 64; i++) {
		const char *why;

		if ((want && ids[i] != want) || upcie_nvme_ns_open(out, c, ids[i]))
			continue;
		why = unusable(out);
		if (!why)
			return 0;
		if (want) {
			fprintf(stderr, "nvme_async: namespace %u is %s\n", want, why);
			return -EOPNOTSUPP;
		}
	}
	fprintf(stderr, "nvme_async: no usable namespace%s\n", want ? " with that id" : "");
	return -ENOENT;
}

int main(int argc, char **argv)
{
	static struct worker w[MAX_QUEUES];
	pthread_t th[MAX_QUEUES];
	struct upcie_nvme_ctrl_opts opts;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ns ns;
	struct upcie_dmamem mem;
	struct upcie_pci_bdf bdf;
	uint64_t bytes = 256 << 10, io = 4096, lba = UINT64_MAX, t0, ncpl = 0;
	unsigned nq = 4, qd = 16, started = 0;
	uint32_t nsid = 0;
	const char *bdf_s = NULL;
	bool stuck = false;
	int err;

	memset(&opts, 0, sizeof(opts));
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(argv[i], "--path") && v && !upcie_nvme_path_parse(v, &opts.dev.path))
			i++;
		else if (!strcmp(argv[i], "--nsid") && v)
			nsid = (uint32_t)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--queues") && v)
			nq = (unsigned)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--qd") && v)
			qd = (unsigned)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--io-size") && v)
			io = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--bytes") && v)
			bytes = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--lba") && v)
			lba = strtoull(argv[++i], NULL, 0);
		else if (argv[i][0] != '-' && !bdf_s)
			bdf_s = argv[i];
		else
			bdf_s = NULL, i = argc;
	}
	if (!bdf_s || upcie_pci_bdf_parse(bdf_s, &bdf) || !nq || nq > MAX_QUEUES || !qd ||
	    qd > MAX_QD || !io || !bytes || bytes % io) {
		fprintf(stderr,
			"usage: nvme_async [--path auto|uio|type1|iommufd] [--nsid N] "
			"[--queues 1..64] [--qd 1..256] [--io-size S] [--bytes B] [--lba L] "
			"BDF\n  (B per queue, a multiple of S)\n");
		return 2;
	}

	opts.dev.bind = true;
	err = upcie_nvme_ctrl_open(&c, &bdf, &opts);
	if (err) {
		fprintf(stderr, "nvme_async: cannot bring up %s: %s\n", bdf_s, strerror(-err));
		return 1;
	}
	printf("%s on the %s path: %s, %u I/O queues granted\n", c.name,
	       upcie_nvme_path_name(c.dev.path), c.mn, c.nqueues);
	memset(&mem, 0, sizeof(mem));
	err = pick_ns(&c, nsid, &ns);
	if (err)
		goto out;
	if (!c.nqueues) {
		fprintf(stderr, "nvme_async: the controller granted no I/O queue\n");
		err = -EOPNOTSUPP;
		goto out;
	}
	if (nq > c.nqueues)
		nq = c.nqueues;
	if (io % ns.lba_bytes || nq * bytes / ns.lba_bytes > ns.nsze) {
		fprintf(stderr,
			"nvme_async: requests of %" PRIu64 " B on %u B blocks, or %u x %" PRIu64
			" B on a namespace of %" PRIu64 " blocks: no\n",
			io, ns.lba_bytes, nq, bytes, ns.nsze);
		err = -EINVAL;
		goto out;
	}
	if (lba == UINT64_MAX)
		lba = ns.nsze - nq * bytes / ns.lba_bytes;
	if (lba > ns.nsze || nq * bytes / ns.lba_bytes > ns.nsze - lba) {
		fprintf(stderr, "nvme_async: the slices do not fit the namespace\n");
		err = -EINVAL;
		goto out;
	}
	printf("  namespace %u: %u queues x QD %u, %" PRIu64 " KiB requests, %" PRIu64
	       " KiB per queue from LBA %" PRIu64 "\n",
	       ns.nsid, nq, qd, io >> 10, bytes >> 10, lba);

	/* One DMA allocation for everybody, three buffers per thread: save, data, read-back. */
	err = upcie_nvme_dev_dmamem(&c.dev, 3 * nq * bytes, &mem);
	if (err)
		goto out;
	t0 = upcie_time_ns();
	for (unsigned i = 0; i < nq; i++) {
		w[i].c = &c;
		w[i].ns = &ns;
		w[i].mem = &mem;
		w[i].save = 3 * i * bytes;
		w[i].data = w[i].save + bytes;
		w[i].back = w[i].data + bytes;
		w[i].lba = lba + i * bytes / ns.lba_bytes;
		w[i].bytes = bytes;
		w[i].io = io;
		w[i].qd = qd;
		w[i].id = i;
		for (unsigned k = 0; k < qd; k++)
			w[i].slots[k].w = &w[i];
		if (pthread_create(&th[i], NULL, worker_main, &w[i])) {
			err = -EAGAIN;
			break;
		}
		started++;
	}
	for (unsigned i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	for (unsigned i = 0; i < started; i++) {
		printf("  queue %u (thread %u): LBA %" PRIu64 "+%" PRIu64 ": %" PRIu64
		       " requests, %" PRIu64 " callbacks, up to %u in flight; %s, %s\n",
		       w[i].qid, i, w[i].lba, bytes / ns.lba_bytes, w[i].nsub, w[i].ncpl,
		       w[i].max_inflight, w[i].verified ? "read-back verified" : "NOT verified",
		       w[i].restored ? "original data restored" : "NOT restored");
		if (w[i].result) {
			fprintf(stderr, "nvme_async: thread %u: %s (near LBA %" PRIu64 ")\n", i,
				strerror(-w[i].result), w[i].err_lba);
			if (!err)
				err = w[i].result;
		}
		ncpl += w[i].ncpl;
		stuck |= w[i].stuck;
	}
	if (!err)
		printf("  all %u queues verified and restored: %" PRIu64 " commands in %.1f ms\n",
		       started, ncpl, (double)(upcie_time_ns() - t0) / 1e6);
out:
	/* memory the controller may still write is kept, never freed */
	if (stuck)
		upcie_dmamem_keep(&mem);
	else
		upcie_dmamem_destroy(&mem);
	if (upcie_nvme_ctrl_close(&c) == 0 && !err)
		printf("  controller shut down\n");
	if (err)
		fprintf(stderr, "nvme_async: %s\n", strerror(-err));
	return err ? 1 : 0;
}
