/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * upcie-setup doctor: can this machine do what upcie does, and what to change. Every check
 * adds verdict lines (ok, info, warn, fail, unknown) with a detail and, where something should
 * change, the fix. Used by tools/upcie-setup.c and by the unit test, which runs every check
 * against a fake machine (tests/unit/fake_machine.h).
 *
 * Facts come from sysfs and procfs (UPCIE_SYSFS_ROOT, UPCIE_PROCFS_ROOT move them), from /dev,
 * /lib/modules and /boot (UPCIE_DOCTOR_ROOT prefixes those), from getrlimit(), and for GPU
 * memory sizes from the CUDA driver (libcuda.so.1) or the HIP runtime (libamdhip64) when one
 * can be loaded (never linked: the tool runs on machines without them). A fact that cannot be read gives "unknown", never a guess.
 * Reading config space past 64 bytes (ACS) needs root; without it ACS is unknown. The placement
 * check per GPU reads System RAM from iomem under the procfs root ($UPCIE_IOMEM_PATH wins, as in
 * gpu/p2p_check.h); the kernel shows its addresses to CAP_SYS_ADMIN only, so without root that
 * verdict is unknown. upcie_doctor_run() is for one thread: while it runs it sets the log level,
 * and UPCIE_IOMEM_PATH where that is unset.
 */
#ifndef UPCIE_TOOLS_DOCTOR_H
#define UPCIE_TOOLS_DOCTOR_H

#include <upcie/base/feature.h>

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/base/sysfs.h>
#include <upcie/gpu/p2p_check.h>
#include <upcie/pci/bdf.h>
#include <upcie/pci/config.h>
#include <upcie/pci/func.h>
#include <upcie/pci/inuse.h>
#include <upcie/uring/dmabuf.h>

enum upcie_doctor_verdict {
	UPCIE_DOCTOR_OK = 0,
	UPCIE_DOCTOR_INFO = 1,
	UPCIE_DOCTOR_WARN = 2,
	UPCIE_DOCTOR_FAIL = 3,
	UPCIE_DOCTOR_UNKNOWN = 4,
};

struct upcie_doctor_line {
	char check[24];
	char subject[48];
	enum upcie_doctor_verdict verdict;
	char detail[320];
	char fix[200];
};

/* A path's verdict: can upcie run this way here, decided by one fact, with the fix. */
enum upcie_doctor_state {
	UPCIE_DOCTOR_READY = 0,
	UPCIE_DOCTOR_NO = 1,
	UPCIE_DOCTOR_MAYBE = 2, /* a deciding fact is unknown */
};

#define UPCIE_DOCTOR_MAX_PATHS 40

struct upcie_doctor {
	struct upcie_doctor_line *l;
	unsigned n, cap;
	unsigned count[5];
	/* the verdicts per path (upcie_doctor_paths()), after the checks they are drawn from */
	struct upcie_doctor_line p[UPCIE_DOCTOR_MAX_PATHS];
	unsigned np, ready;
	/* the io_uring dma-buf question to the kernel (tests replace it); NULL: the real one */
	int (*uring_probe)(void);
};

/* The JSON schema of `doctor --json`: 2 added "schema", "paths" and "exit". */
#define UPCIE_DOCTOR_SCHEMA 2

static inline const char *upcie_doctor_verdict_name(enum upcie_doctor_verdict v)
{
	static const char *const names[] = { "ok", "info", "warn", "fail", "unknown" };

	return (unsigned)v < 5 ? names[v] : "?";
}

UPCIE_PRINTF(6, 7)
static inline void upcie_doctor_add(struct upcie_doctor *d, const char *check, const char *subject,
				    enum upcie_doctor_verdict v, const char *fix, const char *fmt,
				    ...)
{
	struct upcie_doctor_line *x;
	va_list ap;

	if (d->n == d->cap) {
		unsigned ncap = d->cap ? d->cap * 2 : 32;
		void *p = realloc(d->l, ncap * sizeof(*d->l));

		if (!p)
			return;
		d->l = (struct upcie_doctor_line *)p;
		d->cap = ncap;
	}
	x = &d->l[d->n++];
	memset(x, 0, sizeof(*x));
	snprintf(x->check, sizeof(x->check), "%s", check);
	snprintf(x->subject, sizeof(x->subject), "%s", subject ? subject : "");
	snprintf(x->fix, sizeof(x->fix), "%s", fix ? fix : "");
	x->verdict = v;
	va_start(ap, fmt);
	vsnprintf(x->detail, sizeof(x->detail), fmt, ap);
	va_end(ap);
	d->count[v]++;
}

static inline void upcie_doctor_free(struct upcie_doctor *d)
{
	int (*probe)(void) = d->uring_probe;

	free(d->l);
	memset(d, 0, sizeof(*d));
	d->uring_probe = probe;
}

/* Path of a system file (/dev, /lib/modules, /boot) under $UPCIE_DOCTOR_ROOT. */
static inline const char *upcie_doctor_path_(char *buf, size_t len, const char *path)
{
	const char *root = getenv("UPCIE_DOCTOR_ROOT");

	snprintf(buf, len, "%s%s", root ? root : "", path);
	return buf;
}

static inline bool upcie_doctor_exists_(const char *fmt, const char *a)
{
	char p[PATH_MAX];
	struct stat st;

	(void)upcie_path_fmt(p, sizeof(p), fmt, a);
	return stat(p, &st) == 0;
}

static inline bool upcie_doctor_sys_exists_(const char *rel)
{
	char p[PATH_MAX];
	struct stat st;

	(void)upcie_path_fmt(p, sizeof(p), "%s/%s", upcie_sysfs_root(), rel);
	return stat(p, &st) == 0;
}

static inline bool upcie_doctor_dev_exists_(const char *dev)
{
	char p[PATH_MAX];
	struct stat st;

	return stat(upcie_doctor_path_(p, sizeof(p), dev), &st) == 0;
}

/* Entries of a directory (not . and ..); -errno when it cannot be listed. */
static inline int upcie_doctor_count_(const char *dir, char *first, size_t len)
{
	struct dirent *de;
	int n = 0;
	DIR *dd = opendir(dir);

	if (!dd)
		return -errno;
	while ((de = readdir(dd))) {
		if (de->d_name[0] == '.')
			continue;
		if (!n && first)
			(void)upcie_path_fmt(first, len, "%s", de->d_name);
		n++;
	}
	closedir(dd);
	return n;
}

/* Kernel release (procfs sys/kernel/osrelease) as major, minor. */
static inline int upcie_doctor_kver_(char *rel, size_t len, int *major, int *minor)
{
	char p[PATH_MAX];

	(void)upcie_path_fmt(p, sizeof(p), "%s/sys/kernel/osrelease", upcie_procfs_root());
	if (upcie_file_read_str(p, rel, len) <= 0)
		return -ENOENT;
	if (sscanf(rel, "%d.%d", major, minor) != 2)
		return -EINVAL;
	return 0;
}

/* The kernel command line's value of `key` ("" when present without value); NULL: absent. */
static inline const char *upcie_doctor_cmdline_(const char *cmdline, const char *key, char *val,
						size_t len)
{
	size_t k = strlen(key);

	for (const char *p = cmdline; p && *p;) {
		while (*p == ' ')
			p++;
		if (!strncmp(p, key, k) && (p[k] == '=' || p[k] == ' ' || !p[k])) {
			size_t n = 0;

			if (p[k] == '=')
				for (p += k + 1; p[n] && p[n] != ' ' && n + 1 < len; n++)
					val[n] = p[n];
			val[n] = '\0';
			return val;
		}
		p = strchr(p, ' ');
	}
	return NULL;
}

/* ---- IOMMU ---------------------------------------------------------------------------- */

static inline void upcie_doctor_iommu(struct upcie_doctor *d)
{
	char p[PATH_MAX], first[64] = "", cmd[4096] = "", v[64], args[192] = "";
	int units, groups;
	static const char *const keys[] = { "intel_iommu", "amd_iommu", "iommu",
					    "iommu.passthrough" };

	(void)upcie_path_fmt(p, sizeof(p), "%s/class/iommu", upcie_sysfs_root());
	units = upcie_doctor_count_(p, first, sizeof(first));
	(void)upcie_path_fmt(p, sizeof(p), "%s/kernel/iommu_groups", upcie_sysfs_root());
	groups = upcie_doctor_count_(p, NULL, 0);
	(void)upcie_path_fmt(p, sizeof(p), "%s/cmdline", upcie_procfs_root());
	if (upcie_file_read_str(p, cmd, sizeof(cmd)) >= 0) {
		for (unsigned i = 0; i < UPCIE_ARRAY_SIZE(keys); i++) {
			size_t o = strlen(args);

			if (upcie_doctor_cmdline_(cmd, keys[i], v, sizeof(v)))
				snprintf(args + o, sizeof(args) - o, "%s%s%s%s", o ? " " : "",
					 keys[i], v[0] ? "=" : "", v);
		}
	} else {
		snprintf(args, sizeof(args), "(command line unreadable)");
	}
	if (units < 0 && groups < 0) {
		upcie_doctor_add(d, "iommu", "", UPCIE_DOCTOR_UNKNOWN, NULL,
				 "cannot read %s/class/iommu or kernel/iommu_groups",
				 upcie_sysfs_root());
		return;
	}
	if (units > 0 || groups > 0)
		upcie_doctor_add(d, "iommu", "", UPCIE_DOCTOR_OK, NULL,
				 "present (%s%s), %d IOMMU groups; kernel command line: %s",
				 units > 0 ? first : "no unit in class/iommu",
				 units > 1 ? " and more" : "", groups > 0 ? groups : 0,
				 args[0] ? args : "no IOMMU parameters");
	else
		upcie_doctor_add(d, "iommu", "", UPCIE_DOCTOR_INFO,
				 "for vfio: enable the IOMMU in firmware and boot with "
				 "intel_iommu=on or amd_iommu=on",
				 "none: devices see physical addresses, only the uio path works "
				 "(kernel command line: %s)",
				 args[0] ? args : "no IOMMU parameters");
}

/* Default domain of function `fn`'s group: translating, identity, blocked, ... */
static inline void upcie_doctor_group(struct upcie_doctor *d, const struct upcie_pci_func *fn)
{
	char p[PATH_MAX], type[32], what[64];
	int sib;

	if (fn->iommu_group < 0) {
		upcie_doctor_add(d, "iommu-group", fn->name, UPCIE_DOCTOR_INFO, NULL,
				 "none: uio path only (physical addresses)");
		return;
	}
	(void)upcie_path_fmt(p, sizeof(p), "%s/kernel/iommu_groups/%d/devices", upcie_sysfs_root(),
			     fn->iommu_group);
	sib = upcie_doctor_count_(p, NULL, 0);
	(void)upcie_path_fmt(p, sizeof(p), "%s/kernel/iommu_groups/%d/type", upcie_sysfs_root(),
			     fn->iommu_group);
	if (upcie_file_read_str(p, type, sizeof(type)) <= 0) {
		upcie_doctor_add(d, "iommu-group", fn->name, UPCIE_DOCTOR_UNKNOWN, NULL,
				 "group %d, default domain type unreadable (kernel before 5.11?)",
				 fn->iommu_group);
		return;
	}
	if (!strcmp(type, "DMA") || !strcmp(type, "DMA-FQ"))
		snprintf(what, sizeof(what), "translating (%s)", type);
	else if (!strcmp(type, "identity"))
		snprintf(what, sizeof(what), "identity (passthrough)");
	else
		snprintf(what, sizeof(what), "%s", type);
	upcie_doctor_add(d, "iommu-group", fn->name, UPCIE_DOCTOR_OK, NULL,
			 "group %d, %s, %d function%s in the group; paths: %s", fn->iommu_group,
			 what, sib, sib == 1 ? "" : "s",
			 !strcmp(type, "identity") ? "uio, vfio" : "vfio (uio would fault)");
}

/* ---- vfio, modules, kernel features --------------------------------------------------- */

/* Is module `m` available for the running kernel: built in, or a file in modules.dep? */
static inline int upcie_doctor_module_available_(const char *rel, const char *m)
{
	char p[PATH_MAX], q[PATH_MAX], line[1024], want[96];
	int found = 0, readable = 0;
	FILE *f;

	(void)upcie_path_fmt(want, sizeof(want), "/%s.ko", m);
	for (int i = 0; i < 2; i++) {
		(void)upcie_path_fmt(q, sizeof(q), "/lib/modules/%s/%s", rel,
				     i ? "modules.builtin" : "modules.dep");
		f = fopen(upcie_doctor_path_(p, sizeof(p), q), "re");
		if (!f)
			continue;
		readable = 1;
		while (!found && fgets(line, sizeof(line), f)) {
			char *c = i ? line : strchr(line, ':');

			if (!c)
				continue;
			if (!i)
				*c = '\0';
			for (char *s = line; *s; s++)
				if (*s == '-')
					*s = '_';
			{
				char w[96];

				snprintf(w, sizeof(w), "%s", want);
				for (char *s = w; *s; s++)
					if (*s == '-')
						*s = '_';
				found = strstr(line, w) != NULL;
			}
		}
		fclose(f);
	}
	return readable ? found : -ENOENT;
}

static inline bool upcie_doctor_module_loaded_(const char *m)
{
	char rel[128];

	(void)upcie_path_fmt(rel, sizeof(rel), "module/%s", m);
	return upcie_doctor_sys_exists_(rel);
}

static inline void upcie_doctor_vfio(struct upcie_doctor *d, const char *rel)
{
	int avail;

	/* type1: the container node and the type1 backend */
	if (upcie_doctor_dev_exists_("/dev/vfio/vfio") &&
	    upcie_doctor_module_loaded_("vfio_iommu_type1"))
		upcie_doctor_add(d, "vfio", "type1", UPCIE_DOCTOR_OK, NULL,
				 "/dev/vfio/vfio and vfio_iommu_type1 loaded");
	else if ((avail = upcie_doctor_module_available_(rel, "vfio_iommu_type1")) > 0 ||
		 upcie_doctor_module_available_(rel, "vfio-pci") > 0)
		upcie_doctor_add(d, "vfio", "type1", UPCIE_DOCTOR_INFO,
				 "modprobe vfio-pci (upcie-setup bind BDF vfio-pci loads it)",
				 "available, not loaded");
	else if (avail == -ENOENT)
		upcie_doctor_add(d, "vfio", "type1", UPCIE_DOCTOR_UNKNOWN, NULL,
				 "not loaded; modules of %s unreadable", rel);
	else
		upcie_doctor_add(d, "vfio", "type1", UPCIE_DOCTOR_WARN,
				 "a kernel with CONFIG_VFIO_PCI", "no vfio-pci module for %s", rel);
	/* cdev + iommufd */
	if (upcie_doctor_dev_exists_("/dev/iommu"))
		upcie_doctor_add(d, "vfio", "iommufd", UPCIE_DOCTOR_OK, NULL, "/dev/iommu present");
	else if ((avail = upcie_doctor_module_available_(rel, "iommufd")) > 0)
		upcie_doctor_add(d, "vfio", "iommufd", UPCIE_DOCTOR_INFO, "modprobe iommufd",
				 "available, not loaded");
	else if (avail == -ENOENT)
		upcie_doctor_add(d, "vfio", "iommufd", UPCIE_DOCTOR_UNKNOWN, NULL,
				 "no /dev/iommu; modules of %s unreadable", rel);
	else
		upcie_doctor_add(d, "vfio", "iommufd", UPCIE_DOCTOR_INFO,
				 "a kernel >= 6.6 with CONFIG_IOMMUFD and CONFIG_VFIO_DEVICE_CDEV",
				 "no /dev/iommu and no iommufd module");
	/* /dev/vfio/devices, not /sys/class/vfio-dev: 6.1 has that class (a struct device per
	 * vfio device) but no cdevs, which came with 6.6 */
	if (upcie_doctor_dev_exists_("/dev/vfio/devices"))
		upcie_doctor_add(d, "vfio", "cdev", UPCIE_DOCTOR_OK, NULL,
				 "vfio device cdevs (/dev/vfio/devices) present");
	else
		upcie_doctor_add(
		    d, "vfio", "cdev", UPCIE_DOCTOR_INFO, NULL,
		    "no vfio device cdevs (CONFIG_VFIO_DEVICE_CDEV, with vfio-pci bound)");
}

/*
 * Our modules: loaded, and speaking the ABI this build expects. The identity is the module
 * parameter abi, "upcie-<module> <ABI>"; a module of that name without it is not ours (or an
 * old build) and the wrappers will refuse it.
 */
static inline void upcie_doctor_kmod_one_(struct upcie_doctor *d, const char *m, const char *pkg,
					  long want)
{
	char p[PATH_MAX], abi[64], ident[64], fix[160];
	long got;

	snprintf(fix, sizeof(fix),
		 "apt install ./%s_*.deb (scripts/build-dkms.sh), then modprobe %s", pkg, m);
	if (!upcie_doctor_module_loaded_(m)) {
		upcie_doctor_add(d, "module", m, UPCIE_DOCTOR_INFO, fix, "not loaded");
		return;
	}
	(void)upcie_path_fmt(p, sizeof(p), "%s/module/%s/parameters/abi", upcie_sysfs_root(), m);
	if (upcie_file_read_str(p, abi, sizeof(abi)) <= 0) {
		upcie_doctor_add(d, "module", m, UPCIE_DOCTOR_FAIL, fix,
				 "a module named %s is loaded without upcie's identity (no "
				 "parameters/abi): another project's, or an old build",
				 m);
		return;
	}
	snprintf(ident, sizeof(ident), "upcie-%s ", m);
	if (strncmp(abi, ident, strlen(ident)) || sscanf(abi + strlen(ident), "%ld", &got) != 1) {
		upcie_doctor_add(d, "module", m, UPCIE_DOCTOR_FAIL, fix,
				 "a module named %s is loaded with identity '%s', not upcie's", m,
				 abi);
		return;
	}
	if (want >= 0 && got != want) {
		upcie_doctor_add(d, "module", m, UPCIE_DOCTOR_FAIL, fix,
				 "loaded with ABI %ld; this build of upcie speaks ABI %ld", got,
				 want);
		return;
	}
	if (want < 0)
		upcie_doctor_add(d, "module", m, UPCIE_DOCTOR_OK, NULL, "loaded, ABI %ld", got);
	else
		upcie_doctor_add(d, "module", m, UPCIE_DOCTOR_OK, NULL,
				 "loaded, ABI %ld (as this build expects)", got);
}

#ifndef UPCIE_DOCTOR_DMABUF_IMPORT_ABI
#if defined(UPCIE_DMABUF_IMPORT_ABI)
#define UPCIE_DOCTOR_DMABUF_IMPORT_ABI ((long)UPCIE_DMABUF_IMPORT_ABI)
#else
#define UPCIE_DOCTOR_DMABUF_IMPORT_ABI (-1L)
#endif
#endif
#ifndef UPCIE_DOCTOR_IOMMU_MAP_PA_ABI
#if defined(UPCIE_IOMMU_MAP_PA_ABI)
#define UPCIE_DOCTOR_IOMMU_MAP_PA_ABI ((long)UPCIE_IOMMU_MAP_PA_ABI)
#else
#define UPCIE_DOCTOR_IOMMU_MAP_PA_ABI (-1L)
#endif
#endif

static inline void upcie_doctor_kmods(struct upcie_doctor *d)
{
	upcie_doctor_kmod_one_(d, "dmabuf_import", "upcie-dmabuf-import-dkms",
			       UPCIE_DOCTOR_DMABUF_IMPORT_ABI);
	upcie_doctor_kmod_one_(d, "iommu_map_pa", "upcie-iommu-map-pa-dkms",
			       UPCIE_DOCTOR_IOMMU_MAP_PA_ABI);
}

/* CONFIG_<name> of the running kernel from /boot/config-<rel>: 'y', 'm', 'n', or 0 unknown. */
static inline char upcie_doctor_kconfig_(const char *rel, const char *name)
{
	char p[PATH_MAX], q[PATH_MAX], line[256], want[96];
	char r = 0;
	FILE *f;

	(void)upcie_path_fmt(q, sizeof(q), "/boot/config-%s", rel);
	f = fopen(upcie_doctor_path_(p, sizeof(p), q), "re");
	if (!f)
		return 0;
	r = 'n';
	(void)upcie_path_fmt(want, sizeof(want), "CONFIG_%s=", name);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, want, strlen(want)))
			r = line[strlen(want)];
	fclose(f);
	return r;
}

static inline void upcie_doctor_kernel(struct upcie_doctor *d, const char *rel, int maj, int min)
{
	int v = maj * 1000 + min;
	char c;

	if (maj < 0) {
		upcie_doctor_add(d, "kernel", "", UPCIE_DOCTOR_UNKNOWN, NULL,
				 "release unreadable (/proc/sys/kernel/osrelease)");
		return;
	}
	upcie_doctor_add(d, "kernel", "", UPCIE_DOCTOR_INFO, NULL, "Linux %s", rel);
	/* iommufd IOAS_MAP_FILE (6.13): memfd mapped by file, no pinning through the mm */
	if (v < 6013)
		upcie_doctor_add(d, "kernel", "iommufd-map-file", UPCIE_DOCTOR_INFO,
				 "a kernel >= 6.13 with CONFIG_IOMMUFD", "no: %d.%d < 6.13", maj,
				 min);
	else if (upcie_doctor_dev_exists_("/dev/iommu"))
		upcie_doctor_add(d, "kernel", "iommufd-map-file", UPCIE_DOCTOR_OK, NULL,
				 "yes: %d.%d >= 6.13 and /dev/iommu present", maj, min);
	else
		upcie_doctor_add(d, "kernel", "iommufd-map-file", UPCIE_DOCTOR_INFO,
				 "CONFIG_IOMMUFD (modprobe iommufd)",
				 "no: %d.%d >= 6.13 but no /dev/iommu", maj, min);
	/* vfio-pci BAR export as dma-buf (6.19, CONFIG_VFIO_PCI_DMABUF) */
	c = upcie_doctor_kconfig_(rel, "VFIO_PCI_DMABUF");
	if (v < 6019)
		upcie_doctor_add(d, "kernel", "vfio-bar-dmabuf", UPCIE_DOCTOR_INFO,
				 "a kernel >= 6.19 with CONFIG_VFIO_PCI_DMABUF", "no: %d.%d < 6.19",
				 maj, min);
	else if (c == 'y')
		upcie_doctor_add(d, "kernel", "vfio-bar-dmabuf", UPCIE_DOCTOR_OK, NULL,
				 "yes: CONFIG_VFIO_PCI_DMABUF=y");
	else if (c == 0)
		upcie_doctor_add(d, "kernel", "vfio-bar-dmabuf", UPCIE_DOCTOR_UNKNOWN, NULL,
				 "%d.%d >= 6.19, but /boot/config-%s is unreadable", maj, min, rel);
	else
		upcie_doctor_add(d, "kernel", "vfio-bar-dmabuf", UPCIE_DOCTOR_INFO,
				 "CONFIG_VFIO_PCI_DMABUF=y", "no: not configured");
	/* udmabuf: host memory as dma-buf */
	if (upcie_doctor_dev_exists_("/dev/udmabuf"))
		upcie_doctor_add(d, "kernel", "udmabuf", UPCIE_DOCTOR_OK, NULL,
				 "/dev/udmabuf present");
	else if (upcie_doctor_module_available_(rel, "udmabuf") > 0)
		upcie_doctor_add(d, "kernel", "udmabuf", UPCIE_DOCTOR_INFO, "modprobe udmabuf",
				 "available, not loaded");
	else
		upcie_doctor_add(d, "kernel", "udmabuf", UPCIE_DOCTOR_INFO, "CONFIG_UDMABUF",
				 "no /dev/udmabuf");
}

/* ---- hugepages, memlock ---------------------------------------------------------------- */

static inline void upcie_doctor_hugepages(struct upcie_doctor *d)
{
	char dir[PATH_MAX], p[PATH_MAX], subj[48];
	uint64_t total = 0, nr, fr;
	struct dirent *de, *ne;
	int sizes = 0;
	DIR *dd, *nd;

	snprintf(dir, sizeof(dir), "%s/kernel/mm/hugepages", upcie_sysfs_root());
	dd = opendir(dir);
	if (!dd) {
		upcie_doctor_add(d, "hugepages", "", UPCIE_DOCTOR_UNKNOWN, NULL, "cannot list %s",
				 dir);
		return;
	}
	while ((de = readdir(dd))) {
		unsigned long kb;

		if (sscanf(de->d_name, "hugepages-%lukB", &kb) != 1)
			continue;
		sizes++;
		(void)upcie_path_fmt(subj, sizeof(subj), "%lu kB", kb);
		(void)upcie_path_fmt(p, sizeof(p), "%s/%s/nr_hugepages", dir, de->d_name);
		if (upcie_file_read_u64(p, &nr)) {
			upcie_doctor_add(d, "hugepages", subj, UPCIE_DOCTOR_UNKNOWN, NULL,
					 "nr_hugepages unreadable");
			continue;
		}
		(void)upcie_path_fmt(p, sizeof(p), "%s/%s/free_hugepages", dir, de->d_name);
		if (upcie_file_read_u64(p, &fr))
			fr = 0;
		total += nr;
		upcie_doctor_add(d, "hugepages", subj, UPCIE_DOCTOR_INFO, NULL,
				 "%" PRIu64 " reserved, %" PRIu64 " free", nr, fr);
		/* per NUMA node */
		(void)upcie_path_fmt(p, sizeof(p), "%s/devices/system/node", upcie_sysfs_root());
		nd = opendir(p);
		while (nd && (ne = readdir(nd))) {
			char q[PATH_MAX], ns[64];
			uint64_t nn, nf;
			int node;

			if (sscanf(ne->d_name, "node%d", &node) != 1)
				continue;
			(void)upcie_path_fmt(q, sizeof(q), "%s/%s/hugepages/%s/nr_hugepages", p,
					     ne->d_name, de->d_name);
			if (upcie_file_read_u64(q, &nn))
				continue;
			(void)upcie_path_fmt(q, sizeof(q), "%s/%s/hugepages/%s/free_hugepages", p,
					     ne->d_name, de->d_name);
			if (upcie_file_read_u64(q, &nf))
				nf = 0;
			(void)upcie_path_fmt(ns, sizeof(ns), "%lu kB node %d", kb, node);
			upcie_doctor_add(d, "hugepages", ns, UPCIE_DOCTOR_INFO, NULL,
					 "%" PRIu64 " reserved, %" PRIu64 " free", nn, nf);
		}
		if (nd)
			closedir(nd);
	}
	closedir(dd);
	if (!sizes)
		upcie_doctor_add(d, "hugepages", "", UPCIE_DOCTOR_WARN,
				 "a kernel with CONFIG_HUGETLBFS", "no hugepage sizes in %s", dir);
	else if (!total)
		upcie_doctor_add(d, "hugepages", "", UPCIE_DOCTOR_WARN,
				 "upcie-setup hugepages reserve 512",
				 "none reserved: queues and buffers come from hugepages");
	else
		upcie_doctor_add(d, "hugepages", "", UPCIE_DOCTOR_OK, NULL,
				 "%" PRIu64 " reserved in all", total);
}

static inline void upcie_doctor_memlock(struct upcie_doctor *d)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_MEMLOCK, &rl)) {
		upcie_doctor_add(d, "memlock", "", UPCIE_DOCTOR_UNKNOWN, NULL, "getrlimit failed");
		return;
	}
	if (rl.rlim_cur == RLIM_INFINITY)
		upcie_doctor_add(d, "memlock", "", UPCIE_DOCTOR_OK, NULL, "unlimited");
	else if (geteuid() == 0)
		upcie_doctor_add(d, "memlock", "", UPCIE_DOCTOR_OK, NULL,
				 "%llu KiB, but root (CAP_IPC_LOCK) is not held to it",
				 (unsigned long long)rl.rlim_cur >> 10);
	else if (rl.rlim_cur < (256ull << 20))
		upcie_doctor_add(d, "memlock", "", UPCIE_DOCTOR_WARN,
				 "ulimit -l unlimited (limits.conf memlock), or run as root",
				 "%llu KiB: vfio pins DMA memory against this limit",
				 (unsigned long long)rl.rlim_cur >> 10);
	else
		upcie_doctor_add(d, "memlock", "", UPCIE_DOCTOR_OK, NULL, "%llu KiB",
				 (unsigned long long)rl.rlim_cur >> 10);
}

/* ---- functions: drivers, GPUs, topology ------------------------------------------------ */

#define UPCIE_DOCTOR_MAX_FN 64

struct upcie_doctor_fns {
	struct upcie_pci_func nvme[UPCIE_DOCTOR_MAX_FN], gpu[UPCIE_DOCTOR_MAX_FN];
	unsigned nnvme, ngpu;
};

static inline int upcie_doctor_collect_(const struct upcie_pci_func *fn, void *ctx)
{
	struct upcie_doctor_fns *f = (struct upcie_doctor_fns *)ctx;
	uint32_t base = fn->class_code >> 16, sub = (fn->class_code >> 8) & 0xff;

	if (fn->class_code == UPCIE_PCI_CLASS_NVME && f->nnvme < UPCIE_DOCTOR_MAX_FN)
		f->nvme[f->nnvme++] = *fn;
	else if (base == 0x03 && (sub == 0x00 || sub == 0x02) &&
		 (fn->vendor == 0x10de || fn->vendor == 0x1002) && f->ngpu < UPCIE_DOCTOR_MAX_FN)
		f->gpu[f->ngpu++] = *fn;
	return 0;
}

static inline void upcie_doctor_driver(struct upcie_doctor *d, const struct upcie_pci_func *fn)
{
	struct upcie_pci_inuse u;
	char desc[512] = "", fix[160];

	if (upcie_pci_inuse_scan(&fn->bdf, true, &u) == 0 && (u.n || u.unknown))
		upcie_pci_inuse_describe(&u, fn->name, desc, sizeof(desc));
	if (!strcmp(fn->driver, "vfio-pci")) {
		upcie_doctor_add(d, "driver", fn->name, UPCIE_DOCTOR_OK, NULL,
				 "vfio-pci: ready for the type1 and iommufd paths");
	} else if (!strcmp(fn->driver, "uio_pci_generic")) {
		upcie_doctor_add(d, "driver", fn->name, UPCIE_DOCTOR_OK, NULL,
				 "uio_pci_generic: ready for the uio path");
	} else if (desc[0]) {
		upcie_doctor_add(d, "driver", fn->name, UPCIE_DOCTOR_INFO, NULL,
				 "%s%s, in use: %s; upcie-setup bind and the bind option refuse it",
				 fn->driver[0] ? "bound to " : "no driver", fn->driver, desc);
	} else {
		snprintf(fix, sizeof(fix), "upcie-setup bind %s %s", fn->name,
			 fn->iommu_group >= 0 ? "vfio-pci" : "uio_pci_generic");
		upcie_doctor_add(d, "driver", fn->name, UPCIE_DOCTOR_INFO, fix, "%s%s, not in use",
				 fn->driver[0] ? "bound to " : "no driver", fn->driver);
	}
}

/* The largest memory BAR (a GPU's BAR1 is its largest prefetchable one). */
static inline uint64_t upcie_doctor_big_bar_(const struct upcie_pci_func *fn, int *idx)
{
	uint64_t best = 0;

	*idx = -1;
	for (int i = 0; i < UPCIE_PCI_NUM_BARS; i++) {
		if ((fn->res[i].flags & UPCIE_PCI_RES_MEM) && fn->res[i].size > best) {
			best = fn->res[i].size;
			*idx = i;
		}
	}
	return best;
}

/* VRAM of the CUDA device at `bdf`, through libcuda when it loads; -ENOENT otherwise. */
static inline int upcie_doctor_cuda_mem_(const char *bdf, uint64_t *bytes)
{
	typedef int (*init_fn)(unsigned);
	typedef int (*count_fn)(int *);
	typedef int (*get_fn)(int *, int);
	typedef int (*busid_fn)(char *, int, int);
	typedef int (*mem_fn)(size_t *, int);
	void *h;
	int n = 0, err = -ENOENT;

	if (getenv("UPCIE_DOCTOR_NO_CUDA"))
		return -ENOENT;
	h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return -ENOENT;
	{
		init_fn cinit = (init_fn)dlsym(h, "cuInit");
		count_fn ccount = (count_fn)dlsym(h, "cuDeviceGetCount");
		get_fn cget = (get_fn)dlsym(h, "cuDeviceGet");
		busid_fn cbus = (busid_fn)dlsym(h, "cuDeviceGetPCIBusId");
		mem_fn cmem = (mem_fn)dlsym(h, "cuDeviceTotalMem_v2");

		if (cinit && ccount && cget && cbus && cmem && !cinit(0) && !ccount(&n)) {
			for (int i = 0; i < n; i++) {
				char id[32];
				int dev;
				size_t b;

				if (cget(&dev, i) || cbus(id, sizeof(id), dev))
					continue;
				for (char *s = id; *s; s++)
					*s = (char)(*s >= 'A' && *s <= 'F' ? *s - 'A' + 'a' : *s);
				/* CUDA gives an 8-digit domain */
				if (strlen(id) >= 12 && !strcmp(id + strlen(id) - 12, bdf) &&
				    !cmem(&b, dev)) {
					*bytes = b;
					err = 0;
					break;
				}
			}
		}
	}
	dlclose(h);
	return err;
}

/* Memory of the HIP device at `bdf`, through libamdhip64 when it loads; -ENOENT otherwise. */
static inline int upcie_doctor_hip_mem_(const char *bdf, uint64_t *bytes)
{
	typedef int (*count_fn)(int *);
	typedef int (*busid_fn)(char *, int, int);
	typedef int (*mem_fn)(size_t *, int);
	void *h;
	int n = 0, err = -ENOENT;

	if (getenv("UPCIE_DOCTOR_NO_HIP"))
		return -ENOENT;
	h = dlopen("libamdhip64.so", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		h = dlopen("libamdhip64.so.5", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return -ENOENT;
	{
		count_fn hcount = (count_fn)dlsym(h, "hipGetDeviceCount");
		busid_fn hbus = (busid_fn)dlsym(h, "hipDeviceGetPCIBusId");
		mem_fn hmem = (mem_fn)dlsym(h, "hipDeviceTotalMem");

		if (hcount && hbus && hmem && !hcount(&n)) {
			for (int i = 0; i < n; i++) {
				char id[32];
				size_t b;

				if (hbus(id, sizeof(id), i))
					continue;
				for (char *s = id; *s; s++)
					*s = (char)(*s >= 'A' && *s <= 'F' ? *s - 'A' + 'a' : *s);
				if (strlen(id) >= 12 && !strcmp(id + strlen(id) - 12, bdf) &&
				    !hmem(&b, i)) {
					*bytes = b;
					err = 0;
					break;
				}
			}
		}
	}
	dlclose(h);
	return err;
}

/* BAR1 against memory: all VRAM reachable by peers at once, or only a window of it. */
static inline void upcie_doctor_bar1_verdict(struct upcie_doctor *d, const char *name, uint64_t bar,
					     int idx, int memerr, uint64_t mem)
{
	if (memerr)
		upcie_doctor_add(d, "gpu-bar1", name, UPCIE_DOCTOR_UNKNOWN, NULL,
				 "BAR%d %" PRIu64 " MiB; memory size unknown (no CUDA or HIP "
				 "runtime answered for this GPU)",
				 idx, bar >> 20);
	else if (bar >= mem)
		upcie_doctor_add(d, "gpu-bar1", name, UPCIE_DOCTOR_OK, NULL,
				 "BAR%d %" PRIu64 " MiB covers %" PRIu64 " MiB of memory", idx,
				 bar >> 20, mem >> 20);
	else
		upcie_doctor_add(d, "gpu-bar1", name, UPCIE_DOCTOR_WARN,
				 "enable resizable BAR / large BAR1 in firmware",
				 "BAR%d %" PRIu64 " MiB < %" PRIu64 " MiB of memory: only a "
				 "window of GPU memory is reachable by the NVMe at once",
				 idx, bar >> 20, mem >> 20);
}

static inline void upcie_doctor_gpu(struct upcie_doctor *d, const struct upcie_pci_func *fn)
{
	uint64_t mem = 0;
	int idx, err = -ENOENT;
	uint64_t bar = upcie_doctor_big_bar_(fn, &idx);

	if (fn->vendor == 0x10de)
		err = upcie_doctor_cuda_mem_(fn->name, &mem);
	else if (fn->vendor == 0x1002)
		err = upcie_doctor_hip_mem_(fn->name, &mem);
	upcie_doctor_bar1_verdict(d, fn->name, bar, idx, err, mem);
}

/*
 * System RAM from iomem, read by the heaps' own loader (gpu/p2p_check.h). That loader takes its
 * file from $UPCIE_IOMEM_PATH alone (else /proc/iomem); the doctor reads procfs under its root,
 * so where the variable is unset it names <procfs root>/iomem for this one call and is removed
 * again: the same file as the heaps read unless UPCIE_PROCFS_ROOT moves procfs. The file read
 * is in `path`.
 */
static inline int upcie_doctor_sysram_(struct upcie_gpu_p2p_sysram *s, char *path, size_t len)
{
	const char *env = getenv("UPCIE_IOMEM_PATH");
	int err;

	if (env) {
		(void)upcie_path_fmt(path, len, "%s", env);
		return upcie_gpu_p2p_sysram_load(s);
	}
	(void)upcie_path_fmt(path, len, "%s/iomem", upcie_procfs_root());
	if (setenv("UPCIE_IOMEM_PATH", path, 1))
		return -errno;
	err = upcie_gpu_p2p_sysram_load(s);
	(void)unsetenv("UPCIE_IOMEM_PATH");
	return err;
}

/*
 * Placement of GPU `fn`'s memory: can upcie verify that what it hands a controller as this GPU's
 * memory lies in this GPU's BAR window? The IMPORT heaps (gpu/heap_cuda.h, gpu/heap_hip.h) check
 * every segment, at heap creation and at every registration, against the largest memory BAR (the
 * one gpu/dev_cuda.h and gpu/dev_hip.h pick, as upcie_doctor_big_bar_() does) and against the
 * System RAM of iomem. Here: whether that window is there, whether iomem gives real addresses,
 * whether the window itself lies clear of System RAM, and whether /dev/dmabuf_import (where the
 * IMPORT heap gets its bus addresses) is there. No buffer is seen, so none is judged.
 */
static inline void upcie_doctor_placement(struct upcie_doctor *d, const struct upcie_pci_func *fn)
{
	struct upcie_gpu_p2p_window w;
	struct upcie_gpu_p2p_sysram *s;
	char path[PATH_MAX], win[96];
	struct stat st;
	unsigned i = 0;
	int idx, err;

	(void)upcie_doctor_big_bar_(fn, &idx);
	if (idx < 0) {
		upcie_doctor_add(d, "gpu-placement", fn->name, UPCIE_DOCTOR_FAIL, NULL,
				 "no memory BAR in sysfs resource: no window to check this GPU's "
				 "memory against (the heaps refuse a GPU without one)");
		return;
	}
	err = upcie_gpu_p2p_window_read(fn->name, idx, &w);
	if (err) {
		upcie_doctor_add(d, "gpu-placement", fn->name, UPCIE_DOCTOR_UNKNOWN, NULL,
				 "cannot verify: BAR%d unreadable from sysfs resource (%s)", idx,
				 strerror(-err));
		return;
	}
	snprintf(win, sizeof(win), "BAR%d 0x%" PRIx64 "-0x%" PRIx64 " (%" PRIu64 " MiB)", w.bar,
		 w.start, w.start + w.size - 1, w.size >> 20);
	s = (struct upcie_gpu_p2p_sysram *)malloc(sizeof(*s));
	if (!s) {
		upcie_doctor_add(d, "gpu-placement", fn->name, UPCIE_DOCTOR_UNKNOWN, NULL,
				 "cannot verify: out of memory");
		return;
	}
	err = upcie_doctor_sysram_(s, path, sizeof(path));
	if (err == -EPERM)
		upcie_doctor_add(d, "gpu-placement", fn->name, UPCIE_DOCTOR_UNKNOWN,
				 "run as root (a program using the IMPORT heap needs "
				 "CAP_SYS_ADMIN for the same file)",
				 "cannot verify: %s shows every address as 0 without "
				 "CAP_SYS_ADMIN, and the heaps' check then refuses (-EPERM); "
				 "window %s",
				 path, win);
	else if (err == -ENOSPC)
		upcie_doctor_add(d, "gpu-placement", fn->name, UPCIE_DOCTOR_FAIL, NULL,
				 "%s lists more than %d System RAM ranges: the heaps' check "
				 "refuses (-ENOSPC); window %s",
				 path, UPCIE_GPU_P2P_SYSRAM_MAX, win);
	else if (err == -ENOENT && stat(path, &st) == 0)
		upcie_doctor_add(d, "gpu-placement", fn->name, UPCIE_DOCTOR_UNKNOWN, NULL,
				 "cannot verify: %s lists no System RAM (the heaps' check refuses "
				 "then); window %s",
				 path, win);
	else if (err)
		upcie_doctor_add(d, "gpu-placement", fn->name, UPCIE_DOCTOR_UNKNOWN, NULL,
				 "cannot verify: %s unreadable (%s); window %s", path,
				 strerror(-err), win);
	else if (upcie_gpu_p2p_in_sysram(s, w.start, w.size, &i))
		upcie_doctor_add(d, "gpu-placement", fn->name, UPCIE_DOCTOR_FAIL,
				 "check the firmware's BAR assignment and the kernel log "
				 "(resource conflicts)",
				 "window %s overlaps System RAM 0x%" PRIx64 "-0x%" PRIx64
				 " in %s: the heaps refuse memory at those addresses (-EXDEV)",
				 win, s->start[i], s->end[i], path);
	else if (upcie_doctor_dev_exists_("/dev/dmabuf_import"))
		upcie_doctor_add(d, "gpu-placement", fn->name, UPCIE_DOCTOR_OK, NULL,
				 "window %s, clear of System RAM (%u ranges in %s); "
				 "/dev/dmabuf_import present: the IMPORT heap checks each segment "
				 "against this window at heap creation and at every registration",
				 win, s->n, path);
	else
		upcie_doctor_add(d, "gpu-placement", fn->name, UPCIE_DOCTOR_INFO,
				 "apt install ./upcie-dmabuf-import-dkms_*.deb "
				 "(scripts/build-dkms.sh), then modprobe dmabuf_import",
				 "window %s, clear of System RAM (%u ranges in %s); no "
				 "/dev/dmabuf_import: no IMPORT heap, so no bus addresses to check",
				 win, s->n, path);
	free(s);
}

/* sysfs device path components of a function: "pci0000:00", "0000:00:01.0", ... */
static inline int upcie_doctor_devpath_(const struct upcie_pci_func *fn, char comp[][16], int max)
{
	char p[PATH_MAX], real[PATH_MAX], *s, *save = NULL;
	int n = 0, seen = 0;

	if (upcie_pci_func_path(&fn->bdf, "", p, sizeof(p)) || !realpath(p, real))
		return -ENOENT;
	for (s = strtok_r(real, "/", &save); s; s = strtok_r(NULL, "/", &save)) {
		if (!strncmp(s, "pci", 3) && strchr(s, ':'))
			seen = 1;
		if (seen && n < max)
			snprintf(comp[n++], 16, "%s", s);
	}
	return seen ? n : -ENOENT;
}

/* ACS P2P redirect (request or completion redirect) on bridge `name`: 1, 0, or -errno. */
static inline int upcie_doctor_acs_redirect_(const char *name)
{
	struct upcie_pci_bdf b;
	uint16_t ctl;
	int pos;

	if (upcie_pci_bdf_parse_quiet_(name, &b))
		return -EINVAL;
	pos = upcie_pci_ecap_find(&b, 0x000d);
	if (pos == -ENOENT)
		return 0;
	if (pos < 0)
		return pos;
	if (upcie_pci_config_read16(&b, (uint32_t)pos + 6, &ctl))
		return -EACCES;
	return (ctl & 0x000c) ? 1 : 0; /* RR (bit 2), CR (bit 3) */
}

static inline void upcie_doctor_path(struct upcie_doctor *d, const struct upcie_pci_func *gpu,
				     const struct upcie_pci_func *nvme)
{
	char a[16][16], b[16][16], subj[48], acs[160] = "";
	int na, nb, common = 0, unknown = 0;
	const char *cls;
	enum upcie_doctor_verdict v;

	(void)upcie_path_fmt(subj, sizeof(subj), "%s<->%s", gpu->name, nvme->name);
	na = upcie_doctor_devpath_(gpu, a, 16);
	nb = upcie_doctor_devpath_(nvme, b, 16);
	if (na < 0 || nb < 0) {
		upcie_doctor_add(d, "p2p-path", subj, UPCIE_DOCTOR_UNKNOWN, NULL,
				 "device paths unreadable");
		return;
	}
	while (common < na - 1 && common < nb - 1 && !strcmp(a[common], b[common]))
		common++;
	/* bridges below the host bridge on either side, down to the devices: ACS there sends
	 * peer requests up to the root complex */
	for (int side = 0; side < 2; side++) {
		char(*c)[16] = side ? b : a;
		int n = side ? nb : na;

		for (int i = 1; i < n - 1; i++) {
			int r = upcie_doctor_acs_redirect_(c[i]);
			size_t o = strlen(acs);

			if (r > 0)
				snprintf(acs + o, sizeof(acs) - o, "%s%s", o ? ", " : "", c[i]);
			else if (r < 0)
				unknown = 1;
		}
	}
	if (strcmp(a[0], b[0])) {
		if (gpu->numa_node >= 0 && nvme->numa_node >= 0 &&
		    gpu->numa_node != nvme->numa_node) {
			cls = "across sockets (SYS): peer traffic crosses the CPU interconnect";
			v = UPCIE_DOCTOR_FAIL;
		} else if (gpu->numa_node < 0 || nvme->numa_node < 0) {
			cls = "across host bridges, NUMA nodes unknown";
			v = UPCIE_DOCTOR_WARN;
		} else {
			cls = "across host bridges of one node (NODE): P2P through the CPU";
			v = UPCIE_DOCTOR_WARN;
		}
	} else if (common <= 1) {
		cls = "through the host bridge (PHB): P2P depends on the root complex";
		v = UPCIE_DOCTOR_WARN;
	} else if (common == 2) {
		cls = "below one root port";
		v = UPCIE_DOCTOR_OK;
	} else {
		cls = "below one PCIe switch (PIX/PXB): the best P2P path";
		v = UPCIE_DOCTOR_OK;
	}
	if (acs[0]) {
		upcie_doctor_add(d, "p2p-path", subj, UPCIE_DOCTOR_WARN,
				 "disable ACS redirect on those ports (setpci), or accept "
				 "translation at the root complex",
				 "%s; ACS redirects peer requests up to the root complex at %s",
				 cls, acs);
	} else if (unknown) {
		upcie_doctor_add(d, "p2p-path", subj,
				 v == UPCIE_DOCTOR_OK ? UPCIE_DOCTOR_UNKNOWN : v, NULL,
				 "%s; ACS unknown (extended config space needs root)", cls);
	} else {
		upcie_doctor_add(d, "p2p-path", subj, v, NULL, "%s; no ACS redirect on the path",
				 cls);
	}
}

/* ---- uio, io_uring ------------------------------------------------------------------------ */

static inline void upcie_doctor_uio(struct upcie_doctor *d, const char *rel)
{
	int avail;

	if (upcie_doctor_module_loaded_("uio_pci_generic"))
		upcie_doctor_add(d, "uio", "uio_pci_generic", UPCIE_DOCTOR_OK, NULL, "loaded");
	else if ((avail = upcie_doctor_module_available_(rel, "uio_pci_generic")) > 0)
		upcie_doctor_add(d, "uio", "uio_pci_generic", UPCIE_DOCTOR_INFO,
				 "modprobe uio_pci_generic (upcie-setup bind loads it)",
				 "available, not loaded");
	else if (avail == -ENOENT)
		upcie_doctor_add(d, "uio", "uio_pci_generic", UPCIE_DOCTOR_UNKNOWN, NULL,
				 "not loaded; modules of %s unreadable", rel);
	else
		upcie_doctor_add(d, "uio", "uio_pci_generic", UPCIE_DOCTOR_INFO,
				 "a kernel with CONFIG_UIO_PCI_GENERIC",
				 "no uio_pci_generic module for %s", rel);
}

static inline void upcie_doctor_uring(struct upcie_doctor *d)
{
	int err = d->uring_probe ? d->uring_probe() : upcie_uring_dmabuf_probe();

	if (!err)
		upcie_doctor_add(d, "uring", "dmabuf", UPCIE_DOCTOR_OK, NULL,
				 "the kernel registers dma-bufs as io_uring buffers");
	else
		upcie_doctor_add(d, "uring", "dmabuf", UPCIE_DOCTOR_INFO,
				 "a kernel with the io_uring dma-buf registered-buffer series "
				 "(docs/guide-iouring.md)",
				 "the kernel does not register dma-bufs as io_uring buffers (%s)",
				 strerror(err < 0 ? -err : err));
}

/* ---- verdicts per path ------------------------------------------------------------------- */

/* The line (check, subject) or NULL. */
static inline const struct upcie_doctor_line *
upcie_doctor_line_(const struct upcie_doctor *d, const char *check, const char *subject)
{
	for (unsigned i = 0; i < d->n; i++)
		if (!strcmp(d->l[i].check, check) && !strcmp(d->l[i].subject, subject))
			return &d->l[i];
	return NULL;
}

UPCIE_PRINTF(6, 7)
static inline void upcie_doctor_verdict_(struct upcie_doctor *d, const char *path,
					 const char *subject, enum upcie_doctor_state st,
					 const char *fix, const char *fmt, ...)
{
	struct upcie_doctor_line *x;
	va_list ap;

	if (d->np == UPCIE_DOCTOR_MAX_PATHS)
		return;
	x = &d->p[d->np++];
	memset(x, 0, sizeof(*x));
	snprintf(x->check, sizeof(x->check), "%s", path);
	snprintf(x->subject, sizeof(x->subject), "%s", subject ? subject : "");
	snprintf(x->fix, sizeof(x->fix), "%s", fix ? fix : "");
	x->verdict = (enum upcie_doctor_verdict)st;
	va_start(ap, fmt);
	vsnprintf(x->detail, sizeof(x->detail), fmt, ap);
	va_end(ap);
	if (st == UPCIE_DOCTOR_READY)
		d->ready++;
}

static inline const char *upcie_doctor_state_name(enum upcie_doctor_state s)
{
	static const char *const names[] = { "ready", "no", "unknown" };

	return (unsigned)s < 3 ? names[s] : "?";
}

/* A verdict taken from a check line: its detail is the deciding fact, its fix the fix. */
static inline void upcie_doctor_because_(struct upcie_doctor *d, const char *path,
					 const char *subject, enum upcie_doctor_state st,
					 const struct upcie_doctor_line *why, const char *fix)
{
	upcie_doctor_verdict_(d, path, subject, st, fix ? fix : why->fix, "%s%s%s: %s", why->check,
			      why->subject[0] ? " " : "", why->subject, why->detail);
}

/* What the NVMe controllers allow for a path: the first one ready for it, or why none is. */
struct upcie_doctor_pick_ {
	const struct upcie_pci_func *fn;
	const char *why; /* when none */
	char whybuf[160];
};

/*
 * An NVMe controller the path can take: bound to `driver` already, or not in use (bind takes
 * it). iommu: 0 any, 1 needs a group (vfio), 2 needs no translation (uio: none or identity).
 */
static inline void upcie_doctor_choose_(const struct upcie_doctor *d,
					const struct upcie_doctor_fns *f, const char *driver,
					int iommu, struct upcie_doctor_pick_ *pk)
{
	unsigned busy = 0, wrong = 0;

	memset(pk, 0, sizeof(*pk));
	for (int pass = 0; pass < 2 && !pk->fn; pass++) {
		for (unsigned i = 0; i < f->nnvme && !pk->fn; i++) {
			const struct upcie_pci_func *fn = &f->nvme[i];
			const struct upcie_doctor_line *dl =
			    upcie_doctor_line_(d, "driver", fn->name);
			const struct upcie_doctor_line *gl =
			    upcie_doctor_line_(d, "iommu-group", fn->name);
			bool mine = !strcmp(fn->driver, driver);
			bool in_use = dl && strstr(dl->detail, ", in use:");
			bool ok_iommu = iommu == 0 || (iommu == 1 && fn->iommu_group >= 0) ||
					(iommu == 2 && (fn->iommu_group < 0 ||
							(gl && strstr(gl->detail, "identity"))));

			if (pass == 0 ? !mine : mine)
				continue;
			if (!ok_iommu) {
				wrong += pass;
				continue;
			}
			if (pass == 1 && in_use) {
				busy++;
				continue;
			}
			pk->fn = fn;
		}
	}
	if (pk->fn)
		return;
	if (!f->nnvme)
		pk->why = "no NVMe controller (class 010802) on this machine";
	else if (wrong == f->nnvme && iommu == 2)
		pk->why = "every NVMe controller's IOMMU group translates DMA: uio would fault "
			  "(boot with iommu=pt, or use a vfio path)";
	else if (wrong == f->nnvme)
		pk->why = "no NVMe controller has an IOMMU group (no IOMMU: enable it in firmware "
			  "and boot with intel_iommu=on or amd_iommu=on)";
	else {
		snprintf(pk->whybuf, sizeof(pk->whybuf),
			 "every NVMe controller that fits is in use by the system (%u): see the "
			 "driver lines",
			 busy);
		pk->why = pk->whybuf;
	}
}

static inline void upcie_doctor_paths(struct upcie_doctor *d, const struct upcie_doctor_fns *f,
				      int maj, int min)
{
	const struct upcie_doctor_line *hp = upcie_doctor_line_(d, "hugepages", ""),
				       *ml = upcie_doctor_line_(d, "memlock", ""),
				       *t1 = upcie_doctor_line_(d, "vfio", "type1"),
				       *fd = upcie_doctor_line_(d, "vfio", "iommufd"),
				       *uio = upcie_doctor_line_(d, "uio", "uio_pci_generic"),
				       *ur = upcie_doctor_line_(d, "uring", "dmabuf");
	bool huge = hp && hp->verdict == UPCIE_DOCTOR_OK, root = geteuid() == 0;
	bool host_ready = false, vfio_ready = false;
	struct upcie_doctor_pick_ pk;
	unsigned pairs = 0;

	/* uio: physical addresses; root for pagemap; no translation in the controller's group */
	upcie_doctor_choose_(d, f, "uio_pci_generic", 2, &pk);
	if (!pk.fn)
		upcie_doctor_verdict_(d, "uio", NULL, UPCIE_DOCTOR_NO, NULL, "%s", pk.why);
	else if (!uio || (uio->verdict != UPCIE_DOCTOR_OK && uio->verdict != UPCIE_DOCTOR_INFO) ||
		 strstr(uio->detail, "no uio_pci_generic"))
		upcie_doctor_because_(d, "uio", NULL,
				      uio && uio->verdict == UPCIE_DOCTOR_UNKNOWN
					  ? UPCIE_DOCTOR_MAYBE
					  : UPCIE_DOCTOR_NO,
				      uio, NULL);
	else if (!huge)
		upcie_doctor_because_(d, "uio", NULL,
				      hp && hp->verdict == UPCIE_DOCTOR_UNKNOWN ? UPCIE_DOCTOR_MAYBE
										: UPCIE_DOCTOR_NO,
				      hp, NULL);
	else if (!root)
		upcie_doctor_verdict_(
		    d, "uio", NULL, UPCIE_DOCTOR_NO, "run as root",
		    "not root: physical addresses (pagemap) and binding need root");
	else
		upcie_doctor_verdict_(d, "uio", NULL, UPCIE_DOCTOR_READY, NULL,
				      "%s (%s), uio_pci_generic %s, hugepages reserved",
				      pk.fn->name, pk.fn->driver[0] ? pk.fn->driver : "no driver",
				      uio->verdict == UPCIE_DOCTOR_OK ? "loaded" : "available");
	host_ready |= d->np && d->p[d->np - 1].verdict == (enum upcie_doctor_verdict)0;

	/* vfio type1 */
	upcie_doctor_choose_(d, f, "vfio-pci", 1, &pk);
	if (!pk.fn)
		upcie_doctor_verdict_(d, "vfio-type1", NULL, UPCIE_DOCTOR_NO, NULL, "%s", pk.why);
	else if (!t1 || (t1->verdict != UPCIE_DOCTOR_OK && t1->verdict != UPCIE_DOCTOR_INFO))
		upcie_doctor_because_(d, "vfio-type1", NULL,
				      t1 && t1->verdict == UPCIE_DOCTOR_UNKNOWN ? UPCIE_DOCTOR_MAYBE
										: UPCIE_DOCTOR_NO,
				      t1, NULL);
	else if (!huge)
		upcie_doctor_because_(d, "vfio-type1", NULL, UPCIE_DOCTOR_NO, hp, NULL);
	else if (ml && ml->verdict == UPCIE_DOCTOR_WARN)
		upcie_doctor_because_(d, "vfio-type1", NULL, UPCIE_DOCTOR_NO, ml, NULL);
	else
		upcie_doctor_verdict_(d, "vfio-type1", NULL, UPCIE_DOCTOR_READY, NULL,
				      "%s (%s, IOMMU group %d), vfio type1 %s", pk.fn->name,
				      pk.fn->driver[0] ? pk.fn->driver : "no driver",
				      pk.fn->iommu_group,
				      t1->verdict == UPCIE_DOCTOR_OK ? "loaded" : "available");
	if (d->p[d->np - 1].verdict == (enum upcie_doctor_verdict)0)
		host_ready = vfio_ready = true;

	/* vfio cdev + iommufd: 6.6 and /dev/iommu */
	if (!pk.fn)
		upcie_doctor_verdict_(d, "vfio-iommufd", NULL, UPCIE_DOCTOR_NO, NULL, "%s", pk.why);
	else if (maj < 0)
		upcie_doctor_verdict_(d, "vfio-iommufd", NULL, UPCIE_DOCTOR_MAYBE, NULL,
				      "kernel release unreadable");
	else if (maj * 1000 + min < 6006)
		upcie_doctor_verdict_(d, "vfio-iommufd", NULL, UPCIE_DOCTOR_NO,
				      "a kernel >= 6.6 with CONFIG_IOMMUFD and "
				      "CONFIG_VFIO_DEVICE_CDEV",
				      "kernel %d.%d < 6.6: no vfio device cdev", maj, min);
	else if (!fd || (fd->verdict != UPCIE_DOCTOR_OK && !strstr(fd->detail, "available")))
		upcie_doctor_because_(d, "vfio-iommufd", NULL, UPCIE_DOCTOR_NO, fd, NULL);
	else if (!huge)
		upcie_doctor_because_(d, "vfio-iommufd", NULL, UPCIE_DOCTOR_NO, hp, NULL);
	else if (ml && ml->verdict == UPCIE_DOCTOR_WARN)
		upcie_doctor_because_(d, "vfio-iommufd", NULL, UPCIE_DOCTOR_NO, ml, NULL);
	else
		upcie_doctor_verdict_(d, "vfio-iommufd", NULL, UPCIE_DOCTOR_READY, NULL,
				      "%s (IOMMU group %d), /dev/iommu %s, kernel %d.%d",
				      pk.fn->name, pk.fn->iommu_group,
				      fd->verdict == UPCIE_DOCTOR_OK ? "present" : "available", maj,
				      min);
	if (d->p[d->np - 1].verdict == (enum upcie_doctor_verdict)0)
		host_ready = vfio_ready = true;

	/* GPU peer-to-peer, per GPU x NVMe pair: the path between them, the GPU's BAR1, and a BAR
	 * window that overlaps System RAM (gpu-placement fail: the heaps refuse that memory) */
	if (!f->ngpu)
		upcie_doctor_verdict_(d, "gpu-p2p", NULL, UPCIE_DOCTOR_NO, NULL,
				      "no NVIDIA or AMD GPU on this machine");
	else if (!f->nnvme)
		upcie_doctor_verdict_(d, "gpu-p2p", NULL, UPCIE_DOCTOR_NO, NULL,
				      "no NVMe controller on this machine");
	for (unsigned g = 0; g < f->ngpu; g++) {
		const struct upcie_doctor_line *bar =
		    upcie_doctor_line_(d, "gpu-bar1", f->gpu[g].name);
		const struct upcie_doctor_line *place =
		    upcie_doctor_line_(d, "gpu-placement", f->gpu[g].name);

		for (unsigned j = 0; j < f->nnvme; j++) {
			char subj[48];
			const struct upcie_doctor_line *pl;

			(void)upcie_path_fmt(subj, sizeof(subj), "%s<->%s", f->gpu[g].name,
					     f->nvme[j].name);
			pl = upcie_doctor_line_(d, "p2p-path", subj);
			if (!pl)
				continue;
			if (pl->verdict == UPCIE_DOCTOR_FAIL)
				upcie_doctor_because_(d, "gpu-p2p", subj, UPCIE_DOCTOR_NO, pl,
						      "a GPU and an NVMe controller on one socket");
			else if (place && place->verdict == UPCIE_DOCTOR_FAIL)
				upcie_doctor_because_(d, "gpu-p2p", subj, UPCIE_DOCTOR_NO, place,
						      NULL);
			else if (!host_ready)
				upcie_doctor_verdict_(
				    d, "gpu-p2p", subj, UPCIE_DOCTOR_NO,
				    "make one of uio, vfio-type1, vfio-iommufd "
				    "ready",
				    "no host path is ready to drive the controller");
			else if (bar && bar->verdict == UPCIE_DOCTOR_WARN)
				upcie_doctor_because_(d, "gpu-p2p", subj, UPCIE_DOCTOR_MAYBE, bar,
						      NULL);
			else if (pl->verdict != UPCIE_DOCTOR_OK)
				upcie_doctor_because_(d, "gpu-p2p", subj, UPCIE_DOCTOR_MAYBE, pl,
						      "measure it: upcie-perf --gpu BDF");
			else
				upcie_doctor_because_(d, "gpu-p2p", subj, UPCIE_DOCTOR_READY, pl,
						      NULL);
			if (d->p[d->np - 1].verdict == (enum upcie_doctor_verdict)0)
				pairs++;
		}
	}

	/* GPU-issued queues: a GPU kernel writes the doorbells, peer to peer, through a vfio or
	 * uio mapping of BAR0; needs a pair that does P2P and the CUDA driver */
	if (!f->ngpu)
		upcie_doctor_verdict_(d, "gpu-queues", NULL, UPCIE_DOCTOR_NO, NULL,
				      "no NVIDIA or AMD GPU on this machine");
	else if (!pairs)
		upcie_doctor_verdict_(d, "gpu-queues", NULL, UPCIE_DOCTOR_NO,
				      "see the gpu-p2p verdicts",
				      "no GPU x NVMe pair is ready for peer-to-peer");
	else
		upcie_doctor_verdict_(
		    d, "gpu-queues", NULL, UPCIE_DOCTOR_READY, NULL,
		    "%u GPU x NVMe pair%s ready for peer-to-peer%s", pairs, pairs == 1 ? "" : "s",
		    vfio_ready ? "" : " (uio path: GPU memory by physical address)");

	/* io_uring dma-buf: the kernel's own nvme driver does the I/O into a dma-buf */
	{
		const struct upcie_pci_func *kn = NULL;

		for (unsigned i = 0; i < f->nnvme && !kn; i++)
			if (!strcmp(f->nvme[i].driver, "nvme"))
				kn = &f->nvme[i];
		if (!ur || ur->verdict != UPCIE_DOCTOR_OK)
			upcie_doctor_because_(d, "uring-dmabuf", NULL, UPCIE_DOCTOR_NO, ur, NULL);
		else if (!kn)
			upcie_doctor_verdict_(d, "uring-dmabuf", NULL, UPCIE_DOCTOR_NO,
					      "upcie-setup bind BDF nvme",
					      "no NVMe controller is bound to the kernel's nvme "
					      "driver");
		else
			upcie_doctor_verdict_(d, "uring-dmabuf", NULL, UPCIE_DOCTOR_READY, NULL,
					      "%s with the nvme driver, the kernel registers "
					      "dma-bufs",
					      kn->name);
	}
}

/*
 * The exit status of upcie-setup doctor: 3 when no path is ready (nothing upcie does can run
 * here), else 1 when a check failed, else 0.
 */
static inline int upcie_doctor_exit_status(const struct upcie_doctor *d)
{
	if (!d->ready)
		return 3;
	return d->count[UPCIE_DOCTOR_FAIL] ? 1 : 0;
}

/* Run every check. */
static inline void upcie_doctor_run(struct upcie_doctor *d)
{
	struct upcie_doctor_fns *f = (struct upcie_doctor_fns *)calloc(1, sizeof(*f));
	char rel[128] = "";
	int maj = -1, min = -1, level, err;

	if (!f)
		return;
	level = upcie_log_level();
	upcie_log_set_level(UPCIE_LOG_NONE); /* the verdicts say what failed */
	upcie_doctor_kver_(rel, sizeof(rel), &maj, &min);
	upcie_doctor_iommu(d);
	upcie_doctor_vfio(d, rel);
	upcie_doctor_uio(d, rel);
	upcie_doctor_kernel(d, rel, maj, min);
	upcie_doctor_uring(d);
	upcie_doctor_hugepages(d);
	upcie_doctor_memlock(d);
	upcie_doctor_kmods(d);
	err = upcie_pci_scan(upcie_doctor_collect_, f);
	if (err) {
		upcie_doctor_add(d, "pci", "", UPCIE_DOCTOR_UNKNOWN, NULL,
				 "cannot list PCI functions (%s)", strerror(-err));
	} else {
		if (!f->nnvme)
			upcie_doctor_add(d, "nvme", "", UPCIE_DOCTOR_INFO, NULL,
					 "no NVMe controller (class 010802) found");
		for (unsigned i = 0; i < f->nnvme; i++) {
			upcie_doctor_driver(d, &f->nvme[i]);
			upcie_doctor_group(d, &f->nvme[i]);
		}
		if (!f->ngpu)
			upcie_doctor_add(d, "gpu", "", UPCIE_DOCTOR_INFO, NULL,
					 "no NVIDIA or AMD GPU found");
		for (unsigned i = 0; i < f->ngpu; i++) {
			upcie_doctor_gpu(d, &f->gpu[i]);
			upcie_doctor_placement(d, &f->gpu[i]);
			upcie_doctor_group(d, &f->gpu[i]);
			for (unsigned j = 0; j < f->nnvme; j++)
				upcie_doctor_path(d, &f->gpu[i], &f->nvme[j]);
		}
		upcie_doctor_paths(d, f, maj, min);
	}
	upcie_log_set_level((enum upcie_log_level)level);
	free(f);
}

static inline void upcie_doctor_json_str_(FILE *o, const char *s)
{
	fputc('"', o);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(o, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(o, "\\u%04x", (unsigned char)*s);
		else
			fputc(*s, o);
	}
	fputc('"', o);
}

static inline void upcie_doctor_print(const struct upcie_doctor *d, FILE *o, bool json)
{
	if (!json) {
		/* the answers first, then the facts they come from */
		for (unsigned i = 0; i < d->np; i++) {
			const struct upcie_doctor_line *x = &d->p[i];

			fprintf(o, "path: %-13s%s%s %-8s %s%s%s\n", x->check,
				x->subject[0] ? " " : "", x->subject,
				upcie_doctor_state_name((enum upcie_doctor_state)x->verdict),
				x->detail, x->fix[0] ? " -> " : "", x->fix);
		}
		for (unsigned i = 0; i < d->n; i++) {
			const struct upcie_doctor_line *x = &d->l[i];

			fprintf(o, "%-8s %-12s %s%s%s%s%s\n", upcie_doctor_verdict_name(x->verdict),
				x->check, x->subject, x->subject[0] ? ": " : "", x->detail,
				x->fix[0] ? " -> " : "", x->fix);
		}
		fprintf(o,
			"%u ok, %u info, %u warn, %u fail, %u unknown; %u path%s ready (exit %d)\n",
			d->count[0], d->count[1], d->count[2], d->count[3], d->count[4], d->ready,
			d->ready == 1 ? "" : "s", upcie_doctor_exit_status(d));
		return;
	}
	fprintf(o, "{\"schema\": %d, \"paths\": [", UPCIE_DOCTOR_SCHEMA);
	for (unsigned i = 0; i < d->np; i++) {
		const struct upcie_doctor_line *x = &d->p[i];

		fprintf(o, "%s\n  {\"path\": ", i ? "," : "");
		upcie_doctor_json_str_(o, x->check);
		fprintf(o, ", \"subject\": ");
		upcie_doctor_json_str_(o, x->subject);
		fprintf(o, ", \"state\": \"%s\", \"fact\": ",
			upcie_doctor_state_name((enum upcie_doctor_state)x->verdict));
		upcie_doctor_json_str_(o, x->detail);
		fprintf(o, ", \"fix\": ");
		upcie_doctor_json_str_(o, x->fix);
		fprintf(o, "}");
	}
	fprintf(o, "\n], \"checks\": [");
	for (unsigned i = 0; i < d->n; i++) {
		const struct upcie_doctor_line *x = &d->l[i];

		fprintf(o, "%s\n  {\"check\": ", i ? "," : "");
		upcie_doctor_json_str_(o, x->check);
		fprintf(o, ", \"subject\": ");
		upcie_doctor_json_str_(o, x->subject);
		fprintf(o, ", \"verdict\": \"%s\", \"detail\": ",
			upcie_doctor_verdict_name(x->verdict));
		upcie_doctor_json_str_(o, x->detail);
		fprintf(o, ", \"fix\": ");
		upcie_doctor_json_str_(o, x->fix);
		fprintf(o, "}");
	}
	fprintf(o,
		"\n], \"summary\": {\"ok\": %u, \"info\": %u, \"warn\": %u, \"fail\": %u, "
		"\"unknown\": %u, \"ready\": %u}, \"exit\": %d}\n",
		d->count[0], d->count[1], d->count[2], d->count[3], d->count[4], d->ready,
		upcie_doctor_exit_status(d));
}

#endif /* UPCIE_TOOLS_DOCTOR_H */
