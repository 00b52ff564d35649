//! Fuzz target bodies (`fuzz/`, cargo-fuzz) for the parsers of this crate. Each function takes
//! arbitrary bytes, must never panic, and asserts the properties its parser promises. The
//! crate's unit tests replay `fuzz/corpus/<target>` and `fuzz/regressions/<target>` through the
//! same functions, so CI guards the fixes without running a fuzzer.

use std::str::FromStr;

use crate::dns::{Dns1123Label, Dns1123Subdomain, DnsLabel, DnsName};
use crate::ledger::{self, GENESIS, LedgerEntry, Verifier};
use crate::selector::{MAX_SELECTOR_LEN, Selector};
use crate::{SpiffeId, TrustDomain, pem};

/// `SpiffeId::from_str` and `TrustDomain::new`: whatever parses prints back to a string that
/// parses to the same value, and the pieces rebuild it.
pub fn spiffe_id(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(id) = SpiffeId::from_str(s) {
        let printed = id.to_string();
        let again = SpiffeId::from_str(&printed).expect("a printed SPIFFE ID parses");
        assert_eq!(again, id, "SPIFFE ID round trip");
        assert_eq!(again.to_string(), printed, "printing is stable");
        let td = id.trust_domain();
        assert_eq!(
            td.id(id.path())
                .expect("trust domain + path rebuild the ID"),
            id
        );
        assert!(id.is_member_of(td));
        assert!(id.path().is_empty() || id.path().starts_with('/'));
        let rebuilt: String = id.segments().map(|seg| format!("/{seg}")).collect();
        assert_eq!(rebuilt, id.path(), "segments rebuild the path");
        assert_eq!(TrustDomain::new(&td.id_string()).as_ref(), Ok(td));
        assert_eq!(
            SpiffeId::try_from(s).as_ref(),
            Ok(&id),
            "TryFrom agrees with FromStr"
        );
    }
    if let Ok(td) = TrustDomain::new(s) {
        let printed = td.to_string();
        assert_eq!(
            TrustDomain::new(&printed).as_ref(),
            Ok(&td),
            "bare name round trip"
        );
        assert_eq!(
            TrustDomain::new(&td.id_string()).as_ref(),
            Ok(&td),
            "trust domain ID round trip"
        );
        let id = td.id("").expect("a trust domain makes its own ID");
        assert_eq!(id.trust_domain(), &td);
        assert!(id.path().is_empty());
        assert_eq!(TrustDomain::from_str(s).as_ref(), Ok(&td));
    }
}

/// `pem::parse_certs` and `pem::parse_one`: no panic; a parsed chain encodes and parses back to
/// the same DER.
pub fn pem(data: &[u8]) {
    if let Ok(ders) = pem::parse_certs(data) {
        assert!(!ders.is_empty(), "an accepted chain has a certificate");
        let text = pem::certs_to_pem(ders.iter().map(Vec::as_slice));
        assert_eq!(
            pem::parse_certs(text.as_bytes()).as_ref(),
            Ok(&ders),
            "chain round trip"
        );
    }
    const LABELS: &[&str] = &[
        "CERTIFICATE REQUEST",
        "NEW CERTIFICATE REQUEST",
        "PRIVATE KEY",
    ];
    if let Ok((label, der)) = pem::parse_one(data, LABELS) {
        assert!(LABELS.contains(&label.as_str()), "label is one asked for");
        if label == "PRIVATE KEY" {
            return;
        }
        let text = ::pem::encode(&::pem::Pem::new(label.clone(), der.clone()));
        assert_eq!(
            pem::parse_one(text.as_bytes(), LABELS),
            Ok((label, der)),
            "block round trip"
        );
    }
    let _ = pem::parse_one(data, &[]);
}

/// Registration-entry selectors (`Selector::from_str`), one per line, as the server validates
/// them and the agent parses them: only the canonical spelling parses (print gives back the
/// very input), parse → print → parse is the identity, and an accepted selector is short and
/// free of control characters.
pub fn selector(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for line in text.split('\n').take(8) {
        let Ok(sel) = Selector::from_str(line) else {
            continue;
        };
        let printed = sel.to_string();
        assert_eq!(printed, line, "only the canonical spelling parses");
        assert_eq!(
            Selector::from_str(&printed).as_ref(),
            Ok(&sel),
            "selector round trip"
        );
        assert!(line.len() <= MAX_SELECTOR_LEN);
        assert!(!line.chars().any(char::is_control));
        assert_eq!(sel.is_kubernetes(), line.starts_with("k8s:"));
    }
}

/// DNS names and Kubernetes names (`dns`), one per line: each type's `is_valid` agrees with
/// its constructor, what is built prints as written, and the types nest as documented: an RFC
/// 1123 label is a one-label subdomain and an LDH label; a subdomain is lowercase, at most 253,
/// every label an RFC 1123 label, and a DNS name unless it reads as an IP address.
pub fn dns_names(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for line in text.split('\n').take(8) {
        let name = DnsName::new(line);
        let label = DnsLabel::new(line);
        let k8s_label = Dns1123Label::new(line);
        let sub = Dns1123Subdomain::new(line);
        assert_eq!(name.is_ok(), DnsName::is_valid(line));
        assert_eq!(label.is_ok(), DnsLabel::is_valid(line));
        assert_eq!(k8s_label.is_ok(), Dns1123Label::is_valid(line));
        assert_eq!(sub.is_ok(), Dns1123Subdomain::is_valid(line));
        for printed in [
            name.as_ref().ok().map(ToString::to_string),
            label.as_ref().ok().map(ToString::to_string),
            k8s_label.as_ref().ok().map(ToString::to_string),
            sub.as_ref().ok().map(ToString::to_string),
        ]
        .into_iter()
        .flatten()
        {
            assert_eq!(printed, line, "kept as written");
        }
        if k8s_label.is_ok() {
            assert!(label.is_ok() && sub.is_ok(), "a 1123 label is a subdomain");
        }
        if label.is_ok() {
            assert!(line.parse::<std::net::IpAddr>().is_ok() || name.is_ok());
        }
        let by_labels = !line.is_empty()
            && line.len() <= crate::dns::MAX_NAME_LEN
            && line.split('.').all(Dns1123Label::is_valid);
        assert_eq!(sub.is_ok(), by_labels, "a subdomain is 1123 labels");
        if sub.is_ok() {
            assert!(!line.bytes().any(|b| b.is_ascii_uppercase()));
            assert!(
                name.is_ok() || line.parse::<std::net::IpAddr>().is_ok(),
                "a subdomain is a DNS name"
            );
        }
    }
}

fn ledger_entry(seq: u64, data: &[u8]) -> Option<LedgerEntry> {
    let mut rest = data;
    let mut int = || {
        let mut b = [0u8; 8];
        let n = rest.len().min(8);
        b[..n].copy_from_slice(&rest[..n]);
        rest = &rest[n..];
        i64::from_le_bytes(b)
    };
    let (not_before, not_after, issued_at) = (int(), int(), int());
    let text = std::str::from_utf8(rest).ok()?;
    let mut lines = text.split('\n');
    let mut next = || lines.next().unwrap_or("").to_owned();
    let list = |s: String| -> Vec<String> {
        if s.is_empty() {
            Vec::new()
        } else {
            s.split(',').map(str::to_owned).collect()
        }
    };
    let serial = next();
    let spiffe_id = next();
    let dns_names = list(next());
    let ip_addresses = list(next());
    let sha_seed = next();
    Some(LedgerEntry {
        seq,
        serial,
        spiffe_id,
        dns_names,
        ip_addresses,
        not_before,
        not_after,
        cert_sha256: ledger::sha256(sha_seed.as_bytes()),
        ca_key_id: next(),
        caller: next(),
        issued_at,
        request_id: next(),
        provenance: next(),
    })
}

/// The ledger's hash chain (`ledger::chain_hash`, `Verifier`), which `signetctl ledger verify`
/// runs over rows anyone with database access may have written. Input: two rows separated by a
/// `0xff` byte (each: `not_before`, `not_after`, `issued_at` as 8 bytes little endian, then
/// lines). Different rows never hash alike (the encoding is unambiguous), a chain built from
/// them verifies, and swapping or altering a row breaks it.
pub fn ledger(data: &[u8]) {
    let (a, b) = match data.iter().position(|x| *x == 0xff) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let (Some(a), Some(b)) = (ledger_entry(1, a), ledger_entry(1, b)) else {
        return;
    };
    if a != b {
        assert_ne!(
            ledger::chain_hash(&GENESIS, &a),
            ledger::chain_hash(&GENESIS, &b),
            "two different rows hash alike"
        );
    }
    let b = LedgerEntry { seq: 2, ..b };
    let ha = ledger::chain_hash(&GENESIS, &a);
    let hb = ledger::chain_hash(&ha, &b);
    let mut v = Verifier::default();
    v.push(&a, &GENESIS, &ha).expect("a fresh chain verifies");
    v.push(&b, &ha, &hb).expect("a fresh chain verifies");
    assert_eq!(v.clone().finish(2, &hb), Ok(2));
    assert!(v.finish(1, &ha).is_err(), "a truncated head verifies");
    let mut swapped = Verifier::default();
    assert!(
        swapped.push(&b, &GENESIS, &hb).is_err(),
        "rows out of order verify"
    );
    let altered = LedgerEntry {
        not_after: a.not_after.wrapping_add(1),
        ..a.clone()
    };
    assert!(
        Verifier::default().push(&altered, &GENESIS, &ha).is_err(),
        "an altered row verifies"
    );
}

/// `checkpoint::SignedCheckpoint::from_json` (a checkpoint file or `/checkpoint` answer, which
/// an auditor fetches from anywhere) and its verification with a fixed key: whatever parses
/// prints back to JSON that parses to the same value; a version 2 checkpoint never names a
/// previous checkpoint above itself; a parsed checkpoint whose signature verifies with the
/// fixed key only when the fuzzer found a genuine one, which (the key's seed being public
/// here) re-signing reproduces exactly.
pub fn checkpoint(data: &[u8]) {
    use crate::checkpoint::{PublicKey, SignedCheckpoint, sign};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cp) = SignedCheckpoint::from_json(text) else {
        return;
    };
    let again = SignedCheckpoint::from_json(&cp.to_json()).expect("printed checkpoint parses");
    assert_eq!(again, cp, "parse → print → parse is the identity");
    if let Some(p) = cp.head.previous {
        assert!(
            p.seq < cp.head.seq || p == cp.head.mark(),
            "a checkpoint names a previous one above itself"
        );
    }
    let Ok(key) = ring::signature::Ed25519KeyPair::from_seed_unchecked(&[7; 32]) else {
        return;
    };
    let Ok(public) = PublicKey::from_raw(ring::signature::KeyPair::public_key(&key).as_ref())
    else {
        return;
    };
    if let Ok(v) = public.verify(&cp) {
        assert_eq!(v.head(), &cp.head);
        assert_eq!(sign(&key, cp.head.clone()).signature, cp.signature);
    }
}

pub mod replay {
    //! Replays the committed corpora and regressions (`fuzz/` at the workspace root); every
    //! crate's `fuzz_corpora_replay` test uses it.
    use std::path::{Path, PathBuf};

    /// Every file of `fuzz/corpus/<target>` and `fuzz/regressions/<target>`.
    pub fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
        let mut out = Vec::new();
        for dir in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                if path.is_file() {
                    let data = std::fs::read(&path).expect("read corpus file");
                    out.push((path, data));
                }
            }
        }
        out.sort();
        out
    }

    /// Runs `f` over every input of `target`, naming the file that panicked; an empty
    /// corpus fails.
    pub fn replay(target: &str, f: fn(&[u8])) -> usize {
        let inputs = inputs(target);
        assert!(!inputs.is_empty(), "fuzz/corpus/{target} is empty");
        for (path, data) in &inputs {
            if std::panic::catch_unwind(|| f(data)).is_err() {
                panic!("fuzz target {target} panicked on {}", path.display());
            }
        }
        inputs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::replay::replay;

    #[test]
    fn fuzz_corpora_replay() {
        assert!(
            replay("spiffe_id", super::spiffe_id) > 0,
            "spiffe_id corpus"
        );
        assert!(replay("pem", super::pem) > 0, "pem corpus");
        assert!(replay("ledger", super::ledger) > 0, "ledger corpus");
        assert!(
            replay("checkpoint", super::checkpoint) > 0,
            "checkpoint corpus"
        );
        assert!(replay("selector", super::selector) > 0, "selector corpus");
        assert!(
            replay("dns_names", super::dns_names) > 0,
            "dns_names corpus"
        );
    }

    /// The checkpoint corpus holds genuinely signed checkpoints of both versions (signed with
    /// the target's fixed key), so the fuzzer starts past the signature check.
    #[test]
    fn checkpoint_corpus_has_genuine_checkpoints() {
        use crate::checkpoint::{PublicKey, SignedCheckpoint};
        let key = ring::signature::Ed25519KeyPair::from_seed_unchecked(&[7; 32]).unwrap();
        let public =
            PublicKey::from_raw(ring::signature::KeyPair::public_key(&key).as_ref()).unwrap();
        let genuine: Vec<_> = super::replay::inputs("checkpoint")
            .into_iter()
            .filter_map(|(_, d)| SignedCheckpoint::from_json(std::str::from_utf8(&d).ok()?).ok())
            .filter(|c| public.verify(c).is_ok())
            .map(|c| c.head.format())
            .collect();
        assert!(
            genuine.contains(&crate::checkpoint::FORMAT_V1),
            "{genuine:?}"
        );
        assert!(
            genuine.contains(&crate::checkpoint::FORMAT_V2),
            "{genuine:?}"
        );
    }

    #[test]
    fn spiffe_id_samples() {
        for s in [
            "spiffe://example.org/ns/default/sa/web",
            "SPIFFE://Example.ORG/A",
            "spiffe://example.org",
            "spiffe://example.org/",
            "spiffe://ex%61mple.org/a",
            "",
        ] {
            super::spiffe_id(s.as_bytes());
        }
    }
}
