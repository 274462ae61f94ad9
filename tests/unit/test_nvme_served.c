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
#include <poll.h>
#include <sched.h>
#include <sys/stat.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
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
	bool break_ready; /* after init: the controller never becomes ready again */
	mode_t mode;
	long allow_uid;
	enum upcie_served_trust trust;
	struct upcie_served_grant grants[4];
	uint32_t ngrants;
	uint32_t max_clients, uid_max_clients, uid_max_qp, max_qp;
	uint64_t uid_max_bytes;
	uint32_t hello_timeout_ms;
};

static volatile int srv_stop;
static unsigned long long srv_cqlog; /* "completion for CID" lines the server logged */

static void srv_term(int sig)
{
	(void)sig;
	srv_stop = 1;
}

static void srv_log(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	if (strstr(msg, "completion for CID"))
		__atomic_fetch_add(&srv_cqlog, 1, __ATOMIC_SEQ_CST);
	fprintf(stderr, "upcie: %s\n", msg);
}

/* Runs in the forked server; writes one "stats" line to `out` when SIGTERM ends it. */
static int server_main(const char *path, const struct srv_knobs *k, int out)
{
	struct upcie_served_mapper map = { .map = served_win_map };
	struct upcie_served_stats sst;
	struct upcie_served_opts o;
	struct upcie_served s;
	struct rig *r = (struct rig *)calloc(1, sizeof(*r));
	char line[768];
	int err, n;

	signal(SIGTERM, srv_term);
	upcie_log_set_handler(srv_log, NULL);
	upcie_log_set_level(UPCIE_LOG_WARN);
	if (!r)
		return 2;
	rig_setup(r);
	if (served_win_setup(&r->cm, &r->im))
		return 2;
	r->cm.io_delay_us = k->io_delay_us;
	r->cm.fail_delete_sq = k->fail_delete_sq;
	r->cm.hold_opc = k->hold_opc;
	r->cm.abort_on_sq_delete = true;
	r->cm.nqueues = 16;
	upcie_served_test_unmap_first_ = k->unmap_first;
	if (rig_start(r) || rig_ctrl(r, NULL))
		return 3;
	memset(&o, 0, sizeof(o));
	o.path = path;
	o.gid = (gid_t)-1;
	o.mode = k->mode;
	o.allow_uid = k->allow_uid;
	o.trust = k->trust;
	o.grants = k->grants;
	o.ngrants = k->ngrants;
	o.max_clients = k->max_clients ? k->max_clients : 16;
	o.uid_max_clients = k->uid_max_clients ? k->uid_max_clients : 16;
	o.uid_max_qp = k->uid_max_qp ? k->uid_max_qp : 16;
	o.uid_max_bytes = k->uid_max_bytes;
	o.hello_timeout_ms = k->hello_timeout_ms;
	o.max_qp = k->max_qp ? k->max_qp : 4;
	o.max_mem = 4;
	o.max_bytes = 32u << 20;
	err = upcie_served_init(&s, &r->c, &map, &o);
	if (err)
		return 4;
	if (k->break_ready)
		r->cm.never_ready = true;
	err = upcie_served_run(&s, &srv_stop);
	n = snprintf(line, sizeof(line),
		     "stats clients=%llu refused=%llu gone=%llu qp_made=%llu qp_gone=%llu "
		     "qp_lost=%llu kept=%llu bad=%llu resets=%llu late=%llu timeouts=%llu "
		     "iso_ok=%llu iso_bad=%llu faults=%llu cqlog=%llu outside=%llu run=%d\n",
		     (unsigned long long)s.st.clients, (unsigned long long)s.st.refused,
		     (unsigned long long)s.st.gone, (unsigned long long)s.st.qp_made,
		     (unsigned long long)s.st.qp_gone, (unsigned long long)s.st.qp_lost,
		     (unsigned long long)s.st.kept, (unsigned long long)s.st.bad,
		     (unsigned long long)s.st.resets,
		     (unsigned long long)__atomic_load_n(&served_win_late, __ATOMIC_SEQ_CST),
		     (unsigned long long)s.st.timeouts, (unsigned long long)s.st.iso_ok,
		     (unsigned long long)s.st.iso_bad, (unsigned long long)s.st.faults,
		     (unsigned long long)__atomic_load_n(&srv_cqlog, __ATOMIC_SEQ_CST),
		     (unsigned long long)__atomic_load_n(&served_win_outside, __ATOMIC_SEQ_CST),
		     err);
	sst = s.st; /* fini zeroes s */
	upcie_served_fini(&s);
	/* memory given back by fini is checked too */
	n = snprintf(line + n - 1, sizeof(line) - (size_t)n + 1,
		     " late_after_fini=%llu sleeps=%llu woken=%llu sleep_timeouts=%llu naps=%llu\n",
		     (unsigned long long)__atomic_load_n(&served_win_late, __ATOMIC_SEQ_CST),
		     (unsigned long long)sst.sleeps, (unsigned long long)sst.woken,
		     (unsigned long long)sst.sleep_timeouts, (unsigned long long)sst.naps);
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
	    late, timeouts, iso_ok, iso_bad, faults, cqlog, outside, late_fini, sleeps, woken,
	    sleep_timeouts, naps;
	int run;
	bool ok;
};

/* SIGTERM the server, read its stats line, reap it. */
static struct stats server_stop(struct server *sv)
{
	struct stats st;
	char line[768];
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
		       "qp_lost=%llu kept=%llu bad=%llu resets=%llu late=%llu timeouts=%llu "
		       "iso_ok=%llu iso_bad=%llu faults=%llu cqlog=%llu outside=%llu run=%d "
		       "late_after_fini=%llu sleeps=%llu woken=%llu sleep_timeouts=%llu naps=%llu",
		       &st.clients, &st.refused, &st.gone, &st.qp_made, &st.qp_gone, &st.qp_lost,
		       &st.kept, &st.bad, &st.resets, &st.late, &st.timeouts, &st.iso_ok,
		       &st.iso_bad, &st.faults, &st.cqlog, &st.outside, &st.run, &st.late_fini,
		       &st.sleeps, &st.woken, &st.sleep_timeouts, &st.naps) == 22 &&
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

/* ---- an isolated client ---- */

struct iclient {
	struct upcie_served_client cl;
	struct upcie_served_mem mem;
	struct upcie_served_iqp q;
};

struct icio {
	int calls, err;
	uint16_t status;
};

static void icio_cb(void *ctx, const struct upcie_served_cpl *c)
{
	struct icio *io = (struct icio *)ctx;

	io->calls++;
	io->err = c->err;
	io->status = c->status;
}

static int iclient_open(struct iclient *c, const char *path, unsigned depth)
{
	int err = upcie_served_connect(&c->cl, path, UPCIE_SERVED_ISOLATED);

	if (!err && !c->cl.info.isolated)
		err = -EPROTO;
	if (!err)
		err = upcie_served_mem_alloc(&c->cl, C_REGION, &c->mem);
	if (!err)
		err = upcie_served_iqp_create(&c->cl, &c->q, depth);
	return err;
}

static void iclient_close(struct iclient *c)
{
	upcie_served_iqp_delete(&c->q);
	upcie_served_mem_free(&c->mem);
	upcie_served_disconnect(&c->cl);
}

/* One isolated command of `nlb` blocks at slba, data at `off` of the region; waits. Returns the
 * completion's err, -EIO for an NVMe error status, or the submission's error. */
static int icmd(struct iclient *c, uint8_t opc, uint32_t nsid, uint64_t slba, uint32_t nlb,
		uint32_t region, uint64_t off, uint64_t len, struct icio *io)
{
	struct upcie_served_sub u;
	int err;

	memset(&u, 0, sizeof(u));
	memset(io, 0, sizeof(*io));
	u.opc = opc;
	u.nsid = nsid;
	u.slba = slba;
	u.nlb = nlb;
	u.region = region;
	u.off = off;
	u.len = len;
	err = upcie_served_iqp_submit(&c->q, &u, icio_cb, io);
	if (!err)
		err = upcie_served_iqp_wait(&c->q, 5000000000ull);
	if (err)
		return err;
	if (io->calls != 1)
		return -EPROTO;
	return io->err ? io->err : io->status ? -EIO : 0;
}

/* As client_rounds(), through an isolated queue pair. */
static int iclient_rounds(struct iclient *c, unsigned id, uint64_t base, unsigned qd, int rounds)
{
	uint8_t *va = (uint8_t *)c->mem.vaddr;
	struct icio io[64];

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
				err = upcie_served_iqp_rw(
				    &c->q, pass ? UPCIE_NVME_NVM_READ : UPCIE_NVME_NVM_WRITE, 1,
				    base + k * 8, 8, &c->mem, off, 4096, icio_cb, &io[k]);
				if (err)
					return err;
			}
			int err = upcie_served_iqp_wait(&c->q, 5000000000ull);

			if (err)
				return err;
			for (unsigned k = 0; k < qd; k++)
				if (io[k].calls != 1 || io[k].err || io[k].status)
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

/* Fork an isolated client doing `rounds` rounds (forever if < 0) as `uid` (0: stay root). */
static pid_t iclient_fork(const char *path, unsigned id, unsigned qd, int rounds, uid_t uid,
			  uint64_t base)
{
	pid_t pid;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct iclient c;
		int err;

		upcie_log_set_level(UPCIE_LOG_NONE);
		if (uid && (setgid((gid_t)uid) || setuid(uid)))
			_exit(90);
		memset(&c, 0, sizeof(c));
		err = iclient_open(&c, path, C_DEPTH);
		if (!err)
			err = iclient_rounds(&c, id, base, qd, rounds);
		iclient_close(&c);
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
	{
		struct upcie_served_vf vf;

		CHECK(upcie_served_vf_get(&c.cl, &vf) == -EOPNOTSUPP && vf.group_fd == -1,
		      "a VF from a server that hands out none: -EOPNOTSUPP, no file");
		CHECK_EQ(upcie_served_identify(&c.cl, UPCIE_NVME_CNS_CTRL, 0, id), 0,
			 "... and the connection goes on");
	}
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
		CHECK_EQ(upcie_served_mem_register_dmabuf(&d.cl, pp[0], 4096, &d.mem), -EINVAL,
			 "a pipe offered as a dma-buf: neither a memfd nor a dma-buf, refused");
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
	/* (a victim killed before it connected is no client of the server) */
	CHECK(st.clients >= 20 && st.gone + 2 >= st.clients,
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

/* Knobs with every uid granted namespace 1, read and write. */
static void knobs_open(struct srv_knobs *k)
{
	memset(k, 0, sizeof(*k));
	k->allow_uid = -1;
	k->grants[0].uid = -1;
	k->grants[0].gid = -1;
	k->grants[0].nsid = 1;
	k->grants[0].access = UPCIE_SERVED_READ | UPCIE_SERVED_WRITE;
	k->ngrants = 1;
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

	knobs_open(&k);
	k.mode = 0666;
	k.allow_uid = 4242;
	CHECK_EQ(server_start(&sv, "creds2", &k), 0, "server up, mode 0666, uid 4242 allowed");
	CHECK_EQ(connect_as(sv.path, 65534), -ENOTCONN,
		 "uid 65534: hung up on by the server (not allowed)");
	fflush(stdout);
	p = fork();
	if (!p) {
		struct client c;
		struct iclient ic;
		int err;

		upcie_log_set_level(UPCIE_LOG_NONE);
		if (setgid(4242) || setuid(4242))
			_exit(90);
		memset(&c, 0, sizeof(c));
		err = client_open(&c, sv.path, C_DEPTH) == -EPERM && c.cl.info.isolated ? 0 : 78;
		upcie_served_mem_free(&c.mem);
		upcie_served_disconnect(&c.cl);
		memset(&ic, 0, sizeof(ic));
		if (!err)
			err = iclient_open(&ic, sv.path, C_DEPTH);
		if (!err)
			err = iclient_rounds(&ic, 5, 1024, 8, 4);
		if (!err) {
			struct upcie_served_req rq;
			int got;

			memset(&rq, 0, sizeof(rq));
			rq.op = UPCIE_SERVED_OP_DOORBELLS;
			err = raw_call(ic.cl.sock, &rq, -1, &got) == -EPERM ? 0 : 77;
		}
		iclient_close(&ic);
		_exit(err ? 1 : 0);
	}
	CHECK_EQ(wait_status(p), 0,
		 "uid 4242 (allowed, unprivileged): isolated (a trusted queue refused), verified "
		 "I/O through an isolated queue; the whole device refused");
	{
		struct stats st = server_stop(&sv);

		CHECK(st.ok && st.refused == 1, "server: 1 connection refused by credentials");
	}
}

/* A raw connection that said HELLO; its relay fd in *relay (or -1). */
static int raw_hello(const char *path, unsigned flags, int *relay)
{
	struct upcie_served_req rq;
	struct sockaddr_un sa;
	int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (sock < 0 || connect(sock, (struct sockaddr *)&sa, sizeof(sa)))
		return -1;
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_HELLO;
	rq.u.hello.version = UPCIE_SERVED_VERSION;
	rq.u.hello.flags = flags;
	if (raw_call(sock, &rq, -1, relay)) {
		close(sock);
		return -1;
	}
	return sock;
}

static void test_isolated_io(void)
{
	struct srv_knobs k;
	struct server sv;
	struct iclient c;
	struct stats st;
	pid_t p[6];
	int bad = 0;

	knobs_open(&k);
	CHECK_EQ(server_start(&sv, "iso", &k), 0, "server up, namespace 1 granted to everyone");
	memset(&c, 0, sizeof(c));
	CHECK_EQ(iclient_open(&c, sv.path, C_DEPTH), 0,
		 "isolated client: connect, region registered, isolated queue pair of 32");
	CHECK(c.mem.dm.size == 0 && !c.mem.dm.lut,
	      "the isolated client was told no device address of its region");
	CHECK_EQ(iclient_rounds(&c, 1, 512, 16, 8), 0,
		 "8 rounds of 16 writes + reads through the server's queue, verified");
	{
		struct icio io;

		CHECK_EQ(icmd(&c, UPCIE_NVME_NVM_FLUSH, 1, 0, 0, 0, 0, 0, &io), 0, "Flush");
		CHECK_EQ(icmd(&c, UPCIE_NVME_NVM_WRITE_ZEROES, 1, 4000, 8, 0, 0, 0, &io), 0,
			 "Write Zeroes of 8 blocks");
		CHECK_EQ(icmd(&c, UPCIE_NVME_NVM_COMPARE, 1, 512, 8, c.mem.id, C_DATA + 64 * 4096,
			      4096, &io),
			 0, "Compare of what was just read: equal");
	}
	CHECK_EQ(upcie_served_mem_free(&c.mem), 0,
		 "an isolated client's region holds no rings: unregistered while idle");
	CHECK_EQ(upcie_served_mem_alloc(&c.cl, C_REGION, &c.mem), 0, "registered again");
	CHECK_EQ(iclient_rounds(&c, 1, 512, 4, 2), 0, "and used again");
	iclient_close(&c);
	for (unsigned i = 0; i < 6; i++)
		p[i] = iclient_fork(sv.path, i + 2, 8, 20, 0, (uint64_t)(i + 2) * 512);
	for (unsigned i = 0; i < 6; i++)
		bad += wait_status(p[i]) != 0;
	CHECK_EQ(bad, 0, "6 isolated clients at once, 20 verified rounds of 8 each");
	st = server_stop(&sv);
	CHECK(st.ok && st.qp_made == 7 && st.qp_gone == 7 && st.kept == 0 && st.late == 0 &&
		  st.outside == 0 && st.iso_bad == 0 && st.iso_ok > 2000,
	      "server: 7 isolated queues made and deleted, %llu commands, none refused, no data "
	      "outside the clients' memory, no late DMA",
	      st.iso_ok);
}

/*
 * The attacks of a connected stranger, A (uid 4242), on B (uid 4343): B's memory, B's blocks,
 * opcodes that are not I/O, the server's memory. `trusted`: the server trusts everyone (the
 * negative control: the same attacks through a trusted queue, which succeed). Runs A and B as
 * children; returns what A got, per attack, in *out.
 */
struct attack {
	int qp_create;	 /* a trusted queue pair */
	int raw_cross;	 /* trusted: a Read into B's window through a raw SQE: 0 = it worked */
	int cross_read;	 /* isolated: a Read naming region 2 (A has only region 1) */
	int foreign_lba; /* a Write on B's blocks */
	int foreign_opc; /* opcodes 0x04, 0x0c, 0x0d, 0x11, 0x80, 0xc0 refused: a count */
	int outside;	 /* data ranges outside A's region refused: a count */
	int own_ok;	 /* A's own I/O on its own blocks */
	int b_buf_ok;	 /* B's buffer still holds B's pattern */
	int b_lba_ok;	 /* B's blocks still hold B's data */
};

static void attack_run(bool trusted, struct attack *out)
{
	struct srv_knobs k;
	struct server sv;
	int pb[2], pa[2], go[2];
	pid_t a, b;

	memset(out, 0, sizeof(*out));
	memset(&k, 0, sizeof(k));
	k.mode = 0666;
	k.allow_uid = -1;
	k.trust = trusted ? UPCIE_SERVED_TRUST_ALL : UPCIE_SERVED_TRUST_OWNER;
	k.grants[0] = (struct upcie_served_grant){ 4242, -1, 1, 3, 0, 1024 };
	k.grants[1] = (struct upcie_served_grant){ 4343, -1, 1, 3, 1024, 1024 };
	k.ngrants = 2;
	if (server_start(&sv, trusted ? "atk-trusted" : "atk", &k))
		return;
	if (pipe(pb) || pipe(pa) || pipe(go))
		return;
	fflush(stdout);
	b = fork();
	if (!b) {
		/* B: its region first (window 0), a pattern in its buffer and on its blocks */
		struct iclient c;
		struct client t;
		uint8_t *va;
		char x = 0;
		int r[2] = { 0, 0 };

		upcie_log_set_level(UPCIE_LOG_NONE);
		if (setgid(4343) || setuid(4343))
			_exit(90);
		memset(&c, 0, sizeof(c));
		memset(&t, 0, sizeof(t));
		if (trusted) {
			if (client_open(&t, sv.path, C_DEPTH))
				_exit(91);
			va = (uint8_t *)t.mem.vaddr;
			fill(va + C_DATA, 77, 1024, 1);
			struct cio io = { 0, 0, 0 };

			if (upcie_served_qp_rw(&t.qp, UPCIE_NVME_NVM_WRITE, 1, 1024, 8, &t.mem,
					       C_DATA, 4096, cio_cb, &io) ||
			    upcie_served_qp_wait(&t.qp, 5000000000ull) || io.err)
				_exit(92);
		} else {
			struct icio io;

			if (iclient_open(&c, sv.path, C_DEPTH))
				_exit(91);
			va = (uint8_t *)c.mem.vaddr;
			fill(va + C_DATA, 77, 1024, 1);
			if (icmd(&c, UPCIE_NVME_NVM_WRITE, 1, 1024, 8, c.mem.id, C_DATA, 4096, &io))
				_exit(92);
		}
		/* the pattern stays in B's buffer; tell A to go, wait for it */
		if (write(pb[1], &x, 1) != 1 || read(go[0], &x, 1) != 1)
			_exit(93);
		{
			uint8_t want[4096];

			fill(want, 77, 1024, 1);
			r[0] = !memcmp(va + C_DATA, want, 4096);
			memset(va + C_DATA + 4096, 0, 4096);
			if (trusted) {
				struct cio io = { 0, 0, 0 };

				r[1] =
				    !upcie_served_qp_rw(&t.qp, UPCIE_NVME_NVM_READ, 1, 1024, 8,
							&t.mem, C_DATA + 4096, 4096, cio_cb, &io) &&
				    !upcie_served_qp_wait(&t.qp, 5000000000ull) && !io.err &&
				    !memcmp(va + C_DATA + 4096, want, 4096);
				client_close(&t);
			} else {
				struct icio io;

				r[1] = !icmd(&c, UPCIE_NVME_NVM_READ, 1, 1024, 8, c.mem.id,
					     C_DATA + 4096, 4096, &io) &&
				       !memcmp(va + C_DATA + 4096, want, 4096);
				iclient_close(&c);
			}
		}
		_exit(r[0] | r[1] << 1);
	}
	{
		char x;

		if (read(pb[0], &x, 1) != 1)
			x = 0;
	}
	a = fork();
	if (!a) {
		struct attack at;
		struct client t;
		struct iclient c;
		struct icio io;
		static const uint8_t bad_opc[] = { 0x04, 0x0c, 0x0d, 0x11, 0x80, 0xc0 };

		upcie_log_set_level(UPCIE_LOG_NONE);
		memset(&at, 0, sizeof(at));
		if (setgid(4242) || setuid(4242))
			_exit(90);
		memset(&t, 0, sizeof(t));
		at.qp_create = client_open(&t, sv.path, C_DEPTH);
		at.raw_cross = -1;
		if (!at.qp_create) {
			/* trusted: a Read of A's blocks into B's window (the first one) */
			struct upcie_nvme_sqe sqe;
			struct cio cio = { 0, 0, 0 };

			memset(&sqe, 0, sizeof(sqe));
			sqe.opc = UPCIE_NVME_NVM_READ;
			sqe.nsid = 1;
			sqe.cdw10 = 0;
			sqe.cdw12 = 7;
			sqe.prp1 = SERVED_WIN_IOVA + C_DATA;
			at.raw_cross =
			    upcie_served_qp_enqueue(&t.qp, &sqe, NULL, 0, 0, cio_cb, &cio);
			upcie_served_qp_ring(&t.qp);
			if (!at.raw_cross)
				at.raw_cross = upcie_served_qp_wait(&t.qp, 5000000000ull);
			if (!at.raw_cross)
				at.raw_cross = cio.err;
			client_close(&t);
		} else {
			upcie_served_disconnect(&t.cl);
		}
		memset(&c, 0, sizeof(c));
		if (!iclient_open(&c, sv.path, C_DEPTH)) {
			at.cross_read =
			    icmd(&c, UPCIE_NVME_NVM_READ, 1, 0, 8, 2, C_DATA, 4096, &io);
			at.foreign_lba =
			    icmd(&c, UPCIE_NVME_NVM_WRITE, 1, 1024, 8, 1, C_DATA, 4096, &io);
			for (unsigned i = 0; i < sizeof(bad_opc); i++)
				at.foreign_opc +=
				    icmd(&c, bad_opc[i], 1, 0, 8, 1, C_DATA, 4096, &io) == -EPERM;
			at.outside += icmd(&c, UPCIE_NVME_NVM_READ, 1, 0, 8, 1, C_REGION - 2048,
					   4096, &io) == -EINVAL;
			at.outside += icmd(&c, UPCIE_NVME_NVM_READ, 1, 0, 8, 1, UINT64_MAX - 1023,
					   4096, &io) == -EINVAL;
			at.outside +=
			    icmd(&c, UPCIE_NVME_NVM_READ, 1, 0, 8, 1, C_DATA, 8192, &io) == -EINVAL;
			at.outside += icmd(&c, UPCIE_NVME_NVM_READ, 1, 0, 8, 1, C_DATA + 2, 4096,
					   &io) == -EINVAL;
			at.outside += icmd(&c, UPCIE_NVME_NVM_READ, 1, 1020, 8, 1, C_DATA, 4096,
					   &io) == -EPERM;
			at.outside += icmd(&c, UPCIE_NVME_NVM_WRITE_ZEROES, 1, 0, 8, 1, C_DATA,
					   4096, &io) == -EINVAL;
			at.own_ok =
			    icmd(&c, UPCIE_NVME_NVM_READ, 1, 0, 8, 1, C_DATA, 4096, &io) == 0;
			iclient_close(&c);
		}
		if (write(pa[1], &at, sizeof(at)) != sizeof(at))
			_exit(94);
		_exit(0);
	}
	if (read(pa[0], out, sizeof(*out)) != sizeof(*out))
		memset(out, 0, sizeof(*out));
	wait_status(a);
	{
		char x = 1;
		int r;

		if (write(go[1], &x, 1) != 1)
			x = 0;
		r = wait_status(b);
		out->b_buf_ok = r < 90 && (r & 1);
		out->b_lba_ok = r < 90 && (r & 2);
	}
	close(pa[0]);
	close(pa[1]);
	close(pb[0]);
	close(pb[1]);
	close(go[0]);
	close(go[1]);
	server_stop(&sv);
}

static void test_isolation(void)
{
	struct attack at;

	if (geteuid() != 0) {
		CHECK_SKIP("isolation: needs root to run clients as other users");
		return;
	}
	attack_run(false, &at);
	CHECK_EQ(at.qp_create, -EPERM, "A (uid 4242, not trusted): a trusted queue pair refused");
	CHECK_EQ(at.cross_read, -ENOENT,
		 "A's Read into a region that is not its own (B's is region 2 of nobody's "
		 "namespace of ids): refused");
	CHECK_EQ(at.foreign_lba, -EPERM, "A's Write on B's blocks (1024..): refused");
	CHECK_EQ(at.foreign_opc, 6,
		 "6 opcodes outside the allow-list (Write Uncorrectable, Verify, Reservation "
		 "Register, Reservation Acquire, vendor 0x80, 0xc0): all refused");
	CHECK_EQ(at.outside, 6,
		 "data past the region, an offset near 2^64, a length that is not the blocks', "
		 "an unaligned offset, a range crossing the grant, a data range on Write "
		 "Zeroes: all refused");
	CHECK_EQ(at.own_ok, 1, "A's own Read of its own blocks into its own region works");
	CHECK_EQ(at.b_buf_ok, 1, "B's buffer still holds B's pattern");
	CHECK_EQ(at.b_lba_ok, 1, "B's blocks still hold B's data");

	attack_run(true, &at);
	CHECK_EQ(at.qp_create, 0, "negative control, everyone trusted: A gets a trusted queue");
	CHECK_EQ(at.raw_cross, 0,
		 "its raw SQE reads into B's window: accepted (the trusted mode's whole reach)");
	CHECK_EQ(at.b_buf_ok, 0, "and B's buffer is overwritten: the test sees it");
}

/* The relay page a client gets is sealed: truncating it fails, punching it changes nothing. */
static void test_relay_sealed(void)
{
	struct srv_knobs k;
	struct server sv;
	struct client c;
	struct iclient ic;
	struct stats st;
	int relay = -1, sock;

	knobs_open(&k);
	CHECK_EQ(server_start(&sv, "seal", &k), 0, "server up");
	sock = raw_hello(sv.path, 0, &relay);
	CHECK(sock >= 0 && relay >= 0, "a raw client said HELLO and holds the relay memfd");
	CHECK(ftruncate(relay, 0) != 0 && errno == EPERM,
	      "ftruncate(relay, 0) fails with EPERM (sealed)");
	CHECK(ftruncate(relay, 1 << 20) != 0 && errno == EPERM, "growing it fails too");
	CHECK((fcntl(relay, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) ==
		  (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
	      "its seals: shrink, grow, seal");
	CHECK_EQ(fallocate(relay, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0,
		 "a hole punched in it (allowed: it reads back as zeros)");
	{
		struct upcie_served_req rq;
		uint8_t id[4096];
		int got;

		memset(&rq, 0, sizeof(rq));
		rq.op = UPCIE_SERVED_OP_IDENTIFY;
		rq.u.identify.cns = UPCIE_NVME_CNS_CTRL;
		CHECK_EQ(raw_call(sock, &rq, -1, &got), 0, "the server still answers that client");
		(void)id;
	}
	memset(&c, 0, sizeof(c));
	memset(&ic, 0, sizeof(ic));
	CHECK_EQ(client_open(&c, sv.path, C_DEPTH), 0, "a trusted client");
	CHECK_EQ(iclient_open(&ic, sv.path, C_DEPTH), 0, "an isolated client");
	{
		/* punch the isolated client's ring and relay from under the server */
		CHECK_EQ(madvise(ic.q.ring, ic.q.ring_size, MADV_REMOVE), 0,
			 "its ring memory punched (MADV_REMOVE) by the client");
		CHECK_EQ(madvise(ic.cl.relay, sizeof(*ic.cl.relay), MADV_REMOVE), 0,
			 "its relay page punched");
		ic.q.sq_tail = ic.q.cq_head = 0; /* the ring reads zeros now: start over */
	}
	CHECK_EQ(iclient_rounds(&ic, 4, 2048, 8, 4), 0,
		 "the isolated client goes on after the punch (its ring reads back zeros)");
	CHECK_EQ(client_rounds(&c, 3, 1024, 8, 4), 0, "the trusted client's I/O verifies");
	client_close(&c);
	iclient_close(&ic);
	close(relay);
	close(sock);
	st = server_stop(&sv);
	CHECK(st.ok && st.clients == 4 && st.kept == 0 && st.late == 0,
	      "server alive to the end (4 clients served) and stopped cleanly");
}

/* The server neither zeroes nor reaps a trusted client's CQ. */
static void test_cq_untouched(void)
{
	struct server sv;
	struct client c;
	struct upcie_served_req rq;
	struct stats st;
	uint8_t *cq;
	int got, err;
	bool same = true;

	CHECK_EQ(server_start(&sv, "cq", NULL), 0, "server up");
	memset(&c, 0, sizeof(c));
	CHECK_EQ(upcie_served_connect(&c.cl, sv.path, 0), 0, "a trusted client");
	CHECK_EQ(upcie_served_mem_alloc(&c.cl, C_REGION, &c.mem), 0, "its region");
	cq = (uint8_t *)c.mem.vaddr + 65536;
	/* phase-valid entries with CIDs: what a reap on the server's side would take */
	for (unsigned i = 0; i < C_DEPTH; i++) {
		struct upcie_nvme_cqe e;

		memset(&e, 0, sizeof(e));
		e.dw0 = 0xabcd0000u | i;
		e.dw3 = upcie_nvme_cqe_dw3_make((uint16_t)i, 1, 0, false);
		memcpy(cq + i * 16, &e, 16);
	}
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_QP_CREATE;
	rq.u.qp_create.mem_id = c.mem.id;
	rq.u.qp_create.depth = C_DEPTH;
	rq.u.qp_create.sq_off = 0;
	rq.u.qp_create.cq_off = 65536;
	err = raw_call(c.cl.sock, &rq, -1, &got);
	CHECK_EQ(err, 0, "a queue pair on a CQ full of phase-valid entries (raw request)");
	for (unsigned i = 0; i < C_DEPTH; i++)
		same &= ((uint32_t *)(cq + i * 16))[0] == (0xabcd0000u | i);
	CHECK(same, "the CQ is as the client left it: the server did not zero it");
	memset(&rq, 0, sizeof(rq));
	rq.op = UPCIE_SERVED_OP_QP_DELETE;
	rq.u.qp_delete.slot = 1;
	CHECK_EQ(raw_call(c.cl.sock, &rq, -1, &got), 0, "the queue deleted");
	upcie_served_mem_free(&c.mem);
	upcie_served_disconnect(&c.cl);
	st = server_stop(&sv);
	CHECK(st.ok && st.cqlog == 0 && st.qp_gone == 1,
	      "the server reaped none of those entries (%llu \"completion for CID\" lines)",
	      st.cqlog);
}

/* Connections that never say HELLO: per-uid cap, then closed at the timeout. */
static void test_idle_lockout(void)
{
	struct srv_knobs k;
	struct server sv;
	struct stats st;
	int pp[2];
	pid_t a, b;

	if (geteuid() != 0) {
		CHECK_SKIP("idle lockout: needs root to run clients as other users");
		return;
	}
	knobs_open(&k);
	k.mode = 0666;
	k.max_clients = 6;
	k.uid_max_clients = 3;
	k.hello_timeout_ms = 300;
	CHECK_EQ(server_start(&sv, "idle", &k), 0,
		 "server up: 6 clients, 3 per uid, HELLO within 300 ms");
	if (pipe(pp))
		return;
	fflush(stdout);
	a = fork();
	if (!a) {
		/* uid 4242 opens 6 sockets and says nothing */
		struct sockaddr_un sa;
		int s[6], hung = 0;
		char x = 0;
		uint8_t buf[256];

		if (setgid(4242) || setuid(4242))
			_exit(90);
		memset(&sa, 0, sizeof(sa));
		sa.sun_family = AF_UNIX;
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sv.path);
		for (int i = 0; i < 6; i++) {
			s[i] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
			if (connect(s[i], (struct sockaddr *)&sa, sizeof(sa)))
				_exit(91);
		}
		if (write(pp[1], &x, 1) != 1)
			_exit(92);
		/* each is closed by the server: refused at once, or at the HELLO timeout */
		for (int i = 0; i < 6; i++) {
			struct pollfd p = { s[i], POLLIN, 0 };

			if (poll(&p, 1, 3000) == 1 && recv(s[i], buf, sizeof(buf), 0) == 0)
				hung++;
		}
		_exit(hung);
	}
	{
		char x;

		if (read(pp[0], &x, 1) != 1)
			x = 0;
	}
	usleep(50000); /* the server accepted them */
	fflush(stdout);
	b = fork();
	if (!b) {
		struct iclient c;
		int err;

		upcie_log_set_level(UPCIE_LOG_NONE);
		if (setgid(4343) || setuid(4343))
			_exit(90);
		memset(&c, 0, sizeof(c));
		err = iclient_open(&c, sv.path, C_DEPTH);
		if (!err)
			err = iclient_rounds(&c, 9, 3000, 4, 2);
		iclient_close(&c);
		_exit(err ? 1 : 0);
	}
	CHECK_EQ(wait_status(b), 0,
		 "uid 4343 connects and does verified I/O while uid 4242 holds idle sockets");
	CHECK_EQ(wait_status(a), 6, "all 6 idle sockets of uid 4242 were closed by the server");
	close(pp[0]);
	close(pp[1]);
	st = server_stop(&sv);
	CHECK(st.ok && st.timeouts == 3 && st.refused == 3,
	      "server: 3 refused over the uid's cap, 3 closed at the HELLO timeout (%llu, %llu)",
	      st.refused, st.timeouts);
}

/* Registered bytes and queue pairs per uid, across its connections. */
static void test_uid_caps(void)
{
	struct srv_knobs k;
	struct server sv;
	int pp[2];
	pid_t a, b;
	int r[4];

	if (geteuid() != 0) {
		CHECK_SKIP("uid caps: needs root to run clients as other users");
		return;
	}
	knobs_open(&k);
	k.mode = 0666;
	k.uid_max_bytes = 40u << 20;
	k.uid_max_qp = 32;
	k.max_qp = 8;
	CHECK_EQ(server_start(&sv, "caps", &k), 0,
		 "server up: 32 MiB per client, 40 MiB per uid, 16 queues on the controller");
	if (pipe(pp))
		return;
	fflush(stdout);
	a = fork();
	if (!a) {
		struct upcie_served_client cl[3];
		struct upcie_served_mem m[3];
		struct upcie_served_iqp q[24];
		int res[4] = { 0, 0, 0, 0 }, nq = 0;

		upcie_log_set_level(UPCIE_LOG_NONE);
		if (setgid(4242) || setuid(4242))
			_exit(90);
		for (int i = 0; i < 3; i++)
			if (upcie_served_connect(&cl[i], sv.path, 0))
				_exit(91);
		res[0] = upcie_served_mem_alloc(&cl[0], 24u << 20, &m[0]);
		res[1] = upcie_served_mem_alloc(&cl[1], 24u << 20, &m[1]);
		res[2] = upcie_served_mem_alloc(&cl[2], 16u << 20, &m[2]);
		/* take every queue it can, over its 3 connections */
		for (int i = 0; i < 24; i++)
			if (!upcie_served_iqp_create(&cl[i % 3], &q[nq], 8))
				nq++;
		res[3] = nq;
		if (write(pp[1], res, sizeof(res)) != sizeof(res))
			_exit(92);
		pause(); /* holds them until killed */
		_exit(0);
	}
	if (read(pp[0], r, sizeof(r)) != sizeof(r))
		memset(r, 0x7f, sizeof(r));
	CHECK(r[0] == 0 && r[1] == -ENOSPC && r[2] == 0,
	      "uid 4242: 24 MiB on one connection, then 24 MiB more refused on another (-ENOSPC "
	      "over 40 MiB), 16 MiB accepted (%d %d %d)",
	      r[0], r[1], r[2]);
	CHECK_EQ(r[3], 14, "uid 4242 got 14 of the 16 queues over 3 connections (2 kept back)");
	fflush(stdout);
	b = fork();
	if (!b) {
		struct iclient c;
		int err;

		upcie_log_set_level(UPCIE_LOG_NONE);
		if (setgid(4343) || setuid(4343))
			_exit(90);
		memset(&c, 0, sizeof(c));
		err = iclient_open(&c, sv.path, C_DEPTH);
		if (!err)
			err = iclient_rounds(&c, 8, 3000, 4, 2);
		iclient_close(&c);
		_exit(err ? -err & 0x7f : 0);
	}
	CHECK_EQ(wait_status(b), 0, "uid 4343 still gets a queue and does verified I/O");
	kill(a, SIGKILL);
	wait_status(a);
	close(pp[0]);
	close(pp[1]);
	server_stop(&sv);
}

/* A controller whose reset failed is not reset again for every request. */
static void test_failed_ctrl(void)
{
	struct srv_knobs k;
	struct server sv;
	struct client a;
	struct stats st;
	uint8_t id[4096];
	int nodev = 0;

	knobs_open(&k);
	k.fail_delete_sq = 0x0001;
	k.break_ready = true;
	CHECK_EQ(server_start(&sv, "failed", &k), 0,
		 "server up (deletions refused, the controller never ready again)");
	memset(&a, 0, sizeof(a));
	CHECK_EQ(client_open(&a, sv.path, C_DEPTH), 0, "a client with a queue");
	upcie_log_set_level(UPCIE_LOG_NONE);
	upcie_served_qp_delete(&a.qp);
	for (int i = 0; i < 5; i++)
		nodev += upcie_served_identify(&a.cl, UPCIE_NVME_CNS_CTRL, 0, id) == -ENODEV;
	upcie_log_set_level(UPCIE_LOG_ERROR);
	CHECK_EQ(nodev, 5, "5 Identify requests after the failed reset: -ENODEV each");
	upcie_served_mem_free(&a.mem);
	upcie_served_disconnect(&a.cl);
	st = server_stop(&sv);
	CHECK(st.ok && st.resets == 1, "server: 1 reset tried, not one per request (%llu)",
	      st.resets);
}

/* A client in a PID namespace of its own (the server is invisible there). */
static void test_pidns(void)
{
	struct srv_knobs k;
	struct server sv;
	pid_t p;

	if (geteuid() != 0) {
		CHECK_SKIP("PID namespace: needs root to unshare");
		return;
	}
	knobs_open(&k);
	CHECK_EQ(server_start(&sv, "pidns", &k), 0, "server up");
	fflush(stdout);
	p = fork();
	if (!p) {
		pid_t q;

		if (unshare(CLONE_NEWPID))
			_exit(95);
		q = fork();
		if (!q) {
			struct iclient c;
			int err;

			upcie_log_set_level(UPCIE_LOG_NONE);
			memset(&c, 0, sizeof(c));
			err = iclient_open(&c, sv.path, C_DEPTH);
			if (!err && c.cl.info.server_pid != 0)
				err = -EPROTO;
			if (!err)
				err = iclient_rounds(&c, 12, 3500, 4, 2);
			iclient_close(&c);
			_exit(err ? -err & 0x7f : 0);
		}
		_exit(wait_status(q));
	}
	{
		int r = wait_status(p);

		if (r == 95)
			CHECK_SKIP("PID namespace: unshare refused here");
		else
			CHECK_EQ(r, 0,
				 "a client in its own PID namespace (server pid invisible: 0) "
				 "connects through SO_PEERPIDFD and does verified I/O");
	}
	server_stop(&sv);
}

/* The socket path: only a stale socket is replaced. */
static void test_socket_path(void)
{
	struct upcie_served_mapper map = { .map = served_win_map };
	struct upcie_served_opts o;
	struct upcie_served s;
	struct rig *r = (struct rig *)calloc(1, sizeof(*r));
	char path[108];
	struct stat st;
	int fd;

	rig_setup(r);
	CHECK(!rig_start(r) && !rig_ctrl(r, NULL), "a controller model in this process");
	snprintf(path, sizeof(path), "/tmp/upcie-served-test-%d-path", (int)getpid());
	fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
	CHECK(fd >= 0 && write(fd, "keep", 4) == 4, "a regular file at the socket path");
	close(fd);
	memset(&o, 0, sizeof(o));
	o.path = path;
	o.gid = (gid_t)-1;
	o.allow_uid = -1;
	o.mode = 0640;
	upcie_log_set_level(UPCIE_LOG_NONE);
	CHECK_EQ(upcie_served_init(&s, &r->c, &map, &o), -EEXIST,
		 "serving there is refused (-EEXIST)");
	CHECK(!stat(path, &st) && S_ISREG(st.st_mode) && st.st_size == 4,
	      "and the file is still there, untouched");
	unlink(path);
	CHECK(!mkdir(path, 0700), "a directory at the path");
	CHECK_EQ(upcie_served_init(&s, &r->c, &map, &o), -EEXIST, "refused too");
	rmdir(path);
	upcie_log_set_level(UPCIE_LOG_ERROR);
	{
		mode_t um = umask(0);

		CHECK_EQ(upcie_served_init(&s, &r->c, &map, &o), 0, "served on the free path");
		umask(um);
	}
	CHECK(!lstat(path, &st) && S_ISSOCK(st.st_mode) && (st.st_mode & 0777) == 0640,
	      "a socket of mode 0640 (asked), whatever the umask (0)");
	upcie_served_fini(&s);
	CHECK(lstat(path, &st) && errno == ENOENT, "removed at fini (still ours)");
	rig_teardown(r);
	free(r);
}

/* A client that breaks the ring protocol faults its own queue only. */
static void test_ring_fault(void)
{
	struct srv_knobs k;
	struct server sv;
	struct iclient a, b;
	struct stats st;
	int n;

	knobs_open(&k);
	CHECK_EQ(server_start(&sv, "fault", &k), 0, "server up");
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	CHECK_EQ(iclient_open(&a, sv.path, C_DEPTH), 0, "isolated client a");
	CHECK_EQ(iclient_open(&b, sv.path, C_DEPTH), 0, "isolated client b");
	__atomic_store_n(&a.q.ring->sq_tail, C_DEPTH + 7, __ATOMIC_RELEASE);
	for (int i = 0; i < 200; i++) {
		n = upcie_served_iqp_poll(&a.q, 16);
		if (n == -ENODEV)
			break;
		usleep(1000);
	}
	CHECK_EQ(n, -ENODEV, "a: sq_tail moved past the ring: its queue faulted (-ENODEV)");
	CHECK_EQ(iclient_rounds(&b, 5, 2500, 8, 4), 0, "b's I/O verifies meanwhile");
	CHECK_EQ(upcie_served_iqp_delete(&a.q), 0, "a's faulted queue is deleted");
	CHECK_EQ(upcie_served_iqp_create(&a.cl, &a.q, C_DEPTH), 0, "a makes a new one");
	CHECK_EQ(iclient_rounds(&a, 6, 2600, 8, 2), 0, "and its I/O verifies");
	iclient_close(&a);
	iclient_close(&b);
	st = server_stop(&sv);
	CHECK(st.ok && st.faults == 1 && st.kept == 0 && st.late == 0,
	      "server: 1 fault, nothing kept, no late DMA");
}

/*
 * `n` reads, each after `gap_us` of quiet (long enough for the poller to go to sleep), through
 * isolated client c; each one's latency in lat_ns[] (0: it failed). Returns how many were
 * slower than `slow_ns`.
 */
static unsigned wake_rounds(struct iclient *c, unsigned n, unsigned gap_us, uint64_t slow_ns,
			    uint64_t *lat_ns)
{
	unsigned slow = 0;

	for (unsigned i = 0; i < n; i++) {
		struct icio io;
		uint64_t t0;
		int err;

		usleep(gap_us);
		t0 = upcie_time_ns();
		err = icmd(c, UPCIE_NVME_NVM_READ, 1, 700 + i * 8, 8, c->mem.id, C_DATA, 4096, &io);
		lat_ns[i] = err ? 0 : upcie_time_ns() - t0;
		if (err || lat_ns[i] > slow_ns)
			slow++;
	}
	return slow;
}

/*
 * The poller sleeps when idle and the client's submission wakes it (the relay page's poller
 * word, the connection's wake eventfd): a read after 20 ms of quiet is picked up because the
 * client woke the poller, not at the sleep's timeout (100 ms). The negative control is a client
 * that lies: it ignores the poller word (never wakes it): its reads wait for the timeout, and
 * only its own. Another lying client writes the poller word and floods its eventfd meanwhile:
 * the honest client's reads stay prompt and the server sound.
 */
#define WAKE_N	    12u
#define WAKE_GAP_US 20000u
#define WAKE_SLOW   (UINT64_C(50) * 1000000) /* half the poller's sleep timeout */

static void test_wake(void)
{
	uint64_t lat[WAKE_N], worst = 0, best = UINT64_MAX;
	struct srv_knobs k;
	struct server sv;
	struct iclient a, b;
	struct stats st;
	unsigned slow;
	pid_t liar;
	int lp[2];

	knobs_open(&k);
	CHECK_EQ(server_start(&sv, "wake", &k), 0, "server up");
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	CHECK_EQ(iclient_open(&a, sv.path, C_DEPTH), 0, "isolated client a");
	CHECK(a.cl.wake && a.cl.wake_fd >= 0, "a got its connection's wake eventfd");
	slow = wake_rounds(&a, WAKE_N, WAKE_GAP_US, WAKE_SLOW, lat);
	for (unsigned i = 0; i < WAKE_N; i++)
		worst = lat[i] > worst ? lat[i] : worst;
	CHECK(slow == 0 && a.cl.wakes >= WAKE_N / 2,
	      "%u reads after 20 ms of quiet each: none slower than 50 ms (worst %.3f ms), a woke "
	      "the sleeping poller %llu times",
	      WAKE_N, (double)worst / 1e6, (unsigned long long)a.cl.wakes);

	/* the negative control: b ignores the poller word */
	CHECK_EQ(iclient_open(&b, sv.path, C_DEPTH), 0, "isolated client b");
	b.cl.wake = false; /* b's eventfd stays open (the server polls it), b never writes it */
	slow = wake_rounds(&b, WAKE_N, WAKE_GAP_US, WAKE_SLOW, lat);
	for (unsigned i = 0; i < WAKE_N; i++)
		best = lat[i] && lat[i] < best ? lat[i] : best;
	CHECK(slow >= WAKE_N / 2 && b.cl.wakes == 0,
	      "a lying client that never wakes the poller: %u of %u reads slower than 50 ms (the "
	      "sleep's timeout picks them up; fastest %.3f ms)",
	      slow, WAKE_N, (double)best / 1e6);
	b.cl.wake = true;

	/* a liar that floods its eventfd and writes the poller word, while a works with gaps */
	if (pipe(lp))
		lp[0] = lp[1] = -1;
	fflush(stdout);
	liar = fork();
	if (!liar) {
		struct iclient c;
		uint64_t one = 1, t_end = upcie_time_ns() + UPCIE_NSEC_PER_SEC / 2;
		char go = 0;

		upcie_log_set_level(UPCIE_LOG_NONE);
		memset(&c, 0, sizeof(c));
		if (iclient_open(&c, sv.path, C_DEPTH))
			_exit(1);
		if (write(lp[1], &go, 1) != 1)
			_exit(2);
		while (upcie_time_ns() < t_end) {
			__atomic_store_n(&c.cl.relay->slot[0].poller, 0xdeadbeefu,
					 __ATOMIC_RELAXED);
			if (write(c.cl.wake_fd, &one, sizeof(one)) < 0)
				_exit(3);
			usleep(20); /* ~40000 wakeups a second, leaving the CPU to the others */
		}
		_exit(0);
	}
	{
		char go = 1;

		CHECK(read(lp[0], &go, 1) == 1 && go == 0, "a liar connected");
	}
	slow = wake_rounds(&a, 8, 40000, WAKE_SLOW, lat);
	worst = 0;
	for (unsigned i = 0; i < 8; i++)
		worst = lat[i] > worst ? lat[i] : worst;
	CHECK(slow <= 1 && worst && worst < 10 * WAKE_SLOW,
	      "a's reads stay prompt while the liar floods its eventfd and writes its poller word "
	      "(%u of 8 slower than 50 ms, one allowed for a loaded host; worst %.3f ms)",
	      slow, (double)worst / 1e6);
	CHECK_EQ(wait_status(liar), 0, "the liar ran");
	close(lp[0]);
	close(lp[1]);
	CHECK_EQ(iclient_rounds(&a, 7, 2800, 8, 2), 0, "a's I/O verifies after it");
	iclient_close(&a);
	iclient_close(&b);
	st = server_stop(&sv);
	CHECK(st.ok && st.woken >= WAKE_N / 2 && st.sleep_timeouts >= WAKE_N / 2 && st.kept == 0 &&
		  st.late == 0,
	      "server: %llu sleeps, %llu ended by a client's wakeup, %llu by the timeout (b's)",
	      st.sleeps, st.woken, st.sleep_timeouts);

	/* idle with a queue: the poller sleeps until woken, it does not wake itself every ms */
	CHECK_EQ(server_start(&sv, "wake-idle", &k), 0, "server up");
	memset(&a, 0, sizeof(a));
	CHECK_EQ(iclient_open(&a, sv.path, C_DEPTH), 0, "isolated client a");
	CHECK_EQ(wake_rounds(&a, 1, 1000, WAKE_SLOW, lat), 0u, "a read");
	usleep(500000);
	CHECK_EQ(wake_rounds(&a, 1, 1000, WAKE_SLOW, lat), 0u, "a read after 500 ms of quiet");
	iclient_close(&a);
	st = server_stop(&sv);
	CHECK(st.ok && st.naps <= 20 && st.sleep_timeouts <= 10,
	      "server: the poller slept %llu times in 500 ms of quiet (at most 20; a poller that "
	      "naps 1 ms at a time: about 500)",
	      st.naps);
}

/* Isolated queues survive a controller reset another client's failure caused. */
static void test_isolated_reset(void)
{
	struct srv_knobs k;
	struct server sv;
	struct client a;
	struct iclient b;
	struct icio io;
	struct upcie_served_sub u;

	knobs_open(&k);
	k.fail_delete_sq = 0x0001;
	k.hold_opc = UPCIE_NVME_NVM_READ;
	CHECK_EQ(server_start(&sv, "isoreset", &k), 0, "server up (deletions fail, reads held)");
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	CHECK_EQ(client_open(&a, sv.path, C_DEPTH), 0, "trusted client a");
	CHECK_EQ(iclient_open(&b, sv.path, C_DEPTH), 0, "isolated client b");
	memset(&u, 0, sizeof(u));
	memset(&io, 0, sizeof(io));
	u.opc = UPCIE_NVME_NVM_READ;
	u.nsid = 1;
	u.slba = 0;
	u.nlb = 8;
	u.region = b.mem.id;
	u.off = C_DATA;
	u.len = 4096;
	CHECK_EQ(upcie_served_iqp_submit(&b.q, &u, icio_cb, &io), 0, "b: a read, held");
	CHECK_EQ(upcie_served_iqp_wait(&b.q, 50000000), -ETIMEDOUT, "b: it waits");
	upcie_log_set_level(UPCIE_LOG_NONE);
	CHECK_EQ(upcie_served_qp_delete(&a.qp), 0, "a: deletion refused, the server resets");
	upcie_log_set_level(UPCIE_LOG_ERROR);
	CHECK_EQ(upcie_served_iqp_wait(&b.q, 2000000000), 0, "b: its read ended");
	CHECK(io.calls == 1 && io.err == -ECANCELED, "once, -ECANCELED (%d, %d)", io.calls, io.err);
	upcie_served_mem_free(&a.mem);
	upcie_served_disconnect(&a.cl);
	iclient_close(&b);
	server_stop(&sv);
}

/* The relay page's state word is the client's to write: the server's record of a lost queue is
 * its own. */
static void test_lost_word(void)
{
	struct srv_knobs k;
	struct server sv;
	struct client a, b;
	struct stats st;

	memset(&k, 0, sizeof(k));
	k.allow_uid = -1;
	k.fail_delete_sq = 0x0001;
	CHECK_EQ(server_start(&sv, "lostword", &k), 0, "server up (deletions fail)");
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	CHECK_EQ(client_open(&a, sv.path, C_DEPTH), 0, "client a");
	CHECK_EQ(client_open(&b, sv.path, C_DEPTH), 0, "client b");
	__atomic_store_n(&b.cl.relay->slot[b.qp.slot].state, UPCIE_SERVED_SLOT_LOST,
			 __ATOMIC_RELEASE);
	upcie_log_set_level(UPCIE_LOG_NONE);
	CHECK_EQ(upcie_served_qp_delete(&a.qp), 0, "a's deletion refused: the server resets");
	upcie_log_set_level(UPCIE_LOG_ERROR);
	CHECK_EQ(upcie_served_qp_delete(&b.qp), 0, "b deletes its queue");
	upcie_served_mem_free(&a.mem);
	upcie_served_disconnect(&a.cl);
	upcie_served_mem_free(&b.mem);
	upcie_served_disconnect(&b.cl);
	st = server_stop(&sv);
	CHECK(st.ok && st.resets == 1 && st.qp_lost == 1,
	      "b wrote LOST into its own relay word first: the server still counted its queue "
	      "lost to the reset (%llu)",
	      st.qp_lost);
}

/*
 * A client holding the whole device when the server dies: it disables the controller itself
 * before it reports the server gone (the kernel will not reset a device this client keeps
 * open). In this process, against a model whose registers the "client" maps.
 */
static void test_direct_death(void)
{
	struct rig *r = (struct rig *)calloc(1, sizeof(*r));
	struct upcie_served_relay *relay =
	    (struct upcie_served_relay *)aligned_alloc(64, sizeof(*relay));
	struct upcie_served_client cl;
	int sp[2], e1, e2;
	pid_t dead;

	rig_setup(r);
	CHECK(!rig_start(r) && !rig_ctrl(r, NULL), "a controller model, enabled");
	CHECK(!socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sp), "a socket standing for the server's");
	memset(relay, 0, sizeof(*relay));
	fflush(stdout);
	dead = fork();
	if (!dead)
		_exit(0);
	memset(&cl, 0, sizeof(cl));
	cl.sock = sp[0];
	cl.relay = relay;
	cl.pidfd = (int)syscall(SYS_pidfd_open, dead, 0);
	waitpid(dead, NULL, 0);
	cl.info.server_pid = dead;
	cl.db = (volatile uint8_t *)r->cm.regs + 0x1000;
	cl.db_len = 4096;
	upcie_log_set_level(UPCIE_LOG_NONE);
	/* the control: the device handed out without the register page: never reported free */
	e1 = upcie_served_alive(&cl);
	cl.regs = (volatile uint8_t *)r->cm.regs;
	e2 = upcie_served_alive(&cl);
	upcie_log_set_level(UPCIE_LOG_ERROR);
	CHECK_EQ(e1, -EBUSY,
		 "negative control: no way to stop the device: the server's death is -EBUSY, not "
		 "-ENOTCONN (buffers stay in use)");
	CHECK_EQ(e2, -ENOTCONN, "with the register page: the server reported gone");
	CHECK(!(r->cm.regs[UPCIE_NVME_REG_CC / 4] & 1) &&
		  !(r->cm.regs[UPCIE_NVME_REG_CSTS / 4] & 1),
	      "only after CC.EN 0 and CSTS.RDY 0 (CC 0x%x, CSTS 0x%x)",
	      r->cm.regs[UPCIE_NVME_REG_CC / 4], r->cm.regs[UPCIE_NVME_REG_CSTS / 4]);
	CHECK(cl.stopped, "and the client remembers it stopped the device");
	close(cl.pidfd);
	r->c.stopped = true; /* the model was disabled behind the driver's back */
	rig_teardown(r);
	free(r);

	/* a controller that does not answer the disable (its model stopped): never reported free */
	r = (struct rig *)calloc(1, sizeof(*r));
	rig_setup(r);
	CHECK(!rig_start(r) && !rig_ctrl(r, NULL), "a second model, enabled");
	dead = fork();
	if (!dead)
		_exit(0);
	memset(&cl, 0, sizeof(cl));
	cl.sock = sp[0];
	cl.relay = relay;
	cl.pidfd = (int)syscall(SYS_pidfd_open, dead, 0);
	waitpid(dead, NULL, 0);
	cl.db = (volatile uint8_t *)r->cm.regs + 0x1000;
	cl.regs = (volatile uint8_t *)r->cm.regs;
	nvme_cmodel_stop(&r->cm);
	r->started = false;
	upcie_log_set_level(UPCIE_LOG_NONE);
	e1 = upcie_served_alive(&cl);
	upcie_log_set_level(UPCIE_LOG_ERROR);
	CHECK_EQ(e1, -EBUSY, "a controller still RDY after CAP.TO: -EBUSY, buffers kept");
	close(cl.pidfd);
	r->c.stopped = true;
	rig_teardown(r);
	free(r);
	close(sp[0]);
	close(sp[1]);
	free(relay);
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
	test_isolated_io();
	test_isolation();
	test_relay_sealed();
	test_cq_untouched();
	test_idle_lockout();
	test_uid_caps();
	test_failed_ctrl();
	test_pidns();
	test_socket_path();
	test_ring_fault();
	test_wake();
	test_isolated_reset();
	test_lost_word();
	test_direct_death();
	return check_done();
}
