//! Fingerprints, as Signet shows and compares them everywhere: SHA-256 over DER, lowercase hex
//! without separators (the ledger's `cert_sha256`, `signetctl certs show`, the agent's logs).

/// SHA-256 of `der`, lowercase hex.
pub fn sha256_hex(der: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn is_lowercase_hex_sha256() {
        assert_eq!(
            super::sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
