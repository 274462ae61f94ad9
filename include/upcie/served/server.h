/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Served queue pairs, the server: one process owns the controller (any path: uio, vfio type1,
 * vfio cdev + iommufd) and hands I/O queue pairs to client processes over a Unix socket
 * (served/client.h). Its parts: the state (served/server_state.h), the poller
 * (served/server_poll.h), setup and teardown (served/server_setup.h: the socket, init), the
 * VFs (served/server_vf.h); here the connection lifecycle and the request handlers, which
 * check hostile input against the same per-connection and per-uid accounts and unwind into the
 * same drop paths (qp_drop_, mem_drop_, conn_drop_).
 *
 * Two kinds (served/proto.h):
 *
 * - Isolated (the default for every client the server does not trust): the client writes
 *   requests (struct upcie_served_sub) into a ring the server made; a poller thread per
 *   controller copies each one, checks it (opcode allow-list: Flush, Write, Read, Compare,
 *   Write Zeroes without deallocation, Dataset Management deallocate of one range; NSID and LBA
 *   range inside a grant for the client's uid or group; data as (region id, offset, length)
 *   inside one of the client's own registered regions) and builds the NVMe command, its PRP
 *   list and the queue in the server's own memory. Completions go back into the ring. What
 *   the controller fetches, the client cannot write; the device addresses the command names are
 *   the client's own registered memory, nothing else.
 * - Trusted (root and the server's own user by default, struct upcie_served_opts `trust`): the
 *   client's SQ, CQ, PRP lists and data live in memory it registered, it submits and reaps
 *   directly, doorbells relayed through a shared page (or, with `direct_whole_device`, the
 *   whole device's file handed to it). A trusted client's commands make the controller read and
 *   write any device address they name: other clients' memory, the server's queues (type1,
 *   iommufd), any RAM (uio). Trusted means that.
 *
 * Guarantees, both kinds:
 * - A client that goes away for any reason (exit, kill -9) is noticed by its socket hanging up.
 *   Its queues are deleted, and only when the controller confirmed the deletion, or was reset,
 *   is its memory unmapped; a queue that could not be deleted keeps its memory mapped for the
 *   server's lifetime (counted in `kept`). Other clients carry on, unless the controller had to
 *   be reset: then trusted queues are marked lost in their relay pages (their commands end with
 *   -ENODEV on their side); isolated queues are the server's and come back, what they had in
 *   flight completes with -ECANCELED.
 * - A client's requests are checked (its own regions and slots only, offsets, sizes, alignment,
 *   limits per client and per uid): a bad one gets an error and changes nothing.
 * - No client can take the server down: the memory the server hands out (relay page, rings) is
 *   a memfd it sealed against shrinking and growing (a punched hole reads back as zeros, never a
 *   SIGBUS); a client's own memory is never read or written by the server (not its CQ: the
 *   server's side of a trusted queue runs on private rings; the client zeroes its CQ itself);
 *   a client descriptor's seals are the first thing asked of it (no fstat of a FUSE file that
 *   could hang the server); nothing the client writes in shared memory is trusted. Limits per
 *   uid: connections (counted from accept, so sockets that never say HELLO count too, and are
 *   closed after the HELLO timeout), queue pairs, registered (pinned) bytes; queue identifiers
 *   are kept back so a uid that holds queues cannot take the last ones from uids that hold
 *   none. A controller that could not be reset is not reset again per request: requests that
 *   need it fail with -ENODEV until the server is restarted.
 * - The socket is bound in a private directory next to its path, given its mode and group, and
 *   only then renamed into place: it is never reachable with other permissions. What the path
 *   held before is replaced only when it is a socket nobody answers on (a stale one).
 * - On uio nothing pins a client's memory: the server's mapping and descriptor keep its
 *   hugepages allocated, but a client that punches holes in its own memfd frees pages the
 *   controller may still address (an isolated client's data only, as long as its own commands
 *   run; a trusted client can aim commands anywhere anyway). type1 and iommufd pin the pages
 *   until the server unmaps them, charged to the server (the per-uid byte limit bounds that).
 *
 * The server's own death: see served/client.h (clients notice it through a pidfd, after
 * the kernel has released the device, which stops it).
 */
#ifndef UPCIE_SERVED_SERVER_H
#define UPCIE_SERVED_SERVER_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <upcie/base/barrier.h>
#include <upcie/base/clock.h>
#include <upcie/base/log.h>
#include <upcie/base/mmio.h>
#include <upcie/mem/dmamem.h>
#include <upcie/mem/hugepage.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/dev.h>
#include <upcie/nvme/ns.h>
#include <upcie/nvme/prp.h>
#include <upcie/served/proto.h>
#include <upcie/served/server_poll.h>
#include <upcie/served/server_setup.h>
#include <upcie/served/server_state.h>
#include <upcie/served/server_vf.h>

/* The per-uid record of `uid` (made when `make`), or NULL. */
static inline struct upcie_served_uid_ *upcie_served_uid_get_(struct upcie_served *s, uid_t uid,
							      bool make)
{
	struct upcie_served_uid_ *fr = NULL;

	for (uint32_t i = 0; i < s->o.max_clients; i++) {
		struct upcie_served_uid_ *u = &s->uids[i];

		if (u->nconn && u->uid == uid)
			return u;
		if (!u->nconn && !fr)
			fr = u;
	}
	if (!make || !fr)
		return NULL;
	memset(fr, 0, sizeof(*fr));
	fr->uid = uid;
	return fr;
}

/* Take queue `k` of `cn` off the poller (before it is deleted). Lock held. */
static inline void upcie_served_unrelay_(struct upcie_served *s, struct upcie_served_qp_ *qp)
{
	if (qp->relay)
		s->nrelay--;
	qp->relay = false;
}

/*
 * The controller is not ready (a deletion or an admin command failed, and it was stopped):
 * reset it, once. A trusted queue the reset takes is marked lost; isolated queues are brought
 * back by the reset. A reset that fails is not tried again: the server answers -ENODEV from
 * then on. Returns 0 or -ENODEV. Lock held.
 */
static inline int upcie_served_recover_(struct upcie_served *s)
{
	int err;

	if (s->failed)
		return -ENODEV;
	if (s->c->state == UPCIE_NVME_CTRL_READY && !s->c->stopped)
		return 0;
	s->st.resets++;
	err = upcie_nvme_ctrl_reset(s->c);
	if (err) {
		s->failed = true;
		UPCIE_ERR("served: controller reset failed (%s): every queue is lost, and the "
			  "server will not reset it again (restart it)",
			  upcie_errno_name(err));
		return -ENODEV;
	}
	upcie_served_ns_refresh_(s);
	return 0;
}

/* Mark trusted queues a reset took as lost in their relay pages. Lock held. */
static inline void upcie_served_mark_lost_(struct upcie_served *s)
{
	for (uint32_t i = 0; i < s->o.max_clients; i++) {
		struct upcie_served_conn_ *cn = s->conns[i];

		for (uint32_t k = 1; cn && k <= UPCIE_SERVED_MAX_QP; k++) {
			struct upcie_served_qp_ *qp = &cn->qps[k];

			/* our own record: the relay word is the client's to scribble on */
			if (!qp->used || qp->iso || !qp->q.lost || qp->lost)
				continue;
			qp->lost = true;
			upcie_served_unrelay_(s, qp);
			s->st.qp_lost++;
			__atomic_store_n(&cn->relay->slot[k].state, UPCIE_SERVED_SLOT_LOST,
					 __ATOMIC_RELEASE);
		}
	}
}

/* After a controller operation failed: recover once, mark what was lost. Lock held. */
static inline void upcie_served_after_(struct upcie_served *s)
{
	upcie_served_recover_(s);
	upcie_served_mark_lost_(s);
}

/* Free the isolated side of qp (after its queue was deleted). */
static inline void upcie_served_iso_free_(struct upcie_served_qp_ *qp)
{
	if (qp->ring)
		munmap(qp->ring, qp->ring_size);
	free(qp->cmds);
}

/*
 * Delete queue `k` of `cn`: 0 when the controller let go of it (the slot is free, its region
 * may go); -EBUSY when it could not be deleted nor the controller stopped (its region is kept).
 * Lock not held (taken here; an isolated queue's commands are given up to 1 s to finish with
 * the poller still reaping them).
 */
static inline int upcie_served_qp_drop_(struct upcie_served *s, struct upcie_served_conn_ *cn,
					uint32_t k)
{
	struct upcie_served_qp_ *qp = &cn->qps[k];
	struct upcie_served_mem_ *m = qp->iso ? NULL : &cn->mems[qp->mem];
	struct upcie_served_uid_ *u;
	bool lost = qp->q.lost;
	int err;

	if (qp->iso) {
		uint64_t t0 = upcie_time_ns();

		pthread_mutex_lock(&s->lock);
		qp->closing = true;
		while (qp->inflight && s->c->state == UPCIE_NVME_CTRL_READY && !s->c->stopped &&
		       upcie_time_ns() - t0 < UPCIE_NVME_CTRL_DELETE_DRAIN) {
			struct timespec ts = { 0, 200000 };

			pthread_mutex_unlock(&s->lock);
			nanosleep(&ts, NULL);
			pthread_mutex_lock(&s->lock);
		}
		s->nrelay--;
		qp->iso = false; /* off the poller */
	} else {
		pthread_mutex_lock(&s->lock);
		upcie_served_unrelay_(s, qp);
	}
	err = upcie_nvme_ioq_delete(&qp->q);
	if (err == -EBUSY) {
		if (m)
			m->kept = true;
		else
			qp->iso = false;
		s->st.kept++;
		pthread_mutex_unlock(&s->lock);
		UPCIE_ERR(
		    "served: client %d: queue %u could not be deleted; its memory stays mapped",
		    (int)cn->pid, k);
		return -EBUSY;
	}
	/* deleted, or the controller was stopped (then a reset brings it back for the others) */
	if (err)
		upcie_served_recover_(s);
	upcie_served_mark_lost_(s);
	if (!lost)
		s->st.qp_gone++;
	__atomic_store_n(&cn->relay->slot[k].state, UPCIE_SERVED_SLOT_FREE, __ATOMIC_RELEASE);
	upcie_served_iso_free_(qp);
	free(qp->shadow);
	memset(qp, 0, sizeof(*qp));
	if (m)
		m->nqp--;
	cn->nqp--;
	s->nqp_all--;
	u = upcie_served_uid_get_(s, cn->uid, false);
	if (u)
		u->nqp--;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* Give a region back (lock held). */
static inline void upcie_served_mem_drop_(struct upcie_served *s, struct upcie_served_conn_ *cn,
					  struct upcie_served_mem_ *m)
{
	struct upcie_served_uid_ *u;

	if (m->kept || m->nqp || m->inflight)
		return; /* the controller may still use it: mapped for the server's lifetime */
	upcie_dmamem_destroy(&m->dm);
	if (m->va)
		munmap(m->va, m->size);
	close(m->fd);
	cn->bytes -= m->size;
	cn->nmem--;
	u = upcie_served_uid_get_(s, cn->uid, false);
	if (u)
		u->bytes -= m->size;
	memset(m, 0, sizeof(*m));
}

/*
 * A client is gone (or being dropped): delete its queues, then give back what may go. When a
 * queue could not be deleted, its memory, its queue object (the controller's table points at
 * it) and the client's bookkeeping stay allocated for the server's lifetime.
 */
static inline void upcie_served_conn_drop_(struct upcie_served *s, uint32_t i)
{
	struct upcie_served_conn_ *cn = s->conns[i];
	struct upcie_served_uid_ *u;
	bool keep = false;

#ifdef UPCIE_SERVED_TEST_HOOKS
	for (uint32_t m = 0; upcie_served_test_unmap_first_ && m < s->o.max_mem; m++)
		if (cn->mems[m].used)
			upcie_dmamem_destroy(&cn->mems[m].dm);
#endif
	for (uint32_t k = 1; k <= UPCIE_SERVED_MAX_QP; k++)
		if (cn->qps[k].used && upcie_served_qp_drop_(s, cn, k))
			keep = true;
	pthread_mutex_lock(&s->lock);
	if (cn->vf) {
		upcie_served_vf_back_(s, cn);
		upcie_served_after_(s);
	}
	for (uint32_t m = 0; m < s->o.max_mem; m++)
		if (cn->mems[m].used)
			upcie_served_mem_drop_(s, cn, &cn->mems[m]);
	s->conns[i] = NULL;
	s->nconns--;
	if (cn->wake_fd >= 0)
		close(cn->wake_fd); /* under the lock: the poller reads it only under it */
	cn->wake_fd = -1;
	u = upcie_served_uid_get_(s, cn->uid, false);
	if (u)
		u->nconn--;
	pthread_mutex_unlock(&s->lock);
	close(cn->fd);
	cn->fd = -1;
	if (keep)
		return; /* on purpose: see above */
	munmap((void *)cn->relay, sizeof(*cn->relay));
	close(cn->relay_fd);
	free(cn->mems);
	free(cn);
}

/* A memfd of `size` bytes sealed against shrinking, growing and further seals, mapped at *va.
 * Returns the fd or -errno. */
static inline int upcie_served_shm_(const char *name, size_t size, void **va)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING), err;
	void *p;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		err = -errno;
		close(fd);
		return err;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (p == MAP_FAILED) {
		err = -errno;
		close(fd);
		return err;
	}
	*va = p;
	return fd;
}

/* Does the client's (primary or supplementary) group list hold gid? */
static inline bool upcie_served_in_group_(const struct upcie_served_conn_ *cn, long gid)
{
	if (gid < 0 || (long)cn->gid == gid)
		return true;
	for (uint32_t i = 0; i < cn->ngroups; i++)
		if ((long)cn->groups[i] == gid)
			return true;
	return false;
}

static inline void upcie_served_accept_(struct upcie_served *s)
{
	struct upcie_served_conn_ *cn = NULL;
	struct upcie_served_uid_ *u;
	const char *why = "out of memory";
	struct ucred cr;
	socklen_t len = sizeof(cr);
	uint32_t slot = UINT32_MAX;
	int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

	if (fd < 0)
		return;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len)) {
		close(fd);
		return;
	}
	if (s->o.allow_uid >= 0 && cr.uid != 0 && (long)cr.uid != s->o.allow_uid) {
		UPCIE_ERR("served: uid %u refused (allowed: %ld and 0)", (unsigned)cr.uid,
			  s->o.allow_uid);
		s->st.refused++;
		close(fd);
		return;
	}
	u = upcie_served_uid_get_(s, cr.uid, false);
	for (uint32_t i = 0; i < s->o.max_clients && slot == UINT32_MAX; i++)
		if (!s->conns[i])
			slot = i;
	if (slot == UINT32_MAX)
		why = "too many clients";
	else if (u && u->nconn >= s->o.uid_max_clients)
		why = "too many connections of this uid";
	else
		cn = (struct upcie_served_conn_ *)calloc(1, sizeof(*cn));
	if (cn)
		cn->wake_fd = -1;
	if (cn)
		cn->mems = (struct upcie_served_mem_ *)calloc(s->o.max_mem, sizeof(*cn->mems));
	if (cn && cn->mems) {
		void *p = NULL;

		/* sealed: a client that truncates or grows it cannot fault the poller */
		cn->relay_fd = upcie_served_shm_("upcie-served-relay", sizeof(*cn->relay), &p);
		cn->relay = cn->relay_fd >= 0 ? (struct upcie_served_relay *)p : NULL;
	}
	if (!cn || !cn->mems || !cn->relay) {
		UPCIE_ERR("served: client (pid %d, uid %u) refused: %s", (int)cr.pid,
			  (unsigned)cr.uid, why);
		s->st.refused++;
		if (cn) {
			if (cn->relay_fd > 0)
				close(cn->relay_fd);
			free(cn->mems);
			free(cn);
		}
		close(fd);
		return;
	}
	cn->fd = fd;
	cn->pid = cr.pid;
	cn->uid = cr.uid;
	cn->gid = cr.gid;
	cn->next_id = 1;
	cn->t_accept = upcie_time_ns();
	{
		gid_t g[32];
		socklen_t gl = sizeof(g);

		if (!getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &gl)) {
			cn->ngroups = (uint32_t)(gl / sizeof(gid_t));
			memcpy(cn->groups, g, gl);
		}
	}
	for (uint32_t i = 0; i < s->o.ngrants; i++)
		if ((s->grants[i].uid < 0 || s->grants[i].uid == (long)cn->uid) &&
		    upcie_served_in_group_(cn, s->grants[i].gid))
			cn->grant[cn->ngrant++] = &s->grants[i];
	cn->relay->slot[0].state = UPCIE_SERVED_SLOT_LIVE;
	pthread_mutex_lock(&s->lock);
	u = upcie_served_uid_get_(s, cr.uid, true);
	u->nconn++;
	s->conns[slot] = cn;
	s->nconns++;
	pthread_mutex_unlock(&s->lock);
	s->st.clients++;
}

static inline int upcie_served_mem_find_(const struct upcie_served *s,
					 const struct upcie_served_conn_ *cn, uint32_t id)
{
	for (uint32_t m = 0; id && m < s->o.max_mem; m++)
		if (cn->mems[m].used && cn->mems[m].id == id)
			return (int)m;
	return -1;
}

/* Is fd a dma-buf? Asked of /proc's link name: no call into the file's own code. */
static inline bool upcie_served_is_dmabuf_(int fd)
{
	char p[64], t[128];
	ssize_t n;

	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	n = readlink(p, t, sizeof(t) - 1);
	if (n <= 0)
		return false;
	t[n] = 0;
	return !strncmp(t, "/dmabuf:", 8) || !strncmp(t, "anon_inode:dmabuf", 17);
}

static inline int upcie_served_do_mem_reg_(struct upcie_served *s, struct upcie_served_conn_ *cn,
					   const struct upcie_served_req *rq, int fd,
					   struct upcie_served_rsp *rp, size_t *extra)
{
	uint64_t size = rq->u.mem_reg.size;
	struct upcie_served_uid_ *u = upcie_served_uid_get_(s, cn->uid, false);
	struct upcie_served_mem_ *m = NULL;
	struct stat st;
	int seals, err;
	void *va;

	if (fd < 0)
		return UPCIE_FAIL(-EBADF, "served: client %d: MEM_REG without a descriptor",
				  (int)cn->pid);
	if (!size || size & 4095 || size > s->o.max_bytes - cn->bytes)
		return UPCIE_FAIL(-EINVAL,
				  "served: client %d: region of %" PRIu64
				  " bytes (page multiple, %" PRIu64 " of %" PRIu64 " left)",
				  (int)cn->pid, size, s->o.max_bytes - cn->bytes, s->o.max_bytes);
	if (!u || size > s->o.uid_max_bytes - u->bytes)
		return UPCIE_FAIL(-ENOSPC,
				  "served: client %d: uid %u holds %" PRIu64 " of its %" PRIu64
				  " registered bytes, %" PRIu64 " more refused",
				  (int)cn->pid, (unsigned)cn->uid, u ? u->bytes : 0,
				  s->o.uid_max_bytes, size);
	for (uint32_t i = 0; i < s->o.max_mem && !m; i++)
		if (!cn->mems[i].used)
			m = &cn->mems[i];
	if (!m)
		return UPCIE_FAIL(-ENOSPC, "served: client %d: %u regions already", (int)cn->pid,
				  s->o.max_mem);
	/* the seals first: only a memfd answers, and asking calls into no file system */
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 && upcie_served_is_dmabuf_(fd)) {
		/* a dma-buf: no CPU view here (the kernel refuses to mmap most), data only */
		off_t end = lseek(fd, 0, SEEK_END);

		if (!s->map.map_dmabuf)
			return UPCIE_FAIL(-EOPNOTSUPP,
					  "served: client %d: this server maps no "
					  "dma-bufs",
					  (int)cn->pid);
		if (end < 0 || (uint64_t)end < size)
			return UPCIE_FAIL(-EINVAL,
					  "served: client %d: not a dma-buf of at least %" PRIu64
					  " bytes",
					  (int)cn->pid, size);
		err = s->map.map_dmabuf(s->map.ctx, fd, size, &m->dm);
		if (err)
			return err;
		va = NULL;
		goto mapped;
	}
	if (seals < 0)
		return UPCIE_FAIL(-EINVAL,
				  "served: client %d: the descriptor is neither a memfd nor a "
				  "dma-buf",
				  (int)cn->pid);
	if (!(seals & F_SEAL_SHRINK))
		return UPCIE_FAIL(-EPERM,
				  "served: client %d: the memfd must be sealed against "
				  "shrinking (F_SEAL_SHRINK)",
				  (int)cn->pid);
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < size)
		return UPCIE_FAIL(-EINVAL,
				  "served: client %d: the memfd is smaller than %" PRIu64 " bytes",
				  (int)cn->pid, size);
	/* a view for the mapper (the server itself never reads or writes it) */
	va = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (va == MAP_FAILED)
		return UPCIE_FAIL(-errno, "served: client %d: mmap of its memory: %s", (int)cn->pid,
				  strerror(errno));
	err = s->map.map(s->map.ctx, fd, va, size, &m->dm);
	if (err) {
		munmap(va, size);
		return err;
	}
mapped:
	pthread_mutex_lock(&s->lock);
	m->used = true;
	m->id = cn->next_id++;
	m->fd = fd;
	m->va = va;
	m->size = size;
	cn->bytes += size;
	u->bytes += size;
	cn->nmem++;
	pthread_mutex_unlock(&s->lock);
	rp->u.mem_reg.id = m->id;
	if (cn->isolated)
		return 0; /* an isolated client names regions, never device addresses */
	if (m->dm.lut) {
		rp->u.mem_reg.granule_shift = m->dm.granule_shift;
		rp->u.mem_reg.nlut = (uint32_t)m->dm.nlut;
		memcpy(s->scratch + sizeof(*rp), m->dm.lut, m->dm.nlut * sizeof(uint64_t));
		*extra = m->dm.nlut * sizeof(uint64_t);
	} else {
		rp->u.mem_reg.iova = m->dm.iova;
	}
	return 0;
}

static inline bool upcie_served_overlap_(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
	return a < b + blen && b < a + alen;
}

/* [off, off + len) of region m lies in one device-contiguous piece and inside the region. */
static inline bool upcie_served_contig_(const struct upcie_served_mem_ *m, uint64_t off,
					uint64_t len)
{
	if (off > m->size || len > m->size - off)
		return false;
	if (!m->dm.lut)
		return true;
	return (off >> m->dm.granule_shift) == ((off + len - 1) >> m->dm.granule_shift);
}

/* May client cn take one more queue pair? Its slot in *slot. Lock held. */
static inline int upcie_served_qp_room_(struct upcie_served *s, struct upcie_served_conn_ *cn,
					uint32_t *slot)
{
	struct upcie_served_uid_ *u = upcie_served_uid_get_(s, cn->uid, false);
	uint32_t nq = s->c->nqueues;

	*slot = 0;
	for (uint32_t k = 1; k <= UPCIE_SERVED_MAX_QP && !*slot; k++)
		if (!cn->qps[k].used)
			*slot = k;
	if (!*slot || cn->nqp >= s->o.max_qp)
		return UPCIE_FAIL(-ENOSPC, "served: client %d: %u queue pairs already",
				  (int)cn->pid, cn->nqp);
	if (!u || u->nqp >= s->o.uid_max_qp)
		return UPCIE_FAIL(-ENOSPC,
				  "served: client %d: uid %u holds %u queue pairs (its limit)",
				  (int)cn->pid, (unsigned)cn->uid, u ? u->nqp : 0);
	if (s->nqp_all >= nq || (u->nqp && nq - s->nqp_all <= s->o.qp_reserve))
		return UPCIE_FAIL(-ENOSPC,
				  "served: client %d: %u of %u queues in use, the last %u kept for "
				  "users holding none",
				  (int)cn->pid, s->nqp_all, nq, s->o.qp_reserve);
	if (s->failed || s->c->state != UPCIE_NVME_CTRL_READY)
		return UPCIE_FAIL(-ENODEV, "served: the controller failed (restart the server)");
	return 0;
}

/* Count a queue pair made (lock held). */
static inline void upcie_served_qp_count_(struct upcie_served *s, struct upcie_served_conn_ *cn)
{
	struct upcie_served_uid_ *u = upcie_served_uid_get_(s, cn->uid, false);

	cn->nqp++;
	s->nqp_all++;
	if (u)
		u->nqp++;
	s->st.qp_made++;
}

static inline int upcie_served_do_qp_create_(struct upcie_served *s, struct upcie_served_conn_ *cn,
					     const struct upcie_served_req *rq,
					     struct upcie_served_rsp *rp)
{
	uint32_t depth = rq->u.qp_create.depth, slot = 0;
	uint64_t sq = rq->u.qp_create.sq_off, cq = rq->u.qp_create.cq_off;
	uint64_t page = UINT64_C(1) << s->c->page_shift;
	int mi = upcie_served_mem_find_(s, cn, rq->u.qp_create.mem_id);
	struct upcie_nvme_ioq_ext x;
	struct upcie_served_mem_ *m;
	struct upcie_served_qp_ *qp;
	int err;

	if (cn->isolated)
		return UPCIE_FAIL(-EPERM,
				  "served: client %d (uid %u) is isolated: its queue pairs are "
				  "IQP_CREATE's",
				  (int)cn->pid, (unsigned)cn->uid);
	if (mi < 0)
		return UPCIE_FAIL(-ENOENT, "served: client %d: no region %u", (int)cn->pid,
				  rq->u.qp_create.mem_id);
	m = &cn->mems[mi];
	if (!m->va)
		return UPCIE_FAIL(-EINVAL,
				  "served: client %d: rings need memory with a CPU view, region %u "
				  "is a dma-buf",
				  (int)cn->pid, m->id);
	if (depth < 2 || depth > s->o.max_depth)
		return UPCIE_FAIL(-EINVAL, "served: client %d: depth %u outside 2..%u",
				  (int)cn->pid, depth, s->o.max_depth);
	if ((sq | cq) & (page - 1) || !upcie_served_contig_(m, sq, (uint64_t)depth * 64) ||
	    !upcie_served_contig_(m, cq, (uint64_t)depth * 16) ||
	    upcie_served_overlap_(sq, (uint64_t)depth * 64, cq, (uint64_t)depth * 16))
		return UPCIE_FAIL(-EINVAL,
				  "served: client %d: rings at SQ +0x%" PRIx64 " / CQ +0x%" PRIx64
				  " (depth %u) must be %" PRIu64
				  "-byte aligned, apart, and each inside one device-contiguous "
				  "piece of region %u (%zu bytes)",
				  (int)cn->pid, sq, cq, depth, page, m->id, m->size);
	for (uint32_t k = 1; k <= UPCIE_SERVED_MAX_QP; k++) {
		struct upcie_served_qp_ *o = &cn->qps[k];

		if (!o->used || o->iso)
			continue;
		if (o->mem == (uint32_t)mi &&
		    (upcie_served_overlap_(sq, (uint64_t)depth * 64, o->sq_off,
					   (uint64_t)o->depth * 64) ||
		     upcie_served_overlap_(sq, (uint64_t)depth * 64, o->cq_off,
					   (uint64_t)o->depth * 16) ||
		     upcie_served_overlap_(cq, (uint64_t)depth * 16, o->sq_off,
					   (uint64_t)o->depth * 64) ||
		     upcie_served_overlap_(cq, (uint64_t)depth * 16, o->cq_off,
					   (uint64_t)o->depth * 16)))
			return UPCIE_FAIL(-EINVAL, "served: client %d: rings overlap queue %u's",
					  (int)cn->pid, k);
	}
	if (m->kept)
		return UPCIE_FAIL(-EBUSY, "served: client %d: region %u is kept by the controller",
				  (int)cn->pid, m->id);
	pthread_mutex_lock(&s->lock);
	err = upcie_served_qp_room_(s, cn, &slot);
	if (err)
		goto out;
	qp = &cn->qps[slot];
	memset(&x, 0, sizeof(x));
	x.depth = depth;
	/* the server's side of the queue runs on private rings: the client's CQ is never read
	   nor zeroed here (the client zeroes it before asking) */
	qp->shadow = aligned_alloc(64, (size_t)depth * 64);
	err = qp->shadow ? 0 : -ENOMEM;
	if (err)
		goto out;
	memset(qp->shadow, 0, (size_t)depth * 64);
	x.sq = qp->shadow;
	x.cq = qp->shadow;
	if (upcie_dmamem_iova(&m->dm, sq, &x.sq_iova) ||
	    upcie_dmamem_iova(&m->dm, cq, &x.cq_iova)) {
		err = -EINVAL;
		goto free;
	}
	err = upcie_nvme_ioq_create_ext(&qp->q, s->c, &x);
	if (err) {
		upcie_served_after_(s);
		if (err == -EBUSY) {
			m->kept = true; /* the controller may hold a CQ on it */
			qp->shadow =
			    NULL; /* with the queue object the controller table points at */
			goto out;
		}
		goto free;
	}
	qp->used = true;
	qp->mem = (uint32_t)mi;
	qp->depth = depth;
	qp->sq_off = sq;
	qp->cq_off = cq;
	qp->sq_db = upcie_nvme_sq_tdbl_off(qp->q.qid, s->c->dstrd);
	qp->cq_db = upcie_nvme_cq_hdbl_off(qp->q.qid, s->c->dstrd);
	m->nqp++;
	upcie_served_qp_count_(s, cn);
	cn->relay->slot[slot].sq_tail = 0;
	cn->relay->slot[slot].cq_head = 0;
	__atomic_store_n(&cn->relay->slot[slot].state, UPCIE_SERVED_SLOT_LIVE, __ATOMIC_RELEASE);
	qp->last_sq = 0;
	qp->last_cq = 0;
	/* a client that maps its doorbells writes none here: nothing to forward */
	qp->relay = !cn->direct;
	if (qp->relay && !s->nrelay++)
		pthread_cond_signal(&s->relay_cv);
	if (qp->relay)
		upcie_served_kick_(s); /* a sleeping poller tells this client too */
	rp->u.qp_create.slot = slot;
	rp->u.qp_create.qid = qp->q.qid;
	goto out;
free:
	free(qp->shadow);
	qp->shadow = NULL;
out:
	pthread_mutex_unlock(&s->lock);
	return err;
}

/* An isolated queue pair of `depth`: the server's own queue, the client's ring memfd in *fd. */
static inline int upcie_served_do_iqp_create_(struct upcie_served *s, struct upcie_served_conn_ *cn,
					      const struct upcie_served_req *rq,
					      struct upcie_served_rsp *rp, int *fd)
{
	uint32_t depth = rq->u.iqp_create.depth, slot;
	struct upcie_nvme_ioq_opts io;
	struct upcie_served_qp_ *qp;
	void *va = NULL;
	int err;

	if (depth < 2 || depth > s->o.max_depth)
		return UPCIE_FAIL(-EINVAL, "served: client %d: depth %u outside 2..%u",
				  (int)cn->pid, depth, s->o.max_depth);
	pthread_mutex_lock(&s->lock);
	err = upcie_served_qp_room_(s, cn, &slot);
	if (err)
		goto out;
	qp = &cn->qps[slot];
	memset(qp, 0, sizeof(*qp));
	qp->ring_size = (size_t)upcie_served_ring_bytes(depth);
	qp->cmds = (struct upcie_served_iocmd_ *)calloc(depth, sizeof(*qp->cmds));
	*fd = qp->cmds ? upcie_served_shm_("upcie-served-ring", qp->ring_size, &va) : -ENOMEM;
	if (*fd < 0) {
		err = UPCIE_FAIL(*fd, "served: client %d: ring memory of %zu bytes: %s",
				 (int)cn->pid, qp->ring_size, upcie_errno_name(*fd));
		*fd = -1;
		goto free;
	}
	qp->ring = (struct upcie_served_ring *)va;
	qp->subs = (struct upcie_served_sub *)(qp->ring + 1);
	qp->cpls = (struct upcie_served_cpl *)(qp->subs + depth);
	for (uint32_t i = 0; i < depth; i++)
		qp->cmds[i].next = (uint16_t)(i + 1 < depth ? i + 1 : depth);
	qp->free_cmd = 0;
	upcie_served_ns_refresh_(s); /* geometry as the controller says now */
	memset(&io, 0, sizeof(io));
	io.depth = depth;
	io.max_xfer = s->o.iso_max_xfer;
	/* a vector of its own (vector 0 is the admin queue's): the poller sleeps on it */
	for (uint32_t v = 1; v < s->c->irqs.count && !io.irq; v++) {
		bool used = false;

		for (uint32_t k = 1; k <= s->c->nslots; k++)
			used |= s->c->ioqs[k] && s->c->ioqs[k]->irq && s->c->ioqs[k]->vector == v;
		if (!used) {
			io.irq = true;
			io.vector = (uint16_t)v;
		}
	}
	err = upcie_nvme_ioq_create(&qp->q, s->c, &io);
	if (err) {
		upcie_served_after_(s);
		goto free;
	}
	qp->used = true;
	qp->iso = true;
	qp->cn = cn;
	qp->depth = depth;
	upcie_served_qp_count_(s, cn);
	__atomic_store_n(&cn->relay->slot[slot].state, UPCIE_SERVED_SLOT_LIVE, __ATOMIC_RELEASE);
	if (!s->nrelay++)
		pthread_cond_signal(&s->relay_cv);
	upcie_served_kick_(s); /* a sleeping poller tells this client too */
	rp->u.iqp_create.slot = slot;
	rp->u.iqp_create.depth = depth;
	rp->u.iqp_create.ring_size = qp->ring_size;
	goto out;
free:
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
	upcie_served_iso_free_(qp);
	memset(qp, 0, sizeof(*qp));
out:
	pthread_mutex_unlock(&s->lock);
	return err;
}

/* Is client cn trusted (may create trusted queue pairs)? */
static inline bool upcie_served_trusted_(const struct upcie_served *s,
					 const struct upcie_served_conn_ *cn)
{
	switch (s->o.trust) {
	case UPCIE_SERVED_TRUST_ALL:
		return true;
	case UPCIE_SERVED_TRUST_NONE:
		return false;
	default:
		return cn->uid == 0 || cn->uid == geteuid();
	}
}

/* The whole device's descriptor, for a trusted client; *fd is ours to close. */
static inline int upcie_served_do_doorbells_(struct upcie_served *s, struct upcie_served_conn_ *cn,
					     struct upcie_served_rsp *rp, int *fd)
{
	const struct upcie_nvme_dev *d = &s->c->dev;
	uint64_t base = 0;
	char path[256];

	if (!s->o.direct_whole_device || cn->isolated)
		return UPCIE_FAIL(-EPERM,
				  "served: client %d (uid %u): the whole device is not handed out "
				  "(server option, trusted clients only)",
				  (int)cn->pid, (unsigned)cn->uid);
	if (!d->open)
		return -EOPNOTSUPP;
	if (d->path == UPCIE_NVME_PATH_UIO) {
		int err = upcie_pci_func_path(&d->bdf, "resource0", path, sizeof(path));

		if (err)
			return err;
		*fd = open(path, O_RDWR | O_CLOEXEC);
	} else {
		*fd = fcntl(d->vdev.fd, F_DUPFD_CLOEXEC, 3);
		base = d->bar0r.offset;
	}
	if (*fd < 0)
		return UPCIE_FAIL(-errno, "served: device descriptor: %s", strerror(errno));
	UPCIE_WARN("served: client %d (uid %u) takes the whole device (%s): it can reach every "
		   "register and queue, and keeps the device open if this server dies",
		   (int)cn->pid, (unsigned)cn->uid,
		   d->path == UPCIE_NVME_PATH_UIO ? "resource0" : "the vfio device fd");
	rp->u.doorbells.offset = base + 0x1000;
	rp->u.doorbells.size = (uint32_t)upcie_align_up(
	    upcie_nvme_cq_hdbl_off((uint16_t)s->c->nqueues, s->c->dstrd) + 4 - 0x1000, 4096);
	rp->u.doorbells.regs = base;
	cn->direct = true;
	return 0;
}

/* One request of client i. Returns false when the client must be dropped. */
static inline bool upcie_served_serve_(struct upcie_served *s, uint32_t i)
{
	struct upcie_served_conn_ *cn = s->conns[i];
	struct upcie_served_req rq;
	struct upcie_served_rsp *rp = (struct upcie_served_rsp *)s->scratch;
	size_t extra = 0;
	int fd = -1, sfd = -1, err = 0;
	ssize_t n = upcie_served_recv_(cn->fd, &rq, sizeof(rq), &fd, MSG_DONTWAIT);

	if (n == -EAGAIN)
		return true;
	if (n <= 0 && n != -EMSGSIZE)
		return false; /* hung up */
	memset(rp, 0, sizeof(*rp));
	rp->magic = UPCIE_SERVED_MAGIC;
	if (n != (ssize_t)sizeof(rq) || rq.magic != UPCIE_SERVED_MAGIC ||
	    (!cn->hello && rq.op != UPCIE_SERVED_OP_HELLO)) {
		s->st.bad++;
		if (fd >= 0)
			close(fd);
		/* not our protocol: answer once, then hang up (framing cannot be trusted) */
		rp->err = -EPROTO;
		upcie_served_send_(cn->fd, rp, sizeof(*rp), -1);
		return false;
	}
	rp->op = rq.op;
	rp->seq = rq.seq;
	switch (rq.op) {
	case UPCIE_SERVED_OP_HELLO:
		if (rq.u.hello.version != UPCIE_SERVED_VERSION) {
			err = UPCIE_FAIL(-EPROTONOSUPPORT,
					 "served: client %d speaks version %u, "
					 "the server %u",
					 (int)cn->pid, rq.u.hello.version, UPCIE_SERVED_VERSION);
			break;
		}
		if (cn->hello) {
			err = UPCIE_FAIL(-EALREADY, "served: client %d: a second HELLO",
					 (int)cn->pid);
			break;
		}
		cn->hello = true;
		cn->isolated = !upcie_served_trusted_(s, cn) ||
			       (rq.u.hello.flags & UPCIE_SERVED_HELLO_ISOLATED);
		rp->u.hello.version = UPCIE_SERVED_VERSION;
		rp->u.hello.path = s->c->dev.open ? (uint32_t)s->c->dev.path : 0;
		rp->u.hello.page_shift = s->c->page_shift;
		rp->u.hello.mqes = s->c->mqes;
		rp->u.hello.dstrd = s->c->dstrd;
		rp->u.hello.max_qp = s->o.max_qp;
		rp->u.hello.max_mem = s->o.max_mem;
		rp->u.hello.max_depth = s->o.max_depth;
		rp->u.hello.max_bytes = s->o.max_bytes;
		rp->u.hello.max_xfer = cn->isolated ? s->o.iso_max_xfer : s->c->max_xfer;
		rp->u.hello.hugetlb = s->map.hugetlb;
		rp->u.hello.direct_db = s->o.direct_whole_device && !cn->isolated;
		rp->u.hello.server_pid = (int32_t)getpid();
		rp->u.hello.relay_size = sizeof(*cn->relay);
		rp->u.hello.isolated = cn->isolated;
		sfd = cn->relay_fd;
		break;
	case UPCIE_SERVED_OP_MEM_REG:
		err = upcie_served_do_mem_reg_(s, cn, &rq, fd, rp, &extra);
		if (!err)
			fd = -1; /* the region owns it */
		break;
	case UPCIE_SERVED_OP_MEM_UNREG: {
		int m = upcie_served_mem_find_(s, cn, rq.u.mem_unreg.id);

		pthread_mutex_lock(&s->lock);
		if (m < 0)
			err = UPCIE_FAIL(-ENOENT, "served: client %d: no region %u", (int)cn->pid,
					 rq.u.mem_unreg.id);
		else if (cn->mems[m].nqp || cn->mems[m].kept || cn->mems[m].inflight)
			err = UPCIE_FAIL(-EBUSY,
					 "served: client %d: region %u holds queues or commands",
					 (int)cn->pid, rq.u.mem_unreg.id);
		else
			upcie_served_mem_drop_(s, cn, &cn->mems[m]);
		pthread_mutex_unlock(&s->lock);
		break;
	}
	case UPCIE_SERVED_OP_QP_CREATE:
		err = upcie_served_do_qp_create_(s, cn, &rq, rp);
		break;
	case UPCIE_SERVED_OP_IQP_CREATE:
		err = upcie_served_do_iqp_create_(s, cn, &rq, rp, &sfd);
		break;
	case UPCIE_SERVED_OP_QP_DELETE:
		if (!rq.u.qp_delete.slot || rq.u.qp_delete.slot > UPCIE_SERVED_MAX_QP ||
		    !cn->qps[rq.u.qp_delete.slot].used)
			err = UPCIE_FAIL(-ENOENT, "served: client %d: no queue pair %u",
					 (int)cn->pid, rq.u.qp_delete.slot);
		else
			err = upcie_served_qp_drop_(s, cn, rq.u.qp_delete.slot);
		break;
	case UPCIE_SERVED_OP_IDENTIFY:
		if (rq.u.identify.cns > UPCIE_NVME_CNS_NS_DESC_LIST) {
			err = UPCIE_FAIL(-EPERM, "served: client %d: Identify CNS %u not served",
					 (int)cn->pid, rq.u.identify.cns);
			break;
		}
		pthread_mutex_lock(&s->lock);
		if (s->failed) {
			err = UPCIE_FAIL(-ENODEV, "served: the controller failed (restart the "
						  "server)");
		} else {
			err =
			    upcie_nvme_ctrl_identify(s->c, (uint8_t)rq.u.identify.cns,
						     rq.u.identify.nsid, s->scratch + sizeof(*rp));
			if (!err)
				extra = 4096;
			upcie_served_after_(s);
		}
		pthread_mutex_unlock(&s->lock);
		break;
	case UPCIE_SERVED_OP_DOORBELLS:
		err = upcie_served_do_doorbells_(s, cn, rp, &sfd);
		break;
	case UPCIE_SERVED_OP_VF:
		pthread_mutex_lock(&s->lock);
		err = upcie_served_vf_give_(s, cn, rp, &sfd);
		upcie_served_after_(s);
		pthread_mutex_unlock(&s->lock);
		break;
	case UPCIE_SERVED_OP_WAKE:
		/* the connection's own eventfd: what it does with it wakes or fails only itself */
		pthread_mutex_lock(&s->lock);
		if (cn->wake_fd < 0)
			cn->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (cn->wake_fd < 0)
			err = UPCIE_FAIL(-errno, "served: client %d: wake eventfd: %s",
					 (int)cn->pid, strerror(errno));
		else
			sfd = cn->wake_fd;
		pthread_mutex_unlock(&s->lock);
		upcie_served_kick_(s);
		break;
	default:
		err = UPCIE_FAIL(-EOPNOTSUPP, "served: client %d: unknown request %u", (int)cn->pid,
				 rq.op);
	}
	if (fd >= 0)
		close(fd);
	if (err)
		s->st.bad++;
	rp->err = err;
	err = upcie_served_send_(cn->fd, rp, sizeof(*rp) + (err ? 0 : extra), err ? -1 : sfd);
	if (sfd >= 0 && sfd != cn->relay_fd && sfd != cn->wake_fd)
		close(sfd);
	return !err;
}

/*
 * Serve until *stop becomes non-zero (checked at least every 100 ms): accept clients, answer
 * their requests, clean up after those that hang up or do not say HELLO in time. Returns 0,
 * or -errno of poll().
 */
static inline int upcie_served_run(struct upcie_served *s, volatile int *stop)
{
	struct pollfd *pf;
	uint32_t *idx;
	int err = 0;

	if (!s || s->lfd < 0 || !stop)
		return -EINVAL;
	pf = (struct pollfd *)calloc(s->o.max_clients + 1, sizeof(*pf));
	idx = (uint32_t *)calloc(s->o.max_clients + 1, sizeof(*idx));
	if (!pf || !idx) {
		free(pf);
		free(idx);
		return -ENOMEM;
	}
	while (!*stop) {
		uint64_t now = upcie_time_ns();
		nfds_t n = 1;
		int r;

		for (uint32_t i = 0; i < s->o.max_clients; i++) {
			struct upcie_served_conn_ *cn = s->conns[i];

			if (cn && !cn->hello &&
			    now - cn->t_accept > (uint64_t)s->o.hello_timeout_ms * 1000000) {
				UPCIE_ERR("served: client %d (uid %u): no HELLO in %u ms: closed",
					  (int)cn->pid, (unsigned)cn->uid, s->o.hello_timeout_ms);
				s->st.timeouts++;
				upcie_served_conn_drop_(s, i);
			}
		}
		pf[0].fd = s->lfd;
		pf[0].events = POLLIN;
		for (uint32_t i = 0; i < s->o.max_clients; i++) {
			if (!s->conns[i])
				continue;
			pf[n].fd = s->conns[i]->fd;
			pf[n].events = POLLIN;
			idx[n++] = i;
		}
		r = poll(pf, n, 100);
		if (r < 0 && errno != EINTR) {
			err = -errno;
			break;
		}
		for (nfds_t k = 1; r > 0 && k < n; k++) {
			if (!pf[k].revents)
				continue;
			if (!upcie_served_serve_(s, idx[k])) {
				s->st.gone++;
				upcie_served_conn_drop_(s, idx[k]);
			}
		}
		if (r > 0 && pf[0].revents & POLLIN)
			upcie_served_accept_(s);
	}
	free(pf);
	free(idx);
	return err;
}

/*
 * Stop serving: clients' relay pages say STOPPING, every client's queues are deleted and its
 * memory given back as on a hang-up, the socket file removed (when it is still ours). The
 * controller stays the caller's (upcie_nvme_ctrl_close() shuts it down). Kept regions stay
 * mapped until exit.
 */
static inline void upcie_served_fini(struct upcie_served *s)
{
	if (!s || !s->conns)
		return;
	for (uint32_t i = 0; i < s->o.max_clients; i++)
		if (s->conns[i])
			__atomic_store_n(&s->conns[i]->relay->slot[0].state,
					 UPCIE_SERVED_SLOT_STOPPING, __ATOMIC_RELEASE);
	for (uint32_t i = 0; i < s->o.max_clients; i++)
		if (s->conns[i])
			upcie_served_conn_drop_(s, i);
	if (s->relay_live) {
		pthread_mutex_lock(&s->lock);
		__atomic_store_n(&s->relay_stop, 1, __ATOMIC_RELEASE);
		pthread_cond_signal(&s->relay_cv);
		pthread_mutex_unlock(&s->lock);
		upcie_served_kick_(s);
		pthread_join(s->relay, NULL);
		pthread_cond_destroy(&s->relay_cv);
		pthread_mutex_destroy(&s->lock);
	}
	upcie_served_release_(s);
}

#endif /* UPCIE_SERVED_SERVER_H */
