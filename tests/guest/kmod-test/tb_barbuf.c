// SPDX-License-Identifier: GPL-2.0
/*
 * tb_barbuf: a test exporter of dma-bufs over a slice of a PCI function's BAR (the guests'
 * ivshmem "VRAM"), standing in for a GPU driver that exports its memory, so that importers of
 * device memory (iommu_map_pa's lifetime_fd) are tested with a real exporter: a pin op that
 * counts (or none, TB_BARBUF_F_NOPIN), a scatter list of the slice's addresses for the
 * importing device (dma_map_resource), and a revocation on request (REVOKE: the importers'
 * move/invalidate callback under the reservation lock). Interface: tb_barbuf.h. Test builds
 * only; never shipped.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/version.h>

#include "tb_barbuf.h"

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
MODULE_IMPORT_NS("DMA_BUF");
#else
MODULE_IMPORT_NS(DMA_BUF);
#endif

struct tbb_buf {
	struct pci_dev *pdev;
	phys_addr_t phys;
	size_t len;
	atomic_t pins;
	atomic_t attached;
};

static int tbb_attach(struct dma_buf *buf, struct dma_buf_attachment *attach)
{
	struct tbb_buf *b = buf->priv;

	atomic_inc(&b->attached);
	return 0;
}

static void tbb_detach(struct dma_buf *buf, struct dma_buf_attachment *attach)
{
	struct tbb_buf *b = buf->priv;

	atomic_dec(&b->attached);
}

static int tbb_pin(struct dma_buf_attachment *attach)
{
	struct tbb_buf *b = attach->dmabuf->priv;

	atomic_inc(&b->pins);
	return 0;
}

static void tbb_unpin(struct dma_buf_attachment *attach)
{
	struct tbb_buf *b = attach->dmabuf->priv;

	atomic_dec(&b->pins);
}

static struct sg_table *tbb_map(struct dma_buf_attachment *attach, enum dma_data_direction dir)
{
	struct tbb_buf *b = attach->dmabuf->priv;
	struct sg_table *sgt;
	dma_addr_t addr;
	int ret;

	sgt = kzalloc(sizeof(*sgt), GFP_KERNEL);
	if (!sgt)
		return ERR_PTR(-ENOMEM);
	ret = sg_alloc_table(sgt, 1, GFP_KERNEL);
	if (ret) {
		kfree(sgt);
		return ERR_PTR(ret);
	}
	addr = dma_map_resource(attach->dev, b->phys, b->len, dir, DMA_ATTR_SKIP_CPU_SYNC);
	if (dma_mapping_error(attach->dev, addr)) {
		sg_free_table(sgt);
		kfree(sgt);
		return ERR_PTR(-EIO);
	}
	sg_set_page(sgt->sgl, NULL, b->len, 0); /* no struct page: device memory */
	sg_dma_address(sgt->sgl) = addr;
	sg_dma_len(sgt->sgl) = b->len;
	return sgt;
}

static void tbb_unmap(struct dma_buf_attachment *attach, struct sg_table *sgt,
		      enum dma_data_direction dir)
{
	dma_unmap_resource(attach->dev, sg_dma_address(sgt->sgl), sg_dma_len(sgt->sgl), dir,
			   DMA_ATTR_SKIP_CPU_SYNC);
	sg_free_table(sgt);
	kfree(sgt);
}

static void tbb_release(struct dma_buf *buf)
{
	struct tbb_buf *b = buf->priv;

	pci_dev_put(b->pdev);
	kfree(b);
}

static const struct dma_buf_ops tbb_ops_pin = {
	.attach = tbb_attach,
	.detach = tbb_detach,
	.pin = tbb_pin,
	.unpin = tbb_unpin,
	.map_dma_buf = tbb_map,
	.unmap_dma_buf = tbb_unmap,
	.release = tbb_release,
};

static const struct dma_buf_ops tbb_ops_nopin = {
	.attach = tbb_attach,
	.detach = tbb_detach,
	.map_dma_buf = tbb_map,
	.unmap_dma_buf = tbb_unmap,
	.release = tbb_release,
};

static long tbb_export(void __user *uarg)
{
	DEFINE_DMA_BUF_EXPORT_INFO(info);
	struct tb_barbuf_export req;
	struct pci_dev *pdev;
	struct dma_buf *buf;
	struct tbb_buf *b;
	int fd;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.reserved || req.reserved2 || (req.flags & ~TB_BARBUF_F_NOPIN) || req.bar > 5 ||
	    !req.len || !PAGE_ALIGNED(req.offset) || !PAGE_ALIGNED(req.len))
		return -EINVAL;
	pdev = pci_get_domain_bus_and_slot(req.segment, req.bus, req.devfn);
	if (!pdev)
		return -ENODEV;
	if (!(pci_resource_flags(pdev, req.bar) & IORESOURCE_MEM) ||
	    req.offset + req.len < req.offset ||
	    req.offset + req.len > pci_resource_len(pdev, req.bar)) {
		pci_dev_put(pdev);
		return -EINVAL;
	}
	b = kzalloc(sizeof(*b), GFP_KERNEL);
	if (!b) {
		pci_dev_put(pdev);
		return -ENOMEM;
	}
	b->pdev = pdev;
	b->phys = pci_resource_start(pdev, req.bar) + req.offset;
	b->len = req.len;
	info.ops = (req.flags & TB_BARBUF_F_NOPIN) ? &tbb_ops_nopin : &tbb_ops_pin;
	info.size = req.len;
	info.flags = O_RDWR | O_CLOEXEC;
	info.priv = b;
	buf = dma_buf_export(&info);
	if (IS_ERR(buf)) {
		pci_dev_put(pdev);
		kfree(b);
		return PTR_ERR(buf);
	}
	fd = dma_buf_fd(buf, O_CLOEXEC);
	if (fd < 0) {
		dma_buf_put(buf); /* releases b */
		return fd;
	}
	req.fd = fd;
	if (copy_to_user(uarg, &req, sizeof(req)))
		return -EFAULT; /* the descriptor stays open: the caller's table holds it */
	return 0;
}

/* The dma-buf behind `fd` if this module exported it, referenced. */
static struct dma_buf *tbb_get(int fd)
{
	struct dma_buf *buf = dma_buf_get(fd);

	if (IS_ERR(buf))
		return buf;
	if (buf->ops != &tbb_ops_pin && buf->ops != &tbb_ops_nopin) {
		dma_buf_put(buf);
		return ERR_PTR(-EINVAL);
	}
	return buf;
}

static long tbb_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;
	struct tb_barbuf_state st;
	struct dma_buf *buf;
	struct tbb_buf *b;
	__s32 fd;

	switch (cmd) {
	case TB_BARBUF_IOC_EXPORT:
		return tbb_export(uarg);
	case TB_BARBUF_IOC_STATE:
		if (copy_from_user(&st, uarg, sizeof(st)))
			return -EFAULT;
		buf = tbb_get(st.fd);
		if (IS_ERR(buf))
			return PTR_ERR(buf);
		b = buf->priv;
		st.pins = atomic_read(&b->pins);
		st.attached = atomic_read(&b->attached);
		dma_buf_put(buf);
		return copy_to_user(uarg, &st, sizeof(st)) ? -EFAULT : 0;
	case TB_BARBUF_IOC_REVOKE:
		if (copy_from_user(&fd, uarg, sizeof(fd)))
			return -EFAULT;
		buf = tbb_get(fd);
		if (IS_ERR(buf))
			return PTR_ERR(buf);
		dma_resv_lock(buf->resv, NULL);
#ifdef TB_HAVE_INVALIDATE_MAPPINGS
		dma_buf_invalidate_mappings(buf);
#else
		dma_buf_move_notify(buf);
#endif
		dma_resv_unlock(buf->resv);
		dma_buf_put(buf);
		return 0;
	}
	return -ENOTTY;
}

static const struct file_operations tbb_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = tbb_ioctl,
};

static struct miscdevice tbb_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "tb_barbuf",
	.fops = &tbb_fops,
	.mode = 0600,
};

module_misc_device(tbb_misc);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("test exporter: dma-bufs over a PCI BAR slice (upcie's guest test bed)");
