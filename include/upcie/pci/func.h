/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * PCI function information from sysfs: ids, class, driver, IOMMU group, NUMA node, resources;
 * and a scan over every function in the system.
 *
 * Reads /sys/bus/pci/devices/<bdf>/ and the function's IOMMU group under /sys/kernel/iommu_groups
 * (the root is upcie_sysfs_root(), so tests can use a fake tree). Needs no privileges. Does not
 * change anything: binding lives in pci/driver.h, BAR mapping in pci/bar.h, config space and
 * resets in pci/config.h, /dev/uioN in pci/uio.h.
 */
#ifndef UPCIE_PCI_FUNC_H
#define UPCIE_PCI_FUNC_H

#include <upcie/base/feature.h>

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/base/sysfs.h>
#include <upcie/pci/bdf.h>

/* BARs 0-5 and the expansion ROM (index 6), as sysfs "resource" lists them. */
#define UPCIE_PCI_NUM_BARS  6
#define UPCIE_PCI_NUM_RES   7
#define UPCIE_PCI_ROM_INDEX 6

/* Resource flags (kernel IORESOURCE_* values as sysfs prints them). */
#define UPCIE_PCI_RES_IO       0x00000100u
#define UPCIE_PCI_RES_MEM      0x00000200u
#define UPCIE_PCI_RES_PREFETCH 0x00002000u
#define UPCIE_PCI_RES_MEM64    0x00100000u

struct upcie_pci_resource {
	uint64_t start; /* CPU physical address; 0 with size 0 when not implemented */
	uint64_t size;
	uint64_t flags; /* UPCIE_PCI_RES_* */
};

struct upcie_pci_func {
	struct upcie_pci_bdf bdf;
	char name[UPCIE_PCI_BDF_STRLEN]; /* "dddd:bb:dd.f" */
	uint16_t vendor, device;
	uint16_t subsys_vendor, subsys_device;
	uint32_t class_code; /* 24 bits: base class, subclass, prog-if (NVMe: 0x010802) */
	uint8_t revision;
	char driver[64]; /* bound driver, "" when none */
	int iommu_group; /* -1 when the function has none (no IOMMU) */
	int numa_node;	 /* -1 when unknown */
	struct upcie_pci_resource res[UPCIE_PCI_NUM_RES];
};

#define UPCIE_PCI_CLASS_NVME 0x010802u

/*
 * Bytes for the domain type word of upcie_pci_func_iommu(): the kernel's words ("identity",
 * "DMA-FQ", "unmanaged", ...) are short; longer text in the type file is cut to fit.
 */
#define UPCIE_PCI_IOMMU_TYPE_LEN 32

/* How the IOMMU treats a function's DMA (upcie_pci_func_iommu()). */
enum upcie_pci_iommu {
	UPCIE_PCI_IOMMU_NONE = 0,	  /* no IOMMU group: the device sees physical addresses */
	UPCIE_PCI_IOMMU_IDENTITY = 1,	  /* passthrough (iommu=pt): it sees physical addresses */
	UPCIE_PCI_IOMMU_TRANSLATED = 2,	  /* DMA, DMA-FQ, unmanaged, blocked: through a table */
	UPCIE_PCI_IOMMU_VFIO_NOIOMMU = 3, /* a group vfio made up in no-IOMMU mode: none really */
	UPCIE_PCI_IOMMU_UNKNOWN = 4,	  /* a group whose domain type the kernel does not say */
};

/*
 * Suffix for a message about a failed sysfs write: says what to do when sysfs is read-only, as
 * in most containers (the write fails with EROFS there); "" for other errors.
 */
static inline const char *upcie_pci_sysfs_hint_(int err)
{
	if (err == -EROFS)
		return " (sysfs is read-only here, as in a container: bind the function and "
		       "reserve "
		       "hugepages on the host with upcie-setup, then open it without the bind "
		       "option; on the uio path bus mastering also needs a writable /sys, the vfio "
		       "paths do not)";
	if (err == -EACCES || err == -EPERM)
		return " (needs root)";
	return "";
}

/* Path of attribute `attr` of function `bdf` ("" attr gives the function's directory). */
static inline int upcie_pci_func_path(const struct upcie_pci_bdf *bdf, const char *attr, char *buf,
				      size_t len)
{
	char name[UPCIE_PCI_BDF_STRLEN];

	upcie_pci_bdf_format(bdf, name, sizeof(name));
	return upcie_path_fmt(buf, len, "%s/bus/pci/devices/%s%s%s", upcie_sysfs_root(), name,
			      *attr ? "/" : "", attr);
}

/* 0 when the function exists, -ENODEV (with a message) when it does not. */
static inline int upcie_pci_func_exists(const struct upcie_pci_bdf *bdf)
{
	char path[PATH_MAX], name[UPCIE_PCI_BDF_STRLEN];
	struct stat st;
	int err = upcie_pci_func_path(bdf, "", path, sizeof(path));

	if (err)
		return err;
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
		return 0;
	upcie_pci_bdf_format(bdf, name, sizeof(name));
	return UPCIE_FAIL(-ENODEV, "pci: no PCI function %s (%s does not exist)", name, path);
}

/* Basename of the symlink `attr` of the function into buf; "" with 0 when the link is absent. */
static inline int upcie_pci_func_link_name(const struct upcie_pci_bdf *bdf, const char *attr,
					   char *buf, size_t len)
{
	char path[PATH_MAX], target[PATH_MAX];
	const char *base;
	ssize_t n;
	int err = upcie_pci_func_path(bdf, attr, path, sizeof(path));

	if (err)
		return err;
	n = readlink(path, target, sizeof(target) - 1);
	if (n < 0) {
		if (errno == ENOENT) {
			if (len)
				buf[0] = '\0';
			return 0;
		}
		return -errno;
	}
	target[n] = '\0';
	base = strrchr(target, '/');
	base = base ? base + 1 : target;
	if (strlen(base) >= len)
		return -ENAMETOOLONG;
	strcpy(buf, base);
	return 0;
}

static inline int upcie_pci_func_read_u64_(const struct upcie_pci_bdf *bdf, const char *attr,
					   uint64_t *val)
{
	char path[PATH_MAX];
	int err = upcie_pci_func_path(bdf, attr, path, sizeof(path));

	return err ? err : upcie_file_read_u64(path, val);
}

/* Parse the sysfs "resource" file of the function into res[UPCIE_PCI_NUM_RES]. */
static inline int upcie_pci_func_resources(const struct upcie_pci_bdf *bdf,
					   struct upcie_pci_resource *res)
{
	char path[PATH_MAX], line[128];
	FILE *f;
	int err = upcie_pci_func_path(bdf, "resource", path, sizeof(path));

	if (err)
		return err;
	f = fopen(path, "re");
	if (!f)
		return -errno;
	memset(res, 0, sizeof(*res) * UPCIE_PCI_NUM_RES);
	for (int i = 0; i < UPCIE_PCI_NUM_RES && fgets(line, sizeof(line), f); i++) {
		unsigned long long start, end, flags;

		if (sscanf(line, "%llx %llx %llx", &start, &end, &flags) != 3) {
			fclose(f);
			return -EINVAL;
		}
		if (end > start || (start && end == start)) {
			res[i].start = start;
			res[i].size = end - start + 1;
		}
		res[i].flags = flags;
	}
	fclose(f);
	return 0;
}

/* An IOMMU group number: decimal digits only, at most INT_MAX; -1 for anything else. */
static inline int64_t upcie_pci_group_num_(const char *s)
{
	int64_t v = 0;

	if (!*s)
		return -1;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		v = v * 10 + (*s - '0');
		if (v > INT_MAX)
			return -1;
	}
	return v;
}

/*
 * Read everything sysfs says about `bdf` into *fn. Returns 0, -ENODEV when the function does not
 * exist, -EINVAL when an attribute does not parse (the iommu_group link must name a decimal
 * group number), or another -errno when sysfs is unreadable.
 */
static inline int upcie_pci_func_read(const struct upcie_pci_bdf *bdf, struct upcie_pci_func *fn)
{
	char buf[64], path[PATH_MAX];
	uint64_t v;
	int64_t node;
	int err;

	memset(fn, 0, sizeof(*fn));
	err = upcie_pci_func_exists(bdf);
	if (err)
		return err;
	fn->bdf = *bdf;
	upcie_pci_bdf_format(bdf, fn->name, sizeof(fn->name));

	err = upcie_pci_func_read_u64_(bdf, "vendor", &v);
	if (err)
		goto fail;
	fn->vendor = (uint16_t)v;
	err = upcie_pci_func_read_u64_(bdf, "device", &v);
	if (err)
		goto fail;
	fn->device = (uint16_t)v;
	err = upcie_pci_func_read_u64_(bdf, "class", &v);
	if (err)
		goto fail;
	fn->class_code = (uint32_t)v & 0xffffffu;
	/* Optional attributes: absent on some kernels or fake trees. */
	if (!upcie_pci_func_read_u64_(bdf, "subsystem_vendor", &v))
		fn->subsys_vendor = (uint16_t)v;
	if (!upcie_pci_func_read_u64_(bdf, "subsystem_device", &v))
		fn->subsys_device = (uint16_t)v;
	if (!upcie_pci_func_read_u64_(bdf, "revision", &v))
		fn->revision = (uint8_t)v;
	fn->numa_node = -1;
	if (!upcie_pci_func_path(bdf, "numa_node", path, sizeof(path)) &&
	    !upcie_file_read_s64(path, &node))
		fn->numa_node = (int)node;
	err = upcie_pci_func_link_name(bdf, "driver", fn->driver, sizeof(fn->driver));
	if (err)
		goto fail;
	err = upcie_pci_func_link_name(bdf, "iommu_group", buf, sizeof(buf));
	if (err)
		goto fail;
	fn->iommu_group = -1;
	if (buf[0]) {
		int64_t g = upcie_pci_group_num_(buf);

		if (g < 0) {
			err = -EINVAL;
			return UPCIE_FAIL(
			    err, "pci: %s: iommu_group link names '%s', not a group number",
			    fn->name, buf);
		}
		fn->iommu_group = (int)g;
	}
	err = upcie_pci_func_resources(bdf, fn->res);
	if (err && err != -ENOENT)
		goto fail;
	return 0;
fail:
	return UPCIE_FAIL(err, "pci: %s: reading sysfs attributes failed: %s", fn->name,
			  strerror(-err));
}

/*
 * How the IOMMU treats the DMA of `bdf`, from its IOMMU group's name and type
 * (<sysfs>/kernel/iommu_groups/<n>/{name,type}); *group gets the group id or -1, and `type`
 * (optional, len bytes: UPCIE_PCI_IOMMU_TYPE_LEN holds any) the kernel's word for the domain
 * ("identity", "DMA-FQ", ...). 0,
 * -EINVAL when the iommu_group link does not name a group number, -ENODEV, or -errno reading
 * sysfs.
 */
static inline int upcie_pci_func_iommu(const struct upcie_pci_bdf *bdf, enum upcie_pci_iommu *mode,
				       int *group, char *type, size_t len)
{
	char path[PATH_MAX], buf[64], name[64] = "", t[UPCIE_PCI_IOMMU_TYPE_LEN] = "";
	int err = upcie_pci_func_exists(bdf);

	if (err)
		return err;
	*mode = UPCIE_PCI_IOMMU_NONE;
	if (group)
		*group = -1;
	if (type && len)
		type[0] = '\0';
	err = upcie_pci_func_link_name(bdf, "iommu_group", buf, sizeof(buf));
	if (err)
		return err;
	if (!buf[0])
		return 0;
	if (upcie_pci_group_num_(buf) < 0) {
		upcie_pci_bdf_format(bdf, name, sizeof(name));
		return UPCIE_FAIL(
		    -EINVAL, "pci: %s: iommu_group link names '%s', not a group number", name, buf);
	}
	if (group)
		*group = (int)upcie_pci_group_num_(buf);
	if (!upcie_path_fmt(path, sizeof(path), "%s/kernel/iommu_groups/%s/name",
			    upcie_sysfs_root(), buf))
		upcie_file_read_str(path, name, sizeof(name));
	if (!upcie_path_fmt(path, sizeof(path), "%s/kernel/iommu_groups/%s/type",
			    upcie_sysfs_root(), buf))
		upcie_file_read_str(path, t, sizeof(t));
	if (type && len)
		snprintf(type, len, "%s", t[0] ? t : "unknown");
	if (!strcmp(name, "vfio-noiommu"))
		*mode = UPCIE_PCI_IOMMU_VFIO_NOIOMMU;
	else if (!strcmp(t, "identity"))
		*mode = UPCIE_PCI_IOMMU_IDENTITY;
	else if (!strcmp(t, "DMA") || !strcmp(t, "DMA-FQ") || !strcmp(t, "unmanaged") ||
		 !strcmp(t, "blocked"))
		*mode = UPCIE_PCI_IOMMU_TRANSLATED;
	else
		*mode = UPCIE_PCI_IOMMU_UNKNOWN;
	return 0;
}

static inline int upcie_pci_name_cmp_(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Called for each function in BDF order; a non-zero return stops the scan and is returned. */
typedef int (*upcie_pci_scan_fn)(const struct upcie_pci_func *fn, void *ctx);

/*
 * Visit every PCI function in the system in BDF order. Returns 0, the callback's non-zero value,
 * or -errno (no PCI bus in sysfs: -ENOENT; out of memory: -ENOMEM).
 */
static inline int upcie_pci_scan(upcie_pci_scan_fn cb, void *ctx)
{
	char path[PATH_MAX];
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	DIR *d;
	int err;

	err = upcie_path_fmt(path, sizeof(path), "%s/bus/pci/devices", upcie_sysfs_root());
	if (err)
		return err;
	d = opendir(path);
	if (!d)
		return UPCIE_FAIL(-errno, "pci: cannot list %s: %s", path, strerror(errno));
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 32;
			char **nn = (char **)realloc(names, ncap * sizeof(*names));

			if (!nn) {
				err = -ENOMEM;
				goto out;
			}
			names = nn;
			cap = ncap;
		}
		names[n] = strdup(de->d_name);
		if (!names[n]) {
			err = -ENOMEM;
			goto out;
		}
		n++;
	}
	qsort(names, n, sizeof(*names), upcie_pci_name_cmp_);
	for (size_t i = 0; i < n && !err; i++) {
		struct upcie_pci_bdf bdf;
		struct upcie_pci_func fn;

		/* Entries that are not PCI addresses, or vanish meanwhile, are skipped. */
		if (upcie_pci_bdf_parse_quiet_(names[i], &bdf))
			continue;
		if (upcie_pci_func_read(&bdf, &fn))
			continue;
		err = cb(&fn, ctx);
	}
out:
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	closedir(d);
	return err;
}

#endif /* UPCIE_PCI_FUNC_H */
