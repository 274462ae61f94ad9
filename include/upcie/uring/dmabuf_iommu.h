/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The IOMMU rule for registering device memory whose dma-buf carries physical addresses (CUDA
 * and HIP exports) with the kernel's nvme driver (uring/dmabuf.h): the controller must reach
 * those addresses as they are.
 *
 * upcie_uring_dmabuf_iommu_prepare() finds the NVMe controller behind the block device and asks
 * how the IOMMU treats it (<sysfs>/kernel/iommu_groups/N/type):
 * - no IOMMU, or an identity (passthrough) domain: nothing to do;
 * - a translating domain: the dma-buf's pages are found with the dmabuf_import module (attached
 *   for the module's own device: CPU physical addresses, pinned while attached) and each run is
 *   identity-mapped (IOVA == physical address) into the controller's kernel DMA domain with the
 *   iommu_map_pa module (MAP_BAR: the pages must lie in a PCI BAR, the GPU's; the IOVAs are
 *   inside the host bridge's windows, which the kernel's DMA allocator never hands out). Missing
 *   modules fail with -ENOENT naming their packages; memory outside every BAR (system RAM) is
 *   -EINVAL: such exporters (udmabuf, ...) map themselves for the device and need no rule;
 * - a controller that cannot be found (a native multipath head, a non-NVMe disk) while IOMMU
 *   groups exist: -ENODEV, never a blind registration; a domain type it cannot read: -ENODEV.
 * upcie_uring_dmabuf_iommu_release() undoes it; call it only after the dma-buf's slot was
 * unregistered with no I/O in flight (upcie_uring_dmabuf_unregister() refuses otherwise), since
 * the controller may DMA through these mappings until then.
 *
 * upcie_uring_dmabuf_register_gpu_fd() and _unregister_gpu() wrap the rule around a slot of a
 * dma-buf table (struct upcie_uring_gpu_buf); uring/dmabuf_cuda.h and uring/dmabuf_hip.h export
 * GPU allocations into them.
 *
 * Needs: under a translating IOMMU, the dmabuf_import and iommu_map_pa modules (packages
 * upcie-dmabuf-import-dkms, upcie-iommu-map-pa-dkms) and CAP_SYS_ADMIN.
 * Thread safety: a state belongs to one thread at a time.
 */
#ifndef UPCIE_URING_DMABUF_IOMMU_H
#define UPCIE_URING_DMABUF_IOMMU_H

#include <upcie/base/feature.h>

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/base/sysfs.h>
#include <upcie/kmod/dmabuf_import.h>
#include <upcie/kmod/iommu_map_pa.h>
#include <upcie/pci/bdf.h>
#include <upcie/pci/func.h>
#include <upcie/uring/dmabuf.h>

struct upcie_uring_dmabuf_iommu {
	struct upcie_pci_bdf nvme; /* the controller (valid when found) */
	bool found;		   /* the controller was found */
	enum upcie_pci_iommu mode; /* how the IOMMU treats it */
	unsigned nmaps;		   /* identity mappings made */
	uint64_t *maps;		   /* their handles */
	uint64_t import_handle;
	bool imported;
	struct upcie_kmod_dmabuf_import imp;
	struct upcie_kmod_iommu_map_pa map;
};

/* Whether this system has IOMMU groups at all (<sysfs>/kernel/iommu_groups not empty). */
static inline bool upcie_uring_iommu_groups_exist_(void)
{
	char path[PATH_MAX];
	struct dirent *de;
	bool any = false;
	DIR *d;

	if (upcie_path_fmt(path, sizeof(path), "%s/kernel/iommu_groups", upcie_sysfs_root()))
		return false;
	d = opendir(path);
	if (!d)
		return false;
	while (!any && (de = readdir(d)))
		any = de->d_name[0] != '.';
	closedir(d);
	return any;
}

/* The PCI BAR holding [addr, addr + len). */
struct upcie_uring_bar_find_ {
	uint64_t addr, len;
	struct upcie_pci_bdf bdf;
	unsigned bar;
	uint64_t start;
};

static inline int upcie_uring_bar_find_cb_(const struct upcie_pci_func *fn, void *ctx)
{
	struct upcie_uring_bar_find_ *f = (struct upcie_uring_bar_find_ *)ctx;

	for (unsigned i = 0; i < 6; i++) {
		const struct upcie_pci_resource *r = &fn->res[i];

		if (!r->size || !(r->flags & UPCIE_PCI_RES_MEM))
			continue;
		if (f->addr >= r->start && f->addr - r->start < r->size &&
		    f->len <= r->size - (f->addr - r->start)) {
			f->bdf = fn->bdf;
			f->bar = i;
			f->start = r->start;
			return 1;
		}
	}
	return 0;
}

/* Undo what _prepare() did; safe on a zeroed state and more than once. 0 or the first error. */
static inline int upcie_uring_dmabuf_iommu_release(struct upcie_uring_dmabuf_iommu *st)
{
	int err = 0, e;

	if (!st)
		return 0;
	for (unsigned i = st->nmaps; i-- > 0;) {
		e = upcie_kmod_iommu_map_pa_unmap(&st->map, st->maps[i]);
		if (e && !err)
			err = e;
	}
	free(st->maps);
	st->maps = NULL;
	st->nmaps = 0;
	if (st->map.fd > 0)
		upcie_kmod_iommu_map_pa_close(&st->map);
	if (st->imported) {
		e = upcie_kmod_dmabuf_detach(&st->imp, st->import_handle);
		if (e && !err)
			err = e;
		st->imported = false;
	}
	if (st->imp.fd > 0)
		upcie_kmod_dmabuf_import_close(&st->imp);
	return err;
}

/*
 * Make dma-buf `dmabuf_fd` (physical addresses of device memory) reachable by the NVMe
 * controller behind block device `target_fd`, as described above. 0 (st->nmaps says whether
 * anything was mapped), -ENODEV, -ENOTBLK, -EINVAL, -ENOENT (a module missing), or a module's
 * answer. On failure nothing stays mapped or attached.
 */
static inline int upcie_uring_dmabuf_iommu_prepare(struct upcie_uring_dmabuf_iommu *st,
						   int dmabuf_fd, int target_fd)
{
	struct upcie_sg_seg *segs = NULL;
	size_t nsegs = 0, i;
	char name[UPCIE_PCI_BDF_STRLEN] = "?";
	int err;

	if (!st)
		return UPCIE_FAIL(-EINVAL, "uring: iommu_prepare needs a state");
	memset(st, 0, sizeof(*st));
	err = upcie_uring_nvme_bdf(target_fd, &st->nvme);
	if (err == -ENODEV) {
		if (upcie_uring_iommu_groups_exist_())
			return UPCIE_FAIL(
			    -ENODEV,
			    "uring: the controller behind descriptor %d (and so its "
			    "IOMMU group) cannot be found while this system has IOMMU "
			    "groups; refusing to register device memory it may not "
			    "reach",
			    target_fd);
		st->mode = UPCIE_PCI_IOMMU_NONE;
		return 0;
	}
	if (err)
		return err;
	st->found = true;
	upcie_pci_bdf_format(&st->nvme, name, sizeof(name));
	err = upcie_pci_func_iommu(&st->nvme, &st->mode, NULL, NULL, 0);
	if (err)
		return err;
	if (st->mode == UPCIE_PCI_IOMMU_NONE || st->mode == UPCIE_PCI_IOMMU_IDENTITY)
		return 0;
	if (st->mode != UPCIE_PCI_IOMMU_TRANSLATED)
		return UPCIE_FAIL(-ENODEV, "uring: cannot tell how the IOMMU treats %s", name);

	err = upcie_kmod_dmabuf_import_open(&st->imp);
	if (err)
		goto fail;
	err = upcie_kmod_dmabuf_attach(&st->imp, dmabuf_fd, NULL, 0, &nsegs, &st->import_handle);
	if (err == -ENOSPC && nsegs) {
		segs = (struct upcie_sg_seg *)calloc(nsegs, sizeof(*segs));
		err = segs ? upcie_kmod_dmabuf_attach(&st->imp, dmabuf_fd, segs, nsegs, &nsegs,
						      &st->import_handle)
			   : -ENOMEM;
	}
	if (err)
		goto fail;
	st->imported = true;
	st->maps = (uint64_t *)calloc(nsegs ? nsegs : 1, sizeof(*st->maps));
	if (!st->maps) {
		err = -ENOMEM;
		goto fail;
	}
	err = upcie_kmod_iommu_map_pa_open(&st->map);
	if (err)
		goto fail;
	for (i = 0; i < nsegs; i++) {
		struct upcie_uring_bar_find_ f;
		struct upcie_kmod_bar_map out;
		size_t j = i;

		memset(&f, 0, sizeof(f));
		f.addr = segs[i].addr;
		f.len = segs[i].len;
		/* one mapping for a run of adjacent segments */
		while (j + 1 < nsegs && segs[j + 1].addr == segs[j].addr + segs[j].len) {
			f.len += segs[j + 1].len;
			j++;
		}
		if (upcie_pci_scan(upcie_uring_bar_find_cb_, &f) != 1) {
			err = UPCIE_FAIL(-EINVAL,
					 "uring: dma-buf %d: 0x%" PRIx64 " + 0x%" PRIx64
					 " lies in no PCI BAR (system memory: its exporter maps it "
					 "for the device, no identity mapping is needed or made)",
					 dmabuf_fd, f.addr, f.len);
			goto fail;
		}
		err = upcie_kmod_iommu_map_pa_map_bar(&st->map, &st->nvme, &f.bdf, f.bar,
						      f.addr - f.start, f.len, 0, &out);
		if (err)
			goto fail;
		if (out.handle)
			st->maps[st->nmaps++] = out.handle;
		i = j;
	}
	free(segs);
	return 0;
fail:
	free(segs);
	upcie_uring_dmabuf_iommu_release(st);
	return err;
}

/* A GPU range registered with a dma-buf table. */
struct upcie_uring_gpu_buf {
	unsigned slot;
	int dmabuf_fd; /* -1 when not registered */
	uint64_t size;
	struct upcie_uring_dmabuf_iommu iommu;
};

/*
 * Register an exported dma-buf `fd` of `size` bytes of device memory (physical addresses: a
 * CUDA or HIP export) for I/O on block device `target_fd`: the IOMMU rule, then a slot. The
 * buffer takes fd over: on failure it is closed and nothing stays mapped.
 */
static inline int upcie_uring_dmabuf_register_gpu_fd(struct upcie_uring_dmabufs *t, int fd,
						     uint64_t size, int target_fd,
						     struct upcie_uring_gpu_buf *b)
{
	int err;

	if (!t || !b || fd < 0)
		return UPCIE_FAIL(-EINVAL,
				  "uring: register_gpu_fd needs a table, a buffer and a fd");
	memset(b, 0, sizeof(*b));
	b->dmabuf_fd = -1;
	err = upcie_uring_dmabuf_iommu_prepare(&b->iommu, fd, target_fd);
	if (!err) {
		err = upcie_uring_dmabuf_register(t, fd, target_fd, &b->slot);
		if (err)
			upcie_uring_dmabuf_iommu_release(&b->iommu);
	}
	if (err) {
		close(fd);
		return err;
	}
	b->dmabuf_fd = fd;
	b->size = size;
	return 0;
}

/*
 * Unregister a GPU range: -EBUSY while I/O on its slot is in flight (nothing changes); then the
 * IOMMU mappings go and the dma-buf is closed. 0, or the first error of the teardown.
 */
static inline int upcie_uring_dmabuf_unregister_gpu(struct upcie_uring_dmabufs *t,
						    struct upcie_uring_gpu_buf *b)
{
	int err;

	if (!t || !b || b->dmabuf_fd < 0)
		return UPCIE_FAIL(-EINVAL, "uring: unregister_gpu of a buffer not registered");
	err = upcie_uring_dmabuf_unregister(t, b->slot);
	if (err)
		return err;
	err = upcie_uring_dmabuf_iommu_release(&b->iommu);
	close(b->dmabuf_fd);
	b->dmabuf_fd = -1;
	return err;
}

#endif /* UPCIE_URING_DMABUF_IOMMU_H */
