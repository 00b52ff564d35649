//! The JWT-SVID signing key as the rest of the server sees it: [`JwtKeySource`] hands out the
//! active key ([`ActiveJwtKey`]) at the moment of signing. The CA key manager implements it from
//! its JWT key slots (kind `jwt`, the same lifecycle as the CA keys); issuance (`jwt_svid`) asks
//! it for every token, so a rotation or a taint takes effect at the next token.

use std::sync::Arc;
use std::time::SystemTime;

use signet_pki::jwt::JwtSigner;

/// The key that signs JWT-SVIDs now.
#[derive(Debug, Clone)]
pub struct ActiveJwtKey {
    pub signer: Arc<JwtSigner>,
    /// No token it signs may outlive this.
    pub not_after: SystemTime,
}

/// Where issuance gets the active JWT signing key.
pub trait JwtKeySource: Send + Sync {
    /// The active JWT key; `None` while there is none (JWT-SVIDs are then refused as
    /// Unavailable).
    fn active_jwt_key(&self) -> Option<ActiveJwtKey>;
}
