/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests for pci/: BDF parsing and formatting, and the sysfs layer against a fake sysfs tree
 * built in a temporary directory (UPCIE_SYSFS_ROOT): function info, scan order, config space and
 * capability walks, bus mastering, driver checks and binding, BAR mapping and its errors.
 */
#include <upcie/base/mmio.h>
#include <upcie/pci.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static void build_tree(void)
{
	uint8_t cfg[256] = { 0 };
	char bar0[16384];

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
	setenv("UPCIE_SYSFS_ROOT", root, 1);
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
	CHECK(sc.n == 2 && !strcmp(sc.names[0], "0000:00:04.0") &&
		  !strcmp(sc.names[1], "0000:00:05.0"),
	      "scan visits both functions in order and skips non-BDF entries (%d)", sc.n);
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

int main(void)
{
	char cmd[128];

	build_tree();
	test_bdf();
	test_func();
	test_config();
	test_driver();
	test_bar();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd))
		return 2;
	return check_done();
}
