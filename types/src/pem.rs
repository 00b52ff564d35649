//! PEM helpers for certificate chains (built on the `pem` crate).

/// Why a PEM input was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PemError {
    #[error("not valid PEM: {0}")]
    Malformed(String),
    #[error("expected PEM blocks labelled {expected}, found {found:?}")]
    WrongLabel {
        expected: &'static str,
        found: String,
    },
    #[error("no PEM block found")]
    Empty,
}

/// Encodes one DER certificate as a PEM block.
pub fn cert_to_pem(der: &[u8]) -> String {
    pem::encode_config(
        &pem::Pem::new("CERTIFICATE", der.to_vec()),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

/// Encodes DER certificates as concatenated PEM blocks, in order.
pub fn certs_to_pem<'a>(ders: impl IntoIterator<Item = &'a [u8]>) -> String {
    ders.into_iter().map(cert_to_pem).collect()
}

/// Parses every `CERTIFICATE` block of `input`, in order. Any other label is an error.
pub fn parse_certs(input: &[u8]) -> Result<Vec<Vec<u8>>, PemError> {
    let blocks = pem::parse_many(input).map_err(|e| PemError::Malformed(e.to_string()))?;
    if blocks.is_empty() {
        return Err(PemError::Empty);
    }
    blocks
        .into_iter()
        .map(|b| {
            if b.tag() == "CERTIFICATE" {
                Ok(b.into_contents())
            } else {
                Err(PemError::WrongLabel {
                    expected: "CERTIFICATE",
                    found: b.tag().to_owned(),
                })
            }
        })
        .collect()
}

/// Parses exactly one PEM block with one of the given labels, returning (label, DER).
pub fn parse_one(input: &[u8], labels: &[&'static str]) -> Result<(String, Vec<u8>), PemError> {
    let block = pem::parse(input).map_err(|e| match e {
        pem::PemError::MalformedFraming | pem::PemError::MissingBeginTag => PemError::Empty,
        other => PemError::Malformed(other.to_string()),
    })?;
    if !labels.contains(&block.tag()) {
        return Err(PemError::WrongLabel {
            expected: labels.first().copied().unwrap_or("?"),
            found: block.tag().to_owned(),
        });
    }
    Ok((block.tag().to_owned(), block.into_contents()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_round_trip() {
        let ders: [&[u8]; 2] = [b"\x30\x03\x02\x01\x01", b"\x30\x03\x02\x01\x02"];
        let pem = certs_to_pem(ders);
        assert_eq!(pem.matches("BEGIN CERTIFICATE").count(), 2);
        let back = parse_certs(pem.as_bytes()).expect("parses");
        assert_eq!(back, ders.map(<[u8]>::to_vec));
    }

    #[test]
    fn refuses_other_labels_and_garbage() {
        let key = "-----BEGIN PRIVATE KEY-----\nMAA=\n-----END PRIVATE KEY-----\n";
        assert!(matches!(
            parse_certs(key.as_bytes()),
            Err(PemError::WrongLabel { .. })
        ));
        assert_eq!(parse_certs(b"hello"), Err(PemError::Empty));
        assert!(parse_one(b"hello", &["CERTIFICATE REQUEST"]).is_err());
    }
}
