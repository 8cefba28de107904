#!/usr/bin/env bash
# scripts/build-image.sh: build the static cni-ledger binary and its FROM-scratch image
# (Containerfile) in one command.
#
#   scripts/build-image.sh [TAG]     # default TAG: localhost/cni-ledger:<crate version>
#
# Environment: PROFILE=release (default; as install.sh builds it) or dev (a faster build,
# what the tests use), ENGINE=podman (or docker). Prints the tag on stdout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

engine=${ENGINE:-podman}
profile=${PROFILE:-release}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
tag=${1:-localhost/cni-ledger:$version}
host=$(rustc -vV | sed -n 's/^host: //p')
case $profile in
dev) out=debug ;;
*) out=$profile ;;
esac

# Static, for the host target: --target keeps the static flag off build scripts and
# proc macros. A scratch image has no dynamic loader and no libc.
echo "build-image: cargo build --profile $profile --target $host (static)" >&2
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static -C relocation-model=static" \
	cargo build --locked --quiet --profile "$profile" --target "$host" --bin cni-ledger
bin=${CARGO_TARGET_DIR:-target}/$host/$out/cni-ledger
! command -v file >/dev/null || file -b "$bin" | grep -q 'static' || {
	echo "build-image: $bin is not statically linked" >&2
	exit 1
}

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$bin" "$ctx/cni-ledger"
echo "build-image: $engine build -t $tag" >&2
"$engine" build --quiet -f Containerfile -t "$tag" "$ctx" >&2
echo "$tag"
