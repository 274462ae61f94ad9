// SPDX-License-Identifier: GPL-2.0
/* Another project's iommu_map_pa, as far as upcie's wrapper can tell (see other.h). */
#define OTHER_NAME "iommu_map_pa"
#include "other.h"
