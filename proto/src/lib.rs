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
/// reflection (Envoy's SDS is not listed).
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("signet_descriptor");
