/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the IOMEMORY registration probes (probe_iomem_cuda.cu, probe_iomem_hip.hip) share: where
 * the BAR mapping comes from, the host's read of the register beside which the device's read is
 * printed, and the dma-bufs other than the runtime's own that an import can be tried with.
 *
 * The mapping is the one a GPU-initiated NVMe path registers to reach a doorbell: a BAR mmap,
 * from the process's own vfio device (--vfio BDF), from a device another process handed over
 * (--receive SOCKET, served by probe_vfio_delegate, so the registering process may be one that
 * started unprivileged: --as UID[:GID]), or from a sysfs resource file (--sysfs BDF, root). Reads
 * only, at --offset (default 0: an NVMe controller's CAP); nothing ever stores to the BAR. A GPU
 * does not read its own BAR (sysfs on the GPU machine) unless --self-read: that is PCIe loopback,
 * which says nothing about a peer and on a machine that is not yours may end in an uncorrectable error.
 */
#ifndef UPCIE_TOOLS_PROBE_IOMEM_H
#define UPCIE_TOOLS_PROBE_IOMEM_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <upcie/pci/bdf.h>
#include <upcie/vfio/dmabuf.h>

#include "probe_common.h"
#include "probe_deleg.h"

struct probe_iomem_opts {
	int src;	    /* PROBE_SRC_*, or PROBE_SRC_NONE (only the import questions) */
	int receive;	    /* target is a socket to receive from */
	const char *target; /* BDF, or the socket */
	uint32_t bar;
	uint32_t off;
	int ordinal;
	int self_read;
};

static inline int probe_iomem_parse(int argc, char **argv, struct probe_iomem_opts *o)
{
	uint64_t v;

	memset(o, 0, sizeof(*o));
	o->src = -1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--none")) {
			o->src = PROBE_SRC_NONE;
			continue;
		}
		if (!strcmp(a, "--self-read")) {
			o->self_read = 1;
			continue;
		}
		if (!next)
			return -EINVAL;
		if (!strcmp(a, "--sysfs") || !strcmp(a, "--vfio") || !strcmp(a, "--receive")) {
			o->src = a[2] == 's' ? PROBE_SRC_SYSFS : PROBE_SRC_AUTO;
			o->receive = a[2] == 'r';
			o->target = next;
		} else if (!strcmp(a, "--bar") || !strcmp(a, "--offset") ||
			   !strcmp(a, "--device")) {
			if (probe_parse_size(next, &v) || v > 0xffffffffu)
				return -EINVAL;
			if (a[2] == 'b')
				o->bar = (uint32_t)v;
			else if (a[2] == 'o')
				o->off = (uint32_t)v;
			else
				o->ordinal = (int)v;
		} else {
			return -EINVAL;
		}
		i++;
	}
	if (o->src < 0 || o->off % 4 || o->bar > 5)
		return -EINVAL;
	return 0;
}

struct probe_iomem {
	struct probe_bar bar;
	int have_bar;
	int sock; /* receive: the connection to the server, which waits for a note */
	struct probe_deleg_msg msg;
	uint32_t off;
	uint32_t host_val;
	int host_err;
};

/* Open, receive or skip the BAR as asked, map it, read the register from the host. */
static inline void probe_iomem_open(struct probe_iomem *io, const struct probe_iomem_opts *o)
{
	int err;

	memset(io, 0, sizeof(*io));
	probe_bar_init(&io->bar);
	io->sock = -1;
	io->off = o->off;
	io->host_err = -ENODEV;
	if (o->src == PROBE_SRC_NONE) {
		probe_say("BAR: none asked for (--none): only the import questions");
		return;
	}
	if (o->receive) {
		err = probe_bar_receive(&io->bar, o->target, &io->sock, &io->msg);
	} else {
		err = probe_bar_open(&io->bar, o->target, o->src, o->bar);
		probe_say("BAR: open %s BAR%u through %s: %s", o->target, o->bar,
			  probe_src_name(io->bar.src), err ? probe_err(err) : "ok");
		if (!err) {
			err = probe_bar_map(&io->bar);
			probe_say("BAR: mmap of %s: %s", probe_size(io->bar.size),
				  err ? probe_err(err) : "ok");
		}
	}
	if (err)
		return;
	io->have_bar = 1;
	io->host_err = probe_bar_read32(&io->bar, o->off, &io->host_val);
	if (io->host_err)
		probe_say("BAR: host read at +0x%x: %s", o->off, probe_err(io->host_err));
	else
		probe_say("BAR: host read at +0x%x: 0x%08x", o->off, io->host_val);
}

/* Whether the BAR belongs to the GPU itself (its PCI address as the runtime prints it). */
static inline int probe_iomem_is_self(const struct probe_iomem *io, const char *gpu_bus_id)
{
	struct upcie_pci_bdf a, b;

	if (!io->have_bar || upcie_pci_bdf_parse(io->bar.bdf, &a) ||
	    upcie_pci_bdf_parse(gpu_bus_id, &b))
		return 0;
	return upcie_pci_bdf_equal(&a, &b);
}

/*
 * dma-bufs other than the runtime's own to try an import with: the BAR's own vfio export (a page
 * at offset 0) and a udmabuf. Descriptors into fds[], names into names[]; returns the count.
 * Each one that cannot be had is reported instead.
 */
static inline int probe_iomem_other_dmabufs(struct probe_iomem *io, int *fds, const char **names)
{
	struct upcie_vfio_device dev;
	int n = 0, fd = -1, err;

	if (io->have_bar && (io->bar.src == PROBE_SRC_TYPE1 || io->bar.src == PROBE_SRC_CDEV)) {
		err = probe_bar_vfio_dev(&io->bar, &dev);
		if (!err)
			err = upcie_vfio_dmabuf_export(&dev, io->bar.bar, 0,
						       (uint64_t)sysconf(_SC_PAGESIZE), &fd);
		if (err) {
			probe_say("  vfio BAR dma-buf: could not make one: %s", probe_err(err));
		} else {
			fds[n] = fd;
			names[n++] = "vfio BAR dma-buf";
		}
	} else {
		probe_say("  vfio BAR dma-buf: no vfio device here to export one");
	}
	err = probe_udmabuf(2 * PROBE_MiB, &fd);
	if (err) {
		probe_say("  udmabuf: could not make one: %s", probe_err(err));
	} else {
		fds[n] = fd;
		names[n++] = "udmabuf";
	}
	return n;
}

/* Tell a server what came of it (map_bytes 0: no DMA mapping made) and let go of everything. */
static inline void probe_iomem_close(struct probe_iomem *io)
{
	if (io->sock >= 0) {
		struct probe_deleg_note note;
		char c;

		memset(&note, 0, sizeof(note));
		note.magic = PROBE_DELEG_MAGIC;
		if (write(io->sock, &note, sizeof(note)) == (ssize_t)sizeof(note))
			while (read(io->sock, &c, 1) > 0)
				;
		close(io->sock);
	}
	io->sock = -1;
	probe_bar_close(&io->bar);
}

#endif /* UPCIE_TOOLS_PROBE_IOMEM_H */
