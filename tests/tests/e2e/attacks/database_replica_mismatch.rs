//! An operator's mistake (issue 24, finding 7): a replica configured with another trust domain
//! started on a deployment's database. Before: it started `ready`, issued
//! `spiffe://corp.example/x` under the example.org intermediate and recorded it in the same
//! ledger. Now: the first server pins the trust domain (and the CA mode) in the database; a
//! server configured otherwise exits before it creates, signs or serves anything, naming the
//! setting, both values and what to do, and the refusal is in the deployment's audit log.
//! The same configuration still starts.

use std::process::Stdio;
use std::time::Duration;

use signet_proto::admin::ListAuditEventsRequest;
use signet_tests::{Server, ServerOpts, bin};

#[tokio::test]
async fn a_replica_with_another_trust_domain_is_refused_and_the_same_configuration_starts() {
    let dir = tempfile::tempdir().unwrap();
    // Replicas share the key-encryption key, as a deployment's do.
    let kek = dir.path().join("kek");
    std::fs::write(&kek, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n").unwrap();
    let url = format!("sqlite://{}", dir.path().join("signet.db").display());
    let ca = format!("[ca]\nkek_file = \"{}\"\n", kek.display());
    let first = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        extra_toml: ca.clone(),
        ..ServerOpts::default()
    })
    .await;
    assert_eq!(first.trust_domain, "example.org");
    let head = first.cert_count().await;
    first.stop().await;

    // The mistaken replica: its own data directory, the deployment's database.
    let data = dir.path().join("corp");
    std::fs::create_dir_all(&data).unwrap();
    let cfg = data.join("server.toml");
    std::fs::write(
        &cfg,
        format!(
            "trust_domain = \"corp.example\"\nlisten = \"127.0.0.1:0\"\n\
             http_listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ndatabase_url = \"{url}\"\n{ca}",
            data.display()
        ),
    )
    .unwrap();
    let run = tokio::process::Command::new(bin("signet-server"))
        .args(["--config", cfg.to_str().unwrap()])
        .env("RUST_LOG", "info,sqlx=warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the mistaken replica exits instead of serving")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(!stdout.lines().any(|l| l == "ready"), "{stdout}");
    assert!(
        stderr.contains(
            "trust_domain: this server is configured for corp.example, but the database at"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("belongs to example.org"), "{stderr}");
    assert!(
        stderr.contains(
            "set trust_domain = \"example.org\" on this server, or give it a database of its own"
        ),
        "{stderr}"
    );
    assert!(!data.join("bundle.pem").exists(), "it published nothing");

    // The deployment's configuration starts on the same database, from another data
    // directory too (a second replica); the ledger holds nothing of the refused one, and the
    // refusal is in the audit log.
    let replica = Server::start(ServerOpts {
        database_url: Some(url.clone()),
        extra_toml: ca.clone(),
        ..ServerOpts::default()
    })
    .await;
    assert_eq!(replica.trust_domain, "example.org");
    assert!(replica.cert_count().await >= head);
    let events = replica
        .admin()
        .await
        .list_audit_events(ListAuditEventsRequest {
            after_id: 0,
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events;
    let pinned: Vec<_> = events
        .iter()
        .filter(|e| e.kind == "deployment.pinned")
        .map(|e| e.detail.as_str())
        .collect();
    assert!(
        pinned.contains(&"trust_domain = example.org (configuration)"),
        "{pinned:?}"
    );
    assert!(
        events.iter().any(|e| e.kind == "deployment.pin_refused"
            && e.detail.contains("trust_domain corp.example")),
        "{events:?}"
    );
}
