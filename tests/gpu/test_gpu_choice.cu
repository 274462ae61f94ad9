// SPDX-License-Identifier: BSD-3-Clause
/*
 * test_gpu_choice: the CUDA provider's GPU choice (gpu/dev_cuda.h, gpu/heap_cuda.h) under
 * CUDA_VISIBLE_DEVICES, by ordinal and by PCI address. The GPUs and their UUIDs are read from the
 * NVIDIA driver's /proc/driver/nvidia/gpus/<bus id>/information (not from CUDA, so the check does
 * not grade CUDA with itself). Each setting of the environment runs in a child process (CUDA
 * reads it once, at cuInit, and must not be initialised before a fork): the child reports what
 * the provider said, the parent checks it. With one GPU the reordering cases SKIP with that
 * reason. TAP output, "N passed, N failed" last.
 */
#include <upcie/gpu/dev_cuda.h>
#include <upcie/gpu/heap_cuda.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define MAXG 16

static char bus[MAXG][32], uuid[MAXG][64];
static int ngpu, nskip;

#define SKIP_(...)                                                                                 \
	do {                                                                                       \
		nskip++;                                                                           \
		CHECK_SKIP(__VA_ARGS__);                                                           \
	} while (0)

static int cmp_str(const void *a, const void *b)
{
	return strcmp((const char *)a, (const char *)b);
}

/* The driver's own list: bus ids (sorted, the PCI_BUS_ID order) and UUIDs. */
static void read_proc(void)
{
	DIR *d = opendir("/proc/driver/nvidia/gpus");
	struct dirent *de;
	char tmp[MAXG][32];
	int n = 0;

	if (!d)
		return;
	while ((de = readdir(d)) && n < MAXG) {
		struct upcie_pci_bdf b;

		if (de->d_name[0] == '.' || upcie_pci_bdf_parse(de->d_name, &b))
			continue;
		upcie_pci_bdf_format(&b, tmp[n], sizeof(tmp[n]));
		n++;
	}
	closedir(d);
	qsort(tmp, (size_t)n, sizeof(tmp[0]), cmp_str);
	for (int i = 0; i < n; i++) {
		char path[128], line[256];
		FILE *f;

		memcpy(bus[i], tmp[i], sizeof(bus[i]));
		snprintf(path, sizeof(path), "/proc/driver/nvidia/gpus/%s/information", bus[i]);
		f = fopen(path, "r");
		if (!f)
			continue;
		while (fgets(line, sizeof(line), f))
			if (!strncmp(line, "GPU UUID:", 9))
				sscanf(line + 9, " %63s", uuid[i]);
		fclose(f);
	}
	ngpu = n;
}

/* What a child found, one "key=value" line each. */
struct answer {
	int open0;	   /* upcie_gpu_cuda_dev_open(0) */
	char pci0[32];	   /* its GPU */
	int by[MAXG];	   /* upcie_gpu_cuda_ordinal_by_pci(bus[i]): ordinal or -errno */
	int by_absent;	   /* of an address no GPU has */
	int by_bad;	   /* of a malformed one */
	int heap_err;	   /* upcie_gpu_cuda_open() with gpu_pci = heap_pci */
	char heap_gpu[32]; /* the GPU it opened */
};

static char last_err[256];

static void keep_err(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)ctx;
	if (level == UPCIE_LOG_ERROR)
		snprintf(last_err, sizeof(last_err), "%s", msg);
}

static void child(int fd, const char *heap_pci)
{
	struct upcie_gpu_cuda_dev d;
	struct upcie_gpu_cuda gpu;
	struct upcie_gpu_cuda_opts o;
	FILE *f = fdopen(fd, "w");
	int ord, err;

	upcie_log_set_handler(keep_err, NULL);
	err = upcie_gpu_cuda_dev_open(&d, 0);
	fprintf(f, "open0=%d\npci0=%s\n", err, err ? "-" : d.pci_name);
	upcie_gpu_cuda_dev_close(&d);
	for (int i = 0; i < ngpu; i++) {
		err = upcie_gpu_cuda_ordinal_by_pci(bus[i], &ord);
		fprintf(f, "by%d=%d\n", i, err ? err : ord);
	}
	err = upcie_gpu_cuda_ordinal_by_pci("0000:ff:1f.7", &ord);
	fprintf(f, "absent=%d\n", err ? err : ord);
	err = upcie_gpu_cuda_ordinal_by_pci("gpu0", &ord);
	fprintf(f, "bad=%d\n", err ? err : ord);
	if (heap_pci) {
		memset(&o, 0, sizeof(o));
		o.xlate = UPCIE_GPU_CUDA_XLATE_OFFSET;
		o.device_heap_size = 64u << 20;
		o.host_heap_size = 2u << 20;
		o.gpu_pci = heap_pci;
		err = upcie_gpu_cuda_open(&gpu, &o);
		fprintf(f, "heap=%d\nheapgpu=%s\n", err,
			err ? "-" : upcie_gpu_cuda_device(&gpu)->pci_name);
		if (err)
			fprintf(f, "# the provider said: %s\n", last_err);
		if (!err)
			upcie_gpu_cuda_close(&gpu);
	}
	fclose(f);
	_exit(0);
}

/* Run the child under CUDA_VISIBLE_DEVICES=vis (NULL: unset), CUDA_DEVICE_ORDER=PCI_BUS_ID. */
static int run(const char *vis, const char *heap_pci, struct answer *a)
{
	int p[2], st = 0;
	pid_t pid;
	FILE *f;
	char line[256];

	memset(a, 0, sizeof(*a));
	a->open0 = a->by_absent = a->by_bad = a->heap_err = 1;
	for (int i = 0; i < MAXG; i++)
		a->by[i] = 1;
	if (pipe(p))
		return -1;
	pid = fork();
	if (pid == 0) {
		close(p[0]);
		setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
		if (vis)
			setenv("CUDA_VISIBLE_DEVICES", vis, 1);
		else
			unsetenv("CUDA_VISIBLE_DEVICES");
		child(p[1], heap_pci);
	}
	close(p[1]);
	f = fdopen(p[0], "r");
	while (f && fgets(line, sizeof(line), f)) {
		int i, v;

		line[strcspn(line, "\n")] = '\0';
		if (line[0] == '#')
			printf("%s\n", line);
		else if (sscanf(line, "open0=%d", &v) == 1)
			a->open0 = v;
		else if (!strncmp(line, "pci0=", 5))
			snprintf(a->pci0, sizeof(a->pci0), "%.31s", line + 5);
		else if (sscanf(line, "by%d=%d", &i, &v) == 2 && i >= 0 && i < MAXG)
			a->by[i] = v;
		else if (sscanf(line, "absent=%d", &v) == 1)
			a->by_absent = v;
		else if (sscanf(line, "bad=%d", &v) == 1)
			a->by_bad = v;
		else if (sscanf(line, "heap=%d", &v) == 1)
			a->heap_err = v;
		else if (!strncmp(line, "heapgpu=", 8))
			snprintf(a->heap_gpu, sizeof(a->heap_gpu), "%.31s", line + 8);
	}
	if (f)
		fclose(f);
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void)
{
	struct answer a;
	char two[160], past[16];
	int last;

	read_proc();
	if (!ngpu) {
		printf(
		    "1..0 # SKIP no NVIDIA GPU in /proc/driver/nvidia/gpus\n0 passed, 0 failed\n");
		return 0;
	}
	last = ngpu - 1;
	printf("# %d GPU(s): first %s (%s), last %s (%s)\n", ngpu, bus[0], uuid[0], bus[last],
	       uuid[last]);

	/* all visible, in PCI order */
	CHECK_EQ(run(NULL, bus[last], &a), 0, "child without CUDA_VISIBLE_DEVICES ran");
	CHECK(a.open0 == 0 && !strcmp(a.pci0, bus[0]),
	      "ordinal 0 is the first GPU by PCI address "
	      "(%s; got %d, %s)",
	      bus[0], a.open0, a.pci0);
	for (int i = 0; i < ngpu; i++)
		CHECK_EQ(a.by[i], i, "%s is ordinal %d", bus[i], i);
	CHECK_EQ(a.by_absent, -ENODEV, "an address no GPU has: -ENODEV");
	CHECK_EQ(a.by_bad, -EINVAL, "a malformed address: -EINVAL");
	CHECK(a.heap_err == 0 && !strcmp(a.heap_gpu, bus[last]),
	      "the provider opened by PCI address is on %s (%d, %s)", bus[last], a.heap_err,
	      a.heap_gpu);

	/* only the last one, named by UUID */
	CHECK_EQ(run(uuid[last], bus[0], &a), 0, "child with CUDA_VISIBLE_DEVICES=%s ran",
		 uuid[last]);
	CHECK(a.open0 == 0 && !strcmp(a.pci0, bus[last]),
	      "CUDA_VISIBLE_DEVICES=<UUID of %s>: ordinal 0 is that GPU (%d, %s)", bus[last],
	      a.open0, a.pci0);
	CHECK_EQ(a.by[last], 0, "and its PCI address is ordinal 0");
	if (ngpu > 1) {
		CHECK_EQ(a.by[0], -ENODEV,
			 "a GPU hidden by CUDA_VISIBLE_DEVICES: -ENODEV by address");
		CHECK_EQ(a.heap_err, -ENODEV, "the provider asked for the hidden GPU: -ENODEV");
	} else {
		SKIP_("a GPU hidden by CUDA_VISIBLE_DEVICES, by address: one GPU on this machine");
		CHECK(a.heap_err == 0 && !strcmp(a.heap_gpu, bus[0]),
		      "the provider by PCI address under a UUID filter (%d, %s)", a.heap_err,
		      a.heap_gpu);
	}

	/* an index past the end: nothing visible */
	snprintf(past, sizeof(past), "%d", ngpu);
	CHECK_EQ(run(past, bus[0], &a), 0, "child with CUDA_VISIBLE_DEVICES=%s ran", past);
	CHECK_EQ(a.open0, -ENODEV, "CUDA_VISIBLE_DEVICES=%s (no such GPU): ordinal 0 is -ENODEV",
		 past);
	CHECK_EQ(a.by[0], -ENODEV, "and every address is -ENODEV");
	CHECK_EQ(a.heap_err, -ENODEV, "and the provider by address is -ENODEV");

	/* reversed order */
	if (ngpu > 1) {
		snprintf(two, sizeof(two), "%d,0", last);
		CHECK_EQ(run(two, bus[0], &a), 0, "child with CUDA_VISIBLE_DEVICES=%s ran", two);
		CHECK(a.open0 == 0 && !strcmp(a.pci0, bus[last]),
		      "CUDA_VISIBLE_DEVICES=%s: ordinal 0 is %s (%s)", two, bus[last], a.pci0);
		CHECK_EQ(a.by[0], 1, "and %s is ordinal 1", bus[0]);
		CHECK(a.heap_err == 0 && !strcmp(a.heap_gpu, bus[0]),
		      "the provider by address follows the GPU, not the order (%s)", a.heap_gpu);
	} else {
		SKIP_("CUDA_VISIBLE_DEVICES reordering: needs two GPUs, this machine has one");
	}
	{
		int failed = check_failed_, n = check_n_;

		check_done();
		printf("%d passed, %d failed, %d skipped\n", n - failed - nskip, failed, nskip);
		return failed ? 1 : 0;
	}
}
