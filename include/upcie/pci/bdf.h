/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * PCI function addresses (domain:bus:device.function): parse, format, compare.
 *
 * Accepts "DDDD:BB:DD.F" (domain up to 8 hex digits, as VMD domains have) and the short
 * "BB:DD.F" (domain 0). Formats as sysfs names them ("0000:01:00.0"). Pure string handling; no
 * sysfs access.
 */
#ifndef UPCIE_PCI_BDF_H
#define UPCIE_PCI_BDF_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <upcie/base/log.h>

/* Longest formatted name: 8-digit domain + ":bb:dd.f" + NUL. */
#define UPCIE_PCI_BDF_STRLEN 17

struct upcie_pci_bdf {
	uint32_t domain;
	uint8_t bus;
	uint8_t dev; /* 0..31 */
	uint8_t fn;  /* 0..7 */
};

static inline int upcie_pci_hexval_(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Parse 1..maxdig hex digits ending at `stop`; returns the position after them or NULL. */
static inline const char *upcie_pci_hexfield_(const char *s, int maxdig, char stop, uint32_t *out)
{
	uint32_t v = 0;
	int n = 0;

	for (; *s && *s != stop; s++, n++) {
		int d = upcie_pci_hexval_(*s);

		if (d < 0 || n == maxdig)
			return NULL;
		v = (v << 4) | (uint32_t)d;
	}
	if (n == 0 || *s != stop)
		return NULL;
	*out = v;
	return s;
}

/* Parse without logging: 0 or -EINVAL. */
static inline int upcie_pci_bdf_parse_quiet_(const char *str, struct upcie_pci_bdf *bdf)
{
	uint32_t domain = 0, bus, dev, fn;
	const char *s = str;
	int colons = 0;

	if (!str || !bdf)
		return -EINVAL;
	for (const char *p = str; *p; p++)
		colons += *p == ':';
	if (colons == 2) {
		s = upcie_pci_hexfield_(s, 8, ':', &domain);
		if (!s)
			goto bad;
		s++;
	} else if (colons != 1) {
		goto bad;
	}
	s = upcie_pci_hexfield_(s, 2, ':', &bus);
	if (!s)
		goto bad;
	s = upcie_pci_hexfield_(s + 1, 2, '.', &dev);
	if (!s || dev > 31)
		goto bad;
	s = upcie_pci_hexfield_(s + 1, 1, '\0', &fn);
	if (!s || fn > 7)
		goto bad;
	bdf->domain = domain;
	bdf->bus = (uint8_t)bus;
	bdf->dev = (uint8_t)dev;
	bdf->fn = (uint8_t)fn;
	return 0;
bad:
	return -EINVAL;
}

/* Parse `str` into *bdf. Returns 0 or -EINVAL (with a message) for anything malformed. */
static inline int upcie_pci_bdf_parse(const char *str, struct upcie_pci_bdf *bdf)
{
	if (!upcie_pci_bdf_parse_quiet_(str, bdf))
		return 0;
	return UPCIE_FAIL(-EINVAL,
			  "pci: malformed PCI address '%s' (want DDDD:BB:DD.F or BB:DD.F, hex, "
			  "device <= 1f, function <= 7)",
			  str ? str : "(null)");
}

/* Format as "dddd:bb:dd.f". Returns the length (>= 0), or -ENOSPC when buf is too small. */
static inline int upcie_pci_bdf_format(const struct upcie_pci_bdf *bdf, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%04x:%02x:%02x.%x", bdf->domain, bdf->bus, bdf->dev, bdf->fn);

	if (n < 0 || (size_t)n >= len)
		return -ENOSPC;
	return n;
}

/* True when both name the same function. */
static inline bool upcie_pci_bdf_equal(const struct upcie_pci_bdf *a, const struct upcie_pci_bdf *b)
{
	return a->domain == b->domain && a->bus == b->bus && a->dev == b->dev && a->fn == b->fn;
}

/* Order by domain, bus, device, function: <0, 0, >0. */
static inline int upcie_pci_bdf_cmp(const struct upcie_pci_bdf *a, const struct upcie_pci_bdf *b)
{
	uint64_t ka =
	    ((uint64_t)a->domain << 16) | ((uint32_t)a->bus << 8) | ((uint32_t)a->dev << 3) | a->fn;
	uint64_t kb =
	    ((uint64_t)b->domain << 16) | ((uint32_t)b->bus << 8) | ((uint32_t)b->dev << 3) | b->fn;

	return ka < kb ? -1 : ka > kb;
}

#endif /* UPCIE_PCI_BDF_H */
