/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests for the argument checks of every public function in vfio/ and of the vfio dmamem
 * constructors (mem/dmamem_type1.h, mem/dmamem_iommufd.h, mem/dmamem_bar.h): NULL and zeroed
 * structs, closed objects, bad flags, sizes, alignments and indices are refused with the
 * documented -errno before anything reaches the kernel; closing or destroying zeroed structs is
 * a no-op. Where an argument passes the checks, a /dev/null descriptor stands in for the vfio or
 * iommufd one so the ioctl fails with ENOTTY, which shows the kernel error comes back negative.
 * Also: the IRQ wait helpers on real eventfds, and descriptor 0 never being kept.
 */
#include <upcie/mem/dmamem_bar.h>
#include <upcie/mem/dmamem_iommufd.h>
#include <upcie/mem/dmamem_type1.h>
#include <upcie/vfio/cdev.h>
#include <upcie/vfio/dmabuf.h>
#include <upcie/vfio/iommufd.h>
#include <upcie/vfio/irq.h>
#include <upcie/vfio/type1.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

static int null_fd(void)
{
	int fd = open("/dev/null", O_RDWR | O_CLOEXEC);

	if (fd <= 0) {
		perror("/dev/null");
		exit(2);
	}
	return fd;
}

static int mem_zeroed(const struct upcie_dmamem *m)
{
	return !m->vaddr && !m->size && !m->iova && !m->lut && !m->release && !m->priv &&
	       m->fd == -1;
}

static void test_device(void)
{
	struct upcie_vfio_device dev, zero;
	struct upcie_vfio_region r;
	struct vfio_region_info info;
	char buf[8];

	memset(&zero, 0, sizeof(zero));
	upcie_vfio_device_close(NULL);
	upcie_vfio_device_close(&zero);
	CHECK(zero.fd == -1, "closing a zeroed device is a no-op (fd -1 after)");
	memset(&zero, 0, sizeof(zero));
	CHECK_EQ(upcie_vfio_region_info(NULL, 0, &info), -EINVAL, "region_info(NULL dev)");
	CHECK_EQ(upcie_vfio_region_info(&zero, 0, &info), -EINVAL, "region_info(zeroed dev)");
	CHECK_EQ(upcie_vfio_region_info(&zero, 0, NULL), -EINVAL, "region_info(NULL info)");
	CHECK_EQ(upcie_vfio_region_map(&zero, 0, &r), -EINVAL, "region_map(zeroed dev)");
	CHECK(r.addr == NULL, "region_map leaves the region empty on failure");
	CHECK_EQ(upcie_vfio_region_map(&zero, 0, NULL), -EINVAL, "region_map(NULL region)");
	upcie_vfio_region_unmap(NULL);
	memset(&r, 0, sizeof(r));
	upcie_vfio_region_unmap(&r);
	CHECK(1, "unmapping a NULL or zeroed region is a no-op");
	CHECK_EQ(upcie_vfio_region_rw(&zero, 0, 0, buf, 4, 0), -EINVAL, "region_rw(zeroed dev)");
	CHECK_EQ(upcie_vfio_region_rw(&zero, 0, 0, NULL, 4, 0), -EINVAL, "region_rw(NULL buffer)");
	CHECK_EQ(upcie_vfio_device_reset(NULL), -EINVAL, "device_reset(NULL)");
	CHECK_EQ(upcie_vfio_device_reset(&zero), -EINVAL, "device_reset(zeroed)");

	memset(&dev, 0, sizeof(dev));
	dev.fd = null_fd();
	dev.num_regions = 9;
	snprintf(dev.name, sizeof(dev.name), "fake");
	CHECK_EQ(upcie_vfio_region_info(&dev, 9, &info), -EINVAL,
		 "region index beyond num_regions -> -EINVAL");
	CHECK_EQ(upcie_vfio_region_info(&dev, 0, &info), -ENOTTY,
		 "ioctl error comes back negative (-ENOTTY from /dev/null)");
	CHECK_EQ(upcie_vfio_device_reset(&dev), -EOPNOTSUPP,
		 "reset without VFIO_DEVICE_FLAGS_RESET -> -EOPNOTSUPP");
	dev.flags = VFIO_DEVICE_FLAGS_RESET;
	CHECK_EQ(upcie_vfio_device_reset(&dev), -ENOTTY, "reset ioctl error is negative");
	upcie_vfio_device_close(&dev);
	CHECK_EQ(dev.fd, -1, "close sets fd -1");
	upcie_vfio_device_close(&dev);
	CHECK(1, "second close is a no-op");
}

static void test_type1(void)
{
	struct upcie_vfio_container c, zc;
	struct upcie_vfio_group g, zg;
	struct upcie_vfio_device dev;
	struct upcie_vfio_type1_info info;
	struct upcie_pci_bdf bdf = { 0, 1, 0, 0 };
	char page[64];

	memset(&zc, 0, sizeof(zc));
	memset(&zg, 0, sizeof(zg));
	CHECK_EQ(upcie_vfio_container_open(NULL), -EINVAL, "container_open(NULL)");
	upcie_vfio_container_close(NULL);
	upcie_vfio_container_close(&zc);
	CHECK(zc.fd == -1, "closing a zeroed container is a no-op");
	memset(&zc, 0, sizeof(zc));
	CHECK_EQ(upcie_vfio_container_info(&zc, &info), -EINVAL, "container_info(zeroed)");
	CHECK_EQ(upcie_vfio_container_info(NULL, &info), -EINVAL, "container_info(NULL)");
	CHECK_EQ(upcie_vfio_container_info(&zc, NULL), -EINVAL, "container_info(NULL out)");
	CHECK_EQ(upcie_vfio_group_open(NULL, &zc, 1), -EINVAL, "group_open(NULL group)");
	CHECK_EQ(upcie_vfio_group_open(&g, NULL, 1), -EINVAL, "group_open(NULL container)");
	CHECK_EQ(upcie_vfio_group_open(&g, &zc, 1), -EINVAL, "group_open(zeroed container)");
	CHECK_EQ(g.fd, -1, "failed group_open leaves fd -1");
	c = zc;
	c.fd = null_fd();
	CHECK_EQ(upcie_vfio_group_open(&g, &c, -1), -EINVAL, "group_open(id -1)");
	CHECK_EQ(upcie_vfio_container_info(&c, &info), -EINVAL,
		 "container_info before a group joined -> -EINVAL");
	CHECK_EQ(upcie_vfio_dma_map(&c, page, 4096, 1 << 30), -EINVAL,
		 "dma_map before a group joined -> -EINVAL");
	c.iommu_set = 1;
	CHECK_EQ(upcie_vfio_dma_map(&c, NULL, 4096, 1 << 30), -EINVAL, "dma_map(NULL vaddr)");
	CHECK_EQ(upcie_vfio_dma_map(&c, page, 0, 1 << 30), -EINVAL, "dma_map(size 0)");
	CHECK_EQ(upcie_vfio_dma_map(&c, page, 4096, 1 << 30), -ENOTTY, "dma_map ioctl error < 0");
	CHECK_EQ(upcie_vfio_dma_unmap(&c, 0, 1 << 30), -EINVAL, "dma_unmap(size 0)");
	CHECK_EQ(upcie_vfio_dma_unmap(&c, 4096, 1 << 30), -ENOTTY, "dma_unmap ioctl error < 0");
	CHECK_EQ(upcie_vfio_container_info(&c, &info), -ENOTTY, "container_info ioctl error < 0");
	CHECK_EQ(upcie_vfio_dma_map(&zc, page, 4096, 0), -EINVAL, "dma_map(zeroed container)");
	CHECK_EQ(upcie_vfio_dma_unmap(&zc, 4096, 0), -EINVAL, "dma_unmap(zeroed container)");
	CHECK_EQ(upcie_vfio_dma_map(NULL, page, 4096, 0), -EINVAL, "dma_map(NULL container)");
	upcie_vfio_container_close(&c);
	CHECK(c.fd == -1 && !c.iommu_set, "container_close resets the struct");
	upcie_vfio_group_close(NULL);
	upcie_vfio_group_close(&zg);
	CHECK(zg.fd == -1, "closing a zeroed group is a no-op");
	memset(&zg, 0, sizeof(zg));
	CHECK_EQ(upcie_vfio_group_id(NULL), -EINVAL, "group_id(NULL)");
	CHECK_EQ(upcie_vfio_device_open(NULL, &zg, &bdf), -EINVAL, "device_open(NULL dev)");
	CHECK_EQ(upcie_vfio_device_open(&dev, &zg, NULL), -EINVAL, "device_open(NULL bdf)");
	CHECK_EQ(upcie_vfio_device_open(&dev, &zg, &bdf), -EINVAL, "device_open(zeroed group)");
	CHECK_EQ(upcie_vfio_device_open(&dev, NULL, &bdf), -EINVAL, "device_open(NULL group)");
	CHECK_EQ(dev.fd, -1, "failed device_open leaves fd -1");
}

static void test_iommufd(void)
{
	struct upcie_vfio_iommufd ctx, zctx;
	struct upcie_vfio_ioas ioas, zioas;
	struct upcie_vfio_iova_ranges rs;
	uint64_t iova = 0;
	char page[64];

	memset(&zctx, 0, sizeof(zctx));
	memset(&zioas, 0, sizeof(zioas));
	CHECK_EQ(upcie_vfio_iommufd_open(NULL), -EINVAL, "iommufd_open(NULL)");
	upcie_vfio_iommufd_close(NULL);
	upcie_vfio_iommufd_close(&zctx);
	CHECK(zctx.fd == -1, "closing a zeroed iommufd is a no-op");
	memset(&zctx, 0, sizeof(zctx));
	CHECK_EQ(upcie_vfio_ioas_alloc(NULL, &zctx), -EINVAL, "ioas_alloc(NULL ioas)");
	CHECK_EQ(upcie_vfio_ioas_alloc(&ioas, NULL), -EINVAL, "ioas_alloc(NULL ctx)");
	CHECK_EQ(upcie_vfio_ioas_alloc(&ioas, &zctx), -EINVAL, "ioas_alloc(zeroed ctx)");
	CHECK(ioas.fd == -1 && ioas.id == 0, "failed alloc leaves the IOAS empty");
	CHECK_EQ(upcie_vfio_ioas_destroy(NULL), 0, "ioas_destroy(NULL) is a no-op");
	CHECK_EQ(upcie_vfio_ioas_destroy(&zioas), 0, "ioas_destroy(zeroed) is a no-op");
	CHECK_EQ(upcie_vfio_ioas_iova_ranges(&zioas, &rs), -EINVAL, "iova_ranges(zeroed IOAS)");
	CHECK_EQ(upcie_vfio_ioas_map(&zioas, page, 4096, 0, &iova), -EINVAL, "map(zeroed IOAS)");
	CHECK_EQ(upcie_vfio_ioas_map_file(&zioas, 3, 0, 4096, 0, &iova), -EINVAL,
		 "map_file(zeroed IOAS)");
	CHECK_EQ(upcie_vfio_ioas_unmap(&zioas, 0, 4096), -EINVAL, "unmap(zeroed IOAS)");
	CHECK_EQ(upcie_vfio_ioas_unmap_all(&zioas), -EINVAL, "unmap_all(zeroed IOAS)");
	CHECK_EQ(upcie_vfio_ioas_unmap_all(NULL), -EINVAL, "unmap_all(NULL)");

	ctx.fd = null_fd();
	CHECK_EQ(upcie_vfio_ioas_alloc(&ioas, &ctx), -ENOTTY, "ioas_alloc ioctl error < 0");
	ioas.fd = ctx.fd;
	ioas.id = 1;
	CHECK_EQ(upcie_vfio_ioas_iova_ranges(&ioas, NULL), -EINVAL, "iova_ranges(NULL out)");
	CHECK_EQ(upcie_vfio_ioas_iova_ranges(&ioas, &rs), -ENOTTY, "iova_ranges ioctl error < 0");
	CHECK_EQ(upcie_vfio_ioas_map(&ioas, page, 4096, 0x80, &iova), -EINVAL,
		 "map(unknown flag) -> -EINVAL");
	CHECK_EQ(upcie_vfio_ioas_map(&ioas, page, 4096, 0, NULL), -EINVAL, "map(NULL iova)");
	CHECK_EQ(upcie_vfio_ioas_map(&ioas, NULL, 4096, 0, &iova), -EINVAL, "map(NULL va)");
	CHECK_EQ(upcie_vfio_ioas_map(&ioas, page, 0, 0, &iova), -EINVAL, "map(length 0)");
	CHECK_EQ(upcie_vfio_ioas_map(&ioas, page, 4096, UPCIE_VFIO_IOAS_MAP_READONLY, &iova),
		 -ENOTTY, "map ioctl error < 0");
	CHECK_EQ(upcie_vfio_ioas_map_file(&ioas, -1, 0, 4096, 0, &iova), -EINVAL,
		 "map_file(fd -1)");
	CHECK_EQ(upcie_vfio_ioas_map_file(&ioas, ctx.fd, 0, 0, 0, &iova), -EINVAL,
		 "map_file(length 0)");
	CHECK_EQ(upcie_vfio_ioas_map_file(&ioas, ctx.fd, 0, 4096, 0x10, &iova), -EINVAL,
		 "map_file(unknown flag)");
	CHECK_EQ(upcie_vfio_ioas_map_file(&ioas, ctx.fd, 0, 4096, 0, NULL), -EINVAL,
		 "map_file(NULL iova)");
	CHECK_EQ(
	    upcie_vfio_ioas_map_file(&ioas, ctx.fd, 0, 4096, UPCIE_VFIO_IOAS_MAP_FIXED_IOVA, &iova),
	    -ENOTTY, "map_file on a kernel without it -> -ENOTTY (message names 6.13)");
	CHECK_EQ(upcie_vfio_ioas_unmap(&ioas, 0, 0), -EINVAL, "unmap(length 0)");
	CHECK_EQ(upcie_vfio_ioas_unmap(&ioas, 0, 4096), -ENOTTY, "unmap ioctl error < 0");
	CHECK_EQ(upcie_vfio_ioas_destroy(&ioas), -ENOTTY, "destroy ioctl error < 0");
	CHECK(ioas.fd == -1 && ioas.id == 0, "destroy empties the IOAS even on error");
	upcie_vfio_iommufd_close(&ctx);
	CHECK_EQ(ctx.fd, -1, "iommufd_close sets fd -1");
}

static void test_cdev(void)
{
	struct upcie_vfio_iommufd zctx;
	struct upcie_vfio_ioas zioas, ioas;
	struct upcie_vfio_device dev;
	struct upcie_pci_bdf bdf = { 0, 1, 0, 0 };
	char name[16];

	memset(&zctx, 0, sizeof(zctx));
	memset(&zioas, 0, sizeof(zioas));
	CHECK_EQ(upcie_vfio_cdev_find(NULL, name, sizeof(name)), -EINVAL, "cdev_find(NULL bdf)");
	CHECK_EQ(upcie_vfio_cdev_find(&bdf, NULL, 16), -EINVAL, "cdev_find(NULL buf)");
	CHECK_EQ(upcie_vfio_cdev_find(&bdf, name, 0), -EINVAL, "cdev_find(len 0)");
	CHECK_EQ(upcie_vfio_cdev_open(NULL, &zctx, &bdf), -EINVAL, "cdev_open(NULL dev)");
	CHECK_EQ(upcie_vfio_cdev_open(&dev, &zctx, NULL), -EINVAL, "cdev_open(NULL bdf)");
	CHECK_EQ(upcie_vfio_cdev_open(&dev, &zctx, &bdf), -EINVAL, "cdev_open(zeroed iommufd)");
	CHECK_EQ(upcie_vfio_cdev_open(&dev, NULL, &bdf), -EINVAL, "cdev_open(NULL iommufd)");
	CHECK_EQ(dev.fd, -1, "failed cdev_open leaves fd -1");
	CHECK_EQ(upcie_vfio_cdev_attach(&dev, &zioas), -EINVAL, "cdev_attach(closed dev)");
	CHECK_EQ(upcie_vfio_cdev_detach(&dev), -EINVAL, "cdev_detach(closed dev)");
	CHECK_EQ(upcie_vfio_cdev_attach(NULL, &zioas), -EINVAL, "cdev_attach(NULL dev)");
	CHECK_EQ(upcie_vfio_cdev_detach(NULL), -EINVAL, "cdev_detach(NULL dev)");
	dev.fd = null_fd();
	CHECK_EQ(upcie_vfio_cdev_attach(&dev, &zioas), -EINVAL,
		 "cdev_attach of a device that is not bound (devid 0) -> -EINVAL");
	CHECK_EQ(upcie_vfio_cdev_detach(&dev), -EINVAL, "cdev_detach of an unbound device");
	dev.devid = 2;
	CHECK_EQ(upcie_vfio_cdev_attach(&dev, &zioas), -EINVAL, "cdev_attach(zeroed IOAS)");
	CHECK_EQ(upcie_vfio_cdev_attach(&dev, NULL), -EINVAL, "cdev_attach(NULL IOAS)");
	ioas.fd = dev.fd;
	ioas.id = 1;
	CHECK_EQ(upcie_vfio_cdev_attach(&dev, &ioas), -ENOTTY, "cdev_attach ioctl error < 0");
	CHECK_EQ(dev.hwpt_id, 0, "no page table after a failed attach");
	CHECK_EQ(upcie_vfio_cdev_detach(&dev), -ENOTTY, "cdev_detach ioctl error < 0");
	upcie_vfio_device_close(&dev);
	CHECK(dev.fd == -1 && dev.devid == 0, "close forgets the binding");
}

static void test_irq(void)
{
	struct upcie_vfio_irqs irqs, zirqs;
	struct upcie_vfio_device dev;
	struct vfio_irq_info info;
	uint64_t one = 1, ev = 0, t0;
	uint32_t vec = 99;
	int efd[3];

	memset(&dev, 0, sizeof(dev));
	memset(&zirqs, 0, sizeof(zirqs));
	CHECK_EQ(upcie_vfio_irq_info(&dev, VFIO_PCI_MSIX_IRQ_INDEX, &info), -EINVAL,
		 "irq_info(closed dev)");
	CHECK_EQ(upcie_vfio_irq_info(&dev, 0, NULL), -EINVAL, "irq_info(NULL info)");
	CHECK_EQ(upcie_vfio_irq_enable(NULL, &dev, VFIO_PCI_MSIX_IRQ_INDEX, 1), -EINVAL,
		 "irq_enable(NULL irqs)");
	CHECK_EQ(upcie_vfio_irq_enable(&irqs, &dev, VFIO_PCI_MSIX_IRQ_INDEX, 1), -EINVAL,
		 "irq_enable(closed dev)");
	CHECK(irqs.dev_fd == -1 && !irqs.efd, "failed enable leaves irqs empty");
	dev.fd = null_fd();
	dev.num_irqs = 5;
	CHECK_EQ(upcie_vfio_irq_info(&dev, 5, &info), -EINVAL, "irq index beyond num_irqs");
	CHECK_EQ(upcie_vfio_irq_enable(&irqs, &dev, VFIO_PCI_MSIX_IRQ_INDEX, 4), -ENOTTY,
		 "irq_enable: GET_IRQ_INFO error < 0");
	CHECK_EQ(upcie_vfio_irq_disable(NULL), 0, "irq_disable(NULL) is a no-op");
	CHECK_EQ(upcie_vfio_irq_disable(&zirqs), 0, "irq_disable(zeroed) is a no-op");
	CHECK_EQ(upcie_vfio_irq_wait_any(&zirqs, 0, &vec, &ev), -EINVAL,
		 "wait_any(nothing enabled)");
	CHECK_EQ(upcie_vfio_irq_wait(&zirqs, 0, 0, &ev), -EINVAL, "wait(nothing enabled)");
	CHECK_EQ(upcie_vfio_irq_wait_any(NULL, 0, &vec, &ev), -EINVAL, "wait_any(NULL)");

	/* the wait helpers on real eventfds, as SET_IRQS would leave them */
	for (int i = 0; i < 3; i++)
		efd[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	memset(&irqs, 0, sizeof(irqs));
	irqs.dev_fd = dev.fd;
	irqs.count = 3;
	irqs.efd = efd;
	CHECK_EQ(upcie_vfio_irq_wait(&irqs, 3, 0, &ev), -EINVAL, "wait(vector 3 of 3)");
	t0 = upcie_time_ns();
	CHECK_EQ(upcie_vfio_irq_wait_any(&irqs, 20 * UPCIE_NSEC_PER_MSEC, &vec, &ev), -ETIMEDOUT,
		 "nothing fired: -ETIMEDOUT");
	CHECK(upcie_time_ns() - t0 >= 19 * UPCIE_NSEC_PER_MSEC, "after the timeout (%llu us)",
	      (unsigned long long)((upcie_time_ns() - t0) / 1000));
	CHECK_EQ(upcie_vfio_irq_wait_any(&irqs, 0, &vec, &ev), -ETIMEDOUT,
		 "timeout 0: just a check");
	CHECK(write(efd[2], &one, 8) == 8 && write(efd[2], &one, 8) == 8, "fire vector 2 twice");
	CHECK(write(efd[1], &one, 8) == 8, "fire vector 1");
	CHECK_EQ(upcie_vfio_irq_wait_any(&irqs, UPCIE_TIMEOUT_INF, &vec, &ev), 0, "wait_any");
	CHECK(vec == 1 && ev == 1, "lowest vector first: 1, one event (got %u, %llu)", vec,
	      (unsigned long long)ev);
	CHECK_EQ(upcie_vfio_irq_wait(&irqs, 2, UPCIE_NSEC_PER_SEC, &ev), 0, "wait for vector 2");
	CHECK_EQ(ev, 2, "two events counted");
	CHECK_EQ(upcie_vfio_irq_wait(&irqs, 2, 0, &ev), -ETIMEDOUT, "vector 2 drained");
	for (int i = 0; i < 3; i++)
		close(efd[i]);
	upcie_vfio_device_close(&dev);
}

static void test_dmabuf(void)
{
	struct upcie_vfio_device dev;
	int fd = 7;

	memset(&dev, 0, sizeof(dev));
	CHECK_EQ(upcie_vfio_dmabuf_probe(&dev), -EINVAL, "dmabuf_probe(closed dev)");
	CHECK_EQ(upcie_vfio_dmabuf_probe(NULL), -EINVAL, "dmabuf_probe(NULL)");
	CHECK_EQ(upcie_vfio_dmabuf_export(&dev, 2, 0, 4096, &fd), -EINVAL,
		 "dmabuf_export(closed dev)");
	CHECK_EQ(fd, -1, "fd set to -1 on failure");
	dev.fd = null_fd();
	dev.num_regions = 9;
	snprintf(dev.name, sizeof(dev.name), "fake");
	CHECK_EQ(upcie_vfio_dmabuf_export(&dev, 2, 0, 4096, NULL), -EINVAL,
		 "dmabuf_export(NULL fd)");
	CHECK_EQ(upcie_vfio_dmabuf_export(&dev, 6, 0, 4096, &fd), -EINVAL,
		 "dmabuf_export(BAR 6 = ROM)");
	CHECK_EQ(upcie_vfio_dmabuf_export(&dev, 2, 100, 4096, &fd), -EINVAL,
		 "dmabuf_export(unaligned offset)");
	CHECK_EQ(upcie_vfio_dmabuf_export(&dev, 2, 0, 4095, &fd), -EINVAL,
		 "dmabuf_export(unaligned length)");
	CHECK_EQ(upcie_vfio_dmabuf_export(&dev, 2, 0, 0, &fd), -EINVAL, "dmabuf_export(length 0)");
	CHECK_EQ(upcie_vfio_dmabuf_probe(&dev), -ENOTTY,
		 "probe on a kernel without the feature -> -ENOTTY (message names 6.19)");
	upcie_vfio_device_close(&dev);
}

static void test_dmamem(void)
{
	struct upcie_vfio_container zc, c;
	struct upcie_vfio_ioas zioas;
	struct upcie_vfio_device zdev, dev;
	struct upcie_dmamem mem;
	struct upcie_pci_bdf bdf = { 0, 1, 0, 0 };
	struct upcie_vfio_iova_ranges rs;
	void *page;

	memset(&zc, 0, sizeof(zc));
	memset(&zioas, 0, sizeof(zioas));
	memset(&zdev, 0, sizeof(zdev));
	page = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	CHECK_EQ(upcie_dmamem_type1_map(NULL, &zc, page, 4096, 0), -EINVAL, "type1_map(NULL mem)");
	memset(&mem, 0x5a, sizeof(mem));
	CHECK_EQ(upcie_dmamem_type1_map(&mem, &zc, page, 4096, 0), -EINVAL,
		 "type1_map(zeroed container)");
	CHECK(mem_zeroed(&mem), "mem zeroed (fd -1) on failure");
	upcie_dmamem_destroy(&mem);
	CHECK(mem_zeroed(&mem), "destroying it is a no-op");
	CHECK_EQ(upcie_dmamem_type1_hugepage(&mem, &zc, 4096, NULL), -EINVAL,
		 "type1_hugepage(zeroed container)");
	CHECK_EQ(upcie_dmamem_type1_hugepage(NULL, &zc, 4096, NULL), -EINVAL,
		 "type1_hugepage(NULL mem)");

	/* a container that looks attached, over /dev/null: checks, then the ioctl fails */
	memset(&c, 0, sizeof(c));
	c.fd = null_fd();
	c.iommu_set = 1;
	memset(&rs, 0, sizeof(rs));
	rs.align = 4096;
	upcie_vfio_iova_ranges_add(&rs, 0, (1ULL << 39) - 1);
	upcie_vfio_iova_space_init(&c.iovas, &rs);
	CHECK_EQ(upcie_dmamem_type1_map(&mem, &c, (char *)page + 1, 4096, 0), -EINVAL,
		 "type1_map(unaligned address)");
	CHECK_EQ(upcie_dmamem_type1_map(&mem, &c, page, 4095, 0), -EINVAL,
		 "type1_map(unaligned size)");
	CHECK_EQ(upcie_dmamem_type1_map(&mem, &c, NULL, 4096, 0), -EINVAL, "type1_map(NULL va)");
	CHECK_EQ(upcie_dmamem_type1_map(&mem, &c, page, 4096, 3), -EINVAL,
		 "type1_map(non-power-of-two IOVA alignment)");
	CHECK_EQ(upcie_dmamem_type1_map(&mem, &c, page, 4096, 0), -ENOTTY,
		 "type1_map: MAP_DMA error < 0");
	CHECK(mem_zeroed(&mem) && c.iovas.nused == 0, "and the IOVA went back");

	CHECK_EQ(upcie_dmamem_iommufd_map(NULL, &zioas, page, 4096), -EINVAL,
		 "iommufd_map(NULL mem)");
	CHECK_EQ(upcie_dmamem_iommufd_map(&mem, &zioas, page, 4096), -EINVAL,
		 "iommufd_map(zeroed IOAS)");
	CHECK(mem_zeroed(&mem), "mem zeroed on failure");
	CHECK_EQ(upcie_dmamem_iommufd_map_file(&mem, &zioas, 3, 0, 4096, NULL), -EINVAL,
		 "iommufd_map_file(zeroed IOAS)");
	CHECK_EQ(upcie_dmamem_iommufd_memfd(&mem, &zioas, 4096, NULL, true), -EINVAL,
		 "iommufd_memfd(zeroed IOAS)");
	{
		struct upcie_vfio_ioas ioas = { .fd = c.fd, .id = 1 };

		CHECK_EQ(upcie_dmamem_iommufd_map(&mem, &ioas, page, 4096), -EINVAL,
			 "iommufd_map(IOAS without an IOVA allocator)");
		upcie_vfio_iova_space_init(&ioas.iovas, &rs);
		CHECK_EQ(upcie_dmamem_iommufd_map(&mem, &ioas, NULL, 4096), -EINVAL,
			 "iommufd_map(NULL va)");
		CHECK_EQ(upcie_dmamem_iommufd_map(&mem, &ioas, page, 0), -EINVAL,
			 "iommufd_map(size 0)");
		CHECK_EQ(upcie_dmamem_iommufd_map_file(&mem, &ioas, -1, 0, 4096, NULL), -EINVAL,
			 "iommufd_map_file(fd -1)");
		CHECK_EQ(upcie_dmamem_iommufd_map_file(&mem, &ioas, c.fd, 0, 0, NULL), -EINVAL,
			 "iommufd_map_file(size 0)");
		CHECK_EQ(upcie_dmamem_iommufd_map(&mem, &ioas, page, 4096), -ENOTTY,
			 "iommufd_map: the kernel's error < 0");
		CHECK(mem_zeroed(&mem) && ioas.iovas.nused == 0,
		      "mem zeroed after the kernel's refusal, no IOVA kept");
		CHECK_EQ(upcie_dmamem_iommufd_memfd(&mem, &ioas, 8192, NULL, true), -ENOTTY,
			 "iommufd_memfd(by file): the kernel's error < 0, memfd freed");
		CHECK(mem_zeroed(&mem), "mem zeroed");
		upcie_vfio_iova_space_fini(&ioas.iovas);
	}

	CHECK_EQ(upcie_dmamem_bar_uio(NULL, &bdf, 2, 0, 4096), -EINVAL, "bar_uio(NULL mem)");
	CHECK_EQ(upcie_dmamem_bar_uio(&mem, NULL, 2, 0, 4096), -EINVAL, "bar_uio(NULL bdf)");
	CHECK_EQ(upcie_dmamem_bar_uio(&mem, &bdf, 6, 0, 4096), -EINVAL, "bar_uio(BAR 6)");
	CHECK(mem_zeroed(&mem), "mem zeroed on failure");
	CHECK_EQ(upcie_dmamem_bar_type1(&mem, &zc, &zdev, 2, 0, 4096), -EINVAL,
		 "bar_type1(zeroed container)");
	CHECK_EQ(upcie_dmamem_bar_type1(&mem, &c, &zdev, 2, 0, 4096), -EINVAL,
		 "bar_type1(closed peer)");
	CHECK_EQ(upcie_dmamem_bar_type1(&mem, &c, NULL, 2, 0, 4096), -EINVAL,
		 "bar_type1(NULL peer)");
	memset(&dev, 0, sizeof(dev));
	dev.fd = c.fd;
	dev.num_regions = 9;
	CHECK_EQ(upcie_dmamem_bar_type1(&mem, &c, &dev, 6, 0, 4096), -EINVAL, "bar_type1(BAR 6)");
	CHECK_EQ(upcie_dmamem_bar_iommufd(&mem, &zioas, &dev, 2, 0, 4096), -EINVAL,
		 "bar_iommufd(zeroed IOAS)");
	{
		struct upcie_vfio_ioas ioas = { .fd = c.fd, .id = 1 };

		CHECK_EQ(upcie_dmamem_bar_iommufd(&mem, &ioas, &zdev, 2, 0, 4096), -EINVAL,
			 "bar_iommufd(closed peer)");
		CHECK_EQ(upcie_dmamem_bar_iommufd(&mem, &ioas, &dev, 7, 0, 4096), -EINVAL,
			 "bar_iommufd(BAR 7)");
		CHECK_EQ(upcie_dmamem_bar_iommufd(&mem, &ioas, &dev, 2, 0, 4096), -ENOTTY,
			 "bar_iommufd: region info error < 0");
	}
	CHECK(mem_zeroed(&mem), "mem zeroed on failure");
	upcie_vfio_container_close(&c);
	munmap(page, 8192);
}

/* fd 0 is never kept: a process without stdin must not end up with a vfio fd 0. */
static void test_fd_zero(void)
{
	int saved = dup(0), fd, moved;

	close(0);
	fd = open("/dev/null", O_RDONLY);
	CHECK_EQ(fd, 0, "with stdin closed, open() returns 0");
	moved = upcie_vfio_fd_not_zero_(fd);
	CHECK(moved >= 3, "moved to %d", moved);
	CHECK(fcntl(0, F_GETFD) == -1, "and descriptor 0 is closed again");
	close(moved);
	CHECK_EQ(upcie_vfio_fd_not_zero_(-1), -1, "-1 passes through");
	dup2(saved, 0);
	close(saved);
}

int main(void)
{
	upcie_log_set_level(UPCIE_LOG_NONE);
	test_device();
	test_type1();
	test_iommufd();
	test_cdev();
	test_irq();
	test_dmabuf();
	test_dmamem();
	test_fd_zero();
	return check_done();
}
