/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * upcie_fio: an external fio ioengine that drives an NVMe controller through upcie's public
 * headers (nvme/dev.h, ctrl.h, ns.h), with the data buffers in upcie DMA memory.
 *
 *   fio --thread=1 --ioengine=external:/path/to/upcie_fio.so --filename=0000.01.00.0/1 ...
 *
 * filename is the controller's PCI address and a namespace: fio splits file names on ':', so
 * the address is written with dots ("0000.01.00.0", or "01.00.0" for domain 0; "0000\:01\:00.0"
 * also works), then "/NSID" (default 1). Several files of one job must be namespaces of one
 * controller. Every job (numjobs, or several job sections) is one thread with its own I/O queue
 * pair on the shared controller: thread=1 is required, because a controller is owned by one
 * process. The queue depth follows iodepth (times the commands a request can split into), and
 * completions are always polled. Read, write, trim (Dataset Management, deallocate) and sync
 * (Flush) are supported; a request longer than the controller's transfer limit is split into
 * several commands that complete as one.
 *
 * Engine options: upcie_path=auto|uio|type1|iommufd (the DMA path, nvme/dev.h), upcie_bind=1
 * (take the function from its driver first, as `upcie-setup bind` would: refused for a device
 * the system is using, and for a function whose PCI class is not NVMe unless
 * upcie_bind_any_class=1), upcie_max_xfer=BYTES (bytes per command, 0: the largest block size of
 * the job, bounded by MDTS), upcie_sgl=1 (SGLs instead of PRPs), upcie_gpu=1 (upcie_fio_cuda.so,
 * the build with CUDA, on the uio path, needs the dmabuf_import module: see "GPU memory"
 * below), upcie_gpu_id=N|BDF (the GPU of upcie_gpu=1: CUDA ordinal or PCI address, default 0),
 * upcie_gpu_copy=auto|1|0 (with upcie_gpu=1: when fio's buffers are copied, below).
 *
 * GPU memory (upcie_gpu=1): the controller moves the data peer-to-peer to and from a twin of
 * fio's buffers in the CUDA device heap (gpu/heap_cuda.h, bus addresses from dmabuf_import);
 * fio's own buffers are not what the controller reads or writes. Only something that reads
 * fio's buffers needs the data in them, so the engine copies between a buffer and its twin
 * (a blocking cuMemcpy in the job's thread) per upcie_gpu_copy: auto (default) when the job
 * verifies (verify= other than none and null, fio 3.33's td->o.verify: do_verify,
 * verify_only, verify_backlog and experimental_verify all act through it), 1 always, 0 never
 * (refused with verification, which would judge buffers the controller never filled; without
 * copies a Write puts on the media whatever the twin holds, not fio's buffer pattern). A Read's
 * copy to fio's buffer runs in ->event(), after fio stamped the completion time (io_u.c:
 * io_u_queued_complete, init_icd, then ios_completed calls ->event() and then verifies), so it
 * is in none of fio's latencies; a failed copy fails that io_u with EIO. A Write's copy to the
 * twin runs in ->queue(): fio writes a verifying job's buffer (backend.c: do_io,
 * populate_verify_io_u) after ->prep() and after stamping the start time (io_u.c: get_io_u),
 * so no hook before fio's clock starts sees the final bytes; fio 3.33 stamps an asynchronous
 * engine's issue time after ->queue() returns (ioengines.c: td_io_queue), so this copy is
 * outside clat but inside slat and lat. Either copy takes time in the job, so bandwidth and
 * IOPS with copies are not those of the transfer alone. Without copies, the I/O fio times is
 * the controller's transfer into or out of GPU memory alone. Not run anywhere yet: no machine
 * here has an NVMe controller and a GPU together; this path is compile-checked only.
 *
 * Metadata and protection information: md_per_io_size=BYTES gives every I/O a slot of a
 * separate metadata buffer (needed where the namespace keeps metadata apart, unless it is
 * exactly the 8-byte PI and pi_act=1); the engine writes a pattern of the LBA there
 * (upcie_md_seed varies it) and, with upcie_md_verify=1, reads check it. pi_act=1 (default)
 * sets PRACT: the controller inserts the PI on writes (application tag: apptag, default 0)
 * and strips it on reads; pi_chk=GUARD,REFTAG,APPTAG sets the PRCHK bits of reads, so a block
 * whose PI does not match (for the application tag: in the bits of apptag_mask, default
 * 0xffff) fails with the controller's status. Refused, naming the option: pi_chk, apptag or
 * apptag_mask with pi_act=0 (the engine computes no PI) or on a namespace without PI, apptag
 * or apptag_mask above 0xffff, PI formats with a 32/64-bit guard or a storage tag.
 *
 * Zoned namespaces: fio's zone hooks (get_zoned_model, report_zones, reset_wp,
 * get_max_open_zones) are Report Zones, Zone Reset and the zoned Identify Namespace, on a queue
 * pair of the controller's own (fio calls them from its main thread too); zonemode=zbd (and
 * direct=1, which fio asks of zoned block devices) is required for writing jobs, whose writes
 * fio places at the write pointers. upcie_zone_append=1 sends those writes as Zone Append
 * (the zone's first LBA in the command, the controller picks the LBA) and fails with EIO, naming
 * both LBAs, every one the controller placed elsewhere than fio's offset; refused on a
 * namespace that is not zoned, and where the job's largest write exceeds one command (the Zone
 * Append Size Limit, MDTS, upcie_max_xfer).
 *
 * Needs what the path needs (root, the function bound to uio_pci_generic or vfio-pci, or
 * upcie_bind=1, and hugepages for the buffers: upcie-setup hugepages reserve N). Built against a
 * configured fio tree of the fio binary that loads it (tools/fio/build-fio.sh, meson -Dfio_src=).
 * Does not: fork mode (thread=0).
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <upcie/base/clock.h>
#include <upcie/base/log.h>
#include <upcie/mem/dmamem.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/dev.h>
#include <upcie/nvme/ns.h>
#include <upcie/pci/bdf.h>
#if defined(UPCIE_FIO_CUDA)
#include <upcie/gpu/heap_cuda.h>
#endif

/* fio's headers come last: they define short macros (min, max, ...) our headers must not see. */
#include "fio.h"
#include "optgroup.h"
#include "verify.h"

#define UFIO_MAX_NS	 16
#define UFIO_NAME	 "upcie"
#define UFIO_STALL_NS	 (30 * UPCIE_NSEC_PER_SEC)
#define UFIO_DSM_RANGE_B 16u

/* upcie_gpu_copy: when fio's buffers and their GPU twins are copied (upcie_gpu=1) */
enum ufio_gpu_copy {
	UFIO_GPU_COPY_NEVER = 0,
	UFIO_GPU_COPY_ALWAYS = 1,
	UFIO_GPU_COPY_AUTO = 2, /* when the job verifies */
};

/* One controller, shared by every job (thread) that names it. */
struct ufio_ctrl {
	struct ufio_ctrl *next;
	struct upcie_pci_bdf bdf;
	char name[UPCIE_PCI_BDF_STRLEN];
	enum upcie_nvme_path path;
	int refs;
	struct upcie_nvme_ctrl ctrl; /* holds pointers into itself: the struct never moves */
	struct upcie_nvme_ns ns[UFIO_MAX_NS];
	unsigned nns;
	/* zone management (fio's zone hooks run in fio's main thread as well as the job's): a
	   queue pair and a Report Zones buffer of the controller's own, under zlock */
	pthread_mutex_t zlock;
	struct upcie_nvme_ioq zq;
	bool zq_live;
	struct upcie_dmamem zbuf;
	bool zbuf_live;
	uint64_t zbuf_len;
};

/* What a fio file of this engine is: a namespace of a controller (no reference held). */
struct ufio_file {
	struct ufio_ctrl *c;
	const struct upcie_nvme_ns *ns;
	/* how the job drives it (ufio_file_pi()) */
	uint32_t flags_r, flags_w;    /* PRACT / PRCHK bits of Reads and Writes */
	uint16_t apptag, apptag_mask; /* CDW15 of every Read and Write (namespaces with PI) */
	bool md;		      /* each command gets its slot of the metadata buffer */
	bool md_moves;		      /* the metadata is transferred (not PRACT with 8-byte PI) */
	bool append;		      /* writes go out as Zone Append (upcie_zone_append) */
};

struct ufio_options {
	struct thread_data *td; /* fio stores the job here */
	char *path;
	unsigned int bind;
	unsigned int bind_any_class;
	unsigned long long max_xfer;
	unsigned int sgl;
	unsigned int gpu;
	char *gpu_id;	       /* upcie_gpu_id: CUDA ordinal or PCI address; NULL/"": ordinal 0 */
	unsigned int gpu_copy; /* upcie_gpu_copy: enum ufio_gpu_copy */
	unsigned long long md_per_io_size;
	unsigned int pi_act;
	char *pi_chk;
	unsigned int apptag;
	unsigned int apptag_mask;
	unsigned int md_verify;
	unsigned int md_seed;
	unsigned int zone_append;
};

/* Per job (thread). */
struct ufio_td {
	struct ufio_ctrl *c; /* one reference */
	struct upcie_nvme_ioq q;
	bool q_live;
	struct upcie_dmamem buf; /* fio's buffers (none in a trim-only job) */
	bool buf_live;
	struct upcie_dmamem dsm; /* one DSM range per io_u, for trims */
	bool dsm_live;
	struct upcie_dmamem md; /* separate metadata: one slot of md_stride bytes per io_u */
	bool md_live;
	uint64_t md_stride;
	bool stuck; /* commands may still be with the controller: keep the memory */
	struct io_u **events;
	unsigned nevents;
	unsigned inflight;
	unsigned depth;			     /* iodepth */
	struct ufio_file files[UFIO_MAX_NS]; /* what FILE_ENG_DATA points at */
	unsigned nfiles;
	int64_t append_skew; /* UPCIE_FIO_TEST_APPEND_SKEW: a test of the Zone Append check */
#if defined(UPCIE_FIO_CUDA)
	struct upcie_gpu_cuda gpu; /* upcie_gpu=1: the data moves to and from GPU memory */
	struct upcie_heap_buf gbuf;
	bool gbuf_live;
	bool gcopy; /* copy between fio's buffers and gbuf (upcie_gpu_copy) */
#endif
};

/* Per io_u. */
struct ufio_iou {
	struct upcie_nvme_req req;
	struct io_u *io_u;
	struct ufio_td *t;
	struct thread_data *td; /* for the job's options at completion */
	unsigned slot;		/* fio's io_u index: which DSM range is this request's */
	bool busy;
	bool append;	     /* a Zone Append: its assigned LBA is checked */
	uint64_t append_lba; /* ... against this one, where fio put the write */
};

static pthread_mutex_t ufio_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ufio_ctrl *ufio_ctrls;

/*
 * "0000.01.00.0", "01.00.0" or "0000:01:00.0", then an optional "/NSID". Dots stand for the
 * colons fio does not allow in file names; the function dot stays.
 */
static int ufio_parse_name(const char *name, struct upcie_pci_bdf *bdf, uint32_t *nsid)
{
	char buf[64], *slash, *end;
	unsigned dots = 0;
	unsigned long v;

	if (strlen(name) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, name);
	*nsid = 1;
	slash = strchr(buf, '/');
	if (slash) {
		*slash = '\0';
		errno = 0;
		v = strtoul(slash + 1, &end, 0);
		if (errno || *end || !slash[1] || !v || v >= UPCIE_NVME_NSID_ALL)
			return -EINVAL;
		*nsid = (uint32_t)v;
	}
	if (!strchr(buf, ':')) {
		for (char *p = buf; *p; p++)
			dots += *p == '.';
		/* all but the last dot are colons */
		for (char *p = buf; *p && dots > 1; p++) {
			if (*p == '.') {
				*p = ':';
				dots--;
			}
		}
	}
	return upcie_pci_bdf_parse(buf, bdf);
}

/* Find or open the controller at bdf and take a reference. Global lock held. */
static int ufio_ctrl_get_locked(const struct upcie_pci_bdf *bdf, const struct ufio_options *o,
				struct ufio_ctrl **out)
{
	struct upcie_nvme_ctrl_opts co;
	struct ufio_ctrl *c;
	enum upcie_nvme_path path = UPCIE_NVME_PATH_AUTO;
	int err;

	if (o->path && *o->path && upcie_nvme_path_parse(o->path, &path)) {
		log_err("upcie: upcie_path=%s: want auto, uio, type1 or iommufd\n", o->path);
		return -EINVAL;
	}
	if (o->bind_any_class && !o->bind) {
		log_err("upcie: upcie_bind_any_class=1 only matters with upcie_bind=1 (the engine "
			"binds nothing without it)\n");
		return -EINVAL;
	}
	for (c = ufio_ctrls; c; c = c->next) {
		if (!upcie_pci_bdf_cmp(&c->bdf, bdf)) {
			if (path != UPCIE_NVME_PATH_AUTO && path != c->path) {
				log_err("upcie: %s is already open on the %s path by another job\n",
					c->name, upcie_nvme_path_name(c->path));
				return -EINVAL;
			}
			c->refs++;
			*out = c;
			return 0;
		}
	}
	c = (struct ufio_ctrl *)calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->bdf = *bdf;
	upcie_pci_bdf_format(bdf, c->name, sizeof(c->name));
	memset(&co, 0, sizeof(co));
	co.dev.path = path;
	co.dev.bind = o->bind != 0;
	co.dev.bind_any_class = o->bind_any_class != 0;
	err = upcie_nvme_ctrl_open(&c->ctrl, bdf, &co);
	if (err == -ENODEV && o->bind && !o->bind_any_class)
		log_err("upcie: %s: no such function, or its PCI class is not NVMe: check the "
			"address, or set upcie_bind_any_class=1 to bind it anyway\n",
			c->name);
	if (err) {
		log_err("upcie: cannot open NVMe controller %s: %s\n", c->name, strerror(-err));
		free(c);
		return err;
	}
	c->path = c->ctrl.dev.path;
	pthread_mutex_init(&c->zlock, NULL);
	c->refs = 1;
	c->next = ufio_ctrls;
	ufio_ctrls = c;
	*out = c;
	return 0;
}

/* Drop a reference; the last one shuts the controller down. */
static void ufio_ctrl_put(struct ufio_ctrl *c)
{
	struct ufio_ctrl **pp;

	pthread_mutex_lock(&ufio_lock);
	if (--c->refs > 0) {
		pthread_mutex_unlock(&ufio_lock);
		return;
	}
	for (pp = &ufio_ctrls; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	pthread_mutex_unlock(&ufio_lock);
	/* the zone queue has nothing in flight: its commands are synchronous */
	if (c->zq_live)
		upcie_nvme_ioq_delete(&c->zq);
	if (c->zbuf_live)
		upcie_dmamem_destroy(&c->zbuf);
	pthread_mutex_destroy(&c->zlock);
	for (unsigned i = 0; i < c->nns; i++)
		upcie_nvme_ns_close(&c->ns[i]);
	upcie_nvme_ctrl_close(&c->ctrl);
	free(c);
}

/* A job that ends without cleanup (fio exits on an error) still shuts its controllers down. */
__attribute__((destructor)) static void ufio_fini(void)
{
	while (ufio_ctrls) {
		ufio_ctrls->refs = 1;
		ufio_ctrl_put(ufio_ctrls);
	}
}

/* Namespace nsid of c, identified once. Global lock held. */
static int ufio_ns_get_locked(struct ufio_ctrl *c, uint32_t nsid, const struct upcie_nvme_ns **out)
{
	struct upcie_nvme_ns *ns;
	int err;

	for (unsigned i = 0; i < c->nns; i++) {
		if (c->ns[i].nsid == nsid) {
			*out = &c->ns[i];
			return 0;
		}
	}
	if (c->nns == UFIO_MAX_NS)
		return -ENOSPC;
	ns = &c->ns[c->nns];
	err = upcie_nvme_ns_open(ns, &c->ctrl, nsid);
	if (err) {
		log_err("upcie: %s: namespace %u: %s\n", c->name, nsid, strerror(-err));
		return err;
	}
	c->nns++;
	*out = ns;
	return 0;
}

static struct ufio_td *ufio_td_get(struct thread_data *td)
{
	struct ufio_td *t = (struct ufio_td *)td->io_ops_data;

	if (t)
		return t;
	if (!td->o.use_thread) {
		log_err("upcie: the engine needs thread=1: a controller is driven by one process, "
			"its jobs are threads\n");
		return NULL;
	}
	t = (struct ufio_td *)calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->buf.fd = -1;
	td->io_ops_data = t;
	return t;
}

/* Resolve every file of the job (once): controller reference, namespace, size. */
static int ufio_files_setup(struct thread_data *td)
{
	struct ufio_options *o = (struct ufio_options *)td->eo;
	struct ufio_td *t = ufio_td_get(td);
	struct fio_file *f;
	unsigned int i;
	int err = 0;

	if (!t)
		return 1;
	pthread_mutex_lock(&ufio_lock);
	for_each_file(td, f, i)
	{
		struct upcie_pci_bdf bdf;
		struct ufio_file *uf = (struct ufio_file *)FILE_ENG_DATA(f);
		uint32_t nsid;

		if (!uf) {
			if (ufio_parse_name(f->file_name, &bdf, &nsid)) {
				log_err("upcie: filename '%s': want a PCI address with dots for "
					"colons and an optional namespace, e.g. 0000.01.00.0/1\n",
					f->file_name);
				err = -EINVAL;
				break;
			}
			if (!t->c) {
				err = ufio_ctrl_get_locked(&bdf, o, &t->c);
				if (err)
					break;
			} else if (upcie_pci_bdf_cmp(&t->c->bdf, &bdf)) {
				log_err("upcie: the files of one job must be namespaces of one "
					"controller (%s and %s)\n",
					t->c->name, f->file_name);
				err = -EINVAL;
				break;
			}
			if (t->nfiles == UFIO_MAX_NS) {
				log_err("upcie: at most %u files per job\n", UFIO_MAX_NS);
				err = -EINVAL;
				break;
			}
			uf = &t->files[t->nfiles];
			err = ufio_ns_get_locked(t->c, nsid, &uf->ns);
			if (err)
				break;
			uf->c = t->c;
			t->nfiles++;
			FILE_SET_ENG_DATA(f, uf);
		}
		/* fio's offsets count blocks of block_bytes (extended LBAs: data and metadata) */
		f->real_file_size = (uint64_t)uf->ns->nsze * uf->ns->block_bytes;
		fio_file_set_size_known(f);
		/* fio's zonemode=zbd asks the engine's zone hooks about block devices only (a
		   regular file gets emulated zones) */
		if (uf->ns->zoned)
			f->filetype = FIO_TYPE_BLOCK;
	}
	pthread_mutex_unlock(&ufio_lock);
	if (err)
		td_verror(td, -err, "upcie setup");
	return err ? 1 : 0;
}

static int ufio_setup(struct thread_data *td)
{
	return ufio_files_setup(td);
}

#if defined(UPCIE_FIO_CUDA)
/*
 * Copy between fio's buffer and its GPU twin (synchronous, in the job's thread); outside
 * fio's latencies for Reads (->event()), inside slat and lat for Writes (->queue()).
 */
static int ufio_gpu_copy(struct ufio_td *t, struct io_u *io_u, bool to_gpu)
{
	struct upcie_gpu_cuda_ctx_save save;
	uint64_t off = (uint64_t)((char *)io_u->xfer_buf - (char *)t->buf.vaddr);
	CUdeviceptr d = (CUdeviceptr)(uintptr_t)t->gbuf.vaddr + off;
	const char *name = NULL;
	CUresult r;
	int err = upcie_gpu_cuda_dev_enter(upcie_gpu_cuda_device(&t->gpu), &save);

	if (err) {
		upcie_log(UPCIE_LOG_ERROR,
			  "upcie: %s at offset %llu: no CUDA context for the copy (%s)",
			  io_ddir_name(io_u->ddir), io_u->offset, strerror(-err));
		return err;
	}
	r = to_gpu ? cuMemcpyHtoD(d, io_u->xfer_buf, io_u->xfer_buflen)
		   : cuMemcpyDtoH(io_u->xfer_buf, d, io_u->xfer_buflen);
	upcie_gpu_cuda_dev_leave(upcie_gpu_cuda_device(&t->gpu), &save);
	if (r == CUDA_SUCCESS)
		return 0;
	if (cuGetErrorName(r, &name) != CUDA_SUCCESS)
		name = NULL;
	upcie_log(UPCIE_LOG_ERROR,
		  "upcie: %s at offset %llu, %llu bytes: copy %s GPU memory failed (%s, %d)",
		  io_ddir_name(io_u->ddir), io_u->offset, io_u->xfer_buflen, to_gpu ? "to" : "from",
		  name ? name : "CUresult", (int)r);
	return -EIO;
}
#endif

/* The metadata of block `lba` as the engine writes it (md_seed varies it), byte `i`. */
static inline uint8_t ufio_md_byte(uint64_t lba, unsigned seed, uint32_t i)
{
	uint64_t w = (lba ^ ((uint64_t)seed << 40)) * UINT64_C(0x9e3779b97f4a7c15) + i / 8;

	return (uint8_t)(w >> ((i % 8) * 8));
}

/* Fill (write) or check (read) the metadata of `nlb` blocks from `slba` at md. */
static int ufio_md_pattern(const struct ufio_options *o, const struct upcie_nvme_ns *ns,
			   uint8_t *md, uint64_t slba, uint64_t nlb, bool fill)
{
	for (uint64_t b = 0; b < nlb; b++) {
		for (uint32_t i = 0; i < ns->ms; i++) {
			uint8_t want = ufio_md_byte(slba + b, o->md_seed, i);

			if (fill) {
				md[b * ns->ms + i] = want;
			} else if (md[b * ns->ms + i] != want) {
				log_err("upcie: metadata of LBA %" PRIu64 " byte %u: 0x%02x, "
					"written as 0x%02x (md_verify)\n",
					slba + b, i, md[b * ns->ms + i], want);
				return -EILSEQ;
			}
		}
	}
	return 0;
}

static void ufio_req_done(struct upcie_nvme_req *r)
{
	struct ufio_iou *iu = (struct ufio_iou *)r->ctx;
	struct ufio_td *t = iu->t;
	struct io_u *io_u = iu->io_u;

	if (r->err) {
		if (r->err == -EIO)
			upcie_log(UPCIE_LOG_ERROR,
				  "upcie: %s at offset %llu, %llu bytes: %s (status 0x%03x)",
				  io_ddir_name(io_u->ddir), io_u->offset, io_u->xfer_buflen,
				  upcie_nvme_status_str(upcie_nvme_cqe_code(&r->cqe)),
				  upcie_nvme_cqe_code(&r->cqe));
		io_u->error = (unsigned int)-r->err;
	} else {
		struct ufio_file *uf = (struct ufio_file *)FILE_ENG_DATA(io_u->file);
		const struct ufio_options *o = (const struct ufio_options *)iu->td->eo;

		io_u->error = 0;
		io_u->resid = 0;
		/* a Zone Append landed where the controller chose: fio reads it back at its offset */
		if (iu->append) {
			uint64_t lba = UINT64_MAX;
			int err = upcie_nvme_req_append_lba(r, &lba);

			if (err || lba != iu->append_lba) {
				upcie_log(UPCIE_LOG_ERROR,
					  "upcie: Zone Append at offset %llu, %llu bytes: the "
					  "controller wrote it at LBA %" PRIu64 ", fio expected "
					  "LBA %" PRIu64,
					  io_u->offset, io_u->xfer_buflen, lba, iu->append_lba);
				io_u->error = EIO;
			}
		}
		/* md_verify: the metadata read back is what the engine wrote with it */
		if (io_u->ddir == DDIR_READ && o->md_verify && uf->md_moves && !uf->ns->pi &&
		    ufio_md_pattern(o, uf->ns,
				    (uint8_t *)t->md.vaddr + (uint64_t)iu->slot * t->md_stride,
				    io_u->offset / uf->ns->block_bytes,
				    io_u->xfer_buflen / uf->ns->block_bytes, false))
			io_u->error = EILSEQ;
		/* upcie_gpu=1: a Read's data reaches fio's buffer in ufio_event(), outside fio's
		   latency clock */
	}
	iu->busy = false;
	t->inflight--;
	t->events[t->nevents++] = io_u;
}

/* pi_chk=GUARD,REFTAG,APPTAG (any of them, any case) as PRCHK bits. */
static int ufio_pi_chk_parse(const char *str, uint32_t *bits)
{
	char buf[64], *tok, *save = NULL;

	*bits = 0;
	if (!str || !*str)
		return 0;
	if (strlen(str) >= sizeof(buf))
		return -EINVAL;
	strcpy(buf, str);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (!strcasecmp(tok, "GUARD"))
			*bits |= UPCIE_NVME_RW_PRCHK_GUARD;
		else if (!strcasecmp(tok, "REFTAG"))
			*bits |= UPCIE_NVME_RW_PRCHK_REF;
		else if (!strcasecmp(tok, "APPTAG"))
			*bits |= UPCIE_NVME_RW_PRCHK_APP;
		else
			return -EINVAL;
	}
	return 0;
}

/*
 * How the job drives namespace uf->ns: PRINFO of its Reads and Writes, and whether each
 * command carries a slot of the metadata buffer. What upcie cannot do is refused here, naming
 * the option. *md_need: metadata bytes one request of max_bs bytes needs (0: none).
 */
static int ufio_file_pi(struct thread_data *td, const struct ufio_options *o, struct ufio_file *uf,
			uint32_t chk, uint64_t max_bs, uint64_t *md_need)
{
	const struct upcie_nvme_ns *ns = uf->ns;
	const char *name = uf->c->name;
	bool sep = ns->ms && !ns->ext;

	bool tag = o->apptag || o->apptag_mask != 0xffff;

	uf->flags_r = uf->flags_w = 0;
	uf->apptag = uf->apptag_mask = 0;
	uf->md = uf->md_moves = uf->append = false;
	*md_need = 0;
	if (ns->zoned && td_write(td) && td->o.zone_mode != ZONE_MODE_ZBD) {
		log_err("upcie: %s: namespace %u is zoned: writing jobs need zonemode=zbd (writes "
			"at the write pointers)\n",
			name, ns->nsid);
		return -EINVAL;
	}
	if (!ns->pi) {
		if (chk) {
			log_err("upcie: pi_chk=%s: %s namespace %u has no protection "
				"information\n",
				o->pi_chk, name, ns->nsid);
			return -EINVAL;
		}
		if (tag) {
			log_err("upcie: apptag=0x%x, apptag_mask=0x%x: %s namespace %u has no "
				"protection information, so no application tag\n",
				o->apptag, o->apptag_mask, name, ns->nsid);
			return -EINVAL;
		}
	} else {
		if (ns->pif != UPCIE_NVME_PIF_16 || ns->sts) {
			log_err(
			    "upcie: %s namespace %u: its protection information has a %s: upcie "
			    "drives only the 16-bit guard format without a storage tag (pi_act, "
			    "pi_chk)\n",
			    name, ns->nsid, ns->sts ? "storage tag" : "32- or 64-bit guard");
			return -EOPNOTSUPP;
		}
		if ((chk & UPCIE_NVME_RW_PRCHK_REF) && ns->pi == UPCIE_NVME_DPS_PIT_3) {
			log_err("upcie: pi_chk=REFTAG: %s namespace %u has PI type 3, which does "
				"not define the reference tag\n",
				name, ns->nsid);
			return -EINVAL;
		}
		if (!o->pi_act && chk) {
			log_err("upcie: pi_chk=%s with pi_act=0: the engine does not compute "
				"protection information, so the controller would check the bytes "
				"of the metadata buffer; use pi_act=1\n",
				o->pi_chk);
			return -EINVAL;
		}
		if (!o->pi_act && tag) {
			log_err("upcie: apptag=0x%x, apptag_mask=0x%x with pi_act=0: only the "
				"controller's PI (pi_act=1) carries the application tag the engine "
				"gives; use pi_act=1\n",
				o->apptag, o->apptag_mask);
			return -EINVAL;
		}
		if (!o->pi_act && ns->ext && ns->pract) {
			log_err("upcie: pi_act=0: %s namespace %u interleaves its 8-byte PI with "
				"the data, which upcie drives with PRACT only\n",
				name, ns->nsid);
			return -EOPNOTSUPP;
		}
		if (o->pi_act) {
			uf->flags_r = UPCIE_NVME_RW_PRACT | chk;
			/* the reference tag the controller inserts comes from CDW14, which upcie
			   fills along with the REFTAG check (of what it just generated) */
			uf->flags_w =
			    UPCIE_NVME_RW_PRACT | chk |
			    (ns->pi != UPCIE_NVME_DPS_PIT_3 ? UPCIE_NVME_RW_PRCHK_REF : 0);
			/* CDW15: the tag PRACT inserts on writes, and that the APPTAG check of
			   reads expects in the bits of the mask */
			uf->apptag = (uint16_t)o->apptag;
			uf->apptag_mask = (uint16_t)o->apptag_mask;
		}
	}
	if (!sep)
		return 0;
	/* a separate metadata buffer: always given, so that upcie sends PRINFO as set here
	   (without one it drives an 8-byte-PI namespace with all checks on) */
	uf->md = true;
	uf->md_moves = !(ns->pract && o->pi_act);
	*md_need = max_bs / ns->block_bytes * ns->ms;
	if (uf->md_moves && !o->md_per_io_size) {
		log_err("upcie: %s namespace %u has %u bytes of metadata per block in a separate "
			"buffer: set md_per_io_size (at least %" PRIu64 " bytes for %" PRIu64
			"-byte requests)\n",
			name, ns->nsid, ns->ms, *md_need, max_bs);
		return -EINVAL;
	}
	if (o->md_per_io_size && o->md_per_io_size < *md_need) {
		log_err("upcie: md_per_io_size=%llu: %s namespace %u needs %" PRIu64
			" bytes of metadata for a %" PRIu64 "-byte request\n",
			o->md_per_io_size, name, ns->nsid, *md_need, max_bs);
		return -EINVAL;
	}
	return 0;
}

/*
 * upcie_zone_append=1: every namespace of the job zoned, and the job's largest write one Zone
 * Append (the controller's Zone Append Size Limit, and one command of the job's queue).
 * UPCIE_FIO_TEST_APPEND_SKEW=N shifts the LBA each append is expected at, so that a test can
 * see the check fail.
 */
static int ufio_append_setup(struct thread_data *td, struct ufio_td *t)
{
	uint64_t wbs = td->o.max_bs[DDIR_WRITE];
	const char *skew = getenv("UPCIE_FIO_TEST_APPEND_SKEW");

	for (unsigned i = 0; i < t->nfiles; i++) {
		struct ufio_file *uf = &t->files[i];
		const struct upcie_nvme_ns *ns = uf->ns;
		uint64_t zasl = 0, chunk;
		int err;

		if (!ns->zoned) {
			log_err("upcie: upcie_zone_append=1: %s namespace %u is not zoned (Zone "
				"Append is a command of zoned namespaces)\n",
				uf->c->name, ns->nsid);
			return -EINVAL;
		}
		err = upcie_nvme_ns_zone_append_max(ns, &zasl);
		if (err) {
			log_err("upcie: upcie_zone_append=1: %s namespace %u: no Zone Append Size "
				"Limit (zoned Identify Controller: %s)\n",
				uf->c->name, ns->nsid, strerror(-err));
			return err;
		}
		chunk = upcie_nvme_split_chunk(t->q.dptr.max_bytes, ns->block_bytes);
		if (td_write(td) && wbs > zasl) {
			log_err("upcie: upcie_zone_append=1: %s namespace %u takes Zone Appends of "
				"at most %" PRIu64 " bytes (the controller's Zone Append Size "
				"Limit, ZASL, within MDTS); the job writes up to %" PRIu64
				" bytes (bs)\n",
				uf->c->name, ns->nsid, zasl, wbs);
			return -EINVAL;
		}
		if (td_write(td) && wbs > chunk) {
			log_err(
			    "upcie: upcie_zone_append=1: one command of the job's queue holds at "
			    "most %" PRIu64 " bytes (upcie_max_xfer, MDTS); the job writes up to "
			    "%" PRIu64 " bytes (bs), and a Zone Append is never split\n",
			    chunk, wbs);
			return -EINVAL;
		}
		uf->append = true;
	}
	if (skew && *skew) {
		char *end;
		long long v;

		errno = 0;
		v = strtoll(skew, &end, 0);
		if (errno || *end) {
			log_err("upcie: UPCIE_FIO_TEST_APPEND_SKEW=%s: want a number of blocks\n",
				skew);
			return -EINVAL;
		}
		t->append_skew = v;
		log_info("upcie: UPCIE_FIO_TEST_APPEND_SKEW=%lld: Zone Appends are expected %lld "
			 "blocks from fio's offset (a test of the engine's LBA check)\n",
			 v, v);
	}
	return 0;
}

/* The controller's zone queue (created on first use). zlock held. */
static int ufio_zq_get_locked(struct ufio_ctrl *c)
{
	struct upcie_nvme_ioq_opts qo;
	int err;

	if (c->zq_live)
		return 0;
	c->zbuf_len = c->ctrl.max_xfer < 65536 ? c->ctrl.max_xfer : 65536;
	if (c->zbuf_len < 4096)
		c->zbuf_len = 4096;
	err = upcie_nvme_dev_dmamem(&c->ctrl.dev, c->zbuf_len, &c->zbuf);
	if (err) {
		log_err("upcie: %s: no DMA memory for Report Zones (%s)\n", c->name,
			strerror(-err));
		return err;
	}
	c->zbuf_live = true;
	memset(&qo, 0, sizeof(qo));
	qo.depth = 2;
	qo.max_xfer = c->zbuf_len;
	err = upcie_nvme_ioq_create(&c->zq, &c->ctrl, &qo);
	if (err) {
		log_err("upcie: %s: no queue pair for zone management (%s)\n", c->name,
			strerror(-err));
		upcie_dmamem_destroy(&c->zbuf);
		c->zbuf_live = false;
		return err;
	}
	c->zq_live = true;
	return 0;
}

/* One zone command, synchronously on the zone queue. zlock held. */
static int ufio_zcmd_locked(struct ufio_ctrl *c, const struct upcie_nvme_sqe *sqe, bool data)
{
	struct upcie_nvme_dseg seg = { .mem = &c->zbuf, .off = 0, .len = c->zbuf_len };
	struct upcie_nvme_req r;
	int err;

	memset(&r, 0, sizeof(r));
	err = upcie_nvme_ioq_submit_cmd(&c->zq, sqe, data ? &seg : NULL, data ? 1 : 0, &r);
	return upcie_nvme_ioq_sync(&c->zq, err, &r, 0, NULL);
}

static int ufio_get_zoned_model(struct thread_data *td, struct fio_file *f,
				enum zbd_zoned_model *model)
{
	struct ufio_file *uf = (struct ufio_file *)FILE_ENG_DATA(f);

	if (!uf && ufio_files_setup(td))
		return -EINVAL;
	uf = (struct ufio_file *)FILE_ENG_DATA(f);
	if (!uf)
		return -EINVAL;
	*model = uf->ns->zoned ? ZBD_HOST_MANAGED : ZBD_NONE;
	return 0;
}

static int ufio_report_zones(struct thread_data *td, struct fio_file *f, uint64_t offset,
			     struct zbd_zone *zones, unsigned int nr_zones)
{
	struct ufio_file *uf = (struct ufio_file *)FILE_ENG_DATA(f);
	const struct upcie_nvme_ns *ns;
	struct upcie_nvme_sqe sqe;
	struct ufio_ctrl *c;
	uint64_t n, lb;
	int err;

	(void)td;
	if (!uf || !uf->ns->zoned)
		return -EINVAL;
	ns = uf->ns;
	c = uf->c;
	lb = ns->block_bytes;
	pthread_mutex_lock(&c->zlock);
	err = ufio_zq_get_locked(c);
	if (!err)
		err = upcie_nvme_cmd_zone_report(&sqe, ns->nsid, offset / lb, c->zbuf_len, true);
	if (!err) {
		memset(c->zbuf.vaddr, 0, c->zbuf_len);
		err = ufio_zcmd_locked(c, &sqe, true);
	}
	if (err) {
		pthread_mutex_unlock(&c->zlock);
		log_err("upcie: %s namespace %u: Report Zones at LBA %" PRIu64 " failed (%s)\n",
			c->name, ns->nsid, offset / lb, strerror(-err));
		return err;
	}
	n = upcie_nvme_zone_report_count(c->zbuf.vaddr, c->zbuf_len);
	if (n > nr_zones)
		n = nr_zones;
	for (uint64_t i = 0; i < n; i++) {
		const struct upcie_nvme_zone_desc *d =
		    (const struct upcie_nvme_zone_desc *)((const char *)c->zbuf.vaddr + 64 +
							  i * 64);
		struct zbd_zone *z = &zones[i];
		unsigned zs = d->zs >> 4;

		z->start = d->zslba * lb;
		z->len = ns->zone_blocks * lb;
		z->capacity = d->zcap * lb;
		z->type = (d->zt & 0xf) == 2 ? ZBD_ZONE_TYPE_SWR : ZBD_ZONE_TYPE_CNV;
		/* the NVMe zone states have the values of fio's zone conditions */
		z->cond = (enum zbd_zone_cond)zs;
		/* a full zone's write pointer is not defined: its end */
		z->wp = zs == UPCIE_NVME_ZS_FULL ? z->start + z->capacity : d->wp * lb;
	}
	pthread_mutex_unlock(&c->zlock);
	return (int)n;
}

static int ufio_reset_wp(struct thread_data *td, struct fio_file *f, uint64_t offset,
			 uint64_t length)
{
	struct ufio_file *uf = (struct ufio_file *)FILE_ENG_DATA(f);
	const struct upcie_nvme_ns *ns;
	struct upcie_nvme_sqe sqe;
	struct ufio_ctrl *c;
	uint64_t zb, lba, end;
	int err;

	(void)td;
	if (!uf || !uf->ns->zoned)
		return -EINVAL;
	ns = uf->ns;
	c = uf->c;
	zb = ns->zone_blocks * ns->block_bytes;
	pthread_mutex_lock(&c->zlock);
	err = ufio_zq_get_locked(c);
	/* zone by zone: fio resets the zones of its range only */
	for (uint64_t z = offset / zb; !err && z * zb < offset + length; z++) {
		lba = z * ns->zone_blocks;
		end = lba + ns->zone_blocks;
		if (lba >= ns->nsze || end > ns->nsze)
			break;
		err =
		    upcie_nvme_cmd_zone_mgmt_send(&sqe, ns->nsid, lba, UPCIE_NVME_ZSA_RESET, false);
		if (!err)
			err = ufio_zcmd_locked(c, &sqe, false);
		if (err)
			log_err("upcie: %s namespace %u: Zone Reset at LBA %" PRIu64
				" failed (%s)\n",
				c->name, ns->nsid, lba, strerror(-err));
	}
	pthread_mutex_unlock(&c->zlock);
	return err;
}

static int ufio_get_max_open_zones(struct thread_data *td, struct fio_file *f,
				   unsigned int *max_open_zones)
{
	struct ufio_file *uf = (struct ufio_file *)FILE_ENG_DATA(f);
	struct upcie_nvme_id_ns_zns *z;
	int err;

	(void)td;
	*max_open_zones = 0;
	if (!uf || !uf->ns->zoned)
		return 0;
	z = (struct upcie_nvme_id_ns_zns *)malloc(sizeof(*z));
	if (!z)
		return -ENOMEM;
	err = upcie_nvme_ctrl_identify_csi(&uf->c->ctrl, UPCIE_NVME_CNS_CS_NS, uf->ns->nsid,
					   UPCIE_NVME_CSI_ZNS, z);
	if (!err && z->mor != UINT32_MAX) {
		/* 0's based; fio's limit is a count, 0 for none */
		*max_open_zones = z->mor + 1 > ZBD_MAX_OPEN_ZONES ? ZBD_MAX_OPEN_ZONES : z->mor + 1;
	}
	free(z);
	if (err)
		log_err("upcie: %s namespace %u: zoned Identify Namespace failed (%s)\n",
			uf->c->name, uf->ns->nsid, strerror(-err));
	return err;
}

static int ufio_init(struct thread_data *td)
{
	struct ufio_options *o = (struct ufio_options *)td->eo;
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ctrl *c;
	struct ufio_td *t;
	uint64_t max_bs = td_max_bs(td), xfer, chunk, pieces, depth, md_need = 0;
	bool md_any = false;
	uint32_t chk;
	int err;

	if (ufio_files_setup(td))
		return 1;
	t = (struct ufio_td *)td->io_ops_data;
	if (!t->c) {
		log_err("upcie: the job has no file (filename=0000.01.00.0/1)\n");
		return 1;
	}
	c = &t->c->ctrl;
	t->depth = td->o.iodepth;
	t->events = (struct io_u **)calloc(t->depth, sizeof(*t->events));
	if (!t->events)
		return 1;
	/* a whole request in one command where MDTS allows it, so large blocks exercise PRP
	 * lists; split by the queue otherwise */
	xfer = o->max_xfer ? o->max_xfer : max_bs;
	if (xfer > c->max_xfer)
		xfer = c->max_xfer;
	chunk = xfer < ((uint64_t)1 << c->page_shift) ? ((uint64_t)1 << c->page_shift) : xfer;
	pieces = (max_bs + chunk - 1) / chunk;
	if (!pieces)
		pieces = 1;
	depth = (uint64_t)t->depth * pieces + 1;
	if (depth > c->mqes)
		depth = c->mqes;
	if (depth < pieces + 1) {
		log_err("upcie: %s: a %" PRIu64 "-byte request needs %" PRIu64
			" commands; the controller's queues hold %u\n",
			t->c->name, max_bs, pieces, c->mqes - 1);
		return 1;
	}
	memset(&qo, 0, sizeof(qo));
	qo.depth = (uint32_t)(depth < 2 ? 2 : depth);
	qo.max_xfer = xfer;
	qo.sgl = o->sgl != 0;
	err = upcie_nvme_ioq_create(&t->q, c, &qo);
	if (err) {
		td_verror(td, -err, "upcie I/O queue");
		return 1;
	}
	t->q_live = true;
	/* which job drives which queue pair (and how), once per job */
	log_info("upcie: job %s (thread %d): %s qid %u, %u entries, %" PRIu64
		 " bytes per command, %s path\n",
		 td->o.name, td->thread_number, c->name, t->q.qid, qo.depth, xfer,
		 upcie_nvme_path_name(c->dev.path));
	/* trims carry their range in DMA memory of their own: fio allocates no buffers for a
	 * job that only trims */
	if (td_trim(td)) {
		err = upcie_nvme_dev_dmamem(&c->dev, (size_t)t->depth * UFIO_DSM_RANGE_B, &t->dsm);
		if (err) {
			td_verror(td, -err, "upcie DSM memory");
			return 1;
		}
		t->dsm_live = true;
	}
	/* protection information and metadata, per namespace of the job */
	if (ufio_pi_chk_parse(o->pi_chk, &chk)) {
		log_err("upcie: pi_chk=%s: want a comma-separated list of GUARD, REFTAG, APPTAG\n",
			o->pi_chk);
		return 1;
	}
	if (o->apptag > 0xffff || o->apptag_mask > 0xffff) {
		log_err("upcie: apptag=0x%x, apptag_mask=0x%x: the application tag and its mask "
			"are 16 bits (0..0xffff)\n",
			o->apptag, o->apptag_mask);
		return 1;
	}
	for (unsigned i = 0; i < t->nfiles; i++) {
		uint64_t need;

		err = ufio_file_pi(td, o, &t->files[i], chk, max_bs, &need);
		if (err) {
			td_verror(td, -err, "upcie namespace options");
			return 1;
		}
		if (t->files[i].md && need > md_need)
			md_need = need;
		md_any |= t->files[i].md;
	}
	if (o->zone_append) {
		err = ufio_append_setup(td, t);
		if (err) {
			td_verror(td, -err, "upcie zone append");
			return 1;
		}
	}
	if (md_any) {
		/* a power-of-two slot per io_u: never across a page of the buffer, dword aligned */
		uint64_t want = o->md_per_io_size > md_need ? o->md_per_io_size : md_need;

		t->md_stride = 64;
		while (t->md_stride < want)
			t->md_stride <<= 1;
		err = upcie_nvme_dev_dmamem(&c->dev, (size_t)(t->depth * t->md_stride), &t->md);
		if (err) {
			log_err("upcie: no DMA memory for %u metadata buffers of %" PRIu64
				" bytes (%s)\n",
				t->depth, t->md_stride, strerror(-err));
			td_verror(td, -err, "upcie metadata memory");
			return 1;
		}
		t->md_live = true;
	}
	if (o->gpu) {
		/* fio 3.33 verifies (headers written, reads checked) exactly when verify is
		 * neither none nor null; do_verify, verify_only, verify_backlog and
		 * experimental_verify act only through it */
		bool verifies = td->o.verify != VERIFY_NONE && td->o.verify != VERIFY_NULL;
#if defined(UPCIE_FIO_CUDA)
		struct upcie_gpu_cuda_opts go;
		const char *why;
#endif

		if (o->gpu_copy == UFIO_GPU_COPY_NEVER && verifies) {
			log_err("upcie: upcie_gpu_copy=0 with verification: fio would verify "
				"its own buffers, which never hold the data the controller "
				"moved to and from GPU memory (upcie_gpu_copy=auto or 1, or "
				"verify=none)\n");
			return 1;
		}
#if defined(UPCIE_FIO_CUDA)
		/* the device heap is described by bus addresses (dmabuf_import): the controller
		 * must see those, i.e. the uio path */
		if (t->c->path != UPCIE_NVME_PATH_UIO) {
			log_err("upcie: upcie_gpu=1 needs upcie_path=uio (GPU memory by bus "
				"address)\n");
			return 1;
		}
		memset(&go, 0, sizeof(go));
		if (o->gpu_id && *o->gpu_id) {
			char *end;
			unsigned long n = strtoul(o->gpu_id, &end, 10);

			if (*o->gpu_id >= '0' && *o->gpu_id <= '9' && !*end && n < 256)
				go.gpu_id = (int)n;
			else
				go.gpu_pci =
				    o->gpu_id; /* the provider refuses what is no address */
		}
		err = upcie_gpu_cuda_open(&t->gpu, &go);
		if (err) {
			log_err(
			    "upcie: upcie_gpu_id=%s: no GPU there or the provider failed (%s)\n",
			    o->gpu_id && *o->gpu_id ? o->gpu_id : "0", strerror(-err));
			td_verror(td, -err, "upcie GPU provider");
			return 1;
		}
		t->gcopy = o->gpu_copy == UFIO_GPU_COPY_ALWAYS ||
			   (o->gpu_copy == UFIO_GPU_COPY_AUTO && verifies);
		if (!t->gcopy)
			why = "off";
		else if (o->gpu_copy == UFIO_GPU_COPY_AUTO)
			why = "on (the job verifies)";
		else
			why = "on (upcie_gpu_copy=1)";
		log_info("upcie: job %s: data in GPU memory (upcie_gpu_id=%s), copies to and from "
			 "fio's buffers %s\n",
			 td->o.name, o->gpu_id && *o->gpu_id ? o->gpu_id : "0", why);
#else
		log_err("upcie: upcie_gpu=1: this engine was built without CUDA "
			"(upcie_fio_cuda.so has it)\n");
		return 1;
#endif
	}
	return 0;
}

static int ufio_iomem_alloc(struct thread_data *td, size_t total)
{
	struct ufio_td *t = (struct ufio_td *)td->io_ops_data;
	int err;

	if (!t || !t->c)
		return 1;
	err = upcie_nvme_dev_dmamem(&t->c->ctrl.dev, total, &t->buf);
	if (err) {
		log_err("upcie: no DMA memory for %zu bytes of buffers (%s): reserve hugepages, "
			"e.g. upcie-setup hugepages reserve 512\n",
			total, strerror(-err));
		return 1;
	}
	t->buf_live = true;
	td->orig_buffer = (char *)t->buf.vaddr;
#if defined(UPCIE_FIO_CUDA)
	if (t->gpu.p) {
		/* a GPU twin of fio's buffers: data is staged through it, so fio's own buffers
		 * (and its verification) see what the controller moved */
		err = upcie_gpu_cuda_alloc(&t->gpu, total, UPCIE_GPU_CUDA_GRANULE, &t->gbuf);
		if (err) {
			log_err("upcie: GPU heap: no room for %zu bytes\n", total);
			return 1;
		}
		t->gbuf_live = true;
	}
#endif
	return 0;
}

/* Wait for every command of the job to end; cancel what does not end in time. */
static void ufio_quiesce(struct thread_data *td, struct ufio_td *t)
{
	struct upcie_deadline dl;
	struct io_u *io_u;
	unsigned i;

	if (!t->q_live)
		return;
	upcie_deadline_set(&dl, UFIO_STALL_NS);
	while (t->inflight && !upcie_deadline_passed(&dl)) {
		t->nevents = 0;
		if (upcie_nvme_ioq_poll(&t->q, t->depth) < 0)
			break;
	}
	if (!t->inflight)
		return;
	io_u_qiter(&td->io_u_all, io_u, i)
	{
		struct ufio_iou *iu = (struct ufio_iou *)io_u->engine_data;

		t->nevents = 0;
		if (iu && iu->busy)
			upcie_nvme_ioq_wait(&t->q, &iu->req, 1); /* aborts, then cancels */
	}
	t->nevents = 0;
}

static void ufio_iomem_free(struct thread_data *td)
{
	struct ufio_td *t = (struct ufio_td *)td->io_ops_data;

	if (!t)
		return;
	/* the buffers go back only when the controller has let go of them */
	ufio_quiesce(td, t);
	if (t->inflight && t->q_live) {
		if (upcie_nvme_ioq_delete(&t->q))
			t->stuck = true;
		t->q_live = false;
	}
	if (t->stuck) {
		log_err("upcie: %s: commands did not end and their queue could not be deleted; "
			"the buffers are kept\n",
			t->c->name);
		t->buf_live = false;
		td->orig_buffer = NULL;
		return;
	}
#if defined(UPCIE_FIO_CUDA)
	if (t->gbuf_live)
		upcie_gpu_cuda_free(&t->gpu, &t->gbuf);
	t->gbuf_live = false;
#endif
	if (t->buf_live)
		upcie_dmamem_destroy(&t->buf);
	t->buf_live = false;
	td->orig_buffer = NULL;
}

static int ufio_io_u_init(struct thread_data *td, struct io_u *io_u)
{
	struct ufio_iou *iu = (struct ufio_iou *)calloc(1, sizeof(*iu));

	if (!iu)
		return 1;
	/* fio's index shares a union with engine_data: read it before the pointer covers it */
	iu->slot = io_u->index;
	iu->io_u = io_u;
	iu->t = (struct ufio_td *)td->io_ops_data;
	iu->td = td;
	iu->req.cb = ufio_req_done;
	iu->req.ctx = iu;
	io_u->engine_data = iu;
	return 0;
}

static void ufio_io_u_free(struct thread_data *td, struct io_u *io_u)
{
	(void)td;
	free(io_u->engine_data);
	io_u->engine_data = NULL;
}

static enum fio_q_status ufio_queue(struct thread_data *td, struct io_u *io_u)
{
	struct ufio_options *o = (struct ufio_options *)td->eo;
	struct ufio_td *t = (struct ufio_td *)td->io_ops_data;
	struct ufio_iou *iu = (struct ufio_iou *)io_u->engine_data;
	struct ufio_file *uf = (struct ufio_file *)FILE_ENG_DATA(io_u->file);
	const struct upcie_nvme_ns *ns = uf->ns;
	struct upcie_nvme_dseg seg;
	struct upcie_nvme_io io;
	uint64_t off;
	int err;

	fio_ro_check(td, io_u);
	switch (io_u->ddir) {
	case DDIR_READ:
	case DDIR_WRITE:
		if (io_u->offset % ns->block_bytes || io_u->xfer_buflen % ns->block_bytes ||
		    !io_u->xfer_buflen) {
			log_err("upcie: %llu bytes at offset %llu are not whole %u-byte blocks\n",
				io_u->xfer_buflen, io_u->offset, ns->block_bytes);
			err = -EINVAL;
			break;
		}
		err = upcie_dmamem_offset_of(&t->buf, io_u->xfer_buf, &off);
		if (err) {
			log_err("upcie: an I/O buffer outside the engine's DMA memory\n");
			break;
		}
		seg.mem = &t->buf;
		seg.off = off;
		seg.len = io_u->xfer_buflen;
#if defined(UPCIE_FIO_CUDA)
		if (t->gbuf_live) {
			seg.mem = upcie_gpu_cuda_heap(&t->gpu)->mem;
			seg.off = t->gbuf.off + off;
			/* fio's final bytes (populate_verify_io_u runs after ->prep()): the copy
			 * counts in fio's slat and lat, not in clat (issue time stamped after
			 * ->queue() returns) */
			if (t->gcopy && io_u->ddir == DDIR_WRITE && ufio_gpu_copy(t, io_u, true)) {
				err = -EIO;
				break;
			}
		}
#endif
		memset(&io, 0, sizeof(io));
		io.opc = io_u->ddir == DDIR_READ ? UPCIE_NVME_NVM_READ : UPCIE_NVME_NVM_WRITE;
		io.slba = io_u->offset / ns->block_bytes;
		io.segs = &seg;
		io.nsegs = 1;
		io.flags = io_u->ddir == DDIR_READ ? uf->flags_r : uf->flags_w;
		io.apptag = uf->apptag;
		io.apptag_mask = uf->apptag_mask;
		/* fio's zonemode=zbd issues each zone's writes at its write pointer, in order */
		io.zoned = ns->zoned && io_u->ddir == DDIR_WRITE;
		iu->append = false;
		if (uf->md) {
			if (!t->md_live || iu->slot >= t->depth) {
				err = -EINVAL;
				break;
			}
			io.md = &t->md;
			io.md_off = (uint64_t)iu->slot * t->md_stride;
			if (uf->md_moves && io_u->ddir == DDIR_WRITE)
				ufio_md_pattern(o, ns, (uint8_t *)t->md.vaddr + io.md_off, io.slba,
						io_u->xfer_buflen / ns->block_bytes, true);
			else if (uf->md_moves)
				memset((char *)t->md.vaddr + io.md_off, 0,
				       io_u->xfer_buflen / ns->block_bytes * ns->ms);
		}
		/* Zone Append names the zone; the LBA the controller picks must be fio's offset,
		   where fio's write pointer (and its verification) has the data */
		if (uf->append && io_u->ddir == DDIR_WRITE) {
			iu->append = true;
			iu->append_lba = io.slba + (uint64_t)t->append_skew;
			io.opc = UPCIE_NVME_ZNS_APPEND;
			io.slba -= io.slba % ns->zone_blocks;
		}
		err = upcie_nvme_ioq_submit_io(&t->q, ns, &io, &iu->req);
		break;
	case DDIR_SYNC:
	case DDIR_DATASYNC:
		err = upcie_nvme_ioq_flush(&t->q, ns, &iu->req);
		break;
	case DDIR_TRIM: {
		struct upcie_nvme_dsm_range *rg;
		uint64_t nlb = io_u->xfer_buflen / ns->block_bytes;

		if (io_u->offset % ns->block_bytes || io_u->xfer_buflen % ns->block_bytes || !nlb ||
		    nlb > UINT32_MAX || !t->dsm_live || iu->slot >= t->depth) {
			err = -EINVAL;
			break;
		}
		off = (uint64_t)iu->slot * UFIO_DSM_RANGE_B;
		rg = (struct upcie_nvme_dsm_range *)((char *)t->dsm.vaddr + off);
		memset(rg, 0, sizeof(*rg));
		rg->nlb = (uint32_t)nlb;
		rg->slba = io_u->offset / ns->block_bytes;
		err = upcie_nvme_ioq_dsm(&t->q, ns, &t->dsm, off, 1, UPCIE_NVME_DSM_AD, &iu->req);
		break;
	}
	default:
		err = -EINVAL;
		break;
	}
	if (err == -EBUSY && t->inflight)
		return FIO_Q_BUSY;
	if (err) {
		io_u->error = (unsigned int)(err == -EBUSY ? EIO : -err);
		return FIO_Q_COMPLETED;
	}
	iu->busy = true;
	t->inflight++;
	return FIO_Q_QUEUED;
}

static int ufio_getevents(struct thread_data *td, unsigned int min, unsigned int max,
			  const struct timespec *ts)
{
	struct ufio_td *t = (struct ufio_td *)td->io_ops_data;
	struct upcie_deadline dl = { 0 }, stall;
	bool timed = ts != NULL;
	unsigned last = t->inflight;
	int n;

	t->nevents = 0;
	if (timed)
		upcie_deadline_set(&dl, (uint64_t)ts->tv_sec * UPCIE_NSEC_PER_SEC +
					    (uint64_t)ts->tv_nsec);
	upcie_deadline_set(&stall, UFIO_STALL_NS);
	for (unsigned spins = 0;; spins++) {
		/* commands, not requests: a request ends with its last command, so at most
		 * `max` requests can end here */
		n = upcie_nvme_ioq_poll(&t->q, max - t->nevents);
		if (n < 0) {
			td_verror(td, -n, "upcie poll");
			return n;
		}
		if (t->nevents >= min || t->nevents == max || !t->inflight)
			break;
		if (n > 0 || last != t->inflight) {
			last = t->inflight;
			upcie_deadline_set(&stall, UFIO_STALL_NS);
			continue;
		}
		if (!(spins & 63)) {
			if (timed && upcie_deadline_passed(&dl))
				break;
			if (upcie_deadline_passed(&stall)) {
				/* a controller that stopped answering: abort and cancel, so every
				 * request still ends once */
				upcie_log(UPCIE_LOG_ERROR,
					  "upcie: %s: no completion for 30 s with %u requests in "
					  "flight: aborting them",
					  t->c->name, t->inflight);
				ufio_quiesce(td, t);
				break;
			}
		}
		upcie_cpu_relax();
	}
	return (int)t->nevents;
}

/*
 * fio calls this for each completed io_u after it stamped the completion time (io_u.c:
 * io_u_queued_complete, init_icd) and before it verifies that io_u (ios_completed,
 * io_completed): a Read's copy from GPU memory goes here, outside fio's latencies.
 */
static struct io_u *ufio_event(struct thread_data *td, int ev)
{
	struct ufio_td *t = (struct ufio_td *)td->io_ops_data;
	struct io_u *io_u = t->events[ev];

#if defined(UPCIE_FIO_CUDA)
	if (t->gcopy && t->gbuf_live && io_u->ddir == DDIR_READ && !io_u->error &&
	    ufio_gpu_copy(t, io_u, false))
		io_u->error = EIO;
#endif
	return io_u;
}

static int ufio_commit(struct thread_data *td)
{
	(void)td; /* the doorbell rings at submission */
	return 0;
}

static int ufio_open_file(struct thread_data *td, struct fio_file *f)
{
	(void)td;
	(void)f;
	return 0;
}

static int ufio_close_file(struct thread_data *td, struct fio_file *f)
{
	(void)td; /* the file stays resolved: fio closes and reopens files between phases */
	(void)f;
	return 0;
}

static int ufio_get_file_size(struct thread_data *td, struct fio_file *f)
{
	if (fio_file_size_known(f))
		return 0;
	return ufio_files_setup(td);
}

static void ufio_cleanup(struct thread_data *td)
{
	struct ufio_td *t = (struct ufio_td *)td->io_ops_data;

	if (!t)
		return;
	if (t->buf_live)
		ufio_iomem_free(td);
	ufio_quiesce(td, t);
	if (t->q_live) {
		/* the queue is released whatever the deletion says; the memory it pointed at
		 * only when the controller confirmed it or nothing was outstanding */
		if (upcie_nvme_ioq_delete(&t->q) && t->inflight)
			t->stuck = true;
		t->q_live = false;
	}
	if (t->dsm_live && !t->stuck)
		upcie_dmamem_destroy(&t->dsm);
	t->dsm_live = false;
	if (t->md_live && !t->stuck)
		upcie_dmamem_destroy(&t->md);
	t->md_live = false;
#if defined(UPCIE_FIO_CUDA)
	upcie_gpu_cuda_close(&t->gpu);
#endif
	if (t->c)
		ufio_ctrl_put(t->c);
	free(t->events);
	free(t);
	td->io_ops_data = NULL;
}

static struct fio_option ufio_options_list[] = {
	{
	    .name = "upcie_path",
	    .lname = "upcie DMA path",
	    .type = FIO_OPT_STR_STORE,
	    .off1 = offsetof(struct ufio_options, path),
	    .def = "auto",
	    .help = "how the controller is reached: auto, uio, type1 or iommufd",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "upcie_bind",
	    .lname = "upcie bind",
	    .type = FIO_OPT_BOOL,
	    .off1 = offsetof(struct ufio_options, bind),
	    .def = "0",
	    .help = "bind the function to the path's driver first (refused for devices in use)",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "upcie_bind_any_class",
	    .lname = "upcie bind any class",
	    .type = FIO_OPT_BOOL,
	    .off1 = offsetof(struct ufio_options, bind_any_class),
	    .def = "0",
	    .help = "with upcie_bind=1: bind even a function whose PCI class is not NVMe",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "upcie_max_xfer",
	    .lname = "upcie bytes per command",
	    .type = FIO_OPT_STR_VAL,
	    .off1 = offsetof(struct ufio_options, max_xfer),
	    .def = "0",
	    .help = "bytes per NVMe command (0: the largest block size, bounded by MDTS)",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "upcie_sgl",
	    .lname = "upcie SGLs",
	    .type = FIO_OPT_BOOL,
	    .off1 = offsetof(struct ufio_options, sgl),
	    .def = "0",
	    .help = "describe data with SGLs instead of PRPs",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "upcie_gpu",
	    .lname = "upcie GPU heap",
	    .type = FIO_OPT_BOOL,
	    .off1 = offsetof(struct ufio_options, gpu),
	    .def = "0",
	    .help = "also allocate a CUDA device heap for the job (builds with CUDA)",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "upcie_gpu_id",
	    .lname = "upcie GPU",
	    .type = FIO_OPT_STR_STORE,
	    .off1 = offsetof(struct ufio_options, gpu_id),
	    .help = "with upcie_gpu=1: the GPU, a CUDA ordinal or a PCI address (default 0)",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "upcie_gpu_copy",
	    .lname = "upcie GPU copies",
	    .type = FIO_OPT_STR,
	    .off1 = offsetof(struct ufio_options, gpu_copy),
	    .def = "auto",
	    .help = "with upcie_gpu=1: copy between fio's buffers and GPU memory (outside fio's "
		    "clat): auto (when the job verifies), 1 (always) or 0 (never)",
	    .posval =
		{
		    {
			.ival = "auto",
			.oval = UFIO_GPU_COPY_AUTO,
			.help = "copy when the job verifies",
		    },
		    {
			.ival = "1",
			.oval = UFIO_GPU_COPY_ALWAYS,
			.help = "always copy",
		    },
		    {
			.ival = "0",
			.oval = UFIO_GPU_COPY_NEVER,
			.help = "never copy (refused with verification)",
		    },
		},
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "md_per_io_size",
	    .lname = "metadata bytes per I/O",
	    .type = FIO_OPT_STR_VAL,
	    .off1 = offsetof(struct ufio_options, md_per_io_size),
	    .def = "0",
	    .help = "bytes of the separate metadata buffer of each I/O (namespaces with a "
		    "separate metadata buffer)",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "pi_act",
	    .lname = "protection information action",
	    .type = FIO_OPT_BOOL,
	    .off1 = offsetof(struct ufio_options, pi_act),
	    .def = "1",
	    .help = "PRACT: the controller inserts the PI on writes and strips it on reads",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "pi_chk",
	    .lname = "protection information checks",
	    .type = FIO_OPT_STR_STORE,
	    .off1 = offsetof(struct ufio_options, pi_chk),
	    .def = "",
	    .help = "PRCHK: the PI fields the controller checks, a list of GUARD, REFTAG, APPTAG",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "apptag",
	    .lname = "application tag",
	    .type = FIO_OPT_INT,
	    .off1 = offsetof(struct ufio_options, apptag),
	    .def = "0",
	    .help = "PI application tag (0..0xffff): inserted by pi_act=1 on writes, expected by "
		    "pi_chk=APPTAG on reads",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "apptag_mask",
	    .lname = "application tag mask",
	    .type = FIO_OPT_INT,
	    .off1 = offsetof(struct ufio_options, apptag_mask),
	    .def = "0xffff",
	    .help = "PI application tag mask (0..0xffff): the bits pi_chk=APPTAG compares",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "upcie_md_verify",
	    .lname = "upcie metadata verification",
	    .type = FIO_OPT_BOOL,
	    .off1 = offsetof(struct ufio_options, md_verify),
	    .def = "0",
	    .help = "reads check the separate metadata against what the engine writes with each "
		    "block (namespaces without PI)",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "upcie_md_seed",
	    .lname = "upcie metadata seed",
	    .type = FIO_OPT_INT,
	    .off1 = offsetof(struct ufio_options, md_seed),
	    .def = "0",
	    .help = "varies the metadata the engine writes with each block (a function of the LBA)",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = "upcie_zone_append",
	    .lname = "upcie Zone Append",
	    .type = FIO_OPT_BOOL,
	    .off1 = offsetof(struct ufio_options, zone_append),
	    .def = "0",
	    .help = "zoned namespaces: writes go out as Zone Append, the LBA the controller "
		    "assigns checked against fio's offset",
	    .category = FIO_OPT_C_ENGINE,
	    .group = FIO_OPT_G_INVALID,
	},
	{
	    .name = NULL,
	},
};

struct ioengine_ops ioengine = {
	.name = UFIO_NAME,
	.version = FIO_IOOPS_VERSION,
	.flags = FIO_RAWIO | FIO_DISKLESSIO | FIO_NODISKUTIL | FIO_NOEXTEND | FIO_MEMALIGN,
	.setup = ufio_setup,
	.init = ufio_init,
	.queue = ufio_queue,
	.commit = ufio_commit,
	.getevents = ufio_getevents,
	.event = ufio_event,
	.cleanup = ufio_cleanup,
	.open_file = ufio_open_file,
	.close_file = ufio_close_file,
	.get_file_size = ufio_get_file_size,
	.iomem_alloc = ufio_iomem_alloc,
	.iomem_free = ufio_iomem_free,
	.io_u_init = ufio_io_u_init,
	.io_u_free = ufio_io_u_free,
	.get_zoned_model = ufio_get_zoned_model,
	.report_zones = ufio_report_zones,
	.reset_wp = ufio_reset_wp,
	.get_max_open_zones = ufio_get_max_open_zones,
	.option_struct_size = sizeof(struct ufio_options),
	.options = ufio_options_list,
};
