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

/// The codec of the agent's SDS service: tonic's prost codec with 1 KiB starting buffers
/// instead of 8 KiB. An SDS stream lives as long as its Envoy and holds one read and one write
/// buffer all that time, while its requests are a few hundred bytes and its responses a few
/// KiB (the buffers grow to what a message needs): with a thousand open streams the default
/// buffers alone were 16 MB of the agent's memory (bench-sds, massif).
#[derive(Debug, Clone)]
pub struct SmallBufferCodec<T, U>(std::marker::PhantomData<(T, U)>);

impl<T, U> Default for SmallBufferCodec<T, U> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

/// [`SmallBufferCodec`]'s buffers: 1 KiB to start, tonic's default yield threshold (32 KiB).
fn small_buffers() -> tonic::codec::BufferSettings {
    tonic::codec::BufferSettings::new(1024, 32 * 1024)
}

impl<T, U> tonic::codec::Codec for SmallBufferCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <tonic_prost::ProstCodec<T, U> as tonic::codec::Codec>::Encoder;
    type Decoder = <tonic_prost::ProstCodec<T, U> as tonic::codec::Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstCodec::<T, U>::raw_encoder(small_buffers())
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstCodec::<T, U>::raw_decoder(small_buffers())
    }
}

/// The encoded `FileDescriptorSet` of Signet's, Istio's and the Workload API's protocols, for gRPC
/// reflection (Envoy's SDS is in [`ENVOY_FILE_DESCRIPTOR_SET`]). A listener's reflection should
/// describe only what it serves: see [`descriptors_for`].
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("signet_descriptor");

/// The encoded `FileDescriptorSet` of the Envoy SDS subset (and the files it imports).
pub const ENVOY_FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("envoy_descriptor");

/// A service name [`descriptors_for`] was asked for that no compiled file defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownService(pub String);

impl std::fmt::Display for UnknownService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no compiled proto file defines the gRPC service {:?}",
            self.0
        )
    }
}

impl std::error::Error for UnknownService {}

/// The file descriptors gRPC reflection needs to list and describe exactly `services` (their
/// fully-qualified names, e.g. `signet.ca.v1.CertificateAuthority`, or `SpiffeWorkloadAPI` for
/// the package-less Workload API): the files that define them and every file those import,
/// from [`FILE_DESCRIPTOR_SET`] and [`ENVOY_FILE_DESCRIPTOR_SET`], and nothing else. So a
/// listener's reflection never names or describes a service served on another listener.
pub fn descriptors_for(
    services: &[&str],
) -> Result<prost_types::FileDescriptorSet, UnknownService> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut files: BTreeMap<String, prost_types::FileDescriptorProto> = BTreeMap::new();
    for encoded in [FILE_DESCRIPTOR_SET, ENVOY_FILE_DESCRIPTOR_SET] {
        // Both sets are written by build.rs from protox's output: they always decode.
        let set =
            <prost_types::FileDescriptorSet as prost::Message>::decode(encoded).unwrap_or_default();
        for f in set.file {
            files.entry(f.name().to_owned()).or_insert(f);
        }
    }
    let full_name = |f: &prost_types::FileDescriptorProto,
                     s: &prost_types::ServiceDescriptorProto| {
        match f.package() {
            "" => s.name().to_owned(),
            p => format!("{p}.{}", s.name()),
        }
    };
    let mut wanted: Vec<String> = Vec::new();
    for name in services {
        let file = files
            .values()
            .find(|f| f.service.iter().any(|s| full_name(f, s) == *name))
            .ok_or_else(|| UnknownService((*name).to_owned()))?;
        wanted.push(file.name().to_owned());
    }
    let mut keep: BTreeSet<String> = BTreeSet::new();
    while let Some(name) = wanted.pop() {
        if let Some(f) = files.get(&name)
            && keep.insert(name)
        {
            wanted.extend(f.dependency.iter().cloned());
        }
    }
    Ok(prost_types::FileDescriptorSet {
        file: files
            .into_values()
            .filter(|f| keep.contains(f.name()))
            .collect(),
    })
}
