/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest test for mem/: hugepage memory and the physical-address LUT that uio drivers hand to the
 * device, checked page by page against /proc/self/pagemap; the unprivileged view (-EPERM, never a
 * zero address); the error that names the fix when no hugepages are reserved; hugetlbfs files;
 * and a granule-aware heap over the LUT memory. Prints TAP.
 *
 * Usage: t_mem HUGETLBFS_MOUNT   (the case script mounts hugetlbfs there)
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <upcie/mem/heap.h>
#include <upcie/mem/hugepage.h>

#include "tap.h"

static char last_err[512];

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	snprintf(last_err, sizeof(last_err), "%s", msg);
	fprintf(stderr, "upcie: %s\n", msg);
}

/* Every 4 KiB page of the dmamem: the LUT's address equals what pagemap says. */
static int lut_matches_pagemap(const struct upcie_dmamem *mem, uint64_t *checked)
{
	*checked = 0;
	for (uint64_t off = 0; off < mem->size; off += 4096) {
		uint64_t pa = 0, iova = 0;

		if (upcie_pagemap_phys((char *)mem->vaddr + off, &pa) ||
		    upcie_dmamem_iova(mem, off, &iova) || pa != iova) {
			printf("# offset 0x%llx: pagemap 0x%llx, LUT 0x%llx\n",
			       (unsigned long long)off, (unsigned long long)pa,
			       (unsigned long long)iova);
			return 0;
		}
		(*checked)++;
	}
	return 1;
}

static void check_unprivileged(void)
{
	int status = 0;
	pid_t pid = fork();

	if (pid == 0) {
		static volatile char page[4096] __attribute__((aligned(4096)));
		uint64_t pa = 0;
		int err;

		page[0] = 1;
		if (setresgid(65534, 65534, 65534) || setresuid(65534, 65534, 65534))
			_exit(3);
		upcie_log_set_level(UPCIE_LOG_NONE);
		err = upcie_pagemap_phys((const void *)page, &pa);
		_exit(err == -EPERM && pa == 0 ? 0 : err == 0 ? 1 : 2);
	}
	waitpid(pid, &status, 0);
	TAP(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	    "unprivileged pagemap read is -EPERM, not address 0 (child status %d)",
	    WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

int main(int argc, char **argv)
{
	struct upcie_hugepage_opts opts;
	struct upcie_dmamem mem;
	struct upcie_heap heap;
	uint64_t total = 0, nfree = 0, checked;
	int err;

	upcie_log_set_handler(capture, NULL);
	memset(&opts, 0, sizeof(opts));

	err = upcie_hugepages_reserve(2048, UPCIE_HUGEPAGE_NODE_ANY, 0);
	TAP(err == 0, "release the 2 MiB pool (%d)", err);
	upcie_log_set_level(UPCIE_LOG_ERROR);
	err = upcie_dmamem_hugepage_lut(&mem, 4u << 20, &opts);
	TAP(err == -ENOMEM && strstr(last_err, "upcie-setup hugepages reserve"),
	    "no hugepages reserved: -ENOMEM naming the fix (%d: %s)", err, last_err);

	err = upcie_hugepages_reserve(2048, UPCIE_HUGEPAGE_NODE_ANY, 32);
	TAP(err == 0, "reserve 32 x 2 MiB (%d)", err);
	err = upcie_hugepages_get(2048, UPCIE_HUGEPAGE_NODE_ANY, &total, &nfree);
	TAP(err == 0 && total == 32 && nfree == 32, "pool reads back 32 total, 32 free (%llu/%llu)",
	    (unsigned long long)total, (unsigned long long)nfree);
	err = upcie_hugepages_get(2048, 0, &total, &nfree);
	TAP(err == 0 && total == 32, "NUMA node 0 holds them (%llu)", (unsigned long long)total);

	/* memfd hugepages, 16 MiB: 8 LUT entries of 2 MiB */
	err = upcie_dmamem_hugepage_lut(&mem, 16u << 20, &opts);
	TAP(err == 0 && mem.lut && mem.nlut == 8 && mem.granule_shift == 21,
	    "memfd hugepage LUT dmamem (%d, %zu entries)", err, mem.nlut);
	if (!err) {
		TAP(lut_matches_pagemap(&mem, &checked), "LUT = pagemap for all %llu 4 KiB pages",
		    (unsigned long long)checked);
		err = upcie_heap_init(&heap, &mem);
		TAP(err == 0, "heap over the LUT memory (%d)", err);
		if (!err) {
			struct upcie_heap_buf sq, lists;
			int ok = 1;

			/* 3 x 1 MiB queues: the second would straddle a granule if packed tightly */
			err = upcie_heap_alloc_array(&heap, 3, 1u << 20, 4096, &sq);
			for (uint64_t i = 0; !err && i < sq.count; i++) {
				uint64_t a = sq.off + i * sq.stride, pa, iova;

				ok &= (a >> 21) == ((a + (1u << 20) - 1) >> 21);
				ok &= upcie_pagemap_phys((char *)mem.vaddr + a, &pa) == 0 &&
				      upcie_dmamem_iova(&mem, a, &iova) == 0 && pa == iova;
			}
			TAP(!err && ok,
			    "array of 1 MiB queues: no element straddles a 2 MiB granule, "
			    "device addresses = pagemap");
			err = upcie_heap_alloc_array(&heap, 64, 4096, 4096, &lists);
			TAP(err == 0 && lists.stride == 4096, "64 PRP list pages (%d)", err);
			upcie_heap_free(&heap, lists.off);
			upcie_heap_free(&heap, sq.off);
			TAP(upcie_heap_validate(&heap) == 0, "heap consistent after frees");
			upcie_heap_fini(&heap);
		}
		upcie_dmamem_destroy(&mem);
		err = upcie_hugepages_get(2048, UPCIE_HUGEPAGE_NODE_ANY, &total, &nfree);
		TAP(err == 0 && nfree == 32, "destroy gives every hugepage back (%llu free)",
		    (unsigned long long)nfree);
	}

	/* hugetlbfs file */
	if (argc > 1) {
		opts.src = UPCIE_HUGEPAGE_HUGETLBFS;
		opts.mount = argv[1];
		err = upcie_dmamem_hugepage_lut(&mem, 6u << 20, &opts);
		TAP(err == 0 && mem.nlut == 3, "hugetlbfs hugepage LUT dmamem (%d)", err);
		if (!err) {
			TAP(lut_matches_pagemap(&mem, &checked),
			    "hugetlbfs: LUT = pagemap for all %llu 4 KiB pages",
			    (unsigned long long)checked);
			upcie_dmamem_destroy(&mem);
		}
		opts.src = UPCIE_HUGEPAGE_MEMFD;
		opts.mount = NULL;
	}

	/* Plain pages can move: a LUT over them is refused. */
	opts.src = UPCIE_HUGEPAGE_PLAIN;
	upcie_log_set_level(UPCIE_LOG_NONE);
	err = upcie_dmamem_hugepage_lut(&mem, 1u << 20, &opts);
	upcie_log_set_level(UPCIE_LOG_ERROR);
	TAP(err == -EINVAL, "LUT over plain (movable) pages is refused (%d)", err);

	check_unprivileged();
	upcie_hugepages_reserve(2048, UPCIE_HUGEPAGE_NODE_ANY, 0);
	return tap_done();
}
