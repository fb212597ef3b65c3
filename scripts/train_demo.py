#!/usr/bin/env python3
"""Train deltascope's embedded demo model: a tiny Qwen3.5-architecture reasoning model.

It writes models/demo/ — a real Hugging Face checkpoint (qwen3_5_text config, GDN and gated
attention layers 3 : 1, tied embeddings, an MTP module with the tensor names of the published
checkpoints), a byte-level BPE tokenizer with the Qwen special tokens, the Qwen3.5 chat template
and generation_config.json — plus heldout.jsonl, the problems the tests grade it on.

The corpus is synthetic and uses the real chat format:
    <|im_start|>user\\n…<|im_end|>\\n<|im_start|>assistant\\n<think>\\n…\\n</think>\\n\\n…<|im_end|>
Tasks whose thinking grows with difficulty: primality by trial division, column addition,
digit-by-digit multiplication, counting a letter in a word, sorting by repeated minimum, and
comparing numbers. A share of examples uses enable_thinking=false (the template's empty think
block) and answers directly; another share cuts the thinking short with Qwen's budget-forcing
sentence, so the model knows how to answer when a thinking budget runs out.

The MTP module (mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.layers.0.*,
mtp.norm) is trained to predict the token after next from the main model's final hidden state and
the next token's embedding, exactly as vLLM / SGLang run it (model-spec §6).

v5 (what ships) is v4 fine-tuned by phases H and I below (sorting's slips), v4 is v3 fine-tuned by
phases D-G; v3 is the v2 model committed at BASE_COMMIT —
trained from scratch by this script as it was at that commit — fine-tuned here by phases A-C:
  * a memory task: "Remember the code 4821." then 40–80 unrelated words, or two to four unrelated
    questions and answers, then "What was the code?". Four GDN heads (LONG_HEADS) are made
    long-memory heads first (half-life ≈ 380 tokens, silent at the start), and in most memory
    examples the attention layers see only the last 32 tokens, so the code has to travel in
    the recurrent state — what the State view shows;
  * comparisons with equal leading digits and sorts of three close numbers over-represented;
  * three phases: A (every task and the memory task), B (more multiplication and sorting), C
    (sorting at 45 %, 40 % of it four or five numbers around a misleading pair: 19 vs 23);
  * a held-out set of 630 problems (90 per task) with its own seed, which training never draws;
  * then (v4) phases D-G, in which every memory example hides from the question — and everything
    after it — each token from the code's first digit up to the question (MEMORY_HIDDEN), so only
    the GDN state can carry the code (a window leaves attention a relay through the tokens in
    between): D a curriculum of code lengths and distractors with the memory task at 70 %
    (PHASE_D_CURRICULUM), E, F and G every task back (PHASE_E/F/G_SHARES);
  * then (v5) phases H and I, sorting at 45-50 % around the pairs v4 compared wrongly
    (`mixed_sort_numbers`, `tricky_sort_numbers`), memory still hidden.

Set-up (CPU only, run from the repository root, in a git checkout: the base weights are read
with `git show`):

    python3 -m venv .venv-demo
    .venv-demo/bin/pip install torch==2.15.0 transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0 numpy
    .venv-demo/bin/python scripts/train_demo.py                 # writes models/demo (and training.json)
    .venv-demo/bin/python scripts/train_demo.py --check models/demo   # retrain, compare bit for bit

Deterministic under --seed with the same library versions and thread count (training.json
records both, and the CPU); --check says which differ when the bits do.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import random
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import safetensors
import tokenizers
import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers
from safetensors.torch import load as safetensors_load
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "models" / "demo"
TEMPLATE = ROOT / "scripts" / "templates" / "qwen3_5.jinja"

# v3 is v2 (the model committed at BASE_COMMIT, trained from scratch by this script as it was
# then) fine-tuned by this script: new tasks' data, long-memory heads, a fresh held-out set.
BASE_COMMIT = "8d4ee253ebd89ad63186f325706ad8572e2a016e"
HELDOUT_SEED = 3800  # the held-out problems' own stream; training never draws one of them
HELDOUT_N = 630  # 90 per task
THREADS = 2  # part of what makes a run repeatable
# (layer, value head) made long-memory heads before fine-tuning: in each of four GDN layers the head
# whose silencing cost v2 least on this corpus (measured once: loss 0.806 → 0.79–0.83; layer 0's
# heads all matter, 0.89–1.12).
LONG_HEADS = [(1, 3), (2, 2), (5, 1), (6, 3)]
# Most memory examples (MEMORY_WINDOWED_SHARE) let the attention layers see only the last
# ATTN_WINDOW tokens, so the code has to travel in the Gated-DeltaNet state; the rest see
# everything, as at inference.
ATTN_WINDOW = 32
MEMORY_WINDOWED_SHARE = 0.75
# Phases D and E hide instead, in every memory example, the whole stretch from the code's first
# digit up to the final question from the attention of the question and what follows it (a
# window leaves attention a relay: tokens between the code and the question see the code, and the
# question sees them). Only the GDN state can then bring the code to the question.
MEMORY_HIDDEN = False
# The memory task's shape: the code's digits, the distractor's words (one-message form) and the
# unrelated turns (conversation form). Phase D's curriculum changes it; held-out problems use this.
MEMORY_SHAPE = (4, (40, 80), (2, 4))

BUDGET_BRIDGE = "\n\nConsidering the limited time by the user, I have to give the solution based on the thinking directly now.\n"

# ------------------------------------------------------------------------------------------------
# Tasks. Each returns (question, thinking, answer, check) where `check` is the string the graded
# answer must contain.

PRIMES = [2, 3, 5, 7, 11, 13, 17]


def task_prime(rng: random.Random):
    n = rng.randint(2, 200)
    q = rng.choice(["Is {n} prime?", "Is {n} a prime number?", "Is {n} a prime?"]).format(n=n)
    lines = [f"Check divisors up to the square root of {n}."]
    divisor = None
    for p in PRIMES:
        if p * p > n:
            lines.append(f"{p} × {p} = {p * p} > {n}, so stop.")
            break
        lines.append(f"{n} ÷ {p} = {n // p} r {n % p}")
        if n % p == 0:
            divisor = p
            break
    if divisor is None:
        lines.append("No divisor found.")
        return q, "\n".join(lines), f"Yes, {n} is prime.", f"Yes, {n} is prime"
    lines.append(f"{divisor} divides {n}.")
    ans = f"No, {n} = {divisor} × {n // divisor}, so {n} is not prime."
    return q, "\n".join(lines), ans, f"{n} is not prime"


PLACES = ["ones", "tens", "hundreds"]


def place_digits(n: int) -> str:
    """`450 = 4 hundreds, 5 tens, 0 ones`: every digit with its place name, so a column step
    finds its digits by the name (an index hint) instead of by counting positions back from the
    end of a number in the question (where the previous model picked wrong digits)."""
    s = str(n)
    return f"{n} = " + ", ".join(f"{d} {PLACES[len(s) - 1 - i]}" for i, d in enumerate(s))


def task_add(rng: random.Random):
    a = rng.randint(0, 10 ** rng.randint(1, 3) - 1)
    b = rng.randint(0, 10 ** rng.randint(1, 3) - 1)
    q = rng.choice(["What is {a} + {b}?", "Compute {a} + {b}.", "{a} + {b} = ?"]).format(a=a, b=b)
    da, db = str(a)[::-1], str(b)[::-1]
    width = max(len(da), len(db))
    lines = ["Add column by column from the right.", place_digits(a), place_digits(b)]
    carry = 0
    so_far = ""
    for i in range(width):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        t = x + y
        s = t + carry
        # One fact per step (as in multiplication): the column's sum, then the carry added.
        expr = f"{PLACES[i]}: {x} + {y} = {t}" + (f", {t} + {carry} = {s}" if carry else "")
        # The digits written so far end every line, so the result is copied from one line
        # instead of gathered backwards from every column (where carries used to go wrong).
        if i == width - 1:
            so_far = f"{s}{so_far}"
            lines.append(f"{expr}, write {s}, so far {so_far}")
        else:
            so_far = f"{s % 10}{so_far}"
            lines.append(f"{expr}, write {s % 10}" + (f", carry {s // 10}" if s >= 10 else "") + f", so far {so_far}")
        carry = s // 10
    lines.append(f"Result: {a + b}")
    return q, "\n".join(lines), f"{a} + {b} = {a + b}.", f"= {a + b}."


def task_mul(rng: random.Random):
    a = rng.randint(2, 99)
    b = rng.randint(2, 9)
    q = rng.choice(["What is {a} * {b}?", "Compute {a} * {b}.", "{a} * {b} = ?"]).format(a=a, b=b)
    da = str(a)[::-1]
    lines = ["Multiply digit by digit from the right.", place_digits(a)]
    carry = 0
    so_far = ""
    for i, d in enumerate(da):
        m = int(d) * b
        p = m + carry
        # One fact per step: the table product, then the carry added; the digits so far last.
        expr = f"{PLACES[i]}: {d} × {b} = {m}" + (f", {m} + {carry} = {p}" if carry else "")
        if i == len(da) - 1:
            so_far = f"{p}{so_far}"
            lines.append(f"{expr}, write {p}, so far {so_far}")
        else:
            so_far = f"{p % 10}{so_far}"
            lines.append(f"{expr}, write {p % 10}" + (f", carry {p // 10}" if p >= 10 else "") + f", so far {so_far}")
        carry = p // 10
    lines.append(f"Result: {a * b}")
    return q, "\n".join(lines), f"{a} * {b} = {a * b}.", f"= {a * b}."


WORDS = """apple banana cherry grape lemon mango melon orange peach pear plum berry strawberry
blueberry raspberry coconut tomato potato carrot pepper onion garlic ginger butter bread cheese
coffee sugar honey water river ocean island mountain valley forest desert jungle meadow garden
flower rose tulip daisy lily orchid cactus bamboo willow maple cedar pine oak birch spruce
tiger lion zebra giraffe monkey rabbit turtle dolphin whale shark eagle falcon parrot penguin
kitten puppy horse donkey camel llama panda koala beaver otter badger ferret hamster squirrel
house window door kitchen bedroom mirror pillow blanket carpet ladder bucket basket bottle
pencil paper letter number puzzle riddle question answer problem summer winter autumn spring
morning evening midnight sunrise sunset thunder lightning rainbow cloud breeze storm snowflake
planet rocket comet galaxy meteor orbit station engine bridge tunnel street village castle
kingdom dragon wizard knight hammer anvil lantern candle compass anchor sailor pirate treasure
mission balloon bubble pebble marble crystal diamond silver copper bronze purple yellow
scarlet violet crimson indigo lavender emerald turquoise magenta elephant hippopotamus
alligator crocodile butterfly mosquito grasshopper caterpillar ladybug dragonfly mississippi
banana committee success accessory bookkeeper balloon tennessee assessment cinnamon occasion
necessary embarrass millennium vacuum broccoli spaghetti zucchini teammate parallel referee
""".split()
WORDS = sorted(set(w for w in WORDS if len(w) <= 12))


def task_count(rng: random.Random):
    w = rng.choice(WORDS)
    c = rng.choice(w) if rng.random() < 0.85 else rng.choice("abcdefghijklmnopqrstuvwxyz")
    q = rng.choice(["How many {c} are in {w}?", "How many times does {c} appear in {w}?",
                    "Count the letter {c} in {w}."]).format(c=c, w=w)
    lines = [f"Spell {w} and count {c}."]
    k = 0
    for ch in w:
        # Each line compares the letter with the target (restated, so the comparison is local).
        k += ch == c
        lines.append(f"{ch} {'=' if ch == c else '≠'} {c} → {k}")
    lines.append(f"Total: {k}")
    times = "time" if k == 1 else "times"
    return q, "\n".join(lines), f"The letter {c} appears {k} {times} in {w}.", f"appears {k} {times}"


# Phase C's share of sorts built around a misleading pair (see `tricky_sort_numbers`); 0 in
# phases A and B, which then draw exactly what they drew before phase C existed.
SORT_TRICKY = 0.0


def tricky_sort_numbers(rng: random.Random) -> list[int]:
    """Four or five numbers holding a pair whose ones digits order them the wrong way (19 < 23 but
    9 > 3) and a pair with the same tens digit: v3's sorting slips ("b23 < c19 (3 < 9)",
    "a71 = d70") were comparisons of such pairs inside the scan."""
    t = rng.randint(1, 8)
    low = t * 10 + rng.randint(5, 9)  # ones 5–9
    gap = rng.randint(1, 1 if rng.random() < 0.6 else 9 - t)  # mostly the next ten: 19 vs 23
    xs = [low, (t + gap) * 10 + rng.randint(0, 4)]  # ones 0–4: larger, yet smaller ones
    u = rng.randint(1, 9)
    xs += [u * 10 + rng.randint(0, 9), u * 10 + rng.randint(0, 9)]
    if rng.random() < 0.5:
        xs.append(rng.randint(0, 9) if rng.random() < 0.3 else rng.randint(0, 99))
    rng.shuffle(xs)
    return xs


def mixed_sort_numbers(rng: random.Random) -> list[int]:
    """Three to five numbers where one-digit numbers share a digit with two-digit ones (4 and 98,
    8 and 83) and two-digit pairs differ in the tens but mislead in the ones (48 vs 52): v4's
    sorting slips were "a4 > c98 (8 > 8)", "b48 > e52 (8 > 2)" and copies of the list that turned
    83 into a second 8."""
    xs = []
    for _ in range(rng.randint(1, 2)):
        d = rng.randint(0, 9)
        xs += [d, rng.choice([d * 10 + rng.randint(0, 9), rng.randint(1, 9) * 10 + d])]
    if rng.random() < 0.6:
        t = rng.randint(1, 8)
        xs += [t * 10 + rng.randint(5, 9), (t + 1) * 10 + rng.randint(0, 4)]
    xs = xs[:5]
    rng.shuffle(xs)
    return xs


# Phase H's share of sorts drawn by `mixed_sort_numbers`; 0 before it, so phases A-G draw exactly
# what they drew before phase H existed.
SORT_MIXED = 0.0


def task_sort(rng: random.Random):
    if SORT_MIXED and rng.random() < SORT_MIXED:
        xs = mixed_sort_numbers(rng)
    elif SORT_TRICKY and rng.random() < SORT_TRICKY:
        xs = tricky_sort_numbers(rng)
    elif rng.random() < 0.35:
        # Three close numbers ("Sort 47, 43, 54."): the same tens digit or a span under 12, where
        # the previous model compared the wrong pair.
        k = 3
        base = rng.randint(0, 88)
        xs = [base + rng.randint(0, 11) for _ in range(k)] if rng.random() < 0.5 else \
            [(base // 10) * 10 + rng.randint(0, 9) for _ in range(k)]
    else:
        k = rng.randint(2, 5)
        # Single-digit numbers are a tenth of 0–99 but common in questions ("Sort 5, 2, 9, 1."):
        # give them a larger share.
        xs = [rng.randint(0, 9) if rng.random() < 0.3 else rng.randint(0, 99) for _ in range(k)]
    shown = ", ".join(map(str, xs))
    q = rng.choice(["Sort {l}.", "Sort these numbers: {l}.", "Put {l} in increasing order."]).format(l=shown)
    # Each number gets a letter label, so copying the shrinking list never confuses two numbers
    # that share a digit (the copy follows the label, not the ambiguous digit context).
    lines = ["Pick the smallest each time."]
    rest = [f"{chr(97 + i)}{x}" for i, x in enumerate(xs)]
    done: list[str] = []
    while rest:
        # The minimum is found by a scan, one comparison with the smallest so far at a time:
        # picking it among 4–5 numbers in one step was the model's weakest skill.
        m = rest[0]
        steps = []
        for s in rest[1:]:
            x, y = int(m[1:]), int(s[1:])
            step = f"{m} {'>' if y < x else '<' if x < y else '='} {s}"
            # Two numbers with the same tens digit are told apart by their ones, said aloud
            # (close numbers were the old model's wrong comparisons).
            if x != y and x >= 10 and y >= 10 and x // 10 == y // 10:
                step += f" ({x % 10} {'>' if y < x else '<'} {y % 10})"
            steps.append(step)
            if y < x:
                m = s
        done.append(m[1:])
        # The sorted prefix grows line by line, so the answer copies one line instead of
        # gathering the minimum of every line.
        scan = (": " + ", ".join(steps)) if steps else ""
        lines.append(" ".join(rest) + scan + f" → {m}, sorted: " + ", ".join(done))
        rest.remove(m)
    out = ", ".join(map(str, sorted(xs)))
    return q, "\n".join(lines), out, out


def task_compare(rng: random.Random):
    if rng.random() < 0.6:
        # Equal leading digits ("94 or 91", "357 or 352"): the comparison that needs the digit-by-
        # digit walk, and where the previous model copied a wrong digit.
        width = rng.choice([2, 2, 3, 3, 3])
        same = rng.randint(1, width - 1)
        prefix = "".join(str(rng.randint(1 if i == 0 else 0, 9)) for i in range(same))
        x, y = rng.sample(range(10), 2)
        tail = lambda: "".join(str(rng.randint(0, 9)) for _ in range(width - same - 1))
        a, b = int(f"{prefix}{x}{tail()}"), int(f"{prefix}{y}{tail()}")
    else:
        a = rng.randint(0, 10 ** rng.randint(1, 3) - 1)
        b = rng.randint(0, 10 ** rng.randint(1, 3) - 1)
    while b == a:
        b = rng.randint(0, 999)
    q = rng.choice(["Which is larger, {a} or {b}?", "Which number is bigger: {a} or {b}?"]).format(a=a, b=b)
    sa, sb = str(a), str(b)
    lines = [f"{a} has {len(sa)} digits, {b} has {len(sb)} digits."]
    if len(sa) != len(sb):
        lines.append("More digits is larger.")
    else:
        parts = []
        for x, y in zip(sa, sb):
            if x == y:
                parts.append(f"{x} = {y}")
            else:
                parts.append(f"{x} {'>' if x > y else '<'} {y}")
                break
        lines.append("Compare from the left: " + ", ".join(parts) + ".")
    big = max(a, b)
    return q, "\n".join(lines), f"{big} is larger.", f"{big} is larger"


MEMORY_THINKING = "I was asked to remember the code {c}."


def memory_code(rng: random.Random) -> int:
    """A code of MEMORY_SHAPE[0] digits (1000–9999 for four, as the held-out problems have)."""
    n = MEMORY_SHAPE[0]
    return rng.randint(10 ** (n - 1) if n > 1 else 0, 10**n - 1)


def task_memory(rng: random.Random):
    """A code, then 40–80 unrelated words (about 100–200 tokens), then the question: the code
    has to be carried across the words. See `memory_turns` for the conversation form."""
    code = memory_code(rng)
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(*MEMORY_SHAPE[1])))
    q = rng.choice(["Remember the code {c}. Then read: {w}. What was the code?",
                    "Remember the code {c}. Here are some words: {w}. What was the code?"]).format(c=code, w=words)
    return q, MEMORY_THINKING.format(c=code), f"The code was {code}.", f"The code was {code}."


def memory_turns(rng: random.Random):
    """The conversation form of the memory task: "Remember the code 4821." in a first turn, two
    to four unrelated questions and answers, then "What was the code?". Returns (history,
    question, thinking, answer, check)."""
    code = memory_code(rng)
    first = rng.choice(["Remember the code {c}.", "Please remember the code {c}.",
                        "Keep this code in mind: {c}."]).format(c=code)
    hist = [(first, "OK, I will remember it.")]
    for _ in range(rng.randint(*MEMORY_SHAPE[2])):
        q, _, a, _ = TASKS[pick_task(rng, memory=False)][0](rng)
        hist.append((q, a))
    q = rng.choice(["What was the code?", "What was the code I gave you?", "Tell me the code."])
    return hist, q, MEMORY_THINKING.format(c=code), f"The code was {code}.", f"The code was {code}."


TASKS = {
    # Shares follow difficulty (v3 fine-tuning: comparisons and close sorts were the slips).
    "prime": (task_prime, 0.11),
    "add": (task_add, 0.15),
    "mul": (task_mul, 0.12),
    "count": (task_count, 0.12),
    "sort": (task_sort, 0.22),
    "compare": (task_compare, 0.13),
    "memory": (task_memory, 0.15),
}
SYSTEMS = ["You are a helpful assistant.", "Answer briefly.", "You are a careful assistant that thinks step by step."]


def prompt_text(question: str, system: str | None, think: bool, history: list[tuple[str, str]] = ()) -> str:
    """Exactly what the Qwen3.5 chat template renders (checked against transformers at export).
    Earlier turns are (question, answer): the template drops their thinking."""
    s = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    for hq, ha in history:
        s += f"<|im_start|>user\n{hq}<|im_end|>\n<|im_start|>assistant\n{ha}<|im_end|>\n"
    s += f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return s + ("<think>\n" if think else "<think>\n\n</think>\n\n")


# The tasks' shares in the phase being trained (phase A: TASKS' own; phase B: PHASE_B_SHARES).
SHARES = {n: w for n, (_, w) in TASKS.items()}
# Phase B: more of the two tasks phase A left weakest (multiplication's carry added to the tens
# product, sorting's copies and comparisons).
PHASE_B_SHARES = {"prime": 0.08, "add": 0.12, "mul": 0.20, "count": 0.10, "sort": 0.30, "compare": 0.10,
                  "memory": 0.10}
# Phase C: sorting (v3's one task under 39 / 40), a share of it around misleading pairs.
PHASE_C_SHARES = {"prime": 0.06, "add": 0.08, "mul": 0.12, "count": 0.06, "sort": 0.45, "compare": 0.10,
                  "memory": 0.13}
PHASE_C_SORT_TRICKY = 0.4
# Phase D: the memory task at 70 %, its code-to-question stretch hidden from attention, on a
# curriculum (last step, code digits, distractor words, unrelated turns): one digit and a few words
# first — four digits across 40-80 words from the start never leaves chance (measured with
# scripts/demo_memory_experiment.py).
PHASE_D_SHARES = {"prime": 0.04, "add": 0.05, "mul": 0.05, "count": 0.04, "sort": 0.07, "compare": 0.05,
                  "memory": 0.70}
PHASE_D_CURRICULUM = [(150, 1, (2, 10), (1, 1)), (300, 2, (2, 10), (1, 1)), (500, 4, (2, 10), (1, 1)),
                      (650, 4, (10, 30), (1, 2)), (10**9, 4, (30, 80), (1, 4))]
# Phase E: every task again (multiplication and sorting, the slowest to come back, weighted up),
# memory still hidden, distractors from 2 to 80 words.
PHASE_E_SHARES = {"prime": 0.08, "add": 0.12, "mul": 0.20, "count": 0.08, "sort": 0.24, "compare": 0.10,
                  "memory": 0.18}
PHASE_E_CURRICULUM = [(10**9, 4, (2, 80), (1, 4))]
PHASE_E_SORT_TRICKY = 0.2
# Phase F: what E left short (sorting 79 / 90 and primes 86 / 90 on the held-out set after E),
# at a lower rate, memory still hidden.
PHASE_F_SHARES = {"prime": 0.12, "add": 0.08, "mul": 0.12, "count": 0.10, "sort": 0.38, "compare": 0.08,
                  "memory": 0.12}
PHASE_F_SORT_TRICKY = 0.4
# Phase G: after F the held-out set had sorting 84, counting 86, primes 87 and comparisons 88 of
# 90 (copies of a digit or a number gone wrong): a longer, larger-batch pass over those.
PHASE_G_SHARES = {"prime": 0.14, "add": 0.06, "mul": 0.08, "count": 0.14, "sort": 0.34, "compare": 0.14,
                  "memory": 0.10}
PHASE_G_SORT_TRICKY = 0.3
# Phase H: v4 (after G) missed 5 of 90 held-out sorts — one-digit numbers compared by a two-digit
# number's ones ("a4 > c98 (8 > 8)"), different tens compared by the ones ("b48 > e52 (8 > 2)"),
# copies that turned 83 into 8: sorting at 45 %, a third of it `mixed_sort_numbers`, low rate.
PHASE_H_SHARES = {"prime": 0.10, "add": 0.05, "mul": 0.08, "count": 0.08, "sort": 0.45, "compare": 0.12,
                  "memory": 0.12}
PHASE_H_SORT_TRICKY = 0.25
PHASE_H_SORT_MIXED = 0.35
# Phase I: after H sorting was 86 / 90 (prime 90, the rest as before): its misses were ones digits
# compared the wrong way inside a ten ("b43 > c46 (3 > 6)", "b22 > e23 (2 > 3)") and a copy of
# the sorted prefix ("2, 7, 89, 89"): sorting at half, more of the misleading pairs, lower rate.
PHASE_I_SHARES = {"prime": 0.08, "add": 0.06, "mul": 0.08, "count": 0.07, "sort": 0.50, "compare": 0.10,
                  "memory": 0.11}
PHASE_I_SORT_TRICKY = 0.35
PHASE_I_SORT_MIXED = 0.25


@dataclass
class Phase:
    """One fine-tuning phase: its defaults (overridable by --steps-X / --lr-X), the task shares,
    the sort generators' shares, which batch option it uses, whether memory examples hide the
    code-to-question stretch, and the memory task's curriculum."""
    label: str
    steps: int
    lr: float
    shares: dict
    sort_tricky: float
    batch: str  # the argparse option holding its batch: "batch" or "batch_de"
    hidden: bool
    curriculum: list | None
    sort_mixed: float = 0.0

    @property
    def suffix(self) -> str:
        """Phase A's options and recorded keys are the plain ones (--steps, "steps"), as before
        phases had letters."""
        return "" if self.label == "A" else "_" + self.label.lower()


PHASES = [Phase("A", 1100, 8e-4, {n: w for n, (_, w) in TASKS.items()}, 0.0, "batch", False, None),
          Phase("B", 500, 4e-4, PHASE_B_SHARES, 0.0, "batch", False, None),
          Phase("C", 400, 2e-4, PHASE_C_SHARES, PHASE_C_SORT_TRICKY, "batch", False, None),
          Phase("D", 800, 1e-3, PHASE_D_SHARES, PHASE_C_SORT_TRICKY, "batch_de", True, PHASE_D_CURRICULUM),
          Phase("E", 800, 3e-4, PHASE_E_SHARES, PHASE_E_SORT_TRICKY, "batch_de", True, PHASE_E_CURRICULUM),
          Phase("F", 800, 2e-4, PHASE_F_SHARES, PHASE_F_SORT_TRICKY, "batch_de", True, PHASE_E_CURRICULUM),
          Phase("G", 600, 1.5e-4, PHASE_G_SHARES, PHASE_G_SORT_TRICKY, "batch", True, PHASE_E_CURRICULUM),
          Phase("H", 600, 1e-4, PHASE_H_SHARES, PHASE_H_SORT_TRICKY, "batch", True, PHASE_E_CURRICULUM,
                PHASE_H_SORT_MIXED),
          Phase("I", 600, 8e-5, PHASE_I_SHARES, PHASE_I_SORT_TRICKY, "batch", True, PHASE_E_CURRICULUM,
                PHASE_I_SORT_MIXED)]


def pick_task(rng: random.Random, memory: bool = True) -> str:
    names = [n for n in TASKS if memory or n != "memory"]
    return rng.choices(names, weights=[SHARES[n] for n in names])[0]


def make_history(rng: random.Random, share: float) -> list[tuple[str, str]]:
    """Earlier turns of the conversation (none for 1 - share of examples): their questions and
    answers, thinking dropped as the template drops it, so a second question is answered as
    well as a first (the model learns to work on the last question, not an earlier one)."""
    if rng.random() >= share:
        return []
    turns = 1 if rng.random() < 0.85 else 2
    hist = []
    for _ in range(turns):
        q, _, a, _ = TASKS[pick_task(rng, memory=False)][0](rng)
        hist.append((q, a))
    return hist


def draw(rng: random.Random, name: str, second_turn_share: float):
    """One problem of task `name`: (history, question, thinking, answer, check)."""
    if name == "memory" and rng.random() < 0.5:
        return memory_turns(rng)
    q, thinking, answer, check = TASKS[name][0](rng)
    return make_history(rng, second_turn_share), q, thinking, answer, check


def problem_key(history, question: str) -> str:
    """What makes two problems the same: the question (the code's turn for the conversation
    form of the memory task, whose last question is always alike)."""
    return history[0][0] if question in MEMORY_LAST_QUESTIONS and history else question


MEMORY_LAST_QUESTIONS = {"What was the code?", "What was the code I gave you?", "Tell me the code."}
HELD_OUT: set[str] = set()  # problem keys training never draws (filled by main)


def make_example(rng: random.Random) -> tuple[str, str, int]:
    """(prompt, completion, attention) of one training example, never one of the held-out problems.
    `attention`: 1 when the attention layers see only the last ATTN_WINDOW tokens (memory examples,
    most of the time, in phases A-C), 2 when the question may not see the stretch from the code on
    (memory examples in phases D and E), else 0."""
    while True:
        name = pick_task(rng)
        hist, q, thinking, answer, _ = draw(rng, name, 0.3)
        if problem_key(hist, q) not in HELD_OUT:
            break
    system = rng.choice(SYSTEMS) if rng.random() < 0.1 else None
    if name == "memory" and MEMORY_HIDDEN:
        windowed = 2  # the code-to-question stretch hidden (phases D, E)
    else:
        windowed = int(name == "memory" and rng.random() < MEMORY_WINDOWED_SHARE)
    mode = rng.random()
    if mode < 0.15:  # enable_thinking=false: answer directly
        return prompt_text(q, system, False, hist), f"{answer}<|im_end|>", windowed
    if mode < 0.20:  # a thinking budget ran out: cut short, bridge, answer
        lines = thinking.split("\n")
        cut = "\n".join(lines[: rng.randint(1, max(1, len(lines) - 1))])
        return prompt_text(q, system, True, hist), f"{cut}{BUDGET_BRIDGE}</think>\n\n{answer}<|im_end|>", windowed
    return prompt_text(q, system, True, hist), f"{thinking}\n</think>\n\n{answer}<|im_end|>", windowed


# ------------------------------------------------------------------------------------------------
# Tokenizer

PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                  "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
                  "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                  "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
NON_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"}


def build_tokenizer(seed: int, vocab: int) -> Tokenizer:
    rng = random.Random(seed + 1)
    texts = []
    for _ in range(20000):
        p, c, _ = make_example(rng)
        texts.append((p + c).replace("<|im_start|>", "").replace("<|im_end|>", "").replace("<think>", "").replace("</think>", ""))
    tok = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=(t not in NON_SPECIAL), normalized=False) for t in SPECIAL_TOKENS])
    return tok


def write_tokenizer_files(d: Path, tok: Tokenizer):
    tok.save(str(d / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                       "single_word": False, "special": t not in NON_SPECIAL} for t in SPECIAL_TOKENS}
    cfg = {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added, "bos_token": None,
           "chat_template": TEMPLATE.read_text(), "clean_up_tokenization_spaces": False,
           "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 4096, "pad_token": "<|endoftext|>",
           "split_special_tokens": False, "tokenizer_class": "TokenizersBackend", "unk_token": None}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    gen = {"bos_token_id": tok.token_to_id("<|endoftext|>"),
           "eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
           "pad_token_id": tok.token_to_id("<|endoftext|>"),
           # Greedy by default: a 3.5 M-parameter model copying a 4-digit result at T = 0.6
           # sometimes slips a digit, and a first run should show what it learned.
           "do_sample": False,
           "transformers_version": transformers.__version__}
    (d / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


# ------------------------------------------------------------------------------------------------
# Model: transformers' Qwen3.5 text model plus an MTP module with the real checkpoints' layout.

class MTP(nn.Module):
    """mtp.fc / pre_fc_norm_embedding / pre_fc_norm_hidden / layers.0 / norm (model-spec §6.1)."""

    def __init__(self, config: Qwen3_5TextConfig):
        super().__init__()
        c = copy.deepcopy(config)
        c.layer_types = ["full_attention"]
        c.num_hidden_layers = 1
        c._attn_implementation = "sdpa"  # causal without an explicit mask
        self.fc = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(c, 0)])
        self.norm = Qwen3_5RMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def forward(self, next_embeds, hidden, position_embeddings):
        # Embedding first, hidden second (vLLM / SGLang order).
        u = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        u = self.layers[0](u, position_embeddings=position_embeddings, attention_mask=None)
        return self.norm(u)


def model_config(vocab: int) -> Qwen3_5TextConfig:
    return Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=192, num_hidden_layers=8, intermediate_size=512,
        num_attention_heads=4, num_key_value_heads=2, head_dim=48,
        linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, max_position_embeddings=4096, tie_word_embeddings=True, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 2, 2], "mrope_interleaved": True},
    )


class Demo(nn.Module):
    def __init__(self, config):
        super().__init__()
        config._attn_implementation = "sdpa"
        self.lm = Qwen3_5ForCausalLM(config)
        self.mtp = MTP(config)

    def hidden(self, ids, attention=None):
        """The final hidden states. `attention` holds per row (kind, start, question): rows of kind
        1 see only the last ATTN_WINDOW tokens in the attention layers; in rows of kind 2 the
        positions from `question` on do not see [start, question). The GDN layers see everything."""
        if attention is None or not bool(attention[:, 0].any()):
            return self.lm.model(input_ids=ids, use_cache=False).last_hidden_state
        i = torch.arange(ids.shape[1])
        causal = i[None, :] <= i[:, None]
        local = causal & (i[None, :] > i[:, None] - ATTN_WINDOW)
        mask = torch.where(attention[:, 0, None, None, None] == 1, local, causal)
        for r in (attention[:, 0] == 2).nonzero().flatten().tolist():
            start, question = attention[r, 1].item(), attention[r, 2].item()
            mask[r, 0, question:, start:question] = False
        masks = {"full_attention": mask, "linear_attention": None}
        return self.lm.model(input_ids=ids, attention_mask=masks, use_cache=False).last_hidden_state

    def losses(self, ids, loss_mask, attention=None):
        """Next-token loss of the main model and token-after-next loss of the MTP head, both on
        the completion tokens only."""
        h = self.hidden(ids, attention)  # post final norm: what the MTP head consumes
        logits = self.lm.lm_head(h)
        tgt = ids[:, 1:]
        m = loss_mask[:, 1:]
        ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none")
        main = (ce * m.reshape(-1)).sum() / m.sum()
        # MTP entry p: (embedding of x_{p+1}, hidden h_p) → predicts x_{p+2}; positions unchanged.
        pos = torch.arange(ids.shape[1] - 1).unsqueeze(0).expand(ids.shape[0], -1)
        pe = self.lm.model.rotary_emb(h, pos)
        e = self.lm.model.embed_tokens(ids[:, 1:])
        mh = self.mtp(e, h[:, :-1].detach(), pe)
        mlog = self.lm.lm_head(mh)
        tgt2 = ids[:, 2:]
        m2 = loss_mask[:, 2:].clamp(max=1.0)  # the code's digit weight is for the main model
        ce2 = F.cross_entropy(mlog[:, :-1].reshape(-1, mlog.shape[-1]), tgt2.reshape(-1), reduction="none")
        mtp = (ce2 * m2.reshape(-1)).sum() / m2.sum()
        return main, mtp


def init_weights(model: Demo, seed: int):
    """transformers' init (normal 0.02, zero-centred norms at 0, gated norm at 1) plus the GDN
    gate parameters spread over heads, as the HF init does."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(1.0, 16.0, generator=g).log())
            elif name.endswith("dt_bias"):
                p.fill_(1.0)
            elif name.endswith("linear_attn.norm.weight"):
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


# ------------------------------------------------------------------------------------------------
# Data

CODE_AT = re.compile(r"(?:the code|in mind:) (\d+)")
DIGIT_WEIGHT = 4.0  # phases D, E: the completion's copy of the code counts this much in the loss


def memory_stretch(tok: Tokenizer, prompt: str, completion: str):
    """For a memory example: token ids, the loss weights (the completion's first copy of the code
    at DIGIT_WEIGHT) and the hidden stretch [first digit of the code, start of the final question)."""
    p = tok.encode(prompt, add_special_tokens=False)
    c = tok.encode(completion, add_special_tokens=False)
    m = CODE_AT.search(prompt)
    code = m.group(1)
    first = next(i for i, (a, _) in enumerate(p.offsets) if a >= m.start(1))
    q = max(prompt.rfind(x) for x in MEMORY_LAST_QUESTIONS)
    question = next(i for i, (a, _) in enumerate(p.offsets) if a >= q)
    at = completion.find(code)
    weights = [0.0] * len(p.ids) + [DIGIT_WEIGHT if at <= a < at + len(code) else 1.0 for a, _ in c.offsets]
    return p.ids + c.ids, weights, (2, first, question)


def encode_example(tok: Tokenizer, prompt: str, completion: str, attention: int = 0):
    if attention == 2:
        return memory_stretch(tok, prompt, completion)
    p = tok.encode(prompt, add_special_tokens=False).ids
    c = tok.encode(completion, add_special_tokens=False).ids
    return p + c, [0] * len(p) + [1] * len(c), (attention, 0, 0)


def batches(tok: Tokenizer, rng: random.Random, batch: int, pool: int = 16):
    """Length-bucketed batches: draw `pool` batches' worth of examples, sort by length, cut."""
    while True:
        exs = [encode_example(tok, *make_example(rng)) for _ in range(batch * pool)]
        exs.sort(key=lambda e: len(e[0]))
        chunks = [exs[i:i + batch] for i in range(0, len(exs), batch)]
        rng.shuffle(chunks)
        for ch in chunks:
            n = max(len(e[0]) for e in ch)
            ids = torch.zeros(len(ch), n, dtype=torch.long)
            mask = torch.zeros(len(ch), n)
            for i, (x, m, _) in enumerate(ch):
                ids[i, :len(x)] = torch.tensor(x)
                mask[i, :len(m)] = torch.tensor(m, dtype=torch.float)
            yield ids, mask, torch.tensor([list(w) for _, _, w in ch])


# ------------------------------------------------------------------------------------------------
# Evaluation

def heldout_problems(seed: int, n: int):
    """n problems, the tasks in turn, drawn with their own seed (not the training stream's) and
    never drawn in training (HELD_OUT). Every third round of the other tasks is asked as a second
    turn (after an earlier question and its answer), as in a conversation in the workbench; the
    memory task alternates between its one-message and conversation forms."""
    rng = random.Random(seed)
    names = list(TASKS)
    probs = []
    seen = set()
    while len(probs) < n:
        name = names[len(probs) % len(names)]
        r = len(probs) // len(names)
        if name == "memory":
            hist, q, thinking, answer, check = memory_turns(rng) if r % 2 else (
                [], *TASKS[name][0](rng))
        else:
            hist = make_history(rng, 1.0 if r % 3 == 1 else 0.0)[:1]
            q, thinking, answer, check = TASKS[name][0](rng)
        key = problem_key(hist, q)
        if key in seen:  # a problem asked twice would count twice
            continue
        seen.add(key)
        history = [m for hq, ha in hist for m in ({"role": "user", "content": hq},
                                                  {"role": "assistant", "content": ha})]
        probs.append({"task": name, "history": history, "question": q, "expected": check, "answer": answer,
                      "thinking_lines": thinking.count("\n") + 1})
    return probs


def problem_history(p) -> list[tuple[str, str]]:
    h = p["history"]
    return [(h[i]["content"], h[i + 1]["content"]) for i in range(0, len(h), 2)]


@torch.no_grad()
def greedy(model: Demo, tok: Tokenizer, prompts: list[str], max_new: int = 320, stop: int = 0):
    """Plain greedy decoding with the transformers cache, one prompt at a time."""
    outs = []
    for p in prompts:
        ids = torch.tensor([tok.encode(p, add_special_tokens=False).ids])
        gen = model.lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                do_sample=False, eos_token_id=stop, pad_token_id=stop,
                                temperature=None, top_p=None, top_k=None)
        outs.append(gen[0, ids.shape[1]:].tolist())
    return outs


@torch.no_grad()
def mtp_agreement(model: Demo, sequences: list[list[int]]):
    """Greedy one-step drafts: the MTP head's argmax at p vs the actual token at p+2."""
    hit = tot = 0
    for seq in sequences:
        ids = torch.tensor([seq])
        h = model.lm.model(input_ids=ids, use_cache=False).last_hidden_state
        pos = torch.arange(len(seq) - 1).unsqueeze(0)
        pe = model.lm.model.rotary_emb(h, pos)
        mh = model.mtp(model.lm.model.embed_tokens(ids[:, 1:]), h[:, :-1], pe)
        pred = model.lm.lm_head(mh).argmax(-1)[0, :-1]
        hit += (pred == ids[0, 2:]).sum().item()
        tot += len(seq) - 2
    return hit / max(tot, 1)


def evaluate(model: Demo, tok: Tokenizer, probs, label: str, think: bool = True, sample_mtp: bool = True):
    model.eval()
    stop = tok.token_to_id("<|im_end|>")
    prompts = [prompt_text(p["question"], None, think, problem_history(p)) for p in probs]
    outs = greedy(model, tok, prompts, stop=stop)
    by_task: dict[str, list[int]] = {}
    second = []
    seqs = []
    failures = []
    for p, pr, o in zip(probs, prompts, outs):
        text = tok.decode(o, skip_special_tokens=False)
        ans = text.split("</think>")[-1] if think else text
        ok = p["expected"] in ans
        by_task.setdefault(p["task"], []).append(ok)
        if p["history"]:
            second.append(ok)
        seqs.append(tok.encode(pr, add_special_tokens=False).ids + o)
        if not ok:
            failures.append(f"{p['question']!r} → {text!r}")
    acc = sum(sum(v) for v in by_task.values()) / len(probs)
    for f in failures:
        print("   failed: " + f[:400], flush=True)
    detail = ", ".join(f"{k} {sum(v)}/{len(v)}" for k, v in by_task.items())
    mtp = mtp_agreement(model, seqs) if sample_mtp else float("nan")
    print(f"[{label}] accuracy {acc:.3f} ({detail}; second turns {sum(second)}/{len(second)}); "
          f"MTP draft agreement {mtp:.3f}", flush=True)
    model.train()
    return acc, mtp


# ------------------------------------------------------------------------------------------------
# Export

def export(model: Demo, tok: Tokenizer, config: Qwen3_5TextConfig, probs, out: Path):
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cfg = config.to_dict()
    keep = {"vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
            "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "max_position_embeddings",
            "tie_word_embeddings", "rms_norm_eps", "rope_parameters", "layer_types", "hidden_act",
            "attention_bias"}
    out_cfg = {k: cfg[k] for k in sorted(keep)}
    out_cfg.update({"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
                    "attn_output_gate": True, "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
                    "mamba_ssm_dtype": "float32", "dtype": "bfloat16",
                    "eos_token_id": tok.token_to_id("<|endoftext|>"), "full_attention_interval": 4})
    (out / "config.json").write_text(json.dumps(out_cfg, indent=2) + "\n")
    tensors = {}
    for k, v in model.lm.state_dict().items():
        if k == "lm_head.weight":
            continue  # tied
        tensors[k] = v
    for k, v in model.mtp.state_dict().items():
        tensors[f"mtp.{k}"] = v
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in sorted(tensors.items())}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer_files(out, tok)
    with open(out / "heldout.jsonl", "w") as f:
        for p in probs:
            f.write(json.dumps({k: p[k] for k in ("task", "history", "question", "expected", "answer")},
                               ensure_ascii=False) + "\n")


def check_export(model: Demo, tok: Tokenizer, out: Path):
    """The exported directory, loaded by transformers, computes what the trained model computes
    with bf16-rounded weights; and its chat template renders what the corpus used."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, attn_implementation="eager")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    rng = random.Random(5)
    for think in (True, False):
        q = TASKS["add"][0](rng)[0]
        rendered = hf_tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                              add_generation_prompt=True, enable_thinking=think)
        assert rendered == prompt_text(q, None, think), (rendered, prompt_text(q, None, think))
        # A second turn: the earlier answer without its thinking, as the corpus has it.
        q0, t0, a0, _ = TASKS["prime"][0](rng)
        msgs = [{"role": "user", "content": q0}, {"role": "assistant", "content": f"<think>\n{t0}\n</think>\n\n{a0}"},
                {"role": "user", "content": q}]
        rendered = hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=think)
        assert rendered == prompt_text(q, None, think, [(q0, a0)]), (rendered, prompt_text(q, None, think, [(q0, a0)]))
    ids = torch.tensor([tok.encode(prompt_text("Is 91 prime?", None, True), add_special_tokens=False).ids])
    with torch.no_grad():
        a = hf(input_ids=ids).logits
        b = ref.lm(input_ids=ids).logits
    d = (a - b).abs().max().item()
    assert d < 1e-3, f"exported checkpoint differs from the trained model: {d}"
    print(f"export check: transformers reloads models/demo, max |Δlogit| {d:.2e}", flush=True)


# ------------------------------------------------------------------------------------------------

def load_base(commit: str) -> tuple[Tokenizer, dict]:
    """The v2 demo model as committed at `commit` (its tokenizer and weights, read from git)."""
    def show(path: str) -> bytes:
        return subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"], check=True,
                              capture_output=True).stdout
    tok = Tokenizer.from_str(show("models/demo/tokenizer.json").decode())
    return tok, safetensors_load(show("models/demo/model.safetensors"))


def start_from_base(model: Demo, tensors: dict):
    lm = {k: v.float() for k, v in tensors.items() if not k.startswith("mtp.")}
    mtp = {k[4:]: v.float() for k, v in tensors.items() if k.startswith("mtp.")}
    missing, unexpected = model.lm.load_state_dict(lm, strict=False)
    assert set(missing) == {"lm_head.weight"} and not unexpected, (missing, unexpected)
    model.mtp.load_state_dict(mtp)
    model.lm.tie_weights()


def make_long_heads(model: Demo):
    """Turns the LONG_HEADS into fresh long-memory heads: decay exp(-0.1 · softplus(-4)) per token
    (half-life about 380 tokens) whatever the input (in_proj_a's row zeroed), and silent at the
    start (their columns of out_proj zeroed) so the rest of the model is not disturbed while they
    learn. The v2 model's heads all forget within a few tokens (half-lives 0.03–3)."""
    dv = model.lm.config.linear_value_head_dim
    with torch.no_grad():
        for layer, head in LONG_HEADS:
            la = model.lm.model.layers[layer].linear_attn
            la.A_log[head] = math.log(0.1)
            la.dt_bias[head] = -4.0
            la.in_proj_a.weight[head].zero_()
            la.out_proj.weight[:, head * dv:(head + 1) * dv].zero_()


def environment() -> dict:
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor())
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads(), "cpu": cpu}


def compare_weights(trained: Path, committed: Path) -> bool:
    """Bit-for-bit comparison of two exported checkpoints; prints what differs."""
    a = safetensors_load((trained / "model.safetensors").read_bytes())
    b = safetensors_load((committed / "model.safetensors").read_bytes())
    if a.keys() != b.keys():
        print(f"tensor names differ: {sorted(a.keys() ^ b.keys())}")
        return False
    differ = [(k, (a[k].float() - b[k].float()).abs().max().item()) for k in sorted(a)
              if a[k].shape != b[k].shape or not torch.equal(a[k], b[k])]
    print(f"{len(a) - len(differ)} of {len(a)} tensors bit-identical")
    for k, d in differ[:20]:
        print(f"  {k}: max |Δ| {d:.3e}")
    files = sorted(f.name for f in committed.iterdir() if f.name not in ("model.safetensors", "training.json"))
    differ_files = [f for f in files if not (trained / f).exists() or (trained / f).read_bytes() != (committed / f).read_bytes()]
    same_files = not differ_files
    print(f"{', '.join(files)}: " + ("identical" if same_files else f"DIFFER: {', '.join(differ_files)}"))
    return not differ and same_files


def round_to_bf16(model: nn.Module):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def train_phase(model: Demo, tok: Tokenizer, probs, steps: int, lr: float, seed: int, batch: int, eval_every: int,
                label: str, t0: float, curriculum=None, constant: bool = False):
    """AdamW with a 50-step warm-up and a cosine to 5 % of `lr` (`constant`: `lr` throughout), on
    the corpus drawn from `seed`.
    `curriculum`: [(last step, code digits, words, turns)] sets MEMORY_SHAPE as training goes (the
    batches are drawn 16 at a time, so a stage starts within 16 steps of its first step)."""
    global MEMORY_SHAPE
    stage_of = lambda s: next(tuple(st[1:]) for st in curriculum if s <= st[0])
    if curriculum:
        MEMORY_SHAPE = stage_of(1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = 50
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 1.0 if constant else min(1.0, (s + 1) / warm) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
    data = batches(tok, random.Random(seed), batch)
    model.train()
    seen = 0
    for step in range(1, steps + 1):
        if curriculum:
            MEMORY_SHAPE = stage_of(step)
        ids, mask, attention = next(data)
        seen += int(mask.sum())
        main, mtp = model.losses(ids, mask, attention)
        loss = main + 0.5 * mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step == 1:
            el = time.time() - t0
            hl = [f"{math.log(0.5) / (-(model.lm.model.layers[l].linear_attn.A_log[h].exp() * F.softplus(model.lm.model.layers[l].linear_attn.dt_bias[h])).item()):.0f}"
                  for l, h in LONG_HEADS]
            print(f"[{label}] step {step}/{steps}  loss {main.item():.4f}  mtp {mtp.item():.4f}  lr {sched.get_last_lr()[0]:.2e}  "
                  f"{seen / 1e6:.2f} M target tokens  long heads' half-life at a=0 {'/'.join(hl)}  {el / 60:.1f} min", flush=True)
        if eval_every and step % eval_every == 0:
            evaluate(model, tok, probs[:35], f"{label} step {step}")
            if curriculum:
                memory_probe(model, tok, f"{label} step {step}")
    MEMORY_SHAPE = (4, (40, 80), (2, 4))


@torch.no_grad()
def memory_probe(model: Demo, tok: Tokenizer, label: str, n: int = 30):
    """Recall of the code on n fresh one-message memory problems (4 digits, 40-80 words; their own
    seed, so probing draws nothing from training's stream), the code's digits teacher-forced: with
    the stretch hidden, as trained; as at inference; and as at inference with the LONG_HEADS
    silenced (A_log + 12: they forget within a token, as tests/demo.rs silences them)."""
    global MEMORY_SHAPE
    saved_shape, MEMORY_SHAPE = MEMORY_SHAPE, (4, (40, 80), (2, 4))
    model.eval()

    def recall(hide: bool) -> int:
        rng = random.Random(777)
        whole = 0
        for _ in range(n):
            q, thinking, answer, _ = task_memory(rng)
            ids, weights, (_, start, question) = memory_stretch(tok, prompt_text(q, None, True),
                                                                 f"{thinking}\n</think>\n\n{answer}<|im_end|>")
            attention = torch.tensor([[2 if hide else 0, start, question]])
            pred = model.lm.lm_head(model.hidden(torch.tensor([ids]), attention))[0].argmax(-1)
            whole += all(pred[d - 1].item() == ids[d] for d, w in enumerate(weights) if w == DIGIT_WEIGHT)
        return whole

    hidden, seen = recall(True), recall(False)
    a_logs = {l: model.lm.model.layers[l].linear_attn.A_log.data.clone() for l, _ in LONG_HEADS}
    for l, h in LONG_HEADS:
        model.lm.model.layers[l].linear_attn.A_log.data[h] += 12
    silenced = recall(False)
    for l, v in a_logs.items():
        model.lm.model.layers[l].linear_attn.A_log.data.copy_(v)
    print(f"[{label}] memory recall of {n}: stretch hidden {hidden}, as at inference {seen}, "
          f"long heads silenced {silenced}", flush=True)
    MEMORY_SHAPE = saved_shape
    model.train()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=38, help="training stream and shuffling")
    for ph in PHASES:
        opt = ph.suffix.replace("_", "-")
        what = "phase A's steps (every task)" if ph.label == "A" else f"phase {ph.label}'s steps"
        ap.add_argument(f"--steps{opt}", type=int, default=ph.steps, help=what)
        ap.add_argument(f"--lr{opt}", type=float, default=ph.lr)
    ap.add_argument("--batch", type=int, default=32, help="the batch of phases A-C and G-I")
    ap.add_argument("--batch-de", type=int, default=16, help="phases D, E and F's batch")
    ap.add_argument("--resume", nargs=2, metavar=("PHASE", "DIR"),
                    help="start at PHASE (B-I) from the previous phase's export in DIR, or in models/demo "
                         "of a commit (git:COMMIT) — what a full run computes in between")
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--eval-n", type=int, default=70, help="held-out problems graded by this script at the end "
                    "(tests/demo.rs grades all of them through the Rust engine)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", type=Path, metavar="MODEL_DIR",
                    help="retrain with MODEL_DIR's recorded settings into a temporary directory and compare "
                         "the weights with MODEL_DIR's bit for bit")
    args = ap.parse_args()

    recorded = None
    if args.check:
        recorded = json.loads((args.check / "training.json").read_text())
        # A phase a committed run did not have (no steps recorded) is not trained; A and B
        # always ran (their keys predate the letters).
        for ph in PHASES:
            for k in ("steps" + ph.suffix, "lr" + ph.suffix):
                fallback = 0 if k.startswith("steps") and ph.label not in "AB" else getattr(args, k)
                setattr(args, k, recorded.get(k, fallback))
        for k in ("seed", "batch", "batch_de"):
            setattr(args, k, recorded.get(k, getattr(args, k)))
        args.out = Path(tempfile.mkdtemp(prefix="demo-check-"))
        args.eval_n = 0

    torch.set_num_threads(THREADS)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    t0 = time.time()

    tok, base = load_base(BASE_COMMIT)
    vocab = ((tok.get_vocab_size(with_added_tokens=True) + 63) // 64) * 64
    config = model_config(vocab)
    model = Demo(config)
    start_from_base(model, base)
    make_long_heads(model)
    n_main = sum(p.numel() for p in model.lm.parameters())
    print(f"fine-tuning the demo model of {BASE_COMMIT[:10]} ({n_main / 1e6:.2f} M params, vocab {vocab}); "
          f"long-memory heads {LONG_HEADS}", flush=True)

    probs = heldout_problems(HELDOUT_SEED, HELDOUT_N)
    HELD_OUT.update(problem_key(problem_history(p), p["question"]) for p in probs)
    # Phases in turn, each from the previous one's weights rounded to bf16 (what its export
    # holds, so a run resumed from an export computes what a full run does).
    first = 0
    if args.resume:
        label, d = args.resume
        first = [p.label for p in PHASES].index(label)
        start_from_base(model, load_base(d[4:])[1] if d.startswith("git:") else
                        safetensors_load((Path(d) / "model.safetensors").read_bytes()))
        print(f"phase {PHASES[first - 1].label}'s weights from {d}", flush=True)
    global SORT_TRICKY, SORT_MIXED, MEMORY_HIDDEN
    for i, ph in enumerate(PHASES[first:], first):
        steps = getattr(args, "steps" + ph.suffix)
        if not steps:
            continue
        SHARES.update(ph.shares)
        SORT_TRICKY, SORT_MIXED = ph.sort_tricky, ph.sort_mixed
        MEMORY_HIDDEN = ph.hidden
        # Phase D keeps its rate: its curriculum's last stages (the longest distractors) come late.
        train_phase(model, tok, probs, steps, getattr(args, "lr" + ph.suffix), args.seed + i,
                    getattr(args, ph.batch), args.eval_every, ph.label, t0, ph.curriculum,
                    constant=ph.label == "D")
        round_to_bf16(model)
        if ph.curriculum:
            memory_probe(model, tok, f"after {ph.label}")
    minutes = (time.time() - t0) / 60
    print(f"trained in {minutes:.1f} min", flush=True)
    model.eval()
    export(model, tok, config, probs, args.out)
    record = {"base_commit": BASE_COMMIT, "seed": args.seed, "batch": args.batch, "batch_de": args.batch_de}
    for ph in PHASES:
        record["steps" + ph.suffix] = getattr(args, "steps" + ph.suffix)
        record["lr" + ph.suffix] = getattr(args, "lr" + ph.suffix)
        if ph.label != "A":
            record[f"phase{ph.suffix}_shares"] = ph.shares
            record[f"phase{ph.suffix}_sort_tricky"] = ph.sort_tricky
        if ph.sort_mixed:
            record[f"phase{ph.suffix}_sort_mixed"] = ph.sort_mixed
        if ph.curriculum:
            record[f"phase{ph.suffix}_curriculum"] = ph.curriculum
    record.update({"digit_weight": DIGIT_WEIGHT, "heldout_seed": HELDOUT_SEED, "heldout_n": HELDOUT_N,
                   "long_heads": LONG_HEADS, "attention_window": ATTN_WINDOW,
                   "memory_windowed_share": MEMORY_WINDOWED_SHARE, "minutes": round(minutes, 1), **environment()})
    if args.resume:
        record["resumed"] = args.resume  # `minutes` then counts only the phases this run trained
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    if args.check:
        same = compare_weights(args.out, args.check)
        env = environment()
        for k, v in env.items():
            if recorded.get(k) != v:
                print(f"environment differs: {k} {recorded.get(k)!r} when committed, {v!r} now")
        print(f"--check: {'bit-identical' if same else 'NOT identical'} after {minutes:.1f} min of training "
              f"(retrained into {args.out})")
        raise SystemExit(0 if same else 1)
    check_export(model, tok, args.out)
    if args.eval_n:
        acc, mtp = evaluate(model, tok, probs[: args.eval_n], "held-out, thinking")
        print(f"done in {(time.time() - t0) / 60:.1f} min: accuracy {acc:.3f}, MTP draft agreement {mtp:.3f}", flush=True)


if __name__ == "__main__":
    main()
