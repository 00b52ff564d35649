//! The vocabulary policy and the CA core share. A leaf: both import it, it imports neither,
//! so policy (which decides from the names a CSR asks for) and the CA core (which signs what
//! policy granted) depend on each other in one direction only (`ca` -> `policy::grant`).

use std::net::IpAddr;
use std::time::Duration;

/// How far notBefore is backdated, to tolerate clock skew between hosts.
pub const BACKDATE: Duration = Duration::from_secs(10);

/// The names a CSR asks for (its subjectAltName extension request), as parsed by
/// `ca::csr::VerifiedCsr`. Policy compares these with what the caller may have.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestedNames {
    pub uris: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub emails: Vec<String>,
    /// SAN types Signet never issues (otherName, directoryName, registeredID, …), by name.
    pub other: Vec<String>,
}
