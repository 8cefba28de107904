#!/usr/bin/env python3
"""Where each CNI plugin's run went, from `perf script` output of the tracepoints that
bench/k8s-podstart.sh records with TRACE=1 (filtered to the plugins' names): every exec
of a plugin, from its exec to its exit, split into time on a CPU, waiting for one
(runnable), and asleep, by the system call it slept in (reading stdin: the runtime has
not written the configuration yet; fsync: the disk). "to 1st syscall" is the time on a
CPU from the exec to the program's first system call: the C library's start-up for a C
or Rust program (glibc probes the CPU with `cpuid`, a trap to the hypervisor in a VM);
for a Go program, the first steps of its runtime.

    plugin_time.py [--pods N] [--under DIR ...] LABEL=TXT[,TXT...] [LABEL=...]

Prints a markdown table per label, one row per program; with --pods N (pods per file),
the CPU of all plugin runs per pod. With --under, only programs exec'd from under one of
the DIRs count (the plugins, not an agent of the same name). An exec by a logging wrapper (a script at the plugin's path that
execs the plugin) is counted apart, as "(wrapper) NAME"; the wrapper's own children
(`date`) are not traced.
"""
import collections
import re
import sys

LINE = re.compile(r"\s*(\S+)\s+(\d+)/(\d+)\s+\[\d+\]\s+(\d+\.\d+):\s+(\S+):\s*(.*)")
SWITCH = re.compile(r"prev_pid=(\d+) .*prev_state=(\S+) ==> next_comm=\S+ next_pid=(\d+)")
NR = re.compile(r"NR (-?\d+)")
WAKEE = re.compile(r"\bpid=(\d+)")
# The x86_64 numbers of the calls a plugin sleeps in; the rest are "other".
SLEEPS = {0: "read", 74: "fsync", 75: "fsync", 202: "futex", 7: "poll", 232: "epoll", 281: "epoll"}
EXECVE, EXIT_GROUP = 59, 231


class Run:
    def __init__(self, name, t0):
        self.name, self.t0, self.end = name, t0, None
        self.oncpu = 0.0  # all threads
        self.first_sys = None  # on-CPU time from the exec to the first system call
        self.runnable = 0.0  # main thread
        self.asleep = collections.Counter()  # main thread, by system call


class Thread:
    def __init__(self, run, t, main):
        self.run, self.main = run, main
        self.state, self.since, self.sys = "cpu", t, None
        self.cpu_before_first = 0.0 if main else None
        self.seen_execve_exit = False

    def account(self, t):
        dt = t - self.since
        if self.state == "cpu":
            self.run.oncpu += dt
            if self.cpu_before_first is not None and self.seen_execve_exit:
                self.cpu_before_first += dt
        elif self.main and self.state == "runnable":
            self.run.runnable += dt
        elif self.main:
            self.run.asleep[SLEEPS.get(self.sys, "other")] += dt
        self.since = t


def parse(path, under):
    runs, threads = [], {}
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if not m:
            continue
        _, pid, tid, t, ev, rest = m.groups()
        t = float(t) * 1000.0
        if ev == "sched:sched_process_exec":
            filename = re.search(r"filename=(\S+)", rest).group(1)
            old = threads.get(tid)
            if old is not None and old.run.end is None:
                # A wrapper script exec'ing the plugin: its stage ends here.
                old.account(t)
                old.run.end = t
                old.run.name = "(wrapper) " + old.run.name
            run = Run(filename.rsplit("/", 1)[-1], t)
            if not under or any(filename.startswith(d.rstrip("/") + "/") for d in under):
                runs.append(run)
            threads[tid] = Thread(run, t, main=True)
            continue
        if ev == "sched:sched_switch":
            s = SWITCH.search(rest)
            prev, state, nxt = s.group(1), s.group(2), s.group(3)
            if prev in threads:
                th = threads[prev]
                th.account(t)
                th.state = "runnable" if state.startswith("R") else "asleep"
            if nxt in threads:
                th = threads[nxt]
                th.account(t)
                th.state = "cpu"
            continue
        if ev == "sched:sched_wakeup":
            # Recorded in the waker's context: the woken thread is the event's pid.
            th = threads.get(WAKEE.search(rest).group(1))
            if th is not None:
                th.account(t)
                if th.state == "asleep":
                    th.state = "runnable"
            continue
        th = threads.get(tid)
        if th is None:
            # A new thread of a traced run (a Go plugin's): its first event.
            parent = threads.get(pid)
            if parent is None or not parent.main or parent.run.end is not None:
                continue
            th = threads[tid] = Thread(parent.run, t, main=False)
        if ev == "raw_syscalls:sys_enter":
            th.account(t)
            nr = int(NR.match(rest).group(1))
            th.sys = nr
            if th.cpu_before_first is not None and th.seen_execve_exit:
                th.run.first_sys = th.cpu_before_first
                th.cpu_before_first = None
            if nr == EXIT_GROUP and th.main:
                th.run.end = t
        elif ev == "raw_syscalls:sys_exit":
            th.account(t)
            if int(NR.match(rest).group(1)) == EXECVE:
                th.seen_execve_exit = True
            th.sys = None
        elif ev == "sched:sched_process_exit" and th.main and th.run.end is None:
            th.account(t)
            th.run.end = t
    return [r for r in runs if r.end is not None]


def table(label, runs, pods):
    by = collections.defaultdict(list)
    for r in runs:
        by[r.name].append(r)
    print(f"#### {label}: {len(runs)} plugin runs\n")
    print("| program | runs | span ms | on CPU ms | to 1st syscall ms | runnable ms "
          "| asleep: read ms | fsync ms | other ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    for name, rs in sorted(by.items(), key=lambda kv: -sum(r.oncpu for r in kv[1])):
        first = [r.first_sys for r in rs if r.first_sys is not None]
        sleep = lambda k: mean([r.asleep[k] for r in rs])
        other = mean([sum(v for k, v in r.asleep.items() if k not in ("read", "fsync"))
                      for r in rs])
        print(f"| {name} | {len(rs)} | {mean([r.end - r.t0 for r in rs]):.2f} "
              f"| {mean([r.oncpu for r in rs]):.2f} | {mean(first):.2f} "
              f"| {mean([r.runnable for r in rs]):.2f} | {sleep('read'):.2f} "
              f"| {sleep('fsync'):.2f} | {other:.2f} |")
    if pods:
        total = sum(r.oncpu for r in runs)
        print(f"\nAll plugin runs on a CPU: {total:.0f} ms, {total / pods:.2f} ms per pod.")
    print()


def main():
    args, pods, under = sys.argv[1:], None, []
    while args and args[0].startswith("--"):
        opt, val = args[0], args[1]
        del args[:2]
        if opt == "--pods":
            pods = int(val)
        elif opt == "--under":
            under.append(val)
        else:
            sys.exit(__doc__)
    for arg in args:
        label, paths = arg.split("=", 1)
        files = paths.split(",")
        runs = [r for p in files for r in parse(p, under)]
        table(label, runs, pods * len(files) if pods else None)


if __name__ == "__main__":
    main()
