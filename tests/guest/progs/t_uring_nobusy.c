/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * t_uring built without the rule that a dma-buf slot is not unregistered while I/O on it is in
 * flight: the negative control of uring_dmabuf. Its "-EBUSY" check must fail.
 */
#define UPCIE_URING_DMABUF_TEST_NO_BUSY_CHECK 1
#include "t_uring.c"
