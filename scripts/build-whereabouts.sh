#!/usr/bin/env bash
# scripts/build-whereabouts.sh: build whereabouts (github.com/k8snetworkplumbingwg/whereabouts,
# the pinned version below) for tests/whereabouts.rs and tests/k8s/cluster.sh's
# CNI_LEDGER_K8S_IPAM=whereabouts, into a cache dir OUTSIDE the clone keyed by its version,
# and print that dir on stdout (the only thing printed there; progress goes to stderr):
#
#   $CNI_LEDGER_WHEREABOUTS_CACHE/whereabouts-<version>/   (default /var/cache/cni-ledger-whereabouts)
#     bin/whereabouts        the IPAM plugin (the module's ./cmd)
#     bin/ip-control-loop    its reconciler (./cmd/controlloop: the pod-deletion controller and
#                            the cron-scheduled pass over every IPPool)
#     crds/                  the module's CRDs (doc/crds/whereabouts.cni.cncf.io_*.yaml), and
#                            the NetworkAttachmentDefinition CRD of the
#                            network-attachment-definition-client version its go.mod pins
#                            (artifacts/networks-crd.yaml): ip-control-loop waits for its
#                            NAD informer to sync, so without it it never starts a pass
#     install/daemonset-install.yaml   the module's DaemonSet, RBAC and cron ConfigMap
#
# WHEREABOUTS_VERSION picks another tag (`latest`: the newest the Go module proxy serves,
# as `go list -m -versions` lists it). The module's go.mod has a replace directive (gogo/
# protobuf), which `go install pkg@version` refuses, so the binaries are built with
# `go build` in a copy of the module dir, its own go.mod and go.sum untouched
# (-mod=readonly), with CGO_ENABLED=0, -trimpath and the version stamps hack/build-go.sh
# sets.
#
# Idempotent and cheap when warm: once the dir holds its stamp (.built, naming the recipe)
# and every file, no go command runs at all. Delete the dir to rebuild. Prints the cold
# build time on stderr.
#
# Needs: Go >= 1.24 (the module's `go` line): $GO, else /usr/local/go/bin/go, else the Go
# 1.27 scripts/test.sh unpacks into target/go-1.27, else `go` on PATH, the first new
# enough; the Go module proxy for a cold build. Go runs under `nice -n 19` (set
# CNI_LEDGER_WHEREABOUTS_NICE= to not).
set -euo pipefail

WHEREABOUTS_VERSION=${WHEREABOUTS_VERSION:-v0.9.2}
MODULE=github.com/k8snetworkplumbingwg/whereabouts
NAD_MODULE=github.com/k8snetworkplumbingwg/network-attachment-definition-client
# Bump when the build recipe below changes: a stamp of another recipe means "rebuild".
RECIPE=1

cd "$(dirname "${BASH_SOURCE[0]}")/.."

cache=${CNI_LEDGER_WHEREABOUTS_CACHE:-/var/cache/cni-ledger-whereabouts}
# shellcheck disable=SC2206 # word splitting wanted: the command and its args
nice_cmd=(${CNI_LEDGER_WHEREABOUTS_NICE-nice -n 19})

die() {
	printf 'build-whereabouts: %s\n' "$*" >&2
	exit 1
}
say() { printf 'build-whereabouts: %s\n' "$*" >&2; }

# A Go of at least 1.24 (whereabouts v0.9's go.mod says `go 1.24`).
go_ok() {
	local v
	v=$("$1" env GOVERSION 2>/dev/null) || return 1
	v=${v#go}
	local major=${v%%.*} rest=${v#*.}
	local minor=${rest%%[!0-9]*}
	[ "$major" -gt 1 ] || { [ "$major" -eq 1 ] && [ "${minor:-0}" -ge 24 ]; }
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
go_env=()
need_go() {
	[ -n "$go_bin" ] && return 0
	go_bin=$(find_go) || die "no Go >= 1.24 found: set GO, or install Go at /usr/local/go"
	# Our own settings, whatever the caller's environment says: the module's own go.sum
	# decides (-mod=readonly), no workspace, Go's own toolchain, never another one
	# downloaded behind our back.
	go_env=(env CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOWORK=off
		GOTOOLCHAIN=local GO111MODULE=on)
	case $go_bin in
	*/go-1.27/usr/lib/go-1.27/bin/go) go_env+=("GOROOT=${go_bin%/bin/go}") ;;
	esac
}
gocmd() { "${nice_cmd[@]}" "${go_env[@]}" "$go_bin" "$@"; }

if [ "$WHEREABOUTS_VERSION" = latest ]; then
	need_go
	WHEREABOUTS_VERSION=$(cd / && gocmd list -m -versions "$MODULE" | tr ' ' '\n' |
		grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$' | sort -V | tail -n 1) ||
		die "cannot list $MODULE's versions"
	[ -n "$WHEREABOUTS_VERSION" ] || die "the module proxy serves no release of $MODULE"
fi
case $WHEREABOUTS_VERSION in
v[0-9]*.[0-9]*.[0-9]*) ;;
*) die "not a version: '$WHEREABOUTS_VERSION'" ;;
esac

dir=$cache/whereabouts-$WHEREABOUTS_VERSION
stamp="recipe=$RECIPE module=$MODULE version=$WHEREABOUTS_VERSION cgo=0"
files=(bin/whereabouts bin/ip-control-loop crds/networks-crd.yaml install/daemonset-install.yaml)

complete() {
	local f
	[ "$(cat "$dir/.built" 2>/dev/null)" = "$stamp" ] || return 1
	for f in "${files[@]}"; do [ -s "$dir/$f" ] || return 1; done
	compgen -G "$dir/crds/whereabouts.cni.cncf.io_*.yaml" >/dev/null
}

if complete; then
	printf '%s\n' "$dir"
	exit 0
fi

need_go
. "$(dirname "${BASH_SOURCE[0]}")/go-scratch.sh"
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9 # one builder at a time; a second run then finds the first's stamp
if complete; then
	printf '%s\n' "$dir"
	exit 0
fi

say "building $MODULE@$WHEREABOUTS_VERSION with $("$go_bin" env GOVERSION) ($go_bin) into $dir"
start=$(date +%s)
src=$(cd / && gocmd mod download -json "$MODULE@$WHEREABOUTS_VERSION" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
[ -f "$src/go.mod" ] || die "go mod download $MODULE@$WHEREABOUTS_VERSION gave no module dir"

mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.build.XXXXXX")
go_scratch_also "$tmp"
# A writable copy (the module cache is read-only): built there as its own main module, so
# its replace directive applies, as in the project's own build.
cp -r "$src" "$tmp/src"
chmod -R u+w "$tmp/src"
pkg=$MODULE/pkg/version
ld="-s -w -X $pkg.Version=$WHEREABOUTS_VERSION -X $pkg.GitTreeState=clean -X $pkg.ReleaseStatus=released"
mkdir -p "$tmp/out/bin" "$tmp/out/crds" "$tmp/out/install"
(cd "$tmp/src" &&
	gocmd build -trimpath -ldflags "$ld" -o "$tmp/out/bin/whereabouts" ./cmd/ &&
	gocmd build -trimpath -ldflags "$ld" -o "$tmp/out/bin/ip-control-loop" ./cmd/controlloop/) ||
	die "go build failed"
CNI_COMMAND=VERSION "$tmp/out/bin/whereabouts" </dev/null | grep -q cniVersion ||
	die "the built whereabouts does not answer CNI VERSION"
cp "$tmp/src"/doc/crds/whereabouts.cni.cncf.io_*.yaml "$tmp/out/crds/"
cp "$tmp/src/doc/crds/daemonset-install.yaml" "$tmp/out/install/"
# The NAD CRD of the client version whereabouts' go.mod resolves to.
nad=$(cd "$tmp/src" && gocmd list -m -f '{{.Dir}}' "$NAD_MODULE") || die "go list -m $NAD_MODULE failed"
[ -n "$nad" ] && [ -d "$nad" ] || nad=$(cd "$tmp/src" && gocmd mod download -json "$NAD_MODULE" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
[ -f "$nad/artifacts/networks-crd.yaml" ] || die "no artifacts/networks-crd.yaml in $NAD_MODULE ($nad)"
cp "$nad/artifacts/networks-crd.yaml" "$tmp/out/crds/"
chmod -R u+w,go+rX "$tmp/out"
rm -rf "$dir/bin" "$dir/crds" "$dir/install"
mv "$tmp/out/bin" "$tmp/out/crds" "$tmp/out/install" "$dir/"
printf '%s\n' "$stamp" >"$dir/.built"
say "whereabouts $WHEREABOUTS_VERSION built in $(($(date +%s) - start)) s"
printf '%s\n' "$dir"
