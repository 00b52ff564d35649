#!/usr/bin/env python3
"""JWT-SVIDs in use across JWT key rotations and a taint, as three independent relying parties
see them (issue 26: "a validator that refreshes its bundle at the refresh hint never sees an
unknown kid").

    jwt_rotation.py ISSUER BASE AUDIENCE STOP_FILE

Until STOP_FILE exists (at most 120 s), every 100 ms a workload fetches a JWT-SVID for AUDIENCE
from the agent (py-spiffe's WorkloadApiClient; SPIFFE_ENDPOINT_SOCKET), and three validators
check it at once:

- "oidc": a relying party that knows only the issuer (AWS, GCP, Vault). It reads the discovery
  document once, then keeps the JWKS from its `jwks_uri` and fetches it again only when the
  answer's `Cache-Control: max-age` has passed, never on an unknown `kid` (so an unknown `kid`
  is a failure, not a refetch). PyJWT checks signature, `exp`, `aud` and `iss`.
- "bundle": py-spiffe's JwtSource (the agent's FetchJWTBundles stream) and
  JwtSvid.parse_and_validate.
- "agent": the agent's ValidateJWTSVID.

BASE is where ISSUER's host is reached (http://127.0.0.1:PORT, the server's `http_listen`, as
an ingress would forward it). Prints {"tokens", "kids" (in the order first seen), "last_kid",
"jwks_fetches", "max_age", "failures": [{"who", "kid", "error"}], "fetch_errors": [...]}.
"""

import base64
import json
import os
import re
import sys
import time
import urllib.request

import grpc
import jwt
from spiffe import JwtSource, WorkloadApiClient
from spiffe.svid.jwt_svid import JwtSvid

_AUTHORITY = os.environ.get("SIGNET_GRPC_DEFAULT_AUTHORITY")
if _AUTHORITY:
    _insecure_channel = grpc.insecure_channel

    def _channel_with_authority(target, options=None, compression=None):
        options = list(options or []) + [("grpc.default_authority", _AUTHORITY)]
        return _insecure_channel(target, options=options, compression=compression)

    grpc.insecure_channel = _channel_with_authority


def kid_of(token):
    head = token.split(".")[0]
    return json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4))).get("kid")


class OidcRelyingParty:
    """Keeps the JWKS for its max-age; validates with PyJWT."""

    def __init__(self, issuer, base):
        self.issuer = issuer
        self.origin = "https://" + issuer.split("/")[2]
        self.base = base
        doc = self.get(issuer[len(self.origin):] + "/.well-known/openid-configuration")[0]
        if doc.get("issuer") != issuer:
            raise ValueError(f"discovery issuer {doc.get('issuer')!r} is not {issuer!r}")
        self.jwks_path = doc["jwks_uri"][len(self.origin):]
        self.algorithms = doc["id_token_signing_alg_values_supported"]
        self.keys, self.fetched_at, self.max_age, self.fetches = {}, 0.0, 0, 0

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=10) as resp:
            cache = resp.headers.get("Cache-Control", "")
            m = re.search(r"max-age=(\d+)", cache)
            return json.load(resp), int(m.group(1)) if m else 0

    def refresh_if_due(self):
        if self.fetches and time.monotonic() - self.fetched_at < self.max_age:
            return
        jwks, self.max_age = self.get(self.jwks_path)
        self.keys = {k["kid"]: k for k in jwks["keys"]}
        self.fetched_at = time.monotonic()
        self.fetches += 1

    def validate(self, token, audience):
        self.refresh_if_due()
        kid = kid_of(token)
        if kid not in self.keys:
            raise LookupError(f"unknown kid {kid!r} (JWKS fetched {self.fetches} times)")
        key = jwt.PyJWK(self.keys[kid]).key
        jwt.decode(
            token,
            key,
            algorithms=self.algorithms,
            audience=audience,
            issuer=self.issuer,
            options={"require": ["exp", "iat", "sub", "aud", "iss"]},
        )


def main():
    issuer, base, audience, stop_file = sys.argv[1:5]
    rp = OidcRelyingParty(issuer, base)
    client = WorkloadApiClient(default_timeout=10.0)
    source = JwtSource(socket_path=os.environ["SPIFFE_ENDPOINT_SOCKET"], timeout_in_seconds=10.0)
    tokens, kids, failures, fetch_errors = 0, [], [], []
    deadline = time.monotonic() + 120
    try:
        while not os.path.exists(stop_file) and time.monotonic() < deadline:
            try:
                svid = client.fetch_jwt_svid(audience={audience})
            except Exception as e:  # noqa: BLE001 - the test reads it
                fetch_errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.1)
                continue
            tokens += 1
            kid = kid_of(svid.token)
            if kid not in kids:
                kids.append(kid)
            for who, check in [
                ("oidc", lambda: rp.validate(svid.token, audience)),
                (
                    "bundle",
                    lambda: JwtSvid.parse_and_validate(
                        svid.token,
                        source.get_bundle_for_trust_domain(svid.spiffe_id.trust_domain),
                        {audience},
                    ),
                ),
                ("agent", lambda: client.validate_jwt_svid(svid.token, audience)),
            ]:
                try:
                    check()
                except Exception as e:  # noqa: BLE001 - the test reads it
                    failures.append({"who": who, "kid": kid, "error": f"{type(e).__name__}: {e}"})
            time.sleep(0.1)
    finally:
        source.close()
        client.close()
    print(
        json.dumps(
            {
                "tokens": tokens,
                "kids": kids,
                "last_kid": kids[-1] if kids else None,
                "jwks_fetches": rp.fetches,
                "max_age": rp.max_age,
                "failures": failures,
                "fetch_errors": fetch_errors,
            }
        )
    )


if __name__ == "__main__":
    main()
