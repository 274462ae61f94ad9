/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * upcie-perf: NVMe load generator on upcie's public headers (the role of spdk_nvme_perf).
 *
 *   upcie-perf --bdf 0000:01:00.0 [--path auto|uio|type1|iommufd] [--bind] [--ns 1]
 *              [--queues 1,4] [--qd 1,32] [--bs 4k,128k] [--pattern rand,seq] [--mix 100,70,0]
 *              [--time 10] [--size BYTES] [--json]
 *
 * Lists run as their cartesian product on one controller. Each run: one thread per queue pair,
 * each keeping QD requests of BS bytes in flight (polled), random or sequential offsets in the
 * first SIZE bytes of the namespace (default: all of it), MIX percent reads (the rest writes:
 * it overwrites data). Progress per second on stderr; a summary per run (IOPS, MB/s, latency
 * mean/p50/p99/p99.9/max from submission to completion) on stdout, or JSON with --json.
 * The build with CUDA adds the GPU-initiated mode (--gpu, see upcie-perf-gpu.cuh).
 *
 * Needs what nvme/dev.h needs for the path (root; the function bound to uio_pci_generic or
 * vfio-pci, or --bind, which refuses a device the system uses; hugepages). Exit 0 when every
 * run completed without an I/O error, 1 otherwise, 2 on a usage error.
 */
// testbed-ldflags: -lpthread
#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <upcie/base/clock.h>
#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/dev.h>
#include <upcie/nvme/ns.h>
#include <upcie/pci/bdf.h>

#include "perf-stats.h"

#define PERF_MAX_LIST 16
#define PERF_MAX_Q    64

struct perf_list {
	uint64_t v[PERF_MAX_LIST];
	unsigned n;
};

struct perf_opts {
	const char *bdf, *path;
	bool bind, json;
	uint32_t nsid;
	struct perf_list queues, qd, bs, mix, pattern; /* pattern: 0 rand, 1 seq */
	double secs;
	uint64_t size;
	bool gpu;
	const char *gpu_target; /* "null" or a controller */
	bool gpu_sq_host;
};

/* Set once per run to end it; read by every worker (and the GPU mode's host loop). */
static int perf_stop;

#define PERF_LOAD(p)	 __atomic_load_n(p, __ATOMIC_RELAXED)
#define PERF_STORE(p, v) __atomic_store_n(p, v, __ATOMIC_RELAXED)
#define PERF_ADD(p, v)	 __atomic_fetch_add(p, v, __ATOMIC_RELAXED)

struct perf_slot {
	struct upcie_nvme_req req;
	struct perf_q *q;
	uint64_t t0, off;
	bool read, busy;
	struct perf_slot *next_ready;
};

struct perf_q {
	pthread_t th;
	unsigned idx;
	struct upcie_nvme_ctrl *c;
	const struct upcie_nvme_ns *ns;
	const struct perf_opts *o;
	unsigned qd, mix, seq;
	uint64_t bs, region, seq_next, rng;
	struct perf_slot *slots, *ready;
	struct perf_hist lat;
	uint64_t ios, bytes; /* updated by the worker, read by the progress loop */
	uint64_t errors;
	int err;
	unsigned inflight;
};

static uint64_t perf_rand(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static void perf_done(struct upcie_nvme_req *r)
{
	struct perf_slot *s = (struct perf_slot *)r->ctx;
	struct perf_q *q = s->q;

	perf_hist_add(&q->lat, upcie_time_ns() - s->t0);
	if (r->err)
		q->errors++;
	PERF_ADD(&q->ios, 1);
	PERF_ADD(&q->bytes, q->bs);
	q->inflight--;
	s->busy = false;
	s->next_ready = q->ready;
	q->ready = s;
}

/* Choose the next request of slot s: offset and direction. */
static void perf_next(struct perf_q *q, struct perf_slot *s)
{
	uint64_t blocks = q->region / q->bs;

	if (q->seq) {
		s->off = q->seq_next;
		q->seq_next += q->bs;
		if (q->seq_next + q->bs > q->region)
			q->seq_next = 0;
	} else {
		s->off = (perf_rand(&q->rng) % blocks) * q->bs;
	}
	s->read = q->mix >= 100 || (perf_rand(&q->rng) % 100) < q->mix;
}

static void *perf_worker(void *arg)
{
	struct perf_q *q = (struct perf_q *)arg;
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ioq ioq;
	struct upcie_dmamem buf;
	uint64_t lba = q->ns->lba_bytes;
	int err;

	memset(&qo, 0, sizeof(qo));
	/* room for every request even when the controller splits them */
	qo.depth = q->qd + 1;
	{
		uint64_t chunk = q->c->max_xfer < q->bs ? q->c->max_xfer : q->bs;
		uint64_t pieces = (q->bs + chunk - 1) / chunk;

		qo.depth = (uint32_t)(q->qd * pieces + 1);
		qo.max_xfer = q->bs;
	}
	if (qo.depth > q->c->mqes)
		qo.depth = q->c->mqes;
	err = upcie_nvme_ioq_create(&ioq, q->c, &qo);
	if (err) {
		q->err = err;
		return NULL;
	}
	err = upcie_nvme_dev_dmamem(&q->c->dev, (size_t)q->qd * q->bs, &buf);
	if (err) {
		q->err = err;
		upcie_nvme_ioq_delete(&ioq);
		return NULL;
	}
	for (uint64_t i = 0; i < buf.size; i += 8)
		*(uint64_t *)((char *)buf.vaddr + i) = i ^ 0x5a5a5a5a5a5a5a5aull;
	for (unsigned i = 0; i < q->qd; i++) {
		q->slots[i].q = q;
		q->slots[i].req.cb = perf_done;
		q->slots[i].req.ctx = &q->slots[i];
		q->slots[i].next_ready = q->ready;
		q->ready = &q->slots[i];
	}
	while (!PERF_LOAD(&perf_stop)) {
		while (q->ready) {
			struct perf_slot *s = q->ready;
			uint64_t boff = (uint64_t)(s - q->slots) * q->bs;

			perf_next(q, s);
			s->t0 = upcie_time_ns();
			err = s->read ? upcie_nvme_ioq_read(&ioq, q->ns, s->off / lba, &buf, boff,
							    q->bs, &s->req)
				      : upcie_nvme_ioq_write(&ioq, q->ns, s->off / lba, &buf, boff,
							     q->bs, &s->req);
			if (err == -EBUSY)
				break;
			if (err) {
				q->err = err;
				PERF_STORE(&perf_stop, 1);
				break;
			}
			q->ready = s->next_ready;
			s->busy = true;
			q->inflight++;
		}
		err = upcie_nvme_ioq_poll(&ioq, 0xffffffffu);
		if (err < 0) {
			q->err = err;
			PERF_STORE(&perf_stop, 1);
		}
	}
	/* drain: every request ends once; one the controller does not finish is aborted and
	 * cancelled by the queue's wait */
	for (unsigned i = 0; i < q->qd; i++)
		if (q->slots[i].busy)
			upcie_nvme_ioq_wait(&ioq, &q->slots[i].req, UPCIE_NVME_IO_TIMEOUT);
	/* the buffer goes back only after its queue is gone or idle */
	if (!upcie_nvme_ioq_delete(&ioq) || !q->inflight)
		upcie_dmamem_destroy(&buf);
	return NULL;
}

static int perf_run_cpu(struct upcie_nvme_ctrl *c, const struct upcie_nvme_ns *ns,
			const struct perf_opts *o, unsigned queues, unsigned qd, uint64_t bs,
			unsigned seq, unsigned mix, struct perf_result *res)
{
	struct perf_q *qs = (struct perf_q *)calloc(queues, sizeof(*qs));
	uint64_t region = o->size ? o->size : ns->nsze * ns->lba_bytes, t0, last_ios = 0,
		 last_b = 0;
	int err = 0;

	if (!qs)
		return -ENOMEM;
	if (region > ns->nsze * ns->lba_bytes)
		region = ns->nsze * ns->lba_bytes;
	memset(res, 0, sizeof(*res));
	perf_hist_init(&res->lat);
	snprintf(res->mode, sizeof(res->mode), "cpu");
	snprintf(res->path, sizeof(res->path), "%s", upcie_nvme_path_name(c->dev.path));
	snprintf(res->target, sizeof(res->target), "%s/%u", c->name, ns->nsid);
	snprintf(res->pattern, sizeof(res->pattern), "%s", seq ? "seq" : "rand");
	res->queues = queues, res->qd = qd, res->bs = bs, res->mix = mix;
	if (bs % ns->lba_bytes || bs > region) {
		fprintf(stderr,
			"upcie-perf: bs %" PRIu64 " is not whole %u-byte blocks within the "
			"region\n",
			bs, ns->lba_bytes);
		free(qs);
		return -EINVAL;
	}
	PERF_STORE(&perf_stop, 0);
	t0 = upcie_time_ns();
	for (unsigned i = 0; i < queues; i++) {
		struct perf_q *q = &qs[i];

		q->idx = i, q->c = c, q->ns = ns, q->o = o, q->qd = qd, q->mix = mix, q->seq = seq;
		q->bs = bs, q->region = region;
		q->seq_next = (region / queues / bs) * bs * i;
		q->rng = 0x9e3779b97f4a7c15ull * (i + 1) ^ t0;
		perf_hist_init(&q->lat);
		q->slots = (struct perf_slot *)calloc(qd, sizeof(*q->slots));
		if (!q->slots || pthread_create(&q->th, NULL, perf_worker, q)) {
			err = -ENOMEM;
			PERF_STORE(&perf_stop, 1);
			queues = i;
			break;
		}
	}
	for (unsigned sec = 1; !err && !PERF_LOAD(&perf_stop); sec++) {
		uint64_t ios = 0, b = 0, target = t0 + (uint64_t)sec * UPCIE_NSEC_PER_SEC,
			 end = t0 + (uint64_t)(o->secs * 1e9);
		uint64_t now = upcie_time_ns();
		bool last = target >= end;

		if (last)
			target = end;
		if (target > now)
			usleep((useconds_t)((target - now) / 1000));
		for (unsigned i = 0; i < queues; i++) {
			ios += PERF_LOAD(&qs[i].ios);
			b += PERF_LOAD(&qs[i].bytes);
		}
		fprintf(stderr, "[%3us] %10.0f IOPS %9.1f MB/s\n", sec, (double)(ios - last_ios),
			(double)(b - last_b) / 1e6);
		last_ios = ios, last_b = b;
		if (last)
			PERF_STORE(&perf_stop, 1);
	}
	for (unsigned i = 0; i < queues; i++) {
		pthread_join(qs[i].th, NULL);
		if (qs[i].err && !err)
			err = qs[i].err;
	}
	res->secs = (double)(upcie_time_ns() - t0) / 1e9;
	for (unsigned i = 0; i < queues; i++) {
		res->ios += qs[i].ios;
		res->bytes += qs[i].bytes;
		res->errors += qs[i].errors;
		perf_hist_merge(&res->lat, &qs[i].lat);
		free(qs[i].slots);
	}
	/* the rate over the measured window: requests finished while draining count, their
	 * time too */
	free(qs);
	return err;
}

#if defined(UPCIE_PERF_GPU)
#include "upcie-perf-gpu.cuh"
#endif

static int perf_list_parse(const char *s, struct perf_list *l, bool sizes)
{
	char buf[256], *tok, *save = NULL;

	snprintf(buf, sizeof(buf), "%s", s);
	l->n = 0;
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *end;
		uint64_t v;

		if (l->n == PERF_MAX_LIST)
			return -EINVAL;
		if (!sizes && !strcmp(tok, "rand")) {
			l->v[l->n++] = 0;
			continue;
		}
		if (!sizes && !strcmp(tok, "seq")) {
			l->v[l->n++] = 1;
			continue;
		}
		errno = 0;
		v = strtoull(tok, &end, 0);
		if (errno || end == tok)
			return -EINVAL;
		if (sizes && (*end == 'k' || *end == 'K'))
			v <<= 10, end++;
		else if (sizes && (*end == 'm' || *end == 'M'))
			v <<= 20, end++;
		if (*end)
			return -EINVAL;
		l->v[l->n++] = v;
	}
	return l->n ? 0 : -EINVAL;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: upcie-perf --bdf BDF [options]      (CPU-driven queues)\n"
#if defined(UPCIE_PERF_GPU)
		"       upcie-perf --gpu null|BDF [options] (GPU-initiated queues)\n"
#endif
		"  --path auto|uio|type1|iommufd   DMA path (default auto)\n"
		"  --bind                           bind the function to the path's driver first\n"
		"  --ns N                           namespace (default 1)\n"
		"  --queues LIST                    queue pairs, one thread each (default 1)\n"
		"  --qd LIST                        requests in flight per queue (default 1)\n"
		"  --bs LIST                        bytes per request, k/M suffixes (default 4k)\n"
		"  --pattern LIST                   rand, seq (default rand)\n"
		"  --mix LIST                       percent reads, the rest writes (default 100)\n"
		"  --time S                         seconds per run (default 5)\n"
		"  --size BYTES                     region of the namespace (default all)\n"
#if defined(UPCIE_PERF_GPU)
		"  --sq-host                        GPU mode: SQs in host memory (default VRAM)\n"
#endif
		"  --json                           summaries as JSON on stdout\n"
		"LISTs are comma-separated; every combination runs. Writes overwrite data.\n");
}

int main(int argc, char **argv)
{
	struct perf_opts o;
	struct upcie_nvme_ctrl_opts co;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ns ns;
	struct upcie_pci_bdf bdf;
	enum upcie_nvme_path path = UPCIE_NVME_PATH_AUTO;
	bool first = true, failed = false;
	int err;

	memset(&o, 0, sizeof(o));
	o.nsid = 1;
	o.secs = 5;
	perf_list_parse("1", &o.queues, true);
	perf_list_parse("1", &o.qd, true);
	perf_list_parse("4k", &o.bs, true);
	perf_list_parse("100", &o.mix, true);
	perf_list_parse("rand", &o.pattern, false);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int bad = 0;

		if (!strcmp(a, "--json")) {
			o.json = true;
			continue;
		} else if (!strcmp(a, "--bind")) {
			o.bind = true;
			continue;
		} else if (!strcmp(a, "--sq-host")) {
			o.gpu_sq_host = true;
			continue;
		} else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			return 0;
		}
		if (!v) {
			fprintf(stderr, "upcie-perf: %s needs a value\n", a);
			return 2;
		}
		i++;
		if (!strcmp(a, "--bdf"))
			o.bdf = v;
		else if (!strcmp(a, "--gpu"))
			o.gpu = true, o.gpu_target = v;
		else if (!strcmp(a, "--path"))
			o.path = v, bad = upcie_nvme_path_parse(v, &path);
		else if (!strcmp(a, "--ns"))
			o.nsid = (uint32_t)strtoul(v, NULL, 0), bad = !o.nsid;
		else if (!strcmp(a, "--queues"))
			bad = perf_list_parse(v, &o.queues, true);
		else if (!strcmp(a, "--qd"))
			bad = perf_list_parse(v, &o.qd, true);
		else if (!strcmp(a, "--bs"))
			bad = perf_list_parse(v, &o.bs, true);
		else if (!strcmp(a, "--mix"))
			bad = perf_list_parse(v, &o.mix, true);
		else if (!strcmp(a, "--pattern"))
			bad = perf_list_parse(v, &o.pattern, false);
		else if (!strcmp(a, "--time"))
			o.secs = atof(v), bad = !(o.secs > 0);
		else if (!strcmp(a, "--size")) {
			struct perf_list l;

			bad = perf_list_parse(v, &l, true);
			o.size = bad ? 0 : l.v[0];
		} else {
			fprintf(stderr, "upcie-perf: unknown option %s\n", a);
			usage(stderr);
			return 2;
		}
		if (bad) {
			fprintf(stderr, "upcie-perf: bad value for %s: '%s'\n", a, v);
			return 2;
		}
	}
	for (unsigned i = 0; i < o.queues.n; i++)
		if (!o.queues.v[i] || o.queues.v[i] > PERF_MAX_Q) {
			fprintf(stderr, "upcie-perf: queues 1..%u\n", PERF_MAX_Q);
			return 2;
		}
	for (unsigned i = 0; i < o.qd.n; i++)
		if (!o.qd.v[i] || o.qd.v[i] > 4095) {
			fprintf(stderr, "upcie-perf: qd 1..4095\n");
			return 2;
		}
	for (unsigned i = 0; i < o.mix.n; i++)
		if (o.mix.v[i] > 100) {
			fprintf(stderr, "upcie-perf: mix is a percentage of reads\n");
			return 2;
		}
	if (o.gpu) {
#if defined(UPCIE_PERF_GPU)
		return perf_gpu_main(&o);
#else
		fprintf(stderr, "upcie-perf: --gpu needs the CUDA build (upcie-perf-cuda)\n");
		return 2;
#endif
	}
	if (!o.bdf || upcie_pci_bdf_parse(o.bdf, &bdf)) {
		usage(stderr);
		return 2;
	}
	memset(&co, 0, sizeof(co));
	co.dev.path = path;
	co.dev.bind = o.bind;
	err = upcie_nvme_ctrl_open(&c, &bdf, &co);
	if (err) {
		fprintf(stderr, "upcie-perf: cannot open %s: %s\n", o.bdf, strerror(-err));
		return 1;
	}
	err = upcie_nvme_ns_open(&ns, &c, o.nsid);
	if (err) {
		upcie_nvme_ctrl_close(&c);
		return 1;
	}
	if (o.json)
		printf("{\"runs\": [\n");
	for (unsigned a = 0; a < o.queues.n; a++)
		for (unsigned b = 0; b < o.qd.n; b++)
			for (unsigned s = 0; s < o.bs.n; s++)
				for (unsigned p = 0; p < o.pattern.n; p++)
					for (unsigned m = 0; m < o.mix.n; m++) {
						struct perf_result r;

						err = perf_run_cpu(&c, &ns, &o,
								   (unsigned)o.queues.v[a],
								   (unsigned)o.qd.v[b], o.bs.v[s],
								   (unsigned)o.pattern.v[p],
								   (unsigned)o.mix.v[m], &r);
						if (err || r.errors)
							failed = true;
						if (err) {
							fprintf(stderr,
								"upcie-perf: run failed: %s\n",
								strerror(-err));
							continue;
						}
						perf_emit(stdout, &r, o.json, &first);
					}
	if (o.json)
		printf("\n]}\n");
	upcie_nvme_ns_close(&ns);
	upcie_nvme_ctrl_close(&c);
	return failed ? 1 : 0;
}
