/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Feature-test macros. upcie uses POSIX and Linux interfaces (clock_gettime, pread, memfd_create,
 * ...) that strict C11 (-std=c11) hides. Every upcie header includes this file before any system
 * header, so a upcie header included first just works; when a system header comes first, compile
 * with -D_GNU_SOURCE (pkg-config --cflags upcie adds it).
 */
#ifndef UPCIE_BASE_FEATURE_H
#define UPCIE_BASE_FEATURE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#endif /* UPCIE_BASE_FEATURE_H */
