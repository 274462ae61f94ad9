// SPDX-License-Identifier: GPL-2.0
/*
 * iommu_map_pa: map known physical pages into the IOMMU domain of a PCI function.
 *
 * Why it exists: vfio and iommufd map only what they can resolve and pin from a user address or
 * a file they accept; a GPU's dma-buf is neither, yet the physical addresses behind it are known
 * (dmabuf_import). This module puts them into the user-owned domain of a controller bound to
 * vfio-pci, inside an IOVA window user space keeps free for it. Its second use installs an
 * identity mapping of a controller's BAR in a GPU's kernel DMA domain, so the GPU's peer-to-peer
 * doorbell writes are translated to where they were meant to go. The UAPI and its semantics are
 * in uapi/iommu_map_pa.h; this file adds how and what protects the kernel.
 *
 * What it refuses: a user-domain MAP without the proof of owning that domain (the function's
 * open vfio device descriptor), pages that are not device memory of the named source function
 * (outside its assigned memory BARs, or on its MSI-X table or pending bits: so never system RAM,
 * persistent memory or another device's registers), ranges outside the aperture or in a
 * reserved region, and any page the domain already translates at its smallest page size.
 * MAP_BAR maps nothing but an assigned memory BAR range clear of the MSI-X structures, only at
 * its own bus address, only into a kernel DMA domain (DMA or DMA-FQ), only where nothing is
 * mapped yet, and only inside the host-bridge windows the kernel's IOVA allocator reserves for
 * the target (iova_reserve_pci_windows()) unless the caller overrides that.
 *
 * Lifetime. A domain pointer is only used while this module holds what keeps that domain alive:
 * for a user domain the owner's vfio device file (held from MAP until the mapping goes: a type1
 * container's domains live while one of its devices is open, vfio_group_ioctl_unset_container()
 * refuses with EBUSY; an iommufd device keeps its attachment until its own file detaches it),
 * for a kernel DMA domain the binding of the target's driver (MAP_BAR and TRANSLATE refuse a
 * target with no driver bound, MAP_BAR one whose driver manages DMA itself, and hold the
 * target's device_lock while they run: see imp_target_lock()), which the bus notifier watches.
 * Before each use the domain is compared with the function's current one; a mapping is only
 * removed while it still translates its first page to the address it was made with. Mappings
 * belong to the open file that made them; its release unmaps them, and an open file holds a
 * module reference. The bus notifier removes the mappings of a function whose driver is about
 * to change (BUS_NOTIFY_UNBIND_DRIVER, before vfio-pci's remove waits for the device files) or
 * that is being removed, and those whose source function goes the same way; the handles then
 * answer nothing but UNMAP. The memory behind a MAP's pages is kept by its dma-buf
 * (lifetime_fd): attached for the module's own device, pinned (or from an exporter that never
 * moves a buffer), its scatter list checked to hold every page, released only when the handle
 * is freed, after the mapping is gone (imp_lt_begin, imp_lt_end).
 *
 * Locking. imp_lock (global, held briefly) protects the lists of files, functions and domains.
 * A function's mutex (struct imp_func) serializes everything that reads or changes what the
 * function's domain holds on this module's behalf: MAP, MAP_BAR, UNMAP, TRANSLATE and the bus
 * notifier; a domain's mutex (struct imp_dom) serializes this module's changes to one domain
 * shared by several functions; a file's mutex its handle list. Order: the target's device_lock
 * (MAP_BAR, TRANSLATE; the notifier is called with it held), a function's mutex, a domain's
 * mutex, a file's mutex, imp_lock. No other device_lock is taken, none of these is held across
 * a copy to or from user space, and long loops reschedule.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/delay.h>
#include <linux/device.h>
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/iommu.h>
#include <linux/ioport.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/overflow.h>
#include <linux/pci.h>
#include <linux/security.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <linux/poll.h>
#include <linux/vfio_pci_core.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

#include "uapi/iommu_map_pa.h"

#define IMP_VERSION "1.3.0"

/* The dma-buf a MAP's pages belong to: referenced, attached, pinned and checked (imp_lt_begin). */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
MODULE_IMPORT_NS("DMA_BUF");
#else
MODULE_IMPORT_NS(DMA_BUF);
#endif

/*
 * The identity user space checks before it talks to /dev/iommu_map_pa: another project ships a
 * module of the same name and device node with another interface. Read-only, and refused as a
 * load argument, so no module can be made to claim another identity.
 */
static int imp_abi_get(char *buf, const struct kernel_param *kp)
{
	return scnprintf(buf, PAGE_SIZE, "%s %d\n", UPCIE_IOMMU_MAP_PA_IDENT,
			 UPCIE_IOMMU_MAP_PA_ABI);
}

static int imp_abi_set(const char *val, const struct kernel_param *kp)
{
	return -EPERM;
}

static const struct kernel_param_ops imp_abi_ops = {
	.set = imp_abi_set,
	.get = imp_abi_get,
};
module_param_cb(abi, &imp_abi_ops, NULL, 0444);
MODULE_PARM_DESC(abi, "identity and ABI version: \"" UPCIE_IOMMU_MAP_PA_IDENT " <n>\" (read-only)");

/* iommu_map() takes a gfp_t from 6.3 on. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
#define imp_iommu_map(d, iova, pa, sz, prot) iommu_map(d, iova, pa, sz, prot, GFP_KERNEL)
#else
#define imp_iommu_map(d, iova, pa, sz, prot) iommu_map(d, iova, pa, sz, prot)
#endif

static unsigned int max_mappings = 4096;
module_param(max_mappings, uint, 0644);
MODULE_PARM_DESC(max_mappings, "handles one open file may hold (default 4096)");
static unsigned int max_total_mappings = 16384;
module_param(max_total_mappings, uint, 0644);
MODULE_PARM_DESC(max_total_mappings, "handles all files together may hold (default 16384)");
static unsigned long max_map_pages = 1UL << 22;
module_param(max_map_pages, ulong, 0644);
MODULE_PARM_DESC(max_map_pages, "pages one MAP may name (default 4194304)");
static unsigned long max_map_mib = 64UL << 10;
module_param(max_map_mib, ulong, 0644);
MODULE_PARM_DESC(max_map_mib, "MiB one MAP or MAP_BAR may cover (default 65536)");
static char static_exporters[256] = "udmabuf,drm,nvidia,nv_dmabuf";
module_param_string(static_exporters, static_exporters, sizeof(static_exporters), 0444);
MODULE_PARM_DESC(static_exporters,
		 "exporters (dma-buf exp_name) without a pin op whose buffers never move or get "
		 "revoked, comma separated (default udmabuf,drm,nvidia,nv_dmabuf)");

/* Every page-by-page loop yields this often. */
#define IMP_RESCHED 512

/* A function this module maps for (target) or from (source). */
struct imp_func {
	struct kref ref;
	struct list_head node; /* imp_funcs (imp_lock) */
	struct pci_dev *pdev;
	struct mutex lock;
	struct list_head handles;  /* as target (lock) */
	struct list_head shandles; /* as source (lock) */
	bool dying;		   /* DEL_DEVICE .. REMOVED_DEVICE (lock) */
	bool unbinding;		   /* UNBIND_DRIVER .. UNBOUND_DRIVER (lock) */
};

/* A domain this module has mappings in. */
struct imp_dom {
	struct list_head node; /* imp_doms (imp_lock) */
	struct iommu_domain *domain;
	struct mutex lock;
	struct list_head handles; /* with a mapping in it (lock) */
	unsigned int refs;	  /* imp_lock */
};

/* One range installed in (or borrowed from) one domain. Shared by the handles of one file. */
struct imp_mapping {
	struct imp_dom *dom;
	u64 iova;
	u64 size;
	u64 page_size;
	phys_addr_t first_phys;
	phys_addr_t last_phys; /* of the page at iova + size - page_size */
	int prot;
	unsigned int refs; /* dom->lock */
	bool installed;	   /* false: borrowed (MAP_BAR with F_SHARE): never unmapped by us */
};

struct imp_handle {
	struct kref ref;
	struct list_head node;	/* in its file (file lock) */
	struct list_head tnode; /* in its target's handles (target lock) */
	struct list_head snode; /* in its source's shandles (source lock) */
	struct list_head dnode; /* in its domain record's handles (its lock) */
	u64 handle;
	struct imp_func *tf;	  /* the function whose domain holds the mapping */
	struct imp_func *sf;	  /* the function whose memory is mapped */
	struct file *owner;	  /* MAP: the target's vfio device, kept open */
	struct dma_buf *lifetime; /* MAP: the dma-buf the pages belong to; NULL: raw pages */
	struct dma_buf_attachment *lt_attach; /* its attachment for imp_misc, pinned if lt_pinned */
	bool lt_pinned;
	bool lt_moved;	       /* the exporter moved or revoked it (under its reservation lock) */
	struct imp_mapping *m; /* target lock and its domain's lock */
	struct imp_dom *dom;   /* m's domain record, set once before the handle is listed */
	bool bar;	       /* made by MAP_BAR */
	bool gone;	       /* removed by the bus notifier (READ_ONCE) */
	bool torn;	       /* target lock */
};

struct imp_file {
	struct mutex lock;
	struct list_head handles;
	struct list_head node; /* in imp_files */
	u64 next_handle;
	unsigned int nh;
};

static DEFINE_MUTEX(imp_lock);
static LIST_HEAD(imp_files);
static LIST_HEAD(imp_funcs);
static LIST_HEAD(imp_doms);
static atomic64_t imp_live = ATOMIC64_INIT(0);
static bool imp_ready;
/* a handle was torn down by the bus notifier or its domain went: files' poll() looks again */
static DECLARE_WAIT_QUEUE_HEAD(imp_poll_wq);
static struct workqueue_struct *imp_wq; /* drops owner files for the bus notifier */

/* ------------------------------------------------------------------------------------------ */
/* functions and domains */

static void imp_func_release(struct kref *ref) __releases(&imp_lock)
{
	struct imp_func *func = container_of(ref, struct imp_func, ref);

	list_del(&func->node);
	mutex_unlock(&imp_lock);
	pci_dev_put(func->pdev);
	mutex_destroy(&func->lock);
	kfree(func);
}

static void imp_func_put(struct imp_func *func)
{
	if (func)
		kref_put_mutex(&func->ref, imp_func_release, &imp_lock);
}

static struct imp_func *imp_func_find_locked(struct device *dev)
{
	struct imp_func *func;

	lockdep_assert_held(&imp_lock);
	list_for_each_entry(func, &imp_funcs, node)
		if (&func->pdev->dev == dev)
			return func;
	return NULL;
}

/*
 * Is the function fully added and not being removed? PCI_DEV_ADDED (drivers/pci/pci.h: bit 0 of
 * priv_flags from 6.1 through 7.x) is set by pci_bus_add_device() after the IOMMU probe that
 * device_add() triggers, and cleared first thing by pci_stop_dev(); before it the function is
 * visible to pci_get_domain_bus_and_slot() without its IOMMU state.
 */
static bool imp_pci_added(const struct pci_dev *pdev)
{
	return test_bit(0, &pdev->priv_flags);
}

/* The record of the function at `p`, referenced; ERR_PTR on failure. */
static struct imp_func *imp_func_get(const struct upcie_iommu_map_pa_pci *p)
{
	struct imp_func *func;
	struct pci_dev *pdev;

	if (p->reserved)
		return ERR_PTR(-EINVAL);
	pdev = pci_get_domain_bus_and_slot(p->segment, p->bus, p->devfn);
	if (!pdev)
		return ERR_PTR(-ENODEV);
	if (!imp_pci_added(pdev)) {
		pci_dev_put(pdev);
		return ERR_PTR(-ENODEV);
	}
	mutex_lock(&imp_lock);
	func = imp_func_find_locked(&pdev->dev);
	if (func) {
		kref_get(&func->ref);
	} else {
		func = kzalloc(sizeof(*func), GFP_KERNEL);
		if (func) {
			kref_init(&func->ref);
			mutex_init(&func->lock);
			INIT_LIST_HEAD(&func->handles);
			INIT_LIST_HEAD(&func->shandles);
			func->pdev = pci_dev_get(pdev);
			list_add(&func->node, &imp_funcs);
		}
	}
	mutex_unlock(&imp_lock);
	pci_dev_put(pdev);
	return func ?: ERR_PTR(-ENOMEM);
}

static struct imp_dom *imp_dom_get(struct iommu_domain *d)
{
	struct imp_dom *dom;

	mutex_lock(&imp_lock);
	list_for_each_entry(dom, &imp_doms, node) {
		if (dom->domain == d) {
			dom->refs++;
			mutex_unlock(&imp_lock);
			return dom;
		}
	}
	dom = kzalloc(sizeof(*dom), GFP_KERNEL);
	if (dom) {
		dom->domain = d;
		dom->refs = 1;
		mutex_init(&dom->lock);
		INIT_LIST_HEAD(&dom->handles);
		list_add(&dom->node, &imp_doms);
	}
	mutex_unlock(&imp_lock);
	return dom;
}

static void imp_dom_put(struct imp_dom *dom)
{
	if (!dom)
		return;
	mutex_lock(&imp_lock);
	if (--dom->refs) {
		dom = NULL;
	} else {
		list_del(&dom->node);
	}
	mutex_unlock(&imp_lock);
	if (dom) {
		mutex_destroy(&dom->lock);
		kfree(dom);
	}
}

/* What kind of domain translates the function's DMA now; *out is that domain (or NULL). */
static u32 imp_domain_kind(struct pci_dev *pdev, struct iommu_domain **out)
{
	struct iommu_group *group = iommu_group_get(&pdev->dev);
	struct iommu_domain *d;
	struct pci_driver *drv;
	u32 kind;

	*out = NULL;
	if (!group)
		return UPCIE_IOMMU_MAP_PA_DOMAIN_NONE;
	d = iommu_get_domain_for_dev(&pdev->dev);
	if (!d) {
		kind = UPCIE_IOMMU_MAP_PA_DOMAIN_OTHER;
	} else if (d->type == IOMMU_DOMAIN_BLOCKED) {
		kind = UPCIE_IOMMU_MAP_PA_DOMAIN_BLOCKED;
	} else if (d->type == IOMMU_DOMAIN_IDENTITY) {
		kind = UPCIE_IOMMU_MAP_PA_DOMAIN_IDENTITY;
	} else if (d->type == IOMMU_DOMAIN_DMA || d->type == IOMMU_DOMAIN_DMA_FQ) {
		kind = UPCIE_IOMMU_MAP_PA_DOMAIN_DMA;
	} else if (d->type == IOMMU_DOMAIN_UNMANAGED) {
		/* User space owns it when the bound driver hands DMA to user space (vfio-pci). */
		drv = pdev->dev.driver ? to_pci_driver(pdev->dev.driver) : NULL;
		kind = drv && drv->driver_managed_dma && iommu_group_dma_owner_claimed(group)
			   ? UPCIE_IOMMU_MAP_PA_DOMAIN_USER
			   : UPCIE_IOMMU_MAP_PA_DOMAIN_UNMANAGED;
	} else {
		kind = UPCIE_IOMMU_MAP_PA_DOMAIN_OTHER;
	}
	iommu_group_put(group);
	*out = d;
	return kind;
}

/*
 * The domain attached to `dev` now, with its group's mutex held. 7.x asserts that
 * iommu_get_domain_for_dev() is called without it and offers the driver-level call instead.
 */
static struct iommu_domain *imp_cur_domain_locked(struct device *dev)
{
#ifdef UPCIE_KMOD_HAVE_DRIVER_GET_DOMAIN
	return iommu_driver_get_domain_for_dev(dev);
#else
	return iommu_get_domain_for_dev(dev);
#endif
}

struct imp_glocked {
	struct device *dev;
	int (*fn)(struct iommu_domain *cur, void *arg);
	void *arg;
	int ret;
	bool ran;
};

static int imp_glocked_cb(struct device *dev, void *data)
{
	struct imp_glocked *g = data;

	if (dev != g->dev)
		return 0;
	g->ret = g->fn(imp_cur_domain_locked(dev), g->arg);
	g->ran = true;
	return 1;
}

/*
 * Run fn(cur, arg) with the IOMMU group of `pdev` locked (iommu_group_for_each_dev() holds the
 * group's mutex), cur being the domain attached to it now. Every attach, detach and replace of
 * a group's domain takes that mutex (type1's detach before it frees a domain, iommufd's before
 * a hardware page table can be destroyed, the sysfs type change, a driver's probe), so a domain
 * seen attached here stays allocated until fn returns, whatever its owner does meanwhile. This
 * is what makes a domain pointer safe to use; nothing is held between requests. Without a group
 * (or with the function no longer in it) fn runs with cur NULL.
 */
static int imp_with_group(struct pci_dev *pdev, int (*fn)(struct iommu_domain *, void *), void *arg)
{
	struct iommu_group *group = iommu_group_get(&pdev->dev);
	struct imp_glocked g = { .dev = &pdev->dev, .fn = fn, .arg = arg };

	if (group) {
		iommu_group_for_each_dev(group, &g, imp_glocked_cb);
		iommu_group_put(group);
	}
	return g.ran ? g.ret : fn(NULL, arg);
}

/*
 * Hold the binding of the target's driver for a request: its device_lock, with a driver bound.
 * A function's kernel DMA domain lives only as long as a driver's binding anchors it (the
 * kernel-doc of iommu_get_domain_for_dev()): a bound driver that uses the DMA API holds the
 * group's owner count (the driver core's iommu_device_use_default_domain()), which refuses a
 * write of /sys/kernel/iommu_groups/N/type; with no driver bound that write frees the domain
 * and attaches a new one, and nothing notifies this module. Under the device_lock no probe,
 * unbind or removal of the function is in flight (6.1's type change also trylocks it), and an
 * unbind that comes after the request finds its mappings through the bus notifier. Order: the
 * device_lock before any lock of this module (the notifier is called with it held).
 * -ENODEV (no driver), -EINTR.
 */
static int imp_target_lock(struct imp_func *tf, const char *what)
{
	struct device *dev = &tf->pdev->dev;
	int ret = device_lock_interruptible(dev);

	if (ret)
		return ret;
	if (!dev->driver) {
		device_unlock(dev);
		pci_info_ratelimited(tf->pdev,
				     "iommu_map_pa: %s refused: no driver is bound to it, and "
				     "nothing else keeps its DMA domain\n",
				     what);
		return -ENODEV;
	}
	return 0;
}

static void imp_target_unlock(struct imp_func *tf)
{
	device_unlock(&tf->pdev->dev);
}

/*
 * Does vfio grant `owner` access to its device? Opening /dev/vfio/devices/vfioN always
 * succeeds and points the file at the device, also while another process owns it through a
 * type1 group or its own bound cdev; only VFIO_DEVICE_BIND_IOMMUFD grants that file access, and
 * vfio answers every other request of an ungranted file with EINVAL before it looks at the
 * argument (vfio_device_fops_unl_ioctl(): access_granted). A granted file reaches vfio-pci's
 * VFIO_DEVICE_GET_INFO, whose first step reads the argument: a NULL argument gives EFAULT, with
 * nothing changed. Device files opened through a group are granted when they are made
 * (VFIO_GROUP_GET_DEVICE_FD needs the group in a container with an IOMMU set). So EFAULT means
 * the holder owns the device's DMA (group in a container, or the cdev bound to an iommufd), and
 * anything else is no proof. vfio's private structures are not read: their layout depends on
 * the kernel's configuration.
 */
static int imp_owner_granted(struct file *owner)
{
	long ret;

	if (!owner->f_op->unlocked_ioctl)
		return -EACCES;
	ret = owner->f_op->unlocked_ioctl(owner, VFIO_DEVICE_GET_INFO, 0);
	return ret == -EFAULT ? 0 : -EACCES;
}

/*
 * Is `owner` the open vfio device of `pdev`? Its driver must be of the vfio-pci family, whose
 * driver data is a struct vfio_pci_core_device (vfio_pci_core_register_device() callers), and
 * the file one of vfio's (f_op owner): a device file opened through the group, whose
 * private_data is the struct vfio_device (6.1), or a struct vfio_device_file whose first member
 * points to it (group path and cdev since the cdev support). The group and container files of
 * vfio carry other objects there, which never equal the device's address. Function lock held.
 */
static int imp_owner_check(struct pci_dev *pdev, struct file *owner)
{
	const struct device_driver *drv = pdev->dev.driver;
	struct vfio_pci_core_device *core;
	const void *priv = owner->private_data;

	if (!drv || !strstr(drv->name, "vfio") || !owner->f_op || !owner->f_op->owner ||
	    strcmp(module_name(owner->f_op->owner), "vfio"))
		return -EACCES;
	core = dev_get_drvdata(&pdev->dev);
	if (!core || !priv)
		return -EACCES;
	if (priv != &core->vdev && *(const void *const *)priv != &core->vdev)
		return -EACCES;
	return imp_owner_granted(owner);
}

/* Drop a held owner file. From the notifier the last reference must not run the release in
 * the unbinding task (vfio-pci's remove waits for it): a worker does it. */
struct imp_fput_work {
	struct work_struct work;
	struct file *file;
};

static void imp_fput_fn(struct work_struct *work)
{
	struct imp_fput_work *w = container_of(work, struct imp_fput_work, work);

	fput(w->file);
	kfree(w);
}

static void imp_owner_put(struct file *file, bool async)
{
	struct imp_fput_work *w;

	if (!file)
		return;
	if (!async) {
		fput(file);
		return;
	}
	w = kmalloc(sizeof(*w), GFP_KERNEL | __GFP_NOFAIL);
	INIT_WORK(&w->work, imp_fput_fn);
	w->file = file;
	queue_work(imp_wq, &w->work);
}

/* ------------------------------------------------------------------------------------------ */
/* what may be mapped */

/* The MSI-X table and PBA of `pdev` as physical ranges (page-rounded); returns how many. */
static int imp_msix_ranges(struct pci_dev *pdev, phys_addr_t lo[2], phys_addr_t hi[2])
{
	u16 flags;
	u32 reg[2];
	u64 size[2];
	int i, n = 0;

	if (!pdev->msix_cap)
		return 0;
	pci_read_config_word(pdev, pdev->msix_cap + PCI_MSIX_FLAGS, &flags);
	pci_read_config_dword(pdev, pdev->msix_cap + PCI_MSIX_TABLE, &reg[0]);
	pci_read_config_dword(pdev, pdev->msix_cap + PCI_MSIX_PBA, &reg[1]);
	size[0] = ((flags & PCI_MSIX_FLAGS_QSIZE) + 1) * PCI_MSIX_ENTRY_SIZE;
	size[1] = DIV_ROUND_UP((flags & PCI_MSIX_FLAGS_QSIZE) + 1, 64) * 8;
	for (i = 0; i < 2; i++) {
		unsigned int bar = reg[i] & PCI_MSIX_TABLE_BIR;
		u64 off = reg[i] & PCI_MSIX_TABLE_OFFSET;

		if (bar >= PCI_STD_NUM_BARS || !pci_resource_len(pdev, bar))
			continue;
		lo[n] = round_down(pci_resource_start(pdev, bar) + off, PAGE_SIZE);
		hi[n] = round_up(pci_resource_start(pdev, bar) + off + size[i], PAGE_SIZE) - 1;
		n++;
	}
	return n;
}

/* Is BAR `bar` of `pdev` an assigned memory BAR (a released one keeps its flags, start 0)? */
static bool imp_bar_assigned(struct pci_dev *pdev, unsigned int bar)
{
	const struct resource *res = &pdev->resource[bar];

	return (res->flags & IORESOURCE_MEM) &&
	       !(res->flags & (IORESOURCE_UNSET | IORESOURCE_DISABLED)) && res->parent &&
	       res->start && resource_size(res);
}

/*
 * May [pa, pa + len) be mapped as memory of `src`? Inside one assigned memory BAR, off its
 * MSI-X table and pending bits, and (belt and braces) not system RAM. 0 or -EPERM.
 */
static int imp_check_memory(struct pci_dev *src, phys_addr_t pa, u64 len)
{
	phys_addr_t lo[2], hi[2], last = pa + len - 1;
	unsigned int bar;
	int n, i;

	for (bar = 0; bar < PCI_STD_NUM_BARS; bar++) {
		if (imp_bar_assigned(src, bar) && pa >= pci_resource_start(src, bar) &&
		    last <= pci_resource_end(src, bar))
			break;
	}
	if (bar == PCI_STD_NUM_BARS) {
		pci_info_ratelimited(
		    src, "iommu_map_pa: %pa+%#llx is not in an assigned memory BAR of it\n", &pa,
		    len);
		return -EPERM;
	}
	n = imp_msix_ranges(src, lo, hi);
	for (i = 0; i < n; i++) {
		if (pa <= hi[i] && last >= lo[i]) {
			pci_info_ratelimited(
			    src, "iommu_map_pa: %pa+%#llx covers its MSI-X structures\n", &pa, len);
			return -EPERM;
		}
	}
	if (region_intersects(pa, len, IORESOURCE_SYSTEM_RAM, IORES_DESC_NONE) != REGION_DISJOINT)
		return -EPERM;
	return 0;
}

/* Is [iova, iova + size) inside the domain's aperture? 0 or -ERANGE. */
static int imp_check_range(struct pci_dev *pdev, struct iommu_domain *d, u64 iova, u64 size)
{
	u64 last = iova + size - 1;

	if (d->geometry.force_aperture &&
	    (iova < d->geometry.aperture_start || last > d->geometry.aperture_end)) {
		pci_info_ratelimited(
		    pdev, "iommu_map_pa: [%#llx, %#llx] outside the aperture [%pad, %pad]\n", iova,
		    last, &d->geometry.aperture_start, &d->geometry.aperture_end);
		return -ERANGE;
	}
	return 0;
}

/*
 * Is [iova, iova + size) clear of the function's reserved regions (MSI windows, RMRRs and
 * other direct-mapped ranges, AMD's HyperTransport hole)? 0 or -ERANGE. The function's own list
 * where iommu_get_resv_regions() is exported (7.x); on 6.1 its group's, which is the union over
 * the group's functions (iommu_get_group_resv_regions() takes the group's mutex: never called
 * under imp_with_group()). The x86 interrupt window is checked by address as well.
 */
static int imp_check_resv(struct pci_dev *pdev, u64 iova, u64 size)
{
	u64 last = iova + size - 1;
	int ret = 0;

#ifdef CONFIG_X86
	if (iova <= 0xfeefffffULL && last >= 0xfee00000ULL)
		return -ERANGE;
#endif
	{
		struct iommu_resv_region *r, *tmp;
		LIST_HEAD(resv);
#ifdef UPCIE_KMOD_HAVE_RESV_REGIONS
		iommu_get_resv_regions(&pdev->dev, &resv);
#else
		struct iommu_group *group = iommu_group_get(&pdev->dev);

		if (!group)
			return 0;
		ret = iommu_get_group_resv_regions(group, &resv);
		iommu_group_put(group);
		if (ret)
			return ret;
#endif
		list_for_each_entry(r, &resv, list) {
			if (r->length && iova <= r->start + r->length - 1 && last >= r->start) {
				pci_info_ratelimited(
				    pdev,
				    "iommu_map_pa: [%#llx, %#llx] overlaps reserved "
				    "region %pa+%#zx\n",
				    iova, last, &r->start, r->length);
				ret = -ERANGE;
				break;
			}
		}
#ifdef UPCIE_KMOD_HAVE_RESV_REGIONS
		iommu_put_resv_regions(&pdev->dev, &resv);
		(void)tmp;
#else
		/* the group variant copies each region with kzalloc (iommu_insert_resv_region) */
		list_for_each_entry_safe(r, tmp, &resv, list)
			kfree(r);
#endif
	}
	return ret;
}

/* The domain's smallest page: every overlap check looks at each of these. */
static u64 imp_min_page(const struct iommu_domain *d)
{
	return d->pgsize_bitmap ? 1ULL << __ffs(d->pgsize_bitmap) : PAGE_SIZE;
}

/*
 * Does the domain translate any of [iova, iova + size)? With `want` (share), every address must
 * translate to want(i) instead. 0, -EEXIST or -EINTR (a fatal signal: the caller gives up).
 */
static int imp_scan(struct iommu_domain *d, u64 iova, u64 size, const u64 *pages, u64 ps,
		    phys_addr_t bar_phys, bool share)
{
	u64 step = imp_min_page(d), off, n = 0;

	for (off = 0; off < size; off += step) {
		phys_addr_t now = iommu_iova_to_phys(d, iova + off), want;

		if (share) {
			want = pages ? pages[off / ps] + off % ps : bar_phys + off;
			if (now != want)
				return -EEXIST;
		} else if (now) {
			return -EEXIST;
		}
		if (++n % IMP_RESCHED == 0) {
			cond_resched();
			if (fatal_signal_pending(current))
				return -EINTR;
		}
	}
	return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* mappings and handles */

/*
 * Remove a mapping from its domain, if that is the domain attached now (cur, group mutex held:
 * it cannot be freed meanwhile) and the mapping is still ours (its first and last page still
 * translate to what they were mapped to). A domain that is not attached now is never
 * dereferenced: its owner detached it, and freeing it frees what this module put there.
 * dom->lock held.
 */
static void imp_mapping_remove(struct imp_mapping *m, struct iommu_domain *cur,
			       struct pci_dev *pdev)
{
	u64 last = m->iova + m->size - m->page_size;
	size_t done;

	if (!m->installed)
		return;
	if (cur != m->dom->domain) {
		pci_info_ratelimited(
		    pdev,
		    "iommu_map_pa: the domain of the mapping at %#llx is no longer "
		    "attached; nothing to unmap\n",
		    m->iova);
		return;
	}
	if (iommu_iova_to_phys(cur, m->iova) != m->first_phys ||
	    iommu_iova_to_phys(cur, last) != m->last_phys) {
		pci_info_ratelimited(pdev,
				     "iommu_map_pa: %#llx no longer maps %pa; not unmapping\n",
				     m->iova, &m->first_phys);
		return;
	}
	done = iommu_unmap(cur, m->iova, m->size);
	if (done != m->size)
		pci_warn(pdev, "iommu_map_pa: unmapped %#zx of %#llx bytes at %#llx\n", done,
			 m->size, m->iova);
}

/*
 * Take a handle's share of its mapping out of the domain, once. The target's lock is held (so
 * the domain pointer is current or known stale). `async`: called by the bus notifier.
 */
/*
 * A mapping this module installed goes: the MAP_BAR handles that borrowed (F_SHARE) part of it
 * have nothing left. They are marked gone (poll() says so, and only UNMAP answers them).
 */
static void imp_tell_borrowers(struct imp_dom *dom, const struct imp_mapping *m)
{
	struct imp_handle *b;

	lockdep_assert_held(&dom->lock);
	list_for_each_entry(b, &dom->handles, dnode) {
		const struct imp_mapping *bm = b->m;

		if (bm && !bm->installed && bm->iova <= m->iova + m->size - 1 &&
		    m->iova <= bm->iova + bm->size - 1) {
			pci_info_ratelimited(b->tf->pdev,
					     "iommu_map_pa: the mapping handle %llu borrowed was "
					     "unmapped by its owner\n",
					     b->handle);
			WRITE_ONCE(b->gone, true);
		}
	}
}

struct imp_rm {
	struct imp_handle *h;
	bool freed;			/* the last handle of the mapping: it was removed */
	bool wait;			/* may wait for a reset to end */
	struct iommu_domain *group_dom; /* the group's domain, looked at before (compared only) */
};

static int imp_teardown_fn(struct iommu_domain *cur, void *arg)
{
	struct imp_rm *r = arg;
	struct imp_mapping *m = r->h->m;
	struct imp_dom *dom = m->dom;

	mutex_lock(&dom->lock);
	/*
	 * A function being reset (7.x: pci_dev_reset_iommu_prepare()) sits in the blocking domain
	 * for the reset while its own domain stays the group's: wait for it to come back. A
	 * function whose owner detached it has the blocking domain as the group's: no wait.
	 */
	if (r->wait && m->refs == 1 && m->installed && cur != dom->domain && cur &&
	    cur->type == IOMMU_DOMAIN_BLOCKED && r->group_dom == dom->domain) {
		mutex_unlock(&dom->lock);
		return -EAGAIN;
	}
	/* under the domain's lock: imp_overlap() reads it there */
	WRITE_ONCE(r->h->m, NULL);
	list_del_init(&r->h->dnode);
	if (--m->refs == 0) {
		imp_mapping_remove(m, cur, r->h->tf->pdev);
		r->freed = true;
		if (m->installed)
			imp_tell_borrowers(dom, m);
	}
	mutex_unlock(&dom->lock);
	return 0;
}

static void imp_handle_teardown_locked(struct imp_handle *h, bool async)
{
	struct imp_mapping *m = h->m;
	struct imp_rm r = { .h = h, .wait = true };
	int tries = 0;

	lockdep_assert_held(&h->tf->lock);
	if (h->torn)
		return;
	h->torn = true;
	list_del_init(&h->tnode);
	if (m) {
		/* the group's domain (not the function's during a reset): compared, never used */
		r.group_dom = iommu_get_domain_for_dev(&h->tf->pdev->dev);
		while (imp_with_group(h->tf->pdev, imp_teardown_fn, &r) == -EAGAIN) {
			if (++tries >= 100)
				r.wait = false; /* 1 s: the domain is not coming back */
			msleep(10);
		}
		if (r.freed) {
			kfree(m);
			imp_dom_put(h->dom);
		}
	}
	imp_owner_put(h->owner, async);
	h->owner = NULL;
	wake_up_all(&imp_poll_wq);
}

/* ------------------------------------------------------------------------------------------ */
/* the dma-buf a MAP's pages belong to */

static struct miscdevice imp_misc;
/* The own device: dma-direct, no IOMMU, no segment limits: its addresses are CPU physical. */
static struct device_dma_parameters imp_dma_parms = {
	.max_segment_size = UINT_MAX,
	.segment_boundary_mask = ULONG_MAX,
};

static bool imp_exporter_static(const struct dma_buf *dmabuf)
{
	const char *list = static_exporters, *name = dmabuf->exp_name;
	size_t n;

	if (!name)
		return false;
	n = strlen(name);
	while (*list) {
		size_t len = strcspn(list, ",");

		if (len == n && !strncmp(list, name, n))
			return true;
		list += len;
		if (*list == ',')
			list++;
	}
	return false;
}

/*
 * The exporter moves or revokes the buffer (its reservation lock is held). A pinned buffer is
 * never moved and a static exporter never does either, so this is a revocation: the mapping
 * goes now, before the exporter reuses the memory, and the handle answers nothing but UNMAP.
 * During MAP, before the target is known, lt_moved makes MAP fail instead. Lock order: the
 * reservation lock, then the target's mutex (no path of this module takes a reservation lock
 * while holding a function's mutex: imp_lt_begin runs before MAP takes it, imp_lt_end after
 * every lock is dropped).
 */
static void imp_lt_invalidate(struct dma_buf_attachment *attach)
{
	struct imp_handle *h = attach->importer_priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (READ_ONCE(h->lt_moved))
		return;
	WRITE_ONCE(h->lt_moved, true);
	pr_warn_ratelimited("exporter %s moved or revoked the buffer of a mapping; unmapping it\n",
			    attach->dmabuf->exp_name ?: "?");
	if (!h->tf)
		return;
	mutex_lock(&h->tf->lock);
	WRITE_ONCE(h->gone, true);
	imp_handle_teardown_locked(h, true);
	mutex_unlock(&h->tf->lock);
}

#ifdef UPCIE_KMOD_HAVE_INVALIDATE_MAPPINGS
/*
 * 7.1+: the callback is optional and promises an unmap in bounded time, which the teardown
 * keeps (its wait for a domain to come back ends after 1 s). Only pinned or static buffers
 * are accepted, so it runs only if such an exporter takes a buffer back after all.
 */
static const struct dma_buf_attach_ops imp_lt_ops = {
	.allow_peer2peer = true,
	.invalidate_mappings = imp_lt_invalidate,
};
#else
/* Up to 7.0 the callback is mandatory for a dynamic importer. */
static const struct dma_buf_attach_ops imp_lt_ops = {
	.allow_peer2peer = true,
	.move_notify = imp_lt_invalidate,
};
#endif

struct imp_range {
	u64 lo, hi; /* [lo, hi) */
};

static int imp_range_cmp(const void *a, const void *b)
{
	const struct imp_range *x = a, *y = b;

	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/*
 * Does every page lie inside the buffer's scatter list (addresses for imp_misc: CPU physical)?
 * 0, -ENXIO naming the first page that does not, -ENOMEM. Sorted and merged once, then one
 * binary search per run of contiguous pages.
 */
static int imp_lt_check(const struct dma_buf *buf, struct sg_table *sgt, const u64 *pages,
			u64 npages, u64 ps)
{
	struct imp_range *r;
	struct scatterlist *sg;
	unsigned int i, n = 0, k;
	u64 p, run_pa, run_len;
	int ret = 0;

	r = kvmalloc_array(max_t(unsigned int, sgt->nents, 1), sizeof(*r), GFP_KERNEL);
	if (!r)
		return -ENOMEM;
	for_each_sgtable_dma_sg(sgt, sg, i) {
		if (!sg_dma_len(sg))
			continue;
		r[n].lo = sg_dma_address(sg);
		r[n].hi = r[n].lo + sg_dma_len(sg);
		n++;
	}
	sort(r, n, sizeof(*r), imp_range_cmp, NULL);
	for (i = 0, k = 0; i < n; i++) {
		if (k && r[i].lo <= r[k - 1].hi)
			r[k - 1].hi = max(r[k - 1].hi, r[i].hi);
		else
			r[k++] = r[i];
	}
	for (p = 0; p < npages && !ret;) {
		unsigned int lo = 0, hi = k;

		run_pa = pages[p];
		run_len = ps;
		for (p++; p < npages && pages[p] == run_pa + run_len; p++)
			run_len += ps;
		while (lo < hi) { /* the last range starting at or below run_pa */
			unsigned int mid = lo + (hi - lo) / 2;

			if (r[mid].lo <= run_pa)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (!lo || run_pa + run_len > r[lo - 1].hi) {
			pr_info_ratelimited(
			    "the page at %#llx is not in the scatter list of the %s "
			    "buffer named as lifetime_fd\n",
			    run_pa, buf->exp_name ?: "?");
			ret = -ENXIO;
		}
		if (p % IMP_RESCHED == 0)
			cond_resched();
	}
	kvfree(r);
	return ret;
}

/*
 * The dma-buf at `fd` as the lifetime of h's pages: referenced, dynamically attached for the
 * module's own device, pinned where the exporter can pin (else it must be a static exporter),
 * and every page checked against its scatter list. No lock of this module held. The pin stays
 * until the handle is freed (imp_lt_end), after the mapping is gone.
 */
static int imp_lt_begin(struct imp_handle *h, int fd, const u64 *pages, u64 npages, u64 ps)
{
	struct dma_buf_attachment *attach;
	struct dma_buf *buf;
	struct sg_table *sgt;
	long wait;
	int ret;

	buf = dma_buf_get(fd);
	if (IS_ERR(buf))
		return PTR_ERR(buf);
	h->lifetime = buf;
	if (!buf->ops->pin && !imp_exporter_static(buf)) {
		pr_info_ratelimited("exporter %s cannot pin its buffers and may move or revoke "
				    "them: not accepted as lifetime_fd (static_exporters lists "
				    "exporters that never do)\n",
				    buf->exp_name ?: "?");
		return -EOPNOTSUPP;
	}
	attach = dma_buf_dynamic_attach(buf, imp_misc.this_device, &imp_lt_ops, h);
	if (IS_ERR(attach))
		return PTR_ERR(attach);
	h->lt_attach = attach;
	/* a dynamic importer pins and maps under the reservation lock (6.1 and later) */
	ret = dma_resv_lock_interruptible(buf->resv, NULL);
	if (ret)
		return ret;
	if (buf->ops->pin) {
		ret = dma_buf_pin(attach);
		if (ret) {
			pr_info_ratelimited("exporter %s could not pin the buffer named as "
					    "lifetime_fd (%d)\n",
					    buf->exp_name ?: "?", ret);
			goto unlock;
		}
		h->lt_pinned = true;
	}
	sgt = dma_buf_map_attachment(attach, DMA_BIDIRECTIONAL);
	if (IS_ERR(sgt)) {
		ret = PTR_ERR(sgt);
		goto unlock;
	}
	ret = imp_lt_check(buf, sgt, pages, npages, ps);
	/* the pin (or the static exporter) keeps the memory; the addresses were only read */
	dma_buf_unmap_attachment(attach, sgt, DMA_BIDIRECTIONAL);
unlock:
	dma_resv_unlock(buf->resv);
	if (ret)
		return ret;
	/* what the exporter did to place the memory (a clear, a move) finishes first */
	wait = dma_resv_wait_timeout(buf->resv, DMA_RESV_USAGE_KERNEL, true, MAX_SCHEDULE_TIMEOUT);
	if (wait < 0)
		return (int)wait;
	return READ_ONCE(h->lt_moved) ? -ESTALE : 0;
}

/* Unpin, detach and drop the dma-buf; no lock of this module held. */
static void imp_lt_end(struct imp_handle *h)
{
	if (h->lt_attach) {
		if (h->lt_pinned) {
			dma_resv_lock(h->lifetime->resv, NULL);
			dma_buf_unpin(h->lt_attach);
			dma_resv_unlock(h->lifetime->resv);
		}
		dma_buf_detach(h->lifetime, h->lt_attach);
	}
	if (h->lifetime)
		dma_buf_put(h->lifetime);
}

static void imp_handle_free(struct kref *ref)
{
	struct imp_handle *h = container_of(ref, struct imp_handle, ref);

	if (h->owner)
		fput(h->owner); /* never torn down: a request that failed */
	imp_lt_end(h);
	imp_func_put(h->sf);
	imp_func_put(h->tf);
	kfree(h);
}

/* End a handle no file lists any more. */
static void imp_handle_end(struct imp_handle *h)
{
	if (h->tf) {
		mutex_lock(&h->tf->lock);
		imp_handle_teardown_locked(h, false);
		mutex_unlock(&h->tf->lock);
	}
	if (h->sf) {
		mutex_lock(&h->sf->lock);
		list_del_init(&h->snode);
		mutex_unlock(&h->sf->lock);
	}
	atomic64_dec(&imp_live);
	kref_put(&h->ref, imp_handle_free);
}

/*
 * List the handle with its memory's source before anything is mapped, so that the source's
 * removal or rebinding (the notifier) finds it; h->tf is set. -ENODEV while the source dies.
 */
static int imp_source_register(struct imp_handle *h)
{
	int ret = 0;

	mutex_lock(&h->sf->lock);
	/* PCI_DEV_ADDED goes first in pci_stop_dev(), before BUS_NOTIFY_DEL_DEVICE */
	if (h->sf->dying || !imp_pci_added(h->sf->pdev))
		ret = -ENODEV;
	else
		list_add_tail(&h->snode, &h->sf->shandles);
	mutex_unlock(&h->sf->lock);
	return ret;
}

static int imp_prot(u32 prot)
{
	int p = IOMMU_MMIO; /* device memory, never RAM: see the file comment */

	if (!prot)
		prot = UPCIE_IOMMU_MAP_PA_READ | UPCIE_IOMMU_MAP_PA_WRITE;
	if (prot & UPCIE_IOMMU_MAP_PA_READ)
		p |= IOMMU_READ;
	if (prot & UPCIE_IOMMU_MAP_PA_WRITE)
		p |= IOMMU_WRITE;
	return p;
}

/* A new handle with slots reserved in the file and in the module (EMFILE, ENFILE). */
static struct imp_handle *imp_handle_new(struct imp_file *f)
{
	struct imp_handle *h;

	mutex_lock(&f->lock);
	if (f->nh >= READ_ONCE(max_mappings)) {
		mutex_unlock(&f->lock);
		return ERR_PTR(-EMFILE);
	}
	f->nh++;
	mutex_unlock(&f->lock);
	if (atomic64_inc_return(&imp_live) > READ_ONCE(max_total_mappings)) {
		atomic64_dec(&imp_live);
		pr_info_ratelimited("max_total_mappings (%u) reached\n", max_total_mappings);
		h = ERR_PTR(-ENFILE);
		goto fail;
	}
	h = kzalloc(sizeof(*h), GFP_KERNEL);
	if (!h) {
		atomic64_dec(&imp_live);
		h = ERR_PTR(-ENOMEM);
		goto fail;
	}
	kref_init(&h->ref);
	INIT_LIST_HEAD(&h->node);
	INIT_LIST_HEAD(&h->tnode);
	INIT_LIST_HEAD(&h->snode);
	INIT_LIST_HEAD(&h->dnode);
	return h;
fail:
	mutex_lock(&f->lock);
	f->nh--;
	mutex_unlock(&f->lock);
	return h;
}

/* Give back what imp_handle_new() and the request took, for a handle never published. */
static void imp_handle_abort(struct imp_file *f, struct imp_handle *h)
{
	imp_handle_end(h);
	mutex_lock(&f->lock);
	f->nh--;
	mutex_unlock(&f->lock);
}

/* Number the handle, tell user space, then list it in the file. */
static int imp_handle_publish(struct imp_file *f, struct imp_handle *h, void __user *uarg,
			      const void *req, size_t len, u64 *handle_field)
{
	mutex_lock(&f->lock);
	h->handle = ++f->next_handle;
	mutex_unlock(&f->lock);
	*handle_field = h->handle;
	if (copy_to_user(uarg, req, len))
		return -EFAULT; /* the number is burnt: handles are never reused */
	mutex_lock(&f->lock);
	list_add_tail(&h->node, &f->handles);
	mutex_unlock(&f->lock);
	return 0;
}

/*
 * An existing mapping of this file in `dom` that overlaps [iova, +size): *same is set when it
 * has exactly this range, page size and protection (the candidate for sharing). dom->lock held.
 */
static struct imp_mapping *imp_overlap(struct imp_file *f, struct imp_dom *dom, u64 iova, u64 size,
				       u64 page_size, int prot, bool *same)
{
	struct imp_mapping *found = NULL;
	struct imp_handle *h;

	lockdep_assert_held(&dom->lock);
	*same = false;
	mutex_lock(&f->lock);
	list_for_each_entry(h, &f->handles, node) {
		struct imp_mapping *m;

		/*
		 * Only handles of this domain: their mapping changes under its lock, which is
		 * held. Another domain's mapping may be freed meanwhile, so it is never read.
		 */
		if (h->dom != dom)
			continue;
		m = READ_ONCE(h->m);
		if (!m)
			continue;
		if (iova + size - 1 < m->iova || iova > m->iova + m->size - 1)
			continue;
		*same = m->installed && m->iova == iova && m->size == size &&
			m->page_size == page_size && m->prot == prot;
		found = m;
		break;
	}
	mutex_unlock(&f->lock);
	return found;
}

/*
 * Map the pages (checked already), merging physically contiguous ones into one iommu_map()
 * call; on failure everything this call mapped is unmapped again.
 */
static int imp_map_pages(struct iommu_domain *d, u64 iova0, const u64 *pages, u64 npages, u64 ps,
			 int prot)
{
	u64 run_iova = iova0, run_pa = 0, run_len = 0, mapped = 0, i;
	int ret = 0;

	for (i = 0; i < npages; i++) {
		u64 pa = pages[i], iova = iova0 + i * ps;

		if (run_len && run_pa + run_len == pa) {
			run_len += ps;
		} else {
			if (run_len) {
				ret = imp_iommu_map(d, run_iova, run_pa, run_len, prot);
				if (ret)
					break;
				mapped += run_len;
			}
			run_iova = iova;
			run_pa = pa;
			run_len = ps;
		}
		if (i % IMP_RESCHED == IMP_RESCHED - 1)
			cond_resched();
	}
	if (!ret && run_len) {
		ret = imp_iommu_map(d, run_iova, run_pa, run_len, prot);
		if (!ret)
			mapped += run_len;
	}
	if (ret && mapped)
		iommu_unmap(d, iova0, mapped);
	return ret;
}

/* Check every page: alignment, then contiguous runs as memory of `src`. */
static int imp_check_pages(struct pci_dev *src, const u64 *pages, u64 npages, u64 ps)
{
	u64 i, run_pa = 0, run_len = 0;
	int ret;

	for (i = 0; i < npages; i++) {
		u64 pa = pages[i];

		if (!IS_ALIGNED(pa, ps) || pa + ps - 1 < pa || (phys_addr_t)pa != pa)
			return -EINVAL;
		if (run_len && run_pa + run_len == pa) {
			run_len += ps;
			continue;
		}
		if (run_len) {
			ret = imp_check_memory(src, run_pa, run_len);
			if (ret)
				return ret;
		}
		run_pa = pa;
		run_len = ps;
		if (i % IMP_RESCHED == IMP_RESCHED - 1)
			cond_resched();
	}
	return run_len ? imp_check_memory(src, run_pa, run_len) : 0;
}

/* What one MAP does inside its target's group lock. */
struct imp_map_op {
	struct imp_file *f;
	struct imp_handle *h;
	struct iommu_domain *d; /* the domain the checks were made for */
	const u64 *pages;
	u64 iova, size, npages, page_size;
	int prot;
	bool shared; /* out */
};

static int imp_map_fn(struct iommu_domain *cur, void *arg)
{
	struct imp_map_op *op = arg;
	struct imp_handle *h = op->h;
	struct pci_dev *pdev = h->tf->pdev;
	struct iommu_domain *d = op->d;
	struct imp_mapping *m = NULL, *old;
	struct imp_dom *dom, *lockdom;
	bool same = false;
	int ret;

	if (cur != d) {
		/* the owner attached another domain since the checks: nothing is mapped */
		pci_info_ratelimited(pdev, "iommu_map_pa: its domain changed during MAP\n");
		return -EAGAIN;
	}
	if (!d->pgsize_bitmap || op->page_size < imp_min_page(d))
		return -EINVAL;
	ret = imp_check_range(pdev, d, op->iova, op->size);
	if (ret)
		return ret;
	dom = imp_dom_get(d);
	if (!dom)
		return -ENOMEM;
	lockdom = dom;
	mutex_lock(&lockdom->lock);
	old = imp_overlap(op->f, dom, op->iova, op->size, op->page_size, op->prot, &same);
	if (old && !same) {
		ret = -EEXIST;
	} else if (same) {
		ret = imp_scan(d, op->iova, op->size, op->pages, op->page_size, 0, true);
	} else {
		ret = imp_scan(d, op->iova, op->size, NULL, 0, 0, false);
		if (ret == -EEXIST)
			pci_info_ratelimited(pdev,
					     "iommu_map_pa: [%#llx, +%#llx) is already mapped\n",
					     op->iova, op->size);
		if (!ret) {
			m = kzalloc(sizeof(*m), GFP_KERNEL);
			ret = m ? imp_map_pages(d, op->iova, op->pages, op->npages, op->page_size,
						op->prot)
				: -ENOMEM;
		}
	}
	if (!ret && same) {
		old->refs++;
		h->dom = dom;
		WRITE_ONCE(h->m, old);
		list_add_tail(&h->dnode, &dom->handles);
		op->shared = true;
	} else if (!ret) {
		*m = (struct imp_mapping){ .dom = dom,
					   .iova = op->iova,
					   .size = op->size,
					   .page_size = op->page_size,
					   .first_phys = op->pages[0],
					   .last_phys = op->pages[op->npages - 1],
					   .prot = op->prot,
					   .refs = 1,
					   .installed = true };
		h->dom = dom;
		WRITE_ONCE(h->m, m);
		list_add_tail(&h->dnode, &dom->handles);
		m = NULL;
		dom = NULL; /* the mapping holds it */
	}
	mutex_unlock(&lockdom->lock);
	kfree(m);
	imp_dom_put(dom); /* a failure, or shared: the mapping holds one already */
	return ret;
}

static long imp_ioc_map(struct imp_file *f, void __user *uarg)
{
	struct upcie_iommu_map_pa_map req;
	struct imp_map_op op = { .f = f };
	struct iommu_domain *d;
	struct imp_handle *h;
	struct imp_func *tf;
	u64 size, *pages;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if ((req.flags & ~UPCIE_IOMMU_MAP_PA_F_RAW_PAGES) || req.reserved0 || req.reserved[0] ||
	    req.reserved[1] || (req.prot & ~(UPCIE_IOMMU_MAP_PA_READ | UPCIE_IOMMU_MAP_PA_WRITE)))
		return -EINVAL;
	if (!is_power_of_2(req.page_size) || req.page_size < PAGE_SIZE || !req.npages ||
	    !IS_ALIGNED(req.iova, req.page_size) || req.iova != (unsigned long)req.iova)
		return -EINVAL;
	if (req.npages > READ_ONCE(max_map_pages))
		return -E2BIG;
	if (check_mul_overflow(req.npages, req.page_size, &size) || req.iova + size - 1 < req.iova)
		return -EINVAL;
	if (size > (u64)READ_ONCE(max_map_mib) << 20)
		return -E2BIG;
	/* the pages' dma-buf, or raw pages said explicitly: never both, never neither */
	if (req.lifetime_fd < -1 ||
	    (req.lifetime_fd == -1) != !!(req.flags & UPCIE_IOMMU_MAP_PA_F_RAW_PAGES))
		return -EINVAL;
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;

	pages = kvmalloc_array(req.npages, sizeof(*pages), GFP_KERNEL);
	if (!pages)
		return -ENOMEM;
	if (copy_from_user(pages, u64_to_user_ptr(req.pages), req.npages * sizeof(*pages))) {
		kvfree(pages);
		return -EFAULT;
	}
	h = imp_handle_new(f);
	if (IS_ERR(h)) {
		kvfree(pages);
		return PTR_ERR(h);
	}
	h->owner = fget(req.owner_fd);
	if (!h->owner) {
		ret = -EBADF;
		goto abort;
	}
	h->sf = imp_func_get(&req.source);
	if (IS_ERR(h->sf)) {
		ret = PTR_ERR(h->sf);
		h->sf = NULL;
		goto abort;
	}
	tf = imp_func_get(&req.pci);
	if (IS_ERR(tf)) {
		ret = PTR_ERR(tf);
		goto abort;
	}
	h->tf = tf;
	/* registered first: a source that goes from here on tears the handle down (h->torn) */
	ret = imp_source_register(h);
	if (!ret)
		ret = imp_check_pages(h->sf->pdev, pages, req.npages, req.page_size);
	/* before the target's lock: a revocation takes it under the reservation lock */
	if (!ret && req.lifetime_fd >= 0)
		ret = imp_lt_begin(h, req.lifetime_fd, pages, req.npages, req.page_size);
	if (ret)
		goto abort;

	mutex_lock(&tf->lock); /* the driver (vfio-pci) stays bound: its unbind waits for this */
	if (h->torn) {
		/* the source's driver changed since it was registered: its memory is not ours */
		ret = -ENODEV;
		goto unlock;
	}
	if (READ_ONCE(h->lt_moved)) {
		ret = -ESTALE; /* the exporter took the buffer back meanwhile */
		goto unlock;
	}
	switch (imp_domain_kind(tf->pdev, &d)) {
	case UPCIE_IOMMU_MAP_PA_DOMAIN_USER:
		ret = imp_owner_check(tf->pdev, h->owner);
		if (ret)
			pci_info_ratelimited(tf->pdev,
					     "iommu_map_pa: owner_fd is not its open vfio "
					     "device with access granted\n");
		break;
	case UPCIE_IOMMU_MAP_PA_DOMAIN_NONE:
		pci_info_ratelimited(tf->pdev, "iommu_map_pa: no IOMMU translates this function\n");
		ret = -ENODEV;
		break;
	default:
		pci_info_ratelimited(tf->pdev,
				     "iommu_map_pa: its DMA domain is not user-owned (driver: %s); "
				     "refused\n",
				     tf->pdev->dev.driver ? tf->pdev->dev.driver->name : "none");
		ret = -EPERM;
		break;
	}
	/* a driver leaving waits for the files this module holds: nothing new until it is gone */
	if (!ret && (tf->dying || tf->unbinding))
		ret = -ENODEV;
	if (ret)
		goto unlock;
	ret = imp_check_resv(tf->pdev, req.iova, size);
	if (ret)
		goto unlock;
	op.h = h;
	op.d = d;
	op.pages = pages;
	op.iova = req.iova;
	op.size = size;
	op.npages = req.npages;
	op.page_size = req.page_size;
	op.prot = imp_prot(req.prot);
	/* the checks against the domain and the mapping itself: under the group's lock */
	ret = imp_with_group(tf->pdev, imp_map_fn, &op);
	if (ret)
		goto unlock;
	req.shared = op.shared;
	list_add_tail(&h->tnode, &tf->handles);
	mutex_unlock(&tf->lock);
	kvfree(pages);
	ret = imp_handle_publish(f, h, uarg, &req, sizeof(req), &req.handle);
	if (ret) {
		imp_handle_end(h);
		mutex_lock(&f->lock);
		f->nh--;
		mutex_unlock(&f->lock);
	}
	return ret;

unlock:
	mutex_unlock(&tf->lock);
abort:
	kvfree(pages);
	imp_handle_abort(f, h);
	return ret;
}

/* Is [bus, bus + size) inside a memory window of the host bridge above `pdev`? */
static bool imp_in_host_window(struct pci_dev *pdev, u64 bus, u64 size)
{
	struct pci_host_bridge *bridge = pci_find_host_bridge(pdev->bus);
	struct resource_entry *w;

	resource_list_for_each_entry(w, &bridge->windows) {
		u64 lo = w->res->start - w->offset, hi = w->res->end - w->offset;

		if (resource_type(w->res) == IORESOURCE_MEM && bus >= lo && bus + size - 1 <= hi)
			return true;
	}
	return false;
}

/* What one MAP_BAR does inside its target's group lock. */
struct imp_bar_op {
	struct imp_handle *h;
	struct iommu_domain *d;
	struct pci_dev *src;
	u64 bus, phys, len;
	u32 flags, bar;
	int prot;
	bool share; /* out */
};

static int imp_map_bar_fn(struct iommu_domain *cur, void *arg)
{
	struct imp_bar_op *op = arg;
	struct pci_dev *pdev = op->h->tf->pdev;
	struct iommu_domain *d = op->d;
	struct imp_mapping *m;
	struct imp_dom *dom, *lockdom;
	int ret;

	if (cur != d) {
		pci_info_ratelimited(pdev, "iommu_map_pa: its domain changed during MAP_BAR\n");
		return -EAGAIN;
	}
	ret = imp_check_range(pdev, d, op->bus, op->len);
	if (ret)
		return ret;
	dom = imp_dom_get(d);
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!dom || !m) {
		kfree(m);
		imp_dom_put(dom);
		return -ENOMEM;
	}
	lockdom = dom;
	mutex_lock(&lockdom->lock);
	ret = imp_scan(d, op->bus, op->len, NULL, 0, 0, false);
	op->share = false;
	if (ret == -EEXIST && (op->flags & UPCIE_IOMMU_MAP_PA_F_SHARE)) {
		ret = imp_scan(d, op->bus, op->len, NULL, 0, op->phys, true);
		op->share = !ret;
	}
	if (ret == -EEXIST)
		pci_info_ratelimited(
		    pdev, "iommu_map_pa: %#llx+%#llx of %s BAR%u is taken in this domain\n",
		    op->bus, op->len, pci_name(op->src), op->bar);
	if (!ret && !op->share)
		ret = imp_iommu_map(d, op->bus, op->phys, op->len, op->prot);
	if (!ret) {
		*m = (struct imp_mapping){ .dom = dom,
					   .iova = op->bus,
					   .size = op->len,
					   .page_size = PAGE_SIZE,
					   .first_phys = op->phys,
					   .last_phys = op->phys + op->len - PAGE_SIZE,
					   .prot = op->prot,
					   .refs = 1,
					   .installed = !op->share };
		op->h->dom = dom;
		WRITE_ONCE(op->h->m, m);
		list_add_tail(&op->h->dnode, &dom->handles);
		m = NULL;
		dom = NULL;
	}
	mutex_unlock(&lockdom->lock);
	kfree(m);
	imp_dom_put(dom);
	return ret;
}

static long imp_ioc_map_bar(struct imp_file *f, void __user *uarg)
{
	struct upcie_iommu_map_pa_map_bar req;
	struct imp_bar_op op = { 0 };
	struct iommu_domain *d;
	struct imp_handle *h;
	struct imp_func *tf;
	struct pci_dev *src;
	u64 len, phys, bus;
	bool share;
	int prot;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if ((req.flags & ~(UPCIE_IOMMU_MAP_PA_F_SHARE | UPCIE_IOMMU_MAP_PA_F_OUTSIDE_WINDOW)) ||
	    req.bar > 5 || req.reserved0 || req.reserved[0] || req.reserved[1] ||
	    (req.prot & ~(UPCIE_IOMMU_MAP_PA_READ | UPCIE_IOMMU_MAP_PA_WRITE)) ||
	    !PAGE_ALIGNED(req.offset) || !PAGE_ALIGNED(req.length))
		return -EINVAL;
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	prot = imp_prot(req.prot);

	h = imp_handle_new(f);
	if (IS_ERR(h))
		return PTR_ERR(h);
	h->bar = true;
	h->sf = imp_func_get(&req.source);
	if (IS_ERR(h->sf)) {
		ret = PTR_ERR(h->sf);
		h->sf = NULL;
		goto abort;
	}
	src = h->sf->pdev;
	len = pci_resource_len(src, req.bar);
	if (!imp_bar_assigned(src, req.bar) || req.offset >= len || req.length > len - req.offset) {
		ret = -EINVAL;
		goto abort;
	}
	if (!req.length)
		req.length = len - req.offset;
	if (req.length / PAGE_SIZE > READ_ONCE(max_map_pages) ||
	    req.length > (u64)READ_ONCE(max_map_mib) << 20) {
		ret = -E2BIG;
		goto abort;
	}
	/* BARs smaller than a page (rare) are mapped as the whole page that holds them. */
	phys = pci_resource_start(src, req.bar) + req.offset;
	bus = pci_bus_address(src, req.bar) + req.offset;
	if (!PAGE_ALIGNED(phys) || !PAGE_ALIGNED(bus)) {
		ret = -EINVAL;
		goto abort;
	}
	req.length = PAGE_ALIGN(req.length);
	tf = imp_func_get(&req.target);
	if (IS_ERR(tf)) {
		ret = PTR_ERR(tf);
		goto abort;
	}
	h->tf = tf;
	/* registered before the check: a source that goes from here on tears the handle down */
	ret = imp_source_register(h);
	if (!ret)
		ret = imp_check_memory(src, phys, req.length);
	if (ret)
		goto abort;
	req.iova = bus;
	req.size = req.length;
	req.result_flags = imp_in_host_window(tf->pdev, bus, req.length)
			       ? UPCIE_IOMMU_MAP_PA_BAR_IN_HOST_WINDOW
			       : 0;

	/* the target's binding is held until the handle is listed where its notifier looks */
	ret = imp_target_lock(tf, "MAP_BAR");
	if (ret)
		goto abort;
	mutex_lock(&tf->lock);
	if (h->torn) {
		ret = -ENODEV; /* the source's driver changed since it was registered */
		goto unlock;
	}
	switch (imp_domain_kind(tf->pdev, &d)) {
	case UPCIE_IOMMU_MAP_PA_DOMAIN_NONE:
	case UPCIE_IOMMU_MAP_PA_DOMAIN_IDENTITY:
		/* The target's DMA reaches the BAR untranslated already. */
		mutex_unlock(&tf->lock);
		imp_target_unlock(tf);
		req.result = UPCIE_IOMMU_MAP_PA_BAR_PASSTHROUGH;
		req.handle = 0;
		ret = copy_to_user(uarg, &req, sizeof(req)) ? -EFAULT : 0;
		goto abort;
	case UPCIE_IOMMU_MAP_PA_DOMAIN_DMA:
		/*
		 * A driver that does its own DMA management (vfio-pci, pci-stub) does not hold the
		 * default domain: until user space claims the group, its type can be changed.
		 */
		if (to_pci_driver(tf->pdev->dev.driver)->driver_managed_dma) {
			pci_info_ratelimited(tf->pdev,
					     "iommu_map_pa: MAP_BAR refused: its driver %s does "
					     "not use the kernel DMA domain, which nothing keeps\n",
					     tf->pdev->dev.driver->name);
			ret = -EPERM;
			goto unlock;
		}
		break;
	default:
		pci_info_ratelimited(tf->pdev,
				     "iommu_map_pa: MAP_BAR needs a kernel DMA domain (DMA "
				     "or DMA-FQ)\n");
		ret = -EPERM;
		goto unlock;
	}
	if (tf->dying || tf->unbinding) {
		ret = -ENODEV;
		goto unlock;
	}
	/*
	 * dma-iommu reserves the host bridge's windows in the target's IOVA allocator
	 * (iova_reserve_pci_windows()); elsewhere its own DMA mappings may want these IOVAs.
	 */
	if (!(req.result_flags & UPCIE_IOMMU_MAP_PA_BAR_IN_HOST_WINDOW) &&
	    !(req.flags & UPCIE_IOMMU_MAP_PA_F_OUTSIDE_WINDOW)) {
		pci_info_ratelimited(
		    tf->pdev,
		    "iommu_map_pa: %#llx+%#llx is outside its host-bridge windows, "
		    "where the kernel's own DMA mappings for it may go; refused\n",
		    bus, req.length);
		ret = -ERANGE;
		goto unlock;
	}
	ret = imp_check_resv(tf->pdev, bus, req.length);
	if (ret)
		goto unlock;
	op.h = h;
	op.d = d;
	op.bus = bus;
	op.phys = phys;
	op.len = req.length;
	op.flags = req.flags;
	op.prot = prot;
	op.src = src;
	op.bar = req.bar;
	ret = imp_with_group(tf->pdev, imp_map_bar_fn, &op);
	if (ret)
		goto unlock;
	share = op.share;
	req.result = share ? UPCIE_IOMMU_MAP_PA_BAR_BORROWED : UPCIE_IOMMU_MAP_PA_BAR_MAPPED;
	list_add_tail(&h->tnode, &tf->handles);
	mutex_unlock(&tf->lock);
	imp_target_unlock(tf);
	ret = imp_handle_publish(f, h, uarg, &req, sizeof(req), &req.handle);
	if (ret) {
		imp_handle_end(h);
		mutex_lock(&f->lock);
		f->nh--;
		mutex_unlock(&f->lock);
	}
	return ret;

unlock:
	mutex_unlock(&tf->lock);
	imp_target_unlock(tf);
abort:
	imp_handle_abort(f, h);
	return ret;
}

static long imp_ioc_unmap(struct imp_file *f, void __user *uarg)
{
	struct imp_handle *h, *found = NULL;
	u64 handle;

	if (copy_from_user(&handle, uarg, sizeof(handle)))
		return -EFAULT;
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	mutex_lock(&f->lock);
	list_for_each_entry(h, &f->handles, node) {
		if (h->handle == handle) {
			found = h;
			list_del_init(&h->node);
			f->nh--;
			break;
		}
	}
	mutex_unlock(&f->lock);
	if (!found)
		return -ENOENT;
	imp_handle_end(found);
	return 0;
}

struct imp_xlate_op {
	struct iommu_domain *d;
	struct upcie_iommu_map_pa_translate *req;
};

static int imp_xlate_fn(struct iommu_domain *cur, void *arg)
{
	struct imp_xlate_op *op = arg;

	if (cur != op->d)
		return -EAGAIN; /* changed since it was looked at: nothing is read */
	op->req->phys = iommu_iova_to_phys(cur, op->req->iova);
	op->req->aperture_start = cur->geometry.aperture_start;
	op->req->aperture_end = cur->geometry.aperture_end;
	op->req->pgsize_bitmap = cur->pgsize_bitmap;
	return 0;
}

static long imp_ioc_translate(void __user *uarg)
{
	struct upcie_iommu_map_pa_translate req;
	struct iommu_domain *d;
	struct imp_func *tf;
	struct file *owner = NULL;
	bool readable;
	int ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.reserved[0] || req.reserved[1] || req.owner_fd < -1)
		return -EINVAL;
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	if (req.owner_fd >= 0) {
		owner = fget(req.owner_fd);
		if (!owner)
			return -EBADF;
	}
	tf = imp_func_get(&req.pci);
	if (IS_ERR(tf)) {
		if (owner)
			fput(owner);
		return PTR_ERR(tf);
	}
	ret = imp_target_lock(tf, "TRANSLATE");
	if (ret) {
		imp_func_put(tf);
		if (owner)
			fput(owner);
		return ret;
	}
	mutex_lock(&tf->lock);
	req.domain_type = imp_domain_kind(tf->pdev, &d);
	req.phys = 0;
	req.aperture_start = req.aperture_end = req.pgsize_bitmap = 0;
	/* a user-owned domain lives as long as its owner keeps it: read it only with the owner */
	if (req.domain_type == UPCIE_IOMMU_MAP_PA_DOMAIN_USER)
		readable = owner && !imp_owner_check(tf->pdev, owner);
	else
		readable = d && (d->type & __IOMMU_DOMAIN_PAGING);
	if (readable) {
		struct imp_xlate_op op = { .d = d, .req = &req };

		/* read under the group's lock, only if it is still attached */
		imp_with_group(tf->pdev, imp_xlate_fn, &op);
	}
	mutex_unlock(&tf->lock);
	imp_target_unlock(tf);
	imp_func_put(tf);
	if (owner)
		fput(owner);
	return copy_to_user(uarg, &req, sizeof(req)) ? -EFAULT : 0;
}

static long imp_ioc_info(void __user *uarg)
{
	struct upcie_iommu_map_pa_info info = {
		.abi = UPCIE_IOMMU_MAP_PA_ABI,
		.max_mappings = READ_ONCE(max_mappings),
		.max_map_pages = READ_ONCE(max_map_pages),
		.mappings = atomic64_read(&imp_live),
	};

	return copy_to_user(uarg, &info, sizeof(info)) ? -EFAULT : 0;
}

static long imp_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct imp_file *f = file->private_data;
	void __user *uarg = (void __user *)arg;

	switch (cmd) {
	case UPCIE_IOMMU_MAP_PA_IOC_INFO:
		return imp_ioc_info(uarg);
	case UPCIE_IOMMU_MAP_PA_IOC_MAP:
		return imp_ioc_map(f, uarg);
	case UPCIE_IOMMU_MAP_PA_IOC_UNMAP:
		return imp_ioc_unmap(f, uarg);
	case UPCIE_IOMMU_MAP_PA_IOC_MAP_BAR:
		return imp_ioc_map_bar(f, uarg);
	case UPCIE_IOMMU_MAP_PA_IOC_TRANSLATE:
		return imp_ioc_translate(uarg);
	default:
		return -ENOTTY;
	}
}

static int imp_open(struct inode *inode, struct file *file)
{
	struct imp_file *f;
	int ret;

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	if (!smp_load_acquire(&imp_ready))
		return -ENODEV;
	/* Physical addresses into IOMMU domains: a raw-memory interface. */
	ret = security_locked_down(LOCKDOWN_DEV_MEM);
	if (ret)
		return ret;
	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	mutex_init(&f->lock);
	INIT_LIST_HEAD(&f->handles);
	mutex_lock(&imp_lock);
	list_add(&f->node, &imp_files);
	mutex_unlock(&imp_lock);
	file->private_data = f;
	return nonseekable_open(inode, file);
}

static int imp_release(struct inode *inode, struct file *file)
{
	struct imp_file *f = file->private_data;
	struct imp_handle *h, *tmp;
	LIST_HEAD(handles);

	mutex_lock(&imp_lock);
	list_del(&f->node);
	mutex_unlock(&imp_lock);
	mutex_lock(&f->lock);
	list_splice_init(&f->handles, &handles);
	mutex_unlock(&f->lock);
	/* Newest first, so a shared mapping goes with its last handle. */
	list_for_each_entry_safe_reverse(h, tmp, &handles, node) {
		list_del_init(&h->node);
		imp_handle_end(h);
		cond_resched();
	}
	mutex_destroy(&f->lock);
	kfree(f);
	return 0;
}

/*
 * Readable (EPOLLIN | EPOLLPRI) while a handle of this file was taken down by the module (its
 * function's driver changed or it was removed, or its memory's source did): user space learns
 * of it without a request, then UNMAPs those handles (the only request they still answer).
 */
static __poll_t imp_poll(struct file *file, struct poll_table_struct *wait)
{
	struct imp_file *f = file->private_data;
	struct imp_handle *h;
	__poll_t mask = 0;

	poll_wait(file, &imp_poll_wq, wait);
	mutex_lock(&f->lock);
	list_for_each_entry(h, &f->handles, node) {
		if (READ_ONCE(h->gone)) {
			mask = EPOLLIN | EPOLLRDNORM | EPOLLPRI;
			break;
		}
	}
	mutex_unlock(&f->lock);
	return mask;
}

static const struct file_operations imp_fops = {
	.owner = THIS_MODULE,
	.poll = imp_poll,
	.open = imp_open,
	.release = imp_release,
	.unlocked_ioctl = imp_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice imp_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "iommu_map_pa",
	.fops = &imp_fops,
	.mode = 0600,
};

/* ------------------------------------------------------------------------------------------ */
/* the bus notifier */

/*
 * A function's driver is about to change, or the function goes away: remove the mappings in
 * its domain now, while the domain they were made in is still the one attached (a user domain
 * goes with vfio-pci's binding, whose remove waits for the device files this module holds; a
 * kernel DMA domain was made for the driver that leaves). Mappings of memory of such a function
 * go too (as_source): what its BARs hold, and their addresses, are no longer what was mapped.
 * Handles stay, marked gone, until UNMAP. Called with the function's device_lock held.
 */
static void imp_notify_dev(struct device *dev, const char *why, bool dying, bool unbinding)
{
	struct imp_handle *h, *tmp, **src = NULL;
	struct imp_func *func;
	unsigned int n = 0, i = 0;

	mutex_lock(&imp_lock);
	func = imp_func_find_locked(dev);
	if (func)
		kref_get(&func->ref);
	mutex_unlock(&imp_lock);
	if (!func)
		return;
	mutex_lock(&func->lock);
	if (dying)
		func->dying = true;
	func->unbinding = unbinding;
	list_for_each_entry_safe(h, tmp, &func->handles, tnode) {
		dev_info(dev, "iommu_map_pa: %s; unmapping handle %llu\n", why, h->handle);
		WRITE_ONCE(h->gone, true);
		imp_handle_teardown_locked(h, true);
		cond_resched();
	}
	/* as source: each handle is torn down under its own target's lock */
	list_for_each_entry(h, &func->shandles, snode)
		n++;
	if (n)
		src = kvmalloc_array(n, sizeof(*src), GFP_KERNEL | __GFP_NOFAIL);
	list_for_each_entry(h, &func->shandles, snode) {
		kref_get(&h->ref);
		src[i++] = h;
	}
	mutex_unlock(&func->lock);
	for (i = 0; i < n; i++) {
		h = src[i];
		mutex_lock(&h->tf->lock);
		if (!h->torn)
			dev_info(dev, "iommu_map_pa: memory source %s; unmapping handle %llu\n",
				 why, h->handle);
		WRITE_ONCE(h->gone, true);
		imp_handle_teardown_locked(h, true);
		mutex_unlock(&h->tf->lock);
		mutex_lock(&func->lock);
		list_del_init(&h->snode);
		mutex_unlock(&func->lock);
		kref_put(&h->ref, imp_handle_free);
		cond_resched();
	}
	kvfree(src);
	imp_func_put(func);
}

static int imp_pci_notify(struct notifier_block *nb, unsigned long action, void *data)
{
	struct device *dev = data;
	struct imp_func *func;

	switch (action) {
	case BUS_NOTIFY_BIND_DRIVER:
		imp_notify_dev(dev, "a driver binds", false, false);
		break;
	case BUS_NOTIFY_UNBIND_DRIVER:
		imp_notify_dev(dev, "its driver unbinds", false, true);
		break;
	case BUS_NOTIFY_UNBOUND_DRIVER:
		mutex_lock(&imp_lock);
		func = imp_func_find_locked(dev);
		if (func)
			kref_get(&func->ref);
		mutex_unlock(&imp_lock);
		if (func) {
			mutex_lock(&func->lock);
			func->unbinding = false;
			mutex_unlock(&func->lock);
			imp_func_put(func);
		}
		break;
	case BUS_NOTIFY_DEL_DEVICE:
		imp_notify_dev(dev, "function removed", true, false);
		break;
	case BUS_NOTIFY_REMOVED_DEVICE:
		/*
		 * dying stays set: the pci_dev is gone for good (a rescan makes a new one, with a
		 * record of its own), and a record that still exists must refuse everything.
		 */
		break;
	}
	return NOTIFY_DONE;
}

static struct notifier_block imp_pci_nb = {
	.notifier_call = imp_pci_notify,
};

static int __init imp_init(void)
{
	int ret;

	imp_wq = alloc_workqueue("iommu_map_pa", WQ_UNBOUND, 0);
	if (!imp_wq)
		return -ENOMEM;
	ret = bus_register_notifier(&pci_bus_type, &imp_pci_nb);
	if (ret)
		goto err_wq;
	/* last: the device node appears when everything behind it is ready */
	ret = misc_register(&imp_misc);
	if (ret)
		goto err_nb;
	/* the device lifetime dma-bufs are attached for: dma-direct, all of memory, no limits */
	ret = dma_coerce_mask_and_coherent(imp_misc.this_device, DMA_BIT_MASK(64));
	if (ret) {
		misc_deregister(&imp_misc);
		goto err_nb;
	}
	imp_misc.this_device->dma_parms = &imp_dma_parms;
	smp_store_release(&imp_ready, true);
	pr_info("version %s, ABI %d, /dev/%s\n", IMP_VERSION, UPCIE_IOMMU_MAP_PA_ABI,
		imp_misc.name);
	return 0;

err_nb:
	bus_unregister_notifier(&pci_bus_type, &imp_pci_nb);
err_wq:
	destroy_workqueue(imp_wq);
	return ret;
}

static void __exit imp_exit(void)
{
	misc_deregister(&imp_misc);
	bus_unregister_notifier(&pci_bus_type, &imp_pci_nb);
	/* owner files dropped by the notifier are released by workers: wait for them */
	destroy_workqueue(imp_wq);
	WARN_ON(!list_empty(&imp_funcs) || !list_empty(&imp_doms));
}

module_init(imp_init);
module_exit(imp_exit);

MODULE_LICENSE("GPL");
MODULE_VERSION(IMP_VERSION);
MODULE_DESCRIPTION("Map physical pages into the IOMMU domain of a PCI function");
MODULE_AUTHOR("upcie");
