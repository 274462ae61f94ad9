/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * t_gpu_p2p: the P2P placement check (gpu/p2p_check.h) on a real kernel's sysfs and /proc/iomem,
 * with the emulated device memory (ivshmem, its BAR 2) standing in for the GPU's BAR window.
 *
 * The negative control: host-memory dma-bufs (a vgem dumb buffer; a udmabuf where the kernel has
 * one) imported through the dmabuf_import module as if they were device memory, exactly what an
 * exporter that placed the buffer in host memory (amdgpu's GTT fallback) hands out. Their LUT
 * holds bus addresses of host pages; the check must refuse them (-EXDEV, system RAM). The same
 * check accepts the window itself and refuses a range that runs past its end, so it neither
 * passes nor refuses everything.
 *
 * Usage: t_gpu_p2p VRAM_BDF (run as root: /proc/iomem shows addresses only with CAP_SYS_ADMIN).
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/gpu/p2p_check.h>
#include <upcie/kmod/dmabuf_import.h>

#include "t_kmod.h"

/* The window's BAR on the ivshmem device: BAR 2 is its shared memory. */
#define T_VRAM_BAR 2

static char last_err[512];

static void t_log(enum upcie_log_level level, const char *msg, void *ctx)
{
	if (level == UPCIE_LOG_ERROR)
		snprintf(last_err, sizeof(last_err), "%s", msg);
	tk_log(level, msg, ctx);
}

/* A host-memory dma-buf imported as device memory: the check must refuse it as system RAM. */
static void t_hostbuf(struct upcie_kmod_dmabuf_import *ctx, const struct upcie_gpu_p2p_window *w,
		      const struct upcie_gpu_p2p_sysram *s, struct tk_buf *b)
{
	struct upcie_dmamem mem;
	int err;

	err = upcie_dmamem_dmabuf_import(&mem, ctx, b->fd, b->va, b->size, 12);
	TAP(!err && mem.lut && mem.nlut == b->size >> 12,
	    "%s (%zu KiB) imported as if it were device memory: LUT of %zu pages (%d)", b->kind,
	    b->size >> 10, err ? (size_t)0 : mem.nlut, err);
	if (err)
		return;
	last_err[0] = 0;
	err = upcie_gpu_p2p_check_dmamem(w, s, &mem, b->kind);
	TAP(err == -EXDEV && strstr(last_err, "system RAM") && strstr(last_err, "host memory"),
	    "%s refused by the placement check: %d, \"%s\"", b->kind, err, last_err);
	upcie_dmamem_destroy(&mem);
}

int main(int argc, char **argv)
{
	struct upcie_kmod_dmabuf_import ctx = { 0 };
	struct upcie_gpu_p2p_sysram *s = calloc(1, sizeof(*s));
	struct upcie_gpu_p2p_window w;
	struct upcie_dmamem win;
	struct tk_buf b;
	int err;

	upcie_log_set_handler(t_log, NULL);
	if (argc < 2 || !s)
		return 2;
	err = upcie_gpu_p2p_window_read(argv[1], T_VRAM_BAR, &w);
	TAP(!err && w.size, "window: BAR %d of %s, 0x%llx + 0x%llx (%d)", T_VRAM_BAR, argv[1],
	    (unsigned long long)w.start, (unsigned long long)w.size, err);
	err = err ? err : upcie_gpu_p2p_sysram_load(s);
	TAP(!err && s->n, "System RAM from /proc/iomem: %u top-level range(s) (%d)", s->n, err);
	if (err) {
		free(s);
		return tap_done();
	}
	TAP(!upcie_gpu_p2p_in_sysram(s, w.start, w.size, NULL),
	    "the window lies outside every System RAM range");

	/* The window itself passes; past its end is refused. */
	memset(&win, 0, sizeof(win));
	win.iova = w.start;
	win.size = w.size;
	err = upcie_gpu_p2p_check_dmamem(&w, s, &win, "the window");
	TAP(err == 0, "a segment covering the window exactly passes (%d)", err);
	last_err[0] = 0;
	err = upcie_gpu_p2p_check_range(&w, s, w.start + w.size - 4096, 8192, "past the end");
	TAP(err == -EXDEV && strstr(last_err, "outside BAR"),
	    "a segment running 4 KiB past the window is refused: %d, \"%s\"", err, last_err);

	/* The negative control: host memory presented as device memory. */
	if (upcie_kmod_dmabuf_import_open(&ctx)) {
		TAP(0, "dmabuf_import opens (the module is needed for the host-memory imports)");
		free(s);
		return tap_done();
	}
	err = tk_buf_vgem(&b, 2 * MiB);
	TAP(!err, "vgem dumb buffer, 2 MiB (%d)", err);
	if (!err) {
		t_hostbuf(&ctx, &w, s, &b);
		tk_buf_free(&b);
	}
	err = tk_buf_udmabuf(&b, 2 * MiB);
	if (err == -ENODEV) {
		SKIPPED("no /dev/udmabuf on this kernel", "udmabuf of a 2 MiB memfd");
	} else {
		TAP(!err, "udmabuf of a 2 MiB memfd (%d)", err);
		if (!err) {
			t_hostbuf(&ctx, &w, s, &b);
			tk_buf_free(&b);
		}
	}
	upcie_kmod_dmabuf_import_close(&ctx);
	free(s);
	return tap_done();
}
