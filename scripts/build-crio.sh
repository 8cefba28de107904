#!/usr/bin/env bash
# scripts/build-crio.sh [--path]: build CRI-O (github.com/cri-o/cri-o, the pinned version
# below) for tests/crio.rs into a cache dir OUTSIDE the clone keyed by its version, and
# print the bin dir on stdout (the only thing printed there; progress goes to stderr):
#
#   $CNI_LEDGER_CRIO_CACHE/cri-o-<version>/bin/{crio,pinns}   (default /var/cache/cni-ledger-crio)
#
#   --path   print where the bin dir is (or would be) and build nothing; tests/crio.rs
#            asks this way, so the version is pinned in one place, here.
#
# The module (`go mod download`) is copied out of the read-only module cache and built as
# the main module, with its own go.mod and go.sum (-mod=readonly): exactly the versions it
# pins. (`go install pkg@version` would do the same, but first asks the proxy for the
# module's version list, which a proxy serving only some versions refuses.) crio is built
# with cgo (libseccomp) and the build tags of the module's Makefile on a machine without
# gpgme, btrfs, AppArmor or SELinux headers (its hack/*_tag.sh), with
# containers_image_openpgp forced: image signatures checked in Go, no gpgme. pinns (the
# static C helper CRI-O pins a pod's namespaces with) is built with the module's own
# `make -C pinns`. conmon and runc are Debian's.
#
# Idempotent and cheap when warm: once bin/ holds both binaries and .built names this
# recipe, no go or make command runs at all. Delete the dir to rebuild. Prints the cold
# build time on stderr.
#
# Needs: Go >= the module's `go` line (1.26.3 for v1.36.3): $GO, else /usr/local/go/bin/go,
# target/go-1.27 (scripts/fetch-unstable.sh's), or `go` on PATH, the first new enough; gcc,
# make, pkg-config, libseccomp-dev and libc6-dev (pinns links statically); the Go module
# proxy for a cold build. Go and make run under `nice -n 19`; CNI_LEDGER_CRIO_NICE= to not.
set -euo pipefail

CRIO_VERSION=v1.36.3
MODULE=github.com/cri-o/cri-o
# The Makefile's BUILDTAGS as its hack/*_tag.sh pick them here, and openpgp instead of gpgme.
TAGS="containers_image_ostree_stub containers_image_openpgp exclude_graphdriver_btrfs btrfs_noversion seccomp"
# Bump when the build recipe below changes: a stamp of another recipe means "rebuild".
RECIPE=1

cd "$(dirname "${BASH_SOURCE[0]}")/.."

cache=${CNI_LEDGER_CRIO_CACHE:-/var/cache/cni-ledger-crio}
# shellcheck disable=SC2206 # word splitting wanted: the command and its args
nice_cmd=(${CNI_LEDGER_CRIO_NICE-nice -n 19})

die() {
	printf 'build-crio: %s\n' "$*" >&2
	exit 1
}
say() { printf 'build-crio: %s\n' "$*" >&2; }

print_only=false
case ${1:-} in
--path) print_only=true ;;
"") ;;
*) die "usage: scripts/build-crio.sh [--path]" ;;
esac

dir=$cache/cri-o-$CRIO_VERSION
bin=$dir/bin
stamp="recipe=$RECIPE module=$MODULE version=$CRIO_VERSION tags=$TAGS"

built() {
	[ -x "$bin/crio" ] && [ -x "$bin/pinns" ] && [ "$(cat "$dir/.built" 2>/dev/null)" = "$stamp" ]
}

if $print_only || built; then
	printf '%s\n' "$bin"
	exit 0
fi

# A Go at least as new as $1 (a version without the "go" prefix).
go_at_least() {
	local v
	v=$("$1" env GOVERSION 2>/dev/null) || return 1
	v=${v#go}
	[ "$(printf '%s\n' "$v" "$2" | sort -V | head -n 1)" = "$2" ]
}
find_go() {
	local g
	for g in ${GO:+"$GO"} /usr/local/go/bin/go "$PWD/target/go-1.27/usr/lib/go-1.27/bin/go" \
		"$(command -v go 2>/dev/null || true)"; do
		[ -n "$g" ] && [ -x "$g" ] || continue
		if go_at_least "$g" "$1"; then
			printf '%s\n' "$g"
			return 0
		fi
	done
	return 1
}

command -v gcc >/dev/null && command -v make >/dev/null && pkg-config --exists libseccomp 2>/dev/null ||
	die "needs gcc, make, pkg-config and libseccomp-dev (apt-get install gcc make pkg-config libseccomp-dev)"

mkdir -p "$dir"
exec 9>"$cache/.lock"
flock 9 # one builder at a time; a second run then finds the first's stamp
if built; then
	printf '%s\n' "$bin"
	exit 0
fi

# Our own settings, whatever the caller's environment says: no workspace, no toolchain
# downloaded behind our back.
export GOFLAGS= GOWORK=off GOTOOLCHAIN=local GO111MODULE=on
. "$(dirname "${BASH_SOURCE[0]}")/go-scratch.sh"
# Any Go can fetch the module; its go line then says which may build it.
boot_go=$(find_go 1.21) || die "no Go found: set GO, or install Go at /usr/local/go"
info=$(cd / && "${nice_cmd[@]}" "$boot_go" mod download -json "$MODULE@$CRIO_VERSION") ||
	die "go mod download $MODULE@$CRIO_VERSION failed (is the Go module proxy reachable?)"
field() { sed -n "s/^[[:space:]]*\"$1\": \"\\(.*\\)\",\\{0,1\\}\$/\\1/p" <<<"$info"; }
src=$(field Dir)
gomod=$(field GoMod)
[ -d "$src" ] && [ -f "$gomod" ] || die "go mod download gave no module dir or go.mod: $info"
need=$(sed -n 's/^go[[:space:]]\{1,\}\([0-9.]\{1,\}\)[[:space:]]*$/\1/p' "$gomod")
go_bin=$(find_go "${need:-1.21}") || die "no Go >= ${need} found: set GO, or install Go at /usr/local/go"
# The tag's date and commit, from the proxy's .info, where the Makefile takes git's.
date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "${gomod%.mod}.info")
commit=$(sed -n 's/.*"Hash":"\([0-9a-f]*\)".*/\1/p' "${gomod%.mod}.info")

tmp=$(mktemp -d "$dir/.build.XXXXXX")
go_scratch_also "$tmp"
cp -r "$src" "$tmp/cri-o"
chmod -R u+w "$tmp/cri-o"
say "building $MODULE $CRIO_VERSION with $("$go_bin" env GOVERSION) ($go_bin) into $bin"
start=$(date +%s)
ld="-s -w -X $MODULE/internal/version.buildDate=$date -X $MODULE/internal/version.buildCommit=$commit"
(cd "$tmp/cri-o" && CGO_ENABLED=1 "${nice_cmd[@]}" "$go_bin" build -mod=readonly -buildvcs=false \
	-trimpath -tags "$TAGS" -ldflags "$ld" -o bin/crio ./cmd/crio) >&2 ||
	die "go build ./cmd/crio failed"
say "crio built in $(($(date +%s) - start))s"
"${nice_cmd[@]}" make -C "$tmp/cri-o/pinns" CC=gcc >&2 || die "make -C pinns failed"
"$tmp/cri-o/bin/crio" --version >/dev/null || die "the built crio does not run"
rm -rf "$bin"
mv "$tmp/cri-o/bin" "$bin"
printf '%s\n' "$stamp" >"$dir/.built"
say "CRI-O $CRIO_VERSION built in $(($(date +%s) - start))s: $("$bin/crio" --version | head -n 1)"
printf '%s\n' "$bin"
