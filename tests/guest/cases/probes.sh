#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# probes: runs the probes of tools/ that a guest can answer and shows their reports on the console
# (tools/README.md keeps the findings): probe_vfio_cdev on the ivshmem "vram" function;
# probe_dmabuf_udmabuf where the kernel has udmabuf, with dmabuf_import loaded for the segments;
# then probe_vfio_delegate on NVMe c0, a server and a receiver started one after the other as
# separate processes, for each backend the kernel has (type1; iommufd with the cdev): a root
# receiver, also with its RLIMIT_MEMLOCK lowered; an unprivileged receiver (busybox su to a user
# added here, or the probe's own --as where su does not work), then with RLIMIT_MEMLOCK lowered
# on the server, then on the receiver; and the device handed over without its container or
# iommufd. A check passes when every process of the probe exited 0: this case checks that the
# probes run, not what they find.
#
# configs: B C
# timeout: 240
# shellcheck source=../lib/tb.sh
. /tests/lib/tb.sh

echo 16 >/proc/sys/vm/nr_hugepages
[ "$TB_OOT" = 1 ] && tb_modprobe iommufd
tb_modprobe vfio_iommu_type1 vfio-pci
# 6.1 has no udmabuf; a missing exporter is one of the answers, so neither load is required
modprobe udmabuf 2>/dev/null || true
modprobe vgem 2>/dev/null || true
for bdf in "$TB_C0_BDF" "$TB_VRAM_BDF"; do
	tb_bind "$bdf" vfio-pci || tap_diag "binding $bdf to vfio-pci failed (driver '$(tb_driver "$bdf")')"
done

# show a report file as TAP diagnostics
show() { # FILE TITLE
	echo "# ---- $2"
	sed 's/^/# /' "$1"
}

# one probe run: its report, then ok when it exited 0
probe() { # DESC CMD...
	_d=$1
	shift
	"$@" >"$TB_CASE_DIR/probe.out" 2>&1
	_rc=$?
	show "$TB_CASE_DIR/probe.out" "$*"
	if [ "$_rc" -eq 0 ]; then
		tap_ok "$_d"
	else
		tap_fail "$_d" "exit status $_rc"
	fi
}

# an unprivileged user for the receiver: busybox su needs one in /etc/passwd
mkdir -p /etc
grep -q '^probe:' /etc/passwd 2>/dev/null || echo 'probe:x:1000:1000:probe:/tmp:/bin/sh' >>/etc/passwd
grep -q '^probe:' /etc/group 2>/dev/null || echo 'probe:x:1000:' >>/etc/group
if [ "$(su -s /bin/sh probe -c 'id -u' 2>/dev/null)" = 1000 ]; then
	DROP=su
else
	DROP=as
	tap_diag "busybox su did not give uid 1000: the receiver drops privilege itself (--as)"
fi

# receive as root or as user probe
receive() { # root|user SOCKET [RECEIVER OPTIONS]
	_who=$1
	shift
	if [ "$_who" = root ]; then
		probe_vfio_delegate receive "$@"
	elif [ "$DROP" = su ]; then
		su -s /bin/sh probe -c "exec /bin/probe_vfio_delegate receive $*"
	else
		probe_vfio_delegate receive "$@" --as 1000:1000
	fi
}

# one delegation: a server and a receiver, two processes started here one after the other
round() { # DESC SOURCE "SERVER OPTIONS" root|user "RECEIVER OPTIONS"
	_sock=$TB_CASE_DIR/deleg.sock
	rm -f "$_sock"
	# shellcheck disable=SC2086
	probe_vfio_delegate serve "$_sock" "$TB_C0_BDF" --source "$2" $3 >"$TB_CASE_DIR/serve.out" 2>&1 &
	_spid=$!
	tb_wait 20 test -S "$_sock"
	# shellcheck disable=SC2086
	receive "$4" "$_sock" $5 >"$TB_CASE_DIR/recv.out" 2>&1
	_rrc=$?
	wait "$_spid"
	_src=$?
	show "$TB_CASE_DIR/serve.out" "server: serve --source $2${3:+ $3}"
	show "$TB_CASE_DIR/recv.out" "receiver ($4): receive${5:+ $5}"
	if [ "$_src" -eq 0 ] && [ "$_rrc" -eq 0 ]; then
		tap_ok "$1"
	else
		tap_fail "$1" "server exit status $_src, receiver exit status $_rrc"
	fi
}

chmod 755 "$TB_CASE_DIR"
probe "probe_vfio_cdev on vram ($TB_VRAM_BDF)" probe_vfio_cdev "$TB_VRAM_BDF"
# the dma-buf export probe with the kernel's udmabuf as the exporter; segments through
# dmabuf_import where the test bed built it for this kernel
if [ -e /dev/udmabuf ]; then
	modprobe dmabuf_import 2>/dev/null || tap_diag "dmabuf_import did not load: the probe reports no segments"
	probe "probe_dmabuf_udmabuf" probe_dmabuf_udmabuf
else
	tap_skip "probe_dmabuf_udmabuf" "no /dev/udmabuf on $(uname -r)"
fi

backends=type1
[ -e /dev/iommu ] && backends="type1 iommufd"
for be in $backends; do
	round "delegate $be: root receiver" "$be" "" root ""
	round "delegate $be: root receiver, receiver RLIMIT_MEMLOCK 1M" "$be" "" root "--memlock 1M"
	round "delegate $be: unprivileged receiver" "$be" "" user ""
	round "delegate $be: unprivileged receiver, server RLIMIT_MEMLOCK 1M" "$be" "--memlock 1M" user ""
	round "delegate $be: unprivileged receiver, receiver RLIMIT_MEMLOCK 1M" "$be" "" user "--memlock 1M"
	round "delegate $be: device without its container/iommufd" "$be" "--withhold" user ""
done
tap_done
