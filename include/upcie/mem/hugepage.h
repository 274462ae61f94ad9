/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Host memory for DMA: hugepages (memfd or hugetlbfs file), plain memfd, physical addresses.
 *
 * upcie_hugepage_alloc() maps shared, populated memory from one of three sources: a hugetlb memfd
 * (Linux >= 4.16), an unlinked file on a hugetlbfs mount, or a plain memfd of base pages (for
 * iommufd's map_file, which pins the pages itself). The file descriptor stays open so the memory
 * can be handed to the kernel (udmabuf, IOMMU_IOAS_MAP_FILE) or to another process.
 * upcie_pagemap_phys() reads a physical address from /proc/self/pagemap; that needs root
 * (CAP_SYS_ADMIN): an unprivileged read returns PFN 0, which is reported as -EPERM, never used as
 * an address. upcie_dmamem_hugepage_lut() builds the dmamem for devices that see physical
 * addresses (uio_pci_generic, IOMMU off or passthrough): one LUT entry per hugepage, each checked
 * to be physically contiguous. upcie_hugepages_get()/upcie_hugepages_reserve() report and set the
 * kernel's hugepage pools through sysfs (root for writing); the sysfs root is taken from the
 * environment variable UPCIE_SYSFS_ROOT (default /sys) so tests can point it at a fake tree.
 *
 * Needs: hugepages reserved beforehand for the hugepage sources. Does not: choose a NUMA node for
 * the memory, map anything into an IOMMU (vfio/iommufd constructors do that), or build a LUT over
 * plain pages (the kernel may migrate them, so their physical addresses are not stable).
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
#include <sys/mman.h>
#include <sys/resource.h>
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
	UPCIE_HUGEPAGE_HUGETLBFS = 1, /* unlinked file on a hugetlbfs mount */
	UPCIE_HUGEPAGE_PLAIN = 2,     /* memfd of base pages: no physical addresses */
};

struct upcie_hugepage_opts {
	enum upcie_hugepage_src src;
	size_t pagesize;   /* hugepage bytes; 0: the default (Hugepagesize in /proc/meminfo) */
	const char *mount; /* HUGETLBFS: mount point; NULL: one of `pagesize` in /proc/mounts */
	bool no_mlock;	   /* PLAIN: do not mlock (e.g. iommufd pins the pages anyway) */
};

struct upcie_hugepage {
	void *vaddr;	 /* NULL: nothing allocated */
	size_t size;	 /* bytes mapped: the request rounded up to pagesize */
	size_t pagesize; /* bytes per page: the hugepage size, or the base page size for PLAIN */
	int fd;		 /* memfd or hugetlbfs file, open for the lifetime of the mapping */
	enum upcie_hugepage_src src;
	bool locked; /* mlock()ed (PLAIN only: hugetlb pages are never swapped) */
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

/*
 * Free what upcie_hugepage_alloc() set up and zero `hp` (fd -1). A zeroed or already freed
 * upcie_hugepage is a no-op.
 */
static inline void upcie_hugepage_free(struct upcie_hugepage *hp)
{
	if (!hp || !hp->vaddr)
		return;
	munmap(hp->vaddr, hp->size);
	close(hp->fd);
	memset(hp, 0, sizeof(*hp));
	hp->fd = -1;
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
	void *va;
	int fd = -1, err;

	if (!hp)
		return UPCIE_FAIL(-EINVAL, "hugepage: NULL upcie_hugepage");
	memset(hp, 0, sizeof(*hp));
	hp->fd = -1;
	if (!opts) {
		memset(&def, 0, sizeof(def));
		opts = &def;
	}
	if (!size)
		return UPCIE_FAIL(-EINVAL, "hugepage: zero size");

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
		fd = upcie_hugetlbfs_open_(dir);
		if (fd < 0)
			return fd;
	} else {
		unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;

		if (opts->src == UPCIE_HUGEPAGE_MEMFD)
			flags |= MFD_HUGETLB | (upcie_log2(pagesize) << UPCIE_MFD_HUGE_SHIFT);
		fd = memfd_create("upcie", flags);
		if (fd < 0) {
			err = upcie_neg_errno();
			if (err == -EINVAL && opts->src == UPCIE_HUGEPAGE_MEMFD)
				return UPCIE_FAIL(
				    err,
				    "hugepage: memfd_create refused %zu kB hugepages: "
				    "the kernel lacks hugetlb memfd (Linux >= 4.16) or "
				    "that size (see /sys/kernel/mm/hugepages)",
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

	va = mmap(NULL, mapsize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (va == MAP_FAILED) {
		err = upcie_neg_errno();
		if (err == -ENOMEM && opts->src != UPCIE_HUGEPAGE_PLAIN)
			upcie_hugepage_enomem_(mapsize, pagesize);
		else
			UPCIE_ERR("hugepage: mmap of %zu bytes: %s", mapsize, strerror(-err));
		goto fail_close;
	}
	/* MAP_POPULATE cannot fail, so a page it could not fault in (a hugetlb cgroup limit, a
	 * full tmpfs) would otherwise surface later as SIGBUS. MADV_POPULATE_WRITE reports it.
	 * Kernels before 5.14 answer EINVAL and rely on MAP_POPULATE alone. */
	if (madvise(va, mapsize, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
		err = upcie_neg_errno();
		if (err == -ENOMEM && opts->src != UPCIE_HUGEPAGE_PLAIN)
			upcie_hugepage_enomem_(mapsize, pagesize);
		else
			UPCIE_ERR("hugepage: populating %zu bytes: %s", mapsize, strerror(-err));
		goto fail_unmap;
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
	close(fd);
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
 * when the page is not present. The answer is only stable for memory that cannot move: hugetlb
 * pages, or pages pinned by a driver.
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
