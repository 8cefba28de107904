#!/usr/bin/env bash
# scripts/measure-replay-memory.sh: the memory one replayed DEL charges to the cgroup it
# runs in, for the figure behind the DaemonSet's memory limit (docs/KUBERNETES.md).
#
# Makes a real attachment (Debian's bridge + host-local, then portmap with one port
# mapping) into a namespace of its own, then runs each DEL as gc replays it (portmap,
# then bridge, which runs host-local) inside a scratch memory cgroup and prints the
# cgroup's peak (every process of the DEL at once: portmap and its iptables, bridge and
# host-local) and GNU time's peak RSS of the plugin. GOMAXPROCS=N (default: this
# machine's) stands in for a node with more CPUs. Root; cgroup v1 memory controller or
# cgroup v2. Removes what it creates.
set -euo pipefail

plugins=${CNI_PLUGINS:-/usr/lib/cni}
tag=cnilmem$$
netns=$tag
bridge=${tag:0:12}br
work=$(mktemp -d)
cg_v1=/sys/fs/cgroup/memory/$tag
cg_v2=/sys/fs/cgroup/$tag

cleanup() {
	set +e
	[ -z "${conf:-}" ] || del_all >/dev/null 2>&1
	ip netns del "$netns" 2>/dev/null
	ip link del "$bridge" 2>/dev/null
	rmdir "$cg_v1" "$cg_v2" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

if [ -d /sys/fs/cgroup/memory ]; then
	mkdir "$cg_v1"
	cg=$cg_v1 procs=$cg_v1/cgroup.procs peak_file=$cg_v1/memory.max_usage_in_bytes
else
	mkdir "$cg_v2"
	cg=$cg_v2 procs=$cg_v2/cgroup.procs peak_file=$cg_v2/memory.peak
fi

ip netns add "$netns"
export CNI_CONTAINERID=$tag CNI_NETNS=/run/netns/$netns CNI_IFNAME=eth0 CNI_PATH=$plugins

conf_of() { # TYPE [PREV_RESULT_FILE]: the plugin's config as libcni hands it over
	python3 - "$1" "$work" "$bridge" "${2:-}" <<'EOF'
import json, sys
kind, work, bridge, prev = sys.argv[1:5]
c = {"cniVersion": "1.0.0", "name": "memtest"}
if kind == "bridge":
    c.update(type="bridge", bridge=bridge, isGateway=True, ipMasq=True,
             ipam={"type": "host-local", "dataDir": work + "/ipam",
                   "ranges": [[{"subnet": "10.250.77.0/24"}]]})
else:
    c.update(type="portmap", capabilities={"portMappings": True},
             runtimeConfig={"portMappings": [
                 {"hostPort": 18777, "containerPort": 80, "protocol": "tcp"}]})
if prev:
    c["prevResult"] = json.load(open(prev))
print(json.dumps(c))
EOF
}

# Out of the page cache, so that the pages a DEL reads are charged to the scratch cgroup
# as they are to the agent's on a node where no pod started lately: the plugins,
# iptables and the libraries it loads (clean, unmapped pages only; nothing else).
evict() {
	local files=("$plugins"/portmap "$plugins"/bridge "$plugins"/host-local)
	local ipt
	ipt=$(readlink -f "$(command -v iptables)")
	files+=("$ipt" $(ldd "$ipt" | awk '$3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'))
	# and the extensions it loads at run time (comment, mark, multiport...)
	files+=(/usr/lib/*/xtables/*.so)
	python3 -c 'import os, sys
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)' "${files[@]}"
}

# One plugin call in the scratch cgroup; prints "cgroup-peak-bytes maxrss-kib".
measured() { # COMMAND TYPE CONF_FILE
	local cmd=$1 type=$2 conf_file=$3
	sync
	evict
	echo 0 >"$peak_file" 2>/dev/null || true # v1: reset the peak; v2's is per cgroup
	CNI_COMMAND=$cmd sh -c 'echo $$ >"$1"; shift; exec "$@"' sh "$procs" \
		/usr/bin/time -f '%M' -o "$work/time" "$plugins/$type" <"$conf_file" >"$work/out"
	echo "$(cat "$peak_file") $(cat "$work/time")"
}

conf_of bridge >"$work/bridge.json"
CNI_COMMAND=ADD "$plugins/bridge" <"$work/bridge.json" >"$work/bridge-result.json"
conf_of portmap "$work/bridge-result.json" >"$work/portmap.json"
CNI_COMMAND=ADD "$plugins/portmap" <"$work/portmap.json" >/dev/null
conf=1
del_all() {
	CNI_COMMAND=DEL "$plugins/portmap" <"$work/portmap.json"
	CNI_COMMAND=DEL "$plugins/bridge" <"$work/bridge.json"
}

# As gc replays: the chain in reverse, each with the cached prevResult.
read -r pm_peak pm_rss < <(measured DEL portmap "$work/portmap.json")
conf_of bridge "$work/bridge-result.json" >"$work/bridge-del.json"
read -r br_peak br_rss < <(measured DEL bridge "$work/bridge-del.json")
conf=

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
echo "GOMAXPROCS=${GOMAXPROCS:-unset} (nproc $(nproc)), plugins from $plugins"
echo "portmap DEL (with its iptables): cgroup peak $(mib "$pm_peak") MiB, portmap max RSS $(mib $((pm_rss * 1024))) MiB"
echo "bridge DEL (with host-local):    cgroup peak $(mib "$br_peak") MiB, bridge max RSS $(mib $((br_rss * 1024))) MiB"
