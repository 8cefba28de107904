#!/usr/bin/env bash
# bench/nft-replay.sh — gc replaying N stale attachments against the same N DELs made one
# after another through libcni, on the reference plugins v1.10.x with their nftables
# backends, and with their iptables backends beside it for comparison.
#
#   sudo bench/nft-replay.sh              # N=500, both backends, 1 round: ~15 min on 2 cores
#   sudo N=50 bench/nft-replay.sh         # a quick run (numbers indicative)
#   sudo BACKENDS=nftables ROUNDS=2 bench/nft-replay.sh
#
# The chain, at cniVersion 1.1.0 (the v1.10 plugins from scripts/build-plugins.sh):
#
#   [cni-ledger, bridge (ipMasq, ipMasqBackend B) + host-local (a /20), portmap (backend B)]
#
# For each backend B and each side, in a fresh stand-in host network namespace:
#   1. N attachments made with real ADDs through libcni v1.3 (tests/driver built with
#      -tags cni13; 4 at a time), one network namespace each, a host port each, with
#      CNI_LEDGER_TEST_BOOT_ID set: their records are of another boot;
#   2. the namespaces deleted (the reboot; nobody ran DEL), and the veths left to go;
#   3. timed: either `cni-ledger gc --jobs $JOBS` (the boot change makes every record
#      stale; the default grace is bypassed) or a shell loop running the same N DELs
#      one after another through libcni (`cni-driver-1.3 del`, the recorded netns path,
#      the same portMappings), as a runtime would;
#   4. checked: no record, host-local address, portmap rule (nftables: rules of table
#      ip cni_hostport naming a container; iptables: CNI-DN- chains) left. Bridge's
#      masquerade rules are counted, not required gone: bridge's DEL removes its rule
#      only inside the pod's namespace, so neither side can (both leave all N).
# Sides alternate: round r runs gc first when r is odd, the loop first when it is even,
# and the backends alternate the same way. Prints one markdown table (stdout): wall and
# CPU (user+sys of the timed process tree) per run, and gc/sequential per backend
# (median of rounds), with the goal ≤ 0.50×.
#
# Settings (environment):
#   N=500          stale attachments per run (≤ 4000: one /20)
#   ROUNDS=1       the last round's number (each round: both sides of each backend)
#   START_ROUND=1  the first round's number (START_ROUND=2 ROUNDS=2: round 2 alone,
#                  whose order is the reverse of round 1's)
#   BACKENDS="nftables iptables"
#   JOBS=4         gc --jobs (src/gc/mod.rs DEFAULT_JOBS)
#   ADD_JOBS=4     parallel ADDs while setting up (not timed)
#   LEDGER_BIN     a cni-ledger built with --features testing (CNI_LEDGER_TEST_BOOT_ID);
#                  default: `cargo build --release --features testing` (CARGO_TARGET_DIR)
#   DRIVER_BIN     a libcni v1.3 driver already built (default: built from tests/driver)
#   PLUGINS_BIN    the v1.10 bin dir (default: scripts/build-plugins.sh's output)
#   BENCH_DIR      scratch dir on persistent storage (default /var/tmp/cni-ledger-nft.<pid>)
#   KEEP=1         keep BENCH_DIR
# Needs root, nft, iptables, ip, cargo, and target/libcni-1.3 + target/go-1.27
# (scripts/fetch-unstable.sh, as scripts/test.sh fetches them). Everything networked
# happens in namespaces the script makes (198.18.16.0/20) and is removed on exit.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)

: "${N:=500}" "${ROUNDS:=1}" "${START_ROUND:=1}" "${BACKENDS:=nftables iptables}" "${JOBS:=4}" "${ADD_JOBS:=4}"
: "${BENCH_DIR:=/var/tmp/cni-ledger-nft.$$}"
OLD_BOOT=00000000-0000-0000-0000-0000000b0011

log() { printf '[nft-replay %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}
# ROUNDS is the last round's number, not a count: START_ROUND=2 ROUNDS=1 would run nothing
# after the whole setup and then fail on an empty table.
((START_ROUND >= 1 && START_ROUND <= ROUNDS)) ||
	die "START_ROUND=$START_ROUND ROUNDS=$ROUNDS runs no round: ROUNDS is the last round's number (START_ROUND=2 ROUNDS=2 runs round 2)"

[ "$(id -u)" = 0 ] || die "run as root (network namespaces, bridges, nftables)"
for tool in ip nft iptables-save cargo python3; do
	command -v "$tool" >/dev/null || die "missing $tool"
done
[ "$N" -ge 1 ] && [ "$N" -le 4000 ] || die "N must be 1..4000 (one /20)"

tag=$$
B=$BENCH_DIR
HOST=clnft-$tag-host
NSP=clnft-$tag-p
ns_live=()

cleanup() {
	set +e
	if [ ${#ns_live[@]} -gt 0 ]; then
		printf 'netns del %s\n' "${ns_live[@]}" | ip -force -batch - 2>/dev/null
	fi
	[ -e "/run/netns/$HOST" ] && ip netns del "$HOST"
	if [ "${KEEP:-0}" = 1 ]; then log "kept $B"; else rm -rf "$B"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$B"

# ---------------------------------------------------------------------------- builds
PLUGINS=${PLUGINS_BIN:-$(bash "$repo/scripts/build-plugins.sh")}
for p in bridge host-local portmap; do
	[ -x "$PLUGINS/$p" ] || die "no $p in $PLUGINS (scripts/build-plugins.sh)"
done
pver=$(sed -n 's/.* version=\([^ ]*\) .*/\1/p' "$PLUGINS/.built" 2>/dev/null || echo "?")

LEDGER=${LEDGER_BIN:-}
if [ -z "$LEDGER" ]; then
	log "cargo build --release --features testing (for CNI_LEDGER_TEST_BOOT_ID)"
	(cd "$repo" && cargo build --release --features testing --quiet)
	LEDGER=${CARGO_TARGET_DIR:-$repo/target}/release/cni-ledger
fi
[ -x "$LEDGER" ] || die "no cni-ledger at $LEDGER"

for pkg in target/libcni-1.3 target/go-1.27; do
	[ -d "$repo/$pkg" ] || die "missing $pkg (scripts/fetch-unstable.sh; scripts/test.sh fetches it)"
done
DRIVER=${DRIVER_BIN:-}
if [ -z "$DRIVER" ]; then
	DRIVER=$B/cni-driver-1.3
	goroot=$repo/target/go-1.27/usr/lib/go-1.27
	log "building the libcni v1.3 driver (tests/driver, -tags cni13)"
	(cd "$repo" && GO111MODULE=off GOPATH=$repo/target/libcni-1.3/usr/share/gocode GOROOT=$goroot \
		GOTOOLCHAIN=local GOFLAGS= nice -n 19 "$goroot/bin/go" build -tags cni13 \
		-o "$DRIVER" ./tests/driver) || die "building the driver failed"
fi

BIN=$B/bin # the CNI bin dir: the ledger and the v1.10 plugins
mkdir -p "$BIN"
ln -sf "$LEDGER" "$BIN/cni-ledger"
for p in bridge host-local portmap; do ln -sf "$PLUGINS/$p" "$BIN/$p"; done

inhost() { ip netns exec "$HOST" "$@"; }

# ------------------------------------------------------------------ one world per run
# Sets up a fresh host namespace, ledger, IPAM dir, cache and conflist for backend $1.
world() {
	local backend=$1
	[ -e "/run/netns/$HOST" ] && ip netns del "$HOST"
	ip netns add "$HOST"
	inhost ip link set lo up
	rm -rf "$B/w"
	mkdir -p "$B/w/conf" "$B/w/ledger" "$B/w/cache" "$B/w/ipam"
	cat >"$B/w/conf/10-nftnet.conflist" <<EOF
{"cniVersion":"1.1.0","name":"nftnet","plugins":[
 {"type":"cni-ledger","ledgerDir":"$B/w/ledger","confDir":"$B/w/conf","capabilities":{"portMappings":true}},
 {"type":"bridge","bridge":"clnft$((tag % 100000))","isGateway":true,"ipMasq":true,"ipMasqBackend":"$backend",
  "ipam":{"type":"host-local","dataDir":"$B/w/ipam","ranges":[[{"subnet":"198.18.16.0/20"}]]}},
 {"type":"portmap","capabilities":{"portMappings":true},"backend":"$backend"}
]}
EOF
	# As on a node, the conflist is older than the 3 s after which ADD trusts its memo.
	touch -d '-10 seconds' "$B/w/conf/10-nftnet.conflist"
}

records() { find "$B/w/ledger/records" -maxdepth 1 -name '*.json' 2>/dev/null | wc -l; }
leases() { find "$B/w/ipam/nftnet" -maxdepth 1 -name '198.18.*' 2>/dev/null | wc -l; }
# portmap's rules naming a container (its comment is the ID), or its DNAT chains.
pm_rules() {
	if [ "$1" = nftables ]; then
		{ inhost nft list table ip cni_hostport 2>/dev/null || true; } | grep -cE '(dnat to|masquerade) .*comment "' || true
	else
		inhost iptables-save -t nat | grep -c '^:CNI-DN-' || true
	fi
}
masq_rules() {
	if [ "$1" = nftables ]; then
		{ inhost nft list table inet cni_plugins_masquerade 2>/dev/null || true; } | grep -c 'masquerade comment' || true
	else
		inhost iptables-save -t nat | grep -c '^-A CNI-[0-9a-f]* .*-j MASQUERADE' || true
	fi
}

# N ADDs through libcni with the old boot's ID, then the namespaces deleted.
setup_stale() {
	local backend=$1 k waited=0
	world "$backend"
	ns_live=()
	for ((k = 0; k < N; k++)); do ns_live+=("$NSP$k"); done
	printf 'netns add %s\n' "${ns_live[@]}" | ip -batch -
	for ((k = 0; k < N; k++)); do
		printf 'c%s-%s /run/netns/%s%s %s\n' "$tag" "$k" "$NSP" "$k" "$((20000 + k))"
	done | CNI_LEDGER_TEST_BOOT_ID=$OLD_BOOT inhost xargs -P "$ADD_JOBS" -L 1 sh -c '
		"$0" add --conf-dir "$1" --net nftnet --cid "$4" --ifname eth0 --netns "$5" \
			--cni-path "$2" --cache-dir "$3" \
			--cap-args "{\"portMappings\":[{\"hostPort\":$6,\"containerPort\":80,\"protocol\":\"tcp\"}]}" \
			>/dev/null 2>>"$3/../add-errors.log"' \
		"$DRIVER" "$B/w/conf" "$BIN" "$B/w/cache" ||
		die "ADD of the stale set failed: $(tail -3 "$B/w/add-errors.log")"
	# portmap: with nftables a DNAT rule and two masquerade rules (snat) per pod, with
	# iptables a DNAT chain per pod.
	local want="$N/$N/$N" have
	[ "$backend" != nftables ] || want="$N/$N/$((3 * N))"
	have="$(records)/$(leases)/$(pm_rules "$backend")"
	[ "$have" = "$want" ] || die "$backend: expected records/leases/portmap rules $want, have $have"
	grep -q "$OLD_BOOT" "$(find "$B/w/ledger/records" -name '*.json' | head -1)" ||
		die "the records are not of the old boot (is $LEDGER built with --features testing?)"
	printf 'netns del %s\n' "${ns_live[@]}" | ip -batch -
	ns_live=()
	# The veths leave the bridge as the kernel tears the namespaces down: not timed.
	while [ "$(inhost ip -o link show master "clnft$((tag % 100000))" 2>/dev/null | wc -l)" != 0 ] &&
		[ $waited -lt 600 ]; do
		sleep 0.1
		waited=$((waited + 1))
	done
	sync -f "$B"
}

# Runs "$@" in the host namespace; sets WALL (ms) and CPU (ms, user+sys of its tree).
timed() {
	local t0 t1
	t0=$(date +%s%N)
	local out
	out=$( { TIMEFORMAT='%U %S'; time inhost "$@" >"$B/w/timed.out" 2>"$B/w/timed.err"; } 2>&1) ||
		die "timed run failed: $(tail -5 "$B/w/timed.err")"
	t1=$(date +%s%N)
	WALL=$(((t1 - t0) / 1000000))
	CPU=$(awk -v u="${out% *}" -v s="${out#* }" 'BEGIN { printf "%d", (u + s) * 1000 }')
}

run_gc() {
	timed "$LEDGER" gc --ledger-dir "$B/w/ledger" --cni-cache-dir "$B/w/cache" --jobs "$JOBS" --yield-max 0 --json
}

run_loop() {
	cat >"$B/w/del-loop.sh" <<EOF
for ((k = 0; k < $N; k++)); do
	"$DRIVER" del --conf-dir "$B/w/conf" --net nftnet --cid "c$tag-\$k" --ifname eth0 \\
		--netns "/run/netns/$NSP\$k" --cni-path "$BIN" --cache-dir "$B/w/cache" \\
		--cap-args "{\"portMappings\":[{\"hostPort\":\$((20000 + k)),\"containerPort\":80,\"protocol\":\"tcp\"}]}" || exit 1
done
EOF
	timed bash "$B/w/del-loop.sh"
}

declare -A RES # "<backend> <side> <round>" -> "wall cpu left"
measure() { # backend side round
	local backend=$1 side=$2 r=$3
	log "$backend r$r: $N stale attachments (ADD through libcni v1.3, old boot, netns deleted)"
	setup_stale "$backend"
	local l0
	l0=$(cut -d' ' -f1 /proc/loadavg)
	log "$backend r$r: timing $side"
	if [ "$side" = gc ]; then run_gc; else run_loop; fi
	local left
	left="$(records)/$(leases)/$(pm_rules "$backend")"
	RES["$backend $side $r"]="$WALL $CPU $left $(masq_rules "$backend") $l0→$(cut -d' ' -f1 /proc/loadavg)"
	log "$backend r$r: $side $WALL ms wall, $CPU ms CPU; left records/addresses/portmap rules $left"
	[ "$left" = 0/0/0 ] || log "  WARNING: $side left $left"
}

s() { awk -v ms="$1" 'BEGIN { printf "%.3f", ms / 1000 }'; }
read -r -a backends <<<"$BACKENDS"
start=$(date +%s)
for ((r = START_ROUND; r <= ROUNDS; r++)); do
	order=("${backends[@]}")
	if ((r % 2 == 0)); then order=($(printf '%s\n' "${backends[@]}" | tac)); fi
	for be in "${order[@]}"; do
		if ((r % 2 == 1)); then sides=(gc loop); else sides=(loop gc); fi
		for side in "${sides[@]}"; do measure "$be" "$side" "$r"; done
	done
done

# ------------------------------------------------------------------------- table
echo
echo "bench/nft-replay.sh: N=$N, ROUNDS=$ROUNDS, gc --jobs $JOBS, plugins $pver, kernel $(uname -r), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), $(($(date +%s) - start)) s"
echo
echo "| backend | round | gc wall | gc CPU | sequential DELs wall | sequential CPU | gc/seq wall | gc/seq CPU | left after gc / seq (records/addresses/portmap rules) | bridge masq rules left gc / seq | load 1 min gc; seq |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for be in "${backends[@]}"; do
	ratios=()
	for ((r = START_ROUND; r <= ROUNDS; r++)); do
		read -r gw gcpu gleft gmasq gload <<<"${RES["$be gc $r"]}"
		read -r lw lcpu lleft lmasq lload <<<"${RES["$be loop $r"]}"
		rw=$(python3 -c 'import sys; print("%.3f" % (int(sys.argv[1]) / int(sys.argv[2])))' "$gw" "$lw")
		rc=$(python3 -c 'import sys; print("%.3f" % (int(sys.argv[1]) / max(1, int(sys.argv[2]))))' "$gcpu" "$lcpu")
		ratios+=("$rw")
		printf '| %s | %s | %.2f s | %.2f s | %.2f s | %.2f s | %s× | %s× | %s / %s | %s / %s | %s; %s |\n' \
			"$be" "$r" "$(s "$gw")" "$(s "$gcpu")" "$(s "$lw")" "$(s "$lcpu")" "$rw" "$rc" \
			"$gleft" "$lleft" "$gmasq" "$lmasq" "$gload" "$lload"
	done
	med=$(printf '%s\n' "${ratios[@]}" | sort -g | python3 -c 'import sys; v = [float(x) for x in sys.stdin]; n = len(v); print("%.3f" % (v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2))')
	verdict=$(python3 -c 'import sys; print("ok" if float(sys.argv[1]) <= 0.5 else "MISS")' "$med")
	echo "| **$be** | median | | | | | **$med×** | | goal ≤ 0.50×: $verdict | | |"
done
