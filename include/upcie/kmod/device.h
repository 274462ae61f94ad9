/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Opening the device node of one of upcie's kernel modules (dkms/): the module's ABI is checked
 * with its INFO request, and a missing node is an error that names the package to install.
 * Shared by kmod/dmabuf_import.h and kmod/iommu_map_pa.h.
 *
 * Needs nothing but libc. Does not load modules (that needs root and modprobe).
 */
#ifndef UPCIE_KMOD_DEVICE_H
#define UPCIE_KMOD_DEVICE_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <upcie/base/log.h>

/* Move a descriptor off 0, which a zeroed context means "closed". */
static inline int upcie_kmod_fd_not_zero_(int fd)
{
	int nfd, saved;

	if (fd != 0)
		return fd;
	nfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	saved = errno;
	close(fd);
	errno = saved;
	return nfd;
}

/*
 * Open a kmod device node and check the module's ABI with its INFO request. -ENOENT (missing
 * node: message names `pkg` and `module`), -EPERM/-EACCES (needs CAP_SYS_ADMIN), -EPROTO (not
 * the module, or another ABI).
 */
static inline int upcie_kmod_open_(const char *env, const char *defpath, const char *module,
				   const char *pkg, unsigned long info_req, void *info,
				   const uint32_t *abi, uint32_t want_abi, int *out)
{
	const char *path = getenv(env);
	int fd, err;

	if (!path || !*path)
		path = defpath;
	fd = upcie_kmod_fd_not_zero_(open(path, O_RDWR | O_CLOEXEC));
	if (fd < 0) {
		err = upcie_neg_errno();
		if (err == -ENOENT || err == -ENXIO || err == -ENODEV)
			return UPCIE_FAIL(
			    -ENOENT,
			    "kmod: no %s: the %s kernel module is not loaded; install "
			    "the package %s and run 'modprobe %s'",
			    path, module, pkg, module);
		if (err == -EPERM || err == -EACCES)
			return UPCIE_FAIL(
			    err, "kmod: %s: %s (the module needs CAP_SYS_ADMIN: run as root)", path,
			    upcie_errno_name(err));
		return UPCIE_FAIL(err, "kmod: open %s: %s", path, upcie_errno_name(err));
	}
	if (ioctl(fd, info_req, info)) {
		err = upcie_neg_errno();
		close(fd);
		return UPCIE_FAIL(-EPROTO,
				  "kmod: %s does not answer as %s (%s): wrong device node?", path,
				  module, upcie_errno_name(err));
	}
	if (*abi != want_abi) {
		close(fd);
		return UPCIE_FAIL(
		    -EPROTO,
		    "kmod: %s speaks ABI %u, this upcie needs %u: install the %s that "
		    "matches upcie",
		    module, *abi, want_abi, pkg);
	}
	*out = fd;
	return 0;
}

#endif /* UPCIE_KMOD_DEVICE_H */
