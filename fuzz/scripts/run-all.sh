#!/usr/bin/env bash
# Runs every fuzz target in turn (one fuzzer at a time, at the lowest priority), each for RUNS
# executions or SECONDS seconds, whichever comes first, and prints executions and exec/s per
# target. Then minimizes each corpus: a greedy set cover of the coverage edges
# (-set_cover_merge=1 -use_counters=0), which keeps it at a few hundred files where
# `cargo fuzz cmin` keeps thousands. Run from fuzz/:
#   scripts/run-all.sh [RUNS] [SECONDS] [TARGET...]
# EXTRA="-use_value_profile=1" adds libFuzzer flags. Needs cargo-fuzz (`cargo install
# cargo-fuzz`); RUSTC_BOOTSTRAP=1 lets it run on a stable toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-10000000}
SECS=${2:-1200}
shift 2 || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
    mapfile -t TARGETS < <(cargo fuzz list)
fi
export RUSTC_BOOTSTRAP=1
FLAGS=(--sanitizer none --debug-assertions)
# shellcheck disable=SC2206
EXTRA_FLAGS=(${EXTRA:-})
nice -n 19 cargo fuzz build "${FLAGS[@]}"
BIN=target/x86_64-unknown-linux-gnu/release
mkdir -p logs
for t in "${TARGETS[@]}"; do
    mkdir -p "corpus/$t"
    nice -n 19 cargo fuzz run "${FLAGS[@]}" "$t" "corpus/$t" -- \
        -runs="$RUNS" -max_total_time="$SECS" -print_final_stats=1 -timeout=10 -rss_limit_mb=1024 \
        "${EXTRA_FLAGS[@]}" >"logs/$t.log" 2>&1 ||
        { echo "$t: FAILED (see fuzz/logs/$t.log and fuzz/artifacts/$t)"; continue; }
    execs=$(awk '/stat::number_of_executed_units:/ {print $2}' "logs/$t.log")
    rate=$(awk '/stat::average_exec_per_sec:/ {print $2}' "logs/$t.log")
    min=$(mktemp -d)
    nice -n 19 "$BIN/$t" -set_cover_merge=1 -use_counters=0 "$min" "corpus/$t" >"logs/$t.min.log" 2>&1
    rm -rf "corpus/$t" && mv "$min" "corpus/$t" && chmod 755 "corpus/$t"
    echo "$t: ${execs} executions, ${rate} exec/s, corpus $(find "corpus/$t" -type f | wc -l) files"
done
