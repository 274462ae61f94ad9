/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Minimal TAP producer for upcie's unit tests. Each test program prints "ok N - ..." or
 * "not ok N - ..." per check, "1..N" at the end, and exits non-zero when a check failed.
 * CHECK() keeps going after a failure so one run shows every broken check.
 */
#ifndef UPCIE_TEST_CHECK_H
#define UPCIE_TEST_CHECK_H

#include <upcie/base/feature.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

static int check_n_;
static int check_failed_;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		int ok_ = !!(cond);                                                                \
		check_n_++;                                                                        \
		printf("%s %d - ", ok_ ? "ok" : "not ok", check_n_);                               \
		printf(__VA_ARGS__);                                                               \
		printf("\n");                                                                      \
		if (!ok_) {                                                                        \
			check_failed_++;                                                           \
			printf("#   failed: %s at %s:%d\n", #cond, __FILE__, __LINE__);            \
		}                                                                                  \
	} while (0)

/* Compare two integers and show both values on failure. */
#define CHECK_EQ(a, b, ...)                                                                        \
	do {                                                                                       \
		long long a_ = (long long)(a), b_ = (long long)(b);                                \
		CHECK(a_ == b_, __VA_ARGS__);                                                      \
		if (a_ != b_)                                                                      \
			printf("#   got %lld (0x%llx), want %lld (0x%llx)\n", a_,                  \
			       (unsigned long long)a_, b_, (unsigned long long)b_);                \
	} while (0)

/* A check that counts as skipped (TAP "# SKIP"), never as a pass. */
#define CHECK_SKIP(...)                                                                            \
	do {                                                                                       \
		check_n_++;                                                                        \
		printf("ok %d # SKIP ", check_n_);                                                 \
		printf(__VA_ARGS__);                                                               \
		printf("\n");                                                                      \
	} while (0)

static inline int check_done(void)
{
	printf("1..%d\n", check_n_);
	return check_failed_ ? 1 : 0;
}

#endif /* UPCIE_TEST_CHECK_H */
