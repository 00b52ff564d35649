//! A federated (foreign) trust domain's identities and roots, used against this one:
//!
//! (a) b.test's workload SVID, valid in b.test and federated into a.test, is refused by a.test's
//!     server as a caller of the native API (SignCsr) and of the node API (SyncEntries);
//! (b) a partner that publishes a root in its bundle and then presents a certificate for
//!     `spiffe://a.test/...` signed by that root is refused by a.test's workload, which verifies
//!     an a.test peer against a.test's bundle only (the peer ID's trust domain picks the
//!     bundle); the same workload accepts the partner's own identity (the control);
//! (c) an entry that does not federate never receives the foreign bundle, through any API:
//!     the X509-SVID response, FetchX509Bundles, FetchJWTBundles, SDS `ALL`, the files sink.

use std::path::PathBuf;

use signet_client::ClientIdentity;
use signet_proto::agent::SyncEntriesRequest;
use signet_proto::agent::node_client::NodeClient;
use signet_proto::ca::SignCsrRequest;
use signet_proto::ca::certificate_authority_client::CertificateAuthorityClient;
use signet_tests::*;

use crate::agent::eventually;
use crate::federation_domains::{
    NOBODY, Serving, info_with, peer_run, tds, two_domains, with_partner,
};
use crate::workload_clients::python;

/// b.test's federating workload's SVID and key, from its own agent (the Rust spiffe client).
async fn b_workload_identity(socket: &std::path::Path) -> ClientIdentity {
    eventually(20, "b.test's SVID", || async {
        let client = spiffe::WorkloadApiClient::connect_to(format!("unix:{}", socket.display()))
            .await
            .ok()?;
        let svid = client.fetch_x509_svid().await.ok()?;
        let chain: String = svid
            .cert_chain()
            .iter()
            .map(|c| signet_types::pem::cert_to_pem(c.as_ref()))
            .collect();
        let key = rcgen::KeyPair::try_from(svid.private_key().as_ref()).ok()?;
        Some(ClientIdentity {
            cert_chain_pem: chain.into_bytes(),
            key_pem: key.serialize_pem().into_bytes(),
        })
    })
    .await
}

#[tokio::test]
async fn a_foreign_svid_is_refused_by_the_server_and_non_federating_entries_get_no_foreign_bundle()
{
    let Some(python) = python() else { return };
    let Some((a, b)) = two_domains("", "").await else {
        return;
    };
    // Federation established: each federating workload holds the other's bundle.
    info_with(&python, &a, "b.test", 30).await;
    info_with(&python, &b, "a.test", 30).await;

    // (a) b.test's workload SVID as a caller of a.test's server.
    let id = b_workload_identity(&b.layout.socket).await;
    match signet_client::connect(&a.server.target(), Some(&id)).await {
        Err(e) => println!("a.test's server refused b.test's SVID at connect: {e}"),
        Ok(channel) => {
            let (csr, _key) = csr_with(&[], &[]);
            let r = CertificateAuthorityClient::new(channel.clone())
                .sign_csr(SignCsrRequest {
                    csr: csr.into_bytes(),
                    ..Default::default()
                })
                .await;
            assert!(r.is_err(), "SignCsr with b.test's SVID answered {r:?}");
            println!("SignCsr refused: {:?}", r.unwrap_err());
            let r = NodeClient::new(channel)
                .sync_entries(SyncEntriesRequest { known_revision: 0 })
                .await;
            assert!(r.is_err(), "SyncEntries with b.test's SVID answered {r:?}");
            println!("SyncEntries refused: {:?}", r.unwrap_err());
        }
    }

    // (c) The entry that does not federate (uid nobody): no foreign bundle anywhere.
    for d in [&a, &b] {
        let other = if d.td == "a.test" { "b.test" } else { "a.test" };
        let v = eventually(20, "the non-federating workload's SVID", || async {
            peer_run(&python, &d.layout.socket, Some(NOBODY), &["info"])
                .await
                .ok()
        })
        .await;
        assert_eq!(v["svids"], serde_json::json!([d.plain_id]), "{v}");
        for field in ["svid_bundles", "bundles", "jwt_bundles"] {
            assert_eq!(
                tds(&v[field]),
                [d.td.as_str()],
                "{field} for {}: {v}",
                d.plain_id
            );
        }
        // It cannot even build a TLS context for a peer of the other trust domain.
        let err = peer_run(
            &python,
            &d.layout.socket,
            Some(NOBODY),
            &["connect", "1", &format!("spiffe://{other}/fed")],
        )
        .await
        .unwrap_err();
        assert!(err.contains("no bundle for trust domain"), "{err}");
        // The files sink: its SVID, and no federated-*.pem.
        let svid = d.plain_sink.join("svid.pem");
        eventually(20, "the plain sink's SVID", || async {
            svid.exists().then_some(())
        })
        .await;
        let federated: Vec<PathBuf> = std::fs::read_dir(&d.plain_sink)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains("federated"))
            .collect();
        assert!(federated.is_empty(), "{federated:?}");
        let bundle = std::fs::read(d.plain_sink.join("svid_bundle.pem")).unwrap_or_default();
        let own = std::fs::read(d.server.bundle_path()).unwrap();
        for c in rustls_pemfile_certs(&bundle) {
            assert!(
                rustls_pemfile_certs(&own).contains(&c),
                "the plain sink's bundle holds a foreign root"
            );
        }
        // SDS ALL (Envoy's own protos), as nobody.
        if let Some(xds) = xds_python() {
            let out = tokio::process::Command::new("setpriv")
                .arg(format!("--reuid={NOBODY}"))
                .arg(format!("--regid={NOBODY}"))
                .arg("--clear-groups")
                .arg(&xds)
                .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/py/sds_client.py"))
                .arg(&d.layout.socket)
                .args(["fetch", "ALL"])
                .env("PYTHONWARNINGS", "ignore")
                .env("HOME", "/tmp")
                .output()
                .await
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
                panic!("{e}: {text:?} {}", String::from_utf8_lossy(&out.stderr))
            });
            assert_eq!(v["ok"], true, "{v}");
            let names: Vec<String> = v["secrets"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|s| {
                    s["trust_domains"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .map(|t| t["name"].as_str().unwrap().to_owned())
                })
                .collect();
            assert_eq!(names, [d.td.as_str()], "SDS ALL for {}: {v}", d.plain_id);
            assert!(!text.contains(other), "{text}");
        }
    }
    a.stop().await;
    b.stop().await;
}

fn rustls_pemfile_certs(pem: &[u8]) -> Vec<Vec<u8>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .map(|c| c.to_vec())
        .collect()
}

fn xds_python() -> Option<PathBuf> {
    match std::env::var_os("SIGNET_XDS_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("SIGNET_XDS_PYTHON is not set: CI requires xds-protos")
        }
        None => {
            eprintln!("SKIPPED (SDS part): SIGNET_XDS_PYTHON is not set");
            None
        }
    }
}

#[tokio::test]
async fn a_partner_root_cannot_vouch_for_this_domains_ids() {
    let Some(python) = python() else { return };
    let Some((a, partner, _endpoint)) = with_partner().await else {
        return;
    };
    info_with(&python, &a, "partner.test", 30).await;
    let dir = tempfile::tempdir().unwrap();
    let rogue = |id: &str, n: &str| {
        let (chain, key) = partner.leaf(id);
        let c = dir.path().join(format!("{n}.pem"));
        let k = dir.path().join(format!("{n}.key"));
        std::fs::write(&c, chain).unwrap();
        std::fs::write(&k, key).unwrap();
        (c, k)
    };
    // The partner's certificate for an a.test ID, against a.test's workload expecting it.
    let (c, k) = rogue("spiffe://a.test/fed", "rogue");
    let mut serving = Serving::start(&python, &a.layout.socket, "spiffe://a.test/fed").await;
    let port = serving.port.to_string();
    let args = [
        "connect",
        port.as_str(),
        "spiffe://a.test/fed",
        "--cert",
        c.to_str().unwrap(),
        "--key",
        k.to_str().unwrap(),
    ];
    let client = peer_run(&python, &a.layout.socket, None, &args)
        .await
        .unwrap();
    let server_side = serving.next().await;
    assert_eq!(server_side["ok"], false, "accepted: {server_side}");
    assert_eq!(client["ok"], false, "{client}");
    println!("refused: {server_side}");
    let _ = serving.child.kill().await;

    // Control: the partner's own identity, signed by the same root, is accepted.
    let (c, k) = rogue("spiffe://partner.test/x", "partner");
    let mut serving = Serving::start(&python, &a.layout.socket, "spiffe://partner.test/x").await;
    let port = serving.port.to_string();
    let args = [
        "connect",
        port.as_str(),
        "spiffe://partner.test/x",
        "--cert",
        c.to_str().unwrap(),
        "--key",
        k.to_str().unwrap(),
    ];
    let client = peer_run(&python, &a.layout.socket, None, &args)
        .await
        .unwrap();
    let server_side = serving.next().await;
    assert_eq!(server_side["ok"], true, "{server_side}");
    assert_eq!(server_side["peer"], "spiffe://partner.test/x");
    assert_eq!(client["ok"], true, "{client}");
    let _ = serving.child.kill().await;
    a.stop().await;
}
