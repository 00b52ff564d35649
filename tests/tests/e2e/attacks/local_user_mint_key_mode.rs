//! Another uid on the machine reads a key `signetctl mint` wrote: the output directory already
//! held a world-readable `svid_key.pem` (an earlier copy, a file a colleague left, or one the
//! attacker pre-created and keeps open), or a symlink to a file the attacker can read. The
//! minted key must end up in a fresh 0600 file whatever was there; the old file and a link's
//! target never receive it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use signet_tests::TokenIssuer;

use crate::pg_server;

#[tokio::test]
async fn minted_key_is_0600_over_a_world_readable_file_or_a_link() {
    let tokens = TokenIssuer::new("mint-mode");
    let Some(server) = pg_server(&tokens, "").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mint = |out: &std::path::Path| {
        let out = server.signetctl(&[
            "mint",
            "--spiffe-id",
            "spiffe://example.org/ops/tool",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{out:?}");
    };

    // A world-readable key file is already there; the attacker holds it open.
    let out = dir.path().join("a");
    std::fs::create_dir(&out).unwrap();
    let key = out.join("svid_key.pem");
    std::fs::write(&key, "old key\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let held_open = std::fs::File::open(&key).unwrap();
    let old_ino = std::fs::metadata(&key).unwrap().ino();
    mint(&out);
    let meta = std::fs::symlink_metadata(&key).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600, "key mode {:o}", meta.mode());
    assert_ne!(
        meta.ino(),
        old_ino,
        "the key was written into the old, readable file"
    );
    assert!(
        std::fs::read_to_string(&key)
            .unwrap()
            .contains("PRIVATE KEY")
    );
    let mut through_old = String::new();
    std::io::Read::read_to_string(&mut &held_open, &mut through_old).unwrap();
    assert_eq!(through_old, "old key\n", "the open handle sees the new key");

    // The key name is a symlink to a file the attacker reads: the link is replaced, its
    // target untouched.
    let out = dir.path().join("b");
    std::fs::create_dir(&out).unwrap();
    let bait = dir.path().join("attacker-readable");
    std::fs::write(&bait, "bait\n").unwrap();
    std::fs::set_permissions(&bait, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&bait, out.join("svid_key.pem")).unwrap();
    mint(&out);
    let meta = std::fs::symlink_metadata(out.join("svid_key.pem")).unwrap();
    assert!(meta.file_type().is_file(), "still a link");
    assert_eq!(meta.mode() & 0o777, 0o600);
    assert_eq!(std::fs::read_to_string(&bait).unwrap(), "bait\n");

    // A fresh directory, as before: 0600 key, readable certificate and bundle, no leftovers.
    let out = dir.path().join("c");
    mint(&out);
    let mode = |n: &str| std::fs::metadata(out.join(n)).unwrap().mode() & 0o777;
    assert_eq!(mode("svid_key.pem"), 0o600);
    assert_eq!(mode("svid.pem"), 0o644);
    assert_eq!(mode("bundle.pem"), 0o644);
    let names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
}
