/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests for upcie-perf's statistics (tools/perf-stats.h): every bucket covers the values
 * that map to it and no other, its width stays within the promised 1/32 of its start (exact
 * below 32 ns), quantiles of the histogram stay within half a bucket of the quantiles of the sorted
 * samples, merging equals adding, extremes and the mean are exact, and the text and JSON
 * summaries carry the same figures. A quantile read from the wrong bucket (off by one) is shown
 * to break the comparison, so the comparison can fail.
 */
#include <upcie/base/feature.h>

#include "../../tools/perf-stats.h"
#include "check.h"

#include <stdlib.h>

static double dabs(double x)
{
	return x < 0 ? -x : x;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* log-uniform over [1, 2^40) ns: every bucket range gets samples */
static uint64_t sample(void)
{
	unsigned e = (unsigned)(next() % 40);

	return ((uint64_t)1 << e) + next() % ((uint64_t)1 << e);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* The reference q-quantile of sorted samples, as perf_hist_quantile() counts (the want-th). */
static uint64_t ref_quantile(const uint64_t *s, size_t n, double q)
{
	uint64_t want = (uint64_t)(q * (double)n);

	return s[want >= n ? n - 1 : want];
}

/* A quantile is the middle of the bucket that holds the exact value: at most half a bucket away,
 * or a whole bucket where it was clamped to an extreme that shares that bucket. */
static bool within(uint64_t got, uint64_t want, const struct perf_hist *h)
{
	unsigned k = perf_bucket(want);
	uint64_t w = perf_bucket_lo(k + 1) - perf_bucket_lo(k);
	uint64_t err = got > want ? got - want : want - got;

	if (want < 32)
		return got == want;
	return 2 * err <= w || ((got == h->min || got == h->max) && err < w);
}

/* the quantile taken from the bucket after the right one: what the comparison must catch */
static uint64_t off_by_one_quantile(const struct perf_hist *h, double q)
{
	uint64_t want = (uint64_t)(q * (double)h->n), seen = 0;

	for (unsigned i = 0; i + 1 < PERF_HBUCKETS; i++) {
		seen += h->b[i];
		if (seen > want)
			return perf_bucket_lo(i + 1) +
			       (perf_bucket_lo(i + 2) - perf_bucket_lo(i + 1)) / 2;
	}
	return h->max;
}

enum { NS = 200000 };

int main(void)
{
	static uint64_t s[NS];
	static struct perf_hist h, a, b;
	static const double qs[] = { 0.0, 0.01, 0.5, 0.9, 0.99, 0.999, 0.9999 };
	unsigned bad = 0, caught = 0;
	uint64_t sum = 0, mn = UINT64_MAX, mx = 0;

	/* buckets: exact below 32, then each value inside [lo(b), lo(b+1)) with a width of
	 * at most lo/32 */
	for (uint64_t v = 0; v < 32; v++)
		if (perf_bucket(v) != v || perf_bucket_lo((unsigned)v) != v)
			bad++;
	CHECK_EQ(bad, 0, "values below 32 ns have buckets of their own");
	bad = 0;
	for (unsigned i = 0; i < 2000000; i++) {
		uint64_t v = i < 1000000 ? i : sample();
		unsigned k = perf_bucket(v);

		if (k + 1 >= PERF_HBUCKETS || perf_bucket_lo(k) > v || perf_bucket_lo(k + 1) <= v ||
		    (v >= 32 &&
		     (perf_bucket_lo(k + 1) - perf_bucket_lo(k)) * 32 > perf_bucket_lo(k)))
			bad++;
	}
	CHECK_EQ(bad, 0, "2 M values each inside its bucket, bucket widths within 1/32");
	bad = 0;
	for (unsigned k = 1; k + 1 < PERF_HBUCKETS; k++)
		if (perf_bucket_lo(k) <= perf_bucket_lo(k - 1) ||
		    perf_bucket(perf_bucket_lo(k)) != k)
			bad++;
	CHECK_EQ(bad, 0, "bucket starts rise and each maps back to its bucket");

	/* empty and single-sample histograms */
	perf_hist_init(&h);
	CHECK_EQ(perf_hist_quantile(&h, 0.5), 0, "an empty histogram's median is 0");
	perf_hist_add(&h, 123457);
	CHECK(perf_hist_quantile(&h, 0.0) == 123457 && perf_hist_quantile(&h, 0.5) == 123457 &&
		  perf_hist_quantile(&h, 1.0) == 123457,
	      "one sample: every quantile is that sample (clamped to the exact extremes)");

	/* quantiles against sorted samples; two halves merged equal the whole */
	perf_hist_init(&h);
	perf_hist_init(&a);
	perf_hist_init(&b);
	for (size_t i = 0; i < NS; i++) {
		s[i] = sample();
		perf_hist_add(&h, s[i]);
		perf_hist_add(i & 1 ? &a : &b, s[i]);
		sum += s[i];
		mn = s[i] < mn ? s[i] : mn;
		mx = s[i] > mx ? s[i] : mx;
	}
	qsort(s, NS, sizeof(s[0]), cmp_u64);
	bad = 0;
	for (unsigned i = 0; i < sizeof(qs) / sizeof(qs[0]); i++) {
		uint64_t got = perf_hist_quantile(&h, qs[i]), want = ref_quantile(s, NS, qs[i]);

		if (!within(got, want, &h)) {
			bad++;
			printf("# q %.4f: histogram %" PRIu64 ", samples %" PRIu64 "\n", qs[i], got,
			       want);
		}
		if (!within(off_by_one_quantile(&h, qs[i]), want, &h))
			caught++;
	}
	CHECK_EQ(bad, 0,
		 "7 quantiles of 200 k log-uniform samples within half a bucket (1/64) of the "
		 "exact ones");
	CHECK_EQ(caught, sizeof(qs) / sizeof(qs[0]),
		 "negative control: a quantile read from the next bucket misses every time");
	CHECK(h.n == NS && h.sum == sum && h.min == mn && h.max == mx,
	      "count, sum, minimum and maximum are exact");
	perf_hist_merge(&a, &b);
	CHECK(a.n == h.n && a.sum == h.sum && a.min == h.min && a.max == h.max &&
		  !memcmp(a.b, h.b, sizeof(a.b)),
	      "merging two halves gives the histogram of the whole");

	/* the summaries: text and JSON carry the same quantiles, MB/s = bytes / s */
	{
		struct perf_result *r = (struct perf_result *)calloc(1, sizeof(*r));
		static char text[4096], json[1 << 17];
		struct perf_out o;
		FILE *f;
		double t50, t99, tmb;
		unsigned long long j50, j99, jmax;
		double jmb;
		const char *p;

		if (!r)
			return 1;
		strcpy(r->mode, "cpu");
		strcpy(r->path, "uio");
		strcpy(r->target, "0000:00:04.0");
		strcpy(r->pattern, "rand");
		r->queues = 2;
		r->qd = 32;
		r->mix = 100;
		r->bs = 4096;
		r->secs = 2.0;
		r->ios = 500000;
		r->bytes = r->ios * r->bs;
		r->rd = h; /* all reads (mix 100) */
		r->threads = 1;
		r->ntargets = 1;
		r->run = r->nruns = 1;
		memset(&o, 0, sizeof(o));
		o.pct[0] = 50;
		o.pct[1] = 99;
		o.npct = 2;
		o.first = true;
		f = fmemopen(text, sizeof(text), "w");
		o.f = f;
		perf_print_text(&o, r);
		fclose(f);
		f = fmemopen(json, sizeof(json), "w");
		o.f = f;
		o.json = true;
		perf_print_json(&o, r);
		fclose(f);
		printf("# %s", text);
		p = strstr(text, "MB/s");
		CHECK(strstr(text, "250000 IOPS") && p &&
			  sscanf(strstr(text, "IOPS, ") + 6, "%lf MB/s", &tmb) == 1 &&
			  dabs(tmb - 1024.0) < 0.05,
		      "text: 250000 IOPS and 1024.0 MB/s for 500 k 4 KiB I/Os in 2 s");
		CHECK(sscanf(strstr(text, "p50 "), "p50 %lf p99 %lf", &t50, &t99) == 2 &&
			  sscanf(strstr(json, "\"p50\": "), "\"p50\": %llu, \"p99\": %llu", &j50,
				 &j99) == 2 &&
			  sscanf(strstr(json, "\"max\": "), "\"max\": %llu", &jmax) == 1 &&
			  /* the text has 3 significant digits */
			  dabs(t50 - (double)j50 / 1e3) <= 0.005 * t50 + 0.001 &&
			  dabs(t99 - (double)j99 / 1e3) <= 0.005 * t99 + 0.001 && j50 <= j99 &&
			  j99 <= jmax && jmax == mx,
		      "JSON and text carry the same p50/p99 (ns vs us), p50 <= p99 <= max");
		CHECK(sscanf(strstr(json, "\"mbps\": "), "\"mbps\": %lf", &jmb) == 1 &&
			  dabs(jmb - 1024.0) < 0.01 && json[0] == ' ' &&
			  json[strlen(json) - 1] == '}',
		      "JSON: mbps 1024.000, one object");
		free(r);
	}
	return check_done();
}
