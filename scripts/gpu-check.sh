#!/usr/bin/env bash
# The GPU check: one prepared script for a GPU machine that has the NVIDIA driver and the CUDA
# Python wheels (NVRTC, cuBLAS) but no Rust toolchain. It builds nothing there: it takes the
# release binary built on a CPU machine and writes JSON results under $OUT.
#
#   bash scripts/gpu-check.sh --bundle          # on the CPU machine: target/gpu-bundle/ (stripped binary, ~24 MB)
#   OUT=/tmp/out bash scripts/gpu-check.sh      # on the GPU machine, from the repository root
#
# Environment: OUT (results; default target/gpu-check), DELTASCOPE (the binary; default
# target/gpu-bundle/deltascope, else target/release/deltascope).
#
# What it runs today, in order, each step's output under $OUT:
#   1. the machine's CUDA libraries: nvidia-smi, ldconfig, the CUDA wheels' lib folders
#      (added to LD_LIBRARY_PATH)                                  → libraries.txt
#   2. deltascope gpu info --json (driver, NVRTC, cuBLAS(Lt), GPUs) → gpu-info.json
#   3. deltascope gpu kernels for the GPU's architecture with its NVRTC → kernels.json
#   4. deltascope gpu check --json: every kernel on random inputs at the real shapes against
#      its CPU twin (src/model/cuda/twins.rs)                     → kernel-parity.json
#   5. NOT BUILT YET: full-model parity, the two-device split, decode / prefill speed and MTP
#      speed-up (they need the CUDA engine, which does not run models yet). The script says
#      so and exits 3.
# Exit: 0 all ran, 1 no GPU (one line saying why), 2 a step failed (a kernel off its twin
# included), 3 incomplete (step 5).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [ "${1:-}" = "--bundle" ]; then
  set -e
  (cd "$ROOT" && cargo build --release)
  mkdir -p "$ROOT/target/gpu-bundle"
  cp "$ROOT/target/release/deltascope" "$ROOT/target/gpu-bundle/deltascope"
  strip "$ROOT/target/gpu-bundle/deltascope"
  ls -la "$ROOT/target/gpu-bundle/deltascope"
  exit 0
fi

OUT=${OUT:-$ROOT/target/gpu-check}
mkdir -p "$OUT"
DS=${DELTASCOPE:-}
if [ -z "$DS" ]; then
  if [ -x "$ROOT/target/gpu-bundle/deltascope" ]; then DS=$ROOT/target/gpu-bundle/deltascope; else DS=$ROOT/target/release/deltascope; fi
fi
[ -x "$DS" ] || { echo "gpu-check: no deltascope binary at $DS (run scripts/gpu-check.sh --bundle on a machine with Rust)" >&2; exit 2; }

step() { echo "== $*"; }

step "1. CUDA libraries on this machine"
{
  echo "# nvidia-smi"; nvidia-smi 2>&1 || echo "(nvidia-smi not found)"
  echo "# ldconfig"; ldconfig -p 2>/dev/null | grep -E 'libcuda|libnvrtc|libcublas|libnccl' || echo "(none in the loader cache)"
  echo "# Python CUDA wheels"
  for py in python3 python; do
    command -v "$py" >/dev/null || continue
    "$py" - <<'PY' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for lib in sorted(glob.glob(os.path.join(r, "nvidia", "**", "lib"), recursive=True)):
        print(lib, " ".join(sorted(os.listdir(lib))))
PY
    break
  done
} > "$OUT/libraries.txt" 2>&1
cat "$OUT/libraries.txt"
# The wheels' libraries (NVRTC, cuBLAS) go on the loader path; the driver is the system's.
WHEEL_LIBS=$(grep -E '^/.*/nvidia/.*/lib ' "$OUT/libraries.txt" | cut -d' ' -f1 | tr '\n' ':')
export LD_LIBRARY_PATH="${WHEEL_LIBS}${LD_LIBRARY_PATH:-}"

step "2. deltascope gpu info"
if ! "$DS" gpu info --json > "$OUT/gpu-info.json" 2> "$OUT/gpu-info.err"; then
  cat "$OUT/gpu-info.json" "$OUT/gpu-info.err"
  echo "gpu-check: $(sed -e 's/^error: //' "$OUT/gpu-info.err" | head -1)"
  exit 1
fi
cat "$OUT/gpu-info.json"
ARCH=$(python3 -c 'import json,sys; g=json.load(open(sys.argv[1]))["gpus"][0]["compute_capability"]; print(f"sm_{g[0]}{g[1]}")' "$OUT/gpu-info.json" 2>/dev/null || echo sm_90)

step "3. deltascope gpu kernels --arch $ARCH (this machine's NVRTC)"
if ! "$DS" gpu kernels --arch "$ARCH" --json --no-cache > "$OUT/kernels.json" 2> "$OUT/kernels.err"; then
  cat "$OUT/kernels.err"
  exit 2
fi
cat "$OUT/kernels.json"

step "4. deltascope gpu check (kernel-by-kernel parity against the CPU twins)"
"$DS" gpu check --json > "$OUT/kernel-parity.json" 2> "$OUT/kernel-parity.err"
status=$?
cat "$OUT/kernel-parity.json" "$OUT/kernel-parity.err"
[ "$status" -eq 0 ] || exit 2

step "5. model parity, two-device split, speed, MTP"
echo "gpu-check: incomplete: kernel parity, model parity, the two-device split and the speed runs need the CUDA engine, which does not run models yet"
exit 3
