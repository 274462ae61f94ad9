/* SPDX-License-Identifier: BSD-3-Clause */
/* A consumer of upcie's headers: parses and formats a PCI address, sizes a PRP list. */
#include <stdio.h>
#include <string.h>
#include <upcie/nvme/spec.h>
#include <upcie/pci/bdf.h>

int main(void)
{
	struct upcie_pci_bdf bdf;
	char buf[UPCIE_PCI_BDF_STRLEN];

	if (upcie_pci_bdf_parse("3:00.1", &bdf))
		return 1;
	upcie_pci_bdf_format(&bdf, buf, sizeof(buf));
	printf("%s sqe %zu cqe %zu\n", buf, sizeof(struct upcie_nvme_sqe),
	       sizeof(struct upcie_nvme_cqe));
	return strcmp(buf, "0000:03:00.1") ? 1 : 0;
}
