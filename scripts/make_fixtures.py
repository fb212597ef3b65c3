#!/usr/bin/env python3
"""Build the reference-fidelity fixtures of deltascope with Hugging Face transformers (CPU).

For each supported architecture it writes a small random checkpoint in the exact Hugging Face
layout of the real models (config.json, safetensors, tokenizer files, chat template) under
tests/fixtures/<name>/, and a golden.json with what transformers computes on it:

  * for several prompts (chat-rendered, raw, one of >= 300 tokens so the chunked GDN prefill
    crosses several 64-token chunks): the prompt ids, the top-20 last-position logits, a 32-token
    greedy continuation produced with the model's cache (with the reference's per-step top-5, so a
    test can tell a real divergence from a near-tie), and per-layer hidden-state norms;
  * all of it twice: the model run in float32, and the model run in bfloat16.

It also writes tests/fixtures/templates/golden.json: conversations rendered by
tokenizer.apply_chat_template with the real Qwen3.5 and Qwen3.6 templates, and
tests/fixtures/tokenizer/golden.json: encodings of tricky strings.

Set-up (CPU only; run from the repository root):

    python3 -m venv .venv-fixtures
    .venv-fixtures/bin/pip install torch==2.15.0 transformers==5.24.0 tokenizers==0.23.3 \
        safetensors==0.8.0 numpy
    .venv-fixtures/bin/python scripts/make_fixtures.py

Deterministic: the same versions give the same files. The fixtures are committed; CI never runs
this script.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures"
TEMPLATES = ROOT / "scripts" / "templates"

PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# The Qwen3.5 special tokens, in Qwen's order (their ids follow the BPE vocabulary, as in the real
# tokenizer). The ids differ from the real model's: the engine must read them from the files.
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
# Tokens Qwen marks special=False (they stay in decoded text even when skipping specials).
NON_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
               "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
               "<think>", "</think>"}

BPE_VOCAB = 480  # byte alphabet (256) + merges


def corpus_lines(rng: random.Random) -> list[str]:
    """A small deterministic corpus: English-like prose, numbers, code, and some non-ASCII text."""
    words = ("the model thinks about a problem before it answers and the answer follows the "
             "reasoning state layer token budget prime number sum product list sort count letter "
             "which larger smaller first then because so therefore check divide remainder "
             "hello world value key query gate decay chunk memory cache speed").split()
    lines = []
    for _ in range(1500):
        n = rng.randint(4, 16)
        s = " ".join(rng.choice(words) for _ in range(n))
        if rng.random() < 0.3:
            s += f" {rng.randint(0, 9999)} + {rng.randint(0, 999)} = {rng.randint(0, 99999)}"
        if rng.random() < 0.2:
            s = s.capitalize() + "."
        lines.append(s)
    lines += [
        "def add(a, b):\n    return a + b\n",
        "for i in range(10):\n    print(i * i)\n",
        "Grüße aus München, naïve café, déjà vu.",
        "日本語のテキストと中文文本。",
        "Emoji: 🙂🚀🧠 and symbols ∑ ∫ → ≤ ≥.",
    ] * 20
    return lines


def build_tokenizer() -> Tokenizer:
    rng = random.Random(1234)
    tok = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                        fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(corpus_lines(rng), trainer=trainer)
    from tokenizers import AddedToken
    tok.add_tokens([AddedToken(t, special=(t not in NON_SPECIAL), normalized=False)
                    for t in SPECIAL_TOKENS])
    return tok


def write_tokenizer_files(d: Path, tok: Tokenizer, template: str | None, template_in_config: bool):
    tok.save(str(d / "tokenizer.json"))
    added = {}
    for t in SPECIAL_TOKENS:
        added[str(tok.token_to_id(t))] = {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": t not in NON_SPECIAL,
        }
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "TokenizersBackend",
        "unk_token": None,
    }
    if template is not None and template_in_config:
        cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    if template is not None and not template_in_config:
        (d / "chat_template.jinja").write_text(template)
    gen = {
        "bos_token_id": tok.token_to_id("<|endoftext|>"),
        "eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
        "pad_token_id": tok.token_to_id("<|endoftext|>"),
        "temperature": 1.0, "top_k": 20, "top_p": 0.95, "do_sample": True,
        "transformers_version": transformers.__version__,
    }
    (d / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


# ------------------------------------------------------------------------------------------------
# Fixture definitions. Head ratios: GQA (attention heads / KV heads) and GDN (value / key heads).

def text_fields(*, vocab, hidden, layers, heads, kv, head_dim, lk, lv, dk, dv, inter, tie,
                theta=1e7, prf=0.25, interval=4, max_pos=4096):
    return {
        "vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
        "linear_num_key_heads": lk, "linear_num_value_heads": lv,
        "linear_key_head_dim": dk, "linear_value_head_dim": dv, "linear_conv_kernel_dim": 4,
        "intermediate_size": inter, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "max_position_embeddings": max_pos, "tie_word_embeddings": tie, "attention_bias": False,
        "full_attention_interval": interval,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": prf,
                            "mrope_section": [1, 1, 2], "mrope_interleaved": True},
    }


FIXTURES = [
    {
        # Multimodal Qwen3.5 layout: LM under text_config, tensors under model.language_model.,
        # a (tiny) vision tower under model.visual., untied lm_head, MTP tensors, 2 shards, bf16.
        "name": "qwen3_5_vl",
        "model_type": "qwen3_5",
        "storage": torch.bfloat16,
        "shards": 2,
        "mtp": True,
        "template": "qwen3_5.jinja", "template_in_config": False,
        "text": dict(hidden=64, layers=8, heads=4, kv=2, head_dim=32, lk=2, lv=4, dk=16, dv=16,
                     inter=128, tie=False),
    },
    {
        # Text-only Qwen3.5 with tied embeddings; template inside tokenizer_config.json; f32.
        "name": "qwen3_5_text",
        "model_type": "qwen3_5_text",
        "storage": torch.float32,
        "shards": 1,
        "mtp": False,
        "template": "qwen3_6.jinja", "template_in_config": True,
        "text": dict(hidden=48, layers=4, heads=4, kv=1, head_dim=24, lk=2, lv=6, dk=8, dv=12,
                     inter=96, tie=True),
    },
    {
        # Qwen3-Next: flat config, fused in_proj_qkvz / in_proj_ba, per-expert MoE tensors,
        # one dense layer through mlp_only_layers, top-level rope_theta; f16 storage.
        "name": "qwen3_next",
        "model_type": "qwen3_next",
        "storage": torch.float16,
        "shards": 1,
        "mtp": False,
        "template": "qwen3_5.jinja", "template_in_config": False,
        "text": dict(hidden=64, layers=4, heads=4, kv=2, head_dim=32, lk=2, lv=2, dk=16, dv=16,
                     inter=96, tie=False),
        "moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                    shared_expert_intermediate_size=48, norm_topk_prob=True,
                    decoder_sparse_step=1, mlp_only_layers=[2]),
    },
    {
        # Qwen3.5-MoE, multimodal layout, fused expert tensors, GQA 3 and GDN ratio 3; bf16.
        "name": "qwen3_5_moe",
        "model_type": "qwen3_5_moe",
        "storage": torch.bfloat16,
        "shards": 1,
        "mtp": True,
        "template": "qwen3_5.jinja", "template_in_config": False,
        "text": dict(hidden=48, layers=4, heads=6, kv=2, head_dim=16, lk=1, lv=3, dk=16, dv=16,
                     inter=0, tie=False),
        "moe": dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24,
                    shared_expert_intermediate_size=32),
    },
]


def make_config(fx: dict, vocab: int, tok: Tokenizer) -> dict:
    t = dict(fx["text"])
    inter = t.pop("inter")
    text = text_fields(vocab=vocab, inter=inter, **t)
    eos = tok.token_to_id("<|endoftext|>")
    if fx["model_type"] == "qwen3_5":
        text.update({"model_type": "qwen3_5_text", "eos_token_id": eos,
                     "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
                     "mamba_ssm_dtype": "float32", "attn_output_gate": True})
        return {
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "text_config": text,
            "vision_config": {"model_type": "qwen3_5", "depth": 1, "hidden_size": 32,
                              "intermediate_size": 64, "num_heads": 2, "patch_size": 4,
                              "temporal_patch_size": 2, "spatial_merge_size": 2,
                              "out_hidden_size": text["hidden_size"],
                              "num_position_embeddings": 16, "in_channels": 3},
            "image_token_id": tok.token_to_id("<|image_pad|>"),
            "video_token_id": tok.token_to_id("<|video_pad|>"),
            "vision_start_token_id": tok.token_to_id("<|vision_start|>"),
            "vision_end_token_id": tok.token_to_id("<|vision_end|>"),
            "tie_word_embeddings": False,
        }
    if fx["model_type"] == "qwen3_5_text":
        text.update({"model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"],
                     "eos_token_id": eos})
        return text
    if fx["model_type"] == "qwen3_next":
        # The flat, older style: rope fields at top level, no layer_types, no rope_parameters.
        rope = text.pop("rope_parameters")
        text.update({"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"],
                     "rope_theta": rope["rope_theta"], "partial_rotary_factor": 0.5,
                     "rope_scaling": None, "bos_token_id": eos, "eos_token_id": eos})
        text.update(fx["moe"])
        return text
    if fx["model_type"] == "qwen3_5_moe":
        text.pop("intermediate_size")
        text.update({"model_type": "qwen3_5_moe_text", "eos_token_id": eos,
                     "mtp_num_hidden_layers": 1, "mamba_ssm_dtype": "float32"})
        text.update(fx["moe"])
        return {
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe",
            "text_config": text,
            "vision_config": {"model_type": "qwen3_5_moe", "depth": 1, "hidden_size": 32,
                              "intermediate_size": 64, "num_heads": 2, "patch_size": 4,
                              "temporal_patch_size": 2, "spatial_merge_size": 2,
                              "out_hidden_size": text["hidden_size"],
                              "num_position_embeddings": 16, "in_channels": 3},
            "image_token_id": tok.token_to_id("<|image_pad|>"),
            "video_token_id": tok.token_to_id("<|video_pad|>"),
            "vision_start_token_id": tok.token_to_id("<|vision_start|>"),
            "vision_end_token_id": tok.token_to_id("<|vision_end|>"),
            "tie_word_embeddings": False,
        }
    raise ValueError(fx["model_type"])


def nontrivial_init(model: torch.nn.Module, seed: int):
    """Weights that keep activations O(1) and exercise every parameter: zero-centred norms get
    visible offsets, A_log / dt_bias vary per head so decays range from slow to fast."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                # A in [0.05, 2]: per-step decays between ~0.999 and ~0.6 with the dt below.
                a = torch.empty(p.shape).uniform_(math.log(0.05), math.log(2.0), generator=g)
                p.copy_(a)
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.8 - 1.5)
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif "norm" in name and p.dim() == 1:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif "conv1d" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) * (1.2 / math.sqrt(fan_in)))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def checkpoint_tensors(fx: dict, model: torch.nn.Module, cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """The model's state dict renamed to the layout of real published checkpoints."""
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if fx["model_type"] == "qwen3_5_text" and k == "lm_head.weight" and cfg["tie_word_embeddings"]:
            continue  # tied: real checkpoints store only the embedding
        if fx["model_type"] == "qwen3_next" and ".mlp.experts.gate_up_proj" in k:
            # Real Qwen3-Next checkpoints store one tensor per expert.
            prefix = k[: -len("gate_up_proj")]
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = v[e, :inter].clone()
                out[f"{prefix}{e}.up_proj.weight"] = v[e, inter:].clone()
            continue
        if fx["model_type"] == "qwen3_next" and ".mlp.experts.down_proj" in k:
            prefix = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = v[e].clone()
            continue
        out[k] = v
    if fx["mtp"]:
        # MTP tensors exactly as real checkpoints name them (transformers ignores them).
        tc = cfg["text_config"]
        h, nh, kv, hd = tc["hidden_size"], tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
        g = torch.Generator().manual_seed(seed + 7)

        def r(*shape, scale=None):
            s = scale if scale is not None else 1.2 / math.sqrt(shape[-1])
            return torch.randn(shape, generator=g) * s

        out["mtp.fc.weight"] = r(h, 2 * h)
        out["mtp.pre_fc_norm_embedding.weight"] = r(h, scale=0.3)
        out["mtp.pre_fc_norm_hidden.weight"] = r(h, scale=0.3)
        out["mtp.norm.weight"] = r(h, scale=0.3)
        p = "mtp.layers.0."
        out[p + "input_layernorm.weight"] = r(h, scale=0.3)
        out[p + "post_attention_layernorm.weight"] = r(h, scale=0.3)
        out[p + "self_attn.q_proj.weight"] = r(nh * hd * 2, h)
        out[p + "self_attn.k_proj.weight"] = r(kv * hd, h)
        out[p + "self_attn.v_proj.weight"] = r(kv * hd, h)
        out[p + "self_attn.o_proj.weight"] = r(h, nh * hd)
        out[p + "self_attn.q_norm.weight"] = r(hd, scale=0.3)
        out[p + "self_attn.k_norm.weight"] = r(hd, scale=0.3)
        if "moe" in fx:
            m = fx["moe"]
            e, i, si = m["num_experts"], m["moe_intermediate_size"], m["shared_expert_intermediate_size"]
            out[p + "mlp.gate.weight"] = r(e, h)
            out[p + "mlp.experts.gate_up_proj"] = r(e, 2 * i, h)
            out[p + "mlp.experts.down_proj"] = r(e, h, i)
            out[p + "mlp.shared_expert.gate_proj.weight"] = r(si, h)
            out[p + "mlp.shared_expert.up_proj.weight"] = r(si, h)
            out[p + "mlp.shared_expert.down_proj.weight"] = r(h, si)
            out[p + "mlp.shared_expert_gate.weight"] = r(1, h)
        else:
            inter = tc["intermediate_size"]
            out[p + "mlp.gate_proj.weight"] = r(inter, h)
            out[p + "mlp.up_proj.weight"] = r(inter, h)
            out[p + "mlp.down_proj.weight"] = r(h, inter)
    return {k: v.to(fx["storage"]).contiguous() for k, v in sorted(out.items())}


def write_safetensors(d: Path, tensors: dict[str, torch.Tensor], shards: int):
    meta = {"format": "pt"}
    if shards == 1:
        save_file(tensors, str(d / "model.safetensors"), metadata=meta)
        return
    names = list(tensors)
    per = math.ceil(len(names) / shards)
    weight_map = {}
    total = 0
    for s in range(shards):
        part = names[s * per:(s + 1) * per]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(d / fname), metadata=meta)
        for n in part:
            weight_map[n] = fname
            total += tensors[n].numel() * tensors[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


# ------------------------------------------------------------------------------------------------
# Goldens

def top(logits: torch.Tensor, k: int) -> list[list]:
    v, i = torch.topk(logits.float(), k)
    return [[int(a), float(b)] for a, b in zip(i.tolist(), v.tolist())]


def hidden_norms(model, ids: list[int]) -> list[list[float]]:
    """Per decoder layer (and the final norm), the L2 norm of the hidden state at every position."""
    captured = []
    hooks = []
    lm = model.model.language_model if hasattr(model.model, "language_model") else model.model
    for layer in lm.layers:
        hooks.append(layer.register_forward_hook(
            lambda m, i, o: captured.append((o[0] if isinstance(o, tuple) else o)[0].float().norm(dim=-1))))
    hooks.append(lm.norm.register_forward_hook(lambda m, i, o: captured.append(o[0].float().norm(dim=-1))))
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), use_cache=False)
    for h in hooks:
        h.remove()
    return [[float(x) for x in c.tolist()] for c in captured]


class RouterTies:
    """Records where a MoE router had an exact tie at its top-k boundary. In bf16 the router
    logits are quantised and exact ties happen; torch.topk then picks one of the tied experts in
    an unspecified order, so results past that point are not a well-defined reference."""

    def __init__(self, model):
        self.calls: list[list[int]] = []  # per forward call: positions with a tie (any layer)
        self.hooks = []
        self.pending: set[int] = set()
        for mod in model.modules():
            if type(mod).__name__.endswith("TopKRouter"):
                self.hooks.append(mod.register_forward_hook(self._hook))

    def _hook(self, mod, inp, out):
        logits = out[0].float()
        probs = torch.softmax(logits, dim=-1)
        top = probs.sort(dim=-1, descending=True).values
        k = mod.top_k
        for pos in torch.nonzero(top[:, k - 1] == top[:, k]).flatten().tolist():
            self.pending.add(pos)

    def end_call(self):
        self.calls.append(sorted(self.pending))
        self.pending = set()

    def remove(self):
        for h in self.hooks:
            h.remove()


def golden_for(model, ids: list[int], unused_eos: int) -> dict:
    ties = RouterTies(model)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
        ties.end_call()
        prefill_ties = ties.calls[-1]
        last = out.logits[0, -1]
        # Every forward of generate() is one call: the prefill, then one per new token.
        handle = model.register_forward_hook(lambda m, i, o: ties.end_call())
        gen = model.generate(
            input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False, max_new_tokens=32, min_new_tokens=0, use_cache=True,
            eos_token_id=unused_eos, pad_token_id=unused_eos, output_logits=True,
            return_dict_in_generate=True, temperature=None, top_p=None, top_k=None,
        )
        handle.remove()
    ties.remove()
    gen_calls = ties.calls[1:]
    # Step i's logits come from call i (call 0 is the prefill of the prompt).
    tie_step = next((i for i, c in enumerate(gen_calls) if c), None)
    seq = gen.sequences[0, len(ids):].tolist()
    steps = [{"id": int(t), "top5": top(l[0], 5)} for t, l in zip(seq, gen.logits)]
    res = {"top20": top(last, 20), "greedy": steps, "hidden_norms": hidden_norms(model, ids)}
    if prefill_ties or tie_step is not None:
        res["router_ties"] = {"prefill_first_position": prefill_ties[0] if prefill_ties else None,
                              "greedy_first_step": tie_step}
    return res


LONG_TEXT = (
    "The model thinks about a problem before it answers, and the answer follows the reasoning. "
    "First it checks the budget of tokens, then it divides the problem into small steps: the sum "
    "of 4821 and 739 is 5560, the product of 37 and 6 is 222, and 91 is 7 times 13, so 91 is not "
    "a prime number. Because the state of every linear layer is a fixed-size memory, the cost of "
    "each new token stays constant, while the full attention layers keep a cache that grows with "
    "the context. Grüße aus München; 日本語のテキスト; emoji 🙂🚀. "
)


def prompts_for(tok_hf, tok: Tokenizer) -> list[dict]:
    msgs_hello = [{"role": "user", "content": "Hello, what is 2 + 2?"}]
    msgs_sys = [{"role": "system", "content": "You are a careful assistant."},
                {"role": "user", "content": "Is 91 prime?"}]
    out = []
    for name, msgs, think in (("chat_think", msgs_hello, True), ("chat_system_nothink", msgs_sys, False)):
        text = tok_hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                          enable_thinking=think)
        out.append({"name": name, "kind": "chat", "messages": msgs, "enable_thinking": think,
                    "text": text, "ids": tok.encode(text, add_special_tokens=False).ids})
    raw = "def add(a, b):\n    return a + b\n# sum of 12 and 30 is"
    out.append({"name": "raw_code", "kind": "raw", "text": raw,
                "ids": tok.encode(raw, add_special_tokens=False).ids})
    long_text = LONG_TEXT + LONG_TEXT[:160]
    ids = tok.encode(long_text, add_special_tokens=False).ids
    assert len(ids) >= 300, len(ids)
    out.append({"name": "long_raw", "kind": "raw", "text": long_text, "ids": ids})
    return out


def build_fixture(fx: dict, tok: Tokenizer, seed: int):
    d = OUT / fx["name"]
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    n_tok = tok.get_vocab_size(with_added_tokens=True)
    vocab = ((n_tok + 63) // 64) * 64  # padded like the real vocabularies
    cfg = make_config(fx, vocab, tok)
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    template = (TEMPLATES / fx["template"]).read_text() if fx["template"] else None
    write_tokenizer_files(d, tok, template, fx["template_in_config"])

    torch.manual_seed(seed)
    config = transformers.AutoConfig.from_pretrained(str(d))
    model_class = getattr(transformers, cfg["architectures"][0])
    model = model_class._from_config(config, dtype=torch.float32)
    nontrivial_init(model, seed)
    tensors = checkpoint_tensors(fx, model, cfg, seed)
    write_safetensors(d, tensors, fx["shards"])

    # Reload what was written, exactly as a user would: this checks that transformers reads our
    # layout and that the goldens come from the stored (possibly bf16/f16-rounded) weights.
    tok_hf = AutoTokenizer.from_pretrained(str(d))
    prompts = prompts_for(tok_hf, tok)
    unused = vocab - 1  # a padding row: never produced by the tokenizer, used as a never-EOS
    golden = {
        "fixture": fx["name"], "model_type": fx["model_type"],
        "storage_dtype": str(fx["storage"]).replace("torch.", ""),
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "prompts": prompts,
    }
    for dtype_name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        m, info = model_class.from_pretrained(str(d), dtype=dtype, attn_implementation="eager",
                                              experts_implementation="eager", output_loading_info=True)
        # Every parameter must come from the files we wrote (nothing silently re-initialised);
        # the only keys transformers may skip are the MTP ones it does not model.
        assert not info["missing_keys"], info["missing_keys"]
        assert all(k.startswith("mtp.") for k in info["unexpected_keys"]), info["unexpected_keys"]
        m.eval()
        for p in prompts:
            p[dtype_name] = golden_for(m, p["ids"], unused)
    (d / "golden.json").write_text(json.dumps(golden) + "\n")
    size = sum(f.stat().st_size for f in d.iterdir())
    print(f"{fx['name']}: {size / 1e6:.2f} MB, {len(tensors)} tensors, vocab {vocab}")


# ------------------------------------------------------------------------------------------------
# Template and tokenizer goldens

TEMPLATE_CASES = [
    ("single_think", [{"role": "user", "content": "Hello"}], {}),
    ("single_nothink", [{"role": "user", "content": "Hello"}], {"enable_thinking": False}),
    ("single_think_explicit", [{"role": "user", "content": "Hello"}], {"enable_thinking": True}),
    ("system", [{"role": "system", "content": "  Be brief.  "},
                {"role": "user", "content": "  What is 2+2?\n"}], {}),
    ("multi_turn_reasoning_field", [
        {"role": "user", "content": "Is 91 prime?"},
        {"role": "assistant", "content": "No, 91 = 7 × 13.", "reasoning_content": "\nTry 7: 7*13=91.\n"},
        {"role": "user", "content": "And 97?"},
    ], {}),
    ("multi_turn_think_in_content", [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Sort 5, 2, 9."},
        {"role": "assistant", "content": "<think>\nCompare pairs.\n</think>\n\n2, 5, 9"},
        {"role": "user", "content": "Reverse it."},
    ], {"enable_thinking": False}),
    ("multi_turn_preserve", [
        {"role": "user", "content": "Is 91 prime?"},
        {"role": "assistant", "content": "No.", "reasoning_content": "7*13=91"},
        {"role": "user", "content": "And 97?"},
    ], {"preserve_thinking": True}),
    ("trailing_assistant", [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
    ], {"add_generation_prompt": False}),
    ("tools", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": {"city": "Paris", "days": 2, "opts": {"unit": "C"}}}}]},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "tool", "content": "sunny"},
    ], {"tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city — ünïcode",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]}),
    ("multimodal_content", [
        {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "image"},
                                     {"type": "text", "text": " please"}]},
    ], {}),
]


def build_template_goldens(tok: Tokenizer):
    d = OUT / "templates"
    d.mkdir(parents=True, exist_ok=True)
    tmp = OUT / "_tmp_tok"
    cases = []
    for tname in ("qwen3_5.jinja", "qwen3_6.jinja"):
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        write_tokenizer_files(tmp, tok, (TEMPLATES / tname).read_text(), False)
        tok_hf = AutoTokenizer.from_pretrained(str(tmp))
        for name, msgs, kw in TEMPLATE_CASES:
            kwargs = dict(kw)
            add_gen = kwargs.pop("add_generation_prompt", True)
            tools = kwargs.pop("tools", None)
            text = tok_hf.apply_chat_template(msgs, tools=tools, tokenize=False,
                                              add_generation_prompt=add_gen, **kwargs)
            cases.append({"template": tname, "name": name, "messages": msgs, "tools": tools,
                          "add_generation_prompt": add_gen, "kwargs": kwargs, "rendered": text})
        # An error raised by the template itself.
        try:
            tok_hf.apply_chat_template([{"role": "assistant", "content": "x"}], tokenize=False)
            raise AssertionError("expected the template to raise")
        except Exception as e:  # jinja2 TemplateError
            cases.append({"template": tname, "name": "no_user_query",
                          "messages": [{"role": "assistant", "content": "x"}], "tools": None,
                          "add_generation_prompt": False, "kwargs": {}, "error": str(e)})
    shutil.rmtree(tmp)
    (d / "golden.json").write_text(json.dumps({"cases": cases}, indent=1, ensure_ascii=False) + "\n")
    print(f"templates: {len(cases)} cases")


TOKENIZER_STRINGS = [
    "Hello, world!",
    "<|im_start|>user\nIs 91 prime?<|im_end|>\n<|im_start|>assistant\n<think>\n",
    "  leading spaces and trailing   ",
    "Grüße aus München — naïve café",
    "日本語のテキストと中文文本。",
    "Emoji 🙂🚀🧠 ∑∫",
    "tabs\tand\nnewlines\r\n\n",
    "It's we've they'll I'd",
    "12345 + 678 = 13023",
    "<think>\nreason</think>\n\nanswer<|im_end|>",
    "e\u0301 composed by NFC",
]


def build_tokenizer_goldens(tok: Tokenizer):
    d = OUT / "tokenizer"
    d.mkdir(parents=True, exist_ok=True)
    cases = []
    for s in TOKENIZER_STRINGS:
        enc = tok.encode(s, add_special_tokens=False)
        cases.append({"text": s, "ids": enc.ids,
                      "decoded": tok.decode(enc.ids, skip_special_tokens=False)})
    (d / "golden.json").write_text(json.dumps({"cases": cases}, indent=1, ensure_ascii=False) + "\n")
    tok.save(str(d / "tokenizer.json"))
    print(f"tokenizer: {len(cases)} cases, vocab {tok.get_vocab_size(with_added_tokens=True)}")


def main():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    torch.use_deterministic_algorithms(True)
    only = set(sys.argv[1:])
    tok = build_tokenizer()
    OUT.mkdir(parents=True, exist_ok=True)
    if not only or "tokenizer" in only:
        build_tokenizer_goldens(tok)
    if not only or "templates" in only:
        build_template_goldens(tok)
    for i, fx in enumerate(FIXTURES):
        if not only or fx["name"] in only:
            build_fixture(fx, tok, seed=1000 + i)


if __name__ == "__main__":
    main()
