/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Statistics of upcie-perf, shared by its CPU and GPU modes: a latency histogram with 32
 * sub-buckets per power of two (at most 3 % error, exact below 32 ns; exact minimum, maximum and
 * mean kept beside it), the summary of a run and its text and JSON forms.
 */
#ifndef UPCIE_TOOLS_PERF_STATS_H
#define UPCIE_TOOLS_PERF_STATS_H

#include <upcie/base/feature.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define PERF_HSUB     5
#define PERF_HBUCKETS (60u << PERF_HSUB)

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

/* The q-quantile (0..1): the middle of its bucket, clamped to the exact extremes. */
static inline uint64_t perf_hist_quantile(const struct perf_hist *h, double q)
{
	uint64_t want, seen = 0;

	if (!h->n)
		return 0;
	want = (uint64_t)(q * (double)h->n);
	if (want >= h->n)
		want = h->n - 1;
	for (unsigned i = 0; i < PERF_HBUCKETS; i++) {
		seen += h->b[i];
		if (seen > want) {
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

struct perf_result {
	char mode[16];	 /* "cpu", "gpu-null", "gpu-ctrl" */
	char path[16];	 /* DMA path, or "-" */
	char target[32]; /* controller address, or "null" */
	char pattern[8]; /* rand, seq */
	unsigned queues, qd, mix;
	uint64_t bs;
	double secs;
	uint64_t ios, bytes, errors;
	struct perf_hist lat;
};

static inline void perf_print_text(FILE *o, const struct perf_result *r)
{
	double iops = r->secs > 0 ? (double)r->ios / r->secs : 0;

	fprintf(o,
		"%s %s %s queues=%u qd=%u bs=%" PRIu64 " %s read=%u%%: %.0f IOPS, %.1f MB/s, "
		"latency us mean %.2f p50 %.2f p99 %.2f p99.9 %.2f max %.2f, %" PRIu64
		" errors (%.1f s)\n",
		r->mode, r->path, r->target, r->queues, r->qd, r->bs, r->pattern, r->mix, iops,
		r->secs > 0 ? (double)r->bytes / r->secs / 1e6 : 0,
		r->lat.n ? (double)r->lat.sum / (double)r->lat.n / 1e3 : 0,
		perf_hist_quantile(&r->lat, 0.5) / 1e3, perf_hist_quantile(&r->lat, 0.99) / 1e3,
		perf_hist_quantile(&r->lat, 0.999) / 1e3, r->lat.n ? r->lat.max / 1e3 : 0,
		r->errors, r->secs);
}

static inline void perf_print_json(FILE *o, const struct perf_result *r, bool first)
{
	fprintf(o,
		"%s  {\"mode\": \"%s\", \"path\": \"%s\", \"target\": \"%s\", \"queues\": %u, "
		"\"qd\": %u, \"bs\": %" PRIu64 ", \"pattern\": \"%s\", \"read_pct\": %u, "
		"\"secs\": %.3f, \"ios\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"errors\": %" PRIu64
		", \"iops\": %.1f, \"mbps\": %.3f, \"lat_ns\": {\"mean\": %.1f, \"p50\": %" PRIu64
		", \"p99\": %" PRIu64 ", \"p999\": %" PRIu64 ", \"min\": %" PRIu64
		", \"max\": %" PRIu64 "}}",
		first ? "" : ",\n", r->mode, r->path, r->target, r->queues, r->qd, r->bs,
		r->pattern, r->mix, r->secs, r->ios, r->bytes, r->errors,
		r->secs > 0 ? (double)r->ios / r->secs : 0,
		r->secs > 0 ? (double)r->bytes / r->secs / 1e6 : 0,
		r->lat.n ? (double)r->lat.sum / (double)r->lat.n : 0,
		perf_hist_quantile(&r->lat, 0.5), perf_hist_quantile(&r->lat, 0.99),
		perf_hist_quantile(&r->lat, 0.999), r->lat.n ? r->lat.min : 0, r->lat.max);
}

/* One run's result in the chosen format, flushed at once (a sweep shows each run as it ends);
 * *first tracks the separators of the JSON list. */
static inline void perf_emit(FILE *o, const struct perf_result *r, bool json, bool *first)
{
	if (json)
		perf_print_json(o, r, *first);
	else
		perf_print_text(o, r);
	*first = false;
	fflush(o);
}

#endif /* UPCIE_TOOLS_PERF_STATS_H */
