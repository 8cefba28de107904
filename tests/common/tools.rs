//! The binaries the tests run: cni-ledger itself, the libcni drivers built from
//! tests/driver, and the tools scripts/test.sh fetches or makes under target/.

use super::*;
use std::ffi::OsStr;

/// The source tree (the tests read its deploy/ and scripts/, and tools under target/).
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A tool scripts/test.sh fetches or makes under the tree (`made_by` says how).
pub fn tool(path: &str, made_by: &str) -> PathBuf {
    let p = repo().join(path);
    assert!(
        p.exists(),
        "{} missing: run scripts/test.sh ({made_by})",
        p.display()
    );
    p
}

/// A program of target/test-venv, the Python venv scripts/test.sh makes.
pub fn venv_bin(name: &str) -> PathBuf {
    tool(
        &format!("target/test-venv/bin/{name}"),
        "it makes target/test-venv with kubernetes-validate and PyYAML",
    )
}

/// The cni-ledger binary under test.
pub fn ledger_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cni-ledger"))
}

fn target_dir() -> PathBuf {
    match option_env!("CARGO_TARGET_TMPDIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target"),
    }
}

/// Builds the libcni driver (tests/driver/) once per test binary and returns
/// its path: Debian's golang-go and golang-github-appc-cni-dev (libcni 1.1).
pub fn driver() -> PathBuf {
    static DRIVER: OnceLock<PathBuf> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let go = std::env::var_os("GO").unwrap_or_else(|| "go".into());
            build_driver(
                "cni-driver",
                Path::new("/usr/share/gocode"),
                &go,
                None,
                None,
            )
        })
        .clone()
}

/// The same driver built on libcni v1.3 (drop-ins, `loadOnlyInlinedPlugins`, and with
/// the tag `cni13`, its `gc` command on `GCNetworkList`): Debian
/// unstable's golang-github-appc-cni-dev and, since bookworm's Go cannot build it,
/// unstable's Go 1.27, both unpacked under target/ by scripts/fetch-unstable.sh (as
/// scripts/test.sh does; a no-op once fetched) and never installed.
pub fn driver13() -> PathBuf {
    static DRIVER: OnceLock<PathBuf> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let cni = root.join("target/libcni-1.3");
            let go = root.join("target/go-1.27");
            for (pkg, dest) in [
                ("golang-github-appc-cni-dev", &cni),
                ("golang-1.27-go", &go),
                ("golang-1.27-src", &go),
            ] {
                run_ok(
                    Command::new("bash")
                        .arg(root.join("scripts/fetch-unstable.sh"))
                        .arg(pkg)
                        .arg(dest),
                );
            }
            let goroot = go.join("usr/lib/go-1.27");
            build_driver(
                "cni-driver-1.3",
                &cni.join("usr/share/gocode"),
                goroot.join("bin/go").as_os_str(),
                Some(&goroot),
                Some("cni13"),
            )
        })
        .clone()
}

/// Builds the package in tests/driver/ in GOPATH mode against the libcni under `gopath`
/// (with the build tags `tags`, which select code needing a newer libcni), to a
/// private temp name then renamed, so test binaries running in parallel never see a
/// half-written executable.
fn build_driver(
    name: &str,
    gopath: &Path,
    go: &OsStr,
    goroot: Option<&Path>,
    tags: Option<&str>,
) -> PathBuf {
    let dir = target_dir();
    fs::create_dir_all(&dir).expect("create target dir");
    let out = dir.join(name);
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let mut cmd = Command::new(go);
    cmd.arg("build");
    if let Some(tags) = tags {
        cmd.arg("-tags").arg(tags);
    }
    // The package, not main.go alone: the other files of the directory hold the
    // per-libcni parts, chosen by the build tags.
    cmd.arg("-o")
        .arg(&tmp)
        .arg("./tests/driver")
        .env("GO111MODULE", "off")
        .env("GOPATH", gopath)
        .env("GOFLAGS", "")
        .env("GOCACHE", dir.join("go-build-cache"))
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if let Some(root) = goroot {
        // Never a newer toolchain fetched from the network.
        cmd.env("GOROOT", root).env("GOTOOLCHAIN", "local");
    }
    let res = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {go:?} (install golang-go): {e}"));
    if !res.status.success() {
        let _ = fs::remove_file(&tmp);
        panic!(
            "building the libcni driver {name} failed (needs golang-go and \
             golang-github-appc-cni-dev):\n{}{}",
            String::from_utf8_lossy(&res.stdout),
            String::from_utf8_lossy(&res.stderr)
        );
    }
    fs::rename(&tmp, &out).expect("rename driver into place");
    out
}
