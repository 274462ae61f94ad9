/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Monotonic time and deadlines for bounded waits.
 *
 * Time is CLOCK_MONOTONIC in nanoseconds. A deadline is an absolute time; polling loops check it
 * rather than sleeping, so completion paths never sleep. upcie_sleep_ns() exists for slow paths
 * (controller enable/disable waits) only.
 */
#ifndef UPCIE_BASE_CLOCK_H
#define UPCIE_BASE_CLOCK_H

#include <upcie/base/feature.h>

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define UPCIE_NSEC_PER_USEC UINT64_C(1000)
#define UPCIE_NSEC_PER_MSEC UINT64_C(1000000)
#define UPCIE_NSEC_PER_SEC  UINT64_C(1000000000)
/* A timeout that never expires. */
#define UPCIE_TIMEOUT_INF UINT64_MAX

struct upcie_deadline {
	uint64_t end_ns; /* UINT64_MAX: never */
};

/* CLOCK_MONOTONIC in nanoseconds: unaffected by changes of the wall clock, so deadlines hold. */
static inline uint64_t upcie_time_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * UPCIE_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

/* Start a deadline `timeout_ns` from now; UPCIE_TIMEOUT_INF never expires. */
static inline void upcie_deadline_set(struct upcie_deadline *d, uint64_t timeout_ns)
{
	uint64_t now = upcie_time_ns();

	if (timeout_ns == UPCIE_TIMEOUT_INF || now + timeout_ns < now)
		d->end_ns = UINT64_MAX;
	else
		d->end_ns = now + timeout_ns;
}

/* True once the deadline is reached; never for one set with UPCIE_TIMEOUT_INF. */
static inline bool upcie_deadline_passed(const struct upcie_deadline *d)
{
	return d->end_ns != UINT64_MAX && upcie_time_ns() >= d->end_ns;
}

/* Nanoseconds left (0 once passed, UINT64_MAX for a deadline that never expires). */
static inline uint64_t upcie_deadline_remaining_ns(const struct upcie_deadline *d)
{
	uint64_t now;

	if (d->end_ns == UINT64_MAX)
		return UINT64_MAX;
	now = upcie_time_ns();
	return now >= d->end_ns ? 0 : d->end_ns - now;
}

/* Sleep `ns` nanoseconds, resuming after signals; for slow paths only (see above). */
static inline void upcie_sleep_ns(uint64_t ns)
{
	struct timespec ts = { (time_t)(ns / UPCIE_NSEC_PER_SEC), (long)(ns % UPCIE_NSEC_PER_SEC) };

	while (nanosleep(&ts, &ts) != 0)
		;
}

#endif /* UPCIE_BASE_CLOCK_H */
