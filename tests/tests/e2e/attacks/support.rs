//! What several attack modules need: a node attested with a join token, entries and their
//! certificates through the node API, mTLS identities from issued chains, an Istio chain for a
//! token, and `psql` for the database attacker.

use signet_client::ClientIdentity;
use signet_proto::admin::node_admin_client::NodeAdminClient;
use signet_proto::admin::{CreateEntryRequest, CreateJoinTokenRequest, GetCertificateRequest};
use signet_proto::agent::node_client::NodeClient;
use signet_proto::agent::{AttestRequest, SignWorkloadsRequest, WorkloadCsr};
use signet_proto::ca::SignCsrRequest;
use signet_proto::ca::certificate_authority_client::CertificateAuthorityClient;
use signet_tests::Server;
use tonic::transport::Channel;

pub async fn node_admin(server: &Server) -> NodeAdminClient<Channel> {
    NodeAdminClient::new(
        signet_client::connect_admin(&server.admin_socket())
            .await
            .unwrap(),
    )
}

/// An mTLS identity from a DER chain and its key.
pub fn identity(chain: &[Vec<u8>], key_pem: &str) -> ClientIdentity {
    ClientIdentity {
        cert_chain_pem: chain
            .iter()
            .map(|d| signet_types::pem::cert_to_pem(d))
            .collect::<String>()
            .into_bytes(),
        key_pem: key_pem.as_bytes().to_vec(),
    }
}

/// Attests `node_id` with a fresh join token, as an agent does; returns its node identity.
pub async fn attest_node(server: &Server, node_id: &str) -> ClientIdentity {
    let token = node_admin(server)
        .await
        .create_join_token(CreateJoinTokenRequest {
            ttl_seconds: 0,
            node_id: node_id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .token;
    let kc = signet_client::new_key_and_csr().unwrap();
    let r = NodeClient::new(server.channel().await)
        .attest(AttestRequest {
            join_token: token,
            csr: kc.csr_der,
        })
        .await
        .unwrap()
        .into_inner();
    identity(&r.svid.unwrap().cert_chain, &kc.key_pem)
}

/// Creates an entry parented to `node_id`; returns its ID.
pub async fn create_entry(
    server: &Server,
    node_id: &str,
    path: &str,
    ttl_seconds: i64,
    dns: &[&str],
) -> String {
    node_admin(server)
        .await
        .create_entry(CreateEntryRequest {
            spiffe_id: format!("spiffe://example.org{path}"),
            parent: node_id.into(),
            selectors: vec!["unix:uid:1000".into()],
            ttl_seconds,
            dns_names: dns.iter().map(|s| s.to_string()).collect(),
            jwt_ttl_seconds: 0,
            federates_with: vec![],
        })
        .await
        .unwrap()
        .into_inner()
        .id
}

/// The certificate the node obtains for `entry_id` (what the agent delivers to the
/// workload): its mTLS identity and serial.
pub async fn entry_certificate(
    server: &Server,
    node: &ClientIdentity,
    entry_id: &str,
) -> (ClientIdentity, String) {
    let kc = signet_client::new_key_and_csr().unwrap();
    let r = NodeClient::new(server.channel_with(node).await)
        .sign_workloads(SignWorkloadsRequest {
            csrs: vec![WorkloadCsr {
                entry_id: entry_id.into(),
                csr: kc.csr_der,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let svid = r.results[0]
        .svid
        .clone()
        .unwrap_or_else(|| panic!("entry {entry_id} not signed: {:?}", r.results[0].message));
    (identity(&svid.cert_chain, &kc.key_pem), svid.serial)
}

/// `SignCsr` over mTLS with `holder`'s certificate: the renewal a stolen or delivered
/// certificate attempts. Returns (identity, serial, lifetime in seconds incl. backdating).
pub async fn renew_over_mtls(
    server: &Server,
    holder: &ClientIdentity,
    ttl_seconds: i64,
    dns: &[&str],
) -> Result<(ClientIdentity, String, i64), tonic::Status> {
    let (csr_pem, key) = signet_tests::csr_with(&[], dns);
    let r = CertificateAuthorityClient::new(server.channel_with(holder).await)
        .sign_csr(SignCsrRequest {
            csr: csr_pem.into_bytes(),
            ttl_seconds,
            kubernetes_namespace: String::new(),
        })
        .await?
        .into_inner();
    Ok((
        identity(&r.cert_chain, &key.serialize_pem()),
        r.serial,
        r.not_after - r.not_before,
    ))
}

/// The ledger's provenance record of `serial`, parsed.
pub async fn provenance(server: &Server, serial: &str) -> serde_json::Value {
    let row = server
        .admin()
        .await
        .get_certificate(GetCertificateRequest {
            serial: serial.into(),
        })
        .await
        .unwrap()
        .into_inner();
    serde_json::from_str(&row.provenance)
        .unwrap_or_else(|e| panic!("provenance of {serial}: {e}: {:?}", row.provenance))
}

/// Asserts that `r` is a PermissionDenied whose message contains `want`.
#[track_caller]
pub fn assert_denied<T: std::fmt::Debug>(r: Result<T, tonic::Status>, want: &str) {
    let e = r.expect_err(want);
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains(want), "{want}: {}", e.message());
}

/// Runs `sql` in `url` with psql, as someone with database access does.
pub fn psql(url: &str, sql: &str) {
    psql_one(url, sql);
}

/// [`psql`], returning the output unaligned, without headers (`-At`), trimmed.
pub fn psql_one(url: &str, sql: &str) -> String {
    let out = std::process::Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-At", "-c", sql])
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The Istio API's `cert_chain` for the `payments/api` service account's token (leaf,
/// intermediate, then every root concatenated).
pub async fn istio_chain(server: &Server, tokens: &signet_tests::TokenIssuer) -> Vec<String> {
    let (csr, _key) = signet_tests::csr_with(&[], &[]);
    let req = signet_client::with_bearer(
        signet_proto::istio_ca::IstioCertificateRequest {
            csr,
            validity_duration: 600,
            metadata: None,
        },
        &tokens.token("payments", "api"),
    )
    .unwrap();
    server
        .istio()
        .await
        .create_certificate(req)
        .await
        .unwrap()
        .into_inner()
        .cert_chain
}
