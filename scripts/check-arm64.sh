#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The queue-pair core's barriers on aarch64, read from the machine code clang emits for it
# (no aarch64 machine needed): the CQ head doorbell store of reap is preceded, in its basic
# block, by a dmb/dsb (the CQE loads, the callbacks' included, complete before the controller may
# reuse the entries), and the SQ tail doorbell store of ring by one too (SQE stores before the
# doorbell). Each rule has a negative control: the same check on a copy of the headers with that
# barrier removed must fail. The doorbell is made an external call through
# UPCIE_NVME_PORT_DOORBELL, so the store is easy to find. TAP output. Needs clang, llvm-objdump
# and the aarch64 libc headers (libc6-dev-arm64-cross); without them: SKIP.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=0
fail=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
notok() { n=$((n + 1)); fail=1; echo "not ok $n - $*"; }
skip() { n=$((n + 1)); echo "ok $n # SKIP $*"; }

objdump=
for o in llvm-objdump-15 llvm-objdump-14 llvm-objdump; do
	command -v "$o" >/dev/null 2>&1 && objdump=$o && break
done
cross=/usr/aarch64-linux-gnu/include
if ! command -v clang >/dev/null 2>&1 || [ -z "$objdump" ] || [ ! -f "$cross/stdlib.h" ]; then
	skip "aarch64 barrier check: needs clang, llvm-objdump and libc6-dev-arm64-cross"
	echo "1..$n"
	exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
res=$(clang -print-resource-dir)

cat >"$tmp/t.c" <<'EOF'
#include <stdint.h>
void tb_doorbell(volatile uint32_t *db, uint32_t v);
#define UPCIE_NVME_PORT_DOORBELL(db, v) tb_doorbell((db), (v))
#include <upcie/nvme/qpair.h>
__attribute__((noinline)) int tb_reap(struct upcie_nvme_qpair *qp, unsigned max)
{
	return upcie_nvme_qpair_reap(qp, max);
}
__attribute__((noinline)) int tb_ring(struct upcie_nvme_qpair *qp)
{
	return upcie_nvme_qpair_ring(qp);
}
EOF

# compile.sh INCLUDE_DIR OUT: object code of t.c for aarch64
compile() {
	clang --target=aarch64-linux-gnu -O2 -std=c11 -D_GNU_SOURCE -nostdinc -isystem "$res/include" \
		-isystem "$cross" -I"$1" -c "$tmp/t.c" -o "$2" 2>"$2.err"
}

# fenced OBJ FUNC: every call of tb_doorbell in FUNC has a dmb or dsb before it in its basic
# block (back to the last branch, or to the nearest branch target). Prints the call sites and
# exits 1 when one is not fenced or none exists.
fenced() {
	"$objdump" -dr --no-show-raw-insn "$1" | awk -v fn="<$2>:" '
		function hex(s, v, i, d) {
			sub(/^0x/, "", s)
			v = 0
			for (i = 1; i <= length(s); i++) {
				d = index("0123456789abcdef", substr(s, i, 1)) - 1
				v = v * 16 + d
			}
			return v
		}
		$0 ~ fn { infn = 1; next }
		# read to the end: exiting early could kill llvm-objdump with SIGPIPE (pipefail)
		infn && /^$/ { infn = 0; next }
		!infn { next }
		/R_AARCH64_CALL26/ { if ($NF == "tb_doorbell") call[ncalls++] = last; next }
		{
			a = $1; sub(":", "", a); addr = hex(a); last = addr
			op[addr] = $2
			if ($2 ~ /^(b|b\..*|cbz|cbnz|tbz|tbnz)$/) {
				branch[addr] = 1
				for (i = 3; i <= NF; i++)
					if ($i ~ /^0x[0-9a-f]+$/) target[hex($i)] = 1
			}
		}
		END {
			if (!ncalls) { print "no doorbell call found"; exit 1 }
			bad = 0
			for (c = 0; c < ncalls; c++) {
				good = 0
				for (p = call[c] - 4; p >= 0 && (p in op); p -= 4) {
					if (op[p] ~ /^(dmb|dsb)$/) { good = 1; break }
					if ((p in branch) || (p in target) || op[p] ~ /^(bl|blr)$/) break
				}
				printf "doorbell call at 0x%x: %s\n", call[c], good ? "fenced" : "NOT fenced"
				bad += !good
			}
			exit bad ? 1 : 0
		}'
}

if ! compile "$root/include" "$tmp/good.o"; then
	notok "aarch64 object code of the queue-pair core (clang)"
	sed 's/^/# /' "$tmp/good.o.err" | head -20
	echo "1..$n"
	exit 1
fi
out=$(fenced "$tmp/good.o" tb_reap)
if [ $? -eq 0 ]; then
	ok "aarch64: reap orders the CQE loads before the CQ head doorbell store ($(echo "$out" | tr '\n' ' '))"
else
	notok "aarch64: reap orders the CQE loads before the CQ head doorbell store"
	echo "$out" | sed 's/^/# /'
fi
out=$(fenced "$tmp/good.o" tb_ring)
if [ $? -eq 0 ]; then
	ok "aarch64: ring orders the SQE stores before the SQ tail doorbell store ($(echo "$out" | tr '\n' ' '))"
else
	notok "aarch64: ring orders the SQE stores before the SQ tail doorbell store"
	echo "$out" | sed 's/^/# /'
fi

# negative controls: each barrier removed from a copy of the headers
for rule in "reap tb_reap upcie_nvme_port_cq_release();" "ring tb_ring upcie_nvme_port_wmb();"; do
	set -- $rule
	name=$1 fn=$2 call=$3
	rm -rf "$tmp/neg"
	cp -r "$root/include" "$tmp/neg"
	q="$tmp/neg/upcie/nvme/qpair.h"
	before=$(grep -c "$call" "$q")
	sed -i "s/$call/\/* barrier removed *\//" "$q"
	if [ "$before" -lt 1 ] || ! compile "$tmp/neg" "$tmp/neg.o"; then
		notok "negative control ($name): the barrier call to remove was not found or the copy did not build"
		continue
	fi
	if fenced "$tmp/neg.o" "$fn" >/dev/null; then
		notok "negative control ($name): without $call the check still passes"
	else
		ok "negative control ($name): without $call the check fails"
	fi
done
echo "1..$n"
exit $fail
