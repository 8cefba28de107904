#!/usr/bin/env bash
# scripts/gen-link-order.sh: regenerate link/plugin-order.txt, the functions a plugin
# call runs, which build.rs hands to the linker (lld's --symbol-ordering-file) so that
# they sit together in the binary and an ADD faults in a few pages of code instead of
# pages spread over 3.5 MB (docs/EVIDENCE.md, "Code laid out for ADD").
#
#   sudo scripts/gen-link-order.sh     # as root (a netns); needs valgrind; ~1 min
#
# Symbol names carry hashes of the compiler and of each crate's version, so regenerate
# after a Rust toolchain or dependency upgrade: a stale file links fine and orders
# less (bench/add-floor.sh prints how many of its names the binary holds).
# Order of the file: the head's ADD (as on a node, with the conflist remembered: see
# src/plugin/conf_memo.rs), the tail's ADD, the tail's DEL, the head's DEL, then the
# head's ADD that loads the conflist in full; each adds the functions the ones before
# did not run.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
[ "$(id -u)" -eq 0 ] || { echo "gen-link-order: run as root (ip netns)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "gen-link-order: needs valgrind (apt-get install valgrind)" >&2; exit 1; }

host=$(rustc -vV | sed -n 's/^host: //p')
(cd "$repo" && RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
	cargo build --release --locked --target "$host" --bin cni-ledger >&2)
bin=$repo/target/$host/release/cni-ledger

W=$(mktemp -d /var/tmp/cl-link-order.XXXXXX)
NS=cl-order-$$
cleanup() { ip netns delete "$NS" 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
ip netns add "$NS"
mkdir -p "$W/conf"
head_conf='{"type":"cni-ledger","ledgerDir":"'$W/ledger'","confDir":"'$W/conf'","capabilities":{"portMappings":true}}'
tail_conf='{"type":"cni-ledger","role":"tail","ledgerDir":"'$W/ledger'"}'
cat >"$W/conf/10-ordernet.conflist" <<JSON
{"cniVersion":"1.1.0","name":"ordernet","plugins":[$head_conf,
 {"type":"portmap","capabilities":{"portMappings":true},"snat":false},
 $tail_conf]}
JSON
result='{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","mac":"aa:bb:cc:dd:ee:ff","sandbox":"/run/netns/'$NS'"}],"ips":[{"address":"198.18.7.2/24","gateway":"198.18.7.1","interface":0}],"dns":{}}'
runtime='"runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}'
# The entries as libcni hands them over: name and cniVersion added, prevResult after ADD's first.
entry() { printf '%s' "$1" | sed "s|^{|{\"cniVersion\":\"1.1.0\",\"name\":\"ordernet\",|; s|}\$|$2}|"; }
entry "$head_conf" ",$runtime" >"$W/head-add.json"
entry "$tail_conf" ",\"prevResult\":$result" >"$W/tail.json"
entry "$head_conf" ",$runtime,\"prevResult\":$result" >"$W/head-del.json"

# The conflist settles (older than the memo's 3 s), then an untraced ADD remembers it.
sleep 4
plugin() { CNI_CONTAINERID=$1 CNI_NETNS=/run/netns/$NS CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni "${@:2}"; }
CNI_COMMAND=ADD plugin order-warm "$bin" <"$W/head-add.json" >/dev/null
CNI_COMMAND=DEL plugin order-warm "$bin" <"$W/head-add.json" >/dev/null
memo=$(find "$W/ledger/snapshots" -name '.conf-memo.ordernet.*')
[ -n "$memo" ] || { echo "gen-link-order: the conflist was not remembered" >&2; exit 1; }

: >"$W/order"
for step in ADD:head-add ADD:tail DEL:tail DEL:head-del ADD:head-add-full; do
	[ "${step#*:}" != head-add-full ] || { rm "$memo"; step=ADD:head-add; }
	CNI_COMMAND=${step%%:*} plugin order0123456789 valgrind -q --tool=callgrind --demangle=no \
		--callgrind-out-file="$W/cg.out" "$bin" <"$W/${step#*:}.json" >"$W/out" ||
		{ echo "gen-link-order: $step failed: $(cat "$W/out")" >&2; exit 1; }
	grep -q '"code"' "$W/out" && { echo "gen-link-order: $step: $(cat "$W/out")" >&2; exit 1; }
	# Every function callgrind saw run, as the binary names it; new ones appended.
	grep -oP '^c?fn=\(\d+\) \K.+' "$W/cg.out" | sort -u |
		grep -vxFf "$W/order" >>"$W/order" || true
done
nm "$bin" | awk '{print $NF}' | sort -u >"$W/defined"
# Under valgrind the code runs as on valgrind's CPU model: glibc's string functions in
# their AVX2 variants, SHA-256 without the SHA extensions. Every variant of each goes in
# (~60 KB), so the one a node's CPU selects sits with the rest.
for base in $(grep -oP '^__\K(mem|str)[a-z0-9]+(?=_(sse|ssse3|avx|evex))' "$W/order" | sort -u); do
	case $base in memcpy | mempcpy) base=memmove ;; esac
	grep -E "^__(${base})_(sse|ssse3|avx|evex)" "$W/defined" || true
done >"$W/variants"
if grep -q 'sha2.*compress256' "$W/order"; then
	grep -E '^_ZN4sha26sha2563x86.*digest_blocks' "$W/defined" >>"$W/variants" || true
fi
grep -vxFf "$W/order" "$W/variants" | sort -u >>"$W/order" || true
grep -xFf "$W/defined" "$W/order" >"$repo/link/plugin-order.txt"
echo "gen-link-order: $(wc -l <"$repo/link/plugin-order.txt") functions in link/plugin-order.txt" >&2
