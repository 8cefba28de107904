#!/usr/bin/env bash
# bench/holders.sh — what gc pays to find out whether a namespace whose path it cannot see
# is still held somewhere on the node (DESIGN §5: a runtime's private mounts, an open
# file, a socket; src/sandbox/holders.rs), both ways gc asks.
#
#   sudo bench/holders.sh          # PROCS=2000 FDS=50 SOCKETS=10 MOUNTNS=100 RECORDS=300 ROUNDS=21
#   sudo PROCS=5000 RECORDS=1000 bench/holders.sh
#
# The node: PROCS extra `sleep` processes, MOUNTNS of them each in a mount namespace of
# its own (every one a copy of the host's mounts, so the search reads that many mountinfo
# files); each holds exactly FDS open descriptors, SOCKETS of them datagram sockets
# (AF_UNIX and AF_INET, half each, its own) and the rest /dev/null (stdin, stdout and
# stderr included). One network namespace, held by one more process and by the mount at
# $B/pin the records were made through. Three ledgers of RECORDS records each
# (bench/gen_records.py), all with a namespace's device, inode and cookie:
#   A: the path is gone from gc's view (unmounted and removed) but the namespace is held:
#      every record is judged only after asking the node; all come out live ("held").
#   B: the path still shows the namespace: live by its cookie, the node never asked.
#   C: the namespace is gone (no process, mount, file or socket holds it): every record
#      is stale (`would-replay`).
# Each ledger is timed with two binaries:
#   kernel: the release build as shipped. On a kernel with nsfs file handles (6.18+) it
#      asks the kernel: one probe per run (it makes a scratch namespace), then one
#      open_by_handle_at per record; A's records reopen (and the first tier of the search
#      below is built once to name the holder), C's fail with ESTALE. On an older kernel
#      this mode searches /proc like the next.
#   search: a release build with `--features testing`, run with
#      CNI_LEDGER_TEST_NO_NS_HANDLES=1: the /proc search that kernels without nsfs
#      handles rely on. A finds a holder (that process or that mount) in the first tier
#      (every process's ns/net and every mount namespace's nsfs mounts, built once) and
#      confirms each record's cookie through it. C finds nothing there, so reads every
#      thread, then every fd of every process (readlink) and, for each socket,
#      pidfd_getfd + SIOCGSKNS + fstat: the most a run can pay.
# `cni-ledger gc --json --dry-run --grace 0` is run over each ledger with each binary,
# the six cases interleaved in a rotating order, ROUNDS times; every run's (live, held,
# wouldReplay) is checked, and that search mode never names the kernel as a holder.
# The medians per ledger and mode, and their differences from B (the whole cost of
# asking), are printed with the load average before and after.
#
# Needs root, python3, unshare/nsenter (util-linux). LEDGER_BIN defaults to
# $CARGO_TARGET_DIR/release/cni-ledger (CARGO_TARGET_DIR defaults to target/), built if
# missing; LEDGER_TESTING_BIN to $CARGO_TARGET_DIR/bench-testing/release/cni-ledger,
# built with `--features testing` into that directory if missing (delete it to rebuild).
# Everything it creates is removed on exit.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
PROCS=${PROCS:-2000}
FDS=${FDS:-50}
SOCKETS=${SOCKETS:-10}
MOUNTNS=${MOUNTNS:-100}
RECORDS=${RECORDS:-300}
ROUNDS=${ROUNDS:-21}
[ "$(id -u)" = 0 ] || { echo "holders.sh: needs root" >&2; exit 1; }
((FDS >= SOCKETS + 3)) || { echo "holders.sh: FDS must be at least SOCKETS + 3 (stdin, stdout, stderr)" >&2; exit 1; }

target=${CARGO_TARGET_DIR:-$repo/target}
LEDGER=${LEDGER_BIN:-$target/release/cni-ledger}
TESTING=${LEDGER_TESTING_BIN:-$target/bench-testing/release/cni-ledger}
if [ ! -x "$LEDGER" ]; then
	(cd "$repo" && CARGO_TARGET_DIR="$target" cargo build --release --quiet)
fi
if [ ! -x "$TESTING" ]; then
	(cd "$repo" && CARGO_TARGET_DIR="$target/bench-testing" cargo build --release --features testing --quiet)
fi

B=$(mktemp -d /tmp/cl-holders.XXXXXX)
pids=()
cleanup() {
	disown -a 2>/dev/null || true
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	if [ -f "$B/pids" ]; then
		while read -r p; do kill -KILL "$p" 2>/dev/null || true; done <"$B/pids"
	fi
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

# The processes: each gets its own sockets and files, passed at exec; the spawner exits,
# so the node has exactly PROCS more processes. Their pids are written as they start, so
# that cleanup finds every one even if the spawner fails halfway.
python3 - "$PROCS" "$MOUNTNS" "$FDS" "$SOCKETS" "$B/pids" <<'EOF'
import os, socket, subprocess, sys
procs, mountns, fds, sockets = map(int, sys.argv[1:5])
with open(sys.argv[5], "w") as out:
    for i in range(procs):
        held = [socket.socket(socket.AF_UNIX if k % 2 == 0 else socket.AF_INET,
                              socket.SOCK_DGRAM).detach() for k in range(sockets)]
        held += [os.open("/dev/null", os.O_RDONLY) for _ in range(fds - 3 - sockets)]
        cmd = ["sleep", "100000"]
        if i < mountns:
            cmd = ["unshare", "-m", "--propagation", "private"] + cmd
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, pass_fds=held)
        for fd in held:
            os.close(fd)
        print(p.pid, file=out, flush=True)
EOF
mapfile -t spawned <"$B/pids"
sleep 1
# Every one holds FDS descriptors, SOCKETS of them sockets (the first, in a mount
# namespace of its own if MOUNTNS > 0, and the last).
check=()
if ((${#spawned[@]})); then check=("${spawned[0]}" "${spawned[-1]}"); fi
for p in "${check[@]}"; do
	n=$(ls "/proc/$p/fd" | wc -l)
	s=$(find "/proc/$p/fd" -mindepth 1 -lname 'socket:*' | wc -l)
	if [ "$n" != "$FDS" ] || [ "$s" != "$SOCKETS" ]; then
		echo "holders.sh: pid $p holds $n descriptors, $s sockets; expected $FDS, $SOCKETS" >&2
		exit 1
	fi
done
nprocs=$(ls /proc | grep -c '^[0-9]')

python3 - "$LEDGER" "$TESTING" "$B" "$ROUNDS" "$RECORDS" "$nprocs" "$PROCS" "$MOUNTNS" "$FDS" "$SOCKETS" <<'EOF'
import json, os, statistics, subprocess, sys, time
ledger, testing, b = sys.argv[1:4]
rounds, n = int(sys.argv[4]), int(sys.argv[5])
nprocs, procs, mountns, fds, sockets = sys.argv[6:11]
plain = {k: v for k, v in os.environ.items() if k != "CNI_LEDGER_TEST_NO_NS_HANDLES"}
modes = {
    "kernel": (ledger, plain),
    "search": (testing, dict(plain, CNI_LEDGER_TEST_NO_NS_HANDLES="1")),
}
want = {"ledger-a": (n, n, 0), "ledger-b": (n, 0, 0), "ledger-c": (0, 0, n)}
# How the kernel's answer is shown (Holder::Kernel, src/sandbox/holders.rs); the search
# names a process or a mount. The shipped build on a kernel without nsfs handles searches.
by_kernel = "held on the node"
answered = {"kernel": set(), "search": set()}
cases = [(m, d) for m in modes for d in want]
times = {c: [] for c in cases}
def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])
load0 = loadavg()
for r in range(rounds):
    k = r % len(cases)
    for mode, d in cases[k:] + cases[:k]:
        binary, env = modes[mode]
        t = time.perf_counter()
        out = subprocess.run([binary, "gc", "--json", "--dry-run", "--grace", "0",
                              "--ledger-dir", f"{b}/{d}"], capture_output=True, env=env)
        times[(mode, d)].append(time.perf_counter() - t)
        rep = json.loads(out.stdout)
        held = rep.get("held", [])
        got = (rep["summary"]["live"], len(held), rep["summary"]["wouldReplay"])
        if got != want[d]:
            sys.exit(f"{mode} {d}: (live, held, would replay) = {got}; expected {want[d]}")
        answered[mode].update(h["heldBy"].startswith(by_kernel) for h in held)
if True in answered["search"]:
    sys.exit(f"search mode named the kernel as A's holder: {answered}")
load1 = loadavg()
m = {c: statistics.median(t) * 1000 for c, t in times.items()}
print(f"{nprocs} processes ({procs} extra, {fds} fds and {sockets} sockets each), "
      f"{mountns} extra mount namespaces, {n} records, {rounds} rounds, "
      f"load {load0} before, {load1} after")
print(f"{'mode':8} {'A held':>9} {'B no ask':>9} {'C stale':>9} {'A - B':>9} {'C - B':>9}   (median ms)")
for mode in modes:
    a, bb, c = (m[(mode, d)] for d in want)
    print(f"{mode:8} {a:9.1f} {bb:9.1f} {c:9.1f} {a - bb:9.1f} {c - bb:9.1f}")
print("A: every path gone, namespace held elsewhere; B: every path shows it (no asking);")
print("C: namespace gone everywhere. kernel: nsfs file handles (one probe, then one reopen")
print("per record); search: /proc in tiers, C through all of them (processes+mounts,")
print("threads, every fd and socket).")
EOF
