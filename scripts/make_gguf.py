#!/usr/bin/env python3
"""Convert the demo Qwen3.5 text model (HF layout) to a GGUF for llama.cpp's `qwen35` arch
(or a Qwen3.5 MoE text model to `qwen35moe`).

    python scripts/make_gguf.py MODEL_DIR OUT.gguf [--outtype f16|bf16|f32] [-q]

An FP8 checkpoint (Qwen's format: F8_E4M3 weights with a `weight_scale_inv` per 128 x 128
block, as `deltascope synth --dtype fp8` and `deltascope quantize --fp8` write) converts with
its FP8 matrices as Q8_0 (dequantised, then quantised in 32-value blocks by gguf-py: about the
same bytes per weight) and everything else at --outtype: the llama.cpp side of the FP8 pair in
scripts/bench-cpu.sh.

Needs only the PyPI packages `gguf` and `numpy` (no torch, no transformers): the
safetensors file is parsed by hand (numpy has no bfloat16, so bf16 words are widened
to f32 by a 16-bit shift, which is exact).

This reproduces what llama.cpp's own converter (convert_hf_to_gguf.py at b11434,
classes Qwen3_5TextModel <- _LinearAttentionVReorderBase <- Qwen3NextModel <-
_QwenMtpMixin, plus TextModel / SpecialVocab) writes for a dense Qwen3.5 text model
with as many DeltaNet V heads as K heads, tied or untied embeddings and an optional MTP head; and,
for Qwen3_5MoeForCausalLM, Qwen3_5MoeTextModel <- Qwen2MoeModel's expert handling (fused
gate_up_proj split into ffn_gate_exps / ffn_up_exps, the router and the shared expert's gate
kept in F32). It is deliberately not a general converter: any config outside that family is
rejected.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("make_gguf.py: the `gguf` package is missing (run scripts/setup-servers.sh, or pip install gguf)")

ARCH = "qwen35"
ARCH_MOE = "qwen35moe"
MOE_FIELDS = ["num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"]

# Fields the conversion reads; a config without any of them is not this model family (a dense
# model also needs intermediate_size, a MoE model MOE_FIELDS).
REQUIRED = [
    "architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "vocab_size",
    "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
    "linear_num_key_heads", "linear_num_value_heads", "rope_parameters",
]


def die(msg: str) -> None:
    sys.exit(f"make_gguf.py: {msg}")


def check_config(cfg: dict) -> None:
    if "text_config" in cfg:
        die("config.json has a text_config (multimodal Qwen3_5ForConditionalGeneration); only the text-only "
            "Qwen3_5ForCausalLM layout is supported")
    missing = [k for k in REQUIRED if k not in cfg]
    if missing:
        die(f"config.json lacks {', '.join(missing)}: not a Qwen3.5 (Gated DeltaNet hybrid) text config")
    if "Qwen3_5MoeForCausalLM" in cfg["architectures"]:
        missing = [k for k in MOE_FIELDS if k not in cfg]
        if missing:
            die(f"config.json lacks {', '.join(missing)}: a Qwen3.5 MoE text config needs them")
    elif "Qwen3_5ForCausalLM" not in cfg["architectures"]:
        die(f"architectures is {cfg['architectures']}, expected Qwen3_5ForCausalLM or Qwen3_5MoeForCausalLM")
    elif "intermediate_size" not in cfg:
        die("config.json lacks intermediate_size")
    if "layer_types" not in cfg:
        # Qwen3_5TextConfig's default: every full_attention_interval-th layer is full attention
        k = cfg.get("full_attention_interval", 4)
        cfg["layer_types"] = ["full_attention" if (i + 1) % k == 0 else "linear_attention"
                              for i in range(cfg["num_hidden_layers"])]
    if len(cfg["layer_types"]) != cfg["num_hidden_layers"]:
        die("layer_types has a different length than num_hidden_layers")
    if set(cfg["layer_types"]) - {"linear_attention", "full_attention"}:
        die(f"unknown layer_types {sorted(set(cfg['layer_types']))}")
    if cfg["linear_key_head_dim"] != cfg["linear_value_head_dim"]:
        # llama.cpp's qwen35 loader sizes both from ssm.state_size (= head_k_dim)
        die("linear_key_head_dim != linear_value_head_dim: llama.cpp's qwen35 cannot load such a model")
    if cfg["linear_num_key_heads"] != cfg["linear_num_value_heads"]:
        # upstream then reorders the V heads from grouped to tiled order
        # (_LinearAttentionVReorderBase); not implemented here, the demo does not need it
        die("linear_num_value_heads != linear_num_key_heads needs the V-head reorder of llama.cpp's "
            "converter, which this script does not implement")
    if cfg.get("attn_output_gate", True) is not True:
        die("attn_output_gate must be true (llama.cpp's qwen35 expects q_proj to carry the output gate)")
    if cfg.get("mtp_use_dedicated_embeddings", False):
        die("mtp_use_dedicated_embeddings=true is not supported")
    rp = cfg["rope_parameters"]
    if rp.get("rope_type", "default") != "default":
        die(f"rope_type {rp.get('rope_type')!r} is not supported (only 'default')")
    if "rope_theta" not in rp:
        die("rope_parameters.rope_theta is missing")


# ---------------------------------------------------------------------------------------------
# safetensors, read by hand

# The FP8 tensors of the checkpoint read last (their GGUF names go out as Q8_0).
FP8_NAMES: set[str] = set()
Q8_GGUF_NAMES: set[str] = set()


def e4m3_table() -> np.ndarray:
    """float8_e4m3fn by its definition: (-1)^S 2^(E-7) (1 + M/8), or 2^-6 M/8 when E = 0; 0x7F/0xFF NaN."""
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 0xF, b & 7
        mag = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        t[b] = np.nan if (b & 0x7F) == 0x7F else (-mag if s else mag)
    return t


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors as float32 numpy arrays (the converter also widens bf16 to f32 first); FP8
    weights dequantised (e4m3 value times their block's scale), their scales dropped."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        buf = raw[base + b: base + e]
        shape = info["shape"]
        dt = info["dtype"]
        if dt == "BF16":
            # bf16 is the top half of an f32: widen by shifting into the high 16 bits (exact)
            a = (buf.view("<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            a = buf.view("<f2").astype(np.float32)
        elif dt == "F32":
            a = buf.view("<f4").astype(np.float32)
        elif dt == "F8_E4M3":
            FP8_NAMES.add(name)
            a = buf  # codes: dequantised below, once every scale is read
        else:
            die(f"tensor {name}: dtype {dt} not supported")
        out[name] = a.reshape(shape)
    table = e4m3_table()
    for name in FP8_NAMES:
        scale = out.pop(name + "_scale_inv", None)
        if scale is None:
            die(f"FP8 tensor {name} has no {name}_scale_inv")
        q = out[name]
        rows, cols = q.shape
        full = np.repeat(np.repeat(scale.astype(np.float64), 128, axis=0), 128, axis=1)[:rows, :cols]
        out[name] = (table[q] * full).astype(np.float32)
    return out


# ---------------------------------------------------------------------------------------------
# tensors

# HF (per layer, after the MTP renaming below) -> GGUF tensor name.  Matches gguf-py's
# TensorNameMap for MODEL_ARCH.QWEN35 (checked against the b11434 tree).
LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    # full attention
    "self_attn.q_proj.weight": "attn_q.weight",  # rows: per head [query(head_dim) | gate(head_dim)], kept as is
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    # Gated DeltaNet (linear attention)
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.A_log": "ssm_a",          # no ".weight": llama.cpp looks up "blk.N.ssm_a"
    "linear_attn.dt_bias": "ssm_dt.bias",  # the converter renames dt_bias -> dt_proj.bias -> ssm_dt.bias
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    # MoE (qwen35moe); experts.gate_up_proj is split in convert_tensors()
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    # MTP (nextn) block extras; see mtp_rename()
    "eh_proj.weight": "nextn.eh_proj.weight",
    "enorm.weight": "nextn.enorm.weight",
    "hnorm.weight": "nextn.hnorm.weight",
    "shared_head.norm.weight": "nextn.shared_head_norm.weight",
}

# The MTP head is stored as one extra decoder block after the trunk (blk.<n_layer>), exactly as
# _QwenMtpMixin.filter_tensors renames it: mtp.layers.i.* -> layer n_layer+i, and the head-level
# mtp.{fc,pre_fc_norm_embedding,pre_fc_norm_hidden,norm} -> nextn.{eh_proj,enorm,hnorm,shared_head_norm}.
MTP_HEAD = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm",
            "norm": "shared_head.norm"}


def mtp_rename(name: str, n_layer: int) -> str:
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[1] == "layers" and parts[2].isdecimal():
        return f"model.layers.{n_layer + int(parts[2])}.{parts[3]}"
    if len(parts) == 3 and parts[1] in MTP_HEAD:
        return f"model.layers.{n_layer}.{MTP_HEAD[parts[1]]}.{parts[2]}"
    die(f"unexpected MTP tensor {name}")
    return ""


def transform(hf_suffix: str, a: np.ndarray) -> np.ndarray:
    """Value transforms of Qwen3NextModel.modify_tensors (all done in f32)."""
    if hf_suffix == "linear_attn.A_log":
        # the graph wants A itself (negative decay rate), not its log: A = -exp(A_log)
        return -np.exp(a)
    if hf_suffix == "linear_attn.conv1d.weight":
        # HF depthwise Conv1d weight is [channels, 1, kernel]; ggml wants {kernel, channels}
        return a.squeeze()
    if hf_suffix.endswith("norm.weight") and hf_suffix != "linear_attn.norm.weight":
        # Qwen3.5 RMSNorms compute x * (1 + w) (zero-centred weights); llama.cpp's rms_norm
        # multiplies by w, so store 1 + w.  The gated norm inside the DeltaNet block
        # (linear_attn.norm) multiplies by w directly and is left alone.  This includes q/k norms
        # and the MTP enorm/hnorm/shared_head.norm.
        return a + 1.0
    return a


def out_dtype(gguf_name: str, a: np.ndarray, outtype: str) -> np.ndarray:
    """Storage type, following ModelBase.prepare_tensors: 1-D tensors, *_norm weights, ssm_conv1d,
    the MoE routers (ffn_gate_inp, ffn_gate_inp_shexp) and anything not ending in ".weight" (ssm_a,
    ssm_dt.bias) stay F32; the rest take --outtype."""
    if (outtype == "f32" or a.ndim <= 1 or gguf_name.endswith("_norm.weight")
            or ".ssm_conv1d." in gguf_name or not gguf_name.endswith(".weight")
            or ".ffn_gate_inp." in gguf_name or ".ffn_gate_inp_shexp." in gguf_name):
        return a.astype(np.float32)
    if outtype == "bf16":
        return to_bf16_bits(a)
    return a.astype(np.float16)  # bf16 -> f16 is exact for |x| in [6.1e-5, 65504]; see main()


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """f32 -> bf16 words, rounded to nearest even (exact for values that came from bf16)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def is_moe(cfg: dict) -> bool:
    return "Qwen3_5MoeForCausalLM" in cfg["architectures"]


def convert_tensors(cfg: dict, st: dict[str, np.ndarray], outtype: str) -> list[tuple[str, np.ndarray]]:
    n_layer = cfg["num_hidden_layers"]
    n_mtp = cfg.get("mtp_num_hidden_layers", 0)
    out: list[tuple[str, np.ndarray]] = []
    for name in sorted(st, key=lambda s: [int(t) if t.isdecimal() else t for t in re.split(r"(\d+)", s)]):
        a = st[name]
        hf = name[len("model."):] if name.startswith("model.") else name
        if hf.startswith("mtp."):
            if n_mtp == 0:
                die(f"{name} present but mtp_num_hidden_layers is 0")
            hf = mtp_rename(hf, n_layer)[len("model."):]
        if hf == "embed_tokens.weight":
            gname = "token_embd.weight"
        elif hf == "norm.weight":
            gname, a = "output_norm.weight", transform("norm.weight", a)
        elif name == "lm_head.weight":
            gname = "output.weight"  # only when embeddings are not tied
        elif (m := re.fullmatch(r"layers\.(\d+)\.mlp\.experts\.gate_up_proj", hf)):
            # [n_expert, 2 * n_ff, n_embd]: gate rows first, then up (Qwen2MoeModel.modify_tensors)
            if a.ndim != 3 or a.shape[1] % 2:
                die(f"{name}: expected [n_expert, 2 * n_ff, n_embd], found {list(a.shape)}")
            ff = a.shape[1] // 2
            for part, rows in (("ffn_gate_exps", a[:, :ff, :]), ("ffn_up_exps", a[:, ff:, :])):
                gname = f"blk.{m.group(1)}.{part}.weight"
                out.append((gname, out_dtype(gname, np.ascontiguousarray(rows), outtype)))
            continue
        else:
            m = re.fullmatch(r"layers\.(\d+)\.(.+)", hf)
            if not m or m.group(2) not in LAYER_MAP:
                die(f"cannot map tensor {name}")
            bid, suffix = int(m.group(1)), m.group(2)
            gname = f"blk.{bid}.{LAYER_MAP[suffix]}"
            a = transform(suffix, a)
            if name in FP8_NAMES:
                Q8_GGUF_NAMES.add(gname)
        out.append((gname, out_dtype(gname, a, outtype)))
    if cfg.get("tie_word_embeddings", False) and any(n == "output.weight" for n, _ in out):
        die("tie_word_embeddings is true but the checkpoint has lm_head.weight")
    # trunk: 2 globals + per linear layer 14 + per full layer 11; MTP: 11 per layer + 4 head tensors;
    # a MoE layer has 8 MLP tensors where a dense one has 3
    n_lin = sum(t == "linear_attention" for t in cfg["layer_types"])
    expect = 2 + 14 * n_lin + 11 * (n_layer - n_lin) + (11 * n_mtp + 4 if n_mtp else 0)
    if is_moe(cfg):
        expect += 5 * (n_layer + n_mtp)
    expect += 0 if cfg.get("tie_word_embeddings", False) else 1
    if len(out) != expect:
        die(f"expected {expect} tensors for this config, the checkpoint gave {len(out)}")
    return out


# ---------------------------------------------------------------------------------------------
# tokenizer (TextModel._set_vocab_gpt2 + SpecialVocab)

def looks_special(tok: str) -> bool:
    # TextModel.does_token_look_special: <|...|> added tokens are CONTROL even if not marked special
    return tok.startswith("<|") and tok.endswith("|>")


def add_vocab(w: gguf.GGUFWriter, model_dir: Path, cfg: dict) -> dict:
    tj = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    tc = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    model = tj.get("model", {})
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        die("tokenizer.json is not a byte-level BPE tokenizer")
    # The pre-tokenizer must be Qwen3.5's split regex (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35);
    # the upstream converter identifies it by hashing a probe encoding (needs transformers), and the
    # demo's small vocab is not in its table anyway, so check the regex itself instead.
    pre = json.dumps(tj.get("pre_tokenizer"))
    if r"[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+" not in pre or "ByteLevel" not in pre:
        die("tokenizer.json pre_tokenizer is not the Qwen3.5 regex + ByteLevel")

    vocab_size = cfg["vocab_size"]
    id_to_tok: dict[int, str] = {i: t for t, i in model["vocab"].items()}
    added = {a["id"]: a for a in tj.get("added_tokens", [])}
    for i, a in added.items():
        id_to_tok[i] = a["content"]
    if max(id_to_tok) >= vocab_size:
        die(f"token id {max(id_to_tok)} >= vocab_size {vocab_size}")

    tokens, types = [], []
    for i in range(vocab_size):  # the embedding matrix has vocab_size rows: pad the gaps
        if i not in id_to_tok:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(id_to_tok[i])
            control = added[i].get("special") or looks_special(id_to_tok[i])
            types.append(gguf.TokenType.CONTROL if control else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(id_to_tok[i])
            types.append(gguf.TokenType.NORMAL)

    merges = model.get("merges", [])
    if merges and isinstance(merges[0], list):
        # new list-of-pairs format; a literal space inside a part is encoded as U+0120, as SpecialVocab does
        merges = [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in p) for p in pair)
                  for pair in merges]

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)

    # SpecialVocab: ids come from tokenizer_config's *_token strings looked up in added_tokens,
    # then config.json's *_token_id only for types still unset. For the demo: eos_token is
    # "<|im_end|>" (482, the end of an assistant turn) and pad "<|endoftext|>" (480); config.json's
    # eos_token_id 480 is therefore ignored, and there is no bos.
    by_content = {a["content"]: i for i, a in added.items()}
    special = {}
    for typ in ("bos", "eos", "unk", "sep", "pad", "cls", "mask"):
        entry = tc.get(f"{typ}_token")
        if isinstance(entry, dict):
            entry = entry.get("content")
        if isinstance(entry, str) and entry in by_content:
            special[typ] = by_content[entry]
    for typ in ("bos", "eos", "unk", "sep", "pad", "cls", "mask"):
        tid = cfg.get(f"{typ}_token_id")
        if typ not in special and isinstance(tid, int) and 0 <= tid < vocab_size:
            special[typ] = tid
    for typ, tid in special.items():
        getattr(w, f"add_{typ}_token_id")(tid)
    for typ in ("bos", "eos"):
        if isinstance(tc.get(f"add_{typ}_token"), bool):
            getattr(w, f"add_add_{typ}_token")(tc[f"add_{typ}_token"])
    template = tc.get("chat_template")
    if template is None and (model_dir / "chat_template.jinja").is_file():
        template = (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    if not template:
        die("no chat template in tokenizer_config.json")
    w.add_chat_template(template)
    return {"n_tokens": len(tokens), "special": special}


# ---------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path, help="HF model folder, e.g. models/demo")
    ap.add_argument("out", type=Path)
    ap.add_argument("--outtype", choices=["f16", "bf16", "f32"], default="f16")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args()

    cfg_path = args.model_dir / "config.json"
    if not cfg_path.is_file():
        die(f"{cfg_path} not found")
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    check_config(cfg)
    st_path = args.model_dir / "model.safetensors"
    if not st_path.is_file():
        die(f"{st_path} not found (sharded checkpoints are not supported)")
    st = load_safetensors(st_path)

    if args.outtype == "f16":
        # bf16 -> f16 loses nothing unless a value is outside f16's normal range; say so if it is
        big = max(float(np.abs(a).max()) for a in st.values())
        if big > 65504:
            die(f"a weight of magnitude {big} overflows f16; use --outtype f32")

    tensors = convert_tensors(cfg, st, args.outtype)

    n_layer = cfg["num_hidden_layers"]
    n_mtp = cfg.get("mtp_num_hidden_layers", 0)
    rp = cfg["rope_parameters"]
    tmp = args.out.with_name(args.out.name + f".tmp{os.getpid()}")
    arch = ARCH_MOE if is_moe(cfg) else ARCH
    w = gguf.GGUFWriter(tmp, arch)
    # general.*
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(args.model_dir.resolve().name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if Q8_GGUF_NAMES else
                    {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "bf16": gguf.LlamaFileType.MOSTLY_BF16}[args.outtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    # TextModel.set_gguf_parameters; block_count includes the MTP block(s) (_QwenMtpMixin)
    w.add_block_count(n_layer + n_mtp)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    if "intermediate_size" in cfg:
        w.add_feed_forward_length(cfg["intermediate_size"])
    if is_moe(cfg):
        # Qwen2MoeModel.set_gguf_parameters
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    # interleaved M-RoPE sections, padded to 4 (a text-only model still uses the imrope kernel);
    # Qwen3.5 loaders require the key, so default to upstream's [11, 11, 10, 0] when absent
    sections = list(rp.get("mrope_section", [11, 11, 10]))
    w.add_rope_dimension_sections((sections + [0, 0, 0, 0])[:4])
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    if n_mtp:
        w.add_nextn_predict_layers(n_mtp)
    # Qwen3NextModel.set_gguf_parameters: Gated DeltaNet geometry
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(cfg["linear_key_head_dim"])
    w.add_ssm_group_count(cfg["linear_num_key_heads"])
    w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
    w.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
    # which blocks are recurrent (DeltaNet); MTP blocks are full attention. gguf 0.19 has no helper.
    recurrent = [t == "linear_attention" for t in cfg["layer_types"]] + [False] * n_mtp
    w.add_array(f"{arch}.attention.recurrent_layers", recurrent)
    w.add_full_attention_interval(cfg.get("full_attention_interval", 4))
    # only the first partial_rotary_factor of each head is rotated
    w.add_rope_dimension_count(int(cfg["head_dim"] * rp.get("partial_rotary_factor", 0.25)))

    try:
        info = add_vocab(w, args.model_dir, cfg)
        for name, a in tensors:
            if name in Q8_GGUF_NAMES:
                # an FP8 matrix: Q8_0 from its dequantised values
                wide = a.astype(np.float32) if a.dtype != np.uint16 else (a.astype(np.uint32) << 16).view(np.float32)
                q8 = gguf.GGMLQuantizationType.Q8_0
                w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(wide), q8), raw_dtype=q8)
                continue
            # bf16 travels as its 16-bit words (numpy has no bfloat16)
            raw = gguf.GGMLQuantizationType.BF16 if a.dtype == np.uint16 else None
            w.add_tensor(name, np.ascontiguousarray(a), raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, args.out)  # atomic: readers never see a half-written GGUF
    finally:
        if tmp.exists():
            tmp.unlink()
    if not args.quiet:
        print(f"wrote {args.out}: {len(tensors)} tensors ({args.outtype}), {info['n_tokens']} tokens, "
              f"special {info['special']}, {args.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
