/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The deadlines of the queue-pair core and of the HIP device layer follow the clock rate they are
 * given, on the host with a fake clock in place of the GPU's wall clock (nvme/qpair_port.h lets a
 * test replace upcie_nvme_port_clock()): a queue pair whose commands never complete must give up
 * after exactly the number of clock ticks its rate makes of the timeout, so a wrong rate (a fixed
 * 100 MHz on a 25 MHz counter, say) moves the deadline by the ratio of the rates. The same for
 * the reader helper upcie_nvme_gqp_hip_signal_wait() (a flag that never comes, one that is
 * already there, sequence order across the wrap, no rate). Deterministic: the fake clock
 * advances a fixed step per read and nothing else measures time. No GPU.
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t fake_now_, fake_reads_;
static uint64_t fake_step_ = 1000;

static uint64_t fake_clock(void)
{
	fake_reads_++;
	return fake_now_ += fake_step_;
}

#define UPCIE_NVME_PORT_CLOCK() fake_clock()

#include <upcie/nvme/cmd.h>
#include <upcie/gpuq/gqp_hip.h>
#include <upcie/nvme/qpair.h>

#include "../unit/check.h"

#define DEPTH 8

static struct upcie_nvme_sqe sq_[DEPTH] __attribute__((aligned(64)));
static struct upcie_nvme_cqe cq_[DEPTH] __attribute__((aligned(64)));
static volatile uint32_t db_[2];

/* A queue pair over rings no controller serves, one command outstanding. */
static int open_stuck(struct upcie_nvme_qpair *qp, uint32_t khz, uint16_t *cid)
{
	struct upcie_nvme_qpair_cfg qc;
	struct upcie_nvme_sqe sqe;
	int err;

	memset(&qc, 0, sizeof(qc));
	qc.sq = sq_;
	qc.cq = cq_;
	qc.sqdb = &db_[0];
	qc.cqdb = &db_[1];
	qc.sq_depth = DEPTH;
	qc.clock_khz = khz;
	err = upcie_nvme_qpair_init(qp, &qc);
	if (err)
		return err;
	upcie_nvme_cmd_flush(&sqe, 1);
	err = upcie_nvme_qpair_submit(qp, &sqe, NULL, NULL, cid);
	if (err)
		upcie_nvme_qpair_fini(qp);
	return err;
}

/* Clock reads a wait of timeout_ns takes on a queue pair at `khz`, or -1 if it did not time out. */
static long long wait_reads(uint32_t khz, uint64_t timeout_ns, bool drain)
{
	struct upcie_nvme_qpair qp;
	uint16_t cid = 0;
	int err = open_stuck(&qp, khz, &cid);

	if (err)
		return -2;
	fake_reads_ = 0;
	err = drain ? upcie_nvme_qpair_drain(&qp, timeout_ns)
		    : upcie_nvme_qpair_wait(&qp, cid, timeout_ns);
	upcie_nvme_qpair_fini(&qp);
	return err == -ETIMEDOUT ? (long long)fake_reads_ : -1;
}

/* The same for the HIP device layer's wait (rate in wall_khz, capped). */
static long long gqp_reads(uint64_t khz, uint64_t timeout_ns)
{
	struct upcie_nvme_gqp_hip g;
	struct upcie_nvme_gqp_hip_cpl c;
	struct upcie_nvme_sqe sqe;
	struct upcie_nvme_qpair_cfg qc;
	uint16_t cid = 0;
	int err;

	memset(&g, 0, sizeof(g));
	memset(&qc, 0, sizeof(qc));
	qc.sq = sq_;
	qc.cq = cq_;
	qc.sqdb = &db_[0];
	qc.cqdb = &db_[1];
	qc.sq_depth = DEPTH;
	if (upcie_nvme_qpair_init(&g.qp, &qc))
		return -2;
	g.wall_khz = khz;
	upcie_nvme_cmd_flush(&sqe, 1);
	err = upcie_nvme_gqp_hip_enqueue(&g, &sqe, &c, &cid);
	fake_reads_ = 0;
	if (!err)
		err = upcie_nvme_gqp_hip_wait(&g, cid, &c, timeout_ns);
	upcie_nvme_qpair_fini(&g.qp);
	return err == -ETIMEDOUT && c.err == -ECANCELED ? (long long)fake_reads_ : -1;
}

int main(void)
{
	const uint64_t ms = 1000000;
	long long a, b, c;

	CHECK_EQ(upcie_nvme_port_ticks(1500 * 1000, 100000), 150000,
		 "1.5 ms at 100000 kHz (100 MHz) is 150000 ticks");
	CHECK_EQ(upcie_nvme_port_ticks(2000 * ms, 25000), 50000000,
		 "2 s at 25000 kHz is 50000000 ticks");
	CHECK_EQ(upcie_nvme_port_ticks(999, 100000), 99, "999 ns at 100 MHz rounds down to 99");
	CHECK(upcie_nvme_port_ticks(UINT64_MAX, 100000) == UINT64_MAX &&
		  upcie_nvme_port_ticks(UINT64_MAX / 2, 4000000) == UINT64_MAX,
	      "ticks saturate: a timeout of UINT64_MAX stays unlimited at any rate");
	CHECK(upcie_nvme_port_ticks(123456789, UPCIE_NVME_PORT_NS_KHZ) == 123456789 &&
		  upcie_nvme_port_ticks(123456789, 0) == 123456789,
	      "a nanosecond clock (rate 10^6 kHz or 0) takes the timeout as it is");

	/* step 1000 ticks per read: the wait reads the clock once to start and then once a round */
	a = wait_reads(100000, 1 * ms, false);
	b = wait_reads(25000, 1 * ms, false);
	c = wait_reads(400000, 1 * ms, false);
	CHECK(a == 101 && b == 26 && c == 401,
	      "qpair_wait of 1 ms on a never-completing command ends after 100000 ticks at "
	      "100 MHz (%lld reads), 25000 at 25 MHz (%lld), 400000 at 400 MHz (%lld)",
	      a, b, c);
	CHECK(a > 0 && b > 0 && a != b,
	      "the same timeout under a wrong rate (100 MHz assumed, 25 MHz real) is a deadline "
	      "4x too long: %lld against %lld ticks of the real clock",
	      (a - 1) * 1000, (b - 1) * 1000);
	a = wait_reads(100000, 2 * ms, true);
	b = wait_reads(25000, 2 * ms, true);
	CHECK(a == 201 && b == 51, "qpair_drain follows the rate too (%lld and %lld reads)", a, b);
	a = wait_reads(0, 3000, false);
	CHECK(a == 4, "a queue pair without a rate counts nanoseconds (3 us: %lld reads)", a);
	a = gqp_reads(100000, 1 * ms);
	b = gqp_reads(25000, 1 * ms);
	CHECK(a == 101 && b == 26,
	      "the HIP device layer's wait follows wall_khz (%lld, %lld reads) and cancels the "
	      "command",
	      a, b);
	a = gqp_reads(100000, 60000 * ms);
	CHECK(a == 200001,
	      "a 60 s device wait at 100 MHz ends at the 2 s cap: 200000000 ticks (%lld reads)", a);

	/* the reader helper's wait: the same deadline arithmetic, then the acquire */
	{
		uint32_t flag = 5;
		int err;

		fake_reads_ = 0;
		err = upcie_nvme_gqp_hip_signal_wait(&flag, 6, 1 * ms, 100000);
		a = (long long)fake_reads_;
		fake_reads_ = 0;
		err = err == -ETIMEDOUT ? upcie_nvme_gqp_hip_signal_wait(&flag, 6, 1 * ms, 25000)
					: err;
		CHECK(err == -ETIMEDOUT && a == 101 && fake_reads_ == 26,
		      "signal_wait for a flag that never comes: -ETIMEDOUT after 100000 ticks at "
		      "100 MHz (%lld reads) and 25000 at 25 MHz (%llu)",
		      a, (unsigned long long)fake_reads_);
		fake_reads_ = 0;
		err = upcie_nvme_gqp_hip_signal_wait(&flag, 6, 60000 * ms, 100000);
		CHECK(err == -ETIMEDOUT && fake_reads_ == 200001,
		      "signal_wait of 60 s ends at the 2 s cap (%llu reads)",
		      (unsigned long long)fake_reads_);
		CHECK_EQ(upcie_nvme_gqp_hip_signal_wait(&flag, 5, 1 * ms, 100000), 0,
			 "signal_wait for a flag already there: 0");
		CHECK_EQ(upcie_nvme_gqp_hip_signal_wait(&flag, 3, 1 * ms, 100000), 0,
			 "signal_wait for an older sequence number: 0 (the flag only moves on)");
		flag = 2;
		CHECK_EQ(upcie_nvme_gqp_hip_signal_wait(&flag, 0xfffffffeu, 1 * ms, 100000), 0,
			 "signal_wait across the wrap: 2 is after 0xfffffffe");
		CHECK_EQ(upcie_nvme_gqp_hip_signal_wait(&flag, 3, 1 * ms, 0), -EINVAL,
			 "signal_wait without a clock rate: -EINVAL");
		upcie_nvme_gqp_hip_signal(&flag, 7);
		CHECK(flag == 7 && upcie_nvme_gqp_hip_signal_wait(&flag, 7, 1 * ms, 100000) == 0,
		      "signal stores the sequence number signal_wait then finds");
		upcie_nvme_gqp_hip_data_release();
		upcie_nvme_gqp_hip_data_acquire();
	}
	return check_done();
}
