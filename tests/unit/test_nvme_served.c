/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Served queue pairs (served/server.h, served/client.h) across real processes: the
 * server is a forked process that owns a controller model; clients are forked processes that
 * connect over the Unix socket, register memfds and drive their queues directly. The model's
 * view of client memory goes through windows of the server's address space; a window given back
 * is marked free, and every DMA the model makes is checked against it (a DMA into a window that
 * was given back is "late"). Covered: facts and Identify through the server, verified I/O of one
 * and of several clients at once, requests that lie and random requests, kill -9 of clients with
 * commands in flight (with the negative control that gives memory back before the deletion),
 * the server killed under a client waiting on a command, a controller reset taking other
 * clients' queues, and credentials.
 */
#define UPCIE_SERVED_TEST_HOOKS 1
#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <upcie/served/client.h>
#include <upcie/served/server.h>

#include "check.h"
#include "nvme_ctrl_rig.h"
#include "served_win.h"

/* ---- the server process ---- */

struct srv_knobs {
	uint32_t io_delay_us;
	uint16_t fail_delete_sq;
	uint8_t hold_opc;
	bool unmap_first;
	mode_t mode;
	long allow_uid;
};

static volatile int srv_stop;

static void srv_term(int sig)
{
	(void)sig;
	srv_stop = 1;
}

/* Runs in the forked server; writes one "stats" line to `out` when SIGTERM ends it. */
static int server_main(const char *path, const struct srv_knobs *k, int out)
{
	struct upcie_served_mapper map = { .map = served_win_map };
	struct upcie_served_opts o;
	struct upcie_served s;
	struct rig *r = (struct rig *)calloc(1, sizeof(*r));
	char line[512];
	int err, n;

	signal(SIGTERM, srv_term);
	if (!r)
		return 2;
	rig_setup(r);
	if (served_win_setup(&r->cm, &r->im))
		return 2;
	r->cm.io_delay_us = k->io_delay_us;
	r->cm.fail_delete_sq = k->fail_delete_sq;
	r->cm.hold_opc = k->hold_opc;
	r->cm.abort_on_sq_delete = true;
	upcie_served_test_unmap_first_ = k->unmap_first;
	if (rig_start(r) || rig_ctrl(r, NULL))
		return 3;
	memset(&o, 0, sizeof(o));
	o.path = path;
	o.gid = (gid_t)-1;
	o.mode = k->mode;
	o.allow_uid = k->allow_uid;
	o.max_clients = 16;
	o.max_qp = 4;
	o.max_mem = 4;
	o.max_bytes = 32u << 20;
	err = upcie_served_init(&s, &r->c, &map, &o);
	if (err)
		return 4;
	err = upcie_served_run(&s, &srv_stop);
	n = snprintf(line, sizeof(line),
		     "stats clients=%llu refused=%llu gone=%llu qp_made=%llu qp_gone=%llu "
		     "qp_lost=%llu kept=%llu bad=%llu resets=%llu late=%llu run=%d\n",
		     (unsigned long long)s.st.clients, (unsigned long long)s.st.refused,
		     (unsigned long long)s.st.gone, (unsigned long long)s.st.qp_made,
		     (unsigned long long)s.st.qp_gone, (unsigned long long)s.st.qp_lost,
		     (unsigned long long)s.st.kept, (unsigned long long)s.st.bad,
		     (unsigned long long)s.st.resets,
		     (unsigned long long)__atomic_load_n(&served_win_late, __ATOMIC_SEQ_CST), err);
	upcie_served_fini(&s);
	/* memory given back by fini is checked too */
	n = snprintf(line + n - 1, sizeof(line) - (size_t)n + 1, " late_after_fini=%llu\n",
		     (unsigned long long)__atomic_load_n(&served_win_late, __ATOMIC_SEQ_CST));
	(void)n;
	if (write(out, line, strlen(line)) < 0)
		return 5;
	rig_teardown(r);
	free(r);
	return 0;
}

struct server {
	pid_t pid;
	int out;
	char path[108];
};

static int server_start(struct server *sv, const char *name, const struct srv_knobs *k)
{
	int p[2];
	struct srv_knobs d;

	if (!k) {
		memset(&d, 0, sizeof(d));
		d.allow_uid = -1;
		k = &d;
	}
	snprintf(sv->path, sizeof(sv->path), "/tmp/upcie-served-test-%d-%s.sock", (int)getpid(),
		 name);
	if (pipe(p))
		return -errno;
	fflush(stdout);
	sv->pid = fork();
	if (sv->pid == 0) {
		close(p[0]);
		_exit(server_main(sv->path, k, p[1]));
	}
	close(p[1]);
	sv->out = p[0];
	/* up when it answers */
	for (int i = 0; i < 500; i++) {
		struct upcie_served_client cl;

		upcie_log_set_level(UPCIE_LOG_NONE);
		if (!upcie_served_connect(&cl, sv->path, 0)) {
			upcie_served_disconnect(&cl);
			upcie_log_set_level(UPCIE_LOG_ERROR);
			return 0;
		}
		upcie_log_set_level(UPCIE_LOG_ERROR);
		usleep(10000);
	}
	return -ETIMEDOUT;
}

struct stats {
	unsigned long long clients, refused, gone, qp_made, qp_gone, qp_lost, kept, bad, resets,
	    late, late_fini;
	int run;
	bool ok;
};

/* SIGTERM the server, read its stats line, reap it. */
static struct stats server_stop(struct server *sv)
{
	struct stats st;
	char line[512];
	ssize_t n;
	int status = -1;

	memset(&st, 0, sizeof(st));
	kill(sv->pid, SIGTERM);
	n = read(sv->out, line, sizeof(line) - 1);
	waitpid(sv->pid, &status, 0);
	close(sv->out);
	if (n <= 0)
		return st;
	line[n] = 0;
	printf("#   server: %s", line);
	st.ok = sscanf(line,
		       "stats clients=%llu refused=%llu gone=%llu qp_made=%llu qp_gone=%llu "
		       "qp_lost=%llu kept=%llu bad=%llu resets=%llu late=%llu run=%d "
		       "late_after_fini=%llu",
		       &st.clients, &st.refused, &st.gone, &st.qp_made, &st.qp_gone, &st.qp_lost,
		       &st.kept, &st.bad, &st.resets, &st.late, &st.run, &st.late_fini) == 12 &&
		WIFEXITED(status) && WEXITSTATUS(status) == 0;
	return st;
}

/* ---- a client ---- */

#define C_DATA	 (1u << 20) /* data buffers from 1 MiB of the region */
#define C_REGION (4u << 20)
#define C_DEPTH	 32u

struct cio {
	int done, err, calls;
};

static void cio_cb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct cio *c = (struct cio *)ctx;

	c->calls++;
	c->done = 1;
	c->err = err ? err : upcie_nvme_cqe_ok(cqe) ? 0 : -EIO;
}

struct client {
	struct upcie_served_client cl;
	struct upcie_served_mem mem;
	struct upcie_served_qp qp;
};

static int client_open(struct client *c, const char *path, unsigned depth)
{
	struct upcie_served_qp_opts o;
	int err = upcie_served_connect(&c->cl, path, 0);

	if (err)
		return err;
	err = upcie_served_mem_alloc(&c->cl, C_REGION, &c->mem);
	if (err)
		return err;
	memset(&o, 0, sizeof(o));
	o.depth = depth;
	o.sq_off = 0;
	o.cq_off = 64 * 1024;
	o.list_off = 128 * 1024;
	return upcie_served_qp_create(&c->cl, &c->qp, &c->mem, &o);
}

static void client_close(struct client *c)
{
	upcie_served_qp_delete(&c->qp);
	upcie_served_mem_free(&c->mem);
	upcie_served_disconnect(&c->cl);
}

static void fill(uint8_t *p, unsigned id, uint64_t lba, unsigned seq)
{
	for (unsigned i = 0; i < 4096; i += 8) {
		uint64_t v = ((uint64_t)id << 56) ^ ((lba + i / 512) << 20) ^ seq ^ i;

		memcpy(p + i, &v, 8);
	}
}

/*
 * `rounds` rounds of `qd` 4 KiB writes then reads of the client's own 8-block slots (LBA
 * base + slot * 8), each read compared with what was written. Returns 0 or the first error
 * (-EILSEQ: data mismatch). rounds < 0: forever (until killed).
 */
static int client_rounds(struct client *c, unsigned id, uint64_t base, unsigned qd, int rounds)
{
	uint8_t *va = (uint8_t *)c->mem.vaddr;
	struct cio io[64];

	for (unsigned seq = 1; rounds < 0 || (int)seq <= rounds; seq++) {
		for (int pass = 0; pass < 2; pass++) {
			for (unsigned k = 0; k < qd; k++) {
				uint64_t off = C_DATA + (uint64_t)(pass * 64 + k) * 4096;
				int err;

				if (!pass)
					fill(va + off, id, base + k * 8, seq);
				else
					memset(va + off, 0, 4096);
				memset(&io[k], 0, sizeof(io[k]));
				err = upcie_served_qp_rw(
				    &c->qp, pass ? UPCIE_NVME_NVM_READ : UPCIE_NVME_NVM_WRITE, 1,
				    base + k * 8, 8, &c->mem, off, 4096, cio_cb, &io[k]);
				if (err)
					return err;
			}
			int err = upcie_served_qp_wait(&c->qp, 5000000000ull);

			if (err)
				return err;
			for (unsigned k = 0; k < qd; k++)
				if (io[k].calls != 1 || io[k].err)
					return io[k].err ? io[k].err : -EPROTO;
		}
		for (unsigned k = 0; k < qd; k++) {
			uint8_t want[4096];

			fill(want, id, base + k * 8, seq);
			if (memcmp(va + C_DATA + (uint64_t)(64 + k) * 4096, want, 4096))
				return -EILSEQ;
		}
	}
	return 0;
}

/* Fork a client doing `rounds` rounds (forever if < 0); its exit status is 0 or -err. */
static pid_t client_fork(const char *path, unsigned id, unsigned qd, int rounds)
{
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct client c;
		int err;

		upcie_log_set_level(UPCIE_LOG_NONE);
		memset(&c, 0, sizeof(c));
		err = client_open(&c, path, C_DEPTH);
		if (!err)
			err = client_rounds(&c, id, (uint64_t)(id % 16) * 512, qd, rounds);
		client_close(&c);
		_exit(err ? (-err & 0x7f) : 0);
	}
	return pid;
}

static int wait_status(pid_t pid)
{
	int st = 0;

	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- the tests ---- */

static void test_basic(void)
{
	struct server sv;
	struct client c;
	uint8_t id[4096];
	struct stats st;
	int err;

	CHECK_EQ(server_start(&sv, "basic", NULL), 0, "server up");
	memset(&c, 0, sizeof(c));
	err = upcie_served_connect(&c.cl, sv.path, 0);
	CHECK_EQ(err, 0, "connect");
	CHECK(c.cl.info.page_shift == 12 && c.cl.info.mqes >= 32 && c.cl.info.max_qp == 4 &&
		  c.cl.info.server_pid == sv.pid && !c.cl.info.hugetlb,
	      "HELLO: controller page %u, MQES %u, 4 queue pairs, the server's pid",
	      c.cl.info.page_shift, c.cl.info.mqes);
	CHECK_EQ(upcie_served_identify(&c.cl, UPCIE_NVME_CNS_CTRL, 0, id), 0,
		 "Identify Controller through the server");
	CHECK(id[0] | id[1], "its PCI vendor id is there (0x%02x%02x)", id[1], id[0]);
	CHECK_EQ(upcie_served_identify(&c.cl, UPCIE_NVME_CNS_NS, 1, id), 0, "Identify Namespace 1");
	CHECK_EQ(((struct upcie_nvme_id_ns *)id)->nsze, RIG_NS_BLOCKS, "NSZE");
	CHECK_EQ(upcie_served_identify(&c.cl, 0x10, 0, id), -EPERM,
		 "CNS 0x10 (allocated namespaces) is not served");
	upcie_served_disconnect(&c.cl);

	memset(&c, 0, sizeof(c));
	err = client_open(&c, sv.path, C_DEPTH);
	CHECK_EQ(err, 0, "client: connect, 4 MiB memfd registered, queue pair of 32 created");
	CHECK_EQ(client_rounds(&c, 1, 512, 16, 8), 0, "8 rounds of 16 writes + reads verified");
	CHECK_EQ(upcie_served_mem_free(&c.mem), -EBUSY,
		 "the region of a live queue pair cannot be unregistered");
	CHECK_EQ(upcie_served_qp_delete(&c.qp), 0, "queue pair deleted");
	CHECK_EQ(upcie_served_mem_free(&c.mem), 0, "region unregistered, freed");
	upcie_served_disconnect(&c.cl);

	/* several at once */
	{
		pid_t p[8];
		int bad = 0;

		for (unsigned i = 0; i < 8; i++)
			p[i] = client_fork(sv.path, i + 2, 8, 20);
		for (unsigned i = 0; i < 8; i++)
			bad += wait_status(p[i]) != 0;
		CHECK_EQ(bad, 0, "8 client processes at once, 20 verified rounds of 8 each");
	}
	st = server_stop(&sv);
	/* (the last hang-up may reach the server after its stop: fini drops that client) */
	CHECK(st.ok && st.clients == 11 && st.qp_made == 9 && st.qp_gone == 9 && st.kept == 0 &&
		  st.late == 0 && st.late_fini == 0,
	      "server: 11 clients, 9 queue pairs made and deleted, nothing kept, no late DMA");
}

/* Raw requests on a connected socket (after HELLO). Returns the response's err. */
static int raw_call(int sock, struct upcie_served_req *rq, int fd, int *got)
{
	uint8_t buf[UPCIE_SERVED_MSG_MAX];
	struct upcie_served_rsp *rp = (struct upcie_served_rsp *)buf;
	ssize_t n;

	rq->magic = UPCIE_SERVED_MAGIC;
	if (upcie_served_send_(sock, rq, sizeof(*rq), fd))
		return -EPIPE;
	n = upcie_served_recv_(sock, buf, sizeof(buf), got, 0);
	if (n < (ssize_t)sizeof(*rp))
		return n <= 0 ? -ENOTCONN : -EPROTO;
	return rp->err;
}

static int memfd_sized(size_t size, bool seal)
{
	int fd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd >= 0 && ftruncate(fd, (off_t)size))
		return -1;
	if (seal && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK))
		return -1;
	return fd;
}

static void test_lies(void)
{
	struct upcie_served_req rq;
	struct server sv;
	struct client c, d;
	struct stats st;
	int fd, got;

	CHECK_EQ(server_start(&sv, "lies", NULL), 0, "server up");
	memset(&c, 0, sizeof(c));
	CHECK_EQ(client_open(&c, sv.path, C_DEPTH), 0, "an honest client");
	upcie_log_set_level(UPCIE_LOG_NONE);
	memset(&d, 0, sizeof(d));
	CHECK_EQ(upcie_served_connect(&d.cl, sv.path, 0), 0, "a lying client connects");
	fd = memfd_sized(1 << 20, false);
	CHECK_EQ(upcie_served_mem_register(&d.cl, fd, (void *)16, 1 << 20, &d.mem), -EPERM,
		 "an unsealed memfd is refused");
	close(fd);
	{
		int pp[2];

		CHECK(!pipe(pp), "a pipe");
		CHECK_EQ(upcie_served_mem_register_dmabuf(&d.cl, pp[0], 4096, &d.mem), -EOPNOTSUPP,
			 "a descriptor that is not a file, as a dma-buf: this server maps none");
		close(pp[0]);
		close(pp[1]);
	}
	fd = memfd_sized(1 << 20, true);
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_MEM_REG;
	rq.u.mem_reg.size = 2 << 20;
	CHECK_EQ(raw_call(d.cl.sock, &rq, fd, &got), -EINVAL, "a size beyond the file is refused");
	rq.u.mem_reg.size = 1000;
	CHECK_EQ(raw_call(d.cl.sock, &rq, fd, &got), -EINVAL, "a size not a page multiple");
	rq.u.mem_reg.size = 64u << 20;
	CHECK_EQ(raw_call(d.cl.sock, &rq, fd, &got), -EINVAL, "a size beyond the client's limit");
	rq.u.mem_reg.size = 1 << 20;
	CHECK_EQ(raw_call(d.cl.sock, &rq, -1, &got), -EBADF, "MEM_REG without a descriptor");
	CHECK_EQ(raw_call(d.cl.sock, &rq, fd, &got), 0, "a sealed memfd of 1 MiB is registered");
	close(fd);
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_QP_CREATE;
	rq.u.qp_create.mem_id = c.mem.id + 100;
	rq.u.qp_create.depth = 16;
	rq.u.qp_create.cq_off = 4096;
	CHECK_EQ(raw_call(d.cl.sock, &rq, -1, &got), -ENOENT, "a queue on a region not its own");
	rq.u.qp_create.mem_id = 1;
	rq.u.qp_create.cq_off = 100;
	CHECK_EQ(raw_call(d.cl.sock, &rq, -1, &got), -EINVAL, "a CQ not page aligned");
	rq.u.qp_create.cq_off = 0;
	CHECK_EQ(raw_call(d.cl.sock, &rq, -1, &got), -EINVAL, "SQ and CQ overlapping");
	rq.u.qp_create.cq_off = (1 << 20) - 4096;
	rq.u.qp_create.depth = 1024;
	CHECK_EQ(raw_call(d.cl.sock, &rq, -1, &got), -EINVAL, "a CQ running past the region");
	rq.u.qp_create.depth = 0;
	CHECK_EQ(raw_call(d.cl.sock, &rq, -1, &got), -EINVAL, "depth 0");
	rq.u.qp_create.depth = 1u << 20;
	CHECK_EQ(raw_call(d.cl.sock, &rq, -1, &got), -EINVAL, "depth 2^20");
	rq.u.qp_create.depth = 16;
	rq.u.qp_create.sq_off = UINT64_MAX - 4095;
	CHECK_EQ(raw_call(d.cl.sock, &rq, -1, &got), -EINVAL, "an SQ offset near 2^64");
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_QP_DELETE;
	rq.u.qp_delete.slot = c.qp.slot;
	CHECK_EQ(raw_call(d.cl.sock, &rq, -1, &got), -ENOENT,
		 "deleting the honest client's queue slot: not its own");
	rq.u.qp_delete.slot = 1000;
	CHECK_EQ(raw_call(d.cl.sock, &rq, -1, &got), -ENOENT, "slot 1000");
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_MEM_UNREG;
	rq.u.mem_unreg.id = 77;
	CHECK_EQ(raw_call(d.cl.sock, &rq, -1, &got), -ENOENT,
		 "unregistering a region id not its own");
	rq.op = UPCIE_SERVED_OP_DOORBELLS;
	CHECK_EQ(raw_call(d.cl.sock, &rq, -1, &got), -EPERM,
		 "doorbell mapping refused (not granted by this server)");
	rq.op = 99;
	CHECK_EQ(raw_call(d.cl.sock, &rq, -1, &got), -EOPNOTSUPP, "unknown request");
	/* random requests: each answered with an error or served, never a crash */
	{
		uint64_t x = 0x9e3779b97f4a7c15ull;
		int served = 0, answered = 0;

		for (int i = 0; i < 3000; i++) {
			for (unsigned b = 0; b < sizeof(rq); b += 8) {
				x ^= x << 13;
				x ^= x >> 7;
				x ^= x << 17;
				memcpy((uint8_t *)&rq + b, &x,
				       sizeof(rq) - b < 8 ? sizeof(rq) - b : 8);
			}
			rq.op = 1 + (uint32_t)(x % 8);
			if (rq.op == UPCIE_SERVED_OP_MEM_REG)
				rq.u.mem_reg.size = (x >> 8) % (3u << 20);
			if (rq.op == UPCIE_SERVED_OP_QP_CREATE) {
				rq.u.qp_create.mem_id = (uint32_t)(x >> 40) % 4;
				rq.u.qp_create.depth = (uint32_t)(x >> 20) % 70;
				rq.u.qp_create.sq_off = ((x >> 4) % 300) * 4096;
				rq.u.qp_create.cq_off = ((x >> 12) % 300) * 4096;
			}
			if (rq.op == UPCIE_SERVED_OP_QP_DELETE ||
			    rq.op == UPCIE_SERVED_OP_MEM_UNREG)
				rq.u.qp_delete.slot = (uint32_t)(x >> 30) % 6;
			fd = rq.op == UPCIE_SERVED_OP_MEM_REG ? memfd_sized(1 << 20, x & 1) : -1;
			int e = raw_call(d.cl.sock, &rq, fd, &got);

			if (fd >= 0)
				close(fd);
			if (got >= 0)
				close(got);
			if (e == -ENOTCONN || e == -EPIPE || e == -EPROTO)
				break;
			answered++;
			served += e == 0;
		}
		CHECK_EQ(answered, 3000, "3000 random requests all answered (%d served)", served);
	}
	/* garbage framing: answered with -EPROTO once, then hung up */
	{
		char junk[7] = "garbage";

		CHECK(send(d.cl.sock, junk, sizeof(junk), MSG_NOSIGNAL) == sizeof(junk),
		      "7 bytes of junk sent");
		uint8_t buf[512];
		ssize_t n = recv(d.cl.sock, buf, sizeof(buf), 0);

		CHECK(n >= (ssize_t)sizeof(struct upcie_served_rsp) &&
			  ((struct upcie_served_rsp *)buf)->err == -EPROTO,
		      "junk: -EPROTO");
		CHECK_EQ(recv(d.cl.sock, buf, sizeof(buf), 0), 0, "then the server hangs up");
	}
	upcie_served_disconnect(&d.cl);
	upcie_log_set_level(UPCIE_LOG_ERROR);
	CHECK_EQ(client_rounds(&c, 1, 512, 16, 4), 0,
		 "the honest client's I/O still verifies after all that");
	client_close(&c);
	st = server_stop(&sv);
	CHECK(st.ok && st.bad > 20 && st.kept == 0 && st.late == 0 && st.late_fini == 0,
	      "server: %llu requests refused, nothing kept, no late DMA", st.bad);
}

/*
 * Clients with commands in flight (the model takes `delay` us per command) killed at random
 * points, respawned, while two clients verify their data throughout. Returns the stats.
 */
static struct stats kill_loop(const char *name, bool unmap_first, int kills, int *survivors_bad,
			      int *killed)
{
	struct srv_knobs k;
	struct server sv;
	pid_t victim[4], keep[2];
	uint64_t x = 0x1234567;
	struct stats st;

	memset(&st, 0, sizeof(st));
	memset(&k, 0, sizeof(k));
	k.allow_uid = -1;
	k.io_delay_us = 20000;
	k.unmap_first = unmap_first;
	/* the control: reads held by the controller, so every kill leaves commands that the
	 * deletion ends (their completions land in the client's CQ) */
	if (unmap_first)
		k.hold_opc = UPCIE_NVME_NVM_READ;
	*killed = 0;
	*survivors_bad = 0;
	if (server_start(&sv, name, &k))
		return st;
	for (unsigned i = 0; i < 2; i++)
		keep[i] = client_fork(sv.path, 10 + i, 4, 30);
	for (unsigned i = 0; i < 4; i++)
		victim[i] = client_fork(sv.path, 20 + i, 16, -1);
	for (int n = 0; n < kills; n++) {
		unsigned i;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		i = (unsigned)(x % 4);
		usleep(30000 + (useconds_t)((x >> 8) % 120000));
		kill(victim[i], SIGKILL);
		int ws = wait_status(victim[i]);
		if (ws == 128 + SIGKILL)
			(*killed)++;
		else
			printf("#   victim %u ended by itself: %d\n", i, ws);
		victim[i] = client_fork(sv.path, 20 + i, 16, -1);
	}
	for (unsigned i = 0; i < 4; i++) {
		kill(victim[i], SIGKILL);
		wait_status(victim[i]);
	}
	for (unsigned i = 0; i < 2; i++)
		*survivors_bad += wait_status(keep[i]) != 0;
	usleep(200000); /* the last hang-ups handled, late commands of the model due */
	st = server_stop(&sv);
	return st;
}

static void test_kill(void)
{
	int bad, killed;
	struct stats st = kill_loop("kill", false, 24, &bad, &killed);

	CHECK(st.ok, "server ran and reported");
	CHECK_EQ(killed, 24, "24 clients killed with commands in flight");
	CHECK_EQ(bad, 0, "2 clients verifying their data throughout: every round matched");
	CHECK(st.qp_made == st.qp_gone && st.kept == 0,
	      "every queue pair deleted with the controller's confirmation (%llu made, %llu "
	      "deleted, %llu kept)",
	      st.qp_made, st.qp_gone, st.kept);
	CHECK(st.late == 0 && st.late_fini == 0, "no DMA into memory given back (%llu)", st.late);
	CHECK(st.clients >= 30 && st.gone + 2 >= st.clients,
	      "the server saw the hang-ups (%llu of %llu clients)", st.gone, st.clients);

	st = kill_loop("kill-control", true, 8, &bad, &killed);
	CHECK(st.ok && st.late >= 16,
	      "negative control: memory given back before the deletion is caught (%llu late DMA "
	      "accesses over %d kills)",
	      st.late, killed);
}

static void test_server_death(void)
{
	struct srv_knobs k;
	struct server sv;
	struct client c;
	struct cio io;
	uint64_t t0;
	int err, status;

	memset(&k, 0, sizeof(k));
	k.allow_uid = -1;
	k.hold_opc = UPCIE_NVME_NVM_READ;
	CHECK_EQ(server_start(&sv, "death", &k), 0, "server up (reads held by the controller)");
	memset(&c, 0, sizeof(c));
	CHECK_EQ(client_open(&c, sv.path, C_DEPTH), 0, "client up");
	memset(&io, 0, sizeof(io));
	CHECK_EQ(upcie_served_qp_rw(&c.qp, UPCIE_NVME_NVM_READ, 1, 0, 8, &c.mem, C_DATA, 4096,
				    cio_cb, &io),
		 0, "a read submitted");
	CHECK_EQ(upcie_served_qp_wait(&c.qp, 50000000), -ETIMEDOUT,
		 "held: the wait times out, the read still outstanding");
	CHECK_EQ(upcie_served_mem_free(&c.mem), -EBUSY, "its memory is not given back");
	kill(sv.pid, SIGKILL);
	t0 = upcie_time_ns();
	err = upcie_served_qp_wait(&c.qp, 5000000000ull);
	CHECK_EQ(err, -ENOTCONN, "server killed: the wait returns -ENOTCONN in %.1f ms",
		 (double)(upcie_time_ns() - t0) / 1e6);
	CHECK(io.calls == 1 && io.err == -ECANCELED, "the read ended once, -ECANCELED (%d calls)",
	      io.calls);
	CHECK_EQ(upcie_served_qp_delete(&c.qp), 0, "the queue is let go");
	CHECK_EQ(upcie_served_mem_free(&c.mem), 0, "the memory is given back (server gone)");
	upcie_served_disconnect(&c.cl);
	waitpid(sv.pid, &status, 0);
	close(sv.out);
	upcie_log_set_level(UPCIE_LOG_NONE);
	CHECK(upcie_served_connect(&c.cl, sv.path, 0) == -ECONNREFUSED,
	      "a new connection is refused (the socket file is stale)");
	upcie_log_set_level(UPCIE_LOG_ERROR);
	/* a restarted server replaces the stale socket file */
	snprintf(sv.path, sizeof(sv.path), "/tmp/upcie-served-test-%d-death.sock", (int)getpid());
	CHECK_EQ(server_start(&sv, "death", NULL), 0, "a server restarted on the same path");
	memset(&c, 0, sizeof(c));
	CHECK_EQ(client_open(&c, sv.path, C_DEPTH), 0, "a client of the new server");
	CHECK_EQ(client_rounds(&c, 3, 0, 8, 4), 0, "its I/O verifies");
	client_close(&c);
	server_stop(&sv);
}

static void test_reset(void)
{
	struct srv_knobs k;
	struct server sv;
	struct client a, b;
	struct cio io;
	struct stats st;

	memset(&k, 0, sizeof(k));
	k.allow_uid = -1;
	k.fail_delete_sq = 0x0001; /* Invalid Command Opcode: a deletion the controller refuses */
	k.hold_opc = UPCIE_NVME_NVM_READ;
	CHECK_EQ(server_start(&sv, "reset", &k), 0, "server up (deletions fail, reads held)");
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	CHECK_EQ(client_open(&a, sv.path, C_DEPTH), 0, "client a");
	CHECK_EQ(client_open(&b, sv.path, C_DEPTH), 0, "client b");
	memset(&io, 0, sizeof(io));
	CHECK_EQ(upcie_served_qp_rw(&b.qp, UPCIE_NVME_NVM_READ, 1, 0, 8, &b.mem, C_DATA, 4096,
				    cio_cb, &io),
		 0, "b: a read held by the controller");
	upcie_log_set_level(UPCIE_LOG_NONE);
	CHECK_EQ(upcie_served_qp_delete(&a.qp), 0,
		 "a: deletion refused by the controller, the server resets it: a's queue is gone");
	upcie_log_set_level(UPCIE_LOG_ERROR);
	CHECK_EQ(upcie_served_qp_wait(&b.qp, 1000000000), -ENODEV,
		 "b: its queue was lost to the reset (-ENODEV)");
	CHECK(io.calls == 1 && io.err == -ECANCELED, "b: its read ended once, -ECANCELED");
	CHECK_EQ(upcie_served_qp_delete(&b.qp), 0, "b: the lost queue is deleted");
	upcie_served_mem_free(&a.mem);
	upcie_served_disconnect(&a.cl);
	upcie_served_mem_free(&b.mem);
	upcie_served_disconnect(&b.cl);
	st = server_stop(&sv);
	CHECK(st.ok && st.resets == 1 && st.qp_lost == 1 && st.kept == 0 && st.late == 0,
	      "server: 1 reset, 1 queue lost, nothing kept, no late DMA");
}

/* upcie_served_connect() to `path` from a child running as `uid`: its result, or 90 when the
 * child could not switch users. */
static int connect_as(const char *path, uid_t uid)
{
	pid_t p;

	fflush(stdout);
	p = fork();
	if (!p) {
		struct upcie_served_client cl;

		upcie_log_set_level(UPCIE_LOG_NONE);
		if (setgid((gid_t)uid) || setuid(uid))
			_exit(90);
		_exit(-upcie_served_connect(&cl, path, 0));
	}
	p = wait_status(p);
	return p == 90 ? 90 : -p;
}

static void test_creds(void)
{
	struct srv_knobs k;
	struct server sv;
	pid_t p;

	if (geteuid() != 0) {
		CHECK_SKIP("credentials: needs root to switch users");
		return;
	}
	memset(&k, 0, sizeof(k));
	k.allow_uid = -1;
	CHECK_EQ(server_start(&sv, "creds", &k), 0, "server up, socket mode 0600");
	CHECK_EQ(connect_as(sv.path, 65534), -EACCES,
		 "uid 65534: connect refused by the socket's mode (-EACCES)");
	server_stop(&sv);

	k.mode = 0666;
	k.allow_uid = 4242;
	CHECK_EQ(server_start(&sv, "creds2", &k), 0, "server up, mode 0666, uid 4242 allowed");
	CHECK_EQ(connect_as(sv.path, 65534), -ENOTCONN,
		 "uid 65534: hung up on by the server (not allowed)");
	fflush(stdout);
	p = fork();
	if (!p) {
		struct client c;
		int err;

		upcie_log_set_level(UPCIE_LOG_NONE);
		if (setgid(4242) || setuid(4242))
			_exit(90);
		memset(&c, 0, sizeof(c));
		err = client_open(&c, sv.path, C_DEPTH);
		if (!err)
			err = client_rounds(&c, 5, 1024, 8, 4);
		if (!err) {
			struct upcie_served_req rq;
			int got;

			memset(&rq, 0, sizeof(rq));
			rq.op = UPCIE_SERVED_OP_DOORBELLS;
			err = raw_call(c.cl.sock, &rq, -1, &got) == -EPERM ? 0 : 77;
		}
		client_close(&c);
		_exit(err ? 1 : 0);
	}
	CHECK_EQ(wait_status(p), 0,
		 "uid 4242 (allowed, unprivileged): verified I/O; doorbell mapping refused");
	{
		struct stats st = server_stop(&sv);

		CHECK(st.ok && st.refused == 1, "server: 1 connection refused by credentials");
	}
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	upcie_log_set_level(UPCIE_LOG_ERROR);
	test_basic();
	test_lies();
	test_kill();
	test_server_death();
	test_reset();
	test_creds();
	return check_done();
}
