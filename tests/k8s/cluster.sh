#!/usr/bin/env bash
# tests/k8s/cluster.sh [up|down|restart|status|env]: a one-node Kubernetes on this machine, no
# kubeadm, for the tests. Everything listens on 127.0.0.1 (etcd 12379/12380, API server
# 16443, controller-manager 10257, scheduler 10259, kubelet's healthz 10248) but kubelet's
# API (10250): kubelet refuses a loopback node IP, so the Node's InternalIP is
# CNI_LEDGER_K8S_NODE_IP (default 198.18.254.1/32) on a veth pair of ours (cnik8snode0),
# and kubelet listens there; the API server reaches it (logs, exec) by InternalIP.
# Pods: bridge cnik8s0, host-local 10.244.0.0/24, portmap; no kube-proxy, no DNS, no
# `kubernetes` Service endpoints (--endpoint-reconciler-type none).
#
# The node (containerd, kubelet, the shims and every pod) runs in a mount and PID namespace
# of its own, as a kind node does, in the machine's network namespace. Its PID 1 is a small
# reaper (node-init), so a hostPID pod's /proc/1/root is the node's root, as on a real node.
# In it the standard node paths are the node's own dirs under $D/node, bound over the
# machine's: /etc/cni/net.d, /opt/cni/bin, /var/lib/cni, /var/lib/cni-ledger, /run/netns,
# /run/containerd (containerd's socket and state dir: /run/containerd/containerd.sock in
# the node, $D/node/run/containerd/containerd.sock from outside). So the shipped DaemonSet
# runs unchanged (--node-root=/proc/1/root, /opt/cni/bin, /etc/cni/net.d, CRI discovery)
# and the machine's own CNI dirs (podman's conflist, other tests' files) are never touched.
# The node's /opt/cni/bin holds wrappers of the plugins of CNI_LEDGER_K8S_CNI_BIN that log
# each call to $D/cni-calls.log, one line each, tab-separated: time, plugin, CNI_COMMAND,
# CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS (the runtime's calls and the replays
# of anything running in the node alike).
#
#   up      builds (or finds cached) the pinned binaries with scripts/build-k8s.sh, then
#           starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
#           containerd (its own root, state, socket and CNI conf dir) and kubelet, each
#           recorded by PID and start time, and waits for the Node to be Ready.
#           A cluster already up is left alone.
#   restart [--lose-runtime-state]
#           an unclean reboot of the node: SIGKILL to the node's PID 1 (kubelet,
#           containerd, the shims and the pods die at once), then what a reboot clears: the
#           node's /run (the pods' netns files, containerd's state dir), the bridge, the
#           nat rules and chains of this network (bridge's masquerade, portmap's DNAT),
#           kubelet's cgroups; with --lose-runtime-state containerd's root dir too (its
#           images with it: the pause image is imported again, and every archive in
#           $D/images/*.tar, made with `ctr images export`, before kubelet starts; as a
#           registry would serve them). Then containerd and kubelet start again, and it waits
#           for the Node to be Ready. The control plane, kubelet's root dir, the node's
#           /var/lib/cni and /var/lib/cni-ledger stay, as on a disk.
#   down    stops every pod through the CRI, then each process it started (by PID,
#           checked against the recorded start time), unmounts what is left under its
#           dir, removes its cgroups (kubelet's cgroupRoot /cni-ledger-k8s, made by up in every
#           hierarchy), its links, the /var/log/containers links into it, and its dir.
#   load-image TAR FROM NAME
#           an archive of `podman save` into the node's runtime (containerd: ctr import;
#           CRI-O: podman load into its storage), its image FROM tagged NAME, and kept in
#           $D/images for `restart` to load again.
#   status  which of its processes run, and the Node's Ready condition.
#   env     prints `export KUBECONFIG=... PATH=...` for a shell (eval "$(cluster.sh env)").
#
# Settings (environment): CNI_LEDGER_K8S_DIR (default /var/lib/cni-ledger-k8s: certs,
# configs, logs, etcd data, containerd root, kubelet root, the node's dirs),
# CNI_LEDGER_K8S_CACHE (the binaries' cache, see scripts/build-k8s.sh),
# CNI_LEDGER_K8S_NODE (the Node's name, default cni-ledger-k8s),
# CNI_LEDGER_K8S_CNI_BIN (the plugins wrapped into the node's /opt/cni/bin, default
# /usr/lib/cni: Debian's containernetworking-plugins), CNI_LEDGER_K8S_TIMEOUT (seconds to wait for Ready, 240).
# CNI_LEDGER_K8S_MAX_PODS: kubelet's maxPods (its default, 110, counts the agent's pod too).
# CNI_LEDGER_K8S_CALL_LOG=0: the plugins copied into the node's /opt/cni/bin as they are,
# without the logging wrappers and their call log: a node as users run one (each wrapper
# costs a shell and a `date`, a millisecond or two of CPU per call; bench/k8s-podstart.sh
# steady times pod starts so).
# CNI_LEDGER_K8S_IPAM=whereabouts: the pods' addresses from whereabouts (scripts/build-whereabouts.sh
# builds it) over the same range instead of host-local, its leases in IPPools of the API server:
# `up` applies the CRDs the build copies once the API server is ready, wraps the plugin into
# the node's /opt/cni/bin as the others, and writes the node's /etc/cni/net.d/whereabouts.d/
# as whereabouts' installer does (whereabouts.conf naming whereabouts.kubeconfig, a copy of
# the admin kubeconfig; the plugin logs to $D/log/whereabouts.log).
# CNI_LEDGER_K8S_RUNTIME=crio: the node runs CRI-O (scripts/build-crio.sh) instead of
# containerd, at /run/crio/crio.sock: tests/k8s/crio.sh, which this sources, says how.
#
# Machine facts it copes with: cgroups may be hybrid v1 (kubelet's failCgroupV1: false);
# root may lack CAP_SYS_RESOURCE (containerd's restrict_oom_score_adj); no swap check
# (failSwapOn: false); no image registry (the sandbox image is a static pause built here
# with gcc and imported with ctr, as tests/cri_common does).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

D=${CNI_LEDGER_K8S_DIR:-/var/lib/cni-ledger-k8s}
NODE=${CNI_LEDGER_K8S_NODE:-cni-ledger-k8s}
CNI_BIN=${CNI_LEDGER_K8S_CNI_BIN:-/usr/lib/cni}
IPAM=${CNI_LEDGER_K8S_IPAM:-host-local}
case $IPAM in host-local | whereabouts) ;; *) echo "cluster: CNI_LEDGER_K8S_IPAM is host-local or whereabouts, not '$IPAM'" >&2 && exit 1 ;; esac
WB=
TIMEOUT=${CNI_LEDGER_K8S_TIMEOUT:-240}
MAX_PODS=${CNI_LEDGER_K8S_MAX_PODS:-110}
cache=${CNI_LEDGER_K8S_CACHE:-/var/cache/cni-ledger-k8s}
export CNI_LEDGER_K8S_CACHE=$cache

# Loopback ports, away from the defaults of a real control plane where they can be.
ETCD_PORT=12379
ETCD_PEER_PORT=12380
API_PORT=16443
KCM_PORT=10257   # kube-controller-manager's secure port (healthz)
SCHED_PORT=10259 # kube-scheduler's
KUBELET_PORT=10250
KUBELET_HEALTHZ_PORT=10248
SERVICE_CIDR=10.96.0.0/24
POD_SUBNET=10.244.0.0/24
BRIDGE=cnik8s0
# kubelet refuses a loopback node IP, and the API server reaches kubelet (logs, exec) at
# the Node's address: a /32 on a link of ours (a veth pair), reachable from this machine only.
NODE_LINK=cnik8snode0
NODE_IP=${CNI_LEDGER_K8S_NODE_IP:-198.18.254.1}
SANDBOX_IMAGE=registry.invalid/cni-ledger-k8s/pause:1
# The cgroup (in each hierarchy) under which kubelet puts kubepods: ours alone.
CGROUP_ROOT=cni-ledger-k8s

K8S_BIN=$cache/kubernetes-v1.37.2/bin
ETCD_BIN=$cache/etcd-v3.7.4/bin
CTRD_BIN=$cache/containerd-v2.4.2/bin
RUNC_BIN=$cache/runc-v1.5.2/bin
CRICTL_BIN=$cache/crictl-v1.37.0/bin

# The node's own dirs, bound over the standard paths in its mount namespace.
N=$D/node
NODE_DIRS="etc/cni/net.d opt/cni/bin var/lib/cni var/lib/cni-ledger run/netns run/containerd"
NETWORK=cni-ledger-k8s
# containerd's socket: NODE_SOCK in the node, SOCK (the same socket) from outside.
NODE_SOCK=/run/containerd/containerd.sock
SOCK=$N$NODE_SOCK
# Unset, the runtime the cluster at $D was made with: `restart` and `down` need no setting.
RUNTIME=${CNI_LEDGER_K8S_RUNTIME:-$(cat "$D/runtime" 2>/dev/null || echo containerd)}
case $RUNTIME in containerd) ;; crio) . "$here/crio.sh" ;; *) echo "cluster: CNI_LEDGER_K8S_RUNTIME is containerd or crio, not '$RUNTIME'" >&2 && exit 1 ;; esac

say() { printf 'cluster: %s\n' "$*" >&2; }
die() {
	printf 'cluster: %s\n' "$*" >&2
	exit 1
}

kubectl() { "$K8S_BIN/kubectl" --kubeconfig "$D/kubeconfig/admin.conf" "$@"; }
# crictl's own config file, so that it reads no /etc/crictl.yaml (nor warns it is missing).
crictl() {
	[ -f "$D/crictl.yaml" ] || printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 10\n' \
		"$SOCK" "$SOCK" >"$D/crictl.yaml"
	"$CRICTL_BIN/crictl" --config "$D/crictl.yaml" "$@"
}
ctr() { "$CTRD_BIN/ctr" --address "$SOCK" --namespace k8s.io "$@"; }

# --- processes, known by PID and start time -------------------------------------------

# Field 22 of /proc/PID/stat (start time in clock ticks since boot); the command name
# (field 2) may hold spaces, so count from its closing parenthesis.
starttime() {
	local s
	s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	s=${s##*) }
	set -- $s
	echo "${20}"
}

# start NAME CMD...: runs CMD in a session of its own, logs to $D/log/NAME.log, records
# "PID STARTTIME" in $D/pid/NAME.
start() {
	local name=$1 pid st
	shift
	setsid "$@" >>"$D/log/$name.log" 2>&1 </dev/null &
	pid=$!
	st=$(starttime "$pid") || die "$name exited at once: $(tail -n 20 "$D/log/$name.log")"
	echo "$pid $st" >"$D/pid/$name"
	say "$name started, pid $pid (log $D/log/$name.log)"
}

# node_pid: the node's PID 1 (as this PID namespace numbers it), when it runs.
node_pid() {
	running node || return 1
	cut -d' ' -f1 "$D/pid/node"
}

# in_node NAME CMD...: as start, but CMD runs in the node's namespaces (nsenter). What is
# recorded is CMD's own process (nsenter forks it and only waits for it): the first
# descendant of the nsenter that is in the node's PID namespace.
in_node() {
	local name=$1 init ns pid= st i c todo next
	shift
	init=$(node_pid) || die "the node is not running"
	ns=$(readlink "/proc/$init/ns/pid")
	setsid nsenter -t "$init" -m -p -- "$@" >>"$D/log/$name.log" 2>&1 </dev/null &
	for i in $(seq 1 200); do
		todo=$!
		while [ -n "$todo" ] && [ -z "$pid" ]; do
			next=
			for c in $todo; do
				if [ "$(readlink "/proc/$c/ns/pid" 2>/dev/null)" = "$ns" ]; then
					pid=$c
					break
				fi
				next="$next $(cat /proc/$c/task/*/children 2>/dev/null)"
			done
			todo=$(echo $next)
		done
		[ -z "$pid" ] || break
		sleep 0.05
	done
	[ -n "$pid" ] || die "$name did not start in the node: $(tail -n 20 "$D/log/$name.log")"
	st=$(starttime "$pid") || die "$name exited at once: $(tail -n 20 "$D/log/$name.log")"
	echo "$pid $st" >"$D/pid/$name"
	say "$name started in the node, pid $pid (log $D/log/$name.log)"
}

# running NAME: true when the recorded process is still the one we started.
running() {
	local pid st
	[ -f "$D/pid/$1" ] || return 1
	read -r pid st <"$D/pid/$1" || return 1
	[ "$(starttime "$pid" 2>/dev/null)" = "$st" ]
}

# stop NAME: SIGTERM, up to 20 s, then SIGKILL; only the recorded process.
stop() {
	local name=$1 pid st i
	[ -f "$D/pid/$name" ] || return 0
	read -r pid st <"$D/pid/$name" || true
	if running "$name"; then
		say "stopping $name (pid $pid)"
		kill -TERM "$pid" 2>/dev/null || true
		for i in $(seq 1 100); do
			running "$name" || break
			sleep 0.2
		done
		if running "$name"; then
			say "$name did not exit on SIGTERM: SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
			sleep 0.5
		fi
	fi
	rm -f "$D/pid/$name"
}

# wait_for WHAT SECONDS CMD...: retry CMD until it succeeds.
wait_for() {
	local what=$1 secs=$2 i
	shift 2
	for ((i = 0; i < secs * 2; i++)); do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.5
	done
	return 1
}

# --- certificates --------------------------------------------------------------------

# cert NAME SUBJECT EXT: a key and a certificate signed by the cluster's CA.
cert() {
	local name=$1 subj=$2 ext=$3 p=$D/pki
	openssl genrsa -out "$p/$name.key" 2048 2>/dev/null
	openssl req -new -key "$p/$name.key" -subj "$subj" -out "$p/$name.csr" 2>/dev/null
	printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
		"$ext" >"$p/$name.ext"
	openssl x509 -req -in "$p/$name.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
		-days 3650 -sha256 -extfile "$p/$name.ext" -out "$p/$name.crt" 2>/dev/null
	rm -f "$p/$name.csr" "$p/$name.ext"
}

make_pki() {
	local p=$D/pki
	mkdir -p "$p"
	openssl genrsa -out "$p/ca.key" 2048 2>/dev/null
	openssl req -x509 -new -key "$p/ca.key" -subj "/CN=cni-ledger-k8s-ca" -days 3650 -sha256 \
		-addext "basicConstraints=critical,CA:TRUE" \
		-addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" -out "$p/ca.crt" 2>/dev/null
	cert apiserver "/CN=kube-apiserver" \
		"extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:${SERVICE_CIDR%.*/*}.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	cert admin "/O=system:masters/CN=cni-ledger-k8s-admin" "extendedKeyUsage=clientAuth"
	cert controller-manager "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
	cert scheduler "/CN=system:kube-scheduler" "extendedKeyUsage=clientAuth"
	cert kubelet "/O=system:nodes/CN=system:node:$NODE" "extendedKeyUsage=clientAuth"
	cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" \
		"extendedKeyUsage=clientAuth"
	# The service accounts' token signing key pair.
	openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
	openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
	chmod 600 "$p"/*.key
}

# kubeconfig NAME CERT: a kubeconfig for the client certificate CERT.
kubeconfig() {
	mkdir -p "$D/kubeconfig"
	cat >"$D/kubeconfig/$1.conf" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cni-ledger-k8s
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $D/pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $D/pki/$2.crt
    client-key: $D/pki/$2.key
contexts:
- name: cni-ledger-k8s
  context: {cluster: cni-ledger-k8s, user: $2}
current-context: cni-ledger-k8s
EOF
}

# --- the sandbox image -----------------------------------------------------------------

# A static pause in a one-layer image, as a `docker save` archive (no docker, no registry).
make_pause_image() {
	local img=$D/img
	mkdir -p "$img/rootfs"
	cat >"$img/pause.c" <<'EOF'
#include <signal.h>
#include <unistd.h>
static void bye(int s) { (void)s; _exit(0); }
int main(void) { signal(SIGTERM, bye); signal(SIGINT, bye); for (;;) pause(); }
EOF
	gcc -static -Os -s -o "$img/rootfs/pause" "$img/pause.c"
	tar -C "$img/rootfs" --owner=0 --group=0 --numeric-owner -cf "$img/layer.tar" pause
	local diff
	diff=$(sha256sum "$img/layer.tar" | cut -d' ' -f1)
	printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
		"$diff" >"$img/config.json"
	printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' \
		"$SANDBOX_IMAGE" >"$img/manifest.json"
	tar -C "$img" -cf "$img/pause.tar" manifest.json config.json layer.tar
}

# The node's PID 1: reaps whatever is orphaned to it (the shims are), and nothing else.
# Stopped by SIGKILL from outside, which takes every process of the node with it.
make_node_init() {
	mkdir -p "$D/img"
	cat >"$D/img/node-init.c" <<'EOF'
#include <signal.h>
#include <sys/wait.h>
int main(void) {
	sigset_t s;
	int sig;
	sigemptyset(&s);
	sigaddset(&s, SIGCHLD);
	sigprocmask(SIG_BLOCK, &s, 0);
	for (;;) {
		sigwait(&s, &sig);
		while (waitpid(-1, 0, WNOHANG) > 0) {
		}
	}
}
EOF
	gcc -static -Os -s -o "$D/img/node-init" "$D/img/node-init.c"
}

# The node's /opt/cni/bin: a logging wrapper of each plugin (see the header).
write_plugins() {
	local p name
	mkdir -p "$N/opt/cni/bin"
	for p in "$CNI_BIN"/* ${WB:+"$WB/bin/whereabouts"}; do
		[ -f "$p" ] && [ -x "$p" ] || continue
		name=${p##*/}
		if [ "${CNI_LEDGER_K8S_CALL_LOG:-1}" = 0 ]; then
			install -m 755 "$p" "$N/opt/cni/bin/$name"
			continue
		fi
		cat >"$N/opt/cni/bin/$name" <<EOF
#!/bin/sh
printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "\$(date +%s.%N)" $name "\$CNI_COMMAND" "\$CNI_CONTAINERID" \
	"\$CNI_NETNS" "\$CNI_IFNAME" "\$CNI_ARGS" >>$D/cni-calls.log
exec $p "\$@"
EOF
		chmod 755 "$N/opt/cni/bin/$name"
	done
}

# start_node: the node's mount and PID namespaces, its dirs bound at the standard paths,
# held by node-init as PID 1 (recorded as "node").
start_node() {
	local d u pid= i
	for d in $NODE_DIRS; do
		mkdir -p "$N/$d"
		# The mount point on the machine: these exist on most machines; an empty dir if not.
		[ -d "/$d" ] || mkdir -p "/$d"
	done
	setsid unshare --mount --pid --fork --mount-proc --propagation private -- /bin/sh -ec '
		n=$1
		shift
		for d in "$@"; do mount --bind "$n/$d" "/$d"; done
		exec "$0"' "$D/img/node-init" "$N" $NODE_DIRS >>"$D/log/node.log" 2>&1 </dev/null &
	u=$!
	for i in $(seq 1 100); do
		pid=$(echo $(cat /proc/$u/task/$u/children 2>/dev/null))
		[ -n "$pid" ] && [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$D/img/node-init" ] && break
		pid=
		sleep 0.05
	done
	[ -n "$pid" ] || die "the node's namespaces did not start: $(tail -n 20 "$D/log/node.log")"
	echo "$pid $(starttime "$pid")" >"$D/pid/node"
	readlink "/proc/$pid/ns/pid" >"$D/node-pidns"
	say "node namespaces up, PID 1 is $pid here"
}

# kill_node: SIGKILL to the node's PID 1, which kills every process of its PID namespace;
# waits until none is left (the kernel reaps them asynchronously).
kill_node() {
	local ns f i left
	[ -f "$D/node-pidns" ] || return 0
	ns=$(cat "$D/node-pidns")
	if running node; then
		say "killing the node (PID 1: $(node_pid)) and every process in it"
		kill -KILL "$(node_pid)" 2>/dev/null || true
	fi
	for i in $(seq 1 200); do
		left=
		for f in /proc/[0-9]*/ns/pid; do
			[ "$(readlink "$f" 2>/dev/null)" = "$ns" ] && left=${f%/ns/pid} && break
		done
		[ -n "$left" ] || break
		sleep 0.1
	done
	[ -z "$left" ] || say "a process is still in the node: ${left#/proc/}"
	rm -f "$D/pid/node" "$D/pid/$RUNTIME" "$D/pid/kubelet"
}

# This network's nat rules (bridge's masquerade, portmap's DNAT, each commented with the
# network's name) and the chains they jump to; nobody else's.
wipe_nat() {
	python3 - "$NETWORK" <<'EOF'
import shlex, subprocess, sys
tag = 'name: "%s"' % sys.argv[1]
rules = subprocess.run(["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True,
                       check=True).stdout.splitlines()
chains = []
for r in rules:
    a = shlex.split(r)
    if not a or a[0] != "-A" or not any(tag in x for x in a):
        continue
    subprocess.run(["iptables", "-w", "-t", "nat", "-D"] + a[1:], check=False)
    if "-j" in a:
        t = a[a.index("-j") + 1]
        if t.startswith("CNI-") and not t.startswith("CNI-HOSTPORT-") and t not in chains:
            chains.append(t)
for c in chains:
    subprocess.run(["iptables", "-w", "-t", "nat", "-F", c], check=False)
    subprocess.run(["iptables", "-w", "-t", "nat", "-X", c], check=False)
EOF
}

# --- configs ---------------------------------------------------------------------------

write_configs() {
	mkdir -p "$D/containerd" "$N/etc/cni/net.d" "$D/kubelet" "$D/manifests" "$D/pod-logs"
	# NRI off: it would listen at the machine's /var/run/nri/nri.sock. The runc is ours
	# (v1.5.2, what containerd 2.4.2 is tested with).
	cat >"$D/containerd/config.toml" <<EOF
version = 3
root = "$D/containerd/root"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.nri.v1.nri"]
[grpc]
  address = "$NODE_SOCK"
[ttrpc]
  address = "$NODE_SOCK.ttrpc"
[debug]
  address = "/run/containerd/debug.sock"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "$SANDBOX_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = "$RUNC_BIN/runc"
    SystemdCgroup = false
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
	# host-local's addresses in its default dataDir, the node's /var/lib/cni/networks;
	# whereabouts' in the API server, the bridge's gateway address kept out of its range.
	local ipam="\"type\": \"host-local\", \"subnet\": \"$POD_SUBNET\""
	[ "$IPAM" != whereabouts ] || ipam="\"type\": \"whereabouts\", \"range\": \"$POD_SUBNET\",
                \"gateway\": \"${POD_SUBNET%.*}.1\", \"exclude\": [\"${POD_SUBNET%.*}.1/32\"]"
	cat >"$N/etc/cni/net.d/10-pods.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$NETWORK",
  "plugins": [
    { "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true,
      "ipam": { $ipam,
                "routes": [{ "dst": "0.0.0.0/0" }] } },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
	cat >"$D/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $D/pki/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$NODE_SOCK
imageServiceEndpoint: unix://$NODE_SOCK
cgroupRoot: /$CGROUP_ROOT
failCgroupV1: false
failSwapOn: false
maxPods: $MAX_PODS
clusterDomain: cluster.local
clusterDNS: [${SERVICE_CIDR%.*/*}.10]
resolvConf: /etc/resolv.conf
staticPodPath: $D/manifests
podLogsDir: $D/pod-logs
serializeImagePulls: false
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
	kubeconfig admin admin
	kubeconfig controller-manager controller-manager
	kubeconfig scheduler scheduler
	kubeconfig kubelet kubelet
	if [ "$IPAM" = whereabouts ]; then
		mkdir -p "$N/etc/cni/net.d/whereabouts.d"
		install -m 600 "$D/kubeconfig/admin.conf" "$N/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"
		cat >"$N/etc/cni/net.d/whereabouts.d/whereabouts.conf" <<EOF
{ "datastore": "kubernetes",
  "kubernetes": { "kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig" },
  "log_file": "$D/log/whereabouts.log", "log_level": "debug" }
EOF
	fi
}

# kubelet's cgroup root, made in each hierarchy (kubelet refuses a missing one). A v1
# cpuset child starts with no CPUs nor memory nodes: copy the parent's.
make_cgroups() {
	local h
	for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
		h=${h%/}
		[ -f "$h/cgroup.procs" ] || continue
		mkdir -p "$h/$CGROUP_ROOT"
		if [ -f "$h/cpuset.cpus" ] && [ -z "$(cat "$h/$CGROUP_ROOT/cpuset.cpus")" ]; then
			cat "$h/cpuset.cpus" >"$h/$CGROUP_ROOT/cpuset.cpus"
			cat "$h/cpuset.mems" >"$h/$CGROUP_ROOT/cpuset.mems"
		fi
	done
}

remove_cgroups() {
	local h
	for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
		h=${h%/}
		[ -d "$h/$CGROUP_ROOT" ] || continue
		# Deepest first; a cgroup still holding a process stays (and is reported).
		find "$h/$CGROUP_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null || true
		[ ! -d "$h/$CGROUP_ROOT" ] || say "cgroup $h/$CGROUP_ROOT still there: $(find "$h/$CGROUP_ROOT" -name cgroup.procs -exec cat {} + | tr '\n' ' ')"
	done
}

# --- up ------------------------------------------------------------------------------

node_ready() {
	[ "$(kubectl get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

up() {
	[ "$(id -u)" -eq 0 ] || die "must run as root"
	if [ -d "$D/pid" ] && running kubelet && node_ready; then
		say "already up: node $NODE Ready (KUBECONFIG=$D/kubeconfig/admin.conf)"
		return 0
	fi
	[ ! -d "$D/pid" ] || [ -z "$(ls -A "$D/pid")" ] ||
		die "$D holds a cluster that is not (wholly) up: run '$0 down' first"
	[ -x "$CNI_BIN/bridge" ] && [ -x "$CNI_BIN/host-local" ] && [ -x "$CNI_BIN/portmap" ] &&
		[ -x "$CNI_BIN/loopback" ] ||
		die "no CNI plugins in $CNI_BIN (apt-get install containernetworking-plugins)"
	command -v gcc >/dev/null || die "gcc is needed for the pause image (apt-get install gcc libc6-dev)"
	local t
	for t in openssl curl ip iptables python3 unshare nsenter; do
		command -v "$t" >/dev/null ||
			die "$t is needed (apt-get install openssl curl iproute2 iptables python3 util-linux)"
	done

	bash "$repo/scripts/build-k8s.sh"
	[ "$IPAM" != whereabouts ] || WB=$(bash "$repo/scripts/build-whereabouts.sh")

	mkdir -p "$D/log" "$D/pid"
	echo "$RUNTIME" >"$D/runtime"
	say "certificates, configs, the pause image in $D"
	make_pki
	write_configs
	[ "$RUNTIME" = containerd ] || crio_write_config
	write_plugins
	make_pause_image
	make_node_init
	make_cgroups
	# A veth pair, not a dummy link: the kernel may lack the dummy driver (containers).
	ip link show "$NODE_LINK" >/dev/null 2>&1 ||
		ip link add "$NODE_LINK" type veth peer name "${NODE_LINK%0}1"
	ip addr replace "$NODE_IP/32" dev "$NODE_LINK"
	ip link set "${NODE_LINK%0}1" up
	ip link set "$NODE_LINK" up

	# etcd: plain HTTP on loopback, no fsync (a test cluster, rebuilt from nothing).
	start etcd "$ETCD_BIN/etcd" --name n0 --data-dir "$D/etcd" \
		--listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-cluster "n0=http://127.0.0.1:$ETCD_PEER_PORT" \
		--unsafe-no-fsync --log-level warn
	wait_for etcd 30 curl -fsS "http://127.0.0.1:$ETCD_PORT/health" ||
		die "etcd not healthy: $(tail -n 20 "$D/log/etcd.log")"
	say "etcd healthy"

	local p=$D/pki
	start kube-apiserver "$K8S_BIN/kube-apiserver" \
		--etcd-servers "http://127.0.0.1:$ETCD_PORT" \
		--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
		--tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
		--client-ca-file "$p/ca.crt" \
		--kubelet-client-certificate "$p/apiserver-kubelet-client.crt" \
		--kubelet-client-key "$p/apiserver-kubelet-client.key" \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-account-key-file "$p/sa.pub" \
		--service-account-signing-key-file "$p/sa.key" \
		--service-cluster-ip-range "$SERVICE_CIDR" \
		--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
		--allow-privileged=true --endpoint-reconciler-type none \
		--kubelet-preferred-address-types InternalIP \
		--profiling=false
	wait_for kube-apiserver 90 kubectl get --raw /readyz ||
		die "kube-apiserver not ready: $(tail -n 30 "$D/log/kube-apiserver.log")"
	say "kube-apiserver ready"
	if [ -n "$WB" ]; then
		kubectl apply -f "$WB/crds" >/dev/null || die "kubectl apply of whereabouts' CRDs failed"
		kubectl wait --for condition=established --timeout=60s -f "$WB/crds" >/dev/null ||
			die "whereabouts' CRDs not established"
		say "whereabouts' CRDs applied ($WB/crds)"
	fi

	start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
		--kubeconfig "$D/kubeconfig/controller-manager.conf" \
		--authentication-kubeconfig "$D/kubeconfig/controller-manager.conf" \
		--authorization-kubeconfig "$D/kubeconfig/controller-manager.conf" \
		--bind-address 127.0.0.1 --secure-port "$KCM_PORT" \
		--service-account-private-key-file "$p/sa.key" --root-ca-file "$p/ca.crt" \
		--cluster-signing-cert-file "$p/ca.crt" --cluster-signing-key-file "$p/ca.key" \
		--use-service-account-credentials=true --service-cluster-ip-range "$SERVICE_CIDR" \
		--leader-elect=false --profiling=false
	start kube-scheduler "$K8S_BIN/kube-scheduler" \
		--kubeconfig "$D/kubeconfig/scheduler.conf" \
		--authentication-kubeconfig "$D/kubeconfig/scheduler.conf" \
		--authorization-kubeconfig "$D/kubeconfig/scheduler.conf" \
		--bind-address 127.0.0.1 --secure-port "$SCHED_PORT" \
		--leader-elect=false --profiling=false
	wait_for kube-controller-manager 60 curl -fsSk "https://127.0.0.1:$KCM_PORT/healthz" ||
		die "kube-controller-manager not healthy: $(tail -n 30 "$D/log/kube-controller-manager.log")"
	wait_for kube-scheduler 60 curl -fsSk "https://127.0.0.1:$SCHED_PORT/healthz" ||
		die "kube-scheduler not healthy: $(tail -n 30 "$D/log/kube-scheduler.log")"
	say "kube-controller-manager and kube-scheduler healthy"

	start_node
	start_runtime
}

# start_runtime [NEW_ROOT]: the runtime (and the pause image in it) and kubelet, in the
# node; waits for the Node to be Ready. NEW_ROOT non-empty: containerd's root was lost.
start_runtime() {
	if [ "$RUNTIME" = crio ]; then crio_start; else start_containerd "${1:-}"; fi
	start_kubelet
}

start_containerd() {
	local new_root=$1
	# containerd finds its shim on PATH; the shim runs the configured runc.
	in_node containerd env PATH="$CTRD_BIN:$PATH" "$CTRD_BIN/containerd" \
		--config "$D/containerd/config.toml"
	wait_for containerd 30 crictl info ||
		die "containerd's CRI not answering: $(tail -n 30 "$D/log/containerd.log")"
	ctr images import "$D/img/pause.tar" >/dev/null ||
		die "ctr images import of the pause image failed"
	say "containerd up, $SANDBOX_IMAGE imported"
	# Images load-image kept in $D/images, for a restart that lost containerd's root:
	# kubelet finds them as if pulled again. A root that was kept still has them, and a
	# registry is not asked again for them.
	[ -n "$new_root" ] || return 0
	local f
	for f in "$D"/images/*.tar; do
		[ -f "$f" ] || continue
		ctr images import "$f" >/dev/null || die "ctr images import $f failed"
		say "imported $f"
	done
}

start_kubelet() {
	in_node kubelet "$K8S_BIN/kubelet" --config "$D/kubelet/config.yaml" \
		--kubeconfig "$D/kubeconfig/kubelet.conf" --root-dir "$D/kubelet/root" \
		--hostname-override "$NODE" --node-ip "$NODE_IP" --v 1
	say "waiting up to ${TIMEOUT}s for node $NODE to be Ready"
	if ! wait_for node "$TIMEOUT" node_ready; then
		kubectl get node "$NODE" -o 'jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' >&2 || true
		tail -n 40 "$D/log/kubelet.log" >&2
		die "node $NODE not Ready after ${TIMEOUT}s (logs in $D/log)"
	fi
	say "node $NODE Ready; export KUBECONFIG=$D/kubeconfig/admin.conf"
}

# --- restart ---------------------------------------------------------------------------

restart() {
	local lose=
	case ${1:-} in
	--lose-runtime-state) lose=1 ;;
	"") ;;
	*) die "usage: $0 restart [--lose-runtime-state]" ;;
	esac
	[ "$(id -u)" -eq 0 ] || die "must run as root"
	running kube-apiserver && running node || die "no cluster up at $D"
	local t0=$SECONDS
	kill_node
	say "rebooting the node: its /run, bridge $BRIDGE, nat rules of $NETWORK, cgroups${lose:+, containerd root dir}"
	rm -rf --one-file-system "$N/run"
	ip link del "$BRIDGE" 2>/dev/null || true
	wipe_nat
	[ "$RUNTIME" = containerd ] || crio_wipe_hostports
	remove_cgroups
	[ -z "$lose" ] || rm -rf --one-file-system "$D/containerd/root" "$D/crio/root"
	make_cgroups
	start_node
	start_runtime "$lose"
	say "node restarted in $((SECONDS - t0)) s"
}

# --- down ------------------------------------------------------------------------------

down() {
	[ -d "$D" ] || {
		say "nothing at $D"
		return 0
	}
	stop kubelet
	# Every pod through the CRI while the runtime runs, so the CNI DELs happen.
	if running "$RUNTIME"; then
		crictl rmp --all --force >/dev/null 2>&1 || say "crictl rmp --all --force failed"
	fi
	stop "$RUNTIME"
	# containerd's shims outlive it, and anything else left in the node: the node's PID 1
	# takes them all with it.
	kill_node
	wipe_nat
	[ "$RUNTIME" = containerd ] || crio_wipe_hostports
	stop kube-scheduler
	stop kube-controller-manager
	stop kube-apiserver
	stop etcd
	# Mounts left under the dir (pods' volumes, rootfs, shm, netns pins), deepest first.
	local m
	while read -r m; do
		umount -l "$m" 2>/dev/null || say "umount $m failed"
	done < <(awk -v d="$D/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
	remove_cgroups
	ip link del "$BRIDGE" 2>/dev/null || true
	ip link del "$NODE_LINK" 2>/dev/null || true
	# kubelet links each container's log into the fixed /var/log/containers.
	find /var/log/containers -maxdepth 1 -lname "$D/*" -delete 2>/dev/null || true
	rm -rf --one-file-system "$D"
	say "down: $D removed"
}

status() {
	local n
	for n in etcd kube-apiserver kube-controller-manager kube-scheduler node "$RUNTIME" kubelet; do
		if running "$n"; then
			echo "$n: running (pid $(cut -d' ' -f1 "$D/pid/$n"))"
		else
			echo "$n: not running"
		fi
	done
	kubectl get node "$NODE" -o 'jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}{"\n"}{end}' 2>/dev/null ||
		echo "node $NODE: API not reachable"
}

# load_image TAR FROM NAME: an image archive (podman save) into the node's runtime, where
# its image FROM is tagged NAME, and kept as $D/images/<NAME>.tar, with NAME in it, for
# `restart` to load again (as a registry would serve it again).
load_image() {
	local tar=$1 from=$2 name=$3 keep
	[ -n "$name" ] || die "usage: $0 load-image TAR FROM NAME"
	running node || die "the node is not running"
	mkdir -p "$D/images"
	keep=$D/images/$(printf '%s' "$name" | tr '/:' '__').tar
	if [ "$RUNTIME" = crio ]; then
		crio_load "$tar" || die "podman load $tar into CRI-O's storage failed"
		crio_podman tag "$from" "$name" && rm -f "$keep" &&
			crio_podman save -o "$keep" "$name" >/dev/null || die "podman tag/save of $name failed"
	else
		ctr images import "$tar" >/dev/null && ctr images tag --force "$from" "$name" >/dev/null &&
			ctr images export "$keep" "$name" || die "ctr import/tag/export of $name failed"
	fi
	say "$name loaded into $RUNTIME (kept as $keep)"
}

case ${1:-up} in
up) up ;;
load-image) load_image "${2:-}" "${3:-}" "${4:-}" ;;
down) down ;;
restart) restart "${2:-}" ;;
status) status ;;
env) echo "export KUBECONFIG=$D/kubeconfig/admin.conf PATH=$K8S_BIN:$CRICTL_BIN:$CTRD_BIN:\$PATH" ;;
*) die "usage: $0 [up|down|restart [--lose-runtime-state]|load-image TAR FROM NAME|status|env]" ;;
esac
