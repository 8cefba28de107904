#!/usr/bin/env python3
"""bench/storm.py: a pod-start storm, timed (bench/storm.sh drives it).

    storm.py launch OUT.tsv ADDS.json [GC.json]
        ADDS.json: a JSON list of argv lists, one per new pod's ADD. All are started at
        once (GC.json's argv first, when given: gc starts with the storm, as after a
        reboot) and each is timed from its own spawn to its exit. Appends to OUT.tsv
        lines "add<TAB>index<TAB>ms<TAB>exit" and "gc<TAB>-<TAB>ms<TAB>exit".
        Exits 1 if any process failed.
    storm.py report TSV_GLOB...
        TSV files named <variant>-<n>-<round>.tsv: per variant and N, the ADDs' p50, p90
        and max over every round pooled, gc's time (median and max over rounds), and the
        ratios of each gc variant's p90 to the "alone" p90 of the same N, pooled and per
        round with their median (paired: the variants of one round ran back to back; on a
        machine whose load changes by the minute the per-round ratios are the result).
"""
import json
import os
import re
import statistics
import sys
import time


def launch(out, adds_path, gc_path=None):
    with open(adds_path) as f:
        adds = json.load(f)
    procs = {}
    null = os.open(os.devnull, os.O_RDWR)
    errlog = os.open(out + ".stderr", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def spawn(argv):
        return os.posix_spawn(
            argv[0],
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, null, 0),
                (os.POSIX_SPAWN_DUP2, null, 1),
                (os.POSIX_SPAWN_DUP2, errlog, 2),
            ],
        )

    if gc_path:
        with open(gc_path) as f:
            gc = json.load(f)
        procs[spawn(gc)] = ("gc", "-", time.monotonic())
        # GC_LEAD seconds: gc starts that much before the storm (a boot unit that began
        # before kubelet), so the storm meets replays under way.
        time.sleep(float(os.environ.get("GC_LEAD", "0")))
    for i, argv in enumerate(adds):
        procs[spawn(argv)] = ("add", str(i), time.monotonic())
    failed = 0
    rows = []
    while procs:
        pid, status = os.waitpid(-1, 0)
        end = time.monotonic()
        if pid not in procs:
            continue
        kind, i, start = procs.pop(pid)
        rc = os.waitstatus_to_exitcode(status)
        # gc's exit 1 means "some records retrying": counted, not fatal here.
        failed += rc != 0 and kind == "add"
        rows.append("%s\t%s\t%.3f\t%d\n" % (kind, i, (end - start) * 1e3, rc))
    with open(out, "a") as f:
        f.writelines(rows)
    return 1 if failed else 0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def report(paths):
    data = {}  # (variant, n) -> {round: {"add": [...], "gc": [...]}}
    for p in paths:
        m = re.match(r"(.+)-(\d+)-(\d+)\.tsv$", os.path.basename(p))
        if not m:
            continue
        variant, n, rnd = m.group(1), int(m.group(2)), int(m.group(3))
        per = data.setdefault((variant, n), {}).setdefault(rnd, {"add": [], "gc": []})
        with open(p) as f:
            for line in f:
                kind, _, ms, _ = line.rstrip("\n").split("\t")
                per[kind].append(float(ms))
    ns = sorted({n for _, n in data})
    variants = sorted({v for v, _ in data}, key=lambda v: (v != "alone", v))
    print("| N | variant | rounds | ADD p50 | ADD p90 | ADD max | p90 / alone p90 (pooled; per round) | gc run: until the last stale attachment is released (median; max) |")
    print("|---|---|---|---|---|---|---|---|")
    for n in ns:
        alone = data.get(("alone", n), {})
        alone_all = [x for r in alone.values() for x in r["add"]]
        for v in variants:
            rounds = data.get((v, n))
            if not rounds:
                continue
            adds = [x for r in rounds.values() for x in r["add"]]
            gcs = [x for r in rounds.values() for x in r["gc"]]
            ratio = ""
            if v != "alone" and alone_all:
                per_round = [
                    pct(rounds[k]["add"], 0.9) / pct(alone[k]["add"], 0.9)
                    for k in sorted(rounds)
                    if k in alone and rounds[k]["add"] and alone[k]["add"]
                ]
                ratio = "%.3f× (%s; median %.2f×)" % (
                    pct(adds, 0.9) / pct(alone_all, 0.9),
                    ", ".join("%.2f" % r for r in per_round),
                    statistics.median(per_round) if per_round else float("nan"),
                )
            gc = ""
            if gcs:
                gc = "%.2f s; %.2f s" % (statistics.median(gcs) / 1e3, max(gcs) / 1e3)
            print(
                "| %d | %s | %d | %.0f ms | %.0f ms | %.0f ms | %s | %s |"
                % (n, v, len(rounds), pct(adds, 0.5), pct(adds, 0.9), max(adds), ratio, gc)
            )


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "launch":
        sys.exit(launch(*sys.argv[2:5]))
    if len(sys.argv) >= 3 and sys.argv[1] == "report":
        report(sys.argv[2:])
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
