// SPDX-License-Identifier: GPL-2.0
/*
 * dmabuf_import: import a dma-buf from user space and hand back the device addresses of its
 * backing store (the scatter list), for user-space drivers that program a device with them.
 *
 * Why it exists: the kernel maps a dma-buf for DMA whenever a driver imports one, but offers
 * user space no way to do the same and learn the addresses. upcie needs them to build a LUT for
 * a controller that sees physical addresses (uio_pci_generic) and to map GPU memory into a
 * vfio-owned IOMMU domain (iommu_map_pa). The UAPI and its semantics are in
 * uapi/dmabuf_import.h; this file adds how, and what protects the kernel.
 *
 * Revocation. A device user space drives cannot be asked to stop, so the module only keeps
 * addresses an exporter cannot take back behind its back: the exporter pins the buffer
 * (dma_buf_pin() with a pin op), or never moves it (the static_exporters list), or the
 * attachment is made for a named PCI function, which the module itself stops when the
 * exporter revokes: bus mastering off, read back (a completion cannot pass the function's
 * posted writes), then the mapping is unmapped before the callback returns, which is the
 * bounded-time contract of dma_buf_invalidate_mappings() since 7.1 (vfio-pci waits for that
 * unmap before it disables or resets the BAR). Every later GET of the handle answers ESTALE.
 *
 * Lifetime. Every attachment belongs to the open file that made it (struct dbi_file), never to
 * a process or an fd number; the file's release detaches everything it holds. An open file
 * holds a module reference (misc device fops owner), so the module cannot be unloaded while an
 * attachment exists. A PCI function named as importer (struct dbi_func) is referenced while it
 * has attachments; it must stay fit for it: uio_pci_generic bound to it (a driver that uses
 * the DMA API is what keeps the group's kernel DMA domain from being replaced: unbound, a write
 * of the group's sysfs type frees it with no notification), no driver but uio_pci_generic or
 * pcieport on any other function of its IOMMU group, and the group in a kernel DMA domain. The
 * checks run under the function's device_lock, so no probe or unbind is in flight. A bus
 * notifier tears its attachments down when any function of the group binds another driver,
 * when the function's own driver unbinds (mappings belong to the bound driver: the DMA API's
 * checks count any left as a leak) and when the function is removed (before the IOMMU core
 * releases it); the handles then answer ENODEV. Its DMA mask is raised to 64 bits while it has
 * attachments and restored after the last one (or before another driver probes it).
 *
 * Locking. dbi_lock (global, held briefly: never across a wait, a mapping or a user copy)
 * protects the lists of files and functions, each function's attachment list and in-flight
 * count, and the dying state. A file's mutex protects its handle list. An attachment's mutex
 * serializes its teardown; the dma-buf's reservation lock its mapping state (sgt, pinned,
 * revoked), which the exporter's revocation callback changes. Order: device_lock of a named
 * function, dbi_lock, a file's mutex; an attachment's mutex, then the reservation lock.
 * device_lock is never taken while holding one of this module's locks. Nothing is copied to
 * or from user space under the reservation lock (it nests inside mmap_lock).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/device.h>
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/fs.h>
#include <linux/iommu.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/poll.h>
#include <linux/scatterlist.h>
#include <linux/security.h>
#include <linux/slab.h>
#include <linux/swiotlb.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <linux/wait.h>

#include "uapi/dmabuf_import.h"

#define DBI_VERSION "1.2.0"

/* The namespace argument became a string literal in 6.13. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
MODULE_IMPORT_NS("DMA_BUF");
#else
MODULE_IMPORT_NS(DMA_BUF);
#endif

/*
 * The identity user space checks before it talks to /dev/dmabuf_import: another project ships a
 * module of the same name and device node with another interface. Read-only, and refused as a
 * load argument, so no module can be made to claim another identity.
 */
static int dbi_abi_get(char *buf, const struct kernel_param *kp)
{
	return scnprintf(buf, PAGE_SIZE, "%s %d\n", UPCIE_DMABUF_IMPORT_IDENT,
			 UPCIE_DMABUF_IMPORT_ABI);
}

static int dbi_abi_set(const char *val, const struct kernel_param *kp)
{
	return -EPERM;
}

static const struct kernel_param_ops dbi_abi_ops = {
	.set = dbi_abi_set,
	.get = dbi_abi_get,
};
module_param_cb(abi, &dbi_abi_ops, NULL, 0444);
MODULE_PARM_DESC(abi,
		 "identity and ABI version: \"" UPCIE_DMABUF_IMPORT_IDENT " <n>\" (read-only)");

static unsigned int max_attachments = 4096;
module_param(max_attachments, uint, 0644);
MODULE_PARM_DESC(max_attachments, "attachments one open file may hold (default 4096)");
static unsigned int max_total_attachments = 16384;
module_param(max_total_attachments, uint, 0644);
MODULE_PARM_DESC(max_total_attachments, "attachments all files together may hold (default 16384)");
static unsigned long max_total_mib = 1UL << 20;
module_param(max_total_mib, ulong, 0644);
MODULE_PARM_DESC(max_total_mib, "MiB of dma-bufs all attachments together may pin (default 1 TiB)");
static char static_exporters[256] = "udmabuf,drm,nvidia,nv_dmabuf";
module_param_string(static_exporters, static_exporters, sizeof(static_exporters), 0444);
MODULE_PARM_DESC(static_exporters,
		 "exporters (dma-buf exp_name) without a pin op whose buffers never move or get "
		 "revoked, comma separated (default udmabuf,drm,nvidia,nv_dmabuf)");
#ifdef UPCIE_KMOD_TEST
/* The negative control of the revocation test: the rule removed, the test must see it. */
static bool test_ignore_revocation;
module_param(test_ignore_revocation, bool, 0644);
MODULE_PARM_DESC(test_ignore_revocation, "test builds only: do not stop or unmap on revocation");
#define dbi_ignore_revocation() READ_ONCE(test_ignore_revocation)
/* The negative control of the stop before a teardown: the function is left mastering. */
static bool test_no_stop;
module_param(test_no_stop, bool, 0644);
MODULE_PARM_DESC(test_no_stop, "test builds only: do not stop a function before its teardown");
#define dbi_no_stop() READ_ONCE(test_no_stop)
#else
#define dbi_ignore_revocation() false
#define dbi_no_stop()		false
#endif

struct dbi_file {
	struct mutex lock;
	struct list_head atts; /* struct dbi_att, published ones, by handle */
	struct list_head node; /* in dbi_files */
	u64 next_handle;
	unsigned int natt; /* published and being made */
};

/* A PCI function named as importer. */
struct dbi_func {
	struct kref ref;
	struct list_head node; /* in dbi_funcs (dbi_lock) */
	struct list_head atts; /* its attachments (dbi_lock) */
	struct pci_dev *pdev;
	struct iommu_group *group; /* NULL: no IOMMU */
	unsigned int busy;	   /* attachments being set up (dbi_lock) */
	bool dying;		   /* between DEL_DEVICE and REMOVED_DEVICE (dbi_lock) */
	/* device_lock of pdev: */
	unsigned int mask_users;
	u64 old_mask, old_coherent;
	unsigned int old_max_seg;
	unsigned long old_boundary;
};

struct dbi_att {
	struct kref ref;
	struct list_head node;	/* in its file's list (file lock) */
	struct list_head fnode; /* in its function's list (dbi_lock) */
	u64 handle;
	struct dma_buf *dmabuf;
	struct dbi_func *func; /* NULL: the module's own device */
	struct mutex lock;     /* teardown */
	struct dma_buf_attachment *attach;
	bool torn; /* attach unmapped and detached (lock) */
	/* the reservation lock: */
	struct sg_table *sgt;
	bool pinned;
	bool revoked;
	/* set before the handle exists, then unchanged: */
	struct upcie_dmabuf_import_seg *segs;
	u32 nsegs;
	bool counted;  /* in dbi_bytes */
	bool gone;     /* the function went away or was rebound (dbi_lock; READ_ONCE) */
	bool mask_ref; /* holds a DMA-mask reference of func (device_lock) */
};

static DEFINE_MUTEX(dbi_lock);
static LIST_HEAD(dbi_files);
static LIST_HEAD(dbi_funcs);
static DECLARE_WAIT_QUEUE_HEAD(dbi_wq); /* a function's busy count reached 0 */
static u64 dbi_bind_gen;		/* driver bindings seen (dbi_lock) */
static bool dbi_ready;			/* set once the module is complete */
static atomic64_t dbi_live = ATOMIC64_INIT(0);
static atomic64_t dbi_bytes = ATOMIC64_INIT(0);
static struct miscdevice dbi_misc;
/* an attachment was revoked or taken down: files' poll() looks again */
static DECLARE_WAIT_QUEUE_HEAD(dbi_poll_wq);
/* The own device: dma-direct, no IOMMU, no segment limits (see dbi_mask_get()). */
static struct device_dma_parameters dbi_dma_parms = {
	.max_segment_size = UINT_MAX,
	.segment_boundary_mask = ULONG_MAX,
};

/* ------------------------------------------------------------------------------------------ */
/* exporters */

static bool dbi_exporter_static(const struct dma_buf *dmabuf)
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

/* ------------------------------------------------------------------------------------------ */
/* functions */

static void dbi_func_release(struct kref *ref) __releases(&dbi_lock)
{
	struct dbi_func *func = container_of(ref, struct dbi_func, ref);

	list_del(&func->node);
	mutex_unlock(&dbi_lock);
	iommu_group_put(func->group);
	pci_dev_put(func->pdev);
	kfree(func);
}

static void dbi_func_put(struct dbi_func *func)
{
	if (func)
		kref_put_mutex(&func->ref, dbi_func_release, &dbi_lock);
}

static struct dbi_func *dbi_func_find_locked(struct device *dev)
{
	struct dbi_func *func;

	lockdep_assert_held(&dbi_lock);
	list_for_each_entry(func, &dbi_funcs, node)
		if (&func->pdev->dev == dev)
			return func;
	return NULL;
}

/* Find or make the record of pdev, with a reference. dbi_lock held; pdev's reference is taken. */
static struct dbi_func *dbi_func_get_locked(struct pci_dev *pdev)
{
	struct dbi_func *func;

	lockdep_assert_held(&dbi_lock);
	func = dbi_func_find_locked(&pdev->dev);
	if (func) {
		kref_get(&func->ref);
		return func;
	}
	func = kzalloc(sizeof(*func), GFP_KERNEL);
	if (!func)
		return NULL;
	kref_init(&func->ref);
	INIT_LIST_HEAD(&func->atts);
	func->pdev = pci_dev_get(pdev);
	func->group = iommu_group_get(&pdev->dev);
	list_add(&func->node, &dbi_funcs);
	return func;
}

/*
 * The DMA mask, raised to 64 bits while a function has attachments, and its segment limits
 * lifted: a device user space programs has none the kernel knows of (an NVMe takes PRP lists
 * and SGLs of any length), and exporters build their scatter lists without asking the importer
 * (the PCI core's default of 64 KiB segments would make the DMA API's checks object to every
 * large buffer). device_lock held.
 */
static int dbi_mask_get(struct dbi_func *func, struct dbi_att *att)
{
	struct device *dev = &func->pdev->dev;
	int ret = 0;

	device_lock_assert(dev);
	if (!func->mask_users) {
		func->old_mask = dma_get_mask(dev);
		func->old_coherent = dev->coherent_dma_mask;
		if (func->old_mask != DMA_BIT_MASK(64) || func->old_coherent != DMA_BIT_MASK(64))
			ret = dma_set_mask_and_coherent(dev, DMA_BIT_MASK(64));
		if (ret)
			return ret;
		if (dev->dma_parms) {
			func->old_max_seg = dev->dma_parms->max_segment_size;
			func->old_boundary = dev->dma_parms->segment_boundary_mask;
			dev->dma_parms->max_segment_size = UINT_MAX;
			dev->dma_parms->segment_boundary_mask = ULONG_MAX;
		}
	}
	func->mask_users++;
	att->mask_ref = true;
	return 0;
}

static void dbi_mask_restore(struct dbi_func *func)
{
	struct device *dev = &func->pdev->dev;

	device_lock_assert(dev);
	if (dma_get_mask(dev) != func->old_mask)
		dma_set_mask(dev, func->old_mask);
	if (dev->coherent_dma_mask != func->old_coherent)
		dma_set_coherent_mask(dev, func->old_coherent);
	if (dev->dma_parms) {
		dev->dma_parms->max_segment_size = func->old_max_seg;
		dev->dma_parms->segment_boundary_mask = func->old_boundary;
	}
}

static void dbi_mask_put(struct dbi_att *att)
{
	struct dbi_func *func = att->func;

	if (!func || !READ_ONCE(att->mask_ref))
		return;
	device_lock(&func->pdev->dev);
	if (att->mask_ref) {
		att->mask_ref = false;
		if (!--func->mask_users)
			dbi_mask_restore(func);
	}
	device_unlock(&func->pdev->dev);
}

/*
 * Is the function fully added and not being removed? PCI_DEV_ADDED (drivers/pci/pci.h: bit 0 of
 * priv_flags from 6.1 through 7.x) is set by pci_bus_add_device() after the IOMMU probe and DMA
 * setup that device_add() triggers, and cleared first thing by pci_stop_dev(). Before it the
 * function is already visible to pci_get_domain_bus_and_slot() but may still use dma-direct:
 * a mapping made then would later be unmapped through the IOMMU.
 */
static bool dbi_pci_added(const struct pci_dev *pdev)
{
	return test_bit(0, &pdev->priv_flags);
}

/*
 * May this driver be bound to a function named as importer? Only uio_pci_generic: a driver
 * that uses the kernel's DMA API (not driver_managed_dma) holds the group's default domain for
 * as long as it is bound (the driver core's iommu_device_use_default_domain(): the group's
 * owner count, which refuses a write of /sys/kernel/iommu_groups/N/type), and its unbinding is
 * seen by the bus notifier. An unbound function has no such anchor: the type write frees its
 * domain under the attachment, with no notification.
 */
static bool dbi_driver_ok(const struct device_driver *drv)
{
	return drv && !strcmp(drv->name, "uio_pci_generic");
}

/* ... or to another function of its IOMMU group (unbound; pcieport does no DMA of its own)? */
static bool dbi_sibling_driver_ok(const struct device_driver *drv)
{
	return !drv || dbi_driver_ok(drv) || !strcmp(drv->name, "pcieport");
}

/*
 * May the group of `dev` serve as importer? Every other function in it has no driver, or
 * uio_pci_generic, or is a PCIe port (pcieport does no DMA): any other kernel driver shares
 * the domain the attachment maps into, and a driver that hands DMA to user space (vfio-pci)
 * owns it. Called from iommu_group_for_each_dev() (group mutex held: no device_lock here, so
 * the driver pointer is read once; a binding that races is seen by the bus notifier).
 */
static int dbi_sibling_ok(struct device *d, void *data)
{
	const struct device_driver *drv = READ_ONCE(d->driver);

	if (d == data || dbi_sibling_driver_ok(drv))
		return 0;
	dev_info_ratelimited(d, "dmabuf_import: %s shares the IOMMU group (driver %s); refused\n",
			     dev_name(data), drv->name);
	return -EBUSY;
}

/* The group's state: siblings and domain type. */
static int dbi_group_ok(struct pci_dev *pdev, struct iommu_group *group)
{
	struct iommu_domain *dom;
	int ret;

	if (!group)
		return 0;
	ret = iommu_group_for_each_dev(group, &pdev->dev, dbi_sibling_ok);
	if (ret)
		return ret;
	dom = iommu_get_domain_for_dev(&pdev->dev);
	if (dom && dom->type != IOMMU_DOMAIN_DMA && dom->type != IOMMU_DOMAIN_DMA_FQ &&
	    dom->type != IOMMU_DOMAIN_IDENTITY) {
		pci_info_ratelimited(
		    pdev, "dmabuf_import: not in a kernel DMA domain (type %#x); refused\n",
		    dom->type);
		return -EBUSY;
	}
	return 0;
}

/*
 * Register `att` as being set up for the named function: checks (driver, group, domain),
 * the DMA mask, and the function's records, so that the bus notifier sees it from here on.
 */
static int dbi_func_begin(struct dbi_att *att, const struct upcie_dmabuf_import_pci *p)
{
	struct dbi_func *func = NULL;
	struct iommu_group *group;
	struct pci_dev *pdev;
	const struct device_driver *drv;
	u64 gen;
	int ret;

	if (p->reserved)
		return -EINVAL;
	pdev = pci_get_domain_bus_and_slot(p->segment, p->bus, p->devfn);
	if (!pdev)
		return -ENODEV;
	group = iommu_group_get(&pdev->dev);
	device_lock(&pdev->dev);
	drv = pdev->dev.driver;
	if (!dbi_pci_added(pdev)) {
		ret = -ENODEV; /* being added or removed */
		goto out;
	}
	if (!drv) {
		pci_info_ratelimited(pdev, "dmabuf_import: no driver bound (bind uio_pci_generic: "
					   "nothing else keeps its DMA domain); refused\n");
		ret = -ENODEV;
		goto out;
	}
	if (!dbi_driver_ok(drv)) {
		pci_info_ratelimited(pdev, "dmabuf_import: %s %s; refused\n",
				     to_pci_driver(pdev->dev.driver)->driver_managed_dma
					 ? "hands DMA to user space:"
					 : "bound to kernel driver",
				     drv->name);
		ret = -EBUSY;
		goto out;
	}
	mutex_lock(&dbi_lock);
	do {
		/* a driver that binds after the look below is seen by the notifier */
		gen = dbi_bind_gen;
		mutex_unlock(&dbi_lock);
		ret = dbi_group_ok(pdev, group);
		mutex_lock(&dbi_lock);
	} while (!ret && gen != dbi_bind_gen);
	if (!ret) {
		func = dbi_func_get_locked(pdev);
		if (!func)
			ret = -ENOMEM;
		else if (func->dying || func->group != group)
			ret = -ENODEV; /* being removed, or moved to another group */
	}
	if (!ret) {
		ret = dbi_mask_get(func, att);
		if (ret)
			pci_info_ratelimited(
			    pdev, "dmabuf_import: cannot set a 64-bit DMA mask (%d)\n", ret);
	}
	if (!ret) {
		att->func = func;
		list_add_tail(&att->fnode, &func->atts);
		WRITE_ONCE(func->busy, func->busy + 1);
		func = NULL;
	}
	mutex_unlock(&dbi_lock);
	dbi_func_put(func);
out:
	device_unlock(&pdev->dev);
	iommu_group_put(group);
	pci_dev_put(pdev);
	return ret;
}

static void dbi_func_setup_done(struct dbi_att *att)
{
	if (!att->func)
		return;
	mutex_lock(&dbi_lock);
	WRITE_ONCE(att->func->busy, att->func->busy - 1);
	mutex_unlock(&dbi_lock);
	wake_up_all(&dbi_wq);
}

/* ------------------------------------------------------------------------------------------ */
/* attachments */

/*
 * Stop `pdev` mastering the bus before the addresses it was given go away: clear Bus Master
 * Enable, then read the command register back. The read is a non-posted request on the path of
 * the function's own posted writes upstream, which PCIe ordering does not let it pass, so by its
 * completion every write the function issued before the clear has reached the root complex (and
 * memory behind it). Not covered: writes the function routed peer to peer through a switch below
 * the root port to another device (they leave through another port of the switch, off the path of
 * the completion); the peer's own ordering (a read of that peer's BAR through the same switch)
 * flushes those. The module's users map host memory or a GPU's BAR seen through the root complex.
 */
static void dbi_stop(struct pci_dev *pdev, const char *why)
{
	u16 cmd;

	if (dbi_no_stop()) {
		pci_warn(pdev, "test: not stopped before a teardown (%s)\n", why);
		return;
	}
	pci_clear_master(pdev);
	pci_read_config_word(pdev, PCI_COMMAND, &cmd);
	if (cmd & PCI_COMMAND_MASTER)
		dev_warn_ratelimited(&pdev->dev,
				     "dmabuf_import: bus mastering still on after clearing it\n");
	else
		pci_info_ratelimited(pdev, "dmabuf_import: bus mastering off (%s)\n", why);
}

/*
 * The exporter moves or revokes the buffer (the reservation lock is held). Before the mapping
 * exists (an early move during ATTACH) there is nothing to do: the mapping made afterwards is
 * the new one. With a mapping, a pinned buffer is never moved, so this is a revocation: the
 * function the attachment was made for stops mastering the bus, the mapping goes, and the
 * handle answers ESTALE from now on. The module's own device stands for no function it could
 * stop: such attachments are refused for exporters that might do this (see dbi_ioc_attach), so
 * here it can only be logged.
 */
static void dbi_invalidate(struct dma_buf_attachment *attach)
{
	struct dbi_att *att = attach->importer_priv;
	struct pci_dev *pdev = att->func ? att->func->pdev : NULL;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (!att->sgt || att->revoked)
		return;
	WRITE_ONCE(att->revoked, true);
	wake_up_all(&dbi_poll_wq);
	if (dbi_ignore_revocation()) {
		pr_warn("test: revocation of %s buffer ignored\n", attach->dmabuf->exp_name);
		return;
	}
	if (!pdev) {
		pr_err("exporter %s revoked a buffer attached for the module's device; the device "
		       "using it cannot be stopped by this module\n",
		       attach->dmabuf->exp_name);
		return;
	}
	dbi_stop(pdev, "revocation");
	dma_buf_unmap_attachment(attach, att->sgt, DMA_BIDIRECTIONAL);
	att->sgt = NULL;
	if (att->pinned) {
		dma_buf_unpin(attach);
		att->pinned = false;
	}
	pci_warn(pdev,
		 "dmabuf_import: exporter %s revoked the buffer of a handle: bus mastering off, "
		 "mapping removed\n",
		 attach->dmabuf->exp_name);
}

#ifdef UPCIE_KMOD_HAVE_INVALIDATE_MAPPINGS
/*
 * 7.1+: the callback is optional and declares that the importer unmaps in bounded time. Only
 * attachments made for a named function can keep that promise.
 */
static const struct dma_buf_attach_ops dbi_ops_revocable = {
	.allow_peer2peer = true,
	.invalidate_mappings = dbi_invalidate,
};
static const struct dma_buf_attach_ops dbi_ops_device = {
	.allow_peer2peer = true,
};
#else
/* Up to 7.0 the callback is mandatory for a dynamic importer. */
static const struct dma_buf_attach_ops dbi_ops_revocable = {
	.allow_peer2peer = true,
	.move_notify = dbi_invalidate,
};
#define dbi_ops_device dbi_ops_revocable
#endif

/* Unmap, unpin and detach, once; the references stay until the attachment is freed. */
static void dbi_att_teardown(struct dbi_att *att)
{
	mutex_lock(&att->lock);
	if (att->torn || !att->attach) {
		att->torn = true;
		mutex_unlock(&att->lock);
		return;
	}
	dma_resv_lock(att->dmabuf->resv, NULL);
	if (att->sgt) {
		dma_buf_unmap_attachment(att->attach, att->sgt, DMA_BIDIRECTIONAL);
		att->sgt = NULL;
	}
	if (att->pinned) {
		dma_buf_unpin(att->attach);
		att->pinned = false;
	}
	dma_resv_unlock(att->dmabuf->resv);
	dma_buf_detach(att->dmabuf, att->attach);
	att->attach = NULL;
	att->torn = true;
	mutex_unlock(&att->lock);
}

static void dbi_att_free(struct kref *ref)
{
	struct dbi_att *att = container_of(ref, struct dbi_att, ref);

	kvfree(att->segs);
	if (att->dmabuf)
		dma_buf_put(att->dmabuf);
	dbi_func_put(att->func);
	mutex_destroy(&att->lock);
	kfree(att);
}

/* End an attachment its file no longer lists: teardown, DMA mask, limits, reference. */
static void dbi_att_end(struct dbi_att *att)
{
	if (att->func) {
		mutex_lock(&dbi_lock);
		list_del_init(&att->fnode);
		mutex_unlock(&dbi_lock);
	}
	dbi_att_teardown(att);
	dbi_mask_put(att);
	if (att->counted)
		atomic64_sub(att->dmabuf->size, &dbi_bytes);
	atomic64_dec(&dbi_live);
	kref_put(&att->ref, dbi_att_free);
}

/* Copy segments [first, first + cap) to user memory; 0 or -EFAULT. No lock held. */
static int dbi_copy_segs(const struct dbi_att *att, u32 first, u32 cap, u64 uptr)
{
	u32 n = min_t(u32, cap, att->nsegs - first);

	if (!n)
		return 0;
	return copy_to_user(u64_to_user_ptr(uptr), att->segs + first,
			    (size_t)n * sizeof(*att->segs))
		   ? -EFAULT
		   : 0;
}

/* Attach, pin (where the exporter can), map, and keep a copy of the scatter list. */
static int dbi_att_setup(struct dbi_att *att, struct device *dev)
{
	const struct dma_buf_attach_ops *ops = att->func ? &dbi_ops_revocable : &dbi_ops_device;
	struct dma_buf *dmabuf = att->dmabuf;
	struct dma_buf_attachment *attach;
	struct sg_table *sgt;
	struct scatterlist *sg;
	unsigned int i;
	u64 total = 0;
	int ret;

	attach = dma_buf_dynamic_attach(dmabuf, dev, ops, att);
	if (IS_ERR(attach))
		return PTR_ERR(attach);
	mutex_lock(&att->lock);
	att->attach = attach;
	mutex_unlock(&att->lock);
	/*
	 * A dynamic importer pins and maps under the reservation lock on every kernel from 6.1 on
	 * (dma_buf_map_attachment_unlocked, which 6.2 added, is the same with the lock inside).
	 */
	ret = dma_resv_lock_interruptible(dmabuf->resv, NULL);
	if (ret)
		return ret;
	if (dmabuf->ops->pin) {
		ret = dma_buf_pin(attach);
		if (ret == -EOPNOTSUPP && att->func) {
			/*
			 * A pin op that cannot pin (vfio-pci's BAR dma-bufs had one answering
			 * EOPNOTSUPP before 7.1) is no pin: such a buffer may be revoked, which the
			 * named function's attachment is made for (it is stopped then).
			 */
			ret = 0;
		} else if (ret) {
			goto unlock;
		} else {
			att->pinned = true;
		}
	}
	sgt = dma_buf_map_attachment(attach, DMA_BIDIRECTIONAL);
	if (IS_ERR(sgt)) {
		ret = PTR_ERR(sgt);
		goto unlock;
	}
	att->sgt = sgt;
	/* allocation is allowed here: the reservation lock nests outside fs_reclaim */
	att->segs =
	    kvmalloc_array(max_t(unsigned int, sgt->nents, 1), sizeof(*att->segs), GFP_KERNEL);
	if (!att->segs) {
		ret = -ENOMEM;
		goto unlock;
	}
	for_each_sgtable_dma_sg(sgt, sg, i) {
		att->segs[i].addr = sg_dma_address(sg);
		att->segs[i].len = sg_dma_len(sg);
		total += sg_dma_len(sg);
	}
	att->nsegs = sgt->nents;
unlock:
	dma_resv_unlock(dmabuf->resv);
	if (!ret && total != dmabuf->size)
		pr_info_ratelimited("exporter %s: scatter list covers %llu of %zu bytes\n",
				    dmabuf->exp_name, total, dmabuf->size);
	return ret;
}

static struct dbi_att *dbi_find_locked(struct dbi_file *f, u64 handle)
{
	struct dbi_att *att;

	lockdep_assert_held(&f->lock);
	list_for_each_entry(att, &f->atts, node)
		if (att->handle == handle)
			return att;
	return NULL;
}

static long dbi_ioc_attach(struct dbi_file *f, void __user *uarg)
{
	struct upcie_dmabuf_import_attach req;
	struct dbi_att *att;
	struct device *dev;
	u64 limit;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if ((req.flags & ~UPCIE_DMABUF_IMPORT_F_PCI) || req.reserved[0] || req.reserved[1] ||
	    (req.cap && !req.segs))
		return -EINVAL;
	if (!(req.flags & UPCIE_DMABUF_IMPORT_F_PCI) &&
	    (req.pci.segment || req.pci.bus || req.pci.devfn || req.pci.reserved))
		return -EINVAL;
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;

	mutex_lock(&f->lock);
	if (f->natt >= READ_ONCE(max_attachments)) {
		mutex_unlock(&f->lock);
		return -EMFILE;
	}
	f->natt++; /* a slot for this attachment; given back by dbi_att_end or below */
	mutex_unlock(&f->lock);
	/* dbi_att_end() gives it back */
	if (atomic64_inc_return(&dbi_live) > READ_ONCE(max_total_attachments)) {
		atomic64_dec(&dbi_live);
		pr_info_ratelimited("max_total_attachments (%u) reached\n", max_total_attachments);
		ret = -ENFILE;
		goto out_slot;
	}

	att = kzalloc(sizeof(*att), GFP_KERNEL);
	if (!att) {
		atomic64_dec(&dbi_live);
		ret = -ENOMEM;
		goto out_slot;
	}
	kref_init(&att->ref);
	mutex_init(&att->lock);
	INIT_LIST_HEAD(&att->node);
	INIT_LIST_HEAD(&att->fnode);
	att->dmabuf = dma_buf_get(req.dmabuf_fd);
	if (IS_ERR(att->dmabuf)) {
		ret = PTR_ERR(att->dmabuf);
		att->dmabuf = NULL;
		goto fail;
	}
	limit = (u64)READ_ONCE(max_total_mib) << 20;
	if (atomic64_add_return(att->dmabuf->size, &dbi_bytes) > limit) {
		atomic64_sub(att->dmabuf->size, &dbi_bytes);
		pr_info_ratelimited("max_total_mib (%lu) reached\n", max_total_mib);
		ret = -EDQUOT;
		goto fail;
	}
	att->counted = true;
	/*
	 * A buffer without a pin op may move or be revoked at the exporter's will. Addresses of
	 * such a buffer are only handed out when the module can stop their user: the named
	 * function. Exporters known never to move are the exception.
	 */
	if (!att->dmabuf->ops->pin && !(req.flags & UPCIE_DMABUF_IMPORT_F_PCI) &&
	    !dbi_exporter_static(att->dmabuf)) {
		pr_info_ratelimited(
		    "exporter %s cannot pin its buffers and may revoke them: attach for the PCI "
		    "function that uses them (F_PCI), or list it in static_exporters if it never "
		    "moves or revokes a buffer\n",
		    att->dmabuf->exp_name ?: "?");
		ret = -EOPNOTSUPP;
		goto fail;
	}
	if (req.flags & UPCIE_DMABUF_IMPORT_F_PCI) {
		ret = dbi_func_begin(att, &req.pci);
		if (ret)
			goto fail;
		dev = &att->func->pdev->dev;
	} else {
		dev = dbi_misc.this_device;
	}
	if (is_swiotlb_force_bounce(dev)) {
		/* The device's writes would land in a bounce buffer, not in the dma-buf. */
		ret = -EOPNOTSUPP;
	} else {
		ret = dbi_att_setup(att, dev);
	}
	dbi_func_setup_done(att);
	if (ret)
		goto fail;
	/* What the exporter did to place the memory (a clear, a move) must finish first. */
	ret = dma_resv_wait_timeout(att->dmabuf->resv, DMA_RESV_USAGE_KERNEL, true,
				    MAX_SCHEDULE_TIMEOUT);
	if (ret < 0)
		goto fail;
	if (READ_ONCE(att->gone) || READ_ONCE(att->revoked)) {
		ret = -ENODEV;
		goto fail;
	}
	ret = dbi_copy_segs(att, 0, req.cap, req.segs);
	if (ret)
		goto fail;
	mutex_lock(&f->lock);
	att->handle = ++f->next_handle;
	mutex_unlock(&f->lock);
	req.handle = att->handle;
	req.nsegs = att->nsegs;
	req.size = att->dmabuf->size;
	if (copy_to_user(uarg, &req, sizeof(req))) {
		ret = -EFAULT; /* the handle number is burnt: handles are never reused */
		goto fail;
	}
	mutex_lock(&f->lock);
	list_add_tail(&att->node, &f->atts);
	mutex_unlock(&f->lock);
	return 0;

fail:
	dbi_att_end(att);
out_slot:
	mutex_lock(&f->lock);
	f->natt--;
	mutex_unlock(&f->lock);
	return ret;
}

static long dbi_ioc_get(struct dbi_file *f, void __user *uarg)
{
	struct upcie_dmabuf_import_get req;
	struct dbi_att *att;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.reserved || (req.cap && !req.segs))
		return -EINVAL;
	mutex_lock(&f->lock);
	att = dbi_find_locked(f, req.handle);
	if (att)
		kref_get(&att->ref);
	mutex_unlock(&f->lock);
	if (!att)
		return -ENOENT;
	if (READ_ONCE(att->gone)) {
		ret = -ENODEV;
	} else if (READ_ONCE(att->revoked)) {
		ret = -ESTALE;
	} else if (req.first > att->nsegs) {
		ret = -EINVAL;
	} else {
		req.nsegs = att->nsegs;
		ret = dbi_copy_segs(att, req.first, req.cap, req.segs);
		if (!ret && copy_to_user(uarg, &req, sizeof(req)))
			ret = -EFAULT;
	}
	kref_put(&att->ref, dbi_att_free);
	return ret;
}

static long dbi_ioc_detach(struct dbi_file *f, void __user *uarg)
{
	struct dbi_att *att;
	u64 handle;

	if (copy_from_user(&handle, uarg, sizeof(handle)))
		return -EFAULT;
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	mutex_lock(&f->lock);
	att = dbi_find_locked(f, handle);
	if (att) {
		list_del_init(&att->node);
		f->natt--;
	}
	mutex_unlock(&f->lock);
	if (!att)
		return -ENOENT;
	dbi_att_end(att);
	return 0;
}

static long dbi_ioc_info(void __user *uarg)
{
	struct upcie_dmabuf_import_info info = {
		.abi = UPCIE_DMABUF_IMPORT_ABI,
		.max_attachments = READ_ONCE(max_attachments),
		.attachments = atomic64_read(&dbi_live),
	};

	return copy_to_user(uarg, &info, sizeof(info)) ? -EFAULT : 0;
}

static long dbi_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct dbi_file *f = file->private_data;
	void __user *uarg = (void __user *)arg;

	switch (cmd) {
	case UPCIE_DMABUF_IMPORT_IOC_INFO:
		return dbi_ioc_info(uarg);
	case UPCIE_DMABUF_IMPORT_IOC_ATTACH:
		return dbi_ioc_attach(f, uarg);
	case UPCIE_DMABUF_IMPORT_IOC_GET:
		return dbi_ioc_get(f, uarg);
	case UPCIE_DMABUF_IMPORT_IOC_DETACH:
		return dbi_ioc_detach(f, uarg);
	default:
		return -ENOTTY;
	}
}

static int dbi_open(struct inode *inode, struct file *file)
{
	struct dbi_file *f;
	int ret;

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	if (!smp_load_acquire(&dbi_ready))
		return -ENODEV;
	/* Device addresses of memory, for devices user space drives: a raw-memory interface. */
	ret = security_locked_down(LOCKDOWN_DEV_MEM);
	if (ret)
		return ret;
	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	mutex_init(&f->lock);
	INIT_LIST_HEAD(&f->atts);
	mutex_lock(&dbi_lock);
	list_add(&f->node, &dbi_files);
	mutex_unlock(&dbi_lock);
	file->private_data = f;
	return nonseekable_open(inode, file);
}

static int dbi_release(struct inode *inode, struct file *file)
{
	struct dbi_file *f = file->private_data;
	struct dbi_att *att, *tmp;
	LIST_HEAD(atts);

	mutex_lock(&dbi_lock);
	list_del(&f->node);
	mutex_unlock(&dbi_lock);
	mutex_lock(&f->lock);
	list_splice_init(&f->atts, &atts);
	mutex_unlock(&f->lock);
	/*
	 * The file goes (its process closed it or died) with attachments live: the functions they
	 * were made for stop first, since nothing tells whether they still use the memory. (DETACH is
	 * the caller saying that the device is done with it.)
	 */
	list_for_each_entry(att, &atts, node) {
		struct dbi_att *prev;
		bool seen = false;

		if (!att->func || READ_ONCE(att->torn))
			continue;
		list_for_each_entry(prev, &atts, node) {
			if (prev == att)
				break;
			if (prev->func == att->func && !READ_ONCE(prev->torn)) {
				seen = true;
				break;
			}
		}
		if (!seen)
			dbi_stop(att->func->pdev, "its file closed with attachments live");
	}
	list_for_each_entry_safe(att, tmp, &atts, node) {
		list_del_init(&att->node);
		dbi_att_end(att);
		cond_resched();
	}
	mutex_destroy(&f->lock);
	kfree(f);
	return 0;
}

/*
 * Readable (EPOLLIN | EPOLLPRI) while an attachment of this file was revoked by its exporter
 * (GET: ESTALE) or taken down by the module (GET: ENODEV): user space learns of it without a
 * request, and DETACHes those handles.
 */
static __poll_t dbi_poll(struct file *file, struct poll_table_struct *wait)
{
	struct dbi_file *f = file->private_data;
	struct dbi_att *att;
	__poll_t mask = 0;

	poll_wait(file, &dbi_poll_wq, wait);
	mutex_lock(&f->lock);
	list_for_each_entry(att, &f->atts, node) {
		if (READ_ONCE(att->gone) || READ_ONCE(att->revoked)) {
			mask = EPOLLIN | EPOLLRDNORM | EPOLLPRI;
			break;
		}
	}
	mutex_unlock(&f->lock);
	return mask;
}

static const struct file_operations dbi_fops = {
	.owner = THIS_MODULE,
	.poll = dbi_poll,
	.open = dbi_open,
	.release = dbi_release,
	.unlocked_ioctl = dbi_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice dbi_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "dmabuf_import",
	.fops = &dbi_fops,
	.mode = 0600,
};

/* ------------------------------------------------------------------------------------------ */
/* the bus notifier */

/*
 * Tear down every attachment of `func`, after waiting for those being set up (bounded: the
 * exporter's attach, pin and map). The handles stay, answering ENODEV, until DETACH.
 * restore_mask: the function's own driver is changing (its device_lock is held by the caller).
 */
static void dbi_func_teardown(struct dbi_func *func, const char *why, bool restore_mask)
{
	struct dbi_att *att, **atts = NULL;
	unsigned int n = 0, i;

	if (restore_mask)
		device_lock_assert(&func->pdev->dev);
	/* busy changes under dbi_lock; no sleeping lock in a wait condition */
	wait_event(dbi_wq, !READ_ONCE(func->busy));
	mutex_lock(&dbi_lock);
	list_for_each_entry(att, &func->atts, fnode)
		n++;
	if (n)
		atts = kvmalloc_array(n, sizeof(*atts), GFP_KERNEL | __GFP_NOFAIL);
	i = 0;
	/* the gone ones too: they may still hold a DMA-mask reference */
	list_for_each_entry(att, &func->atts, fnode) {
		kref_get(&att->ref);
		atts[i++] = att;
	}
	mutex_unlock(&dbi_lock);
	/*
	 * The function stops before any of its addresses goes: the next driver of it or of a
	 * sibling gets this domain's IOVAs (or, without an IOMMU, the memory goes back to its
	 * exporter), and user space that drove it through uio does not know yet.
	 */
	for (i = 0; i < n; i++) {
		if (!READ_ONCE(atts[i]->torn)) {
			dbi_stop(func->pdev, why);
			break;
		}
	}
	for (i = 0; i < n; i++) {
		if (!READ_ONCE(atts[i]->gone))
			pci_info(func->pdev, "dmabuf_import: %s; detaching handle %llu\n", why,
				 atts[i]->handle);
		WRITE_ONCE(atts[i]->gone, true);
		dbi_att_teardown(atts[i]);
		if (restore_mask && atts[i]->mask_ref) {
			atts[i]->mask_ref = false;
			if (!--func->mask_users)
				dbi_mask_restore(func);
		}
		kref_put(&atts[i]->ref, dbi_att_free);
		cond_resched();
	}
	kvfree(atts);
	if (n)
		wake_up_all(&dbi_poll_wq);
}

/* A driver binds to `dev`: attachments of its IOMMU group end unless it is uio_pci_generic. */
static void dbi_notify_bind(struct device *dev)
{
	struct iommu_group *group = iommu_group_get(dev);
	struct dbi_func *func, **funcs = NULL;
	unsigned int n = 0, i = 0;

	mutex_lock(&dbi_lock);
	dbi_bind_gen++;
	if (dbi_driver_ok(dev->driver)) {
		mutex_unlock(&dbi_lock);
		iommu_group_put(group);
		return;
	}
	/* a sibling's pcieport is harmless, but never for the function itself */
	list_for_each_entry(func, &dbi_funcs, node)
		n += &func->pdev->dev == dev ||
		     (group && func->group == group && !dbi_sibling_driver_ok(dev->driver));
	if (n)
		funcs = kvmalloc_array(n, sizeof(*funcs), GFP_KERNEL | __GFP_NOFAIL);
	list_for_each_entry(func, &dbi_funcs, node) {
		if (&func->pdev->dev == dev ||
		    (group && func->group == group && !dbi_sibling_driver_ok(dev->driver))) {
			kref_get(&func->ref);
			funcs[i++] = func;
		}
	}
	mutex_unlock(&dbi_lock);
	for (i = 0; i < n; i++) {
		dbi_func_teardown(funcs[i],
				  &funcs[i]->pdev->dev == dev ? "driver bound to it"
							      : "driver bound in its IOMMU group",
				  &funcs[i]->pdev->dev == dev);
		dbi_func_put(funcs[i]);
	}
	kvfree(funcs);
	iommu_group_put(group);
}

/*
 * The function's own driver (uio_pci_generic) is leaving: its attachments end now, while the
 * driver is still bound. A mapping made for a device belongs to the driver bound to it; the DMA
 * API's checks report any left at BUS_NOTIFY_UNBOUND_DRIVER as a leak, and the user-space driver
 * that programmed the function with these addresses goes with the binding.
 */
static void dbi_notify_unbind(struct device *dev)
{
	struct dbi_func *func;

	mutex_lock(&dbi_lock);
	func = dbi_func_find_locked(dev);
	if (func)
		kref_get(&func->ref);
	mutex_unlock(&dbi_lock);
	if (!func)
		return;
	dbi_func_teardown(func, "its driver unbinds", true);
	dbi_func_put(func);
}

static int dbi_pci_notify(struct notifier_block *nb, unsigned long action, void *data)
{
	struct device *dev = data;
	struct dbi_func *func;

	switch (action) {
	case BUS_NOTIFY_BIND_DRIVER:
		dbi_notify_bind(dev);
		break;
	case BUS_NOTIFY_UNBIND_DRIVER:
		dbi_notify_unbind(dev);
		break;
	case BUS_NOTIFY_DEL_DEVICE:
		/*
		 * Now, while its IOMMU state still exists (the IOMMU core releases it at
		 * BUS_NOTIFY_REMOVED_DEVICE), and no new attachment until then.
		 */
		mutex_lock(&dbi_lock);
		func = dbi_func_find_locked(dev);
		if (func && !func->dying) {
			func->dying = true;
			kref_get(&func->ref); /* dropped at REMOVED_DEVICE */
		} else {
			func = NULL;
		}
		mutex_unlock(&dbi_lock);
		if (func)
			dbi_func_teardown(func, "function removed", false);
		break;
	case BUS_NOTIFY_REMOVED_DEVICE:
		mutex_lock(&dbi_lock);
		func = dbi_func_find_locked(dev);
		if (func && func->dying)
			func->dying = false;
		else
			func = NULL;
		mutex_unlock(&dbi_lock);
		dbi_func_put(func);
		break;
	}
	return NOTIFY_DONE;
}

static struct notifier_block dbi_pci_nb = {
	.notifier_call = dbi_pci_notify,
};

static int __init dbi_init(void)
{
	int ret;

	ret = bus_register_notifier(&pci_bus_type, &dbi_pci_nb);
	if (ret)
		return ret;
	/* last: the device node appears when everything behind it is ready */
	ret = misc_register(&dbi_misc);
	if (ret)
		goto err_nb;
	/* The own device: dma-direct, no IOMMU, every address reachable. */
	ret = dma_coerce_mask_and_coherent(dbi_misc.this_device, DMA_BIT_MASK(64));
	if (ret)
		goto err_misc;
	dbi_misc.this_device->dma_parms = &dbi_dma_parms;
	smp_store_release(&dbi_ready, true);
	pr_info("version %s, ABI %d, /dev/%s\n", DBI_VERSION, UPCIE_DMABUF_IMPORT_ABI,
		dbi_misc.name);
	return 0;

err_misc:
	misc_deregister(&dbi_misc);
err_nb:
	bus_unregister_notifier(&pci_bus_type, &dbi_pci_nb);
	return ret;
}

static void __exit dbi_exit(void)
{
	misc_deregister(&dbi_misc);
	bus_unregister_notifier(&pci_bus_type, &dbi_pci_nb);
	/* Open files hold a module reference: no attachment and no function record is left. */
	WARN_ON(!list_empty(&dbi_funcs));
}

module_init(dbi_init);
module_exit(dbi_exit);

MODULE_LICENSE("GPL");
MODULE_VERSION(DBI_VERSION);
MODULE_DESCRIPTION("Import a dma-buf from user space and report its DMA addresses");
MODULE_AUTHOR("upcie");
