"""An independent reference for the state trace: layer 0 of a Qwen3.5 or Qwen3-Next checkpoint (a Gated-
DeltaNet layer, whose input is the embedding through input_layernorm, so nothing of the
engine's computes it) from the model-spec formulas in NumPy float64, token by token.

usage: python layer0_reference.py MODEL_DIR IDS_JSON
Prints JSON: per token t and value head h, beta[t][h] = sigmoid(b), g[t][h] =
-exp(A_log)*softplus(a + dt_bias), state_norm[t][h] = ||S_t||_F, delta_norm[t][h] =
||S_t - S_{t-1}||_F (model-spec §3.1-§3.6, §5.1).
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np

model_dir, ids = Path(sys.argv[1]), json.loads(sys.argv[2])
cfg = json.loads((model_dir / "config.json").read_text())
cfg = cfg.get("text_config", cfg)


def tensors(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        buf = body[a:b]
        if t["dtype"] == "F32":
            x = np.frombuffer(buf, dtype="<f4").astype(np.float64)
        elif t["dtype"] == "BF16":
            x = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        elif t["dtype"] == "F16":
            x = np.frombuffer(buf, dtype="<f2").astype(np.float64)
        else:
            continue
        out[name] = x.reshape(t["shape"])
    return out


w = tensors(model_dir / "model.safetensors")
prefix = next(p for p in ("model.language_model.", "model.") if p + "embed_tokens.weight" in w)
L = prefix + "layers.0."
eps = cfg.get("rms_norm_eps", 1e-6)
hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
kd, r = hk * dk, hv // hk

x = w[prefix + "embed_tokens.weight"][ids]
x = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * (1.0 + w[L + "input_layernorm.weight"])
if L + "linear_attn.in_proj_qkvz.weight" in w:
    # Qwen3-Next: fused projections grouped per key head (model-spec §2.4), un-interleaved into
    # the logical q | k | v order the conv channels use.
    T = len(ids)
    qkvz = (x @ w[L + "linear_attn.in_proj_qkvz.weight"].T).reshape(T, hk, 2 * dk + 2 * r * dv)
    qg, kg, vg = qkvz[:, :, :dk], qkvz[:, :, dk:2 * dk], qkvz[:, :, 2 * dk:2 * dk + r * dv]
    qkv = np.concatenate([qg.reshape(T, -1), kg.reshape(T, -1), vg.reshape(T, -1)], axis=1)
    ba = (x @ w[L + "linear_attn.in_proj_ba.weight"].T).reshape(T, hk, 2 * r)
    b, a = ba[:, :, :r].reshape(T, hv), ba[:, :, r:].reshape(T, hv)
else:
    qkv = x @ w[L + "linear_attn.in_proj_qkv.weight"].T
    b = x @ w[L + "linear_attn.in_proj_b.weight"].T
    a = x @ w[L + "linear_attn.in_proj_a.weight"].T
conv = w[L + "linear_attn.conv1d.weight"][:, 0, :]  # [channels, K]
K = conv.shape[1]
padded = np.concatenate([np.zeros((K - 1, qkv.shape[1])), qkv])
y = np.stack([(padded[t:t + K] * conv.T).sum(axis=0) for t in range(len(ids))])
y = y / (1.0 + np.exp(-y))  # SiLU
q, k, v = y[:, :kd].reshape(-1, hk, dk), y[:, kd:2 * kd].reshape(-1, hk, dk), y[:, 2 * kd:].reshape(-1, hv, dv)
k = k / np.sqrt((k * k).sum(axis=2, keepdims=True) + 1e-6)
beta = 1.0 / (1.0 + np.exp(-b))
u = a + w[L + "linear_attn.dt_bias"]
softplus = np.where(u > 20, u, np.log1p(np.exp(np.minimum(u, 20))))
g = -np.exp(w[L + "linear_attn.A_log"]) * softplus

S = np.zeros((hv, dk, dv))
state_norm, delta_norm = [], []
for t in range(len(ids)):
    before = S.copy()
    for h in range(hv):
        kt = k[t, h // r]
        S[h] *= np.exp(g[t, h])
        delta = (v[t, h] - S[h].T @ kt) * beta[t, h]
        S[h] += np.outer(kt, delta)
    state_norm.append([float(np.linalg.norm(S[h])) for h in range(hv)])
    delta_norm.append([float(np.linalg.norm(S[h] - before[h])) for h in range(hv)])
print(json.dumps({"beta": beta.tolist(), "g": g.tolist(), "state_norm": state_norm, "delta_norm": delta_norm}))
