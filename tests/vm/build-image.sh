#!/usr/bin/env bash
# tests/vm/build-image.sh: build (once) the Debian bookworm guest the VM reboot test
# boots, and print the directory that holds it.
#
# The guest is made with debootstrap from the Debian mirror apt is configured with,
# plus Debian's kernel, systemd, podman and containernetworking-plugins. It holds no
# cni-ledger: the test installs that with install.sh at every run, from a read-only
# 9p share of the source tree. The only project file in the image is a small agent
# that mounts the share and runs the guest step the kernel command line names.
#
# Output, in $CACHE/<key>/ (CACHE defaults to /var/cache/cni-ledger-vm; key = sha256
# of this script, which holds the package list and every build step):
#   rootfs.raw   ext4 image of the root filesystem (raw, sparse; never booted
#                directly: each run boots a qcow2 overlay on top of it)
#   vmlinuz, initrd.img   the guest's kernel and initramfs, for qemu -kernel/-initrd
# A key that is already built is reused as is; the build goes to a temp dir renamed
# into place at the end, so an interrupted build leaves nothing half-made behind.
#
# Needs root, debootstrap, e2fsprogs (mke2fs -d) and access to the Debian mirror.
# Takes several minutes on a fresh machine (mostly debootstrap and apt).
set -euo pipefail
umask 022

prog=build-image.sh
die() {
	printf '%s: error: %s\n' "$prog" "$*" >&2
	exit 1
}
log() { printf '%s: %s\n' "$prog" "$*" >&2; }

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot)"
for c in debootstrap mke2fs chroot sha256sum; do
	command -v "$c" >/dev/null 2>&1 || die "$c not found (apt-get install debootstrap e2fsprogs)"
done

SUITE=bookworm
# Installed in the chroot with apt, without recommends. Changing this list changes
# the script, hence the cache key.
PACKAGES=(
	linux-image-amd64 podman containernetworking-plugins iptables iptables-persistent
	iproute2 busybox-static procps
)

cache=${CACHE:-/var/cache/cni-ledger-vm}
self=$(readlink -f "${BASH_SOURCE[0]}")
key=$(sha256sum "$self" | cut -c1-16)
out=$cache/$key
built() { [ -f "$out/rootfs.raw" ] && [ -f "$out/vmlinuz" ] && [ -f "$out/initrd.img" ]; }
# The directory's mtime says when a key was last used (see the pruning at the end).
if built; then
	touch "$out"
	printf '%s\n' "$out"
	exit 0
fi
# One build at a time: a second test run waits for the first one's image.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if built; then
	printf '%s\n' "$out"
	exit 0
fi

# The mirror apt already uses (deb822 or one-line sources), unless MIRROR is given.
mirror=${MIRROR:-}
if [ -z "$mirror" ]; then
	mirror=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\)\/*$/\1/p' \
		/etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1) || true
fi
if [ -z "$mirror" ]; then
	mirror=$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\/debian\)\/*[[:space:]]\+bookworm[[:space:]].*/\2/p' \
		/etc/apt/sources.list 2>/dev/null | head -n1) || true
fi
[ -n "$mirror" ] || die "cannot find a Debian mirror in apt's sources; set MIRROR=http://..."

work=$(mktemp -d "$cache/.build.XXXXXX")
root=$work/root
started=$(date +%s)

# Never leave a mount behind, and never remove a tree something is mounted in.
cleanup() {
	if mountpoint -q "$root/proc" 2>/dev/null; then umount "$root/proc" || true; fi
	if findmnt -rn -o TARGET | grep -q "^$work/"; then
		log "something is still mounted under $work; leaving it for inspection"
		return
	fi
	rm -rf --one-file-system "$work"
}
trap cleanup EXIT

log "debootstrap $SUITE from $mirror into $root (cache key $key)"
debootstrap --variant=minbase --include=systemd-sysv,udev,kmod,debconf \
	"$SUITE" "$root" "$mirror" >&2 || die "debootstrap failed"

# Nothing installed in the chroot may start a daemon (or load iptables rules) on the
# build host: policy-rc.d refuses every start; iptables-persistent must not save the
# build host's rules into the image.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 0755 "$root/usr/sbin/policy-rc.d"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
	DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "$@"; }
in_root debconf-set-selections <<'EOF'
iptables-persistent iptables-persistent/autosave_v4 boolean false
iptables-persistent iptables-persistent/autosave_v6 boolean false
EOF
log "apt-get install ${PACKAGES[*]}"
in_root apt-get update >&2 || die "apt-get update in the guest failed"
in_root apt-get install -y --no-install-recommends "${PACKAGES[@]}" >&2 ||
	die "apt-get install in the guest failed"
in_root apt-get clean
umount "$root/proc"
rm -f "$root/usr/sbin/policy-rc.d" "$root/etc/resolv.conf"
rm -rf "$root"/var/lib/apt/lists/*

# --- guest configuration

echo cni-ledger-vm >"$root/etc/hostname"
printf '/dev/vda / ext4 defaults 0 1\n' >"$root/etc/fstab"
# No rules from anywhere but the test itself.
mkdir -p "$root/etc/iptables"
printf '*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n' |
	tee "$root/etc/iptables/rules.v4" >"$root/etc/iptables/rules.v6"
# Nothing the test does not need at boot: no timers that wake apt or fstrim.
for u in apt-daily.timer apt-daily-upgrade.timer fstrim.timer e2scrub_all.timer e2scrub_reap.service \
	systemd-timesyncd.service man-db.timer dpkg-db-backup.timer \
	podman-auto-update.timer podman-auto-update.service; do
	ln -sf /dev/null "$root/etc/systemd/system/$u"
done
# The journal stays on disk across the test's power cuts, for debugging.
mkdir -p "$root/var/log/journal"

# The agent: mount the host's share read-only and run the step the host asked for
# (vmtest.step= on the kernel command line) from the share, so the steps can change
# without rebuilding the image.
cat >"$root/usr/local/sbin/vm-agent" <<'EOF'
#!/bin/sh
# Mounts the host's 9p share and runs tests/vm/guest/agent.sh from it.
mkdir -p /mnt/host
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro host /mnt/host; then
	echo "vm-agent: cannot mount the host share" >/dev/console
	poweroff -f
fi
exec /bin/sh /mnt/host/tests/vm/guest/agent.sh
EOF
chmod 0755 "$root/usr/local/sbin/vm-agent"
cat >"$root/etc/systemd/system/vm-agent.service" <<'EOF'
[Unit]
Description=cni-ledger VM test agent
After=local-fs.target

[Service]
Type=exec
ExecStart=/usr/local/sbin/vm-agent
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
EOF
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/vm-agent.service "$root/etc/systemd/system/multi-user.target.wants/vm-agent.service"

# Kernel and initramfs for qemu -kernel/-initrd (the image has no bootloader).
kernel=$(find "$root/boot" -maxdepth 1 -name 'vmlinuz-*' | sort | tail -n1)
initrd=$(find "$root/boot" -maxdepth 1 -name 'initrd.img-*' | sort | tail -n1)
if [ -z "$kernel" ] || [ -z "$initrd" ]; then
	die "no kernel or initramfs in $root/boot"
fi
cp "$kernel" "$work/vmlinuz"
cp "$initrd" "$work/initrd.img"

log "making the ext4 image"
mke2fs -q -t ext4 -L root -d "$root" "$work/rootfs.raw" 3G >&2 || die "mke2fs -d failed"
rm -rf --one-file-system "$root"

chmod 0755 "$work"
rm -rf --one-file-system "$out"
mv -T "$work" "$out" || die "cannot move the image to $out"
trap - EXIT
# Images of other versions of this script unused for a week go (about 1 GiB each).
find "$cache" -mindepth 1 -maxdepth 1 -type d -name '[0-9a-f]*' ! -name "$key" -mtime +7 \
	-exec rm -rf --one-file-system {} + || true
log "built $out in $(($(date +%s) - started)) s"
printf '%s\n' "$out"
