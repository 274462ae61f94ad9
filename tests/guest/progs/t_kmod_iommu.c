/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest test of the iommu_map_pa module and upcie/kmod/iommu_map_pa.h.
 *
 * Under the vIOMMU (B, C): both NVMe controllers on vfio-pci in one type1 container, the IOVA
 * window checked against the container's ranges and carved out of its allocator, the ivshmem
 * BAR's physical pages ("vram", standing in for GPU memory) mapped into the controllers'
 * domain inside the window (4 KiB pages into both controllers at the same IOVAs, 2 MiB pages
 * into one); the controllers Read a namespace into those IOVAs and Write from them: the data
 * lands in / comes from the host's vram file (kmod_iommu.host.sh checks both files).
 * Identity mapping (MAP_BAR): refused (ENODEV, also TRANSLATE) for a target with no driver
 * bound and (EPERM) for one on vfio-pci that user space has not claimed; a controller's BAR0
 * into the kernel DMA domain of the ivshmem function (on uio_pci_generic: the stand-in for a
 * GPU under its driver), collision (EEXIST) and the share override, and the target's driver
 * unbinding or changing under a live mapping (the mapping goes with it); then the
 * second controller, moved to uio_pci_generic (a kernel DMA domain: the stand-in for a GPU
 * issuing peer-to-peer writes) with its queues in a vgem dma-buf imported for it, Reads into
 * the identity-mapped ivshmem BAR: the data lands in the vram file.
 * Refusals: unprivileged open, kernel-owned domains, system RAM, alignment, overflow, aperture,
 * the MSI window, overlap with this file's mappings and with vfio's own, bad descriptors,
 * reserved bits, unknown requests, double unmap, windows outside the ranges or full; a child's
 * mappings go when it exits; the module is not unloaded while a file is open.
 * Without an IOMMU (A): MAP is -ENODEV, MAP_BAR answers PASSTHROUGH, TRANSLATE says NONE;
 * both are -ENODEV for a target with no driver bound.
 *
 * Usage: t_kmod_iommu NVME0_BDF NVME1_BDF VRAM_BDF   (modules iommu_map_pa, dmabuf_import,
 * vfio-pci, uio_pci_generic, vgem loaded; 16 hugepages)
 */
// testbed-ldflags: -lpthread
#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <upcie/kmod/dmabuf_import.h>
#include <upcie/kmod/iommu_map_pa.h>
#include <upcie/mem/dmamem_iommufd.h>
#include <upcie/mem/dmamem_type1.h>
#include <upcie/mem/hugepage.h>
#include <upcie/pci/bar.h>
#include <upcie/pci/config.h>
#include <upcie/pci/driver.h>
#include <upcie/base/clock.h>
#include <upcie/nvme/cmd.h>
#include <upcie/vfio/cdev.h>
#include <upcie/vfio/device.h>
#include <upcie/vfio/iommufd.h>
#include <upcie/vfio/type1.h>

#include "t_kmod.h"
#include "../kmod-test/tb_barbuf.h"

#define DEV UPCIE_IOMMU_MAP_PA_DEVICE

/* where in the vram BAR the tests put things (kmod_iommu.host.sh reads the same offsets) */
#define V_MAP4K	  (8 * MiB)  /* 4 MiB mapped with 4 KiB pages into both controllers */
#define V_MAP2M	  (16 * MiB) /* 4 MiB mapped with 2 MiB pages into c0 */
#define V_IDENT	  (32 * MiB) /* 1 MiB identity-mapped into c1's kernel DMA domain */
#define V_CHILD	  (40 * MiB) /* mapped by a child that exits */
#define V_REFUSE  (48 * MiB)
#define V_IOMMUFD (52 * MiB) /* mapped into c0's iommufd domain (7.x with the iommufd rebuild) */
#define V_LIFE	  (56 * MiB) /* exported by tb_barbuf, mapped with it as lifetime */

static struct upcie_pci_bdf c0, c1, vram;
static char n0[UPCIE_PCI_BDF_STRLEN], n1[UPCIE_PCI_BDF_STRLEN], nv[UPCIE_PCI_BDF_STRLEN];
/* the open vfio devices of c0 and c1: the proof of owning their domains (-1: not open) */
static int own0 = -1, own1 = -1;

static int owner_of(const struct upcie_pci_bdf *b)
{
	if (!memcmp(b, &c0, sizeof(*b)))
		return own0;
	if (!memcmp(b, &c1, sizeof(*b)))
		return own1;
	return -1;
}

static struct upcie_kmod_iommu_target target(const struct upcie_pci_bdf *b)
{
	struct upcie_kmod_iommu_target t = { *b, owner_of(b) };

	return t;
}

static uint64_t live(struct upcie_kmod_iommu_map_pa *ctx)
{
	struct upcie_iommu_map_pa_info info;

	return upcie_kmod_iommu_map_pa_info(ctx, &info) ? UINT64_MAX : info.mappings;
}

static uint64_t xlate(struct upcie_kmod_iommu_map_pa *ctx, const struct upcie_pci_bdf *b,
		      uint64_t iova, unsigned *type)
{
	uint64_t phys = UINT64_MAX;

	upcie_kmod_iommu_map_pa_translate(ctx, b, owner_of(b), iova, &phys, type);
	return phys;
}

static int raw_map(struct upcie_kmod_iommu_map_pa *ctx, const struct upcie_pci_bdf *b,
		   uint64_t iova, const uint64_t *pages, uint64_t npages, uint64_t page_size,
		   void (*tweak)(struct upcie_iommu_map_pa_map *))
{
	struct upcie_iommu_map_pa_map m;
	int err;

	memset(&m, 0, sizeof(m));
	m.pci.segment = b->domain;
	m.pci.bus = b->bus;
	m.pci.devfn = (uint8_t)(b->dev << 3 | b->fn);
	m.source.segment = vram.domain; /* the pages are vram's unless a tweak says otherwise */
	m.source.bus = vram.bus;
	m.source.devfn = (uint8_t)(vram.dev << 3 | vram.fn);
	m.owner_fd = owner_of(b);
	m.iova = iova;
	m.page_size = page_size;
	m.npages = npages;
	m.pages = (uint64_t)(uintptr_t)pages;
	m.lifetime_fd = -1; /* raw pages, said explicitly, unless a tweak names a dma-buf */
	m.flags = UPCIE_IOMMU_MAP_PA_F_RAW_PAGES;
	if (tweak)
		tweak(&m);
	err = tk_ioctl(ctx->fd, UPCIE_IOMMU_MAP_PA_IOC_MAP, &m);
	if (!err)
		upcie_kmod_iommu_map_pa_unmap(ctx, m.handle); /* a refusal test that passed */
	return err;
}

static void tw_reserved(struct upcie_iommu_map_pa_map *m)
{
	m->reserved[0] = 1;
}
static void tw_flags(struct upcie_iommu_map_pa_map *m)
{
	m->flags |= 1;
}
static void tw_noraw(struct upcie_iommu_map_pa_map *m)
{
	m->flags = 0;
}
static void tw_prot(struct upcie_iommu_map_pa_map *m)
{
	m->prot = 8;
}
static void tw_pcires(struct upcie_iommu_map_pa_map *m)
{
	m->pci.reserved = 1;
}
static int lifetime_fd_;
static void tw_lifetime(struct upcie_iommu_map_pa_map *m)
{
	m->lifetime_fd = lifetime_fd_;
	m->flags = 0;
}
static void tw_lifetime_raw(struct upcie_iommu_map_pa_map *m)
{
	m->lifetime_fd = lifetime_fd_;
}

/* tb_barbuf (tests/guest/kmod-other): a dma-buf over [off, off + len) of vram's BAR2, or -errno */
static int tbb_fd = -1;
static int tbb_export(uint64_t off, uint64_t len, uint32_t flags)
{
	struct tb_barbuf_export e;

	if (tbb_fd < 0)
		tbb_fd = open(TB_BARBUF_DEVICE, O_RDWR | O_CLOEXEC);
	if (tbb_fd < 0)
		return -errno;
	memset(&e, 0, sizeof(e));
	e.segment = vram.domain;
	e.bus = vram.bus;
	e.devfn = (uint8_t)(vram.dev << 3 | vram.fn);
	e.bar = 2;
	e.flags = flags;
	e.offset = off;
	e.len = len;
	return ioctl(tbb_fd, TB_BARBUF_IOC_EXPORT, &e) ? -errno : e.fd;
}

/* pins and attachments of a tb_barbuf dma-buf now; -1 each when it cannot be asked */
static void tbb_state(int fd, int *pins, int *attached)
{
	struct tb_barbuf_state st;

	memset(&st, 0, sizeof(st));
	st.fd = fd;
	*pins = *attached = -1;
	if (tbb_fd >= 0 && !ioctl(tbb_fd, TB_BARBUF_IOC_STATE, &st)) {
		*pins = (int)st.pins;
		*attached = (int)st.attached;
	}
}
static int owner_fd_;
static void tw_owner(struct upcie_iommu_map_pa_map *m)
{
	m->owner_fd = owner_fd_;
}
/* Is the module's file readable now (poll, no wait)? */
static int readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLPRI };

	return poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLPRI));
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/*
 * A second process opens c0's vfio cdev without binding it (vfio lets any process do that,
 * whoever owns the device) and names it as owner: that proves nothing, MAP must be EACCES.
 */
static void test_unbound_cdev(struct upcie_kmod_iommu_map_pa *ctx, uint64_t iova,
			      const uint64_t *pages, const char *how)
{
	char name[32], path[64];
	int status = -1;
	pid_t pid;

	if (upcie_vfio_cdev_find(&c0, name, sizeof(name)) ||
	    snprintf(path, sizeof(path), "/dev/vfio/devices/%s", name) >= (int)sizeof(path) ||
	    access(path, F_OK)) {
		SKIPPED("no vfio cdev on this kernel",
			"a second process with %s's vfio cdev open, not bound (%s)", n0, how);
		return;
	}
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		int fd = open(path, O_RDWR), r;

		if (fd < 0)
			_exit(2);
		owner_fd_ = fd;
		r = raw_map(ctx, &c0, iova, pages, 4, 4096, tw_owner);
		_exit(r == -EACCES ? 0 : r == 0 ? 3 : 4);
	}
	if (pid > 0)
		waitpid(pid, &status, 0);
	TAP(pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	    "a second process opens %s (%s's cdev; %s) without binding it and names it as owner: "
	    "MAP is EACCES (child exit %d: 0 refused, 3 mapped)",
	    path, n0, how, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* A MAP made in a thread, timed. */
struct long_map {
	struct upcie_kmod_iommu_map_pa *ctx;
	struct upcie_iommu_map_pa_map m;
	volatile int started;
	double t0, t1;
	int ret;
};

static void *long_map_fn(void *arg)
{
	struct long_map *l = arg;

	l->started = 1;
	l->t0 = now_s();
	l->ret = tk_ioctl(l->ctx->fd, UPCIE_IOMMU_MAP_PA_IOC_MAP, &l->m);
	l->t1 = now_s();
	return NULL;
}

/*
 * The owner detaches its device (and so destroys the page table iommufd made for it) while a
 * long MAP runs into that page table: the module holds the group's mutex while it uses the
 * domain, so the detach waits for the MAP to end (or goes first, and the MAP is refused); the
 * module never writes into a freed page table. Afterwards the mapping's domain is gone and
 * UNMAP does not touch it. The pages: one vram page named n times (n separate iommu_map()s).
 * The detach starts later in each round until one lands while the MAP runs.
 */
static void test_detach_during_map(struct upcie_kmod_iommu_map_pa *ctx,
				   struct upcie_vfio_device *dev, struct upcie_vfio_ioas *ioas,
				   uint64_t iova, uint64_t page)
{
	enum { N = 262144 };
	static const unsigned delay_ms[] = { 5, 30, 100, 300, 800, 2000 };
	struct long_map l;
	uint64_t *pages = malloc(N * sizeof(*pages));
	double d0 = 0, d1 = 0;
	bool raced = false, ok = true, unmapped = true;
	unsigned type = 99, round;
	pthread_t t;
	int err = 0;

	if (!pages) {
		TAP(0, "iommufd: pages for the long MAP");
		return;
	}
	for (int i = 0; i < N; i++)
		pages[i] = page;
	for (round = 0; round < sizeof(delay_ms) / sizeof(delay_ms[0]) && !raced; round++) {
		if (round && (err = upcie_vfio_cdev_attach(dev, ioas)))
			break;
		memset(&l, 0, sizeof(l));
		l.ctx = ctx;
		l.m.pci.segment = c0.domain;
		l.m.pci.bus = c0.bus;
		l.m.pci.devfn = (uint8_t)(c0.dev << 3 | c0.fn);
		l.m.source.segment = vram.domain;
		l.m.source.bus = vram.bus;
		l.m.source.devfn = (uint8_t)(vram.dev << 3 | vram.fn);
		l.m.owner_fd = dev->fd;
		l.m.iova = iova;
		l.m.page_size = 4096;
		l.m.npages = N;
		l.m.pages = (uint64_t)(uintptr_t)pages;
		l.m.lifetime_fd = -1;
		l.m.flags = UPCIE_IOMMU_MAP_PA_F_RAW_PAGES;
		err = pthread_create(&t, NULL, long_map_fn, &l);
		if (err)
			break;
		while (!l.started)
			usleep(100);
		usleep(delay_ms[round] * 1000);
		d0 = now_s();
		err = upcie_vfio_cdev_detach(dev);
		d1 = now_s();
		pthread_join(t, NULL);
		INFO("detach_during_map",
		     "round %u: map 0.000..%.3f s ret %d, detach %.3f..%.3f s ret %d", round,
		     l.t1 - l.t0, l.ret, d0 - l.t0, d1 - l.t0, err);
		if (err)
			break;
		/*
		 * The MAP thread reads its clock after the ioctl returned, which is after the
		 * module let go of the group's mutex: a detach that waited may end a few ms
		 * before that. So a race counts when the detach began well before the MAP ended,
		 * and it waited when it ended no earlier than 50 ms before (one that did not wait
		 * ends within ms of its start, over 100 ms before).
		 */
		if (!l.ret && d0 < l.t1 - 0.1) {
			raced = true;
			ok = d1 >= l.t1 - 0.05; /* the detach waited for the MAP */
		} else if (l.ret && l.ret != -EPERM) {
			ok = false; /* refused for another reason than the domain being gone */
			raced = true;
		}
		if (!l.ret) {
			tk_sh("dmesg -c >/dev/null");
			unmapped =
			    unmapped && !upcie_kmod_iommu_map_pa_unmap(ctx, l.m.handle) &&
			    !tk_sh("dmesg | grep -q 'is no longer attached; nothing to unmap'");
		}
	}
	if (err) {
		TAP(0, "iommufd: detach/attach/thread for the long-MAP race (%d)", err);
	} else if (!raced) {
		SKIPPED("no round's detach landed while the MAP ran",
			"iommufd: the owner detaches %s during a long MAP", n0);
	} else {
		TAP(ok,
		    "iommufd: the owner detaches %s (its page table destroyed with it) while a MAP "
		    "of %d pages runs: the detach waits for the MAP (MAP %d after %.3f s, detach "
		    "%.3f..%.3f s)",
		    n0, N, l.ret, l.t1 - l.t0, d0 - l.t0, d1 - l.t0);
	}
	TAP(unmapped, "iommufd: UNMAP after the detach returns 0 and leaves the destroyed page "
		      "table alone (the kernel log says it is no longer attached)");
	TAP(xlate(ctx, &c0, iova, &type) == 0 && type == UPCIE_IOMMU_MAP_PA_DOMAIN_BLOCKED,
	    "iommufd: %s detached: its DMA is blocked (TRANSLATE: kind %u)", n0, type);
	free(pages);
}

static struct upcie_pci_bdf source_;
static void tw_source(struct upcie_iommu_map_pa_map *m)
{
	m->source.segment = source_.domain;
	m->source.bus = source_.bus;
	m->source.devfn = (uint8_t)(source_.dev << 3 | source_.fn);
}

static void test_basics(struct upcie_kmod_iommu_map_pa *ctx)
{
	struct upcie_iommu_map_pa_info info;
	struct stat st;
	pid_t pid;
	int status, err;

	TAP(!stat(DEV, &st) && S_ISCHR(st.st_mode) && (st.st_mode & 0777) == 0600,
	    "%s is a character device, mode 0600", DEV);
	err = upcie_kmod_iommu_map_pa_open(ctx);
	TAP(!err && ctx->fd > 0, "open (%d)", err);
	TAP(!upcie_kmod_iommu_map_pa_info(ctx, &info) && info.abi == UPCIE_IOMMU_MAP_PA_ABI,
	    "INFO: ABI %u, max_mappings %u, max_map_pages %" PRIu64, info.abi, info.max_mappings,
	    (uint64_t)info.max_map_pages);
	chmod(DEV, 0666);
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		if (setgid(65534) || setuid(65534))
			_exit(99);
		_exit(open(DEV, O_RDWR) >= 0 ? 0 : errno);
	}
	waitpid(pid, &status, 0);
	chmod(DEV, 0600);
	TAP(WIFEXITED(status) && WEXITSTATUS(status) == EPERM,
	    "unprivileged open (mode opened up): EPERM from the module (got %d)",
	    WEXITSTATUS(status));
}

/* Config A: nothing translates, so nothing is mapped. */
static void test_no_iommu(struct upcie_kmod_iommu_map_pa *ctx, const struct upcie_pci_bar *vbar)
{
	struct upcie_kmod_bar_map bm;
	uint64_t page = vbar->phys + V_MAP4K, h;
	unsigned type = 99;

	struct upcie_kmod_iommu_target t0 = { c0, open("/dev/null", O_RDONLY) };

	TAP(upcie_kmod_iommu_map_pa_map(ctx, &t0, &vram, UPCIE_KMOD_IOVA_WINDOW_BASE, &page, 1,
					4096, 0, UPCIE_KMOD_IOMMU_RAW_PAGES, &h, NULL) == -ENODEV,
	    "MAP without an IOMMU: -ENODEV");
	close(t0.owner_fd);
	TAP(!upcie_kmod_iommu_map_pa_map_bar(ctx, &c0, &vram, 2, 0, 0, 0, &bm) &&
		bm.result == UPCIE_IOMMU_MAP_PA_BAR_PASSTHROUGH && !bm.handle &&
		bm.iova == vbar->phys,
	    "MAP_BAR without an IOMMU: PASSTHROUGH at the BAR's address, no handle");
	TAP(xlate(ctx, &c0, 0x1000, &type) == 0 && type == UPCIE_IOMMU_MAP_PA_DOMAIN_NONE,
	    "TRANSLATE: domain NONE");
	/* a target must have a driver bound, with or without an IOMMU */
	upcie_pci_driver_unbind(&vram);
	TAP(upcie_kmod_iommu_map_pa_map_bar(ctx, &vram, &c0, 0, 0x1000, 0x1000, 0, &bm) ==
		    -ENODEV &&
		upcie_kmod_iommu_map_pa_translate(ctx, &vram, -1, 0x1000, &h, &type) == -ENODEV,
	    "%s with no driver bound as target: MAP_BAR and TRANSLATE are -ENODEV", nv);
	TAP(live(ctx) == 0, "nothing mapped");
}

static int vfio_bus_master(struct upcie_vfio_device *d)
{
	uint16_t cmd = 0;
	int err = upcie_vfio_region_rw(d, VFIO_PCI_CONFIG_REGION_INDEX, UPCIE_PCI_CFG_COMMAND, &cmd,
				       2, 0);

	cmd |= 0x6; /* memory space, bus master */
	return err ? err
		   : upcie_vfio_region_rw(d, VFIO_PCI_CONFIG_REGION_INDEX, UPCIE_PCI_CFG_COMMAND,
					  &cmd, 2, 1);
}

struct vctl {
	struct upcie_vfio_device dev;
	struct upcie_vfio_region bar0;
	struct upcie_dmamem host;
	struct tk_nvme nv;
};

static int vctl_up(struct vctl *v, struct upcie_vfio_group *g, struct upcie_vfio_container *c,
		   const struct upcie_pci_bdf *b, uint32_t nsid)
{
	int err;

	memset(v, 0, sizeof(*v));
	err = upcie_vfio_device_open(&v->dev, g, b);
	if (!err)
		err = upcie_vfio_region_map(&v->dev, VFIO_PCI_BAR0_REGION_INDEX, &v->bar0);
	if (!err)
		err = vfio_bus_master(&v->dev);
	if (!err)
		err = upcie_dmamem_type1_hugepage(&v->host, c, 4 * MiB, NULL);
	if (!err)
		err =
		    tk_nvme_up(&v->nv, (volatile void *)v->bar0.addr, v->bar0.size, &v->host, nsid);
	return err;
}

static void vctl_down(struct vctl *v)
{
	tk_nvme_down(&v->nv);
	upcie_dmamem_destroy(&v->host);
	upcie_vfio_region_unmap(&v->bar0);
	upcie_vfio_device_close(&v->dev);
}

static void test_window(const struct upcie_vfio_iova_ranges *usable)
{
	struct upcie_kmod_iova_window w;
	uint64_t iova;

	setenv("UPCIE_IOVA_BASE", "0x10000000000", 1); /* 1 TiB: past a 39-bit domain */
	TAP(!upcie_kmod_iova_window_init(&w, 4096) &&
		upcie_kmod_iova_window_check(&w, usable) == -ERANGE,
	    "window at 1 TiB (UPCIE_IOVA_BASE): outside the usable ranges, -ERANGE");
	upcie_kmod_iova_window_fini(&w);
	setenv("UPCIE_IOVA_BASE", "0xfec00000", 1); /* across the MSI window */
	setenv("UPCIE_IOVA_SIZE", "0x400000", 1);
	TAP(!upcie_kmod_iova_window_init(&w, 4096) &&
		upcie_kmod_iova_window_check(&w, usable) == -ERANGE,
	    "window across the MSI hole: -ERANGE");
	upcie_kmod_iova_window_fini(&w);
	unsetenv("UPCIE_IOVA_BASE");
	setenv("UPCIE_IOVA_SIZE", "0x200000", 1);
	TAP(!upcie_kmod_iova_window_init(&w, 4096) && !upcie_kmod_iova_window_check(&w, usable) &&
		upcie_kmod_iova_window_alloc(&w, 4 * MiB, 0, &iova) == -ENOSPC,
	    "a 2 MiB window (UPCIE_IOVA_SIZE) asked for 4 MiB: -ENOSPC");
	upcie_kmod_iova_window_fini(&w);
	setenv("UPCIE_IOVA_SIZE", "lots", 1);
	TAP(upcie_kmod_iova_window_init(&w, 4096) == -EINVAL, "UPCIE_IOVA_SIZE=lots: -EINVAL");
	unsetenv("UPCIE_IOVA_SIZE");
}

static void test_refusals(struct upcie_kmod_iommu_map_pa *ctx, const struct upcie_pci_bar *vbar,
			  const struct upcie_dmamem *mapped, const struct upcie_dmamem *vfio_mem,
			  const struct tk_buf *vg, uint64_t win_free)
{
	struct upcie_iommu_map_pa_info info;
	uint64_t pages[4], ram = 0, h;
	struct upcie_dmamem hp;
	unsigned type;
	int fd;

	for (int i = 0; i < 4; i++)
		pages[i] = vbar->phys + V_REFUSE + (uint64_t)i * 4096;
	owner_fd_ = own0;
	TAP(raw_map(ctx, &vram, win_free, pages, 4, 4096, tw_owner) == -EPERM &&
		xlate(ctx, &vram, 0, &type) == 0 && type == UPCIE_IOMMU_MAP_PA_DOMAIN_DMA,
	    "MAP into %s (uio_pci_generic: the kernel's DMA domain): EPERM", nv);
	/* the proof of owning the domain */
	owner_fd_ = -1;
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, tw_owner) == -EBADF,
	    "MAP into %s without its vfio device (owner -1): EBADF", n0);
	fd = open("/dev/null", O_RDONLY);
	owner_fd_ = fd;
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, tw_owner) == -EACCES,
	    "MAP into %s with /dev/null as owner: EACCES", n0);
	close(fd);
	owner_fd_ = own1;
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, tw_owner) == -EACCES,
	    "MAP into %s with %s's vfio device as owner (same container): EACCES", n0, n1);
	owner_fd_ = ctx->fd;
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, tw_owner) == -EACCES,
	    "MAP into %s with the module's own file as owner: EACCES", n0);
	test_unbound_cdev(ctx, win_free, pages, "its type1 group owns it");
	/* what the pages may be */
	source_ = c0;
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, tw_source) == -EPERM,
	    "vram pages named as memory of %s (not in its BARs): EPERM", n0);
	{
		uint64_t msix = 0, bar0p = 0;
		unsigned bir = 9;

		if (!tk_msix_table(&c1, &bir, &msix)) {
			struct upcie_pci_resource res[UPCIE_PCI_NUM_RES];

			upcie_pci_func_resources(&c1, res);
			bar0p = res[bir].start + (msix & ~UINT64_C(4095));
			source_ = c1;
			TAP(raw_map(ctx, &c0, win_free, &bar0p, 1, 4096, tw_source) == -EPERM,
			    "the page of %s's MSI-X table (BAR%u + 0x%" PRIx64 "), as its memory: "
			    "EPERM",
			    n1, bir, msix);
		} else {
			TAP(0, "%s's MSI-X table from its config space", n1);
		}
	}
	if (!upcie_dmamem_hugepage_lut(&hp, 2 * MiB, NULL)) {
		ram = hp.lut[0];
		TAP(raw_map(ctx, &c0, win_free, &ram, 1, 4096, NULL) == -EPERM,
		    "MAP of a system RAM page (a hugepage at 0x%" PRIx64 ") as vram's memory: "
		    "EPERM",
		    ram);
		upcie_dmamem_destroy(&hp);
	} else {
		TAP(0, "hugepage for the RAM refusal");
	}
	TAP(raw_map(ctx, &c0, win_free + 0x800, pages, 1, 4096, NULL) == -EINVAL,
	    "IOVA not page aligned: EINVAL");
	pages[3] += 0x100;
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, NULL) == -EINVAL,
	    "page address not page aligned: EINVAL");
	pages[3] -= 0x100;
	TAP(raw_map(ctx, &c0, win_free, pages, 1, 0x3000, NULL) == -EINVAL,
	    "page size 0x3000: EINVAL");
	TAP(raw_map(ctx, &c0, win_free, pages, 1, 2048, NULL) == -EINVAL,
	    "page size 2 KiB: EINVAL");
	TAP(raw_map(ctx, &c0, win_free, pages, 0, 4096, NULL) == -EINVAL, "no pages: EINVAL");
	TAP(raw_map(ctx, &c0, UINT64_MAX - 4095, pages, 2, 4096, NULL) == -EINVAL,
	    "range wrapping past 2^64: EINVAL");
	TAP(raw_map(ctx, &c0, 0, pages, 4, UINT64_C(1) << 62, NULL) == -EINVAL,
	    "npages * page_size overflowing: EINVAL");
	upcie_kmod_iommu_map_pa_info(ctx, &info);
	TAP(raw_map(ctx, &c0, win_free, pages, info.max_map_pages + 1, 4096, NULL) == -E2BIG,
	    "more pages than max_map_pages: E2BIG");
	TAP(raw_map(ctx, &c0, UINT64_C(1) << 39, pages, 4, 4096, NULL) == -ERANGE,
	    "IOVA at 512 GiB, past the 39-bit aperture: ERANGE");
	TAP(raw_map(ctx, &c0, 0xfee00000, pages, 4, 4096, NULL) == -ERANGE,
	    "IOVA in the MSI window: ERANGE");
	TAP(raw_map(ctx, &c0, mapped->iova + 8192, pages, 4, 4096, NULL) == -EEXIST,
	    "overlapping this file's mapping with other pages: EEXIST");
	TAP(raw_map(ctx, &c0, vfio_mem->iova, pages, 4, 4096, NULL) == -EEXIST,
	    "over vfio's own mapping (the queues' IOVA 0x%" PRIx64 "): EEXIST", vfio_mem->iova);
	TAP(raw_map(ctx, &c0, win_free, NULL, 4, 4096, NULL) == -EFAULT, "NULL page array: EFAULT");
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, tw_reserved) == -EINVAL,
	    "reserved field set: EINVAL");
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, tw_flags) == -EINVAL,
	    "unknown flag: EINVAL");
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, tw_prot) == -EINVAL,
	    "unknown protection bit: EINVAL");
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, tw_pcires) == -EINVAL,
	    "reserved bits in the PCI address: EINVAL");
	fd = open("/dev/null", O_RDONLY);
	lifetime_fd_ = fd;
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, tw_lifetime) == -EINVAL,
	    "lifetime fd that is not a dma-buf: EINVAL");
	close(fd);
	lifetime_fd_ = 1000;
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, tw_lifetime) == -EBADF,
	    "lifetime fd not open: EBADF");
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, tw_noraw) == -EINVAL,
	    "no lifetime dma-buf and no F_RAW_PAGES: EINVAL");
	lifetime_fd_ = vg->fd;
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, tw_lifetime_raw) == -EINVAL,
	    "a lifetime dma-buf and F_RAW_PAGES together: EINVAL");
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, tw_lifetime) == -ENXIO,
	    "lifetime fd = a %s dma-buf that does not hold the pages: ENXIO", vg->kind);
	TAP(raw_map(ctx, &c0, win_free, pages, 4, 4096, NULL) == 0,
	    "control: the same pages as raw pages (F_RAW_PAGES): mapped (and unmapped)");
	{
		struct upcie_pci_bdf none = { .domain = 0, .bus = 0xfe, .dev = 31, .fn = 7 };

		owner_fd_ = own0;
		TAP(raw_map(ctx, &none, win_free, pages, 4, 4096, tw_owner) == -ENODEV,
		    "a function that does not exist: ENODEV");
	}
	TAP(tk_ioctl(ctx->fd, _IOWR(UPCIE_IOMMU_MAP_PA_IOC_TYPE, 0x1f, uint64_t), &h) == -ENOTTY,
	    "unknown request: ENOTTY");
	TAP(tk_ioctl(ctx->fd, _IOWR(UPCIE_IOMMU_MAP_PA_IOC_TYPE, 0x11, uint64_t), &h) == -ENOTTY,
	    "MAP with the wrong size: ENOTTY");
	TAP(upcie_kmod_iommu_map_pa_unmap(ctx, 999999) == -ENOENT, "unmap of a handle never made: "
								   "-ENOENT");
	TAP(xlate(ctx, &c0, win_free, NULL) == 0, "no refusal left a translation behind");
}

/*
 * The dma-buf a MAP names as lifetime_fd keeps the memory: the module pins it (tb_barbuf counts
 * pins and attachments), checks every page against its scatter list, keeps it whatever the
 * caller closes, drops it at UNMAP, and unmaps at once when the exporter takes it back.
 */
static void test_lifetime(const struct upcie_pci_bar *vbar, uint64_t iova)
{
	/* a file of its own: its readiness tells of this test's handles only */
	struct upcie_kmod_iommu_map_pa own = { 0 }, *ctx = &own;
	struct upcie_kmod_iommu_target t0 = target(&c0);
	uint64_t pages[16], h = 0, was;
	int fd, peek, pins, att, err;

	if (upcie_kmod_iommu_map_pa_open(ctx)) {
		TAP(0, "a second iommu_map_pa file for the lifetime test");
		return;
	}
	was = live(ctx);

	for (int i = 0; i < 16; i++)
		pages[i] = vbar->phys + V_LIFE + (uint64_t)i * 4096;
	fd = tbb_export(V_LIFE, 64 * KiB, 0);
	TAP(fd >= 0, "tb_barbuf exports vram [56 MiB, +64 KiB) as a dma-buf with a pin op (%d)",
	    fd);
	if (fd < 0) {
		upcie_kmod_iommu_map_pa_close(ctx);
		return;
	}
	peek = dup(fd); /* to ask the exporter after the caller's descriptor is gone */
	err = upcie_kmod_iommu_map_pa_map(ctx, &t0, &vram, iova, pages, 16, 4096, 0, fd, &h, NULL);
	tbb_state(peek, &pins, &att);
	TAP(!err && xlate(ctx, &c0, iova + 4096, NULL) == pages[1] && pins == 1 && att == 1,
	    "MAP with the pages' dma-buf as lifetime: mapped, the buffer pinned once (pins %d, "
	    "attachments %d)",
	    pins, att);
	close(fd);
	tbb_state(peek, &pins, &att);
	TAP(pins == 1 && xlate(ctx, &c0, iova, NULL) == pages[0],
	    "the caller closes its dma-buf descriptor: still pinned and mapped (pins %d)", pins);
	TAP(!upcie_kmod_iommu_map_pa_unmap(ctx, h), "UNMAP");
	tbb_state(peek, &pins, &att);
	TAP(pins == 0 && att == 0 && xlate(ctx, &c0, iova, NULL) == 0 && live(ctx) == was,
	    "after UNMAP: unpinned, detached, nothing translated (pins %d, attachments %d)", pins,
	    att);
	/* control of the pin count: raw pages leave the buffer alone */
	err = upcie_kmod_iommu_map_pa_map(ctx, &t0, &vram, iova, pages, 16, 4096, 0,
					  UPCIE_KMOD_IOMMU_RAW_PAGES, &h, NULL);
	tbb_state(peek, &pins, &att);
	TAP(!err && pins == 0 && att == 0,
	    "control: the same pages mapped raw (UPCIE_KMOD_IOMMU_RAW_PAGES): the buffer is not "
	    "pinned (pins %d)",
	    pins);
	if (!err)
		upcie_kmod_iommu_map_pa_unmap(ctx, h);

	/* pages the buffer does not hold: all of them, or the last one only */
	{
		uint64_t out[2] = { vbar->phys + V_LIFE + 64 * KiB,
				    vbar->phys + V_LIFE + 60 * KiB };

		err = upcie_kmod_iommu_map_pa_map(ctx, &t0, &vram, iova, out, 1, 4096, 0, peek, &h,
						  NULL);
		TAP(err == -ENXIO, "a page of the BAR just past the dma-buf: -ENXIO (%d)", err);
		for (int i = 0; i < 2; i++)
			pages[i] = vbar->phys + V_LIFE + 60 * KiB + (uint64_t)i * 4096;
		err = upcie_kmod_iommu_map_pa_map(ctx, &t0, &vram, iova, pages, 2, 4096, 0, peek,
						  &h, NULL);
		tbb_state(peek, &pins, &att);
		TAP(err == -ENXIO && pins == 0 && att == 0 && xlate(ctx, &c0, iova, NULL) == 0,
		    "a run whose second page is outside the buffer: -ENXIO, nothing mapped, "
		    "nothing left pinned or attached (%d; pins %d, attachments %d)",
		    err, pins, att);
		for (int i = 0; i < 16; i++)
			pages[i] = vbar->phys + V_LIFE + (uint64_t)i * 4096;
	}
	/* an exporter that cannot pin and is not known never to move its buffers */
	fd = tbb_export(V_LIFE, 64 * KiB, TB_BARBUF_F_NOPIN);
	err = fd < 0 ? fd
		     : upcie_kmod_iommu_map_pa_map(ctx, &t0, &vram, iova, pages, 16, 4096, 0, fd,
						   &h, NULL);
	tbb_state(fd, &pins, &att);
	TAP(err == -EOPNOTSUPP && att == 0,
	    "a buffer whose exporter has no pin op and is not in static_exporters: -EOPNOTSUPP "
	    "(%d; attachments %d)",
	    err, att);
	if (fd >= 0)
		close(fd);

	/* the exporter takes the buffer back: the mapping goes at once, poll tells */
	err =
	    upcie_kmod_iommu_map_pa_map(ctx, &t0, &vram, iova, pages, 16, 4096, 0, peek, &h, NULL);
	TAP(!err && xlate(ctx, &c0, iova + 15 * 4096, NULL) == pages[15] && !readable(ctx->fd),
	    "control: mapped again, translated and the file not readable before the revocation");
	if (!err) {
		uint64_t before = live(ctx);
		int32_t rfd = peek;

		TAP(!ioctl(tbb_fd, TB_BARBUF_IOC_REVOKE, &rfd), "tb_barbuf revokes the buffer");
		TAP(xlate(ctx, &c0, iova, NULL) == 0 &&
			xlate(ctx, &c0, iova + 15 * 4096, NULL) == 0,
		    "after the revocation nothing of the range is translated");
		TAP(readable(ctx->fd), "the module's file polls readable: user space is told");
		TAP(upcie_kmod_iommu_map_pa_unmap(ctx, h) == 0 && live(ctx) == before - 1,
		    "the handle answers UNMAP");
		tbb_state(peek, &pins, &att);
		TAP(pins == 0 && att == 0, "unpinned and detached after UNMAP (pins %d)", pins);
	}
	close(peek);
	upcie_kmod_iommu_map_pa_close(ctx);
}

static void test_child(struct upcie_kmod_iommu_map_pa *ctx, const struct upcie_pci_bar *vbar,
		       uint64_t iova)
{
	uint64_t was = live(ctx);
	pid_t pid;
	int status;

	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct upcie_kmod_iommu_map_pa mine = { 0 };
		uint64_t pages[16], h;

		for (int i = 0; i < 16; i++)
			pages[i] = vbar->phys + V_CHILD + (uint64_t)i * 4096;
		struct upcie_kmod_iommu_target t0 = target(&c0);

		/* the child inherited the parent's vfio device descriptor: a proof it holds too */
		if (upcie_kmod_iommu_map_pa_open(&mine) ||
		    upcie_kmod_iommu_map_pa_map(&mine, &t0, &vram, iova, pages, 16, 4096, 0,
						UPCIE_KMOD_IOMMU_RAW_PAGES, &h, NULL))
			_exit(1);
		_exit(xlate(&mine, &c0, iova + 4096, NULL) == pages[1] ? 0 : 2);
	}
	waitpid(pid, &status, 0);
	TAP(WIFEXITED(status) && !WEXITSTATUS(status), "a child maps 16 pages into %s (%d)", n0,
	    WEXITSTATUS(status));
	TAP(xlate(ctx, &c0, iova, NULL) == 0 && xlate(ctx, &c0, iova + 15 * 4096, NULL) == 0 &&
		live(ctx) == was,
	    "the child exits without unmapping: its mappings are gone");
}

/* UNMAP changes a domain: like MAP it needs CAP_SYS_ADMIN, also on an inherited file. */
static void test_unmap_capability(struct upcie_kmod_iommu_map_pa *ctx,
				  const struct upcie_pci_bar *vbar, uint64_t iova)
{
	struct upcie_kmod_iommu_target t0 = target(&c0);
	uint64_t pages[4], h = 0, was = live(ctx);
	pid_t pid;
	int status, err;

	for (int i = 0; i < 4; i++)
		pages[i] = vbar->phys + V_CHILD + (uint64_t)i * 4096;
	err = upcie_kmod_iommu_map_pa_map(ctx, &t0, &vram, iova, pages, 4, 4096, 0,
					  UPCIE_KMOD_IOMMU_RAW_PAGES, &h, NULL);
	if (err) {
		TAP(0, "map for the capability test (%d)", err);
		return;
	}
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		uint64_t hh = h;

		if (setgid(65534) || setuid(65534))
			_exit(99);
		if (ioctl(ctx->fd, UPCIE_IOMMU_MAP_PA_IOC_UNMAP, &hh) == 0)
			_exit(1);
		_exit(errno == EPERM ? 0 : 2);
	}
	waitpid(pid, &status, 0);
	TAP(WIFEXITED(status) && !WEXITSTATUS(status) && xlate(ctx, &c0, iova, NULL) == pages[0],
	    "without CAP_SYS_ADMIN on the inherited file: UNMAP is EPERM, the mapping stays "
	    "(status %d)",
	    WEXITSTATUS(status));
	TAP(!upcie_kmod_iommu_map_pa_unmap(ctx, h) && live(ctx) == was,
	    "with it, the same handle unmaps");
}

/*
 * A target with no driver bound: nothing keeps its kernel DMA domain (a write of its group's
 * sysfs type would free it under a mapping, unnoticed), so neither MAP_BAR nor TRANSLATE takes
 * it; nor MAP_BAR one on vfio-pci that user space has not claimed. Then vram goes to
 * uio_pci_generic (a driver of the kernel DMA API, which holds the domain) for the rest: before
 * anything is mapped, since a change of vram's driver also takes down the mappings of its pages.
 */
static int test_unbound_target(struct upcie_kmod_iommu_map_pa *ctx,
			       const struct upcie_pci_bar *bar0)
{
	const uint64_t db = bar0->phys + UPCIE_KMOD_NVME_DOORBELL_OFFSET;
	struct upcie_kmod_bar_map bm;
	uint64_t was = live(ctx), phys = 1;
	unsigned type = 99;
	char cur[32] = "", path[160];
	FILE *tf;
	int err;

	upcie_pci_driver_unbind(&vram);
	/* what a bound driver prevents: with none, the group's default domain can be replaced */
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/iommu_group/type", nv);
	tf = fopen(path, "r");
	if (!tf || !fgets(cur, sizeof(cur), tf))
		cur[0] = 0;
	if (tf)
		fclose(tf);
	cur[strcspn(cur, "\n")] = 0;
	TAP(cur[0] && !tk_sh("echo identity > %s", path) && !tk_sh("echo %s > %s", cur, path),
	    "%s with no driver bound: its IOMMU group's type (%s) can be changed (to identity "
	    "and back), which frees the domain",
	    nv, cur);
	TAP(upcie_kmod_iommu_map_pa_doorbells(ctx, &vram, &c0, 3, 0, &bm) == -ENODEV &&
		upcie_kmod_iommu_map_pa_translate(ctx, &vram, -1, db, &phys, &type) == -ENODEV &&
		live(ctx) == was,
	    "%s with no driver bound as target: MAP_BAR and TRANSLATE are -ENODEV, nothing "
	    "mapped",
	    nv);
	err = upcie_pci_driver_bind(&vram, "vfio-pci");
	TAP(!err && upcie_kmod_iommu_map_pa_doorbells(ctx, &vram, &c0, 3, 0, &bm) == -EPERM &&
		xlate(ctx, &vram, db, &type) == 0 && type == UPCIE_IOMMU_MAP_PA_DOMAIN_DMA &&
		live(ctx) == was,
	    "%s on vfio-pci, not opened (its default DMA domain held by nothing): MAP_BAR is "
	    "-EPERM; TRANSLATE reads the domain (%d)",
	    nv, err);
	err = upcie_pci_driver_bind(&vram, "uio_pci_generic");
	TAP(!err && xlate(ctx, &vram, db, &type) == 0 && type == UPCIE_IOMMU_MAP_PA_DOMAIN_DMA,
	    "%s bound to uio_pci_generic, a driver of the kernel DMA API: TRANSLATE answers (%d)",
	    nv, err);
	TAP(!err && cur[0] && tk_sh("echo identity > %s 2>/dev/null", path) &&
		xlate(ctx, &vram, db, &type) == 0 && type == UPCIE_IOMMU_MAP_PA_DOMAIN_DMA,
	    "... and the kernel now refuses to change the group's type: the binding holds the "
	    "domain");
	return err;
}

static void test_map_bar(struct upcie_kmod_iommu_map_pa *ctx, const struct upcie_pci_bar *bar0)
{
	struct upcie_kmod_bar_map bm, b2, b3;
	const uint64_t db = bar0->phys + UPCIE_KMOD_NVME_DOORBELL_OFFSET;
	uint64_t was = live(ctx), msix = 0;
	uint64_t phys = 1;
	unsigned type, bir = 9;
	int polled_before;
	int err;

	/* c0 has 2 I/O queue pairs and CAP.DSTRD 0 under QEMU: one doorbell page */
	err = upcie_kmod_iommu_map_pa_doorbells(ctx, &vram, &c0, 3, 0, &bm);
	TAP(!err && bm.result == UPCIE_IOMMU_MAP_PA_BAR_MAPPED && bm.iova == db &&
		bm.size == 4096 && bm.in_host_window,
	    "doorbells: %s's doorbell page (0x%" PRIx64 ") identity-mapped into %s's DMA domain, "
	    "inside the host-bridge window",
	    n0, db, nv);
	TAP(xlate(ctx, &vram, db, &type) == db && type == UPCIE_IOMMU_MAP_PA_DOMAIN_DMA &&
		xlate(ctx, &vram, bar0->phys, NULL) == 0 && xlate(ctx, &vram, db + 4096, NULL) == 0,
	    "only the doorbell page translates: not the registers before it, nothing after it");
	TAP(upcie_kmod_iommu_map_pa_map_bar(ctx, &vram, &c0, 0, 0x1000, 0x1000, 0, &b2) == -EEXIST,
	    "again: the range is taken, -EEXIST");
	TAP(!upcie_kmod_iommu_map_pa_map_bar(ctx, &vram, &c0, 0, 0x1000, 0x1000,
					     UPCIE_KMOD_BAR_SHARE, &b2) &&
		b2.result == UPCIE_IOMMU_MAP_PA_BAR_BORROWED && b2.handle,
	    "again with the share flag: BORROWED");
	setenv("UPCIE_DOORBELL_SHARE", "1", 1);
	TAP(!upcie_kmod_iommu_map_pa_doorbells(ctx, &vram, &c0, 3, 0, &b3) &&
		b3.result == UPCIE_IOMMU_MAP_PA_BAR_BORROWED,
	    "the doorbell helper with UPCIE_DOORBELL_SHARE=1: BORROWED");
	unsetenv("UPCIE_DOORBELL_SHARE");
	TAP(!upcie_kmod_iommu_map_pa_unmap(ctx, b2.handle) &&
		!upcie_kmod_iommu_map_pa_unmap(ctx, b3.handle) && xlate(ctx, &vram, db, NULL) == db,
	    "unmapping the borrowed handles leaves the mapping");
	TAP(!upcie_kmod_iommu_map_pa_unmap(ctx, bm.handle) && xlate(ctx, &vram, db, NULL) == 0,
	    "unmapping the owner's handle removes it");
	TAP(upcie_kmod_iommu_map_pa_unmap(ctx, bm.handle) == -ENOENT, "unmap again: -ENOENT");
	{
		/* the lender closes: the borrower is told (poll), its handle only unmaps */
		struct upcie_kmod_iommu_map_pa lender;
		int before = readable(ctx->fd);

		err = upcie_kmod_iommu_map_pa_open(&lender);
		if (!err)
			err = upcie_kmod_iommu_map_pa_map_bar(&lender, &vram, &c0, 0, 0x1000,
							      0x1000, 0, &b3);
		if (!err)
			err = upcie_kmod_iommu_map_pa_map_bar(ctx, &vram, &c0, 0, 0x1000, 0x1000,
							      UPCIE_KMOD_BAR_SHARE, &b2);
		TAP(!err && b2.result == UPCIE_IOMMU_MAP_PA_BAR_BORROWED && !before &&
			!readable(ctx->fd),
		    "a second file maps the doorbell page, this one borrows it: not readable");
		upcie_kmod_iommu_map_pa_close(&lender);
		TAP(!err && xlate(ctx, &vram, db, NULL) == 0 && readable(ctx->fd),
		    "the lender's file closed: the mapping is gone and the borrower's file is "
		    "readable (poll)");
		TAP(!err && !upcie_kmod_iommu_map_pa_unmap(ctx, b2.handle) && !readable(ctx->fd),
		    "the borrowed handle unmaps; the file is no longer readable");
	}
	TAP(upcie_kmod_iommu_map_pa_map_bar(ctx, &c1, &c0, 0, 0x1000, 0x1000, 0, &b2) == -EPERM,
	    "MAP_BAR into %s (vfio: user-owned domain): -EPERM", n1);
	TAP(upcie_kmod_iommu_map_pa_map_bar(ctx, &vram, &c0, 6, 0, 0, 0, &b2) == -EINVAL &&
		upcie_kmod_iommu_map_pa_map_bar(ctx, &vram, &c0, 1, 0, 0, 0, &b2) == -EINVAL &&
		upcie_kmod_iommu_map_pa_map_bar(ctx, &vram, &c0, 0, 0x800, 0, 0, &b2) == -EINVAL &&
		upcie_kmod_iommu_map_pa_map_bar(ctx, &vram, &c0, 0, 0, bar0->size + 4096, 0, &b2) ==
		    -EINVAL,
	    "MAP_BAR of BAR 6, of the upper half of a 64-bit BAR, unaligned, too long: -EINVAL");
	if (!tk_msix_table(&c0, &bir, &msix)) {
		TAP(upcie_kmod_iommu_map_pa_map_bar(ctx, &vram, &c0, bir, msix & ~UINT64_C(4095),
						    4096, 0, &b2) == -EPERM &&
			xlate(ctx, &vram, bar0->phys + (msix & ~UINT64_C(4095)), NULL) == 0,
		    "MAP_BAR of the page of %s's MSI-X table (BAR%u + 0x%" PRIx64 "): -EPERM", n0,
		    bir, msix);
		if (bir == 0)
			TAP(upcie_kmod_iommu_map_pa_map_bar(ctx, &vram, &c0, 0, 0, 0, 0, &b2) ==
				-EPERM,
			    "MAP_BAR of the whole BAR0, which holds the MSI-X table: -EPERM");
	} else {
		TAP(0, "%s's MSI-X table from its config space", n0);
	}

	/*
	 * The target's driver unbinds under a live mapping: the mapping goes before the driver
	 * does (the default domain stays the group's, so a mapping left behind would still
	 * translate once a driver is bound again).
	 */
	polled_before = readable(ctx->fd);
	err = upcie_kmod_iommu_map_pa_doorbells(ctx, &vram, &c0, 3, 0, &bm);
	TAP(!err && xlate(ctx, &vram, db, NULL) == db && !upcie_pci_driver_unbind(&vram) &&
		live(ctx) == was + 1,
	    "uio_pci_generic unbound from %s while mapped: the handle was taken down", nv);
	TAP(!polled_before && readable(ctx->fd),
	    "the module's file: not readable (poll) before, readable now that handles were taken "
	    "down");
	err = upcie_pci_driver_bind(&vram, "uio_pci_generic");
	TAP(!err && xlate(ctx, &vram, db, &type) == 0 && type == UPCIE_IOMMU_MAP_PA_DOMAIN_DMA,
	    "%s bound again: its DMA domain no longer translates the doorbell page", nv);
	TAP(!upcie_kmod_iommu_map_pa_unmap(ctx, bm.handle) && live(ctx) == was,
	    "its handle unmaps (once)");

	/* the target's driver changes under a live mapping */
	err = upcie_kmod_iommu_map_pa_doorbells(ctx, &vram, &c0, 3, 0, &bm);
	TAP(!err && upcie_pci_driver_bind(&vram, "vfio-pci") == 0 && live(ctx) == was + 1 &&
		xlate(ctx, &vram, db, &type) == 0,
	    "%s moved to vfio-pci while mapped: the mapping went with its DMA domain", nv);
	TAP(!upcie_kmod_iommu_map_pa_unmap(ctx, bm.handle) && live(ctx) == was,
	    "its handle unmaps (once)");
	upcie_pci_driver_unbind(&vram);
	tk_sh("echo > /sys/bus/pci/devices/%s/driver_override", nv);
	TAP(upcie_kmod_iommu_map_pa_translate(ctx, &vram, -1, 0, &phys, &type) == -ENODEV &&
		live(ctx) == was,
	    "%s unbound again: TRANSLATE is -ENODEV, nothing left", nv);
}

static void cpl_done(void *arg, const struct upcie_nvme_cqe *cqe, int err)
{
	*(int *)arg = err ? err : (upcie_nvme_cqe_ok(cqe) ? 1 : -EIO);
}

/*
 * The GPU-issued doorbell, with c1 (on uio_pci_generic, in its kernel DMA domain) as the GPU: c0
 * (on vfio) gets an Identify placed in its admin SQ without its doorbell being rung; c1 then
 * DMAs 512 bytes whose first dword is the new SQ tail to c0's BAR0 + 0x1000 through the identity
 * mapping of that BAR in c1's domain. c0 must fetch and complete the command.
 */
static void test_doorbell(struct upcie_kmod_iommu_map_pa *ctx, struct tk_nvme *gpu,
			  struct upcie_kmod_dmabuf_import *imp, uint64_t c0bar0)
{
	struct upcie_vfio_container cont = { .fd = -1 };
	struct upcie_vfio_group g0 = { .fd = -1 };
	struct upcie_dmamem id = { 0 }, pay = { 0 }, dbm;
	struct upcie_nvme_ns ns3;
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_cqe cqe;
	struct upcie_sg_seg segs[64];
	struct upcie_deadline dl;
	struct tk_buf pb = { 0 };
	struct vctl v;
	uint32_t *w;
	uint16_t cid;
	size_t n = 0;
	uint64_t h;
	int done = 0, err;
	char sn[9] = "";

	(void)ctx;
	memset(&v, 0, sizeof(v));
	err = upcie_vfio_container_open(&cont);
	if (!err)
		err = upcie_vfio_group_open(&g0, &cont, upcie_vfio_group_id(&c0));
	if (!err)
		err = upcie_vfio_device_open(&v.dev, &g0, &c0);
	if (!err)
		err = upcie_vfio_region_map(&v.dev, VFIO_PCI_BAR0_REGION_INDEX, &v.bar0);
	if (!err)
		err = vfio_bus_master(&v.dev);
	if (!err)
		err = upcie_dmamem_type1_hugepage(&v.host, &cont, 4 * MiB, NULL);
	if (!err)
		err = upcie_dmamem_type1_hugepage(&id, &cont, 2 * MiB, NULL);
	if (!err)
		err = upcie_nvme_ctrl_init(&v.nv.c, (volatile void *)v.bar0.addr, v.bar0.size,
					   &v.host, NULL);
	TAP(!err, "doorbell: %s up on vfio (admin queue only)", n0);
	if (err)
		goto out;
	/* the command, without the doorbell */
	memset(id.vaddr, 0, 4096);
	upcie_nvme_cmd_identify_ctrl(&sqe);
	sqe.prp1 = id.iova;
	err = upcie_nvme_qpair_enqueue(&v.nv.c.admin, &sqe, cpl_done, &done, &cid);
	/* the doorbell write's data: SQ 0 tail, CQ 0 head as they are, nothing else */
	if (!err)
		err = tk_buf_vgem(&pb, 64 * KiB);
	if (!err)
		err = upcie_kmod_dmabuf_attach_pci(imp, &c1, pb.fd, segs, 64, &n, &h);
	if (!err) {
		upcie_kmod_dmabuf_detach(imp, h);
		err = upcie_dmamem_dmabuf_import_pci(&pay, imp, &c1, pb.fd, pb.va, pb.size,
						     tk_granule(segs, n));
	}
	if (!err)
		err = upcie_nvme_ns_open(&ns3, &gpu->c, 3);
	TAP(!err, "doorbell: Identify queued in %s's admin SQ (tail %u), not rung", n0,
	    v.nv.c.admin.sq_tail);
	if (err)
		goto out;
	/* nothing happens until someone rings */
	upcie_deadline_set(&dl, 200 * UPCIE_NSEC_PER_MSEC);
	while (!done && !upcie_deadline_passed(&dl)) {
		if (upcie_nvme_qpair_reap(&v.nv.c.admin, 1) <= 0)
			upcie_sleep_ns(UPCIE_NSEC_PER_MSEC);
	}
	TAP(!done, "doorbell: not rung, the command stays unfetched for 200 ms");
	w = (uint32_t *)pb.va;
	memset(w, 0, 512);
	w[0] = v.nv.c.admin.sq_tail;
	w[1] = v.nv.c.admin.cq_head;
	memset(&cqe, 0, sizeof(cqe));
	err = upcie_nvme_ioq_write_sync(&gpu->q, &ns3, 100, &pay, 0, 512, &cqe);
	TAP(!err, "doorbell: %s stores the doorbell values on c1n3 LBA 100", n1);
	INFO("write_c1n3", "%u+%u+doorbell", 100 * 512, 512);
	upcie_dmamem_init_arith(&dbm, NULL, 4096, c0bar0 + 0x1000);
	err = upcie_nvme_ioq_read_sync(&gpu->q, &ns3, 100, &dbm, 0, 512, &cqe);
	TAP(!err,
	    "doorbell: %s Reads them to %s's doorbells (IOVA 0x%" PRIx64
	    ") through the identity mapping",
	    n1, n0, c0bar0 + 0x1000);
	v.nv.c.admin.sq_db = v.nv.c.admin.sq_tail; /* rung, by the peer */
	upcie_deadline_set(&dl, 5 * UPCIE_NSEC_PER_SEC);
	while (!done && !upcie_deadline_passed(&dl)) {
		if (upcie_nvme_qpair_reap(&v.nv.c.admin, 1) <= 0)
			upcie_sleep_ns(UPCIE_NSEC_PER_MSEC);
	}
	memcpy(sn, (char *)id.vaddr + 4, 8);
	TAP(done == 1 && !strcmp(sn, "deadbeef"),
	    "doorbell: %s fetched and completed the command its peer rang (serial '%s')", n0, sn);
	upcie_nvme_ns_close(&ns3);
out:
	upcie_dmamem_destroy(&pay);
	tk_buf_free(&pb);
	if (v.nv.c.regs)
		upcie_nvme_ctrl_close(&v.nv.c);
	upcie_dmamem_destroy(&id);
	upcie_dmamem_destroy(&v.host);
	upcie_vfio_region_unmap(&v.bar0);
	upcie_vfio_device_close(&v.dev);
	upcie_vfio_group_close(&g0);
	upcie_vfio_container_close(&cont);
}

/* c1 on uio_pci_generic stands in for a GPU: its peer writes reach the ivshmem BAR through an
 * identity mapping in its kernel DMA domain. */
static void test_identity_dma(struct upcie_kmod_iommu_map_pa *ctx, const struct upcie_pci_bar *vbar,
			      const struct upcie_pci_bar *bar0)
{
	struct upcie_kmod_dmabuf_import imp = { 0 };
	struct upcie_kmod_bar_map bm = { 0 }, db = { 0 };
	struct upcie_sg_seg segs[1024];
	struct upcie_dmamem host, data;
	struct upcie_pci_bar c1bar0;
	struct tk_buf hb;
	struct tk_nvme nv1;
	char tag[9];
	size_t n = 0;
	uint64_t h;
	int64_t diff;
	int err;

	err = upcie_pci_driver_bind(&c1, "uio_pci_generic");
	TAP(!err, "%s moved to uio_pci_generic (a kernel DMA domain)", n1);
	if (err)
		return;
	err = upcie_kmod_iommu_map_pa_map_bar(ctx, &c1, &vram, 2, V_IDENT, 1 * MiB, 0, &bm);
	TAP(!err && bm.result == UPCIE_IOMMU_MAP_PA_BAR_MAPPED && bm.iova == vbar->phys + V_IDENT,
	    "MAP_BAR: %s BAR2 +%" PRIu64 " MiB (1 MiB) into %s's DMA domain", nv, V_IDENT / MiB,
	    n1);
	err = upcie_kmod_iommu_map_pa_doorbells(ctx, &c1, &c0, 3, 0, &db);
	TAP(!err && xlate(ctx, &c1, bar0->phys + 0x1000, NULL) == bar0->phys + 0x1000,
	    "and %s's doorbell page into the same domain", n0);

	err = upcie_kmod_dmabuf_import_open(&imp);
	if (!err)
		err = tk_buf_vgem(&hb, 4 * MiB);
	if (!err)
		err = upcie_kmod_dmabuf_attach_pci(&imp, &c1, hb.fd, segs, 1024, &n, &h);
	if (!err) {
		upcie_kmod_dmabuf_detach(&imp, h);
		err = upcie_dmamem_dmabuf_import_pci(&host, &imp, &c1, hb.fd, hb.va, hb.size,
						     tk_granule(segs, n));
	}
	TAP(!err, "%s's queues in a vgem buffer imported for it (dmabuf_import)", n1);
	if (err)
		goto out;
	err = upcie_pci_bar_map(&c1, 0, 0, &c1bar0);
	if (!err)
		err = upcie_pci_bus_master_enable(&c1);
	if (!err)
		err = tk_nvme_up(&nv1, (volatile void *)c1bar0.addr, c1bar0.size, &host, 1);
	TAP(!err, "%s up on uio under the vIOMMU", n1);
	if (!err) {
		upcie_dmamem_init_arith(&data, (char *)vbar->addr + V_IDENT, 1 * MiB, bm.iova);
		tk_tag(tag, "c1n1");
		memset((char *)vbar->addr + V_IDENT, 0xee, 64 * KiB);
		err = tk_nvme_rw(&nv1, false, 0, &data, 0, 64 * KiB);
		diff = tk_pat_diff((char *)vbar->addr + V_IDENT, 64 * KiB, tag, 0);
		TAP(!err && diff < 0,
		    "%s Reads c1n1 [0, 64 KiB) to the identity IOVA: it lands in %s's BAR (first "
		    "difference %" PRId64 ")",
		    n1, nv, diff);
		INFO("ident_vram", "%" PRIu64 "+%" PRIu64 "+c1n1+0", V_IDENT, 64 * KiB);
		if (db.result == UPCIE_IOMMU_MAP_PA_BAR_MAPPED)
			test_doorbell(ctx, &nv1, &imp, db.iova - UPCIE_KMOD_NVME_DOORBELL_OFFSET);
		else
			TAP(0, "doorbell: %s BAR0 identity-mapped into %s's domain", n0, n1);
		tk_nvme_down(&nv1);
		upcie_pci_bar_unmap(&c1bar0);
	}
	upcie_dmamem_destroy(&host);
out:
	tk_buf_free(&hb);
	upcie_kmod_dmabuf_import_close(&imp);
	upcie_kmod_iommu_map_pa_unmap(ctx, db.handle);
	upcie_kmod_iommu_map_pa_unmap(ctx, bm.handle);
	TAP(xlate(ctx, &c1, bm.iova, NULL) == 0, "identity mappings removed");
}

/*
 * c0 through its vfio cdev attached to an iommufd IOAS: the window is taken out of what the IOAS
 * allows (IOMMU_IOAS_ALLOW_IOVAS) and from the IOAS's allocator, host memory goes in at IOVAs
 * from that allocator, and the vram pages
 * into the IOAS's hardware page table through the module.
 */
static void test_iommufd(struct upcie_kmod_iommu_map_pa *ctx, const struct upcie_pci_bar *vbar)
{
	struct upcie_vfio_iommufd fd = { .fd = -1 };
	struct upcie_vfio_ioas ioas = { .fd = -1 };
	struct upcie_vfio_device dev = { .fd = -1 };
	struct upcie_vfio_iova_ranges r;
	struct upcie_iommu_iova_range allowed[UPCIE_VFIO_IOVA_RANGES_MAX];
	struct upcie_iommu_ioas_allow_iovas a;
	struct upcie_kmod_iova_window win;
	struct upcie_vfio_region bar0 = { 0 };
	struct upcie_dmamem host, m;
	struct tk_nvme nv;
	uint64_t pages[256], iova;
	unsigned type = 99;
	char tag[9];
	int64_t diff;
	int err;

	if (access("/dev/iommu", F_OK)) {
		SKIPPED("no /dev/iommu (iommufd) on this kernel", "iommufd: %s's IOAS domain", n0);
		return;
	}
	err = upcie_vfio_iommufd_open(&fd);
	if (!err)
		err = upcie_vfio_ioas_alloc(&ioas, &fd);
	if (!err)
		err = upcie_vfio_cdev_open(&dev, &fd, &c0);
	if (!err)
		err = upcie_vfio_cdev_attach(&dev, &ioas);
	TAP(!err, "iommufd: %s bound through its cdev and attached to an IOAS", n0);
	if (err)
		goto out;
	own0 = dev.fd; /* the bound cdev is the owner here */
	TAP(xlate(ctx, &c0, 0, &type) == 0 && type == UPCIE_IOMMU_MAP_PA_DOMAIN_USER,
	    "iommufd: the IOAS's page table is a user-owned domain");
	memset(&r, 0, sizeof(r));
	err = upcie_vfio_ioas_iova_ranges(&ioas, &r);
	if (!err)
		err = upcie_kmod_iova_window_init(&win, 4096);
	if (!err)
		err = upcie_kmod_iova_window_check(&win, &r);
	if (!err)
		err = upcie_kmod_iova_window_exclude(&win, &r);
	if (!err) {
		memset(&a, 0, sizeof(a));
		for (uint32_t i = 0; i < r.n; i++) {
			allowed[i].start = r.r[i].start;
			allowed[i].last = r.r[i].last;
		}
		a.size = sizeof(a);
		a.ioas_id = ioas.id;
		a.num_iovas = r.n;
		a.allowed_iovas = (uint64_t)(uintptr_t)allowed;
		err = tk_ioctl(fd.fd, UPCIE_IOMMU_IOAS_ALLOW_IOVAS, &a);
	}
	TAP(!err, "iommufd: the IOAS allows every usable IOVA but the window (%u ranges)", r.n);
	if (err)
		goto out_win;
	{
		uint64_t refuse[4];

		for (int i = 0; i < 4; i++)
			refuse[i] = vbar->phys + V_REFUSE + (uint64_t)i * 4096;
		test_unbound_cdev(ctx, win.base + 16 * MiB, refuse,
				  "bound to iommufd by its owner");
	}
	{
		/*
		 * ALLOW_IOVAS steers the kernel's own IOVA choices (and refuses devices whose
		 * reserved regions would cut into the rest); a fixed IOVA is the owner's business.
		 * If the owner does put something in the window, the module sees it and refuses.
		 */
		void *pg =
		    mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		uint64_t page = vbar->phys + V_REFUSE;

		memset(pg, 0, 4096);
		iova = win.base + 8 * MiB;
		err = upcie_vfio_ioas_map(&ioas, pg, 4096, UPCIE_VFIO_IOAS_MAP_FIXED_IOVA, &iova);
		TAP(!err && raw_map(ctx, &c0, iova, &page, 1, 4096, NULL) == -EEXIST,
		    "iommufd: an IOVA the owner mapped itself inside the window: MAP says EEXIST");
		if (!err)
			upcie_vfio_ioas_unmap(&ioas, iova, 4096);
		munmap(pg, 4096);
	}
	/* IOMMU_IOAS_IOVA_RANGES does not reflect ALLOW_IOVAS: the IOAS's allocator is told too */
	err = upcie_kmod_iova_window_reserve(&win, &ioas.iovas);
	if (!err)
		err = upcie_dmamem_iommufd_memfd(&host, &ioas, 4 * MiB, NULL, false);
	TAP(!err && (host.iova + host.size <= win.base || host.iova >= win.base + win.size),
	    "iommufd: host memory at IOVA 0x%" PRIx64 " from the IOAS's allocator, outside the "
	    "window",
	    err ? 0 : host.iova);
	if (err)
		goto out_win;
	for (int i = 0; i < 256; i++)
		pages[i] = vbar->phys + V_IOMMUFD + (uint64_t)i * 4096;
	{
		struct upcie_kmod_iommu_target t0 = { c0, dev.fd };

		err = upcie_dmamem_iommu_map_pa(&m, ctx, &win, &t0, 1, &vram,
						(char *)vbar->addr + V_IOMMUFD, pages, 256, 4096,
						UPCIE_KMOD_IOMMU_RAW_PAGES);
	}
	TAP(!err && xlate(ctx, &c0, m.iova + 4096, NULL) == pages[1],
	    "iommufd: vram [52, 53) MiB mapped into the IOAS's domain at 0x%" PRIx64,
	    err ? 0 : m.iova);
	if (!err) {
		err = upcie_vfio_region_map(&dev, VFIO_PCI_BAR0_REGION_INDEX, &bar0);
		if (!err)
			err = vfio_bus_master(&dev);
		if (!err)
			err = tk_nvme_up(&nv, (volatile void *)bar0.addr, bar0.size, &host, 1);
		TAP(!err, "iommufd: %s up, queues in the IOAS", n0);
		if (!err) {
			tk_tag(tag, "c0n1");
			err = tk_nvme_rw(&nv, false, 128, &m, 0, 32 * KiB);
			diff = tk_pat_diff((char *)vbar->addr + V_IOMMUFD, 32 * KiB, tag, 64 * KiB);
			TAP(!err && diff < 0,
			    "iommufd: %s Reads c0n1 [64, 96) KiB into the window: in the vram BAR",
			    n0);
			INFO("read_vram_iommufd", "%" PRIu64 "+%" PRIu64 "+c0n1+%" PRIu64,
			     V_IOMMUFD, 32 * KiB, 64 * KiB);
			tk_nvme_down(&nv);
		}
		upcie_vfio_region_unmap(&bar0);
		upcie_dmamem_destroy(&m);
		test_detach_during_map(ctx, &dev, &ioas, win.base + 1024 * MiB,
				       vbar->phys + V_REFUSE);
	}
	upcie_dmamem_destroy(&host);
out_win:
	upcie_kmod_iova_window_fini(&win);
out:
	own0 = -1;
	upcie_vfio_device_close(&dev);
	upcie_vfio_ioas_destroy(&ioas);
	upcie_vfio_iommufd_close(&fd);
}

/*
 * The module keeps the owner's vfio device open while it maps into its domain, and that keeps a
 * type1 domain alive: with the user's own descriptor closed, the group still cannot leave its
 * container (vfio answers EBUSY while a device is open), so the domain cannot be freed under the
 * mapping, nor reused for another owner; once unmapped, it can.
 */
static void test_owner_holds(struct upcie_kmod_iommu_map_pa *ctx, const struct upcie_pci_bar *vbar)
{
	struct upcie_vfio_container cont = { .fd = -1 };
	struct upcie_vfio_group g = { .fd = -1 };
	struct upcie_vfio_device d = { .fd = -1 };
	uint64_t pages[4], h = 0, phys = 1;
	int err;

	for (int i = 0; i < 4; i++)
		pages[i] = vbar->phys + V_REFUSE + (uint64_t)i * 4096;
	err = upcie_vfio_container_open(&cont);
	if (!err)
		err = upcie_vfio_group_open(&g, &cont, upcie_vfio_group_id(&c1));
	if (!err)
		err = upcie_vfio_device_open(&d, &g, &c1);
	if (!err) {
		struct upcie_kmod_iommu_target t = { c1, d.fd };

		err =
		    upcie_kmod_iommu_map_pa_map(ctx, &t, &vram, UPCIE_KMOD_IOVA_WINDOW_BASE, pages,
						4, 4096, 0, UPCIE_KMOD_IOMMU_RAW_PAGES, &h, NULL);
	}
	TAP(!err, "%s in its own container, 4 vram pages mapped with its device as owner", n1);
	if (err)
		goto out;
	upcie_vfio_device_close(&d);
	err = ioctl(g.fd, VFIO_GROUP_UNSET_CONTAINER) ? -errno : 0;
	TAP(err == -EBUSY,
	    "the user's device descriptor closed: the group still cannot leave its container "
	    "(EBUSY: the module holds the device, the domain stays) (%d)",
	    err);
	if (!err) {
		/* the domain went under the mapping: put things back so that the rest can run */
		ioctl(g.fd, VFIO_GROUP_SET_CONTAINER, &cont.fd);
		ioctl(cont.fd, VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU);
	}
	TAP(!upcie_kmod_iommu_map_pa_unmap(ctx, h), "unmapped");
	err = ioctl(g.fd, VFIO_GROUP_UNSET_CONTAINER) ? -errno : 0;
	TAP(!err, "now the group leaves its container (%d)", err);
	if (!err) {
		g.container->ngroups--;
		g.container->iommu_set = 0;
		g.container = NULL;
	}
	upcie_kmod_iommu_map_pa_translate(ctx, &c1, -1, UPCIE_KMOD_IOVA_WINDOW_BASE, &phys, NULL);
	TAP(phys == 0, "and nothing of the mapping is left where %s is now", n1);
out:
	upcie_vfio_device_close(&d);
	upcie_vfio_group_close(&g);
	upcie_vfio_container_close(&cont);
}

static void test_iommu(struct upcie_kmod_iommu_map_pa *ctx, const struct upcie_pci_bar *vbar)
{
	struct upcie_vfio_container cont = { .fd = -1 };
	struct upcie_vfio_group g0 = { .fd = -1 }, g1 = { .fd = -1 };
	struct upcie_vfio_type1_info info;
	struct upcie_kmod_iova_window win;
	struct upcie_dmamem m4k, m2m;
	struct upcie_pci_bar bar0;
	struct vctl v0, v1;
	struct tk_buf vg;
	uint64_t pages[1024], big[2], was;
	char tag[9], wtag[9];
	unsigned type = 99;
	int64_t diff;
	int err;

	{
		/* its address only: vfio owns the function */
		struct upcie_pci_resource res[UPCIE_PCI_NUM_RES];

		memset(&bar0, 0, sizeof(bar0));
		err = upcie_pci_func_resources(&c0, res);
		bar0.phys = res[0].start;
		bar0.size = (size_t)res[0].size;
		TAP(!err && bar0.phys, "%s BAR0 at 0x%" PRIx64 ", %zu KiB", n0, bar0.phys,
		    bar0.size / 1024);
	}
	if (test_unbound_target(ctx, &bar0))
		return;
	{
		uint64_t page = vbar->phys + V_REFUSE;

		xlate(ctx, &c0, 0, &type);
		owner_fd_ = open("/dev/null", O_RDONLY);
		TAP(raw_map(ctx, &c0, UPCIE_KMOD_IOVA_WINDOW_BASE, &page, 1, 4096, tw_owner) ==
			-EPERM,
		    "MAP into %s on vfio-pci before user space opened it (domain type %u): EPERM",
		    n0, type);
		close(owner_fd_);
	}
	err = upcie_vfio_container_open(&cont);
	if (!err)
		err = upcie_vfio_group_open(&g0, &cont, upcie_vfio_group_id(&c0));
	if (!err)
		err = upcie_vfio_group_open(&g1, &cont, upcie_vfio_group_id(&c1));
	TAP(!err, "type1 container with %s and %s", n0, n1);
	if (err)
		return;
	TAP(xlate(ctx, &c0, 0, &type) == 0 && type == UPCIE_IOMMU_MAP_PA_DOMAIN_USER,
	    "TRANSLATE: %s's domain is user-owned now", n0);
	err = upcie_vfio_container_info(&cont, &info);
	TAP(!err && info.ranges.n > 0, "the container's IOVA ranges (%u)", info.ranges.n);
	for (uint32_t i = 0; i < info.ranges.n; i++)
		DIAG("  [0x%" PRIx64 ", 0x%" PRIx64 "]", info.ranges.r[i].start,
		     info.ranges.r[i].last);
	test_window(&info.ranges);
	err = upcie_kmod_iova_window_init(&win, 4096);
	TAP(!err && win.base == UPCIE_KMOD_IOVA_WINDOW_BASE &&
		win.size == UPCIE_KMOD_IOVA_WINDOW_SIZE &&
		!upcie_kmod_iova_window_check(&win, &info.ranges),
	    "default window: 64 GiB at 256 GiB, inside the ranges");
	TAP(!upcie_kmod_iova_window_reserve(&win, &cont.iovas),
	    "window carved out of the container's allocator");

	err = vctl_up(&v0, &g0, &cont, &c0, 1);
	own0 = v0.dev.fd;
	TAP(!err, "%s up through vfio (queues in type1-mapped hugepages at 0x%" PRIx64 ")", n0,
	    v0.host.iova);
	if (err)
		goto out;
	TAP(v0.host.iova + v0.host.size <= win.base || v0.host.iova >= win.base + win.size,
	    "vfio's own IOVAs stay outside the window");
	err = vctl_up(&v1, &g1, &cont, &c1, 1);
	own1 = v1.dev.fd;
	TAP(!err, "%s up through vfio", n1);

	for (int i = 0; i < 1024; i++)
		pages[i] = vbar->phys + V_MAP4K + (uint64_t)i * 4096;
	{
		struct upcie_kmod_iommu_target both[2] = { target(&c0), target(&c1) };

		/* the memory's dma-buf, as a GPU driver would export it: the module pins it */
		int lfd = tbb_export(V_MAP4K, 4 * MiB, 0);

		was = live(ctx);
		err = lfd < 0 ? lfd
			      : upcie_dmamem_iommu_map_pa(&m4k, ctx, &win, both, 2, &vram,
							  (char *)vbar->addr + V_MAP4K, pages, 1024,
							  4096, lfd);
		if (lfd >= 0)
			close(lfd); /* the dmamem keeps its own duplicate, the module its pin */
	}
	TAP(!err && m4k.iova >= win.base && m4k.iova + m4k.size <= win.base + win.size &&
		live(ctx) == was + 2,
	    "vram [8, 12) MiB as 1024 x 4 KiB pages into %s and %s at IOVA 0x%" PRIx64
	    " in the window, their tb_barbuf dma-buf as lifetime",
	    n0, n1, m4k.iova);
	TAP(xlate(ctx, &c0, m4k.iova + 5 * 4096, NULL) == pages[5] &&
		xlate(ctx, &c1, m4k.iova + 1023 * 4096, NULL) == pages[1023],
	    "both controllers translate the window to the vram pages");
	if (err)
		goto out1;

	/* c0: Read into the window, Write from it */
	tk_tag(tag, "c0n1");
	tk_tag(wtag, "kim1");
	memset((char *)vbar->addr + V_MAP4K, 0xee, 64 * KiB);
	err = tk_nvme_rw(&v0.nv, false, 0, &m4k, 0, 32 * KiB);
	diff = tk_pat_diff((char *)vbar->addr + V_MAP4K, 32 * KiB, tag, 0);
	TAP(!err && diff < 0,
	    "%s Reads c0n1 [0, 32 KiB) into the window: the data is in the vram BAR (first "
	    "difference %" PRId64 ")",
	    n0, diff);
	INFO("read_vram_c0", "%" PRIu64 "+%" PRIu64 "+c0n1+0", V_MAP4K, 32 * KiB);
	tk_pat((char *)vbar->addr + V_MAP4K + 1 * MiB, 12 * KiB, wtag, 2 * MiB);
	err = tk_nvme_rw(&v0.nv, true, 2 * MiB / 512, &m4k, 1 * MiB, 12 * KiB);
	TAP(!err, "%s Writes c0n1 at 2 MiB from the window (vram +9 MiB)", n0);
	INFO("write_c0n1", "%" PRIu64 "+%" PRIu64 "+%s", 2 * MiB, 12 * KiB, wtag);
	/* c1, same IOVAs */
	if (v1.nv.up) {
		tk_tag(tag, "c1n1");
		err = tk_nvme_rw(&v1.nv, false, 0, &m4k, 2 * MiB, 16 * KiB);
		diff = tk_pat_diff((char *)vbar->addr + V_MAP4K + 2 * MiB, 16 * KiB, tag, 0);
		TAP(!err && diff < 0,
		    "%s Reads c1n1 [0, 16 KiB) into the same window IOVAs: in the vram BAR", n1);
		INFO("read_vram_c1", "%" PRIu64 "+%" PRIu64 "+c1n1+0", V_MAP4K + 2 * MiB, 16 * KiB);
	}

	/* 2 MiB pages, one controller */
	big[0] = vbar->phys + V_MAP2M;
	big[1] = big[0] + 2 * MiB;
	{
		struct upcie_kmod_iommu_target t0 = target(&c0);

		err = upcie_dmamem_iommu_map_pa(&m2m, ctx, &win, &t0, 1, &vram,
						(char *)vbar->addr + V_MAP2M, big, 2, 2 * MiB,
						UPCIE_KMOD_IOMMU_RAW_PAGES);
	}
	TAP(!err && upcie_is_aligned(m2m.iova, 2 * MiB) &&
		xlate(ctx, &c0, m2m.iova + 3 * MiB + 0x1000, NULL) == big[1] + MiB + 0x1000,
	    "vram [16, 20) MiB as 2 x 2 MiB pages into %s at 0x%" PRIx64, n0, m2m.iova);
	if (!err) {
		tk_tag(tag, "c0n1");
		err = tk_nvme_rw(&v0.nv, false, 64 * KiB / 512, &m2m, 2 * MiB - 4 * KiB, 16 * KiB);
		diff = tk_pat_diff((char *)vbar->addr + V_MAP2M + 2 * MiB - 4 * KiB, 16 * KiB, tag,
				   64 * KiB);
		TAP(!err && diff < 0, "%s Reads c0n1 [64, 80) KiB across the 2 MiB page boundary",
		    n0);
		INFO("read_vram_2m", "%" PRIu64 "+%" PRIu64 "+c0n1+%" PRIu64,
		     V_MAP2M + 2 * MiB - 4 * KiB, 16 * KiB, 64 * KiB);
	}

	{
		/*
		 * The dmamem keeps its own duplicate of the lifetime descriptor: a controller added
		 * after the caller closed (or reused) its number still gets the right dma-buf.
		 */
		struct upcie_kmod_iommu_target t0 = target(&c0), t1 = target(&c1);
		struct upcie_dmamem ml;
		uint64_t lp[4];
		int lfd = tbb_export(V_REFUSE + 64 * KiB, 16 * KiB, 0);

		for (int i = 0; i < 4; i++)
			lp[i] = vbar->phys + V_REFUSE + 64 * KiB + (uint64_t)i * 4096;
		err = lfd < 0 ? lfd
			      : upcie_dmamem_iommu_map_pa(&ml, ctx, &win, &t0, 1, &vram, NULL, lp,
							  4, 4096, lfd);
		if (lfd >= 0)
			close(lfd);
		lfd = open("/dev/null",
			   O_RDONLY); /* most likely the same number, now not a dma-buf */
		TAP(!err && !upcie_dmamem_iommu_map_pa_add(&ml, &t1) &&
			xlate(ctx, &c1, ml.iova + 4096, NULL) == lp[1],
		    "a dmamem with a lifetime dma-buf whose descriptor the caller closed: a "
		    "controller "
		    "added later still maps (the dmamem holds its own duplicate)");
		close(lfd);
		if (!err)
			upcie_dmamem_destroy(&ml);
	}
	if (!tk_buf_vgem(&vg, 64 * KiB)) {
		uint64_t free_iova;

		upcie_kmod_iova_window_alloc(&win, 16 * 4096, 0, &free_iova);
		test_refusals(ctx, vbar, &m4k, &v0.host, &vg, free_iova);
		test_child(ctx, vbar, free_iova);
		test_lifetime(vbar, free_iova);
		test_unmap_capability(ctx, vbar, free_iova);
		upcie_kmod_iova_window_free(&win, free_iova, 16 * 4096);
		tk_buf_free(&vg);
	}
	{
		/*
		 * Overlap at the domain's smallest page: a 4 KiB page vfio mapped itself, 4 KiB into
		 * a 2 MiB range, must stop a 2 MiB MAP there (a check at 2 MiB steps misses it).
		 */
		void *pg =
		    mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		uint64_t w2 = 0, big2 = vbar->phys + V_REFUSE; /* 2 MiB aligned */

		memset(pg, 0, 4096);
		err = upcie_kmod_iova_window_alloc(&win, 2 * MiB, 2 * MiB, &w2);
		if (!err)
			err = upcie_vfio_dma_map(&cont, pg, 4096, w2 + 4096);
		TAP(!err && raw_map(ctx, &c0, w2, &big2, 1, 2 * MiB, NULL) == -EEXIST &&
			xlate(ctx, &c0, w2, NULL) == 0,
		    "a 2 MiB MAP over a 4 KiB page vfio mapped 4 KiB into the range: EEXIST "
		    "(checked at the domain's smallest page)");
		if (!err)
			upcie_vfio_dma_unmap(&cont, 4096, w2 + 4096);
		upcie_kmod_iova_window_free(&win, w2, 2 * MiB);
		munmap(pg, 4096);
	}
	test_map_bar(ctx, &bar0);

	/* unload with mappings live */
	TAP(tk_rmmod("iommu_map_pa") == -EWOULDBLOCK && !access(DEV, F_OK),
	    "rmmod with mappings live: refused (module in use)");
	upcie_dmamem_destroy(&m2m);
	was = live(ctx);
	{
		uint64_t iova = m4k.iova;

		upcie_dmamem_destroy(&m4k);
		err = !(live(ctx) == was - 2 && xlate(ctx, &c0, iova, NULL) == 0 &&
			xlate(ctx, &c1, iova, NULL) == 0);
	}
	TAP(!err, "destroying the dmamem unmaps it from both controllers");
out1:
	if (v1.nv.up || v1.dev.fd > 0)
		vctl_down(&v1);
	vctl_down(&v0);
	own0 = own1 = -1;
out:
	upcie_kmod_iova_window_fini(&win);
	upcie_vfio_group_close(&g1);
	upcie_vfio_group_close(&g0);
	upcie_vfio_container_close(&cont);
	test_iommufd(ctx, vbar);
	test_owner_holds(ctx, vbar);
	test_identity_dma(ctx, vbar, &bar0);
}

int main(int argc, char **argv)
{
	struct upcie_kmod_iommu_map_pa ctx = { 0 };
	struct upcie_pci_bar vbar;
	int err;

	upcie_log_set_handler(tk_log, NULL);
	if (argc < 4 || tk_bdf(argv[1], &c0) || tk_bdf(argv[2], &c1) || tk_bdf(argv[3], &vram))
		return 2;
	upcie_pci_bdf_format(&c0, n0, sizeof(n0));
	upcie_pci_bdf_format(&c1, n1, sizeof(n1));
	upcie_pci_bdf_format(&vram, nv, sizeof(nv));

	test_basics(&ctx);
	if (ctx.fd <= 0)
		return tap_done();
	err = upcie_pci_bar_map(&vram, 2, 0, &vbar);
	TAP(!err, "%s BAR2 (the stand-in for GPU memory) at 0x%" PRIx64 ", %zu MiB", nv, vbar.phys,
	    vbar.size / MiB);
	if (err)
		return tap_done();
	INFO("vram_phys", "0x%" PRIx64, vbar.phys);
	if (getenv("TB_IOMMU") && !strcmp(getenv("TB_IOMMU"), "1"))
		test_iommu(&ctx, &vbar);
	else
		test_no_iommu(&ctx, &vbar);
	TAP(live(&ctx) == 0, "nothing left mapped");
	TAP(tk_rmmod("iommu_map_pa") == -EWOULDBLOCK, "rmmod while a file is open: refused");
	upcie_kmod_iommu_map_pa_close(&ctx);
	TAP(!tk_rmmod("iommu_map_pa") && !tk_sh("modprobe iommu_map_pa") &&
		!upcie_kmod_iommu_map_pa_open(&ctx),
	    "closed: rmmod works, loaded again, opens");
	upcie_kmod_iommu_map_pa_close(&ctx);
	/* last: kernel lockdown (one way) closes the module to new users */
	tk_sh("mountpoint -q /sys/kernel/security || mount -t securityfs securityfs "
	      "/sys/kernel/security");
	if (access("/sys/kernel/security/lockdown", W_OK))
		SKIPPED("no lockdown LSM on this kernel", "open under kernel lockdown: EPERM");
	else
		TAP(!tk_sh("echo integrity > /sys/kernel/security/lockdown") &&
			upcie_kmod_iommu_map_pa_open(&ctx) == -EPERM,
		    "open under kernel lockdown (integrity): -EPERM");
	upcie_pci_bar_unmap(&vbar);
	return tap_done();
}
