/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Client memory of a served-queue server (served/server.h) as the controller model sees it:
 * windows of the server's address space at fixed IOVAs, put in the model's iomap before it
 * starts (the iomap is not changed while the model runs). A registration maps the client's memfd
 * into a free window; giving it back marks the window free and puts anonymous memory there.
 * With served_win_dma as the model's DMA observer, every access to a window that was given back
 * is counted in served_win_late, and every data transfer that lands outside the live windows
 * (in the server's own memory, or anywhere that is no client's registered memory) in
 * served_win_outside (I/O queues' data only: Identify data lands in the server's memory). A
 * test instrument.
 */
#ifndef UPCIE_TEST_SERVED_WIN_H
#define UPCIE_TEST_SERVED_WIN_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>

#include <upcie/mem/dmamem.h>

#include "nvme_ctrl_model.h"

#define SERVED_WIN_N	16
#define SERVED_WIN_SIZE (UINT64_C(64) << 20)
#define SERVED_WIN_IOVA UINT64_C(0x1000000000)

static uint8_t *served_win_base;
static int served_win_state[SERVED_WIN_N];
static uint64_t served_win_late;
static uint64_t served_win_outside;

static inline void served_win_release(struct upcie_dmamem *m)
{
	unsigned k = (unsigned)(uintptr_t)m->priv - 1;

	/* given back: from now on any DMA here is late */
	__atomic_store_n(&served_win_state[k], 0, __ATOMIC_SEQ_CST);
	mmap(served_win_base + k * SERVED_WIN_SIZE, SERVED_WIN_SIZE, PROT_READ | PROT_WRITE,
	     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
}

/* The mapper (struct upcie_served_mapper's map). */
static inline int served_win_map(void *ctx, int fd, void *vaddr, size_t size,
				 struct upcie_dmamem *mem)
{
	(void)ctx;
	(void)vaddr;
	if (size > SERVED_WIN_SIZE)
		return -ENOSPC;
	for (unsigned k = 0; k < SERVED_WIN_N; k++) {
		void *p;

		if (__atomic_load_n(&served_win_state[k], __ATOMIC_SEQ_CST))
			continue;
		p = mmap(served_win_base + k * SERVED_WIN_SIZE, size, PROT_READ | PROT_WRITE,
			 MAP_SHARED | MAP_FIXED, fd, 0);
		if (p == MAP_FAILED)
			return -errno;
		upcie_dmamem_init_arith(mem, p, size, SERVED_WIN_IOVA + k * SERVED_WIN_SIZE);
		mem->release = served_win_release;
		mem->priv = (void *)(uintptr_t)(k + 1);
		__atomic_store_n(&served_win_state[k], 1, __ATOMIC_SEQ_CST);
		return 0;
	}
	return -ENOSPC;
}

static inline void served_win_dma(void *ctx, struct nvme_model *m, const struct nvme_model_pend *p,
				  int dir, int kind, const uint8_t *ptr, uint64_t len)
{
	bool in = ptr >= served_win_base && ptr < served_win_base + SERVED_WIN_N * SERVED_WIN_SIZE;

	(void)ctx;
	(void)dir;
	(void)len;
	if (in && !__atomic_load_n(&served_win_state[(ptr - served_win_base) / SERVED_WIN_SIZE],
				   __ATOMIC_SEQ_CST))
		__atomic_fetch_add(&served_win_late, 1, __ATOMIC_SEQ_CST);
	/* the data of I/O commands only (Identify pages and DSM ranges come from the server) */
	if (!in && kind == NVME_MODEL_DMA_DATA && m->sqid != 0 &&
	    (p->sqe.opc == UPCIE_NVME_NVM_READ || p->sqe.opc == UPCIE_NVME_NVM_WRITE ||
	     p->sqe.opc == UPCIE_NVME_NVM_COMPARE))
		__atomic_fetch_add(&served_win_outside, 1, __ATOMIC_SEQ_CST);
}

/* Reserve the windows and put them in the model's iomap (before the model starts). */
static inline int served_win_setup(struct nvme_cmodel *cm, struct nvme_model_iomap *im)
{
	served_win_base =
	    (uint8_t *)mmap(NULL, SERVED_WIN_N * SERVED_WIN_SIZE, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (served_win_base == MAP_FAILED)
		return -ENOMEM;
	for (unsigned w = 0; w < SERVED_WIN_N; w++)
		nvme_model_iomap_add_range(im, SERVED_WIN_IOVA + w * SERVED_WIN_SIZE,
					   SERVED_WIN_SIZE, served_win_base + w * SERVED_WIN_SIZE);
	cm->dma = served_win_dma;
	return 0;
}

#endif /* UPCIE_TEST_SERVED_WIN_H */
