/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The verdicts of `upcie-setup doctor` per path (tools/upcie-doctor.h, upcie_doctor_paths()):
 * on the fake machine of tests/unit/fake_machine.h, each fact that decides a path is flipped and
 * the verdict, its deciding fact and the exit status must follow; a fact that cannot be read
 * makes the verdict unknown, and no line contradicts another. The placement check per GPU
 * (gpu-placement) is run against fake iomem files: real addresses with System RAM ending one byte
 * below the GPU's BAR1, the same ending on BAR1's first byte, the all-zero view of a user without
 * CAP_SYS_ADMIN, and no file.
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

/* The check line (check, subject) has verdict `v` and its detail holds `text`. */
static const struct upcie_doctor_line *line_is(const char *check, const char *subject,
					       enum upcie_doctor_verdict v, const char *text)
{
	for (unsigned i = 0; i < d.n; i++) {
		const struct upcie_doctor_line *x = &d.l[i];

		if (strcmp(x->check, check) || strcmp(x->subject, subject))
			continue;
		if (x->verdict == v && strstr(x->detail, text))
			return x;
		printf("# %s %s: %s '%s' (want %s '%s')\n", check, subject,
		       upcie_doctor_verdict_name(x->verdict), x->detail,
		       upcie_doctor_verdict_name(v), text);
		return NULL;
	}
	printf("# %s %s: no line (want %s '%s')\n", check, subject, upcie_doctor_verdict_name(v),
	       text);
	return NULL;
}

static unsigned lines_of(const char *check)
{
	unsigned n = 0;

	for (unsigned i = 0; i < d.n; i++)
		n += !strcmp(d.l[i].check, check);
	return n;
}

/* /proc/iomem as root sees it; the third System RAM range ends one byte below the GPU's BAR1
 * (0x40000000000-0x43fffffffff in fake_machine.h). */
#define IOMEM_HEAD                                                                                 \
	"00000000-00000fff : Reserved\n"                                                           \
	"00001000-0009fbff : System RAM\n"                                                         \
	"000a0000-000bffff : PCI Bus 0000:00\n"                                                    \
	"00100000-7ffdffff : System RAM\n"                                                         \
	"  01000000-01ffffff : Kernel code\n"                                                      \
	"80000000-afffffff : PCI Bus 0000:00\n"                                                    \
	"  90000000-90ffffff : 0000:00:09.0\n"
#define IOMEM_TAIL                                                                                 \
	"40000000000-44fffffffff : PCI Bus 0000:00\n"                                              \
	"  40000000000-43fffffffff : 0000:00:09.0\n"
#define IOMEM_OK IOMEM_HEAD "100000000-3ffffffffff : System RAM\n" IOMEM_TAIL
/* the same with System RAM running onto BAR1's first byte */
#define IOMEM_OVER IOMEM_HEAD "100000000-40000000000 : System RAM\n" IOMEM_TAIL
/* what a user without CAP_SYS_ADMIN reads */
#define IOMEM_HIDDEN                                                                               \
	"00000000-00000000 : Reserved\n"                                                           \
	"00000000-00000000 : System RAM\n"                                                         \
	"00000000-00000000 : PCI Bus 0000:00\n"                                                    \
	"  00000000-00000000 : 0000:00:09.0\n"

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
	unsetenv("UPCIE_IOMEM_PATH"); /* iomem under the fake procfs root */
	fm_put("proc/iomem", IOMEM_OK);
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

	/* 8: placement of the GPU's memory: BAR1's window, iomem with real addresses, the module */
	{
		const struct upcie_doctor_line *x;
		char buf[65536], other[256];
		unsigned fails;
		FILE *f;

		fm_put("root/dev/dmabuf_import", "");
		run();
		snprintf(
		    other, sizeof(other),
		    "window BAR1 0x40000000000-0x43fffffffff (262144 MiB), clear of System RAM "
		    "(3 ranges in %s/proc/iomem); /dev/dmabuf_import present",
		    fm_root);
		CHECK(line_is("gpu-placement", "0000:00:09.0", UPCIE_DOCTOR_OK, other),
		      "placement: ok, naming BAR1's window and the fake procfs's iomem; System RAM "
		      "ends one byte below the window");
		CHECK(!getenv("UPCIE_IOMEM_PATH"), "placement: the environment is left as it was");
		x = path_line("gpu-p2p", "0000:00:09.0<->0000:00:07.0");
		CHECK(x && !strstr(x->detail, "gpu-placement"),
		      "placement ok: it does not decide the GPU's P2P verdicts");
		fails = d.count[UPCIE_DOCTOR_FAIL];
		f = fmemopen(buf, sizeof(buf), "w");
		upcie_doctor_print(&d, f, true);
		fclose(f);
		CHECK(strstr(buf, "{\"schema\": 2, \"paths\": [") &&
			  strstr(buf,
				 "{\"check\": \"gpu-placement\", \"subject\": \"0000:00:09.0\", "
				 "\"verdict\": \"ok\", \"detail\": \"window BAR1 "
				 "0x40000000000-0x43fffffffff"),
		      "JSON: the placement line among the checks, schema still 2");

		fm_rm("root/dev/dmabuf_import");
		run();
		x = line_is("gpu-placement", "0000:00:09.0", UPCIE_DOCTOR_INFO,
			    "no /dev/dmabuf_import: no IMPORT heap");
		CHECK(x && strstr(x->fix, "modprobe dmabuf_import"),
		      "placement without the import module: info, the fix names the module");

		fm_put("proc/iomem", IOMEM_HIDDEN);
		run();
		x = line_is("gpu-placement", "0000:00:09.0", UPCIE_DOCTOR_UNKNOWN,
			    "cannot verify: ");
		CHECK(x && strstr(x->detail, "every address as 0") &&
			  strstr(x->detail, "window BAR1 0x40000000000") &&
			  !strncmp(x->fix, "run as root", 11),
		      "iomem without addresses (not root): cannot verify, fix: run as root");
		CHECK_EQ(d.count[UPCIE_DOCTOR_FAIL], fails, "cannot verify is not a fail");

		/* $UPCIE_IOMEM_PATH wins over the procfs root, as in gpu/p2p_check.h */
		snprintf(other, sizeof(other), "%s/iomem-root", fm_root);
		fm_put("iomem-root", IOMEM_OK);
		setenv("UPCIE_IOMEM_PATH", other, 1);
		run();
		CHECK(line_is("gpu-placement", "0000:00:09.0", UPCIE_DOCTOR_INFO, "iomem-root"),
		      "UPCIE_IOMEM_PATH names the file read");
		CHECK(getenv("UPCIE_IOMEM_PATH") && !strcmp(getenv("UPCIE_IOMEM_PATH"), other),
		      "UPCIE_IOMEM_PATH kept as the caller set it");
		unsetenv("UPCIE_IOMEM_PATH");

		fm_rm("proc/iomem");
		run();
		CHECK(line_is("gpu-placement", "0000:00:09.0", UPCIE_DOCTOR_UNKNOWN,
			      "cannot verify: "),
		      "no iomem: cannot verify, unknown");

		fm_put("proc/iomem", IOMEM_OVER);
		run();
		CHECK(
		    line_is("gpu-placement", "0000:00:09.0", UPCIE_DOCTOR_FAIL,
			    "window BAR1 0x40000000000-0x43fffffffff (262144 MiB) overlaps System "
			    "RAM 0x100000000-0x40000000000"),
		    "System RAM onto BAR1's first byte: fail, naming both ranges");
		CHECK_EQ(d.count[UPCIE_DOCTOR_FAIL], fails + 1, "the overlap is one more fail");
		CHECK(path_is("gpu-p2p", "0000:00:09.0<->0000:00:07.0", UPCIE_DOCTOR_NO,
			      "gpu-placement 0000:00:09.0: window BAR1"),
		      "GPU P2P: no, decided by the placement check");

		fm_put("proc/iomem", IOMEM_OK);
		fm_put(FM_DEV "0000:00:09.0/resource",
		       "0x0000000000001000 0x000000000000107f 0x0000000000040101\n");
		run();
		CHECK(line_is("gpu-placement", "0000:00:09.0", UPCIE_DOCTOR_FAIL, "no memory BAR"),
		      "a GPU with no memory BAR: fail, no window");
	}

	/* 9: no GPU: no placement line, the one gpu line says so */
	fm_rm("sys/bus/pci/devices/0000:00:09.0");
	run();
	CHECK(lines_of("gpu-placement") == 0 &&
		  line_is("gpu", "", UPCIE_DOCTOR_INFO, "no NVIDIA or AMD GPU found"),
	      "no GPU: no gpu-placement line");
	upcie_doctor_free(&d);
	fm_cleanup();
	return check_done();
}
