//! [`FederationAdminClient`]: the typed client of `signet.admin.v1.FederationAdmin`, the
//! federation relationships (the foreign trust domains whose bundles the server fetches and
//! keeps): create, list, read, delete, refresh now, and set the held bundle.
//!
//! The invariant is the crate's: a relationship reaches the caller only if it names a valid
//! trust domain and one of the known profiles (anything else is a
//! [`CallError::InvalidAnswer`]); the proto's "0 means never" times, "0 means none" sequence
//! and empty strings are `None` here. The held bundle document is passed on as the bytes the
//! server holds: [`signet_pki::SpiffeBundle::parse`] is its one reader, and a caller that
//! shows it reads it there (a document that does not read still leaves the relationship
//! listable).

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use signet_proto::admin as pb;
use signet_proto::admin::federation_admin_client::FederationAdminClient as PbFederationAdminClient;
use signet_types::TrustDomain;
use tonic::transport::Channel;

use crate::ClientError;
use crate::convert::request;
use crate::error::CallError;

/// How the server obtains a relationship's bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FederationProfile {
    /// Fetched from a bundle endpoint authenticated by the SPIFFE ID it presents (checked
    /// against the bundle held).
    HttpsSpiffe,
    /// Fetched from a bundle endpoint authenticated by the web PKI.
    HttpsWeb,
    /// No endpoint: the operator sets the bundle.
    Static,
}

impl FederationProfile {
    /// The server's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FederationProfile::HttpsSpiffe => "https_spiffe",
            FederationProfile::HttpsWeb => "https_web",
            FederationProfile::Static => "static",
        }
    }
}

impl fmt::Display for FederationProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Text that names no [`FederationProfile`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown federation profile {0:?} (https_spiffe, https_web or static)")]
pub struct UnknownProfile(pub String);

impl FromStr for FederationProfile {
    type Err = UnknownProfile;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "https_spiffe" => Ok(FederationProfile::HttpsSpiffe),
            "https_web" => Ok(FederationProfile::HttpsWeb),
            "static" => Ok(FederationProfile::Static),
            other => Err(UnknownProfile(other.to_owned())),
        }
    }
}

/// One federation relationship, as the server records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FederationRelationship {
    pub trust_domain: TrustDomain,
    /// The bundle endpoint's https URL (`None`: a static relationship).
    pub bundle_endpoint_url: Option<String>,
    pub profile: FederationProfile,
    /// `https_spiffe`: the SPIFFE ID the endpoint must present.
    pub endpoint_spiffe_id: Option<String>,
    /// Unix seconds.
    pub created_at: i64,
    /// The bundle held, a SPIFFE bundle document (JSON) as the server holds it; empty if none
    /// yet (`https_web` before its first successful fetch).
    pub bundle_document: Vec<u8>,
    /// The held bundle's `spiffe_sequence`.
    pub sequence: Option<u64>,
    /// When the held bundle last changed (unix seconds).
    pub bundle_updated_at: Option<i64>,
    /// The last fetch that was accepted, changed or not (unix seconds).
    pub last_success_at: Option<i64>,
    /// The last fetch attempted (unix seconds).
    pub last_attempt_at: Option<i64>,
    /// When the next fetch is due (unix seconds; `None` for a static relationship).
    pub next_refresh_at: Option<i64>,
    /// Why the last attempt failed (`None`: it succeeded). The bundle held is kept.
    pub last_error: Option<String>,
    pub consecutive_failures: u32,
    /// How many registration entries federate with this trust domain.
    pub federating_entries: u64,
}

/// A relationship to create. Strings are sent as typed: the server validates them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewRelationship {
    /// `partner.example` or `spiffe://partner.example`.
    pub trust_domain: String,
    /// `None`: a static relationship (bundle only).
    pub bundle_endpoint_url: Option<String>,
    /// `None` (or [`FederationProfile::Static`]) without an endpoint.
    pub profile: Option<FederationProfile>,
    /// `https_spiffe`: the SPIFFE ID the endpoint must present.
    pub endpoint_spiffe_id: Option<String>,
    /// The starting bundle, PEM certificates or a SPIFFE bundle document (JSON); empty: none.
    /// Required for `https_spiffe` and for a static relationship.
    pub bundle: Vec<u8>,
}

impl From<&NewRelationship> for pb::CreateRelationshipRequest {
    fn from(r: &NewRelationship) -> Self {
        // A static relationship is one without an endpoint: the proto spells its profile "".
        let profile = match r.profile {
            None | Some(FederationProfile::Static) => String::new(),
            Some(p) => p.as_str().to_owned(),
        };
        pb::CreateRelationshipRequest {
            trust_domain: r.trust_domain.clone(),
            bundle_endpoint_url: r.bundle_endpoint_url.clone().unwrap_or_default(),
            profile,
            endpoint_spiffe_id: r.endpoint_spiffe_id.clone().unwrap_or_default(),
            bundle: r.bundle.clone(),
        }
    }
}

/// See the module documentation. Cloning is cheap (one shared channel).
#[derive(Clone, Debug)]
pub struct FederationAdminClient {
    fed: PbFederationAdminClient<Channel>,
}

impl FederationAdminClient {
    /// Connects to the admin API on the server's Unix socket.
    pub async fn connect(socket: &Path) -> Result<Self, ClientError> {
        Ok(Self::from_channel(crate::connect_admin(socket).await?))
    }

    pub fn from_channel(channel: Channel) -> Self {
        Self {
            fed: PbFederationAdminClient::new(channel),
        }
    }

    /// `CreateRelationship`. With a bundle endpoint the server makes the first fetch before it
    /// answers: its outcome is in the relationship's `last_error`.
    pub async fn create(&self, r: &NewRelationship) -> Result<FederationRelationship, CallError> {
        let msg = pb::CreateRelationshipRequest::from(r);
        relationship(
            self.fed
                .clone()
                .create_relationship(request(msg, None)?)
                .await?
                .into_inner(),
        )
    }

    /// `ListRelationships`.
    pub async fn list(&self) -> Result<Vec<FederationRelationship>, CallError> {
        let r = self
            .fed
            .clone()
            .list_relationships(request(pb::ListRelationshipsRequest {}, None)?)
            .await?
            .into_inner();
        r.relationships.into_iter().map(relationship).collect()
    }

    /// `GetRelationship` (`NotFound` if there is none).
    pub async fn get(&self, trust_domain: &str) -> Result<FederationRelationship, CallError> {
        let msg = pb::GetRelationshipRequest {
            trust_domain: trust_domain.to_owned(),
        };
        relationship(
            self.fed
                .clone()
                .get_relationship(request(msg, None)?)
                .await?
                .into_inner(),
        )
    }

    /// `DeleteRelationship` (`FailedPrecondition` while entries federate with it).
    pub async fn delete(&self, trust_domain: &str) -> Result<(), CallError> {
        let msg = pb::DeleteRelationshipRequest {
            trust_domain: trust_domain.to_owned(),
        };
        self.fed
            .clone()
            .delete_relationship(request(msg, None)?)
            .await?;
        Ok(())
    }

    /// `RefreshRelationship`: fetch now; the outcome is in the answer's `last_error`
    /// (`FailedPrecondition` for a static relationship).
    pub async fn refresh(&self, trust_domain: &str) -> Result<FederationRelationship, CallError> {
        let msg = pb::RefreshRelationshipRequest {
            trust_domain: trust_domain.to_owned(),
        };
        relationship(
            self.fed
                .clone()
                .refresh_relationship(request(msg, None)?)
                .await?
                .into_inner(),
        )
    }

    /// `SetRelationshipBundle`: replace the held bundle with `bundle` (PEM certificates or a
    /// SPIFFE bundle document).
    pub async fn set_bundle(
        &self,
        trust_domain: &str,
        bundle: Vec<u8>,
    ) -> Result<FederationRelationship, CallError> {
        let msg = pb::SetRelationshipBundleRequest {
            trust_domain: trust_domain.to_owned(),
            bundle,
        };
        relationship(
            self.fed
                .clone()
                .set_relationship_bundle(request(msg, None)?)
                .await?
                .into_inner(),
        )
    }
}

fn nonzero(t: i64) -> Option<i64> {
    (t != 0).then_some(t)
}

fn nonempty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn relationship(r: pb::Relationship) -> Result<FederationRelationship, CallError> {
    let trust_domain = r.trust_domain.parse().map_err(|e| {
        CallError::invalid_answer(format!(
            "federation relationship trust domain {:?}: {e}",
            r.trust_domain
        ))
    })?;
    let profile = r.profile.parse().map_err(|e: UnknownProfile| {
        CallError::invalid_answer(format!("federation relationship {trust_domain}: {e}"))
    })?;
    Ok(FederationRelationship {
        trust_domain,
        bundle_endpoint_url: nonempty(r.bundle_endpoint_url),
        profile,
        endpoint_spiffe_id: nonempty(r.endpoint_spiffe_id),
        created_at: r.created_at,
        bundle_document: r.bundle_document,
        sequence: (r.sequence != 0).then_some(r.sequence),
        bundle_updated_at: nonzero(r.bundle_updated_at),
        last_success_at: nonzero(r.last_success_at),
        last_attempt_at: nonzero(r.last_attempt_at),
        next_refresh_at: nonzero(r.next_refresh_at),
        last_error: nonempty(r.last_error),
        consecutive_failures: r.consecutive_failures,
        federating_entries: r.federating_entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel() -> pb::Relationship {
        pb::Relationship {
            trust_domain: "partner.example".into(),
            bundle_endpoint_url: "https://partner.example/bundle".into(),
            profile: "https_spiffe".into(),
            endpoint_spiffe_id: "spiffe://partner.example/bundle-endpoint".into(),
            created_at: 100,
            bundle_document: br#"{"keys":[]}"#.to_vec(),
            sequence: 7,
            bundle_updated_at: 110,
            last_success_at: 120,
            last_attempt_at: 130,
            next_refresh_at: 430,
            last_error: "connection refused".into(),
            consecutive_failures: 2,
            federating_entries: 3,
        }
    }

    #[test]
    fn a_relationship_converts_with_zeros_and_empty_strings_as_none() {
        let r = relationship(rel()).unwrap();
        assert_eq!(r.trust_domain.to_string(), "partner.example");
        assert_eq!(r.profile, FederationProfile::HttpsSpiffe);
        assert_eq!(
            r.bundle_endpoint_url.as_deref(),
            Some("https://partner.example/bundle")
        );
        assert_eq!(
            (r.sequence, r.bundle_updated_at, r.last_success_at),
            (Some(7), Some(110), Some(120))
        );
        assert_eq!(
            (r.last_attempt_at, r.next_refresh_at),
            (Some(130), Some(430))
        );
        assert_eq!(r.last_error.as_deref(), Some("connection refused"));
        assert_eq!((r.consecutive_failures, r.federating_entries), (2, 3));
        assert_eq!(r.bundle_document, br#"{"keys":[]}"#);

        let s = relationship(pb::Relationship {
            bundle_endpoint_url: String::new(),
            profile: "static".into(),
            endpoint_spiffe_id: String::new(),
            bundle_document: vec![],
            sequence: 0,
            bundle_updated_at: 0,
            last_success_at: 0,
            last_attempt_at: 0,
            next_refresh_at: 0,
            last_error: String::new(),
            ..rel()
        })
        .unwrap();
        assert_eq!(s.profile, FederationProfile::Static);
        assert_eq!((s.bundle_endpoint_url, s.endpoint_spiffe_id), (None, None));
        assert_eq!((s.sequence, s.bundle_updated_at), (None, None));
        assert_eq!(
            (s.last_success_at, s.last_attempt_at, s.next_refresh_at),
            (None, None, None)
        );
        assert_eq!(s.last_error, None);
    }

    #[test]
    fn a_relationship_needs_a_trust_domain_and_a_known_profile() {
        for bad in [
            pb::Relationship {
                trust_domain: "Not A Domain!".into(),
                ..rel()
            },
            pb::Relationship {
                trust_domain: String::new(),
                ..rel()
            },
            pb::Relationship {
                profile: "HTTPS_WEB".into(),
                ..rel()
            },
            pb::Relationship {
                profile: String::new(),
                ..rel()
            },
        ] {
            let e = relationship(bad).unwrap_err();
            assert!(matches!(e, CallError::InvalidAnswer(_)), "{e:?}");
        }
    }

    #[test]
    fn a_profile_reads_back_its_spelling_and_static_is_sent_as_none() {
        for p in [
            FederationProfile::HttpsSpiffe,
            FederationProfile::HttpsWeb,
            FederationProfile::Static,
        ] {
            assert_eq!(p.as_str().parse::<FederationProfile>(), Ok(p));
        }
        assert_eq!(
            "web".parse::<FederationProfile>(),
            Err(UnknownProfile("web".into()))
        );
        let mut n = NewRelationship {
            trust_domain: "spiffe://partner.example".into(),
            bundle: b"pem".to_vec(),
            profile: Some(FederationProfile::Static),
            ..NewRelationship::default()
        };
        let m = pb::CreateRelationshipRequest::from(&n);
        assert_eq!(
            (m.trust_domain.as_str(), m.profile.as_str()),
            ("spiffe://partner.example", "")
        );
        assert_eq!(
            (m.bundle_endpoint_url.as_str(), m.bundle.as_slice()),
            ("", &b"pem"[..])
        );
        n.bundle_endpoint_url = Some("https://p/b".into());
        n.profile = Some(FederationProfile::HttpsWeb);
        let m = pb::CreateRelationshipRequest::from(&n);
        assert_eq!(
            (m.bundle_endpoint_url.as_str(), m.profile.as_str()),
            ("https://p/b", "https_web")
        );
    }
}
