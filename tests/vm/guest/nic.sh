# tests/vm/guest/nic.sh: a real NIC handed to a pod and back (sourced by after-cut.sh at
# the end of boot 2, with fd 3 = the ack port, /mnt/out = the host's writable share).
#
# The guest has two virtio-net NICs, each alone on a QEMU hub (no traffic leaves):
# 00:08.0, the node's "primary" NIC (an address, up; never to be touched), and 00:09.0,
# the NIC a driver stand-in (vm-nicdrv, as dranet does it) moves into a pod: renamed to
# the attachment's ifname (net1), its host name left in the alias, MTU 1400, an
# address, up. The pod then rewrites the alias to cni0. The runtime stand-in is the
# libcni driver (tests/driver), run in CRI-O's stop order: CNI DEL through the chain,
# then the netns unmounted and removed, then the driver's hook, which can no longer
# open it. Each case writes the NIC's state after it to nic-<case>.txt; the host checks.
#
# Placements: "chain" (the driver stand-in is a plugin of the chain, between the
# ledger's head and its tail, as host-device or SR-IOV is: the tail records the host
# name) and "nri" (it moves the NIC after the ADD, as an NRI hook does: only the device
# itself is left to go by). Each with returnDevices ("ret") and without ("ctl").
# "fact": the namespace removed with no DEL at all, then gc. The last attachment
# ("boot") is left in place for the next boot (nic-reboot.sh).
set -eux

out=/mnt/out
L=/opt/cni/bin/cni-ledger
D=$out/cni-driver
NL=/var/lib/cni-ledger-nic
NC=/var/lib/cni-nic
LOG=/var/log/cni-ledger-nic.log
# The names udev gave the NICs at boot (ens<slot> in QEMU's hotplug slots), by MAC.
by_mac() { for d in /sys/class/net/*; do [ "$(cat "$d/address")" != "$1" ] || basename "$d"; done; }
NIC=$(by_mac 52:54:00:c1:ed:09)
PRIMARY=$(by_mac 52:54:00:c1:ed:08)
[ -n "$NIC" ] && [ -n "$PRIMARY" ]
echo "nic=$NIC primary=$PRIMARY" >"$out/nic-names.txt"
CONF=/etc/cni/nic.d
mkdir -p "$CONF" "$NC"
bus=$(basename "$(readlink "/sys/class/net/$NIC/device")")
echo "$bus" >"$out/nic-bus.txt"

# The node's own state: the primary NIC with an address, the pod NIC up at MTU 1500.
ip addr add 198.18.90.1/24 dev "$PRIMARY"
ip link set "$PRIMARY" up
ip link set "$NIC" mtu 1500 up
# Its link and IPv4 address (IPv6 DAD flags change by themselves as time passes).
primary_state() { ip -o link show "$PRIMARY" | sed 's/^[0-9]*: //'; ip -o -4 addr show dev "$PRIMARY" | sed 's/^[0-9]*: //'; }
primary_state >"$out/primary-before.txt"

# The NIC's name now, found by its bus address (the kernel may have renamed it).
nic_name() {
	for d in /sys/class/net/*; do
		[ "$(basename "$(readlink "$d/device" 2>/dev/null)" 2>/dev/null)" = "$bus" ] || continue
		basename "$d"
		return 0
	done
	return 1
}
# name, MTU, up or down, as the host sees it (or "absent": still in some namespace).
nic_state() {
	n=$(nic_name) || { echo "absent"; return 0; }
	f=$(cat "/sys/class/net/$n/flags")
	if [ $((f & 1)) -eq 1 ]; then up=up; else up=down; fi
	echo "name=$n mtu=$(cat "/sys/class/net/$n/mtu") state=$up altnames=$(ip -o link show "$n" | sed -n 's/.*altname //p' | tr ' ' ',')"
}
# The kernel returns a NIC some time after its namespace's last reference went.
wait_nic_back() {
	i=0
	until nic_name >/dev/null; do
		i=$((i + 1))
		[ "$i" -lt 300 ] || { echo "the NIC did not come back to the host" >&2; return 1; }
		sleep 0.1
	done
}
# The operator's repair between cases: the node's state before the pod.
reset_nic() {
	n=$(nic_name)
	ip link set "$n" down
	# udev gave the returned NIC its boot name as an altname: it must go first.
	[ "$n" = "$NIC" ] || ip link property del dev "$n" altname "$NIC" 2>/dev/null || true
	[ "$n" = "$NIC" ] || ip link set "$n" name "$NIC"
	ip link set "$NIC" mtu 1500 up
}

# The driver stand-in: a chained CNI plugin (ADD moves the NIC in; DEL leaves it to the
# driver's hook) and the hooks themselves (attach/detach NETNS-NAME IFNAME).
cat >/opt/cni/bin/vm-nicdrv <<SH
#!/bin/sh
# vm-nicdrv: the VM test's DRA network driver stand-in (moves $NIC into a pod).
attach() {
	ip link set "$NIC" netns "\$1" || return 1
	ip -n "\$1" link set "$NIC" name "\$2" || return 1
	ip -n "\$1" link set "\$2" alias "$NIC" mtu 1400 up || return 1
	ip -n "\$1" addr add 198.18.91.2/24 dev "\$2"
}
case \${CNI_COMMAND:-} in
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}'; exit 0 ;;
ADD) attach "\$(basename "\$CNI_NETNS")" "\$CNI_IFNAME" >&2 || exit 1
     echo '{"cniVersion":"1.0.0"}'; exit 0 ;;
DEL|CHECK|GC|STATUS) exit 0 ;;
esac
case \$1 in
attach) attach "\$2" "\$3" ;;
# StopPodSandbox: the driver opens the pod's netns to move the NIC out.
detach) ip -n "\$2" link set "\$3" netns 1 ;;
esac
SH
chmod 0755 /opt/cni/bin/vm-nicdrv

conflist() { # NAME RETURN(true|false) PLACEMENT(chain|nri|hd)
	case $3 in
	nri) drv='' ;;
	hd) drv="{ \"type\": \"host-device\", \"device\": \"$NIC\" }," ;;
	*) drv='{ "type": "vm-nicdrv" },' ;;
	esac
	cat >"$CONF/$1.conflist" <<JSON
{ "cniVersion": "1.0.0", "name": "$1",
  "plugins": [
    { "type": "cni-ledger", "ledgerDir": "$NL", "confDir": "$CONF", "returnDevices": $2,
      "logFile": "$LOG", "logLevel": "info" },
    $drv
    { "type": "cni-ledger", "role": "tail", "ledgerDir": "$NL" } ] }
JSON
}
conflist nic-chain-ret true chain
conflist nic-chain-ctl false chain
conflist nic-nri-ret true nri
conflist nic-nri-ctl false nri
conflist nic-hd-ret true hd
conflist nic-hd-ctl false hd

drive() { # add|del NET CID NETNS-NAME
	"$D" "$1" --conf-dir "$CONF" --net "$2" --cid "$3" --ifname net1 \
		--netns "/run/netns/$4" --cni-path /opt/cni/bin:/usr/lib/cni --cache-dir "$NC"
}

# One pod: ADD (the NIC moves in during the chain, or after it by the hook), the pod
# rewrites the alias; then CRI-O's stop order, or (nodel) only the netns removed.
pod() { # CASE NET PLACEMENT MODE(del|nodel)
	ns=pod-$1
	ip netns add "$ns"
	drive add "$2" "cid-$1" "$ns" >"$out/nic-$1-add.json"
	[ "$3" != nri ] || /opt/cni/bin/vm-nicdrv attach "$ns" net1
	ip -n "$ns" link set net1 alias cni0
	ip -n "$ns" -o link show net1 >"$out/nic-$1-inpod.txt"
	case $4 in
	keep) return 0 ;;
	nodel) ip netns delete "$ns"; return 0 ;;
	esac
	rc=0
	drive del "$2" "cid-$1" "$ns" 2>"$out/nic-$1-del.err" || rc=$?
	echo "$rc" >"$out/nic-$1-del.rc"
	ip netns delete "$ns"
	rc=0
	/opt/cni/bin/vm-nicdrv detach "$ns" net1 >"$out/nic-$1-hook.txt" 2>&1 || rc=$?
	echo "rc=$rc" >>"$out/nic-$1-hook.txt"
}

# --- RDMA first: the netns mode can only change while no other namespace exists.
set +x
{
	echo "rdma-tool=$(command -v rdma || echo none)"
	modprobe rdma_rxe && echo "modprobe=ok" || echo "modprobe=failed"
	echo "mode-set: $(rdma system set netns exclusive 2>&1 && echo ok)"
	echo "system: $(rdma system show 2>&1)"
	echo "link-add: $(rdma link add rxe0 type rxe netdev "$NIC" 2>&1 && echo ok)"
	echo "dev: $(rdma dev show 2>&1 | tr '\n' ' ')"
	ip netns add rdmapod
	echo "move: $(rdma dev set rxe0 netns rdmapod 2>&1 && echo ok)"
	echo "dev-after: $(rdma dev show 2>&1 | tr '\n' ' ')"
	echo "in-pod: $(ip netns exec rdmapod rdma dev show 2>&1 | tr '\n' ' ')"
} >"$out/rdma.txt" 2>&1 || true
set -x
cat "$out/rdma.txt" >/dev/console
# The ledger's RDMA side, in exclusive mode, on a pod namespace: a DEL with
# returnDevices finds no RDMA device bound there (the kernel refused the move).
printf '{"cniVersion":"1.0.0","name":"rdmanet","plugins":[{"type":"cni-ledger","ledgerDir":"%s","confDir":"%s","returnDevices":true,"logFile":"%s","logLevel":"info"}]}\n' "$NL" "$CONF" "$LOG" >"$CONF/rdmanet.conflist"
drive add rdmanet cid-rdma rdmapod >/dev/null
rc=0
drive del rdmanet cid-rdma rdmapod 2>"$out/rdma-del.err" || rc=$?
echo "$rc" >"$out/rdma-del.rc"
ip netns delete rdmapod
rdma link delete rxe0 >>"$out/rdma.txt" 2>&1 || true
rdma system set netns shared >>"$out/rdma.txt" 2>&1 || true
rm -f "$CONF/rdmanet.conflist"
nic_state >"$out/nic-rdma.txt"
reset_nic

# --- At DEL, in CRI-O's order: both placements, with and without returnDevices.
for c in chain-ret chain-ctl nri-ret nri-ctl; do
	pod "$c" "nic-$c" "${c%-*}" del
	wait_nic_back
	nic_state >"$out/nic-$c.txt"
	cat "$out/nic-$c.txt" >/dev/console
	reset_nic
done

# --- After the fact: the namespace removed with no DEL; the kernel returns the NIC.
for c in ret ctl; do
	pod "fact-$c" "nic-chain-$c" chain nodel
	wait_nic_back
	nic_state >"$out/nic-fact-$c-before-gc.txt"
	rc=0
	"$L" gc --ledger-dir "$NL" --network "nic-chain-$c" --grace 0 --json \
		--cni-cache-dir "$NC" --metrics-file "$out/nic-fact-$c.prom" \
		>"$out/nic-fact-$c-gc.json" 2>"$out/nic-fact-$c-gc.err" || rc=$?
	echo "$rc" >"$out/nic-fact-$c-gc.rc"
	nic_state >"$out/nic-fact-$c.txt"
	"$L" list --json --ledger-dir "$NL" >"$out/nic-fact-$c-list.json"
	cat "$out/nic-fact-$c.txt" >/dev/console
	reset_nic
done

# --- Debian's host-device as the chained driver: at DEL its own DEL moves the NIC out
# first (named after the alias, which the pod rewrote), then the ledger's head DEL gives
# it back its host name and state; the control shows host-device's own return. With no
# DEL, gc gives it back.
for c in hd-del:nic-hd-ret hd-ctl:nic-hd-ctl; do
	pod "${c%%:*}" "${c#*:}" hd del
	wait_nic_back
	nic_state >"$out/nic-${c%%:*}.txt"
	cat "$out/nic-${c%%:*}.txt" >/dev/console
	reset_nic
done
pod hd-fact nic-hd-ret hd nodel
wait_nic_back
nic_state >"$out/nic-hd-fact-before-gc.txt"
rc=0
"$L" gc --ledger-dir "$NL" --network nic-hd-ret --grace 0 --json --cni-cache-dir "$NC" \
	>"$out/nic-hd-fact-gc.json" 2>"$out/nic-hd-fact-gc.err" || rc=$?
echo "$rc" >"$out/nic-hd-fact-gc.rc"
nic_state >"$out/nic-hd-fact.txt"
reset_nic

primary_state >"$out/primary-after.txt"

# --- Left for the next boot: an attachment holding the NIC at poweroff.
ip link set "$NIC" mtu 1500 down
pod boot nic-chain-ret chain keep || true
"$L" list --json --ledger-dir "$NL" >"$out/nic-boot-list.json"
cp "$LOG" "$out/nic-ledger.log"
