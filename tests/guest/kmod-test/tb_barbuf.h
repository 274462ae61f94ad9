/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * The interface of tb_barbuf (tb_barbuf.c), a test exporter: a dma-buf over a slice of a PCI
 * function's BAR, the stand-in for a GPU driver exporting VRAM. Shared by the module and the
 * guest programs that drive it.
 */
#ifndef TB_BARBUF_H
#define TB_BARBUF_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define TB_BARBUF_DEVICE "/dev/tb_barbuf"

/* Export without a pin op (an exporter that may move its buffers). */
#define TB_BARBUF_F_NOPIN (1u << 0)

/* EXPORT: [offset, offset + len) of BAR `bar` of the function; the dma-buf's descriptor out. */
struct tb_barbuf_export {
	__u32 segment;
	__u8 bus;
	__u8 devfn;
	__u16 reserved;
	__u32 bar;
	__u32 flags;
	__u64 offset;
	__u64 len;
	__s32 fd; /* out */
	__u32 reserved2;
};

/* STATE: what importers did to the buffer behind `fd`. */
struct tb_barbuf_state {
	__s32 fd;	/* in: a dma-buf this module exported */
	__u32 pins;	/* out: pinned now */
	__u32 attached; /* out: attachments now */
	__u32 reserved;
};

#define TB_BARBUF_IOC_EXPORT _IOWR(0xE8, 0x01, struct tb_barbuf_export)
#define TB_BARBUF_IOC_STATE  _IOWR(0xE8, 0x02, struct tb_barbuf_state)
/* REVOKE: the argument is the dma-buf's descriptor (an int); tells every importer it moves. */
#define TB_BARBUF_IOC_REVOKE _IOW(0xE8, 0x03, __s32)

#endif /* TB_BARBUF_H */
