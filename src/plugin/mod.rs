//! The plugin face: selected when `CNI_COMMAND` is set. Reads env and stdin, validates
//! them as libcni's skel does, runs one command, prints CNI JSON on stdout.

mod add;
mod del;
mod gc;
mod status;

use crate::cni::config::{self, NetConf, MAX_STDIN};
use crate::cni::env::{self, CmdArgs, Command};
use crate::cni::error::{self, CniError};
use crate::cni::version;
use serde_json::{json, Value};
use std::io::{Read, Write};

/// The version errors are reported in: the request's, once it is known to be supported.
static ERROR_VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// For a panic caught in main: the version of the request being answered.
pub fn error_version() -> &'static str {
    ERROR_VERSION.get().map_or(version::LATEST, String::as_str)
}

/// Runs the plugin; returns the process exit status.
pub fn main() -> i32 {
    let mut cni_version = version::LATEST.to_string();
    match run(&mut cni_version) {
        Ok(Some(out)) => print_json(&out),
        Ok(None) => 0,
        Err(e) => {
            crate::error!("{e}");
            print_json(&e.to_json(&cni_version));
            1
        }
    }
}

fn print_json(v: &Value) -> i32 {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{v}").and_then(|_| out.flush()) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

fn read_stdin() -> Result<Vec<u8>, CniError> {
    let mut buf = Vec::new();
    std::io::stdin()
        .take(MAX_STDIN as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| CniError::new(error::IO_FAILURE, "error reading from stdin", e.to_string()))?;
    if buf.len() > MAX_STDIN {
        return Err(CniError::new(
            error::DECODING_FAILURE,
            "stdin too large",
            format!("network configuration exceeds {MAX_STDIN} bytes"),
        ));
    }
    Ok(buf)
}

fn run(cni_version: &mut String) -> Result<Option<Value>, CniError> {
    let raw_cmd = std::env::var("CNI_COMMAND").unwrap_or_default();
    let cmd = Command::parse(&raw_cmd).ok_or_else(|| {
        CniError::new(
            error::INVALID_ENV,
            format!("unknown CNI_COMMAND: {raw_cmd}"),
            "",
        )
    })?;
    if cmd == Command::Version {
        return Ok(Some(version_info(&read_stdin().unwrap_or_default())));
    }
    let args = env::read(cmd, |k| std::env::var(k).ok())?;
    let stdin = read_stdin()?;
    let conf = config::parse(&stdin)?;
    if matches!(cmd, Command::Add | Command::Del | Command::Check) {
        env::validate_container_id(&args.container_id)?;
        env::validate_ifname(&args.ifname)?;
    }
    if !version::is_supported(&conf.cni_version) {
        return Err(CniError::new(
            error::INCOMPATIBLE_VERSION,
            "incompatible CNI versions",
            format!(
                "config is \"{}\", plugin supports {}",
                conf.cni_version,
                version::SUPPORTED.join(", ")
            ),
        ));
    }
    *cni_version = conf.cni_version.clone();
    let _ = ERROR_VERSION.set(conf.cni_version.clone());
    let min = match cmd {
        Command::Check => Some("0.4.0"),
        Command::Status | Command::Gc => Some("1.1.0"),
        _ => None,
    };
    if let Some(min) = min {
        if !version::at_least(&conf.cni_version, min) {
            return Err(CniError::new(
                error::INCOMPATIBLE_VERSION,
                format!("config version does not allow {raw_cmd}"),
                "",
            ));
        }
    }
    crate::logging::init(conf.log_file.as_deref());
    dispatch(cmd, &conf, &args)
}

fn dispatch(cmd: Command, conf: &NetConf, args: &CmdArgs) -> Result<Option<Value>, CniError> {
    match cmd {
        Command::Add => add::add(conf, args).map(Some),
        Command::Del => del::del(conf, args).map(|()| None),
        Command::Check => del::check(conf, args).map(|()| None),
        Command::Status => status::status(conf).map(|()| None),
        Command::Gc => gc::gc(conf).map(|()| None),
        Command::Version => unreachable!("handled before config parsing"),
    }
}

fn version_info(stdin: &[u8]) -> Value {
    // Answer in the caller's version when it is one we speak.
    let asked = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_string))
        .filter(|v| version::is_supported(v))
        .unwrap_or_else(|| version::LATEST.to_string());
    json!({"cniVersion": asked, "supportedVersions": version::SUPPORTED})
}

/// A plugin that allocates nothing answers ADD with an empty result of the asked version.
fn empty_result(cni_version: &str) -> Value {
    json!({"cniVersion": cni_version, "dns": {}})
}

fn ledger_error(e: anyhow::Error) -> CniError {
    CniError::from_anyhow(error::IO_FAILURE, &e)
}

fn busy(key: &crate::ledger::Key) -> CniError {
    CniError::new(
        error::TRY_AGAIN_LATER,
        "attachment is being cleaned up by cni-ledger gc; try again later",
        key.to_string(),
    )
}
