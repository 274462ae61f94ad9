/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * TAP output for the guest test programs: TAP(cond, fmt, ...) prints "ok N - ..." or
 * "not ok N - ...", SKIP(fmt, ...) prints "ok N - ..." (put "# SKIP reason" in the text), and
 * tap_done() prints the plan and gives the exit status. Output is flushed per line so a guest that
 * dies mid-test still shows how far it got. Each line, and its count, is taken under the stdout
 * lock, so threads reporting at once neither interleave lines nor lose counts.
 */
#ifndef UPCIE_GUEST_TAP_H
#define UPCIE_GUEST_TAP_H

#include <upcie/base/feature.h>

#include <stdio.h>

static int tap_n_, tap_failed_;

#define TAP(cond, ...)                                                                             \
	do {                                                                                       \
		int ok_ = !!(cond);                                                                \
		flockfile(stdout);                                                                 \
		printf("%s %d - ", ok_ ? "ok" : "not ok", ++tap_n_);                               \
		printf(__VA_ARGS__);                                                               \
		printf("\n");                                                                      \
		tap_failed_ += !ok_;                                                               \
		fflush(stdout);                                                                    \
		funlockfile(stdout);                                                               \
	} while (0)

#define SKIP(...)                                                                                  \
	do {                                                                                       \
		flockfile(stdout);                                                                 \
		printf("ok %d - ", ++tap_n_);                                                      \
		printf(__VA_ARGS__);                                                               \
		printf("\n");                                                                      \
		fflush(stdout);                                                                    \
		funlockfile(stdout);                                                               \
	} while (0)

static inline int tap_done(void)
{
	printf("1..%d\n", tap_n_);
	return tap_failed_ ? 1 : 0;
}

#endif /* UPCIE_GUEST_TAP_H */
