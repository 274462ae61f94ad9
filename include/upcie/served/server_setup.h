/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Served queue pairs, the server's setup and teardown of its own resources (part of
 * served/server.h, which includes it; include that one): the listening socket, made in a private
 * directory and renamed into place with its final mode and group, a stale socket replaced and
 * nothing else; the namespaces the server serves; upcie_served_init() (tables, accounts, the
 * relay and poller state, the VFs when asked); and releasing all of it. Needs what server.h
 * needs; the request handlers and the connection lifecycle are in server.h.
 */
#ifndef UPCIE_SERVED_SERVER_SETUP_H
#define UPCIE_SERVED_SERVER_SETUP_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <upcie/base/log.h>
#include <upcie/nvme/ctrl.h>
#include <upcie/nvme/ns.h>
#include <upcie/served/proto.h>
#include <upcie/served/server_poll.h>
#include <upcie/served/server_state.h>
#include <upcie/served/server_vf.h>

/* Close the socket (removing its file when it is still the one we made), free the tables,
 * zero `s`. */
static inline void upcie_served_release_(struct upcie_served *s)
{
	struct stat st;

	if (s->lfd >= 0) {
		close(s->lfd);
		if (s->sock_ino && !lstat(s->path, &st) && S_ISSOCK(st.st_mode) &&
		    st.st_dev == s->sock_dev && st.st_ino == s->sock_ino)
			unlink(s->path);
	}
	if (s->wake_ctl > 0)
		close(s->wake_ctl);
	free(s->conns);
	free(s->uids);
	free(s->scratch);
	free(s->vfs);
	memset(s, 0, sizeof(*s));
	s->lfd = -1;
}

/*
 * Make the listening socket at s->path: bound in a private directory beside it (mode 0700),
 * given its mode and group there, listening, then renamed into place. A socket at the path
 * that nobody answers on is replaced; a live one is -EADDRINUSE; anything else (a file, a
 * directory, a link) is left alone: -EEXIST.
 */
static inline int upcie_served_listen_(struct upcie_served *s)
{
	struct sockaddr_un sa;
	char tmpdir[sizeof(sa.sun_path)], tmp[sizeof(sa.sun_path) + 4];
	const char *slash = strrchr(s->path, '/');
	struct stat st;
	int err, probe, len;

	if (slash)
		len = snprintf(tmpdir, sizeof(tmpdir), "%.*s/.upcie-served-XXXXXX",
			       (int)(slash - s->path), s->path);
	else
		len = snprintf(tmpdir, sizeof(tmpdir), ".upcie-served-XXXXXX");
	if (len < 0 || (size_t)len + 3 > sizeof(tmpdir))
		return UPCIE_FAIL(-ENAMETOOLONG,
				  "served: socket path %s: no room for the private directory "
				  "beside it (%zu characters at most)",
				  s->path, sizeof(tmpdir) - 24);
	if (!lstat(s->path, &st)) {
		if (!S_ISSOCK(st.st_mode))
			return UPCIE_FAIL(
			    -EEXIST, "served: %s exists and is not a socket: left alone", s->path);
		memset(&sa, 0, sizeof(sa));
		sa.sun_family = AF_UNIX;
		memcpy(sa.sun_path, s->path, strlen(s->path));
		probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		if (probe >= 0) {
			err = connect(probe, (struct sockaddr *)&sa, sizeof(sa));
			close(probe);
			if (!err)
				return UPCIE_FAIL(-EADDRINUSE, "served: a server answers on %s",
						  s->path);
		}
		/* stale: replaced by the rename below */
	}
	if (!mkdtemp(tmpdir))
		return UPCIE_FAIL(-errno, "served: private directory beside %s: %s", s->path,
				  strerror(errno));
	snprintf(tmp, sizeof(tmp), "%s/s", tmpdir); /* fits: checked above */
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, tmp, strlen(tmp));
	s->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s->lfd < 0) {
		err = -errno;
		goto out;
	}
	if (bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)) || chmod(tmp, s->o.mode) ||
	    (s->o.gid != (gid_t)-1 && chown(tmp, (uid_t)-1, s->o.gid)) || listen(s->lfd, 64) ||
	    rename(tmp, s->path) || lstat(s->path, &st)) {
		err = UPCIE_FAIL(-errno, "served: socket %s: %s", s->path, strerror(errno));
		close(s->lfd);
		s->lfd = -1;
		unlink(tmp);
		goto out;
	}
	s->sock_dev = st.st_dev;
	s->sock_ino = st.st_ino;
	err = 0;
out:
	rmdir(tmpdir);
	return err;
}

/* Identify every namespace a grant names (lock held, or before the poller runs). */
static inline void upcie_served_ns_refresh_(struct upcie_served *s)
{
	struct upcie_nvme_id_ns *id;

	if (!s->nns)
		return;
	id = (struct upcie_nvme_id_ns *)aligned_alloc(4096, 4096);
	if (!id)
		return;
	for (uint32_t i = 0; i < s->nns; i++) {
		struct upcie_served_ns_ *n = &s->ns[i];
		struct upcie_nvme_ns ns;
		bool was = n->ok;

		n->ok = false;
		if (upcie_nvme_ctrl_identify(s->c, UPCIE_NVME_CNS_NS, n->nsid, id) ||
		    upcie_nvme_ns_parse(&ns, id, n->nsid, NULL))
			continue;
		if (ns.ms || ns.pi) {
			if (was || !n->lba_bytes)
				UPCIE_WARN("served: namespace %u has metadata: not served to "
					   "isolated clients",
					   n->nsid);
			n->lba_bytes = ns.lba_bytes;
			continue;
		}
		n->nsze = ns.nsze;
		n->lba_bytes = ns.lba_bytes;
		n->ok = true;
	}
	free(id);
}

/*
 * Serve `c` (open and ready) on the socket opts->path. `map` NULL: map client memory the way
 * c->dev's path does (a controller without a dev needs a mapper). Creates the socket and
 * starts the poller thread. Returns 0, -EINVAL, -EADDRINUSE (a live server answers there),
 * -EEXIST (something not a socket is there), -ENOMEM, or the socket calls' errors. `s` is
 * zeroed on failure.
 */
static inline int upcie_served_init(struct upcie_served *s, struct upcie_nvme_ctrl *c,
				    const struct upcie_served_mapper *map,
				    const struct upcie_served_opts *opts)
{
	struct sockaddr_un sa;
	uint32_t nq;
	int err;

	if (!s)
		return UPCIE_FAIL(-EINVAL, "served: NULL server");
	memset(s, 0, sizeof(*s));
	s->lfd = -1;
	if (!c || c->state != UPCIE_NVME_CTRL_READY || !opts || !opts->path)
		return UPCIE_FAIL(-EINVAL, "served: controller not ready or no socket path");
	if (!map && !c->dev.open)
		return UPCIE_FAIL(-EINVAL, "served: a controller without a PCI function needs a "
					   "mapper");
	if (strlen(opts->path) >= sizeof(sa.sun_path))
		return UPCIE_FAIL(-EINVAL, "served: socket path too long: %s", opts->path);
	if (opts->ngrants > UPCIE_SERVED_MAX_GRANTS || (opts->ngrants && !opts->grants) ||
	    opts->trust > UPCIE_SERVED_TRUST_ALL)
		return UPCIE_FAIL(-EINVAL, "served: %u grants (at most %u) or trust %d",
				  opts->ngrants, UPCIE_SERVED_MAX_GRANTS, (int)opts->trust);
	s->c = c;
	s->o = *opts;
	if (!s->o.mode)
		s->o.mode = 0600;
	if (!s->o.max_clients)
		s->o.max_clients = 64;
	if (!s->o.max_qp)
		s->o.max_qp = 16;
	if (s->o.max_qp > UPCIE_SERVED_MAX_QP)
		s->o.max_qp = UPCIE_SERVED_MAX_QP;
	if (!s->o.max_mem)
		s->o.max_mem = 16;
	if (!s->o.max_bytes)
		s->o.max_bytes = UINT64_C(1) << 30;
	if (!s->o.max_depth || s->o.max_depth > c->mqes)
		s->o.max_depth = c->mqes;
	nq = c->nqueues;
	if (!s->o.uid_max_clients)
		s->o.uid_max_clients = s->o.max_clients / 4 ? s->o.max_clients / 4 : 1;
	if (!s->o.uid_max_qp)
		s->o.uid_max_qp = nq / 2 ? nq / 2 : 1;
	if (!s->o.uid_max_bytes)
		s->o.uid_max_bytes =
		    s->o.max_bytes > UINT64_MAX / 4 ? UINT64_MAX : 4 * s->o.max_bytes;
	if (!s->o.qp_reserve)
		s->o.qp_reserve = nq >= 2 ? (nq / 8 ? nq / 8 : 1) : 0;
	if (!s->o.hello_timeout_ms)
		s->o.hello_timeout_ms = 2000;
	if (!s->o.iso_max_xfer)
		s->o.iso_max_xfer = 128 * 1024;
	if (s->o.iso_max_xfer > c->max_xfer)
		s->o.iso_max_xfer = c->max_xfer;
	if (!s->o.relay_spin_ns)
		s->o.relay_spin_ns = 50000;
	s->o.grants = NULL;
	for (uint32_t i = 0; i < opts->ngrants; i++) {
		bool have = false;

		s->grants[i] = opts->grants[i];
		for (uint32_t k = 0; k < s->nns; k++)
			have |= s->ns[k].nsid == s->grants[i].nsid;
		if (!have)
			s->ns[s->nns++].nsid = s->grants[i].nsid;
	}
	if (map) {
		s->map = *map;
	} else {
		s->map.map = upcie_served_map_dev_;
		s->map.map_dmabuf = upcie_served_map_dmabuf_dev_;
		s->map.ctx = &c->dev;
		s->map.hugetlb = c->dev.path == UPCIE_NVME_PATH_UIO;
	}
	snprintf(s->path, sizeof(s->path), "%s", opts->path);
	s->conns = (struct upcie_served_conn_ **)calloc(s->o.max_clients, sizeof(*s->conns));
	s->uids = (struct upcie_served_uid_ *)calloc(s->o.max_clients, sizeof(*s->uids));
	s->scratch = (uint8_t *)malloc(UPCIE_SERVED_MSG_MAX);
	if (!s->conns || !s->uids || !s->scratch) {
		err = -ENOMEM;
		goto fail;
	}
	upcie_served_ns_refresh_(s);
	err = upcie_served_vf_setup_(s);
	if (err)
		goto fail;
	s->wake_ctl = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->wake_ctl < 0) {
		err = -errno;
		goto fail;
	}
	err = upcie_served_listen_(s);
	if (err)
		goto fail;
	err = -pthread_mutex_init(&s->lock, NULL);
	if (err)
		goto fail;
	err = -pthread_cond_init(&s->relay_cv, NULL);
	if (err) {
		pthread_mutex_destroy(&s->lock);
		goto fail;
	}
	err = -pthread_create(&s->relay, NULL, upcie_served_relay_main_, s);
	if (err) {
		pthread_cond_destroy(&s->relay_cv);
		pthread_mutex_destroy(&s->lock);
		goto fail;
	}
	s->relay_live = true;
	return 0;
fail:
	upcie_served_release_(s);
	return err;
}

#endif /* UPCIE_SERVED_SERVER_SETUP_H */
