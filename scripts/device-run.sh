#!/usr/bin/env bash
# One device call: GPU tests, compute-sanitizer, CLI and benches from target/gpu-bundle.
# Usage on the GPU host: OUT=<log dir> bash scripts/device-run.sh [sections...]
# Sections: tests sanitize cli bench (default: all). Logs: $OUT/{tests,sanitize,cli,bench}.log
set -uo pipefail
B=target/gpu-bundle
OUT=${OUT:-./device-logs}; mkdir -p "$OUT"
export WARPLINE_BIN="$PWD/$B/warpline"
export PTXAS=${PTXAS:-$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)}
export PATH=$PATH:/usr/local/cuda/bin
sections=${*:-tests sanitize cli bench}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
for s in $sections; do case $s in
tests)
  for t in $B/tests/*; do echo "== $t"; timeout 300 "$t" --test-threads=1 2>&1 | grep -v "^test .* ok$"; echo "rc=$?"; done > "$OUT/tests.log" 2>&1 ;;
sanitize)
  for tool in memcheck racecheck synccheck; do
    for t in ${SANITIZE_TESTS:-"vector_add any_persistent" "pipeline pipeline_matches"}; do
      set -- $t
      echo "== $tool $1 $2"; timeout 240 compute-sanitizer --tool $tool --print-limit 20 $B/tests/$1 --test-threads=1 $2 2>&1 | tail -8
    done
  done > "$OUT/sanitize.log" 2>&1 ;;
cli)
  { $B/warpline pipeline --streams 3 --batches 16 --batch-elems 16777216 --verify --compare-one-stream 2>&1; } > "$OUT/cli.log" ;;
bench)
  for b in $B/benches/*; do echo "== $b"; timeout 240 "$b" --bench 2>&1 | grep -v "^Benchmarking\|^$" ; done > "$OUT/bench.log" 2>&1 ;;
esac; echo "section $s done"; done
