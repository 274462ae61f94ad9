// SPDX-License-Identifier: GPL-2.0
/* Another project's dmabuf_import, as far as upcie's wrapper can tell (see other.h). */
#define OTHER_NAME "dmabuf_import"
#include "other.h"
