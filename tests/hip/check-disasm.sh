#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Disassembly check of the HIP device code: compiles tests/hip/kernels.hip for gfx1101 (RDNA3,
# GFX11), gfx1030 (RDNA2, GFX10), gfx90a (CDNA2, GFX9), gfx940 (CDNA3, GFX9) and, where the
# compiler has one, the generic gfx11-generic target, disassembles each code object with
# llvm-objdump and checks the instructions the queue code depends on (base/arch_hip.h), not the
# #if that is meant to select them:
#   RDNA  the doorbell store is the drain / glc slc dlc store / drain / buffer_gl1_inv /
#         buffer_gl0_inv sequence, also inside the whole submit-and-wait path (SQ tail and CQ
#         head); the completion poll load comes after buffer_gl1_inv + buffer_gl0_inv; the clock
#         is the realtime counter (s_sendmsg_rtn_b64 MSG_RTN_GET_REALTIME on GFX11, s_memrealtime
#         on GFX10)
#   CDNA  no buffer_gl0_inv/buffer_gl1_inv and no glc slc dlc store anywhere; a system fence
#         (buffer_wbl2) before the doorbell store; s_memrealtime
#   poll  every completion poll load carries the target's cache-policy bits (GFX10/GFX11
#         glc slc dlc, gfx940 sc0 sc1 nt, gfx90a glc slc); reap runs a system-scope acquire
#         (the compiler's fence sequence) after the load that saw the phase tag, before the
#         rest of the entry is loaded and the callback runs; and a kernel that waits for a
#         completion and then reads the data with a plain load, as a user's would, has the
#         caches that load goes through invalidated in between, on every target
#   all   never clock64(): no s_memtime, no HW_REG_SHADER_CYCLES; no call out of the object
#         (everything builds with -nogpulib, no device library)
#   mirror the completion mirror's kernel (gpuq/cqmirror_hip.h): every load is a poll load
#         with the target's bits; an acquire between each entry's tag poll and its 16-byte
#         load; each entry's 16-byte store reaches the host before its tag (RDNA: both stores
#         glc slc dlc, the tag's after the drain; CDNA: buffer_wbl2 between them)
#   wait  the core's timed wait (upcie_nvme_qpair_wait) in device code reads the realtime
#         counter and loads its rate from the queue pair (clock_khz), on every target
#   data  the reader helpers of gpuq/gqp_hip.h: a reader that polls a flag and calls
#         upcie_nvme_gqp_hip_data_acquire(), and one that waits with _signal_wait(), have the
#         system-scope acquire (RDNA buffer_gl0_inv, buffer_gl1_inv; gfx90a buffer_invl2,
#         buffer_wbinvl1_vol; gfx940 buffer_inv sc0 sc1) between the flag's poll load and the
#         plain vector load of the data; signal_wait's deadline is the realtime counter;
#         _data_release() puts the system-scope release (gfx90a buffer_wbl2, gfx940 buffer_wbl2
#         sc0 sc1, then s_waitcnt vmcnt(0); RDNA s_waitcnt vmcnt(0) and s_waitcnt_vscnt) between
#         the payload store and the flag store, and _signal() does too (RDNA: the flag stored
#         with the doorbell sequence); a reader that polls its flag with a plain volatile load
#         (no memory clobber), calls _data_acquire() and then reads the data with a plain load,
#         nothing stored before it, gets a vector load after the acquire, not a scalar s_load
#         (the clobber at the end of _data_acquire() is what keeps it so)
# Then it proves it can fail: the gfx1101 object built with the gate off
# (-DUPCIE_GPU_HIP_TEST_GATE_OFF, what gating on a specific __gfxNNNN__ macro does on a generic
# target) must fail the RDNA rules; the gfx1101 object must fail the CDNA rules (instructions
# present where they must not be); the bits rule, the reap-acquire rule and the mirror's
# acquire and tag-store rules each fail on gfx1101, gfx90a and gfx940 built with that rule
# removed (UPCIE_GPU_HIP_TEST_*, UPCIE_NVME_CQMIRROR_HIP_TEST_*), and the consumer rule fails on a
# consumer that polls by hand; the data rules fail with the helpers' fences removed
# (UPCIE_NVME_GQP_HIP_TEST_NO_DATA_ACQUIRE, _NO_DATA_RELEASE), on a reader whose data sits behind
# a const __restrict__ parameter (a scalar load, s_load, which no acquire orders) on every
# target, and on a reader with an agent-scope acquire on gfx90a and gfx940 (RDNA compiles both
# scopes alike); the volatile-poll reader's rule fails on all four targets built without
# _data_acquire()'s memory clobber (UPCIE_NVME_GQP_HIP_TEST_NO_ACQUIRE_CLOBBER: an s_load, while
# the readers that poll with the library's loads still pass) and without _data_acquire();
# without __GFX11__ the family is still derived (from __gfx1101__), and without either the build
# must stop with an error; GFX12 (__GFX12__) must stop the build with the error that says why it
# is not supported.
# TAP output; one SKIP line when hipcc or llvm-objdump is missing.
set -uo pipefail
cd "$(dirname "$0")/../.."
hipcc=${HIPCC:-$(command -v hipcc || true)}
[ -z "$hipcc" ] && [ -x /opt/rocm/bin/hipcc ] && hipcc=/opt/rocm/bin/hipcc
objdump=${LLVM_OBJDUMP:-}
if [ -z "$objdump" ]; then
	for c in /opt/rocm/llvm/bin/llvm-objdump llvm-objdump-15 /usr/lib/llvm-15/bin/llvm-objdump \
		llvm-objdump; do
		if command -v "$c" >/dev/null 2>&1; then
			objdump=$(command -v "$c")
			break
		fi
	done
fi
if [ -z "$hipcc" ] || [ -z "$objdump" ]; then
	echo "ok 1 # SKIP hipcc or llvm-objdump not found (apt-get install hipcc)"
	echo "1..1"
	exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src=tests/hip/kernels.hip
n=0
fail=0
ok() {
	n=$((n + 1))
	echo "ok $n - $1"
}
notok() {
	n=$((n + 1))
	fail=$((fail + 1))
	echo "not ok $n - $1"
	shift
	for l in "$@"; do echo "# $l"; done
}
skip() {
	n=$((n + 1))
	echo "ok $n - $1 # SKIP $2"
}

# build ARCH OUT [flags...]: device-only code object, linked, no device library
build() {
	local arch=$1 out=$2
	shift 2
	"$hipcc" -std=c++17 --offload-arch="$arch" -nogpulib --cuda-device-only --no-gpu-bundle-output \
		-O2 -Wall -Wextra -Werror -Iinclude "$@" -c "$src" -o "$out" >"$out.log" 2>&1
}

# disasm OBJ: normalised instructions, "## name" before each function
disasm() {
	"$objdump" -d "$1" | awk '
		/^[0-9a-f]+ <[^>]+>:/ { sub(/^[0-9a-f]+ </, ""); sub(/>:.*/, ""); print "## " $0; next }
		/^\t/ { sub(/\/\/.*/, ""); gsub(/[ \t]+/, " "); sub(/^ /, ""); sub(/ $/, "");
			if ($0 != "" && $0 != "s_code_end") print }'
}

# fn DIS NAME: the instructions of one function
fn() {
	awk -v f="$2" '/^## / { on = ($2 == f); next } on' "$1"
}

# seqcount FILE: how many times the RDNA doorbell sequence occurs, exactly, in order
seqcount() {
	awk '
		{ l[NR] = $0 }
		END {
			c = 0
			for (i = 3; i <= NR - 4; i++) {
				if (l[i] !~ /^global_store_(dword|b32) .* glc slc dlc$/) continue
				if (l[i-2] != "s_waitcnt vmcnt(0) lgkmcnt(0)") continue
				if (l[i-1] != "s_waitcnt_vscnt null, 0x0") continue
				if (l[i+1] != "s_waitcnt vmcnt(0) lgkmcnt(0)") continue
				if (l[i+2] != "s_waitcnt_vscnt null, 0x0") continue
				if (l[i+3] != "buffer_gl1_inv" || l[i+4] != "buffer_gl0_inv") continue
				c++
			}
			print c
		}' "$1"
}

# invload FILE: vector loads whose closest preceding vector memory instruction is the pair
# buffer_gl1_inv, buffer_gl0_inv (scalar and ALU instructions may be scheduled in between)
invload() {
	awk '
		/^buffer_gl0_inv$/ && prev == "buffer_gl1_inv" { armed = 1 }
		/^(global|flat)_load_/ { if (armed) c++; armed = 0 }
		/^(global|flat|buffer)_(store|atomic)/ { armed = 0 }
		{ prev = $0 }
		END { print c + 0 }' "$1"
}

# rules_rdna DIS GFX: one line per rule, "ok DESC" or "bad DESC | detail"
rules_rdna() {
	local d=$1 gfx=$2 t="$tmp/r.$$"
	fn "$d" upcie_hipchk_doorbell >"$t.db"
	fn "$d" upcie_hipchk_poll >"$t.poll"
	fn "$d" upcie_hipchk_clock >"$t.clk"
	fn "$d" upcie_hipchk_io >"$t.io"
	local c
	c=$(seqcount "$t.db")
	if [ "$c" = 1 ]; then echo "ok doorbell store is the RDNA sequence"; else
		echo "bad doorbell store is the RDNA sequence | found $c times in upcie_hipchk_doorbell"; fi
	c=$(seqcount "$t.io")
	if [ "$c" -ge 2 ]; then echo "ok submit-and-wait path: RDNA sequence for SQ tail and CQ head ($c)"; else
		echo "bad submit-and-wait path: RDNA sequence for SQ tail and CQ head | found $c"; fi
	c=$(invload "$t.poll")
	if [ "$c" -ge 1 ]; then echo "ok completion poll load after buffer_gl1_inv + buffer_gl0_inv"; else
		echo "bad completion poll load after buffer_gl1_inv + buffer_gl0_inv | $(grep -c . "$t.poll") instructions, none"; fi
	c=$(invload "$t.io")
	if [ "$c" -ge 1 ]; then echo "ok submit-and-wait path: invalidate before completion loads ($c)"; else
		echo "bad submit-and-wait path: invalidate before completion loads | none"; fi
	if [ "$gfx" = 11 ]; then
		if grep -q '^s_sendmsg_rtn_b64 .*MSG_RTN_GET_REALTIME' "$t.clk" && grep -q '^s_sendmsg_rtn_b64 .*MSG_RTN_GET_REALTIME' "$t.io"; then
			echo "ok clock is the realtime counter (s_sendmsg_rtn_b64 MSG_RTN_GET_REALTIME)"
		else
			echo "bad clock is the realtime counter (s_sendmsg_rtn_b64 MSG_RTN_GET_REALTIME) | $(tr '\n' ';' <"$t.clk")"
		fi
	else
		if grep -q '^s_memrealtime' "$t.clk" && grep -q '^s_memrealtime' "$t.io"; then
			echo "ok clock is the realtime counter (s_memrealtime)"
		else
			echo "bad clock is the realtime counter (s_memrealtime) | $(tr '\n' ';' <"$t.clk")"
		fi
	fi
	rules_common "$d"
}

# pollbits ARCH: the cache-policy bits every completion poll load must carry on ARCH
pollbits() {
	case $1 in
	gfx10* | gfx11*) echo "glc slc dlc" ;;
	gfx94*) echo "sc0 sc1 nt" ;;
	*) echo "glc slc" ;;
	esac
}

# acqfence ARCH: awk condition true on the last line of the acquire fence's sequence (the
# compiler's: on RDNA buffer_gl0_inv then buffer_gl1_inv, the reverse of the poll's own order)
acqfence() {
	case $1 in
	gfx1*) echo 'prev == "buffer_gl0_inv" && $0 == "buffer_gl1_inv"' ;;
	gfx94*) echo '/^buffer_inv( |$)/ && / sc0( |$)/ && / sc1( |$)/' ;;
	*) echo 'prev == "buffer_invl2" && $0 == "buffer_wbinvl1_vol"' ;;
	esac
}

# restacq ARCH FILE: acquire fences between the first two poll loads in linear order (the phase
# tag, then the rest of the entry that reap hands to the callback); -1 without two poll loads
restacq() {
	awk -v bits="$(pollbits "$1")" '
		function hasbits(line,   n, w, i) {
			n = split(bits, w, " ")
			for (i = 1; i <= n; i++) if (line !~ (" " w[i] "( |$)")) return 0
			return 1
		}
		/^(global|flat)_load_/ && hasbits($0) { if (seen) { two = 1; exit } seen = 1 }
		seen && '"$(acqfence "$1")"' { c++ }
		{ prev = $0 }
		END { print two ? c + 0 : -1 }' "$2"
}

# datainv ARCH FILE: whether the caches a plain load goes through are invalidated after the
# first poll load and before the data load (offset:84, data[21]): reap's acquire or the CQ
# head doorbell's sequence both do it; "-1" when the poll or the data load is missing
datainv() {
	awk -v arch="$1" -v bits="$(pollbits "$1")" '
		function hasbits(line,   n, w, i) {
			n = split(bits, w, " ")
			for (i = 1; i <= n; i++) if (line !~ (" " w[i] "( |$)")) return 0
			return 1
		}
		/^(global|flat)_load_/ && hasbits($0) && !seen { seen = 1; next }
		seen && /^(global|flat)_load_(dword|b32) .*offset:84( |$)/ { data = 1; exit }
		seen && arch ~ /^gfx1/ { if ($0 == "buffer_gl0_inv") a = 1; if ($0 == "buffer_gl1_inv") b = 1 }
		seen && arch == "gfx90a" { if ($0 == "buffer_invl2") a = 1; if ($0 == "buffer_wbinvl1_vol") b = 1 }
		seen && arch ~ /^gfx94/ && /^buffer_inv( |$)/ { a = b = 1 }
		END { print (seen && data) ? ((a && b) ? 1 : 0) : -1 }' "$2"
}

# rules_poll DIS ARCH: the poll load's cache-policy bits, reap's acquire before the rest of an
# entry, and the invalidation between a completion and the caller's plain load of the data
rules_poll() {
	local d=$1 arch=$2 t="$tmp/p.$$" bits nl nb c
	bits=$(pollbits "$arch")
	fn "$d" upcie_hipchk_poll >"$t.poll"
	fn "$d" upcie_hipchk_io >"$t.io"
	fn "$d" upcie_hipchk_consume >"$t.con"
	nl=$(grep -Ec '^(global|flat)_load_' "$t.poll")
	nb=$(awk -v bits="$bits" '/^(global|flat)_load_/ { n = split(bits, w, " "); ok = 1
		for (i = 1; i <= n; i++) if ($0 !~ (" " w[i] "( |$)")) ok = 0; c += ok } END { print c + 0 }' "$t.poll")
	if [ "$nl" -ge 1 ] && [ "$nl" = "$nb" ]; then echo "ok completion poll load carries $bits"; else
		echo "bad completion poll load carries $bits | $nb of $nl loads: $(grep -E '^(global|flat)_load_' "$t.poll" | tr '\n' ';')"; fi
	c=$(restacq "$arch" "$t.io")
	if [ "$c" -ge 1 ]; then
		echo "ok reap: system-scope acquire after the phase tag, before the rest of the entry and the callback"
	else
		echo "bad reap: system-scope acquire after the phase tag, before the rest of the entry and the callback | found $c"
	fi
	c=$(datainv "$arch" "$t.con")
	if [ "$c" = 1 ]; then
		echo "ok consumer: caches invalidated between the completion and the plain data load"
	else
		echo "bad consumer: caches invalidated between the completion and the plain data load | $c"
	fi
}

# fnlike DIS SUBSTRING: the instructions of the function whose (mangled) name contains it
fnlike() {
	awk -v f="$2" '/^## / { on = index($0, f) > 0; next } on' "$1"
}

# rules_mirror DIS ARCH: the completion mirror's kernel
rules_mirror() {
	local d=$1 arch=$2 t="$tmp/m.$$" bits nl nb c
	bits=$(pollbits "$arch")
	fnlike "$d" upcie_nvme_cqmirror_hip_kernel >"$t.mk"
	nl=$(grep -Ec '^(global|flat)_load_' "$t.mk")
	nb=$(awk -v bits="$bits" '/^(global|flat)_load_/ { n = split(bits, w, " "); ok = 1
		for (i = 1; i <= n; i++) if ($0 !~ (" " w[i] "( |$)")) ok = 0; c += ok } END { print c + 0 }' "$t.mk")
	if [ "$nl" -ge 4 ] && [ "$nl" = "$nb" ]; then echo "ok mirror: every load is a poll load with $bits ($nl)"; else
		echo "bad mirror: every load is a poll load with $bits | $nb of $nl"; fi
	# every 16-byte entry load has an acquire since the 32-bit (tag) load before it
	c=$(awk '
		/^(global|flat)_load_(dword|b32) / { armed = 0 }
		'"$(acqfence "$arch")"' { armed = 1 }
		/^(global|flat)_load_(dwordx4|b128) / { n++; if (armed) a++ }
		{ prev = $0 }
		END { print (n ? a " of " n : "none") }' "$t.mk")
	if [ "${c%% of *}" != none ] && [ "${c%% of *}" = "${c##* of }" ]; then
		echo "ok mirror: acquire between the tag poll and the entry load ($c)"
	else
		echo "bad mirror: acquire between the tag poll and the entry load | $c"
	fi
	# every 16-byte entry store is followed by its tag as a release store
	case $arch in
	gfx1*) c=$(awk '
		/^(global|flat)_store_(dwordx4|b128) / { n++; open = 1; ent = ($0 ~ / glc slc dlc$/); p1 = p2 = ""; next }
		open && /^(global|flat)_store_(dword|b32) / {
			if (ent && $0 ~ / glc slc dlc$/ && p2 == "s_waitcnt vmcnt(0) lgkmcnt(0)" && p1 == "s_waitcnt_vscnt null, 0x0") a++
			open = 0 }
		{ p2 = p1; p1 = $0 }
		END { print (n ? a " of " n : "none") }' "$t.mk") ;;
	*) c=$(awk '
		/^(global|flat)_store_(dwordx4|b128) / { n++; open = 1; fen = 0; next }
		open && /^buffer_wbl2/ { fen = 1 }
		open && /^(global|flat)_store_(dword|b32) / { if (fen) a++; open = 0 }
		END { print (n ? a " of " n : "none") }' "$t.mk") ;;
	esac
	if [ "${c%% of *}" != none ] && [ "${c%% of *}" = "${c##* of }" ]; then
		echo "ok mirror: the entry reaches the host before its tag (release store; $c)"
	else
		echo "bad mirror: the entry reaches the host before its tag (release store) | $c"
	fi
}

# rules_wait DIS: the core's timed wait in device code reads the realtime counter and takes its
# rate from the queue pair (a 32-bit load of clock_khz), never a constant
rules_wait() {
	local d=$1 t="$tmp/w.$$"
	fn "$d" upcie_hipchk_qpwait >"$t.qw"
	if grep -Eq '^(s_memrealtime|s_sendmsg_rtn_b64 .*MSG_RTN_GET_REALTIME)' "$t.qw"; then
		echo "ok core wait (upcie_nvme_qpair_wait): deadline on the realtime counter"
	else
		echo "bad core wait (upcie_nvme_qpair_wait): deadline on the realtime counter | none in $(grep -c . "$t.qw") instructions"
	fi
	if grep -Eq "^(global|flat)_load_(dword|b32) .*offset:$khz_off( |\$)" "$t.qw"; then
		echo "ok core wait: the rate is loaded from the queue pair (clock_khz, offset $khz_off)"
	else
		echo "bad core wait: the rate is loaded from the queue pair (clock_khz, offset $khz_off) | no such load"
	fi
}

# dataacq ARCH FILE: system-scope acquire fences between the first poll load (the flag) and the
# plain vector load of the data (offset:84, data[21]); -1 when the poll or that load is missing
# (a data load the compiler made scalar, s_load, is missing)
dataacq() {
	awk -v bits="$(pollbits "$1")" '
		function hasbits(line,   n, w, i) {
			n = split(bits, w, " ")
			for (i = 1; i <= n; i++) if (line !~ (" " w[i] "( |$)")) return 0
			return 1
		}
		/^(global|flat)_load_/ && hasbits($0) && !seen { seen = 1; prev = $0; next }
		seen && /^(global|flat)_load_(dword|b32) .*offset:84( |$)/ { data = 1; exit }
		seen && '"$(acqfence "$1")"' { c++ }
		{ prev = $0 }
		END { print (seen && data) ? c + 0 : -1 }' "$2"
}

# volacq ARCH FILE: for a reader whose flag poll is a plain volatile load (no poll bits, no
# memory clobber): "s_load" when the data (data[21], 0x54) is read with a scalar load anywhere in
# the function; -1 when there is no vector load of the flag or no vector load of the data
# (offset:84) after it; else the system-scope acquire fences between the two
volacq() {
	awk '
		/^s_load_(dword|b32) .*, 0x54$/ { sc = 1 }
		/^(global|flat)_load_/ && !seen { seen = 1; prev = $0; next }
		seen && !data && /^(global|flat)_load_(dword|b32) .*offset:84( |$)/ { data = 1 }
		seen && !data && '"$(acqfence "$1")"' { c++ }
		{ prev = $0 }
		END { if (sc) print "s_load"; else print (seen && data) ? c + 0 : -1 }' "$2"
}

# datarel ARCH FILE: 1 when the system-scope release separates the payload store (offset:84)
# from the next store (the flag): gfx90a buffer_wbl2, gfx940 buffer_wbl2 sc0 sc1, each then
# s_waitcnt vmcnt(0); RDNA s_waitcnt vmcnt(0) and s_waitcnt_vscnt null, 0x0; 0 when not; -1
# without the two stores
datarel() {
	awk -v arch="$1" '
		/^(global|flat)_store_(dword|b32) .*offset:84( |$)/ && !seen { seen = 1; next }
		seen && /^(global|flat)_store_/ { flag = 1; exit }
		seen && arch == "gfx90a" && $0 == "buffer_wbl2" { wb = 1 }
		seen && arch ~ /^gfx94/ && /^buffer_wbl2 / && / sc0( |$)/ && / sc1( |$)/ { wb = 1 }
		seen && arch ~ /^gfx1/ { wb = 1 }
		seen && wb && /^s_waitcnt .*vmcnt\(0\)/ { w = 1 }
		seen && $0 == "s_waitcnt_vscnt null, 0x0" { vs = 1 }
		END { if (!(seen && flag)) print -1; else print (w && (arch !~ /^gfx1/ || vs)) ? 1 : 0 }' "$2"
}

# rules_data DIS ARCH: the reader and producer helpers (upcie_hipchk_reader, _sigwait,
# _producer, _signal)
rules_data() {
	local d=$1 arch=$2 t="$tmp/d.$$" c
	fn "$d" upcie_hipchk_reader >"$t.rd"
	fn "$d" upcie_hipchk_reader_volatile >"$t.rv"
	fn "$d" upcie_hipchk_sigwait >"$t.sw"
	fn "$d" upcie_hipchk_producer >"$t.pr"
	fn "$d" upcie_hipchk_signal >"$t.sg"
	c=$(dataacq "$arch" "$t.rd")
	if [ "$c" -ge 1 ]; then
		echo "ok reader: data_acquire (system scope) between its flag poll and the plain data load"
	else
		echo "bad reader: data_acquire (system scope) between its flag poll and the plain data load | $c"
	fi
	c=$(volacq "$arch" "$t.rv")
	if [ "$c" != s_load ] && [ "$c" -ge 1 ]; then
		echo "ok volatile-poll reader: data_acquire, then the plain data load is a vector load (not s_load)"
	else
		echo "bad volatile-poll reader: data_acquire, then the plain data load is a vector load (not s_load) | $c"
	fi
	c=$(dataacq "$arch" "$t.sw")
	if [ "$c" -ge 1 ]; then
		echo "ok signal_wait: acquire (system scope) between the flag poll and the plain data load"
	else
		echo "bad signal_wait: acquire (system scope) between the flag poll and the plain data load | $c"
	fi
	if grep -Eq '^(s_memrealtime|s_sendmsg_rtn_b64 .*MSG_RTN_GET_REALTIME)' "$t.sw"; then
		echo "ok signal_wait: deadline on the realtime counter"
	else
		echo "bad signal_wait: deadline on the realtime counter | none"
	fi
	c=$(datarel "$arch" "$t.pr")
	if [ "$c" = 1 ]; then
		echo "ok data_release: system-scope release between the payload store and the flag store"
	else
		echo "bad data_release: system-scope release between the payload store and the flag store | $c"
	fi
	c=$(datarel "$arch" "$t.sg")
	case $arch in gfx1*) [ "$(seqcount "$t.sg")" = 1 ] || c="$c, no doorbell sequence" ;; esac
	if [ "$c" = 1 ]; then
		echo "ok signal: the payload store released before the flag store"
	else
		echo "bad signal: the payload store released before the flag store | $c"
	fi
}

rules_cdna() {
	local d=$1 t="$tmp/c.$$" c
	fn "$d" upcie_hipchk_doorbell >"$t.db"
	fn "$d" upcie_hipchk_poll >"$t.poll"
	fn "$d" upcie_hipchk_clock >"$t.clk"
	fn "$d" upcie_hipchk_io >"$t.io"
	c=$(grep -Ec '^buffer_gl[01]_inv|glc slc dlc' "$d")
	if [ "$c" = 0 ]; then echo "ok no RDNA invalidates or glc slc dlc stores"; else
		echo "bad no RDNA invalidates or glc slc dlc stores | $c present"; fi
	if awk '/^buffer_wbl2/ { f = 1 } f && /^(global|flat)_store_dword / { s = 1 } END { exit !s }' "$t.db"; then
		echo "ok doorbell store after a system fence (buffer_wbl2)"
	else
		echo "bad doorbell store after a system fence (buffer_wbl2) | $(tr '\n' ';' <"$t.db")"
	fi
	if grep -q '^buffer_wbl2' "$t.io"; then echo "ok submit-and-wait path: system fences"; else
		echo "bad submit-and-wait path: system fences | no buffer_wbl2"; fi
	if grep -q '^s_memrealtime' "$t.clk" && grep -q '^s_memrealtime' "$t.io"; then
		echo "ok clock is the realtime counter (s_memrealtime)"
	else
		echo "bad clock is the realtime counter (s_memrealtime) | $(tr '\n' ';' <"$t.clk")"
	fi
	rules_common "$d"
}

rules_common() {
	local d=$1 c
	c=$(grep -Ec '^s_memtime|SHADER_CYCLES' "$d")
	if [ "$c" = 0 ]; then echo "ok never clock64() (no s_memtime, no SHADER_CYCLES)"; else
		echo "bad never clock64() (no s_memtime, no SHADER_CYCLES) | $c found"; fi
}

# report LABEL RULESOUTPUT: one TAP line per rule
report() {
	local label=$1 line
	while IFS= read -r line; do
		case $line in
		ok\ *) ok "$label: ${line#ok }" ;;
		bad\ *)
			local rest=${line#bad }
			notok "$label: ${rest%% | *}" "${rest#* | }"
			;;
		esac
	done <<<"$2"
}

echo "# $("$hipcc" --version 2>/dev/null | grep -m1 -i 'clang version'), objdump $objdump"
printf '#include <upcie/base/feature.h>\n#include <stddef.h>\n#include <stdio.h>\n#include <upcie/nvme/qpair.h>\nint main(void) { printf("%%zu\\n", offsetof(struct upcie_nvme_qpair, clock_khz)); return 0; }\n' >"$tmp/khzoff.c"
khz_off=$(gcc -std=c11 -Iinclude "$tmp/khzoff.c" -o "$tmp/khzoff" && "$tmp/khzoff")
for t in "gfx1101 11 rdna" "gfx1030 10 rdna" "gfx90a 9 cdna" "gfx940 9 cdna"; do
	set -- $t
	arch=$1 gfx=$2 kind=$3
	if build "$arch" "$tmp/$arch.co"; then
		ok "$arch: device code compiles and links without a device library"
	else
		notok "$arch: device code compiles and links without a device library" "$(head -20 "$tmp/$arch.co.log")"
		continue
	fi
	disasm "$tmp/$arch.co" >"$tmp/$arch.s"
	if [ "$kind" = rdna ]; then
		report "$arch" "$(rules_rdna "$tmp/$arch.s" "$gfx")"
	else
		report "$arch" "$(rules_cdna "$tmp/$arch.s")"
	fi
	report "$arch" "$(rules_poll "$tmp/$arch.s" "$arch")"
	report "$arch" "$(rules_mirror "$tmp/$arch.s" "$arch")"
	report "$arch" "$(rules_wait "$tmp/$arch.s")"
	report "$arch" "$(rules_data "$tmp/$arch.s" "$arch")"
	# The data rules can fail: a reader behind a const __restrict__ parameter (a scalar load)
	fn "$tmp/$arch.s" upcie_hipchk_sigwait_restrict >"$tmp/rst.s"
	c=$(dataacq "$arch" "$tmp/rst.s")
	if [ "$c" = -1 ] && grep -Eq '^s_load_(dword|b32) .*0x54$' "$tmp/rst.s"; then
		ok "self-test: $arch: a reader with its data behind const __restrict__ (s_load, 0x54) fails the data rule"
	else
		notok "self-test: $arch: a reader with its data behind const __restrict__ fails the data rule" "dataacq said $c; $(grep -c '^s_load' "$tmp/rst.s") scalar loads"
	fi
	if [ "$kind" = cdna ]; then
		fn "$tmp/$arch.s" upcie_hipchk_reader_agent >"$tmp/agt.s"
		c=$(dataacq "$arch" "$tmp/agt.s")
		if [ "$c" = 0 ]; then
			ok "self-test: $arch: a reader with an agent-scope acquire fails the data rule"
		else
			notok "self-test: $arch: a reader with an agent-scope acquire fails the data rule" "dataacq said $c"
		fi
	fi
done

# A negative-control build of the kernels for ARCH with test macro MACRO, disassembled into
# $tmp/ctl.s; a build that fails is reported (not ok) and answers 1.
ctl_disasm() { # ARCH MACRO
	if ! build "$1" "$tmp/ctl.co" "-D$2"; then
		notok "self-test: $1 builds with $2" "$(head -10 "$tmp/ctl.co.log")"
		return 1
	fi
	disasm "$tmp/ctl.co" >"$tmp/ctl.s"
}

# The poll and mirror rules can fail: built without the bits (UPCIE_GPU_HIP_TEST_POLL_PLAIN),
# without reap's acquire (UPCIE_GPU_HIP_TEST_NO_ACQUIRE), without the mirror's acquire or with
# its tag stored plainly, every target must fail that rule (rules keyed on the poll load fail
# with it); a consumer with no reap must fail the consumer rule.

for arch in gfx1101 gfx90a gfx940; do
	[ -f "$tmp/$arch.s" ] || continue
	fn "$tmp/$arch.s" upcie_hipchk_consume_bare >"$tmp/bare.s"
	c=$(datainv "$arch" "$tmp/bare.s")
	if [ "$c" = 0 ]; then
		ok "self-test: $arch: a consumer polling by hand (no reap, no acquire) fails the consumer rule"
	else
		notok "self-test: $arch: a consumer polling by hand fails the consumer rule" "datainv said $c"
	fi
	for ctl in GPU_HIP_TEST_POLL_PLAIN:"completion poll load carries" \
		GPU_HIP_TEST_NO_ACQUIRE:"reap: system-scope acquire" \
		NVME_CQMIRROR_HIP_TEST_NO_ACQUIRE:"mirror: acquire between" \
		NVME_CQMIRROR_HIP_TEST_PLAIN_TAG:"mirror: the entry reaches the host before its tag" \
		NVME_GQP_HIP_TEST_NO_DATA_ACQUIRE:"reader: data_acquire" \
		NVME_GQP_HIP_TEST_NO_DATA_ACQUIRE:"signal_wait: acquire" \
		NVME_GQP_HIP_TEST_NO_DATA_RELEASE:"data_release: system-scope release"; do
		m=UPCIE_${ctl%%:*} rule=${ctl#*:}
		ctl_disasm "$arch" "$m" || continue
		out=$(rules_poll "$tmp/ctl.s" "$arch"; rules_mirror "$tmp/ctl.s" "$arch"; rules_data "$tmp/ctl.s" "$arch")
		if grep -q "^bad $rule" <<<"$out"; then
			ok "self-test: $arch built with $m fails '$rule' ($(grep -c '^bad' <<<"$out") rules fail)"
		else
			notok "self-test: $arch built with $m fails '$rule'" "$out"
		fi
	done
done

# The volatile-poll reader's rule can fail, on every target: built without data_acquire()'s
# memory clobber (UPCIE_NVME_GQP_HIP_TEST_NO_ACQUIRE_CLOBBER, the fence kept) its data load is a
# scalar load, while the readers whose poll is the library's (inline assembly that clobbers
# memory: upcie_hipchk_reader, _sigwait) keep passing; built without data_acquire() at all
# (UPCIE_NVME_GQP_HIP_TEST_NO_DATA_ACQUIRE) it fails too.
for arch in gfx1101 gfx1030 gfx90a gfx940; do
	[ -f "$tmp/$arch.s" ] || continue
	for m in UPCIE_NVME_GQP_HIP_TEST_NO_ACQUIRE_CLOBBER UPCIE_NVME_GQP_HIP_TEST_NO_DATA_ACQUIRE; do
		rule="volatile-poll reader: data_acquire, then the plain data load is a vector load"
		ctl_disasm "$arch" "$m" || continue
		out=$(rules_data "$tmp/ctl.s" "$arch")
		if [ "$m" = UPCIE_NVME_GQP_HIP_TEST_NO_ACQUIRE_CLOBBER ]; then
			if grep -q "^bad $rule.* | s_load\$" <<<"$out" &&
				grep -q '^ok reader: data_acquire' <<<"$out" &&
				grep -q '^ok signal_wait: acquire' <<<"$out"; then
				ok "self-test: $arch built with $m fails '$rule' (s_load); the readers polling with the library's loads still pass"
			else
				notok "self-test: $arch built with $m fails '$rule' (s_load), the library-poll readers pass" "$out"
			fi
		elif grep -q "^bad $rule" <<<"$out"; then
			ok "self-test: $arch built with $m fails '$rule' ($(grep "^bad $rule" <<<"$out" | sed 's/.* | //'))"
		else
			notok "self-test: $arch built with $m fails '$rule'" "$out"
		fi
	done
done

# generic target: clang 19 and newer only
if build gfx11-generic "$tmp/gen.co"; then
	disasm "$tmp/gen.co" >"$tmp/gen.s"
	report "gfx11-generic" "$(rules_rdna "$tmp/gen.s" 11)"
elif grep -q "invalid target ID 'gfx11-generic'" "$tmp/gen.co.log"; then
	skip "gfx11-generic: the RDNA rules" "this compiler has no generic targets (clang 15; they came with LLVM 19); __GFX11__ is what a generic target defines, and gfx1101 above is checked on it"
else
	notok "gfx11-generic: device code compiles" "$(head -20 "$tmp/gen.co.log")"
fi

# The check can fail.
if [ -f "$tmp/gfx1101.s" ]; then
	if build gfx1101 "$tmp/off.co" -DUPCIE_GPU_HIP_TEST_GATE_OFF; then
		disasm "$tmp/off.co" >"$tmp/off.s"
		out=$(rules_rdna "$tmp/off.s" 11)
		nbad=$(grep -c '^bad' <<<"$out")
		if grep -q '^bad doorbell store is the RDNA sequence' <<<"$out" &&
			grep -q '^bad completion poll load' <<<"$out"; then
			ok "self-test: gfx1101 with the gate off fails the RDNA rules ($nbad rules report it)"
		else
			notok "self-test: gfx1101 with the gate off fails the RDNA rules" "$out"
		fi
	else
		notok "self-test: gfx1101 builds with the gate off" "$(head -10 "$tmp/off.co.log")"
	fi
	out=$(rules_cdna "$tmp/gfx1101.s")
	if grep -q '^bad no RDNA invalidates' <<<"$out"; then
		ok "self-test: the gfx1101 object fails the CDNA rules (RDNA instructions where they must not be)"
	else
		notok "self-test: the gfx1101 object fails the CDNA rules" "$out"
	fi
	if build gfx1101 "$tmp/nofam.co" -U__GFX11__; then
		disasm "$tmp/nofam.co" >"$tmp/nofam.s"
		out=$(rules_rdna "$tmp/nofam.s" 11)
		if ! grep -q '^bad' <<<"$out"; then
			ok "self-test: without __GFX11__ the family comes from __gfx1101__ (RDNA rules pass)"
		else
			notok "self-test: without __GFX11__ the family comes from __gfx1101__" "$out"
		fi
	else
		notok "self-test: gfx1101 builds without __GFX11__" "$(head -10 "$tmp/nofam.co.log")"
	fi
	if build gfx1101 "$tmp/g12.co" -U__GFX11__ -D__GFX12__; then
		notok "self-test: GFX12 device code is a build error" "it built"
	elif grep -q 'GFX12 (RDNA4) is not supported' "$tmp/g12.co.log"; then
		ok "self-test: GFX12 device code stops the build with the reason (no GFX12 sequence; clang 15 cannot target it)"
	else
		notok "self-test: GFX12 device code is a build error naming why" "$(head -10 "$tmp/g12.co.log")"
	fi
	if build gfx1101 "$tmp/none.co" -U__GFX11__ -U__gfx1101__; then
		notok "self-test: a target with no family macro is a build error" "it built"
	elif grep -q 'cannot tell the GPU family' "$tmp/none.co.log"; then
		ok "self-test: a target with no family macro is a build error, not the weak path"
	else
		notok "self-test: a target with no family macro is a build error" "$(head -10 "$tmp/none.co.log")"
	fi
fi
echo "1..$n"
[ "$fail" -eq 0 ]
