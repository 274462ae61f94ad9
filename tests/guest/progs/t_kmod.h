/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helpers of the guest tests of upcie's kernel modules (t_kmod_dmabuf, t_kmod_iommu): dma-bufs
 * from vgem (every kernel) and udmabuf (7.x), the test bed's data pattern, running shell
 * commands, raw ioctls that return -errno, and a small adapter over nvme/ctrl.h + nvme/ns.h to
 * make a controller move data (bring-up on given registers and host DMA memory, one I/O queue,
 * synchronous Read/Write).
 */
#ifndef T_KMOD_H
#define T_KMOD_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/udmabuf.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>
#include <upcie/mem/hugepage.h>
#include <upcie/mem/sglut.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>
#include <upcie/pci/bdf.h>

#include "tap.h"
#include "tb_out.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)

#define SKIPPED(why, ...)                                                                          \
	do {                                                                                       \
		printf("ok %d - ", ++tap_n_);                                                      \
		printf(__VA_ARGS__);                                                               \
		printf(" # SKIP %s\n", why);                                                       \
		fflush(stdout);                                                                    \
	} while (0)

static inline void tk_log(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)ctx;
	printf("# upcie %s: %s\n", level == UPCIE_LOG_ERROR ? "error" : "log", msg);
	fflush(stdout);
}

/* ioctl that returns 0 or -errno. */
static inline int tk_ioctl(int fd, unsigned long req, void *arg)
{
	return ioctl(fd, req, arg) ? -errno : 0;
}

static inline int tk_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int tk_sh(const char *fmt, ...)
{
	char cmd[512];
	va_list ap;
	int rc;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	fflush(stdout);
	rc = system(cmd);
	return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static inline int tk_bdf(const char *s, struct upcie_pci_bdf *bdf)
{
	if (!s || upcie_pci_bdf_parse(s, bdf)) {
		fprintf(stderr, "not a PCI address: %s\n", s ? s : "(none)");
		return -1;
	}
	return 0;
}

/* ---- the test bed pattern (tools/tbpat.c) ---- */

static inline void tk_tag(char tag[9], const char *name)
{
	const char *nonce = getenv("TB_NONCE");

	memset(tag, 0, 9);
	snprintf(tag, 9, "%s%s", name, nonce ? nonce : "0000");
}

static inline void tk_pat(void *buf, uint64_t len, const char *tag, uint64_t off)
{
	uint8_t *p = (uint8_t *)buf;

	for (uint64_t k = 0; k < len; k++) {
		uint64_t o = off + k, u = o / 512;
		unsigned i = (unsigned)(o % 512);

		p[k] = i < 8	? (uint8_t)(u >> (8 * i))
		       : i < 16 ? (uint8_t)tag[i - 8]
				: (uint8_t)((u + i) & 0xff);
	}
}

/* First byte of buf[0..len) that differs from the pattern of [off, ...), or -1. */
static inline int64_t tk_pat_diff(const volatile void *buf, uint64_t len, const char *tag,
				  uint64_t off)
{
	const volatile uint8_t *p = (const volatile uint8_t *)buf;
	uint8_t want[512];

	for (uint64_t k = 0; k < len;) {
		uint64_t n = len - k < sizeof(want) ? len - k : sizeof(want);

		tk_pat(want, n, tag, off + k);
		for (uint64_t j = 0; j < n; j++)
			if (p[k + j] != want[j])
				return (int64_t)(k + j);
		k += n;
	}
	return -1;
}

/* ---- dma-bufs ---- */

struct tk_drm_version {
	int major, minor, patch;
	size_t name_len;
	char *name;
	size_t date_len;
	char *date;
	size_t desc_len;
	char *desc;
};
struct tk_drm_create_dumb {
	uint32_t height, width, bpp, flags, handle, pitch;
	uint64_t size;
};
struct tk_drm_prime_handle {
	uint32_t handle, flags;
	int32_t fd;
};
#define TK_DRM_IOCTL_VERSION		_IOWR('d', 0x00, struct tk_drm_version)
#define TK_DRM_IOCTL_PRIME_HANDLE_TO_FD _IOWR('d', 0x2d, struct tk_drm_prime_handle)
#define TK_DRM_IOCTL_MODE_CREATE_DUMB	_IOWR('d', 0xB2, struct tk_drm_create_dumb)

/* A dma-buf with a CPU view. */
struct tk_buf {
	int fd;	   /* the dma-buf */
	int memfd; /* udmabuf: the memfd behind it, else -1 */
	void *va;  /* CPU view, size bytes */
	size_t size;
	const char *kind;
};

static inline void tk_buf_free(struct tk_buf *b)
{
	if (b->va && b->va != MAP_FAILED)
		munmap(b->va, b->size);
	if (b->fd > 0)
		close(b->fd);
	if (b->memfd > 0)
		close(b->memfd);
	memset(b, 0, sizeof(*b));
}

/* The vgem DRM device, or -1. */
static inline int tk_vgem_open(void)
{
	for (int i = 0; i < 8; i++) {
		char path[64], name[32] = "";
		struct tk_drm_version v;
		int fd;

		snprintf(path, sizeof(path), "/dev/dri/card%d", i);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			continue;
		memset(&v, 0, sizeof(v));
		v.name = name;
		v.name_len = sizeof(name) - 1;
		if (!ioctl(fd, TK_DRM_IOCTL_VERSION, &v) && !strcmp(name, "vgem"))
			return fd;
		close(fd);
	}
	return -1;
}

/* vgem: a dumb buffer of `size` bytes (multiple of 4 KiB) exported as a dma-buf, mmapped. */
static inline int tk_buf_vgem(struct tk_buf *b, size_t size)
{
	struct tk_drm_create_dumb d;
	struct tk_drm_prime_handle h;
	int drm = tk_vgem_open(), err = 0;

	memset(b, 0, sizeof(*b));
	b->memfd = -1;
	if (drm < 0)
		return -ENODEV;
	memset(&d, 0, sizeof(d));
	d.width = 1024;
	d.height = (uint32_t)(size / 4096);
	d.bpp = 32;
	memset(&h, 0, sizeof(h));
	if (ioctl(drm, TK_DRM_IOCTL_MODE_CREATE_DUMB, &d)) {
		err = -errno;
	} else {
		h.handle = d.handle;
		h.flags = O_RDWR | O_CLOEXEC;
		if (ioctl(drm, TK_DRM_IOCTL_PRIME_HANDLE_TO_FD, &h))
			err = -errno;
	}
	close(drm); /* the dma-buf keeps the object */
	if (err)
		return err;
	b->fd = h.fd;
	b->size = (size_t)d.size;
	b->kind = "vgem";
	b->va = mmap(NULL, b->size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
	if (b->va == MAP_FAILED) {
		err = -errno;
		b->va = NULL;
		tk_buf_free(b);
		return err;
	}
	memset(b->va, 0, b->size); /* every page present */
	return 0;
}

/* udmabuf: memfd pages (sealed against shrinking) as a dma-buf; the CPU view maps the memfd. */
static inline int tk_buf_udmabuf(struct tk_buf *b, size_t size)
{
	struct udmabuf_create c;
	int dev, err = 0;

	memset(b, 0, sizeof(*b));
	b->memfd = -1;
	dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	if (dev < 0)
		return -ENODEV;
	b->memfd = memfd_create("t_kmod", MFD_ALLOW_SEALING | MFD_CLOEXEC);
	if (b->memfd < 0 || ftruncate(b->memfd, (off_t)size) ||
	    fcntl(b->memfd, F_ADD_SEALS, F_SEAL_SHRINK)) {
		err = -errno;
		close(dev);
		tk_buf_free(b);
		return err;
	}
	memset(&c, 0, sizeof(c));
	c.memfd = (uint32_t)b->memfd;
	c.flags = UDMABUF_FLAGS_CLOEXEC;
	c.size = size;
	b->fd = ioctl(dev, UDMABUF_CREATE, &c);
	err = b->fd < 0 ? -errno : 0;
	close(dev);
	if (err) {
		tk_buf_free(b);
		return err;
	}
	b->size = size;
	b->kind = "udmabuf";
	b->va = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, b->memfd, 0);
	if (b->va == MAP_FAILED) {
		err = -errno;
		b->va = NULL;
		tk_buf_free(b);
		return err;
	}
	memset(b->va, 0, size);
	return 0;
}

/*
 * Does the scatter list match the physical addresses of the CPU view, page by page (pagemap)?
 * Returns the number of mismatching pages; *first gets the first such page offset.
 */
static inline size_t tk_segs_vs_pagemap(const struct tk_buf *b, const struct upcie_sg_seg *segs,
					size_t n, uint64_t *first)
{
	size_t bad = 0, s = 0;
	uint64_t segoff = 0;

	*first = UINT64_MAX;
	for (uint64_t off = 0; off < b->size; off += 4096) {
		uint64_t phys = 0, want;

		while (s < n && off >= segoff + segs[s].len) {
			segoff += segs[s].len;
			s++;
		}
		want = s < n ? segs[s].addr + (off - segoff) : 0;
		if (upcie_pagemap_phys((char *)b->va + off, &phys) || phys != want) {
			if (!bad)
				*first = off;
			bad++;
		}
	}
	return bad;
}

/* Device address of byte `off` of the buffer a scatter list describes; UINT64_MAX beyond it. */
static inline uint64_t tk_seg_addr(const struct upcie_sg_seg *segs, size_t n, uint64_t off)
{
	for (size_t k = 0; k < n; k++) {
		if (off < segs[k].len)
			return segs[k].addr + off;
		off -= segs[k].len;
	}
	return UINT64_MAX;
}

/* Largest granule shift (12..21) that every segment start and every length but the last obey. */
static inline unsigned tk_granule(const struct upcie_sg_seg *segs, size_t n)
{
	unsigned shift = 21;

	for (size_t i = 0; i < n; i++) {
		uint64_t v = segs[i].addr | (i + 1 < n ? segs[i].len : 0);

		while (shift > 12 && (v & ((UINT64_C(1) << shift) - 1)))
			shift--;
	}
	return shift;
}

/* ---- a controller that moves data: nvme/ctrl.h + nvme/ns.h ---- */

struct tk_nvme {
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	bool up;
};

/* Bring the controller at `regs` up with host memory `host`, open namespace `nsid` and one I/O
 * queue of 32 entries (queues stay within 4 KiB, so any LUT granule will do). */
static inline int tk_nvme_up(struct tk_nvme *n, volatile void *regs, size_t regs_size,
			     const struct upcie_dmamem *host, uint32_t nsid)
{
	struct upcie_nvme_ctrl_opts co;
	struct upcie_nvme_ioq_opts qo;
	int err;

	memset(n, 0, sizeof(*n));
	memset(&co, 0, sizeof(co));
	co.admin_depth = 32;
	co.io_queues = 2;
	err = upcie_nvme_ctrl_init(&n->c, regs, regs_size, host, &co);
	if (err)
		return err;
	err = upcie_nvme_ns_open(&n->ns, &n->c, nsid);
	if (err)
		goto fail;
	memset(&qo, 0, sizeof(qo));
	qo.depth = 32;
	err = upcie_nvme_ioq_create(&n->q, &n->c, &qo);
	if (err)
		goto fail;
	n->up = true;
	return 0;
fail:
	upcie_nvme_ctrl_close(&n->c);
	memset(n, 0, sizeof(*n));
	return err;
}

static inline void tk_nvme_down(struct tk_nvme *n)
{
	if (!n->up)
		return;
	upcie_nvme_ioq_delete(&n->q);
	upcie_nvme_ns_close(&n->ns);
	upcie_nvme_ctrl_close(&n->c);
	memset(n, 0, sizeof(*n));
}

/* Read (write = false) or Write `len` bytes at LBA `slba` from/to mem[off, off + len). */
static inline int tk_nvme_rw(struct tk_nvme *n, bool write, uint64_t slba,
			     const struct upcie_dmamem *mem, uint64_t off, uint64_t len)
{
	struct upcie_nvme_cqe cqe;

	memset(&cqe, 0, sizeof(cqe));
	return write ? upcie_nvme_ioq_write_sync(&n->q, &n->ns, slba, mem, off, len, &cqe)
		     : upcie_nvme_ioq_read_sync(&n->q, &n->ns, slba, mem, off, len, &cqe);
}

/* Where a function's MSI-X table is: BAR index and offset, from its config space (sysfs). */
static inline int tk_msix_table(const struct upcie_pci_bdf *bdf, unsigned *bir, uint64_t *off)
{
	char path[128], name[UPCIE_PCI_BDF_STRLEN];
	uint8_t cfg[256];
	unsigned pos, n = 0;
	ssize_t got;
	int fd;

	upcie_pci_bdf_format(bdf, name, sizeof(name));
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/config", name);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return -errno;
	got = pread(fd, cfg, sizeof(cfg), 0);
	close(fd);
	if (got != (ssize_t)sizeof(cfg) || !(cfg[6] & 0x10))
		return -ENOENT;
	for (pos = cfg[0x34] & 0xfc; pos && pos < 0xfc && n < 48; pos = cfg[pos + 1] & 0xfc, n++) {
		if (cfg[pos] == 0x11) {
			uint32_t t = (uint32_t)cfg[pos + 4] | (uint32_t)cfg[pos + 5] << 8 |
				     (uint32_t)cfg[pos + 6] << 16 | (uint32_t)cfg[pos + 7] << 24;

			*bir = t & 7;
			*off = t & ~UINT32_C(7);
			return 0;
		}
	}
	return -ENOENT;
}

/* Unload a module without waiting: 0 or -errno (EBUSY/EAGAIN while in use). */
static inline int tk_rmmod(const char *name)
{
	return syscall(SYS_delete_module, name, O_NONBLOCK) ? -errno : 0;
}

#endif /* T_KMOD_H */
