/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What every probe in tools/ shares: the report format, the host facts a report starts with, and
 * the facts a dma-buf descriptor gives away about itself.
 *
 * Probes report rather than assert. They print what they found, one answer a line, and exit
 * PROBE_EXIT_OK whatever the answer; PROBE_EXIT_USAGE is a usage error and PROBE_EXIT_CANNOT means
 * the probe could not run at all (no runtime, no device to ask). upcie's own error messages, which
 * name the kernel a refused call needs, are routed into the report as indented "upcie:" lines.
 *
 * Compiles as C11 (the static guest builds, tests/guest/README.md) and as C++17 (nvcc, hipcc).
 * Tools only: not installed, not part of the library.
 */
#ifndef UPCIE_TOOLS_PROBE_COMMON_H
#define UPCIE_TOOLS_PROBE_COMMON_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/udmabuf.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <upcie/base/compiler.h>
#include <upcie/base/log.h>

#define PROBE_EXIT_OK	  0
#define PROBE_EXIT_CANNOT 1
#define PROBE_EXIT_USAGE  2

#define PROBE_KiB (UINT64_C(1) << 10)
#define PROBE_MiB (UINT64_C(1) << 20)
#define PROBE_GiB (UINT64_C(1) << 30)

/* One report line (a newline is added); flushed at once so that two processes writing to one
 * console, as the delegation probes do, interleave in the order things happened. */
UPCIE_PRINTF(1, 2) static inline void probe_say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

/* Copy a string, cut to fit (report text, never parsed again). */
static inline void probe_strcpy(char *dst, size_t len, const char *src)
{
	size_t n = strlen(src);

	if (!len)
		return;
	if (n >= len)
		n = len - 1;
	memcpy(dst, src, n);
	dst[n] = '\0';
}

/* Small rotating buffers for the formatting helpers, so that several fit in one probe_say(). */
static inline char *probe_buf_(void)
{
	static char bufs[8][96];
	static unsigned next;

	return bufs[next++ % 8];
}

/* "EOPNOTSUPP (Operation not supported)" for -EOPNOTSUPP or EOPNOTSUPP. */
static inline const char *probe_err(int err)
{
	char *b = probe_buf_();

	if (err < 0)
		err = -err;
	snprintf(b, 96, "%s (%s)", upcie_errno_name(err), strerror(err));
	return b;
}

/* A size the way people say it: "64 MiB", "3 MiB + 4 KiB", "128 B". */
static inline const char *probe_size(uint64_t n)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	char *b = probe_buf_();
	size_t len = 0;
	int u;

	if (!n) {
		snprintf(b, 96, "0 B");
		return b;
	}
	b[0] = '\0';
	for (u = 4; u >= 0 && len < 80; u--) {
		uint64_t part = (n >> (10 * u)) & 1023;

		if (u == 4)
			part = n >> 40;
		if (!part)
			continue;
		len += (size_t)snprintf(b + len, 96 - len, "%s%" PRIu64 " %s", len ? " + " : "",
					part, unit[u]);
	}
	return b;
}

/* The largest power of two dividing x (for "aligned to 2 MiB"); 0 for 0. */
static inline uint64_t probe_align_of(uint64_t x)
{
	return x & (~x + 1);
}

static inline void probe_log_handler_(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	probe_say("      upcie: %s", msg);
}

/* Value of a "Key:" line of /proc/self/status ("VmLck", "CapEff"), or "?" when absent. */
static inline const char *probe_status(const char *key)
{
	char line[256], *b = probe_buf_();
	size_t klen = strlen(key);
	FILE *f = fopen("/proc/self/status", "re");

	snprintf(b, 96, "?");
	if (!f)
		return b;
	while (fgets(line, sizeof(line), f)) {
		char *v = line + klen + 1;

		if (strncmp(line, key, klen) || line[klen] != ':')
			continue;
		while (*v == ' ' || *v == '\t')
			v++;
		v[strcspn(v, "\n")] = '\0';
		probe_strcpy(b, 96, v);
		break;
	}
	fclose(f);
	return b;
}

static inline const char *probe_rlim(rlim_t v)
{
	char *b = probe_buf_();

	if (v == RLIM_INFINITY)
		snprintf(b, 96, "unlimited");
	else
		snprintf(b, 96, "%s", probe_size((uint64_t)v));
	return b;
}

/*
 * Start a report: the probe's name and question, then the host facts every finding depends on
 * (date, kernel, who is asking). upcie's messages join the report from here on (level from
 * UPCIE_LOG, default warn).
 */
static inline void probe_begin(const char *name, const char *question)
{
	struct utsname u;
	char date[64] = "?";
	time_t now = time(NULL);
	struct tm tm;

	if (!getenv("UPCIE_LOG"))
		upcie_log_set_level(UPCIE_LOG_WARN);
	upcie_log_set_handler(probe_log_handler_, NULL);
	if (gmtime_r(&now, &tm))
		strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%SZ", &tm);
	if (uname(&u))
		memset(&u, 0, sizeof(u));
	probe_say("== %s: %s", name, question);
	probe_say("date:   %s", date);
	probe_say("kernel: %s %s (%s)", u.sysname, u.release, u.machine);
	probe_say("pid:    %d, uid %u, euid %u, CapEff %s", (int)getpid(), (unsigned)getuid(),
		  (unsigned)geteuid(), probe_status("CapEff"));
}

/*
 * Who this process is, as far as pinning and privilege go: ids, supplementary groups, effective
 * capabilities, the dumpable flag (a uid change clears it; an exec restores it), RLIMIT_MEMLOCK
 * and the locked/pinned memory the kernel charges to it.
 */
static inline void probe_self(const char *who)
{
	struct rlimit rl;
	int ngroups = getgroups(0, NULL);

	if (getrlimit(RLIMIT_MEMLOCK, &rl))
		rl.rlim_cur = rl.rlim_max = 0;
	probe_say("%s: pid %d uid %u gid %u, %d supplementary groups, CapEff %s, dumpable %d", who,
		  (int)getpid(), (unsigned)getuid(), (unsigned)getgid(), ngroups,
		  probe_status("CapEff"), prctl(PR_GET_DUMPABLE, 0, 0, 0, 0));
	probe_say("%s: RLIMIT_MEMLOCK %s (hard %s); VmLck %s, VmPin %s", who,
		  probe_rlim(rl.rlim_cur), probe_rlim(rl.rlim_max), probe_status("VmLck"),
		  probe_status("VmPin"));
}

/* Lower (or set) this process's RLIMIT_MEMLOCK, soft and hard. */
static inline int probe_memlock_set(uint64_t bytes)
{
	struct rlimit rl;

	rl.rlim_cur = rl.rlim_max = (rlim_t)bytes;
	if (setrlimit(RLIMIT_MEMLOCK, &rl))
		return -errno;
	return 0;
}

/*
 * What a dma-buf descriptor says about itself: its size (lseek to the end, which dma-bufs answer
 * with the size the exporter gave the buffer; -errno when refused) and its exporter's name, from
 * /proc/self/fdinfo ("" when the descriptor is not a dma-buf).
 */
static inline void probe_dmabuf_facts(int fd, int64_t *size, char *exporter, size_t len)
{
	char path[64], line[256];
	off_t end;
	FILE *f;

	end = lseek(fd, 0, SEEK_END);
	*size = end < 0 ? -(int64_t)errno : (int64_t)end;
	if (end >= 0)
		lseek(fd, 0, SEEK_SET);
	if (len)
		exporter[0] = '\0';
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = fopen(path, "re");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "exp_name:", 9)) {
			char *v = line + 9;

			while (*v == ' ' || *v == '\t')
				v++;
			v[strcspn(v, "\n")] = '\0';
			probe_strcpy(exporter, len, v);
			break;
		}
	}
	fclose(f);
}

/* A plain (shmem) memfd of `size` bytes, sealed against shrinking as udmabuf requires. */
static inline int probe_memfd(uint64_t size, int *fd)
{
	int f = memfd_create("upcie-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	*fd = -1;
	if (f < 0)
		return -errno;
	if (ftruncate(f, (off_t)size)) {
		int err = -errno;

		close(f);
		return err;
	}
	fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK);
	*fd = f;
	return 0;
}

/* A dma-buf from udmabuf over a sealed memfd. */
static inline int probe_udmabuf(uint64_t size, int *out)
{
	struct udmabuf_create cr;
	int dev, memfd, fd, err;

	*out = -1;
	dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	if (dev < 0)
		return -errno;
	err = probe_memfd(size, &memfd);
	if (err) {
		close(dev);
		return err;
	}
	memset(&cr, 0, sizeof(cr));
	cr.memfd = (uint32_t)memfd;
	cr.flags = UDMABUF_FLAGS_CLOEXEC;
	cr.offset = 0;
	cr.size = size;
	fd = ioctl(dev, UDMABUF_CREATE, &cr);
	err = fd < 0 ? -errno : 0;
	close(memfd);
	close(dev);
	*out = fd;
	return err;
}

#endif /* UPCIE_TOOLS_PROBE_COMMON_H */
