//! The Kubernetes bridge: maps cert-manager `Certificate` and `CertificateRequest` objects onto
//! Signet's gRPC calls. Built on kube-rs.
