/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * t_uring DEV OTHER [VRAM-BDF|-]: io_uring with dma-buf registered buffers (uring/dmabuf.h) on the
 * kernel's nvme driver. DEV is c0n1 (/dev/nvmeXnY, 512 B blocks), OTHER a namespace of another
 * controller, VRAM the ivshmem function ("device memory", BAR2) or absent.
 *
 * The environment gives TB_C0_BDF (c0's address) and TB_LOOP (a loop block device, optional).
 * On a kernel without the io_uring dma-buf series: the probe must say so (-EOPNOTSUPP) and the
 * table must refuse; the rest is skipped with the reason. On a kernel with it:
 *   - a udmabuf (memfd pages): WRITE_FIXED of tagged data from inside the dma-buf (uneven
 *     offsets, 4 KiB .. 1 MiB, QD 16) to c0n1 [8 MiB, 10 MiB) (tag "uw"; uring_dmabuf.host.sh
 *     checks the image), READ_FIXED of it back into another part of the dma-buf, and a read of
 *     what the image held from the start (tag "c0n1"), checked through the memfd;
 *   - unregister while I/O is in flight: -EBUSY, the I/O ends well, then unregister works;
 *   - the kernel's refusals: a fixed I/O on a file other than the slot's target (-EBADF),
 *     vectored fixed I/O (-EOPNOTSUPP), an unaligned file offset (-EINVAL); the table's: a
 *     target without O_DIRECT (-EINVAL), a character device (-ENOTBLK), a full table (-ENOSPC);
 *   - with VRAM: a vfio-pci BAR dma-buf (peer-to-peer through the host bridge): c0n1 [0, 1 MiB)
 *     read into BAR2 at 1 MiB (checked through the BAR's mapping here and in vram.img by the host
 *     script), and BAR2 [4 MiB, +1 MiB) (tag "uv", written through the mapping) written to c0n1
 *     at 10 MiB.
 *   - the IOMMU rule (uring/dmabuf_iommu.h) under U's translating IOMMU: c0's address found
 *     behind c0n1; a udmabuf (system memory, which the rule does not identity-map) refused with
 *     nothing left mapped or attached; a loop device (not NVMe) refused with -ENODEV.
 * Then examples/uring_dmabuf_read as a user runs it.
 * Built twice: t_uring_nobusy (UPCIE_URING_DMABUF_TEST_NO_BUSY_CHECK) is the negative control of
 * the in-flight rule: its "-EBUSY" check must fail.
 */
#include <upcie/uring/dmabuf.h>
#include <upcie/uring/dmabuf_iommu.h>
#include <upcie/uring/ring.h>
#include <upcie/vfio/device.h>
#include <upcie/vfio/dmabuf.h>
#include <upcie/vfio/type1.h>

#include <sys/utsname.h>

#include "t_kmod.h"

#define MiB (UINT64_C(1) << 20)
/* IORING_OP_READV_FIXED (Linux 6.15); bookworm's headers stop before it */
#define TU_OP_READV_FIXED 60

static struct upcie_uring ring;
static struct upcie_uring_dmabufs tab;

/* Queue ios[0..n), submit, reap all; the number that ended with their full length. */
static unsigned tu_run(struct upcie_uring_dmabuf_io *ios, unsigned n)
{
	struct upcie_uring_dmabuf_io *done[64];
	unsigned q = 0, got = 0, good = 0;

	while (got < n) {
		while (q < n && !upcie_uring_dmabuf_queue(&tab, &ios[q]))
			q++;
		if (upcie_uring_submit(&ring, 0) < 0)
			break;
		int r = upcie_uring_dmabuf_reap(&tab, done, 64, 1);

		if (r < 0)
			break;
		for (int i = 0; i < r; i++) {
			if (done[i]->res == (int32_t)done[i]->len)
				good++;
			else
				DIAG("I/O at file %" PRIu64 " len %u ended with %d",
				     done[i]->file_off, done[i]->len, done[i]->res);
		}
		got += (unsigned)r;
	}
	return good;
}

/* One raw SQE straight on the ring (no table I/O may be in flight); its CQE's result. */
static int tu_raw(uint8_t op, int fd, uint16_t slot, uint64_t addr, uint32_t len, uint64_t off)
{
	struct io_uring_sqe *sqe = upcie_uring_sqe(&ring);
	struct io_uring_cqe *cqe;
	struct iovec iov = { (void *)(uintptr_t)addr, len };
	int res;

	if (!sqe)
		return -EBUSY;
	sqe->opcode = op;
	sqe->fd = fd;
	sqe->off = off;
	sqe->buf_index = slot;
	sqe->user_data = 0x7e57;
	if (op == TU_OP_READV_FIXED) {
		sqe->addr = (uint64_t)(uintptr_t)&iov;
		sqe->len = 1;
	} else {
		sqe->addr = addr;
		sqe->len = len;
	}
	if (upcie_uring_submit(&ring, 1) < 0)
		return -EIO;
	cqe = upcie_uring_cqe_peek(&ring);
	if (!cqe)
		return -EIO;
	res = cqe->res;
	upcie_uring_cqe_seen(&ring);
	return res;
}

/* Unregister `slot` with 8 reads of 512 KiB in flight on it: -EBUSY, the reads end well, then
 * it unregisters. The negative control (t_uring_nobusy --control) fails the first check. */
static void tu_busy(unsigned slot)
{
	struct upcie_uring_dmabuf_io ios[8], *done[8];
	unsigned k, got = 0, good = 0;
	int err;

	memset(ios, 0, sizeof(ios));
	for (k = 0; k < 8; k++) {
		ios[k].slot = (uint16_t)slot;
		ios[k].buf_off = k * 512 * 1024;
		ios[k].file_off = k * 512 * 1024;
		ios[k].len = 512 * 1024;
		upcie_uring_dmabuf_queue(&tab, &ios[k]);
	}
	upcie_uring_submit(&ring, 0);
	err = upcie_uring_dmabuf_unregister(&tab, slot);
	TAP(err == -EBUSY, "unregister with 8 reads in flight: -EBUSY (%d)", err);
	while (got < 8) {
		int r = upcie_uring_dmabuf_reap(&tab, done, 8, 1);

		if (r <= 0)
			break;
		for (int i = 0; i < r; i++)
			good += done[i]->res == (int32_t)done[i]->len;
		got += (unsigned)r;
	}
	TAP(got == 8 && good == 8, "the 8 reads ended well (%u of %u)", good, got);
	if (err == -EBUSY) {
		err = upcie_uring_dmabuf_unregister(&tab, slot);
		TAP(!err, "unregister after the reap (%d)", err);
	}
}

/*
 * Run program `prog` with `args` (stderr joined); *line gets its last output line containing
 * `match` (any line when NULL). Its exit status, or -1 when it could not run (SKIPped when the
 * program is missing, as `what`).
 */
static int tu_child(const char *prog, const char *args, const char *match, char *line, size_t len,
		    const char *what)
{
	char cmd[512], buf[512];
	FILE *f;

	line[0] = '\0';
	if (access(prog, X_OK)) {
		SKIPPED("no program here", "%s (%s)", what, prog);
		return -1;
	}
	snprintf(cmd, sizeof(cmd), "%s %s 2>&1", prog, args);
	f = popen(cmd, "r");
	if (!f) {
		TAP(0, "%s started", what);
		return -1;
	}
	while (fgets(buf, sizeof(buf), f))
		if (!match || strstr(buf, match))
			snprintf(line, len, "%s", buf);
	line[strcspn(line, "\n")] = '\0';
	return pclose(f);
}

/* The negative control, run as a child: its in-flight check must be "not ok". */
static void tu_control(const char *dev)
{
	char args[300], line[512];

	snprintf(args, sizeof(args), "--control %s", dev);
	if (tu_child("/bin/t_uring_nobusy", args, "in flight: -EBUSY", line, sizeof(line),
		     "negative control of the in-flight rule") == -1 &&
	    !line[0])
		return;
	TAP(!strncmp(line, "not ok", 6),
	    "negative control: built without the in-flight rule, the -EBUSY check fails (%s)",
	    !line[0]			 ? "did not run"
	    : strncmp(line, "not ok", 6) ? "it passed"
					 : "it did");
}

/* examples/uring_dmabuf_read as a user runs it: 1 MiB of DEV at 1 MiB, checked by itself. */
static void tu_example(const char *dev)
{
	char args[300], last[512];
	int st;

	snprintf(args, sizeof(args), "%s 1048576 1048576", dev);
	st = tu_child("/bin/uring_dmabuf_read", args, NULL, last, sizeof(last), "the example");
	if (st == -1 && !last[0])
		return;
	TAP(st == 0 && strstr(last, "identical"), "examples/uring_dmabuf_read: %s (status %d)",
	    last, st);
}

/* The IOMMU rule (uring/dmabuf_iommu.h) on this translating guest: the controller behind DEV is
 * found; a udmabuf (system memory) is refused without mapping anything; a block device that is
 * not NVMe (LOOP, when given) is refused with -ENODEV. */
static void tu_rule(int dev, const char *loop)
{
	struct upcie_uring_dmabuf_iommu st;
	struct upcie_pci_bdf b, want;
	struct tk_buf m;
	const char *c0 = getenv("TB_C0_BDF");
	int err, lfd;

	err = upcie_uring_nvme_bdf(dev, &b);
	TAP(!err && c0 && !tk_bdf(c0, &want) && upcie_pci_bdf_equal(&b, &want),
	    "the controller behind c0n1 is %s (%d)", c0 ? c0 : "?", err);
	if (tk_buf_udmabuf(&m, MiB)) {
		TAP(0, "a udmabuf for the IOMMU rule");
		return;
	}
	err = upcie_uring_dmabuf_iommu_prepare(&st, m.fd, dev);
	if (st.mode == UPCIE_PCI_IOMMU_TRANSLATED)
		TAP(err == -EINVAL && st.nmaps == 0 && !st.imported,
		    "under the translating IOMMU a udmabuf (system memory) is refused, nothing "
		    "mapped or left attached (%d)",
		    err);
	else
		TAP(err == 0 && st.nmaps == 0 && !st.imported,
		    "with c0 in an identity domain there is nothing to map: 0, nothing mapped (%d, "
		    "mode %d)",
		    err, (int)st.mode);
	upcie_uring_dmabuf_iommu_release(&st);
	if (loop) {
		lfd = open(loop, O_RDWR | O_DIRECT);
		err = lfd < 0 ? -errno : upcie_uring_dmabuf_iommu_prepare(&st, m.fd, lfd);
		TAP(err == -ENODEV, "%s (not NVMe) while IOMMU groups exist: -ENODEV (%d)", loop,
		    err);
		if (lfd >= 0)
			close(lfd);
	}
	tk_buf_free(&m);
}

static void tu_udmabuf(int dev, int other)
{
	struct upcie_uring_dmabuf_io ios[64];
	struct tk_buf b;
	char uw[9], c0[9];
	unsigned slot = 0, s2, n = 0, k,
		 sizes[] = { 4096, 8192, 65536, 131072, 4096, 524288, 1024 * 1024 };
	uint64_t boff = 4096, foff = 8 * MiB;
	int ndelay, err;

	tk_tag(uw, "uw");
	tk_tag(c0, "c0n1");
	err = tk_buf_udmabuf(&b, 4 * MiB);
	TAP(!err, "a 4 MiB udmabuf (%d)", err);
	if (err)
		return;
	err = upcie_uring_dmabuf_register(&tab, b.fd, dev, &slot);
	TAP(!err && slot == 0, "the udmabuf registered for c0n1 in slot %u (%d)", slot, err);
	if (err)
		goto out;

	/* write [8 MiB, 10 MiB) of c0n1 from the dma-buf at uneven offsets */
	memset(ios, 0, sizeof(ios));
	while (foff < 10 * MiB) {
		unsigned len = sizes[n % 7];

		if (foff + len > 10 * MiB)
			len = (unsigned)(10 * MiB - foff);
		tk_pat((uint8_t *)b.va + boff, len, uw, foff);
		ios[n].slot = (uint16_t)slot;
		ios[n].op = UPCIE_URING_DMABUF_WRITE;
		ios[n].buf_off = boff;
		ios[n].file_off = foff;
		ios[n].len = len;
		boff += len + 4096;
		foff += len;
		n++;
	}
	k = tu_run(ios, n);
	TAP(k == n,
	    "%u WRITE_FIXED from the dma-buf (4 KiB .. 1 MiB, uneven offsets) to c0n1 "
	    "[8, 10) MiB: %u ended with their length",
	    n, k);
	printf("# tb: uring_reissued=%" PRIu64 "\n", tab.reissued);

	/* read it back into [2 MiB, 4 MiB) of the dma-buf */
	memset((uint8_t *)b.va + 2 * MiB, 0, 2 * MiB);
	memset(ios, 0, sizeof(ios));
	for (k = 0; k < 16; k++) {
		ios[k].slot = (uint16_t)slot;
		ios[k].op = UPCIE_URING_DMABUF_READ;
		ios[k].buf_off = 2 * MiB + k * 131072;
		ios[k].file_off = 8 * MiB + k * 131072;
		ios[k].len = 131072;
	}
	k = tu_run(ios, 16);
	TAP(k == 16, "16 READ_FIXED of 128 KiB at QD 16 into the dma-buf: %u ended well", k);
	ndelay = (int)tk_pat_diff((uint8_t *)b.va + 2 * MiB, 2 * MiB, uw, 8 * MiB);
	TAP(ndelay < 0, "what was read is what was written (first difference at %d)", ndelay);

	/* what the image held from the start */
	memset(ios, 0, sizeof(ios));
	ios[0].slot = (uint16_t)slot;
	ios[0].len = (uint32_t)MiB;
	ios[0].buf_off = 512 * 1024;
	TAP(tu_run(ios, 1) == 1, "READ_FIXED of c0n1 [0, 1 MiB) into the dma-buf at 512 KiB");
	ndelay = (int)tk_pat_diff((uint8_t *)b.va + 512 * 1024, MiB, c0, 0);
	TAP(ndelay < 0, "it holds the image's own data (first difference at %d)", ndelay);

	/* unregister while in flight */
	tu_busy(slot);

	/* the kernel's refusals, on a fresh registration */
	err = upcie_uring_dmabuf_register(&tab, b.fd, dev, &slot);
	TAP(!err, "registered again, slot %u (%d)", slot, err);
	if (!err) {
		int r = tu_raw(IORING_OP_READ_FIXED, dev, (uint16_t)slot, 0, 4096, 0);

		TAP(r == 4096, "a raw READ_FIXED on the slot's target works (%d)", r);
		r = tu_raw(IORING_OP_READ_FIXED, other, (uint16_t)slot, 0, 4096, 0);
		TAP(r == -EBADF, "READ_FIXED on another device than the slot's target: -EBADF (%d)",
		    r);
		r = tu_raw(TU_OP_READV_FIXED, dev, (uint16_t)slot, 0, 4096, 0);
		TAP(r == -EOPNOTSUPP, "vectored READV_FIXED on a dma-buf slot: -EOPNOTSUPP (%d)",
		    r);
		r = tu_raw(IORING_OP_READ_FIXED, dev, (uint16_t)slot, 0, 4096, 100);
		TAP(r == -EINVAL, "a file offset of 100 bytes (O_DIRECT): -EINVAL (%d)", r);
		r = tu_raw(IORING_OP_WRITE_FIXED, dev, (uint16_t)slot, 4 * MiB - 2048, 4096, 0);
		TAP(r == -EFAULT,
		    "a range past the dma-buf's end, raw: the kernel says -EFAULT (%d)", r);
	}
	/* fill the table */
	for (k = 1, err = 0; k < tab.nslots && !err; k++)
		err = upcie_uring_dmabuf_register(&tab, b.fd, dev, &s2);
	TAP(!err && tab.used == tab.nslots, "%u slots of %u filled with the same dma-buf", tab.used,
	    tab.nslots);
	err = upcie_uring_dmabuf_register(&tab, b.fd, dev, &s2);
	TAP(err == -ENOSPC, "one more: -ENOSPC (%d)", err);
	for (k = 0, err = 0; k < tab.nslots; k++)
		err |= upcie_uring_dmabuf_unregister(&tab, k);
	TAP(!err && tab.used == 0, "all unregistered");
out:
	tk_buf_free(&b);
}

/* A vfio-pci BAR dma-buf of ivshmem function `vram_bdf` registered for `dev` (namespace `ns`):
 * ns [0, 1 MiB) read into the BAR at 1 MiB, the BAR's [4, 5) MiB (tag uv) written to ns at
 * `woff`; reported as "# tb: KEY=..." for the host script. */
static void tu_vram(int dev, const char *vram_bdf, const char *ns, uint64_t woff, const char *key)
{
	struct upcie_pci_bdf vb;
	struct upcie_vfio_container cont;
	struct upcie_vfio_group g;
	struct upcie_vfio_device vd;
	struct upcie_vfio_region bar = { 0 };
	struct upcie_uring_dmabuf_io io[2];
	char c0[9], uv[9];
	unsigned slot = 0;
	int dfd = -1, err;
	int64_t d;

	memset(&cont, 0, sizeof(cont));
	memset(&g, 0, sizeof(g));
	memset(&vd, 0, sizeof(vd));
	tk_tag(c0, ns);
	tk_tag(uv, "uv");
	if (tk_bdf(vram_bdf, &vb)) {
		TAP(0, "VRAM address %s", vram_bdf);
		return;
	}
	err = upcie_vfio_container_open(&cont);
	if (!err)
		err = upcie_vfio_group_open(&g, &cont, upcie_vfio_group_id(&vb));
	if (!err)
		err = upcie_vfio_device_open(&vd, &g, &vb);
	TAP(!err, "%s (the VRAM) opened through vfio (%d)", vram_bdf, err);
	if (err)
		goto out;
	err = upcie_vfio_dmabuf_export(&vd, 2, 0, 8 * MiB, &dfd);
	if (!err)
		err = upcie_vfio_region_map(&vd, VFIO_PCI_BAR2_REGION_INDEX, &bar);
	TAP(!err, "BAR2 [0, 8 MiB) exported as a dma-buf and mapped (%d)", err);
	if (err)
		goto out;
	err = upcie_uring_dmabuf_register(&tab, dfd, dev, &slot);
	TAP(!err, "the BAR dma-buf of %s registered for %s (%d)", vram_bdf, ns, err);
	if (err)
		goto out;
	memset((uint8_t *)bar.addr + MiB, 0, MiB);
	tk_pat((uint8_t *)bar.addr + 4 * MiB, MiB, uv, woff);
	memset(io, 0, sizeof(io));
	io[0].slot = (uint16_t)slot;
	io[0].buf_off = MiB;
	io[0].file_off = 0;
	io[0].len = (uint32_t)MiB;
	io[1].slot = (uint16_t)slot;
	io[1].op = UPCIE_URING_DMABUF_WRITE;
	io[1].buf_off = 4 * MiB;
	io[1].file_off = woff;
	io[1].len = (uint32_t)MiB;
	TAP(tu_run(io, 2) == 2,
	    "%s [0, 1 MiB) read into BAR2 of %s at 1 MiB, BAR2 [4, 5) MiB written to %s at %" PRIu64
	    " MiB, peer to peer",
	    ns, vram_bdf, ns, woff >> 20);
	d = tk_pat_diff((uint8_t *)bar.addr + MiB, MiB, c0, 0);
	TAP(d < 0, "the BAR holds %s's data (first difference at %" PRId64 ")", ns, d);
	printf("# tb: %s=%" PRIu64 "+%" PRIu64 "+0\n", key, MiB, MiB);
	err = upcie_uring_dmabuf_unregister(&tab, slot);
	TAP(!err, "the BAR dma-buf unregistered (%d)", err);
out:
	upcie_vfio_region_unmap(&bar);
	if (dfd >= 0)
		close(dfd);
	upcie_vfio_device_close(&vd);
	upcie_vfio_group_close(&g);
	upcie_vfio_container_close(&cont);
}

int main(int argc, char **argv)
{
	int dev = -1, other = -1, nodirect = -1, err, p;
	struct utsname u;
	bool patched;

	upcie_log_set_handler(tk_log, NULL);
	if (argc < 3) {
		fprintf(stderr, "usage: t_uring DEV OTHER [VRAM-BDF] | t_uring --control DEV\n");
		return 2;
	}
	if (!strcmp(argv[1], "--control")) {
		struct tk_buf b;
		unsigned slot = 0;

		dev = open(argv[2], O_RDWR | O_DIRECT);
		err = dev < 0 || upcie_uring_init(&ring, 64, 0) ||
		      upcie_uring_dmabufs_init(&tab, &ring, 1) || tk_buf_udmabuf(&b, 4 * MiB);
		if (!err && !upcie_uring_dmabuf_register(&tab, b.fd, dev, &slot))
			tu_busy(slot);
		else
			TAP(0, "control set up");
		return tap_done();
	}
	uname(&u);
	patched = strstr(u.release, "-upcie-iouring") != NULL;
	p = upcie_uring_dmabuf_probe();
	TAP(p == (patched ? 0 : -EOPNOTSUPP), "kernel %s: the probe says %s (%d)", u.release,
	    p ? "not supported" : "supported", p);
	if (upcie_uring_init(&ring, 64, 0)) {
		TAP(0, "a ring of 64");
		return tap_done();
	}
	err = upcie_uring_dmabufs_init(&tab, &ring, 8);
	if (p) {
		TAP(err == -EOPNOTSUPP, "the table refuses on this kernel: -EOPNOTSUPP (%d)", err);
		SKIPPED("this kernel has no io_uring dma-buf registered buffers (needs the series: "
			"configuration U)",
			"dma-buf I/O through the kernel's nvme driver");
		upcie_uring_fini(&ring);
		return tap_done();
	}
	TAP(!err, "a table of 8 dma-buf slots on the ring (%d)", err);
	dev = open(argv[1], O_RDWR | O_DIRECT);
	other = open(argv[2], O_RDWR | O_DIRECT);
	nodirect = open(argv[1], O_RDWR);
	TAP(dev >= 0 && other >= 0 && nodirect >= 0, "%s and %s opened", argv[1], argv[2]);
	if (err || dev < 0 || other < 0 || nodirect < 0)
		goto out;
	{
		struct tk_buf b;
		unsigned s;
		int cfd = open("/dev/null", O_RDWR);

		if (!tk_buf_udmabuf(&b, MiB)) {
			err = upcie_uring_dmabuf_register(&tab, b.fd, nodirect, &s);
			TAP(err == -EINVAL, "a target without O_DIRECT: -EINVAL (%d)", err);
			err = upcie_uring_dmabuf_register(&tab, b.fd, cfd, &s);
			TAP(err == -ENOTBLK, "a character device as target: -ENOTBLK (%d)", err);
			err = upcie_uring_dmabuf_register(&tab, cfd, dev, &s);
			TAP(err < 0 && tab.used == 0, "/dev/null as the dma-buf: refused (%d)",
			    err);
			tk_buf_free(&b);
		}
		close(cfd);
	}
	tu_rule(dev, getenv("TB_LOOP"));
	tu_udmabuf(dev, other);
	if (argc > 3 && strcmp(argv[3], "-"))
		tu_vram(dev, argv[3], "c0n1", 10 * MiB, "uring_vram");
	if (getenv("TB_SW_DEV") && getenv("TB_VRM3_BDF")) {
		/* the same behind a PCIe switch: c6 and vrm3 under one switch */
		int sw = open(getenv("TB_SW_DEV"), O_RDWR | O_DIRECT);
		enum upcie_pci_iommu mode = UPCIE_PCI_IOMMU_UNKNOWN;
		struct upcie_pci_bdf c6;

		TAP(sw >= 0 && !upcie_uring_nvme_bdf(sw, &c6) &&
			!upcie_pci_func_iommu(&c6, &mode, NULL, NULL, 0),
		    "%s (c6n1, behind the switch) opened, its IOMMU mode %d", getenv("TB_SW_DEV"),
		    (int)mode);
		if (mode == UPCIE_PCI_IOMMU_TRANSLATED)
			SKIPPED(
			    "the kernel maps peer-to-peer under one switch as bus addresses that "
			    "bypass the IOMMU, and QEMU's intel-iommu translates them all the same "
			    "(DMAR faults): configuration V (iommu=pt) runs this",
			    "transfers through the PCIe switch");
		else if (sw >= 0)
			tu_vram(sw, getenv("TB_VRM3_BDF"), "c6n1", 4 * MiB, "uring_vram_sw");
		if (sw >= 0)
			close(sw);
	}
	tu_example(argv[1]);
	tu_control(argv[1]);
	err = upcie_uring_dmabufs_fini(&tab);
	TAP(!err, "the table dropped (%d)", err);
out:
	if (dev >= 0)
		close(dev);
	if (other >= 0)
		close(other);
	if (nodirect >= 0)
		close(nodirect);
	upcie_uring_fini(&ring);
	return tap_done();
}
