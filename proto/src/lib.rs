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

pub use istio::v1::auth as istio_ca;
pub use signet::admin::v1 as admin;
pub use signet::agent::v1 as agent;
pub use signet::ca::v1 as ca;

/// The encoded `FileDescriptorSet` of all of the above, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("signet_descriptor");
