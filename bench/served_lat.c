/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Latency and CPU cost of served queue pairs (served/server.h, served/client.h) against the
 * controller model (tests/unit/nvme_ctrl_model.h): a forked server process owns the model and
 * serves it; this process is the client, isolated or trusted with relayed doorbells, and runs
 * 4 KiB reads at a queue depth. A fresh server per figure, so its poller's account (sleeps,
 * wakeups, CPU time of the poller thread) is that figure's alone. Prints one line per figure:
 *
 *   served_lat mode=iso qd=1 gap_us=0 ops=N mean_us= p50_us= p99_us= max_us= iops=
 *     client_cpu_us_per_io= poller_cpu_us_per_io= naps= nap_us= sleeps= woken= timeouts=
 *
 *   served_lat [--mode iso|relayed] [--qd Q] [--ops N] [--gap-us G] [--delay-us D]
 *              [--spin-us S] [--idle-ms I]
 *     --gap-us: at QD 1, the client sleeps G us between a completion and its next submission
 *     (an application doing something else); --delay-us: the model completes each command D us
 *     after it fetched it (default 20); --spin-us: the server's relay_spin_ns in us (0: its
 *     default); --idle-ms: then the queue stays idle I ms and the poller's CPU time over that
 *     time is printed (idle_poller_cpu_pct).
 *
 * The model is a test instrument: its latency is a knob, so the figures are the software's
 * cost around a command (handoffs between client, poller and controller), not any device's.
 */
#define _GNU_SOURCE 1
#include <upcie/served/client.h>
#include <upcie/served/server.h>

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nvme_ctrl_rig.h"
#include "served_win.h"

#define REGION (4u << 20)
#define MAXQD  64u

static volatile int srv_stop;

static volatile int srv_any;

static void srv_term(int sig)
{
	(void)sig;
	srv_stop = 1;
	srv_any = 1;
}

static uint64_t thread_cpu_ns(pthread_t t)
{
	struct timespec ts;
	clockid_t id;

	if (pthread_getcpuclockid(t, &id) || clock_gettime(id, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * UPCIE_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

/* The server process: writes its poller's account ("cpu_ns=... naps=...") to `out` when
 * SIGTERM ends it; at SIGUSR1 the poller's CPU time so far ("cpu_ns=..."). */
static volatile int srv_mark;

static void srv_usr1(int sig)
{
	(void)sig;
	srv_mark = 1;
	srv_any = 1;
}

struct srv_args {
	uint32_t delay_us;
	uint64_t spin_ns;
};

static int server_main(const char *path, const struct srv_args *a, int out)
{
	struct upcie_served_mapper map = { .map = served_win_map };
	struct upcie_served_grant g = { -1, -1, 1, UPCIE_SERVED_READ | UPCIE_SERVED_WRITE, 0, 0 };
	struct upcie_served_opts o;
	struct upcie_served s;
	struct rig *r = (struct rig *)calloc(1, sizeof(*r));
	char line[512];
	int err;

	signal(SIGTERM, srv_term);
	signal(SIGUSR1, srv_usr1);
	upcie_log_set_level(UPCIE_LOG_ERROR);
	if (!r)
		return 2;
	rig_setup(r);
	if (served_win_setup(&r->cm, &r->im))
		return 2;
	r->cm.io_delay_us = a->delay_us;
	r->cm.nqueues = 16;
	if (rig_start(r) || rig_ctrl(r, NULL))
		return 3;
	memset(&o, 0, sizeof(o));
	o.path = path;
	o.gid = (gid_t)-1;
	o.allow_uid = -1;
	o.trust = UPCIE_SERVED_TRUST_ALL;
	o.grants = &g;
	o.ngrants = 1;
	o.max_clients = 4;
	o.max_qp = 4;
	o.max_mem = 4;
	o.max_bytes = 32u << 20;
	o.relay_spin_ns = a->spin_ns;
	err = upcie_served_init(&s, &r->c, &map, &o);
	if (err)
		return 4;
	while (!srv_stop) {
		/* upcie_served_run() returns within 100 ms of either signal */
		err = upcie_served_run(&s, &srv_any);
		if (err)
			break;
		srv_any = srv_stop;
		if (srv_mark) {
			snprintf(line, sizeof(line), "cpu_ns=%" PRIu64 "\n",
				 thread_cpu_ns(s.relay));
			if (write(out, line, strlen(line)) < 0)
				return 5;
			srv_mark = 0;
		}
	}
	snprintf(line, sizeof(line),
		 "cpu_ns=%" PRIu64 " naps=%" PRIu64 " nap_us=%" PRIu64 " sleeps=%" PRIu64
		 " woken=%" PRIu64 " timeouts=%" PRIu64 "\n",
		 thread_cpu_ns(s.relay), s.st.naps, s.st.nap_us, s.st.sleeps, s.st.woken,
		 s.st.sleep_timeouts);
	upcie_served_fini(&s);
	if (write(out, line, strlen(line)) < 0)
		return 5;
	rig_teardown(r);
	free(r);
	return 0;
}

struct slot {
	bool busy;
	int err;
	uint64_t t0;
};

static void icb(void *ctx, const struct upcie_served_cpl *c)
{
	struct slot *s = (struct slot *)ctx;

	s->busy = false;
	s->err = c->err ? c->err : c->status ? -EIO : 0;
}

static void tcb(void *ctx, const struct upcie_nvme_cqe *cqe, int err)
{
	struct slot *s = (struct slot *)ctx;

	s->busy = false;
	s->err = err ? err : upcie_nvme_cqe_ok(cqe) ? 0 : -EIO;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t proc_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * UPCIE_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

static void usage(void)
{
	fprintf(stderr, "usage: served_lat [--mode iso|relayed] [--qd Q] [--ops N] [--gap-us G] "
			"[--delay-us D] [--spin-us S] [--idle-ms I]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "mode", required_argument, NULL, 'm' },
		{ "qd", required_argument, NULL, 'q' },
		{ "ops", required_argument, NULL, 'n' },
		{ "gap-us", required_argument, NULL, 'g' },
		{ "delay-us", required_argument, NULL, 'd' },
		{ "spin-us", required_argument, NULL, 's' },
		{ "idle-ms", required_argument, NULL, 'i' },
		{ NULL, 0, NULL, 0 },
	};
	struct srv_args sa = { 20, 0 };
	unsigned qd = 1, gap_us = 0, idle_ms = 0;
	uint64_t n = 20000, done = 0, issued = 0, x = 88172645463325252ull, t0, t1, c0, c1;
	uint64_t *lat, nlat = 0, sum = 0, idle_cpu0 = 0, idle_cpu1 = 0, idle_t = 0;
	bool iso = true;
	char path[108], line[512];
	struct upcie_served_client cl;
	struct upcie_served_mem mem;
	struct upcie_served_iqp iq;
	struct upcie_served_qp qp;
	struct upcie_served_qp_opts qo;
	struct slot sl[MAXQD];
	int opt, p[2], err, status;
	pid_t pid;
	ssize_t got;

	while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (opt) {
		case 'm':
			if (!strcmp(optarg, "iso"))
				iso = true;
			else if (!strcmp(optarg, "relayed"))
				iso = false;
			else
				usage();
			break;
		case 'q':
			qd = (unsigned)atoi(optarg);
			break;
		case 'n':
			n = strtoull(optarg, NULL, 0);
			break;
		case 'g':
			gap_us = (unsigned)atoi(optarg);
			break;
		case 'd':
			sa.delay_us = (uint32_t)atoi(optarg);
			break;
		case 's':
			sa.spin_ns = strtoull(optarg, NULL, 0) * 1000;
			break;
		case 'i':
			idle_ms = (unsigned)atoi(optarg);
			break;
		default:
			usage();
		}
	}
	if (!qd || qd > MAXQD || !n)
		usage();
	signal(SIGPIPE, SIG_IGN);
	upcie_log_set_level(UPCIE_LOG_ERROR);
	snprintf(path, sizeof(path), "/tmp/upcie-served-lat-%d.sock", (int)getpid());
	if (pipe(p))
		return 2;
	fflush(stdout);
	pid = fork();
	if (!pid) {
		close(p[0]);
		_exit(server_main(path, &sa, p[1]));
	}
	close(p[1]);
	err = -ETIMEDOUT;
	upcie_log_set_level(UPCIE_LOG_NONE);
	for (int i = 0; i < 500 && err; i++) {
		err = upcie_served_connect(&cl, path, iso ? UPCIE_SERVED_ISOLATED : 0);
		if (err)
			usleep(10000);
	}
	upcie_log_set_level(UPCIE_LOG_ERROR);
	memset(&iq, 0, sizeof(iq));
	memset(&qp, 0, sizeof(qp));
	if (!err)
		err = upcie_served_mem_alloc(&cl, REGION, &mem);
	if (!err && iso) {
		err = upcie_served_iqp_create(&cl, &iq, 64);
	} else if (!err) {
		memset(&qo, 0, sizeof(qo));
		qo.depth = 64;
		qo.sq_off = 0;
		qo.cq_off = 64 * 1024;
		qo.list_off = 128 * 1024;
		err = upcie_served_qp_create(&cl, &qp, &mem, &qo);
	}
	lat = (uint64_t *)calloc(n, sizeof(*lat));
	if (err || !lat) {
		fprintf(stderr, "served_lat: setup: %s\n", upcie_errno_name(err ? err : -ENOMEM));
		kill(pid, SIGTERM);
		waitpid(pid, NULL, 0);
		return 1;
	}
	memset(sl, 0, sizeof(sl));
	c0 = proc_cpu_ns();
	t0 = upcie_time_ns();
	while (done < n && !err) {
		for (unsigned k = 0; k < qd && issued < n && !err; k++) {
			uint64_t blk =
			    (x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33;

			if (sl[k].busy)
				continue;
			blk %= RIG_NS_BLOCKS / 8;
			sl[k].busy = true;
			sl[k].t0 = upcie_time_ns();
			issued++;
			err = iso ? upcie_served_iqp_rw(&iq, UPCIE_NVME_NVM_READ, 1, blk * 8, 8,
							&mem, (uint64_t)(1u << 20) + k * 4096, 4096,
							icb, &sl[k])
				  : upcie_served_qp_rw(&qp, UPCIE_NVME_NVM_READ, 1, blk * 8, 8,
						       &mem, (uint64_t)(1u << 20) + k * 4096, 4096,
						       tcb, &sl[k]);
		}
		while (!err) {
			int r =
			    iso ? upcie_served_iqp_poll(&iq, 64) : upcie_served_qp_poll(&qp, 64);

			if (r < 0)
				err = r;
			if (r > 0) {
				uint64_t now = upcie_time_ns();

				done += (uint64_t)r;
				for (unsigned k = 0; k < qd; k++)
					if (!sl[k].busy && sl[k].t0) {
						lat[nlat] = now - sl[k].t0;
						sum += lat[nlat++];
						sl[k].t0 = 0;
						if (sl[k].err)
							err = sl[k].err;
					}
				break;
			}
		}
		if (gap_us && qd == 1 && !err) {
			struct timespec ts = { 0, (long)gap_us * 1000 };

			nanosleep(&ts, NULL);
		}
	}
	t1 = upcie_time_ns();
	c1 = proc_cpu_ns();
	if (!err && idle_ms) {
		/* the poller's CPU over an idle period of the same server */
		got = 0;
		kill(pid, SIGUSR1);
		got = read(p[0], line, sizeof(line) - 1);
		line[got > 0 ? got : 0] = 0;
		sscanf(line, "cpu_ns=%" SCNu64, &idle_cpu0);
		idle_t = upcie_time_ns();
		usleep(idle_ms * 1000);
		kill(pid, SIGUSR1);
		got = read(p[0], line, sizeof(line) - 1);
		line[got > 0 ? got : 0] = 0;
		sscanf(line, "cpu_ns=%" SCNu64, &idle_cpu1);
		idle_t = upcie_time_ns() - idle_t;
	}
	if (iso)
		upcie_served_iqp_delete(&iq);
	else
		upcie_served_qp_delete(&qp);
	upcie_served_mem_free(&mem);
	upcie_served_disconnect(&cl);
	kill(pid, SIGTERM);
	got = read(p[0], line, sizeof(line) - 1);
	line[got > 0 ? got : 0] = 0;
	waitpid(pid, &status, 0);
	if (err) {
		fprintf(stderr, "served_lat: I/O: %s\n", upcie_errno_name(err));
		return 1;
	}
	{
		uint64_t cpu = 0, naps = 0, nap_us = 0, sleeps = 0, woken = 0, tmo = 0;
		double dt = (double)(t1 - t0);

		sscanf(line,
		       "cpu_ns=%" SCNu64 " naps=%" SCNu64 " nap_us=%" SCNu64 " sleeps=%" SCNu64
		       " woken=%" SCNu64 " timeouts=%" SCNu64,
		       &cpu, &naps, &nap_us, &sleeps, &woken, &tmo);
		qsort(lat, nlat, sizeof(*lat), cmp_u64);
		printf("served_lat mode=%s qd=%u gap_us=%u delay_us=%u ops=%" PRIu64
		       " mean_us=%.1f p50_us=%.1f p99_us=%.1f max_us=%.1f iops=%.0f"
		       " client_cpu_us_per_io=%.2f poller_cpu_us_per_io=%.2f naps=%" PRIu64
		       " nap_us=%" PRIu64 " sleeps=%" PRIu64 " woken=%" PRIu64 " timeouts=%" PRIu64,
		       iso ? "iso" : "relayed", qd, gap_us, sa.delay_us, done,
		       (double)sum / 1e3 / (double)nlat, (double)lat[nlat / 2] / 1e3,
		       (double)lat[nlat * 99 / 100] / 1e3, (double)lat[nlat - 1] / 1e3,
		       (double)done * 1e9 / dt, (double)(c1 - c0) / 1e3 / (double)done,
		       (double)cpu / 1e3 / (double)done, naps, nap_us, sleeps, woken, tmo);
		if (idle_ms)
			printf(" idle_poller_cpu_pct=%.2f",
			       100.0 * (double)(idle_cpu1 - idle_cpu0) / (double)idle_t);
		printf("\n");
	}
	free(lat);
	return WIFEXITED(status) && !WEXITSTATUS(status) ? 0 : 1;
}
