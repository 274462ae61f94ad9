/* SPDX-License-Identifier: BSD-3-Clause */
/* The whole pci/ layer: addresses, sysfs information, config space, drivers, BAR mapping, uio. */
#ifndef UPCIE_PCI_H
#define UPCIE_PCI_H

#include <upcie/base/feature.h>

#include <upcie/pci/bdf.h>
#include <upcie/pci/func.h>
#include <upcie/pci/config.h>
#include <upcie/pci/driver.h>
#include <upcie/pci/bar.h>
#include <upcie/pci/inuse.h>
#include <upcie/pci/sriov.h>
#include <upcie/pci/uio.h>

#endif /* UPCIE_PCI_H */
