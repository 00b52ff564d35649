//! Fingerprints, as Signet shows and compares them everywhere: SHA-256 over DER, lowercase hex
//! without separators (the ledger's `cert_sha256`, `signetctl certs show`, the agent's logs).
//!
//! One other spelling exists, for display next to TLS tools only: [`sha256_colon`], uppercase
//! pairs joined by colons as `openssl x509 -fingerprint -sha256` prints them (`signetctl`'s
//! certificate and CA views, the server's start-up log of its CA).

/// Lowercase hex without separators: how Signet spells key identifiers, serials and digests.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of `der`, lowercase hex.
pub fn sha256_hex(der: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, der).as_ref())
}

/// SHA-256 of `der` as TLS tools display it: uppercase hex pairs joined by `:`
/// (`AB:CD:…`). For showing to people beside `openssl` output; compare and store
/// [`sha256_hex`].
pub fn sha256_colon(der: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, der)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
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

    #[test]
    fn the_colon_form_is_the_same_digest_as_openssl_prints_it() {
        let colon = super::sha256_colon(b"abc");
        assert!(colon.starts_with("BA:78:16:BF:"), "{colon}");
        assert_eq!(colon.len(), 32 * 3 - 1);
        assert_eq!(
            colon.replace(':', "").to_ascii_lowercase(),
            super::sha256_hex(b"abc")
        );
    }
}
