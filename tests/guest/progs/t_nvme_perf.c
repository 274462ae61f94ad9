/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * t_nvme_perf: 4 KiB random reads on one emulated NVMe controller in the same boot, first
 * through the kernel nvme driver, then through upcie's driver (nvme/ctrl.h, nvme/ns.h) after
 * taking the controller from the kernel. A benchmark that prints figures, not a timed test.
 *
 *   kernel  QD1   O_DIRECT pread(), one at a time               p50/p99/mean latency, IOPS
 *   kernel  QD1   io_uring (raw syscalls, interrupt driven)     p50/p99/mean latency, IOPS
 *   kernel  QD32  libaio (io_setup/io_submit/io_getevents)      IOPS
 *   kernel  QD32  io_uring                                       IOPS
 *   upcie   QD1   submit one Read, spin on the CQ               p50/p99/mean latency, IOPS
 *   upcie   QD32  32 Reads in flight, completions polled        IOPS
 *   upcie   QD1, QD32 again with the CQ's MSI-X vector: sleep on its eventfd between completions
 *                 (vfio paths only)
 *
 * Timing: per-I/O latencies use the TSC (calibrated against CLOCK_MONOTONIC), since a guest
 * clock_gettime() costs microseconds (HPET); IOPS and mean latency come from timing whole
 * batches with CLOCK_MONOTONIC. Beside IOPS, each run reports CPU time per I/O twice: this
 * process's (CLOCK_PROCESS_CPUTIME_ID: user and system time, so the kernel side's syscalls
 * count) and the whole guest's busy time (all vCPUs, interrupt and softirq time included, so
 * the kernel driver's completion work counts wherever it ran): the batch's wall time on every
 * online CPU less the idle and iowait time /proc/stat reports. Those two come from clock
 * readings at idle entry and exit (NO_HZ idle accounting); the user and system fields are sampled at timer ticks,
 * which an emulated guest loses while a vCPU spins (they showed less busy time than this
 * process alone used), so they are not used. IOPS alone compares schedulers on an emulated
 * machine: a poller spinning on a vCPU competes with the emulator's threads that run the
 * controller, while the kernel driver sleeps on interrupts. Offsets are uniformly random
 * 4 KiB-aligned over the namespace; every read's first unit is checked against the backing
 * pattern (unit index and tag), on both sides, so neither side can win by not moving data. Each run starts with a short warm-up.
 *
 * Usage: t_nvme_perf --dev /dev/nvmeXnY --bdf BDF [--path uio|type1|iommufd] [--qd1 N]
 *                    [--qd32 N] [--tag TAG]
 * Prints one "# tb: perf_<what>=<value>" line per figure for scripts.
 */
// testbed-ldflags: -lpthread
#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <linux/io_uring.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <upcie/base/clock.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#include "t_nvme_util.h"

#define BS 4096u

static double g_tsc_per_ns;
static uint64_t g_blocks; /* 4 KiB blocks in the namespace */
static char g_tag[9];
/* at the start of a measured batch: process CPU time (ns), guest idle + iowait (ticks) */
static uint64_t g_cpu0, g_idle0;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static long g_bad;

static inline uint64_t rdtsc(void)
{
	uint32_t lo, hi;

	__asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
	return ((uint64_t)hi << 32) | lo;
}

static uint64_t rnd_block(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return g_rng % g_blocks;
}

/* TSC ticks per ns over ~200 ms. */
static void tsc_calibrate(void)
{
	uint64_t t0 = upcie_time_ns(), c0 = rdtsc(), t1, c1;

	do {
		t1 = upcie_time_ns();
	} while (t1 - t0 < 200 * UPCIE_NSEC_PER_MSEC);
	c1 = rdtsc();
	g_tsc_per_ns = (double)(c1 - c0) / (double)(t1 - t0);
}

/* Unit index and tag of the first 512-byte unit of the block read at `blk`. */
static void verify(const void *buf, uint64_t blk)
{
	const uint8_t *p = (const uint8_t *)buf;
	uint64_t u = 0;

	for (int i = 7; i >= 0; i--)
		u = (u << 8) | p[i];
	if (u != blk * (BS / 512) || memcmp(p + 8, g_tag, 8))
		g_bad++;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

struct result {
	double p50_us, p99_us, mean_us, iops;
	double cpu_us, busy_us; /* per I/O: this process's CPU time, the whole guest's busy time */
	uint64_t n;
};

static uint64_t cpu_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * UPCIE_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

/* Idle and iowait ticks of all CPUs (fields 4 and 5 of /proc/stat's "cpu" line). */
static uint64_t idle_ticks(void)
{
	unsigned long long v[5] = { 0 };
	FILE *f = fopen("/proc/stat", "r");
	int got;

	if (!f)
		return 0;
	got = fscanf(f, "cpu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4]);
	fclose(f);
	return got == 5 ? v[3] + v[4] : 0;
}

/* Start of a measured batch (after warm-up): wall clock returned, CPU clocks kept. */
static uint64_t run_start(void)
{
	g_cpu0 = cpu_ns();
	g_idle0 = idle_ticks();
	return upcie_time_ns();
}

/* Percentiles of `lat` (TSC ticks), mean and IOPS from the batch time. */
static void summarize(uint64_t *lat, uint64_t n, uint64_t batch_ns, struct result *r)
{
	uint64_t cpu = cpu_ns() - g_cpu0, idle = idle_ticks() - g_idle0;
	long hz = sysconf(_SC_CLK_TCK), ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	double busy_ns = (double)batch_ns * (double)(ncpu > 0 ? ncpu : 1) -
			 (hz > 0 ? (double)idle * 1e9 / (double)hz : 0);

	memset(r, 0, sizeof(*r));
	r->n = n;
	r->cpu_us = n ? (double)cpu / 1000.0 / (double)n : 0;
	r->busy_us = n && busy_ns > 0 ? busy_ns / 1000.0 / (double)n : 0;
	r->iops = batch_ns ? (double)n * 1e9 / (double)batch_ns : 0;
	r->mean_us = n ? (double)batch_ns / 1000.0 / (double)n : 0;
	if (lat && n) {
		qsort(lat, n, sizeof(*lat), cmp_u64);
		r->p50_us = (double)lat[n / 2] / g_tsc_per_ns / 1000.0;
		r->p99_us = (double)lat[(n * 99) / 100] / g_tsc_per_ns / 1000.0;
	}
}

static void report(const char *key, const char *what, const struct result *r, bool lat)
{
	if (lat) {
		printf("%-44s p50 %7.1f us  p99 %7.1f us  mean %7.1f us  %8.0f IOPS  (%llu IOs)\n",
		       what, r->p50_us, r->p99_us, r->mean_us, r->iops, (unsigned long long)r->n);
		printf("# tb: perf_%s_p50_us=%.1f\n# tb: perf_%s_p99_us=%.1f\n", key, r->p50_us,
		       key, r->p99_us);
	} else {
		printf("%-44s %8.0f IOPS  (%llu IOs, mean %.1f us per IO)\n", what, r->iops,
		       (unsigned long long)r->n, r->mean_us);
	}
	printf("%-44s CPU per IO: %.1f us this process, %.1f us whole guest\n", "", r->cpu_us,
	       r->busy_us);
	printf("# tb: perf_%s_cpu_us=%.1f\n# tb: perf_%s_busy_us=%.1f\n", key, r->cpu_us, key,
	       r->busy_us);
	printf("# tb: perf_%s_iops=%.0f\n", key, r->iops);
	fflush(stdout);
}

/* ---------------------------------------------------------------------------------------------
 * kernel: O_DIRECT pread
 */
/* pread() of one block, retried when a signal interrupts it. */
static int pread_block(int fd, void *buf, uint64_t b)
{
	ssize_t got;

	do
		got = pread(fd, buf, BS, (off_t)(b * BS));
	while (got < 0 && errno == EINTR);
	return got == BS ? 0 : got < 0 ? -errno : -EIO;
}

static int kernel_pread_qd1(int fd, void *buf, uint64_t n, struct result *r)
{
	uint64_t *lat = (uint64_t *)calloc(n, sizeof(*lat)), t0;

	int err = 0;

	for (uint64_t i = 0; i < 200 && !err; i++)
		err = pread_block(fd, buf, rnd_block());
	t0 = run_start();
	for (uint64_t i = 0; i < n && !err; i++) {
		uint64_t b = rnd_block(), c = rdtsc();

		err = pread_block(fd, buf, b);
		lat[i] = rdtsc() - c;
		verify(buf, b);
	}
	summarize(lat, n, upcie_time_ns() - t0, r);
	free(lat);
	return err;
}

/* ---------------------------------------------------------------------------------------------
 * kernel: libaio through the raw system calls
 */
static int kernel_aio(int fd, uint8_t *bufs, unsigned qd, uint64_t n, struct result *r)
{
	aio_context_t ctx = 0;
	struct iocb *cbs = (struct iocb *)calloc(qd, sizeof(*cbs));
	struct iocb **ptrs = (struct iocb **)calloc(qd, sizeof(*ptrs));
	struct io_event *ev = (struct io_event *)calloc(qd, sizeof(*ev));
	uint64_t *blk = (uint64_t *)calloc(qd, sizeof(*blk));
	uint64_t done = 0, sub = 0, warm = 500, t0 = 0;
	int err = 0;

	if (syscall(SYS_io_setup, qd, &ctx))
		return -errno;
	for (unsigned i = 0; i < qd; i++) {
		blk[i] = rnd_block();
		cbs[i].aio_fildes = (uint32_t)fd;
		cbs[i].aio_lio_opcode = IOCB_CMD_PREAD;
		cbs[i].aio_buf = (uint64_t)(uintptr_t)(bufs + (uint64_t)i * BS);
		cbs[i].aio_nbytes = BS;
		cbs[i].aio_offset = (int64_t)(blk[i] * BS);
		cbs[i].aio_data = i;
		ptrs[i] = &cbs[i];
	}
	if (syscall(SYS_io_submit, ctx, (long)qd, ptrs) != (long)qd) {
		err = -errno;
		goto out;
	}
	sub = qd;
	while (done < n + warm) {
		long got = syscall(SYS_io_getevents, ctx, 1L, (long)qd, ev, NULL);
		long nsub = 0;

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			err = -errno;
			break;
		}
		for (long k = 0; k < got; k++) {
			unsigned i = (unsigned)ev[k].data;

			if (ev[k].res != BS)
				g_bad++;
			verify(bufs + (uint64_t)i * BS, blk[i]);
			if (++done == warm)
				t0 = run_start();
			if (sub < n + warm) {
				blk[i] = rnd_block();
				cbs[i].aio_offset = (int64_t)(blk[i] * BS);
				ptrs[nsub++] = &cbs[i];
				sub++;
			}
		}
		while (nsub) {
			long put = syscall(SYS_io_submit, ctx, nsub, ptrs);

			if (put < 0 && errno == EINTR)
				continue;
			if (put <= 0) {
				err = put < 0 ? -errno : -EIO;
				break;
			}
			memmove(ptrs, ptrs + put, (size_t)(nsub - put) * sizeof(*ptrs));
			nsub -= put;
		}
		if (err)
			break;
	}
	summarize(NULL, n, upcie_time_ns() - t0, r);
out:
	syscall(SYS_io_destroy, ctx);
	free(cbs);
	free(ptrs);
	free(ev);
	free(blk);
	return err;
}

/* ---------------------------------------------------------------------------------------------
 * kernel: io_uring through the raw system calls (no liburing in the guest)
 */
struct uring {
	int fd;
	unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
	struct io_uring_sqe *sqes;
	struct io_uring_cqe *cqes;
	void *sq_ring, *cq_ring;
	size_t sq_len, cq_len, sqes_len;
};

static int uring_open(struct uring *u, unsigned entries)
{
	struct io_uring_params p;

	memset(u, 0, sizeof(*u));
	memset(&p, 0, sizeof(p));
	u->fd = (int)syscall(__NR_io_uring_setup, entries, &p);
	if (u->fd < 0)
		return -errno;
	u->sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
	u->cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
	u->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
	u->sq_ring = mmap(NULL, u->sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd,
			  IORING_OFF_SQ_RING);
	u->cq_ring = mmap(NULL, u->cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd,
			  IORING_OFF_CQ_RING);
	u->sqes = (struct io_uring_sqe *)mmap(NULL, u->sqes_len, PROT_READ | PROT_WRITE,
					      MAP_SHARED | MAP_POPULATE, u->fd, IORING_OFF_SQES);
	if (u->sq_ring == MAP_FAILED || u->cq_ring == MAP_FAILED || u->sqes == MAP_FAILED)
		return -ENOMEM;
	u->sq_head = (unsigned *)((char *)u->sq_ring + p.sq_off.head);
	u->sq_tail = (unsigned *)((char *)u->sq_ring + p.sq_off.tail);
	u->sq_mask = (unsigned *)((char *)u->sq_ring + p.sq_off.ring_mask);
	u->sq_array = (unsigned *)((char *)u->sq_ring + p.sq_off.array);
	u->cq_head = (unsigned *)((char *)u->cq_ring + p.cq_off.head);
	u->cq_tail = (unsigned *)((char *)u->cq_ring + p.cq_off.tail);
	u->cq_mask = (unsigned *)((char *)u->cq_ring + p.cq_off.ring_mask);
	u->cqes = (struct io_uring_cqe *)((char *)u->cq_ring + p.cq_off.cqes);
	return 0;
}

static void uring_close(struct uring *u)
{
	if (u->sqes && u->sqes != MAP_FAILED)
		munmap(u->sqes, u->sqes_len);
	if (u->cq_ring && u->cq_ring != MAP_FAILED)
		munmap(u->cq_ring, u->cq_len);
	if (u->sq_ring && u->sq_ring != MAP_FAILED)
		munmap(u->sq_ring, u->sq_len);
	if (u->fd > 0)
		close(u->fd);
}

static void uring_prep_read(struct uring *u, int fd, void *buf, uint64_t off, uint64_t data)
{
	unsigned tail = *u->sq_tail, idx = tail & *u->sq_mask;
	struct io_uring_sqe *sqe = &u->sqes[idx];

	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = IORING_OP_READ;
	sqe->fd = fd;
	sqe->addr = (uint64_t)(uintptr_t)buf;
	sqe->len = BS;
	sqe->off = off;
	sqe->user_data = data;
	u->sq_array[idx] = idx;
	__atomic_store_n(u->sq_tail, tail + 1, __ATOMIC_RELEASE);
}

static int uring_run(int fd, uint8_t *bufs, unsigned qd, uint64_t n, struct result *r, bool per_io)
{
	struct uring u;
	uint64_t *blk = (uint64_t *)calloc(qd, sizeof(*blk)), *stamp = NULL, *lat = NULL;
	uint64_t done = 0, sub = 0, warm = per_io ? 200 : 500, t0 = 0;
	unsigned pending = 0;
	int err = uring_open(&u, qd);

	if (err)
		goto out;
	if (per_io) {
		stamp = (uint64_t *)calloc(qd, sizeof(*stamp));
		lat = (uint64_t *)calloc(n, sizeof(*lat));
	}
	for (unsigned i = 0; i < qd; i++) {
		blk[i] = rnd_block();
		if (stamp)
			stamp[i] = rdtsc();
		uring_prep_read(&u, fd, bufs + (uint64_t)i * BS, blk[i] * BS, i);
		pending++;
	}
	sub = qd;
	while (done < n + warm) {
		unsigned head, tail;
		long ret =
		    syscall(__NR_io_uring_enter, u.fd, pending, 1, IORING_ENTER_GETEVENTS, NULL, 0);

		if (ret < 0 && errno == EINTR)
			continue;
		if (ret < 0) {
			err = -errno;
			break;
		}
		/* what it consumed is submitted; the rest goes with the next call */
		pending -= (unsigned)ret < pending ? (unsigned)ret : pending;
		head = *u.cq_head;
		tail = __atomic_load_n(u.cq_tail, __ATOMIC_ACQUIRE);
		for (; head != tail; head++) {
			struct io_uring_cqe *cqe = &u.cqes[head & *u.cq_mask];
			unsigned i = (unsigned)cqe->user_data;

			if (cqe->res != BS)
				g_bad++;
			verify(bufs + (uint64_t)i * BS, blk[i]);
			if (lat && done >= warm && done - warm < n)
				lat[done - warm] = rdtsc() - stamp[i];
			if (++done == warm)
				t0 = run_start();
			if (sub < n + warm) {
				blk[i] = rnd_block();
				if (stamp)
					stamp[i] = rdtsc();
				uring_prep_read(&u, fd, bufs + (uint64_t)i * BS, blk[i] * BS, i);
				pending++;
				sub++;
			}
		}
		__atomic_store_n(u.cq_head, head, __ATOMIC_RELEASE);
	}
	summarize(lat, n, upcie_time_ns() - t0, r);
out:
	uring_close(&u);
	free(blk);
	free(stamp);
	free(lat);
	return err;
}

/* ---------------------------------------------------------------------------------------------
 * upcie
 */
struct slot {
	struct upcie_nvme_req req;
	uint64_t blk, off;
};

static int upcie_qd1(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns,
		     const struct upcie_dmamem *mem, uint64_t n, struct result *r)
{
	/* spin on the CQ; an interrupt queue sleeps on its vector instead (upcie_nvme_ioq_wait) */
	uint64_t *lat = (uint64_t *)calloc(n, sizeof(*lat)), t0 = 0;
	uint64_t spb = BS / ns->lba_bytes;
	struct upcie_nvme_req req;
	int err = 0;

	memset(&req, 0, sizeof(req));
	for (uint64_t i = 0; i < n + 200 && !err; i++) {
		uint64_t b = rnd_block(), c;

		if (i == 200)
			t0 = run_start();
		c = rdtsc();
		err = upcie_nvme_ioq_read(q, ns, b * spb, mem, 0, BS, &req);
		if (!err && q->irq)
			err = upcie_nvme_ioq_wait(q, &req, 5 * UPCIE_NSEC_PER_SEC);
		while (!err && !req.done)
			upcie_nvme_ioq_poll(q, 1);
		if (i >= 200)
			lat[i - 200] = rdtsc() - c;
		if (req.err)
			g_bad++;
		verify(mem->vaddr, b);
	}
	summarize(lat, n, upcie_time_ns() - t0, r);
	free(lat);
	return err;
}

static void slot_cb(struct upcie_nvme_req *r)
{
	(void)r;
}

static int upcie_qdn(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns,
		     const struct upcie_dmamem *mem, unsigned qd, uint64_t n, struct result *r)
{
	struct slot *s = (struct slot *)calloc(qd, sizeof(*s));
	uint64_t spb = BS / ns->lba_bytes, done = 0, sub = 0, warm = 500, t0 = 0;
	int err = 0;

	for (unsigned i = 0; i < qd && !err; i++) {
		s[i].off = (uint64_t)i * BS;
		s[i].blk = rnd_block();
		s[i].req.cb = slot_cb;
		err = upcie_nvme_ioq_read(q, ns, s[i].blk * spb, mem, s[i].off, BS, &s[i].req);
		sub++;
	}
	while (!err && done < n + warm) {
		if (upcie_nvme_ioq_poll(q, qd) <= 0) {
			if (q->irq)
				upcie_nvme_ioq_irq_wait(q, UPCIE_NSEC_PER_SEC);
			continue;
		}
		for (unsigned i = 0; i < qd && !err; i++) {
			if (!s[i].req.done)
				continue;
			if (s[i].req.err)
				g_bad++;
			verify((uint8_t *)mem->vaddr + s[i].off, s[i].blk);
			s[i].req.done = false;
			if (++done == warm)
				t0 = run_start();
			if (sub < n + warm) {
				s[i].blk = rnd_block();
				err = upcie_nvme_ioq_read(q, ns, s[i].blk * spb, mem, s[i].off, BS,
							  &s[i].req);
				sub++;
			}
		}
	}
	summarize(NULL, n, upcie_time_ns() - t0, r);
	free(s);
	return err;
}

int main(int argc, char **argv)
{
	const char *dev = NULL, *bdf_s = NULL, *path_s = "auto";
	uint64_t n1 = 4000, n32 = 20000;
	struct upcie_pci_bdf bdf;
	struct result kp, ku1, ka, ku, u1, u32;
	struct upcie_nvme_ctrl_opts o;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ns ns;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ioq_opts qo;
	struct upcie_dmamem mem;
	uint8_t *bufs = NULL;
	int fd, err;

	setvbuf(stdout, NULL, _IOLBF, 0);
	upcie_log_set_handler(tn_log, NULL);
	tn_tag(g_tag, "c0n1");
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--dev") && i + 1 < argc)
			dev = argv[++i];
		else if (!strcmp(argv[i], "--bdf") && i + 1 < argc)
			bdf_s = argv[++i];
		else if (!strcmp(argv[i], "--path") && i + 1 < argc)
			path_s = argv[++i];
		else if (!strcmp(argv[i], "--qd1") && i + 1 < argc)
			n1 = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--qd32") && i + 1 < argc)
			n32 = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--tag") && i + 1 < argc)
			tn_tag(g_tag, argv[++i]);
		else
			bdf_s = NULL, i = argc;
	}
	memset(&o, 0, sizeof(o));
	if (!dev || !bdf_s || upcie_pci_bdf_parse(bdf_s, &bdf) ||
	    upcie_nvme_path_parse(path_s, &o.dev.path) || !n1 || !n32) {
		fprintf(stderr, "usage: t_nvme_perf --dev /dev/nvmeXnY --bdf BDF [--path P] "
				"[--qd1 N] [--qd32 N] [--tag NAME]\n");
		return 2;
	}
	tsc_calibrate();
	printf("# kernel %s, %s = %s, TSC %.3f GHz, %llu QD1 and %llu QD32 reads of 4 KiB\n",
	       tn_kernel(), dev, bdf_s, g_tsc_per_ns, (unsigned long long)n1,
	       (unsigned long long)n32);

	/* the kernel driver first */
	fd = open(dev, O_RDONLY | O_DIRECT);
	if (fd < 0 || posix_memalign((void **)&bufs, 4096, 64 * BS)) {
		fprintf(stderr, "t_nvme_perf: open %s: %s\n", dev, strerror(errno));
		return 1;
	}
	{
		uint64_t bytes = 0;

		if (ioctl(fd, _IOR(0x12, 114, size_t), &bytes) || !bytes) /* BLKGETSIZE64 */
			bytes = 32 * MiB;
		g_blocks = bytes / BS;
	}
	err = kernel_pread_qd1(fd, bufs, n1, &kp);
	if (!err)
		report("kernel_pread_qd1", "kernel nvme, O_DIRECT pread, QD1", &kp, true);
	if (!err)
		err = uring_run(fd, bufs, 1, n1, &ku1, true);
	if (!err)
		report("kernel_uring_qd1", "kernel nvme, io_uring, QD1", &ku1, true);
	if (!err)
		err = kernel_aio(fd, bufs, 32, n32, &ka);
	if (!err)
		report("kernel_aio_qd32", "kernel nvme, libaio, QD32", &ka, false);
	if (!err)
		err = uring_run(fd, bufs, 32, n32, &ku, false);
	if (!err)
		report("kernel_uring_qd32", "kernel nvme, io_uring, QD32", &ku, false);
	close(fd);
	free(bufs);
	if (err) {
		fprintf(stderr, "t_nvme_perf: kernel side: %s\n", strerror(-err));
		return 1;
	}

	/*
	 * Then upcie takes the controller; on vfio also with two MSI-X vectors. uio_pci_generic
	 * forwards INTx only, so asking for MSI-X there is an error: decide from the function's
	 * IOMMU group as --path auto does (a group means vfio) and ask only where it can work.
	 */
	{
		struct upcie_pci_func fn;
		bool uio = o.dev.path == UPCIE_NVME_PATH_UIO;

		if (o.dev.path == UPCIE_NVME_PATH_AUTO && !upcie_pci_func_read(&bdf, &fn))
			uio = fn.iommu_group < 0;
		o.irq_vectors = uio ? 0 : 2;
	}
	o.dev.bind = true;
	memset(&mem, 0, sizeof(mem));
	err = upcie_nvme_ctrl_open(&c, &bdf, &o);
	if (!err)
		err = upcie_nvme_ns_open(&ns, &c, 1);
	if (!err)
		err = upcie_nvme_dev_dmamem(&c.dev, 2 * MiB, &mem);
	memset(&qo, 0, sizeof(qo));
	qo.depth = 64;
	if (!err)
		err = upcie_nvme_ioq_create(&q, &c, &qo);
	if (err) {
		fprintf(stderr, "t_nvme_perf: upcie bring-up: %s\n", strerror(-err));
		upcie_dmamem_destroy(&mem);
		upcie_nvme_ctrl_close(&c);
		return 1;
	}
	g_blocks = ns.nsze * ns.lba_bytes / BS;
	printf("# upcie on the %s path (%s memory)%s\n", upcie_nvme_path_name(c.dev.path), mem.kind,
	       c.irqs.count
		   ? ""
		   : "; polled runs only (MSI-X needs vfio: uio_pci_generic forwards INTx only)");
	err = upcie_qd1(&q, &ns, &mem, n1, &u1);
	if (!err)
		report("upcie_qd1", "upcie, spin on the CQ, QD1", &u1, true);
	if (!err)
		err = upcie_qdn(&q, &ns, &mem, 32, n32, &u32);
	if (!err)
		report("upcie_qd32", "upcie, polled, QD32", &u32, false);
	upcie_nvme_ioq_delete(&q);
	if (!err && c.irqs.count) {
		struct upcie_nvme_ioq qi;
		struct result i1, i32;

		qo.irq = true;
		qo.vector = 1;
		err = upcie_nvme_ioq_create(&qi, &c, &qo);
		if (!err)
			err = upcie_qd1(&qi, &ns, &mem, n1, &i1);
		if (!err)
			report("upcie_irq_qd1", "upcie, MSI-X eventfd wait, QD1", &i1, true);
		if (!err)
			err = upcie_qdn(&qi, &ns, &mem, 32, n32, &i32);
		if (!err)
			report("upcie_irq_qd32", "upcie, MSI-X eventfd wait, QD32", &i32, false);
		upcie_nvme_ioq_delete(&qi);
	}
	upcie_dmamem_destroy(&mem);
	upcie_nvme_ctrl_close(&c);
	if (err) {
		fprintf(stderr, "t_nvme_perf: upcie side: %s\n", strerror(-err));
		return 1;
	}
	printf("ratio: QD1 p50 kernel pread / upcie = %.2fx, QD1 IOPS upcie / kernel pread = "
	       "%.2fx, QD32 IOPS upcie / kernel libaio = %.2fx, upcie / kernel io_uring = %.2fx\n",
	       kp.p50_us / u1.p50_us, u1.iops / kp.iops, u32.iops / ka.iops, u32.iops / ku.iops);
	printf(
	    "ratio: QD32 CPU per IO, whole guest: kernel libaio / upcie = %.2fx, kernel io_uring "
	    "/ upcie = %.2fx; this process: kernel libaio / upcie = %.2fx\n",
	    u32.busy_us > 0 ? ka.busy_us / u32.busy_us : 0,
	    u32.busy_us > 0 ? ku.busy_us / u32.busy_us : 0,
	    u32.cpu_us > 0 ? ka.cpu_us / u32.cpu_us : 0);
	printf("note: these ratios depend on the host more than on the drivers: the emulated "
	       "controller is run by the emulator's threads on the same host CPUs as this guest's "
	       "%ld vCPUs. upcie's poller spins on a vCPU and competes with those threads (its CPU "
	       "time per I/O includes the spinning while it waits); the kernel driver sleeps on "
	       "interrupts and leaves the CPU to them. A real controller does its work without the "
	       "host's CPUs.\n",
	       sysconf(_SC_NPROCESSORS_ONLN));
	printf("# tb: perf_bad_reads=%ld\n", g_bad);
	if (g_bad)
		printf("t_nvme_perf: %ld reads returned wrong data\n", g_bad);
	return g_bad ? 1 : 0;
}
