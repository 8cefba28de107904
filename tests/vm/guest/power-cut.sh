# tests/vm/guest/power-cut.sh: first boot of the VM reboot test (sourced by agent.sh,
# with fd 3 = the ack port, /mnt/out = the host's writable share).
#
# Installs cni-ledger with install.sh, starts a podman container with a port mapping
# on a ledger chain and another on a network the ledger is not in yet, adds one
# attachment whose DEL hangs, saves the firewall the way
# a node with iptables-persistent does, and reports READY. Then it runs ADDs in a
# loop, acknowledging each one to the host only after the plugin succeeded, each
# followed by a control copy of the same record written without fsync. The host
# cuts the power (SIGKILL of qemu) in the middle of the loop.
set -eux

out=/mnt/out
# The network the container uses. install.sh --inject puts the ledger first.
# host-local keeps its leases under its own dataDir: podman's tmpfiles.d rule
# ("D! /var/lib/cni/networks") empties the default one at every boot, so a lease
# there would be gone after the reboot whatever gc did.
mkdir -p /etc/cni/net.d /etc/containers
cat >/etc/cni/net.d/50-ledgernet.conflist <<'JSON'
{
  "cniVersion": "1.0.0",
  "name": "ledgernet",
  "plugins": [
    { "type": "bridge", "bridge": "ledger0", "isGateway": true,
      "ipam": { "type": "host-local", "dataDir": "/var/lib/vm-ipam",
                "ranges": [[{ "subnet": "198.18.77.0/24" }]],
                "routes": [{ "dst": "0.0.0.0/0" }] } },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
JSON
cat >/etc/containers/containers.conf <<'CONF'
[network]
network_backend = "cni"
cni_plugin_dirs = ["/opt/cni/bin", "/usr/lib/cni"]
network_config_dir = "/etc/cni/net.d"

# No D-Bus in this minimal guest: cgroupfs, not systemd's cgroup manager.
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF

bash /mnt/host/install.sh --binary "$out/cni-ledger" --inject
L=/opt/cni/bin/cni-ledger
grep -q '"cni-ledger"' /etc/cni/net.d/50-ledgernet.conflist
systemctl is-enabled cni-ledger-gc.service
cp /etc/cni/net.d/50-ledgernet.conflist "$out/ledgernet.conflist"

# A container with a port mapping; the image is a directory holding busybox, since
# no registry is reachable.
rootfs=/var/lib/vm-rootfs
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/proc" "$rootfs/sys" "$rootfs/dev" "$rootfs/tmp"
cp /bin/busybox "$rootfs/bin/busybox"
ln -sf busybox "$rootfs/bin/sh"
podman run -d --name vmweb --network ledgernet -p 8080:80 --rootfs "$rootfs" \
	/bin/busybox sleep 1000000
podman inspect -f '{{.Id}}' vmweb >"$out/cid"

# A network the ledger is not in yet (made after install.sh injected the others) and a
# podman container with a port mapping on it: an attachment only libcni's cache knows.
# The next boot re-runs install.sh --inject, which injects this network and adopts it.
cat >/etc/cni/net.d/55-adoptnet.conflist <<'JSON'
{
  "cniVersion": "1.0.0",
  "name": "adoptnet",
  "plugins": [
    { "type": "bridge", "bridge": "adopt0", "isGateway": true,
      "ipam": { "type": "host-local", "dataDir": "/var/lib/vm-ipam",
                "ranges": [[{ "subnet": "198.18.78.0/24" }]],
                "routes": [{ "dst": "0.0.0.0/0" }] } },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
JSON
podman run -d --name vmearly --network adoptnet -p 8081:80 --rootfs "$rootfs" \
	/bin/busybox sleep 1000000
podman inspect -f '{{.Id}}' vmearly >"$out/early-cid"
ls /var/lib/cni/results >"$out/before-cache.txt"
ls /var/lib/vm-ipam/adoptnet >"$out/before-adopt-ips.txt"

# An attachment whose chain holds three plugins that hang on DEL: gc's boot run
# hangs in each for up to gc's per-plugin timeout (60 s), long enough for any boot
# of this guest to finish meanwhile. Once /var/lib/vm-hang.released exists (the next
# boot makes it, after its checks) its DEL succeeds, as a network daemon's DEL does
# once the daemon is up.
cat >/opt/cni/bin/vm-hang <<'SH'
#!/bin/sh
# vm-hang: a CNI plugin whose DEL hangs (the VM test's stand-in for a network
# pod that is not ready). It writes its PID so the test can end it.
case ${CNI_COMMAND:-} in
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}' ;;
DEL)
	[ ! -e /var/lib/vm-hang.released ] || exit 0
	echo $$ >/run/vm-hang.pid
	exec sleep 3600
	;;
*) echo '{"cniVersion":"1.0.0"}' ;;
esac
SH
chmod 0755 /opt/cni/bin/vm-hang
cat >/etc/cni/net.d/60-hangnet.conflist <<'JSON'
{ "cniVersion": "1.0.0", "name": "hangnet",
  "plugins": [ { "type": "cni-ledger" }, { "type": "vm-hang" }, { "type": "vm-hang" },
               { "type": "vm-hang" } ] }
JSON
ip netns add vmhang
echo '{"cniVersion":"1.0.0","name":"hangnet","type":"cni-ledger"}' |
	CNI_COMMAND=ADD CNI_CONTAINERID=hang0001 CNI_NETNS=/run/netns/vmhang CNI_IFNAME=eth0 \
		CNI_PATH=/opt/cni/bin "$L" >/dev/null

# The node's state before the cut, for the host to compare with the state after.
"$L" list --json >"$out/before-list.json"
ls /var/lib/vm-ipam/ledgernet >"$out/before-ips.txt"
iptables-save -t nat >"$out/before-nat.txt"
# What a node with iptables-persistent does: the rules come back at boot.
iptables-save >/etc/iptables/rules.v4
ip6tables-save >/etc/iptables/rules.v6

# The loop: its own network and ledger, which the boot unit does not scan, so the
# records are still there to be checked after the cut. The control ledger gets a
# copy of each record, written (temp file, rename) without any fsync.
mkdir -p /etc/cni/loop.d /var/lib/cni-ledger-ctl/records
chmod 0700 /var/lib/cni-ledger-ctl
loopconf='{"cniVersion":"1.0.0","name":"loopnet","type":"cni-ledger","ledgerDir":"/var/lib/cni-ledger-loop","confDir":"/etc/cni/loop.d"}'
printf '{"cniVersion":"1.0.0","name":"loopnet","plugins":[%s]}\n' \
	'{"type":"cni-ledger","ledgerDir":"/var/lib/cni-ledger-loop","confDir":"/etc/cni/loop.d"}' \
	>/etc/cni/loop.d/loopnet.conflist
ip netns add vmloop
ctl=/var/lib/cni-ledger-ctl/records
# Everything so far has been on the node for a while: make it durable.
sync
echo READY >&3
set +x
i=0
while :; do
	i=$((i + 1))
	cid=$(printf 'loop%06d' "$i")
	printf '%s' "$loopconf" |
		CNI_COMMAND=ADD CNI_CONTAINERID=$cid CNI_NETNS=/run/netns/vmloop CNI_IFNAME=eth0 \
			CNI_PATH=/opt/cni/bin "$L" >/dev/null 2>>/run/loop-add.log
	echo "ACK ADD $cid" >&3
	f=loopnet:$cid:eth0.json
	cp "/var/lib/cni-ledger-loop/records/$f" "$ctl/.tmp.$f"
	mv "$ctl/.tmp.$f" "$ctl/$f"
	echo "ACK CTL $cid" >&3
done
