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
 * What it refuses: a user-domain MAP for a function whose DMA is not owned by user space (a
 * kernel driver's domain is the kernel's), system RAM (vfio and iommufd map RAM and pin it; a
 * raw physical RAM page could be freed and reused under the mapping), ranges outside the
 * aperture or in a reserved region, and any page the domain already translates. MAP_BAR maps
 * nothing but a memory BAR, only at its own bus address, only into a kernel DMA domain
 * (DMA or DMA-FQ), and only where nothing is mapped yet.
 *
 * Lifetime. Mappings belong to the open file; its release unmaps them, and an open file holds a
 * module reference (rmmod fails, module in use, while one exists). Functions are pinned (pci_dev_get). A
 * domain pointer is only dereferenced while it is the function's current domain, and a mapping
 * is only removed when its first page still translates to the address it was made with: when
 * the owner detached the function, freed the domain, or another domain took its place, the
 * record is dropped without touching any domain. The owner of a user domain must keep it
 * attached while it has mappings (type1: keep the container; iommufd: keep the HWPT), or
 * unmap first; a concurrent detach in another thread during MAP is not guarded against. Driver
 * binding changes and removal of a mapped function are handled by a bus notifier: the mapping
 * goes while the domain it was made in is still attached; the handle stays until UNMAP.
 *
 * Locking. imp_lock (global) protects the list of files and the dying list; a file's mutex its
 * handles. Order: device_lock of the target function, imp_lock, a file's mutex. The bus
 * notifier runs with the device lock held for driver events, which is why MAP takes it first.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/device.h>
#include <linux/dma-buf.h>
#include <linux/fs.h>
#include <linux/iommu.h>
#include <linux/ioport.h>
#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/overflow.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/version.h>

#include "uapi/iommu_map_pa.h"

#define IMP_VERSION "1.0.0"

/* Only for dma_buf_get()/dma_buf_put() of the optional lifetime reference. */
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
static unsigned long max_map_pages = 1UL << 22;
module_param(max_map_pages, ulong, 0644);
MODULE_PARM_DESC(max_map_pages, "pages one MAP may name (default 4194304)");

/* One range installed in (or borrowed from) one domain. Shared by the handles of one file. */
struct imp_mapping {
	struct iommu_domain *domain;
	u64 iova;
	u64 size;
	u64 page_size;
	phys_addr_t first_phys;
	int prot;
	unsigned int refs;
	bool installed; /* false: borrowed (MAP_BAR with F_SHARE): never unmapped by us */
};

struct imp_handle {
	struct list_head node;
	u64 handle;
	struct pci_dev *pdev; /* the function whose domain holds the mapping */
	struct pci_dev *src;  /* MAP_BAR: the function whose BAR is mapped */
	struct dma_buf *lifetime;
	struct imp_mapping *m;
	bool bar; /* made by MAP_BAR */
	bool gone;
};

struct imp_file {
	struct mutex lock;
	struct list_head handles;
	struct list_head node; /* in imp_files */
	u64 next_handle;
	unsigned int nh;
};

struct imp_dying {
	struct list_head node;
	struct device *dev;
};

static DEFINE_MUTEX(imp_lock);
static LIST_HEAD(imp_files);
static LIST_HEAD(imp_dying);
static atomic64_t imp_live = ATOMIC64_INIT(0);

static struct pci_dev *imp_pci_get(const struct upcie_iommu_map_pa_pci *p)
{
	if (p->reserved)
		return ERR_PTR(-EINVAL);
	return pci_get_domain_bus_and_slot(p->segment, p->bus, p->devfn) ?: ERR_PTR(-ENODEV);
}

static bool imp_dying_locked(struct pci_dev *pdev)
{
	struct imp_dying *d;

	lockdep_assert_held(&imp_lock);
	list_for_each_entry(d, &imp_dying, node)
		if (d->dev == &pdev->dev)
			return true;
	return false;
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
 * Is [iova, iova + size) inside the domain's aperture and clear of the function's reserved
 * regions? 0 or -ERANGE. The x86 interrupt window is checked by address as well, since 6.1
 * does not export iommu_get_resv_regions().
 */
static int imp_check_range(struct pci_dev *pdev, struct iommu_domain *d, u64 iova, u64 size)
{
	u64 last = iova + size - 1;
	int ret = 0;

	if (d->geometry.force_aperture &&
	    (iova < d->geometry.aperture_start || last > d->geometry.aperture_end)) {
		pci_info(pdev, "iommu_map_pa: [%#llx, %#llx] outside the aperture [%pad, %pad]\n",
			 iova, last, &d->geometry.aperture_start, &d->geometry.aperture_end);
		return -ERANGE;
	}
#ifdef CONFIG_X86
	if (iova <= 0xfeefffffULL && last >= 0xfee00000ULL)
		return -ERANGE;
#endif
#ifdef UPCIE_KMOD_HAVE_RESV_REGIONS
	{
		struct iommu_resv_region *r;
		LIST_HEAD(resv);

		iommu_get_resv_regions(&pdev->dev, &resv);
		list_for_each_entry(r, &resv, list) {
			if (r->length && iova <= r->start + r->length - 1 && last >= r->start) {
				pci_info(pdev,
					 "iommu_map_pa: [%#llx, %#llx] overlaps reserved region "
					 "%pa+%#zx\n",
					 iova, last, &r->start, r->length);
				ret = -ERANGE;
				break;
			}
		}
		iommu_put_resv_regions(&pdev->dev, &resv);
	}
#endif
	return ret;
}

/*
 * Remove a mapping from its domain, if that is still the function's domain and the mapping is
 * still ours. Never dereferences a domain that is not currently attached.
 */
static void imp_mapping_remove(struct imp_mapping *m, struct pci_dev *pdev)
{
	struct iommu_domain *cur = iommu_get_domain_for_dev(&pdev->dev);
	size_t done;

	if (!m->installed)
		return;
	if (cur != m->domain) {
		pci_info(pdev, "iommu_map_pa: domain changed; mapping at %#llx left to its owner\n",
			 m->iova);
		return;
	}
	if (iommu_iova_to_phys(cur, m->iova) != m->first_phys) {
		pci_info(pdev, "iommu_map_pa: %#llx no longer maps %pa; not unmapping\n", m->iova,
			 &m->first_phys);
		return;
	}
	done = iommu_unmap(cur, m->iova, m->size);
	if (done != m->size)
		pci_warn(pdev, "iommu_map_pa: unmapped %#zx of %#llx bytes at %#llx\n", done,
			 m->size, m->iova);
}

/* Drop one handle's share of its mapping and its references. The handle stays allocated. */
static void imp_handle_teardown(struct imp_handle *h)
{
	if (h->m && --h->m->refs == 0) {
		imp_mapping_remove(h->m, h->pdev);
		kfree(h->m);
	}
	h->m = NULL;
	if (h->lifetime) {
		dma_buf_put(h->lifetime);
		h->lifetime = NULL;
	}
	if (h->src) {
		pci_dev_put(h->src);
		h->src = NULL;
	}
	if (h->pdev) {
		pci_dev_put(h->pdev);
		h->pdev = NULL;
	}
	atomic64_dec(&imp_live);
}

static int imp_prot(u32 prot)
{
	int p = IOMMU_MMIO; /* never RAM: see the file comment */

	if (!prot)
		prot = UPCIE_IOMMU_MAP_PA_READ | UPCIE_IOMMU_MAP_PA_WRITE;
	if (prot & UPCIE_IOMMU_MAP_PA_READ)
		p |= IOMMU_READ;
	if (prot & UPCIE_IOMMU_MAP_PA_WRITE)
		p |= IOMMU_WRITE;
	return p;
}

/* Insert a new handle into the file (imp_lock held), numbering it; -EMFILE when full. */
static int imp_add_locked(struct imp_file *f, struct imp_handle *h)
{
	mutex_lock(&f->lock);
	if (f->nh >= max_mappings) {
		mutex_unlock(&f->lock);
		return -EMFILE;
	}
	h->handle = ++f->next_handle;
	list_add_tail(&h->node, &f->handles);
	f->nh++;
	mutex_unlock(&f->lock);
	return 0;
}

/* Take a just-added handle out again (imp_lock held), when telling user space failed. */
static void imp_del_locked(struct imp_file *f, struct imp_handle *h)
{
	mutex_lock(&f->lock);
	list_del(&h->node);
	f->nh--;
	mutex_unlock(&f->lock);
}

/*
 * An existing mapping of this file in domain d that overlaps [iova, +size): *same is set when it
 * has exactly this range, page size and protection (the candidate for sharing). f->lock held.
 */
static struct imp_mapping *imp_overlap_locked(struct imp_file *f, struct iommu_domain *d, u64 iova,
					      u64 size, u64 page_size, int prot, bool *same)
{
	struct imp_handle *h;

	*same = false;
	list_for_each_entry(h, &f->handles, node) {
		struct imp_mapping *m = h->m;

		if (h->gone || !m || m->domain != d)
			continue;
		if (iova + size - 1 < m->iova || iova > m->iova + m->size - 1)
			continue;
		*same = m->installed && m->iova == iova && m->size == size &&
			m->page_size == page_size && m->prot == prot;
		return m;
	}
	return NULL;
}

/*
 * Walk the pages (copied from the caller once, before any check, so nothing checked can change
 * before it is mapped): check each (alignment, not RAM) and then either compare it with what the
 * domain translates (share: every page must already map exactly there) or map it, merging
 * physically contiguous pages into one iommu_map() call. On failure everything this call mapped
 * is unmapped again.
 */
static int imp_map_pages(struct pci_dev *pdev, struct iommu_domain *d,
			 const struct upcie_iommu_map_pa_map *req, const u64 *pages, int prot,
			 bool share)
{
	const u64 ps = req->page_size;
	u64 run_iova = req->iova, run_pa = 0, run_len = 0, mapped = 0, i;
	int ret = 0;

	for (i = 0; i < req->npages; i++) {
		u64 pa = pages[i], iova = req->iova + i * ps;
		phys_addr_t now;

		if (!IS_ALIGNED(pa, ps) || pa + ps - 1 < pa || (phys_addr_t)pa != pa) {
			ret = -EINVAL;
			break;
		}
		if (region_intersects(pa, ps, IORESOURCE_SYSTEM_RAM, IORES_DESC_NONE) !=
		    REGION_DISJOINT) {
			pci_info(pdev, "iommu_map_pa: page %llu (%#llx) is system RAM\n", i, pa);
			ret = -EPERM;
			break;
		}
		now = iommu_iova_to_phys(d, iova);
		if (share) {
			if (now != pa) {
				ret = -EEXIST;
				break;
			}
			continue;
		}
		if (now) {
			pci_info(pdev, "iommu_map_pa: IOVA %#llx already maps %pa\n", iova, &now);
			ret = -EEXIST;
			break;
		}
		if (run_len && run_pa + run_len == pa) {
			run_len += ps;
			continue;
		}
		if (run_len) {
			ret = imp_iommu_map(d, run_iova, run_pa, run_len, prot);
			if (ret)
				break;
			mapped += run_len;
		}
		run_iova = iova;
		run_pa = pa;
		run_len = ps;
		cond_resched();
	}
	if (!ret && run_len && !share) {
		ret = imp_iommu_map(d, run_iova, run_pa, run_len, prot);
		if (!ret)
			mapped += run_len;
	}
	if (ret && mapped)
		iommu_unmap(d, req->iova, mapped);
	return ret;
}

static long imp_ioc_map(struct imp_file *f, void __user *uarg)
{
	struct upcie_iommu_map_pa_map req;
	struct imp_mapping *m = NULL, *old;
	struct iommu_domain *d;
	struct imp_handle *h;
	struct pci_dev *pdev;
	bool same = false;
	u64 size, *pages;
	int prot;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.flags || req.reserved[0] || req.reserved[1] ||
	    (req.prot & ~(UPCIE_IOMMU_MAP_PA_READ | UPCIE_IOMMU_MAP_PA_WRITE)))
		return -EINVAL;
	if (!is_power_of_2(req.page_size) || req.page_size < PAGE_SIZE || !req.npages ||
	    !IS_ALIGNED(req.iova, req.page_size) || req.iova != (unsigned long)req.iova)
		return -EINVAL;
	if (req.npages > max_map_pages)
		return -E2BIG;
	if (check_mul_overflow(req.npages, req.page_size, &size) || req.iova + size - 1 < req.iova)
		return -EINVAL;
	if (req.lifetime_fd < -1)
		return -EINVAL;
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	prot = imp_prot(req.prot);

	pages = kvmalloc_array(req.npages, sizeof(*pages), GFP_KERNEL);
	if (!pages)
		return -ENOMEM;
	if (copy_from_user(pages, u64_to_user_ptr(req.pages), req.npages * sizeof(*pages))) {
		kvfree(pages);
		return -EFAULT;
	}
	h = kzalloc(sizeof(*h), GFP_KERNEL);
	if (!h) {
		kvfree(pages);
		return -ENOMEM;
	}
	atomic64_inc(&imp_live);
	if (req.lifetime_fd >= 0) {
		h->lifetime = dma_buf_get(req.lifetime_fd);
		if (IS_ERR(h->lifetime)) {
			ret = PTR_ERR(h->lifetime);
			h->lifetime = NULL;
			goto free;
		}
	}
	pdev = imp_pci_get(&req.pci);
	if (IS_ERR(pdev)) {
		ret = PTR_ERR(pdev);
		goto free;
	}
	h->pdev = pdev;

	device_lock(&pdev->dev); /* the driver (vfio-pci) stays bound while we map */
	mutex_lock(&imp_lock);
	switch (imp_domain_kind(pdev, &d)) {
	case UPCIE_IOMMU_MAP_PA_DOMAIN_USER:
		ret = 0;
		break;
	case UPCIE_IOMMU_MAP_PA_DOMAIN_NONE:
		pci_info(pdev, "iommu_map_pa: no IOMMU translates this function\n");
		ret = -ENODEV;
		break;
	default:
		pci_info(pdev,
			 "iommu_map_pa: its DMA domain is not user-owned (driver: %s); refused\n",
			 pdev->dev.driver ? pdev->dev.driver->name : "none");
		ret = -EPERM;
		break;
	}
	if (!ret && imp_dying_locked(pdev))
		ret = -ENODEV;
	if (!ret && (!d->pgsize_bitmap || req.page_size < (1ULL << __ffs(d->pgsize_bitmap))))
		ret = -EINVAL;
	if (!ret)
		ret = imp_check_range(pdev, d, req.iova, size);
	if (ret)
		goto unlock;

	mutex_lock(&f->lock);
	old = imp_overlap_locked(f, d, req.iova, size, req.page_size, prot, &same);
	if (old && !same)
		ret = -EEXIST;
	mutex_unlock(&f->lock);
	if (ret)
		goto unlock;

	if (!same) {
		m = kzalloc(sizeof(*m), GFP_KERNEL);
		if (!m) {
			ret = -ENOMEM;
			goto unlock;
		}
	}
	ret = imp_map_pages(pdev, d, &req, pages, prot, same);
	if (ret) {
		kfree(m);
		goto unlock;
	}
	if (same) {
		/* f->lock is not needed for refs: handles of f change only under imp_lock too */
		old->refs++;
		h->m = old;
		req.shared = 1;
	} else {
		*m = (struct imp_mapping){ .domain = d,
					   .iova = req.iova,
					   .size = size,
					   .page_size = req.page_size,
					   .first_phys = pages[0],
					   .prot = prot,
					   .refs = 1,
					   .installed = true };
		h->m = m;
		req.shared = 0;
	}
	ret = imp_add_locked(f, h);
	if (ret)
		goto unlock_teardown;
	req.handle = h->handle;
	if (copy_to_user(uarg, &req, sizeof(req))) {
		imp_del_locked(f, h);
		ret = -EFAULT;
		goto unlock_teardown;
	}
	mutex_unlock(&imp_lock);
	device_unlock(&pdev->dev);
	kvfree(pages);
	return 0;

unlock_teardown:
	imp_handle_teardown(h);
	mutex_unlock(&imp_lock);
	device_unlock(&pdev->dev);
	kfree(h);
	kvfree(pages);
	return ret;
unlock:
	mutex_unlock(&imp_lock);
	device_unlock(&pdev->dev);
free:
	imp_handle_teardown(h);
	kfree(h);
	kvfree(pages);
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

static long imp_ioc_map_bar(struct imp_file *f, void __user *uarg)
{
	struct upcie_iommu_map_pa_map_bar req;
	struct pci_dev *tgt, *src;
	struct iommu_domain *d;
	struct imp_handle *h;
	struct imp_mapping *m;
	u64 len, phys, bus, off, taken = 0, same = 0;
	int prot;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if ((req.flags & ~UPCIE_IOMMU_MAP_PA_F_SHARE) || req.bar > 5 || req.reserved0 ||
	    req.reserved[0] || req.reserved[1] ||
	    (req.prot & ~(UPCIE_IOMMU_MAP_PA_READ | UPCIE_IOMMU_MAP_PA_WRITE)) ||
	    !PAGE_ALIGNED(req.offset) || !PAGE_ALIGNED(req.length))
		return -EINVAL;
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	prot = imp_prot(req.prot);

	h = kzalloc(sizeof(*h), GFP_KERNEL);
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!h || !m) {
		kfree(h);
		kfree(m);
		return -ENOMEM;
	}
	atomic64_inc(&imp_live);
	h->bar = true;
	src = imp_pci_get(&req.source);
	if (IS_ERR(src)) {
		ret = PTR_ERR(src);
		goto free;
	}
	h->src = src;
	tgt = imp_pci_get(&req.target);
	if (IS_ERR(tgt)) {
		ret = PTR_ERR(tgt);
		goto free;
	}
	h->pdev = tgt;

	len = pci_resource_len(src, req.bar);
	if (!(pci_resource_flags(src, req.bar) & IORESOURCE_MEM) || !len || req.offset >= len ||
	    req.length > len - req.offset) {
		ret = -EINVAL;
		goto free;
	}
	if (!req.length)
		req.length = len - req.offset;
	if (req.length / PAGE_SIZE > max_map_pages) {
		ret = -E2BIG;
		goto free;
	}
	/* BARs smaller than a page (rare) are mapped as the whole page that holds them. */
	phys = pci_resource_start(src, req.bar) + req.offset;
	bus = pci_bus_address(src, req.bar) + req.offset;
	if (!PAGE_ALIGNED(phys) || !PAGE_ALIGNED(bus)) {
		ret = -EINVAL;
		goto free;
	}
	req.length = PAGE_ALIGN(req.length);
	req.iova = bus;
	req.size = req.length;
	req.result_flags =
	    imp_in_host_window(tgt, bus, req.length) ? UPCIE_IOMMU_MAP_PA_BAR_IN_HOST_WINDOW : 0;

	device_lock(&tgt->dev);
	mutex_lock(&imp_lock);
	switch (imp_domain_kind(tgt, &d)) {
	case UPCIE_IOMMU_MAP_PA_DOMAIN_NONE:
	case UPCIE_IOMMU_MAP_PA_DOMAIN_IDENTITY:
		/* The target's DMA reaches the BAR untranslated already. */
		req.result = UPCIE_IOMMU_MAP_PA_BAR_PASSTHROUGH;
		req.handle = 0;
		ret = copy_to_user(uarg, &req, sizeof(req)) ? -EFAULT : 0;
		goto unlock;
	case UPCIE_IOMMU_MAP_PA_DOMAIN_DMA:
		break;
	default:
		pci_info(tgt, "iommu_map_pa: MAP_BAR needs a kernel DMA domain (DMA or DMA-FQ)\n");
		ret = -EPERM;
		goto unlock;
	}
	if (imp_dying_locked(tgt) || imp_dying_locked(src)) {
		ret = -ENODEV;
		goto unlock;
	}
	ret = imp_check_range(tgt, d, bus, req.length);
	if (ret)
		goto unlock;
	for (off = 0; off < req.length; off += PAGE_SIZE) {
		phys_addr_t now = iommu_iova_to_phys(d, bus + off);

		if (now)
			taken++;
		if (now == phys + off)
			same++;
	}
	if (taken &&
	    !(same == req.length / PAGE_SIZE && (req.flags & UPCIE_IOMMU_MAP_PA_F_SHARE))) {
		pci_info(tgt, "iommu_map_pa: %#llx+%#llx of %s BAR%u is taken in this domain\n",
			 bus, req.length, pci_name(src), req.bar);
		ret = -EEXIST;
		goto unlock;
	}
	*m = (struct imp_mapping){ .domain = d,
				   .iova = bus,
				   .size = req.length,
				   .page_size = PAGE_SIZE,
				   .first_phys = phys,
				   .prot = prot,
				   .refs = 1,
				   .installed = !taken };
	if (!taken) {
		ret = imp_iommu_map(d, bus, phys, req.length, prot);
		if (ret)
			goto unlock;
	}
	h->m = m;
	m = NULL;
	req.result = taken ? UPCIE_IOMMU_MAP_PA_BAR_BORROWED : UPCIE_IOMMU_MAP_PA_BAR_MAPPED;
	ret = imp_add_locked(f, h);
	if (ret)
		goto unlock_teardown;
	req.handle = h->handle;
	if (copy_to_user(uarg, &req, sizeof(req))) {
		imp_del_locked(f, h);
		ret = -EFAULT;
		goto unlock_teardown;
	}
	mutex_unlock(&imp_lock);
	device_unlock(&tgt->dev);
	return 0;

unlock_teardown:
	imp_handle_teardown(h);
	mutex_unlock(&imp_lock);
	device_unlock(&tgt->dev);
	kfree(h);
	return ret;
unlock:
	mutex_unlock(&imp_lock);
	device_unlock(&tgt->dev);
free:
	imp_handle_teardown(h);
	kfree(h);
	kfree(m);
	return ret;
}

static long imp_ioc_unmap(struct imp_file *f, void __user *uarg)
{
	struct imp_handle *h, *found = NULL;
	u64 handle;

	if (copy_from_user(&handle, uarg, sizeof(handle)))
		return -EFAULT;
	mutex_lock(&imp_lock);
	mutex_lock(&f->lock);
	list_for_each_entry(h, &f->handles, node) {
		if (h->handle == handle) {
			found = h;
			list_del(&h->node);
			f->nh--;
			break;
		}
	}
	mutex_unlock(&f->lock);
	if (found && !found->gone)
		imp_handle_teardown(found);
	mutex_unlock(&imp_lock);
	if (!found)
		return -ENOENT;
	kfree(found);
	return 0;
}

static long imp_ioc_translate(void __user *uarg)
{
	struct upcie_iommu_map_pa_translate req;
	struct iommu_domain *d;
	struct pci_dev *pdev;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.reserved0 || req.reserved[0] || req.reserved[1])
		return -EINVAL;
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	pdev = imp_pci_get(&req.pci);
	if (IS_ERR(pdev))
		return PTR_ERR(pdev);
	device_lock(&pdev->dev);
	req.domain_type = imp_domain_kind(pdev, &d);
	req.phys = 0;
	req.aperture_start = req.aperture_end = req.pgsize_bitmap = 0;
	if (d && (d->type & __IOMMU_DOMAIN_PAGING)) {
		req.phys = iommu_iova_to_phys(d, req.iova);
		req.aperture_start = d->geometry.aperture_start;
		req.aperture_end = d->geometry.aperture_end;
		req.pgsize_bitmap = d->pgsize_bitmap;
	}
	device_unlock(&pdev->dev);
	pci_dev_put(pdev);
	return copy_to_user(uarg, &req, sizeof(req)) ? -EFAULT : 0;
}

static long imp_ioc_info(void __user *uarg)
{
	struct upcie_iommu_map_pa_info info = {
		.abi = UPCIE_IOMMU_MAP_PA_ABI,
		.max_mappings = max_mappings,
		.max_map_pages = max_map_pages,
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

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
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

	mutex_lock(&imp_lock);
	list_del(&f->node);
	/* Newest first, so a shared mapping goes with its last handle. */
	list_for_each_entry_safe_reverse(h, tmp, &f->handles, node) {
		list_del(&h->node);
		if (!h->gone)
			imp_handle_teardown(h);
		kfree(h);
	}
	mutex_unlock(&imp_lock);
	mutex_destroy(&f->lock);
	kfree(f);
	return 0;
}

static const struct file_operations imp_fops = {
	.owner = THIS_MODULE,
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

/*
 * A function's driver changes or the function goes away. Mappings in its domain are removed now,
 * while the domain they were made in is still the one attached: a user domain goes with the
 * vfio-pci binding, a kernel DMA domain was made for the driver that is leaving (or for none,
 * before a driver that may hand the function to user space). Mappings of a removed function's
 * BAR go too: its addresses may be given to another device. Handles stay, marked gone.
 */
static void imp_notify_dev(struct device *dev, bool as_source, const char *why)
{
	struct imp_file *f;
	struct imp_handle *h;

	list_for_each_entry(f, &imp_files, node) {
		mutex_lock(&f->lock);
		list_for_each_entry(h, &f->handles, node) {
			if (h->gone || !((h->pdev && &h->pdev->dev == dev) ||
					 (as_source && h->src && &h->src->dev == dev)))
				continue;
			dev_info(dev, "iommu_map_pa: %s; unmapping handle %llu\n", why, h->handle);
			imp_handle_teardown(h);
			h->gone = true;
		}
		mutex_unlock(&f->lock);
	}
}

static int imp_pci_notify(struct notifier_block *nb, unsigned long action, void *data)
{
	struct device *dev = data;
	struct imp_dying *d, *tmp;

	switch (action) {
	case BUS_NOTIFY_BIND_DRIVER:
	case BUS_NOTIFY_UNBOUND_DRIVER:
		mutex_lock(&imp_lock);
		imp_notify_dev(dev, false, "driver binding changes");
		mutex_unlock(&imp_lock);
		break;
	case BUS_NOTIFY_DEL_DEVICE:
		d = kzalloc(sizeof(*d), GFP_KERNEL);
		mutex_lock(&imp_lock);
		if (d) {
			d->dev = dev;
			list_add(&d->node, &imp_dying);
		}
		imp_notify_dev(dev, true, "function removed");
		mutex_unlock(&imp_lock);
		break;
	case BUS_NOTIFY_REMOVED_DEVICE:
		mutex_lock(&imp_lock);
		list_for_each_entry_safe(d, tmp, &imp_dying, node) {
			if (d->dev == dev) {
				list_del(&d->node);
				kfree(d);
			}
		}
		mutex_unlock(&imp_lock);
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

	ret = misc_register(&imp_misc);
	if (ret)
		return ret;
	ret = bus_register_notifier(&pci_bus_type, &imp_pci_nb);
	if (ret) {
		misc_deregister(&imp_misc);
		return ret;
	}
	pr_info("version %s, ABI %d, /dev/%s\n", IMP_VERSION, UPCIE_IOMMU_MAP_PA_ABI,
		imp_misc.name);
	return 0;
}

static void __exit imp_exit(void)
{
	struct imp_dying *d, *tmp;

	bus_unregister_notifier(&pci_bus_type, &imp_pci_nb);
	misc_deregister(&imp_misc);
	list_for_each_entry_safe(d, tmp, &imp_dying, node) {
		list_del(&d->node);
		kfree(d);
	}
}

module_init(imp_init);
module_exit(imp_exit);

MODULE_LICENSE("GPL");
MODULE_VERSION(IMP_VERSION);
MODULE_DESCRIPTION("Map physical pages into the IOMMU domain of a PCI function");
MODULE_AUTHOR("upcie");
