//! Conflists come from the conf dir at ADD time and from snapshots at replay time:
//! `conflist::parse` and the helpers gc uses to build each plugin's DEL config must
//! handle any document, and no plugin type that is not a bare name is ever resolved.
#![no_main]

use cni_ledger::conflist;
use cni_ledger::gc::replay;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

fuzz_target!(|data: &[u8]| {
    let Some(list) = conflist::parse(data) else {
        return;
    };
    assert!(list["name"].is_string() && list["plugins"].is_array());
    let version = list.get("cniVersion").and_then(Value::as_str).unwrap_or("");
    // Capability args as a runtime would hand them: taken from the document itself.
    let caps: Map<String, Value> = list
        .get("runtimeConfig")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let prev = list.get("prevResult");
    for plugin in conflist::plugins(&list) {
        let ty = conflist::plugin_type(plugin);
        let declared = conflist::declared_capabilities(plugin);
        let conf = replay::plugin_config(plugin, "n", version, &caps, prev);
        assert_eq!(conf["name"], "n");
        // Injected runtimeConfig holds declared capabilities only; with nothing to
        // inject, the entry's own runtimeConfig goes as written, as libcni passes it.
        if let Some(rc) = conf.get("runtimeConfig").and_then(Value::as_object) {
            let as_written = plugin.get("runtimeConfig") == conf.get("runtimeConfig");
            assert!(as_written || rc.keys().all(|k| declared.contains(k)));
        }
        // No directories to search: only the bare-name rule can answer Ok... never.
        let found = replay::find_plugin(ty, &[]);
        assert!(found.is_err());
        if ty.contains('/') || ty == ".." || ty == "." || ty.is_empty() {
            let msg = found.unwrap_err().message;
            assert!(msg.contains("not a bare name"), "{ty:?}: {msg}");
        }
    }
});
