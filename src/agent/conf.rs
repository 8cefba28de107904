//! Which network configuration the node uses: kubelet's runtimes (containerd, CRI-O)
//! list `.conf`, `.conflist` and `.json` files of the conf dir together, sorted by name,
//! and take the first that loads. `--conflist` overrides that choice.

use anyhow::Result;
use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// The one the runtime uses: the lexically first file that loads.
    First,
    /// Every file that loads.
    All,
    /// The file of this name in the conf dir, else the file whose network has this name.
    Named(String),
}

impl std::str::FromStr for Choice {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Choice, Self::Err> {
        Ok(match s {
            "" | "first" => Choice::First,
            "all" => Choice::All,
            name => Choice::Named(name.to_string()),
        })
    }
}

pub fn choose(dir: &Path, choice: &Choice) -> Result<Vec<PathBuf>> {
    Ok(chosen(dir, choice)?.into_iter().map(|(p, _)| p).collect())
}

/// The chosen files with their documents.
pub fn chosen(dir: &Path, choice: &Choice) -> Result<Vec<(PathBuf, Value)>> {
    let mut all = crate::conflist::loadable(dir)?;
    Ok(match choice {
        Choice::First => all.into_iter().take(1).collect(),
        Choice::All => all,
        Choice::Named(name) => {
            let by_file = all
                .iter()
                .position(|(p, _)| p.file_name().is_some_and(|f| f == name.as_str()));
            let by_net = || all.iter().position(|(_, d)| d["name"] == name.as_str());
            match by_file.or_else(by_net) {
                Some(i) => vec![all.swap_remove(i)],
                None => Vec::new(),
            }
        }
    })
}

/// The network names of the chosen files (the records' `network`).
pub fn networks(dir: &Path, choice: &Choice) -> Result<Vec<String>> {
    let mut names: Vec<String> = chosen(dir, choice)?
        .iter()
        .filter_map(|(_, d)| d["name"].as_str().map(String::from))
        .collect();
    names.dedup();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_loadable_by_name_across_extensions() {
        let dir = std::env::temp_dir().join(format!("cl-agent-conf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let w = |n: &str, s: &str| std::fs::write(dir.join(n), s).unwrap();
        w("05-broken.conflist", "{not json");
        w("07-empty.conflist", r#"{"name":"e","plugins":[]}"#);
        w(
            "08-numver.conflist",
            r#"{"cniVersion":1,"name":"v","plugins":[{"type":"bridge"}]}"#,
        );
        w("10-b.conf", r#"{"name":"b","type":"bridge"}"#);
        w(
            "20-a.conflist",
            r#"{"name":"a","plugins":[{"type":"bridge"}]}"#,
        );
        w("99-notes.txt", r#"{"name":"t","type":"bridge"}"#);
        let first = choose(&dir, &Choice::First).unwrap();
        assert_eq!(first, vec![dir.join("10-b.conf")]);
        assert_eq!(choose(&dir, &Choice::All).unwrap().len(), 2);
        assert_eq!(
            choose(&dir, &"a".parse().unwrap()).unwrap(),
            vec![dir.join("20-a.conflist")]
        );
        assert_eq!(
            choose(&dir, &"20-a.conflist".parse().unwrap()).unwrap(),
            vec![dir.join("20-a.conflist")]
        );
        assert!(choose(&dir, &"zz".parse().unwrap()).unwrap().is_empty());
        assert_eq!(networks(&dir, &Choice::First).unwrap(), ["b"]);
        assert_eq!(networks(&dir, &Choice::All).unwrap(), ["b", "a"]);
        assert_eq!(
            networks(&dir, &"20-a.conflist".parse().unwrap()).unwrap(),
            ["a"]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
