/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vfio with the type1 IOMMU backend (VFIO_TYPE1v2_IOMMU): container, groups, devices through a
 * group, the container's IOVA ranges, DMA mappings. Works on every kernel upcie supports (6.1+).
 *
 * Needs: the function bound to vfio-pci, its IOMMU group viable (every function in the group
 * bound to vfio-pci or unbound), read/write access to /dev/vfio/vfio and /dev/vfio/<group>, and
 * RLIMIT_MEMLOCK covering the memory that gets mapped. Several groups (an NVMe controller and a
 * peer device whose BAR receives its DMA) share one container and so one IOVA space.
 * The kernel lets a group file be open once, and a group can hold several functions (the
 * functions of a multi-function device, or devices behind a switch without ACS): the container
 * keeps one refcounted open per group id, and every upcie_vfio_group_open() of the same id in
 * the same container shares it, so each function's device fd comes from the one group file.
 * The container carries an IOVA allocator (vfio/iova.h) over the ranges VFIO_IOMMU_GET_INFO
 * reports, refreshed whenever a group joins; mem/dmamem_type1.h maps memory through it. It also
 * follows the DMA-mapping budget the kernel reports (dma_avail: vfio_iommu_type1's
 * dma_entry_limit, 65535 mappings by default) and names it when a mapping is refused for it.
 * Region, reset and IRQ code works on the device fd and lives in vfio/device.h and vfio/irq.h.
 * vfio's no-IOMMU mode (enable_unsafe_noiommu_mode) is refused with a message: it has no IOMMU
 * to map DMA through, which is all this path does; the uio path handles physical addresses.
 * Does not: handle the iommufd/cdev path (vfio/cdev.h, vfio/iommufd.h). Thread safety: opening
 * and closing containers and groups is the owner's; map/unmap may run on any thread.
 *
 * File descriptors: see vfio/device.h (fd <= 0 in a zeroed struct means "not open").
 */
#ifndef UPCIE_VFIO_TYPE1_H
#define UPCIE_VFIO_TYPE1_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/vfio.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/base/sysfs.h>
#include <upcie/pci/func.h>
#include <upcie/vfio/device.h>
#include <upcie/vfio/iova.h>

/* One open group file of a container, shared by every upcie_vfio_group of that id. */
struct upcie_vfio_group_ref_ {
	int id;
	int fd;
	int refs;
};

struct upcie_vfio_container {
	int fd;	       /* /dev/vfio/vfio, or -1 */
	int iommu_set; /* VFIO_SET_IOMMU done (after the first group joined) */
	int ngroups;   /* groups attached; the kernel drops the IOMMU with the last one */
	/* IOVAs for mappings into this container; ready once the first group joined */
	struct upcie_vfio_iova_space iovas;
	struct upcie_vfio_group_ref_ *groups; /* the ngroups open group files */
	uint64_t gen;			      /* non-zero while open, new on every open */
	/* mappings the kernel still allows (its dma_avail), when it reports a budget */
	uint32_t dma_avail;
	bool dma_budget;   /* the kernel reported one (Linux >= 5.10) */
	uint32_t dma_maps; /* mappings made through this container and not yet unmapped */
};

/* A handle on a group in a container; handles of the same id share one open group file. */
struct upcie_vfio_group {
	int fd; /* /dev/vfio/<id> (shared, owned by the container), or -1 */
	int id;
	struct upcie_vfio_container *container;
	uint64_t cgen; /* the container's generation when the handle was opened */
};

/* What VFIO_IOMMU_GET_INFO says about a type1 container. */
struct upcie_vfio_type1_info {
	uint64_t pgsizes;   /* bitmap of IOMMU page sizes */
	uint32_t dma_avail; /* mappings the container may still create; UINT32_MAX: not reported */
	bool have_ranges;   /* the IOVA-range capability was present */
	struct upcie_vfio_iova_ranges ranges;
};

/* Open the container and check the API version and type1v2 support. */
static inline int upcie_vfio_container_open(struct upcie_vfio_container *c)
{
	int fd, ver;

	if (!c)
		return UPCIE_FAIL(-EINVAL, "vfio: NULL container");
	memset(c, 0, sizeof(*c));
	c->fd = -1;
	fd = upcie_vfio_fd_not_zero_(open("/dev/vfio/vfio", O_RDWR | O_CLOEXEC));
	if (fd < 0) {
		int err = upcie_neg_errno();

		return UPCIE_FAIL(err, "vfio: open /dev/vfio/vfio: %s (modprobe vfio-pci)",
				  strerror(-err));
	}
	ver = ioctl(fd, VFIO_GET_API_VERSION);
	if (ver != VFIO_API_VERSION) {
		close(fd);
		return UPCIE_FAIL(-EPROTO, "vfio: API version %d, want %d", ver, VFIO_API_VERSION);
	}
	if (ioctl(fd, VFIO_CHECK_EXTENSION, VFIO_TYPE1v2_IOMMU) <= 0) {
		close(fd);
		return UPCIE_FAIL(-EOPNOTSUPP, "vfio: the type1v2 IOMMU backend is not available "
					       "(modprobe vfio_iommu_type1)");
	}
	c->fd = fd;
	c->gen = upcie_vfio_iova_gen_new_();
	return 0;
}

/*
 * Close the container (the kernel drops its mappings) and the group files still open in it;
 * group handles left open become no-ops to close. Zeroed or closed: no-op.
 */
static inline void upcie_vfio_container_close(struct upcie_vfio_container *c)
{
	if (!c)
		return;
	for (int i = 0; c->groups && i < c->ngroups; i++) {
		ioctl(c->groups[i].fd, VFIO_GROUP_UNSET_CONTAINER);
		close(c->groups[i].fd);
	}
	free(c->groups);
	c->groups = NULL;
	if (c->fd > 0)
		close(c->fd);
	upcie_vfio_iova_space_fini(&c->iovas);
	c->fd = -1;
	c->iommu_set = 0;
	c->ngroups = 0;
	c->gen = 0;
	c->dma_avail = 0;
	c->dma_budget = false;
	c->dma_maps = 0;
}

static inline int upcie_vfio_container_check_(const struct upcie_vfio_container *c,
					      const char *what)
{
	if (!c || c->fd <= 0)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: container not open", what);
	if (!c->iommu_set)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: no group attached to the container yet",
				  what);
	return 0;
}

/*
 * Parse a VFIO_IOMMU_GET_INFO answer of `len` bytes: page sizes, the IOVA-range capability and
 * the DMA-mapping budget. A capability chain must lie inside the buffer with strictly increasing
 * offsets (the kernel appends capabilities, so a chain that goes back is a loop); anything else
 * is -EPROTO. More ranges than UPCIE_VFIO_IOVA_RANGES_MAX is -E2BIG.
 */
static inline int upcie_vfio_type1_info_parse(const void *buf, size_t len,
					      struct upcie_vfio_type1_info *out)
{
	struct vfio_iommu_type1_info info;
	const unsigned char *p = (const unsigned char *)buf;
	bool seen_avail = false;
	uint32_t off;

	if (!buf || !out)
		return UPCIE_FAIL(-EINVAL, "vfio: type1 info: NULL argument");
	memset(out, 0, sizeof(*out));
	out->dma_avail = UINT32_MAX;
	if (len < sizeof(info))
		return UPCIE_FAIL(-EPROTO, "vfio: type1 info: %zu bytes, want at least %zu", len,
				  sizeof(info));
	memcpy(&info, p, sizeof(info));
	if (info.flags & VFIO_IOMMU_INFO_PGSIZES)
		out->pgsizes = info.iova_pgsizes;
	if (out->pgsizes)
		out->ranges.align = out->pgsizes & (~out->pgsizes + 1); /* lowest set bit */
	if (!(info.flags & VFIO_IOMMU_INFO_CAPS) || !info.cap_offset)
		return 0;
	for (off = info.cap_offset; off;) {
		struct vfio_info_cap_header hdr;

		if (off < sizeof(info) || off > len || len - off < sizeof(hdr))
			return UPCIE_FAIL(-EPROTO,
					  "vfio: type1 info: capability at offset %u outside the "
					  "%zu-byte answer",
					  off, len);
		memcpy(&hdr, p + off, sizeof(hdr));
		if (hdr.next && hdr.next <= off)
			return UPCIE_FAIL(-EPROTO,
					  "vfio: type1 info: capability chain goes back from %u to "
					  "%u (a loop)",
					  off, hdr.next);
		if (hdr.id == VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE) {
			struct vfio_iommu_type1_info_cap_iova_range cap;
			size_t end = hdr.next ? hdr.next : len, need;

			if (end > len)
				end = len;
			if (out->have_ranges)
				return UPCIE_FAIL(-EPROTO,
						  "vfio: type1 info: two IOVA-range capabilities");
			if (end - off < sizeof(cap))
				return UPCIE_FAIL(
				    -EPROTO, "vfio: type1 info: truncated IOVA-range capability");
			memcpy(&cap, p + off, sizeof(cap));
			need = sizeof(cap) + (size_t)cap.nr_iovas * sizeof(struct vfio_iova_range);
			if (cap.nr_iovas > (end - off) / sizeof(struct vfio_iova_range) ||
			    need > end - off)
				return UPCIE_FAIL(
				    -EPROTO,
				    "vfio: type1 info: %u IOVA ranges do not fit in the "
				    "capability at offset %u",
				    cap.nr_iovas, off);
			if (cap.nr_iovas > UPCIE_VFIO_IOVA_RANGES_MAX)
				return UPCIE_FAIL(-E2BIG,
						  "vfio: type1 info: %u IOVA ranges, at most %d "
						  "supported",
						  cap.nr_iovas, UPCIE_VFIO_IOVA_RANGES_MAX);
			for (uint32_t i = 0; i < cap.nr_iovas; i++) {
				struct vfio_iova_range r;

				memcpy(&r, p + off + sizeof(cap) + i * sizeof(r), sizeof(r));
				out->ranges.r[i].start = r.start;
				out->ranges.r[i].last = r.end;
			}
			out->ranges.n = cap.nr_iovas;
			if (upcie_vfio_iova_ranges_check(&out->ranges))
				return UPCIE_FAIL(-EPROTO,
						  "vfio: type1 info: malformed IOVA ranges");
			out->have_ranges = true;
		} else if (hdr.id == VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL) {
			struct vfio_iommu_type1_info_dma_avail cap;

			if (seen_avail || len - off < sizeof(cap) ||
			    (hdr.next && hdr.next - off < sizeof(cap)))
				return UPCIE_FAIL(-EPROTO,
						  "vfio: type1 info: bad DMA-available capability");
			memcpy(&cap, p + off, sizeof(cap));
			out->dma_avail = cap.avail;
			seen_avail = true;
		}
		off = hdr.next;
	}
	return 0;
}

/*
 * VFIO_IOMMU_GET_INFO of the container (a group must have joined): page sizes, IOVA ranges, DMA
 * mapping budget. Returns 0, -EINVAL, -ENOMEM, -EPROTO for a malformed answer, or the ioctl's
 * error.
 */
static inline int upcie_vfio_container_info(const struct upcie_vfio_container *c,
					    struct upcie_vfio_type1_info *out)
{
	struct vfio_iommu_type1_info head;
	unsigned char *buf;
	size_t len;
	int err;

	if (!out)
		return UPCIE_FAIL(-EINVAL, "vfio: container info: NULL output");
	err = upcie_vfio_container_check_(c, "container info");
	if (err)
		return err;
	memset(&head, 0, sizeof(head));
	head.argsz = sizeof(head);
	if (ioctl(c->fd, VFIO_IOMMU_GET_INFO, &head)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: VFIO_IOMMU_GET_INFO: %s", strerror(-err));
	}
	len = head.argsz > sizeof(head) ? head.argsz : sizeof(head);
	/* The capability chain only comes back when argsz covers it: ask again with room. */
	buf = (unsigned char *)calloc(1, len);
	if (!buf)
		return UPCIE_FAIL(-ENOMEM, "vfio: out of memory for %zu bytes of IOMMU info", len);
	((struct vfio_iommu_type1_info *)(void *)buf)->argsz = (uint32_t)len;
	if (len > sizeof(head) && ioctl(c->fd, VFIO_IOMMU_GET_INFO, buf)) {
		err = upcie_neg_errno();
		free(buf);
		return UPCIE_FAIL(err, "vfio: VFIO_IOMMU_GET_INFO (%zu bytes): %s", len,
				  strerror(-err));
	}
	if (len == sizeof(head))
		memcpy(buf, &head, sizeof(head));
	err = upcie_vfio_type1_info_parse(buf, len, out);
	free(buf);
	return err;
}

/* Ranges to allocate from: the reported ones, or 4 KiB pages up to 39 bits when none were. */
static inline int upcie_vfio_container_iova_refresh_(struct upcie_vfio_container *c)
{
	struct upcie_vfio_type1_info info;
	int err = upcie_vfio_container_info(c, &info);

	if (err)
		return err;
	__atomic_store_n(&c->dma_avail, info.dma_avail, __ATOMIC_RELAXED);
	c->dma_budget = info.dma_avail != UINT32_MAX;
	if (!info.have_ranges) {
		UPCIE_WARN("vfio: the kernel reports no IOVA ranges; assuming [0x%" PRIx64
			   ", 0x%" PRIx64 "]",
			   UPCIE_VFIO_IOVA_LOW_LIMIT, UPCIE_VFIO_IOVA_DEFAULT_LAST);
		info.ranges.n = 0;
		upcie_vfio_iova_ranges_add(&info.ranges, 0, UPCIE_VFIO_IOVA_DEFAULT_LAST);
	}
	if (c->iovas.ready)
		return upcie_vfio_iova_space_update(&c->iovas, &info.ranges);
	return upcie_vfio_iova_space_init(&c->iovas, &info.ranges);
}

/* The container's entry for group `id`, or NULL. */
static inline struct upcie_vfio_group_ref_ *
upcie_vfio_group_ref_find_(struct upcie_vfio_container *c, int id)
{
	for (int i = 0; c->groups && i < c->ngroups; i++)
		if (c->groups[i].id == id)
			return &c->groups[i];
	return NULL;
}

/* -EOPNOTSUPP with the reason when group `id` is one of vfio's no-IOMMU groups, else 0. */
static inline int upcie_vfio_group_noiommu_check_(int id)
{
	char path[64], name[32] = "";
	int err;

	snprintf(path, sizeof(path), "/dev/vfio/noiommu-%d", id);
	if (access(path, F_OK) != 0) {
		err = upcie_path_fmt(path, sizeof(path), "%s/kernel/iommu_groups/%d/name",
				     upcie_sysfs_root(), id);
		if (err || upcie_file_read_str(path, name, sizeof(name)) < 0 ||
		    strcmp(name, "vfio-noiommu"))
			return 0;
	}
	return UPCIE_FAIL(-EOPNOTSUPP,
			  "vfio: group %d is a no-IOMMU group (vfio runs with "
			  "enable_unsafe_noiommu_mode): there is no IOMMU to map DMA through, "
			  "so the type1 and iommufd paths cannot drive it; bind the function to "
			  "uio_pci_generic and use the uio path (the device then sees physical "
			  "addresses), or enable the IOMMU",
			  id);
}

static inline int upcie_vfio_group_attach_(struct upcie_vfio_group *g,
					   struct upcie_vfio_container *c, int id, int fd);

/*
 * Open IOMMU group `id`, check that it is viable and attach it to the container; the first group
 * attached also selects the type1v2 backend. The container's IOVA allocator then follows the
 * ranges the kernel reports for all its groups. A group already open in this container is
 * shared (its open is counted), so every function of one group can be reached. -ENOENT: no such
 * group; -EBUSY: not viable (some function of the group is still under a kernel driver), or the
 * group file is open elsewhere (another container or process); -EOPNOTSUPP: a vfio no-IOMMU
 * group; -EPERM from VFIO_SET_IOMMU usually means interrupt remapping is missing (QEMU:
 * intel-iommu,intremap=on).
 */
static inline int upcie_vfio_group_open(struct upcie_vfio_group *g, struct upcie_vfio_container *c,
					int id)
{
	return upcie_vfio_group_attach_(g, c, id, -1);
}

/*
 * As upcie_vfio_group_open(), with the group file `fd` someone opened for us (for example a
 * served/ server handing out a VF's group over a socket: the caller need not be able to open
 * /dev/vfio/<id> itself). fd must be that group's file (checked against /dev/vfio/<id>); the
 * handle owns it from the call on, and it is closed on failure too.
 */
static inline int upcie_vfio_group_adopt(struct upcie_vfio_group *g, struct upcie_vfio_container *c,
					 int id, int fd)
{
	if (fd <= 0) {
		if (g)
			g->fd = -1;
		return UPCIE_FAIL(-EBADF, "vfio: group %d: no file to adopt", id);
	}
	return upcie_vfio_group_attach_(g, c, id, fd);
}

/* Open (fd < 0) or adopt (fd, closed on failure) group `id` and attach it to the container. */
static inline int upcie_vfio_group_attach_(struct upcie_vfio_group *g,
					   struct upcie_vfio_container *c, int id, int fd)
{
	struct upcie_vfio_group_ref_ *ref, *ng;
	struct vfio_group_status st;
	struct stat fst, nst;
	char path[64];
	int err;

	if (!g) {
		if (fd > 0)
			close(fd);
		return UPCIE_FAIL(-EINVAL, "vfio: NULL group");
	}
	g->fd = -1;
	g->id = id;
	g->container = NULL;
	g->cgen = 0;
	snprintf(path, sizeof(path), "/dev/vfio/%d", id);
	if (fd > 0 && (fstat(fd, &fst) || stat(path, &nst) || !S_ISCHR(fst.st_mode) ||
		       fst.st_rdev != nst.st_rdev)) {
		close(fd);
		return UPCIE_FAIL(-EINVAL, "vfio: the file given for group %d is not %s", id, path);
	}
	if (!c || c->fd <= 0 || id < 0) {
		if (fd > 0)
			close(fd);
		return UPCIE_FAIL(-EINVAL, "vfio: group %d: invalid container or group id", id);
	}
	ref = upcie_vfio_group_ref_find_(c, id);
	if (ref) {
		/* the container has the group's file already: a second one is not needed */
		if (fd > 0)
			close(fd);
		ref->refs++;
		g->fd = ref->fd;
		g->container = c;
		g->cgen = c->gen;
		return 0;
	}
	ng = (struct upcie_vfio_group_ref_ *)realloc(c->groups,
						     ((size_t)c->ngroups + 1) * sizeof(*ng));
	if (!ng) {
		if (fd > 0)
			close(fd);
		return UPCIE_FAIL(-ENOMEM, "vfio: group %d: out of memory", id);
	}
	c->groups = ng;
	if (fd <= 0)
		fd = upcie_vfio_fd_not_zero_(open(path, O_RDWR | O_CLOEXEC));
	if (fd < 0) {
		err = upcie_neg_errno();
		if (err == -ENOENT && upcie_vfio_group_noiommu_check_(id))
			return -EOPNOTSUPP;
		return UPCIE_FAIL(err, "vfio: open %s: %s%s", path, strerror(-err),
				  err == -ENOENT  ? " (is the function bound to vfio-pci?)"
				  : err == -EBUSY ? " (the group is open elsewhere: another "
						    "container or process)"
						  : "");
	}
	memset(&st, 0, sizeof(st));
	st.argsz = sizeof(st);
	if (ioctl(fd, VFIO_GROUP_GET_STATUS, &st)) {
		err = upcie_neg_errno();
		UPCIE_ERR("vfio: group %d: GET_STATUS: %s", id, strerror(-err));
		goto fail;
	}
	if (!(st.flags & VFIO_GROUP_FLAGS_VIABLE)) {
		err = -EBUSY;
		UPCIE_ERR("vfio: group %d is not viable: bind every function in "
			  "/sys/kernel/iommu_groups/%d/devices to vfio-pci",
			  id, id);
		goto fail;
	}
	if (ioctl(fd, VFIO_GROUP_SET_CONTAINER, &c->fd)) {
		err = upcie_neg_errno();
		UPCIE_ERR("vfio: group %d: SET_CONTAINER: %s", id, strerror(-err));
		goto fail;
	}
	if (!c->iommu_set) {
		if (ioctl(c->fd, VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU)) {
			err = upcie_neg_errno();
			UPCIE_ERR("vfio: VFIO_SET_IOMMU(type1v2): %s%s", strerror(-err),
				  err == -EPERM
				      ? " (no interrupt remapping? allow_unsafe_interrupts)"
				      : "");
			goto fail_unset;
		}
		c->iommu_set = 1;
	}
	err = upcie_vfio_container_iova_refresh_(c);
	if (err) {
		UPCIE_ERR("vfio: group %d: cannot take the container's IOVA ranges", id);
		goto fail_unset;
	}
	c->groups[c->ngroups].id = id;
	c->groups[c->ngroups].fd = fd;
	c->groups[c->ngroups].refs = 1;
	c->ngroups++;
	g->fd = fd;
	g->container = c;
	g->cgen = c->gen;
	return 0;
fail_unset:
	ioctl(fd, VFIO_GROUP_UNSET_CONTAINER);
	if (!c->ngroups) {
		/* that was the only group: the kernel released the container's IOMMU */
		c->iommu_set = 0;
		upcie_vfio_iova_space_fini(&c->iovas);
	}
fail:
	close(fd);
	return err;
}

/*
 * Drop this handle on its group. The last handle of a group detaches the group from its
 * container and closes the group file. When the container's last group leaves, the kernel
 * releases the container's IOMMU and with it every mapping; the container's IOVA allocator is
 * reset too, and the next group to join selects the IOMMU again. Zeroed or closed: no-op; so is
 * a handle whose container was closed first.
 */
static inline void upcie_vfio_group_close(struct upcie_vfio_group *g)
{
	struct upcie_vfio_container *c;
	struct upcie_vfio_group_ref_ *ref;

	if (!g)
		return;
	c = g->container;
	if (g->fd > 0 && c && c->fd > 0 && c->gen == g->cgen &&
	    (ref = upcie_vfio_group_ref_find_(c, g->id)) != NULL && ref->fd == g->fd) {
		if (--ref->refs == 0) {
			ioctl(ref->fd, VFIO_GROUP_UNSET_CONTAINER);
			close(ref->fd);
			*ref = c->groups[c->ngroups - 1];
			if (--c->ngroups == 0) {
				c->iommu_set = 0;
				upcie_vfio_iova_space_fini(&c->iovas);
				c->dma_avail = 0;
				c->dma_budget = false;
				c->dma_maps = 0;
			}
		}
	}
	g->fd = -1;
	g->container = NULL;
	g->cgen = 0;
}

/* IOMMU group id of bdf from sysfs: >= 0, or -ENODEV / -ENXIO (function has no IOMMU group). */
static inline int upcie_vfio_group_id(const struct upcie_pci_bdf *bdf)
{
	struct upcie_pci_func fn;
	int err;

	if (!bdf)
		return UPCIE_FAIL(-EINVAL, "vfio: group id: NULL address");
	err = upcie_pci_func_read(bdf, &fn);
	if (err)
		return err;
	if (fn.iommu_group < 0)
		return UPCIE_FAIL(-ENXIO, "vfio: %s has no IOMMU group (IOMMU disabled?)", fn.name);
	return fn.iommu_group;
}

/*
 * Get the device fd for bdf from an open group, presenting VF token `vf_token` (a UUID as text,
 * upcie_vfio_vf_token_format(); NULL: none). vfio-pci asks for the token for a VF whose PF is
 * bound to vfio-pci (-EACCES without it or with another one; the kernel log says which).
 */
static inline int upcie_vfio_device_open_token(struct upcie_vfio_device *dev,
					       struct upcie_vfio_group *g,
					       const struct upcie_pci_bdf *bdf,
					       const char *vf_token)
{
	char arg[UPCIE_PCI_BDF_STRLEN + 16 + UPCIE_VFIO_VF_TOKEN_STRLEN];
	int fd, err;

	if (!dev || !bdf)
		return UPCIE_FAIL(-EINVAL, "vfio: device open: NULL argument");
	memset(dev, 0, sizeof(*dev));
	dev->fd = -1;
	dev->bdf = *bdf;
	upcie_pci_bdf_format(bdf, dev->name, sizeof(dev->name));
	if (!g || g->fd <= 0)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: group not open", dev->name);
	if (vf_token && strlen(vf_token) != UPCIE_VFIO_VF_TOKEN_STRLEN - 1)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: a VF token is a UUID of 36 characters",
				  dev->name);
	if (vf_token)
		snprintf(arg, sizeof(arg), "%s vf_token=%s", dev->name, vf_token);
	else
		snprintf(arg, sizeof(arg), "%s", dev->name);
	fd = upcie_vfio_fd_not_zero_(ioctl(g->fd, VFIO_GROUP_GET_DEVICE_FD, arg));
	if (fd < 0) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: %s: GET_DEVICE_FD: %s%s", dev->name, strerror(-err),
				  err == -EACCES ? " (a VF of a PF under vfio-pci: the PF owner's "
						   "VF token is needed)"
						 : "");
	}
	dev->fd = fd;
	err = upcie_vfio_device_info_(dev);
	if (err) {
		close(fd);
		dev->fd = -1;
	}
	return err;
}

/* Get the device fd for bdf from an open group (no VF token). */
static inline int upcie_vfio_device_open(struct upcie_vfio_device *dev, struct upcie_vfio_group *g,
					 const struct upcie_pci_bdf *bdf)
{
	return upcie_vfio_device_open_token(dev, g, bdf, NULL);
}

/* The message for a mapping refused because the container's DMA-mapping budget is used up. */
static inline int upcie_vfio_dma_budget_fail_(struct upcie_vfio_container *c, uint64_t size,
					      uint64_t iova)
{
	char limit[32] = "65535 by default";
	char path[128];

	/* the module parameter, when sysfs shows it */
	if (!upcie_path_fmt(path, sizeof(path),
			    "%s/module/vfio_iommu_type1/parameters/dma_entry_limit",
			    upcie_sysfs_root()) &&
	    upcie_file_read_str(path, limit, sizeof(limit)) <= 0)
		snprintf(limit, sizeof(limit), "65535 by default");
	return UPCIE_FAIL(
	    -ENOSPC,
	    "vfio: MAP_DMA iova=0x%llx size=0x%llx refused: the container's "
	    "DMA-mapping budget (dma_avail) is used up, %u mappings live through "
	    "upcie; the budget is vfio_iommu_type1's dma_entry_limit (%s): map fewer, "
	    "larger ranges (one dmamem carved up by a heap) or raise the limit "
	    "(modprobe vfio_iommu_type1 dma_entry_limit=N)",
	    (unsigned long long)iova, (unsigned long long)size,
	    __atomic_load_n(&c->dma_maps, __ATOMIC_RELAXED), limit);
}

/*
 * Map [vaddr, vaddr+size) at iova in the container's IOMMU domain, readable and writable. Each
 * mapping takes one entry of the container's budget (c->dma_avail); when it is used up the call
 * fails with -ENOSPC and a message naming the budget, without asking the kernel.
 */
static inline int upcie_vfio_dma_map(struct upcie_vfio_container *c, void *vaddr, uint64_t size,
				     uint64_t iova)
{
	struct vfio_iommu_type1_dma_map map;
	struct upcie_vfio_type1_info info;
	int err = upcie_vfio_container_check_(c, "MAP_DMA");

	if (err)
		return err;
	if (!vaddr || !size)
		return UPCIE_FAIL(-EINVAL, "vfio: MAP_DMA of an empty range");
	if (c->dma_budget && __atomic_load_n(&c->dma_avail, __ATOMIC_RELAXED) == 0) {
		/* unmaps elsewhere (another user of the container) may have freed entries */
		if (upcie_vfio_container_info(c, &info) == 0)
			__atomic_store_n(&c->dma_avail, info.dma_avail, __ATOMIC_RELAXED);
		if (__atomic_load_n(&c->dma_avail, __ATOMIC_RELAXED) == 0)
			return upcie_vfio_dma_budget_fail_(c, size, iova);
	}
	memset(&map, 0, sizeof(map));
	map.argsz = sizeof(map);
	map.flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE;
	map.vaddr = (uintptr_t)vaddr;
	map.size = size;
	map.iova = iova;
	if (ioctl(c->fd, VFIO_IOMMU_MAP_DMA, &map)) {
		err = upcie_neg_errno();
		if (err == -ENOSPC) {
			/* the kernel's only -ENOSPC here is dma_avail == 0 */
			__atomic_store_n(&c->dma_avail, 0, __ATOMIC_RELAXED);
			return upcie_vfio_dma_budget_fail_(c, size, iova);
		}
		return UPCIE_FAIL(err, "vfio: MAP_DMA iova=0x%llx size=0x%llx: %s%s",
				  (unsigned long long)iova, (unsigned long long)size,
				  strerror(-err),
				  err == -ENOMEM ? " (RLIMIT_MEMLOCK too low? ulimit -l)" : "");
	}
	/* one vfio_dma per MAP_DMA */
	if (c->dma_budget) {
		uint32_t avail = __atomic_load_n(&c->dma_avail, __ATOMIC_RELAXED);

		while (avail &&
		       !__atomic_compare_exchange_n(&c->dma_avail, &avail, avail - 1, false,
						    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
			;
	}
	__atomic_fetch_add(&c->dma_maps, 1, __ATOMIC_RELAXED);
	return 0;
}

/* Unmap exactly one mapping made by upcie_vfio_dma_map() ([iova, +size)); its budget entry
 * comes back. */
static inline int upcie_vfio_dma_unmap(struct upcie_vfio_container *c, uint64_t size, uint64_t iova)
{
	struct vfio_iommu_type1_dma_unmap unmap;
	int err = upcie_vfio_container_check_(c, "UNMAP_DMA");

	if (err)
		return err;
	if (!size)
		return UPCIE_FAIL(-EINVAL, "vfio: UNMAP_DMA of an empty range");
	memset(&unmap, 0, sizeof(unmap));
	unmap.argsz = sizeof(unmap);
	unmap.size = size;
	unmap.iova = iova;
	if (ioctl(c->fd, VFIO_IOMMU_UNMAP_DMA, &unmap)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: UNMAP_DMA iova=0x%llx: %s", (unsigned long long)iova,
				  strerror(-err));
	}
	if (unmap.size) {
		if (c->dma_budget)
			__atomic_fetch_add(&c->dma_avail, 1, __ATOMIC_RELAXED);
		if (__atomic_load_n(&c->dma_maps, __ATOMIC_RELAXED))
			__atomic_fetch_sub(&c->dma_maps, 1, __ATOMIC_RELAXED);
	}
	return unmap.size == size ? 0 : -EIO;
}

#endif /* UPCIE_VFIO_TYPE1_H */
