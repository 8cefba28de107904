//! CNI error objects (SPEC.md "Error" section) with the well-known codes.

use serde_json::json;

pub const INCOMPATIBLE_VERSION: u32 = 1;
pub const UNKNOWN_CONTAINER: u32 = 3;
pub const INVALID_ENV: u32 = 4;
pub const IO_FAILURE: u32 = 5;
pub const DECODING_FAILURE: u32 = 6;
pub const INVALID_NETWORK_CONFIG: u32 = 7;
pub const TRY_AGAIN_LATER: u32 = 11;
pub const NOT_AVAILABLE: u32 = 50;
pub const INTERNAL: u32 = 999;

/// An error as the runtime sees it: printed as JSON on stdout, exit status 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// For an internal failure: the message is the outermost context, details the
    /// causes under it (each named once, not the message again).
    pub fn from_anyhow(code: u32, err: &anyhow::Error) -> Self {
        let causes: Vec<String> = err.chain().skip(1).map(|c| c.to_string()).collect();
        CniError::new(code, err.to_string(), causes.join(": "))
    }

    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut v = json!({
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
        });
        if !self.details.is_empty() {
            v["details"] = json!(self.details);
        }
        v
    }
}

impl std::fmt::Display for CniError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CNI error {}: {}", self.code, self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anyhow_chain_names_each_context_once() {
        let e = anyhow::anyhow!("Permission denied").context("creating /var/lib/x");
        let c = CniError::from_anyhow(IO_FAILURE, &e);
        assert_eq!(c.msg, "creating /var/lib/x");
        assert_eq!(c.details, "Permission denied");
        assert_eq!(
            c.to_string(),
            "CNI error 5: creating /var/lib/x (Permission denied)"
        );
        let bare = CniError::from_anyhow(IO_FAILURE, &anyhow::anyhow!("disk full"));
        assert_eq!(bare.to_string(), "CNI error 5: disk full");
    }
}
