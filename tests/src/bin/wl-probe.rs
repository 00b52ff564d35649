//! A small Workload API client for the attack suite: a workload, or an attacker, in a process
//! of its own (so it has its own pid, cgroup and executable).
//!
//! ```text
//! wl-probe fetch SOCKET [--wait-stdin]     FetchX509SVID; prints one JSON line
//! wl-probe fork-exec SOCKET EXE [ARGS…]    connect, hand the connection to a child
//!                                          (`child-fetch`), then exec EXE: the
//!                                          connect-fork-exec attack
//! wl-probe child-fetch PARENT_PID EXE      wait until PARENT_PID runs EXE, then fetch on
//!                                          the inherited connection (fd 0); prints JSON
//! wl-probe flood SOCKET N                  open up to N idle connections, print how many,
//!                                          hold them until stdin closes
//! wl-probe sds-flood SOCKET N               open up to N SDS streams (16 per connection),
//!                                          print how each went, hold them until stdin
//!                                          closes
//! wl-probe sleep SECS
//! ```
//!
//! The JSON line: `{"ok":true,"ids":[…],"keys":n}` or `{"ok":false,"code":c,"message":m}`.
//! With `WL_PROBE_API=sds` in the environment, `fetch` and `child-fetch` ask Envoy's SDS
//! (StreamSecrets for `default`) instead of FetchX509SVID; `ids` are then the SPIFFE IDs of the
//! certificates served.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]
// A benchmark measures real time (clippy.toml bans wall-clock reads in the products' logic).
#![allow(clippy::disallowed_methods)]

use std::io::BufRead;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use signet_proto::envoy::config::core::v3 as core;
use signet_proto::envoy::extensions::transport_sockets::tls::v3 as tls;
use signet_proto::envoy::service::discovery::v3 as xds;
use signet_proto::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
use signet_proto::workload::X509svidRequest;
use signet_proto::workload::spiffe_workload_api_client::SpiffeWorkloadApiClient;
use tonic::transport::{Channel, Endpoint, Uri};

async fn channel_over(stream: tokio::net::UnixStream) -> Result<Channel, String> {
    let slot = std::sync::Mutex::new(Some(stream));
    let slot = std::sync::Arc::new(slot);
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let s = slot.lock().unwrap().take();
            async move {
                s.map(TokioIo::new).ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::NotConnected, "one connection only")
                })
            }
        }))
        .await
        .map_err(|e| format!("connect: {e}"))
}

/// The first request of an SDS stream from an Envoy 1.30 asking for `names`.
fn sds_request(names: &[&str]) -> xds::DiscoveryRequest {
    xds::DiscoveryRequest {
        node: Some(core::Node {
            id: "wl-probe".into(),
            cluster: "wl-probe".into(),
            user_agent_name: "envoy".into(),
            user_agent_version_type: Some(core::node::UserAgentVersionType::UserAgentBuildVersion(
                core::BuildVersion {
                    version: Some(signet_proto::envoy::r#type::v3::SemanticVersion {
                        major_number: 1,
                        minor_number: 30,
                        patch: 0,
                    }),
                    metadata: None,
                },
            )),
            ..Default::default()
        }),
        resource_names: names.iter().map(|n| (*n).to_owned()).collect(),
        type_url: "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret".into(),
        ..Default::default()
    }
}

/// The first SDS response on `channel` for `default`, or the status that ended the stream. The
/// request sender is returned so the stream stays open as long as the caller holds it.
async fn sds_first(
    channel: Channel,
) -> (
    Result<xds::DiscoveryResponse, tonic::Status>,
    futures::channel::mpsc::UnboundedSender<xds::DiscoveryRequest>,
) {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tx.unbounded_send(sds_request(&["default"])).unwrap();
    let mut client = SecretDiscoveryServiceClient::new(channel);
    let r = async {
        let mut stream = client.stream_secrets(rx).await?.into_inner();
        stream
            .message()
            .await?
            .ok_or_else(|| tonic::Status::unknown("stream ended"))
    }
    .await;
    (r, tx)
}

/// The SPIFFE ID of a `TlsCertificate` secret's leaf, and whether it carries a key.
fn sds_identity(any: &prost_types::Any) -> Option<(String, bool)> {
    use prost::Message;
    let secret = tls::Secret::decode(any.value.as_slice()).ok()?;
    let Some(tls::secret::Type::TlsCertificate(c)) = secret.r#type else {
        return None;
    };
    let bytes = |d: &Option<core::DataSource>| match d.as_ref()?.specifier.as_ref()? {
        core::data_source::Specifier::InlineBytes(b) => Some(b.clone()),
        _ => None,
    };
    let chain = signet_types::pem::parse_certs(&bytes(&c.certificate_chain)?).ok()?;
    let id = signet_pki::ParsedCert::from_der(chain.first()?)
        .ok()?
        .spiffe_id()
        .ok()?
        .to_string();
    Some((id, bytes(&c.private_key).is_some_and(|k| !k.is_empty())))
}

async fn fetch_sds(channel: Channel) -> serde_json::Value {
    match tokio::time::timeout(Duration::from_secs(20), sds_first(channel)).await {
        Ok((Ok(resp), _)) => {
            let ids: Vec<(String, bool)> = resp.resources.iter().filter_map(sds_identity).collect();
            serde_json::json!({
                "ok": true,
                "ids": ids.iter().map(|(i, _)| i.clone()).collect::<Vec<_>>(),
                "keys": ids.iter().filter(|(_, k)| *k).count(),
            })
        }
        Ok((Err(status), _)) => serde_json::json!({
            "ok": false, "code": status.code() as i32, "message": status.message(),
        }),
        Err(_) => serde_json::json!({"ok": false, "code": -1, "message": "timed out"}),
    }
}

async fn fetch(channel: Channel) -> serde_json::Value {
    if std::env::var("WL_PROBE_API").as_deref() == Ok("sds") {
        return fetch_sds(channel).await;
    }
    let mut client = SpiffeWorkloadApiClient::new(channel);
    let mut req = tonic::Request::new(X509svidRequest {});
    req.metadata_mut()
        .insert("workload.spiffe.io", "true".parse().unwrap());
    let first = async {
        let mut stream = client.fetch_x509svid(req).await?.into_inner();
        stream
            .message()
            .await?
            .ok_or_else(|| tonic::Status::unknown("stream ended"))
    };
    match tokio::time::timeout(Duration::from_secs(20), first).await {
        Ok(Ok(resp)) => serde_json::json!({
            "ok": true,
            "ids": resp.svids.iter().map(|s| s.spiffe_id.clone()).collect::<Vec<_>>(),
            "keys": resp.svids.iter().filter(|s| !s.x509_svid_key.is_empty()).count(),
        }),
        Ok(Err(status)) => serde_json::json!({
            "ok": false, "code": status.code() as i32, "message": status.message(),
        }),
        Err(_) => serde_json::json!({"ok": false, "code": -1, "message": "timed out"}),
    }
}

fn print(v: &serde_json::Value) {
    println!("{v}");
}

fn wait_for_exe(pid: &str, exe: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .as_deref()
            == Some(exe)
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("fetch") => {
            let socket = PathBuf::from(&args[1]);
            if args.iter().any(|a| a == "--wait-stdin") {
                let mut line = String::new();
                let _ = std::io::stdin().lock().read_line(&mut line);
            }
            let v = match tokio::net::UnixStream::connect(&socket).await {
                Ok(s) => match channel_over(s).await {
                    Ok(ch) => fetch(ch).await,
                    Err(e) => serde_json::json!({"ok": false, "code": -2, "message": e}),
                },
                Err(e) => serde_json::json!({"ok": false, "code": -2, "message": e.to_string()}),
            };
            print(&v);
        }
        Some("fork-exec") => {
            use std::os::unix::process::CommandExt;
            let socket = &args[1];
            let exe = &args[2];
            let conn = std::os::unix::net::UnixStream::connect(socket).expect("connect");
            let fd = conn.as_fd().try_clone_to_owned().expect("dup");
            let me = std::env::current_exe().unwrap();
            // The "fork": a child that holds the connection as its fd 0. Never waited for:
            // this process is about to become another program.
            #[allow(clippy::zombie_processes)]
            std::process::Command::new(me)
                .arg("child-fetch")
                .arg(std::process::id().to_string())
                .arg(exe)
                .stdin(std::process::Stdio::from(fd))
                .spawn()
                .expect("child");
            drop(conn);
            // The "exec": this process, the one that connected, becomes the allowed binary.
            let err = std::process::Command::new(exe).args(&args[3..]).exec();
            panic!("exec {exe}: {err}");
        }
        Some("child-fetch") => {
            let parent = &args[1];
            let exe = PathBuf::from(&args[2]);
            if !wait_for_exe(parent, &exe) {
                print(
                    &serde_json::json!({"ok": false, "code": -3, "message": "parent never ran the binary"}),
                );
                return;
            }
            let fd = std::io::stdin().as_fd().try_clone_to_owned().expect("fd 0");
            let std_stream = std::os::unix::net::UnixStream::from(fd);
            std_stream.set_nonblocking(true).expect("nonblocking");
            let stream = tokio::net::UnixStream::from_std(std_stream).expect("tokio");
            let v = match channel_over(stream).await {
                Ok(ch) => fetch(ch).await,
                Err(e) => serde_json::json!({"ok": false, "code": -2, "message": e}),
            };
            print(&v);
        }
        Some("flood") => {
            let socket = PathBuf::from(&args[1]);
            let n: usize = args[2].parse().expect("N");
            let mut held = Vec::new();
            for _ in 0..n {
                match std::os::unix::net::UnixStream::connect(&socket) {
                    Ok(s) => held.push(s),
                    Err(_) => break,
                }
            }
            println!("{}", held.len());
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
        }
        Some("sds-flood") => {
            let socket = PathBuf::from(&args[1]);
            let n: usize = args[2].parse().expect("N");
            let (mut served, mut refused, mut failed) = (0usize, 0usize, 0usize);
            let mut codes: std::collections::BTreeMap<String, usize> = Default::default();
            let mut held = Vec::new();
            let mut channel: Option<Channel> = None;
            for i in 0..n {
                if i % 16 == 0 {
                    channel = match tokio::net::UnixStream::connect(&socket).await {
                        Ok(s) => channel_over(s).await.ok(),
                        Err(_) => None,
                    };
                }
                let Some(ch) = channel.clone() else {
                    failed += 1;
                    continue;
                };
                match tokio::time::timeout(Duration::from_secs(5), sds_first(ch)).await {
                    Ok((Ok(_), tx)) => {
                        served += 1;
                        held.push(tx);
                    }
                    Ok((Err(s), _)) => {
                        refused += 1;
                        *codes.entry(format!("{:?}", s.code())).or_default() += 1;
                    }
                    Err(_) => failed += 1,
                }
            }
            print(&serde_json::json!({
                "served": served, "refused": refused, "failed": failed, "codes": codes,
            }));
            let mut line = String::new();
            let _ =
                tokio::task::spawn_blocking(move || std::io::stdin().lock().read_line(&mut line))
                    .await;
            drop(held);
        }
        Some("sleep") => {
            let secs: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(30);
            std::thread::sleep(Duration::from_secs(secs));
        }
        _ => {
            eprintln!("usage: wl-probe fetch|fork-exec|child-fetch|flood|sds-flood|sleep …");
            std::process::exit(2);
        }
    }
}
