#!/usr/bin/env bash
# bench/k8s-podstart.sh: pod start as a real kubelet measures it (issue 38 item 5), on the
# one-node cluster of tests/k8s/cluster.sh, with the agent installed as tests/k8s_common's
# install_agent does (the image of scripts/build-image.sh, imported with `ctr -n k8s.io
# images import`, then `kubectl apply -k deploy/kubernetes/base`), but built as shipped:
# the release profile (a dev build's checksums and JSON cost several times more per call).
#
#   sudo bench/k8s-podstart.sh steady [ROUNDS=6] [PODS=20]
#   sudo PACE=2 bench/k8s-podstart.sh steady [ROUNDS] [PODS]   # one pod every 2 s instead
#   sudo bench/k8s-podstart.sh storm N [ROUNDS=2]      # FIRST=empty: start with (b)
#   KEEP=DIR ...                                       # keep the raw files in DIR
#
# steady: rounds alternate ABBA (with, without, without, with, ...) so a drift of the
#   machine's speed weighs on both alike. "with": the agent runs and the ledger is first in
#   the chain; "without": the agent deleted (`kubectl delete -k`) and `cni-ledger agent
#   --uninstall` run in the node, the plain chain [bridge, portmap]: what a node without
#   cni-ledger is. (Keeping the agent and only taking the ledger out of the conflist cannot
#   be done: the agent puts it back within milliseconds.) Each round, after SETTLE seconds
#   (20: the last round's sandboxes are still being torn down for a while after its pods
#   are gone, and the ADD's conflist memo is trusted only after 3 s), a Deployment of PODS
#   pause pods; once all are Ready, each pod's start as kubelet logs it ("Observed pod
#   startup duration": podStartSLOduration, creation to running as its pod watch saw it);
#   then the Deployment is deleted and its pods waited out (no sandbox, record or address
#   left). Per round the median and p90; the with/without ratio of medians per ABBA pair
#   and pooled. Besides, from containerd's log: RunPodSandbox's span and the pod created
#   to its container started. The ledger's head and tail run only inside the CNI ADD,
#   inside RunPodSandbox; after StartContainer it runs nothing for the pod until its DEL.
#   So the spans say where a difference in pod start comes from, and RunPodSandbox's, the
#   least noisy, bounds what the ledger's plugin can add to it.
#   PACE=S: the pods made one by one through the API, one every S seconds (bare pods, a
#   steady trickle, each mostly alone on the node) rather than as a Deployment's burst.
#   The node's plugins are plain copies (cluster.sh's CNI_LEDGER_K8S_CALL_LOG=0); CALL_LOG=1
#   puts back its logging wrappers and their call log ($D/cni-calls.log, kept with KEEP).
#   TRACE=1: each round traced by perf (the plugins' system calls and scheduling), and
#   bench/plugin_time.py's tables at the end: where each plugin's run went, on a CPU,
#   waiting for one, asleep reading its stdin or in fsync. Tracing slows every system
#   call on the machine: a TRACE run's pod starts are not for the ratio.
# storm: a Deployment of N pause pods, Ready; past gc's 60 s --grace (the agent runs gc at
#   its start and then every 300 s; a record younger than the grace is left alone unless
#   the boot ID changed, which a restart of cluster.sh's node does not); then an unclean
#   reboot that loses containerd's state (`cluster.sh restart --lose-runtime-state`), in
#   alternate rounds:
#     replay  the N old records in place: the agent's gc replays N DELs while kubelet
#             brings the N pods back
#     empty   the same restart with the N old records, their tail notes, host-local's
#             addresses of them and libcni's cache entries removed just before it: a node
#             whose old pods were released cleanly, nothing to replay, nothing leaked
#   Per pod: from kubelet's start (its process's start time, from cluster.sh's pid file) to
#   the pod Ready on a new container, as a watch on the API server saw it (stamped with
#   this machine's clock). Per round p50 and p90; the ratio of p90s replay/empty per pair
#   and pooled. kubelet does not log its own pod-start figure for these pods: its tracker
#   skips a pod whose status already has a start time (a pod of the old boot).
#
# The cluster is one per machine: the script takes /run/lock/cni-ledger-k8s.lock (as
# tests/k8s_common does) for its run, takes down what an interrupted run left, brings the
# cluster up and down. The image is built before the lock is taken. Output: markdown
# tables on stdout; progress on stderr.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
repo=$(dirname "$here")
LOCK=/run/lock/cni-ledger-k8s.lock
log() { printf '[podstart %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}
usage() { die "usage: $0 steady [ROUNDS] [PODS] | storm N [ROUNDS]"; }
[ "$(id -u)" -eq 0 ] || die "run as root (the cluster)"
# The cluster this script knows: containerd, host-local (the node's paths below).
unset CNI_LEDGER_K8S_RUNTIME CNI_LEDGER_K8S_IPAM
export CNI_LEDGER_K8S_DIR=${CNI_LEDGER_K8S_DIR:-/var/lib/cni-ledger-k8s}
D=$CNI_LEDGER_K8S_DIR

if [ "${1:-}" != __locked ]; then
	case ${1:-} in
	steady)
		# The node's plugins as a node has them, without cluster.sh's logging wrappers
		# (a shell and a `date` per call, more CPU than the ledger's head and tail).
		export CNI_LEDGER_K8S_CALL_LOG=${CALL_LOG:-0}
		;;
	storm)
		[[ ${2:-} =~ ^[0-9]+$ ]] || usage
		export CNI_LEDGER_K8S_CALL_LOG=1 # no DEL may name a live pod: read from the log
		# kubelet's maxPods counts the agent's pod too: the node is given room for N + 1.
		[ "$2" -le 126 ] || die "N=$2: the old and new addresses would not fit 10.244.0.0/24"
		if [ "$2" -ge 110 ]; then export CNI_LEDGER_K8S_MAX_PODS=$(($2 + 1)); fi
		;;
	*) usage ;;
	esac
	W=$(mktemp -d /var/tmp/cl-podstart.XXXXXX)
	export W
	tag=localhost/cni-ledger:podstart-$$
	log "building the agent's image (PROFILE=release, as shipped)"
	PROFILE=release "$repo/scripts/build-image.sh" "$tag" >/dev/null
	podman save -q -o "$W/agent.tar" "$tag" >/dev/null
	podman rmi "$tag" >/dev/null
	echo "$tag" >"$W/agent.tag"
	log "waiting for $LOCK"
	# -o: the lock is flock's own; the cluster's daemons must not inherit it.
	rc=0
	flock -o "$LOCK" "$0" __locked "$@" || rc=$?
	rm -rf "$W"
	exit "$rc"
fi
shift
MODE=$1
shift
locked_at=$SECONDS

cluster() { bash "$repo/tests/k8s/cluster.sh" "$@"; }
finish() {
	set +e
	if [ -n "${KEEP:-}" ]; then
		cp "$D/log/kubelet.log" "$D/log/containerd.log" "$D/cni-calls.log" "$W"/ 2>/dev/null
		mkdir -p "$KEEP" && cp -r "$W"/. "$KEEP"/ && rm -f "$KEEP/agent.tar"
	fi
	log "taking the cluster down"
	cluster down >/dev/null 2>&1
	log "the lock held $((SECONDS - locked_at)) s"
}
trap finish EXIT
trap 'exit 130' INT TERM

log "load $(cut -d' ' -f1-3 /proc/loadavg); a cluster left by an interrupted run goes first"
cluster down >/dev/null 2>&1 || true
cluster up 2>"$W/up.log" || die "cluster.sh up: $(tail -5 "$W/up.log")"
eval "$(cluster env)"
N_=$D/node
SOCK=$N_/run/containerd/containerd.sock
ctr() { command ctr --address "$SOCK" --namespace k8s.io "$@"; }
crictl() { command crictl --runtime-endpoint "unix://$SOCK" "$@"; }
node_pid() { cut -d' ' -f1 "$D/pid/node"; }
on_node() { nsenter -t "$(node_pid)" -m -p -- "$@"; }
PAUSE=registry.invalid/cni-ledger-k8s/pause:1
NET=cni-ledger-k8s
RECORDS=$N_/var/lib/cni-ledger/records
ADDRS=$N_/var/lib/cni/networks/$NET
BASE=$repo/deploy/kubernetes/base

py() { python3 "$W/podstart.py" "$@"; }
cat >"$W/podstart.py" <<'PY'
"""The Python half of bench/k8s-podstart.sh: the watch, kubelet's log, the tables."""
import calendar, http.client, json, os, random, re, ssl, statistics, sys, time, urllib.parse

D = os.environ["CNI_LEDGER_K8S_DIR"]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def api():
    ctx = ssl.create_default_context(cafile=D + "/pki/ca.crt")
    ctx.load_cert_chain(D + "/pki/admin.crt", D + "/pki/admin.key")
    return http.client.HTTPSConnection("127.0.0.1", 16443, context=ctx, timeout=900)


def watch(out, selector, old_json, want, timeout):
    """Writes 'stamp name containerID ready' per event; exits 0 once `want` pods are
    Ready on a container not in old_json (name -> containerID), 1 after `timeout` s."""
    old = json.load(open(old_json))
    q = "/api/v1/namespaces/default/pods?labelSelector=" + urllib.parse.quote(selector)
    c = api()
    c.request("GET", q)
    lst = json.load(c.getresponse())
    rv = lst["metadata"]["resourceVersion"]
    c.request("GET", q + "&watch=1&timeoutSeconds=%d&resourceVersion=%s" % (timeout, rv))
    r = c.getresponse()
    done = set()
    deadline = time.time() + timeout
    with open(out, "w") as f:
        f.write("# watching\n")
        f.flush()
        while time.time() < deadline:
            line = r.readline()
            t = time.time()
            if not line:
                break
            ev = json.loads(line)
            o = ev["object"]
            if o.get("kind") != "Pod":
                continue
            name = o["metadata"]["name"]
            cs = (o.get("status", {}).get("containerStatuses") or [{}])[0]
            cid, ready = cs.get("containerID", ""), bool(cs.get("ready"))
            f.write("%.3f\t%s\t%s\t%s\t%s\n" % (t, ev["type"], name, cid or "-", ready))
            f.flush()
            if ready and cid and cid != old.get(name) and ev["type"] != "DELETED":
                done.add(name)
                if len(done) >= want:
                    return 0
    return 1


def busy(stat_file):
    """The machine's busy and total CPU seconds between the two /proc/stat lines of
    stat_file (all but idle and iowait; guest time is in user already)."""
    a, b = [[int(x) for x in l.split()[1:]] for l in open(stat_file)]
    d = [y - x for x, y in zip(a, b)][:8]
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(d) - d[3] - d[4]) / hz, sum(d) / hz


def kubelet_start():
    """kubelet's start as wall time: its pid file's start time (clock ticks since boot,
    CLOCK_BOOTTIME like /proc/uptime) against the wall clock now."""
    pid, st = open(D + "/pid/kubelet").read().split()[:2]
    boot = time.time() - float(open("/proc/uptime").read().split()[0])
    return boot + int(st) / os.sysconf("SC_CLK_TCK")


def go_duration(s):
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    return sum(float(v) * units[u] for v, u in re.findall(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", s))


def create_paced(prefix, count, pace, image):
    """Creates `count` pause pods prefix-NNN through the API, one every `pace` s (a steady
    trickle, each pod mostly alone on the node, as against a Deployment's burst)."""
    c = api()
    t0 = time.time()
    for i in range(int(count)):
        time.sleep(max(0.0, t0 + i * float(pace) - time.time()))
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "%s-%03d" % (prefix, i), "namespace": "default", "labels": {"app": prefix}},
               "spec": {"terminationGracePeriodSeconds": 2,
                        "containers": [{"name": "pause", "image": image, "imagePullPolicy": "Never"}]}}
        c.request("POST", "/api/v1/namespaces/default/pods", json.dumps(pod), {"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        if r.status != 201:
            print("creating pod %d: HTTP %d %s" % (i, r.status, body[:200]))
            return 1
    return 0


CTRD_TIME = re.compile(r'time="([^"]+)"')
SANDBOX_FOR = re.compile(r'msg="RunPodSandbox for name:\\"([^\\]+)\\" uid:\\"[^\\]*\\" namespace:\\"default\\"')
SANDBOX_ID = re.compile(r'returns sandbox id \\"([0-9a-f]+)\\"')
STARTED = re.compile(r'msg="StartContainer for \\"([0-9a-f]+)\\" returns successfully"')


def rfc3339(s):
    """containerd's log stamp (RFC 3339, nanoseconds, a zone) as seconds since the epoch."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", s)
    base = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S"))
    if m.group(3) != "Z":
        sign = 1 if m.group(3)[0] == "+" else -1
        base -= sign * (int(m.group(3)[1:3]) * 3600 + int(m.group(3)[4:6]) * 60)
    return base + float(m.group(2) or 0)


def containerd_times(logfile, offset):
    """From containerd's log after byte `offset`: per pod name, RunPodSandbox's begin and
    return; per container ID, StartContainer's return."""
    begin, ret, started = {}, {}, {}
    with open(logfile, "rb") as f:
        f.seek(int(offset))
        for line in f.read().decode(errors="replace").splitlines():
            t = CTRD_TIME.search(line)
            m = SANDBOX_FOR.search(line)
            if t and m:
                if SANDBOX_ID.search(line):
                    ret.setdefault(m.group(1), rfc3339(t.group(1)))
                else:
                    begin.setdefault(m.group(1), rfc3339(t.group(1)))
                continue
            m = STARTED.search(line)
            if t and m:
                started.setdefault(m.group(1), rfc3339(t.group(1)))
    return begin, ret, started


STARTUP = re.compile(r'"Observed pod startup duration" pod="default/([^"]+)" '
                     r'podStartSLOduration=([0-9.e+-]+) podStartE2EDuration="([^"]*)"')


def startups(logfile, offset, prefix):
    """kubelet's pod-start figures of pods named prefix*, logged after byte `offset`."""
    got = {}
    with open(logfile, "rb") as f:
        f.seek(int(offset))
        for line in f.read().decode(errors="replace").splitlines():
            m = STARTUP.search(line)
            if m and m.group(1).startswith(prefix):
                got[m.group(1)] = (float(m.group(2)), go_duration(m.group(3)))
    return got


def watch_starts(watchf, old):
    """Per pod: its first event (ADDED: the ReplicaSet made it) and its first Ready on a
    container not in `old`, as the watch saw them."""
    first, ready, cids = {}, {}, {}
    for line in open(watchf):
        if line.startswith("#"):
            continue
        t, typ, name, cid, r = line.rstrip("\n").split("\t")
        first.setdefault(name, float(t))
        if r == "True" and cid != "-" and cid != old.get(name) and name not in ready:
            ready[name] = float(t)
            cids[name] = cid.split("://")[-1]
    return first, ready, cids


def steady_collect(logfile, offset, prefix, want, out, variant, rnd, watchf, ctrd_log, ctrd_off):
    """Waits up to 5 s for kubelet's `want` figures; appends 'variant round pod slo e2e
    watch sandbox started' rows (nan where missing). watch: created to Ready, as the watch
    saw both; sandbox: RunPodSandbox's span in containerd's log (the CNI ADD is in it);
    started: created (the watch) to StartContainer's return (containerd's log), pod start
    up to the moment kubelet's status loop (PLEG, a relist each second) may notice it.
    kubelet's tracker misses a pod whose Running it saw on its watch before its own status
    update recorded it; it then logs the pod at its next watch event (the deletion), a
    figure of this script's pace: so only what it logged by now counts."""
    t = time.time()
    got = startups(logfile, offset, prefix)
    while len(got) < int(want) and time.time() - t < 5:
        time.sleep(1)
        got = startups(logfile, offset, prefix)
    first, ready, cids = watch_starts(watchf, {})
    begin, ret, started = containerd_times(ctrd_log, ctrd_off)
    nan = float("nan")
    seen = {p: ready[p] - first[p] for p in ready}
    sandbox = {p: ret[p] - begin[p] for p in ready if p in begin and p in ret}
    up = {p: started[cids[p]] - first[p] for p in ready if cids.get(p) in started}
    with open(out, "a") as f:
        for pod in sorted(set(got) | set(seen)):
            slo, e2e = got.get(pod, (nan, nan))
            f.write("%s\t%s\t%s\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\n" % (
                variant, rnd, pod, slo, e2e, seen.get(pod, nan), sandbox.get(pod, nan), up.get(pod, nan)))
    slo, w = [v[0] for v in got.values()], list(seen.values())
    if not slo or not w or not up:
        print("kubelet logged %d figures, the watch saw %d pods Ready, containerd's log %d started" % (
            len(slo), len(w), len(up)))
        return 1
    print("kubelet: %d pods, median %.3f s; the watch: %d pods, median %.3f s, p90 %.3f s; "
          "sandbox: mean %.0f ms; created to started: %d pods, mean %.0f ms" % (
              len(slo), statistics.median(slo), len(w), statistics.median(w), pct(w, 0.9),
              statistics.mean(sandbox.values()) * 1e3, len(up), statistics.mean(up.values()) * 1e3))
    return 0 if len(got) >= int(want) and len(up) == len(w) else 1


def calls(path, offset):
    rows = []
    with open(path, "rb") as f:
        f.seek(int(offset))
        for line in f.read().decode(errors="replace").splitlines():
            x = line.split("\t")
            if len(x) >= 7:
                args = dict(kv.split("=", 1) for kv in x[6].split(";") if "=" in kv)
                rows.append((float(x[0]), x[1], x[2], x[3], x[4], args.get("K8S_POD_NAME", "")))
    return rows


def storm_collect(watchf, old_json, calls_path, calls_off, variant, rnd, out, t_restart, t_ready):
    """Per pod: kubelet's start to Ready on a new container; what the chain did meanwhile."""
    old = json.load(open(old_json))
    k0 = kubelet_start()
    _, ready, _ = watch_starts(watchf, old)
    secs = sorted(v - k0 for v in ready.values())
    with open(out, "a") as f:
        for name, t in sorted(ready.items()):
            f.write("%s\t%s\t%s\t%.3f\n" % (variant, rnd, name, t - k0))
    rows = calls(calls_path, calls_off)
    oldids = set(json.load(open(old_json + ".sandboxes")))
    dels = [t for t, p, c, i, *_ in rows if p == "bridge" and c == "DEL" and i in oldids]
    adds = {}
    for t, p, c, i, ns, pod in rows:
        if c == "ADD" and pod:
            adds.setdefault(i, {}).setdefault(p, t)
    bridge = sorted(a["bridge"] for a in adds.values() if "bridge" in a)
    # bridge's start to portmap's start: bridge's ADD (host-local, veth, ipMasq rules).
    span = [a["portmap"] - a["bridge"] for a in adds.values() if "bridge" in a and "portmap" in a]
    s = ("kubelet started %.1f s after the restart began, the Node Ready %.1f s after kubelet; "
         "%d pods Ready again: p50 %.2f s, p90 %.2f s, max %.2f s after kubelet's start"
         % (k0 - t_restart, t_ready - k0, len(secs), pct(secs, 0.5), pct(secs, 0.9), max(secs)))
    if bridge:
        s += "; the pods' bridge ADDs from %.1f to %.1f s (bridge to portmap: median %.0f ms, p90 %.0f ms)" % (
            bridge[0] - k0, bridge[-1] - k0, statistics.median(span) * 1e3, pct(span, 0.9) * 1e3)
    if dels:
        s += "; %d bridge DELs of the old sandboxes from %.1f to %.1f s" % (len(dels), min(dels) - k0, max(dels) - k0)
    w = os.path.dirname(out)
    try:
        s += "; the machine's CPU from the restart to the last pod Ready: %.0f s busy of %.0f s" % busy("%s/stat-%s" % (w, rnd))
        use, thr = [int(x) for x in open("%s/agent-cpu-%s" % (w, rnd)).read().split()]
        s += "; the agent's pod (gc and the plugins it ran): %.1f s CPU, %.1f s throttled (its 500m limit)" % (use / 1e9, thr / 1e9)
    except (OSError, ValueError):
        pass
    print(s)
    with open(out + ".rounds", "a") as f:
        f.write("%s\t%s\t%s\n" % (variant, rnd, s))
    return 0


def cpu_delta(stat_file, agent_file, plugins_file):
    """The machine's busy CPU seconds between the two /proc/stat lines of stat_file, the
    CNI plugins' (containerd's reaped children: two tick counts in plugins_file), and the
    agent's pod's between the two "usage_ns throttled_ns" lines of agent_file."""
    s = "the machine's CPU: %.1f s busy of %.1f s" % busy(stat_file)
    c0, c1 = [int(l) for l in open(plugins_file)]
    s += "; containerd's children (the CNI plugins): %.2f s" % ((c1 - c0) / os.sysconf("SC_CLK_TCK"))
    try:
        (u0, _), (u1, _) = [[int(x) for x in l.split()] for l in open(agent_file)]
        s += "; the agent's pod: %.2f s CPU" % ((u1 - u0) / 1e9)
    except (OSError, ValueError):
        pass
    print(s)
    return 0


def live_dels(calls_path, calls_off, live_json):
    live = set(json.load(open(live_json)))
    bad = [r for r in calls(calls_path, calls_off) if r[2] == "DEL" and r[3] in live]
    for r in bad:
        print("DEL of a live sandbox: %s %s %s" % (r[1], r[3], r[5]))
    return 1 if bad else 0


MEASURES = (
    ("kubelet", "kubelet's podStartSLOduration (created, to the second, to running as its watch saw it)"),
    ("watch", "the pod created to Ready, as a watch on the API server saw both"),
    ("started", "the pod created (the watch) to its container started (containerd's log): before kubelet's status loop"),
    ("sandbox", "RunPodSandbox, in containerd's log (the CNI ADD is in it)"),
)


def pair_boot(per, k, stat):
    """95% bootstrap interval of stat(with, without) over the pooled rounds, resampling
    whole ABBA pairs (a pair's rounds ran back to back: the machine's speed is shared)."""
    rng = random.Random(1)
    ids = sorted({r // 2 for r in per})
    boot = []
    for _ in range(2000):
        px = {"with": [], "without": []}
        for i in (rng.choice(ids) for _ in ids):
            for r in (2 * i, 2 * i + 1):
                if r in per:
                    px[per[r][0]].extend(per[r][1][k])
        if px["with"] and px["without"]:
            boot.append(stat(px["with"], px["without"]))
    return pct(boot, 0.025), pct(boot, 0.975)


def report_steady(path):
    per = {}  # round -> (variant, {measure: [secs]})
    for line in open(path):
        x = line.rstrip("\n").split("\t")
        v, r, vals = x[0], int(x[1]), dict(zip(("kubelet", "e2e", "watch", "sandbox", "started"), map(float, x[3:])))
        m = per.setdefault(r, (v, {k: [] for k, _ in MEASURES}))[1]
        for k, _ in MEASURES:
            if vals.get(k, float("nan")) == vals.get(k, float("nan")):
                m[k].append(vals[k])
    mean = statistics.mean
    pools = {}
    for k, what in MEASURES:
        pool = {v: [x for w, m in per.values() if w == v for x in m[k]] for v in ("with", "without")}
        if not (pool["with"] and pool["without"]):
            continue
        pools[k] = pool
        print("#### %s" % what)
        print()
        print("| round | variant | pods | median | mean | p90 | pair's ratio of medians (with/without) |")
        print("|---|---|---|---|---|---|---|")
        pairs = []
        for r in sorted(per):
            v, xs = per[r][0], per[r][1][k]
            if not xs:
                continue
            ratio = ""
            if r % 2 == 1 and r - 1 in per and per[r - 1][1][k]:
                a = {per[r - 1][0]: per[r - 1][1][k], v: xs}
                if "with" in a and "without" in a:
                    q = statistics.median(a["with"]) / statistics.median(a["without"])
                    pairs.append(q)
                    ratio = "%.3f×" % q
            print("| %d | %s | %d | %.3f s | %.3f s | %.3f s | %s |" % (
                r + 1, v, len(xs), statistics.median(xs), mean(xs), pct(xs, 0.9), ratio))
        for v in ("with", "without"):
            xs = pool[v]
            print("| all | %s | %d | %.3f s | %.3f s | %.3f s | |" % (v, len(xs), statistics.median(xs), mean(xs), pct(xs, 0.9)))
        print()
        mw, mo = statistics.median(pool["with"]), statistics.median(pool["without"])
        lo, hi = pair_boot(per, k, lambda a, b: statistics.median(a) / statistics.median(b))
        dlo, dhi = pair_boot(per, k, lambda a, b: mean(a) - mean(b))
        print("pooled ratio of medians with/without: **%.3f×** [95%% CI %.3f–%.3f] (p90s: %.3f×; means: %.3f×); "
              "mean with − without: %+.1f ms [95%% CI %+.1f to %+.1f]; per ABBA pair: %s" % (
                  mw / mo, lo, hi, pct(pool["with"], 0.9) / pct(pool["without"], 0.9),
                  mean(pool["with"]) / mean(pool["without"]), (mean(pool["with"]) - mean(pool["without"])) * 1e3,
                  dlo * 1e3, dhi * 1e3, ", ".join("%.3f" % q for q in pairs)))
        print()
    if "watch" in pools:
        # The ledger's plugin runs only inside the CNI ADD, inside RunPodSandbox; after
        # StartContainer it runs nothing for the pod. Its cost to the mean pod start is
        # its cost to those spans (the agent's CPU aside, which cpu-delta shows per round).
        base = mean(pools["watch"]["without"])
        for k, what in (("started", "up to the container started"), ("sandbox", "in RunPodSandbox")):
            if k not in pools:
                continue
            _, dhi = pair_boot(per, k, lambda a, b: mean(a) - mean(b))
            d = mean(pools[k]["with"]) - mean(pools[k]["without"])
            print("pod start's mean without the ledger (watch): %.3f s; the ledger's cost %s: %+.1f ms "
                  "(95%% upper bound %+.1f ms): with/without **%.4f×**, at most %.4f×" % (
                      base, what, d * 1e3, dhi * 1e3, 1 + d / base, 1 + dhi / base))
            print()


def report_storm(path):
    per = {}
    for line in open(path):
        v, r, pod, s = line.rstrip("\n").split("\t")
        per.setdefault(int(r), (v, []))[1].append(float(s))
    print("| round | variant | pods back | p50 | p90 | max | pair's ratio of p90s (replay/empty) |")
    print("|---|---|---|---|---|---|---|")
    pairs = []
    for r in sorted(per):
        v, xs = per[r]
        ratio = ""
        if r % 2 == 1 and r - 1 in per:
            a = {per[r - 1][0]: per[r - 1][1], v: xs}
            if "replay" in a and "empty" in a:
                q = pct(a["replay"], 0.9) / pct(a["empty"], 0.9)
                pairs.append(q)
                ratio = "%.3f×" % q
        print("| %d | %s | %d | %.2f s | %.2f s | %.2f s | %s |" % (r + 1, v, len(xs), pct(xs, 0.5), pct(xs, 0.9), max(xs), ratio))
    pool = {v: [x for w, xs in per.values() if w == v for x in xs] for v in ("replay", "empty")}
    if pool["replay"] and pool["empty"]:
        print()
        print("pooled p90 replay/empty: **%.3f×** (p50s: %.3f×); per pair: %s" % (
            pct(pool["replay"], 0.9) / pct(pool["empty"], 0.9),
            pct(pool["replay"], 0.5) / pct(pool["empty"], 0.5), ", ".join("%.3f" % q for q in pairs)))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    f = {"watch": lambda a: watch(a[0], a[1], a[2], int(a[3]), int(a[4])),
         "kubelet-start": lambda a: print("%.3f" % kubelet_start()) or 0,
         "steady-collect": lambda a: steady_collect(*a),
         "create-paced": lambda a: create_paced(*a),
         "storm-collect": lambda a: storm_collect(*a[:7], float(a[7]), float(a[8])),
         "live-dels": lambda a: live_dels(*a),
         "cpu-delta": lambda a: cpu_delta(*a),
         "report-steady": lambda a: report_steady(*a) or 0,
         "report-storm": lambda a: report_storm(*a) or 0}[cmd]
    sys.exit(f(args))
PY

# --- the agent ------------------------------------------------------------------------

# The manifest's image name, as `kubectl apply -k` applies it.
IMAGE=$(kubectl kustomize "$BASE" | sed -n 's/^ *image: //p' | head -1)
agent_on=
agent_pods() { kubectl -n kube-system get pods -l app.kubernetes.io/name=cni-ledger -o name 2>/dev/null; }
chain() { python3 -c 'import json,sys; print(",".join(p["type"] for p in json.load(open(sys.argv[1]))["plugins"]))' \
	"$N_/etc/cni/net.d/10-pods.conflist"; }
wait_for() { # SECONDS WHAT CMD...: retry CMD every 0.5 s
	local secs=$1 what=$2 i
	shift 2
	for ((i = 0; i < secs * 2; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.5
	done
	die "not after $secs s: $what"
}
ledger_first() { [[ $(chain) == cni-ledger,* ]]; }
agent_ready() {
	kubectl -n kube-system wait --for=condition=Ready pod -l app.kubernetes.io/name=cni-ledger --timeout=1s
}
install_agent() { # as tests/k8s_common's install_agent
	ctr images import "$W/agent.tar" >/dev/null 2>&1
	ctr images tag --force "$(cat "$W/agent.tag")" "$IMAGE" >/dev/null 2>&1
	# For the restart that loses containerd's root: cluster.sh imports $D/images/*.tar again.
	mkdir -p "$D/images"
	ctr images export "$D/images/agent.tar" "$IMAGE" >/dev/null 2>&1
	agent_apply
}
agent_apply() {
	kubectl apply -k "$BASE" >/dev/null
	kubectl -n kube-system rollout status daemonset/cni-ledger --timeout=180s >/dev/null
	wait_for 120 "the agent Ready" agent_ready
	wait_for 60 "the ledger first in the node's conflist" ledger_first
	agent_on=1
}
agent_remove() { # as tests/k8s_node.rs uninstalls it
	kubectl delete -k "$BASE" --wait=true --timeout=120s >/dev/null
	wait_for 120 "the agent's pod gone" bash -c "[ -z \"\$(kubectl -n kube-system get pods -l app.kubernetes.io/name=cni-ledger -o name)\" ]"
	on_node /opt/cni/bin/cni-ledger agent --uninstall --conf-dir=/etc/cni/net.d >/dev/null
	[ "$(chain)" = bridge,portmap ] || die "the chain after --uninstall: $(chain)"
	agent_on=
}

deployment() { # NAME REPLICAS
	cat <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: $1, namespace: default}
spec:
  replicas: $2
  selector: {matchLabels: {app: $1}}
  template:
    metadata: {labels: {app: $1}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: pause
        image: $PAUSE
        imagePullPolicy: Never
EOF
}
n_records() { find "$RECORDS" -maxdepth 1 -name "$NET:*.json" 2>/dev/null | wc -l; }
n_addrs() { find "$ADDRS" -maxdepth 1 -name '10.*' 2>/dev/null | wc -l; }
# TRACE=1: perf records the plugins' runs, by their names (the agent's own process has
# the ledger's name too: plugin_time.py counts only programs exec'd from the plugin dirs).
PLUGINS="cni-ledger bridge host-local portmap loopback"
trace_filter() { # FIELD...: comm=="a" || ... for each field
	local f p out=
	for f; do for p in $PLUGINS; do out+="${out:+ || }$f==\"$p\""; done; done
	echo "$out"
}
trace_start() { # ROUND
	[ "${TRACE:-0}" = 1 ] || return 0
	local c s
	c=$(trace_filter comm)
	s=$(trace_filter prev_comm next_comm)
	perf record -q -a -o "$W/trace-$1.perf" -e raw_syscalls:sys_enter --filter "$c" \
		-e raw_syscalls:sys_exit --filter "$c" -e sched:sched_switch --filter "$s" \
		-e sched:sched_wakeup --filter "$c" -e sched:sched_process_exec --filter "$c" \
		-e sched:sched_process_exit --filter "$c" 2>"$W/trace-$1.err" &
	trace_pid=$!
	sleep 2 # perf's start
}
trace_stop() { # ROUND VARIANT
	[ "${TRACE:-0}" = 1 ] || return 0
	kill -INT "$trace_pid"
	wait "$trace_pid" || true
	perf script -i "$W/trace-$1.perf" -F comm,pid,tid,cpu,time,event,trace >"$W/trace-$1.txt" 2>/dev/null
	rm -f "$W/trace-$1.perf"
	echo "$W/trace-$1.txt" >>"$W/trace-$2.list"
}
trace_report() { # PODS
	[ "${TRACE:-0}" = 1 ] || return 0
	local v args=()
	for v in with without; do
		[ -s "$W/trace-$v.list" ] && args+=("$v=$(paste -sd, "$W/trace-$v.list")")
	done
	echo "### where the plugins' runs went (TRACE=1)"
	echo
	python3 "$here/plugin_time.py" --pods "$1" --under /opt/cni/bin \
		--under "${CNI_LEDGER_K8S_CNI_BIN:-/usr/lib/cni}" "${args[@]}"
}

sandboxes() { crictl pods --namespace default --state ready -q 2>/dev/null | sort; }
failures() {
	kubectl get events -A -o json | python3 -c 'import json,sys
print(sum(e.get("count", 1) or 1 for e in json.load(sys.stdin)["items"]
          if e.get("reason") in ("FailedCreatePodSandBox", "FailedKillPod")))'
}
load() { cut -d' ' -f1-3 /proc/loadavg; }
# The agent's pod's CPU since its cgroup was made (the restart makes it anew), its
# replayed plugins included (they run in its cgroup): "usage_ns throttled_ns".
agent_cpu() {
	local uid d
	uid=$(kubectl -n kube-system get pods -l app.kubernetes.io/name=cni-ledger -o jsonpath='{.items[0].metadata.uid}')
	for d in /sys/fs/cgroup/cpuacct/cni-ledger-k8s/kubepods/{,*/}"pod$uid"; do
		[ -f "$d/cpuacct.usage" ] || continue
		echo "$(cat "$d/cpuacct.usage") $(sed -n 's/^throttled_time //p' "${d/cpuacct/cpu}/cpu.stat" 2>/dev/null || echo 0)"
		return
	done
	echo "0 0"
}
# The CPU ticks of the reaped children of one of cluster.sh's processes (cutime + cstime):
# for containerd, the CNI plugins it ran (the shims it starts daemonize and are not its).
children_cpu() {
	local s
	s=$(cat "/proc/$(cut -d' ' -f1 "$D/pid/$1")/stat")
	s=${s##*) }
	set -- $s
	echo $((${14} + ${15}))
}
size() { stat -c %s "$1" 2>/dev/null || echo 0; }

log "cluster up; installing the agent ($IMAGE)"
install_agent
log "the chain: $(chain)"

# --- steady -----------------------------------------------------------------------------

pods_gone() { # DEPLOYMENT: its pods deleted, their DELs done
	wait_for 180 "the pods of $1 gone" bash -c "[ -z \"\$(kubectl get pods -l app=$1 -o name)\" ]"
	# Stopped sandboxes (their DEL done) wait for kubelet's minutely GC: not counted.
	wait_for 120 "no ready sandbox, record or address left" \
		bash -c "[ -z \"\$(crictl --runtime-endpoint unix://$SOCK pods --namespace default --state ready -q)\" ] &&
			[ \$(find $RECORDS -maxdepth 1 -name '$NET:*.json' | wc -l) -eq 0 ] &&
			[ \$(find $ADDRS -maxdepth 1 -name '10.*' | wc -l) -eq 0 ]"
}

steady() {
	local rounds=${1:-6} pods=${2:-20} r v name off coff fails watcher
	: >"$W/steady.tsv"
	# The node's first pods make the bridge and the nat chains: a round untimed, first.
	log "warm-up: $pods pods, untimed"
	deployment podstart-warm "$pods" | kubectl apply -f - >/dev/null
	kubectl rollout status deployment/podstart-warm --timeout=300s >/dev/null
	kubectl delete deployment podstart-warm --wait=true >/dev/null
	pods_gone podstart-warm
	for ((r = 0; r < rounds; r++)); do
		# ABBA: pair k runs (with, without) when k is even, else (without, with).
		if (((r / 2) % 2 == r % 2)); then v=with; else v=without; fi
		if [ $v = with ] && [ -z "$agent_on" ]; then agent_apply; fi
		if [ $v = without ] && [ -n "$agent_on" ]; then agent_remove; fi
		sleep "${SETTLE:-20}"
		name=podstart-r$r
		off=$(size "$D/log/kubelet.log")
		coff=$(size "$D/log/containerd.log")
		fails=$(failures)
		echo '{}' >"$W/none.json"
		py watch "$W/watch-$r.tsv" "app=$name" "$W/none.json" "$pods" 300 &
		watcher=$!
		wait_for 30 "the watch established" grep -q '^# watching' "$W/watch-$r.tsv"
		log "round $((r + 1))/$rounds ($v, chain $(chain)): $pods pods; load $(load)"
		head -1 /proc/stat >"$W/sstat-$r"
		children_cpu containerd >"$W/splugins-$r"
		: >"$W/sagent-$r"
		[ -z "$agent_on" ] || agent_cpu >>"$W/sagent-$r"
		trace_start "$r"
		if [ -n "${PACE:-}" ]; then
			py create-paced "$name" "$pods" "$PACE" "$PAUSE" || die "creating the pods"
		else
			deployment "$name" "$pods" | kubectl apply -f - >/dev/null
		fi
		wait "$watcher" || die "not all $pods pods Ready within 300 s"
		trace_stop "$r" "$v"
		head -1 /proc/stat >>"$W/sstat-$r"
		children_cpu containerd >>"$W/splugins-$r"
		[ -z "$agent_on" ] || agent_cpu >>"$W/sagent-$r"
		log "  from the Deployment to the last pod Ready, $(py cpu-delta "$W/sstat-$r" "$W/sagent-$r" "$W/splugins-$r")"
		[ -n "${PACE:-}" ] || kubectl rollout status "deployment/$name" --timeout=300s >/dev/null
		if [ $v = with ]; then
			[ "$(n_records)" -eq "$pods" ] || die "$v: $(n_records) records for $pods pods"
		else
			[ "$(n_records)" -eq 0 ] || die "$v: $(n_records) records without the ledger"
		fi
		log "  $(py steady-collect "$D/log/kubelet.log" "$off" "$name-" "$pods" "$W/steady.tsv" "$v" "$r" "$W/watch-$r.tsv" "$D/log/containerd.log" "$coff")"
		[ "$(failures)" = "$fails" ] || log "  sandbox failures: $fails -> $(failures)"
		if [ -n "${PACE:-}" ]; then
			kubectl delete pods -l "app=$name" --wait=true >/dev/null
		else
			kubectl delete deployment "$name" --wait=true >/dev/null
		fi
		pods_gone "$name"
		log "  done; load $(load)"
	done
	echo "### steady: $rounds rounds × $pods pods${PACE:+, one every $PACE s}"
	echo
	py report-steady "$W/steady.tsv"
	trace_report "$pods"
}

# --- storm ------------------------------------------------------------------------------

storm() {
	local n=$1 rounds=${2:-2} first=${FIRST:-replay} r v ready_at t0 t1 off fails
	[ "$first" = replay ] || [ "$first" = empty ] || die "FIRST is replay or empty"
	: >"$W/storm.tsv"
	log "a Deployment of $n pods; load $(load)"
	deployment storm "$n" | kubectl apply -f - >/dev/null
	kubectl rollout status deployment/storm --timeout=600s >/dev/null
	ready_at=$SECONDS
	for ((r = 0; r < rounds; r++)); do
		if ((r % 2 == 0)); then v=$first; elif [ "$first" = replay ]; then v=empty; else v=replay; fi
		# The pods' records must be past gc's --grace (60 s), as on a node up for a while.
		wait_for 120 "all $n pods with a record" bash -c "[ \$(find $RECORDS -maxdepth 1 -name '$NET:*.json' | wc -l) -eq $n ]"
		local left=$((62 - (SECONDS - ready_at)))
		[ $left -le 0 ] || {
			log "round $((r + 1))/$rounds ($v): ${left} s more, past gc's grace"
			sleep $left
		}
		kubectl get pods -l app=storm -o json | python3 -c 'import json,sys
print(json.dumps({p["metadata"]["name"]: p["status"]["containerStatuses"][0]["containerID"]
                  for p in json.load(sys.stdin)["items"]}))' >"$W/old-$r.json"
		sandboxes | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().split()))' >"$W/old-$r.json.sandboxes"
		[ "$(n_addrs)" -eq "$n" ] || die "host-local holds $(n_addrs) addresses for $n pods"
		((2 * n <= 253)) || die "N=$n: the old and new addresses would not fit 10.244.0.0/24"
		if [ $v = empty ]; then
			# What a clean release would have left: no record, note, address or cache entry.
			local id f holder
			local -A old_ids=()
			for id in $(python3 -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))))' "$W/old-$r.json.sandboxes"); do
				old_ids[$id]=1
				rm -f "$RECORDS/$NET:$id:eth0.json" "$N_/var/lib/cni-ledger/notes/$NET:$id:eth0.json" \
					"$N_/var/lib/cni/results/$NET-$id-eth0"
			done
			# host-local's file: the container ID, CRLF, the interface.
			for f in "$ADDRS"/10.*; do
				read -r holder <"$f" || true
				[ -z "${old_ids[${holder%$'\r'}]:-}" ] || rm -f "$f"
			done
			[ "$(n_records)/$(n_addrs)" = 0/0 ] || die "empty: left $(n_records) records, $(n_addrs) addresses"
		fi
		off=$(size "$D/cni-calls.log")
		fails=$(failures)
		py watch "$W/watch-$r.tsv" app=storm "$W/old-$r.json" "$n" 600 &
		local watcher=$!
		wait_for 30 "the watch established" grep -q '^# watching' "$W/watch-$r.tsv"
		log "round $((r + 1))/$rounds ($v): the restart; load $(load)"
		t0=$(date +%s.%N)
		head -1 /proc/stat >"$W/stat-$r"
		cluster restart --lose-runtime-state 2>"$W/restart-$r.log" || die "restart: $(tail -5 "$W/restart-$r.log")"
		t1=$(date +%s.%N)
		wait "$watcher" || die "not all $n pods Ready again within 600 s"
		head -1 /proc/stat >>"$W/stat-$r"
		ready_at=$SECONDS
		# The old boot's attachments all released (replay: by the agent's gc).
		wait_for 180 "the old boot's addresses released" bash -c "[ \$(find $ADDRS -maxdepth 1 -name '10.*' | wc -l) -eq $n ]"
		wait_for 60 "the old boot's records released" bash -c "[ \$(find $RECORDS -maxdepth 1 -name '$NET:*.json' | wc -l) -eq $n ]"
		agent_cpu >"$W/agent-cpu-$r"
		log "  $(py storm-collect "$W/watch-$r.tsv" "$W/old-$r.json" "$D/cni-calls.log" "$off" "$v" "$r" "$W/storm.tsv" "$t0" "$t1")"
		sandboxes | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().split()))' >"$W/live-$r.json"
		py live-dels "$D/cni-calls.log" "$off" "$W/live-$r.json" >&2 || log "  DELs of live sandboxes (above)"
		[ "$(failures)" = "$fails" ] || log "  sandbox failures: $fails -> $(failures)"
		kubectl -n kube-system logs daemonset/cni-ledger --timestamps >"$W/agent-$r.log" 2>&1 || true
		grep -E 'gc: (done|replays waited|waited)|the most it may' "$W/agent-$r.log" | sed 's/^/[podstart]   agent: /' >&2 || true
		log "  done; load $(load)"
	done
	echo "### storm: N = $n, $rounds rounds (kubelet's start to the pod Ready on a new container)"
	echo
	py report-storm "$W/storm.tsv"
	echo
	sed 's/^/- round /' "$W/storm.tsv.rounds"
}

case $MODE in
steady) steady "$@" ;;
storm) storm "$@" ;;
esac
