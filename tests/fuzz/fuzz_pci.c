/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer harness: PCI addresses and what sysfs says about a function (pci/bdf.h, pci/func.h,
 * base/sysfs.h, vfio/cdev.h), with a fake sysfs tree (UPCIE_SYSFS_ROOT) whose files and link
 * names the fuzzer writes.
 *
 * The first byte picks the target:
 *   0  a string as a PCI address: what parses formats back to a string that parses to the same
 *      address, device <= 31 and function <= 7, at most 16 characters.
 *   1  vendor, device, class, revision, numa_node, subsystem ids, resource lines, and the names
 *      the driver and iommu_group links point to, through upcie_pci_func_read(): on success
 *      the driver name is terminated, the IOMMU group is -1 exactly when there is no link and
 *      else the link's decimal number (a link naming anything else fails the read), every
 *      resource [start, start + size) without wrap.
 *   2  one attribute through upcie_file_read_u64() and upcie_file_read_s64().
 *   3  the entries of <bdf>/vfio-dev through upcie_vfio_cdev_find(): what it returns is
 *      "vfio" and digits, and fits the buffer.
 */
#include <upcie/base/sysfs.h>
#include <upcie/pci/bdf.h>
#include <upcie/pci/func.h>
#include <upcie/vfio/cdev.h>

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct fz {
	const uint8_t *p;
	size_t n;
};

static char root[PATH_MAX], fn_dir[PATH_MAX];
static const struct upcie_pci_bdf bdf = { 0, 1, 0, 0 };

static uint8_t take8(struct fz *f)
{
	uint8_t v = 0;

	if (f->n) {
		v = *f->p++;
		f->n--;
	}
	return v;
}

/* A string of up to `max` bytes: a length byte, then that many bytes (NULs end it early). */
static void take_str(struct fz *f, char *out, size_t max)
{
	size_t len = take8(f) % (max + 1), i;

	for (i = 0; i < len && f->n; i++)
		out[i] = (char)take8(f);
	out[i] = '\0';
}

static void die(const char *what)
{
	fprintf(stderr, "fuzz_pci: invariant broken: %s\n", what);
	abort();
}

static void quiet(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)msg;
	(void)ctx;
}

static void put(const char *attr, const char *s)
{
	char path[PATH_MAX * 2];
	FILE *fp;

	snprintf(path, sizeof(path), "%s/%s", fn_dir, attr);
	fp = fopen(path, "w");
	if (!fp)
		die("cannot write the fake tree");
	fputs(s, fp);
	fclose(fp);
}

/* Replace link `attr` by one to ".../<name>" (no link when name is empty). */
static void link_to(const char *attr, const char *dir, const char *name)
{
	char path[PATH_MAX * 2], target[PATH_MAX * 2];

	snprintf(path, sizeof(path), "%s/%s", fn_dir, attr);
	unlink(path);
	if (!*name)
		return;
	snprintf(target, sizeof(target), "../../%s/%s", dir, name);
	if (symlink(target, path))
		die("cannot link in the fake tree");
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *tmp = getenv("TMPDIR");
	char path[PATH_MAX * 2];

	(void)argc;
	(void)argv;
	snprintf(root, sizeof(root), "%s/upcie-fuzz-pci.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(root))
		die("mkdtemp");
	snprintf(path, sizeof(path), "%s/bus", root);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/bus/pci", root);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/bus/pci/devices", root);
	mkdir(path, 0755);
	snprintf(fn_dir, sizeof(fn_dir), "%s/bus/pci/devices/0000:01:00.0", root);
	mkdir(fn_dir, 0755);
	snprintf(path, sizeof(path), "%s/vfio-dev", fn_dir);
	mkdir(path, 0755);
	setenv("UPCIE_SYSFS_ROOT", root, 1);
	upcie_log_set_handler(quiet, NULL);
	return 0;
}

static void t_bdf(struct fz *f)
{
	char s[64], out[UPCIE_PCI_BDF_STRLEN], again[UPCIE_PCI_BDF_STRLEN + 8];
	struct upcie_pci_bdf a, b;
	int n;

	take_str(f, s, sizeof(s) - 1);
	if (upcie_pci_bdf_parse(s, &a))
		return;
	if (a.dev > 31 || a.fn > 7)
		die("bdf: device or function out of range");
	n = upcie_pci_bdf_format(&a, out, sizeof(out));
	if (n < 0 || (size_t)n >= sizeof(out) || strlen(out) != (size_t)n)
		die("bdf: formatting a parsed address failed");
	snprintf(again, sizeof(again), "%s", out);
	if (upcie_pci_bdf_parse(again, &b) || !upcie_pci_bdf_equal(&a, &b) ||
	    upcie_pci_bdf_cmp(&a, &b))
		die("bdf: format and parse do not round-trip");
}

/* Decimal value of s when s is digits only and at most INT_MAX, else -1. */
static long long group_of(const char *s)
{
	long long v = 0;
	size_t i;

	for (i = 0; s[i]; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
		if (v > INT_MAX)
			return -1;
	}
	return i ? v : -1;
}

static void t_func(struct fz *f)
{
	static const char *const attrs[] = { "vendor",		 "device",	     "class",
					     "subsystem_vendor", "subsystem_device", "revision",
					     "numa_node",	 "resource" };
	char v[600], drv[128], grp[128];
	struct upcie_pci_func fn;
	int err;

	for (size_t i = 0; i < UPCIE_ARRAY_SIZE(attrs); i++) {
		take_str(f, v, i == 7 ? sizeof(v) - 1 : 40);
		put(attrs[i], v);
	}
	take_str(f, drv, 100);
	take_str(f, grp, 40);
	/* a link name cannot hold '/' */
	for (char *c = drv; *c; c++)
		if (*c == '/')
			*c = '_';
	for (char *c = grp; *c; c++)
		if (*c == '/')
			*c = '_';
	link_to("driver", "bus/pci/drivers", drv);
	link_to("iommu_group", "kernel/iommu_groups", grp);
	err = upcie_pci_func_read(&bdf, &fn);
	if (err)
		return;
	if (memchr(fn.driver, '\0', sizeof(fn.driver)) == NULL)
		die("func: driver name not terminated");
	if (!*grp ? fn.iommu_group != -1 : fn.iommu_group != group_of(grp))
		die("func: IOMMU group is not the link's number (or a non-number was accepted)");
	if (fn.class_code > 0xffffff)
		die("func: class beyond 24 bits");
	for (int i = 0; i < UPCIE_PCI_NUM_RES; i++)
		if (fn.res[i].size && fn.res[i].start + fn.res[i].size - 1 < fn.res[i].start)
			die("func: a resource range wraps");
}

static void t_file(struct fz *f)
{
	char v[100], path[PATH_MAX * 2];
	uint64_t u = 0;
	int64_t s = 0;

	take_str(f, v, sizeof(v) - 1);
	put("numa_node", v);
	snprintf(path, sizeof(path), "%s/numa_node", fn_dir);
	upcie_file_read_u64(path, &u);
	upcie_file_read_s64(path, &s);
}

static void t_cdev(struct fz *f)
{
	char dir[PATH_MAX * 2], path[PATH_MAX * 3], name[64], buf[16];
	unsigned n = take8(f) % 4;
	size_t len = 1 + take8(f) % sizeof(buf);
	struct dirent *de;
	DIR *d;

	snprintf(dir, sizeof(dir), "%s/vfio-dev", fn_dir);
	d = opendir(dir);
	while (d && (de = readdir(d)))
		if (de->d_name[0] != '.') {
			snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
			rmdir(path);
			unlink(path);
		}
	if (d)
		closedir(d);
	for (unsigned i = 0; i < n; i++) {
		take_str(f, name, 40);
		for (char *c = name; *c; c++)
			if (*c == '/')
				*c = '_';
		if (!*name || !strcmp(name, ".") || !strcmp(name, ".."))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		mkdir(path, 0755);
	}
	if (upcie_vfio_cdev_find(&bdf, buf, len))
		return;
	if (strncmp(buf, "vfio", 4) || !buf[4] || strlen(buf) >= len)
		die("cdev: a name that is not vfioN, or does not fit");
	for (const char *c = buf + 4; *c; c++)
		if (*c < '0' || *c > '9')
			die("cdev: a name that is not vfioN");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz f = { data, size };

	switch (take8(&f) % 4) {
	case 0:
		t_bdf(&f);
		break;
	case 1:
		t_func(&f);
		break;
	case 2:
		t_file(&f);
		break;
	default:
		t_cdev(&f);
		break;
	}
	return 0;
}
