//! Writes cni-ledger's man pages and shell completions from its clap definition, so
//! they cannot drift from the CLI. A separate binary (feature `gen-docs`) keeps the
//! generators out of the plugin binary. Used by packaging/deb/build.sh and install.sh.
//!
//!     cni-ledger-gen-docs OUTDIR   # OUTDIR/man/*.1, OUTDIR/completions/{bash,zsh,fish}

use std::path::{Path, PathBuf};

/// clap names are `&'static str` (no "string" feature); leaking a few names in a
/// one-shot generator is fine.
fn write_man(cmd: &clap::Command, name: &str, dir: &Path) -> std::io::Result<()> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone().name(name.to_string().leak() as &str)).render(&mut buf)?;
    std::fs::write(dir.join(format!("{name}.1")), buf)
}

fn run(out: &Path) -> std::io::Result<()> {
    use clap_complete::Shell;
    let mut cmd = cni_ledger::cli::command();
    cmd.build();
    let man = out.join("man");
    std::fs::create_dir_all(&man)?;
    write_man(&cmd, "cni-ledger", &man)?;
    // One page per subcommand, as git does: `man cni-ledger-gc`.
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        write_man(sub, &format!("cni-ledger-{}", sub.get_name()), &man)?;
    }
    let comp = out.join("completions");
    std::fs::create_dir_all(&comp)?;
    for (shell, file) in [
        (Shell::Bash, "cni-ledger"),
        (Shell::Zsh, "_cni-ledger"),
        (Shell::Fish, "cni-ledger.fish"),
    ] {
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut cmd, "cni-ledger", &mut buf);
        std::fs::write(comp.join(file), buf)?;
    }
    Ok(())
}

fn main() {
    let Some(out) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: cni-ledger-gen-docs OUTDIR");
        std::process::exit(2);
    };
    if let Err(e) = run(&out) {
        eprintln!("cni-ledger-gen-docs: {}: {e}", out.display());
        std::process::exit(1);
    }
}
