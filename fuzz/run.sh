#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs fuzz targets for a number of executions each and prints libFuzzer's final counts.
#   fuzz/run.sh [RUNS] [TARGET ...]     (default: 10000000 runs of descriptor result pdu capsule kv kv_command lock docker accelfs)
# Needs the nightly toolchain and cargo-fuzz (cargo install cargo-fuzz). The corpus grows
# in fuzz/corpus/TARGET, starting from the committed seeds in fuzz/seeds/TARGET; a crash
# leaves its input in fuzz/artifacts/TARGET and makes this script fail.
set -euo pipefail
cd "$(dirname "$0")"
runs=${1:-10000000}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(descriptor result pdu capsule kv kv_command lock docker accelfs)
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    # The parsers run under AddressSanitizer. The capsule target (safe code over a whole
    # target, ~100x slower per input) runs without one, so that millions of executions
    # fit in minutes: bounds checks still turn any overrun into a crash.
    sanitizer=address
    [ "$t" = capsule ] && sanitizer=none
    start=$(date +%s)
    cargo +nightly fuzz run -O --sanitizer "$sanitizer" "$t" "corpus/$t" "seeds/$t" -- -runs="$runs" -print_final_stats=1 -jobs=1 -workers=1 2> "corpus/$t.log" || {
        tail -40 "corpus/$t.log"; echo "$t: FAILED (see fuzz/artifacts/$t)"; exit 1; }
    secs=$(( $(date +%s) - start ))
    execs=$(grep -m1 'stat::number_of_executed_units' "corpus/$t.log" | awk '{print $2}')
    echo "$t: $execs executions in ${secs}s ($(( execs / (secs > 0 ? secs : 1) ))/s), corpus $(ls "corpus/$t" | wc -l) inputs, no crash"
done
