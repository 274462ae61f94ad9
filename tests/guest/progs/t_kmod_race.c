/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Race tests of upcie's kernel modules: requests against their teardown, in loops, from threads
 * and from processes, the way concurrent users and a dying process meet in the field. Each race
 * runs for a while; what it asserts: every request answers one of the errors its contract names
 * (anything else is a failure), nothing is left behind afterwards (INFO counts, TRANSLATE), and
 * the kernel log stays clean (the test bed fails the case on a splat; the debug kernel of
 * configuration K adds KASAN, lockdep and DMA-API checking).
 *
 * dmabuf_import (vram as the named function, accepted only while on uio_pci_generic; vgem
 * buffers):
 *  1. threads: ATTACH/GET/DETACH on one file, DETACH and GET of guessed handles, and the
 *     function's driver changing (uio_pci_generic, unbound, vfio-pci under an IOMMU);
 *  2. threads: ATTACH/DETACH while the function is removed and rescanned;
 *  3. processes: children attaching and dying (exit, SIGKILL) with attachments live.
 * iommu_map_pa (c0 and c1 on vfio-pci in one type1 container, vram's BAR as memory):
 *  4. threads: MAP/TRANSLATE/UNMAP into c0 and into c1 (one domain), UNMAP of guessed handles,
 *     MAP_BAR of c0's doorbells into vram's kernel DMA domain while vram's driver changes;
 *  5. threads: MAP/UNMAP into c1 (its own container) while its device is closed and reopened,
 *     its group leaves and rejoins the container (UNSET_CONTAINER), and the device is reset;
 *  6. processes: children mapping with the inherited device and dying;
 *  7. threads: MAP/TRANSLATE/UNMAP of vram's pages into c0 while vram, the memory's source, is
 *     removed and rescanned.
 *
 * Usage: t_kmod_race NVME0_BDF NVME1_BDF VRAM_BDF [SECONDS]   (modules loaded as in kmod_iommu;
 * c0 and c1 on vfio-pci, vram unbound (bound to uio_pci_generic where a test needs it); 16
 * hugepages)
 */
// testbed-ldflags: -lpthread
#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <upcie/base/clock.h>
#include <upcie/kmod/dmabuf_import.h>
#include <upcie/kmod/iommu_map_pa.h>
#include <upcie/pci/bar.h>
#include <upcie/pci/driver.h>
#include <upcie/vfio/device.h>
#include <upcie/vfio/type1.h>

#include "t_kmod.h"

#define V_RACE (56 * MiB) /* vram pages the races map (16 per thread) */
#define IOVA_A (UPCIE_KMOD_IOVA_WINDOW_BASE)
#define IOVA_B (UPCIE_KMOD_IOVA_WINDOW_BASE + 1 * MiB)
#define IOVA_C (UPCIE_KMOD_IOVA_WINDOW_BASE + 2 * MiB)
#define NPG    16

static struct upcie_pci_bdf c0, c1, vram;
static char n0[UPCIE_PCI_BDF_STRLEN], n1[UPCIE_PCI_BDF_STRLEN], nv[UPCIE_PCI_BDF_STRLEN];
static bool iommu;
static uint64_t secs = 8;
static uint64_t vram_phys;

static atomic_bool stop;
static atomic_uint unexpected; /* answers outside the contract */
static atomic_ulong ops;

/* Count an answer outside `allowed` (a 0-terminated list of negative errnos; 0 is fine). */
static void expect(const char *what, int err, const int *allowed)
{
	if (!err)
		return;
	for (const int *a = allowed; *a; a++)
		if (err == *a)
			return;
	if (atomic_fetch_add(&unexpected, 1) < 8)
		DIAG("%s: unexpected %s", what, strerror(-err));
}

static void quiet(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)msg;
	(void)ctx; /* the races produce refusals by design; only the counted answers matter */
}

static bool running(struct upcie_deadline *dl)
{
	return !atomic_load(&stop) && !upcie_deadline_passed(dl);
}

/* Run fns[0..n) as threads for `secs` seconds. */
static void race(void *(**fns)(void *), void **args, int n)
{
	pthread_t t[8];

	atomic_store(&stop, false);
	for (int i = 0; i < n; i++)
		pthread_create(&t[i], NULL, fns[i], args ? args[i] : NULL);
	upcie_sleep_ns(secs * UPCIE_NSEC_PER_SEC);
	atomic_store(&stop, true);
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
}

static uint64_t dbi_live(struct upcie_kmod_dmabuf_import *ctx)
{
	struct upcie_dmabuf_import_info info;

	return upcie_kmod_dmabuf_import_info(ctx, &info) ? UINT64_MAX : info.attachments;
}

static uint64_t imp_live(struct upcie_kmod_iommu_map_pa *ctx)
{
	struct upcie_iommu_map_pa_info info;

	return upcie_kmod_iommu_map_pa_info(ctx, &info) ? UINT64_MAX : info.mappings;
}

/* ---------------------------------------------------------------------------------------- */
/* dmabuf_import */

static struct upcie_kmod_dmabuf_import dctx;
static struct tk_buf dbuf;
static atomic_ulong named_ok; /* ATTACHes for the named function that succeeded */

static void *d_attacher(void *arg)
{
	static const int ok[] = { -ENODEV, -EBUSY, -ENOENT, 0 };
	struct upcie_sg_seg segs[1024];
	struct upcie_deadline dl;
	bool named = arg != NULL;

	upcie_deadline_set(&dl, UINT64_MAX / 2);
	while (running(&dl)) {
		size_t n = 0, got;
		uint64_t h = 0;
		int err =
		    named ? upcie_kmod_dmabuf_attach_pci(&dctx, &vram, dbuf.fd, segs, 1024, &n, &h)
			  : upcie_kmod_dmabuf_attach(&dctx, dbuf.fd, segs, 1024, &n, &h);

		expect("ATTACH", err, ok);
		if (!err && named)
			atomic_fetch_add(&named_ok, 1);
		if (!err) {
			expect("GET", upcie_kmod_dmabuf_segs(&dctx, h, 0, segs, 1024, &got), ok);
			expect("DETACH", upcie_kmod_dmabuf_detach(&dctx, h), ok);
		}
		atomic_fetch_add(&ops, 1);
	}
	return NULL;
}

static void *d_guesser(void *arg)
{
	static const int ok[] = { -ENODEV, -ENOENT, 0 };
	struct upcie_sg_seg segs[16];
	struct upcie_deadline dl;
	unsigned seed = 7;

	(void)arg;
	upcie_deadline_set(&dl, UINT64_MAX / 2);
	while (running(&dl)) {
		uint64_t h = 1 + rand_r(&seed) % 4096;
		size_t got;

		expect("GET (guessed)", upcie_kmod_dmabuf_segs(&dctx, h, 0, segs, 16, &got), ok);
		if (rand_r(&seed) % 4 == 0)
			expect("DETACH (guessed)", upcie_kmod_dmabuf_detach(&dctx, h), ok);
	}
	return NULL;
}

static void *d_binder(void *arg)
{
	struct upcie_deadline dl;
	unsigned i = 0;

	(void)arg;
	upcie_deadline_set(&dl, UINT64_MAX / 2);
	while (running(&dl)) {
		const char *drv = (i % 3 == 0)		  ? "uio_pci_generic"
				  : (i % 3 == 1 && iommu) ? "vfio-pci"
							  : NULL;

		if (drv)
			upcie_pci_driver_bind(&vram, drv);
		else
			upcie_pci_driver_unbind(&vram);
		upcie_sleep_ns(20 * UPCIE_NSEC_PER_MSEC);
		i++;
	}
	upcie_pci_driver_unbind(&vram);
	tk_sh("echo > /sys/bus/pci/devices/%s/driver_override", nv);
	return NULL;
}

static void *d_remover(void *arg)
{
	struct upcie_deadline dl;

	(void)arg;
	upcie_deadline_set(&dl, UINT64_MAX / 2);
	while (running(&dl)) {
		tk_sh("echo 1 > /sys/bus/pci/devices/%s/remove", nv);
		upcie_sleep_ns(50 * UPCIE_NSEC_PER_MSEC);
		tk_sh("echo 1 > /sys/bus/pci/rescan");
		/* a named function must be on uio_pci_generic (the override went with it) */
		upcie_pci_driver_bind(&vram, "uio_pci_generic");
		upcie_sleep_ns(50 * UPCIE_NSEC_PER_MSEC);
	}
	if (upcie_pci_func_exists(&vram))
		tk_sh("echo 1 > /sys/bus/pci/rescan");
	upcie_pci_driver_bind(&vram, "uio_pci_generic");
	return NULL;
}

static void test_dmabuf(void)
{
	void *(*fns[4])(void *);
	void *args[4];
	uint64_t base;
	int alive = 0, status;

	if (upcie_kmod_dmabuf_import_open(&dctx) || tk_buf_vgem(&dbuf, 256 * KiB)) {
		TAP(0, "dmabuf_import open and a vgem buffer");
		return;
	}
	base = dbi_live(&dctx);

	atomic_store(&ops, 0);
	atomic_store(&unexpected, 0);
	atomic_store(&named_ok, 0);
	fns[0] = d_attacher, args[0] = &vram;
	fns[1] = d_attacher, args[1] = NULL;
	fns[2] = d_guesser, args[2] = NULL;
	fns[3] = d_binder, args[3] = NULL;
	race(fns, args, 4);
	TAP(!atomic_load(&unexpected) && dbi_live(&dctx) == base && atomic_load(&named_ok) > 0,
	    "dmabuf race 1 (threads): %lu ATTACH/GET/DETACH (%lu for %s while on "
	    "uio_pci_generic) against guessed DETACH/GET and %s's driver changing: no answer "
	    "outside the contract, nothing left",
	    atomic_load(&ops), atomic_load(&named_ok), nv, nv);

	atomic_store(&ops, 0);
	atomic_store(&named_ok, 0);
	upcie_pci_driver_bind(&vram, "uio_pci_generic");
	fns[0] = d_attacher, args[0] = &vram;
	fns[1] = d_remover, args[1] = NULL;
	race(fns, args, 2);
	TAP(!atomic_load(&unexpected) && dbi_live(&dctx) == base && !upcie_pci_func_exists(&vram) &&
		atomic_load(&named_ok) > 0,
	    "dmabuf race 2 (threads): %lu ATTACH/DETACH for %s (%lu attached) on "
	    "uio_pci_generic while it is removed and rescanned: contract kept, nothing left, %s "
	    "back",
	    atomic_load(&ops), nv, atomic_load(&named_ok), nv);

	/* processes that die with attachments live */
	for (int round = 0; round < 6; round++) {
		pid_t pids[4];

		for (int i = 0; i < 4; i++) {
			fflush(stdout);
			pids[i] = fork();
			if (pids[i] == 0) {
				struct upcie_kmod_dmabuf_import mine = { 0 };
				struct upcie_sg_seg segs[1024];
				struct tk_buf own;
				uint64_t h;
				size_t n;

				if (upcie_kmod_dmabuf_import_open(&mine))
					_exit(1);
				/*
				 * A buffer of its own for each attachment: the DMA API's debugging
				 * counts at most 7 live mappings of one page (kernel/dma/debug.c,
				 * ACTIVE_CACHELINE_MAX_OVERLAP) and warns beyond, whoever maps it.
				 */
				for (int k = 0; k < 16; k++) {
					if (tk_buf_vgem(&own, 64 * KiB))
						_exit(1);
					if (i % 2)
						upcie_kmod_dmabuf_attach_pci(&mine, &vram, own.fd,
									     segs, 1024, &n, &h);
					else
						upcie_kmod_dmabuf_attach(&mine, own.fd, segs, 1024,
									 &n, &h);
				}
				if (i == 3)
					pause(); /* killed below */
				_exit(0);
			}
		}
		upcie_sleep_ns((uint64_t)(5 + round * 10) * UPCIE_NSEC_PER_MSEC);
		for (int i = 0; i < 4; i++) {
			if (i >= 2)
				kill(pids[i], SIGKILL);
			waitpid(pids[i], &status, 0);
			alive += WIFEXITED(status) && WEXITSTATUS(status) == 1;
		}
	}
	TAP(!alive && dbi_live(&dctx) == base,
	    "dmabuf race 3 (processes): 24 children attaching and dying (exit, SIGKILL) with "
	    "attachments live: nothing left");
	upcie_pci_driver_unbind(&vram);
	tk_sh("echo > /sys/bus/pci/devices/%s/driver_override", nv);
	tk_buf_free(&dbuf);
	upcie_kmod_dmabuf_import_close(&dctx);
}

/* ---------------------------------------------------------------------------------------- */
/* iommu_map_pa */

static struct upcie_kmod_iommu_map_pa ictx;
static struct upcie_vfio_device d0, d1;
static int d1fd = -1; /* c1's device in race 5, reopened by another thread */
static pthread_mutex_t d1lock = PTHREAD_MUTEX_INITIALIZER;

struct mapper {
	const struct upcie_pci_bdf *bdf;
	int owner;
	uint64_t iova;
	uint64_t pages[NPG];
	bool reopen; /* race 5: the owner is d1fd, taken under d1lock */
};

static void *i_mapper(void *arg)
{
	static const int ok[] = { -ENOENT, -EPERM, -EBADF, -EACCES, -EEXIST, -ENODEV, -EAGAIN, 0 };
	struct mapper *m = arg;
	struct upcie_deadline dl;

	upcie_deadline_set(&dl, UINT64_MAX / 2);
	while (running(&dl)) {
		struct upcie_kmod_iommu_target t = { *m->bdf, m->owner };
		uint64_t h = 0, phys = 0;
		int err, owner = -1;

		if (m->reopen) {
			pthread_mutex_lock(&d1lock);
			owner = d1fd >= 0 ? dup(d1fd) : -1;
			pthread_mutex_unlock(&d1lock);
			t.owner_fd = owner;
		}
		err = upcie_kmod_iommu_map_pa_map(&ictx, &t, &vram, m->iova, m->pages, NPG, 4096, 0,
						  UPCIE_KMOD_IOMMU_RAW_PAGES, &h, NULL);
		expect("MAP", err, ok);
		if (!err) {
			upcie_kmod_iommu_map_pa_translate(&ictx, m->bdf, t.owner_fd, m->iova + 4096,
							  &phys, NULL);
			if (phys && phys != m->pages[1])
				expect("TRANSLATE", -EFAULT, ok);
			expect("UNMAP", upcie_kmod_iommu_map_pa_unmap(&ictx, h), ok);
		}
		if (owner >= 0)
			close(owner);
		atomic_fetch_add(&ops, 1);
	}
	return NULL;
}

static void *i_guesser(void *arg)
{
	static const int ok[] = { -ENOENT, 0 };
	struct upcie_deadline dl;
	unsigned seed = 11;

	(void)arg;
	upcie_deadline_set(&dl, UINT64_MAX / 2);
	while (running(&dl)) {
		expect("UNMAP (guessed)",
		       upcie_kmod_iommu_map_pa_unmap(&ictx, 1 + rand_r(&seed) % 8192), ok);
		upcie_sleep_ns(100 * UPCIE_NSEC_PER_USEC);
	}
	return NULL;
}

static void *i_doorbell(void *arg)
{
	static const int ok[] = { -ENOENT, -EPERM, -EEXIST, -ENODEV, -EAGAIN, 0 };
	struct upcie_deadline dl;
	unsigned i = 0;

	(void)arg;
	upcie_deadline_set(&dl, UINT64_MAX / 2);
	while (running(&dl)) {
		struct upcie_kmod_bar_map bm;
		int err = upcie_kmod_iommu_map_pa_doorbells(&ictx, &vram, &c0, 3, 0, &bm);

		expect("MAP_BAR", err, ok);
		if (++i % 4 == 0)
			upcie_pci_driver_bind(&vram, "uio_pci_generic");
		if (i % 4 == 2) {
			upcie_pci_driver_unbind(&vram);
			tk_sh("echo > /sys/bus/pci/devices/%s/driver_override", nv);
		}
		if (!err && bm.handle)
			expect("UNMAP (bar)", upcie_kmod_iommu_map_pa_unmap(&ictx, bm.handle), ok);
		atomic_fetch_add(&ops, 1);
	}
	upcie_pci_driver_unbind(&vram);
	tk_sh("echo > /sys/bus/pci/devices/%s/driver_override", nv);
	return NULL;
}

/* race 5: c1's device closed and reopened, its group leaving and rejoining, resets */
static struct upcie_vfio_container cont1 = { .fd = -1 };
static struct upcie_vfio_group g1 = { .fd = -1 };

static void *i_owner_churn(void *arg)
{
	static const int ok[] = { -EBUSY, -EINVAL, -ENODEV, 0 };
	struct upcie_deadline dl;
	unsigned i = 0;

	(void)arg;
	upcie_deadline_set(&dl, UINT64_MAX / 2);
	while (running(&dl)) {
		int fd, err;

		switch (i++ % 4) {
		case 0: /* close the user's device (the module may still hold it) */
			pthread_mutex_lock(&d1lock);
			fd = d1fd;
			d1fd = -1;
			pthread_mutex_unlock(&d1lock);
			if (fd >= 0)
				close(fd);
			break;
		case 1: /* the group leaves its container: refused while a device is open */
			err = ioctl(g1.fd, VFIO_GROUP_UNSET_CONTAINER) ? -errno : 0;
			expect("UNSET_CONTAINER", err, ok);
			if (!err) {
				err =
				    ioctl(g1.fd, VFIO_GROUP_SET_CONTAINER, &cont1.fd) ? -errno : 0;
				if (!err)
					err = ioctl(cont1.fd, VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU)
						  ? -errno
						  : 0;
				expect("SET_CONTAINER", err, ok);
			}
			break;
		case 2: /* the device again */
			fd = ioctl(g1.fd, VFIO_GROUP_GET_DEVICE_FD, n1);
			pthread_mutex_lock(&d1lock);
			if (d1fd < 0)
				d1fd = fd;
			else if (fd >= 0)
				close(fd);
			pthread_mutex_unlock(&d1lock);
			break;
		case 3: /* a function reset */
			pthread_mutex_lock(&d1lock);
			if (d1fd >= 0)
				ioctl(d1fd, VFIO_DEVICE_RESET);
			pthread_mutex_unlock(&d1lock);
			break;
		}
		upcie_sleep_ns(2 * UPCIE_NSEC_PER_MSEC);
	}
	return NULL;
}

static void test_iommu(void)
{
	struct upcie_vfio_container cont = { .fd = -1 };
	struct upcie_vfio_group g0 = { .fd = -1 };
	struct mapper ma = { .bdf = &c0, .iova = IOVA_A }, mb = { .bdf = &c0, .iova = IOVA_B };
	struct mapper mc = { .bdf = &c1, .iova = IOVA_C, .reopen = true };
	void *(*fns[4])(void *);
	void *args[4];
	uint64_t base, phys = 1;
	int err, status, bad = 0;

	struct upcie_pci_resource res[UPCIE_PCI_NUM_RES];

	/* after race 2 removed and rescanned it */
	if (upcie_pci_func_resources(&vram, res) || !res[2].start ||
	    upcie_kmod_iommu_map_pa_open(&ictx)) {
		TAP(0, "%s BAR2 and iommu_map_pa open", nv);
		return;
	}
	vram_phys = res[2].start;
	base = imp_live(&ictx);
	for (int i = 0; i < NPG; i++) {
		ma.pages[i] = vram_phys + V_RACE + (uint64_t)i * 4096;
		mb.pages[i] = ma.pages[i] + NPG * 4096;
		mc.pages[i] = mb.pages[i] + NPG * 4096;
	}
	err = upcie_vfio_container_open(&cont);
	if (!err)
		err = upcie_vfio_group_open(&g0, &cont, upcie_vfio_group_id(&c0));
	if (!err)
		err = upcie_vfio_device_open(&d0, &g0, &c0);
	if (!err)
		err = upcie_vfio_container_open(&cont1);
	if (!err)
		err = upcie_vfio_group_open(&g1, &cont1, upcie_vfio_group_id(&c1));
	if (!err)
		err = upcie_vfio_device_open(&d1, &g1, &c1);
	TAP(!err, "%s and %s on vfio-pci, each in its own type1 container", n0, n1);
	if (err)
		goto out;
	ma.owner = mb.owner = d0.fd;
	d1fd = d1.fd;
	d1.fd = -1; /* race 5 owns it from here */

	atomic_store(&ops, 0);
	atomic_store(&unexpected, 0);
	fns[0] = i_mapper, args[0] = &ma;
	fns[1] = i_mapper, args[1] = &mb;
	fns[2] = i_guesser, args[2] = NULL;
	fns[3] = i_doorbell, args[3] = NULL;
	race(fns, args, 4);
	TAP(!atomic_load(&unexpected) && imp_live(&ictx) == base,
	    "iommu race 4 (threads): %lu MAP/TRANSLATE/UNMAP into one domain, guessed UNMAP, "
	    "MAP_BAR while %s's driver changes: contract kept, nothing left",
	    atomic_load(&ops), nv);

	atomic_store(&ops, 0);
	fns[0] = i_mapper, args[0] = &mc;
	fns[1] = i_owner_churn, args[1] = NULL;
	race(fns, args, 2);
	pthread_mutex_lock(&d1lock);
	if (d1fd < 0)
		d1fd = ioctl(g1.fd, VFIO_GROUP_GET_DEVICE_FD, n1);
	pthread_mutex_unlock(&d1lock);
	upcie_kmod_iommu_map_pa_translate(&ictx, &c1, d1fd, IOVA_C, &phys, NULL);
	TAP(!atomic_load(&unexpected) && imp_live(&ictx) == base && !phys,
	    "iommu race 5 (threads): %lu MAP/UNMAP into %s while its device closes and reopens, "
	    "its group leaves and rejoins, it resets: contract kept, nothing left mapped",
	    atomic_load(&ops), n1);

	/* processes that die with mappings live, holding the inherited device */
	for (int round = 0; round < 6; round++) {
		pid_t pids[4];

		for (int i = 0; i < 4; i++) {
			fflush(stdout);
			pids[i] = fork();
			if (pids[i] == 0) {
				struct upcie_kmod_iommu_map_pa mine = { 0 };
				struct upcie_kmod_iommu_target t = { c0, d0.fd };
				uint64_t h, pages[NPG];

				for (int k = 0; k < NPG; k++)
					pages[k] = ma.pages[k] + (uint64_t)i * 2 * MiB;
				if (upcie_kmod_iommu_map_pa_open(&mine))
					_exit(1);
				upcie_kmod_iommu_map_pa_map(
				    &mine, &t, &vram, IOVA_A + 4 * MiB + (uint64_t)i * MiB, pages,
				    NPG, 4096, 0, UPCIE_KMOD_IOMMU_RAW_PAGES, &h, NULL);
				if (i == 3)
					pause();
				_exit(0);
			}
		}
		upcie_sleep_ns((uint64_t)(5 + round * 10) * UPCIE_NSEC_PER_MSEC);
		for (int i = 0; i < 4; i++) {
			if (i >= 2)
				kill(pids[i], SIGKILL);
			waitpid(pids[i], &status, 0);
			bad += WIFEXITED(status) && WEXITSTATUS(status) == 1;
		}
	}
	for (int i = 0; i < 4; i++) {
		phys = 1;
		upcie_kmod_iommu_map_pa_translate(
		    &ictx, &c0, d0.fd, IOVA_A + 4 * MiB + (uint64_t)i * MiB, &phys, NULL);
		bad += phys != 0;
	}
	TAP(!bad && imp_live(&ictx) == base,
	    "iommu race 6 (processes): 24 children mapping into %s and dying (exit, SIGKILL): "
	    "their mappings are gone",
	    n0);

	/* the memory's source goes away and comes back under MAP */
	atomic_store(&ops, 0);
	fns[0] = i_mapper, args[0] = &ma;
	fns[1] = d_remover, args[1] = NULL;
	race(fns, args, 2);
	phys = 1;
	upcie_kmod_iommu_map_pa_translate(&ictx, &c0, d0.fd, IOVA_A + 4096, &phys, NULL);
	TAP(!atomic_load(&unexpected) && imp_live(&ictx) == base && !phys &&
		!upcie_pci_func_exists(&vram),
	    "iommu race 7 (threads): %lu MAP/TRANSLATE/UNMAP of %s's pages into %s while %s, "
	    "their source, is removed and rescanned: contract kept, nothing left mapped",
	    atomic_load(&ops), nv, n0, nv);
	upcie_pci_driver_unbind(&vram);
	tk_sh("echo > /sys/bus/pci/devices/%s/driver_override", nv);
out:
	if (d1fd >= 0)
		close(d1fd);
	d1fd = -1;
	upcie_vfio_device_close(&d1);
	upcie_vfio_device_close(&d0);
	upcie_vfio_group_close(&g1);
	upcie_vfio_group_close(&g0);
	upcie_vfio_container_close(&cont1);
	upcie_vfio_container_close(&cont);
	upcie_kmod_iommu_map_pa_close(&ictx);
}

int main(int argc, char **argv)
{
	if (argc < 4 || tk_bdf(argv[1], &c0) || tk_bdf(argv[2], &c1) || tk_bdf(argv[3], &vram))
		return 2;
	if (argc > 4)
		secs = strtoull(argv[4], NULL, 0);
	upcie_log_set_handler(quiet, NULL);
	upcie_pci_bdf_format(&c0, n0, sizeof(n0));
	upcie_pci_bdf_format(&c1, n1, sizeof(n1));
	upcie_pci_bdf_format(&vram, nv, sizeof(nv));
	iommu = getenv("TB_IOMMU") && !strcmp(getenv("TB_IOMMU"), "1");

	test_dmabuf();
	if (iommu)
		test_iommu();
	else
		SKIPPED("no IOMMU", "iommu_map_pa races");
	return tap_done();
}
