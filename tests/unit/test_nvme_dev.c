/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests for the uio path of nvme/dev.h and the open/close order of nvme/ctrl.h, against a
 * fake sysfs tree (UPCIE_SYSFS_ROOT, UPCIE_DEV_ROOT) whose BAR0 is a file that a small register
 * model maps too: it answers CC.EN with CSTS.RDY (or holds RDY, or raises CFS) and reads the bus
 * master bit from the fake config space whenever the controller state changes.
 *
 * Checked: a controller a dead process left enabled is stopped while bus mastering is off, and
 * bus mastering never comes on while it runs; when the controller does not disable at close, its
 * host memory is kept (the hugepages do not go back to the pool, not even when the process is
 * gone: its named hugetlbfs file stays until reclaimed), and with a controller that does disable
 * they do (the control); the uio path refuses a translating IOMMU group, an unbound
 * function and a second holder, accepts an identity domain, turns bus mastering off at open and
 * at close; DMA memory is placed on the function's NUMA node. With bind, a function whose class
 * is not NVMe is refused and left alone (driver_override, unbind and drivers_probe unwritten),
 * bind_any_class binds it, and an NVMe controller is bound as before (a small stand-in for the
 * kernel moves the driver link); the hints for a function on the wrong driver suggest binding
 * only an NVMe controller. Memory checks need root and two free 2 MiB hugepages (physical
 * addresses from pagemap); without them they are skipped.
 */
#include <upcie/nvme/ctrl.h>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define FN   "bus/pci/devices/7e57:00:04.0"
#define BDF  "7e57:00:04.0"
#define REGS 16384

static char root[64];
static char last_msg[1024];

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	snprintf(last_msg, sizeof(last_msg), "%s", msg);
}

static void path_of(const char *rel, char *buf, size_t len)
{
	snprintf(buf, len, "%s/%s", root, rel);
}

static void put(const char *rel, const void *data, size_t len)
{
	char path[512];
	int fd;

	path_of(rel, path, sizeof(path));
	fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
	if (fd < 0 || write(fd, data, len) != (ssize_t)len) {
		perror(path);
		exit(2);
	}
	close(fd);
}

static void puts_(const char *rel, const char *s)
{
	put(rel, s, strlen(s));
}

static void mkdirs(const char *rel)
{
	char path[512];

	path_of(rel, path, sizeof(path));
	for (char *p = path + strlen(root) + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			mkdir(path, 0755);
			*p = '/';
		}
	}
	mkdir(path, 0755);
}

static void relink(const char *target, const char *rel)
{
	char path[512];

	path_of(rel, path, sizeof(path));
	unlink(path);
	if (target && symlink(target, path)) {
		perror(path);
		exit(2);
	}
}

/* The command register of the fake config space. */
static uint16_t cmd_get(void)
{
	char path[512];
	uint16_t v = 0xffff;
	int fd;

	path_of(FN "/config", path, sizeof(path));
	fd = open(path, O_RDONLY);
	if (fd >= 0) {
		if (pread(fd, &v, 2, 4) != 2)
			v = 0xffff;
		close(fd);
	}
	return le16toh(v);
}

static void cmd_set(uint16_t v)
{
	char path[512];
	int fd;

	v = htole16(v);
	path_of(FN "/config", path, sizeof(path));
	fd = open(path, O_WRONLY);
	if (fd < 0 || pwrite(fd, &v, 2, 4) != 2)
		exit(2);
	close(fd);
}

static void build_tree(void)
{
	uint8_t cfg[256] = { 0 };
	char path[512];

	snprintf(root, sizeof(root), "/tmp/upcie-nvmedev-XXXXXX");
	if (!mkdtemp(root))
		exit(2);
	mkdirs(FN "/uio/uio0");
	mkdirs("bus/pci/drivers/uio_pci_generic");
	mkdirs("kernel/iommu_groups/7");
	mkdirs("dev");
	puts_("dev/uio0", "");
	puts_(FN "/vendor", "0x1b36\n");
	puts_(FN "/device", "0x0010\n");
	puts_(FN "/class", "0x010802\n");
	puts_(FN "/numa_node", "0\n");
	puts_(FN "/reset", "");
	puts_(FN "/resource", "0x00000000febf0000 0x00000000febf3fff 0x0000000000140204\n");
	cfg[0] = 0x36, cfg[1] = 0x1b, cfg[2] = 0x10;
	put(FN "/config", cfg, sizeof(cfg));
	{
		static char zero[REGS];

		put(FN "/resource0", zero, sizeof(zero));
	}
	relink("../../drivers/uio_pci_generic", FN "/driver");
	setenv("UPCIE_SYSFS_ROOT", root, 1);
	path_of("dev", path, sizeof(path));
	setenv("UPCIE_DEV_ROOT", path, 1);
}

/* The register model: BAR0 is the same file the driver maps. */
struct fake {
	volatile uint32_t *regs;
	bool stale;	    /* an enabled controller left by a dead process */
	bool stuck;	    /* CSTS.RDY stays 1 after CC.EN = 0 */
	bool cfs_on_enable; /* CC.EN = 1 answers RDY | CFS */
	int bm_while_stale; /* polls that saw bus mastering on while the stale controller ran */
	int bm_at_disable;  /* bus master bit when the first disable was seen; -1: none seen */
	int disables, enables;
	int run;
	pthread_t thread;
};

static void *fake_thread(void *arg)
{
	struct fake *f = (struct fake *)arg;

	while (__atomic_load_n(&f->run, __ATOMIC_ACQUIRE)) {
		uint32_t cc = f->regs[UPCIE_NVME_REG_CC / 4],
			 csts = f->regs[UPCIE_NVME_REG_CSTS / 4];
		int bm = !!(cmd_get() & UPCIE_PCI_CMD_MASTER);

		if (f->stale && bm)
			f->bm_while_stale++;
		if (!(cc & 1) && (csts & 1)) {
			if (f->bm_at_disable < 0)
				f->bm_at_disable = bm;
			if (!f->stuck) {
				f->regs[UPCIE_NVME_REG_CSTS / 4] = 0;
				f->stale = false;
				f->disables++;
			}
		} else if ((cc & 1) && !(csts & 3)) {
			f->regs[UPCIE_NVME_REG_CSTS / 4] = f->cfs_on_enable ? 3 : 1;
			f->enables++;
		} else if ((cc & 1) && ((cc >> 14) & 3) && !((csts >> 2) & 3)) {
			f->regs[UPCIE_NVME_REG_CSTS / 4] =
			    csts | (UPCIE_NVME_CSTS_SHST_COMPLETE << 2);
		}
		usleep(20);
	}
	return NULL;
}

/* Map the fake BAR0, set CC/CSTS and the command register, start the model. */
static void fake_start(struct fake *f, uint32_t cc, uint32_t csts, uint16_t cmd)
{
	char path[512];
	/* CAP: MQES 2048, CQR, TO 1 (500 ms), CSS NVM, MPSMAX 64 KiB */
	uint64_t cap = 0x7ffull | (1ull << 16) | (1ull << 24) | (1ull << 37) | (4ull << 52);
	void *va;
	int fd;

	memset(f, 0, sizeof(*f));
	path_of(FN "/resource0", path, sizeof(path));
	fd = open(path, O_RDWR);
	va = fd < 0 ? MAP_FAILED : mmap(NULL, REGS, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (va == MAP_FAILED)
		exit(2);
	close(fd);
	f->regs = (volatile uint32_t *)va;
	memset(va, 0, REGS);
	f->regs[0] = (uint32_t)cap;
	f->regs[1] = (uint32_t)(cap >> 32);
	f->regs[UPCIE_NVME_REG_VS / 4] = 0x00010400;
	f->regs[UPCIE_NVME_REG_CC / 4] = cc;
	f->regs[UPCIE_NVME_REG_CSTS / 4] = csts;
	cmd_set(cmd);
	f->bm_at_disable = -1;
	f->run = 1;
	if (pthread_create(&f->thread, NULL, fake_thread, f))
		exit(2);
}

static void fake_stop(struct fake *f)
{
	__atomic_store_n(&f->run, 0, __ATOMIC_RELEASE);
	pthread_join(f->thread, NULL);
	munmap((void *)f->regs, REGS);
}

static struct upcie_nvme_ctrl_opts uio_opts(void)
{
	struct upcie_nvme_ctrl_opts o;

	memset(&o, 0, sizeof(o));
	o.dev.path = UPCIE_NVME_PATH_UIO;
	o.host_mem = 4u << 20;
	o.admin_timeout_ns = 100 * UPCIE_NSEC_PER_MSEC;
	return o;
}

/* Free 2 MiB hugepages in the real pool, or -1 when they cannot be used here (no root). */
static long free_hugepages(void)
{
	uint64_t nfree = 0, phys;
	static char probe[4096] __attribute__((aligned(4096)));

	probe[0] = 1;
	if (geteuid() != 0 || upcie_pagemap_phys(probe, &phys) ||
	    upcie_file_read_u64("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", &nfree))
		return -1;
	return (long)nfree;
}

/* kB of hugetlb memory this process has mapped (HugetlbPages in /proc/self/status). */
static long hugetlb_kb(void)
{
	char line[256];
	long kb = -1;
	FILE *fp = fopen("/proc/self/status", "r");

	while (fp && fgets(line, sizeof(line), fp))
		if (sscanf(line, "HugetlbPages: %ld kB", &kb) == 1)
			break;
	if (fp)
		fclose(fp);
	return kb;
}

/* A controller a killed process left enabled: stopped before bus mastering comes on. */
static void test_open_order(void)
{
	struct upcie_nvme_ctrl_opts o = uio_opts();
	struct upcie_nvme_ctrl c;
	struct fake f;
	int err;

	/* bus mastering off: uio_pci_generic cleared it when the dead process's /dev/uio0 closed */
	fake_start(&f, 1, 1, UPCIE_PCI_CMD_MEMORY);
	f.stale = true;
	f.cfs_on_enable = true; /* the bring-up fails right after; the order is what counts */
	err = upcie_nvme_ctrl_open(&c, NULL, &o);
	CHECK_EQ(err, -EINVAL, "open: NULL address");
	{
		struct upcie_pci_bdf bdf;

		upcie_pci_bdf_parse(BDF, &bdf);
		err = upcie_nvme_ctrl_open(&c, &bdf, &o);
	}
	fake_stop(&f);
	CHECK(err != 0, "open: fails after the stop (CFS on enable, or no hugepages: %d)", err);
	CHECK(f.disables >= 1, "open: the stale controller was disabled (%d)", f.disables);
	CHECK_EQ(f.bm_at_disable, 0, "open: it was stopped with bus mastering off");
	CHECK_EQ(f.bm_while_stale, 0, "open: bus mastering never came on while it still ran");
	CHECK(!(cmd_get() & UPCIE_PCI_CMD_MASTER), "open: bus mastering off after the failed open");
}

/* Named DMA memory files of the fake function on every hugetlbfs mount. */
static int dma_files(void)
{
	char cmd[256], out[32] = "";
	FILE *fp;

	snprintf(
	    cmd, sizeof(cmd),
	    "for d in $(awk '$3 == \"hugetlbfs\" { print $2 }' /proc/mounts); do "
	    "ls \"$d\" | grep -c '^upcie-dma-%s-'; done | awk '{ n += $1 } END { print n + 0 }'",
	    BDF);
	fp = popen(cmd, "r");
	if (!fp || !fgets(out, sizeof(out), fp))
		out[0] = '\0';
	if (fp)
		pclose(fp);
	return out[0] ? atoi(out) : -1;
}

struct keep_result {
	int err, enables;
	long before, after; /* HugetlbPages of the child, kB */
};

/*
 * Close with a controller that does not disable (`stuck`): the host memory stays owned, in the
 * process and, in its named hugetlbfs file, after the process is gone, until the next open of
 * the function (once its controller is stopped) or upcie_hugepage_reclaim() frees it. The
 * control: a controller that disables gives its memory back at close.
 */
static void test_keep(bool stuck)
{
	const char *what = stuck ? "keep" : "control";
	struct keep_result kr;
	int pfd[2], status, files, n;
	pid_t pid;

	if (free_hugepages() < 2 || hugetlb_kb() < 0 || pipe(pfd)) {
		for (int i = 0; i < 5; i++)
			CHECK_SKIP("%s: needs root and 2 free 2 MiB hugepages", what);
		return;
	}
	pid = fork();
	if (pid == 0) {
		struct upcie_nvme_ctrl_opts o = uio_opts();
		struct upcie_nvme_ctrl c;
		struct upcie_pci_bdf bdf;
		struct fake f;

		upcie_pci_bdf_parse(BDF, &bdf);
		memset(&kr, 0, sizeof(kr));
		kr.before = hugetlb_kb();
		fake_start(&f, 0, 0, UPCIE_PCI_CMD_MEMORY);
		f.stuck = stuck;
		f.cfs_on_enable = true;
		kr.err = upcie_nvme_ctrl_open(&c, &bdf, &o);
		fake_stop(&f);
		kr.after = hugetlb_kb();
		kr.enables = f.enables;
		_exit(write(pfd[1], &kr, sizeof(kr)) == (ssize_t)sizeof(kr) ? 0 : 1);
	}
	close(pfd[1]);
	n = pid > 0 ? (int)read(pfd[0], &kr, sizeof(kr)) : -1;
	close(pfd[0]);
	if (pid > 0)
		waitpid(pid, &status, 0);
	if (n != (int)sizeof(kr) || kr.err == -ENOMEM) {
		/* no report, or another process took the hugepages meanwhile */
		for (int i = 0; i < 5; i++)
			CHECK_SKIP("%s: the open did not get its 2 hugepages (%d)", what,
				   n == (int)sizeof(kr) ? kr.err : -1);
		return;
	}
	CHECK(kr.err == -EIO && kr.enables == 1,
	      "%s: the controller came up with a fatal status (open %d, %d enables)", what, kr.err,
	      kr.enables);
	if (stuck)
		CHECK_EQ(kr.after - kr.before, 4096,
			 "%s: it did not disable, so its 4 MiB of hugepages stay mapped and owned "
			 "(HugetlbPages %ld kB -> %ld kB)",
			 what, kr.before, kr.after);
	else
		CHECK_EQ(
		    kr.after - kr.before, 0,
		    "%s: it disabled, so its hugepages went back (HugetlbPages %ld kB -> %ld kB)",
		    what, kr.before, kr.after);
	CHECK(!(cmd_get() & UPCIE_PCI_CMD_MASTER), "%s: bus mastering off at the end", what);
	files = dma_files();
	{
		char dir[4096];

		if (upcie_hugetlbfs_mount(0, dir, sizeof(dir))) {
			CHECK_SKIP("%s: no hugetlbfs mount: the memory is in memfds", what);
			CHECK_SKIP("%s: (same)", what);
			return;
		}
	}
	if (stuck)
		CHECK(files >= 1,
		      "%s: after the process is gone its memory file is still there (%d), the "
		      "pages still allocated",
		      what, files);
	else
		CHECK_EQ(files, 0, "%s: no memory file left behind", what);
	n = upcie_hugepage_reclaim("upcie-dma-" BDF "-");
	CHECK(n == files && dma_files() == 0, "%s: reclaim removed %d of %d file(s)", what, n,
	      files);
}

/* The uio path: what it refuses, what it accepts, bus mastering at open and close, NUMA. */
static void test_dev(void)
{
	struct upcie_nvme_dev_opts o;
	struct upcie_nvme_dev d, d2;
	struct upcie_hugepage_opts hp;
	struct upcie_pci_bdf bdf;
	struct fake f;

	upcie_pci_bdf_parse(BDF, &bdf);
	memset(&o, 0, sizeof(o));
	o.path = UPCIE_NVME_PATH_UIO;
	fake_start(&f, 0, 0, UPCIE_PCI_CMD_MEMORY | UPCIE_PCI_CMD_MASTER);

	relink("../../../../kernel/iommu_groups/7", FN "/iommu_group");
	puts_("kernel/iommu_groups/7/type", "DMA\n");
	CHECK_EQ(upcie_nvme_dev_open(&d, &bdf, &o), -EOPNOTSUPP,
		 "dev: uio refused where the IOMMU translates");
	CHECK(strstr(last_msg, "translates") && strstr(last_msg, "vfio"),
	      "dev: the message says why and what to use (%s)", last_msg);
	CHECK(cmd_get() & UPCIE_PCI_CMD_MASTER, "dev: a refused function is left alone");
	puts_("kernel/iommu_groups/7/type", "identity\n");
	CHECK_EQ(upcie_nvme_dev_open(&d, &bdf, &o), 0, "dev: uio accepted on an identity domain");
	CHECK(d.uio.fd > 0, "dev: /dev/uio0 held");
	CHECK(!(cmd_get() & UPCIE_PCI_CMD_MASTER), "dev: open turned bus mastering off");
	CHECK(d.hp.numa && d.hp.node == 0, "dev: DMA memory goes to the function's node 0");
	CHECK_EQ(upcie_nvme_dev_open(&d2, &bdf, &o), -EBUSY, "dev: a second holder gets -EBUSY");
	CHECK_EQ(upcie_nvme_dev_bus_master(&d, true), 0, "dev: bus mastering on");
	upcie_nvme_dev_close(&d);
	CHECK(!(cmd_get() & UPCIE_PCI_CMD_MASTER), "dev: close turned it off");
	relink(NULL, FN "/iommu_group");

	memset(&hp, 0, sizeof(hp));
	hp.numa = true;
	hp.node = UPCIE_HUGEPAGE_NODE_ANY;
	o.hugepage = &hp;
	CHECK(upcie_nvme_dev_open(&d, &bdf, &o) == 0 && d.hp.node == UPCIE_HUGEPAGE_NODE_ANY,
	      "dev: the caller's placement wins");
	upcie_nvme_dev_close(&d);
	o.hugepage = NULL;

	relink(NULL, FN "/driver");
	CHECK_EQ(upcie_nvme_dev_open(&d, &bdf, &o), -ENXIO,
		 "dev: uio refused on an unbound function");
	CHECK(strstr(last_msg, "uio_pci_generic") != NULL, "dev: naming the driver to bind (%s)",
	      last_msg);
	relink("../../drivers/uio_pci_generic", FN "/driver");
	fake_stop(&f);
}

/*
 * The kernel's side of a bind, for the fake tree: the function's old driver (nvme) lets go when
 * its unbind file is written, and drivers_probe hands it to the driver in driver_override. Both
 * files are FIFOs read here, so the link has moved before the write to drivers_probe returns
 * (bind reads the link right after it); a bind that never writes them is given up after 5 s.
 */
struct fake_kernel {
	pthread_t thread;
	bool unbound;	   /* the old driver's unbind was written (the function's address) */
	bool probed;	   /* drivers_probe was written */
	char override[64]; /* driver_override when drivers_probe came */
};

/* Read a FIFO opened non-blocking until its writer has been and gone; false after 5 s. */
static bool fifo_drain(int fd, char *buf, size_t len)
{
	char chunk[64];
	size_t got = 0;

	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t n;

		if (poll(&p, 1, 5000) <= 0)
			return false;
		n = read(fd, chunk, sizeof(chunk));
		if (n > 0) {
			size_t take = (size_t)n < len - 1 - got ? (size_t)n : len - 1 - got;

			memcpy(buf + got, chunk, take); /* more than fits is read and dropped */
			got += take;
			continue;
		}
		if (n == 0 && (p.revents & POLLHUP)) {
			buf[got] = '\0';
			return true;
		}
	}
}

static void *fake_kernel_thread(void *arg)
{
	struct fake_kernel *k = (struct fake_kernel *)arg;
	char path[512], buf[64], target[128];
	int fd;
	FILE *fp;

	path_of("bus/pci/drivers/nvme/unbind", path, sizeof(path));
	fd = open(path, O_RDONLY | O_NONBLOCK);
	k->unbound = fd >= 0 && fifo_drain(fd, buf, sizeof(buf)) && !strcmp(buf, BDF);
	if (fd >= 0)
		close(fd);
	if (!k->unbound)
		return NULL;
	relink(NULL, FN "/driver");
	path_of(FN "/driver_override", path, sizeof(path));
	fp = fopen(path, "r");
	if (!fp || !fgets(k->override, sizeof(k->override), fp))
		k->override[0] = '\0';
	if (fp)
		fclose(fp);
	snprintf(target, sizeof(target), "../../drivers/%s", k->override);
	if (k->override[0])
		relink(target, FN "/driver");
	path_of("bus/pci/drivers_probe", path, sizeof(path));
	fd = open(path, O_RDONLY | O_NONBLOCK);
	k->probed = fd >= 0 && fifo_drain(fd, buf, sizeof(buf)) && !strcmp(buf, BDF);
	if (fd >= 0)
		close(fd);
	return NULL;
}

/* The function on the nvme driver, of class `cls`, with an empty driver_override. */
static void bind_setup(const char *cls, bool fifos)
{
	char path[512];

	mkdirs("bus/pci/drivers/nvme");
	mkdirs("class/block"); /* no block device: the in-use guard lets bind go on */
	path_of("bus/pci/drivers/nvme/unbind", path, sizeof(path));
	unlink(path);
	path_of("bus/pci/drivers_probe", path, sizeof(path));
	unlink(path);
	if (fifos) {
		path_of("bus/pci/drivers/nvme/unbind", path, sizeof(path));
		if (mkfifo(path, 0644))
			exit(2);
		path_of("bus/pci/drivers_probe", path, sizeof(path));
		if (mkfifo(path, 0644))
			exit(2);
	} else {
		puts_("bus/pci/drivers/nvme/unbind", "");
		puts_("bus/pci/drivers_probe", "");
	}
	puts_(FN "/driver_override", "");
	puts_(FN "/class", cls);
	relink("../../drivers/nvme", FN "/driver");
}

/* Back to the tree the other tests know: uio_pci_generic, NVMe class, no bind files. */
static void bind_restore(void)
{
	char path[512];

	path_of("bus/pci/drivers/nvme/unbind", path, sizeof(path));
	unlink(path);
	path_of("bus/pci/drivers/nvme", path, sizeof(path));
	rmdir(path);
	path_of("bus/pci/drivers_probe", path, sizeof(path));
	unlink(path);
	path_of(FN "/driver_override", path, sizeof(path));
	unlink(path);
	path_of("class/block", path, sizeof(path));
	rmdir(path);
	path_of("class", path, sizeof(path));
	rmdir(path);
	puts_(FN "/class", "0x010802\n");
	relink("../../drivers/uio_pci_generic", FN "/driver");
}

static void read_rel(const char *rel, char *buf, size_t len)
{
	char path[512];
	FILE *fp;

	path_of(rel, path, sizeof(path));
	buf[0] = '\0';
	fp = fopen(path, "r");
	if (fp && !fgets(buf, (int)len, fp))
		buf[0] = '\0';
	if (fp)
		fclose(fp);
}

static void driver_of(char *buf, size_t len)
{
	char path[512];
	ssize_t n;

	path_of(FN "/driver", path, sizeof(path));
	n = readlink(path, buf, len - 1);
	buf[n > 0 ? n : 0] = '\0';
}

/*
 * bind refuses a function whose class is not NVMe and leaves it alone (no driver_override, no
 * unbind, still on its driver), bind_in_use does not lift that, and the refusal names the
 * class; the messages of a function on the wrong driver suggest binding an NVMe controller only.
 */
static void test_bind_class_refused(void)
{
	struct upcie_nvme_dev_opts o;
	struct upcie_nvme_dev d;
	struct upcie_pci_bdf bdf;
	char buf[256];
	int err;

	upcie_pci_bdf_parse(BDF, &bdf);
	bind_setup("0x020000\n", false); /* an Ethernet controller */
	memset(&o, 0, sizeof(o));
	o.path = UPCIE_NVME_PATH_UIO;
	o.bind = true;
	last_msg[0] = '\0';
	err = upcie_nvme_dev_open(&d, &bdf, &o);
	CHECK_EQ(err, -ENODEV, "bind: a function of class 0x020000 is refused with -ENODEV");
	CHECK(strstr(last_msg, "0x020000") && strstr(last_msg, "not an NVMe controller") &&
		  strstr(last_msg, "bind_any_class"),
	      "bind: the refusal names the class found and the opt-in (%s)", last_msg);
	read_rel(FN "/driver_override", buf, sizeof(buf));
	CHECK(!buf[0], "bind: driver_override untouched (%s)", buf);
	read_rel("bus/pci/drivers/nvme/unbind", buf, sizeof(buf));
	CHECK(!buf[0], "bind: not unbound from its driver (%s)", buf);
	read_rel("bus/pci/drivers_probe", buf, sizeof(buf));
	CHECK(!buf[0], "bind: nothing probed (%s)", buf);
	driver_of(buf, sizeof(buf));
	CHECK(strstr(buf, "/nvme") != NULL, "bind: still on its driver (%s)", buf);

	o.bind_in_use = true;
	last_msg[0] = '\0';
	err = upcie_nvme_dev_open(&d, &bdf, &o);
	CHECK_EQ(err, -ENODEV, "bind: bind_in_use does not lift the class check");
	read_rel(FN "/driver_override", buf, sizeof(buf));
	CHECK(!buf[0], "bind: driver_override still untouched (%s)", buf);

	/* not asked to bind: the hints for a function of another class suggest no bind */
	o.bind = false;
	o.bind_in_use = false;
	last_msg[0] = '\0';
	CHECK_EQ(upcie_nvme_dev_open(&d, &bdf, &o), -EBUSY,
		 "hint: a function on another driver, no bind: -EBUSY");
	CHECK(strstr(last_msg, "not an NVMe controller") && strstr(last_msg, "0x020000") &&
		  !strstr(last_msg, "upcie-setup bind"),
	      "hint: class 0x020000 on nvme: no advice to bind it (%s)", last_msg);
	last_msg[0] = '\0';
	CHECK_EQ(upcie_pci_driver_require(&bdf, "uio_pci_generic"), -ENXIO,
		 "hint: driver_require on the wrong driver: -ENXIO");
	CHECK(strstr(last_msg, "0x020000") && !strstr(last_msg, "upcie-setup bind"),
	      "hint: driver_require gives no advice to bind class 0x020000 (%s)", last_msg);
	/* the control: an NVMe controller on the wrong driver is told how to bind it */
	puts_(FN "/class", "0x010802\n");
	last_msg[0] = '\0';
	CHECK_EQ(upcie_nvme_dev_open(&d, &bdf, &o), -EBUSY, "hint: NVMe on nvme, no bind: -EBUSY");
	CHECK(strstr(last_msg, "upcie-setup bind " BDF " uio_pci_generic") != NULL,
	      "hint: an NVMe controller gets the bind advice (%s)", last_msg);
	last_msg[0] = '\0';
	CHECK_EQ(upcie_pci_driver_require(&bdf, "uio_pci_generic"), -ENXIO,
		 "hint: driver_require on an NVMe controller: -ENXIO");
	CHECK(strstr(last_msg, "upcie-setup bind " BDF " uio_pci_generic") != NULL,
	      "hint: driver_require gives an NVMe controller the bind advice (%s)", last_msg);
	bind_restore();
}

/*
 * What bind does take: an NVMe controller as before, and another class with bind_any_class,
 * moved from nvme to uio_pci_generic by the fake kernel and opened.
 */
static void test_bind_class_taken(const char *cls, bool any_class, const char *what)
{
	struct upcie_nvme_dev_opts o;
	struct upcie_nvme_dev d;
	struct upcie_pci_bdf bdf;
	struct fake_kernel k;
	char buf[256];
	int err;

	upcie_pci_bdf_parse(BDF, &bdf);
	bind_setup(cls, true);
	memset(&k, 0, sizeof(k));
	if (pthread_create(&k.thread, NULL, fake_kernel_thread, &k))
		exit(2);
	memset(&o, 0, sizeof(o));
	o.path = UPCIE_NVME_PATH_UIO;
	o.bind = true;
	o.bind_any_class = any_class;
	last_msg[0] = '\0';
	err = upcie_nvme_dev_open(&d, &bdf, &o);
	pthread_join(k.thread, NULL);
	CHECK_EQ(err, 0, "%s: bind and open succeed (%s)", what, last_msg);
	CHECK(k.unbound && k.probed && !strcmp(k.override, "uio_pci_generic"),
	      "%s: driver_override uio_pci_generic, unbound from nvme, probed (%s)", what,
	      k.override);
	driver_of(buf, sizeof(buf));
	CHECK(strstr(buf, "/uio_pci_generic") != NULL, "%s: now on uio_pci_generic (%s)", what,
	      buf);
	CHECK(!err && d.uio.fd > 0, "%s: /dev/uio0 held", what);
	if (!err)
		upcie_nvme_dev_close(&d);
	bind_restore();
}

int main(void)
{
	char cmd[128];

	upcie_log_set_handler(capture, NULL);
	build_tree();
	test_open_order();
	test_keep(false);
	test_keep(true);
	test_dev();
	test_bind_class_refused();
	test_bind_class_taken("0x010802\n", false, "bind NVMe");
	test_bind_class_taken("0x020000\n", true, "bind_any_class");
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd))
		return 2;
	return check_done();
}
