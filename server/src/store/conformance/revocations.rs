//! The [`RevocationStore`] part of the conformance suite: revocations as events in the one
//! chain, revocable selections, and racing revocations of one certificate.
#![allow(clippy::unwrap_used)]

use signet_types::ledger::{EVENT_REVOKE, Verifier};

use super::{Db, cert};
use crate::store::{CertFilter, NewRevocation, RevocationOutcome, Store};

conformance!(
    revocations_are_events_in_the_one_chain,
    revocable_certificates_filter_and_page,
    racing_revocations_of_one_certificate_revoke_it_once,
    a_revocation_takes_every_renewal_with_it_and_a_revoked_parent_renews_nothing,
);

/// `cert(i)` renewed from the certificate with `parent` (over mTLS).
fn renewal(i: usize, parent: &str) -> crate::store::NewCertificate {
    let mut c = cert(i);
    c.provenance =
        format!(r#"{{"source":{{"kind":"admin"}},"authorized_at":{i},"renewed_from":"{parent}"}}"#);
    c
}

/// Issue 24, finding 3: a thief renews a leaked certificate (and renews the renewal); the
/// operator revokes the leaked serial. Every descendant is revoked in the same transaction,
/// each by an event of its own, and a renewal of any of them is refused at commit.
async fn a_revocation_takes_every_renewal_with_it_and_a_revoked_parent_renews_nothing(db: Db) {
    let s = db.store.clone();
    let leaked = cert(0);
    s.append_certificates(&[leaked.clone(), cert(1)])
        .await
        .unwrap();
    let child = renewal(2, &leaked.serial);
    s.append_certificates(std::slice::from_ref(&child))
        .await
        .unwrap();
    let grandchild = renewal(3, &child.serial);
    s.append_certificates(std::slice::from_ref(&grandchild))
        .await
        .unwrap();
    let out = s
        .append_revocations(&[revocation(&leaked.serial, 1_700_000_100)])
        .await
        .unwrap();
    let RevocationOutcome::Revoked { row, cascaded, .. } = &out[0] else {
        panic!("{out:?}");
    };
    assert_eq!(row.entry.serial, leaked.serial);
    let mut took: Vec<&str> = cascaded
        .iter()
        .map(|(_, r)| r.entry.serial.as_str())
        .collect();
    took.sort_unstable();
    let mut want = vec![child.serial.as_str(), grandchild.serial.as_str()];
    want.sort_unstable();
    assert_eq!(took, want);
    // Each is revoked in the index and by an event of the chain, which still verifies.
    for serial in [&child.serial, &grandchild.serial] {
        let events = s.events_for_serial(serial).await.unwrap();
        assert_eq!(events.len(), 1, "{serial}");
        assert!(
            events[0].event.detail.contains(&leaked.serial),
            "{events:?}"
        );
    }
    verify_merged(s.as_ref()).await;
    // The unrelated certificate is untouched.
    let again = s
        .append_revocations(&[revocation(&cert(1).serial, 1_700_000_200)])
        .await
        .unwrap();
    assert!(
        matches!(&again[0], RevocationOutcome::Revoked { cascaded, .. } if cascaded.is_empty())
    );
    // A renewal of a revoked certificate (committed after the revocation, e.g. on another
    // replica) is refused, and nothing of its batch is written.
    let head = s.ledger_head().await.unwrap();
    for parent in [&leaked.serial, &grandchild.serial] {
        let err = s
            .append_certificates(&[cert(7), renewal(8, parent)])
            .await
            .unwrap_err();
        assert!(
            matches!(&err, crate::store::StoreError::RevokedParent(p) if p == &vec![parent.clone()]),
            "{err:?}"
        );
    }
    assert_eq!(s.ledger_head().await.unwrap(), head);
    // A renewal of an unrevoked certificate still commits (after any fast path).
    s.append_certificates(&[cert(9)]).await.unwrap();
    let ok = renewal(10, &cert(9).serial);
    s.append_certificates(&[ok]).await.unwrap();
}

fn revocation(serial: &str, at: i64) -> NewRevocation {
    NewRevocation {
        serial: serial.into(),
        reason: "keyCompromise".into(),
        at,
        caller: "admin:spiffe://example.org/signet/admin".into(),
        request_id: "req-r".into(),
        detail: r#"{"by":"serial","value":"x"}"#.into(),
    }
}

/// The whole chain, certificate rows and events merged by seq, verified against the head.
async fn verify_merged(store: &dyn Store) -> u64 {
    let certs = store.list_certificates(0, 10_000, None).await.unwrap();
    let events = store.ledger_events(0, 10_000).await.unwrap();
    let mut v = Verifier::default();
    let (mut c, mut e) = (certs.iter().peekable(), events.iter().peekable());
    loop {
        let take_cert = match (c.peek(), e.peek()) {
            (Some(a), Some(b)) => a.entry.seq < b.event.seq,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        if take_cert {
            let r = c.next().unwrap();
            v.push(&r.entry, &r.prev_hash, &r.hash).unwrap();
        } else {
            let r = e.next().unwrap();
            v.push_event(&r.event, &r.prev_hash, &r.hash).unwrap();
        }
    }
    let head = store.ledger_head().await.unwrap();
    v.finish(head.seq, &head.hash).unwrap()
}

async fn revocations_are_events_in_the_one_chain(db: Db) {
    let s = db.store.clone();
    let batch: Vec<_> = (0..4).map(cert).collect();
    s.append_certificates(&batch).await.unwrap();
    let serial = |i: usize| cert(i).serial;
    let out = s
        .append_revocations(&[
            revocation(&serial(1), 1_700_000_100),
            revocation("00ff", 1_700_000_100),
            revocation(&serial(1), 1_700_000_100),
            revocation(&serial(3), 1_700_000_101),
        ])
        .await
        .unwrap();
    assert!(
        matches!(&out[0], RevocationOutcome::Revoked { event_seq: 5, row, .. } if row.entry.seq == 2)
    );
    assert_eq!(out[1], RevocationOutcome::Unknown);
    assert!(matches!(&out[2], RevocationOutcome::AlreadyRevoked { .. }));
    assert!(
        matches!(&out[3], RevocationOutcome::Revoked { event_seq: 6, row, .. } if row.entry.seq == 4)
    );
    // Certificates after events continue the same chain.
    s.append_certificates(&[cert(4)]).await.unwrap();
    assert_eq!(s.ledger_head().await.unwrap().seq, 7);
    assert_eq!(verify_merged(s.as_ref()).await, 7);

    // The rows carry the index; the events the record.
    let row = s.certificate_by_serial(&serial(1)).await.unwrap().unwrap();
    assert_eq!(
        row.revocation,
        Some(signet_types::ledger::Revocation {
            at: 1_700_000_100,
            reason: "keyCompromise".into()
        })
    );
    let ev = s.events_for_serial(&serial(1)).await.unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].event.kind, EVENT_REVOKE);
    assert_eq!(ev[0].event.cert_seq, 2);
    assert_eq!(ev[0].event.cert_hash, row.hash);
    assert_eq!(s.revocation_mark().await.unwrap(), 6);
    let events = s.ledger_events(5, 10).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event.seq, 6);

    // Revoking again changes nothing, not even the head.
    let head = s.ledger_head().await.unwrap();
    let again = s
        .append_revocations(&[revocation(&serial(1), 1_700_000_200)])
        .await
        .unwrap();
    assert_eq!(
        again,
        vec![RevocationOutcome::AlreadyRevoked {
            at: 1_700_000_100,
            reason: "keyCompromise".into()
        }]
    );
    assert_eq!(s.ledger_head().await.unwrap(), head);

    // What the CRL of the key lists: the revoked, unexpired ones.
    let listed = s.revoked_certificates("root-1", 0).await.unwrap();
    let serials: Vec<_> = listed.iter().map(|r| r.serial.clone()).collect();
    assert_eq!(serials, vec![serial(1), serial(3)]);
    assert!(
        s.revoked_certificates("root-1", 1_800_000_000)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(s.revoked_certificates("other", 0).await.unwrap().is_empty());
}

async fn revocable_certificates_filter_and_page(db: Db) {
    let s = db.store.clone();
    let batch: Vec<_> = (0..9).map(cert).collect();
    s.append_certificates(&batch).await.unwrap();
    s.append_revocations(&[revocation(&cert(0).serial, 1)])
        .await
        .unwrap();
    let now = 1_700_003_600 + 3; // certs 0..=3 have expired (not_after = 1_700_003_600 + i)
    let all = s
        .revocable_certificates(&CertFilter::Any, now, 0, 100)
        .await
        .unwrap();
    let seqs: Vec<u64> = all.iter().map(|r| r.entry.seq).collect();
    assert_eq!(seqs, vec![5, 6, 7, 8, 9]);
    let page = s
        .revocable_certificates(&CertFilter::Any, now, 6, 2)
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|r| r.entry.seq).collect::<Vec<_>>(),
        vec![7, 8]
    );
    let by_id = s
        .revocable_certificates(
            &CertFilter::SpiffeId("spiffe://example.org/ns/n1/sa/s".into()),
            0,
            0,
            100,
        )
        .await
        .unwrap();
    // Certificates 1, 4 and 7 have that ID; none is revoked.
    assert_eq!(by_id.len(), 3);
    let by_key = s
        .revocable_certificates(&CertFilter::CaKey("root-1".into()), 0, 0, 100)
        .await
        .unwrap();
    assert_eq!(by_key.len(), 8);
    assert!(
        s.revocable_certificates(&CertFilter::CaKey("nope".into()), 0, 0, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        s.any_certificate(&CertFilter::CaKey("root-1".into()))
            .await
            .unwrap()
    );
    assert!(
        !s.any_certificate(&CertFilter::CaKey("nope".into()))
            .await
            .unwrap()
    );
    assert!(
        s.any_certificate(&CertFilter::SpiffeId(
            "spiffe://example.org/ns/n0/sa/s".into()
        ))
        .await
        .unwrap()
    );
}

/// Two instances (replicas) revoke the same certificates at once: each is revoked by exactly
/// one event, and the chain stays one.
async fn racing_revocations_of_one_certificate_revoke_it_once(db: Db) {
    let a = db.store.clone();
    let b = db.another().await;
    let batch: Vec<_> = (0..20).map(cert).collect();
    a.append_certificates(&batch).await.unwrap();
    let mut tasks = Vec::new();
    for store in [a.clone(), b.clone(), a.clone(), b.clone()] {
        tasks.push(tokio::spawn(async move {
            let mut revoked = 0;
            for i in 0..20 {
                let out = store
                    .append_revocations(&[revocation(&cert(i).serial, 5)])
                    .await
                    .unwrap();
                if matches!(out[0], RevocationOutcome::Revoked { .. }) {
                    revoked += 1;
                }
            }
            revoked
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 20);
    assert_eq!(a.ledger_events(0, 100).await.unwrap().len(), 20);
    assert_eq!(verify_merged(a.as_ref()).await, 40);
}
