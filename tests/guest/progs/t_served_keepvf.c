// SPDX-License-Identifier: BSD-3-Clause
// testbed-ldflags: -lpthread
/*
 * upcie-served built with UPCIE_SERVED_TEST_VF_KEEP: a client's VF is left online when its
 * connection closes. The negative control of served_vf's revocation check (a client that closed
 * its connection but kept the controller open must fail its next Read): against this server
 * that Read succeeds.
 */
#define UPCIE_SERVED_TEST_VF_KEEP 1
#include "../../../tools/upcie-served.c"
