/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Statistics of upcie-perf, shared by its CPU and GPU modes: a latency histogram with 128
 * sub-buckets per power of two (a bucket is at most 0.8 % wide, exact below 128 ns; exact
 * minimum, maximum and mean kept beside it), reads and writes in histograms of their own, the
 * summary of a run (total, per direction, per queue pair) and its text and JSON forms.
 *
 * JSON (schema 2): one document per call, {"schema": 2, "tool", "version", "start", "host",
 * "kernel", "machine", "cpus_online", "command": [...], "runs": [...], "failed": N, "exit": N}.
 * Each run is one line: its parameters, "ok", and either the error ("error", "errno") or the
 * figures: "iops", "mbps" (10^6 B/s), "mibps" (2^20 B/s), "cpu" (CPU time per I/O and CPUs
 * busy), "lat_ns" (both directions), "read" and "write" (each with "percentile" as fio writes
 * it and "bins": the histogram, bucket lower bound in ns -> count, the non-empty buckets only,
 * as fio's json+ output), and "per_queue".
 */
#ifndef UPCIE_TOOLS_PERF_STATS_H
#define UPCIE_TOOLS_PERF_STATS_H

#include <upcie/base/feature.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define PERF_HSUB	 7
#define PERF_HBUCKETS	 ((65u - PERF_HSUB) << PERF_HSUB)
#define PERF_MAX_PCT	 16
#define PERF_JSON_SCHEMA 2

struct perf_hist {
	uint64_t b[PERF_HBUCKETS];
	uint64_t n, sum, min, max;
};

#if defined(__CUDACC__)
#define PERF_HD __host__ __device__
#else
#define PERF_HD
#endif

PERF_HD static inline unsigned perf_bucket(uint64_t ns)
{
	unsigned msb;

	if (ns < (1u << PERF_HSUB))
		return (unsigned)ns;
#if defined(__CUDA_ARCH__)
	msb = 63u - (unsigned)__clzll((long long)ns);
#else
	msb = 63u - (unsigned)__builtin_clzll(ns);
#endif
	return ((msb - PERF_HSUB + 1) << PERF_HSUB) +
	       (unsigned)((ns >> (msb - PERF_HSUB)) & ((1u << PERF_HSUB) - 1));
}

/* The lower bound of bucket b's range. */
static inline uint64_t perf_bucket_lo(unsigned b)
{
	unsigned msb;

	if (b < (1u << PERF_HSUB))
		return b;
	msb = (b >> PERF_HSUB) + PERF_HSUB - 1;
	return ((uint64_t)((1u << PERF_HSUB) | (b & ((1u << PERF_HSUB) - 1)))) << (msb - PERF_HSUB);
}

static inline void perf_hist_init(struct perf_hist *h)
{
	memset(h, 0, sizeof(*h));
	h->min = UINT64_MAX;
}

static inline void perf_hist_add(struct perf_hist *h, uint64_t ns)
{
	h->b[perf_bucket(ns)]++;
	h->n++;
	h->sum += ns;
	if (ns < h->min)
		h->min = ns;
	if (ns > h->max)
		h->max = ns;
}

static inline void perf_hist_merge(struct perf_hist *dst, const struct perf_hist *src)
{
	for (unsigned i = 0; i < PERF_HBUCKETS; i++)
		dst->b[i] += src->b[i];
	dst->n += src->n;
	dst->sum += src->sum;
	if (src->min < dst->min)
		dst->min = src->min;
	if (src->max > dst->max)
		dst->max = src->max;
}

/*
 * The q-quantile (0..1) by nearest rank (the ceil(q * n)-th smallest sample): the middle of its
 * bucket, clamped to the exact extremes.
 */
static inline uint64_t perf_hist_quantile(const struct perf_hist *h, double q)
{
	uint64_t want, seen = 0;

	if (!h->n)
		return 0;
	want = (uint64_t)(q * (double)h->n);
	if ((double)want < q * (double)h->n)
		want++;
	if (want < 1)
		want = 1;
	if (want > h->n)
		want = h->n;
	for (unsigned i = 0; i < PERF_HBUCKETS; i++) {
		seen += h->b[i];
		if (seen >= want) {
			uint64_t lo = perf_bucket_lo(i),
				 hi = i + 1 < PERF_HBUCKETS ? perf_bucket_lo(i + 1) : lo;
			uint64_t v = lo + (hi - lo) / 2;

			if (v < h->min)
				v = h->min;
			if (v > h->max)
				v = h->max;
			return v;
		}
	}
	return h->max;
}

/* One queue pair's share of a run. */
struct perf_qres {
	char target[48]; /* controller/namespace */
	unsigned qid, thread;
	int cpu; /* the CPU its thread was pinned to; -1 none (GPU: the warp's block) */
	uint64_t ios, bytes, errors;
	struct perf_hist rd, wr;
};

struct perf_result {
	unsigned run, nruns;	  /* 1-based place in the sweep */
	char mode[16];		  /* "cpu", "gpu-null", "gpu-ctrl" */
	char path[16];		  /* DMA path, or where the GPU mode's SQs are */
	char target[200];	  /* controller/namespace, comma-separated; or "null" */
	char pattern[8];	  /* rand, seq */
	char gpu[32];		  /* GPU mode: the GPU's PCI address, else "" */
	unsigned queues, qd, mix; /* queues: per target */
	unsigned threads, ntargets;
	uint64_t bs;
	double secs, ramp; /* measured window; warm-up before it */
	uint64_t ios, bytes, errors;
	uint64_t cpu_ns; /* CPU time of the threads that drove the queues, in the window; 0 GPU */
	struct perf_hist rd, wr;
	unsigned nq;
	struct perf_qres *q; /* nq entries, or NULL */
	int err;	     /* a failed run: -errno, why says what */
	char why[200];
};

/* Where and how results go. */
struct perf_out {
	FILE *f;
	bool json, first;
	double pct[PERF_MAX_PCT]; /* percentiles to report, 0..100 */
	unsigned npct;
	unsigned failed;
};

/* "name (run 3/32 queues=2 qd=8 bs=4096 rand read=50%)": how progress lines and failures
 * name a run. */
static inline void perf_run_label(const struct perf_result *r, char *buf, size_t len)
{
	snprintf(buf, len, "run %u/%u queues=%u qd=%u bs=%" PRIu64 " %s read=%u%%", r->run,
		 r->nruns, r->queues, r->qd, r->bs, r->pattern, r->mix);
}

/* A latency in microseconds with the digits the histogram supports (three significant). */
static inline const char *perf_us(char *buf, size_t len, uint64_t ns)
{
	double us = (double)ns / 1e3;

	if (us < 1)
		snprintf(buf, len, "%.3f", us);
	else if (us < 10)
		snprintf(buf, len, "%.2f", us);
	else if (us < 100)
		snprintf(buf, len, "%.1f", us);
	else
		snprintf(buf, len, "%.0f", us);
	return buf;
}

/* "mean 12.3 p50 12.1 p99 20.4 p99.9 31.0 max 40.2" */
static inline void perf_text_lat(FILE *f, const struct perf_out *o, const struct perf_hist *h)
{
	char b[32];

	fprintf(f, "latency us mean %s", perf_us(b, sizeof(b), h->n ? h->sum / h->n : 0));
	for (unsigned i = 0; i < o->npct; i++)
		fprintf(f, " p%g %s", o->pct[i],
			perf_us(b, sizeof(b), perf_hist_quantile(h, o->pct[i] / 100)));
	fprintf(f, " max %s", perf_us(b, sizeof(b), h->n ? h->max : 0));
}

static inline double perf_rate(uint64_t x, double secs)
{
	return secs > 0 ? (double)x / secs : 0;
}

static inline void perf_print_text(const struct perf_out *o, const struct perf_result *r)
{
	static struct perf_hist all;
	char label[160];
	FILE *f = o->f;

	perf_run_label(r, label, sizeof(label));
	if (r->err) {
		fprintf(f, "%s %s %s %s: FAILED: %s\n", label, r->mode, r->path, r->target, r->why);
		return;
	}
	perf_hist_init(&all);
	perf_hist_merge(&all, &r->rd);
	perf_hist_merge(&all, &r->wr);
	fprintf(f, "%s %s %s %s threads=%u: %.0f IOPS, %.1f MB/s (%.1f MiB/s), ", label, r->mode,
		r->path, r->target, r->threads, perf_rate(r->ios, r->secs),
		perf_rate(r->bytes, r->secs) / 1e6, perf_rate(r->bytes, r->secs) / 1048576.0);
	perf_text_lat(f, o, &all);
	if (r->cpu_ns)
		fprintf(f, ", cpu %.2f us/IO (%.2f CPUs busy)",
			r->ios ? (double)r->cpu_ns / (double)r->ios / 1e3 : 0,
			perf_rate(r->cpu_ns, r->secs) / 1e9);
	fprintf(f, ", %" PRIu64 " errors (%.2f s", r->errors, r->secs);
	if (r->ramp > 0)
		fprintf(f, " after %.2f s warm-up", r->ramp);
	fprintf(f, ")\n");
	if (r->rd.n && r->wr.n) {
		fprintf(f, "  read:  %.0f IOPS, ", perf_rate(r->rd.n, r->secs));
		perf_text_lat(f, o, &r->rd);
		fprintf(f, "\n  write: %.0f IOPS, ", perf_rate(r->wr.n, r->secs));
		perf_text_lat(f, o, &r->wr);
		fputc('\n', f);
	}
	for (unsigned i = 0; r->nq > 1 && i < r->nq; i++) {
		const struct perf_qres *q = &r->q[i];

		perf_hist_init(&all);
		perf_hist_merge(&all, &q->rd);
		perf_hist_merge(&all, &q->wr);
		fprintf(f, "  queue %u %s qid %u thread %u", i, q->target, q->qid, q->thread);
		if (q->cpu >= 0)
			fprintf(f, " cpu %d", q->cpu);
		fprintf(f, ": %.0f IOPS, %.1f MB/s, ", perf_rate(q->ios, r->secs),
			perf_rate(q->bytes, r->secs) / 1e6);
		perf_text_lat(f, o, &all);
		fprintf(f, ", %" PRIu64 " errors\n", q->errors);
	}
}

/* A JSON string: quotes, backslashes and control characters escaped. */
static inline void perf_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

/* {"n", "mean", "min", "max", "p50", "p99", "p999", "percentile": {...}[, "bins": {...}]} */
static inline void perf_json_lat(FILE *f, const struct perf_out *o, const struct perf_hist *h,
				 bool bins)
{
	bool first = true;

	fprintf(f,
		"{\"n\": %" PRIu64 ", \"mean\": %.1f, \"min\": %" PRIu64 ", \"max\": %" PRIu64
		", \"p50\": %" PRIu64 ", \"p99\": %" PRIu64 ", \"p999\": %" PRIu64
		", \"percentile\": {",
		h->n, h->n ? (double)h->sum / (double)h->n : 0, h->n ? h->min : 0, h->max,
		perf_hist_quantile(h, 0.5), perf_hist_quantile(h, 0.99),
		perf_hist_quantile(h, 0.999));
	for (unsigned i = 0; i < o->npct; i++)
		fprintf(f, "%s\"%.6f\": %" PRIu64, i ? ", " : "", o->pct[i],
			perf_hist_quantile(h, o->pct[i] / 100));
	fputc('}', f);
	if (bins) {
		fprintf(f, ", \"bins\": {");
		for (unsigned i = 0; i < PERF_HBUCKETS; i++) {
			if (!h->b[i])
				continue;
			fprintf(f, "%s\"%" PRIu64 "\": %" PRIu64, first ? "" : ", ",
				perf_bucket_lo(i), h->b[i]);
			first = false;
		}
		fputc('}', f);
	}
	fputc('}', f);
}

static inline void perf_print_json(struct perf_out *o, const struct perf_result *r)
{
	static struct perf_hist all;
	FILE *f = o->f;

	fprintf(f, "%s  {\"run\": %u, \"ok\": %s, \"mode\": ", o->first ? "" : ",\n", r->run,
		r->err ? "false" : "true");
	perf_json_str(f, r->mode);
	fprintf(f, ", \"path\": ");
	perf_json_str(f, r->path);
	fprintf(f, ", \"target\": ");
	perf_json_str(f, r->target);
	if (r->gpu[0]) {
		fprintf(f, ", \"gpu\": ");
		perf_json_str(f, r->gpu);
	}
	fprintf(f,
		", \"targets\": %u, \"queues\": %u, \"qd\": %u, \"bs\": %" PRIu64
		", \"pattern\": \"%s\", \"read_pct\": %u, \"threads\": %u, \"ramp_s\": %.3f",
		r->ntargets, r->queues, r->qd, r->bs, r->pattern, r->mix, r->threads, r->ramp);
	if (r->err) {
		fprintf(f, ", \"errno\": %d, \"error\": ", -r->err);
		perf_json_str(f, r->why);
		fputc('}', f);
		return;
	}
	perf_hist_init(&all);
	perf_hist_merge(&all, &r->rd);
	perf_hist_merge(&all, &r->wr);
	fprintf(f,
		", \"secs\": %.3f, \"ios\": %" PRIu64 ", \"bytes\": %" PRIu64
		", \"errors\": %" PRIu64 ", \"iops\": %.1f, \"mbps\": %.3f, \"mibps\": %.3f",
		r->secs, r->ios, r->bytes, r->errors, perf_rate(r->ios, r->secs),
		perf_rate(r->bytes, r->secs) / 1e6, perf_rate(r->bytes, r->secs) / 1048576.0);
	if (r->cpu_ns)
		fprintf(f, ", \"cpu\": {\"ns\": %" PRIu64 ", \"ns_per_io\": %.1f, \"busy\": %.3f}",
			r->cpu_ns, r->ios ? (double)r->cpu_ns / (double)r->ios : 0,
			perf_rate(r->cpu_ns, r->secs) / 1e9);
	fprintf(f, ", \"read\": {\"ios\": %" PRIu64 ", \"iops\": %.1f, \"lat_ns\": ", r->rd.n,
		perf_rate(r->rd.n, r->secs));
	perf_json_lat(f, o, &r->rd, true);
	fprintf(f, "}, \"write\": {\"ios\": %" PRIu64 ", \"iops\": %.1f, \"lat_ns\": ", r->wr.n,
		perf_rate(r->wr.n, r->secs));
	perf_json_lat(f, o, &r->wr, true);
	fprintf(f, "}, \"per_queue\": [");
	for (unsigned i = 0; i < r->nq; i++) {
		const struct perf_qres *q = &r->q[i];
		static struct perf_hist qa;

		perf_hist_init(&qa);
		perf_hist_merge(&qa, &q->rd);
		perf_hist_merge(&qa, &q->wr);
		fprintf(f, "%s{\"target\": ", i ? ", " : "");
		perf_json_str(f, q->target);
		fprintf(f,
			", \"qid\": %u, \"thread\": %u, \"cpu\": %d, \"ios\": %" PRIu64
			", \"errors\": %" PRIu64 ", \"iops\": %.1f, \"mbps\": %.3f, \"lat_ns\": ",
			q->qid, q->thread, q->cpu, q->ios, q->errors, perf_rate(q->ios, r->secs),
			perf_rate(q->bytes, r->secs) / 1e6);
		perf_json_lat(f, o, &qa, false);
		fputc('}', f);
	}
	/* last: both directions, the figures most readers want */
	fprintf(f, "], \"lat_ns\": ");
	perf_json_lat(f, o, &all, false);
	fputc('}', f);
}

/* The document's head: what ran, where, when, built from what. */
static inline void perf_json_begin(struct perf_out *o, const char *version, int argc, char **argv)
{
	char host[256] = "", when[32] = "";
	struct utsname u;
	time_t now = time(NULL);
	struct tm tm;
	FILE *f = o->f;

	if (gethostname(host, sizeof(host)))
		snprintf(host, sizeof(host), "?");
	host[sizeof(host) - 1] = '\0';
	if (gmtime_r(&now, &tm))
		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
	if (uname(&u))
		memset(&u, 0, sizeof(u));
	fprintf(f, "{\"schema\": %d, \"tool\": \"upcie-perf\", \"version\": ", PERF_JSON_SCHEMA);
	perf_json_str(f, version);
	fprintf(f, ", \"start\": \"%s\", \"host\": ", when);
	perf_json_str(f, host);
	fprintf(f, ", \"kernel\": ");
	perf_json_str(f, u.release);
	fprintf(f, ", \"machine\": ");
	perf_json_str(f, u.machine);
	fprintf(f, ", \"cpus_online\": %ld, \"command\": [", sysconf(_SC_NPROCESSORS_ONLN));
	for (int i = 0; i < argc; i++) {
		if (i)
			fprintf(f, ", ");
		perf_json_str(f, i ? argv[i] : "upcie-perf");
	}
	fprintf(f, "], \"runs\": [\n");
	o->first = true;
}

static inline void perf_json_end(struct perf_out *o, int exit_status)
{
	fprintf(o->f, "\n], \"failed\": %u, \"exit\": %d}\n", o->failed, exit_status);
	fflush(o->f);
}

/* One run's result (or its failure) in the chosen format, flushed at once (a sweep shows each
 * run as it ends). A failed run is also said on stderr when stdout carries JSON. */
static inline void perf_emit(struct perf_out *o, const struct perf_result *r)
{
	if (r->err) {
		o->failed++;
		if (o->json) {
			char label[160];

			perf_run_label(r, label, sizeof(label));
			fprintf(stderr, "upcie-perf: %s failed: %s\n", label, r->why);
		}
	}
	if (o->json)
		perf_print_json(o, r);
	else
		perf_print_text(o, r);
	o->first = false;
	fflush(o->f);
}

#endif /* UPCIE_TOOLS_PERF_STATS_H */
