#!/usr/bin/env bash
# the device run of 2026-12-02 ~06:52 UTC, as it ran: from a folder one level below the repository root
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}
mkdir -p build-gpu "$O"
rm -f build-gpu/test_gpu build-gpu/test_gpu_choice
OUT=$O/test timeout 280 bash tests/gpu/run-h200.sh test > "$O/run-test.txt" 2>&1
tail -3 "$O/test/test_gpu.tap"; grep -E "^not ok|no context current" "$O/test/test_gpu.tap"
cat "$O/test/test_gpu_choice.tap"
