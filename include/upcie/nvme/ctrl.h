/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * An NVMe controller driven from user space: bring-up, admin commands, Identify, I/O queue
 * pairs, the controller memory buffer, interrupts, abort, reset and orderly shutdown.
 *
 * One object whatever the path (nvme/dev.h: uio, vfio type1, vfio cdev + iommufd): the
 * controller sees a register mapping and dmamem objects only. upcie_nvme_ctrl_open() takes a
 * PCI function; upcie_nvme_ctrl_init() takes registers and host DMA memory the caller already
 * has (another driver framework, or a controller model in tests).
 *
 * The parts, each its own header, included here in their dependency order:
 *   nvme/ctrl_regs.h   the object, options and registers; enable, disable, halt, failure
 *   nvme/ctrl_admin.h  admin commands (waited for, or asynchronous), Identify, namespace list,
 *                      Abort
 *   nvme/ctrl_ns.h     namespaces as the controller sees them: parse, records, revalidation
 *   nvme/ctrl_events.h Asynchronous Event Requests, event handling, the admin poll and thread,
 *                      the Commands Supported and Effects log
 *   nvme/ctrl_setup.h  the bring-up sequence: Identify Controller, Number of Queues, quiesce
 *   nvme/ctrl_ioq.h    I/O queue pairs: create, create_ext, delete, interrupts, abort sets
 *   nvme/ctrl_cmb.h    the controller memory buffer
 *   nvme/ctrl_reset.h  shutdown, Flush on close, reset, subsystem reset, close
 *   nvme/ctrl_virt.h   SR-IOV: secondary controllers, Virtualization Management, namespace
 *                      attachment
 * This header adds the two ways in: upcie_nvme_ctrl_init() and upcie_nvme_ctrl_open(). Include it
 * (or nvme/ns.h) rather than a part.
 *
 * Threading: admin commands, queue create/delete, CMB and interrupt setup take the controller's
 * mutex, so threads may create their queues concurrently. Each I/O queue has one owner thread.
 * Reset and close must not run while other threads use queues. No completion callback ever runs
 * with the controller's mutex held: those of commands a reset, a queue deletion or close ends
 * are delivered after it is released, so a callback may issue admin commands. Admin completions
 * and events are reaped by whoever calls into the admin queue (nvme/ctrl_events.h). The struct
 * holds pointers into itself: keep it in place while open. Needs what nvme/dev.h needs for the
 * path. Does not: manage namespaces or firmware itself (it notices what such commands change),
 * keep alive, retry commands that failed with a status, or share a controller between
 * processes (served/ does that).
 */
#ifndef UPCIE_NVME_CTRL_H
#define UPCIE_NVME_CTRL_H

#include <upcie/nvme/ctrl_reset.h>
#include <upcie/nvme/ctrl_virt.h>

/*
 * Bring up a controller whose registers are mapped at `regs` (regs_size bytes of BAR0) with
 * host DMA memory `host` (borrowed: queues, lists and admin buffers are carved from it; it
 * needs a CPU view and must outlive the controller). Bus mastering must already be on. Options
 * may be NULL (defaults; the dev member is ignored; interrupts need upcie_nvme_ctrl_open()).
 * Returns 0, or -EINVAL, -ENOMEM, -ENODEV, -EOPNOTSUPP (CAP), -ETIMEDOUT (not ready within
 * CAP.TO), -EIO (CSTS.CFS, or an error status of Identify or Set Features); `c` is closed
 * and zeroed on failure.
 */
static inline int upcie_nvme_ctrl_init(struct upcie_nvme_ctrl *c, volatile void *regs,
				       size_t regs_size, const struct upcie_dmamem *host,
				       const struct upcie_nvme_ctrl_opts *opts)
{
	struct upcie_nvme_ctrl_opts def;
	int err;

	if (!c)
		return UPCIE_FAIL(-EINVAL, "nvme: init: NULL controller");
	upcie_nvme_ctrl_zero_(c);
	if (!regs || regs_size < 0x2000 || !host || !host->vaddr)
		return UPCIE_FAIL(-EINVAL,
				  "nvme: init: registers (%zu bytes) or host memory "
				  "missing",
				  regs_size);
	if (!opts) {
		memset(&def, 0, sizeof(def));
		opts = &def;
	}
	snprintf(c->name, sizeof(c->name), "ctrl");
	c->regs = (volatile uint8_t *)regs;
	c->regs_size = regs_size;
	c->host = host;
	err = upcie_nvme_ctrl_setup_(c, opts);
	if (err)
		upcie_nvme_ctrl_close(c);
	return err;
}

/*
 * Open NVMe function `bdf` on the path in opts->dev (nvme/dev.h), stop the controller (bus
 * mastering still off), turn bus mastering on, allocate opts->host_mem bytes of host DMA memory
 * (on the function's NUMA node) and bring the controller up as upcie_nvme_ctrl_init() does;
 * with opts->irq_vectors, also enable that many MSI-X vectors. Returns 0 or the first error
 * (see dev and init; -ETIMEDOUT when the controller cannot be stopped); `c` is zeroed on
 * failure.
 */
static inline int upcie_nvme_ctrl_open(struct upcie_nvme_ctrl *c, const struct upcie_pci_bdf *bdf,
				       const struct upcie_nvme_ctrl_opts *opts)
{
	struct upcie_nvme_ctrl_opts def;
	size_t host;
	int err;

	if (!c)
		return UPCIE_FAIL(-EINVAL, "nvme: open: NULL controller");
	upcie_nvme_ctrl_zero_(c);
	if (!opts) {
		memset(&def, 0, sizeof(def));
		opts = &def;
	}
	err = upcie_nvme_dev_open(&c->dev, bdf, &opts->dev);
	if (err)
		return err;
	memcpy(c->name, c->dev.name, sizeof(c->name));
	c->regs = (volatile uint8_t *)c->dev.regs;
	c->regs_size = c->dev.regs_size;
	err = upcie_nvme_ctrl_quiesce_(c);
	if (err)
		goto fail;
	/* stopped: memory a driver that died left to it can go back now */
	upcie_nvme_dev_reclaim(&c->dev);
	/* the kernel driver left it off (unbind) and uio_pci_generic does not set it: without it
	 * every DMA is dropped and commands time out silently */
	err = upcie_nvme_dev_bus_master(&c->dev, true);
	if (err)
		goto fail;
	host = opts->host_mem ? opts->host_mem : UPCIE_NVME_CTRL_HOST_MEM;
	err = upcie_nvme_dev_dmamem(&c->dev, host, &c->host_own);
	if (err)
		goto fail;
	c->host = &c->host_own;
	err = upcie_nvme_ctrl_setup_(c, opts);
	if (err)
		goto fail;
	return 0;
fail:
	upcie_nvme_ctrl_close(c);
	return err;
}

#endif /* UPCIE_NVME_CTRL_H */
