/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * iommufd (/dev/iommu): I/O address spaces (IOAS), their IOVA ranges, mappings of user memory
 * and of files (memfd; dma-bufs exported by vfio-pci), unmapping.
 *
 * Devices join an IOAS through their vfio cdev (vfio/cdev.h); every device attached to one IOAS
 * sees the same IOVAs, which is how an NVMe controller reaches a peer device's BAR. An IOAS made
 * by upcie_vfio_ioas_alloc() carries an IOVA allocator (vfio/iova.h, as a type1 container does)
 * that follows the IOAS's allowed ranges: upcie_vfio_ioas_iova_alloc() picks IOVAs at or above
 * 4 GiB where possible, never in the first MiB, naturally aligned up to 1 GiB, and mem/'s
 * constructors map there with UPCIE_VFIO_IOAS_MAP_FIXED_IOVA. Left to itself the kernel picks the
 * lowest free IOVA (from 4 KiB up) aligned to at most 2 MiB (iopt_alloc_iova(), Linux 7.3), which
 * puts buffers where a stray small address lands and keeps 1 GiB pages from 1 GiB IOPTEs.
 * IOMMU_IOAS_IOVA_RANGES reports the holes of the reserved regions only, not what
 * IOMMU_IOAS_ALLOW_IOVAS narrowed: a range kept out with ALLOW_IOVAS must also be kept out of the
 * allocator (upcie_vfio_iova_space_exclude(&ioas->iovas, ...)).
 *
 * Needs: Linux >= 6.2 built with CONFIG_IOMMUFD (no Debian kernel is, up to 7.x), read/write
 * access to /dev/iommu; device cdevs need 6.6. IOMMU_IOAS_MAP_FILE needs 6.13 for a memfd and
 * 6.19 for a vfio-pci BAR dma-buf; other dma-bufs (udmabuf, GPU drivers) are refused. Those
 * refusals come back as the kernel's -errno with a message naming the version needed. Pinned
 * pages count against RLIMIT_MEMLOCK. Does not: allocate memory (mem/ does), or handle nested
 * or dirty-tracking page tables. The iommufd fd is borrowed by every IOAS made from it: close the
 * context last. File descriptors: see vfio/device.h (fd <= 0 in a zeroed struct is "not open").
 */
#ifndef UPCIE_VFIO_IOMMUFD_H
#define UPCIE_VFIO_IOMMUFD_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/vfio/device.h>
#include <upcie/vfio/iova.h>
#include <upcie/vfio/uapi.h>

/* Flags of upcie_vfio_ioas_map() and upcie_vfio_ioas_map_file(). */
#define UPCIE_VFIO_IOAS_MAP_FIXED_IOVA (1u << 0) /* map at *iova instead of a kernel choice */
#define UPCIE_VFIO_IOAS_MAP_READONLY   (1u << 1) /* the device may read but not write */

struct upcie_vfio_iommufd {
	int fd; /* /dev/iommu, or -1 */
};

struct upcie_vfio_ioas {
	int fd;	     /* the iommufd it lives in (borrowed), or -1 */
	uint32_t id; /* IOAS object id; 0: none (the kernel's ids start at 1) */
	/* IOVAs for fixed mappings (upcie_vfio_ioas_iova_alloc()); its generation tells an
	 * IOAS destroyed and allocated again in the same struct from the one before */
	struct upcie_vfio_iova_space iovas;
};

/* Open /dev/iommu. -ENOENT: no iommufd in this kernel (the message says what to do). */
static inline int upcie_vfio_iommufd_open(struct upcie_vfio_iommufd *ctx)
{
	char kv[128];
	int fd, err;

	if (!ctx)
		return UPCIE_FAIL(-EINVAL, "iommufd: NULL context");
	ctx->fd = -1;
	fd = upcie_vfio_fd_not_zero_(open("/dev/iommu", O_RDWR | O_CLOEXEC));
	if (fd < 0) {
		err = upcie_neg_errno();
		if (err == -ENOENT || err == -ENODEV || err == -ENXIO)
			return UPCIE_FAIL(err,
					  "iommufd: no /dev/iommu on Linux %s: the kernel needs "
					  "CONFIG_IOMMUFD (Linux >= 6.2; not enabled in Debian's "
					  "kernels) and the module loaded (modprobe iommufd); "
					  "vfio type1 (vfio/type1.h) works without it",
					  upcie_vfio_kernel_(kv, sizeof(kv)));
		return UPCIE_FAIL(err, "iommufd: open /dev/iommu: %s%s", strerror(-err),
				  err == -EACCES ? " (needs root or access to /dev/iommu)" : "");
	}
	ctx->fd = fd;
	return 0;
}

/* Close the context: the kernel destroys every object in it. Zeroed or closed: no-op. */
static inline void upcie_vfio_iommufd_close(struct upcie_vfio_iommufd *ctx)
{
	if (ctx && ctx->fd > 0)
		close(ctx->fd);
	if (ctx)
		ctx->fd = -1;
}

static inline int upcie_vfio_ioas_check_(const struct upcie_vfio_ioas *ioas, const char *what)
{
	if (!ioas || ioas->fd <= 0 || !ioas->id)
		return UPCIE_FAIL(-EINVAL, "iommufd: %s: IOAS not allocated", what);
	return 0;
}

static inline int upcie_vfio_ioas_iova_ranges(const struct upcie_vfio_ioas *ioas,
					      struct upcie_vfio_iova_ranges *out);
static inline int upcie_vfio_ioas_destroy(struct upcie_vfio_ioas *ioas);

/* Allocate an empty IOAS in ctx, with its IOVA allocator over the ranges it allows. */
static inline int upcie_vfio_ioas_alloc(struct upcie_vfio_ioas *ioas,
					const struct upcie_vfio_iommufd *ctx)
{
	struct upcie_vfio_iova_ranges r;
	struct upcie_iommu_ioas_alloc a;
	int err;

	if (!ioas)
		return UPCIE_FAIL(-EINVAL, "iommufd: NULL IOAS");
	ioas->fd = -1;
	ioas->id = 0;
	memset(&ioas->iovas, 0, sizeof(ioas->iovas));
	if (!ctx || ctx->fd <= 0)
		return UPCIE_FAIL(-EINVAL, "iommufd: IOAS alloc: context not open");
	memset(&a, 0, sizeof(a));
	a.size = sizeof(a);
	if (ioctl(ctx->fd, UPCIE_IOMMU_IOAS_ALLOC, &a)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "iommufd: IOMMU_IOAS_ALLOC: %s", strerror(-err));
	}
	ioas->fd = ctx->fd;
	ioas->id = a.out_ioas_id;
	err = upcie_vfio_ioas_iova_ranges(ioas, &r);
	if (!err)
		err = upcie_vfio_iova_space_init(&ioas->iovas, &r);
	if (err) {
		UPCIE_ERR("iommufd: IOAS %u: cannot set up its IOVA allocator", ioas->id);
		upcie_vfio_ioas_destroy(ioas);
	}
	return err;
}

/*
 * Destroy the IOAS (IOMMU_DESTROY); its mappings go with it. -EBUSY while devices are attached
 * (detach or close them first; the IOAS then stays until the context closes). Zeroed: no-op.
 */
static inline int upcie_vfio_ioas_destroy(struct upcie_vfio_ioas *ioas)
{
	struct upcie_iommu_destroy d;
	int err = 0;

	if (!ioas)
		return 0;
	upcie_vfio_iova_space_fini(&ioas->iovas);
	if (ioas->fd <= 0 || !ioas->id)
		return 0;
	memset(&d, 0, sizeof(d));
	d.size = sizeof(d);
	d.id = ioas->id;
	if (ioctl(ioas->fd, UPCIE_IOMMU_DESTROY, &d)) {
		err = upcie_neg_errno();
		UPCIE_ERR("iommufd: IOMMU_DESTROY of IOAS %u: %s%s", ioas->id, strerror(-err),
			  err == -EBUSY ? " (devices still attached)" : "");
	}
	ioas->fd = -1;
	ioas->id = 0;
	return err;
}

/*
 * The IOVA ranges the IOAS allows now (they shrink as devices with reserved regions attach) and
 * its IOVA alignment. -E2BIG when there are more than UPCIE_VFIO_IOVA_RANGES_MAX.
 */
static inline int upcie_vfio_ioas_iova_ranges(const struct upcie_vfio_ioas *ioas,
					      struct upcie_vfio_iova_ranges *out)
{
	struct upcie_iommu_iova_range r[UPCIE_VFIO_IOVA_RANGES_MAX];
	struct upcie_iommu_ioas_iova_ranges q;
	int err = upcie_vfio_ioas_check_(ioas, "IOVA ranges");

	if (err)
		return err;
	if (!out)
		return UPCIE_FAIL(-EINVAL, "iommufd: IOVA ranges: NULL output");
	memset(out, 0, sizeof(*out));
	memset(&q, 0, sizeof(q));
	q.size = sizeof(q);
	q.ioas_id = ioas->id;
	q.num_iovas = UPCIE_VFIO_IOVA_RANGES_MAX;
	q.allowed_iovas = (uintptr_t)r;
	if (ioctl(ioas->fd, UPCIE_IOMMU_IOAS_IOVA_RANGES, &q)) {
		err = upcie_neg_errno();
		if (err == -EMSGSIZE)
			return UPCIE_FAIL(-E2BIG,
					  "iommufd: IOAS %u has %u IOVA ranges, at most %d "
					  "supported",
					  ioas->id, q.num_iovas, UPCIE_VFIO_IOVA_RANGES_MAX);
		return UPCIE_FAIL(err, "iommufd: IOMMU_IOAS_IOVA_RANGES: %s", strerror(-err));
	}
	if (q.num_iovas > UPCIE_VFIO_IOVA_RANGES_MAX)
		return UPCIE_FAIL(-EPROTO, "iommufd: IOVA_RANGES answered %u ranges", q.num_iovas);
	for (uint32_t i = 0; i < q.num_iovas; i++) {
		out->r[i].start = r[i].start;
		out->r[i].last = r[i].last;
	}
	out->n = q.num_iovas;
	out->align = q.out_iova_alignment;
	return 0;
}

/*
 * Reserve `size` bytes of the IOAS's IOVA space (aligned to `align`, a power of two; 0: natural
 * alignment up to 1 GiB) for a mapping at a fixed IOVA; the allowed ranges are read again first,
 * as they shrink when devices attach. -EINVAL for an IOAS without an allocator (not from
 * upcie_vfio_ioas_alloc()); -ENOSPC; or the range query's error. Free with
 * upcie_vfio_ioas_iova_free() after unmapping.
 */
static inline int upcie_vfio_ioas_iova_alloc(struct upcie_vfio_ioas *ioas, uint64_t size,
					     uint64_t align, uint64_t *iova)
{
	struct upcie_vfio_iova_ranges r;
	int err = upcie_vfio_ioas_check_(ioas, "IOVA alloc");

	if (err)
		return err;
	if (!ioas->iovas.ready)
		return UPCIE_FAIL(-EINVAL,
				  "iommufd: IOAS %u has no IOVA allocator (allocate it with "
				  "upcie_vfio_ioas_alloc())",
				  ioas->id);
	err = upcie_vfio_ioas_iova_ranges(ioas, &r);
	if (!err)
		err = upcie_vfio_iova_space_update(&ioas->iovas, &r);
	if (err)
		return err;
	return upcie_vfio_iova_alloc(&ioas->iovas, size, align, iova);
}

/*
 * Return a range of upcie_vfio_ioas_iova_alloc(): 0, -EINVAL (no allocator), or -ENOENT when
 * [iova, +size) is not exactly one allocation. Unmap it first.
 */
static inline int upcie_vfio_ioas_iova_free(struct upcie_vfio_ioas *ioas, uint64_t iova,
					    uint64_t size)
{
	if (!ioas || !ioas->iovas.ready)
		return UPCIE_FAIL(-EINVAL, "iommufd: IOVA free: IOAS has no allocator");
	return upcie_vfio_iova_free(&ioas->iovas, iova, size);
}

static inline int upcie_vfio_ioas_map_flags_(unsigned flags, const uint64_t *iova, uint32_t *kflags)
{
	if (flags & ~(UPCIE_VFIO_IOAS_MAP_FIXED_IOVA | UPCIE_VFIO_IOAS_MAP_READONLY))
		return UPCIE_FAIL(-EINVAL, "iommufd: unknown map flags 0x%x", flags);
	if (!iova)
		return UPCIE_FAIL(-EINVAL, "iommufd: map: NULL iova");
	*kflags = UPCIE_IOMMU_IOAS_MAP_READABLE;
	if (!(flags & UPCIE_VFIO_IOAS_MAP_READONLY))
		*kflags |= UPCIE_IOMMU_IOAS_MAP_WRITEABLE;
	if (flags & UPCIE_VFIO_IOAS_MAP_FIXED_IOVA)
		*kflags |= UPCIE_IOMMU_IOAS_MAP_FIXED_IOVA;
	return 0;
}

/*
 * Map [va, va+len) of this process into the IOAS (IOMMU_IOAS_MAP); the pages are pinned. The IOVA
 * goes to *iova, or comes from it with UPCIE_VFIO_IOAS_MAP_FIXED_IOVA. PFNMAP memory (a BAR mmap)
 * is refused by the kernel with -EFAULT: map a BAR through a dma-buf (vfio/dmabuf.h) and
 * upcie_vfio_ioas_map_file() instead.
 */
static inline int upcie_vfio_ioas_map(const struct upcie_vfio_ioas *ioas, void *va, uint64_t len,
				      unsigned flags, uint64_t *iova)
{
	struct upcie_iommu_ioas_map m;
	uint32_t kflags;
	int err = upcie_vfio_ioas_check_(ioas, "map");

	if (err)
		return err;
	err = upcie_vfio_ioas_map_flags_(flags, iova, &kflags);
	if (err)
		return err;
	if (!va || !len)
		return UPCIE_FAIL(-EINVAL, "iommufd: map of an empty range");
	memset(&m, 0, sizeof(m));
	m.size = sizeof(m);
	m.flags = kflags;
	m.ioas_id = ioas->id;
	m.user_va = (uintptr_t)va;
	m.length = len;
	m.iova = (flags & UPCIE_VFIO_IOAS_MAP_FIXED_IOVA) ? *iova : 0;
	if (ioctl(ioas->fd, UPCIE_IOMMU_IOAS_MAP, &m)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "iommufd: IOMMU_IOAS_MAP va=%p len=0x%" PRIx64 "%s: %s%s",
				  va, len, (flags & UPCIE_VFIO_IOAS_MAP_FIXED_IOVA) ? " fixed" : "",
				  strerror(-err),
				  err == -EFAULT   ? " (PFNMAP memory such as a BAR mmap cannot be "
						     "pinned: map its dma-buf with map_file)"
				  : err == -ENOMEM ? " (RLIMIT_MEMLOCK too low? ulimit -l)"
						   : "");
	}
	*iova = m.iova;
	return 0;
}

/*
 * Name of the dma-buf exporter behind fd ("udmabuf", "vfio-pci", ...) into buf; "" when fd is
 * not a dma-buf. Read from /proc/self/fdinfo, which lists exp_name for dma-bufs.
 */
static inline void upcie_vfio_dmabuf_exporter_(int fd, char *buf, size_t len)
{
	char path[64], line[256];
	FILE *f;

	if (len)
		buf[0] = '\0';
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = fopen(path, "re");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char name[128];

		if (sscanf(line, "exp_name: %127s", name) == 1) {
			snprintf(buf, len, "%s", name);
			break;
		}
	}
	fclose(f);
}

/*
 * Map `len` bytes of file `fd` from byte `start` into the IOAS (IOMMU_IOAS_MAP_FILE): a memfd
 * (shmem or hugetlb) from Linux 6.13, or a single-range dma-buf exported by vfio-pci from 6.19.
 * The kernel pins the pages through the file, so the memory needs no CPU mapping. Flags and
 * *iova as for upcie_vfio_ioas_map(). The fd stays the caller's. Errors are the kernel's:
 * -ENOTTY (no MAP_FILE: Linux < 6.13), -EOPNOTSUPP/-EINVAL for dma-bufs the kernel cannot import
 * (every exporter before 6.19; any but vfio-pci after), each with a message saying so.
 */
static inline int upcie_vfio_ioas_map_file(const struct upcie_vfio_ioas *ioas, int fd,
					   uint64_t start, uint64_t len, unsigned flags,
					   uint64_t *iova)
{
	struct upcie_iommu_ioas_map_file m;
	char kv[128], exp[128];
	uint32_t kflags;
	int err = upcie_vfio_ioas_check_(ioas, "map_file");

	if (err)
		return err;
	err = upcie_vfio_ioas_map_flags_(flags, iova, &kflags);
	if (err)
		return err;
	if (fd < 0 || !len)
		return UPCIE_FAIL(-EINVAL, "iommufd: map_file: bad fd %d or empty range", fd);
	memset(&m, 0, sizeof(m));
	m.size = sizeof(m);
	m.flags = kflags;
	m.ioas_id = ioas->id;
	m.fd = fd;
	m.start = start;
	m.length = len;
	m.iova = (flags & UPCIE_VFIO_IOAS_MAP_FIXED_IOVA) ? *iova : 0;
	if (!ioctl(ioas->fd, UPCIE_IOMMU_IOAS_MAP_FILE, &m)) {
		*iova = m.iova;
		return 0;
	}
	err = upcie_neg_errno();
	upcie_vfio_kernel_(kv, sizeof(kv));
	upcie_vfio_dmabuf_exporter_(fd, exp, sizeof(exp));
	if (err == -ENOTTY)
		return UPCIE_FAIL(err,
				  "iommufd: IOMMU_IOAS_MAP_FILE is not supported by Linux %s: it "
				  "needs Linux >= 6.13 (memfd), >= 6.19 for vfio-pci dma-bufs; "
				  "map a CPU mapping with upcie_vfio_ioas_map() instead",
				  kv);
	if (exp[0])
		return UPCIE_FAIL(err,
				  "iommufd: IOMMU_IOAS_MAP_FILE of a dma-buf from exporter '%s' "
				  "refused by Linux %s: %s (%s). iommufd imports only single-range "
				  "vfio-pci BAR dma-bufs, from Linux 6.19 on",
				  exp, kv, strerror(-err), upcie_errno_name(err));
	return UPCIE_FAIL(err,
			  "iommufd: IOMMU_IOAS_MAP_FILE fd=%d start=0x%" PRIx64 " len=0x%" PRIx64
			  " on Linux %s: %s%s",
			  fd, start, len, kv, strerror(-err),
			  err == -EINVAL   ? " (only memfd/shmem or hugetlbfs files, ranges inside "
					     "the file)"
			  : err == -ENOMEM ? " (RLIMIT_MEMLOCK too low? ulimit -l)"
					   : "");
}

/*
 * Unmap [iova, iova+len): it must cover whole mappings (-ENOENT where nothing is mapped; a
 * range that cuts a mapping is refused by the kernel). -EIO when the kernel unmapped a
 * different amount.
 */
static inline int upcie_vfio_ioas_unmap(const struct upcie_vfio_ioas *ioas, uint64_t iova,
					uint64_t len)
{
	struct upcie_iommu_ioas_unmap u;
	int err = upcie_vfio_ioas_check_(ioas, "unmap");

	if (err)
		return err;
	if (!len)
		return UPCIE_FAIL(-EINVAL, "iommufd: unmap of an empty range");
	memset(&u, 0, sizeof(u));
	u.size = sizeof(u);
	u.ioas_id = ioas->id;
	u.iova = iova;
	u.length = len;
	if (ioctl(ioas->fd, UPCIE_IOMMU_IOAS_UNMAP, &u)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(
		    err, "iommufd: IOMMU_IOAS_UNMAP iova=0x%" PRIx64 " len=0x%" PRIx64 ": %s", iova,
		    len, strerror(-err));
	}
	if (len != UINT64_MAX && u.length != len)
		return UPCIE_FAIL(-EIO,
				  "iommufd: IOMMU_IOAS_UNMAP iova=0x%" PRIx64 " unmapped 0x%llx of "
				  "0x%" PRIx64 " bytes",
				  iova, (unsigned long long)u.length, len);
	return 0;
}

/* Unmap everything in the IOAS. */
static inline int upcie_vfio_ioas_unmap_all(const struct upcie_vfio_ioas *ioas)
{
	return upcie_vfio_ioas_unmap(ioas, 0, UINT64_MAX);
}

#endif /* UPCIE_VFIO_IOMMUFD_H */
