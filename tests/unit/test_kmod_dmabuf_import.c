/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests for kmod/dmabuf_import.h and kmod/device.h without the module: the UAPI layout the
 * module and the wrapper share (sizes, offsets, request numbers), the open errors (a missing node
 * names the package to install; a node that is not the module is -EPROTO), the module identity
 * check against a fake sysfs tree (another project's module of the same name, another identity,
 * another ABI: -EPROTO before the node is opened, with a message that says what was found),
 * closed and zeroed contexts, argument checks, and trimming a scatter list to a size. The module
 * itself is tested in the guests (tests/guest/cases/kmod_dmabuf.sh, kmod_ident.sh).
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
	CHECK(strstr(last_msg, "upcie-dmabuf-import-dkms") &&
		  strstr(last_msg, "modprobe dmabuf_import"),
	      "the message names the package and the module: %s", last_msg);
	CHECK_EQ(ctx.fd, 0, "the context stays closed");

	setenv("UPCIE_KMOD_DMABUF_IMPORT_PATH", "/dev/null", 1);
	err = upcie_kmod_dmabuf_import_open(&ctx);
	CHECK_EQ(err, -EPROTO, "/dev/null (not the module): -EPROTO");
	CHECK_EQ(ctx.fd, 0, "and closed");
	unsetenv("UPCIE_KMOD_DMABUF_IMPORT_PATH");
	CHECK_EQ(upcie_kmod_dmabuf_import_open(NULL), -EINVAL, "NULL context: -EINVAL");
}

/* A file of the fake sysfs tree under `root`, its folders made as needed. */
static void put(const char *root, const char *rel, const char *content)
{
	char path[4096], cmd[4096 + 16];
	FILE *fp;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", path);
	*strrchr(cmd, '/') = '\0';
	strcat(cmd, "'");
	if (system(cmd) != 0)
		abort();
	fp = fopen(path, "w");
	if (!fp)
		abort();
	fputs(content, fp);
	fclose(fp);
}

static void test_identity(void)
{
	char root[] = "/tmp/upcie-kmod-ident-XXXXXX", cmd[64];
	struct upcie_kmod_dmabuf_import ctx;
	char want[64];

	if (!mkdtemp(root)) {
		CHECK(0, "identity: mkdtemp");
		return;
	}
	setenv("UPCIE_SYSFS_ROOT", root, 1);
	memset(&ctx, 0, sizeof(ctx));

	/* No module of that name: the open says what is missing. */
	setenv("UPCIE_KMOD_DMABUF_IMPORT_PATH", "/nonexistent/dmabuf_import", 1);
	last_msg[0] = 0;
	CHECK_EQ(upcie_kmod_dmabuf_import_open(&ctx), -ENOENT, "identity: no module: -ENOENT");
	CHECK(strstr(last_msg, "not loaded") != NULL, "and says it is not loaded: %s", last_msg);

	/* Another project's module of the same name: no parameters/abi. Refused before the node is
	 * opened (the node does not even exist here), naming what was found and what to install. */
	put(root, "module/dmabuf_import/version", "0.2.0\n");
	put(root, "module/dmabuf_import/refcnt", "0\n");
	last_msg[0] = 0;
	CHECK_EQ(upcie_kmod_dmabuf_import_open(&ctx), -EPROTO,
		 "identity: module without an identity: -EPROTO, before opening the node");
	CHECK(strstr(last_msg, "/nonexistent/dmabuf_import is not upcie's module") &&
		  strstr(last_msg, "version 0.2.0") && strstr(last_msg, "parameters/abi") &&
		  strstr(last_msg, "rmmod dmabuf_import") &&
		  strstr(last_msg, UPCIE_KMOD_DMABUF_IMPORT_PACKAGE),
	      "the message names the node, what was found, and what to unload and install: %s",
	      last_msg);
	CHECK_EQ(ctx.fd, 0, "the context stays closed");

	/* A module with another identity. */
	put(root, "module/dmabuf_import/parameters/abi", "other-dmabuf_import 1\n");
	last_msg[0] = 0;
	CHECK_EQ(upcie_kmod_dmabuf_import_open(&ctx), -EPROTO, "identity: another one: -EPROTO");
	snprintf(want, sizeof(want), "\"%s %d\"", UPCIE_DMABUF_IMPORT_IDENT,
		 UPCIE_DMABUF_IMPORT_ABI);
	CHECK(strstr(last_msg, "not upcie's module") &&
		  strstr(last_msg, "\"other-dmabuf_import 1\"") && strstr(last_msg, want),
	      "the message quotes what was found and what is needed: %s", last_msg);
	put(root, "module/dmabuf_import/parameters/abi", "upcie-dmabuf_importx 1\n");
	CHECK_EQ(upcie_kmod_dmabuf_import_open(&ctx), -EPROTO,
		 "identity: a longer name with the same prefix: -EPROTO");

	/* upcie's module with another ABI, or an unreadable number. */
	snprintf(want, sizeof(want), "%s %d\n", UPCIE_DMABUF_IMPORT_IDENT,
		 UPCIE_DMABUF_IMPORT_ABI + 1);
	put(root, "module/dmabuf_import/parameters/abi", want);
	last_msg[0] = 0;
	CHECK_EQ(upcie_kmod_dmabuf_import_open(&ctx), -EPROTO, "identity: ABI + 1: -EPROTO");
	snprintf(want, sizeof(want), "ABI \"%d\"", UPCIE_DMABUF_IMPORT_ABI + 1);
	CHECK(strstr(last_msg, "is upcie's dmabuf_import") && strstr(last_msg, want) &&
		  strstr(last_msg, UPCIE_KMOD_DMABUF_IMPORT_PACKAGE),
	      "the message names both ABIs and the package: %s", last_msg);
	put(root, "module/dmabuf_import/parameters/abi", UPCIE_DMABUF_IMPORT_IDENT " 1x\n");
	CHECK_EQ(upcie_kmod_dmabuf_import_open(&ctx), -EPROTO, "identity: ABI '1x': -EPROTO");
	put(root, "module/dmabuf_import/parameters/abi", UPCIE_DMABUF_IMPORT_IDENT " \n");
	CHECK_EQ(upcie_kmod_dmabuf_import_open(&ctx), -EPROTO, "identity: no number: -EPROTO");

	/* The right identity: the open goes on to the node (missing here, then /dev/null, which
	 * does not answer INFO). */
	snprintf(want, sizeof(want), "%s %d\n", UPCIE_DMABUF_IMPORT_IDENT, UPCIE_DMABUF_IMPORT_ABI);
	put(root, "module/dmabuf_import/parameters/abi", want);
	last_msg[0] = 0;
	CHECK_EQ(upcie_kmod_dmabuf_import_open(&ctx), -ENOENT,
		 "identity matches: the open goes on (node missing: -ENOENT)");
	setenv("UPCIE_KMOD_DMABUF_IMPORT_PATH", "/dev/null", 1);
	last_msg[0] = 0;
	CHECK_EQ(upcie_kmod_dmabuf_import_open(&ctx), -EPROTO,
		 "identity matches, /dev/null: -EPROTO");
	CHECK(strstr(last_msg, "does not answer") != NULL, "from the INFO request: %s", last_msg);
	CHECK_EQ(ctx.fd, 0, "the context stays closed");

	unsetenv("UPCIE_KMOD_DMABUF_IMPORT_PATH");
	unsetenv("UPCIE_SYSFS_ROOT");
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	CHECK(system(cmd) == 0, "identity: fake tree removed");
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
	test_identity();
	test_closed();
	test_trim();
	return check_done();
}
