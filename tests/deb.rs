//! The Debian package (packaging/deb/build.sh, cargo-deb) on a fresh Debian root: a
//! minimal bookworm made with debootstrap (cached under /var/cache/cni-ledger-test/,
//! keyed by its package list) and used through an overlay, so every run starts from
//! the same pristine root. Inside it, with chroot: `apt install ./cni-ledger_*.deb`,
//! `man cni-ledger` renders, bash completion completes `cni-ledger g` to `gc`, the
//! conflists are left byte for byte as they were by install and by `dpkg -r`.
//! Needs root, debootstrap, cargo-deb and (the first time) the Debian mirror.
//!
//!     cargo test --features testing --test deb

// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const SUITE: &str = "bookworm";
const VARIANT: &str = "minbase";
/// What the test needs beyond minbase: `man` and bash-completion's loader.
const INCLUDE: &[&str] = &["bash-completion", "man-db"];
const CACHE: &str = "/var/cache/cni-ledger-test";

fn run_checked(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    assert!(out.status.success(), "{what} failed: {}", describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The pristine Debian root, made once per package list.
fn debian_root() -> PathBuf {
    let root = Path::new(CACHE).join(format!("root-{SUITE}-{VARIANT}-{}", INCLUDE.join("+")));
    if root.join("usr/bin/apt").exists() {
        return root;
    }
    fs::create_dir_all(CACHE).unwrap();
    // Built aside and renamed into place: an interrupted debootstrap is never cached.
    let tmp = Path::new(CACHE).join(format!(".tmp.{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    let mirror = std::env::var("CL_DEBIAN_MIRROR")
        .unwrap_or_else(|_| "http://deb.debian.org/debian".to_string());
    eprintln!(
        "deb: debootstrap {SUITE} into {} (once; about 1–2 min)",
        root.display()
    );
    run_checked(
        Command::new("debootstrap")
            .arg(format!("--variant={VARIANT}"))
            .arg(format!("--include={}", INCLUDE.join(",")))
            .arg(SUITE)
            .arg(tmp.join("root"))
            .arg(&mirror),
        "debootstrap (apt install debootstrap)",
    );
    fs::rename(tmp.join("root"), &root).unwrap();
    let _ = fs::remove_dir_all(&tmp);
    root
}

/// Builds the package in its own target dir (the outer cargo holds the usual one).
/// Unoptimised, without LTO: the package's layout is under test, not the optimiser, and
/// a cold build takes a fraction of the release profile's time. install.sh and a plain
/// build.sh use the full release profile.
fn build_deb() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = PathBuf::from(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    let mut path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = cargo.parent().map(Path::to_path_buf).into_iter().collect();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cargo/bin"));
    }
    dirs.extend(std::env::split_paths(&path));
    path = std::env::join_paths(dirs).unwrap();
    let out = run_checked(
        Command::new(manifest.join("packaging/deb/build.sh"))
            .env("PATH", path)
            // Shared with tests/vm_reboot.rs, settings and all: one build serves both.
            .env("CARGO_TARGET_DIR", manifest.join("target/static-test"))
            .env("CARGO_PROFILE_RELEASE_LTO", "off")
            .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0")
            .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
            .env_remove("RUSTFLAGS"),
        "packaging/deb/build.sh (cargo install cargo-deb --locked)",
    );
    let deb = PathBuf::from(out.trim());
    assert!(deb.is_file(), "build.sh printed {out:?}");
    deb
}

/// What the chroot runs; each check prints a tagged line the test then looks for.
const INSIDE: &str = r#"
set -eu
export DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C
cd /tmp
sums() { sha256sum /etc/cni/net.d/*; }
sums >/tmp/sums.before
apt-get install -y ./cni-ledger.deb >/tmp/apt.log 2>&1 || { cat /tmp/apt.log; exit 1; }
echo "STATUS $(dpkg-query -W -f='${Status}' cni-ledger)"
sums | cmp -s - /tmp/sums.before && echo "CONFLISTS-AFTER-INSTALL unchanged"
echo "LEDGER-DIR $(stat -c '%a %U' /var/lib/cni-ledger)"
printf '{"cniVersion":"1.0.0"}' | CNI_COMMAND=VERSION /usr/lib/cni/cni-ledger | sed 's/^/PLUGIN /'
echo "CLI $(cni-ledger --version)"
man -P cat cni-ledger 2>/dev/null | sed 's/^/MAN /'
man -P cat cni-ledger-gc 2>/dev/null | sed 's/^/MANGC /'
# bash-completion's own loader finds the file by command name, as an interactive shell does.
bash -c '
. /usr/share/bash-completion/bash_completion
_completion_loader cni-ledger
f=$(complete -p cni-ledger | sed "s/.*-F \([^ ]*\) .*/\1/")
COMP_WORDS=(cni-ledger g); COMP_CWORD=1; COMP_LINE="cni-ledger g"; COMP_POINT=${#COMP_LINE}
"$f" cni-ledger g cni-ledger
echo "COMPLETE ${COMPREPLY[*]}"'
dpkg -r cni-ledger >/tmp/dpkg-r.log 2>&1 || { cat /tmp/dpkg-r.log; exit 1; }
sed 's/^/REMOVE /' /tmp/dpkg-r.log
echo "STATUS-AFTER-REMOVE $(dpkg-query -W -f='${Status}' cni-ledger)"
[ -e /usr/lib/cni/cni-ledger ] || echo "BINARY-GONE"
sums | cmp -s - /tmp/sums.before && echo "CONFLISTS-AFTER-REMOVE unchanged"
echo DONE
"#;

#[test]
fn deb_installs_on_a_fresh_debian_root_with_man_page_and_completion() {
    require_root!();
    let root = debian_root();
    let deb = build_deb();
    let tmp = TempDir::new("deb");
    let (upper, work, merged) = (
        tmp.path().join("upper"),
        tmp.path().join("work"),
        tmp.path().join("merged"),
    );
    for d in [&upper, &work, &merged] {
        fs::create_dir_all(d).unwrap();
    }
    // What the package must leave alone: one conflist that lists the ledger and one
    // that does not, written into the overlay's upper layer before the root is used.
    let net_d = upper.join("etc/cni/net.d");
    fs::create_dir_all(&net_d).unwrap();
    let with = r#"{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"cni-ledger"},{"type":"bridge"}]}"#;
    let without = r#"{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"}]}"#;
    fs::write(net_d.join("10-pods.conflist"), with).unwrap();
    fs::write(net_d.join("20-other.conflist"), without).unwrap();
    fs::create_dir_all(upper.join("tmp")).unwrap();
    fs::copy(&deb, upper.join("tmp/cni-ledger.deb")).unwrap();
    fs::write(upper.join("tmp/inside.sh"), INSIDE).unwrap();

    // A private mount namespace: the overlay and /proc vanish with the process.
    let setup = r#"set -e
mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4"
mount -t proc proc "$4/proc"
mount --rbind /dev "$4/dev"
exec chroot "$4" /bin/bash /tmp/inside.sh"#;
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            setup,
            "sh",
        ])
        .args([&root, &upper, &work, &merged])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .expect("run unshare");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && text.contains("\nDONE"),
        "{}",
        describe(&out)
    );
    let has = |line: &str| text.lines().any(|l| l == line);
    let tagged = |tag: &str| -> Vec<&str> {
        text.lines()
            .filter_map(|l| l.strip_prefix(tag)?.strip_prefix(' '))
            .collect()
    };

    assert!(has("STATUS install ok installed"), "{text}");
    assert!(
        has("CONFLISTS-AFTER-INSTALL unchanged"),
        "install changed a conflist:\n{text}"
    );
    assert!(has("LEDGER-DIR 700 root"), "{text}");
    assert!(
        tagged("PLUGIN")
            .iter()
            .any(|l| l.contains("supportedVersions")),
        "the plugin in /usr/lib/cni does not answer VERSION:\n{text}"
    );
    assert!(has("CLI cni-ledger 0.1.0"), "{text}");
    let man = tagged("MAN").join("\n");
    assert!(
        man.contains("NAME") && man.contains("cni-ledger-gc(1)") && man.contains("CNI_COMMAND"),
        "man cni-ledger:\n{man}"
    );
    assert!(tagged("MANGC").join("\n").contains("--grace"), "{text}");
    assert_eq!(
        tagged("COMPLETE"),
        vec!["gc"],
        "completion of `cni-ledger g`:\n{text}"
    );
    // prerm says which conflist still names the plugin, and changes none of them.
    assert!(
        tagged("REMOVE")
            .iter()
            .any(|l| l.contains("10-pods.conflist still lists cni-ledger")),
        "{text}"
    );
    assert!(has("BINARY-GONE"), "{text}");
    assert!(
        has("CONFLISTS-AFTER-REMOVE unchanged"),
        "dpkg -r changed a conflist:\n{text}"
    );
    assert_eq!(
        fs::read_to_string(net_d.join("10-pods.conflist")).unwrap(),
        with
    );
    assert_eq!(
        fs::read_to_string(net_d.join("20-other.conflist")).unwrap(),
        without
    );
}
