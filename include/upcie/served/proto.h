/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Served queue pairs: the wire format between the server (served/server.h, which owns the
 * controller) and its clients (served/client.h), and the doorbell relay page they share.
 *
 * Transport: a Unix SOCK_SEQPACKET socket, one request and one response per message, file
 * descriptors in SCM_RIGHTS (the client's DMA memory, a memfd; the server's relay page and the
 * rings of an isolated queue, memfds the server made and sealed against shrinking and growing;
 * the whole device where the server allows that). Requests are answered in order; the server
 * sends nothing unasked. What a client needs to know between requests (a queue lost to a
 * controller reset, the server stopping) is in the relay page, which it reads without a system
 * call. HELLO is the first request of every connection (anything else first is refused and the
 * connection closed), and it must come within the server's HELLO timeout.
 *
 * Two kinds of queue pair:
 * - trusted (QP_CREATE): the client writes NVMe SQEs into rings in its own memory, the
 *   controller fetches them; the client holds the controller's whole DMA reach.
 * - isolated (IQP_CREATE): the client writes struct upcie_served_sub entries into a ring the
 *   server made; the server checks each one (opcode, namespace and LBA range granted to the
 *   client, a data range inside one of the client's regions) and builds the NVMe command, its
 *   PRP lists and its queues in its own memory; completions come back as struct
 *   upcie_served_cpl in the same ring memory. The client names no device address.
 * The server decides which a client gets (HELLO's `isolated`): isolated unless it trusts the
 * client (by default root and its own user) and the client did not ask to be isolated.
 *
 * Both sides are the same version of these headers: a version mismatch is refused at HELLO.
 */
#ifndef UPCIE_SERVED_PROTO_H
#define UPCIE_SERVED_PROTO_H

#include <upcie/base/feature.h>

#include <upcie/base/compiler.h>

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define UPCIE_SERVED_MAGIC   0x75737631u /* "usv1" */
#define UPCIE_SERVED_VERSION 2u

/* Queue pairs per client: slots 1..UPCIE_SERVED_MAX_QP of the relay page. */
#define UPCIE_SERVED_MAX_QP 63u
/* Entries of a LUT in a MEM_REG response (a region of at most this many granules on uio). */
#define UPCIE_SERVED_MAX_LUT 4096u
/* Largest message: a response header and a full LUT. */
#define UPCIE_SERVED_MSG_MAX (256u + 8u * UPCIE_SERVED_MAX_LUT)

enum upcie_served_op {
	UPCIE_SERVED_OP_HELLO = 1,	/* version, flags -> controller facts, relay page fd */
	UPCIE_SERVED_OP_MEM_REG = 2,	/* size + memfd -> id, device addresses */
	UPCIE_SERVED_OP_MEM_UNREG = 3,	/* id */
	UPCIE_SERVED_OP_QP_CREATE = 4,	/* mem id, depth, SQ and CQ offsets -> slot, qid */
	UPCIE_SERVED_OP_QP_DELETE = 5,	/* slot */
	UPCIE_SERVED_OP_IDENTIFY = 6,	/* CNS 0..3, NSID -> 4096 bytes */
	UPCIE_SERVED_OP_DOORBELLS = 7,	/* -> the whole device's fd (trusted, if the server
					  allows it): doorbells, registers, everything */
	UPCIE_SERVED_OP_IQP_CREATE = 8, /* depth -> slot, ring memfd (isolated queue pair) */
	UPCIE_SERVED_OP_WAKE = 9,	/* -> the connection's wake eventfd (see the relay page) */
	UPCIE_SERVED_OP_VF = 10,	/* -> an SR-IOV VF of its own: address, VF token, the
					  group's fd (served/server_vf.h) */
};

/* HELLO flags */
#define UPCIE_SERVED_HELLO_DIRECT_DB 0x1u /* the client would map the whole device itself */
#define UPCIE_SERVED_HELLO_ISOLATED  0x2u /* isolated even where the server would trust it */

struct upcie_served_req {
	uint32_t magic;
	uint32_t op;
	uint32_t seq;
	uint32_t rsvd;
	union {
		struct {
			uint32_t version;
			uint32_t flags;
		} hello;
		struct {
			uint64_t size;
		} mem_reg;
		struct {
			uint32_t id;
		} mem_unreg;
		struct {
			uint32_t mem_id;
			uint32_t depth;
			uint64_t sq_off;
			uint64_t cq_off;
		} qp_create;
		struct {
			uint32_t slot;
		} qp_delete;
		struct {
			uint32_t depth;
		} iqp_create;
		struct {
			uint32_t nsid;
			uint32_t cns;
		} identify;
		uint8_t raw[48];
	} u;
};

struct upcie_served_rsp {
	uint32_t magic;
	uint32_t op;
	uint32_t seq;
	int32_t err; /* 0 or a negative errno */
	union {
		struct {
			uint32_t version;
			uint32_t path;	     /* enum upcie_nvme_path of the server's device */
			uint32_t page_shift; /* controller page: 12 + CC.MPS */
			uint32_t mqes;	     /* I/O queue entries allowed (CAP.MQES + 1) */
			uint32_t dstrd;	     /* doorbell stride (CAP.DSTRD) */
			uint32_t max_qp;     /* queue pairs this client may hold */
			uint32_t max_mem;    /* registered regions this client may hold */
			uint32_t max_depth;  /* entries per queue this client may ask for */
			uint64_t max_bytes;  /* bytes this client may register in all */
			uint64_t max_xfer;   /* MDTS in bytes, UINT64_MAX: no limit */
			uint32_t hugetlb;    /* 1: memory must be hugetlb (uio: physical LUT) */
			uint32_t direct_db;  /* 1: OP_DOORBELLS will be granted */
			int32_t server_pid;
			uint32_t relay_size; /* bytes of the relay page (fd in SCM_RIGHTS) */
			uint32_t isolated;   /* 1: isolated queue pairs only (IQP_CREATE) */
		} hello;
		struct {
			uint32_t id;
			uint32_t granule_shift; /* 0: one device range from `iova`; else the LUT
						   entries follow the response */
			uint64_t iova;
			uint32_t nlut;
			uint32_t rsvd;
		} mem_reg;
		struct {
			uint32_t slot; /* relay slot and handle, 1..UPCIE_SERVED_MAX_QP */
			uint32_t qid;
		} qp_create;
		struct {
			uint32_t slot;	    /* relay slot (its state word) and handle */
			uint32_t depth;	    /* entries of the submission and completion rings */
			uint64_t ring_size; /* bytes of the ring memfd (fd in SCM_RIGHTS) */
		} iqp_create;
		struct {
			uint64_t offset; /* of the doorbell page in the fd's mapping */
			uint32_t size;	 /* bytes to map */
			uint32_t rsvd;
			uint64_t regs; /* offset of BAR0's register page in the fd's mapping */
		} doorbells;
		struct {
			char bdf[16];	 /* the VF's PCI address, text */
			char token[40];	 /* the VF token to open it with (UUID text) */
			int32_t group;	 /* its IOMMU group (fd in SCM_RIGHTS) */
			uint16_t cntlid; /* its controller's ID in the NVM subsystem */
			uint16_t nvq;	 /* queue resources: the admin queue + nvq - 1 I/O */
			uint16_t nvi;	 /* interrupt resources (MSI-X vectors) */
			uint16_t nns;	 /* namespaces attached to it: those granted */
		} vf;
		uint8_t raw[80];
	} u;
};

/* Relay slot states */
#define UPCIE_SERVED_SLOT_FREE	   0u
#define UPCIE_SERVED_SLOT_LIVE	   1u
#define UPCIE_SERVED_SLOT_LOST	   2u /* a controller reset took the queue: delete it */
#define UPCIE_SERVED_SLOT_STOPPING 3u /* header slot: the server is going away */
#define UPCIE_SERVED_SLOT_FAULT                                                                    \
	4u /* isolated: the client broke the ring protocol (an index
					 beyond the ring); the server serves it no more */

/* The header slot's `poller` word: the server's poller is going to sleep (or sleeps). */
#define UPCIE_SERVED_POLLER_AWAKE  0u
#define UPCIE_SERVED_POLLER_ASLEEP 1u

/*
 * One queue's relay words, a cache line each so the client and the relay do not share a line
 * with another queue. The client's queue pair writes sq_tail and cq_head as it would the
 * doorbells; the server's relay forwards them to the controller (a slot with a doorbell mapping
 * is not relayed). The server writes state.
 *
 * Waking the poller: a poller with nothing to do sleeps. Before it does, it writes
 * UPCIE_SERVED_POLLER_ASLEEP into the header slot's `poller` of every client, then looks at
 * every queue once more. A client that published work (an isolated ring's sq_tail, a relayed
 * sq_tail) then reads `poller` (a full fence between the two) and, when it says ASLEEP, adds 1
 * to its connection's wake eventfd (OP_WAKE). Either the poller's second look sees the work,
 * or the client sees ASLEEP and its eventfd wakes the poller; no wakeup is lost. The server
 * never reads `poller`: a client that writes it, or writes its eventfd without cause, or reads
 * it empty, changes only when its own work is picked up (a spurious wakeup costs the poller one
 * look at the queues; the eventfd is the client's own).
 */
struct upcie_served_relay_slot {
	volatile uint32_t sq_tail;
	volatile uint32_t cq_head;
	volatile uint32_t state;
	volatile uint32_t poller; /* header slot: UPCIE_SERVED_POLLER_* (server); queues: 0 */
	uint32_t rsvd[12];
};

/* The relay page: slot 0 is the header (its state: LIVE or STOPPING), 1..63 the queues. */
struct upcie_served_relay {
	struct upcie_served_relay_slot slot[UPCIE_SERVED_MAX_QP + 1];
};

/*
 * Isolated queue pairs: the ring memory (one memfd per queue, made by the server):
 * struct upcie_served_ring, then `depth` submissions, then `depth` completions. Indices are
 * free-running 32-bit counters; an entry's slot is the index modulo depth.
 * - The client writes submissions at sq_tail % depth, then sq_tail (release). The server reads
 *   each one once (a copy: what is checked is what is built) and advances sq_head.
 * - The server writes completions at cq_tail % depth, then cq_tail (release). The client reads
 *   them, then advances cq_head. The server takes a submission only while the commands it holds
 *   plus the completions not yet consumed are fewer than depth: a completion always has room.
 * A client that moves sq_tail more than depth beyond sq_head, or cq_head beyond cq_tail, has its
 * queue faulted (relay slot state FAULT): no more submissions are taken; what is in flight still
 * completes, then the queue is only good for QP_DELETE.
 */
struct upcie_served_ring {
	volatile uint32_t sq_tail; /* client */
	uint32_t rsvd0[15];
	volatile uint32_t sq_head; /* server */
	uint32_t rsvd1[15];
	volatile uint32_t cq_tail; /* server */
	uint32_t rsvd2[15];
	volatile uint32_t cq_head; /* client */
	uint32_t rsvd3[15];
};

/* Submission opcodes: the NVM command set's, these only (admin commands never). */
#define UPCIE_SERVED_SUB_FUA 0x1u /* Force Unit Access (Read, Write, Compare, Write Zeroes) */

/* One submission of an isolated queue pair (64 bytes). */
struct upcie_served_sub {
	uint8_t opc; /* Flush, Write, Read, Compare, Write Zeroes, DSM (deallocate) */
	uint8_t rsvd0;
	uint16_t tag; /* the client's, echoed in the completion */
	uint32_t nsid;
	uint64_t slba;	 /* first block (not Flush) */
	uint32_t nlb;	 /* blocks, 1..65536 (not Flush) */
	uint32_t flags;	 /* UPCIE_SERVED_SUB_* */
	uint32_t region; /* Read, Write, Compare: the data's region id (MEM_REG) */
	uint32_t rsvd1;
	uint64_t off; /* of the data in the region (4-byte aligned) */
	uint64_t len; /* bytes: nlb * the namespace's block size */
	uint8_t rsvd2[16];
};

/* One completion of an isolated queue pair (16 bytes). */
struct upcie_served_cpl {
	uint16_t tag;
	uint16_t status; /* err 0: the NVMe status field (SCT << 8 | SC), 0 success */
	int32_t err;	 /* 0: the controller ran it; -errno: refused by the server (never sent:
			    -EPERM opcode or range not granted, -ENOENT no such region, -EINVAL
			    a malformed submission) or ended without the controller
			    (-ECANCELED: a reset or the deletion of the queue) */
	uint32_t dw0;
	uint32_t rsvd;
};

UPCIE_STATIC_ASSERT(sizeof(struct upcie_served_ring) == 256, "ring header: 4 cache lines");
UPCIE_STATIC_ASSERT(sizeof(struct upcie_served_sub) == 64, "a submission is 64 bytes");
UPCIE_STATIC_ASSERT(sizeof(struct upcie_served_cpl) == 16, "a completion is 16 bytes");
UPCIE_STATIC_ASSERT(sizeof(struct upcie_served_req) == 64, "a request is 64 bytes");
UPCIE_STATIC_ASSERT(sizeof(struct upcie_served_rsp) == 96, "a response is 96 bytes");

/* Bytes of an isolated queue's ring memory of `depth` entries (a whole number of pages). */
static inline uint64_t upcie_served_ring_bytes(uint32_t depth)
{
	uint64_t n =
	    sizeof(struct upcie_served_ring) +
	    (uint64_t)depth * (sizeof(struct upcie_served_sub) + sizeof(struct upcie_served_cpl));

	return (n + 4095) & ~UINT64_C(4095);
}

/*
 * Send `len` bytes as one message, with `fd` in SCM_RIGHTS when fd >= 0. Returns 0, -EMSGSIZE
 * (a partial send), or -errno (-EPIPE/-ECONNRESET: the peer is gone).
 */
static inline int upcie_served_send_(int sock, const void *buf, size_t len, int fd)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cm;
	struct iovec iov;
	struct msghdr mh;
	ssize_t n;

	memset(&mh, 0, sizeof(mh));
	iov.iov_base = (void *)buf;
	iov.iov_len = len;
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	if (fd >= 0) {
		memset(&cm, 0, sizeof(cm));
		mh.msg_control = cm.b;
		mh.msg_controllen = sizeof(cm.b);
		cm.h.cmsg_level = SOL_SOCKET;
		cm.h.cmsg_type = SCM_RIGHTS;
		cm.h.cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(&cm.h), &fd, sizeof(int));
	}
	do
		n = sendmsg(sock, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return (size_t)n == len ? 0 : -EMSGSIZE;
}

/*
 * Receive one message into buf (at most `cap` bytes) and at most one descriptor (*fd, -1 when
 * none; pass NULL to refuse any). Descriptors beyond that are closed. Returns the message's
 * length (0: the peer closed), -EMSGSIZE (truncated: a message or descriptors that did not fit,
 * any descriptor closed), or -errno (-EAGAIN with `flags` MSG_DONTWAIT and nothing there).
 */
static inline ssize_t upcie_served_recv_(int sock, void *buf, size_t cap, int *fd, int flags)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(4 * sizeof(int))];
	} cm;
	struct cmsghdr *h;
	struct iovec iov;
	struct msghdr mh;
	int got = -1;
	ssize_t n;

	if (fd)
		*fd = -1;
	memset(&mh, 0, sizeof(mh));
	iov.iov_base = buf;
	iov.iov_len = cap;
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = cm.b;
	mh.msg_controllen = sizeof(cm.b);
	do
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | flags);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	for (h = CMSG_FIRSTHDR(&mh); h; h = CMSG_NXTHDR(&mh, h)) {
		size_t nfd;

		if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
			continue;
		nfd = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < nfd; i++) {
			int f;

			memcpy(&f, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
			if (got < 0 && fd)
				got = f;
			else
				close(f);
		}
	}
	if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		if (got >= 0)
			close(got);
		return -EMSGSIZE;
	}
	if (fd)
		*fd = got;
	return n;
}

#endif /* UPCIE_SERVED_PROTO_H */
