/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The verdicts of `upcie-setup doctor` per path (tools/upcie-doctor.h, upcie_doctor_paths()):
 * on the fake machine of tests/unit/fake_machine.h, each fact that decides a path is flipped and
 * the verdict, its deciding fact and the exit status must follow; a fact that cannot be read
 * makes the verdict unknown, and no line contradicts another.
 */
#include <upcie/base/feature.h>

#include "../../tools/upcie-doctor.h"
#include "../unit/check.h"
#include "../unit/fake_machine.h"

static struct upcie_doctor d;
static int uring_answer = -EOPNOTSUPP;

static int fake_uring_probe(void)
{
	return uring_answer;
}

static void run(void)
{
	upcie_doctor_free(&d);
	d.uring_probe = fake_uring_probe;
	upcie_doctor_run(&d);
}

static const struct upcie_doctor_line *path_line(const char *path, const char *subject)
{
	for (unsigned i = 0; i < d.np; i++)
		if (!strcmp(d.p[i].check, path) && !strcmp(d.p[i].subject, subject))
			return &d.p[i];
	return NULL;
}

/* The path's state is `st` and its fact holds `text`. */
static bool path_is(const char *path, const char *subject, enum upcie_doctor_state st,
		    const char *text)
{
	const struct upcie_doctor_line *x = path_line(path, subject);

	if (!x || x->verdict != (enum upcie_doctor_verdict)st || !strstr(x->detail, text)) {
		printf("# %s %s: %s '%s' (want %s '%s')\n", path, subject,
		       x ? upcie_doctor_state_name((enum upcie_doctor_state)x->verdict) : "none",
		       x ? x->detail : "", upcie_doctor_state_name(st), text);
		return false;
	}
	return true;
}

static bool any_text(const char *text)
{
	for (unsigned i = 0; i < d.n; i++)
		if (strstr(d.l[i].detail, text))
			return true;
	for (unsigned i = 0; i < d.np; i++)
		if (strstr(d.p[i].detail, text))
			return true;
	return false;
}

static bool memlock_warns(void)
{
	for (unsigned i = 0; i < d.n; i++)
		if (!strcmp(d.l[i].check, "memlock"))
			return d.l[i].verdict == UPCIE_DOCTOR_WARN;
	return false;
}

int main(void)
{
	char droot[128];
	bool root = geteuid() == 0;

	fm_machine();
	snprintf(droot, sizeof(droot), "%s/root", fm_root);
	setenv("UPCIE_DOCTOR_ROOT", droot, 1);
	setenv("UPCIE_DOCTOR_NO_CUDA", "1", 1);
	setenv("UPCIE_DOCTOR_NO_HIP", "1", 1);
	fm_put("proc/sys/kernel/osrelease", "6.1.0-50-amd64\n");
	fm_put("proc/cmdline", "BOOT_IMAGE=/vmlinuz intel_iommu=on\n");
	fm_put("root/dev/vfio/vfio", "");
	fm_mkdirs("sys/module/vfio_iommu_type1");
	fm_put("root/lib/modules/6.1.0-50-amd64/modules.dep",
	       "kernel/drivers/vfio/pci/vfio-pci.ko: kernel/drivers/vfio/vfio.ko\n"
	       "kernel/drivers/uio/uio_pci_generic.ko: kernel/drivers/uio/uio.ko\n");
	fm_put("root/lib/modules/6.1.0-50-amd64/modules.builtin", "kernel/drivers/nvme/nvme.ko\n");
	fm_put("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "0\n");
	fm_put("sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "0\n");

	/* 1: no hugepages, every group translating, 6.1: nothing can run */
	run();
	CHECK(path_is("uio", "", UPCIE_DOCTOR_NO, "IOMMU group translates DMA"),
	      "uio: no, every controller's group translates");
	CHECK(path_is("vfio-type1", "", UPCIE_DOCTOR_NO, "hugepages: none reserved"),
	      "vfio type1: no, decided by the hugepages");
	CHECK(!strcmp(path_line("vfio-type1", "")->fix, "upcie-setup hugepages reserve 512"),
	      "vfio type1: the fix is the hugepages' fix");
	CHECK(path_is("vfio-iommufd", "", UPCIE_DOCTOR_NO, "6.1 < 6.6"), "iommufd: no on 6.1");
	CHECK(path_is("gpu-p2p", "0000:00:09.0<->0000:00:07.0", UPCIE_DOCTOR_NO,
		      "no host path is ready"),
	      "GPU P2P per pair: no host path");
	CHECK(path_is("gpu-queues", "", UPCIE_DOCTOR_NO, "no GPU x NVMe pair"),
	      "GPU-issued queues: no pair");
	CHECK(path_is("uring-dmabuf", "", UPCIE_DOCTOR_NO, "does not register dma-bufs"),
	      "io_uring dma-buf: the kernel says no");
	CHECK_EQ(upcie_doctor_exit_status(&d), 3, "nothing can run: exit 3");

	/* 2: hugepages reserved: vfio type1 on 07.0 (vfio-pci already) */
	fm_put("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "512\n");
	run();
	if (memlock_warns()) {
		CHECK(path_is("vfio-type1", "", UPCIE_DOCTOR_NO, "memlock"),
		      "vfio type1: no, decided by the memlock limit");
	} else {
		CHECK(path_is("vfio-type1", "", UPCIE_DOCTOR_READY, "0000:00:07.0 (vfio-pci"),
		      "vfio type1: ready on the controller vfio-pci has");
		CHECK_EQ(upcie_doctor_exit_status(&d), 0, "a path ready, no fail: exit 0");
		CHECK(path_is("gpu-p2p", "0000:00:09.0<->0000:00:07.0", UPCIE_DOCTOR_MAYBE,
			      "host bridge"),
		      "GPU P2P through the host bridge: unknown, with the fact");
	}

	/* 3: an idle controller in an identity group: uio */
	fm_func("0000:00:0a.0", "0x1b36\n", "0x0010\n", "0x010802\n", "nvme", 8);
	fm_put("sys/kernel/iommu_groups/8/type", "identity\n");
	run();
	if (root)
		CHECK(path_is("uio", "", UPCIE_DOCTOR_READY, "0000:00:0a.0 (nvme)"),
		      "uio: ready on the idle controller of the identity group");
	else
		CHECK(path_is("uio", "", UPCIE_DOCTOR_NO, "not root"), "uio: no without root");
	fm_rm("root/lib/modules/6.1.0-50-amd64/modules.dep");
	fm_put("root/lib/modules/6.1.0-50-amd64/modules.builtin", "kernel/drivers/nvme/nvme.ko\n");
	run();
	CHECK(path_is("uio", "", UPCIE_DOCTOR_NO, "no uio_pci_generic module"),
	      "uio: no without the module, the fact says so");

	/* 4: the modules unreadable and vfio absent: unknown, and nothing says type1 is there */
	fm_rm("root/lib/modules/6.1.0-50-amd64/modules.builtin");
	fm_rm("root/dev/vfio/vfio");
	{
		char m[160];

		snprintf(m, sizeof(m), "%s/sys/module/vfio_iommu_type1", fm_root);
		rmdir(m);
	}
	run();
	CHECK(path_is("vfio-type1", "", UPCIE_DOCTOR_MAYBE, "modules of 6.1.0-50-amd64 unreadable"),
	      "vfio type1: unknown when the modules cannot be read");
	CHECK(!any_text("type1 is") && !any_text("no iommufd module"),
	      "no line claims type1 or rules iommufd out on unread facts");
	CHECK(path_is("uio", "", UPCIE_DOCTOR_MAYBE, "unreadable"), "uio: unknown as well");

	/* 5: the kernel with the io_uring series, a controller with the nvme driver */
	uring_answer = 0;
	run();
	CHECK(path_is("uring-dmabuf", "", UPCIE_DOCTOR_READY, "0000:00:04.0 with the nvme driver"),
	      "io_uring dma-buf: ready");
	CHECK_EQ(upcie_doctor_exit_status(&d), 0, "io_uring ready alone: exit 0");

	/* 6: a fail beside a ready path: exit 1 */
	fm_mkdirs("sys/module/iommu_map_pa/parameters");
	run();
	CHECK_EQ(upcie_doctor_exit_status(&d), 1, "a failed check with a path ready: exit 1");

	/* 7: GPU and NVMe across sockets: that pair is no, naming it */
	fm_func_at("pci0000:80", "0000:80:01.0", "0x1b36\n", "0x0010\n", "0x010802\n", "vfio-pci",
		   9, 1);
	fm_put("root/dev/vfio/vfio", "");
	fm_mkdirs("sys/module/vfio_iommu_type1");
	run();
	CHECK(path_is("gpu-p2p", "0000:00:09.0<->0000:80:01.0", UPCIE_DOCTOR_NO, "across sockets"),
	      "GPU P2P across sockets: no, the path's fact");

	/* the JSON form carries the verdicts with the schema */
	{
		char buf[65536];
		FILE *f = fmemopen(buf, sizeof(buf), "w");

		upcie_doctor_print(&d, f, true);
		fclose(f);
		CHECK(strstr(buf, "{\"schema\": 2, \"paths\": [") &&
			  strstr(buf, "{\"path\": \"uring-dmabuf\", \"subject\": \"\", \"state\": "
				      "\"ready\"") &&
			  strstr(buf, "\"exit\": 1}"),
		      "JSON: schema, paths with states, exit status");
	}
	upcie_doctor_free(&d);
	fm_cleanup();
	return check_done();
}
