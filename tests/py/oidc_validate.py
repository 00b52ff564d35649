#!/usr/bin/env python3
"""Validates a JWT-SVID as a relying party that knows only Signet's OpenID Connect issuer URL
would (AWS IAM, GCP workload identity federation, Vault's JWT auth): with PyJWT (PyPI: PyJWT, a
dependency of py-spiffe), independent of Signet's code.

    oidc_validate.py ISSUER BASE TOKEN AUDIENCE CAFILE

BASE is where ISSUER's host is reached in the test (https://127.0.0.1:PORT, Signet's
`oidc_listen`): what DNS or an ingress does in production. Every URL under ISSUER is fetched
under BASE instead; nothing else is changed.

1. GET ISSUER/.well-known/openid-configuration over HTTPS (trusting CAFILE only); its `issuer`
   must be ISSUER exactly, and its `jwks_uri` must be under ISSUER.
2. Fetch the JWKS from the document's `jwks_uri` with PyJWT's PyJWKClient, which picks the key by
   the token's `kid` (keys with `use: sig`).
3. jwt.decode with the algorithms the document lists, the audience and the issuer: signature,
   `exp`, `aud` and `iss` checked by PyJWT.

Prints {"claims": {...}, "kid": ..., "discovery": {...}}; exits 2 with the reason on stderr when
any step fails.
"""

import json
import ssl
import sys
import urllib.request

import jwt


def main() -> int:
    issuer, base, token, audience, cafile = sys.argv[1:6]
    host = issuer.split("/")[2]
    origin = "https://" + host
    ctx = ssl.create_default_context(cafile=cafile)
    try:
        url = base + issuer[len(origin):] + "/.well-known/openid-configuration"
        with urllib.request.urlopen(url, context=ctx, timeout=10) as resp:
            doc = json.load(resp)
        if doc.get("issuer") != issuer:
            raise ValueError(f"discovery issuer {doc.get('issuer')!r} is not {issuer!r}")
        if not doc["jwks_uri"].startswith(issuer + "/"):
            raise ValueError(f"jwks_uri {doc['jwks_uri']!r} is not under the issuer")
        client = jwt.PyJWKClient(base + doc["jwks_uri"][len(origin):], ssl_context=ctx, timeout=10)
        key = client.get_signing_key_from_jwt(token)
        claims = jwt.decode(
            token,
            key.key,
            algorithms=doc["id_token_signing_alg_values_supported"],
            audience=audience,
            issuer=issuer,
            options={"require": ["exp", "iat", "sub", "aud", "iss"]},
        )
    except Exception as e:  # noqa: BLE001 - the test reads the reason
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"claims": claims, "kid": key.key_id, "discovery": doc}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
