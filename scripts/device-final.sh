#!/usr/bin/env bash
# Device run after merging: ordering tests, GEMM tests/bench after tuning, sanitizers of the GEMM.
set -uo pipefail
B=target/gpu-bundle; OUT=${OUT:-./device-logs}; mkdir -p "$OUT"
export WARPLINE_BIN="$PWD/$B/warpline" PATH=$PATH:/usr/local/cuda/bin
{
  for t in ordering gemm pdl vector_add pipeline validation cli; do echo "== $t"; timeout 200 $B/tests/$t --test-threads=1 --nocapture 2>&1 | grep -E "^test |test result|panicked|runs|worst|complet|Err" | head -30; done
} > "$OUT/final-tests.log" 2>&1
{
  for tool in memcheck racecheck synccheck; do echo "== $tool gemm cluster"; timeout 100 compute-sanitizer --tool $tool --print-limit 3 $B/warpline gemm --tiles 64 --cluster 2 --kernel cluster --once 2>&1 | grep -E "SUMMARY|verified|rror" | head -4; done
  for tool in memcheck synccheck; do echo "== $tool ordering"; timeout 150 compute-sanitizer --tool $tool --print-limit 3 $B/tests/ordering --test-threads=1 device_side u32_signal fence_tickets two_waits 2>&1 | grep -E "test result|SUMMARY" | head -4; done
} > "$OUT/final-sanitize.log" 2>&1
{ for c in 2 4; do timeout 100 $B/warpline gemm --tiles 4096 --cluster $c 2>&1 | tail -6; done; timeout 150 $B/benches/gemm --bench 2>&1 | grep -E "^ +[0-9]+ " ; } > "$OUT/final-gemm.log" 2>&1
{ export WARPLINE_PDL_ITERS=50; for tool in racecheck synccheck; do echo "== $tool pdl"; timeout 120 compute-sanitizer --tool $tool --print-limit 3 $B/tests/pdl --test-threads=1 --skip early_trigger 2>&1 | grep -E "test result|SUMMARY|Error" | head -4; done; } > "$OUT/final-pdl-sanitize.log" 2>&1
timeout 100 $B/benches/vector_add --bench 2>&1 | tail -5 > "$OUT/final-vadd.log"
