/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Hugepage and pagemap helpers.
 *
 * Always run: the sysfs pool helpers against a fake tree in a temporary directory (via
 * UPCIE_SYSFS_ROOT), plain memfd memory, argument errors, a hugepage size without a pool (the
 * error lists the sizes there are), NUMA placement on node 0, pagemap of a page that is not
 * present, and, when running as root, an unprivileged pagemap read in a child that dropped to
 * uid 65534 (must be -EPERM, never PFN 0 as an address) and an mlock beyond RLIMIT_MEMLOCK in such
 * a child.
 * Run when the system allows it: physical addresses (root), real hugepage memory and its LUT
 * dmamem (only when hugepages are already reserved and free: the test never changes the
 * system's reservation), a hugetlbfs mount. Otherwise those checks are skipped with the reason.
 */
#include <upcie/mem/hugepage.h>

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

/* AddressSanitizer replaces mlock() with a no-op that succeeds. */
#if defined(__SANITIZE_ADDRESS__)
#define MLOCK_WORKS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MLOCK_WORKS 0
#endif
#endif
#ifndef MLOCK_WORKS
#define MLOCK_WORKS 1
#endif

static char last_msg[1024];

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	snprintf(last_msg, sizeof(last_msg), "%s", msg);
}

static void put(const char *dir, const char *rel, const char *content)
{
	char path[4096], cmd[4096 + 16];
	FILE *fp;

	snprintf(path, sizeof(path), "%s/%s", dir, rel);
	snprintf(cmd, sizeof(cmd), "mkdir -p %s", path);
	*strrchr(cmd, '/') = '\0';
	if (system(cmd) != 0)
		abort();
	fp = fopen(path, "w");
	if (!fp)
		abort();
	fputs(content, fp);
	fclose(fp);
}

static void slurp(const char *dir, const char *rel, char *buf, size_t len)
{
	char path[4096];
	FILE *fp;
	size_t n;

	snprintf(path, sizeof(path), "%s/%s", dir, rel);
	fp = fopen(path, "r");
	n = fp ? fread(buf, 1, len - 1, fp) : 0;
	buf[n] = '\0';
	if (fp)
		fclose(fp);
}

/* Run fn in a child that dropped root for uid/gid 65534; its exit status is the result. */
static int as_nobody(int (*fn)(void *), void *arg, int dumpable)
{
	pid_t pid = fork();
	int status;

	if (pid == 0) {
		if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
			_exit(100);
		/* Changing credentials makes a process non-dumpable, which turns its /proc/self
		 * files root-owned; dumpable again, it can open its own pagemap as any user. */
		if (dumpable)
			prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
		_exit(fn(arg));
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return -1;
	return WEXITSTATUS(status);
}

#define HP "kernel/mm/hugepages/hugepages-2048kB/"
#define N0 "devices/system/node/node0/hugepages/hugepages-2048kB/"

static int reserve_unpriv(void *arg)
{
	(void)arg;
	return upcie_hugepages_reserve(2048, UPCIE_HUGEPAGE_NODE_ANY, 1) == -EACCES ? 0 : 1;
}

/* In a child, with the fake tree bind-mounted read-only: 0 when reserve says -EROFS and what to do
 * instead, 1 when it does not, 2 when the mount could not be made. */
static int reserve_erofs(const char *dir)
{
	pid_t pid = fork();
	int status;

	if (pid == 0) {
		if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
		    mount(dir, dir, NULL, MS_BIND, NULL) ||
		    mount(NULL, dir, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL))
			_exit(2);
		_exit(upcie_hugepages_reserve(2048, UPCIE_HUGEPAGE_NODE_ANY, 1) == -EROFS &&
			      strstr(last_msg, "read-only") &&
			      strstr(last_msg, "upcie-setup hugepages reserve")
			  ? 0
			  : 1);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return 1;
	return WEXITSTATUS(status);
}

static void test_sysfs(void)
{
	char dir[] = "/tmp/upcie-sysfs-XXXXXX", buf[64], cmd[128];
	uint64_t total = 0, nfree = 0;
	const char *saved = getenv("UPCIE_SYSFS_ROOT");

	if (!mkdtemp(dir)) {
		CHECK(0, "sysfs: mkdtemp");
		return;
	}
	put(dir, HP "nr_hugepages", "16\n");
	put(dir, HP "free_hugepages", "10\n");
	put(dir, N0 "nr_hugepages", "8\n");
	put(dir, N0 "free_hugepages", "3\n");
	setenv("UPCIE_SYSFS_ROOT", dir, 1);

	CHECK_EQ(upcie_hugepages_get(2048, UPCIE_HUGEPAGE_NODE_ANY, &total, &nfree), 0,
		 "sysfs: get system-wide");
	CHECK(total == 16 && nfree == 10, "sysfs: 16 total, 10 free (%llu, %llu)",
	      (unsigned long long)total, (unsigned long long)nfree);
	CHECK_EQ(upcie_hugepages_get(2048, 0, &total, &nfree), 0, "sysfs: get node 0");
	CHECK(total == 8 && nfree == 3, "sysfs: node 0 has 8 total, 3 free");
	CHECK_EQ(upcie_hugepages_get(2048, 0, NULL, &nfree), 0, "sysfs: total may be NULL");
	CHECK_EQ(upcie_hugepages_get(2048, 1, &total, &nfree), -ENOENT, "sysfs: no node 1");
	CHECK(strstr(last_msg, "NUMA node 1") != NULL, "sysfs: message names the node (%s)",
	      last_msg);
	CHECK_EQ(upcie_hugepages_get(1048576, UPCIE_HUGEPAGE_NODE_ANY, &total, &nfree), -ENOENT,
		 "sysfs: no 1 GiB pool");
	CHECK(strstr(last_msg, "1048576 kB") != NULL, "sysfs: message names the size (%s)",
	      last_msg);
	CHECK_EQ(upcie_hugepages_get(0, UPCIE_HUGEPAGE_NODE_ANY, &total, &nfree), -EINVAL,
		 "sysfs: size 0");
	CHECK_EQ(upcie_hugepages_get(2048, -2, &total, &nfree), -EINVAL, "sysfs: node -2");

	CHECK_EQ(upcie_hugepages_reserve(2048, UPCIE_HUGEPAGE_NODE_ANY, 32), 0,
		 "sysfs: reserve 32");
	slurp(dir, HP "nr_hugepages", buf, sizeof(buf));
	CHECK(strcmp(buf, "32\n") == 0, "sysfs: 32 written");
	CHECK_EQ(upcie_hugepages_reserve(2048, UPCIE_HUGEPAGE_NODE_ANY, 4), 0,
		 "sysfs: shrink to 4");
	slurp(dir, HP "nr_hugepages", buf, sizeof(buf));
	CHECK(strcmp(buf, "4\n") == 0, "sysfs: 4 written over 32, nothing left of it");
	CHECK_EQ(upcie_hugepages_get(2048, UPCIE_HUGEPAGE_NODE_ANY, &total, NULL), 0,
		 "sysfs: get after reserve");
	CHECK_EQ(total, 4, "sysfs: reads back 4");
	CHECK_EQ(upcie_hugepages_reserve(2048, 0, 12), 0, "sysfs: reserve on node 0");
	slurp(dir, N0 "nr_hugepages", buf, sizeof(buf));
	CHECK(strcmp(buf, "12\n") == 0, "sysfs: node 0 written");
	CHECK_EQ(upcie_hugepages_reserve(1048576, UPCIE_HUGEPAGE_NODE_ANY, 1), -ENOENT,
		 "sysfs: reserve of a missing size");
	CHECK_EQ(upcie_hugepages_reserve(2048, 3, 1), -ENOENT, "sysfs: reserve on a missing node");

	put(dir, HP "free_hugepages", "many\n");
	CHECK_EQ(upcie_hugepages_get(2048, UPCIE_HUGEPAGE_NODE_ANY, &total, &nfree), -EPROTO,
		 "sysfs: a file without a number is -EPROTO");
	put(dir, HP "free_hugepages", "");
	CHECK_EQ(upcie_hugepages_get(2048, UPCIE_HUGEPAGE_NODE_ANY, &total, &nfree), -EPROTO,
		 "sysfs: an empty file is -EPROTO");
	put(dir, HP "free_hugepages", "-1\n");
	CHECK_EQ(upcie_hugepages_get(2048, UPCIE_HUGEPAGE_NODE_ANY, &total, &nfree), -EPROTO,
		 "sysfs: a negative count is -EPROTO");

	/* A read-only sysfs, as in a container. */
	if (geteuid() == 0) {
		int r = reserve_erofs(dir);

		if (r == 2)
			CHECK_SKIP("sysfs: no read-only bind mount here (unshare/mount refused)");
		else
			CHECK_EQ(r, 0,
				 "sysfs: reserve on a read-only sysfs is -EROFS and says to "
				 "reserve on the host");
	} else {
		CHECK_SKIP("sysfs: a read-only bind mount needs root");
	}

	/* Read-only, as sysfs is to anyone but root: refused to uid 65534 and to a non-root run. */
	{
		char path[4096];

		snprintf(path, sizeof(path), "%s/" HP "nr_hugepages", dir);
		chmod(path, 0444);
	}
	if (geteuid() == 0) {
		chmod(dir, 0755);
		CHECK_EQ(as_nobody(reserve_unpriv, NULL, 0), 0,
			 "sysfs: reserve without privilege is -EACCES");
	} else {
		CHECK_EQ(reserve_unpriv(NULL), 0, "sysfs: reserve without privilege is -EACCES");
	}

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		CHECK(0, "sysfs: cleanup");
	if (saved)
		setenv("UPCIE_SYSFS_ROOT", saved, 1);
	else
		unsetenv("UPCIE_SYSFS_ROOT");
}

static int pagemap_unpriv(void *arg)
{
	static char page[4096] __attribute__((aligned(4096)));
	uint64_t phys = 0x1234;
	int err;

	(void)arg;
	page[0] = 1;
	err = upcie_pagemap_phys(page, &phys);
	/* -EPERM, and nothing written: PFN 0 must never come back as an address. */
	return err == -EPERM && phys == 0x1234 && strstr(last_msg, "CAP_SYS_ADMIN") ? 0 : 1;
}

/* Probe once: can this process read physical addresses? */
static int have_phys(void)
{
	static char page[4096] __attribute__((aligned(4096)));
	uint64_t phys;
	int err;

	page[0] = 1;
	err = upcie_pagemap_phys(page, &phys);
	return err == 0;
}

static void test_pagemap(void)
{
	static char page[8192] __attribute__((aligned(4096)));
	uint64_t phys = 0, phys2 = 0;
	void *untouched;

	if (have_phys()) {
		page[0] = 1;
		page[4096] = 1;
		CHECK_EQ(upcie_pagemap_phys(page + 123, &phys), 0, "pagemap: physical address");
		CHECK(phys != 0 && phys % 4096 == 123, "pagemap: non-zero, keeps the page offset");
		CHECK_EQ(upcie_pagemap_phys(page + 4096, &phys2), 0, "pagemap: second page");
	} else {
		CHECK_SKIP("pagemap: no physical addresses for this process (not CAP_SYS_ADMIN)");
		CHECK_SKIP("pagemap: (same)");
		CHECK_SKIP("pagemap: (same)");
	}

	untouched =
	    mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	phys = 0x77;
	CHECK_EQ(upcie_pagemap_phys(untouched, &phys), -EFAULT,
		 "pagemap: a page never touched is -EFAULT");
	CHECK(strstr(last_msg, "not present") != NULL && phys == 0x77,
	      "pagemap: says not present, writes nothing (%s)", last_msg);
	munmap(untouched, 2 * 4096);

	if (geteuid() == 0) {
		CHECK_EQ(as_nobody(pagemap_unpriv, NULL, 1), 0,
			 "pagemap: uid 65534 reading its own pagemap (PFN 0) gets -EPERM");
		CHECK_EQ(as_nobody(pagemap_unpriv, NULL, 0), 0,
			 "pagemap: uid 65534, non-dumpable (pagemap unreadable) gets -EPERM");
	} else {
		CHECK_EQ(pagemap_unpriv(NULL), 0, "pagemap: unprivileged read gets -EPERM");
		CHECK_SKIP("pagemap: non-dumpable variant needs root to drop privilege");
	}
}

static int mlock_unpriv(void *arg)
{
	struct upcie_hugepage hp;
	struct upcie_hugepage_opts o = { .src = UPCIE_HUGEPAGE_PLAIN };
	int err;

	(void)arg;
	err = upcie_hugepage_alloc(&hp, 4 << 20, &o);
	return (err == -ENOMEM || err == -EPERM) && strstr(last_msg, "ulimit -l") &&
		       hp.vaddr == NULL && hp.fd == -1
		   ? 0
		   : 1;
}

static void test_plain(void)
{
	struct upcie_hugepage hp;
	struct upcie_hugepage_opts o = { .src = UPCIE_HUGEPAGE_PLAIN };
	struct upcie_dmamem mem;
	uint64_t lut[1];
	int ok = 1;

	CHECK_EQ(upcie_hugepage_alloc(&hp, (1 << 20) + 1, &o), 0, "plain: alloc 1 MiB + 1");
	CHECK_EQ(hp.size, (1 << 20) + 4096, "plain: rounded up to the page size");
	CHECK_EQ(hp.pagesize, 4096, "plain: base pages");
	CHECK(hp.fd >= 0 && hp.locked, "plain: fd open, locked");
	for (size_t i = 0; i < hp.size; i++)
		ok &= ((volatile char *)hp.vaddr)[i] == 0;
	CHECK(ok, "plain: zero-filled");
	memset(hp.vaddr, 0x5a, hp.size);
	CHECK(fcntl(hp.fd, F_GET_SEALS) & F_SEAL_SHRINK, "plain: sealed against shrinking");
	CHECK(ftruncate(hp.fd, 4096) != 0, "plain: shrinking is refused");
	CHECK_EQ(upcie_hugepage_phys_lut(&hp, lut, 1), -EINVAL, "plain: no physical LUT");
	upcie_hugepage_free(&hp);
	CHECK(hp.vaddr == NULL && hp.fd == -1, "plain: freed and zeroed");
	upcie_hugepage_free(&hp);
	CHECK(1, "plain: freeing twice is a no-op");

	o.no_mlock = true;
	CHECK_EQ(upcie_hugepage_alloc(&hp, 8192, &o), 0, "plain: without mlock");
	CHECK(!hp.locked, "plain: not locked");
	upcie_hugepage_free(&hp);

	o.no_mlock = false;
	CHECK_EQ(upcie_dmamem_hugepage_lut(&mem, 8192, &o), -EINVAL, "plain: LUT dmamem refused");
	CHECK(mem.size == 0 && mem.fd == -1, "plain: dmamem left zeroed");
	upcie_dmamem_destroy(&mem);

	if (!MLOCK_WORKS) {
		CHECK_SKIP("plain: RLIMIT_MEMLOCK check: AddressSanitizer makes mlock() a no-op");
	} else if (geteuid() == 0) {
		struct rlimit old;

		/* The child inherits the limit; set it here since a child without
		 * CAP_SYS_RESOURCE could not lower only the soft limit below the hard one. */
		getrlimit(RLIMIT_MEMLOCK, &old);
		{
			struct rlimit rl = { 64 * 1024, old.rlim_max };

			setrlimit(RLIMIT_MEMLOCK, &rl);
			CHECK_EQ(as_nobody(mlock_unpriv, NULL, 0), 0,
				 "plain: mlock beyond RLIMIT_MEMLOCK fails naming `ulimit -l`");
			setrlimit(RLIMIT_MEMLOCK, &old);
		}
	} else {
		CHECK_SKIP("plain: RLIMIT_MEMLOCK check needs root to drop CAP_IPC_LOCK");
	}
}

static void test_errors(void)
{
	struct upcie_hugepage hp, zero;
	struct upcie_hugepage_opts o = { .src = UPCIE_HUGEPAGE_MEMFD, .pagesize = 3000 };

	memset(&zero, 0, sizeof(zero));
	upcie_hugepage_free(&zero);
	CHECK(1, "errors: freeing a zeroed upcie_hugepage is a no-op");
	CHECK_EQ(upcie_hugepage_alloc(&hp, 0, NULL), -EINVAL, "errors: size 0");
	CHECK(hp.vaddr == NULL && hp.fd == -1, "errors: left zeroed");
	CHECK_EQ(upcie_hugepage_alloc(&hp, 4096, &o), -EINVAL, "errors: page size 3000");
	o.pagesize = 2048;
	CHECK_EQ(upcie_hugepage_alloc(&hp, 4096, &o), -EINVAL, "errors: page size below 4 KiB");
	o.src = (enum upcie_hugepage_src)7;
	o.pagesize = 0;
	CHECK_EQ(upcie_hugepage_alloc(&hp, 4096, &o), -EINVAL, "errors: unknown source");
	o.src = UPCIE_HUGEPAGE_HUGETLBFS;
	o.mount = "/tmp";
	CHECK_EQ(upcie_hugepage_alloc(&hp, 4096, &o), -EINVAL, "errors: /tmp is not hugetlbfs");
	CHECK(strstr(last_msg, "not a hugetlbfs mount") != NULL, "errors: says so (%s)", last_msg);
	o.mount = "/nonexistent/upcie";
	CHECK_EQ(upcie_hugepage_alloc(&hp, 4096, &o), -ENOENT, "errors: missing mount dir");
	CHECK_EQ(upcie_hugepage_alloc(NULL, 4096, NULL), -EINVAL, "errors: NULL");
}

static int lut_unpriv(void *arg)
{
	struct upcie_dmamem mem;
	int err;

	(void)arg;
	err = upcie_dmamem_hugepage_lut(&mem, 4096, NULL);
	return err == -EPERM && mem.size == 0 && mem.lut == NULL && mem.fd == -1 ? 0 : 1;
}

/* Compare a LUT dmamem's translation with pagemap at the edges of its hugepages. */
static void check_lut(struct upcie_dmamem *mem, size_t pagesize, const char *what)
{
	const uint64_t offs[] = {
		0, 4095, 4096, pagesize - 1, pagesize, pagesize + 12345, mem->size - 1
	};
	int bad = 0;

	for (size_t i = 0; i < UPCIE_ARRAY_SIZE(offs); i++) {
		uint64_t iova = 0, phys = 1;

		if (upcie_dmamem_iova(mem, offs[i], &iova) != 0 ||
		    upcie_pagemap_phys((char *)mem->vaddr + offs[i], &phys) != 0 || iova != phys)
			bad++;
	}
	CHECK_EQ(bad, 0, "%s: LUT agrees with pagemap at hugepage edges", what);
	CHECK_EQ(upcie_dmamem_contig(mem, pagesize - 1), 1, "%s: contiguous to the hugepage end",
		 what);
}

static void test_hugepages(void)
{
	size_t pagesize = 0;
	uint64_t kb, total = 0, nfree = 0, overcommit = 0;
	struct upcie_hugepage hp;
	struct upcie_dmamem mem;
	struct upcie_hugepage_opts o = { .src = UPCIE_HUGEPAGE_MEMFD };
	FILE *fp;
	int err;

	if (upcie_hugepage_default_size(&pagesize) != 0) {
		CHECK_SKIP("hugepages: kernel without hugetlb");
		return;
	}
	kb = pagesize / 1024;
	CHECK_EQ(upcie_hugepages_get(kb, UPCIE_HUGEPAGE_NODE_ANY, &total, &nfree), 0,
		 "hugepages: read the real %llu kB pool (%llu reserved, %llu free)",
		 (unsigned long long)kb, (unsigned long long)total, (unsigned long long)nfree);
	fp = fopen("/proc/sys/vm/nr_overcommit_hugepages", "r");
	if (fp) {
		if (fscanf(fp, "%llu", (unsigned long long *)&overcommit) != 1)
			overcommit = 0;
		fclose(fp);
	}

	/* More than the pool holds: the error must say how to reserve more. */
	if (!overcommit) {
		err = upcie_hugepage_alloc(&hp, (size_t)(nfree + 1) * pagesize, &o);
		CHECK_EQ(err, -ENOMEM, "hugepages: %llu pages with %llu free is -ENOMEM",
			 (unsigned long long)nfree + 1, (unsigned long long)nfree);
		CHECK(strstr(last_msg, "nr_hugepages") && strstr(last_msg, "upcie-setup hugepages"),
		      "hugepages: message names the fix (%s)", last_msg);
		CHECK(hp.vaddr == NULL && hp.fd == -1, "hugepages: left zeroed");
	} else {
		CHECK_SKIP("hugepages: overcommit is on, a pool shortage cannot be provoked");
		CHECK_SKIP("hugepages: (same)");
		CHECK_SKIP("hugepages: (same)");
	}

	if (nfree < 2) {
		CHECK_SKIP("hugepages: fewer than 2 free %llu kB hugepages reserved; reserve with "
			   "echo N > /sys/kernel/mm/hugepages/hugepages-%llukB/nr_hugepages",
			   (unsigned long long)kb, (unsigned long long)kb);
	} else {
		int ok = 1;

		CHECK_EQ(upcie_hugepage_alloc(&hp, 2 * pagesize - 100, &o), 0,
			 "hugepages: memfd, 2 pages");
		CHECK_EQ(hp.size, 2 * pagesize, "hugepages: rounded to the hugepage size");
		CHECK_EQ((uintptr_t)hp.vaddr % pagesize, 0, "hugepages: mapping is aligned");
		CHECK(!hp.locked, "hugepages: hugetlb memory is not mlocked");
		for (size_t i = 0; i < hp.size; i += 4096)
			ok &= ((volatile char *)hp.vaddr)[i] == 0;
		memset(hp.vaddr, 0xa5, hp.size);
		CHECK(ok, "hugepages: zero-filled and writable");
		if (have_phys()) {
			uint64_t lut[2];

			CHECK_EQ(upcie_hugepage_phys_lut(&hp, lut, 2), 0, "hugepages: phys LUT");
			CHECK(lut[0] % pagesize == 0 && lut[1] % pagesize == 0,
			      "hugepages: entries are hugepage-aligned");
			CHECK_EQ(upcie_hugepage_phys_lut(&hp, lut, 1), -EINVAL,
				 "hugepages: LUT of the wrong length");
		} else {
			CHECK_SKIP("hugepages: physical LUT needs CAP_SYS_ADMIN");
			CHECK_SKIP("hugepages: (same)");
			CHECK_SKIP("hugepages: (same)");
		}
		upcie_hugepage_free(&hp);

		err = upcie_dmamem_hugepage_lut(&mem, pagesize + 1, NULL);
		if (have_phys()) {
			CHECK_EQ(err, 0, "hugepages: LUT dmamem of 2 pages");
			CHECK_EQ(mem.nlut, 2, "hugepages: one entry per hugepage");
			CHECK_EQ(upcie_dmamem_granule(&mem), pagesize, "hugepages: granule");
			CHECK(mem.fd >= 0 && mem.vaddr, "hugepages: fd and CPU view");
			if (!err)
				check_lut(&mem, pagesize, "hugepages");
		} else {
			CHECK_EQ(err, -EPERM, "hugepages: LUT dmamem without privilege is -EPERM");
			CHECK(mem.size == 0, "hugepages: left zeroed");
		}
		upcie_dmamem_destroy(&mem);
		CHECK_EQ(upcie_hugepages_get(kb, UPCIE_HUGEPAGE_NODE_ANY, NULL, &overcommit), 0,
			 "hugepages: pool after destroy");
		CHECK_EQ(overcommit, nfree, "hugepages: every hugepage given back");
		if (geteuid() == 0) {
			CHECK_EQ(as_nobody(lut_unpriv, NULL, 1), 0,
				 "hugepages: LUT dmamem as uid 65534 is -EPERM (PFN 0 refused)");
			upcie_hugepages_get(kb, UPCIE_HUGEPAGE_NODE_ANY, NULL, &overcommit);
			CHECK_EQ(overcommit, nfree, "hugepages: the failed LUT gave its page back");
		} else {
			CHECK_SKIP(
			    "hugepages: unprivileged LUT check needs root to drop privilege");
			CHECK_SKIP("hugepages: (same)");
		}
	}

	/* hugetlbfs: a mount of the default size, if the system has one. */
	o.src = UPCIE_HUGEPAGE_HUGETLBFS;
	err = upcie_hugepage_alloc(&hp, pagesize, &o);
	if (err == -ENOENT) {
		CHECK(strstr(last_msg, "mount -t hugetlbfs") != NULL,
		      "hugetlbfs: no mount, message says how (%s)", last_msg);
		CHECK_SKIP("hugetlbfs: no hugetlbfs mount of %llu kB pages",
			   (unsigned long long)kb);
	} else if (nfree < 1) {
		CHECK_EQ(err, -ENOMEM, "hugetlbfs: mounted, but no free hugepages");
		CHECK_SKIP("hugetlbfs: no free hugepages");
	} else {
		CHECK_EQ(err, 0, "hugetlbfs: one page from the mount");
		CHECK(hp.size == pagesize && hp.fd >= 0, "hugetlbfs: size and fd");
		memset(hp.vaddr, 1, hp.size);
		upcie_hugepage_free(&hp);
	}
}

/* A hugepage size the kernel has no pool for: the error lists the sizes it has. */
static void test_unsupported_size(void)
{
	struct upcie_hugepage_opts o = { .src = UPCIE_HUGEPAGE_MEMFD, .pagesize = 8u << 20 };
	struct upcie_hugepage hp;
	size_t pagesize = 0;
	char want[64];
	int err;

	if (upcie_hugepage_default_size(&pagesize) != 0) {
		CHECK_SKIP("size: kernel without hugetlb");
		CHECK_SKIP("size: (same)");
		return;
	}
	/* no architecture has 8 MiB hugepages */
	err = upcie_hugepage_alloc(&hp, 4096, &o);
	CHECK(err == -ENODEV || err == -EINVAL, "size: 8 MiB hugepages refused (%d)", err);
	snprintf(want, sizeof(want), "%zu kB", pagesize / 1024);
	CHECK(strstr(last_msg, "hugepage pools of") && strstr(last_msg, want),
	      "size: the message lists the sizes there are, %s among them (%s)", want, last_msg);
}

/* NUMA placement: the node asked for, reported back; a node out of range is refused. */
static void test_numa(void)
{
	struct upcie_hugepage_opts o = { .src = UPCIE_HUGEPAGE_PLAIN, .numa = true, .node = 0 };
	struct upcie_hugepage hp;
	uint64_t nfree = 0;
	size_t pagesize = 0;
	int err;

	err = upcie_hugepage_alloc(&hp, 1u << 20, &o);
	CHECK(err == 0 && hp.node == 0, "numa: plain memory on node 0 (err %d, node %d)", err,
	      hp.node);
	upcie_hugepage_free(&hp);
	o.node = 100000;
	CHECK_EQ(upcie_hugepage_alloc(&hp, 4096, &o), -EINVAL, "numa: node 100000 -> -EINVAL");
	o.node = UPCIE_HUGEPAGE_NODE_ANY;
	err = upcie_hugepage_alloc(&hp, 4096, &o);
	CHECK(err == 0 && hp.node == -1, "numa: NODE_ANY places nothing, reports -1 (%d, %d)", err,
	      hp.node);
	upcie_hugepage_free(&hp);
	if (upcie_hugepage_default_size(&pagesize) ||
	    upcie_hugepages_get(pagesize / 1024, UPCIE_HUGEPAGE_NODE_ANY, NULL, &nfree) ||
	    nfree < 1) {
		CHECK_SKIP("numa: no free hugepage reserved");
		return;
	}
	o.src = UPCIE_HUGEPAGE_MEMFD;
	o.node = 0;
	err = upcie_hugepage_alloc(&hp, pagesize, &o);
	CHECK(err == 0 && hp.node == 0, "numa: a hugepage on node 0 (err %d, node %d)", err,
	      hp.node);
	upcie_hugepage_free(&hp);
}

int main(void)
{
	upcie_log_set_handler(capture, NULL);
	test_sysfs();
	test_pagemap();
	test_plain();
	test_errors();
	test_hugepages();
	test_unsupported_size();
	test_numa();
	return check_done();
}
