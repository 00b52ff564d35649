//! Generated gRPC code for Signet's protocols. Nothing here is hand-written but re-exports.
#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub mod signet {
    pub mod ca {
        pub mod v1 {
            tonic::include_proto!("signet.ca.v1");
        }
    }
    pub mod agent {
        pub mod v1 {
            tonic::include_proto!("signet.agent.v1");
        }
    }
    pub mod admin {
        pub mod v1 {
            tonic::include_proto!("signet.admin.v1");
        }
    }
}

pub mod istio {
    pub mod v1 {
        pub mod auth {
            tonic::include_proto!("istio.v1.auth");
        }
    }
}

/// The SPIFFE Workload API. Its proto has no package, so prost names the file `_`.
pub mod workload {
    tonic::include_proto!("_");
}

/// The subset of Envoy's xDS API behind the agent's Secret Discovery Service (see
/// `proto/envoy/README.md`). Module paths follow the proto packages, as prost's generated
/// code refers to its neighbours by them.
pub mod envoy {
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
    pub mod service {
        pub mod discovery {
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
        pub mod secret {
            pub mod v3 {
                tonic::include_proto!("envoy.service.secret.v3");
            }
        }
    }
    pub mod extensions {
        pub mod transport_sockets {
            pub mod tls {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.transport_sockets.tls.v3");
                }
            }
        }
    }
}

/// `google.rpc.Status`, as xDS clients put it in a NACK.
pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

pub use istio::v1::auth as istio_ca;
pub use signet::admin::v1 as admin;
pub use signet::agent::v1 as agent;
pub use signet::ca::v1 as ca;

/// The encoded `FileDescriptorSet` of all of the above, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("signet_descriptor");
