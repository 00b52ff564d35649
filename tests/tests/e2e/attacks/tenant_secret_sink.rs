//! A tenant's own Secret happens to carry the name an agent's `kubernetes-secret` sink writes
//! (or was planted there). Against the real agent and server, with a fake API server that
//! shapes Secrets as Kubernetes does (uid, resourceVersion, managedFields): the tenant's
//! Secret is never overwritten nor deleted, the refusal is reported, and the agent's own
//! Secret is created, updated on rotation and deleted when its entry goes away.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;
use signet_tests::{TokenIssuer, serial_of, uri_sans};

use crate::agent::{create_entry, create_token, eventually};
use crate::fake_kube::{FakeKube, secret_object};
use crate::pg_server;
use crate::sink_harness::{RunningAgent, agent_files};

const ID: &str = "spiffe://example.org/ns/prod/sa/web";

fn sink(name: &str, secret: &str) -> String {
    format!(
        "[[sinks]]\nname = \"{name}\"\nkind = \"kubernetes-secret\"\nspiffe_id = \"{ID}\"\n\
         namespace = \"prod\"\nsecret_name = \"{secret}\"\n"
    )
}

/// The serial of the certificate in the agent's Secret `name`, if there is one.
fn secret_serial(kube: &FakeKube, name: &str) -> Option<String> {
    let s = kube.get("prod", name)?;
    let pem = STANDARD.decode(s["data"]["tls.crt"].as_str()?).ok()?;
    let pem = String::from_utf8(pem).ok()?;
    let end = pem.find("-----END CERTIFICATE-----")?;
    Some(serial_of(&pem[..end + "-----END CERTIFICATE-----\n".len()]))
}

#[tokio::test]
async fn a_secret_the_agent_does_not_own_is_never_overwritten_or_deleted() {
    let tokens = TokenIssuer::new("k1");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let token = create_token(&server, "kube-node");
    let entry = create_entry(&server, ID, "kube-node", &["--ttl", "4s"]);
    let kube = FakeKube::start(false).await;
    // The tenant's Secrets: one plainly theirs, one wearing Signet's label.
    let theirs = secret_object("prod", "theirs", json!({"app": "web"}), &["kubectl-create"]);
    let forged = secret_object(
        "prod",
        "forged",
        json!({"app.kubernetes.io/managed-by": "signet"}),
        &["kubectl-client-side-apply"],
    );
    kube.put("prod", "theirs", theirs.clone());
    kube.put("prod", "forged", forged.clone());

    let sinks = [
        sink("foreign", "theirs"),
        sink("forged", "forged"),
        sink("own", "ours"),
    ]
    .concat();
    let files = agent_files(&server, &token, &kube.agent_toml("5s"), &sinks);
    let agent = RunningAgent::start(&files.config).await;

    // The agent's own Secret: created, then updated on rotation.
    let first = eventually(30, "the agent's Secret", || async {
        secret_serial(&kube, "ours")
    })
    .await;
    eventually(15, "the agent's Secret updated", || async {
        secret_serial(&kube, "ours").filter(|s| *s != first)
    })
    .await;
    let ours = kube.get("prod", "ours").unwrap();
    assert_eq!(ours["type"], "kubernetes.io/tls");
    let crt = String::from_utf8(
        STANDARD
            .decode(ours["data"]["tls.crt"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(uri_sans(&crt), [ID]);
    let key = String::from_utf8(
        STANDARD
            .decode(ours["data"]["tls.key"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));

    // The tenant's Secrets are untouched, and the agent only ever read them.
    assert_eq!(kube.get("prod", "theirs"), Some(theirs.clone()));
    assert_eq!(kube.get("prod", "forged"), Some(forged.clone()));
    let writes = |name: &str| {
        kube.seen()
            .into_iter()
            .filter(|s| s.method != "GET" && s.path.ends_with(&format!("/secrets/{name}")))
            .count()
    };
    assert_eq!(writes("theirs"), 0);
    assert_eq!(writes("forged"), 0);
    // Updates of its own Secret are conditional, forced applies by signet-agent.
    let patch = kube
        .seen()
        .into_iter()
        .find(|s| s.method == "PATCH")
        .expect("an update");
    assert!(patch.path.ends_with("/secrets/ours"), "{patch:?}");
    assert_eq!(patch.query, "fieldManager=signet-agent&force=true");
    assert!(
        patch.body["metadata"]["resourceVersion"].is_string(),
        "{patch:?}"
    );

    // The refusals are reported.
    let (code, body) = agent.readyz().await;
    assert_eq!(code, 200, "{body}");
    for sink in ["foreign", "forged"] {
        assert!(
            body.lines().any(|l| l.contains(&format!("sink \"{sink}\""))
                && l.contains("not managed by this agent")),
            "{sink}: {body}"
        );
        let refused = agent
            .metric(
                "signet_agent_sink_failures_total",
                &[&format!("sink=\"{sink}\""), "reason=\"refused\""],
            )
            .await;
        assert!(refused.unwrap_or(0.0) >= 1.0, "{sink}");
    }
    assert!(!body.contains("sink \"own\""), "{body}");

    // The entry goes away: the agent's Secret is deleted (with preconditions), the tenant's
    // stay.
    let out = server.signetctl(&["entry", "delete", &entry]);
    assert!(out.status.success(), "{out:?}");
    eventually(20, "the agent's Secret deleted", || async {
        kube.get("prod", "ours").is_none().then_some(())
    })
    .await;
    let delete = kube
        .seen()
        .into_iter()
        .find(|s| s.method == "DELETE")
        .expect("a delete");
    assert!(delete.path.ends_with("/secrets/ours"), "{delete:?}");
    assert_eq!(delete.body["preconditions"]["uid"], "uid-ours");
    // Give the other sinks' removals time to be tried (and refused).
    eventually(
        10,
        "the removal refused for the tenant's Secret",
        || async {
            let (_, body) = agent.readyz().await;
            body.contains("refusing to delete it").then_some(())
        },
    )
    .await;
    assert_eq!(kube.get("prod", "theirs"), Some(theirs));
    assert_eq!(kube.get("prod", "forged"), Some(forged));
    assert_eq!(writes("theirs"), 0);
    assert_eq!(writes("forged"), 0);
    agent.stop().await;
}
