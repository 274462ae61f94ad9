/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Logging: every error a upcie function returns is also described here, in words.
 *
 * Messages go to a handler (default: stderr, prefixed "upcie: "). The level comes from the
 * environment variable UPCIE_LOG (none, error, warn, info, debug, or 0-4) the first time a message
 * is considered, or from upcie_log_set_level(). The configuration is one program-wide object
 * (a weak definition shared by all translation units); set handler and level before starting
 * threads that log. The handler may be called from any thread and must be thread-safe itself.
 */
#ifndef UPCIE_BASE_LOG_H
#define UPCIE_BASE_LOG_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/compiler.h>

enum upcie_log_level {
	UPCIE_LOG_NONE = 0,
	UPCIE_LOG_ERROR = 1,
	UPCIE_LOG_WARN = 2,
	UPCIE_LOG_INFO = 3,
	UPCIE_LOG_DEBUG = 4,
};

typedef void (*upcie_log_handler_fn)(enum upcie_log_level level, const char *msg, void *ctx);

struct upcie_log_config {
	int level; /* -1: not yet read from the environment */
	upcie_log_handler_fn handler;
	void *ctx;
};

UPCIE_WEAK struct upcie_log_config upcie_log_config_g = { -1, NULL, NULL };

/* Parse a level name or digit; returns -EINVAL for anything else. */
static inline int upcie_log_level_parse(const char *s)
{
	static const char *const names[] = { "none", "error", "warn", "info", "debug" };

	if (!s || !*s)
		return -EINVAL;
	if (s[0] >= '0' && s[0] <= '4' && s[1] == '\0')
		return s[0] - '0';
	for (unsigned i = 0; i < UPCIE_ARRAY_SIZE(names); i++)
		if (!strcmp(s, names[i]))
			return (int)i;
	return -EINVAL;
}

/*
 * The current level: the one set, else UPCIE_LOG from the environment (a name or digit) at the
 * first call, else UPCIE_LOG_ERROR.
 */
static inline int upcie_log_level(void)
{
	if (upcie_log_config_g.level < 0) {
		int lvl = upcie_log_level_parse(getenv("UPCIE_LOG"));

		upcie_log_config_g.level = lvl < 0 ? UPCIE_LOG_ERROR : lvl;
	}
	return upcie_log_config_g.level;
}

/* Set the level for the whole process, overriding UPCIE_LOG; messages above it are dropped. */
static inline void upcie_log_set_level(enum upcie_log_level level)
{
	upcie_log_config_g.level = (int)level;
}

/* NULL restores the default stderr handler. */
static inline void upcie_log_set_handler(upcie_log_handler_fn handler, void *ctx)
{
	upcie_log_config_g.handler = handler;
	upcie_log_config_g.ctx = ctx;
}

/*
 * Hand one message to the handler (or stderr) when `level` is enabled, formatted into a
 * 512-byte buffer on the stack (not the heap: error paths log too) and cut there.
 */
static inline void upcie_logv(enum upcie_log_level level, const char *fmt, va_list ap)
{
	char msg[512];
	static const char *const tags[] = { "", "error", "warn", "info", "debug" };

	if ((int)level > upcie_log_level() || level == UPCIE_LOG_NONE)
		return;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	if (upcie_log_config_g.handler) {
		upcie_log_config_g.handler(level, msg, upcie_log_config_g.ctx);
		return;
	}
	fprintf(stderr, "upcie: %s: %s\n", tags[level], msg);
}

/* printf-style upcie_logv(); UPCIE_LOG() and UPCIE_FAIL() are the usual ways in. */
UPCIE_PRINTF(2, 3) static inline void upcie_log(enum upcie_log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	upcie_logv(level, fmt, ap);
	va_end(ap);
}

/* Symbolic name of an errno value ("EINVAL"), or "E?" for one not listed. */
static inline const char *upcie_errno_name(int err)
{
	if (err < 0)
		err = -err;
	switch (err) {
	case EPERM:
		return "EPERM";
	case ENOENT:
		return "ENOENT";
	case EIO:
		return "EIO";
	case ENXIO:
		return "ENXIO";
	case E2BIG:
		return "E2BIG";
	case EBADF:
		return "EBADF";
	case EAGAIN:
		return "EAGAIN";
	case ENOMEM:
		return "ENOMEM";
	case EACCES:
		return "EACCES";
	case EFAULT:
		return "EFAULT";
	case EBUSY:
		return "EBUSY";
	case EEXIST:
		return "EEXIST";
	case ENODEV:
		return "ENODEV";
	case ENOTDIR:
		return "ENOTDIR";
	case EINVAL:
		return "EINVAL";
	case ENOSPC:
		return "ENOSPC";
	case ERANGE:
		return "ERANGE";
	case ENOSYS:
		return "ENOSYS";
	case ENOTTY:
		return "ENOTTY";
	case EOVERFLOW:
		return "EOVERFLOW";
	case ETIMEDOUT:
		return "ETIMEDOUT";
	case ECANCELED:
		return "ECANCELED";
	case EOPNOTSUPP:
		return "EOPNOTSUPP";
	case EPROTO:
		return "EPROTO";
	case EMSGSIZE:
		return "EMSGSIZE";
	case ENOBUFS:
		return "ENOBUFS";
	default:
		return "E?";
	}
}

#define UPCIE_ERR(fmt, ...)  upcie_log(UPCIE_LOG_ERROR, fmt, ##__VA_ARGS__)
#define UPCIE_WARN(fmt, ...) upcie_log(UPCIE_LOG_WARN, fmt, ##__VA_ARGS__)
#define UPCIE_INFO(fmt, ...) upcie_log(UPCIE_LOG_INFO, fmt, ##__VA_ARGS__)
#define UPCIE_DBG(fmt, ...)  upcie_log(UPCIE_LOG_DEBUG, fmt, ##__VA_ARGS__)

/* Log an error and evaluate to `err` (a negative errno): `return UPCIE_FAIL(-EINVAL, "...");` */
#define UPCIE_FAIL(err, fmt, ...) (UPCIE_ERR(fmt, ##__VA_ARGS__), (err))

/*
 * The current errno as a negative value, never 0 (a failed call that left errno 0 gives -EIO).
 * errno is read once: read twice (it is a function call's lvalue), the compiler cannot prove
 * the result non-zero, and gcc then warns at -O1 that a caller's out-parameter "may be used
 * uninitialized" on the path where an error looked like success.
 */
static inline int upcie_neg_errno(void)
{
	int e = errno;

	return e > 0 ? -e : -EIO;
}

#endif /* UPCIE_BASE_LOG_H */
