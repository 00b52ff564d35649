#!/usr/bin/env python3
"""A federating workload for the federation end-to-end tests, with py-spiffe (PyPI `spiffe`)
and the standard library's ssl: everything it trusts comes from its own agent's Workload API
(SPIFFE_ENDPOINT_SOCKET=unix:///path).

    federation_peer.py info
        One JSON object: {"svids": [SPIFFE ID...],
                          "svid_bundles": {td: [root PEM...]},   # X509SVIDResponse
                          "bundles": {td: [root PEM...]},        # FetchX509Bundles
                          "jwt_bundles": {td: [kid...]}}         # FetchJWTBundles
    federation_peer.py validate TOKEN AUDIENCE
        {"ok": true, "spiffe_id": ...} or {"ok": false, "error": ...} (ValidateJWTSVID).
    federation_peer.py serve EXPECTED PORT_FILE
        Mutual TLS server with this workload's X509-SVID. A peer is verified the SPIFFE way:
        against the bundle of EXPECTED's trust domain only (the peer ID's trust domain picks
        the bundle), then its URI SAN must be exactly EXPECTED. Writes the port to PORT_FILE,
        then one JSON line per connection: {"ok": true, "peer": ID} or {"ok": false, "error"}.
    federation_peer.py connect PORT EXPECTED [--cert C --key K]
        Mutual TLS client, verified the same way; one JSON line. With --cert/--key it presents
        those files instead and verifies nothing (an attacker's client).

Exits 2 with the error on stderr when the Workload API refuses or cannot be reached.
"""

import json
import os
import socket
import ssl
import sys
import tempfile

from cryptography.hazmat.primitives import serialization
from spiffe import WorkloadApiClient

TIMEOUT_SECONDS = 10.0


def out(obj):
    print(json.dumps(obj), flush=True)


def pem(cert):
    return cert.public_bytes(serialization.Encoding.PEM).decode("ascii")


def x509_set(bundle_set):
    return {b.trust_domain.name: sorted(pem(c) for c in b.x509_authorities) for b in bundle_set.bundles}


def trust_domain_of(spiffe_id):
    if not spiffe_id.startswith("spiffe://"):
        raise ValueError(f"not a SPIFFE ID: {spiffe_id}")
    return spiffe_id[len("spiffe://"):].split("/", 1)[0]


def cmd_info():
    with WorkloadApiClient(default_timeout=TIMEOUT_SECONDS) as client:
        context = client.fetch_x509_context()
        bundles = client.fetch_x509_bundles()
        jwt = client.fetch_jwt_bundles()
    out({
        "svids": [str(s.spiffe_id) for s in context.x509_svids],
        "svid_bundles": x509_set(context.x509_bundle_set),
        "bundles": x509_set(bundles),
        "jwt_bundles": {b.trust_domain.name: sorted(b.jwt_authorities) for b in jwt.bundles},
    })


def cmd_validate(token, audience):
    with WorkloadApiClient(default_timeout=TIMEOUT_SECONDS) as client:
        try:
            svid = client.validate_jwt_svid(token, audience)
        except Exception as e:  # noqa: BLE001 - the refusal is the answer
            out({"ok": False, "error": f"{type(e).__name__}: {e}"})
            return
    out({"ok": True, "spiffe_id": str(svid.spiffe_id)})


class Material:
    """This workload's SVID and the bundle for the expected peer's trust domain, as files."""

    def __init__(self, expected):
        self.expected = expected
        self.dir = tempfile.mkdtemp()
        with WorkloadApiClient(default_timeout=TIMEOUT_SECONDS) as client:
            context = client.fetch_x509_context()
        svid = context.default_svid
        self.me = str(svid.spiffe_id)
        td = trust_domain_of(expected)
        roots = x509_set(context.x509_bundle_set).get(td)
        if not roots:
            raise ValueError(f"no bundle for trust domain {td} from the Workload API")
        self.bundle = self._put("bundle.pem", "".join(roots))
        self.chain = self._put("chain.pem", "".join(pem(c) for c in svid.cert_chain))
        key = svid.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode("ascii")
        self.key = self._put("key.pem", key)

    def _put(self, name, text):
        path = os.path.join(self.dir, name)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(text)
        return path

    def context(self, side):
        ctx = ssl.SSLContext(side)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=self.bundle)
        ctx.load_cert_chain(self.chain, self.key)
        return ctx

    def check_peer(self, tls_sock):
        cert = tls_sock.getpeercert()
        uris = [v for k, v in cert.get("subjectAltName", ()) if k == "URI"]
        if uris != [self.expected]:
            raise ValueError(f"peer SPIFFE IDs {uris}, expected {self.expected}")
        return uris[0]


def cmd_serve(expected, port_file):
    m = Material(expected)
    ctx = m.context(ssl.PROTOCOL_TLS_SERVER)
    listener = socket.create_server(("127.0.0.1", 0))
    with open(port_file + ".tmp", "w") as f:
        f.write(str(listener.getsockname()[1]))
    os.replace(port_file + ".tmp", port_file)
    while True:
        conn, _ = listener.accept()
        conn.settimeout(10)
        try:
            with ctx.wrap_socket(conn, server_side=True) as t:
                peer = m.check_peer(t)
                t.sendall(f"hello {peer} from {m.me}".encode())
                out({"ok": True, "peer": peer})
        except (ssl.SSLError, ValueError, OSError) as e:
            out({"ok": False, "error": str(e)})


def cmd_connect(port, expected, rest):
    if rest[:1] == ["--cert"]:
        cert, key = rest[1], rest[3]
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.load_cert_chain(cert, key)
        m = None
    else:
        m = Material(expected)
        ctx = m.context(ssl.PROTOCOL_TLS_CLIENT)
    try:
        with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as raw:
            with ctx.wrap_socket(raw) as t:
                peer = m.check_peer(t) if m else None
                reply = t.recv(200).decode()
                if not reply:
                    raise ValueError("the server closed the connection (it refused us)")
                out({"ok": True, "peer": peer, "reply": reply})
    except (ssl.SSLError, ValueError, OSError) as e:
        out({"ok": False, "error": str(e)})


def main():
    cmd, rest = sys.argv[1], sys.argv[2:]
    try:
        if cmd == "info":
            cmd_info()
        elif cmd == "validate":
            cmd_validate(rest[0], rest[1])
        elif cmd == "serve":
            cmd_serve(rest[0], rest[1])
        elif cmd == "connect":
            cmd_connect(rest[0], rest[1], rest[2:])
        else:
            raise SystemExit(f"unknown command {cmd}")
    except Exception as e:  # noqa: BLE001 - reported to the caller
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
