#!/usr/bin/env bash
# scripts/build-plugins.sh: build the CNI reference plugins v1.10.x
# (github.com/containernetworking/plugins) for the tests, beside Debian bookworm's 1.1.1
# in /usr/lib/cni, into a cache dir OUTSIDE the clone keyed by the version:
#
#   $CNI_LEDGER_PLUGINS_CACHE/<version>/bin/   (default /var/cache/cni-ledger-plugins)
#
# and print that bin dir on stdout (the only thing printed there; progress goes to stderr).
#
# The version: $CNI_LEDGER_PLUGINS_VERSION if set (e.g. v1.10.0), else the newest v1.10.x
# the Go module proxy serves (`go list -m -versions`); if the proxy cannot be asked, the
# newest v1.10.x already built in the cache. The plugins: bridge, host-local, portmap,
# loopback (what tests/plugins_v110.rs and bench/nft-replay.sh run), plus firewall and
# tuning; $CNI_LEDGER_PLUGINS names others. Each is `go install <module>/plugins/<kind>/
# <name>@<version>` with CGO_ENABLED=0 and GOBIN the cache dir: the module has no replace
# directives (checked below), so `go install pkg@version` builds it exactly as its own
# go.mod and go.sum pin it; no wrapper module, nothing written in the repository.
#
# Idempotent: bin/.built records the version, the plugin list, the Go version and the
# recipe; a second run with it in place and every binary present builds nothing (and
# runs no go command when the version is given). Delete the dir to rebuild.
#
# Also makes sure `nft` (Debian's nftables) is there: portmap's `"backend": "nftables"`
# and bridge's `"ipMasqBackend": "nftables"` drive nftables through the nft CLI
# (sigs.k8s.io/knftables); as root it is installed when missing.
#
# Needs: Go >= the module's `go` line (1.26.8 for v1.10.0): $GO, else target/go-1.27
# (scripts/fetch-unstable.sh's, as scripts/test.sh fetches it), else /usr/local/go/bin/go,
# else `go` on PATH; the Go module proxy for a cold build. Go runs under `nice -n 19`
# (CNI_LEDGER_PLUGINS_NICE= to not).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

MODULE=github.com/containernetworking/plugins
SERIES=v1.10
# Bump when the build recipe below changes: a stamp of another recipe means "rebuild".
RECIPE=1

cache=${CNI_LEDGER_PLUGINS_CACHE:-/var/cache/cni-ledger-plugins}
nice_cmd=(${CNI_LEDGER_PLUGINS_NICE-nice -n 19})
read -r -a plugins <<<"${CNI_LEDGER_PLUGINS:-bridge host-local portmap loopback firewall tuning}"

die() {
	printf 'build-plugins: %s\n' "$*" >&2
	exit 1
}
say() { printf 'build-plugins: %s\n' "$*" >&2; }

# Where each plugin lives in the module.
pkg_of() {
	case $1 in
	bridge | loopback | host-device | ipvlan | macvlan | ptp | vlan | tap | dummy | vrf)
		echo "$MODULE/plugins/main/$1" ;;
	host-local | dhcp | static) echo "$MODULE/plugins/ipam/$1" ;;
	portmap | firewall | tuning | bandwidth | sbr)
		echo "$MODULE/plugins/meta/$1" ;;
	*) die "unknown plugin '$1'" ;;
	esac
}
for p in "${plugins[@]}"; do pkg_of "$p" >/dev/null; done

# nft: the nftables backends need the CLI at run time.
if ! command -v nft >/dev/null 2>&1 && [ ! -x /usr/sbin/nft ]; then
	[ "$(id -u)" -eq 0 ] || die "nft not found: install Debian's nftables (apt-get install nftables)"
	say "installing nftables (the nft CLI the plugins' nftables backends run)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y nftables >&2 ||
		{ apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y nftables >&2; } ||
		die "apt-get install nftables failed"
fi

# The Go toolchain: the first candidate that runs.
pick_go() {
	local c
	for c in "${GO:-}" "$PWD/target/go-1.27/usr/lib/go-1.27/bin/go" /usr/local/go/bin/go "$(command -v go 2>/dev/null || true)"; do
		[ -n "$c" ] && [ -x "$c" ] && "$c" version >/dev/null 2>&1 && {
			echo "$c"
			return 0
		}
	done
	return 1
}

# The newest stamped v1.10.x in the cache (for an offline run).
newest_cached() {
	local d
	for d in "$cache"/"$SERIES".*/bin/.built; do
		[ -f "$d" ] || continue
		d=${d%/bin/.built}
		echo "${d##*/}"
	done | sort -V | tail -n 1
}

go_bin=
go_env=()
setup_go() {
	[ -n "$go_bin" ] && return 0
	go_bin=$(pick_go) || die "no Go toolchain found (\$GO, target/go-1.27, /usr/local/go, PATH)"
	go_env=(env CGO_ENABLED=0 GOFLAGS= GOTOOLCHAIN=local GOWORK=off)
	case $go_bin in
	*/go-1.27/usr/lib/go-1.27/bin/go) go_env+=("GOROOT=${go_bin%/bin/go}") ;;
	esac
}

version=${CNI_LEDGER_PLUGINS_VERSION:-}
if [ -z "$version" ]; then
	setup_go
	if versions=$("${go_env[@]}" "$go_bin" list -m -versions "$MODULE" 2>/dev/null); then
		version=$(tr ' ' '\n' <<<"$versions" | grep -E "^${SERIES//./\\.}\.[0-9]+$" | sort -V | tail -n 1 || true)
		[ -n "$version" ] || die "the module proxy serves no $SERIES.x of $MODULE (it has: $versions)"
	else
		version=$(newest_cached)
		[ -n "$version" ] || die "cannot ask the Go module proxy for $MODULE's versions, and no $SERIES.x is cached in $cache"
		say "module proxy unreachable: using the cached $version"
	fi
fi
case $version in
v[0-9]*.[0-9]*.[0-9]*) ;;
*) die "not a version: '$version'" ;;
esac

bin=$cache/$version/bin
stamp=$bin/.built
want="recipe=$RECIPE module=$MODULE version=$version plugins=${plugins[*]}"

if [ -f "$stamp" ] && [ "$(sed -n 1p "$stamp")" = "$want" ]; then
	ok=1
	for p in "${plugins[@]}"; do [ -x "$bin/$p" ] || ok=0; done
	if [ $ok = 1 ]; then
		echo "$bin"
		exit 0
	fi
fi

setup_go
. "$(dirname "${BASH_SOURCE[0]}")/go-scratch.sh"
say "building $MODULE@$version (${plugins[*]}) with $("$go_bin" version) into $bin"
start=$(date +%s)

# The module must have no replace directives: `go install pkg@version` refuses them, and
# they would mean the module is not built as its go.mod says.
modfile=$("${go_env[@]}" "$go_bin" mod download -json "$MODULE@$version" |
	sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
[ -f "$modfile" ] || die "go mod download $MODULE@$version gave no go.mod"
if grep -Eq '^[[:space:]]*replace([[:space:]]|\()' "$modfile"; then
	die "$MODULE@$version's go.mod has replace directives; go install pkg@version cannot build it"
fi

mkdir -p "$bin"
# A fresh GOBIN, then a rename per binary: a test running beside a rebuild never sees a
# half-written plugin.
tmp=$(mktemp -d "$cache/$version/.build.XXXXXX")
go_scratch_also "$tmp"
pkgs=()
for p in "${plugins[@]}"; do pkgs+=("$(pkg_of "$p")@$version"); done
for pk in "${pkgs[@]}"; do
	"${nice_cmd[@]}" "${go_env[@]}" GOBIN="$tmp" "$go_bin" install -trimpath "$pk" >&2 ||
		die "go install $pk failed"
done
for p in "${plugins[@]}"; do
	[ -x "$tmp/$p" ] || die "go install left no $p"
	if file "$tmp/$p" 2>/dev/null | grep -q 'dynamically linked'; then
		die "$p is dynamically linked (CGO_ENABLED=0 should make it static)"
	fi
	mv -f "$tmp/$p" "$bin/$p"
done
{
	echo "$want"
	echo "go=$("$go_bin" version)"
	echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) seconds=$(($(date +%s) - start))"
} >"$stamp.tmp"
mv -f "$stamp.tmp" "$stamp"
say "built in $(($(date +%s) - start)) s"
echo "$bin"
