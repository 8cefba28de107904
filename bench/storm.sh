#!/usr/bin/env bash
# bench/storm.sh: gc under a pod-start storm (issue 33), side by side.
#
#   sudo bench/storm.sh                  # N = 40 and 110, 3 rounds each, ~6 min on 2 cores
#   sudo NS="40" ROUNDS=2 bench/storm.sh # fewer
#   sudo LEDGER=PATH bench/storm.sh      # a built cni-ledger instead of the static release build
#   sudo GC_LEAD=3 bench/storm.sh        # gc starts 3 s before the storm (default 0: with it);
#                                        # the "alone" variant is unchanged
#
# After an unclean reboot the runtime starts the node's pods while gc replays DEL for the
# old boot's attachments, through the same chain. Each storm: N stale attachments of the
# network (ADD through libcni, each with a host port, then their namespaces deleted), N
# new namespaces, then N new pods' ADDs started at once through libcni (tests/driver,
# Debian's libcni) on the real chain [cni-ledger, bridge+host-local, portmap, cni-ledger
# tail], each with a host port of its own, each timed from its spawn to its exit
# (bench/storm.py). Variants, in an order rotated every round:
#   alone       no gc during the storm (gc runs after it, by itself: its time is the
#               release time without a storm)
#   gc          `cni-ledger gc` started with the storm, its defaults (--jobs 4,
#               --yield-max 60) but --grace 0: the stale records are of this boot, and
#               the grace is what a reboot skips
#   gc-noyield  the same with --yield-max 0: gc as it was before it yielded to ADDs
# gc's time is from its spawn to its exit: when it exits, every stale attachment is
# released. After each storm the script checks that no stale record, host-local lease
# or portmap DNAT chain is left (the N new pods' are), then DELs the new pods.
# Everything networked happens in a "host" namespace the script makes (198.18.16.0/20),
# removed on exit with all files (/var/tmp, persistent storage: fsync must be real).
#
# Output: one markdown table (bench/storm.py report) on stdout; progress on stderr.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(dirname "$here")
[ "$(id -u)" -eq 0 ] || { echo "bench/storm.sh: run as root (ip netns, iptables)" >&2; exit 1; }
: "${NS:=40 110}" "${ROUNDS:=3}" "${VARIANTS:=alone gc gc-noyield}"
log() { printf '[storm %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

tag=$$
B=$(mktemp -d /var/tmp/cl-storm.XXXXXX)
HOST=clstorm-$tag-host
P=clstorm-$tag- # namespace prefix: ${P}s<k> stale, ${P}n<k> new
cleanup() {
	set +e
	ip netns list 2>/dev/null | awk '{print $1}' | grep "^$P" | sed 's/^/netns del /' | ip -force -batch - 2>/dev/null
	rm -rf "$B"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -z "${LEDGER:-}" ]; then
	host=$(rustc -vV | sed -n 's/^host: //p')
	(cd "$repo" && RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
		cargo build --release --locked --target "$host" --bin cni-ledger >&2)
	LEDGER=$repo/target/$host/release/cni-ledger
fi
mkdir -p "$B"/{bin,conf,cache,ipam,results}
cp "$LEDGER" "$B/bin/cni-ledger" # a copy: a concurrent build must not swap it mid-run
LEDGER=$B/bin/cni-ledger
DRIVER=$repo/target/bench/cni-driver
if [ ! -x "$DRIVER" ] || [ -n "$(find "$repo/tests/driver" -newer "$DRIVER" -print -quit)" ]; then
	log "building the libcni driver"
	mkdir -p "$(dirname "$DRIVER")"
	(cd "$repo" && GO111MODULE=off GOPATH=/usr/share/gocode go build -o "$DRIVER" ./tests/driver)
fi
CNI_PATH_ALL=$B/bin:/usr/lib/cni
L=$B/ledger
cat >"$B/conf/10-storm.conflist" <<JSON
{"cniVersion":"1.0.0","name":"storm","plugins":[
 {"type":"cni-ledger","ledgerDir":"$L","confDir":"$B/conf","logFile":"$B/plugin.log","capabilities":{"portMappings":true}},
 {"type":"bridge","bridge":"cls$tag","isGateway":true,"ipMasq":false,"ipam":{"type":"host-local","dataDir":"$B/ipam","ranges":[[{"subnet":"198.18.16.0/20"}]]}},
 {"type":"portmap","capabilities":{"portMappings":true},"snat":false},
 {"type":"cni-ledger","role":"tail","ledgerDir":"$L","logFile":"$B/plugin.log"}]}
JSON
ip netns add "$HOST"
ip netns exec "$HOST" ip link set lo up
inhost() { ip netns exec "$HOST" "$@"; }
sleep 4 # as on a node, the conflist is older than ADD's memo's 3 s (src/plugin/conf_memo.rs)

dnat_chains() { inhost iptables-save -t nat | grep -c '^:CNI-DN-' || true; }
leases() { find "$B/ipam/storm" -maxdepth 1 -name '198.18.*' 2>/dev/null | wc -l; }
records() { find "$L/records" -maxdepth 1 -name '*.json' 2>/dev/null | wc -l; }
# One driver call per line of "cid netns hostPort", 4 at a time.
driver_each() { # verb
	inhost xargs -P 4 -L 1 sh -c '
		"$0" '"$1"' --conf-dir "$1" --net storm --cid "$4" --ifname eth0 --netns "$5" \
			--cni-path "$2" --cache-dir "$3" \
			--cap-args "{\"portMappings\":[{\"hostPort\":$6,\"containerPort\":80,\"protocol\":\"tcp\"}]}" \
			>/dev/null 2>>"$3/../driver-errors.log"' \
		"$DRIVER" "$B/conf" "$CNI_PATH_ALL" "$B/cache"
}
netns_batch() { # add|del names...
	local verb=$1
	shift
	printf "netns $verb %s\n" "$@" | ip -force -batch -
}
gc_argv() { # extra args... -> JSON argv of `ip netns exec HOST cni-ledger gc ...`
	python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \
		/usr/sbin/ip netns exec "$HOST" "$LEDGER" gc --ledger-dir "$L" --conf-dir "$B/conf" \
		--cni-cache-dir "$B/cache" --grace 0 --log-file "$B/gc.log" "$@"
}
gc_argv >"$B/gc-default.json"
gc_argv --yield-max 0 >"$B/gc-noyield.json"

storm() { # variant n round
	local v=$1 n=$2 r=$3 k out=$B/results/$1-$2-$3.tsv
	local stale=() new=()
	for ((k = 0; k < n; k++)); do stale+=("${P}s$k") new+=("${P}n$k"); done
	netns_batch add "${stale[@]}"
	for ((k = 0; k < n; k++)); do printf 's%s-%s %s %s\n' "$r$v" "$k" "/run/netns/${P}s$k" "$((20000 + k))"; done |
		driver_each add || die "ADD of the stale set failed: $(tail -3 "$B/driver-errors.log")"
	netns_batch del "${stale[@]}"
	[ "$(records)/$(leases)/$(dnat_chains)" = "$n/$n/$n" ] ||
		die "stale set: records/leases/DNAT chains $(records)/$(leases)/$(dnat_chains), not $n each"
	netns_batch add "${new[@]}"
	python3 -c '
import json, sys
driver, conf, path, cache, r, n, p = sys.argv[1:8]
print(json.dumps([[driver, "add", "--conf-dir", conf, "--net", "storm", "--cid", "n%s-%d" % (r, k),
    "--ifname", "eth0", "--netns", "/run/netns/%sn%d" % (p, k), "--cni-path", path,
    "--cache-dir", cache, "--cap-args",
    json.dumps({"portMappings": [{"hostPort": 30000 + k, "containerPort": 80, "protocol": "tcp"}]})]
    for k in range(int(n))]))' "$DRIVER" "$B/conf" "$CNI_PATH_ALL" "$B/cache" "$r$v" "$n" "$P" >"$B/adds.json"
	sync
	case $v in
	alone) inhost python3 "$here/storm.py" launch "$out" "$B/adds.json" ;;
	gc) inhost python3 "$here/storm.py" launch "$out" "$B/adds.json" "$B/gc-default.json" ;;
	gc-noyield) inhost python3 "$here/storm.py" launch "$out" "$B/adds.json" "$B/gc-noyield.json" ;;
	esac || die "$v: an ADD failed: $(tail -3 "$out.stderr")"
	if [ "$v" = alone ]; then
		# The release time without a storm, by the same gc.
		inhost python3 "$here/storm.py" launch "$out" <(echo '[]') "$B/gc-default.json"
	fi
	[ "$(records)/$(leases)/$(dnat_chains)" = "$n/$n/$n" ] ||
		die "$v: after gc, records/leases/DNAT chains $(records)/$(leases)/$(dnat_chains), not the $n new pods' alone"
	log "  $v N=$n round $r: ADD p90 $(awk -F'\t' '$1 == "add" {print $3}' "$out" | sort -n |
		awk '{a[NR] = $1} END {print a[int(NR * 0.9) + 1] " ms"}'), gc $(awk -F'\t' '$1 == "gc" {print $3 " ms"}' "$out")"
	# Tear the new pods down (untimed) and check nothing is left.
	for ((k = 0; k < n; k++)); do printf 'n%s-%s %s %s\n' "$r$v" "$k" "/run/netns/${P}n$k" "$((30000 + k))"; done |
		driver_each del || die "DEL of the new pods failed: $(tail -3 "$B/driver-errors.log")"
	netns_batch del "${new[@]}"
	[ "$(records)/$(leases)/$(dnat_chains)" = 0/0/0 ] ||
		die "left after DEL: records/leases/DNAT chains $(records)/$(leases)/$(dnat_chains)"
}

# portmap's first ADDs in a fresh namespace race to create its top-level chains
# ("CHAIN_USER_ADD failed (File exists)"): one pod first, alone, and torn down.
ip netns add "${P}w"
echo "warm /run/netns/${P}w 19999" | driver_each add || die "warm-up ADD: $(tail -3 "$B/driver-errors.log")"
echo "warm /run/netns/${P}w 19999" | driver_each del || die "warm-up DEL: $(tail -3 "$B/driver-errors.log")"
ip netns del "${P}w"
log "cni-ledger under test: $LEDGER; load $(cut -d' ' -f1-3 /proc/loadavg)"
read -r -a vs <<<"$VARIANTS"
for n in $NS; do
	for ((r = 0; r < ROUNDS; r++)); do
		for ((j = 0; j < ${#vs[@]}; j++)); do
			v=${vs[$(((j + r) % ${#vs[@]}))]}
			storm "$v" "$n" "$r"
		done
	done
done
log "done; load $(cut -d' ' -f1-3 /proc/loadavg); gc waited for ADDs in flight: $(grep -c 'replays waited' "$B/gc.log" || true) runs"
grep -h 'replays waited\|the most it may' "$B/gc.log" | sed 's/^/[storm] gc: /' | sort | uniq -c | sort -rn | head -5 >&2 || true
python3 "$here/storm.py" report "$B"/results/*.tsv
[ -z "${KEEP:-}" ] || cp -r "$B/results" "$KEEP"
