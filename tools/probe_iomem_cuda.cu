/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * probe_iomem_cuda: can CUDA reach device MMIO that this process holds, and can it take device
 * memory as a dma-buf?
 *
 * 1. cuMemHostRegister(CU_MEMHOSTREGISTER_IOMEMORY) of a BAR mapping, the route by which a
 *    GPU-initiated NVMe path reaches a doorbell; the plain registration beside it as the control
 *    (a BAR mapping is PFNMAP: without IOMEMORY it should be refused). Then a kernel, not a copy
 *    (the copy engine is not what rings a doorbell), reads the register through the device
 *    pointer, printed beside the host's read of it. The BAR comes from probe_iomem.h's sources; run
 *    it standalone, as root and not, and as the receiving end of probe_vfio_delegate to see
 *    whether the answer belongs to the descriptor or to the calling process.
 *    The same two registrations of ordinary anonymous memory are the opposite control (does
 *    the driver look behind the flag; may this process use it at all), read back by a kernel
 *    where accepted: the read path exercised without touching any device register.
 * 2. cuImportExternalMemory(CU_EXTERNAL_MEMORY_HANDLE_TYPE_DMABUF_FD) of a dma-buf CUDA exported
 *    itself (the control: a runtime that will not import its own export says nothing about
 *    anyone else's), then of a vfio BAR export and a udmabuf where this machine makes them.
 * Reads only, offset 0 by default; never writes a doorbell or any other register.
 *
 * Usage: probe_iomem_cuda (--vfio BDF | --sysfs BDF | --receive SOCKET | --none) [--bar N]
 *                         [--offset OFF] [--device ORDINAL] [--self-read] [--as UID[:GID]]
 * (also -h/--help, --version; tools/opt.h parses)
 * Prints findings and exits 0; 2 for usage errors (with a message naming the argument), 1 when
 * there is no CUDA device to ask.
 */
#include <upcie/base/feature.h>

#include <cuda.h>
#include <cuda_runtime.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "opt.h"
#include "probe_common.h"
#include "probe_cuda.h"
#include "probe_deleg.h"
#include "probe_iomem.h"

#if CUDA_VERSION >= 13000
#define PROBE_CU_DMABUF_HANDLE CU_EXTERNAL_MEMORY_HANDLE_TYPE_DMABUF_FD
#else
/* the value CUDA 13's cuda.h gives CU_EXTERNAL_MEMORY_HANDLE_TYPE_DMABUF_FD */
#define PROBE_CU_DMABUF_HANDLE ((CUexternalMemoryHandleType)9)
#endif

#define PROBE_READ_TIMEOUT_S 20

/* One 32-bit load by an SM through the registered mapping. */
__global__ void probe_read32(const volatile uint32_t *p, uint32_t *out)
{
	*out = *p;
}

static void probe_read_timeout(int sig)
{
	static const char msg[] = "  device read: no answer within 20 s (the kernel is still "
				  "waiting on the load)\n";

	(void)sig;
	if (write(STDOUT_FILENO, msg, sizeof(msg) - 1) < 0)
		_exit(PROBE_EXIT_OK);
	_exit(PROBE_EXIT_OK);
}

static void probe_device_read(CUdeviceptr dptr, uint32_t host_val, int host_err)
{
	uint32_t *out = NULL, val = 0;
	cudaError_t ce;

	ce = cudaMalloc((void **)&out, sizeof(*out));
	if (ce != cudaSuccess) {
		probe_say("  device read: cudaMalloc: %s", cudaGetErrorName(ce));
		return;
	}
	signal(SIGALRM, probe_read_timeout);
	alarm(PROBE_READ_TIMEOUT_S);
	probe_read32<<<1, 1>>>((const volatile uint32_t *)dptr, out);
	ce = cudaGetLastError();
	if (ce == cudaSuccess)
		ce = cudaDeviceSynchronize();
	alarm(0);
	if (ce == cudaSuccess)
		ce = cudaMemcpy(&val, out, sizeof(val), cudaMemcpyDeviceToHost);
	if (ce != cudaSuccess)
		probe_say("  device read (a kernel's load): failed, %s", cudaGetErrorName(ce));
	else if (host_err)
		probe_say("  device read (a kernel's load): 0x%08x (no host read to compare)", val);
	else
		probe_say("  device read (a kernel's load): 0x%08x, host read 0x%08x: %s", val,
			  host_val, val == host_val ? "same" : "DIFFERENT");
	cudaFree(out);
}

static void probe_register(struct probe_iomem *io, const char *busid, int self_read)
{
	void *addr = io->bar.addr;
	size_t size = (size_t)io->bar.size;
	CUdeviceptr dptr = 0;
	char why[96] = "";
	int err;

	probe_say("cuMemHostRegister of the BAR mapping (%s, %s):", probe_src_name(io->bar.src),
		  probe_size(size));
	err = probe_cu(cuMemHostRegister(addr, size, 0), why, sizeof(why));
	probe_say("  without IOMEMORY (the control): %s%s%s", err ? why : "ok", err ? ", " : "",
		  err ? probe_err(err) : "");
	if (!err)
		cuMemHostUnregister(addr);
	err = probe_cu(cuMemHostRegister(
			   addr, size, CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_DEVICEMAP),
		       why, sizeof(why));
	probe_say("  with CU_MEMHOSTREGISTER_IOMEMORY | DEVICEMAP: %s%s%s", err ? why : "ok",
		  err ? ", " : "", err ? probe_err(err) : "");
	if (err)
		return;
	err = probe_cu(cuMemHostGetDevicePointer(&dptr, addr, 0), why, sizeof(why));
	if (err) {
		probe_say("  cuMemHostGetDevicePointer: %s, %s", why, probe_err(err));
	} else {
		probe_say("  device pointer 0x%llx", (unsigned long long)dptr);
		if (probe_iomem_is_self(io, busid) && !self_read)
			probe_say(
			    "  device read: not asked: the BAR is this GPU's own (%s), a read "
			    "of it is PCIe loopback, not a peer access (--self-read to ask "
			    "anyway)",
			    busid);
		else
			probe_device_read(dptr + io->off, io->host_val, io->host_err);
	}
	cuMemHostUnregister(addr);
}

/*
 * The same registration of ordinary memory (anonymous pages, not a BAR), the opposite control:
 * whether the driver checks what lies behind IOMEMORY, and whether the calling process may use
 * the flag at all. Where it is accepted, a kernel reads the page back, which exercises the read
 * path without touching any device's registers.
 */
static void probe_register_ram(void)
{
	const size_t size = 2 * PROBE_MiB;
	CUdeviceptr dptr = 0;
	char why[96] = "";
	uint32_t *va;
	int err;

	va = (uint32_t *)mmap(NULL, size, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (va == (uint32_t *)MAP_FAILED) {
		probe_say("cuMemHostRegister of ordinary memory: mmap: %s", probe_err(errno));
		return;
	}
	va[0] = 0x1badcafe;
	probe_say("cuMemHostRegister of ordinary memory (2 MiB of anonymous pages, the opposite "
		  "control):");
	err = probe_cu(cuMemHostRegister(va, size, CU_MEMHOSTREGISTER_DEVICEMAP), why, sizeof(why));
	probe_say("  without IOMEMORY: %s%s%s", err ? why : "ok", err ? ", " : "",
		  err ? probe_err(err) : "");
	if (!err)
		cuMemHostUnregister(va);
	err = probe_cu(
	    cuMemHostRegister(va, size, CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_DEVICEMAP),
	    why, sizeof(why));
	probe_say("  with CU_MEMHOSTREGISTER_IOMEMORY | DEVICEMAP: %s%s%s", err ? why : "ok",
		  err ? ", " : "", err ? probe_err(err) : "");
	if (!err) {
		err = probe_cu(cuMemHostGetDevicePointer(&dptr, va, 0), why, sizeof(why));
		if (err)
			probe_say("  cuMemHostGetDevicePointer: %s, %s", why, probe_err(err));
		else
			probe_device_read(dptr, va[0], 0);
		cuMemHostUnregister(va);
	}
	munmap(va, size);
}

static void probe_import(const char *what, int fd, uint64_t size)
{
	CUDA_EXTERNAL_MEMORY_HANDLE_DESC d;
	CUexternalMemory ext = NULL;
	char why[96] = "";
	int64_t dsize = -1;
	char exp[64] = "";
	int err;

	probe_dmabuf_facts(fd, &dsize, exp, sizeof(exp));
	if (dsize > 0)
		size = (uint64_t)dsize;
	memset(&d, 0, sizeof(d));
	d.type = PROBE_CU_DMABUF_HANDLE;
	d.handle.fd = dup(fd); /* the driver owns the descriptor once an import succeeds */
	d.size = size;
	err = probe_cu(cuImportExternalMemory(&ext, &d), why, sizeof(why));
	probe_say("  %-22s (exporter %s, %s): %s%s%s", what, exp[0] ? exp : "?", probe_size(size),
		  err ? why : "imported", err ? ", " : "", err ? probe_err(err) : "");
	if (err)
		close(d.handle.fd);
	else
		cuDestroyExternalMemory(ext);
}

int main(int argc, char **argv)
{
	struct probe_iomem_opts o;
	struct probe_iomem io;
	char runtime[160], device[160], why[96] = "", busid[32] = "?";
	const char *names[4];
	int fds[4], n, attr, err;
	bool done;
	CUdevice dev = 0;
	CUcontext ctx = NULL;
	CUdeviceptr p = 0;

	opt_tool = "probe_iomem_cuda";
	err = probe_iomem_parse(argc, argv, "CUDA", &o, &done);
	if (err || done)
		return err;
	probe_begin("probe_iomem_cuda", "can CUDA register and read device MMIO this process "
					"holds, and import a dma-buf");
	probe_self("process");
	err = probe_cu_up(o.ordinal, &dev, &ctx, runtime, sizeof(runtime), device, sizeof(device),
			  why, sizeof(why));
	if (err) {
		probe_say("no CUDA device %d to ask: %s (%s)", o.ordinal, why, probe_err(err));
		return PROBE_EXIT_CANNOT;
	}
	cuDeviceGetPCIBusId(busid, (int)sizeof(busid), dev);
	probe_say("runtime: CUDA %s", runtime);
	probe_say("device:  %s", device);
	attr = -1;
	cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, dev);
	probe_say("device:  HOST_REGISTER_SUPPORTED %d", attr);
	attr = -1;
	cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, dev);
	probe_say("device:  GPU_DIRECT_RDMA_SUPPORTED %d", attr);

	probe_iomem_open(&io, &o);
	if (io.have_bar)
		probe_register(&io, busid, o.self_read);
	probe_register_ram();

	probe_say("cuImportExternalMemory(CU_EXTERNAL_MEMORY_HANDLE_TYPE_DMABUF_FD):");
	err = probe_cu(cuMemAlloc(&p, 2 * PROBE_MiB), why, sizeof(why));
	if (!err) {
		int fd = -1;

		err = probe_cu(cuMemGetHandleForAddressRange(
				   &fd, p, 2 * PROBE_MiB, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
			       why, sizeof(why));
		if (!err) {
			probe_import("CUDA's own export", fd, 2 * PROBE_MiB);
			close(fd);
		}
	}
	if (err)
		probe_say("  CUDA's own export: could not make one: %s, %s", why, probe_err(err));
	n = probe_iomem_other_dmabufs(&io, fds, names);
	for (int i = 0; i < n; i++) {
		probe_import(names[i], fds[i], 0);
		close(fds[i]);
	}
	if (p)
		cuMemFree(p);
	probe_iomem_close(&io);
	cuDevicePrimaryCtxRelease(dev);
	return PROBE_EXIT_OK;
}
