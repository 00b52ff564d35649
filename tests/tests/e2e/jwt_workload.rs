//! The Workload API's JWT profile of the real `signet-agent` binary against the fake CA
//! (tests/src/fake_ca.rs), which mints real JWT-SVIDs (`Node/MintWorkloadJwts`) and publishes
//! its JWT keys in the bundle, driven by py-spiffe (tests/py/jwt_svid.py, an independent
//! client):
//!
//! - `fetch_jwt_svid`, `fetch_jwt_svids`, `fetch_jwt_bundles`, `JwtSvid.parse_and_validate`
//!   against the fetched bundle, `validate_jwt_svid` (the agent's ValidateJWTSVID) and
//!   `JwtSource` all work unchanged; the token is cached (the second fetch mints nothing),
//!   and a cached token is served while the CA is down.
//! - Attacks: a workload naming another identity gets PermissionDenied; another uid gets
//!   none of this identity's tokens (PermissionDenied: it has no identity); `alg: none`, HS256
//!   keyed with the bundle's public key, a token signed by a key not in the bundle and a
//!   tampered token are refused by the agent (InvalidArgument) and by py-spiffe's own check.
//! - A taint of the signing key (its ID in `tainted_key_ids`, a new key published) makes the
//!   next FetchJWTSVID return a token from the new key.

use std::path::{Path, PathBuf};

use signet_tests::bin;
use signet_tests::fake_ca::{APP_ID, FakeCa};

use crate::agent::{eventually, my_uid};
use crate::workload_clients::python;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/py/jwt_svid.py");

struct Agent {
    child: tokio::process::Child,
}

impl Agent {
    fn start(config: &Path) -> Self {
        let child = tokio::process::Command::new(bin("signet-agent"))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info,h2=warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self { child }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// The agent's configuration in `dir` (without sinks); returns it and the socket.
fn config(dir: &Path, port: u16, bundle: &Path) -> (PathBuf, PathBuf) {
    let socket = dir.join("agent.sock");
    let path = dir.join("agent.toml");
    std::fs::write(
        &path,
        format!(
            r#"server_address = "https://localhost:{port}"
trust_bundle_file = "{bundle}"
join_token = "tok"
data_dir = "{data}"
workload_api_socket = "{socket}"
http_listen = "127.0.0.1:0"
sync_interval = "300ms"
"#,
            bundle = bundle.display(),
            data = dir.join("data").display(),
            socket = socket.display(),
        ),
    )
    .unwrap();
    (path, socket)
}

/// Runs jwt_svid.py with `args` against `socket` (as uid `as_uid` through setpriv when
/// given); its JSON, or its error output.
fn py(
    python: &Path,
    socket: &Path,
    as_uid: Option<u32>,
    args: &[&str],
) -> Result<serde_json::Value, String> {
    let mut cmd = match as_uid {
        Some(uid) => {
            let mut c = std::process::Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .arg("--clear-groups")
                .arg(python);
            c
        }
        None => std::process::Command::new(python),
    };
    cmd.arg(SCRIPT)
        .args(args)
        .env(
            "SPIFFE_ENDPOINT_SOCKET",
            format!("unix://{}", socket.display()),
        )
        .env("SIGNET_GRPC_DEFAULT_AUTHORITY", "localhost")
        .env("PYTHONWARNINGS", "ignore");
    let out = cmd
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("output is not JSON: {e}"))
}

fn s(v: &serde_json::Value) -> &str {
    v.as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn py_spiffe_gets_validates_and_caches_jwt_svids_and_the_agent_refuses_forgeries() {
    let Some(python) = python() else { return };
    let ca = FakeCa::start(my_uid()).await;
    let dir = tempfile::tempdir().unwrap();
    // Readable by another uid (the other-uid attack below connects to the socket).
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let bundle = dir.path().join("bundle.pem");
    std::fs::write(&bundle, ca.root_pem()).unwrap();
    let (cfg, socket) = config(dir.path(), ca.addr.port(), &bundle);
    let _agent = Agent::start(&cfg);

    // Once the agent holds the workload's identity, its JWT-SVID is served.
    let last = std::sync::Mutex::new(String::new());
    let first = eventually(30, "a JWT-SVID from the agent", || async {
        match py(&python, &socket, None, &["fetch", "svc-a"]) {
            Ok(v) if v.get("token").is_some() => Some(v),
            other => {
                // Shown once per new answer: why the agent does not serve yet.
                let now = format!("{other:?}");
                let mut l = last.lock().unwrap();
                if *l != now {
                    eprintln!("not yet: {now}");
                    *l = now;
                }
                None
            }
        }
    })
    .await;
    drop(last);
    assert_eq!(s(&first["spiffe_id"]), APP_ID);
    assert_eq!(s(&first["kid"]), ca.jwt_key_id());

    // Everything py-spiffe offers, unchanged.
    let all = py(&python, &socket, None, &["all", "svc-b,svc-a"]).unwrap();
    assert_eq!(s(&all["fetched"]["spiffe_id"]), APP_ID);
    assert_eq!(
        all["fetched"]["audience"],
        serde_json::json!(["svc-a", "svc-b"])
    );
    assert_eq!(all["fetched_all"], serde_json::json!([APP_ID]));
    assert_eq!(
        all["bundles"],
        serde_json::json!({ "example.org": [ca.jwt_key_id()] }),
        "the trust domain without scheme, every key with its kid"
    );
    assert_eq!(s(&all["parsed"]), APP_ID, "parse_and_validate");
    assert_eq!(s(&all["validated"]), APP_ID, "ValidateJWTSVID");
    assert_eq!(s(&all["source"]["spiffe_id"]), APP_ID, "JwtSource");
    assert_eq!(all["source"]["kids"], serde_json::json!([ca.jwt_key_id()]));

    // Cached: fetching again (audiences in any order) mints nothing.
    let minted = ca.jwt_minted();
    let again = py(&python, &socket, None, &["fetch", "svc-a"]).unwrap();
    assert_eq!(s(&again["token"]), s(&first["token"]), "the cached token");
    assert_eq!(ca.jwt_minted(), minted);

    // Another identity than the caller's own: PermissionDenied.
    let denied = py(
        &python,
        &socket,
        None,
        &["fetch", "svc-a", "spiffe://example.org/admin"],
    )
    .unwrap();
    let e = s(&denied["error"]);
    assert!(e.contains("PERMISSION_DENIED"), "{e}");
    assert!(e.contains("spiffe://example.org/admin"), "{e}");

    // Another uid is entitled to nothing: it never sees the cached token.
    if my_uid() == 0 {
        let other = py(&python, &socket, Some(65534), &["fetch", "svc-a"]).unwrap();
        let e = s(&other["error"]);
        assert!(e.contains("PERMISSION_DENIED"), "{other}");
        assert!(other.get("token").is_none());
    } else {
        eprintln!("not root: the other-uid check is skipped");
    }

    // Forgeries: refused by the agent (InvalidArgument, with the reason) and by py-spiffe.
    let foreign = FakeCa::foreign_jwt("svc-a");
    let attacks = py(&python, &socket, None, &["attacks", "svc-a", &foreign]).unwrap();
    for (name, why) in [
        ("none", "alg none is refused"),
        ("hs256", "alg HS256 is refused"),
        ("foreign", "is not in the trust bundle"),
        ("tampered", "signature does not verify"),
    ] {
        let agent = s(&attacks[name]["agent"]);
        assert!(
            agent.contains("INVALID_ARGUMENT") && agent.contains(why),
            "{name}: {agent}"
        );
        assert!(
            !attacks[name]["local"].is_null(),
            "{name}: py-spiffe accepted it"
        );
    }

    // The CA is down: the cached token is still served; a new audience cannot be minted.
    ca.set_jwt_down(true);
    let cached = py(&python, &socket, None, &["fetch", "svc-a"]).unwrap();
    assert_eq!(s(&cached["token"]), s(&first["token"]));
    let down = py(&python, &socket, None, &["fetch", "svc-new"]).unwrap();
    assert!(s(&down["error"]).contains("UNAVAILABLE"), "{down}");
    ca.set_jwt_down(false);

    // The signing key is tainted and a new one published: the next token is the new key's.
    let old = ca.jwt_key_id();
    let new = ca.rotate_jwt_key(true);
    let replaced = eventually(15, "a token from the new key", || async {
        py(&python, &socket, None, &["fetch", "svc-a"])
            .ok()
            .filter(|v| s(&v["kid"]) == new)
    })
    .await;
    assert_ne!(s(&replaced["token"]), s(&first["token"]));
    let all = py(&python, &socket, None, &["all", "svc-a"]).unwrap();
    let mut kids = vec![old, new];
    kids.sort();
    assert_eq!(all["bundles"]["example.org"], serde_json::json!(kids));
    assert_eq!(s(&all["validated"]), APP_ID);
}
