/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dmabuf_import: learn the device addresses behind a dma-buf (a GPU allocation, a udmabuf, a
 * vgem buffer) through the dmabuf_import kernel module, and describe the buffer as a LUT dmamem.
 *
 * upcie_kmod_dmabuf_attach() makes the module attach, pin and map the dma-buf and returns its
 * scatter list ({device address, length} per segment) and a handle; the attachment lasts until
 * upcie_kmod_dmabuf_detach() or until the import file is closed (every dmamem made from it holds
 * its own reference to that file, so the import context may be closed first). By default the
 * attachment is made for the module's own device, which sees CPU physical addresses: what a
 * controller on uio_pci_generic with the IOMMU off or in passthrough consumes, and what
 * iommu_map_pa maps for a controller on vfio-pci. upcie_kmod_dmabuf_attach_pci() attaches for a
 * named PCI function instead (on uio_pci_generic or unbound, as every function of its IOMMU
 * group): the exporter then judges peer-to-peer by the real pair, under a translating IOMMU the
 * addresses are IOVAs the kernel mapped in that function's DMA domain, and an exporter that
 * revokes its buffers (vfio-pci's BAR dma-bufs) is accepted, because the module can stop that
 * function when it does. For the module's own device only buffers the exporter pins, or whose
 * exporter never moves them (udmabuf, DRM PRIME helpers, NVIDIA), are accepted. Attaching one dma-buf twice gives two attachments
 * and two handles. upcie_dmamem_dmabuf_import() turns an attachment into a LUT dmamem
 * (mem/sglut.h: the scatter list must tile the buffer in whole granules, e.g. 64 KiB for CUDA).
 *
 * Needs: the dmabuf_import module (package upcie-dmabuf-import-dkms; Linux 5.19 or newer) and
 * CAP_SYS_ADMIN; a missing /dev/dmabuf_import is -ENOENT with a message naming the package.
 * The environment variable UPCIE_KMOD_DMABUF_IMPORT_PATH overrides the device path (tests).
 * Does not: export dma-bufs (gpu/, vfio/ and udmabuf do), map anything into an IOMMU domain
 * (kmod/iommu_map_pa.h), or check that peers can reach each other.
 * Thread safety: calls on one context may come from several threads (the module serializes them).
 */
#ifndef UPCIE_KMOD_DMABUF_IMPORT_H
#define UPCIE_KMOD_DMABUF_IMPORT_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <upcie/base/compiler.h>
#include <upcie/base/log.h>
#include <upcie/kmod/device.h>
#include <upcie/kmod/uapi/dmabuf_import.h>
#include <upcie/mem/dmamem.h>
#include <upcie/mem/sglut.h>
#include <upcie/pci/bdf.h>

#define UPCIE_KMOD_DMABUF_IMPORT_PACKAGE "upcie-dmabuf-import-dkms"

/* The scatter list is handed to the kernel as is: both layouts must agree. */
UPCIE_STATIC_ASSERT(sizeof(struct upcie_sg_seg) == sizeof(struct upcie_dmabuf_import_seg) &&
			offsetof(struct upcie_sg_seg, addr) ==
			    offsetof(struct upcie_dmabuf_import_seg, addr) &&
			offsetof(struct upcie_sg_seg, len) ==
			    offsetof(struct upcie_dmabuf_import_seg, len),
		    "struct upcie_sg_seg must match the module's segment layout");

/* An open /dev/dmabuf_import. Zeroed: closed. */
struct upcie_kmod_dmabuf_import {
	int fd;
};

/* Open /dev/dmabuf_import. 0, -ENOENT (module missing: message names the package),
 * -EPERM/-EACCES (not root), -EPROTO (another ABI), -EINVAL. */
static inline int upcie_kmod_dmabuf_import_open(struct upcie_kmod_dmabuf_import *ctx)
{
	struct upcie_dmabuf_import_info info;

	if (!ctx)
		return UPCIE_FAIL(-EINVAL, "dmabuf_import: NULL context");
	memset(ctx, 0, sizeof(*ctx));
	memset(&info, 0, sizeof(info));
	return upcie_kmod_open_("UPCIE_KMOD_DMABUF_IMPORT_PATH", UPCIE_DMABUF_IMPORT_DEVICE,
				"dmabuf_import", UPCIE_DMABUF_IMPORT_IDENT,
				UPCIE_KMOD_DMABUF_IMPORT_PACKAGE, UPCIE_DMABUF_IMPORT_IOC_INFO,
				&info, &info.abi, UPCIE_DMABUF_IMPORT_ABI, &ctx->fd);
}

/* Close the context; its attachments go when no dmamem made from it holds the file either.
 * A zeroed or closed context is a no-op. */
static inline void upcie_kmod_dmabuf_import_close(struct upcie_kmod_dmabuf_import *ctx)
{
	if (!ctx || ctx->fd <= 0)
		return;
	close(ctx->fd);
	ctx->fd = 0;
}

/* Module facts: ABI, per-file limit, live attachments over all files. */
static inline int upcie_kmod_dmabuf_import_info(struct upcie_kmod_dmabuf_import *ctx,
						struct upcie_dmabuf_import_info *info)
{
	if (!ctx || ctx->fd <= 0 || !info)
		return UPCIE_FAIL(-EBADF, "dmabuf_import: context not open");
	memset(info, 0, sizeof(*info));
	if (ioctl(ctx->fd, UPCIE_DMABUF_IMPORT_IOC_INFO, info))
		return UPCIE_FAIL(upcie_neg_errno(), "dmabuf_import: INFO: %s",
				  upcie_errno_name(upcie_neg_errno()));
	return 0;
}

/* Words for what ATTACH answered. */
static inline const char *upcie_kmod_dmabuf_why_(int err)
{
	switch (-err) {
	case EBADF:
		return "not an open file descriptor";
	case EINVAL:
		return "not a dma-buf, or the exporter refused the mapping";
	case EMFILE:
		return "this import file holds the module's max_attachments";
	case ENFILE:
		return "all import files together hold the module's max_total_attachments";
	case EDQUOT:
		return "the attachments together would pin more than the module's max_total_mib";
	case EBUSY:
		return "the function, or another function of its IOMMU group, is bound to a driver "
		       "other than uio_pci_generic (vfio-pci owns its DMA, a kernel driver shares "
		       "its "
		       "domain), or its domain is not a kernel DMA domain";
	case ENODEV:
		return "no such PCI function, or no driver is bound to it (bind uio_pci_generic: "
		       "nothing else keeps its DMA domain)";
	case EOPNOTSUPP:
		return "the exporter can neither pin the buffer nor promise not to revoke it "
		       "(attach "
		       "it for the PCI function that uses it, which the module can stop), or DMA "
		       "for "
		       "this device would go through bounce buffers (swiotlb=force or a "
		       "confidential "
		       "guest)";
	case EREMOTEIO:
		return "the exporter cannot reach this device peer to peer";
	case EPERM:
		return "needs CAP_SYS_ADMIN";
	default:
		return upcie_errno_name(err);
	}
}

static inline int upcie_kmod_dmabuf_attach_(struct upcie_kmod_dmabuf_import *ctx,
					    const struct upcie_pci_bdf *bdf, int dmabuf_fd,
					    struct upcie_sg_seg *segs, size_t cap, size_t *nsegs,
					    uint64_t *handle, uint64_t *size, bool keep)
{
	struct upcie_dmabuf_import_attach a;
	char name[UPCIE_PCI_BDF_STRLEN] = "";
	int err;

	if (!ctx || ctx->fd <= 0)
		return UPCIE_FAIL(-EBADF, "dmabuf_import: context not open");
	if (!nsegs || !handle || (cap && !segs))
		return UPCIE_FAIL(-EINVAL, "dmabuf_import: attach needs nsegs, handle and segs");
	memset(&a, 0, sizeof(a));
	a.dmabuf_fd = dmabuf_fd;
	a.segs = (uint64_t)(uintptr_t)segs;
	a.cap = cap > UINT32_MAX ? UINT32_MAX : (uint32_t)cap;
	if (bdf) {
		if (bdf->dev > 31 || bdf->fn > 7)
			return UPCIE_FAIL(-EINVAL, "dmabuf_import: bad PCI function");
		upcie_pci_bdf_format(bdf, name, sizeof(name));
		a.flags = UPCIE_DMABUF_IMPORT_F_PCI;
		a.pci.segment = bdf->domain;
		a.pci.bus = bdf->bus;
		a.pci.devfn = (uint8_t)(bdf->dev << 3 | bdf->fn);
	}
	if (ioctl(ctx->fd, UPCIE_DMABUF_IMPORT_IOC_ATTACH, &a)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "dmabuf_import: attach of fd %d%s%s: %s (%s)", dmabuf_fd,
				  bdf ? " for " : "", name, upcie_kmod_dmabuf_why_(err),
				  upcie_errno_name(err));
	}
	*nsegs = a.nsegs;
	if (a.nsegs > cap && !keep) {
		uint64_t h = a.handle;

		/* Nothing half-done is left behind: the caller retries with room for all. */
		ioctl(ctx->fd, UPCIE_DMABUF_IMPORT_IOC_DETACH, &h);
		UPCIE_DBG("dmabuf_import: fd %d has %u segments, room for %zu", dmabuf_fd, a.nsegs,
			  cap);
		return -ENOSPC;
	}
	*handle = a.handle;
	if (size)
		*size = a.size;
	return 0;
}

/*
 * Attach dma-buf `dmabuf_fd` for the module's own device (CPU physical addresses) and copy its
 * scatter list into segs[0..cap). On success *nsegs is the number of segments and *handle names
 * the attachment. When cap is too small nothing stays attached, *nsegs is the number needed and
 * the result is -ENOSPC. Other errors: -EBADF (context not open, or dmabuf_fd not a descriptor),
 * -EINVAL (not a dma-buf, arguments), -EMFILE, -EOPNOTSUPP, -EPERM, and the exporter's answer;
 * each logged in words.
 */
static inline int upcie_kmod_dmabuf_attach(struct upcie_kmod_dmabuf_import *ctx, int dmabuf_fd,
					   struct upcie_sg_seg *segs, size_t cap, size_t *nsegs,
					   uint64_t *handle)
{
	return upcie_kmod_dmabuf_attach_(ctx, NULL, dmabuf_fd, segs, cap, nsegs, handle, NULL,
					 false);
}

/*
 * As upcie_kmod_dmabuf_attach(), for PCI function `bdf` (bound to uio_pci_generic): the
 * addresses are the ones that function uses (IOVAs in its kernel DMA domain under a translating
 * IOMMU). -EBUSY for a function on vfio-pci or another kernel driver, -ENODEV for none or one
 * with no driver bound.
 */
static inline int upcie_kmod_dmabuf_attach_pci(struct upcie_kmod_dmabuf_import *ctx,
					       const struct upcie_pci_bdf *bdf, int dmabuf_fd,
					       struct upcie_sg_seg *segs, size_t cap, size_t *nsegs,
					       uint64_t *handle)
{
	if (!bdf)
		return UPCIE_FAIL(-EINVAL, "dmabuf_import: NULL PCI function");
	return upcie_kmod_dmabuf_attach_(ctx, bdf, dmabuf_fd, segs, cap, nsegs, handle, NULL,
					 false);
}

/*
 * Copy segments [first, first + cap) of attachment `handle` into segs; *nsegs gets the full
 * count. -ENOENT (no such handle in this file), -ENODEV (its PCI function was removed, or a
 * driver other than uio_pci_generic bound in its IOMMU group), -ESTALE (the exporter revoked the
 * buffer; the module stopped the function and removed the mapping), -EINVAL.
 */
static inline int upcie_kmod_dmabuf_segs(struct upcie_kmod_dmabuf_import *ctx, uint64_t handle,
					 size_t first, struct upcie_sg_seg *segs, size_t cap,
					 size_t *nsegs)
{
	struct upcie_dmabuf_import_get g;
	int err;

	if (!ctx || ctx->fd <= 0)
		return UPCIE_FAIL(-EBADF, "dmabuf_import: context not open");
	if (!nsegs || (cap && !segs) || first > UINT32_MAX)
		return UPCIE_FAIL(-EINVAL, "dmabuf_import: bad segment request");
	memset(&g, 0, sizeof(g));
	g.handle = handle;
	g.segs = (uint64_t)(uintptr_t)segs;
	g.first = (uint32_t)first;
	g.cap = cap > UINT32_MAX ? UINT32_MAX : (uint32_t)cap;
	if (ioctl(ctx->fd, UPCIE_DMABUF_IMPORT_IOC_GET, &g)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "dmabuf_import: segments of handle %" PRIu64 ": %s", handle,
				  err == -ENOENT   ? "no such attachment in this file"
				  : err == -ENODEV ? "its PCI function was removed or rebound"
				  : err == -ESTALE
				      ? "the exporter revoked the buffer (the function was "
					"stopped: bus mastering off, mapping removed)"
				      : upcie_errno_name(err));
	}
	*nsegs = g.nsegs;
	return 0;
}

/* End attachment `handle`. -ENOENT when this file has no such attachment (e.g. detached). */
static inline int upcie_kmod_dmabuf_detach(struct upcie_kmod_dmabuf_import *ctx, uint64_t handle)
{
	int err;

	if (!ctx || ctx->fd <= 0)
		return UPCIE_FAIL(-EBADF, "dmabuf_import: context not open");
	if (ioctl(ctx->fd, UPCIE_DMABUF_IMPORT_IOC_DETACH, &handle)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "dmabuf_import: detach of handle %" PRIu64 ": %s", handle,
				  err == -ENOENT ? "no such attachment in this file"
						 : upcie_errno_name(err));
	}
	return 0;
}

/* Cut a scatter list to its first `size` bytes (the last kept segment trimmed); returns the
 * number of segments kept. */
static inline size_t upcie_kmod_sg_trim_(struct upcie_sg_seg *segs, size_t n, uint64_t size)
{
	uint64_t done = 0;
	size_t keep;

	for (keep = 0; keep < n && done < size; keep++) {
		if (segs[keep].len > size - done)
			segs[keep].len = size - done;
		done += segs[keep].len;
	}
	return keep;
}

/* What the dmamem's release undoes: the attachment, through its own reference to the file. */
struct upcie_dmamem_dmabuf_import_priv_ {
	int fd;
	uint64_t handle;
};

static inline void upcie_dmamem_dmabuf_import_release_(struct upcie_dmamem *mem)
{
	struct upcie_dmamem_dmabuf_import_priv_ *p =
	    (struct upcie_dmamem_dmabuf_import_priv_ *)mem->priv;

	if (!p)
		return;
	if (ioctl(p->fd, UPCIE_DMABUF_IMPORT_IOC_DETACH, &p->handle))
		UPCIE_ERR("dmabuf_import: detach of handle %" PRIu64 " at release: %s", p->handle,
			  upcie_errno_name(upcie_neg_errno()));
	close(p->fd);
	free(p);
	mem->priv = NULL;
}

static inline int upcie_dmamem_dmabuf_import_(struct upcie_dmamem *mem,
					      struct upcie_kmod_dmabuf_import *ctx,
					      const struct upcie_pci_bdf *bdf, int dmabuf_fd,
					      void *vaddr, uint64_t size, unsigned granule_shift)
{
	struct upcie_dmamem_dmabuf_import_priv_ *p;
	struct upcie_sg_seg *segs = NULL;
	uint64_t handle = 0, bufsize = 0;
	size_t n = 0, got = 0, keep;
	int err;

	if (!mem)
		return UPCIE_FAIL(-EINVAL, "dmabuf_import: NULL dmamem");
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	if (!size)
		return UPCIE_FAIL(-EINVAL, "dmabuf_import: zero size");
	p = (struct upcie_dmamem_dmabuf_import_priv_ *)calloc(1, sizeof(*p));
	if (!p)
		return UPCIE_FAIL(-ENOMEM, "dmabuf_import: out of host memory");
	p->fd = -1;
	/* Attach without room, then read the list by handle: one attachment, any length. */
	err = upcie_kmod_dmabuf_attach_(ctx, bdf, dmabuf_fd, NULL, 0, &n, &handle, &bufsize, true);
	if (err)
		goto fail;
	if (size > bufsize) {
		err = UPCIE_FAIL(
		    -EINVAL, "dmabuf_import: size 0x%" PRIx64 " exceeds the dma-buf's 0x%" PRIx64,
		    size, bufsize);
		goto fail_detach;
	}
	segs = (struct upcie_sg_seg *)calloc(n ? n : 1, sizeof(*segs));
	if (!segs) {
		err = UPCIE_FAIL(-ENOMEM, "dmabuf_import: out of host memory for %zu segments", n);
		goto fail_detach;
	}
	err = upcie_kmod_dmabuf_segs(ctx, handle, 0, segs, n, &got);
	if (err)
		goto fail_detach;
	if (got != n) {
		err = UPCIE_FAIL(-EIO, "dmabuf_import: %zu segments became %zu", n, got);
		goto fail_detach;
	}
	keep = upcie_kmod_sg_trim_(segs, n, size);
	err = upcie_dmamem_sglut(mem, vaddr, size, granule_shift, segs, keep);
	if (err)
		goto fail_detach;
	p->fd = fcntl(ctx->fd, F_DUPFD_CLOEXEC, 3);
	if (p->fd < 0) {
		err = UPCIE_FAIL(upcie_neg_errno(), "dmabuf_import: dup of the import file: %s",
				 upcie_errno_name(upcie_neg_errno()));
		upcie_dmamem_destroy(mem);
		goto fail_detach;
	}
	free(segs);
	p->handle = handle;
	mem->release = upcie_dmamem_dmabuf_import_release_;
	mem->priv = p;
	mem->kind = "dmabuf-import";
	return 0;

fail_detach:
	ioctl(ctx->fd, UPCIE_DMABUF_IMPORT_IOC_DETACH, &handle);
fail:
	free(segs);
	free(p);
	memset(mem, 0, sizeof(*mem));
	mem->fd = -1;
	return err;
}

/*
 * Import `dmabuf_fd` and describe its first `size` bytes (normally the buffer's size) as a LUT
 * dmamem at granule 1 << granule_shift (e.g. 16: 64 KiB, the CUDA export granule) with CPU view
 * `vaddr` (NULL: none). The addresses are CPU physical ones (see the file comment). The dmamem
 * holds the attachment and its own reference to the import file: upcie_dmamem_destroy()
 * detaches, and ctx may be closed before. The dma-buf itself stays the caller's. Errors as
 * upcie_kmod_dmabuf_attach(), plus -EINVAL when size exceeds the buffer or the scatter list does
 * not tile it in whole granules (see mem/sglut.h). `mem` is zeroed on failure.
 */
static inline int upcie_dmamem_dmabuf_import(struct upcie_dmamem *mem,
					     struct upcie_kmod_dmabuf_import *ctx, int dmabuf_fd,
					     void *vaddr, uint64_t size, unsigned granule_shift)
{
	return upcie_dmamem_dmabuf_import_(mem, ctx, NULL, dmabuf_fd, vaddr, size, granule_shift);
}

/* As upcie_dmamem_dmabuf_import(), attached for PCI function `bdf` (see the file comment). */
static inline int upcie_dmamem_dmabuf_import_pci(struct upcie_dmamem *mem,
						 struct upcie_kmod_dmabuf_import *ctx,
						 const struct upcie_pci_bdf *bdf, int dmabuf_fd,
						 void *vaddr, uint64_t size, unsigned granule_shift)
{
	if (!bdf) {
		if (mem) {
			memset(mem, 0, sizeof(*mem));
			mem->fd = -1;
		}
		return UPCIE_FAIL(-EINVAL, "dmabuf_import: NULL PCI function");
	}
	return upcie_dmamem_dmabuf_import_(mem, ctx, bdf, dmabuf_fd, vaddr, size, granule_shift);
}

#endif /* UPCIE_KMOD_DMABUF_IMPORT_H */
