/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A fake machine for tests of what reads sysfs and procfs: a temporary directory with sys/ and
 * proc/ laid out as Linux lays them out (functions under devices/pci*, bus/pci/devices links,
 * class/block links into the device tree, NVMe multipath heads under devices/virtual, IOMMU
 * groups), pointed at by UPCIE_SYSFS_ROOT and UPCIE_PROCFS_ROOT. fm_machine() builds the
 * standard machine the in-use and doctor tests share; tests then change single files to make
 * each fact true, false or unreadable.
 *
 *   0000:00:04.0  NVMe, nvme driver: nvme0n1, partitions p1 (mounted on /) and p2 (held by dm-0,
 *                 "vg-root"); IOMMU group 1
 *   0000:00:05.0  NVMe, nvme driver, multipath head nvme1n1 under devices/virtual, partition
 *                 nvme1n1p1 active swap; IOMMU group 2
 *   0000:00:06.0  Ethernet eth0, up, default route; IOMMU group 3
 *   0000:00:07.0  NVMe, vfio-pci, nvme2n1 idle (as after a kernel driver left it); group 4
 *   0000:00:08.0  NVMe, no driver, IOMMU group 5 shared with 0000:00:08.1, a SATA controller
 *                 whose sda1 is mounted on /data
 *   0000:00:09.0  NVIDIA 3D controller (10de:2335), BAR1 256 GiB; group 6
 *   0000:00:02.0  PCI bridge (root port) above nothing; group 0
 *
 * fm_uio_nvme() adds an NVMe function on uio_pci_generic with config space, a reset method and
 * a BAR0 file, for tests that open a controller on it (a register model serving the BAR0 file).
 */
#ifndef UPCIE_TEST_FAKE_MACHINE_H
#define UPCIE_TEST_FAKE_MACHINE_H

#include <upcie/base/feature.h>

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char fm_root[64];

static void fm_mkdirs(const char *rel)
{
	char path[1024], *p;

	snprintf(path, sizeof(path), "%s/%s", fm_root, rel);
	for (p = path + strlen(fm_root) + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			mkdir(path, 0755);
			*p = '/';
		}
	}
	mkdir(path, 0755);
}

/* Write `s` to file `rel` (parents created). */
static void fm_put(const char *rel, const char *s)
{
	char path[1024], dir[1024], *slash;
	int fd;

	snprintf(dir, sizeof(dir), "%s", rel);
	slash = strrchr(dir, '/');
	if (slash) {
		*slash = '\0';
		fm_mkdirs(dir);
	}
	snprintf(path, sizeof(path), "%s/%s", fm_root, rel);
	fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
	if (fd < 0 || write(fd, s, strlen(s)) != (ssize_t)strlen(s)) {
		perror(path);
		exit(2);
	}
	close(fd);
}

static void fm_rm(const char *rel)
{
	char path[1024];

	snprintf(path, sizeof(path), "%s/%s", fm_root, rel);
	unlink(path);
}

/* Symlink `rel` -> `target` (relative to the link's directory, as sysfs has them). */
static void fm_link(const char *target, const char *rel)
{
	char path[1024], dir[1024], *slash;

	snprintf(dir, sizeof(dir), "%s", rel);
	slash = strrchr(dir, '/');
	if (slash) {
		*slash = '\0';
		fm_mkdirs(dir);
	}
	snprintf(path, sizeof(path), "%s/%s", fm_root, rel);
	unlink(path);
	if (symlink(target, path)) {
		perror(path);
		exit(2);
	}
}

#define FM_DEV "sys/devices/pci0000:00/"

/*
 * A PCI function at sys/devices/<parent>/<bdf> ("pci0000:00", or a path through bridges), with
 * its bus/pci/devices link, ids, NUMA node, driver and IOMMU group (-1: none). Links are
 * absolute: what reads them resolves them the same way.
 */
static void fm_func_at(const char *parent, const char *bdf, const char *vendor, const char *device,
		       const char *cls, const char *driver, int group, int node)
{
	char dir[512], rel[640], tgt[768];

	snprintf(dir, sizeof(dir), "sys/devices/%s/%s", parent, bdf);
	snprintf(rel, sizeof(rel), "%s/vendor", dir);
	fm_put(rel, vendor);
	snprintf(rel, sizeof(rel), "%s/device", dir);
	fm_put(rel, device);
	snprintf(rel, sizeof(rel), "%s/class", dir);
	fm_put(rel, cls);
	snprintf(rel, sizeof(rel), "%s/numa_node", dir);
	snprintf(tgt, sizeof(tgt), "%d\n", node);
	fm_put(rel, tgt);
	snprintf(rel, sizeof(rel), "%s/resource", dir);
	fm_put(rel, "0x00000000febf0000 0x00000000febf3fff 0x0000000000140204\n");
	snprintf(rel, sizeof(rel), "sys/bus/pci/devices/%s", bdf);
	snprintf(tgt, sizeof(tgt), "%s/%s", fm_root, dir);
	fm_link(tgt, rel);
	if (driver) {
		snprintf(rel, sizeof(rel), "sys/bus/pci/drivers/%s/unbind", driver);
		fm_put(rel, "");
		snprintf(rel, sizeof(rel), "%s/driver", dir);
		snprintf(tgt, sizeof(tgt), "%s/sys/bus/pci/drivers/%s", fm_root, driver);
		fm_link(tgt, rel);
	}
	if (group >= 0) {
		snprintf(rel, sizeof(rel), "sys/kernel/iommu_groups/%d/type", group);
		fm_put(rel, "DMA\n");
		snprintf(rel, sizeof(rel), "%s/iommu_group", dir);
		snprintf(tgt, sizeof(tgt), "%s/sys/kernel/iommu_groups/%d", fm_root, group);
		fm_link(tgt, rel);
		snprintf(rel, sizeof(rel), "sys/kernel/iommu_groups/%d/devices/%s", group, bdf);
		snprintf(tgt, sizeof(tgt), "%s/%s", fm_root, dir);
		fm_link(tgt, rel);
	}
}

static void fm_func(const char *bdf, const char *vendor, const char *device, const char *cls,
		    const char *driver, int group)
{
	fm_func_at("pci0000:00", bdf, vendor, device, cls, driver, group, 0);
}

/* Block device `name` whose sysfs directory is `dir` (under sys/), with its class link. */
static void fm_block(const char *name, const char *dir, const char *dev)
{
	char rel[512], tgt[512];

	snprintf(rel, sizeof(rel), "sys/%s/dev", dir);
	fm_put(rel, dev);
	snprintf(rel, sizeof(rel), "sys/%s/holders", dir);
	fm_mkdirs(rel);
	snprintf(rel, sizeof(rel), "sys/class/block/%s", name);
	snprintf(tgt, sizeof(tgt), "../../%s", dir);
	fm_link(tgt, rel);
}

#define FM_MOUNTINFO                                                                               \
	"21 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw\n"                           \
	"22 21 0:5 / /proc rw - proc proc rw\n"                                                    \
	"23 21 8:1 / /data rw - xfs /dev/sda1 rw\n"
#define FM_SWAPS                                                                                   \
	"Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"                                       \
	"/dev/nvme1n1p1                          partition\t1048572\t\t0\t\t-2\n"
#define FM_ROUTE                                                                                   \
	"Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"    \
	"eth0\t00000000\t0102A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"                             \
	"eth0\t0002A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"

static void fm_machine(void)
{
	snprintf(fm_root, sizeof(fm_root), "/tmp/upcie-machine-XXXXXX");
	if (!mkdtemp(fm_root))
		exit(2);
	fm_mkdirs("sys/class/block");
	fm_mkdirs("sys/class/iommu/dmar0");
	fm_put("sys/bus/pci/drivers_probe", "");
	fm_func("0000:00:02.0", "0x8086\n", "0x29c0\n", "0x060400\n", "pcieport", 0);
	/* 04.0: plain namespace, partitions mounted and held */
	fm_func("0000:00:04.0", "0x1b36\n", "0x0010\n", "0x010802\n", "nvme", 1);
	fm_block("nvme0n1", "devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1", "259:0\n");
	fm_block("nvme0n1p1", "devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1/nvme0n1p1",
		 "259:1\n");
	fm_block("nvme0n1p2", "devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1/nvme0n1p2",
		 "259:2\n");
	fm_block("dm-0", "devices/virtual/block/dm-0", "254:0\n");
	fm_put("sys/devices/virtual/block/dm-0/dm/name", "vg-root\n");
	fm_link("../../../../../../../virtual/block/dm-0",
		"sys/devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1/nvme0n1p2/holders/dm-0");
	/* 05.0: multipath: the visible head lives under the subsystem, its path under the PCI
	 * function */
	fm_func("0000:00:05.0", "0x1b36\n", "0x0010\n", "0x010802\n", "nvme", 2);
	fm_mkdirs(FM_DEV "0000:00:05.0/nvme/nvme1/nvme1c1n1");
	fm_block("nvme1n1", "devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1", "259:3\n");
	fm_link("../../../../../pci0000:00/0000:00:05.0/nvme/nvme1/nvme1c1n1",
		"sys/devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1/multipath/nvme1c1n1");
	fm_block("nvme1n1p1", "devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1/nvme1n1p1",
		 "259:4\n");
	/* 06.0: the NIC the machine is reached through */
	fm_func("0000:00:06.0", "0x8086\n", "0x10d3\n", "0x020000\n", "e1000e", 3);
	fm_put(FM_DEV "0000:00:06.0/net/eth0/flags", "0x1003\n");
	fm_put(FM_DEV "0000:00:06.0/net/eth0/operstate", "up\n");
	/* 07.0: already with vfio-pci, a stale-free idle namespace */
	fm_func("0000:00:07.0", "0x1b36\n", "0x0010\n", "0x010802\n", "vfio-pci", 4);
	fm_block("nvme2n1", "devices/pci0000:00/0000:00:07.0/nvme/nvme2/nvme2n1", "259:5\n");
	/* 08.0 idle, its group sibling 08.1 holds a mounted disk */
	fm_func("0000:00:08.0", "0x1b36\n", "0x0010\n", "0x010802\n", NULL, 5);
	fm_func("0000:00:08.1", "0x8086\n", "0x2922\n", "0x010601\n", "ahci", 5);
	fm_block("sda", "devices/pci0000:00/0000:00:08.1/ata1/host0/target0:0:0/0:0:0:0/block/sda",
		 "8:0\n");
	fm_block("sda1",
		 "devices/pci0000:00/0000:00:08.1/ata1/host0/target0:0:0/0:0:0:0/block/sda/sda1",
		 "8:1\n");
	/* 09.0: a GPU */
	fm_func("0000:00:09.0", "0x10de\n", "0x2335\n", "0x030200\n", "nvidia", 6);
	fm_put(FM_DEV "0000:00:09.0/resource",
	       "0x0000000090000000 0x0000000090ffffff 0x0000000000040200\n"
	       "0x0000040000000000 0x0000043fffffffff 0x000000000014220c\n"
	       "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
	       "0x0000044000000000 0x0000044001ffffff 0x000000000014220c\n");

	fm_put("proc/self/mountinfo", FM_MOUNTINFO);
	fm_put("proc/swaps", FM_SWAPS);
	fm_put("proc/net/route", FM_ROUTE);
	fm_put("proc/net/ipv6_route", "");
	fm_put("proc/net/if_inet6", "");

	{
		char p[128];

		snprintf(p, sizeof(p), "%s/sys", fm_root);
		setenv("UPCIE_SYSFS_ROOT", p, 1);
		snprintf(p, sizeof(p), "%s/proc", fm_root);
		setenv("UPCIE_PROCFS_ROOT", p, 1);
	}
}

/* The path of `rel` under the fake root. */
static inline void fm_path(const char *rel, char *buf, size_t len)
{
	snprintf(buf, len, "%s/%s", fm_root, rel);
}

/* Write `len` bytes of `data` to file `rel` (parents created). */
static inline void fm_put_bin(const char *rel, const void *data, size_t len)
{
	char path[1024], dir[1024], *slash;
	int fd;

	snprintf(dir, sizeof(dir), "%s", rel);
	slash = strrchr(dir, '/');
	if (slash) {
		*slash = '\0';
		fm_mkdirs(dir);
	}
	fm_path(rel, path, sizeof(path));
	fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
	if (fd < 0 || write(fd, data, len) != (ssize_t)len) {
		perror(path);
		exit(2);
	}
	close(fd);
}

/*
 * An NVMe function `bdf` (under pci0000:00) as upcie's uio path finds it: bound to
 * uio_pci_generic, in IOMMU group `group` with an identity domain (the device sees physical
 * addresses), /dev/uio0 (UPCIE_DEV_ROOT is set to <root>/dev), 256 bytes of config space with
 * the command register 0, a reset method (the sysfs reset file, empty until written) and BAR0
 * as a file of `bar0` bytes (resource0, zeros) that the driver maps. After fm_machine().
 */
static inline void fm_uio_nvme(const char *bdf, int group, size_t bar0)
{
	char rel[512], line[128], path[512];
	uint8_t cfg[256];
	void *zero = calloc(1, bar0);

	if (!zero)
		exit(2);
	fm_func(bdf, "0x1b36\n", "0x0010\n", "0x010802\n", "uio_pci_generic", group);
	snprintf(rel, sizeof(rel), "sys/kernel/iommu_groups/%d/type", group);
	fm_put(rel, "identity\n");
	snprintf(rel, sizeof(rel), FM_DEV "%s/resource", bdf);
	snprintf(line, sizeof(line), "0x00000000febf0000 0x%016llx 0x0000000000140204\n",
		 (unsigned long long)(0xfebf0000ull + bar0 - 1));
	fm_put(rel, line);
	snprintf(rel, sizeof(rel), FM_DEV "%s/resource0", bdf);
	fm_put_bin(rel, zero, bar0);
	free(zero);
	memset(cfg, 0, sizeof(cfg));
	cfg[0] = 0x36, cfg[1] = 0x1b, cfg[2] = 0x10; /* 1b36:0010 */
	snprintf(rel, sizeof(rel), FM_DEV "%s/config", bdf);
	fm_put_bin(rel, cfg, sizeof(cfg));
	snprintf(rel, sizeof(rel), FM_DEV "%s/reset", bdf);
	fm_put(rel, "");
	snprintf(rel, sizeof(rel), FM_DEV "%s/uio/uio0", bdf);
	fm_mkdirs(rel);
	fm_put("dev/uio0", "");
	fm_path("dev", path, sizeof(path));
	setenv("UPCIE_DEV_ROOT", path, 1);
}

/* The command register in the config space of fake function `bdf` (0xffff: unreadable). */
static inline uint16_t fm_cfg_cmd(const char *bdf)
{
	char rel[512], path[1024];
	uint8_t v[2];
	int fd;

	snprintf(rel, sizeof(rel), FM_DEV "%s/config", bdf);
	fm_path(rel, path, sizeof(path));
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return 0xffff;
	if (pread(fd, v, 2, 4) != 2)
		v[0] = v[1] = 0xff;
	close(fd);
	return (uint16_t)(v[0] | v[1] << 8);
}

static inline void fm_cfg_cmd_set(const char *bdf, uint16_t cmd)
{
	char rel[512], path[1024];
	uint8_t v[2] = { (uint8_t)cmd, (uint8_t)(cmd >> 8) };
	int fd;

	snprintf(rel, sizeof(rel), FM_DEV "%s/config", bdf);
	fm_path(rel, path, sizeof(path));
	fd = open(path, O_WRONLY);
	if (fd < 0 || pwrite(fd, v, 2, 4) != 2) {
		perror(path);
		exit(2);
	}
	close(fd);
}

static void fm_cleanup(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", fm_root);
	if (system(cmd))
		fprintf(stderr, "cleanup of %s failed\n", fm_root);
}

#endif /* UPCIE_TEST_FAKE_MACHINE_H */
