#!/usr/bin/env bash
# Install NVRTC (the CUDA run-time compiler) from PyPI, pinned, for the tests that compile
# kernels/*.cu without a GPU or a CUDA toolkit. Idempotent; the warm path is a file check.
#
#   bash scripts/setup-nvrtc.sh
#
# Environment:
#   DELTASCOPE_NVRTC_DIR  where to install   (default: target/nvrtc)
#   PYTHON                interpreter for the venv that runs pip (default: python3)
#
# On success it prints one line, last: NVRTC_LIB_DIR=<absolute dir holding libnvrtc.so.13>
# (put it on LD_LIBRARY_PATH). On failure: the reason and the log's tail on stderr, exit 1.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${DELTASCOPE_NVRTC_DIR:-$ROOT/target/nvrtc}
PYTHON=${PYTHON:-python3}
# NVRTC 13.4 (PTX ISA 9.4): the newest whose CUBINs cudarc's cuda-13040 bindings load.
PIN=nvidia-cuda-nvrtc==13.4.92
case $DIR in /*) ;; *) DIR=$PWD/$DIR ;; esac
TARGET=$DIR/${PIN#*==}
LIB=$TARGET/nvidia/cu13/lib

mkdir -p "$DIR"
LOG=$(mktemp "${TMPDIR:-/tmp}/deltascope-nvrtc.XXXXXX")
trap 'rm -f "$LOG"' EXIT
fail() {
  echo "setup-nvrtc.sh: $*" >&2
  if [ -s "$LOG" ]; then echo "---- last lines of the log ----" >&2; tail -n 30 "$LOG" >&2; fi
  exit 1
}

# Tests may run this concurrently: serialise on a lock.
exec 9>"$DIR.lock"
flock 9 || fail "cannot lock $DIR.lock"

if [ ! -e "$LIB/libnvrtc.so.13" ]; then
  if [ ! -x "$DIR/venv/bin/python" ]; then
    "$PYTHON" -m venv "$DIR/venv" >>"$LOG" 2>&1 || fail "cannot create a venv with $PYTHON (python3-venv missing?)"
  fi
  rm -rf "$TARGET.partial"
  # --target into a fresh directory: pip will not merge into an existing nvidia/ tree.
  "$DIR/venv/bin/python" -m pip install -q --no-deps --target "$TARGET.partial" "$PIN" >>"$LOG" 2>&1 \
    || fail "pip install $PIN failed"
  [ -e "$TARGET.partial/nvidia/cu13/lib/libnvrtc.so.13" ] || fail "$PIN has no nvidia/cu13/lib/libnvrtc.so.13"
  rm -rf "$TARGET"
  mv "$TARGET.partial" "$TARGET"
fi
# cudarc looks for libnvrtc.so before the versioned names.
[ -e "$LIB/libnvrtc.so" ] || ln -s libnvrtc.so.13 "$LIB/libnvrtc.so"
echo "NVRTC_LIB_DIR=$LIB"
