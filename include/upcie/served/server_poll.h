/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Served queue pairs, the server's poller (one thread per served controller, started by
 * upcie_served_init() in served/server.h): it forwards the doorbell values trusted clients
 * write into their relay pages, and runs isolated queue pairs: each submission a client wrote
 * into its ring is copied once, checked (upcie_served_sub_check()) and built into an NVMe
 * command on the server's own queue, and each completion is posted back into the ring. All of
 * it under the server's lock, which the request side takes for every controller operation.
 */
#ifndef UPCIE_SERVED_SERVER_POLL_H
#define UPCIE_SERVED_SERVER_POLL_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <upcie/base/barrier.h>
#include <upcie/base/clock.h>
#include <upcie/base/log.h>
#include <upcie/base/mmio.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/prp.h>
#include <upcie/served/proto.h>
#include <upcie/served/server_state.h>

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

/* ---- isolated queue pairs ---- */

/* The namespace record of `nsid`, or NULL when no grant names it. */
static inline const struct upcie_served_ns_ *upcie_served_ns_find_(const struct upcie_served *s,
								   uint32_t nsid)
{
	for (uint32_t i = 0; i < s->nns; i++)
		if (s->ns[i].nsid == nsid)
			return &s->ns[i];
	return NULL;
}

/* Does a grant of client `cn` cover blocks [slba, slba + nlb) of `nsid` with `access`? */
static inline bool upcie_served_granted_(const struct upcie_served_conn_ *cn, uint32_t nsid,
					 uint64_t slba, uint64_t nlb, unsigned access,
					 uint64_t nsze)
{
	for (uint32_t i = 0; i < cn->ngrant; i++) {
		const struct upcie_served_grant *g = cn->grant[i];
		uint64_t end = g->nlb ? g->slba + g->nlb : nsze;

		if (g->nsid != nsid || (g->access & access) != access)
			continue;
		if (end > nsze)
			end = nsze;
		if (slba >= g->slba && slba < end && nlb <= end - slba)
			return true;
	}
	return false;
}

/*
 * Check isolated submission `u` (a copy: the client cannot change it any more) of client `cn`
 * and build the command in `sqe` (all but CID and data pointer). *mi: the data region's index
 * (-1: no data). Returns 0, or the -errno the submission is refused with: -EPERM (an opcode
 * not served, a namespace or a block range not granted), -ENOENT (no such region of this
 * client), -EINVAL (reserved bits, sizes, a range outside the region or the namespace).
 * `max_xfer`: bytes per command. Touches nothing but its arguments (fuzzed as it is).
 */
static inline int upcie_served_sub_check(const struct upcie_served *s,
					 const struct upcie_served_conn_ *cn,
					 const struct upcie_served_sub *u, uint64_t max_xfer,
					 struct upcie_nvme_sqe *sqe, int *mi)
{
	const struct upcie_served_ns_ *ns;
	bool data = false;
	unsigned access;
	uint64_t bytes;

	*mi = -1;
	memset(sqe, 0, sizeof(*sqe));
	switch (u->opc) {
	case UPCIE_NVME_NVM_READ:
	case UPCIE_NVME_NVM_COMPARE:
		access = UPCIE_SERVED_READ;
		data = true;
		break;
	case UPCIE_NVME_NVM_WRITE:
		access = UPCIE_SERVED_WRITE;
		data = true;
		break;
	case UPCIE_NVME_NVM_FLUSH:
	case UPCIE_NVME_NVM_WRITE_ZEROES:
	case UPCIE_NVME_NVM_DSM:
		access = UPCIE_SERVED_WRITE;
		break;
	default:
		return -EPERM;
	}
	if (u->rsvd0 || u->rsvd1 || u->flags & ~UPCIE_SERVED_SUB_FUA)
		return -EINVAL;
	for (unsigned i = 0; i < sizeof(u->rsvd2); i++)
		if (u->rsvd2[i])
			return -EINVAL;
	ns = upcie_served_ns_find_(s, u->nsid);
	if (!ns || !ns->ok)
		return -EPERM;
	sqe->opc = u->opc;
	sqe->nsid = u->nsid;
	if (u->opc == UPCIE_NVME_NVM_FLUSH) {
		/* the whole namespace's cache: any write grant on it */
		for (uint32_t i = 0; i < cn->ngrant; i++)
			if (cn->grant[i]->nsid == u->nsid &&
			    cn->grant[i]->access & UPCIE_SERVED_WRITE)
				return u->slba || u->nlb || u->flags || u->region || u->off ||
					       u->len
					   ? -EINVAL
					   : 0;
		return -EPERM;
	}
	if (!u->nlb || u->nlb > 65536 || u->slba >= ns->nsze || u->nlb > ns->nsze - u->slba)
		return -EINVAL;
	if (!upcie_served_granted_(cn, u->nsid, u->slba, u->nlb, access, ns->nsze))
		return -EPERM;
	sqe->cdw10 = (uint32_t)u->slba;
	sqe->cdw11 = (uint32_t)(u->slba >> 32);
	if (u->opc == UPCIE_NVME_NVM_DSM) {
		/* one range, built by the caller in the server's memory; Attribute Deallocate */
		if (u->flags || u->region || u->off || u->len)
			return -EINVAL;
		sqe->cdw10 = 0;
		sqe->cdw11 = 1u << 2;
		return 0;
	}
	/* Read, Write, Compare, Write Zeroes: NLB, FUA; never DEAC, PRINFO, directives */
	sqe->cdw12 = (u->nlb - 1) | (u->flags & UPCIE_SERVED_SUB_FUA ? 1u << 30 : 0);
	if (!data)
		return u->region || u->off || u->len ? -EINVAL : 0;
	bytes = (uint64_t)u->nlb * ns->lba_bytes;
	if (u->len != bytes || bytes > max_xfer || u->off & 3)
		return -EINVAL;
	for (uint32_t m = 0; u->region && m < s->o.max_mem; m++) {
		const struct upcie_served_mem_ *r = &cn->mems[m];

		if (!r->used || r->id != u->region)
			continue;
		if (r->kept || u->off > r->size || u->len > r->size - u->off)
			return -EINVAL;
		*mi = (int)m;
		return 0;
	}
	return -ENOENT;
}

/* Post completion `e` into the ring (room is ensured by the submission check). */
static inline void upcie_served_iso_post_(struct upcie_served_qp_ *qp, uint16_t tag,
					  uint16_t status, int32_t err, uint32_t dw0)
{
	struct upcie_served_cpl e;

	e.tag = tag;
	e.status = status;
	e.err = err;
	e.dw0 = dw0;
	e.rsvd = 0;
	memcpy((void *)&qp->cpls[qp->cq_tail % qp->depth], &e, sizeof(e));
	qp->cq_tail++;
	__atomic_store_n(&qp->ring->cq_tail, qp->cq_tail, __ATOMIC_RELEASE);
}

/* The controller's completion of an isolated command (server lock held: the poller, or the
 * deletion). */
static inline void upcie_served_iso_cpl_(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct upcie_served_iocmd_ *k = (struct upcie_served_iocmd_ *)ctx;
	struct upcie_served_qp_ *qp = k->qp;
	uint16_t code = cqe ? upcie_nvme_cqe_code(cqe) : 0;

	upcie_served_iso_post_(qp, k->tag, err == -ECANCELED ? 0 : code,
			       err == -ECANCELED ? -ECANCELED : 0, cqe ? cqe->dw0 : 0);
	if (k->mem)
		k->mem->inflight--;
	qp->inflight--;
	k->mem = NULL;
	k->next = qp->free_cmd;
	qp->free_cmd = (uint16_t)(k - qp->cmds);
}

/* Send the checked submission `u` of qp to the controller. Returns 0 or -errno. */
static inline int upcie_served_iso_send_(struct upcie_served *s, struct upcie_served_conn_ *cn,
					 struct upcie_served_qp_ *qp,
					 const struct upcie_served_sub *u)
{
	struct upcie_served_iocmd_ *k;
	struct upcie_served_mem_ *m = NULL;
	struct upcie_nvme_lists l;
	struct upcie_nvme_sqe sqe;
	uint16_t cid;
	int mi, err;

	err = upcie_served_sub_check(s, cn, u, qp->q.dptr.max_bytes, &sqe, &mi);
	if (err)
		return err;
	if (qp->free_cmd >= qp->depth || upcie_nvme_qpair_next_cid(&qp->q.qp, &cid))
		return -EBUSY; /* not reached: the ring check keeps fewer than depth in flight */
	l = upcie_nvme_ioq_lists(&qp->q, cid);
	if (mi >= 0) {
		m = &cn->mems[mi];
		err = upcie_nvme_prp_build_buf(&sqe, &m->dm, u->off, u->len, &qp->q.dptr, &l);
		if (err < 0)
			return err == -ENOSPC ? -EINVAL : err;
	} else if (u->opc == UPCIE_NVME_NVM_DSM) {
		/* the range, in the server's list page of this command: no one else writes it */
		uint8_t *r = (uint8_t *)l.mem->vaddr + l.off;
		uint64_t iova;
		uint32_t nlb = u->nlb;

		if (!l.mem->vaddr || upcie_dmamem_iova(l.mem, l.off, &iova))
			return -EOPNOTSUPP;
		memset(r, 0, 16);
		memcpy(r + 4, &nlb, 4);
		memcpy(r + 8, &u->slba, 8);
		sqe.prp1 = iova;
		upcie_nvme_sqe_set_psdt(&sqe, UPCIE_NVME_PSDT_PRP);
	}
	k = &qp->cmds[qp->free_cmd];
	err = upcie_nvme_qpair_enqueue(&qp->q.qp, &sqe, upcie_served_iso_cpl_, k, NULL);
	if (err)
		return err;
	qp->free_cmd = k->next;
	k->qp = qp;
	k->tag = u->tag;
	k->mem = m;
	if (m)
		m->inflight++;
	qp->inflight++;
	return 0;
}

/* Fault an isolated queue: the client broke the ring protocol. */
static inline void upcie_served_iso_fault_(struct upcie_served *s, struct upcie_served_conn_ *cn,
					   uint32_t k, const char *why)
{
	struct upcie_served_qp_ *qp = &cn->qps[k];

	if (qp->fault)
		return;
	qp->fault = true;
	s->st.faults++;
	UPCIE_ERR("served: client %d: isolated queue %u faulted (%s): no more submissions",
		  (int)cn->pid, k, why);
	__atomic_store_n(&cn->relay->slot[k].state, UPCIE_SERVED_SLOT_FAULT, __ATOMIC_RELEASE);
}

/* Poll isolated queue k of cn: completions, then new submissions. Lock held. Returns work done
 * (completions plus submissions taken). */
static inline unsigned upcie_served_iso_sweep_(struct upcie_served *s,
					       struct upcie_served_conn_ *cn, uint32_t k)
{
	struct upcie_served_qp_ *qp = &cn->qps[k];
	uint32_t tail, cqh, room, n = 0, sent = 0;
	int r;

	if (qp->inflight) {
		r = upcie_nvme_qpair_reap(&qp->q.qp, 0xffffffffu);
		if (r > 0) {
			n += (uint32_t)r;
			s->reaped += (uint32_t)r;
		}
	}
	if (qp->closing || qp->fault || !qp->q.live)
		return n;
	tail = __atomic_load_n(&qp->ring->sq_tail, __ATOMIC_ACQUIRE);
	if (tail == qp->sq_head)
		return n;
	cqh = __atomic_load_n(&qp->ring->cq_head, __ATOMIC_ACQUIRE);
	if (tail - qp->sq_head > qp->depth) {
		upcie_served_iso_fault_(s, cn, k, "submissions beyond the ring");
		return n;
	}
	if (qp->cq_tail - cqh > qp->depth) {
		upcie_served_iso_fault_(s, cn, k, "completions consumed that were never posted");
		return n;
	}
	room = qp->depth - (qp->cq_tail - cqh);
	while (qp->sq_head != tail && qp->inflight < room) {
		struct upcie_served_sub u;
		int err;

		/* one copy of the entry: what is checked is what is built */
		memcpy(&u, (const void *)&qp->subs[qp->sq_head % qp->depth], sizeof(u));
		qp->sq_head++;
		err = upcie_served_iso_send_(s, cn, qp, &u);
		if (err) {
			s->st.iso_bad++;
			upcie_served_iso_post_(qp, u.tag, 0, err, 0);
			room--;
		} else {
			s->st.iso_ok++;
			sent++;
		}
		n++;
	}
	__atomic_store_n(&qp->ring->sq_head, qp->sq_head, __ATOMIC_RELEASE);
	if (sent)
		upcie_nvme_qpair_ring(&qp->q.qp);
	return n;
}

/* The poller: forward new doorbell values of relayed queues, run isolated queues. Lock held.
 * Returns work done; *busy set while isolated commands are in flight. */
static inline unsigned upcie_served_relay_sweep_(struct upcie_served *s, bool *busy)
{
	unsigned n = 0;

	for (uint32_t i = 0; i < s->o.max_clients; i++) {
		struct upcie_served_conn_ *cn = s->conns[i];

		for (uint32_t k = 1; cn && k <= UPCIE_SERVED_MAX_QP; k++) {
			struct upcie_served_qp_ *qp = &cn->qps[k];
			struct upcie_served_relay_slot *sl = &cn->relay->slot[k];

			if (qp->used && qp->iso) {
				n += upcie_served_iso_sweep_(s, cn, k);
				if (qp->inflight)
					*busy = true;
				continue;
			}
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

/* Wake the poller (a queue or a wake eventfd was added, or it is to stop). Any thread. */
static inline void upcie_served_kick_(struct upcie_served *s)
{
	uint64_t one = 1;

	if (write(s->wake_ctl, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is full, a wakeup is pending anyway */
	}
}

/* Tell every client the poller sleeps (ASLEEP) or does not. Lock held. */
static inline void upcie_served_poller_word_(struct upcie_served *s, uint32_t v)
{
	for (uint32_t i = 0; i < s->o.max_clients; i++)
		if (s->conns[i])
			__atomic_store_n(&s->conns[i]->relay->slot[0].poller, v, __ATOMIC_SEQ_CST);
	s->poller_asleep = v == UPCIE_SERVED_POLLER_ASLEEP;
}

/* Does an isolated queue with commands in flight lack an interrupt vector (its completions
 * must be looked for)? Lock held. */
static inline bool upcie_served_busy_polled_(const struct upcie_served *s)
{
	if (s->irq_distrust)
		return true;
	for (uint32_t i = 0; i < s->o.max_clients; i++) {
		const struct upcie_served_conn_ *cn = s->conns[i];

		for (uint32_t k = 1; cn && cn->nqp && k <= UPCIE_SERVED_MAX_QP; k++)
			if (cn->qps[k].used && cn->qps[k].iso && cn->qps[k].inflight &&
			    !cn->qps[k].q.irq)
				return true;
	}
	return false;
}

/* Largest nap of a poller that must look again on its own (commands in flight, or a client
 * that cannot wake it), and the longest sleep of one that every client can wake (a safety
 * net: an honest client's wakeup comes first, see proto.h's relay page). */
#define UPCIE_SERVED_NAP_MAX_NS	  UINT64_C(1000000)
#define UPCIE_SERVED_MAX_IRQ_POLL 64u /* vectors in one sleep's poll set */
#define UPCIE_SERVED_SLEEP_MAX_NS UINT64_C(100000000)

/*
 * Sleep until a client's wakeup, a kick (upcie_served_kick_()), or, when `busy` (commands in
 * flight: the controller's completions are looked for, not signalled) or a client with queues
 * on the poller has no wake eventfd, *nap ns (then doubled up to UPCIE_SERVED_NAP_MAX_NS).
 * The relay page's `poller` protocol (proto.h): ASLEEP written, every queue looked at once
 * more, only then the sleep; nothing a client wrote is read but its queues' indices. Lock
 * held on entry and on return (dropped while asleep). Returns the work the second look did.
 */
static inline unsigned upcie_served_sleep_(struct upcie_served *s, struct pollfd *pf, uint32_t *idx,
					   bool busy, uint64_t *nap)
{
	bool timed = busy && upcie_served_busy_polled_(s), woke = false;
	uint64_t t0, dt, tmo;
	struct timespec ts;
	nfds_t n = 1;
	unsigned work;
	int r;

	pf[0].fd = s->wake_ctl;
	pf[0].events = POLLIN;
	for (uint32_t i = 0; i < s->o.max_clients; i++) {
		struct upcie_served_conn_ *cn = s->conns[i];

		if (!cn)
			continue;
		if (cn->wake_fd >= 0) {
			pf[n].fd = cn->wake_fd;
			pf[n].events = POLLIN;
			idx[n++] = i;
		} else if (cn->nqp) {
			timed = true; /* it would not wake us: look again on our own */
		}
	}
	/* the vectors of isolated queues with commands in flight: their completions wake us */
	for (uint32_t i = 0; busy && i < s->o.max_clients; i++) {
		struct upcie_served_conn_ *cn = s->conns[i];

		for (uint32_t k = 1; cn && cn->nqp && k <= UPCIE_SERVED_MAX_QP; k++)
			if (cn->qps[k].used && cn->qps[k].iso && cn->qps[k].inflight &&
			    cn->qps[k].q.irq &&
			    n < s->o.max_clients + 1 + UPCIE_SERVED_MAX_IRQ_POLL) {
				pf[n].fd = s->c->irqs.efd[cn->qps[k].q.vector];
				pf[n].events = POLLIN;
				idx[n++] = UINT32_MAX; /* a vector, not a client */
			}
	}
	upcie_served_poller_word_(s, UPCIE_SERVED_POLLER_ASLEEP);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	/* the second look: work published before a client could see ASLEEP */
	work = upcie_served_relay_sweep_(s, &busy);
	if (work) {
		upcie_served_poller_word_(s, UPCIE_SERVED_POLLER_AWAKE);
		s->st.relayed += work;
		return work;
	}
	tmo = timed ? *nap : UPCIE_SERVED_SLEEP_MAX_NS;
	ts.tv_sec = (time_t)(tmo / UPCIE_NSEC_PER_SEC);
	ts.tv_nsec = (long)(tmo % UPCIE_NSEC_PER_SEC);
	pthread_mutex_unlock(&s->lock);
	t0 = upcie_time_ns();
	r = ppoll(pf, n, &ts, NULL);
	dt = upcie_time_ns() - t0;
	pthread_mutex_lock(&s->lock);
	for (nfds_t k = 0; r > 0 && k < n; k++) {
		uint64_t v;

		if (!pf[k].revents)
			continue;
		/* drain it, when it is still the one polled (closed and reused meanwhile: not);
		 * a vector's eventfd lives as long as the controller */
		if (k && idx[k] != UINT32_MAX &&
		    (!s->conns[idx[k]] || s->conns[idx[k]]->wake_fd != pf[k].fd))
			continue;
		if (read(pf[k].fd, &v, sizeof(v)) == (ssize_t)sizeof(v) && k) {
			if (idx[k] == UINT32_MAX)
				s->st.irqs++;
			else
				woke = true;
		}
	}
	upcie_served_poller_word_(s, UPCIE_SERVED_POLLER_AWAKE);
	s->st.naps++;
	s->st.nap_us += dt / 1000;
	if (!timed) {
		s->st.sleeps++;
		if (r == 0)
			s->st.sleep_timeouts++;
	}
	if (woke)
		s->st.woken++;
	if (busy && !timed && r == 0) {
		/* slept on vectors to the timeout: were completions there all along? (only the
		 * controller's completions count: a client's submission that did not wake us is
		 * that client's doing) */
		uint64_t before = s->reaped, v;
		bool b2 = false, irq = false;
		unsigned late;

		/* an interrupt that came after the timeout, before this: not a missing one */
		for (nfds_t k = 1; k < n; k++)
			if (idx[k] == UINT32_MAX &&
			    read(pf[k].fd, &v, sizeof(v)) == (ssize_t)sizeof(v))
				irq = true;
		late = upcie_served_relay_sweep_(s, &b2);
		s->st.relayed += late;
		if (s->reaped != before && !irq && !s->irq_distrust) {
			s->irq_distrust = true;
			UPCIE_ERR("served: completions came without their interrupt: the poller "
				  "looks for them from now on");
		}
		upcie_served_poller_word_(s, UPCIE_SERVED_POLLER_AWAKE);
		return late;
	}
	if (timed && r == 0 && *nap < UPCIE_SERVED_NAP_MAX_NS)
		*nap *= 2;
	return 0;
}

/*
 * The poller: sweeps (upcie_served_relay_sweep_()) while there is work, spins relay_spin_ns
 * after the last, then sleeps (upcie_served_sleep_()) until a client's wakeup or the interrupt
 * of an isolated queue with commands in flight (each has an MSI-X vector of its own where the
 * controller was given vectors: vfio). A command in flight on a queue without a vector (uio,
 * no vector left, interrupts seen missing) is looked for: the poller spins 20 times
 * relay_spin_ns, at least 1 ms, then naps of 20 us doubling to 1 ms, which a client's wakeup
 * cuts short. Idle time is counted in sweeps that found nothing, not in time alone: a poller
 * the scheduler kept from running was not idle.
 */
static inline void *upcie_served_relay_main_(void *arg)
{
	struct upcie_served *s = (struct upcie_served *)arg;
	uint64_t last = upcie_time_ns(), nap = 20000, spin_busy;
	size_t np = s->o.max_clients + 1 + UPCIE_SERVED_MAX_IRQ_POLL;
	struct pollfd *pf = (struct pollfd *)calloc(np, sizeof(*pf));
	uint32_t *idx = (uint32_t *)calloc(np, sizeof(*idx));
	unsigned empty = 0;

	spin_busy = s->o.relay_spin_ns * 20 > 1000000 ? s->o.relay_spin_ns * 20 : 1000000;
	pthread_mutex_lock(&s->lock);
	while (!__atomic_load_n(&s->relay_stop, __ATOMIC_ACQUIRE)) {
		bool busy = false;
		uint64_t now;
		unsigned n;

		if (!s->nrelay) {
			/* nothing to forward (no queue, or every client maps its doorbells) */
			pthread_cond_wait(&s->relay_cv, &s->lock);
			last = upcie_time_ns();
			continue;
		}
		n = upcie_served_relay_sweep_(s, &busy);
		s->st.relayed += n;
		if (n) {
			last = upcie_time_ns();
			nap = 20000;
			empty = 0;
		} else if (++empty >= 64 && !(empty & 15)) {
			now = upcie_time_ns();
			/* in flight on a queue without a vector: its completion is looked for */
			bool polled = busy && upcie_served_busy_polled_(s);

			if (now - last > (polled ? spin_busy : s->o.relay_spin_ns)) {
				if (!pf || !idx) {
					/* no memory for the poll set: the old naps */
					struct timespec ts = { 0, (long)nap };

					pthread_mutex_unlock(&s->lock);
					nanosleep(&ts, NULL);
					pthread_mutex_lock(&s->lock);
					if (nap < UPCIE_SERVED_NAP_MAX_NS)
						nap *= 2;
				} else if (upcie_served_sleep_(s, pf, idx, busy, &nap)) {
					nap = 20000;
				}
				last = upcie_time_ns();
				empty = 0;
				continue;
			}
		}
		pthread_mutex_unlock(&s->lock);
		upcie_cpu_relax();
		pthread_mutex_lock(&s->lock);
	}
	pthread_mutex_unlock(&s->lock);
	free(pf);
	free(idx);
	return NULL;
}

#endif /* UPCIE_SERVED_SERVER_POLL_H */
