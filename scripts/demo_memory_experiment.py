#!/usr/bin/env python3
"""The memory experiment the README's "Its memory" section reports: can the demo's GDN state, not
its attention layers, carry the code of the memory task?

    .venv-demo/bin/python scripts/demo_memory_experiment.py [MODEL_DIR] [--out FILE.pt]

(the venv of scripts/train_demo.py; MODEL_DIR defaults to v3, the demo model of commit ed2f407 read
with git show, which the experiment was run on — the shipped v4 was trained this way). About 30 minutes on 2
cores. Nothing is exported: it prints recall on fresh memory problems as it trains and, at the
end, the held-out set's first 140 problems (thinking), so the cost to the other tasks shows.

The mask is the point. In every memory example, the positions from the start of the question
("What was the code?") on may not attend to any token from the first digit of the code up to
that question. Hiding only the code and a few tokens after it (or a sliding window) leaves
attention a relay: the tokens in between see the code and the question sees them. With the
whole stretch hidden, only the GDN recurrent state can bring the code to the question.

Two phases, each with its own optimiser and a fresh random stream (seed 5):
  D  800 steps, lr 1e-3, 70 % memory examples: a curriculum of code lengths 1 -> 2 -> 4 digits and
     distractors of 2-10 -> 10-30 -> 30-80 words;
  E  400 steps, lr 3e-4, 20 % memory examples (4 digits, 2-80 words, still masked).
Batches of 16, the code's digits weighted x4 in the loss. Every 100 steps: recall of 30 fresh
4-digit (or the phase's length) codes with the mask (after 2-8 and 40-80 words), without it,
and without it with the long-memory GDN heads silenced (A_log + 12: they forget within a token,
as tests/demo.rs silences them). Transformers in f32, greedy, teacher-forced digits.
"""
import argparse
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load as load_safetensors
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_demo as T  # noqa: E402

WORD_WEIGHT = 4.0  # the code's digits count this much more than the other completion tokens
BATCH = 16
SEED = 5
# (last step, code length, fewest distractor words, most)
PHASE_D = [(150, 1, 2, 10), (300, 2, 2, 10), (500, 4, 2, 10), (650, 4, 10, 30), (10**9, 4, 30, 80)]
PHASE_E = [(10**9, 4, 2, 80)]
QUESTION = "What was the code?"
V3_COMMIT = "ed2f407"  # the demo model the experiment was run on (v3: its attention carried the code)


class Memory:
    """The experiment's memory problems: a code of `digits` digits, then a distractor (one message:
    `lo`-`hi` words; or a conversation: the code, then another task's turn), then the question."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.digits = 1

    def example(self, rng: random.Random, lo: int, hi: int):
        code = str(rng.randint(10 ** (self.digits - 1) if self.digits > 1 else 0, 10**self.digits - 1))
        if rng.random() < 0.5:
            words = " ".join(rng.choice(T.WORDS) for _ in range(rng.randint(lo, hi)))
            question, history = f"Remember the code {code}. Then read: {words}. {QUESTION}", []
        else:
            history = [(f"Remember the code {code}.", "OK, I will remember it.")]
            for _ in range(rng.randint(1, max(1, hi // 20))):
                q, _, a, _ = T.TASKS[T.pick_task(rng, memory=False)][0](rng)
                history.append((q, a))
            question = QUESTION
        prompt = T.prompt_text(question, None, True, history)
        completion = f"I was asked to remember the code {code}.\n</think>\n\nThe code was {code}.<|im_end|>"
        return prompt, completion, code

    def encode(self, prompt: str, completion: str, code: str):
        """Token ids, the prompt's length, the hidden stretch [first code token, question) and the
        positions of the completion's first copy of the code."""
        p = self.tok.encode(prompt, add_special_tokens=False)
        c = self.tok.encode(completion, add_special_tokens=False)
        at = prompt.find(code)
        first = next(i for i, (a, _) in enumerate(p.offsets) if at <= a < at + len(code))
        q = prompt.rfind(QUESTION)
        question = next(i for i, (a, _) in enumerate(p.offsets) if a >= q)
        at = completion.find(code)
        digits = [len(p.ids) + i for i, (a, _) in enumerate(c.offsets) if at <= a < at + len(code)]
        return p.ids + c.ids, len(p.ids), (first, question), digits


def hidden(model, ids, mask):
    out = model.lm.model(input_ids=ids, attention_mask={"full_attention": mask, "linear_attention": None}, use_cache=False)
    return out.last_hidden_state


def causal(n: int):
    i = torch.arange(n)
    return i[None, :] <= i[:, None]


def batch(memory: Memory, tok: Tokenizer, rng: random.Random, share: float, lo: int, hi: int):
    rows = []
    for _ in range(BATCH):
        if rng.random() < share:
            rows.append(memory.encode(*memory.example(rng, lo, hi)))
        else:
            p, comp, _ = T.make_example(rng)
            if "remember the code" in comp:
                continue  # the other tasks only: the script's own memory examples are unmasked
            a, b = tok.encode(p, add_special_tokens=False).ids, tok.encode(comp, add_special_tokens=False).ids
            rows.append((a + b, len(a), None, []))
    n = max(len(r[0]) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long)
    weight = torch.zeros(len(rows), n)
    mask = causal(n).expand(len(rows), n, n).clone()
    for r, (x, prompt_len, stretch, digits) in enumerate(rows):
        ids[r, : len(x)] = torch.tensor(x)
        weight[r, prompt_len : len(x)] = 1.0
        for d in digits:
            weight[r, d] = WORD_WEIGHT
        if stretch:
            start, question = stretch
            mask[r, question:, start:question] = False
    return ids, weight, mask[:, None]


def loss_of(model, ids, weight, mask):
    logits = model.lm.lm_head(hidden(model, ids, mask))
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
    w = weight[:, 1:].reshape(-1)
    return (ce * w).sum() / w.sum()


@torch.no_grad()
def recall(model, memory: Memory, lo: int, hi: int, masked: bool, n: int = 30) -> str:
    rng = random.Random(777 + lo)
    whole = digits_right = 0
    for _ in range(n):
        ids, _, (start, question), digits = memory.encode(*memory.example(rng, lo, hi))
        mask = causal(len(ids)).clone()
        if masked:
            mask[question:, start:question] = False
        pred = model.lm.lm_head(hidden(model, torch.tensor([ids]), mask[None, None]))[0].argmax(-1)
        right = [pred[d - 1].item() == ids[d] for d in digits]
        whole += all(right)
        digits_right += sum(right)
    return f"{whole}/{n} ({digits_right}/{memory.digits * n} digits)"


def long_heads(model):
    """GDN heads whose decay at a = 0 keeps half for 20 tokens or more."""
    heads = []
    for li, layer in enumerate(model.lm.model.layers):
        gdn = getattr(layer, "linear_attn", None)
        if gdn is not None:
            g0 = -gdn.A_log.exp() * F.softplus(gdn.dt_bias)
            heads += [(li, h) for h, g in enumerate(g0.tolist()) if math.log(2) / -g >= 20]
    return heads


@torch.no_grad()
def silenced_recall(model, memory: Memory, lo: int, hi: int) -> str:
    heads = long_heads(model)
    saved = {}
    for li, h in heads:
        gdn = model.lm.model.layers[li].linear_attn
        saved.setdefault(li, gdn.A_log.data.clone())
        gdn.A_log.data[h] += 12
    r = recall(model, memory, lo, hi, masked=False)
    for li, v in saved.items():
        model.lm.model.layers[li].linear_attn.A_log.data.copy_(v)
    return f"{r} with {heads} silenced"


def report(model, memory: Memory, label: str):
    model.eval()
    print(f"  {label}: masked, 2-8 words {recall(model, memory, 2, 8, True)}, 40-80 words "
          f"{recall(model, memory, 40, 80, True)} | unmasked, 40-80 words {recall(model, memory, 40, 80, False)} "
          f"| unmasked, long heads silenced {silenced_recall(model, memory, 40, 80)}", flush=True)


def phase(model, memory: Memory, tok: Tokenizer, name: str, steps: int, lr: float, share: float, schedule, t0: float):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    rng = random.Random(SEED)
    report(model, memory, f"{name} start")
    for step in range(1, steps + 1):
        model.train()
        _, memory.digits, lo, hi = next(stage for stage in schedule if step <= stage[0])
        ids, weight, mask = batch(memory, tok, rng, share, lo, hi)
        loss = loss_of(model, ids, weight, mask)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            print(f"{name} step {step}: {memory.digits} digits, {lo}-{hi} words, loss {loss.item():.4f}, "
                  f"{(time.time() - t0) / 60:.1f} min", flush=True)
        if step % 100 == 0:
            report(model, memory, f"{name} step {step}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", type=Path, help="a model directory (default: v3 from git, commit ed2f407)")
    ap.add_argument("--out", type=Path, help="save the final weights (a torch state dict) here")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    if args.model:
        tok = Tokenizer.from_file(str(args.model / "tokenizer.json"))
        weights = load_safetensors((args.model / "model.safetensors").read_bytes())
    else:
        tok, weights = T.load_base(V3_COMMIT)
    vocab = ((tok.get_vocab_size(with_added_tokens=True) + 63) // 64) * 64
    model = T.Demo(T.model_config(vocab))
    T.start_from_base(model, weights)
    memory = Memory(tok)
    t0 = time.time()
    phase(model, memory, tok, "D", 800, 1e-3, 0.7, PHASE_D, t0)
    phase(model, memory, tok, "E", 400, 3e-4, 0.2, PHASE_E, t0)
    if args.out:
        torch.save(model.state_dict(), args.out)
    probs = T.heldout_problems(T.HELDOUT_SEED, T.HELDOUT_N)[:140]
    T.evaluate(model, tok, probs, "held-out 140, thinking", sample_mtp=False)
    print(f"done in {(time.time() - t0) / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
