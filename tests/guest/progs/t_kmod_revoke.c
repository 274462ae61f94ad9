/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest test of revocation in the dmabuf_import module: a vfio-pci BAR dma-buf of the ivshmem
 * "VRAM" (an exporter without a pin op that revokes on memory disable, reset and close) attached
 * for the NVMe c0 on uio_pci_generic under the vIOMMU, the way a user-space driver would use it.
 *
 * - The module refuses that buffer for its own device (it could not stop the device using it)
 *   and accepts it for c0 (which it can stop).
 * - c0 Reads a namespace into the BAR through the attachment: the data lands (guest view through
 *   vfio's BAR mmap, host view in vram.img).
 * - Mid-DMA: a batch of Reads into the BAR is in flight when vfio disables the BAR's memory
 *   decoding (the revocation). The revocation must complete within a bound (the module stops c0
 *   and unmaps inside the exporter's callback; vfio waits for that unmap), and GET on the handle
 *   answers ESTALE from then on.
 * - After the revocation point the BAR is enabled again and c0 given bus mastering back, as a
 *   careless user would, and more Reads are issued to the revoked addresses: none of them may
 *   land (guest view and vram.img), while a fresh attachment's Reads do (the positive control:
 *   the path itself works, so the silence is the revocation's).
 * - Closing the vfio device revokes a live attachment too; every later use of the handle, and a
 *   new attachment of the dead buffer, fails clearly.
 * - Negative control (test builds of the module, parameter test_ignore_revocation): with the
 *   stop-and-unmap removed, the same revocation does not complete within the bound.
 *
 * Usage: t_kmod_revoke NVME_BDF VRAM_BDF   (c0 on uio_pci_generic, vram on vfio-pci; modules
 * dmabuf_import, vgem, vfio-pci; Linux with VFIO_PCI_DMABUF, an IOMMU, and a peer-to-peer path
 * from c0 to the BAR that the PCI core accepts)
 */
// testbed-ldflags: -lpthread
#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <upcie/base/clock.h>
#include <upcie/kmod/dmabuf_import.h>
#include <upcie/pci/bar.h>
#include <upcie/pci/config.h>
#include <upcie/vfio/device.h>
#include <upcie/vfio/dmabuf.h>
#include <upcie/vfio/type1.h>

#include "t_kmod.h"

#define EXPORT_LEN   (16 * MiB) /* of the ivshmem BAR2 */
#define R_BEFORE     0		/* offsets in the exported range */
#define R_MID	     (1 * MiB)
#define R_AFTER	     (4 * MiB)
#define R_CONTROL    (8 * MiB)
#define CHUNK	     (16 * KiB)
#define N_MID	     32
#define N_AFTER	     16
#define BOUND_NS     (10 * UPCIE_NSEC_PER_SEC) /* the revocation must complete within */
#define CTRL_NS	     (3 * UPCIE_NSEC_PER_SEC)  /* negative control: still blocked after */
#define LBA(off)     ((off) / 512)	       /* c0n1 has 512-byte blocks */
#define IGNORE_PARAM "/sys/module/dmabuf_import/parameters/test_ignore_revocation"

static struct upcie_pci_bdf c0, vram;
static char n0[UPCIE_PCI_BDF_STRLEN], nv[UPCIE_PCI_BDF_STRLEN];

/* The BAR's memory decoding through vfio's config region: off revokes, on un-revokes. */
static int bar_memory(const struct upcie_vfio_device *d, bool on)
{
	uint16_t cmd = 0;
	int err = upcie_vfio_region_rw(d, VFIO_PCI_CONFIG_REGION_INDEX, UPCIE_PCI_CFG_COMMAND, &cmd,
				       2, 0);

	if (err)
		return err;
	cmd = on ? (uint16_t)(cmd | 0x2) : (uint16_t)(cmd & ~0x2);
	return upcie_vfio_region_rw(d, VFIO_PCI_CONFIG_REGION_INDEX, UPCIE_PCI_CFG_COMMAND, &cmd, 2,
				    1);
}

/* A revocation running in its own thread, so that the caller can bound its duration. */
struct revoker {
	const struct upcie_vfio_device *dev;
	pthread_t t;
	atomic_int done;
	int err;
	uint64_t ns;
};

static void *revoke_fn(void *arg)
{
	struct revoker *r = arg;
	uint64_t t0 = upcie_time_ns();

	r->err = bar_memory(r->dev, false);
	r->ns = upcie_time_ns() - t0;
	atomic_store(&r->done, 1);
	return NULL;
}

/* Start a revocation; wait up to `bound` ns for it. true: it completed in time. */
static bool revoke_within(struct revoker *r, const struct upcie_vfio_device *dev, uint64_t bound)
{
	struct upcie_deadline dl;

	memset(r, 0, sizeof(*r));
	r->dev = dev;
	if (pthread_create(&r->t, NULL, revoke_fn, r))
		return false;
	upcie_deadline_set(&dl, bound);
	while (!atomic_load(&r->done) && !upcie_deadline_passed(&dl))
		upcie_sleep_ns(UPCIE_NSEC_PER_MSEC);
	return atomic_load(&r->done);
}

/* Is c0 allowed to master the bus? */
static bool c0_masters(void)
{
	uint16_t cmd = 0;

	return !upcie_pci_config_read16(&c0, UPCIE_PCI_CFG_COMMAND, &cmd) &&
	       (cmd & UPCIE_PCI_CMD_MASTER);
}

static uint64_t handle_of(const struct upcie_dmamem *m)
{
	return ((const struct upcie_dmamem_dmabuf_import_priv_ *)m->priv)->handle;
}

/* Does buf hold, per CHUNK, either the vram pattern or c0n1's data of the matching LBA? */
static int chunks_either(const volatile uint8_t *buf, uint64_t off, unsigned n, uint64_t lba0,
			 const char *vtag, const char *ntag, unsigned *landed)
{
	*landed = 0;
	for (unsigned i = 0; i < n; i++) {
		const volatile uint8_t *p = buf + off + (uint64_t)i * CHUNK;

		if (tk_pat_diff(p, CHUNK, ntag, (lba0 + i * LBA(CHUNK)) * 512) < 0)
			(*landed)++;
		else if (tk_pat_diff(p, CHUNK, vtag, off + (uint64_t)i * CHUNK) >= 0)
			return (int)i; /* neither: torn or foreign data */
	}
	return -1;
}

/* Issue `n` Reads of CHUNK from c0n1 at lba0 + i * LBA(CHUNK) into mem at off + i * CHUNK. */
static void reads(struct tk_nvme *nv0, const struct upcie_dmamem *mem, uint64_t off, unsigned n,
		  uint64_t lba0, struct upcie_nvme_req *r)
{
	for (unsigned i = 0; i < n; i++) {
		memset(&r[i], 0, sizeof(r[i]));
		if (upcie_nvme_ioq_read(&nv0->q, &nv0->ns, lba0 + i * LBA(CHUNK), mem,
					off + (uint64_t)i * CHUNK, CHUNK, &r[i]))
			r[i].done = true;
	}
}

/* Reap for up to `ns`; returns how many of r[0..n) are done. */
static unsigned reap(struct tk_nvme *nv0, struct upcie_nvme_req *r, unsigned n, uint64_t ns)
{
	struct upcie_deadline dl;
	unsigned done = 0;

	upcie_deadline_set(&dl, ns);
	do {
		upcie_nvme_ioq_poll(&nv0->q, 64);
		done = 0;
		for (unsigned i = 0; i < n; i++)
			done += r[i].done;
		if (done == n)
			break;
		upcie_sleep_ns(UPCIE_NSEC_PER_MSEC);
	} while (!upcie_deadline_passed(&dl));
	return done;
}

/* Bring c0 (up again): bus mastering (our revocation clears it), controller, one I/O queue. */
static int c0_up(struct tk_nvme *nv0, const struct upcie_pci_bar *bar0,
		 const struct upcie_dmamem *host)
{
	int err = upcie_pci_bus_master_enable(&c0);

	return err ? err : tk_nvme_up(nv0, (volatile void *)bar0->addr, bar0->size, host, 1);
}

int main(int argc, char **argv)
{
	struct upcie_vfio_container cont = { .fd = -1 };
	struct upcie_vfio_group g = { .fd = -1 };
	struct upcie_vfio_device dev = { .fd = -1 };
	struct upcie_vfio_region vb = { 0 };
	struct upcie_kmod_dmabuf_import imp = { 0 };
	struct upcie_dmamem host = { 0 }, data = { 0 }, data2 = { 0 };
	struct upcie_nvme_req mid[N_MID], after[N_AFTER];
	struct upcie_sg_seg segs[256];
	struct upcie_pci_bar bar0 = { 0 };
	struct tk_nvme nv0 = { 0 };
	struct revoker rv;
	struct tk_buf hb = { 0 };
	char vtag[9], ntag[9];
	size_t n = 0, got;
	uint64_t h = 0;
	unsigned landed, done;
	int dfd = -1, err, bad;

	upcie_log_set_handler(tk_log, NULL);
	if (argc < 3 || tk_bdf(argv[1], &c0) || tk_bdf(argv[2], &vram))
		return 2;
	upcie_pci_bdf_format(&c0, n0, sizeof(n0));
	upcie_pci_bdf_format(&vram, nv, sizeof(nv));
	tk_tag(vtag, "vram");
	tk_tag(ntag, "c0n1");

	err = upcie_vfio_container_open(&cont);
	if (!err)
		err = upcie_vfio_group_open(&g, &cont, upcie_vfio_group_id(&vram));
	if (!err)
		err = upcie_vfio_device_open(&dev, &g, &vram);
	TAP(!err, "%s (the VRAM) opened through vfio type1", nv);
	if (err)
		goto out;
	err = upcie_vfio_dmabuf_probe(&dev);
	if (err) {
		SKIPPED("this kernel's vfio-pci has no BAR dma-buf export (VFIO_PCI_DMABUF)",
			"revocation of a vfio-pci BAR dma-buf");
		goto out;
	}
	err = upcie_vfio_dmabuf_export(&dev, 2, 0, EXPORT_LEN, &dfd);
	if (!err)
		err = upcie_vfio_region_map(&dev, VFIO_PCI_BAR2_REGION_INDEX, &vb);
	TAP(!err, "BAR2 [0, 16 MiB) exported as a dma-buf, and mmapped through vfio");
	if (err)
		goto out;
	err = upcie_kmod_dmabuf_import_open(&imp);
	TAP(!err, "dmabuf_import open");
	if (err)
		goto out;

	err = upcie_kmod_dmabuf_attach(&imp, dfd, segs, 256, &n, &h);
	TAP(err == -EOPNOTSUPP,
	    "for the module's own device: -EOPNOTSUPP (no pin op, may revoke, and no device the "
	    "module could stop) (%d)",
	    err);
	err = upcie_kmod_dmabuf_attach_pci(&imp, &c0, dfd, segs, 256, &n, &h);
	if (err == -EINVAL || err == -EREMOTEIO) {
		/* vfio-pci's exporter asks the PCI core for a peer-to-peer path (p2pdma) */
		SKIPPED("the PCI core has no peer-to-peer path from this NVMe to the BAR here "
			"(pci_p2pdma: host bridge not on its list, CPU not one it trusts)",
			"attach for %s, which the module can stop", n0);
		goto out;
	}
	TAP(!err, "for %s on uio_pci_generic: attached, %zu segment(s), IOVA 0x%" PRIx64, n0, n,
	    err ? 0 : segs[0].addr);
	if (err)
		goto out;
	upcie_kmod_dmabuf_detach(&imp, h);
	err = upcie_dmamem_dmabuf_import_pci(&data, &imp, &c0, dfd, vb.addr, EXPORT_LEN,
					     tk_granule(segs, n));
	if (!err)
		err = tk_buf_vgem(&hb, 4 * MiB);
	if (!err)
		err = upcie_kmod_dmabuf_attach_pci(&imp, &c0, hb.fd, segs, 256, &n, &h);
	if (!err) {
		upcie_kmod_dmabuf_detach(&imp, h);
		err = upcie_dmamem_dmabuf_import_pci(&host, &imp, &c0, hb.fd, hb.va, hb.size,
						     tk_granule(segs, n));
	}
	if (!err)
		err = upcie_pci_bar_map(&c0, 0, 0, &bar0);
	if (!err)
		err = c0_up(&nv0, &bar0, &host);
	TAP(!err, "%s up on uio, queues in a vgem buffer and data in the BAR, both attached for it",
	    n0);
	if (err)
		goto out;

	/* before: the path works */
	err = tk_nvme_rw(&nv0, false, LBA(R_BEFORE), &data, R_BEFORE, 64 * KiB);
	TAP(!err && tk_pat_diff((char *)vb.addr + R_BEFORE, 64 * KiB, ntag, 0) < 0,
	    "before: %s Reads c0n1 [0, 64 KiB) into the BAR through the attachment", n0);
	INFO("revoke_before", "%" PRIu64 "+%" PRIu64 "+c0n1+0", (uint64_t)R_BEFORE, 64 * KiB);

	/* mid-DMA: a batch in flight, then the BAR's memory disabled */
	reads(&nv0, &data, R_MID, N_MID, LBA(R_MID), mid);
	if (!revoke_within(&rv, &dev, BOUND_NS)) {
		TAP(0, "the revocation completed within %llu s",
		    (unsigned long long)(BOUND_NS / UPCIE_NSEC_PER_SEC));
		upcie_dmamem_destroy(&data); /* unmaps: unblocks vfio */
		pthread_join(rv.t, NULL);
		goto out;
	}
	pthread_join(rv.t, NULL);
	TAP(!rv.err,
	    "mid-DMA: %s's memory decoding off (vfio revokes the dma-buf); completed in "
	    "%" PRIu64 " ms, within the bound",
	    nv, rv.ns / UPCIE_NSEC_PER_MSEC);
	err = upcie_kmod_dmabuf_segs(&imp, handle_of(&data), 0, segs, 256, &got);
	TAP(err == -ESTALE, "the handle now answers -ESTALE (%d)", err);
	TAP(!c0_masters(), "the module cleared %s's bus mastering: its DMA has stopped", n0);
	done = reap(&nv0, mid, N_MID, 500 * UPCIE_NSEC_PER_MSEC);
	DIAG("%u of %u Reads of the batch completed around the revocation", done, N_MID);
	INFO("revoke_mid", "%" PRIu64 "+%u+%" PRIu64, (uint64_t)R_MID, N_MID * (unsigned)CHUNK,
	     (uint64_t)LBA(R_MID));

	/* after: the BAR enabled again, c0 mastering again, Reads to the revoked addresses */
	TAP(!bar_memory(&dev, true), "%s's memory decoding on again (vfio un-revokes the buffer)",
	    nv);
	tk_nvme_down(&nv0);
	err = c0_up(&nv0, &bar0, &host);
	TAP(!err, "%s reset and up again, bus mastering on (a user ignoring the error)", n0);
	if (err)
		goto out;
	reads(&nv0, &data, R_AFTER, N_AFTER, LBA(R_AFTER), after);
	done = reap(&nv0, after, N_AFTER, 3 * UPCIE_NSEC_PER_SEC);
	bad = chunks_either(vb.addr, R_AFTER, N_AFTER, LBA(R_AFTER), vtag, ntag, &landed);
	TAP(bad < 0 && !landed,
	    "after: %u Reads to the revoked addresses (%u reported done): none landed in the BAR "
	    "(guest view; %u chunks landed, first odd chunk %d)",
	    N_AFTER, done, N_AFTER, bad);
	INFO("revoke_after", "%" PRIu64 "+%u", (uint64_t)R_AFTER, N_AFTER * (unsigned)CHUNK);
	bad = chunks_either(vb.addr, R_MID, N_MID, LBA(R_MID), vtag, ntag, &landed);
	TAP(bad < 0,
	    "mid: each chunk of the batch holds either its Read's data or the old "
	    "pattern (%u landed before the revocation), nothing torn",
	    landed);

	/* the positive control: a new attachment works, so the silence above is the revocation's */
	err = upcie_dmamem_dmabuf_import_pci(&data2, &imp, &c0, dfd, vb.addr, EXPORT_LEN,
					     tk_granule(segs, n));
	if (!err)
		err = tk_nvme_rw(&nv0, false, LBA(R_CONTROL), &data2, R_CONTROL, 64 * KiB);
	TAP(!err && tk_pat_diff((char *)vb.addr + R_CONTROL, 64 * KiB, ntag, R_CONTROL) < 0,
	    "control: a new attachment of the same buffer, and %s's Read through it lands", n0);
	INFO("revoke_control", "%" PRIu64 "+%" PRIu64 "+c0n1+%" PRIu64, (uint64_t)R_CONTROL,
	     64 * KiB, (uint64_t)R_CONTROL);
	upcie_dmamem_destroy(&data);
	TAP(!data.priv, "the revoked attachment detaches");

	/* close: the exporter goes, the live attachment is revoked; every later use fails */
	upcie_vfio_region_unmap(&vb);
	upcie_vfio_device_close(&dev);
	err = data2.priv ? upcie_kmod_dmabuf_segs(&imp, handle_of(&data2), 0, segs, 256, &got) : 0;
	TAP(err == -ESTALE && !c0_masters(),
	    "vfio device closed with an attachment live: revoked, %s stopped, the handle answers "
	    "-ESTALE (%d)",
	    n0, err);
	err = upcie_kmod_dmabuf_attach_pci(&imp, &c0, dfd, segs, 256, &n, &h);
	TAP(err < 0, "a new attachment of the closed device's buffer fails: %s", strerror(-err));
	upcie_dmamem_destroy(&data2);
	close(dfd);
	dfd = -1;

	/* negative control: the stop-and-unmap removed, the revocation does not complete */
	if (access(IGNORE_PARAM, W_OK)) {
		SKIPPED("not a test build of the module", "negative control");
	} else {
		struct upcie_dmamem d3 = { 0 };

		err = upcie_vfio_device_open(&dev, &g, &vram);
		if (!err)
			err = upcie_vfio_dmabuf_export(&dev, 2, 0, EXPORT_LEN, &dfd);
		if (!err)
			err = upcie_dmamem_dmabuf_import_pci(&d3, &imp, &c0, dfd, NULL, EXPORT_LEN,
							     tk_granule(segs, n));
		tk_sh("echo 1 > " IGNORE_PARAM);
		if (!err && revoke_within(&rv, &dev, CTRL_NS)) {
			TAP(0, "negative control: with revocation ignored the revocation must not "
			       "complete, yet it did");
		} else if (!err) {
			TAP(1,
			    "negative control: with revocation ignored, vfio's revocation is still "
			    "blocked after %llu s (caught by the bound)",
			    (unsigned long long)(CTRL_NS / UPCIE_NSEC_PER_SEC));
			upcie_dmamem_destroy(&d3); /* the unmap vfio waits for */
			pthread_join(rv.t, NULL);
			TAP(atomic_load(&rv.done), "and completes once the handle is detached");
		} else {
			TAP(0, "negative control setup (%d)", err);
		}
		tk_sh("echo 0 > " IGNORE_PARAM);
		upcie_dmamem_destroy(&d3);
		bar_memory(&dev, true);
	}
	upcie_pci_bus_master_enable(&c0);
out:
	tk_nvme_down(&nv0);
	upcie_pci_bar_unmap(&bar0);
	upcie_dmamem_destroy(&data2);
	upcie_dmamem_destroy(&data);
	upcie_dmamem_destroy(&host);
	tk_buf_free(&hb);
	upcie_kmod_dmabuf_import_close(&imp);
	if (dfd >= 0)
		close(dfd);
	upcie_vfio_region_unmap(&vb);
	upcie_vfio_device_close(&dev);
	upcie_vfio_group_close(&g);
	upcie_vfio_container_close(&cont);
	return tap_done();
}
