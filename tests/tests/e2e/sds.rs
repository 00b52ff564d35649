//! Envoy SDS from the real `signet-agent`, against the real server on PostgreSQL, driven by a
//! client built only from Envoy's own protos (PyPI `xds-protos`, tests/py/sds_client.py):
//!
//! - the names: `default`, `ROOTCA`, `ALL`, `spiffe://<td>`, the SPIFFE ID; the SPIFFE validator
//!   form for Envoy 1.30 (the trust bundle carrying the server's CRLs, root and intermediate)
//!   and the `trusted_ca` form (with `crl`) for Envoy 1.17;
//! - refusals: another entry's identity, an unknown name, another uid asking for this one;
//! - the protocol on an open stream: ACK, a stale nonce, a NACK, then a renewal (the revoked
//!   certificate replaced at once) pushed without reconnecting, then a change of names;
//! - mutual TLS between two processes of two uids (two identities) using only what SDS
//!   delivered, each checking the other's SPIFFE ID, with CRL checking of the whole chain as
//!   Envoy does; and the revoked certificate refused by the peer once the new CRL is pushed;
//! - one uid opening thousands of streams is held to its caps while another uid is served.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use signet_tests::*;
use tokio::io::AsyncBufReadExt;

use crate::agent::{Agent, create_entry, create_token, eventually, write_config};
use crate::pg_server;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/py/sds_client.py");
const FRONT: &str = "spiffe://example.org/sds-front";
const BACK: &str = "spiffe://example.org/sds-back";
const NOBODY: u32 = 65534;

/// The Python with xds-protos (scripts/test installs it); `None` (skip) outside CI.
fn xds_python() -> Option<PathBuf> {
    match std::env::var_os("SIGNET_XDS_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var("CI").as_deref() == Ok("true") => {
            panic!(
                "SIGNET_XDS_PYTHON is not set: CI requires xds-protos (scripts/test installs it)"
            )
        }
        None => {
            eprintln!(
                "SKIPPED: set SIGNET_XDS_PYTHON to a Python with xds-protos, or run scripts/test"
            );
            None
        }
    }
}

/// `sds_client.py SOCKET args…`, as `uid` through setpriv when given.
fn command(
    python: &Path,
    socket: &Path,
    uid: Option<u32>,
    args: &[&str],
) -> tokio::process::Command {
    let mut c = match uid {
        Some(uid) => {
            let mut c = tokio::process::Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .arg("--clear-groups")
                .arg(python);
            c
        }
        None => tokio::process::Command::new(python),
    };
    c.arg(SCRIPT)
        .arg(socket)
        .args(args)
        .env("PYTHONWARNINGS", "ignore")
        .env("HOME", "/tmp")
        .kill_on_drop(true);
    c
}

/// One run's JSON line.
async fn run(python: &Path, socket: &Path, uid: Option<u32>, args: &[&str]) -> serde_json::Value {
    let out = command(python, socket, uid, args).output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "sds_client.py {args:?}: {e}; stdout {text:?}; stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn secret<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no secret {name} in {v}"))
}

/// A line of JSON from a running client's stdout.
async fn line(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    secs: u64,
) -> serde_json::Value {
    let l = tokio::time::timeout(Duration::from_secs(secs), lines.next_line())
        .await
        .expect("a line in time")
        .unwrap()
        .expect("a line");
    serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l:?}: {e}"))
}

/// Server, two entries (FRONT for this uid, BACK for `nobody`), an agent whose socket any uid
/// can reach; the agent's extra configuration appended.
async fn setup(
    tokens: &TokenIssuer,
    agent_extra: &str,
) -> Option<(Server, crate::agent::Layout, Agent)> {
    let server = pg_server(tokens, "").await?;
    let token = create_token(&server, "vm-sds");
    create_entry(&server, FRONT, "vm-sds", &["--ttl", "1h"]);
    let nobody = format!("unix:uid:{NOBODY}");
    let out = server.signetctl(&[
        "entry",
        "create",
        "--spiffe-id",
        BACK,
        "--parent",
        "vm-sds",
        "--selector",
        &nobody,
        "--ttl",
        "1h",
    ]);
    assert!(out.status.success(), "{out:?}");
    let l = write_config(&server, &token, FRONT);
    if !agent_extra.is_empty() {
        let mut cfg = std::fs::read_to_string(&l.config).unwrap();
        cfg.push_str(agent_extra);
        std::fs::write(&l.config, cfg).unwrap();
    }
    let dir = l.socket.parent().unwrap();
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let agent = Agent::start(&l.config);
    Some((server, l, agent))
}

/// Waits up to `secs` until this process (FRONT's uid) is served `default` over SDS.
async fn until_default_served(python: &Path, socket: &Path, secs: u64, what: &str) {
    eventually(secs, what, || async {
        let v = run(python, socket, None, &["fetch", "default"]).await;
        (v["ok"] == true).then_some(())
    })
    .await;
}

#[tokio::test]
async fn envoy_protos_get_names_forms_pushes_and_mutual_tls_with_crls() {
    let Some(python) = xds_python() else { return };
    let tokens = TokenIssuer::new("k1");
    let Some((server, l, agent)) = setup(&tokens, "").await else {
        return;
    };
    let socket = l.socket.clone();

    // Everything by name, once the agent holds the identity and both CRLs (root and
    // intermediate: without both Envoy would refuse every chain).
    let all = eventually(40, "SDS with the CRLs", || async {
        let v = run(
            &python,
            &socket,
            None,
            &[
                "fetch",
                "default",
                "ROOTCA",
                "ALL",
                "spiffe://example.org",
                FRONT,
            ],
        )
        .await;
        let crls = v["ok"].as_bool().filter(|ok| *ok).and_then(|_| {
            Some(
                secret(&v, "ROOTCA")["trust_domains"][0]["bundle"]
                    .as_str()?
                    .matches("BEGIN X509 CRL")
                    .count(),
            )
        });
        (crls >= Some(2)).then_some(v)
    })
    .await;
    assert_eq!(
        all["type_url"],
        "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
    );
    for name in ["default", FRONT] {
        let s = secret(&all, name);
        assert_eq!(s["kind"], "tls");
        assert_eq!(s["key_label"], "-----BEGIN PRIVATE KEY-----");
        let leaf = signet_pki::ParsedCert::from_pem_first(s["chain"].as_str().unwrap().as_bytes())
            .unwrap();
        assert_eq!(leaf.spiffe_id().unwrap().to_string(), FRONT);
    }
    for name in ["ROOTCA", "ALL", "spiffe://example.org"] {
        let s = secret(&all, name);
        assert_eq!(s["kind"], "spiffe", "{s}");
        assert_eq!(s["trust_domains"].as_array().unwrap().len(), 1);
        assert_eq!(s["trust_domains"][0]["name"], "example.org");
        let bundle = s["trust_domains"][0]["bundle"].as_str().unwrap();
        for root in signet_types::pem::parse_certs(&server.bundle_pem).unwrap() {
            assert!(
                bundle.contains(&signet_types::pem::cert_to_pem(&root)),
                "{bundle}"
            );
        }
    }

    // Envoy 1.17: the default validator's trusted_ca, and its crl.
    let legacy = run(
        &python,
        &socket,
        None,
        &["fetch", "--envoy", "1.17", "ROOTCA"],
    )
    .await;
    let s = secret(&legacy, "ROOTCA");
    assert_eq!(s["kind"], "trusted_ca");
    assert!(
        s["trusted_ca"]
            .as_str()
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );
    assert!(s["crl"].as_str().unwrap().matches("BEGIN X509 CRL").count() >= 2);
    // So does an Envoy 1.30 that asks for it in its node metadata.
    let meta = run(
        &python,
        &socket,
        None,
        &["fetch", "--disable-spiffe", "ROOTCA"],
    )
    .await;
    assert_eq!(secret(&meta, "ROOTCA")["kind"], "trusted_ca");

    // Refusals, each naming what was refused.
    for (uid, names, refused) in [
        (None, vec![BACK], BACK),
        (None, vec!["default", "nonsense"], "nonsense"),
        (Some(NOBODY), vec![FRONT], FRONT),
    ] {
        let mut args = vec!["fetch"];
        args.extend(names);
        let v = run(&python, &socket, uid, &args).await;
        assert_eq!(v["ok"], false, "{v}");
        assert_eq!(v["code"], "PERMISSION_DENIED", "{v}");
        assert!(v["message"].as_str().unwrap().contains(refused), "{v}");
    }

    // Mutual TLS: BACK (uid nobody) serves, FRONT connects; each checks the other's ID.
    let work = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        work.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let port_file = work.path().join("port");
    let mut peer = command(
        &python,
        &socket,
        Some(NOBODY),
        &["serve", FRONT, port_file.to_str().unwrap()],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .spawn()
    .unwrap();
    let mut peer_lines = tokio::io::BufReader::new(peer.stdout.take().unwrap()).lines();
    let first = line(&mut peer_lines, 60).await;
    assert_eq!(first["event"], "secrets", "{first}");
    assert!(first["crls"].as_u64().unwrap() >= 2, "{first}");
    let port = eventually(20, "the peer's port", || async {
        std::fs::read_to_string(&port_file).ok()
    })
    .await;
    let saved = work.path().join("front-old");
    let saved = saved.to_str().unwrap();
    let ok = run(
        &python,
        &socket,
        None,
        &["connect", &port, BACK, "--save", saved],
    )
    .await;
    assert_eq!(ok["ok"], true, "{ok}");
    assert_eq!(ok["reply"], format!("hello {FRONT}"));
    assert_eq!(ok["crl_check"], true, "the CRLs were in place");
    let conn = line(&mut peer_lines, 10).await;
    assert_eq!(
        (conn["ok"].clone(), conn["peer"].clone()),
        (true.into(), FRONT.into()),
        "{conn}"
    );

    // The protocol on one stream; the renewal is the revocation of FRONT's certificate.
    let mut proto = command(&python, &socket, None, &["protocol", FRONT])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut proto_lines = tokio::io::BufReader::new(proto.stdout.take().unwrap()).lines();
    let ready = line(&mut proto_lines, 30).await;
    assert_eq!(ready["event"], "ready", "{ready}");
    let old_serial = serial_of(ready["chain"].as_str().unwrap());
    assert_eq!(
        old_serial,
        serial_of(&std::fs::read_to_string(Path::new(saved).join("chain.pem")).unwrap())
    );
    let out = server.signetctl(&["certs", "revoke", &old_serial, "--reason", "keyCompromise"]);
    assert!(out.status.success(), "{out:?}");
    let pushed = line(&mut proto_lines, 30).await;
    assert_eq!(pushed["event"], "pushed", "{pushed}");
    assert_ne!(serial_of(pushed["chain"].as_str().unwrap()), old_serial);
    assert_ne!(pushed["nonce"], ready["nonce"]);
    assert_eq!(pushed["uris"][0], FRONT);
    let renamed = line(&mut proto_lines, 30).await;
    assert_eq!(renamed["names"], serde_json::json!([FRONT]), "{renamed}");
    let _ = proto.wait().await;

    // The peer is pushed the new CRL: the revoked certificate is refused, its replacement not.
    let refused = eventually(
        30,
        "the revoked certificate refused by the peer",
        || async {
            let v = run(
                &python,
                &socket,
                None,
                &["connect", &port, BACK, "--use", saved],
            )
            .await;
            (v["ok"] == false).then_some(v)
        },
    )
    .await;
    eprintln!("the revoked certificate, refused: {refused}");
    let fresh = run(&python, &socket, None, &["connect", &port, BACK]).await;
    assert_eq!(fresh["ok"], true, "{fresh}");
    let _ = peer.kill().await;
    agent.stop().await;
}

/// One uid opens thousands of SDS streams: it is held to its connection and stream caps
/// (ResourceExhausted past `max_streams_per_uid`), and another uid is still served at once.
#[tokio::test]
async fn thousands_of_streams_from_one_uid_leave_another_uid_served() {
    let Some(python) = xds_python() else { return };
    let tokens = TokenIssuer::new("k1");
    let extra = "\n[workload_api.sds]\nmax_streams_per_uid = 300\n";
    let Some((_server, l, agent)) = setup(&tokens, extra).await else {
        return;
    };
    let socket = l.socket.clone();
    until_default_served(&python, &socket, 40, "FRONT over SDS").await;
    let mut flood = tokio::process::Command::new(bin("wl-probe"))
        .arg("sds-flood")
        .arg(&socket)
        .arg("3000")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(flood.stdout.take().unwrap()).lines();
    let l1 = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await
        .expect("the flood reports")
        .unwrap()
        .expect("a line");
    let got: serde_json::Value = serde_json::from_str(&l1).unwrap();
    eprintln!("flood: {got}");
    assert_eq!(got["served"], 300, "{got}");
    assert!(
        got["codes"]["ResourceExhausted"].as_u64().unwrap() >= 1,
        "{got}"
    );
    // While the flood holds its streams, another uid gets its identity.
    let other = run(
        &python,
        &socket,
        Some(NOBODY),
        &["fetch", "default", "ROOTCA"],
    )
    .await;
    assert_eq!(other["ok"], true, "{other}");
    let leaf = signet_pki::ParsedCert::from_pem_first(
        secret(&other, "default")["chain"]
            .as_str()
            .unwrap()
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(leaf.spiffe_id().unwrap().to_string(), BACK);
    drop(flood.stdin.take());
    let _ = flood.wait().await;
    // The slots come back.
    until_default_served(&python, &socket, 20, "FRONT served again").await;
    agent.stop().await;
}

/// Fresh-eyes review of issue 27, finding 1: SDS streams that each start a second message
/// declaring 4 MB and never finish it made the agent buffer up to gRPC's 4 MiB default per
/// stream (about 62 MB per connection, gigabytes per uid). The agent now bounds a request
/// message (`workload_api.max_request_bytes`): each such stream is ended at once, and the
/// agent keeps serving.
#[tokio::test]
async fn half_sent_oversized_requests_end_their_streams_at_once() {
    let Some(python) = xds_python() else { return };
    let tokens = TokenIssuer::new("k1");
    let Some((_server, l, agent)) = setup(&tokens, "").await else {
        return;
    };
    let socket = l.socket.clone();
    until_default_served(&python, &socket, 40, "FRONT over SDS").await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/py/sds_partial.py");
    let out = tokio::process::Command::new(&python)
        .arg(script)
        .arg(&socket)
        .args(["16", "4000000", "3000"])
        .output()
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    assert_eq!(v["answered"], 16, "{v}");
    assert_eq!(
        v["ended"], 16,
        "every half-sent oversized message ends its stream: {v}"
    );
    let after = run(&python, &socket, Some(NOBODY), &["fetch", "default"]).await;
    assert_eq!(after["ok"], true, "{after}");
    agent.stop().await;
}
