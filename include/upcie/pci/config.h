/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * PCI configuration space through sysfs: read, write, capability lists, bus mastering; and the
 * function reset sysfs offers.
 *
 * Uses /sys/bus/pci/devices/<bdf>/config. Unprivileged readers see only the first 64 bytes (the
 * kernel returns zeroes past that, not an error); writes and full reads need root. Values are
 * little-endian in config space and returned in host order. Works whatever driver is bound, but
 * writing the command register under a kernel driver competes with that driver: do it on
 * functions bound to uio_pci_generic or vfio-pci.
 */
#ifndef UPCIE_PCI_CONFIG_H
#define UPCIE_PCI_CONFIG_H

#include <upcie/base/feature.h>

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/base/sysfs.h>
#include <upcie/pci/func.h>

#define UPCIE_PCI_CFG_VENDOR	   0x00
#define UPCIE_PCI_CFG_COMMAND	   0x04
#define UPCIE_PCI_CFG_STATUS	   0x06
#define UPCIE_PCI_CFG_CAP_PTR	   0x34
#define UPCIE_PCI_CMD_IO	   0x0001u
#define UPCIE_PCI_CMD_MEMORY	   0x0002u
#define UPCIE_PCI_CMD_MASTER	   0x0004u
#define UPCIE_PCI_CMD_INTX_DISABLE 0x0400u
#define UPCIE_PCI_STATUS_CAP_LIST  0x0010u
#define UPCIE_PCI_CFG_SIZE	   256u
#define UPCIE_PCI_CFG_EXP_SIZE	   4096u

/* Capability ids. */
#define UPCIE_PCI_CAP_PM     0x01
#define UPCIE_PCI_CAP_MSI    0x05
#define UPCIE_PCI_CAP_EXP    0x10
#define UPCIE_PCI_CAP_MSIX   0x11
#define UPCIE_PCI_ECAP_AER   0x0001
#define UPCIE_PCI_ECAP_SRIOV 0x0010

static inline int upcie_pci_config_io_(const struct upcie_pci_bdf *bdf, uint32_t off, void *buf,
				       size_t len, bool write)
{
	char path[PATH_MAX], name[UPCIE_PCI_BDF_STRLEN];
	ssize_t n;
	int fd, err;

	upcie_pci_bdf_format(bdf, name, sizeof(name));
	if (!buf || !len || off >= UPCIE_PCI_CFG_EXP_SIZE || len > UPCIE_PCI_CFG_EXP_SIZE - off)
		return UPCIE_FAIL(-EINVAL,
				  "pci: %s: config %s of %zu bytes at 0x%x is out of range", name,
				  write ? "write" : "read", len, off);
	err = upcie_pci_func_path(bdf, "config", path, sizeof(path));
	if (err)
		return err;
	fd = open(path, (write ? O_WRONLY : O_RDONLY) | O_CLOEXEC);
	if (fd < 0) {
		err = -errno;
		if (err == -ENOENT)
			return UPCIE_FAIL(-ENODEV, "pci: no PCI function %s", name);
		return UPCIE_FAIL(err, "pci: %s: open config: %s%s", name, strerror(-err),
				  err == -EACCES ? " (writing config space needs root)"
						 : upcie_pci_sysfs_hint_(err));
	}
	n = write ? pwrite(fd, buf, len, off) : pread(fd, buf, len, off);
	err = n < 0 ? -errno : 0;
	close(fd);
	if (err)
		return UPCIE_FAIL(err, "pci: %s: config %s at 0x%x: %s", name,
				  write ? "write" : "read", off, strerror(-err));
	if ((size_t)n != len)
		return UPCIE_FAIL(-EIO, "pci: %s: config %s at 0x%x: %zd of %zu bytes", name,
				  write ? "write" : "read", off, n, len);
	return 0;
}

/* Read len bytes of config space at off. */
static inline int upcie_pci_config_read(const struct upcie_pci_bdf *bdf, uint32_t off, void *buf,
					size_t len)
{
	return upcie_pci_config_io_(bdf, off, buf, len, false);
}

/* Write len bytes of config space at off (root). */
static inline int upcie_pci_config_write(const struct upcie_pci_bdf *bdf, uint32_t off,
					 const void *buf, size_t len)
{
	return upcie_pci_config_io_(bdf, off, (void *)(uintptr_t)buf, len, true);
}

/* One config byte at `off`; returns as upcie_pci_config_read(). */
static inline int upcie_pci_config_read8(const struct upcie_pci_bdf *bdf, uint32_t off,
					 uint8_t *val)
{
	return upcie_pci_config_read(bdf, off, val, 1);
}

/* A little-endian 16-bit config register at `off`, in host order. */
static inline int upcie_pci_config_read16(const struct upcie_pci_bdf *bdf, uint32_t off,
					  uint16_t *val)
{
	uint16_t le;
	int err = upcie_pci_config_read(bdf, off, &le, 2);

	if (!err)
		*val = le16toh(le);
	return err;
}

/* A little-endian 32-bit config register at `off`, in host order. */
static inline int upcie_pci_config_read32(const struct upcie_pci_bdf *bdf, uint32_t off,
					  uint32_t *val)
{
	uint32_t le;
	int err = upcie_pci_config_read(bdf, off, &le, 4);

	if (!err)
		*val = le32toh(le);
	return err;
}

/* Write one config byte at `off` (root); returns as upcie_pci_config_write(). */
static inline int upcie_pci_config_write8(const struct upcie_pci_bdf *bdf, uint32_t off,
					  uint8_t val)
{
	return upcie_pci_config_write(bdf, off, &val, 1);
}

/* Write a 16-bit config register at `off`, little-endian as the bus wants it (root). */
static inline int upcie_pci_config_write16(const struct upcie_pci_bdf *bdf, uint32_t off,
					   uint16_t val)
{
	uint16_t le = htole16(val);

	return upcie_pci_config_write(bdf, off, &le, 2);
}

/* Write a 32-bit config register at `off`, little-endian as the bus wants it (root). */
static inline int upcie_pci_config_write32(const struct upcie_pci_bdf *bdf, uint32_t off,
					   uint32_t val)
{
	uint32_t le = htole32(val);

	return upcie_pci_config_write(bdf, off, &le, 4);
}

/*
 * Find capability `id` in the standard list. Returns its offset (> 0), -ENOENT when absent, or
 * -errno. The walk is bounded, so a looping list in a broken device cannot hang it.
 */
static inline int upcie_pci_cap_find(const struct upcie_pci_bdf *bdf, uint8_t id)
{
	uint8_t cfg[UPCIE_PCI_CFG_SIZE];
	uint16_t status;
	int err = upcie_pci_config_read(bdf, 0, cfg, sizeof(cfg));

	if (err)
		return err;
	memcpy(&status, cfg + UPCIE_PCI_CFG_STATUS, 2);
	if (!(le16toh(status) & UPCIE_PCI_STATUS_CAP_LIST))
		return -ENOENT;
	for (unsigned pos = cfg[UPCIE_PCI_CFG_CAP_PTR] & 0xfcu, hops = 0; pos >= 0x40 && hops < 48;
	     hops++) {
		if (cfg[pos] == id)
			return (int)pos;
		pos = cfg[pos + 1] & 0xfcu;
	}
	return -ENOENT;
}

/* Find extended capability `id` (PCIe, offsets 0x100+). Offset (> 0), -ENOENT, or -errno. */
static inline int upcie_pci_ecap_find(const struct upcie_pci_bdf *bdf, uint16_t id)
{
	char path[PATH_MAX];
	unsigned pos = 0x100;
	struct stat st;
	int err = upcie_pci_func_path(bdf, "config", path, sizeof(path));

	if (err)
		return err;
	/* Conventional functions (and some VMs) expose only 256 bytes: no extended space. */
	if (stat(path, &st))
		return errno == ENOENT ? -ENODEV : -errno;
	if (st.st_size < (off_t)UPCIE_PCI_CFG_EXP_SIZE)
		return -ENOENT;

	for (unsigned hops = 0; pos >= 0x100 && pos < UPCIE_PCI_CFG_EXP_SIZE && hops < 480;
	     hops++) {
		uint32_t hdr;

		err = upcie_pci_config_read32(bdf, pos, &hdr);
		if (err)
			return err;
		if (!hdr || hdr == 0xffffffffu)
			return -ENOENT;
		if ((hdr & 0xffffu) == id)
			return (int)pos;
		pos = (hdr >> 20) & 0xffcu;
	}
	return -ENOENT;
}

/*
 * Set or clear bus mastering (and memory space decoding when enabling). A device that is not
 * allowed to master silently drops every DMA, so commands time out: drivers on uio must enable it
 * (unbinding the kernel driver clears it). *was (optional) receives the previous state.
 */
static inline int upcie_pci_bus_master_set(const struct upcie_pci_bdf *bdf, bool enable, bool *was)
{
	uint16_t cmd, ncmd;
	int err = upcie_pci_config_read16(bdf, UPCIE_PCI_CFG_COMMAND, &cmd);

	if (err)
		return err;
	if (was)
		*was = !!(cmd & UPCIE_PCI_CMD_MASTER);
	ncmd = enable ? (uint16_t)(cmd | UPCIE_PCI_CMD_MASTER | UPCIE_PCI_CMD_MEMORY)
		      : (uint16_t)(cmd & ~UPCIE_PCI_CMD_MASTER);
	if (ncmd == cmd)
		return 0;
	err = upcie_pci_config_write16(bdf, UPCIE_PCI_CFG_COMMAND, ncmd);
	if (err)
		return err;
	err = upcie_pci_config_read16(bdf, UPCIE_PCI_CFG_COMMAND, &cmd);
	if (err)
		return err;
	if (!!(cmd & UPCIE_PCI_CMD_MASTER) != enable) {
		char name[UPCIE_PCI_BDF_STRLEN];

		upcie_pci_bdf_format(bdf, name, sizeof(name));
		return UPCIE_FAIL(-EIO, "pci: %s: bus master bit did not stick (command=0x%04x)",
				  name, cmd);
	}
	return 0;
}

/*
 * Let the function master the bus (DMA): upcie_pci_bus_master_set() with enable, the bit
 * read back.
 */
static inline int upcie_pci_bus_master_enable(const struct upcie_pci_bdf *bdf)
{
	return upcie_pci_bus_master_set(bdf, true, NULL);
}

/*
 * Reset the function through sysfs ("reset": the kernel's pci_reset_function(), FLR or whatever
 * it found). The kernel saves the config space first and restores it after, bus mastering
 * included: the command register comes back as it was. Root. -EOPNOTSUPP when the function has
 * no reset method (no "reset" attribute); -errno of the write otherwise.
 */
static inline int upcie_pci_func_reset(const struct upcie_pci_bdf *bdf)
{
	char path[PATH_MAX], name[UPCIE_PCI_BDF_STRLEN];
	int err = upcie_pci_func_exists(bdf);

	if (err)
		return err;
	upcie_pci_bdf_format(bdf, name, sizeof(name));
	err = upcie_pci_func_path(bdf, "reset", path, sizeof(path));
	if (err)
		return err;
	if (access(path, F_OK) != 0)
		return UPCIE_FAIL(-EOPNOTSUPP, "pci: %s has no reset method (no %s)", name, path);
	err = upcie_file_write_str(path, "1");
	if (err)
		return UPCIE_FAIL(err, "pci: %s: reset: %s%s", name, strerror(-err),
				  upcie_pci_sysfs_hint_(err));
	return 0;
}

#endif /* UPCIE_PCI_CONFIG_H */
