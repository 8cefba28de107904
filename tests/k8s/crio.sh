# tests/k8s/crio.sh: sourced by cluster.sh when CNI_LEDGER_K8S_RUNTIME=crio: the node's
# runtime is CRI-O v1.36 (scripts/build-crio.sh, with Debian's conmon and the cluster's
# runc) instead of containerd, at its default socket /run/crio/crio.sock in the node
# ($D/node/run/crio/crio.sock from outside), its storage (vfs) in $D/crio/root, everything
# else it keeps under the node's /run/crio (a dir of the node's, cleared by `restart` with
# the rest of its /run; pinned namespaces in /run/crio/ns, so nothing lands in the
# machine's /run). At every start `crio wipe` runs first, as CRI-O's unit does at boot:
# after `restart` (no version file, no clean-shutdown file) it removes the whole storage,
# so the pause image and $D/images/*.tar are loaded again with podman, as a registry would
# serve them. CRI-O maps host ports itself: the conflist's portmap gets no portMappings.

CRIO_BIN=$(bash "$repo/scripts/build-crio.sh" --path)
NODE_SOCK=/run/crio/crio.sock
SOCK=$N$NODE_SOCK
NODE_DIRS="$NODE_DIRS run/crio"

# Its config, and the runc it runs: the cluster's, minus what this machine cannot apply
# and containerd leaves out itself: a negative oomScoreAdj (CRI-O's pause -998, kubelet's
# Guaranteed pods -997) where root lacks CAP_SYS_RESOURCE (restrict_oom_score_adj), the
# capabilities a privileged container gets that are not in root's bounding set (CRI-O gives
# every one it knows; containerd those the bounding set has), and
# hugepage limits where hugetlb is a controller of the v2 hierarchy of a hybrid host (CRI-O
# reads /proc/cgroups, lists it, and runc's v1 manager finds no hugetlb hierarchy).
crio_write_config() {
	command -v conmon >/dev/null && command -v podman >/dev/null ||
		die "CRI-O needs Debian's conmon and podman (apt-get install conmon podman)"
	bash "$repo/scripts/build-crio.sh" >/dev/null
	mkdir -p "$D/crio/crio.conf.d" "$D/crio/root"
	: >"$D/crio/crio.conf"
	printf '{"default": [{"type": "insecureAcceptAnything"}]}\n' >"$D/crio/policy.json"
	cat >"$D/crio/runc" <<EOF
#!/usr/bin/python3
import json, os, sys
# Capability numbers, for the bounding set's bits.
CAPS = ["CAP_" + n for n in """CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID
    SETUID SETPCAP LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK
    IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE
    SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP
    MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF
    CHECKPOINT_RESTORE""".split()]
args = sys.argv[1:]
if "create" in args:
    bundle = "."
    for i, a in enumerate(args):
        if a in ("--bundle", "-b") and i + 1 < len(args):
            bundle = args[i + 1]
        elif a.startswith("--bundle="):
            bundle = a.split("=", 1)[1]
    path = os.path.join(bundle, "config.json")
    with open(path) as f:
        spec = json.load(f)
    changed = spec.get("process", {}).get("oomScoreAdj", 0) < 0
    if changed:
        del spec["process"]["oomScoreAdj"]
    res = spec.get("linux", {}).get("resources", {})
    if res.get("hugepageLimits") and not os.path.isdir("/sys/fs/cgroup/hugetlb"):
        del res["hugepageLimits"]
        changed = True
    bnd = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapBnd:"):
                bnd = int(line.split()[1], 16)
    caps = spec.get("process", {}).get("capabilities", {})
    for kind, names in caps.items():
        kept = [n for n in names if n not in CAPS or bnd >> CAPS.index(n) & 1]
        if kept != names:
            caps[kind] = kept
            changed = True
    if changed:
        with open(path, "w") as f:
            json.dump(spec, f)
os.execv("$RUNC_BIN/runc", ["runc"] + args)
EOF
	chmod 755 "$D/crio/runc"
	cat >"$D/crio/crio.conf.d/10-cluster.conf" <<EOF
[crio]
root = "$D/crio/root"
runroot = "/run/crio/storage"
storage_driver = "vfs"
log_dir = "$D/crio/pods"
version_file = "/run/crio/version"
version_file_persist = "$D/crio/version"
clean_shutdown_file = "$D/crio/clean.shutdown"
[crio.api]
listen = "$NODE_SOCK"
[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
namespaces_dir = "/run/crio/ns"
pinns_path = "$CRIO_BIN/pinns"
container_exits_dir = "/run/crio/exits"
container_attach_socket_dir = "/run/crio"
hooks_dir = []
[crio.runtime.runtimes.runc]
runtime_path = "$D/crio/runc"
runtime_root = "/run/crio/runc"
monitor_path = "$(command -v conmon)"
monitor_cgroup = "pod"
[crio.image]
pause_image = "$SANDBOX_IMAGE"
signature_policy = "$D/crio/policy.json"
[crio.network]
network_dir = "/etc/cni/net.d"
plugin_dirs = ["/opt/cni/bin"]
[crio.nri]
enable_nri = false
EOF
}

# podman on CRI-O's storage, in the node.
crio_podman() {
	nsenter -t "$(node_pid)" -m -p -- podman --root "$D/crio/root" --runroot /run/crio/storage \
		--storage-driver vfs --tmpdir /run/crio/podman --cgroup-manager cgroupfs \
		--events-backend none "$@"
}

# An image archive into CRI-O's storage.
crio_load() {
	crio_podman load -i "$1" >>"$D/log/crio.log" 2>&1
}

# `crio wipe`, CRI-O (recorded as "crio") and its images, in the node.
crio_start() {
	nsenter -t "$(node_pid)" -m -p -- "$CRIO_BIN/crio" --config "$D/crio/crio.conf" \
		--config-dir "$D/crio/crio.conf.d" wipe >>"$D/log/crio.log" 2>&1 ||
		die "crio wipe failed: $(tail -n 20 "$D/log/crio.log")"
	in_node crio "$CRIO_BIN/crio" --config "$D/crio/crio.conf" --config-dir "$D/crio/crio.conf.d"
	wait_for crio 30 crictl info || die "CRI-O not answering: $(tail -n 30 "$D/log/crio.log")"
	crio_load "$D/img/pause.tar" || die "podman load of the pause image failed"
	say "CRI-O up, $SANDBOX_IMAGE loaded"
	local f
	for f in "$D"/images/*.tar; do
		[ -f "$f" ] || continue
		crio_load "$f" || die "podman load $f failed"
		say "loaded $f"
	done
}

# CRI-O's host port mappings: nftables tables of its own in the machine's network
# namespace, which a reboot (`restart`) or `down` clears; left, a pod's next sandbox with
# the same host port fails ("File exists").
crio_wipe_hostports() {
	local f
	for f in ip ip6; do
		nft delete table "$f" crio-hostports 2>/dev/null || true
	done
}
