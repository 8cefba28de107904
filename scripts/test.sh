#!/usr/bin/env bash
# scripts/test.sh: the project's single test command (README.md; docs/README.md has the details).
#
# Runs as root on Debian bookworm: installs the packages the integration tests
# use (real CNI plugins, libcni's Go source, iptables, iproute2, hyperfine,
# containerd with gcc and libc6-dev for the static pause image of the CRI test, qemu
# and debootstrap for the VM reboot test),
# then promtool on the alerting rules, cargo fmt --check, clippy with -D warnings and the whole test suite.
# Exits non-zero as soon as any stage fails.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf '\n==> %s\n' "$*"; }
die() {
	printf 'scripts/test.sh: %s\n' "$*" >&2
	exit 1
}

[ "$(id -u)" -eq 0 ] ||
	die "must run as root: the tests create network namespaces, run the real CNI plugins and change iptables"

# rustup's cargo is often not on a plain root shell's PATH.
if [ -z "${HOME:-}" ]; then
	HOME=$(getent passwd "$(id -u)" | cut -d: -f6)
	export HOME
fi
for d in /root/.cargo/bin "$HOME/.cargo/bin"; do
	case ":$PATH:" in
	*":$d:"*) ;;
	*) [ ! -d "$d" ] || PATH=$d:$PATH ;;
	esac
done
export PATH
command -v cargo >/dev/null 2>&1 || die "cargo not found; install Rust >= 1.89 (https://rustup.rs)"

# The disk may be shared with other work: what was free, printed at the start and before the
# Rust build (some 3 GB of target/), says when a failure was a full disk.
free_disk() { say "free disk: $(df -h --output=avail . | tail -n 1 | tr -d ' ') on $(df --output=target . | tail -n 1)"; }
free_disk

# qemu-system-x86, qemu-utils, debootstrap, e2fsprogs: the VM reboot test
# (tests/vm_reboot.rs) builds a Debian guest once and boots it; systemd: its
# systemd-analyze verify of the units.
packages=(containernetworking-plugins golang-go golang-github-appc-cni-dev iptables nftables iproute2 hyperfine openssl pkg-config libseccomp-dev
	python3 util-linux containerd conmon gcc make libc6-dev strace debootstrap podman curl prometheus python3-venv
	qemu-system-x86 qemu-utils e2fsprogs systemd)
missing=()
for p in "${packages[@]}"; do
	status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) || status=
	[ "$status" = "install ok installed" ] || missing+=("$p")
done
# A backports qemu-utils without its qemu-system: the pair must be installed together.
if [ "$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null)" != "$(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null)" ]; then
	missing+=(qemu-utils)
fi
if [ ${#missing[@]} -gt 0 ]; then
	say "installing test dependencies: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update
	# Machines of this kind may come with a newer qemu-utils (backports) that breaks
	# bookworm's qemu-system-x86: take both from bookworm, one matching pair.
	apt-get install -y --allow-downgrades "${packages[@]/#qemu-utils/qemu-utils/bookworm}"
fi

# tests/deb.rs builds the Debian package with cargo-deb (a few minutes to compile, once).
if ! command -v cargo-deb >/dev/null 2>&1; then
	say "installing cargo-deb"
	cargo install cargo-deb --locked
fi

# The manifest's offline schema check (tests/agent_image.rs): PyPI's kubernetes-validate
# (and PyYAML, to read the manifest) in a venv of the project's own.
venv=target/test-venv
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
	say "installing kubernetes-validate and PyYAML into $venv"
	python3 -m venv "$venv"
	"$venv/bin/pip" install --quiet kubernetes-validate pyyaml
fi

# kustomize is not in bookworm: Debian unstable's, unpacked into target/kustomize (never
# installed system-wide), builds the manifest's overlays in tests/manifest.rs.
bash scripts/fetch-unstable.sh kustomize target/kustomize

# libcni v1.3 (drop-ins) for tests/dropins.rs' driver: its source and the Go that can
# build it (bookworm's 1.19 cannot), unstable's, unpacked into target/ only.
bash scripts/fetch-unstable.sh golang-github-appc-cni-dev target/libcni-1.3
bash scripts/fetch-unstable.sh golang-1.27-go target/go-1.27
bash scripts/fetch-unstable.sh golang-1.27-src target/go-1.27

# The reference plugins v1.10.x (portmap's and bridge's nftables backends) for
# tests/plugins_v110.rs and bench/nft-replay.sh: built from their Go module into
# /var/cache/cni-ledger-plugins/<version>/bin, outside the clone; a no-op once built.
bash scripts/build-plugins.sh >/dev/null

# containerd 2.x (CRI config version 3) for tests/cri.rs: unstable's .deb unpacked into
# target/containerd-2 (its Go binaries need only libc and bookworm's runc).
bash scripts/fetch-unstable.sh containerd target/containerd-2

# helm v4 for tests/helm.rs (the chart against the kustomize base and overlays): built from
# helm.sh/helm/v4 with Go >= 1.26 into /var/cache/cni-ledger-helm/<version>/ (outside the
# tree; a no-op once built).
say "helm v4 (scripts/build-helm.sh)"
bash scripts/build-helm.sh >/dev/null
# whereabouts v0.9.2 for tests/whereabouts.rs: /var/cache/cni-ledger-whereabouts/ (a no-op once built).
bash scripts/build-whereabouts.sh >/dev/null

# CRI-O v1.36 for tests/crio.rs (with Debian's conmon and runc): crio and pinns built from
# the cri-o module into /var/cache/cni-ledger-crio/ (outside the tree; a no-op once built).
say "CRI-O (scripts/build-crio.sh)"
bash scripts/build-crio.sh >/dev/null

# A one-node Kubernetes for tests/k8s_node.rs (tests/k8s/cluster.sh): kubelet, the control
# plane, etcd, containerd 2.4, runc and crictl from their Go modules (Go >= 1.26.6) into
# /var/cache/cni-ledger-k8s/ (outside the tree; a no-op once built).
say "Kubernetes v1.37.2 (scripts/build-k8s.sh)"
k8s_go=/usr/local/go/bin/go
[ -x "$k8s_go" ] || k8s_go=$PWD/target/go-1.27/usr/lib/go-1.27/bin/go
GO=${GO:-$k8s_go} bash scripts/build-k8s.sh

# The shipped alerting rules: valid, and their unit tests (every alert firing and not
# firing) pass. promtool comes with Debian's prometheus package (above).
say "promtool check rules / test rules (deploy/prometheus)"
promtool check rules deploy/prometheus/cni-ledger-rules.yaml
(cd deploy/prometheus && promtool test rules cni-ledger-rules.test.yaml)

free_disk
say "cargo fmt --check"
cargo fmt --check

say "cargo clippy --locked --all-targets --features testing -- -D warnings"
cargo clippy --locked --all-targets --features testing -- -D warnings

say "cargo test --locked --features testing"
cargo test --locked --features testing

# Bounded fuzzing of the plugin's stdin, the record decoder and the conflist parser
# (cargo-fuzz on stable via RUSTC_BOOTSTRAP; installs cargo-fuzz on first use).
# FUZZ_SECONDS=0 skips it.
if [ "${FUZZ_SECONDS:-10}" != 0 ]; then
	say "fuzzing, ${FUZZ_SECONDS:-10}s per target"
	FUZZ_SECONDS=${FUZZ_SECONDS:-10} FUZZ_DEV=${FUZZ_DEV:-1} bash scripts/fuzz.sh
fi

say "all checks passed"
