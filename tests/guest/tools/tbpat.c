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
 *   tbpat byte  FILE OFFSET LEN BYTE       check that FILE bytes [OFFSET, OFFSET+LEN) all
 *                                          hold BYTE
 *   tbpat pi    FILE LBS MDOFF LBA COUNT   check the protection information (8 bytes per
 *                                          block, metadata of block n at MDOFF + 8n, as QEMU
 *                                          keeps a namespace with 8 bytes of metadata) of
 *                                          blocks [LBA, LBA+COUNT) of LBS bytes: guard = the
 *                                          T10 DIF CRC-16 of the block's data, application
 *                                          tag 0, reference tag = the LBA (type 1)
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

static int cmd_byte(const char *path, uint64_t off, uint64_t len, uint64_t byte)
{
	unsigned char buf[4096];
	int fd = open(path, O_RDONLY);

	if (fd < 0)
		die("cannot open %s", path);
	for (uint64_t done = 0; done < len;) {
		uint64_t n = len - done < sizeof(buf) ? len - done : sizeof(buf);

		if (read_full(fd, buf, n, off + done, 0) != (ssize_t)n)
			die("short read from %s", path);
		for (uint64_t k = 0; k < n; k++)
			if (buf[k] != (unsigned char)byte) {
				fprintf(stderr,
					"tbpat: %s: byte 0x%02x at offset 0x%" PRIx64
					", want 0x%02x\n",
					path, buf[k], off + done + k, (unsigned)(byte & 0xff));
				close(fd);
				return 1;
			}
		done += n;
	}
	close(fd);
	return 0;
}

/* CRC-16 of the T10 DIF guard: polynomial 0x8bb7, initial value 0, not reflected. */
static uint16_t crc16_t10(const unsigned char *p, size_t len)
{
	uint16_t crc = 0;

	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)(p[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x8bb7 : crc << 1);
	}
	return crc;
}

static int cmd_pi(const char *path, uint64_t lbs, uint64_t mdoff, uint64_t lba, uint64_t count)
{
	unsigned char *blk = malloc(lbs), pi[8];
	int fd = open(path, O_RDONLY);

	if (fd < 0 || !blk)
		die("cannot open %s", path);
	for (uint64_t n = lba; n < lba + count; n++) {
		uint16_t guard, want;
		uint32_t ref;

		if (read_full(fd, blk, lbs, n * lbs, 0) != (ssize_t)lbs ||
		    read_full(fd, pi, 8, mdoff + 8 * n, 0) != 8)
			die("short read from %s", path);
		guard = (uint16_t)(pi[0] << 8 | pi[1]);
		want = crc16_t10(blk, lbs);
		ref = (uint32_t)pi[4] << 24 | (uint32_t)pi[5] << 16 | (uint32_t)pi[6] << 8 | pi[7];
		if (guard != want || pi[2] || pi[3] || ref != (uint32_t)n) {
			fprintf(stderr,
				"tbpat: %s: block %" PRIu64 ": guard 0x%04x (data's CRC 0x%04x), "
				"application tag 0x%02x%02x, reference tag 0x%08x\n",
				path, n, guard, want, pi[2], pi[3], ref);
			free(blk);
			close(fd);
			return 1;
		}
	}
	free(blk);
	close(fd);
	return 0;
}

static void usage(void)
{
	fputs("usage: tbpat fill FILE SIZE TAG\n"
	      "       tbpat gen TAG OFFSET LEN\n"
	      "       tbpat check FILE TAG OFFSET LEN [AT]\n"
	      "       tbpat head FILE OFFSET\n"
	      "       tbpat byte FILE OFFSET LEN BYTE\n"
	      "       tbpat pi FILE LBS MDOFF LBA COUNT\n",
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
	if (!strcmp(argv[1], "byte") && argc == 6)
		return cmd_byte(argv[2], num(argv[3]), num(argv[4]), num(argv[5]));
	if (!strcmp(argv[1], "pi") && argc == 7)
		return cmd_pi(argv[2], num(argv[3]), num(argv[4]), num(argv[5]), num(argv[6]));
	usage();
	return 2;
}
