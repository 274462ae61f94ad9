/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests for pci/inuse.h against a fake machine (fake_machine.h): every kind of use is
 * found where it is and only there, a fact that cannot be read is unknown (and refused), the
 * guard refuses with a message naming the use, and both overrides (flag, environment) work.
 * Each positive finding has its negative control: the same machine with that one fact removed.
 */
#include <upcie/pci/inuse.h>

#include <stdarg.h>

#include "check.h"
#include "fake_machine.h"

static char last_log[2048];

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	snprintf(last_log, sizeof(last_log), "%s", msg);
}

static int scan(const char *name, bool siblings, struct upcie_pci_inuse *u)
{
	struct upcie_pci_bdf bdf;

	if (upcie_pci_bdf_parse(name, &bdf))
		return -EINVAL;
	return upcie_pci_inuse_scan(&bdf, siblings, u);
}

static bool has(const struct upcie_pci_inuse *u, enum upcie_pci_use_kind kind, const char *text)
{
	for (unsigned i = 0; i < u->n && i < UPCIE_PCI_INUSE_MAX; i++)
		if (u->use[i].kind == kind && strstr(u->use[i].what, text))
			return true;
	return false;
}

static int refuse(const char *name, bool force)
{
	struct upcie_pci_bdf bdf;

	upcie_pci_bdf_parse(name, &bdf);
	last_log[0] = '\0';
	return upcie_pci_inuse_refuse(&bdf, force, "bind it to vfio-pci");
}

int main(void)
{
	struct upcie_pci_inuse u;

	fm_machine();
	upcie_log_set_handler(capture, NULL);
	upcie_log_set_level(UPCIE_LOG_WARN);
	unsetenv(UPCIE_PCI_INUSE_ENV);

	CHECK_EQ(scan("0000:00:04.0", true, &u), 0, "scan 04.0");
	CHECK_EQ(u.nblock, 3, "04.0: the disk and its two partitions are found");
	CHECK(has(&u, UPCIE_PCI_USE_MOUNT, "nvme0n1p1 is mounted on /"), "04.0: p1 mounted on /");
	CHECK(has(&u, UPCIE_PCI_USE_HOLDER, "nvme0n1p2 is held by dm-0 (vg-root)"),
	      "04.0: p2 held by dm-0, named by its dm name");
	CHECK_EQ(u.n, 2, "04.0: exactly those two uses");
	CHECK(!u.unknown, "04.0: every fact was readable");

	CHECK_EQ(scan("0000:00:05.0", true, &u), 0, "scan 05.0");
	CHECK_EQ(u.nblock, 2, "05.0: multipath head (found through multipath/) and its partition");
	CHECK(has(&u, UPCIE_PCI_USE_SWAP, "nvme1n1p1 is active swap"), "05.0: swap on the head's "
								       "partition");

	CHECK_EQ(scan("0000:00:06.0", true, &u), 0, "scan 06.0");
	CHECK(has(&u, UPCIE_PCI_USE_NET, "eth0 is up") &&
		  has(&u, UPCIE_PCI_USE_NET, "default route"),
	      "06.0: eth0 up with the default route");

	CHECK_EQ(scan("0000:00:07.0", true, &u), 0, "scan 07.0");
	CHECK(u.nblock == 1 && u.n == 0 && !u.unknown, "07.0: an idle namespace is not a use");
	CHECK_EQ(refuse("0000:00:07.0", false), 0, "guard lets an idle function go");

	CHECK_EQ(scan("0000:00:08.0", false, &u), 0, "scan 08.0 alone");
	CHECK_EQ(u.n, 0, "08.0 alone: nothing");
	CHECK_EQ(scan("0000:00:08.0", true, &u), 0, "scan 08.0 with its group");
	CHECK(u.nsiblings == 1 && has(&u, UPCIE_PCI_USE_MOUNT, "sda1 is mounted on /data") &&
		  !strcmp(u.use[0].func, "0000:00:08.1"),
	      "08.0: the group sibling's mounted sda1 is named, with the sibling");

	/* the guard and its overrides */
	CHECK_EQ(refuse("0000:00:04.0", false), -EBUSY, "guard refuses 04.0");
	CHECK(strstr(last_log, "nvme0n1p1 is mounted on /") && strstr(last_log, "held by dm-0") &&
		  strstr(last_log, "--force") && strstr(last_log, "UPCIE_ALLOW_IN_USE=1"),
	      "the refusal names the uses and both overrides");
	CHECK_EQ(refuse("0000:00:08.0", false), -EBUSY, "guard refuses 08.0 for its sibling");
	CHECK(strstr(last_log, "IOMMU group sibling 0000:00:08.1") != NULL,
	      "... and says it is the sibling");
	CHECK_EQ(refuse("0000:00:04.0", true), 0, "the flag overrides");
	CHECK(strstr(last_log, "as forced") != NULL, "... with a warning naming the uses");
	setenv(UPCIE_PCI_INUSE_ENV, "1", 1);
	CHECK_EQ(refuse("0000:00:06.0", false), 0, "UPCIE_ALLOW_IN_USE=1 overrides");
	setenv(UPCIE_PCI_INUSE_ENV, "0", 1);
	CHECK_EQ(refuse("0000:00:06.0", false), -EBUSY, "UPCIE_ALLOW_IN_USE=0 does not");
	unsetenv(UPCIE_PCI_INUSE_ENV);

	/* negative controls: remove one fact at a time, the use goes away */
	fm_put("proc/self/mountinfo", "22 1 0:5 / /proc rw - proc proc rw\n");
	CHECK_EQ(scan("0000:00:04.0", true, &u), 0, "04.0 without the mount");
	CHECK(u.n == 1 && !has(&u, UPCIE_PCI_USE_MOUNT, ""), "04.0: only the holder is left");
	fm_rm("sys/devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1/nvme0n1p2/holders/dm-0");
	CHECK_EQ(refuse("0000:00:04.0", false), 0, "04.0 with nothing left: the guard lets go");
	fm_put("proc/swaps", "Filename Type Size Used Priority\n");
	CHECK_EQ(scan("0000:00:05.0", true, &u), 0, "05.0 without swap");
	CHECK_EQ(u.n, 0, "05.0: nothing");
	fm_put("sys/devices/pci0000:00/0000:00:06.0/net/eth0/flags", "0x1002\n");
	CHECK_EQ(scan("0000:00:06.0", true, &u), 0, "06.0 with eth0 down");
	CHECK_EQ(u.n, 0, "06.0: a down interface is not a use");
	fm_put("sys/devices/pci0000:00/0000:00:06.0/net/eth0/flags", "0x1003\n");
	fm_put("proc/net/route", "Iface\tDestination\tGateway\tFlags\n");
	fm_put("proc/net/if_inet6", "20010db8000000000000000000000001 02 40 00 80     eth0\n");
	CHECK_EQ(scan("0000:00:06.0", true, &u), 0, "06.0 up, no default route, global IPv6");
	CHECK(has(&u, UPCIE_PCI_USE_NET, "IPv6 20010db8"), "06.0: a global IPv6 address is a use");
	fm_put("proc/net/if_inet6", "fe800000000000000000000000000001 02 40 20 80     eth0\n");
	CHECK_EQ(scan("0000:00:06.0", true, &u), 0, "06.0 up, link-local only");
	CHECK_EQ(u.n, 0, "06.0: link-local only, no route: not a use");

	/* unreadable facts are unknown, and the guard does not guess */
	fm_rm("proc/self/mountinfo");
	CHECK_EQ(scan("0000:00:07.0", true, &u), 0, "07.0 with mountinfo unreadable");
	CHECK(u.unknown && strstr(u.unknown_what, "mounts"), "07.0: mounts are unknown");
	CHECK_EQ(refuse("0000:00:07.0", false), -EBUSY, "the guard refuses on unknown");
	CHECK(strstr(last_log, "unknown: mounts") != NULL, "... saying what is unknown");
	CHECK_EQ(scan("0000:00:09.0", true, &u), 0, "09.0 (no block devices) with mountinfo gone");
	CHECK(!u.unknown && u.n == 0, "09.0: nothing to look up, nothing unknown");
	CHECK_EQ(scan("0000:00:0a.0", true, &u), -ENODEV, "a function that does not exist");

	fm_cleanup();
	return check_done();
}
