//! Lays out the code a plugin call runs in one place of the binary (release builds only).
//!
//! An ADD runs a few hundred functions spread over 3.5 MB of code; each 64 KB window it
//! touches costs a page fault, and those faults were the largest part of what ADD costs
//! beyond its exec and its durable write (docs/EVIDENCE.md, "Code laid out for ADD").
//! `link/plugin-order.txt` (from scripts/gen-link-order.sh) names those functions, and
//! lld places them first. Only lld reads that file, so it is passed only where rustc links
//! with its own lld: x86_64 Linux GNU from Rust 1.90, no linker chosen by the builder.
//! Anywhere else the build is the same as without this file, only slower to fault in.

use std::env;
use std::process::Command;

const ORDER: &str = "link/plugin-order.txt";

fn main() {
    println!("cargo:rerun-if-changed={ORDER}");
    println!("cargo:rerun-if-changed=build.rs");
    if env::var("PROFILE").as_deref() != Ok("release") || !rustc_links_with_its_lld() {
        return;
    }
    let dir = env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let file = std::path::Path::new(&dir).join(ORDER);
    if !file.is_file() {
        return;
    }
    println!(
        "cargo:rustc-link-arg-bin=cni-ledger=-Wl,--symbol-ordering-file={}",
        file.display()
    );
    // Names the build does not hold (another toolchain's hashes) are expected; not news.
    println!("cargo:rustc-link-arg-bin=cni-ledger=-Wl,--no-warn-symbol-ordering");
}

fn rustc_links_with_its_lld() -> bool {
    let target = env::var("TARGET").unwrap_or_default();
    // A linker the builder chose (config or RUSTFLAGS) may not be lld.
    let chosen = env::var_os("RUSTC_LINKER").is_some()
        || env::var("CARGO_ENCODED_RUSTFLAGS").is_ok_and(|flags| {
            flags
                .split('\x1f')
                .any(|f| f.contains("linker") || f.contains("link-self-contained"))
        });
    target == "x86_64-unknown-linux-gnu" && !chosen && rustc_minor().is_some_and(|m| m >= 90)
}

/// The minor version of the rustc building this crate (`rustc 1.95.0 (...)` gives 95).
fn rustc_minor() -> Option<u32> {
    let rustc = env::var_os("RUSTC")?;
    let out = Command::new(rustc).arg("--version").output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let version = text.split_whitespace().nth(1)?;
    let mut parts = version.split('.');
    (parts.next()? == "1").then_some(())?;
    parts.next()?.parse().ok()
}
