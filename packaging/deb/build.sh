#!/usr/bin/env bash
# packaging/deb/build.sh: build the Debian package of cni-ledger with cargo-deb.
#
#   packaging/deb/build.sh        # prints the path of the .deb it built
#
# The package carries what install.sh installs, at Debian's paths: the static binary as
# /usr/lib/cni/cni-ledger (Debian's CNI plugin directory) with /usr/sbin/cni-ledger
# pointing to it, the gc units (systemd) and cron file (hosts without systemd), the man
# pages and bash/zsh/fish completions generated from the clap definition. Its maintainer
# scripts create the ledger directory and enable the timer; they never edit a conflist.
# Needs cargo and cargo-deb (`cargo install cargo-deb --locked`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

die() {
	printf 'packaging/deb/build.sh: %s\n' "$*" >&2
	exit 1
}
command -v cargo-deb >/dev/null 2>&1 || die "cargo-deb not found: cargo install cargo-deb --locked"

BINARY=/usr/lib/cni/cni-ledger
LEDGER_DIR=/var/lib/cni-ledger
CONF_DIR=/etc/cni/net.d

host=$(rustc -vV | sed -n 's/^host: //p')
[ -n "$host" ] || die "cannot tell rustc's host target"
target_dir=$(cargo metadata --format-version 1 --no-deps --locked |
	sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target_dir" ] || die "cannot tell cargo's target directory"

# The same static build as install.sh (see there for why static); an explicit --target
# keeps the static flag off build scripts and proc macros.
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static -C relocation-model=static" \
	cargo build --release --locked --target "$host" --bin cni-ledger >&2
# The generator is a separate binary, so the plugin binary does not carry clap_mangen.
# Same target and flags as above: the dependencies built for the plugin are reused.
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static -C relocation-model=static" \
	cargo build --release --locked --target "$host" --features gen-docs \
	--bin cni-ledger-gen-docs >&2

# Where [package.metadata.deb] names them: target/deb-assets under the package root,
# whatever CARGO_TARGET_DIR says (cargo-deb maps only its built binaries to that).
assets=target/deb-assets
rm -rf "$assets"
mkdir -p "$assets/systemd" "$assets/cron"
"$target_dir/$host/release/cni-ledger-gen-docs" "$assets"
gzip -9n "$assets"/man/*.1
render() { # TEMPLATE OUT
	sed -e "s|@BINARY@|$BINARY|g" -e "s|@LEDGER_DIR@|$LEDGER_DIR|g" \
		-e "s|@CONF_DIR@|$CONF_DIR|g" \
		-e 's|installed by install.sh|installed by the cni-ledger package|g' "$1" >"$2"
	! grep -q '@[A-Z_]*@' "$2" || die "unsubstituted placeholder left in $1"
}
for unit in cni-ledger-gc.service cni-ledger-gc.timer; do
	render "packaging/systemd/$unit" "$assets/systemd/$unit"
done
# Without systemd, cron runs gc; with systemd running, the timer does and cron skips.
render packaging/cron/cni-ledger "$assets/cron/cni-ledger.in"
sed -e "s# root $BINARY gc # root [ -d /run/systemd/system ] || $BINARY gc #" \
	"$assets/cron/cni-ledger.in" >"$assets/cron/cni-ledger"
rm "$assets/cron/cni-ledger.in"
[ "$(grep -c 'run/systemd/system' "$assets/cron/cni-ledger")" = 2 ] || die "cron guard not applied"
ln -s ../lib/cni/cni-ledger "$assets/cni-ledger.sbin"

cargo deb --no-build --target "$host" --output "$target_dir/debian/" >&2
ls -t "$target_dir"/debian/cni-ledger_*.deb | head -n 1
