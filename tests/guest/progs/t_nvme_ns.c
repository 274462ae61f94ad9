// SPDX-License-Identifier: BSD-3-Clause
/*
 * t_nvme_ns: namespaces of other kinds on QEMU's NVMe (c1), through upcie's driver on one path:
 * c1n4, zoned (1 MiB zones), and c1n5, protection information type 1 in 8 bytes of separate
 * metadata.
 *
 *   t_nvme_ns uio|type1|iommufd
 *
 * Zoned: the command set found through the descriptor list (CSI 2) and the zone size through
 * the zoned Identify; a plain Write and Write Zeroes refused before they reach the drive; Report
 * Zones; a zoned Write of 64 KiB at zone 2's write pointer, read back, the write pointer moved;
 * the same Write again fails with the zoned status, named. PI: 16 KiB written and read back
 * without a metadata buffer (PRACT: QEMU makes the PI on the write and checks it on the read);
 * a block never written reads back (application tag ffffh); a block written with the caller's
 * metadata holding a wrong guard fails the read's check (so the checks do run), and reads back
 * once written again with PRACT. The host script checks the images: the
 * zoned data where the write pointer was, the PI tuples QEMU stored (CRC guard, reference tag =
 * LBA), everything else untouched. Last, examples/nvme_driver must refuse both namespaces
 * when asked for them by NSID (and so leave them as they were).
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/nvme/cmd.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

#include "t_nvme_util.h"

#define ZW_SLBA	   512u /* zone 2 of 256-block zones */
#define ZW_BLOCKS  16u
#define PI_SLBA	   16u
#define PI_BLOCKS  4u
#define PI_UNWRIT  100u
#define ZONE_BYTES (1 * MiB)

static int sync_cmd(struct upcie_nvme_ioq *q, const struct upcie_nvme_sqe *sqe,
		    const struct upcie_nvme_dseg *seg, struct upcie_nvme_cqe *cqe)
{
	struct upcie_nvme_req r;

	memset(&r, 0, sizeof(r));
	return upcie_nvme_ioq_sync(q, upcie_nvme_ioq_submit_cmd(q, sqe, seg, seg ? 1 : 0, &r), &r,
				   0, cqe);
}

/* Report zones from `slba` into `mem` at `off`; returns how many descriptors it holds. */
static int report(struct upcie_nvme_ioq *q, const struct upcie_nvme_ns *ns,
		  struct upcie_dmamem *mem, uint64_t off, uint64_t slba)
{
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_sqe sqe;

	upcie_nvme_cmd_zone_report(&sqe, ns->nsid, slba, 4096, true);
	seg.mem = mem;
	seg.off = off;
	seg.len = 4096;
	memset((uint8_t *)mem->vaddr + off, 0xee, 4096);
	if (sync_cmd(q, &sqe, &seg, NULL))
		return -1;
	return (int)upcie_nvme_zone_report_count((uint8_t *)mem->vaddr + off, 4096);
}

static void zoned(struct upcie_nvme_ctrl *c, struct upcie_nvme_ioq *q, struct upcie_dmamem *mem)
{
	const struct upcie_nvme_zone_desc *zd;
	struct upcie_nvme_ns ns;
	struct upcie_nvme_cqe cqe;
	struct upcie_nvme_req r;
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_io io;
	uint8_t *d = (uint8_t *)mem->vaddr;
	char tag[9];
	int err, n;

	err = upcie_nvme_ns_open(&ns, c, 4);
	TAP(err == 0 && ns.zoned && ns.csi == UPCIE_NVME_CSI_ZNS && ns.lba_bytes == 4096 &&
		ns.zone_blocks == ZONE_BYTES / 4096,
	    "c1n4: zoned (CSI %u), %" PRIu64 "-block zones, 4 KiB blocks (%d)", ns.csi,
	    ns.zone_blocks, err);
	if (err)
		return;
	err = upcie_nvme_ioq_write_sync(q, &ns, ZW_SLBA, mem, 0, 4096, NULL);
	TAP(err == -EOPNOTSUPP, "c1n4: a plain Write refused with a message (%d)", err);
	memset(&r, 0, sizeof(r));
	err = upcie_nvme_ioq_write_zeroes(q, &ns, ZW_SLBA, 1, 0, &r);
	TAP(err == -EOPNOTSUPP, "c1n4: Write Zeroes refused (%d)", err);
	n = report(q, &ns, mem, 8 * MiB, 0);
	zd = (const struct upcie_nvme_zone_desc *)(d + 8 * MiB + 64);
	TAP(n == 8 && zd[2].zslba == ZW_SLBA && zd[2].wp == ZW_SLBA &&
		(zd[2].zs >> 4) == UPCIE_NVME_ZS_EMPTY,
	    "c1n4: Report Zones: 8 zones, zone 2 empty at LBA %u (%d zones)", ZW_SLBA, n);

	tn_tag(tag, "zo");
	tn_pat(d, ZW_BLOCKS * 4096, tag, (uint64_t)ZW_SLBA * 4096);
	memset(&io, 0, sizeof(io));
	seg.mem = mem;
	seg.off = 0;
	seg.len = ZW_BLOCKS * 4096;
	io.opc = UPCIE_NVME_NVM_WRITE;
	io.slba = ZW_SLBA;
	io.segs = &seg;
	io.nsegs = 1;
	io.zoned = true;
	err = upcie_nvme_ioq_io_sync(q, &ns, &io, 0, NULL);
	TAP(err == 0, "c1n4: zoned Write of %u blocks at zone 2's write pointer (%d)", ZW_BLOCKS,
	    err);
	memset(d + MiB, 0, ZW_BLOCKS * 4096);
	err = upcie_nvme_ioq_read_sync(q, &ns, ZW_SLBA, mem, MiB, ZW_BLOCKS * 4096, NULL);
	TAP(err == 0 && tn_pat_diff(d + MiB, ZW_BLOCKS * 4096, tag, (uint64_t)ZW_SLBA * 4096) < 0,
	    "c1n4: read back, verified (%d)", err);
	n = report(q, &ns, mem, 8 * MiB, ZW_SLBA);
	zd = (const struct upcie_nvme_zone_desc *)(d + 8 * MiB + 64);
	TAP(n >= 1 && zd[0].wp == ZW_SLBA + ZW_BLOCKS &&
		((zd[0].zs >> 4) == UPCIE_NVME_ZS_IOPEN || (zd[0].zs >> 4) == UPCIE_NVME_ZS_EOPEN),
	    "c1n4: zone 2 open, write pointer at %" PRIu64, n >= 1 ? zd[0].wp : 0);
	err = upcie_nvme_ioq_io_sync(q, &ns, &io, 0, &cqe);
	TAP(err == -EIO && upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_ZONE_INVALID_WRITE,
	    "c1n4: the same Write again, behind the write pointer: status 0x%03x '%s'",
	    upcie_nvme_cqe_code(&cqe), upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)));
	INFO("zoned_c1n4", "%llu+%llu+%s", (unsigned long long)ZW_SLBA * 4096,
	     (unsigned long long)ZW_BLOCKS * 4096, tag);
}

static void pi(struct upcie_nvme_ctrl *c, struct upcie_nvme_ioq *q, struct upcie_dmamem *mem)
{
	struct upcie_nvme_ns ns;
	struct upcie_nvme_cqe cqe;
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_io io;
	uint8_t *d = (uint8_t *)mem->vaddr;
	char tag[9], img[9];
	int err;

	err = upcie_nvme_ns_open(&ns, c, 5);
	TAP(err == 0 && ns.pi == 1 && ns.pract && ns.ms == 8 && ns.block_bytes == 4096,
	    "c1n5: protection information type %u in %u bytes of metadata: driven with PRACT (%d)",
	    ns.pi, ns.ms, err);
	if (err)
		return;
	tn_tag(tag, "pi");
	tn_pat(d, PI_BLOCKS * 4096, tag, (uint64_t)PI_SLBA * 4096);
	err = upcie_nvme_ioq_write_sync(q, &ns, PI_SLBA, mem, 0, PI_BLOCKS * 4096, NULL);
	TAP(err == 0, "c1n5: %u blocks written without a metadata buffer (%d)", PI_BLOCKS, err);
	memset(d + MiB, 0, PI_BLOCKS * 4096);
	err = upcie_nvme_ioq_read_sync(q, &ns, PI_SLBA, mem, MiB, PI_BLOCKS * 4096, NULL);
	TAP(err == 0 && tn_pat_diff(d + MiB, PI_BLOCKS * 4096, tag, (uint64_t)PI_SLBA * 4096) < 0,
	    "c1n5: read back with the guard and reference tags checked, verified (%d)", err);
	tn_tag(img, "c1n5");
	err = upcie_nvme_ioq_read_sync(q, &ns, PI_UNWRIT, mem, MiB, 4096, NULL);
	TAP(err == 0 && tn_pat_diff(d + MiB, 4096, img, (uint64_t)PI_UNWRIT * 4096) < 0,
	    "c1n5: a block never written (application tag ffffh) reads its image data (%d)", err);
	/*
	 * Negative control: block PI_SLBA + PI_BLOCKS written with the caller's metadata (no
	 * PRACT, no checks on the write) holding a wrong guard; a read with PRACT checks it and
	 * fails. Then it is written again with PRACT, so the host finds valid PI for all.
	 */
	memset(&io, 0, sizeof(io));
	tn_pat(d, 4096, tag, (uint64_t)(PI_SLBA + PI_BLOCKS) * 4096);
	memset(d + 2 * MiB, 0, 8);
	d[2 * MiB] = 0xde; /* guard 0xdead, application tag 0, reference tag = the LBA */
	d[2 * MiB + 1] = 0xad;
	d[2 * MiB + 7] = PI_SLBA + PI_BLOCKS;
	seg.mem = mem;
	seg.off = 0;
	seg.len = 4096;
	io.opc = UPCIE_NVME_NVM_WRITE;
	io.slba = PI_SLBA + PI_BLOCKS;
	io.segs = &seg;
	io.nsegs = 1;
	io.md = mem;
	io.md_off = 2 * MiB;
	err = upcie_nvme_ioq_io_sync(q, &ns, &io, 0, NULL);
	TAP(err == 0 &&
		upcie_nvme_ioq_read_sync(q, &ns, PI_SLBA + PI_BLOCKS, mem, MiB, 4096, &cqe) ==
		    -EIO &&
		upcie_nvme_cqe_code(&cqe) == UPCIE_NVME_SC_GUARD_CHECK,
	    "c1n5: a block written with a wrong guard (caller's metadata, no PRACT) fails the "
	    "read's check: '%s'",
	    upcie_nvme_status_str(upcie_nvme_cqe_code(&cqe)));
	err = upcie_nvme_ioq_write_sync(q, &ns, PI_SLBA + PI_BLOCKS, mem, 0, 4096, NULL);
	if (!err)
		err = upcie_nvme_ioq_read_sync(q, &ns, PI_SLBA + PI_BLOCKS, mem, MiB, 4096, NULL);
	TAP(err == 0, "c1n5: written again with PRACT, it reads back (%d)", err);
	INFO("pi_c1n5", "%u+%u+%s", PI_SLBA, PI_BLOCKS + 1, tag);
}

/* examples/nvme_driver on a namespace it must refuse: non-zero exit, the reason printed. */
static void driver_refuses(const char *path, const char *bdf, uint32_t nsid, const char *want)
{
	char cmd[256], line[512];
	bool said = false;
	FILE *p;
	int st;

	snprintf(cmd, sizeof(cmd), "/bin/nvme_driver --path %s --nsid %u %s 2>&1", path, nsid, bdf);
	p = popen(cmd, "r");
	if (!p) {
		TAP(0, "nvme_driver --nsid %u: cannot run it", nsid);
		return;
	}
	while (fgets(line, sizeof(line), p)) {
		printf("# %s", line);
		said |= strstr(line, want) != NULL;
	}
	st = pclose(p);
	TAP(st != 0 && said, "nvme_driver --nsid %u refuses: '%s' (wait status %d)", nsid, want,
	    st);
}

int main(int argc, char **argv)
{
	struct upcie_nvme_ctrl_opts o;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ioq q;
	struct upcie_dmamem mem;
	struct upcie_pci_bdf bdf;
	uint32_t ids[8], n = 0;
	int err;

	setvbuf(stdout, NULL, _IOLBF, 0);
	upcie_log_set_handler(tn_log, NULL);
	memset(&o, 0, sizeof(o));
	if (argc != 2 || upcie_nvme_path_parse(argv[1], &o.dev.path) ||
	    tn_bdf_env("TB_C1_BDF", &bdf)) {
		fprintf(stderr, "usage: t_nvme_ns uio|type1|iommufd (TB_C1_BDF set)\n");
		return 2;
	}
	o.dev.bind = true;
	o.host_mem = 16 * MiB;
	err = upcie_nvme_ctrl_open(&c, &bdf, &o);
	TAP(err == 0, "c1: opened on the %s path (%d)", argv[1], err);
	if (err)
		goto done;
	err = upcie_nvme_ctrl_ns_list(&c, ids, 8, &n);
	TAP(err == 0 && n == 5 && ids[3] == 4 && ids[4] == 5 && c.nbad_id == 0,
	    "c1: namespaces 4 (zoned) and 5 (PI) listed, no Identify value out of range (%u)", n);
	memset(&mem, 0, sizeof(mem));
	err = upcie_nvme_dev_dmamem(&c.dev, 16 * MiB, &mem);
	if (!err)
		err = upcie_nvme_ioq_create(&q, &c, NULL);
	TAP(err == 0, "c1: DMA memory and an I/O queue (%d)", err);
	if (!err) {
		zoned(&c, &q, &mem);
		pi(&c, &q, &mem);
		upcie_nvme_ioq_delete(&q);
	}
	upcie_dmamem_destroy(&mem);
	err = upcie_nvme_ctrl_close(&c);
	TAP(err == 0, "c1: closed (%d)", err);
	driver_refuses(argv[1], getenv("TB_C1_BDF"), 4, "namespace 4 is zoned");
	driver_refuses(argv[1], getenv("TB_C1_BDF"), 5,
		       "namespace 5 is formatted with protection information");
done:
	printf("1..%d\n", tn_n);
	return tn_failed ? 1 : 0;
}
