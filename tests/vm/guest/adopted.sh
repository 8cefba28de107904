# tests/vm/guest/adopted.sh: the boot after the adoption (sourced by agent.sh, with
# fd 3 = the ack port, /mnt/out = the host's writable share).
#
# The previous boot's install.sh adopted a podman attachment made two boots ago; no
# plugin hangs any more. Waits for gc's boot run (the unit install.sh installed) to
# end and writes its exit status and the node's state for the host to check: the
# attachment's address, its DNAT rules (restored from the saved firewall at boot),
# libcni's cache, the ledger, gc's journal.
set -eux

out=/mnt/out
L=/opt/cni/bin/cni-ledger
state=$(systemctl is-system-running --wait) || true
echo "system=$state" >"$out/b3-boot-state.txt"
systemctl --failed --no-legend >"$out/b3-failed-units.txt" || true
i=0
while :; do
	case $(systemctl show -p ActiveState --value cni-ledger-gc.service) in
	active | activating | deactivating) ;;
	*) break ;;
	esac
	i=$((i + 1))
	[ "$i" -lt 1800 ] || { echo "gc boot run did not finish" >&2; exit 1; }
	sleep 0.1
done
{
	echo "status=$(systemctl show -p ExecMainStatus --value cni-ledger-gc.service)"
	echo "code=$(systemctl show -p ExecMainCode --value cni-ledger-gc.service)"
	echo "result=$(systemctl show -p Result --value cni-ledger-gc.service)"
	# Nonzero only if the unit ran this boot (not merely left over from a job).
	echo "started=$(systemctl show -p ExecMainStartTimestampMonotonic --value cni-ledger-gc.service)"
	echo "trigger=$(systemctl show -p LastTriggerUSecMonotonic --value cni-ledger-gc.timer)"
} >"$out/b3-gc-status.txt"
cat "$out/b3-gc-status.txt" >/dev/console
journalctl -b -o short-monotonic -u cni-ledger-gc.service >"$out/b3-gc-journal.txt"
ls /var/lib/vm-ipam/adoptnet >"$out/b3-ips.txt" || true
ls /var/lib/cni/results >"$out/b3-cache.txt"
iptables-save -t nat >"$out/b3-nat.txt"
"$L" list --json >"$out/b3-list.json"
. /mnt/host/tests/vm/guest/nic-reboot.sh
echo DONE >&3
systemctl poweroff
