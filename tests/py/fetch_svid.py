#!/usr/bin/env python3
"""Fetches the caller's X509-SVIDs and X.509 bundles from the SPIFFE Workload API with
py-spiffe (PyPI package `spiffe`), an independent client, and prints them as one JSON object:

    {"svids": [{"spiffe_id": ..., "chain_pem": [leaf, ...], "key_matches_leaf": bool}],
     "svid_bundles": {trust_domain: [root PEM, ...]},   # from FetchX509SVID
     "bundles": {trust_domain: [root PEM, ...]},        # from FetchX509Bundles
     "svid_crls": [DER hex, ...],                       # X509SVIDResponse.crl
     "bundle_crls": [DER hex, ...]}                     # X509BundlesResponse.crl

py-spiffe's typed API does not expose the CRL fields (SPIRE never fills them), so those two come
from the first message of each stream through py-spiffe's own generated Workload API stub, on
the same client (same channel, same security header).

The socket comes from SPIFFE_ENDPOINT_SOCKET (unix:///path), as for any SPIFFE workload.
Exits 2 with the error on stderr when the Workload API refuses or cannot be reached.

SIGNET_GRPC_DEFAULT_AUTHORITY, when set, is the HTTP/2 :authority gRPC sends (the channel
option grpc.default_authority, as `grpcurl -authority`). Without it, gRPC's C core (>= 1.57)
sends the percent-encoded socket path as :authority on a Unix socket; upstream h2 refuses that,
and Signet's patched h2 (vendor/h2/SIGNET-PATCH.md) serves it, so py-spiffe works unchanged.
"""

import json
import os
import sys

import grpc
from cryptography.hazmat.primitives import serialization
from spiffe import WorkloadApiClient
from spiffe._proto import workload_pb2

_AUTHORITY = os.environ.get("SIGNET_GRPC_DEFAULT_AUTHORITY")
if _AUTHORITY:
    _insecure_channel = grpc.insecure_channel

    def _channel_with_authority(target, options=None, compression=None):
        options = list(options or []) + [("grpc.default_authority", _AUTHORITY)]
        return _insecure_channel(target, options=options, compression=compression)

    # py-spiffe opens its channel with grpc.insecure_channel(target).
    grpc.insecure_channel = _channel_with_authority

TIMEOUT_SECONDS = 10.0


def pem(cert):
    return cert.public_bytes(serialization.Encoding.PEM).decode("ascii")


def public_der(key):
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def bundle_set_to_json(bundle_set):
    return {
        b.trust_domain.name: sorted(pem(c) for c in b.x509_authorities)
        for b in bundle_set.bundles
    }


def main():
    try:
        with WorkloadApiClient(default_timeout=TIMEOUT_SECONDS) as client:
            context = client.fetch_x509_context()
            bundles = client.fetch_x509_bundles()
            stub = client._spiffe_workload_api_stub
            svid_msg = next(
                stub.FetchX509SVID(workload_pb2.X509SVIDRequest(), timeout=TIMEOUT_SECONDS)
            )
            bundles_msg = next(
                stub.FetchX509Bundles(workload_pb2.X509BundlesRequest(), timeout=TIMEOUT_SECONDS)
            )
    except Exception as e:  # noqa: BLE001 - any failure is reported to the caller
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    out = {
        "svids": [
            {
                "spiffe_id": str(svid.spiffe_id),
                "chain_pem": [pem(c) for c in svid.cert_chain],
                "key_matches_leaf": public_der(svid.private_key.public_key())
                == public_der(svid.leaf.public_key()),
            }
            for svid in context.x509_svids
        ],
        "svid_bundles": bundle_set_to_json(context.x509_bundle_set),
        "bundles": bundle_set_to_json(bundles),
        "svid_crls": [c.hex() for c in svid_msg.crl],
        "bundle_crls": [c.hex() for c in bundles_msg.crl],
    }
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
