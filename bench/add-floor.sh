#!/usr/bin/env bash
# bench/add-floor.sh: one ledger ADD against its floor, by a harness of its own.
#
#   sudo bench/add-floor.sh            # ~1 min; ROUNDS=N (default 400), LEDGER=PATH
#   sudo ALT=PATH bench/add-floor.sh   # a second build timed beside it (add-alt) instead
#                                      # of the floor with a lock file
#   sudo THIRD=syscalls bench/add-floor.sh  # the floor making every system call of an
#                                      # ADD, in its order, and nothing else, as the third
#                                      # variant (floor-syscalls; bench/floor/floor.c)
#   sudo STEPS=1 bench/add-floor.sh    # then, after the timed rounds, ROUNDS runs of
#                                      # `floor --steps`: what each group of ADD's system
#                                      # calls takes, timed inside the process
#   sudo VARIANT=noconf bench/add-floor.sh  # the same build as add-alt, without one step:
#                                      # noconf (no conflist to find and snapshot: its
#                                      # confDir is empty), nons (CNI_NETNS names nothing,
#                                      # so no namespace identity is read)
#
# The floor (bench/floor/floor.c) is what a durable ADD cannot do without: exec of a
# static binary, then one small file made durable exactly as the ledger makes a record
# durable (temp 0600, write, fsync, rename, fsync of the directory). The ledger runs as
# install.sh builds it (static), as libcni calls it (its own conflist entry on stdin,
# default options, a real netns, a conflist to snapshot), with a new container ID for
# every ADD and nothing deleted in between, as on a node starting pods. bench/floor/
# add-floor.c spawns both (posix_spawn) in an order rotated every round and records wall
# and CPU time (user+sys of the child); the third variant is the floor plus one new lock
# file, the cost a lock file per key would add. Ratios: median(A)/median(B) with a 95%
# bootstrap interval over paired rounds (bench/stats.py). Files live under /var/tmp
# (persistent storage: on tmpfs fsync is free) and are removed on exit.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(dirname "$here")
[ "$(id -u)" -eq 0 ] || { echo "bench/add-floor.sh: run as root (ip netns)" >&2; exit 1; }
: "${ROUNDS:=400}"

B=$(mktemp -d /var/tmp/cl-add-floor.XXXXXX)
NS=cl-floor-$$
cleanup() { ip netns delete "$NS" 2>/dev/null || true; rm -rf "$B"; }
trap cleanup EXIT

if [ -z "${LEDGER:-}" ]; then
	host=$(rustc -vV | sed -n 's/^host: //p')
	(cd "$repo" && RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
		cargo build --release --locked --target "$host" --bin cni-ledger >&2)
	LEDGER=$repo/target/$host/release/cni-ledger
fi
cp "$LEDGER" "$B/cni-ledger" # a copy: a concurrent build must not swap it mid-run
# build.rs lays out these functions first; a toolchain upgrade renames them (hashes).
order=$repo/link/plugin-order.txt
echo "add-floor: $(nm "$B/cni-ledger" 2>/dev/null | awk '{print $NF}' | grep -cxFf - "$order" || true) of $(wc -l <"$order") functions of link/plugin-order.txt are in the binary" >&2
gcc -O2 -Wall -static -o "$B/floor" "$here/floor/floor.c"
gcc -O2 -Wall -o "$B/add-floor" "$here/floor/add-floor.c"
mkdir -p "$B/conf" "$B/floor-dir/locks"
ip netns add "$NS"
cat >"$B/conf/10-benchnet.conflist" <<JSON
{"cniVersion":"1.0.0","name":"benchnet","plugins":[
 {"type":"cni-ledger","ledgerDir":"$B/ledger","confDir":"$B/conf","capabilities":{"portMappings":true}},
 {"type":"bridge","bridge":"cbf0","isGateway":true,"ipam":{"type":"host-local","subnet":"198.18.9.0/24"}},
 {"type":"portmap","capabilities":{"portMappings":true},"snat":false}]}
JSON
printf '{"cniVersion":"1.0.0","name":"benchnet","type":"cni-ledger","ledgerDir":"%s","confDir":"%s","capabilities":{"portMappings":true},"runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}}\n' \
	"$B/ledger" "$B/conf" >"$B/stdin.json"

# As on a node, the conflist is older than the 3 s after which ADD trusts its memo of it
# (src/plugin/conf_memo.rs): the first ADD loads it in full, the rest recall it.
sleep 4

mkdir -p "$B/empty-conf"
sed "s|\"confDir\":\"$B/conf\"|\"confDir\":\"$B/empty-conf\"|" "$B/stdin.json" >"$B/stdin-noconf.json"
case "${VARIANT:-}" in
"") ;;
noconf) export ALT_STDIN=$B/stdin-noconf.json ;;
nons) export ALT_NETNS=/run/netns/cl-floor-none-such ;;
*) echo "bench/add-floor.sh: VARIANT is noconf or nons" >&2; exit 2 ;;
esac
[ -z "${VARIANT:-}" ] || : "${ALT:=$LEDGER}"

# What the ledger's ADD reads as the conflist's memo, for floor --syscalls: a file of its size.
mkdir -p "$B/floor-dir/records"
head -c 400 /dev/zero | tr '\0' m >"$B/floor-dir/memo"
third=floor-lock-file adds=1
if [ "${THIRD:-}" = syscalls ]; then
	third=floor-syscalls
elif [ -n "${THIRD:-}" ]; then
	echo "bench/add-floor.sh: THIRD is syscalls" >&2
	exit 2
fi
if [ -n "${ALT:-}" ]; then
	cp "$ALT" "$B/cni-ledger-alt"
	third=add-alt adds=2
fi
echo "add-floor: $ROUNDS rounds of add, floor, $third ($(file -b "$B/cni-ledger" | grep -o 'static[-a-z]* linked'))" >&2
"$B/add-floor" -n "$ROUNDS" -o "$B/samples.tsv" "$B/cni-ledger" "$B/stdin.json" \
	"/run/netns/$NS" "$B/floor" "$B/floor-dir" "$([ "$third" = add-alt ] && echo "$B/cni-ledger-alt" || echo "$third")"
[ "$(find "$B/ledger/records" -name '*.json' | wc -l)" -eq $(((ROUNDS + 10) * adds)) ] ||
	{ echo "add-floor: not every ADD left a record" >&2; exit 1; }
S=$repo/bench/stats.py
for v in add floor "$third"; do
	read -r med _ _ n _ cpu <<<"$(python3 "$S" med "$B/samples.tsv" "$v")"
	printf '%-16s wall %7.3f ms  cpu %7.3f ms  (n=%s)\n' "$v" "$med" "$cpu" "$n"
done
for pair in "add floor" "$third floor" "add $third"; do
	set -- $pair
	printf '%-30s wall %s  cpu %s\n' "$1 / $2" \
		"$(python3 "$S" ratio "$B/samples.tsv" "$1" "$2" | awk '{printf "%s [%s-%s]", $1, $2, $3}')" \
		"$(python3 "$S" ratio "$B/samples.tsv" "$1" "$2" cpu | awk '{printf "%s [%s-%s]", $1, $2, $3}')"
done
[ -z "${KEEP_SAMPLES:-}" ] || cp "$B/samples.tsv" "$KEEP_SAMPLES"
if [ -n "${STEPS:-}" ]; then
	for r in $(seq "$ROUNDS"); do
		CNI_NETNS=/run/netns/$NS "$B/floor" --steps "$B/floor-dir" "t$r" <"$B/stdin.json" \
			>/dev/null 2>>"$B/steps.tsv"
	done
	echo "ADD's system calls, timed inside floor --steps (after the rounds above):"
	python3 "$S" steps "$B/steps.tsv" "$(python3 "$S" med "$B/samples.tsv" floor | cut -d' ' -f1)"
fi
