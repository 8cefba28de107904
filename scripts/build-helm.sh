#!/usr/bin/env bash
# scripts/build-helm.sh [--path]: build helm v4 (helm.sh/helm/v4's cmd/helm, the pinned
# version below) with CGO_ENABLED=0 into a cache dir OUTSIDE the clone keyed by its
# version, and print the binary's path on stdout:
#
#   $CNI_LEDGER_HELM_CACHE/<version>/helm      (default /var/cache/cni-ledger-helm)
#
# tests/helm.rs (the chart in deploy/helm/cni-ledger against the kustomize base and
# overlays) runs that binary; scripts/test.sh runs this script before cargo test.
#
#   --path   print where the binary is (or would be) and build nothing; tests/helm.rs
#            asks this way, so the version is pinned in one place, here.
#
# HELM_VERSION picks another tag (`latest`: the newest v4.x the module proxy serves,
# pre-releases left out, as `go list -m -versions helm.sh/helm/v4` lists them).
# helm.sh/helm/v4's go.mod has no replace directives, so `go install module@version`
# builds it as its own main module, with its own go.sum: no wrapper module is needed.
# The version that `helm version` prints is set as helm's Makefile sets it.
#
# Idempotent and cheap when warm: once <version>/helm and its stamp (.built, naming the
# recipe) are there, no go command runs at all. Delete the dir to rebuild.
# Prints the cold build time on stderr.
#
# Needs: Go >= 1.26 ($GO; else /usr/local/go/bin/go, the Go 1.27 scripts/test.sh unpacks
# into target/go-1.27, or `go` on PATH, the first new enough) and the Go module proxy.
# The go command runs under `nice -n 19`; set CNI_LEDGER_HELM_NICE= to not.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v4.3.2}
# Bump when the build recipe below changes: a stamp of another recipe means "rebuild".
RECIPE=1
MODULE=helm.sh/helm/v4

cd "$(dirname "${BASH_SOURCE[0]}")/.."

cache=${CNI_LEDGER_HELM_CACHE:-/var/cache/cni-ledger-helm}
# shellcheck disable=SC2206 # word splitting wanted: the command and its args
nice_cmd=(${CNI_LEDGER_HELM_NICE-nice -n 19})

die() {
	printf 'build-helm: %s\n' "$*" >&2
	exit 1
}
say() { printf 'build-helm: %s\n' "$*" >&2; }

print_only=false
case ${1:-} in
--path) print_only=true ;;
"") ;;
*) die "usage: scripts/build-helm.sh [--path]" ;;
esac

# A Go of at least 1.26 (helm v4.3's go.mod says `go 1.26.0`).
go_ok() {
	local v
	v=$("$1" env GOVERSION 2>/dev/null) || return 1
	v=${v#go}
	local major=${v%%.*} rest=${v#*.}
	local minor=${rest%%[!0-9]*}
	[ "$major" -gt 1 ] || { [ "$major" -eq 1 ] && [ "${minor:-0}" -ge 26 ]; }
}
find_go() {
	local g
	for g in ${GO:+"$GO"} /usr/local/go/bin/go "$PWD/target/go-1.27/usr/lib/go-1.27/bin/go" \
		"$(command -v go 2>/dev/null || true)"; do
		[ -n "$g" ] && [ -x "$g" ] || continue
		if go_ok "$g"; then
			printf '%s\n' "$g"
			return 0
		fi
	done
	return 1
}

go_bin=
need_go() {
	[ -n "$go_bin" ] && return 0
	go_bin=$(find_go) || die "no Go >= 1.26 found: set GO, or install Go at /usr/local/go"
	# Go's own toolchain, never another downloaded behind our back.
	export GOTOOLCHAIN=local
	export GO111MODULE=on
}

if [ "$HELM_VERSION" = latest ]; then
	need_go
	HELM_VERSION=$(cd / && "$go_bin" list -m -versions "$MODULE" | tr ' ' '\n' |
		grep -E '^v4\.[0-9]+\.[0-9]+$' | sort -V | tail -n 1) ||
		die "cannot list $MODULE's versions"
	[ -n "$HELM_VERSION" ] || die "the module proxy serves no v4.x of $MODULE"
fi
case $HELM_VERSION in
v4.*) ;;
*) die "HELM_VERSION must be a v4.x tag, not '$HELM_VERSION'" ;;
esac

dir=$cache/$HELM_VERSION
bin=$dir/helm
stamp="recipe=$RECIPE module=$MODULE version=$HELM_VERSION cgo=0"

if $print_only; then
	printf '%s\n' "$bin"
	exit 0
fi

if [ -x "$bin" ] && [ "$(cat "$dir/.built" 2>/dev/null)" = "$stamp" ]; then
	printf '%s\n' "$bin"
	exit 0
fi

need_go
. "$(dirname "${BASH_SOURCE[0]}")/go-scratch.sh"
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.build.XXXXXX")
go_scratch_also "$tmp"
say "building helm $HELM_VERSION with $("$go_bin" env GOVERSION) ($go_bin) into $dir"
start=$(date +%s)
# Outside any module (cd /tmp): `go install module@version` builds the tag as its own
# main module. -trimpath and -s -w as helm's Makefile builds its release binaries.
(cd "$tmp" && CGO_ENABLED=0 GOBIN="$tmp/bin" "${nice_cmd[@]}" "$go_bin" install -trimpath \
	-ldflags "-s -w -X $MODULE/internal/version.version=$HELM_VERSION" \
	"$MODULE/cmd/helm@$HELM_VERSION")
"$tmp/bin/helm" version --short >/dev/null || die "the built helm does not run"
mv -f "$tmp/bin/helm" "$bin"
printf '%s\n' "$stamp" >"$dir/.built"
say "helm $HELM_VERSION built in $(($(date +%s) - start))s: $("$bin" version --short)"
printf '%s\n' "$bin"
