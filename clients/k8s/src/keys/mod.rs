//! Private keys for `Certificate`s: what `spec.privateKey` asks for ([`KeySpec`]). The keys
//! themselves — generating one ([`generate`]), reading the one already in a Secret
//! ([`PrivateKey::from_pem`]), a CSR for it ([`build_csr`]) — are `signet-pki`'s, shared with
//! the other clients; they are re-exported here.
//!
//! Encodings follow cert-manager: `PKCS1` (the default) is `RSA PRIVATE KEY` for RSA and SEC1
//! `EC PRIVATE KEY` for ECDSA, `PKCS8` is `PRIVATE KEY`; Ed25519 keys are always PKCS#8. P-521
//! is refused (ring cannot sign with it). No I/O, no clock.

pub use signet_pki::key::{KeyAlgorithm, KeyEncoding, KeyError, PrivateKey, generate};
pub use signet_pki::{CsrNames, build_csr};

/// `spec.privateKey.rotationPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RotationPolicy {
    /// A new key on every issuance (cert-manager's default since v1.18).
    #[default]
    Always,
    /// Keep the key already in the Secret while it matches the spec.
    Never,
}

/// What `spec.privateKey` asks for, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySpec {
    pub algorithm: KeyAlgorithm,
    pub encoding: KeyEncoding,
    pub rotation: RotationPolicy,
}

impl Default for KeySpec {
    fn default() -> Self {
        Self {
            algorithm: KeyAlgorithm::EcdsaP256,
            encoding: KeyEncoding::Pkcs1,
            rotation: RotationPolicy::Always,
        }
    }
}

/// A `spec.privateKey` we cannot honour. The message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnsupportedKey(pub String);

impl KeySpec {
    /// Validates `spec.privateKey`'s fields (each optional, as in the CRD).
    pub fn parse(
        algorithm: Option<&str>,
        size: Option<i64>,
        encoding: Option<&str>,
        rotation: Option<&str>,
    ) -> Result<Self, UnsupportedKey> {
        let algorithm = match (algorithm.unwrap_or("ECDSA"), size) {
            ("ECDSA", None | Some(0 | 256)) => KeyAlgorithm::EcdsaP256,
            ("ECDSA", Some(384)) => KeyAlgorithm::EcdsaP384,
            ("ECDSA", Some(521)) => {
                return Err(UnsupportedKey(
                    "privateKey: ECDSA size 521 (P-521) is not supported by Signet; use size 256 or 384"
                        .into(),
                ));
            }
            ("ECDSA", Some(n)) => {
                return Err(UnsupportedKey(format!(
                    "privateKey: ECDSA size {n} is not valid; use 256 or 384"
                )));
            }
            ("Ed25519", _) => KeyAlgorithm::Ed25519,
            ("RSA", None | Some(0)) => KeyAlgorithm::Rsa(2048),
            ("RSA", Some(n @ (2048 | 3072 | 4096))) => KeyAlgorithm::Rsa(n as u32),
            ("RSA", Some(8192)) => {
                return Err(UnsupportedKey(
                    "privateKey: RSA size 8192 is not supported by signet-k8s (generating it would stall the controller); use 2048, 3072 or 4096, or ECDSA"
                        .into(),
                ));
            }
            ("RSA", Some(n)) => {
                return Err(UnsupportedKey(format!(
                    "privateKey: RSA size {n} is not valid; use 2048, 3072 or 4096"
                )));
            }
            (other, _) => {
                return Err(UnsupportedKey(format!(
                    "privateKey: algorithm {other:?} is not supported; use ECDSA, Ed25519 or RSA"
                )));
            }
        };
        let encoding = match encoding {
            None | Some("") | Some("PKCS1") => KeyEncoding::Pkcs1,
            Some("PKCS8") => KeyEncoding::Pkcs8,
            Some(other) => {
                return Err(UnsupportedKey(format!(
                    "privateKey: encoding {other:?} is not valid; use PKCS1 or PKCS8"
                )));
            }
        };
        let rotation = match rotation {
            None | Some("") | Some("Always") => RotationPolicy::Always,
            Some("Never") => RotationPolicy::Never,
            Some(other) => {
                return Err(UnsupportedKey(format!(
                    "privateKey: rotationPolicy {other:?} is not valid; use Always or Never"
                )));
            }
        };
        Ok(Self {
            algorithm,
            encoding,
            rotation,
        })
    }
}

#[cfg(test)]
mod tests;
