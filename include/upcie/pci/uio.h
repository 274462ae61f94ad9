/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A function on uio_pci_generic, held through its /dev/uioN for as long as a driver uses it.
 *
 * uio_pci_generic clears bus mastering when /dev/uioN is released (release() in
 * drivers/uio/uio_pci_generic.c, Linux 6.1 to 7.3). Holding it open is what makes the kernel stop
 * the device's DMA when the process dies for any reason (a crash, SIGKILL, the OOM killer): a
 * driver that only maps BAR0 through sysfs leaves an enabled controller with bus mastering on,
 * its queues pointing at memory that goes back to the system.
 *
 * At exit the kernel releases a process's files highest descriptor first: close_files() walks
 * the table upwards, each last fput() queues the release as task work, and task_work_run() runs
 * that list last in, first out (fs/file.c, fs/file_table.c, kernel/task_work.c, Linux 6.1 to
 * 7.3). The uio descriptor is therefore moved to a high number (from 64 below the soft
 * RLIMIT_NOFILE, at most 65535, down): above the memfds of DMA memory opened after it, so bus
 * mastering is off before their hugepages go back to the pool. Where no high number is free it
 * stays where it is (debug message). The descriptor is also flock()ed: a second process taking
 * the same function gets -EBUSY instead of programming the same queues.
 *
 * Needs: the function bound to uio_pci_generic (upcie_pci_driver_bind()), root for /dev/uioN.
 * The device node directory is /dev, or $UPCIE_DEV_ROOT (tests). Does not: map BARs (pci/bar.h),
 * handle interrupts (the node's read/write are uio's INTx interface), or check that the device can
 * reach physical addresses (upcie_pci_func_iommu() says; nvme/dev.h refuses a translating IOMMU).
 */
#ifndef UPCIE_PCI_UIO_H
#define UPCIE_PCI_UIO_H

#include <upcie/base/feature.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/base/sysfs.h>
#include <upcie/pci/driver.h>
#include <upcie/pci/func.h>

/* Descriptors at most this high are asked for (the kernel sizes its table to the highest). */
#define UPCIE_PCI_UIO_FD_MAX 65535

struct upcie_pci_uio {
	int fd;	   /* /dev/uioN, or -1 (0 in a zeroed struct also means closed) */
	int index; /* N */
};

/* Directory holding the uio device nodes: $UPCIE_DEV_ROOT or "/dev". */
static inline const char *upcie_pci_uio_dev_root_(void)
{
	const char *root = getenv("UPCIE_DEV_ROOT");

	return (root && *root) ? root : "/dev";
}

/* N of the function's uio device (<sysfs>/bus/pci/devices/<bdf>/uio/uioN), or -ENOENT. */
static inline int upcie_pci_uio_index(const struct upcie_pci_bdf *bdf)
{
	char path[PATH_MAX];
	struct dirent *de;
	int idx = -ENOENT;
	DIR *d;
	int err = upcie_pci_func_path(bdf, "uio", path, sizeof(path));

	if (err)
		return err;
	d = opendir(path);
	if (!d)
		return -ENOENT;
	while ((de = readdir(d))) {
		char *end;
		long v;

		if (strncmp(de->d_name, "uio", 3) || !de->d_name[3])
			continue;
		v = strtol(de->d_name + 3, &end, 10);
		if (*end || v < 0 || v > INT_MAX)
			continue;
		idx = (int)v;
		break;
	}
	closedir(d);
	return idx;
}

/* Move fd above the descriptors the process is likely to open later (see the top). */
static inline int upcie_pci_uio_fd_high_(int fd)
{
	struct rlimit rl;
	long top = UPCIE_PCI_UIO_FD_MAX;
	int nfd;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    (long)rl.rlim_cur - 1 < top)
		top = (long)rl.rlim_cur - 1;
	if (top - 64 <= fd)
		return fd;
	nfd = fcntl(fd, F_DUPFD_CLOEXEC, (int)(top - 64));
	if (nfd < 0) {
		UPCIE_DBG("pci: uio descriptor stays at %d: no free descriptor above %ld (%s)", fd,
			  top - 64, strerror(errno));
		return fd;
	}
	close(fd);
	return nfd;
}

/*
 * Open and hold /dev/uioN of `bdf`, which must be bound to uio_pci_generic. Returns 0; -ENXIO
 * (with the fix) when it is unbound or bound to another driver; -ENODEV (no such function);
 * -ENOENT (no uio device for it); -EBUSY when another process holds it; -EACCES (not root); or
 * open's error. Bus mastering is left as it is. `u` is closed (fd -1) on failure.
 */
static inline int upcie_pci_uio_open(const struct upcie_pci_bdf *bdf, struct upcie_pci_uio *u)
{
	char path[PATH_MAX], name[UPCIE_PCI_BDF_STRLEN];
	int fd, idx, err;

	if (!u)
		return UPCIE_FAIL(-EINVAL, "pci: uio open: NULL output");
	u->fd = -1;
	u->index = -1;
	if (!bdf)
		return UPCIE_FAIL(-EINVAL, "pci: uio open: NULL address");
	err = upcie_pci_driver_require(bdf, "uio_pci_generic");
	if (err)
		return err;
	upcie_pci_bdf_format(bdf, name, sizeof(name));
	idx = upcie_pci_uio_index(bdf);
	if (idx < 0)
		return UPCIE_FAIL(idx,
				  "pci: %s is bound to uio_pci_generic but has no uio device in "
				  "sysfs (%s)",
				  name, strerror(-idx));
	err = upcie_path_fmt(path, sizeof(path), "%s/uio%d", upcie_pci_uio_dev_root_(), idx);
	if (err)
		return UPCIE_FAIL(err, "pci: %s: uio device path too long", name);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		return UPCIE_FAIL(err, "pci: %s: open %s: %s%s", name, path, strerror(-err),
				  err == -EACCES ? " (needs root)" : "");
	}
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		err = -errno;
		close(fd);
		if (err == -EWOULDBLOCK)
			return UPCIE_FAIL(-EBUSY,
					  "pci: %s: %s is held by another process driving the "
					  "function",
					  name, path);
		return UPCIE_FAIL(err, "pci: %s: flock %s: %s", name, path, strerror(-err));
	}
	u->fd = upcie_pci_uio_fd_high_(fd);
	u->index = idx;
	return 0;
}

/* Let go of /dev/uioN: the kernel clears bus mastering. Zeroed or closed: no-op. */
static inline void upcie_pci_uio_close(struct upcie_pci_uio *u)
{
	if (u && u->fd > 0)
		close(u->fd);
	if (u) {
		u->fd = -1;
		u->index = -1;
	}
}

#endif /* UPCIE_PCI_UIO_H */
