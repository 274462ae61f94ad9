/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Host memory for DMA: hugepages (memfd or hugetlbfs file), plain memfd, physical addresses.
 *
 * upcie_hugepage_alloc() maps shared, populated memory from one of three sources: a hugetlb memfd
 * (Linux >= 4.16), a file on a hugetlbfs mount, or a plain memfd of base pages (for iommufd's
 * map_file, which pins the pages itself). The file descriptor stays open so the memory can be
 * handed to the kernel (udmabuf, IOMMU_IOAS_MAP_FILE) or to another process.
 *
 * A hugetlbfs file is unlinked at once, unless it is named (opts->name): a named file is
 * flock()ed while in use and removed by upcie_hugepage_free(), and when the process dies it
 * stays, and its pages stay allocated, until upcie_hugepage_reclaim() removes it. That is for
 * memory a device may still write after its driver died (the uio path: nvme/dev.h names its
 * files after the device and reclaims them once the device is stopped): an unlinked file's
 * hugepages go back to the pool the moment the process is gone, the device notwithstanding.
 * With opts->numa the pages are placed on one NUMA node (a preferred-node policy set before the
 * pages are faulted in; where they landed is checked and reported in hp->node, with a warning
 * when the node had too few). Left alone the kernel takes them from the node of the CPU that
 * faults them in, whatever node the device sits on.
 * upcie_pagemap_phys() reads a physical address from /proc/self/pagemap; that needs root
 * (CAP_SYS_ADMIN): an unprivileged read returns PFN 0, which is reported as -EPERM, never used as
 * an address. upcie_dmamem_hugepage_lut() builds the dmamem for devices that see physical
 * addresses (uio_pci_generic, IOMMU off or passthrough): one LUT entry per hugepage, each checked
 * to be physically contiguous. upcie_hugepages_get()/upcie_hugepages_reserve() report and set the
 * kernel's hugepage pools through sysfs (root for writing); the sysfs root is taken from the
 * environment variable UPCIE_SYSFS_ROOT (default /sys) so tests can point it at a fake tree.
 *
 * Physical addresses of hugetlb pages are not fixed. The kernel migrates hugetlb pages that are
 * in use (x86-64 and arm64 support it for their hugepage sizes) when memory is offlined or
 * hot-removed (virtio-mem unplug in a guest too), when alloc_contig_range() wants the range (CMA,
 * gigantic-page allocation), on soft-offline after corrected memory errors, and on move_pages(),
 * migrate_pages() or mbind(MPOL_MF_MOVE) by the owner or a privileged process (mm/migrate.c,
 * mm/memory_hotplug.c, mm/memory-failure.c, isolate_or_dissolve_huge_page() in mm/hugetlb.c;
 * Linux 6.1 to 7.3). Nothing tells the process; a device still holding the old address then
 * writes into a page that belongs to someone else. A LUT of physical addresses accepts that risk,
 * as DPDK and SPDK do in their IOVA-as-PA mode; upcie_hugepage_lut_verify() can tell after the
 * fact (-ESTALE), nothing can prevent it. The vfio paths (mem/dmamem_type1.h,
 * mem/dmamem_iommufd.h) remove it: a long-term pin moves the pages out of movable memory first
 * and the kernel never migrates a pinned page.
 *
 * Needs: hugepages reserved beforehand for the hugepage sources (on the wanted node for
 * placement). Does not: map anything into an IOMMU (vfio/iommufd constructors do that), or build
 * a LUT over plain pages (the kernel migrates those routinely: compaction, NUMA balancing).
 */
#ifndef UPCIE_MEM_HUGEPAGE_H
#define UPCIE_MEM_HUGEPAGE_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <mntent.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <upcie/base/bits.h>
#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/base/sysfs.h>
#include <upcie/mem/dmamem.h>

/* Older C libraries lack these; the values are the kernel's UAPI. */
#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#endif
#ifndef MFD_ALLOW_SEALING
#define MFD_ALLOW_SEALING 0x0002U
#endif
#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif
#ifndef F_ADD_SEALS
#define F_ADD_SEALS 1033
#endif
#ifndef F_SEAL_SHRINK
#define F_SEAL_SHRINK 0x0002
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
/* mbind()/get_mempolicy()/move_pages() through syscall(2): no libnuma needed. */
#define UPCIE_MPOL_PREFERRED 1
#define UPCIE_NUMA_MAXNODE   1024

/* memfd_create() takes the hugepage size as log2(size) at this bit: MFD_HUGE_SHIFT, which lives in
 * <linux/memfd.h>, a header whose MFD_* definitions collide with the C library's. */
#define UPCIE_MFD_HUGE_SHIFT   26
#define UPCIE_HUGETLBFS_MAGIC  0x958458f6
#define UPCIE_PAGEMAP_PRESENT  (UINT64_C(1) << 63)
#define UPCIE_PAGEMAP_PFN_MASK ((UINT64_C(1) << 55) - 1)
/* `node` for the sysfs helpers: the system-wide pool rather than one NUMA node's. */
#define UPCIE_HUGEPAGE_NODE_ANY (-1)

enum upcie_hugepage_src {
	UPCIE_HUGEPAGE_MEMFD = 0,     /* memfd_create(MFD_HUGETLB | size) */
	UPCIE_HUGEPAGE_HUGETLBFS = 1, /* file on a hugetlbfs mount (unlinked unless named) */
	UPCIE_HUGEPAGE_PLAIN = 2,     /* memfd of base pages: no physical addresses */
};

struct upcie_hugepage_opts {
	enum upcie_hugepage_src src;
	size_t pagesize;   /* hugepage bytes; 0: the default (Hugepagesize in /proc/meminfo) */
	const char *mount; /* HUGETLBFS: mount point; NULL: one of `pagesize` in /proc/mounts */
	bool no_mlock;	   /* PLAIN: do not mlock (e.g. iommufd pins the pages anyway) */
	bool numa;	   /* place the pages on NUMA node `node` (preferred: others when short) */
	int node;	   /* with numa: the node; UPCIE_HUGEPAGE_NODE_ANY: no placement */
	/* HUGETLBFS: a file of this name that outlives the process (see upcie_hugepage_reclaim());
	 * NULL: an unlinked file */
	const char *name;
};

struct upcie_hugepage {
	void *vaddr;	 /* NULL: nothing allocated */
	size_t size;	 /* bytes mapped: the request rounded up to pagesize */
	size_t pagesize; /* bytes per page: the hugepage size, or the base page size for PLAIN */
	int fd;		 /* memfd or hugetlbfs file, open for the lifetime of the mapping */
	enum upcie_hugepage_src src;
	bool locked; /* mlock()ed (PLAIN only: hugetlb pages are never swapped) */
	int node;   /* with opts->numa: the node all pages are on; -1: mixed, unknown, or no numa */
	char *path; /* the named file (opts->name), removed by upcie_hugepage_free(); or NULL */
};

static inline int upcie_hugepages_path_(char *buf, size_t len, uint64_t size_kb, int node,
					const char *file)
{
	int err;

	if (node < 0)
		err = upcie_path_fmt(buf, len, "%s/kernel/mm/hugepages/hugepages-%" PRIu64 "kB/%s",
				     upcie_sysfs_root(), size_kb, file);
	else
		err = upcie_path_fmt(
		    buf, len, "%s/devices/system/node/node%d/hugepages/hugepages-%" PRIu64 "kB/%s",
		    upcie_sysfs_root(), node, size_kb, file);
	if (err)
		return UPCIE_FAIL(err, "hugepages: sysfs path too long under %s",
				  upcie_sysfs_root());
	return 0;
}

static inline int upcie_hugepage_read_u64_(const char *path, uint64_t *val)
{
	int err = upcie_file_read_u64(path, val);

	if (err == -EINVAL)
		return UPCIE_FAIL(-EPROTO, "hugepages: %s does not hold a number", path);
	if (err)
		return UPCIE_FAIL(err, "hugepages: reading %s: %s", path, strerror(-err));
	return 0;
}

static inline int upcie_hugepages_check_args_(uint64_t size_kb, int node)
{
	if (!size_kb || node < UPCIE_HUGEPAGE_NODE_ANY)
		return UPCIE_FAIL(-EINVAL, "hugepages: bad size %" PRIu64 " kB or node %d", size_kb,
				  node);
	return 0;
}

static inline int upcie_hugepages_missing_(uint64_t size_kb, int node, const char *path)
{
	if (node < 0)
		return UPCIE_FAIL(-ENOENT,
				  "hugepages: no %" PRIu64 " kB hugepage pool (%s missing); the "
				  "sizes this kernel supports are listed in %s/kernel/mm/hugepages",
				  size_kb, path, upcie_sysfs_root());
	return UPCIE_FAIL(-ENOENT,
			  "hugepages: no %" PRIu64 " kB hugepage pool on NUMA node %d (%s missing)",
			  size_kb, node, path);
}

/*
 * Pages in the pool of `size_kb` hugepages, system-wide (node UPCIE_HUGEPAGE_NODE_ANY) or on one
 * NUMA node: *total reserved, *nfree not in use. Either pointer may be NULL. Returns 0, -EINVAL,
 * -ENOENT (no such size or node), or the error reading sysfs.
 */
static inline int upcie_hugepages_get(uint64_t size_kb, int node, uint64_t *total, uint64_t *nfree)
{
	char path[PATH_MAX];
	uint64_t t, f;
	int err;

	err = upcie_hugepages_check_args_(size_kb, node);
	if (err)
		return err;
	err = upcie_hugepages_path_(path, sizeof(path), size_kb, node, "nr_hugepages");
	if (err)
		return err;
	if (access(path, F_OK) != 0)
		return upcie_hugepages_missing_(size_kb, node, path);
	err = upcie_hugepage_read_u64_(path, &t);
	if (err)
		return err;
	err = upcie_hugepages_path_(path, sizeof(path), size_kb, node, "free_hugepages");
	if (err)
		return err;
	err = upcie_hugepage_read_u64_(path, &f);
	if (err)
		return err;
	if (total)
		*total = t;
	if (nfree)
		*nfree = f;
	return 0;
}

/*
 * Set the pool of `size_kb` hugepages (system-wide or on one NUMA node) to `count` pages. The
 * kernel may reserve fewer (memory too fragmented: -ENOMEM, the pool keeps what it got) and keeps
 * pages in use when shrinking (that is success: the pool holds at least `count`). Needs root.
 */
static inline int upcie_hugepages_reserve(uint64_t size_kb, int node, uint64_t count)
{
	char path[PATH_MAX], num[32];
	uint64_t got;
	int err;

	err = upcie_hugepages_check_args_(size_kb, node);
	if (err)
		return err;
	err = upcie_hugepages_path_(path, sizeof(path), size_kb, node, "nr_hugepages");
	if (err)
		return err;
	snprintf(num, sizeof(num), "%" PRIu64 "\n", count);
	err = upcie_file_write_str(path, num);
	if (err == -ENOENT)
		return upcie_hugepages_missing_(size_kb, node, path);
	if (err == -EACCES || err == -EPERM)
		return UPCIE_FAIL(err, "hugepages: writing %s needs root: %s", path,
				  strerror(-err));
	if (err == -EROFS)
		return UPCIE_FAIL(err,
				  "hugepages: %s is read-only (sysfs mounted read-only, as in a "
				  "container): reserve the hugepages on the host before starting "
				  "(upcie-setup hugepages reserve %" PRIu64
				  ", or hugepages=N on the "
				  "kernel command line) and only allocate from them here",
				  path, count);
	if (err)
		return UPCIE_FAIL(err, "hugepages: writing %" PRIu64 " to %s: %s", count, path,
				  strerror(-err));
	err = upcie_hugepage_read_u64_(path, &got);
	if (err)
		return err;
	if (got < count)
		return UPCIE_FAIL(
		    -ENOMEM,
		    "hugepages: the kernel reserved %" PRIu64 " of %" PRIu64 " %" PRIu64
		    " kB hugepages (memory too fragmented or too small); "
		    "reserve them at boot (hugepages=N on the kernel command line) or "
		    "free memory and retry",
		    got, count, size_kb);
	return 0;
}

/* The kernel's default hugepage size in bytes (Hugepagesize in /proc/meminfo). */
static inline int upcie_hugepage_default_size(size_t *bytes)
{
	char line[256];
	unsigned long long kb = 0;
	bool found = false;
	FILE *fp;

	fp = fopen("/proc/meminfo", "re");
	if (!fp) {
		int err = upcie_neg_errno();

		return UPCIE_FAIL(err, "hugepage: opening /proc/meminfo: %s", strerror(-err));
	}
	while (fgets(line, sizeof(line), fp))
		if (sscanf(line, "Hugepagesize: %llu kB", &kb) == 1) {
			found = true;
			break;
		}
	fclose(fp);
	if (!found || !kb)
		return UPCIE_FAIL(-EOPNOTSUPP, "hugepage: kernel without hugetlb support "
					       "(no Hugepagesize in /proc/meminfo)");
	*bytes = (size_t)kb * 1024;
	return 0;
}

/* Page size of a hugetlbfs mount (its statfs block size), or -EINVAL when `dir` is not one. */
static inline int upcie_hugetlbfs_pagesize_(const char *dir, size_t *pagesize)
{
	struct statfs st;

	if (statfs(dir, &st) != 0) {
		int err = upcie_neg_errno();

		return UPCIE_FAIL(err, "hugepage: statfs %s: %s", dir, strerror(-err));
	}
	if ((uint64_t)st.f_type != UPCIE_HUGETLBFS_MAGIC)
		return UPCIE_FAIL(-EINVAL, "hugepage: %s is not a hugetlbfs mount", dir);
	*pagesize = (size_t)st.f_bsize;
	return 0;
}

/*
 * The first hugetlbfs mount in /proc/mounts whose page size is `pagesize` (0: the default
 * hugepage size) into dir: 0, or -ENOENT without a message (a caller may do without one).
 */
static inline int upcie_hugetlbfs_mount(size_t pagesize, char *dir, size_t len)
{
	struct mntent ent, *m;
	char buf[4096];
	int err = -ENOENT;
	FILE *fp;

	if (!pagesize && upcie_hugepage_default_size(&pagesize))
		return -ENOENT;
	fp = setmntent("/proc/mounts", "re");
	if (!fp)
		return upcie_neg_errno();
	while ((m = getmntent_r(fp, &ent, buf, sizeof(buf)))) {
		struct statfs st;

		if (strcmp(m->mnt_type, "hugetlbfs") != 0 || statfs(m->mnt_dir, &st) != 0 ||
		    (size_t)st.f_bsize != pagesize || strlen(m->mnt_dir) >= len)
			continue;
		strcpy(dir, m->mnt_dir);
		err = 0;
		break;
	}
	endmntent(fp);
	return err;
}

/* First hugetlbfs mount in /proc/mounts whose page size is `pagesize`. */
static inline int upcie_hugetlbfs_find_(size_t pagesize, char *dir, size_t len)
{
	struct mntent ent, *m;
	char buf[4096];
	FILE *fp;
	int err = -ENOENT;

	fp = setmntent("/proc/mounts", "re");
	if (!fp) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "hugepage: opening /proc/mounts: %s", strerror(-err));
	}
	while ((m = getmntent_r(fp, &ent, buf, sizeof(buf)))) {
		struct statfs st;

		if (strcmp(m->mnt_type, "hugetlbfs") != 0 || statfs(m->mnt_dir, &st) != 0 ||
		    (size_t)st.f_bsize != pagesize)
			continue;
		if (strlen(m->mnt_dir) >= len)
			continue;
		strcpy(dir, m->mnt_dir);
		err = 0;
		break;
	}
	endmntent(fp);
	if (err)
		return UPCIE_FAIL(
		    err,
		    "hugepage: no hugetlbfs mount with %zu kB pages in /proc/mounts: "
		    "mount one (mount -t hugetlbfs -o pagesize=%zuK none <dir>) or use "
		    "the memfd source",
		    pagesize / 1024, pagesize / 1024);
	return 0;
}

/* "2048 kB, 1048576 kB": the hugepage sizes the kernel has pools for, into buf. */
static inline const char *upcie_hugepage_sizes_(char *buf, size_t len)
{
	char path[PATH_MAX];
	struct dirent *de;
	size_t used = 0;
	DIR *d;

	buf[0] = '\0';
	if (upcie_path_fmt(path, sizeof(path), "%s/kernel/mm/hugepages", upcie_sysfs_root()) ||
	    !(d = opendir(path)))
		return buf;
	while ((de = readdir(d))) {
		unsigned long long kb;
		int n;

		if (sscanf(de->d_name, "hugepages-%llukB", &kb) != 1)
			continue;
		n = snprintf(buf + used, len - used, "%s%llu kB", used ? ", " : "", kb);
		if (n < 0 || (size_t)n >= len - used)
			break;
		used += (size_t)n;
	}
	closedir(d);
	return buf;
}

/*
 * Create file `name` on the hugetlbfs mount `dir` and flock() it (shared) for as long as the
 * descriptor is open: the lock tells upcie_hugepage_reclaim() the owner lives. *path gets the
 * malloc()ed path. -EEXIST when the name is taken.
 */
static inline int upcie_hugetlbfs_create_(const char *dir, const char *name, char **path)
{
	char buf[PATH_MAX];
	int fd, err;

	*path = NULL;
	if (!*name || strchr(name, '/'))
		return UPCIE_FAIL(-EINVAL, "hugepage: bad file name '%s'", name);
	if (upcie_path_fmt(buf, sizeof(buf), "%s/%s", dir, name))
		return UPCIE_FAIL(-ENAMETOOLONG, "hugepage: path too long under %s", dir);
	fd = open(buf, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		err = upcie_neg_errno();
		if (err == -EEXIST)
			return err;
		return UPCIE_FAIL(err, "hugepage: creating %s: %s", buf, strerror(-err));
	}
	*path = strdup(buf);
	if (!*path || flock(fd, LOCK_SH)) {
		err = *path ? upcie_neg_errno() : -ENOMEM;
		unlink(buf);
		close(fd);
		free(*path);
		*path = NULL;
		return UPCIE_FAIL(err, "hugepage: locking %s: %s", buf, strerror(-err));
	}
	return fd;
}

/*
 * Remove the named hugetlbfs files (upcie_hugepage_opts.name) whose name starts with `prefix`
 * and whose owner is gone (nothing holds their lock), on every hugetlbfs mount: their pages go
 * back to the pool. Call it only once nothing can still DMA into them (for memory of a device:
 * after the device was stopped). Returns the number of files removed (>= 0) or -errno. Root, or
 * the files' owner.
 */
static inline int upcie_hugepage_reclaim(const char *prefix)
{
	struct mntent ent, *m;
	char buf[4096];
	size_t plen;
	int n = 0;
	FILE *fp;

	if (!prefix || !*prefix || strchr(prefix, '/'))
		return UPCIE_FAIL(-EINVAL, "hugepage: reclaim: bad prefix");
	plen = strlen(prefix);
	fp = setmntent("/proc/mounts", "re");
	if (!fp) {
		int err = upcie_neg_errno();

		return UPCIE_FAIL(err, "hugepage: opening /proc/mounts: %s", strerror(-err));
	}
	while ((m = getmntent_r(fp, &ent, buf, sizeof(buf)))) {
		struct dirent *de;
		DIR *d;

		if (strcmp(m->mnt_type, "hugetlbfs") || !(d = opendir(m->mnt_dir)))
			continue;
		while ((de = readdir(d))) {
			char path[PATH_MAX];
			int fd;

			if (strncmp(de->d_name, prefix, plen) ||
			    upcie_path_fmt(path, sizeof(path), "%s/%s", m->mnt_dir, de->d_name))
				continue;
			fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
			if (fd < 0)
				continue;
			/* a live owner holds its shared lock */
			if (!flock(fd, LOCK_EX | LOCK_NB) && !unlink(path)) {
				UPCIE_DBG("hugepage: removed %s, left by a process that died",
					  path);
				n++;
			}
			close(fd);
		}
		closedir(d);
	}
	endmntent(fp);
	return n;
}

/* Open an unlinked file on the hugetlbfs mount `dir`; it lives as long as the descriptor. */
static inline int upcie_hugetlbfs_open_(const char *dir)
{
	char path[PATH_MAX];
	int n, fd, err;

	n = snprintf(path, sizeof(path), "%s/upcie-XXXXXX", dir);
	if (n < 0 || (size_t)n >= sizeof(path))
		return UPCIE_FAIL(-ENAMETOOLONG, "hugepage: path too long under %s", dir);
	fd = mkostemp(path, O_CLOEXEC);
	if (fd < 0) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "hugepage: creating a file in %s: %s", dir, strerror(-err));
	}
	/* Unlinked at once so a crash cannot leave hugepages held by a stray file. */
	unlink(path);
	return fd;
}

static inline int upcie_hugepage_enomem_(size_t size, size_t pagesize)
{
	uint64_t total = 0, nfree = 0, need = size / pagesize, kb = pagesize / 1024;

	if (upcie_hugepages_get(kb, UPCIE_HUGEPAGE_NODE_ANY, &total, &nfree) != 0)
		total = nfree = 0;
	UPCIE_ERR("hugepage: cannot get %" PRIu64 " hugepages of %" PRIu64 " kB (%" PRIu64
		  " free of %" PRIu64 " reserved): reserve with `upcie-setup hugepages reserve "
		  "%" PRIu64 "` or echo %" PRIu64 " > /sys/kernel/mm/hugepages/hugepages-%" PRIu64
		  "kB/nr_hugepages",
		  need, kb, nfree, total, total + need - (nfree < need ? nfree : need),
		  total + need - (nfree < need ? nfree : need), kb);
	return -ENOMEM;
}

static inline int upcie_hugepage_mlock_fail_(size_t size, int err)
{
	struct rlimit rl;
	char lim[32] = "unknown";

	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
		if (rl.rlim_cur == RLIM_INFINITY)
			snprintf(lim, sizeof(lim), "unlimited");
		else
			snprintf(lim, sizeof(lim), "%llu kB",
				 (unsigned long long)rl.rlim_cur / 1024);
	}
	return UPCIE_FAIL(err,
			  "hugepage: mlock of %zu bytes failed (%s): RLIMIT_MEMLOCK is %s; raise "
			  "it (`ulimit -l unlimited`, or memlock in /etc/security/limits.conf) or "
			  "run with CAP_IPC_LOCK",
			  size, strerror(-err), lim);
}

/* Prefer NUMA node `node` for the pages of [va, +len) faulted in from now on. */
static inline int upcie_hugepage_mbind_(void *va, size_t len, int node)
{
	unsigned long mask[UPCIE_NUMA_MAXNODE / (8 * sizeof(unsigned long))];

	memset(mask, 0, sizeof(mask));
	mask[(unsigned)node / (8 * sizeof(unsigned long))] |=
	    1UL << ((unsigned)node % (8 * sizeof(unsigned long)));
	/* maxnode counts one more than the bits the kernel reads (it decrements it first) */
	if (syscall(SYS_mbind, va, len, UPCIE_MPOL_PREFERRED, mask, UPCIE_NUMA_MAXNODE + 1, 0))
		return upcie_neg_errno();
	return 0;
}

/*
 * The node every page of [va, +len) (pages of `pagesize`) is on, asked with move_pages() and no
 * target nodes; -1 when they are on several nodes or the kernel cannot tell. *on_node gets the
 * number of pages on `want`.
 */
static inline int upcie_hugepage_node_of_(void *va, size_t len, size_t pagesize, int want,
					  size_t *on_node)
{
	size_t n = len / pagesize;
	void **pages = (void **)malloc(n * sizeof(*pages));
	int *status = (int *)malloc(n * sizeof(*status));
	int node = -2;

	*on_node = 0;
	if (!pages || !status) {
		free(pages);
		free(status);
		return -1;
	}
	for (size_t i = 0; i < n; i++)
		pages[i] = (char *)va + i * pagesize;
	if (syscall(SYS_move_pages, 0, (unsigned long)n, pages, NULL, status, 0) != 0) {
		node = -1;
	} else {
		for (size_t i = 0; i < n; i++) {
			if (status[i] == want)
				(*on_node)++;
			if (status[i] < 0 || (node != -2 && status[i] != node))
				node = -1;
			else if (node == -2)
				node = status[i];
		}
	}
	free(pages);
	free(status);
	return node < 0 ? -1 : node;
}

/*
 * Free what upcie_hugepage_alloc() set up and zero `hp` (fd -1). A zeroed or already freed
 * upcie_hugepage is a no-op.
 */
static inline void upcie_hugepage_free(struct upcie_hugepage *hp)
{
	if (!hp || !hp->vaddr)
		return;
	munmap(hp->vaddr, hp->size);
	if (hp->path)
		unlink(hp->path);
	free(hp->path);
	close(hp->fd);
	memset(hp, 0, sizeof(*hp));
	hp->fd = -1;
	hp->node = -1;
}

/*
 * Map `size` bytes (rounded up to the page size) of shared, populated, zero-filled memory from the
 * source in `opts` (NULL: hugetlb memfd of the default size). Returns 0, -EINVAL (bad size, page
 * size or mount), -ENOMEM (no free hugepages, or RLIMIT_MEMLOCK for PLAIN; the message names the
 * fix), -EPERM (mlock without privilege), -ENOENT (no hugetlbfs mount), or the failing call's
 * error. `hp` is zeroed (fd -1) on failure.
 */
static inline int upcie_hugepage_alloc(struct upcie_hugepage *hp, size_t size,
				       const struct upcie_hugepage_opts *opts)
{
	struct upcie_hugepage_opts def;
	char dir[PATH_MAX];
	size_t pagesize, mapsize;
	bool place;
	void *va;
	int fd = -1, err;

	if (!hp)
		return UPCIE_FAIL(-EINVAL, "hugepage: NULL upcie_hugepage");
	memset(hp, 0, sizeof(*hp));
	hp->fd = -1;
	hp->node = -1;
	if (!opts) {
		memset(&def, 0, sizeof(def));
		opts = &def;
	}
	if (!size)
		return UPCIE_FAIL(-EINVAL, "hugepage: zero size");
	place = opts->numa && opts->node != UPCIE_HUGEPAGE_NODE_ANY;
	if (place && (opts->node < 0 || opts->node >= UPCIE_NUMA_MAXNODE))
		return UPCIE_FAIL(-EINVAL, "hugepage: NUMA node %d out of range", opts->node);

	switch (opts->src) {
	case UPCIE_HUGEPAGE_PLAIN:
		pagesize = (size_t)sysconf(_SC_PAGESIZE);
		break;
	case UPCIE_HUGEPAGE_MEMFD:
	case UPCIE_HUGEPAGE_HUGETLBFS:
		pagesize = opts->pagesize;
		if (!pagesize && opts->src == UPCIE_HUGEPAGE_HUGETLBFS && opts->mount) {
			err = upcie_hugetlbfs_pagesize_(opts->mount, &pagesize);
			if (err)
				return err;
		}
		if (!pagesize) {
			err = upcie_hugepage_default_size(&pagesize);
			if (err)
				return err;
		}
		if (!upcie_is_pow2(pagesize) || pagesize < 4096 || pagesize > (UINT64_C(1) << 40))
			return UPCIE_FAIL(-EINVAL, "hugepage: bad page size %zu", pagesize);
		break;
	default:
		return UPCIE_FAIL(-EINVAL, "hugepage: unknown source %d", (int)opts->src);
	}
	if (size > SIZE_MAX - (pagesize - 1))
		return UPCIE_FAIL(-EINVAL, "hugepage: size %zu too large", size);
	mapsize = (size_t)upcie_align_up(size, pagesize);

	if (opts->src == UPCIE_HUGEPAGE_HUGETLBFS) {
		size_t mps;

		if (opts->mount) {
			if (strlen(opts->mount) >= sizeof(dir))
				return UPCIE_FAIL(-ENAMETOOLONG, "hugepage: mount path too long");
			strcpy(dir, opts->mount);
			err = upcie_hugetlbfs_pagesize_(dir, &mps);
			if (err)
				return err;
			if (mps != pagesize)
				return UPCIE_FAIL(-EINVAL,
						  "hugepage: %s has %zu kB pages, not the %zu kB "
						  "asked for",
						  dir, mps / 1024, pagesize / 1024);
		} else {
			err = upcie_hugetlbfs_find_(pagesize, dir, sizeof(dir));
			if (err)
				return err;
		}
		fd = opts->name ? upcie_hugetlbfs_create_(dir, opts->name, &hp->path)
				: upcie_hugetlbfs_open_(dir);
		if (fd == -EEXIST)
			return UPCIE_FAIL(fd, "hugepage: %s/%s exists", dir, opts->name);
		if (fd < 0)
			return fd;
	} else {
		unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;

		if (opts->src == UPCIE_HUGEPAGE_MEMFD)
			flags |= MFD_HUGETLB | (upcie_log2(pagesize) << UPCIE_MFD_HUGE_SHIFT);
		fd = memfd_create("upcie", flags);
		if (fd < 0) {
			char sizes[256];

			err = upcie_neg_errno();
			/* -ENODEV: no pool of that size (hugetlb_file_setup()); -EINVAL: a kernel
			 * without hugetlb memfds or a size it cannot encode */
			if ((err == -ENODEV || err == -EINVAL) && opts->src == UPCIE_HUGEPAGE_MEMFD)
				return UPCIE_FAIL(
				    err,
				    "hugepage: memfd_create refused %zu kB hugepages (%s): this "
				    "kernel has hugepage pools of %s; ask for one of those sizes "
				    "(pagesize 0 takes the default), or boot with "
				    "hugepagesz=%zuK hugepages=N where the CPU supports it",
				    pagesize / 1024, strerror(-err),
				    upcie_hugepage_sizes_(sizes, sizeof(sizes))[0] ? sizes
										   : "no size",
				    pagesize / 1024);
			return UPCIE_FAIL(err, "hugepage: memfd_create: %s", strerror(-err));
		}
	}

	if (ftruncate(fd, (off_t)mapsize) != 0) {
		err = upcie_neg_errno();
		UPCIE_ERR("hugepage: sizing the file to %zu bytes: %s", mapsize, strerror(-err));
		goto fail_close;
	}
	/* The size is fixed from here on: a shrink would turn accesses into SIGBUS. Sealing is
	 * also what udmabuf asks of a memfd. hugetlbfs files cannot be sealed; that is harmless. */
	if (opts->src != UPCIE_HUGEPAGE_HUGETLBFS && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)
		UPCIE_DBG("hugepage: F_SEAL_SHRINK: %s", strerror(errno));

	/* With a node to place on, the policy must be set before any page is faulted in. */
	va = mmap(NULL, mapsize, PROT_READ | PROT_WRITE, MAP_SHARED | (place ? 0 : MAP_POPULATE),
		  fd, 0);
	if (va == MAP_FAILED) {
		err = upcie_neg_errno();
		if (err == -ENOMEM && opts->src != UPCIE_HUGEPAGE_PLAIN)
			upcie_hugepage_enomem_(mapsize, pagesize);
		else
			UPCIE_ERR("hugepage: mmap of %zu bytes: %s", mapsize, strerror(-err));
		goto fail_close;
	}
	if (place) {
		err = upcie_hugepage_mbind_(va, mapsize, opts->node);
		if (err)
			UPCIE_WARN(
			    "hugepage: cannot prefer NUMA node %d (%s; a node without memory?): "
			    "the pages come from wherever the kernel finds them",
			    opts->node, strerror(-err));
	}
	/* MAP_POPULATE cannot fail, so a page it could not fault in (a hugetlb cgroup limit, a
	 * full tmpfs) would otherwise surface later as SIGBUS. MADV_POPULATE_WRITE reports it.
	 * Kernels before 5.14 answer EINVAL and rely on MAP_POPULATE alone (or, when placing,
	 * on touching every page here). */
	if (madvise(va, mapsize, MADV_POPULATE_WRITE) != 0) {
		err = upcie_neg_errno();
		if (err == -EINVAL) {
			for (size_t off = 0; place && off < mapsize; off += pagesize)
				((volatile char *)va)[off] = 0;
		} else {
			if (err == -ENOMEM && opts->src != UPCIE_HUGEPAGE_PLAIN)
				upcie_hugepage_enomem_(mapsize, pagesize);
			else
				UPCIE_ERR("hugepage: populating %zu bytes: %s", mapsize,
					  strerror(-err));
			goto fail_unmap;
		}
	}
	if (place) {
		size_t on = 0, n = mapsize / pagesize;

		hp->node = upcie_hugepage_node_of_(va, mapsize, pagesize, opts->node, &on);
		if (on != n)
			UPCIE_WARN("hugepage: %zu of %zu pages of %zu kB are on NUMA node %d, the "
				   "rest on other nodes: reserve them there "
				   "(/sys/devices/system/node/node%d/hugepages/"
				   "hugepages-%zukB/nr_hugepages)",
				   on, n, pagesize / 1024, opts->node, opts->node, pagesize / 1024);
	}
	/* Only plain pages can be swapped out. mlock of a hugetlb mapping locks nothing and still
	 * counts the whole length against RLIMIT_MEMLOCK, failing for no benefit. */
	if (opts->src == UPCIE_HUGEPAGE_PLAIN && !opts->no_mlock) {
		if (mlock(va, mapsize) != 0) {
			err = upcie_hugepage_mlock_fail_(mapsize, upcie_neg_errno());
			goto fail_unmap;
		}
		hp->locked = true;
	}

	hp->vaddr = va;
	hp->size = mapsize;
	hp->pagesize = pagesize;
	hp->fd = fd;
	hp->src = opts->src;
	return 0;

fail_unmap:
	munmap(va, mapsize);
fail_close:
	if (hp->path)
		unlink(hp->path);
	free(hp->path);
	hp->path = NULL;
	close(fd);
	hp->node = -1;
	return err;
}

/* Physical address of `va` through an open /proc/self/pagemap (see upcie_pagemap_phys()). */
static inline int upcie_pagemap_read_(int fd, uintptr_t va, uint64_t *phys)
{
	uint64_t psz = (uint64_t)sysconf(_SC_PAGESIZE), ent, pfn;
	ssize_t n;

	n = pread(fd, &ent, sizeof(ent), (off_t)(va / psz * sizeof(ent)));
	if (n != (ssize_t)sizeof(ent)) {
		int err = n < 0 ? upcie_neg_errno() : -EIO;

		return UPCIE_FAIL(err, "pagemap: reading the entry of 0x%" PRIxPTR ": %s", va,
				  strerror(-err));
	}
	if (!(ent & UPCIE_PAGEMAP_PRESENT))
		return UPCIE_FAIL(-EFAULT,
				  "pagemap: page at 0x%" PRIxPTR " is not present (never touched, "
				  "or swapped out): populate and lock the memory first",
				  va);
	pfn = ent & UPCIE_PAGEMAP_PFN_MASK;
	if (!pfn)
		return UPCIE_FAIL(
		    -EPERM,
		    "pagemap: PFN 0 for 0x%" PRIxPTR ": the kernel hides physical "
		    "addresses from unprivileged readers; run as root (CAP_SYS_ADMIN)",
		    va);
	*phys = pfn * psz + (va % psz);
	return 0;
}

static inline int upcie_pagemap_open_(void)
{
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	int err;

	if (fd >= 0)
		return fd;
	err = upcie_neg_errno();
	if (err == -EACCES || err == -EPERM)
		return UPCIE_FAIL(-EPERM,
				  "pagemap: /proc/self/pagemap not readable (%s): physical "
				  "addresses need root (CAP_SYS_ADMIN)",
				  strerror(-err));
	return UPCIE_FAIL(err, "pagemap: opening /proc/self/pagemap: %s", strerror(-err));
}

/*
 * Physical address of the byte at `vaddr` of this process. Returns 0; -EPERM without
 * CAP_SYS_ADMIN (the kernel then reports PFN 0, which is never accepted as an address); -EFAULT
 * when the page is not present. The answer holds until the kernel migrates the page, which it
 * does to plain pages routinely and to hugetlb pages on the occasions listed at the top of this
 * header; only a page pinned by a driver (vfio, iommufd) stays put.
 */
static inline int upcie_pagemap_phys(const void *vaddr, uint64_t *phys)
{
	int fd = upcie_pagemap_open_(), err;

	if (fd < 0)
		return fd;
	err = upcie_pagemap_read_(fd, (uintptr_t)vaddr, phys);
	close(fd);
	return err;
}

/*
 * Fill lut[i] with the physical address of hugepage i of `hp` (nlut = hp->size / hp->pagesize),
 * checking that each hugepage is physically contiguous (its last base page follows its first).
 * Returns 0, -EINVAL (PLAIN memory, wrong nlut), -EPERM/-EFAULT from pagemap, -EIO when a
 * hugepage is not contiguous or not naturally aligned. lut is unspecified on failure.
 */
static inline int upcie_hugepage_phys_lut(const struct upcie_hugepage *hp, uint64_t *lut,
					  size_t nlut)
{
	uint64_t psz = (uint64_t)sysconf(_SC_PAGESIZE);
	int fd, err = 0;

	if (!hp || !hp->vaddr || !lut)
		return UPCIE_FAIL(-EINVAL, "hugepage: phys_lut of unallocated memory");
	if (hp->src == UPCIE_HUGEPAGE_PLAIN)
		return UPCIE_FAIL(-EINVAL, "hugepage: no physical-address LUT over plain pages: "
					   "the kernel may migrate them; use hugepages");
	if (nlut != hp->size / hp->pagesize)
		return UPCIE_FAIL(-EINVAL, "hugepage: LUT of %zu entries for %zu hugepages", nlut,
				  hp->size / hp->pagesize);
	fd = upcie_pagemap_open_();
	if (fd < 0)
		return fd;
	for (size_t i = 0; i < nlut && !err; i++) {
		uintptr_t va = (uintptr_t)hp->vaddr + i * hp->pagesize;
		uint64_t first, last;

		err = upcie_pagemap_read_(fd, va, &first);
		if (!err)
			err = upcie_pagemap_read_(fd, va + hp->pagesize - psz, &last);
		if (err)
			break;
		if (last != first + hp->pagesize - psz || !upcie_is_aligned(first, hp->pagesize))
			err = UPCIE_FAIL(
			    -EIO,
			    "hugepage: page %zu at 0x%" PRIxPTR " is not one physically "
			    "contiguous hugepage (first 0x%" PRIx64 ", last 0x%" PRIx64 ")",
			    i, va, first, last);
		lut[i] = first;
	}
	close(fd);
	return err;
}

/*
 * Check a physical-address LUT dmamem (upcie_dmamem_hugepage_lut()) against pagemap now: 0 when
 * every hugepage is still at the address the device was given, -ESTALE (with a message naming
 * the first page that moved) when the kernel migrated one, -EINVAL for another kind of dmamem,
 * or pagemap's error. A check after the fact: DMA to the old address may already have happened.
 */
static inline int upcie_hugepage_lut_verify(const struct upcie_dmamem *mem)
{
	uint64_t gran, phys;
	int fd, err = 0;

	if (!mem || !mem->lut || !mem->vaddr || !mem->kind || strcmp(mem->kind, "hugepage-lut"))
		return UPCIE_FAIL(-EINVAL, "hugepage: verify: not a hugepage LUT dmamem");
	gran = UINT64_C(1) << mem->granule_shift;
	fd = upcie_pagemap_open_();
	if (fd < 0)
		return fd;
	for (size_t i = 0; i < mem->nlut && !err; i++) {
		err = upcie_pagemap_read_(fd, (uintptr_t)mem->vaddr + i * gran, &phys);
		if (!err && phys != mem->lut[i])
			err = UPCIE_FAIL(-ESTALE,
					 "hugepage: page %zu moved from physical 0x%" PRIx64
					 " to 0x%" PRIx64 ": a device given the old address now "
					 "writes into memory that is not ours",
					 i, mem->lut[i], phys);
	}
	close(fd);
	return err;
}

static inline void upcie_hugepage_dmamem_release_(struct upcie_dmamem *mem)
{
	struct upcie_hugepage *hp = (struct upcie_hugepage *)mem->priv;

	upcie_hugepage_free(hp);
	free(hp);
	mem->priv = NULL;
}

/*
 * Allocate `size` bytes of hugepage memory (see upcie_hugepage_alloc(); opts NULL: hugetlb memfd
 * of the default size; PLAIN is refused) and describe it in `mem` with a LUT of physical
 * addresses, one entry per hugepage: the dmamem for a device that sees physical addresses
 * (uio_pci_generic). mem->size is the size rounded up to the hugepage size; the granule is the
 * hugepage size; mem->fd is the memory's file descriptor (owned by the dmamem).
 * upcie_dmamem_destroy() unmaps and closes everything. Needs root (pagemap). `mem` is zeroed on
 * failure.
 */
static inline int upcie_dmamem_hugepage_lut(struct upcie_dmamem *mem, size_t size,
					    const struct upcie_hugepage_opts *opts)
{
	struct upcie_hugepage *hp;
	uint64_t *lut;
	size_t n;
	int err;

	if (!mem)
		return UPCIE_FAIL(-EINVAL, "dmamem: NULL dmamem");
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	if (opts && opts->src == UPCIE_HUGEPAGE_PLAIN)
		return UPCIE_FAIL(-EINVAL, "dmamem: a physical-address LUT needs hugepages; plain "
					   "pages may move");
	hp = (struct upcie_hugepage *)calloc(1, sizeof(*hp));
	if (!hp)
		return UPCIE_FAIL(-ENOMEM, "dmamem: out of host memory");
	err = upcie_hugepage_alloc(hp, size, opts);
	if (err)
		goto fail_free;
	if (upcie_log2(hp->pagesize) > 30) {
		err = UPCIE_FAIL(-EINVAL, "dmamem: %zu kB hugepages exceed the 1 GiB LUT granule",
				 hp->pagesize / 1024);
		goto fail_hp;
	}
	n = hp->size / hp->pagesize;
	lut = (uint64_t *)malloc(n * sizeof(*lut));
	if (!lut) {
		err = UPCIE_FAIL(-ENOMEM, "dmamem: out of host memory for a %zu-entry LUT", n);
		goto fail_hp;
	}
	err = upcie_hugepage_phys_lut(hp, lut, n);
	if (err) {
		free(lut);
		goto fail_hp;
	}
	err = upcie_dmamem_init_lut(mem, hp->vaddr, hp->size, upcie_log2(hp->pagesize), lut, true);
	if (err)
		goto fail_hp;
	mem->release = upcie_hugepage_dmamem_release_;
	mem->priv = hp;
	mem->fd = hp->fd;
	mem->kind = "hugepage-lut";
	return 0;

fail_hp:
	upcie_hugepage_free(hp);
fail_free:
	free(hp);
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	return err;
}

#endif /* UPCIE_MEM_HUGEPAGE_H */
