//! A real reboot, in a virtual machine: the power is cut (SIGKILL of qemu) and the
//! guest boots again, with systemd as PID 1 and a real podman container.
//!
//! The guest is Debian bookworm made with debootstrap (`tests/vm/build-image.sh`,
//! cached in /var/cache/cni-ledger-vm), booted by qemu-system-x86_64 (KVM when the CPU
//! offers it, else TCG). cni-ledger goes in with `install.sh --binary`, the static
//! release build made here. The guest-side steps are `tests/vm/guest/*.sh`; they reach
//! the guest through a read-only 9p share of this source tree, report files through a
//! writable 9p share, and acknowledge events on a virtio-serial port that qemu writes
//! to a host file at once, so the host's record of acknowledgements survives the cut.
//!
//! Boot 1 (`power-cut`): install, a podman container with `-p 8080:80` on the chain
//! `[cni-ledger, bridge+host-local, portmap]`, a second one with `-p 8081:80` on
//! `adoptnet`, a network made after install.sh and so without the ledger (only
//! libcni's cache knows that attachment), an attachment whose DEL hangs, the firewall
//! saved as iptables-persistent does; then a loop of ADDs, each acknowledged after
//! the plugin succeeded and followed by a control copy of the same record written
//! without fsync. The host cuts the power mid-loop. host-local keeps its leases
//! outside /var/lib/cni/networks, which podman's tmpfiles.d rule empties at every
//! boot: there, a lease would be gone after the reboot whatever gc did.
//!
//! Boot 2 (`after-cut`): the boot finishes while gc's boot run hangs in the plugin
//! (the unit must not hold multi-user.target); gc's boot run, by itself, released the
//! container's address and portmap's DNAT rules (restored from the saved firewall
//! at boot) and exits 1 for the hung attachment (kept for the timer's retry); every
//! acknowledged ADD has an intact record; and the control copies show that this cut
//! does lose data that was never fsynced. Then the hanging plugin's DEL is let
//! succeed, the timer's first elapse is waited out and gc's unit is started once by
//! hand (the hung attachment replays, unless still in backoff), and install.sh is run again as an
//! operator runs it (`--inject`, no `--cni-path`, no CNI_PATH): it injects the ledger
//! into adoptnet and adopts the earlier boot's podman attachment, with nothing
//! unusable and CNI_PATH `/usr/lib/cni`, where Debian's plugins are. Clean poweroff.
//!
//! Boot 3 (`adopted`): the unit install.sh installed replays the adopted attachment
//! at boot with that CNI_PATH: its address, DNAT rules (restored at boot again) and
//! libcni cache file are gone, its record too, and the unit's exit status is 0.
//!
//! A real NIC, on the way (no boot of its own): the guest has two more virtio-net NICs,
//! each alone on a QEMU hub. At the end of boot 2 (`tests/vm/guest/nic.sh`) a driver
//! stand-in moves one into a pod as dranet does, and libcni stops the pod in CRI-O's
//! order (DEL, netns removed, then the driver's hook): with `returnDevices` the NIC is
//! back under its boot name, MTU and up; without it (control) the kernel's `net1`, down.
//! Both placements (a plugin of the chain; a hook after it), the namespace removed with
//! no DEL and gc giving the NIC back, RDMA as far as Soft-RoCE allows, the primary NIC
//! untouched; an attachment left holding the NIC is replayed by gc in boot 3
//! (`nic-reboot.sh`), which must rename nothing.
//!
//! The disk is a qcow2 overlay with cache=writeback. SIGKILL of qemu is a power cut
//! of the guest: its RAM and page cache are gone, while whatever it had handed to its
//! disk is already in the host's file (qemu keeps no data of its own, and the host's
//! kernel lives on). So fsynced data survives and data that never left the guest's
//! page cache is lost; a disk that drops acknowledged flushes is not modelled. Serial
//! output goes to `serial-N.log` in the run directory, kept (with everything else)
//! when the test fails.
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::Value;

const REPO: &str = env!("CARGO_MANIFEST_DIR");
/// How long the ADD loop runs before the cut: at least LOOP_SECS and LOOP_MIN_ACKS
/// ADDs, at most LOOP_MAX_SECS; well inside the guest's dirty-page expiry (30 s), so
/// the control copies are still only in the guest's page cache.
const LOOP_SECS: u64 = 8;
const LOOP_MIN_ACKS: usize = 20;
const LOOP_MAX_SECS: u64 = 20;
/// Bounds for one boot, including install.sh and podman under TCG. CL_VM_BOOT_SECS
/// overrides it on a machine busy with other work, where TCG crawls.
fn boot_timeout() -> Duration {
    let secs = std::env::var("CL_VM_BOOT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(360);
    Duration::from_secs(secs)
}

/// A running qemu, SIGKILLed by PID when dropped (also on panic): TCG takes a whole
/// core of a shared machine.
struct Vm {
    child: Child,
}

impl Vm {
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Run {
    dir: PathBuf,
    image: PathBuf,
    overlay: PathBuf,
    out: PathBuf,
    ok: bool,
}

impl Drop for Run {
    fn drop(&mut self) {
        if self.ok && std::env::var_os("CL_KEEP_TMP").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("vm_reboot: run directory kept: {}", self.dir.display());
        }
    }
}

fn run_dir(tag: &str) -> PathBuf {
    let base = match option_env!("CARGO_TARGET_TMPDIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(REPO).join("target/tmp"),
    };
    let dir = base.join(format!("{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("out")).expect("create the run directory");
    dir
}

/// The cached guest image (built first when missing; minutes on a fresh machine).
fn guest_image() -> PathBuf {
    let t = Instant::now();
    let out = Command::new("bash")
        .arg(Path::new(REPO).join("tests/vm/build-image.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run tests/vm/build-image.sh");
    assert!(
        out.status.success(),
        "tests/vm/build-image.sh failed ({}); see its messages above",
        out.status
    );
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    for f in ["rootfs.raw", "vmlinuz", "initrd.img"] {
        assert!(dir.join(f).is_file(), "{} has no {f}", dir.display());
    }
    println!(
        "FIGURE vm image ready in {:.1} s: {}",
        t.elapsed().as_secs_f64(),
        dir.display()
    );
    dir
}

/// The static build install.sh makes, in a target directory of the tests' own (the
/// outer `cargo test` holds the lock of the usual one while tests run), shared with
/// tests/deb.rs and with its quick release settings (no LTO, no optimisation: the same
/// code, built in a third of the time), so whichever runs second builds nothing.
fn static_release_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let vv = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    let host = String::from_utf8_lossy(&vv.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host target");
    let target_dir = Path::new(REPO).join("target/static-test");
    let flags = format!(
        "{} -C target-feature=+crt-static -C relocation-model=static",
        std::env::var("RUSTFLAGS").unwrap_or_default()
    );
    let status = Command::new(cargo)
        .current_dir(REPO)
        .args(["build", "--release", "--locked", "--target", &host])
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("CARGO_PROFILE_RELEASE_LTO", "off")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
        .env("RUSTFLAGS", flags)
        .status()
        .expect("run cargo build");
    assert!(status.success(), "static release build failed");
    let bin = target_dir.join(&host).join("release/cni-ledger");
    assert!(bin.is_file(), "{} missing after the build", bin.display());
    bin
}

/// qemu's disk cache mode: writeback (see the top of this file). CL_VM_CACHE
/// overrides it for experiments; `unsafe` (flushes ignored) gave the same figures,
/// since a SIGKILL of qemu leaves the host's page cache alone.
fn disk_cache() -> String {
    std::env::var("CL_VM_CACHE").unwrap_or_else(|_| "writeback".into())
}

/// KVM only when the CPU offers hardware virtualization: this machine's /dev/kvm is
/// a paravirtual one (kvm-pvm) that initialises fine but cannot run a stock Debian
/// kernel, so "KVM, else TCG" by qemu's own fallback would hang at boot.
fn accel() -> &'static str {
    let cpu = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hw = cpu
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if hw && Path::new("/dev/kvm").exists() {
        "kvm"
    } else {
        "tcg"
    }
}

fn boot(run: &Run, n: u32, step: &str) -> (Vm, PathBuf) {
    let acks = run.dir.join(format!("acks-{n}.log"));
    let serial = run.dir.join(format!("serial-{n}.log"));
    let img = &run.image;
    let child = Command::new("qemu-system-x86_64")
        .args(["-accel", accel(), "-m", "1024", "-smp", "1"])
        // -nodefaults: no VGA, CD-ROM or parallel port for the guest to probe at boot.
        .args([
            "-nodefaults",
            "-display",
            "none",
            "-no-reboot",
            "-nic",
            "none",
        ])
        .arg("-serial")
        .arg(format!("file:{}", serial.display()))
        .arg("-kernel")
        .arg(img.join("vmlinuz"))
        .arg("-initrd")
        .arg(img.join("initrd.img"))
        .arg("-append")
        .arg(format!(
            "console=ttyS0 root=/dev/vda rw panic=-1 vmtest.step={step}"
        ))
        .arg("-drive")
        .arg(format!(
            "file={},if=virtio,format=qcow2,cache={}",
            run.overlay.display(),
            disk_cache()
        ))
        .arg("-virtfs")
        .arg(format!(
            "local,path={REPO},mount_tag=host,security_model=none,readonly=on"
        ))
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=out,security_model=none",
            run.out.display()
        ))
        // Two NICs, each alone on a QEMU hub, so no frame leaves the VM: 00:08.0 (the
        // node's primary NIC) and 00:09.0 (the NIC a pod gets). Fixed
        // slots, after every other device, so nothing else moves.
        .args(["-netdev", "hubport,id=nic0,hubid=0", "-device"])
        .arg("virtio-net-pci,netdev=nic0,addr=0x8,mac=52:54:00:c1:ed:08")
        .args(["-netdev", "hubport,id=nic1,hubid=1", "-device"])
        .arg("virtio-net-pci,netdev=nic1,addr=0x9,mac=52:54:00:c1:ed:09")
        .args(["-device", "virtio-serial-pci", "-chardev"])
        .arg(format!("file,id=ack,path={}", acks.display()))
        .args(["-device", "virtserialport,chardev=ack,name=ack"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(run.dir.join(format!("qemu-{n}.err"))).expect("qemu stderr file"))
        .spawn()
        .expect("start qemu-system-x86_64 (apt-get install qemu-system-x86)");
    (Vm { child }, acks)
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

fn tail(path: &Path) -> String {
    let s = read(path);
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Waits until the ack log has a line equal to `want`; panics with the serial log's
/// tail on FAIL, on qemu's exit, or on timeout.
fn wait_for(run: &Run, vm: &mut Vm, n: u32, acks: &Path, want: &str) -> Duration {
    let start = Instant::now();
    loop {
        let log = read(acks);
        if log.lines().any(|l| l == want) {
            return start.elapsed();
        }
        let serial = run.dir.join(format!("serial-{n}.log"));
        if let Some(f) = log.lines().find(|l| l.starts_with("FAIL")) {
            panic!("guest boot {n}: {f}\nserial log tail:\n{}", tail(&serial));
        }
        if let Ok(Some(st)) = vm.child.try_wait() {
            panic!(
                "qemu (boot {n}) exited ({st}) before the guest said {want}\nqemu: {}\nserial log tail:\n{}",
                read(&run.dir.join(format!("qemu-{n}.err"))),
                tail(&serial)
            );
        }
        if start.elapsed() > boot_timeout() {
            panic!(
                "guest boot {n}: no {want} within {:?}\nserial log tail:\n{}",
                boot_timeout(),
                tail(&serial)
            );
        }
        sleep(Duration::from_millis(200));
    }
}

fn acked(acks: &Path, kind: &str) -> Vec<String> {
    let prefix = format!("ACK {kind} ");
    read(acks)
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
        .collect()
}

fn json_file(path: &Path) -> Vec<Value> {
    let s = read(path);
    match serde_json::from_str(&s) {
        Ok(Value::Array(a)) => a,
        other => panic!("{}: not a JSON array ({other:?}): {s}", path.display()),
    }
}

/// Container IDs of the records that decoded and passed their checksum.
fn intact(list: &[Value]) -> BTreeSet<String> {
    list.iter()
        .filter(|r| r["state"] != "damaged")
        .filter_map(|r| r["containerId"].as_str().map(str::to_owned))
        .collect()
}

fn kv(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_owned))
        .unwrap_or_default()
}

#[test]
fn power_cut_and_reboot_in_a_vm() {
    common::require_root!();
    let image = guest_image();
    let bin = static_release_binary();

    let dir = run_dir("vm-reboot");
    let mut run = Run {
        overlay: dir.join("overlay.qcow2"),
        out: dir.join("out"),
        image,
        dir,
        ok: false,
    };
    fs::copy(&bin, run.out.join("cni-ledger")).expect("copy the binary to the share");
    // The runtime stand-in of the NIC steps: libcni, as CRI-O drives CNI.
    fs::copy(common::tools::driver(), run.out.join("cni-driver"))
        .expect("copy the libcni driver to the share");
    let st = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(run.image.join("rootfs.raw"))
        .arg(&run.overlay)
        .status()
        .expect("run qemu-img (apt-get install qemu-utils)");
    assert!(st.success(), "qemu-img create failed");
    let out = run.out.clone();

    // ---- boot 1: set up, then the loop, then the power cut
    let (mut vm, acks1) = boot(&run, 1, "power-cut");
    let ready = wait_for(&run, &mut vm, 1, &acks1, "READY");
    println!(
        "FIGURE vm boot 1 ({}) + install.sh + podman run: READY after {:.1} s",
        accel(),
        ready.as_secs_f64()
    );
    let loop_start = Instant::now();
    while loop_start.elapsed() < Duration::from_secs(LOOP_MAX_SECS)
        && (loop_start.elapsed() < Duration::from_secs(LOOP_SECS)
            || acked(&acks1, "ADD").len() < LOOP_MIN_ACKS)
    {
        if let Ok(Some(st)) = vm.child.try_wait() {
            panic!(
                "qemu exited ({st}) during the ADD loop\n{}",
                tail(&run.dir.join("serial-1.log"))
            );
        }
        sleep(Duration::from_millis(100));
    }
    vm.kill(); // SIGKILL: the power cut
    let cut_after = loop_start.elapsed().as_secs_f64();
    let acked_add = acked(&acks1, "ADD");
    let acked_ctl = acked(&acks1, "CTL");
    assert!(
        read(&acks1).lines().all(|l| !l.starts_with("FAIL")),
        "the loop failed: {}",
        read(&acks1)
    );
    assert!(
        acked_add.len() >= 10,
        "only {} ADDs acknowledged in {cut_after:.1} s",
        acked_add.len()
    );

    let cid = read(&out.join("cid")).trim().to_owned();
    assert_eq!(cid.len(), 64, "podman container ID: {cid:?}");
    let before = json_file(&out.join("before-list.json"));
    let rec = before
        .iter()
        .find(|r| r["containerId"] == cid.as_str())
        .unwrap_or_else(|| panic!("no record of the podman container before the cut: {before:?}"));
    assert_eq!(rec["network"], "ledgernet");
    assert_eq!(
        rec["runtimeConfig"]["portMappings"][0]["hostPort"], 8080,
        "the record carries podman's port mapping: {rec}"
    );
    let ips_before = read(&out.join("before-ips.txt"));
    let leases: Vec<&str> = ips_before
        .lines()
        .filter(|l| l.starts_with("198.18.77."))
        .collect();
    assert_eq!(
        leases.len(),
        1,
        "one host-local address before the cut: {ips_before}"
    );
    let dnat_before = read(&out.join("before-nat.txt"))
        .matches(cid.as_str())
        .count();
    assert!(
        dnat_before > 0,
        "portmap's DNAT rules name the container before the cut"
    );
    // The attachment the ledger is not in yet: libcni's cache, an address and DNAT
    // rules, and no record.
    let early = read(&out.join("early-cid")).trim().to_owned();
    assert_eq!(early.len(), 64, "podman container ID (adoptnet): {early:?}");
    let early_cache = format!("adoptnet-{early}-eth0");
    assert!(
        read(&out.join("before-cache.txt"))
            .lines()
            .any(|l| l == early_cache),
        "libcni's cache holds {early_cache}: {}",
        read(&out.join("before-cache.txt"))
    );
    let early_ips = read(&out.join("before-adopt-ips.txt"));
    assert_eq!(
        early_ips
            .lines()
            .filter(|l| l.starts_with("198.18.78."))
            .count(),
        1,
        "one host-local address on adoptnet: {early_ips}"
    );
    assert!(
        read(&out.join("before-nat.txt")).contains(early.as_str()),
        "portmap's DNAT rules name the adoptnet container before the cut"
    );
    assert!(
        !before.iter().any(|r| r["containerId"] == early.as_str()),
        "no record of the adoptnet container before the adoption: {before:?}"
    );

    // ---- boot 2: after the cut
    let (mut vm, acks2) = boot(&run, 2, "after-cut");
    let done = wait_for(&run, &mut vm, 2, &acks2, "DONE");
    let t = Instant::now();
    while vm.child.try_wait().ok().flatten().is_none() && t.elapsed() < Duration::from_secs(60) {
        sleep(Duration::from_millis(200));
    }
    vm.kill();
    println!(
        "FIGURE vm boot 2 + checks: DONE after {:.1} s",
        done.as_secs_f64()
    );

    // The boot finished while gc's boot run was still hanging in the plugin.
    let state = read(&out.join("boot-state.txt"));
    println!(
        "FIGURE vm boot 2 state when the boot finished: {}",
        state.replace('\n', " ")
    );
    assert_eq!(
        kv(&state, "system"),
        "running",
        "is-system-running after the boot (failed units: {})",
        read(&out.join("failed-units.txt"))
    );
    assert_eq!(
        kv(&state, "gc"),
        "active",
        "gc's boot run still runs when the boot is done"
    );
    assert_eq!(
        kv(&state, "hang"),
        "running",
        "the hanging plugin still hangs then"
    );
    assert_eq!(
        kv(&state, "netfilter"),
        "success",
        "netfilter-persistent restored the rules"
    );
    let us = |k: &str| {
        kv(&state, k)
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("{k} in {state}"))
    };
    let (finished, gc_started) = (us("finished"), us("gc_started"));
    assert!(
        gc_started > 0 && gc_started < finished,
        "gc's boot run started during the boot: {state}"
    );
    println!(
        "FIGURE vm boot 2: boot finished at {:.1} s with gc's boot run started at {:.1} s and still hanging in a plugin",
        finished as f64 / 1e6,
        gc_started as f64 / 1e6
    );

    // The boot run ended with "retrying" (the hung attachment), which is no unit
    // failure, and the timer stays armed for the retry.
    let gc = read(&out.join("gc-status.txt"));
    assert_eq!(kv(&gc, "status"), "1", "gc's exit status: {gc}");
    assert_eq!(kv(&gc, "result"), "success", "the unit is not failed: {gc}");
    assert_eq!(kv(&gc, "timer"), "active", "the timer: {gc}");

    // The boot run released the address and the DNAT rules by itself.
    let journal = read(&out.join("gc-journal.txt"));
    let short = &cid[..12];
    assert!(
        journal
            .lines()
            .any(|l| l.contains(&cid) || l.contains(short))
            && journal.contains("replayed"),
        "gc's journal shows the replay of the container:\n{journal}"
    );
    let ips_after = read(&out.join("after-ips.txt"));
    assert!(
        !ips_after.lines().any(|l| l.starts_with("198.18.77.")),
        "host-local still holds an address after the boot run: {ips_after}"
    );
    let saved = read(&out.join("saved-rules.v4"));
    assert!(
        saved.contains(cid.as_str()),
        "the saved firewall holds the container's DNAT rules"
    );
    let nat_after = read(&out.join("after-nat.txt"));
    assert!(
        nat_after.contains("CNI-HOSTPORT-DNAT"),
        "the saved rules were restored at boot:\n{nat_after}"
    );
    assert!(
        !nat_after.contains(cid.as_str()),
        "portmap's DNAT rules for the container survived the boot run:\n{nat_after}"
    );
    let after = json_file(&out.join("after-list.json"));
    assert!(
        !after.iter().any(|r| r["containerId"] == cid.as_str()),
        "the container's record is gone after its replay: {after:?}"
    );
    assert!(
        after.iter().any(|r| r["containerId"] == "hang0001"),
        "the hung attachment's record stays for the timer's retry: {after:?}"
    );

    // Every acknowledged ADD has an intact record; the unsynced control copies don't.
    assert_eq!(
        read(&out.join("loop-verify.rc")).trim(),
        "0",
        "verify of the loop ledger:\n{}",
        read(&out.join("loop-verify.txt"))
    );
    let loop_ok = intact(&json_file(&out.join("loop-list.json")));
    let lost_add: Vec<&String> = acked_add.iter().filter(|c| !loop_ok.contains(*c)).collect();
    let ctl_ok = intact(&json_file(&out.join("ctl-list.json")));
    let lost_ctl: Vec<&String> = acked_ctl.iter().filter(|c| !ctl_ok.contains(*c)).collect();
    println!(
        "FIGURE vm power cut after {cut_after:.1} s of ADDs: {} ADDs acknowledged, {} lost; \
         {} control writes without fsync acknowledged, {} lost",
        acked_add.len(),
        lost_add.len(),
        acked_ctl.len(),
        lost_ctl.len()
    );
    assert!(
        lost_add.is_empty(),
        "acknowledged ADDs without an intact record after the cut: {lost_add:?}"
    );
    assert!(
        !lost_ctl.is_empty(),
        "no unsynced control write was lost: this cut does not show what fsync is for\n{}",
        read(&out.join("ctl-ls.txt"))
    );

    // ---- boot 2, then: install.sh re-run adopts the previous boot's attachment
    // The run by hand replays the hung attachment unless its backoff (10 s after the
    // first try) is not over yet; boot 3's unit replays it then.
    let timer_run = read(&out.join("timer-run.txt"));
    println!(
        "FIGURE vm boot 2: timer's first elapse at {}, gc run by hand over at {} s of uptime \
         (exit status {}), timer's next at {}",
        kv(&timer_run, "trigger"),
        kv(&timer_run, "uptime"),
        kv(&timer_run, "status"),
        kv(&timer_run, "next")
    );
    assert!(
        !json_file(&out.join("timer-list.json"))
            .iter()
            .any(|r| r["containerId"] == early.as_str()),
        "a record of the adoptnet container before install.sh adopted it"
    );
    assert!(
        read(&out.join("adopt-before-cache.txt"))
            .lines()
            .any(|l| l == early_cache),
        "libcni's cache still holds {early_cache} when install.sh runs again"
    );
    assert!(
        read(&out.join("adopt-before-ips.txt"))
            .lines()
            .any(|l| l.starts_with("198.18.78.")),
        "the adoptnet address is still taken when install.sh runs again"
    );
    assert!(
        read(&out.join("adopt-before-nat.txt")).contains(early.as_str()),
        "the adoptnet container's DNAT rules were restored at boot"
    );
    let reinstall = read(&out.join("reinstall.txt"));
    assert_eq!(
        read(&out.join("reinstall.rc")).trim(),
        "0",
        "install.sh run again:\n{reinstall}"
    );
    assert!(
        read(&out.join("adoptnet.conflist")).contains("\"cni-ledger\""),
        "install.sh --inject put the ledger into adoptnet's chain"
    );
    assert!(
        reinstall
            .lines()
            .any(|l| l.starts_with("adopted 1,") && l.contains("unusable 0")),
        "install.sh's adopt took one attachment and found nothing unusable:\n{reinstall}"
    );
    let again: Value =
        serde_json::from_str(&read(&out.join("adopt-again.json"))).unwrap_or(Value::Null);
    assert_eq!(
        read(&out.join("adopt-again.rc")).trim(),
        "0",
        "cni-ledger adopt after install.sh: {again}\n{}",
        read(&out.join("adopt-again.err"))
    );
    assert_eq!(
        again["unusable"],
        serde_json::json!([]),
        "adopt reports unusable cache files: {again}"
    );
    assert_eq!(
        again["adopted"],
        serde_json::json!([]),
        "a second adopt finds nothing new: {again}"
    );
    let adopted: Vec<Value> = fs::read_dir(out.join("adopted-records"))
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let text = read(&e.path());
                    serde_json::from_str::<Value>(&text)
                        .unwrap_or_else(|e| panic!("record {text}: {e}"))["record"]
                        .clone()
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        adopted.len(),
        1,
        "one record of adoptnet after install.sh:\n{reinstall}"
    );
    let adopted = &adopted[0];
    assert_eq!(adopted["containerId"], early.as_str(), "{adopted}");
    assert_eq!(adopted["source"], "adopted", "{adopted}");
    assert!(
        json_file(&out.join("adopt-list.json"))
            .iter()
            .any(|r| r["containerId"] == early.as_str()),
        "the adopted record is still there when boot 2 ends (no gc run replayed it yet)"
    );

    check_nic_at_del(&out);
    check_nic_after_the_fact(&out);

    // ---- boot 3: the unit replays the adopted attachment and exits 0
    let (mut vm, acks3) = boot(&run, 3, "adopted");
    let done = wait_for(&run, &mut vm, 3, &acks3, "DONE");
    let t = Instant::now();
    while vm.child.try_wait().ok().flatten().is_none() && t.elapsed() < Duration::from_secs(60) {
        sleep(Duration::from_millis(200));
    }
    vm.kill();
    println!(
        "FIGURE vm boot 3 + checks: DONE after {:.1} s",
        done.as_secs_f64()
    );
    let gc3 = read(&out.join("b3-gc-status.txt"));
    let journal3 = read(&out.join("b3-gc-journal.txt"));
    println!("FIGURE vm boot 3 gc boot run: {}", gc3.replace('\n', " "));
    assert!(
        kv(&gc3, "started").parse::<u64>().unwrap_or(0) > 0,
        "gc's boot run ran: {gc3}"
    );
    assert_eq!(
        kv(&gc3, "status"),
        "0",
        "the boot unit's exit status after the adoption ({gc3}; the adopted record's \
         CNI_PATH: {})\njournal:\n{journal3}",
        adopted["cniPath"]
    );
    assert_eq!(kv(&gc3, "result"), "success", "{gc3}");
    // Nor did any other run of this boot leave something retrying or failed (the
    // timer's, 1 min after boot, may have run before the guest looked; systemd does not
    // log an exit status it counts as success).
    let summaries: Vec<&str> = journal3
        .lines()
        .filter(|l| {
            l.split_once("]: ")
                .is_some_and(|(_, m)| m.starts_with("stale "))
        })
        .collect();
    assert!(
        !summaries.is_empty()
            && summaries
                .iter()
                .all(|l| l.contains("retrying 0, failed 0") && l.contains("damaged 0")),
        "gc's runs in boot 3:\n{journal3}"
    );
    // It is the adopted CNI_PATH the replay ran with: Debian's plugin dir, and only it
    // (/opt/cni/bin holds the ledger and vm-hang, none of the chain's plugins).
    assert_eq!(
        adopted["cniPath"], "/usr/lib/cni",
        "the adopted record's CNI_PATH: {adopted}"
    );
    assert!(
        !reinstall.contains("found in none"),
        "adopt warned about missing plugins:\n{reinstall}"
    );
    let short = &early[..12];
    assert!(
        journal3
            .lines()
            .any(|l| (l.contains(&early) || l.contains(short)) && l.contains("replayed")),
        "the boot run's journal shows the adopted attachment's replay:\n{journal3}"
    );
    let ips3 = read(&out.join("b3-ips.txt"));
    assert!(
        !ips3.lines().any(|l| l.starts_with("198.18.78.")),
        "host-local still holds the adoptnet address after the boot run: {ips3}"
    );
    let nat3 = read(&out.join("b3-nat.txt"));
    assert!(
        nat3.contains("CNI-HOSTPORT-DNAT"),
        "the saved rules were restored at boot 3:\n{nat3}"
    );
    assert!(
        !nat3.contains(early.as_str()),
        "portmap's DNAT rules for the adopted attachment survived the boot run:\n{nat3}"
    );
    assert!(
        !read(&out.join("b3-cache.txt"))
            .lines()
            .any(|l| l == early_cache),
        "libcni's cache file of the replayed attachment is still there"
    );
    assert!(
        !json_file(&out.join("b3-list.json"))
            .iter()
            .any(|r| r["containerId"] == early.as_str()),
        "the adopted record is gone after its replay"
    );
    check_nic_across_the_reboot(&out);
    run.ok = true;
}

/// `name=… mtu=… state=…` as tests/vm/guest/nic.sh writes the pod NIC's state.
fn nic_state(out: &Path, case: &str) -> (String, String, String) {
    let s = read(&out.join(format!("nic-{case}.txt")));
    let get = |k: &str| {
        s.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")).map(str::to_owned))
            .unwrap_or_default()
    };
    (get("name"), get("mtu"), get("state"))
}

fn nic_names(out: &Path) -> (String, String) {
    let s = read(&out.join("nic-names.txt"));
    let get = |k: &str| {
        s.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")).map(str::to_owned))
            .unwrap_or_else(|| panic!("no {k} in nic-names.txt: {s}"))
    };
    (get("nic"), get("primary"))
}

/// Boot 2's first NIC cases (tests/vm/guest/nic.sh): CRI-O's stop order, both
/// placements, each with its control run without returnDevices; and RDMA.
fn check_nic_at_del(out: &Path) {
    let (nic, primary) = nic_names(out);
    println!(
        "FIGURE vm NIC: the pod NIC boots as {nic} (bus {}), the primary as {primary}",
        read(&out.join("nic-bus.txt")).trim()
    );
    let log = read(&out.join("nic-ledger.log"));
    for case in ["chain-ret", "chain-ctl", "nri-ret", "nri-ctl"] {
        let state = nic_state(out, case);
        println!(
            "FIGURE vm NIC {case}: after DEL, netns removal and the driver's hook: {} (in the pod: {}; the hook: {})",
            read(&out.join(format!("nic-{case}.txt"))).trim(),
            read(&out.join(format!("nic-{case}-inpod.txt"))).trim(),
            read(&out.join(format!("nic-{case}-hook.txt")))
                .replace('\n', " ")
                .trim()
        );
        assert_eq!(
            read(&out.join(format!("nic-{case}-del.rc"))).trim(),
            "0",
            "CNI DEL ({case}): {}",
            read(&out.join(format!("nic-{case}-del.err")))
        );
        // The hook ran after the namespace was gone, as CRI-O runs it, and failed.
        assert!(
            !read(&out.join(format!("nic-{case}-hook.txt"))).contains("rc=0"),
            "the driver's hook ({case}) could still open the namespace"
        );
        assert!(
            read(&out.join(format!("nic-{case}-inpod.txt"))).contains("alias cni0"),
            "the pod rewrote the alias ({case})"
        );
        if case.ends_with("-ret") {
            assert_eq!(
                state,
                (nic.clone(), "1500".into(), "up".into()),
                "{case}: with returnDevices the NIC is back under its host name, MTU and state\nledger log:\n{log}"
            );
        } else {
            // The kernel's own return: down, under the pod's name, the pod's MTU.
            assert_eq!(
                state,
                ("net1".into(), "1400".into(), "down".into()),
                "{case}: the control run without returnDevices"
            );
        }
    }
    // The chain placement was named from the tail's record, the NRI one from udev's
    // rule (the tail saw no device): the log says which.
    assert!(
        log.lines().any(|l| l.contains("nic-chain-ret")
            && l.contains("returned netdev net1")
            && l.contains("name recorded at ADD")),
        "chain placement: named from the tail's record\n{log}"
    );
    assert!(
        log.lines().any(|l| l.contains("nic-nri-ret")
            && l.contains("returned netdev net1")
            && l.contains(&format!("as {nic} (by hotplug slot)"))),
        "NRI placement: named from the device, as udev named it at boot\n{log}"
    );
    // RDMA: what the kernel allowed, printed; the ledger's DEL in exclusive mode
    // succeeded and moved nothing it could not.
    let rdma = read(&out.join("rdma.txt"));
    println!("FIGURE vm RDMA (rdma_rxe): {}", rdma.replace('\n', " | "));
    assert_eq!(
        read(&out.join("rdma-del.rc")).trim(),
        "0",
        "a DEL with returnDevices where RDMA is in exclusive mode: {}",
        read(&out.join("rdma-del.err"))
    );
    assert!(
        log.lines()
            .any(|l| l.contains("rdmanet") && l.contains("RDMA")),
        "the ledger's RDMA step ran at the rdmanet DEL:\n{log}"
    );
    // The node's primary NIC: exactly as before, through every case.
    assert_eq!(
        read(&out.join("primary-before.txt")),
        read(&out.join("primary-after.txt")),
        "the host's primary NIC was touched"
    );
    assert!(read(&out.join("primary-before.txt")).contains("198.18.90.1/24"));
}

/// Boot 2's after-the-fact cases: the namespace removed with no DEL, then gc.
fn check_nic_after_the_fact(out: &Path) {
    let (nic, _) = nic_names(out);
    for c in ["ret", "ctl"] {
        println!(
            "FIGURE vm NIC fact-{c}: netns removed with no DEL: {}; after gc: {}",
            read(&out.join(format!("nic-fact-{c}-before-gc.txt"))).trim(),
            read(&out.join(format!("nic-fact-{c}.txt"))).trim()
        );
        assert!(
            read(&out.join(format!("nic-fact-{c}-before-gc.txt")))
                .contains("name=net1 mtu=1400 state=down"),
            "the kernel returned the NIC down under its pod name"
        );
        let gc: Value = serde_json::from_str(&read(&out.join(format!("nic-fact-{c}-gc.json"))))
            .unwrap_or_else(|e| {
                panic!(
                    "gc --json (fact-{c}): {e}\n{}",
                    read(&out.join(format!("nic-fact-{c}-gc.err")))
                )
            });
        assert_eq!(
            read(&out.join(format!("nic-fact-{c}-gc.rc"))).trim(),
            "0",
            "gc (fact-{c}): {gc}"
        );
        let rec = &gc["records"][0];
        assert_eq!(rec["action"], "replayed", "{gc}");
        let prom = read(&out.join(format!("nic-fact-{c}.prom")));
        let list = read(&out.join(format!("nic-fact-{c}-list.json")));
        if c == "ret" {
            assert_eq!(
                nic_state(out, "fact-ret"),
                (nic.clone(), "1500".into(), "up".into()),
                "gc gave the NIC back its host name, MTU and state: {gc}\n{}",
                read(&out.join("nic-fact-ret-gc.err"))
            );
            let d = &rec["devices"][0];
            assert_eq!(
                (&d["foundAs"], &d["hostName"], &d["up"], &d["mtu"]),
                (
                    &Value::from("net1"),
                    &Value::from(nic.as_str()),
                    &Value::from(true),
                    &Value::from(1500)
                ),
                "gc's report names the device: {gc}"
            );
            assert!(
                list.contains("devices-given-back") && list.contains(nic.as_str()),
                "list shows the device gc gave back: {list}"
            );
            assert!(
                prom.lines()
                    .any(|l| l.starts_with("cni_ledger_devices_given_back ") && !l.ends_with(" 0")),
                "the metric counts it:\n{prom}"
            );
        } else {
            assert_eq!(
                nic_state(out, "fact-ctl"),
                ("net1".into(), "1400".into(), "down".into()),
                "without returnDevices gc leaves the kernel's return alone"
            );
            assert!(rec["devices"].is_null(), "{gc}");
        }
    }
    // Debian's host-device as the chained driver. At DEL (CRI-O's order) its own DEL
    // moves the NIC out before the ledger's runs, renamed after the alias the pod
    // rewrote (cni0), down; the ledger's head DEL, last, gives it back its host name and
    // the node's state. The control (no returnDevices) is host-device's own: printed.
    let hd = read(&out.join("nic-hd-del.txt"));
    println!(
        "FIGURE vm NIC host-device in the chain, returnDevices, CRI-O's order: {} (in the pod: {})",
        hd.trim(),
        read(&out.join("nic-hd-del-inpod.txt")).trim()
    );
    assert_eq!(read(&out.join("nic-hd-del-del.rc")).trim(), "0");
    assert_eq!(
        nic_state(out, "hd-del"),
        (nic.clone(), "1500".into(), "up".into()),
        "the head's DEL gave back the NIC host-device returned: {hd}\n{}",
        read(&out.join("nic-hd-del-del.err"))
    );
    println!(
        "FIGURE vm NIC host-device in the chain, control (no returnDevices): {}",
        read(&out.join("nic-hd-ctl.txt")).trim()
    );
    assert_eq!(read(&out.join("nic-hd-ctl-del.rc")).trim(), "0");
    assert!(
        read(&out.join("nic-hd-ctl.txt")).starts_with("name="),
        "host-device's DEL left the NIC off the host"
    );
    println!(
        "FIGURE vm NIC host-device, netns removed with no DEL: {}; after gc: {}",
        read(&out.join("nic-hd-fact-before-gc.txt")).trim(),
        read(&out.join("nic-hd-fact.txt")).trim()
    );
    assert_eq!(
        read(&out.join("nic-hd-fact-gc.rc")).trim(),
        "0",
        "gc (host-device): {}\n{}",
        read(&out.join("nic-hd-fact-gc.json")),
        read(&out.join("nic-hd-fact-gc.err"))
    );
    assert_eq!(
        nic_state(out, "hd-fact"),
        (nic.clone(), "1500".into(), "up".into()),
        "gc gave back the NIC host-device had moved: {}",
        read(&out.join("nic-hd-fact-gc.err"))
    );

    // The attachment left holding the NIC at poweroff, for boot 3.
    assert!(
        json_file(&out.join("nic-boot-list.json"))
            .iter()
            .any(|r| r["containerId"] == "cid-boot"),
        "the NIC's last attachment is recorded before the reboot"
    );
}

/// Boot 3: the NIC booted on the host; gc replays the attachment and renames nothing.
fn check_nic_across_the_reboot(out: &Path) {
    let (nic, _) = nic_names(out);
    let gc: Value = serde_json::from_str(&read(&out.join("b3-nic-gc.json")))
        .unwrap_or_else(|e| panic!("boot 3 gc: {e}\n{}", read(&out.join("b3-nic-gc.err"))));
    println!("FIGURE vm NIC across the reboot: gc {}", gc["records"]);
    assert_eq!(read(&out.join("b3-nic-gc.rc")).trim(), "0", "{gc}");
    assert!(
        gc["records"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["containerId"] == "cid-boot"
                && r["action"] == "replayed"
                && r["devices"].is_null())),
        "boot 3's gc replayed the NIC's attachment and gave back no device: {gc}"
    );
    let before = read(&out.join("b3-links-before.txt"));
    assert!(
        before.contains(&format!(" {nic}:")) || before.contains(&format!("{nic}:")),
        "{before}"
    );
    assert_eq!(
        before,
        read(&out.join("b3-links-after.txt")),
        "gc changed a link across the reboot"
    );
}

/// The units install.sh installs, rendered as it renders them, pass systemd's own
/// checks (the VM test then runs them for real).
#[test]
fn units_pass_systemd_analyze_verify() {
    common::require_root!();
    let dir = run_dir("vm-units");
    let bin = common::ledger_bin();
    for unit in ["cni-ledger-gc.service", "cni-ledger-gc.timer"] {
        let text = fs::read_to_string(Path::new(REPO).join("packaging/systemd").join(unit))
            .expect("read the unit template");
        let text = text
            .replace("@BINARY@", &bin.display().to_string())
            .replace("@LEDGER_DIR@", "/var/lib/cni-ledger")
            .replace("@CONF_DIR@", "/etc/cni/net.d");
        assert!(!text.contains('@'), "placeholder left in {unit}");
        fs::write(dir.join(unit), text).expect("write the rendered unit");
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.join("cni-ledger-gc.service"))
        .arg(dir.join("cni-ledger-gc.timer"))
        .output()
        .expect("run systemd-analyze (apt-get install systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let _ = fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{stderr}"
    );
    assert!(
        !stderr.contains("cni-ledger-gc"),
        "systemd-analyze verify complains about the units:\n{stderr}"
    );
}
