#!/usr/bin/env bash
# scripts/fetch-unstable.sh PACKAGE DEST: unpack Debian unstable's PACKAGE into DEST
# (e.g. target/kustomize, whose usr/bin/ then holds the tool) for the tests, without
# installing anything from unstable on the system: apt runs with a sources list, package
# lists and cache of its own under $CNI_LEDGER_UNSTABLE_DIR (default
# /var/cache/cni-ledger-unstable), `apt-get download` fetches the one .deb (no
# dependencies: use it for self-contained packages such as Go binaries or source
# trees), and `dpkg-deb -x` unpacks it. The system's apt state, dpkg database and
# pinning are never read nor written.
#
# Idempotent: DEST/.fetched-PACKAGE records the version unpacked; a second call with it
# present does nothing (delete DEST to fetch the newest again).
set -euo pipefail

[ $# -eq 2 ] || {
	echo "usage: $0 PACKAGE DEST" >&2
	exit 2
}
pkg=$1
dest=$2
stamp=$dest/.fetched-$pkg
if [ -s "$stamp" ]; then
	exit 0
fi

state=${CNI_LEDGER_UNSTABLE_DIR:-/var/cache/cni-ledger-unstable}
mkdir -p "$state/etc/sources.list.d" "$state/etc/preferences.d" "$state/lists/partial" \
	"$state/cache/archives/partial" "$state/debs"
echo "deb http://deb.debian.org/debian unstable main" >"$state/etc/sources.list"
# Every apt path that the system's configuration could otherwise bring in is ours:
# no system sources or pins mix into unstable's lists, and no unstable list reaches
# the system's.
apt_opts=(
	-o "Dir::Etc::SourceList=$state/etc/sources.list"
	-o "Dir::Etc::SourceParts=$state/etc/sources.list.d"
	-o "Dir::Etc::Preferences=$state/etc/preferences"
	-o "Dir::Etc::PreferencesParts=$state/etc/preferences.d"
	-o "Dir::State::Lists=$state/lists"
	-o "Dir::Cache=$state/cache"
	-o "APT::Get::List-Cleanup=true"
	-q
)

echo "fetch-unstable: apt-get update (unstable lists in $state)" >&2
apt-get "${apt_opts[@]}" update >&2 ||
	{
		echo "fetch-unstable: apt-get update of unstable's lists failed" >&2
		exit 1
	}

# A fresh download dir, so the unpacked .deb is the one just fetched.
debs=$(mktemp -d "$state/debs/$pkg.XXXXXX")
trap 'rm -rf "$debs"' EXIT
# apt downloads as _apt where it can write the dir (else unsandboxed, with a warning).
chown _apt: "$debs" 2>/dev/null || true
(cd "$debs" && apt-get "${apt_opts[@]}" download "$pkg" >&2) ||
	{
		echo "fetch-unstable: apt-get download $pkg from unstable failed" >&2
		exit 1
	}
deb=$(find "$debs" -maxdepth 1 -name "${pkg}_*.deb" -print -quit)
[ -n "$deb" ] || {
	echo "fetch-unstable: no ${pkg}_*.deb in $debs after apt-get download" >&2
	exit 1
}

mkdir -p "$dest"
dpkg-deb -x "$deb" "$dest"
dpkg-deb -f "$deb" Version >"$stamp"
echo "fetch-unstable: $pkg $(cat "$stamp") unpacked into $dest" >&2
