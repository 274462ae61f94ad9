/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * probe_vfio_delegate: what a second process can do with a vfio device it was handed.
 *
 * Two processes, started separately: "serve" opens the device (type1 group or iommufd cdev) and
 * passes the device descriptor, and beside it the container or iommufd unless --withhold, over
 * SCM_RIGHTS on a named unix socket; "receive" connects, maps the BAR from the descriptor alone
 * and reads one register (offset 0 by default: an NVMe controller's CAP), then maps a buffer of
 * its own for DMA through the received container or IOAS. Three questions:
 *  - can the receiver map the BAR and read it, as root and as an unprivileged process;
 *  - which side is charged for the pages pinned by the receiver's mapping: run it with
 *    RLIMIT_MEMLOCK lowered on one side (--memlock), then the other, and compare; both sides also
 *    print VmLck and VmPin around it;
 *  - what the receiver still holds once the server has exited: the device, the BAR mapping, the
 *    earlier DMA mapping, new mappings.
 * "serve --source sysfs" hands out a sysfs resource file instead, for machines without vfio
 * (probe_iomem_cuda receives either kind). Reads only; never writes a BAR.
 *
 * Usage:
 *   probe_vfio_delegate serve SOCKET BDF [--source auto|type1|iommufd|sysfs] [--bar N]
 *                       [--offset OFF] [--memlock BYTES] [--withhold]
 *   probe_vfio_delegate receive SOCKET [--memlock BYTES] [--map BYTES] [--as UID[:GID]]
 * (also -h/--help, --version; tools/opt.h parses: --opt=value, sizes as 4k/1MiB/0x1000).
 * Prints findings and exits 0; 2 for usage errors (with a message naming the argument), 1 when
 * it could not run at all.
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <linux/vfio.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/un.h>
#include <unistd.h>

#include <upcie/base/bits.h>
#include <upcie/pci/bdf.h>
#include <upcie/vfio/iommufd.h>
#include <upcie/vfio/type1.h>

#include "opt.h"
#include "probe_common.h"
#include "probe_deleg.h"

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: probe_vfio_delegate serve SOCKET BDF [--source auto|type1|iommufd|sysfs]\n"
	    "                           [--bar N] [--offset OFF] [--memlock BYTES] [--withhold]\n"
	    "       probe_vfio_delegate receive SOCKET [--memlock BYTES] [--map BYTES]\n"
	    "                           [--as UID[:GID]]\n"
	    "  --source S       serve: how the device is opened (default auto)\n"
	    "  --bar N          serve: the BAR, 0..5 (default 0)\n"
	    "  --offset OFF     serve: the register read, a multiple of 4 (default 0)\n"
	    "  --withhold       serve: hand over the device without its container or iommufd\n"
	    "  --memlock BYTES  lower RLIMIT_MEMLOCK on this side first (4k, 1M, 0x1000)\n"
	    "  --map BYTES      receive: the DMA mapping, a multiple of 4 KiB (default 4M)\n"
	    "  --as UID[:GID]   receive: run as this user (GID default: the UID's number)\n"
	    "  -h, --help       this text; --version the version\n");
}

static void lower_memlock(const char *who, uint64_t bytes)
{
	int err = probe_memlock_set(bytes);

	probe_say("%s: RLIMIT_MEMLOCK lowered to %s: %s", who, probe_size(bytes),
		  err ? probe_err(err) : "ok");
}

static int serve(const char *path, const char *bdf, int src, uint32_t bar, uint32_t off,
		 int64_t memlock, int withhold)
{
	struct probe_deleg_msg m;
	struct probe_deleg_note note;
	struct probe_bar b;
	int lfd = -1, cfd = -1, fds[2], nfds, err;
	unsigned puid = 0;
	int ppid = 0;
	ssize_t n;

	probe_begin("probe_vfio_delegate serve",
		    "hand a vfio device to a separately started process over SCM_RIGHTS");
	if (memlock >= 0)
		lower_memlock("server", (uint64_t)memlock);
	probe_self("server");
	err = probe_bar_open(&b, bdf, src, bar);
	probe_say("server: open %s through %s, BAR%u: %s", bdf, probe_src_name(b.src), bar,
		  err ? probe_err(err) : "ok");
	if (err) {
		probe_bar_close(&b);
		return PROBE_EXIT_CANNOT;
	}
	memset(&m, 0, sizeof(m));
	m.magic = PROBE_DELEG_MAGIC;
	m.src = (uint32_t)b.src;
	m.bar = bar;
	m.ioas_id = b.ioas_id;
	m.reg_off = off;
	m.pid = (int32_t)getpid();
	m.bar_size = b.size;
	m.map_off = b.map_off;
	snprintf(m.bdf, sizeof(m.bdf), "%s", bdf);
	err = probe_bar_map(&b);
	if (!err)
		err = probe_bar_read32(&b, off, &m.reg_val);
	m.reg_err = err;
	if (err)
		probe_say("server: BAR%u is %s; read at +0x%x: %s", bar, probe_size(b.size), off,
			  probe_err(err));
	else
		probe_say("server: BAR%u is %s; read at +0x%x: 0x%08x", bar, probe_size(b.size),
			  off, m.reg_val);
	err = probe_unix_listen(path, &lfd);
	if (err) {
		probe_say("server: listen on %s: %s", path, probe_err(err));
		probe_bar_close(&b);
		return PROBE_EXIT_CANNOT;
	}
	probe_say("server: listening on %s", path);
	err = probe_unix_accept(lfd, 60000, &cfd);
	if (err) {
		probe_say("server: no receiver came: %s", probe_err(err));
		goto out;
	}
	probe_peer(cfd, &puid, &ppid);
	fds[0] = b.fd;
	fds[1] = b.iommu_fd;
	nfds = (withhold || b.iommu_fd < 0) ? 1 : 2;
	m.nfds = (uint32_t)nfds;
	err = probe_deleg_send(cfd, &m, fds, nfds);
	probe_say("server: sent the device%s to pid %d (uid %u): %s",
		  nfds == 2 ? (b.src == PROBE_SRC_CDEV ? " and the iommufd" : " and the container")
			    : " alone",
		  ppid, puid, err ? probe_err(err) : "ok");
	if (err)
		goto out;
	n = read(cfd, &note, sizeof(note));
	if (n == (ssize_t)sizeof(note) && note.magic == PROBE_DELEG_MAGIC && !note.map_bytes)
		probe_say("server: the receiver made no DMA mapping (nothing came to map through)");
	else if (n == (ssize_t)sizeof(note) && note.magic == PROBE_DELEG_MAGIC)
		probe_say("server: the receiver's DMA mapping of %s answered %s",
			  probe_size(note.map_bytes),
			  note.map_err ? probe_err(note.map_err) : "ok");
	else
		probe_say("server: the receiver sent no note (%zd bytes)", n);
	/* whose VmLck/VmPin moved: compare with the receiver's lines */
	probe_self("server");
	probe_say("server: exiting; the receiver keeps what it was given");
out:
	if (cfd >= 0)
		close(cfd);
	close(lfd);
	unlink(path);
	probe_bar_close(&b);
	return PROBE_EXIT_OK;
}

/* An IOVA for `len` bytes inside the container's ranges, away from 0 and 2 MiB aligned. */
static uint64_t type1_iova(struct upcie_vfio_container *c, uint64_t len)
{
	struct upcie_vfio_type1_info info;

	if (upcie_vfio_container_info(c, &info) || !info.have_ranges)
		return UINT64_C(0x100000000);
	for (uint32_t i = 0; i < info.ranges.n; i++) {
		uint64_t s = upcie_align_up(
		    info.ranges.r[i].start < PROBE_GiB ? PROBE_GiB : info.ranges.r[i].start,
		    2 * PROBE_MiB);

		if (s <= info.ranges.r[i].last && info.ranges.r[i].last - s >= len - 1)
			return s;
	}
	return UINT64_C(0x100000000);
}

/* The receiver's DMA mapping through what it received: type1 MAP_DMA or IOAS map. */
struct dma_map {
	void *buf;
	uint64_t len;
	uint64_t iova;
	int mapped;
};

static int dma_map(struct probe_bar *b, struct dma_map *d, uint64_t len)
{
	struct upcie_vfio_container c;
	struct upcie_vfio_ioas ioas;
	int err;

	memset(d, 0, sizeof(*d));
	d->len = len;
	if (b->iommu_fd < 0)
		return -EBADF;
	d->buf = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (d->buf == MAP_FAILED) {
		d->buf = NULL;
		return -errno;
	}
	memset(d->buf, 0x5a, (size_t)len);
	if (b->src == PROBE_SRC_TYPE1) {
		struct vfio_iommu_type1_dma_map map;

		memset(&c, 0, sizeof(c));
		c.fd = b->iommu_fd;
		c.iommu_set = 1;
		d->iova = type1_iova(&c, len);
		memset(&map, 0, sizeof(map));
		map.argsz = sizeof(map);
		map.flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE;
		map.vaddr = (uintptr_t)d->buf;
		map.size = len;
		map.iova = d->iova;
		err = ioctl(b->iommu_fd, VFIO_IOMMU_MAP_DMA, &map) ? -errno : 0;
	} else {
		ioas.fd = b->iommu_fd;
		ioas.id = b->ioas_id;
		err = upcie_vfio_ioas_map(&ioas, d->buf, len, 0, &d->iova);
	}
	d->mapped = !err;
	return err;
}

/* Unmap; returns the bytes the kernel says it unmapped, or -errno. */
static int64_t dma_unmap(struct probe_bar *b, struct dma_map *d)
{
	int64_t ret;

	if (b->src == PROBE_SRC_TYPE1) {
		struct vfio_iommu_type1_dma_unmap u;

		memset(&u, 0, sizeof(u));
		u.argsz = sizeof(u);
		u.iova = d->iova;
		u.size = d->len;
		ret = ioctl(b->iommu_fd, VFIO_IOMMU_UNMAP_DMA, &u) ? -errno : (int64_t)u.size;
	} else {
		struct upcie_iommu_ioas_unmap u;

		memset(&u, 0, sizeof(u));
		u.size = sizeof(u);
		u.ioas_id = b->ioas_id;
		u.iova = d->iova;
		u.length = d->len;
		ret = ioctl(b->iommu_fd, UPCIE_IOMMU_IOAS_UNMAP, &u) ? -errno : (int64_t)u.length;
	}
	d->mapped = 0;
	return ret;
}

static void dma_free(struct dma_map *d)
{
	if (d->buf)
		munmap(d->buf, (size_t)d->len);
	d->buf = NULL;
}

static int receive(const char *path, int64_t memlock, uint64_t maplen)
{
	struct probe_deleg_msg m;
	struct probe_deleg_note note;
	struct vfio_device_info info;
	struct dma_map d, d2;
	struct probe_bar b;
	int sock = -1, err, spid;
	uint32_t val = 0;
	int64_t un;
	char c;

	probe_begin("probe_vfio_delegate receive",
		    "what a process handed a vfio device can map, read and pin, and what it keeps");
	probe_self("receiver");
	if (memlock >= 0) {
		lower_memlock("receiver", (uint64_t)memlock);
		probe_self("receiver");
	}
	err = probe_bar_receive(&b, path, &sock, &m);
	if (err) {
		if (sock >= 0)
			close(sock);
		probe_bar_close(&b);
		return sock >= 0 ? PROBE_EXIT_OK : PROBE_EXIT_CANNOT;
	}
	spid = m.pid;
	err = probe_bar_read32(&b, m.reg_off, &val);
	if (err)
		probe_say("receiver: read at +0x%x: %s", m.reg_off, probe_err(err));
	else if (m.reg_err)
		probe_say("receiver: read at +0x%x: 0x%08x (the server could not read it)",
			  m.reg_off, val);
	else
		probe_say("receiver: read at +0x%x: 0x%08x (server read 0x%08x: %s)", m.reg_off,
			  val, m.reg_val, val == m.reg_val ? "same" : "DIFFERENT");

	memset(&d, 0, sizeof(d));
	if (b.iommu_fd < 0) {
		probe_say("receiver: %s: DMA mappings cannot be made from here",
			  b.src == PROBE_SRC_SYSFS
			      ? "a sysfs resource file carries no IOMMU context"
			      : "no container or iommufd came with the device");
		err = 0;
		maplen = 0;
	} else {
		err = dma_map(&b, &d, maplen);
		probe_say("receiver: %s of %s of its own memory%s: %s",
			  b.src == PROBE_SRC_TYPE1 ? "VFIO_IOMMU_MAP_DMA" : "IOMMU_IOAS_MAP",
			  probe_size(maplen),
			  b.src == PROBE_SRC_CDEV ? " into the received IOAS" : "",
			  err ? probe_err(err) : "ok");
		if (!err)
			probe_say("receiver: mapped at IOVA 0x%" PRIx64, d.iova);
	}
	probe_self("receiver");
	memset(&note, 0, sizeof(note));
	note.magic = PROBE_DELEG_MAGIC;
	note.map_err = err;
	note.map_bytes = maplen;
	if (write(sock, &note, sizeof(note)) != (ssize_t)sizeof(note))
		probe_say("receiver: note to the server: %s", probe_err(errno));

	/* the server exits after the note: wait for its end of the socket and for the process */
	while (read(sock, &c, 1) > 0)
		;
	err = probe_wait_exit(spid, 10000);
	probe_say("receiver: server pid %d %s", spid,
		  err ? "still running after 10 s" : "has exited (descriptors closed)");

	memset(&info, 0, sizeof(info));
	info.argsz = sizeof(info);
	err = ioctl(b.fd, VFIO_DEVICE_GET_INFO, &info) ? -errno : 0;
	if (b.src != PROBE_SRC_SYSFS)
		probe_say("after server exit: VFIO_DEVICE_GET_INFO on the device: %s",
			  err ? probe_err(err) : "ok");
	err = probe_bar_read32(&b, m.reg_off, &val);
	if (err)
		probe_say("after server exit: BAR read: %s", probe_err(err));
	else
		probe_say("after server exit: BAR read at +0x%x: 0x%08x (%s)", m.reg_off, val,
			  val == m.reg_val ? "same as the server's" : "DIFFERENT");
	if (b.iommu_fd >= 0) {
		if (d.mapped) {
			un = dma_unmap(&b, &d);
			if (un < 0)
				probe_say("after server exit: unmap of the earlier mapping: %s",
					  probe_err((int)un));
			else
				probe_say("after server exit: unmap of the earlier mapping: %s "
					  "unmapped (it was still there)",
					  probe_size((uint64_t)un));
		}
		err = dma_map(&b, &d2, maplen);
		probe_say("after server exit: a new mapping of %s: %s", probe_size(maplen),
			  err ? probe_err(err) : "ok");
		probe_self("receiver");
		if (!err)
			dma_unmap(&b, &d2);
		dma_free(&d2);
	}
	dma_free(&d);
	close(sock);
	probe_bar_close(&b);
	return PROBE_EXIT_OK;
}

enum {
	DELEG_O_SOURCE = 256,
	DELEG_O_BAR,
	DELEG_O_OFFSET,
	DELEG_O_MEMLOCK,
	DELEG_O_WITHHOLD,
	DELEG_O_MAP,
	DELEG_O_AS,
	DELEG_O_VERSION,
};

static const struct option deleg_long_opts[] = {
	{ "source", required_argument, NULL, DELEG_O_SOURCE },
	{ "bar", required_argument, NULL, DELEG_O_BAR },
	{ "offset", required_argument, NULL, DELEG_O_OFFSET },
	{ "memlock", required_argument, NULL, DELEG_O_MEMLOCK },
	{ "withhold", no_argument, NULL, DELEG_O_WITHHOLD },
	{ "map", required_argument, NULL, DELEG_O_MAP },
	{ "as", required_argument, NULL, DELEG_O_AS },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, DELEG_O_VERSION },
	{ NULL, 0, NULL, 0 },
};

int main(int argc, char **argv)
{
	uint64_t maplen = 4 * PROBE_MiB, v;
	int64_t memlock = -1;
	int src = PROBE_SRC_AUTO, withhold = 0, serving, c;
	uint32_t bar = 0, off = 0;
	const char *mode, *sock, *bdf = NULL, *memlock_s = NULL, *map_s = NULL;
	bool serve_only = false;
	char as[32] = "";
	struct upcie_pci_bdf addr;
	struct sockaddr_un sa;

	opt_tool = "probe_vfio_delegate";
	argv[0] = (char *)opt_tool; /* getopt's own messages name the probe */
	while ((c = getopt_long(argc, argv, "h", deleg_long_opts, NULL)) != -1) {
		switch (c) {
		case DELEG_O_SOURCE:
			if (probe_src_parse(optarg, &src))
				return opt_bad("--source", optarg, "auto, type1, iommufd or sysfs");
			serve_only = true;
			break;
		case DELEG_O_BAR:
			if (opt_u64_range(optarg, 0, 5, &v))
				return opt_bad("--bar", optarg, "a BAR index 0..5");
			bar = (uint32_t)v;
			serve_only = true;
			break;
		case DELEG_O_OFFSET:
			if (opt_size(optarg, &v) || v % 4 || v > UINT32_MAX - 3)
				return opt_bad("--offset", optarg,
					       "a register offset below 4 GiB, a multiple of 4");
			off = (uint32_t)v;
			serve_only = true;
			break;
		case DELEG_O_MEMLOCK:
			if (opt_size(optarg, &v) || v > (uint64_t)INT64_MAX)
				return opt_bad("--memlock", optarg, "a size such as 1M, 64k, 0");
			memlock = (int64_t)v;
			memlock_s = optarg;
			break;
		case DELEG_O_WITHHOLD:
			withhold = 1;
			serve_only = true;
			break;
		case DELEG_O_MAP:
			if (opt_size(optarg, &maplen) || !maplen || maplen % 4096)
				return opt_bad("--map", optarg,
					       "a size, a multiple of 4 KiB, e.g. 4M");
			map_s = optarg;
			break;
		case DELEG_O_AS:
			if (probe_as_parse(optarg, as, sizeof(as)))
				return opt_bad("--as", optarg, "UID or UID:GID, numbers");
			break;
		case 'h':
			usage(stdout);
			return PROBE_EXIT_OK;
		case DELEG_O_VERSION:
			return opt_version();
		default:
			return opt_unknown();
		}
	}
	if (optind == argc)
		return opt_usage_error("serve or receive is missing");
	mode = argv[optind++];
	serving = !strcmp(mode, "serve");
	if (!serving && strcmp(mode, "receive"))
		return opt_bad("command", mode, "serve or receive");
	if (optind == argc)
		return opt_usage_error("SOCKET is missing");
	sock = argv[optind++];
	if (!*sock || strlen(sock) >= sizeof(sa.sun_path))
		return opt_bad("SOCKET", sock, "a unix socket path, at most 107 bytes");
	if (serving) {
		if (optind == argc)
			return opt_usage_error("serve needs SOCKET and BDF");
		bdf = argv[optind++];
		if (upcie_pci_bdf_parse_quiet_(bdf, &addr))
			return opt_bad("BDF", bdf, "a PCI address DDDD:BB:DD.F or BB:DD.F");
		if (map_s || as[0])
			return opt_usage_error("--map and --as go with receive");
	} else if (serve_only) {
		return opt_usage_error("--source, --bar, --offset and --withhold go with serve");
	}
	if (optind < argc)
		return opt_bad("argument", argv[optind],
			       serving ? "serve SOCKET BDF" : "receive SOCKET");

	if (as[0]) {
		/* run again as that user, with what was understood and without --as */
		char *rerun[12];
		int n = 0;

		rerun[n++] = argv[0];
		rerun[n++] = (char *)"receive";
		rerun[n++] = (char *)sock;
		if (memlock_s) {
			rerun[n++] = (char *)"--memlock";
			rerun[n++] = (char *)memlock_s;
		}
		if (map_s) {
			rerun[n++] = (char *)"--map";
			rerun[n++] = (char *)map_s;
		}
		return probe_as_rerun(n, rerun, as);
	}
	if (serving)
		return serve(sock, bdf, src, bar, off, memlock, withhold);
	return receive(sock, memlock, maplen);
}
