//! The plugin's environment: which variables each command needs (as libcni's skel
//! requires them) and the validation of names that end up in file names and commands.

use super::error::{self, CniError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

impl Command {
    pub fn parse(s: &str) -> Option<Command> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            _ => return None,
        })
    }
}

/// Which commands require a variable (skel's table; STATUS and GC need none of these).
const REQUIRED: &[(&str, &[Command])] = &[
    (
        "CNI_CONTAINERID",
        &[Command::Add, Command::Del, Command::Check],
    ),
    ("CNI_NETNS", &[Command::Add, Command::Check]),
    ("CNI_IFNAME", &[Command::Add, Command::Del, Command::Check]),
    ("CNI_PATH", &[Command::Add, Command::Del, Command::Check]),
];

#[derive(Debug, Clone, Default)]
pub struct CmdArgs {
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    pub path: String,
}

/// Reads `CNI_*` through `get`, reporting every missing required variable at once.
pub fn read(cmd: Command, get: impl Fn(&str) -> Option<String>) -> Result<CmdArgs, CniError> {
    let val = |name: &str| get(name).unwrap_or_default();
    let missing: Vec<&str> = REQUIRED
        .iter()
        .filter(|(name, cmds)| cmds.contains(&cmd) && val(name).is_empty())
        .map(|(name, _)| *name)
        .collect();
    if missing.contains(&"CNI_CONTAINERID") {
        // skel validates the ID before reporting other variables: a missing ID is code 3.
        return Err(CniError::new(
            error::UNKNOWN_CONTAINER,
            "missing containerID",
            "",
        ));
    }
    if !missing.is_empty() {
        return Err(CniError::new(
            error::INVALID_ENV,
            format!("required env variables [{}] missing", missing.join(",")),
            "",
        ));
    }
    Ok(CmdArgs {
        container_id: val("CNI_CONTAINERID"),
        netns: val("CNI_NETNS"),
        ifname: val("CNI_IFNAME"),
        args: val("CNI_ARGS"),
        path: val("CNI_PATH"),
    })
}

/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`, the rule for container IDs and network names.
pub fn is_valid_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    match bytes.next() {
        Some(b) if b.is_ascii_alphanumeric() => {}
        _ => return false,
    }
    bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    if id.is_empty() {
        return Err(CniError::new(
            error::UNKNOWN_CONTAINER,
            "missing containerID",
            "",
        ));
    }
    if !is_valid_name(id) {
        return Err(CniError::new(
            error::INVALID_ENV,
            "invalid characters in containerID",
            id,
        ));
    }
    Ok(())
}

pub fn validate_network_name(name: &str) -> Result<(), CniError> {
    if name.is_empty() {
        return Err(CniError::new(
            error::INVALID_NETWORK_CONFIG,
            "missing network name",
            "",
        ));
    }
    if !is_valid_name(name) {
        return Err(CniError::new(
            error::INVALID_NETWORK_CONFIG,
            "invalid characters found in network name",
            name,
        ));
    }
    Ok(())
}

/// The kernel's rules for interface names (1–15 bytes, not `.`/`..`, no `/ :` or space).
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    let bad = |msg: &str| Err(CniError::new(error::INVALID_ENV, msg, name));
    if name.is_empty() {
        return bad("interface name is empty");
    }
    if name.len() > 15 {
        return bad("interface name is too long");
    }
    if name == "." || name == ".." {
        return bad("interface name is . or ..");
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return bad("interface name contains / or : or whitespace characters");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn names_follow_the_cni_pattern() {
        assert!(is_valid_name("a"));
        assert!(is_valid_name("net-1_b.c"));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("-a"));
        assert!(!is_valid_name(".a"));
        assert!(!is_valid_name("../../etc"));
        assert!(!is_valid_name("a b"));
        assert!(!is_valid_name("a:b"));
    }

    #[test]
    fn ifname_rules() {
        assert!(validate_ifname("eth0").is_ok());
        assert!(validate_ifname("123456789012345").is_ok());
        for bad in [
            "",
            "1234567890123456",
            ".",
            "..",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
        ] {
            assert_eq!(
                validate_ifname(bad).unwrap_err().code,
                error::INVALID_ENV,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn missing_env_is_reported_per_command() {
        let e = read(Command::Add, env(&[("CNI_IFNAME", "eth0")])).unwrap_err();
        assert_eq!(e.code, error::UNKNOWN_CONTAINER);
        let e = read(
            Command::Add,
            env(&[
                ("CNI_CONTAINERID", "c"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/x"),
            ]),
        )
        .unwrap_err();
        assert_eq!(e.code, error::INVALID_ENV);
        assert!(e.msg.contains("CNI_NETNS"));
        // DEL does not need a namespace.
        read(
            Command::Del,
            env(&[
                ("CNI_CONTAINERID", "c"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/x"),
            ]),
        )
        .unwrap();
        read(Command::Status, env(&[])).unwrap();
    }
}
