/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * nvme_driver: a complete user-space NVMe driver in one page, on top of upcie.
 *
 *   nvme_driver [--path auto|uio|type1|iommufd] [--nsid N] [--lba L] [--bytes B] BDF
 *
 * Takes the controller at BDF from whatever driver has it (--path auto: vfio-pci with the vfio
 * cdev and iommufd where the kernel has them, vfio-pci with a type1 container where the function
 * has an IOMMU group, uio_pci_generic otherwise; it says which and why), brings it up, prints
 * what Identify says about the controller and its namespaces, creates an I/O queue pair, and on
 * one namespace (the first that is neither zoned nor formatted with metadata, or --nsid) saves B
 * bytes at LBA L (default: 1 MiB at the end of the namespace), writes a pattern there, reads it
 * back and compares, then writes the saved data back and checks that too, so the namespace is
 * left as it was found. Zoned namespaces (writes only at a zone's write pointer, so no restore
 * in place) and namespaces with metadata or protection information (whose metadata it could not
 * restore) are refused, also by --nsid. Close flushes the volatile write cache, if any, and shuts
 * the controller down. The same code runs on every path: only the dmamem behind the buffers
 * differs (physical addresses under uio, IOMMU addresses under vfio).
 *
 * Needs root, and hugepages for the DMA memory (upcie-setup hugepages reserve 64).
 */
#include <upcie/base/feature.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/clock.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>

static void usage(void)
{
	fprintf(stderr, "usage: nvme_driver [--path auto|uio|type1|iommufd] [--nsid N] [--lba L] "
			"[--bytes B] BDF\n");
}

/* Why the write/restore cycle cannot run on `ns`, or NULL when it can. */
static const char *unusable(const struct upcie_nvme_ns *ns)
{
	if (ns->zoned)
		return "zoned: writes go to a zone's write pointer, so the data cannot be restored "
		       "in place";
	if (ns->pi)
		return "formatted with protection information, which writing would regenerate";
	if (ns->ms)
		return "formatted with metadata, which this example cannot save and restore";
	return NULL;
}

/* Pick the namespace: the one asked for, else the first the cycle can run on. */
static int pick_ns(struct upcie_nvme_ctrl *c, uint32_t want, struct upcie_nvme_ns *out)
{
	uint32_t ids[64], n = 0;
	int err = upcie_nvme_ctrl_ns_list(c, ids, 64, &n), found = 0;

	if (err)
		return err;
	for (uint32_t i = 0; i < n && i < 64; i++) {
		struct upcie_nvme_ns ns;
		const char *why;

		if (upcie_nvme_ns_open(&ns, c, ids[i])) {
			printf("  namespace %u: not usable (see the message above)\n", ids[i]);
			continue;
		}
		printf("  namespace %u: %" PRIu64 " blocks of %u B (%" PRIu64 " MiB)", ns.nsid,
		       ns.nsze, ns.lba_bytes, ns.nsze * ns.lba_bytes >> 20);
		if (ns.zoned)
			printf(", zoned, %" PRIu64 "-block zones", ns.zone_blocks);
		if (ns.ms)
			printf(", %u B metadata%s", ns.ms, ns.ext ? " (extended LBA)" : "");
		if (ns.pi)
			printf(", protection information type %u", ns.pi);
		printf("\n");
		why = unusable(&ns);
		if (want && ns.nsid == want && why) {
			fprintf(stderr, "nvme_driver: namespace %u is %s\n", ns.nsid, why);
			return -EOPNOTSUPP;
		}
		if (!found && (want ? ns.nsid == want : !why)) {
			*out = ns;
			found = 1;
		}
	}
	return found ? 0 : -ENOENT;
}

static void pattern(uint8_t *p, uint64_t len, uint64_t seed)
{
	for (uint64_t i = 0; i < len; i++)
		p[i] = (uint8_t)(((i * 131 + seed) >> 3) ^ seed);
}

int main(int argc, char **argv)
{
	struct upcie_nvme_ctrl_opts opts;
	struct upcie_nvme_ctrl c;
	struct upcie_nvme_ioq q;
	struct upcie_nvme_ns ns;
	struct upcie_dmamem mem;
	struct upcie_pci_bdf bdf;
	uint64_t bytes = 1 << 20, lba = UINT64_MAX, t0;
	uint32_t nsid = 0;
	const char *bdf_s = NULL;
	uint8_t *save, *data, *back;
	int err;

	memset(&opts, 0, sizeof(opts));
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--path") && i + 1 < argc &&
		    !upcie_nvme_path_parse(argv[i + 1], &opts.dev.path))
			i++;
		else if (!strcmp(argv[i], "--nsid") && i + 1 < argc)
			nsid = (uint32_t)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--lba") && i + 1 < argc)
			lba = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--bytes") && i + 1 < argc)
			bytes = strtoull(argv[++i], NULL, 0);
		else if (argv[i][0] != '-' && !bdf_s)
			bdf_s = argv[i];
		else
			bdf_s = NULL, i = argc;
	}
	if (!bdf_s || upcie_pci_bdf_parse(bdf_s, &bdf) || !bytes) {
		usage();
		return 2;
	}

	/* 1. take the controller and bring it up: disable, admin queue, enable, Identify */
	opts.dev.bind = true;
	err = upcie_nvme_ctrl_open(&c, &bdf, &opts);
	if (err) {
		fprintf(stderr, "nvme_driver: cannot bring up %s: %s\n", bdf_s, strerror(-err));
		return 1;
	}
	printf("%s on the %s path (%s)\n", c.name, upcie_nvme_path_name(c.dev.path),
	       c.dev.path_why);
	printf("  %s, serial %s, firmware %s, NVMe %u.%u, MDTS ", c.mn, c.sn, c.fr,
	       upcie_nvme_vs_mjr(c.vs), upcie_nvme_vs_mnr(c.vs));
	if (c.max_xfer == UINT64_MAX)
		printf("none");
	else
		printf("%" PRIu64 " KiB", c.max_xfer >> 10);
	printf(", %u I/O queues, SGLs %s\n", c.nqueues, c.sgl ? "yes" : "no");

	/* 2. namespaces */
	memset(&mem, 0, sizeof(mem));
	err = pick_ns(&c, nsid, &ns);
	if (err) {
		if (err == -ENOENT)
			fprintf(stderr, "nvme_driver: no usable namespace%s\n",
				nsid ? " with that id" : "");
		goto out;
	}
	bytes -= bytes % ns.lba_bytes;
	if (!bytes || bytes > ns.nsze * ns.lba_bytes) {
		err = -EINVAL;
		fprintf(stderr, "nvme_driver: %" PRIu64 " bytes do not fit the namespace\n", bytes);
		goto out;
	}
	if (lba == UINT64_MAX)
		lba = ns.nsze - bytes / ns.lba_bytes;

	/* 3. DMA memory for three buffers and an I/O queue pair */
	err = upcie_nvme_dev_dmamem(&c.dev, 3 * bytes, &mem);
	if (err)
		goto out;
	err = upcie_nvme_ioq_create(&q, &c, NULL);
	if (err)
		goto out;
	printf("  I/O queue %u, depth %u, %s DMA memory at device address 0x%" PRIx64 "\n", q.qid,
	       q.depth, mem.kind, upcie_dmamem_iova_fast(&mem, 0));
	save = (uint8_t *)mem.vaddr;
	data = save + bytes;
	back = data + bytes;

	/* 4. save, write a pattern, read it back, compare, restore */
	t0 = upcie_time_ns();
	pattern(data, bytes, t0);
	err = upcie_nvme_ioq_read_sync(&q, &ns, lba, &mem, 0, bytes, NULL);
	if (!err) {
		int rerr;

		err = upcie_nvme_ioq_write_sync(&q, &ns, lba, &mem, bytes, bytes, NULL);
		if (!err)
			err = upcie_nvme_ioq_read_sync(&q, &ns, lba, &mem, 2 * bytes, bytes, NULL);
		if (!err && memcmp(data, back, bytes)) {
			fprintf(stderr, "nvme_driver: read-back differs from what was written\n");
			err = -EIO;
		}
		if (!err)
			printf("  wrote %" PRIu64 " KiB at LBA %" PRIu64
			       " of namespace %u and read "
			       "it back: verified\n",
			       bytes >> 10, lba, ns.nsid);
		/* put the saved data back, whatever happened after it was saved */
		rerr = upcie_nvme_ioq_write_sync(&q, &ns, lba, &mem, 0, bytes, NULL);
		if (!rerr)
			rerr = upcie_nvme_ioq_read_sync(&q, &ns, lba, &mem, 2 * bytes, bytes, NULL);
		if (!rerr && memcmp(save, back, bytes))
			rerr = -EIO;
		if (!rerr)
			printf("  original data restored and checked (%.1f ms for the five "
			       "transfers)\n",
			       (double)(upcie_time_ns() - t0) / 1e6);
		else
			fprintf(stderr, "nvme_driver: restoring the original data failed\n");
		if (!err)
			err = rerr;
	}
	upcie_nvme_ioq_delete(&q);
out:
	/* 5. memory before the controller; close shuts the controller down */
	upcie_dmamem_destroy(&mem);
	if (upcie_nvme_ctrl_close(&c) == 0 && !err)
		printf("  controller shut down\n");
	if (err)
		fprintf(stderr, "nvme_driver: %s\n", strerror(-err));
	return err ? 1 : 0;
}
