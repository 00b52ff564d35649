# syntax=docker/dockerfile:1
# One image with all four binaries: signet-server, signet-agent, signet-k8s, signetctl.
# The manifests in deploy/ pick the binary with `command:`.
#
#   docker build -t registry.example.com/signet:0.1.0 .
#
# No protoc (protox compiles the .proto files), no cmake (ring, not aws-lc-rs), no database at
# build time (sqlx's runtime query API; migrations are embedded from migrations/). The server's
# allocator, jemalloc, builds from C with make and cc, both in the build image.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release \
        --bin signet-server --bin signet-agent --bin signet-k8s --bin signetctl \
 && mkdir -p /out \
 && cp target/release/signet-server target/release/signet-agent \
       target/release/signet-k8s target/release/signetctl /out/

# glibc and libgcc, nothing else: no shell, no package manager. Runs as uid/gid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/signet-server"]
