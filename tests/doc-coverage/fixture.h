/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Input for scripts/check-doc-coverage.sh's negative control, never compiled: two public
 * functions without a comment (the check must flag both), and functions it must accept.
 */
#ifndef UPCIE_FIXTURE_H
#define UPCIE_FIXTURE_H

static inline int upcie_fixture_commented(void);

/* A commented public function: accepted (the prototype above is not a definition). */
static inline int upcie_fixture_commented(void)
{
	return 0;
}

static inline int upcie_fixture_uncommented(void)
{
	return 0;
}

/* A comment above a C++ template: accepted. */
template <typename F> static inline int upcie_fixture_template(F f)
{
	return f();
}

static inline int upcie_fixture_internal_(void)
{
	return 0;
}

/* The comment belongs to the macro, not to the function below it. */
#define UPCIE_FIXTURE_ONE 1
static inline const struct upcie_fixture_with_a_long_name_that_wraps *
upcie_fixture_long_return(void)
{
	return 0;
}

#endif
