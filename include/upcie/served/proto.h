/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Served queue pairs: the wire format between the server (served/server.h, which owns the
 * controller) and its clients (served/client.h), and the doorbell relay page they share.
 *
 * Transport: a Unix SOCK_SEQPACKET socket, one request and one response per message, file
 * descriptors in SCM_RIGHTS (the client's DMA memory, a memfd; the server's relay page, a memfd;
 * a doorbell mapping where the server allows one). Requests are answered in order; the server
 * sends nothing unasked. What a client needs to know between requests (a queue lost to a
 * controller reset, the server stopping) is in the relay page, which it reads without a system
 * call.
 *
 * Both sides are the same version of these headers: a version mismatch is refused at HELLO.
 */
#ifndef UPCIE_SERVED_PROTO_H
#define UPCIE_SERVED_PROTO_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define UPCIE_SERVED_MAGIC   0x75737631u /* "usv1" */
#define UPCIE_SERVED_VERSION 1u

/* Queue pairs per client: slots 1..UPCIE_SERVED_MAX_QP of the relay page. */
#define UPCIE_SERVED_MAX_QP 63u
/* Entries of a LUT in a MEM_REG response (a region of at most this many granules on uio). */
#define UPCIE_SERVED_MAX_LUT 4096u
/* Largest message: a response header and a full LUT. */
#define UPCIE_SERVED_MSG_MAX (256u + 8u * UPCIE_SERVED_MAX_LUT)

enum upcie_served_op {
	UPCIE_SERVED_OP_HELLO = 1,     /* version, flags -> controller facts, relay page fd */
	UPCIE_SERVED_OP_MEM_REG = 2,   /* size + memfd -> id, device addresses */
	UPCIE_SERVED_OP_MEM_UNREG = 3, /* id */
	UPCIE_SERVED_OP_QP_CREATE = 4, /* mem id, depth, SQ and CQ offsets -> slot, qid */
	UPCIE_SERVED_OP_QP_DELETE = 5, /* slot */
	UPCIE_SERVED_OP_IDENTIFY = 6,  /* CNS 0..3, NSID -> 4096 bytes */
	UPCIE_SERVED_OP_DOORBELLS = 7, /* -> an fd to map the doorbell page from (trusted only) */
};

/* HELLO flags */
#define UPCIE_SERVED_HELLO_DIRECT_DB 0x1u /* the client would map doorbells itself */

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
			uint64_t offset; /* of the doorbell page in the fd's mapping */
			uint32_t size;	 /* bytes to map */
			uint32_t rsvd;
		} doorbells;
		uint8_t raw[80];
	} u;
};

/* Relay slot states */
#define UPCIE_SERVED_SLOT_FREE	   0u
#define UPCIE_SERVED_SLOT_LIVE	   1u
#define UPCIE_SERVED_SLOT_LOST	   2u /* a controller reset took the queue: delete it */
#define UPCIE_SERVED_SLOT_STOPPING 3u /* header slot: the server is going away */

/*
 * One queue's relay words, a cache line each so the client and the relay do not share a line
 * with another queue. The client's queue pair writes sq_tail and cq_head as it would the
 * doorbells; the server's relay forwards them to the controller (a slot with a doorbell mapping
 * is not relayed). The server writes state.
 */
struct upcie_served_relay_slot {
	volatile uint32_t sq_tail;
	volatile uint32_t cq_head;
	volatile uint32_t state;
	uint32_t rsvd[13];
};

/* The relay page: slot 0 is the header (its state: LIVE or STOPPING), 1..63 the queues. */
struct upcie_served_relay {
	struct upcie_served_relay_slot slot[UPCIE_SERVED_MAX_QP + 1];
};

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
