#!/usr/bin/env python3
"""Copy a checkpoint with one tensor broken on purpose, to see what a broken GDN layer looks like
in the state scope (README: "The state scope"). Standard library only.

usage: break_checkpoint.py SRC_DIR DST_DIR TENSOR (--add X | --scale X | --nan INDEX)
                           [--rows FROM:TO] [--untie]

  --add X       add X to every value (e.g. dt_bias + 2: every head of the layer forgets faster)
  --scale X     multiply every value by X (e.g. the v rows of in_proj_qkv x 1e6: the state explodes)
  --nan INDEX   set one value to NaN (e.g. A_log[4]: value head 4's decay, and its state, go NaN)
  --rows A:B    only rows A..B of a 2-D tensor (with --add / --scale)
  --untie       first give a checkpoint with tied embeddings its own LM head (a copy,
                lm_head.weight; tie_word_embeddings false), so that breaking embed_tokens
                breaks only the input side: e.g. --nan (ID * hidden) on embed_tokens makes the
                model go NaN mid-sequence, at the first time token ID is fed back, and not before

Works on one-file checkpoints (model.safetensors) stored in F32 or BF16.
"""
import argparse
import json
import math
import shutil
import struct
import sys
from pathlib import Path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("tensor")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--add", type=float)
    what.add_argument("--scale", type=float)
    what.add_argument("--nan", type=int, metavar="INDEX")
    p.add_argument("--rows", metavar="FROM:TO")
    p.add_argument("--untie", action="store_true")
    a = p.parse_args()

    if a.dst.exists():
        sys.exit(f"{a.dst} exists: give a new directory")
    src_file = a.src / "model.safetensors"
    if not src_file.is_file():
        sys.exit(f"{src_file}: not found (only one-file checkpoints are supported)")
    shutil.copytree(a.src, a.dst)
    path = a.dst / "model.safetensors"
    raw = bytearray(path.read_bytes())
    if a.untie:
        raw = untie(raw, a.dst / "config.json")
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    t = header.get(a.tensor)
    if t is None:
        names = [k for k in header if k != "__metadata__" and "linear_attn" in k][:8]
        sys.exit(f"{a.tensor}: no such tensor (GDN tensors look like: {', '.join(names)})")
    dtype, shape = t["dtype"], t["shape"]
    width = {"F32": 4, "BF16": 2}.get(dtype)
    if width is None:
        sys.exit(f"{a.tensor} is {dtype}: only F32 and BF16 are supported")
    start = 8 + n + t["data_offsets"][0]
    count = (t["data_offsets"][1] - t["data_offsets"][0]) // width
    row = count // shape[0] if shape else count
    lo, hi = 0, count
    if a.rows:
        r0, r1 = (int(x) for x in a.rows.split(":"))
        lo, hi = r0 * row, r1 * row

    def get(i):
        o = start + i * width
        if dtype == "F32":
            return struct.unpack_from("<f", raw, o)[0]
        return struct.unpack("<f", struct.pack("<I", struct.unpack_from("<H", raw, o)[0] << 16))[0]

    def put(i, v):
        o = start + i * width
        if dtype == "F32":
            struct.pack_into("<f", raw, o, v)
        else:
            bits = struct.unpack("<I", struct.pack("<f", v))[0]
            if not math.isnan(v):
                bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
            struct.pack_into("<H", raw, o, (bits >> 16) & 0xFFFF)

    if a.nan is not None:
        if not 0 <= a.nan < count:
            sys.exit(f"--nan {a.nan}: {a.tensor} has {count} values")
        put(a.nan, float("nan"))
    else:
        for i in range(lo, hi):
            put(i, get(i) + a.add if a.add is not None else get(i) * a.scale)
    path.write_bytes(raw)
    print(f"wrote {a.dst}: {a.tensor} {dtype} {shape} changed")


def untie(raw, config_path):
    """The checkpoint with `lm_head.weight`, a copy of the input embeddings, appended, and
    `tie_word_embeddings` false in its config (top level and text_config)."""
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    if "lm_head.weight" in header:
        sys.exit("--untie: the checkpoint already has lm_head.weight")
    embed = [k for k in header if k.endswith("embed_tokens.weight") and not k.startswith("mtp")]
    if len(embed) != 1:
        sys.exit(f"--untie: expected one embed_tokens.weight, found {embed}")
    e = header[embed[0]]
    lo, hi = e["data_offsets"]
    end = len(data)
    header["lm_head.weight"] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [end, end + hi - lo]}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    config = json.loads(config_path.read_text())
    for c in (config, config.get("text_config")):
        if isinstance(c, dict) and "tie_word_embeddings" in c:
            c["tie_word_embeddings"] = False
    config_path.write_text(json.dumps(config, indent=2))
    return bytearray(struct.pack("<Q", len(text)) + text + data + data[lo:hi])


if __name__ == "__main__":
    main()
