#!/usr/bin/env bash
# bench/run.sh — cni-ledger performance benchmark (issue 4).
#
#   sudo bench/run.sh            # full run, ~8 min on a 2-core VM (row 6 idles 2 min)
#   sudo QUICK=1 bench/run.sh    # smoke version, ~1 min (small counts; numbers indicative)
#   sudo ONLY=4,5 bench/run.sh   # just some of the measurements
#
# Needs root (network namespaces, bridge, iptables), cargo, gcc, python3, Debian's
# golang-go + golang-github-appc-cni-dev (for the libcni driver tests/driver/main.go) and
# containernetworking-plugins (/usr/lib/cni). Everything networked happens inside a
# "host" network namespace the script creates (198.18.0.0/15 addresses only); all
# namespaces and files it creates are removed on exit (KEEP=1 keeps the files).
#
# What it measures, each comparison side by side in one run (the machine is noisy: the
# ratios are the result, not the absolute times):
#   1. one ledger ADD (exec of cni-ledger, CNI_COMMAND=ADD, the ledger's own stdin as
#      libcni passes it, a real netns, a fresh container ID every run, a DEL after each
#      run outside the timing so the ledger stays at 10 records) against
#        - exec of a Go plugin doing nothing: /usr/lib/cni/host-local, CNI_COMMAND=VERSION
#        - the floor: exec of bench/durable-write.c, one process making one 600-byte file
#          durable exactly as the ledger does (temp 0600 + write + fsync + rename + fsync
#          of the directory), unlinked + dir-fsynced after each run outside the timing
#      (/bin/true, `cni-ledger` VERSION, a static C program doing nothing and a static
#      program with no C library, bench/floor/nolibc.c, are timed too: the exec and
#      start-up share; bench/floor/cpuid.c times one `cpuid`, the C library's start-up's
#      probe of the CPU, a trap to the hypervisor in a VM).
#   2. a real chain ADD through libcni (tests/driver/main.go): [bridge+host-local, portmap]
#      with and without cni-ledger first, with a portMappings capability arg; libcni DEL
#      after each ADD, outside the timing; the same container netns for all variants.
#      Context: the chain with a do-nothing C plugin (bench/noop-plugin.c) first instead,
#      which is what any extra plugin costs libcni. 2c: the same chain with the ledger's
#      head and its tail entry (docs/CHAIN.md) vs the head alone: what the tail costs.
#      2d: the head with a do-nothing C plugin last instead of the tail (what libcni charges
#      any last entry); 2e: a C plugin last that rewrites one file as the tail writes its
#      note, unflushed (noop-plugin.c -DREWRITE), over an existing file as its DEL does;
#      2f: the same with an fsync before the rename (-DREWRITE_SYNC): what one durable
#      write costs in a chain;
#      2g: 2e's plugin writing on a tmpfs the script mounts: the write without the disk;
#      2h: the tail's floor, a static C program doing the tail's ADD (noop-plugin.c
#      -DTAIL_DIR: prevResult printed back, a new file per attachment, unflushed).
#   3. ledger ADD with 100,000 existing records vs. with 10 (records made by
#      bench/gen_records.py: valid, checksummed, correctly named, with their lock files).
#   4. `cni-ledger gc --grace 0 --jobs $GC_JOBS` replaying N stale attachments (ADD
#      through libcni with the ledger first, [ledger, bridge+host-local, portmap], one
#      netns each, then the namespaces deleted without DEL) vs. a sequential shell loop of
#      libcni DEL (`cni-driver del`, the same chain) over N attachments set up identically.
#      Both checked afterwards: no record, host-local lease or portmap DNAT chain left.
#   5. `cni-ledger gc` (nothing stale), `cni-ledger list` and `list --json` (to a file) over
#      100,000 and 10,000 live records (netns = a namespace the script made, with its real
#      dev/inode, this boot's ID): wall time and peak RSS (wait4 rusage, the number
#      `/usr/bin/time -v` prints as "Maximum resident set size"); page cache warm.
#   6. the node agent (bench/agent_bench.py): time from a conflist rewrite (plain write or
#      rename) to the ledger being first again; idle RSS and CPU per hour with the default
#      intervals. ALT_LEDGER=<the previous build> adds row 1f: ADD of this build vs that
#      one, side by side (the agent must leave ADD unchanged).
#
# Timing is done by bench/harness.c: it execs each variant in turn (order rotated every
# round) with a fresh "{i}" per run, runs an untimed reset command after each, and
# records wall time, CPU time (user+sys, waited-for children included) and peak RSS.
# (hyperfine is not used: it times one command at a time, so variants would not be
# interleaved on a machine whose load changes by the minute.)
# Medians are reported; a ratio is median(A)/median(B) with a 95% bootstrap interval
# over paired rounds (bench/stats.py). The verdict uses the wall-time ratio; the CPU
# ratio is shown beside it because on a loaded machine queueing delay is added to every
# variant alike and pulls wall ratios towards 1.
#
# Settings (environment):
#   QUICK=1          small counts (below)                        default: full
#   ONLY=LIST        comma list of measurements to run (1..6)    1,2,3,4,5,6
#   AGENT_IDLE=S     idle seconds measured for 6                 120   (QUICK 20)
#   AGENT_REWRITES=N conflist rewrites timed for 6               100   (QUICK 20)
#   RUNS_EXEC=N      rounds for 1 and 3                          600   (QUICK 80)
#   RUNS_CHAIN=N     rounds for 2                                150   (QUICK 15)
#   GC_N=N           stale attachments for 4 (>= 500 claimed)    500   (QUICK 40)
#   GC_JOBS=J        gc --jobs for 4 and 5                       4
#   TRACE4=1         trace 4's runs: which programs their time went to (perf)
#   BIG=N MID=N      live records for 5 (BIG also for 3)         100000 / 10000 (QUICK 20000 / 2000)
#   RUNS_BIG=N       rounds for 5                                5     (QUICK 2)
#   ALT_LEDGER=PATH  a second cni-ledger binary (e.g. a static build) timed in 1 as well
#   BENCH_DIR=DIR    scratch dir on persistent storage (not tmpfs: fsync must be real)
#                    default /var/tmp/cni-ledger-bench.<pid>
#   NO_BUILD=1       no cargo build: use LEDGER_BIN, else target/release/cni-ledger (dynamic)
#   LEDGER_BIN=PATH  the cni-ledger binary to measure (default: the static release build)
#   KEEP=1           keep BENCH_DIR (raw samples: $BENCH_DIR/results/*.tsv)
#
# Output: progress on stderr, then ONE markdown table on stdout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)

if [ "${QUICK:-0}" = 1 ]; then
	: "${RUNS_EXEC:=80}" "${RUNS_CHAIN:=15}" "${GC_N:=40}" "${BIG:=20000}" "${MID:=2000}" "${RUNS_BIG:=2}"
else
	: "${RUNS_EXEC:=600}" "${RUNS_CHAIN:=150}" "${GC_N:=500}" "${BIG:=100000}" "${MID:=10000}" "${RUNS_BIG:=5}"
fi
: "${GC_JOBS:=4}" "${ONLY:=1,2,3,4,5,6}"
if [ "${QUICK:-0}" = 1 ]; then
	: "${AGENT_IDLE:=20}" "${AGENT_REWRITES:=20}"
else
	: "${AGENT_IDLE:=120}" "${AGENT_REWRITES:=100}"
fi
: "${BENCH_DIR:=/var/tmp/cni-ledger-bench.$$}"
want() { [[ ",$ONLY," == *",$1,"* ]]; }

log() { printf '[bench %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

[ "$(id -u)" = 0 ] || die "run as root (network namespaces, bridges, iptables)"
for tool in cargo gcc python3 go ip iptables-save; do
	command -v "$tool" >/dev/null || die "missing $tool"
done
[ -x /usr/lib/cni/bridge ] || die "missing /usr/lib/cni (containernetworking-plugins)"
[ -d /usr/share/gocode/src/github.com/containernetworking/cni/libcni ] ||
	die "missing libcni source (golang-github-appc-cni-dev)"
[ -z "${ALT_LEDGER:-}" ] || [ -x "$ALT_LEDGER" ] || die "ALT_LEDGER=$ALT_LEDGER is not executable"
[ "$GC_N" -le 4000 ] || die "GC_N must be <= 4000 (one /20)"

start_all=$(date +%s)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
# The 1-minute load average at the start and end of each measurement, shown beside its
# rows: a ratio from a loaded minute is pulled towards 1.
declare -A LOAD
load_now() { cut -d' ' -f1 /proc/loadavg; }
load_begin() { load_at=$(load_now); }
load_end() { local m; for m in "$@"; do LOAD[$m]="$load_at → $(load_now)"; done; }
tag=$$
B=$BENCH_DIR
build=$repo/target/bench
HOST=clbench-$tag-host # the stand-in host netns: bridges and iptables live here
C1=clbench-$tag-c1     # container netns for 1–3
LIVE=clbench-$tag-live # the namespace the live records of 5 point at
GCP=clbench-$tag-g     # prefix of the per-attachment namespaces of 4
gc_ns_live=()          # namespaces of 4 still present (for cleanup)

cleanup() {
	set +e
	if [ ${#gc_ns_live[@]} -gt 0 ]; then
		printf 'netns del %s\n' "${gc_ns_live[@]}" | ip -force -batch - 2>/dev/null
	fi
	for ns in "$C1" "$LIVE" "$HOST"; do
		[ -e "/run/netns/$ns" ] && ip netns del "$ns"
	done
	mountpoint -q "$B/tmpfs" 2>/dev/null && umount "$B/tmpfs"
	if [ "${KEEP:-0}" = 1 ]; then
		log "kept $B"
	else
		rm -rf "$B"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------- build
mkdir -p "$build"
LEDGER=${LEDGER_BIN:-}
if [ "${NO_BUILD:-0}" != 1 ]; then
	# The binary as install.sh builds it: static, for the host target.
	host=$(rustc -vV | sed -n 's/^host: //p')
	log "cargo build --release --target $host (static, as install.sh builds it)"
	built=$(cd "$repo" && RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static -C relocation-model=static" \
		cargo build --release --target "$host" --quiet --message-format=json-render-diagnostics |
		python3 -c '
import json, sys
exe = ""
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cni-ledger":
        exe = m["executable"]
print(exe)')
	: "${LEDGER:=$built}"
fi
: "${LEDGER:=$repo/target/release/cni-ledger}"
[ -x "$LEDGER" ] || die "no $LEDGER"
# How much of build.rs's function order the binary holds: a list left stale by a code
# change or a toolchain upgrade links fine and orders less (docs/EVIDENCE.md).
order=$repo/link/plugin-order.txt
ordered="$(nm "$LEDGER" 2>/dev/null | awk '{print $NF}' | grep -cxFf - "$order" || true) of $(wc -l <"$order")"
log "cni-ledger under test: $LEDGER ($(file -b "$LEDGER" 2>/dev/null | grep -o 'dynamically linked\|static-pie linked\|statically linked' || echo '?'))"
gcc -O2 -Wall -o "$build/harness" "$here/harness.c"
gcc -O2 -Wall -o "$build/durable-write" "$here/durable-write.c"
gcc -O2 -Wall -o "$build/noop-plugin" "$here/noop-plugin.c"
# The same floor statically linked (no dynamic loader): context for a static cni-ledger.
gcc -O2 -Wall -static -o "$build/durable-write-static" "$here/durable-write.c" 2>/dev/null ||
	rm -f "$build/durable-write-static"
# The C library's start-up alone: a static C program doing nothing, against a static
# program with no C library at all; and what one of the `cpuid`s glibc's start makes costs.
printf 'int main(void) { return 0; }\n' | gcc -O2 -static -x c -o "$build/libc-static" - 2>/dev/null ||
	rm -f "$build/libc-static"
gcc -O2 -Wall -static -nostdlib -o "$build/nolibc" "$here/floor/nolibc.c"
gcc -O2 -Wall -o "$build/cpuid" "$here/floor/cpuid.c"
if [ ! -x "$build/cni-driver" ] || [ -n "$(find "$repo/tests/driver" -newer "$build/cni-driver" -print -quit)" ]; then
	log "building the libcni driver"
	(cd "$repo" && GO111MODULE=off GOPATH=/usr/share/gocode go build -o "$build/cni-driver" ./tests/driver)
fi
HARNESS=$build/harness
DRIVER=$build/cni-driver
DW=$build/durable-write

# ---------------------------------------------------------------------------- world
rm -rf "$B"
mkdir -p "$B"/{results,bin,cache,floor,conf-m1,conf-l,conf-p,conf-g,conf-t,conf-x,conf-w,conf-s,conf-r,conf-c,ipam}
chmod 700 "$B"
R=$B/results
# A copy, not a symlink: a concurrent `cargo build` must not swap the binary mid-run.
cp "$LEDGER" "$B/bin/cni-ledger"
LEDGER=$B/bin/cni-ledger
cp "$build/noop-plugin" "$B/bin/noop"
mkdir -p "$B/rewrite"
gcc -O2 -Wall -DREWRITE="\"$B/rewrite/record.json\"" -o "$B/bin/rewrite" "$here/noop-plugin.c"
gcc -O2 -Wall -DREWRITE_SYNC -DREWRITE="\"$B/rewrite/synced.json\"" -o "$B/bin/rewrite-sync" "$here/noop-plugin.c"
# 2g's file is on a tmpfs of its own: the same write without a disk file system.
mkdir -p "$B/tmpfs"
mount -t tmpfs -o size=1m,mode=700 cni-ledger-bench "$B/tmpfs"
gcc -O2 -Wall -DREWRITE="\"$B/tmpfs/record.json\"" -o "$B/bin/rewrite-tmpfs" "$here/noop-plugin.c"
# 2h: the tail's ADD in C, linked statically as cni-ledger is.
mkdir -p "$B/ctail"
gcc -O2 -Wall -static -DTAIL_DIR="\"$B/ctail\"" -o "$B/bin/ctail" "$here/noop-plugin.c"
CNI_PATH_ALL=$B/bin:/usr/lib/cni

ip netns add "$HOST"
ip netns exec "$HOST" ip link set lo up
ip netns add "$C1"
ip netns add "$LIVE"
inhost() { ip netns exec "$HOST" "$@"; }

PM='{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}'
PORTMAP='{"type":"portmap","capabilities":{"portMappings":true},"snat":false}'
ledger_entry() { # ledgerDir confDir
	printf '{"type":"cni-ledger","ledgerDir":"%s","confDir":"%s","capabilities":{"portMappings":true}}' "$1" "$2"
}
bridge_entry() { # bridge subnet
	printf '{"type":"bridge","bridge":"%s","isGateway":true,"ipMasq":false,"ipam":{"type":"host-local","dataDir":"%s","ranges":[[{"subnet":"%s"}]]}}' \
		"$1" "$B/ipam" "$2"
}
conflist() { # name plugins...
	local name=$1
	shift
	local IFS=,
	printf '{"cniVersion":"1.0.0","name":"%s","plugins":[%s]}\n' "$name" "$*"
}

# 1/3/5: network "benchnet"; the ledgers differ only in how many records they hold.
conflist benchnet "$(ledger_entry "$B/ledger10" "$B/conf-m1")" "$(bridge_entry cbm$tag 198.18.2.0/24)" "$PORTMAP" \
	>"$B/conf-m1/10-benchnet.conflist"
ledger_stdin() { # ledgerDir -> what libcni hands the ledger (its entry + name, version, runtimeConfig)
	printf '{"cniVersion":"1.0.0","name":"benchnet","type":"cni-ledger","ledgerDir":"%s","confDir":"%s","capabilities":{"portMappings":true},"runtimeConfig":%s}\n' \
		"$1" "$B/conf-m1" "$PM"
}
ledger_stdin "$B/ledger10" >"$B/add-10.json"
ledger_stdin "$B/ledger-big" >"$B/add-big.json"
echo '{"cniVersion":"1.0.0"}' >"$B/version.json"
# 2: the same chain with and without the ledger, each with its own bridge and /24.
conflist chainl "$(ledger_entry "$B/ledger-chain" "$B/conf-l")" "$(bridge_entry cbl$tag 198.18.0.0/24)" "$PORTMAP" \
	>"$B/conf-l/10-chainl.conflist"
conflist chainp "$(bridge_entry cbp$tag 198.18.1.0/24)" "$PORTMAP" >"$B/conf-p/10-chainp.conflist"
# ... with the ledger's head and its tail (2c),
conflist chaint "$(ledger_entry "$B/ledger-tail" "$B/conf-t")" "$(bridge_entry cbt$tag 198.18.4.0/24)" "$PORTMAP" \
	"$(printf '{"type":"cni-ledger","role":"tail","ledgerDir":"%s"}' "$B/ledger-tail")" \
	>"$B/conf-t/10-chaint.conflist"
# ... with the head and a do-nothing C plugin last (2d): what libcni charges any last
# entry, the tail's floor,
conflist chainx "$(ledger_entry "$B/ledger-x" "$B/conf-x")" "$(bridge_entry cbx$tag 198.18.5.0/24)" "$PORTMAP" \
	'{"type":"noop"}' >"$B/conf-x/10-chainx.conflist"
# ... with the head and a C plugin last that rewrites one file as the tail writes its note (2e),
conflist chainw "$(ledger_entry "$B/ledger-w" "$B/conf-w")" "$(bridge_entry cbw$tag 198.18.6.0/24)" "$PORTMAP" \
	'{"type":"rewrite"}' >"$B/conf-w/10-chainw.conflist"
# ... and one that makes that rewrite durable (2f),
conflist chains "$(ledger_entry "$B/ledger-s" "$B/conf-s")" "$(bridge_entry cbs$tag 198.18.7.0/24)" "$PORTMAP" \
	'{"type":"rewrite-sync"}' >"$B/conf-s/10-chains.conflist"
# ... and one whose unflushed rewrite is on tmpfs (2g),
conflist chainr "$(ledger_entry "$B/ledger-r" "$B/conf-r")" "$(bridge_entry cbr$tag 198.18.8.0/24)" "$PORTMAP" \
	'{"type":"rewrite-tmpfs"}' >"$B/conf-r/10-chainr.conflist"
# ... and one with the tail's ADD done by a static C program (2h),
conflist chainc "$(ledger_entry "$B/ledger-c" "$B/conf-c")" "$(bridge_entry cbc$tag 198.18.9.0/24)" "$PORTMAP" \
	'{"type":"ctail"}' >"$B/conf-c/10-chainc.conflist"
# ... and with a do-nothing C plugin in the ledger's place: libcni's cost of one more plugin.
mkdir -p "$B/conf-n"
conflist chainn '{"type":"noop"}' "$(bridge_entry cbn$tag 198.18.3.0/24)" "$PORTMAP" >"$B/conf-n/10-chainn.conflist"
# 4: room for GC_N addresses.
conflist gcnet "$(ledger_entry "$B/ledger-gc" "$B/conf-g")" "$(bridge_entry cbg$tag 198.18.16.0/20)" "$PORTMAP" \
	>"$B/conf-g/10-gcnet.conflist"
# As on a node, the conflists are older than the 3 s after which ADD trusts its memo of
# them (src/plugin/conf_memo.rs); each ledger's first ADD loads its conflist in full.
sleep 4

# ------------------------------------------------------------------- record fixtures
gen() { # dir count
	python3 "$here/gen_records.py" "$1" "$2" benchnet "/run/netns/$LIVE" "$B/conf-m1/10-benchnet.conflist"
}
if want 1 || want 3 || want 5; then
	t0=$(date +%s%N)
	log "generating live ledgers: 10, $BIG$(want 5 && echo " and $MID") records"
	gen "$B/ledger10" 10
	gen "$B/ledger-big" "$BIG"
	if want 5; then gen "$B/ledger-mid" "$MID"; fi
	sync -f "$B"
	log "  done in $((($(date +%s%N) - t0) / 1000000)) ms"
	"$LEDGER" verify --ledger-dir "$B/ledger10" >/dev/null 2>&1 ||
		die "generated records do not verify: $("$LEDGER" verify --ledger-dir "$B/ledger10" 2>&1 | tail -3)"
fi

# ------------------------------------------------------------------ spec helpers
spec_ledger() { # name binary stdin cid-prefix netns
	cat <<EOF
variant $1
arg $2
stdin $3
env CNI_COMMAND=ADD
env CNI_CONTAINERID=$4{i}
env CNI_NETNS=$5
env CNI_IFNAME=eth0
env CNI_PATH=$CNI_PATH_ALL
post-arg $2
post-stdin $3
post-env CNI_COMMAND=DEL
post-env CNI_CONTAINERID=$4{i}
post-env CNI_NETNS=$5
post-env CNI_IFNAME=eth0
post-env CNI_PATH=$CNI_PATH_ALL
EOF
}
spec_driver() { # name confdir net cid-prefix
	local common="--conf-dir $2 --net $3 --cid $4{i} --ifname eth0 --netns /run/netns/$C1 --cni-path $CNI_PATH_ALL --cache-dir $B/cache --cap-args $PM"
	echo "variant $1"
	echo "arg $DRIVER"
	echo "arg add"
	for a in $common; do echo "arg $a"; done
	echo "post-arg $DRIVER"
	echo "post-arg del"
	for a in $common; do echo "post-arg $a"; done
}
spec_cli() { # name args...
	echo "variant $1"
	shift
	echo "arg $LEDGER"
	for a in "$@"; do echo "arg $a"; done
}

# ------------------------------------------------------------- 1 + 3: exec-level ADD
if want 1 || want 3; then
	load_begin
	log "1+3: ledger ADD vs Go plugin vs floor, 10 vs $BIG records ($RUNS_EXEC rounds)"
	{
		spec_ledger add-10 "$LEDGER" "$B/add-10.json" "b$tag-" "/run/netns/$C1"
		spec_ledger add-big "$LEDGER" "$B/add-big.json" "b$tag-" "/run/netns/$C1"
		if [ -n "${ALT_LEDGER:-}" ]; then
			cp "$ALT_LEDGER" "$B/bin/cni-ledger-alt"
			spec_ledger add-10-alt "$B/bin/cni-ledger-alt" "$B/add-10.json" "a$tag-" "/run/netns/$C1"
			printf 'variant ledger-version-alt\narg %s\nstdin %s\nenv CNI_COMMAND=VERSION\n' \
				"$B/bin/cni-ledger-alt" "$B/version.json"
		fi
		cat <<EOF
variant go-version
arg /usr/lib/cni/host-local
stdin $B/version.json
env CNI_COMMAND=VERSION
variant floor
arg $DW
arg $B/floor
arg f{i}
arg 600
post-arg $DW
post-arg --rm
post-arg $B/floor
post-arg f{i}
$([ -x "$DW-static" ] && printf 'variant floor-static\narg %s\narg %s\narg s{i}\narg 600\npost-arg %s\npost-arg --rm\npost-arg %s\npost-arg s{i}\n' "$DW-static" "$B/floor" "$DW" "$B/floor")
variant true
arg /bin/true
variant nolibc
arg $build/nolibc
$([ -x "$build/libc-static" ] && printf 'variant libc-static\narg %s\n' "$build/libc-static")
variant ledger-version
arg $LEDGER
stdin $B/version.json
env CNI_COMMAND=VERSION
EOF
	} >"$B/spec-exec"
	"$HARNESS" -n "$RUNS_EXEC" -w 10 -o "$R/exec.tsv" "$B/spec-exec"
	[ "$(find "$B/ledger10/records" -name '*.json' | wc -l)" = 10 ] || die "ledger10 did not return to 10 records"
	load_end 1 3
fi

# ----------------------------------------------------------------------- 5: gc/list
if want 5; then
	load_begin
	log "5: gc and list over $BIG and $MID live records ($RUNS_BIG rounds)"
	{
		for n in big mid; do
			spec_cli "gc-$n" gc --ledger-dir "$B/ledger-$n" --grace 0 --jobs "$GC_JOBS" --cni-cache-dir "$B/cache"
			spec_cli "list-$n" list --ledger-dir "$B/ledger-$n"
			spec_cli "listjson-$n" list --json --ledger-dir "$B/ledger-$n"
		done
	} >"$B/spec-big"
	inhost "$HARNESS" -n "$RUNS_BIG" -w 1 -o "$R/big.tsv" "$B/spec-big"
	live_big=$(inhost "$LEDGER" gc --ledger-dir "$B/ledger-big" --grace 0 --json --cni-cache-dir "$B/cache" 2>/dev/null |
		python3 -c 'import json,sys; s=json.load(sys.stdin)["summary"]; print(s["live"], s["stale"])')
	[ "$live_big" = "$BIG 0" ] || die "the big ledger is not $BIG live / 0 stale: $live_big"
	load_end 5
fi

# ------------------------------------------------------------------- 6: the agent
if want 6; then
	load_begin
	log "6: the agent: $AGENT_REWRITES rewrites, then ${AGENT_IDLE}s idle"
	inhost python3 "$here/agent_bench.py" "$LEDGER" "$B/agent" "$AGENT_IDLE" "$AGENT_REWRITES" >"$R/agent.rows"
	load_end 6
fi

# ----------------------------------------------------------------- 2: chain ADD
if want 2; then
	load_begin
	log "2: chain ADD through libcni with and without the ledger ($RUNS_CHAIN rounds)"
	{
		spec_driver chain-ledger "$B/conf-l" chainl "l$tag-"
		spec_driver chain-plain "$B/conf-p" chainp "p$tag-"
		spec_driver chain-noop "$B/conf-n" chainn "n$tag-"
		spec_driver chain-tail "$B/conf-t" chaint "t$tag-"
		spec_driver chain-lastnoop "$B/conf-x" chainx "x$tag-"
		spec_driver chain-lastwrite "$B/conf-w" chainw "w$tag-"
		spec_driver chain-lastsync "$B/conf-s" chains "s$tag-"
		spec_driver chain-lasttmpfs "$B/conf-r" chainr "r$tag-"
		spec_driver chain-lastctail "$B/conf-c" chainc "c$tag-"
	} >"$B/spec-chain"
	inhost "$HARNESS" -n "$RUNS_CHAIN" -w 3 -o "$R/chain.tsv" "$B/spec-chain"
	load_end 2
fi

# ------------------------------------------------------------- 4: gc vs DEL loop
dnat_chains() { inhost iptables-save -t nat | grep -c '^:CNI-DN-' || true; }
leases() { find "$B/ipam/gcnet" -maxdepth 1 -name '198.18.*' 2>/dev/null | wc -l; }
records() { find "$B/ledger-gc/records" -maxdepth 1 -name '*.json' 2>/dev/null | wc -l; }

# With TRACE4=1, each timed run of 4 is traced (perf, every exec and exit on the machine)
# and bench/exec_spans.py says which programs its wall time went to.
traced4() { # label tsv command...
	local label=$1 tsv=$2
	shift 2
	if [ "${TRACE4:-0}" != 1 ]; then
		"$@"
		return
	fi
	perf record -q -a -e sched:sched_process_exec -e sched:sched_process_exit -o "$B/$label.perf" &
	local perf=$!
	sleep 1 # perf's start
	"$@"
	kill -INT "$perf"
	wait "$perf" || true
	perf script -i "$B/$label.perf" >"$B/$label.perf.txt" 2>/dev/null
	log "4: $label: where its wall time went (programs from exec to exit)"
	python3 "$here/exec_spans.py" "$B/$label.perf.txt" "$(awk -F'\t' '{print $3 / 1e6}' "$tsv")" | head -8 >&2
}

setup_stale() { # set: ADD GC_N attachments, one netns each, then delete the namespaces
	local set=$1 k waited=0
	gc_ns_live=()
	for ((k = 0; k < GC_N; k++)); do gc_ns_live+=("$GCP$set$k"); done
	printf 'netns add %s\n' "${gc_ns_live[@]}" | ip -batch -
	for ((k = 0; k < GC_N; k++)); do
		printf '%s %s %s\n' "$set$tag-$k" "/run/netns/$GCP$set$k" "$((20000 + k))"
	done | inhost xargs -P 4 -L 1 sh -c '
		"$0" add --conf-dir "$1" --net gcnet --cid "$4" --ifname eth0 --netns "$5" \
			--cni-path "$2" --cache-dir "$3" \
			--cap-args "{\"portMappings\":[{\"hostPort\":$6,\"containerPort\":80,\"protocol\":\"tcp\"}]}" \
			>/dev/null 2>>"$3/../add-errors.log"' \
		"$DRIVER" "$B/conf-g" "$CNI_PATH_ALL" "$B/cache" ||
		die "ADD of the stale set failed: $(tail -3 "$B/add-errors.log")"
	[ "$(records)" = "$GC_N" ] && [ "$(leases)" = "$GC_N" ] && [ "$(dnat_chains)" = "$GC_N" ] ||
		die "set $set: expected $GC_N records/leases/DNAT chains, have $(records)/$(leases)/$(dnat_chains)"
	printf 'netns del %s\n' "${gc_ns_live[@]}" | ip -batch -
	gc_ns_live=()
	# Let the kernel finish tearing the namespaces down (their veth peers leave the
	# bridge) so that work is not charged to whatever is timed next.
	while [ "$(inhost ip -o link show master "cbg$tag" 2>/dev/null | wc -l)" != 0 ] && [ $waited -lt 300 ]; do
		sleep 0.1
		waited=$((waited + 1))
	done
	sync -f "$B"
}

if want 4; then
	load_begin
	log "4: setting up $GC_N stale attachments (ADD through libcni, netns deleted)"
	setup_stale a
	log "4: timing gc --jobs $GC_JOBS"
	spec_cli gc-replay gc --ledger-dir "$B/ledger-gc" --grace 0 --jobs "$GC_JOBS" --cni-cache-dir "$B/cache" \
		--json >"$B/spec-gc"
	traced4 gc "$R/gc.tsv" inhost "$HARNESS" -n 1 -w 0 -o "$R/gc.tsv" "$B/spec-gc"
	gc_clean="$(records)/$(leases)/$(dnat_chains)"
	[ "$gc_clean" = 0/0/0 ] || log "  gc left records/leases/DNAT chains: $gc_clean"

	log "4: setting up $GC_N stale attachments again"
	setup_stale b
	log "4: timing a sequential libcni DEL loop"
	cat >"$B/del-loop.sh" <<EOF
for ((k = 0; k < $GC_N; k++)); do
	"$DRIVER" del --conf-dir "$B/conf-g" --net gcnet --cid "b$tag-\$k" --ifname eth0 \\
		--netns "/run/netns/${GCP}b\$k" --cni-path "$CNI_PATH_ALL" --cache-dir "$B/cache" \\
		--cap-args "{\"portMappings\":[{\"hostPort\":\$((20000 + k)),\"containerPort\":80,\"protocol\":\"tcp\"}]}" || exit 1
done
EOF
	printf 'variant del-loop\narg /bin/bash\narg %s\n' "$B/del-loop.sh" >"$B/spec-loop"
	traced4 loop "$R/loop.tsv" inhost "$HARNESS" -n 1 -w 0 -o "$R/loop.tsv" "$B/spec-loop"
	loop_clean="$(records)/$(leases)/$(dnat_chains)"
	load_end 4
fi

# ------------------------------------------------------------------------ table
py() { python3 -c "import sys; a = sys.argv[1:]; $1" "${@:2}"; }
med() { python3 "$here/stats.py" med "$@"; }     # -> median p10 p90 n maxrss cpu
ratio() { python3 "$here/stats.py" ratio "$@"; } # -> ratio lo hi
verdict() { py "print('ok' if float(a[0]) <= float(a[1]) else '**MISS**')" "$1" "$2"; }
ms() { printf '%.2f ms' "$1"; }
sms() { printf '%+.2f ms' "$1"; } # a signed difference
secs() { py "print('%.3f s' % (float(a[0]) / 1000))" "$1"; }
mib() { py "print('%.1f MiB' % (int(a[0]) / 1024))" "$1"; }
x() { printf '%.3f×' "$1"; }
xci() { printf '%.3f× [%.3f–%.3f]' "$1" "$2" "$3"; }
skipped() { echo "| $1 | $2 | | | | | $3 | not run (ONLY=$ONLY) |"; }

rows=()
if want 1 || want 3; then
	read -r add10 _ _ nexec _ _ <<<"$(med "$R/exec.tsv" add-10)"
	read -r addbig _ _ _ _ _ <<<"$(med "$R/exec.tsv" add-big)"
	read -r gover _ _ _ _ _ <<<"$(med "$R/exec.tsv" go-version)"
	read -r floor _ _ _ _ _ <<<"$(med "$R/exec.tsv" floor)"
	read -r btrue _ _ _ _ _ <<<"$(med "$R/exec.tsv" true)"
	read -r lver _ _ _ _ _ <<<"$(med "$R/exec.tsv" ledger-version)"
fi
if want 1; then
	read -r r l h <<<"$(ratio "$R/exec.tsv" add-10 go-version)"
	read -r c _ _ <<<"$(ratio "$R/exec.tsv" add-10 go-version cpu)"
	rows+=("| 1a | ledger ADD (10 records) vs exec of a Go plugin (host-local VERSION), $nexec rounds | $(ms "$add10") | $(ms "$gover") | $(xci "$r" "$l" "$h") | $(x "$c") | ≤ 0.65× | $(verdict "$r" 0.65) |")
	# The floor is linked statically like the ledger: a dynamically linked floor pays the
	# loader (~0.3 ms) that the static ledger does not, and flatters the ratio.
	fl=floor fl_what="dynamically linked: no static libc here"
	if grep -q '^floor-static' "$R/exec.tsv"; then fl=floor-static fl_what="statically linked, as the ledger"; fi
	read -r flms _ _ _ _ _ <<<"$(med "$R/exec.tsv" "$fl")"
	read -r r l h <<<"$(ratio "$R/exec.tsv" add-10 "$fl")"
	read -r c _ _ <<<"$(ratio "$R/exec.tsv" add-10 "$fl" cpu)"
	rows+=("| 1b | ledger ADD vs floor (exec + one durable 600-byte write, $fl_what) | $(ms "$add10") | $(ms "$flms") | $(xci "$r" "$l" "$h") | $(x "$c") | ≤ 1.05× | $(verdict "$r" 1.05) |")
	read -r r l h <<<"$(ratio "$R/exec.tsv" floor go-version)"
	read -r c _ _ <<<"$(ratio "$R/exec.tsv" floor go-version cpu)"
	ctx="exec of /bin/true: $(ms "$btrue"); cni-ledger VERSION: $(ms "$lver")"
	if grep -q '^floor-static' "$R/exec.tsv"; then
		read -r fs _ _ _ _ _ <<<"$(med "$R/exec.tsv" floor-static)"
		ctx="$ctx; floor linked statically: $(ms "$fs")"
	fi
	read -r nolibc _ _ _ _ _ <<<"$(med "$R/exec.tsv" nolibc)"
	if grep -q '^libc-static' "$R/exec.tsv"; then
		read -r ls _ _ _ _ _ <<<"$(med "$R/exec.tsv" libc-static)"
		ctx="$ctx; a static C program doing nothing: $(ms "$ls")"
	fi
	ctx="$ctx; a static program with no C library: $(ms "$nolibc"); one cpuid: $("$build/cpuid") µs"
	rows+=("| 1c | (context) floor vs Go plugin; $ctx | $(ms "$floor") | $(ms "$gover") | $(xci "$r" "$l" "$h") | $(x "$c") | | |")
	if [ -n "${ALT_LEDGER:-}" ]; then
		read -r alt _ _ _ _ _ <<<"$(med "$R/exec.tsv" add-10-alt)"
		read -r altver _ _ _ _ _ <<<"$(med "$R/exec.tsv" ledger-version-alt)"
		read -r r l h <<<"$(ratio "$R/exec.tsv" add-10-alt go-version)"
		read -r c _ _ <<<"$(ratio "$R/exec.tsv" add-10-alt go-version cpu)"
		rows+=("| 1d | ALT_LEDGER ADD vs Go plugin (its VERSION: $(ms "$altver")) | $(ms "$alt") | $(ms "$gover") | $(xci "$r" "$l" "$h") | $(x "$c") | ≤ 0.65× | $(verdict "$r" 0.65) |")
		read -r r l h <<<"$(ratio "$R/exec.tsv" add-10-alt "$fl")"
		read -r c _ _ <<<"$(ratio "$R/exec.tsv" add-10-alt "$fl" cpu)"
		rows+=("| 1e | ALT_LEDGER ADD vs floor | $(ms "$alt") | $(ms "$flms") | $(xci "$r" "$l" "$h") | $(x "$c") | ≤ 1.05× | $(verdict "$r" 1.05) |")
		read -r r l h <<<"$(ratio "$R/exec.tsv" add-10 add-10-alt)"
		read -r c _ _ <<<"$(ratio "$R/exec.tsv" add-10 add-10-alt cpu)"
		rows+=("| 1f | ledger ADD, this build vs ALT_LEDGER (e.g. the previous release: ADD unchanged) | $(ms "$add10") | $(ms "$alt") | $(xci "$r" "$l" "$h") | $(x "$c") | ≤ 1.05× | $(verdict "$r" 1.05) |")
	fi
else
	rows+=("$(skipped 1 "ledger ADD vs Go plugin / floor" "≤ 0.65× / ≤ 1.05×")")
fi
if want 2; then
	read -r chl _ _ nchain _ _ <<<"$(med "$R/chain.tsv" chain-ledger)"
	read -r chp _ _ _ _ _ <<<"$(med "$R/chain.tsv" chain-plain)"
	read -r chn _ _ _ _ _ <<<"$(med "$R/chain.tsv" chain-noop)"
	read -r rn ln hn <<<"$(ratio "$R/chain.tsv" chain-noop chain-plain)"
	read -r cn _ _ <<<"$(ratio "$R/chain.tsv" chain-noop chain-plain cpu)"
	read -r r l h <<<"$(ratio "$R/chain.tsv" chain-ledger chain-plain)"
	read -r c _ _ <<<"$(ratio "$R/chain.tsv" chain-ledger chain-plain cpu)"
	share=""
	if want 1; then share=" (the floor of 1b is $(py "print('%.1f' % (100 * float(a[0]) / float(a[1])))" "$floor" "$chp")% of the plain chain)"; fi
	rows+=("| 2 | chain ADD via libcni [bridge+host-local, portmap] with the ledger first vs without, $nchain rounds$share | $(ms "$chl") | $(ms "$chp") | $(xci "$r" "$l" "$h") | $(x "$c") | ≤ 1.03× | $(verdict "$r" 1.03) |")
	rows+=("| 2b | (context) the same chain with a do-nothing C plugin (bench/noop-plugin.c) in the ledger's place vs without | $(ms "$chn") | $(ms "$chp") | $(xci "$rn" "$ln" "$hn") | $(x "$cn") | | |")
	read -r cht _ _ _ _ _ <<<"$(med "$R/chain.tsv" chain-tail)"
	read -r rt lt ht <<<"$(ratio "$R/chain.tsv" chain-tail chain-ledger)"
	read -r ct _ _ <<<"$(ratio "$R/chain.tsv" chain-tail chain-ledger cpu)"
	dt=$(py "print(float(a[0]) - float(a[1]))" "$cht" "$chl")
	rows+=("| 2c | the same chain with the ledger's head and tail vs the head alone (the tail's cost: $(sms "$dt") median) | $(ms "$cht") | $(ms "$chl") | $(xci "$rt" "$lt" "$ht") | $(x "$ct") | ≤ +1 ms | $(verdict "$dt" 1) |")
	read -r chx _ _ _ _ _ <<<"$(med "$R/chain.tsv" chain-lastnoop)"
	read -r rx lx hx <<<"$(ratio "$R/chain.tsv" chain-lastnoop chain-ledger)"
	read -r cx _ _ <<<"$(ratio "$R/chain.tsv" chain-lastnoop chain-ledger cpu)"
	dx=$(py "print(float(a[0]) - float(a[1]))" "$chx" "$chl")
	rows+=("| 2d | (context) the head's chain with a do-nothing C plugin last vs the head alone: what libcni charges any last entry, $(sms "$dx") median | $(ms "$chx") | $(ms "$chl") | $(xci "$rx" "$lx" "$hx") | $(x "$cx") | | |")
	read -r chw _ _ _ _ _ <<<"$(med "$R/chain.tsv" chain-lastwrite)"
	read -r rw lw hw <<<"$(ratio "$R/chain.tsv" chain-lastwrite chain-ledger)"
	read -r cw _ _ <<<"$(ratio "$R/chain.tsv" chain-lastwrite chain-ledger cpu)"
	dw=$(py "print(float(a[0]) - float(a[1]))" "$chw" "$chl")
	rows+=("| 2e | (context) the head's chain with a C plugin last that rewrites one file as the tail writes its note, over an existing file (no fsync) vs the head alone, $(sms "$dw") median | $(ms "$chw") | $(ms "$chl") | $(xci "$rw" "$lw" "$hw") | $(x "$cw") | | |")
	read -r chs _ _ _ _ _ <<<"$(med "$R/chain.tsv" chain-lastsync)"
	read -r rs ls hs <<<"$(ratio "$R/chain.tsv" chain-lastsync chain-ledger)"
	read -r cs _ _ <<<"$(ratio "$R/chain.tsv" chain-lastsync chain-ledger cpu)"
	ds=$(py "print(float(a[0]) - float(a[1]))" "$chs" "$chl")
	rows+=("| 2f | (context) the same C plugin with an fsync before its rename (one durable write, as the tail made before it wrote notes) vs the head alone, $(sms "$ds") median | $(ms "$chs") | $(ms "$chl") | $(xci "$rs" "$ls" "$hs") | $(x "$cs") | | |")
	read -r chr _ _ _ _ _ <<<"$(med "$R/chain.tsv" chain-lasttmpfs)"
	read -r rr lr hr <<<"$(ratio "$R/chain.tsv" chain-lasttmpfs chain-ledger)"
	read -r cr _ _ <<<"$(ratio "$R/chain.tsv" chain-lasttmpfs chain-ledger cpu)"
	dr=$(py "print(float(a[0]) - float(a[1]))" "$chr" "$chl")
	read -r chc _ _ _ _ _ <<<"$(med "$R/chain.tsv" chain-lastctail)"
	read -r rc lc hc <<<"$(ratio "$R/chain.tsv" chain-lastctail chain-ledger)"
	read -r cc _ _ <<<"$(ratio "$R/chain.tsv" chain-lastctail chain-ledger cpu)"
	dc=$(py "print(float(a[0]) - float(a[1]))" "$chc" "$chl")
	read -r rtc ltc htc <<<"$(ratio "$R/chain.tsv" chain-tail chain-lastctail)"
	rows+=("| 2h | (the tail's floor) a static C program last doing the tail's ADD and nothing more (prevResult printed back, a new file per attachment written as a note, unflushed) vs the head alone, $(sms "$dc") median; the chain with the tail vs with this: $(xci "$rtc" "$ltc" "$htc") | $(ms "$chc") | $(ms "$chl") | $(xci "$rc" "$lc" "$hc") | $(x "$cc") | | |")
	rows+=("| 2g | (context) the C plugin of 2e writing its file on tmpfs instead of the ledger's disk vs the head alone, $(sms "$dr") median: 2e less 2g is what the disk's file system charges for 2e's rename over an existing file | $(ms "$chr") | $(ms "$chl") | $(xci "$rr" "$lr" "$hr") | $(x "$cr") | | |")
else
	rows+=("$(skipped 2 "chain ADD with vs without the ledger" "≤ 1.03×")")
fi
if want 3; then
	read -r r l h <<<"$(ratio "$R/exec.tsv" add-big add-10)"
	read -r c _ _ <<<"$(ratio "$R/exec.tsv" add-big add-10 cpu)"
	rows+=("| 3 | ledger ADD with $(py 'print(f"{int(a[0]):,}")' "$BIG") records vs with 10 | $(ms "$addbig") | $(ms "$add10") | $(xci "$r" "$l" "$h") | $(x "$c") | ≤ 1.10× | $(verdict "$r" 1.10) |")
else
	rows+=("$(skipped 3 "ledger ADD with $BIG records vs 10" "≤ 1.10×")")
fi
if want 4; then
	read -r tgc _ _ _ _ cgc <<<"$(med "$R/gc.tsv" gc-replay)"
	read -r tloop _ _ _ _ cloop <<<"$(med "$R/loop.tsv" del-loop)"
	r=$(py "print(float(a[0]) / float(a[1]))" "$tgc" "$tloop")
	c=$(py "print(float(a[0]) / float(a[1]))" "$cgc" "$cloop")
	rows+=("| 4 | gc --jobs $GC_JOBS replaying $GC_N stale attachments vs a sequential libcni DEL loop over $GC_N (left after, records/leases/DNAT chains: gc $gc_clean, loop $loop_clean) | $(secs "$tgc") | $(secs "$tloop") | $(x "$r") (1 run each) | $(x "$c") | ≤ 0.50× | $(verdict "$r" 0.50) |")
else
	rows+=("$(skipped 4 "gc replaying N stale vs DEL loop" "≤ 0.50×")")
fi
if want 5; then
	declare -A T RSS CPU
	for v in gc-big list-big listjson-big gc-mid list-mid listjson-mid; do
		read -r t _ _ _ rss cpu <<<"$(med "$R/big.tsv" "$v")"
		T[$v]=$t RSS[$v]=$rss CPU[$v]=$cpu
	done
	kbig=$(py 'print(f"{int(a[0]):,}")' "$BIG")
	kmid=$(py 'print(f"{int(a[0]):,}")' "$MID")
	growth() { py "print('%.2f×' % (int(a[0]) / int(a[1])))" "${RSS[$1-big]}" "${RSS[$1-mid]}"; }
	rows+=("| 5a | gc over $kbig live records, nothing stale: wall; peak RSS (CPU $(secs "${CPU[gc-big]}")) | $(secs "${T[gc-big]}") | $(mib "${RSS[gc-big]}") | | | ≤ 1 s | $(verdict "${T[gc-big]}" 1000) |")
	rows+=("| 5b | list over $kbig live records (table to a file): wall; peak RSS (CPU $(secs "${CPU[list-big]}")) | $(secs "${T[list-big]}") | $(mib "${RSS[list-big]}") | | | ≤ 1 s | $(verdict "${T[list-big]}" 1000) |")
	rows+=("| 5c | list --json over $kbig live records (to a file): wall; peak RSS (CPU $(secs "${CPU[listjson-big]}")) — RSS at $kbig / at $kmid: $(growth listjson) | $(secs "${T[listjson-big]}") | $(mib "${RSS[listjson-big]}") | | | ≤ 1 s | $(verdict "${T[listjson-big]}" 1000) |")
	rows+=("| 5d | gc over $kmid live: wall; peak RSS — RSS at $kbig / at $kmid: $(growth gc) | $(secs "${T[gc-mid]}") | $(mib "${RSS[gc-mid]}") | | | | |")
	rows+=("| 5e | list over $kmid live: wall; peak RSS — RSS at $kbig / at $kmid: $(growth list) | $(secs "${T[list-mid]}") | $(mib "${RSS[list-mid]}") | | | | |")
else
	rows+=("$(skipped 5 "gc / list over $BIG live records" "≤ 1 s")")
fi
if want 6; then
	mapfile -t agent_rows <"$R/agent.rows"
	rows+=("${agent_rows[@]}")
else
	rows+=("$(skipped 6 "agent: rewrite to re-injection; idle RSS and CPU" "≤ 1 s")")
fi

elapsed=$(($(date +%s) - start_all))
log "finished in ${elapsed}s"
cat <<EOF

### cni-ledger benchmark — $(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$repo" diff --quiet -- src Cargo.toml 2>/dev/null || echo '+dirty'), $(uname -r), $(nproc) cores, $(df -T "$B" | awk 'NR==2{print $2}') at $B, load avg $load_start → $(cut -d' ' -f1-3 /proc/loadavg), ${elapsed}s, $ordered functions of link/plugin-order.txt in the binary$([ "${QUICK:-0}" = 1 ] && echo ", QUICK")

| # | measurement | A (median) | B (median) | A/B wall [95% CI] | A/B CPU | target | result | load (1 min) |
|---|---|---|---|---|---|---|---|---|
EOF
for row in "${rows[@]}"; do
	m=$(sed -E 's/^\| ([0-9]).*/\1/' <<<"$row")
	printf '%s %s |\n' "$row" "${LOAD[$m]:-}"
done
