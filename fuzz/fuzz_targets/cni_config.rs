//! The plugin's stdin: `cni::config::parse` must turn any bytes into a NetConf or a
//! CNI error, never panic; what it accepts must satisfy the documented invariants.
#![no_main]

use cni_ledger::cni::{config, env, version};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match config::parse(data) {
        Ok(conf) => {
            // The network name ends up in file names: only the safe alphabet.
            assert!(
                env::is_valid_name(&conf.name),
                "accepted name {:?}",
                conf.name
            );
            let _ = version::is_supported(&conf.cni_version);
            let _ = version::at_least(&conf.cni_version, "0.4.0");
            // The document GC re-reads is the very input, and it is a JSON object.
            assert_eq!(conf.stdin, data);
            let doc: serde_json::Value = serde_json::from_slice(&conf.stdin).unwrap();
            assert!(doc.is_object());
        }
        Err(e) => {
            // Every refusal is a CNI error with a well-known code.
            assert!(
                matches!(e.code, 6 | 7),
                "unexpected code {} for {e:?}",
                e.code
            );
            let out = e.to_json(version::LATEST);
            assert!(out["code"].is_u64());
        }
    }
    // The same bytes as CNI_CONTAINERID / CNI_IFNAME values.
    if let Ok(s) = std::str::from_utf8(data) {
        if env::validate_container_id(s).is_ok() {
            assert!(!s.is_empty() && !s.contains('/') && !s.contains(':') && s != "..");
        }
        if env::validate_ifname(s).is_ok() {
            assert!((1..=15).contains(&s.len()) && !s.contains('/') && s != "." && s != "..");
        }
    }
});
