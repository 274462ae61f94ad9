/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * upcie-setup: prepare a machine for user-space PCIe drivers, using only upcie's headers.
 *
 *   upcie-setup list [--nvme]                list PCI functions: driver, class, IOMMU group and
 *                                            domain type, NUMA node
 *   upcie-setup bind BDF DRIVER [--force]    bind to nvme, uio_pci_generic, vfio-pci, ...
 *   upcie-setup unbind BDF [--force]         release from its driver
 *   upcie-setup hugepages [show]             reserved/free hugepages per size and node
 *   upcie-setup hugepages reserve N [--size 2M|1G] [--node N]
 *   upcie-setup doctor [--json]              can this machine do what upcie does? (verdicts)
 *
 * Exit status 0 on success, 1 on failure (the message says why), 2 on a usage error.
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/mem/hugepage.h>
#include <upcie/pci/driver.h>
#include <upcie/pci/func.h>
#include <upcie/pci/inuse.h>

#include "upcie-doctor.h"

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: upcie-setup COMMAND [ARGS]\n"
	    "\n"
	    "  list [--nvme]                     PCI functions with driver, class, IOMMU group\n"
	    "                                    and domain (uio needs none or identity), node\n"
	    "  bind BDF DRIVER [--force]         bind a function (nvme, uio_pci_generic, "
	    "vfio-pci, ...);\n"
	    "                                    loads the driver's module when needed\n"
	    "  unbind BDF [--force]              release a function from its driver\n"
	    "  hugepages [show]                  reserved and free hugepages\n"
	    "  hugepages reserve N [--size 2M|1G] [--node NODE]\n"
	    "                                    reserve N hugepages (default 2M, all nodes)\n"
	    "  doctor [--json]                   check IOMMU, vfio, hugepages, memlock, drivers,\n"
	    "                                    GPU BAR1 and P2P paths, upcie's modules and\n"
	    "                                    kernel features; one verdict per line\n"
	    "\n"
	    "BDF is DDDD:BB:DD.F or BB:DD.F. Binding and reserving need root.\n"
	    "bind and unbind refuse a function the system uses (mounted filesystems, swap,\n"
	    "md/LVM/dm members, network interfaces with addresses or the default route, the\n"
	    "same in its IOMMU group); --force or UPCIE_ALLOW_IN_USE=1 overrides.\n"
	    "Set UPCIE_LOG=debug for more detail.\n");
}

static const char *class_name(uint32_t cls)
{
	switch (cls >> 8) {
	case 0x0108:
		return "NVMe";
	case 0x0106:
		return "SATA";
	case 0x0200:
		return "Ethernet";
	case 0x0300:
		return "VGA";
	case 0x0302:
		return "3D controller";
	case 0x0500:
		return "RAM";
	case 0x0600:
		return "host bridge";
	case 0x0601:
		return "ISA bridge";
	case 0x0604:
		return "PCI bridge";
	case 0x0c03:
		return "USB";
	case 0x0c05:
		return "SMBus";
	default:
		return "";
	}
}

static int list_one(const struct upcie_pci_func *fn, void *ctx)
{
	int only_nvme = *(int *)ctx;
	char grp[16] = "-", node[16] = "-", type[UPCIE_PCI_IOMMU_TYPE_LEN] = "none";
	enum upcie_pci_iommu mode = UPCIE_PCI_IOMMU_NONE;

	if (only_nvme && fn->class_code != UPCIE_PCI_CLASS_NVME)
		return 0;
	if (fn->iommu_group >= 0)
		snprintf(grp, sizeof(grp), "%d", fn->iommu_group);
	if (fn->numa_node >= 0)
		snprintf(node, sizeof(node), "%d", fn->numa_node);
	/* the IOMMU domain says which paths can work: uio needs none or identity */
	if (upcie_pci_func_iommu(&fn->bdf, &mode, NULL, type, sizeof(type)))
		snprintf(type, sizeof(type), "?");
	else if (mode == UPCIE_PCI_IOMMU_NONE)
		snprintf(type, sizeof(type), "none");
	else if (mode == UPCIE_PCI_IOMMU_VFIO_NOIOMMU)
		snprintf(type, sizeof(type), "noiommu");
	printf("%-13s %04x:%04x  %06x %-14s %-6s %-9s %-5s %s\n", fn->name, fn->vendor, fn->device,
	       fn->class_code, class_name(fn->class_code), grp, type, node,
	       fn->driver[0] ? fn->driver : "-");
	return 0;
}

static int cmd_list(int argc, char **argv)
{
	int only_nvme = 0, err;

	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--nvme")) {
			only_nvme = 1;
		} else {
			fprintf(stderr, "upcie-setup: list: unknown option '%s'\n", argv[i]);
			return 2;
		}
	}
	printf("%-13s %-9s  %-6s %-14s %-6s %-9s %-5s %s\n", "BDF", "ID", "CLASS", "", "GROUP",
	       "IOMMU", "NODE", "DRIVER");
	err = upcie_pci_scan(list_one, &only_nvme);
	if (err) {
		fprintf(stderr, "upcie-setup: list: %s\n", strerror(-err));
		return 1;
	}
	return 0;
}

static int run_modprobe(const char *module)
{
	int status;
	pid_t pid = fork();

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		execlp("modprobe", "modprobe", module, (char *)NULL);
		_exit(127);
	}
	if (waitpid(pid, &status, 0) < 0)
		return -errno;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return -ENOENT;
	return 0;
}

/* Strip --force from argv (anywhere); returns argc left. */
static int take_force(int argc, char **argv, bool *force)
{
	int n = 0;

	*force = false;
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--force"))
			*force = true;
		else
			argv[n++] = argv[i];
	}
	return n;
}

/* Taking a function from its driver: refuse while the system uses it (pci/inuse.h). */
static int guard_in_use(const struct upcie_pci_bdf *bdf, const char *target, bool force)
{
	char cur[64], action[96];

	if (upcie_pci_driver_get(bdf, cur, sizeof(cur)))
		return 1;
	if (!cur[0] || (target && !strcmp(cur, target)))
		return 0; /* nothing to take it from */
	if (target)
		snprintf(action, sizeof(action), "take it from %s and bind it to %s", cur, target);
	else
		snprintf(action, sizeof(action), "unbind it from %s", cur);
	return upcie_pci_inuse_refuse(bdf, force, action) ? 1 : 0;
}

static int cmd_bind(int argc, char **argv)
{
	struct upcie_pci_bdf bdf;
	char module[64];
	bool force;
	size_t i;
	int err, level;

	argc = take_force(argc, argv, &force);
	if (argc != 2) {
		fprintf(stderr, "upcie-setup: bind needs BDF and DRIVER\n");
		return 2;
	}
	if (upcie_pci_bdf_parse(argv[0], &bdf))
		return 2;
	err = upcie_pci_func_exists(&bdf);
	if (err)
		return 1;
	if (guard_in_use(&bdf, argv[1], force))
		return 1;
	level = upcie_log_level();
	upcie_log_set_level(UPCIE_LOG_NONE);
	err = upcie_pci_driver_loaded(argv[1]);
	upcie_log_set_level((enum upcie_log_level)level);
	if (err == -ENOENT) {
		for (i = 0; argv[1][i] && i + 1 < sizeof(module); i++)
			module[i] = argv[1][i] == '-' ? '_' : argv[1][i];
		module[i] = '\0';
		if (run_modprobe(module)) {
			fprintf(stderr,
				"upcie-setup: driver '%s' is not loaded and 'modprobe %s' "
				"failed\n",
				argv[1], module);
			return 1;
		}
	}
	err = upcie_pci_driver_bind(&bdf, argv[1]);
	if (err)
		return 1;
	printf("%s bound to %s\n", argv[0], argv[1]);
	return 0;
}

static int cmd_unbind(int argc, char **argv)
{
	struct upcie_pci_bdf bdf;
	bool force;

	argc = take_force(argc, argv, &force);
	if (argc != 1) {
		fprintf(stderr, "upcie-setup: unbind needs BDF\n");
		return 2;
	}
	if (upcie_pci_bdf_parse(argv[0], &bdf))
		return 2;
	if (upcie_pci_func_exists(&bdf) || guard_in_use(&bdf, NULL, force))
		return 1;
	if (upcie_pci_driver_unbind(&bdf))
		return 1;
	printf("%s unbound\n", argv[0]);
	return 0;
}

static int parse_size_kb(const char *s, uint64_t *kb)
{
	if (!strcmp(s, "2M") || !strcmp(s, "2m") || !strcmp(s, "2048"))
		*kb = 2048;
	else if (!strcmp(s, "1G") || !strcmp(s, "1g") || !strcmp(s, "1048576"))
		*kb = 1048576;
	else
		return -EINVAL;
	return 0;
}

static int show_hugepages(void)
{
	static const uint64_t sizes[] = { 2048, 1048576 };
	int shown = 0;

	printf("%-6s %-6s %8s %8s\n", "SIZE", "NODE", "TOTAL", "FREE");
	/* Probe sizes and nodes quietly: absent ones are simply not listed. */
	int level = upcie_log_level();

	upcie_log_set_level(UPCIE_LOG_NONE);
	for (unsigned s = 0; s < 2; s++) {
		for (int node = -1; node < 256; node++) {
			uint64_t total, nfree;
			char nodestr[16] = "all";
			int err = upcie_hugepages_get(sizes[s], node, &total, &nfree);

			if (err)
				continue;
			if (node >= 0)
				snprintf(nodestr, sizeof(nodestr), "%d", node);
			printf("%-6s %-6s %8llu %8llu\n", sizes[s] == 2048 ? "2M" : "1G", nodestr,
			       (unsigned long long)total, (unsigned long long)nfree);
			shown++;
		}
	}
	upcie_log_set_level((enum upcie_log_level)level);
	if (!shown) {
		fprintf(stderr, "upcie-setup: no hugepage sizes found in sysfs\n");
		return 1;
	}
	return 0;
}

static int cmd_hugepages(int argc, char **argv)
{
	uint64_t kb = 2048, count;
	int node = -1, err;
	char *end;

	if (argc == 0 || (argc == 1 && !strcmp(argv[0], "show")))
		return show_hugepages();
	if (strcmp(argv[0], "reserve") || argc < 2) {
		fprintf(stderr, "upcie-setup: hugepages: want 'show' or 'reserve N'\n");
		return 2;
	}
	errno = 0;
	count = strtoul(argv[1], &end, 10);
	if (errno || *end || argv[1][0] == '-') {
		fprintf(stderr, "upcie-setup: hugepages reserve: bad count '%s'\n", argv[1]);
		return 2;
	}
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--size") && i + 1 < argc) {
			if (parse_size_kb(argv[++i], &kb)) {
				fprintf(stderr, "upcie-setup: --size takes 2M or 1G\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "--node") && i + 1 < argc) {
			node = (int)strtol(argv[++i], &end, 10);
			if (*end || node < 0) {
				fprintf(stderr, "upcie-setup: --node takes a node number\n");
				return 2;
			}
		} else {
			fprintf(stderr, "upcie-setup: hugepages reserve: unknown option '%s'\n",
				argv[i]);
			return 2;
		}
	}
	err = upcie_hugepages_reserve(kb, node, count);
	if (err) {
		fprintf(stderr, "upcie-setup: reserving %lu hugepages of %lu KiB failed: %s\n",
			count, kb, strerror(-err));
		return 1;
	}
	return show_hugepages();
}

static int cmd_doctor(int argc, char **argv)
{
	struct upcie_doctor d;
	bool json = false;

	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = true;
		} else {
			fprintf(stderr, "upcie-setup: doctor: unknown option '%s'\n", argv[i]);
			return 2;
		}
	}
	memset(&d, 0, sizeof(d));
	upcie_doctor_run(&d);
	upcie_doctor_print(&d, stdout, json);
	/* a fail verdict is a machine that cannot do the job as it is */
	int rc = d.count[UPCIE_DOCTOR_FAIL] ? 1 : 0;

	upcie_doctor_free(&d);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "list"))
		return cmd_list(argc - 2, argv + 2);
	if (!strcmp(argv[1], "bind"))
		return cmd_bind(argc - 2, argv + 2);
	if (!strcmp(argv[1], "unbind"))
		return cmd_unbind(argc - 2, argv + 2);
	if (!strcmp(argv[1], "hugepages"))
		return cmd_hugepages(argc - 2, argv + 2);
	if (!strcmp(argv[1], "doctor"))
		return cmd_doctor(argc - 2, argv + 2);
	fprintf(stderr, "upcie-setup: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
