//! Fuzz target bodies (`fuzz/`, cargo-fuzz) for every parser of hostile input in the agent:
//! its configuration, the Workload API requests a local process sends, the selectors and
//! passwd lines it matches callers with, and the server's answers (which a network attacker
//! may try to forge).
//!
//! Each function takes arbitrary bytes, must never panic, and asserts the properties its
//! parser promises. The fuzzer (`fuzz/fuzz_targets/<name>.rs`) and the replay test below call
//! the same function over `fuzz/corpus/<name>` and `fuzz/regressions/<name>`.

use std::str::FromStr;

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use prost::Message;
use signet_proto::workload as pb;
use signet_types::TrustDomain;

use crate::bundle::{self, Decision};
use crate::ca::{EntrySpec, TrustBundle};
use crate::config::Config;
use crate::state::Selector;
use crate::workload::{SECURITY_HEADER, WorkloadApi};
use signet_pki::SvidCertificate;

fn utf8(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// The agent's TOML configuration, loaded as `Config::load` does (defaults, then the file,
/// without the environment) and validated.
pub fn config(data: &[u8]) {
    let Some(text) = utf8(data) else {
        return;
    };
    let loaded: Result<Config, _> = Figment::from(Serialized::defaults(Config::default()))
        .merge(Toml::string(text))
        .extract();
    let Ok(cfg) = loaded else {
        return;
    };
    if cfg.validate().is_ok() {
        assert!(cfg.renew_fraction > 0.0 && cfg.renew_fraction < 0.9);
        assert!(!cfg.sync_interval.is_zero());
    }
    let _ = format!("{cfg:?}");
}

/// A Workload API request as a local process sends it: the message (the first byte picks
/// which) and the security header (the second byte: absent, once, twice; then the value).
/// Requests without `workload.spiffe.io: true` are InvalidArgument, whatever else they hold.
pub fn workload(data: &[u8]) {
    let [which, header_mode, rest @ ..] = data else {
        return;
    };
    let (value, msg) = match rest.iter().position(|b| *b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    match which % 5 {
        0 => check_header(pb::X509svidRequest::decode(msg), *header_mode, value),
        1 => check_header(pb::X509BundlesRequest::decode(msg), *header_mode, value),
        2 => check_header(pb::JwtsvidRequest::decode(msg), *header_mode, value),
        3 => check_header(pb::JwtBundlesRequest::decode(msg), *header_mode, value),
        _ => check_header(pb::ValidateJwtsvidRequest::decode(msg), *header_mode, value),
    }
}

fn check_header<T>(decoded: Result<T, prost::DecodeError>, mode: u8, value: &[u8]) {
    let Ok(msg) = decoded else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    let Ok(v) = http::HeaderValue::from_bytes(value) else {
        return;
    };
    let name = http::HeaderName::from_static(SECURITY_HEADER);
    let mode = mode % 3;
    match mode {
        0 => {}
        1 => {
            headers.insert(name, v.clone());
        }
        _ => {
            headers.append(name.clone(), v.clone());
            headers.append(name, http::HeaderValue::from_static("true"));
        }
    }
    let req = tonic::Request::from_parts(
        tonic::metadata::MetadataMap::from_headers(headers),
        http::Extensions::default(),
        msg,
    );
    let present = mode != 0 && v.as_bytes() == b"true";
    match WorkloadApi::peer(&req) {
        Ok(_) => panic!("a request without an attested caller was served"),
        Err(status) => assert_eq!(
            status.code() == tonic::Code::InvalidArgument,
            !present,
            "security header {value:?} (mode {mode}) gave {status:?}"
        ),
    }
}

/// The agent's selectors (`unix:uid:1000`, …): what parses prints back to a string that parses
/// to the same selector. Then passwd-format lines, as `unix:user:` resolves them: the second
/// line on is the file, the first the user name looked up.
pub fn selector(data: &[u8]) {
    let Some(text) = utf8(data) else {
        return;
    };
    for line in text.lines().take(8) {
        if let Ok(sel) = Selector::from_str(line) {
            let printed = sel.to_string();
            assert_eq!(
                Selector::from_str(&printed).as_ref(),
                Ok(&sel),
                "selector round trip via {printed:?}"
            );
        }
    }
    let (name, passwd) = text.split_once('\n').unwrap_or((text, ""));
    if let Some(uid) = crate::attest::uid_of(passwd, name) {
        let on_a_line = passwd.lines().filter(|l| !l.starts_with('#')).any(|l| {
            let mut f = l.split(':');
            f.next() == Some(name) && f.nth(1).and_then(|u| u.parse().ok()) == Some(uid)
        });
        assert!(
            on_a_line,
            "uid {uid} for {name:?} is not on one of its lines"
        );
    }
}

/// The server's answers, as the agent takes them (the first byte picks the message): the
/// certificates of node and workload SVIDs (`signet_pki`'s parser, which `signet_client`'s
/// conversion runs), registration entries (`signet_client`'s conversion, then the agent's
/// selectors), the trust bundle (`signet_client`'s) and what the agent decides to do with it.
/// Accepted answers hold what the conversions promise.
pub fn server_responses(data: &[u8]) {
    use signet_proto::agent as pb_agent;
    use signet_proto::ca as pb_ca;
    let Some((&which, msg)) = data.split_first() else {
        return;
    };
    match which % 5 {
        0 => {
            if let Ok(s) = pb_agent::Svid::decode(msg) {
                check_svid(SvidCertificate::from_chain_der(s.cert_chain));
            }
        }
        1 => {
            if let Ok(r) = pb_agent::AttestResponse::decode(msg)
                && let Some(s) = r.svid
            {
                check_svid(SvidCertificate::from_chain_der(s.cert_chain));
            }
        }
        2 => {
            if let Ok(r) = pb_agent::SyncEntriesResponse::decode(msg) {
                let n = r.entries.len();
                let entries = r
                    .entries
                    .into_iter()
                    .filter_map(|e| signet_client::node::Entry::try_from(e).ok())
                    .collect();
                let specs: Vec<EntrySpec> = crate::ca::convert_entries(entries);
                assert!(specs.len() <= n);
                for spec in &specs {
                    for s in &spec.selectors {
                        assert_eq!(Selector::from_str(&s.to_string()).as_ref(), Ok(s));
                    }
                }
            }
        }
        3 => {
            if let Ok(b) = pb_ca::Bundle::decode(msg) {
                let Ok(bundle) = TrustBundle::try_from(b) else {
                    return;
                };
                assert!(!bundle.roots_der.is_empty(), "a bundle without roots");
                let td = TrustDomain::new("cluster.local").expect("fixed trust domain");
                match bundle::decide(&td, &[], &bundle) {
                    Decision::Replace(roots) => {
                        assert_eq!(bundle.trust_domain, td);
                        assert_eq!(roots, bundle.roots_der);
                    }
                    Decision::Reject(_) => assert_ne!(bundle.trust_domain, td),
                    Decision::Unchanged => panic!("no roots are unchanged from new roots"),
                }
            }
        }
        _ => {
            if let Ok(r) = pb_agent::SignWorkloadsResponse::decode(msg) {
                for result in r.results {
                    if let Some(s) = result.svid {
                        check_svid(SvidCertificate::from_chain_der(s.cert_chain));
                    }
                }
            }
        }
    }
}

fn check_svid(s: Result<SvidCertificate, signet_pki::SvidError>) {
    if let Ok(svid) = s {
        assert!(!svid.chain_der().is_empty(), "an SVID without certificates");
        assert!(svid.not_after() >= svid.not_before());
    }
}

/// What the Kubernetes workload attestor reads about a caller: its `/proc/<pid>/cgroup`
/// (first byte even) or a PodList from the kubelet or API server (first byte odd).
///
/// A pod UID only ever comes from a root-owned cgroup root, in canonical form (a UUID, or a
/// static pod's 32-hex hash); the same path
/// under a user's delegated subtree (`user.slice/…/user@<uid>.service`, where the user names
/// the cgroups) never names a pod; container IDs are hex; an accepted PodList gives every pod
/// a service account.
pub fn k8s_workload(data: &[u8]) {
    use crate::attest::cgroup::{container_of, container_of_path};
    let Some((mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 1 {
        if let Ok(pods) = crate::attest::k8s::parse_pod_list(rest) {
            for pod in pods {
                assert!(
                    !pod.service_account.is_empty(),
                    "pod without a service account"
                );
            }
        }
        return;
    }
    let Some(text) = utf8(rest) else {
        return;
    };
    // A pod UID is a UUID, lowercase with dashes; a static pod's is its config hash: 32
    // lowercase hex digits, undashed (what its mirror pod's `kubernetes.io/config.mirror` says).
    let lower_hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    let canonical_uuid = |u: &str| {
        (u.len() == 36
            && u.char_indices().all(|(i, c)| match i {
                8 | 13 | 18 | 23 => c == '-',
                _ => lower_hex(c),
            }))
            || (u.len() == 32 && u.chars().all(lower_hex))
    };
    if let Some(c) = container_of(text) {
        if let Some(uid) = &c.pod_uid {
            assert!(c.trusted, "pod UID {uid:?} from an untrusted cgroup root");
            assert!(canonical_uuid(uid), "pod UID {uid:?} is not canonical");
        }
        if let Some(id) = &c.container_id {
            assert!(
                !id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit()),
                "container ID {id:?} is not hex"
            );
        }
    }
    for line in text.lines().take(16) {
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        // The names a user can give its own cgroups: no `.`/`..` components.
        if path.split('/').any(|p| p == "." || p == "..") {
            continue;
        }
        let delegated = format!(
            "/user.slice/user-1000.slice/user@1000.service/{}",
            path.trim_start_matches('/')
        );
        if let Some(c) = container_of_path(&delegated) {
            assert!(
                c.pod_uid.is_none() && !c.trusted,
                "a user's delegated cgroup {delegated:?} claimed {c:?}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use signet_types::fuzzing::replay::replay;

    /// The committed corpora and every fixed crash, through the fuzzers' own functions.
    #[test]
    fn fuzz_corpora_replay() {
        replay("agent_config", super::config);
        replay("workload", super::workload);
        replay("selector", super::selector);
        replay("server_responses", super::server_responses);
        replay("k8s_workload", super::k8s_workload);
    }
}
