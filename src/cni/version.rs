//! CNI specification versions this plugin speaks.

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
}
