/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests for kmod/dmabuf_import.h and kmod/device.h without the module: the UAPI layout the
 * module and the wrapper share (sizes, offsets, request numbers), the open errors (a missing node
 * names the package to install; a node that is not the module is -EPROTO), closed and zeroed
 * contexts, argument checks, and trimming a scatter list to a size. The module itself is tested
 * in the guests (tests/guest/cases/kmod_dmabuf.sh).
 */
#include <upcie/kmod/dmabuf_import.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static char last_msg[1024];

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	snprintf(last_msg, sizeof(last_msg), "%s", msg);
}

static void test_layout(void)
{
	CHECK_EQ(sizeof(struct upcie_dmabuf_import_seg), 16, "segment: 16 bytes");
	CHECK_EQ(sizeof(struct upcie_dmabuf_import_pci), 8, "PCI address: 8 bytes");
	CHECK_EQ(sizeof(struct upcie_dmabuf_import_attach), 64, "ATTACH: 64 bytes");
	CHECK_EQ(offsetof(struct upcie_dmabuf_import_attach, segs), 16, "ATTACH.segs at 16");
	CHECK_EQ(offsetof(struct upcie_dmabuf_import_attach, handle), 40, "ATTACH.handle at 40");
	CHECK_EQ(sizeof(struct upcie_dmabuf_import_get), 32, "GET: 32 bytes");
	CHECK_EQ(sizeof(struct upcie_dmabuf_import_info), 32, "INFO: 32 bytes");
	/* every u64 naturally aligned: one layout for 32- and 64-bit callers */
	CHECK(offsetof(struct upcie_dmabuf_import_attach, size) % 8 == 0 &&
		  offsetof(struct upcie_dmabuf_import_get, segs) % 8 == 0 &&
		  offsetof(struct upcie_dmabuf_import_info, attachments) % 8 == 0,
	      "64-bit fields naturally aligned");
	CHECK(_IOC_TYPE(UPCIE_DMABUF_IMPORT_IOC_ATTACH) == 0xE7 &&
		  _IOC_NR(UPCIE_DMABUF_IMPORT_IOC_INFO) == 0 &&
		  _IOC_NR(UPCIE_DMABUF_IMPORT_IOC_ATTACH) == 1 &&
		  _IOC_NR(UPCIE_DMABUF_IMPORT_IOC_GET) == 2 &&
		  _IOC_NR(UPCIE_DMABUF_IMPORT_IOC_DETACH) == 3,
	      "request numbers 0xE7/0..3");
	CHECK(_IOC_DIR(UPCIE_DMABUF_IMPORT_IOC_ATTACH) == (_IOC_READ | _IOC_WRITE) &&
		  _IOC_SIZE(UPCIE_DMABUF_IMPORT_IOC_ATTACH) == 64 &&
		  _IOC_DIR(UPCIE_DMABUF_IMPORT_IOC_INFO) == _IOC_READ &&
		  _IOC_DIR(UPCIE_DMABUF_IMPORT_IOC_DETACH) == _IOC_WRITE &&
		  _IOC_SIZE(UPCIE_DMABUF_IMPORT_IOC_DETACH) == 8,
	      "request directions and sizes");
	CHECK(sizeof(struct upcie_sg_seg) == sizeof(struct upcie_dmabuf_import_seg),
	      "upcie_sg_seg is handed to the module as is");
}

static void test_open(void)
{
	struct upcie_kmod_dmabuf_import ctx;
	int err;

	setenv("UPCIE_KMOD_DMABUF_IMPORT_PATH", "/nonexistent/dmabuf_import", 1);
	memset(&ctx, 0x5a, sizeof(ctx));
	last_msg[0] = 0;
	err = upcie_kmod_dmabuf_import_open(&ctx);
	CHECK_EQ(err, -ENOENT, "missing node: -ENOENT");
	CHECK(strstr(last_msg, "dmabuf-import-dkms") && strstr(last_msg, "modprobe dmabuf_import"),
	      "the message names the package and the module: %s", last_msg);
	CHECK_EQ(ctx.fd, 0, "the context stays closed");

	setenv("UPCIE_KMOD_DMABUF_IMPORT_PATH", "/dev/null", 1);
	err = upcie_kmod_dmabuf_import_open(&ctx);
	CHECK_EQ(err, -EPROTO, "/dev/null (not the module): -EPROTO");
	CHECK_EQ(ctx.fd, 0, "and closed");
	unsetenv("UPCIE_KMOD_DMABUF_IMPORT_PATH");
	CHECK_EQ(upcie_kmod_dmabuf_import_open(NULL), -EINVAL, "NULL context: -EINVAL");
}

static void test_closed(void)
{
	struct upcie_kmod_dmabuf_import ctx;
	struct upcie_dmabuf_import_info info;
	struct upcie_pci_bdf bdf = { 0, 1, 0, 0 };
	struct upcie_sg_seg seg;
	struct upcie_dmamem mem;
	size_t n = 7;
	uint64_t h = 7;

	memset(&ctx, 0, sizeof(ctx));
	upcie_kmod_dmabuf_import_close(&ctx);
	upcie_kmod_dmabuf_import_close(NULL);
	CHECK(1, "closing a zeroed context and NULL: no-ops");
	CHECK_EQ(upcie_kmod_dmabuf_attach(&ctx, 3, &seg, 1, &n, &h), -EBADF, "attach: -EBADF");
	CHECK(n == 7 && h == 7, "outputs untouched on failure");
	CHECK_EQ(upcie_kmod_dmabuf_attach_pci(&ctx, &bdf, 3, &seg, 1, &n, &h), -EBADF,
		 "attach_pci: -EBADF");
	CHECK_EQ(upcie_kmod_dmabuf_attach_pci(&ctx, NULL, 3, &seg, 1, &n, &h), -EINVAL,
		 "attach_pci without a function: -EINVAL");
	CHECK_EQ(upcie_kmod_dmabuf_detach(&ctx, 1), -EBADF, "detach: -EBADF");
	CHECK_EQ(upcie_kmod_dmabuf_segs(&ctx, 1, 0, &seg, 1, &n), -EBADF, "segs: -EBADF");
	CHECK_EQ(upcie_kmod_dmabuf_import_info(&ctx, &info), -EBADF, "info: -EBADF");
	memset(&mem, 0x5a, sizeof(mem));
	CHECK_EQ(upcie_dmamem_dmabuf_import(&mem, &ctx, 3, NULL, 4096, 12), -EBADF,
		 "dmamem: -EBADF");
	CHECK(mem.size == 0 && mem.lut == NULL && mem.release == NULL && mem.fd == -1,
	      "dmamem zeroed on failure");
	memset(&mem, 0x5a, sizeof(mem));
	CHECK_EQ(upcie_dmamem_dmabuf_import(&mem, &ctx, 3, NULL, 0, 12), -EINVAL,
		 "dmamem of size 0: -EINVAL");
	CHECK_EQ(upcie_dmamem_dmabuf_import_pci(&mem, &ctx, NULL, 3, NULL, 4096, 12), -EINVAL,
		 "dmamem_pci without a function: -EINVAL");
	CHECK(mem.release == NULL && mem.fd == -1, "and zeroed");
	ctx.fd = 1; /* "open", but the arguments are wrong */
	CHECK_EQ(upcie_kmod_dmabuf_attach(&ctx, 3, NULL, 4, &n, &h), -EINVAL,
		 "room claimed without an array: -EINVAL");
	CHECK_EQ(upcie_kmod_dmabuf_attach(&ctx, 3, &seg, 1, NULL, &h), -EINVAL,
		 "no nsegs: -EINVAL");
	bdf.dev = 32;
	CHECK_EQ(upcie_kmod_dmabuf_attach_pci(&ctx, &bdf, 3, &seg, 1, &n, &h), -EINVAL,
		 "device number 32: -EINVAL");
}

static void test_trim(void)
{
	struct upcie_sg_seg s[3] = { { 0x10000, 0x2000 },
				     { 0x40000, 0x3000 },
				     { 0x90000, 0x1000 } };
	struct upcie_sg_seg t[3];

	memcpy(t, s, sizeof(s));
	CHECK_EQ(upcie_kmod_sg_trim_(t, 3, 0x6000), 3, "whole list: 3 segments");
	CHECK(!memcmp(t, s, sizeof(s)), "unchanged");
	memcpy(t, s, sizeof(s));
	CHECK_EQ(upcie_kmod_sg_trim_(t, 3, 0x3000), 2, "0x3000 bytes: 2 segments");
	CHECK(t[1].len == 0x1000 && t[0].len == 0x2000, "the second trimmed to 0x1000");
	memcpy(t, s, sizeof(s));
	CHECK_EQ(upcie_kmod_sg_trim_(t, 3, 0x2000), 1, "exactly the first segment");
	memcpy(t, s, sizeof(s));
	CHECK_EQ(upcie_kmod_sg_trim_(t, 3, 0x800), 1, "inside the first");
	CHECK_EQ(t[0].len, 0x800, "trimmed to 0x800");
}

int main(void)
{
	upcie_log_set_handler(capture, NULL);
	test_layout();
	test_open();
	test_closed();
	test_trim();
	return check_done();
}
