/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tb_iommufd_probe: does /dev/iommu work? Allocates an IOAS through upcie's vfio/iommufd.h,
 * reads its usable IOVA ranges and destroys it. Exit status: 0 works, 1 failed, 2 no /dev/iommu.
 * Built against bookworm's 6.1 system headers: upcie carries the iommufd UAPI itself.
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <stdio.h>

#include <upcie/vfio/iommufd.h>

int main(void)
{
	struct upcie_vfio_iommufd ctx;
	struct upcie_vfio_ioas ioas;
	struct upcie_vfio_iova_ranges ranges;
	int err = upcie_vfio_iommufd_open(&ctx);

	if (err) {
		printf("/dev/iommu: %s\n", upcie_errno_name(err));
		return err == -ENOENT ? 2 : 1;
	}
	err = upcie_vfio_ioas_alloc(&ioas, &ctx);
	if (err) {
		printf("IOMMU_IOAS_ALLOC: %s\n", upcie_errno_name(err));
		upcie_vfio_iommufd_close(&ctx);
		return 1;
	}
	printf("ioas=%u\n", ioas.id);
	err = upcie_vfio_ioas_iova_ranges(&ioas, &ranges);
	if (err)
		printf("IOMMU_IOAS_IOVA_RANGES: %s\n", upcie_errno_name(err));
	for (uint32_t i = 0; !err && i < ranges.n; i++)
		printf("iova_range=0x%llx-0x%llx\n", (unsigned long long)ranges.r[i].start,
		       (unsigned long long)ranges.r[i].last);
	if (upcie_vfio_ioas_destroy(&ioas)) {
		printf("IOMMU_DESTROY failed\n");
		err = -EIO;
	}
	upcie_vfio_iommufd_close(&ctx);
	return err ? 1 : 0;
}
