#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# served_vf: upcie-served owns c7, an SR-IOV physical function (vfio), and gives each client that
# asks a VF of its own (--vfs 2): a secondary controller with exactly the namespaces the client's
# grants name, in its own IOMMU group, driven by the client through its own container
# (progs/t_served_vf.c, unprivileged clients: uid 1000 granted c7n1, uid 1001 c7n2, uid 1002 an
# LBA range of c7n1):
#   - uid 1000 takes VF 1, sees only namespace 1, writes and reads back its data, and holds a
#     buffer whose device address it hands to uid 1001;
#   - uid 1001 takes VF 2, sees only namespace 2, aims a Read at that address (the buffer must
#     stay untouched: the IOMMU confines the VF to 1001's own mappings) and at an address
#     nothing is mapped at (an error status and an IOMMU fault), then goes on;
#   - with both held a third client is refused (-EBUSY); a client whose grant is an LBA range
#     gets no VF (-EPERM);
#   - a client that closes its connection but keeps the controller open: its next Read fails
#     (the server took the VF offline at once);
#   - a VF handed out again shows the data the first client wrote; the server's account at
#     SIGTERM counts the VFs given and taken back;
#   - the owner of the PF (before the server starts) and a client through its VF each read 4 KiB
#     at QD 1 1000 times: the mean latencies are printed (# tb: served_vf_*_qd1_mean_us);
#   - negative control: against a server built to leave the VF online (progs/t_served_keepvf.c)
#     the closed client's next Read succeeds.
# served_vf.host.sh checks c7n1 and c7n2's images: each client's 64 KiB holds its pattern.
#
# configs: B C
# devices: sriov
# timeout: 300
# dmesg-allow: DMAR: \[DMA (Read|Write)
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

S=/run/upcie/c7.sock
echo 128 >/proc/sys/vm/nr_hugepages
tb_modprobe vfio_iommu_type1 vfio-pci
[ "$TB_OOT" = 1 ] && tb_modprobe iommufd
echo 1 >/sys/module/vfio_pci/parameters/enable_sriov ||
	tap_fail "vfio-pci's enable_sriov set"
path=type1
[ "$TB_OOT" = 1 ] && path=iommufd
tb_bind "$TB_C7_BDF" vfio-pci || tap_fail "c7 bound to vfio-pci"
mkdir -p /run/upcie

# TAP lines of a program, renumbered into this case's; '#' lines kept as diagnostics
relay() { # LOG
	while IFS= read -r l; do
		case $l in
		"not ok "*) tap_fail "${l#* - }" ;;
		"ok "*) tap_ok "${l#* - }" ;;
		"#"*) echo "$l" ;;
		esac
	done <"$1"
}

# the owner's QD 1 reads on the PF, before any server: the figure beside the VF client's
/bin/t_served_vf ownerperf "$TB_C7_BDF" "$path" 1 1000 >/tmp/vf_operf.log 2>&1
relay /tmp/vf_operf.log

/bin/upcie-served "$TB_C7_BDF" --socket "$S" --path "$path" --mode 0666 --vfs 2 \
	--grant 1000:1 --grant 1001:2 --grant 1002:1:0+1024 >/tmp/served_vf.log 2>&1 &
srv=$!
if ! tb_wait 30 test -S "$S"; then
	tap_fail "upcie-served --vfs 2 up on $S" "$(cat /tmp/served_vf.log)"
	kill "$srv" 2>/dev/null
	tap_done
	exit 1
fi
tap_ok "upcie-served --vfs 2 up on $S ($path)"
n=$(cat "/sys/bus/pci/devices/$TB_C7_BDF/sriov_numvfs")
tap_is "$n" 2 "two VFs enabled"
for v in /sys/bus/pci/devices/"$TB_C7_BDF"/virtfn*; do
	f=$(basename "$(readlink "$v")")
	g=$(basename "$(readlink "/sys/bus/pci/devices/$f/iommu_group")")
	tap_diag "$f: driver $(tb_driver "$f"), IOMMU group $g"
done

rm -f /tmp/vf_addr /tmp/vf_addr.done
/bin/t_served_vf --as 1000 own "$S" vfa 2048 1 /tmp/vf_addr >/tmp/vf_own.log 2>&1 &
own=$!
rm -f /tmp/vf_hold.ready /tmp/vf_hold.release
if tb_wait 60 test -s /tmp/vf_addr; then
	/bin/t_served_vf --as 1001 attack "$S" "$(cat /tmp/vf_addr)" 2 1 /tmp/vf_hold \
		>/tmp/vf_attack.log 2>&1 &
	att=$!
	if tb_wait 60 test -e /tmp/vf_hold.ready; then
		/bin/t_served_vf --as 1000 busy "$S" >/tmp/vf_busy.log 2>&1
	else
		echo "not ok - the second client held its VF" >/tmp/vf_busy.log
	fi
	touch /tmp/vf_hold.release
	wait "$att"
	relay /tmp/vf_attack.log
	relay /tmp/vf_busy.log
else
	tap_fail "the first client handed out its buffer's address"
fi
touch /tmp/vf_addr.done
wait "$own"
relay /tmp/vf_own.log
/bin/t_served_vf --as 1002 denied "$S" >/tmp/vf_denied.log 2>&1
relay /tmp/vf_denied.log
/bin/t_served_vf --as 1000 revoke "$S" 1 >/tmp/vf_revoke.log 2>&1
relay /tmp/vf_revoke.log
/bin/t_served_vf --as 1000 reread "$S" vfa 2048 1 >/tmp/vf_reread.log 2>&1
relay /tmp/vf_reread.log
# uid 1001 writes its own pattern to namespace 2 for the host to find
/bin/t_served_vf --as 1001 own "$S" vfb 4096 2 /tmp/vf_addr2 >/tmp/vf_own2.log 2>&1 &
own2=$!
tb_wait 60 test -s /tmp/vf_addr2
touch /tmp/vf_addr2.done
wait "$own2"
relay /tmp/vf_own2.log

# the same reads by a client through its VF (the server is in no command's path)
/bin/t_served_vf --as 1000 perf "$S" 1 1000 >/tmp/vf_perf.log 2>&1
relay /tmp/vf_perf.log

kill -TERM "$srv"
wait "$srv"
rc=$?
st=$(grep -o 'vf_given=[0-9]* vf_back=[0-9]*' /tmp/served_vf.log)
tap_is "$rc $st" "0 vf_given=6 vf_back=6" "the server stopped cleanly: 6 VFs given, 6 taken back"
[ "$rc $st" = "0 vf_given=6 vf_back=6" ] || sed 's/^/# /' /tmp/served_vf.log | tail -30

# negative control of the revocation: a server built to leave a client's VF online
/bin/t_served_keepvf "$TB_C7_BDF" --socket "$S" --path "$path" --mode 0666 --vfs 2 \
	--grant 1000:1 >/tmp/served_keep.log 2>&1 &
srv=$!
if tb_wait 30 test -S "$S"; then
	/bin/t_served_vf --as 1000 revoke "$S" 1 >/tmp/vf_revoke_nc.log 2>&1
	if grep -q '^ok .*a VF, read from' /tmp/vf_revoke_nc.log &&
		grep -q '^not ok .*the next Read fails (0 ' /tmp/vf_revoke_nc.log; then
		tap_ok "negative control: with the VF left online the closed client's next Read succeeds"
	else
		tap_fail "negative control: with the VF left online the closed client's next Read succeeds" \
			"$(cat /tmp/vf_revoke_nc.log)"
	fi
else
	tap_fail "the negative-control server up" "$(cat /tmp/served_keep.log)"
fi
kill -TERM "$srv" 2>/dev/null
wait "$srv"
tap_done
