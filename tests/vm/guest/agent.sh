#!/bin/sh
# tests/vm/guest/agent.sh: runs inside the guest at every boot (started by the image's
# vm-agent unit from the host's read-only share at /mnt/host).
#
# Mounts the host's writable share "out" at /mnt/out, opens the virtio-serial port
# "ack" as fd 3 (the host's record of what the guest reported, which survives a
# power cut of the guest) and runs the step named by vmtest.step= on the kernel
# command line. A step that fails reports "FAIL <why>" on the port, so the host
# stops waiting at once.
set -eu

step=$(sed -n 's/.*vmtest\.step=\([a-z-]*\).*/\1/p' /proc/cmdline)
i=0
while [ ! -e /dev/virtio-ports/ack ]; do
	i=$((i + 1))
	[ "$i" -lt 100 ] || { echo "vm-agent: no /dev/virtio-ports/ack" >/dev/console; poweroff -f; }
	sleep 0.1
done
exec 3>/dev/virtio-ports/ack
fail() {
	echo "FAIL $step: $*" >&3
	echo "vm-agent: FAIL $step: $*" >/dev/console
	exit 1
}
mkdir -p /mnt/out
mount -t 9p -o trans=virtio,version=9p2000.L out /mnt/out || fail "cannot mount the out share"
[ -f "/mnt/host/tests/vm/guest/$step.sh" ] || fail "no such step: '$step'"
echo "STEP $step" >&3
# The step's own errors end in fail() through this trap.
# shellcheck disable=SC2154 # rc is assigned inside the trap
trap 'rc=$?; [ "$rc" -eq 0 ] || fail "exit status $rc (see the serial log)"' EXIT
# shellcheck disable=SC1090 # the step is chosen at run time
. "/mnt/host/tests/vm/guest/$step.sh"
