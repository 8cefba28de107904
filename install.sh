#!/usr/bin/env bash
# install.sh: build cni-ledger from this source tree and install it on a node.
#
# Run as root from a checkout. Idempotent: re-running converges to the same
# state and replaces only what changed. See --help for the options.
# "a && b || die" is meant: die when any step fails.
# shellcheck disable=SC2015
set -euo pipefail
umask 022

prog=install.sh
DEFAULT_BIN_DIR=/opt/cni/bin
DEFAULT_LEDGER_DIR=/var/lib/cni-ledger
DEFAULT_CONF_DIR=/etc/cni/net.d
UNIT_DIR=/etc/systemd/system
CRON_FILE=/etc/cron.d/cni-ledger
# Man pages, completions and the CLI link: the local administrator's tree.
SHARE_PREFIX=/usr/local
SERVICE=cni-ledger-gc.service
TIMER=cni-ledger-gc.timer

usage() {
	cat <<EOF
Usage: $prog [OPTION]...

Build cni-ledger (cargo build --release --locked, statically linked) and install it:
  - the binary as DIR/cni-ledger, replaced atomically (default DIR: $DEFAULT_BIN_DIR);
  - the man pages (man cni-ledger) and bash/zsh/fish completions under
    $SHARE_PREFIX/share, and $SHARE_PREFIX/sbin/cni-ledger linked to the binary;
  - the ledger directory (mode 0700, root:root; existing records are kept);
  - records for attachments libcni's cache knows and the ledger lacks, of the
    networks whose chain holds the ledger ('cni-ledger adopt', run once, after
    --inject);
  - the gc schedule: with systemd running, the units $SERVICE (runs at boot)
    and $TIMER (1 min after boot, then every 5 min), enabled and the timer
    started; without systemd, the cron file $CRON_FILE (every 5 min and @reboot).
CNI network configurations are never edited unless --inject is given.

Options:
  --prefix DIR        directory for the binary, i.e. the CNI plugin directory
                      (default $DEFAULT_BIN_DIR)
  --cni-bin-dir DIR   same as --prefix
  --ledger-dir DIR    ledger directory (default $DEFAULT_LEDGER_DIR)
  --conf-dir DIR      CNI configuration directory (default $DEFAULT_CONF_DIR)
  --no-systemd        install no gc schedule at all (no units, no cron file);
                      prints the gc command to schedule yourself
  --inject            run 'cni-ledger inject' on every *.conflist in the conf
                      dir (without it, only the commands are printed)
  --binary PATH       install this prebuilt cni-ledger instead of building one
                      (e.g. the static release build made on another machine
                      by this script); cargo is not needed then
  -h, --help          show this help

Needs root and, unless --binary is given, cargo (Rust >= 1.89;
\$HOME/.cargo/bin and /root/.cargo/bin are searched too) and network access
to crates.io only.
EOF
}

die() {
	printf '%s: error: %s\n' "$prog" "$*" >&2
	exit 1
}
usage_error() {
	printf '%s: %s\nTry '\''%s --help'\''.\n' "$prog" "$*" "$prog" >&2
	exit 2
}
warn() { printf '%s: warning: %s\n' "$prog" "$*" >&2; }
info() { printf '%s: %s\n' "$prog" "$*"; }

# ---------------------------------------------------------------- options

bin_dir=$DEFAULT_BIN_DIR
ledger_dir=$DEFAULT_LEDGER_DIR
conf_dir=$DEFAULT_CONF_DIR
want_schedule=1
inject=0
prebuilt=

while [ $# -gt 0 ]; do
	opt=$1
	case $opt in
	--prefix=* | --cni-bin-dir=* | --ledger-dir=* | --conf-dir=* | --binary=*)
		val=${opt#*=}
		opt=${opt%%=*}
		shift
		;;
	--prefix | --cni-bin-dir | --ledger-dir | --conf-dir | --binary)
		[ $# -ge 2 ] || usage_error "option $opt needs a path"
		val=$2
		shift 2
		;;
	--no-systemd) want_schedule=0; shift; continue ;;
	--inject) inject=1; shift; continue ;;
	-h | --help) usage; exit 0 ;;
	*) usage_error "unknown argument: $opt" ;;
	esac
	[ -n "$val" ] || usage_error "option $opt needs a path"
	case $opt in
	--binary) prebuilt=$val ;;
	--prefix | --cni-bin-dir) bin_dir=$val ;;
	--ledger-dir) ledger_dir=$val ;;
	--conf-dir) conf_dir=$val ;;
	esac
done

# Paths end up in unit files, a crontab line and sed replacements: accept
# plain absolute paths only, and normalise trailing slashes.
check_path() { # NAME VALUE -> prints the normalised value
	local name=$1 p=$2
	case $p in
	/*) ;;
	*) usage_error "$name must be an absolute path: $p" ;;
	esac
	[[ $p =~ ^[A-Za-z0-9._/+@-]+$ ]] ||
		usage_error "$name may contain only letters, digits and . _ / + @ -: $p"
	while [ "${#p}" -gt 1 ] && [ "${p%/}" != "$p" ]; do p=${p%/}; done
	case /$p/ in
	*/../* | */./*) usage_error "$name must not contain . or .. components: $2" ;;
	esac
	printf '%s\n' "$p"
}
bin_dir=$(check_path --prefix "$bin_dir")
ledger_dir=$(check_path --ledger-dir "$ledger_dir")
conf_dir=$(check_path --conf-dir "$conf_dir")

# The ledger dir is chmod'ed 0700: never let a typo do that to a system dir.
case $ledger_dir in
/ | /bin | /boot | /dev | /etc | /home | /lib | /lib64 | /media | /mnt | /opt | /proc | \
	/root | /run | /sbin | /srv | /sys | /tmp | /usr | /usr/* | /var | /var/lib | /var/tmp | \
	/var/log | /var/cache | /var/spool | /var/lib/cni | /etc/* | "$bin_dir")
	usage_error "refusing to use $ledger_dir as the ledger directory; give a dedicated one such as $DEFAULT_LEDGER_DIR"
	;;
esac

[ "$(id -u)" -eq 0 ] || die "must be run as root (it installs into $bin_dir, creates $ledger_dir owned by root and installs a gc schedule)"

src_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
grep -qs '^name = "cni-ledger"' "$src_dir/Cargo.toml" ||
	die "$src_dir does not look like the cni-ledger source tree (no Cargo.toml for cni-ledger)"

dest=$bin_dir/cni-ledger
gc_cmd="$dest gc --ledger-dir $ledger_dir --conf-dir $conf_dir"

# Temporary files created by this script, removed on any exit.
tmp_files=()
cleanup() { [ ${#tmp_files[@]} -eq 0 ] || rm -f -- "${tmp_files[@]}"; }
trap cleanup EXIT

# ---------------------------------------------------------------- build

if [ -n "$prebuilt" ]; then
	# Built elsewhere (e.g. by this script on a machine with cargo): same checks
	# as a fresh build, then installed the same way.
	case $prebuilt in /*) ;; *) prebuilt=$PWD/$prebuilt ;; esac
	[ -f "$prebuilt" ] && [ -x "$prebuilt" ] || die "--binary $prebuilt is not an executable file"
	built=$prebuilt
	info "installing the prebuilt $built (nothing is built)"
else
	# A plain root shell (or sudo's secure_path) often lacks rustup's cargo.
	if [ -z "${HOME:-}" ]; then
		HOME=$(getent passwd "$(id -u)" | cut -d: -f6)
		export HOME
	fi
	PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
	for d in /root/.cargo/bin "$HOME/.cargo/bin"; do
		case ":$PATH:" in
		*":$d:"*) ;;
		*) [ ! -d "$d" ] || PATH=$d:$PATH ;;
		esac
	done
	export PATH
	command -v cargo >/dev/null 2>&1 ||
		die "cargo not found (searched PATH, \$HOME/.cargo/bin and /root/.cargo/bin); install Rust >= 1.89, e.g. from https://rustup.rs, then re-run $prog"

	# One static binary (docs/DESIGN.md §2), and not position-independent: nothing for the
	# dynamic loader and no relocations to apply on every pod's ADD, which measurably shortens
	# the plugin's exec (docs/EVIDENCE.md, Performance). An explicit --target keeps these flags
	# off build scripts and proc macros.
	host=$(rustc -vV 2>/dev/null | sed -n 's/^host: //p')
	[ -n "$host" ] || die "cannot tell rustc's host target (rustc -vV)"
	info "building: cargo build --release --locked --target $host, statically linked (in $src_dir)"
	(cd "$src_dir" && RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static -C relocation-model=static" \
		cargo build --release --locked --target "$host") ||
		die "cargo build failed (see above); nothing was installed"

	# Honour CARGO_TARGET_DIR / build.target-dir: ask cargo where it built.
	target_dir=$(cd "$src_dir" && cargo metadata --format-version 1 --no-deps --locked 2>/dev/null |
		sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p') || true
	[ -n "$target_dir" ] || target_dir=${CARGO_TARGET_DIR:-$src_dir/target}
	built=$target_dir/$host/release/cni-ledger
	if [ ! -f "$built" ] || [ ! -x "$built" ]; then
		die "build succeeded but $built is missing"
	fi
fi

# Man pages and shell completions, generated from the clap definition by a separate
# binary (the plugin binary does not carry the generators); same target and flags, so
# the dependencies just built are reused. A prebuilt binary comes without them (no cargo
# here to build the generator): the package or a from-source install carries them.
docs_dir=
if [ -z "$prebuilt" ]; then
	info "generating the man pages and shell completions"
	(cd "$src_dir" && RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static -C relocation-model=static" \
		cargo build --release --locked --target "$host" --features gen-docs --bin cni-ledger-gen-docs) ||
		die "building cni-ledger-gen-docs failed (see above); nothing was installed"
	docs_dir=$(mktemp -d)
	trap 'cleanup; rm -rf -- "$docs_dir"' EXIT
	"$target_dir/$host/release/cni-ledger-gen-docs" "$docs_dir" ||
		die "generating the man pages and completions failed; nothing was installed"
fi

# Smoke test before anything is replaced: the plugin face must answer VERSION.
out=$(printf '{"cniVersion":"1.0.0"}' | CNI_COMMAND=VERSION "$built" 2>/dev/null) || true
case $out in
*supportedVersions*) ;;
*) die "$built does not answer CNI VERSION; not installing it (output: ${out:-none})" ;;
esac

# ---------------------------------------------------------------- helpers

# install_file SRC DEST MODE: put SRC's content at DEST atomically (temp file
# in DEST's directory, fsync, rename). Returns 0 if DEST changed, 1 if it
# already had this content (owner and mode are fixed either way).
# It is called as an if-condition, where set -e is off: check every step.
install_file() {
	local src=$1 dst=$2 mode=$3 dir tmp
	dir=$(dirname "$dst")
	[ ! -d "$dst" ] || die "$dst is a directory"
	if [ -f "$dst" ] && [ ! -L "$dst" ] && cmp -s "$src" "$dst"; then
		chown root:root "$dst" && chmod "$mode" "$dst" || die "cannot set owner/mode of $dst"
		return 1
	fi
	tmp=$(mktemp "$dir/.$(basename "$dst").XXXXXX") || die "cannot create a temporary file in $dir"
	tmp_files+=("$tmp")
	cp -- "$src" "$tmp" &&
		chown root:root "$tmp" &&
		chmod "$mode" "$tmp" &&
		sync -- "$tmp" &&
		mv -f -T -- "$tmp" "$dst" || die "cannot install $dst"
	sync -- "$dir" 2>/dev/null || true
	return 0
}

# render TEMPLATE: substitute the install paths (validated above, so they
# contain no sed metacharacters) into a temp file named in $rendered.
rendered=
render() {
	rendered=$(mktemp)
	tmp_files+=("$rendered")
	sed -e "s|@BINARY@|$dest|g" \
		-e "s|@LEDGER_DIR@|$ledger_dir|g" \
		-e "s|@CONF_DIR@|$conf_dir|g" "$1" >"$rendered"
	! grep -q '@[A-Z_]*@' "$rendered" || die "unsubstituted placeholder left in $1"
}

# ---------------------------------------------------------------- binary

install -d -m 0755 "$bin_dir"
if install_file "$built" "$dest" 0755; then
	info "installed $dest"
else
	info "$dest is up to date"
fi

# ---------------------------------------------------------------- CLI, man pages, completions

# The CLI on PATH (the plugin dir is not), for the operator and the completions.
cli_link=$SHARE_PREFIX/sbin/cni-ledger
if [ "$cli_link" != "$dest" ]; then
	install -d -m 0755 "$(dirname "$cli_link")"
	if [ -L "$cli_link" ] || [ ! -e "$cli_link" ]; then
		ln -sfn -- "$dest" "$cli_link"
		info "linked $cli_link -> $dest"
	else
		warn "$cli_link exists and is not a symlink; left alone"
	fi
fi
if [ -z "$docs_dir" ]; then
	info "prebuilt binary: no man pages or completions installed"
else
	changed_docs=0
	install -d -m 0755 "$SHARE_PREFIX/share/man/man1"
	for page in "$docs_dir"/man/*.1; do
		gzip -9n -c "$page" >"$page.gz"
		if install_file "$page.gz" "$SHARE_PREFIX/share/man/man1/$(basename "$page").gz" 0644; then
			changed_docs=1
		fi
	done
	for pair in "cni-ledger:bash-completion/completions" "_cni-ledger:zsh/site-functions" \
		"cni-ledger.fish:fish/vendor_completions.d"; do
		file=${pair%%:*}
		dir=$SHARE_PREFIX/share/${pair#*:}
		install -d -m 0755 "$dir"
		if install_file "$docs_dir/completions/$file" "$dir/$file" 0644; then
			changed_docs=1
		fi
	done
	if [ "$changed_docs" -eq 1 ]; then
		info "installed the man pages (man cni-ledger) and bash/zsh/fish completions under $SHARE_PREFIX/share"
	else
		info "man pages and completions under $SHARE_PREFIX/share are up to date"
	fi
fi

# ---------------------------------------------------------------- ledger

[ ! -L "$ledger_dir" ] || die "$ledger_dir is a symlink; pass the real directory with --ledger-dir"
if [ -e "$ledger_dir" ]; then
	[ -d "$ledger_dir" ] || die "$ledger_dir exists and is not a directory"
	perm=$(stat -c '%a %u %g' "$ledger_dir")
	if [ "$perm" != "700 0 0" ] && [ -n "$(ls -A "$ledger_dir")" ] && [ ! -d "$ledger_dir/records" ]; then
		die "$ledger_dir is not empty and does not look like a cni-ledger ledger (no records/); refusing to chown/chmod it"
	fi
else
	mkdir -p "$(dirname "$ledger_dir")" # 0755 under umask 022
	mkdir -m 0700 "$ledger_dir"
fi
chown root:root "$ledger_dir"
chmod 0700 "$ledger_dir"
info "ledger directory $ledger_dir (0700 root:root)"

case $(stat -f -c %T "$ledger_dir") in
tmpfs | ramfs)
	warn "$ledger_dir is on a RAM filesystem: the ledger will not survive the reboot it exists for; use persistent storage such as $DEFAULT_LEDGER_DIR"
	;;
esac
# gc executes what the ledger says as root: every ancestor must be root's.
p=$ledger_dir
while p=$(dirname "$p"); do
	read -r o m <<<"$(stat -c '%u %a' "$p")"
	if [ "$o" != 0 ] || { [ $((8#$m & 8#022)) -ne 0 ] && [ $((8#$m & 8#1000)) -eq 0 ]; }; then
		warn "$p (an ancestor of the ledger) is not owned by root or is writable by others (mode $m); gc may refuse this ledger"
	fi
	[ "$p" != / ] || break
done

# ---------------------------------------------------------------- gc schedule

scheduled="no schedule installed"
if [ "$want_schedule" -eq 0 ]; then
	info "--no-systemd: no systemd units and no cron file installed; schedule gc yourself, e.g. at boot and every 5 minutes:"
	info "    $gc_cmd"
elif [ -d /run/systemd/system ]; then
	changed=0
	for unit in "$SERVICE" "$TIMER"; do
		render "$src_dir/packaging/systemd/$unit"
		if install_file "$rendered" "$UNIT_DIR/$unit" 0644; then
			info "installed $UNIT_DIR/$unit"
			changed=1
		else
			info "$UNIT_DIR/$unit is up to date"
		fi
	done
	if [ "$changed" -eq 1 ]; then
		systemctl daemon-reload
	fi
	systemctl enable --quiet "$SERVICE"
	systemctl enable --quiet --now "$TIMER"
	if [ "$changed" -eq 1 ]; then
		systemctl restart "$TIMER" # apply a changed schedule now
	fi
	# A cron file from an install made while systemd was not running would
	# schedule gc a second time.
	if [ -f "$CRON_FILE" ] && grep -q 'installed by install.sh' "$CRON_FILE"; then
		rm -f -- "$CRON_FILE"
		info "removed $CRON_FILE (superseded by $TIMER)"
	fi
	scheduled="systemd: $SERVICE at boot, $TIMER active"
	info "timer: $(systemctl is-active "$TIMER"); next run: systemctl list-timers $TIMER"
else
	install -d -m 0755 "$(dirname "$CRON_FILE")"
	render "$src_dir/packaging/cron/cni-ledger"
	if install_file "$rendered" "$CRON_FILE" 0644; then
		info "installed $CRON_FILE (systemd is not running)"
	else
		info "$CRON_FILE is up to date (systemd is not running)"
	fi
	scheduled="cron: $CRON_FILE (every 5 minutes and @reboot)"
	if ! command -v cron >/dev/null 2>&1 && ! command -v crond >/dev/null 2>&1; then
		warn "no cron daemon found: $CRON_FILE will not run until one is installed (apt-get install cron)"
		scheduled="$scheduled, but no cron daemon is installed"
	fi
	if command -v systemctl >/dev/null 2>&1; then
		info "systemd is installed but not running here (container or image build?); re-run $prog on the booted host to switch to the systemd timer"
	fi
fi

# ---------------------------------------------------------------- conflists

shopt -s nullglob
inject_failed=()
if [ ! -d "$conf_dir" ]; then
	info "no CNI configuration directory $conf_dir: nothing to inject"
else
	conflists=("$conf_dir"/*.conflist)
	others=("$conf_dir"/*.conf "$conf_dir"/*.json)
	# The injected entry must point the plugin at the ledger gc scans.
	inject_args=()
	[ "$ledger_dir" = "$DEFAULT_LEDGER_DIR" ] || inject_args+=(--ledger-dir "$ledger_dir")
	[ "$conf_dir" = "$DEFAULT_CONF_DIR" ] || inject_args+=(--conf-dir "$conf_dir")
	if [ ${#conflists[@]} -eq 0 ]; then
		info "no *.conflist in $conf_dir"
	elif [ "$inject" -eq 1 ]; then
		for f in "${conflists[@]}"; do
			"$dest" inject "${inject_args[@]}" "$f" || inject_failed+=("$f")
		done
	else
		info "CNI configurations are not modified without --inject. To list cni-ledger first in each conflist, run:"
		for f in "${conflists[@]}"; do
			cmd=$(printf '%q ' "$dest" inject "${inject_args[@]}" "$f")
			printf '    %s\n' "${cmd% }"
		done
		info "(add --dry-run to preview a change)"
	fi
	if [ ${#others[@]} -gt 0 ]; then
		info "left alone (only *.conflist are handled): ${others[*]}"
	fi
fi

# ---------------------------------------------------------------- adopt

# Attachments made before the ledger was in the chain are known only to libcni's
# cache: give them records once, so gc can clean them up too. Only networks whose
# chain now holds this ledger are taken (a DEL of any other never reaches it), so
# this runs after the conflists are injected. No --cni-path: each record's is where
# its chain's plugins are (the install dir holds only cni-ledger). Never fatal: an
# unusable cache file (exit 1) is reported by adopt itself.
adopt_args=(--ledger-dir "$ledger_dir" --conf-dir "$conf_dir")
adopt_rc=0
"$dest" adopt "${adopt_args[@]}" || adopt_rc=$?
case $adopt_rc in
0) info "adopted libcni's cached attachments of the networks whose chain holds the ledger (cni-ledger list shows them)" ;;
1) warn "cni-ledger adopt reported unusable libcni cache files (see above); they were not adopted" ;;
*) warn "cni-ledger adopt failed (exit $adopt_rc); run it by hand: $(printf '%q ' "$dest" adopt "${adopt_args[@]}")" ;;
esac

info "done: binary $dest, ledger $ledger_dir, $scheduled"
if [ ${#inject_failed[@]} -gt 0 ]; then
	die "cni-ledger inject failed for: ${inject_failed[*]}"
fi
