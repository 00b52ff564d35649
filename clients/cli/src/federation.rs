//! `signetctl federation create|list|show|delete|refresh|set-bundle`: the federation
//! relationships (the `signet.admin.v1.FederationAdmin` service on the admin socket).
//!
//! Trust domains are sent as typed (`partner.example` or `spiffe://partner.example`): the
//! server validates them. The held bundle is read with [`SpiffeBundle::parse`], the one reader
//! of the SPIFFE bundle document.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, anyhow, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use signet_client::admin::{
    FederationAdminClient, FederationProfile, FederationRelationship, NewRelationship,
};
use signet_pki::SpiffeBundle;

use crate::{call_err, fingerprint, rfc3339};

#[derive(Debug, Subcommand)]
pub enum FederationCmd {
    /// Create a relationship: with --bundle-endpoint-url and --profile the server fetches the
    /// foreign bundle (the first fetch before it answers); without, a static relationship
    /// whose bundle is --bundle-file.
    Create(CreateArgs),
    /// Every relationship: its endpoint, the held bundle's sequence, the last fetch.
    List {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// One relationship: every field and a summary of the held bundle.
    Show {
        trust_domain: String,
        #[arg(long, conflicts_with = "bundle")]
        json: bool,
        /// Print only the held SPIFFE bundle document, as held.
        #[arg(long)]
        bundle: bool,
    },
    /// Delete a relationship (refused while entries federate with it).
    Delete { trust_domain: String },
    /// Fetch the bundle now; exits 1 if the fetch failed (the held bundle is kept).
    Refresh { trust_domain: String },
    /// Replace the held bundle with an operator's (a static relationship's rotation, or the
    /// re-bootstrap of an https_spiffe endpoint).
    SetBundle {
        trust_domain: String,
        /// PEM certificates or a SPIFFE bundle document (JSON); `-`: standard input.
        #[arg(long)]
        bundle_file: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// `partner.example` or `spiffe://partner.example`.
    #[arg(long)]
    trust_domain: String,
    /// The https URL of the foreign bundle endpoint (none: a static relationship).
    #[arg(long, requires = "profile")]
    bundle_endpoint_url: Option<String>,
    /// How the endpoint is authenticated; `static` (or none) without an endpoint.
    #[arg(long, value_enum)]
    profile: Option<ProfileArg>,
    /// https_spiffe: the SPIFFE ID the endpoint must present.
    #[arg(long, requires = "bundle_endpoint_url")]
    endpoint_spiffe_id: Option<String>,
    /// The starting bundle: PEM certificates or a SPIFFE bundle document (JSON); `-`:
    /// standard input. Required for https_spiffe and for a static relationship.
    #[arg(long)]
    bundle_file: Option<PathBuf>,
    /// Print the relationship created as JSON (as `show --json`).
    #[arg(long)]
    json: bool,
}

/// `federation create --profile`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProfileArg {
    #[value(name = "https_spiffe")]
    HttpsSpiffe,
    #[value(name = "https_web")]
    HttpsWeb,
    #[value(name = "static")]
    Static,
}

impl From<ProfileArg> for FederationProfile {
    fn from(p: ProfileArg) -> Self {
        match p {
            ProfileArg::HttpsSpiffe => FederationProfile::HttpsSpiffe,
            ProfileArg::HttpsWeb => FederationProfile::HttpsWeb,
            ProfileArg::Static => FederationProfile::Static,
        }
    }
}

impl CreateArgs {
    /// The request, with the bundle read already (`bundle`, empty: none). An endpoint needs a
    /// fetching profile; no endpoint is a static relationship.
    fn request(&self, bundle: Vec<u8>) -> anyhow::Result<NewRelationship> {
        let profile = self.profile.map(FederationProfile::from);
        match (&self.bundle_endpoint_url, profile) {
            (Some(_), None | Some(FederationProfile::Static)) => {
                bail!("--bundle-endpoint-url needs --profile https_spiffe or https_web")
            }
            (None, Some(p)) if p != FederationProfile::Static => bail!(
                "--profile {p} needs --bundle-endpoint-url (without one the relationship is static)"
            ),
            _ => {}
        }
        Ok(NewRelationship {
            trust_domain: self.trust_domain.clone(),
            bundle_endpoint_url: self.bundle_endpoint_url.clone(),
            profile,
            endpoint_spiffe_id: self.endpoint_spiffe_id.clone(),
            bundle,
        })
    }
}

async fn client(socket: &Path) -> anyhow::Result<FederationAdminClient> {
    FederationAdminClient::connect(socket).await.map_err(|e| {
        // The error names the socket.
        anyhow!("{e}\n(is signet-server running? point --socket at <data_dir>/admin.sock)")
    })
}

/// The bytes of `path` (`-`: standard input), as sent: the server reads them.
fn read_bundle_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    if path == Path::new("-") {
        std::io::stdin()
            .read_to_end(&mut bytes)
            .context("reading the bundle from standard input")?;
    } else {
        bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    }
    if bytes.is_empty() {
        bail!("the bundle file {} is empty", path.display());
    }
    Ok(bytes)
}

fn time_or_never(t: Option<i64>) -> String {
    t.map_or_else(|| "never".to_owned(), rfc3339)
}

fn time_or_null(t: Option<i64>) -> Value {
    t.map_or(Value::Null, |t| rfc3339(t).into())
}

fn unix(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// The held bundle, read (`None`: none held yet).
fn held_bundle(r: &FederationRelationship) -> Option<Result<SpiffeBundle, String>> {
    (!r.bundle_document.is_empty()).then(|| {
        SpiffeBundle::parse(&r.bundle_document).map_err(|e| format!("the held bundle: {e}"))
    })
}

/// The held bundle's lines of `show`: the sequence, each X.509 authority (subject CN, or its
/// fingerprint if it has none; notAfter; SHA-256) and each JWT authority (kid, kty).
fn bundle_summary(r: &FederationRelationship) -> Vec<String> {
    let b = match held_bundle(r) {
        None => return vec!["bundle:               none held yet".to_owned()],
        Some(Err(e)) => return vec![format!("bundle:               unreadable: {e}")],
        Some(Ok(b)) => b,
    };
    let mut out = vec![format!(
        "bundle:               {} X.509 authorit{}, {} JWT authorit{}, sequence {}{}",
        b.x509_authorities.len(),
        if b.x509_authorities.len() == 1 {
            "y"
        } else {
            "ies"
        },
        b.jwt_authorities.len(),
        if b.jwt_authorities.len() == 1 {
            "y"
        } else {
            "ies"
        },
        b.sequence
            .map_or_else(|| "none".to_owned(), |s| s.to_string()),
        b.refresh_hint
            .map_or_else(String::new, |h| format!(", refresh hint {}s", h.as_secs())),
    )];
    for c in &b.x509_authorities {
        let sha = fingerprint(c.der());
        out.push(format!(
            "  x509  {}  not after {}  SHA-256 {sha}",
            c.common_name()
                .map_or_else(|| sha.clone(), |cn| format!("CN={cn}")),
            rfc3339(unix(c.not_after())),
        ));
    }
    for j in &b.jwt_authorities {
        out.push(format!(
            "  jwt   kid={}  kty={}",
            j.key_id,
            j.jwk.get("kty").and_then(Value::as_str).unwrap_or("?")
        ));
    }
    out
}

/// `show`'s text: every field, then the held bundle.
fn show_text(r: &FederationRelationship) -> String {
    let none = || "-".to_owned();
    let mut lines = vec![
        format!("trust domain:         {}", r.trust_domain),
        format!("profile:              {}", r.profile),
        format!(
            "bundle endpoint:      {}",
            r.bundle_endpoint_url.clone().unwrap_or_else(none)
        ),
        format!(
            "endpoint SPIFFE ID:   {}",
            r.endpoint_spiffe_id.clone().unwrap_or_else(none)
        ),
        format!("created:              {}", rfc3339(r.created_at)),
        format!("federating entries:   {}", r.federating_entries),
        format!(
            "sequence:             {}",
            r.sequence.map_or_else(none, |s| s.to_string())
        ),
        format!(
            "bundle updated:       {}",
            time_or_never(r.bundle_updated_at)
        ),
        format!("last success:         {}", time_or_never(r.last_success_at)),
        format!("last attempt:         {}", time_or_never(r.last_attempt_at)),
        format!(
            "next refresh:         {}",
            r.next_refresh_at.map_or_else(none, rfc3339)
        ),
        format!(
            "last error:           {}",
            r.last_error.as_deref().unwrap_or("none")
        ),
        format!("consecutive failures: {}", r.consecutive_failures),
    ];
    lines.extend(bundle_summary(r));
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

/// `show --json` (and one line of `list --json`): every field, times RFC 3339 or null, the
/// held bundle as its document object (null: none held; with `bundle_error` if it does not
/// read as a SPIFFE bundle).
fn relationship_json(r: &FederationRelationship) -> Value {
    let (document, error) = match held_bundle(r) {
        None => (Value::Null, None),
        Some(read) => {
            let doc = serde_json::from_slice::<Value>(&r.bundle_document).unwrap_or_else(|_| {
                Value::from(String::from_utf8_lossy(&r.bundle_document).into_owned())
            });
            (doc, read.err())
        }
    };
    let mut v = json!({
        "trust_domain": r.trust_domain.to_string(),
        "profile": r.profile.as_str(),
        "bundle_endpoint_url": r.bundle_endpoint_url,
        "endpoint_spiffe_id": r.endpoint_spiffe_id,
        "created_at": rfc3339(r.created_at),
        "sequence": r.sequence,
        "bundle_updated_at": time_or_null(r.bundle_updated_at),
        "last_success_at": time_or_null(r.last_success_at),
        "last_attempt_at": time_or_null(r.last_attempt_at),
        "next_refresh_at": time_or_null(r.next_refresh_at),
        "last_error": r.last_error,
        "consecutive_failures": r.consecutive_failures,
        "federating_entries": r.federating_entries,
        "bundle_document": document,
    });
    if let (Some(e), Some(obj)) = (error, v.as_object_mut()) {
        obj.insert("bundle_error".into(), e.into());
    }
    v
}

/// Longest error `list` shows in full.
const ERROR_WIDTH: usize = 48;

fn truncated(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_owned();
    }
    let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// `list`'s table.
fn list_table(rs: &[FederationRelationship]) -> String {
    let mut out = format!(
        "{:<28} {:<12} {:<40} {:>12} {:<20} {:<20} {}\n",
        "TRUST DOMAIN", "PROFILE", "ENDPOINT", "SEQUENCE", "UPDATED", "LAST SUCCESS", "ERROR"
    );
    for r in rs {
        let line = format!(
            "{:<28} {:<12} {:<40} {:>12} {:<20} {:<20} {}",
            r.trust_domain.to_string(),
            r.profile.as_str(),
            r.bundle_endpoint_url.as_deref().unwrap_or("-"),
            r.sequence.map_or_else(|| "-".to_owned(), |s| s.to_string()),
            time_or_never(r.bundle_updated_at),
            time_or_never(r.last_success_at),
            r.last_error
                .as_deref()
                .map_or_else(|| "-".to_owned(), |e| truncated(e, ERROR_WIDTH)),
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn print_relationship(r: &FederationRelationship, json: bool) {
    if json {
        println!("{}", relationship_json(r));
    } else {
        print!("{}", show_text(r));
    }
}

/// `refresh`'s outcome line, and whether the fetch succeeded.
fn refresh_outcome(r: &FederationRelationship) -> (String, bool) {
    match &r.last_error {
        None => (
            format!(
                "refreshed: sequence {}",
                r.sequence
                    .map_or_else(|| "none".to_owned(), |s| s.to_string())
            ),
            true,
        ),
        Some(e) => (format!("refresh failed, bundle held kept: {e}"), false),
    }
}

pub async fn federation(socket: &Path, cmd: FederationCmd) -> anyhow::Result<ExitCode> {
    // Read the bundle file before connecting: a typo fails without a round trip.
    let bundle = match &cmd {
        FederationCmd::Create(CreateArgs {
            bundle_file: Some(p),
            ..
        })
        | FederationCmd::SetBundle { bundle_file: p, .. } => read_bundle_file(p)?,
        _ => Vec::new(),
    };
    let create = match &cmd {
        FederationCmd::Create(a) => Some(a.request(bundle.clone())?),
        _ => None,
    };
    let c = client(socket).await?;
    match cmd {
        FederationCmd::Create(a) => {
            let req = create.ok_or_else(|| anyhow!("no request"))?;
            let r = c
                .create(&req)
                .await
                .map_err(|e| call_err("federation create", &e))?;
            print_relationship(&r, a.json);
        }
        FederationCmd::List { json } => {
            let rs = c
                .list()
                .await
                .map_err(|e| call_err("federation list", &e))?;
            if json {
                for r in &rs {
                    println!("{}", relationship_json(r));
                }
            } else {
                print!("{}", list_table(&rs));
            }
        }
        FederationCmd::Show {
            trust_domain,
            json,
            bundle,
        } => {
            let r = c
                .get(&trust_domain)
                .await
                .map_err(|e| call_err("federation show", &e))?;
            if bundle {
                if r.bundle_document.is_empty() {
                    bail!("{}: no bundle held yet", r.trust_domain);
                }
                let doc = String::from_utf8_lossy(&r.bundle_document);
                print!("{doc}");
                if !doc.ends_with('\n') {
                    println!();
                }
            } else {
                print_relationship(&r, json);
            }
        }
        FederationCmd::Delete { trust_domain } => {
            c.delete(&trust_domain)
                .await
                .map_err(|e| call_err("federation delete", &e))?;
            println!("deleted {trust_domain}");
        }
        FederationCmd::Refresh { trust_domain } => {
            let r = c
                .refresh(&trust_domain)
                .await
                .map_err(|e| call_err("federation refresh", &e))?;
            let (line, ok) = refresh_outcome(&r);
            if !ok {
                eprintln!("{line}");
                return Ok(ExitCode::FAILURE);
            }
            println!("{line}");
        }
        FederationCmd::SetBundle { trust_domain, .. } => {
            let r = c
                .set_bundle(&trust_domain, bundle)
                .await
                .map_err(|e| call_err("federation set-bundle", &e))?;
            print_relationship(&r, false);
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;
    use signet_pki::{JwtAuthority, ParsedCert};

    use super::*;
    use crate::{Cli, Cmd};

    /// A self-signed CA certificate (EC P-256) for `spiffe://partner.example`, CN "Partner Root
    /// CA", valid until 2036-12-03T22:47:01Z. Made once with openssl; its key was discarded
    /// (signetctl has no rcgen, and a fixed certificate makes the rendering exact).
    const PARTNER_ROOT: &str = "-----BEGIN CERTIFICATE-----
MIIB5TCCAYqgAwIBAgIUJBTWHE4xQUxfea0JZNat4EGWhaIwCgYIKoZIzj0EAwIw
LDEQMA4GA1UECgwHUGFydG5lcjEYMBYGA1UEAwwPUGFydG5lciBSb290IENBMB4X
DTI2MTIwNjIyNDcwMVoXDTM2MTIwMzIyNDcwMVowLDEQMA4GA1UECgwHUGFydG5l
cjEYMBYGA1UEAwwPUGFydG5lciBSb290IENBMFkwEwYHKoZIzj0CAQYIKoZIzj0D
AQcDQgAEXOw73WtUX5Cb6TL/6PHfr5DFdvAP3FepTtVgMuUFb2S4Sl7S4yFGxasS
3tD2Q/jSnXsGjHqsSUUlyt2pVBB8AaOBiTCBhjAdBgNVHQ4EFgQUOwS5PwXzwt2B
Jy36Nur54oYy7lcwHwYDVR0jBBgwFoAUOwS5PwXzwt2BJy36Nur54oYy7lcwDwYD
VR0TAQH/BAUwAwEB/zAOBgNVHQ8BAf8EBAMCAQYwIwYDVR0RBBwwGoYYc3BpZmZl
Oi8vcGFydG5lci5leGFtcGxlMAoGCCqGSM49BAMCA0kAMEYCIQCmYRt9OaSrDeFu
Rr361XBSL4NIXOZF3n3Il6hP9HxlFAIhAJ7Wpc07lParkfcMP6VY4zC4O+ew26Do
f0ftjMdWO1do
-----END CERTIFICATE-----
";
    const PARTNER_ROOT_SHA256: &str = "36:06:22:00:85:17:6E:BC:9C:E2:8D:56:7B:FC:8B:99:06:8D:92:01:A0:CD:8C:5B:DD:7C:4A:20:36:4A:85:81";

    fn document() -> Vec<u8> {
        let mut jwk = serde_json::Map::new();
        jwk.insert("kty".into(), "OKP".into());
        jwk.insert("crv".into(), "Ed25519".into());
        jwk.insert(
            "x".into(),
            "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo".into(),
        );
        let b = SpiffeBundle {
            x509_authorities: vec![ParsedCert::from_pem_first(PARTNER_ROOT.as_bytes()).unwrap()],
            jwt_authorities: vec![JwtAuthority {
                key_id: "partner-jwt-1".into(),
                jwk,
            }],
            sequence: Some(42),
            refresh_hint: Some(std::time::Duration::from_secs(300)),
        };
        serde_json::to_vec(&b.to_json().unwrap()).unwrap()
    }

    fn relationship() -> FederationRelationship {
        FederationRelationship {
            trust_domain: "partner.example".parse().unwrap(),
            bundle_endpoint_url: Some("https://partner.example/bundle".into()),
            profile: FederationProfile::HttpsSpiffe,
            endpoint_spiffe_id: Some("spiffe://partner.example/bundle-endpoint".into()),
            created_at: 1_764_000_000,
            bundle_document: document(),
            sequence: Some(42),
            bundle_updated_at: Some(1_764_000_100),
            last_success_at: Some(1_764_000_200),
            last_attempt_at: Some(1_764_000_300),
            next_refresh_at: Some(1_764_000_600),
            last_error: None,
            consecutive_failures: 0,
            federating_entries: 3,
        }
    }

    fn parse(args: &[&str]) -> Result<FederationCmd, clap::Error> {
        let cli = Cli::try_parse_from(["signetctl", "federation"].iter().chain(args))?;
        let Cmd::Federation { cmd } = cli.cmd else {
            panic!("not federation: {args:?}")
        };
        Ok(cmd)
    }

    fn create(args: &[&str]) -> anyhow::Result<NewRelationship> {
        let mut all = vec!["create"];
        all.extend_from_slice(args);
        let FederationCmd::Create(a) = parse(&all)? else {
            panic!("not create")
        };
        a.request(b"bundle".to_vec())
    }

    #[test]
    fn create_takes_an_endpoint_with_a_fetching_profile_or_is_static() {
        let r = create(&[
            "--trust-domain",
            "spiffe://partner.example",
            "--bundle-endpoint-url",
            "https://partner.example/bundle",
            "--profile",
            "https_spiffe",
            "--endpoint-spiffe-id",
            "spiffe://partner.example/ep",
            "--bundle-file",
            "ca.pem",
        ])
        .unwrap();
        assert_eq!(r.trust_domain, "spiffe://partner.example");
        assert_eq!(r.profile, Some(FederationProfile::HttpsSpiffe));
        assert_eq!(
            r.endpoint_spiffe_id.as_deref(),
            Some("spiffe://partner.example/ep")
        );
        assert_eq!(r.bundle, b"bundle");
        let r = create(&[
            "--trust-domain",
            "partner.example",
            "--bundle-endpoint-url",
            "https://partner.example/bundle",
            "--profile",
            "https_web",
        ])
        .unwrap();
        assert_eq!(r.profile, Some(FederationProfile::HttpsWeb));
        for static_args in [
            &["--trust-domain", "p.example", "--bundle-file", "-"][..],
            &[
                "--trust-domain",
                "p.example",
                "--profile",
                "static",
                "--bundle-file",
                "b.json",
            ],
        ] {
            let r = create(static_args).unwrap();
            assert_eq!(r.bundle_endpoint_url, None);
            assert!(matches!(r.profile, None | Some(FederationProfile::Static)));
        }
        // Refused: an endpoint without a profile, with `static`; a fetching profile without
        // an endpoint; an endpoint ID without an endpoint; an unknown profile; no trust domain.
        for bad in [
            &[
                "--trust-domain",
                "p.example",
                "--bundle-endpoint-url",
                "https://p/b",
            ][..],
            &[
                "--trust-domain",
                "p.example",
                "--bundle-endpoint-url",
                "https://p/b",
                "--profile",
                "static",
            ],
            &["--trust-domain", "p.example", "--profile", "https_web"],
            &[
                "--trust-domain",
                "p.example",
                "--endpoint-spiffe-id",
                "spiffe://p.example/e",
            ],
            &[
                "--trust-domain",
                "p.example",
                "--bundle-endpoint-url",
                "https://p/b",
                "--profile",
                "https-web",
            ],
            &["--bundle-file", "b.json"],
        ] {
            assert!(create(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_other_subcommands_parse() {
        assert!(matches!(
            parse(&["list", "--json"]).unwrap(),
            FederationCmd::List { json: true }
        ));
        assert!(matches!(
            parse(&["show", "spiffe://partner.example", "--bundle"]).unwrap(),
            FederationCmd::Show { trust_domain, json: false, bundle: true }
                if trust_domain == "spiffe://partner.example"
        ));
        assert!(parse(&["show", "p.example", "--bundle", "--json"]).is_err());
        assert!(parse(&["show"]).is_err());
        assert!(matches!(
            parse(&["delete", "p.example"]).unwrap(),
            FederationCmd::Delete { trust_domain } if trust_domain == "p.example"
        ));
        assert!(matches!(
            parse(&["refresh", "p.example"]).unwrap(),
            FederationCmd::Refresh { trust_domain } if trust_domain == "p.example"
        ));
        assert!(matches!(
            parse(&["set-bundle", "p.example", "--bundle-file", "-"]).unwrap(),
            FederationCmd::SetBundle { trust_domain, bundle_file }
                if trust_domain == "p.example" && bundle_file == Path::new("-")
        ));
        assert!(parse(&["set-bundle", "p.example"]).is_err());
    }

    #[test]
    fn show_names_every_field_and_summarises_the_held_bundle() {
        let text = show_text(&relationship());
        for want in [
            "trust domain:         partner.example\n",
            "profile:              https_spiffe\n",
            "bundle endpoint:      https://partner.example/bundle\n",
            "endpoint SPIFFE ID:   spiffe://partner.example/bundle-endpoint\n",
            "created:              2025-11-24T16:00:00Z\n",
            "federating entries:   3\n",
            "sequence:             42\n",
            "bundle updated:       2025-11-24T16:01:40Z\n",
            "last success:         2025-11-24T16:03:20Z\n",
            "last attempt:         2025-11-24T16:05:00Z\n",
            "next refresh:         2025-11-24T16:10:00Z\n",
            "last error:           none\n",
            "consecutive failures: 0\n",
            "bundle:               1 X.509 authority, 1 JWT authority, sequence 42, refresh hint 300s\n",
            "  jwt   kid=partner-jwt-1  kty=OKP\n",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        let x509 = format!(
            "  x509  CN=Partner Root CA  not after 2036-12-03T22:47:01Z  SHA-256 {PARTNER_ROOT_SHA256}\n"
        );
        assert!(text.contains(&x509), "{x509:?} not in\n{text}");

        let never = show_text(&FederationRelationship {
            bundle_endpoint_url: None,
            endpoint_spiffe_id: None,
            profile: FederationProfile::Static,
            bundle_document: vec![],
            sequence: None,
            bundle_updated_at: None,
            last_success_at: None,
            last_attempt_at: None,
            next_refresh_at: None,
            last_error: Some("x".into()),
            ..relationship()
        });
        for want in [
            "bundle endpoint:      -\n",
            "bundle updated:       never\n",
            "last success:         never\n",
            "next refresh:         -\n",
            "last error:           x\n",
            "bundle:               none held yet\n",
        ] {
            assert!(never.contains(want), "{want:?} not in\n{never}");
        }
        let bad = show_text(&FederationRelationship {
            bundle_document: b"{}".to_vec(),
            ..relationship()
        });
        assert!(bad.contains("bundle:               unreadable: "), "{bad}");
    }

    #[test]
    fn the_json_has_every_field_and_the_document_as_an_object() {
        let r = relationship();
        let v = relationship_json(&r);
        let doc: Value = serde_json::from_slice(&r.bundle_document).unwrap();
        assert_eq!(
            v,
            json!({
                "trust_domain": "partner.example",
                "profile": "https_spiffe",
                "bundle_endpoint_url": "https://partner.example/bundle",
                "endpoint_spiffe_id": "spiffe://partner.example/bundle-endpoint",
                "created_at": "2025-11-24T16:00:00Z",
                "sequence": 42,
                "bundle_updated_at": "2025-11-24T16:01:40Z",
                "last_success_at": "2025-11-24T16:03:20Z",
                "last_attempt_at": "2025-11-24T16:05:00Z",
                "next_refresh_at": "2025-11-24T16:10:00Z",
                "last_error": null,
                "consecutive_failures": 0,
                "federating_entries": 3,
                "bundle_document": doc,
            })
        );
        assert_eq!(v["bundle_document"]["spiffe_sequence"], 42);
        assert_eq!(v["bundle_document"]["keys"][1]["kid"], "partner-jwt-1");
        let empty = relationship_json(&FederationRelationship {
            bundle_document: vec![],
            sequence: None,
            last_success_at: None,
            last_error: Some("refused".into()),
            ..relationship()
        });
        assert_eq!(empty["bundle_document"], Value::Null);
        assert_eq!(empty["sequence"], Value::Null);
        assert_eq!(empty["last_success_at"], Value::Null);
        assert_eq!(empty["last_error"], "refused");
        assert!(empty.get("bundle_error").is_none());
        let bad = relationship_json(&FederationRelationship {
            bundle_document: br#"{"keys":"no"}"#.to_vec(),
            ..relationship()
        });
        assert_eq!(bad["bundle_document"], json!({"keys": "no"}));
        assert!(
            bad["bundle_error"].as_str().unwrap().contains("keys"),
            "{bad}"
        );
    }

    #[test]
    fn list_is_a_table_with_long_errors_truncated() {
        let long = "x".repeat(200);
        let rs = [
            relationship(),
            FederationRelationship {
                trust_domain: "static.example".parse().unwrap(),
                bundle_endpoint_url: None,
                profile: FederationProfile::Static,
                sequence: None,
                bundle_updated_at: None,
                last_success_at: None,
                last_error: Some(long.clone()),
                ..relationship()
            },
        ];
        let t = list_table(&rs);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        for col in [
            "TRUST DOMAIN",
            "PROFILE",
            "ENDPOINT",
            "SEQUENCE",
            "UPDATED",
            "LAST SUCCESS",
            "ERROR",
        ] {
            assert!(lines[0].contains(col), "{col}");
        }
        for want in [
            "partner.example",
            "https_spiffe",
            "https://partner.example/bundle",
            " 42 ",
            "2025-11-24T16:01:40Z",
            "2025-11-24T16:03:20Z",
        ] {
            assert!(lines[1].contains(want), "{want:?} not in {:?}", lines[1]);
        }
        assert!(lines[1].ends_with(" -"), "{:?}", lines[1]);
        assert!(lines[2].starts_with("static.example "), "{:?}", lines[2]);
        assert!(lines[2].contains(" never "), "{:?}", lines[2]);
        let shown = format!("{}…", "x".repeat(ERROR_WIDTH - 1));
        assert!(lines[2].ends_with(&shown), "{:?}", lines[2]);
        assert!(!lines[2].contains(&long));
    }

    #[test]
    fn refresh_reports_its_outcome() {
        assert_eq!(
            refresh_outcome(&relationship()),
            ("refreshed: sequence 42".to_owned(), true)
        );
        assert_eq!(
            refresh_outcome(&FederationRelationship {
                last_error: Some("tls: unknown issuer".into()),
                ..relationship()
            }),
            (
                "refresh failed, bundle held kept: tls: unknown issuer".to_owned(),
                false
            )
        );
    }
}
