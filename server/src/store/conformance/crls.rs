//! The [`CrlStore`] part of the conformance suite: CRL numbers under a lock across instances.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use super::Db;
use crate::store::StoredCrl;

conformance!(crl_numbers_only_increase_across_instances);

fn crl(number: u64, this_update: i64, mark: u64) -> StoredCrl {
    StoredCrl {
        ca_key_id: "k1".into(),
        number,
        der: vec![0x30, number as u8],
        this_update,
        next_update: this_update + 60,
        mark,
    }
}

/// CRL numbers are taken under a lock: two instances re-signing at once never use one number
/// twice, and a stale signer (one that would re-sign what another already did) keeps the
/// current CRL.
async fn crl_numbers_only_increase_across_instances(db: Db) {
    let a = db.store.clone();
    let b = db.another().await;
    assert_eq!(a.stored_crl("k1").await.unwrap(), None);
    let first = a
        .refresh_crl("k1", &|cur| {
            Some(crl(cur.map_or(1, |c| c.number + 1), 10, 0))
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.number, 1);
    // Keep: the signer says nothing is due.
    let kept = b.refresh_crl("k1", &|_| None).await.unwrap();
    assert_eq!(kept, Some(first.clone()));
    // A signer that reuses or lowers a number is refused (skipping ahead is allowed: a server
    // signs above the highest number it served when the stored one was set back).
    for n in [0, 1] {
        assert!(b.refresh_crl("k1", &|_| Some(crl(n, 10, 0))).await.is_err());
    }
    assert_eq!(b.stored_crl("k1").await.unwrap(), Some(first));

    let signed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, store) in [a.clone(), b.clone(), a.clone(), b.clone()]
        .into_iter()
        .enumerate()
    {
        let signed = signed.clone();
        tasks.push(tokio::spawn(async move {
            for k in 0..10 {
                let signed = signed.clone();
                let sign = move |cur: Option<&StoredCrl>| {
                    let n = cur.map_or(1, |c| c.number + 1);
                    signed.lock().unwrap().push(n);
                    Some(crl(n, 100 + k, i as u64))
                };
                store.refresh_crl("k1", &sign).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut numbers = signed.lock().unwrap().clone();
    numbers.sort_unstable();
    assert_eq!(
        numbers,
        (2..=41).collect::<Vec<u64>>(),
        "a CRL number was reused"
    );
    assert_eq!(a.stored_crl("k1").await.unwrap().unwrap().number, 41);
    // Another key counts on its own.
    let other = a
        .refresh_crl("k2", &|cur| {
            let mut c = crl(cur.map_or(1, |c| c.number + 1), 1, 0);
            c.ca_key_id = "k2".into();
            Some(c)
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(other.number, 1);
}
