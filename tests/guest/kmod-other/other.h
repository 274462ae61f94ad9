/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A stand-in for another project's kernel module of the same name as one of upcie's: uPCIe's
 * dmabuf_import and iommu_map_pa serve /dev/dmabuf_import and /dev/iommu_map_pa with another
 * ioctl interface (type 'u') and carry no identity parameter. The guest case kmod_ident loads
 * this in place of upcie's module and checks that upcie's wrapper refuses it by name without
 * sending it anything: every request that reaches it is logged, so the case can count them.
 * It answers every request ENOTTY. Test bed only; never packaged.
 *
 * Include after defining OTHER_NAME (the module and device name).
 */
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>

static long other_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	pr_info("tb-other " OTHER_NAME ": request 0x%08x\n", cmd);
	return -ENOTTY;
}

static const struct file_operations other_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = other_ioctl,
	.compat_ioctl = other_ioctl,
};

static struct miscdevice other_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = OTHER_NAME,
	.fops = &other_fops,
	.mode = 0600,
};

module_misc_device(other_misc);

MODULE_LICENSE("GPL");
MODULE_VERSION("0.2.0");
MODULE_DESCRIPTION("test bed stand-in for another project's " OTHER_NAME);
