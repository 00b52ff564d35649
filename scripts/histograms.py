"""Quantiles of the server's latency histograms over one bench phase.

    python3 scripts/histograms.py BEFORE AFTER

BEFORE and AFTER are two scrapes of the server's Prometheus /metrics (the text format); the
difference of their buckets is what happened in between. Prints, for the time from request to
committed certificate, the duration of one ledger transaction (its fsync included) and the
rows per transaction: the count, the mean and the p50/p99 as bucket upper bounds (a quantile
is at most that). Used by scripts/bench to say where the latency of a run went.
"""
import re
import sys

WANTED = {
    "signet_issuance_duration_seconds": ("issuance (request to commit)", 1e3, "ms"),
    "signet_ledger_commit_duration_seconds": ("ledger transaction", 1e3, "ms"),
    "signet_ledger_batch_size": ("rows per transaction", 1, ""),
}
LINE = re.compile(r'^(\w+?)(_bucket|_sum|_count)(\{[^}]*\})?\s+(\S+)')


def read(path):
    """{metric: {"buckets": {le: count summed over labels}, "sum": s, "count": n}}"""
    out = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m or m.group(1) not in WANTED:
                continue
            h = out.setdefault(m.group(1), {"buckets": {}, "sum": 0.0, "count": 0.0})
            value = float(m.group(4))
            if m.group(2) == "_bucket":
                le = re.search(r'le="([^"]+)"', m.group(3) or "")
                if le:
                    key = float(le.group(1))
                    h["buckets"][key] = h["buckets"].get(key, 0.0) + value
            elif m.group(2) == "_sum":
                h["sum"] += value
            else:
                h["count"] += value
    return out


def quantile(buckets, n, q):
    """The upper bound of the first bucket holding the q-quantile (cumulative buckets)."""
    for le in sorted(buckets):
        if buckets[le] >= q * n:
            return le
    return float("inf")


def main():
    before, after = read(sys.argv[1]), read(sys.argv[2])
    for name, (label, scale, unit) in WANTED.items():
        a = after.get(name)
        if not a:
            continue
        b = before.get(name, {"buckets": {}, "sum": 0.0, "count": 0.0})
        n = a["count"] - b["count"]
        if n <= 0:
            continue
        buckets = {le: c - b["buckets"].get(le, 0.0) for le, c in a["buckets"].items()}
        mean = (a["sum"] - b["sum"]) / n
        fmt = lambda v: "+Inf" if v == float("inf") else f"{v * scale:.3g}{unit}"
        print(
            f"  {label:30} n={n:.0f}  mean {fmt(mean)}  p50 <= {fmt(quantile(buckets, n, 0.5))}"
            f"  p99 <= {fmt(quantile(buckets, n, 0.99))}"
        )


if __name__ == "__main__":
    main()
