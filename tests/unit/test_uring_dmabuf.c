/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests for uring/ring.h and uring/dmabuf.h on the running kernel: the ring moves real I/O
 * (reads of a file, checked byte for byte); the dma-buf probe agrees with a second, independent
 * question to the kernel and leaves the caller's ring alone; the table refuses what it must
 * before the kernel sees it (slots, IOPOLL, targets, ranges, a full SQ, unregistering with I/O
 * in flight) and accounts in-flight I/O through real completions; spurious -EAGAIN results are
 * injected into a ring of the test's own memory. The dma-buf I/O itself needs
 * a kernel with the series: the guest case uring_dmabuf on configuration U.
 */
#include <upcie/uring/dmabuf.h>
#include <upcie/uring/ring.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "check.h"

static int tmpfile_with_pattern(size_t len, unsigned char **pat)
{
	char path[] = "/tmp/upcie-uring-XXXXXX";
	int fd = mkstemp(path);

	if (fd < 0)
		return -1;
	unlink(path);
	*pat = malloc(len);
	for (size_t i = 0; i < len; i++)
		(*pat)[i] = (unsigned char)(i * 7 + (i >> 9) + 1);
	if (write(fd, *pat, len) != (ssize_t)len) {
		close(fd);
		return -1;
	}
	return fd;
}

static void test_ring(void)
{
	struct upcie_uring r;
	unsigned char *pat = NULL, buf[3][4096];
	int fd = tmpfile_with_pattern(3 * 4096, &pat), got = 0, ok = 1;

	CHECK(fd >= 0, "a 12 KiB pattern file");
	CHECK_EQ(upcie_uring_init(&r, 0, 0), -EINVAL, "0 entries: -EINVAL");
	CHECK_EQ(r.fd, -1, "a failed init leaves the ring closed");
	CHECK_EQ(upcie_uring_init(&r, 4, IORING_SETUP_SQPOLL), -EINVAL, "SQPOLL refused: -EINVAL");
	CHECK_EQ(upcie_uring_init(&r, 4, 0), 0, "a ring of 4 entries");
	CHECK(r.sq_entries == 4 && r.cq_entries >= 4, "SQ %u, CQ %u entries", r.sq_entries,
	      r.cq_entries);
	for (int i = 0; i < 3; i++) {
		struct io_uring_sqe *sqe = upcie_uring_sqe(&r);

		if (!sqe) {
			ok = 0;
			break;
		}
		sqe->opcode = IORING_OP_READ;
		sqe->fd = fd;
		sqe->addr = (uint64_t)(uintptr_t)buf[2 - i];
		sqe->len = 4096;
		sqe->off = (uint64_t)i * 4096;
		sqe->user_data = 100 + i;
	}
	CHECK(ok, "three SQEs handed out");
	CHECK_EQ(upcie_uring_sq_pending(&r), 3, "three pending before submit");
	CHECK_EQ(upcie_uring_submit(&r, 3), 3, "submit takes three and waits for them");
	for (int i = 0; i < 3; i++) {
		struct io_uring_cqe *cqe = upcie_uring_cqe_peek(&r);

		if (!cqe)
			break;
		if (cqe->res == 4096 && cqe->user_data >= 100 && cqe->user_data < 103)
			got++;
		upcie_uring_cqe_seen(&r);
	}
	CHECK_EQ(got, 3, "three CQEs of 4096 bytes with the caller's user_data");
	CHECK(upcie_uring_cqe_peek(&r) == NULL, "nothing more in the CQ");
	CHECK(pat && !memcmp(buf[2], pat, 4096) && !memcmp(buf[1], pat + 4096, 4096) &&
		  !memcmp(buf[0], pat + 8192, 4096),
	      "the bytes read are the file's, each block where its SQE said");
	/* a full SQ hands out nothing */
	for (int i = 0; i < 4; i++)
		upcie_uring_sqe(&r)->opcode = IORING_OP_NOP;
	CHECK(upcie_uring_sqe(&r) == NULL, "a full SQ hands out no fifth SQE");
	CHECK_EQ(upcie_uring_submit(&r, 4), 4, "the four NOPs go");
	got = 0;
	while (upcie_uring_cqe_peek(&r)) {
		got++;
		upcie_uring_cqe_seen(&r);
	}
	CHECK_EQ(got, 4, "and complete");
	upcie_uring_fini(&r);
	CHECK_EQ(r.fd, -1, "fini closes");
	upcie_uring_fini(&r);
	CHECK(1, "a second fini is harmless");
	free(pat);
	if (fd >= 0)
		close(fd);
}

/*
 * A second question, asked differently from the probe: with EXTENDED descriptors, an EMPTY
 * descriptor into a sparse table is accepted (1) by a kernel with the series and refused
 * (-EINVAL, the flags were reserved) by one without.
 */
static int kernel_has_extended(void)
{
	struct upcie_uring r;
	struct io_uring_rsrc_register reg;
	struct io_uring_rsrc_update2 up;
	struct upcie_uring_regbuf_desc d;
	int ret;

	if (upcie_uring_init(&r, 1, 0))
		return -1;
	memset(&reg, 0, sizeof(reg));
	reg.nr = 2;
	reg.flags = IORING_RSRC_REGISTER_SPARSE;
	ret = upcie_uring_register_raw(r.fd, IORING_REGISTER_BUFFERS2, &reg, sizeof(reg));
	if (ret < 0) {
		upcie_uring_fini(&r);
		return 0;
	}
	memset(&d, 0, sizeof(d));
	memset(&up, 0, sizeof(up));
	up.offset = 1;
	up.resv = UPCIE_URING_RSRC_UPDATE_EXTENDED;
	up.data = (uint64_t)(uintptr_t)&d;
	up.nr = 1;
	ret = upcie_uring_register_raw(r.fd, IORING_REGISTER_BUFFERS_UPDATE, &up, sizeof(up));
	upcie_uring_fini(&r);
	return ret == 1;
}

static void test_probe(void)
{
	struct upcie_uring r;
	struct io_uring_rsrc_register reg;
	struct utsname u;
	int has = kernel_has_extended(), p, ret;

	uname(&u);
	CHECK(has >= 0, "a ring for the second question");
	CHECK_EQ(upcie_uring_init(&r, 2, 0), 0, "the caller's ring");
	memset(&reg, 0, sizeof(reg));
	reg.nr = 4;
	reg.flags = IORING_RSRC_REGISTER_SPARSE;
	CHECK_EQ(upcie_uring_register_raw(r.fd, IORING_REGISTER_BUFFERS2, &reg, sizeof(reg)), 0,
		 "the caller's ring gets a sparse table of 4");
	p = upcie_uring_dmabuf_probe();
	CHECK(p == 0 || p == -EOPNOTSUPP, "the probe answers 0 or -EOPNOTSUPP (%d) on %s", p,
	      u.release);
	CHECK_EQ(p == 0, has == 1,
		 "the probe (%s) agrees with the EXTENDED question (%s) on kernel %s",
		 p ? "unsupported" : "supported", has == 1 ? "accepted" : "refused", u.release);
	CHECK_EQ(upcie_uring_dmabuf_probe(), p, "asked again: the same answer");
	ret = upcie_uring_register_raw(r.fd, IORING_REGISTER_BUFFERS2, &reg, sizeof(reg));
	CHECK_EQ(ret, -EBUSY, "the caller's ring still has its table after the probe");
	CHECK_EQ(upcie_uring_register_raw(r.fd, IORING_UNREGISTER_BUFFERS, NULL, 0), 0,
		 "and can drop it");
	if (p) {
		struct upcie_uring_dmabufs t;

		CHECK_EQ(upcie_uring_dmabufs_init(&t, &r, 4), -EOPNOTSUPP,
			 "table init on this kernel: -EOPNOTSUPP");
		CHECK_EQ(
		    upcie_uring_register_raw(r.fd, IORING_REGISTER_BUFFERS2, &reg, sizeof(reg)), 0,
		    "and the refused init left no table on the ring");
		upcie_uring_register_raw(r.fd, IORING_UNREGISTER_BUFFERS, NULL, 0);
	} else {
		CHECK_SKIP("table init refusal: this kernel has the series");
		CHECK_SKIP("no table left behind: this kernel has the series");
	}
	upcie_uring_fini(&r);
}

/*
 * The table's own checks, on a table set up by hand so that they run on any kernel (the
 * kernel's answers are the guest case's). Slot 0 pretends to hold a 1 MiB dma-buf for `fd`.
 */
static void test_table_checks(void)
{
	struct upcie_uring r, rp;
	struct upcie_uring_dmabufs t;
	struct upcie_uring_dmabuf_io io, io2, *done[4];
	unsigned char *pat = NULL;
	unsigned slot = 99;
	int fd = tmpfile_with_pattern(8192, &pat), n;

	CHECK_EQ(upcie_uring_init(&r, 2, 0), 0, "a ring of 2");
	CHECK_EQ(upcie_uring_dmabufs_init(&t, &r, 0), -EINVAL, "0 slots: -EINVAL");
	CHECK_EQ(upcie_uring_dmabufs_init(&t, &r, 257), -EINVAL, "257 slots: -EINVAL");
	CHECK_EQ(upcie_uring_init(&rp, 2, IORING_SETUP_IOPOLL), 0, "an IOPOLL ring");
	CHECK_EQ(upcie_uring_dmabufs_init(&t, &rp, 4), -EINVAL,
		 "a table on an IOPOLL ring: -EINVAL");
	upcie_uring_fini(&rp);

	memset(&t, 0, sizeof(t));
	t.ring = &r;
	t.nslots = 4;
	for (unsigned i = 0; i < 4; i++)
		t.slot[i].target_fd = -1;
	CHECK_EQ(upcie_uring_dmabuf_register(&t, 0, fd, &slot), -ENOTBLK,
		 "a regular file as target: -ENOTBLK");
	CHECK_EQ(upcie_uring_dmabuf_register(&t, -1, fd, &slot), -EBADF, "dma-buf -1: -EBADF");
	CHECK_EQ(slot, 99, "a refused register names no slot");
	CHECK_EQ(upcie_uring_dmabuf_unregister(&t, 0), -ENOENT,
		 "unregister of an empty slot: -ENOENT");
	CHECK_EQ(upcie_uring_dmabuf_unregister(&t, 7), -ENOENT,
		 "unregister past the table: -ENOENT");

	t.slot[0].size = 1 << 20;
	t.slot[0].target_fd = fd;
	t.used = 1;
	memset(&io, 0, sizeof(io));
	io.slot = 1;
	io.len = 4096;
	CHECK_EQ(upcie_uring_dmabuf_queue(&t, &io), -ENOENT, "I/O on an empty slot: -ENOENT");
	io.slot = 0;
	io.len = 0;
	CHECK_EQ(upcie_uring_dmabuf_queue(&t, &io), -EINVAL, "no length: -EINVAL");
	io.len = 4096;
	io.buf_off = (1 << 20) - 2048;
	CHECK_EQ(upcie_uring_dmabuf_queue(&t, &io), -EINVAL, "past the dma-buf's end: -EINVAL");
	io.buf_off = UINT64_MAX - 100;
	CHECK_EQ(upcie_uring_dmabuf_queue(&t, &io), -EINVAL, "an offset that wraps: -EINVAL");
	io.buf_off = 0;
	io.op = 2;
	CHECK_EQ(upcie_uring_dmabuf_queue(&t, &io), -EINVAL, "an unknown op: -EINVAL");
	io.op = UPCIE_URING_DMABUF_READ;
	CHECK_EQ(upcie_uring_sq_pending(&r), 0, "nothing queued by the refusals");

	io2 = io;
	io2.buf_off = 4096;
	io2.file_off = 4096;
	CHECK_EQ(upcie_uring_dmabuf_queue(&t, &io), 0, "an I/O queued");
	CHECK_EQ(upcie_uring_dmabuf_queue(&t, &io2), 0, "a second I/O queued");
	CHECK_EQ(upcie_uring_dmabuf_queue(&t, &io2), -EBUSY, "a third on a 2-entry SQ: -EBUSY");
	CHECK_EQ(upcie_uring_dmabuf_inflight(&t, 0), 2, "two in flight on slot 0");
	CHECK_EQ(upcie_uring_dmabuf_unregister(&t, 0), -EBUSY,
		 "unregister with I/O in flight: -EBUSY");
	CHECK_EQ(upcie_uring_dmabufs_fini(&t), -EBUSY, "table fini with I/O in flight: -EBUSY");
	CHECK(t.ring == &r && t.slot[0].size == 1 << 20, "the refusals changed nothing");
	/* the ring has no buffer table: the kernel ends both with an error, which reap hands back
	 * and which ends their flight */
	CHECK_EQ(upcie_uring_submit(&r, 0), 2, "both submitted");
	n = upcie_uring_dmabuf_reap(&t, done, 4, 2);
	CHECK_EQ(n, 2, "reap waits for both");
	CHECK(n == 2 && done[0]->res < 0 && done[1]->res < 0 && done[0] != done[1] &&
		  (done[0] == &io || done[0] == &io2),
	      "each comes back once, with the kernel's error (%d, %d)", n > 0 ? done[0]->res : 0,
	      n > 1 ? done[1]->res : 0);
	CHECK_EQ(upcie_uring_dmabuf_inflight(&t, 0), 0, "nothing in flight after the reap");
	CHECK_EQ(t.inflight, 0, "the table's count is back to 0");
	CHECK_EQ(upcie_uring_dmabuf_reap(&t, done, 4, 0), 0, "a reap with nothing there: 0");
	CHECK_EQ(upcie_uring_dmabuf_reap(&t, done, 1, 2), -EINVAL, "min above max: -EINVAL");
	upcie_uring_fini(&r);
	free(pat);
	if (fd >= 0)
		close(fd);
}

/*
 * Spurious -EAGAIN, injected: a ring whose CQ and SQ are this test's memory (the descriptor is a
 * real, idle ring, so the submit the reap makes finds nothing to take). Each -EAGAIN CQE of an
 * I/O must come back as the same SQE again, not as a result, up to
 * UPCIE_URING_DMABUF_REISSUE_MAX times; then, or when the SQ has no free entry, the I/O ends
 * with -EAGAIN.
 */
static void test_reissue(void)
{
	static struct io_uring_sqe sqes[4];
	static struct io_uring_cqe cqes[8];
	static unsigned sq_array[4];
	unsigned sq_head = 0, sq_tail = 0, cq_head = 0, cq_tail = 0, k, same = 1;
	struct upcie_uring real, r;
	struct upcie_uring_dmabufs t;
	struct upcie_uring_dmabuf_io io, *done[2];
	int n, fd = open("/dev/null", O_RDWR);

	CHECK_EQ(upcie_uring_init(&real, 2, 0), 0, "an idle ring for the descriptor");
	memset(&r, 0, sizeof(r));
	r.fd = real.fd;
	r.sq_entries = 4;
	r.cq_entries = 8;
	r.sqes = sqes;
	r.sq_head = &sq_head;
	r.sq_tail = &sq_tail;
	r.sq_mask = 3;
	r.sq_array = sq_array;
	r.cq_head = &cq_head;
	r.cq_tail = &cq_tail;
	r.cq_mask = 7;
	r.cqes = cqes;
	memset(&t, 0, sizeof(t));
	t.ring = &r;
	t.nslots = 2;
	t.slot[1].size = 1 << 20;
	t.slot[1].target_fd = fd;
	t.used = 1;
	memset(&io, 0, sizeof(io));
	io.slot = 1;
	io.op = UPCIE_URING_DMABUF_WRITE;
	io.buf_off = 8192;
	io.file_off = 4096;
	io.len = 4096;
	CHECK_EQ(upcie_uring_dmabuf_queue(&t, &io), 0, "an I/O queued on the injected ring");
	sq_head = r.sq_local_tail; /* "the kernel took it" */
	for (k = 0; k < UPCIE_URING_DMABUF_REISSUE_MAX; k++) {
		struct io_uring_sqe *q;

		cqes[cq_tail & 7].user_data = (uint64_t)(uintptr_t)&io;
		cqes[cq_tail & 7].res = -EAGAIN;
		cq_tail++;
		n = upcie_uring_dmabuf_reap(&t, done, 2, 0);
		q = &sqes[(r.sq_local_tail - 1) & 3];
		if (n != 0 || io.reissued != k + 1 || q->opcode != IORING_OP_WRITE_FIXED ||
		    q->fd != fd || q->addr != 8192 || q->len != 4096 || q->off != 4096 ||
		    q->buf_index != 1 || q->user_data != (uint64_t)(uintptr_t)&io)
			same = 0;
		sq_head = r.sq_local_tail;
	}
	CHECK(same, "%u spurious -EAGAIN: each issued again as the same SQE, none returned",
	      UPCIE_URING_DMABUF_REISSUE_MAX);
	CHECK(t.reissued == UPCIE_URING_DMABUF_REISSUE_MAX && t.inflight == 1 &&
		  t.slot[1].inflight == 1,
	      "counted (%" PRIu64 "), the I/O still in flight", t.reissued);
	cqes[cq_tail & 7].user_data = (uint64_t)(uintptr_t)&io;
	cqes[cq_tail & 7].res = -EAGAIN;
	cq_tail++;
	n = upcie_uring_dmabuf_reap(&t, done, 2, 0);
	CHECK(n == 1 && done[0] == &io && io.res == -EAGAIN && t.inflight == 0,
	      "one more: the I/O ends with -EAGAIN (%d, %d)", n, io.res);

	/* a full SQ: no entry to issue it again, so it ends */
	CHECK_EQ(upcie_uring_dmabuf_queue(&t, &io), 0, "queued again");
	sq_head = r.sq_local_tail;
	for (k = 0; k < 4; k++)
		upcie_uring_sqe(&r); /* four SQEs handed out, none taken */
	cqes[cq_tail & 7].user_data = (uint64_t)(uintptr_t)&io;
	cqes[cq_tail & 7].res = -EAGAIN;
	cq_tail++;
	n = upcie_uring_dmabuf_reap(&t, done, 2, 0);
	CHECK(n == 1 && io.res == -EAGAIN && io.reissued == 0 && t.inflight == 0,
	      "-EAGAIN with the SQ full: ends with -EAGAIN, not lost (%d, %d)", n, io.res);
	upcie_uring_fini(&real);
	close(fd);
}

static void test_nvme_bdf(void)
{
	struct upcie_pci_bdf bdf;
	int fd = open("/dev/null", O_RDONLY);

	CHECK_EQ(upcie_uring_nvme_bdf(fd, &bdf), -ENOTBLK, "a character device: -ENOTBLK");
	close(fd);
	CHECK_EQ(upcie_uring_nvme_bdf(-1, &bdf), -EBADF, "descriptor -1: -EBADF");
}

int main(void)
{
	upcie_log_set_level(UPCIE_LOG_NONE);
	test_ring();
	test_probe();
	test_table_checks();
	test_reissue();
	test_nvme_bdf();
	return check_done();
}
