/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Served queue pairs, the client: I/O queue pairs of a controller another process owns
 * (served/server.h, e.g. the upcie-served daemon), reached over its Unix socket. Headers
 * only; nothing of the server is linked.
 *
 * Isolated (what a client gets unless the server trusts it; any client may ask for it):
 *
 *   struct upcie_served_client cl;  struct upcie_served_mem mem;  struct upcie_served_iqp q;
 *   upcie_served_connect(&cl, "/run/upcie/0000:01:00.0.sock", UPCIE_SERVED_ISOLATED);
 *   upcie_served_mem_alloc(&cl, 4 << 20, &mem);           // memfd, sealed, registered
 *   upcie_served_iqp_create(&cl, &q, 64);                 // the ring memory is the server's
 *   upcie_served_iqp_rw(&q, UPCIE_NVME_NVM_READ, 1, slba, nlb, &mem, off, len, cb, ctx);
 *   upcie_served_iqp_wait(&q, 1000000000);                // or poll with _iqp_poll()
 *   upcie_served_iqp_delete(&q); upcie_served_mem_free(&mem); upcie_served_disconnect(&cl);
 *
 * Requests name a namespace, blocks and (region, offset, length) of the client's own memory;
 * the server checks them against what it granted this client's uid or group and builds the
 * commands itself. The client sees no device address and cannot reach anything else.
 *
 * Trusted (root or the server's user, by default; info.isolated false):
 *
 *   upcie_served_connect(&cl, path, 0);
 *   upcie_served_mem_alloc(&cl, 4 << 20, &mem);
 *   struct upcie_served_qp_opts o = {.depth = 64, .sq_off = 0, .cq_off = 4096,
 *                                    .list_off = 8192};  // rings and PRP lists in `mem`
 *   upcie_served_qp_create(&cl, &qp, &mem, &o);
 *   upcie_served_qp_rw(&qp, UPCIE_NVME_NVM_READ, 1, slba, nlb, &mem, 1 << 20, len, cb, ctx);
 *   upcie_served_qp_wait(&qp, 1000000000);
 *   upcie_served_qp_delete(&qp); upcie_served_mem_free(&mem); upcie_served_disconnect(&cl);
 *
 * The data path is the client's: commands go into the SQ in its memory, completions come into
 * the CQ in its memory, with the queue pair core of nvme/qpair.h. Doorbell writes go to the
 * relay page the server forwards from, or straight to the controller when the server handed
 * out the whole device (UPCIE_SERVED_DIRECT_DB). Its commands can name any device address.
 *
 * Endings, each exactly once per command:
 * - a completion from the controller (its status; 0 or -EIO in the callback's err as the core
 *   reports it; isolated: the upcie_served_cpl as the server posted it);
 * - isolated: the server's refusal (cpl.err -EPERM, -ENOENT, -EINVAL: never sent);
 * - -ECANCELED from the queue's deletion for what the deletion aborted or left;
 * - -ECANCELED when the server reports a trusted queue lost to a controller reset (the poll
 *   returns -ENODEV: delete the queue); isolated queues survive a reset, what they had in
 *   flight completes with -ECANCELED;
 * - -ECANCELED when the server process is gone (the poll or wait returns -ENOTCONN). The client
 *   decides a server is gone from a pidfd of it (SO_PEERPIDFD where the kernel has it, so a
 *   server outside the client's PID namespace works too), which becomes readable only after the
 *   kernel has closed every file of the server: the vfio device (reset, bus mastering off) or
 *   /dev/uioN (bus mastering off). Only then are buffers handed back. A client holding the
 *   whole device (UPCIE_SERVED_DIRECT_DB) keeps the device open itself: when the server is
 *   gone it disables the controller (CC.EN 0, then CSTS.RDY 0) through its own mapping before
 *   anything is handed back, and while it cannot see RDY 0 the calls answer -EBUSY.
 *
 * A server restarted on the same socket is a new server: connect again, register again.
 */
#ifndef UPCIE_SERVED_CLIENT_H
#define UPCIE_SERVED_CLIENT_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <upcie/base/clock.h>
#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>
#include <upcie/nvme/cmd.h>
#include <upcie/nvme/dev.h>
#include <upcie/nvme/dptr.h>
#include <upcie/nvme/prp.h>
#include <upcie/nvme/qpair.h>
#include <upcie/served/proto.h>
#include <upcie/nvme/spec.h>

#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif
#ifndef MFD_ALLOW_SEALING
#define MFD_ALLOW_SEALING 0x0002U
#endif
#ifndef F_ADD_SEALS
#define F_ADD_SEALS 1033
#endif
#ifndef F_SEAL_SEAL
#define F_SEAL_SEAL 0x0001
#endif
#ifndef F_SEAL_SHRINK
#define F_SEAL_SHRINK 0x0002
#endif
#ifndef F_SEAL_GROW
#define F_SEAL_GROW 0x0004
#endif

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/* upcie_served_connect() flags */
#define UPCIE_SERVED_DIRECT_DB                                                                     \
	0x1u			   /* take the whole device to ring doorbells directly, if the
				       server hands it out (trusted only), else relay */
#define UPCIE_SERVED_ISOLATED 0x2u /* isolated even where the server would trust us */

struct upcie_served_info {
	uint32_t path; /* enum upcie_nvme_path of the server's device */
	unsigned page_shift;
	uint32_t mqes, dstrd, max_qp, max_mem, max_depth;
	uint64_t max_bytes, max_xfer;
	bool hugetlb; /* memory must be hugetlb */
	bool direct_db;
	bool isolated;	  /* isolated queue pairs only (upcie_served_iqp_*) */
	pid_t server_pid; /* 0: the server is outside our PID namespace (pidfd only) */
};

struct upcie_served_client {
	int sock;
	int pidfd; /* of the server, -1 where the kernel has no pidfd_open (< 5.3) */
	uint32_t seq;
	bool gone; /* the server is gone: no more requests */
	uint32_t nqp, nmem;
	struct upcie_served_info info;
	struct upcie_served_relay *relay;
	volatile uint8_t *db; /* doorbell mapping (direct), its offset 0 = BAR0 + 0x1000 */
	size_t db_len;
	volatile uint8_t *regs; /* direct: BAR0's register page (to stop the controller) */
	bool stopped;		/* direct: the server is gone and the controller disabled */
	uint8_t *buf;		/* response buffer, UPCIE_SERVED_MSG_MAX bytes */
	bool wake;		/* wake_fd is the server's wake eventfd of this connection */
	bool wake_asked;	/* OP_WAKE was asked (a server without it: no wake_fd) */
	int wake_fd;
	uint64_t wakes; /* wakeups sent to a sleeping poller */
};

struct upcie_served_mem {
	struct upcie_served_client *cl;
	uint32_t id;
	void *vaddr;
	size_t size;
	int fd;
	bool own;		/* allocated by upcie_served_mem_alloc() */
	struct upcie_dmamem dm; /* the client's view: its vaddr, the server's device addresses */
};

struct upcie_served_qp_opts {
	uint32_t depth;	   /* SQ and CQ entries, 2..max_depth; 0: 64 */
	uint64_t sq_off;   /* SQ ring in the region (depth * 64 bytes, controller-page aligned) */
	uint64_t cq_off;   /* CQ ring (depth * 16 bytes, controller-page aligned) */
	uint64_t list_off; /* PRP list pages: upcie_served_qp_list_bytes() from here */
	uint64_t max_xfer; /* bytes per command; 0: min(MDTS, 128 KiB) */
};

/*
 * A VF of the client's own (upcie_served_vf_get()): open it as a controller with
 * upcie_served_vf_dev_opts() (the type1 path, in a container of this process).
 */
struct upcie_served_vf {
	struct upcie_pci_bdf bdf;
	char name[UPCIE_PCI_BDF_STRLEN];
	char token[UPCIE_VFIO_VF_TOKEN_STRLEN];
	int group;    /* its IOMMU group */
	int group_fd; /* the group's file; the dev owns it once opened with it */
	uint16_t cntlid, nvq, nvi, nns;
};

struct upcie_served_qp {
	struct upcie_nvme_qpair qp;
	struct upcie_nvme_dptr_cfg dptr;
	struct upcie_served_client *cl;
	struct upcie_served_mem *mem;
	uint32_t slot;
	uint16_t qid;
	uint32_t depth;
	uint64_t list_off;
	uint32_t lpages;
	void *tables;
	bool live;
};

/* The request/response exchange; resp in cl->buf. Returns the response's err or -errno. */
static inline int upcie_served_call_(struct upcie_served_client *cl, struct upcie_served_req *rq,
				     int pass_fd, int *got_fd, size_t *len)
{
	struct upcie_served_rsp *rp = (struct upcie_served_rsp *)cl->buf;
	ssize_t n;
	int err;

	if (got_fd)
		*got_fd = -1;
	if (cl->gone)
		return -ENOTCONN;
	rq->magic = UPCIE_SERVED_MAGIC;
	rq->seq = ++cl->seq;
	err = upcie_served_send_(cl->sock, rq, sizeof(*rq), pass_fd);
	if (!err) {
		n = upcie_served_recv_(cl->sock, cl->buf, UPCIE_SERVED_MSG_MAX, got_fd, 0);
		err = n < 0 ? (int)n : n == 0 ? -ENOTCONN : 0;
		if (!err && ((size_t)n < sizeof(*rp) || rp->magic != UPCIE_SERVED_MAGIC ||
			     rp->seq != rq->seq || rp->op != rq->op))
			err = -EPROTO;
		if (len)
			*len = n > 0 ? (size_t)n : 0;
	}
	if (err == -EPIPE || err == -ECONNRESET || err == -ENOTCONN) {
		cl->gone = true;
		return UPCIE_FAIL(-ENOTCONN, "served: the server hung up");
	}
	if (err) {
		if (got_fd && *got_fd >= 0) {
			close(*got_fd);
			*got_fd = -1;
		}
		return UPCIE_FAIL(err, "served: request %u: %s", rq->op, upcie_errno_name(err));
	}
	if (rp->err && got_fd && *got_fd >= 0) {
		close(*got_fd);
		*got_fd = -1;
	}
	return rp->err;
}

/*
 * The connection's wake eventfd (OP_WAKE), asked for once, before the first queue the server's
 * poller runs for us. A server without it (-EOPNOTSUPP) polls for us on its own. Returns 0 or
 * the request's -errno (the queue works either way: a server that handed no eventfd never says
 * its poller sleeps).
 */
static inline int upcie_served_wake_get_(struct upcie_served_client *cl)
{
	struct upcie_served_req rq;
	int err, fd = -1;

	if (cl->wake || cl->wake_asked)
		return 0;
	cl->wake_asked = true;
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_WAKE;
	err = upcie_served_call_(cl, &rq, -1, &fd, NULL);
	if (err || fd < 0) {
		if (fd >= 0)
			close(fd);
		return err ? err : -EPROTO;
	}
	cl->wake_fd = fd;
	cl->wake = true;
	return 0;
}

/*
 * Ask the server for an SR-IOV VF of this client's own (served/server_vf.h): a controller with
 * exactly the namespaces its grants name, whose DMA the IOMMU confines to what this process maps.
 * On success vf->group_fd is the VF's IOMMU group file; pass it with
 * upcie_served_vf_dev_opts() to upcie_nvme_ctrl_open(), or close it. The VF goes back (offline:
 * its controller stops) when this connection closes, whatever still holds its files. Returns
 * 0, -EOPNOTSUPP (the server hands out no VFs), -EPERM (a grant is an LBA range or read-only,
 * or none names this client), -EBUSY (every VF is held), -EALREADY (this connection has one),
 * -ENOTCONN, -EPROTO.
 */
static inline int upcie_served_vf_get(struct upcie_served_client *cl, struct upcie_served_vf *vf)
{
	const struct upcie_served_rsp *rp;
	struct upcie_served_req rq;
	int err, fd = -1;

	if (!cl || cl->sock < 0 || !vf)
		return UPCIE_FAIL(-EINVAL, "served: vf: not connected or NULL argument");
	memset(vf, 0, sizeof(*vf));
	vf->group_fd = -1;
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_VF;
	err = upcie_served_call_(cl, &rq, -1, &fd, NULL);
	if (err)
		return err;
	rp = (const struct upcie_served_rsp *)cl->buf;
	if (fd < 0 || memchr(rp->u.vf.bdf, 0, sizeof(rp->u.vf.bdf)) == NULL ||
	    memchr(rp->u.vf.token, 0, sizeof(rp->u.vf.token)) == NULL ||
	    strlen(rp->u.vf.token) != UPCIE_VFIO_VF_TOKEN_STRLEN - 1 ||
	    upcie_pci_bdf_parse(rp->u.vf.bdf, &vf->bdf)) {
		if (fd >= 0)
			close(fd);
		return UPCIE_FAIL(-EPROTO, "served: vf: malformed answer");
	}
	upcie_pci_bdf_format(&vf->bdf, vf->name, sizeof(vf->name));
	memcpy(vf->token, rp->u.vf.token, sizeof(vf->token));
	vf->group = rp->u.vf.group;
	vf->group_fd = fd;
	vf->cntlid = rp->u.vf.cntlid;
	vf->nvq = rp->u.vf.nvq;
	vf->nvi = rp->u.vf.nvi;
	vf->nns = rp->u.vf.nns;
	return 0;
}

/*
 * Device options that open `vf` (type1 path with its group file and VF token) into *o. The
 * group file then belongs to the dev (vf->group_fd is set to -1 here: do not close it).
 */
static inline void upcie_served_vf_dev_opts(struct upcie_served_vf *vf,
					    struct upcie_nvme_dev_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->path = UPCIE_NVME_PATH_TYPE1;
	o->vfio_group_fd = vf->group_fd;
	o->vf_token = vf->token;
	vf->group_fd = -1;
}

/*
 * The server is gone but this client holds the whole device (its mapping keeps the device
 * open: the kernel will not reset it): disable the controller through the register page, wait
 * for CSTS.RDY 0 (CAP.TO, at most 30 s). Returns 0 when the controller stopped, -EBUSY when it
 * did not say so (then the device may still DMA: nothing is handed back).
 */
static inline int upcie_served_stop_device_(struct upcie_served_client *cl)
{
	volatile uint32_t *cc, *csts;
	uint64_t cap, t0, to;

	if (cl->stopped || !cl->db)
		return 0;
	if (!cl->regs)
		return -EBUSY;
	cc = (volatile uint32_t *)(cl->regs + 0x14);
	csts = (volatile uint32_t *)(cl->regs + 0x1c);
	cap = *(volatile uint32_t *)(cl->regs + 0x4);
	to = ((cap >> 24) & 0xff) * UINT64_C(500000000);
	if (!to || to > UINT64_C(30000000000))
		to = UINT64_C(30000000000);
	*cc = *cc & ~1u;
	t0 = upcie_time_ns();
	while (*csts & 1u) {
		struct timespec ts = { 0, 1000000 };

		if (*csts == 0xffffffffu || upcie_time_ns() - t0 > to) {
			UPCIE_ERR("served: the server is gone and the controller does not stop "
				  "(CSTS 0x%x): buffers stay in use",
				  *csts);
			return -EBUSY;
		}
		nanosleep(&ts, NULL);
	}
	cl->stopped = true;
	return 0;
}

/*
 * Is the server still there? 0: yes; -ENOTCONN: it is gone and the device is stopped (the
 * kernel has released the server's files, and a client holding the whole device has disabled
 * the controller); -EBUSY: it is gone but the controller could not be seen stopped;
 * -ESHUTDOWN: it says it is stopping (it deletes every queue). One poll() of the pidfd: not for
 * every completion, for when commands are late.
 */
static inline int upcie_served_alive(struct upcie_served_client *cl)
{
	struct pollfd p;

	if (!cl || cl->sock < 0)
		return -EINVAL;
	if (cl->pidfd >= 0) {
		p.fd = cl->pidfd;
		p.events = POLLIN;
		p.revents = 0;
		if (poll(&p, 1, 0) > 0) {
			cl->gone = true;
			return upcie_served_stop_device_(cl) ? -EBUSY : -ENOTCONN;
		}
	} else if (cl->info.server_pid > 0 && kill(cl->info.server_pid, 0) && errno == ESRCH) {
		cl->gone = true;
		return upcie_served_stop_device_(cl) ? -EBUSY : -ENOTCONN;
	}
	if (__atomic_load_n(&cl->relay->slot[0].state, __ATOMIC_ACQUIRE) ==
	    UPCIE_SERVED_SLOT_STOPPING)
		return -ESHUTDOWN;
	return 0;
}

/* Close the connection (the server deletes what is left of this client's). */
static inline void upcie_served_disconnect(struct upcie_served_client *cl)
{
	if (!cl)
		return;
	if (cl->db)
		munmap((void *)cl->db, cl->db_len);
	if (cl->regs)
		munmap((void *)cl->regs, 4096);
	if (cl->relay)
		munmap(cl->relay, sizeof(*cl->relay));
	if (cl->sock >= 0)
		close(cl->sock);
	if (cl->pidfd >= 0)
		close(cl->pidfd);
	if (cl->wake)
		close(cl->wake_fd);
	free(cl->buf);
	memset(cl, 0, sizeof(*cl));
	cl->sock = -1;
	cl->pidfd = -1;
}

/*
 * After publishing work (a ring's or a relayed sq_tail): wake the server's poller when it says
 * it sleeps (the relay page's `poller`, proto.h). A server without wake eventfds never says so.
 */
static inline void upcie_served_wake_(struct upcie_served_client *cl)
{
	uint64_t one = 1;

	__atomic_thread_fence(__ATOMIC_SEQ_CST); /* the sq_tail store before the load below */
	if (!cl->wake || __atomic_load_n(&cl->relay->slot[0].poller, __ATOMIC_RELAXED) !=
			     UPCIE_SERVED_POLLER_ASLEEP)
		return;
	cl->wakes++;
	if (write(cl->wake_fd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is full, the poller has a wakeup pending anyway */
	}
}

/*
 * Connect to the server on socket `path`: version check, the controller's facts (cl->info), the
 * relay page; with UPCIE_SERVED_DIRECT_DB a doorbell mapping when the server grants one.
 * Returns 0; -ENOENT/-ECONNREFUSED (no server); -EACCES (socket permissions); -EPROTO or
 * -EPROTONOSUPPORT (not a server of this version); -errno. `cl` is zeroed (fds -1) on failure.
 */
static inline int upcie_served_connect(struct upcie_served_client *cl, const char *path,
				       unsigned flags)
{
	struct upcie_served_rsp *rp;
	struct upcie_served_req rq;
	struct sockaddr_un sa;
	struct ucred cr;
	socklen_t crl = sizeof(cr);
	int err, fd = -1;
	void *p;

	if (!cl)
		return UPCIE_FAIL(-EINVAL, "served: NULL client");
	memset(cl, 0, sizeof(*cl));
	cl->sock = -1;
	cl->pidfd = -1;
	if (!path || strlen(path) >= sizeof(sa.sun_path))
		return UPCIE_FAIL(-EINVAL, "served: bad socket path");
	cl->buf = (uint8_t *)malloc(UPCIE_SERVED_MSG_MAX);
	if (!cl->buf)
		return -ENOMEM;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, path, strlen(path));
	cl->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (cl->sock < 0 || connect(cl->sock, (struct sockaddr *)&sa, sizeof(sa))) {
		err = UPCIE_FAIL(-errno, "served: connect to %s: %s", path, strerror(errno));
		goto fail;
	}
	if (getsockopt(cl->sock, SOL_SOCKET, SO_PEERCRED, &cr, &crl)) {
		err = -errno;
		goto fail;
	}
	/* the server as the kernel knows it, taken before anything can end it: the socket's
	   own pidfd (Linux >= 6.5, any PID namespace), else one of the peer's pid */
	{
		int pfd = -1;
		socklen_t pl = sizeof(pfd);

		if (!getsockopt(cl->sock, SOL_SOCKET, SO_PEERPIDFD, &pfd, &pl) && pfd >= 0)
			cl->pidfd = pfd;
	}
#ifdef SYS_pidfd_open
	if (cl->pidfd < 0 && cr.pid > 0)
		cl->pidfd = (int)syscall(SYS_pidfd_open, cr.pid, 0);
#endif
	if (cr.pid <= 0 && cl->pidfd < 0) {
		err = UPCIE_FAIL(-EOPNOTSUPP,
				 "served: the server at %s is outside this PID namespace and the "
				 "kernel has no SO_PEERPIDFD (Linux >= 6.5): its death could not "
				 "be told; run the client in the server's PID namespace",
				 path);
		goto fail;
	}
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_HELLO;
	rq.u.hello.version = UPCIE_SERVED_VERSION;
	rq.u.hello.flags = (flags & UPCIE_SERVED_DIRECT_DB ? UPCIE_SERVED_HELLO_DIRECT_DB : 0) |
			   (flags & UPCIE_SERVED_ISOLATED ? UPCIE_SERVED_HELLO_ISOLATED : 0);
	err = upcie_served_call_(cl, &rq, -1, &fd, NULL);
	if (err)
		goto fail;
	rp = (struct upcie_served_rsp *)cl->buf;
	/* the pid the server gives is of its own namespace: compared only where we see it */
	if (fd < 0 || rp->u.hello.relay_size != sizeof(*cl->relay) ||
	    (cr.pid > 0 && rp->u.hello.server_pid != (int32_t)cr.pid)) {
		err = UPCIE_FAIL(-EPROTO,
				 "served: HELLO without a relay page or from pid %d "
				 "(socket peer %d)",
				 (int)rp->u.hello.server_pid, (int)cr.pid);
		goto fail;
	}
	cl->info.path = rp->u.hello.path;
	cl->info.page_shift = rp->u.hello.page_shift;
	cl->info.mqes = rp->u.hello.mqes;
	cl->info.dstrd = rp->u.hello.dstrd;
	cl->info.max_qp = rp->u.hello.max_qp;
	cl->info.max_mem = rp->u.hello.max_mem;
	cl->info.max_depth = rp->u.hello.max_depth;
	cl->info.max_bytes = rp->u.hello.max_bytes;
	cl->info.max_xfer = rp->u.hello.max_xfer;
	cl->info.hugetlb = rp->u.hello.hugetlb != 0;
	cl->info.direct_db = rp->u.hello.direct_db != 0;
	cl->info.isolated = rp->u.hello.isolated != 0;
	cl->info.server_pid = (pid_t)cr.pid;
	if (cl->info.page_shift < 12 || cl->info.page_shift > 27) {
		err = UPCIE_FAIL(-EPROTO, "served: controller page shift %u", cl->info.page_shift);
		goto fail;
	}
	p = mmap(NULL, sizeof(*cl->relay), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	fd = -1;
	if (p == MAP_FAILED) {
		err = UPCIE_FAIL(-errno, "served: relay page: %s", strerror(errno));
		goto fail;
	}
	cl->relay = (struct upcie_served_relay *)p;
	if ((flags & UPCIE_SERVED_DIRECT_DB) && cl->info.direct_db && !cl->info.isolated) {
		memset(&rq, 0, sizeof(rq));
		rq.op = UPCIE_SERVED_OP_DOORBELLS;
		err = upcie_served_call_(cl, &rq, -1, &fd, NULL);
		if (!err && fd >= 0) {
			rp = (struct upcie_served_rsp *)cl->buf;
			cl->db_len = rp->u.doorbells.size;
			p = mmap(NULL, cl->db_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
				 (off_t)rp->u.doorbells.offset);
			if (p == MAP_FAILED) {
				err = UPCIE_FAIL(-errno, "served: doorbell mapping: %s",
						 strerror(errno));
			} else {
				cl->db = (volatile uint8_t *)p;
				/* the registers too: what stops the device if the server dies */
				p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
					 (off_t)rp->u.doorbells.regs);
				if (p == MAP_FAILED)
					err = UPCIE_FAIL(-errno, "served: register mapping: %s",
							 strerror(errno));
				else
					cl->regs = (volatile uint8_t *)p;
			}
			/* the mappings hold the file: the descriptor can go */
			close(fd);
			fd = -1;
		}
		if (err)
			goto fail;
	}
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	upcie_served_disconnect(cl);
	return err;
}

/* The server's Identify data (CNS 0 namespace, 1 controller, 2 active NSIDs, 3 NS
 * descriptors) into buf (4096 bytes). Returns 0, -EIO (error status), -ENOTCONN, -errno. */
static inline int upcie_served_identify(struct upcie_served_client *cl, uint8_t cns, uint32_t nsid,
					void *buf)
{
	struct upcie_served_req rq;
	size_t len = 0;
	int err;

	if (!cl || cl->sock < 0 || !buf)
		return UPCIE_FAIL(-EINVAL, "served: identify: not connected or NULL buffer");
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_IDENTIFY;
	rq.u.identify.cns = cns;
	rq.u.identify.nsid = nsid;
	err = upcie_served_call_(cl, &rq, -1, NULL, &len);
	if (err)
		return err;
	if (len != sizeof(struct upcie_served_rsp) + 4096)
		return UPCIE_FAIL(-EPROTO, "served: identify: %zu bytes", len);
	memcpy(buf, cl->buf + sizeof(struct upcie_served_rsp), 4096);
	return 0;
}

/*
 * Register `size` bytes of the caller's memfd `fd` (sealed with F_SEAL_SHRINK; hugetlb when
 * cl->info.hugetlb), mapped here at `vaddr`: mem->dm then translates offsets to the device
 * addresses the server mapped them at. The fd and mapping stay the caller's (keep both until
 * upcie_served_mem_free()). `fd` may also be a dma-buf, with vaddr NULL (see
 * upcie_served_mem_register_dmabuf()). Returns 0, -EINVAL, -EPERM (not sealed), -ENOSPC
 * (limits), -ENOTCONN, or the server's mapping error. `mem` is zeroed on failure.
 */
static inline int upcie_served_mem_register(struct upcie_served_client *cl, int fd, void *vaddr,
					    size_t size, struct upcie_served_mem *mem)
{
	struct upcie_served_rsp *rp;
	struct upcie_served_req rq;
	size_t len = 0;
	uint64_t *lut;
	int err;

	if (!mem)
		return UPCIE_FAIL(-EINVAL, "served: NULL mem");
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	if (!cl || cl->sock < 0 || fd < 0 || !size)
		return UPCIE_FAIL(-EINVAL, "served: register: not connected or bad memory");
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_MEM_REG;
	rq.u.mem_reg.size = size;
	err = upcie_served_call_(cl, &rq, fd, NULL, &len);
	if (err)
		return err;
	rp = (struct upcie_served_rsp *)cl->buf;
	if (cl->info.isolated) {
		err = 0; /* no device addresses: the server resolves (region, offset) itself */
	} else if (!rp->u.mem_reg.granule_shift) {
		err = upcie_dmamem_init_arith(&mem->dm, vaddr, size, rp->u.mem_reg.iova);
	} else if (rp->u.mem_reg.nlut > UPCIE_SERVED_MAX_LUT ||
		   len != sizeof(*rp) + rp->u.mem_reg.nlut * sizeof(uint64_t) ||
		   rp->u.mem_reg.granule_shift > 30 ||
		   rp->u.mem_reg.nlut !=
		       upcie_div_round_up(size, UINT64_C(1) << rp->u.mem_reg.granule_shift)) {
		err = UPCIE_FAIL(-EPROTO, "served: register: a LUT that does not fit the region");
	} else {
		lut = (uint64_t *)malloc(rp->u.mem_reg.nlut * sizeof(uint64_t));
		err = lut ? 0 : -ENOMEM;
		if (lut) {
			memcpy(lut, cl->buf + sizeof(*rp), rp->u.mem_reg.nlut * sizeof(uint64_t));
			err = upcie_dmamem_init_lut(&mem->dm, vaddr, size,
						    rp->u.mem_reg.granule_shift, lut, true);
		}
	}
	mem->cl = cl;
	mem->id = rp->u.mem_reg.id;
	mem->vaddr = vaddr;
	mem->size = size;
	mem->fd = fd;
	cl->nmem++;
	if (err) {
		int e2;

		memset(&rq, 0, sizeof(rq));
		rq.op = UPCIE_SERVED_OP_MEM_UNREG;
		rq.u.mem_unreg.id = mem->id;
		e2 = upcie_served_call_(cl, &rq, -1, NULL, NULL);
		(void)e2;
		cl->nmem--;
		memset(mem, 0, sizeof(*mem));
		mem->fd = -1;
	}
	return err;
}

/*
 * Register `size` bytes of a dma-buf `fd` (e.g. a vfio BAR export, vfio/dmabuf.h) as data memory:
 * the server imports it for the controller (iommufd path, IOMMU_IOAS_MAP_FILE; other paths and
 * dma-bufs the kernel cannot import answer -EOPNOTSUPP). No CPU view (mem->vaddr NULL): data
 * only, the rings of a queue pair must be in memfd memory. The fd stays the caller's.
 */
static inline int upcie_served_mem_register_dmabuf(struct upcie_served_client *cl, int fd,
						   size_t size, struct upcie_served_mem *mem)
{
	return upcie_served_mem_register(cl, fd, NULL, size, mem);
}

/*
 * Allocate `size` bytes (rounded up to the page: 4 KiB, or the hugepage where the server needs
 * hugetlb) as a sealed memfd, map it, zero it and register it. Returns as
 * upcie_served_mem_register(), or -ENOMEM (no hugepages: reserve some).
 */
static inline int upcie_served_mem_alloc(struct upcie_served_client *cl, size_t size,
					 struct upcie_served_mem *mem)
{
	unsigned mf = MFD_CLOEXEC | MFD_ALLOW_SEALING;
	size_t page = 4096;
	void *va;
	int fd, err;

	if (!mem)
		return UPCIE_FAIL(-EINVAL, "served: NULL mem");
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	if (!cl || cl->sock < 0 || !size)
		return UPCIE_FAIL(-EINVAL, "served: alloc: not connected or zero size");
	if (cl->info.hugetlb) {
		mf |= MFD_HUGETLB;
		page = 2u << 20; /* the default hugepage size on x86-64 and arm64 (4 KiB pages) */
	}
	size = (size_t)upcie_align_up(size, page);
	fd = memfd_create("upcie-served", mf);
	if (fd < 0)
		return UPCIE_FAIL(-errno, "served: memfd: %s", strerror(errno));
	if (ftruncate(fd, (off_t)size) ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		err = UPCIE_FAIL(-errno, "served: memfd of %zu bytes: %s", size, strerror(errno));
		close(fd);
		return err;
	}
	va = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (va == MAP_FAILED) {
		err = UPCIE_FAIL(-ENOMEM, "served: %zu bytes of %s: %s", size,
				 cl->info.hugetlb ? "hugepages" : "memory", strerror(errno));
		close(fd);
		return err;
	}
	memset(va, 0, size);
	err = upcie_served_mem_register(cl, fd, va, size, mem);
	if (err) {
		munmap(va, size);
		close(fd);
		return err;
	}
	mem->own = true;
	return 0;
}

/*
 * Unregister `mem` (the server unmaps it; refused with -EBUSY while a queue pair uses it) and,
 * when upcie_served_mem_alloc() made it, free it. With the server gone (-ENOTCONN from calls),
 * the memory is freed only once upcie_served_alive() says -ENOTCONN (the device stopped);
 * before that this returns -EBUSY and keeps it.
 */
static inline int upcie_served_mem_free(struct upcie_served_mem *mem)
{
	struct upcie_served_req rq;
	int err;

	if (!mem || !mem->cl)
		return 0;
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_MEM_UNREG;
	rq.u.mem_unreg.id = mem->id;
	err = upcie_served_call_(mem->cl, &rq, -1, NULL, NULL);
	if (err == -ENOTCONN && upcie_served_alive(mem->cl) == -ENOTCONN)
		err = 0; /* the server and its device are gone */
	if (err)
		return err == -ENOTCONN ? -EBUSY : err;
	mem->cl->nmem--;
	upcie_dmamem_destroy(&mem->dm);
	if (mem->own) {
		munmap(mem->vaddr, mem->size);
		close(mem->fd);
	}
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	return 0;
}

/* Bytes per command (*xfer) and PRP list pages per command (*lpages) for these options. */
static inline void upcie_served_qp_geom_(const struct upcie_served_client *cl,
					 const struct upcie_served_qp_opts *o, uint64_t *xfer,
					 uint32_t *lpages)
{
	uint64_t page = UINT64_C(1) << cl->info.page_shift;

	*xfer = o->max_xfer ? o->max_xfer : 128 * 1024;
	if (*xfer > cl->info.max_xfer)
		*xfer = cl->info.max_xfer;
	*lpages = upcie_nvme_prp_lists_needed(*xfer / page + 1, cl->info.page_shift);
	if (!*lpages)
		*lpages = 1;
}

/* Bytes of PRP list pages a queue pair of these options needs at list_off. */
static inline uint64_t upcie_served_qp_list_bytes(const struct upcie_served_client *cl,
						  const struct upcie_served_qp_opts *o)
{
	uint32_t depth = o->depth ? o->depth : 64, lp;
	uint64_t xfer;

	upcie_served_qp_geom_(cl, o, &xfer, &lp);
	return (uint64_t)(depth - 1) * lp << cl->info.page_shift;
}

/*
 * Create a queue pair on the server's controller with its rings and list pages in `mem` as `o`
 * says, and ready it here. Returns 0; -EINVAL (offsets, depth: the server's message says which);
 * -ENOSPC (limits, identifiers); -ENOTCONN; or the controller's error. `qp` is zeroed on failure.
 */
static inline int upcie_served_qp_create(struct upcie_served_client *cl, struct upcie_served_qp *qp,
					 struct upcie_served_mem *mem,
					 const struct upcie_served_qp_opts *o)
{
	struct upcie_served_qp_opts d;
	struct upcie_nvme_qpair_cfg qc;
	struct upcie_served_rsp *rp;
	struct upcie_served_req rq;
	uint64_t page, lbytes;
	int err;

	if (!qp)
		return UPCIE_FAIL(-EINVAL, "served: NULL qp");
	memset(qp, 0, sizeof(*qp));
	if (!cl || cl->sock < 0 || !mem || mem->cl != cl || !o)
		return UPCIE_FAIL(-EINVAL, "served: qp create: not connected or foreign memory");
	if (!mem->vaddr)
		return UPCIE_FAIL(-EINVAL,
				  "served: qp create: rings need memory with a CPU view "
				  "(region %u is a dma-buf)",
				  mem->id);
	d = *o;
	if (!d.depth)
		d.depth = 64;
	page = UINT64_C(1) << cl->info.page_shift;
	qp->dptr.page_shift = cl->info.page_shift;
	upcie_served_qp_geom_(cl, &d, &qp->dptr.max_bytes, &qp->lpages);
	lbytes = upcie_served_qp_list_bytes(cl, &d);
	if ((d.list_off & (page - 1)) || d.list_off > mem->size || lbytes > mem->size - d.list_off)
		return UPCIE_FAIL(-EINVAL,
				  "served: list pages at +0x%" PRIx64 " (%" PRIu64
				  " bytes) outside the region or not page aligned",
				  d.list_off, lbytes);
	if (cl->info.isolated)
		return UPCIE_FAIL(-EPERM, "served: qp create: this client is isolated (use "
					  "upcie_served_iqp_create())");
	if (d.cq_off > mem->size || (uint64_t)d.depth * 16 > mem->size - d.cq_off)
		return UPCIE_FAIL(-EINVAL, "served: CQ at +0x%" PRIx64 " outside the region",
				  d.cq_off);
	if (!cl->db)
		upcie_served_wake_get_(cl); /* relayed: the poller sleeps until we wake it */
	qp->tables = aligned_alloc(16, upcie_nvme_qpair_tables_size(d.depth - 1));
	if (!qp->tables)
		return -ENOMEM;
	/* the CQ is ours to zero: the server never touches it */
	memset((uint8_t *)mem->vaddr + d.cq_off, 0, (size_t)d.depth * 16);
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_QP_CREATE;
	rq.u.qp_create.mem_id = mem->id;
	rq.u.qp_create.depth = d.depth;
	rq.u.qp_create.sq_off = d.sq_off;
	rq.u.qp_create.cq_off = d.cq_off;
	err = upcie_served_call_(cl, &rq, -1, NULL, NULL);
	if (err) {
		free(qp->tables);
		memset(qp, 0, sizeof(*qp));
		return err;
	}
	rp = (struct upcie_served_rsp *)cl->buf;
	qp->cl = cl;
	qp->mem = mem;
	qp->slot = rp->u.qp_create.slot;
	qp->qid = (uint16_t)rp->u.qp_create.qid;
	qp->depth = d.depth;
	qp->list_off = d.list_off;
	memset(&qc, 0, sizeof(qc));
	qc.sq = (uint8_t *)mem->vaddr + d.sq_off;
	qc.cq = (uint8_t *)mem->vaddr + d.cq_off;
	if (cl->db) {
		qc.sqdb =
		    (volatile uint32_t *)(cl->db + upcie_nvme_sq_tdbl_off(qp->qid, cl->info.dstrd) -
					  0x1000);
		qc.cqdb =
		    (volatile uint32_t *)(cl->db + upcie_nvme_cq_hdbl_off(qp->qid, cl->info.dstrd) -
					  0x1000);
	} else {
		qc.sqdb = &cl->relay->slot[qp->slot].sq_tail;
		qc.cqdb = &cl->relay->slot[qp->slot].cq_head;
	}
	qc.sq_depth = d.depth;
	qc.qid = qp->qid;
	qc.tables = qp->tables;
	/* zeroed above, before the queue existed; nothing is submitted yet */
	qc.flags = UPCIE_NVME_QPAIR_NO_CQ_CLEAR;
	if (qp->slot < 1 || qp->slot > UPCIE_SERVED_MAX_QP ||
	    (cl->db && upcie_nvme_cq_hdbl_off(qp->qid, cl->info.dstrd) + 4 - 0x1000 > cl->db_len))
		err = UPCIE_FAIL(-EPROTO, "served: queue slot %u / qid %u out of range", qp->slot,
				 qp->qid);
	else
		err = upcie_nvme_qpair_init(&qp->qp, &qc);
	if (err) {
		memset(&rq, 0, sizeof(rq));
		rq.op = UPCIE_SERVED_OP_QP_DELETE;
		rq.u.qp_delete.slot = qp->slot;
		upcie_served_call_(cl, &rq, -1, NULL, NULL);
		free(qp->tables);
		memset(qp, 0, sizeof(*qp));
		return err;
	}
	cl->nqp++;
	qp->live = true;
	return 0;
}

/* The queue's state in the relay page: 0 live, -ENODEV lost to a reset, -ENOTCONN server gone. */
static inline int upcie_served_qp_state_(struct upcie_served_qp *qp, bool check_server)
{
	uint32_t st = __atomic_load_n(&qp->cl->relay->slot[qp->slot].state, __ATOMIC_ACQUIRE);

	if (st == UPCIE_SERVED_SLOT_LOST)
		return -ENODEV;
	if (check_server && upcie_served_alive(qp->cl) == -ENOTCONN)
		return -ENOTCONN;
	return 0;
}

/*
 * Reap up to `max` completions (callbacks run here). Returns how many, or -ENODEV when the
 * server reported the queue lost to a controller reset (the controller let go: every command
 * still outstanding has ended with -ECANCELED; delete the queue), -EINVAL.
 */
static inline int upcie_served_qp_poll(struct upcie_served_qp *qp, unsigned max)
{
	int n;

	if (UPCIE_UNLIKELY(!qp || !qp->live))
		return -EINVAL;
	n = upcie_nvme_qpair_reap(&qp->qp, max);
	if (n == 0 && UPCIE_UNLIKELY(upcie_served_qp_state_(qp, false))) {
		upcie_nvme_qpair_stop(&qp->qp, false);
		return -ENODEV;
	}
	return n;
}

/*
 * Poll until no command is outstanding or timeout_ns passes; the server's presence is checked
 * every millisecond of waiting. Returns 0; -ETIMEDOUT (commands still outstanding: they may
 * still complete; wait again or delete the queue); -ENODEV (lost, see _qp_poll()); -ENOTCONN
 * (the server is gone and the kernel released the device: every outstanding command ended with
 * -ECANCELED, the buffers are the caller's again).
 */
static inline int upcie_served_qp_wait(struct upcie_served_qp *qp, uint64_t timeout_ns)
{
	uint64_t t0 = upcie_time_ns(), check = t0 + 1000000;
	unsigned idle = 0;

	if (!qp || !qp->live)
		return -EINVAL;
	for (;;) {
		int n = upcie_served_qp_poll(qp, 0xffffffffu);
		uint64_t now;

		if (n < 0)
			return n;
		if (n) {
			if (!upcie_nvme_qpair_outstanding(&qp->qp, NULL, 0))
				return 0;
			continue;
		}
		if (!upcie_nvme_qpair_outstanding(&qp->qp, NULL, 0))
			return 0;
		/* the clock only now and then: a clock read can cost microseconds (VMs) */
		if (++idle & 63) {
			upcie_cpu_relax();
			continue;
		}
		now = upcie_time_ns();
		if (now >= check) {
			check = now + 1000000;
			if (upcie_served_qp_state_(qp, true) == -ENOTCONN) {
				upcie_nvme_qpair_stop(&qp->qp, false);
				return -ENOTCONN;
			}
		}
		if (now - t0 >= timeout_ns)
			return -ETIMEDOUT;
	}
}

/*
 * Enqueue command `sqe` (opcode, NSID, command dwords; the CID and, when len != 0, the data
 * pointer are filled here from [off, off + len) of `mem`) to end through cb(ctx, cqe, err).
 * Does not ring. Returns 0, -EBUSY (full: poll and retry), -EINVAL (memory not registered
 * through this client, a range outside it, a length above the queue's max_xfer).
 */
static inline int upcie_served_qp_enqueue(struct upcie_served_qp *qp,
					  const struct upcie_nvme_sqe *sqe,
					  const struct upcie_served_mem *mem, uint64_t off,
					  uint64_t len, upcie_nvme_cpl_fn cb, void *ctx)
{
	struct upcie_nvme_lists l;
	struct upcie_nvme_sqe cmd;
	uint16_t cid;
	int err;

	if (UPCIE_UNLIKELY(!qp || !qp->live || !sqe))
		return -EINVAL;
	if (UPCIE_UNLIKELY(upcie_nvme_qpair_next_cid(&qp->qp, &cid)))
		return -EBUSY;
	cmd = *sqe;
	if (len) {
		if (UPCIE_UNLIKELY(!mem || mem->cl != qp->cl || off > mem->size ||
				   len > mem->size - off || len > qp->dptr.max_bytes))
			return UPCIE_FAIL(-EINVAL, "served: data range outside registered memory "
						   "or above max_xfer");
		l.mem = &qp->mem->dm;
		l.off = qp->list_off +
			(((uint64_t)upcie_nvme_qpair_cid_index(&qp->qp, cid) * qp->lpages)
			 << qp->dptr.page_shift);
		l.npages = qp->lpages;
		err = upcie_nvme_prp_build_buf(&cmd, &mem->dm, off, len, &qp->dptr, &l);
		if (UPCIE_UNLIKELY(err < 0))
			return err;
	}
	return upcie_nvme_qpair_enqueue(&qp->qp, &cmd, cb, ctx, NULL);
}

/* Make everything enqueued visible to the controller (one doorbell write; a relayed one wakes
 * the server's poller when it sleeps). */
static inline void upcie_served_qp_ring(struct upcie_served_qp *qp)
{
	upcie_nvme_qpair_ring(&qp->qp);
	if (!qp->cl->db)
		upcie_served_wake_(qp->cl);
}

/*
 * Read or Write (opc UPCIE_NVME_NVM_READ / _WRITE) of `nlb` blocks from `slba` of namespace
 * `nsid`, data at [off, off + len) of `mem`; rings. Returns as upcie_served_qp_enqueue().
 */
static inline int upcie_served_qp_rw(struct upcie_served_qp *qp, uint8_t opc, uint32_t nsid,
				     uint64_t slba, uint32_t nlb,
				     const struct upcie_served_mem *mem, uint64_t off, uint64_t len,
				     upcie_nvme_cpl_fn cb, void *ctx)
{
	struct upcie_nvme_sqe sqe;
	int err;

	if (UPCIE_UNLIKELY(!nlb || nlb > 65536))
		return UPCIE_FAIL(-EINVAL, "served: %u blocks", nlb);
	memset(&sqe, 0, sizeof(sqe));
	sqe.opc = opc;
	sqe.nsid = nsid;
	sqe.cdw10 = (uint32_t)slba;
	sqe.cdw11 = (uint32_t)(slba >> 32);
	sqe.cdw12 = nlb - 1;
	err = upcie_served_qp_enqueue(qp, &sqe, mem, off, len, cb, ctx);
	if (!err)
		upcie_served_qp_ring(qp);
	return err;
}

/*
 * Delete the queue pair: the server deletes SQ then CQ on the controller; what the deletion
 * aborted completes here, whatever is left ends with -ECANCELED. Wait for your commands first
 * (upcie_served_qp_wait()) to have them complete normally. Returns 0; -EBUSY (the controller
 * could not delete the queue nor be stopped: it keeps the rings and the server keeps the
 * memory mapped; commands stay outstanding, buffers in use); -ENOTCONN handled as in
 * upcie_served_qp_wait(): once the server is gone the queue is simply let go.
 */
static inline int upcie_served_qp_delete(struct upcie_served_qp *qp)
{
	struct upcie_served_req rq;
	int err;

	if (!qp || !qp->live) {
		if (qp)
			memset(qp, 0, sizeof(*qp));
		return 0;
	}
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_QP_DELETE;
	rq.u.qp_delete.slot = qp->slot;
	err = upcie_served_call_(qp->cl, &rq, -1, NULL, NULL);
	if (err == -ENOTCONN && upcie_served_alive(qp->cl) == -ENOTCONN)
		err = 0;
	if (err == -ENOTCONN || err == -EBUSY)
		return -EBUSY;
	/* deleted (or never there after a reset): the CQ holds what the deletion aborted */
	upcie_nvme_qpair_stop(&qp->qp, false);
	upcie_nvme_qpair_fini(&qp->qp);
	qp->cl->nqp--;
	free(qp->tables);
	memset(qp, 0, sizeof(*qp));
	return err == -ENOENT ? 0 : err;
}

/* The isolated queue pairs (upcie_served_iqp_*), which build on the above. */
#include <upcie/served/client_iso.h>

#endif /* UPCIE_SERVED_CLIENT_H */
