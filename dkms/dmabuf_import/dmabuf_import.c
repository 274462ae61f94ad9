// SPDX-License-Identifier: GPL-2.0
/*
 * dmabuf_import: import a dma-buf from user space and hand back the device addresses of its
 * backing store (the scatter list), for user-space drivers that program a device with them.
 *
 * Why it exists: the kernel maps a dma-buf for DMA whenever a driver imports one, but offers
 * user space no way to do the same and learn the addresses. upcie needs them to build a LUT for
 * a controller that sees physical addresses (uio_pci_generic) and to map GPU memory into a
 * vfio-owned IOMMU domain (iommu_map_pa). The UAPI and its semantics are in
 * uapi/dmabuf_import.h; this file only adds how.
 *
 * Lifetime. Every attachment belongs to the open file that made it (struct dbi_file), never to
 * a process or an fd number; the file's release detaches everything it holds. An open file
 * holds a module reference (misc device fops owner), so the module cannot be unloaded while an
 * attachment exists: rmmod fails with EBUSY until the files are closed. A PCI function named
 * as importer is referenced (pci_dev_get) while attached; when it is removed from the system
 * the bus notifier tears its attachments down before the IOMMU core releases it, and the
 * handles report ENODEV.
 *
 * Locking. dbi_lock (global) protects the list of files and the list of functions being
 * removed; a file's mutex protects its attachments. Order: dbi_lock, then a file's mutex, then
 * a dma-buf's reservation lock. device_lock of a named function is taken alone, never while
 * holding another of these.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/device.h>
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/fs.h>
#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/swiotlb.h>
#include <linux/uaccess.h>
#include <linux/version.h>

#include "uapi/dmabuf_import.h"

#define DBI_VERSION "1.0.0"

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

struct dbi_file {
	struct mutex lock;
	struct list_head atts; /* struct dbi_att, by handle */
	struct list_head node; /* in dbi_files */
	u64 next_handle;
	unsigned int natt;
};

struct dbi_att {
	struct list_head node;
	u64 handle;
	struct dma_buf *dmabuf;
	struct dma_buf_attachment *attach;
	struct sg_table *sgt;
	struct pci_dev *pdev; /* NULL: the module's own device */
	u32 nsegs;
	bool stale; /* the exporter moved or revoked the buffer (written under the resv lock) */
	bool gone;  /* the function was removed: already torn down */
};

/* A function between BUS_NOTIFY_DEL_DEVICE and BUS_NOTIFY_REMOVED_DEVICE: no new attachments. */
struct dbi_dying {
	struct list_head node;
	struct device *dev;
};

static DEFINE_MUTEX(dbi_lock);
static LIST_HEAD(dbi_files);
static LIST_HEAD(dbi_dying);
static atomic64_t dbi_live = ATOMIC64_INIT(0);
static struct miscdevice dbi_misc;

/*
 * The exporter is moving the buffer. The attachment is pinned, so only a revocation gets here;
 * the device keeps whatever addresses user space gave it, and nothing can take them back in
 * bounded time, so the attachment is marked stale for GET and left for DETACH. Up to 7.0 a
 * dynamic importer must provide this callback; from 7.1 (invalidate_mappings) it is optional,
 * and leaving it out tells exporters honestly that this importer cannot revoke (they may refuse
 * it: vfio-pci's BAR dma-bufs do).
 */
#ifndef UPCIE_KMOD_HAVE_INVALIDATE_MAPPINGS
static void dbi_move_notify(struct dma_buf_attachment *attach)
{
	struct dbi_att *att = attach->importer_priv;

	WRITE_ONCE(att->stale, true);
	pr_warn_ratelimited("exporter %s moved a pinned buffer; handle %llu is stale\n",
			    attach->dmabuf->exp_name, att->handle);
}
#endif

static const struct dma_buf_attach_ops dbi_importer_ops = {
	.allow_peer2peer = true,
#ifndef UPCIE_KMOD_HAVE_INVALIDATE_MAPPINGS
	.move_notify = dbi_move_notify,
#endif
};

/* Undo attach: unmap, unpin, detach, drop the references. Called once per attachment. */
static void dbi_att_teardown(struct dbi_att *att)
{
	struct dma_buf *dmabuf = att->dmabuf;

	if (att->sgt) {
		dma_resv_lock(dmabuf->resv, NULL);
		dma_buf_unmap_attachment(att->attach, att->sgt, DMA_BIDIRECTIONAL);
		dma_buf_unpin(att->attach);
		dma_resv_unlock(dmabuf->resv);
		att->sgt = NULL;
	}
	if (att->attach) {
		dma_buf_detach(dmabuf, att->attach);
		att->attach = NULL;
	}
	if (att->dmabuf) {
		dma_buf_put(att->dmabuf);
		att->dmabuf = NULL;
	}
	if (att->pdev) {
		pci_dev_put(att->pdev);
		att->pdev = NULL;
	}
	atomic64_dec(&dbi_live);
}

static bool dbi_dying_locked(struct device *dev)
{
	struct dbi_dying *d;

	lockdep_assert_held(&dbi_lock);
	list_for_each_entry(d, &dbi_dying, node)
		if (d->dev == dev)
			return true;
	return false;
}

/*
 * Find the named function and check that it may be an importer: its DMA is not owned by user
 * space and no kernel driver other than uio_pci_generic is bound. uio_pci_generic sets no DMA
 * mask and does no DMA itself; the mask is raised to 64 bits there (and on an unbound
 * function), because under dma-direct a 32-bit mask would put the device's writes into
 * swiotlb bounce buffers instead of the dma-buf.
 */
static int dbi_pci_get(const struct upcie_dmabuf_import_pci *p, struct pci_dev **out)
{
	struct pci_dev *pdev;
	const char *drv;
	int ret = 0;

	if (p->reserved)
		return -EINVAL;
	pdev = pci_get_domain_bus_and_slot(p->segment, p->bus, p->devfn);
	if (!pdev)
		return -ENODEV;
	device_lock(&pdev->dev);
	/*
	 * The bound driver tells who owns the function's DMA. iommu_group_dma_owner_claimed()
	 * cannot: every kernel driver counts as an owner there too.
	 */
	drv = pdev->dev.driver ? pdev->dev.driver->name : NULL;
	if (drv && to_pci_driver(pdev->dev.driver)->driver_managed_dma) {
		pci_info(pdev, "dmabuf_import: %s hands DMA to user space; refused\n", drv);
		ret = -EBUSY;
	} else if (drv && strcmp(drv, "uio_pci_generic")) {
		pci_info(pdev, "dmabuf_import: bound to kernel driver %s; refused\n", drv);
		ret = -EBUSY;
	}
	if (!ret && dma_get_mask(&pdev->dev) != DMA_BIT_MASK(64))
		ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(64));
	device_unlock(&pdev->dev);
	if (ret) {
		pci_dev_put(pdev);
		return ret;
	}
	*out = pdev;
	return 0;
}

/* Copy segments [first, first + cap) of sgt to user memory; returns 0 or -EFAULT. */
static int dbi_copy_segs(struct sg_table *sgt, u32 first, u32 cap, u64 uptr)
{
	struct upcie_dmabuf_import_seg buf[32];
	struct upcie_dmabuf_import_seg __user *dst = u64_to_user_ptr(uptr);
	struct scatterlist *sg;
	unsigned int i, n = 0, done = 0;

	if (!cap)
		return 0;
	for_each_sgtable_dma_sg(sgt, sg, i) {
		if (i < first)
			continue;
		if (done + n >= cap)
			break;
		buf[n].addr = sg_dma_address(sg);
		buf[n].len = sg_dma_len(sg);
		if (++n == ARRAY_SIZE(buf)) {
			if (copy_to_user(dst + done, buf, sizeof(buf)))
				return -EFAULT;
			done += n;
			n = 0;
		}
	}
	if (n && copy_to_user(dst + done, buf, n * sizeof(buf[0])))
		return -EFAULT;
	return 0;
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
	struct scatterlist *sg;
	struct dbi_att *att;
	struct device *dev;
	bool reserved = false, global = false;
	long ret;
	u64 total = 0;
	unsigned int i;

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
	if (f->natt >= max_attachments) {
		mutex_unlock(&f->lock);
		return -EMFILE;
	}
	f->natt++; /* a slot for this attachment; given back on failure */
	mutex_unlock(&f->lock);
	reserved = true;

	att = kzalloc(sizeof(*att), GFP_KERNEL);
	if (!att) {
		ret = -ENOMEM;
		goto out;
	}
	atomic64_inc(&dbi_live);
	att->dmabuf = dma_buf_get(req.dmabuf_fd);
	if (IS_ERR(att->dmabuf)) {
		ret = PTR_ERR(att->dmabuf);
		att->dmabuf = NULL;
		goto fail;
	}
	if (req.flags & UPCIE_DMABUF_IMPORT_F_PCI) {
		/*
		 * Held until the attachment is on the file's list, so that the removal notifier
		 * either sees it there or ran before and left the function marked dying.
		 */
		mutex_lock(&dbi_lock);
		global = true;
		ret = dbi_pci_get(&req.pci, &att->pdev);
		if (ret)
			goto fail;
		if (dbi_dying_locked(&att->pdev->dev)) {
			ret = -ENODEV;
			goto fail;
		}
		dev = &att->pdev->dev;
	} else {
		dev = dbi_misc.this_device;
	}
	if (is_swiotlb_force_bounce(dev)) {
		/* The device's writes would land in a bounce buffer, not in the dma-buf. */
		ret = -EOPNOTSUPP;
		goto fail;
	}

	att->attach = dma_buf_dynamic_attach(att->dmabuf, dev, &dbi_importer_ops, att);
	if (IS_ERR(att->attach)) {
		ret = PTR_ERR(att->attach);
		att->attach = NULL;
		goto fail;
	}
	/*
	 * A dynamic importer pins and maps under the reservation lock on every kernel from 6.1 on,
	 * so the locked calls are used throughout (dma_buf_map_attachment_unlocked, which 6.2 added
	 * and Debian backported to 6.1, is the same with the lock taken inside).
	 */
	ret = dma_resv_lock_interruptible(att->dmabuf->resv, NULL);
	if (ret)
		goto fail;
	ret = dma_buf_pin(att->attach);
	if (!ret) {
		att->sgt = dma_buf_map_attachment(att->attach, DMA_BIDIRECTIONAL);
		if (IS_ERR(att->sgt)) {
			ret = PTR_ERR(att->sgt);
			att->sgt = NULL;
			dma_buf_unpin(att->attach);
		}
	}
	dma_resv_unlock(att->dmabuf->resv);
	if (ret)
		goto fail;
	/* What the exporter did to place the memory (a clear, a move) must finish first. */
	ret = dma_resv_wait_timeout(att->dmabuf->resv, DMA_RESV_USAGE_KERNEL, true,
				    MAX_SCHEDULE_TIMEOUT);
	if (ret < 0)
		goto fail;

	for_each_sgtable_dma_sg(att->sgt, sg, i)
		total += sg_dma_len(sg);
	att->nsegs = att->sgt->nents;
	if (total != att->dmabuf->size)
		pr_info_ratelimited("exporter %s: scatter list covers %llu of %zu bytes\n",
				    att->dmabuf->exp_name, total, att->dmabuf->size);
	ret = dbi_copy_segs(att->sgt, 0, req.cap, req.segs);
	if (ret)
		goto fail;

	mutex_lock(&f->lock);
	att->handle = ++f->next_handle;
	req.handle = att->handle;
	req.nsegs = att->nsegs;
	req.size = att->dmabuf->size;
	if (copy_to_user(uarg, &req, sizeof(req))) {
		mutex_unlock(&f->lock);
		ret = -EFAULT;
		goto fail;
	}
	list_add_tail(&att->node, &f->atts);
	mutex_unlock(&f->lock);
	if (global)
		mutex_unlock(&dbi_lock);
	return 0;

fail:
	dbi_att_teardown(att);
	kfree(att);
out:
	if (global)
		mutex_unlock(&dbi_lock);
	if (reserved) {
		mutex_lock(&f->lock);
		f->natt--;
		mutex_unlock(&f->lock);
	}
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
	if (!att) {
		ret = -ENOENT;
	} else if (att->gone) {
		ret = -ENODEV;
	} else if (READ_ONCE(att->stale)) {
		ret = -ESTALE;
	} else if (req.first > att->nsegs) {
		ret = -EINVAL;
	} else {
		req.nsegs = att->nsegs;
		ret = dbi_copy_segs(att->sgt, req.first, req.cap, req.segs);
		if (!ret && copy_to_user(uarg, &req, sizeof(req)))
			ret = -EFAULT;
	}
	mutex_unlock(&f->lock);
	return ret;
}

static long dbi_ioc_detach(struct dbi_file *f, void __user *uarg)
{
	struct dbi_att *att;
	u64 handle;

	if (copy_from_user(&handle, uarg, sizeof(handle)))
		return -EFAULT;
	mutex_lock(&f->lock);
	att = dbi_find_locked(f, handle);
	if (!att) {
		mutex_unlock(&f->lock);
		return -ENOENT;
	}
	list_del(&att->node);
	f->natt--;
	if (!att->gone)
		dbi_att_teardown(att);
	mutex_unlock(&f->lock);
	kfree(att);
	return 0;
}

static long dbi_ioc_info(void __user *uarg)
{
	struct upcie_dmabuf_import_info info = {
		.abi = UPCIE_DMABUF_IMPORT_ABI,
		.max_attachments = max_attachments,
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

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
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

	mutex_lock(&dbi_lock);
	list_del(&f->node);
	mutex_unlock(&dbi_lock);
	/* Nobody else can reach f now: the file is going and the notifier no longer sees it. */
	list_for_each_entry_safe(att, tmp, &f->atts, node) {
		list_del(&att->node);
		if (!att->gone)
			dbi_att_teardown(att);
		kfree(att);
	}
	mutex_destroy(&f->lock);
	kfree(f);
	return 0;
}

static const struct file_operations dbi_fops = {
	.owner = THIS_MODULE,
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

/*
 * A PCI function is going away: tear down every attachment made for it now, while its IOMMU
 * state still exists (the IOMMU core releases it at BUS_NOTIFY_REMOVED_DEVICE), and refuse new
 * ones until then. The handles stay, answering ENODEV, until user space detaches them.
 */
static int dbi_pci_notify(struct notifier_block *nb, unsigned long action, void *data)
{
	struct device *dev = data;
	struct dbi_dying *d, *tmp;
	struct dbi_file *f;
	struct dbi_att *att;

	if (action == BUS_NOTIFY_DEL_DEVICE) {
		d = kzalloc(sizeof(*d), GFP_KERNEL);
		mutex_lock(&dbi_lock);
		if (d) {
			d->dev = dev;
			list_add(&d->node, &dbi_dying);
		}
		list_for_each_entry(f, &dbi_files, node) {
			mutex_lock(&f->lock);
			list_for_each_entry(att, &f->atts, node) {
				if (att->gone || !att->pdev || &att->pdev->dev != dev)
					continue;
				dev_info(dev,
					 "dmabuf_import: function removed; detaching handle %llu\n",
					 att->handle);
				dbi_att_teardown(att);
				att->gone = true;
			}
			mutex_unlock(&f->lock);
		}
		mutex_unlock(&dbi_lock);
	} else if (action == BUS_NOTIFY_REMOVED_DEVICE) {
		mutex_lock(&dbi_lock);
		list_for_each_entry_safe(d, tmp, &dbi_dying, node) {
			if (d->dev == dev) {
				list_del(&d->node);
				kfree(d);
			}
		}
		mutex_unlock(&dbi_lock);
	}
	return NOTIFY_DONE;
}

static struct notifier_block dbi_pci_nb = {
	.notifier_call = dbi_pci_notify,
};

static int __init dbi_init(void)
{
	int ret;

	ret = misc_register(&dbi_misc);
	if (ret)
		return ret;
	/* The own device: dma-direct, no IOMMU, every address reachable. */
	ret = dma_coerce_mask_and_coherent(dbi_misc.this_device, DMA_BIT_MASK(64));
	if (ret)
		goto err_misc;
	ret = bus_register_notifier(&pci_bus_type, &dbi_pci_nb);
	if (ret)
		goto err_misc;
	pr_info("version %s, ABI %d, /dev/%s\n", DBI_VERSION, UPCIE_DMABUF_IMPORT_ABI,
		dbi_misc.name);
	return 0;

err_misc:
	misc_deregister(&dbi_misc);
	return ret;
}

static void __exit dbi_exit(void)
{
	struct dbi_dying *d, *tmp;

	bus_unregister_notifier(&pci_bus_type, &dbi_pci_nb);
	misc_deregister(&dbi_misc);
	/* Open files hold a module reference, so none is left; the dying list may hold entries. */
	list_for_each_entry_safe(d, tmp, &dbi_dying, node) {
		list_del(&d->node);
		kfree(d);
	}
}

module_init(dbi_init);
module_exit(dbi_exit);

MODULE_LICENSE("GPL");
MODULE_VERSION(DBI_VERSION);
MODULE_DESCRIPTION("Import a dma-buf from user space and report its DMA addresses");
MODULE_AUTHOR("upcie");
