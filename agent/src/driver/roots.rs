//! The trust bundles the loop works with: the roots it trusts for the server's TLS certificate
//! (the configured `trust_bundle_file` and the bundle received at attestation), the roots it
//! serves to workloads (the newest bundle from the server, persisted in `data_dir`; before
//! there is one, the bootstrap file), and what it does with each bundle the server streams
//! (roots first, then the taints and CRLs, which may be signed by a root new in that bundle).
//! The server roots follow each new bundle and each change of the file (checked at each entry
//! sync) into the open connection ([`super::Connector::roots_changed`]).
//!
//! Invariant: a bundle for another trust domain changes nothing ([`crate::bundle::decide`]);
//! what is accepted is served even when it cannot be persisted.

use std::time::SystemTime;

use super::node::NodeError;
use super::{Driver, Serving};
use crate::bundle::Decision;
use crate::ca::TrustBundle;
use crate::node;

impl Driver {
    /// The PEM roots trusted for the server's TLS certificate: the configured file and the
    /// bundle received at attestation.
    pub(super) fn server_roots(&self) -> Result<(Vec<Vec<u8>>, String), NodeError> {
        let mut roots = node::load_bundle(&self.settings.data_dir);
        if let Some(f) = &self.settings.trust_bundle_file {
            let pem = std::fs::read(f).map_err(|source| NodeError::BundleFile {
                path: f.clone(),
                source,
            })?;
            let certs =
                signet_types::pem::parse_certs(&pem).map_err(|source| NodeError::BundlePem {
                    path: f.clone(),
                    source,
                })?;
            for c in certs {
                if !roots.contains(&c) {
                    roots.push(c);
                }
            }
        }
        if roots.is_empty() {
            return Err(NodeError::NoServerRoots);
        }
        let pem = signet_types::pem::certs_to_pem(roots.iter().map(Vec::as_slice));
        Ok((roots, pem))
    }

    /// Hands the current server roots to the connector, so the open connection's next
    /// handshake (a reconnection after the server restarted or renewed its certificate under
    /// a new root) verifies against them.
    pub(super) fn refresh_server_roots(&self) {
        match self.server_roots() {
            Ok((_, pem)) => self.connector.roots_changed(pem.as_bytes()),
            Err(e) => tracing::warn!(error = %e, "keeping the previous server roots"),
        }
    }

    /// The roots served to workloads: the newest bundle from the server (kept in `data_dir`
    /// since attestation and updated from its bundle stream), or, before there is one, the
    /// bootstrap `trust_bundle_file`.
    pub(super) fn served_bundle(&self) -> Vec<Vec<u8>> {
        let from_server = node::load_bundle(&self.settings.data_dir);
        if !from_server.is_empty() {
            return from_server;
        }
        self.server_roots().map(|(r, _)| r).unwrap_or_default()
    }

    /// Before the server sent a bundle, the bootstrap file may have been updated: serve what
    /// is current. Returns whether it changed.
    pub(super) fn refresh_served_bundle(&mut self, s: &mut Serving) -> bool {
        let b = self.served_bundle();
        if b.is_empty() || b == s.bundle {
            return false;
        }
        s.bundle = b;
        self.trust.set_bundle(s.td.clone(), s.bundle.clone());
        true
    }

    /// Applies the taints and CRLs of a bundle from the server; persists the CRLs when what is
    /// in force changed. Returns whether it changed.
    fn apply_revocations(&mut self, b: &TrustBundle) -> bool {
        if !self.trust.set_revocations(&b.tainted_key_ids, &b.crls) {
            return false;
        }
        let crls = self.trust.revocations().crls_der();
        if let Err(e) = node::save_crls(&self.settings.data_dir, &crls) {
            tracing::error!(error = %e, "cannot persist the CRLs; serving them anyway");
        }
        true
    }

    /// Serves and persists `roots`, a new bundle from the server.
    fn replace_bundle(&mut self, td: &str, roots: Vec<Vec<u8>>) {
        if let Err(e) = node::save_bundle(&self.settings.data_dir, &roots) {
            tracing::error!(error = %e, "cannot persist the new trust bundle; serving it anyway");
        }
        self.trust.set_bundle(td.to_owned(), roots);
        self.refresh_server_roots();
    }

    /// A bundle from the server's stream, received at `now`: new roots are served and
    /// persisted, then its taints and CRLs applied; either reruns the rotator at once (and
    /// makes a compromised node SVID due through the schedule).
    pub(super) fn bundle_received(&mut self, s: &mut Serving, b: TrustBundle, now: SystemTime) {
        tracing::debug!(revision = b.revision, "trust bundle from the server");
        s.watch.succeeded();
        let decision = crate::bundle::decide(&s.trust_domain, &s.bundle, &b);
        let accepted = !matches!(decision, Decision::Reject(_));
        match decision {
            Decision::Unchanged => {}
            Decision::Replace(roots) => {
                tracing::info!(
                    revision = b.revision,
                    roots = roots.len(),
                    "new trust bundle from the server"
                );
                s.bundle = roots.clone();
                self.replace_bundle(&s.td, roots);
                s.schedule.rotate_now(now);
            }
            Decision::Reject(why) => {
                tracing::warn!(reason = %why, "ignoring a trust bundle")
            }
        }
        // After the roots: a CRL of a root new in this bundle verifies with it.
        if accepted && self.apply_revocations(&b) {
            s.schedule.rotate_now(now);
        }
        // The JWT keys (and their taints) reach the Workload API on that pass.
        if accepted && self.trust.set_jwt_keys(&b.jwt_keys, &b.tainted_jwt_key_ids) {
            s.schedule.rotate_now(now);
        }
    }
}
