//! End-to-end: the real `signet-server` binary, a real PostgreSQL (started by scripts/test),
//! real TLS, real service-account tokens, openssl and signetctl as independent checkers.
#![allow(clippy::unwrap_used)]
// They wait for real processes (servers, agents, openssl) on the real clock; the clock-module
// rule of clippy.toml is for the code they test.
#![allow(clippy::disallowed_methods)]

mod admin_cli;
mod agent;
mod agent_outage;
mod agent_revocation;
mod attacks;
mod bad_input;
mod bridge;
mod ca_rotation;
mod checkpoints;
mod database_outages;
mod entries;
mod fake_kube;
mod federation;
mod federation_domains;
mod identities;
mod independent;
mod issuance;
mod jwt_end_to_end;
mod jwt_issuance;
mod jwt_keys;
mod jwt_workload;
mod k8s;
mod k8s_certificate;
mod lifecycle;
mod metrics;
mod node_psat;
mod node_sets;
mod nodes;
mod operations;
mod plugged;
mod readme;
mod registration;
mod revocation;
mod rotation_handshakes;
mod sds;
mod sink_harness;
mod telemetry;
mod workload_clients;

use signet_tests::{Server, ServerOpts, TokenIssuer};

/// A server on a fresh PostgreSQL database with Kubernetes token auth; None when PostgreSQL
/// is not available outside CI (the helper panics in CI).
pub async fn pg_server(tokens: &TokenIssuer, extra_toml: &str) -> Option<Server> {
    let url = signet_testutil::fresh_postgres_database().await?;
    Some(
        Server::start(ServerOpts {
            database_url: Some(url),
            tokens: Some(tokens.jwks_json()),
            extra_toml: extra_toml.into(),
            ..ServerOpts::default()
        })
        .await,
    )
}
