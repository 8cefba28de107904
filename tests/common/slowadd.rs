//! A chain whose ADD a test can hold in flight: `[cni-ledger, cl-slowadd (bridge +
//! host-local), tail]`. `testdata/plugins/cl-slowadd` touches the started file, then
//! waits for the gate file before it runs bridge.

use super::*;
use serde_json::{json, Value};
use std::fs;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

pub const SLOW: &str = "cl-slowadd";

/// The fixture with bridge held by cl-slowadd and the tail last.
pub fn held_chain_fixture() -> Fixture {
    let mut f = Fixture::with_spec(ChainSpec {
        bridge: false,
        portmap: false,
        ..ChainSpec::full()
    });
    f.install_test_plugin(SLOW);
    let mut slow = f.bridge_entry();
    slow["type"] = json!(SLOW);
    slow["delegate"] = json!("bridge");
    slow["startedFile"] = json!(started_file(&f));
    slow["gateFile"] = json!(gate_file(&f));
    let tail = json!({
        "type": "cni-ledger",
        "role": "tail",
        "ledgerDir": f.ledger_dir,
        "logFile": f.log_file,
        "logLevel": "info",
    });
    f.spec.extra = vec![slow, tail];
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));
    f
}

pub fn started_file(f: &Fixture) -> PathBuf {
    f.tmp.path().join("slow-started")
}

/// While it exists, cl-slowadd lets ADDs through.
pub fn gate_file(f: &Fixture) -> PathBuf {
    f.tmp.path().join("slow-gate")
}

/// Starts the driver's ADD of `cid`/eth0 and returns once cl-slowadd holds it: the head
/// has recorded it, bridge has not run.
pub fn start_held_add(f: &Fixture, cid: &str, ns: &Netns) -> Child {
    let _ = fs::remove_file(started_file(f));
    let child = f
        .driver_cmd("add", cid, "eth0", Some(&ns.path_str()), None)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while !started_file(f).exists() {
        assert!(
            Instant::now() < until,
            "the ADD never reached {SLOW}\nlog:\n{}",
            f.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        f.record_path(cid, "eth0").exists(),
        "the head recorded nothing"
    );
    child
}

/// Lets the held ADD go on and returns its result: it must succeed.
pub fn release(f: &Fixture, add: Child) -> Value {
    fs::write(gate_file(f), b"").unwrap();
    let out = add.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "ADD: {}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
