#!/usr/bin/env bash
# scripts/build-k8s.sh [COMPONENT...]: build, from Go modules, the pinned binaries of a
# one-node Kubernetes for the tests (tests/k8s/cluster.sh), each into a cache dir OUTSIDE
# the clone keyed by its version:
#
#   $CNI_LEDGER_K8S_CACHE/<component>-<version>/bin/   (default /var/cache/cni-ledger-k8s)
#
#   kubernetes  v1.37.2  kubelet kube-apiserver kube-controller-manager kube-scheduler kubectl
#   etcd        v3.7.4   etcd        (1.37.2 pins etcd 3.7.0: build/dependencies.yaml,
#                                     hack/lib/etcd.sh; bookworm's etcd-server is 3.4)
#   containerd  v2.4.2   containerd containerd-shim-runc-v2 ctr
#   runc        v1.5.2   runc        (the runc containerd 2.4.2 is tested with:
#                                     script/setup/runc-version; bookworm's is 1.1.5)
#   crictl      v1.37.0  crictl      (sigs.k8s.io/cri-tools)
#
# COMPONENT names pick some of them (default: all). Each build goes through a small
# wrapper module generated in the component's dir (src/), never in the repository.
# Kubernetes cannot be built as a plain module dependency: its root go.mod requires each
# staging module k8s.io/<name> at v0.0.0 and replaces it with ./staging/src/k8s.io/<name>,
# and a dependency's replaces are ignored. The wrapper requires k8s.io/kubernetes at the
# tag and replaces each staging module with its published v0.<minor>.<patch>, the list
# read from the tag's own go.mod (its `=> ./staging/...` replace lines).
#
# Idempotent and cheap when warm: a component whose dir holds its stamp (.built, naming
# the recipe) and binaries is not rebuilt, and no go command runs at all. Delete the dir
# to rebuild one. Prints the cold build time of each component and the total.
#
# Needs: Go >= 1.26.6 ($GO, default /usr/local/go/bin/go, else `go` on PATH) and the Go
# module proxy; for runc also gcc, pkg-config and libseccomp-dev (runc needs cgo).
# Every go command runs under `nice -n 19`; set CNI_LEDGER_K8S_NICE= to not.
set -euo pipefail

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.7.4
CONTAINERD_VERSION=v2.4.2
RUNC_VERSION=v1.5.2
CRICTL_VERSION=v1.37.0
# Bump when a build recipe below changes: a stamp of another recipe means "rebuild".
RECIPE=1

cache=${CNI_LEDGER_K8S_CACHE:-/var/cache/cni-ledger-k8s}
nice_cmd=(${CNI_LEDGER_K8S_NICE-nice -n 19})

die() {
	printf 'build-k8s: %s\n' "$*" >&2
	exit 1
}
say() { printf 'build-k8s: %s\n' "$*" >&2; }

all=(kubernetes etcd containerd runc crictl)
if [ $# -gt 0 ]; then
	comps=("$@")
	for c in "${comps[@]}"; do
		case " ${all[*]} " in
		*" $c "*) ;;
		*) die "unknown component '$c' (known: ${all[*]})" ;;
		esac
	done
else
	comps=("${all[@]}")
fi

version_of() {
	case $1 in
	kubernetes) echo "$K8S_VERSION" ;;
	etcd) echo "$ETCD_VERSION" ;;
	containerd) echo "$CONTAINERD_VERSION" ;;
	runc) echo "$RUNC_VERSION" ;;
	crictl) echo "$CRICTL_VERSION" ;;
	esac
}
bins_of() {
	case $1 in
	kubernetes) echo "kubelet kube-apiserver kube-controller-manager kube-scheduler kubectl" ;;
	etcd) echo "etcd" ;;
	containerd) echo "containerd containerd-shim-runc-v2 ctr" ;;
	runc) echo "runc" ;;
	crictl) echo "crictl" ;;
	esac
}
dir_of() { echo "$cache/$1-$(version_of "$1")"; }
stamp_text() { echo "$1 $(version_of "$1") recipe=$RECIPE"; }

built() {
	local d b
	d=$(dir_of "$1")
	[ "$(cat "$d/.built" 2>/dev/null)" = "$(stamp_text "$1")" ] || return 1
	for b in $(bins_of "$1"); do
		[ -x "$d/bin/$b" ] || return 1
	done
}

# The warm path: everything there, nothing to start.
todo=()
for c in "${comps[@]}"; do
	built "$c" || todo+=("$c")
done
if [ ${#todo[@]} -eq 0 ]; then
	for c in "${comps[@]}"; do
		say "$c $(version_of "$c"): cached in $(dir_of "$c")/bin"
	done
	exit 0
fi

# --- cold path -------------------------------------------------------------------------

if [ -z "${GO:-}" ]; then
	if [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go; else GO=$(command -v go) || die "no Go toolchain: set GO"; fi
fi
gov=$("$GO" env GOVERSION) || die "$GO does not run"
# containerd 2.4.2's and cri-tools 1.37.0's go.mod say go 1.26.6; k8s' staging go 1.26.0.
gov_ok=$(printf '%s\n' "${gov#go}" 1.26.6 | sort -V | head -1)
[ "$gov_ok" = 1.26.6 ] || die "$GO is $gov; need go1.26.6 or newer"

# Our own settings, whatever the caller's environment says: modules resolved and recorded
# in each wrapper's go.mod/go.sum (-mod=mod), no workspace, no toolchain switch.
export GOFLAGS="-mod=mod -buildvcs=false" GOWORK=off GOTOOLCHAIN=local GO111MODULE=on
. "$(dirname "${BASH_SOURCE[0]}")/go-scratch.sh"
gocmd() { "${nice_cmd[@]}" "$GO" "$@"; }

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9 # one builder at a time; a second run then finds the first's stamps

# A fresh wrapper module in $1/src requiring $2@$3.
wrapper() {
	local d=$1 mod=$2 ver=$3
	rm -rf "$d/src" "$d/bin.new"
	mkdir -p "$d/src" "$d/bin.new"
	(cd "$d/src" &&
		gocmd mod init "cni-ledger-build/$(basename "$d")" 2>/dev/null &&
		printf 'package tools\n' >tools.go &&
		gocmd mod edit -require="$mod@$ver")
}

finish() {
	local c=$1 d
	d=$(dir_of "$c")
	for b in $(bins_of "$c"); do
		[ -x "$d/bin.new/$b" ] || die "$c: $b was not built"
	done
	rm -rf "$d/bin"
	mv "$d/bin.new" "$d/bin"
	stamp_text "$c" >"$d/.built"
}

build_kubernetes() {
	local d=$1 v=$K8S_VERSION gomod minor old new n=0 edits=()
	# The tag's own go.mod, as the proxy serves it (the module zip comes along: the build
	# needs it anyway).
	gomod=$(gocmd mod download -json "k8s.io/kubernetes@$v" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
	[ -s "$gomod" ] || die "kubernetes: no go.mod for k8s.io/kubernetes@$v"
	minor=${v#v1.} # 37.2
	wrapper "$d" k8s.io/kubernetes "$v"
	# Its replace directives, one "old => new" per line, from both the block and the
	# single-line form (go.mod files from the proxy are gofmt'ed: one directive a line).
	while read -r old new; do
		case $new in
		./staging/src/"$old")
			edits+=("-replace=$old=$old@v0.$minor")
			n=$((n + 1))
			;;
		./* | ../* | /*) die "kubernetes: $v's go.mod replaces $old with a local path outside staging: $new" ;;
		*)
			# A replace with a module version (none in 1.37.2): carry it over as is.
			edits+=("-replace=$old=${new% *}@${new#* }")
			;;
		esac
	done < <(awk '
		/^replace[[:space:]]*\(/ { inblock = 1; next }
		inblock && /^\)/ { inblock = 0; next }
		inblock && /=>/ { line = $0 }
		/^replace[[:space:]]+[^(]/ { line = $0; sub(/^replace[[:space:]]+/, "", line) }
		line != "" {
			sub(/\/\/.*/, "", line); split(line, lr, "=>")
			l = lr[1]; r = lr[2]; gsub(/^[[:space:]]+|[[:space:]]+$/, "", l); gsub(/^[[:space:]]+|[[:space:]]+$/, "", r)
			split(l, lw, /[[:space:]]+/) # an "old version =>" replaces one version: keep the path
			print lw[1], r; line = ""
		}' "$gomod")
	[ "$n" -gt 0 ] || die "kubernetes: no ./staging replace lines found in $gomod"
	gocmd mod edit "${edits[@]}" "$d/src/go.mod"
	say "kubernetes: wrapper replaces $n staging modules with v0.$minor"
	# The version stamps hack/lib/version.sh sets (kubelet reports gitVersion as the Node's
	# kubeletVersion); the build date is the tag's, from the proxy's .info.
	local date maj min ld pkg
	date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "${gomod%.mod}.info")
	maj=${v#v}
	maj=${maj%%.*}
	min=${minor%%.*}
	ld="-s -w"
	for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
		ld+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$maj -X $pkg.gitMinor=$min"
		ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
	done
	(cd "$d/src" && CGO_ENABLED=0 gocmd build -trimpath -ldflags "$ld" -o "$d/bin.new/" \
		k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-apiserver \
		k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
		k8s.io/kubernetes/cmd/kubectl)
}

build_etcd() {
	local d=$1
	# etcd's server/go.mod replaces its sibling modules (../api, ...) with local paths; from
	# a wrapper those are ignored and the tag's required versions (the same tag) are used.
	wrapper "$d" go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
	(cd "$d/src" && CGO_ENABLED=0 gocmd build -trimpath -ldflags "-s -w" -o "$d/bin.new/etcd" \
		go.etcd.io/etcd/server/v3)
}

build_containerd() {
	local d=$1 v=$CONTAINERD_VERSION p=github.com/containerd/containerd/v2 ld tags
	wrapper "$d" "$p" "$v"
	ld="-s -w -X $p/version.Version=$v -X $p/version.Package=github.com/containerd/containerd"
	# containerd's Makefile tags for a static build; btrfs needs cgo and drops out with it.
	tags="urfave_cli_no_docs osusergo netgo static_build"
	(cd "$d/src" &&
		CGO_ENABLED=0 gocmd build -trimpath -tags "$tags" -ldflags "$ld" -o "$d/bin.new/" \
			"$p/cmd/containerd" "$p/cmd/ctr" &&
		CGO_ENABLED=0 gocmd build -trimpath -tags "$tags no_grpc" -ldflags "$ld" -o "$d/bin.new/" \
			"$p/cmd/containerd-shim-runc-v2")
}

build_runc() {
	local d=$1
	command -v gcc >/dev/null && pkg-config --exists libseccomp 2>/dev/null ||
		die "runc: needs cgo with gcc, pkg-config and libseccomp-dev (apt-get install gcc pkg-config libseccomp-dev)"
	wrapper "$d" github.com/opencontainers/runc "$RUNC_VERSION"
	# runc's Makefile tags minus libpathrs (a Rust library not packaged in bookworm).
	(cd "$d/src" && CGO_ENABLED=1 gocmd build -trimpath -buildmode=pie -tags "seccomp urfave_cli_no_docs" \
		-ldflags "-s -w -X main.gitCommit=$RUNC_VERSION" -o "$d/bin.new/runc" github.com/opencontainers/runc)
}

build_crictl() {
	local d=$1 p=sigs.k8s.io/cri-tools
	wrapper "$d" "$p" "$CRICTL_VERSION"
	(cd "$d/src" && CGO_ENABLED=0 gocmd build -trimpath \
		-ldflags "-s -w -X $p/pkg/version.Version=$CRICTL_VERSION" -o "$d/bin.new/crictl" "$p/cmd/crictl")
}

since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

say "cache $cache, $gov; building: ${todo[*]}"
total_start=$(date +%s.%N)
report=()
for c in "${todo[@]}"; do
	built "$c" && continue # built meanwhile by a run we waited for
	d=$(dir_of "$c")
	mkdir -p "$d"
	say "$c $(version_of "$c"): building in $d (log: $d/build.log)"
	t0=$(date +%s.%N)
	# In the background so that errexit holds inside (it is off in an `if` or `||` list).
	("build_$c" "$d") >"$d/build.log" 2>&1 &
	if ! wait $!; then
		tail -n 30 "$d/build.log" >&2
		die "$c $(version_of "$c"): build failed (whole log: $d/build.log)"
	fi
	finish "$c"
	t=$(since "$t0")
	report+=("$(printf '%-11s %-8s %7ss' "$c" "$(version_of "$c")" "$t")")
	say "$c $(version_of "$c"): built in ${t}s: $(bins_of "$c")"
done
total=$(since "$total_start")
say "cold build times:"
for r in "${report[@]}"; do say "  $r"; done
say "$(printf '  %-20s %7ss' total "$total")"
