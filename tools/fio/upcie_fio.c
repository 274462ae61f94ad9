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
 * the system is using), upcie_max_xfer=BYTES (bytes per command, 0: the largest block size of
 * the job, bounded by MDTS), upcie_sgl=1 (SGLs instead of PRPs), upcie_gpu=1 (upcie_fio_cuda.so,
 * the build with CUDA, on the uio path: the controller moves the data to and from a twin of
 * fio's buffers in the CUDA device heap, gpu/heap_cuda.h, and the engine copies between the
 * twins, so fio's verification still judges what the controller moved; needs the dmabuf_import
 * module), upcie_gpu_id=N|BDF (the GPU of upcie_gpu=1: CUDA ordinal or PCI address, default 0).
 *
 * Needs what the path needs (root, the function bound to uio_pci_generic or vfio-pci, or
 * upcie_bind=1, and hugepages for the buffers: upcie-setup hugepages reserve N). Built against a
 * configured fio tree of the fio binary that loads it (tools/fio/build-fio.sh, meson -Dfio_src=).
 * Does not: support namespaces with metadata in a separate buffer, protection information,
 * zoned namespaces, or fork mode (thread=0).
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

#define UFIO_MAX_NS	 16
#define UFIO_NAME	 "upcie"
#define UFIO_STALL_NS	 (30 * UPCIE_NSEC_PER_SEC)
#define UFIO_DSM_RANGE_B 16u

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
};

/* What a fio file of this engine is: a namespace of a controller (no reference held). */
struct ufio_file {
	struct ufio_ctrl *c;
	const struct upcie_nvme_ns *ns;
};

struct ufio_options {
	struct thread_data *td; /* fio stores the job here */
	char *path;
	unsigned int bind;
	unsigned long long max_xfer;
	unsigned int sgl;
	unsigned int gpu;
	char *gpu_id; /* upcie_gpu_id: CUDA ordinal or PCI address; NULL/"": ordinal 0 */
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
	bool stuck; /* commands may still be with the controller: keep the memory */
	struct io_u **events;
	unsigned nevents;
	unsigned inflight;
	unsigned depth;			     /* iodepth */
	struct ufio_file files[UFIO_MAX_NS]; /* what FILE_ENG_DATA points at */
	unsigned nfiles;
#if defined(UPCIE_FIO_CUDA)
	struct upcie_gpu_cuda gpu; /* upcie_gpu=1: the data moves to and from GPU memory */
	struct upcie_heap_buf gbuf;
	bool gbuf_live;
#endif
};

/* Per io_u. */
struct ufio_iou {
	struct upcie_nvme_req req;
	struct io_u *io_u;
	struct ufio_td *t;
	unsigned slot; /* fio's io_u index: which DSM range is this request's */
	bool busy;
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
	err = upcie_nvme_ctrl_open(&c->ctrl, bdf, &co);
	if (err) {
		log_err("upcie: cannot open NVMe controller %s: %s\n", c->name, strerror(-err));
		free(c);
		return err;
	}
	c->path = c->ctrl.dev.path;
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
	if (ns->ms && !ns->ext) {
		log_err("upcie: %s: namespace %u has %u bytes of metadata per block in a separate "
			"buffer: not supported by this engine\n",
			c->name, nsid, ns->ms);
		upcie_nvme_ns_close(ns);
		return -EOPNOTSUPP;
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
		f->real_file_size = (uint64_t)uf->ns->nsze * uf->ns->lba_bytes;
		fio_file_set_size_known(f);
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
/* Copy between fio's buffer and its GPU twin (synchronous, in the job's thread). */
static int ufio_gpu_copy(struct ufio_td *t, struct io_u *io_u, bool to_gpu)
{
	struct upcie_gpu_cuda_ctx_save save;
	uint64_t off = (uint64_t)((char *)io_u->xfer_buf - (char *)t->buf.vaddr);
	CUdeviceptr d = (CUdeviceptr)(uintptr_t)t->gbuf.vaddr + off;
	CUresult r;
	int err = upcie_gpu_cuda_dev_enter(upcie_gpu_cuda_device(&t->gpu), &save);

	if (err)
		return err;
	r = to_gpu ? cuMemcpyHtoD(d, io_u->xfer_buf, io_u->xfer_buflen)
		   : cuMemcpyDtoH(io_u->xfer_buf, d, io_u->xfer_buflen);
	upcie_gpu_cuda_dev_leave(upcie_gpu_cuda_device(&t->gpu), &save);
	return r == CUDA_SUCCESS ? 0 : -EIO;
}
#endif

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
		io_u->error = 0;
		io_u->resid = 0;
#if defined(UPCIE_FIO_CUDA)
		if (t->gbuf_live && io_u->ddir == DDIR_READ && ufio_gpu_copy(t, io_u, false))
			io_u->error = EIO;
#endif
	}
	iu->busy = false;
	t->inflight--;
	t->events[t->nevents++] = io_u;
}

static int ufio_init(struct thread_data *td)
{
	struct ufio_options *o = (struct ufio_options *)td->eo;
	struct upcie_nvme_ioq_opts qo;
	struct upcie_nvme_ctrl *c;
	struct ufio_td *t;
	uint64_t max_bs = td_max_bs(td), xfer, chunk, pieces, depth;
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
	if (o->gpu) {
#if defined(UPCIE_FIO_CUDA)
		struct upcie_gpu_cuda_opts go;

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
		if (io_u->offset % ns->lba_bytes || io_u->xfer_buflen % ns->block_bytes ||
		    !io_u->xfer_buflen) {
			log_err("upcie: %llu bytes at offset %llu are not whole %u-byte blocks\n",
				io_u->xfer_buflen, io_u->offset, ns->lba_bytes);
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
			if (io_u->ddir == DDIR_WRITE && ufio_gpu_copy(t, io_u, true)) {
				err = -EIO;
				break;
			}
		}
#endif
		memset(&io, 0, sizeof(io));
		io.opc = io_u->ddir == DDIR_READ ? UPCIE_NVME_NVM_READ : UPCIE_NVME_NVM_WRITE;
		io.slba = io_u->offset / ns->lba_bytes;
		io.segs = &seg;
		io.nsegs = 1;
		err = upcie_nvme_ioq_submit_io(&t->q, ns, &io, &iu->req);
		break;
	case DDIR_SYNC:
	case DDIR_DATASYNC:
		err = upcie_nvme_ioq_flush(&t->q, ns, &iu->req);
		break;
	case DDIR_TRIM: {
		struct upcie_nvme_dsm_range *rg;
		uint64_t nlb = io_u->xfer_buflen / ns->lba_bytes;

		if (io_u->offset % ns->lba_bytes || io_u->xfer_buflen % ns->lba_bytes || !nlb ||
		    nlb > UINT32_MAX || !t->dsm_live || iu->slot >= t->depth) {
			err = -EINVAL;
			break;
		}
		off = (uint64_t)iu->slot * UFIO_DSM_RANGE_B;
		rg = (struct upcie_nvme_dsm_range *)((char *)t->dsm.vaddr + off);
		memset(rg, 0, sizeof(*rg));
		rg->nlb = (uint32_t)nlb;
		rg->slba = io_u->offset / ns->lba_bytes;
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

static struct io_u *ufio_event(struct thread_data *td, int ev)
{
	struct ufio_td *t = (struct ufio_td *)td->io_ops_data;

	return t->events[ev];
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
	.option_struct_size = sizeof(struct ufio_options),
	.options = ufio_options_list,
};
