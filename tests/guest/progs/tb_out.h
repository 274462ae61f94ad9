/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Non-result output of the guest test programs: DIAG(fmt, ...) prints a "# " diagnostic line and
 * INFO(key, fmt, ...) a "# tb: KEY=VALUE" fact that the case's host script reads back
 * (tb_guest_info KEY). Flushed per line, like the TAP lines around them. Each line is written
 * under the stdout lock, so lines printed by several threads at once never interleave.
 */
#ifndef UPCIE_GUEST_TB_OUT_H
#define UPCIE_GUEST_TB_OUT_H

#include <upcie/base/feature.h>

#include <stdio.h>

#define DIAG(...)                                                                                  \
	do {                                                                                       \
		flockfile(stdout);                                                                 \
		printf("# ");                                                                      \
		printf(__VA_ARGS__);                                                               \
		printf("\n");                                                                      \
		fflush(stdout);                                                                    \
		funlockfile(stdout);                                                               \
	} while (0)

#define INFO(key, ...)                                                                             \
	do {                                                                                       \
		flockfile(stdout);                                                                 \
		printf("# tb: %s=", key);                                                          \
		printf(__VA_ARGS__);                                                               \
		printf("\n");                                                                      \
		fflush(stdout);                                                                    \
		funlockfile(stdout);                                                               \
	} while (0)

#endif /* UPCIE_GUEST_TB_OUT_H */
