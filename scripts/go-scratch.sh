# shellcheck shell=bash
# Sourced by scripts/build-*.sh once they know they must build: Go's build cache and module
# cache for this one build, in a scratch dir that goes when the script exits. The binaries
# are what the version-keyed caches keep; Go's own caches would stay behind in ~/.cache and
# ~/go (some 9 GB after Kubernetes, CRI-O and whereabouts), on a disk CI shares with the
# Rust build. `go_scratch_also DIR` has DIR removed at exit too: sourcing this sets the
# script's EXIT trap, so a script sets no other.
go_scratch=$(mktemp -d "${TMPDIR:-/var/tmp}/cni-ledger-go.XXXXXX")
export GOCACHE=$go_scratch/build GOMODCACHE=$go_scratch/mod
go_scratch_dirs=("$go_scratch")
go_scratch_also() { go_scratch_dirs+=("$@"); }
# The module cache is read-only by design: made writable before it can be removed.
go_scratch_clean() {
	chmod -R u+w "${go_scratch_dirs[@]}" 2>/dev/null || true
	rm -rf "${go_scratch_dirs[@]}"
}
trap go_scratch_clean EXIT
