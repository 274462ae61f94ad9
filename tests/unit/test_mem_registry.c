/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Registry: overlap rules, reference counts, ownership of the dmamem (destroyed exactly once, or
 * handed back), lookups at the first and last byte and one past, a model check over many ranges,
 * and concurrent register/unregister/lookup from several threads (run under ASan for leaks and
 * use-after-free, and under TSan for races).
 */
#include <upcie/mem/registry.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static char last_msg[512];

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)level;
	(void)ctx;
	snprintf(last_msg, sizeof(last_msg), "%s", msg);
}

static atomic_long made, released;

static void count_release(struct upcie_dmamem *mem)
{
	(void)mem;
	atomic_fetch_add(&released, 1);
}

/* An arithmetic dmamem whose device address encodes `iova`, with a release that counts. */
static void mk(struct upcie_dmamem *mem, uint64_t size, uint64_t iova)
{
	upcie_dmamem_init_arith(mem, NULL, size, iova);
	mem->release = count_release;
	atomic_fetch_add(&made, 1);
}

#define P(x) ((const void *)(uintptr_t)(x))

static void test_basic(void)
{
	struct upcie_registry reg, zero;
	struct upcie_dmamem m, m2, hb;
	struct upcie_registry_hit hit = { 0 };
	uint64_t iova = 0;
	const uint64_t base = 0x10000000, size = 0x20000;
	long r0 = atomic_load(&released);

	memset(&zero, 0, sizeof(zero));
	upcie_registry_fini(&zero);
	CHECK(1, "basic: fini of a zeroed registry is a no-op");
	CHECK_EQ(upcie_registry_register(&zero, P(base), 1, NULL, 0), -EINVAL,
		 "basic: register on a zeroed registry");
	CHECK_EQ(upcie_registry_lookup(&zero, P(base), &hit), -EINVAL, "basic: lookup on zeroed");

	CHECK_EQ(upcie_registry_init(&reg), 0, "basic: init");
	CHECK_EQ(upcie_registry_register(&reg, P(base), size, NULL, 0), -ENOENT,
		 "basic: reference to an unregistered range is -ENOENT");
	mk(&m, size, 0xa0000000);
	CHECK_EQ(upcie_registry_register(&reg, P(base), size, &m, 0), 0, "basic: register");
	CHECK(m.size == 0 && m.release == NULL && m.fd == -1, "basic: caller's dmamem zeroed");
	CHECK_EQ(upcie_registry_count(&reg), 1, "basic: one range");

	/* Lookups at the edges. */
	CHECK_EQ(upcie_registry_lookup(&reg, P(base), &hit), 0, "edge: first byte");
	CHECK_EQ(hit.off, 0, "edge: first byte offset");
	CHECK(hit.base == P(base) && hit.size == size && hit.avail == size, "edge: range reported");
	CHECK_EQ(upcie_registry_lookup(&reg, P(base + size - 1), &hit), 0, "edge: last byte");
	CHECK_EQ(hit.off, size - 1, "edge: last byte offset");
	CHECK_EQ(hit.avail, 1, "edge: one byte left at the last byte");
	CHECK_EQ(upcie_registry_iova(&reg, P(base + size - 1), &iova), 0, "edge: last byte iova");
	CHECK_EQ(iova, 0xa0000000 + size - 1, "edge: last byte translates");
	CHECK_EQ(upcie_registry_lookup(&reg, P(base + size), &hit), -ENOENT, "edge: one past");
	CHECK_EQ(upcie_registry_iova(&reg, P(base + size), &iova), -ENOENT, "edge: one past iova");
	CHECK_EQ(upcie_registry_lookup(&reg, P(base - 1), &hit), -ENOENT, "edge: one before");
	CHECK_EQ(upcie_registry_lookup(&reg, P(0), &hit), -ENOENT, "edge: NULL");

	/* Overlap rules. */
	{
		static const struct {
			uint64_t b, s;
			const char *what;
		} bad[] = {
			{ 0x10000000, 0x10000, "same base, smaller" },
			{ 0x10000000, 0x30000, "same base, larger" },
			{ 0x0fff0000, 0x20000, "overlaps the start" },
			{ 0x1001f000, 0x2000, "overlaps the end" },
			{ 0x10001000, 0x1000, "inside" },
			{ 0x0f000000, 0x2000000, "contains it" },
			{ 0x1001ffff, 1, "last byte only" },
			{ 0x0ffff000, 0x1001, "ends on its first byte" },
			{ 0x0fffffff, 2, "two bytes across its start" },
		};

		for (size_t i = 0; i < UPCIE_ARRAY_SIZE(bad); i++) {
			long r = atomic_load(&released);

			mk(&m2, bad[i].s, 0xb0000000);
			CHECK_EQ(upcie_registry_register(&reg, P(bad[i].b), bad[i].s, &m2, 0),
				 -EEXIST, "overlap: %s is -EEXIST", bad[i].what);
			CHECK(m2.size == bad[i].s && atomic_load(&released) == r,
			      "overlap: %s: caller keeps its dmamem", bad[i].what);
			CHECK_EQ(upcie_registry_register(&reg, P(bad[i].b), bad[i].s, NULL, 0),
				 -EEXIST, "overlap: %s without a dmamem is -EEXIST too",
				 bad[i].what);
			upcie_dmamem_destroy(&m2);
		}
		CHECK(strstr(last_msg, "overlaps") != NULL, "overlap: message (%s)", last_msg);
	}
	/* Adjacent ranges do not overlap. */
	mk(&m2, 0x1000, 0xc0000000);
	CHECK_EQ(upcie_registry_register(&reg, P(base + size), 0x1000, &m2, 0), 0,
		 "adjacent: after the end");
	mk(&m2, 0x1000, 0xd0000000);
	CHECK_EQ(upcie_registry_register(&reg, P(base - 0x1000), 0x1000, &m2, 0), 0,
		 "adjacent: before the start");
	CHECK_EQ(upcie_registry_iova(&reg, P(base + size), &iova), 0, "adjacent: one past is next");
	CHECK_EQ(iova, 0xc0000000, "adjacent: translated by the next range's dmamem");
	CHECK_EQ(upcie_registry_iova(&reg, P(base - 1), &iova), 0, "adjacent: one before");
	CHECK_EQ(iova, 0xd0000fff, "adjacent: translated by the previous range's dmamem");

	/* References: again without a dmamem, again with one (which is destroyed). */
	CHECK_EQ(upcie_registry_register(&reg, P(base), size, NULL, 0), 0, "refs: second");
	mk(&m2, size, 0xe0000000);
	CHECK_EQ(upcie_registry_register(&reg, P(base), size, &m2, 0), 0, "refs: third, racing");
	CHECK_EQ(atomic_load(&released), r0 + 9 + 1, "refs: the duplicate dmamem was destroyed");
	CHECK(m2.size == 0, "refs: and zeroed");
	CHECK_EQ(upcie_registry_iova(&reg, P(base), &iova), 0, "refs: lookup");
	CHECK_EQ(iova, 0xa0000000, "refs: the first dmamem stays in use");

	CHECK_EQ(upcie_registry_unregister(&reg, P(base + 1), NULL), -EINVAL,
		 "unregister: interior pointer");
	CHECK(strstr(last_msg, "rather than its base") != NULL, "unregister: says so (%s)",
	      last_msg);
	CHECK_EQ(upcie_registry_unregister(&reg, P(0x90000000), NULL), -ENOENT,
		 "unregister: unknown");
	CHECK_EQ(upcie_registry_unregister(&reg, P(base), &hb), 0, "unregister: 3 -> 2");
	CHECK(hb.size == 0, "unregister: nothing handed back while referenced");
	CHECK_EQ(upcie_registry_unregister(&reg, P(base), NULL), 0, "unregister: 2 -> 1");
	CHECK_EQ(upcie_registry_lookup(&reg, P(base + 5), &hit), 0, "unregister: still there");
	CHECK_EQ(atomic_load(&released), r0 + 10, "unregister: not destroyed yet");
	CHECK_EQ(upcie_registry_unregister(&reg, P(base), &hb), 0, "unregister: 1 -> 0");
	CHECK(hb.size == size && hb.iova == 0xa0000000, "unregister: dmamem handed back");
	CHECK_EQ(atomic_load(&released), r0 + 10, "unregister: handed back, not destroyed");
	upcie_dmamem_destroy(&hb);
	CHECK_EQ(atomic_load(&released), r0 + 11, "unregister: caller destroyed it");
	CHECK_EQ(upcie_registry_lookup(&reg, P(base + 5), &hit), -ENOENT, "unregister: gone");
	CHECK_EQ(upcie_registry_unregister(&reg, P(base), NULL), -ENOENT,
		 "unregister: once more is -ENOENT");

	/* Bad input. */
	mk(&m2, 0x1000, 0);
	CHECK_EQ(upcie_registry_register(&reg, P(0x50000000), 0, &m2, 0), -EINVAL, "bad: size 0");
	CHECK_EQ(upcie_registry_register(&reg, P(UINTPTR_MAX - 10), 0x1000, &m2, 0), -EINVAL,
		 "bad: range wraps");
	CHECK_EQ(upcie_registry_register(&reg, P(0x50000000), 0x1001, &m2, 0), -EINVAL,
		 "bad: larger than its dmamem");
	CHECK_EQ(upcie_registry_register(&reg, P(0x50000000), 0x800, &m2, 0x801), -EINVAL,
		 "bad: offset + size beyond the dmamem");
	CHECK(m2.size == 0x1000, "bad: the caller still owns its dmamem");
	CHECK_EQ(upcie_registry_register(&reg, P(0x50000000), 0x800, &m2, 0x800), 0,
		 "bad: offset + size exactly at the end is fine");
	CHECK_EQ(upcie_registry_iova(&reg, P(0x500007ff), &iova), 0, "offset: last byte");
	CHECK_EQ(iova, 0xfff, "offset: mem_off added");

	/* fini destroys what is left: the two adjacent ranges and the last one. */
	upcie_registry_fini(&reg);
	CHECK_EQ(atomic_load(&released), atomic_load(&made), "fini: every dmamem destroyed once");
	upcie_registry_fini(&reg);
	CHECK(1, "fini: twice is a no-op");
}

static uint64_t rng_next(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * UINT64_C(0x2545F4914F6CDD1D);
}

/* Many ranges in random order against a brute-force model. */
static void test_model(void)
{
	enum { N = 2000, SLOT = 0x10000 };
	struct upcie_registry reg;
	static uint64_t size[N];
	static int on[N];
	uint64_t seed = 42;
	unsigned bad = 0, checked = 0;

	upcie_registry_init(&reg);
	for (int op = 0; op < 20000; op++) {
		size_t i = (size_t)(rng_next(&seed) % N);
		uint64_t base = 0x200000000 + (uint64_t)i * SLOT;

		if (!on[i]) {
			struct upcie_dmamem m;

			size[i] = 1 + rng_next(&seed) % SLOT;
			mk(&m, size[i], base * 2);
			if (upcie_registry_register(&reg, P(base), size[i], &m, 0) != 0)
				bad++;
			on[i] = 1;
		} else if (rng_next(&seed) % 3 == 0) {
			if (upcie_registry_unregister(&reg, P(base), NULL) != 0)
				bad++;
			on[i] = 0;
		}
		/* Probe a random address against the model. */
		{
			uint64_t a =
			    0x200000000 - SLOT + rng_next(&seed) % ((N + 2) * (uint64_t)SLOT);
			uint64_t iova = 0;
			int64_t j = ((int64_t)a - 0x200000000) / SLOT;
			int want = a >= 0x200000000 && j < N && on[j] &&
				   a - (0x200000000 + (uint64_t)j * SLOT) < size[j];
			int err = upcie_registry_iova(&reg, P(a), &iova);

			checked++;
			if (want
				? (err != 0 || iova != (0x200000000 + (uint64_t)j * SLOT) * 2 +
							   (a - (0x200000000 + (uint64_t)j * SLOT)))
				: err != -ENOENT)
				bad++;
		}
	}
	CHECK_EQ(bad, 0, "model: %u lookups and all updates agree with the model", checked);
	upcie_registry_fini(&reg);
	CHECK_EQ(atomic_load(&released), atomic_load(&made), "model: every dmamem destroyed once");
}

/* Threads: writers cycle private ranges and take/drop references to a shared one; readers look
 * up a permanent range (always found), the shared one and the private ones (found with the
 * right address, or not at all). */
enum { NWRITERS = 4, NREADERS = 3, NPRIV = 16, ROUNDS = 3000 };
#define PERM_BASE   UINT64_C(0x700000000)
#define SHARED_BASE UINT64_C(0x710000000)
#define PRIV_BASE   UINT64_C(0x800000000)

struct upcie_registry treg;
static atomic_int stop_readers;

static uint64_t priv_base(int w, int k)
{
	return PRIV_BASE + ((uint64_t)w * NPRIV + (uint64_t)k) * 0x100000;
}

static void *writer(void *arg)
{
	int w = (int)(intptr_t)arg, bad = 0, held = 0;
	uint64_t seed = (uint64_t)w + 100;
	int on[NPRIV] = { 0 };

	for (int r = 0; r < ROUNDS; r++) {
		int k = (int)(rng_next(&seed) % NPRIV);
		uint64_t b = priv_base(w, k);
		struct upcie_dmamem m;

		if (!on[k]) {
			mk(&m, 0x100000, b ^ UINT64_C(0xff00000000));
			bad += upcie_registry_register(&treg, P(b), 0x100000, &m, 0) != 0;
			on[k] = 1;
		} else {
			bad += upcie_registry_unregister(&treg, P(b), NULL) != 0;
			on[k] = 0;
		}
		/* The shared range: take a reference (cheap path, else build one), or drop one. */
		if (rng_next(&seed) % 2 || !held) {
			int err = upcie_registry_register(&treg, P(SHARED_BASE), 0x8000, NULL, 0);

			if (err == -ENOENT) {
				mk(&m, 0x8000, SHARED_BASE ^ UINT64_C(0xff00000000));
				err = upcie_registry_register(&treg, P(SHARED_BASE), 0x8000, &m, 0);
				upcie_dmamem_destroy(&m); /* no-op on success */
			}
			bad += err != 0;
			held += !err;
		} else {
			bad += upcie_registry_unregister(&treg, P(SHARED_BASE), NULL) != 0;
			held--;
		}
	}
	for (int k = 0; k < NPRIV; k++)
		if (on[k])
			bad += upcie_registry_unregister(&treg, P(priv_base(w, k)), NULL) != 0;
	while (held--)
		bad += upcie_registry_unregister(&treg, P(SHARED_BASE), NULL) != 0;
	return (void *)(intptr_t)bad;
}

static void *reader(void *arg)
{
	uint64_t seed = (uint64_t)(intptr_t)arg + 1000;
	long bad = 0, n = 0;

	while (!atomic_load(&stop_readers) || n < 1000) {
		uint64_t iova, a, want;
		struct upcie_registry_hit hit = { 0 };
		int w = (int)(rng_next(&seed) % NWRITERS), k = (int)(rng_next(&seed) % NPRIV), err;

		n++;
		a = PERM_BASE + rng_next(&seed) % 0x4000;
		if (upcie_registry_iova(&treg, P(a), &iova) != 0 ||
		    iova != (a ^ UINT64_C(0xff00000000)))
			bad++;
		if (upcie_registry_lookup(&treg, P(PERM_BASE + 0x3fff), &hit) != 0 ||
		    hit.off != 0x3fff || hit.avail != 1)
			bad++;
		a = priv_base(w, k) + rng_next(&seed) % 0x100000;
		want = a ^ UINT64_C(0xff00000000);
		/* a private range comes and goes: absent (-ENOENT) or right, nothing else */
		err = upcie_registry_iova(&treg, P(a), &iova);
		if (err == 0 ? iova != want : err != -ENOENT)
			bad++;
		a = SHARED_BASE + rng_next(&seed) % 0x8000;
		err = upcie_registry_iova(&treg, P(a), &iova);
		if (err == 0 ? iova != (a ^ UINT64_C(0xff00000000)) : err != -ENOENT)
			bad++;
	}
	return (void *)(intptr_t)bad;
}

static void test_threads(void)
{
	pthread_t wt[NWRITERS], rt[NREADERS];
	struct upcie_dmamem m;
	long bad_w = 0, bad_r = 0;
	void *ret;

	upcie_registry_init(&treg);
	mk(&m, 0x4000, PERM_BASE ^ UINT64_C(0xff00000000));
	CHECK_EQ(upcie_registry_register(&treg, P(PERM_BASE), 0x4000, &m, 0), 0,
		 "threads: permanent range");
	atomic_store(&stop_readers, 0);
	for (long i = 0; i < NREADERS; i++)
		pthread_create(&rt[i], NULL, reader, (void *)(intptr_t)i);
	for (long i = 0; i < NWRITERS; i++)
		pthread_create(&wt[i], NULL, writer, (void *)(intptr_t)i);
	for (int i = 0; i < NWRITERS; i++) {
		pthread_join(wt[i], &ret);
		bad_w += (long)(intptr_t)ret;
	}
	atomic_store(&stop_readers, 1);
	for (int i = 0; i < NREADERS; i++) {
		pthread_join(rt[i], &ret);
		bad_r += (long)(intptr_t)ret;
	}
	CHECK_EQ(bad_w, 0, "threads: every register/unregister succeeded");
	CHECK_EQ(bad_r, 0, "threads: every lookup found the right address or nothing");
	CHECK_EQ(upcie_registry_count(&treg), 1, "threads: only the permanent range is left");
	CHECK_EQ(upcie_registry_unregister(&treg, P(PERM_BASE), NULL), 0, "threads: unregister");
	upcie_registry_fini(&treg);
	CHECK_EQ(atomic_load(&released), atomic_load(&made),
		 "threads: every dmamem destroyed exactly once (%ld)", (long)atomic_load(&made));
}

int main(void)
{
	upcie_log_set_handler(capture, NULL);
	test_basic();
	test_model();
	test_threads();
	return check_done();
}
