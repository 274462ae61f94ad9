/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Served queue pairs, the server: one process owns the controller (any path: uio, vfio type1,
 * vfio cdev + iommufd) and hands I/O queue pairs to client processes over a Unix socket
 * (served/client.h). The data path does not pass through here: a client's SQ, CQ, PRP
 * lists and data live in memory the client registered (a memfd it passed; mapped here for the
 * controller), and the client submits and reaps directly. Doorbells are relayed: the client's
 * queue pair writes them into a shared relay page, a server thread forwards each new value to
 * the controller (values outside the queue are dropped). Clients the server trusts (root, or
 * its own user, when the server allows it) may map the doorbell page themselves instead.
 *
 * Guarantees:
 * - A client that goes away for any reason (exit, kill -9) is noticed by its socket hanging up.
 *   Its queues are deleted (Delete I/O SQ, then CQ), and only when the controller confirmed the
 *   deletion, or was reset, is its memory unmapped; a queue that could not be deleted keeps its
 *   memory mapped for the server's lifetime (counted in `kept`). Other clients carry on, unless
 *   the controller had to be reset: then their queues are marked lost in their relay pages and
 *   their commands end with -ENODEV on their side (the controller let go of them).
 * - A client's requests are checked (its own regions and slots only, offsets, sizes, alignment,
 *   limits per client): a bad one gets an error and changes nothing.
 * - What the server cannot enforce: once a client has a queue, its commands make the controller
 *   read and write any device address it names. Clients share the device's one IOVA space
 *   (type1, iommufd) or physical memory (uio), and commands are not inspected: a client can
 *   reach other clients' registered memory, the server's queue memory (type1, iommufd), or any
 *   RAM (uio). Access control is who may connect (the socket's mode and group, and `allow_uid`);
 *   a connected client is trusted with the device's DMA reach, as the process owning the
 *   controller would be. Unprivileged clients need no memlock allowance of their own (the
 *   server's mapping is charged), which is a convenience, not a sandbox.
 * - On uio nothing pins a client's memory: the server's mapping and descriptor keep its
 *   hugepages allocated, but a client that punches holes in its own memfd frees pages the
 *   controller still addresses. Such a client can already aim commands at any physical address;
 *   type1 and iommufd pin the pages until the server unmaps them.
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
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
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
#include <upcie/served/proto.h>

#ifndef F_GET_SEALS
#define F_GET_SEALS 1034
#endif
#ifndef F_SEAL_SHRINK
#define F_SEAL_SHRINK 0x0002
#endif

/*
 * How client memory is mapped for the controller: map() fills `mem` for [vaddr, vaddr + size),
 * the server's view of the client's file `fd`; upcie_dmamem_destroy() undoes it. `hugetlb`:
 * the memory must be hugetlb (a physical LUT per hugepage). NULL in upcie_served_init(): the
 * mapper of the controller's own path (c->dev): uio a LUT of the hugepages' physical
 * addresses; type1 a pinned mapping of the server's view; iommufd IOMMU_IOAS_MAP_FILE of the
 * file (Linux >= 6.13; older kernels: a mapping of the server's view), and on iommufd only, a
 * dma-buf the kernel imports with MAP_FILE (a vfio BAR export on Linux >= 6.19; GPU runtimes'
 * dma-bufs are refused by the kernel, see docs/results/vfio-iommufd-guest.md).
 */
struct upcie_served_mapper {
	int (*map)(void *ctx, int fd, void *vaddr, size_t size, struct upcie_dmamem *mem);
	/* a dma-buf `fd` (no CPU view): NULL where the path cannot map one */
	int (*map_dmabuf)(void *ctx, int fd, size_t size, struct upcie_dmamem *mem);
	void *ctx;
	bool hugetlb;
};

struct upcie_served_opts {
	const char *path;      /* socket path (created; an existing socket file is replaced) */
	mode_t mode;	       /* of the socket file; 0: 0600 */
	gid_t gid;	       /* group of the socket file; (gid_t)-1: unchanged */
	long allow_uid;	       /* -1: any peer that can open the socket; else only this uid and 0 */
	uint32_t max_clients;  /* 0: 64 */
	uint32_t max_qp;       /* queue pairs per client, 0: 16 (at most UPCIE_SERVED_MAX_QP) */
	uint32_t max_mem;      /* regions per client, 0: 16 */
	uint64_t max_bytes;    /* registered bytes per client, 0: 1 GiB */
	uint32_t max_depth;    /* entries per queue, 0: CAP.MQES + 1 */
	bool direct_doorbells; /* grant OP_DOORBELLS to root and the server's own uid */
	uint64_t relay_spin_ns; /* relay spins this long after the last doorbell, then naps;
				   0: 2 ms */
};

#ifdef UPCIE_SERVED_TEST_HOOKS
/* Tests only: a client's memory is given back before its queues are deleted (the negative
 * control of the rule that memory goes only after the controller let go). */
static int upcie_served_test_unmap_first_;
#endif

struct upcie_served_stats {
	uint64_t clients; /* accepted */
	uint64_t refused; /* connections refused (credentials, limit) */
	uint64_t gone;	  /* clients that hung up */
	uint64_t qp_made; /* queue pairs created */
	uint64_t qp_gone; /* deleted with the controller's confirmation */
	uint64_t qp_lost; /* taken by a controller reset */
	uint64_t kept;	  /* regions kept mapped: a queue on them could not be deleted */
	uint64_t bad;	  /* requests refused */
	uint64_t resets;  /* controller resets done by the server */
	uint64_t relayed; /* doorbell values forwarded */
	uint64_t dropped; /* doorbell values refused (outside the queue) */
};

struct upcie_served_mem_ {
	bool used;
	bool kept; /* the controller may still use it: never unmapped */
	uint32_t id;
	int fd;
	void *va;
	size_t size;
	uint32_t nqp;
	struct upcie_dmamem dm;
};

struct upcie_served_qp_ {
	struct upcie_nvme_ioq q;
	bool used;
	bool relay;   /* forwarded by the relay thread (under srv->lock) */
	uint32_t mem; /* index into the client's mems */
	uint32_t depth;
	uint32_t last_sq, last_cq;
	uint64_t sq_off, cq_off;
	size_t sq_db, cq_db; /* doorbell offsets in BAR0 */
};

struct upcie_served_conn_ {
	int fd;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	bool direct;
	int relay_fd;
	struct upcie_served_relay *relay;
	uint32_t nmem, nqp, next_id;
	uint64_t bytes;
	struct upcie_served_mem_ *mems; /* max_mem */
	struct upcie_served_qp_ qps[UPCIE_SERVED_MAX_QP + 1];
};

struct upcie_served {
	struct upcie_nvme_ctrl *c;
	struct upcie_served_mapper map;
	struct upcie_served_opts o;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int lfd;
	struct upcie_served_conn_ **conns; /* max_clients */
	uint32_t nconns;
	pthread_mutex_t lock;	 /* conns' relay state, against the relay thread */
	pthread_cond_t relay_cv; /* signalled when a queue is put on the relay */
	uint32_t nrelay;	 /* queues on the relay */
	pthread_t relay;
	bool relay_live;
	volatile int relay_stop;
	struct upcie_served_stats st;
	uint8_t *scratch; /* message buffer */
};

/* Built-in mappers: the controller's own path. */
static inline int upcie_served_map_lut_(void *ctx, int fd, void *vaddr, size_t size,
					struct upcie_dmamem *mem)
{
	struct upcie_hugepage view;
	struct statfs sf;
	unsigned shift;
	uint64_t *lut;
	size_t n;
	int err;

	(void)ctx;
	if (fstatfs(fd, &sf) || (uint64_t)sf.f_type != UPCIE_HUGETLBFS_MAGIC)
		return UPCIE_FAIL(-EINVAL, "served: uio needs hugetlb memory (a memfd made with "
					   "MFD_HUGETLB)");
	shift = (unsigned)upcie_log2((uint64_t)sf.f_bsize);
	if ((UINT64_C(1) << shift) != (uint64_t)sf.f_bsize || size & ((size_t)sf.f_bsize - 1))
		return UPCIE_FAIL(-EINVAL, "served: size %zu not a multiple of the hugepage %ld",
				  size, (long)sf.f_bsize);
	n = size >> shift;
	if (n > UPCIE_SERVED_MAX_LUT)
		return UPCIE_FAIL(-EINVAL, "served: %zu hugepages, at most %u per region", n,
				  UPCIE_SERVED_MAX_LUT);
	lut = (uint64_t *)calloc(n, sizeof(*lut));
	if (!lut)
		return -ENOMEM;
	/* the client's memory seen as hugepages of this process (no allocation behind it) */
	memset(&view, 0, sizeof(view));
	view.vaddr = vaddr;
	view.size = size;
	view.pagesize = (size_t)sf.f_bsize;
	view.fd = fd;
	view.src = UPCIE_HUGEPAGE_MEMFD;
	err = upcie_hugepage_phys_lut(&view, lut, n);
	if (err) {
		free(lut);
		return err;
	}
	return upcie_dmamem_init_lut(mem, vaddr, size, shift, lut, true);
}

static inline int upcie_served_map_dev_(void *ctx, int fd, void *vaddr, size_t size,
					struct upcie_dmamem *mem)
{
	struct upcie_nvme_dev *dev = (struct upcie_nvme_dev *)ctx;

	switch (dev->path) {
	case UPCIE_NVME_PATH_UIO:
		return upcie_served_map_lut_(ctx, fd, vaddr, size, mem);
	case UPCIE_NVME_PATH_TYPE1:
		return upcie_dmamem_type1_map(mem, dev->container, vaddr, size, 0);
	default:
		/* by file: pinned through the memfd, not through this process's mapping */
		if (!upcie_dmamem_iommufd_map_file(mem, dev->ioas, fd, 0, size, vaddr))
			return 0;
		return upcie_dmamem_iommufd_map(mem, dev->ioas, vaddr, size);
	}
}

static inline int upcie_served_map_dmabuf_dev_(void *ctx, int fd, size_t size,
					       struct upcie_dmamem *mem)
{
	struct upcie_nvme_dev *dev = (struct upcie_nvme_dev *)ctx;

	if (dev->path != UPCIE_NVME_PATH_IOMMUFD)
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "served: a dma-buf can only be mapped on the iommufd path "
				  "(this server: %s)",
				  upcie_nvme_path_name(dev->path));
	return upcie_dmamem_iommufd_map_file(mem, dev->ioas, fd, 0, size, NULL);
}

/*
 * Forward the client's doorbell word `w` to BAR0 offset `db` when it changed since *last;
 * a value outside the queue is dropped. Returns 1 when a doorbell was written.
 */
static inline unsigned upcie_served_forward_(struct upcie_served *s, volatile uint32_t *w,
					     uint32_t *last, uint32_t depth, size_t db)
{
	uint32_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);

	if (v == *last)
		return 0;
	*last = v;
	if (v >= depth) {
		s->st.dropped++;
		return 0;
	}
	upcie_mb(); /* what the client wrote before the doorbell (its SQEs) first */
	upcie_mmio_write32(s->c->regs, db, v);
	return 1;
}

/* Relay: forward new doorbell values of every relayed queue. Returns values forwarded. */
static inline unsigned upcie_served_relay_sweep_(struct upcie_served *s)
{
	unsigned n = 0;

	for (uint32_t i = 0; i < s->o.max_clients; i++) {
		struct upcie_served_conn_ *cn = s->conns[i];

		for (uint32_t k = 1; cn && k <= UPCIE_SERVED_MAX_QP; k++) {
			struct upcie_served_qp_ *qp = &cn->qps[k];
			struct upcie_served_relay_slot *sl = &cn->relay->slot[k];

			if (!qp->relay)
				continue;
			n += upcie_served_forward_(s, &sl->sq_tail, &qp->last_sq, qp->depth,
						   qp->sq_db);
			n += upcie_served_forward_(s, &sl->cq_head, &qp->last_cq, qp->depth,
						   qp->cq_db);
		}
	}
	return n;
}

static inline void *upcie_served_relay_main_(void *arg)
{
	struct upcie_served *s = (struct upcie_served *)arg;
	uint64_t last = upcie_time_ns(), nap = 20000;

	pthread_mutex_lock(&s->lock);
	while (!__atomic_load_n(&s->relay_stop, __ATOMIC_ACQUIRE)) {
		unsigned n;

		if (!s->nrelay) {
			/* nothing to forward (no queue, or every client maps its doorbells) */
			pthread_cond_wait(&s->relay_cv, &s->lock);
			last = upcie_time_ns();
			continue;
		}
		n = upcie_served_relay_sweep_(s);
		s->st.relayed += n;
		pthread_mutex_unlock(&s->lock);
		if (n) {
			last = upcie_time_ns();
			nap = 20000;
		} else if (upcie_time_ns() - last > s->o.relay_spin_ns) {
			/* idle: nap, longer each time up to 1 ms (a doorbell then waits that long) */
			struct timespec ts = { 0, (long)nap };

			nanosleep(&ts, NULL);
			if (nap < 1000000)
				nap *= 2;
		} else {
			upcie_cpu_relax();
		}
		pthread_mutex_lock(&s->lock);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* Close the socket (removing its file), free the tables, zero `s`. */
static inline void upcie_served_release_(struct upcie_served *s)
{
	if (s->lfd >= 0) {
		close(s->lfd);
		unlink(s->path);
	}
	free(s->conns);
	free(s->scratch);
	memset(s, 0, sizeof(*s));
	s->lfd = -1;
}

/*
 * Serve `c` (open and ready) on the socket opts->path. `map` NULL: map client memory the way
 * c->dev's path does (a controller without a dev needs a mapper). Creates the socket and
 * starts the relay thread. Returns 0, -EINVAL, -EADDRINUSE (a live server answers there),
 * -ENOMEM, or the socket calls' errors. `s` is zeroed on failure.
 */
static inline int upcie_served_init(struct upcie_served *s, struct upcie_nvme_ctrl *c,
				    const struct upcie_served_mapper *map,
				    const struct upcie_served_opts *opts)
{
	struct sockaddr_un sa;
	int err, probe;

	if (!s)
		return UPCIE_FAIL(-EINVAL, "served: NULL server");
	memset(s, 0, sizeof(*s));
	s->lfd = -1;
	if (!c || c->state != UPCIE_NVME_CTRL_READY || !opts || !opts->path)
		return UPCIE_FAIL(-EINVAL, "served: controller not ready or no socket path");
	if (!map && !c->dev.open)
		return UPCIE_FAIL(-EINVAL, "served: a controller without a PCI function needs a "
					   "mapper");
	if (strlen(opts->path) >= sizeof(sa.sun_path))
		return UPCIE_FAIL(-EINVAL, "served: socket path too long: %s", opts->path);
	s->c = c;
	s->o = *opts;
	if (!s->o.mode)
		s->o.mode = 0600;
	if (!s->o.max_clients)
		s->o.max_clients = 64;
	if (!s->o.max_qp)
		s->o.max_qp = 16;
	if (s->o.max_qp > UPCIE_SERVED_MAX_QP)
		s->o.max_qp = UPCIE_SERVED_MAX_QP;
	if (!s->o.max_mem)
		s->o.max_mem = 16;
	if (!s->o.max_bytes)
		s->o.max_bytes = UINT64_C(1) << 30;
	if (!s->o.max_depth || s->o.max_depth > c->mqes)
		s->o.max_depth = c->mqes;
	if (!s->o.relay_spin_ns)
		s->o.relay_spin_ns = 2000000;
	if (map) {
		s->map = *map;
	} else {
		s->map.map = upcie_served_map_dev_;
		s->map.map_dmabuf = upcie_served_map_dmabuf_dev_;
		s->map.ctx = &c->dev;
		s->map.hugetlb = c->dev.path == UPCIE_NVME_PATH_UIO;
	}
	snprintf(s->path, sizeof(s->path), "%s", opts->path);
	s->conns = (struct upcie_served_conn_ **)calloc(s->o.max_clients, sizeof(*s->conns));
	s->scratch = (uint8_t *)malloc(UPCIE_SERVED_MSG_MAX);
	if (!s->conns || !s->scratch) {
		err = -ENOMEM;
		goto fail;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, s->path, strlen(s->path));
	/* a socket file left by a dead server is replaced; a live server's is not */
	probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (probe >= 0) {
		if (!connect(probe, (struct sockaddr *)&sa, sizeof(sa))) {
			close(probe);
			err = UPCIE_FAIL(-EADDRINUSE, "served: a server answers on %s", s->path);
			goto fail;
		}
		close(probe);
	}
	unlink(s->path);
	s->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s->lfd < 0) {
		err = -errno;
		goto fail;
	}
	if (bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(s->lfd, 64)) {
		err = UPCIE_FAIL(-errno, "served: bind/listen on %s: %s", s->path, strerror(errno));
		goto fail;
	}
	if (chmod(s->path, s->o.mode) ||
	    (s->o.gid != (gid_t)-1 && chown(s->path, (uid_t)-1, s->o.gid))) {
		err = UPCIE_FAIL(-errno, "served: mode/group of %s: %s", s->path, strerror(errno));
		goto fail;
	}
	err = -pthread_mutex_init(&s->lock, NULL);
	if (err)
		goto fail;
	err = -pthread_cond_init(&s->relay_cv, NULL);
	if (err) {
		pthread_mutex_destroy(&s->lock);
		goto fail;
	}
	err = -pthread_create(&s->relay, NULL, upcie_served_relay_main_, s);
	if (err) {
		pthread_cond_destroy(&s->relay_cv);
		pthread_mutex_destroy(&s->lock);
		goto fail;
	}
	s->relay_live = true;
	return 0;
fail:
	upcie_served_release_(s);
	return err;
}

/* Take queue `k` of `cn` off the relay (before it is deleted). */
static inline void upcie_served_unrelay_(struct upcie_served *s, struct upcie_served_qp_ *qp)
{
	pthread_mutex_lock(&s->lock);
	if (qp->relay)
		s->nrelay--;
	qp->relay = false;
	pthread_mutex_unlock(&s->lock);
}

/*
 * The controller is not ready (a deletion or an admin command failed, and it was stopped):
 * reset it, which takes every served queue (each is marked lost). Returns the reset's result.
 */
static inline int upcie_served_recover_(struct upcie_served *s)
{
	int err;

	if (s->c->state == UPCIE_NVME_CTRL_READY && !s->c->stopped)
		return 0;
	s->st.resets++;
	err = upcie_nvme_ctrl_reset(s->c);
	if (err)
		UPCIE_ERR("served: controller reset failed (%s): the clients' queues are lost",
			  upcie_errno_name(err));
	return err;
}

/* Mark queues a reset took as lost in their relay pages. */
static inline void upcie_served_mark_lost_(struct upcie_served *s)
{
	for (uint32_t i = 0; i < s->o.max_clients; i++) {
		struct upcie_served_conn_ *cn = s->conns[i];

		for (uint32_t k = 1; cn && k <= UPCIE_SERVED_MAX_QP; k++) {
			struct upcie_served_qp_ *qp = &cn->qps[k];

			if (!qp->used || !qp->q.lost ||
			    cn->relay->slot[k].state == UPCIE_SERVED_SLOT_LOST)
				continue;
			upcie_served_unrelay_(s, qp);
			s->st.qp_lost++;
			__atomic_store_n(&cn->relay->slot[k].state, UPCIE_SERVED_SLOT_LOST,
					 __ATOMIC_RELEASE);
		}
	}
}

/*
 * Delete queue `k` of `cn`: 0 when the controller let go of it (the slot is free, its region
 * may go); -EBUSY when it could not be deleted nor the controller stopped (its region is kept).
 */
static inline int upcie_served_qp_drop_(struct upcie_served *s, struct upcie_served_conn_ *cn,
					uint32_t k)
{
	struct upcie_served_qp_ *qp = &cn->qps[k];
	struct upcie_served_mem_ *m = &cn->mems[qp->mem];
	bool lost = qp->q.lost;
	int err;

	upcie_served_unrelay_(s, qp);
	err = upcie_nvme_ioq_delete(&qp->q);
	if (err == -EBUSY) {
		m->kept = true;
		s->st.kept++;
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
	memset(qp, 0, sizeof(*qp));
	m->nqp--;
	cn->nqp--;
	return 0;
}

static inline void upcie_served_mem_drop_(struct upcie_served *s, struct upcie_served_conn_ *cn,
					  struct upcie_served_mem_ *m)
{
	(void)s;
	if (m->kept || m->nqp)
		return; /* the controller may still use it: mapped for the server's lifetime */
	upcie_dmamem_destroy(&m->dm);
	if (m->va)
		munmap(m->va, m->size);
	close(m->fd);
	cn->bytes -= m->size;
	cn->nmem--;
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
	bool keep = false;

#ifdef UPCIE_SERVED_TEST_HOOKS
	for (uint32_t m = 0; upcie_served_test_unmap_first_ && m < s->o.max_mem; m++)
		if (cn->mems[m].used)
			upcie_dmamem_destroy(&cn->mems[m].dm);
#endif
	for (uint32_t k = 1; k <= UPCIE_SERVED_MAX_QP; k++)
		if (cn->qps[k].used && upcie_served_qp_drop_(s, cn, k))
			keep = true;
	for (uint32_t m = 0; m < s->o.max_mem; m++)
		if (cn->mems[m].used)
			upcie_served_mem_drop_(s, cn, &cn->mems[m]);
	pthread_mutex_lock(&s->lock);
	s->conns[i] = NULL;
	s->nconns--;
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

static inline void upcie_served_accept_(struct upcie_served *s)
{
	struct upcie_served_conn_ *cn = NULL;
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
	for (uint32_t i = 0; i < s->o.max_clients && slot == UINT32_MAX; i++)
		if (!s->conns[i])
			slot = i;
	if (slot != UINT32_MAX)
		cn = (struct upcie_served_conn_ *)calloc(1, sizeof(*cn));
	if (cn)
		cn->mems = (struct upcie_served_mem_ *)calloc(s->o.max_mem, sizeof(*cn->mems));
	if (cn && cn->mems) {
		cn->relay_fd = memfd_create("upcie-served-relay", MFD_CLOEXEC);
		if (cn->relay_fd >= 0 && !ftruncate(cn->relay_fd, sizeof(*cn->relay))) {
			void *p = mmap(NULL, sizeof(*cn->relay), PROT_READ | PROT_WRITE, MAP_SHARED,
				       cn->relay_fd, 0);

			cn->relay = p == MAP_FAILED ? NULL : (struct upcie_served_relay *)p;
		}
	}
	if (!cn || !cn->mems || !cn->relay) {
		UPCIE_ERR("served: client (pid %d) refused: %s", (int)cr.pid,
			  slot == UINT32_MAX ? "too many clients" : "out of memory");
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
	cn->relay->slot[0].state = UPCIE_SERVED_SLOT_LIVE;
	pthread_mutex_lock(&s->lock);
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

static inline int upcie_served_do_mem_reg_(struct upcie_served *s, struct upcie_served_conn_ *cn,
					   const struct upcie_served_req *rq, int fd,
					   struct upcie_served_rsp *rp, size_t *extra)
{
	uint64_t size = rq->u.mem_reg.size;
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
	for (uint32_t i = 0; i < s->o.max_mem && !m; i++)
		if (!cn->mems[i].used)
			m = &cn->mems[i];
	if (!m)
		return UPCIE_FAIL(-ENOSPC, "served: client %d: %u regions already", (int)cn->pid,
				  s->o.max_mem);
	if (!fstat(fd, &st) && !S_ISREG(st.st_mode)) {
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
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < size)
		return UPCIE_FAIL(-EINVAL,
				  "served: client %d: the descriptor is not a file of at "
				  "least %" PRIu64 " bytes",
				  (int)cn->pid, size);
	/* the server touches the memory (a CQ is zeroed here): it must not shrink under us */
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK))
		return UPCIE_FAIL(-EPERM,
				  "served: client %d: the memfd must be sealed against "
				  "shrinking (F_SEAL_SHRINK)",
				  (int)cn->pid);
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
	m->used = true;
	m->id = cn->next_id++;
	m->fd = fd;
	m->va = va;
	m->size = size;
	cn->bytes += size;
	cn->nmem++;
	rp->u.mem_reg.id = m->id;
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

		if (!o->used) {
			if (!slot)
				slot = k;
			continue;
		}
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
	if (!slot || cn->nqp >= s->o.max_qp)
		return UPCIE_FAIL(-ENOSPC, "served: client %d: %u queue pairs already",
				  (int)cn->pid, cn->nqp);
	if (m->kept)
		return UPCIE_FAIL(-EBUSY, "served: client %d: region %u is kept by the controller",
				  (int)cn->pid, m->id);
	qp = &cn->qps[slot];
	memset(&x, 0, sizeof(x));
	x.depth = depth;
	x.sq = (uint8_t *)m->va + sq;
	x.cq = (uint8_t *)m->va + cq;
	if (upcie_dmamem_iova(&m->dm, sq, &x.sq_iova) || upcie_dmamem_iova(&m->dm, cq, &x.cq_iova))
		return -EINVAL;
	err = upcie_nvme_ioq_create_ext(&qp->q, s->c, &x);
	if (err) {
		upcie_served_recover_(s);
		upcie_served_mark_lost_(s);
		return err == -EBUSY ? (m->kept = true, -EBUSY) : err;
	}
	qp->used = true;
	qp->mem = (uint32_t)mi;
	qp->depth = depth;
	qp->sq_off = sq;
	qp->cq_off = cq;
	qp->sq_db = upcie_nvme_sq_tdbl_off(qp->q.qid, s->c->dstrd);
	qp->cq_db = upcie_nvme_cq_hdbl_off(qp->q.qid, s->c->dstrd);
	m->nqp++;
	cn->nqp++;
	s->st.qp_made++;
	cn->relay->slot[slot].sq_tail = 0;
	cn->relay->slot[slot].cq_head = 0;
	__atomic_store_n(&cn->relay->slot[slot].state, UPCIE_SERVED_SLOT_LIVE, __ATOMIC_RELEASE);
	pthread_mutex_lock(&s->lock);
	qp->last_sq = 0;
	qp->last_cq = 0;
	/* a client that maps its doorbells writes none here: nothing to forward */
	qp->relay = !cn->direct;
	if (qp->relay && !s->nrelay++)
		pthread_cond_signal(&s->relay_cv);
	pthread_mutex_unlock(&s->lock);
	rp->u.qp_create.slot = slot;
	rp->u.qp_create.qid = qp->q.qid;
	return 0;
}

/* The descriptor to map doorbells from, for a trusted client; *fd is ours to close. */
static inline int upcie_served_do_doorbells_(struct upcie_served *s, struct upcie_served_conn_ *cn,
					     struct upcie_served_rsp *rp, int *fd)
{
	const struct upcie_nvme_dev *d = &s->c->dev;
	uint64_t base = 0;
	char path[256];

	if (!s->o.direct_doorbells || (cn->uid != 0 && cn->uid != geteuid()))
		return UPCIE_FAIL(-EPERM,
				  "served: client %d (uid %u): doorbell mappings not "
				  "granted (server option, root or the server's user)",
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
		return UPCIE_FAIL(-errno, "served: doorbell descriptor: %s", strerror(errno));
	rp->u.doorbells.offset = base + 0x1000;
	rp->u.doorbells.size = (uint32_t)upcie_align_up(
	    upcie_nvme_cq_hdbl_off((uint16_t)s->c->nqueues, s->c->dstrd) + 4 - 0x1000, 4096);
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
	if (n != (ssize_t)sizeof(rq) || rq.magic != UPCIE_SERVED_MAGIC) {
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
		rp->u.hello.version = UPCIE_SERVED_VERSION;
		rp->u.hello.path = s->c->dev.open ? (uint32_t)s->c->dev.path : 0;
		rp->u.hello.page_shift = s->c->page_shift;
		rp->u.hello.mqes = s->c->mqes;
		rp->u.hello.dstrd = s->c->dstrd;
		rp->u.hello.max_qp = s->o.max_qp;
		rp->u.hello.max_mem = s->o.max_mem;
		rp->u.hello.max_depth = s->o.max_depth;
		rp->u.hello.max_bytes = s->o.max_bytes;
		rp->u.hello.max_xfer = s->c->max_xfer;
		rp->u.hello.hugetlb = s->map.hugetlb;
		rp->u.hello.direct_db =
		    s->o.direct_doorbells && (cn->uid == 0 || cn->uid == geteuid());
		rp->u.hello.server_pid = (int32_t)getpid();
		rp->u.hello.relay_size = sizeof(*cn->relay);
		sfd = cn->relay_fd;
		break;
	case UPCIE_SERVED_OP_MEM_REG:
		err = upcie_served_do_mem_reg_(s, cn, &rq, fd, rp, &extra);
		if (!err)
			fd = -1; /* the region owns it */
		break;
	case UPCIE_SERVED_OP_MEM_UNREG: {
		int m = upcie_served_mem_find_(s, cn, rq.u.mem_unreg.id);

		if (m < 0)
			err = UPCIE_FAIL(-ENOENT, "served: client %d: no region %u", (int)cn->pid,
					 rq.u.mem_unreg.id);
		else if (cn->mems[m].nqp || cn->mems[m].kept)
			err = UPCIE_FAIL(-EBUSY, "served: client %d: region %u holds queues",
					 (int)cn->pid, rq.u.mem_unreg.id);
		else
			upcie_served_mem_drop_(s, cn, &cn->mems[m]);
		break;
	}
	case UPCIE_SERVED_OP_QP_CREATE:
		err = upcie_served_do_qp_create_(s, cn, &rq, rp);
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
		err = upcie_nvme_ctrl_identify(s->c, (uint8_t)rq.u.identify.cns, rq.u.identify.nsid,
					       s->scratch + sizeof(*rp));
		if (!err)
			extra = 4096;
		upcie_served_recover_(s);
		upcie_served_mark_lost_(s);
		break;
	case UPCIE_SERVED_OP_DOORBELLS:
		err = upcie_served_do_doorbells_(s, cn, rp, &sfd);
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
	if (sfd >= 0 && sfd != cn->relay_fd)
		close(sfd);
	return !err;
}

/*
 * Serve until *stop becomes non-zero (checked at least every 100 ms): accept clients, answer
 * their requests, clean up after those that hang up. Returns 0, or -errno of poll().
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
		nfds_t n = 1;
		int r;

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
 * memory given back as on a hang-up, the socket file removed. The controller stays the
 * caller's (upcie_nvme_ctrl_close() shuts it down). Kept regions stay mapped until exit.
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
		pthread_join(s->relay, NULL);
		pthread_cond_destroy(&s->relay_cv);
		pthread_mutex_destroy(&s->lock);
	}
	upcie_served_release_(s);
}

#endif /* UPCIE_SERVED_SERVER_H */
