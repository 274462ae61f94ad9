/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helpers shared by the guest NVMe programs (t_nvme, t_nvme_perf): TAP output, the test bed's
 * data pattern (tools/tbpat.c: 512-byte units, unit index, 8-byte tag, (u + i) & 0xff), the
 * test bed facts from the environment, and upcie's log routed into TAP diagnostics.
 */
#ifndef T_NVME_UTIL_H
#define T_NVME_UTIL_H

#include <upcie/base/feature.h>

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/pci/bdf.h>

#include "tb_out.h"

static int tn_n UPCIE_UNUSED, tn_failed UPCIE_UNUSED;
static const char *tn_prefix UPCIE_UNUSED = "";

#define TAP(cond, ...)                                                                             \
	do {                                                                                       \
		int ok_ = !!(cond);                                                                \
		printf("%s %d - %s", ok_ ? "ok" : "not ok", ++tn_n, tn_prefix);                    \
		printf(__VA_ARGS__);                                                               \
		printf("\n");                                                                      \
		tn_failed += !ok_;                                                                 \
		fflush(stdout);                                                                    \
	} while (0)
#define SKIP(why, ...)                                                                             \
	do {                                                                                       \
		printf("ok %d - %s", ++tn_n, tn_prefix);                                           \
		printf(__VA_ARGS__);                                                               \
		printf(" # SKIP %s\n", why);                                                       \
		fflush(stdout);                                                                    \
	} while (0)

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

static inline void tn_log(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)ctx;
	printf("# upcie %s: %s\n", level == UPCIE_LOG_ERROR ? "error" : "log", msg);
	fflush(stdout);
}

/* Test bed tag: name + this boot's nonce, 8 bytes NUL padded (tb_tag). */
static inline void tn_tag(char tag[9], const char *name)
{
	const char *nonce = getenv("TB_NONCE");
	size_t n = strlen(name);

	/* truncated at 8 bytes, like the shell's tags */
	memset(tag, 0, 9);
	if (!nonce)
		nonce = "0000";
	memcpy(tag, name, n < 8 ? n : 8);
	for (size_t i = 0; n + i < 8 && nonce[i]; i++)
		tag[n + i] = nonce[i];
}

/* Pattern bytes of [off, off + len) for `tag`, as tbpat gen writes them. */
static inline void tn_pat(void *buf, uint64_t len, const char *tag, uint64_t off)
{
	uint8_t *p = (uint8_t *)buf;

	for (uint64_t k = 0; k < len; k++) {
		uint64_t o = off + k, u = o / 512;
		unsigned i = (unsigned)(o % 512);

		if (i < 8)
			p[k] = (uint8_t)(u >> (8 * i));
		else if (i < 16)
			p[k] = (uint8_t)tag[i - 8];
		else
			p[k] = (uint8_t)((u + i) & 0xff);
	}
}

/* Offset of the first byte of buf that differs from the pattern, or -1. */
static inline int64_t tn_pat_diff(const void *buf, uint64_t len, const char *tag, uint64_t off)
{
	const uint8_t *p = (const uint8_t *)buf;
	uint8_t want[512];

	for (uint64_t k = 0; k < len;) {
		uint64_t n = len - k < sizeof(want) ? len - k : sizeof(want);

		tn_pat(want, n, tag, off + k);
		for (uint64_t j = 0; j < n; j++)
			if (p[k + j] != want[j])
				return (int64_t)(k + j);
		k += n;
	}
	return -1;
}

static inline int tn_bdf_env(const char *var, struct upcie_pci_bdf *bdf)
{
	const char *s = getenv(var);

	if (!s || upcie_pci_bdf_parse(s, bdf)) {
		fprintf(stderr, "%s missing or not a PCI address\n", var);
		return -1;
	}
	return 0;
}

static inline const char *tn_kernel(void)
{
	static struct utsname u;

	if (!u.release[0] && uname(&u))
		snprintf(u.release, sizeof(u.release), "?");
	return u.release;
}

static inline int tn_kernel_at_least(int major, int minor)
{
	int ma = 0, mi = 0;

	sscanf(tn_kernel(), "%d.%d", &ma, &mi);
	return ma > major || (ma == major && mi >= minor);
}

#endif /* T_NVME_UTIL_H */
