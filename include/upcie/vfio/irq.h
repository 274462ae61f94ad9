/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Interrupts of a vfio device as eventfds: IRQ info, enabling N MSI-X (or MSI/INTx) vectors with
 * one eventfd each (VFIO_DEVICE_SET_IRQS), disabling them, and waiting for one with a timeout.
 *
 * Works on a device from either path (vfio/type1.h group, vfio/cdev.h). The kernel signals the
 * vector's eventfd; a wait polls it and reads (clears) its counter, which says how many
 * interrupts arrived since the last read. The eventfds are non-blocking; callers with their own
 * event loop may poll irqs->efd[] directly. Polling the device's completion queues needs none of
 * this. Needs: the device open; MSI-X enabled in the device by the kernel (SET_IRQS does it).
 * Does not: mask single vectors, or route interrupts to KVM. One owner per struct: enable,
 * disable and wait are not meant to race.
 */
#ifndef UPCIE_VFIO_IRQ_H
#define UPCIE_VFIO_IRQ_H

#include <upcie/base/feature.h>

#include <errno.h>
#include <inttypes.h>
#include <linux/vfio.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <upcie/base/clock.h>
#include <upcie/base/log.h>
#include <upcie/vfio/device.h>

/* Vectors per enable: the PCI limit for MSI-X. */
#define UPCIE_VFIO_IRQ_MAX 2048

struct upcie_vfio_irqs {
	int dev_fd;	/* device fd the vectors belong to (borrowed); <= 0: not enabled */
	uint32_t index; /* VFIO_PCI_MSIX_IRQ_INDEX, ... */
	uint32_t count; /* vectors enabled */
	int *efd;	/* eventfd per vector (malloc'd) */
	char name[UPCIE_PCI_BDF_STRLEN];
};

/* VFIO_DEVICE_GET_IRQ_INFO of `index` (VFIO_PCI_INTX_IRQ_INDEX .. VFIO_PCI_REQ_IRQ_INDEX). */
static inline int upcie_vfio_irq_info(const struct upcie_vfio_device *dev, uint32_t index,
				      struct vfio_irq_info *info)
{
	int err;

	if (!info)
		return UPCIE_FAIL(-EINVAL, "vfio: irq info: NULL output");
	memset(info, 0, sizeof(*info));
	info->argsz = sizeof(*info);
	info->index = index;
	err = upcie_vfio_device_check_(dev, "irq info");
	if (err)
		return err;
	if (index >= dev->num_irqs)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: IRQ index %u out of range (%u)", dev->name,
				  index, dev->num_irqs);
	if (ioctl(dev->fd, VFIO_DEVICE_GET_IRQ_INFO, info)) {
		err = upcie_neg_errno();
		return UPCIE_FAIL(err, "vfio: %s: GET_IRQ_INFO(%u): %s", dev->name, index,
				  strerror(-err));
	}
	return 0;
}

/* SET_IRQS(DATA_EVENTFD | ACTION_TRIGGER) for vectors [0, count) of index; count 0: disable. */
static inline int upcie_vfio_irq_set_(int dev_fd, uint32_t index, uint32_t count, const int *efd)
{
	struct vfio_irq_set *set;
	size_t len = sizeof(*set) + (size_t)count * sizeof(int32_t);
	int err = 0;

	set = (struct vfio_irq_set *)calloc(1, len);
	if (!set)
		return -ENOMEM;
	set->argsz = (uint32_t)len;
	set->flags = (count ? VFIO_IRQ_SET_DATA_EVENTFD : VFIO_IRQ_SET_DATA_NONE) |
		     VFIO_IRQ_SET_ACTION_TRIGGER;
	set->index = index;
	set->start = 0;
	set->count = count;
	for (uint32_t i = 0; i < count; i++) {
		int32_t v = efd[i];

		memcpy(set->data + i * sizeof(v), &v, sizeof(v));
	}
	if (ioctl(dev_fd, VFIO_DEVICE_SET_IRQS, set))
		err = upcie_neg_errno();
	free(set);
	return err;
}

static inline void upcie_vfio_irq_close_fds_(int *efd, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (efd[i] > 0)
			close(efd[i]);
}

/*
 * Enable vectors [0, count) of IRQ `index` (normally VFIO_PCI_MSIX_IRQ_INDEX), each signalling its
 * own new eventfd. -EINVAL for count 0 or beyond what the device offers (the message says how
 * many it has); -EOPNOTSUPP when the index takes no eventfds; -ENOMEM; or the kernel's error.
 * Disable with upcie_vfio_irq_disable().
 */
static inline int upcie_vfio_irq_enable(struct upcie_vfio_irqs *irqs,
					const struct upcie_vfio_device *dev, uint32_t index,
					uint32_t count)
{
	struct vfio_irq_info info;
	int *efd;
	int err;

	if (!irqs)
		return UPCIE_FAIL(-EINVAL, "vfio: irq enable: NULL irqs");
	memset(irqs, 0, sizeof(*irqs));
	irqs->dev_fd = -1;
	err = upcie_vfio_irq_info(dev, index, &info);
	if (err)
		return err;
	if (!count || count > info.count || count > UPCIE_VFIO_IRQ_MAX)
		return UPCIE_FAIL(-EINVAL, "vfio: %s: %u vectors asked of IRQ index %u, it has %u",
				  dev->name, count, index, info.count);
	if (!(info.flags & VFIO_IRQ_INFO_EVENTFD))
		return UPCIE_FAIL(-EOPNOTSUPP, "vfio: %s: IRQ index %u does not signal eventfds",
				  dev->name, index);
	efd = (int *)calloc(count, sizeof(*efd));
	if (!efd)
		return UPCIE_FAIL(-ENOMEM, "vfio: out of memory for %u eventfds", count);
	for (uint32_t i = 0; i < count; i++) {
		efd[i] = upcie_vfio_fd_not_zero_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
		if (efd[i] < 0) {
			err = upcie_neg_errno();
			upcie_vfio_irq_close_fds_(efd, i);
			free(efd);
			return UPCIE_FAIL(err, "vfio: %s: eventfd %u of %u: %s", dev->name, i,
					  count, strerror(-err));
		}
	}
	err = upcie_vfio_irq_set_(dev->fd, index, count, efd);
	if (err) {
		upcie_vfio_irq_close_fds_(efd, count);
		free(efd);
		return UPCIE_FAIL(err, "vfio: %s: SET_IRQS(index %u, %u eventfds): %s", dev->name,
				  index, count, strerror(-err));
	}
	irqs->dev_fd = dev->fd;
	irqs->index = index;
	irqs->count = count;
	irqs->efd = efd;
	memcpy(irqs->name, dev->name, sizeof(irqs->name));
	return 0;
}

/*
 * Disable the vectors in the device and close their eventfds. Returns the kernel's error from
 * SET_IRQS (the eventfds are closed regardless). Zeroed or disabled: no-op returning 0.
 */
static inline int upcie_vfio_irq_disable(struct upcie_vfio_irqs *irqs)
{
	int err = 0;

	if (!irqs)
		return 0;
	if (irqs->dev_fd > 0 && irqs->efd) {
		err = upcie_vfio_irq_set_(irqs->dev_fd, irqs->index, 0, NULL);
		if (err)
			UPCIE_ERR("vfio: %s: disabling IRQ index %u: %s", irqs->name, irqs->index,
				  strerror(-err));
		upcie_vfio_irq_close_fds_(irqs->efd, irqs->count);
	}
	free(irqs->efd);
	memset(irqs, 0, sizeof(*irqs));
	irqs->dev_fd = -1;
	return err;
}

/* Read (and so clear) an eventfd counter: >0 events, 0 none pending, <0 -errno. */
static inline int64_t upcie_vfio_irq_drain_(int fd)
{
	uint64_t v = 0;
	ssize_t n = read(fd, &v, sizeof(v));

	if (n == (ssize_t)sizeof(v))
		return (int64_t)(v > INT64_MAX ? INT64_MAX : v);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return 0;
	return n < 0 ? upcie_neg_errno() : -EIO;
}

/*
 * Wait until one of the enabled vectors fired or timeout_ns passed (UPCIE_TIMEOUT_INF: forever;
 * 0: just check). On success *vector is the lowest vector that fired and *events its count since
 * the last wait (either may be NULL); only that vector's counter is cleared. Returns 0,
 * -ETIMEDOUT, -EINVAL when nothing is enabled, or poll's/read's error.
 */
static inline int upcie_vfio_irq_wait_any(const struct upcie_vfio_irqs *irqs, uint64_t timeout_ns,
					  uint32_t *vector, uint64_t *events)
{
	struct upcie_deadline dl;
	struct pollfd *pfd;
	int err = -ETIMEDOUT;

	if (!irqs || irqs->dev_fd <= 0 || !irqs->efd || !irqs->count)
		return UPCIE_FAIL(-EINVAL, "vfio: irq wait: no vectors enabled");
	pfd = (struct pollfd *)calloc(irqs->count, sizeof(*pfd));
	if (!pfd)
		return UPCIE_FAIL(-ENOMEM, "vfio: irq wait: out of memory");
	for (uint32_t i = 0; i < irqs->count; i++) {
		pfd[i].fd = irqs->efd[i];
		pfd[i].events = POLLIN;
	}
	upcie_deadline_set(&dl, timeout_ns);
	while (err == -ETIMEDOUT) {
		uint64_t left = upcie_deadline_remaining_ns(&dl);
		struct timespec ts, *tsp = NULL;
		int n;

		if (left != UINT64_MAX) {
			ts.tv_sec = (time_t)(left / UPCIE_NSEC_PER_SEC);
			ts.tv_nsec = (long)(left % UPCIE_NSEC_PER_SEC);
			tsp = &ts;
		}
		n = ppoll(pfd, irqs->count, tsp, NULL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			err = upcie_neg_errno();
			break;
		}
		for (uint32_t i = 0; n > 0 && i < irqs->count; i++) {
			int64_t ev;

			if (!(pfd[i].revents & POLLIN))
				continue;
			ev = upcie_vfio_irq_drain_(pfd[i].fd);
			if (ev < 0) {
				err = (int)ev;
				break;
			}
			if (ev == 0)
				continue; /* someone else read it meanwhile */
			if (vector)
				*vector = i;
			if (events)
				*events = (uint64_t)ev;
			err = 0;
			break;
		}
		if (err == -ETIMEDOUT && upcie_deadline_passed(&dl))
			break;
		if (err == -ETIMEDOUT && left == 0)
			break;
	}
	free(pfd);
	if (err && err != -ETIMEDOUT)
		UPCIE_ERR("vfio: %s: waiting for interrupts: %s", irqs->name, strerror(-err));
	return err;
}

/* Like upcie_vfio_irq_wait_any() for one vector. -EINVAL for a vector that is not enabled. */
static inline int upcie_vfio_irq_wait(const struct upcie_vfio_irqs *irqs, uint32_t vector,
				      uint64_t timeout_ns, uint64_t *events)
{
	struct upcie_vfio_irqs one;

	if (!irqs || irqs->dev_fd <= 0 || !irqs->efd || vector >= irqs->count)
		return UPCIE_FAIL(-EINVAL, "vfio: irq wait: vector %u is not enabled", vector);
	one = *irqs;
	one.efd = &irqs->efd[vector];
	one.count = 1;
	return upcie_vfio_irq_wait_any(&one, timeout_ns, NULL, events);
}

#endif /* UPCIE_VFIO_IRQ_H */
