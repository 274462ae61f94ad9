/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests for pci/: BDF parsing and formatting, and the sysfs layer against a fake sysfs tree
 * built in a temporary directory (UPCIE_SYSFS_ROOT): function info, scan order, config space and
 * capability walks, bus mastering, driver checks and binding, BAR mapping and its errors, IOMMU
 * modes from the group's name and type, sysfs resets, holding /dev/uioN (UPCIE_DEV_ROOT), and
 * (as root, in a private mount namespace) what every sysfs write says when /sys is read-only.
 */
#include <upcie/base/mmio.h>
#include <upcie/pci.h>

#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static char root[64];

static void put(const char *rel, const void *data, size_t len)
{
	char path[512];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
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
	char path[512], *p;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (p = path + strlen(root) + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			mkdir(path, 0755);
			*p = '/';
		}
	}
	mkdir(path, 0755);
}

static void link_(const char *target, const char *rel)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	if (symlink(target, path)) {
		perror(path);
		exit(2);
	}
}

static void unlink_(const char *rel)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	unlink(path);
}

static void read_back(const char *rel, char *buf, size_t len)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	if (upcie_file_read_str(path, buf, len) < 0)
		buf[0] = '\0';
}

#define NVME "bus/pci/devices/0000:00:04.0"
#define SHM  "bus/pci/devices/0000:00:05.0"
#define UIO  "bus/pci/devices/0000:00:07.0"
#define NOIO "bus/pci/devices/0000:00:08.0"

static char last_msg[1024];

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	snprintf(last_msg, sizeof(last_msg), "%s", msg);
}

static void build_tree(void)
{
	uint8_t cfg[256] = { 0 };
	char bar0[16384], path[512];

	snprintf(root, sizeof(root), "/tmp/upcie-sysfs-XXXXXX");
	if (!mkdtemp(root))
		exit(2);
	mkdirs(NVME);
	mkdirs(SHM);
	mkdirs("bus/pci/devices/garbage");
	mkdirs("bus/pci/drivers/nvme");
	mkdirs("bus/pci/drivers/uio_pci_generic");
	mkdirs("kernel/iommu_groups/3");
	puts_("bus/pci/drivers_probe", "");
	puts_("bus/pci/drivers/nvme/unbind", "");

	puts_(NVME "/vendor", "0x1b36\n");
	puts_(NVME "/device", "0x0010\n");
	puts_(NVME "/class", "0x010802\n");
	puts_(NVME "/subsystem_vendor", "0x1af4\n");
	puts_(NVME "/subsystem_device", "0x1100\n");
	puts_(NVME "/revision", "0x02\n");
	puts_(NVME "/numa_node", "-1\n");
	puts_(NVME "/driver_override", "(null)\n");
	puts_(NVME "/resource", "0x00000000febf0000 0x00000000febf3fff 0x0000000000140204\n"
				"0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
				"0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
				"0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
				"0x000000000000c000 0x000000000000c03f 0x0000000000040101\n"
				"0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
				"0x00000000feb80000 0x00000000febbffff 0x0000000000046200\n");
	memset(bar0, 0, sizeof(bar0));
	memcpy(bar0, "\xff\x07\x01\x0f\x20\x18\x40\x00", 8); /* CAP */
	memcpy(bar0 + 8, "\x00\x04\x01\x00", 4);	     /* VS 1.4 */
	put(NVME "/resource0", bar0, sizeof(bar0));
	link_("../../drivers/nvme", NVME "/driver");
	link_("../../../../kernel/iommu_groups/3", NVME "/iommu_group");
	/* Config: caps PM@0x40 -> MSI-X@0x50 -> EXP@0x60. */
	cfg[0] = 0x36, cfg[1] = 0x1b, cfg[2] = 0x10, cfg[3] = 0x00;
	cfg[4] = 0x02;	  /* command: memory space */
	cfg[6] = 0x10;	  /* status: capability list */
	cfg[0x34] = 0x40; /* capability pointer */
	cfg[0x40] = 0x01, cfg[0x41] = 0x50;
	cfg[0x50] = 0x11, cfg[0x51] = 0x60;
	cfg[0x60] = 0x10, cfg[0x61] = 0x00;
	put(NVME "/config", cfg, sizeof(cfg));

	puts_(SHM "/vendor", "0x1af4\n");
	puts_(SHM "/device", "0x1110\n");
	puts_(SHM "/class", "0x050000\n");
	puts_(SHM "/numa_node", "0\n");
	puts_(SHM "/resource", "0x00000000febd1000 0x00000000febd10ff 0x0000000000040200\n"
			       "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
			       "0x0000000800000000 0x0000000803ffffff 0x000000000014220c\n");
	/* Config whose capability list loops on itself. */
	memset(cfg, 0, sizeof(cfg));
	cfg[6] = 0x10, cfg[0x34] = 0x40, cfg[0x40] = 0x09, cfg[0x41] = 0x40;
	put(SHM "/config", cfg, sizeof(cfg));

	/* a function on uio_pci_generic, in an identity (passthrough) group, with a reset */
	mkdirs(UIO "/uio/uio3");
	mkdirs("dev");
	mkdirs("kernel/iommu_groups/4");
	mkdirs("kernel/iommu_groups/5");
	puts_(UIO "/vendor", "0x1b36\n");
	puts_(UIO "/device", "0x0010\n");
	puts_(UIO "/class", "0x010802\n");
	puts_(UIO "/reset", "");
	puts_("dev/uio3", "");
	link_("../../drivers/uio_pci_generic", UIO "/driver");
	link_("../../../../kernel/iommu_groups/4", UIO "/iommu_group");
	puts_("kernel/iommu_groups/3/type", "DMA-FQ\n");
	puts_("kernel/iommu_groups/4/type", "identity\n");
	/* vfio's made-up group of no-IOMMU mode */
	mkdirs(NOIO);
	puts_(NOIO "/vendor", "0x1b36\n");
	puts_(NOIO "/device", "0x0010\n");
	puts_(NOIO "/class", "0x010802\n");
	link_("../../../../kernel/iommu_groups/5", NOIO "/iommu_group");
	puts_("kernel/iommu_groups/5/name", "vfio-noiommu\n");
	puts_("kernel/iommu_groups/5/type", "unknown\n");
	setenv("UPCIE_SYSFS_ROOT", root, 1);
	snprintf(path, sizeof(path), "%s/dev", root);
	setenv("UPCIE_DEV_ROOT", path, 1);
}

static void test_bdf(void)
{
	struct upcie_pci_bdf b;
	char buf[UPCIE_PCI_BDF_STRLEN];
	static const char *const bad[] = { "",		 "0000:00:04",	  "0000:00:04.8",
					   "00:20.0",	 "0000:100:00.0", "0000:00:04.0 ",
					   " 00:04.0",	 "0000:0g:00.0",  "123456789:00:00.0",
					   "0000::00.0", "0000:00:00.",	  "a:b:c:d.0",
					   "00:04.00" };

	CHECK(upcie_pci_bdf_parse("0000:00:04.0", &b) == 0 && b.domain == 0 && b.bus == 0 &&
		  b.dev == 4 && b.fn == 0,
	      "parse full BDF");
	CHECK(upcie_pci_bdf_parse("af:1f.7", &b) == 0 && b.domain == 0 && b.bus == 0xaf &&
		  b.dev == 0x1f && b.fn == 7,
	      "parse short BDF");
	CHECK(upcie_pci_bdf_parse("10000:E1:00.3", &b) == 0 && b.domain == 0x10000 && b.bus == 0xe1,
	      "parse VMD-style 5-digit domain, upper-case hex");
	CHECK(upcie_pci_bdf_format(&b, buf, sizeof(buf)) > 0 && !strcmp(buf, "10000:e1:00.3"),
	      "format round trip");
	CHECK_EQ(upcie_pci_bdf_format(&b, buf, 8), -ENOSPC, "format into a short buffer");
	upcie_log_set_level(UPCIE_LOG_NONE);
	for (size_t i = 0; i < UPCIE_ARRAY_SIZE(bad); i++)
		CHECK_EQ(upcie_pci_bdf_parse(bad[i], &b), -EINVAL, "reject malformed '%s'", bad[i]);
	CHECK_EQ(upcie_pci_bdf_parse(NULL, &b), -EINVAL, "reject NULL");
	upcie_log_set_level(UPCIE_LOG_ERROR);
	{
		struct upcie_pci_bdf x, y;

		upcie_pci_bdf_parse("0000:01:00.0", &x);
		upcie_pci_bdf_parse("0000:00:1f.7", &y);
		CHECK(upcie_pci_bdf_cmp(&y, &x) < 0 && upcie_pci_bdf_cmp(&x, &y) > 0 &&
			  upcie_pci_bdf_cmp(&x, &x) == 0 && upcie_pci_bdf_equal(&x, &x),
		      "bdf ordering");
	}
}

struct scan_ctx {
	int n;
	char names[4][UPCIE_PCI_BDF_STRLEN];
};

static int scan_cb(const struct upcie_pci_func *fn, void *p)
{
	struct scan_ctx *c = (struct scan_ctx *)p;

	if (c->n < 4)
		strcpy(c->names[c->n], fn->name);
	c->n++;
	return 0;
}

static int scan_stop(const struct upcie_pci_func *fn, void *p)
{
	(void)fn;
	(void)p;
	return 42;
}

static void test_func(void)
{
	struct upcie_pci_bdf nvme, shm, none;
	struct upcie_pci_func fn;
	struct scan_ctx sc = { 0 };

	upcie_pci_bdf_parse("0000:00:04.0", &nvme);
	upcie_pci_bdf_parse("0000:00:05.0", &shm);
	upcie_pci_bdf_parse("0000:00:06.0", &none);
	CHECK_EQ(upcie_pci_func_read(&nvme, &fn), 0, "read NVMe function");
	CHECK(fn.vendor == 0x1b36 && fn.device == 0x0010 && fn.class_code == UPCIE_PCI_CLASS_NVME &&
		  fn.subsys_vendor == 0x1af4 && fn.revision == 2,
	      "ids and class");
	CHECK(!strcmp(fn.driver, "nvme") && fn.iommu_group == 3 && fn.numa_node == -1,
	      "driver, IOMMU group, NUMA node");
	CHECK(fn.res[0].start == 0xfebf0000 && fn.res[0].size == 0x4000 &&
		  (fn.res[0].flags & UPCIE_PCI_RES_MEM) && fn.res[1].size == 0,
	      "BAR0 resource, BAR1 absent");
	CHECK((fn.res[4].flags & UPCIE_PCI_RES_IO) && fn.res[6].size == 0x40000, "I/O BAR and ROM");
	CHECK_EQ(upcie_pci_func_read(&shm, &fn), 0, "read ivshmem function");
	CHECK(fn.driver[0] == '\0' && fn.iommu_group == -1 && fn.numa_node == 0,
	      "no driver, no IOMMU group");
	CHECK(fn.res[2].start == 0x800000000ull && fn.res[2].size == 64ull << 20 &&
		  (fn.res[2].flags & UPCIE_PCI_RES_PREFETCH),
	      "64-bit prefetchable BAR2");
	upcie_log_set_level(UPCIE_LOG_NONE);
	CHECK_EQ(upcie_pci_func_read(&none, &fn), -ENODEV, "missing function is -ENODEV");
	upcie_log_set_level(UPCIE_LOG_ERROR);
	CHECK_EQ(upcie_pci_scan(scan_cb, &sc), 0, "scan");
	CHECK(sc.n == 4 && !strcmp(sc.names[0], "0000:00:04.0") &&
		  !strcmp(sc.names[1], "0000:00:05.0") && !strcmp(sc.names[2], "0000:00:07.0") &&
		  !strcmp(sc.names[3], "0000:00:08.0"),
	      "scan visits every function in order and skips non-BDF entries (%d)", sc.n);
	CHECK_EQ(upcie_pci_scan(scan_stop, NULL), 42, "scan stops with the callback's value");

	/* found by fuzz_pci: the group number was atoi() of the link name */
	upcie_log_set_level(UPCIE_LOG_NONE);
	link_("../../../../kernel/iommu_groups/abc", "bus/pci/devices/0000:00:05.0/iommu_group");
	CHECK_EQ(upcie_pci_func_read(&shm, &fn), -EINVAL,
		 "an iommu_group link to 'abc' is not group 0: -EINVAL");
	unlink_("bus/pci/devices/0000:00:05.0/iommu_group");
	link_("../../../../kernel/iommu_groups/99999999999",
	      "bus/pci/devices/0000:00:05.0/iommu_group");
	CHECK_EQ(upcie_pci_func_read(&shm, &fn), -EINVAL, "nor is '99999999999' (beyond int)");
	unlink_("bus/pci/devices/0000:00:05.0/iommu_group");
	link_("../../../../kernel/iommu_groups/2147483647",
	      "bus/pci/devices/0000:00:05.0/iommu_group");
	CHECK(upcie_pci_func_read(&shm, &fn) == 0 && fn.iommu_group == 2147483647,
	      "'2147483647' is group 2147483647");
	unlink_("bus/pci/devices/0000:00:05.0/iommu_group");
	link_("../../../../kernel/iommu_groups/abc", "bus/pci/devices/0000:00:05.0/iommu_group");
	{
		enum upcie_pci_iommu mode;
		int group = 7;

		CHECK(upcie_pci_func_iommu(&shm, &mode, &group, NULL, 0) == -EINVAL && group == -1,
		      "iommu: a link to 'abc' is no group either: -EINVAL, group -1 (%d)", group);
	}
	unlink_("bus/pci/devices/0000:00:05.0/iommu_group");
	upcie_log_set_level(UPCIE_LOG_ERROR);
}

static void test_config(void)
{
	struct upcie_pci_bdf nvme, shm, none;
	uint16_t v16;
	uint32_t v32;
	uint8_t buf[8];
	bool was;

	upcie_pci_bdf_parse("0000:00:04.0", &nvme);
	upcie_pci_bdf_parse("0000:00:05.0", &shm);
	upcie_pci_bdf_parse("0000:00:06.0", &none);
	CHECK(upcie_pci_config_read16(&nvme, 0, &v16) == 0 && v16 == 0x1b36, "config vendor id");
	CHECK(upcie_pci_config_read32(&nvme, 0, &v32) == 0 && v32 == 0x00101b36, "config dword 0");
	CHECK_EQ(upcie_pci_cap_find(&nvme, UPCIE_PCI_CAP_MSIX), 0x50, "find MSI-X capability");
	CHECK_EQ(upcie_pci_cap_find(&nvme, UPCIE_PCI_CAP_EXP), 0x60, "find last capability");
	CHECK_EQ(upcie_pci_cap_find(&nvme, UPCIE_PCI_CAP_MSI), -ENOENT, "absent capability");
	CHECK_EQ(upcie_pci_cap_find(&shm, UPCIE_PCI_CAP_MSIX), -ENOENT,
		 "looping capability list ends");
	CHECK_EQ(upcie_pci_ecap_find(&nvme, UPCIE_PCI_ECAP_AER), -ENOENT,
		 "no extended capabilities in a 256-byte config space");
	CHECK(upcie_pci_bus_master_set(&nvme, true, &was) == 0 && !was, "enable bus mastering");
	CHECK(upcie_pci_config_read16(&nvme, UPCIE_PCI_CFG_COMMAND, &v16) == 0 && v16 == 0x0006,
	      "command register has master + memory");
	CHECK(upcie_pci_bus_master_set(&nvme, false, &was) == 0 && was, "disable bus mastering");
	CHECK(upcie_pci_config_read16(&nvme, UPCIE_PCI_CFG_COMMAND, &v16) == 0 && v16 == 0x0002,
	      "master cleared, memory kept");
	upcie_log_set_level(UPCIE_LOG_NONE);
	CHECK_EQ(upcie_pci_config_read(&nvme, 4095, buf, 2), -EINVAL, "read past 4 KiB refused");
	CHECK_EQ(upcie_pci_config_read(&nvme, 0, buf, 0), -EINVAL, "zero-length read refused");
	CHECK_EQ(upcie_pci_config_read(&none, 0, buf, 2), -ENODEV, "config of missing function");
	CHECK_EQ(upcie_pci_config_read(&nvme, 250, buf, 8), -EIO,
		 "short read past the end of config space");
	upcie_log_set_level(UPCIE_LOG_ERROR);
}

static void test_driver(void)
{
	struct upcie_pci_bdf nvme, shm, none;
	char buf[64];

	upcie_pci_bdf_parse("0000:00:04.0", &nvme);
	upcie_pci_bdf_parse("0000:00:05.0", &shm);
	upcie_pci_bdf_parse("0000:00:06.0", &none);
	CHECK(upcie_pci_driver_get(&nvme, buf, sizeof(buf)) == 0 && !strcmp(buf, "nvme"),
	      "driver_get");
	CHECK(upcie_pci_driver_get(&shm, buf, sizeof(buf)) == 0 && buf[0] == '\0',
	      "driver_get unbound");
	CHECK_EQ(upcie_pci_driver_require(&nvme, "nvme"), 0, "require the bound driver");
	upcie_log_set_level(UPCIE_LOG_NONE);
	CHECK_EQ(upcie_pci_driver_require(&nvme, "vfio-pci"), -ENXIO, "require another driver");
	CHECK_EQ(upcie_pci_driver_require(&shm, "vfio-pci"), -ENXIO, "require on unbound");
	CHECK_EQ(upcie_pci_driver_require(&none, "nvme"), -ENODEV, "require on missing function");
	CHECK_EQ(upcie_pci_driver_loaded("vfio-pci"), -ENOENT, "driver not loaded");
	CHECK_EQ(upcie_pci_driver_loaded("../x"), -EINVAL, "driver name with a slash");
	CHECK_EQ(upcie_pci_driver_bind(&nvme, "vfio-pci"), -ENOENT, "bind to a missing driver");
	CHECK_EQ(upcie_pci_driver_bind(&none, "nvme"), -ENODEV, "bind a missing function");
	CHECK_EQ(upcie_pci_driver_bind(&nvme, "nvme"), 0, "bind to the current driver is a no-op");
	/* The fake tree has no kernel behind it: the link does not move, so bind must fail. */
	CHECK_EQ(upcie_pci_driver_bind(&nvme, "uio_pci_generic"), -EIO,
		 "bind reports a driver that did not take the function");
	upcie_log_set_level(UPCIE_LOG_ERROR);
	read_back(NVME "/driver_override", buf, sizeof(buf));
	CHECK(!strcmp(buf, "uio_pci_generic"), "driver_override written (%s)", buf);
	read_back("bus/pci/drivers/nvme/unbind", buf, sizeof(buf));
	CHECK(!strcmp(buf, "0000:00:04.0"), "unbind written to the old driver (%s)", buf);
	read_back("bus/pci/drivers_probe", buf, sizeof(buf));
	CHECK(!strcmp(buf, "0000:00:04.0"), "drivers_probe written (%s)", buf);
	CHECK_EQ(upcie_pci_driver_unbind(&shm), 0, "unbind of an unbound function is a no-op");
}

static void test_bar(void)
{
	struct upcie_pci_bdf nvme, shm, none;
	struct upcie_pci_bar bar, zero;

	upcie_pci_bdf_parse("0000:00:04.0", &nvme);
	upcie_pci_bdf_parse("0000:00:05.0", &shm);
	upcie_pci_bdf_parse("0000:00:06.0", &none);
	CHECK_EQ(upcie_pci_bar_map(&nvme, 0, 0, &bar), 0, "map BAR0");
	CHECK(bar.size == 16384 && bar.phys == 0xfebf0000 && bar.index == 0, "BAR0 geometry");
	CHECK(bar.addr && upcie_mmio_read64(bar.addr, 0) == 0x004018200f0107ffull &&
		  upcie_mmio_read32(bar.addr, 8) == 0x00010400,
	      "CAP and VS through the mapping");
	upcie_pci_bar_unmap(&bar);
	CHECK(bar.addr == NULL, "unmap clears the mapping");
	upcie_pci_bar_unmap(&bar);
	memset(&zero, 0, sizeof(zero));
	upcie_pci_bar_unmap(&zero);
	upcie_log_set_level(UPCIE_LOG_NONE);
	CHECK_EQ(upcie_pci_bar_map(&nvme, 6, 0, &bar), -EINVAL, "BAR index 6 out of range");
	CHECK_EQ(upcie_pci_bar_map(&nvme, -1, 0, &bar), -EINVAL, "BAR index -1 out of range");
	CHECK_EQ(upcie_pci_bar_map(&nvme, 0, 0x80, &bar), -EINVAL, "unknown flags");
	CHECK_EQ(upcie_pci_bar_map(&nvme, 1, 0, &bar), -ENOENT, "unimplemented BAR");
	CHECK_EQ(upcie_pci_bar_map(&nvme, 4, 0, &bar), -EOPNOTSUPP, "I/O BAR");
	CHECK_EQ(upcie_pci_bar_map(&nvme, 0, UPCIE_PCI_BAR_WC, &bar), -EOPNOTSUPP,
		 "WC on a non-prefetchable BAR");
	CHECK_EQ(upcie_pci_bar_map(&none, 0, 0, &bar), -ENODEV, "BAR of a missing function");
	CHECK_EQ(upcie_pci_bar_map(&shm, 2, UPCIE_PCI_BAR_WC, &bar), -ENOENT,
		 "WC BAR file missing in the tree");
	CHECK(bar.addr == NULL, "failed map leaves the bar unmapped");
	upcie_log_set_level(UPCIE_LOG_ERROR);
}

/* How the IOMMU treats each function, from its group's name and type. */
static void test_iommu(void)
{
	struct upcie_pci_bdf nvme, shm, uio, noio;
	enum upcie_pci_iommu mode = UPCIE_PCI_IOMMU_UNKNOWN;
	char type[32];
	int group = 0;

	upcie_pci_bdf_parse("0000:00:04.0", &nvme);
	upcie_pci_bdf_parse("0000:00:05.0", &shm);
	upcie_pci_bdf_parse("0000:00:07.0", &uio);
	upcie_pci_bdf_parse("0000:00:08.0", &noio);
	CHECK(upcie_pci_func_iommu(&nvme, &mode, &group, type, sizeof(type)) == 0 &&
		  mode == UPCIE_PCI_IOMMU_TRANSLATED && group == 3 && !strcmp(type, "DMA-FQ"),
	      "iommu: group 3 of type DMA-FQ translates (%d, %d, %s)", (int)mode, group, type);
	CHECK(upcie_pci_func_iommu(&shm, &mode, &group, NULL, 0) == 0 &&
		  mode == UPCIE_PCI_IOMMU_NONE && group == -1,
	      "iommu: no group, no IOMMU");
	CHECK(upcie_pci_func_iommu(&uio, &mode, &group, type, sizeof(type)) == 0 &&
		  mode == UPCIE_PCI_IOMMU_IDENTITY && group == 4,
	      "iommu: an identity domain passes physical addresses through");
	CHECK(upcie_pci_func_iommu(&noio, &mode, &group, type, sizeof(type)) == 0 &&
		  mode == UPCIE_PCI_IOMMU_VFIO_NOIOMMU && group == 5,
	      "iommu: vfio's no-IOMMU group is told apart (%d)", (int)mode);
}

/* /dev/uioN: held, moved high, exclusive; the function must be on uio_pci_generic. */
static void test_uio(void)
{
	struct upcie_pci_bdf nvme, shm, uio;
	struct upcie_pci_uio u, u2;
	struct rlimit rl;
	long top = 65535;

	upcie_pci_bdf_parse("0000:00:04.0", &nvme);
	upcie_pci_bdf_parse("0000:00:05.0", &shm);
	upcie_pci_bdf_parse("0000:00:07.0", &uio);
	CHECK_EQ(upcie_pci_uio_index(&uio), 3, "uio: the function's uio device is uio3");
	CHECK_EQ(upcie_pci_uio_open(&uio, &u), 0, "uio: /dev/uio3 opened and held");
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    (long)rl.rlim_cur - 1 < top)
		top = (long)rl.rlim_cur - 1;
	CHECK(u.fd >= top - 64 && u.fd <= top,
	      "uio: its descriptor (%d) sits above those opened later (%ld..%ld)", u.fd, top - 64,
	      top);
	CHECK(fcntl(u.fd, F_GETFD) & FD_CLOEXEC, "uio: close-on-exec");
	CHECK_EQ(upcie_pci_uio_open(&uio, &u2), -EBUSY, "uio: a second holder gets -EBUSY");
	CHECK(strstr(last_msg, "held by another process") != NULL, "uio: and is told why (%s)",
	      last_msg);
	upcie_pci_uio_close(&u);
	CHECK(u.fd == -1, "uio: closed");
	CHECK_EQ(upcie_pci_uio_open(&uio, &u2), 0, "uio: free again after close");
	upcie_pci_uio_close(&u2);
	upcie_pci_uio_close(&u2);
	CHECK_EQ(upcie_pci_uio_open(&shm, &u), -ENXIO, "uio: an unbound function is refused");
	CHECK(strstr(last_msg, "not bound to any driver") && strstr(last_msg, "uio_pci_generic"),
	      "uio: naming the fix (%s)", last_msg);
	CHECK_EQ(upcie_pci_uio_open(&nvme, &u), -ENXIO, "uio: a function on nvme is refused");
	CHECK(u.fd == -1, "uio: left closed");
}

static void test_reset(void)
{
	struct upcie_pci_bdf nvme, uio;
	char buf[16];

	upcie_pci_bdf_parse("0000:00:04.0", &nvme);
	upcie_pci_bdf_parse("0000:00:07.0", &uio);
	CHECK_EQ(upcie_pci_func_reset(&uio), 0, "reset: through sysfs");
	read_back(UIO "/reset", buf, sizeof(buf));
	CHECK(!strcmp(buf, "1"), "reset: '1' written (%s)", buf);
	CHECK_EQ(upcie_pci_func_reset(&nvme), -EOPNOTSUPP, "reset: none without a reset attribute");
}

/* A read-only /sys (a container): every write says what to do instead. */
static void test_erofs(void)
{
	struct upcie_pci_bdf nvme, uio;

	upcie_pci_bdf_parse("0000:00:04.0", &nvme);
	upcie_pci_bdf_parse("0000:00:07.0", &uio);
	if (geteuid() != 0 || unshare(CLONE_NEWNS) ||
	    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
	    mount(root, root, NULL, MS_BIND, NULL) ||
	    mount(NULL, root, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL)) {
		for (int i = 0; i < 6; i++)
			CHECK_SKIP("erofs: a read-only bind mount needs root (CAP_SYS_ADMIN)");
		return;
	}
	CHECK_EQ(upcie_pci_driver_bind(&nvme, "uio_pci_generic"), -EROFS, "erofs: bind -> -EROFS");
	CHECK(strstr(last_msg, "read-only") && strstr(last_msg, "upcie-setup") &&
		  strstr(last_msg, "bind option"),
	      "erofs: bind says to bind on the host and open without binding (%s)", last_msg);
	CHECK_EQ(upcie_pci_bus_master_set(&nvme, true, NULL), -EROFS,
		 "erofs: bus mastering -> -EROFS");
	CHECK(strstr(last_msg, "read-only") && strstr(last_msg, "vfio"),
	      "erofs: says the vfio paths do not need a writable /sys (%s)", last_msg);
	CHECK_EQ(upcie_pci_func_reset(&uio), -EROFS, "erofs: reset -> -EROFS");
	CHECK(strstr(last_msg, "read-only") != NULL, "erofs: says why (%s)", last_msg);
	umount(root);
}

int main(void)
{
	char cmd[128];

	upcie_log_set_handler(capture, NULL);
	build_tree();
	test_bdf();
	test_func();
	test_config();
	test_driver();
	test_bar();
	test_iommu();
	test_uio();
	test_reset();
	test_erofs();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd))
		return 2;
	return check_done();
}
