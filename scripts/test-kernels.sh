#!/usr/bin/env bash
# The tests whose assertions are generated text or numeric agreement, once under every CPU kernel
# family this machine runs (DELTASCOPE_CPU_KERNEL=portable|avx2|avx512|avx512_bf16|amx) other than
# the best one, which `cargo test --release` (the README's test command) has just run them
# under. An AMX Xeon runs all five families, an AVX512_BF16 EPYC four, an AVX2 EPYC two: what
# passes here passes with the arithmetic of every machine kind.
#
#   bash scripts/test-kernels.sh            # every family this CPU runs but the best
#   bash scripts/test-kernels.sh portable   # just these
#
# The set: the demo's graded held-out questions and README examples (tests/demo.rs), serve's
# examples, the budget matrix, the MTP lossless checks, the generation loop's decisions, the
# engine invariants, the transformers reference tolerances, the state-trace tolerances (CPU
# against the emulated device, a scaled projection still caught), the CLI's examples, and the
# unit tests of every crate (the CPU kernels' own among them). About 3 minutes a kernel on 2
# cores (portable, the slowest).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --quiet
bin=target/release/deltascope
best=$("$bin" inspect --json | sed -n 's/^ *"cpu_kernel": "\([a-z0-9_]*\)".*/\1/p')
[ -n "$best" ] || { echo "test-kernels: cannot tell the best CPU kernel (inspect --json has no cpu_kernel)" >&2; exit 1; }

wanted=("$@")
if [ ${#wanted[@]} -eq 0 ]; then
  wanted=(portable avx2 avx512 avx512_bf16 amx)
fi
ran=()
for k in "${wanted[@]}"; do
  if ! refusal=$(DELTASCOPE_CPU_KERNEL=$k "$bin" inspect 2>&1 >/dev/null); then
    if [ $# -gt 0 ]; then
      echo "test-kernels: $refusal" >&2
      exit 1
    fi
    echo "== $k: not on this CPU (${refusal#error: })"
    continue
  fi
  if [ $# -eq 0 ] && [ "$k" = "$best" ]; then
    echo "== $k: this CPU's best, run by cargo test --release"
    continue
  fi
  echo "== DELTASCOPE_CPU_KERNEL=$k"
  export DELTASCOPE_CPU_KERNEL=$k
  # Every crate's unit tests (the model's kernels, the engine's loop, the protocol's tally; the
  # top crate's take a second).
  cargo test --release --no-fail-fast --lib
  # The demo's graded held-out questions and the README's examples (its other accuracy figures,
  # the memory heads and thinking off, run under the best kernel only: the CI's 40 minutes).
  cargo test --release --no-fail-fast --test demo -- \
    answers_held_out_problems_with_thinking_and_drafts_well every_readme_example_is_right
  # MTP: greedy speculation equals plain greedy, and every per-token decision holds at every
  # depth (the sampled distribution test is statistical, not lossless: best kernel only).
  cargo test --release --no-fail-fast --test mtp -- greedy_speculation loop_decisions
  cargo test --release --no-fail-fast \
    --test serve --test budget_matrix --test generation --test invariants \
    --test reference --test state_trace --test nonfinite --test cli
  # GGUF: the quantised GEMV's sums and the engine on a GGUF against its dequantised f32 copy,
  # the three judges and the same-bytes verdicts.
  cargo test --release --no-fail-fast --test gguf_model
  # The state trace against the emulated device at the tolerance derived from both traces, and a
  # scaled projection still caught. (`gpu parity` on the demo, 66 s a kernel, runs under the
  # best kernel only; its CPU side is the engine checked against transformers in tests/reference.rs.)
  cargo test --release --no-fail-fast --test emu_device -- \
    the_state_trace_on_the_emulated_device_agrees_with_the_cpu_engine \
    a_scaled_gdn_projection_diverges_from_the_emulated_device
  unset DELTASCOPE_CPU_KERNEL
  ran+=("$k")
done
echo "== test-kernels: passed under ${ran[*]:-no other kernel} (and $best in the full run)"
