/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * P2P placement check: the bus addresses that GPU memory is handed to a controller with must lie
 * inside the GPU's BAR window (BAR1 on NVIDIA, the VRAM aperture on AMD) and not in system RAM.
 *
 * Why: an exporter may satisfy a dma-buf attach by migrating or pinning the buffer somewhere else
 * (amdgpu moves a buffer it cannot map through the BAR into GTT, host memory), and the importer
 * then gets valid, DMA-able addresses of host pages. The controller's writes land there, "the data
 * never appears in VRAM", and nothing fails. The addresses are the only evidence, so every segment
 * is checked against two sources: the GPU's PCI resource (sysfs "resource", the BAR's CPU physical
 * range) and the top-level "System RAM" ranges of /proc/iomem. A segment fails when it leaves the
 * BAR window or touches system RAM; the error names which, and what the exporter did.
 *
 * Addresses are bus (CPU physical) addresses, as the dma-buf import module resolves them; an IOVA
 * from an IOMMU mapping is not one and is not checked here (the IOMMU layer maps known physical
 * pages, mem/ and vfio/). Reading /proc/iomem needs CAP_SYS_ADMIN: without it the kernel prints
 * zeros, which upcie_gpu_p2p_sysram_load() reports as -EPERM rather than as "no system RAM".
 * Plain C, no GPU runtime: gpu/heap_cuda.h calls it for the IMPORT heap and registrations; tests
 * call it with addresses of their own making. UPCIE_SYSFS_ROOT moves sysfs; UPCIE_IOMEM_PATH
 * moves /proc/iomem (unit tests point both at fake trees).
 */
#ifndef UPCIE_GPU_P2P_CHECK_H
#define UPCIE_GPU_P2P_CHECK_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>
#include <upcie/pci/bdf.h>
#include <upcie/pci/func.h>

#define UPCIE_GPU_P2P_SYSRAM_MAX 128

/* The GPU's BAR window: CPU physical range of one PCI resource. */
struct upcie_gpu_p2p_window {
	uint64_t start, size;
	int bar;
	char pci_name[32];
};

/* System RAM ranges from /proc/iomem (top level only: children are parts of them). */
struct upcie_gpu_p2p_sysram {
	uint64_t start[UPCIE_GPU_P2P_SYSRAM_MAX], end[UPCIE_GPU_P2P_SYSRAM_MAX]; /* inclusive */
	unsigned n;
};

/* Fill *w with BAR `bar` of the PCI function `pci_name` ("dddd:bb:dd.f"). 0, -ENODEV, -errno. */
static inline int upcie_gpu_p2p_window_read(const char *pci_name, int bar,
					    struct upcie_gpu_p2p_window *w)
{
	struct upcie_pci_resource res[UPCIE_PCI_NUM_RES];
	struct upcie_pci_bdf bdf;
	int err;

	if (!pci_name || !w || bar < 0 || bar >= UPCIE_PCI_NUM_BARS)
		return UPCIE_FAIL(-EINVAL, "gpu: p2p check: bad arguments");
	memset(w, 0, sizeof(*w));
	err = upcie_pci_bdf_parse(pci_name, &bdf);
	if (err)
		return err;
	err = upcie_pci_func_resources(&bdf, res);
	if (err)
		return UPCIE_FAIL(err, "gpu: p2p check: %s: cannot read its PCI resources: %s",
				  pci_name, strerror(-err));
	if (!res[bar].size)
		return UPCIE_FAIL(-ENODEV, "gpu: p2p check: %s has no BAR %d", pci_name, bar);
	w->start = res[bar].start;
	w->size = res[bar].size;
	w->bar = bar;
	snprintf(w->pci_name, sizeof(w->pci_name), "%s", pci_name);
	return 0;
}

/*
 * Load the top-level "System RAM" ranges of /proc/iomem ($UPCIE_IOMEM_PATH if set). 0; -EPERM
 * (the kernel hid the addresses: every range read as 0-0, no CAP_SYS_ADMIN); -ENOSPC (more
 * ranges than UPCIE_GPU_P2P_SYSRAM_MAX); -ENOENT (no System RAM listed at all); -errno.
 */
static inline int upcie_gpu_p2p_sysram_load(struct upcie_gpu_p2p_sysram *s)
{
	const char *path = getenv("UPCIE_IOMEM_PATH");
	char line[256];
	bool hidden = true;
	unsigned lines = 0;
	FILE *f;

	if (!s)
		return UPCIE_FAIL(-EINVAL, "gpu: p2p check: bad arguments");
	memset(s, 0, sizeof(*s));
	if (!path)
		path = "/proc/iomem";
	f = fopen(path, "re");
	if (!f) {
		int err = -errno;

		return UPCIE_FAIL(err, "gpu: p2p check: cannot open %s: %s", path, strerror(-err));
	}
	while (fgets(line, sizeof(line), f)) {
		unsigned long long a, b;
		char *name;

		if (sscanf(line, "%llx-%llx", &a, &b) != 2)
			continue;
		lines++;
		if (a || b)
			hidden = false;
		/* Top level: no indentation. Children (Kernel code, ...) lie inside a parent. */
		if (line[0] == ' ')
			continue;
		name = strstr(line, " : ");
		if (!name || strncmp(name + 3, "System RAM", 10))
			continue;
		if (s->n == UPCIE_GPU_P2P_SYSRAM_MAX) {
			fclose(f);
			return UPCIE_FAIL(-ENOSPC, "gpu: p2p check: more than %d System RAM ranges",
					  UPCIE_GPU_P2P_SYSRAM_MAX);
		}
		s->start[s->n] = a;
		s->end[s->n] = b;
		s->n++;
	}
	fclose(f);
	if (lines && hidden)
		return UPCIE_FAIL(-EPERM,
				  "gpu: p2p check: %s shows every address as 0 (needs "
				  "CAP_SYS_ADMIN): placement cannot be checked",
				  path);
	if (!s->n)
		return UPCIE_FAIL(-ENOENT, "gpu: p2p check: %s lists no System RAM", path);
	return 0;
}

/* Whether [a, a + len) overlaps system RAM (the index of the range in *idx). */
static inline bool upcie_gpu_p2p_in_sysram(const struct upcie_gpu_p2p_sysram *s, uint64_t a,
					   uint64_t len, unsigned *idx)
{
	uint64_t last = a + len - 1;

	for (unsigned i = 0; i < s->n; i++)
		if (a <= s->end[i] && last >= s->start[i]) {
			if (idx)
				*idx = i;
			return true;
		}
	return false;
}

/*
 * Check one segment of `len` bytes at bus address `a`, which `what` names in messages. 0, or
 * -EXDEV (in system RAM, or outside the window), -EINVAL (empty or wrapping).
 */
static inline int upcie_gpu_p2p_check_range(const struct upcie_gpu_p2p_window *w,
					    const struct upcie_gpu_p2p_sysram *s, uint64_t a,
					    uint64_t len, const char *what)
{
	unsigned i = 0;

	if (!len || a + len - 1 < a)
		return UPCIE_FAIL(-EINVAL, "gpu: p2p check: %s: empty or wrapping segment", what);
	if (upcie_gpu_p2p_in_sysram(s, a, len, &i))
		return UPCIE_FAIL(-EXDEV,
				  "gpu: p2p check: %s: segment 0x%" PRIx64 " + 0x%" PRIx64
				  " is system RAM (0x%" PRIx64 "-0x%" PRIx64
				  " in /proc/iomem), not GPU memory: the exporter placed the "
				  "buffer in host memory (a GTT or staging placement), so a "
				  "controller's writes would never reach VRAM",
				  what, a, len, s->start[i], s->end[i]);
	if (a < w->start || a - w->start >= w->size || len > w->size - (a - w->start))
		return UPCIE_FAIL(-EXDEV,
				  "gpu: p2p check: %s: segment 0x%" PRIx64 " + 0x%" PRIx64
				  " lies outside BAR%d of %s (0x%" PRIx64 " + 0x%" PRIx64
				  "): the exporter handed out addresses that are not this GPU's "
				  "memory window",
				  what, a, len, w->bar, w->pci_name, w->start, w->size);
	return 0;
}

/*
 * Check every segment of `mem` (each LUT granule, or the one arithmetic range) against the
 * window and system RAM. 0 or the first segment's error (-EXDEV, -EINVAL).
 */
static inline int upcie_gpu_p2p_check_dmamem(const struct upcie_gpu_p2p_window *w,
					     const struct upcie_gpu_p2p_sysram *s,
					     const struct upcie_dmamem *mem, const char *what)
{
	if (!w || !s || !mem || !mem->size)
		return UPCIE_FAIL(-EINVAL, "gpu: p2p check: bad arguments");
	if (!mem->lut)
		return upcie_gpu_p2p_check_range(w, s, mem->iova, mem->size, what);
	for (size_t i = 0; i < mem->nlut; i++) {
		uint64_t g = UINT64_C(1) << mem->granule_shift;
		uint64_t len = i + 1 < mem->nlut ? g : mem->size - (uint64_t)i * g;
		int err = upcie_gpu_p2p_check_range(w, s, mem->lut[i], len, what);

		if (err)
			return err;
	}
	return 0;
}

#endif /* UPCIE_GPU_P2P_CHECK_H */
