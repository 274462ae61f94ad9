/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Delegating a device to a second process, and the BAR mappings the probes read through.
 *
 * A BAR source is opened one of three ways: a vfio device through a type1 container and group, a
 * vfio device cdev bound to an iommufd and attached to an IOAS, or a sysfs resource file (root
 * only; for a function that no vfio driver owns, e.g. the GPU of a machine without an IOMMU).
 * The serving process sends the descriptor, and the container or iommufd beside it unless told to
 * withhold it, over SCM_RIGHTS on a named (filesystem) unix socket. The receiving process is
 * started separately and maps the BAR from the descriptor alone, asking the kernel for the
 * region itself. Reads only: one 32-bit load at a register offset (default 0, the low half of an
 * NVMe controller's CAP); nothing here ever stores to a BAR.
 *
 * A receiver may run as another user: probe_as_parse() reads "--as UID[:GID]" (strictly, through
 * tools/opt.h, for every probe that takes it) and probe_as() acts on it by clearing the
 * supplementary groups, changing gid and uid, and executing the program again, so the probe runs
 * as a process that started unprivileged (dumpable, no capabilities) rather than one that
 * dropped privilege on its way, which keeps groups unless cleared and loses the dumpable flag.
 *
 * Needs what the chosen source needs (vfio/type1.h, vfio/cdev.h; root for sysfs). C11 and C++17.
 */
#ifndef UPCIE_TOOLS_PROBE_DELEG_H
#define UPCIE_TOOLS_PROBE_DELEG_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/vfio.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <upcie/base/mmio.h>
#include <upcie/pci/bdf.h>
#include <upcie/pci/func.h>
#include <upcie/vfio/cdev.h>
#include <upcie/vfio/device.h>
#include <upcie/vfio/iommufd.h>
#include <upcie/vfio/type1.h>

#include "opt.h"
#include "probe_common.h"

enum probe_src {
	PROBE_SRC_NONE = 0,
	PROBE_SRC_SYSFS = 1, /* /sys/bus/pci/devices/<bdf>/resourceN */
	PROBE_SRC_TYPE1 = 2, /* vfio device fd from a group in a type1 container */
	PROBE_SRC_CDEV = 3,  /* vfio device cdev bound to an iommufd */
	PROBE_SRC_AUTO = 4,  /* CDEV where the kernel has it, else TYPE1 */
};

static inline const char *probe_src_name(int src)
{
	switch (src) {
	case PROBE_SRC_SYSFS:
		return "sysfs";
	case PROBE_SRC_TYPE1:
		return "type1";
	case PROBE_SRC_CDEV:
		return "iommufd";
	case PROBE_SRC_AUTO:
		return "auto";
	default:
		return "none";
	}
}

static inline int probe_src_parse(const char *s, int *src)
{
	if (!strcmp(s, "sysfs"))
		*src = PROBE_SRC_SYSFS;
	else if (!strcmp(s, "type1"))
		*src = PROBE_SRC_TYPE1;
	else if (!strcmp(s, "iommufd") || !strcmp(s, "cdev"))
		*src = PROBE_SRC_CDEV;
	else if (!strcmp(s, "auto"))
		*src = PROBE_SRC_AUTO;
	else
		return -EINVAL;
	return 0;
}

struct probe_bar {
	int src;      /* enum probe_src */
	int fd;	      /* sysfs resource file or vfio device; -1 */
	int iommu_fd; /* type1 container or iommufd that goes with fd; -1 */
	uint32_t ioas_id;
	uint32_t bar;
	uint64_t size;
	uint64_t map_off; /* where the BAR lies in fd (vfio region offset; 0 for sysfs) */
	void *addr;	  /* mapping of the whole BAR, or NULL */
	char bdf[32];
	int opened; /* the vfio objects below were opened here (else the fds were received) */
	struct upcie_vfio_container container;
	struct upcie_vfio_group group;
	struct upcie_vfio_iommufd ictx;
	struct upcie_vfio_ioas ioas;
	struct upcie_vfio_device dev;
};

static inline void probe_bar_init(struct probe_bar *b)
{
	memset(b, 0, sizeof(*b));
	b->fd = -1;
	b->iommu_fd = -1;
	b->container.fd = -1;
	b->group.fd = -1;
	b->ictx.fd = -1;
	b->ioas.fd = -1;
	b->dev.fd = -1;
}

/* Region info of BAR b->bar through the device fd alone (what a receiver can ask). */
static inline int probe_bar_vfio_region_(struct probe_bar *b)
{
	struct vfio_device_info info;
	struct vfio_region_info reg;

	memset(&info, 0, sizeof(info));
	info.argsz = sizeof(info);
	if (ioctl(b->fd, VFIO_DEVICE_GET_INFO, &info))
		return -errno;
	if (b->bar >= info.num_regions)
		return -ENOENT;
	memset(&reg, 0, sizeof(reg));
	reg.argsz = sizeof(reg);
	reg.index = b->bar;
	if (ioctl(b->fd, VFIO_DEVICE_GET_REGION_INFO, &reg))
		return -errno;
	if (!reg.size)
		return -ENOENT;
	if (!(reg.flags & VFIO_REGION_INFO_FLAG_MMAP))
		return -EOPNOTSUPP;
	b->size = reg.size;
	b->map_off = reg.offset;
	return 0;
}

/*
 * Open BAR `bar` of `bdf` from `src` (AUTO picks the cdev where /dev/iommu and the function's
 * vfio-dev entry exist, type1 otherwise). Returns 0 or -errno; upcie's messages say why.
 */
static inline int probe_bar_open(struct probe_bar *b, const char *bdf, int src, uint32_t bar)
{
	struct upcie_pci_bdf addr;
	char path[PATH_MAX], attr[32];
	struct stat st;
	int err, id;

	probe_bar_init(b);
	snprintf(b->bdf, sizeof(b->bdf), "%s", bdf);
	b->bar = bar;
	err = upcie_pci_bdf_parse(bdf, &addr);
	if (err)
		return err;
	if (src == PROBE_SRC_AUTO) {
		err = upcie_pci_func_path(&addr, "vfio-dev", path, sizeof(path));
		src = !err && !access("/dev/iommu", F_OK) && !access(path, F_OK) ? PROBE_SRC_CDEV
										 : PROBE_SRC_TYPE1;
	}
	b->src = src;
	switch (src) {
	case PROBE_SRC_SYSFS:
		snprintf(attr, sizeof(attr), "resource%u", bar);
		err = upcie_pci_func_path(&addr, attr, path, sizeof(path));
		if (err)
			return err;
		b->fd = open(path, O_RDWR | O_CLOEXEC | O_SYNC);
		if (b->fd < 0)
			return -errno;
		if (fstat(b->fd, &st))
			return -errno;
		b->size = (uint64_t)st.st_size;
		return b->size ? 0 : -ENOENT;
	case PROBE_SRC_TYPE1:
		b->opened = 1;
		err = upcie_vfio_container_open(&b->container);
		if (err)
			return err;
		id = upcie_vfio_group_id(&addr);
		if (id < 0)
			return id;
		err = upcie_vfio_group_open(&b->group, &b->container, id);
		if (err)
			return err;
		err = upcie_vfio_device_open(&b->dev, &b->group, &addr);
		if (err)
			return err;
		b->fd = b->dev.fd;
		b->iommu_fd = b->container.fd;
		return probe_bar_vfio_region_(b);
	case PROBE_SRC_CDEV:
		b->opened = 1;
		err = upcie_vfio_iommufd_open(&b->ictx);
		if (err)
			return err;
		err = upcie_vfio_ioas_alloc(&b->ioas, &b->ictx);
		if (err)
			return err;
		err = upcie_vfio_cdev_open(&b->dev, &b->ictx, &addr);
		if (err)
			return err;
		err = upcie_vfio_cdev_attach(&b->dev, &b->ioas);
		if (err)
			return err;
		b->fd = b->dev.fd;
		b->iommu_fd = b->ictx.fd;
		b->ioas_id = b->ioas.id;
		return probe_bar_vfio_region_(b);
	default:
		return -EINVAL;
	}
}

/*
 * A struct upcie_vfio_device over the BAR's vfio descriptor (opened here or received), so that
 * vfio/ calls such as the BAR dma-buf export work on it. The descriptor stays b's.
 */
static inline int probe_bar_vfio_dev(const struct probe_bar *b, struct upcie_vfio_device *dev)
{
	struct vfio_device_info info;

	memset(dev, 0, sizeof(*dev));
	dev->fd = -1;
	if (b->src != PROBE_SRC_TYPE1 && b->src != PROBE_SRC_CDEV)
		return -EOPNOTSUPP;
	memset(&info, 0, sizeof(info));
	info.argsz = sizeof(info);
	if (ioctl(b->fd, VFIO_DEVICE_GET_INFO, &info))
		return -errno;
	dev->fd = b->fd;
	dev->flags = info.flags;
	dev->num_regions = info.num_regions;
	dev->num_irqs = info.num_irqs;
	if (!upcie_pci_bdf_parse(b->bdf, &dev->bdf))
		upcie_pci_bdf_format(&dev->bdf, dev->name, sizeof(dev->name));
	return 0;
}

/* Map the whole BAR shared, readable and writable (as a doorbell user would); only read here. */
static inline int probe_bar_map(struct probe_bar *b)
{
	void *a;

	if (b->fd < 0 || !b->size)
		return -EINVAL;
	a = mmap(NULL, (size_t)b->size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd,
		 (off_t)b->map_off);
	if (a == MAP_FAILED)
		return -errno;
	b->addr = a;
	return 0;
}

/* One 32-bit load at `off` of the mapped BAR. */
static inline int probe_bar_read32(const struct probe_bar *b, uint64_t off, uint32_t *val)
{
	if (!b->addr || off % 4 || off + 4 > b->size)
		return -EINVAL;
	*val = upcie_mmio_read32(b->addr, (size_t)off);
	return 0;
}

static inline void probe_bar_close(struct probe_bar *b)
{
	if (b->addr)
		munmap(b->addr, (size_t)b->size);
	b->addr = NULL;
	if (b->opened) {
		upcie_vfio_device_close(&b->dev);
		upcie_vfio_group_close(&b->group);
		upcie_vfio_container_close(&b->container);
		upcie_vfio_iommufd_close(&b->ictx);
	} else {
		if (b->fd >= 0)
			close(b->fd);
		if (b->iommu_fd >= 0)
			close(b->iommu_fd);
	}
	b->fd = b->iommu_fd = -1;
	b->opened = 0;
}

/* --- the delegation protocol ---------------------------------------------------------------- */

#define PROBE_DELEG_MAGIC 0x75704432u /* "upD2" */

/* Server to receiver, with nfds descriptors: [0] the device (or resource file), [1] its
 * container or iommufd when not withheld. */
struct probe_deleg_msg {
	uint32_t magic;
	uint32_t src; /* enum probe_src */
	uint32_t nfds;
	uint32_t bar;
	uint32_t ioas_id; /* PROBE_SRC_CDEV: the IOAS the device is attached to */
	uint32_t reg_off;
	uint32_t reg_val; /* the server's own read of the register */
	int32_t reg_err;  /* 0, or why the server could not read it */
	int32_t pid;	  /* the server's pid */
	uint32_t reserved;
	uint64_t bar_size;
	uint64_t map_off;
	char bdf[32];
};

/* Receiver to server, once it has done what it came for: what its DMA mapping answered. */
struct probe_deleg_note {
	uint32_t magic;
	int32_t map_err;
	uint64_t map_bytes;
};

/* Listen on a fresh socket at `path`, reachable by every user (the receiver may be unprivileged). */
static inline int probe_unix_listen(const char *path, int *lfd)
{
	struct sockaddr_un sa;
	int fd, err;

	*lfd = -1;
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, path, strlen(path));
	unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || chmod(path, 0666) || listen(fd, 1)) {
		err = -errno;
		close(fd);
		return err;
	}
	*lfd = fd;
	return 0;
}

static inline int probe_poll_in_(int fd, int timeout_ms)
{
	struct pollfd p;
	int n;

	p.fd = fd;
	p.events = POLLIN;
	p.revents = 0;
	do
		n = poll(&p, 1, timeout_ms);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return n ? 0 : -ETIMEDOUT;
}

static inline int probe_unix_accept(int lfd, int timeout_ms, int *cfd)
{
	int err = probe_poll_in_(lfd, timeout_ms);

	*cfd = -1;
	if (err)
		return err;
	*cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	return *cfd < 0 ? -errno : 0;
}

/* Connect to `path`, retrying while the server is not listening yet. */
static inline int probe_unix_connect(const char *path, int timeout_ms, int *out)
{
	struct sockaddr_un sa;
	int waited = 0, err;

	*out = -1;
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, path, strlen(path));
	for (;;) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (fd < 0)
			return -errno;
		if (!connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
			*out = fd;
			return 0;
		}
		err = -errno;
		close(fd);
		if ((err != -ENOENT && err != -ECONNREFUSED) || waited >= timeout_ms)
			return err;
		usleep(50 * 1000);
		waited += 50;
	}
}

/* uid and pid of the process at the other end of a connected unix socket. */
static inline int probe_peer(int sock, unsigned *uid, int *pid)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);

	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &len))
		return -errno;
	*uid = (unsigned)cr.uid;
	*pid = (int)cr.pid;
	return 0;
}

static inline int probe_deleg_send(int sock, const struct probe_deleg_msg *m, const int *fds,
				   int nfds)
{
	union {
		struct cmsghdr align;
		char b[CMSG_SPACE(2 * sizeof(int))];
	} ctl;
	struct msghdr mh;
	struct iovec iov;
	struct cmsghdr *c;

	if (nfds < 0 || nfds > 2)
		return -EINVAL;
	memset(&mh, 0, sizeof(mh));
	memset(&ctl, 0, sizeof(ctl));
	iov.iov_base = (void *)m;
	iov.iov_len = sizeof(*m);
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	if (nfds) {
		mh.msg_control = ctl.b;
		mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
		memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
	}
	if (sendmsg(sock, &mh, MSG_NOSIGNAL) != (ssize_t)sizeof(*m))
		return errno ? -errno : -EIO;
	return 0;
}

static inline int probe_deleg_recv(int sock, struct probe_deleg_msg *m, int *fds, int *nfds)
{
	union {
		struct cmsghdr align;
		char b[CMSG_SPACE(2 * sizeof(int))];
	} ctl;
	struct msghdr mh;
	struct iovec iov;
	struct cmsghdr *c;
	ssize_t n;

	*nfds = 0;
	memset(&mh, 0, sizeof(mh));
	iov.iov_base = m;
	iov.iov_len = sizeof(*m);
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = ctl.b;
	mh.msg_controllen = sizeof(ctl.b);
	n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
	if (n < 0)
		return -errno;
	for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		size_t k;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		if (k > 2)
			k = 2;
		memcpy(fds, CMSG_DATA(c), k * sizeof(int));
		*nfds = (int)k;
	}
	if (n != (ssize_t)sizeof(*m) || m->magic != PROBE_DELEG_MAGIC)
		return -EPROTO;
	if (mh.msg_flags & MSG_CTRUNC)
		return -EMSGSIZE;
	return 0;
}

/* Fill a BAR source from a received message and descriptors (the caller then maps it). */
static inline int probe_bar_from_msg(struct probe_bar *b, const struct probe_deleg_msg *m,
				     const int *fds, int nfds)
{
	probe_bar_init(b);
	if (nfds < 1)
		return -EBADF;
	b->src = (int)m->src;
	b->fd = fds[0];
	b->iommu_fd = nfds > 1 ? fds[1] : -1;
	b->bar = m->bar;
	b->ioas_id = m->ioas_id;
	snprintf(b->bdf, sizeof(b->bdf), "%.31s", m->bdf);
	if (b->src == PROBE_SRC_SYSFS) {
		struct stat st;

		/* a sysfs resource file knows its size; the server's word is the fallback */
		b->size = !fstat(b->fd, &st) && st.st_size ? (uint64_t)st.st_size : m->bar_size;
		return 0;
	}
	return probe_bar_vfio_region_(b);
}

/*
 * Receive a BAR source from the server at `path`: connect, receive, ask the kernel for the region
 * through the received descriptor, map it. *sock stays connected (the server waits for a note
 * before it exits). Reports each step.
 */
static inline int probe_bar_receive(struct probe_bar *b, const char *path, int *sock,
				    struct probe_deleg_msg *m)
{
	int fds[2] = { -1, -1 }, nfds = 0, err;
	unsigned puid = 0;
	int ppid = 0;

	probe_bar_init(b);
	err = probe_unix_connect(path, 20000, sock);
	if (err) {
		probe_say("receive: connect %s: %s", path, probe_err(err));
		return err;
	}
	probe_peer(*sock, &puid, &ppid);
	err = probe_deleg_recv(*sock, m, fds, &nfds);
	if (err) {
		probe_say("receive: from pid %d: %s", ppid, probe_err(err));
		return err;
	}
	probe_say("receive: from pid %d (uid %u): %s source %s BAR%u, %d descriptor(s)", ppid, puid,
		  probe_src_name((int)m->src), m->bdf, m->bar, nfds);
	if (m->reg_err)
		probe_say("receive: the server could not read +0x%x itself: %s", m->reg_off,
			  probe_err(m->reg_err));
	else
		probe_say("receive: the server read 0x%08x at +0x%x", m->reg_val, m->reg_off);
	err = probe_bar_from_msg(b, m, fds, nfds);
	if (err) {
		probe_say("receive: region info through the received descriptor: %s",
			  probe_err(err));
		return err;
	}
	probe_say("receive: the descriptor alone gives BAR%u: %s at offset 0x%" PRIx64, b->bar,
		  probe_size(b->size), b->map_off);
	err = probe_bar_map(b);
	probe_say("receive: mmap of BAR%u: %s", b->bar, err ? probe_err(err) : "ok");
	return err;
}

/* Wait until process `pid` has exited (gone or a zombie: its descriptors are closed either way). */
static inline int probe_wait_exit(int pid, int timeout_ms)
{
	char path[64], buf[256];
	int waited = 0;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	for (;;) {
		FILE *f = fopen(path, "re");
		char *p;

		if (!f)
			return 0;
		p = fgets(buf, sizeof(buf), f);
		fclose(f);
		if (!p)
			return 0;
		p = strrchr(buf, ')');
		if (p && (p[2] == 'Z' || p[2] == 'X'))
			return 0;
		if (waited >= timeout_ms)
			return -ETIMEDOUT;
		usleep(20 * 1000);
		waited += 20;
	}
}

/*
 * The value of "--as UID[:GID]": numbers, decimal or 0x hex each (tools/opt.h), each at most
 * 2^32 - 2 (2^32 - 1 is the kernel's "leave unchanged"); GID defaults to UID. 0 or -EINVAL.
 */
static inline int probe_as_ids(const char *v, uint64_t *uid, uint64_t *gid)
{
	char buf[64], *colon;

	if (strlen(v) >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, v, strlen(v) + 1);
	colon = strchr(buf, ':');
	if (colon)
		*colon++ = '\0';
	if (opt_u64_range(buf, 0, UINT32_MAX - 1, uid))
		return -EINVAL;
	*gid = *uid;
	if (colon && opt_u64_range(colon, 0, UINT32_MAX - 1, gid))
		return -EINVAL;
	return 0;
}

/* "UID[:GID]" as probe_as_ids() reads it, into the canonical "UID:GID" probe_as() is given. */
static inline int probe_as_parse(const char *v, char *out, size_t len)
{
	uint64_t uid, gid;

	if (probe_as_ids(v, &uid, &gid))
		return -EINVAL;
	snprintf(out, len, "%" PRIu64 ":%" PRIu64, uid, gid);
	return 0;
}

/*
 * "--as UID[:GID]" anywhere in argv: become that user and run this program again without the
 * option. Returns 0 when the option is absent, -errno when the change failed (it does not return
 * when it succeeded). The caller reports and exits PROBE_EXIT_CANNOT on failure.
 */
static inline int probe_as(int argc, char **argv)
{
	uint64_t uid, gid;
	int i;

	for (i = 1; i < argc - 1; i++)
		if (!strcmp(argv[i], "--as"))
			break;
	if (i >= argc - 1)
		return 0;
	if (probe_as_ids(argv[i + 1], &uid, &gid))
		return -EINVAL;
	memmove(&argv[i], &argv[i + 2], (size_t)(argc - i - 1) * sizeof(*argv));
	if (setgroups(0, NULL) || setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) ||
	    setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid))
		return -errno;
	execv("/proc/self/exe", argv);
	return -errno;
}

/*
 * Run this program again as the user `as` (canonical, from probe_as_parse()): argv[0..argc) is
 * what was understood, without --as, with room for three more entries (--as, `as`, NULL). Does not
 * return when that works; otherwise reports why and returns PROBE_EXIT_CANNOT.
 */
static inline int probe_as_rerun(int argc, char **argv, char *as)
{
	int err;

	argv[argc++] = (char *)"--as";
	argv[argc++] = as;
	argv[argc] = NULL;
	err = probe_as(argc, argv);
	fprintf(stderr, "%s: --as %s: %s\n", opt_tool, as, probe_err(err));
	return PROBE_EXIT_CANNOT;
}

#endif /* UPCIE_TOOLS_PROBE_DELEG_H */
