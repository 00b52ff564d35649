#!/usr/bin/env bash
# Runs every fuzz target in turn (one fuzzer at a time, at the lowest priority), each for RUNS
# executions or SECONDS seconds, whichever comes first, and prints executions and exec/s per
# target. Then minimizes each corpus (cargo fuzz cmin). Run from fuzz/:
#   scripts/run-all.sh [RUNS] [SECONDS] [TARGET...]
# Needs cargo-fuzz (`cargo install cargo-fuzz`); RUSTC_BOOTSTRAP=1 lets it run on stable.
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
nice -n 19 cargo fuzz build "${FLAGS[@]}"
mkdir -p logs
for t in "${TARGETS[@]}"; do
    mkdir -p "corpus/$t"
    nice -n 19 cargo fuzz run "${FLAGS[@]}" "$t" "corpus/$t" -- \
        -runs="$RUNS" -max_total_time="$SECS" -print_final_stats=1 -timeout=10 -rss_limit_mb=1024 \
        >"logs/$t.log" 2>&1 || { echo "$t: FAILED (see fuzz/logs/$t.log and fuzz/artifacts/$t)"; continue; }
    execs=$(awk '/stat::number_of_executed_units:/ {print $2}' "logs/$t.log")
    rate=$(awk '/stat::average_exec_per_sec:/ {print $2}' "logs/$t.log")
    nice -n 19 cargo fuzz cmin "${FLAGS[@]}" "$t" "corpus/$t" >"logs/$t.cmin.log" 2>&1 || true
    echo "$t: ${execs} executions, ${rate} exec/s, corpus $(ls "corpus/$t" | wc -l) files"
done
