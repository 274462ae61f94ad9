/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * probe_iomem_hip: can HIP reach device MMIO that this process holds, and can it take device
 * memory as a dma-buf? The HIP counterpart of probe_iomem_cuda.
 *
 * 1. hipHostRegister(hipHostRegisterIoMemory | hipHostRegisterMapped) of a BAR mapping, with the
 *    plain registration beside it as the control; then the register is read through the device
 *    pointer by a copy (hipMemcpy device to host), printed beside the host's read. A copy, not
 *    a kernel, since this project has no ROCm device-code path: weaker than the CUDA flavour, and
 *    enough for the question asked, which is whether the registration is accepted at all.
 *    The same registrations of ordinary anonymous memory are the opposite control, read back by
 *    a copy where accepted.
 * 2. Import of a dma-buf: HIP's hipExternalMemoryHandleType has no dma-buf member, so there is
 *    no handle type to ask with. The probe says so, then asks with the one fd-based type there
 *    is (hipExternalMemoryHandleTypeOpaqueFd), for HIP's own export (ROCm 7.0+) as the control
 *    and for a vfio BAR export and a udmabuf where this machine makes them.
 * The BAR comes from probe_iomem.h's sources (--vfio, --sysfs, --receive from
 * probe_vfio_delegate; --as to start unprivileged). Reads only, offset 0 by default.
 *
 * Usage: probe_iomem_hip (--vfio BDF | --sysfs BDF | --receive SOCKET | --none) [--bar N]
 *                        [--offset OFF] [--device ORDINAL] [--self-read] [--as UID[:GID]]
 * (also -h/--help, --version; tools/opt.h parses)
 * Prints findings and exits 0; 2 for usage errors (with a message naming the argument), 1 when
 * there is no HIP device to ask.
 */
#include <upcie/base/feature.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "opt.h"
#include "probe_common.h"
#include "probe_deleg.h"
#include "probe_hip.h"
#include "probe_iomem.h"

static void probe_register(struct probe_iomem *io, const char *busid, int self_read)
{
	void *addr = io->bar.addr, *dptr = NULL;
	size_t size = (size_t)io->bar.size;
	uint32_t val = 0;
	char why[96] = "";
	int err;

	probe_say("hipHostRegister of the BAR mapping (%s, %s):", probe_src_name(io->bar.src),
		  probe_size(size));
	err = probe_hip(hipHostRegister(addr, size, hipHostRegisterDefault), why, sizeof(why));
	probe_say("  without IoMemory (the control): %s%s%s", err ? why : "ok", err ? ", " : "",
		  err ? probe_err(err) : "");
	if (!err && hipHostUnregister(addr) != hipSuccess)
		probe_say("  hipHostUnregister of the control failed");
	err =
	    probe_hip(hipHostRegister(addr, size, hipHostRegisterIoMemory | hipHostRegisterMapped),
		      why, sizeof(why));
	probe_say("  with hipHostRegisterIoMemory | hipHostRegisterMapped: %s%s%s",
		  err ? why : "ok", err ? ", " : "", err ? probe_err(err) : "");
	if (err)
		return;
	err = probe_hip(hipHostGetDevicePointer(&dptr, addr, 0), why, sizeof(why));
	if (err) {
		probe_say("  hipHostGetDevicePointer: %s, %s", why, probe_err(err));
	} else if (probe_iomem_is_self(io, busid) && !self_read) {
		probe_say("  device pointer %p; device read: not asked: the BAR is this GPU's own "
			  "(%s), a read of it is PCIe loopback, not a peer access (--self-read "
			  "to ask anyway)",
			  dptr, busid);
	} else {
		probe_say("  device pointer %p", dptr);
		err = probe_hip(
		    hipMemcpy(&val, (char *)dptr + io->off, sizeof(val), hipMemcpyDeviceToHost),
		    why, sizeof(why));
		if (err)
			probe_say("  device read (a copy): failed, %s, %s", why, probe_err(err));
		else if (io->host_err)
			probe_say("  device read (a copy): 0x%08x (no host read to compare)", val);
		else
			probe_say("  device read (a copy): 0x%08x, host read 0x%08x: %s", val,
				  io->host_val, val == io->host_val ? "same" : "DIFFERENT");
	}
	if (hipHostUnregister(addr) != hipSuccess)
		probe_say("  hipHostUnregister failed");
}

/* The same registrations of ordinary anonymous memory, the opposite control; read back by a
 * copy where accepted. */
static void probe_register_ram(void)
{
	const size_t size = 2 * PROBE_MiB;
	void *dptr = NULL;
	uint32_t *va, val = 0;
	char why[96] = "";
	int err;

	va = (uint32_t *)mmap(NULL, size, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (va == (uint32_t *)MAP_FAILED) {
		probe_say("hipHostRegister of ordinary memory: mmap: %s", probe_err(errno));
		return;
	}
	va[0] = 0x1badcafe;
	probe_say("hipHostRegister of ordinary memory (2 MiB of anonymous pages, the opposite "
		  "control):");
	err = probe_hip(hipHostRegister(va, size, hipHostRegisterMapped), why, sizeof(why));
	probe_say("  without IoMemory: %s%s%s", err ? why : "ok", err ? ", " : "",
		  err ? probe_err(err) : "");
	if (!err && hipHostUnregister(va) != hipSuccess)
		probe_say("  hipHostUnregister failed");
	err = probe_hip(hipHostRegister(va, size, hipHostRegisterIoMemory | hipHostRegisterMapped),
			why, sizeof(why));
	probe_say("  with hipHostRegisterIoMemory | hipHostRegisterMapped: %s%s%s",
		  err ? why : "ok", err ? ", " : "", err ? probe_err(err) : "");
	if (!err) {
		err = probe_hip(hipHostGetDevicePointer(&dptr, va, 0), why, sizeof(why));
		if (!err)
			err = probe_hip(hipMemcpy(&val, dptr, sizeof(val), hipMemcpyDeviceToHost),
					why, sizeof(why));
		if (err)
			probe_say("  device read (a copy): %s, %s", why, probe_err(err));
		else
			probe_say("  device read (a copy): 0x%08x, host 0x%08x: %s", val, va[0],
				  val == va[0] ? "same" : "DIFFERENT");
		if (hipHostUnregister(va) != hipSuccess)
			probe_say("  hipHostUnregister failed");
	}
	munmap(va, size);
}

static void probe_import(const char *what, int fd, uint64_t size)
{
	hipExternalMemoryHandleDesc d;
	hipExternalMemory_t ext = NULL;
	char why[96] = "", exp[64] = "";
	int64_t dsize = -1;
	int err;

	probe_dmabuf_facts(fd, &dsize, exp, sizeof(exp));
	if (dsize > 0)
		size = (uint64_t)dsize;
	memset(&d, 0, sizeof(d));
	d.type = hipExternalMemoryHandleTypeOpaqueFd;
	d.handle.fd = dup(fd); /* the runtime owns the descriptor once an import succeeds */
	d.size = size;
	err = probe_hip(hipImportExternalMemory(&ext, &d), why, sizeof(why));
	probe_say("  %-22s (exporter %s, %s) as OpaqueFd: %s%s%s", what, exp[0] ? exp : "?",
		  probe_size(size), err ? why : "imported", err ? ", " : "",
		  err ? probe_err(err) : "");
	if (err)
		close(d.handle.fd);
	else if (hipDestroyExternalMemory(ext) != hipSuccess)
		probe_say("  hipDestroyExternalMemory failed");
}

int main(int argc, char **argv)
{
	struct probe_iomem_opts o;
	struct probe_iomem io;
	char runtime[160], device[160], why[96] = "", busid[32] = "?";
	const char *names[4];
	int fds[4], n, err;
	bool done;
	void *p = NULL;

	opt_tool = "probe_iomem_hip";
	err = probe_iomem_parse(argc, argv, "HIP", &o, &done);
	if (err || done)
		return err;
	probe_begin("probe_iomem_hip", "can HIP register and read device MMIO this process holds, "
				       "and import a dma-buf");
	probe_self("process");
	err = probe_hip_up(o.ordinal, runtime, sizeof(runtime), device, sizeof(device), busid,
			   sizeof(busid), why, sizeof(why));
	if (err) {
		probe_say("no HIP device %d to ask: %s (%s)", o.ordinal, why, probe_err(err));
		return PROBE_EXIT_CANNOT;
	}
	probe_say("runtime: HIP %s", runtime);
	probe_say("device:  %s", device);

	probe_iomem_open(&io, &o);
	if (io.have_bar)
		probe_register(&io, busid, o.self_read);
	probe_register_ram();

	probe_say("import of a dma-buf: hipExternalMemoryHandleType has no dma-buf member (no "
		  "handle type to ask with); the fd-based OpaqueFd instead:");
#if PROBE_HIP_HAVE_EXPORT
	err = probe_hip(hipMalloc(&p, 2 * PROBE_MiB), why, sizeof(why));
	if (!err) {
		int fd = -1;

		err =
		    probe_hip(hipMemGetHandleForAddressRange(&fd, (hipDeviceptr_t)p, 2 * PROBE_MiB,
							     hipMemRangeHandleTypeDmaBufFd, 0),
			      why, sizeof(why));
		if (!err) {
			probe_import("HIP's own export", fd, 2 * PROBE_MiB);
			close(fd);
		}
	}
	if (err)
		probe_say("  HIP's own export: could not make one: %s, %s", why, probe_err(err));
#else
	probe_say("  HIP's own export: built against HIP %d.%d, which has no "
		  "hipMemGetHandleForAddressRange (ROCm 7.0)",
		  HIP_VERSION_MAJOR, HIP_VERSION_MINOR);
#endif
	n = probe_iomem_other_dmabufs(&io, fds, names);
	for (int i = 0; i < n; i++) {
		probe_import(names[i], fds[i], 0);
		close(fds[i]);
	}
	if (p && hipFree(p) != hipSuccess)
		probe_say("hipFree failed");
	probe_iomem_close(&io);
	return PROBE_EXIT_OK;
}
