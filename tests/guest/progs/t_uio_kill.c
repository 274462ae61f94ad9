/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest test: a uio driver killed with reads in flight (configuration D: NVMe c4 behind the
 * vIOMMU in passthrough, its namespace's reads throttled so that they take seconds).
 *
 * A child brings c4 up on the uio path, submits reads into its hugepages, reports the pages'
 * physical addresses and how many reads completed so far, and is killed with SIGKILL. This
 * process, standing in for whoever gets the memory next, then takes every free hugepage of the
 * child's NUMA node (both run on a CPU of that node), fills them with a pattern and watches them
 * for longer than the remaining reads take: nothing may write into any of them.
 *
 * Two drivers:
 *   raw    maps BAR0 through sysfs, turns bus mastering on and brings the controller up with
 *          upcie_nvme_ctrl_init() over memfd hugepages, never opening /dev/uioN: the uio path as
 *          it was. The negative control: the dead driver's pages must come back to this process
 *          and the late reads land in them (as read data with c4n1's pattern), or the test could
 *          not see anything.
 *   upcie  upcie_nvme_ctrl_open() on the uio path, which holds /dev/uioN (the kernel turns bus
 *          mastering off as the process dies) and keeps its DMA memory in hugetlbfs files named
 *          after the function: they outlive the process, so the dead driver's hugepages do not
 *          go back to the pool; the next open stops the controller and only then frees them.
 *          (QEMU's NVMe model finishes reads it had already taken even with bus mastering
 *          off: the data lands where the dead driver pointed, which must still be its memory.)
 * Both also report the command register after the death (raw: bus mastering still on).
 *
 * Usage: t_uio_kill raw|upcie...   (in that order; TB_C4_BDF, TB_C4_READ_BPS, TB_NONCE; root;
 * free hugepages on the node of c4)
 */
#include <upcie/mem/hugepage.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>
#include <upcie/pci/bar.h>
#include <upcie/pci/config.h>

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "t_nvme_util.h"

#define NREADS	  32
#define READ_LEN  (64 * KiB)
#define MAX_PAGES 64
#define HUGE	  (2 * MiB)

struct report {
	int err;
	int node;
	uint32_t nsub, ndone;
	uint32_t npages;
	uint64_t pages[MAX_PAGES]; /* physical addresses of the child's hugepages */
};

static struct upcie_pci_bdf g_bdf;
static int g_raw;

static void add_pages(struct report *r, const struct upcie_dmamem *m)
{
	for (size_t i = 0; i < m->nlut && r->npages < MAX_PAGES; i++)
		r->pages[r->npages++] = m->lut[i];
}

/* The child: bring c4 up, submit the reads, report, wait for the kill. */
static void child(int wfd)
{
	static struct upcie_nvme_ctrl c;
	static struct upcie_nvme_req req[NREADS];
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct upcie_dmamem host, data;
	struct upcie_pci_func fn;
	struct upcie_pci_bar bar0;
	struct report r;
	int err;

	memset(&r, 0, sizeof(r));
	upcie_pci_func_read(&g_bdf, &fn);
	r.node = fn.numa_node;
	if (g_raw) {
		/* BAR0 through sysfs and bus mastering on: no /dev/uioN anywhere */
		err = upcie_pci_bar_map(&g_bdf, 0, 0, &bar0);
		if (!err)
			err = upcie_pci_bus_master_enable(&g_bdf);
		if (!err)
			err = upcie_dmamem_hugepage_lut(&host, HUGE, NULL);
		if (!err)
			err = upcie_nvme_ctrl_init(&c, bar0.addr, bar0.size, &host, NULL);
		if (!err)
			add_pages(&r, &host);
		if (!err)
			err = upcie_dmamem_hugepage_lut(&data, HUGE, NULL);
	} else {
		struct upcie_nvme_ctrl_opts o;

		memset(&o, 0, sizeof(o));
		o.dev.path = UPCIE_NVME_PATH_UIO;
		o.host_mem = HUGE;
		err = upcie_nvme_ctrl_open(&c, &g_bdf, &o);
		if (!err)
			add_pages(&r, &c.host_own);
		if (!err)
			err = upcie_nvme_dev_dmamem(&c.dev, HUGE, &data);
	}
	if (!err)
		add_pages(&r, &data);
	if (!err)
		err = upcie_nvme_ns_open(&ns, &c, 1);
	memset(&qo, 0, sizeof(qo));
	qo.depth = 64;
	if (!err)
		err = upcie_nvme_ioq_create(&q, &c, &qo);
	for (uint32_t i = 0; !err && i < NREADS; i++) {
		err = upcie_nvme_ioq_read(&q, &ns, i * (READ_LEN / ns.lba_bytes), &data,
					  i * READ_LEN, READ_LEN, &req[i]);
		r.nsub += !err;
	}
	if (!err) {
		int n = upcie_nvme_ioq_poll(&q, NREADS);

		r.ndone = n > 0 ? (uint32_t)n : 0;
	}
	r.err = err;
	if (write(wfd, &r, sizeof(r)) != (ssize_t)sizeof(r))
		_exit(3);
	for (;;)
		pause();
}

/*
 * Run on a CPU of the device's node, so that every hugepage here and in the child (raw driver,
 * next owner) comes from that node's pool; upcie's own allocations are placed there anyway.
 */
static void pin_to_node(const struct upcie_pci_bdf *bdf)
{
	char path[128], list[64] = "";
	struct upcie_pci_func fn;
	cpu_set_t set;
	int cpu;

	if (upcie_pci_func_read(bdf, &fn) || fn.numa_node < 0)
		return;
	snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", fn.numa_node);
	if (upcie_file_read_str(path, list, sizeof(list)) <= 0 || sscanf(list, "%d", &cpu) != 1)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		printf("# cannot run on CPU %d of node %d: %s\n", cpu, fn.numa_node,
		       strerror(errno));
}

static int done(void)
{
	printf("1..%d\n", tn_n);
	return tn_failed ? 1 : 0;
}

static uint16_t command_reg(void)
{
	uint16_t cmd = 0xffff;

	upcie_pci_config_read16(&g_bdf, UPCIE_PCI_CFG_COMMAND, &cmd);
	return cmd;
}

static uint64_t node_free(int node)
{
	char path[128];
	uint64_t v = 0;

	snprintf(path, sizeof(path),
		 "/sys/devices/system/node/node%d/hugepages/hugepages-2048kB/free_hugepages", node);
	upcie_file_read_u64(path, &v);
	return v;
}

/* The DMA memory files the dead child (pid) left for the function on the test bed's hugetlbfs
 * mount (/dev/hugepages), or -1. */
static int child_files(pid_t pid)
{
	char prefix[96];
	struct dirent *de;
	int n = 0;
	DIR *d = opendir("/dev/hugepages");

	if (!d)
		return -1;
	snprintf(prefix, sizeof(prefix), "upcie-dma-%s-%d-", getenv("TB_C4_BDF"), (int)pid);
	while ((de = readdir(d)))
		n += !strncmp(de->d_name, prefix, strlen(prefix));
	closedir(d);
	return n;
}

/* The next open stops the controller the dead child left, then frees what it left. */
static void reopen(pid_t pid, int node, uint32_t npages)
{
	static struct upcie_nvme_ctrl c;
	struct upcie_nvme_ctrl_opts o;
	uint64_t before = node_free(node < 0 ? 0 : node), after;
	int err;

	memset(&o, 0, sizeof(o));
	o.dev.path = UPCIE_NVME_PATH_UIO;
	o.host_mem = HUGE;
	err = upcie_nvme_ctrl_open(&c, &g_bdf, &o);
	after = node_free(node < 0 ? 0 : node);
	TAP(!err && child_files(pid) == 0 && after == before + npages - 1,
	    "the next open stopped the controller, then freed the dead driver's %u hugepages (%d; "
	    "%d files left; %" PRIu64 " free before, %" PRIu64 " after, 1 taken by the open)",
	    npages, err, child_files(pid), before, after);
	upcie_nvme_ctrl_close(&c);
}

static void run_one(const char *bdf, uint64_t bps)
{
	struct upcie_hugepage mine;
	struct report r;
	char tag[9];
	uint64_t nfree, changed = 0, dev_data = 0, back = 0, secs;
	int pfd[2], status;
	pid_t pid;
	ssize_t n;

	if (pipe(pfd)) {
		TAP(0, "pipe: %s", strerror(errno));
		return;
	}
	/* the reads left when the child dies, at the throttled rate, and a margin */
	secs = (uint64_t)NREADS * READ_LEN / bps + 3;

	pid = fork();
	if (pid == 0) {
		close(pfd[0]);
		child(pfd[1]);
	}
	close(pfd[1]);
	n = read(pfd[0], &r, sizeof(r));
	close(pfd[0]);
	TAP(pid > 0 && n == (ssize_t)sizeof(r) && !r.err && r.nsub == NREADS,
	    "the driver brought %s up and submitted %u reads of %" PRIu64 " KiB (%d)", bdf, r.nsub,
	    READ_LEN / KiB, n == (ssize_t)sizeof(r) ? r.err : -1);
	TAP(n == (ssize_t)sizeof(r) && r.ndone < r.nsub,
	    "%u of them still in flight when it is killed", r.nsub - r.ndone);
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	TAP(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the driver died of SIGKILL");
	if (n != (ssize_t)sizeof(r) || r.err)
		return;
	if (g_raw)
		TAP(command_reg() & UPCIE_PCI_CMD_MASTER,
		    "without /dev/uioN held, bus mastering stays on after the death (command "
		    "0x%04x)",
		    command_reg());
	else
		TAP(!(command_reg() & UPCIE_PCI_CMD_MASTER),
		    "the kernel turned bus mastering off as /dev/uioN was released (command "
		    "0x%04x)",
		    command_reg());

	/* the next owner: every free hugepage of the node, a pattern, and a watch */
	nfree = node_free(r.node < 0 ? 0 : r.node);
	if (!nfree || upcie_hugepage_alloc(&mine, nfree * HUGE, NULL)) {
		TAP(0, "took the %" PRIu64 " free hugepages of node %d", nfree, r.node);
		return;
	}
	memset(mine.vaddr, 0xa5, mine.size);
	for (uint64_t off = 0; off < mine.size; off += HUGE) {
		uint64_t phys = 0;

		if (upcie_pagemap_phys((char *)mine.vaddr + off, &phys))
			continue;
		for (uint32_t i = 0; i < r.npages; i++)
			back += r.pages[i] == phys;
	}
	if (g_raw)
		TAP(back > 0,
		    "%" PRIu64 " of the dead driver's %u hugepages are among the %" PRIu64
		    " this process took on node %d",
		    back, r.npages, nfree, r.node);
	else
		TAP(back == 0 && child_files(pid) == (int)r.npages,
		    "the dead driver's %u hugepages did not go back to the pool: its %d files stay "
		    "while its controller may run (%" PRIu64 " among the %" PRIu64 " this process "
		    "took)",
		    r.npages, child_files(pid), back, nfree);
	printf("# watching %" PRIu64 " MiB for %" PRIu64 " s\n", mine.size / MiB, secs);
	fflush(stdout);
	sleep((unsigned)secs);
	tn_tag(tag, "c4n1");
	for (uint64_t off = 0; off < mine.size; off += 512) {
		const uint8_t *p = (const uint8_t *)mine.vaddr + off;
		int diff = 0;

		for (int i = 0; i < 512; i++)
			diff |= p[i] != 0xa5;
		changed += diff;
		dev_data += diff && !memcmp(p + 8, tag, 8);
	}
	if (g_raw)
		TAP(changed > 0 && dev_data > 0,
		    "control: the late reads landed in memory this process owns now (%" PRIu64
		    " 512-byte units changed, %" PRIu64 " of them c4n1 data)",
		    changed, dev_data);
	else
		TAP(changed == 0,
		    "nothing was written into the freed hugepages after the kill (%" PRIu64
		    " 512-byte units changed, %" PRIu64 " of them c4n1 data)",
		    changed, dev_data);
	upcie_hugepage_free(&mine);
	if (!g_raw)
		reopen(pid, r.node, r.npages);
}

int main(int argc, char **argv)
{
	const char *bdf = getenv("TB_C4_BDF"), *bps = getenv("TB_C4_READ_BPS");

	if (argc < 2 || !bdf || !bps || upcie_pci_bdf_parse(bdf, &g_bdf) ||
	    !strtoull(bps, NULL, 0)) {
		fprintf(stderr, "usage: t_uio_kill raw|upcie... (TB_C4_BDF, TB_C4_READ_BPS set)\n");
		return 2;
	}
	upcie_log_set_handler(tn_log, NULL);
	pin_to_node(&g_bdf);
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "raw") && strcmp(argv[i], "upcie")) {
			fprintf(stderr, "t_uio_kill: unknown driver '%s'\n", argv[i]);
			return 2;
		}
		g_raw = !strcmp(argv[i], "raw");
		tn_prefix = g_raw ? "[raw] " : "[upcie] ";
		run_one(bdf, strtoull(bps, NULL, 0));
	}
	return done();
}
