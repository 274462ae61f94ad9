/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer harness: the request side of the served queue-pair server (served/server.h),
 * as a lying or broken client would talk to it. One server over the controller model lives for
 * the whole run; each input is one client connection: a valid HELLO (unless the first selector
 * has bit 0x8 set with operation HELLO: then a HELLO of the wrong version, or anything else
 * first, which the server must refuse), then a sequence of messages, each a selector byte and
 * the bytes of a request (the selector picks the operation, whether the magic is kept, whether a
 * memfd travels with it, sealed or not, and of what size), or raw bytes of any length.
 * The server answers each message; when the connection ends (the server hangs up on a bad frame,
 * or the input ends and the client closes) the server cleans up after the client.
 * Checked after every input: the client is gone from the server's table, no queue of it is left
 * on the controller (every identifier free), nothing was kept (the model never refuses a
 * deletion), the controller is still ready, and a response never carries a descriptor that was
 * not asked for, and the model never wrote into memory given back. ASan and UBSan report the
 * rest.
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

static struct rig *R;
static struct upcie_served S;
static void fz_log(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)msg;
	(void)ctx;
}

static void fz_init(void)
{
	struct upcie_served_mapper map = { .map = served_win_map };
	struct upcie_served_opts o;
	static char path[108];

	upcie_log_set_handler(fz_log, NULL);
	R = (struct rig *)calloc(1, sizeof(*R));
	rig_setup(R);
	R->cm.abort_on_sq_delete = true;
	if (served_win_setup(&R->cm, &R->im) || rig_start(R) || rig_ctrl(R, NULL))
		abort();
	snprintf(path, sizeof(path), "/tmp/upcie-fuzz-served-%d.sock", (int)getpid());
	memset(&o, 0, sizeof(o));
	o.path = path;
	o.gid = (gid_t)-1;
	o.allow_uid = -1;
	o.max_clients = 2;
	o.max_qp = 4;
	o.max_mem = 3;
	o.max_bytes = 8u << 20;
	if (upcie_served_init(&S, &R->c, &map, &o))
		abort();
}

static int fz_memfd(uint8_t sel, uint8_t sz)
{
	int fd = memfd_create("fz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	size_t size = (size_t)(sz % 8 + 1) * 4096 * (sel & 0x40 ? 64 : 1);

	if (fd < 0 || ftruncate(fd, (off_t)size))
		abort();
	if (sel & 0x20)
		fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
	return fd;
}

static void fz_report(void)
{
	if (R && getenv("FUZZ_SERVED_STATS"))
		fprintf(stderr,
			"served: %llu queue pairs made, %llu deleted, %llu requests refused\n",
			(unsigned long long)S.st.qp_made, (unsigned long long)S.st.qp_gone,
			(unsigned long long)S.st.bad);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sockaddr_un sa;
	uint8_t rbuf[UPCIE_SERVED_MSG_MAX];
	uint32_t slot = UINT32_MAX;
	bool live = true;
	int c;

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
		abort(); /* the previous client was not cleaned up */
	if (!size || (data[0] & 0xf) != (0x8 | UPCIE_SERVED_OP_HELLO)) {
		struct upcie_served_req h;
		int got = -1;

		memset(&h, 0, sizeof(h));
		h.magic = UPCIE_SERVED_MAGIC;
		h.op = UPCIE_SERVED_OP_HELLO;
		h.u.hello.version = UPCIE_SERVED_VERSION;
		h.u.hello.flags = size && data[0] & 0x10 ? UPCIE_SERVED_HELLO_ISOLATED : 0;
		if (upcie_served_send_(c, &h, sizeof(h), -1))
			abort();
		live = upcie_served_serve_(&S, slot);
		if (upcie_served_recv_(c, rbuf, sizeof(rbuf), &got, MSG_DONTWAIT) > 0 && got >= 0)
			close(got);
	}
	while (size && live) {
		struct upcie_served_req rq;
		uint8_t sel = data[0];
		size_t take;
		int fd = -1, got = -1;
		ssize_t n;

		data++;
		size--;
		if ((sel & 0xf) == 0xf) {
			/* raw bytes: a frame of any length */
			take = size < (size_t)(sel >> 4) * 7 ? size : (size_t)(sel >> 4) * 7;
			if (upcie_served_send_(c, data, take, -1))
				break;
		} else {
			memset(&rq, 0, sizeof(rq));
			take = size < sizeof(rq) ? size : sizeof(rq);
			memcpy(&rq, data, take);
			rq.magic = UPCIE_SERVED_MAGIC;
			rq.op = sel & 0x7 ? sel & 0x7 : UPCIE_SERVED_OP_IQP_CREATE;
			if (rq.op == UPCIE_SERVED_OP_HELLO && !(sel & 0x8))
				rq.u.hello.version = UPCIE_SERVED_VERSION;
			if (rq.op == UPCIE_SERVED_OP_MEM_REG && !(sel & 0x80)) {
				fd = fz_memfd(sel, take ? data[0] : 0);
				rq.u.mem_reg.size = (uint64_t)((take ? data[1 % take] : 0) % 9) *
						    4096 * (sel & 0x40 ? 64 : 1);
			}
			if (upcie_served_send_(c, &rq, sizeof(rq), fd))
				break;
			if (fd >= 0)
				close(fd);
		}
		data += take;
		size -= take;
		live = upcie_served_serve_(&S, slot);
		n = upcie_served_recv_(c, rbuf, sizeof(rbuf), &got, MSG_DONTWAIT);
		if (n >= (ssize_t)sizeof(struct upcie_served_rsp) && got >= 0 &&
		    ((struct upcie_served_rsp *)rbuf)->op != UPCIE_SERVED_OP_HELLO &&
		    ((struct upcie_served_rsp *)rbuf)->op != UPCIE_SERVED_OP_IQP_CREATE)
			abort(); /* a descriptor with a response that does not carry one */
		if (got >= 0)
			close(got);
	}
	close(c);
	while (live)
		live = upcie_served_serve_(&S, slot);
	upcie_served_conn_drop_(&S, slot);
	if (S.conns[slot] || S.nconns || S.st.kept || served_win_late)
		abort();
	for (uint32_t q = 1; q <= R->c.nslots; q++)
		if (R->c.ioqs[q])
			abort(); /* a queue of the gone client is still on the controller */
	if (R->c.state != UPCIE_NVME_CTRL_READY)
		abort();
	return 0;
}
