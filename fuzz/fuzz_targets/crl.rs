#![no_main]
//! CRLs from the server's bundle (the agent and the bridge read them): `signet_pki::ParsedCrl`
//! must never panic, and what it reads must survive its own PEM round trip. Seeded with a real
//! CRL (fuzz/corpus/crl, made by `openssl ca -gencrl`). pki's unit tests run the same checks
//! over the corpus.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(crl) = signet_pki::ParsedCrl::from_der(data) {
        let again = signet_pki::ParsedCrl::from_pem(crl.to_pem().as_bytes())
            .expect("a CRL that parsed reads back from its own PEM");
        assert_eq!(again, crl);
        let _ = crl.lists(&[0x8f, 0x01]);
    }
    let _ = signet_pki::ParsedCrl::from_pem(data);
});
