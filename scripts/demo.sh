#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The main job on the built-in default device: boots a QEMU guest (Debian's 6.1 kernel, TCG) with
# two emulated NVMe controllers and runs upcie in it (tests/guest/cases/demo.sh): upcie-setup
# lists and binds the functions, a short benchmark compares the kernel driver with upcie's on one
# controller, examples/nvme_driver takes each controller from the kernel and verifies I/O.
# Installs what it needs from Debian's archive; the first run downloads a kernel into a cache.
#
#   scripts/demo.sh [--config A|B|C]    A: no IOMMU (uio), B: intel-iommu (vfio), C: 7.x + iommufd
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cfg=A
while [ $# -gt 0 ]; do
	case $1 in
	--config)
		cfg=${2:?--config needs A, B or C}
		shift 2
		;;
	-h | --help)
		sed -n '3,9p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "demo.sh: unknown argument $1" >&2
		exit 2
		;;
	esac
done
[ "${UPCIE_NO_APT:-0}" = 1 ] || "$root/scripts/deps.sh"
tb=$root/tests/guest/testbed.sh
"$tb" fetch
[ "$cfg" = C ] && "$tb" build-oot
exec "$tb" run --config "$cfg" --case demo --show
