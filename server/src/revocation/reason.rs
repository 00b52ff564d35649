//! The revocation reasons Signet records and lists in its CRLs (RFC 5280 CRLReason). A leaf:
//! the CRL encoder uses it without depending on the revoker.

/// RFC 5280 §5.3.1 CRLReason, without `certificateHold` and `removeFromCRL`: a Signet
/// revocation is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    Unspecified,
    KeyCompromise,
    CaCompromise,
    AffiliationChanged,
    Superseded,
    CessationOfOperation,
    PrivilegeWithdrawn,
    AaCompromise,
}

impl Reason {
    pub const ALL: [Reason; 8] = [
        Reason::Unspecified,
        Reason::KeyCompromise,
        Reason::CaCompromise,
        Reason::AffiliationChanged,
        Reason::Superseded,
        Reason::CessationOfOperation,
        Reason::PrivilegeWithdrawn,
        Reason::AaCompromise,
    ];

    /// The RFC 5280 name (stored in the ledger).
    pub fn name(self) -> &'static str {
        match self {
            Reason::Unspecified => "unspecified",
            Reason::KeyCompromise => "keyCompromise",
            Reason::CaCompromise => "cACompromise",
            Reason::AffiliationChanged => "affiliationChanged",
            Reason::Superseded => "superseded",
            Reason::CessationOfOperation => "cessationOfOperation",
            Reason::PrivilegeWithdrawn => "privilegeWithdrawn",
            Reason::AaCompromise => "aACompromise",
        }
    }

    /// The CRLReason code.
    #[cfg(test)]
    pub fn code(self) -> u8 {
        match self {
            Reason::Unspecified => 0,
            Reason::KeyCompromise => 1,
            Reason::CaCompromise => 2,
            Reason::AffiliationChanged => 3,
            Reason::Superseded => 4,
            Reason::CessationOfOperation => 5,
            Reason::PrivilegeWithdrawn => 9,
            Reason::AaCompromise => 10,
        }
    }

    pub(crate) fn to_rcgen(self) -> rcgen::RevocationReason {
        use rcgen::RevocationReason as R;
        match self {
            Reason::Unspecified => R::Unspecified,
            Reason::KeyCompromise => R::KeyCompromise,
            Reason::CaCompromise => R::CaCompromise,
            Reason::AffiliationChanged => R::AffiliationChanged,
            Reason::Superseded => R::Superseded,
            Reason::CessationOfOperation => R::CessationOfOperation,
            Reason::PrivilegeWithdrawn => R::PrivilegeWithdrawn,
            Reason::AaCompromise => R::AaCompromise,
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Reason {
    type Err = String;

    /// The RFC 5280 name in any case, with or without `-` / `_` (`keyCompromise`,
    /// `key-compromise`, `KEY_COMPROMISE`).
    fn from_str(s: &str) -> Result<Self, String> {
        let norm = |n: &str| {
            n.chars()
                .filter(|c| *c != '-' && *c != '_')
                .flat_map(char::to_lowercase)
                .collect::<String>()
        };
        let want = norm(s);
        Reason::ALL
            .into_iter()
            .find(|r| norm(r.name()) == want)
            .ok_or_else(|| {
                let names: Vec<&str> = Reason::ALL.iter().map(|r| r.name()).collect();
                format!(
                    "unknown revocation reason {s:?} (one of: {})",
                    names.join(", ")
                )
            })
    }
}
