/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest test for vfio/ and the vfio dmamem constructors on QEMU's NVMe and ivshmem ("vram").
 *
 * type1 (every kernel with an IOMMU): the NVMe controller and the ivshmem function in one
 * container; the container's IOVA ranges; a hugepage buffer and a slice of the ivshmem BAR mapped
 * at allocated IOVAs (high, away from the MSI window, never the physical address); the NVMe
 * then DMAs Identify data into both (admin queue in the hugepage buffer), with MSI-X vector 0
 * signalled through an eventfd; a function reset; BAR dma-buf export (-ENOTTY before 6.19).
 * iommufd (where /dev/iommu exists): IOAS, NVMe and ivshmem bound through their cdevs and
 * attached, IOVA ranges, user-VA map (kernel-chosen and fixed IOVA), map_file of a memfd, the
 * PFNMAP refusal, the ivshmem BAR as a vfio dma-buf imported with map_file, and what map_file
 * answers for udmabuf and vgem dma-bufs; the NVMe DMAs into the memfd-, VA- and dma-buf-backed
 * ranges. Where the target is the ivshmem BAR, the offset is reported (tap_info) so that
 * vfio.host.sh finds the Identify data in the host's vram file. Prints TAP.
 *
 * Usage: t_vfio [NVME_BDF VRAM_BDF]   (default: $TB_C0_BDF $TB_VRAM_BDF); both bound to vfio-pci.
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/udmabuf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <upcie/base/barrier.h>
#include <upcie/base/clock.h>
#include <upcie/base/mmio.h>
#include <upcie/mem/dmamem_bar.h>
#include <upcie/mem/dmamem_iommufd.h>
#include <upcie/mem/dmamem_type1.h>
#include <upcie/mem/hugepage.h>
#include <upcie/pci.h>
#include <upcie/vfio/cdev.h>
#include <upcie/vfio/dmabuf.h>
#include <upcie/vfio/iommufd.h>
#include <upcie/vfio/irq.h>
#include <upcie/vfio/type1.h>

#include "tap.h"

#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)

/* where in the ivshmem BAR the NVMe writes Identify data (vfio.host.sh checks the vram file) */
#define VRAM_TYPE1_OFF	 (1 * MiB)
#define VRAM_IOMMUFD_OFF (2 * MiB)

static void log_to_tap(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)ctx;
	printf("# upcie %s: %s\n", level == UPCIE_LOG_ERROR ? "error" : "log", msg);
	fflush(stdout);
}

static const char *kernel_release(void)
{
	static struct utsname u;

	if (!u.release[0] && uname(&u))
		snprintf(u.release, sizeof(u.release), "?");
	return u.release;
}

/* Linux >= major.minor? */
static int kernel_at_least(int major, int minor)
{
	int ma = 0, mi = 0;

	sscanf(kernel_release(), "%d.%d", &ma, &mi);
	return ma > major || (ma == major && mi >= minor);
}

/* ---------------------------------------------------------------------------------------------
 * A minimal admin-queue NVMe driver: a test instrument to make the controller DMA, nothing more.
 */
#define Q_DEPTH	     16
#define Q_SQ_OFF     0
#define Q_CQ_OFF     4096
#define REG_CAP	     0x00
#define REG_CC	     0x14
#define REG_CSTS     0x1c
#define REG_AQA	     0x24
#define REG_ASQ	     0x28
#define REG_ACQ	     0x30
#define REG_DB	     0x1000
#define OPC_IDENTIFY 0x06

struct mini {
	volatile uint8_t *regs;
	const struct upcie_dmamem *q;
	uint32_t dstrd;
	uint16_t tail, head, cid;
	uint8_t phase;
};

static int mini_wait_rdy(struct mini *m, uint32_t want)
{
	struct upcie_deadline dl;

	upcie_deadline_set(&dl, 10 * UPCIE_NSEC_PER_SEC);
	while ((upcie_mmio_read32(m->regs, REG_CSTS) & 1) != want) {
		if (upcie_deadline_passed(&dl))
			return -ETIMEDOUT;
		upcie_sleep_ns(UPCIE_NSEC_PER_MSEC);
	}
	return 0;
}

static int mini_disable(struct mini *m)
{
	upcie_mmio_write32(m->regs, REG_CC, 0);
	return mini_wait_rdy(m, 0);
}

/* Admin queues in q: SQ at 0, CQ at 4 KiB (q needs a CPU view). */
static int mini_enable(struct mini *m, volatile void *regs, const struct upcie_dmamem *q)
{
	uint64_t cap;

	memset(m, 0, sizeof(*m));
	m->regs = (volatile uint8_t *)regs;
	m->q = q;
	m->phase = 1;
	cap = upcie_mmio_read64_lohi(regs, REG_CAP);
	m->dstrd = (uint32_t)((cap >> 32) & 0xf);
	if ((upcie_mmio_read32(regs, REG_CC) & 1) && mini_disable(m))
		return -ETIMEDOUT;
	memset((char *)q->vaddr + Q_SQ_OFF, 0, 8192);
	upcie_mmio_write32(regs, REG_AQA, ((Q_DEPTH - 1) << 16) | (Q_DEPTH - 1));
	upcie_mmio_write64_lohi(regs, REG_ASQ, upcie_dmamem_iova_fast(q, Q_SQ_OFF));
	upcie_mmio_write64_lohi(regs, REG_ACQ, upcie_dmamem_iova_fast(q, Q_CQ_OFF));
	upcie_wmb();
	upcie_mmio_write32(regs, REG_CC, (4u << 20) | (6u << 16) | 1u);
	return mini_wait_rdy(m, 1);
}

/* Identify (CNS 1: controller) into the page at device address prp1. 0 or -ETIMEDOUT. */
static int mini_identify(struct mini *m, uint64_t prp1, uint16_t *status)
{
	uint32_t sqe[16], *cqe;
	struct upcie_deadline dl;

	memset(sqe, 0, sizeof(sqe));
	sqe[0] = OPC_IDENTIFY | ((uint32_t)m->cid++ << 16);
	sqe[6] = (uint32_t)prp1;
	sqe[7] = (uint32_t)(prp1 >> 32);
	sqe[10] = 1;
	memcpy((char *)m->q->vaddr + Q_SQ_OFF + m->tail * 64, sqe, 64);
	m->tail = (m->tail + 1) % Q_DEPTH;
	upcie_wmb();
	upcie_mmio_write32(m->regs, REG_DB, m->tail);
	cqe = (uint32_t *)((char *)m->q->vaddr + Q_CQ_OFF + m->head * 16);
	upcie_deadline_set(&dl, 10 * UPCIE_NSEC_PER_SEC);
	while (((*(volatile uint32_t *)&cqe[3] >> 16) & 1) != m->phase) {
		if (upcie_deadline_passed(&dl))
			return -ETIMEDOUT;
		upcie_cpu_relax();
	}
	upcie_dma_rmb();
	*status = (uint16_t)((cqe[3] >> 17) & 0x7fff);
	if (++m->head == Q_DEPTH) {
		m->head = 0;
		m->phase ^= 1;
	}
	upcie_mmio_write32(m->regs, REG_DB + (4u << m->dstrd), m->head);
	return 0;
}

/* Identify controller data: PCI vendor 1b36 and the serial the test bed gave. */
static int identify_ok(const volatile uint8_t *p, const char *sn)
{
	char got[21];

	for (int i = 0; i < 20; i++)
		got[i] = (char)p[4 + i];
	got[20] = '\0';
	return p[0] == 0x36 && p[1] == 0x1b && !strncmp(got, sn, strlen(sn));
}

static int bus_master_on(const struct upcie_vfio_device *dev)
{
	uint16_t cmd = 0;
	int err = upcie_vfio_region_rw(dev, VFIO_PCI_CONFIG_REGION_INDEX, 4, &cmd, 2, 0);

	if (err)
		return err;
	cmd |= 0x6; /* memory space, bus master */
	return upcie_vfio_region_rw(dev, VFIO_PCI_CONFIG_REGION_INDEX, 4, &cmd, 2, 1);
}

/* The test bed's pattern at byte `off` of the vram file: unit index, then "vram<nonce>". */
static int vram_pattern_at(const volatile uint8_t *p, uint64_t off)
{
	const char *nonce = getenv("TB_NONCE");
	char tag[9];
	uint64_t unit = 0;

	for (int i = 7; i >= 0; i--)
		unit = (unit << 8) | p[i];
	snprintf(tag, sizeof(tag), "vram%s", nonce ? nonce : "");
	for (int i = 0; i < 8; i++)
		if ((char)p[8 + i] != tag[i] && nonce)
			return 0;
	return unit == off / 512;
}

static void print_ranges(const char *what, const struct upcie_vfio_iova_ranges *r)
{
	for (uint32_t i = 0; i < r->n; i++)
		printf("# %s range %u: 0x%" PRIx64 "-0x%" PRIx64 "\n", what, i, r->r[i].start,
		       r->r[i].last);
	printf("# %s alignment 0x%" PRIx64 "\n", what, r->align);
}

static int ranges_avoid_msi(const struct upcie_vfio_iova_ranges *r)
{
	for (uint32_t i = 0; i < r->n; i++)
		if (r->r[i].start <= UPCIE_VFIO_IOVA_MSI_LAST &&
		    r->r[i].last >= UPCIE_VFIO_IOVA_MSI_START)
			return 0;
	return r->n > 0;
}

static int inside_ranges(const struct upcie_vfio_iova_ranges *r, uint64_t iova, uint64_t len)
{
	for (uint32_t i = 0; i < r->n; i++)
		if (iova >= r->r[i].start && iova + len - 1 <= r->r[i].last)
			return 1;
	return 0;
}

/* MSI-X vector 0 (admin CQ) fired since the last wait? */
static void check_irq(const struct upcie_vfio_irqs *irqs, const char *what)
{
	uint64_t ev = 0;
	uint32_t vec = 99;
	int err = upcie_vfio_irq_wait_any(irqs, 2 * UPCIE_NSEC_PER_SEC, &vec, &ev);

	TAP(err == 0 && vec == 0 && ev >= 1, "%s: MSI-X vector 0 signalled its eventfd (%d, %llu)",
	    what, err, (unsigned long long)ev);
}

/* ---------------------------------------------------------------------------------------------
 * type1
 */
static void part_type1(const struct upcie_pci_bdf *nvme_bdf, const struct upcie_pci_bdf *vram_bdf,
		       const char *sn)
{
	struct upcie_vfio_container c;
	struct upcie_vfio_group gn, gv;
	struct upcie_vfio_device nvme, vram;
	struct upcie_vfio_type1_info info;
	struct upcie_vfio_region bar0;
	struct upcie_vfio_irqs irqs;
	struct vfio_irq_info ii;
	struct upcie_dmamem hmem, bmem;
	struct mini m;
	uint64_t phys = 0;
	uint16_t st = 0xffff;
	int err, fd = -1;

	memset(&gn, 0, sizeof(gn));
	memset(&gv, 0, sizeof(gv));
	memset(&nvme, 0, sizeof(nvme));
	memset(&vram, 0, sizeof(vram));
	memset(&bar0, 0, sizeof(bar0));
	memset(&irqs, 0, sizeof(irqs));
	memset(&hmem, 0, sizeof(hmem));
	memset(&bmem, 0, sizeof(bmem));

	err = upcie_vfio_container_open(&c);
	TAP(err == 0, "type1: container open (%d)", err);
	if (err)
		return;
	err = upcie_vfio_group_open(&gn, &c, upcie_vfio_group_id(nvme_bdf));
	TAP(err == 0, "type1: NVMe group %d joins the container (%d)", gn.id, err);
	err = upcie_vfio_group_open(&gv, &c, upcie_vfio_group_id(vram_bdf));
	TAP(err == 0 && gv.id != gn.id, "type1: ivshmem group %d joins the same container (%d)",
	    gv.id, err);
	if (err)
		goto out;
	err = upcie_vfio_container_info(&c, &info);
	TAP(err == 0 && info.have_ranges, "type1: VFIO_IOMMU_GET_INFO with IOVA ranges (%d)", err);
	print_ranges("type1", &info.ranges);
	printf("# type1 page sizes 0x%" PRIx64 ", DMA mappings available %u\n", info.pgsizes,
	       info.dma_avail);
	TAP(ranges_avoid_msi(&info.ranges), "type1: the reported ranges leave out the MSI window");
	TAP(c.iovas.ready && c.iovas.pgsize == 4096, "type1: container IOVA allocator ready");

	err = upcie_vfio_device_open(&nvme, &gn, nvme_bdf);
	TAP(err == 0 && nvme.num_regions > VFIO_PCI_CONFIG_REGION_INDEX,
	    "type1: NVMe device fd (%d)", err);
	if (err)
		goto out;
	err = upcie_vfio_device_open(&vram, &gv, vram_bdf);
	TAP(err == 0, "type1: ivshmem device fd (%d)", err);
	if (err)
		goto out;

	err = upcie_dmamem_type1_hugepage(&hmem, &c, 2 * MiB, NULL);
	TAP(err == 0, "type1: 2 MiB hugepage buffer mapped (%d)", err);
	if (err)
		goto out;
	printf("# type1 hugepage buffer at IOVA 0x%" PRIx64 "\n", hmem.iova);
	TAP(hmem.iova >= 4 * GiB && hmem.iova % (2 * MiB) == 0 &&
		inside_ranges(&info.ranges, hmem.iova, hmem.size),
	    "type1: its IOVA 0x%" PRIx64 " is above 4 GiB, 2 MiB aligned, inside the ranges",
	    hmem.iova);
	err = upcie_pagemap_phys(hmem.vaddr, &phys);
	TAP(err == 0 && phys != hmem.iova,
	    "type1: IOVA 0x%" PRIx64 " is not the physical 0x%" PRIx64, hmem.iova, phys);

	err = upcie_dmamem_bar_type1(&bmem, &c, &vram, 2, VRAM_TYPE1_OFF, MiB);
	TAP(err == 0, "type1: ivshmem BAR2 [1 MiB, +1 MiB) mapped through its vfio mmap (%d)", err);
	if (err)
		goto out;
	printf("# type1 BAR slice at IOVA 0x%" PRIx64 "\n", bmem.iova);
	TAP(bmem.iova >= 4 * GiB && bmem.iova != hmem.iova && c.iovas.nused == 2,
	    "type1: BAR slice IOVA 0x%" PRIx64 " high and distinct", bmem.iova);
	TAP(vram_pattern_at((volatile uint8_t *)bmem.vaddr, VRAM_TYPE1_OFF),
	    "type1: BAR slice CPU view shows the host's vram pattern at 1 MiB");

	err = upcie_vfio_region_map(&nvme, VFIO_PCI_BAR0_REGION_INDEX, &bar0);
	if (!err)
		err = bus_master_on(&nvme);
	TAP(err == 0, "type1: NVMe BAR0 mapped, bus mastering on (%d)", err);
	if (err)
		goto out;
	err = upcie_vfio_irq_info(&nvme, VFIO_PCI_MSIX_IRQ_INDEX, &ii);
	TAP(err == 0 && ii.count >= 1 && (ii.flags & VFIO_IRQ_INFO_EVENTFD),
	    "type1: NVMe has %u MSI-X vectors (%d)", ii.count, err);
	err = upcie_vfio_irq_enable(&irqs, &nvme, VFIO_PCI_MSIX_IRQ_INDEX, 2);
	TAP(err == 0 && irqs.count == 2, "type1: MSI-X vectors 0-1 enabled with eventfds (%d)",
	    err);
	err = mini_enable(&m, bar0.addr, &hmem);
	TAP(err == 0, "type1: NVMe enabled, admin queues in the hugepage buffer (%d)", err);
	if (err)
		goto out;
	memset((char *)hmem.vaddr + 8192, 0, 4096);
	err = mini_identify(&m, hmem.iova + 8192, &st);
	TAP(err == 0 && st == 0 && identify_ok((uint8_t *)hmem.vaddr + 8192, sn),
	    "type1: Identify DMA'd into the hugepage buffer (sn '%s', status 0x%x)", sn, st);
	if (irqs.count)
		check_irq(&irqs, "type1");
	err = mini_identify(&m, bmem.iova, &st);
	TAP(err == 0 && st == 0 && identify_ok((volatile uint8_t *)bmem.vaddr, sn),
	    "type1: Identify DMA'd into the ivshmem BAR at IOVA 0x%" PRIx64 " (status 0x%x)",
	    bmem.iova, st);
	printf("# tb: type1_identify=%llu\n", (unsigned long long)VRAM_TYPE1_OFF);
	TAP(upcie_vfio_irq_disable(&irqs) == 0 && irqs.dev_fd == -1, "type1: MSI-X disabled");
	if (nvme.flags & VFIO_DEVICE_FLAGS_RESET) {
		/* the controller is still enabled: the reset must take it down */
		err = upcie_vfio_device_reset(&nvme);
		TAP(err == 0 && upcie_mmio_read32(bar0.addr, REG_CC) == 0 &&
			(upcie_mmio_read32(bar0.addr, REG_CSTS) & 1) == 0,
		    "type1: VFIO_DEVICE_RESET of the enabled controller clears CC and RDY (%d)",
		    err);
	} else {
		SKIP("type1: device reset # SKIP the kernel reports no reset method");
		TAP(mini_disable(&m) == 0, "type1: NVMe disabled");
	}

	err = upcie_vfio_dmabuf_probe(&vram);
	if (kernel_at_least(6, 19)) {
		TAP(err == 0, "type1: BAR dma-buf export supported on %s (%d)", kernel_release(),
		    err);
		err = upcie_vfio_dmabuf_export(&vram, 2, 0, MiB, &fd);
		TAP(err == 0 && fd > 0, "type1: ivshmem BAR2 [0, 1 MiB) exported as dma-buf (%d)",
		    err);
		if (fd > 0)
			close(fd);
		/*
		 * A doorbell-only mapping for a served client would be the NVMe BAR0 page of the
		 * doorbells exported as a dma-buf and mmapped by the client: the export works, but
		 * vfio-pci's dma-buf has no mmap (up to 7.3 at least), so the kernel refuses it.
		 * Recorded as the fact upcie-served's --trusted-whole-device rests on; a kernel
		 * that maps it fails this check, and the server should then hand out that page.
		 */
		err = upcie_vfio_dmabuf_export(&nvme, 0, 0x1000, 0x1000, &fd);
		TAP(err == 0 && fd > 0, "type1: NVMe BAR0 doorbell page exported as dma-buf (%d)",
		    err);
		if (fd > 0) {
			void *p = mmap(NULL, 0x1000, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			int merr = p == MAP_FAILED ? -errno : 0;

			TAP(p == MAP_FAILED,
			    "type1: that dma-buf cannot be mmapped on %s (%s): no doorbell-only "
			    "mapping, only the whole device's file",
			    kernel_release(), merr ? upcie_errno_name(merr) : "mapped");
			printf("# tb: dmabuf_doorbell_mmap_%s=%s\n", kernel_release(),
			       merr ? upcie_errno_name(merr) : "ok");
			if (p != MAP_FAILED)
				munmap(p, 0x1000);
			close(fd);
		}
	} else {
		TAP(err == -ENOTTY, "type1: BAR dma-buf export on %s: -ENOTTY (needs 6.19) (%d)",
		    kernel_release(), err);
		err = upcie_vfio_dmabuf_export(&vram, 2, 0, MiB, &fd);
		TAP(err == -ENOTTY && fd == -1, "type1: dma-buf export refused with -ENOTTY (%d)",
		    err);
	}
	printf("# tb: dmabuf_export_%s=%s\n", kernel_release(), err ? upcie_errno_name(err) : "ok");

out:
	upcie_vfio_irq_disable(&irqs);
	upcie_vfio_region_unmap(&bar0);
	upcie_dmamem_destroy(&bmem);
	upcie_dmamem_destroy(&hmem);
	TAP(!c.iovas.ready || c.iovas.nused == 0,
	    "type1: destroying the dmamems returned their IOVAs");
	upcie_vfio_device_close(&vram);
	upcie_vfio_device_close(&nvme);
	upcie_vfio_group_close(&gv);
	upcie_vfio_group_close(&gn);
	TAP(c.ngroups == 0 && !c.iommu_set && !c.iovas.ready,
	    "type1: last group out resets the container");
	upcie_vfio_container_close(&c);
}

/* ---------------------------------------------------------------------------------------------
 * dma-bufs of other exporters, for map_file
 */
static int udmabuf_create(size_t size, int *memfd)
{
	struct udmabuf_create cr;
	int dev, fd;

	*memfd = memfd_create("t_vfio", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (*memfd < 0)
		return -errno;
	if (ftruncate(*memfd, (off_t)size) || fcntl(*memfd, F_ADD_SEALS, F_SEAL_SHRINK))
		return -errno;
	dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	if (dev < 0)
		return -errno;
	memset(&cr, 0, sizeof(cr));
	cr.memfd = (uint32_t)*memfd;
	cr.flags = UDMABUF_FLAGS_CLOEXEC;
	cr.size = size;
	fd = ioctl(dev, UDMABUF_CREATE, &cr);
	fd = fd < 0 ? -errno : fd;
	close(dev);
	return fd;
}

/* vgem: a dumb buffer exported with PRIME (uapi drm.h/drm_mode.h layouts; bookworm has no
 * drm headers without libdrm-dev). */
struct t_drm_version {
	int major, minor, patchlevel;
	size_t name_len;
	char *name;
	size_t date_len;
	char *date;
	size_t desc_len;
	char *desc;
};
struct t_drm_create_dumb {
	uint32_t height, width, bpp, flags, handle, pitch;
	uint64_t size;
};
struct t_drm_prime_handle {
	uint32_t handle, flags;
	int32_t fd;
};
#define T_DRM_IOCTL_VERSION	       _IOWR('d', 0x00, struct t_drm_version)
#define T_DRM_IOCTL_MODE_CREATE_DUMB   _IOWR('d', 0xb2, struct t_drm_create_dumb)
#define T_DRM_IOCTL_PRIME_HANDLE_TO_FD _IOWR('d', 0x2d, struct t_drm_prime_handle)

static int vgem_create(size_t size)
{
	int fd = -ENOENT;

	for (int i = 0; i < 8 && fd == -ENOENT; i++) {
		struct t_drm_version v;
		struct t_drm_create_dumb cd;
		struct t_drm_prime_handle ph;
		char path[64], name[32];
		int dev;

		snprintf(path, sizeof(path), "/dev/dri/card%d", i);
		dev = open(path, O_RDWR | O_CLOEXEC);
		if (dev < 0)
			continue;
		memset(&v, 0, sizeof(v));
		memset(name, 0, sizeof(name));
		v.name = name;
		v.name_len = sizeof(name) - 1;
		if (ioctl(dev, T_DRM_IOCTL_VERSION, &v) || strcmp(name, "vgem")) {
			close(dev);
			continue;
		}
		memset(&cd, 0, sizeof(cd));
		cd.width = 1024;
		cd.height = (uint32_t)(size / 4096);
		cd.bpp = 32;
		memset(&ph, 0, sizeof(ph));
		if (ioctl(dev, T_DRM_IOCTL_MODE_CREATE_DUMB, &cd)) {
			fd = -errno;
		} else {
			ph.handle = cd.handle;
			ph.flags = O_CLOEXEC | O_RDWR;
			fd = ioctl(dev, T_DRM_IOCTL_PRIME_HANDLE_TO_FD, &ph) ? -errno : ph.fd;
		}
		close(dev);
	}
	return fd;
}

/* Map a foreign dma-buf with map_file and report the kernel's answer. */
static void map_file_answer(const struct upcie_vfio_ioas *ioas, const char *kind, int fd,
			    size_t size)
{
	uint64_t iova = 0;
	int err;

	if (fd < 0) {
		SKIP("iommufd: map_file of a %s dma-buf # SKIP no %s here (%s)", kind, kind,
		     upcie_errno_name(fd));
		return;
	}
	err = upcie_vfio_ioas_map_file(ioas, fd, 0, size, 0, &iova);
	TAP(err <= 0, "iommufd: map_file of a %s dma-buf on %s answers %s", kind, kernel_release(),
	    err ? upcie_errno_name(err) : "ok (accepted)");
	printf("# tb: map_file_%s_%s=%s\n", kind, kernel_release(),
	       err ? upcie_errno_name(err) : "ok");
	if (!err)
		upcie_vfio_ioas_unmap(ioas, iova, size);
}

/* ---------------------------------------------------------------------------------------------
 * iommufd + cdev
 */
static void part_iommufd(const struct upcie_pci_bdf *nvme_bdf, const struct upcie_pci_bdf *vram_bdf,
			 const char *sn)
{
	struct upcie_hugepage_opts huge;
	struct upcie_vfio_iommufd ctx;
	struct upcie_vfio_ioas ioas;
	struct upcie_vfio_device nvme, vram;
	struct upcie_vfio_iova_ranges before, after;
	struct upcie_vfio_iova_space space;
	struct upcie_vfio_region bar0, vbar;
	struct upcie_vfio_irqs irqs;
	struct upcie_dmamem qmem, hmem, bmem;
	struct upcie_hugepage fixed;
	struct mini m;
	char name[32];
	uint64_t iova = 0, want = 0;
	uint16_t st = 0xffff;
	int err, memfd = -1, fd;

	memset(&nvme, 0, sizeof(nvme));
	memset(&vram, 0, sizeof(vram));
	memset(&bar0, 0, sizeof(bar0));
	memset(&vbar, 0, sizeof(vbar));
	memset(&irqs, 0, sizeof(irqs));
	memset(&qmem, 0, sizeof(qmem));
	memset(&hmem, 0, sizeof(hmem));
	memset(&bmem, 0, sizeof(bmem));
	memset(&fixed, 0, sizeof(fixed));
	memset(&space, 0, sizeof(space));
	memset(&ioas, 0, sizeof(ioas));

	if (access("/dev/iommu", F_OK) != 0) {
		err = upcie_vfio_iommufd_open(&ctx);
		TAP(err == -ENOENT, "iommufd: no /dev/iommu on %s: open says -ENOENT (%d)",
		    kernel_release(), err);
		err = upcie_vfio_cdev_find(nvme_bdf, name, sizeof(name));
		printf("# vfio-dev entry of the NVMe: %s (%d)\n", err ? "none" : name, err);
		SKIP("iommufd: IOAS, cdev, map_file, dma-buf import # SKIP no iommufd in %s",
		     kernel_release());
		return;
	}
	err = upcie_vfio_iommufd_open(&ctx);
	TAP(err == 0, "iommufd: /dev/iommu open (%d)", err);
	if (err)
		return;
	err = upcie_vfio_ioas_alloc(&ioas, &ctx);
	TAP(err == 0 && ioas.id > 0, "iommufd: IOAS %u allocated (%d)", ioas.id, err);
	if (err)
		goto out;
	err = upcie_vfio_ioas_iova_ranges(&ioas, &before);
	TAP(err == 0, "iommufd: IOVA ranges of the empty IOAS (%u ranges) (%d)", before.n, err);
	print_ranges("empty IOAS", &before);

	err = upcie_vfio_cdev_find(nvme_bdf, name, sizeof(name));
	TAP(err == 0, "iommufd: NVMe cdev is /dev/vfio/devices/%s (%d)", name, err);
	err = upcie_vfio_cdev_open(&nvme, &ctx, nvme_bdf);
	TAP(err == 0 && nvme.devid > 0, "iommufd: NVMe cdev bound to the iommufd, devid %u (%d)",
	    nvme.devid, err);
	if (err)
		goto out;
	err = upcie_vfio_cdev_attach(&nvme, &ioas);
	TAP(err == 0 && nvme.hwpt_id > 0, "iommufd: NVMe attached to IOAS %u, hwpt %u (%d)",
	    ioas.id, nvme.hwpt_id, err);
	if (err)
		goto out;
	err = upcie_vfio_ioas_iova_ranges(&ioas, &after);
	TAP(err == 0 && ranges_avoid_msi(&after),
	    "iommufd: after attach the ranges leave out the MSI window (%u ranges) (%d)", after.n,
	    err);
	print_ranges("attached IOAS", &after);
	err = upcie_vfio_cdev_open(&vram, &ctx, vram_bdf);
	TAP(err == 0, "iommufd: ivshmem cdev bound (%d)", err);
	if (!err) {
		err = upcie_vfio_cdev_attach(&vram, &ioas);
		TAP(err == 0 && vram.hwpt_id == nvme.hwpt_id,
		    "iommufd: ivshmem (another group) attached to the same IOAS, hwpt %u (%d)",
		    vram.hwpt_id, err);
	}

	/* admin queues in a memfd mapped by file (6.13+) */
	err = upcie_dmamem_iommufd_memfd(&qmem, &ioas, 2 * MiB, NULL, true);
	if (kernel_at_least(6, 13)) {
		TAP(err == 0 && inside_ranges(&after, qmem.iova, qmem.size),
		    "iommufd: memfd mapped with IOMMU_IOAS_MAP_FILE at IOVA 0x%" PRIx64 " (%d)",
		    qmem.iova, err);
	} else {
		TAP(err == -ENOTTY, "iommufd: map_file of a memfd on %s: -ENOTTY (%d)",
		    kernel_release(), err);
		err = upcie_dmamem_iommufd_memfd(&qmem, &ioas, 2 * MiB, NULL, false);
		TAP(err == 0, "iommufd: memfd mapped through its VA instead (%d)", err);
	}
	/* a hugepage buffer mapped by VA */
	memset(&huge, 0, sizeof(huge));
	huge.src = UPCIE_HUGEPAGE_MEMFD;
	err = upcie_dmamem_iommufd_memfd(&hmem, &ioas, 2 * MiB, &huge, false);
	TAP(err == 0 && inside_ranges(&after, hmem.iova, hmem.size) &&
		!(hmem.iova <= qmem.iova + qmem.size - 1 && qmem.iova <= hmem.iova + hmem.size - 1),
	    "iommufd: hugepage buffer mapped with IOMMU_IOAS_MAP at IOVA 0x%" PRIx64 " (%d)",
	    hmem.iova, err);

	/* fixed IOVA: picked by upcie's allocator inside the IOAS ranges */
	if (!upcie_vfio_iova_space_init(&space, &after) &&
	    !upcie_hugepage_alloc(&fixed, 2 * MiB, &huge) &&
	    !upcie_vfio_iova_alloc(&space, 2 * MiB, 0, &want)) {
		/* skip IOVAs the kernel already handed out */
		while (!(want + 2 * MiB <= qmem.iova || want >= qmem.iova + qmem.size) ||
		       !(want + 2 * MiB <= hmem.iova || want >= hmem.iova + hmem.size))
			if (upcie_vfio_iova_alloc(&space, 2 * MiB, 0, &want))
				break;
		iova = want;
		err = upcie_vfio_ioas_map(&ioas, fixed.vaddr, 2 * MiB,
					  UPCIE_VFIO_IOAS_MAP_FIXED_IOVA, &iova);
		TAP(err == 0 && iova == want,
		    "iommufd: IOMMU_IOAS_MAP at fixed IOVA 0x%" PRIx64 " (%d)", want, err);
		TAP(upcie_vfio_ioas_unmap(&ioas, want, 2 * MiB) == 0, "iommufd: and unmapped");
	} else {
		TAP(0, "iommufd: fixed-IOVA setup");
	}
	upcie_hugepage_free(&fixed);
	upcie_vfio_iova_space_fini(&space);

	/* the BAR: PFNMAP is refused, the vfio dma-buf is imported */
	if (vram.fd > 0 && !upcie_vfio_region_map(&vram, 2, &vbar)) {
		iova = 0;
		err = upcie_vfio_ioas_map(&ioas, vbar.addr, MiB, 0, &iova);
		TAP(err == -EFAULT, "iommufd: IOMMU_IOAS_MAP of the BAR mmap (PFNMAP) refused: %s",
		    upcie_errno_name(err));
		if (!err)
			upcie_vfio_ioas_unmap(&ioas, iova, MiB);
	}
	err = upcie_dmamem_bar_iommufd(&bmem, &ioas, &vram, 2, VRAM_IOMMUFD_OFF, MiB);
	if (kernel_at_least(6, 19)) {
		TAP(err == 0 && bmem.fd > 0 && inside_ranges(&after, bmem.iova, bmem.size),
		    "iommufd: ivshmem BAR2 [2 MiB, +1 MiB) as vfio dma-buf, map_file at IOVA "
		    "0x%" PRIx64 " (%d)",
		    bmem.iova, err);
		TAP(bmem.vaddr && vram_pattern_at((volatile uint8_t *)bmem.vaddr, VRAM_IOMMUFD_OFF),
		    "iommufd: BAR slice CPU view shows the host's vram pattern at 2 MiB");
	} else {
		TAP(err == -ENOTTY, "iommufd: BAR dma-buf on %s: -ENOTTY (needs 6.19) (%d)",
		    kernel_release(), err);
	}
	printf("# tb: map_file_vfio_bar_%s=%s\n", kernel_release(),
	       err ? upcie_errno_name(err) : "ok");

	/* what map_file says to dma-bufs of other exporters */
	fd = udmabuf_create(2 * MiB, &memfd);
	map_file_answer(&ioas, "udmabuf", fd, 2 * MiB);
	if (fd > 0)
		close(fd);
	if (memfd > 0)
		close(memfd);
	fd = vgem_create(2 * MiB);
	map_file_answer(&ioas, "vgem", fd, 2 * MiB);
	if (fd > 0)
		close(fd);

	/* the NVMe DMAs through the IOAS */
	if (qmem.size && !upcie_vfio_region_map(&nvme, VFIO_PCI_BAR0_REGION_INDEX, &bar0) &&
	    !bus_master_on(&nvme)) {
		err = upcie_vfio_irq_enable(&irqs, &nvme, VFIO_PCI_MSIX_IRQ_INDEX, 1);
		TAP(err == 0, "iommufd: MSI-X vector 0 enabled on the cdev (%d)", err);
		err = mini_enable(&m, bar0.addr, &qmem);
		TAP(err == 0, "iommufd: NVMe enabled, admin queues in the map_file memory (%d)",
		    err);
		if (!err && hmem.size) {
			memset(hmem.vaddr, 0, 4096);
			err = mini_identify(&m, hmem.iova, &st);
			TAP(err == 0 && st == 0 && identify_ok((uint8_t *)hmem.vaddr, sn),
			    "iommufd: Identify DMA'd into the IOAS_MAP hugepage buffer (status "
			    "0x%x)",
			    st);
			if (irqs.count)
				check_irq(&irqs, "iommufd");
		}
		if (!err && bmem.size) {
			err = mini_identify(&m, bmem.iova, &st);
			TAP(err == 0 && st == 0 && identify_ok((volatile uint8_t *)bmem.vaddr, sn),
			    "iommufd: Identify DMA'd into the ivshmem BAR through the dma-buf "
			    "(status 0x%x)",
			    st);
			printf("# tb: iommufd_identify=%llu\n",
			       (unsigned long long)VRAM_IOMMUFD_OFF);
		}
		TAP(mini_disable(&m) == 0, "iommufd: NVMe disabled");
		upcie_vfio_irq_disable(&irqs);
	}

	err = upcie_vfio_cdev_detach(&vram);
	TAP(err == 0 && vram.hwpt_id == 0, "iommufd: ivshmem detached (%d)", err);
out:
	upcie_vfio_irq_disable(&irqs);
	upcie_vfio_region_unmap(&vbar);
	upcie_vfio_region_unmap(&bar0);
	upcie_dmamem_destroy(&bmem);
	upcie_dmamem_destroy(&hmem);
	upcie_dmamem_destroy(&qmem);
	if (nvme.hwpt_id) {
		err = upcie_vfio_cdev_detach(&nvme);
		TAP(err == 0, "iommufd: NVMe detached (%d)", err);
	}
	upcie_vfio_device_close(&vram);
	upcie_vfio_device_close(&nvme);
	if (ioas.id) {
		err = upcie_vfio_ioas_destroy(&ioas);
		TAP(err == 0, "iommufd: IOAS destroyed (%d)", err);
	}
	upcie_vfio_iommufd_close(&ctx);
}

int main(int argc, char **argv)
{
	const char *nv = argc > 2 ? argv[1] : getenv("TB_C0_BDF");
	const char *vr = argc > 2 ? argv[2] : getenv("TB_VRAM_BDF");
	const char *sn = getenv("TB_C0_SN");
	struct upcie_pci_bdf nvme, vram;
	char drv[64];

	setvbuf(stdout, NULL, _IOLBF, 0);
	upcie_log_set_handler(log_to_tap, NULL);
	if (!nv || !vr || upcie_pci_bdf_parse(nv, &nvme) || upcie_pci_bdf_parse(vr, &vram)) {
		fprintf(stderr, "usage: t_vfio NVME_BDF VRAM_BDF (or TB_C0_BDF, TB_VRAM_BDF)\n");
		return 2;
	}
	if (!sn)
		sn = "deadbeef";
	printf("# kernel %s, NVMe %s, vram %s\n", kernel_release(), nv, vr);
	TAP(upcie_pci_driver_get(&nvme, drv, sizeof(drv)) == 0 && !strcmp(drv, "vfio-pci"),
	    "%s is bound to vfio-pci", nv);
	TAP(upcie_pci_driver_get(&vram, drv, sizeof(drv)) == 0 && !strcmp(drv, "vfio-pci"),
	    "%s is bound to vfio-pci", vr);
	part_type1(&nvme, &vram, sn);
	part_iommufd(&nvme, &vram, sn);
	return tap_done();
}
