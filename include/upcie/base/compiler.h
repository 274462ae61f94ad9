/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Compiler attributes and portability macros used by every upcie header.
 *
 * Needs: a C11 or C++11 (or newer) compiler, gcc or clang. Works in host code and, through
 * UPCIE_HD, in CUDA/HIP device code. Provides nothing at run time.
 */
#ifndef UPCIE_BASE_COMPILER_H
#define UPCIE_BASE_COMPILER_H

#include <upcie/base/feature.h>

#define UPCIE_LIKELY(x)			__builtin_expect(!!(x), 1)
#define UPCIE_UNLIKELY(x)		__builtin_expect(!!(x), 0)
#define UPCIE_UNUSED			__attribute__((unused))
#define UPCIE_PACKED			__attribute__((packed))
#define UPCIE_ALIGNED(n)		__attribute__((aligned(n)))
#define UPCIE_PRINTF(fmt_idx, args_idx) __attribute__((format(printf, fmt_idx, args_idx)))
/* A single definition shared by every translation unit that includes the header. */
#define UPCIE_WEAK __attribute__((weak))

#ifdef __cplusplus
#define UPCIE_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#define UPCIE_EXTERN_C_BEGIN	       extern "C" {
#define UPCIE_EXTERN_C_END	       }
#else
#define UPCIE_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#define UPCIE_EXTERN_C_BEGIN
#define UPCIE_EXTERN_C_END
#endif

/* Host/device qualifier for code shared with CUDA and HIP device code. */
#if defined(__CUDACC__) || defined(__HIPCC__)
#define UPCIE_HD __host__ __device__
#else
#define UPCIE_HD
#endif

#define UPCIE_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/*
 * For an out-of-line function that a hot loop calls only on an error path: with clang on x86-64
 * the function preserves the general-purpose registers but r11 for its caller (calling
 * convention preserve_most), so the mere presence of the call does not make the loop keep its
 * values in callee-saved registers, or spill them to the stack, on the common path. Empty
 * elsewhere (gcc has no such convention). Such a function returns void and answers, if at all,
 * through a pointer: clang before 17 restores RAX on its return, so a returned value is lost
 * (scripts/check-names.sh refuses a non-void one).
 */
#if defined(__clang__) && defined(__x86_64__) && !defined(__CUDA_ARCH__) &&                        \
    !defined(__HIP_DEVICE_COMPILE__)
#define UPCIE_COLD_CALL __attribute__((preserve_most))
#else
#define UPCIE_COLD_CALL
#endif

#endif /* UPCIE_BASE_COMPILER_H */
