#!/usr/bin/env python3
"""Writes realistic seed inputs for every fuzz target into fuzz/corpus/<target>/.

Needs python3 with `cryptography`. Keys are generated afresh and thrown away, except that the
JWT target verifies against fixed public keys (server/src/fuzzing_jwks.json): pass the matching
private keys with --ec-key/--rsa-key to sign new genuine tokens, otherwise JWT seeds are signed
by throwaway keys (they exercise the same paths up to the signature check).
Run from fuzz/: python3 seeds/make_seeds.py [--ec-key ec.pem --rsa-key rsa.pem] [--out DIR]
"""
import argparse, base64, hashlib, ipaddress, json, os, re, struct, subprocess, sys
from cryptography import x509
from cryptography.x509.oid import NameOID
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa, ed25519, padding
import datetime

ap = argparse.ArgumentParser()
ap.add_argument("--ec-key"); ap.add_argument("--rsa-key"); ap.add_argument("--out", help="instead of fuzz/corpus")
args = ap.parse_args()
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CORPUS = args.out or os.path.join(ROOT, "corpus")
NOW = 1_700_000_000

def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(CORPUS, target); os.makedirs(d, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()
    open(os.path.join(d, name), "wb").write(data)

def b64u(b): return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

# ---- protobuf encoding -----------------------------------------------------------------
def varint(n):
    n &= (1 << 64) - 1
    out = b""
    while True:
        b = n & 0x7F; n >>= 7
        if n: out += bytes([b | 0x80])
        else: return out + bytes([b])
def f_len(num, payload):
    if isinstance(payload, str): payload = payload.encode()
    return varint(num << 3 | 2) + varint(len(payload)) + payload
def f_var(num, n): return varint(num << 3) + varint(n)
def pb_value(v):
    if v is None: return f_var(1, 0)
    if isinstance(v, bool): return f_var(4, int(v))
    if isinstance(v, (int, float)): return varint(2 << 3 | 1) + struct.pack("<d", float(v))
    if isinstance(v, str): return f_len(3, v)
    if isinstance(v, dict): return f_len(5, pb_struct(v))
    if isinstance(v, list): return f_len(6, b"".join(f_len(1, pb_value(x)) for x in v))
def pb_struct(d): return b"".join(f_len(1, f_len(1, k) + f_len(2, pb_value(v))) for k, v in d.items())

# ---- keys, CSRs, certificates ------------------------------------------------------------
def name(cn): return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
def csr(key, sans=(), ca=False, alg=hashes.SHA256(), pss=False):
    b = x509.CertificateSigningRequestBuilder().subject_name(name("signet fuzz"))
    if sans: b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    if ca: b = b.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    if isinstance(key, ed25519.Ed25519PrivateKey): return b.sign(key, None)
    if pss: return b.sign(key, alg, rsa_padding=padding.PSS(padding.MGF1(alg), padding.PSS.DIGEST_LENGTH))
    return b.sign(key, alg)
def cert(key, cn, issuer_key=None, issuer=None, ca=True, sans=()):
    t = datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(issuer or name(cn))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(t - datetime.timedelta(hours=1)).not_valid_after(t + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if sans: b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return b.sign(issuer_key or key, hashes.SHA256())
DER = serialization.Encoding.DER; PEM = serialization.Encoding.PEM

ec256 = ec.generate_private_key(ec.SECP256R1()); ec384 = ec.generate_private_key(ec.SECP384R1())
ed = ed25519.Ed25519PrivateKey.generate(); rsa2k = rsa.generate_private_key(65537, 2048)
rsa1k = rsa.generate_private_key(65537, 1024); ec521 = ec.generate_private_key(ec.SECP521R1())
spiffe = lambda p: x509.UniformResourceIdentifier("spiffe://cluster.local" + p)
dns = x509.DNSName
csrs = [
    csr(ec256, [spiffe("/ns/default/sa/web"), dns("web.default.svc")]),
    csr(ec256, []),
    csr(ec384, [spiffe("/ns/default/sa/web")], alg=hashes.SHA384()),
    csr(ed, [spiffe("/ns/a/sa/b")]),
    csr(rsa2k, [dns("web.default.svc"), dns("*.default.svc")]),
    csr(rsa2k, [spiffe("/ns/default/sa/web")], pss=True),
    csr(rsa1k, []),
    csr(ec521, [], alg=hashes.SHA512()),
    csr(ec256, [], ca=True),
    csr(ec256, [x509.IPAddress(ipaddress.ip_address("10.0.0.1")), x509.RFC822Name("a@b.c"),
                x509.DirectoryName(name("x"))]),
    csr(ec256, [spiffe("/signet/server"), dns("signet.signet-system.svc")]),
]
for c in csrs:
    put("csr", c.public_bytes(DER)); put("csr", c.public_bytes(PEM))
put("csr", b"Certificate Request:\n    Data: ...\n" + csrs[0].public_bytes(PEM))
put("csr", csrs[0].public_bytes(PEM).replace(b"CERTIFICATE REQUEST", b"NEW CERTIFICATE REQUEST"))
# openssl's own CSR, as `openssl req -new` writes it.
try:
    k = subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
                       capture_output=True, check=True).stdout
    r = subprocess.run(["openssl", "req", "-new", "-key", "/dev/stdin", "-subj", "/CN=web",
                        "-addext", "subjectAltName=URI:spiffe://cluster.local/ns/default/sa/web,DNS:web.default.svc"],
                       input=k, capture_output=True, check=True).stdout
    put("csr", r)
except Exception as e:
    print("openssl CSR skipped:", e, file=sys.stderr)

root = cert(ec256, "signet root"); inter = cert(ec384, "signet intermediate", ec256, root.subject)
leaf = cert(ed, "leaf", ec384, inter.subject, ca=False, sans=[spiffe("/ns/default/sa/web")])
for sans, ca in [([spiffe("/ns/default/sa/web"), dns("web.default.svc")], False),
                 ([spiffe("/signet/node/k8s-node-a")], False), ([spiffe("/signet/node/..")], False),
                 ([spiffe("/ns/a/sa/b"), spiffe("/ns/c/sa/d")], False), ([spiffe("/ns/a/sa/b")], True),
                 ([x509.UniformResourceIdentifier("spiffe://other.td/a")], False),
                 ([x509.UniformResourceIdentifier("spiffe://cluster.local")], False), ([dns("a.b")], False)]:
    put("mtls_peer", cert(ec256, "peer", ec384, inter.subject, ca=ca, sans=sans).public_bytes(DER))
chain_pem = b"".join(c.public_bytes(PEM) for c in [leaf, inter, root])

# ---- SPIFFE IDs, PEM ---------------------------------------------------------------------
for s in ["spiffe://cluster.local/ns/default/sa/web", "spiffe://example.org", "SPIFFE://Example.Org/Path/A",
          "spiffe://cluster.local/signet/node/k8s-node-a", "spiffe://td/a/./b", "spiffe://td//a",
          "spiffe://td/a%20b", "spiffe://user@td/a", "spiffe://td:8080/a", "example.org", "Example_Org-1",
          "spiffe://" + "a" * 255, "spiffe://td/" + "s" * 2000, "spiffe://td/a/b/", "spiffe://tdé/a"]:
    put("spiffe_id", s)
put("pem", chain_pem); put("pem", root.public_bytes(PEM).replace(b"\n", b"\r\n"))
put("pem", ec256.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
put("pem", csrs[0].public_bytes(PEM)); put("pem", b"text before\n" + chain_pem + b"text after\n")
put("pem", b"-----BEGIN CERTIFICATE-----\nProc-Type: 4,ENCRYPTED\n\nMAA=\n-----END CERTIFICATE-----\n")

# ---- JWT and JWKS ------------------------------------------------------------------------
def load_key(path):
    return serialization.load_pem_private_key(open(path, "rb").read(), None) if path else None
jwt_ec = load_key(args.ec_key) or ec.generate_private_key(ec.SECP256R1())
jwt_rsa = load_key(args.rsa_key) or rsa.generate_private_key(65537, 2048)
def sign(claims, alg="ES256", kid="ec-1", header_extra=None):
    h = {"alg": alg, "typ": "JWT"}
    if kid: h["kid"] = kid
    h.update(header_extra or {})
    msg = (b64u(json.dumps(h).encode()) + "." + b64u(json.dumps(claims).encode())).encode()
    if alg == "ES256":
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
        r, s = decode_dss_signature(jwt_ec.sign(msg, ec.ECDSA(hashes.SHA256())))
        sig = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    elif alg == "PS256":
        sig = jwt_rsa.sign(msg, padding.PSS(padding.MGF1(hashes.SHA256()), 32), hashes.SHA256())
    else:
        sig = jwt_rsa.sign(msg, padding.PKCS1v15(), hashes.SHA256())
    return msg.decode() + "." + b64u(sig)
ISS = "https://kubernetes.default.svc.cluster.local"
def claims(ns="default", sa="web", aud=("istio-ca",), node="node-a", pod="web-1", **kw):
    c = {"aud": list(aud), "exp": NOW + 3600, "iat": NOW - 60, "nbf": NOW - 60, "iss": ISS,
         "sub": f"system:serviceaccount:{ns}:{sa}",
         "kubernetes.io": {"namespace": ns, "serviceaccount": {"name": sa, "uid": "u-1"},
                           "pod": {"name": pod, "uid": "p-1"}, "node": {"name": node, "uid": "n-1"}}}
    c.update(kw)
    return c
variants = [claims(), claims(aud=("signet-node",), ns="signet-system", sa="signet-agent"),
            claims(exp=NOW - 100), claims(aud="istio-ca"), claims(aud=("other",)), claims(iss="kubernetes/serviceaccount"),
            claims(ns="a", sa="b.c"), claims(sub="system:serviceaccount:default:web:x"), claims(exp=1.7e9 + 0.5),
            claims(**{"kubernetes.io/serviceaccount/namespace": "default"}), claims(node="Node_A..")]
for c in variants:
    put("jwt", b"\x00Bearer " + sign(c).encode()); put("jwt", b"\x01" + json.dumps(c).encode())
put("jwt", b"\x00bearer " + sign(claims(), alg="RS256", kid="rsa-1").encode())
put("jwt", b"\x00Bearer " + sign(claims(), alg="RS256", kid=None).encode())
put("jwt", b"\x00Bearer " + sign(claims(), alg="PS256", kid="rsa-1").encode())
put("jwt", b"\x00Bearer " + sign(claims(), header_extra={"crit": ["b64"]}).encode())
put("jwt", b"\x00Basic dXNlcjpwYXNz"); put("jwt", b"\x00Bearer a.b.c.d.e"); put("jwt", b"\x00Bearer   ")
for h in [{"alg": "none"}, {"alg": "HS256", "kid": "rsa-1"}, {"alg": "ES256", "kid": "ec-1"}, {"alg": "RS256"},
          {"alg": "ES384", "kid": "nope"}, {"alg": "ES256", "crit": ["x"]}]:
    put("jwt", b"\x02" + json.dumps(h).encode() + b"\n" + json.dumps(claims()).encode())
jwks_fixed = open(os.path.join(ROOT, "..", "server", "src", "fuzzing_jwks.json")).read()
put("jwks", jwks_fixed)
en = jwt_ec.public_key().public_numbers()
p384 = ec384.public_key().public_numbers()
rn = rsa1k.public_key().public_numbers()
put("jwks", json.dumps({"keys": [
    {"use": "sig", "kty": "EC", "crv": "P-384", "kid": "p384", "x": b64u(p384.x.to_bytes(48, "big")), "y": b64u(p384.y.to_bytes(48, "big"))},
    {"use": "enc", "kty": "EC", "crv": "P-256", "kid": "enc", "x": b64u(en.x.to_bytes(32, "big")), "y": b64u(en.y.to_bytes(32, "big"))}]}))
put("jwks", json.dumps({"keys": [{"kty": "RSA", "kid": "small", "n": b64u(rn.n.to_bytes(128, "big")), "e": "AQAB"}]}))
put("jwks", json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}))
put("jwks", json.dumps({"keys": [{"kty": "EC", "crv": "P-256", "d": "AAAA", "x": "AA", "y": "AA"}]}))
put("jwks", json.dumps({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "AA"}]}))
put("jwks", json.dumps({"keys": [{"kty": "EC", "crv": "P-256", "alg": "RS256", "x": b64u(en.x.to_bytes(32, "big")), "y": b64u(en.y.to_bytes(32, "big"))}]}))
put("jwks", '{"keys": []}'); put("jwks", "[]")

# ---- configuration -----------------------------------------------------------------------
def toml_blocks(path):
    text = open(path).read()
    return re.findall(r"```toml\n(.*?)```", text, re.S)
readme = os.path.join(ROOT, "..", "README.md")
for block in toml_blocks(readme):
    target = "agent_config" if "server_address" in block else "server_config"
    put(target, block)
for path, target in [("deploy/server.yaml", "server_config"), ("deploy/agent.yaml", "agent_config")]:
    text = open(os.path.join(ROOT, "..", path)).read()
    m = re.search(r"\.toml: \|\n((?:    .*\n|\n)+)", text)
    if m:
        put(target, "\n".join(l[4:] for l in m.group(1).split("\n")))
put("server_config", 'trust_domain = "cluster.local"\n[policy]\nkubernetes_dns_templates = ["{serviceaccount}.{namespace}.svc", "*.{namespace}.svc.cluster.local"]\nimpersonators = ["spiffe://cluster.local/ns/istio-system/sa/ztunnel"]\n[policy.kubernetes_bridge]\ncallers = ["spiffe://cluster.local/ns/signet-system/sa/signet-k8s"]\n')
put("server_config", 'trust_domain = "cluster.local"\n[ca]\ndefault_ttl = "2h"\nmax_ttl = "1h"\n')
put("agent_config", 'server_address = "https://signet:8443"\nattestation = "kubernetes"\nkubernetes_token_file = "/var/run/secrets/signet/token"\n[[sinks]]\nname = "istio"\nkind = "kubernetes-secret"\nspiffe_id = "spiffe://cluster.local/ns/default/sa/web"\nnamespace = "default"\nsecret_name = "web-tls"\n')
put("agent_config", 'renew_fraction = 0.95\nsync_interval = "0s"\n')

# ---- Istio and native/node requests --------------------------------------------------------
c_pem = csrs[0].public_bytes(PEM).decode()
for meta in [{}, {"ImpersonatedIdentity": "spiffe://cluster.local/ns/default/sa/web"},
             {"ImpersonatedIdentity": "spiffe://cluster.local/signet/node/k8s-node-a"},
             {"ImpersonatedIdentity": "spiffe://cluster.local/signet/server"},
             {"ImpersonatedIdentity": "spiffe://cluster.local/ns/signet-system/sa/signet-k8s"},
             {"ImpersonatedIdentity": "spiffe://cluster.local/ns/istio-system/sa/ztunnel"},
             {"ImpersonatedIdentity": "spiffe://other.td/ns/a/sa/b"}, {"ImpersonatedIdentity": 3},
             {"ImpersonatedIdentity": ""}, {"ImpersonatedIdentity": {"a": [1, None, True]}}]:
    msg = f_len(1, c_pem) + f_var(3, 3600) + (f_len(4, pb_struct(meta)) if meta else b"")
    put("istio", msg)
put("istio", f_len(1, csrs[1].public_bytes(PEM).decode()) + f_var(3, (1 << 64) - 1))
der0 = csrs[0].public_bytes(DER)
put("grpc_requests", b"\x00" + f_len(1, der0) + f_var(2, 600))
put("grpc_requests", b"\x00" + f_len(1, der0) + f_len(3, "default"))
put("grpc_requests", b"\x00" + f_len(1, csrs[4].public_bytes(DER)) + f_len(3, "signet-system"))
put("grpc_requests", b"\x01"); put("grpc_requests", b"\x02")
put("grpc_requests", b"\x03" + f_len(1, "sjt_" + "ab" * 32) + f_len(2, der0))
put("grpc_requests", b"\x04" + f_len(1, der0)); put("grpc_requests", b"\x05" + f_var(1, 7))
put("grpc_requests", b"\x06" + f_len(1, f_len(1, "entry-1") + f_len(2, der0)) + f_len(1, f_len(1, "e2")))

# ---- Workload API, selectors -------------------------------------------------------------
for which in range(5):
    for mode, value in [(1, b"true"), (0, b""), (1, b"false"), (2, b"True"), (1, b"true\xff")]:
        body = b""
        if which == 2: body = f_len(1, "spiffe-audience") + f_len(2, "spiffe://cluster.local/ns/a/sa/b")
        if which == 4: body = f_len(1, "aud") + f_len(2, "eyJhbGciOiJFUzI1NiJ9.e30.sig")
        put("workload", bytes([which, mode]) + value + b"\x00" + body)
for s in ["unix:uid:1000", "unix:gid:0", "unix:user:www-data", "unix:path:/usr/bin/app", "unix:uid:+7",
          "unix:path:/a//b/", "unix:user:a:b", "k8s:ns:default", "unix:uid:4294967296", "unix:path:relative"]:
    put("selector", s)
put("selector", "www-data\nroot:x:0:0:root:/root:/bin/bash\n# comment:x:5:5\nwww-data:x:33:33::/var/www:/usr/sbin/nologin\nbroken\n")
for s in ["k8s:sa:web-1", "k8s:pod-label:app.kubernetes.io/name:web", "k8s:pod-label:tier:",
          "k8s:ns:Default", "unix:uid:01000", "unix:path:/usr/../bin/sh", "unix:user:a b", "unix:path:/a\nb",
          "unix:uid:1000\nunix:path:/usr/bin/app\nk8s:ns:team-a\nk8s:sa:web-1"]:
    put("selector", s)
# DNS names, RFC 1123 labels and subdomains (Kubernetes names): signet_types::fuzzing::dns_names
for s in ["a", "web-1", "a.b", "istio.default", "z" * 63, "a." * 126 + "b", "", ".", "a.", "a..b", "a.-b",
          "a-.b", "a_b", "*.a", "Web", "a.B", "z" * 64, "a." * 126 + "bc", "*.example.org", "::1", "1.2.3.4",
          "signet-system\nkube-system\nsignet-agent.v2\nnode-1.example.internal"]:
    put("dns_names", s)

# ---- DNS templates, nodes ----------------------------------------------------------------
for t in ["{serviceaccount}.{namespace}.svc;*.{namespace}.svc.cluster.local\n*.{namespace}.svc\nweb.default.svc\ndefault\nweb\nother\nweb",
          "{serviceaccount}.{namespace}.svc\n*.{namespace}.svc\na.b.c.svc\nc\na.b\nb\na",
          "{namespace}-{serviceaccount}.svc\n\na-b-c.svc\na-b\nc\na\nb-c",
          "{serviceaccount}.{namespace}\n*.{namespace}.svc\nx.y.svc\ny\nx\nsvc\nx.y",
          "*.{namespace}.svc\n*.{namespace}.svc\nx.a.svc\na\nsa\nb\nsa",
          "{namespace}.{serviceaccount}.svc\n*.{namespace}.svc.cluster.local\nfoo.ns.svc.cluster.local\nns\nfoo\nns\nbar",
          "{NAMESPACE}.svc;{x}\n*.*.{namespace}\n\n\n\n\n"]:
    put("dns_templates", t)
put("nodes", "node-a\nk8s-node-a\n.\n..\nspiffe://cluster.local/signet/node/node-a\nsjt_" + "AB" * 32 + "\nunix:uid:1000\nk8s:pod-label:app:web\nweb.default.svc\n*.default.svc")
put("nodes", "spiffe://cluster.local/ns/default/sa/web\nnode-a\nunix:uid:1000\nunix:path:/usr/bin/app\nweb.default.svc")
put("nodes", "spiffe://cluster.local/signet/server\nspiffe://cluster.local/signet/node/n1\nunix:uid:0\nsignet.signet-system.svc")
put("nodes", "spiffe://cluster.local/app\nspiffe://other/signet/node/n\nunix:path:/a/../b\nk8s:ns:Default\n-bad-.example")

# ---- server responses (what the agent converts) ------------------------------------------
leaf_der = leaf.public_bytes(DER); root_der = root.public_bytes(DER)
svid = f_len(1, "spiffe://cluster.local/ns/default/sa/web") + f_len(2, leaf_der) + f_len(2, root_der) + f_len(3, "0a1b") + f_var(4, NOW) + f_var(5, NOW + 3600)
put("server_responses", b"\x00" + svid)
put("server_responses", b"\x00" + f_len(1, "spiffe://cluster.local/x") + f_len(2, b"\x30") + f_var(4, NOW) + f_var(5, (1 << 63) - 1))
put("server_responses", b"\x01" + f_len(1, "k8s-node-a") + f_len(2, svid) + f_len(3, root_der))
entry = lambda i, sels: f_len(1, i) + f_len(2, "spiffe://cluster.local/ns/default/sa/web") + f_len(3, "spiffe://cluster.local/signet/node/n") + b"".join(f_len(4, s) for s in sels) + f_var(5, 600) + f_len(6, "web.default.svc") + f_var(7, 3)
put("server_responses", b"\x02" + f_var(1, 4) + f_len(3, entry("e1", ["unix:uid:1000", "unix:path:/usr/bin/app"])) + f_len(3, entry("e2", ["k8s:ns:default"])))
put("server_responses", b"\x03" + f_len(1, "cluster.local") + f_len(2, root_der) + f_var(3, 2))
put("server_responses", b"\x03" + f_len(1, "evil.example") + f_len(2, root_der) + f_var(3, 2))
put("server_responses", b"\x04" + f_len(1, f_len(1, "e1") + f_len(2, svid)) + f_len(1, f_len(1, "e2") + f_var(3, 7) + f_len(4, "denied")))

# ---- renewal over mTLS from a ledger row ---------------------------------------------------
def renewal(prov, path, row_dns, flags, entry=("e1", "spiffe://cluster.local/ns/default/sa/web",
            "spiffe://cluster.local/signet/node/n1", "web.default.svc"), nb=NOW - 600, na=NOW + 3000, now=NOW, ttl=600):
    head = struct.pack("<qqqqB", nb, na, now, ttl, flags)
    return head + "\n".join([json.dumps(prov) if prov is not None else "", path, row_dns, *entry]).encode()
sa = {"source": {"kind": "service_account", "namespace": "default", "service_account": "web"}, "authorized_at": NOW - 60}
en = {"source": {"kind": "entry", "entry_id": "e1", "node_id": "n1"}, "authorized_at": NOW - 60}
for prov, flags in [(sa, 0), (en, 6), (en, 14), (en, 2), (en, 7), ({"source": {"kind": "admin"}, "authorized_at": NOW}, 0),
                    ({"source": {"kind": "impersonated", "impersonator": "spiffe://cluster.local/ns/istio-system/sa/ztunnel"}, "authorized_at": NOW}, 0),
                    ({"source": {"kind": "bridge", "bridge": "b", "namespace": "default"}, "authorized_at": NOW}, 0),
                    ({"source": {"kind": "node", "node_id": "n1", "attestation": "join_token"}, "authorized_at": NOW}, 0),
                    ({"source": {"kind": "server"}, "authorized_at": NOW, "renewed_from": "0a"}, 0), (None, 0), (sa, 16), (sa, 32)]:
    put("renewal", renewal(prov, "/ns/default/sa/web", "web.default.svc,other.example", flags))
put("renewal", renewal(sa, "/ns/default/sa/web", "", 0, nb=-(1 << 62), na=(1 << 62)))
put("renewal", renewal(en, "/ns/default/sa/web", "web.default.svc", 6, ttl=-1))
put("renewal", renewal(sa, "/ns/default/sa/web", "", 0, now=NOW + 10 * 86400))

# ---- ledger rows ---------------------------------------------------------------------------
def row(nb, na, issued, lines): return struct.pack("<qqq", nb, na, issued) + "\n".join(lines).encode()
r1 = ["0a1b", "spiffe://cluster.local/ns/default/sa/web", "web.default.svc", "", "der-1", "root-1", "jwt:spiffe://cluster.local/ns/default/sa/web", "req-1", json.dumps(sa)]
put("ledger", row(NOW, NOW + 3600, NOW, r1) + b"\xff" + row(NOW, NOW + 3600, NOW, r1[:8] + [""]))
put("ledger", row(NOW, NOW + 3600, NOW, r1) + b"\xff" + row(NOW, NOW + 3600, NOW, r1[:2] + ["", "web.default.svc"] + r1[4:]))
put("ledger", row(NOW, NOW + 3600, NOW, r1) + b"\xff" + row(NOW, NOW + 3600, NOW, r1[:2] + ["a,b", ""] + r1[4:]))
put("ledger", row(-1, 1 << 62, 0, ["", "", "", "", "", "", "", "", ""]))

# ---- ledger checkpoints (signed with the fuzz target's fixed key: seed 32 x 0x07) -------------
def checkpoint(seq, h, time, prev=None, td="example.org", fmt=None, tamper=None):
    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([7]) * 32)
    spki = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    version = "v1" if prev is None else "v2"
    stmt = ("signet-ledger-checkpoint-%s\0" % version).encode() + struct.pack(">Q", len(td)) + td.encode()
    stmt += struct.pack(">Q", seq) + h + struct.pack(">q", time)
    if prev is not None: stmt += struct.pack(">Q", prev[0]) + prev[1]
    doc = {"format": fmt or "signet-ledger-checkpoint-" + version, "trust_domain": td, "seq": seq, "hash": h.hex(), "time": time}
    if prev is not None: doc.update(previous_seq=prev[0], previous_hash=prev[1].hex())
    doc.update(key_id=hashlib.sha256(spki).hexdigest(), signature=key.sign(stmt).hex())
    if tamper: tamper(doc)
    return json.dumps(doc, separators=(",", ":"))
Z = bytes(32)
put("checkpoint", checkpoint(42, bytes([0xab]) * 32, NOW))
put("checkpoint", checkpoint(42, bytes([0xab]) * 32, NOW, prev=(40, bytes([0xcd]) * 32)))
put("checkpoint", checkpoint(0, Z, NOW, prev=(0, Z)))
put("checkpoint", checkpoint(7, bytes([1]) * 32, NOW, prev=(7, bytes([1]) * 32)))
put("checkpoint", checkpoint(7, bytes([1]) * 32, NOW, prev=(9, bytes([1]) * 32)))
put("checkpoint", checkpoint(7, bytes([1]) * 32, NOW, prev=(3, bytes([2]) * 32), fmt="signet-ledger-checkpoint-v1"))
put("checkpoint", checkpoint(7, bytes([1]) * 32, NOW, tamper=lambda d: d.update(previous_seq=1)))
put("checkpoint", checkpoint(7, bytes([1]) * 32, NOW, prev=(3, bytes([2]) * 32), tamper=lambda d: d.pop("previous_hash")))
put("checkpoint", checkpoint(7, bytes([1]) * 32, NOW, prev=(3, bytes([2]) * 32), tamper=lambda d: d.update(seq=8)))
put("checkpoint", checkpoint(2**64 - 1, bytes([0xff]) * 32, -(2**63), prev=(2**64 - 2, Z), td="x" * 300))
print("seeds written to", CORPUS)
