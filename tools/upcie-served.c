/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * upcie-served: owns NVMe controllers and serves their I/O queue pairs to other processes
 * (served/server.h; clients use served/client.h).
 *
 *   upcie-served BDF[,BDF...] [--dir /run/upcie | --socket PATH] [--path auto|uio|type1|iommufd]
 *                [--bind] [--mode 0660] [--group GID] [--allow-uid UID] [--max-clients N]
 *                [--max-qp N] [--max-mem N] [--max-bytes B] [--max-depth N]
 *                [--direct-doorbells] [--relay-spin-us N]
 *
 * One socket per controller: --socket for a single one, else DIR/<bdf>.sock. Each controller
 * is served by its own thread (and its doorbell relay thread). Runs until SIGTERM or SIGINT,
 * then deletes every client's queues, gives their memory back, shuts the controllers down and
 * prints one "stats" line per controller. If it is killed instead, the kernel releases the
 * devices (vfio resets the function; /dev/uioN clears bus mastering) and a new instance
 * started on the same sockets takes over (the stale socket files are replaced); clients
 * connect again.
 *
 * Exit 0 after a clean stop, 1 when a controller could not be opened or served, 2 on a usage
 * error.
 */
// testbed-ldflags: -lpthread
#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/dev.h>
#include <upcie/served/server.h>
#include <upcie/pci/bdf.h>

#define SERVED_MAX_CTRL 32

struct served_one {
	struct upcie_pci_bdf bdf;
	char name[UPCIE_PCI_BDF_STRLEN];
	char sock[108];
	struct upcie_nvme_ctrl c;
	struct upcie_served s;
	pthread_t thread;
	bool open, serving, threaded;
	int err;
};

static volatile int served_stop;

static void served_signal(int sig)
{
	(void)sig;
	served_stop = 1;
}

static void *served_thread(void *arg)
{
	struct served_one *o = (struct served_one *)arg;

	o->err = upcie_served_run(&o->s, &served_stop);
	return NULL;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: upcie-served BDF[,BDF...] [options]\n"
		"  --dir DIR             sockets DIR/<bdf>.sock (default /run/upcie)\n"
		"  --socket PATH         the socket of a single controller\n"
		"  --path P              auto, uio, type1, iommufd (default auto)\n"
		"  --bind                bind the functions to the path's driver first\n"
		"  --mode OCTAL          socket file mode (default 0600)\n"
		"  --group GID           socket file group\n"
		"  --allow-uid UID       only this uid (and root) may connect\n"
		"  --max-clients N       per controller (default 64)\n"
		"  --max-qp N            queue pairs per client (default 16, at most %u)\n"
		"  --max-mem N           registered regions per client (default 16)\n"
		"  --max-bytes B         registered bytes per client (default 1 GiB)\n"
		"  --max-depth N         entries per queue (default CAP.MQES + 1)\n"
		"  --direct-doorbells    let root and this user map the doorbells themselves\n"
		"  --relay-spin-us N     relay spins N us after the last doorbell (default 2000)\n",
		UPCIE_SERVED_MAX_QP);
}

static int parse_u64(const char *s, uint64_t *v)
{
	char *end;

	if (!s || !*s)
		return -1;
	errno = 0;
	*v = strtoull(s, &end, 0);
	return errno || *end ? -1 : 0;
}

int main(int argc, char **argv)
{
	static struct served_one one[SERVED_MAX_CTRL];
	enum upcie_nvme_path path = UPCIE_NVME_PATH_AUTO;
	const char *dir = "/run/upcie", *sock = NULL;
	struct upcie_served_opts so;
	unsigned n = 0, failed = 0;
	struct sigaction sa;
	bool bind = false;
	char *list, *tok, *save = NULL;

	if (argc < 2 || argv[1][0] == '-') {
		usage(argc >= 2 && !strcmp(argv[1], "--help") ? stdout : stderr);
		return argc >= 2 && !strcmp(argv[1], "--help") ? 0 : 2;
	}
	memset(&so, 0, sizeof(so));
	so.gid = (gid_t)-1;
	so.allow_uid = -1;
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		uint64_t x = 0;
		int bad = 0;

		if (!strcmp(a, "--bind")) {
			bind = true;
			continue;
		}
		if (!strcmp(a, "--direct-doorbells")) {
			so.direct_doorbells = true;
			continue;
		}
		if (!v) {
			fprintf(stderr, "upcie-served: %s needs a value\n", a);
			return 2;
		}
		i++;
		if (!strcmp(a, "--dir"))
			dir = v;
		else if (!strcmp(a, "--socket"))
			sock = v;
		else if (!strcmp(a, "--path"))
			bad = upcie_nvme_path_parse(v, &path) != 0;
		else if (!strcmp(a, "--mode"))
			bad = parse_u64(v, &x) || x > 0777, so.mode = (mode_t)x;
		else if (!strcmp(a, "--group"))
			bad = parse_u64(v, &x) || x > UINT32_MAX, so.gid = (gid_t)x;
		else if (!strcmp(a, "--allow-uid"))
			bad = parse_u64(v, &x) || x > UINT32_MAX, so.allow_uid = (long)x;
		else if (!strcmp(a, "--max-clients"))
			bad = parse_u64(v, &x) || !x || x > 4096, so.max_clients = (uint32_t)x;
		else if (!strcmp(a, "--max-qp"))
			bad = parse_u64(v, &x) || !x || x > UPCIE_SERVED_MAX_QP,
			so.max_qp = (uint32_t)x;
		else if (!strcmp(a, "--max-mem"))
			bad = parse_u64(v, &x) || !x || x > 1024, so.max_mem = (uint32_t)x;
		else if (!strcmp(a, "--max-bytes"))
			bad = parse_u64(v, &x) || !x, so.max_bytes = x;
		else if (!strcmp(a, "--max-depth"))
			bad = parse_u64(v, &x) || x < 2 || x > 65536, so.max_depth = (uint32_t)x;
		else if (!strcmp(a, "--relay-spin-us"))
			bad = parse_u64(v, &x) || !x || x > 10000000, so.relay_spin_ns = x * 1000;
		else {
			fprintf(stderr, "upcie-served: unknown option %s\n", a);
			usage(stderr);
			return 2;
		}
		if (bad) {
			fprintf(stderr, "upcie-served: bad value for %s: %s\n", a, v);
			return 2;
		}
	}
	list = strdup(argv[1]);
	for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (n == SERVED_MAX_CTRL || upcie_pci_bdf_parse(tok, &one[n].bdf)) {
			fprintf(stderr, "upcie-served: bad or too many controllers: %s\n", tok);
			free(list);
			return 2;
		}
		upcie_pci_bdf_format(&one[n].bdf, one[n].name, sizeof(one[n].name));
		n++;
	}
	free(list);
	if (!n || (sock && n > 1)) {
		fprintf(stderr, "upcie-served: --socket takes a single controller\n");
		return 2;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = served_signal;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	for (unsigned i = 0; i < n; i++) {
		struct served_one *o = &one[i];
		struct upcie_nvme_ctrl_opts co;
		int err;

		char where[sizeof(o->sock)];
		int len = sock ? snprintf(where, sizeof(where), "%s", sock)
			       : snprintf(where, sizeof(where), "%s/%s.sock", dir, o->name);

		if (len < 0 || len >= (int)sizeof(where)) {
			fprintf(stderr, "upcie-served: socket path too long\n");
			failed++;
			break;
		}
		memcpy(o->sock, where, sizeof(where));
		memset(&co, 0, sizeof(co));
		co.dev.path = path;
		co.dev.bind = bind;
		err = upcie_nvme_ctrl_open(&o->c, &o->bdf, &co);
		if (err) {
			fprintf(stderr, "upcie-served: %s: open failed: %s\n", o->name,
				upcie_errno_name(err));
			failed++;
			break;
		}
		o->open = true;
		so.path = o->sock;
		err = upcie_served_init(&o->s, &o->c, NULL, &so);
		if (err) {
			fprintf(stderr, "upcie-served: %s: serving on %s failed: %s\n", o->name,
				o->sock, upcie_errno_name(err));
			failed++;
			break;
		}
		o->serving = true;
		printf("upcie-served: %s on %s (path %s, %u I/O queues granted)\n", o->name,
		       o->sock, upcie_nvme_path_name(o->c.dev.path), o->c.nqueues);
	}
	fflush(stdout);
	for (unsigned i = 0; !failed && i < n; i++) {
		if (pthread_create(&one[i].thread, NULL, served_thread, &one[i])) {
			failed++;
			served_stop = 1;
			break;
		}
		one[i].threaded = true;
	}
	if (failed)
		served_stop = 1;
	for (unsigned i = 0; i < n; i++) {
		struct served_one *o = &one[i];
		struct upcie_served_stats st;
		int err;

		if (o->threaded)
			pthread_join(o->thread, NULL);
		if (!o->serving)
			goto close;
		st = o->s.st;
		upcie_served_fini(&o->s);
		printf("upcie-served: %s stats clients=%" PRIu64 " refused=%" PRIu64
		       " gone=%" PRIu64 " qp_made=%" PRIu64 " qp_gone=%" PRIu64 " qp_lost=%" PRIu64
		       " kept=%" PRIu64 " bad=%" PRIu64 " resets=%" PRIu64 " relayed=%" PRIu64
		       " dropped=%" PRIu64 "\n",
		       o->name, st.clients, st.refused, st.gone, st.qp_made, st.qp_gone, st.qp_lost,
		       st.kept, st.bad, st.resets, st.relayed, st.dropped);
		if (o->err)
			failed++;
	close:
		if (o->open) {
			err = upcie_nvme_ctrl_close(&o->c);
			if (err)
				fprintf(stderr, "upcie-served: %s: close: %s\n", o->name,
					upcie_errno_name(err));
		}
	}
	fflush(stdout);
	return failed ? 1 : 0;
}
