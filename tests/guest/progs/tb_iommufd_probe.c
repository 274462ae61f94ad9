// SPDX-License-Identifier: BSD-3-Clause
/*
 * tb_iommufd_probe: does /dev/iommu work? Allocates an IOAS, reads its usable
 * IOVA ranges and destroys it. Exit status: 0 works, 1 failed, 2 no /dev/iommu.
 * Built by testbed.sh with linux/iommufd.h of the 7.x kernel's uapi.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <linux/iommufd.h>

int main(void)
{
	struct iommu_ioas_alloc alloc = { .size = sizeof(alloc) };
	struct iommu_iova_range ranges[8];
	struct iommu_ioas_iova_ranges q = { .size = sizeof(q) };
	struct iommu_destroy destroy = { .size = sizeof(destroy) };
	int fd = open("/dev/iommu", O_RDWR | O_CLOEXEC);

	if (fd < 0) {
		printf("/dev/iommu: %s\n", strerror(errno));
		return errno == ENOENT ? 2 : 1;
	}
	if (ioctl(fd, IOMMU_IOAS_ALLOC, &alloc)) {
		printf("IOMMU_IOAS_ALLOC: %s\n", strerror(errno));
		return 1;
	}
	printf("ioas=%u\n", alloc.out_ioas_id);
	q.ioas_id = alloc.out_ioas_id;
	q.num_iovas = sizeof(ranges) / sizeof(ranges[0]);
	q.allowed_iovas = (uintptr_t)ranges;
	if (ioctl(fd, IOMMU_IOAS_IOVA_RANGES, &q)) {
		printf("IOMMU_IOAS_IOVA_RANGES: %s\n", strerror(errno));
		return 1;
	}
	for (uint32_t i = 0; i < q.num_iovas && i < sizeof(ranges) / sizeof(ranges[0]); i++)
		printf("iova_range=0x%llx-0x%llx\n", (unsigned long long)ranges[i].start,
		       (unsigned long long)ranges[i].last);
	destroy.id = alloc.out_ioas_id;
	if (ioctl(fd, IOMMU_DESTROY, &destroy)) {
		printf("IOMMU_DESTROY: %s\n", strerror(errno));
		return 1;
	}
	close(fd);
	return 0;
}
