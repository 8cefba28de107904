//! Which conflist the runtime uses, and the chain it loads from it (issue 37): the agent
//! keeps the ledger first in the file each runtime's rule picks, not only the lexically
//! first one, and follows the drop-in directory of a network as libcni v1.3 loads it.
//!
//! - a lexically first conflist whose plugin binary is missing from the bin dirs
//!   (containerd loads it; CRI-O and Podman skip it and load the next): both files get
//!   the ledger, `/readyz` names who loads which, `cni_ledger_conflist_chosen` says it,
//!   and an ADD through the file the skipping runtimes load is recorded;
//! - a lexically first `.conflist` with no `plugins` key, its chain all drop-ins (libcni
//!   v1.3 loads it): the file stays as it is, the head goes in as a drop-in that sorts
//!   first, and an ADD through libcni v1.3 is recorded;
//! - a drop-in that brought portmap deleted: the head stops declaring `portMappings`.
//!
//! Each runs the real agent over a temp conf dir and bin dir, and libcni's driver.
//! Needs root, curl, promtool, Go, libcni v1.3 under target/ (`driver13`).
//!
//!     cargo test --features testing --test agent_choice
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_common::*;
use common::*;
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(10);

/// The runtime's bin dir: the agent's binary and Debian's plugins the chains use.
fn runtime_bin(f: &Fixture) -> PathBuf {
    let dir = preinstalled_bin(f);
    for p in ["bridge", "host-local", "portmap"] {
        std::os::unix::fs::symlink(Path::new(CNI_PLUGIN_DIR).join(p), dir.join(p)).unwrap();
    }
    dir
}

fn start(f: &Fixture, bin: &Path) -> Agent {
    let args = dir_args(bin, &f.conf_dir, &f.ledger_dir, &f.cache_dir);
    Agent::start(&ledger_bin(), &args, &f.tmp.path().join("agent.log"), None)
}

/// The fixture's conflist without the ledger, with the plugins given.
fn plain(f: &Fixture, plugins: Vec<Value>) -> Value {
    json!({"cniVersion": "1.0.0", "name": f.network, "plugins": plugins})
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&fs::read(p).unwrap()).unwrap()
}

/// The value of the sample of `name` whose labels include every `labels` pair.
fn sample_with(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
}

/// ADD then DEL through libcni; the ADD must leave a record of `network`.
fn add_is_recorded(f: &mut Fixture, network: &str, cid: &str, agent: &Agent) {
    let keep = std::mem::replace(&mut f.network, network.to_string());
    let ns = Netns::new();
    f.add(cid, "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD on {network}: {e}\n{}", agent.log_text()));
    assert!(
        f.record_files()
            .contains(&format!("{network}:{cid}:eth0.json")),
        "the ADD through {network} was not recorded: {:?}\n{}",
        f.record_files(),
        agent.log_text()
    );
    f.del(cid, "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL on {network}: {e}"));
    f.network = keep;
}

#[test]
fn a_first_conflist_runtimes_skip_for_a_missing_binary_leaves_the_next_one_covered() {
    require_root!();
    let mut f = Fixture::new();
    let bin = runtime_bin(&f);
    let used = f.conf_file.clone();
    write_in_place(&used, &plain(&f, vec![f.bridge_entry()]));
    // Lexically first, loads, and names a plugin no bin dir holds.
    let skipped = f.conf_dir.join("05-other.conflist");
    write_in_place(
        &skipped,
        &json!({"cniVersion": "1.0.0", "name": "clother",
                "plugins": [f.bridge_entry(), {"type": "cl-not-installed"}]}),
    );
    let agent = start(&f, &bin);
    wait_for(LIMIT, || ledger_first(&used) && ledger_first(&skipped)).unwrap_or_else(|| {
        panic!(
            "not both injected: {:?} {:?}\n{}",
            types_in(&skipped),
            types_in(&used),
            agent.log_text()
        )
    });

    let (code, body) = agent.get("/readyz");
    assert_eq!(code, 200, "{body}");
    let line = body
        .lines()
        .find(|l| l.starts_with("WARN runtimes load different conflists"))
        .unwrap_or_else(|| panic!("/readyz does not say the runtimes differ:\n{body}"));
    let (s, u) = (skipped.display().to_string(), used.display().to_string());
    assert!(
        line.contains(&format!(
            "{s} by containerd/libcni-1.1, containerd/libcni-1.3"
        )) && line.contains(&format!("{u} by cri-o/libcni-1.1, cri-o/libcni-1.3")),
        "{line}"
    );
    let m = agent.metrics();
    promtool_check(&m);
    for (file, runtime) in [(&s, "containerd"), (&u, "cri-o"), (&u, "podman")] {
        let labels = [
            ("file", file.as_str()),
            ("runtime", runtime),
            ("libcni", "1.3"),
        ];
        assert_eq!(
            sample_with(&m, "cni_ledger_conflist_chosen", &labels),
            Some(1.0),
            "{labels:?}\n{m}"
        );
    }
    assert_eq!(
        sample_with(
            &m,
            "cni_ledger_conflist_choice_unknown",
            &[("runtime", "cri-o"), ("libcni", "1.3")]
        ),
        Some(0.0),
        "{m}"
    );
    let net = f.network.clone();
    add_is_recorded(&mut f, &net, "c-skip", &agent);
}

#[test]
fn a_first_conflist_of_dropins_alone_gets_the_head_as_a_dropin_and_its_adds_are_recorded() {
    require_root!();
    let mut f = Fixture::new();
    f.driver = driver13();
    let bin = runtime_bin(&f);
    let next = f.conf_file.clone();
    write_in_place(&next, &plain(&f, vec![f.bridge_entry()]));
    // Lexically first, no `plugins` key: libcni v1.3 loads its chain from cldrop/.
    let first = f.conf_dir.join("05-drop.conflist");
    let doc = json!({"cniVersion": "1.0.0", "name": "cldrop"});
    write_in_place(&first, &doc);
    let before = fs::read(&first).unwrap();
    let dir = f.conf_dir.join("cldrop");
    fs::create_dir_all(&dir).unwrap();
    write_in_place(&dir.join("10-bridge.conf"), &f.bridge_entry());
    write_in_place(&dir.join("20-portmap.conf"), &Fixture::portmap_entry());

    let agent = start(&f, &bin);
    let head = dir.join("!cni-ledger-head.conf");
    let tail = dir.join("~cni-ledger-tail.conf");
    wait_for(LIMIT, || {
        head.exists() && tail.exists() && ledger_first(&next)
    })
    .unwrap_or_else(|| {
        panic!(
            "no head and tail drop-ins in {}, or {} not injected:\n{}",
            dir.display(),
            next.display(),
            agent.log_text()
        )
    });
    assert_eq!(
        fs::read(&first).unwrap(),
        before,
        "the conflist was written"
    );
    let h = read_json(&head);
    assert_eq!(h["type"], json!("cni-ledger"), "{h:#}");
    assert_eq!(h["capabilities"], json!({"portMappings": true}), "{h:#}");
    assert_eq!(read_json(&tail)["role"], json!("tail"));
    let keep = std::mem::replace(&mut f.network, "cldrop".into());
    assert_eq!(
        f.load().unwrap(),
        ["cni-ledger", "bridge", "portmap", "cni-ledger"],
        "libcni v1.3's chain"
    );
    f.network = keep;

    let (code, body) = agent.get("/readyz");
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains(&format!("ok ledger first in {}", first.display())),
        "{body}"
    );
    // libcni before v1.3 cannot load it, and loads the next file.
    assert!(
        body.contains(&format!("{} by containerd/libcni-1.1", next.display())),
        "{body}"
    );
    add_is_recorded(&mut f, "cldrop", "c-drop", &agent);
}

#[test]
fn a_capability_goes_from_the_head_when_the_dropin_that_brought_it_goes() {
    require_root!();
    let mut f = Fixture::new();
    f.driver = driver13();
    let bin = runtime_bin(&f);
    write_in_place(&f.conf_file, &plain(&f, vec![f.bridge_entry()]));
    let dir = f.conf_dir.join(&f.network);
    fs::create_dir_all(&dir).unwrap();
    let portmap = dir.join("50-portmap.conf");
    write_in_place(&portmap, &Fixture::portmap_entry());
    let agent = start(&f, &bin);
    let caps = |f: &Fixture| read_json(&f.conf_file)["plugins"][0]["capabilities"].clone();
    wait_for(LIMIT, || caps(&f) == json!({"portMappings": true})).unwrap_or_else(|| {
        panic!(
            "the head never declared portMappings: {}\n{}",
            read_json(&f.conf_file),
            agent.log_text()
        )
    });

    fs::remove_file(&portmap).unwrap();
    wait_for(Duration::from_secs(5), || {
        caps(&f).is_null() && types_in(&f.conf_file).len() == 3
    })
    .unwrap_or_else(|| {
        panic!(
            "portMappings still declared, or the tail not back inline: {:#}\n{}",
            read_json(&f.conf_file),
            agent.log_text()
        )
    });
    assert!(!dir.join("~cni-ledger-tail.conf").exists());
    assert_eq!(
        sample(
            &agent.metrics(),
            &format!(
                "cni_ledger_conflist_reverts_total{{file=\"{}\"}}",
                f.conf_file.display()
            )
        ),
        Some(0.0),
        "a drop-in gone is no revert"
    );
    // And back: the capability returns with the plugin.
    write_in_place(&portmap, &Fixture::portmap_entry());
    wait_for(Duration::from_secs(5), || {
        caps(&f) == json!({"portMappings": true})
    })
    .unwrap_or_else(|| panic!("portMappings not declared again:\n{}", agent.log_text()));
    let net = f.network.clone();
    add_is_recorded(&mut f, &net, "c-caps", &agent);
}

/// `cni-ledger inject` does for a conflist of drop-ins alone what the agent does: the
/// file keeps its bytes, the head and the tail are drop-ins, libcni v1.3 loads the ledger
/// first; `--remove` takes both out and the chain is the drop-ins' again.
#[test]
fn inject_puts_the_head_of_a_conflist_of_dropins_alone_in_a_dropin() {
    require_root!();
    let mut f = Fixture::new();
    f.driver = driver13();
    let first = f.conf_dir.join("05-drop.conflist");
    write_in_place(&first, &json!({"cniVersion": "1.0.0", "name": "cldrop"}));
    let before = fs::read(&first).unwrap();
    let dir = f.conf_dir.join("cldrop");
    fs::create_dir_all(&dir).unwrap();
    write_in_place(&dir.join("10-bridge.conf"), &f.bridge_entry());
    write_in_place(&dir.join("20-portmap.conf"), &Fixture::portmap_entry());
    let head = dir.join("!cni-ledger-head.conf");
    let tail = dir.join("~cni-ledger-tail.conf");
    let path = first.to_str().unwrap();

    let dry = f.ledger(&["inject", "--dry-run", path]);
    assert!(dry.status.success(), "{}", describe(&dry));
    let text = String::from_utf8_lossy(&dry.stdout);
    assert!(text.contains(&format!("# {}:", head.display())), "{text}");
    assert!(!head.exists(), "a dry run wrote the head");

    let out = f.ledger(&["inject", path]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        fs::read(&first).unwrap(),
        before,
        "the conflist was written"
    );
    assert_eq!(read_json(&head)["type"], json!("cni-ledger"));
    assert_eq!(
        read_json(&head)["capabilities"],
        json!({"portMappings": true})
    );
    assert_eq!(read_json(&tail)["role"], json!("tail"));
    f.network = "cldrop".into();
    assert_eq!(
        f.load().unwrap(),
        ["cni-ledger", "bridge", "portmap", "cni-ledger"],
        "libcni v1.3's chain after inject"
    );
    // Again: nothing to do.
    let again = f.ledger(&["inject", path]);
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("unchanged"),
        "{}",
        describe(&again)
    );

    let out = f.ledger(&["inject", "--remove", path]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!head.exists() && !tail.exists(), "drop-ins left behind");
    assert_eq!(fs::read(&first).unwrap(), before);
    assert_eq!(
        f.load().unwrap(),
        ["bridge", "portmap"],
        "libcni v1.3's chain after --remove"
    );
}
