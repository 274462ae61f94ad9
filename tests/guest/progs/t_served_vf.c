// SPDX-License-Identifier: BSD-3-Clause
// testbed-ldflags: -lpthread
/*
 * A client of upcie-served --vfs: asks for a VF of its own and drives it as its own controller
 * (served/server_vf.h), as a user's program would. Roles (ROLE SOCKET [args], run --as UID):
 *   own TAG LBA NSID FILE  take a VF; its controller shows exactly namespace NSID; write TAG's
 *                          pattern at LBA (64 KiB) and read it back; fill a buffer with TAG's
 *                          pattern too and write its device address to FILE; wait for FILE.done;
 *                          then the buffer must still hold the pattern (another client's VF
 *                          aimed a read at that address meanwhile)
 *   attack IOVA NSID OTHER HOLD
 *                          take a VF; namespace OTHER is not there; a Read into device address
 *                          IOVA (another client's buffer) must not reach it (checked by `own`)
 *                          and lands in this client's own memory where its own domain maps
 *                          IOVA; a Read to an address nothing is mapped at ends; then hold the
 *                          VF (HOLD.ready written) until HOLD.release exists
 *   busy                   every VF held: -EBUSY
 *   denied                 a client whose grant is an LBA range: -EPERM
 *   revoke NSID            take a VF, I/O works; close the connection only (the controller stays
 *                          open in this process): the next I/O must fail
 *   reread TAG LBA NSID    take a VF again: the data `own` wrote is there
 *   perf NSID N            take a VF; N reads of 4 KiB at QD 1 from the first 8 MiB of NSID
 *                          (a benchmark: prints the mean latency, asserts only that they ran)
 *   ownerperf BDF PATH NSID N
 *                          the same reads by a process that opens the PF itself (no server):
 *                          the owner's figure beside the VF client's
 * Prints TAP lines; exits 1 when one failed.
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <upcie/base/clock.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>
#include <upcie/served/client.h>

#include "t_nvme_util.h"

#define XFER (64 * KiB)

struct vfc {
	struct upcie_served_client cl;
	struct upcie_served_vf vf;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ioq q;
	struct upcie_dmamem mem;
	bool cl_open, c_open, q_open;
};

/* Connect, take a VF, open it as a controller with one I/O queue and 4 MiB of DMA memory. */
static int vfc_open(struct vfc *v, const char *sock)
{
	struct upcie_nvme_ctrl_opts o;
	int err;

	memset(v, 0, sizeof(*v));
	err = upcie_served_connect(&v->cl, sock, 0);
	if (err)
		return err;
	v->cl_open = true;
	err = upcie_served_vf_get(&v->cl, &v->vf);
	if (err)
		return err;
	printf("# VF %s, group %d, controller %u, %u queue and %u interrupt resources, %u "
	       "namespaces\n",
	       v->vf.name, v->vf.group, v->vf.cntlid, v->vf.nvq, v->vf.nvi, v->vf.nns);
	memset(&o, 0, sizeof(o));
	upcie_served_vf_dev_opts(&v->vf, &o.dev);
	o.host_mem = 4 * MiB;
	err = upcie_nvme_ctrl_open(&v->c, &v->vf.bdf, &o);
	if (err)
		return err;
	v->c_open = true;
	err = upcie_nvme_dev_dmamem(&v->c.dev, 4 * MiB, &v->mem);
	if (!err)
		err = upcie_nvme_ioq_create(&v->q, &v->c, NULL);
	v->q_open = !err;
	return err;
}

static void vfc_close(struct vfc *v)
{
	if (v->q_open)
		upcie_nvme_ioq_delete(&v->q);
	upcie_dmamem_destroy(&v->mem);
	if (v->c_open)
		upcie_nvme_ctrl_close(&v->c);
	if (v->cl_open)
		upcie_served_disconnect(&v->cl);
	if (v->vf.group_fd >= 0 && v->vf.group_fd != 0)
		close(v->vf.group_fd);
}

/* The VF's controller lists exactly namespace `nsid`. */
static void check_ns(struct vfc *v, uint32_t nsid)
{
	uint32_t ids[8];
	uint32_t n = 0;
	int err = upcie_nvme_ctrl_ns_list(&v->c, ids, 8, &n);

	TAP(err == 0 && n == 1 && ids[0] == nsid,
	    "the VF's controller has exactly namespace %u (%u listed, first %u, %d)", nsid, n,
	    n ? ids[0] : 0, err);
}

static int wait_file(const char *path, int secs)
{
	struct stat st;

	for (int i = 0; i < secs * 10; i++) {
		if (!stat(path, &st))
			return 0;
		upcie_sleep_ns(100 * UPCIE_NSEC_PER_MSEC);
	}
	return -ETIMEDOUT;
}

static void role_own(const char *sock, const char *name, uint64_t lba, uint32_t nsid,
		     const char *file)
{
	struct upcie_nvme_ns ns;
	struct vfc v;
	char tag[9], done[256];
	uint8_t *buf;
	uint64_t iova = 0;
	int err;
	FILE *f;

	tn_tag(tag, name);
	err = vfc_open(&v, sock);
	TAP(err == 0, "a VF of its own, opened as a controller in this process's container (%d)",
	    err);
	if (err)
		goto out;
	check_ns(&v, nsid);
	err = upcie_nvme_ns_open(&ns, &v.c, nsid);
	buf = (uint8_t *)v.mem.vaddr;
	if (!err) {
		tn_pat(buf, XFER, tag, lba * ns.lba_bytes);
		err = upcie_nvme_ioq_write_sync(&v.q, &ns, lba, &v.mem, 0, XFER, NULL);
	}
	if (!err) {
		memset(buf + XFER, 0, XFER);
		err = upcie_nvme_ioq_read_sync(&v.q, &ns, lba, &v.mem, XFER, XFER, NULL);
	}
	TAP(err == 0 && tn_pat_diff(buf + XFER, XFER, tag, lba * ns.lba_bytes) < 0,
	    "64 KiB written at LBA %" PRIu64 " of namespace %u through the VF and read back (%d)",
	    lba, nsid, err);
	/* the victim buffer: 64 KiB at offset 1 MiB, holding the pattern */
	tn_pat(buf + MiB, XFER, tag, 0);
	err = upcie_dmamem_iova(&v.mem, MiB, &iova);
	f = err ? NULL : fopen(file, "w");
	if (f) {
		fprintf(f, "0x%" PRIx64 "\n", iova);
		fclose(f);
	}
	TAP(f != NULL, "its buffer's device address 0x%" PRIx64 " handed to the other client (%d)",
	    iova, err);
	snprintf(done, sizeof(done), "%s.done", file);
	err = wait_file(done, 120);
	TAP(err == 0, "the other client is done (%d)", err);
	TAP(tn_pat_diff(buf + MiB, XFER, tag, 0) < 0,
	    "its buffer was not written by the other client's VF (first differing byte %" PRId64
	    ")",
	    tn_pat_diff(buf + MiB, XFER, tag, 0));
out:
	vfc_close(&v);
}

static void role_attack(const char *sock, uint64_t iova, uint32_t nsid, uint32_t other,
			const char *hold)
{
	struct upcie_dmamem fake;
	struct upcie_nvme_ns ns, ns2;
	struct upcie_nvme_cqe cqe;
	struct vfc v;
	char tag[9], name[16], path[256];
	uint64_t base = 0;
	int err;
	FILE *f;

	err = vfc_open(&v, sock);
	TAP(err == 0, "a second client gets the other VF (%d)", err);
	if (err)
		goto out;
	check_ns(&v, nsid);
	err = upcie_nvme_ns_open(&ns2, &v.c, other);
	TAP(err != 0, "namespace %u (granted to the other client) cannot be opened here (%d)",
	    other, err);
	err = upcie_nvme_ns_open(&ns, &v.c, nsid);
	TAP(err == 0, "its own namespace %u opens (%d)", nsid, err);
	if (err)
		goto out;
	/* the other client's device address, as if it were this process's buffer */
	memset(v.mem.vaddr, 0, v.mem.size);
	err = upcie_dmamem_init_arith(&fake, (uint8_t *)v.mem.vaddr + 2 * MiB, XFER, iova);
	if (!err) {
		memset(&cqe, 0, sizeof(cqe));
		err = upcie_nvme_ioq_read_sync(&v.q, &ns, 0, &fake, 0, XFER, &cqe);
	}
	printf("# a Read of 64 KiB aimed at the other client's address 0x%" PRIx64
	       ": %d (status 0x%03x)\n",
	       iova, err, upcie_nvme_cqe_code(&cqe));
	TAP(err != -EINVAL && err != -ETIMEDOUT,
	    "a Read aimed at the other client's address was sent and ended (%d)", err);
	/* where it went: this process's own domain translated the address (the same IOVA names
	 * this client's own memory when its allocator handed it out here too) */
	snprintf(name, sizeof(name), "c7n%u", nsid);
	tn_tag(tag, name);
	if (!upcie_dmamem_iova(&v.mem, 0, &base) && iova >= base && iova - base < v.mem.size - XFER)
		TAP(tn_pat_diff((uint8_t *)v.mem.vaddr + (iova - base), XFER, tag, 0) < 0,
		    "... and landed in this client's own memory at that address: its own IOMMU "
		    "domain translated it");
	else
		printf("# the address is not one of this client's own (its memory is at 0x%" PRIx64
		       ")\n",
		       base);
	/* an address far from anything this process mapped */
	err = upcie_dmamem_init_arith(&fake, (uint8_t *)v.mem.vaddr + 2 * MiB, XFER,
				      UINT64_C(0x7e0000000000));
	if (!err) {
		memset(&cqe, 0, sizeof(cqe));
		err = upcie_nvme_ioq_read_sync(&v.q, &ns, 0, &fake, 0, XFER, &cqe);
	}
	/* QEMU 7.2's nvme completes it with success when its IOMMU refused the DMA (QEMU logs
	 * the translation failure on the host): only that it ends is checked */
	TAP(err != -ETIMEDOUT,
	    "a Read to an address nothing is mapped at ends (%d, status 0x%03x %s)", err,
	    upcie_nvme_cqe_code(&cqe), upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)));
	err = upcie_nvme_ioq_read_sync(&v.q, &ns, 0, &v.mem, 0, XFER, NULL);
	TAP(err == 0, "the VF goes on after it (%d)", err);
	/* hold the VF until told (the case asks for a third one meanwhile) */
	snprintf(path, sizeof(path), "%s.ready", hold);
	f = fopen(path, "w");
	if (f)
		fclose(f);
	snprintf(path, sizeof(path), "%s.release", hold);
	err = wait_file(path, 120);
	TAP(err == 0, "held its VF until released (%d)", err);
out:
	vfc_close(&v);
}

static void role_expect(const char *sock, int want, const char *what)
{
	struct upcie_served_client cl;
	struct upcie_served_vf vf;
	int err = upcie_served_connect(&cl, sock, 0);

	if (!err) {
		err = upcie_served_vf_get(&cl, &vf);
		if (!err)
			close(vf.group_fd);
		upcie_served_disconnect(&cl);
	}
	TAP(err == want, "%s: %d (want %d)", what, err, want);
}

static void role_revoke(const char *sock, uint32_t nsid)
{
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_io io;
	struct upcie_nvme_ns ns;
	struct vfc v;
	uint64_t t0;
	int err;

	err = vfc_open(&v, sock);
	if (!err)
		err = upcie_nvme_ns_open(&ns, &v.c, nsid);
	if (!err)
		err = upcie_nvme_ioq_read_sync(&v.q, &ns, 0, &v.mem, 0, XFER, NULL);
	TAP(err == 0, "a VF, read from namespace %u (%d)", nsid, err);
	if (err)
		goto out;
	upcie_served_disconnect(&v.cl);
	v.cl_open = false;
	upcie_sleep_ns(500 * UPCIE_NSEC_PER_MSEC);
	t0 = upcie_time_ns();
	seg.mem = &v.mem;
	seg.off = 0;
	seg.len = XFER;
	memset(&io, 0, sizeof(io));
	io.opc = UPCIE_NVME_NVM_READ;
	io.segs = &seg;
	io.nsegs = 1;
	err = upcie_nvme_ioq_io_sync(&v.q, &ns, &io, 3 * UPCIE_NSEC_PER_SEC, NULL);
	TAP(err != 0,
	    "connection closed, controller still open here: the next Read fails (%d after %" PRIu64
	    " ms): the server took the VF offline",
	    err, (upcie_time_ns() - t0) / 1000000);
out:
	vfc_close(&v);
}

static void role_reread(const char *sock, const char *name, uint64_t lba, uint32_t nsid)
{
	struct upcie_nvme_ns ns;
	struct vfc v;
	char tag[9];
	int err;

	tn_tag(tag, name);
	err = vfc_open(&v, sock);
	if (!err)
		err = upcie_nvme_ns_open(&ns, &v.c, nsid);
	if (!err) {
		memset(v.mem.vaddr, 0, XFER);
		err = upcie_nvme_ioq_read_sync(&v.q, &ns, lba, &v.mem, 0, XFER, NULL);
	}
	TAP(err == 0 && tn_pat_diff(v.mem.vaddr, XFER, tag, lba * ns.lba_bytes) < 0,
	    "a VF handed out again: namespace %u holds what the first client wrote (%d)", nsid,
	    err);
	vfc_close(&v);
}

/* N reads of 4 KiB at QD 1 at offsets spread over the first 8 MiB; prints the mean latency. */
static void qd1_reads(struct upcie_nvme_ctrl *c, struct upcie_nvme_ioq *q, struct upcie_dmamem *mem,
		      uint32_t nsid, unsigned n, const char *who)
{
	struct upcie_nvme_ns ns;
	uint64_t t0, t1;
	unsigned i = 0;
	int err = upcie_nvme_ns_open(&ns, c, nsid);

	if (!err && (4 * KiB) % ns.lba_bytes)
		err = -EINVAL;
	t0 = upcie_time_ns();
	for (; !err && i < n; i++) {
		/* 4 KiB unit i * 7919 mod 2048: spread over the first 8 MiB */
		uint64_t lba = (uint64_t)i * 7919 % 2048 * (4 * KiB / ns.lba_bytes);

		err = upcie_nvme_ioq_read_sync(q, &ns, lba, mem, 0, 4 * KiB, NULL);
	}
	t1 = upcie_time_ns();
	TAP(err == 0 && i == n, "%s: %u reads of 4 KiB at QD 1 (%d)", who, i, err);
	if (!err && n)
		printf("# tb: served_vf_%s_qd1_mean_us=%.1f\n", who,
		       (double)(t1 - t0) / 1000.0 / (double)n);
}

static void role_perf(const char *sock, uint32_t nsid, unsigned n)
{
	struct vfc v;
	int err = vfc_open(&v, sock);

	TAP(err == 0, "perf: a VF of its own (%d)", err);
	if (!err)
		qd1_reads(&v.c, &v.q, &v.mem, nsid, n, "client");
	vfc_close(&v);
}

static void role_ownerperf(const char *bdfs, const char *path, uint32_t nsid, unsigned n)
{
	struct upcie_nvme_ctrl_opts o;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ioq q;
	struct upcie_dmamem mem;
	struct upcie_pci_bdf bdf;
	int err;

	memset(&o, 0, sizeof(o));
	memset(&mem, 0, sizeof(mem));
	o.host_mem = 4 * MiB;
	err = upcie_pci_bdf_parse(bdfs, &bdf);
	if (!err)
		err = upcie_nvme_path_parse(path, &o.dev.path);
	if (!err)
		err = upcie_nvme_ctrl_open(&c, &bdf, &o);
	TAP(err == 0, "perf: the PF opened by its owner on the %s path (%d)", path, err);
	if (err)
		return;
	err = upcie_nvme_dev_dmamem(&c.dev, 4 * MiB, &mem);
	if (!err)
		err = upcie_nvme_ioq_create(&q, &c, NULL);
	if (!err) {
		qd1_reads(&c, &q, &mem, nsid, n, "owner");
		upcie_nvme_ioq_delete(&q);
	}
	upcie_dmamem_destroy(&mem);
	upcie_nvme_ctrl_close(&c);
}

int main(int argc, char **argv)
{
	struct rlimit rl = { RLIM_INFINITY, RLIM_INFINITY };
	const char *role, *sock;
	long as = -1;

	setvbuf(stdout, NULL, _IOLBF, 0);
	upcie_log_set_handler(tn_log, NULL);
	if (argc >= 5 && !strcmp(argv[1], "--as")) {
		as = strtol(argv[2], NULL, 10);
		argv += 2;
		argc -= 2;
	}
	if (argc < 3) {
		fprintf(stderr, "usage: t_served_vf [--as UID] ROLE SOCKET [args]\n");
		return 2;
	}
	role = argv[1];
	sock = argv[2];
	/* the client's pins are charged to it: the test lets it pin what it needs */
	if (setrlimit(RLIMIT_MEMLOCK, &rl))
		perror("setrlimit");
	if (as >= 0 && (setgid((gid_t)as) || setuid((uid_t)as))) {
		perror("setuid");
		return 2;
	}
	if (!strcmp(role, "own") && argc == 7)
		role_own(sock, argv[3], strtoull(argv[4], NULL, 0),
			 (uint32_t)strtoul(argv[5], NULL, 0), argv[6]);
	else if (!strcmp(role, "attack") && argc == 7)
		role_attack(sock, strtoull(argv[3], NULL, 0), (uint32_t)strtoul(argv[4], NULL, 0),
			    (uint32_t)strtoul(argv[5], NULL, 0), argv[6]);
	else if (!strcmp(role, "busy"))
		role_expect(sock, -EBUSY, "every VF held: the next client is refused");
	else if (!strcmp(role, "denied"))
		role_expect(sock, -EPERM, "a client whose grant is an LBA range gets no VF");
	else if (!strcmp(role, "revoke") && argc == 4)
		role_revoke(sock, (uint32_t)strtoul(argv[3], NULL, 0));
	else if (!strcmp(role, "reread") && argc == 6)
		role_reread(sock, argv[3], strtoull(argv[4], NULL, 0),
			    (uint32_t)strtoul(argv[5], NULL, 0));
	else if (!strcmp(role, "perf") && argc == 5)
		role_perf(sock, (uint32_t)strtoul(argv[3], NULL, 0),
			  (unsigned)strtoul(argv[4], NULL, 0));
	else if (!strcmp(role, "ownerperf") && argc == 6) /* SOCKET is the PF's address here */
		role_ownerperf(sock, argv[3], (uint32_t)strtoul(argv[4], NULL, 0),
			       (unsigned)strtoul(argv[5], NULL, 0));
	else {
		fprintf(stderr, "t_served_vf: bad role or arguments\n");
		return 2;
	}
	return tn_failed ? 1 : 0;
}
