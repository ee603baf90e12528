#!/usr/bin/env bash
# Device run for PDL (issue 4) and stream ordering (issue 5): all GPU tests, sanitizers, pdl bench.
set -uo pipefail
B=target/gpu-bundle; OUT=${OUT:-./device-logs}; mkdir -p "$OUT"
export WARPLINE_BIN="$PWD/$B/warpline" PATH=$PATH:/usr/local/cuda/bin
{
  for t in $B/tests/*; do echo "== $t"; timeout 240 "$t" --test-threads=1 --nocapture 2>&1 | grep -E "^test |test result|panicked|runs|worst|completion|SKIPPED|assert|left|right" | head -40; done
} > "$OUT/all-tests.log" 2>&1
{
  export WARPLINE_PDL_ITERS=50
  for tool in memcheck racecheck synccheck; do
    echo "== $tool pdl"; timeout 150 compute-sanitizer --tool $tool --print-limit 5 $B/tests/pdl --test-threads=1 --skip early_trigger 2>&1 | grep -E "test result|SUMMARY|Error|hazard" | head -8
  done
  for tool in memcheck synccheck; do
    echo "== $tool ordering"; timeout 150 compute-sanitizer --tool $tool --print-limit 5 $B/tests/ordering --test-threads=1 device_side u32_signal fence_tickets 2>&1 | grep -E "test result|SUMMARY|Error" | head -8
  done
} > "$OUT/sanitize2.log" 2>&1
timeout 200 $B/benches/pdl --bench > "$OUT/pdl-bench.log" 2>&1
