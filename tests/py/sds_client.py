"""An Envoy-like SDS client built only from Envoy's own protos (PyPI: xds-protos) and grpcio,
against signet-agent's socket; and TLS peers that use nothing but what SDS delivered.

    sds_client.py SOCKET fetch [--envoy 1.30|none] [--disable-spiffe] NAME...
        The first response to a stream asking for NAME... (none: everything), as JSON.
    sds_client.py SOCKET protocol SPIFFE_ID
        ACK, a stale nonce and a NACK on an open stream, then waits for the next push (the test
        renews the certificate after the line {"event": "ready"}), then asks for SPIFFE_ID by
        name. One JSON line per step.
    sds_client.py SOCKET serve EXPECTED_PEER PORT_FILE
        A mutual-TLS server whose certificate, key and trust bundle (CRLs included) come from
        an SDS stream kept open (each push used for the next connection); it checks each
        client's SPIFFE ID. One JSON line per connection.
    sds_client.py SOCKET connect PORT EXPECTED_PEER [--save DIR | --use DIR]
        A mutual-TLS client with the SDS `default` certificate (or one saved earlier) and
        `ROOTCA`; checks the server's SPIFFE ID. One JSON line.

TLS is Python's ssl (OpenSSL) with CRL checking of the whole chain when the bundle carries
CRLs (VERIFY_CRL_CHECK_CHAIN: what Envoy does with CRLs in a SPIFFE trust bundle), and the peer's
SPIFFE ID read from its URI SAN and checked against the trust domain whose bundle was used (what
Envoy's SPIFFE validator does).
"""

import json
import os
import queue
import socket
import ssl
import sys
import tempfile
import threading
import time

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_spiffe_validator_config_pb2 as spiffe_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.secret.v3 import sds_pb2_grpc
from google.rpc import status_pb2

SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
SPIFFE_VALIDATOR = "envoy.tls.cert_validator.spiffe"


def out(obj):
    print(json.dumps(obj), flush=True)


def node(envoy="1.30", disable_spiffe=False):
    n = base_pb2.Node(id="sidecar~127.0.0.1~py", cluster="py", user_agent_name="envoy")
    if envoy != "none":
        major, minor = (int(x) for x in envoy.split("."))
        n.user_agent_build_version.version.major_number = major
        n.user_agent_build_version.version.minor_number = minor
    if disable_spiffe:
        n.metadata.update({"disable_spiffe_cert_validation": True})
    return n


class Stream:
    """One StreamSecrets stream: send() requests, next() responses."""

    def __init__(self, path, deadline=120):
        self.channel = grpc.insecure_channel(
            "unix:" + path, options=[("grpc.default_authority", "localhost")]
        )
        self.requests = queue.Queue()
        stub = sds_pb2_grpc.SecretDiscoveryServiceStub(self.channel)
        self.responses = stub.StreamSecrets(iter(self.requests.get, None), timeout=deadline)

    def send(self, **kw):
        self.requests.put(discovery_pb2.DiscoveryRequest(type_url=SECRET, **kw))

    def next(self):
        return next(self.responses)

    def close(self):
        self.requests.put(None)
        self.channel.close()


def secrets(resp):
    found = []
    for any_ in resp.resources:
        assert any_.type_url == SECRET, any_.type_url
        s = secret_pb2.Secret()
        any_.Unpack(s)
        found.append(s)
    return found


def describe(s):
    """A secret as JSON, the private key reduced to its PEM label."""
    kind = s.WhichOneof("type")
    if kind == "tls_certificate":
        key = s.tls_certificate.private_key.inline_bytes.decode()
        return {
            "name": s.name,
            "kind": "tls",
            "chain": s.tls_certificate.certificate_chain.inline_bytes.decode(),
            "key_label": key.splitlines()[0] if key else "",
        }
    v = s.validation_context
    if v.HasField("custom_validator_config"):
        assert v.custom_validator_config.name == SPIFFE_VALIDATOR, v.custom_validator_config.name
        cfg = spiffe_pb2.SPIFFECertValidatorConfig()
        assert v.custom_validator_config.typed_config.Unpack(cfg)
        return {
            "name": s.name,
            "kind": "spiffe",
            "trust_domains": [
                {"name": td.name, "bundle": td.trust_bundle.inline_bytes.decode()}
                for td in cfg.trust_domains
            ],
        }
    return {
        "name": s.name,
        "kind": "trusted_ca",
        "trusted_ca": v.trusted_ca.inline_bytes.decode(),
        "crl": v.crl.inline_bytes.decode() if v.HasField("crl") else None,
    }


def error(e):
    return {"ok": False, "code": e.code().name, "message": e.details()}


def leaf_info(chain_pem):
    """Serial and URI SANs of the first certificate of a PEM chain (CPython's own decoder)."""
    first = chain_pem.split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n"
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as f:
        f.write(first)
        f.flush()
        d = ssl._ssl._test_decode_cert(f.name)
    return d["serialNumber"], [v for k, v in d.get("subjectAltName", ()) if k == "URI"]


def cmd_fetch(path, args):
    envoy, disable, names = "1.30", False, []
    i = 0
    while i < len(args):
        if args[i] == "--envoy":
            envoy = args[i + 1]
            i += 2
        elif args[i] == "--disable-spiffe":
            disable = True
            i += 1
        else:
            names.append(args[i])
            i += 1
    s = Stream(path, deadline=20)
    s.send(node=node(envoy, disable), resource_names=names)
    try:
        r = s.next()
        out({"ok": True, "version": r.version_info, "nonce": r.nonce, "type_url": r.type_url,
             "secrets": [describe(x) for x in secrets(r)]})
    except grpc.RpcError as e:
        out(error(e))
    s.close()


def cmd_protocol(path, spiffe_id):
    s = Stream(path)
    names = ["default", "ROOTCA"]
    s.send(node=node(), resource_names=names)
    r1 = s.next()
    chain1 = describe(secrets(r1)[1])["chain"]
    serial1, _ = leaf_info(chain1)
    # ACK; a reply to a response that was never sent (stale nonce); a NACK of r1.
    s.send(version_info=r1.version_info, response_nonce=r1.nonce, resource_names=names)
    s.send(version_info="0", response_nonce="not-a-nonce-we-got", resource_names=["ROOTCA"])
    s.send(version_info=r1.version_info, response_nonce=r1.nonce, resource_names=names,
           error_detail=status_pb2.Status(code=13, message="Failed to load private key"))
    out({"event": "ready", "serial": serial1, "chain": chain1, "version": r1.version_info,
         "nonce": r1.nonce})
    r2 = s.next()
    got = [describe(x) for x in secrets(r2)]
    serial2, uris = leaf_info(got[1]["chain"])
    out({"event": "pushed", "serial": serial2, "chain": got[1]["chain"], "uris": uris,
         "version": r2.version_info,
         "nonce": r2.nonce, "names": [g["name"] for g in got]})
    s.send(version_info=r2.version_info, response_nonce=r2.nonce, resource_names=[spiffe_id])
    r3 = s.next()
    out({"event": "renamed", "names": [x.name for x in secrets(r3)], "version": r3.version_info})
    s.close()


class Material:
    """Certificate, key and trust bundle files in a private directory, from SDS secrets."""

    def __init__(self, directory):
        self.dir = directory

    def write(self, found):
        by_name = {x["name"]: x for x in found}
        tls_ = by_name["default"]
        ctx = by_name["ROOTCA"]
        if ctx["kind"] == "spiffe":
            (td,) = ctx["trust_domains"]
            self.td, bundle = td["name"], td["bundle"]
        else:
            self.td, bundle = None, ctx["trusted_ca"] + (ctx["crl"] or "")
        self.crls = "X509 CRL" in bundle
        self._put("bundle.pem", bundle)
        self._put("chain.pem", tls_["chain"])
        return tls_

    def _put(self, name, text):
        tmp = os.path.join(self.dir, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(self.dir, name))

    def context(self, side, key_pem, chain_file=None):
        ctx = ssl.SSLContext(side)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        # cafile, not cadata: OpenSSL then loads the CRL blocks too.
        ctx.load_verify_locations(cafile=os.path.join(self.dir, "bundle.pem"))
        if self.crls:
            ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_CHAIN
        key_file = os.path.join(self.dir, "key.pem")
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(key_pem)
        ctx.load_cert_chain(chain_file or os.path.join(self.dir, "chain.pem"), key_file)
        return ctx

    def check_peer(self, tls_sock, expected):
        _, uris = peer_ids(tls_sock)
        if uris != [expected]:
            raise ValueError(f"peer SPIFFE IDs {uris}, expected {expected}")
        if self.td is not None and not expected.startswith(f"spiffe://{self.td}/"):
            raise ValueError(f"peer {expected} is not in trust domain {self.td}")


def peer_ids(tls_sock):
    cert = tls_sock.getpeercert()
    return cert, [v for k, v in cert.get("subjectAltName", ()) if k == "URI"]


def cmd_serve(path, expected, port_file):
    directory = tempfile.mkdtemp()
    m = Material(directory)
    latest = {}
    ready = threading.Event()

    def follow():
        s = Stream(path, deadline=3600)
        s.send(node=node(), resource_names=["default", "ROOTCA"])
        while True:
            r = s.next()
            found = [describe(x) for x in secrets(r)]
            latest["found"] = found
            latest["key"] = secrets(r)[1].tls_certificate.private_key.inline_bytes.decode()
            serial, _ = leaf_info([f for f in found if f["name"] == "default"][0]["chain"])
            out({"event": "secrets", "version": r.version_info, "serial": serial,
                 "crls": sum(f.get("trust_domains", [{}])[0].get("bundle", "").count("BEGIN X509 CRL")
                             for f in found if f["kind"] == "spiffe")})
            ready.set()
            s.send(version_info=r.version_info, response_nonce=r.nonce,
                   resource_names=["default", "ROOTCA"])

    threading.Thread(target=follow, daemon=True).start()
    if not ready.wait(60):
        out({"event": "error", "message": "no SDS response"})
        return
    listener = socket.create_server(("127.0.0.1", 0))
    with open(port_file + ".tmp", "w") as f:
        f.write(str(listener.getsockname()[1]))
    os.replace(port_file + ".tmp", port_file)
    while True:
        conn, _ = listener.accept()
        m.write(latest["found"])
        ctx = m.context(ssl.PROTOCOL_TLS_SERVER, latest["key"])
        try:
            with ctx.wrap_socket(conn, server_side=True) as t:
                m.check_peer(t, expected)
                _, uris = peer_ids(t)
                t.sendall(f"hello {uris[0]}".encode())
                out({"event": "conn", "ok": True, "peer": uris[0], "crl_check": m.crls})
        except (ssl.SSLError, ValueError, OSError) as e:
            out({"event": "conn", "ok": False, "error": str(e)})


def cmd_connect(path, port, expected, mode=None, directory=None):
    s = Stream(path, deadline=20)
    s.send(node=node(), resource_names=["default", "ROOTCA"])
    try:
        r = s.next()
    except grpc.RpcError as e:
        out(error(e))
        return
    s.close()
    found = [describe(x) for x in secrets(r)]
    key = [x for x in secrets(r) if x.name == "default"][0].tls_certificate.private_key.inline_bytes.decode()
    work = tempfile.mkdtemp()
    m = Material(work)
    mine = m.write(found)
    chain_file = None
    if mode == "--save":
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "chain.pem"), "w") as f:
            f.write(mine["chain"])
        with open(os.open(os.path.join(directory, "key.pem"), os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(key)
    elif mode == "--use":
        chain_file = os.path.join(directory, "chain.pem")
        with open(os.path.join(directory, "key.pem")) as f:
            key = f.read()
    serial, _ = leaf_info(open(chain_file).read() if chain_file else mine["chain"])
    ctx = m.context(ssl.PROTOCOL_TLS_CLIENT, key, chain_file)
    try:
        with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as raw:
            with ctx.wrap_socket(raw) as t:
                m.check_peer(t, expected)
                reply = t.recv(200).decode()
                if not reply:
                    raise ValueError("the server closed the connection (it refused us)")
                out({"ok": True, "server": expected, "reply": reply, "serial": serial,
                     "crl_check": m.crls})
    except (ssl.SSLError, ValueError, OSError) as e:
        out({"ok": False, "error": str(e), "serial": serial})


def main():
    path, cmd, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if cmd == "fetch":
        cmd_fetch(path, rest)
    elif cmd == "protocol":
        cmd_protocol(path, rest[0])
    elif cmd == "serve":
        cmd_serve(path, rest[0], rest[1])
    elif cmd == "connect":
        cmd_connect(path, rest[0], rest[1], *(rest[2:4] if len(rest) > 2 else []))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
