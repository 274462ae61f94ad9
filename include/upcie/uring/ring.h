/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A minimal io_uring: the rings of one io_uring instance, set up and driven with the raw system
 * calls (io_uring_setup, io_uring_enter, io_uring_register), for the fixed-buffer reads and
 * writes of uring/dmabuf.h. No liburing: the toolkit stays header-only with no library to link,
 * and no liburing release carries the dma-buf registration UAPI anyway. What it does: map the
 * SQ/CQ rings and the SQE array (one or two mappings, IORING_FEAT_SINGLE_MMAP), hand out zeroed
 * SQEs, publish them (release store of the SQ tail) and enter the kernel, peek and consume CQEs
 * (acquire load of the CQ tail). What it does not: SQPOLL, multishot, registered files, CQE32/SQE128
 * rings (refused), or any locking: one ring belongs to one thread at a time.
 *
 * Returns: 0 or a negative errno, or a count >= 0 where documented; every failure is also logged.
 */
#ifndef UPCIE_URING_RING_H
#define UPCIE_URING_RING_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/io_uring.h>

#include <upcie/base/log.h>

struct upcie_uring {
	int fd; /* -1 when closed */
	unsigned setup_flags;
	unsigned features;
	unsigned sq_entries;
	unsigned cq_entries;
	/* the mappings */
	void *sq_ring;
	size_t sq_ring_len;
	void *cq_ring; /* == sq_ring with IORING_FEAT_SINGLE_MMAP */
	size_t cq_ring_len;
	struct io_uring_sqe *sqes;
	size_t sqes_len;
	/* inside the rings */
	unsigned *sq_head;
	unsigned *sq_tail;
	unsigned sq_mask;
	unsigned *sq_array;
	unsigned *cq_head;
	unsigned *cq_tail;
	unsigned cq_mask;
	struct io_uring_cqe *cqes;
	/* SQEs handed out and not yet published to the kernel */
	unsigned sq_local_tail;
};

static inline int upcie_uring_sys_setup_(unsigned entries, struct io_uring_params *p)
{
	long r = syscall(__NR_io_uring_setup, entries, p);

	return r < 0 ? -errno : (int)r;
}

static inline int upcie_uring_sys_enter_(int fd, unsigned to_submit, unsigned min_complete,
					 unsigned flags)
{
	long r = syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, NULL, (size_t)0);

	return r < 0 ? -errno : (int)r;
}

/* io_uring_register(2) on ring fd `fd`: its result (>= 0) or -errno. Logs nothing. */
static inline int upcie_uring_register_raw(int fd, unsigned opcode, const void *arg, unsigned nr)
{
	long r = syscall(__NR_io_uring_register, fd, opcode, arg, nr);

	return r < 0 ? -errno : (int)r;
}

/* Unmap and close; safe on a zeroed or half-set-up ring and more than once. */
static inline void upcie_uring_fini(struct upcie_uring *r)
{
	if (!r)
		return;
	if (r->sqes && r->sqes != MAP_FAILED)
		munmap(r->sqes, r->sqes_len);
	if (r->cq_ring && r->cq_ring != MAP_FAILED && r->cq_ring != r->sq_ring)
		munmap(r->cq_ring, r->cq_ring_len);
	if (r->sq_ring && r->sq_ring != MAP_FAILED)
		munmap(r->sq_ring, r->sq_ring_len);
	if (r->fd >= 0)
		close(r->fd);
	memset(r, 0, sizeof(*r));
	r->fd = -1;
}

/*
 * Set up a ring of `entries` SQ entries (1..32768; the kernel rounds up to a power of two).
 * flags: IORING_SETUP_* the caller wants; SQPOLL, SQE128 and CQE32 are refused (-EINVAL), as
 * this ring does not drive them. -ENOSYS (or -EPERM under io_uring_disabled) where the kernel
 * has no io_uring for this process.
 */
static inline int upcie_uring_init(struct upcie_uring *r, unsigned entries, unsigned flags)
{
	struct io_uring_params p;
	void *m;
	int fd, err;

	if (!r)
		return UPCIE_FAIL(-EINVAL, "uring: init needs a ring");
	memset(r, 0, sizeof(*r));
	r->fd = -1;
	if (!entries || entries > 32768)
		return UPCIE_FAIL(-EINVAL, "uring: %u entries (1..32768)", entries);
	if (flags & (IORING_SETUP_SQPOLL | (1U << 10) /* SQE128 */ | (1U << 11) /* CQE32 */))
		return UPCIE_FAIL(-EINVAL,
				  "uring: setup flags 0x%x: SQPOLL, SQE128 and CQE32 are "
				  "not driven by this ring",
				  flags);
	memset(&p, 0, sizeof(p));
	p.flags = flags;
	fd = upcie_uring_sys_setup_(entries, &p);
	if (fd < 0)
		return UPCIE_FAIL(fd, "uring: io_uring_setup(%u, flags 0x%x): %s%s", entries, flags,
				  upcie_errno_name(fd),
				  fd == -ENOSYS || fd == -EPERM
				      ? " (no io_uring for this process: kernel.io_uring_disabled?)"
				      : "");
	r->fd = fd;
	r->setup_flags = flags;
	r->features = p.features;
	r->sq_entries = p.sq_entries;
	r->cq_entries = p.cq_entries;
	r->sq_ring_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
	r->cq_ring_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
	if (p.features & IORING_FEAT_SINGLE_MMAP) {
		if (r->cq_ring_len > r->sq_ring_len)
			r->sq_ring_len = r->cq_ring_len;
		r->cq_ring_len = r->sq_ring_len;
	}
	m = mmap(NULL, r->sq_ring_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
		 IORING_OFF_SQ_RING);
	if (m == MAP_FAILED) {
		err = upcie_neg_errno();
		r->sq_ring = NULL;
		goto fail;
	}
	r->sq_ring = m;
	if (p.features & IORING_FEAT_SINGLE_MMAP) {
		r->cq_ring = m;
	} else {
		m = mmap(NULL, r->cq_ring_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
			 fd, IORING_OFF_CQ_RING);
		if (m == MAP_FAILED) {
			err = upcie_neg_errno();
			goto fail;
		}
		r->cq_ring = m;
	}
	r->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
	m = mmap(NULL, r->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
		 IORING_OFF_SQES);
	if (m == MAP_FAILED) {
		err = upcie_neg_errno();
		goto fail;
	}
	r->sqes = (struct io_uring_sqe *)m;
	r->sq_head = (unsigned *)((char *)r->sq_ring + p.sq_off.head);
	r->sq_tail = (unsigned *)((char *)r->sq_ring + p.sq_off.tail);
	r->sq_mask = *(unsigned *)((char *)r->sq_ring + p.sq_off.ring_mask);
	r->sq_array = (unsigned *)((char *)r->sq_ring + p.sq_off.array);
	r->cq_head = (unsigned *)((char *)r->cq_ring + p.cq_off.head);
	r->cq_tail = (unsigned *)((char *)r->cq_ring + p.cq_off.tail);
	r->cq_mask = *(unsigned *)((char *)r->cq_ring + p.cq_off.ring_mask);
	r->cqes = (struct io_uring_cqe *)((char *)r->cq_ring + p.cq_off.cqes);
	r->sq_local_tail = *r->sq_tail;
	return 0;
fail:
	upcie_uring_fini(r);
	return UPCIE_FAIL(err, "uring: mapping the rings failed: %s", upcie_errno_name(err));
}

/* SQEs handed out by upcie_uring_sqe() and not yet taken by the kernel (>= 0). */
static inline unsigned upcie_uring_sq_pending(const struct upcie_uring *r)
{
	return r->sq_local_tail - __atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE);
}

/*
 * The next free SQE, zeroed, or NULL when the SQ is full (submit, then reap). Filling it and
 * calling upcie_uring_submit() hands it to the kernel; an SQE handed out cannot be taken back.
 */
static inline struct io_uring_sqe *upcie_uring_sqe(struct upcie_uring *r)
{
	struct io_uring_sqe *sqe;
	unsigned idx;

	if (!r || r->fd < 0 || upcie_uring_sq_pending(r) >= r->sq_entries)
		return NULL;
	idx = r->sq_local_tail & r->sq_mask;
	sqe = &r->sqes[idx];
	memset(sqe, 0, sizeof(*sqe));
	r->sq_array[idx] = idx;
	r->sq_local_tail++;
	return sqe;
}

/*
 * Publish the SQEs handed out and enter the kernel; with wait_nr > 0 also wait until that many
 * CQEs are there. Returns the number of SQEs the kernel took (>= 0) or -errno; -EINTR and
 * -EAGAIN/-EBUSY (the kernel is short of resources or the CQ is full: reap, then submit again)
 * leave the rest pending.
 */
static inline int upcie_uring_submit(struct upcie_uring *r, unsigned wait_nr)
{
	unsigned n;
	int ret;

	if (!r || r->fd < 0)
		return UPCIE_FAIL(-EBADF, "uring: submit on a closed ring");
	__atomic_store_n(r->sq_tail, r->sq_local_tail, __ATOMIC_RELEASE);
	n = upcie_uring_sq_pending(r);
	if (!n && !wait_nr)
		return 0;
	ret = upcie_uring_sys_enter_(r->fd, n, wait_nr, wait_nr ? IORING_ENTER_GETEVENTS : 0);
	if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)
		return UPCIE_FAIL(ret, "uring: io_uring_enter(%u SQEs, wait %u): %s", n, wait_nr,
				  upcie_errno_name(ret));
	return ret;
}

/* The oldest unconsumed CQE, or NULL; upcie_uring_cqe_seen() consumes it. */
static inline struct io_uring_cqe *upcie_uring_cqe_peek(struct upcie_uring *r)
{
	unsigned head = *r->cq_head;

	if (head == __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE))
		return NULL;
	return &r->cqes[head & r->cq_mask];
}

/* Consume the CQE upcie_uring_cqe_peek() returned (release store of the CQ head). */
static inline void upcie_uring_cqe_seen(struct upcie_uring *r)
{
	__atomic_store_n(r->cq_head, *r->cq_head + 1, __ATOMIC_RELEASE);
}

/* Wait (in the kernel) until at least one CQE is there; 0, or -errno (-EINTR included). */
static inline int upcie_uring_wait(struct upcie_uring *r)
{
	int ret;

	if (upcie_uring_cqe_peek(r))
		return 0;
	ret = upcie_uring_sys_enter_(r->fd, 0, 1, IORING_ENTER_GETEVENTS);
	return ret < 0 ? ret : 0;
}

#endif /* UPCIE_URING_RING_H */
