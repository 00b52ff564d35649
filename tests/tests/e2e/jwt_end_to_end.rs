//! Issue 26's "done means", with the real binaries and independent clients: a workload on a VM
//! gets a JWT-SVID for an audience from the real agent's socket with py-spiffe (which also
//! validates it against the fetched JWT bundle and through the agent's ValidateJWTSVID), a relying
//! party that knows only the OIDC issuer validates it with PyJWT against the discovery document
//! and its JWKS served over TLS by the real server, and the token is on the ledger
//! (`signetctl jwt list`, `ledger verify`). Then the same deployment across JWT key rotations
//! and a taint while tokens are in use: three relying parties (an OIDC one that refreshes its
//! JWKS only at the answer's `max-age`, py-spiffe's JwtSource, the agent's ValidateJWTSVID)
//! never see an unknown `kid` or refuse a token.

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use signet_proto::admin::node_admin_client::NodeAdminClient;
use signet_proto::admin::{CreateEntryRequest, CreateJoinTokenRequest};
use signet_tests::{Server, ServerOpts, bin};

const ISSUER: &str = "https://oidc.example.org/signet";
const JWT_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/py/jwt_svid.py");
const OIDC_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/py/oidc_validate.py");

fn run_py(python: &Path, args: &[&str], socket: &Path) -> Result<serde_json::Value, String> {
    let out = std::process::Command::new(python)
        .args(args)
        .env(
            "SPIFFE_ENDPOINT_SOCKET",
            format!("unix://{}", socket.display()),
        )
        .env("SIGNET_GRPC_DEFAULT_AUTHORITY", "localhost")
        .env("PYTHONWARNINGS", "ignore")
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("output is not JSON: {e}"))
}

const SUBJECT: &str = "spiffe://example.org/vm/billing";

/// Starts a real agent for `server`, attested with a join token as node `vm1`, and an entry
/// for this process's uid at [`SUBJECT`] with JWT-SVIDs of `jwt_ttl_seconds`; the agent and
/// its Workload API socket.
async fn agent_with_entry(
    server: &Server,
    dir: &Path,
    jwt_ttl_seconds: i64,
) -> (tokio::process::Child, std::path::PathBuf) {
    let mut admin = NodeAdminClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .unwrap(),
    );
    let token = admin
        .create_join_token(CreateJoinTokenRequest {
            ttl_seconds: 600,
            node_id: "vm1".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .token;
    let uid = std::fs::metadata(dir).unwrap().uid();
    let socket = dir.join("agent.sock");
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "server_address = \"https://127.0.0.1:{port}\"\ntrust_bundle_file = \"{bundle}\"\n\
             join_token = \"{token}\"\ndata_dir = \"{data}\"\nworkload_api_socket = \"{sock}\"\n\
             http_listen = \"127.0.0.1:0\"\nsync_interval = \"300ms\"\n",
            port = server.grpc.port(),
            bundle = server.bundle_path().display(),
            data = dir.join("data").display(),
            sock = socket.display(),
        ),
    )
    .unwrap();
    let agent = tokio::process::Command::new(bin("signet-agent"))
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    admin
        .create_entry(CreateEntryRequest {
            spiffe_id: SUBJECT.into(),
            parent: "vm1".into(),
            selectors: vec![format!("unix:uid:{uid}")],
            ttl_seconds: 3600,
            dns_names: vec![],
            jwt_ttl_seconds,
            federates_with: vec![],
        })
        .await
        .unwrap();
    (agent, socket)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_gets_a_jwt_svid_that_validates_everywhere_and_is_on_the_ledger() {
    let Some(python) = crate::workload_clients::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![rcgen::SanType::IpAddress([127, 0, 0, 1].into())];
    let cert = params.self_signed(&key).unwrap();
    let (cert_file, key_file) = (dir.path().join("oidc.pem"), dir.path().join("oidc.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let server = Server::start(ServerOpts {
        extra_toml: format!(
            "[jwt_svid]\nissuer = \"{ISSUER}\"\noidc_listen = \"127.0.0.1:0\"\n\
             oidc_tls_cert_file = \"{}\"\noidc_tls_key_file = \"{}\"\n",
            cert_file.display(),
            key_file.display()
        ),
        ..ServerOpts::default()
    })
    .await;
    let oidc: SocketAddr = server
        .stdout
        .iter()
        .find_map(|l| l.trim().strip_prefix("OIDC discovery (TLS): https://"))
        .and_then(|a| a.strip_suffix('/'))
        .unwrap_or_else(|| panic!("no OIDC listener in {:?}", server.stdout))
        .parse()
        .unwrap();

    let (_agent, socket) = agent_with_entry(&server, dir.path(), 600).await;

    // py-spiffe: fetch, parse_and_validate against the fetched bundle, ValidateJWTSVID, JwtSource.
    let mut got = Err(String::new());
    for _ in 0..150 {
        got = run_py(&python, &[JWT_SCRIPT, "all", "billing-api"], &socket);
        if got.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let got = got.unwrap_or_else(|e| panic!("py-spiffe got no JWT-SVID: {e}"));
    let id = SUBJECT;
    assert_eq!(got["fetched"]["spiffe_id"], id, "{got}");
    assert_eq!(got["parsed"], id, "{got}");
    assert_eq!(got["validated"], id, "{got}");
    let jwt = got["fetched"]["token"].as_str().unwrap().to_owned();

    // A relying party that knows only the issuer: PyJWT, the discovery document and its JWKS
    // over the server's OIDC TLS listener.
    let out = std::process::Command::new(&python)
        .args([
            OIDC_SCRIPT,
            ISSUER,
            &format!("https://{oidc}"),
            &jwt,
            "billing-api",
        ])
        .arg(&cert_file)
        .env("PYTHONWARNINGS", "ignore")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "PyJWT refused the token: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["claims"]["sub"], id, "{v}");
    assert_eq!(v["claims"]["iss"], ISSUER, "{v}");
    let c = &v["claims"];
    assert_eq!(
        c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(),
        600,
        "the entry's jwt_ttl: {v}"
    );
    // ... and it refuses the same token for another audience.
    let out = std::process::Command::new(&python)
        .args([
            OIDC_SCRIPT,
            ISSUER,
            &format!("https://{oidc}"),
            &jwt,
            "other",
        ])
        .arg(&cert_file)
        .env("PYTHONWARNINGS", "ignore")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "PyJWT took a token for another audience"
    );

    // Every token is on the ledger: listed by its subject, and the chain verifies.
    let out = server.signetctl(&["jwt", "list", "--json"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && listed.contains(id), "{listed}");
    let out = server.signetctl(&["ledger", "verify", "--json"]);
    let verdict: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert!(out.status.success(), "{verdict}");
    assert!(verdict["jwt_svids"].as_u64().unwrap() >= 1, "{verdict}");
}

const ROTATION_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/py/jwt_rotation.py");

/// Rotation and a taint while tokens are in use (see the module doc). JWT keys live 80 s (a key
/// mints only with 30 s of life left): the next one is prepared at 8 s and activated at 20 s, so
/// it is published 12 s (at least `key_propagation`, 3 s) before it signs; relying parties
/// refresh at the published `max-age` (1 s). The taint comes while the next key is prepared:
/// that key signs at once, and since it was published before, no relying party meets it unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_keys_rotate_and_are_tainted_under_load_without_a_validation_failure() {
    use std::time::{Duration, Instant};

    use crate::jwt_keys::{jwt_slots, status};

    let Some(python) = crate::workload_clients::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(ServerOpts {
        extra_toml: format!(
            "[ca]\nrotation_interval = \"200ms\"\nrotation_jitter = 0.0\n\
             [jwt_svid]\nissuer = \"{ISSUER}\"\nkey_ttl = \"80s\"\nkey_prepare_at = 0.1\n\
             key_activate_at = 0.25\nkey_propagation = \"3s\"\nttl = \"2s\"\nmax_ttl = \"20s\"\n"
        ),
        ..ServerOpts::default()
    })
    .await;
    let initial = status(&server)["active_jwt_key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_agent, socket) = agent_with_entry(&server, dir.path(), 0).await;
    let mut first = Err(String::new());
    for _ in 0..150 {
        first = run_py(&python, &[JWT_SCRIPT, "fetch", "rp"], &socket);
        if first.as_ref().is_ok_and(|v| v.get("token").is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let first = first.unwrap_or_else(|e| panic!("py-spiffe got no JWT-SVID: {e}"));
    assert!(first.get("token").is_some(), "{first}");

    // The workload and its three relying parties, until `stop` exists.
    let stop = dir.path().join("stop");
    let run = tokio::process::Command::new(&python)
        .args([
            ROTATION_SCRIPT,
            ISSUER,
            &format!("http://{}", server.http),
            "rp",
        ])
        .arg(&stop)
        .env(
            "SPIFFE_ENDPOINT_SOCKET",
            format!("unix://{}", socket.display()),
        )
        .env("SIGNET_GRPC_DEFAULT_AUTHORITY", "localhost")
        .env("PYTHONWARNINGS", "ignore")
        .kill_on_drop(true)
        .output();
    let run = tokio::spawn(run);

    // Wait for one rotation and the next key prepared, then taint the active one.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (active, prepared) = loop {
        let st = status(&server);
        let slots = jwt_slots(&st);
        let rotated = st["active_jwt_key_id"] != initial.as_str();
        let prepared = slots.iter().find(|s| s["state"] == "prepared");
        if let (true, Some(p)) = (rotated, prepared) {
            break (
                st["active_jwt_key_id"].as_str().unwrap().to_owned(),
                p["key_id"].as_str().unwrap().to_owned(),
            );
        }
        assert!(Instant::now() < deadline, "no rotation: {st}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Past two max-ages, so the OIDC relying party has refreshed since the prepare.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let out = server.signetctl(&["ca", "taint", &active]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(status(&server)["active_jwt_key_id"], prepared.as_str());
    // Tokens keep flowing under the new key for a while, then the run ends.
    tokio::time::sleep(Duration::from_secs(2)).await;
    std::fs::write(&stop, b"").unwrap();
    let out = run.await.unwrap().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["failures"], serde_json::json!([]), "{v}");
    assert_eq!(v["fetch_errors"], serde_json::json!([]), "{v}");
    let kids: Vec<&str> = v["kids"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|k| k.as_str())
        .collect();
    // The first key, the rotated-to key (tainted), and the prepared key after the taint.
    assert!(kids.len() >= 3, "{v}");
    assert_eq!(kids.last(), Some(&prepared.as_str()), "{v}");
    assert!(kids.contains(&active.as_str()), "{v}");
    assert!(kids.contains(&initial.as_str()), "{v}");
    assert_eq!(v["max_age"], 1, "{v}");
    assert!(v["jwks_fetches"].as_u64().unwrap() >= 5, "{v}");
    assert!(v["tokens"].as_u64().unwrap() >= 50, "{v}");
}

/// FetchJWTSVID for `spiffe_id` and `audience` on the agent's socket: the status code.
async fn fetch_jwt(
    channel: tonic::transport::Channel,
    spiffe_id: &str,
    audience: String,
) -> tonic::Code {
    use signet_proto::workload as pb;
    let mut client = pb::spiffe_workload_api_client::SpiffeWorkloadApiClient::new(channel);
    let mut req = tonic::Request::new(pb::JwtsvidRequest {
        audience: vec![audience],
        spiffe_id: spiffe_id.to_owned(),
    });
    req.metadata_mut()
        .insert("workload.spiffe.io", "true".parse().unwrap());
    match client.fetch_jwtsvid(req).await {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    }
}

/// Both reviews' finding F1, performed with the real binaries at the server's default limits:
/// one identity on a node asks for a new audience again and again (each a cache miss), 800
/// times at once: more than the server's default `issuance_per_source` burst (500). The agent refuses it past its own budget (ResourceExhausted) instead of
/// passing the flood on, so the node's share of the server (`issuance_per_source`) is left to
/// its neighbours: another identity on the same node still gets every new token it asks for,
/// and the flooder's ledger rows stay within its budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_flooding_new_audiences_leaves_its_neighbours_their_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(ServerOpts::default()).await;
    let (_agent, socket) = agent_with_entry(&server, dir.path(), 0).await;
    // A neighbour identity for the same process (the same uid selector, another SPIFFE ID).
    let neighbour = "spiffe://example.org/vm/neighbour";
    let uid = std::fs::metadata(dir.path()).unwrap().uid();
    NodeAdminClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .unwrap(),
    )
    .create_entry(CreateEntryRequest {
        spiffe_id: neighbour.into(),
        parent: "vm1".into(),
        selectors: vec![format!("unix:uid:{uid}")],
        ttl_seconds: 3600,
        dns_names: vec![],
        jwt_ttl_seconds: 0,
        federates_with: vec![],
    })
    .await
    .unwrap();
    let channel = || async { signet_client::connect_admin(&socket).await.unwrap() };
    // Both identities are served (the agent has synced both entries).
    for _ in 0..150 {
        let Ok(c) = signet_client::connect_admin(&socket).await else {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            continue;
        };
        if fetch_jwt(c.clone(), SUBJECT, "warm".into()).await == tonic::Code::Ok
            && fetch_jwt(c, neighbour, "warm".into()).await == tonic::Code::Ok
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let flood_channel = channel().await;
    let flood: Vec<_> = (0..800)
        .map(|i| {
            let c = flood_channel.clone();
            tokio::spawn(async move { fetch_jwt(c, SUBJECT, format!("flood-{i}")).await })
        })
        .collect();
    // The neighbour during the flood: every new token it asks for.
    let neighbour_channel = channel().await;
    let mut neighbour_codes = Vec::new();
    for i in 0..10 {
        neighbour_codes
            .push(fetch_jwt(neighbour_channel.clone(), neighbour, format!("n-{i}")).await);
    }
    let mut flood_codes = std::collections::BTreeMap::<String, usize>::new();
    for f in flood {
        *flood_codes
            .entry(format!("{:?}", f.await.unwrap()))
            .or_default() += 1;
    }
    assert!(
        neighbour_codes.iter().all(|c| *c == tonic::Code::Ok),
        "the neighbour was starved: {neighbour_codes:?} (flood: {flood_codes:?})"
    );
    let refused = flood_codes.get("ResourceExhausted").copied().unwrap_or(0);
    let ok = flood_codes.get("Ok").copied().unwrap_or(0);
    assert!(
        refused >= 300,
        "the agent passed the flood on: {flood_codes:?}"
    );
    // At most its burst (50, the warm-up's one included) plus what refilled meanwhile.
    assert!(ok <= 70, "{flood_codes:?}");
    // The flood's rows on the ledger: no more than what the agent let through.
    let out = server.signetctl(&[
        "jwt",
        "list",
        "--json",
        "--limit",
        "0",
        "--spiffe-id",
        SUBJECT,
    ]);
    assert!(out.status.success());
    let rows = String::from_utf8_lossy(&out.stdout).lines().count();
    assert!(rows <= ok + 1, "{rows} rows for {ok} tokens served");
}
