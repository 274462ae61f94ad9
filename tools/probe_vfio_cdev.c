/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * probe_vfio_cdev: what the running kernel's vfio cdev and iommufd accept.
 *
 * Opens /dev/iommu, allocates an IOAS, binds the function's vfio cdev and attaches it, reporting
 * each step's answer. Then asks IOMMU_IOAS_MAP_FILE to map every kind of file at hand: a memfd
 * first, as the control (a MAP_FILE that refuses everything says nothing about dma-bufs in
 * particular), a hugetlb memfd, then dma-bufs from udmabuf, vgem and vfio-pci's own BAR export.
 * GPU exports are asked the same question by probe_dmabuf_cuda / probe_dmabuf_hip. Then the BAR
 * export itself (VFIO_DEVICE_FEATURE_DMA_BUF on a slice of a BAR): whether the kernel offers it,
 * the size the descriptor reports, that the descriptor carries no CPU mapping (mmap of it fails:
 * the errno), what the kernel says to an unaligned slice, and the route the export replaces:
 * IOMMU_IOAS_MAP of the BAR's own mmap (PFNMAP), or type1 VFIO_IOMMU_MAP_DMA of it. Where the
 * kernel has no cdev (before 6.6, or built without VFIO_DEVICE_CDEV) the device is opened through
 * its type1 group, so the export questions still get their answers.
 *
 * Usage: probe_vfio_cdev BDF [--bar N]   (also -h/--help, --version; tools/opt.h parses)
 * The function must be bound to vfio-pci; the default BAR is the largest mappable memory BAR.
 * Prints findings and exits 0; 2 for usage errors (with a message naming the argument), 1 when
 * it could not run at all.
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/vfio.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <upcie/base/bits.h>
#include <upcie/pci/bdf.h>
#include <upcie/pci/driver.h>
#include <upcie/vfio/cdev.h>
#include <upcie/vfio/dmabuf.h>
#include <upcie/vfio/iommufd.h>
#include <upcie/vfio/type1.h>
#include <upcie/vfio/uapi.h>

#include "opt.h"
#include "probe_common.h"

/* DRM UAPI layouts (drm.h, drm_mode.h): bookworm's kernel headers do not ship them. */
struct probe_drm_version {
	int version_major;
	int version_minor;
	int version_patchlevel;
	size_t name_len;
	char *name;
	size_t date_len;
	char *date;
	size_t desc_len;
	char *desc;
};

struct probe_drm_create_dumb {
	uint32_t height;
	uint32_t width;
	uint32_t bpp;
	uint32_t flags;
	uint32_t handle;
	uint32_t pitch;
	uint64_t size;
};

struct probe_drm_prime_handle {
	uint32_t handle;
	uint32_t flags;
	int32_t fd;
};

#define PROBE_DRM_IOCTL_VERSION		   _IOWR('d', 0x00, struct probe_drm_version)
#define PROBE_DRM_IOCTL_MODE_CREATE_DUMB   _IOWR('d', 0xb2, struct probe_drm_create_dumb)
#define PROBE_DRM_IOCTL_PRIME_HANDLE_TO_FD _IOWR('d', 0x2d, struct probe_drm_prime_handle)

#define SLICE (2 * PROBE_MiB) /* size of the memfd, udmabuf and vgem buffers */

/* A dma-buf from vgem: a dumb buffer exported with PRIME. *card gets the node used. */
static int vgem_get(uint64_t size, int *out, char *card, size_t cardlen)
{
	int err = -ENOENT;

	*out = -1;
	for (int i = 0; i < 16; i++) {
		struct probe_drm_version v;
		struct probe_drm_create_dumb cd;
		struct probe_drm_prime_handle ph;
		char path[32], name[32];
		int dev;

		snprintf(path, sizeof(path), "/dev/dri/card%d", i);
		dev = open(path, O_RDWR | O_CLOEXEC);
		if (dev < 0)
			continue;
		memset(&v, 0, sizeof(v));
		memset(name, 0, sizeof(name));
		v.name = name;
		v.name_len = sizeof(name) - 1;
		if (ioctl(dev, PROBE_DRM_IOCTL_VERSION, &v) || strcmp(name, "vgem")) {
			close(dev);
			continue;
		}
		snprintf(card, cardlen, "%s", path);
		memset(&cd, 0, sizeof(cd));
		cd.width = 1024;
		cd.bpp = 32;
		cd.height = (uint32_t)(size / (1024 * 4));
		err = 0;
		if (ioctl(dev, PROBE_DRM_IOCTL_MODE_CREATE_DUMB, &cd))
			err = -errno;
		if (!err) {
			memset(&ph, 0, sizeof(ph));
			ph.handle = cd.handle;
			ph.flags = O_RDWR | O_CLOEXEC;
			err = ioctl(dev, PROBE_DRM_IOCTL_PRIME_HANDLE_TO_FD, &ph) ? -errno : 0;
			*out = err ? -1 : ph.fd;
		}
		close(dev); /* the dma-buf keeps the buffer object */
		return err;
	}
	return err;
}

/* IOMMU_IOAS_MAP_FILE of [start, start+len) of fd: the answer, and an unmap when it was ok. */
static void map_file_try(const struct upcie_vfio_ioas *ioas, const char *what, int fd,
			 uint64_t start, uint64_t len)
{
	char exp[64];
	int64_t size;
	uint64_t iova = 0;
	int err;

	probe_dmabuf_facts(fd, &size, exp, sizeof(exp));
	err = upcie_vfio_ioas_map_file(ioas, fd, start, len, 0, &iova);
	if (err)
		probe_say("  MAP_FILE %-26s [+0x%" PRIx64 ", %s) of %s%s%s: refused, %s", what,
			  start, probe_size(len), size < 0 ? "?" : probe_size((uint64_t)size),
			  exp[0] ? ", exporter " : "", exp, probe_err(err));
	else
		probe_say("  MAP_FILE %-26s [+0x%" PRIx64 ", %s) of %s%s%s: ok, IOVA 0x%" PRIx64,
			  what, start, probe_size(len), size < 0 ? "?" : probe_size((uint64_t)size),
			  exp[0] ? ", exporter " : "", exp, iova);
	if (!err)
		upcie_vfio_ioas_unmap(ioas, iova, len);
}

/* VFIO_DEVICE_FEATURE_DMA_BUF built by hand, for slices the wrapper would refuse itself. */
static int bar_export_raw(int devfd, uint32_t bar, uint64_t off, uint64_t len, int *fd)
{
	union {
		uint64_t align;
		unsigned char b[sizeof(struct vfio_device_feature) +
				sizeof(struct upcie_vfio_device_feature_dma_buf) +
				sizeof(struct upcie_vfio_region_dma_range)];
	} a;
	struct vfio_device_feature feat;
	struct upcie_vfio_device_feature_dma_buf db;
	struct upcie_vfio_region_dma_range r;
	int n;

	memset(&a, 0, sizeof(a));
	memset(&feat, 0, sizeof(feat));
	memset(&db, 0, sizeof(db));
	feat.argsz = sizeof(a.b);
	feat.flags = VFIO_DEVICE_FEATURE_GET | UPCIE_VFIO_DEVICE_FEATURE_DMA_BUF;
	db.region_index = bar;
	db.open_flags = O_RDWR | O_CLOEXEC;
	db.nr_ranges = 1;
	r.offset = off;
	r.length = len;
	memcpy(a.b, &feat, sizeof(feat));
	memcpy(a.b + sizeof(feat), &db, sizeof(db));
	memcpy(a.b + sizeof(feat) + sizeof(db), &r, sizeof(r));
	n = ioctl(devfd, VFIO_DEVICE_FEATURE, a.b);
	*fd = n;
	return n < 0 ? -errno : 0;
}

static void bar_export_questions(const struct upcie_vfio_device *dev,
				 const struct upcie_vfio_ioas *ioas, uint32_t bar, uint64_t barsz)
{
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), off, len;
	char exp[64];
	int64_t size;
	void *m;
	int fd = -1, err;

	off = barsz >= 8 * pg ? upcie_align_down(barsz / 4, pg) : 0;
	len = barsz - off < PROBE_MiB ? upcie_align_down(barsz - off, pg) : PROBE_MiB;
	probe_say("BAR dma-buf export (VFIO_DEVICE_FEATURE_DMA_BUF) of BAR%u [+0x%" PRIx64 ", %s):",
		  bar, off, probe_size(len));
	err = upcie_vfio_dmabuf_probe(dev);
	probe_say("  feature probe: %s", err ? probe_err(err) : "offered");
	if (!len) {
		probe_say("  BAR%u is smaller than a page: no slice to export", bar);
		return;
	}
	err = upcie_vfio_dmabuf_export(dev, bar, off, len, &fd);
	probe_say("  export: %s", err ? probe_err(err) : "ok");
	if (err)
		return;
	probe_dmabuf_facts(fd, &size, exp, sizeof(exp));
	probe_say("  the descriptor: exporter %s, size %s (lseek SEEK_END)%s", exp[0] ? exp : "?",
		  size < 0 ? probe_err((int)size) : probe_size((uint64_t)size),
		  size == (int64_t)len ? ", the slice asked for" : "");
	m = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		probe_say("  mmap of the descriptor (read-only): %s: no CPU mapping",
			  probe_err(errno));
	} else {
		probe_say("  mmap of the descriptor (read-only): ok (it does carry a CPU mapping)");
		munmap(m, (size_t)len);
	}
	if (ioas) {
		map_file_try(ioas, "vfio BAR dma-buf", fd, 0, len);
		if (len >= 2 * pg)
			map_file_try(ioas, "vfio BAR dma-buf, inside", fd, pg, pg);
	}
	close(fd);
	err = bar_export_raw(dev->fd, bar, off + 128, len, &fd);
	probe_say("  export at an unaligned offset (+0x%" PRIx64 "): %s", off + 128,
		  err ? probe_err(err) : "accepted");
	if (!err)
		close(fd);
	err = bar_export_raw(dev->fd, bar, off, len + 128, &fd);
	probe_say("  export of an unaligned length (%s): %s", probe_size(len + 128),
		  err ? probe_err(err) : "accepted");
	if (!err)
		close(fd);
	err = bar_export_raw(dev->fd, bar, 0, barsz + pg, &fd);
	probe_say("  export past the end of the BAR (%s): %s", probe_size(barsz + pg),
		  err ? probe_err(err) : "accepted");
	if (!err)
		close(fd);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: probe_vfio_cdev BDF [--bar N]\n"
		"  BDF        a function bound to vfio-pci, DDDD:BB:DD.F or BB:DD.F\n"
		"  --bar N    the BAR to export, 0..5 (default the largest mappable one)\n"
		"  -h, --help this text; --version the version\n"
		"Prints what the kernel answered and exits 0; 2 for usage errors, 1 when it could\n"
		"not run at all.\n");
}

enum { CDEV_O_BAR = 256, CDEV_O_VERSION };

static const struct option cdev_long_opts[] = {
	{ "bar", required_argument, NULL, CDEV_O_BAR },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, CDEV_O_VERSION },
	{ NULL, 0, NULL, 0 },
};

int main(int argc, char **argv)
{
	struct upcie_vfio_container container;
	struct upcie_vfio_group group;
	struct upcie_vfio_iommufd ictx;
	struct upcie_vfio_ioas ioas;
	struct upcie_vfio_device dev;
	struct upcie_vfio_iova_ranges ranges;
	struct upcie_vfio_region reg;
	struct upcie_pci_bdf addr;
	char drv[64] = "", card[32] = "", cdev[32] = "";
	uint64_t barsz = 0, iova = 0;
	int have_ioas = 0, via_type1 = 0, want_bar = -1, bar = -1, err, fd, id, c;
	const char *bdf;

	opt_tool = "probe_vfio_cdev";
	argv[0] = (char *)opt_tool; /* getopt's own messages name the probe */
	while ((c = getopt_long(argc, argv, "h", cdev_long_opts, NULL)) != -1) {
		unsigned v = 0;

		switch (c) {
		case CDEV_O_BAR:
			if (opt_unsigned(optarg, 0, VFIO_PCI_BAR5_REGION_INDEX, &v))
				return opt_bad("--bar", optarg, "a BAR index 0..5");
			want_bar = (int)v;
			break;
		case 'h':
			usage(stdout);
			return PROBE_EXIT_OK;
		case CDEV_O_VERSION:
			return opt_version();
		default:
			return opt_unknown();
		}
	}
	if (optind == argc)
		return opt_usage_error("BDF (a function bound to vfio-pci) is missing");
	if (optind + 1 < argc)
		return opt_bad("argument", argv[optind + 1], "one BDF");
	bdf = argv[optind];
	if (upcie_pci_bdf_parse_quiet_(bdf, &addr))
		return opt_bad("BDF", bdf, "a PCI address DDDD:BB:DD.F or BB:DD.F");
	memset(&container, 0, sizeof(container));
	memset(&group, 0, sizeof(group));
	memset(&ictx, 0, sizeof(ictx));
	memset(&ioas, 0, sizeof(ioas));
	memset(&dev, 0, sizeof(dev));

	probe_begin("probe_vfio_cdev", "what vfio cdev + iommufd accept: bind/attach, "
				       "IOMMU_IOAS_MAP_FILE of each file kind, BAR dma-buf export");
	upcie_pci_driver_get(&addr, drv, sizeof(drv));
	probe_say("device: %s, driver %s", bdf, drv[0] ? drv : "(none)");
	probe_say(
	    "present: /dev/iommu %s, /dev/vfio/vfio %s, /dev/vfio/devices %s, /dev/udmabuf %s",
	    access("/dev/iommu", F_OK) ? "no" : "yes",
	    access("/dev/vfio/vfio", F_OK) ? "no" : "yes",
	    access("/dev/vfio/devices", F_OK) ? "no" : "yes",
	    access("/dev/udmabuf", F_OK) ? "no" : "yes");

	err = upcie_vfio_iommufd_open(&ictx);
	probe_say("iommufd: open /dev/iommu: %s", err ? probe_err(err) : "ok");
	if (!err) {
		err = upcie_vfio_ioas_alloc(&ioas, &ictx);
		probe_say("iommufd: IOMMU_IOAS_ALLOC: %s", err ? probe_err(err) : "ok");
		have_ioas = !err;
		if (have_ioas)
			probe_say("iommufd: IOAS id %u", ioas.id);
	}
	err = upcie_vfio_cdev_find(&addr, cdev, sizeof(cdev));
	probe_say("cdev: vfio-dev entry in sysfs: %s%s", err ? probe_err(err) : "ok, ",
		  err ? "" : cdev);
	if (!err && ictx.fd > 0) {
		err = upcie_vfio_cdev_open(&dev, &ictx, &addr);
		probe_say("cdev: open /dev/vfio/devices/%s + VFIO_DEVICE_BIND_IOMMUFD: %s", cdev,
			  err ? probe_err(err) : "ok");
		if (!err)
			probe_say("cdev: bound, devid %u", dev.devid);
		if (!err && have_ioas) {
			err = upcie_vfio_cdev_attach(&dev, &ioas);
			probe_say("cdev: VFIO_DEVICE_ATTACH_IOMMUFD_PT to IOAS %u: %s", ioas.id,
				  err ? probe_err(err) : "ok");
			if (!err)
				probe_say("cdev: attached, page table (hwpt) id %u", dev.hwpt_id);
		}
	} else if (!err) {
		probe_say("cdev: not tried (no iommufd)");
	}
	if (have_ioas && !upcie_vfio_ioas_iova_ranges(&ioas, &ranges)) {
		for (uint32_t i = 0; i < ranges.n; i++)
			probe_say("iommufd: IOVA range [0x%" PRIx64 ", 0x%" PRIx64 "]",
				  ranges.r[i].start, ranges.r[i].last);
		probe_say("iommufd: IOVA alignment 0x%" PRIx64, ranges.align);
	}
	if (dev.fd <= 0) {
		/* no cdev: the BAR export questions are asked through the type1 group */
		err = upcie_vfio_container_open(&container);
		if (!err) {
			id = upcie_vfio_group_id(&addr);
			err = id < 0 ? id : upcie_vfio_group_open(&group, &container, id);
		}
		if (!err)
			err = upcie_vfio_device_open(&dev, &group, &addr);
		probe_say("type1: device through its group (for the export questions): %s",
			  err ? probe_err(err) : "ok");
		via_type1 = !err;
	}

	if (have_ioas) {
		probe_say("IOMMU_IOAS_MAP_FILE, one file kind after the other (memfd is the "
			  "control):");
		err = probe_memfd(SLICE, &fd);
		if (err)
			probe_say("  memfd: %s", probe_err(err));
		else
			map_file_try(&ioas, "memfd (shmem)", fd, 0, SLICE);
		if (fd >= 0)
			close(fd);
		fd = memfd_create("upcie-probe-huge", MFD_CLOEXEC | MFD_HUGETLB);
		if (fd < 0 || ftruncate(fd, (off_t)SLICE))
			probe_say("  hugetlb memfd: %s", probe_err(errno));
		else
			map_file_try(&ioas, "memfd (hugetlb 2 MiB)", fd, 0, SLICE);
		if (fd >= 0)
			close(fd);
		err = probe_udmabuf(SLICE, &fd);
		if (err)
			probe_say("  udmabuf: could not make one: %s", probe_err(err));
		else
			map_file_try(&ioas, "udmabuf dma-buf", fd, 0, SLICE);
		if (fd >= 0)
			close(fd);
		err = vgem_get(SLICE, &fd, card, sizeof(card));
		if (err)
			probe_say("  vgem: could not make one%s%s: %s", card[0] ? " on " : "", card,
				  probe_err(err));
		else
			map_file_try(&ioas, "vgem dma-buf", fd, 0, SLICE);
		if (fd >= 0)
			close(fd);
		probe_say("  (the vfio BAR dma-buf follows with the export questions; GPU exports: "
			  "probe_dmabuf_cuda / probe_dmabuf_hip)");
	} else {
		probe_say("IOMMU_IOAS_MAP_FILE: not asked, no IOAS on this kernel");
	}

	if (dev.fd <= 0) {
		probe_say("no device descriptor: the BAR questions cannot be asked");
		goto out;
	}
	for (uint32_t i = 0; i <= VFIO_PCI_BAR5_REGION_INDEX; i++) {
		struct vfio_region_info info;

		if (upcie_vfio_region_info(&dev, i, &info) || !info.size)
			continue;
		probe_say("BAR%u: %s%s", i, probe_size(info.size),
			  (info.flags & VFIO_REGION_INFO_FLAG_MMAP) ? ", mappable" : "");
		if (!(info.flags & VFIO_REGION_INFO_FLAG_MMAP))
			continue;
		if (want_bar < 0 ? info.size > barsz : (int)i == want_bar) {
			bar = (int)i;
			barsz = info.size;
		}
	}
	if (bar < 0) {
		probe_say("no mappable memory BAR%s", want_bar < 0 ? "" : " of the one asked for");
		goto out;
	}
	bar_export_questions(&dev, have_ioas && dev.devid ? &ioas : NULL, (uint32_t)bar, barsz);

	err = upcie_vfio_region_map(&dev, (uint32_t)bar, &reg);
	probe_say("BAR%d mmap through vfio: %s", bar, err ? probe_err(err) : "ok");
	if (!err && have_ioas && dev.devid) {
		err = upcie_vfio_ioas_map(&ioas, reg.addr, reg.size, 0, &iova);
		probe_say("  IOMMU_IOAS_MAP of that mmap (PFNMAP): %s",
			  err ? probe_err(err) : "ok");
		if (!err)
			upcie_vfio_ioas_unmap(&ioas, iova, reg.size);
	}
	if (!err && via_type1) {
		iova = UINT64_C(0x100000000);
		err = upcie_vfio_dma_map(&container, reg.addr, reg.size, iova);
		probe_say("  type1 VFIO_IOMMU_MAP_DMA of that mmap at IOVA 0x%" PRIx64 ": %s", iova,
			  err ? probe_err(err) : "ok");
		if (!err)
			upcie_vfio_dma_unmap(&container, reg.size, iova);
	}
	upcie_vfio_region_unmap(&reg);
out:
	upcie_vfio_device_close(&dev);
	upcie_vfio_group_close(&group);
	upcie_vfio_container_close(&container);
	upcie_vfio_iommufd_close(&ictx);
	return PROBE_EXIT_OK;
}
