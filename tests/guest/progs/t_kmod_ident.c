/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helper of the guest case kmod_ident (no TAP of its own; the case judges what it prints):
 *
 *   t_kmod_ident want MODULE   print the identity upcie's MODULE must show in
 *                              /sys/module/MODULE/parameters/abi, from the UAPI header
 *   t_kmod_ident open MODULE   open MODULE's device through upcie's wrapper, as a user would;
 *                              print "rc=<errno name or 0>" and the wrapper's last log message
 *   t_kmod_ident poke MODULE   send one request (upcie's INFO) straight to /dev/MODULE, past the
 *                              wrapper: the case's proof that a stand-in module logs requests
 *
 * MODULE is dmabuf_import or iommu_map_pa. Exit status 0 unless the arguments are wrong.
 */
#include <upcie/base/feature.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <upcie/kmod/dmabuf_import.h>
#include <upcie/kmod/iommu_map_pa.h>

static char last_msg[2048];

static void capture(enum upcie_log_level level, const char *msg, void *ctx)
{
	(void)ctx;
	if (level <= UPCIE_LOG_WARN)
		snprintf(last_msg, sizeof(last_msg), "%s", msg);
}

int main(int argc, char **argv)
{
	int dbi, err = 0, fd;

	if (argc != 3 || (strcmp(argv[2], "dmabuf_import") && strcmp(argv[2], "iommu_map_pa"))) {
		fprintf(stderr, "usage: t_kmod_ident want|open|poke dmabuf_import|iommu_map_pa\n");
		return 2;
	}
	dbi = !strcmp(argv[2], "dmabuf_import");
	upcie_log_set_handler(capture, NULL);
	if (!strcmp(argv[1], "want")) {
		if (dbi)
			printf("%s %d\n", UPCIE_DMABUF_IMPORT_IDENT, UPCIE_DMABUF_IMPORT_ABI);
		else
			printf("%s %d\n", UPCIE_IOMMU_MAP_PA_IDENT, UPCIE_IOMMU_MAP_PA_ABI);
		return 0;
	}
	if (!strcmp(argv[1], "open")) {
		if (dbi) {
			struct upcie_kmod_dmabuf_import ctx;

			err = upcie_kmod_dmabuf_import_open(&ctx);
			if (!err)
				upcie_kmod_dmabuf_import_close(&ctx);
		} else {
			struct upcie_kmod_iommu_map_pa ctx;

			err = upcie_kmod_iommu_map_pa_open(&ctx);
			if (!err)
				upcie_kmod_iommu_map_pa_close(&ctx);
		}
		printf("rc=%s\n%s\n", err ? upcie_errno_name(err) : "0", last_msg);
		return 0;
	}
	if (!strcmp(argv[1], "poke")) {
		struct upcie_dmabuf_import_info di;
		struct upcie_iommu_map_pa_info ii;

		fd = open(dbi ? UPCIE_DMABUF_IMPORT_DEVICE : UPCIE_IOMMU_MAP_PA_DEVICE, O_RDWR);
		if (fd < 0) {
			printf("rc=%s\n", upcie_errno_name(-errno));
			return 0;
		}
		if (dbi ? ioctl(fd, UPCIE_DMABUF_IMPORT_IOC_INFO, &di)
			: ioctl(fd, UPCIE_IOMMU_MAP_PA_IOC_INFO, &ii))
			err = -errno;
		close(fd);
		printf("rc=%s\n", err ? upcie_errno_name(err) : "0");
		return 0;
	}
	fprintf(stderr, "t_kmod_ident: unknown command %s\n", argv[1]);
	return 2;
}
