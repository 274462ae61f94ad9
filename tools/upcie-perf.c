/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * upcie-perf: NVMe load generator on upcie's public headers (the role of spdk_nvme_perf).
 *
 *   upcie-perf --bdf 0000:01:00.0 [--path auto|uio|type1|iommufd] [--bind] [--ns 1]
 *              [--queues 1,4] [--qd 1,32] [--bs 4k,128KiB] [--pattern rand,seq]
 *              [--mix 100,70,0] [--time 10s|500ms|1m] [--size 1G] [--json] [--dry-run]
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

#include "opt.h"
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

static int perf_item_pattern(const char *s, uint64_t *v)
{
	if (!strcmp(s, "rand"))
		*v = 0;
	else if (!strcmp(s, "seq"))
		*v = 1;
	else
		return -EINVAL;
	return 0;
}

static int perf_item_queues(const char *s, uint64_t *v)
{
	return opt_u64_range(s, 1, PERF_MAX_Q, v);
}

static int perf_item_qd(const char *s, uint64_t *v)
{
	return opt_u64_range(s, 1, 4095, v);
}

static int perf_item_mix(const char *s, uint64_t *v)
{
	return opt_u64_range(s, 0, 100, v);
}

/* A request size: a size with suffix, 1 byte .. 1 GiB (the namespace's block size is checked
 * once it is known). */
static int perf_item_bs(const char *s, uint64_t *v)
{
	uint64_t x;
	int err = opt_size(s, &x);

	if (err)
		return err;
	if (!x || x > (1ull << 30))
		return -ERANGE;
	*v = x;
	return 0;
}

static int perf_list(const char *s, opt_item_fn one, struct perf_list *l)
{
	return opt_list(s, one, l->v, PERF_MAX_LIST, &l->n);
}

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: upcie-perf --bdf BDF [options]      (CPU-driven queues)\n"
#if defined(UPCIE_PERF_GPU)
	    "       upcie-perf --gpu null|BDF [options] (GPU-initiated queues)\n"
#endif
	    "  --bdf BDF                        the NVMe controller (DDDD:BB:DD.F or BB:DD.F)\n"
	    "  --path auto|uio|type1|iommufd    DMA path (default auto)\n"
	    "  --bind                           bind the function to the path's driver first\n"
	    "  --ns N                           namespace (default 1)\n"
	    "  --queues LIST                    queue pairs, one thread each, 1..%u (default 1)\n"
	    "  --qd LIST                        requests in flight per queue, 1..4095 (default 1)\n"
	    "  --bs LIST                        bytes per request: 4096, 4k, 128KiB, 1M, 1GiB\n"
	    "                                   (default 4k)\n"
	    "  --pattern LIST                   rand, seq (default rand)\n"
	    "  --mix LIST                       percent reads 0..100, the rest writes (default "
	    "100)\n"
	    "  --time T                         per run: 10 (seconds), 500ms, 30s, 2m (default "
	    "5s)\n"
	    "  --size SIZE                      region of the namespace, e.g. 1G (default all)\n"
#if defined(UPCIE_PERF_GPU)
	    "  --sq-host                        GPU mode: SQs in host memory (default VRAM)\n"
#endif
	    "  --json                           summaries as JSON on stdout\n"
	    "  --dry-run                        print the runs the options make, run nothing\n"
	    "  -h, --help                       this text\n"
	    "  --version                        the upcie version this tool was built from\n"
	    "LISTs are comma-separated; every combination runs. Writes overwrite data.\n"
	    "Sizes take k/K/KiB, M/MiB, G/GiB (all binary); times s, ms, us, m (minutes), h.\n"
	    "Exit status: 0 every run completed without an I/O error, 1 a run failed, 2 usage.\n",
	    PERF_MAX_Q);
}

enum {
	PERF_O_BDF = 256,
	PERF_O_GPU,
	PERF_O_PATH,
	PERF_O_BIND,
	PERF_O_NS,
	PERF_O_QUEUES,
	PERF_O_QD,
	PERF_O_BS,
	PERF_O_PATTERN,
	PERF_O_MIX,
	PERF_O_TIME,
	PERF_O_SIZE,
	PERF_O_SQ_HOST,
	PERF_O_JSON,
	PERF_O_DRY_RUN,
	PERF_O_VERSION,
};

static const struct option perf_long_opts[] = {
	{ "bdf", required_argument, NULL, PERF_O_BDF },
	{ "gpu", required_argument, NULL, PERF_O_GPU },
	{ "path", required_argument, NULL, PERF_O_PATH },
	{ "bind", no_argument, NULL, PERF_O_BIND },
	{ "ns", required_argument, NULL, PERF_O_NS },
	{ "queues", required_argument, NULL, PERF_O_QUEUES },
	{ "qd", required_argument, NULL, PERF_O_QD },
	{ "bs", required_argument, NULL, PERF_O_BS },
	{ "pattern", required_argument, NULL, PERF_O_PATTERN },
	{ "mix", required_argument, NULL, PERF_O_MIX },
	{ "time", required_argument, NULL, PERF_O_TIME },
	{ "size", required_argument, NULL, PERF_O_SIZE },
	{ "sq-host", no_argument, NULL, PERF_O_SQ_HOST },
	{ "json", no_argument, NULL, PERF_O_JSON },
	{ "dry-run", no_argument, NULL, PERF_O_DRY_RUN },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, PERF_O_VERSION },
	{ NULL, 0, NULL, 0 },
};

/* Every option into *o; 0 to go on, else the exit status (0 after --help or --version). */
static int perf_parse(int argc, char **argv, struct perf_opts *o, enum upcie_nvme_path *path,
		      bool *dry_run, bool *done)
{
	struct upcie_pci_bdf bdf;
	uint64_t x;
	int c;

	*done = false;
	memset(o, 0, sizeof(*o));
	o->nsid = 1;
	o->secs = 5;
	o->queues.v[0] = 1, o->queues.n = 1;
	o->qd.v[0] = 1, o->qd.n = 1;
	o->bs.v[0] = 4096, o->bs.n = 1;
	o->mix.v[0] = 100, o->mix.n = 1;
	o->pattern.v[0] = 0, o->pattern.n = 1;
	optind = 0;
	argv[0] = (char *)opt_tool; /* getopt's own messages name the tool, not its path */
	while ((c = getopt_long(argc, argv, "h", perf_long_opts, NULL)) != -1) {
		const char *v = optarg;

		switch (c) {
		case PERF_O_BDF:
			if (upcie_pci_bdf_parse_quiet_(v, &bdf))
				return opt_bad("--bdf", v, "a PCI address DDDD:BB:DD.F or BB:DD.F");
			o->bdf = v;
			break;
		case PERF_O_GPU:
			if (strcmp(v, "null") && upcie_pci_bdf_parse_quiet_(v, &bdf))
				return opt_bad("--gpu", v,
					       "null or the PCI address of an NVMe controller");
			o->gpu = true, o->gpu_target = v;
			break;
		case PERF_O_PATH:
			if (upcie_nvme_path_parse(v, path))
				return opt_bad("--path", v, "auto, uio, type1 or iommufd");
			o->path = v;
			break;
		case PERF_O_BIND:
			o->bind = true;
			break;
		case PERF_O_NS:
			if (opt_u64_range(v, 1, 0xfffffffeu, &x))
				return opt_bad("--ns", v, "a namespace ID 1..4294967294");
			o->nsid = (uint32_t)x;
			break;
		case PERF_O_QUEUES:
			if (perf_list(v, perf_item_queues, &o->queues))
				return opt_bad("--queues", v, "a list of counts 1..64, e.g. 1,2,4");
			break;
		case PERF_O_QD:
			if (perf_list(v, perf_item_qd, &o->qd))
				return opt_bad("--qd", v, "a list of depths 1..4095, e.g. 1,32");
			break;
		case PERF_O_BS:
			if (perf_list(v, perf_item_bs, &o->bs))
				return opt_bad(
				    "--bs", v,
				    "a list of sizes 1 B..1 GiB, e.g. 4096,4k,128KiB,1M");
			break;
		case PERF_O_PATTERN:
			if (perf_list(v, perf_item_pattern, &o->pattern))
				return opt_bad("--pattern", v, "a list of rand, seq");
			break;
		case PERF_O_MIX:
			if (perf_list(v, perf_item_mix, &o->mix))
				return opt_bad("--mix", v, "a list of read percentages 0..100");
			break;
		case PERF_O_TIME:
			if (opt_time_ns(v, &x) || x < 1000000ull || x > 86400ull * 1000000000ull)
				return opt_bad("--time", v,
					       "a time 1ms..24h, e.g. 10 (seconds), 500ms, 2m");
			o->secs = (double)x / 1e9;
			break;
		case PERF_O_SIZE:
			if (opt_size(v, &x) || !x)
				return opt_bad("--size", v, "a size such as 1G, 512MiB, 1048576");
			o->size = x;
			break;
		case PERF_O_SQ_HOST:
			o->gpu_sq_host = true;
			break;
		case PERF_O_JSON:
			o->json = true;
			break;
		case PERF_O_DRY_RUN:
			*dry_run = true;
			break;
		case 'h':
			usage(stdout);
			*done = true;
			return 0;
		case PERF_O_VERSION:
			*done = true;
			return opt_version();
		default:
			return opt_unknown();
		}
	}
	if (optind < argc)
		return opt_bad("argument", argv[optind], "options only (--bdf BDF, see --help)");
	if (o->bdf && o->gpu && strcmp(o->gpu_target, "null"))
		return opt_usage_error("--bdf and --gpu BDF name the controller twice: use one");
	if (!o->bdf && !o->gpu)
		return opt_usage_error("--bdf BDF is required");
	return 0;
}

static void perf_dry_run(const struct perf_opts *o)
{
	unsigned n = o->queues.n * o->qd.n * o->bs.n * o->pattern.n * o->mix.n;

	printf("target %s%s ns %u path %s time %.3f s size %" PRIu64 "%s: %u run%s\n",
	       o->gpu ? "gpu:" : "", o->gpu ? o->gpu_target : o->bdf, o->nsid,
	       o->path ? o->path : "auto", o->secs, o->size, o->size ? "" : " (all)", n,
	       n == 1 ? "" : "s");
	for (unsigned a = 0; a < o->queues.n; a++)
		for (unsigned b = 0; b < o->qd.n; b++)
			for (unsigned s = 0; s < o->bs.n; s++)
				for (unsigned p = 0; p < o->pattern.n; p++)
					for (unsigned m = 0; m < o->mix.n; m++)
						printf("run queues=%u qd=%u bs=%" PRIu64
						       " %s read=%u%%\n",
						       (unsigned)o->queues.v[a],
						       (unsigned)o->qd.v[b], o->bs.v[s],
						       o->pattern.v[p] ? "seq" : "rand",
						       (unsigned)o->mix.v[m]);
}

int main(int argc, char **argv)
{
	struct perf_opts o;
	struct upcie_nvme_ctrl_opts co;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ns ns;
	struct upcie_pci_bdf bdf;
	enum upcie_nvme_path path = UPCIE_NVME_PATH_AUTO;
	bool first = true, failed = false, dry_run = false, done;
	int err;

	opt_tool = "upcie-perf";
	err = perf_parse(argc, argv, &o, &path, &dry_run, &done);
	if (err || done)
		return err;
	if (dry_run) {
		perf_dry_run(&o);
		return 0;
	}
	if (o.gpu) {
#if defined(UPCIE_PERF_GPU)
		return perf_gpu_main(&o);
#else
		fprintf(stderr, "upcie-perf: --gpu needs the CUDA build (upcie-perf-cuda)\n");
		return 2;
#endif
	}
	if (upcie_pci_bdf_parse(o.bdf, &bdf))
		return 2;
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
