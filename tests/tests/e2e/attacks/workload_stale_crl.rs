//! Revocation reaches file consumers (issue 24, finding 6). A peer's key leaks; the operator
//! revokes its certificate as the README says. A workload that checks its peers against the
//! `crl.pem` its files sink writes (nginx's `ssl_crl`, `openssl verify -crl_check`) accepted
//! the revoked peer until its own certificate renewed: the sink wrote no `crl.pem` when the
//! CRLs arrived a moment after the certificate, and never rewrote it when only the CRLs
//! changed. Against the real server, agent and signetctl: `crl.pem` is there with the first
//! delivery (the CRL of every CA key the server publishes, as in `GetBundle`), lists the
//! revoked serial within seconds of `certs revoke`, and the workload's own certificate and key
//! are untouched (no renewal was needed to get it there). openssl, reading only what the sink
//! wrote (`ca.crt`, `crl.pem`), refuses the revoked peer and accepts another.

use std::path::Path;
use std::time::{Duration, Instant};

use signet_proto::ca::GetBundleRequest;
use signet_tests::TokenIssuer;

use super::support::{attest_node, create_entry as create_peer_entry, entry_certificate};
use crate::agent::{create_entry, create_token, eventually};
use crate::pg_server;
use crate::sink_harness::{RunningAgent, agent_files, leaf_serial, next_delivery};

/// The CRLs in a PEM file (DER), empty when it cannot be read.
fn crls_in(file: &Path) -> Vec<Vec<u8>> {
    let Ok(text) = std::fs::read(file) else {
        return Vec::new();
    };
    pem::parse_many(text)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.tag() == "X509 CRL")
        .map(|p| p.contents().to_vec())
        .collect()
}

/// The serials a DER CRL lists (lowercase hex, as the server prints them).
fn listed(crl: &[u8]) -> Vec<String> {
    let crl = signet_pki::ParsedCrl::from_der(crl).unwrap();
    crl.entries()
        .keys()
        .map(|serial| signet_types::serial_hex(serial))
        .collect()
}

/// The CA keys that signed the CRLs (their authority key identifiers, lowercase hex).
fn crl_signers(crls: &[Vec<u8>]) -> Vec<String> {
    crls.iter()
        .filter_map(|der| {
            signet_pki::ParsedCrl::from_der(der)
                .ok()?
                .authority_key_id()
                .map(str::to_owned)
        })
        .collect()
}

/// The CA keys that signed the certificates of a PEM chain (the leaf's issuer, its
/// issuer's, up to the root).
fn chain_signers(chain_pem: &[u8]) -> Vec<String> {
    signet_types::pem::parse_certs(chain_pem)
        .unwrap()
        .iter()
        .filter_map(|der| {
            signet_pki::ParsedCert::from_der(der)
                .ok()?
                .authority_key_id()
                .map(str::to_owned)
        })
        .collect()
}

/// `openssl verify -x509_strict <check>` of a PEM chain's leaf (through the rest of the
/// chain) with the sink's `ca.crt` and `crl.pem`: as a workload checks a peer.
fn openssl_verify(sink: &Path, chain_pem: &[u8], check: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let text = String::from_utf8_lossy(chain_pem).into_owned();
    const END: &str = "-----END CERTIFICATE-----";
    let certs: Vec<String> = text
        .split_inclusive(END)
        .filter(|p| p.contains("-----BEGIN CERTIFICATE-----"))
        .map(|p| format!("{}\n", p.trim_start()))
        .collect();
    let leaf = dir.path().join("leaf.pem");
    let untrusted = dir.path().join("untrusted.pem");
    std::fs::write(&leaf, &certs[0]).unwrap();
    std::fs::write(&untrusted, certs[1..].concat()).unwrap();
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(["verify", "-x509_strict", check, "-CAfile"])
        .arg(sink.join("ca.crt"))
        .arg("-CRLfile")
        .arg(sink.join("crl.pem"));
    if certs.len() > 1 {
        cmd.arg("-untrusted").arg(&untrusted);
    }
    let out = cmd.arg(&leaf).output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[tokio::test]
async fn a_revoked_peer_is_in_the_sinks_crl_pem_within_seconds_without_a_renewal() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    // The workload: an entry on the agent's node, delivered to a files sink (tls layout).
    let token = create_token(&server, "crl-node");
    create_entry(&server, "spiffe://example.org/web", "crl-node", &[]);
    // Its peers, on another node: one whose key leaks, one that stays good.
    let peer_node = attest_node(&server, "peer-node").await;
    let leaked_entry = create_peer_entry(&server, "peer-node", "/leaked", 0, &[]).await;
    let good_entry = create_peer_entry(&server, "peer-node", "/good", 0, &[]).await;
    let (leaked, leaked_serial) = entry_certificate(&server, &peer_node, &leaked_entry).await;
    let (good, _) = entry_certificate(&server, &peer_node, &good_entry).await;

    let tmp = tempfile::tempdir().unwrap();
    let sink = tmp.path().join("web");
    std::fs::create_dir(&sink).unwrap();
    let sinks = format!(
        r#"[[sinks]]
name = "web"
kind = "files"
spiffe_id = "spiffe://example.org/web"
directory = "{}"
layout = "tls"
"#,
        sink.display()
    );
    let files = agent_files(&server, &token, "", &sinks);
    let agent = RunningAgent::start(&files.config).await;

    let crt = sink.join("tls.crt");
    let serial = next_delivery(30, "the workload's certificate", &crt, None).await;
    let key = std::fs::read(sink.join("tls.key")).unwrap();

    // With (or a moment after) the first delivery: every CRL the server publishes, one per CA
    // key, as GetBundle carries them.
    let published = || async {
        let b = server
            .native()
            .await
            .get_bundle(GetBundleRequest {})
            .await
            .ok()?
            .into_inner();
        let mut ders: Vec<Vec<u8>> = b.crls.into_iter().map(|c| c.der).collect();
        ders.sort();
        Some(ders)
    };
    let before = published().await.unwrap();
    assert!(!before.is_empty(), "the server publishes CRLs");
    let crl_pem = sink.join("crl.pem");
    eventually(10, "crl.pem with the server's CRLs", || async {
        let mut written = crls_in(&crl_pem);
        written.sort();
        (written == before).then_some(())
    })
    .await;
    assert!(
        crls_in(&crl_pem)
            .iter()
            .all(|c| !listed(c).contains(&leaked_serial))
    );
    openssl_verify(&sink, &leaked.cert_chain_pem, "-crl_check").expect("not revoked yet: accepted");

    // The operator revokes the leaked certificate.
    let out = server.signetctl(&[
        "certs",
        "revoke",
        &leaked_serial,
        "--reason",
        "keyCompromise",
    ]);
    assert!(out.status.success(), "{out:?}");
    let t = Instant::now();
    eventually(10, "crl.pem listing the revoked serial", || async {
        crls_in(&crl_pem)
            .iter()
            .any(|c| listed(c).contains(&leaked_serial))
            .then_some(())
    })
    .await;
    let took = t.elapsed();
    eprintln!("revoked serial in the sink's crl.pem {took:?} after `certs revoke`");
    assert!(took < Duration::from_secs(10), "{took:?}");

    // Nothing else was needed: the workload's certificate and key are the ones it had.
    assert_eq!(leaf_serial(&crt).as_deref(), Some(serial.as_str()));
    assert_eq!(std::fs::read(sink.join("tls.key")).unwrap(), key);
    // crl.pem is what the server publishes now, every CA key's CRL.
    let now = published().await.unwrap();
    let mut written = crls_in(&crl_pem);
    written.sort();
    assert_eq!(written, now);

    // As the workload checks its peers, from the sink's files alone: the revoked one is
    // refused, the other accepted.
    let e = openssl_verify(&sink, &leaked.cert_chain_pem, "-crl_check").unwrap_err();
    assert!(e.contains("revoked"), "{e}");
    openssl_verify(&sink, &good.cert_chain_pem, "-crl_check").expect("a good peer");
    // crl.pem holds a CRL for every CA of the chain, the root's included (one per CA key):
    // the whole chain is checked from it (openssl fails a chain with a CRL missing).
    let signers = crl_signers(&written);
    let chain = chain_signers(&good.cert_chain_pem);
    assert!(
        chain.iter().all(|k| signers.contains(k)),
        "CRLs of {signers:?}, chain signed by {chain:?}"
    );
    let e = openssl_verify(&sink, &leaked.cert_chain_pem, "-crl_check_all").unwrap_err();
    assert!(e.contains("revoked"), "{e}");
    openssl_verify(&sink, &good.cert_chain_pem, "-crl_check_all")
        .expect("a good peer, every CRL of its chain checked");
    agent.stop().await;
}
