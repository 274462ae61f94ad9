/* SPDX-License-Identifier: BSD-3-Clause */
/* The tools' value parsers (tools/opt.h): what each accepts, what it refuses, and limits. */
#include <upcie/base/feature.h>

#include "../unit/check.h"
#include "opt.h"

static int item_u64(const char *s, uint64_t *v)
{
	return opt_u64(s, v);
}

int main(void)
{
	static const struct {
		const char *s;
		int err;
		uint64_t v;
	} sizes[] = {
		{ "4096", 0, 4096 },
		{ "4k", 0, 4096 },
		{ "4K", 0, 4096 },
		{ "4KiB", 0, 4096 },
		{ "4kb", 0, 4096 },
		{ "2M", 0, 2u << 20 },
		{ "2MiB", 0, 2u << 20 },
		{ "1G", 0, 1u << 30 },
		{ "1GiB", 0, 1u << 30 },
		{ "1T", 0, 1ull << 40 },
		{ "0x1000", 0, 4096 },
		{ "010", 0, 10 },
		{ "16777215T", 0, 16777215ull << 40 },
		{ "16777216T", -ERANGE, 0 },
		{ "18446744073709551615", 0, UINT64_MAX },
		{ "18446744073709551616", -ERANGE, 0 },
		{ "", -EINVAL, 0 },
		{ "k", -EINVAL, 0 },
		{ "-4k", -EINVAL, 0 },
		{ "+4k", -EINVAL, 0 },
		{ " 4k", -EINVAL, 0 },
		{ "4k ", -EINVAL, 0 },
		{ "4x", -EINVAL, 0 },
		{ "4kk", -EINVAL, 0 },
		{ "1.5k", -EINVAL, 0 },
		{ "0x", -EINVAL, 0 },
	};
	static const struct {
		const char *s;
		int err;
		uint64_t ns;
	} times[] = {
		{ "1", 0, 1000000000ull },
		{ "1s", 0, 1000000000ull },
		{ "1m", 0, 60000000000ull },
		{ "1min", 0, 60000000000ull },
		{ "1h", 0, 3600000000000ull },
		{ "500ms", 0, 500000000ull },
		{ "250us", 0, 250000ull },
		{ "7ns", 0, 7 },
		{ "0.5", 0, 500000000ull },
		{ ".5s", 0, 500000000ull },
		{ "1.25m", 0, 75000000000ull },
		{ "0", 0, 0 },
		{ "", -EINVAL, 0 },
		{ ".", -EINVAL, 0 },
		{ "1x", -EINVAL, 0 },
		{ "1M", -EINVAL, 0 },
		{ "-1", -EINVAL, 0 },
		{ "1e3", -EINVAL, 0 },
		{ "inf", -EINVAL, 0 },
		{ "nan", -EINVAL, 0 },
		{ "0x10", -EINVAL, 0 },
		{ "1 s", -EINVAL, 0 },
		{ "99999999999", -ERANGE, 0 },
	};
	uint64_t v, l[4];
	unsigned m, n;
	gid_t g;
	uid_t u;

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		int err;

		v = 12345;
		err = opt_size(sizes[i].s, &v);
		CHECK(err == sizes[i].err && v == (err ? 12345 : sizes[i].v),
		      "size '%s': %d, %" PRIu64, sizes[i].s, err, v);
	}
	for (size_t i = 0; i < sizeof(times) / sizeof(times[0]); i++) {
		int err;

		v = 12345;
		err = opt_time_ns(times[i].s, &v);
		CHECK(err == times[i].err && v == (err ? 12345 : times[i].ns),
		      "time '%s': %d, %" PRIu64 " ns", times[i].s, err, v);
	}
	CHECK(opt_u64("4k", &v) == -EINVAL, "a plain integer takes no suffix");
	CHECK(opt_u64_range("5", 1, 4, &v) == -ERANGE, "range: above the maximum");
	CHECK(opt_u64_range("0", 1, 4, &v) == -ERANGE, "range: below the minimum");
	CHECK(opt_unsigned("4", 1, 4, &m) == 0 && m == 4, "range: the maximum itself");
	CHECK(opt_mode("666", &m) == 0 && m == 0666, "mode 666 is octal");
	CHECK(opt_mode("0660", &m) == 0 && m == 0660, "mode 0660");
	CHECK(opt_mode("8", &m) == -EINVAL, "mode 8 is no octal digit");
	CHECK(opt_mode("", &m) == -EINVAL, "empty mode");
	CHECK(opt_mode("17777", &m) == -ERANGE, "mode above 07777");
	CHECK(opt_gid("root", &g) == 0 && g == 0, "group root by name");
	CHECK(opt_gid("1234", &g) == 0 && g == 1234, "group by number");
	CHECK(opt_gid("no-such-group-29", &g) == -ENOENT, "unknown group name");
	CHECK(opt_uid("root", &u) == 0 && u == 0, "user root by name");
	CHECK(opt_uid("4294967295", &u) == -ERANGE, "uid -1 is not a user");
	CHECK(opt_list("1,2,3", item_u64, l, 4, &n) == 0 && n == 3 && l[2] == 3, "list of three");
	CHECK(opt_list("1,2,3,4,5", item_u64, l, 4, &n) == -EINVAL, "list longer than its room");
	CHECK(opt_list("1,", item_u64, l, 4, &n) == -EINVAL, "list with an empty item");
	CHECK(opt_list(",1", item_u64, l, 4, &n) == -EINVAL, "list starting empty");
	CHECK(opt_list("1,x", item_u64, l, 4, &n) == -EINVAL, "list with a bad item");
	{
		int cpus[8];
		double d;

		CHECK(opt_cpulist("0-3,8,10-11", 16, cpus, 8, &n) == 0 && n == 7 && cpus[3] == 3 &&
			  cpus[4] == 8 && cpus[6] == 11,
		      "cpu list 0-3,8,10-11: 7 CPUs in order");
		CHECK(opt_cpulist("5", 16, cpus, 8, &n) == 0 && n == 1 && cpus[0] == 5,
		      "cpu list 5");
		CHECK(opt_cpulist("3-1", 16, cpus, 8, &n) == -ERANGE, "cpu range backwards");
		CHECK(opt_cpulist("16", 16, cpus, 8, &n) == -ERANGE, "cpu at the limit");
		CHECK(opt_cpulist("0-8", 16, cpus, 8, &n) == -ERANGE, "more CPUs than room");
		CHECK(opt_cpulist("1,1", 16, cpus, 8, &n) == -EINVAL, "a CPU twice");
		CHECK(opt_cpulist("0-2,1", 16, cpus, 8, &n) == -EINVAL, "a CPU twice, in a range");
		CHECK(opt_cpulist("1,", 16, cpus, 8, &n) == -EINVAL, "cpu list ending in a comma");
		CHECK(opt_cpulist("1-", 16, cpus, 8, &n) == -EINVAL, "open cpu range");
		CHECK(opt_cpulist("0x1", 16, cpus, 8, &n) == -EINVAL, "hex cpu");
		CHECK(opt_cpulist("-1", 16, cpus, 8, &n) == -EINVAL, "negative cpu");
		CHECK(opt_cpulist("", 16, cpus, 8, &n) == -EINVAL, "empty cpu list");
		CHECK(opt_decimal("99.9", &d) == 0 && d > 99.899 && d < 99.901, "decimal 99.9");
		CHECK(opt_decimal(".5", &d) == 0 && d == 0.5, "decimal .5");
		CHECK(opt_decimal("1e2", &d) == -EINVAL, "decimal takes no exponent");
		CHECK(opt_decimal("-1", &d) == -EINVAL, "decimal takes no sign");
		CHECK(opt_decimal("5%", &d) == -EINVAL, "decimal with trailing text");
		CHECK(opt_decimal(".", &d) == -EINVAL, "decimal point alone");
	}
	return check_done();
}
