# tests/vm/guest/nic-reboot.sh: boot 3's part of the NIC test (sourced by adopted.sh).
#
# The previous boot ended with an attachment holding the pod NIC (nic.sh's "boot"
# case). Across the reboot the NIC booted on the host under udev's name; gc replays
# the attachment (boot-changed) and must rename or set nothing: every link is as it
# was before gc ran.
set -eux

out=/mnt/out
L=/opt/cni/bin/cni-ledger
links() { ip -o link show | sed 's/^[0-9]*: //'; ip -o -4 addr show | sed 's/^[0-9]*: //'; }
links >"$out/b3-links-before.txt"
rc=0
"$L" gc --ledger-dir /var/lib/cni-ledger-nic --grace 0 --json --cni-cache-dir /var/lib/cni-nic \
	>"$out/b3-nic-gc.json" 2>"$out/b3-nic-gc.err" || rc=$?
echo "$rc" >"$out/b3-nic-gc.rc"
links >"$out/b3-links-after.txt"
"$L" list --json --ledger-dir /var/lib/cni-ledger-nic >"$out/b3-nic-list.json"
