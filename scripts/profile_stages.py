#!/usr/bin/env python3
"""Per-stage instruction counts of a callgrind profile of issuance (scripts/profile).

    scripts/profile_stages.py CALLGRIND_OUT ISSUED [--top N]

Every function is put in at most one stage by the first pattern its name matches (STAGES). A
function in a stage counts its own (self) instructions there; the self cost of a function in no
stage (ring's field arithmetic, the allocator, memcpy, core and std) is shared among its callers
in proportion to what each call cost, and so on up the call graph, until it reaches a staged
function; what reaches none (the tokio runtime, thread wake-ups, a cycle) is "rest". So the
stages add up to the total exactly, and e.g. ECDSA verification lands in JWT, CSR or self-check
by who called it. Costs are user-space instructions (Ir) of the server process only: the
kernel's TCP and fsync work and PostgreSQL's own process are not in it. `--top N` also lists the N functions with the
largest self cost, with their stage.
"""

import re
import sys
from collections import defaultdict

# (stage, pattern on the demangled function name), first match wins. Order matters where a
# crate's generic code is instantiated inside ours (e.g. tonic's codec for our protos).
STAGES = [
    ("metrics/logging", r"^<?&?(tracing|tracing_core|tracing_subscriber|tracing_log|metrics|metrics_util|prometheus_client|prometheus)::"
     r"|signet_server::(metrics|audit)::|signet_runtime::telemetry|^<?signet_server::metrics"),
    ("JWT", r"signet_server::authn::jwt::|^<?jsonwebtoken::"),
    ("CSR parse + verify", r"signet_server::ca::csr::"),
    ("policy", r"signet_server::policy::|signet_server::limits::"),
    ("sign (template + ECDSA)", r"signet_server::ca::template::|^<?rcgen::|signet_server::ca::authority::Authority::sign"),
    ("self-check", r"signet_server::ca::validate::|signet_server::ca::issue::self_check"),
    ("ledger (writer, store, sqlx)", r"signet_server::ledger::|signet_server::store::|^<?&?sqlx|^<?sqlx_postgres|signet_types::ledger::"),
    ("TLS", r"^<?&?(rustls|tokio_rustls)::|^<?rustls::|ring::aead|ring_core_0_17_14__aes|ring_core_0_17_14__gcm|ring_core_0_17_14__chacha"),
    ("HTTP/2 + gRPC", r"^<?&?(h2|hyper|hyper_util|tonic|tower|tower_layer|tower_service|http|http_body|http_body_util|prost|prost_types|axum|signet_proto)::"
     r"|signet_server::api::|signet_server::limits::layer|signet_server::server::"),
    ("issuance flow (issuer, PEM answer)", r"signet_server::issuer::|signet_types::pem::"),
]
COMPILED = [(name, re.compile(p)) for name, p in STAGES]


def parse(path):
    """Self cost per function id, call edges (caller, callee) -> inclusive Ir, names, total."""
    names = {}
    self_cost = defaultdict(int)
    edges = defaultdict(int)
    total = None
    cur = None
    callee = None
    pending_call = False

    def name_of(spec):
        m = re.match(r"\((\d+)\)(?:\s+(.*))?$", spec)
        if not m:
            names[spec] = spec
            return spec
        fid = int(m.group(1))
        if m.group(2) is not None:
            names[fid] = m.group(2)
        return fid

    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                parts = line.split()
                if len(parts) < 2:
                    continue
                ir = int(parts[1])
                if pending_call:
                    if callee != cur:
                        edges[(cur, callee)] += ir
                    pending_call = False
                else:
                    self_cost[cur] += ir
                continue
            if line.startswith("fn="):
                cur = name_of(line[3:])
            elif line.startswith("cfn="):
                callee = name_of(line[4:])
            elif line.startswith("calls="):
                pending_call = True
            elif line.startswith("summary:") or line.startswith("totals:"):
                total = int(line.split()[1])
    if total is None:
        total = sum(self_cost.values())
    return names, self_cost, edges, total


def stage_of(name):
    for stage, rx in COMPILED:
        if rx.search(name):
            return stage
    return None


def main():
    args = sys.argv[1:]
    top = 0
    if "--top" in args:
        i = args.index("--top")
        top = int(args[i + 1])
        del args[i : i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    path, issued = args[0], int(args[1])
    names, self_cost, edges, total = parse(path)
    stage = {fid: stage_of(str(n)) for fid, n in names.items()}
    callers = defaultdict(list)
    for (a, b), ir in edges.items():
        if ir > 0:
            callers[b].append((a, ir))
    sys.setrecursionlimit(100000)
    memo = {}

    def dist(fid):
        """Where fid's instructions go: {stage or None: fraction}."""
        s = stage.get(fid)
        if s is not None:
            return {s: 1.0}
        if fid in memo:
            return memo[fid]
        memo[fid] = {None: 1.0}  # a cycle back here counts as rest
        cs = callers.get(fid)
        if not cs:
            return memo[fid]
        total_ir = sum(ir for _, ir in cs)
        out = defaultdict(float)
        for c, ir in cs:
            for k, v in dist(c).items():
                out[k] += v * ir / total_ir
        memo[fid] = dict(out)
        return memo[fid]

    cost = defaultdict(float)
    for fid, ir in self_cost.items():
        for k, v in dist(fid).items():
            cost[k] += v * ir
    per = lambda ir: ir / max(issued, 1)
    print(f"{issued} issuances, {total:,} instructions in the server: {per(total):,.0f} per issuance")
    print(f"{'stage':38} {'Ir/issuance':>12} {'share':>7}")
    rest = total - sum(cost[s] for s, _ in STAGES)
    for s, _ in STAGES:
        print(f"{s:38} {per(cost[s]):>12,.0f} {100 * cost[s] / total:>6.1f}%")
    print(f"{'rest (runtime, allocator, wake-ups)':38} {per(rest):>12,.0f} {100 * rest / total:>6.1f}%")
    if top:
        print(f"\ntop {top} functions by self cost:")
        for fid, ir in sorted(self_cost.items(), key=lambda x: -x[1])[:top]:
            print(f"{per(ir):>10,.0f} {100 * ir / total:>5.1f}%  [{stage.get(fid) or 'rest'}] {str(names.get(fid, fid))[:150]}")


if __name__ == "__main__":
    main()
