//! CNI specification versions this plugin speaks, and the version a runtime's libcni
//! runs a conflist's chain at (what decides whether the ledger may go into it).

use serde_json::Value;

pub const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
pub const LATEST: &str = "1.1.0";

pub fn is_supported(v: &str) -> bool {
    SUPPORTED.contains(&v)
}

/// Parses "major.minor.patch"; anything else is None.
pub fn parse(v: &str) -> Option<(u32, u32, u32)> {
    let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
    let t = (it.next()??, it.next()??, it.next()??);
    if it.next().is_some() {
        return None;
    }
    Some(t)
}

/// `v >= min`; an unparsable version is treated as older.
pub fn at_least(v: &str, min: &str) -> bool {
    match (parse(v), parse(min)) {
        (Some(a), Some(b)) => a >= b,
        _ => false,
    }
}

/// What an absent or empty `cniVersion` means to libcni and skel (`ParseVersion`, the
/// `ConfigDecoder`): the first spec version.
pub const UNSET_MEANS: &str = "0.1.0";

/// The version a plugin was handed, as skel reads it: "" (libcni passes the list's
/// version through even when the conflist has none) is `UNSET_MEANS`.
pub fn effective(v: &str) -> &str {
    if v.is_empty() {
        UNSET_MEANS
    } else {
        v
    }
}

/// The details of the "incompatible CNI versions" error for a config at `v`, in skel's
/// words, saying so when the conflist named no version at all.
pub fn incompatible_details(v: &str) -> String {
    let unset = if v.is_empty() {
        " (the conflist has no cniVersion)"
    } else {
        ""
    };
    format!(
        "config is \"{}\"{unset}, plugin supports {}",
        effective(v),
        SUPPORTED.join(", ")
    )
}

/// libcni's `ParseVersion`: "" is 0.1.0; at most three dot-separated integers (Go's
/// `Atoi`: an optional sign, then digits), a missing part is 0.
fn parse_libcni(v: &str) -> Option<(i64, i64, i64)> {
    if v.is_empty() {
        return Some((0, 1, 0));
    }
    let parts: Vec<&str> = v.split('.').collect();
    if parts.len() >= 4 {
        return None;
    }
    let num = |i: usize| -> Option<i64> {
        parts.get(i).map_or(Some(0), |p| {
            let digits = p.strip_prefix(['+', '-']).unwrap_or(p);
            (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                .then(|| p.parse().ok())
                .flatten()
        })
    };
    Some((num(0)?, num(1)?, num(2)?))
}

/// The version libcni v1.2 and later implement: `cniVersions` entries above it are skipped.
const LIBCNI_CURRENT: (i64, i64, i64) = (1, 1, 0);

/// The `cniVersion` a runtime's libcni hands every plugin of a conflist's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListVersion {
    /// libcni v1.1 (and before): the list's `cniVersion`, "" when it has none.
    pub v1_1: String,
    /// libcni v1.2 and later: the highest of `cniVersions` and `cniVersion` not above
    /// the spec version it implements (1.1.0); `cniVersion` when there is none.
    pub v1_3: String,
}

/// Why a conflist cannot take the ledger for its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unserved {
    /// libcni cannot load the list at all (a `cniVersion` that is not a string, a bad
    /// `cniVersions`): in libcni's words.
    Unloadable(String),
    /// The chain runs at a version the plugin does not serve.
    Version(ListVersion),
}

impl std::fmt::Display for Unserved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let served = SUPPORTED.join(" ");
        match self {
            Unserved::Unloadable(why) => write!(f, "libcni cannot load it ({why})"),
            Unserved::Version(v) if v.v1_1 == v.v1_3 => {
                if v.v1_1.is_empty() {
                    write!(f, "no cniVersion (libcni reads it as {UNSET_MEANS})")?;
                } else {
                    write!(f, "cniVersion \"{}\"", v.v1_1)?;
                }
                write!(f, " is not a version the ledger serves ({served})")
            }
            Unserved::Version(v) => write!(
                f,
                "libcni v1.1 runs it at cniVersion \"{}\" and v1.2+ (cniVersions) at \"{}\": \
                 not both versions the ledger serves ({served})",
                effective(&v.v1_1),
                effective(&v.v1_3)
            ),
        }
    }
}

impl std::error::Error for Unserved {}

impl Unserved {
    /// The version shown for it (the metric's and `/readyz`'s short form).
    pub fn shown(&self) -> String {
        match self {
            Unserved::Unloadable(_) => "unloadable".into(),
            Unserved::Version(v) if v.v1_1 == v.v1_3 && v.v1_1.is_empty() => "none".into(),
            Unserved::Version(v) if v.v1_1 == v.v1_3 => v.v1_1.clone(),
            Unserved::Version(v) => format!("{}/{}", effective(&v.v1_1), effective(&v.v1_3)),
        }
    }
}

/// The version each libcni runs the conflist (or single-plugin config) `doc` at, read
/// as `NetworkConfFromBytes` reads it; Err when libcni refuses to load it.
pub fn of_list(doc: &Value) -> Result<ListVersion, String> {
    let v1_1 = match doc.get("cniVersion") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(format!(
                "error parsing configuration list: invalid cniVersion type {}",
                json_type(other)
            ))
        }
    };
    let Some(raw) = doc.get("cniVersions") else {
        return Ok(ListVersion {
            v1_3: v1_1.clone(),
            v1_1,
        });
    };
    let Some(raw) = raw.as_array() else {
        return Err("error parsing configuration list: invalid type for cniVersions".into());
    };
    let mut vs: Vec<((i64, i64, i64), &str)> = Vec::new();
    for (i, rv) in raw.iter().enumerate() {
        let Some(v) = rv.as_str() else {
            return Err(format!(
                "error parsing configuration list: invalid type for cniVersions index {i}: {}",
                json_type(rv)
            ));
        };
        let p = parse_libcni(v).ok_or_else(|| {
            format!("error parsing configuration list: invalid cniVersions entry {v} at index {i}")
        })?;
        if p <= LIBCNI_CURRENT {
            vs.push((p, v));
        }
    }
    if !v1_1.is_empty() {
        let p = parse_libcni(&v1_1).ok_or_else(|| {
            format!("error parsing configuration list: invalid cniVersion {v1_1}")
        })?;
        if p <= LIBCNI_CURRENT {
            vs.push((p, &v1_1));
        }
    }
    // libcni sorts by parsed version and takes the last; among equal ones ("1.0" and
    // "1.0.0") its sort keeps no promised order: the last as listed here stands in.
    let v1_3 = vs
        .iter()
        .max_by(|a, b| a.0.cmp(&b.0))
        .map_or_else(|| v1_1.clone(), |(_, v)| v.to_string());
    Ok(ListVersion { v1_1, v1_3 })
}

/// Whether every libcni runs `doc`'s chain at a version the plugin serves; the ledger
/// goes into no other (an ADD at any other version fails in the ledger, first in the
/// chain, and with it the whole chain).
pub fn serves_list(doc: &Value) -> Result<ListVersion, Unserved> {
    let v = of_list(doc).map_err(Unserved::Unloadable)?;
    if is_supported(&v.v1_1) && is_supported(&v.v1_3) {
        Ok(v)
    } else {
        Err(Unserved::Version(v))
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_versions_numerically() {
        assert!(at_least("1.0.0", "0.4.0"));
        assert!(at_least("0.4.0", "0.4.0"));
        assert!(!at_least("0.3.1", "0.4.0"));
        assert!(at_least("0.10.0", "0.4.0"));
        assert!(!at_least("garbage", "0.4.0"));
        assert!(parse("1.0").is_none());
        assert!(parse("1.0.0.0").is_none());
    }

    #[test]
    fn supports_exactly_the_five_versions() {
        for v in SUPPORTED {
            assert!(is_supported(v));
        }
        assert!(!is_supported("0.2.0"));
        assert!(!is_supported("1.2.0"));
    }

    #[test]
    fn reads_a_conflists_version_as_libcni_does() {
        use serde_json::json;
        let v = |doc: Value| of_list(&doc);
        let both = |s: &str| ListVersion {
            v1_1: s.into(),
            v1_3: s.into(),
        };
        assert_eq!(v(json!({"name": "n"})), Ok(both("")));
        assert_eq!(v(json!({"cniVersion": "0.3.1"})), Ok(both("0.3.1")));
        assert!(v(json!({"cniVersion": 1})).unwrap_err().contains("float64"));
        assert!(v(json!({"cniVersion": null}))
            .unwrap_err()
            .contains("<nil>"));
        // v1.2+: the highest not above 1.1.0, cniVersion included; v1.1 ignores the list.
        assert_eq!(
            v(json!({"cniVersion": "0.2.0", "cniVersions": ["1.0.0", "0.4.0", "9.0.0"]})),
            Ok(ListVersion {
                v1_1: "0.2.0".into(),
                v1_3: "1.0.0".into()
            })
        );
        assert_eq!(
            v(json!({"cniVersions": ["1.0.0"]})),
            Ok(ListVersion {
                v1_1: "".into(),
                v1_3: "1.0.0".into()
            })
        );
        assert_eq!(
            v(json!({"cniVersion": "1.2.0", "cniVersions": []})),
            Ok(both("1.2.0"))
        );
        assert!(v(json!({"cniVersions": ["x"]})).is_err());
        assert!(v(json!({"cniVersions": "1.0.0"})).is_err());
        assert!(v(json!({"cniVersion": "1.0.0.0", "cniVersions": []})).is_err());
        assert_eq!(parse_libcni("1"), Some((1, 0, 0)));
        assert_eq!(parse_libcni("+1.0"), Some((1, 0, 0)));
        assert_eq!(parse_libcni("1."), None);
    }

    #[test]
    fn serves_only_lists_every_libcni_runs_at_a_served_version() {
        use serde_json::json;
        assert!(serves_list(&json!({"cniVersion": "0.3.1"})).is_ok());
        for (doc, shown, says) in [
            (
                json!({}),
                "none",
                "no cniVersion (libcni reads it as 0.1.0)",
            ),
            (json!({"cniVersion": ""}), "none", "no cniVersion"),
            (
                json!({"cniVersion": "0.1.0"}),
                "0.1.0",
                "cniVersion \"0.1.0\"",
            ),
            (
                json!({"cniVersion": "0.2.0"}),
                "0.2.0",
                "cniVersion \"0.2.0\"",
            ),
            (
                json!({"cniVersion": "0.2.0", "cniVersions": ["1.0.0"]}),
                "0.2.0/1.0.0",
                "v1.1 runs it at cniVersion \"0.2.0\"",
            ),
            (json!({"cniVersion": 3}), "unloadable", "cannot load"),
        ] {
            let e = serves_list(&doc).unwrap_err();
            assert_eq!(e.shown(), shown, "{doc}");
            assert!(e.to_string().contains(says), "{doc}: {e}");
        }
        assert_eq!(
            incompatible_details(""),
            "config is \"0.1.0\" (the conflist has no cniVersion), plugin supports \
             0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"
        );
    }
}
