#!/usr/bin/env python3
"""bench/agent_bench.py: the node agent's figures (bench/run.sh row 6).

    agent_bench.py LEDGER_BIN SCRATCH_DIR IDLE_SECS REWRITES

- time from a conflist rewrite (alternately a plain write and a rename over it, as
  install-cni tools do) to the ledger being first again, polled every 0.2 ms; the agent
  is restarted every 5 rewrites so that its fight backoff (more than 5 reverts in 10
  minutes) never starts: this is the time of an ordinary rewrite;
- idle RSS (VmRSS, VmHWM) and CPU (utime+stime) of a fresh agent with default intervals
  (resync 30 s, gc 5 min) over IDLE_SECS after start-up, as CPU seconds per hour.

Prints markdown table rows (the columns of bench/run.sh's table) on stdout.
"""
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

ledger, scratch, idle, rewrites = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
conf = os.path.join(scratch, "net.d")
for d in ("net.d", "bin", "ledger", "cache"):
    os.makedirs(os.path.join(scratch, d), exist_ok=True)
os.chmod(os.path.join(scratch, "ledger"), 0o700)
subprocess.run(["cp", ledger, os.path.join(scratch, "bin", "cni-ledger")], check=True)
path = os.path.join(conf, "10-pods.conflist")
plain = json.dumps({"cniVersion": "1.0.0", "name": "pods", "plugins": [
    {"type": "bridge", "bridge": "clbench0", "ipam": {"type": "host-local", "subnet": "198.18.240.0/24"}},
    {"type": "portmap", "capabilities": {"portMappings": True}}]}, indent=2).encode()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def first_is_ledger():
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
        return doc["plugins"][0]["type"] == "cni-ledger"
    except (ValueError, KeyError, IndexError, OSError):
        return False


def wait_injected(limit=10.0):
    t0 = time.perf_counter()
    while not first_is_ledger():
        if time.perf_counter() - t0 > limit:
            sys.exit("agent_bench: never injected")
        time.sleep(0.0002)
    return time.perf_counter() - t0


def start():
    args = [os.path.join(scratch, "bin", "cni-ledger"), "agent",
            "--cni-bin-dir", os.path.join(scratch, "bin"), "--conf-dir", conf,
            "--ledger-dir", os.path.join(scratch, "ledger"),
            "--cni-cache-dir", os.path.join(scratch, "cache"),
            "--listen", "127.0.0.1:%d" % free_port(),
            "--log-file", os.path.join(scratch, "agent.log")]
    env = {k: v for k, v in os.environ.items() if k != "CNI_COMMAND"}
    p = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL)
    wait_injected()
    return p


def stop(p):
    p.send_signal(signal.SIGTERM)
    if p.wait(timeout=30) != 0:
        sys.exit("agent_bench: agent exited %d" % p.returncode)


def write(how):
    if how == "plain":
        with open(path, "wb") as f:
            f.write(plain)
    else:
        tmp = os.path.join(conf, ".installer-tmp")
        with open(tmp, "wb") as f:
            f.write(plain)
        os.rename(tmp, path)


with open(path, "wb") as f:
    f.write(plain)
samples = {"plain": [], "rename": []}
p = start()
for i in range(rewrites):
    if i and i % 5 == 0:
        stop(p)
        p = start()
    how = "plain" if i % 2 == 0 else "rename"
    time.sleep(0.05)
    t0 = time.perf_counter()
    write(how)
    while not first_is_ledger():
        time.sleep(0.0002)
    samples[how].append((time.perf_counter() - t0) * 1000)
stop(p)

p = start()
time.sleep(2)  # past start-up: install check, first injection, start-up gc


def stat(pid):
    with open("/proc/%d/stat" % pid) as f:
        s = f.read()
    fields = s[s.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


cpu0 = stat(p.pid)
time.sleep(idle)
cpu = stat(p.pid) - cpu0
rss, hwm = status(p.pid, "VmRSS"), status(p.pid, "VmHWM")
stop(p)

every = sorted(samples["plain"] + samples["rename"])


def pct(v, q):
    return v[min(len(v) - 1, int(q * len(v)))]


print("| 6a | agent: conflist rewrite to re-injection, %d rewrites (plain write median %.1f ms, rename %.1f ms): median; p95 "
      "| %.1f ms | %.1f ms | max %.1f ms | | ≤ 1 s | %s |" % (
          len(every), statistics.median(samples["plain"]), statistics.median(samples["rename"]),
          statistics.median(every), pct(every, 0.95), every[-1], "ok" if every[-1] < 1000 else "**missed**"))
print("| 6b | agent idle, default intervals, over %.0f s: RSS; peak RSS | %.1f MiB | %.1f MiB | | | | |" % (
    idle, rss / 1024, hwm / 1024))
tick = 1 / os.sysconf("SC_CLK_TCK")
if cpu > 0:
    per_hour = "%.2f s/h" % (cpu * 3600 / idle)
else:  # not one clock tick in the whole window: say the bound it gives
    per_hour = "< %.2f s/h (no %.0f ms tick in %.0f s)" % (tick * 3600 / idle, tick * 1000, idle)
print("| 6c | agent idle: CPU per hour (user+sys over %.0f s, scaled) | %s | | | | | |" % (idle, per_hour))
