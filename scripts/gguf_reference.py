#!/usr/bin/env python3
"""The reference GGUF reader and dequantiser: the `gguf` package (pinned in
scripts/setup-servers.sh), llama.cpp's own Python port. tests/gguf.rs holds deltascope's
reader and dequantisers to it.

  gguf_reference.py dequant TYPE IN OUT   whole blocks of the ggml type TYPE (`Q4_K`, `IQ4_XS`,
                                          ...) read from the file IN; their values written to
                                          OUT as little-endian f32
  gguf_reference.py header FILE           the tensor table of a GGUF file as JSON: name, type,
                                          shape (ggml order), absolute data offset, bytes
"""
import json
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

if sys.argv[1] == "dequant":
    qtype = GGMLQuantizationType[sys.argv[2]]
    raw = np.fromfile(sys.argv[3], dtype=np.uint8)
    np.asarray(dequantize(raw, qtype), dtype="<f4").tofile(sys.argv[4])
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
else:
    sys.exit(f"unknown command {sys.argv[1]!r}")
