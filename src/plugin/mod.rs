//! The plugin face: selected when `CNI_COMMAND` is set. Reads env and stdin, validates
//! them as libcni's skel does, runs one command, prints CNI JSON on stdout.

mod add;
mod conf_memo;
mod del;
mod gc_verb;
mod status;
mod tail;

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

/// Runs the plugin on the process's environment, stdin and stdout; returns the exit
/// status.
pub fn main() -> i32 {
    let getenv = |k: &str| std::env::var(k).ok();
    run_with(
        &getenv,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
    )
}

/// The dispatcher, with its inputs passed in (as skel's `PluginMainFuncs` dispatcher
/// takes `Getenv`, `Stdin` and `Stdout`), so the order of its checks is testable
/// in-process. Every error is answered as one CNI error object on `stdout`.
pub fn run_with(
    getenv: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
) -> i32 {
    let mut cni_version = version::LATEST.to_string();
    match run(getenv, stdin, &mut cni_version) {
        Ok(Some(out)) => print_json(stdout, &out),
        Ok(None) => 0,
        Err(e) => {
            crate::error!("{e}");
            print_json(stdout, &e.to_json(&cni_version));
            1
        }
    }
}

fn print_json(out: &mut dyn Write, v: &Value) -> i32 {
    match writeln!(out, "{v}").and_then(|_| out.flush()) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

fn read_stdin(stdin: &mut dyn Read) -> Result<Vec<u8>, CniError> {
    let mut buf = Vec::new();
    stdin
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

/// The checks, in skel's order: the command (VERSION answers at once), the variables
/// the command requires, the configuration, the names that become file names, the
/// configuration's version, the version the command needs.
fn run(
    getenv: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    cni_version: &mut String,
) -> Result<Option<Value>, CniError> {
    let raw_cmd = getenv("CNI_COMMAND").unwrap_or_default();
    let cmd = Command::parse(&raw_cmd).ok_or_else(|| {
        CniError::new(
            error::INVALID_ENV,
            format!("unknown CNI_COMMAND: {raw_cmd}"),
            "",
        )
    })?;
    if cmd == Command::Version {
        return Ok(Some(version_info(&read_stdin(stdin).unwrap_or_default())));
    }
    let args = env::read(cmd, getenv)?;
    let stdin = read_stdin(stdin)?;
    let conf = config::parse(&stdin)?;
    if matches!(cmd, Command::Add | Command::Del | Command::Check) {
        env::validate_container_id(&args.container_id)?;
        env::validate_ifname(&args.ifname)?;
    }
    if !version::is_supported(&conf.cni_version) {
        return Err(CniError::new(
            error::INCOMPATIBLE_VERSION,
            "incompatible CNI versions",
            version::incompatible_details(&conf.cni_version),
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
    if cmd == Command::Add {
        config::check_paths_for_add(&conf)?;
    }
    crate::logging::set_level(conf.log_level);
    // A relative logFile (refused at ADD) would be a file in the runtime's working
    // directory: other commands log to stderr instead.
    crate::logging::init(conf.log_file.as_deref().filter(|p| p.is_absolute()));
    crate::debug!(
        "{raw_cmd} {}/{}/{} netns {:?}",
        conf.name,
        args.container_id,
        args.ifname,
        args.netns
    );
    dispatch(cmd, &conf, &args)
}

fn dispatch(cmd: Command, conf: &NetConf, args: &CmdArgs) -> Result<Option<Value>, CniError> {
    if conf.role == config::Role::Tail {
        return tail::dispatch(cmd, conf, args);
    }
    match cmd {
        Command::Add => add::add(conf, args).map(Some),
        Command::Del => del::del(conf, args).map(|()| None),
        Command::Check => del::check(conf, args).map(|()| None),
        Command::Status => status::status(conf).map(|()| None),
        Command::Gc => gc_verb::gc(conf).map(|()| None),
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

#[cfg(test)]
mod tests {
    //! The dispatcher's order of checks, in-process: each case breaks two things and
    //! asserts that the earlier check answers. None of them reaches the ledger.
    use super::*;
    use std::collections::HashMap;

    const ADD_ENV: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
    ];

    /// Runs the dispatcher; returns the exit status and the one JSON line on stdout.
    fn call(env: &[(&str, &str)], stdin: &[u8]) -> (i32, Value) {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let getenv = |k: &str| env.get(k).cloned();
        let mut out = Vec::new();
        let status = run_with(&getenv, &mut &stdin[..], &mut out);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 1, "one JSON line on stdout: {text:?}");
        (status, serde_json::from_str(&text).unwrap())
    }

    fn with(env: &[(&str, &str)], key: &str, val: &str) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = env
            .iter()
            .filter(|(k, _)| *k != key)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if !val.is_empty() {
            v.push((key.to_string(), val.to_string()));
        }
        v
    }

    fn refs(v: &[(String, String)]) -> Vec<(&str, &str)> {
        v.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    fn code(env: &[(String, String)], stdin: &[u8]) -> u64 {
        let (status, v) = call(&refs(env), stdin);
        assert_eq!(status, 1, "{v}");
        v["code"]
            .as_u64()
            .unwrap_or_else(|| panic!("no code in {v}"))
    }

    fn conf(version: &str, name: &str) -> Vec<u8> {
        json!({"cniVersion": version, "name": name, "type": "cni-ledger"})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn version_needs_nothing_else_and_answers_in_the_asked_version() {
        let (status, v) = call(&[("CNI_COMMAND", "VERSION")], b"not json");
        assert_eq!(status, 0);
        assert_eq!(v["cniVersion"], json!(version::LATEST));
        assert_eq!(v["supportedVersions"], json!(version::SUPPORTED));
        let (_, v) = call(&[("CNI_COMMAND", "VERSION")], br#"{"cniVersion":"0.4.0"}"#);
        assert_eq!(v["cniVersion"], json!("0.4.0"));
        let (_, v) = call(&[("CNI_COMMAND", "VERSION")], br#"{"cniVersion":"0.2.0"}"#);
        assert_eq!(v["cniVersion"], json!(version::LATEST), "unsupported: ours");
    }

    #[test]
    fn the_command_is_checked_before_env_and_config() {
        for cmd in ["", "add", "NOPE"] {
            let env = with(&[], "CNI_COMMAND", cmd);
            assert_eq!(
                code(&env, b"{nope"),
                u64::from(error::INVALID_ENV),
                "{cmd:?}"
            );
        }
    }

    #[test]
    fn required_env_is_checked_before_the_config() {
        let no_id = with(ADD_ENV, "CNI_CONTAINERID", "");
        assert_eq!(code(&no_id, b"{nope"), u64::from(error::UNKNOWN_CONTAINER));
        let no_netns = with(ADD_ENV, "CNI_NETNS", "");
        let (_, v) = call(&refs(&no_netns), b"{nope");
        assert_eq!(v["code"], json!(error::INVALID_ENV), "{v}");
        assert!(v["msg"].as_str().unwrap().contains("CNI_NETNS"), "{v}");
        // DEL needs no namespace: its bad config is what is reported.
        let del = with(&refs(&no_netns), "CNI_COMMAND", "DEL");
        assert_eq!(code(&del, b"{nope"), u64::from(error::DECODING_FAILURE));
    }

    #[test]
    fn the_config_is_checked_before_names_and_versions() {
        let bad_id = with(ADD_ENV, "CNI_CONTAINERID", "../x");
        assert_eq!(code(&bad_id, b"{nope"), u64::from(error::DECODING_FAILURE));
        assert_eq!(
            code(&bad_id, &conf("0.2.0", "bad/name")),
            u64::from(error::INVALID_NETWORK_CONFIG)
        );
        let too_big = vec![b' '; MAX_STDIN + 1];
        assert_eq!(
            code(&with(ADD_ENV, "X", ""), &too_big),
            u64::from(error::DECODING_FAILURE)
        );
    }

    #[test]
    fn names_are_checked_before_the_config_version() {
        let bad_id = with(ADD_ENV, "CNI_CONTAINERID", "../x");
        assert_eq!(
            code(&bad_id, &conf("0.2.0", "n")),
            u64::from(error::INVALID_ENV)
        );
        let bad_if = with(ADD_ENV, "CNI_IFNAME", "a/b");
        assert_eq!(
            code(&bad_if, &conf("0.2.0", "n")),
            u64::from(error::INVALID_ENV)
        );
    }

    #[test]
    fn versions_are_checked_last_and_errors_speak_the_request_version() {
        let env = with(ADD_ENV, "X", "");
        let (_, v) = call(&refs(&env), &conf("0.2.0", "n"));
        assert_eq!(v["code"], json!(error::INCOMPATIBLE_VERSION), "{v}");
        assert_eq!(v["cniVersion"], json!(version::LATEST), "{v}");
        // Supported, but too old for the command: answered in the request's version.
        let check = with(ADD_ENV, "CNI_COMMAND", "CHECK");
        let (_, v) = call(&refs(&check), &conf("0.3.1", "n"));
        assert_eq!(v["code"], json!(error::INCOMPATIBLE_VERSION), "{v}");
        assert_eq!(v["cniVersion"], json!("0.3.1"), "{v}");
        for cmd in ["STATUS", "GC"] {
            let env = vec![("CNI_COMMAND".to_string(), cmd.to_string())];
            let (_, v) = call(&refs(&env), &conf("1.0.0", "n"));
            assert_eq!(v["code"], json!(error::INCOMPATIBLE_VERSION), "{cmd}: {v}");
        }
    }
}
