#!/usr/bin/env python3
"""A Kubernetes-style service-account signing key for the benchmarks: writes DIR/jwks.json
(the public key, for [auth.kubernetes] jwks_file) and DIR/token (a projected token for
system:serviceaccount:bench:client, audience istio-ca, valid for a day), signed ES256.

    scripts/sa_token.py DIR          (needs python3 with `cryptography`)
"""
import base64
import json
import sys
import time

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

ISSUER = "https://kubernetes.default.svc.cluster.local"


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    key = ec.generate_private_key(ec.SECP256R1())
    n = key.public_key().public_numbers()
    jwk = {"kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": "bench",
           "x": b64(n.x.to_bytes(32, "big")), "y": b64(n.y.to_bytes(32, "big"))}
    with open(f"{out}/jwks.json", "w") as f:
        f.write(json.dumps({"keys": [jwk]}))
    now = int(time.time())
    claims = {
        "iss": ISSUER, "sub": "system:serviceaccount:bench:client", "aud": ["istio-ca"],
        "iat": now, "nbf": now, "exp": now + 86400,
        "kubernetes.io": {
            "namespace": "bench",
            "serviceaccount": {"name": "client", "uid": "8e5f6b8c-1f2e-4d2a-9a53-0c7d1e2f3a4b"},
            "pod": {"name": "client-7d9f8b6c5-x2k4q", "uid": "3c1d2e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"},
        },
    }
    header = {"alg": "ES256", "typ": "JWT", "kid": "bench"}
    signing = b64(json.dumps(header).encode()) + "." + b64(json.dumps(claims).encode())
    r, s = decode_dss_signature(key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
    with open(f"{out}/token", "w") as f:
        f.write(signing + "." + b64(r.to_bytes(32, "big") + s.to_bytes(32, "big")) + "\n")


if __name__ == "__main__":
    main()
