#!/usr/bin/env bash
# bench/full-node.sh: a full node's figures (issue 33): 110 live pods and 110 stale records.
#
#   sudo bench/full-node.sh              # ~3 min; PODS=N (default 110), IDLE=SECS (default 120)
#   sudo LEDGER=PATH bench/full-node.sh  # a built cni-ledger instead of the static release build
#
# The world: a "host" namespace the script makes, one network through the real chain
# [cni-ledger, bridge+host-local, portmap, cni-ledger tail] via libcni (tests/driver), PODS
# live pods (a namespace each, a host port each) and PODS stale attachments (the same,
# their namespaces deleted). Measured, in this order:
#   list        `cni-ledger list` (table, to a file) and `list --json` over the 2×PODS
#               records: wall time and peak RSS (GNU time), median of 5
#   gc          `cni-ledger gc` (defaults but --grace 0: the stale records are of this
#               boot) replaying the PODS stale ones beside the PODS live ones: wall, gc's
#               own peak RSS (VmHWM, sampled every 10 ms until it exits) and CPU, and
#               the CPU of gc with the plugins it ran (wait4)
#   agent       the stale set made again, then `cni-ledger agent` (defaults but --grace 0, no CRI
#               runtime) started over it: its first gc run (start to "gc: done"); then
#               CHURN (10) live pods deleted and added again, so that the chain's
#               series exist; then RSS and CPU over IDLE seconds, then /metrics: series
#               (sample lines) and payload bytes, with the families that have the most
# Then every record, lease and DNAT chain is checked: none stale left, PODS live.
# Output: markdown rows on stdout; progress on stderr.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(dirname "$here")
[ "$(id -u)" -eq 0 ] || { echo "bench/full-node.sh: run as root" >&2; exit 1; }
: "${PODS:=110}" "${IDLE:=120}" "${CHURN:=10}"
log() { printf '[full-node %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

tag=$$
B=$(mktemp -d /var/tmp/cl-full-node.XXXXXX)
HOST=clnode-$tag-host
P=clnode-$tag-
agent_pid=
cleanup() {
	set +e
	[ -z "$agent_pid" ] || pkill -P "$agent_pid" -x cni-ledger 2>/dev/null
	[ -z "$agent_pid" ] || kill "$agent_pid" 2>/dev/null
	ip netns list 2>/dev/null | awk '{print $1}' | grep "^$P" | sed 's/^/netns del /' | ip -force -batch - 2>/dev/null
	[ -n "${KEEP:-}" ] || rm -rf "$B"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -z "${LEDGER:-}" ]; then
	host=$(rustc -vV | sed -n 's/^host: //p')
	(cd "$repo" && RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
		cargo build --release --locked --target "$host" --bin cni-ledger >&2)
	LEDGER=$repo/target/$host/release/cni-ledger
fi
mkdir -p "$B"/{bin,conf,cache,ipam}
cp "$LEDGER" "$B/bin/cni-ledger"
LEDGER=$B/bin/cni-ledger
DRIVER=$repo/target/bench/cni-driver
if [ ! -x "$DRIVER" ] || [ -n "$(find "$repo/tests/driver" -newer "$DRIVER" -print -quit)" ]; then
	mkdir -p "$(dirname "$DRIVER")"
	(cd "$repo" && GO111MODULE=off GOPATH=/usr/share/gocode go build -o "$DRIVER" ./tests/driver)
fi
CNI_PATH_ALL=$B/bin:/usr/lib/cni
L=$B/ledger
cat >"$B/conf/10-node.conflist" <<JSON
{"cniVersion":"1.0.0","name":"node","plugins":[
 {"type":"cni-ledger","ledgerDir":"$L","confDir":"$B/conf","capabilities":{"portMappings":true}},
 {"type":"bridge","bridge":"cln$tag","isGateway":true,"ipMasq":false,"ipam":{"type":"host-local","dataDir":"$B/ipam","ranges":[[{"subnet":"198.18.32.0/20"}]]}},
 {"type":"portmap","capabilities":{"portMappings":true},"snat":false},
 {"type":"cni-ledger","role":"tail","ledgerDir":"$L"}]}
JSON
ip netns add "$HOST"
ip netns exec "$HOST" ip link set lo up
inhost() { ip netns exec "$HOST" "$@"; }
dnat_chains() { inhost iptables-save -t nat | grep -c '^:CNI-DN-' || true; }
leases() { find "$B/ipam/node" -maxdepth 1 -name '198.18.*' 2>/dev/null | wc -l; }
records() { find "$L/records" -maxdepth 1 -name '*.json' 2>/dev/null | wc -l; }
attach() { # set port-base: PODS attachments of set, ADD through libcni, 4 at a time
	local set=$1 base=$2 k names=()
	for ((k = 0; k < PODS; k++)); do names+=("$P$set$k"); done
	printf 'netns add %s\n' "${names[@]}" | ip -batch -
	# The first alone: portmap's first ADDs in a fresh namespace race to create its
	# top-level chains ("CHAIN_USER_ADD failed (File exists)").
	for ((k = 0; k < PODS; k++)); do printf '%s%s %s %s\n' "$set" "$k" "/run/netns/$P$set$k" "$((base + k))"; done |
		{ IFS= read -r first; printf '%s\n' "$first" | driver_line 1; driver_line 4; } || die "ADD failed: $(tail -3 "$B/driver-errors.log")"
}
driver_line() { # jobs: one libcni ADD per stdin line "cid netns hostPort"
	inhost xargs -P "$1" -L 1 sh -c '
		"$0" add --conf-dir "$1" --net node --cid "$4" --ifname eth0 --netns "$5" \
			--cni-path "$2" --cache-dir "$3" \
			--cap-args "{\"portMappings\":[{\"hostPort\":$6,\"containerPort\":80,\"protocol\":\"tcp\"}]}" \
			>/dev/null 2>>"$3/../driver-errors.log"' \
		"$DRIVER" "$B/conf" "$CNI_PATH_ALL" "$B/cache"
}
stale() { # set port-base: attachments whose namespaces are then deleted
	attach "$@"
	local k names=()
	for ((k = 0; k < PODS; k++)); do names+=("$P$1$k"); done
	printf 'netns del %s\n' "${names[@]}" | ip -batch -
}
# Runs a command; prints "wall_s - cpu_s(with the children it waited for) own_hwm_kib
# own_cpu_s". Its own peak RSS is sampled (VmHWM, every 10 ms, until it exits): wait4's
# maxrss would count the forking Python's memory.
measure() {
	python3 - "$@" <<'PY'
import os, sys, time, threading
t0 = time.monotonic()
null = os.open(os.devnull, os.O_WRONLY)
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, null, 1)])
own = {"hwm": 0, "cpu": 0.0}
def sample():
    tck = os.sysconf("SC_CLK_TCK")
    while True:
        try:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        own["hwm"] = max(own["hwm"], int(line.split()[1]))
            with open("/proc/%d/stat" % pid) as f:
                s = f.read()
            if ") Z " in s:
                return
            fl = s[s.rindex(")") + 2:].split()
            own["cpu"] = (int(fl[11]) + int(fl[12])) / tck
        except (OSError, ValueError, IndexError):
            return
        time.sleep(0.01)
th = threading.Thread(target=sample, daemon=True)
th.start()
_, status, ru = os.wait4(pid, 0)
wall = time.monotonic() - t0
th.join(1)
rc = os.waitstatus_to_exitcode(status)
if rc not in (0, 1):
    sys.exit("exit %d: %s" % (rc, sys.argv[1:]))
print("%.3f - %.3f %d %.3f" % (wall, ru.ru_utime + ru.ru_stime, own["hwm"], own["cpu"]))
PY
}
median_of() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

log "load $(cut -d' ' -f1-3 /proc/loadavg); $PODS live pods and $PODS stale attachments"
attach l 20000
stale s 22000
[ "$(records)/$(leases)/$(dnat_chains)" = "$((2 * PODS))/$((2 * PODS))/$((2 * PODS))" ] ||
	die "set-up: records/leases/DNAT chains $(records)/$(leases)/$(dnat_chains)"
sync

# list: 5 runs each, to a file, timed by GNU time (forked from a small process: its
# peak RSS is list's own, not the forking parent's).
for how in table json; do
	: >"$B/list-$how"
	flag=
	[ $how = table ] || flag=--json
	for _ in 1 2 3 4 5; do
		/usr/bin/time -a -o "$B/list-$how" -f '%e %M' "$LEDGER" list --ledger-dir "$L" $flag >"$B/list.out"
	done
done
[ "$(grep -c . "$B/list.out")" -ge "$PODS" ] || die "list printed too little: $(head -3 "$B/list.out")"
lt=$(awk '{print $1}' "$B/list-table" | median_of) lr=$(awk '{print $2}' "$B/list-table" | median_of)
jt=$(awk '{print $1}' "$B/list-json" | median_of) jr=$(awk '{print $2}' "$B/list-json" | median_of)

# gc replaying the stale set beside the live one.
read -r gw grss gcpu ghwm gown <<<"$(measure /usr/sbin/ip netns exec "$HOST" "$LEDGER" gc --ledger-dir "$L" \
	--conf-dir "$B/conf" --cni-cache-dir "$B/cache" --grace 0 --log-file "$B/gc.log")"
[ "$(records)/$(leases)/$(dnat_chains)" = "$PODS/$PODS/$PODS" ] ||
	die "after gc: records/leases/DNAT chains $(records)/$(leases)/$(dnat_chains), not $PODS each"

# The agent over a node just rebooted: the stale set again, the agent started.
stale t 24000
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
inhost env -u CNI_COMMAND "$LEDGER" agent --cni-bin-dir "$B/bin" --conf-dir "$B/conf" --ledger-dir "$L" \
	--cni-cache-dir "$B/cache" --cri-endpoint none --grace 0 --listen "127.0.0.1:$port" --log-file "$B/agent.log" \
	</dev/null >/dev/null 2>&1 &
agent_pid=$!
t0=$(date +%s.%N)
until grep -q 'gc: done' "$B/agent.log" 2>/dev/null; do
	sleep 0.05
	kill -0 "$agent_pid" 2>/dev/null || die "the agent exited: $(tail -5 "$B/agent.log")"
done
first=$(python3 -c "import sys; print('%.2f' % ($(date +%s.%N) - $t0))")
apid=$(pgrep -P "$agent_pid" -x cni-ledger || echo "$agent_pid") # ip netns exec execs: same pid
hwm_first=$(awk '/^VmHWM/ {print $2}' "/proc/$apid/status")
cpu() { awk '{print $14 + $15}' "/proc/$apid/stat"; }
# Pods come and go as on a working node, so that the chain's series exist: CHURN of the
# live pods are deleted and added again (sequentially, through libcni).
for ((k = 0; k < CHURN; k++)); do
	for verb in del add; do
		inhost "$DRIVER" "$verb" --conf-dir "$B/conf" --net node --cid "l$k" --ifname eth0 --netns "/run/netns/${P}l$k" \
			--cni-path "$CNI_PATH_ALL" --cache-dir "$B/cache" \
			--cap-args "{\"portMappings\":[{\"hostPort\":$((20000 + k)),\"containerPort\":80,\"protocol\":\"tcp\"}]}" >/dev/null ||
			die "churn: $verb l$k failed"
	done
done
sleep 5 # past the first run's and the churn's last writes
c0=$(cpu)
log "agent: first gc run took ${first}s; idling ${IDLE}s"
sleep "$IDLE"
c1=$(cpu)
rss=$(awk '/^VmRSS/ {print $2}' "/proc/$apid/status")
hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$apid/status")
inhost curl -s "http://127.0.0.1:$port/metrics" >"$B/metrics"
series=$(grep -vc '^#\|^$' "$B/metrics" || true)
bytes=$(wc -c <"$B/metrics")
families=$(grep -v '^#\|^$' "$B/metrics" | sed 's/[{ ].*//' | sort | uniq -c | sort -rn | head -6 | awk '{printf "%s%s %s", sep, $2, $1; sep = ", "}')
# `ip netns exec` forks here: the agent is its child, and is what is stopped.
kill "$apid"
wait "$agent_pid" || true
agent_pid=
[ "$(records)/$(leases)/$(dnat_chains)" = "$PODS/$PODS/$PODS" ] ||
	die "after the agent: records/leases/DNAT chains $(records)/$(leases)/$(dnat_chains), not $PODS each"
tck=$(getconf CLK_TCK)
cph=$(python3 -c "print('%.2f' % (($c1 - $c0) / $tck / $IDLE * 3600))")

log "done; load $(cut -d' ' -f1-3 /proc/loadavg)"
mib() { python3 -c "print('%.1f MiB' % ($1 / 1024))"; }
echo "| measurement ($PODS live pods, $PODS stale) | figure |"
echo "|---|---|"
echo "| \`list\` (table, to a file), $((2 * PODS)) records: wall; peak RSS (median of 5) | ${lt} s; $(mib "$lr") |"
echo "| \`list --json\` (to a file): wall; peak RSS (median of 5) | ${jt} s; $(mib "$jr") |"
echo "| \`gc\` replaying $PODS stale beside $PODS live: wall (every stale one released) | ${gw} s |"
echo "| gc's own peak RSS (VmHWM); its own CPU | $(mib "$ghwm"); ${gown} s |"
echo "| gc with the plugins it ran: CPU | ${gcpu} s |"
echo "| agent's first gc run at start ($PODS stale, $PODS live): start to \`gc: done\`; peak RSS by then | ${first} s; $(mib "$hwm_first") |"
echo "| agent idle after it (default intervals, ${IDLE} s): RSS; peak RSS; CPU per hour | $(mib "$rss"); $(mib "$hwm"); ${cph} s/h |"
echo "| agent /metrics: series; payload | $series; $bytes bytes |"
echo "| /metrics families with the most series | $families |"
