#!/usr/bin/env bash
# bench/holders.sh — what gc pays to search the node for namespaces whose path it cannot
# see (DESIGN §5: a runtime's private mounts; src/sandbox/holders.rs).
#
#   sudo bench/holders.sh                    # PROCS=2000 MOUNTNS=100 RECORDS=300 ROUNDS=21
#   sudo PROCS=5000 RECORDS=1000 bench/holders.sh
#
# The node: PROCS extra `sleep` processes, MOUNTNS of them each in a mount namespace of
# its own (every one a copy of the host's mounts, so gc reads that many mountinfo files),
# and one network namespace held by a process. Two ledgers of RECORDS records each
# (bench/gen_records.py), all with that namespace's device, inode and cookie:
#   A: the path is gone from gc's view (unmounted and removed): every record is judged
#      only after the search, which builds the index once and confirms each record's
#      cookie through /proc/<pid>/ns/net; all come out live ("held").
#   B: the path still shows the namespace: live by its cookie, the index never built.
#   C: the namespace is gone (no process, no mount): the search finds nothing in the
#      processes and mounts, so the threads of every process are read too, and every
#      record is stale (`would-replay`): the most a run can pay.
# `cni-ledger gc --dry-run --grace 0` is run over each, alternating, ROUNDS times;
# the medians and their difference (the search's whole cost) are printed.
#
# Needs root, python3, unshare/nsenter (util-linux). LEDGER_BIN defaults to
# target/release/cni-ledger (built if missing). Everything it creates is removed on exit.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
PROCS=${PROCS:-2000}
MOUNTNS=${MOUNTNS:-100}
RECORDS=${RECORDS:-300}
ROUNDS=${ROUNDS:-21}
[ "$(id -u)" = 0 ] || { echo "holders.sh: needs root" >&2; exit 1; }

LEDGER=${LEDGER_BIN:-$repo/target/release/cni-ledger}
if [ ! -x "$LEDGER" ]; then
	(cd "$repo" && cargo build --release --quiet)
fi

B=$(mktemp -d /tmp/cl-holders.XXXXXX)
pids=()
cleanup() {
	disown -a 2>/dev/null || true
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	umount "$B/pin" 2>/dev/null || true
	rm -rf "$B"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The namespace: pinned at $B/pin for the generator, held by a process.
touch "$B/pin" "$B/gone"
unshare --net="$B/pin" true
nsenter --net="$B/pin" sleep 100000 </dev/null >/dev/null 2>&1 &
pids+=($!)
mount --bind "$B/pin" "$B/gone"

printf '{"cniVersion":"1.0.0","name":"benchnet","plugins":[{"type":"cni-ledger"}]}\n' >"$B/conf.conflist"
python3 "$here/gen_records.py" "$B/ledger-a" "$RECORDS" benchnet "$B/gone" "$B/conf.conflist" >/dev/null
python3 "$here/gen_records.py" "$B/ledger-b" "$RECORDS" benchnet "$B/pin" "$B/conf.conflist" >/dev/null
umount "$B/gone"
rm "$B/gone"
touch "$B/dead"
unshare --net="$B/dead" true
python3 "$here/gen_records.py" "$B/ledger-c" "$RECORDS" benchnet "$B/dead" "$B/conf.conflist" >/dev/null
umount "$B/dead"
rm "$B/dead"

for ((i = 0; i < PROCS; i++)); do
	if ((i < MOUNTNS)); then
		unshare -m --propagation private sleep 100000 </dev/null >/dev/null 2>&1 &
	else
		sleep 100000 </dev/null >/dev/null 2>&1 &
	fi
	pids+=($!)
done
sleep 1
nprocs=$(ls /proc | grep -c '^[0-9]')

python3 - "$LEDGER" "$B" "$ROUNDS" "$RECORDS" "$nprocs" "$MOUNTNS" <<'EOF'
import json, statistics, subprocess, sys, time
ledger, b, rounds, records, nprocs, mountns = sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:]
def run(d):
    t = time.perf_counter()
    out = subprocess.run([ledger, "gc", "--json", "--dry-run", "--grace", "0",
                          "--ledger-dir", f"{b}/{d}"], capture_output=True, check=False)
    dt = time.perf_counter() - t
    rep = json.loads(out.stdout)
    return dt, rep
n = int(records)
want = {"ledger-a": (n, n, 0), "ledger-b": (n, 0, 0), "ledger-c": (0, 0, n)}
times = {d: [] for d in want}
order = list(want)
for r in range(rounds):
    for d in order[r % 3:] + order[:r % 3]:
        dt, rep = run(d)
        times[d].append(dt)
        got = (rep["summary"]["live"], len(rep.get("held", [])), rep["summary"]["wouldReplay"])
        if got != want[d]:
            sys.exit(f"{d}: (live, held, would replay) = {got}; expected {want[d]}")
m = {d: statistics.median(t) * 1000 for d, t in times.items()}
print(f"{nprocs} processes, {mountns} extra mount namespaces, {records} records, {rounds} rounds")
print(f"A gc, every path gone, namespace found by the search: median {m['ledger-a']:.1f} ms")
print(f"B gc, every path shows the namespace (no search):     median {m['ledger-b']:.1f} ms")
print(f"C gc, namespace gone, search finds nothing (dry run): median {m['ledger-c']:.1f} ms")
print(f"A - B, the search that finds (index once + {records} cookie checks): {m['ledger-a'] - m['ledger-b']:.1f} ms")
print(f"C - B, the search that finds nothing (+ every thread): {m['ledger-c'] - m['ledger-b']:.1f} ms")
EOF
