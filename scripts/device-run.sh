#!/usr/bin/env bash
# One device call: GPU tests, compute-sanitizer, CLI runs and benches from target/gpu-bundle
# (build it with `cargo xtask gpu-bundle`). Usage on the GPU host, from the repository root:
#   OUT=<log dir> bash scripts/device-run.sh [tests] [sanitize] [cli] [timeline] [ab] [stress] [bench] [dram] [mgpu] [fuzz]   (default: all but mgpu and fuzz)
# fuzz: `warpline fuzz` over FUZZ_SEEDS seeds (default 2000) x 200 ops on 3 threads from FUZZ_START (default 0), fuzz.log.
# One log per section under $OUT: tests.log sanitize.log cli.log timeline.log ab.log stress.log bench.log dram.log mgpu.log;
# timeline also writes the issue-12 pictures and traces (*.png, *.svg, *.json), ab writes ab.json.
# mgpu needs 2 GPUs (nvidia-h200-x2); NVLS stays off in every process it starts (NCCL_NVLS_ENABLE=0).
set -uo pipefail
B=target/gpu-bundle
OUT=${OUT:-./device-logs}; mkdir -p "$OUT"
export WARPLINE_BIN="$PWD/$B/warpline" PATH=$PATH:/usr/local/cuda/bin
# On a GPU host a skipped GPU test is a failure; failures make this script exit non-zero.
export WARPLINE_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0
failed=0
export PTXAS=${PTXAS:-$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)}
sections=${*:-tests sanitize cli timeline ab stress bench dram}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
san() { # tool, then the command; prints the summary lines
  timeout 300 compute-sanitizer --tool "$1" --print-limit 5 "${@:2}" 2>&1 | grep -E "test result|verified|SUMMARY|Error" | head -8
}
for s in $sections; do case $s in
tests)
  for t in $B/tests/*; do
    echo "== $t"; timeout 300 "$t" --test-threads=1 --nocapture > "$OUT/last-test.log" 2>&1; rc=$?
    grep -E "^test |test result|panicked|runs|worst" "$OUT/last-test.log"
    if [ $rc -ne 0 ]; then echo "FAILED: $t exited $rc"; failed=1; fi
  done > "$OUT/tests.log" 2>&1; rm -f "$OUT/last-test.log" ;;
sanitize)
  # memcheck, racecheck, synccheck and initcheck over every kernel (scripts/sanitize.sh).
  BUNDLE=$B bash scripts/sanitize.sh > "$OUT/sanitize.log" 2>&1 || failed=1 ;;
cli)
  { $B/warpline pipeline --streams 3 --batches 16 --batch-elems 16777216 --verify --compare-one-stream || failed=1
    for c in 2 4; do $B/warpline gemm --tiles 4096 --cluster $c || failed=1; done; } > "$OUT/cli.log" 2>&1 ;;
timeline)
  # Issue 12 pictures: Chrome traces (open in ui.perfetto.dev) and timelines of the pipeline (the
  # "done means" command; its default splits the last 2 batches in 4), the plain pipeline, gemm
  # --streams and the ordering demo.
  P="$B/warpline --seed 12"
  { $P pipeline --streams 3 --batches 16 --batch-elems 16777216 --trace "$OUT/pipeline.json" --timeline "$OUT/pipeline.png" || failed=1
    $P pipeline --streams 3 --batches 16 --batch-elems 16777216 --timeline "$OUT/pipeline.svg" || failed=1
    $P pipeline --streams 3 --batches 16 --batch-elems 16777216 --tail-batches 0 --trace "$OUT/pipeline-plain.json" --timeline "$OUT/pipeline-plain.png" || failed=1
    $P gemm --tiles 4096 --cluster 2 --streams 3 --reps 5 --trace "$OUT/gemm-streams.json" --timeline "$OUT/gemm-streams.png" || failed=1
    $P ordering-demo --runs 2 --trace "$OUT/ordering.json" --timeline "$OUT/ordering.png" || failed=1
    $P ordering-demo --runs 2 --json > "$OUT/ordering-demo.json" || failed=1
  } > "$OUT/timeline.log" 2>&1 ;;
ab)
  # Issue 12 speed A/B, one run: default pipeline, tail splits, stream priorities and the CUDA C++
  # pattern, 5 runs each (median), each x 1.5 pinned H2D and x the C++ pattern.
  $B/warpline --seed 12 pipeline --streams 3 --batches 16 --batch-elems 16777216 --ab --json > "$OUT/ab.json" 2> "$OUT/ab.log" || failed=1 ;;
stress)
  for c in 1 unset; do for l in LAZY EAGER; do
    echo "== stress CUDA_DEVICE_MAX_CONNECTIONS=$c CUDA_MODULE_LOADING=$l"
    ( [ $c = unset ] && unset CUDA_DEVICE_MAX_CONNECTIONS || export CUDA_DEVICE_MAX_CONNECTIONS=$c
      export CUDA_MODULE_LOADING=$l; timeout 300 $B/warpline stress --seed 42 --progress ) 2>&1 | grep -v "^stress:" || failed=1
  done; done > "$OUT/stress.log" 2>&1 ;;
fuzz)
  timeout 590 $B/warpline fuzz --seeds "${FUZZ_SEEDS:-2000}" --start-seed "${FUZZ_START:-0}" --ops 200 --threads 3 \
    --progress > "$OUT/fuzz.log" 2>&1 || failed=1 ;;
bench)
  for b in $B/benches/*; do echo "== $b"; timeout 300 "$b" --bench 2>&1 | grep -v "^Benchmarking\|^$"; done > "$OUT/bench.log" 2>&1 ;;
mgpu)
  # Safety rule of the shared machines: NVLink multicast stays off in every process.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 WARPLINE_REQUIRE_GPUS=2
  { nvidia-smi topo -m
    $B/warpline mgpu info || failed=1
    for t in multi_gpu ordering_multi multi_gpu_issue24; do echo "== tests $t"; timeout 300 $B/tests/$t --test-threads=1 --nocapture 2>&1 | grep -E "^test |test result|panicked|SKIPPED" || failed=1; done
    timeout 300 $B/warpline mgpu seeds --runs 200 || failed=1
    timeout 300 $B/warpline mgpu peer-bw || failed=1
    timeout 300 $B/warpline mgpu allreduce || failed=1
    timeout 300 $B/warpline mgpu allreduce --procs 2 || failed=1
    echo "== the previous collectives path (nonblocking communicator, issue 24 comparison)"
    WARPLINE_NCCL_COLLECTIVES=nonblocking timeout 300 $B/warpline mgpu allreduce --procs 2 || failed=1
    timeout 300 $B/warpline mgpu dp-step || failed=1
    # Issue 13 graphs: eager vs CUDA-graph replay of each GPU's compute (NCCL outside), checked.
    timeout 300 $B/warpline mgpu dp-step --graphs --verify || failed=1
    timeout 300 $B/warpline --json mgpu dp-step --graphs --verify > "$OUT/dp-step-graphs.json" || failed=1
    timeout 300 $B/warpline mgpu pipeline --verify || failed=1
    # Issue 13 graphs: the layer pipeline eager vs per-GPU graph replay (peer copy outside), checked.
    timeout 300 $B/warpline mgpu pipeline --graphs --verify || failed=1
    timeout 300 $B/warpline --json mgpu pipeline --graphs --verify > "$OUT/pipeline-graphs.json" || failed=1
    echo "== torch references (same run)"; timeout 300 python3 scripts/torch_mgpu.py || true
  } > "$OUT/mgpu.log" 2>&1 ;;
dram)
  for k in "cluster --cluster 2" "plain"; do
    echo "== ncu $k"; timeout 200 ncu --metrics dram__bytes_read.sum,gpu__time_duration.sum $B/warpline gemm --tiles 4096 --kernel $k --once --no-verify 2>&1 | grep -E "dram__|gpu__time"
  done > "$OUT/dram.log" 2>&1 ;;
esac; echo "section $s done"; done
# Sanitizer runs that report errors or hazards also count as failures.
if grep -qE "ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]" "$OUT/sanitize.log" 2>/dev/null; then
  echo "FAILED: compute-sanitizer reported errors (see sanitize.log)"; failed=1
fi
exit $failed
