//! Compiles the `.proto` files with protox (a protobuf compiler in Rust, so no `protoc` is
//! needed) and generates tonic/prost code, plus file descriptor sets for gRPC reflection (ours, Istio's and the
//! Workload API's in one; Envoy's SDS in another).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/signet/ca/v1/ca.proto",
        "proto/signet/ca/v1/registration.proto",
        "proto/signet/admin/v1/admin.proto",
        "proto/signet/admin/v1/ledger_admin.proto",
        "proto/signet/admin/v1/revocation_admin.proto",
        "proto/signet/admin/v1/ca_admin.proto",
        "proto/signet/admin/v1/federation_admin.proto",
        "proto/istio/ca.proto",
        "proto/signet/agent/v1/agent.proto",
        "proto/spiffe/workload.proto",
    ];
    // Envoy's SDS, generated with small codec buffers (see `SmallBufferCodec` in lib.rs).
    let envoy = [
        "proto/envoy/service/secret/v3/sds.proto",
        "proto/envoy/extensions/transport_sockets/tls/v3/tls.proto",
    ];
    for f in files.iter().chain(&envoy) {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rerun-if-changed=proto/envoy");
    println!("cargo:rerun-if-changed=proto/google");
    let fds = protox::compile(files, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out.join("signet_descriptor.bin");
    std::fs::write(&descriptor_path, prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .file_descriptor_set_path(&descriptor_path)
        .skip_protoc_run()
        .compile_fds(fds)?;
    let envoy_fds = protox::compile(envoy, ["proto"])?;
    std::fs::write(
        out.join("envoy_descriptor.bin"),
        prost::Message::encode_to_vec(&envoy_fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::SmallBufferCodec")
        .skip_protoc_run()
        .compile_fds(envoy_fds)?;
    Ok(())
}
