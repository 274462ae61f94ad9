/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * upcie-setup: prepare a machine for user-space PCIe drivers, using only upcie's headers.
 *
 *   upcie-setup list [--nvme] [--json]       PCI functions: class, driver, NVMe controller and
 *                                            namespaces, model, serial, firmware, NUMA node,
 *                                            IOMMU group and domain type
 *   upcie-setup bind BDF DRIVER [--force] [--any-class] [--dry-run]
 *   upcie-setup bind --all DRIVER [--allow LIST] [--block LIST] [--force] [--dry-run]
 *   upcie-setup unbind BDF [--force] [--dry-run]
 *   upcie-setup reset [BDF...|--all] [--dry-run]   back to the driver each had before
 *   upcie-setup hugepages [show]             reserved/free hugepages per size and node
 *   upcie-setup hugepages reserve N [--size 2M|2MiB|1G|1GiB] [--node N]
 *   upcie-setup doctor [--json]              can this machine do what upcie does? (verdicts)
 *
 * bind and unbind write down the driver a function had before upcie-setup first took it (in
 * $UPCIE_SETUP_STATE, default /run/upcie/setup-drivers: /run is emptied at boot, when every
 * function is back with its kernel driver anyway); reset gives each function back to it.
 * bind --all takes every NVMe controller that is not in use, filtered like SPDK's setup.sh:
 * PCI_ALLOWED (only these) and PCI_BLOCKED (never these), whitespace- or comma-separated BDFs,
 * or --allow / --block.
 *
 * Exit status 0 on success, 1 on failure (the message says why), 2 on a usage error; doctor:
 * 0 some path is ready, 1 a check failed, 3 nothing can run here.
 */
#include <upcie/base/feature.h>

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/base/sysfs.h>
#include <upcie/mem/hugepage.h>
#include <upcie/pci/driver.h>
#include <upcie/pci/func.h>
#include <upcie/pci/inuse.h>

#include "opt.h"
#include "upcie-doctor.h"

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: upcie-setup COMMAND [ARGS]\n"
	    "\n"
	    "  list [--nvme] [--json]            PCI functions: class, driver, NVMe controller "
	    "and\n"
	    "                                    namespaces, model, serial, firmware, IOMMU group\n"
	    "                                    and domain (uio needs none or identity), node\n"
	    "  bind BDF DRIVER [--force] [--any-class] [--dry-run]\n"
	    "                                    bind a function (nvme, uio_pci_generic, "
	    "vfio-pci, ...);\n"
	    "                                    loads the driver's module when needed; NVMe\n"
	    "                                    controllers only unless --any-class\n"
	    "  bind --all DRIVER [--allow LIST] [--block LIST] [--force] [--dry-run]\n"
	    "                                    every NVMe controller not in use (PCI_ALLOWED,\n"
	    "                                    PCI_BLOCKED filter it, as in SPDK's setup.sh)\n"
	    "  unbind BDF [--force] [--dry-run]  release a function from its driver\n"
	    "  reset [BDF...|--all] [--dry-run]  give functions back to the driver they had\n"
	    "                                    before upcie-setup took them (default --all)\n"
	    "  hugepages [show]                  reserved and free hugepages\n"
	    "  hugepages reserve N [--size 2M|2MiB|1G|1GiB] [--node NODE]\n"
	    "                                    reserve N hugepages (default 2 MiB, all nodes)\n"
	    "  doctor [--json]                   one verdict per path (uio, vfio type1, vfio\n"
	    "                                    cdev + iommufd, GPU P2P, GPU-issued queues,\n"
	    "                                    io_uring dma-buf) with the deciding fact and the\n"
	    "                                    fix, then the checks behind them\n"
	    "  -h, --help, help                  this text\n"
	    "  --version                         the upcie version this tool was built from\n"
	    "\n"
	    "BDF is DDDD:BB:DD.F or BB:DD.F. Binding and reserving need root.\n"
	    "bind and unbind refuse a function the system uses (mounted filesystems, swap,\n"
	    "md/LVM/dm members, network interfaces with addresses or the default route, the\n"
	    "same in its IOMMU group); --force or UPCIE_ALLOW_IN_USE=1 overrides.\n"
	    "Exit status: 0 done, 1 failed, 2 usage; doctor: 0 a path is ready, 1 a check\n"
	    "failed, 3 nothing can run here. Set UPCIE_LOG=debug for more detail.\n");
}

static const char *class_name(uint32_t cls)
{
	switch (cls >> 8) {
	case 0x0108:
		return "NVMe";
	case 0x0106:
		return "SATA";
	case 0x0200:
		return "Ethernet";
	case 0x0300:
		return "VGA";
	case 0x0302:
		return "3D controller";
	case 0x0500:
		return "RAM";
	case 0x0600:
		return "host bridge";
	case 0x0601:
		return "ISA bridge";
	case 0x0604:
		return "PCI bridge";
	case 0x0c03:
		return "USB";
	case 0x0c05:
		return "SMBus";
	default:
		return "";
	}
}

static int run_modprobe(const char *module)
{
	int status;
	pid_t pid = fork();

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		execlp("modprobe", "modprobe", module, (char *)NULL);
		_exit(127);
	}
	if (waitpid(pid, &status, 0) < 0)
		return -errno;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return -ENOENT;
	return 0;
}

/* Taking a function from its driver: refuse while the system uses it (pci/inuse.h). */
static int guard_in_use(const struct upcie_pci_bdf *bdf, const char *target, bool force)
{
	char cur[64], action[96];

	if (upcie_pci_driver_get(bdf, cur, sizeof(cur)))
		return 1;
	if (!cur[0] || (target && !strcmp(cur, target)))
		return 0; /* nothing to take it from */
	if (target)
		snprintf(action, sizeof(action), "take it from %s and bind it to %s", cur, target);
	else
		snprintf(action, sizeof(action), "unbind it from %s", cur);
	return upcie_pci_inuse_refuse(bdf, force, action) ? 1 : 0;
}

static int show_hugepages(void)
{
	static const uint64_t sizes[] = { 2048, 1048576 };
	int shown = 0;

	printf("%-6s %-6s %8s %8s\n", "SIZE", "NODE", "TOTAL", "FREE");
	/* Probe sizes and nodes quietly: absent ones are simply not listed. */
	int level = upcie_log_level();

	upcie_log_set_level(UPCIE_LOG_NONE);
	for (unsigned s = 0; s < 2; s++) {
		for (int node = -1; node < 256; node++) {
			uint64_t total, nfree;
			char nodestr[16] = "all";
			int err = upcie_hugepages_get(sizes[s], node, &total, &nfree);

			if (err)
				continue;
			if (node >= 0)
				snprintf(nodestr, sizeof(nodestr), "%d", node);
			printf("%-6s %-6s %8llu %8llu\n", sizes[s] == 2048 ? "2M" : "1G", nodestr,
			       (unsigned long long)total, (unsigned long long)nfree);
			shown++;
		}
	}
	upcie_log_set_level((enum upcie_log_level)level);
	if (!shown) {
		fprintf(stderr, "upcie-setup: no hugepage sizes found in sysfs\n");
		return 1;
	}
	return 0;
}

/* ---- options of one command ------------------------------------------------------------ */

/*
 * getopt_long over a command's own arguments (argv[0] is the command's name): messages say
 * "upcie-setup bind: ...". GNU getopt permutes, so options may follow the operands
 * ("hugepages reserve 10 --size 1G").
 */
static int sub_getopt(int argc, char **argv, const char *name, const struct option *lo)
{
	static char prog[64];

	if (!prog[0]) { /* the first call: one command per run */
		snprintf(prog, sizeof(prog), "upcie-setup %s", name);
		argv[0] = prog;
		optind = 0;
	}
	return getopt_long(argc, argv, "h", lo, NULL);
}

/* ---- functions: class, NVMe identity ---------------------------------------------------- */

struct setup_nvme {
	char ctrl[32]; /* nvme0 */
	char ns[192];  /* nvme0n1 nvme0n2 */
	char model[64], serial[32], fw[16];
};

static void setup_trim_(char *s)
{
	size_t n = strlen(s);

	while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t'))
		s[--n] = '\0';
	while (*s == ' ')
		memmove(s, s + 1, strlen(s));
}

static int setup_ns_cmp_(const void *a, const void *b)
{
	return strcmp((const char *)a, (const char *)b);
}

/*
 * The kernel nvme driver's view of function fn, when it has one: its controller (nvme/<ctrl>)
 * with model, serial, firmware_rev, and its namespaces' block devices. A multipath path entry
 * nvme<S>c<C>n<N> names the head the system shows, nvme<S>n<N>. 0, or -ENOENT (no nvme driver
 * on it).
 */
static int setup_nvme_info(const struct upcie_pci_func *fn, struct setup_nvme *nv)
{
	char dir[PATH_MAX], p[PATH_MAX], names[16][24];
	struct dirent *de;
	unsigned nn = 0;
	DIR *d;

	memset(nv, 0, sizeof(*nv));
	if (upcie_pci_func_path(&fn->bdf, "nvme", dir, sizeof(dir)))
		return -ENOENT;
	d = opendir(dir);
	if (!d)
		return -ENOENT;
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, "nvme", 4) && de->d_name[4] >= '0' && de->d_name[4] <= '9')
			(void)upcie_path_fmt(nv->ctrl, sizeof(nv->ctrl), "%s", de->d_name);
	closedir(d);
	if (!nv->ctrl[0])
		return -ENOENT;
	(void)upcie_path_fmt(p, sizeof(p), "%s/%s/model", dir, nv->ctrl);
	if (upcie_file_read_str(p, nv->model, sizeof(nv->model)) < 0)
		nv->model[0] = '\0';
	(void)upcie_path_fmt(p, sizeof(p), "%s/%s/serial", dir, nv->ctrl);
	if (upcie_file_read_str(p, nv->serial, sizeof(nv->serial)) < 0)
		nv->serial[0] = '\0';
	(void)upcie_path_fmt(p, sizeof(p), "%s/%s/firmware_rev", dir, nv->ctrl);
	if (upcie_file_read_str(p, nv->fw, sizeof(nv->fw)) < 0)
		nv->fw[0] = '\0';
	setup_trim_(nv->model);
	setup_trim_(nv->serial);
	setup_trim_(nv->fw);
	(void)upcie_path_fmt(p, sizeof(p), "%s/%s", dir, nv->ctrl);
	d = opendir(p);
	while (d && (de = readdir(d)) && nn < 16) {
		unsigned s, c, n;
		char tail;

		if (sscanf(de->d_name, "nvme%uc%un%u%c", &s, &c, &n, &tail) == 3)
			snprintf(names[nn++], sizeof(names[0]), "nvme%un%u", s, n);
		else if (sscanf(de->d_name, "nvme%un%u%c", &s, &n, &tail) == 2)
			snprintf(names[nn++], sizeof(names[0]), "nvme%un%u", s, n);
	}
	if (d)
		closedir(d);
	qsort(names, nn, sizeof(names[0]), setup_ns_cmp_);
	for (unsigned i = 0; i < nn; i++) {
		size_t o = strlen(nv->ns);

		snprintf(nv->ns + o, sizeof(nv->ns) - o, "%s%s", i ? " " : "", names[i]);
	}
	return 0;
}

/* The IOMMU domain type of fn's group as list shows it: none, noiommu, DMA, identity, ... */
static void setup_iommu_type(const struct upcie_pci_func *fn, char *type, size_t len)
{
	enum upcie_pci_iommu mode = UPCIE_PCI_IOMMU_NONE;

	if (upcie_pci_func_iommu(&fn->bdf, &mode, NULL, type, len))
		snprintf(type, len, "?");
	else if (mode == UPCIE_PCI_IOMMU_NONE)
		snprintf(type, len, "none");
	else if (mode == UPCIE_PCI_IOMMU_VFIO_NOIOMMU)
		snprintf(type, len, "noiommu");
}

/* ---- list ----------------------------------------------------------------------------- */

struct setup_list {
	bool only_nvme, json;
	unsigned n;
};

static void json_str(const char *s)
{
	upcie_doctor_json_str_(stdout, s);
}

static int list_one(const struct upcie_pci_func *fn, void *ctx)
{
	struct setup_list *l = (struct setup_list *)ctx;
	char grp[16] = "-", node[16] = "-", type[UPCIE_PCI_IOMMU_TYPE_LEN] = "none", cls[8];
	struct setup_nvme nv;
	bool has_nv;

	if (l->only_nvme && fn->class_code != UPCIE_PCI_CLASS_NVME)
		return 0;
	if (fn->iommu_group >= 0)
		snprintf(grp, sizeof(grp), "%d", fn->iommu_group);
	if (fn->numa_node >= 0)
		snprintf(node, sizeof(node), "%d", fn->numa_node);
	/* the IOMMU domain says which paths can work: uio needs none or identity */
	setup_iommu_type(fn, type, sizeof(type));
	has_nv = setup_nvme_info(fn, &nv) == 0;
	snprintf(cls, sizeof(cls), "%06x", fn->class_code);
	if (l->json) {
		printf("%s\n  {\"bdf\": \"%s\", \"vendor\": \"%04x\", \"device\": \"%04x\", "
		       "\"class\": \"%s\", \"class_name\": ",
		       l->n ? "," : "", fn->name, fn->vendor, fn->device, cls);
		json_str(class_name(fn->class_code));
		printf(", \"driver\": ");
		if (fn->driver[0])
			json_str(fn->driver);
		else
			printf("null");
		printf(", \"iommu_group\": %d, \"iommu_type\": ", fn->iommu_group);
		json_str(type);
		printf(", \"numa_node\": %d, \"nvme\": ", fn->numa_node);
		if (has_nv) {
			printf("{\"controller\": ");
			json_str(nv.ctrl);
			printf(", \"namespaces\": [");
			for (char *t = nv.ns, *e; *t; t = e) {
				char one[24];

				e = strchr(t, ' ');
				if (!e)
					e = t + strlen(t);
				snprintf(one, sizeof(one), "%.*s", (int)(e - t), t);
				printf("%s", t == nv.ns ? "" : ", ");
				json_str(one);
				if (*e)
					e++;
			}
			printf("], \"model\": ");
			json_str(nv.model);
			printf(", \"serial\": ");
			json_str(nv.serial);
			printf(", \"firmware\": ");
			json_str(nv.fw);
			printf("}");
		} else {
			printf("null");
		}
		printf("}");
	} else {
		printf("%-13s %04x:%04x  %s %-14s %-6s %-9s %-5s %-16s", fn->name, fn->vendor,
		       fn->device, cls, class_name(fn->class_code), grp, type, node,
		       fn->driver[0] ? fn->driver : "-");
		if (has_nv)
			printf(" %s (%s) \"%s\" sn %s fw %s", nv.ctrl,
			       nv.ns[0] ? nv.ns : "no namespace", nv.model,
			       nv.serial[0] ? nv.serial : "?", nv.fw[0] ? nv.fw : "?");
		printf("\n");
	}
	l->n++;
	return 0;
}

static int cmd_list(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "nvme", no_argument, NULL, 'n' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct setup_list l;
	int c, err;

	memset(&l, 0, sizeof(l));
	while ((c = sub_getopt(argc, argv, "list", lo)) != -1) {
		if (c == 'n')
			l.only_nvme = true;
		else if (c == 'j')
			l.json = true;
		else if (c == 'h')
			return usage(stdout), 0;
		else
			return opt_unknown();
	}
	if (optind < argc)
		return opt_bad("list", argv[optind], "no operands (--nvme, --json)");
	if (l.json)
		printf("{\"schema\": 1, \"functions\": [");
	else
		printf("%-13s %-9s  %-6s %-14s %-6s %-9s %-5s %-16s %s\n", "BDF", "ID", "CLASS", "",
		       "GROUP", "IOMMU", "NODE", "DRIVER", "NVME");
	err = upcie_pci_scan(list_one, &l);
	if (l.json)
		printf("\n]}\n");
	if (err) {
		fprintf(stderr, "upcie-setup: list: %s\n", strerror(-err));
		return 1;
	}
	return 0;
}

/* ---- the drivers functions had before --------------------------------------------------- */

#define SETUP_STATE_MAX 256

struct setup_state {
	char bdf[SETUP_STATE_MAX][UPCIE_PCI_BDF_STRLEN];
	char drv[SETUP_STATE_MAX][64]; /* "-": none */
	unsigned n;
};

static const char *setup_state_path(void)
{
	const char *e = getenv("UPCIE_SETUP_STATE");

	return e && *e ? e : "/run/upcie/setup-drivers";
}

static int setup_state_load(struct setup_state *st)
{
	char line[160];
	FILE *f;

	memset(st, 0, sizeof(*st));
	f = fopen(setup_state_path(), "re");
	if (!f)
		return errno == ENOENT ? 0 : -errno;
	while (fgets(line, sizeof(line), f) && st->n < SETUP_STATE_MAX) {
		struct upcie_pci_bdf b;
		char bdf[32], drv[64];

		if (sscanf(line, "%31s %63s", bdf, drv) != 2 || upcie_pci_bdf_parse_quiet_(bdf, &b))
			continue;
		upcie_pci_bdf_format(&b, st->bdf[st->n], sizeof(st->bdf[0]));
		snprintf(st->drv[st->n], sizeof(st->drv[0]), "%s", drv);
		st->n++;
	}
	fclose(f);
	return 0;
}

static int setup_state_save(const struct setup_state *st)
{
	char tmp[PATH_MAX + 8], dir[PATH_MAX], *slash;
	const char *path = setup_state_path();
	FILE *f;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = '\0';
		if (mkdir(dir, 0755) && errno != EEXIST)
			return -errno;
	}
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "we");
	if (!f)
		return -errno;
	fprintf(f, "# upcie-setup: the driver each function had before it took them (- none)\n");
	for (unsigned i = 0; i < st->n; i++)
		fprintf(f, "%s %s\n", st->bdf[i], st->drv[i]);
	if (fclose(f))
		return -errno;
	return rename(tmp, path) ? -errno : 0;
}

static int setup_state_find(const struct setup_state *st, const char *bdf)
{
	for (unsigned i = 0; i < st->n; i++)
		if (!strcmp(st->bdf[i], bdf))
			return (int)i;
	return -1;
}

/* Write down that `bdf` had `drv` ("" none), unless an earlier record already says. */
static void setup_remember(const char *bdf, const char *drv)
{
	struct setup_state st;
	int err = setup_state_load(&st);

	if (!err && setup_state_find(&st, bdf) < 0 && st.n < SETUP_STATE_MAX) {
		snprintf(st.bdf[st.n], sizeof(st.bdf[0]), "%s", bdf);
		snprintf(st.drv[st.n], sizeof(st.drv[0]), "%s", drv[0] ? drv : "-");
		st.n++;
		err = setup_state_save(&st);
	}
	if (err)
		fprintf(
		    stderr,
		    "upcie-setup: warning: cannot write down %s's driver in %s (%s): reset will "
		    "not know it\n",
		    bdf, setup_state_path(), strerror(-err));
}

/* Forget bdf's record (it is back with the driver it had). */
static void setup_forget(const char *bdf)
{
	struct setup_state st;
	int i;

	if (setup_state_load(&st) || (i = setup_state_find(&st, bdf)) < 0)
		return;
	st.n--;
	memmove(st.bdf[i], st.bdf[i + 1], (st.n - (unsigned)i) * sizeof(st.bdf[0]));
	memmove(st.drv[i], st.drv[i + 1], (st.n - (unsigned)i) * sizeof(st.drv[0]));
	(void)setup_state_save(&st);
}

static bool setup_original_is(const char *bdf, const char *drv)
{
	struct setup_state st;
	int i;

	if (setup_state_load(&st) || (i = setup_state_find(&st, bdf)) < 0)
		return false;
	return !strcmp(st.drv[i], drv[0] ? drv : "-");
}

/* ---- bind, unbind, reset ------------------------------------------------------------------ */

/* Load a driver's module when the driver is not registered yet. */
static int setup_load_driver(const char *driver)
{
	char module[64];
	size_t i;
	int err, level = upcie_log_level();

	upcie_log_set_level(UPCIE_LOG_NONE);
	err = upcie_pci_driver_loaded(driver);
	upcie_log_set_level((enum upcie_log_level)level);
	if (err != -ENOENT)
		return err;
	for (i = 0; driver[i] && i + 1 < sizeof(module); i++)
		module[i] = driver[i] == '-' ? '_' : driver[i];
	module[i] = '\0';
	if (run_modprobe(module)) {
		fprintf(stderr, "upcie-setup: driver '%s' is not loaded and 'modprobe %s' failed\n",
			driver, module);
		return -ENOENT;
	}
	return 0;
}

struct setup_bind_opts {
	bool force, any_class, dry_run, all;
};

/*
 * Bind fn to `driver` (`driver` "" unbinds): the class check, the in-use guard, the record of
 * the driver it had. 0 done (or nothing to do), 1 failed or refused.
 */
static int setup_move(const struct upcie_pci_func *fn, const char *driver,
		      const struct setup_bind_opts *o)
{
	char cur[64];

	if (upcie_pci_driver_get(&fn->bdf, cur, sizeof(cur)))
		return 1;
	if (driver[0] && fn->class_code != UPCIE_PCI_CLASS_NVME && !o->any_class) {
		fprintf(stderr,
			"upcie-setup: %s is %s%s(class %06x), not an NVMe controller (010802): "
			"refusing to bind it to %s; --any-class binds it anyway\n",
			fn->name, class_name(fn->class_code)[0] ? "a " : "a function ",
			class_name(fn->class_code)[0] ? class_name(fn->class_code) : "",
			fn->class_code, driver);
		return 1;
	}
	if (!strcmp(cur, driver)) {
		printf("%s: already %s%s\n", fn->name, driver[0] ? "bound to " : "without a driver",
		       driver);
		if (!o->dry_run && setup_original_is(fn->name, driver))
			setup_forget(fn->name); /* back where it was: nothing left to reset */
		return 0;
	}
	if (guard_in_use(&fn->bdf, driver[0] ? driver : NULL, o->force))
		return 1;
	if (o->dry_run) {
		printf("%s: would %s%s%s%s\n", fn->name, cur[0] ? "take it from " : "", cur,
		       driver[0] ? (cur[0] ? " and bind it to " : "bind it to ") : " (unbind)",
		       driver);
		return 0;
	}
	if (driver[0] && setup_load_driver(driver))
		return 1;
	if (driver[0] ? upcie_pci_driver_bind(&fn->bdf, driver) : upcie_pci_driver_unbind(&fn->bdf))
		return 1;
	if (setup_original_is(fn->name, driver))
		setup_forget(fn->name);
	else
		setup_remember(fn->name, cur);
	if (driver[0])
		printf("%s bound to %s (was %s)\n", fn->name, driver, cur[0] ? cur : "no driver");
	else
		printf("%s unbound (was %s)\n", fn->name, cur);
	return 0;
}

static int setup_func_of(const char *arg, struct upcie_pci_func *fn)
{
	struct upcie_pci_bdf bdf;

	if (upcie_pci_bdf_parse_quiet_(arg, &bdf))
		return opt_bad("BDF", arg, "a PCI address DDDD:BB:DD.F or BB:DD.F");
	if (upcie_pci_func_exists(&bdf) || upcie_pci_func_read(&bdf, fn))
		return 1;
	return 0;
}

/*
 * A BDF list (PCI_ALLOWED, PCI_BLOCKED, --allow, --block): whitespace or commas between
 * addresses. Normalised names into `out`; 0, or 2 after a message naming `what`.
 */
static int setup_bdf_list(const char *what, const char *s, char out[][UPCIE_PCI_BDF_STRLEN],
			  unsigned max, unsigned *n)
{
	char buf[4096], *tok, *save = NULL;

	*n = 0;
	if (!s)
		return 0;
	snprintf(buf, sizeof(buf), "%s", s);
	for (tok = strtok_r(buf, " \t\n,", &save); tok; tok = strtok_r(NULL, " \t\n,", &save)) {
		struct upcie_pci_bdf b;

		if (*n == max || upcie_pci_bdf_parse_quiet_(tok, &b))
			return opt_bad(what, tok, "PCI addresses (DDDD:BB:DD.F or BB:DD.F)");
		upcie_pci_bdf_format(&b, out[(*n)++], UPCIE_PCI_BDF_STRLEN);
	}
	return 0;
}

static bool setup_in(char l[][UPCIE_PCI_BDF_STRLEN], unsigned n, const char *bdf)
{
	for (unsigned i = 0; i < n; i++)
		if (!strcmp(l[i], bdf))
			return true;
	return false;
}

#define SETUP_MAX_LIST 128

struct setup_all {
	const char *driver;
	const struct setup_bind_opts *o;
	char allow[SETUP_MAX_LIST][UPCIE_PCI_BDF_STRLEN],
	    block[SETUP_MAX_LIST][UPCIE_PCI_BDF_STRLEN];
	unsigned nallow, nblock, seen, done, skipped, failed;
};

static int setup_all_one(const struct upcie_pci_func *fn, void *ctx)
{
	struct setup_all *a = (struct setup_all *)ctx;
	struct upcie_pci_inuse u;
	char desc[512] = "";

	if (fn->class_code != UPCIE_PCI_CLASS_NVME)
		return 0;
	a->seen++;
	if (a->nallow && !setup_in(a->allow, a->nallow, fn->name)) {
		printf("%s: skipped (not in PCI_ALLOWED/--allow)\n", fn->name);
		a->skipped++;
		return 0;
	}
	if (setup_in(a->block, a->nblock, fn->name)) {
		printf("%s: skipped (in PCI_BLOCKED/--block)\n", fn->name);
		a->skipped++;
		return 0;
	}
	/* in use: skipped, as setup.sh skips active devices; the others still get bound */
	if (!a->o->force && strcmp(fn->driver, a->driver) &&
	    (upcie_pci_inuse_scan(&fn->bdf, true, &u) || u.n || u.unknown)) {
		upcie_pci_inuse_describe(&u, fn->name, desc, sizeof(desc));
		printf("%s: skipped (in use: %s; --force takes it)\n", fn->name,
		       desc[0] ? desc : "unknown");
		a->skipped++;
		return 0;
	}
	if (setup_move(fn, a->driver, a->o))
		a->failed++;
	else
		a->done++;
	return 0;
}

static int cmd_bind(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "force", no_argument, NULL, 'f' },
		{ "any-class", no_argument, NULL, 'a' },
		{ "dry-run", no_argument, NULL, 'n' },
		{ "all", no_argument, NULL, 'A' },
		{ "allow", required_argument, NULL, 'w' },
		{ "block", required_argument, NULL, 'b' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct setup_bind_opts o;
	struct upcie_pci_func fn;
	const char *allow = getenv("PCI_ALLOWED"), *block = getenv("PCI_BLOCKED");
	const char *allow_what = "PCI_ALLOWED", *block_what = "PCI_BLOCKED";
	int c, err;

	memset(&o, 0, sizeof(o));
	while ((c = sub_getopt(argc, argv, "bind", lo)) != -1) {
		switch (c) {
		case 'f':
			o.force = true;
			break;
		case 'a':
			o.any_class = true;
			break;
		case 'n':
			o.dry_run = true;
			break;
		case 'A':
			o.all = true;
			break;
		case 'w':
			allow = optarg, allow_what = "--allow";
			break;
		case 'b':
			block = optarg, block_what = "--block";
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			return opt_unknown();
		}
	}
	argc -= optind, argv += optind;
	if (o.all) {
		struct setup_all *a;

		if (argc != 1)
			return opt_usage_error("bind --all needs DRIVER (and no BDF)");
		if (o.any_class)
			return opt_usage_error("bind --all takes NVMe controllers only: no "
					       "--any-class");
		a = (struct setup_all *)calloc(1, sizeof(*a));
		if (!a)
			return 1;
		a->driver = argv[0], a->o = &o;
		err = setup_bdf_list(allow_what, allow, a->allow, SETUP_MAX_LIST, &a->nallow);
		if (!err)
			err =
			    setup_bdf_list(block_what, block, a->block, SETUP_MAX_LIST, &a->nblock);
		if (err) {
			free(a);
			return err;
		}
		err = upcie_pci_scan(setup_all_one, a);
		if (err)
			fprintf(stderr, "upcie-setup: bind --all: %s\n", strerror(-err));
		else if (!a->seen)
			fprintf(stderr, "upcie-setup: bind --all: no NVMe controller here\n");
		else
			printf("%u of %u NVMe controllers %s %s, %u skipped, %u failed\n", a->done,
			       a->seen, o.dry_run ? "would be on" : "on", a->driver, a->skipped,
			       a->failed);
		c = err || !a->seen || a->failed ? 1 : 0;
		free(a);
		return c;
	}
	if (allow_what[0] == '-' || block_what[0] == '-')
		return opt_usage_error("--allow and --block go with --all");
	if (argc != 2)
		return opt_usage_error("bind needs BDF and DRIVER (or --all DRIVER)");
	if (!argv[1][0] || strchr(argv[1], '/'))
		return opt_bad("DRIVER", argv[1], "a driver name such as vfio-pci");
	err = setup_func_of(argv[0], &fn);
	if (err)
		return err;
	return setup_move(&fn, argv[1], &o);
}

static int cmd_unbind(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "force", no_argument, NULL, 'f' },
		{ "dry-run", no_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct setup_bind_opts o;
	struct upcie_pci_func fn;
	int c, err;

	memset(&o, 0, sizeof(o));
	while ((c = sub_getopt(argc, argv, "unbind", lo)) != -1) {
		if (c == 'f')
			o.force = true;
		else if (c == 'n')
			o.dry_run = true;
		else if (c == 'h')
			return usage(stdout), 0;
		else
			return opt_unknown();
	}
	if (argc - optind != 1)
		return opt_usage_error("unbind needs one BDF");
	err = setup_func_of(argv[optind], &fn);
	if (err)
		return err;
	return setup_move(&fn, "", &o);
}

static int cmd_reset(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "all", no_argument, NULL, 'A' },
		{ "force", no_argument, NULL, 'f' },
		{ "dry-run", no_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct setup_bind_opts o;
	struct setup_state *st;
	bool all = false;
	unsigned failed = 0, done = 0;
	int c, err;

	memset(&o, 0, sizeof(o));
	o.any_class = true; /* what it had before, whatever it is */
	while ((c = sub_getopt(argc, argv, "reset", lo)) != -1) {
		if (c == 'A')
			all = true;
		else if (c == 'f')
			o.force = true;
		else if (c == 'n')
			o.dry_run = true;
		else if (c == 'h')
			return usage(stdout), 0;
		else
			return opt_unknown();
	}
	if (all && optind < argc)
		return opt_usage_error("reset takes BDFs or --all, not both");
	for (int i = optind; i < argc; i++) {
		struct upcie_pci_bdf b;

		if (upcie_pci_bdf_parse_quiet_(argv[i], &b))
			return opt_bad("BDF", argv[i], "a PCI address DDDD:BB:DD.F or BB:DD.F");
	}
	st = (struct setup_state *)malloc(sizeof(*st));
	if (!st)
		return 1;
	err = setup_state_load(st);
	if (err) {
		fprintf(stderr, "upcie-setup: reset: cannot read %s: %s\n", setup_state_path(),
			strerror(-err));
		free(st);
		return 1;
	}
	for (int i = optind; i < argc; i++) {
		struct upcie_pci_bdf b;
		char name[UPCIE_PCI_BDF_STRLEN];

		if (upcie_pci_bdf_parse_quiet_(argv[i], &b)) {
			fprintf(stderr,
				"upcie-setup: reset: '%s' is not a PCI address (DDDD:BB:DD.F or "
				"BB:DD.F)\n",
				argv[i]);
			failed++;
			continue;
		}
		upcie_pci_bdf_format(&b, name, sizeof(name));
		if (setup_state_find(st, name) < 0) {
			fprintf(stderr,
				"upcie-setup: reset: no record of the driver %s had (%s): give it "
				"one with upcie-setup bind %s DRIVER\n",
				name, setup_state_path(), name);
			failed++;
		}
	}
	for (unsigned i = 0; i < st->n; i++) {
		struct upcie_pci_func fn;
		struct upcie_pci_bdf b;
		bool named = optind == argc;

		for (int k = optind; k < argc && !named; k++)
			named = !upcie_pci_bdf_parse_quiet_(argv[k], &b) &&
				upcie_pci_bdf_format(&b, fn.name, sizeof(fn.name)) >= 0 &&
				!strcmp(fn.name, st->bdf[i]);
		if (!named)
			continue;
		(void)upcie_pci_bdf_parse_quiet_(st->bdf[i], &b);
		if (upcie_pci_func_exists(&b) || upcie_pci_func_read(&b, &fn)) {
			failed++;
			continue;
		}
		if (setup_move(&fn, strcmp(st->drv[i], "-") ? st->drv[i] : "", &o))
			failed++;
		else
			done++;
	}
	if (!st->n && !failed)
		printf("nothing to reset: upcie-setup has not moved any function (%s)\n",
		       setup_state_path());
	free(st);
	(void)done;
	return failed ? 1 : 0;
}

/* ---- hugepages -------------------------------------------------------------------------- */

static int cmd_hugepages(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "size", required_argument, NULL, 's' },
		{ "node", required_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	uint64_t bytes = 2ull << 20, count;
	unsigned node_u;
	int node = -1, err, c;

	while ((c = sub_getopt(argc, argv, "hugepages", lo)) != -1) {
		switch (c) {
		case 's':
			if (opt_size(optarg, &bytes) || bytes < 4096 || bytes % 4096)
				return opt_bad("--size", optarg,
					       "a hugepage size such as 2M, 2MiB, 1G, 1GiB");
			break;
		case 'n':
			if (opt_unsigned(optarg, 0, 1023, &node_u))
				return opt_bad("--node", optarg, "a NUMA node number");
			node = (int)node_u;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			return opt_unknown();
		}
	}
	argc -= optind, argv += optind;
	if (argc == 0 || (argc == 1 && !strcmp(argv[0], "show")))
		return show_hugepages();
	if (strcmp(argv[0], "reserve"))
		return opt_bad("hugepages", argv[0], "show, or reserve N");
	if (argc != 2)
		return opt_usage_error("hugepages reserve needs one count N");
	if (opt_u64(argv[1], &count))
		return opt_bad("hugepages reserve", argv[1], "a count of pages, e.g. 512");
	err = upcie_hugepages_reserve(bytes >> 10, node, count);
	if (err) {
		fprintf(stderr,
			"upcie-setup: reserving %" PRIu64 " hugepages of %" PRIu64
			" KiB failed: %s\n",
			count, bytes >> 10, strerror(-err));
		return 1;
	}
	return show_hugepages();
}

/* ---- doctor ------------------------------------------------------------------------------ */

static int cmd_doctor(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct upcie_doctor d;
	bool json = false;
	int c, rc;

	while ((c = sub_getopt(argc, argv, "doctor", lo)) != -1) {
		if (c == 'j')
			json = true;
		else if (c == 'h')
			return usage(stdout), 0;
		else
			return opt_unknown();
	}
	if (optind < argc)
		return opt_bad("doctor", argv[optind], "no operands (--json)");
	memset(&d, 0, sizeof(d));
	upcie_doctor_run(&d);
	upcie_doctor_print(&d, stdout, json);
	rc = upcie_doctor_exit_status(&d);
	upcie_doctor_free(&d);
	return rc;
}

int main(int argc, char **argv)
{
	opt_tool = "upcie-setup";
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version"))
		return opt_version();
	if (!strcmp(argv[1], "list"))
		return cmd_list(argc - 1, argv + 1);
	if (!strcmp(argv[1], "bind"))
		return cmd_bind(argc - 1, argv + 1);
	if (!strcmp(argv[1], "unbind"))
		return cmd_unbind(argc - 1, argv + 1);
	if (!strcmp(argv[1], "reset"))
		return cmd_reset(argc - 1, argv + 1);
	if (!strcmp(argv[1], "hugepages"))
		return cmd_hugepages(argc - 1, argv + 1);
	if (!strcmp(argv[1], "doctor"))
		return cmd_doctor(argc - 1, argv + 1);
	return opt_bad("command", argv[1], "list, bind, unbind, reset, hugepages or doctor");
}
