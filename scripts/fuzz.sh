#!/usr/bin/env bash
# scripts/fuzz.sh: run every cargo-fuzz target of fuzz/ for $FUZZ_SECONDS seconds each
# (default 20) and print how many inputs each one executed.
#
#   FUZZ_SECONDS=60 scripts/fuzz.sh            # all targets
#   scripts/fuzz.sh record_decode conflist     # some targets
#
# Targets: cni_config (the plugin's stdin: cni::config::parse, env name checks),
# record_decode (ledger::record::decode, re-encoding round trip), conflist
# (conflist::parse and the per-plugin DEL config / plugin lookup gc builds from it).
# Seeds: testdata/fuzz-seeds/<target>/ (read only); what libFuzzer finds goes to
# fuzz/corpus/<target>/, crashes to fuzz/artifacts/<target>/ (all git-ignored).
#
# cargo-fuzz needs nightly rustc flags; on a stable toolchain RUSTC_BOOTSTRAP=1 makes
# rustc accept them. AddressSanitizer is used when it builds, else no sanitizer
# (FUZZ_SANITIZER=none|address forces one). FUZZ_DEV=1 builds the targets unoptimised
# (cargo fuzz --dev): half the build time, overflow checks and debug assertions on,
# fewer inputs a second; the test command's short smoke run uses it. Exits non-zero if
# any target fails.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD

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
command -v cargo >/dev/null 2>&1 || {
	echo "scripts/fuzz.sh: cargo not found" >&2
	exit 1
}

if ! cargo fuzz --version >/dev/null 2>&1; then
	echo "==> installing cargo-fuzz"
	cargo install cargo-fuzz --locked
fi

export RUSTC_BOOTSTRAP=1
seconds=${FUZZ_SECONDS:-20}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
	mapfile -t targets < <(cd fuzz && cargo fuzz list)
fi

profile=()
[ "${FUZZ_DEV:-0}" != 1 ] || profile=(--dev)
sanitizer=${FUZZ_SANITIZER:-}
if [ -z "$sanitizer" ]; then
	echo "==> building fuzz targets with AddressSanitizer"
	if (cd fuzz && cargo fuzz build "${profile[@]}" -s address); then
		sanitizer=address
	else
		echo "==> AddressSanitizer build failed; building without a sanitizer"
		sanitizer=none
	fi
fi
(cd fuzz && cargo fuzz build "${profile[@]}" -s "$sanitizer")

declare -A execs
status=0
for t in "${targets[@]}"; do
	mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
	seeds=()
	[ ! -d "testdata/fuzz-seeds/$t" ] || seeds=("$root/testdata/fuzz-seeds/$t")
	log=$(mktemp)
	echo "==> fuzzing $t for ${seconds}s (sanitizer: $sanitizer)"
	if (cd fuzz && cargo fuzz run "${profile[@]}" -s "$sanitizer" "$t" "corpus/$t" "${seeds[@]}" -- \
		-max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
		-artifact_prefix="$root/fuzz/artifacts/$t/") >"$log" 2>&1; then
		n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
		execs[$t]=${n:-?}
	else
		execs[$t]=FAILED
		status=1
		echo "---- $t failed; last lines of its output:" >&2
		tail -n 60 "$log" >&2
	fi
	rm -f "$log"
done

echo
echo "fuzz results (${seconds}s per target, sanitizer: $sanitizer)"
printf '%-16s %s\n' TARGET EXECUTIONS
for t in "${targets[@]}"; do
	printf '%-16s %s\n' "$t" "${execs[$t]}"
done
exit $status
