#!/usr/bin/env python3
"""Which programs a timed run spent its wall time in, from `perf script` output of the
sched:sched_process_exec and sched:sched_process_exit tracepoints (bench/run.sh,
TRACE4=1): for each program, from its exec to its exit, how many ran, their time added
up, and the union of their spans (wall time during which at least one ran).

    exec_spans.py PERF_SCRIPT_TXT WALL_SECONDS

Prints one line per program, busiest first:
    name  runs  mean_ms  sum_s  union_s  union_%_of_wall  overlap (sum/union)
An overlap near 1 with a union near the whole wall time means that program's runs
followed one another: the run was bound by them, however many jobs started them.
"""
import re
import sys

EXEC = re.compile(r"\s(\d+\.\d+):\s+sched:sched_process_exec: filename=(\S+) pid=(\d+)")
EXIT = re.compile(r"\s(\d+\.\d+):\s+sched:sched_process_exit: comm=.* pid=(\d+) ")


def union(spans):
    total, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def main():
    path, wall = sys.argv[1], float(sys.argv[2])
    started = {}  # pid -> (time, name)
    spans = {}  # name -> [(start, end)]
    with open(path) as f:
        for line in f:
            m = EXEC.search(line)
            if m:
                t, name, pid = float(m.group(1)), m.group(2).rsplit("/", 1)[-1], m.group(3)
                started[pid] = (t, name)  # an exec after an exec: the later program
                continue
            m = EXIT.search(line)
            # A thread's exit is reported under the thread's own id, which is never a
            # process that exec'd: only a process's last exit closes its span.
            if m and m.group(2) in started:
                t0, name = started.pop(m.group(2))
                spans.setdefault(name, []).append((t0, float(m.group(1))))
    rows = []
    for name, s in spans.items():
        total = sum(b - a for a, b in s)
        u = union(s)
        rows.append((u, name, len(s), total))
    rows.sort(reverse=True)
    print(f"{'program':<14} {'runs':>6} {'mean ms':>8} {'sum s':>8} {'union s':>8} {'of wall':>8} {'overlap':>8}")
    for u, name, n, total in rows:
        print(
            f"{name:<14} {n:>6} {1000 * total / n:>8.2f} {total:>8.2f} {u:>8.2f}"
            f" {100 * u / wall:>7.1f}% {total / u if u else 0:>8.2f}"
        )


if __name__ == "__main__":
    main()
