/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * uring_dmabuf_read: read a range of an NVMe block device into a dma-buf with io_uring, through
 * the kernel's nvme driver, and check it against an ordinary read of the same range.
 *
 *   uring_dmabuf_read /dev/nvme0n1 [OFFSET [LENGTH]]      (defaults: 0, 1 MiB)
 *
 * The dma-buf here is a udmabuf (pages of a memfd), so the program runs on any machine with the
 * kernel support; with a GPU the same table takes CUDA or HIP memory through
 * upcie_uring_dmabuf_register_cuda()/_hip() (include/upcie/uring/dmabuf_cuda.h, _hip.h), and
 * the check reads it back with cuMemcpyDtoH instead of the memfd mapping.
 * Needs a kernel with the io_uring dma-buf registered-buffer series (no released kernel has it
 * yet): elsewhere it says so and exits with status 2. OFFSET and LENGTH must be multiples of the
 * device's logical block size (O_DIRECT). Exit status: 0 identical, 1 error or mismatch, 2 not
 * supported by this kernel.
 */
#include <upcie/uring/dmabuf.h>
#include <upcie/uring/ring.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/udmabuf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#define CHUNK (128u * 1024) /* one I/O */
#define QD    8

/* A udmabuf of `size` bytes over a sealed memfd; *memfd and *va give the CPU's view. */
static int udmabuf_new(size_t size, int *memfd, void **va)
{
	struct udmabuf_create c;
	int dev = open("/dev/udmabuf", O_RDWR), fd = -1;

	*memfd = memfd_create("uring_dmabuf_read", MFD_ALLOW_SEALING);
	if (dev < 0 || *memfd < 0 || ftruncate(*memfd, (off_t)size) ||
	    fcntl(*memfd, F_ADD_SEALS, F_SEAL_SHRINK)) {
		perror("udmabuf (/dev/udmabuf, memfd)");
		goto out;
	}
	memset(&c, 0, sizeof(c));
	c.memfd = (uint32_t)*memfd;
	c.size = size;
	fd = ioctl(dev, UDMABUF_CREATE, &c);
	if (fd < 0) {
		perror("UDMABUF_CREATE");
		goto out;
	}
	*va = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, *memfd, 0);
	if (*va == MAP_FAILED) {
		perror("mmap");
		close(fd);
		fd = -1;
	}
out:
	if (dev >= 0)
		close(dev);
	return fd;
}

int main(int argc, char **argv)
{
	struct upcie_uring ring;
	struct upcie_uring_dmabufs tab;
	struct upcie_uring_dmabuf_io io[QD], *done[QD];
	uint64_t off = argc > 2 ? strtoull(argv[2], NULL, 0) : 0;
	uint64_t len = argc > 3 ? strtoull(argv[3], NULL, 0) : 1u << 20, queued = 0, ended = 0;
	unsigned slot = 0, k;
	void *va = NULL, *check = NULL;
	int dev = -1, memfd = -1, dbuf = -1, rc = 1, err;

	if (argc < 2 || !len || len > (1u << 30)) {
		fprintf(stderr, "usage: %s /dev/nvmeXnY [OFFSET [LENGTH (1 B .. 1 GiB)]]\n",
			argv[0]);
		return 1;
	}
	if (upcie_uring_dmabuf_probe())
		return 2; /* the probe said why */
	dev = open(argv[1], O_RDONLY | O_DIRECT);
	if (dev < 0) {
		perror(argv[1]);
		return 1;
	}
	if (upcie_uring_init(&ring, 2 * QD, 0)) {
		close(dev);
		return 1;
	}
	if (upcie_uring_dmabufs_init(&tab, &ring, 1))
		goto out;
	dbuf = udmabuf_new((size_t)len, &memfd, &va);
	if (dbuf < 0)
		goto out;
	/* the table holds its own reference to the dma-buf from here on */
	if (upcie_uring_dmabuf_register(&tab, dbuf, dev, &slot))
		goto out;

	/* CHUNK-sized reads, QD of them in flight; io[k] is reused once it ended */
	memset(io, 0, sizeof(io));
	for (k = 0; k < QD && queued < len; k++) {
		io[k].slot = (uint16_t)slot;
		io[k].op = UPCIE_URING_DMABUF_READ;
		io[k].buf_off = queued;
		io[k].file_off = off + queued;
		io[k].len = (uint32_t)(len - queued < CHUNK ? len - queued : CHUNK);
		queued += io[k].len;
		if (upcie_uring_dmabuf_queue(&tab, &io[k]))
			goto out;
	}
	while (ended < len) {
		int n;

		if (upcie_uring_submit(&ring, 0) < 0)
			goto out;
		n = upcie_uring_dmabuf_reap(&tab, done, QD, 1);
		if (n < 0)
			goto out;
		for (int i = 0; i < n; i++) {
			struct upcie_uring_dmabuf_io *d = done[i];

			if (d->res != (int32_t)d->len) {
				fprintf(stderr, "read of %u bytes at %" PRIu64 ": %s\n", d->len,
					d->file_off, d->res < 0 ? strerror(-d->res) : "short");
				goto out;
			}
			ended += d->len;
			if (queued < len) {
				d->buf_off = queued;
				d->file_off = off + queued;
				d->len = (uint32_t)(len - queued < CHUNK ? len - queued : CHUNK);
				queued += d->len;
				if (upcie_uring_dmabuf_queue(&tab, d))
					goto out;
			}
		}
	}

	/* the same range by an ordinary O_DIRECT read */
	if (posix_memalign(&check, 4096, (size_t)len) ||
	    pread(dev, check, (size_t)len, (off_t)off) != (ssize_t)len) {
		perror("pread");
		goto out;
	}
	rc = memcmp(va, check, (size_t)len) ? 1 : 0;
	printf("%s: %" PRIu64 " bytes at %" PRIu64 " read into a udmabuf through io_uring (%" PRIu64
	       " spurious -EAGAIN issued again): %s\n",
	       argv[1], len, off, tab.reissued,
	       rc ? "DIFFERENT from an ordinary read" : "identical to an ordinary read");
out:
	err = upcie_uring_dmabufs_fini(&tab);
	if (err && rc == 0)
		rc = 1;
	free(check);
	if (va && va != MAP_FAILED)
		munmap(va, (size_t)len);
	if (dbuf >= 0)
		close(dbuf);
	if (memfd >= 0)
		close(memfd);
	upcie_uring_fini(&ring);
	close(dev);
	return rc;
}
