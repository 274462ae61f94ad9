/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * iommu_map_pa: put known physical pages (GPU memory found through dmabuf_import, another
 * device's BAR) into the IOMMU domain of a controller bound to vfio-pci, inside an IOVA window
 * kept free for them; and identity-map a controller's BAR into a GPU's kernel DMA domain so the
 * GPU's doorbell writes get through a translating IOMMU.
 *
 * Three parts:
 * - the module calls: upcie_kmod_iommu_map_pa_open/close, _map (pages of a source function's
 *   BARs at an IOVA in a controller's domain, proven owned by the controller's open vfio device
 *   descriptor, the memory kept in place by its dma-buf, which the module pins and checks the
 *   pages against; raw pages with nothing keeping them only when asked by name), _unmap (by handle), _map_bar (identity map of a BAR range into another
 *   function's kernel DMA domain; _doorbells maps the doorbell pages of an NVMe BAR0 into a
 *   GPU's domain, with the share override from the environment), _translate (what a domain
 *   maps at an IOVA; tests, diagnostics);
 * - the IOVA window (upcie_kmod_iova_window_*): the addresses the module maps at are chosen by
 *   user space without telling the domain's owner, so a window is set aside for them: 64 GiB at
 *   256 GiB by default, UPCIE_IOVA_BASE / UPCIE_IOVA_SIZE (numbers as strtoull reads them, e.g.
 *   0x2000000000) override it. The window must lie inside the usable IOVA ranges of every
 *   controller that uses it (-ERANGE otherwise: move it) and the controllers' own allocators
 *   must leave it alone (upcie_kmod_iova_window_exclude()). A full window is -ENOSPC. One window
 *   serves the whole process: every controller sees the same pages at the same IOVAs.
 * - the dmamem (upcie_dmamem_iommu_map_pa(), _lut(), _add()): pages mapped at one window range
 *   into one or more controllers, translated arithmetically (iova + offset).
 * A controller is named with its open vfio device (struct upcie_kmod_iommu_target: the device
 * descriptor from VFIO_GROUP_GET_DEVICE_FD or the bound cdev): the module keeps that device open
 * while it maps into the controller's domain, so the domain cannot be freed under the mapping.
 *
 * Needs: the iommu_map_pa module (package upcie-iommu-map-pa-dkms; Linux 5.19 or newer), CAP_SYS_ADMIN,
 * controllers on vfio-pci attached to a type1 container or an iommufd IOAS (for map) and an
 * enforcing IOMMU. A missing /dev/iommu_map_pa is -ENOENT with a message naming the package;
 * UPCIE_KMOD_IOMMU_MAP_PA_PATH overrides the path (tests). Does not: find the physical pages
 * (kmod/dmabuf_import.h does), set up vfio (vfio/), or reserve the window in the kernel: the
 * vfio owner keeps it free. Thread safety: module calls may come from any thread; a window takes
 * a mutex; a dmamem's _add must not race its destroy.
 */
#ifndef UPCIE_KMOD_IOMMU_MAP_PA_H
#define UPCIE_KMOD_IOMMU_MAP_PA_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <upcie/base/bits.h>
#include <upcie/base/log.h>
#include <upcie/kmod/device.h>
#include <upcie/kmod/uapi/iommu_map_pa.h>
#include <upcie/mem/dmamem.h>
#include <upcie/pci/bdf.h>
#include <upcie/vfio/iova.h>

#define UPCIE_KMOD_IOMMU_MAP_PA_PACKAGE "upcie-iommu-map-pa-dkms"

/* Protection for _map and _map_bar; 0 means both. */
#define UPCIE_KMOD_IOMMU_READ  UPCIE_IOMMU_MAP_PA_READ
#define UPCIE_KMOD_IOMMU_WRITE UPCIE_IOMMU_MAP_PA_WRITE

/*
 * The lifetime_fd of upcie_kmod_iommu_map_pa_map() and the dmamem that maps raw pages: no
 * dma-buf keeps the memory behind them in place, so nothing stops its owner (a GPU driver
 * evicting VRAM, a device reset) from moving or reusing it while the controller can still reach
 * it. Only for memory the caller keeps in place by other means (a BAR of a device it drives).
 * Outside the range of -errno values, so that a failed call's result (-1, -ENOENT) passed on as
 * a descriptor is refused rather than taken for it.
 */
#define UPCIE_KMOD_IOMMU_RAW_PAGES (-65536)

/* The default window: 64 GiB at 256 GiB (above any host's RAM in IOVA terms, below the 39-bit
 * limit of every VT-d and AMD-Vi page table). */
#define UPCIE_KMOD_IOVA_WINDOW_BASE (UINT64_C(256) << 30)
#define UPCIE_KMOD_IOVA_WINDOW_SIZE (UINT64_C(64) << 30)

/* A controller whose domain gets pages: its PCI function and its open vfio device. */
struct upcie_kmod_iommu_target {
	struct upcie_pci_bdf bdf;
	int owner_fd; /* the vfio device descriptor of bdf */
};

/* An open /dev/iommu_map_pa. Zeroed: closed. */
struct upcie_kmod_iommu_map_pa {
	int fd;
};

/* Open /dev/iommu_map_pa. 0, -ENOENT (module missing: message names the package),
 * -EPERM/-EACCES (not root), -EPROTO (another ABI), -EINVAL. */
static inline int upcie_kmod_iommu_map_pa_open(struct upcie_kmod_iommu_map_pa *ctx)
{
	struct upcie_iommu_map_pa_info info;

	if (!ctx)
		return UPCIE_FAIL(-EINVAL, "iommu_map_pa: NULL context");
	memset(ctx, 0, sizeof(*ctx));
	memset(&info, 0, sizeof(info));
	return upcie_kmod_open_("UPCIE_KMOD_IOMMU_MAP_PA_PATH", UPCIE_IOMMU_MAP_PA_DEVICE,
				"iommu_map_pa", UPCIE_IOMMU_MAP_PA_IDENT,
				UPCIE_KMOD_IOMMU_MAP_PA_PACKAGE, UPCIE_IOMMU_MAP_PA_IOC_INFO, &info,
				&info.abi, UPCIE_IOMMU_MAP_PA_ABI, &ctx->fd);
}

/* Close the context: mappings no dmamem holds go now. Zeroed or closed: no-op. */
static inline void upcie_kmod_iommu_map_pa_close(struct upcie_kmod_iommu_map_pa *ctx)
{
	if (!ctx || ctx->fd <= 0)
		return;
	close(ctx->fd);
	ctx->fd = 0;
}

/* Module facts: ABI, limits, live mappings over all files. */
static inline int upcie_kmod_iommu_map_pa_info(struct upcie_kmod_iommu_map_pa *ctx,
					       struct upcie_iommu_map_pa_info *info)
{
	if (!ctx || ctx->fd <= 0 || !info)
		return UPCIE_FAIL(-EBADF, "iommu_map_pa: context not open");
	memset(info, 0, sizeof(*info));
	if (ioctl(ctx->fd, UPCIE_IOMMU_MAP_PA_IOC_INFO, info))
		return UPCIE_FAIL(upcie_neg_errno(), "iommu_map_pa: INFO: %s",
				  upcie_errno_name(upcie_neg_errno()));
	return 0;
}

static inline int upcie_kmod_pci_(const struct upcie_pci_bdf *bdf, struct upcie_iommu_map_pa_pci *p,
				  char *name, size_t len)
{
	if (!bdf || bdf->dev > 31 || bdf->fn > 7)
		return UPCIE_FAIL(-EINVAL, "iommu_map_pa: bad PCI function");
	memset(p, 0, sizeof(*p));
	p->segment = bdf->domain;
	p->bus = bdf->bus;
	p->devfn = (uint8_t)(bdf->dev << 3 | bdf->fn);
	upcie_pci_bdf_format(bdf, name, len);
	return 0;
}

/* Words for what MAP / MAP_BAR answered. */
static inline const char *upcie_kmod_iommu_why_(int err, bool bar)
{
	switch (-err) {
	case EPERM:
		return bar ? "the target's domain is not a kernel DMA domain (DMA or DMA-FQ), or "
			     "the range covers the source's MSI-X table or pending bits"
			   : "the function's DMA is not owned by user space (bind it to vfio-pci "
			     "and attach it to a container or IOAS), or a page is not in an "
			     "assigned "
			     "memory BAR of the source or lies on its MSI-X structures";
	case EACCES:
		return "the owner descriptor is not this function's open vfio device";
	case EBADF:
		return "a descriptor (owner or lifetime) is not open";
	case ENXIO:
		return "a page is not in the scatter list of the lifetime dma-buf (the pages "
		       "must be memory of that buffer)";
	case EOPNOTSUPP:
		return "the lifetime dma-buf's exporter can neither pin it nor is it listed in "
		       "the module's static_exporters: its memory could move under the mapping";
	case ESTALE:
		return "the lifetime dma-buf's exporter took the buffer back while mapping";
	case ENFILE:
		return "all files together hold the module's max_total_mappings";
	case ENODEV:
		return bar ? "no such PCI function, or no driver is bound to the target (its DMA "
			     "domain lives only as long as a driver's binding)"
			   : "no such PCI function, or no IOMMU translates it";
	case ERANGE:
		return bar ? "outside the target's host-bridge windows (the kernel's own DMA "
			     "mappings for it may want these IOVAs), outside its aperture, or in a "
			     "reserved region"
			   : "outside the domain's aperture or inside a reserved region (move the "
			     "IOVA window: UPCIE_IOVA_BASE)";
	case EEXIST:
		return bar ? "the range is already mapped in the target's domain (set "
			     "UPCIE_DOORBELL_SHARE if an earlier opener of this controller mapped "
			     "it)"
			   : "a page of the range is already mapped in the domain";
	case E2BIG:
		return "more pages than the module's max_map_pages, or more bytes than its "
		       "max_map_mib";
	case EMFILE:
		return "this file holds the module's max_mappings";
	case EINVAL:
		return "bad alignment, size, BAR or arguments";
	default:
		return upcie_errno_name(err);
	}
}

/*
 * Map `npages` pages of `page_size` bytes (a power of two >= 4 KiB; physical addresses in
 * pages[], each page_size aligned, all in memory BARs of function `source`) at `iova`
 * (page_size aligned) into the IOMMU domain of the controller `t` (on vfio-pci; t->owner_fd its
 * open vfio device, which the module keeps open while mapped). prot: UPCIE_KMOD_IOMMU_READ |
 * _WRITE, 0 for both. lifetime_fd: the dma-buf the pages belong to (the GPU memory that
 * dmabuf_import resolved them from): the module pins it (or accepts an exporter that never moves
 * a buffer), checks every page against its scatter list and keeps it until the handle goes, so
 * the memory stays in place whatever the caller closes first; or UPCIE_KMOD_IOMMU_RAW_PAGES
 * (see there). *shared (may be NULL) tells whether the handle joined an identical mapping this
 * context made for another function in the same domain. Errors, each logged in words: -EPERM,
 * -EACCES, -EBADF, -ENODEV, -ERANGE, -EEXIST, -E2BIG, -EMFILE, -ENFILE, -ENXIO (a page outside
 * the dma-buf), -EOPNOTSUPP (an exporter that may move it), -ESTALE, -EINVAL (also a
 * lifetime_fd that is neither a descriptor nor UPCIE_KMOD_IOMMU_RAW_PAGES), -ENOMEM.
 */
static inline int upcie_kmod_iommu_map_pa_map(struct upcie_kmod_iommu_map_pa *ctx,
					      const struct upcie_kmod_iommu_target *t,
					      const struct upcie_pci_bdf *source, uint64_t iova,
					      const uint64_t *pages, size_t npages,
					      uint64_t page_size, unsigned prot, int lifetime_fd,
					      uint64_t *handle, bool *shared)
{
	struct upcie_iommu_map_pa_map m;
	char name[UPCIE_PCI_BDF_STRLEN], sname[UPCIE_PCI_BDF_STRLEN];
	int err;

	if (!ctx || ctx->fd <= 0)
		return UPCIE_FAIL(-EBADF, "iommu_map_pa: context not open");
	if (!t || !pages || !npages || !handle)
		return UPCIE_FAIL(-EINVAL, "iommu_map_pa: map needs a target, pages and a handle");
	if (lifetime_fd < 0 && lifetime_fd != UPCIE_KMOD_IOMMU_RAW_PAGES)
		return UPCIE_FAIL(-EINVAL,
				  "iommu_map_pa: map needs the pages' dma-buf as lifetime_fd, or "
				  "UPCIE_KMOD_IOMMU_RAW_PAGES for memory kept in place otherwise");
	memset(&m, 0, sizeof(m));
	err = upcie_kmod_pci_(&t->bdf, &m.pci, name, sizeof(name));
	if (!err)
		err = upcie_kmod_pci_(source, &m.source, sname, sizeof(sname));
	if (err)
		return err;
	m.owner_fd = t->owner_fd;
	m.prot = prot;
	m.iova = iova;
	m.page_size = page_size;
	m.npages = npages;
	m.pages = (uint64_t)(uintptr_t)pages;
	if (lifetime_fd == UPCIE_KMOD_IOMMU_RAW_PAGES) {
		m.lifetime_fd = -1;
		m.flags = UPCIE_IOMMU_MAP_PA_F_RAW_PAGES;
	} else {
		m.lifetime_fd = lifetime_fd;
	}
	if (ioctl(ctx->fd, UPCIE_IOMMU_MAP_PA_IOC_MAP, &m)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err,
				  "iommu_map_pa: map of %zu x 0x%" PRIx64
				  " of %s at IOVA 0x%" PRIx64 " for %s: %s (%s)",
				  npages, page_size, sname, iova, name,
				  upcie_kmod_iommu_why_(err, false), upcie_errno_name(err));
	}
	*handle = m.handle;
	if (shared)
		*shared = m.shared != 0;
	return 0;
}

/* Unmap one handle. -ENOENT when this file has no such handle (e.g. unmapped already). */
static inline int upcie_kmod_iommu_map_pa_unmap(struct upcie_kmod_iommu_map_pa *ctx,
						uint64_t handle)
{
	int err;

	if (!ctx || ctx->fd <= 0)
		return UPCIE_FAIL(-EBADF, "iommu_map_pa: context not open");
	if (ioctl(ctx->fd, UPCIE_IOMMU_MAP_PA_IOC_UNMAP, &handle)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "iommu_map_pa: unmap of handle %" PRIu64 ": %s", handle,
				  err == -ENOENT ? "no such handle in this file"
						 : upcie_errno_name(err));
	}
	return 0;
}

/* The outcome of _map_bar. */
struct upcie_kmod_bar_map {
	uint64_t handle; /* 0 when nothing was mapped (PASSTHROUGH) */
	uint64_t iova;	 /* the BAR range's bus address: the address the target's DMA uses */
	uint64_t size;
	unsigned result;     /* UPCIE_IOMMU_MAP_PA_BAR_MAPPED, _BORROWED or _PASSTHROUGH */
	bool in_host_window; /* the kernel's DMA allocator never hands out these IOVAs */
};

/* MAP_BAR flags: take an identical existing identity mapping as someone else's (borrow it);
 * map outside the target's host-bridge windows (a target whose kernel driver makes no DMA
 * mappings of its own that could want these IOVAs). */
#define UPCIE_KMOD_BAR_SHARE	      UPCIE_IOMMU_MAP_PA_F_SHARE
#define UPCIE_KMOD_BAR_OUTSIDE_WINDOW UPCIE_IOMMU_MAP_PA_F_OUTSIDE_WINDOW

/*
 * Identity-map [offset, offset + length) (length 0: to the end) of BAR `bar` of `source` into
 * the kernel DMA domain of `target` (a GPU under its driver), at the BAR's bus address.
 * flags: UPCIE_KMOD_BAR_SHARE, UPCIE_KMOD_BAR_OUTSIDE_WINDOW. Without a translating domain on
 * the target nothing is needed and out->result is UPCIE_IOMMU_MAP_PA_BAR_PASSTHROUGH. -EEXIST
 * when the range is taken (and not borrowed), -EPERM for a target whose domain user space owns
 * or a range on the source's MSI-X structures, -ERANGE outside the target's host-bridge windows
 * without the flag; see upcie_kmod_iommu_why_().
 */
static inline int upcie_kmod_iommu_map_pa_map_bar(struct upcie_kmod_iommu_map_pa *ctx,
						  const struct upcie_pci_bdf *target,
						  const struct upcie_pci_bdf *source, unsigned bar,
						  uint64_t offset, uint64_t length, unsigned flags,
						  struct upcie_kmod_bar_map *out)
{
	struct upcie_iommu_map_pa_map_bar m;
	char tname[UPCIE_PCI_BDF_STRLEN], sname[UPCIE_PCI_BDF_STRLEN];
	int err;

	if (!ctx || ctx->fd <= 0)
		return UPCIE_FAIL(-EBADF, "iommu_map_pa: context not open");
	if (!out)
		return UPCIE_FAIL(-EINVAL, "iommu_map_pa: map_bar needs an outcome");
	memset(&m, 0, sizeof(m));
	memset(out, 0, sizeof(*out));
	err = upcie_kmod_pci_(target, &m.target, tname, sizeof(tname));
	if (!err)
		err = upcie_kmod_pci_(source, &m.source, sname, sizeof(sname));
	if (err)
		return err;
	m.bar = bar;
	m.flags = flags;
	m.offset = offset;
	m.length = length;
	if (ioctl(ctx->fd, UPCIE_IOMMU_MAP_PA_IOC_MAP_BAR, &m)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "iommu_map_pa: identity map of %s BAR%u into %s: %s (%s)",
				  sname, bar, tname, upcie_kmod_iommu_why_(err, true),
				  upcie_errno_name(err));
	}
	out->handle = m.handle;
	out->iova = m.iova;
	out->size = m.size;
	out->result = m.result;
	out->in_host_window = (m.result_flags & UPCIE_IOMMU_MAP_PA_BAR_IN_HOST_WINDOW) != 0;
	return 0;
}

/* NVMe doorbells start at BAR0 + 0x1000 (NVMe base specification, "Controller Registers"). */
#define UPCIE_KMOD_NVME_DOORBELL_OFFSET 0x1000u

/*
 * The doorbell mapping of the GPU-issued queue: the doorbell pages of controller `nvme` (BAR0
 * from 0x1000: an SQ tail and a CQ head doorbell, 4 << dstrd bytes apart, for each of `nqueues`
 * queue pairs counting the admin queue; dstrd is CAP.DSTRD) identity-mapped into the kernel DMA
 * domain of `gpu`, nothing else of BAR0 (not its registers, not its MSI-X table).
 * UPCIE_DOORBELL_SHARE (set, not "0") borrows an identical mapping an earlier opener of the
 * controller made for the same GPU; that mapping then goes when its owner closes, so the owner
 * has to outlive this process's use. -EINVAL for no queues or a stride above 15.
 */
static inline int upcie_kmod_iommu_map_pa_doorbells(struct upcie_kmod_iommu_map_pa *ctx,
						    const struct upcie_pci_bdf *gpu,
						    const struct upcie_pci_bdf *nvme,
						    uint32_t nqueues, unsigned dstrd,
						    struct upcie_kmod_bar_map *out)
{
	const char *share = getenv("UPCIE_DOORBELL_SHARE");
	unsigned flags = share && *share && strcmp(share, "0") ? UPCIE_KMOD_BAR_SHARE : 0;
	uint64_t len;

	if (!nqueues || nqueues > 65536 || dstrd > 15)
		return UPCIE_FAIL(-EINVAL, "iommu_map_pa: doorbells of %u queues, stride %u",
				  nqueues, dstrd);
	len = upcie_align_up(UINT64_C(2) * nqueues * (UINT64_C(4) << dstrd), UINT64_C(4096));
	return upcie_kmod_iommu_map_pa_map_bar(ctx, gpu, nvme, 0, UPCIE_KMOD_NVME_DOORBELL_OFFSET,
					       len, flags, out);
}

/*
 * What the current domain of `bdf` maps at `iova`: *phys (0: nothing) and *domain_type
 * (UPCIE_IOMMU_MAP_PA_DOMAIN_*; either pointer may be NULL). A domain user space owns is read
 * only with bdf's open vfio device as owner_fd (-1: none; *phys is then 0). -ENODEV when bdf
 * does not exist or has no driver bound.
 */
static inline int upcie_kmod_iommu_map_pa_translate(struct upcie_kmod_iommu_map_pa *ctx,
						    const struct upcie_pci_bdf *bdf, int owner_fd,
						    uint64_t iova, uint64_t *phys,
						    unsigned *domain_type)
{
	struct upcie_iommu_map_pa_translate t;
	char name[UPCIE_PCI_BDF_STRLEN];
	int err;

	if (!ctx || ctx->fd <= 0)
		return UPCIE_FAIL(-EBADF, "iommu_map_pa: context not open");
	memset(&t, 0, sizeof(t));
	err = upcie_kmod_pci_(bdf, &t.pci, name, sizeof(name));
	if (err)
		return err;
	t.iova = iova;
	t.owner_fd = owner_fd;
	if (ioctl(ctx->fd, UPCIE_IOMMU_MAP_PA_IOC_TRANSLATE, &t)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "iommu_map_pa: translate 0x%" PRIx64 " for %s: %s", iova,
				  name, upcie_errno_name(err));
	}
	if (phys)
		*phys = t.phys;
	if (domain_type)
		*domain_type = t.domain_type;
	return 0;
}

/* ------------------------------------------------------------------------------------------- */
/* The IOVA window. */

struct upcie_kmod_iova_window {
	uint64_t base, size;
	struct upcie_vfio_iova_space space; /* allocations inside [base, base + size) */
	bool ready;
};

static inline int upcie_kmod_env_u64_(const char *name, uint64_t def, uint64_t *out)
{
	const char *s = getenv(name);
	char *end = NULL;
	unsigned long long v;

	*out = def;
	if (!s || !*s)
		return 0;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || !end || *end || *s == '-')
		return UPCIE_FAIL(-EINVAL, "iova window: %s='%s' is not a number", name, s);
	*out = v;
	return 0;
}

/*
 * Set up the window from UPCIE_IOVA_BASE / UPCIE_IOVA_SIZE (defaults above). Base and size must
 * be multiples of 2 MiB (so 2 MiB pages stay possible), the size non-zero, the range must not
 * wrap: -EINVAL otherwise. Allocations are aligned to `pgsize` (0: 4 KiB) at least.
 */
static inline int upcie_kmod_iova_window_init(struct upcie_kmod_iova_window *w, uint64_t pgsize)
{
	struct upcie_vfio_iova_ranges r;
	uint64_t last;
	int err;

	if (!w)
		return UPCIE_FAIL(-EINVAL, "iova window: NULL window");
	memset(w, 0, sizeof(*w));
	if (pgsize && (!upcie_is_pow2(pgsize) || pgsize < 4096))
		return UPCIE_FAIL(-EINVAL, "iova window: page size 0x%" PRIx64, pgsize);
	err = upcie_kmod_env_u64_("UPCIE_IOVA_BASE", UPCIE_KMOD_IOVA_WINDOW_BASE, &w->base);
	if (!err)
		err = upcie_kmod_env_u64_("UPCIE_IOVA_SIZE", UPCIE_KMOD_IOVA_WINDOW_SIZE, &w->size);
	if (err)
		return err;
	if (!w->size || !upcie_is_aligned(w->base, UINT64_C(2) << 20) ||
	    !upcie_is_aligned(w->size, UINT64_C(2) << 20) ||
	    upcie_add_overflow(w->base, w->size - 1, &last))
		return UPCIE_FAIL(-EINVAL,
				  "iova window: [0x%" PRIx64 ", +0x%" PRIx64 ") must be non-empty, "
				  "2 MiB aligned and not wrap (UPCIE_IOVA_BASE, UPCIE_IOVA_SIZE)",
				  w->base, w->size);
	memset(&r, 0, sizeof(r));
	r.align = pgsize ? pgsize : 4096;
	upcie_vfio_iova_ranges_add(&r, w->base, last);
	err = upcie_vfio_iova_space_init(&w->space, &r);
	if (err)
		return err;
	w->ready = true;
	return 0;
}

/*
 * Drop the window's allocator; a zeroed or unset window is a no-op. Mappings made in it are not
 * undone: unmap them first.
 */
static inline void upcie_kmod_iova_window_fini(struct upcie_kmod_iova_window *w)
{
	if (!w || !w->ready)
		return;
	upcie_vfio_iova_space_fini(&w->space);
	memset(w, 0, sizeof(*w));
}

/*
 * Check the window against the usable IOVA ranges of a controller (what its type1 container or
 * IOAS reports). -ERANGE when the window is not inside one range, with a message saying how to
 * move it.
 */
static inline int upcie_kmod_iova_window_check(const struct upcie_kmod_iova_window *w,
					       const struct upcie_vfio_iova_ranges *usable)
{
	uint64_t last;

	if (!w || !w->ready || !usable)
		return UPCIE_FAIL(-EINVAL, "iova window: not initialised");
	last = w->base + w->size - 1;
	for (uint32_t i = 0; i < usable->n && i < UPCIE_VFIO_IOVA_RANGES_MAX; i++)
		if (w->base >= usable->r[i].start && last <= usable->r[i].last)
			return 0;
	return UPCIE_FAIL(-ERANGE,
			  "iova window [0x%" PRIx64 ", 0x%" PRIx64 "] is outside the controller's "
			  "usable IOVA ranges; set UPCIE_IOVA_BASE/UPCIE_IOVA_SIZE to a range it "
			  "allows",
			  w->base, last);
}

/* Remove the window from `ranges` (a controller's usable IOVAs), for that controller's own
 * allocator (upcie_vfio_iova_space_update(), IOMMU_IOAS_ALLOW_IOVAS). -E2BIG when full. */
static inline int upcie_kmod_iova_window_exclude(const struct upcie_kmod_iova_window *w,
						 struct upcie_vfio_iova_ranges *ranges)
{
	if (!w || !w->ready || !ranges)
		return UPCIE_FAIL(-EINVAL, "iova window: not initialised");
	return upcie_vfio_iova_ranges_exclude(ranges, w->base, w->base + w->size - 1);
}

/*
 * Keep a vfio IOVA allocator (a type1 container's `iovas`, vfio/iova.h) out of the window, for
 * good: the exclusion survives the range refreshes of later groups joining the container. -EBUSY
 * when the allocator already has an allocation inside the window.
 */
static inline int upcie_kmod_iova_window_reserve(const struct upcie_kmod_iova_window *w,
						 struct upcie_vfio_iova_space *s)
{
	if (!w || !w->ready || !s || !s->ready)
		return UPCIE_FAIL(-EINVAL, "iova window: window or allocator not initialised");
	return upcie_vfio_iova_space_exclude(s, w->base, w->base + w->size - 1);
}

/* Reserve `size` bytes (rounded up to the page size) aligned to `align` (0: natural up to
 * 1 GiB). -ENOSPC when the window is full, with a message naming the window and its knobs. */
static inline int upcie_kmod_iova_window_alloc(struct upcie_kmod_iova_window *w, uint64_t size,
					       uint64_t align, uint64_t *iova)
{
	int err;

	if (!w || !w->ready || !iova)
		return UPCIE_FAIL(-EINVAL, "iova window: not initialised");
	err = upcie_vfio_iova_alloc(&w->space, size, align, iova);
	if (err == -ENOSPC)
		return UPCIE_FAIL(-ENOSPC,
				  "iova window [0x%" PRIx64 ", +0x%" PRIx64 ") has no room for "
				  "0x%" PRIx64 " bytes: enlarge it with UPCIE_IOVA_SIZE",
				  w->base, w->size, size);
	if (err)
		return UPCIE_FAIL(err, "iova window: allocation of 0x%" PRIx64 " bytes: %s", size,
				  upcie_errno_name(err));
	return 0;
}

/*
 * Return a range of upcie_kmod_iova_window_alloc(). 0, -EINVAL (window not set up), or -ENOENT
 * when [iova, +size) is not exactly one allocation.
 */
static inline int upcie_kmod_iova_window_free(struct upcie_kmod_iova_window *w, uint64_t iova,
					      uint64_t size)
{
	if (!w || !w->ready)
		return UPCIE_FAIL(-EINVAL, "iova window: not initialised");
	return upcie_vfio_iova_free(&w->space, iova, size);
}

/* ------------------------------------------------------------------------------------------- */
/* dmamem: pages at one window range, mapped into one or more controllers. */

struct upcie_dmamem_iommu_map_pa_priv_ {
	int fd; /* own reference to the module file */
	struct upcie_kmod_iova_window *win;
	uint64_t iova, len;
	uint64_t *pages; /* copy, for _add */
	size_t npages;
	uint64_t page_size;
	struct upcie_pci_bdf source;
	int lifetime_fd; /* own duplicate, for _add; UPCIE_KMOD_IOMMU_RAW_PAGES none */
	uint64_t *handles;
	size_t nhandles;
};

static inline void upcie_dmamem_iommu_map_pa_release_(struct upcie_dmamem *mem)
{
	struct upcie_dmamem_iommu_map_pa_priv_ *p =
	    (struct upcie_dmamem_iommu_map_pa_priv_ *)mem->priv;
	bool unmapped = true;

	if (!p)
		return;
	for (size_t i = p->nhandles; i-- > 0;) {
		if (ioctl(p->fd, UPCIE_IOMMU_MAP_PA_IOC_UNMAP, &p->handles[i])) {
			UPCIE_ERR("iommu_map_pa: unmap of handle %" PRIu64 " at release: %s",
				  p->handles[i], upcie_errno_name(upcie_neg_errno()));
			unmapped = false;
		}
	}
	/* the IOVAs go back only when nothing can still translate them */
	if (unmapped)
		upcie_kmod_iova_window_free(p->win, p->iova, p->len);
	if (p->lifetime_fd >= 0)
		close(p->lifetime_fd);
	close(p->fd);
	free(p->handles);
	free(p->pages);
	free(p);
	mem->priv = NULL;
}

/*
 * Map the dmamem's pages into one more controller, at the same IOVAs (a controller opened after
 * the memory was set up). -EEXIST etc. as upcie_kmod_iommu_map_pa_map(); a function sharing a
 * domain with one already mapped joins that mapping.
 */
static inline int upcie_dmamem_iommu_map_pa_add(struct upcie_dmamem *mem,
						const struct upcie_kmod_iommu_target *t)
{
	struct upcie_dmamem_iommu_map_pa_priv_ *p;
	struct upcie_kmod_iommu_map_pa tmp;
	uint64_t *nh, h;
	int err;

	if (!mem || mem->release != upcie_dmamem_iommu_map_pa_release_ || !mem->priv)
		return UPCIE_FAIL(-EINVAL, "iommu_map_pa: not an iommu_map_pa dmamem");
	p = (struct upcie_dmamem_iommu_map_pa_priv_ *)mem->priv;
	nh = (uint64_t *)realloc(p->handles, (p->nhandles + 1) * sizeof(*nh));
	if (!nh)
		return UPCIE_FAIL(-ENOMEM, "iommu_map_pa: out of host memory");
	p->handles = nh;
	tmp.fd = p->fd;
	err = upcie_kmod_iommu_map_pa_map(&tmp, t, &p->source, p->iova, p->pages, p->npages,
					  p->page_size, 0, p->lifetime_fd, &h, NULL);
	if (err)
		return err;
	p->handles[p->nhandles++] = h;
	return 0;
}

/*
 * Allocate a range of the window and map `npages` pages of `page_size` bytes (physical addresses
 * in pages[], in memory BARs of function `source`) there into each of the `n` controllers in
 * targets[] (on vfio-pci, their domains covering the window); describe it as arithmetic dmamem
 * of npages * page_size bytes with CPU view `vaddr` (may be NULL). lifetime_fd: see
 * upcie_kmod_iommu_map_pa_map() (the pages' dma-buf, or UPCIE_KMOD_IOMMU_RAW_PAGES); the dmamem
 * keeps its own duplicate of it. The dmamem holds its
 * own reference to the module file (ctx may be closed first) and borrows the window, which must
 * outlive it. upcie_dmamem_destroy() unmaps from every controller, then frees the range.
 * Errors: -ENOSPC (window full) and those of upcie_kmod_iommu_map_pa_map(). `mem` is zeroed on
 * failure, with nothing left mapped.
 */
static inline int upcie_dmamem_iommu_map_pa(struct upcie_dmamem *mem,
					    struct upcie_kmod_iommu_map_pa *ctx,
					    struct upcie_kmod_iova_window *win,
					    const struct upcie_kmod_iommu_target *targets, size_t n,
					    const struct upcie_pci_bdf *source, void *vaddr,
					    const uint64_t *pages, size_t npages,
					    uint64_t page_size, int lifetime_fd)
{
	struct upcie_dmamem_iommu_map_pa_priv_ *p;
	uint64_t len;
	int err;

	if (!mem)
		return UPCIE_FAIL(-EINVAL, "iommu_map_pa: NULL dmamem");
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	if (!ctx || ctx->fd <= 0 || !win || !win->ready)
		return UPCIE_FAIL(-EINVAL, "iommu_map_pa: context or window not ready");
	if (!targets || !n || !source || !pages || !npages || !upcie_is_pow2(page_size) ||
	    page_size < 4096 || npages > UINT64_MAX / page_size || npages * page_size > SIZE_MAX)
		return UPCIE_FAIL(-EINVAL, "iommu_map_pa: bad dmamem arguments");
	len = npages * page_size;
	p = (struct upcie_dmamem_iommu_map_pa_priv_ *)calloc(1, sizeof(*p));
	if (!p)
		return UPCIE_FAIL(-ENOMEM, "iommu_map_pa: out of host memory");
	p->fd = -1;
	p->win = win;
	p->len = len;
	p->npages = npages;
	p->page_size = page_size;
	p->source = *source;
	p->lifetime_fd = UPCIE_KMOD_IOMMU_RAW_PAGES;
	if (lifetime_fd < 0 && lifetime_fd != UPCIE_KMOD_IOMMU_RAW_PAGES) {
		free(p);
		return UPCIE_FAIL(-EINVAL, "iommu_map_pa: the dmamem needs the pages' dma-buf, or "
					   "UPCIE_KMOD_IOMMU_RAW_PAGES");
	}
	p->pages = (uint64_t *)malloc(npages * sizeof(*p->pages));
	if (!p->pages) {
		free(p);
		return UPCIE_FAIL(-ENOMEM, "iommu_map_pa: out of host memory for %zu pages",
				  npages);
	}
	/* _add may come after the caller closed its descriptor, or reused its number */
	if (lifetime_fd >= 0) {
		p->lifetime_fd = fcntl(lifetime_fd, F_DUPFD_CLOEXEC, 3);
		if (p->lifetime_fd < 0) {
			err = UPCIE_FAIL(upcie_neg_errno(),
					 "iommu_map_pa: dup of the lifetime descriptor %d: %s",
					 lifetime_fd, upcie_errno_name(upcie_neg_errno()));
			free(p->pages);
			free(p);
			return err;
		}
	}
	memcpy(p->pages, pages, npages * sizeof(*p->pages));
	err = upcie_kmod_iova_window_alloc(win, len, page_size, &p->iova);
	if (err)
		goto fail_free;
	p->fd = fcntl(ctx->fd, F_DUPFD_CLOEXEC, 3);
	if (p->fd < 0) {
		err = UPCIE_FAIL(upcie_neg_errno(), "iommu_map_pa: dup of the module file: %s",
				 upcie_errno_name(upcie_neg_errno()));
		goto fail_iova;
	}
	err = upcie_dmamem_init_arith(mem, vaddr, (size_t)len, p->iova);
	if (err)
		goto fail_fd;
	mem->release = upcie_dmamem_iommu_map_pa_release_;
	mem->priv = p;
	mem->kind = "iommu-map-pa";
	for (size_t i = 0; i < n; i++) {
		err = upcie_dmamem_iommu_map_pa_add(mem, &targets[i]);
		if (err) {
			upcie_dmamem_destroy(mem); /* unmaps what is mapped, frees the range */
			return err;
		}
	}
	return 0;

fail_fd:
	close(p->fd);
fail_iova:
	upcie_kmod_iova_window_free(win, p->iova, len);
fail_free:
	if (p->lifetime_fd >= 0)
		close(p->lifetime_fd);
	free(p->pages);
	free(p);
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	return err;
}

/*
 * The same for memory described by a LUT dmamem of physical addresses (upcie_dmamem_dmabuf_import
 * of GPU memory, `source` the GPU): its granules become the pages, its CPU view the view.
 * dmabuf_fd: the dma-buf lutmem was imported from (the module pins it for these mappings and
 * checks the granules against it), or UPCIE_KMOD_IOMMU_RAW_PAGES. The LUT dmamem must outlive
 * this one.
 */
static inline int upcie_dmamem_iommu_map_pa_lut(struct upcie_dmamem *mem,
						struct upcie_kmod_iommu_map_pa *ctx,
						struct upcie_kmod_iova_window *win,
						const struct upcie_kmod_iommu_target *targets,
						size_t n, const struct upcie_pci_bdf *source,
						const struct upcie_dmamem *lutmem, int dmabuf_fd)
{
	int err;

	if (!lutmem || !lutmem->lut) {
		if (mem) {
			memset(mem, 0, sizeof(*mem));
			mem->fd = -1;
		}
		return UPCIE_FAIL(-EINVAL, "iommu_map_pa: source is not a LUT dmamem");
	}
	err = upcie_dmamem_iommu_map_pa(mem, ctx, win, targets, n, source, lutmem->vaddr,
					lutmem->lut, lutmem->nlut,
					UINT64_C(1) << lutmem->granule_shift, dmabuf_fd);
	if (!err)
		mem->size = lutmem->size; /* the last granule may be partly beyond the memory */
	return err;
}

#endif /* UPCIE_KMOD_IOMMU_MAP_PA_H */
