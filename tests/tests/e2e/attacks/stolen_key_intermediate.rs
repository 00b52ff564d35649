//! A thief holds an intermediate's private key (here: a copy of the database and the
//! key-encryption key, as from a stolen backup) and mints leaves of any SPIFFE ID with it. The
//! operator follows the README's walkthrough to the letter: prepare, activate, taint, revoke
//! what the key issued, remove it. Issue 24, finding 2: afterwards the forged leaf must fail
//! `openssl verify -x509_strict -crl_check_all` against the bundle and the CRLs Signet
//! publishes, because the root's CRL lists the intermediate (cACompromise), and keeps listing
//! it after the intermediate is removed.

use std::path::Path;

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use signet_proto::ca::GetBundleRequest;
use signet_tests::*;

use super::support::{istio_chain, psql_one};

use crate::agent::eventually;

fn ctl(server: &Server, args: &[&str]) -> String {
    let out = server.signetctl(args);
    assert!(
        out.status.success(),
        "signetctl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the thief does with the database row and the key-encryption key: open the sealed key
/// (AES-256-GCM: nonce, ciphertext, tag; associated data binding the row, see the server's
/// `ca::manager::vetting`).
fn steal_key(url: &str, data_dir: &Path, id: &str) -> (String, Vec<u8>) {
    let row = psql_one(
        url,
        &format!(
            "SELECT encode(encrypted_key, 'hex') || ' ' || parent_id || ' ' || \
             encode(convert_to(cert_pem, 'UTF8'), 'base64') FROM ca_keys WHERE id = '{id}'"
        ),
    );
    let mut parts = row.split_whitespace();
    let sealed = hex::decode(parts.next().unwrap()).unwrap();
    let parent = parts.next().unwrap().to_owned();
    let b64: String = parts.collect();
    use base64::Engine as _;
    let cert_pem = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
    )
    .unwrap();
    let cert_der = signet_types::pem::parse_certs(cert_pem.as_bytes())
        .unwrap()
        .remove(0);
    let kek = base64::engine::general_purpose::STANDARD
        .decode(
            std::fs::read_to_string(data_dir.join("kek"))
                .unwrap()
                .trim(),
        )
        .unwrap();
    let mut aad = b"signet-ca-slot-v2\0".to_vec();
    for part in [id, "intermediate", parent.as_str()] {
        aad.extend_from_slice(&(part.len() as u64).to_be_bytes());
        aad.extend_from_slice(part.as_bytes());
    }
    aad.extend_from_slice(ring::digest::digest(&ring::digest::SHA256, &cert_der).as_ref());
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &kek).unwrap());
    let (nonce, body) = sealed.split_at(NONCE_LEN);
    let mut body = body.to_vec();
    let pkcs8 = key
        .open_in_place(
            Nonce::try_assume_unique_for_key(nonce).unwrap(),
            Aad::from(&aad),
            &mut body,
        )
        .expect("the thief opens the key")
        .to_vec();
    (cert_pem, pkcs8)
}

/// A leaf for `spiffe_id` signed with the stolen key: no ledger row, no serial Signet knows.
fn forge(int_pem: &str, pkcs8: &[u8]) -> (String, String) {
    let ca_key = rcgen::KeyPair::try_from(pkcs8).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(int_pem, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
    p.subject_alt_names.push(rcgen::SanType::URI(
        "spiffe://example.org/ns/payments/sa/admin"
            .try_into()
            .unwrap(),
    ));
    p.not_before = rcgen::date_time_ymd(2026, 1, 1);
    p.not_after = rcgen::date_time_ymd(2036, 1, 1);
    p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.use_authority_key_identifier_extension = true;
    (
        p.signed_by(&key, &issuer).unwrap().pem(),
        key.serialize_pem(),
    )
}

/// Every CRL the server publishes (its `<data_dir>/crl/*.crl`), as one PEM file.
fn published_crls(data_dir: &Path, out: &Path) {
    let mut pem = String::new();
    for e in std::fs::read_dir(data_dir.join("crl")).unwrap() {
        let der = std::fs::read(e.unwrap().path()).unwrap();
        pem.push_str(&pem::encode(&pem::Pem::new("X509 CRL", der)));
    }
    std::fs::write(out, pem).unwrap();
}

/// `openssl verify -x509_strict -crl_check_all` of `leaf` through `int_pem` to the bundle.
fn verify_with_crls(server: &Server, int_pem: &str, leaf: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let (untrusted, leaf_path, crls) = (
        dir.path().join("int.pem"),
        dir.path().join("leaf.pem"),
        dir.path().join("crls.pem"),
    );
    std::fs::write(&untrusted, int_pem).unwrap();
    std::fs::write(&leaf_path, leaf).unwrap();
    published_crls(&server.data_dir, &crls);
    let out = std::process::Command::new("openssl")
        .args(["verify", "-x509_strict", "-crl_check_all", "-CAfile"])
        .arg(server.bundle_path())
        .arg("-untrusted")
        .arg(&untrusted)
        .arg("-CRLfile")
        .arg(&crls)
        .arg(&leaf_path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(())
    } else {
        Err(text)
    }
}

#[tokio::test]
async fn a_stolen_intermediate_is_cut_off_by_its_roots_crl_after_the_walkthrough() {
    let tokens = TokenIssuer::new("k1");
    let Some(url) = signet_testutil::fresh_postgres_database().await else {
        return;
    };
    let server = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        tokens: Some(tokens.jwks_json()),
        extra_toml: "[ca]\nrotation_interval = \"200ms\"\n".into(),
        ..ServerOpts::default()
    })
    .await;
    let st: serde_json::Value =
        serde_json::from_str(&ctl(&server, &["ca", "status", "--json"])).unwrap();
    let old = st["active_key_id"].as_str().unwrap().to_owned();
    let root = st["slots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == "root")
        .unwrap()["key_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // The theft, and what it buys before anyone notices: a leaf of any identity that verifies
    // with CRL checking.
    let (int_pem, pkcs8) = steal_key(&url, &server.data_dir, &old);
    let (forged, forged_key) = forge(&int_pem, &pkcs8);
    verify_with_crls(&server, &int_pem, &forged).expect("the forged leaf verifies before");

    // The walkthrough.
    let new = ctl(&server, &["ca", "prepare"]);
    let new = new.split_whitespace().last().unwrap().to_owned();
    ctl(&server, &["ca", "activate", &new]);
    ctl(&server, &["ca", "taint", &old]);
    ctl(
        &server,
        &[
            "certs",
            "revoke",
            "--ca-key",
            &old,
            "--reason",
            "keyCompromise",
        ],
    );
    ctl(&server, &["ca", "revoke", &old]);

    // The root's CRL lists the intermediate, published where leaf CRLs go (HTTP, files, the
    // bundle), and openssl refuses the forged leaf because of it.
    let why = eventually(10, "the forged leaf refused", || async {
        verify_with_crls(&server, &int_pem, &forged).err()
    })
    .await;
    assert!(why.contains("certificate revoked"), "{why}");
    // The server's mTLS does not take it either: the handshake refuses a chain through the
    // removed intermediate (the root is an anchor, but a leaf must be signed by a live key).
    let der = |pem: &str| {
        signet_types::pem::parse_certs(pem.as_bytes())
            .unwrap()
            .remove(0)
    };
    let holder = super::support::identity(&[der(&forged), der(&int_pem)], &forged_key);
    let refused = super::support::renew_over_mtls(&server, &holder, 0, &[])
        .await
        .expect_err("a forged leaf authenticated");
    assert!(
        !refused.message().contains("ledger"),
        "the TLS handshake let it through to the ledger check: {refused:?}"
    );
    let (code, _) = server.http_get(&format!("/crl/{root}.crl")).await;
    assert_eq!(code, 200, "the root's CRL over HTTP");
    // The taint signal stays while the old key's certificates may be held.
    let b = server
        .native()
        .await
        .get_bundle(GetBundleRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        b.tainted_key_ids.contains(&old),
        "the tainted key ID is still announced: {:?}",
        b.tainted_key_ids
    );
    assert!(
        b.crls.iter().any(|c| c.key_id == root),
        "the root's CRL is in the bundle (GetBundle, WatchBundle, agents)"
    );
    // A leaf of the new intermediate still verifies with the same CRLs (the legitimate path).
    let new_pem = psql_one(
        &url,
        &format!("SELECT cert_pem FROM ca_keys WHERE id = '{new}'"),
    );
    let chain = istio_chain(&server, &tokens).await;
    assert_eq!(
        chain[1].trim(),
        new_pem.trim(),
        "issued by the new intermediate"
    );
    verify_with_crls(&server, &new_pem, &chain[0]).expect("a current leaf verifies");
}
