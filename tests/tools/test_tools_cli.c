/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The tools as a user runs them: each row of the table runs one built tool (upcie-perf,
 * upcie-served, upcie-setup, paths from the command line; the probes probe_vfio_cdev,
 * probe_vfio_delegate and probe_dmabuf_udmabuf from the directory of upcie-perf, or from three
 * more arguments; the CUDA and HIP probes from the directory of upcie-perf, where they were
 * built) with arguments and environment and checks its exit status and what it printed
 * (stdout and stderr together): every bad value is refused with exit 2 and a message naming the
 * option and the value, every good one is read as documented (the tools' --dry-run prints what
 * they understood). The probes need hardware for their real work, so their rows are about
 * parsing alone: a good value shows it was read when the run fails later on something else. A
 * CUDA or HIP probe that was not built (no nvcc or hipcc) or cannot start here (no libcuda, no
 * HIP runtime) has its rows skipped with the reason, never counted as passed. The
 * machine is fake (tests/unit/fake_machine.h), so binding, resetting and reserving hugepages act
 * on files that the test then reads back.
 */
#include <upcie/base/feature.h>

#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../unit/check.h"
#include "../unit/fake_machine.h"

/* NARGS tools may be named on the command line; the GPU probes after them are optional */
enum {
	PERF,
	SERVED,
	SETUP,
	VCDEV,
	VDELEG,
	UDMABUF,
	NARGS,
	DCUDA = NARGS,
	ICUDA,
	DHIP,
	IHIP,
	NTOOLS
};

static const char *const tool_name[NTOOLS] = {
	"upcie-perf",	       "upcie-served",	       "upcie-setup",	    "probe_vfio_cdev",
	"probe_vfio_delegate", "probe_dmabuf_udmabuf", "probe_dmabuf_cuda", "probe_iomem_cuda",
	"probe_dmabuf_hip",    "probe_iomem_hip",
};

static char tool_path[NTOOLS][PATH_MAX];
/* why an optional tool's rows are skipped ("" when it runs) */
static char tool_skip[NTOOLS][256];

struct row {
	int tool;
	const char *env; /* "NAME=value" or NULL */
	const char *argv[16];
	int rc;
	const char *want;    /* substring of the output, or NULL */
	const char *notwant; /* must not be in the output, or NULL */
};

/* Run the tool; its output (stdout and stderr) into out. Returns the exit status, -1 failed. */
static int run(const struct row *r, char *out, size_t len)
{
	char *argv[18];
	int p[2], st, n = 0;
	size_t got = 0;
	ssize_t k;
	pid_t pid;

	argv[n++] = tool_path[r->tool];
	for (int i = 0; r->argv[i]; i++)
		argv[n++] = (char *)r->argv[i];
	argv[n] = NULL;
	if (pipe(p))
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		dup2(p[1], 1);
		dup2(p[1], 2);
		close(p[0]);
		if (r->env)
			putenv((char *)r->env);
		execv(argv[0], argv);
		_exit(127);
	}
	close(p[1]);
	while (got + 1 < len && (k = read(p[0], out + got, len - 1 - got)) > 0)
		got += (size_t)k;
	out[got] = '\0';
	while (read(p[0], &st, sizeof(st)) > 0)
		;
	close(p[0]);
	if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

static void row_check(const struct row *r)
{
	char out[16384], cmd[512];
	int rc;

	snprintf(cmd, sizeof(cmd), "%s%s%s", r->env ? r->env : "", r->env ? " " : "",
		 tool_name[r->tool]);
	for (int i = 0; r->argv[i]; i++) {
		size_t o = strlen(cmd);

		snprintf(cmd + o, sizeof(cmd) - o, " %s", r->argv[i]);
	}
	if (tool_skip[r->tool][0]) {
		CHECK_SKIP("%s: %s", cmd, tool_skip[r->tool]);
		return;
	}
	rc = run(r, out, sizeof(out));
	CHECK(rc == r->rc && (!r->want || strstr(out, r->want)) &&
		  (!r->notwant || !strstr(out, r->notwant)),
	      "%s: exit %d%s%s%s", cmd, r->rc, r->want ? ", says \"" : "", r->want ? r->want : "",
	      r->want ? "\"" : "");
	if (rc != r->rc || (r->want && !strstr(out, r->want)) ||
	    (r->notwant && strstr(out, r->notwant)))
		printf("#   exit %d, output:\n#   %s\n", rc, out);
}

/* clang-format off */
static const struct row rows[] = {
	/* upcie-perf: times */
	{ PERF, NULL, { "--bdf", "01:00.0", "--time", "1m", "--dry-run" }, 0, "time 60.000 s", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--time", "1.5m", "--dry-run" }, 0, "time 90.000 s", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--time", "500ms", "--dry-run" }, 0, "time 0.500 s", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--time", "10", "--dry-run" }, 0, "time 10.000 s", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--time=30s", "--dry-run" }, 0, "time 30.000 s", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--time", "1x" }, 2, "--time: bad value '1x'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--time", "0" }, 2, "--time: bad value '0'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--time", "-1" }, 2, "--time: bad value '-1'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--time", "1e3" }, 2, "--time: bad value '1e3'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--time", "25h" }, 2, "--time: bad value '25h'", NULL },
	/* upcie-perf: numbers and sizes */
	{ PERF, NULL, { "--bdf", "01:00.0", "--ns", "1x" }, 2, "--ns: bad value '1x'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--ns", "0" }, 2, "--ns: bad value '0'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--ns", "2", "--dry-run" }, 0, " ns 2 ", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--bs", "1G", "--dry-run" }, 0, "bs=1073741824", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--bs", "4KiB", "--dry-run" }, 0, "bs=4096 ", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--bs", "4k,128kib,1M,1MiB", "--dry-run" }, 0,
	  "bs=131072", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--bs", "2G" }, 2, "--bs: bad value '2G'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--bs", "4x" }, 2, "--bs: bad value '4x'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--bs", "4k,,8k" }, 2, "--bs: bad value '4k,,8k'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--bs", "1.5k" }, 2, "--bs: bad value '1.5k'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--size", "1G", "--dry-run" }, 0, "size 1073741824", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--size", "99999999999999999999" }, 2,
	  "--size: bad value", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--queues", "65" }, 2, "--queues: bad value '65'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--queues", "1,2", "--qd", "1,32", "--dry-run" }, 0,
	  ": 4 runs", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--qd", "0" }, 2, "--qd: bad value '0'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--mix", "101" }, 2, "--mix: bad value '101'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--pattern", "rnd" }, 2, "--pattern: bad value 'rnd'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--path", "vfoo" }, 2, "--path: bad value 'vfoo'", NULL },
	/* upcie-perf: warm-up, CPUs and threads, targets, percentiles, GPU choice */
	{ PERF, NULL, { "--bdf", "01:00.0", "--ramp", "2s", "--dry-run" }, 0, "ramp 2.000 s", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--ramp", "2x" }, 2, "--ramp: bad value '2x'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--ramp", "2h" }, 2, "--ramp: bad value '2h'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--cpus", "0", "--queues", "3", "--dry-run" }, 0,
	  "  queue 2 01:00.0/1 -> thread 0 cpu 0", "thread 1" },
	{ PERF, NULL, { "--bdf", "01:00.0", "--cpus", "0", "--queues", "63", "--dry-run" }, 0,
	  "queues=63 qd=1 bs=4096 rand read=100% targets=1 threads=1\n", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--cpus", "0", "--threads", "2", "--queues", "2",
	  "--dry-run" }, 0, "threads=2 (more threads than CPUs)", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--cpus", "0-" }, 2, "--cpus: bad value '0-'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--cpus", "0,0" }, 2, "--cpus: bad value '0,0'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--cpus", "3-1" }, 2, "--cpus: bad value '3-1'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--cpus", "1023" }, 2,
	  "--cpus: bad value '1023': want a list of CPUs this process may run on", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--threads", "0" }, 2, "--threads: bad value '0'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--bdf", "02:00.0", "--ns", "1,3", "--dry-run" }, 0,
	  "  queue 3 02:00.0/3 -> thread", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--bdf", "0000:01:00.0" }, 2,
	  "--bdf: bad value '0000:01:00.0': want each controller once", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--ns", "1,0" }, 2, "--ns: bad value '1,0'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--percentiles", "99.9,50,90", "--dry-run" }, 0,
	  "percentiles 50 90 99.9\n", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--percentiles", "0" }, 2,
	  "--percentiles: bad value '0'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--percentiles", "100.1" }, 2,
	  "--percentiles: bad value '100.1'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--percentiles", "1e2" }, 2,
	  "--percentiles: bad value '1e2'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--gpu-id", "0" }, 2, "--gpu-id and --sq-host go with --gpu",
	  NULL },
	{ PERF, NULL, { "--gpu", "null", "--gpu-id", "gpu0" }, 2, "--gpu-id: bad value 'gpu0'", NULL },
	{ PERF, NULL, { "--gpu", "null", "--gpu-id", "0000:41:00.0", "--dry-run" }, 0,
	  "gpu 0000:41:00.0", NULL },
	{ PERF, NULL, { "--gpu", "null", "--cpus", "0" }, 2, "--cpus and --threads are for the CPU mode",
	  NULL },
	{ PERF, NULL, { "--gpu", "null", "--ns", "1,2" }, 2, "GPU mode drives one controller", NULL },
	/* upcie-perf: addresses, options, help */
	{ PERF, NULL, { "--bdf=0000:01:00.0", "--dry-run" }, 0, "target 0000:01:00.0", NULL },
	{ PERF, NULL, { "--bdf", "zz" }, 2, "--bdf: bad value 'zz'", NULL },
	{ PERF, NULL, { "--gpu", "zz" }, 2, "--gpu: bad value 'zz'", NULL },
	{ PERF, NULL, { "--bdf" }, 2, "option '--bdf' requires an argument", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "--bogus" }, 2, "unrecognized option '--bogus'", NULL },
	{ PERF, NULL, { "--bdf", "01:00.0", "stray" }, 2, "argument: bad value 'stray'", NULL },
	{ PERF, NULL, { NULL }, 2, "--bdf BDF is required", NULL },
	{ PERF, NULL, { "--version" }, 0, "upcie-perf (upcie) 0.", "needs a value" },
	{ PERF, NULL, { "-h" }, 0, "usage: upcie-perf", NULL },
	{ PERF, NULL, { "--help" }, 0, "--time T", NULL },
	/* --bind of a function that is not NVMe (the root port): the library refuses, nothing moves */
	{ PERF, NULL, { "--bdf", "00:02.0", "--bind", "--time", "1" }, 1,
	  "0000:00:02.0 is not an NVMe controller (class 0x060400", "bad value" },
	{ PERF, NULL, { "--bdf", "00:02.0", "--bind", "--time", "1" }, 1,
	  "or add --bind-any-class to bind a function of another class", "bad value" },
	/* --bind-any-class: with --bind only (CPU and GPU mode); the dry run says what binding does */
	{ PERF, NULL, { "--bdf", "00:02.0", "--dry-run" }, 0, "bind no", "bind yes" },
	{ PERF, NULL, { "--bdf", "00:02.0", "--bind", "--dry-run" }, 0,
	  "bind yes, NVMe controllers only (class 0x010802)", NULL },
	{ PERF, NULL, { "--bdf", "00:02.0", "--bind", "--bind-any-class", "--dry-run" }, 0,
	  "bind yes, a function of any PCI class", NULL },
	{ PERF, NULL, { "--bdf", "00:02.0", "--bind-any-class", "--dry-run" }, 2,
	  "--bind-any-class goes with --bind", NULL },
	{ PERF, NULL, { "--gpu", "01:00.0", "--bind-any-class" }, 2,
	  "--bind-any-class goes with --bind", NULL },
	{ PERF, NULL, { "--bdf", "00:02.0", "--bind-any-class=1" }, 2,
	  "option '--bind-any-class' doesn't allow an argument", NULL },
	{ PERF, NULL, { "--help" }, 0, "--bind-any-class", NULL },
	/* accepted, then the (fake, empty) machine has no such function: exit 1, not 2 */
	{ PERF, NULL, { "--bdf", "0000:ff:1f.7", "--time", "1m", "--bs", "4KiB" }, 1, "cannot open",
	  "bad value" },

	/* upcie-served */
	{ SERVED, NULL, { "-h" }, 0, "usage: upcie-served", NULL },
	{ SERVED, NULL, { "--help" }, 0, "usage: upcie-served", NULL },
	{ SERVED, NULL, { "--version" }, 0, "upcie-served (upcie) 0.", NULL },
	{ SERVED, NULL, { NULL }, 2, "controllers to serve", NULL },
	{ SERVED, NULL, { "01:00.0", "--mode", "666", "--dry-run" }, 0, "mode 0666 ", NULL },
	{ SERVED, NULL, { "01:00.0", "--mode", "0660", "--dry-run" }, 0, "mode 0660 ", NULL },
	{ SERVED, NULL, { "01:00.0", "--mode", "8" }, 2, "--mode: bad value '8'", NULL },
	{ SERVED, NULL, { "01:00.0", "--mode", "1777" }, 2, "--mode: bad value '1777'", NULL },
	{ SERVED, NULL, { "01:00.0", "--group", "root", "--dry-run" }, 0, " group 0 ", NULL },
	{ SERVED, NULL, { "01:00.0", "--group", "0", "--dry-run" }, 0, " group 0 ", NULL },
	{ SERVED, NULL, { "01:00.0", "--group", "no-such-group-29" }, 2,
	  "--group: bad value 'no-such-group-29'", NULL },
	{ SERVED, NULL, { "01:00.0", "--allow-uid", "root", "--dry-run" }, 0, " allow-uid 0 ", NULL },
	{ SERVED, NULL, { "01:00.0", "--allow-uid", "no-such-user-29" }, 2,
	  "--allow-uid: bad value", NULL },
	{ SERVED, NULL, { "01:00.0", "--max-bytes", "1G", "--dry-run" }, 0,
	  "max-bytes 1073741824 ", NULL },
	{ SERVED, NULL, { "01:00.0", "--max-bytes", "1x" }, 2, "--max-bytes: bad value '1x'", NULL },
	{ SERVED, NULL, { "01:00.0", "--max-qp", "0" }, 2, "--max-qp: bad value '0'", NULL },
	{ SERVED, NULL, { "01:00.0", "--max-clients", "1k" }, 2, "--max-clients: bad value", NULL },
	{ SERVED, NULL, { "01:00.0", "--relay-spin-us=5", "--dry-run" }, 0, "relay-spin-us 5 ",
	  NULL },
	{ SERVED, NULL, { "--dir=/tmp/s29", "01:00.0", "--dry-run" }, 0,
	  "on /tmp/s29/0000:01:00.0.sock", NULL },
	{ SERVED, NULL, { "zz" }, 2, "controller: bad value 'zz'", NULL },
	{ SERVED, NULL, { "01:00.0", "02:00.0" }, 2, "argument: bad value '02:00.0'", NULL },
	{ SERVED, NULL, { "01:00.0,02:00.0", "--socket", "/tmp/x.sock" }, 2,
	  "--socket takes a single controller", NULL },
	{ SERVED, NULL, { "01:00.0", "--dir" }, 2, "option '--dir' requires an argument", NULL },
	{ SERVED, NULL, { "01:00.0", "--bogus" }, 2, "unrecognized option '--bogus'", NULL },
	{ SERVED, NULL, { "0000:00:06.0", "--bind", "--dir", "/tmp/s29" }, 1,
	  "0000:00:06.0 is not an NVMe controller (class 0x020000", NULL },
	{ SERVED, NULL, { "0000:00:06.0", "--bind", "--dir", "/tmp/s29" }, 1,
	  "or add --bind-any-class to bind a function of another class", NULL },
	{ SERVED, NULL, { "01:00.0", "--dry-run" }, 0, " bind 0 bind-any-class 0 ", NULL },
	{ SERVED, NULL, { "01:00.0", "--bind", "--bind-any-class", "--dry-run" }, 0,
	  " bind 1 bind-any-class 1 ", NULL },
	{ SERVED, NULL, { "01:00.0", "--bind-any-class", "--dry-run" }, 2,
	  "--bind-any-class goes with --bind", NULL },
	{ SERVED, NULL, { "--help" }, 0, "--bind-any-class", NULL },

	/* upcie-setup: usage */
	{ SETUP, NULL, { "--version" }, 0, "upcie-setup (upcie) 0.", NULL },
	{ SETUP, NULL, { "-h" }, 0, "usage: upcie-setup", NULL },
	{ SETUP, NULL, { "frobnicate" }, 2, "command: bad value 'frobnicate'", NULL },
	{ SETUP, NULL, { "doctor" }, 3, "path: vfio-type1", NULL },
	{ SETUP, NULL, { "doctor" }, 3, "paths ready (exit 3)", NULL },
	{ SETUP, NULL, { "doctor", "--json" }, 3, "{\"schema\": 2, \"paths\": [", NULL },
	{ SETUP, NULL, { "doctor", "extra" }, 2, "doctor: bad value 'extra'", NULL },
	{ SETUP, NULL, { "list", "--bogus" }, 2, "unrecognized option '--bogus'", NULL },
	{ SETUP, NULL, { "hugepages", "reserve", "10", "--size" }, 2,
	  "option '--size' requires an argument", "unknown option" },
	{ SETUP, NULL, { "hugepages", "reserve", "10", "--size", "3x" }, 2,
	  "--size: bad value '3x'", NULL },
	{ SETUP, NULL, { "hugepages", "reserve", "ten" }, 2, "reserve: bad value 'ten'", NULL },
	{ SETUP, NULL, { "hugepages", "reserve", "1", "--node", "z" }, 2, "--node: bad value 'z'",
	  NULL },
	{ SETUP, NULL, { "hugepages", "reserve", "3", "--size", "1GiB" }, 0, "1G     all", NULL },
	{ SETUP, NULL, { "hugepages", "reserve", "--size=2M", "5", "--node", "0" }, 0, "2M     0 ",
	  NULL },
	/* upcie-setup list */
	{ SETUP, NULL, { "list" }, 0, "nvme0 (nvme0n1) \"QEMU NVMe Ctrl\" sn deadbeef fw 9.2.0", NULL },
	{ SETUP, NULL, { "list" }, 0, "nvme1 (nvme1n1)", NULL },
	{ SETUP, NULL, { "list", "--nvme" }, 0, "0000:00:04.0", "0000:00:06.0" },
	{ SETUP, NULL, { "list", "--json" }, 0,
	  "\"nvme\": {\"controller\": \"nvme0\", \"namespaces\": [\"nvme0n1\"], \"model\": "
	  "\"QEMU NVMe Ctrl\", \"serial\": \"deadbeef\", \"firmware\": \"9.2.0\"}", NULL },
	{ SETUP, NULL, { "list", "--json" }, 0, "{\"schema\": 1, \"functions\": [", NULL },
	/* upcie-setup bind: class check, in-use guard, bulk bind */
	{ SETUP, NULL, { "bind", "0000:00:06.0", "uio_pci_generic" }, 1,
	  "is a Ethernet(class 020000), not an NVMe controller", NULL },
	{ SETUP, NULL, { "bind", "00:02.0", "vfio-pci", "--any-class", "--dry-run" }, 0,
	  "0000:00:02.0: would take it from pcieport and bind it to vfio-pci", NULL },
	{ SETUP, NULL, { "bind", "0000:00:04.0", "vfio-pci", "--dry-run" }, 1, "mounted", NULL },
	{ SETUP, NULL, { "bind", "0000:00:0a.0", "vfio-pci", "--dry-run" }, 0,
	  "would take it from nvme and bind it to vfio-pci", NULL },
	{ SETUP, NULL, { "bind", "0000:00:07.0", "vfio-pci" }, 0, "already bound to vfio-pci", NULL },
	{ SETUP, NULL, { "bind", "0000:00:0a.0" }, 2, "bind needs BDF and DRIVER", NULL },
	{ SETUP, NULL, { "bind", "zz", "vfio-pci" }, 2, "BDF: bad value 'zz'", NULL },
	{ SETUP, NULL, { "bind", "--all", "vfio-pci", "--dry-run" }, 0,
	  "0000:00:04.0: skipped (in use", NULL },
	{ SETUP, NULL, { "bind", "--all", "vfio-pci", "--dry-run" }, 0,
	  "2 of 5 NVMe controllers would be on vfio-pci, 3 skipped, 0 failed", NULL },
	{ SETUP, "PCI_BLOCKED=0000:00:0a.0", { "bind", "--all", "vfio-pci", "--dry-run" }, 0,
	  "0000:00:0a.0: skipped (in PCI_BLOCKED", "would take" },
	{ SETUP, "PCI_ALLOWED=00:0a.0 00:05.0", { "bind", "--all", "vfio-pci", "--dry-run" }, 0,
	  "0000:00:04.0: skipped (not in PCI_ALLOWED", NULL },
	{ SETUP, "PCI_ALLOWED=00:0a.0", { "bind", "--all", "vfio-pci", "--dry-run" }, 0,
	  "0000:00:0a.0: would take it from nvme and bind it to vfio-pci", NULL },
	{ SETUP, NULL, { "bind", "--all", "vfio-pci", "--allow", "0000:00:07.0", "--dry-run" }, 0,
	  "1 of 5 NVMe controllers would be on vfio-pci, 4 skipped", NULL },
	{ SETUP, "PCI_ALLOWED=zz", { "bind", "--all", "vfio-pci" }, 2,
	  "PCI_ALLOWED: bad value 'zz'", NULL },
	{ SETUP, NULL, { "bind", "--all", "vfio-pci", "--block", "1:2" }, 2,
	  "--block: bad value '1:2'", NULL },
	{ SETUP, NULL, { "bind", "0000:00:0a.0", "vfio-pci", "--allow", "00:0a.0" }, 2,
	  "--allow and --block go with --all", NULL },
	/* reset: nothing recorded yet; then unbind writes the driver down and reset reads it */
	{ SETUP, NULL, { "reset" }, 0, "nothing to reset", NULL },
	{ SETUP, NULL, { "reset", "0000:00:0a.0" }, 1, "no record of the driver 0000:00:0a.0 had",
	  NULL },
	{ SETUP, NULL, { "reset", "zz" }, 2, "BDF: bad value 'zz'", NULL },
	{ SETUP, NULL, { "unbind", "0000:00:0a.0", "--dry-run" }, 0,
	  "would take it from nvme (unbind)", NULL },
	{ SETUP, NULL, { "unbind", "0000:00:0a.0" }, 0, "0000:00:0a.0 unbound (was nvme)", NULL },

	/* probe_vfio_cdev: parsing only (a good BDF would start the probe) */
	{ VCDEV, NULL, { "--help" }, 0, "usage: probe_vfio_cdev BDF [--bar N]", NULL },
	{ VCDEV, NULL, { "-h" }, 0, "usage: probe_vfio_cdev", NULL },
	{ VCDEV, NULL, { "--version" }, 0, "probe_vfio_cdev (upcie) 0.", "usage" },
	{ VCDEV, NULL, { "01:00.0", "--bar", "6" }, 2, "--bar: bad value '6'", NULL },
	{ VCDEV, NULL, { "01:00.0", "--bar=1x" }, 2, "--bar: bad value '1x'", NULL },
	{ VCDEV, NULL, { "01:00.0", "--bar=-1" }, 2, "--bar: bad value '-1'", NULL },
	/* --bar=1 read, then the BDF refused: the message is about the BDF alone */
	{ VCDEV, NULL, { "--bar=1", "zz" }, 2, "BDF: bad value 'zz'", "--bar" },
	{ VCDEV, NULL, { "zz", "--bar", "5" }, 2, "BDF: bad value 'zz'", "--bar" },
	{ VCDEV, NULL, { "01:00.0", "--bar" }, 2, "option '--bar' requires an argument", NULL },
	{ VCDEV, NULL, { "01:00.0", "--bogus" }, 2, "unrecognized option '--bogus'", NULL },
	{ VCDEV, NULL, { "01:00.0", "02:00.0" }, 2, "argument: bad value '02:00.0'", NULL },
	{ VCDEV, NULL, { NULL }, 2, "BDF (a function bound to vfio-pci) is missing", NULL },

	/* probe_vfio_delegate */
	{ VDELEG, NULL, { "--help" }, 0, "usage: probe_vfio_delegate serve SOCKET BDF", NULL },
	{ VDELEG, NULL, { "--version" }, 0, "probe_vfio_delegate (upcie) 0.", "usage" },
	{ VDELEG, NULL, { NULL }, 2, "serve or receive is missing", NULL },
	{ VDELEG, NULL, { "frob", "/tmp/s29" }, 2, "command: bad value 'frob'", NULL },
	{ VDELEG, NULL, { "serve", "/tmp/s29" }, 2, "serve needs SOCKET and BDF", NULL },
	{ VDELEG, NULL, { "serve", "/tmp/s29", "zz" }, 2, "BDF: bad value 'zz'", NULL },
	{ VDELEG, NULL, { "serve", "/tmp/s29", "01:00.0", "--source", "vfio" }, 2,
	  "--source: bad value 'vfio'", NULL },
	{ VDELEG, NULL, { "serve", "/tmp/s29", "01:00.0", "--bar=6" }, 2, "--bar: bad value '6'",
	  NULL },
	{ VDELEG, NULL, { "serve", "/tmp/s29", "01:00.0", "--offset", "2" }, 2,
	  "--offset: bad value '2'", NULL },
	{ VDELEG, NULL, { "serve", "/tmp/s29", "01:00.0", "--offset", "0x1c0000000" }, 2,
	  "--offset: bad value '0x1c0000000'", NULL },
	{ VDELEG, NULL, { "serve", "/tmp/s29", "01:00.0", "--memlock", "1x" }, 2,
	  "--memlock: bad value '1x'", NULL },
	{ VDELEG, NULL, { "receive", "/tmp/s29", "--map", "1000" }, 2, "--map: bad value '1000'",
	  NULL },
	{ VDELEG, NULL, { "receive", "/tmp/s29", "--map=0" }, 2, "--map: bad value '0'", NULL },
	{ VDELEG, NULL, { "receive", "/tmp/s29", "--as", "1000:x" }, 2, "--as: bad value '1000:x'",
	  NULL },
	{ VDELEG, NULL, { "receive", "/tmp/s29", "--as=-1" }, 2, "--as: bad value '-1'", NULL },
	{ VDELEG, NULL, { "receive", "/tmp/s29", "--withhold" }, 2,
	  "--source, --bar, --offset and --withhold go with serve", NULL },
	{ VDELEG, NULL, { "serve", "/tmp/s29", "01:00.0", "--map", "4M" }, 2,
	  "--map and --as go with receive", NULL },
	/* every value in the --x=V form read, then a stray argument refused */
	{ VDELEG, NULL, { "serve", "/tmp/s29", "01:00.0", "--source=type1", "--bar=2",
	  "--offset=0x1c", "--memlock=1M", "--withhold", "stray" }, 2, "argument: bad value 'stray'",
	  "--" },
	{ VDELEG, NULL, { "receive", "/tmp/s29", "--memlock=64k", "--map=4MiB", "--as=1000:1000",
	  "stray" }, 2, "argument: bad value 'stray'", "--" },
	{ VDELEG, NULL, { "receive", "/tmp/s29", "--bogus" }, 2, "unrecognized option '--bogus'",
	  NULL },
	{ VDELEG, NULL, { "receive", "/tmp/s29", "--map" }, 2, "option '--map' requires an argument",
	  NULL },

	/* probe_dmabuf_udmabuf: no arguments */
	{ UDMABUF, NULL, { "--help" }, 0, "usage: probe_dmabuf_udmabuf", NULL },
	{ UDMABUF, NULL, { "--version" }, 0, "probe_dmabuf_udmabuf (upcie) 0.", "usage" },
	{ UDMABUF, NULL, { "stray" }, 2, "argument: bad value 'stray'", NULL },
	{ UDMABUF, NULL, { "--version=1" }, 2, "option '--version' doesn't allow an argument", NULL },
	{ UDMABUF, NULL, { "--bogus" }, 2, "unrecognized option '--bogus'", NULL },

	/* probe_dmabuf_cuda: --device only; parsing only (a good value would start the runtime) */
	{ DCUDA, NULL, { "--help" }, 0, "usage: probe_dmabuf_cuda [--device ORDINAL]", NULL },
	{ DCUDA, NULL, { "-h" }, 0, "usage: probe_dmabuf_cuda", NULL },
	{ DCUDA, NULL, { "--version" }, 0, "probe_dmabuf_cuda (upcie) 0.", "usage" },
	{ DCUDA, NULL, { "--device", "x" }, 2, "--device: bad value 'x': want a CUDA device", NULL },
	{ DCUDA, NULL, { "--device=256" }, 2, "--device: bad value '256'", NULL },
	{ DCUDA, NULL, { "--device=-1" }, 2, "--device: bad value '-1'", NULL },
	{ DCUDA, NULL, { "--device" }, 2, "option '--device' requires an argument", NULL },
	{ DCUDA, NULL, { "--device=1", "stray" }, 2, "argument: bad value 'stray'", "--device:" },
	{ DCUDA, NULL, { "--bogus" }, 2, "unrecognized option '--bogus'", NULL },

	/* probe_dmabuf_hip: --device only; parsing only (a good value would start the runtime) */
	{ DHIP, NULL, { "--help" }, 0, "usage: probe_dmabuf_hip [--device ORDINAL]", NULL },
	{ DHIP, NULL, { "-h" }, 0, "usage: probe_dmabuf_hip", NULL },
	{ DHIP, NULL, { "--version" }, 0, "probe_dmabuf_hip (upcie) 0.", "usage" },
	{ DHIP, NULL, { "--device", "x" }, 2, "--device: bad value 'x': want a HIP device", NULL },
	{ DHIP, NULL, { "--device=256" }, 2, "--device: bad value '256'", NULL },
	{ DHIP, NULL, { "--device=-1" }, 2, "--device: bad value '-1'", NULL },
	{ DHIP, NULL, { "--device" }, 2, "option '--device' requires an argument", NULL },
	{ DHIP, NULL, { "--device=1", "stray" }, 2, "argument: bad value 'stray'", "--device:" },
	{ DHIP, NULL, { "--bogus" }, 2, "unrecognized option '--bogus'", NULL },

	/* probe_iomem_cuda: one BAR source and its options; parsing only */
	{ ICUDA, NULL, { "--help" }, 0, "usage: probe_iomem_cuda (--vfio BDF | --sysfs BDF", NULL },
	{ ICUDA, NULL, { "--version" }, 0, "probe_iomem_cuda (upcie) 0.", "usage" },
	{ ICUDA, NULL, { NULL }, 2, "the BAR source is missing", NULL },
	{ ICUDA, NULL, { "--vfio", "zz" }, 2, "--vfio: bad value 'zz'", NULL },
	{ ICUDA, NULL, { "--sysfs=1:2" }, 2, "--sysfs: bad value '1:2'", NULL },
	{ ICUDA, NULL, { "--receive=" }, 2, "--receive: bad value ''", NULL },
	{ ICUDA, NULL, { "--none", "--vfio", "01:00.0" }, 2, "one BAR source", NULL },
	{ ICUDA, NULL, { "--vfio", "01:00.0", "--bar", "6" }, 2, "--bar: bad value '6'", NULL },
	{ ICUDA, NULL, { "--receive", "/tmp/s29", "--bar", "1" }, 2, "--bar goes with --vfio or --sysfs",
	  NULL },
	{ ICUDA, NULL, { "--vfio", "01:00.0", "--offset", "2" }, 2, "--offset: bad value '2'", NULL },
	{ ICUDA, NULL, { "--vfio", "01:00.0", "--offset", "0x1c0000000" }, 2,
	  "--offset: bad value '0x1c0000000'", NULL },
	{ ICUDA, NULL, { "--none", "--device", "1x" }, 2, "--device: bad value '1x'", NULL },
	{ ICUDA, NULL, { "--none", "--as", "1000:x" }, 2, "--as: bad value '1000:x'", NULL },
	{ ICUDA, NULL, { "--none", "--as=-1" }, 2, "--as: bad value '-1'", NULL },
	{ ICUDA, NULL, { "--none", "--offset" }, 2, "option '--offset' requires an argument", NULL },
	{ ICUDA, NULL, { "--none", "--bogus" }, 2, "unrecognized option '--bogus'", NULL },
	/* every value in the --x=V form read, then a stray argument refused */
	{ ICUDA, NULL, { "--sysfs=0000:01:00.0", "--bar=2", "--offset=0x1c", "--device=0", "--self-read",
	  "--as=1000:1000", "stray" }, 2, "argument: bad value 'stray'", ": bad value '0" },

	/* probe_iomem_hip: one BAR source and its options; parsing only */
	{ IHIP, NULL, { "--help" }, 0, "usage: probe_iomem_hip (--vfio BDF | --sysfs BDF", NULL },
	{ IHIP, NULL, { "--version" }, 0, "probe_iomem_hip (upcie) 0.", "usage" },
	{ IHIP, NULL, { NULL }, 2, "the BAR source is missing", NULL },
	{ IHIP, NULL, { "--vfio", "zz" }, 2, "--vfio: bad value 'zz'", NULL },
	{ IHIP, NULL, { "--sysfs=1:2" }, 2, "--sysfs: bad value '1:2'", NULL },
	{ IHIP, NULL, { "--receive=" }, 2, "--receive: bad value ''", NULL },
	{ IHIP, NULL, { "--none", "--vfio", "01:00.0" }, 2, "one BAR source", NULL },
	{ IHIP, NULL, { "--vfio", "01:00.0", "--bar", "6" }, 2, "--bar: bad value '6'", NULL },
	{ IHIP, NULL, { "--receive", "/tmp/s29", "--bar", "1" }, 2, "--bar goes with --vfio or --sysfs",
	  NULL },
	{ IHIP, NULL, { "--vfio", "01:00.0", "--offset", "2" }, 2, "--offset: bad value '2'", NULL },
	{ IHIP, NULL, { "--vfio", "01:00.0", "--offset", "0x1c0000000" }, 2,
	  "--offset: bad value '0x1c0000000'", NULL },
	{ IHIP, NULL, { "--none", "--device", "1x" }, 2, "--device: bad value '1x'", NULL },
	{ IHIP, NULL, { "--none", "--as", "1000:x" }, 2, "--as: bad value '1000:x'", NULL },
	{ IHIP, NULL, { "--none", "--as=-1" }, 2, "--as: bad value '-1'", NULL },
	{ IHIP, NULL, { "--none", "--offset" }, 2, "option '--offset' requires an argument", NULL },
	{ IHIP, NULL, { "--none", "--bogus" }, 2, "unrecognized option '--bogus'", NULL },
	/* every value in the --x=V form read, then a stray argument refused */
	{ IHIP, NULL, { "--sysfs=0000:01:00.0", "--bar=2", "--offset=0x1c", "--device=0", "--self-read",
	  "--as=1000:1000", "stray" }, 2, "argument: bad value 'stray'", ": bad value '0" },
};

/*
 * After the checks that --bind without --bind-any-class moved nothing: with it, the class check
 * lets the root port through to the bind itself (the fake machine's pcieport never lets go: exit
 * 1, driver_override written), and the NIC through to the in-use guard (its route is up: refused,
 * nothing written).
 */
static const struct row rows_any_class[] = {
	{ PERF, NULL, { "--bdf", "00:02.0", "--bind", "--bind-any-class", "--time", "1" }, 1,
	  "0000:00:02.0: binding to vfio-pci failed", "is not an NVMe controller" },
	{ SERVED, NULL, { "0000:00:06.0", "--bind", "--bind-any-class", "--dir", "/tmp/s29" }, 1,
	  "eth0 is up and carries the default route", "is not an NVMe controller" },
};

/* After the unbind above, in order: the record, and reset reading it. */
static const struct row rows_after[] = {
	{ SETUP, NULL, { "reset", "--dry-run" }, 0, "0000:00:0a.0: already bound to nvme", NULL },
	{ SETUP, NULL, { "reset", "--all", "0000:00:0a.0" }, 2, "BDFs or --all, not both", NULL },
	{ SETUP, NULL, { "reset", "0000:00:0a.0" }, 0, "0000:00:0a.0: already bound to nvme", NULL },
	{ SETUP, NULL, { "reset" }, 0, "nothing to reset", NULL },
};
/* clang-format on */

/*
 * A CUDA or HIP probe: built only where meson found nvcc / hipcc, and it starts only where its
 * runtime's library loads (libcuda comes with the NVIDIA driver). Else tool_skip says why.
 */
static void gpu_probe_usable(int t)
{
	const struct row ver = { t, NULL, { "--version" }, 0, NULL, NULL };
	char out[4096], *nl, *why;
	int rc;

	if (access(tool_path[t], X_OK)) {
		snprintf(tool_skip[t], sizeof(tool_skip[t]), "%s was not built (meson found no %s)",
			 tool_name[t], t == DCUDA || t == ICUDA ? "nvcc" : "hipcc");
		return;
	}
	rc = run(&ver, out, sizeof(out));
	if (rc == 0 && strstr(out, "(upcie)"))
		return;
	why = strstr(out, "error while loading shared libraries: "); /* the loader's words */
	why = why ? why + 38 : out;
	nl = strchr(why, '\n');
	if (nl)
		*nl = '\0';
	snprintf(tool_skip[t], sizeof(tool_skip[t]), "%s cannot start here (exit %d: %.160s)",
		 tool_name[t], rc, why);
}

static void read_file(const char *rel, char *buf, size_t len)
{
	char p[512];
	FILE *f;
	size_t n = 0;

	snprintf(p, sizeof(p), "%s/%s", fm_root, rel);
	buf[0] = '\0';
	f = fopen(p, "r");
	if (!f)
		return;
	n = fread(buf, 1, len - 1, f);
	buf[n] = '\0';
	fclose(f);
}

int main(int argc, char **argv)
{
	char state[256], buf[512];

	if (argc != 4 && argc != 1 + NARGS) {
		fprintf(stderr,
			"usage: %s UPCIE-PERF UPCIE-SERVED UPCIE-SETUP [PROBE_VFIO_CDEV "
			"PROBE_VFIO_DELEGATE PROBE_DMABUF_UDMABUF]\n",
			argv[0]);
		return 2;
	}
	for (int i = 0; i < NTOOLS; i++) {
		const char *slash = strrchr(argv[1], '/');

		if (i + 1 < argc)
			snprintf(tool_path[i], sizeof(tool_path[i]), "%s", argv[i + 1]);
		else /* the probes are built beside the tools (tools/meson.build) */
			snprintf(tool_path[i], sizeof(tool_path[i]), "%.*s%s",
				 slash ? (int)(slash - argv[1] + 1) : 0, argv[1], tool_name[i]);
		if (i < NARGS)
			CHECK(access(tool_path[i], X_OK) == 0, "%s is built: %s", tool_name[i],
			      tool_path[i]);
		else
			gpu_probe_usable(i);
	}
	fm_machine();
	setenv("UPCIE_DOCTOR_NO_CUDA", "1", 1);
	setenv("UPCIE_DOCTOR_NO_HIP", "1", 1);
	snprintf(state, sizeof(state), "%s/root", fm_root); /* the doctor's /dev, /lib/modules */
	setenv("UPCIE_DOCTOR_ROOT", state, 1);
	/* the kernel nvme driver's identity files of 04.0 and 05.0 (a multipath path) */
	fm_put(FM_DEV "0000:00:04.0/nvme/nvme0/model",
	       "QEMU NVMe Ctrl                          \n");
	fm_put(FM_DEV "0000:00:04.0/nvme/nvme0/serial", "deadbeef            \n");
	fm_put(FM_DEV "0000:00:04.0/nvme/nvme0/firmware_rev", "9.2.0   \n");
	fm_mkdirs(FM_DEV "0000:00:04.0/nvme/nvme0/nvme0n1");
	fm_put(FM_DEV "0000:00:05.0/nvme/nvme1/model", "QEMU NVMe Ctrl\n");
	/* what a bind would write first: the --bind rows check nothing was */
	fm_put(FM_DEV "0000:00:02.0/driver_override", "");
	fm_put(FM_DEV "0000:00:06.0/driver_override", "");
	/* 0a.0: an idle NVMe controller with the nvme driver */
	fm_func("0000:00:0a.0", "0x1b36\n", "0x0010\n", "0x010802\n", "nvme", 7);
	/* hugepage pools */
	fm_put("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "0\n");
	fm_put("sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "0\n");
	fm_put("sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", "0\n");
	fm_put("sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages", "0\n");
	fm_put("sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages", "0\n");
	fm_put("sys/devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages", "0\n");
	snprintf(state, sizeof(state), "%s/run/setup-drivers", fm_root);
	setenv("UPCIE_SETUP_STATE", state, 1);
	fm_rm("run/setup-drivers"); /* reset starts with nothing written down */

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		row_check(&rows[i]);
	read_file("sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", buf, sizeof(buf));
	CHECK(!strcmp(buf, "3\n"), "hugepages reserve 3 --size 1GiB wrote 3 to the 1 GiB pool");
	read_file("sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages", buf,
		  sizeof(buf));
	CHECK(!strcmp(buf, "5\n"), "hugepages reserve 5 --size=2M --node 0 wrote 5 to node 0");
	read_file(FM_DEV "0000:00:02.0/driver_override", buf, sizeof(buf));
	CHECK(!buf[0], "upcie-perf --bind left the root port's driver_override alone (%s)", buf);
	read_file("sys/bus/pci/drivers/pcieport/unbind", buf, sizeof(buf));
	CHECK(!buf[0], "... and did not unbind it from pcieport (%s)", buf);
	read_file(FM_DEV "0000:00:06.0/driver_override", buf, sizeof(buf));
	CHECK(!buf[0], "upcie-served --bind left the NIC's driver_override alone (%s)", buf);
	for (size_t i = 0; i < sizeof(rows_any_class) / sizeof(rows_any_class[0]); i++)
		row_check(&rows_any_class[i]);
	read_file(FM_DEV "0000:00:02.0/driver_override", buf, sizeof(buf));
	CHECK(!strcmp(buf, "vfio-pci"),
	      "upcie-perf --bind --bind-any-class went on to bind the root port to vfio-pci (%s)",
	      buf);
	read_file(FM_DEV "0000:00:06.0/driver_override", buf, sizeof(buf));
	CHECK(!buf[0], "upcie-served --bind --bind-any-class: the in-use guard kept the NIC (%s)",
	      buf);
	read_file("sys/bus/pci/drivers/nvme/unbind", buf, sizeof(buf));
	CHECK(!strcmp(buf, "0000:00:0a.0"), "unbind wrote the address to the driver's unbind");
	read_file("run/setup-drivers", buf, sizeof(buf));
	CHECK(strstr(buf, "\n0000:00:0a.0 nvme\n") != NULL, "unbind wrote down 0a.0 had nvme: %s",
	      buf);
	for (size_t i = 0; i < sizeof(rows_after) / sizeof(rows_after[0]); i++) {
		row_check(&rows_after[i]);
		if (i == 0) {
			read_file("run/setup-drivers", buf, sizeof(buf));
			CHECK(strstr(buf, "0000:00:0a.0 nvme") != NULL,
			      "reset --dry-run keeps the record");
		}
	}
	read_file("run/setup-drivers", buf, sizeof(buf));
	CHECK(!strstr(buf, "0000:00:0a.0"),
	      "reset of a function back on its driver drops the record");
	fm_cleanup();
	return check_done();
}
