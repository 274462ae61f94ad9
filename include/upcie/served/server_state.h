/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Served queue pairs, the server's state (served/server.h is the server): its options (trust,
 * grants, limits), statistics, the records of clients, their regions and queue pairs, and the
 * built-in mappers of client memory for the controller's path. Nothing here runs on its own.
 */
#ifndef UPCIE_SERVED_SERVER_STATE_H
#define UPCIE_SERVED_SERVER_STATE_H

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
#include <sys/eventfd.h>
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

#ifndef F_GET_SEALS
#define F_GET_SEALS 1034
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
#ifndef MFD_ALLOW_SEALING
#define MFD_ALLOW_SEALING 0x0002U
#endif
#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59
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

/* Who gets trusted queue pairs (everyone else: isolated ones only). */
enum upcie_served_trust {
	UPCIE_SERVED_TRUST_OWNER = 0, /* root and the server's own user */
	UPCIE_SERVED_TRUST_NONE = 1,  /* nobody: every client isolated */
	UPCIE_SERVED_TRUST_ALL = 2,   /* everyone who may connect (the socket's mode, allow_uid) */
};

/* Access bits of a grant */
#define UPCIE_SERVED_READ  0x1u
#define UPCIE_SERVED_WRITE 0x2u

/*
 * What isolated clients may reach: blocks [slba, slba + nlb) of namespace `nsid` (nlb 0: to its
 * end) for `uid` (-1: any) and/or group `gid` (-1: any; a client's primary or supplementary
 * group), with `access`. A client may use the union of the grants that name it; no grant, no
 * I/O. Namespaces with metadata or protection information are not served to isolated clients.
 */
struct upcie_served_grant {
	long uid;
	long gid;
	uint32_t nsid;
	unsigned access; /* UPCIE_SERVED_READ | UPCIE_SERVED_WRITE */
	uint64_t slba;
	uint64_t nlb;
};

#define UPCIE_SERVED_MAX_GRANTS 64u

struct upcie_served_opts {
	const char *path; /* socket path (created; only a stale socket there is replaced) */
	mode_t mode;	  /* of the socket file; 0: 0600 */
	gid_t gid;	  /* group of the socket file; (gid_t)-1: unchanged */
	long allow_uid;	  /* -1: any peer that can open the socket; else only this uid and 0 */
	enum upcie_served_trust trust;		 /* who gets trusted queue pairs */
	const struct upcie_served_grant *grants; /* isolated clients' reach (copied) */
	uint32_t ngrants;			 /* at most UPCIE_SERVED_MAX_GRANTS */
	uint32_t max_clients;			 /* 0: 64 */
	uint32_t max_qp;	   /* queue pairs per client, 0: 16 (at most UPCIE_SERVED_MAX_QP) */
	uint32_t max_mem;	   /* regions per client, 0: 16 */
	uint64_t max_bytes;	   /* registered bytes per client, 0: 1 GiB */
	uint32_t max_depth;	   /* entries per queue, 0: CAP.MQES + 1 */
	uint32_t uid_max_clients;  /* connections per uid, HELLO or not; 0: max_clients / 4 */
	uint32_t uid_max_qp;	   /* queue pairs per uid; 0: the controller's queues / 2 */
	uint64_t uid_max_bytes;	   /* registered bytes per uid; 0: 4 * max_bytes */
	uint32_t qp_reserve;	   /* queue identifiers a uid holding queues cannot take;
					0: queues / 8 (at least 1 when 2 or more) */
	uint32_t hello_timeout_ms; /* a connection without HELLO is closed; 0: 2000 */
	uint64_t iso_max_xfer;	   /* bytes per isolated command; 0: min(MDTS, 128 KiB) */
	bool direct_whole_device;  /* trusted clients may take the whole device's file (vfio:
					the device fd; uio: resource0) to ring doorbells
					themselves: every register, every queue, reset */
	uint64_t relay_spin_ns;	   /* the poller spins this long after the last work, then
				      sleeps until a client's wakeup (OP_WAKE); 0: 50 us */
	uint32_t vfs;		   /* SR-IOV: VFs to enable and hand out, one per client that
				      asks (OP_VF; served/server_vf.h); 0: none */
	uint16_t vf_nvq, vf_nvi;   /* queue and interrupt resources per VF; 0: the most */
};

#ifdef UPCIE_SERVED_TEST_HOOKS
/* Tests only: a client's memory is given back before its queues are deleted (the negative
 * control of the rule that memory goes only after the controller let go). */
static int upcie_served_test_unmap_first_;
#endif

struct upcie_served_stats {
	uint64_t clients;	 /* accepted */
	uint64_t refused;	 /* connections refused (credentials, limits) */
	uint64_t gone;		 /* clients that hung up */
	uint64_t timeouts;	 /* connections closed for not saying HELLO in time */
	uint64_t qp_made;	 /* queue pairs created (both kinds) */
	uint64_t qp_gone;	 /* deleted with the controller's confirmation */
	uint64_t qp_lost;	 /* taken by a controller reset */
	uint64_t kept;		 /* regions kept mapped: a queue on them could not be deleted */
	uint64_t bad;		 /* requests refused */
	uint64_t resets;	 /* controller resets done by the server */
	uint64_t relayed;	 /* doorbell values forwarded */
	uint64_t dropped;	 /* doorbell values refused (outside the queue) */
	uint64_t iso_ok;	 /* isolated submissions sent to the controller */
	uint64_t iso_bad;	 /* isolated submissions refused */
	uint64_t faults;	 /* isolated queues faulted (ring protocol broken) */
	uint64_t naps;		 /* the poller slept (nothing to do for relay_spin_ns) */
	uint64_t nap_us;	 /* microseconds it slept */
	uint64_t sleeps;	 /* the poller went to sleep until a client's wakeup */
	uint64_t woken;		 /* it was woken by a client's submission (not its timeout) */
	uint64_t sleep_timeouts; /* it woke at its sleep's timeout */
	uint64_t irqs;		 /* it was woken by an isolated queue's interrupt vector */
	uint64_t vf_given;	 /* VFs handed to clients */
	uint64_t vf_back;	 /* VFs taken back (offline) from clients that went */
};

struct upcie_served_mem_ {
	bool used;
	bool kept; /* the controller may still use it: never unmapped */
	uint32_t id;
	int fd;
	void *va;
	size_t size;
	uint32_t nqp;
	uint32_t inflight; /* isolated commands on it (under the server's lock) */
	struct upcie_dmamem dm;
};

struct upcie_served_qp_;

/* One isolated command in flight: what its completion goes back as. */
struct upcie_served_iocmd_ {
	struct upcie_served_qp_ *qp;
	struct upcie_served_mem_ *mem; /* NULL: no data */
	uint16_t tag;
	uint16_t next; /* free list */
};

struct upcie_served_qp_ {
	struct upcie_nvme_ioq q;
	bool used;
	bool iso;     /* isolated: q is the server's own queue, on the poller */
	bool relay;   /* trusted, forwarded by the poller (under srv->lock) */
	bool lost;    /* marked lost (the server's own record, not the relay word) */
	bool closing; /* isolated: being deleted, no more submissions */
	bool fault;   /* isolated: the client broke the ring protocol */
	uint32_t mem; /* trusted: index into the client's mems */
	uint32_t depth;
	uint32_t last_sq, last_cq;
	uint64_t sq_off, cq_off;
	size_t sq_db, cq_db; /* doorbell offsets in BAR0 */
	void *shadow;	     /* trusted: the private rings the server's idle side runs on */
	/* isolated */
	struct upcie_served_conn_ *cn;
	struct upcie_served_ring *ring;
	size_t ring_size;
	struct upcie_served_sub *subs;
	struct upcie_served_cpl *cpls;
	uint32_t sq_head, cq_tail; /* the server's own copies */
	uint32_t inflight;
	struct upcie_served_iocmd_ *cmds;
	uint16_t free_cmd; /* head of the free list, depth: none */
};

/* A VF the server hands out (served/server_vf.h). */
struct upcie_served_vf_ {
	struct upcie_pci_bdf bdf;
	char name[UPCIE_PCI_BDF_STRLEN];
	int group;	 /* its IOMMU group */
	uint16_t vfn;	 /* 1-based */
	uint16_t cntlid; /* its secondary controller */
};

struct upcie_served_conn_ {
	int fd;
	uint32_t vf; /* index + 1 of the VF it holds, 0: none */
	pid_t pid;
	uid_t uid;
	gid_t gid;
	gid_t groups[32];
	uint32_t ngroups;
	bool hello;
	bool isolated;
	bool direct;
	uint64_t t_accept;
	int relay_fd;
	int wake_fd; /* its wake eventfd (OP_WAKE), -1: none asked for */
	struct upcie_served_relay *relay;
	uint32_t nmem, nqp, next_id;
	uint64_t bytes;
	uint32_t ngrant;
	const struct upcie_served_grant *grant[UPCIE_SERVED_MAX_GRANTS]; /* those naming it */
	struct upcie_served_mem_ *mems;					 /* max_mem */
	struct upcie_served_qp_ qps[UPCIE_SERVED_MAX_QP + 1];
};

/* Per uid: what all its connections hold. */
struct upcie_served_uid_ {
	uid_t uid;
	uint32_t nconn, nqp;
	uint64_t bytes;
};

/* A namespace some grant names, as Identify last said. */
struct upcie_served_ns_ {
	uint32_t nsid;
	bool ok; /* active, no metadata, no protection information */
	uint64_t nsze;
	uint32_t lba_bytes;
};

struct upcie_served {
	struct upcie_nvme_ctrl *c;
	struct upcie_served_mapper map;
	struct upcie_served_opts o;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	dev_t sock_dev; /* the socket file we made (removed at fini only if still ours) */
	ino_t sock_ino;
	int lfd;
	struct upcie_served_conn_ **conns; /* max_clients */
	uint32_t nconns;
	struct upcie_served_uid_ *uids; /* max_clients */
	uint32_t nqp_all;		/* queue pairs of every client */
	struct upcie_served_grant grants[UPCIE_SERVED_MAX_GRANTS];
	struct upcie_served_ns_ ns[UPCIE_SERVED_MAX_GRANTS];
	uint32_t nns;
	bool failed;		 /* a reset failed: not reset again */
	pthread_mutex_t lock;	 /* the controller, every queue, the poller's view of the clients */
	pthread_cond_t relay_cv; /* signalled when a queue is put on the poller */
	uint32_t nrelay;	 /* queues on the poller */
	pthread_t relay;
	bool relay_live;
	volatile int relay_stop;
	int wake_ctl;	    /* eventfd: wakes the poller (stop, a new queue or wake fd) */
	bool poller_asleep; /* the poller told the clients it sleeps (under lock) */
	bool irq_distrust;  /* a vector slept through completions: look for them instead */
	uint64_t reaped;    /* completions the poller took from isolated queues (under lock) */
	struct upcie_served_stats st;
	uint8_t *scratch;	      /* message buffer */
	struct upcie_served_vf_ *vfs; /* o.vfs of them */
	uint8_t vf_token[16];
	char vf_token_str[UPCIE_VFIO_VF_TOKEN_STRLEN];
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

#endif /* UPCIE_SERVED_SERVER_STATE_H */
