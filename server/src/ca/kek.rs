//! The key-encryption key (KEK) that protects CA private keys kept in the database.
//!
//! AES-256-GCM (ring) with a fresh random 96-bit nonce per seal; the sealed form is
//! `nonce || ciphertext || tag`. The associated data binds a sealed key to its context (for
//! example the CA key id), so a sealed blob cannot be moved to another row unnoticed.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// Length of a KEK in bytes.
pub const KEK_LEN: usize = 32;
const TAG_LEN: usize = 16;

/// Why a KEK could not be loaded or a sealed blob could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KekError {
    #[error(
        "the key-encryption key is not valid base64 (expected 32 random bytes, base64-encoded, e.g. `openssl rand -base64 32`)"
    )]
    InvalidBase64,
    #[error(
        "the key-encryption key is {0} bytes long; it must be exactly 32 bytes (base64 of `openssl rand 32`)"
    )]
    WrongLength(usize),
    #[error(
        "sealed data is too short ({0} bytes) to be nonce, ciphertext and tag: it is truncated or not sealed by Signet"
    )]
    TooShort(usize),
    #[error(
        "cannot decrypt: wrong key-encryption key, wrong context, or the sealed data was altered"
    )]
    Open,
}

/// A 256-bit key-encryption key. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Kek([u8; KEK_LEN]);

impl std::fmt::Debug for Kek {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Kek(…)")
    }
}

impl Drop for Kek {
    fn drop(&mut self) {
        // Best effort: overwrite the key before the memory is released.
        self.0.fill(0);
        std::hint::black_box(&self.0);
    }
}

impl Kek {
    /// A fresh random KEK from the operating system's CSPRNG.
    pub fn generate() -> Kek {
        let mut key = [0u8; KEK_LEN];
        SystemRandom::new()
            .fill(&mut key)
            .expect("the operating system's random number generator failed");
        Kek(key)
    }

    /// Parses a base64 KEK (standard alphabet, padding; surrounding whitespace ignored).
    pub fn from_base64(s: &str) -> Result<Kek, KekError> {
        let bytes = STANDARD
            .decode(s.trim())
            .map_err(|_| KekError::InvalidBase64)?;
        let key: [u8; KEK_LEN] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| KekError::WrongLength(bytes.len()))?;
        Ok(Kek(key))
    }

    /// The base64 spelling accepted by [`Kek::from_base64`].
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }

    fn aead_key(&self) -> LessSafeKey {
        LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, &self.0).expect("a 32-byte key is valid for AES-256-GCM"),
        )
    }

    /// Encrypts and authenticates `plaintext`, binding `aad`. Output: nonce || ciphertext || tag.
    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .expect("the operating system's random number generator failed");
        let mut out = Vec::with_capacity(NONCE_LEN + plaintext.len() + TAG_LEN);
        out.extend_from_slice(&nonce);
        let mut body = plaintext.to_vec();
        self.aead_key()
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut body,
            )
            .expect("AES-GCM sealing fails only for inputs larger than 64 GiB");
        out.extend_from_slice(&body);
        body.fill(0);
        out
    }

    /// Reverses [`Kek::seal`]; any wrong key, wrong `aad` or alteration is an error.
    pub fn open(&self, sealed: &[u8], aad: &[u8]) -> Result<Vec<u8>, KekError> {
        if sealed.len() < NONCE_LEN + TAG_LEN {
            return Err(KekError::TooShort(sealed.len()));
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| KekError::Open)?;
        let mut buf = body.to_vec();
        let len = self
            .aead_key()
            .open_in_place(nonce, Aad::from(aad), &mut buf)
            .map_err(|_| KekError::Open)?
            .len();
        buf.truncate(len);
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_base64() {
        let kek = Kek::generate();
        let again = Kek::from_base64(&kek.to_base64()).expect("parses");
        assert_eq!(kek, again);
        let sealed = kek.seal(b"secret key", b"ca-key-1");
        assert_eq!(sealed.len(), NONCE_LEN + 10 + TAG_LEN);
        assert_eq!(
            again.open(&sealed, b"ca-key-1").expect("opens"),
            b"secret key"
        );
        // Fresh nonce each time.
        assert_ne!(sealed, kek.seal(b"secret key", b"ca-key-1"));
        assert_eq!(format!("{kek:?}"), "Kek(…)");
    }

    #[test]
    fn wrong_key_aad_or_tampering_fail() {
        let kek = Kek::generate();
        let sealed = kek.seal(b"secret key", b"a");
        assert_eq!(Kek::generate().open(&sealed, b"a"), Err(KekError::Open));
        assert_eq!(kek.open(&sealed, b"b"), Err(KekError::Open));
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x01;
            assert_eq!(kek.open(&bad, b"a"), Err(KekError::Open), "byte {i}");
        }
        for len in 0..sealed.len() {
            assert!(kek.open(&sealed[..len], b"a").is_err());
        }
        assert!(kek.open(&[], b"a").is_err());
    }

    #[test]
    fn bad_base64() {
        assert_eq!(Kek::from_base64("!!!"), Err(KekError::InvalidBase64));
        assert_eq!(Kek::from_base64("AAAA"), Err(KekError::WrongLength(3)));
        let k = Kek::generate().to_base64();
        assert!(Kek::from_base64(&format!(" {k}\n")).is_ok());
    }
}
