/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Served queue pairs, the client's isolated queue pairs (upcie_served_iqp_*): requests written
 * into a ring the server made and checks, completions posted back by the server into the same
 * ring (served/client.h says what isolation means and shows both kinds). Needs a connection
 * from upcie_served_connect() and memory registered with upcie_served_mem_alloc() or
 * upcie_served_mem_register(); one owner thread per queue pair. served/client.h includes this
 * header: include that one.
 */
#ifndef UPCIE_SERVED_CLIENT_ISO_H
#define UPCIE_SERVED_CLIENT_ISO_H

#include <upcie/served/client.h>

/* An isolated command's ending: the completion as the server posted it (cpl->err 0: the
 * controller ran it, cpl->status its NVMe status; else -errno, see struct upcie_served_cpl). */
typedef void (*upcie_served_iqp_fn)(void *ctx, const struct upcie_served_cpl *cpl);

struct upcie_served_iqp_tag_ {
	upcie_served_iqp_fn cb;
	void *ctx;
	uint16_t next; /* free list */
	bool busy;
};

struct upcie_served_iqp {
	struct upcie_served_client *cl;
	uint32_t slot, depth;
	struct upcie_served_ring *ring;
	size_t ring_size;
	struct upcie_served_sub *subs;
	const struct upcie_served_cpl *cpls;
	uint32_t sq_tail, cq_head; /* our copies */
	uint32_t pending;	   /* submitted, not ended */
	uint32_t unrung;	   /* written, sq_tail not yet published */
	uint64_t bogus;		   /* completions naming no command of ours (ignored) */
	struct upcie_served_iqp_tag_ *tags;
	uint16_t free_tag;
	bool live;
};

/*
 * Create an isolated queue pair of `depth` entries (2..info.max_depth; 0: 64): the server makes
 * its controller queue and the ring memory, which is mapped here. Returns 0; -EINVAL; -ENOSPC
 * (limits, identifiers); -ENODEV (the server's controller failed); -ENOTCONN; -errno. `q` is
 * zeroed on failure.
 */
static inline int upcie_served_iqp_create(struct upcie_served_client *cl,
					  struct upcie_served_iqp *q, uint32_t depth)
{
	struct upcie_served_rsp *rp;
	struct upcie_served_req rq;
	int err, fd = -1;
	void *p;

	if (!q)
		return UPCIE_FAIL(-EINVAL, "served: NULL iqp");
	memset(q, 0, sizeof(*q));
	if (!cl || cl->sock < 0)
		return UPCIE_FAIL(-EINVAL, "served: iqp create: not connected");
	if (!depth)
		depth = 64;
	if (depth < 2 || depth > 65535)
		return UPCIE_FAIL(-EINVAL, "served: iqp depth %u outside 2..65535", depth);
	upcie_served_wake_get_(cl); /* the poller sleeps until we wake it */
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_IQP_CREATE;
	rq.u.iqp_create.depth = depth;
	err = upcie_served_call_(cl, &rq, -1, &fd, NULL);
	if (err)
		return err;
	rp = (struct upcie_served_rsp *)cl->buf;
	q->cl = cl;
	q->slot = rp->u.iqp_create.slot;
	q->depth = rp->u.iqp_create.depth;
	q->ring_size = (size_t)rp->u.iqp_create.ring_size;
	if (fd < 0 || q->slot < 1 || q->slot > UPCIE_SERVED_MAX_QP || q->depth != depth ||
	    q->ring_size != upcie_served_ring_bytes(depth)) {
		err = UPCIE_FAIL(-EPROTO, "served: iqp create: a response that does not fit");
		goto undo;
	}
	p = mmap(NULL, q->ring_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		err = UPCIE_FAIL(-errno, "served: ring mapping: %s", strerror(errno));
		goto undo;
	}
	close(fd);
	fd = -1;
	q->ring = (struct upcie_served_ring *)p;
	q->subs = (struct upcie_served_sub *)(q->ring + 1);
	q->cpls = (const struct upcie_served_cpl *)(q->subs + depth);
	q->tags = (struct upcie_served_iqp_tag_ *)calloc(depth, sizeof(*q->tags));
	if (!q->tags) {
		munmap(p, q->ring_size);
		err = -ENOMEM;
		goto undo;
	}
	for (uint32_t i = 0; i < depth; i++)
		q->tags[i].next = (uint16_t)(i + 1);
	q->live = true;
	cl->nqp++;
	return 0;
undo:
	if (fd >= 0)
		close(fd);
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_QP_DELETE;
	rq.u.qp_delete.slot = q->slot;
	upcie_served_call_(cl, &rq, -1, NULL, NULL);
	memset(q, 0, sizeof(*q));
	return err;
}

/*
 * Write submission `u` (its tag is set here) to end through cb(ctx, cpl). Not visible to the
 * server until upcie_served_iqp_ring(). Returns 0, -EBUSY (depth commands pending: poll),
 * -EINVAL, -ENODEV (faulted or lost).
 */
static inline int upcie_served_iqp_submit(struct upcie_served_iqp *q,
					  const struct upcie_served_sub *u, upcie_served_iqp_fn cb,
					  void *ctx)
{
	struct upcie_served_sub e;
	uint16_t t;

	if (UPCIE_UNLIKELY(!q || !q->live || !u))
		return -EINVAL;
	if (UPCIE_UNLIKELY(q->free_tag >= q->depth))
		return -EBUSY;
	t = q->free_tag;
	q->free_tag = q->tags[t].next;
	q->tags[t].cb = cb;
	q->tags[t].ctx = ctx;
	q->tags[t].busy = true;
	e = *u;
	e.tag = t;
	memcpy(&q->subs[q->sq_tail % q->depth], &e, sizeof(e));
	q->sq_tail++;
	q->pending++;
	q->unrung++;
	return 0;
}

/* Publish what was submitted (one store; the server's poller picks it up, woken through the
 * connection's wake eventfd when it said it sleeps). */
static inline void upcie_served_iqp_ring(struct upcie_served_iqp *q)
{
	if (!q->unrung)
		return;
	q->unrung = 0;
	__atomic_store_n(&q->ring->sq_tail, q->sq_tail, __ATOMIC_RELEASE);
	upcie_served_wake_(q->cl);
}

/*
 * Read, Write or Compare (opc UPCIE_NVME_NVM_READ / _WRITE / _COMPARE) of `nlb` blocks from
 * `slba` of namespace `nsid`, data at [off, off + len) of `mem` (len = nlb * block size);
 * rings. Returns as upcie_served_iqp_submit().
 */
static inline int upcie_served_iqp_rw(struct upcie_served_iqp *q, uint8_t opc, uint32_t nsid,
				      uint64_t slba, uint32_t nlb,
				      const struct upcie_served_mem *mem, uint64_t off,
				      uint64_t len, upcie_served_iqp_fn cb, void *ctx)
{
	struct upcie_served_sub u;
	int err;

	if (UPCIE_UNLIKELY(!mem || !q || mem->cl != q->cl))
		return UPCIE_FAIL(-EINVAL, "served: iqp rw: memory of another client");
	memset(&u, 0, sizeof(u));
	u.opc = opc;
	u.nsid = nsid;
	u.slba = slba;
	u.nlb = nlb;
	u.region = mem->id;
	u.off = off;
	u.len = len;
	err = upcie_served_iqp_submit(q, &u, cb, ctx);
	if (!err)
		upcie_served_iqp_ring(q);
	return err;
}

/* End every pending command with -ECANCELED (the server let go of the queue). */
static inline void upcie_served_iqp_cancel_(struct upcie_served_iqp *q)
{
	for (uint32_t t = 0; t < q->depth; t++) {
		struct upcie_served_iqp_tag_ *g = &q->tags[t];
		struct upcie_served_cpl c;

		if (!g->busy)
			continue;
		memset(&c, 0, sizeof(c));
		c.tag = (uint16_t)t;
		c.err = -ECANCELED;
		g->busy = false;
		q->pending--;
		g->next = q->free_tag;
		q->free_tag = (uint16_t)t;
		if (g->cb)
			g->cb(g->ctx, &c);
	}
}

/*
 * Take up to `max` completions (callbacks run here). Returns how many; -ENODEV when the server
 * faulted the queue (a ring index out of range: ours is wrong; delete it) with nothing left to
 * take; -EINVAL.
 */
static inline int upcie_served_iqp_poll(struct upcie_served_iqp *q, unsigned max)
{
	uint32_t tail;
	int n = 0;

	if (UPCIE_UNLIKELY(!q || !q->live))
		return -EINVAL;
	tail = __atomic_load_n(&q->ring->cq_tail, __ATOMIC_ACQUIRE);
	while (q->cq_head != tail && (unsigned)n < max) {
		struct upcie_served_cpl c;
		struct upcie_served_iqp_tag_ *g;

		memcpy(&c, &q->cpls[q->cq_head % q->depth], sizeof(c));
		q->cq_head++;
		n++;
		if (c.tag >= q->depth || !q->tags[c.tag].busy) {
			q->bogus++;
			continue;
		}
		g = &q->tags[c.tag];
		g->busy = false;
		q->pending--;
		g->next = q->free_tag;
		q->free_tag = c.tag;
		if (g->cb)
			g->cb(g->ctx, &c);
	}
	if (n)
		__atomic_store_n(&q->ring->cq_head, q->cq_head, __ATOMIC_RELEASE);
	if (!n && __atomic_load_n(&q->cl->relay->slot[q->slot].state, __ATOMIC_ACQUIRE) ==
		      UPCIE_SERVED_SLOT_FAULT)
		return -ENODEV;
	return n;
}

/*
 * Poll until no command is pending or timeout_ns passes; the server's presence is checked
 * every millisecond of waiting. Returns 0; -ETIMEDOUT; -ENODEV (faulted, see _iqp_poll());
 * -ENOTCONN (the server is gone and the device stopped: every pending command ended with
 * -ECANCELED, the buffers are the caller's again).
 */
static inline int upcie_served_iqp_wait(struct upcie_served_iqp *q, uint64_t timeout_ns)
{
	uint64_t t0 = upcie_time_ns(), check = t0 + 1000000;
	unsigned idle = 0;

	if (!q || !q->live)
		return -EINVAL;
	upcie_served_iqp_ring(q);
	while (q->pending) {
		int n = upcie_served_iqp_poll(q, 0xffffffffu);
		uint64_t now;

		if (n < 0)
			return n;
		if (n || ++idle & 63) {
			upcie_cpu_relax();
			continue;
		}
		now = upcie_time_ns();
		if (now >= check) {
			check = now + 1000000;
			if (upcie_served_alive(q->cl) == -ENOTCONN) {
				upcie_served_iqp_cancel_(q);
				return -ENOTCONN;
			}
		}
		if (now - t0 >= timeout_ns)
			return -ETIMEDOUT;
	}
	return 0;
}

/*
 * Delete the isolated queue pair: the server finishes or aborts what it holds (up to a second)
 * and deletes its queue; completions it posted are taken here, whatever is left ends with
 * -ECANCELED. Returns 0; -EBUSY (the server could not delete its queue, or is gone without the
 * device seen stopped: commands stay pending, buffers in use).
 */
static inline int upcie_served_iqp_delete(struct upcie_served_iqp *q)
{
	struct upcie_served_req rq;
	int err;

	if (!q || !q->live) {
		if (q)
			memset(q, 0, sizeof(*q));
		return 0;
	}
	upcie_served_iqp_ring(q);
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_QP_DELETE;
	rq.u.qp_delete.slot = q->slot;
	err = upcie_served_call_(q->cl, &rq, -1, NULL, NULL);
	if (err == -ENOTCONN && upcie_served_alive(q->cl) == -ENOTCONN)
		err = 0;
	if (err == -ENOTCONN || err == -EBUSY)
		return -EBUSY;
	while (upcie_served_iqp_poll(q, 0xffffffffu) > 0)
		;
	upcie_served_iqp_cancel_(q);
	munmap(q->ring, q->ring_size);
	free(q->tags);
	q->cl->nqp--;
	memset(q, 0, sizeof(*q));
	return err == -ENOENT ? 0 : err;
}

#endif /* UPCIE_SERVED_CLIENT_ISO_H */
