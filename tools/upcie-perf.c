/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * upcie-perf: NVMe load generator on upcie's public headers (the role of spdk_nvme_perf).
 *
 *   upcie-perf --bdf 0000:01:00.0 [--bdf ...] [--path auto|uio|type1|iommufd] [--bind]
 *              [--bind-any-class] [--ns 1,2] [--queues 1,4] [--qd 1,32] [--bs 4k,128KiB]
 *              [--pattern rand,seq] [--mix 100,70,0] [--time 10s|500ms|1m] [--ramp 2s] [--size 1G]
 *              [--cpus 0-3] [--threads N] [--percentiles 50,99,99.9] [--json] [--dry-run]
 *
 * Lists run as their cartesian product. A run puts QUEUES queue pairs on every target (each
 * namespace of --ns on each controller of --bdf); each queue pair keeps QD requests of BS bytes
 * in flight (polled), random or sequential offsets in the first SIZE bytes of the namespace
 * (default: all of it), MIX percent reads (the rest writes: it overwrites data). Queue pairs go
 * round-robin to polling threads, one per queue pair but never more than the CPUs of --cpus
 * (default: the process's affinity) unless --threads asks; each thread is pinned to its CPU.
 * After --ramp (not measured) the measured window of --time starts: IOPS, MB/s and MiB/s, read
 * and write latency apart (submission to completion), CPU time per I/O of the polling threads;
 * per queue pair and in total. Progress per second on stderr names its run; a summary per run
 * on stdout, or JSON with --json (tools/perf-stats.h: schema 2, with the run's metadata, failed
 * runs and the latency histograms). The build with CUDA adds the GPU-initiated mode (--gpu, see
 * upcie-perf-gpu.cuh).
 *
 * Needs what nvme/dev.h needs for the path (root; the function bound to uio_pci_generic or
 * vfio-pci, or --bind, which refuses a device the system uses and, unless --bind-any-class, a
 * function whose PCI class is not NVMe; hugepages). Exit 0 when every run completed without an
 * I/O error, 1 otherwise, 2 on a usage error.
 */
// testbed-ldflags: -lpthread
#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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
#define PERF_MAX_Q    64  /* queue pairs per target */
#define PERF_MAX_CTRL 8	  /* --bdf given this often at most */
#define PERF_MAX_TQ   256 /* queue pairs of a run, all targets */
#define PERF_MAX_CPUS 1024

struct perf_list {
	uint64_t v[PERF_MAX_LIST];
	unsigned n;
};

struct perf_opts {
	const char *bdf[PERF_MAX_CTRL];
	unsigned nbdf;
	const char *path;
	bool bind, bind_any_class, json;
	struct perf_list nsid;
	struct perf_list queues, qd, bs, mix, pattern; /* pattern: 0 rand, 1 seq */
	double secs, ramp;
	uint64_t size;
	int cpus[PERF_MAX_CPUS]; /* the CPUs threads are pinned to, in order */
	unsigned ncpus;
	bool cpus_given;
	unsigned threads; /* 0: one per queue pair, at most one per CPU */
	double pct[PERF_MAX_PCT];
	unsigned npct;
	bool gpu;
	const char *gpu_target; /* "null" or a controller */
	const char *gpu_id;	/* GPU ordinal or PCI address; NULL: ordinal 0 */
	bool gpu_sq_host;
	int argc;
	char **argv;
};

/* The phase of the run now, set by the main thread (and by a worker that fails, to STOP). */
enum { PERF_SETUP, PERF_RAMP, PERF_MEASURE, PERF_STOP };
static int perf_phase;
static unsigned perf_ready; /* workers done with their setup (or failed at it) */

#define PERF_LOAD(p)	 __atomic_load_n(p, __ATOMIC_RELAXED)
#define PERF_STORE(p, v) __atomic_store_n(p, v, __ATOMIC_RELAXED)
#define PERF_ADD(p, v)	 __atomic_fetch_add(p, v, __ATOMIC_RELAXED)

/* One (controller, namespace) of the run. */
struct perf_tgt {
	struct upcie_nvme_ctrl *c;
	struct upcie_nvme_ns ns;
	char name[48];
	uint64_t region;
};

struct perf_slot {
	struct upcie_nvme_req req;
	struct perf_q *q;
	uint64_t t0, off;
	bool read, busy;
	struct perf_slot *next_ready;
};

/* A queue pair and its load; owned by one worker thread. */
struct perf_q {
	struct perf_tgt *t;
	struct perf_qres *res; /* where its figures go */
	unsigned qd, mix, seq;
	uint64_t bs, region, seq_next, rng;
	struct perf_slot *slots, *ready;
	struct upcie_nvme_ioq ioq;
	struct upcie_dmamem buf;
	bool have_ioq, have_buf;
	uint64_t prog; /* completions in any phase: the progress lines read it */
	int err;
	unsigned inflight;
};

struct perf_thr {
	pthread_t th;
	bool started;
	int cpu; /* -1: not pinned */
	struct perf_q **qs;
	unsigned nq;
	uint64_t cpu_ns; /* CPU time in the measured phase */
	int err;
	char why[160];
};

static uint64_t perf_rand(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static uint64_t perf_thread_cpu_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void perf_done(struct upcie_nvme_req *r)
{
	struct perf_slot *s = (struct perf_slot *)r->ctx;
	struct perf_q *q = s->q;
	struct perf_qres *res = q->res;

	/* errors count in every phase: a run with one is a failed run */
	if (r->err)
		res->errors++;
	if (PERF_LOAD(&perf_phase) == PERF_MEASURE) {
		perf_hist_add(s->read ? &res->rd : &res->wr, upcie_time_ns() - s->t0);
		res->ios++;
		res->bytes += q->bs;
	}
	PERF_ADD(&q->prog, 1);
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

/* Queue pair and data buffer of q, on the worker's thread (the queue's owner). */
static int perf_q_setup(struct perf_q *q, char *why, size_t wlen)
{
	struct upcie_nvme_ctrl *c = q->t->c;
	struct upcie_nvme_ioq_opts qo;
	uint64_t chunk = c->max_xfer < q->bs ? c->max_xfer : q->bs;
	uint64_t pieces = (q->bs + chunk - 1) / chunk;
	int err;

	memset(&qo, 0, sizeof(qo));
	/* room for every request even when the controller splits them */
	qo.depth = (uint32_t)(q->qd * pieces + 1);
	qo.max_xfer = q->bs;
	if (qo.depth > c->mqes)
		qo.depth = c->mqes;
	err = upcie_nvme_ioq_create(&q->ioq, c, &qo);
	if (err) {
		snprintf(why, wlen, "%s: creating an I/O queue pair of depth %u: %s", q->t->name,
			 qo.depth, strerror(-err));
		return err;
	}
	q->have_ioq = true;
	q->res->qid = q->ioq.qid;
	err = upcie_nvme_dev_dmamem(&c->dev, (size_t)q->qd * q->bs, &q->buf);
	if (err) {
		snprintf(why, wlen, "%s: %" PRIu64 " bytes of DMA memory for qid %u: %s",
			 q->t->name, (uint64_t)q->qd * q->bs, q->ioq.qid, strerror(-err));
		return err;
	}
	q->have_buf = true;
	for (uint64_t i = 0; i < q->buf.size; i += 8)
		*(uint64_t *)((char *)q->buf.vaddr + i) = i ^ 0x5a5a5a5a5a5a5a5aull;
	for (unsigned i = 0; i < q->qd; i++) {
		q->slots[i].q = q;
		q->slots[i].req.cb = perf_done;
		q->slots[i].req.ctx = &q->slots[i];
		q->slots[i].next_ready = q->ready;
		q->ready = &q->slots[i];
	}
	return 0;
}

/* Keep q's requests in flight and reap it once; 0 or the error that ends the run. */
static int perf_q_turn(struct perf_q *q)
{
	uint64_t lba = q->t->ns.lba_bytes;
	int err;

	while (q->ready) {
		struct perf_slot *s = q->ready;
		uint64_t boff = (uint64_t)(s - q->slots) * q->bs;

		perf_next(q, s);
		s->t0 = upcie_time_ns();
		err = s->read ? upcie_nvme_ioq_read(&q->ioq, &q->t->ns, s->off / lba, &q->buf, boff,
						    q->bs, &s->req)
			      : upcie_nvme_ioq_write(&q->ioq, &q->t->ns, s->off / lba, &q->buf,
						     boff, q->bs, &s->req);
		if (err == -EBUSY)
			break;
		if (err)
			return err;
		q->ready = s->next_ready;
		s->busy = true;
		q->inflight++;
	}
	err = upcie_nvme_ioq_poll(&q->ioq, 0xffffffffu);
	return err < 0 ? err : 0;
}

/* Every request ends once (one the controller does not finish is aborted and cancelled by the
 * queue's wait); the buffer goes back only after its queue is gone or idle. */
static void perf_q_teardown(struct perf_q *q)
{
	bool idle;

	for (unsigned i = 0; q->have_ioq && i < q->qd; i++)
		if (q->slots[i].busy)
			upcie_nvme_ioq_wait(&q->ioq, &q->slots[i].req, UPCIE_NVME_IO_TIMEOUT);
	idle = !q->have_ioq || !upcie_nvme_ioq_delete(&q->ioq) || !q->inflight;
	if (q->have_buf && idle)
		upcie_dmamem_destroy(&q->buf);
	q->have_ioq = q->have_buf = false;
}

static void *perf_worker(void *arg)
{
	struct perf_thr *t = (struct perf_thr *)arg;
	uint64_t cpu0 = 0;
	bool measuring = false;
	int ph;

	if (t->cpu >= 0) {
		cpu_set_t set;
		int err;

		CPU_ZERO(&set);
		CPU_SET((unsigned)t->cpu, &set);
		err = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
		if (err) {
			t->err = -err;
			snprintf(t->why, sizeof(t->why), "pinning a thread to CPU %d: %s", t->cpu,
				 strerror(err));
		}
	}
	for (unsigned i = 0; !t->err && i < t->nq; i++)
		t->err = perf_q_setup(t->qs[i], t->why, sizeof(t->why));
	PERF_ADD(&perf_ready, 1);
	while ((ph = PERF_LOAD(&perf_phase)) == PERF_SETUP)
		usleep(100);
	while (!t->err && ph != PERF_STOP) {
		if (ph == PERF_MEASURE && !measuring) {
			measuring = true;
			cpu0 = perf_thread_cpu_ns();
		}
		for (unsigned i = 0; i < t->nq; i++) {
			int err = perf_q_turn(t->qs[i]);

			if (err) {
				t->err = err;
				snprintf(t->why, sizeof(t->why), "%s qid %u: I/O: %s",
					 t->qs[i]->t->name, t->qs[i]->ioq.qid, strerror(-err));
				PERF_STORE(&perf_phase, PERF_STOP);
				break;
			}
		}
		ph = PERF_LOAD(&perf_phase);
	}
	if (measuring)
		t->cpu_ns = perf_thread_cpu_ns() - cpu0;
	for (unsigned i = 0; i < t->nq; i++)
		perf_q_teardown(t->qs[i]);
	return NULL;
}

/*
 * Threads of a run: one per queue pair, at most one per CPU of --cpus (or of the process's
 * affinity), unless --threads asks for a number; queue pair k goes to thread k % threads.
 */
static unsigned perf_nthreads(const struct perf_opts *o, unsigned totq)
{
	unsigned n = o->threads ? o->threads : (totq < o->ncpus ? totq : o->ncpus);

	return n > totq ? totq : n;
}

static int perf_thread_cpu(const struct perf_opts *o, unsigned thread)
{
	return o->ncpus ? o->cpus[thread % o->ncpus] : -1;
}

static void perf_result_init(struct perf_result *res, const char *mode, const char *path,
			     unsigned queues, unsigned qd, uint64_t bs, unsigned seq, unsigned mix)
{
	memset(res, 0, sizeof(*res));
	perf_hist_init(&res->rd);
	perf_hist_init(&res->wr);
	snprintf(res->mode, sizeof(res->mode), "%s", mode);
	snprintf(res->path, sizeof(res->path), "%s", path);
	snprintf(res->pattern, sizeof(res->pattern), "%s", seq ? "seq" : "rand");
	res->queues = queues, res->qd = qd, res->bs = bs, res->mix = mix;
}

static int perf_fail(struct perf_result *res, int err, const char *why)
{
	res->err = err ? err : -EIO;
	snprintf(res->why, sizeof(res->why), "%s", why);
	return res->err;
}

/* Progress on stderr once a second: which run, which phase, the rate since the last line. */
static void perf_progress(const struct perf_result *res, unsigned sec, bool ramp, double dt,
			  uint64_t ios)
{
	char label[160];

	perf_run_label(res, label, sizeof(label));
	fprintf(stderr, "[%s] [%3us%s] %10.0f IOPS %9.1f MB/s\n", label, sec,
		ramp ? " warm-up" : "", dt > 0 ? (double)ios / dt : 0,
		dt > 0 ? (double)ios * (double)res->bs / dt / 1e6 : 0);
}

static void perf_sleep_until(uint64_t t)
{
	uint64_t now = upcie_time_ns();

	if (t > now)
		usleep((useconds_t)((t - now) / 1000));
}

/* One run: `queues` queue pairs on each target. Fills res; a failure says why in res. */
static int perf_run_cpu(struct perf_tgt *tg, unsigned ntg, const struct perf_opts *o,
			unsigned queues, unsigned qd, uint64_t bs, unsigned seq, unsigned mix,
			struct perf_result *res)
{
	unsigned totq = queues * ntg, nth = perf_nthreads(o, totq), k;
	struct perf_q *qs = NULL;
	struct perf_thr *th = NULL;
	struct perf_q **qbase = NULL, **qp;
	uint64_t t0, tm0 = 0, tm1, ramp_end, end, last_t, last_ios = 0;
	char why[200];
	int err = 0;

	res->threads = nth;
	res->ntargets = ntg;
	res->ramp = o->ramp;
	for (unsigned i = 0; i < ntg; i++) {
		snprintf(res->target + strlen(res->target),
			 sizeof(res->target) - strlen(res->target), "%s%s", i ? "," : "",
			 tg[i].name);
		if (bs % tg[i].ns.lba_bytes || bs > tg[i].region) {
			snprintf(why, sizeof(why),
				 "%s: bs %" PRIu64
				 " is not whole %u-byte blocks within the %" PRIu64 "-byte region",
				 tg[i].name, bs, tg[i].ns.lba_bytes, tg[i].region);
			return perf_fail(res, -EINVAL, why);
		}
		if (queues > tg[i].c->nqueues) {
			snprintf(why, sizeof(why),
				 "%s: queues=%u, but the controller granted %u I/O queue pairs",
				 tg[i].name, queues, tg[i].c->nqueues);
			return perf_fail(res, -ENOSPC, why);
		}
	}
	if (totq > PERF_MAX_TQ) {
		snprintf(why, sizeof(why), "%u queue pairs in all, more than %u", totq,
			 PERF_MAX_TQ);
		return perf_fail(res, -E2BIG, why);
	}
	qs = (struct perf_q *)calloc(totq, sizeof(*qs));
	qp = qbase = (struct perf_q **)calloc(totq, sizeof(*qp));
	th = (struct perf_thr *)calloc(nth, sizeof(*th));
	res->q = (struct perf_qres *)calloc(totq, sizeof(*res->q));
	if (!qs || !qp || !th || !res->q) {
		free(qs), free(qbase), free(th);
		return perf_fail(res, -ENOMEM, "out of memory");
	}
	res->nq = totq;
	PERF_STORE(&perf_phase, PERF_SETUP);
	PERF_STORE(&perf_ready, 0u);
	t0 = upcie_time_ns();
	/* queue k: target k % ntg, its (k / ntg)-th queue pair; thread k % nth */
	for (k = 0; k < totq; k++) {
		struct perf_q *q = &qs[k];
		struct perf_tgt *t = &tg[k % ntg];
		unsigned nth_q = k / ntg;

		q->t = t, q->res = &res->q[k], q->qd = qd, q->mix = mix, q->seq = seq;
		q->bs = bs, q->region = t->region;
		q->seq_next = (t->region / queues / bs) * bs * nth_q;
		q->rng = 0x9e3779b97f4a7c15ull * (k + 1) ^ t0;
		snprintf(q->res->target, sizeof(q->res->target), "%s", t->name);
		q->res->thread = k % nth;
		q->res->cpu = perf_thread_cpu(o, k % nth);
		perf_hist_init(&q->res->rd);
		perf_hist_init(&q->res->wr);
		q->slots = (struct perf_slot *)calloc(qd, sizeof(*q->slots));
		if (!q->slots)
			err = -ENOMEM;
	}
	for (unsigned i = 0; !err && i < nth; i++) {
		th[i].cpu = perf_thread_cpu(o, i);
		th[i].qs = qp;
		for (k = i; k < totq; k += nth)
			qp[th[i].nq++] = &qs[k];
		qp += th[i].nq;
	}
	if (err) {
		perf_fail(res, err, "out of memory");
		goto out;
	}
	for (unsigned i = 0; i < nth; i++) {
		int e = pthread_create(&th[i].th, NULL, perf_worker, &th[i]);

		if (e) {
			snprintf(why, sizeof(why), "starting thread %u: %s", i, strerror(e));
			perf_fail(res, -e, why);
			PERF_STORE(&perf_phase, PERF_STOP);
			break;
		}
		th[i].started = true;
	}
	if (!res->err) {
		unsigned want = nth;

		while (PERF_LOAD(&perf_ready) < want)
			usleep(200);
		for (unsigned i = 0; i < nth && !res->err; i++)
			if (th[i].err)
				perf_fail(res, th[i].err, th[i].why);
	}
	if (res->err) {
		PERF_STORE(&perf_phase, PERF_STOP);
		goto join;
	}
	/* the clock starts once every queue exists */
	t0 = last_t = upcie_time_ns();
	ramp_end = t0 + (uint64_t)(o->ramp * 1e9);
	end = ramp_end + (uint64_t)(o->secs * 1e9);
	if (ramp_end == t0) {
		tm0 = t0;
		PERF_STORE(&perf_phase, PERF_MEASURE);
	} else {
		PERF_STORE(&perf_phase, PERF_RAMP);
	}
	for (unsigned sec = 1;; sec++) {
		uint64_t tick = t0 + (uint64_t)sec * UPCIE_NSEC_PER_SEC, now, ios = 0;
		bool ramping = !tm0;

		/* the phase changes on time, between progress lines */
		if (ramping && ramp_end < tick) {
			perf_sleep_until(ramp_end);
			tm0 = upcie_time_ns();
			PERF_STORE(&perf_phase, PERF_MEASURE);
		}
		perf_sleep_until(tick < end ? tick : end);
		if (PERF_LOAD(&perf_phase) == PERF_STOP)
			break; /* a worker failed */
		now = upcie_time_ns();
		if (now >= end)
			PERF_STORE(&perf_phase, PERF_STOP);
		for (k = 0; k < totq; k++)
			ios += PERF_LOAD(&qs[k].prog);
		perf_progress(res, sec, ramping && tm0 == 0, (double)(now - last_t) / 1e9,
			      ios - last_ios);
		last_t = now, last_ios = ios;
		if (now >= end)
			break;
	}
	tm1 = upcie_time_ns();
	res->secs = tm0 ? (double)(tm1 - tm0) / 1e9 : 0;
join:
	for (unsigned i = 0; i < nth; i++) {
		if (!th[i].started)
			continue;
		pthread_join(th[i].th, NULL);
		if (th[i].err && !res->err)
			perf_fail(res, th[i].err, th[i].why);
		res->cpu_ns += th[i].cpu_ns;
	}
	for (k = 0; k < totq; k++) {
		struct perf_qres *r = &res->q[k];

		res->ios += r->ios;
		res->bytes += r->bytes;
		res->errors += r->errors;
		perf_hist_merge(&res->rd, &r->rd);
		perf_hist_merge(&res->wr, &r->wr);
	}
out:
	for (k = 0; k < totq; k++)
		free(qs[k].slots);
	free(qs);
	free(qbase);
	free(th);
	return res->err;
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

static int perf_item_nsid(const char *s, uint64_t *v)
{
	return opt_u64_range(s, 1, 0xfffffffeu, v);
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
	    "usage: upcie-perf --bdf BDF [--bdf BDF ...] [options]  (CPU-driven queues)\n"
#if defined(UPCIE_PERF_GPU)
	    "       upcie-perf --gpu null|BDF [options]             (GPU-initiated queues)\n"
#endif
	    "  --bdf BDF                        an NVMe controller (DDDD:BB:DD.F or BB:DD.F); up "
	    "to "
	    "%u\n"
	    "  --path auto|uio|type1|iommufd    DMA path (default auto)\n"
	    "  --bind                           bind the functions to the path's driver first\n"
	    "                                   (NVMe controllers only, by PCI class 0x010802)\n"
	    "  --bind-any-class                 with --bind: bind a function of another class too\n"
	    "                                   (a controller that reports another class)\n"
	    "  --ns LIST                        namespaces of every controller (default 1)\n"
	    "  --queues LIST                    queue pairs per namespace, 1..%u (default 1)\n"
	    "  --qd LIST                        requests in flight per queue, 1..4095 (default 1)\n"
	    "  --bs LIST                        bytes per request: 4096, 4k, 128KiB, 1M, 1GiB\n"
	    "                                   (default 4k)\n"
	    "  --pattern LIST                   rand, seq (default rand)\n"
	    "  --mix LIST                       percent reads 0..100, the rest writes (default "
	    "100)\n"
	    "  --time T                         measured time per run: 10 (seconds), 500ms, 2m\n"
	    "                                   (default 5s)\n"
	    "  --ramp T                         warm-up before it, not measured (default 0)\n"
	    "  --size SIZE                      region of each namespace, e.g. 1G (default all)\n"
	    "  --cpus LIST                      CPUs for the threads, e.g. 0-3,8 (default: the\n"
	    "                                   CPUs this process may run on)\n"
	    "  --threads N                      polling threads (default: one per queue pair, at\n"
	    "                                   most one per CPU); queue pairs go round-robin\n"
	    "  --percentiles LIST               latency percentiles (default 50,99,99.9,99.99)\n"
#if defined(UPCIE_PERF_GPU)
	    "  --gpu-id N|BDF                   GPU mode: the GPU, by CUDA ordinal or PCI address\n"
	    "                                   (default 0)\n"
	    "  --sq-host                        GPU mode: SQs in host memory (default VRAM)\n"
#endif
	    "  --json                           results as JSON on stdout (schema 2: metadata,\n"
	    "                                   failed runs, histograms)\n"
	    "  --dry-run                        print the runs and the queue->thread->CPU map,\n"
	    "                                   run nothing\n"
	    "  -h, --help                       this text\n"
	    "  --version                        the upcie version this tool was built from\n"
	    "LISTs are comma-separated; every combination runs. Writes overwrite data.\n"
	    "Sizes take k/K/KiB, M/MiB, G/GiB (all binary); times s, ms, us, m (minutes), h.\n"
	    "Exit status: 0 every run completed without an I/O error, 1 a run failed or had I/O\n"
	    "errors, 2 usage.\n",
	    PERF_MAX_CTRL, PERF_MAX_Q);
}

enum {
	PERF_O_BDF = 256,
	PERF_O_GPU,
	PERF_O_GPU_ID,
	PERF_O_PATH,
	PERF_O_BIND,
	PERF_O_BIND_ANY_CLASS,
	PERF_O_NS,
	PERF_O_QUEUES,
	PERF_O_QD,
	PERF_O_BS,
	PERF_O_PATTERN,
	PERF_O_MIX,
	PERF_O_TIME,
	PERF_O_RAMP,
	PERF_O_SIZE,
	PERF_O_CPUS,
	PERF_O_THREADS,
	PERF_O_PCT,
	PERF_O_SQ_HOST,
	PERF_O_JSON,
	PERF_O_DRY_RUN,
	PERF_O_VERSION,
};

static const struct option perf_long_opts[] = {
	{ "bdf", required_argument, NULL, PERF_O_BDF },
	{ "gpu", required_argument, NULL, PERF_O_GPU },
	{ "gpu-id", required_argument, NULL, PERF_O_GPU_ID },
	{ "path", required_argument, NULL, PERF_O_PATH },
	{ "bind", no_argument, NULL, PERF_O_BIND },
	{ "bind-any-class", no_argument, NULL, PERF_O_BIND_ANY_CLASS },
	{ "ns", required_argument, NULL, PERF_O_NS },
	{ "queues", required_argument, NULL, PERF_O_QUEUES },
	{ "qd", required_argument, NULL, PERF_O_QD },
	{ "bs", required_argument, NULL, PERF_O_BS },
	{ "pattern", required_argument, NULL, PERF_O_PATTERN },
	{ "mix", required_argument, NULL, PERF_O_MIX },
	{ "time", required_argument, NULL, PERF_O_TIME },
	{ "ramp", required_argument, NULL, PERF_O_RAMP },
	{ "size", required_argument, NULL, PERF_O_SIZE },
	{ "cpus", required_argument, NULL, PERF_O_CPUS },
	{ "threads", required_argument, NULL, PERF_O_THREADS },
	{ "percentiles", required_argument, NULL, PERF_O_PCT },
	{ "sq-host", no_argument, NULL, PERF_O_SQ_HOST },
	{ "json", no_argument, NULL, PERF_O_JSON },
	{ "dry-run", no_argument, NULL, PERF_O_DRY_RUN },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, PERF_O_VERSION },
	{ NULL, 0, NULL, 0 },
};

/* "0-3,8": the CPUs of a set, as the kernel writes them. */
static void perf_cpus_str(const int *cpus, unsigned n, char *buf, size_t len)
{
	size_t o = 0;

	buf[0] = '\0';
	for (unsigned i = 0; i < n && o + 16 < len; i++) {
		unsigned j = i;

		while (j + 1 < n && cpus[j + 1] == cpus[j] + 1)
			j++;
		o += (size_t)snprintf(buf + o, len - o, "%s%d", i ? "," : "", cpus[i]);
		if (j > i)
			o += (size_t)snprintf(buf + o, len - o, "-%d", cpus[j]);
		i = j;
	}
}

/* The CPUs this process may run on, ascending. */
static unsigned perf_allowed_cpus(int *cpus, unsigned max)
{
	cpu_set_t set;
	unsigned n = 0;

	if (sched_getaffinity(0, sizeof(set), &set))
		return 0;
	for (int c = 0; c < CPU_SETSIZE && n < max; c++)
		if (CPU_ISSET(c, &set))
			cpus[n++] = c;
	return n;
}

/* --cpus against the affinity of the process: a CPU it may not run on is a usage error. */
static int perf_check_cpus(struct perf_opts *o)
{
	static int allowed[PERF_MAX_CPUS];
	unsigned na = perf_allowed_cpus(allowed, PERF_MAX_CPUS);
	char list[256], msg[400];

	if (!o->cpus_given) {
		memcpy(o->cpus, allowed, na * sizeof(int));
		o->ncpus = na;
		return 0;
	}
	for (unsigned i = 0; i < o->ncpus; i++) {
		bool ok = false;

		for (unsigned j = 0; j < na && !ok; j++)
			ok = allowed[j] == o->cpus[i];
		if (!ok) {
			perf_cpus_str(allowed, na, list, sizeof(list));
			snprintf(msg, sizeof(msg), "a list of CPUs this process may run on (%s)",
				 list);
			snprintf(list, sizeof(list), "%d", o->cpus[i]);
			return opt_bad("--cpus", list, msg);
		}
	}
	return 0;
}

static int perf_item_pct(const char *s, uint64_t *v)
{
	double d;

	if (opt_decimal(s, &d) || d <= 0 || d > 100)
		return -EINVAL;
	memcpy(v, &d, sizeof(d));
	return 0;
}

/* Every option into *o; 0 to go on, else the exit status (0 after --help or --version). */
static int perf_parse(int argc, char **argv, struct perf_opts *o, enum upcie_nvme_path *path,
		      bool *dry_run, bool *done)
{
	static const double pct_default[] = { 50, 99, 99.9, 99.99 };
	struct upcie_pci_bdf bdf;
	struct perf_list pl;
	uint64_t x;
	int c;

	*done = false;
	memset(o, 0, sizeof(*o));
	o->argc = argc, o->argv = argv;
	o->nsid.v[0] = 1, o->nsid.n = 1;
	o->secs = 5;
	o->queues.v[0] = 1, o->queues.n = 1;
	o->qd.v[0] = 1, o->qd.n = 1;
	o->bs.v[0] = 4096, o->bs.n = 1;
	o->mix.v[0] = 100, o->mix.n = 1;
	o->pattern.v[0] = 0, o->pattern.n = 1;
	memcpy(o->pct, pct_default, sizeof(pct_default));
	o->npct = sizeof(pct_default) / sizeof(pct_default[0]);
	optind = 0;
	argv[0] = (char *)opt_tool; /* getopt's own messages name the tool, not its path */
	while ((c = getopt_long(argc, argv, "h", perf_long_opts, NULL)) != -1) {
		const char *v = optarg;

		switch (c) {
		case PERF_O_BDF:
			if (upcie_pci_bdf_parse_quiet_(v, &bdf))
				return opt_bad("--bdf", v, "a PCI address DDDD:BB:DD.F or BB:DD.F");
			if (o->nbdf == PERF_MAX_CTRL)
				return opt_bad("--bdf", v, "at most 8 controllers");
			for (unsigned i = 0; i < o->nbdf; i++) {
				struct upcie_pci_bdf b2;

				if (!upcie_pci_bdf_parse_quiet_(o->bdf[i], &b2) &&
				    !memcmp(&b2, &bdf, sizeof(bdf)))
					return opt_bad("--bdf", v, "each controller once");
			}
			o->bdf[o->nbdf++] = v;
			break;
		case PERF_O_GPU:
			if (strcmp(v, "null") && upcie_pci_bdf_parse_quiet_(v, &bdf))
				return opt_bad("--gpu", v,
					       "null or the PCI address of an NVMe controller");
			o->gpu = true, o->gpu_target = v;
			break;
		case PERF_O_GPU_ID:
			if (opt_u64_range(v, 0, 255, &x) && upcie_pci_bdf_parse_quiet_(v, &bdf))
				return opt_bad(
				    "--gpu-id", v,
				    "a CUDA device ordinal 0..255 or the GPU's PCI address");
			o->gpu_id = v;
			break;
		case PERF_O_PATH:
			if (upcie_nvme_path_parse(v, path))
				return opt_bad("--path", v, "auto, uio, type1 or iommufd");
			o->path = v;
			break;
		case PERF_O_BIND:
			o->bind = true;
			break;
		case PERF_O_BIND_ANY_CLASS:
			o->bind_any_class = true;
			break;
		case PERF_O_NS:
			if (perf_list(v, perf_item_nsid, &o->nsid))
				return opt_bad("--ns", v, "a list of namespace IDs 1..4294967294");
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
		case PERF_O_RAMP:
			if (opt_time_ns(v, &x) || x > 3600ull * 1000000000ull)
				return opt_bad("--ramp", v,
					       "a time 0..1h, e.g. 2 (seconds), 500ms");
			o->ramp = (double)x / 1e9;
			break;
		case PERF_O_SIZE:
			if (opt_size(v, &x) || !x)
				return opt_bad("--size", v, "a size such as 1G, 512MiB, 1048576");
			o->size = x;
			break;
		case PERF_O_CPUS:
			if (opt_cpulist(v, CPU_SETSIZE, o->cpus, PERF_MAX_CPUS, &o->ncpus))
				return opt_bad(
				    "--cpus", v,
				    "a CPU list such as 0-3,8 (each CPU once, below 1024)");
			o->cpus_given = true;
			break;
		case PERF_O_THREADS:
			if (opt_unsigned(v, 1, PERF_MAX_TQ, &o->threads))
				return opt_bad("--threads", v, "a count 1..256");
			break;
		case PERF_O_PCT:
			if (perf_list(v, perf_item_pct, &pl))
				return opt_bad("--percentiles", v,
					       "a list of percentiles above 0 up to 100, e.g. "
					       "50,99,99.9");
			o->npct = pl.n < PERF_MAX_PCT ? pl.n : PERF_MAX_PCT;
			for (unsigned i = 0; i < o->npct; i++) {
				double d;
				unsigned j = i;

				memcpy(&d, &pl.v[i], sizeof(d));
				for (; j > 0 && o->pct[j - 1] > d; j--)
					o->pct[j] = o->pct[j - 1]; /* ascending */
				o->pct[j] = d;
			}
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
	if (o->nbdf && o->gpu && strcmp(o->gpu_target, "null"))
		return opt_usage_error("--bdf and --gpu BDF name the controller twice: use one");
	if (!o->nbdf && !o->gpu)
		return opt_usage_error("--bdf BDF is required");
	if (o->gpu && (o->nbdf || o->nsid.n > 1))
		return opt_usage_error("GPU mode drives one controller and one namespace");
	if (o->gpu && (o->cpus_given || o->threads))
		return opt_usage_error("--cpus and --threads are for the CPU mode: in GPU mode a "
				       "warp drives each queue pair");
	if (!o->gpu && (o->gpu_id || o->gpu_sq_host))
		return opt_usage_error("--gpu-id and --sq-host go with --gpu");
	if (o->bind_any_class && !o->bind)
		return opt_usage_error("--bind-any-class goes with --bind");
	return perf_check_cpus(o);
}

/* Whether the function's class says it is something other than an NVMe controller. */
static bool perf_not_nvme(const struct upcie_pci_bdf *bdf)
{
	struct upcie_pci_func fn;

	return !upcie_pci_func_read(bdf, &fn) && fn.class_code != UPCIE_PCI_CLASS_NVME;
}

static void perf_dry_run(const struct perf_opts *o)
{
	unsigned n = o->queues.n * o->qd.n * o->bs.n * o->pattern.n * o->mix.n, run = 0;
	unsigned ntg = o->gpu ? 1 : o->nbdf * o->nsid.n;
	char cpus[256];

	printf("target %s", o->gpu ? "gpu:" : "");
	if (o->gpu)
		printf("%s", o->gpu_target);
	for (unsigned i = 0; i < o->nbdf; i++)
		printf("%s%s", i ? "," : "", o->bdf[i]);
	printf(" ns ");
	for (unsigned i = 0; i < o->nsid.n; i++)
		printf("%s%u", i ? "," : "", (unsigned)o->nsid.v[i]);
	printf(" path %s time %.3f s ramp %.3f s size %" PRIu64 "%s: %u run%s\n",
	       o->path ? o->path : "auto", o->secs, o->ramp, o->size, o->size ? "" : " (all)", n,
	       n == 1 ? "" : "s");
	if (o->gpu)
		printf("gpu %s\n", o->gpu_id ? o->gpu_id : "0");
	printf("bind %s\n", !o->bind		? "no"
			    : o->bind_any_class ? "yes, a function of any PCI class"
						: "yes, NVMe controllers only (class 0x010802)");
	printf("percentiles");
	for (unsigned i = 0; i < o->npct; i++)
		printf(" %g", o->pct[i]);
	perf_cpus_str(o->cpus, o->ncpus, cpus, sizeof(cpus));
	printf("\ncpus %s\n", o->gpu ? "-" : cpus);
	for (unsigned a = 0; a < o->queues.n; a++)
		for (unsigned b = 0; b < o->qd.n; b++)
			for (unsigned s = 0; s < o->bs.n; s++)
				for (unsigned p = 0; p < o->pattern.n; p++)
					for (unsigned m = 0; m < o->mix.n; m++) {
						unsigned nq = (unsigned)o->queues.v[a] * ntg;
						unsigned nth = o->gpu ? nq : perf_nthreads(o, nq);

						printf("run %u/%u queues=%u qd=%u bs=%" PRIu64
						       " %s read=%u%% targets=%u threads=%u",
						       ++run, n, (unsigned)o->queues.v[a],
						       (unsigned)o->qd.v[b], o->bs.v[s],
						       o->pattern.v[p] ? "seq" : "rand",
						       (unsigned)o->mix.v[m], ntg, nth);
						if (!o->gpu && nth > o->ncpus)
							printf(" (more threads than CPUs)");
						putchar('\n');
						for (unsigned k = 0; !o->gpu && k < nq; k++) {
							unsigned t = k % ntg;

							printf("  queue %u %s/%u -> thread %u cpu "
							       "%d\n",
							       k, o->bdf[t / o->nsid.n],
							       (unsigned)o->nsid.v[t % o->nsid.n],
							       k % nth,
							       perf_thread_cpu(o, k % nth));
						}
					}
}

int main(int argc, char **argv)
{
	static struct perf_ctrl {
		struct upcie_nvme_ctrl c;
		bool open;
	} ctl[PERF_MAX_CTRL];
	static struct perf_tgt tg[PERF_MAX_CTRL * PERF_MAX_LIST];
	static struct perf_result r;
	struct perf_opts o;
	struct perf_out out;
	enum upcie_nvme_path path = UPCIE_NVME_PATH_AUTO;
	unsigned ntg = 0, run = 0, nruns;
	bool failed = false, dry_run = false, done;
	int err, rc = 1;

	opt_tool = "upcie-perf";
	err = perf_parse(argc, argv, &o, &path, &dry_run, &done);
	if (err || done)
		return err;
	if (dry_run) {
		perf_dry_run(&o);
		return 0;
	}
	if (o.nbdf && o.threads > o.ncpus)
		fprintf(stderr,
			"upcie-perf: --threads %u on %u CPUs: spinning threads share CPUs, "
			"latencies include the scheduler's\n",
			o.threads, o.ncpus);
	memset(&out, 0, sizeof(out));
	out.f = stdout;
	out.json = o.json;
	memcpy(out.pct, o.pct, sizeof(out.pct));
	out.npct = o.npct;
	if (o.gpu) {
#if defined(UPCIE_PERF_GPU)
		return perf_gpu_main(&o, &out);
#else
		fprintf(stderr, "upcie-perf: --gpu needs the CUDA build (upcie-perf-cuda)\n");
		return 2;
#endif
	}
	for (unsigned i = 0; i < o.nbdf; i++) {
		struct upcie_nvme_ctrl_opts co;
		struct upcie_pci_bdf bdf;

		if (upcie_pci_bdf_parse(o.bdf[i], &bdf))
			goto out;
		memset(&co, 0, sizeof(co));
		co.dev.path = path;
		co.dev.bind = o.bind;
		co.dev.bind_any_class = o.bind_any_class;
		err = upcie_nvme_ctrl_open(&ctl[i].c, &bdf, &co);
		if (err) {
			fprintf(stderr, "upcie-perf: cannot open %s: %s\n", o.bdf[i],
				strerror(-err));
			if (err == -ENODEV && o.bind && !o.bind_any_class && perf_not_nvme(&bdf))
				fprintf(
				    stderr,
				    "upcie-perf: %s: check the address, or add --bind-any-class "
				    "to bind a function of another class\n",
				    o.bdf[i]);
			goto out;
		}
		ctl[i].open = true;
		for (unsigned j = 0; j < o.nsid.n; j++) {
			struct perf_tgt *t = &tg[ntg];
			uint64_t all;

			err = upcie_nvme_ns_open(&t->ns, &ctl[i].c, (uint32_t)o.nsid.v[j]);
			if (err) {
				fprintf(stderr, "upcie-perf: %s: namespace %u: %s\n", o.bdf[i],
					(unsigned)o.nsid.v[j], strerror(-err));
				goto out;
			}
			ntg++;
			t->c = &ctl[i].c;
			snprintf(t->name, sizeof(t->name), "%s/%u", ctl[i].c.name,
				 (unsigned)o.nsid.v[j]);
			all = t->ns.nsze * t->ns.lba_bytes;
			t->region = o.size && o.size < all ? o.size : all;
		}
	}
	nruns = o.queues.n * o.qd.n * o.bs.n * o.pattern.n * o.mix.n;
	if (o.json)
		perf_json_begin(&out, UPCIE_TOOLS_VERSION, o.argc, o.argv);
	for (unsigned a = 0; a < o.queues.n; a++)
		for (unsigned b = 0; b < o.qd.n; b++)
			for (unsigned s = 0; s < o.bs.n; s++)
				for (unsigned p = 0; p < o.pattern.n; p++)
					for (unsigned m = 0; m < o.mix.n; m++) {
						perf_result_init(
						    &r, "cpu",
						    upcie_nvme_path_name(ctl[0].c.dev.path),
						    (unsigned)o.queues.v[a], (unsigned)o.qd.v[b],
						    o.bs.v[s], (unsigned)o.pattern.v[p],
						    (unsigned)o.mix.v[m]);
						r.run = ++run, r.nruns = nruns;
						err = perf_run_cpu(tg, ntg, &o, r.queues, r.qd,
								   r.bs, (unsigned)o.pattern.v[p],
								   r.mix, &r);
						if (err || r.errors)
							failed = true;
						perf_emit(&out, &r);
						free(r.q);
						r.q = NULL;
					}
	rc = failed ? 1 : 0;
	if (o.json)
		perf_json_end(&out, rc);
out:
	for (unsigned i = 0; i < ntg; i++)
		upcie_nvme_ns_close(&tg[i].ns);
	for (unsigned i = 0; i < o.nbdf; i++)
		if (ctl[i].open)
			upcie_nvme_ctrl_close(&ctl[i].c);
	return rc;
}
