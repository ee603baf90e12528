#!/usr/bin/env bash
# Device run for the cluster GEMM (issue 3) plus vector-add racecheck. Logs under $OUT.
set -uo pipefail
B=target/gpu-bundle; OUT=${OUT:-./device-logs}; mkdir -p "$OUT"
export WARPLINE_BIN="$PWD/$B/warpline" PATH=$PATH:/usr/local/cuda/bin
{
  echo "== gemm tests"; timeout 150 $B/tests/gemm --test-threads=1 2>&1 | tail -30
  echo "== racecheck vector_add"; timeout 120 compute-sanitizer --tool racecheck --print-limit 5 $B/tests/vector_add --test-threads=1 any_persistent 2>&1 | tail -6
} > "$OUT/gemm-tests.log" 2>&1
{
  for k in cluster plain; do for tool in memcheck racecheck synccheck; do
    echo "== $tool $k"; timeout 120 compute-sanitizer --tool $tool --print-limit 5 $B/warpline gemm --tiles 64 --cluster 4 --kernel $k --once 2>&1 | tail -6
  done; done
  for k in cluster plain; do
    echo "== ncu $k"; timeout 120 ncu --metrics dram__bytes_read.sum,gpu__time_duration.sum $B/warpline gemm --tiles 4096 --cluster 4 --kernel $k --once --no-verify 2>&1 | grep -E "dram__|gpu__time|gemm|==PROF==|rror" | head -8
  done
} > "$OUT/gemm-sanitize.log" 2>&1
{
  for c in 2 4; do timeout 120 $B/warpline gemm --tiles 4096 --cluster $c 2>&1 | tail -12; done
  timeout 200 $B/benches/gemm --bench 2>&1 | grep -v "^Benchmarking\|^$\|outlier\|mild\|severe\|Warning"
} > "$OUT/gemm-bench.log" 2>&1
