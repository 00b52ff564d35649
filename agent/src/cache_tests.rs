use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use super::*;
use crate::state::{FederatedBundle as ServedFederated, Identity};
use crate::testing::TestCa;
use signet_runtime::clock::{Clock, SystemClock};

fn node() -> NodeIdentity {
    crate::testing::self_signed_svid(
        "spiffe://example.org/signet/node/n1",
        SystemClock.now(),
        Duration::from_secs(3600),
    )
}

fn entry(id: &str, spiffe_id: &str) -> EntrySpec {
    EntrySpec {
        id: id.into(),
        spiffe_id: spiffe_id.parse().expect("id"),
        parent_id: "spiffe://example.org/signet/node/n1".into(),
        selectors: vec![Selector::Uid(1000), "unix:gid:5".parse().expect("sel")],
        ttl: Duration::from_secs(600),
        dns_names: vec!["web.example".into()],
        revision: 7,
        federates_with: vec!["partner.org".parse().expect("td")],
    }
}

/// An SVID `ca` issued for `spiffe_id`, valid from a minute ago for `ttl`.
fn svid(ca: &TestCa, spiffe_id: &str, serial: u64, ttl: Duration) -> Arc<X509Svid> {
    let nb = SystemClock.now() - Duration::from_secs(60);
    let (der, key) = ca.leaf(spiffe_id, serial, nb, ttl);
    Arc::new(X509Svid::from_der(vec![der], &key.serialize_der()).expect("svid"))
}

fn jwt_key(kid: &str) -> JwtPublicKey {
    let key = signet_pki::generate(signet_pki::KeyAlgorithm::EcdsaP256).expect("key");
    let spki = key.public_key_der().expect("spki");
    JwtPublicKey::from_spki(kid, Some(JwtAlg::Es256), &spki).expect("jwt key")
}

struct Fixture {
    ca: TestCa,
    entries: Vec<EntrySpec>,
    state: AgentState,
}

/// Two entries, each with an SVID from `ca` lasting `ttl`; the bundle is `ca`'s root.
fn fixture(ttl: Duration) -> Fixture {
    let ca = TestCa::new("root");
    let entries = vec![
        entry("e1", "spiffe://example.org/web"),
        entry("e2", "spiffe://example.org/db"),
    ];
    let identities = entries
        .iter()
        .enumerate()
        .map(|(i, e)| Identity {
            entry_id: e.id.clone(),
            selectors: e.selectors.clone(),
            svid: svid(&ca, &e.spiffe_id.to_string(), i as u64 + 1, ttl),
            federates_with: e.federates_with.clone(),
        })
        .collect();
    let state = AgentState {
        identities,
        bundle_der: vec![ca.der.clone()].into(),
        trust_domain_id: "spiffe://example.org".into(),
        crls_der: vec![ca.crl(1, &[9])].into(),
        jwt_keys: vec![jwt_key("k1")].into(),
        jwt_tainted: vec!["k0".to_owned()].into(),
        federated: vec![ServedFederated {
            trust_domain: "partner.org".parse().expect("td"),
            roots_der: vec![TestCa::new("partner").der].into(),
            jwt_keys: vec![jwt_key("p1")].into(),
        }]
        .into(),
    };
    Fixture { ca, entries, state }
}

fn save_fixture(dir: &Path, node: &NodeIdentity, f: &Fixture) {
    let td: TrustDomain = "example.org".parse().expect("td");
    let snap = Snapshot {
        revision: 42,
        entries: &f.entries,
        trust_domain: &td,
        state: &f.state,
        banned: None,
    };
    save(dir, node, &snap, SystemClock.now()).expect("save");
}

fn found(l: Loaded) -> Restored {
    match l {
        Loaded::Found(r) => *r,
        other => panic!("unexpected {other:?}"),
    }
}

fn refused(l: Loaded) -> CacheError {
    match l {
        Loaded::Refused(e) => e,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn what_is_saved_loads_back_checked() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let n = node();
    assert!(matches!(load(&dir, &n, SystemClock.now()), Loaded::Absent));
    let f = fixture(Duration::from_secs(3600));
    save_fixture(&dir, &n, &f);
    let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join(CACHE_FILE)), 0o600);
    // The keys are sealed: no private key, no SPIFFE ID in the clear.
    let raw = std::fs::read(dir.join(CACHE_FILE)).expect("read");
    let key = f.state.identities[0].svid.key().pkcs8_der();
    assert!(!raw.windows(key.len()).any(|w| w == key));
    assert!(!raw.windows(3).any(|w| w == b"web"));

    let r = found(load(&dir, &n, SystemClock.now()));
    assert_eq!(r.revision, 42);
    assert_eq!(r.entries, f.entries);
    assert_eq!(*r.bundle, *f.state.bundle_der);
    assert_eq!(*r.crls, *f.state.crls_der);
    assert_eq!(*r.jwt_keys, *f.state.jwt_keys);
    assert_eq!(r.jwt_tainted, ["k0"]);
    assert_eq!(r.federated.len(), 1);
    assert_eq!(r.federated[0].trust_domain.as_str(), "partner.org");
    assert_eq!(
        r.federated[0].x509_authorities,
        *f.state.federated[0].roots_der
    );
    assert_eq!(
        *r.federated[0].jwt_authorities,
        *f.state.federated[0].jwt_keys
    );
    let served: Vec<_> = r.svids.iter().map(|(id, s)| (id.as_str(), s)).collect();
    assert_eq!(served.len(), 2);
    for (id, s) in served {
        let want = f
            .state
            .identities
            .iter()
            .find(|i| i.entry_id == id)
            .expect("identity");
        assert_eq!(s, want.svid.as_ref());
    }
    assert_eq!((r.expired, r.dropped.len()), (0, 0));
    // Saved again, no temporary file is left behind.
    save_fixture(&dir, &n, &f);
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    assert_eq!(names, [FLOOR_FILE, CACHE_FILE]);
}

#[test]
fn a_modified_file_is_refused_whole() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let n = node();
    save_fixture(tmp.path(), &n, &fixture(Duration::from_secs(3600)));
    let path = tmp.path().join(CACHE_FILE);
    let good = std::fs::read(&path).expect("read");
    let with = |bytes: &[u8]| {
        std::fs::write(&path, bytes).expect("write");
        refused(load(tmp.path(), &n, SystemClock.now()))
    };
    // A bit flipped anywhere in the sealed part: the nonce, the ciphertext, the tag.
    for at in [HEADER_LEN - 1, HEADER_LEN, good.len() / 2, good.len() - 1] {
        let mut bad = good.clone();
        bad[at] ^= 0x01;
        assert!(
            matches!(with(&bad), CacheError::Tampered { .. }),
            "byte {at}"
        );
    }
    // The header: another magic, another key ID.
    let mut bad = good.clone();
    bad[0] ^= 0x01;
    assert!(matches!(with(&bad), CacheError::Format { .. }));
    let mut bad = good.clone();
    bad[MAGIC.len()] ^= 0x01;
    assert!(matches!(with(&bad), CacheError::OtherKey { .. }));
    // Truncated (a crash cannot do it, a full disk or a copy can), or extended.
    for len in [
        0,
        7,
        HEADER_LEN,
        HEADER_LEN + 1,
        good.len() - 16,
        good.len() - 1,
    ] {
        let e = with(&good[..len]);
        assert!(
            matches!(e, CacheError::Format { .. } | CacheError::Tampered { .. }),
            "{len}: {e}"
        );
    }
    let mut longer = good.clone();
    longer.push(0);
    let e = with(&longer);
    assert!(e.to_string().contains("fails authentication"), "{e}");
    assert!(e.to_string().contains("nothing in it is served"), "{e}");
    // The good file still loads.
    std::fs::write(&path, &good).expect("write");
    found(load(tmp.path(), &n, SystemClock.now()));
}

#[test]
fn another_node_key_cannot_read_or_forge_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (ours, theirs) = (node(), node());
    save_fixture(tmp.path(), &ours, &fixture(Duration::from_secs(3600)));
    let e = refused(load(tmp.path(), &theirs, SystemClock.now()));
    assert!(matches!(e, CacheError::OtherKey { .. }), "{e}");
    // A file sealed under another key, with our key ID copied into its header, fails
    // authentication.
    let ours_file = std::fs::read(tmp.path().join(CACHE_FILE)).expect("read");
    save_fixture(tmp.path(), &theirs, &fixture(Duration::from_secs(3600)));
    let mut theirs_file = std::fs::read(tmp.path().join(CACHE_FILE)).expect("read");
    theirs_file[MAGIC.len()..MAGIC.len() + KEY_ID_LEN]
        .copy_from_slice(&ours_file[MAGIC.len()..MAGIC.len() + KEY_ID_LEN]);
    std::fs::write(tmp.path().join(CACHE_FILE), &theirs_file).expect("write");
    assert!(matches!(
        refused(load(tmp.path(), &ours, SystemClock.now())),
        CacheError::Tampered { .. }
    ));
}

#[test]
fn expired_svids_are_dropped_and_foreign_ones_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let n = node();
    let mut f = fixture(Duration::from_secs(120));
    // A third entry whose SVID another CA signed: it does not chain to the cached bundle.
    let other = TestCa::new("other");
    f.entries.push(entry("e3", "spiffe://example.org/x"));
    f.state.identities = f
        .state
        .identities
        .iter()
        .cloned()
        .chain([Identity {
            entry_id: "e3".into(),
            selectors: vec![Selector::Uid(1)],
            svid: svid(
                &other,
                "spiffe://example.org/x",
                3,
                Duration::from_secs(3600),
            ),
            federates_with: vec![],
        }])
        .collect();
    save_fixture(tmp.path(), &n, &f);
    let r = found(load(tmp.path(), &n, SystemClock.now()));
    assert_eq!(r.svids.len(), 2, "the two from the bundle's CA");
    assert_eq!(r.dropped.len(), 1);
    assert_eq!(r.dropped[0].0, "e3");
    assert!(r.dropped[0].1.contains("trust bundle"), "{:?}", r.dropped);
    // Two minutes later the two have expired: dropped, never served.
    let later = found(load(
        tmp.path(),
        &n,
        SystemClock.now() + Duration::from_secs(180),
    ));
    assert!(later.svids.is_empty());
    assert_eq!(later.expired, 2);
    assert_eq!(
        later.entries.len(),
        3,
        "the entries stay, to be signed again"
    );
    drop(f.ca);
}

#[test]
fn a_directory_others_can_write_is_not_trusted() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let n = node();
    save_fixture(tmp.path(), &n, &fixture(Duration::from_secs(3600)));
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o770)).expect("chmod");
    let e = refused(load(tmp.path(), &n, SystemClock.now()));
    let shown = e.to_string();
    assert!(matches!(e, CacheError::UnsafeDir { .. }), "{shown}");
    assert!(shown.contains("mode 770"), "{shown}");
    assert!(
        shown.contains(&format!("chmod 0700 {}", tmp.path().display())),
        "{shown}"
    );
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    found(load(tmp.path(), &n, SystemClock.now()));
}

#[test]
fn another_trust_domain_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let n = node();
    let f = fixture(Duration::from_secs(3600));
    let td: TrustDomain = "other.org".parse().expect("td");
    let snap = Snapshot {
        revision: 1,
        entries: &f.entries,
        trust_domain: &td,
        state: &f.state,
        banned: None,
    };
    save(tmp.path(), &n, &snap, SystemClock.now()).expect("save");
    let e = refused(load(tmp.path(), &n, SystemClock.now()));
    assert!(e.to_string().contains("other.org"), "{e}");
}

#[test]
fn a_replayed_older_cache_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let n = node();
    let f = fixture(Duration::from_secs(3600));
    save_fixture(&dir, &n, &f);
    let old = std::fs::read(dir.join(CACHE_FILE)).expect("read");
    save_fixture(&dir, &n, &f);
    assert_eq!(
        std::fs::read_to_string(dir.join(FLOOR_FILE)).expect("floor"),
        "2\n"
    );
    found(load(&dir, &n, SystemClock.now()));
    // The attacker writes the older, genuinely sealed file back (not the floor).
    std::fs::write(dir.join(CACHE_FILE), &old).expect("replay");
    let e = refused(load(&dir, &n, SystemClock.now()));
    assert!(
        matches!(
            e,
            CacheError::Replayed {
                sequence: 1,
                floor: 2,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("replayed"), "{e}");
    // Replaying the floor too is not detected (documented in SECURITY.md).
    std::fs::write(dir.join(FLOOR_FILE), "1\n").expect("floor");
    found(load(&dir, &n, SystemClock.now()));
}

#[test]
fn a_cache_file_others_can_write_or_a_link_is_not_trusted() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("data");
    let n = node();
    save_fixture(&dir, &n, &fixture(Duration::from_secs(3600)));
    let path = dir.join(CACHE_FILE);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    found(load(&dir, &n, SystemClock.now()));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let e = refused(load(&dir, &n, SystemClock.now()));
    assert!(matches!(e, CacheError::UnsafeFile { .. }), "{e}");
    assert!(e.to_string().contains("chmod 0600"), "{e}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o620)).expect("chmod");
    assert!(matches!(
        refused(load(&dir, &n, SystemClock.now())),
        CacheError::UnsafeFile { .. }
    ));
    // A symbolic link to a genuine cache elsewhere is not followed.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::rename(&path, &elsewhere).expect("move");
    std::os::unix::fs::symlink(&elsewhere, &path).expect("symlink");
    assert!(matches!(
        load(&dir, &n, SystemClock.now()),
        Loaded::Refused(_)
    ));
}

#[test]
fn the_ban_is_saved_and_restored() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let n = node();
    let f = fixture(Duration::from_secs(3600));
    let td: TrustDomain = "example.org".parse().expect("td");
    let since = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let snap = Snapshot {
        revision: 1,
        entries: &f.entries,
        trust_domain: &td,
        state: &f.state,
        banned: Some(("n1", since)),
    };
    save(tmp.path(), &n, &snap, SystemClock.now()).expect("save");
    let r = found(load(tmp.path(), &n, SystemClock.now()));
    assert_eq!(r.banned, Some(("n1".to_owned(), since)));
    save(
        tmp.path(),
        &n,
        &Snapshot {
            banned: None,
            ..snap
        },
        SystemClock.now(),
    )
    .expect("save");
    assert_eq!(found(load(tmp.path(), &n, SystemClock.now())).banned, None);
}
