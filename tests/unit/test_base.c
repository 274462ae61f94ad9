/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests for base/: bit helpers, logging configuration and handler, deadlines, MMIO. */
#include <upcie/base/bits.h>
#include <upcie/base/barrier.h>
#include <upcie/base/clock.h>
#include <upcie/base/log.h>
#include <upcie/base/mmio.h>
#include <upcie/base/sysfs.h>

#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "check.h"

static char last_msg[512];
static int last_level, calls;

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)ctx;
	last_level = (int)level;
	snprintf(last_msg, sizeof(last_msg), "%s", msg);
	calls++;
}

static void test_bits(void)
{
	CHECK_EQ(upcie_bits_get(0x004018200f0107ffull, 0, 16), 0x07ff, "bits_get low field");
	CHECK_EQ(upcie_bits_get(0x004018200f0107ffull, 24, 8), 0x0f, "bits_get byte 3");
	CHECK_EQ(upcie_bits_get(0xffffffffffffffffull, 0, 64), -1, "bits_get full width");
	CHECK_EQ(upcie_bits_set(0, 4, 3, 0xff), 0x70, "bits_set truncates the field");
	CHECK_EQ(upcie_bits_set(0xffff, 4, 4, 0), 0xff0f, "bits_set clears the field");
	CHECK(upcie_is_pow2(4096) && !upcie_is_pow2(0) && !upcie_is_pow2(12), "is_pow2");
	CHECK_EQ(upcie_align_up(4097, 4096), 8192, "align_up");
	CHECK_EQ(upcie_align_up(4096, 4096), 4096, "align_up of aligned value");
	CHECK_EQ(upcie_align_down(8191, 4096), 4096, "align_down");
	CHECK_EQ(upcie_div_round_up(1, 4096), 1, "div_round_up small");
	CHECK_EQ(upcie_div_round_up(8192, 4096), 2, "div_round_up exact");
	CHECK_EQ(upcie_log2(1), 0, "log2(1)");
	CHECK_EQ(upcie_log2(4096), 12, "log2(4096)");
	CHECK_EQ(upcie_log2(4097), 12, "log2 floors");
	{
		uint64_t r;

		CHECK(upcie_add_overflow(UINT64_MAX, 1, &r), "add overflow detected");
		CHECK(!upcie_add_overflow(1, 2, &r) && r == 3, "add without overflow");
		CHECK(upcie_mul_overflow(UINT64_MAX / 2, 3, &r), "mul overflow detected");
	}
}

static void test_log(void)
{
	CHECK_EQ(upcie_log_level_parse("debug"), UPCIE_LOG_DEBUG, "level name");
	CHECK_EQ(upcie_log_level_parse("0"), UPCIE_LOG_NONE, "level digit");
	CHECK_EQ(upcie_log_level_parse("5"), -EINVAL, "level 5 rejected");
	CHECK_EQ(upcie_log_level_parse("verbose"), -EINVAL, "unknown level rejected");
	CHECK_EQ(upcie_log_level_parse(NULL), -EINVAL, "NULL level rejected");

	upcie_log_set_handler(capture, NULL);
	upcie_log_set_level(UPCIE_LOG_WARN);
	calls = 0;
	UPCIE_INFO("hidden %d", 1);
	CHECK_EQ(calls, 0, "info suppressed at warn level");
	UPCIE_WARN("shown %d", 2);
	CHECK(calls == 1 && last_level == UPCIE_LOG_WARN && !strcmp(last_msg, "shown 2"),
	      "warn reaches the handler formatted");
	CHECK_EQ(UPCIE_FAIL(-EBUSY, "busy %s", "x"), -EBUSY, "UPCIE_FAIL evaluates to the error");
	CHECK(!strcmp(last_msg, "busy x"), "UPCIE_FAIL logs");
	upcie_log_set_level(UPCIE_LOG_NONE);
	UPCIE_ERR("nothing");
	CHECK_EQ(calls, 2, "level none silences errors");
	upcie_log_set_handler(NULL, NULL);
	upcie_log_set_level(UPCIE_LOG_ERROR);
	CHECK(!strcmp(upcie_errno_name(-EINVAL), "EINVAL") &&
		  !strcmp(upcie_errno_name(ENODEV), "ENODEV"),
	      "errno names, either sign");
	errno = 0;
	CHECK_EQ(upcie_neg_errno(), -EIO, "neg_errno never returns 0");
}

static void test_clock(void)
{
	struct upcie_deadline d;
	uint64_t t0 = upcie_time_ns(), t1;

	upcie_sleep_ns(2 * UPCIE_NSEC_PER_MSEC);
	t1 = upcie_time_ns();
	CHECK(t1 - t0 >= 2 * UPCIE_NSEC_PER_MSEC, "sleep_ns sleeps at least as long as asked");
	upcie_deadline_set(&d, 0);
	CHECK(upcie_deadline_passed(&d), "zero timeout has passed");
	CHECK_EQ(upcie_deadline_remaining_ns(&d), 0, "zero timeout has nothing left");
	upcie_deadline_set(&d, UPCIE_TIMEOUT_INF);
	CHECK(!upcie_deadline_passed(&d) && upcie_deadline_remaining_ns(&d) == UINT64_MAX,
	      "infinite deadline never passes");
	upcie_deadline_set(&d, UINT64_MAX - 1);
	CHECK(!upcie_deadline_passed(&d), "huge timeout does not wrap into the past");
	upcie_deadline_set(&d, 1 * UPCIE_NSEC_PER_MSEC);
	CHECK(!upcie_deadline_passed(&d) || upcie_deadline_remaining_ns(&d) == 0,
	      "1 ms deadline consistent");
	while (!upcie_deadline_passed(&d))
		upcie_cpu_relax();
	CHECK(upcie_deadline_remaining_ns(&d) == 0, "deadline passes after spinning");
}

static void test_mmio(void)
{
	uint32_t regs[4] = { 0 };

	upcie_mmio_write32(regs, 4, 0xdeadbeef);
	CHECK_EQ(regs[1], 0xdeadbeef, "mmio write32 at offset");
	CHECK_EQ(upcie_mmio_read32(regs, 4), 0xdeadbeef, "mmio read32 at offset");
	upcie_mmio_write64_lohi(regs, 8, 0x1122334455667788ull);
	CHECK(regs[2] == 0x55667788 && regs[3] == 0x11223344, "write64_lohi splits low first");
	CHECK_EQ(upcie_mmio_read64_lohi(regs, 8), 0x1122334455667788ull, "read64_lohi joins");
	upcie_wmb();
	upcie_rmb();
	upcie_mb();
	upcie_dma_wmb();
	upcie_dma_rmb();
}

static void test_sysfs_files(void)
{
	char dir[] = "/tmp/upcie-base-XXXXXX", path[256], buf[16];
	uint64_t u;
	int64_t s;
	FILE *f;

	CHECK(mkdtemp(dir) != NULL, "temp dir");
	snprintf(path, sizeof(path), "%s/v", dir);
	f = fopen(path, "w");
	fputs("0x1b36\n", f);
	fclose(f);
	CHECK(upcie_file_read_u64(path, &u) == 0 && u == 0x1b36, "read hex value");
	unlink(path);
	close(open(path, O_CREAT | O_WRONLY, 0600));
	CHECK_EQ(upcie_file_write_str(path, "-1\n"), 0, "write value");
	CHECK(upcie_file_read_s64(path, &s) == 0 && s == -1, "read signed value");
	CHECK_EQ(upcie_file_read_u64(path, &u), -EINVAL, "'-1' is not an unsigned value");
	unlink(path);
	close(open(path, O_CREAT | O_WRONLY, 0600));
	CHECK_EQ(upcie_file_write_str(path, "0123456789abcdefXYZ"), 0, "write long value");
	CHECK_EQ(upcie_file_read_str(path, buf, sizeof(buf)), 15,
		 "read_str truncates to the buffer");
	CHECK_EQ(upcie_file_read_u64("/nonexistent/upcie", &u), -ENOENT, "missing file is -ENOENT");
	CHECK_EQ(upcie_path_fmt(buf, 4, "%s", "toolong"), -ENAMETOOLONG, "path_fmt overflow");
	unlink(path);
	rmdir(dir);
	setenv("UPCIE_SYSFS_ROOT", "/x", 1);
	CHECK(!strcmp(upcie_sysfs_root(), "/x"), "sysfs root from the environment");
	unsetenv("UPCIE_SYSFS_ROOT");
	CHECK(!strcmp(upcie_sysfs_root(), "/sys"), "sysfs root default");
}

int main(void)
{
	test_bits();
	test_log();
	test_clock();
	test_mmio();
	test_sysfs_files();
	return check_done();
}
