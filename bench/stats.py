#!/usr/bin/env python3
"""Statistics over bench/harness sample files (variant, round, wall_us, maxrss_kib, cpu_us).

    stats.py med FILE VARIANT       -> "median_ms p10_ms p90_ms n max_rss_kib median_cpu_ms"
    stats.py ratio FILE A B [cpu]   -> "ratio lo hi": median(A)/median(B) of wall time (or
                                       of CPU time, user+sys incl. waited-for children) with
                                       a 95% bootstrap interval, resampling whole rounds (A
                                       and B of one round ran back to back: paired).
    stats.py steps FILE FLOOR_MS    -> the median of each step of `floor --steps` runs
                                       (FILE: "step<TAB>usec" lines, run after run), and of
                                       a run's steps that are not the floor's own work,
                                       also as a share of FLOOR_MS
"""
import random
import statistics
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for line in f:
            v, r, us, rss, cpu = line.split("\t")
            rows.setdefault(v, {})[int(r)] = (float(us), int(rss), float(cpu))
    return rows


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def steps(path, floor_ms):
    order, runs = [], []
    with open(path) as f:
        for line in f:
            name, us = line.rstrip("\n").split("\t")
            if not order or name == order[0]:
                runs.append({})
            if name not in order:
                order.append(name)
            runs[-1][name] = float(us)
    for name in order:
        print("  %-32s %7.2f us" % (name, statistics.median(r[name] for r in runs if name in r)))
    # The floor makes the durable write too: the rest is what ADD's calls add to it.
    extra = statistics.median(
        sum(us for name, us in r.items() if "(the floor's)" not in name) for r in runs
    )
    print(
        "  %-32s %7.2f us  (%.1f%% of the floor's %.0f us; %d runs)"
        % ("all but the floor's", extra, 100 * extra / (floor_ms * 1e3), floor_ms * 1e3, len(runs))
    )


def main():
    cmd, path = sys.argv[1], sys.argv[2]
    if cmd == "steps":
        steps(path, float(sys.argv[3]))
        return
    rows = load(path)
    if cmd == "med":
        s = rows[sys.argv[3]]
        wall = [x[0] for x in s.values()]
        print(
            "%.3f %.3f %.3f %d %d %.3f"
            % (
                statistics.median(wall) / 1e3,
                pct(wall, 0.1) / 1e3,
                pct(wall, 0.9) / 1e3,
                len(wall),
                max(x[1] for x in s.values()),
                statistics.median(x[2] for x in s.values()) / 1e3,
            )
        )
    elif cmd == "ratio":
        a, b = rows[sys.argv[3]], rows[sys.argv[4]]
        col = 2 if sys.argv[5:] == ["cpu"] else 0
        rounds = sorted(set(a) & set(b))
        ratio = statistics.median(a[r][col] for r in rounds) / statistics.median(
            b[r][col] for r in rounds
        )
        rng = random.Random(1)
        boots = []
        for _ in range(1000):
            pick = [rng.choice(rounds) for _ in rounds]
            boots.append(
                statistics.median(a[r][col] for r in pick)
                / statistics.median(b[r][col] for r in pick)
            )
        boots.sort()
        print("%.3f %.3f %.3f" % (ratio, boots[25], boots[974]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
