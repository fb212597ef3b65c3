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
#   5. deltascope gpu parity --json on the demo model and the three fixtures: the CUDA model
#      against the CPU engine at --dtype bf16 (prefill and decode logits within 3 % of the
#      row's largest logit, greedy output identical for >= 64 tokens, MTP greedy at depth 1-3
#      identical to plain, a two-device layer split (two streams on this GPU) equal to one
#      device)                                                      → model-parity-*.json
#   6. deltascope synth --like tests/data/qwen3_6_27b (random weights of the real shapes, bf16,
#      MTP head) into $SYNTH (default /dev/shm/ds-synth-27b), then deltascope bench
#      --device cuda: decode and prefill at 512 tokens with --mtp 0,1,2,3, prefill at 4096
#                                                                   → bench-512.json, bench-4096.json
#   7. summary.json: decode tok/s at batch 1 against the HBM limit (the GPU's bandwidth from
#      its spec sheet over the bytes of weights a token reads), prefill tok/s, MTP speed-up.
# Each step runs under a timeout so the whole script ends within 8 minutes.
# Exit: 0 all ran and passed, 1 no GPU (one line saying why), 2 a step failed (a kernel off
# its twin, a model off the CPU engine, a run that did not finish).
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

failed=0

step "5. deltascope gpu parity (the CUDA model against the CPU engine, bf16)"
for m in demo tests/fixtures/qwen3_5_text tests/fixtures/qwen3_5_moe tests/fixtures/qwen3_next; do
  name=$(basename "$m")
  if [ "$m" = demo ]; then model=demo; else model=$ROOT/$m; fi
  timeout 120 "$DS" gpu parity --model "$model" --json > "$OUT/model-parity-$name.json" 2> "$OUT/model-parity-$name.err"
  st=$?
  cat "$OUT/model-parity-$name.json" "$OUT/model-parity-$name.err"
  [ "$st" -eq 0 ] || { echo "gpu-check: model parity failed on $name (exit $st)"; failed=1; }
done

step "6. synthetic Qwen3.6-27B: decode / prefill speed and MTP on --device cuda"
SYNTH=${SYNTH:-/dev/shm/ds-synth-27b}
rm -rf "$SYNTH"
if timeout 200 "$DS" synth --like "$ROOT/tests/data/qwen3_6_27b" --out "$SYNTH" --dtype bf16 --mtp > "$OUT/synth.txt" 2>&1; then
  cat "$OUT/synth.txt"
  timeout 150 "$DS" bench --model "$SYNTH" --device cuda --prompt-len 512 --max-tokens 128 --mtp 0,1,2,3 --warmup 1 --repeat 2 --json \
    > "$OUT/bench-512.json" 2> "$OUT/bench-512.err" || { cat "$OUT/bench-512.err"; echo "gpu-check: bench at 512 failed"; failed=1; }
  timeout 90 "$DS" bench --model "$SYNTH" --device cuda --prompt-len 4096 --max-tokens 8 --mtp 0 --warmup 0 --repeat 1 --json \
    > "$OUT/bench-4096.json" 2> "$OUT/bench-4096.err" || { cat "$OUT/bench-4096.err"; echo "gpu-check: bench at 4096 failed"; failed=1; }
else
  cat "$OUT/synth.txt"; echo "gpu-check: synth failed"; failed=1
fi
rm -rf "$SYNTH"

step "7. summary"
python3 - "$OUT" <<'PY' | tee "$OUT/summary.json"
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except Exception as e:
        return {"error": f"{name}: {e}"}
info, b512, b4096 = load("gpu-info.json"), load("bench-512.json"), load("bench-4096.json")
name = (info.get("gpus") or [{}])[0].get("name", "")
# Spec-sheet HBM bandwidth (not measured here): H200 4.8 TB/s, H100 SXM 3.35 TB/s.
spec = 4.8e12 if "H200" in name else 3.35e12 if "H100" in name else None
weights = b512.get("load", {}).get("weights_bytes")
rows = {r.get("mtp"): r for r in b512.get("rows", [])}
def med(r, k):
    v = (r or {}).get(k)
    return v.get("median") if isinstance(v, dict) else v
tg = med(rows.get("0"), "decode_tok_s")
limit = spec / weights if spec and weights else None
print(json.dumps({
    "gpu": name, "weights_bytes": weights, "hbm_spec_bytes_per_s": spec,
    "decode_tok_s_mtp0": tg, "decode_limit_tok_s": limit,
    "share_of_limit": (tg / limit) if tg and limit else None,
    "prefill_tok_s_512": med(rows.get("0"), "prefill_tok_s"),
    "prefill_tok_s_4096": med(({r.get("mtp"): r for r in b4096.get("rows", [])}).get("0"), "prefill_tok_s"),
    "mtp_speedup": {k: med(v, "speedup") for k, v in rows.items() if k != "0"},
    "parity": {f: load(f).get("pass") for f in sorted(os.listdir(out)) if f.startswith("model-parity-") and f.endswith(".json")},
}, indent=2))
PY
[ "$failed" -eq 0 ] || exit 2
exit 0
