/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests for `upcie-setup doctor` (tools/upcie-doctor.h): every check against a fake
 * machine (fake_machine.h plus a PCIe switch, a second host bridge, /dev, /lib/modules, /boot),
 * each verdict with the change of one fact that flips it, and every unreadable fact reported as
 * unknown. The JSON form is checked to carry the same lines.
 */
#include <upcie/base/feature.h>

#include "../../tools/upcie-doctor.h"
#include "check.h"
#include "fake_machine.h"

static struct upcie_doctor d;

static void run(void)
{
	upcie_doctor_free(&d);
	upcie_doctor_run(&d);
}

/* The verdict of the line (check, subject), -1 when there is none; its detail in *detail. */
static int verdict(const char *check, const char *subject, const char **detail)
{
	for (unsigned i = 0; i < d.n; i++) {
		if (!strcmp(d.l[i].check, check) && !strcmp(d.l[i].subject, subject)) {
			if (detail)
				*detail = d.l[i].detail;
			return (int)d.l[i].verdict;
		}
	}
	if (detail)
		*detail = "";
	return -1;
}

static bool line_has(const char *check, const char *subject, int want, const char *text)
{
	const char *det;
	int v = verdict(check, subject, &det);

	if (v != want || !strstr(det, text)) {
		printf("# %s %s: verdict %d (want %d), detail '%s' (want '%s')\n", check, subject,
		       v, want, det, text);
		return false;
	}
	return true;
}

/* A bridge with an ACS capability whose control register is `ctl` (4 KiB config space). */
static void bridge_cfg(const char *dir, uint16_t ctl, bool acs)
{
	uint8_t cfg[4096];
	char rel[512], path[640];
	FILE *f;

	memset(cfg, 0, sizeof(cfg));
	cfg[0] = 0x86, cfg[1] = 0x80;
	if (acs) {
		uint32_t hdr = 0x000d | (1u << 16); /* ACS, version 1, last */

		memcpy(cfg + 0x100, &hdr, 4);
		cfg[0x106] = (uint8_t)ctl;
		cfg[0x107] = (uint8_t)(ctl >> 8);
	}
	snprintf(rel, sizeof(rel), "sys/devices/%s/config", dir);
	snprintf(path, sizeof(path), "%s/%s", fm_root, rel);
	fm_put(rel, "");
	f = fopen(path, "wb");
	if (!f || fwrite(cfg, 1, sizeof(cfg), f) != sizeof(cfg))
		exit(2);
	fclose(f);
}

#define SW "pci0000:00/0000:00:02.0/0000:01:00.0"

int main(void)
{
	char droot[128], p[256];
	const char *det;

	fm_machine();
	snprintf(droot, sizeof(droot), "%s/root", fm_root);
	setenv("UPCIE_DOCTOR_ROOT", droot, 1);
	setenv("UPCIE_DOCTOR_NO_CUDA", "1", 1);
	setenv("UPCIE_DOCTOR_NO_HIP", "1", 1);
	fm_put("proc/sys/kernel/osrelease", "6.1.0-50-amd64\n");
	fm_put("proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p1 intel_iommu=on quiet\n");
	fm_put("root/dev/vfio/vfio", "");
	fm_mkdirs("sys/module/vfio_iommu_type1");
	fm_put("root/lib/modules/6.1.0-50-amd64/modules.dep",
	       "kernel/drivers/vfio/pci/vfio-pci.ko: kernel/drivers/vfio/vfio.ko\n"
	       "kernel/drivers/dma-buf/udmabuf.ko:\n");
	fm_put("root/lib/modules/6.1.0-50-amd64/modules.builtin", "kernel/drivers/nvme/nvme.ko\n");
	fm_put("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "0\n");
	fm_put("sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "0\n");
	fm_put("sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", "0\n");
	fm_put("sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages", "0\n");
	/* a switch below root port 00:02.0: GPU 03:00.0 and NVMe 04:00.0 on two downstream ports */
	fm_func_at("pci0000:00", "0000:00:02.0", "0x8086\n", "0x29c0\n", "0x060400\n", "pcieport",
		   0, 0);
	fm_func_at("pci0000:00/0000:00:02.0", "0000:01:00.0", "0x10b5\n", "0x9797\n", "0x060400\n",
		   "pcieport", 7, 0);
	fm_func_at(SW, "0000:02:00.0", "0x10b5\n", "0x9797\n", "0x060400\n", "pcieport", 7, 0);
	fm_func_at(SW, "0000:02:01.0", "0x10b5\n", "0x9797\n", "0x060400\n", "pcieport", 7, 0);
	fm_func_at(SW "/0000:02:00.0", "0000:03:00.0", "0x10de\n", "0x2335\n", "0x030200\n",
		   "nvidia", 7, 0);
	fm_func_at(SW "/0000:02:01.0", "0000:04:00.0", "0x1b36\n", "0x0010\n", "0x010802\n",
		   "vfio-pci", 7, 0);
	bridge_cfg("pci0000:00/0000:00:02.0", 0, true);
	bridge_cfg(SW, 0, true);
	bridge_cfg(SW "/0000:02:00.0", 0, true);
	bridge_cfg(SW "/0000:02:01.0", 0, true);
	/* an NVMe behind a second host bridge, on node 1 */
	fm_func_at("pci0000:80", "0000:80:01.0", "0x1b36\n", "0x0010\n", "0x010802\n", NULL, 9, 1);

	run();
	CHECK(line_has("iommu", "", UPCIE_DOCTOR_OK, "intel_iommu=on"),
	      "iommu: present, with the command line");
	CHECK(line_has("vfio", "type1", UPCIE_DOCTOR_OK, "/dev/vfio/vfio"), "vfio type1: ok");
	CHECK(line_has("vfio", "iommufd", UPCIE_DOCTOR_INFO, "no /dev/iommu"),
	      "iommufd: not available, said so");
	CHECK(line_has("kernel", "iommufd-map-file", UPCIE_DOCTOR_INFO, "6.1 < 6.13"),
	      "MAP_FILE: no on 6.1");
	CHECK(line_has("kernel", "vfio-bar-dmabuf", UPCIE_DOCTOR_INFO, "6.1 < 6.19"),
	      "BAR dma-buf: no on 6.1");
	CHECK(line_has("kernel", "udmabuf", UPCIE_DOCTOR_INFO, "available, not loaded"),
	      "udmabuf: available as a module");
	CHECK(line_has("hugepages", "", UPCIE_DOCTOR_WARN, "none reserved"),
	      "hugepages: none reserved is a warning");
	CHECK(line_has("hugepages", "2048 kB node 0", UPCIE_DOCTOR_INFO, "0 reserved"),
	      "hugepages: per node");
	CHECK(verdict("memlock", "", NULL) == UPCIE_DOCTOR_OK ||
		  verdict("memlock", "", NULL) == UPCIE_DOCTOR_WARN,
	      "memlock: a verdict");
	CHECK(line_has("module", "dmabuf_import", UPCIE_DOCTOR_INFO, "not loaded"),
	      "module not loaded: info");
	CHECK(line_has("driver", "0000:00:04.0", UPCIE_DOCTOR_INFO,
		       "in use: nvme0n1p1 is mounted on /"),
	      "driver: 04.0 named as in use, with the mount");
	CHECK(line_has("driver", "0000:00:07.0", UPCIE_DOCTOR_OK, "vfio-pci: ready"),
	      "driver: vfio-pci ready");
	CHECK(line_has("driver", "0000:00:08.0", UPCIE_DOCTOR_INFO,
		       "IOMMU group sibling 0000:00:08.1"),
	      "driver: 08.0 in use through its group sibling");
	CHECK(line_has("driver", "0000:80:01.0", UPCIE_DOCTOR_INFO, "not in use"),
	      "driver: an idle unbound NVMe, with the bind command as fix");
	CHECK(line_has("iommu-group", "0000:00:04.0", UPCIE_DOCTOR_OK, "translating (DMA)"),
	      "group type DMA: translating");
	CHECK(line_has("gpu-bar1", "0000:00:09.0", UPCIE_DOCTOR_UNKNOWN, "BAR1 262144 MiB"),
	      "BAR1 size from sysfs; memory unknown without a GPU runtime");
	CHECK(line_has("p2p-path", "0000:03:00.0<->0000:04:00.0", UPCIE_DOCTOR_OK,
		       "below one PCIe switch"),
	      "GPU and NVMe below one switch, no ACS redirect: ok");
	CHECK(line_has("p2p-path", "0000:00:09.0<->0000:00:04.0", UPCIE_DOCTOR_WARN, "host bridge"),
	      "GPU and NVMe on the host bridge: PHB, a warning");
	CHECK(line_has("p2p-path", "0000:03:00.0<->0000:80:01.0", UPCIE_DOCTOR_FAIL,
		       "across sockets"),
	      "GPU and NVMe on different sockets: fail");
	CHECK(d.count[UPCIE_DOCTOR_FAIL] > 0, "a fail is counted (upcie-setup doctor exits 1)");

	/* flip one fact at a time */
	bridge_cfg(SW "/0000:02:01.0", 0x001d, true); /* SV, RR, CR, UF */
	fm_put("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "512\n");
	fm_put("sys/kernel/iommu_groups/1/type", "identity\n");
	fm_rm("sys/kernel/iommu_groups/2/type");
	fm_put("sys/devices/pci0000:80/0000:80:01.0/numa_node", "-1\n");
	fm_put("proc/sys/kernel/osrelease", "6.19.1\n");
	fm_put("root/dev/iommu", "");
	fm_put("root/boot/config-6.19.1", "CONFIG_VFIO_PCI_DMABUF=y\nCONFIG_IOMMUFD=m\n");
	fm_put("root/dev/udmabuf", "");
	fm_put("sys/module/dmabuf_import/parameters/abi", "upcie-dmabuf_import 1\n");
	fm_mkdirs("sys/module/iommu_map_pa/parameters");
	run();
	CHECK(line_has("p2p-path", "0000:03:00.0<->0000:04:00.0", UPCIE_DOCTOR_WARN,
		       "ACS redirects peer requests up to the root complex at 0000:02:01.0"),
	      "ACS request redirect on the NVMe's downstream port: warning naming the port");
	CHECK(line_has("hugepages", "", UPCIE_DOCTOR_OK, "512 reserved"), "hugepages reserved: ok");
	CHECK(line_has("iommu-group", "0000:00:04.0", UPCIE_DOCTOR_OK, "identity"),
	      "group type identity");
	CHECK(line_has("iommu-group", "0000:00:05.0", UPCIE_DOCTOR_UNKNOWN, "unreadable"),
	      "group type unreadable: unknown");
	CHECK(line_has("p2p-path", "0000:03:00.0<->0000:80:01.0", UPCIE_DOCTOR_WARN,
		       "NUMA nodes unknown"),
	      "NUMA node unknown: not called across sockets");
	CHECK(line_has("kernel", "iommufd-map-file", UPCIE_DOCTOR_OK, "6.19 >= 6.13"),
	      "MAP_FILE: yes on 6.19 with /dev/iommu");
	CHECK(line_has("kernel", "vfio-bar-dmabuf", UPCIE_DOCTOR_OK, "CONFIG_VFIO_PCI_DMABUF=y"),
	      "BAR dma-buf: yes from the kernel config");
	CHECK(line_has("kernel", "udmabuf", UPCIE_DOCTOR_OK, "/dev/udmabuf"), "udmabuf: present");
	CHECK(line_has("vfio", "iommufd", UPCIE_DOCTOR_OK, "/dev/iommu"), "iommufd: present");
	CHECK(line_has("module", "dmabuf_import", UPCIE_DOCTOR_OK, "ABI 1"),
	      "our module with its identity: ok, ABI shown");
	CHECK(line_has("module", "iommu_map_pa", UPCIE_DOCTOR_FAIL, "without upcie's identity"),
	      "a module of our name without the identity: fail");

	fm_put("sys/module/iommu_map_pa/parameters/abi", "othermod 3\n");
	fm_rm("root/boot/config-6.19.1");
	bridge_cfg(SW "/0000:02:01.0", 0, false); /* no ACS capability at all */
	bridge_cfg(SW "/0000:02:00.0", 0, false);
	fm_rm("sys/devices/" SW "/config"); /* the switch's upstream port: unreadable */
	fm_rm("proc/sys/kernel/osrelease");
	fm_rm("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages");
	run();
	CHECK(line_has("module", "iommu_map_pa", UPCIE_DOCTOR_FAIL, "'othermod 3'"),
	      "another identity: fail, naming it");
	CHECK(line_has("p2p-path", "0000:03:00.0<->0000:04:00.0", UPCIE_DOCTOR_UNKNOWN,
		       "ACS unknown"),
	      "a bridge's config space unreadable: ACS unknown, not ok");
	CHECK(line_has("kernel", "", UPCIE_DOCTOR_UNKNOWN, "unreadable"),
	      "kernel release unreadable: unknown");
	CHECK(line_has("hugepages", "2048 kB", UPCIE_DOCTOR_UNKNOWN, "unreadable"),
	      "nr_hugepages unreadable: unknown");

	/* the ABI comparison and BAR1 against memory, as the CUDA path feeds them */
	upcie_doctor_free(&d);
	upcie_doctor_kmod_one_(&d, "dmabuf_import", "pkg", 2);
	CHECK(line_has("module", "dmabuf_import", UPCIE_DOCTOR_FAIL, "ABI 1; this build"),
	      "our module with another ABI: fail");
	upcie_doctor_free(&d);
	upcie_doctor_bar1_verdict(&d, "g", 256ull << 30, 1, 0, 141ull << 30);
	upcie_doctor_bar1_verdict(&d, "h", 256ull << 20, 1, 0, 24ull << 30);
	CHECK(line_has("gpu-bar1", "g", UPCIE_DOCTOR_OK, "covers"), "BAR1 256 GiB >= 141 GiB: ok");
	CHECK(line_has("gpu-bar1", "h", UPCIE_DOCTOR_WARN, "only a window"),
	      "BAR1 256 MiB < 24 GiB: warning");

	/* nothing readable at all */
	snprintf(p, sizeof(p), "%s/nowhere", fm_root);
	setenv("UPCIE_SYSFS_ROOT", p, 1);
	setenv("UPCIE_PROCFS_ROOT", p, 1);
	run();
	CHECK(line_has("iommu", "", UPCIE_DOCTOR_UNKNOWN, "cannot read"),
	      "no sysfs: iommu unknown");
	CHECK(line_has("hugepages", "", UPCIE_DOCTOR_UNKNOWN, "cannot list"),
	      "no sysfs: hugepages unknown");
	CHECK(line_has("pci", "", UPCIE_DOCTOR_UNKNOWN, "cannot list PCI functions"),
	      "no sysfs: PCI unknown");

	/* JSON carries the same lines */
	{
		char *buf = NULL;
		size_t len = 0;
		FILE *f = open_memstream(&buf, &len);

		upcie_doctor_print(&d, f, true);
		fclose(f);
		CHECK(buf && strstr(buf, "\"check\": \"iommu\"") &&
			  strstr(buf, "\"verdict\": \"unknown\"") && strstr(buf, "\"summary\": {"),
		      "JSON: lines and summary");
		free(buf);
	}
	(void)det;
	upcie_doctor_free(&d);
	fm_cleanup();
	return check_done();
}
