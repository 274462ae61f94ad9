/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * upcie-served: owns NVMe controllers and serves their I/O queue pairs to other processes
 * (served/server.h; clients use served/client.h).
 *
 *   upcie-served BDF[,BDF...] [--dir /run/upcie | --socket PATH] [--path auto|uio|type1|iommufd]
 *                [--bind [--bind-any-class]] [--mode 660] [--group NAME|GID] [--allow-uid NAME|UID]
 *                [--trust owner|none|all] [--grant WHO:NSID[:SLBA+NLB][:ro]]...
 *                [--max-clients N] [--max-qp N] [--max-mem N] [--max-bytes 1G] [--max-depth N]
 *                [--uid-max-clients N] [--uid-max-qp N] [--uid-max-bytes SIZE]
 *                [--qp-reserve N] [--hello-timeout-ms N]
 *                [--trusted-whole-device] [--relay-spin-us N]
 *
 * Clients the daemon does not trust (--trust owner, the default: all but root and its own user)
 * get isolated queue pairs: they reach the blocks --grant names for their uid or group, through
 * commands the daemon builds, and nothing else. Trusted clients drive their own queues and reach
 * whatever the device can. --trusted-whole-device hands trusted clients the device's whole file
 * (vfio device fd or resource0) to ring doorbells themselves.
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
#include <limits.h>
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
#include <upcie/pci/sriov.h>

#include "opt.h"

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

/*
 * Before VFs can get resources the primary must give its flexible ones back, which takes effect
 * at its next function reset: with no VF enabled, close the controller, reset the PF through
 * sysfs and open it again.
 */
static int served_vf_primary(struct served_one *o, const struct upcie_nvme_ctrl_opts *co)
{
	char path[PATH_MAX];
	unsigned num = 0;
	bool reset;
	int err = upcie_nvme_ctrl_virt_release_primary(&o->c, &reset);

	if (err || !reset)
		return err;
	err = upcie_pci_sriov_num(&o->bdf, &num);
	if (err)
		return err;
	if (num) {
		fprintf(stderr,
			"upcie-served: %s: the primary holds flexible resources and %u VFs are "
			"enabled: a PF reset would take them away (set sriov_numvfs to 0 first)\n",
			o->name, num);
		return -EBUSY;
	}
	upcie_nvme_ctrl_close(&o->c);
	o->open = false;
	err = upcie_pci_func_path(&o->bdf, "reset", path, sizeof(path));
	if (!err)
		err = upcie_file_write_str(path, "1");
	if (err) {
		fprintf(stderr, "upcie-served: %s: PF reset: %s\n", o->name, upcie_errno_name(err));
		return err;
	}
	err = upcie_nvme_ctrl_open(&o->c, &o->bdf, co);
	if (err)
		return err;
	o->open = true;
	err = upcie_nvme_ctrl_virt_release_primary(&o->c, &reset);
	if (!err && reset)
		err = -EAGAIN;
	if (!err)
		printf("upcie-served: %s: the primary's flexible resources went back to the pool "
		       "(PF reset)\n",
		       o->name);
	return err;
}

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: upcie-served BDF[,BDF...] [options]\n"
	    "  --dir DIR             sockets DIR/<bdf>.sock (default /run/upcie)\n"
	    "  --socket PATH         the socket of a single controller\n"
	    "  --path P              auto, uio, type1, iommufd (default auto)\n"
	    "  --bind                bind the functions to the path's driver first (NVMe\n"
	    "                        controllers only, by PCI class 0x010802)\n"
	    "  --bind-any-class      with --bind: bind a function of another class too (a\n"
	    "                        controller that reports another class)\n"
	    "  --mode OCTAL          socket file mode, always octal: 660 = 0660 (default 0600)\n"
	    "  --group GROUP         socket file group, a name or a number\n"
	    "  --allow-uid USER      only this user (a name or a uid) and root may connect\n"
	    "  --max-clients N       per controller, 1..4096 (default 64)\n"
	    "  --max-qp N            queue pairs per client (default 16, at most %u)\n"
	    "  --max-mem N           registered regions per client, 1..1024 (default 16)\n"
	    "  --max-bytes SIZE      registered bytes per client: 1G, 512MiB (default 1 GiB)\n"
	    "  --max-depth N         entries per queue, 2..65536 (default CAP.MQES + 1)\n"
	    "  --trust WHO           trusted queue pairs for: owner (root and this user, the\n"
	    "                        default), none (everyone isolated), all (every client)\n"
	    "  --grant WHO:NSID[:SLBA+NLB][:ro]\n"
	    "                        isolated clients WHO (a user, @group, or *) may read and\n"
	    "                        write (ro: read) blocks SLBA..SLBA+NLB-1 of namespace NSID\n"
	    "                        (all of it without a range); repeat for more, at most %u\n"
	    "  --uid-max-clients N   connections per uid, HELLO or not (default max-clients / 4)\n"
	    "  --uid-max-qp N        queue pairs per uid (default half the controller's queues)\n"
	    "  --uid-max-bytes SIZE  registered bytes per uid (default 4 x max-bytes)\n"
	    "  --qp-reserve N        queues a uid holding queues cannot take (default 1/8)\n"
	    "  --hello-timeout-ms N  close connections silent this long (default 2000)\n"
	    "  --trusted-whole-device\n"
	    "                        hand trusted clients the whole device's file to ring\n"
	    "                        doorbells themselves (every register, every queue)\n"
	    "  --relay-spin-us N     the poller spins N us after the last work, then sleeps until\n"
	    "                        a client wakes it (default 50)\n"
	    "  --vfs N               SR-IOV: enable N VFs and give each client that asks one of\n"
	    "                        its own, with the namespaces its whole-namespace grants name\n"
	    "                        (vfio only; vfio-pci loaded with enable_sriov=1)\n"
	    "  --dry-run             print what the options say, serve nothing\n"
	    "  -h, --help            this text\n"
	    "  --version             the upcie version this tool was built from\n"
	    "Exit status: 0 after a clean stop, 1 a controller could not be opened or served,\n"
	    "2 usage.\n",
	    UPCIE_SERVED_MAX_QP, UPCIE_SERVED_MAX_GRANTS);
}

enum {
	SRV_O_DIR = 256,
	SRV_O_SOCKET,
	SRV_O_PATH,
	SRV_O_BIND,
	SRV_O_BIND_ANY_CLASS,
	SRV_O_MODE,
	SRV_O_GROUP,
	SRV_O_ALLOW_UID,
	SRV_O_MAX_CLIENTS,
	SRV_O_MAX_QP,
	SRV_O_MAX_MEM,
	SRV_O_MAX_BYTES,
	SRV_O_MAX_DEPTH,
	SRV_O_DIRECT_DB,
	SRV_O_TRUST,
	SRV_O_GRANT,
	SRV_O_UID_CLIENTS,
	SRV_O_UID_QP,
	SRV_O_UID_BYTES,
	SRV_O_QP_RESERVE,
	SRV_O_HELLO_TO,
	SRV_O_RELAY_SPIN,
	SRV_O_VFS,
	SRV_O_DRY_RUN,
	SRV_O_VERSION,
};

static const struct option served_long_opts[] = {
	{ "dir", required_argument, NULL, SRV_O_DIR },
	{ "socket", required_argument, NULL, SRV_O_SOCKET },
	{ "path", required_argument, NULL, SRV_O_PATH },
	{ "bind", no_argument, NULL, SRV_O_BIND },
	{ "bind-any-class", no_argument, NULL, SRV_O_BIND_ANY_CLASS },
	{ "mode", required_argument, NULL, SRV_O_MODE },
	{ "group", required_argument, NULL, SRV_O_GROUP },
	{ "allow-uid", required_argument, NULL, SRV_O_ALLOW_UID },
	{ "max-clients", required_argument, NULL, SRV_O_MAX_CLIENTS },
	{ "max-qp", required_argument, NULL, SRV_O_MAX_QP },
	{ "max-mem", required_argument, NULL, SRV_O_MAX_MEM },
	{ "max-bytes", required_argument, NULL, SRV_O_MAX_BYTES },
	{ "max-depth", required_argument, NULL, SRV_O_MAX_DEPTH },
	{ "trusted-whole-device", no_argument, NULL, SRV_O_DIRECT_DB },
	{ "trust", required_argument, NULL, SRV_O_TRUST },
	{ "grant", required_argument, NULL, SRV_O_GRANT },
	{ "uid-max-clients", required_argument, NULL, SRV_O_UID_CLIENTS },
	{ "uid-max-qp", required_argument, NULL, SRV_O_UID_QP },
	{ "uid-max-bytes", required_argument, NULL, SRV_O_UID_BYTES },
	{ "qp-reserve", required_argument, NULL, SRV_O_QP_RESERVE },
	{ "hello-timeout-ms", required_argument, NULL, SRV_O_HELLO_TO },
	{ "relay-spin-us", required_argument, NULL, SRV_O_RELAY_SPIN },
	{ "vfs", required_argument, NULL, SRV_O_VFS },
	{ "dry-run", no_argument, NULL, SRV_O_DRY_RUN },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, SRV_O_VERSION },
	{ NULL, 0, NULL, 0 },
};

/* WHO:NSID[:SLBA+NLB][:ro] into *g. Returns 0 or -EINVAL. */
static int served_grant_parse(const char *v, struct upcie_served_grant *g)
{
	char buf[256], *who, *rest, *f;
	uint64_t x;

	if (strlen(v) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, v);
	memset(g, 0, sizeof(*g));
	g->uid = -1;
	g->gid = -1;
	g->access = UPCIE_SERVED_READ | UPCIE_SERVED_WRITE;
	who = buf;
	rest = strchr(buf, ':');
	if (!rest)
		return -EINVAL;
	*rest++ = 0;
	if (*who == '@') {
		gid_t gid;

		if (opt_gid(who + 1, &gid))
			return -EINVAL;
		g->gid = (long)gid;
	} else if (strcmp(who, "*")) {
		uid_t uid;

		if (opt_uid(who, &uid))
			return -EINVAL;
		g->uid = (long)uid;
	}
	f = strchr(rest, ':');
	if (f)
		*f++ = 0;
	if (opt_u64_range(rest, 1, 0xfffffffe, &x))
		return -EINVAL;
	g->nsid = (uint32_t)x;
	while (f && *f) {
		char *next = strchr(f, ':'), *plus;

		if (next)
			*next++ = 0;
		plus = strchr(f, '+');
		if (!strcmp(f, "ro")) {
			g->access = UPCIE_SERVED_READ;
		} else if (plus) {
			*plus++ = 0;
			if (opt_u64(f, &g->slba) || opt_u64_range(plus, 1, UINT64_MAX, &g->nlb) ||
			    g->slba > UINT64_MAX - g->nlb)
				return -EINVAL;
		} else {
			return -EINVAL;
		}
		f = next;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static struct served_one one[SERVED_MAX_CTRL];
	static struct upcie_served_grant grants[UPCIE_SERVED_MAX_GRANTS];
	enum upcie_nvme_path path = UPCIE_NVME_PATH_AUTO;
	const char *dir = "/run/upcie", *sock = NULL, *path_name = "auto", *bdfs = NULL;
	struct upcie_served_opts so;
	unsigned n = 0, failed = 0;
	struct sigaction sa;
	bool bind = false, bind_any_class = false, dry_run = false;
	char *list, *tok, *save = NULL;
	int c;

	opt_tool = "upcie-served";
	memset(&so, 0, sizeof(so));
	so.gid = (gid_t)-1;
	so.allow_uid = -1;
	argv[0] = (char *)opt_tool; /* getopt's own messages name the tool */
	while ((c = getopt_long(argc, argv, "h", served_long_opts, NULL)) != -1) {
		const char *v = optarg;
		uint64_t x;
		unsigned mode = 0;
		gid_t gid;
		uid_t uid;

		switch (c) {
		case SRV_O_DIR:
			if (!*v)
				return opt_bad("--dir", v, "a directory");
			dir = v;
			break;
		case SRV_O_SOCKET:
			if (!*v)
				return opt_bad("--socket", v, "a socket path");
			sock = v;
			break;
		case SRV_O_PATH:
			if (upcie_nvme_path_parse(v, &path))
				return opt_bad("--path", v, "auto, uio, type1 or iommufd");
			path_name = v;
			break;
		case SRV_O_BIND:
			bind = true;
			break;
		case SRV_O_BIND_ANY_CLASS:
			bind_any_class = true;
			break;
		case SRV_O_MODE:
			if (opt_mode(v, &mode) || mode > 0777)
				return opt_bad("--mode", v, "octal permissions 0..777, e.g. 660");
			so.mode = (mode_t)mode;
			break;
		case SRV_O_GROUP:
			if (opt_gid(v, &gid))
				return opt_bad("--group", v, "an existing group name or a gid");
			so.gid = gid;
			break;
		case SRV_O_ALLOW_UID:
			if (opt_uid(v, &uid))
				return opt_bad("--allow-uid", v, "an existing user name or a uid");
			so.allow_uid = (long)uid;
			break;
		case SRV_O_MAX_CLIENTS:
			if (opt_u64_range(v, 1, 4096, &x))
				return opt_bad("--max-clients", v, "a count 1..4096");
			so.max_clients = (uint32_t)x;
			break;
		case SRV_O_MAX_QP:
			if (opt_u64_range(v, 1, UPCIE_SERVED_MAX_QP, &x)) {
				char want[32];

				snprintf(want, sizeof(want), "a count 1..%u", UPCIE_SERVED_MAX_QP);
				return opt_bad("--max-qp", v, want);
			}
			so.max_qp = (uint32_t)x;
			break;
		case SRV_O_MAX_MEM:
			if (opt_u64_range(v, 1, 1024, &x))
				return opt_bad("--max-mem", v, "a count 1..1024");
			so.max_mem = (uint32_t)x;
			break;
		case SRV_O_MAX_BYTES:
			if (opt_size(v, &x) || !x)
				return opt_bad("--max-bytes", v,
					       "a size such as 1G, 512MiB, 65536");
			so.max_bytes = x;
			break;
		case SRV_O_MAX_DEPTH:
			if (opt_u64_range(v, 2, 65536, &x))
				return opt_bad("--max-depth", v, "a queue depth 2..65536");
			so.max_depth = (uint32_t)x;
			break;
		case SRV_O_DIRECT_DB:
			so.direct_whole_device = true;
			break;
		case SRV_O_TRUST:
			if (!strcmp(v, "owner"))
				so.trust = UPCIE_SERVED_TRUST_OWNER;
			else if (!strcmp(v, "none"))
				so.trust = UPCIE_SERVED_TRUST_NONE;
			else if (!strcmp(v, "all"))
				so.trust = UPCIE_SERVED_TRUST_ALL;
			else
				return opt_bad("--trust", v, "owner, none or all");
			break;
		case SRV_O_GRANT:
			if (so.ngrants == UPCIE_SERVED_MAX_GRANTS ||
			    served_grant_parse(v, &grants[so.ngrants]))
				return opt_bad("--grant", v,
					       "WHO:NSID[:SLBA+NLB][:ro], WHO a user, @group or *, "
					       "at most 64");
			so.ngrants++;
			so.grants = grants;
			break;
		case SRV_O_UID_CLIENTS:
			if (opt_u64_range(v, 1, 4096, &x))
				return opt_bad("--uid-max-clients", v, "a count 1..4096");
			so.uid_max_clients = (uint32_t)x;
			break;
		case SRV_O_UID_QP:
			if (opt_u64_range(v, 1, 65535, &x))
				return opt_bad("--uid-max-qp", v, "a count 1..65535");
			so.uid_max_qp = (uint32_t)x;
			break;
		case SRV_O_UID_BYTES:
			if (opt_size(v, &x) || !x)
				return opt_bad("--uid-max-bytes", v, "a size such as 4G");
			so.uid_max_bytes = x;
			break;
		case SRV_O_QP_RESERVE:
			if (opt_u64_range(v, 1, 65535, &x))
				return opt_bad("--qp-reserve", v, "a count 1..65535");
			so.qp_reserve = (uint32_t)x;
			break;
		case SRV_O_HELLO_TO:
			if (opt_u64_range(v, 1, 600000, &x))
				return opt_bad("--hello-timeout-ms", v, "milliseconds 1..600000");
			so.hello_timeout_ms = (uint32_t)x;
			break;
		case SRV_O_RELAY_SPIN:
			if (opt_u64_range(v, 1, 10000000, &x))
				return opt_bad("--relay-spin-us", v, "microseconds 1..10000000");
			so.relay_spin_ns = x * 1000;
			break;
		case SRV_O_VFS:
			if (opt_u64_range(v, 1, 255, &x))
				return opt_bad("--vfs", v, "a number of VFs 1..255");
			so.vfs = (uint32_t)x;
			break;
		case SRV_O_DRY_RUN:
			dry_run = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case SRV_O_VERSION:
			return opt_version();
		default:
			return opt_unknown();
		}
	}
	if (optind == argc)
		return opt_usage_error("the controllers to serve (BDF[,BDF...]) are missing");
	if (optind + 1 < argc)
		return opt_bad("argument", argv[optind + 1],
			       "one list of controllers, comma-separated (BDF,BDF)");
	bdfs = argv[optind];
	list = strdup(bdfs);
	for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (n == SERVED_MAX_CTRL || upcie_pci_bdf_parse_quiet_(tok, &one[n].bdf)) {
			int rc =
			    opt_bad("controller", tok,
				    n == SERVED_MAX_CTRL ? "at most 32 controllers"
							 : "a PCI address DDDD:BB:DD.F or BB:DD.F");

			free(list);
			return rc;
		}
		upcie_pci_bdf_format(&one[n].bdf, one[n].name, sizeof(one[n].name));
		n++;
	}
	free(list);
	if (!n)
		return opt_usage_error("no controller to serve");
	if (sock && n > 1)
		return opt_usage_error(
		    "--socket takes a single controller (use --dir for several)");
	if (bind_any_class && !bind)
		return opt_usage_error("--bind-any-class goes with --bind");
	if (dry_run) {
		for (unsigned i = 0; i < n; i++)
			printf("serve %s on %s%s%s%s\n", one[i].name, sock ? sock : dir,
			       sock ? "" : "/", sock ? "" : one[i].name, sock ? "" : ".sock");
		printf("path %s bind %d bind-any-class %d mode %04o group %ld allow-uid %ld "
		       "max-clients %u max-qp %u "
		       "max-mem %u max-bytes %" PRIu64 " max-depth %u trusted-whole-device %d "
		       "trust %s uid-max-clients %u uid-max-qp %u uid-max-bytes %" PRIu64
		       " qp-reserve %u hello-timeout-ms %u relay-spin-us %" PRIu64 " vfs %u\n",
		       path_name, bind, bind_any_class, (unsigned)so.mode,
		       so.gid == (gid_t)-1 ? -1L : (long)so.gid, so.allow_uid, so.max_clients,
		       so.max_qp, so.max_mem, so.max_bytes, so.max_depth, so.direct_whole_device,
		       so.trust == UPCIE_SERVED_TRUST_NONE  ? "none"
		       : so.trust == UPCIE_SERVED_TRUST_ALL ? "all"
							    : "owner",
		       so.uid_max_clients, so.uid_max_qp, so.uid_max_bytes, so.qp_reserve,
		       so.hello_timeout_ms, so.relay_spin_ns / 1000, so.vfs);
		for (unsigned i = 0; i < so.ngrants; i++)
			printf("grant uid %ld gid %ld nsid %u blocks %" PRIu64 "+%" PRIu64 " %s\n",
			       grants[i].uid, grants[i].gid, grants[i].nsid, grants[i].slba,
			       grants[i].nlb, grants[i].access & UPCIE_SERVED_WRITE ? "rw" : "ro");
		return 0;
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
		co.dev.bind_any_class = bind_any_class;
		err = upcie_nvme_ctrl_open(&o->c, &o->bdf, &co);
		if (err) {
			struct upcie_pci_func fn;

			fprintf(stderr, "upcie-served: %s: open failed: %s\n", o->name,
				upcie_errno_name(err));
			if (err == -ENODEV && bind && !bind_any_class &&
			    !upcie_pci_func_read(&o->bdf, &fn) &&
			    fn.class_code != UPCIE_PCI_CLASS_NVME)
				fprintf(stderr,
					"upcie-served: %s: check the address, or add "
					"--bind-any-class to bind a function of another class\n",
					o->name);
			failed++;
			break;
		}
		o->open = true;
		if (so.vfs) {
			err = served_vf_primary(o, &co);
			if (err) {
				fprintf(stderr, "upcie-served: %s: VFs: %s\n", o->name,
					upcie_errno_name(err));
				failed++;
				break;
			}
		}
		/* MSI-X vectors for isolated queues (vfio): the poller sleeps on their completions
		 * instead of spinning (fewer where the function has fewer; none on uio) */
		for (unsigned v = 0; o->c.dev.path != UPCIE_NVME_PATH_UIO && v < 3; v++) {
			static const uint32_t nvec[3] = { 65, 17, 5 };

			if (!upcie_nvme_dev_irq_enable(&o->c.dev, nvec[v], &o->c.irqs))
				break;
		}
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
		       " dropped=%" PRIu64 " timeouts=%" PRIu64 " iso_ok=%" PRIu64
		       " iso_bad=%" PRIu64 " faults=%" PRIu64 " naps=%" PRIu64 " nap_us=%" PRIu64
		       " sleeps=%" PRIu64 " woken=%" PRIu64 " sleep_timeouts=%" PRIu64
		       " irqs=%" PRIu64 " vf_given=%" PRIu64 " vf_back=%" PRIu64 "\n",
		       o->name, st.clients, st.refused, st.gone, st.qp_made, st.qp_gone, st.qp_lost,
		       st.kept, st.bad, st.resets, st.relayed, st.dropped, st.timeouts, st.iso_ok,
		       st.iso_bad, st.faults, st.naps, st.nap_us, st.sleeps, st.woken,
		       st.sleep_timeouts, st.irqs, st.vf_given, st.vf_back);
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
