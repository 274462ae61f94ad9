/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * peer_bar_dma: an NVMe controller reads straight into another PCIe device's memory (a BAR),
 * peer to peer, with no copy through host memory: how data reaches GPU memory.
 *
 *   peer_bar_dma [--path auto|uio|type1|iommufd] [--nsid N] [--lba L] [--bytes B]
 *                [--bar N] [--bar-offset O] [--bind-peer] NVME_BDF PEER_BDF
 *
 * Brings the controller at NVME_BDF up (as examples/nvme_driver.c does) and makes the slice
 * [O, O + B) of BAR N (default BAR2, offset 0, 1 MiB) of PEER_BDF DMA memory for it with
 * upcie_nvme_peer_open(): the BAR's bus address under uio, an IOVA mapping the BAR in the same
 * container (vfio type1) or IOAS (iommufd, from Linux 6.19: a vfio dma-buf of the BAR) as the
 * controller's own memory. Then it fills the slice with a marker through its CPU mapping, reads B
 * bytes from LBA L (default 0) of a namespace into it, reads the same blocks into host memory,
 * and compares the two through the BAR's CPU mapping: equal bytes show the controller wrote into
 * the peer's memory. Only reads: the namespace is not changed. The BAR slice is the destination
 * and keeps the data read.
 *
 * The peer: on the vfio paths it must be bound to vfio-pci (the example joins its group to the
 * controller's container); under uio it must have no driver, or one that leaves the BAR alone.
 * With --bind-peer the example arranges that; without, it refuses a peer in the wrong state,
 * since taking a device from its driver (a GPU from its own) is the user's decision. Under uio
 * the device sees bus addresses: no translating IOMMU, and a root complex or switch that routes
 * peer-to-peer traffic; nothing in software can tell when it does not (mem/dmamem_bar.h). On a
 * GPU, the real use, the BAR is the GPU's BAR1 aperture onto VRAM; the GPU runtime providers
 * (gpu/heap_cuda.h, gpu/heap_hip.h) reach it through dma-bufs instead of a vfio binding.
 *
 * Needs root and hugepages (upcie-setup hugepages reserve 64).
 */
#include <upcie/base/feature.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/dev.h>
#include <upcie/nvme/ns.h>
#include <upcie/pci/driver.h>

#define MARKER 0xa5u

/* Put the peer in the state the path needs; with bind false only check it. */
static int peer_prepare(const struct upcie_pci_bdf *peer, const char *name,
			enum upcie_nvme_path path, bool bind)
{
	bool vfio = path != UPCIE_NVME_PATH_UIO;
	char drv[64] = "";
	int err = upcie_pci_driver_get(peer, drv, sizeof(drv));

	if (err)
		return err;
	if (vfio ? !strcmp(drv, "vfio-pci") : !drv[0])
		return 0;
	if (!bind) {
		fprintf(
		    stderr,
		    "peer_bar_dma: %s is %s%s; the %s path needs it %s (--bind-peer does that)\n",
		    name, drv[0] ? "bound to " : "not bound", drv, upcie_nvme_path_name(path),
		    vfio ? "bound to vfio-pci" : "without a driver");
		return -EBUSY;
	}
	printf("  %s: %s %s\n", name, drv[0] ? "was bound to" : "had no driver", drv[0] ? drv : "");
	return vfio ? upcie_pci_driver_bind(peer, "vfio-pci") : upcie_pci_driver_unbind(peer);
}

int main(int argc, char **argv)
{
	struct upcie_nvme_ctrl_opts opts;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_peer peer;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct upcie_dmamem mem;
	struct upcie_pci_bdf bdf, pbdf;
	uint64_t lba = 0, bytes = 1 << 20, boff = 0, diff = UINT64_MAX;
	uint32_t nsid = 1, bar = 2;
	const char *args[2] = { NULL, NULL };
	bool bind_peer = false, have_q = false;
	uint8_t *view = NULL;
	int nargs = 0, err;

	memset(&opts, 0, sizeof(opts));
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(argv[i], "--path") && v && !upcie_nvme_path_parse(v, &opts.dev.path))
			i++;
		else if (!strcmp(argv[i], "--nsid") && v)
			nsid = (uint32_t)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--lba") && v)
			lba = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--bytes") && v)
			bytes = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--bar") && v)
			bar = (uint32_t)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--bar-offset") && v)
			boff = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--bind-peer"))
			bind_peer = true;
		else if (argv[i][0] != '-' && nargs < 2)
			args[nargs++] = argv[i];
		else
			nargs = 0, i = argc;
	}
	if (nargs != 2 || upcie_pci_bdf_parse(args[0], &bdf) ||
	    upcie_pci_bdf_parse(args[1], &pbdf) || !bytes || bytes % 4096 || boff % 4096 ||
	    bar > 5) {
		fprintf(stderr, "usage: peer_bar_dma [--path auto|uio|type1|iommufd] [--nsid N] "
				"[--lba L] [--bytes B] [--bar N] [--bar-offset O] [--bind-peer] "
				"NVME_BDF PEER_BDF\n  (B and O multiples of 4096)\n");
		return 2;
	}

	/* 1. the controller, and a namespace that can be read into any buffer */
	opts.dev.bind = true;
	err = upcie_nvme_ctrl_open(&c, &bdf, &opts);
	if (err) {
		fprintf(stderr, "peer_bar_dma: cannot bring up %s: %s\n", args[0], strerror(-err));
		return 1;
	}
	printf("%s on the %s path (%s)\n", c.name, upcie_nvme_path_name(c.dev.path),
	       c.dev.path_why);
	memset(&mem, 0, sizeof(mem));
	memset(&peer, 0, sizeof(peer));
	err = upcie_nvme_ns_open(&ns, &c, nsid);
	if (!err && ns.ms && !ns.pract) {
		fprintf(stderr, "peer_bar_dma: namespace %u has metadata; take one without\n",
			nsid);
		err = -EOPNOTSUPP;
	}
	if (!err &&
	    (bytes % ns.lba_bytes || lba > ns.nsze || bytes / ns.lba_bytes > ns.nsze - lba)) {
		fprintf(stderr,
			"peer_bar_dma: %" PRIu64 " B at LBA %" PRIu64
			" do not fit namespace %u (%" PRIu64 " blocks of %u B)\n",
			bytes, lba, nsid, ns.nsze, ns.lba_bytes);
		err = -EINVAL;
	}
	if (err)
		goto out;

	/* 2. the peer's BAR slice as DMA memory for this controller, on the controller's path */
	err = peer_prepare(&pbdf, args[1], c.dev.path, bind_peer);
	if (err)
		goto out;
	err = upcie_nvme_peer_open(&peer, &c.dev, &pbdf, bar, boff, bytes);
	if (err) {
		fprintf(stderr,
			"peer_bar_dma: %s BAR%u [0x%" PRIx64 ", +0x%" PRIx64
			") as DMA memory: %s\n",
			args[1], bar, boff, bytes, strerror(-err));
		goto out;
	}
	if (!peer.mem.vaddr) {
		fprintf(stderr,
			"peer_bar_dma: BAR%u of %s cannot be mapped by the CPU: nothing "
			"to compare with\n",
			bar, args[1]);
		err = -EOPNOTSUPP;
		goto out;
	}
	printf("  %s BAR%u [0x%" PRIx64 ", +%" PRIu64 " KiB): %s, device address 0x%" PRIx64 "\n",
	       args[1], bar, boff, bytes >> 10, peer.mem.kind,
	       upcie_dmamem_iova_fast(&peer.mem, 0));

	/* 3. marker into the slice, then the read straight into it, and the same into host memory */
	for (uint64_t i = 0; i < bytes; i += 8)
		*(volatile uint64_t *)((uint8_t *)peer.mem.vaddr + i) =
		    0x0101010101010101ull * MARKER;
	err = upcie_nvme_dev_dmamem(&c.dev, bytes, &mem);
	if (!err)
		err = upcie_nvme_ioq_create(&q, &c, NULL);
	if (err)
		goto out;
	have_q = true;
	err = upcie_nvme_ioq_read_sync(&q, &ns, lba, &peer.mem, 0, bytes, NULL);
	if (!err)
		err = upcie_nvme_ioq_read_sync(&q, &ns, lba, &mem, 0, bytes, NULL);
	if (err)
		goto out;

	/* 4. compare through the BAR mapping: 8-byte loads, as device memory wants to be read */
	view = (uint8_t *)malloc(bytes);
	if (!view) {
		err = -ENOMEM;
		goto out;
	}
	for (uint64_t i = 0; i < bytes; i += 8)
		*(uint64_t *)(view + i) = *(volatile uint64_t *)((uint8_t *)peer.mem.vaddr + i);
	for (uint64_t i = 0; i < bytes && diff == UINT64_MAX; i++)
		if (view[i] != ((uint8_t *)mem.vaddr)[i])
			diff = i;
	if (diff != UINT64_MAX) {
		fprintf(stderr,
			"peer_bar_dma: the BAR differs from the host read at byte %" PRIu64
			" (0x%02x, expected 0x%02x)\n",
			diff, view[diff], ((uint8_t *)mem.vaddr)[diff]);
		err = -EIO;
		goto out;
	}
	printf("  read %" PRIu64 " KiB at LBA %" PRIu64 " of namespace %u into the peer's BAR: "
	       "the CPU view of the BAR matches a read into host memory\n",
	       bytes >> 10, lba, nsid);
out:
	/* 5. the queue, then every DMA memory (the peer's too), before the controller */
	free(view);
	if (have_q)
		upcie_nvme_ioq_delete(&q);
	upcie_dmamem_destroy(&mem);
	upcie_nvme_peer_close(&peer);
	if (upcie_nvme_ctrl_close(&c) == 0 && !err)
		printf("  controller shut down\n");
	if (err)
		fprintf(stderr, "peer_bar_dma: %s\n", strerror(-err));
	return err ? 1 : 0;
}
