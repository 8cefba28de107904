//! Time: wall-clock Unix seconds and RFC 3339 UTC strings (`2026-12-02T17:41:33Z`), the
//! time since boot (which no clock step changes), when this boot began, and ages as the
//! human tables show them.

use anyhow::Context;
use std::time::{SystemTime, UNIX_EPOCH};

pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Seconds since boot on CLOCK_BOOTTIME: steady within a boot (NTP steps the wall
/// clock, never this one; suspend counts), so an age measured on it within one boot
/// can neither shrink nor jump. A vDSO read: nothing an ADD would notice. As the
/// initial time namespace reads it, whatever this process's (`since_boot_ns`).
pub fn since_boot() -> Option<u64> {
    since_boot_ns().map(|ns| ns / 1_000_000_000)
}

/// `/proc/self/ns/time` of the initial time namespace: the kernel's `PROC_TIME_INIT_INO`.
const INITIAL_TIME_NS: &str = "time:[4026531834]";

/// This process's CLOCK_BOOTTIME offset from the initial time namespace's, in ns.
/// A Linux time namespace (`unshare -T --boottime N`) shifts CLOCK_BOOTTIME by its
/// offset: a plugin run by a runtime in one and a gc in another (a container with a
/// time namespace of its own) would read one boot's clock N apart, and gc would take a
/// record made a second ago for one N seconds old. Stamps and readings are therefore
/// taken on the initial namespace's clock, this offset subtracted. A process's time
/// namespace is fixed for its life (unshare and setns move only its children), so it is
/// read once. None: it cannot be known (no /proc); the boot clock then counts as
/// unreadable, and ages fall back as they do without it.
fn boottime_offset_ns() -> Option<i64> {
    static OFFSET: std::sync::OnceLock<Option<i64>> = std::sync::OnceLock::new();
    *OFFSET.get_or_init(read_boottime_offset)
}

fn read_boottime_offset() -> Option<i64> {
    // The common case, one readlink: the initial namespace has no offset.
    match std::fs::read_link("/proc/self/ns/time") {
        Ok(l) if l.as_os_str() == INITIAL_TIME_NS => return Some(0),
        Ok(_) => {}
        // A kernel before 5.6 has no time namespaces, so no offset.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return std::path::Path::new("/proc/self/ns/net")
                .exists()
                .then_some(0);
        }
        Err(_) => return None,
    }
    boottime_offset_in(&std::fs::read_to_string("/proc/self/timens_offsets").ok()?)
}

/// The `boottime` line of `/proc/<pid>/timens_offsets` (`boottime <secs> <nanosecs>`),
/// in ns.
fn boottime_offset_in(offsets: &str) -> Option<i64> {
    let line = offsets
        .lines()
        .find(|l| l.split_whitespace().next() == Some("boottime"))?;
    let mut f = line.split_whitespace().skip(1);
    let secs: i64 = f.next()?.parse().ok()?;
    let nanos: i64 = f.next()?.parse().ok()?;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// An age in whole units for the human tables: `90s`, `5m`, `3h`, `2d`; `-` when negative
/// (a clock stepped back).
pub fn age(secs: i64) -> String {
    match secs {
        s if s < 0 => "-".into(),
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// When the current boot began (Unix seconds), from `btime` in /proc/stat: the clock
/// now less the time since boot, so a step of the clock moves it too.
pub fn boot_time() -> anyhow::Result<i64> {
    if let Some(t) = crate::faults::btime_override() {
        return Ok(t);
    }
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .context("no btime in /proc/stat")
}

/// Directories whose filesystem is made anew at every boot (devtmpfs by the kernel
/// itself, tmpfs by early boot), so their birth time is a reading of the clock as the
/// boot began.
const BOOT_FRESH_DIRS: &[&str] = &["/dev", "/run"];

/// The earliest this boot can have begun (Unix seconds), for judging a cache file by its
/// date. `btime` alone moves with the clock: stepped forward after boot (a first NTP
/// sync on a node without a good RTC, a VM resumed from a snapshot), it would pass the
/// files this boot wrote before the step and make their pods "from an earlier boot".
/// The births of /dev and /run were stamped by the clock as it was then; the earliest
/// of all is taken. Each can only move the line back, towards "this boot" (live).
pub fn boot_began() -> anyhow::Result<i64> {
    let btime = boot_time()?;
    Ok(BOOT_FRESH_DIRS
        .iter()
        .filter_map(|d| born_this_boot(d))
        .fold(btime, i64::min))
}

/// The birth time of `dir`, when it is the root of a tmpfs (devtmpfs is one too) and
/// the kernel keeps birth times there: a /dev on disk was born at install, not at boot.
fn born_this_boot(dir: &str) -> Option<i64> {
    let fs = nix::sys::statfs::statfs(dir).ok()?;
    if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
        return None;
    }
    let born = std::fs::metadata(dir).ok()?.created().ok()?;
    let secs = born.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    i64::try_from(secs).ok().filter(|&s| s > 0)
}

/// Nanoseconds since boot on CLOCK_BOOTTIME (see `since_boot`): records' stamps and
/// the chain's timings, on the initial time namespace's clock (`boottime_offset_ns`).
pub fn since_boot_ns() -> Option<u64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    // time_t and long: i64 on every 64-bit Linux.
    #[allow(clippy::useless_conversion)]
    let (secs, nanos) = (i64::from(t.tv_sec()), i64::from(t.tv_nsec()));
    let own = secs.checked_mul(1_000_000_000)?.checked_add(nanos)?;
    u64::try_from(own.checked_sub(boottime_offset_ns()?)?).ok()
}

// Days from civil date and back: Howard Hinnant's algorithms, proleptic Gregorian.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + if m <= 2 { 1 } else { 0 }, m, d)
}

pub fn rfc3339(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Parses what `rfc3339` writes (also accepts a fractional part and a `+00:00` suffix).
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        rest = frac.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    if rest != "Z" && rest != "+00:00" {
        return None;
    }
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    Some(days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_time_is_in_the_past() {
        let t = boot_time().unwrap();
        assert!(t > 0 && t <= now());
        let began = boot_began().unwrap();
        assert!(began > 0 && began <= t);
    }

    #[test]
    fn boottime_offsets_parse() {
        let offsets = "monotonic           0         0\nboottime       100000       250\n";
        assert_eq!(boottime_offset_in(offsets), Some(100_000_000_000_250));
        assert_eq!(
            boottime_offset_in("monotonic 5 0\nboottime -3 0\n"),
            Some(-3_000_000_000)
        );
        assert_eq!(boottime_offset_in("monotonic 5 0\n"), None);
        assert_eq!(boottime_offset_in("boottime x 0\n"), None);
        // This process's own reading agrees with /proc/uptime (which the kernel gives
        // in the process's namespace) less its offset.
        let up: f64 = std::fs::read_to_string("/proc/uptime")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let own = up - boottime_offset_ns().unwrap() as f64 / 1e9;
        let ours = since_boot_ns().unwrap() as f64 / 1e9;
        assert!((ours - own).abs() < 2.0, "{ours} vs {own}");
    }

    #[test]
    fn round_trips() {
        for t in [0, 951782400, 1_796_000_000, 4_102_444_800, 1_709_164_800] {
            assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t), "{}", rfc3339(t));
        }
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951782400), "2000-02-29T00:00:00Z");
        assert_eq!(
            parse_rfc3339("2000-02-29T00:00:00.5+00:00"),
            Some(951782400)
        );
        assert_eq!(parse_rfc3339("2000-02-29 00:00:00Z"), None);
    }
}
