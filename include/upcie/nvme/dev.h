/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * How an NVMe controller is reached from user space: one of three paths, behind one object.
 *
 *   uio     the function bound to uio_pci_generic (required: an unbound function could be
 *           taken by the kernel's nvme driver at any rescan), /dev/uioN held open for the
 *           dev's lifetime (pci/uio.h: the kernel clears bus mastering when the process dies);
 *           BAR0 mapped through sysfs; bus mastering set in config space through sysfs; DMA
 *           memory is hugepages described by a LUT of physical addresses, in hugetlbfs files
 *           named after the function that outlive a process that dies (the controller it
 *           left may still write them; the next open stops it, then frees them). The device
 *           must see physical addresses: no IOMMU, or a passthrough (identity) domain; a
 *           function whose IOMMU group translates is refused (-EOPNOTSUPP) rather than left to
 *           time out on faulting DMA. Hugetlb pages can still move under a device that holds their physical
 *           address (see mem/hugepage.h); the vfio paths pin them and do not have that risk.
 *   type1   the function bound to vfio-pci, reached through its IOMMU group in a type1
 *           container; BAR0 and config space through vfio regions; DMA memory is hugepages
 *           mapped at IOVAs the container's allocator picks (never the physical address).
 *           Functions that share a group (a multi-function device, a switch without ACS) share
 *           its group file through the container (vfio/type1.h). vfio's no-IOMMU mode is
 *           refused with a message.
 *   iommufd the function's vfio cdev bound to an iommufd and attached to an IOAS (Linux >= 6.6
 *           with CONFIG_VFIO_DEVICE_CDEV); DMA memory is mapped at IOVAs the IOAS's allocator
 *           picks.
 *
 * Open turns bus mastering off: a controller the last owner left enabled (a crashed process)
 * cannot DMA until the controller layer has stopped it (nvme/ctrl.h turns it on after the
 * disable). Close turns it off and checks that it is off. DMA memory from upcie_nvme_dev_dmamem()
 * comes from the NUMA node the function sits on (sysfs numa_node), unless the hugepage options
 * say otherwise (numa set: their node; node UPCIE_HUGEPAGE_NODE_ANY: no placement).
 *
 * Everything above this header (nvme/ctrl.h, nvme/ns.h) sees only a register mapping and
 * dmamem objects, so the controller and data path code never branches on the path. The same
 * applies to a peer device's BAR (struct upcie_nvme_peer): a slice of, say, GPU memory or an
 * ivshmem BAR becomes a dmamem this controller can DMA to, on any path.
 *
 * With `bind`, a function the system uses (a mounted namespace, swap, an md/LVM/dm member, a
 * group sibling in use: pci/inuse.h) is refused with -EBUSY unless bind_in_use is set, and a
 * function whose PCI class is not NVMe (0x010802: a typo'd address, a NIC, a bridge) with -ENODEV
 * unless bind_any_class is set; neither is touched (no driver_override, no unbind) when refused.
 * Needs root (binding, sysfs resources, pagemap, /dev/vfio). The struct holds pointers into
 * itself once open: keep it in place. Memory and peers made through a dev must be destroyed
 * before the dev is closed. UPCIE_NVME_PATH_AUTO prefers the vfio cdev with iommufd (the
 * kernel's direction: type1 is the legacy container interface) where the function has a cdev
 * once bound to vfio-pci and /dev/iommu exists, then type1 where it has an IOMMU group, then uio;
 * dev->path_why says which and why. Does not share one container among devices unless you pass
 * one in the options.
 */
#ifndef UPCIE_NVME_DEV_H
#define UPCIE_NVME_DEV_H

#include <upcie/base/feature.h>

#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <limits.h>
#include <linux/vfio.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>
#include <upcie/mem/dmamem_bar.h>
#include <upcie/mem/dmamem_iommufd.h>
#include <upcie/mem/dmamem_type1.h>
#include <upcie/mem/hugepage.h>
#include <upcie/pci/bar.h>
#include <upcie/pci/bdf.h>
#include <upcie/pci/config.h>
#include <upcie/pci/driver.h>
#include <upcie/pci/func.h>
#include <upcie/pci/inuse.h>
#include <upcie/pci/uio.h>
#include <upcie/vfio/cdev.h>
#include <upcie/vfio/device.h>
#include <upcie/vfio/iommufd.h>
#include <upcie/vfio/irq.h>
#include <upcie/vfio/type1.h>

enum upcie_nvme_path {
	UPCIE_NVME_PATH_AUTO = 0, /* iommufd where the function has a vfio cdev and /dev/iommu
				     exists, else type1 when it has an IOMMU group, else uio */
	UPCIE_NVME_PATH_UIO = 1,
	UPCIE_NVME_PATH_TYPE1 = 2,
	UPCIE_NVME_PATH_IOMMUFD = 3,
};

struct upcie_nvme_dev_opts {
	enum upcie_nvme_path path;
	bool bind; /* bind the function to the path's driver first (uio_pci_generic, vfio-pci);
		      refused while the system uses it (pci/inuse.h) */
	bool bind_in_use; /* bind even a function the system uses (or UPCIE_ALLOW_IN_USE=1) */
	/* bind even a function whose class is not NVMe (0x010802), as upcie-setup bind --any-class:
	 * a controller that reports another class; without it such a function is refused */
	bool bind_any_class;
	/* type1: join this container (so peers in other groups share its IOVA space); NULL: own */
	struct upcie_vfio_container *container;
	/* iommufd: use this context and IOAS (shared with peers); NULL: own ones */
	struct upcie_vfio_iommufd *iommufd;
	struct upcie_vfio_ioas *ioas;
	/* source of the DMA memory upcie_nvme_dev_dmamem() allocates; NULL: hugetlb memfd of
	 * the default hugepage size; either way on the function's NUMA node unless numa is set */
	const struct upcie_hugepage_opts *hugepage;
	/* type1: the function's IOMMU group file, opened by someone else (a served/ server handing
	 * out a VF); the dev owns it from the open on (closed on failure too). 0: open it here */
	int vfio_group_fd;
	/* type1: the VF token to present (a VF of a PF under vfio-pci), UUID text; NULL: none */
	const char *vf_token;
};

struct upcie_nvme_dev {
	volatile void *regs; /* BAR0 */
	size_t regs_size;
	enum upcie_nvme_path path;
	char path_why[96]; /* why this path: AUTO's choice, or "asked for" */
	struct upcie_pci_bdf bdf;
	char name[UPCIE_PCI_BDF_STRLEN];
	struct upcie_hugepage_opts hp;
	bool open;
	bool owned;    /* the function is ours: bus mastering may be touched */
	int numa_node; /* of the function, -1: unknown */
	/* uio */
	struct upcie_pci_bar bar0;
	struct upcie_pci_uio uio;
	bool hp_named;	    /* DMA memory in named hugetlbfs files that outlive a dead process */
	char hp_prefix[48]; /* "upcie-dma-<bdf>-": the names of this function's files */
	/* vfio, both paths */
	struct upcie_vfio_device vdev;
	struct upcie_vfio_region bar0r;
	/* type1 */
	struct upcie_vfio_container own_container;
	struct upcie_vfio_container *container;
	struct upcie_vfio_group group;
	/* iommufd */
	struct upcie_vfio_iommufd own_iommufd;
	struct upcie_vfio_iommufd *iommufd;
	struct upcie_vfio_ioas own_ioas;
	struct upcie_vfio_ioas *ioas;
};

/* A mapped BAR of the controller (the CMB lives in one). */
struct upcie_nvme_dev_bar {
	void *addr; /* CPU mapping of the whole BAR, NULL when not mapped */
	size_t size;
	uint64_t bus; /* the BAR's address as sysfs reports it (CPU physical = bus on x86) */
	struct upcie_pci_bar sysfs;
	struct upcie_vfio_region region;
};

/* A slice of a peer device's BAR as DMA memory for the controller of a dev. */
struct upcie_nvme_peer {
	struct upcie_dmamem mem; /* what I/O helpers take; CPU view where the BAR can be mapped */
	struct upcie_vfio_group group;
	struct upcie_vfio_device vdev;
	enum upcie_nvme_path path;
};

/* The path's name as logs and tools print it ("uio", "vfio-type1", ...). */
static inline const char *upcie_nvme_path_name(enum upcie_nvme_path path)
{
	switch (path) {
	case UPCIE_NVME_PATH_UIO:
		return "uio";
	case UPCIE_NVME_PATH_TYPE1:
		return "vfio-type1";
	case UPCIE_NVME_PATH_IOMMUFD:
		return "vfio-iommufd";
	default:
		return "auto";
	}
}

/* Parse "uio", "type1"/"vfio-type1", "iommufd"/"vfio-iommufd" or "auto". -EINVAL otherwise. */
static inline int upcie_nvme_path_parse(const char *s, enum upcie_nvme_path *path)
{
	if (!s || !path)
		return -EINVAL;
	if (!strcmp(s, "auto"))
		*path = UPCIE_NVME_PATH_AUTO;
	else if (!strcmp(s, "uio"))
		*path = UPCIE_NVME_PATH_UIO;
	else if (!strcmp(s, "type1") || !strcmp(s, "vfio-type1") || !strcmp(s, "vfio"))
		*path = UPCIE_NVME_PATH_TYPE1;
	else if (!strcmp(s, "iommufd") || !strcmp(s, "vfio-iommufd") || !strcmp(s, "cdev"))
		*path = UPCIE_NVME_PATH_IOMMUFD;
	else
		return -EINVAL;
	return 0;
}

static inline int upcie_nvme_dev_bus_master_(const struct upcie_nvme_dev *dev, bool enable);

/*
 * Close what open set up, in reverse; bus mastering is turned off first (and checked). A zeroed
 * or closed dev is a no-op.
 */
static inline void upcie_nvme_dev_close(struct upcie_nvme_dev *dev)
{
	if (!dev)
		return;
	if (dev->owned && upcie_nvme_dev_bus_master_(dev, false))
		UPCIE_ERR("nvme: %s: bus mastering could not be turned off at close", dev->name);
	upcie_pci_bar_unmap(&dev->bar0);
	/* uio_pci_generic clears bus mastering again as it lets go */
	upcie_pci_uio_close(&dev->uio);
	upcie_vfio_region_unmap(&dev->bar0r);
	/* closing the cdev detaches it, so the IOAS can go after it */
	upcie_vfio_device_close(&dev->vdev);
	upcie_vfio_group_close(&dev->group);
	if (dev->container == &dev->own_container)
		upcie_vfio_container_close(&dev->own_container);
	if (dev->ioas == &dev->own_ioas)
		upcie_vfio_ioas_destroy(&dev->own_ioas);
	if (dev->iommufd == &dev->own_iommufd)
		upcie_vfio_iommufd_close(&dev->own_iommufd);
	memset(dev, 0, sizeof(*dev));
	dev->bar0.index = -1;
	dev->vdev.fd = -1;
	dev->group.fd = -1;
	dev->uio.fd = -1;
	dev->numa_node = -1;
}

/* The function's vfio cdev exists (bound to vfio-pci, a kernel with CONFIG_VFIO_DEVICE_CDEV). */
static inline bool upcie_nvme_dev_has_cdev_(const struct upcie_pci_bdf *bdf)
{
	char path[PATH_MAX];
	struct dirent *de;
	bool found = false;
	DIR *d;

	if (upcie_pci_func_path(bdf, "vfio-dev", path, sizeof(path)))
		return false;
	d = opendir(path);
	if (!d)
		return false;
	while (!found && (de = readdir(d)))
		found = upcie_vfio_cdev_name_ok_(de->d_name);
	closedir(d);
	return found;
}

/*
 * Refuse a function another driver owns: both would program the same queues. The advice to bind
 * it is given for an NVMe controller only: for any other class the address is more likely wrong.
 */
static inline int upcie_nvme_dev_driver_check_(const struct upcie_nvme_dev *dev, const char *want,
					       uint32_t class_code)
{
	char drv[64];
	int err = upcie_pci_driver_get(&dev->bdf, drv, sizeof(drv));

	if (err)
		return err;
	if (!drv[0] || !strcmp(drv, want))
		return 0;
	if (class_code != UPCIE_PCI_CLASS_NVME)
		return UPCIE_FAIL(-EBUSY,
				  "nvme: %s is bound to %s, not %s, and is not an NVMe controller "
				  "(class 0x%06x, NVMe is 0x%06x): check the address",
				  dev->name, drv, want, class_code, UPCIE_PCI_CLASS_NVME);
	return UPCIE_FAIL(-EBUSY,
			  "nvme: %s is bound to %s, not %s: bind it first (upcie-setup bind %s %s, "
			  "or the bind option)",
			  dev->name, drv, want, dev->name, want);
}

/* The uio path hands the device physical addresses: refuse a function whose DMA is translated. */
static inline int upcie_nvme_dev_uio_iommu_check_(const struct upcie_nvme_dev *dev)
{
	enum upcie_pci_iommu mode;
	char type[UPCIE_PCI_IOMMU_TYPE_LEN];
	int group, err = upcie_pci_func_iommu(&dev->bdf, &mode, &group, type, sizeof(type));

	if (err)
		return UPCIE_FAIL(err, "nvme: %s: cannot tell how the IOMMU treats it: %s",
				  dev->name, strerror(-err));
	if (mode == UPCIE_PCI_IOMMU_TRANSLATED)
		return UPCIE_FAIL(
		    -EOPNOTSUPP,
		    "nvme: %s: its IOMMU group %d translates DMA (domain type %s), "
		    "so on uio_pci_generic the device cannot reach the physical "
		    "addresses the uio path gives it (every DMA would fault): use the "
		    "vfio path (type1 or iommufd), or boot with iommu=pt",
		    dev->name, group, type);
	if (mode == UPCIE_PCI_IOMMU_UNKNOWN)
		UPCIE_WARN("nvme: %s: IOMMU group %d, domain type '%s': assuming the device sees "
			   "physical addresses",
			   dev->name, group, type);
	return 0;
}

/*
 * Keep the function's own memory BARs out of the IOVAs its domain hands out. A DMA address equal
 * to a BAR's bus address is the device's own register space to a device that decodes it before
 * the IOMMU (QEMU's nvme refuses it with Data Transfer Error; a VF's 64-bit BAR above 4 GiB sits
 * where the IOVA allocator starts), and the kernel's own DMA API keeps PCI windows out of its
 * IOVAs for the same reason. A range another user of a shared domain already holds is left
 * (logged).
 */
static inline int upcie_nvme_dev_iova_keep_bars_(struct upcie_nvme_dev *dev)
{
	struct upcie_vfio_iova_space *sp =
	    dev->path == UPCIE_NVME_PATH_TYPE1 ? &dev->container->iovas : &dev->ioas->iovas;
	struct upcie_pci_resource res[UPCIE_PCI_NUM_RES];
	int err = upcie_pci_func_resources(&dev->bdf, res);

	if (err || !sp->ready)
		return 0; /* no resource file (a fake tree), or a domain upcie does not allocate in */
	for (int i = 0; i < UPCIE_PCI_NUM_BARS; i++) {
		if (!(res[i].flags & UPCIE_PCI_RES_MEM) || !res[i].size ||
		    res[i].start > UINT64_MAX - res[i].size)
			continue;
		err =
		    upcie_vfio_iova_space_exclude(sp, res[i].start, res[i].start + res[i].size - 1);
		if (err == -EBUSY)
			UPCIE_WARN("nvme: %s: BAR %d [0x%" PRIx64 ", +0x%" PRIx64
				   ") is in use as IOVA in the shared domain",
				   dev->name, i, res[i].start, res[i].size);
		else if (err)
			return err;
	}
	return 0;
}

static inline int upcie_nvme_dev_open_vfio_(struct upcie_nvme_dev *dev,
					    const struct upcie_nvme_dev_opts *o)
{
	int err, gid;

	if (dev->path == UPCIE_NVME_PATH_TYPE1) {
		gid = upcie_vfio_group_id(&dev->bdf);
		if (gid < 0)
			return gid;
		if (o->container) {
			dev->container = o->container;
		} else {
			err = upcie_vfio_container_open(&dev->own_container);
			if (err)
				return err;
			dev->container = &dev->own_container;
		}
		if (o->vfio_group_fd > 0)
			err = upcie_vfio_group_adopt(&dev->group, dev->container, gid,
						     o->vfio_group_fd);
		else
			err = upcie_vfio_group_open(&dev->group, dev->container, gid);
		if (err)
			return err;
		err = upcie_vfio_device_open_token(&dev->vdev, &dev->group, &dev->bdf, o->vf_token);
		if (err)
			return err;
		dev->owned = true;
	} else {
		if (o->iommufd) {
			dev->iommufd = o->iommufd;
		} else {
			err = upcie_vfio_iommufd_open(&dev->own_iommufd);
			if (err)
				return err;
			dev->iommufd = &dev->own_iommufd;
		}
		if (o->ioas) {
			dev->ioas = o->ioas;
		} else {
			err = upcie_vfio_ioas_alloc(&dev->own_ioas, dev->iommufd);
			if (err)
				return err;
			dev->ioas = &dev->own_ioas;
		}
		err = upcie_vfio_cdev_open(&dev->vdev, dev->iommufd, &dev->bdf);
		if (err)
			return err;
		dev->owned = true;
		err = upcie_vfio_cdev_attach(&dev->vdev, dev->ioas);
		if (err)
			return err;
	}
	err = upcie_nvme_dev_iova_keep_bars_(dev);
	if (err)
		return err;
	err = upcie_vfio_region_map(&dev->vdev, VFIO_PCI_BAR0_REGION_INDEX, &dev->bar0r);
	if (err)
		return err;
	dev->regs = dev->bar0r.addr;
	dev->regs_size = dev->bar0r.size;
	return 0;
}

/*
 * Open NVMe function `bdf` on the path in `opts` (NULL: AUTO, no binding, own container or
 * IOAS, default hugepages) and map BAR0. Bus mastering is turned off (the controller layer turns
 * it on once the controller is stopped). Returns 0; -EINVAL; -EBUSY when another driver owns
 * the function or another process holds it (or, with bind, the system uses it); -ENODEV when
 * there is no such function, or bind is asked for a function whose class is not NVMe without
 * bind_any_class (nothing is bound then); -ENXIO when a vfio path is asked for a function
 * without an IOMMU group, or the uio path for one not bound to uio_pci_generic; -EOPNOTSUPP for
 * the uio path under a translating IOMMU and for vfio's no-IOMMU mode; or the error of the
 * failing step (with a message). `dev` is zeroed on failure.
 */
static inline int upcie_nvme_dev_open(struct upcie_nvme_dev *dev, const struct upcie_pci_bdf *bdf,
				      const struct upcie_nvme_dev_opts *opts)
{
	struct upcie_nvme_dev_opts def;
	struct upcie_pci_func fn;
	const char *driver;
	bool gfd_taken = false; /* opts->vfio_group_fd handed on (the group owns it then) */
	int err;

	if (!dev)
		return UPCIE_FAIL(-EINVAL, "nvme: dev open: NULL dev");
	memset(dev, 0, sizeof(*dev));
	dev->bar0.index = -1;
	dev->vdev.fd = -1;
	dev->group.fd = -1;
	dev->uio.fd = -1;
	dev->numa_node = -1;
	if (!bdf)
		return UPCIE_FAIL(-EINVAL, "nvme: dev open: NULL address");
	if (!opts) {
		memset(&def, 0, sizeof(def));
		opts = &def;
	}
	dev->bdf = *bdf;
	upcie_pci_bdf_format(bdf, dev->name, sizeof(dev->name));
	if (opts->hugepage)
		dev->hp = *opts->hugepage;
	else
		dev->hp.src = UPCIE_HUGEPAGE_MEMFD;
	err = upcie_pci_func_read(bdf, &fn);
	if (err)
		goto fail;
	dev->numa_node = fn.numa_node;
	if (!dev->hp.numa && fn.numa_node >= 0) {
		/* hugepages come from the faulting CPU's node otherwise */
		dev->hp.numa = true;
		dev->hp.node = fn.numa_node;
	}
	dev->path = opts->path;
	snprintf(dev->path_why, sizeof(dev->path_why), "asked for");
	if (dev->path == UPCIE_NVME_PATH_AUTO) {
		/* vfio either way when there is a group; cdev or container is decided once bound */
		dev->path = fn.iommu_group >= 0 ? UPCIE_NVME_PATH_TYPE1 : UPCIE_NVME_PATH_UIO;
		snprintf(dev->path_why, sizeof(dev->path_why), "%s",
			 fn.iommu_group >= 0 ? "" : "auto: no IOMMU group");
	}
	if (dev->path != UPCIE_NVME_PATH_UIO && dev->path != UPCIE_NVME_PATH_TYPE1 &&
	    dev->path != UPCIE_NVME_PATH_IOMMUFD) {
		err = UPCIE_FAIL(-EINVAL, "nvme: %s: unknown path %d", dev->name, (int)opts->path);
		goto fail;
	}
	if (dev->path != UPCIE_NVME_PATH_UIO && fn.iommu_group < 0) {
		err = UPCIE_FAIL(-ENXIO,
				 "nvme: %s has no IOMMU group, so vfio cannot take it: enable the "
				 "IOMMU, or use the uio path",
				 dev->name);
		goto fail;
	}
	if ((opts->vfio_group_fd > 0 || opts->vf_token) && dev->path != UPCIE_NVME_PATH_TYPE1) {
		err = UPCIE_FAIL(-EINVAL,
				 "nvme: %s: a group file and a VF token are for the type1 path",
				 dev->name);
		goto fail;
	}
	driver = dev->path == UPCIE_NVME_PATH_UIO ? "uio_pci_generic" : "vfio-pci";
	if (opts->bind) {
		/* a wrong address must not hand a NIC or a bridge to uio_pci_generic/vfio-pci */
		if (fn.class_code != UPCIE_PCI_CLASS_NVME && !opts->bind_any_class) {
			err =
			    UPCIE_FAIL(-ENODEV,
				       "nvme: %s is not an NVMe controller (class 0x%06x, NVMe is "
				       "0x%06x): refusing to bind it to %s; check the address, or "
				       "set bind_any_class to bind it anyway",
				       dev->name, fn.class_code, UPCIE_PCI_CLASS_NVME, driver);
			goto fail;
		}
		/* never pull a mounted namespace, swap or a volume member from under the system */
		if (strcmp(fn.driver, driver)) {
			char action[64];

			snprintf(action, sizeof(action), "bind it to %s", driver);
			err = upcie_pci_inuse_refuse(bdf, opts->bind_in_use, action);
			if (err)
				goto fail;
		}
		err = upcie_pci_driver_bind(bdf, driver);
		if (err)
			goto fail;
	}
	err = upcie_nvme_dev_driver_check_(dev, driver, fn.class_code);
	if (err)
		goto fail;
	if (opts->path == UPCIE_NVME_PATH_AUTO && dev->path == UPCIE_NVME_PATH_TYPE1 &&
	    opts->vfio_group_fd <= 0 && !opts->vf_token) {
		bool cdev = upcie_nvme_dev_has_cdev_(bdf), iommu = access("/dev/iommu", F_OK) == 0;

		if (cdev && iommu)
			dev->path = UPCIE_NVME_PATH_IOMMUFD;
		snprintf(dev->path_why, sizeof(dev->path_why), "auto: %s",
			 cdev && iommu ? "vfio cdev and /dev/iommu present"
			 : cdev	       ? "vfio cdev present, no /dev/iommu (iommufd not loaded)"
			 : iommu       ? "/dev/iommu present, no vfio cdev for the function"
				       : "no vfio cdev, no /dev/iommu");
	}
	if (dev->path == UPCIE_NVME_PATH_UIO) {
		err = upcie_nvme_dev_uio_iommu_check_(dev);
		if (!err)
			err = upcie_pci_uio_open(bdf, &dev->uio);
		if (err)
			goto fail;
		dev->owned = true;
		snprintf(dev->hp_prefix, sizeof(dev->hp_prefix), "upcie-dma-%s-", dev->name);
		if (!opts->hugepage) {
			char dir[PATH_MAX];

			/* memory the device keeps after a crash must not go back to the pool */
			if (!upcie_hugetlbfs_mount(0, dir, sizeof(dir))) {
				dev->hp.src = UPCIE_HUGEPAGE_HUGETLBFS;
				dev->hp_named = true;
			} else {
				UPCIE_WARN(
				    "nvme: %s: no hugetlbfs mount of the default hugepage "
				    "size: DMA memory comes from memfds, which go back to the "
				    "system as soon as a process dies; the controller it left "
				    "may still write there (mount hugetlbfs)",
				    dev->name);
			}
		}
		err = upcie_pci_bar_map(bdf, 0, 0, &dev->bar0);
		if (err)
			goto fail;
		dev->regs = dev->bar0.addr;
		dev->regs_size = dev->bar0.size;
	} else {
		gfd_taken = true;
		err = upcie_nvme_dev_open_vfio_(dev, opts);
		if (err)
			goto fail;
	}
	/* whatever the last owner left running must not DMA before the controller is stopped */
	err = upcie_nvme_dev_bus_master_(dev, false);
	if (err)
		goto fail;
	if (dev->regs_size < 0x2000) {
		err = UPCIE_FAIL(-ENODEV,
				 "nvme: %s: BAR0 is %zu bytes, too small for an NVMe "
				 "controller",
				 dev->name, dev->regs_size);
		goto fail;
	}
	dev->open = true;
	UPCIE_INFO("nvme: %s open on the %s path (%s)", dev->name, upcie_nvme_path_name(dev->path),
		   dev->path_why);
	return 0;
fail:
	if (opts->vfio_group_fd > 0 && !gfd_taken)
		close(opts->vfio_group_fd);
	upcie_nvme_dev_close(dev);
	return err;
}

static inline int upcie_nvme_dev_bus_master_(const struct upcie_nvme_dev *dev, bool enable)
{
	uint16_t cmd = 0;
	int err;

	if (dev->path == UPCIE_NVME_PATH_UIO)
		return upcie_pci_bus_master_set(&dev->bdf, enable, NULL);
	err = upcie_vfio_region_rw(&dev->vdev, VFIO_PCI_CONFIG_REGION_INDEX, UPCIE_PCI_CFG_COMMAND,
				   &cmd, 2, 0);
	if (err)
		return err;
	cmd = le16toh(cmd);
	if (enable)
		cmd |= UPCIE_PCI_CMD_MASTER | UPCIE_PCI_CMD_MEMORY;
	else
		cmd &= (uint16_t)~UPCIE_PCI_CMD_MASTER;
	cmd = htole16(cmd);
	err = upcie_vfio_region_rw(&dev->vdev, VFIO_PCI_CONFIG_REGION_INDEX, UPCIE_PCI_CFG_COMMAND,
				   &cmd, 2, 1);
	if (!err)
		err = upcie_vfio_region_rw(&dev->vdev, VFIO_PCI_CONFIG_REGION_INDEX,
					   UPCIE_PCI_CFG_COMMAND, &cmd, 2, 0);
	if (err)
		return err;
	if (!!(le16toh(cmd) & UPCIE_PCI_CMD_MASTER) != enable)
		return UPCIE_FAIL(-EIO, "nvme: %s: bus master bit did not stick (command=0x%04x)",
				  dev->name, le16toh(cmd));
	return 0;
}

/*
 * Set or clear bus mastering (and memory decoding when setting): sysfs for uio, vfio else. The
 * command register is read back: -EIO when the bit did not take.
 */
static inline int upcie_nvme_dev_bus_master(const struct upcie_nvme_dev *dev, bool enable)
{
	if (!dev || !dev->open)
		return UPCIE_FAIL(-EINVAL, "nvme: bus master: dev not open");
	return upcie_nvme_dev_bus_master_(dev, enable);
}

/*
 * Reset the function (a function-level reset or whatever the kernel has for it): through vfio
 * (VFIO_DEVICE_RESET) or sysfs (uio). The kernel restores the command register as it was before
 * the reset, bus mastering included. -EOPNOTSUPP when there is no reset method.
 */
static inline int upcie_nvme_dev_reset(const struct upcie_nvme_dev *dev)
{
	if (!dev || !dev->open)
		return UPCIE_FAIL(-EINVAL, "nvme: reset: dev not open");
	if (dev->path == UPCIE_NVME_PATH_UIO)
		return upcie_pci_func_reset(&dev->bdf);
	return upcie_vfio_device_reset(&dev->vdev);
}

/* Hugepage LUT memory in a file named after the function, the process and a count. */
static inline int upcie_nvme_dev_dmamem_named_(const struct upcie_nvme_dev *dev, size_t size,
					       struct upcie_dmamem *mem)
{
	static unsigned seq;
	struct upcie_hugepage_opts o = dev->hp;
	char name[96];
	int err = -EEXIST;

	/* another translation unit's counter may have taken a name: the next one is free */
	for (int tries = 0; err == -EEXIST && tries < 64; tries++) {
		snprintf(name, sizeof(name), "%s%d-%u", dev->hp_prefix, (int)getpid(),
			 __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED));
		o.name = name;
		err = upcie_dmamem_hugepage_lut(mem, size, &o);
	}
	return err;
}

/*
 * Remove the DMA memory files a process that died left for this function (uio path), now that
 * the function's device is stopped: until then its hugepages stay allocated, as the dead
 * process's controller may have kept writing them. Files of live processes stay. Returns the
 * number removed (>= 0) or -errno; 0 on the other paths.
 */
static inline int upcie_nvme_dev_reclaim(const struct upcie_nvme_dev *dev)
{
	int n;

	if (!dev || !dev->open)
		return UPCIE_FAIL(-EINVAL, "nvme: reclaim: dev not open");
	if (dev->path != UPCIE_NVME_PATH_UIO || !dev->hp_prefix[0])
		return 0;
	n = upcie_hugepage_reclaim(dev->hp_prefix);
	if (n > 0)
		UPCIE_INFO("nvme: %s: %d DMA memory files of a driver that died reclaimed",
			   dev->name, n);
	return n;
}

/*
 * `size` bytes of host memory the controller can DMA to and from, with a CPU view: hugepages
 * with a physical-address LUT (uio), or mapped into the container (type1) or IOAS (iommufd) at
 * an IOVA. On the uio path (default options, a hugetlbfs mount present) the hugepages live in a
 * file named after the function ("upcie-dma-<bdf>-<pid>-<n>") that outlives a process that dies
 * with the controller running, until upcie_nvme_dev_reclaim() after the controller is stopped.
 * The size is rounded up to the page size of the memory. Destroy it with upcie_dmamem_destroy()
 * before closing the dev. `mem` is zeroed on failure.
 */
static inline int upcie_nvme_dev_dmamem(const struct upcie_nvme_dev *dev, size_t size,
					struct upcie_dmamem *mem)
{
	if (!mem)
		return UPCIE_FAIL(-EINVAL, "nvme: dmamem: NULL dmamem");
	if (!dev || !dev->open) {
		memset(mem, 0, sizeof(*mem));
		mem->fd = -1;
		return UPCIE_FAIL(-EINVAL, "nvme: dmamem: dev not open");
	}
	switch (dev->path) {
	case UPCIE_NVME_PATH_UIO:
		if (dev->hp_named)
			return upcie_nvme_dev_dmamem_named_(dev, size, mem);
		return upcie_dmamem_hugepage_lut(mem, size, &dev->hp);
	case UPCIE_NVME_PATH_TYPE1:
		return upcie_dmamem_type1_hugepage(mem, dev->container, size, &dev->hp);
	default:
		return upcie_dmamem_iommufd_memfd(mem, dev->ioas, size, &dev->hp, false);
	}
}

/*
 * Map BAR `bar` of the controller itself (for the CMB): sysfs resource for uio, vfio region
 * otherwise. out->bus is the BAR's address from sysfs. Unmap with upcie_nvme_dev_bar_unmap().
 */
static inline int upcie_nvme_dev_bar_map(const struct upcie_nvme_dev *dev, uint32_t bar,
					 struct upcie_nvme_dev_bar *out)
{
	struct upcie_pci_resource res[UPCIE_PCI_NUM_RES];
	int err;

	if (!out)
		return UPCIE_FAIL(-EINVAL, "nvme: bar map: NULL output");
	memset(out, 0, sizeof(*out));
	out->sysfs.index = -1;
	if (!dev || !dev->open || bar >= UPCIE_PCI_NUM_BARS)
		return UPCIE_FAIL(-EINVAL, "nvme: bar map: dev not open or BAR %u", bar);
	err = upcie_pci_func_resources(&dev->bdf, res);
	if (err)
		return UPCIE_FAIL(err, "nvme: %s: cannot read resources", dev->name);
	if (dev->path == UPCIE_NVME_PATH_UIO) {
		err = upcie_pci_bar_map(&dev->bdf, (int)bar, 0, &out->sysfs);
		if (err)
			return err;
		out->addr = out->sysfs.addr;
		out->size = out->sysfs.size;
	} else {
		err = upcie_vfio_region_map(&dev->vdev, bar, &out->region);
		if (err)
			return err;
		out->addr = out->region.addr;
		out->size = out->region.size;
	}
	out->bus = res[bar].start;
	return 0;
}

/*
 * Unmap a BAR of upcie_nvme_dev_bar_map(), whichever way it was mapped; a zeroed one is a no-op.
 * Only once no device DMAs to it.
 */
static inline void upcie_nvme_dev_bar_unmap(struct upcie_nvme_dev_bar *b)
{
	if (!b)
		return;
	upcie_pci_bar_unmap(&b->sysfs);
	upcie_vfio_region_unmap(&b->region);
	memset(b, 0, sizeof(*b));
	b->sysfs.index = -1;
}

/*
 * Reserve `size` bytes (a power of two) of the controller's device address space where no
 * memory will ever be mapped, aligned to `size`: for the CMB's controller base address, which
 * the controller claims for itself before any IOMMU lookup. type1: from the container's IOVA
 * allocator (released by upcie_nvme_dev_addr_release()); iommufd: just above the highest
 * IOVA the IOAS allows (the kernel never maps there); uio: -EOPNOTSUPP (use the BAR address).
 */
static inline int upcie_nvme_dev_addr_reserve(const struct upcie_nvme_dev *dev, uint64_t size,
					      uint64_t *addr)
{
	struct upcie_vfio_iova_ranges r;
	uint64_t top = 0;
	int err;

	if (!dev || !dev->open || !addr || !upcie_is_pow2(size))
		return UPCIE_FAIL(-EINVAL, "nvme: address reserve: bad arguments");
	if (dev->path == UPCIE_NVME_PATH_UIO)
		return -EOPNOTSUPP;
	if (dev->path == UPCIE_NVME_PATH_TYPE1)
		return upcie_vfio_iova_alloc(&dev->container->iovas, size, size, addr);
	err = upcie_vfio_ioas_iova_ranges(dev->ioas, &r);
	if (err)
		return err;
	for (uint32_t i = 0; i < r.n; i++)
		if (r.r[i].last > top)
			top = r.r[i].last;
	if (top >= UINT64_MAX - 2 * size)
		return UPCIE_FAIL(-ENOSPC, "nvme: %s: no device address above the IOAS ranges",
				  dev->name);
	*addr = upcie_align_up(top + 1, size);
	return 0;
}

/*
 * Give back a range of upcie_nvme_dev_addr_reserve() (type1 only holds anything; the other
 * paths reserved nothing). Once the controller no longer decodes it.
 */
static inline void upcie_nvme_dev_addr_release(const struct upcie_nvme_dev *dev, uint64_t addr,
					       uint64_t size)
{
	if (dev && dev->open && dev->path == UPCIE_NVME_PATH_TYPE1 && size)
		upcie_vfio_iova_free(&dev->container->iovas, addr, size);
}

/*
 * Claim [addr, addr + size) of the controller's device address space at that address: a range
 * the controller decodes itself (a CMB before NVMe 1.4 sits at its BAR's bus address), where no
 * host memory may ever be mapped for it. type1: reserved in the container's IOVA allocator
 * (release with upcie_nvme_dev_addr_unclaim()); iommufd: the kernel picks IOVAs, so the range
 * must lie outside every range the IOAS may map (-EOPNOTSUPP otherwise); uio: nothing to do
 * (the device sees physical addresses, and that one is the BAR's).
 */
static inline int upcie_nvme_dev_addr_claim(const struct upcie_nvme_dev *dev, uint64_t addr,
					    uint64_t size)
{
	struct upcie_vfio_iova_ranges r;
	uint64_t last;
	int err;

	if (!dev || !dev->open || !size || upcie_add_overflow(addr, size - 1, &last))
		return UPCIE_FAIL(-EINVAL, "nvme: address claim: bad arguments");
	if (dev->path == UPCIE_NVME_PATH_UIO)
		return 0;
	if (dev->path == UPCIE_NVME_PATH_TYPE1)
		return upcie_vfio_iova_reserve_at(&dev->container->iovas, addr, size);
	err = upcie_vfio_ioas_iova_ranges(dev->ioas, &r);
	if (err)
		return err;
	for (uint32_t i = 0; i < r.n; i++)
		if (r.r[i].start <= last && r.r[i].last >= addr)
			return UPCIE_FAIL(-EOPNOTSUPP,
					  "nvme: %s: [0x%" PRIx64 ", 0x%" PRIx64
					  "] may be mapped in the IOAS: the controller could not "
					  "tell its own memory from host memory there",
					  dev->name, addr, last);
	return 0;
}

/*
 * Give back a range of upcie_nvme_dev_addr_claim() (type1 only holds anything; the other paths
 * claimed nothing). Once the controller no longer decodes it.
 */
static inline void upcie_nvme_dev_addr_unclaim(const struct upcie_nvme_dev *dev, uint64_t addr,
					       uint64_t size)
{
	if (dev && dev->open && dev->path == UPCIE_NVME_PATH_TYPE1 && size)
		upcie_vfio_iova_free(&dev->container->iovas, addr, size);
}

/*
 * Enable `count` MSI-X vectors of the controller, each signalling its own eventfd (vfio paths
 * only: -EOPNOTSUPP under uio). Disable with upcie_vfio_irq_disable().
 */
static inline int upcie_nvme_dev_irq_enable(const struct upcie_nvme_dev *dev, uint32_t count,
					    struct upcie_vfio_irqs *irqs)
{
	if (!dev || !dev->open || !irqs)
		return UPCIE_FAIL(-EINVAL, "nvme: irq enable: dev not open");
	if (dev->path == UPCIE_NVME_PATH_UIO)
		return UPCIE_FAIL(-EOPNOTSUPP,
				  "nvme: %s: MSI-X needs vfio (uio_pci_generic only forwards INTx)",
				  dev->name);
	return upcie_vfio_irq_enable(irqs, &dev->vdev, VFIO_PCI_MSIX_IRQ_INDEX, count);
}

/* Release the peer's memory and vfio handles. A zeroed peer is a no-op. */
static inline void upcie_nvme_peer_close(struct upcie_nvme_peer *p)
{
	if (!p)
		return;
	upcie_dmamem_destroy(&p->mem);
	upcie_vfio_device_close(&p->vdev);
	upcie_vfio_group_close(&p->group);
	memset(p, 0, sizeof(*p));
	p->mem.fd = -1;
	p->vdev.fd = -1;
	p->group.fd = -1;
}

/*
 * Make [off, off + size) of BAR `bar` of peer function `bdf` DMA memory for the controller of
 * `dev`, on dev's path: the sysfs bus address under uio (no translating IOMMU; the caveats of
 * mem/dmamem_bar.h apply), the peer's group joined to dev's container and the BAR mmap mapped
 * at an allocated IOVA under type1, the BAR exported as a vfio dma-buf and mapped into dev's
 * IOAS under iommufd (Linux >= 6.19). The peer must be bound to vfio-pci on the vfio paths and
 * be unbound (or bound to a driver that leaves its BAR alone) under uio. off and size are page
 * multiples. Close the peer before the dev. `p` is zeroed on failure.
 */
static inline int upcie_nvme_peer_open(struct upcie_nvme_peer *p, const struct upcie_nvme_dev *dev,
				       const struct upcie_pci_bdf *bdf, uint32_t bar, uint64_t off,
				       size_t size)
{
	int err, gid;

	if (!p)
		return UPCIE_FAIL(-EINVAL, "nvme: peer open: NULL peer");
	memset(p, 0, sizeof(*p));
	p->mem.fd = -1;
	p->vdev.fd = -1;
	p->group.fd = -1;
	if (!dev || !dev->open || !bdf)
		return UPCIE_FAIL(-EINVAL, "nvme: peer open: dev not open or NULL address");
	p->path = dev->path;
	switch (dev->path) {
	case UPCIE_NVME_PATH_UIO:
		err = upcie_dmamem_bar_uio(&p->mem, bdf, bar, off, size);
		break;
	case UPCIE_NVME_PATH_TYPE1:
		gid = upcie_vfio_group_id(bdf);
		if (gid < 0) {
			err = gid;
			break;
		}
		err = upcie_vfio_group_open(&p->group, dev->container, gid);
		if (!err)
			err = upcie_vfio_device_open(&p->vdev, &p->group, bdf);
		if (!err)
			err = upcie_dmamem_bar_type1(&p->mem, dev->container, &p->vdev, bar, off,
						     size);
		break;
	default:
		err = upcie_vfio_cdev_open(&p->vdev, dev->iommufd, bdf);
		if (!err)
			err =
			    upcie_dmamem_bar_iommufd(&p->mem, dev->ioas, &p->vdev, bar, off, size);
		break;
	}
	if (err)
		upcie_nvme_peer_close(p);
	return err;
}

#endif /* UPCIE_NVME_DEV_H */
