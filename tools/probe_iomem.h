/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the IOMEMORY registration probes (probe_iomem_cuda.cu, probe_iomem_hip.hip) share: their
 * options and usage text, where the BAR mapping comes from, the host's read of the register
 * beside which the device's read is printed, and the dma-bufs other than the runtime's own that
 * an import can be tried with.
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
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <upcie/pci/bdf.h>
#include <upcie/vfio/dmabuf.h>

#include "opt.h"
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

/* The usage text; `rt` is the runtime ("CUDA", "HIP"), opt_tool the probe. */
static inline void probe_iomem_usage(FILE *f, const char *rt)
{
	int pad = (int)strlen("usage: ") + (int)strlen(opt_tool) + 1;

	fprintf(
	    f,
	    "usage: %s (--vfio BDF | --sysfs BDF | --receive SOCKET | --none)\n"
	    "%*s[--bar N] [--offset OFF] [--device ORDINAL] [--self-read]\n"
	    "%*s[--as UID[:GID]]\n"
	    "  --vfio BDF        the BAR of a function bound to vfio-pci (iommufd, else type1)\n"
	    "  --sysfs BDF       the BAR through its sysfs resource file (root)\n"
	    "  --receive SOCKET  the BAR handed over by probe_vfio_delegate serve\n"
	    "  --none            no BAR: only the registration of ordinary memory and the imports\n"
	    "  --bar N           with --vfio or --sysfs: the BAR, 0..5 (default 0)\n"
	    "  --offset OFF      the register read, a multiple of 4 (default 0)\n"
	    "  --device ORDINAL  the %s device to ask, 0..255 (default 0)\n"
	    "  --self-read       read the BAR even when it is the GPU's own (PCIe loopback)\n"
	    "  --as UID[:GID]    run as this user (GID default: the UID's number)\n"
	    "  -h, --help        this text; --version the version\n"
	    "Reads only, never writes a register. Exits 0; 2 for usage errors, 1 when there is\n"
	    "no %s device to ask.\n",
	    opt_tool, pad, "", pad, "", rt, rt);
}

enum {
	PROBE_IOMEM_O_VFIO = 256,
	PROBE_IOMEM_O_SYSFS,
	PROBE_IOMEM_O_RECEIVE,
	PROBE_IOMEM_O_NONE,
	PROBE_IOMEM_O_BAR,
	PROBE_IOMEM_O_OFFSET,
	PROBE_IOMEM_O_DEVICE,
	PROBE_IOMEM_O_SELF_READ,
	PROBE_IOMEM_O_AS,
	PROBE_IOMEM_O_VERSION,
};

/*
 * The options into *o (tools/opt.h; opt_tool names the probe, `rt` its runtime, "CUDA" or
 * "HIP"); 0 to go on, else the exit status (0 after --help or --version, set in *done). With --as,
 * the probe runs itself again as that user with what was understood (probe_as() in
 * probe_deleg.h) and does not come back unless that fails.
 */
static inline int probe_iomem_parse(int argc, char **argv, const char *rt,
				    struct probe_iomem_opts *o, bool *done)
{
	static const struct option long_opts[] = {
		{ "vfio", required_argument, NULL, PROBE_IOMEM_O_VFIO },
		{ "sysfs", required_argument, NULL, PROBE_IOMEM_O_SYSFS },
		{ "receive", required_argument, NULL, PROBE_IOMEM_O_RECEIVE },
		{ "none", no_argument, NULL, PROBE_IOMEM_O_NONE },
		{ "bar", required_argument, NULL, PROBE_IOMEM_O_BAR },
		{ "offset", required_argument, NULL, PROBE_IOMEM_O_OFFSET },
		{ "device", required_argument, NULL, PROBE_IOMEM_O_DEVICE },
		{ "self-read", no_argument, NULL, PROBE_IOMEM_O_SELF_READ },
		{ "as", required_argument, NULL, PROBE_IOMEM_O_AS },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, PROBE_IOMEM_O_VERSION },
		{ NULL, 0, NULL, 0 },
	};
	const char *src_opt = NULL, *bar_s = NULL, *off_s = NULL, *dev_s = NULL;
	struct upcie_pci_bdf addr;
	char as[32] = "", want[48];
	uint64_t v;
	int c;

	*done = false;
	memset(o, 0, sizeof(*o));
	o->src = -1;
	argv[0] = (char *)opt_tool; /* getopt's own messages name the probe */
	while ((c = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
		switch (c) {
		case PROBE_IOMEM_O_VFIO:
		case PROBE_IOMEM_O_SYSFS:
		case PROBE_IOMEM_O_RECEIVE:
		case PROBE_IOMEM_O_NONE:
			if (src_opt)
				return opt_usage_error("one BAR source: --vfio, --sysfs, --receive "
						       "or --none, once");
			src_opt = c == PROBE_IOMEM_O_VFIO      ? "--vfio"
				  : c == PROBE_IOMEM_O_SYSFS   ? "--sysfs"
				  : c == PROBE_IOMEM_O_RECEIVE ? "--receive"
							       : "--none";
			if (c == PROBE_IOMEM_O_NONE) {
				o->src = PROBE_SRC_NONE;
				break;
			}
			if (c == PROBE_IOMEM_O_RECEIVE) {
				if (!*optarg || strlen(optarg) >= 108)
					return opt_bad("--receive", optarg,
						       "a unix socket path, at most 107 bytes");
				o->receive = 1;
			} else if (upcie_pci_bdf_parse_quiet_(optarg, &addr)) {
				return opt_bad(src_opt, optarg,
					       "a PCI address DDDD:BB:DD.F or BB:DD.F");
			}
			o->src = c == PROBE_IOMEM_O_SYSFS ? PROBE_SRC_SYSFS : PROBE_SRC_AUTO;
			o->target = optarg;
			break;
		case PROBE_IOMEM_O_BAR:
			if (opt_u64_range(optarg, 0, 5, &v))
				return opt_bad("--bar", optarg, "a BAR index 0..5");
			o->bar = (uint32_t)v;
			bar_s = optarg;
			break;
		case PROBE_IOMEM_O_OFFSET:
			if (opt_size(optarg, &v) || v % 4 || v > UINT32_MAX - 3)
				return opt_bad("--offset", optarg,
					       "a register offset below 4 GiB, a multiple of 4");
			o->off = (uint32_t)v;
			off_s = optarg;
			break;
		case PROBE_IOMEM_O_DEVICE:
			if (opt_u64_range(optarg, 0, 255, &v)) {
				snprintf(want, sizeof(want), "a %s device ordinal 0..255", rt);
				return opt_bad("--device", optarg, want);
			}
			o->ordinal = (int)v;
			dev_s = optarg;
			break;
		case PROBE_IOMEM_O_SELF_READ:
			o->self_read = 1;
			break;
		case PROBE_IOMEM_O_AS:
			if (probe_as_parse(optarg, as, sizeof(as)))
				return opt_bad("--as", optarg, "UID or UID:GID, numbers");
			break;
		case 'h':
			probe_iomem_usage(stdout, rt);
			*done = true;
			return PROBE_EXIT_OK;
		case PROBE_IOMEM_O_VERSION:
			*done = true;
			return opt_version();
		default:
			return opt_unknown();
		}
	}
	if (optind < argc)
		return opt_bad("argument", argv[optind], "options only (see --help)");
	if (!src_opt)
		return opt_usage_error("the BAR source is missing: --vfio BDF, --sysfs BDF, "
				       "--receive SOCKET or --none");
	if (bar_s && (o->receive || o->src == PROBE_SRC_NONE))
		return opt_usage_error("--bar goes with --vfio or --sysfs");
	if (as[0]) {
		/* run again as that user, with what was understood and without --as */
		char *rerun[16];
		int n = 0;

		rerun[n++] = argv[0];
		rerun[n++] = (char *)src_opt;
		if (o->target)
			rerun[n++] = (char *)o->target;
		if (bar_s) {
			rerun[n++] = (char *)"--bar";
			rerun[n++] = (char *)bar_s;
		}
		if (off_s) {
			rerun[n++] = (char *)"--offset";
			rerun[n++] = (char *)off_s;
		}
		if (dev_s) {
			rerun[n++] = (char *)"--device";
			rerun[n++] = (char *)dev_s;
		}
		if (o->self_read)
			rerun[n++] = (char *)"--self-read";
		return probe_as_rerun(n, rerun, as);
	}
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
