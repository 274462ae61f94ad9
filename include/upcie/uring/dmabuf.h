/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * io_uring with dma-buf registered buffers: reads and writes of a block device (the kernel's nvme
 * driver, /dev/nvme0n1, opened O_DIRECT) straight into and out of a dma-buf (GPU memory exported
 * by CUDA or HIP, a udmabuf, a vfio-pci BAR), by the kernel's driver.
 *
 * The kernel side is the io_uring dma-buf registered-buffer series (v3 UAPI), in no released
 * kernel as of 2026-12: upcie_uring_dmabuf_probe() asks the running kernel once, on a ring of
 * its own (the caller's ring is never touched), and returns -EOPNOTSUPP with a message where it
 * is missing. The UAPI parts the series adds are defined here under upcie_ names, checked
 * against the system headers' layout (struct io_uring_rsrc_update2's former `resv` is the
 * series' `flags`).
 *
 * A table (struct upcie_uring_dmabufs) owns the buffer table of one ring (uring/ring.h):
 * a sparse table of 1..256 slots (the seed's limit: 256 mapped allocations per device), dma-bufs
 * of at most 1 TiB (the series' v3 kernel itself stops at 1 GiB and says -EINVAL), each bound to
 * the block device it is registered for (target_fd, which must stay open while the slot is
 * registered). I/O: struct upcie_uring_dmabuf_io (the caller's, alive until reaped) names a slot,
 * a byte offset inside the dma-buf, a length and a file offset (both multiples of the device's
 * logical block size, as O_DIRECT wants); _queue() fills an SQE, upcie_uring_submit() sends,
 * _reap() hands back finished I/Os with their result. The kernel maps a dma-buf for the device
 * lazily, at its first I/O; until the mapping exists an I/O issued inline can end with -EAGAIN
 * (spurious, documented by the series): _reap() issues it again, up to
 * UPCIE_URING_DMABUF_REISSUE_MAX times, and counts those in `reissued`. Mapping errors (an
 * exporter that cannot reach the device) come in the first I/O's result, not at registration.
 * Unregistering (one slot, or the whole table) while I/O on it is in flight is refused: -EBUSY.
 * Not supported by the kernel, so not offered here: IORING_SETUP_IOPOLL rings (refused at
 * init), vectored fixed I/O (the kernel answers -EOPNOTSUPP), files other than the slot's target
 * (-EBADF). The ring must carry only this table's I/O (its user_data are the I/O pointers).
 * Thread safety: none; a table and its ring belong to one thread at a time.
 *
 * Under a translating IOMMU a GPU's dma-buf (physical addresses) needs uring/dmabuf_iommu.h
 * before registration; udmabuf and vfio-pci dma-bufs map themselves for the device.
 */
#ifndef UPCIE_URING_DMABUF_H
#define UPCIE_URING_DMABUF_H

#include <upcie/base/feature.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <linux/io_uring.h>

#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/base/sysfs.h>
#include <upcie/pci/bdf.h>
#include <upcie/uring/ring.h>

/* --- the series' UAPI (v3), under our names ------------------------------------------------ */

/* io_uring_rsrc_update2.flags (the field older headers call resv): descriptors are
 * struct upcie_uring_regbuf_desc instead of struct iovec. */
#define UPCIE_URING_RSRC_UPDATE_EXTENDED (1U << 1)

enum upcie_uring_regbuf_type {
	UPCIE_URING_REGBUF_EMPTY = 0,
	UPCIE_URING_REGBUF_UADDR = 1,
	UPCIE_URING_REGBUF_DMABUF = 2,
};

struct upcie_uring_regbuf_desc {
	uint32_t type; /* enum upcie_uring_regbuf_type */
	uint32_t flags;
	uint64_t size;	/* UADDR only; 0 for a dma-buf */
	uint64_t uaddr; /* UADDR only; 0 for a dma-buf */
	int32_t dmabuf_fd;
	int32_t target_fd; /* the file the buffer is used with */
	uint64_t resv[6];
};

UPCIE_STATIC_ASSERT(sizeof(struct upcie_uring_regbuf_desc) == 80, "regbuf_desc is 80 bytes");
UPCIE_STATIC_ASSERT(offsetof(struct upcie_uring_regbuf_desc, dmabuf_fd) == 24,
		    "regbuf_desc.dmabuf_fd at 24");
UPCIE_STATIC_ASSERT(sizeof(struct io_uring_rsrc_update2) == 32, "rsrc_update2 is 32 bytes");
UPCIE_STATIC_ASSERT(offsetof(struct io_uring_rsrc_update2, data) == 8, "rsrc_update2.data at 8");
#ifdef IORING_RSRC_UPDATE_EXTENDED
UPCIE_STATIC_ASSERT(IORING_RSRC_UPDATE_EXTENDED == UPCIE_URING_RSRC_UPDATE_EXTENDED,
		    "the system's IORING_RSRC_UPDATE_EXTENDED");
#endif

/* --- limits -------------------------------------------------------------------------------- */

#define UPCIE_URING_DMABUF_MAX_SLOTS   256u
#define UPCIE_URING_DMABUF_MAX_SIZE    (UINT64_C(1) << 40)
#define UPCIE_URING_DMABUF_REISSUE_MAX 64u

/* --- the two requests, on a ring descriptor ------------------------------------------------ */

/* A sparse buffer table of `n` empty slots on ring `fd`: 0 or -errno (logs nothing). */
static inline int upcie_uring_sparse_table_(int fd, unsigned n)
{
	struct io_uring_rsrc_register reg;

	memset(&reg, 0, sizeof(reg));
	reg.nr = n;
	reg.flags = IORING_RSRC_REGISTER_SPARSE;
	return upcie_uring_register_raw(fd, IORING_REGISTER_BUFFERS2, &reg, sizeof(reg));
}

/* One extended descriptor into `slot` of ring `fd`: the kernel's answer (1 on success) or -errno
 * (logs nothing). */
static inline int upcie_uring_regbuf_update_(int fd, unsigned slot,
					     const struct upcie_uring_regbuf_desc *d)
{
	struct io_uring_rsrc_update2 up;

	memset(&up, 0, sizeof(up));
	up.offset = slot;
	up.resv = UPCIE_URING_RSRC_UPDATE_EXTENDED;
	up.data = (uint64_t)(uintptr_t)d;
	up.nr = 1;
	return upcie_uring_register_raw(fd, IORING_REGISTER_BUFFERS_UPDATE, &up, sizeof(up));
}

/* --- the probe ----------------------------------------------------------------------------- */

/*
 * The series asks: with EXTENDED descriptors, a DMABUF descriptor naming no file (-1) is -EBADF
 * from a kernel that has it; a kernel without it refuses the non-zero flags (-EINVAL), one built
 * without dma-buf tokens says -EOPNOTSUPP. Done on a one-slot ring of its own, closed after.
 * Returns 0 or that errno (unsupported as -EOPNOTSUPP).
 */
static inline int upcie_uring_dmabuf_probe_once_(int *raw)
{
	struct io_uring_params p;
	struct upcie_uring_regbuf_desc d;
	int fd, ret;

	memset(&p, 0, sizeof(p));
	fd = upcie_uring_sys_setup_(1, &p);
	if (fd < 0) {
		*raw = fd;
		return -EOPNOTSUPP;
	}
	memset(&d, 0, sizeof(d));
	d.type = UPCIE_URING_REGBUF_DMABUF;
	d.dmabuf_fd = -1;
	d.target_fd = -1;
	ret = upcie_uring_sparse_table_(fd, 1);
	if (!ret)
		ret = upcie_uring_regbuf_update_(fd, 0, &d);
	close(fd);
	*raw = ret;
	return ret == -EBADF ? 0 : -EOPNOTSUPP;
}

/*
 * 0 when the running kernel registers dma-bufs as io_uring fixed buffers, else -EOPNOTSUPP with
 * a message saying what the kernel answered. Asked once per translation unit and remembered.
 */
static inline int upcie_uring_dmabuf_probe(void)
{
	static int state; /* 0: not asked, 1: yes, 2: no */
	static int raw;
	int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);

	if (!s) {
		int r, e = upcie_uring_dmabuf_probe_once_(&r);

		raw = r;
		s = e ? 2 : 1;
		__atomic_store_n(&state, s, __ATOMIC_RELEASE);
	}
	if (s == 1)
		return 0;
	return UPCIE_FAIL(
	    -EOPNOTSUPP,
	    "uring: this kernel cannot register dma-bufs as io_uring buffers (%s: %s); "
	    "it needs the io_uring dma-buf registered-buffer series, in no released "
	    "kernel yet",
	    raw == -EINVAL	 ? "extended buffer descriptors refused"
	    : raw == -EOPNOTSUPP ? "built without dma-buf tokens"
	    : raw == -ENOSYS	 ? "no io_uring"
	    : raw == -EPERM	 ? "io_uring disabled for this process"
				 : "unexpected answer",
	    upcie_errno_name(raw));
}

/* --- the controller behind a block device -------------------------------------------------- */

/*
 * The PCI function of the NVMe controller that serves block device `fd` (a namespace or one of
 * its partitions) into *bdf. -ENODEV where no single PCI controller stands behind it (a native
 * multipath head, a non-NVMe disk, a controller not on PCI), -ENOTBLK for a file that is not a
 * block device. Reads <sysfs>/dev/block/MAJ:MIN.
 */
static inline int upcie_uring_nvme_bdf(int fd, struct upcie_pci_bdf *bdf)
{
	char path[PATH_MAX], disk[PATH_MAX], ctrl[PATH_MAX], fn[PATH_MAX], sub[PATH_MAX];
	const char *base;
	struct stat st;
	int err;

	if (!bdf)
		return UPCIE_FAIL(-EINVAL, "uring: nvme_bdf needs an output");
	if (fstat(fd, &st))
		return UPCIE_FAIL(upcie_neg_errno(), "uring: fstat(%d): %s", fd, strerror(errno));
	if (!S_ISBLK(st.st_mode))
		return UPCIE_FAIL(-ENOTBLK, "uring: descriptor %d is not a block device", fd);
	err = upcie_path_fmt(path, sizeof(path), "%s/dev/block/%u:%u", upcie_sysfs_root(),
			     major(st.st_rdev), minor(st.st_rdev));
	if (err || !realpath(path, disk))
		return UPCIE_FAIL(-ENODEV, "uring: block device %u:%u has no %s", major(st.st_rdev),
				  minor(st.st_rdev), path);
	/* a partition: its disk is the parent directory */
	if (!upcie_path_fmt(path, sizeof(path), "%s/partition", disk) && !access(path, F_OK)) {
		char *slash = strrchr(disk, '/');

		if (slash)
			*slash = '\0';
	}
	base = strrchr(disk, '/') ? strrchr(disk, '/') + 1 : disk;
	/* the namespace's parent device is its controller (nvmeN), whose parent is the PCI
	 * function; a multipath head's parent is the subsystem, which has none */
	if (upcie_path_fmt(path, sizeof(path), "%s/device", disk) || !realpath(path, ctrl))
		return UPCIE_FAIL(-ENODEV, "uring: %s has no parent device", base);
	if (strncmp(strrchr(ctrl, '/') + 1, "nvme", 4) ||
	    !strncmp(strrchr(ctrl, '/') + 1, "nvme-subsys", 11))
		return UPCIE_FAIL(-ENODEV,
				  "uring: %s is not a namespace of one NVMe controller (parent %s: "
				  "a native multipath head, or not NVMe)",
				  base, strrchr(ctrl, '/') + 1);
	if (upcie_path_fmt(path, sizeof(path), "%s/device", ctrl) || !realpath(path, fn) ||
	    upcie_path_fmt(path, sizeof(path), "%s/subsystem", fn) || !realpath(path, sub) ||
	    strcmp(strrchr(sub, '/') + 1, "pci"))
		return UPCIE_FAIL(-ENODEV, "uring: the controller %s of %s is not a PCI function",
				  strrchr(ctrl, '/') + 1, base);
	err = upcie_pci_bdf_parse(strrchr(fn, '/') + 1, bdf);
	return err ? UPCIE_FAIL(-ENODEV, "uring: %s: PCI name '%s'", base, strrchr(fn, '/') + 1)
		   : 0;
}

/* --- the table ----------------------------------------------------------------------------- */

struct upcie_uring_dmabuf_slot {
	uint64_t size;	   /* the dma-buf's size; 0 when the slot is free */
	int target_fd;	   /* the block device it is registered for */
	uint32_t inflight; /* I/Os queued and not reaped */
};

struct upcie_uring_dmabufs {
	struct upcie_uring *ring;
	unsigned nslots;
	unsigned used;
	uint64_t inflight;
	uint64_t reissued; /* spurious -EAGAIN issued again, in total */
	struct upcie_uring_dmabuf_slot slot[UPCIE_URING_DMABUF_MAX_SLOTS];
};

enum upcie_uring_dmabuf_op {
	UPCIE_URING_DMABUF_READ = 0,  /* device -> dma-buf */
	UPCIE_URING_DMABUF_WRITE = 1, /* dma-buf -> device */
};

/* One I/O: the caller's, unchanged by the table until reaped. */
struct upcie_uring_dmabuf_io {
	uint64_t buf_off;  /* byte offset inside the dma-buf */
	uint64_t file_off; /* byte offset on the device */
	uint32_t len;	   /* bytes */
	uint16_t slot;
	uint8_t op;	  /* enum upcie_uring_dmabuf_op */
	uint8_t reissued; /* set by the table: times -EAGAIN was issued again */
	int32_t res;	  /* set by _reap(): bytes transferred (>= 0) or -errno */
	void *priv;	  /* the caller's */
};

/*
 * Give `ring` a sparse buffer table of `nslots` (1..256) slots for dma-bufs. -EOPNOTSUPP on a
 * kernel without the series (upcie_uring_dmabuf_probe()), -EINVAL for an IOPOLL ring or a bad
 * count, -EBUSY when the ring has a buffer table already.
 */
static inline int upcie_uring_dmabufs_init(struct upcie_uring_dmabufs *t, struct upcie_uring *ring,
					   unsigned nslots)
{
	int ret;

	if (!t || !ring || ring->fd < 0)
		return UPCIE_FAIL(-EINVAL, "uring: dmabufs_init needs a table and an open ring");
	memset(t, 0, sizeof(*t));
	if (!nslots || nslots > UPCIE_URING_DMABUF_MAX_SLOTS)
		return UPCIE_FAIL(-EINVAL, "uring: %u dma-buf slots (1..%u)", nslots,
				  UPCIE_URING_DMABUF_MAX_SLOTS);
	if (ring->setup_flags & IORING_SETUP_IOPOLL)
		return UPCIE_FAIL(-EINVAL, "uring: dma-buf buffers do not work on an IOPOLL ring");
	ret = upcie_uring_dmabuf_probe();
	if (ret)
		return ret;
	ret = upcie_uring_sparse_table_(ring->fd, nslots);
	if (ret < 0)
		return UPCIE_FAIL(ret, "uring: a sparse table of %u buffers: %s%s", nslots,
				  upcie_errno_name(ret),
				  ret == -EBUSY ? " (the ring has a buffer table already)" : "");
	t->ring = ring;
	t->nslots = nslots;
	for (unsigned i = 0; i < nslots; i++)
		t->slot[i].target_fd = -1;
	return 0;
}

/*
 * Drop the whole table (the kernel releases each dma-buf once its last I/O ended). -EBUSY while
 * any I/O is in flight (nothing changes).
 */
static inline int upcie_uring_dmabufs_fini(struct upcie_uring_dmabufs *t)
{
	int ret;

	if (!t || !t->ring)
		return 0;
	if (t->inflight)
		return UPCIE_FAIL(-EBUSY, "uring: %" PRIu64 " I/Os in flight on the dma-buf table",
				  t->inflight);
	ret = upcie_uring_register_raw(t->ring->fd, IORING_UNREGISTER_BUFFERS, NULL, 0);
	if (ret < 0 && ret != -ENXIO)
		return UPCIE_FAIL(ret, "uring: unregistering the buffer table: %s",
				  upcie_errno_name(ret));
	memset(t, 0, sizeof(*t));
	return 0;
}

/*
 * Register dma-buf `dmabuf_fd` for I/O on block device `target_fd` (opened O_DIRECT; it must stay
 * open while the slot is registered) in the lowest free slot, returned in *slot. The kernel
 * holds its own reference to the dma-buf: the caller may close dmabuf_fd afterwards.
 * -ENOTBLK (target not a block device), -EINVAL (target without O_DIRECT, an empty or unsizable
 * dma-buf, one over 1 TiB, or the kernel's own limit), -ENOSPC (no free slot), -EBADF, and the
 * kernel's answer (-EOPNOTSUPP: the target's driver cannot take dma-buf buffers).
 */
static inline int upcie_uring_dmabuf_register(struct upcie_uring_dmabufs *t, int dmabuf_fd,
					      int target_fd, unsigned *slot)
{
	struct upcie_uring_regbuf_desc d;
	struct stat st;
	off_t end;
	unsigned i;
	int fl, ret;

	if (!t || !t->ring || !slot)
		return UPCIE_FAIL(-EINVAL, "uring: dmabuf_register needs an initialised table");
	if (dmabuf_fd < 0 || target_fd < 0)
		return UPCIE_FAIL(-EBADF, "uring: dmabuf_register: descriptors %d, %d", dmabuf_fd,
				  target_fd);
	if (fstat(target_fd, &st))
		return UPCIE_FAIL(upcie_neg_errno(), "uring: fstat(%d): %s", target_fd,
				  strerror(errno));
	if (!S_ISBLK(st.st_mode))
		return UPCIE_FAIL(-ENOTBLK, "uring: target %d is not a block device", target_fd);
	fl = fcntl(target_fd, F_GETFL);
	if (fl < 0 || !(fl & O_DIRECT))
		return UPCIE_FAIL(-EINVAL, "uring: target %d is not open with O_DIRECT", target_fd);
	end = lseek(dmabuf_fd, 0, SEEK_END);
	if (end < 0)
		return UPCIE_FAIL(upcie_neg_errno(),
				  "uring: the size of dma-buf %d: %s (a dma-buf?)", dmabuf_fd,
				  strerror(errno));
	lseek(dmabuf_fd, 0, SEEK_SET);
	if (end == 0 || (uint64_t)end > UPCIE_URING_DMABUF_MAX_SIZE)
		return UPCIE_FAIL(-EINVAL, "uring: a dma-buf of %" PRIu64 " bytes (1 B .. 1 TiB)",
				  (uint64_t)end);
	if (t->used >= t->nslots)
		return UPCIE_FAIL(-ENOSPC, "uring: all %u dma-buf slots are taken", t->nslots);
	for (i = 0; i < t->nslots && t->slot[i].size; i++)
		;
	memset(&d, 0, sizeof(d));
	d.type = UPCIE_URING_REGBUF_DMABUF;
	d.dmabuf_fd = dmabuf_fd;
	d.target_fd = target_fd;
	ret = upcie_uring_regbuf_update_(t->ring->fd, i, &d);
	if (ret != 1)
		return UPCIE_FAIL(
		    ret < 0 ? ret : -EIO,
		    "uring: registering dma-buf %d (%" PRIu64 " bytes) for target %d: %s%s",
		    dmabuf_fd, (uint64_t)end, target_fd,
		    ret < 0 ? upcie_errno_name(ret) : "no slot updated",
		    ret == -EINVAL	 ? " (over the kernel's size limit?)"
		    : ret == -EOPNOTSUPP ? " (the target's driver cannot take dma-buf buffers)"
					 : "");
	t->slot[i].size = (uint64_t)end;
	t->slot[i].target_fd = target_fd;
	t->slot[i].inflight = 0;
	t->used++;
	*slot = i;
	return 0;
}

/*
 * Unregister `slot`. -EBUSY while I/O on it is in flight (nothing changes), -ENOENT for a slot
 * that holds nothing.
 */
static inline int upcie_uring_dmabuf_unregister(struct upcie_uring_dmabufs *t, unsigned slot)
{
	struct upcie_uring_regbuf_desc d;
	int ret;

	if (!t || !t->ring)
		return UPCIE_FAIL(-EINVAL, "uring: dmabuf_unregister needs an initialised table");
	if (slot >= t->nslots || !t->slot[slot].size)
		return UPCIE_FAIL(-ENOENT, "uring: dma-buf slot %u holds nothing", slot);
#ifndef UPCIE_URING_DMABUF_TEST_NO_BUSY_CHECK /* the tests' negative control removes the rule */
	if (t->slot[slot].inflight)
		return UPCIE_FAIL(-EBUSY, "uring: dma-buf slot %u has %u I/Os in flight", slot,
				  t->slot[slot].inflight);
#endif
	memset(&d, 0, sizeof(d));
	d.type = UPCIE_URING_REGBUF_EMPTY;
	ret = upcie_uring_regbuf_update_(t->ring->fd, slot, &d);
	if (ret != 1)
		return UPCIE_FAIL(ret < 0 ? ret : -EIO, "uring: unregistering slot %u: %s", slot,
				  ret < 0 ? upcie_errno_name(ret) : "no slot updated");
	t->slot[slot].size = 0;
	t->slot[slot].target_fd = -1;
	t->used--;
	return 0;
}

/* I/Os queued on `slot` and not yet reaped. */
static inline uint32_t upcie_uring_dmabuf_inflight(const struct upcie_uring_dmabufs *t,
						   unsigned slot)
{
	return t && slot < t->nslots ? t->slot[slot].inflight : 0;
}

static inline void upcie_uring_dmabuf_fill_(const struct upcie_uring_dmabufs *t,
					    struct io_uring_sqe *sqe,
					    const struct upcie_uring_dmabuf_io *io)
{
	sqe->opcode =
	    io->op == UPCIE_URING_DMABUF_WRITE ? IORING_OP_WRITE_FIXED : IORING_OP_READ_FIXED;
	sqe->fd = t->slot[io->slot].target_fd;
	sqe->addr = io->buf_off; /* a byte offset inside the dma-buf */
	sqe->len = io->len;
	sqe->off = io->file_off;
	sqe->buf_index = io->slot;
	sqe->user_data = (uint64_t)(uintptr_t)io;
}

/*
 * Queue `io` (an SQE filled, not yet sent: upcie_uring_submit() sends). -ENOENT (slot holds
 * nothing), -EINVAL (no length, an op other than READ/WRITE, a range past the dma-buf's end),
 * -EBUSY (the SQ is full: submit and reap first).
 */
static inline int upcie_uring_dmabuf_queue(struct upcie_uring_dmabufs *t,
					   struct upcie_uring_dmabuf_io *io)
{
	struct io_uring_sqe *sqe;

	if (!t || !t->ring || !io)
		return UPCIE_FAIL(-EINVAL, "uring: dmabuf_queue needs a table and an I/O");
	if (io->slot >= t->nslots || !t->slot[io->slot].size)
		return UPCIE_FAIL(-ENOENT, "uring: dma-buf slot %u holds nothing", io->slot);
	if (!io->len || io->op > UPCIE_URING_DMABUF_WRITE || io->buf_off > t->slot[io->slot].size ||
	    io->len > t->slot[io->slot].size - io->buf_off)
		return UPCIE_FAIL(-EINVAL,
				  "uring: I/O of %u bytes at %" PRIu64 " of slot %u (%" PRIu64
				  " bytes), op %u",
				  io->len, io->buf_off, io->slot, t->slot[io->slot].size, io->op);
	sqe = upcie_uring_sqe(t->ring);
	if (!sqe)
		return UPCIE_FAIL(-EBUSY, "uring: the SQ is full (submit and reap first)");
	io->reissued = 0;
	io->res = 0;
	upcie_uring_dmabuf_fill_(t, sqe, io);
	t->slot[io->slot].inflight++;
	t->inflight++;
	return 0;
}

/*
 * Collect finished I/Os into done[0..max); wait in the kernel until at least `min` are there.
 * Spurious -EAGAIN results are issued again (not returned) up to UPCIE_URING_DMABUF_REISSUE_MAX
 * times each, or fewer when the SQ has no free entry; then the I/O ends with -EAGAIN. Returns
 * the number collected (>= 0); an error of the ring (-EINTR included) is returned only when
 * nothing was collected.
 */
static inline int upcie_uring_dmabuf_reap(struct upcie_uring_dmabufs *t,
					  struct upcie_uring_dmabuf_io **done, unsigned max,
					  unsigned min)
{
	unsigned n = 0;
	int ret;

	if (!t || !t->ring || (max && !done) || min > max)
		return UPCIE_FAIL(-EINVAL, "uring: dmabuf_reap: bad arguments");
	for (;;) {
		struct io_uring_cqe *cqe;
		bool resent = false;

		while (n < max && (cqe = upcie_uring_cqe_peek(t->ring))) {
			struct upcie_uring_dmabuf_io *io =
			    (struct upcie_uring_dmabuf_io *)(uintptr_t)cqe->user_data;
			int res = cqe->res;
			struct io_uring_sqe *sqe;

			upcie_uring_cqe_seen(t->ring);
			if (res == -EAGAIN && io->reissued < UPCIE_URING_DMABUF_REISSUE_MAX &&
			    (sqe = upcie_uring_sqe(t->ring))) {
				upcie_uring_dmabuf_fill_(t, sqe, io);
				io->reissued++;
				t->reissued++;
				resent = true;
				continue;
			}
			io->res = res;
			t->slot[io->slot].inflight--;
			t->inflight--;
			done[n++] = io;
		}
		if (resent) {
			ret = upcie_uring_submit(t->ring, 0);
			if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY)
				return n ? (int)n : ret;
		}
		if (n >= min || n >= max)
			return (int)n;
		ret = upcie_uring_wait(t->ring);
		if (ret < 0)
			return n ? (int)n : ret;
	}
}

#endif /* UPCIE_URING_DMABUF_H */
