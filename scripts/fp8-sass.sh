#!/usr/bin/env bash
# SASS check of the FP8 GEMM (issue 20): assembles the sm_90a module with ptxas for sm_90a and
# checks, with cuobjdump, that each FP8 entry (tc_gemm_e4m3_bcol, tc_gemm_e4m3_e5m2_bcol,
# tc_gemm_e4m3_bcol_pingpong, tc_gemm_e4m3_bcol_block_scaled) holds
# QGMMA (the SASS of `wgmma ... .e4m3` / `.e5m2`) and no HGMMA (16-bit wgmma). No GPU needed.
#
# Usage: bash scripts/fp8-sass.sh [module.ptx]
#   module.ptx: default target/ptx-sm90a/warpline_gpu.ptx (`cargo xtask build-ptx` writes it).
# Tools: $PTXAS, else the pinned ptxas of `cargo xtask setup`
# (~/.cache/warpline/cuda-nvcc-13.0.88/nvidia/cu13/bin/ptxas), else ptxas on PATH;
# $CUOBJDUMP, else cuobjdump on PATH, else ~/.cache/warpline/cuda-tools/nvidia/cu13/bin/cuobjdump.
# cuobjdump needs nvdisasm beside it or on PATH. INSTALL=1 installs both from PyPI
# (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm) into ~/.cache/warpline/cuda-tools first.
# Prints one line per entry (`<entry>: N QGMMA, 0 HGMMA`, e.g. `QGMMA.64x256x32.F32.E4M3.E4M3`)
# and `fp8-sass: OK`; exits 1 when an entry lacks QGMMA or has HGMMA, 2 when a tool is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ptx=${1:-target/ptx-sm90a/warpline_gpu.ptx}
tools=$HOME/.cache/warpline/cuda-tools
if [[ ${INSTALL:-0} == 1 ]]; then
  python3 -m pip install --quiet --no-deps --target "$tools" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
  chmod +x "$tools"/nvidia/cu13/bin/* 2>/dev/null || true
fi
ptxas=${PTXAS:-$HOME/.cache/warpline/cuda-nvcc-13.0.88/nvidia/cu13/bin/ptxas}
[[ -x $ptxas ]] || ptxas=$(command -v ptxas || true)
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || echo "$tools/nvidia/cu13/bin/cuobjdump")}
for t in "$ptxas" "$cuobjdump"; do
  [[ -n $t && -x $t ]] || { echo "fp8-sass: missing tool ${t:-ptxas} (set PTXAS/CUOBJDUMP, or INSTALL=1)"; exit 2; }
done
[[ -f $ptx ]] || { echo "fp8-sass: no module $ptx (run cargo xtask build-ptx)"; exit 2; }
export PATH="$(dirname "$cuobjdump"):$PATH" # nvdisasm beside cuobjdump
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$ptxas" -arch=sm_90a -o "$work/sm90a.cubin" "$ptx"
rc=0
for entry in tc_gemm_e4m3_bcol tc_gemm_e4m3_e5m2_bcol tc_gemm_e4m3_bcol_pingpong tc_gemm_e4m3_bcol_block_scaled; do
  "$cuobjdump" -sass -fun "$entry" "$work/sm90a.cubin" > "$work/$entry.sass"
  q=$(grep -c 'QGMMA' "$work/$entry.sass" || true)
  h=$(grep -c 'HGMMA' "$work/$entry.sass" || true)
  first=$(grep -o 'QGMMA\.[A-Z0-9x.]*' "$work/$entry.sass" | head -1 || true)
  echo "$entry: $q QGMMA, $h HGMMA ${first:+(e.g. $first)}"
  if [[ $q -eq 0 || $h -ne 0 ]]; then rc=1; fi
done
if [[ $rc -eq 0 ]]; then echo "fp8-sass: OK"; else echo "fp8-sass: FAILED"; fi
exit $rc
