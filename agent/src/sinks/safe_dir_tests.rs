use super::*;

#[test]
fn components_are_single_names() {
    for bad in ["", ".", "..", "a/b", "/abs", "a\0b", "../x"] {
        assert!(Component::new(bad).is_none(), "{bad:?}");
    }
    for good in ["tls.key", "..data", "..signet-1-2-3", ".x.tmp"] {
        assert!(Component::new(good).is_some(), "{good:?}");
    }
}

#[test]
fn generation_names_are_exactly_the_agents_naming() {
    let g = GenerationName::new(17, 42, 3);
    assert_eq!(g.as_str(), "..signet-17-42-3");
    assert_eq!(GenerationName::parse(g.as_str().as_bytes()), Some(g));
    for bad in [
        "/etc",
        "../../victim",
        "..signet-1-2",
        "..signet-1-2-3-4",
        "..signet-1-2-x",
        "..signet-1-2-3/..",
        "..signet-1-2-3/x",
        "..signet--2-3",
        "x..signet-1-2-3",
        "..data",
    ] {
        assert!(GenerationName::parse(bad.as_bytes()).is_none(), "{bad:?}");
    }
}

#[test]
fn remove_generation_never_follows_links() {
    let root = tempfile::tempdir().expect("tempdir");
    let sink = root.path().join("sink");
    let victim = root.path().join("victim");
    std::fs::create_dir(&sink).expect("mkdir");
    std::fs::create_dir(&victim).expect("mkdir");
    std::fs::write(victim.join("precious"), b"keep").expect("write");
    let dir = SinkDir::open(&sink).expect("open");

    // A link named like a generation: the link goes, the victim stays.
    let g = GenerationName::new(1, 1, 1);
    std::os::unix::fs::symlink(&victim, sink.join(g.as_str())).expect("link");
    let note = dir.remove_generation(&g).expect("removed the link");
    assert!(note.is_some());
    assert!(victim.join("precious").exists());
    assert!(std::fs::symlink_metadata(sink.join(g.as_str())).is_err());

    // A real generation holding a link to the victim: the link goes, not its target.
    let g = GenerationName::new(2, 1, 1);
    let own = dir.create_generation(&g).expect("create");
    own.write_file(Component::new("a").expect("c"), b"x", 0o600, (None, None))
        .expect("write");
    std::os::unix::fs::symlink(&victim, sink.join(g.as_str()).join("link")).expect("link");
    assert_eq!(dir.remove_generation(&g), Ok(None));
    assert!(victim.join("precious").exists());
    assert!(!sink.join(g.as_str()).exists());

    // A generation holding a directory is left in place (no recursion).
    let g = GenerationName::new(3, 1, 1);
    dir.create_generation(&g).expect("create");
    std::fs::create_dir(sink.join(g.as_str()).join("sub")).expect("mkdir");
    assert!(dir.remove_generation(&g).is_err());
    assert!(sink.join(g.as_str()).join("sub").exists());

    // Absent: nothing to do.
    assert_eq!(
        dir.remove_generation(&GenerationName::new(9, 9, 9)),
        Ok(None)
    );
}

#[test]
fn only_real_directories_of_the_agent_are_opened() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = SinkDir::open(root.path()).expect("open");
    let victim = root.path().join("victim");
    std::fs::create_dir(&victim).expect("mkdir");
    std::os::unix::fs::symlink(&victim, root.path().join("link")).expect("link");
    assert!(
        dir.open_own_dir(Component::new("link").expect("c"))
            .is_err()
    );
    std::fs::write(root.path().join("file"), b"x").expect("write");
    assert!(
        dir.open_own_dir(Component::new("file").expect("c"))
            .is_err()
    );
    assert!(
        dir.open_own_dir(Component::new("victim").expect("c"))
            .is_ok()
    );
    if euid() == 0 {
        std::os::unix::fs::chown(&victim, Some(65534), None).expect("chown");
        let err = dir
            .open_own_dir(Component::new("victim").expect("c"))
            .err()
            .expect("not the agent's");
        assert!(err.to_string().contains("owned by uid 65534"), "{err}");
    }
    // A generation name that already exists (planted first) is not taken over.
    let g = GenerationName::new(5, 5, 5);
    std::os::unix::fs::symlink(&victim, root.path().join(g.as_str())).expect("link");
    assert!(dir.create_generation(&g).is_err());
}

#[test]
fn write_file_refuses_existing_names_and_links() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = SinkDir::open(root.path()).expect("open");
    let g = GenerationName::new(1, 2, 3);
    let own = dir.create_generation(&g).expect("create");
    let victim = root.path().join("victim");
    std::fs::write(&victim, b"keep").expect("write");
    std::os::unix::fs::symlink(&victim, root.path().join(g.as_str()).join("k")).expect("link");
    let c = Component::new("k").expect("c");
    assert!(own.write_file(c, b"x", 0o600, (None, None)).is_err());
    assert_eq!(std::fs::read(&victim).expect("read"), b"keep");
}

#[test]
fn trusted_paths_follow_only_links_nobody_else_could_plant() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().expect("tempdir");
    let r = root.path();
    std::fs::set_permissions(r, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::create_dir_all(r.join("real/sink")).expect("mkdir");
    std::os::unix::fs::symlink("real", r.join("alias")).expect("link");
    std::os::unix::fs::symlink(r.join("real/sink"), r.join("abs")).expect("link");
    // Through links the agent's own directories hold: fine.
    for p in ["real/sink", "alias/sink", "abs", "real/../real/sink"] {
        let fd = open_trusted_dir(&r.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        let ino = File::from(fd).metadata().expect("meta").ino();
        let want = std::fs::metadata(r.join("real/sink")).expect("meta").ino();
        assert_eq!(ino, want, "{p}");
    }
    // A directory others can write on the way: refused, link or not.
    std::fs::set_permissions(r.join("real"), std::fs::Permissions::from_mode(0o777))
        .expect("chmod");
    for p in ["real/sink", "alias/sink"] {
        assert!(
            matches!(open_trusted_dir(&r.join(p)), Err(OpenError::Untrusted(_))),
            "{p}"
        );
    }
    std::fs::set_permissions(r.join("real"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    if euid() == 0 {
        // A parent owned by the workload could swap the sink directory for a link.
        std::os::unix::fs::chown(r.join("real"), Some(65534), None).expect("chown");
        let err = open_trusted_dir(&r.join("real/sink")).expect_err("untrusted");
        assert!(err.to_string().contains("uid 65534"), "{err}");
        std::os::unix::fs::chown(r.join("real"), Some(0), None).expect("chown");
        // The sink directory itself may be the workload's.
        std::os::unix::fs::chown(r.join("real/sink"), Some(65534), None).expect("chown");
        open_trusted_dir(&r.join("real/sink")).expect("the workload's own directory");
    }
    assert!(open_trusted_dir(&r.join("missing")).is_err());
}

/// A parent made under umask 002 (0775): refused, naming it and the `chmod` that fixes it.
#[test]
fn an_untrusted_parent_is_named_with_its_fix() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().expect("tempdir");
    let r = root.path();
    std::fs::set_permissions(r, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::create_dir_all(r.join("srv/app")).expect("mkdir");
    std::fs::set_permissions(r.join("srv"), std::fs::Permissions::from_mode(0o775)).expect("chmod");
    let why = match open_trusted_dir(&r.join("srv/app")) {
        Err(OpenError::Untrusted(why)) => why,
        other => panic!("unexpected {other:?}"),
    };
    let srv = r.join("srv");
    assert!(why.contains("mode 775"), "{why}");
    assert!(
        why.contains(&format!("fix: `chmod g-w {}`", srv.display())),
        "{why}"
    );
    std::fs::set_permissions(&srv, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let Err(OpenError::Untrusted(why)) = open_trusted_dir(&r.join("srv/app")) else {
        panic!("refused");
    };
    assert!(
        why.contains(&format!("`chmod go-w {}`", srv.display())),
        "{why}"
    );
    std::fs::set_permissions(&srv, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    open_trusted_dir(&r.join("srv/app")).expect("fixed");
}

#[test]
fn shared_directories_are_detected() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    assert!(!SinkDir::open(root.path()).expect("open").is_shared());
    for mode in [0o775, 0o757, 0o1777] {
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(mode))
            .expect("chmod");
        assert!(
            SinkDir::open(root.path()).expect("open").is_shared(),
            "{mode:o}"
        );
    }
}
