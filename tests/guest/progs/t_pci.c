/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest test for the pci/ and vfio type1 layers on QEMU's emulated NVMe and ivshmem devices.
 *
 * For every NVMe function: bind to uio_pci_generic through the pci layer, map BAR0 through sysfs,
 * read CAP and VS, enable bus mastering; where the function has an IOMMU group also bind to
 * vfio-pci, open it through a type1 container and read CAP and VS through the vfio region mmap
 * and through pread, which must agree with the sysfs view. Maps the ivshmem BAR (emulated device
 * memory) both ways and checks the host's fill pattern there. Also checks that bad input is
 * refused with the documented errno. Prints TAP.
 *
 * Usage: t_pci [--vfio]   (--vfio: the guest has a translating IOMMU; vfio checks are required)
 */
#include <upcie/base/feature.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/mmio.h>
#include <upcie/pci.h>
#include <upcie/vfio/type1.h>

#include "tap.h"

#define NVME_CAP 0x00
#define NVME_VS	 0x08
#define NVME_CC	 0x14

struct found {
	struct upcie_pci_func nvme[4];
	int nnvme;
	struct upcie_pci_func shm;
	int nshm;
};

static int collect(const struct upcie_pci_func *fn, void *ctx)
{
	struct found *f = (struct found *)ctx;

	if (fn->class_code == UPCIE_PCI_CLASS_NVME && f->nnvme < 4)
		f->nvme[f->nnvme++] = *fn;
	if (fn->vendor == 0x1af4 && fn->device == 0x1110) {
		f->shm = *fn;
		f->nshm++;
	}
	return 0;
}

/* QEMU's NVMe: MQES 2047, CQR, TO 15 (7.5 s), CSS NVM + I/O sets + admin only, MPSMIN 4 KiB. */
static int cap_plausible(uint64_t cap)
{
	return (cap & 0xffff) == 2047 && ((cap >> 16) & 1) && ((cap >> 24) & 0xff) > 0 &&
	       ((cap >> 37) & 1) && ((cap >> 48) & 0xf) == 0;
}

static void check_uio(const struct upcie_pci_func *fn, uint64_t *cap_out, uint32_t *vs_out)
{
	struct upcie_pci_bar bar;
	uint16_t cmd = 0;
	bool was = false;
	int err;

	err = upcie_pci_driver_bind(&fn->bdf, "uio_pci_generic");
	TAP(err == 0, "%s: bind to uio_pci_generic (%d)", fn->name, err);
	TAP(upcie_pci_driver_require(&fn->bdf, "uio_pci_generic") == 0,
	    "%s: require uio_pci_generic after bind", fn->name);
	err = upcie_pci_bar_map(&fn->bdf, 0, 0, &bar);
	TAP(err == 0 && bar.size >= 0x1000, "%s: map BAR0 via sysfs (%d, %zu bytes)", fn->name, err,
	    bar.size);
	if (err)
		return;
	*cap_out = upcie_mmio_read64(bar.addr, NVME_CAP);
	*vs_out = upcie_mmio_read32(bar.addr, NVME_VS);
	TAP(cap_plausible(*cap_out), "%s: CAP via sysfs = 0x%016llx", fn->name,
	    (unsigned long long)*cap_out);
	TAP(*vs_out >= 0x00010400, "%s: VS via sysfs = 0x%08x (>= 1.4)", fn->name, *vs_out);
	TAP(upcie_mmio_read64_lohi(bar.addr, NVME_CAP) == *cap_out,
	    "%s: CAP as two 32-bit reads agrees", fn->name);
	upcie_pci_bar_unmap(&bar);
	/* Unbinding the kernel driver leaves bus mastering off; uio does not turn it on. */
	err = upcie_pci_bus_master_set(&fn->bdf, true, &was);
	TAP(err == 0, "%s: enable bus mastering (was %s)", fn->name, was ? "on" : "off");
	TAP(upcie_pci_config_read16(&fn->bdf, UPCIE_PCI_CFG_COMMAND, &cmd) == 0 &&
		(cmd & UPCIE_PCI_CMD_MASTER) && (cmd & UPCIE_PCI_CMD_MEMORY),
	    "%s: command register 0x%04x has master and memory", fn->name, cmd);
	TAP(upcie_pci_cap_find(&fn->bdf, UPCIE_PCI_CAP_MSIX) > 0, "%s: MSI-X capability found",
	    fn->name);
	TAP(upcie_pci_cap_find(&fn->bdf, UPCIE_PCI_CAP_EXP) > 0, "%s: PCI Express capability found",
	    fn->name);
}

static void check_vfio(const struct upcie_pci_func *fn, uint64_t cap, uint32_t vs)
{
	struct upcie_vfio_container c;
	struct upcie_vfio_group g;
	struct upcie_vfio_device dev;
	struct upcie_vfio_region r;
	uint64_t cap2 = 0;
	uint32_t vs2 = 0;
	uint16_t vendor = 0;
	int err, gid;

	err = upcie_pci_driver_bind(&fn->bdf, "vfio-pci");
	TAP(err == 0, "%s: bind to vfio-pci (%d)", fn->name, err);
	if (err)
		return;
	gid = upcie_vfio_group_id(&fn->bdf);
	TAP(gid >= 0, "%s: IOMMU group %d", fn->name, gid);
	err = upcie_vfio_container_open(&c);
	TAP(err == 0, "vfio container open (%d)", err);
	if (err)
		return;
	err = upcie_vfio_group_open(&g, &c, gid);
	TAP(err == 0, "%s: group %d open and attached (type1v2) (%d)", fn->name, gid, err);
	if (err)
		goto out_c;
	err = upcie_vfio_device_open(&dev, &g, &fn->bdf);
	TAP(err == 0 && dev.num_regions > VFIO_PCI_BAR0_REGION_INDEX, "%s: device fd (%d)",
	    fn->name, err);
	if (err)
		goto out_g;
	err = upcie_vfio_region_map(&dev, VFIO_PCI_BAR0_REGION_INDEX, &r);
	TAP(err == 0, "%s: mmap BAR0 region (%d)", fn->name, err);
	if (!err) {
		cap2 = upcie_mmio_read64(r.addr, NVME_CAP);
		vs2 = upcie_mmio_read32(r.addr, NVME_VS);
		TAP(cap2 == cap && vs2 == vs,
		    "%s: CAP/VS via vfio mmap = sysfs (0x%016llx, 0x%08x)", fn->name,
		    (unsigned long long)cap2, vs2);
		upcie_vfio_region_unmap(&r);
	}
	cap2 = 0;
	err = upcie_vfio_region_rw(&dev, VFIO_PCI_BAR0_REGION_INDEX, NVME_CAP, &cap2, 8, 0);
	TAP(err == 0 && cap2 == cap, "%s: CAP via vfio pread (0x%016llx)", fn->name,
	    (unsigned long long)cap2);
	err = upcie_vfio_region_rw(&dev, VFIO_PCI_CONFIG_REGION_INDEX, 0, &vendor, 2, 0);
	TAP(err == 0 && vendor == fn->vendor, "%s: vendor id via vfio config region (0x%04x)",
	    fn->name, vendor);
	upcie_log_set_level(UPCIE_LOG_NONE);
	TAP(upcie_vfio_region_map(&dev, 64, &r) == -EINVAL, "%s: region 64 is -EINVAL", fn->name);
	TAP(upcie_vfio_region_map(&dev, VFIO_PCI_BAR1_REGION_INDEX, &r) == -ENOENT,
	    "%s: BAR1 (upper half of 64-bit BAR0) is -ENOENT", fn->name);
	upcie_log_set_level(UPCIE_LOG_ERROR);
	upcie_vfio_device_close(&dev);
out_g:
	upcie_vfio_group_close(&g);
out_c:
	upcie_vfio_container_close(&c);
}

static void check_shm(const struct upcie_pci_func *fn, int vfio)
{
	struct upcie_pci_bar bar;
	volatile uint32_t *p;
	uint32_t orig;
	int err;

	TAP(fn->res[2].size >= (1u << 20) && (fn->res[2].flags & UPCIE_PCI_RES_PREFETCH),
	    "%s: ivshmem BAR2 is prefetchable, %llu MiB", fn->name,
	    (unsigned long long)(fn->res[2].size >> 20));
	err = upcie_pci_driver_bind(&fn->bdf, "uio_pci_generic");
	TAP(err == 0, "%s: ivshmem bound to uio_pci_generic (%d)", fn->name, err);
	err = upcie_pci_bar_map(&fn->bdf, 2, 0, &bar);
	TAP(err == 0 && bar.size == fn->res[2].size, "%s: map ivshmem BAR2 via sysfs (%d)",
	    fn->name, err);
	if (!err) {
		p = (volatile uint32_t *)bar.addr;
		/*
		 * The test bed fills the backing file with its pattern: each 512-byte unit starts
		 * with its index (le64), then the 8-byte tag "vram<nonce>".
		 */
		TAP(p[128] == 1 && p[129] == 0 && p[2] == 0x6d617276u,
		    "%s: BAR2 shows the host's pattern (unit 1 index %u, tag 0x%08x)", fn->name,
		    p[128], p[2]);
		orig = p[130];
		p[130] = 0x5a5aa5a5u;
		TAP(p[130] == 0x5a5aa5a5u, "%s: BAR2 write/read back", fn->name);
		p[130] = orig;
		upcie_pci_bar_unmap(&bar);
	}
	err = upcie_pci_bar_map(&fn->bdf, 2, UPCIE_PCI_BAR_WC, &bar);
	TAP(err == 0, "%s: map ivshmem BAR2 write-combining (%d)", fn->name, err);
	upcie_pci_bar_unmap(&bar);
	if (!vfio)
		return;
	{
		struct upcie_vfio_container c;
		struct upcie_vfio_group g;
		struct upcie_vfio_device dev;
		struct upcie_vfio_region r;

		err = upcie_pci_driver_bind(&fn->bdf, "vfio-pci");
		TAP(err == 0, "%s: ivshmem bound to vfio-pci (%d)", fn->name, err);
		if (err || upcie_vfio_container_open(&c))
			return;
		err = upcie_vfio_group_open(&g, &c, upcie_vfio_group_id(&fn->bdf));
		if (!err) {
			err = upcie_vfio_device_open(&dev, &g, &fn->bdf);
			if (!err) {
				err = upcie_vfio_region_map(&dev, VFIO_PCI_BAR2_REGION_INDEX, &r);
				TAP(err == 0 && r.size == fn->res[2].size,
				    "%s: map ivshmem BAR2 via vfio (%d)", fn->name, err);
				upcie_vfio_region_unmap(&r);
				upcie_vfio_device_close(&dev);
			}
			upcie_vfio_group_close(&g);
		}
		TAP(err == 0, "%s: ivshmem vfio path clean (%d)", fn->name, err);
		upcie_vfio_container_close(&c);
	}
}

static void check_errors(const struct upcie_pci_func *fn)
{
	struct upcie_pci_bdf missing, bdf;
	struct upcie_pci_bar bar;

	upcie_log_set_level(UPCIE_LOG_NONE);
	upcie_pci_bdf_parse("0000:3f:1f.7", &missing);
	TAP(upcie_pci_bdf_parse("00:04", &bdf) == -EINVAL, "malformed BDF is -EINVAL");
	TAP(upcie_pci_bar_map(&missing, 0, 0, &bar) == -ENODEV, "BAR of a missing function");
	TAP(upcie_pci_bar_map(&fn->bdf, 7, 0, &bar) == -EINVAL, "BAR index 7 is -EINVAL");
	TAP(upcie_pci_bar_map(&fn->bdf, 1, 0, &bar) == -ENOENT, "BAR1 of NVMe is -ENOENT");
	TAP(upcie_pci_driver_bind(&fn->bdf, "no_such_driver") == -ENOENT,
	    "bind to a driver that is not loaded is -ENOENT");
	TAP(upcie_pci_driver_require(&fn->bdf, "no_such_driver") == -ENXIO,
	    "require the wrong driver is -ENXIO");
	TAP(upcie_pci_driver_bind(&missing, "nvme") == -ENODEV, "bind a missing function");
	upcie_log_set_level(UPCIE_LOG_ERROR);
}

int main(int argc, char **argv)
{
	struct found f;
	int vfio = argc > 1 && !strcmp(argv[1], "--vfio");
	int err;

	memset(&f, 0, sizeof(f));
	err = upcie_pci_scan(collect, &f);
	TAP(err == 0, "scan PCI functions (%d)", err);
	TAP(f.nnvme == 2, "two NVMe functions found (%d)", f.nnvme);
	TAP(f.nshm == 1, "one ivshmem function found (%d)", f.nshm);
	for (int i = 0; i < f.nnvme; i++) {
		uint64_t cap = 0;
		uint32_t vs = 0;

		TAP((f.nvme[i].iommu_group >= 0) == vfio, "%s: IOMMU group %d as expected",
		    f.nvme[i].name, f.nvme[i].iommu_group);
		check_uio(&f.nvme[i], &cap, &vs);
		if (vfio)
			check_vfio(&f.nvme[i], cap, vs);
	}
	if (f.nshm)
		check_shm(&f.shm, vfio);
	if (f.nnvme)
		check_errors(&f.nvme[0]);
	return tap_done();
}
