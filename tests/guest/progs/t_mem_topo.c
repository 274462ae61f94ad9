/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest test for what the machine's topology asks of the memory layer (configuration D).
 *
 * Shared IOMMU group: NVMe c5 and the ivshmem function vrm2 are functions 0 and 1 of one device
 * without ACS, so Linux puts them in one IOMMU group (checked). Two group handles of one
 * container share the one open group file; the NVMe layer opens c5 on the type1 path and vrm2's
 * BAR as its peer in the same container, and c5 reads c5n1 into the BAR (vrm2.img on the host).
 *
 * NUMA: the process runs on CPU 0 (node 0); c4 sits behind an expander bridge on node 1. Its
 * host memory and DMA memory come from node 1, on the uio path (the vIOMMU passes addresses
 * through) and on the type1 path; the same allocation without placement lands on node 0 (the
 * control).
 *
 * Moving hugepages: a hugetlb page behind a physical-address LUT moves when asked
 * (move_pages), and upcie_hugepage_lut_verify() sees it (-ESTALE); a page pinned by vfio
 * does not move.
 *
 * Usage: t_mem_topo   (TB_C4_BDF, TB_C5_BDF, TB_VRM2_BDF, TB_NONCE; root; 16 free 2 MiB hugepages
 * on each node; c4 on uio_pci_generic, c5 and vrm2 on vfio-pci)
 */
#include <upcie/mem/dmamem_type1.h>
#include <upcie/mem/hugepage.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/dev.h>
#include <upcie/nvme/ns.h>
#include <upcie/pci/driver.h>
#include <upcie/vfio/type1.h>

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "t_nvme_util.h"

#define HUGE	     (2 * MiB)
#define VRM2_P2P_OFF (1 * MiB)

static struct upcie_pci_bdf g_c4, g_c5, g_vrm2;

static int done(void)
{
	printf("1..%d\n", tn_n);
	return tn_failed ? 1 : 0;
}

/* The node all 2 MiB pages of [va, +len) are on; -1 mixed, -2 the query failed. */
static int node_of(void *va, size_t len)
{
	void *pages[64];
	int status[64], node = -3;
	size_t n = len / HUGE;

	if (n > 64)
		n = 64;
	for (size_t i = 0; i < n; i++)
		pages[i] = (char *)va + i * HUGE;
	if (syscall(SYS_move_pages, 0, (unsigned long)n, pages, NULL, status, 0))
		return -2;
	for (size_t i = 0; i < n; i++) {
		if (node == -3)
			node = status[i];
		else if (status[i] != node)
			return -1;
	}
	return node;
}

/* Move the 2 MiB page at va to `node`: the syscall's answer (0: moved, >0 pages not moved). */
static long move_to(void *va, int node, int *status)
{
	void *pages[1] = { va };
	int nodes[1] = { node };

	*status = -1;
	return syscall(SYS_move_pages, 0, 1UL, pages, nodes, status, 0);
}

static int read_into(struct upcie_nvme_ctrl *c, const struct upcie_dmamem *mem, uint64_t off,
		     uint64_t len)
{
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	int err;

	memset(&qo, 0, sizeof(qo));
	qo.depth = 16;
	err = upcie_nvme_ns_open(&ns, c, 1);
	if (!err)
		err = upcie_nvme_ioq_create(&q, c, &qo);
	if (err)
		return err;
	err = upcie_nvme_ioq_read_sync(&q, &ns, 0, mem, off, len, NULL);
	upcie_nvme_ioq_delete(&q);
	return err;
}

static void test_group(void)
{
	static struct upcie_nvme_ctrl c;
	struct upcie_nvme_ctrl_opts o;
	struct upcie_vfio_container cont;
	struct upcie_vfio_group g1, g2;
	struct upcie_vfio_device d1, d2;
	struct upcie_nvme_peer peer;
	int gid = upcie_vfio_group_id(&g_c5), gid2 = upcie_vfio_group_id(&g_vrm2), err;
	char tag[9];
	int64_t diff = 0;

	TAP(gid >= 0 && gid == gid2,
	    "group: c5 and vrm2 (functions of one device, no ACS) share IOMMU group %d (%d)", gid,
	    gid2);
	if (gid < 0 || gid != gid2)
		return;

	err = upcie_vfio_container_open(&cont);
	if (!err)
		err = upcie_vfio_group_open(&g1, &cont, gid);
	TAP(!err, "group: opened once in a container (%d)", err);
	if (err)
		return;
	err = upcie_vfio_group_open(&g2, &cont, gid);
	TAP(!err && g2.fd == g1.fd && cont.ngroups == 1,
	    "group: a second handle on it shares the open group file (%d, %d groups)", err,
	    cont.ngroups);
	err = err ? err : upcie_vfio_device_open(&d1, &g1, &g_c5);
	if (!err)
		err = upcie_vfio_device_open(&d2, &g2, &g_vrm2);
	TAP(!err, "group: each function's device fd from its handle (%d)", err);
	if (!err) {
		upcie_vfio_device_close(&d1);
		upcie_vfio_device_close(&d2);
	}
	upcie_vfio_group_close(&g1);
	TAP(cont.ngroups == 1 && cont.iommu_set,
	    "group: closing one handle keeps the group in the container");
	upcie_vfio_group_close(&g2);
	TAP(cont.ngroups == 0 && !cont.iommu_set, "group: closing the last one detaches it");
	upcie_vfio_container_close(&cont);

	/* the NVMe layer: the controller and its peer BAR in one group */
	memset(&o, 0, sizeof(o));
	o.dev.path = UPCIE_NVME_PATH_TYPE1;
	o.host_mem = 4 * MiB;
	err = upcie_nvme_ctrl_open(&c, &g_c5, &o);
	TAP(!err, "group: c5 up on the type1 path (%d)", err);
	if (err)
		return;
	err = upcie_nvme_peer_open(&peer, &c.dev, &g_vrm2, 2, VRM2_P2P_OFF, MiB);
	TAP(!err, "group: vrm2 BAR2 [1 MiB, +1 MiB) opened as c5's peer in the same group (%d)",
	    err);
	if (!err) {
		err = read_into(&c, &peer.mem, 0, 64 * KiB);
		tn_tag(tag, "c5n1");
		diff = tn_pat_diff(peer.mem.vaddr, 64 * KiB, tag, 0);
		TAP(!err && diff < 0,
		    "group: c5 read c5n1 [0, 64 KiB) into vrm2's BAR (%d, first difference %" PRId64
		    ")",
		    err, diff);
		INFO("p2p_read_vrm2", "%" PRIu64 "+%" PRIu64 "+0", (uint64_t)VRM2_P2P_OFF,
		     64 * KiB);
		upcie_nvme_peer_close(&peer);
	}
	upcie_nvme_ctrl_close(&c);
}

/* c4's memory on its node; `path` uio or type1. */
static void numa_path(enum upcie_nvme_path path)
{
	static struct upcie_nvme_ctrl c;
	struct upcie_nvme_ctrl_opts o;
	struct upcie_dmamem mem;
	const char *name = path == UPCIE_NVME_PATH_UIO ? "uio" : "type1";
	int err, host_node = -9, mem_node = -9;

	memset(&o, 0, sizeof(o));
	o.dev.path = path;
	o.dev.bind = true;
	o.host_mem = 4 * MiB;
	err = upcie_nvme_ctrl_open(&c, &g_c4, &o);
	TAP(!err, "numa: c4 up on the %s path (%d)", name, err);
	if (err)
		return;
	host_node = node_of(c.host_own.vaddr, c.host_own.size);
	err = upcie_nvme_dev_dmamem(&c.dev, 4 * MiB, &mem);
	if (!err) {
		mem_node = node_of(mem.vaddr, mem.size);
		if (path == UPCIE_NVME_PATH_TYPE1) {
			int st, to = mem_node == 0 ? 1 : 0;
			uint64_t before = 0, after = 1;
			long r;

			upcie_pagemap_phys(mem.vaddr, &before);
			r = move_to(mem.vaddr, to, &st);
			upcie_pagemap_phys(mem.vaddr, &after);
			TAP(before == after && r != 0,
			    "moves: a hugepage pinned by vfio type1 does not move to node %d "
			    "(move_pages %ld, status %d, physical 0x%" PRIx64 " -> 0x%" PRIx64 ")",
			    to, r, st, before, after);
		}
		upcie_dmamem_destroy(&mem);
	}
	TAP(host_node == 1 && mem_node == 1,
	    "numa: %s: its host memory and DMA memory are on c4's node 1 (nodes %d and %d)", name,
	    host_node, mem_node);
	upcie_nvme_ctrl_close(&c);
}

static void test_numa(void)
{
	struct upcie_hugepage_opts o = { .src = UPCIE_HUGEPAGE_MEMFD };
	struct upcie_hugepage hp;
	struct upcie_pci_func fn;
	cpu_set_t set;
	int err;

	CPU_ZERO(&set);
	CPU_SET(0, &set);
	err = sched_setaffinity(0, sizeof(set), &set);
	TAP(!err && upcie_pci_func_read(&g_c4, &fn) == 0 && fn.numa_node == 1,
	    "numa: this process on CPU 0 (node 0), c4 on node %d", fn.numa_node);
	err = upcie_hugepage_alloc(&hp, 4 * MiB, &o);
	TAP(!err && node_of(hp.vaddr, hp.size) == 0,
	    "numa: control: hugepages without placement come from node 0, the CPU's (%d)",
	    err ? err : node_of(hp.vaddr, hp.size));
	if (!err)
		upcie_hugepage_free(&hp);
	numa_path(UPCIE_NVME_PATH_UIO);
	numa_path(UPCIE_NVME_PATH_TYPE1);
}

/* A page behind a physical-address LUT is not fixed: the kernel moves it when asked. */
static void test_moves(void)
{
	struct upcie_hugepage_opts o = { .src = UPCIE_HUGEPAGE_MEMFD, .numa = true, .node = 0 };
	struct upcie_dmamem mem;
	uint64_t before, after = 0;
	long r;
	int st, err;

	err = upcie_dmamem_hugepage_lut(&mem, HUGE, &o);
	TAP(!err && upcie_hugepage_lut_verify(&mem) == 0,
	    "moves: a hugepage LUT on node 0 matches pagemap (%d)", err);
	if (err)
		return;
	before = mem.lut[0];
	r = move_to(mem.vaddr, 1, &st);
	upcie_pagemap_phys(mem.vaddr, &after);
	TAP(r == 0 && st == 1 && after != before,
	    "moves: move_pages moved the in-use hugetlb page to node 1 (%ld, status %d, physical "
	    "0x%" PRIx64 " -> 0x%" PRIx64 ")",
	    r, st, before, after);
	err = upcie_hugepage_lut_verify(&mem);
	TAP(err == -ESTALE, "moves: upcie_hugepage_lut_verify() sees it: -ESTALE (%d)", err);
	upcie_dmamem_destroy(&mem);
}

int main(void)
{
	if (tn_bdf_env("TB_C4_BDF", &g_c4) || tn_bdf_env("TB_C5_BDF", &g_c5) ||
	    tn_bdf_env("TB_VRM2_BDF", &g_vrm2)) {
		fprintf(stderr, "t_mem_topo: TB_C4_BDF, TB_C5_BDF, TB_VRM2_BDF must be set\n");
		return 2;
	}
	upcie_log_set_handler(tn_log, NULL);
	test_group();
	test_numa();
	test_moves();
	return done();
}
