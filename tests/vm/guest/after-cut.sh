# tests/vm/guest/after-cut.sh: the boot after the power cut (sourced by agent.sh,
# with fd 3 = the ack port, /mnt/out = the host's writable share).
#
# First: did the boot finish while gc's boot run hangs in a plugin? Then it ends
# the hanging plugin, waits for the boot run to finish, and writes the node's own
# state for the host to check: addresses, nat table, ledgers, gc's journal.
# Then the plugin's DEL is let succeed, and install.sh, re-run, adopts the podman
# attachment the previous boot made on a network the ledger was not in; the next
# boot (adopted.sh) shows its unit replaying it.
set -eux

out=/mnt/out
L=/opt/cni/bin/cni-ledger
# Returns when the boot is done (no more start jobs): "running", or "degraded".
state=$(systemctl is-system-running --wait) || true
{
	echo "system=$state"
	echo "gc=$(systemctl show -p ActiveState --value cni-ledger-gc.service)"
	hang=$(cat /run/vm-hang.pid 2>/dev/null) || hang=
	if [ -n "$hang" ] && kill -0 "$hang" 2>/dev/null; then echo "hang=running"; else echo "hang=none"; fi
	echo "uptime=$(cut -d' ' -f1 /proc/uptime)"
	# When the boot finished and when gc's boot run started, in µs since boot.
	echo "finished=$(systemctl show -p FinishTimestampMonotonic --value)"
	echo "gc_started=$(systemctl show -p ExecMainStartTimestampMonotonic --value cni-ledger-gc.service)"
	echo "netfilter=$(systemctl show -p Result --value netfilter-persistent.service)"
} >"$out/boot-state.txt"
systemctl --failed --no-legend >"$out/failed-units.txt" || true
cat "$out/boot-state.txt" >/dev/console

systemd-analyze blame >"$out/blame.txt" 2>&1 || true

# End each hanging DEL (gc would kill it at its --timeout) and let gc finish.
i=0
while :; do
	case $(systemctl show -p ActiveState --value cni-ledger-gc.service) in
	active | activating | deactivating) ;;
	*) break ;;
	esac
	i=$((i + 1))
	[ "$i" -lt 1200 ] || { echo "gc boot run did not finish" >&2; exit 1; }
	hang=$(cat /run/vm-hang.pid 2>/dev/null) || hang=
	[ -z "$hang" ] || kill "$hang" 2>/dev/null || true
	sleep 0.1
done
{
	echo "status=$(systemctl show -p ExecMainStatus --value cni-ledger-gc.service)"
	echo "result=$(systemctl show -p Result --value cni-ledger-gc.service)"
	echo "timer=$(systemctl is-active cni-ledger-gc.timer)"
} >"$out/gc-status.txt"

journalctl -b -o short-monotonic -u cni-ledger-gc.service >"$out/gc-journal.txt"
ls /var/lib/vm-ipam/ledgernet >"$out/after-ips.txt"
iptables-save -t nat >"$out/after-nat.txt"
cp /etc/iptables/rules.v4 "$out/saved-rules.v4"
"$L" list --json >"$out/after-list.json"
rc=0
"$L" verify --ledger-dir /var/lib/cni-ledger-loop >"$out/loop-verify.txt" 2>&1 || rc=$?
echo "$rc" >"$out/loop-verify.rc"
"$L" list --json --ledger-dir /var/lib/cni-ledger-loop >"$out/loop-list.json"
"$L" list --json --ledger-dir /var/lib/cni-ledger-ctl >"$out/ctl-list.json" 2>"$out/ctl-list.err" || true
ls -la /var/lib/cni-ledger-ctl/records >"$out/ctl-ls.txt"

# --- Adoption of the earlier boot's podman attachment (the next boot's unit replays it)
# The hanging plugin's daemon is "up" now: its DEL succeeds from here on.
touch /var/lib/vm-hang.released
sync
# The timer's first elapse (1 min after boot; merged into the boot run if that still
# ran then) is waited out, and gc is run once by its unit, as an operator would after
# fixing a plugin: the hung attachment replays now. The timer's next run is then 5 min
# away, so the attachment adopted below is left for the next boot's unit to replay.
i=0
while :; do
	trig=$(systemctl show -p LastTriggerUSecMonotonic --value cni-ledger-gc.timer)
	case $(systemctl show -p ActiveState --value cni-ledger-gc.service) in
	active | activating | deactivating) ;;
	*) [ "${trig:-0}" = 0 ] || break ;;
	esac
	i=$((i + 1))
	[ "$i" -lt 1800 ] || { echo "the timer's first gc run did not happen" >&2; exit 1; }
	sleep 0.1
done
systemctl start cni-ledger-gc.service
i=0
while :; do
	case $(systemctl show -p ActiveState --value cni-ledger-gc.service) in
	active | activating | deactivating) ;;
	*) break ;;
	esac
	i=$((i + 1))
	[ "$i" -lt 1800 ] || { echo "gc's run by hand did not finish" >&2; exit 1; }
	sleep 0.1
done
{
	echo "uptime=$(cut -d' ' -f1 /proc/uptime)"
	echo "trigger=$trig"
	echo "status=$(systemctl show -p ExecMainStatus --value cni-ledger-gc.service)"
	echo "next=$(systemctl show -p NextElapseUSecMonotonic --value cni-ledger-gc.timer)"
} >"$out/timer-run.txt"
"$L" list --json >"$out/timer-list.json"
# The earlier boot's podman attachment, which no record knows yet.
ls /var/lib/cni/results >"$out/adopt-before-cache.txt"
ls /var/lib/vm-ipam/adoptnet >"$out/adopt-before-ips.txt" || true
iptables-save -t nat >"$out/adopt-before-nat.txt"
# install.sh re-run as an operator runs it (a root shell: no CNI_PATH, no --cni-path):
# it injects the ledger into adoptnet, then adopts that network's cached attachments.
rc=0
env -u CNI_PATH bash /mnt/host/install.sh --binary "$out/cni-ledger" --inject \
	>"$out/reinstall.txt" 2>&1 || rc=$?
echo "$rc" >"$out/reinstall.rc"
cp /etc/cni/net.d/55-adoptnet.conflist "$out/adoptnet.conflist"
mkdir -p "$out/adopted-records"
cp /var/lib/cni-ledger/records/adoptnet:* "$out/adopted-records/" || true
# adopt once more, as an operator checks: nothing left to adopt, nothing unusable.
rc=0
env -u CNI_PATH "$L" adopt --json >"$out/adopt-again.json" 2>"$out/adopt-again.err" || rc=$?
echo "$rc" >"$out/adopt-again.rc"
"$L" list --json >"$out/adopt-list.json"
# A real NIC handed to a pod and back (its last attachment is left for boot 3).
. /mnt/host/tests/vm/guest/nic.sh
sync
echo DONE >&3
systemctl poweroff
