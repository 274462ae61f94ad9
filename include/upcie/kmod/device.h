/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Opening the device node of one of upcie's kernel modules (dkms/). Another project (uPCIe)
 * ships kernel modules of the same names and device nodes with another interface, so before
 * the node is opened the loaded module's identity is read from sysfs (its read-only parameter
 * /sys/module/<module>/parameters/abi, "upcie-<module> <ABI>"): a module without it, or with
 * another identity or ABI, is refused with a message that says what was found and which package
 * to install, and is never sent a request. Then the INFO request checks the ABI again on the
 * node itself. A missing node is an error that names the package to install.
 * Shared by kmod/dmabuf_import.h and kmod/iommu_map_pa.h.
 *
 * Needs nothing but libc; sysfs under upcie_sysfs_root() (UPCIE_SYSFS_ROOT: tests use a fake
 * tree). Does not load modules (that needs root and modprobe).
 */
#ifndef UPCIE_KMOD_DEVICE_H
#define UPCIE_KMOD_DEVICE_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/base/sysfs.h>

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
 * Is the loaded module `module` upcie's, speaking ABI `want_abi`? Its sysfs parameter abi must
 * read "<ident> <want_abi>". 0: it is, or no module of that name is loaded (opening the node
 * then says what is missing), or sysfs cannot tell (the INFO request still checks). -EPROTO,
 * with a message naming what was found and the package to install: another module of that
 * name (no identity, or another one) or upcie's with another ABI.
 */
static inline int upcie_kmod_identity_(const char *path, const char *module, const char *ident,
				       const char *pkg, uint32_t want_abi)
{
	char dir[256], file[320], got[128], ver[64] = "";
	size_t ilen = strlen(ident);
	unsigned long abi;
	struct stat st;
	char *end;
	int n;

	if (upcie_path_fmt(dir, sizeof(dir), "%s/module/%s", upcie_sysfs_root(), module))
		return 0;
	if (stat(dir, &st) || !S_ISDIR(st.st_mode))
		return 0;
	snprintf(file, sizeof(file), "%s/version", dir);
	if (upcie_file_read_str(file, ver, sizeof(ver)) < 0)
		ver[0] = '\0';
	snprintf(file, sizeof(file), "%s/parameters/abi", dir);
	n = upcie_file_read_str(file, got, sizeof(got));
	if (n == -ENOENT)
		return UPCIE_FAIL(
		    -EPROTO,
		    "kmod: %s is not upcie's module: the loaded module %s%s%s%s has no ABI "
		    "identity (%s): another project's module of that name (uPCIe's "
		    "upcie-experimental-dkms ships one, with another interface). Unload it "
		    "('rmmod %s'), remove the package that installed it, and install %s",
		    path, module, ver[0] ? " (version " : "", ver, ver[0] ? ")" : "", file, module,
		    pkg);
	if (n < 0) {
		UPCIE_DBG("kmod: %s: %s; the INFO request checks the module", file,
			  upcie_errno_name(n));
		return 0;
	}
	if (strncmp(got, ident, ilen) || got[ilen] != ' ')
		return UPCIE_FAIL(-EPROTO,
				  "kmod: %s is not upcie's module: ABI \"%s\" (%s), upcie needs "
				  "\"%s %u\". Unload it ('rmmod %s'), remove the package that "
				  "installed it, and install %s",
				  path, got, file, ident, want_abi, module, pkg);
	errno = 0;
	abi = strtoul(got + ilen + 1, &end, 10);
	if (errno || end == got + ilen + 1 || *end || abi != want_abi)
		return UPCIE_FAIL(
		    -EPROTO,
		    "kmod: %s is upcie's %s with ABI \"%s\"; this upcie needs ABI %u: "
		    "install the %s that matches this upcie",
		    path, module, got + ilen + 1, want_abi, pkg);
	return 0;
}

/*
 * Open a kmod device node: check the loaded module's identity (upcie_kmod_identity_()), open,
 * and check the ABI with the INFO request. -ENOENT (missing node: message names `pkg` and
 * `module`), -EPERM/-EACCES (needs CAP_SYS_ADMIN), -EPROTO (not upcie's module, or another
 * ABI).
 */
static inline int upcie_kmod_open_(const char *env, const char *defpath, const char *module,
				   const char *ident, const char *pkg, unsigned long info_req,
				   void *info, const uint32_t *abi, uint32_t want_abi, int *out)
{
	const char *path = getenv(env);
	int fd, err;

	if (!path || !*path)
		path = defpath;
	err = upcie_kmod_identity_(path, module, ident, pkg, want_abi);
	if (err)
		return err;
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
