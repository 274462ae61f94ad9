/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Small sysfs/procfs file helpers: read a value, write a value, with errors as -errno.
 *
 * Paths are built under upcie_sysfs_root(): "/sys" unless the environment variable
 * UPCIE_SYSFS_ROOT names another directory (unit tests point it at a fake tree). The helpers do
 * not log: callers know what a missing file means and say so.
 */
#ifndef UPCIE_BASE_SYSFS_H
#define UPCIE_BASE_SYSFS_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <upcie/base/compiler.h>

/* Root of the sysfs tree: $UPCIE_SYSFS_ROOT, or "/sys". */
static inline const char *upcie_sysfs_root(void)
{
	const char *root = getenv("UPCIE_SYSFS_ROOT");

	return (root && *root) ? root : "/sys";
}

/* snprintf into buf of len; -ENAMETOOLONG when it does not fit. */
UPCIE_PRINTF(3, 4) static inline int upcie_path_fmt(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	return 0;
}

/*
 * Read the whole (small) file at `path` into buf as a NUL-terminated string with trailing
 * whitespace removed. Returns the length (>= 0) or -errno.
 */
static inline int upcie_file_read_str(const char *path, char *buf, size_t len)
{
	ssize_t n;
	int fd;

	if (!len)
		return -EINVAL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, len - 1);
	if (n < 0) {
		int err = -errno;

		close(fd);
		return err;
	}
	close(fd);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
		n--;
	buf[n] = '\0';
	return (int)n;
}

/* Base for a sysfs number: hex with a 0x prefix, decimal otherwise (never octal). */
static inline int upcie_num_base_(const char *s)
{
	if (*s == '-')
		s++;
	return (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) ? 16 : 10;
}

/* Read an unsigned integer (decimal, or hex with 0x) from `path`. */
static inline int upcie_file_read_u64(const char *path, uint64_t *val)
{
	char buf[64], *end;
	int n = upcie_file_read_str(path, buf, sizeof(buf));

	if (n < 0)
		return n;
	if (n == 0 || buf[0] == '-' || buf[0] == '+' || buf[0] == ' ')
		return -EINVAL;
	errno = 0;
	*val = strtoull(buf, &end, upcie_num_base_(buf));
	if (errno || *end)
		return -EINVAL;
	return 0;
}

/* Read a signed integer (e.g. numa_node, which may be -1) from `path`. */
static inline int upcie_file_read_s64(const char *path, int64_t *val)
{
	char buf[64], *end;
	int n = upcie_file_read_str(path, buf, sizeof(buf));

	if (n < 0)
		return n;
	if (n == 0)
		return -EINVAL;
	errno = 0;
	*val = strtoll(buf, &end, upcie_num_base_(buf));
	if (errno || *end)
		return -EINVAL;
	return 0;
}

/*
 * Write `str` to `path` in one write(2), as sysfs attributes expect. O_TRUNC is a no-op on sysfs
 * and keeps a regular file (a fake tree in tests) holding exactly the value written.
 */
static inline int upcie_file_write_str(const char *path, const char *str)
{
	size_t len = strlen(str);
	ssize_t n;
	int fd, err = 0;

	fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = write(fd, str, len);
	if (n < 0)
		err = -errno;
	else if ((size_t)n != len)
		err = -EIO;
	if (close(fd) && !err)
		err = -errno;
	return err;
}

#endif /* UPCIE_BASE_SYSFS_H */
