//! Every manifest an operator applies from `deploy/` is checked offline, with real tools where
//! one runs without an API server:
//!
//! - `kubectl kustomize deploy/` must build (every file the kustomization names exists and
//!   parses); it yields exactly the objects listed in [`EXPECTED`].
//! - Each built-in object, of the kustomization and of `deploy/examples/` and `deploy/optional/`,
//!   passes `kubernetes-validate --strict` (the Kubernetes OpenAPI schemas, shipped in the
//!   package; strict refuses unknown fields). `scripts/test` installs it from PyPI and sets
//!   `SIGNET_KUBERNETES_VALIDATE`. (`kubectl apply --dry-run=client` needs an API server for
//!   discovery and the OpenAPI document, even with `--validate=false`, so it cannot run here.)
//! - Each custom resource in `deploy/examples/` is checked against its CRD's
//!   `openAPIV3Schema` (ours from `deploy/crds/`, cert-manager's `Certificate` from
//!   `tests/fixtures/`): unknown fields, types, enums, required fields, as the API server's
//!   structural-schema validation would.
//! - The TOML in the ConfigMaps loads with the server's and the agent's own config types.
//! - The pieces agree: token audiences, service-account names in the server's policy, mount
//!   paths of the files the configs name, Service and PodDisruptionBudget selectors.
//!
//! - `deploy/monitoring/` (applied apart: it needs the Prometheus Operator's CRDs, which
//!   kubernetes-validate does not know) builds, its objects pass the operator's CRD schemas
//!   (`tests/fixtures/monitoring.coreos.com_*.yaml`), its monitors find the Service, pods and
//!   ports of `deploy/`, its PrometheusRule holds exactly the groups of `alerts.yaml`, and
//!   `promtool check rules` and `promtool test rules` (every alert fired) pass.
//!
//! With CI=true a missing kubectl, kubernetes-validate or promtool fails the test; elsewhere it
//! is skipped with a message.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// `(kind, namespace, name)` of every object `kubectl kustomize deploy/` must yield.
const EXPECTED: &[(&str, &str, &str)] = &[
    ("Namespace", "", "signet-system"),
    ("CustomResourceDefinition", "", "issuers.signet.dev"),
    ("CustomResourceDefinition", "", "clusterissuers.signet.dev"),
    (
        "CustomResourceDefinition",
        "",
        "clusteridentities.signet.dev",
    ),
    ("CustomResourceDefinition", "", "identities.signet.dev"),
    ("CustomResourceDefinition", "", "tenants.signet.dev"),
    ("ServiceAccount", "signet-system", "signet-server"),
    ("ConfigMap", "signet-system", "signet-server-config"),
    ("Deployment", "signet-system", "signet-server"),
    ("Service", "signet-system", "signet-server"),
    ("PodDisruptionBudget", "signet-system", "signet-server"),
    ("NetworkPolicy", "signet-system", "signet-server"),
    ("NetworkPolicy", "signet-system", "signet-agent"),
    ("NetworkPolicy", "signet-system", "signet-k8s"),
    ("ServiceAccount", "signet-system", "signet-agent"),
    ("ClusterRole", "", "signet-agent"),
    ("ClusterRoleBinding", "", "signet-agent"),
    ("ConfigMap", "signet-system", "signet-agent-config"),
    ("DaemonSet", "signet-system", "signet-agent"),
    ("CSIDriver", "", "csi.spiffe.io"),
    ("ServiceAccount", "signet-system", "spiffe-csi-driver"),
    ("DaemonSet", "signet-system", "spiffe-csi-driver"),
    ("ServiceAccount", "signet-system", "signet-k8s"),
    ("ClusterRole", "", "signet-k8s"),
    ("ClusterRoleBinding", "", "signet-k8s"),
    ("Role", "signet-system", "signet-k8s"),
    ("RoleBinding", "signet-system", "signet-k8s"),
    ("ClusterRole", "", "signet-identity-editor"),
    ("Deployment", "signet-system", "signet-k8s"),
    (
        "ClusterRole",
        "",
        "cert-manager-controller-approve:signet-dev",
    ),
    (
        "ClusterRoleBinding",
        "",
        "cert-manager-controller-approve:signet-dev",
    ),
];

/// Objects Kubernetes itself creates in every namespace: referenced, never shipped.
const CLUSTER_PROVIDED: &[(&str, &str)] = &[("ConfigMap", "kube-root-ca.crt")];

/// Objects the operator creates (deploy/README.md, step 2): referenced, never shipped.
const OPERATOR_PROVIDED: &[(&str, &str)] = &[
    ("Secret", "signet-database"),
    ("Secret", "signet-kek"),
    ("Secret", "signet-checkpoint"),
    ("ConfigMap", "signet-jwks"),
    ("ConfigMap", "signet-bundle"),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// A required tool: its path, or `None` (skip) outside CI.
fn tool(env: &str, default: &str, install_hint: &str) -> Option<PathBuf> {
    let candidate = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    let found = Command::new(&candidate)
        .arg("--help")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some(candidate);
    }
    assert!(
        !ci(),
        "{} not found (set {env}): CI requires it; {install_hint}",
        candidate.display()
    );
    eprintln!(
        "SKIPPED: {} not found (set {env}); {install_hint}",
        candidate.display()
    );
    None
}

fn kubectl() -> Option<PathBuf> {
    tool("SIGNET_KUBECTL", "kubectl", "install kubectl")
}

fn kubernetes_validate() -> Option<PathBuf> {
    tool(
        "SIGNET_KUBERNETES_VALIDATE",
        "kubernetes-validate",
        "scripts/test installs it (PyPI: kubernetes-validate)",
    )
}

fn parse_yaml_stream(text: &str, what: &str) -> Vec<Value> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).unwrap_or_else(|e| panic!("{what}: not YAML: {e}"));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn read_yaml_file(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    parse_yaml_stream(&text, &path.display().to_string())
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    files
}

fn kustomize() -> Option<Vec<Value>> {
    kustomize_dir("deploy")
}

/// `kubectl kustomize <dir>` (relative to the repository), or `None` (skip) without kubectl.
fn kustomize_dir(dir: &str) -> Option<Vec<Value>> {
    let kubectl = kubectl()?;
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(repo().join(dir))
        .output()
        .expect("running kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}/ failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    Some(parse_yaml_stream(
        &text,
        &format!("kubectl kustomize {dir}/"),
    ))
}

fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn id(o: &Value) -> String {
    let ns = s(o, "/metadata/namespace");
    let ns = if ns.is_empty() {
        String::new()
    } else {
        format!("{ns}/")
    };
    format!("{} {ns}{}", s(o, "/kind"), s(o, "/metadata/name"))
}

fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| s(o, "/kind") == kind && s(o, "/metadata/name") == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn is_custom(o: &Value) -> bool {
    let group = s(o, "/apiVersion").rsplit_once('/').map_or("", |(g, _)| g);
    group == "signet.dev" || group == "cert-manager.io" || group == "monitoring.coreos.com"
}

// ---------------------------------------------------------------------------------------------
// kubernetes-validate over built-in objects

/// Runs `kubernetes-validate --strict` over `objs` (one JSON document each: JSON is YAML) and
/// insists that every one of them is reported as passed, so none is silently skipped.
fn validate_builtin(tool: &Path, objs: &[&Value]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut files = Vec::new();
    for (i, o) in objs.iter().enumerate() {
        let f = dir.path().join(format!("{i:03}.yaml"));
        std::fs::write(&f, serde_json::to_string_pretty(o).expect("json")).expect("write");
        files.push(f);
    }
    let out = Command::new(tool)
        .arg("--strict")
        .args(&files)
        .output()
        .expect("running kubernetes-validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "kubernetes-validate --strict:\n{text}"
    );
    for (o, f) in objs.iter().zip(&files) {
        let passed = text
            .lines()
            .any(|l| l.contains(&*f.to_string_lossy()) && l.contains(" passed for resource "));
        assert!(passed, "{} was not validated:\n{text}", id(o));
    }
}

#[test]
fn kustomization_builds_and_every_object_passes_the_kubernetes_schemas() {
    let Some(objs) = kustomize() else { return };
    let got: BTreeSet<String> = objs.iter().map(id).collect();
    let want: BTreeSet<String> = EXPECTED
        .iter()
        .map(|(k, ns, n)| {
            let ns = if ns.is_empty() {
                String::new()
            } else {
                format!("{ns}/")
            };
            format!("{k} {ns}{n}")
        })
        .collect();
    assert_eq!(got, want, "objects of kubectl kustomize deploy/");
    assert_eq!(got.len(), objs.len(), "an object appears twice");
    for o in &objs {
        assert!(
            !is_custom(o),
            "{}: custom resources belong in examples/",
            id(o)
        );
        if let Some(ns) = o.pointer("/metadata/namespace").and_then(Value::as_str) {
            assert_eq!(ns, "signet-system", "{}", id(o));
        }
    }
    let Some(tool) = kubernetes_validate() else {
        return;
    };
    validate_builtin(&tool, &objs.iter().collect::<Vec<_>>());
}

#[test]
fn examples_and_optional_manifests_pass_their_schemas() {
    let deploy = repo().join("deploy");
    let mut objs = Vec::new();
    for dir in ["examples", "optional"] {
        for f in yaml_files(&deploy.join(dir)) {
            let docs = read_yaml_file(&f);
            assert!(!docs.is_empty(), "{}: no object", f.display());
            objs.extend(docs);
        }
    }
    // Custom resources: against their CRDs' schemas.
    let mut crds = Vec::new();
    for f in yaml_files(&deploy.join("crds")) {
        crds.extend(read_yaml_file(&f));
    }
    crds.extend(read_yaml_file(
        &repo().join("tests/fixtures/cert-manager.io_certificates.yaml"),
    ));
    let mut custom = 0;
    for o in objs.iter().filter(|o| is_custom(o)) {
        let errors = validate_custom(o, &crds);
        assert!(errors.is_empty(), "{}:\n  {}", id(o), errors.join("\n  "));
        custom += 1;
    }
    assert!(
        custom >= 6,
        "the examples hold an Issuer, a ClusterIssuer, a Certificate, a ClusterIdentity, an \
         Identity and a Tenant"
    );
    for (kind, name) in [
        ("Issuer", "signet"),
        ("ClusterIssuer", "signet"),
        ("Certificate", "web"),
    ] {
        find(&objs, kind, name);
    }
    let cert = find(&objs, "Certificate", "web");
    assert_eq!(s(cert, "/spec/issuerRef/group"), "signet.dev");
    assert_eq!(
        s(cert, "/spec/uris/0"),
        "spiffe://example.org/ns/demo/sa/web"
    );
    assert_eq!(s(cert, "/spec/dnsNames/0"), "web.demo.svc");
    // The identity objects: each kind once, the namespaced one in its tenant's namespace.
    let id = find(&objs, "Identity", "web");
    assert_eq!(s(id, "/apiVersion"), "signet.dev/v1alpha1");
    assert_eq!(s(id, "/metadata/namespace"), "demo");
    assert!(!s(id, "/spec/path").starts_with('/'));
    let tenant = find(&objs, "Tenant", "demo");
    assert_eq!(s(tenant, "/spec/namespaces/0"), "demo");
    let ci = find(&objs, "ClusterIdentity", "mesh");
    assert!(s(ci, "/spec/spiffeIdTemplate").contains("{namespace}"));

    let builtin: Vec<&Value> = objs.iter().filter(|o| !is_custom(o)).collect();
    let Some(tool) = kubernetes_validate() else {
        return;
    };
    validate_builtin(&tool, &builtin);
}

// ---------------------------------------------------------------------------------------------
// Structural-schema check of custom resources

fn validate_custom(obj: &Value, crds: &[Value]) -> Vec<String> {
    let api_version = s(obj, "/apiVersion");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = s(obj, "/kind");
    let Some(crd) = crds.iter().find(|c| {
        s(c, "/kind") == "CustomResourceDefinition"
            && s(c, "/spec/group") == group
            && s(c, "/spec/names/kind") == kind
    }) else {
        return vec![format!("no CRD for {kind}.{group}")];
    };
    let Some(v) = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| vs.iter().find(|v| s(v, "/name") == version))
    else {
        return vec![format!("{kind}.{group} has no version {version}")];
    };
    if v.pointer("/served") != Some(&Value::Bool(true)) {
        return vec![format!("{kind}.{group}/{version} is not served")];
    }
    let namespaced = s(crd, "/spec/scope") == "Namespaced";
    let has_ns = obj.pointer("/metadata/namespace").is_some();
    let mut errors = Vec::new();
    if namespaced != has_ns {
        errors.push(format!(
            "metadata.namespace: {kind} is {} but the object {} one",
            s(crd, "/spec/scope"),
            if has_ns { "has" } else { "has not" }
        ));
    }
    if s(obj, "/metadata/name").is_empty() {
        errors.push("metadata.name: missing".into());
    }
    let schema = v
        .pointer("/schema/openAPIV3Schema")
        .expect("CRD version without openAPIV3Schema");
    // apiVersion, kind and metadata are the API server's, not the schema's.
    let mut body = obj.clone();
    if let Some(m) = body.as_object_mut() {
        m.remove("apiVersion");
        m.remove("kind");
        m.remove("metadata");
    }
    check(&body, schema, "", &mut errors);
    errors
}

fn check(v: &Value, schema: &Value, path: &str, errors: &mut Vec<String>) {
    let at = if path.is_empty() { "<root>" } else { path };
    if v.is_null() {
        if schema.get("nullable") != Some(&Value::Bool(true)) {
            errors.push(format!("{at}: null is not allowed"));
        }
        return;
    }
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        if !(v.is_string() || v.is_i64() || v.is_u64()) {
            errors.push(format!("{at}: want an integer or a string, got {v}"));
        }
        return;
    }
    if let Some(en) = schema.get("enum").and_then(Value::as_array)
        && !en.contains(v)
    {
        errors.push(format!(
            "{at}: {v} is not one of {}",
            Value::Array(en.clone())
        ));
    }
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Some(m) = v.as_object() else {
                errors.push(format!("{at}: want an object, got {v}"));
                return;
            };
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            for req in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                if !m.contains_key(req) {
                    errors.push(format!("{at}: required field {req} is missing"));
                }
            }
            for (k, child) in m {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if let Some(ps) = props.and_then(|ps| ps.get(k)) {
                    check(child, ps, &p, errors);
                } else if let Some(a) = additional.filter(|a| a.is_object()) {
                    check(child, a, &p, errors);
                } else if !(preserve || additional == Some(&Value::Bool(true))) {
                    errors.push(format!("{p}: unknown field"));
                }
            }
        }
        Some("array") => {
            let Some(a) = v.as_array() else {
                errors.push(format!("{at}: want a list, got {v}"));
                return;
            };
            if let Some(items) = schema.get("items") {
                for (i, item) in a.iter().enumerate() {
                    check(item, items, &format!("{path}[{i}]"), errors);
                }
            }
        }
        Some("string") if !v.is_string() => {
            errors.push(format!("{at}: want a string, got {v}"));
        }
        Some("integer") if !(v.is_i64() || v.is_u64()) => {
            errors.push(format!("{at}: want an integer, got {v}"));
        }
        Some("number") if !v.is_number() => {
            errors.push(format!("{at}: want a number, got {v}"));
        }
        Some("boolean") if !v.is_boolean() => {
            errors.push(format!("{at}: want true or false, got {v}"));
        }
        _ => {}
    }
}

#[test]
fn the_custom_resource_check_catches_mistakes() {
    let crds = read_yaml_file(&repo().join("tests/fixtures/cert-manager.io_certificates.yaml"));
    let good = serde_json::json!({
        "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
        "metadata": {"name": "a", "namespace": "n"},
        "spec": {"secretName": "a", "issuerRef": {"name": "i", "group": "signet.dev", "kind": "Issuer"},
                 "privateKey": {"algorithm": "ECDSA", "size": 256}, "duration": "1h"}
    });
    assert_eq!(validate_custom(&good, &crds), Vec::<String>::new());
    let mut bad = good.clone();
    bad["spec"]["secretNmae"] = "x".into();
    bad["spec"]["privateKey"]["algorithm"] = "DSA".into();
    bad["spec"]["privateKey"]["size"] = "256".into();
    bad["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("issuerRef");
    bad["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("namespace");
    let errors = validate_custom(&bad, &crds).join("\n");
    for want in [
        "spec.secretNmae: unknown field",
        "spec.privateKey.algorithm: \"DSA\" is not one of",
        "spec.privateKey.size: want an integer",
        "required field issuerRef is missing",
        "metadata.namespace",
    ] {
        assert!(errors.contains(want), "{want:?} not in:\n{errors}");
    }
    let mut wrong_version = good;
    wrong_version["apiVersion"] = "cert-manager.io/v2".into();
    assert!(validate_custom(&wrong_version, &crds)[0].contains("no version v2"));
}

// ---------------------------------------------------------------------------------------------
// The configs in the ConfigMaps, and how the pieces fit

fn config_map_file(objs: &[Value], name: &str, key: &str) -> String {
    let cm = find(objs, "ConfigMap", name);
    cm.pointer(&format!("/data/{key}"))
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("ConfigMap {name} has no key {key}"))
        .to_owned()
}

fn pod_spec<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    find(objs, kind, name)
        .pointer("/spec/template/spec")
        .unwrap_or_else(|| panic!("{kind} {name}: no pod template"))
}

/// The volume mounted at the directory holding `file`, in the pod's first container.
fn volume_for_file<'a>(pod: &'a Value, file: &str) -> &'a Value {
    let dir = Path::new(file).parent().expect("a file path");
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| Path::new(s(m, "/mountPath")) == dir)
        .unwrap_or_else(|| panic!("no volume mounted at {}", dir.display()));
    pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume {}", mount["name"]))
}

fn file_name(p: &str) -> &str {
    Path::new(p)
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or("")
}

fn token_audience(pod: &Value, token_file: &str) -> String {
    let vol = volume_for_file(pod, token_file);
    let src = vol
        .pointer("/projected/sources")
        .and_then(Value::as_array)
        .and_then(|srcs| srcs.iter().find(|x| x.get("serviceAccountToken").is_some()))
        .unwrap_or_else(|| panic!("{token_file}: not a projected service-account token"));
    assert_eq!(s(src, "/serviceAccountToken/path"), file_name(token_file));
    s(src, "/serviceAccountToken/audience").to_owned()
}

fn strs(v: Option<&toml::Value>) -> Vec<String> {
    v.and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_str().map(str::to_owned))
        .collect()
}

#[test]
fn configs_load_and_the_pieces_agree() {
    let Some(objs) = kustomize() else { return };
    let dir = tempfile::tempdir().expect("temp dir");

    // The server's config, loaded by the server's own loader (unknown keys are refused).
    let server_toml = config_map_file(&objs, "signet-server-config", "server.toml");
    let path = dir.path().join("server.toml");
    std::fs::write(&path, &server_toml).expect("write");
    // The database URL comes from the Secret (SIGNET_DATABASE_URL); without it the server
    // refuses to start (require_database_url).
    let e = signet_server::config::Config::load(Some(&path), serde_json::json!({}))
        .expect_err("no database URL");
    assert!(e.to_string().contains("require_database_url"), "{e}");
    let server = signet_server::config::Config::load(
        Some(&path),
        serde_json::json!({"database_url": "postgres://signet@db.example/signet"}),
    )
    .unwrap_or_else(|e| panic!("deploy/server.yaml server.toml: {e}"));
    assert!(
        server.listen.ip().is_unspecified(),
        "gRPC must listen on the pod IP"
    );
    assert!(
        server.http_listen.ip().is_unspecified(),
        "probes reach the pod IP"
    );

    let agent_toml = config_map_file(&objs, "signet-agent-config", "agent.toml");
    let path = dir.path().join("agent.toml");
    // In the pod the node name comes from NODE_NAME (the downward API, checked below); a test
    // cannot set the environment, so it names a node in the file it loads.
    let loadable = agent_toml.replace(
        "source = \"api-server\"",
        "source = \"api-server\"\nnode_name = \"node-1\"",
    );
    assert_ne!(
        loadable, agent_toml,
        "agent.toml sets source = \"api-server\""
    );
    std::fs::write(&path, &loadable).expect("write");
    let agent = signet_agent::config::Config::load(Some(&path))
        .unwrap_or_else(|e| panic!("deploy/agent.yaml agent.toml: {e}"));
    assert!(
        agent.http_listen.ip().is_unspecified(),
        "probes reach the pod IP"
    );

    // The kubelet's probes go to the probe listener (probe_listen), which no other client can
    // fill (issue 24, finding 5), and no NetworkPolicy rule opens it: only the node reaches it.
    for (kind, name, probe_listen) in [
        ("Deployment", "signet-server", server.probe_listen),
        ("DaemonSet", "signet-agent", agent.probe_listen),
    ] {
        let addr = probe_listen.unwrap_or_else(|| panic!("{name}: probe_listen must be set"));
        assert!(
            addr.ip().is_unspecified(),
            "{name}: probes reach the pod IP"
        );
        let c = &pod_spec(&objs, kind, name)["containers"][0];
        let port = c["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["containerPort"].as_u64() == Some(u64::from(addr.port())))
            .unwrap_or_else(|| panic!("{name}: no container port for probe_listen {addr}"));
        let port_name = s(port, "/name");
        for probe in ["readinessProbe", "livenessProbe"] {
            assert_eq!(
                s(c, &format!("/{probe}/httpGet/port")),
                port_name,
                "{name}: {probe} must use the probe listener"
            );
        }
        let policy = find(&objs, "NetworkPolicy", name);
        for rule in policy["spec"]["ingress"].as_array().into_iter().flatten() {
            let ports = rule["ports"]
                .as_array()
                .unwrap_or_else(|| panic!("{name}: an ingress rule without ports opens all"));
            for p in ports {
                assert!(
                    p["port"].as_str() != Some(port_name)
                        && p["port"].as_u64() != Some(u64::from(addr.port())),
                    "{name}: a NetworkPolicy rule admits pods to the probe listener"
                );
            }
        }
    }

    // Cross-checks on the raw TOML (keys of config sections that may be newer than this test).
    let st: toml::Value = toml::from_str(&server_toml).expect("server TOML");
    let td = st["trust_domain"].as_str().expect("trust_domain");
    let auth_aud = strs(
        st.get("auth")
            .and_then(|a| a.get("kubernetes"))
            .and_then(|k| k.get("audiences")),
    );
    let node_aud = strs(
        st.get("nodes")
            .and_then(|a| a.get("kubernetes"))
            .and_then(|k| k.get("audiences")),
    );
    let node_sas = strs(
        st.get("nodes")
            .and_then(|a| a.get("kubernetes"))
            .and_then(|k| k.get("allowed_service_accounts")),
    );
    let bridge_callers = strs(
        st.get("policy")
            .and_then(|p| p.get("kubernetes_bridge"))
            .and_then(|b| b.get("callers")),
    );

    // signet-server: files named by the config are mounted from the right objects; the
    // database URL comes from its Secret.
    let pod = pod_spec(&objs, "Deployment", "signet-server");
    let c = &pod["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let cfg_arg = args[args
        .iter()
        .position(|a| *a == "--config")
        .expect("--config")
        + 1];
    assert_eq!(
        s(volume_for_file(pod, cfg_arg), "/configMap/name"),
        "signet-server-config"
    );
    assert_eq!(file_name(cfg_arg), "server.toml");
    let env = c["env"].as_array().expect("env");
    let db = env
        .iter()
        .find(|e| e["name"] == "SIGNET_DATABASE_URL")
        .expect("SIGNET_DATABASE_URL");
    assert_eq!(s(db, "/valueFrom/secretKeyRef/name"), "signet-database");
    let jwks = &server
        .auth
        .kubernetes
        .as_ref()
        .expect("[auth.kubernetes]")
        .jwks_file;
    let jwks = jwks.to_str().expect("path");
    assert_eq!(
        s(volume_for_file(pod, jwks), "/configMap/name"),
        "signet-jwks"
    );
    let kek = server
        .ca
        .kek_file
        .as_ref()
        .expect("ca.kek_file: replicas must share the KEK");
    assert_eq!(
        s(
            volume_for_file(pod, kek.to_str().expect("path")),
            "/secret/secretName"
        ),
        "signet-kek"
    );
    let checkpoint_key = server
        .checkpoint
        .key_file
        .as_ref()
        .expect("checkpoint.key_file: replicas must share the checkpoint key");
    assert_eq!(
        s(
            volume_for_file(pod, checkpoint_key.to_str().expect("path")),
            "/secret/secretName"
        ),
        "signet-checkpoint"
    );
    assert!(find(&objs, "Deployment", "signet-server")["spec"]["replicas"].as_i64() >= Some(2));

    // The Service and the PodDisruptionBudget select the server's pods.
    let labels =
        &find(&objs, "Deployment", "signet-server")["spec"]["template"]["metadata"]["labels"];
    let selects = |sel: &Value| {
        sel.as_object()
            .expect("selector")
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
    };
    assert!(selects(
        &find(&objs, "Service", "signet-server")["spec"]["selector"]
    ));
    assert!(selects(
        &find(&objs, "PodDisruptionBudget", "signet-server")["spec"]["selector"]["matchLabels"]
    ));

    // signet-agent: node token audience is a node audience, never a workload one; its
    // service account is the one the server admits; the bundle comes from signet-bundle.
    let pod = pod_spec(&objs, "DaemonSet", "signet-agent");
    let aud = token_audience(pod, "/var/run/secrets/signet/token");
    assert!(
        node_aud.contains(&aud),
        "agent token audience {aud} not in nodes.kubernetes.audiences {node_aud:?}"
    );
    assert!(
        !auth_aud.contains(&aud),
        "a node audience must not be a workload audience"
    );
    assert!(node_sas.contains(&format!("signet-system:{}", s(pod, "/serviceAccountName"))));
    let bundle = agent.trust_bundle_file.as_ref().expect("trust_bundle_file");
    let bundle = bundle.to_str().expect("path");
    let vol = volume_for_file(pod, bundle);
    assert_eq!(s(vol, "/configMap/name"), "signet-bundle");
    let socket_dir = agent.workload_api_socket.parent().expect("socket dir");
    assert_eq!(
        s(
            volume_for_file(pod, agent.workload_api_socket.to_str().expect("path")),
            "/hostPath/path"
        ),
        socket_dir.to_str().expect("path")
    );
    assert!(
        s(
            volume_for_file(pod, agent.data_dir.join("x").to_str().expect("path")),
            "/hostPath/path"
        )
        .starts_with('/')
    );

    // signet-k8s: its token is for a workload audience, and its SPIFFE ID is a bridge caller.
    let pod = pod_spec(&objs, "Deployment", "signet-k8s");
    let aud = token_audience(pod, "/var/run/secrets/signet/token");
    assert!(
        auth_aud.contains(&aud),
        "bridge token audience {aud} not in auth.kubernetes.audiences {auth_aud:?}"
    );
    let me = format!(
        "spiffe://{td}/ns/signet-system/sa/{}",
        s(pod, "/serviceAccountName")
    );
    assert!(
        bridge_callers.contains(&me),
        "{me} not in policy.kubernetes_bridge.callers {bridge_callers:?}"
    );

    // The bridge's ClusterRole is least privilege: no delete, no update, no wildcard, Events
    // only through events.k8s.io (what kube-rs's Recorder uses), Secrets never deleted.
    let role = find(&objs, "ClusterRole", "signet-k8s");
    for rule in role["rules"].as_array().expect("rules") {
        let verbs: Vec<&str> = rule["verbs"]
            .as_array()
            .expect("verbs")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let text = rule.to_string();
        for bad in [
            "*",
            "delete",
            "deletecollection",
            "update",
            "escalate",
            "bind",
            "impersonate",
        ] {
            assert!(
                !verbs.contains(&bad),
                "signet-k8s ClusterRole grants {bad}: {text}"
            );
        }
        assert!(!text.contains("\"*\""), "wildcard in {text}");
        let resources = rule["resources"].to_string();
        if resources.contains("\"events\"") {
            assert_eq!(
                rule["apiGroups"],
                serde_json::json!(["events.k8s.io"]),
                "{text}"
            );
        }
    }
    // Secrets: the default mode only reads one by name (Issuers' tlsSecretRef, ClusterIssuers'
    // refs); it writes none and no ConfigMap outside its namespace, holds no Lease rule
    // cluster-wide. Writing Secrets is deploy/optional's (standalone, Citadel).
    for rule in role["rules"].as_array().expect("rules") {
        let resources = rule["resources"].to_string();
        if resources.contains("\"secrets\"") {
            assert_eq!(rule["verbs"], serde_json::json!(["get"]), "{rule}");
        }
        for never in ["\"configmaps\"", "\"leases\""] {
            assert!(
                !resources.contains(never),
                "the bridge's ClusterRole names {never}: {rule}"
            );
        }
    }
    // In its own namespace: the one Lease (get/update by name; create cannot be limited by
    // name) and the one bundle ConfigMap it writes (patch by name, create), ConfigMaps read.
    let ns_role = find(&objs, "Role", "signet-k8s");
    assert_eq!(s(ns_role, "/metadata/namespace"), "signet-system");
    assert_eq!(
        ns_role["rules"],
        serde_json::json!([
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": ["signet-k8s-leader"], "verbs": ["get", "update"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["configmaps"],
             "resourceNames": ["signet-bundle"], "verbs": ["patch"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        ]),
        "the bridge's namespaced Role"
    );
    let binding = find(&objs, "RoleBinding", "signet-k8s");
    assert_eq!(s(binding, "/roleRef/kind"), "Role");
    assert_eq!(s(binding, "/roleRef/name"), "signet-k8s");
    assert_eq!(
        s(binding, "/subjects/0/name"),
        s(pod, "/serviceAccountName")
    );
    // Two replicas, one leader: leader election on, the Lease the Role names, the identity
    // from the downward API.
    let bridge = find(&objs, "Deployment", "signet-k8s");
    assert_eq!(bridge["spec"]["replicas"].as_i64(), Some(2));
    let bridge_env = |name: &str| {
        pod["containers"][0]["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("signet-k8s: no env {name}"))
    };
    assert_eq!(bridge_env("SIGNET_K8S_LEADER_ELECTION")["value"], "true");
    assert_eq!(
        bridge_env("SIGNET_K8S_LEASE_NAME")["value"],
        "signet-k8s-leader"
    );
    assert_eq!(
        s(&bridge_env("POD_NAME"), "/valueFrom/fieldRef/fieldPath"),
        "metadata.name"
    );
    // The modes whose write access is optional are off by default.
    assert_eq!(bridge_env("SIGNET_K8S_CITADEL")["value"], "false");
    assert_eq!(
        bridge_env("SIGNET_K8S_STANDALONE_CERTIFICATES")["value"],
        "false"
    );
    for (file, role) in [
        (
            "bridge-standalone-certificates-rbac.yaml",
            "signet-k8s-standalone-certificates",
        ),
        ("bridge-citadel-rbac.yaml", "signet-k8s-citadel"),
    ] {
        let docs = read_yaml_file(&repo().join("deploy/optional").join(file));
        let r = find(&docs, "ClusterRole", role);
        for rule in r["rules"].as_array().expect("rules") {
            let verbs = rule["verbs"].to_string();
            assert!(
                !verbs.contains("delete") && !verbs.contains("update") && !verbs.contains('*'),
                "{file}: {rule}"
            );
        }
        let b = find(&docs, "ClusterRoleBinding", role);
        assert_eq!(s(b, "/subjects/0/name"), "signet-k8s", "{file}");
        assert_eq!(s(b, "/subjects/0/namespace"), "signet-system", "{file}");
    }

    // The SPIFFE CSI driver reads the agent's socket directory from the host, and is the
    // upstream driver with pinned images.
    let csi = find(&objs, "CSIDriver", "csi.spiffe.io");
    assert_eq!(
        csi["spec"],
        serde_json::json!({
            "attachRequired": false, "podInfoOnMount": true, "fsGroupPolicy": "None",
            "volumeLifecycleModes": ["Ephemeral"]
        })
    );
    let driver = pod_spec(&objs, "DaemonSet", "spiffe-csi-driver");
    let c = &driver["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let socket_dir_arg = args[args
        .iter()
        .position(|a| *a == "-workload-api-socket-dir")
        .expect("-workload-api-socket-dir")
        + 1];
    assert_eq!(
        s(
            volume_for_file(driver, &format!("{socket_dir_arg}/agent.sock")),
            "/hostPath/path"
        ),
        socket_dir.to_str().expect("path"),
        "the driver hands pods the agent's socket directory"
    );
    let pods_mount = c["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["mountPath"] == "/var/lib/kubelet/pods")
        .expect("the kubelet's pods directory");
    assert_eq!(pods_mount["mountPropagation"], "Bidirectional");
    for c in driver["containers"].as_array().expect("containers") {
        let image = s(c, "/image");
        let tag = image.rsplit_once(':').map_or("", |(_, t)| t);
        assert!(
            (image.starts_with("ghcr.io/spiffe/spiffe-csi-driver:")
                || image.starts_with("registry.k8s.io/sig-storage/csi-node-driver-registrar:"))
                && !tag.is_empty()
                && tag != "latest",
            "{image}: the upstream images, pinned"
        );
    }
    assert_eq!(
        find(&objs, "DaemonSet", "spiffe-csi-driver")["spec"]["updateStrategy"]["type"],
        "RollingUpdate"
    );

    // The clients expect the server's SPIFFE ID in the server's trust domain: the agent's
    // trust_domain, the bridge's SIGNET_K8S_TRUST_DOMAIN and the example ClusterIssuer's.
    assert_eq!(
        agent.trust_domain.as_deref(),
        Some(td),
        "agent.toml trust_domain"
    );
    // Workload attestation of pods is on, reads the pods of the agent's own node from the API
    // server with the mounted token, and the agent's RBAC is exactly that read.
    let at: toml::Value = toml::from_str(&agent_toml).expect("agent TOML");
    let k = at
        .get("workload_api")
        .and_then(|w| w.get("kubernetes"))
        .expect("[workload_api.kubernetes] in agent.toml");
    assert_eq!(k.get("enabled").and_then(toml::Value::as_bool), Some(true));
    assert_eq!(
        k.get("source").and_then(toml::Value::as_str),
        Some("api-server")
    );
    let agent_pod = pod_spec(&objs, "DaemonSet", "signet-agent");
    let node_env = agent_pod["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "NODE_NAME")
        .expect("NODE_NAME env on the agent");
    assert_eq!(
        s(node_env, "/valueFrom/fieldRef/fieldPath"),
        "spec.nodeName"
    );
    volume_for_file(
        agent_pod,
        "/var/run/secrets/kubernetes.io/serviceaccount/token",
    );
    let role = find(&objs, "ClusterRole", "signet-agent");
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]),
        "the agent's ClusterRole is read-only pods"
    );
    let env_of = |name: &str| {
        pod["containers"][0]["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .map(str::to_owned)
    };
    assert_eq!(env_of("SIGNET_K8S_TRUST_DOMAIN").as_deref(), Some(td));
    let bundle = env_of("SIGNET_K8S_BUNDLE").expect("SIGNET_K8S_BUNDLE");
    assert_eq!(
        s(volume_for_file(pod, &bundle), "/configMap/name"),
        "signet-bundle"
    );
    let ci = read_yaml_file(&repo().join("deploy/examples/clusterissuer.yaml"));
    assert_eq!(s(&ci[0], "/spec/trustDomain"), td);

    // Every serviceAccountName exists; every ConfigMap/Secret a pod uses is shipped or listed
    // for the operator to create.
    for o in &objs {
        let Some(pod) = o.pointer("/spec/template/spec") else {
            continue;
        };
        let sa = s(pod, "/serviceAccountName");
        find(&objs, "ServiceAccount", sa);
        let mut refs: Vec<(&str, &str)> = Vec::new();
        for v in pod["volumes"].as_array().into_iter().flatten() {
            if let Some(n) = v.pointer("/configMap/name").and_then(Value::as_str) {
                refs.push(("ConfigMap", n));
            }
            if let Some(n) = v.pointer("/secret/secretName").and_then(Value::as_str) {
                refs.push(("Secret", n));
            }
            for src in v
                .pointer("/projected/sources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(n) = src.pointer("/configMap/name").and_then(Value::as_str) {
                    refs.push(("ConfigMap", n));
                }
                if let Some(n) = src.pointer("/secret/name").and_then(Value::as_str) {
                    refs.push(("Secret", n));
                }
            }
        }
        for c in pod["containers"].as_array().into_iter().flatten() {
            for e in c["env"].as_array().into_iter().flatten() {
                if let Some(n) = e
                    .pointer("/valueFrom/secretKeyRef/name")
                    .and_then(Value::as_str)
                {
                    refs.push(("Secret", n));
                }
            }
        }
        for (kind, name) in refs {
            let shipped = objs
                .iter()
                .any(|x| s(x, "/kind") == kind && s(x, "/metadata/name") == name);
            assert!(
                shipped
                    || OPERATOR_PROVIDED.contains(&(kind, name))
                    || CLUSTER_PROVIDED.contains(&(kind, name)),
                "{}: {kind} {name} is neither shipped nor in OPERATOR_PROVIDED (deploy/README.md)",
                id(o)
            );
        }
    }
    let readme =
        std::fs::read_to_string(repo().join("deploy/README.md")).expect("deploy/README.md");
    for (kind, name) in OPERATOR_PROVIDED {
        assert!(
            readme.contains(name),
            "deploy/README.md does not say how to create {kind} {name}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Pod Security: the examples run under "baseline", only signet-system is privileged

/// The capabilities Pod Security "baseline" lets a container add.
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The pod spec of a workload object (a Pod, or the template of a Deployment, DaemonSet,
/// StatefulSet, ReplicaSet, Job; a CronJob's job template).
fn workload_pod(o: &Value) -> Option<&Value> {
    match s(o, "/kind") {
        "Pod" => o.get("spec"),
        "CronJob" => o.pointer("/spec/jobTemplate/spec/template/spec"),
        _ => o.pointer("/spec/template/spec"),
    }
}

/// Where `pod` breaks the Pod Security "baseline" rules that matter for reaching the agent:
/// host namespaces, hostPath volumes (also in Istio's injected userVolume annotation),
/// privileged containers, capabilities beyond baseline's list, host ports, and the rest of
/// baseline's container rules (procMount, seccomp Unconfined, Windows hostProcess).
fn baseline_violations(what: &str, pod: &Value, annotations: &Value) -> Vec<String> {
    let mut v = Vec::new();
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        if pod[host] == Value::Bool(true) {
            v.push(format!("{what}: {host}"));
        }
    }
    let mut volumes: Vec<Value> = pod["volumes"].as_array().cloned().unwrap_or_default();
    if let Some(extra) = annotations
        .get("sidecar.istio.io/userVolume")
        .and_then(Value::as_str)
    {
        let extra: Vec<Value> = serde_json::from_str(extra)
            .unwrap_or_else(|e| panic!("{what}: sidecar.istio.io/userVolume is not JSON: {e}"));
        volumes.extend(extra);
    }
    for vol in &volumes {
        if vol.get("hostPath").is_some() {
            v.push(format!("{what}: hostPath volume {}", vol["name"]));
        }
    }
    if pod.pointer("/securityContext/seccompProfile/type") == Some(&Value::from("Unconfined")) {
        v.push(format!("{what}: seccomp Unconfined"));
    }
    if pod.pointer("/securityContext/windowsOptions/hostProcess") == Some(&Value::Bool(true)) {
        v.push(format!("{what}: hostProcess"));
    }
    let containers = ["containers", "initContainers", "ephemeralContainers"]
        .iter()
        .flat_map(|k| pod[*k].as_array().cloned().unwrap_or_default());
    for c in containers {
        let name = format!("{what} container {}", s(&c, "/name"));
        let sc = &c["securityContext"];
        if sc["privileged"] == Value::Bool(true) {
            v.push(format!("{name}: privileged"));
        }
        for cap in sc
            .pointer("/capabilities/add")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let cap = cap.as_str().unwrap_or("");
            if !BASELINE_CAPABILITIES.contains(&cap) {
                v.push(format!("{name}: adds capability {cap}"));
            }
        }
        if sc.get("procMount").is_some_and(|p| p != "Default") {
            v.push(format!("{name}: procMount {}", sc["procMount"]));
        }
        if sc.pointer("/seccompProfile/type") == Some(&Value::from("Unconfined")) {
            v.push(format!("{name}: seccomp Unconfined"));
        }
        if sc.pointer("/windowsOptions/hostProcess") == Some(&Value::Bool(true)) {
            v.push(format!("{name}: hostProcess"));
        }
        for p in c["ports"].as_array().into_iter().flatten() {
            if p.get("hostPort").and_then(Value::as_u64).unwrap_or(0) != 0 {
                v.push(format!("{name}: hostPort {}", p["hostPort"]));
            }
        }
    }
    v
}

/// The volumes through which `pod` reaches the Workload API: the one mounted at the directory
/// of `SPIFFE_ENDPOINT_SOCKET`, and Istio's `workload-socket` user volume.
fn workload_api_volumes(pod: &Value, annotations: &Value) -> Vec<(Value, bool)> {
    let mut found = Vec::new();
    let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
    for c in pod["containers"].as_array().into_iter().flatten() {
        let Some(socket) = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == "SPIFFE_ENDPOINT_SOCKET")
            .and_then(|e| e["value"].as_str())
        else {
            continue;
        };
        let path = socket.strip_prefix("unix://").unwrap_or(socket);
        let dir = Path::new(path).parent().expect("socket dir");
        let mount = c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| Path::new(s(m, "/mountPath")) == dir)
            .unwrap_or_else(|| panic!("no volume mounted at {}", dir.display()));
        let vol = volumes
            .iter()
            .find(|v| v["name"] == mount["name"])
            .cloned()
            .unwrap_or(Value::Null);
        found.push((vol, mount["readOnly"] == Value::Bool(true)));
    }
    if let (Some(vols), Some(mounts)) = (
        annotations
            .get("sidecar.istio.io/userVolume")
            .and_then(Value::as_str),
        annotations
            .get("sidecar.istio.io/userVolumeMount")
            .and_then(Value::as_str),
    ) {
        let vols: Vec<Value> = serde_json::from_str(vols).expect("userVolume JSON");
        let mounts: Vec<Value> = serde_json::from_str(mounts).expect("userVolumeMount JSON");
        for m in mounts
            .iter()
            .filter(|m| m["mountPath"] == "/var/run/secrets/workload-spiffe-uds")
        {
            let vol = vols
                .iter()
                .find(|v| v["name"] == m["name"])
                .cloned()
                .unwrap_or(Value::Null);
            found.push((vol, m["readOnly"] == Value::Bool(true)));
        }
    }
    found
}

fn pod_security(ns: &Value) -> &str {
    s(ns, "/metadata/labels/pod-security.kubernetes.io~1enforce")
}

#[test]
fn example_workloads_run_under_pod_security_baseline_through_the_csi_driver() {
    let deploy = repo().join("deploy");
    let mut examples = Vec::new();
    for f in yaml_files(&deploy.join("examples")) {
        examples.extend(read_yaml_file(&f));
    }
    let namespaces: Vec<&Value> = examples
        .iter()
        .filter(|o| s(o, "/kind") == "Namespace")
        .collect();
    assert!(!namespaces.is_empty(), "the examples ship their namespace");
    for ns in &namespaces {
        assert_eq!(pod_security(ns), "baseline", "{}", id(ns));
    }
    let mut workloads = 0;
    let mut through_csi = 0;
    for o in &examples {
        let Some(pod) = workload_pod(o) else { continue };
        if !pod.is_object() || pod.get("containers").is_none() {
            continue;
        }
        workloads += 1;
        let ns = s(o, "/metadata/namespace");
        let ns_obj = namespaces
            .iter()
            .find(|n| s(n, "/metadata/name") == ns)
            .unwrap_or_else(|| panic!("{}: its namespace {ns:?} is not an example's", id(o)));
        assert_eq!(pod_security(ns_obj), "baseline");
        let annotations = o
            .pointer("/spec/template/metadata/annotations")
            .or_else(|| o.pointer("/metadata/annotations"))
            .cloned()
            .unwrap_or(Value::Null);
        let v = baseline_violations(&id(o), pod, &annotations);
        assert!(v.is_empty(), "Pod Security baseline:\n  {}", v.join("\n  "));
        for (vol, read_only) in workload_api_volumes(pod, &annotations) {
            assert_eq!(
                vol["csi"],
                serde_json::json!({"driver": "csi.spiffe.io", "readOnly": true}),
                "{}: the Workload API comes through the SPIFFE CSI driver, read-only",
                id(o)
            );
            assert!(read_only, "{}: mounted read-only", id(o));
            through_csi += 1;
        }
    }
    assert!(workloads >= 2, "the examples hold workloads");
    assert!(
        through_csi >= 2,
        "workload.yaml and istio-sds.yaml reach the agent"
    );

    // Across deploy/, signet-system is the only privileged namespace.
    let mut privileged = BTreeSet::new();
    for dir in [
        deploy.clone(),
        deploy.join("examples"),
        deploy.join("optional"),
    ] {
        for f in yaml_files(&dir) {
            for o in read_yaml_file(&f) {
                if s(&o, "/kind") == "Namespace" && pod_security(&o) == "privileged" {
                    privileged.insert(s(&o, "/metadata/name").to_owned());
                }
            }
        }
    }
    assert_eq!(
        privileged,
        BTreeSet::from(["signet-system".to_owned()]),
        "privileged namespaces"
    );
}

#[test]
fn the_baseline_check_catches_what_baseline_forbids() {
    let ok = serde_json::json!({
        "containers": [{"name": "app", "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}}],
        "volumes": [{"name": "w", "csi": {"driver": "csi.spiffe.io", "readOnly": true}}]
    });
    assert_eq!(
        baseline_violations("ok", &ok, &Value::Null),
        Vec::<String>::new()
    );
    let bad = serde_json::json!({
        "hostPID": true, "hostNetwork": true, "hostIPC": true,
        "containers": [{"name": "app", "ports": [{"containerPort": 80, "hostPort": 80}],
            "securityContext": {"privileged": true, "capabilities": {"add": ["SYS_ADMIN"]},
                                "procMount": "Unmasked"}}],
        "volumes": [{"name": "w", "hostPath": {"path": "/run/spiffe"}}]
    });
    let ann = serde_json::json!({"sidecar.istio.io/userVolume":
        "[{\"name\": \"s\", \"hostPath\": {\"path\": \"/run/spiffe\"}}]"});
    let found = baseline_violations("bad", &bad, &ann).join("\n");
    for want in [
        "hostPID",
        "hostNetwork",
        "hostIPC",
        "hostPath volume \"w\"",
        "hostPath volume \"s\"",
        "privileged",
        "adds capability SYS_ADMIN",
        "hostPort 80",
        "procMount",
    ] {
        assert!(found.contains(want), "{want:?} not in:\n{found}");
    }
}

/// The Dockerfile builds every binary a manifest runs, and those are the workspace's binaries.
#[test]
fn the_image_holds_every_binary_the_manifests_run() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    assert!(
        dockerfile.contains("cargo build --locked --release"),
        "Dockerfile"
    );
    let built: BTreeSet<&str> = dockerfile
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0] == "--bin")
        .map(|w| w[1])
        .collect();
    let want: BTreeSet<&str> = ["signet-server", "signet-agent", "signet-k8s", "signetctl"].into();
    assert_eq!(built, want, "binaries built by the Dockerfile");
    for (dir, bin) in [
        ("server", "signet-server"),
        ("agent", "signet-agent"),
        ("clients/k8s", "signet-k8s"),
        ("clients/cli", "signetctl"),
    ] {
        let manifest =
            std::fs::read_to_string(repo().join(dir).join("Cargo.toml")).expect("Cargo.toml");
        assert!(
            manifest.contains(&format!("name = \"{bin}\"")),
            "{dir}/Cargo.toml builds no {bin}"
        );
    }
    let mut objs = Vec::new();
    for f in ["server.yaml", "agent.yaml", "bridge.yaml"] {
        objs.extend(read_yaml_file(&repo().join("deploy").join(f)));
    }
    let mut ran = BTreeSet::new();
    for o in &objs {
        let Some(pod) = o.pointer("/spec/template/spec") else {
            continue;
        };
        for c in pod["containers"].as_array().into_iter().flatten() {
            let cmd = s(c, "/command/0");
            let bin = cmd
                .strip_prefix("/usr/local/bin/")
                .unwrap_or_else(|| panic!("{}: command {cmd:?}", id(o)));
            assert!(built.contains(bin), "{}: {bin} is not in the image", id(o));
            ran.insert(bin);
        }
    }
    assert_eq!(ran.len(), 3, "server, agent and bridge each run: {ran:?}");
    assert!(dockerfile.contains("COPY --from=build /out/ /usr/local/bin/"));
}

// ---------------------------------------------------------------------------------------------
// deploy/monitoring: the Prometheus Operator's objects and the alerts

fn promtool() -> Option<PathBuf> {
    tool(
        "SIGNET_PROMTOOL",
        "promtool",
        "scripts/test installs it (Debian's prometheus package)",
    )
}

/// The objects of `deploy/monitoring/`, as the files hold them.
fn monitoring_objects() -> Vec<Value> {
    let dir = repo().join("deploy/monitoring");
    ["monitors.yaml", "prometheusrule.yaml"]
        .iter()
        .flat_map(|f| read_yaml_file(&dir.join(f)))
        .collect()
}

fn alert_groups() -> Value {
    let rules = read_yaml_file(&repo().join("deploy/monitoring/alerts.yaml"));
    rules[0]
        .pointer("/groups")
        .expect("alerts.yaml: groups")
        .clone()
}

#[test]
fn monitoring_manifests_pass_the_operator_schemas_and_carry_the_alerts() {
    let objs = monitoring_objects();
    let mut crds = Vec::new();
    for kind in ["servicemonitors", "podmonitors", "prometheusrules"] {
        crds.extend(read_yaml_file(
            &repo().join(format!("tests/fixtures/monitoring.coreos.com_{kind}.yaml")),
        ));
    }
    for o in &objs {
        let errors = validate_custom(o, &crds);
        assert!(errors.is_empty(), "{}:\n  {}", id(o), errors.join("\n  "));
        assert_eq!(s(o, "/metadata/namespace"), "signet-system", "{}", id(o));
    }
    let rule = find(&objs, "PrometheusRule", "signet");
    assert_eq!(
        rule.pointer("/spec/groups"),
        Some(&alert_groups()),
        "prometheusrule.yaml's groups differ from alerts.yaml's: copy them over"
    );
    // kustomize yields exactly these objects.
    let Some(built) = kustomize_dir("deploy/monitoring") else {
        return;
    };
    let got: BTreeSet<String> = built.iter().map(id).collect();
    let want: BTreeSet<String> = objs.iter().map(id).collect();
    assert_eq!(got, want, "objects of kubectl kustomize deploy/monitoring/");
}

#[test]
fn monitors_find_the_metrics_ports_of_deploy() {
    let Some(deploy) = kustomize() else { return };
    let objs = monitoring_objects();
    let labels_match = |selector: &Value, labels: &Value| {
        let want = selector
            .pointer("/matchLabels")
            .and_then(Value::as_object)
            .expect("matchLabels");
        !want.is_empty() && want.iter().all(|(k, v)| labels.get(k) == Some(v))
    };
    // The server: its Service, by the port's name.
    let sm = find(&objs, "ServiceMonitor", "signet-server");
    let service = find(&deploy, "Service", "signet-server");
    assert!(labels_match(
        sm.pointer("/spec/selector").expect("selector"),
        service.pointer("/metadata/labels").expect("labels")
    ));
    let port = s(sm, "/spec/endpoints/0/port");
    let ports = service
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .expect("ports");
    assert!(
        ports.iter().any(|p| s(p, "/name") == port),
        "the signet-server Service has no port {port}"
    );
    let label = s(sm, "/spec/jobLabel");
    assert_eq!(
        s(
            service,
            &format!("/metadata/labels/{}", label.replace('/', "~1"))
        ),
        "signet-server"
    );
    // The agent and the bridge: their pods, by container port name; the job label their pods
    // carry is the job alerts.yaml names.
    for (kind, name, job) in [
        ("DaemonSet", "signet-agent", "signet-agent"),
        ("Deployment", "signet-k8s", "signet-k8s"),
    ] {
        let pm = find(&objs, "PodMonitor", name);
        let workload = find(&deploy, kind, name);
        let pod_labels = workload
            .pointer("/spec/template/metadata/labels")
            .expect("pod labels");
        assert!(
            labels_match(pm.pointer("/spec/selector").expect("selector"), pod_labels),
            "PodMonitor {name} selects no pod of {kind} {name}"
        );
        let label = s(pm, "/spec/jobLabel");
        assert_eq!(pod_labels.get(label).and_then(Value::as_str), Some(job));
        let port = s(pm, "/spec/podMetricsEndpoints/0/port");
        let containers = workload
            .pointer("/spec/template/spec/containers")
            .and_then(Value::as_array)
            .expect("containers");
        assert!(
            containers.iter().any(|c| c
                .pointer("/ports")
                .and_then(Value::as_array)
                .is_some_and(|ps| ps.iter().any(|p| s(p, "/name") == port))),
            "{kind} {name} has no container port {port}"
        );
        // Its NetworkPolicy admits the scraper to that port.
        let policy = find(&deploy, "NetworkPolicy", name);
        let admitted = policy
            .pointer("/spec/ingress")
            .and_then(Value::as_array)
            .expect("ingress")
            .iter()
            .flat_map(|rule| {
                rule.pointer("/ports")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .any(|p| s(&p, "/port") == port);
        assert!(admitted, "NetworkPolicy {name} does not admit port {port}");
    }
    let alerts = serde_json::to_string(&alert_groups()).expect("json");
    for job in ["signet-server", "signet-agent", "signet-k8s"] {
        assert!(
            alerts.contains(job),
            "alerts.yaml never names the job {job}"
        );
    }
}

#[test]
fn every_alert_has_a_runbook_and_a_test_that_fires_it() {
    let groups = alert_groups();
    let tests = read_yaml_file(&repo().join("deploy/monitoring/alerts_test.yaml"));
    let fired: BTreeSet<String> = tests[0]
        .pointer("/tests")
        .and_then(Value::as_array)
        .expect("tests")
        .iter()
        .flat_map(|t| {
            t.pointer("/alert_rule_test")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter(|c| {
            c.pointer("/exp_alerts")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
        })
        .map(|c| s(&c, "/alertname").to_owned())
        .collect();
    let mut alerts = 0;
    for rule in groups.as_array().expect("groups").iter().flat_map(|g| {
        g.pointer("/rules")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    }) {
        let name = s(&rule, "/alert");
        alerts += 1;
        assert!(fired.contains(name), "alerts_test.yaml never fires {name}");
        for key in ["summary", "description"] {
            assert!(
                !s(&rule, &format!("/annotations/{key}")).is_empty(),
                "{name}: no {key}"
            );
        }
        assert!(
            s(&rule, "/annotations/runbook_url").starts_with("docs/operations.md#signet"),
            "{name}: runbook_url must point into docs/operations.md"
        );
        assert!(
            ["warning", "critical"].contains(&s(&rule, "/labels/severity")),
            "{name}: severity"
        );
    }
    assert!(alerts >= 20, "{alerts} alerts");
}

#[test]
fn alerts_load_and_their_unit_tests_pass_in_promtool() {
    let Some(promtool) = promtool() else { return };
    let dir = repo().join("deploy/monitoring");
    for args in [
        ["check", "rules", "alerts.yaml"],
        ["test", "rules", "alerts_test.yaml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("running promtool");
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
