#!/usr/bin/env bash
# Install the official `openai` Python client from PyPI, pinned, into a venv for the tests of
# `deltascope serve` (tests/serve.rs), with NumPy for the independent state-trace reference
# (tests/state_trace.rs). Idempotent; the warm path is a file check.
#
#   bash scripts/setup-openai.sh
#
# Environment: DELTASCOPE_OPENAI_DIR (default target/openai-venv), PYTHON (default python3).
# On success it prints one line, last: OPENAI_PYTHON=<the venv's python>.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${DELTASCOPE_OPENAI_DIR:-$ROOT/target/openai-venv}
PYTHON=${PYTHON:-python3}
PIN=openai==3.60.0
NUMPY=numpy==2.3.5
case $DIR in /*) ;; *) DIR=$PWD/$DIR ;; esac
mkdir -p "$(dirname "$DIR")"
LOG=$(mktemp "${TMPDIR:-/tmp}/deltascope-openai.XXXXXX")
trap 'rm -f "$LOG"' EXIT
fail() {
  echo "setup-openai.sh: $*" >&2
  if [ -s "$LOG" ]; then echo "---- last lines of the log ----" >&2; tail -n 30 "$LOG" >&2; fi
  exit 1
}
# Tests may run this concurrently: serialise on a lock.
exec 9>"$DIR.lock"
flock 9 || fail "cannot lock $DIR.lock"
STAMP=$DIR/.installed-${PIN#*==}-numpy-${NUMPY#*==}
if [ ! -e "$STAMP" ]; then
  rm -rf "$DIR"
  "$PYTHON" -m venv "$DIR" >>"$LOG" 2>&1 || fail "cannot create a venv with $PYTHON (python3-venv missing?)"
  "$DIR/bin/python" -m pip install --disable-pip-version-check -q "$PIN" "$NUMPY" >>"$LOG" 2>&1 \
    || fail "pip install $PIN $NUMPY failed"
  "$DIR/bin/python" -c 'import openai, numpy' >>"$LOG" 2>&1 || fail "openai or numpy does not import after the install"
  touch "$STAMP"
fi
echo "OPENAI_PYTHON=$DIR/bin/python"
