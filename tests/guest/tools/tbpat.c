// SPDX-License-Identifier: BSD-3-Clause
/*
 * tbpat: the test bed's data pattern, on the host and in the guest.
 *
 * Every byte of a backing file (namespace image, vram, pmr) is a function of
 * its byte offset and an 8-byte tag. The file is cut into 512-byte units; in
 * unit u (byte offset 512*u .. 512*u+511), byte i is:
 *
 *   i = 0..7    u as a little-endian 64-bit integer
 *   i = 8..15   the tag (8 ASCII bytes, NUL-padded when shorter)
 *   i = 16..511 (u + i) & 0xff
 *
 * The unit index does not depend on the namespace's LBA size: a 4 KiB LBA n
 * starts with unit 8n. The test bed's tags are "<name><nonce>", e.g.
 * "c0n13fa2" (name c0n1, per-boot nonce 3fa2).
 *
 * usage:
 *   tbpat fill  FILE SIZE TAG              create FILE (SIZE bytes) with the pattern
 *   tbpat gen   TAG OFFSET LEN             write the pattern for [OFFSET, OFFSET+LEN) to stdout
 *   tbpat check FILE TAG OFFSET LEN [AT]   compare FILE bytes [AT, AT+LEN) with the pattern
 *                                          for [OFFSET, OFFSET+LEN); AT defaults to OFFSET;
 *                                          FILE "-" reads LEN bytes from stdin
 *   tbpat head  FILE OFFSET                print unit index and tag found at OFFSET
 * Numbers take an optional K, M or G suffix (powers of 1024) or a 0x prefix.
 * Exit status: 0 match/success, 1 mismatch, 2 usage or I/O error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define UNIT  512u
#define CHUNK (1u << 20)

static void die(const char *fmt, const char *arg)
{
	fprintf(stderr, "tbpat: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n");
	exit(2);
}

static uint64_t num(const char *s)
{
	char *end;
	uint64_t v;

	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s)
		die("bad number '%s'", s);
	switch (*end) {
	case 'k':
	case 'K':
		v <<= 10;
		end++;
		break;
	case 'm':
	case 'M':
		v <<= 20;
		end++;
		break;
	case 'g':
	case 'G':
		v <<= 30;
		end++;
		break;
	default:
		break;
	}
	if (*end)
		die("bad number '%s'", s);
	return v;
}

static void tag8(const char *tag, unsigned char out[8])
{
	size_t n = strlen(tag);

	if (n > 8)
		die("tag '%s' is longer than 8 bytes", tag);
	memset(out, 0, 8);
	memcpy(out, tag, n);
}

static unsigned char pat_byte(const unsigned char tag[8], uint64_t off)
{
	uint64_t u = off / UNIT;
	unsigned i = (unsigned)(off % UNIT);

	if (i < 8)
		return (unsigned char)(u >> (8 * i));
	if (i < 16)
		return tag[i - 8];
	return (unsigned char)((u + i) & 0xff);
}

static void pat_fill(unsigned char *buf, size_t len, const unsigned char tag[8], uint64_t off)
{
	size_t k = 0;

	/* fast path for whole units */
	while (k < len) {
		uint64_t o = off + k;

		if (o % UNIT == 0 && len - k >= UNIT) {
			uint64_t u = o / UNIT;
			unsigned i;

			for (i = 0; i < 8; i++)
				buf[k + i] = (unsigned char)(u >> (8 * i));
			memcpy(buf + k + 8, tag, 8);
			for (i = 16; i < UNIT; i++)
				buf[k + i] = (unsigned char)((u + i) & 0xff);
			k += UNIT;
		} else {
			buf[k] = pat_byte(tag, o);
			k++;
		}
	}
}

static void write_all(int fd, const unsigned char *buf, size_t len, const char *what)
{
	while (len) {
		ssize_t n = write(fd, buf, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("write %s failed", what);
		}
		buf += n;
		len -= (size_t)n;
	}
}

static int cmd_fill(const char *path, uint64_t size, const char *tag)
{
	unsigned char t[8], *buf = malloc(CHUNK);
	uint64_t off = 0;
	int fd;

	tag8(tag, t);
	if (!buf)
		die("out of memory%s", "");
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		die("cannot create %s", path);
	while (off < size) {
		size_t n = size - off < CHUNK ? (size_t)(size - off) : CHUNK;

		pat_fill(buf, n, t, off);
		write_all(fd, buf, n, path);
		off += n;
	}
	if (fsync(fd) && errno != EINVAL)
		die("fsync %s failed", path);
	close(fd);
	free(buf);
	return 0;
}

static int cmd_gen(const char *tag, uint64_t off, uint64_t len)
{
	unsigned char t[8], *buf = malloc(CHUNK);

	tag8(tag, t);
	if (!buf)
		die("out of memory%s", "");
	while (len) {
		size_t n = len < CHUNK ? (size_t)len : CHUNK;

		pat_fill(buf, n, t, off);
		write_all(1, buf, n, "stdout");
		off += n;
		len -= n;
	}
	free(buf);
	return 0;
}

static ssize_t read_full(int fd, unsigned char *buf, size_t len, uint64_t at, int seq)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = seq ? read(fd, buf + got, len - got)
				: pread(fd, buf + got, len - got, (off_t)(at + got));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

static int cmd_check(const char *path, const char *tag, uint64_t off, uint64_t len, uint64_t at)
{
	unsigned char t[8], *buf = malloc(CHUNK), *want = malloc(CHUNK);
	int seq = strcmp(path, "-") == 0;
	int fd = seq ? 0 : open(path, O_RDONLY);
	uint64_t done = 0;

	tag8(tag, t);
	if (!buf || !want)
		die("out of memory%s", "");
	if (fd < 0)
		die("cannot open %s", path);
	while (done < len) {
		size_t n = len - done < CHUNK ? (size_t)(len - done) : CHUNK;
		ssize_t got = read_full(fd, buf, n, at + done, seq);
		size_t k;

		if (got < 0)
			die("read %s failed", path);
		pat_fill(want, n, t, off + done);
		for (k = 0; k < (size_t)got; k++) {
			if (buf[k] != want[k]) {
				uint64_t bad = off + done + k;
				uint64_t ustart = (at + done + k) - (bad % UNIT);
				uint64_t u = 0;
				char found[9] = { 0 };
				unsigned i;

				/* describe the unit header that is there instead, if we have it */
				if (ustart >= at + done &&
				    ustart + 16 <= at + done + (uint64_t)got) {
					const unsigned char *h = buf + (ustart - at - done);

					for (i = 0; i < 8; i++)
						u |= (uint64_t)h[i] << (8 * i);
					for (i = 0; i < 8; i++)
						found[i] = (h[8 + i] >= 0x20 && h[8 + i] < 0x7f)
							       ? (char)h[8 + i]
							       : '.';
					fprintf(
					    stderr,
					    "tbpat: %s: mismatch at pattern offset 0x%" PRIx64
					    " (file offset 0x%" PRIx64 "): got 0x%02x, want 0x%02x;"
					    " unit header there: unit=%" PRIu64 " tag='%s'\n",
					    path, bad, at + done + k, buf[k], want[k], u, found);
				} else {
					fprintf(stderr,
						"tbpat: %s: mismatch at pattern offset 0x%" PRIx64
						" (file offset 0x%" PRIx64
						"): got 0x%02x, want 0x%02x\n",
						path, bad, at + done + k, buf[k], want[k]);
				}
				return 1;
			}
		}
		if ((size_t)got < n) {
			fprintf(stderr, "tbpat: %s: short read: %" PRIu64 " of %" PRIu64 " bytes\n",
				path, done + (uint64_t)got, len);
			return 1;
		}
		done += n;
	}
	if (!seq)
		close(fd);
	free(buf);
	free(want);
	return 0;
}

static int cmd_head(const char *path, uint64_t off)
{
	unsigned char h[16];
	char tag[9] = { 0 };
	uint64_t u = 0;
	unsigned i;
	int fd = open(path, O_RDONLY);

	if (fd < 0)
		die("cannot open %s", path);
	if (read_full(fd, h, sizeof(h), off, 0) != (ssize_t)sizeof(h))
		die("short read from %s", path);
	for (i = 0; i < 8; i++)
		u |= (uint64_t)h[i] << (8 * i);
	for (i = 0; i < 8; i++)
		tag[i] = (h[8 + i] >= 0x20 && h[8 + i] < 0x7f) ? (char)h[8 + i] : '.';
	printf("unit=%" PRIu64 " tag=%s\n", u, tag);
	close(fd);
	return 0;
}

static void usage(void)
{
	fputs("usage: tbpat fill FILE SIZE TAG\n"
	      "       tbpat gen TAG OFFSET LEN\n"
	      "       tbpat check FILE TAG OFFSET LEN [AT]\n"
	      "       tbpat head FILE OFFSET\n",
	      stderr);
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc < 2)
		usage();
	if (!strcmp(argv[1], "fill") && argc == 5)
		return cmd_fill(argv[2], num(argv[3]), argv[4]);
	if (!strcmp(argv[1], "gen") && argc == 5)
		return cmd_gen(argv[2], num(argv[3]), num(argv[4]));
	if (!strcmp(argv[1], "check") && (argc == 6 || argc == 7))
		return cmd_check(argv[2], argv[3], num(argv[4]), num(argv[5]),
				 argc == 7 ? num(argv[6]) : num(argv[4]));
	if (!strcmp(argv[1], "head") && argc == 4)
		return cmd_head(argv[2], num(argv[3]));
	usage();
	return 2;
}
