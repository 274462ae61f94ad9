/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer harness: the submission ring of an isolated queue pair (served/server.h), every
 * field of every submission and both ring indices the client controls as hostile input. One
 * server over the controller model lives for the whole run, granting namespace 1's blocks
 * [1024, 3072) read-write to everyone. Each input is one isolated client: HELLO, one 1 MiB
 * region, one queue pair of 16; then a sequence of steps, each a selector byte and its bytes:
 * 0: a 64-byte submission at the tail (tail advanced), 1: sq_tail set to any 32-bit value,
 * 2: cq_head set to any 32-bit value, 3: the poller swept once here, or (selector bit 2) the
 * relay page's poller word set to any 32-bit value and the connection's wake eventfd written
 * (bit 3: and read empty), while the server's poller thread sleeps and wakes on its own. Then
 * the client's queue is deleted and it hangs up.
 * Checked after every input: the namespace outside the grant is byte for byte what it was, no
 * data transfer landed outside the client's registered memory, nothing was written into memory
 * given back, every completion the server posted names a refusal it documents or the
 * controller's status, no queue is left on the controller, nothing was kept, and the controller
 * is still ready. ASan and UBSan report the rest.
 */
#include <upcie/served/server.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "nvme_ctrl_rig.h"
#include "served_win.h"

#define FZ_DEPTH 16u

static struct rig *R;
static struct upcie_served S;
static uint8_t *Snap; /* the namespace as it was: what lies outside the grant must stay */

static void fz_log(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)msg;
	(void)ctx;
}

static void fz_init(void)
{
	struct upcie_served_mapper map = { .map = served_win_map };
	static struct upcie_served_grant g = { -1,   -1,  1, UPCIE_SERVED_READ | UPCIE_SERVED_WRITE,
					       1024, 2048 };
	struct upcie_served_opts o;
	static char path[108];

	upcie_log_set_handler(fz_log, NULL);
	R = (struct rig *)calloc(1, sizeof(*R));
	rig_setup(R);
	R->cm.abort_on_sq_delete = true;
	if (served_win_setup(&R->cm, &R->im) || rig_start(R) || rig_ctrl(R, NULL))
		abort();
	rig_fill(R->ns, (uint64_t)RIG_NS_BLOCKS * RIG_LBA, 0x5eed);
	Snap = (uint8_t *)malloc((size_t)RIG_NS_BLOCKS * RIG_LBA);
	memcpy(Snap, R->ns, (size_t)RIG_NS_BLOCKS * RIG_LBA);
	snprintf(path, sizeof(path), "/tmp/upcie-fuzz-served-ring-%d.sock", (int)getpid());
	memset(&o, 0, sizeof(o));
	o.path = path;
	o.gid = (gid_t)-1;
	o.allow_uid = -1;
	o.trust = UPCIE_SERVED_TRUST_NONE;
	o.grants = &g;
	o.ngrants = 1;
	o.max_clients = 2;
	o.max_qp = 2;
	o.max_mem = 2;
	o.max_bytes = 8u << 20;
	if (upcie_served_init(&S, &R->c, &map, &o))
		abort();
}

static void fz_report(void)
{
	if (R && getenv("FUZZ_SERVED_STATS"))
		fprintf(stderr, "served ring: %llu submissions sent, %llu refused, %llu faults\n",
			(unsigned long long)S.st.iso_ok, (unsigned long long)S.st.iso_bad,
			(unsigned long long)S.st.faults);
}

/* One request on the raw connection, served here. Returns the response's err. */
static int fz_call(int c, uint32_t slot, struct upcie_served_req *rq, int fd, int *got,
		   struct upcie_served_rsp *rp)
{
	uint8_t rbuf[UPCIE_SERVED_MSG_MAX];

	rq->magic = UPCIE_SERVED_MAGIC;
	if (upcie_served_send_(c, rq, sizeof(*rq), fd) || !upcie_served_serve_(&S, slot))
		abort();
	if (upcie_served_recv_(c, rbuf, sizeof(rbuf), got, MSG_DONTWAIT) < (ssize_t)sizeof(*rp))
		abort();
	memcpy(rp, rbuf, sizeof(*rp));
	return rp->err;
}

static void fz_sweep(void)
{
	bool busy = false;

	pthread_mutex_lock(&S.lock);
	upcie_served_relay_sweep_(&S, &busy);
	pthread_mutex_unlock(&S.lock);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct upcie_served_req rq;
	struct upcie_served_rsp rp;
	struct sockaddr_un sa;
	struct upcie_served_ring *ring;
	struct upcie_served_relay *relay;
	struct upcie_served_sub *subs;
	const struct upcie_served_cpl *cpls;
	uint32_t slot = UINT32_MAX, qslot, tail = 0;
	size_t rsize;
	int c, fd, got = -1, wfd = -1;
	void *p;

	if (!R) {
		fz_init();
		atexit(fz_report);
	}
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, S.path, strlen(S.path));
	c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c < 0 || connect(c, (struct sockaddr *)&sa, sizeof(sa)))
		abort();
	upcie_served_accept_(&S);
	for (uint32_t i = 0; i < S.o.max_clients; i++)
		if (S.conns[i])
			slot = i;
	if (slot == UINT32_MAX)
		abort();
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_HELLO;
	rq.u.hello.version = UPCIE_SERVED_VERSION;
	if (fz_call(c, slot, &rq, -1, &got, &rp) || !rp.u.hello.isolated || got < 0)
		abort();
	relay = (struct upcie_served_relay *)mmap(NULL, sizeof(*relay), PROT_READ | PROT_WRITE,
						  MAP_SHARED, got, 0);
	close(got);
	if (relay == MAP_FAILED)
		abort();
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_WAKE;
	if (fz_call(c, slot, &rq, -1, &wfd, &rp) || wfd < 0)
		abort();
	fd = memfd_create("fz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, 1 << 20) || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK))
		abort();
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_MEM_REG;
	rq.u.mem_reg.size = 1 << 20;
	if (fz_call(c, slot, &rq, fd, &got, &rp))
		abort();
	close(fd);
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_IQP_CREATE;
	rq.u.iqp_create.depth = FZ_DEPTH;
	if (fz_call(c, slot, &rq, -1, &got, &rp) || got < 0)
		abort();
	qslot = rp.u.iqp_create.slot;
	rsize = (size_t)rp.u.iqp_create.ring_size;
	p = mmap(NULL, rsize, PROT_READ | PROT_WRITE, MAP_SHARED, got, 0);
	close(got);
	if (p == MAP_FAILED)
		abort();
	ring = (struct upcie_served_ring *)p;
	subs = (struct upcie_served_sub *)(ring + 1);
	cpls = (const struct upcie_served_cpl *)(subs + FZ_DEPTH);
	while (size) {
		uint8_t sel = data[0];
		size_t take;
		uint32_t v = 0;

		data++;
		size--;
		switch (sel & 3) {
		case 0:
			take = size < sizeof(*subs) ? size : sizeof(*subs);
			memset(&subs[tail % FZ_DEPTH], 0, sizeof(*subs));
			memcpy(&subs[tail % FZ_DEPTH], data, take);
			if (sel & 0x4) /* aim at the grant, to reach the controller */
				subs[tail % FZ_DEPTH].slba =
				    1024 + subs[tail % FZ_DEPTH].slba % 2100;
			if (sel & 0x8)
				subs[tail % FZ_DEPTH].region = 1;
			tail++;
			__atomic_store_n(&ring->sq_tail, tail, __ATOMIC_RELEASE);
			break;
		case 1:
		case 2:
			take = size < 4 ? size : 4;
			memcpy(&v, data, take);
			if ((sel & 3) == 1) {
				tail = v;
				__atomic_store_n(&ring->sq_tail, v, __ATOMIC_RELEASE);
			} else {
				__atomic_store_n(&ring->cq_head, v, __ATOMIC_RELEASE);
			}
			break;
		default:
			if (!(sel & 0x4)) {
				take = 0;
				fz_sweep();
				break;
			}
			take = size < 4 ? size : 4;
			memcpy(&v, data, take);
			__atomic_store_n(&relay->slot[0].poller, v, __ATOMIC_SEQ_CST);
			{
				uint64_t one = 1;

				if (write(wfd, &one, sizeof(one)) < 0)
					abort();
				/* empty: the poller thread may have drained it first (EAGAIN) */
				if (sel & 0x8 && read(wfd, &one, sizeof(one)) < 0 &&
				    errno != EAGAIN)
					abort();
			}
		}
		data += take;
		size -= take;
	}
	/* let what was sent finish (the model completes it; the poller thread reaps) */
	for (int i = 0; i < 20000 && S.conns[slot]->qps[qslot].inflight; i++) {
		fz_sweep();
		usleep(50);
	}
	for (uint32_t i = 0; i < FZ_DEPTH; i++) {
		int e = cpls[i].err;

		if (e && e != -EPERM && e != -ENOENT && e != -EINVAL && e != -ECANCELED &&
		    e != -EBUSY)
			abort(); /* a refusal the protocol does not name */
	}
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_QP_DELETE;
	rq.u.qp_delete.slot = qslot;
	if (fz_call(c, slot, &rq, -1, &got, &rp))
		abort();
	munmap(p, rsize);
	munmap(relay, sizeof(*relay));
	close(wfd);
	close(c);
	while (upcie_served_serve_(&S, slot))
		;
	upcie_served_conn_drop_(&S, slot);
	if (S.conns[slot] || S.nconns || S.st.kept || served_win_late || served_win_outside)
		abort();
	if (memcmp(R->ns, Snap, 1024 * RIG_LBA) ||
	    memcmp(R->ns + 3072 * RIG_LBA, Snap + 3072 * RIG_LBA,
		   (size_t)(RIG_NS_BLOCKS - 3072) * RIG_LBA))
		abort(); /* a block outside the grant changed */
	for (uint32_t q = 1; q <= R->c.nslots; q++)
		if (R->c.ioqs[q])
			abort();
	if (R->c.state != UPCIE_NVME_CTRL_READY)
		abort();
	return 0;
}
