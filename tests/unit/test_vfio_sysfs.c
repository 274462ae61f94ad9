/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests for the sysfs side of vfio/ and mem/dmamem_bar.h against a fake sysfs tree in a
 * temporary directory (UPCIE_SYSFS_ROOT): finding /dev/vfio/devices/vfioN through
 * <bdf>/vfio-dev (entries that are not vfioN, missing directory, small buffers, missing
 * function), the IOMMU group id, a peer BAR as uio DMA memory (address = sysfs resource
 * start + offset, CPU view through resourceN, slice checks), and a vfio no-IOMMU group told
 * apart from a function not bound to vfio-pci.
 */
#include <upcie/mem/dmamem_bar.h>
#include <upcie/vfio/cdev.h>
#include <upcie/vfio/type1.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static char root[64];

static void path_of(const char *rel, char *buf, size_t len)
{
	snprintf(buf, len, "%s/%s", root, rel);
}

static void mkdirs(const char *rel)
{
	char path[512], *p;

	path_of(rel, path, sizeof(path));
	for (p = path + strlen(root) + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			mkdir(path, 0755);
			*p = '/';
		}
	}
	mkdir(path, 0755);
}

static void puts_(const char *rel, const char *s)
{
	char path[512];
	int fd;

	path_of(rel, path, sizeof(path));
	fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
	if (fd < 0 || write(fd, s, strlen(s)) != (ssize_t)strlen(s)) {
		perror(path);
		exit(2);
	}
	close(fd);
}

static void sized(const char *rel, off_t size)
{
	char path[512];
	int fd;

	path_of(rel, path, sizeof(path));
	fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0644);
	if (fd < 0 || ftruncate(fd, size)) {
		perror(path);
		exit(2);
	}
	close(fd);
}

static void link_(const char *target, const char *rel)
{
	char path[512];

	path_of(rel, path, sizeof(path));
	if (symlink(target, path)) {
		perror(path);
		exit(2);
	}
}

#define NVME "bus/pci/devices/0000:00:04.0"
#define NV2  "bus/pci/devices/0000:00:05.0"
#define SHM  "bus/pci/devices/0000:00:06.0"

static void func(const char *dir, const char *vendor, const char *device, const char *cls)
{
	char rel[256];

	mkdirs(dir);
	snprintf(rel, sizeof(rel), "%s/vendor", dir);
	puts_(rel, vendor);
	snprintf(rel, sizeof(rel), "%s/device", dir);
	puts_(rel, device);
	snprintf(rel, sizeof(rel), "%s/class", dir);
	puts_(rel, cls);
}

static void build_tree(void)
{
	func(NVME, "0x1b36\n", "0x0010\n", "0x010802\n");
	func(NV2, "0x1b36\n", "0x0010\n", "0x010802\n");
	func(SHM, "0x1af4\n", "0x1110\n", "0x050000\n");
	mkdirs("kernel/iommu_groups/4");
	link_("../../../../kernel/iommu_groups/4", NVME "/iommu_group");
	/* the NVMe has a cdev among other entries; the second NVMe only odd entries */
	mkdirs(NVME "/vfio-dev/power");
	mkdirs(NVME "/vfio-dev/vfio");
	mkdirs(NVME "/vfio-dev/vfiox1");
	mkdirs(NVME "/vfio-dev/vfio12");
	mkdirs(NV2 "/vfio-dev/vfio");
	mkdirs(NV2 "/vfio-dev/vfio7a");
	/* ivshmem: BAR0 4 KiB registers, BAR1 absent, BAR2 16 MiB prefetchable 64-bit memory */
	puts_(SHM "/resource", "0x00000000febd1000 0x00000000febd1fff 0x0000000000040200\n"
			       "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
			       "0x00000000fd000000 0x00000000fdffffff 0x000000000014220c\n"
			       "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
			       "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
			       "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
			       "0x0000000000000000 0x0000000000000000 0x0000000000000000\n");
	sized(SHM "/resource0", 4096);
	sized(SHM "/resource2", 16 << 20);
}

static void test_cdev_find(void)
{
	struct upcie_pci_bdf nvme, nv2, shm, none;
	struct upcie_vfio_iommufd ctx;
	struct upcie_vfio_device dev;
	char name[32];

	upcie_pci_bdf_parse("0000:00:04.0", &nvme);
	upcie_pci_bdf_parse("0000:00:05.0", &nv2);
	upcie_pci_bdf_parse("0000:00:06.0", &shm);
	upcie_pci_bdf_parse("0000:00:1f.0", &none);
	CHECK_EQ(upcie_vfio_cdev_find(&nvme, name, sizeof(name)), 0, "cdev of 0000:00:04.0 found");
	CHECK(!strcmp(name, "vfio12"), "it is vfio12, not 'vfio', 'vfiox1' or 'power' (%s)", name);
	CHECK_EQ(upcie_vfio_cdev_find(&nvme, name, 6), -ENAMETOOLONG,
		 "6-byte buffer -> -ENAMETOOLONG");
	CHECK_EQ(upcie_vfio_cdev_find(&nvme, name, 7), 0, "7-byte buffer is enough");
	CHECK_EQ(upcie_vfio_cdev_find(&nv2, name, sizeof(name)), -ENOENT,
		 "vfio-dev with no vfioN entry -> -ENOENT");
	CHECK_EQ(upcie_vfio_cdev_find(&shm, name, sizeof(name)), -ENOENT,
		 "no vfio-dev directory (not bound to vfio-pci) -> -ENOENT");
	CHECK(name[0] == '\0', "name empty on failure");
	CHECK_EQ(upcie_vfio_cdev_find(&none, name, sizeof(name)), -ENODEV,
		 "missing function -> -ENODEV");

	/* open gets as far as the device node, which this fake tree has no /dev for */
	ctx.fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	CHECK(upcie_vfio_cdev_open(&dev, &ctx, &nvme) < 0 && dev.fd == -1,
	      "cdev_open fails cleanly without /dev/vfio/devices/vfio12");
	CHECK_EQ(upcie_vfio_cdev_open(&dev, &ctx, &shm), -ENOENT,
		 "cdev_open of a function without cdev -> -ENOENT");
	CHECK_EQ(upcie_vfio_cdev_open(&dev, &ctx, &none), -ENODEV,
		 "cdev_open of a missing function -> -ENODEV");
	upcie_vfio_iommufd_close(&ctx);

	CHECK_EQ(upcie_vfio_group_id(&nvme), 4, "IOMMU group of 0000:00:04.0 is 4");
	CHECK_EQ(upcie_vfio_group_id(&shm), -ENXIO, "function without IOMMU group -> -ENXIO");
	CHECK_EQ(upcie_vfio_group_id(&none), -ENODEV, "missing function -> -ENODEV");
}

static void test_bar_uio(void)
{
	struct upcie_pci_bdf shm, nvme;
	struct upcie_dmamem mem;
	char path[512], back[8] = { 0 };
	uint64_t iova = 0;
	int fd;

	upcie_pci_bdf_parse("0000:00:06.0", &shm);
	upcie_pci_bdf_parse("0000:00:04.0", &nvme);
	CHECK_EQ(upcie_dmamem_bar_uio(&mem, &shm, 2, 0x1000, 0x2000), 0,
		 "ivshmem BAR2 [0x1000, +0x2000) as uio DMA memory");
	CHECK_EQ(mem.iova, 0xfd001000, "device address = sysfs start + offset");
	CHECK(mem.size == 0x2000 && !mem.lut && mem.vaddr, "arithmetic, with a CPU view");
	CHECK(upcie_dmamem_iova(&mem, 0x1fff, &iova) == 0 && iova == 0xfd002fff,
	      "last byte translates to 0x%llx", (unsigned long long)iova);
	CHECK_EQ(upcie_dmamem_iova(&mem, 0x2000, &iova), -ERANGE, "one past the end -> -ERANGE");
	memcpy(mem.vaddr, "upcie!", 6);
	upcie_dmamem_destroy(&mem);
	path_of(SHM "/resource2", path, sizeof(path));
	fd = open(path, O_RDONLY);
	CHECK(fd > 0 && pread(fd, back, 6, 0x1000) == 6 && !memcmp(back, "upcie!", 6),
	      "a CPU write through the view lands at BAR offset 0x1000");
	if (fd > 0)
		close(fd);
	CHECK(mem.fd == -1 && !mem.vaddr && !mem.priv, "destroy zeroes the dmamem");

	CHECK_EQ(upcie_dmamem_bar_uio(&mem, &shm, 2, 0x800, 0x1000), -EINVAL,
		 "unaligned offset -> -EINVAL");
	CHECK_EQ(upcie_dmamem_bar_uio(&mem, &shm, 2, 0, 0x1800), -EINVAL,
		 "unaligned size -> -EINVAL");
	CHECK_EQ(upcie_dmamem_bar_uio(&mem, &shm, 2, 0, 0), -EINVAL, "size 0 -> -EINVAL");
	CHECK_EQ(upcie_dmamem_bar_uio(&mem, &shm, 2, 15 << 20, 2 << 20), -EINVAL,
		 "slice past the end of the BAR -> -EINVAL");
	CHECK_EQ(upcie_dmamem_bar_uio(&mem, &shm, 2, 0, 16 << 20), 0, "the whole BAR");
	upcie_dmamem_destroy(&mem);
	CHECK_EQ(upcie_dmamem_bar_uio(&mem, &shm, 1, 0, 4096), -ENOENT,
		 "unimplemented BAR1 -> -ENOENT");
	CHECK(mem.fd == -1 && !mem.priv, "mem zeroed on failure");
	CHECK_EQ(upcie_dmamem_bar_uio(&mem, &nvme, 0, 0, 4096), -ENOENT,
		 "function without a resource file -> -ENOENT");
}

static char last_msg[1024];

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	snprintf(last_msg, sizeof(last_msg), "%s", msg);
}

/*
 * No-IOMMU vfio has no /dev/vfio/N (its node is noiommu-N, the group's sysfs name vfio-noiommu):
 * the open fails with ENOENT as for an unbound function, and the hint must not say to bind
 * vfio-pci. Groups 4241/4242 exist only in the fake tree, so the opens of /dev/vfio/424x fail.
 */
static void test_noiommu(void)
{
	struct upcie_vfio_container c;
	struct upcie_vfio_group g;

	mkdirs("kernel/iommu_groups/4241/x");
	puts_("kernel/iommu_groups/4241/name", "vfio-noiommu\n");
	mkdirs("kernel/iommu_groups/4242/x");
	upcie_log_set_handler(capture, NULL);
	upcie_log_set_level(UPCIE_LOG_ERROR);
	memset(&c, 0, sizeof(c));
	c.fd = open("/dev/null", O_RDWR | O_CLOEXEC); /* a container fd the opens never reach */
	last_msg[0] = '\0';
	CHECK_EQ(upcie_vfio_group_open(&g, &c, 4241), -EOPNOTSUPP,
		 "no-IOMMU group: refused with -EOPNOTSUPP");
	CHECK(strstr(last_msg, "no-IOMMU") && strstr(last_msg, "uio") &&
		  !strstr(last_msg, "bound to vfio-pci"),
	      "no-IOMMU group: the message says so and points to uio (%s)", last_msg);
	last_msg[0] = '\0';
	CHECK_EQ(upcie_vfio_group_open(&g, &c, 4242), -ENOENT, "group without a node: -ENOENT");
	CHECK(strstr(last_msg, "bound to vfio-pci") != NULL,
	      "group without a node: the message asks whether vfio-pci is bound (%s)", last_msg);
	CHECK(c.ngroups == 0 && g.fd == -1, "no group joined the container");
	upcie_log_set_handler(NULL, NULL);
	upcie_log_set_level(UPCIE_LOG_NONE);
	close(c.fd);
	free(c.groups);
}

int main(void)
{
	char cmd[128];
	int rc;

	upcie_log_set_level(UPCIE_LOG_NONE);
	snprintf(root, sizeof(root), "/tmp/upcie-vfio-sysfs-XXXXXX");
	if (!mkdtemp(root)) {
		perror("mkdtemp");
		return 2;
	}
	setenv("UPCIE_SYSFS_ROOT", root, 1);
	build_tree();
	test_cdev_find();
	test_bar_uio();
	test_noiommu();
	rc = check_done();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", root);
	return rc;
}
