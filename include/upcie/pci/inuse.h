/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Is the system using a PCI function? Before a function is taken from its driver (bound to
 * uio_pci_generic or vfio-pci), find what unbinding would pull from under the system: its block
 * devices and partitions that are mounted, used as swap or held by md, LVM or device-mapper;
 * its network interfaces that are up with a global address or a default route; and the same for
 * the other functions of its IOMMU group, which vfio takes along.
 *
 * Facts come from sysfs (block devices are found by where their sysfs entries live, including
 * NVMe multipath heads through their multipath/ links; holders/, net/, iommu_group/devices/)
 * and procfs (self/mountinfo, swaps, net/route, net/ipv6_route, net/if_inet6): both roots can
 * be moved for tests (UPCIE_SYSFS_ROOT, UPCIE_PROCFS_ROOT). IPv4 addresses are only known
 * through getifaddrs(), so they are looked up with the real procfs only. A fact that cannot be
 * read is reported as unknown, never as "not in use".
 *
 * upcie_pci_inuse_refuse() is the guard: -EBUSY with a message naming what is in use, unless the
 * caller forces it (a flag of the caller's, e.g. `upcie-setup bind --force`) or the environment
 * says UPCIE_ALLOW_IN_USE=1. Needs no privileges (it only reads). Does not: look at files held
 * open on a raw block device without a mount, or at users of a GPU or other device class.
 */
#ifndef UPCIE_PCI_INUSE_H
#define UPCIE_PCI_INUSE_H

#include <upcie/base/feature.h>

#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/base/sysfs.h>
#include <upcie/pci/bdf.h>
#include <upcie/pci/func.h>

#define UPCIE_PCI_INUSE_MAX 16
#define UPCIE_PCI_INUSE_ENV "UPCIE_ALLOW_IN_USE"

enum upcie_pci_use_kind {
	UPCIE_PCI_USE_MOUNT = 0,  /* a block device or partition is mounted */
	UPCIE_PCI_USE_SWAP = 1,	  /* ... is active swap */
	UPCIE_PCI_USE_HOLDER = 2, /* ... is held by md, LVM or device-mapper */
	UPCIE_PCI_USE_NET = 3,	  /* a network interface is up with an address or default route */
};

struct upcie_pci_use {
	enum upcie_pci_use_kind kind;
	char func[UPCIE_PCI_BDF_STRLEN]; /* the function: the one asked about, or a group sibling */
	char what[160];			 /* e.g. "nvme0n1p2 is mounted on /" */
};

struct upcie_pci_inuse {
	unsigned n; /* uses found; the first UPCIE_PCI_INUSE_MAX are kept */
	struct upcie_pci_use use[UPCIE_PCI_INUSE_MAX];
	unsigned nblock;    /* block devices and partitions found (in use or not) */
	unsigned nnet;	    /* network interfaces found */
	unsigned nsiblings; /* other functions in the IOMMU group */
	bool unknown;	    /* a fact could not be read: see unknown_what */
	char unknown_what[160];
};

/* Root of procfs: $UPCIE_PROCFS_ROOT, or "/proc". */
static inline const char *upcie_procfs_root(void)
{
	const char *root = getenv("UPCIE_PROCFS_ROOT");

	return (root && *root) ? root : "/proc";
}

/* Record a use (formatted; a long name is cut, never overflows). */
UPCIE_PRINTF(4, 5)
static inline void upcie_pci_inuse_add_(struct upcie_pci_inuse *u, enum upcie_pci_use_kind kind,
					const char *func, const char *fmt, ...)
{
	va_list ap;

	if (u->n < UPCIE_PCI_INUSE_MAX) {
		struct upcie_pci_use *x = &u->use[u->n];

		x->kind = kind;
		snprintf(x->func, sizeof(x->func), "%s", func);
		va_start(ap, fmt);
		vsnprintf(x->what, sizeof(x->what), fmt, ap);
		va_end(ap);
	}
	u->n++;
}

/* Record the first fact that could not be read. */
UPCIE_PRINTF(2, 3)
static inline void upcie_pci_inuse_unknown_(struct upcie_pci_inuse *u, const char *fmt, ...)
{
	va_list ap;

	if (!u->unknown) {
		va_start(ap, fmt);
		vsnprintf(u->unknown_what, sizeof(u->unknown_what), fmt, ap);
		va_end(ap);
	}
	u->unknown = true;
}

/* Is `path` (a realpath) `dir` itself or below it? */
static inline bool upcie_path_under_(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	return !strncmp(path, dir, n) && (path[n] == '/' || path[n] == '\0');
}

/* Mount points of block device `name` (dev "maj:min") from mountinfo; appends uses. */
static inline void upcie_pci_inuse_mounts_(struct upcie_pci_inuse *u, const char *func,
					   const char *name, const char *dev)
{
	char path[PATH_MAX], line[4096], devpath[128];
	FILE *f;

	if (upcie_path_fmt(path, sizeof(path), "%s/self/mountinfo", upcie_procfs_root()) ||
	    !(f = fopen(path, "re"))) {
		upcie_pci_inuse_unknown_(u, "mounts (cannot read /proc/self/mountinfo)");
		return;
	}
	snprintf(devpath, sizeof(devpath), "/dev/%s", name);
	while (fgets(line, sizeof(line), f)) {
		char mm[32], mnt[2048], *sep, src[1024] = "";

		if (sscanf(line, "%*s %*s %31s %*s %2047s", mm, mnt) != 2)
			continue;
		sep = strstr(line, " - ");
		if (sep)
			sscanf(sep + 3, "%*s %1023s", src);
		if ((dev[0] && !strcmp(mm, dev)) || !strcmp(src, devpath))
			upcie_pci_inuse_add_(u, UPCIE_PCI_USE_MOUNT, func, "%s is mounted on %s",
					     name, mnt);
	}
	fclose(f);
}

static inline void upcie_pci_inuse_swaps_(struct upcie_pci_inuse *u, const char *func,
					  const char *name)
{
	char path[PATH_MAX], line[1024], file[1024];
	FILE *f;

	if (upcie_path_fmt(path, sizeof(path), "%s/swaps", upcie_procfs_root()) ||
	    !(f = fopen(path, "re"))) {
		upcie_pci_inuse_unknown_(u, "swap (cannot read /proc/swaps)");
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		const char *base;

		if (sscanf(line, "%1023s", file) != 1 || file[0] != '/')
			continue;
		base = strrchr(file, '/') + 1;
		if (!strcmp(base, name))
			upcie_pci_inuse_add_(u, UPCIE_PCI_USE_SWAP, func, "%s is active swap",
					     name);
	}
	fclose(f);
}

static inline void upcie_pci_inuse_holders_(struct upcie_pci_inuse *u, const char *func,
					    const char *name)
{
	char path[PATH_MAX], dmname[128];
	struct dirent *de;
	DIR *d;

	if (upcie_path_fmt(path, sizeof(path), "%s/class/block/%s/holders", upcie_sysfs_root(),
			   name) ||
	    !(d = opendir(path)))
		return; /* no holders directory: nothing can hold it */
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		dmname[0] = '\0';
		if (!upcie_path_fmt(path, sizeof(path), "%s/class/block/%s/dm/name",
				    upcie_sysfs_root(), de->d_name))
			upcie_file_read_str(path, dmname, sizeof(dmname));
		upcie_pci_inuse_add_(u, UPCIE_PCI_USE_HOLDER, func, "%s is held by %s%s%s%s", name,
				     de->d_name, dmname[0] ? " (" : "", dmname,
				     dmname[0] ? ")" : "");
	}
	closedir(d);
}

/* Block devices whose sysfs entry lies under the function's directory `fdir` (a realpath). */
static inline void upcie_pci_inuse_block_(struct upcie_pci_inuse *u, const char *func,
					  const char *fdir)
{
	char cls[PATH_MAX], path[PATH_MAX], real[PATH_MAX], dev[32];
	char(*ours)[PATH_MAX] = NULL;
	char(*names)[NAME_MAX + 1] = NULL;
	unsigned n = 0, cap = 0;
	struct dirent *de;
	DIR *d;

	if (upcie_path_fmt(cls, sizeof(cls), "%s/class/block", upcie_sysfs_root()) ||
	    !(d = opendir(cls))) {
		upcie_pci_inuse_unknown_(u, "block devices (cannot list /sys/class/block)");
		return;
	}
	/* two passes: disks below the function (or multipath heads with a path below it), then
	 * whatever lies below those (partitions of a head live under the head) */
	for (int pass = 0; pass < 2; pass++) {
		rewinddir(d);
		while ((de = readdir(d))) {
			bool mine = false;

			if (de->d_name[0] == '.' ||
			    upcie_path_fmt(path, sizeof(path), "%s/%s", cls, de->d_name) ||
			    !realpath(path, real))
				continue;
			for (unsigned i = 0; i < n; i++)
				if (!strcmp(names[i], de->d_name))
					goto next;
			if (pass == 0) {
				mine = upcie_path_under_(real, fdir);
				if (!mine) {
					char mp[PATH_MAX], mreal[PATH_MAX];
					struct dirent *me;
					DIR *md;

					if (!upcie_path_fmt(mp, sizeof(mp), "%s/multipath", path) &&
					    (md = opendir(mp))) {
						while (!mine && (me = readdir(md))) {
							char lp[PATH_MAX];

							if (me->d_name[0] == '.' ||
							    upcie_path_fmt(lp, sizeof(lp), "%s/%s",
									   mp, me->d_name) ||
							    !realpath(lp, mreal))
								continue;
							mine = upcie_path_under_(mreal, fdir);
						}
						closedir(md);
					}
				}
			} else {
				for (unsigned i = 0; i < n && !mine; i++)
					mine = upcie_path_under_(real, ours[i]);
			}
			if (!mine)
				continue;
			if (n == cap) {
				unsigned ncap = cap ? cap * 2 : 8;
				void *a = realloc(ours, ncap * sizeof(*ours));

				if (!a)
					break;
				ours = (char(*)[PATH_MAX])a;
				a = realloc(names, ncap * sizeof(*names));
				if (!a)
					break;
				names = (char(*)[NAME_MAX + 1]) a;
				cap = ncap;
			}
			snprintf(ours[n], PATH_MAX, "%s", real);
			snprintf(names[n], NAME_MAX + 1, "%s", de->d_name);
			n++;
		next:;
		}
	}
	closedir(d);
	for (unsigned i = 0; i < n; i++) {
		dev[0] = '\0';
		if (!upcie_path_fmt(path, sizeof(path), "%s/dev", ours[i]))
			upcie_file_read_str(path, dev, sizeof(dev));
		upcie_pci_inuse_mounts_(u, func, names[i], dev);
		upcie_pci_inuse_swaps_(u, func, names[i]);
		upcie_pci_inuse_holders_(u, func, names[i]);
	}
	u->nblock += n;
	free(ours);
	free(names);
}

/* Does `ifname` carry a default route (IPv4 /proc/net/route, IPv6 /proc/net/ipv6_route)? */
static inline int upcie_pci_inuse_defroute_(const char *ifname)
{
	char path[PATH_MAX], line[512], ifc[IFNAMSIZ + 1], dst[64];
	unsigned plen, flags;
	int found = 0, readable = 0;
	FILE *f;

	if (!upcie_path_fmt(path, sizeof(path), "%s/net/route", upcie_procfs_root()) &&
	    (f = fopen(path, "re"))) {
		readable = 1;
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, "%16s %63s %*s %x", ifc, dst, &flags) == 3 &&
			    !strcmp(ifc, ifname) && !strcmp(dst, "00000000") && (flags & 1))
				found = 1;
		fclose(f);
	}
	if (!upcie_path_fmt(path, sizeof(path), "%s/net/ipv6_route", upcie_procfs_root()) &&
	    (f = fopen(path, "re"))) {
		readable = 1;
		while (fgets(line, sizeof(line), f)) {
			char *last = strrchr(line, ' ');

			if (sscanf(line, "%63s %x", dst, &plen) != 2 || !last)
				continue;
			sscanf(last + 1, "%16s", ifc);
			if (plen == 0 && !strcmp(ifc, ifname) &&
			    !strcmp(dst, "00000000000000000000000000000000"))
				found = 1;
		}
		fclose(f);
	}
	return readable ? found : -ENOENT;
}

/* A global address on `ifname`: IPv6 from /proc/net/if_inet6, IPv4 through getifaddrs(). */
static inline int upcie_pci_inuse_addr_(const char *ifname, char *addr, size_t len)
{
	char path[PATH_MAX], line[256], a[40], ifc[IFNAMSIZ + 1];
	unsigned scope;
	int readable = 0;
	FILE *f;

	if (!upcie_path_fmt(path, sizeof(path), "%s/net/if_inet6", upcie_procfs_root()) &&
	    (f = fopen(path, "re"))) {
		readable = 1;
		while (fgets(line, sizeof(line), f)) {
			if (sscanf(line, "%39s %*x %*x %x %*x %16s", a, &scope, ifc) == 3 &&
			    !strcmp(ifc, ifname) && scope == 0) {
				snprintf(addr, len, "IPv6 %s", a);
				fclose(f);
				return 1;
			}
		}
		fclose(f);
	}
	if (!strcmp(upcie_procfs_root(), "/proc")) {
		struct ifaddrs *ifa, *p;

		if (getifaddrs(&ifa) == 0) {
			readable = 1;
			for (p = ifa; p; p = p->ifa_next) {
				if (p->ifa_addr && p->ifa_addr->sa_family == AF_INET &&
				    !strcmp(p->ifa_name, ifname)) {
					const unsigned char *b =
					    (const unsigned char *)&p->ifa_addr->sa_data[2];

					snprintf(addr, len, "IPv4 %u.%u.%u.%u", b[0], b[1], b[2],
						 b[3]);
					freeifaddrs(ifa);
					return 1;
				}
			}
			freeifaddrs(ifa);
		}
	}
	return readable ? 0 : -ENOENT;
}

/* Network interfaces of the function (its net/ directory). */
static inline void upcie_pci_inuse_net_(struct upcie_pci_inuse *u, const char *func,
					const char *fdir)
{
	char path[PATH_MAX], addr[64];
	struct dirent *de;
	DIR *d;

	if (upcie_path_fmt(path, sizeof(path), "%s/net", fdir) || !(d = opendir(path)))
		return; /* no net/ directory: no interfaces */
	while ((de = readdir(d))) {
		uint64_t flags;
		int r, a;

		if (de->d_name[0] == '.')
			continue;
		u->nnet++;
		if (upcie_path_fmt(path, sizeof(path), "%s/net/%s/flags", fdir, de->d_name) ||
		    upcie_file_read_u64(path, &flags)) {
			upcie_pci_inuse_unknown_(u, "interface %s (cannot read its flags)",
						 de->d_name);
			continue;
		}
		if (!(flags & IFF_UP))
			continue;
		r = upcie_pci_inuse_defroute_(de->d_name);
		a = upcie_pci_inuse_addr_(de->d_name, addr, sizeof(addr));
		if (r > 0 || a > 0) {
			upcie_pci_inuse_add_(u, UPCIE_PCI_USE_NET, func,
					     "network interface %s is up%s%s%s", de->d_name,
					     a > 0 ? " with address " : "", a > 0 ? addr : "",
					     r > 0 ? " and carries the default route" : "");
		} else if (r < 0 && a < 0) {
			upcie_pci_inuse_unknown_(u,
						 "interface %s is up (routes and addresses "
						 "unreadable)",
						 de->d_name);
		}
	}
	closedir(d);
}

/* What uses function `name` itself (no siblings). */
static inline int upcie_pci_inuse_func_(struct upcie_pci_inuse *u, const struct upcie_pci_bdf *bdf)
{
	char path[PATH_MAX], fdir[PATH_MAX], name[UPCIE_PCI_BDF_STRLEN];
	int err = upcie_pci_func_path(bdf, "", path, sizeof(path));

	if (err)
		return err;
	upcie_pci_bdf_format(bdf, name, sizeof(name));
	if (!realpath(path, fdir))
		return -errno == -ENOENT ? -ENODEV : -errno;
	upcie_pci_inuse_block_(u, name, fdir);
	upcie_pci_inuse_net_(u, name, fdir);
	return 0;
}

/*
 * Find what the system uses of function `bdf` and, with `siblings`, of the other functions in
 * its IOMMU group. Returns 0 (out->n uses found; out->unknown when a fact could not be read),
 * -ENODEV when there is no such function, or -EINVAL.
 */
static inline int upcie_pci_inuse_scan(const struct upcie_pci_bdf *bdf, bool siblings,
				       struct upcie_pci_inuse *out)
{
	char path[PATH_MAX], name[UPCIE_PCI_BDF_STRLEN];
	struct dirent *de;
	DIR *d;
	int err;

	if (!bdf || !out)
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	err = upcie_pci_inuse_func_(out, bdf);
	if (err)
		return err;
	if (!siblings)
		return 0;
	upcie_pci_bdf_format(bdf, name, sizeof(name));
	if (upcie_pci_func_path(bdf, "iommu_group/devices", path, sizeof(path)) ||
	    !(d = opendir(path)))
		return 0; /* no IOMMU group: no siblings */
	while ((de = readdir(d))) {
		struct upcie_pci_bdf sib;

		if (de->d_name[0] == '.' || !strcmp(de->d_name, name) ||
		    upcie_pci_bdf_parse_quiet_(de->d_name, &sib))
			continue;
		out->nsiblings++;
		upcie_pci_inuse_func_(out, &sib);
	}
	closedir(d);
	return 0;
}

/* One line naming every use found (and what could not be read). */
static inline void upcie_pci_inuse_describe(const struct upcie_pci_inuse *u, const char *self,
					    char *buf, size_t len)
{
	size_t off = 0;

	if (!len)
		return;
	buf[0] = '\0';
	for (unsigned i = 0; i < u->n && i < UPCIE_PCI_INUSE_MAX && off < len; i++) {
		const struct upcie_pci_use *x = &u->use[i];
		int w = snprintf(buf + off, len - off, "%s%s%s%s%s", i ? "; " : "", x->what,
				 strcmp(x->func, self) ? " (IOMMU group sibling " : "",
				 strcmp(x->func, self) ? x->func : "",
				 strcmp(x->func, self) ? ")" : "");

		off += w > 0 ? (size_t)w : 0;
	}
	if (u->n > UPCIE_PCI_INUSE_MAX && off < len)
		off += (size_t)snprintf(buf + off, len - off, "; and %u more",
					u->n - UPCIE_PCI_INUSE_MAX);
	if (u->unknown && off < len)
		snprintf(buf + off, len - off, "%sunknown: %s", off ? "; " : "", u->unknown_what);
}

/* True when UPCIE_ALLOW_IN_USE is set to something other than "" or "0". */
static inline bool upcie_pci_inuse_env_allows(void)
{
	const char *e = getenv(UPCIE_PCI_INUSE_ENV);

	return e && *e && strcmp(e, "0");
}

/*
 * The guard before taking function `bdf` from its driver (`action` names the step for the
 * message, e.g. "bind it to vfio-pci"). Returns 0 when nothing is in use, or when `force` or
 * UPCIE_ALLOW_IN_USE=1 says to go on (a warning names what is in use); -EBUSY with a message
 * naming every use, and how to override, otherwise. A fact that cannot be read counts as in use:
 * the guard does not guess.
 */
static inline int upcie_pci_inuse_refuse(const struct upcie_pci_bdf *bdf, bool force,
					 const char *action)
{
	struct upcie_pci_inuse u;
	char name[UPCIE_PCI_BDF_STRLEN], desc[1024];
	int err = upcie_pci_inuse_scan(bdf, true, &u);

	if (err)
		return err;
	if (!u.n && !u.unknown)
		return 0;
	upcie_pci_bdf_format(bdf, name, sizeof(name));
	upcie_pci_inuse_describe(&u, name, desc, sizeof(desc));
	if (force || upcie_pci_inuse_env_allows()) {
		UPCIE_WARN("pci: %s is in use (%s); going on to %s as forced", name, desc,
			   action ? action : "take it");
		return 0;
	}
	return UPCIE_FAIL(-EBUSY,
			  "pci: %s is in use: %s. Refusing to %s; to do it anyway, pass --force "
			  "(upcie-setup) or set %s=1",
			  name, desc, action ? action : "take it", UPCIE_PCI_INUSE_ENV);
}

#endif /* UPCIE_PCI_INUSE_H */
