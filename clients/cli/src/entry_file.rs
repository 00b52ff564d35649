//! `signetctl entry create --file F`: a list of registration entries in JSON or YAML, with the
//! same fields as `entry create`'s flags, turned into one `BatchCreateEntries` call.
//!
//! Owns the file's shape and nothing else: the server validates every entry (and refuses the
//! whole batch, naming the index, if one is bad). Invariant: a field the CLI does not know is
//! refused by name, never ignored, so a typo (`selector:` for `selectors:`) cannot silently
//! create an entry without what the operator meant.
//!
//! ```yaml
//! - spiffe_id: spiffe://example.org/web
//!   parent: node-1            # node ID or node SPIFFE ID, or nodeset:NAME
//!   selectors: [unix:uid:1000]
//!   ttl: 1h                   # optional: a duration ("10m") or seconds (600)
//!   dns_names: [web.example.org]
//!   jwt_ttl: 10m              # optional: the entry's JWT-SVID lifetime, as ttl
//!   federates_with: [partner.example]  # optional: foreign trust domains' bundles
//! ```

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, anyhow};
use serde::Deserialize;
use signet_client::admin::NewEntry;

/// One entry as the file spells it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    spiffe_id: String,
    parent: String,
    selectors: Vec<String>,
    #[serde(default)]
    ttl: Option<Ttl>,
    #[serde(default)]
    dns_names: Vec<String>,
    #[serde(default)]
    jwt_ttl: Option<Ttl>,
    #[serde(default)]
    federates_with: Vec<String>,
}

/// `ttl:` as a duration string (`--ttl`'s syntax) or a number of seconds.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Ttl {
    Seconds(u64),
    Text(String),
}

impl Ttl {
    fn seconds(&self) -> anyhow::Result<i64> {
        let d = match self {
            Ttl::Seconds(s) => Duration::from_secs(*s),
            Ttl::Text(t) => humantime::parse_duration(t).map_err(|e| anyhow!("ttl {t:?}: {e}"))?,
        };
        if d.as_secs() == 0 {
            return Err(anyhow!(
                "ttl must be at least one second (leave it out for the default)"
            ));
        }
        Ok(i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
    }
}

/// Which parser a file gets: `.json` is JSON; anything else (`.yaml`, `.yml`, `-` for
/// standard input) is YAML, which also reads JSON.
fn is_json(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// Parses a file's text into the batch's requests, in the file's order.
pub fn parse(text: &str, json: bool) -> anyhow::Result<Vec<NewEntry>> {
    let entries: Vec<FileEntry> = if json {
        serde_json::from_str(text).map_err(|e| anyhow!("{e}"))?
    } else {
        serde_yaml::from_str(text).map_err(|e| anyhow!("{e}"))?
    };
    if entries.is_empty() {
        return Err(anyhow!("the file lists no entries"));
    }
    entries
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let ttl_seconds = match &e.ttl {
                Some(t) => t.seconds().with_context(|| format!("entry {i}"))?,
                None => 0,
            };
            let jwt_ttl_seconds = match &e.jwt_ttl {
                Some(t) => t.seconds().with_context(|| format!("entry {i}: jwt_ttl"))?,
                None => 0,
            };
            Ok(NewEntry {
                spiffe_id: e.spiffe_id,
                parent: e.parent,
                selectors: e.selectors,
                ttl_seconds,
                dns_names: e.dns_names,
                jwt_ttl_seconds,
                federates_with: e.federates_with,
            })
        })
        .collect()
}

/// Reads `path` (`-`: standard input) and parses it.
pub fn read(path: &Path) -> anyhow::Result<Vec<NewEntry>> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    parse(&text, is_json(path)).with_context(|| format!("{}", path.display()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn yaml_and_json_give_the_same_requests() {
        let yaml = "- spiffe_id: spiffe://example.org/a\n  parent: n1\n  selectors: [unix:uid:1]\n  \
                    ttl: 10m\n  dns_names: [a.example.org]\n  jwt_ttl: 2m\n- spiffe_id: spiffe://example.org/b\n  \
                    parent: n1\n  selectors:\n    - unix:uid:2\n  ttl: 600\n";
        let json = r#"[{"spiffe_id":"spiffe://example.org/a","parent":"n1","selectors":["unix:uid:1"],
            "ttl":"10m","dns_names":["a.example.org"],"jwt_ttl":120},
            {"spiffe_id":"spiffe://example.org/b","parent":"n1","selectors":["unix:uid:2"],"ttl":600}]"#;
        let a = parse(yaml, false).unwrap();
        assert_eq!(a, parse(json, true).unwrap());
        // YAML reads JSON too (standard input, other extensions).
        assert_eq!(a, parse(json, false).unwrap());
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].ttl_seconds, 600);
        assert_eq!(a[0].jwt_ttl_seconds, 120);
        assert_eq!(a[1].jwt_ttl_seconds, 0);
        assert_eq!(a[1].ttl_seconds, 600);
        assert_eq!(a[0].dns_names, ["a.example.org"]);
        assert!(a[1].dns_names.is_empty());
    }

    #[test]
    fn unknown_and_missing_fields_are_refused_by_name() {
        let typo = "- spiffe_id: spiffe://example.org/a\n  parent: n1\n  selector: [unix:uid:1]\n";
        let err = parse(typo, false).unwrap_err().to_string();
        assert!(err.contains("unknown field `selector`"), "{err}");
        let err = parse(
            r#"[{"spiffe_id":"spiffe://example.org/a","parent":"n1","selectors":[],"tll":"1h"}]"#,
            true,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown field `tll`"), "{err}");
        let err = parse(
            "- spiffe_id: spiffe://example.org/a\n  selectors: [x]\n",
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("missing field `parent`"), "{err}");
        assert!(
            parse("[]", true)
                .unwrap_err()
                .to_string()
                .contains("no entries")
        );
        let err = parse(
            "- {spiffe_id: spiffe://example.org/a, parent: n1, selectors: [x], ttl: soon}\n",
            false,
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("entry 0"), "{err:#}");
        // Not a list.
        assert!(parse("spiffe_id: x\n", false).is_err());
    }

    #[test]
    fn the_parser_follows_the_extension() {
        assert!(is_json(Path::new("e.json")));
        assert!(is_json(Path::new("e.JSON")));
        assert!(!is_json(Path::new("e.yaml")));
        assert!(!is_json(Path::new("-")));
    }
}
