/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * nvme_hello: find NVMe controllers, take one from the kernel, and show what upcie sees.
 *
 *   nvme_hello [--driver uio_pci_generic|vfio-pci] [BDF]
 *
 * Without a BDF every NVMe function is shown. For each: its sysfs facts, then (root) it is bound
 * to the chosen user-space driver (default: vfio-pci when the function has an IOMMU group,
 * uio_pci_generic otherwise), BAR0 is mapped, bus mastering enabled, and the controller is
 * brought to a known state: disabled, with CSTS.RDY = 0 within CAP.TO (the kernel driver leaves
 * it enabled and shut down). CAP, VS, CC, CSTS, CMB and PMR are decoded.
 * The NVMe driver layer adds admin queues, Identify and I/O on top of exactly this sequence.
 */
#include <upcie/base/feature.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/clock.h>
#include <upcie/base/mmio.h>
#include <upcie/nvme/spec.h>
#include <upcie/pci.h>
#include <upcie/vfio/type1.h>

struct bar0 {
	volatile void *regs;
	struct upcie_pci_bar sysfs;
	struct upcie_vfio_container c;
	struct upcie_vfio_group g;
	struct upcie_vfio_device dev;
	struct upcie_vfio_region r;
	int vfio;
};

static int bar0_open(const struct upcie_pci_func *fn, const char *driver, struct bar0 *b)
{
	int err;

	memset(b, 0, sizeof(*b));
	err = upcie_pci_driver_bind(&fn->bdf, driver);
	if (err)
		return err;
	if (strcmp(driver, "vfio-pci")) {
		err = upcie_pci_bus_master_enable(&fn->bdf);
		if (!err)
			err = upcie_pci_bar_map(&fn->bdf, 0, 0, &b->sysfs);
		b->regs = b->sysfs.addr;
		return err;
	}
	b->vfio = 1;
	err = upcie_vfio_container_open(&b->c);
	if (err)
		return err;
	err = upcie_vfio_group_open(&b->g, &b->c, upcie_vfio_group_id(&fn->bdf));
	if (err)
		goto out_c;
	err = upcie_vfio_device_open(&b->dev, &b->g, &fn->bdf);
	if (err)
		goto out_g;
	err = upcie_vfio_region_map(&b->dev, VFIO_PCI_BAR0_REGION_INDEX, &b->r);
	if (err)
		goto out_d;
	/* Under vfio, bus mastering goes through the device's config region. */
	{
		uint16_t cmd;

		err = upcie_vfio_region_rw(&b->dev, VFIO_PCI_CONFIG_REGION_INDEX, 4, &cmd, 2, 0);
		cmd |= UPCIE_PCI_CMD_MASTER | UPCIE_PCI_CMD_MEMORY;
		if (!err)
			err = upcie_vfio_region_rw(&b->dev, VFIO_PCI_CONFIG_REGION_INDEX, 4, &cmd,
						   2, 1);
		if (err)
			goto out_r;
	}
	b->regs = b->r.addr;
	return 0;
out_r:
	upcie_vfio_region_unmap(&b->r);
out_d:
	upcie_vfio_device_close(&b->dev);
out_g:
	upcie_vfio_group_close(&b->g);
out_c:
	upcie_vfio_container_close(&b->c);
	return err;
}

static void bar0_close(struct bar0 *b)
{
	upcie_pci_bar_unmap(&b->sysfs);
	if (b->vfio) {
		upcie_vfio_region_unmap(&b->r);
		upcie_vfio_device_close(&b->dev);
		upcie_vfio_group_close(&b->g);
		upcie_vfio_container_close(&b->c);
	}
}

/* Clear CC.EN and wait for CSTS.RDY = 0, bounded by CAP.TO. */
static int disable(volatile void *regs, uint64_t cap, uint64_t *took_ns)
{
	struct upcie_deadline d;
	uint64_t t0 = upcie_time_ns();
	uint32_t cc = upcie_mmio_read32(regs, UPCIE_NVME_REG_CC);

	upcie_mmio_write32(regs, UPCIE_NVME_REG_CC, upcie_nvme_cc_set_en(cc, false));
	upcie_deadline_set(&d, (uint64_t)upcie_nvme_cap_to_ms(cap) * UPCIE_NSEC_PER_MSEC);
	while (upcie_nvme_csts_rdy(upcie_mmio_read32(regs, UPCIE_NVME_REG_CSTS))) {
		if (upcie_deadline_passed(&d))
			return -ETIMEDOUT;
		upcie_sleep_ns(100 * UPCIE_NSEC_PER_USEC);
	}
	*took_ns = upcie_time_ns() - t0;
	return 0;
}

static void show(const struct upcie_pci_func *fn, const char *want_driver)
{
	const char *driver = want_driver;
	struct bar0 b;
	uint64_t cap, took = 0;
	uint32_t vs, cc, csts;
	int err;

	printf("%s  %04x:%04x  class %06x  IOMMU group %s  NUMA node %d  driver %s\n", fn->name,
	       fn->vendor, fn->device, fn->class_code, fn->iommu_group >= 0 ? "yes" : "none",
	       fn->numa_node, fn->driver[0] ? fn->driver : "-");
	printf("  BAR0 0x%llx, %llu KiB\n", (unsigned long long)fn->res[0].start,
	       (unsigned long long)(fn->res[0].size >> 10));
	if (!driver)
		driver = fn->iommu_group >= 0 ? "vfio-pci" : "uio_pci_generic";
	err = bar0_open(fn, driver, &b);
	if (err) {
		printf("  cannot take it with %s: %s\n", driver, strerror(-err));
		return;
	}
	cap = upcie_mmio_read64(b.regs, UPCIE_NVME_REG_CAP);
	vs = upcie_mmio_read32(b.regs, UPCIE_NVME_REG_VS);
	cc = upcie_mmio_read32(b.regs, UPCIE_NVME_REG_CC);
	csts = upcie_mmio_read32(b.regs, UPCIE_NVME_REG_CSTS);
	printf("  now bound to %s, BAR0 mapped through %s, bus mastering on\n", driver,
	       b.vfio ? "a vfio region" : "sysfs resource0");
	printf("  VS   %u.%u.%u\n", upcie_nvme_vs_mjr(vs), upcie_nvme_vs_mnr(vs),
	       upcie_nvme_vs_ter(vs));
	printf("  CAP  0x%016llx: MQES %u entries, CQR %u, TO %u ms, DSTRD %u B, CSS 0x%02x, "
	       "MPS %u-%u KiB, CMBS %u, PMRS %u\n",
	       (unsigned long long)cap, upcie_nvme_cap_mqes_entries(cap), upcie_nvme_cap_cqr(cap),
	       upcie_nvme_cap_to_ms(cap), upcie_nvme_cap_dstrd_bytes(cap), upcie_nvme_cap_css(cap),
	       (1u << upcie_nvme_cap_mpsmin_shift(cap)) >> 10,
	       (1u << upcie_nvme_cap_mpsmax_shift(cap)) >> 10, upcie_nvme_cap_cmbs(cap),
	       upcie_nvme_cap_pmrs(cap));
	printf("  CC   0x%08x (EN %u, SHN %u)   CSTS 0x%08x (RDY %u, CFS %u, SHST %u)\n", cc,
	       upcie_nvme_cc_en(cc), upcie_nvme_cc_shn(cc), csts, upcie_nvme_csts_rdy(csts),
	       upcie_nvme_csts_cfs(csts), upcie_nvme_csts_shst(csts));
	if (upcie_nvme_cap_cmbs(cap)) {
		/* CMBLOC/CMBSZ read 0 until the host sets CMBMSC.CRE. */
		upcie_mmio_write64_lohi(b.regs, UPCIE_NVME_REG_CMBMSC, 1);
		printf("  CMB  CMBLOC 0x%08x CMBSZ 0x%08x: %llu KiB in BAR%u\n",
		       upcie_mmio_read32(b.regs, UPCIE_NVME_REG_CMBLOC),
		       upcie_mmio_read32(b.regs, UPCIE_NVME_REG_CMBSZ),
		       (unsigned long long)(upcie_nvme_cmbsz_bytes(
						upcie_mmio_read32(b.regs, UPCIE_NVME_REG_CMBSZ)) >>
					    10),
		       upcie_nvme_cmbloc_bir(upcie_mmio_read32(b.regs, UPCIE_NVME_REG_CMBLOC)));
	}
	if (upcie_nvme_cap_pmrs(cap))
		printf("  PMR  PMRCAP 0x%08x: in BAR%u\n",
		       upcie_mmio_read32(b.regs, UPCIE_NVME_REG_PMRCAP),
		       upcie_nvme_pmrcap_bir(upcie_mmio_read32(b.regs, UPCIE_NVME_REG_PMRCAP)));
	err = disable(b.regs, cap, &took);
	csts = upcie_mmio_read32(b.regs, UPCIE_NVME_REG_CSTS);
	if (err)
		printf("  disable: CSTS.RDY still 1 after CAP.TO: %s\n", strerror(-err));
	else
		printf("  disabled: CSTS 0x%08x (RDY 0) after %llu us; ready for admin queues\n",
		       csts, (unsigned long long)(took / 1000));
	bar0_close(&b);
}

struct ctx {
	const char *driver;
	int found;
	int has_filter;
	struct upcie_pci_bdf filter;
};

static int visit(const struct upcie_pci_func *fn, void *p)
{
	struct ctx *c = (struct ctx *)p;

	if (fn->class_code != UPCIE_PCI_CLASS_NVME)
		return 0;
	if (c->has_filter && !upcie_pci_bdf_equal(&c->filter, &fn->bdf))
		return 0;
	c->found++;
	show(fn, c->driver);
	return 0;
}

int main(int argc, char **argv)
{
	struct ctx c;
	int err;

	memset(&c, 0, sizeof(c));
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--driver") && i + 1 < argc) {
			c.driver = argv[++i];
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			printf("usage: nvme_hello [--driver uio_pci_generic|vfio-pci] [BDF]\n");
			return 0;
		} else if (upcie_pci_bdf_parse(argv[i], &c.filter) == 0) {
			c.has_filter = 1;
		} else {
			return 2;
		}
	}
	err = upcie_pci_scan(visit, &c);
	if (err)
		return 1;
	if (!c.found) {
		fprintf(stderr, "nvme_hello: no NVMe controller found\n");
		return 1;
	}
	return 0;
}
