#!/usr/bin/env python3
"""The SPIFFE Workload API's JWT profile through py-spiffe (PyPI package `spiffe`), an
independent client; prints one JSON object. The socket comes from SPIFFE_ENDPOINT_SOCKET
(unix:///path); SIGNET_GRPC_DEFAULT_AUTHORITY as in fetch_svid.py.

    jwt_svid.py all AUDIENCE[,AUDIENCE...]
        {"fetched": {"spiffe_id", "token", "audience", "expiry"},   # fetch_jwt_svid
         "fetched_all": [spiffe_id, ...],                          # fetch_jwt_svids
         "bundles": {trust_domain: [kid, ...]},                    # fetch_jwt_bundles
         "parsed": spiffe_id,        # JwtSvid.parse_and_validate against the fetched bundle
         "validated": spiffe_id,     # validate_jwt_svid (the agent's ValidateJWTSVID)
         "source": {"spiffe_id", "kids"}}                          # JwtSource
    jwt_svid.py fetch AUDIENCE [SUBJECT]
        {"spiffe_id", "token", "kid"} or {"error"}
    jwt_svid.py attacks AUDIENCE FOREIGN_TOKEN
        {name: {"agent": error or null, "local": error or null}} for tokens that must be refused:
        "none" (alg none), "hs256" (HS256 keyed with the bundle key's PEM: alg confusion),
        "foreign" (FOREIGN_TOKEN, signed by a key not in the bundle), "tampered" (a valid
        token with its subject changed). null means it was accepted.
"""

import base64
import hashlib
import hmac
import json
import os
import sys

import grpc
from cryptography.hazmat.primitives import serialization
from spiffe import JwtSource, SpiffeId, WorkloadApiClient
from spiffe.svid.jwt_svid import JwtSvid

_AUTHORITY = os.environ.get("SIGNET_GRPC_DEFAULT_AUTHORITY")
if _AUTHORITY:
    _insecure_channel = grpc.insecure_channel

    def _channel_with_authority(target, options=None, compression=None):
        options = list(options or []) + [("grpc.default_authority", _AUTHORITY)]
        return _insecure_channel(target, options=options, compression=compression)

    grpc.insecure_channel = _channel_with_authority

TIMEOUT_SECONDS = 10.0


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def header_of(token):
    return json.loads(unb64(token.split(".")[0]))


def bundle_for(bundles, spiffe_id):
    return bundles.get_bundle_for_trust_domain(spiffe_id.trust_domain)


def cmd_all(client, audiences):
    svid = client.fetch_jwt_svid(audience=audiences)
    every = client.fetch_jwt_svids(audience=audiences)
    bundles = client.fetch_jwt_bundles()
    bundle = bundle_for(bundles, svid.spiffe_id)
    parsed = JwtSvid.parse_and_validate(svid.token, bundle, audiences)
    validated = client.validate_jwt_svid(svid.token, sorted(audiences)[0])
    socket = os.environ["SPIFFE_ENDPOINT_SOCKET"]
    with JwtSource(socket_path=socket, timeout_in_seconds=TIMEOUT_SECONDS) as source:
        from_source = source.fetch_svid(audience=audiences)
        source_bundle = source.get_bundle_for_trust_domain(from_source.spiffe_id.trust_domain)
        JwtSvid.parse_and_validate(from_source.token, source_bundle, audiences)
        source_kids = sorted(source_bundle.jwt_authorities.keys())
    return {
        "fetched": {
            "spiffe_id": str(svid.spiffe_id),
            "token": svid.token,
            "audience": sorted(svid.audience),
            "expiry": svid.expiry,
        },
        "fetched_all": [str(s.spiffe_id) for s in every],
        "bundles": {
            b.trust_domain.name: sorted(b.jwt_authorities.keys()) for b in bundles.bundles
        },
        "parsed": str(parsed.spiffe_id),
        "validated": str(validated.spiffe_id),
        "source": {"spiffe_id": str(from_source.spiffe_id), "kids": source_kids},
    }


def cmd_fetch(client, audience, subject):
    try:
        svid = client.fetch_jwt_svid(
            audience={audience}, subject=SpiffeId(subject) if subject else None
        )
    except Exception as e:  # the refusal is the result
        return {"error": str(e)}
    return {
        "spiffe_id": str(svid.spiffe_id),
        "token": svid.token,
        "kid": header_of(svid.token).get("kid"),
    }


def refusals(client, bundle, token, audience):
    out = {}
    try:
        client.validate_jwt_svid(token, audience)
        out["agent"] = None
    except Exception as e:
        out["agent"] = str(e)
    try:
        JwtSvid.parse_and_validate(token, bundle, {audience})
        out["local"] = None
    except Exception as e:
        out["local"] = str(e)
    return out


def cmd_attacks(client, audience, foreign):
    good = client.fetch_jwt_svid(audience={audience})
    bundle = bundle_for(client.fetch_jwt_bundles(), good.spiffe_id)
    kid = header_of(good.token)["kid"]
    payload = good.token.split(".")[1]
    key_pem = bundle.get_jwt_authority(kid).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    none = "{}.{}.".format(b64(json.dumps({"alg": "none", "kid": kid}).encode()), payload)
    hs_input = "{}.{}".format(
        b64(json.dumps({"alg": "HS256", "kid": kid, "typ": "JWT"}).encode()), payload
    )
    hs256 = "{}.{}".format(
        hs_input, b64(hmac.new(key_pem, hs_input.encode(), hashlib.sha256).digest())
    )
    claims = json.loads(unb64(payload))
    claims["sub"] = "spiffe://example.org/admin"
    h, _, s = good.token.split(".")
    tampered = "{}.{}.{}".format(h, b64(json.dumps(claims).encode()), s)
    return {
        name: refusals(client, bundle, token, audience)
        for name, token in [
            ("none", none),
            ("hs256", hs256),
            ("foreign", foreign),
            ("tampered", tampered),
        ]
    }


def main():
    mode = sys.argv[1]
    client = WorkloadApiClient(default_timeout=TIMEOUT_SECONDS)
    try:
        if mode == "all":
            out = cmd_all(client, set(sys.argv[2].split(",")))
        elif mode == "fetch":
            out = cmd_fetch(client, sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
        elif mode == "attacks":
            out = cmd_attacks(client, sys.argv[2], sys.argv[3])
        else:
            raise SystemExit("unknown mode " + mode)
    except Exception as e:
        print("{}: {}".format(type(e).__name__, e), file=sys.stderr)
        sys.exit(2)
    finally:
        client.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
