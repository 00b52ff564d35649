use super::*;
use crate::sinks::SinkErrorKind;
use crate::sinks::safe_dir::GEN_PREFIX;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

fn cfg(dir: &Path, layout: FileLayout) -> FilesSinkConfig {
    FilesSinkConfig {
        layout,
        ..FilesSinkConfig::new(dir)
    }
}

fn generations(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("ls")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(GEN_PREFIX))
        .collect()
}

/// A victim directory outside the sink, with a file in it and an unusual mode.
fn victim(root: &Path) -> std::path::PathBuf {
    let v = root.join("victim");
    std::fs::create_dir(&v).expect("mkdir");
    std::fs::write(v.join("precious"), b"keep").expect("write");
    std::fs::set_permissions(&v, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    v
}

fn assert_intact(v: &Path) {
    assert_eq!(
        std::fs::read(v.join("precious")).expect("victim file"),
        b"keep"
    );
    let m = std::fs::metadata(v).expect("meta");
    assert_eq!(m.mode() & 0o7777, 0o700, "victim mode unchanged");
}

#[tokio::test]
async fn a_planted_data_link_never_deletes_its_target() {
    let root = tempfile::tempdir().expect("tempdir");
    let v = victim(root.path());
    let dir = root.path().join("sink");
    std::fs::create_dir(&dir).expect("mkdir");
    let sink = FilesSink::new("web", cfg(&dir, FileLayout::Tls));
    sink.deliver(&svid(1)).await.expect("first");
    for target in [v.clone(), Path::new("../victim").to_owned()] {
        // The attacker points `..data` at the victim (absolute, then relative).
        let data = dir.join(DATA_LINK);
        std::fs::remove_file(&data).expect("rm");
        std::os::unix::fs::symlink(&target, &data).expect("plant");
        let applied = sink.deliver(&svid(2)).await.expect("delivered anyway");
        assert_intact(&v);
        assert!(
            applied
                .warnings
                .iter()
                .any(|w| w.contains("not a generation")),
            "{applied:?}"
        );
        assert_eq!(read_pem(&dir.join("tls.key")), key_of(2));
    }
    // The generation the attacker detached from `..data` is still swept.
    assert_eq!(generations(&dir).len(), 1);
    // Removal with a planted `..data` removes the link, not the victim.
    std::fs::remove_file(dir.join(DATA_LINK)).expect("rm");
    std::os::unix::fs::symlink(&v, dir.join(DATA_LINK)).expect("plant");
    let applied = sink.remove().await.expect("remove");
    assert!(!applied.warnings.is_empty());
    assert_intact(&v);
}

#[tokio::test]
async fn a_generation_swapped_for_a_link_is_unlinked_not_followed() {
    let root = tempfile::tempdir().expect("tempdir");
    let v = victim(root.path());
    let dir = root.path().join("sink");
    std::fs::create_dir(&dir).expect("mkdir");
    let sink = FilesSink::new("web", cfg(&dir, FileLayout::Istio));
    sink.deliver(&svid(1)).await.expect("first");
    // The current generation is replaced by a link to the victim.
    let current = generations(&dir).remove(0);
    std::fs::remove_dir_all(dir.join(&current)).expect("rm");
    std::os::unix::fs::symlink(&v, dir.join(&current)).expect("plant");
    // And a link named like a generation, pointing at the victim, is planted beside it.
    std::os::unix::fs::symlink(&v, dir.join(format!("{GEN_PREFIX}1-2-3"))).expect("plant");
    // A directory named like a generation that the agent did not create stays.
    let foreign = dir.join(format!("{GEN_PREFIX}4-5-6"));
    std::fs::create_dir(&foreign).expect("mkdir");
    std::fs::write(foreign.join("theirs"), b"x").expect("write");
    if rustix::process::geteuid().as_raw() == 0 {
        std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).expect("chown");
    }
    let applied = sink.deliver(&svid(2)).await.expect("second");
    assert_intact(&v);
    assert_eq!(read_pem(&dir.join("key.pem")), key_of(2));
    assert!(!applied.warnings.is_empty(), "{applied:?}");
    if rustix::process::geteuid().as_raw() == 0 {
        assert!(
            foreign.join("theirs").exists(),
            "not the agent's: left in place"
        );
    }
    sink.deliver(&svid(3)).await.expect("third");
    assert_intact(&v);
}

#[tokio::test]
async fn a_shared_directory_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let err = FilesSink::new("web", cfg(dir.path(), FileLayout::Tls))
        .deliver(&svid(1))
        .await
        .expect_err("refused");
    assert_eq!(err.kind, SinkErrorKind::Refused);
    assert!(err.reason.contains("allow_shared_directory"), "{err}");
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("ls").count(),
        0,
        "nothing written"
    );
    let mut c = cfg(dir.path(), FileLayout::Tls);
    c.allow_shared_directory = true;
    FilesSink::new("web", c)
        .deliver(&svid(1))
        .await
        .expect("allowed");
    assert_eq!(read_pem(&dir.path().join("tls.key")), key_of(1));
}

/// A directory made under the common umask 002 (mode 0775) is refused, and the refusal names
/// the directory, its mode, why it matters and the command that fixes it.
#[tokio::test]
async fn a_group_writable_directory_is_refused_with_its_fix() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("certs");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o775)).expect("chmod");
    let err = FilesSink::new("web", cfg(&dir, FileLayout::Tls))
        .deliver(&svid(1))
        .await
        .expect_err("refused");
    assert_eq!(err.kind, SinkErrorKind::Refused);
    for want in [
        format!("directory {} is writable by its group", dir.display()),
        "mode 775".to_owned(),
        "swap the files".to_owned(),
        format!("`chmod g-w {}`", dir.display()),
        format!("`chmod 0750 {}`", dir.display()),
    ] {
        assert!(err.reason.contains(&want), "{want}: {err}");
    }
    assert_eq!(std::fs::read_dir(&dir).expect("ls").count(), 0);
    // Fixed as told: delivered.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    FilesSink::new("web", cfg(&dir, FileLayout::Tls))
        .deliver(&svid(1))
        .await
        .expect("delivered");
}

/// The `n`th delivery (the same for the same `n`): chain of two, key, bundle of one.
fn svid(n: u8) -> Delivered {
    crate::testing::delivered("spiffe://example.org/web", n)
}
fn key_of(n: u8) -> Vec<Vec<u8>> {
    vec![svid(n).svid.key().pkcs8_der().to_vec()]
}
fn chain_of(n: u8) -> Vec<Vec<u8>> {
    svid(n).chain_der().to_vec()
}

#[tokio::test]
async fn crl_pem_is_written_in_each_layout_switched_and_removed() {
    for layout in [FileLayout::Istio, FileLayout::SpiffeHelper, FileLayout::Tls] {
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = FilesSink::new("web", cfg(dir.path(), layout));
        sink.deliver(&svid(1)).await.expect("without CRLs");
        assert!(!dir.path().join(CRL_FILE).exists(), "{layout:?}");
        let with = Delivered {
            crls_der: vec![vec![1, 9], vec![2, 9]].into(),
            ..svid(2)
        };
        sink.deliver(&with).await.expect("with CRLs");
        let text = std::fs::read_to_string(dir.path().join(CRL_FILE)).expect("crl.pem");
        assert_eq!(
            text.matches("-----BEGIN X509 CRL-----").count(),
            2,
            "{text}"
        );
        assert_eq!(
            read_pem(&dir.path().join(CRL_FILE)),
            [vec![1, 9], vec![2, 9]]
        );
        let m = std::fs::symlink_metadata(dir.path().join(CRL_FILE)).expect("meta");
        assert!(
            m.file_type().is_symlink(),
            "switched with the others through ..data"
        );
        let mode = std::fs::metadata(dir.path().join(CRL_FILE))
            .expect("meta")
            .mode();
        assert_eq!(mode & 0o777, 0o644);
        let [_, key, _] = layout_names(layout);
        assert_eq!(read_pem(&dir.path().join(key)), key_of(2));
        // A new CRL replaces it with the certificates, in one generation.
        let newer = Delivered {
            crls_der: vec![vec![3, 9]].into(),
            ..svid(3)
        };
        sink.deliver(&newer).await.expect("newer CRL");
        assert_eq!(read_pem(&dir.path().join(CRL_FILE)), [vec![3, 9]]);
        assert_eq!(generations(dir.path()).len(), 1);
        // None any more: no dangling link.
        sink.deliver(&svid(4)).await.expect("no CRLs");
        assert!(std::fs::symlink_metadata(dir.path().join(CRL_FILE)).is_err());
        sink.deliver(&newer).await.expect("again");
        sink.remove().await.expect("remove");
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("ls").count(),
            0,
            "{layout:?}"
        );
    }
}

/// The name `..data` points at now.
fn current_generation(dir: &Path) -> String {
    std::fs::read_link(dir.join(DATA_LINK))
        .expect("..data")
        .to_string_lossy()
        .into_owned()
}

/// Polls `f` every 10 ms until it holds; panics after 10 s. Real time: the writes run on
/// the blocking threads, which paused time would not wait for.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = signet_runtime::clock::Clock::monotonic(&signet_runtime::clock::SystemClock)
        + std::time::Duration::from_secs(10);
    while !f() {
        assert!(
            signet_runtime::clock::Clock::monotonic(&signet_runtime::clock::SystemClock) < deadline,
            "timed out: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Through the sink's worker, as the rotator hands deliveries over: the CRL arriving
/// after the certificate, then changing alone, is written to `crl.pem` each time (the
/// certificate and key as they were); the same delivery again writes nothing.
#[tokio::test]
async fn a_crl_alone_is_written_in_each_layout_and_an_unchanged_delivery_writes_nothing() {
    use crate::config::DeletionPolicy;
    use crate::sinks::worker::{SinkBinding, SinkSet, Telemetry};
    for layout in [FileLayout::Istio, FileLayout::SpiffeHelper, FileLayout::Tls] {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().to_owned();
        let telemetry = Telemetry::new(None);
        let mut set = SinkSet::start(
            vec![SinkBinding {
                spiffe_id: "spiffe://example.org/web".parse().expect("id"),
                deletion_policy: DeletionPolicy::Delete,
                timeout: std::time::Duration::from_secs(30),
                sink: Arc::new(FilesSink::new("web", cfg(&d, layout))),
            }],
            telemetry.clone(),
            Arc::new(signet_runtime::clock::SystemClock),
            Arc::new(|| 0.5),
        );
        let [chain, key, bundle] = layout_names(layout);
        let first = svid(1);
        set.update(|_| Some(first.clone()));
        until("the first delivery", || d.join(DATA_LINK).exists()).await;
        assert!(!d.join(CRL_FILE).exists(), "{layout:?}: no CRL yet");
        let g1 = current_generation(&d);
        let cert_before = read_pem(&d.join(chain));

        // The CRL arrives a moment after the certificate.
        let crl1 = Delivered {
            crls_der: vec![vec![1, 9]].into(),
            ..first.clone()
        };
        set.update(|_| Some(crl1.clone()));
        until("crl.pem", || d.join(CRL_FILE).exists()).await;
        assert_eq!(read_pem(&d.join(CRL_FILE)), [vec![1, 9]], "{layout:?}");
        let g2 = current_generation(&d);
        assert_ne!(g1, g2);

        // Another peer revoked: only the CRL changes.
        let crl2 = Delivered {
            crls_der: vec![vec![2, 9]].into(),
            ..first.clone()
        };
        set.update(|_| Some(crl2.clone()));
        until("the newer CRL", || {
            read_pem(&d.join(CRL_FILE)) == [vec![2, 9]]
        })
        .await;
        assert_eq!(read_pem(&d.join(chain)), cert_before, "{layout:?}");
        assert_eq!(read_pem(&d.join(key)), key_of(1), "{layout:?}");
        assert_eq!(read_pem(&d.join(bundle)), first.bundle_der.to_vec());
        let g3 = current_generation(&d);

        // The same again, in new allocations (as every pass builds it): nothing written.
        let same = Delivered {
            svid: Arc::new((*crl2.svid).clone()),
            bundle_der: crl2.bundle_der.to_vec().into(),
            crls_der: crl2.crls_der.to_vec().into(),
            federated: crl2.federated.clone(),
        };
        set.update(|_| Some(same.clone()));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(current_generation(&d), g3, "{layout:?}: rewritten");
        assert_eq!(generations(&d), std::slice::from_ref(&g3));
        let reports = telemetry.health().reports();
        assert!(reports.iter().all(|(_, r)| r.failures == 0), "{reports:?}");
    }
}

fn read_pem(p: &Path) -> Vec<Vec<u8>> {
    let text = std::fs::read(p).expect("read");
    pem::parse_many(text)
        .expect("pem")
        .into_iter()
        .map(|p| p.into_contents())
        .collect()
}

#[tokio::test]
async fn writes_each_layout_with_modes() {
    for layout in [FileLayout::Istio, FileLayout::SpiffeHelper, FileLayout::Tls] {
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = FilesSink::new("web", cfg(dir.path(), layout));
        sink.deliver(&svid(7)).await.expect("deliver");
        let [chain, key, bundle] = layout_names(layout);
        assert_eq!(read_pem(&dir.path().join(chain)), chain_of(7));
        assert_eq!(read_pem(&dir.path().join(key)), key_of(7));
        assert_eq!(
            read_pem(&dir.path().join(bundle)),
            svid(7).bundle_der.to_vec()
        );
        let mode = |n: &str| std::fs::metadata(dir.path().join(n)).expect("meta").mode() & 0o777;
        assert_eq!(mode(key), 0o600);
        assert_eq!(mode(chain), 0o644);
        assert_eq!(mode(bundle), 0o644);
    }
}

#[tokio::test]
async fn owner_is_set_when_configured() {
    let dir = tempfile::tempdir().expect("tempdir");
    let me = std::fs::metadata(dir.path()).expect("meta");
    // Only root may give files away; others can still chown to themselves.
    let (uid, gid) = if me.uid() == 0 {
        (65534, 65534)
    } else {
        (me.uid(), me.gid())
    };
    let mut c = cfg(dir.path(), FileLayout::Tls);
    c.owner_uid = Some(uid);
    c.owner_gid = Some(gid);
    FilesSink::new("web", c)
        .deliver(&svid(1))
        .await
        .expect("deliver");
    for n in ["tls.crt", "tls.key", "ca.crt"] {
        let m = std::fs::metadata(dir.path().join(n)).expect("meta");
        assert_eq!((m.uid(), m.gid()), (uid, gid), "{n}");
    }
}

#[tokio::test]
async fn rotation_switches_all_files_and_drops_old_generation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = FilesSink::new("web", cfg(dir.path(), FileLayout::Tls));
    sink.deliver(&svid(1)).await.expect("first");
    sink.deliver(&svid(2)).await.expect("second");
    assert_eq!(read_pem(&dir.path().join("tls.key")), key_of(2));
    assert_eq!(read_pem(&dir.path().join("tls.crt"))[0], chain_of(2)[0]);
    assert_eq!(generations(dir.path()).len(), 1);
}

#[tokio::test]
async fn unwritable_directory_names_sink_and_keeps_previous_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = FilesSink::new("web", cfg(dir.path(), FileLayout::Istio));
    sink.deliver(&svid(1)).await.expect("first");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).expect("chmod");
    let result = sink.deliver(&svid(2)).await;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // Root ignores directory modes; only check the failure where it can happen.
    let current = if result.is_ok() { 2 } else { 1 };
    if let Err(err) = result {
        assert!(err.to_string().contains("\"web\""), "{err}");
        assert!(!err.to_string().contains("PRIVATE"), "{err}");
        assert_eq!(read_pem(&dir.path().join("key.pem")), key_of(1));
        assert_eq!(
            read_pem(&dir.path().join("cert-chain.pem"))[0],
            chain_of(1)[0]
        );
    }
    // A failure that root cannot override: a directory in the way of a visible name.
    std::fs::remove_file(dir.path().join("root-cert.pem")).expect("rm");
    std::fs::create_dir_all(dir.path().join("root-cert.pem/x")).expect("mkdir");
    let err = sink.deliver(&svid(3)).await.expect_err("blocked");
    assert!(err.to_string().contains("\"web\""), "{err}");
    assert_eq!(read_pem(&dir.path().join("key.pem")), key_of(current));
    assert_eq!(
        read_pem(&dir.path().join("cert-chain.pem"))[0],
        chain_of(current)[0]
    );
    assert_eq!(
        generations(dir.path()).len(),
        1,
        "the failed generation is cleaned up"
    );

    let missing = FilesSink::new("gone", cfg(&dir.path().join("nope"), FileLayout::Istio));
    let err = missing.deliver(&svid(1)).await.expect_err("no directory");
    assert!(err.to_string().contains("\"gone\""), "{err}");
}

#[tokio::test]
async fn remove_deletes_only_what_we_wrote() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("other.txt"), b"keep").expect("write");
    let sink = FilesSink::new("web", cfg(dir.path(), FileLayout::Istio));
    sink.deliver(&svid(1)).await.expect("deliver");
    sink.remove().await.expect("remove");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("ls")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["other.txt"]);
}

#[tokio::test]
async fn reload_command_runs_after_delivery_and_failure_is_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("reloaded");
    let mut c = cfg(dir.path(), FileLayout::Istio);
    c.reload_command = Some(vec!["touch".into(), marker.display().to_string()]);
    FilesSink::new("web", c.clone())
        .deliver(&svid(1))
        .await
        .expect("deliver");
    assert!(marker.exists());
    c.reload_command = Some(vec!["false".into()]);
    let err = FilesSink::new("web", c)
        .deliver(&svid(2))
        .await
        .expect_err("fails");
    assert!(err.to_string().contains("false failed"), "{err}");
}

#[tokio::test]
async fn reload_signal_reaches_the_pid_in_the_pid_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = tokio::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let pid_file = dir.path().join("app.pid");
    std::fs::write(&pid_file, format!("{}\n", child.id().expect("pid"))).expect("write");
    let mut c = cfg(dir.path(), FileLayout::Istio);
    c.reload_signal = Some("TERM".into());
    c.pid_file = Some(pid_file.clone());
    FilesSink::new("web", c.clone())
        .deliver(&svid(1))
        .await
        .expect("deliver");
    let status = child.wait().await.expect("wait");
    assert!(!status.success());
    std::fs::write(&pid_file, "garbage").expect("write");
    let err = FilesSink::new("web", c)
        .deliver(&svid(2))
        .await
        .expect_err("bad pid");
    assert!(err.to_string().contains("no valid pid"), "{err}");
}

/// `svid(n)` federating with each of `tds` (its roots: one fake DER per trust domain).
fn federating(n: u8, tds: &[&str]) -> Delivered {
    Delivered {
        federated: tds
            .iter()
            .map(|td| crate::state::FederatedBundle {
                trust_domain: td.parse().expect("td"),
                roots_der: vec![td.as_bytes().to_vec()].into(),
                jwt_keys: Default::default(),
            })
            .collect(),
        ..svid(n)
    }
}

#[tokio::test]
async fn federated_files_are_written_per_trust_domain_switched_and_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let sink = FilesSink::new("web", cfg(d, FileLayout::Istio));
    sink.deliver(&federating(1, &["a.example", "b.example"]))
        .await
        .expect("federating");
    for td in ["a.example", "b.example"] {
        let f = d.join(federated_file(td));
        assert_eq!(read_pem(&f), [td.as_bytes().to_vec()]);
        assert!(
            std::fs::symlink_metadata(&f)
                .expect("meta")
                .file_type()
                .is_symlink()
        );
    }
    // By default the bundle file stays the own trust domain's roots only.
    assert_eq!(
        read_pem(&d.join("root-cert.pem")),
        svid(1).bundle_der.to_vec()
    );
    // b.example is no longer federated: its link goes, a.example's stays, in one generation.
    sink.deliver(&federating(2, &["a.example"]))
        .await
        .expect("one");
    assert!(std::fs::symlink_metadata(d.join(federated_file("b.example"))).is_err());
    assert!(d.join(federated_file("a.example")).exists());
    assert_eq!(generations(d).len(), 1);
    // A file someone else put there under our prefix is not ours: left alone.
    std::fs::write(d.join(federated_file("c.example")), b"theirs").expect("write");
    sink.deliver(&svid(3)).await.expect("none");
    assert!(std::fs::symlink_metadata(d.join(federated_file("a.example"))).is_err());
    assert_eq!(
        std::fs::read(d.join(federated_file("c.example"))).expect("kept"),
        b"theirs"
    );
    std::fs::remove_file(d.join(federated_file("c.example"))).expect("rm");
    sink.deliver(&federating(4, &["a.example"]))
        .await
        .expect("again");
    sink.remove().await.expect("remove");
    assert_eq!(std::fs::read_dir(d).expect("ls").count(), 0);
}

#[tokio::test]
async fn include_federated_domains_appends_them_to_the_bundle_file() {
    for layout in [FileLayout::Istio, FileLayout::SpiffeHelper, FileLayout::Tls] {
        let dir = tempfile::tempdir().expect("tempdir");
        let sink = FilesSink::new(
            "web",
            FilesSinkConfig {
                include_federated_domains: true,
                ..cfg(dir.path(), layout)
            },
        );
        sink.deliver(&federating(1, &["a.example", "b.example"]))
            .await
            .expect("federating");
        let [_, _, bundle] = layout_names(layout);
        let mut want = svid(1).bundle_der.to_vec();
        want.extend([b"a.example".to_vec(), b"b.example".to_vec()]);
        assert_eq!(read_pem(&dir.path().join(bundle)), want, "{layout:?}");
        assert!(dir.path().join(federated_file("a.example")).exists());
    }
}
