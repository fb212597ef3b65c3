//! Which Hugging Face tensor each GGUF tensor stands for, and how to undo what llama.cpp's
//! converter (`conversion/qwen.py` at b11434) did to it:
//!
//! - every zero-centred RMSNorm is stored as `1 + w` (the GDN gated norm, `ssm_norm`, as is);
//! - `A_log` is stored as `ssm_a = −exp(A_log)`, `dt_bias` as `ssm_dt.bias`;
//! - the conv1d kernel is squeezed to `{kernel, channels}`;
//! - when value heads outnumber key heads (Qwen3.5 / 3.6 / 3.8), the V heads are reordered from
//!   grouped by key head `[K0v0, K0v1, …, K1v0, …]` to tiled `[K0v0, K1v0, …, K0v1, …]` in the V
//!   rows of `attn_qkv`, the rows of `attn_gate`, `ssm_alpha`, `ssm_beta`, `ssm_a`, `ssm_dt`, the
//!   V channels of `ssm_conv1d`, and the columns of `ssm_out`;
//! - Qwen3-Next's fused `in_proj_qkvz` is split into `attn_qkv` + `attn_gate`;
//! - the experts of a MoE layer are stacked per projection (`ffn_gate_exps`, `ffn_up_exps`,
//!   `ffn_down_exps`);
//! - the MTP block is block `n_layer`, with `nextn.*` for its own tensors.
//!
//! A plan says, for each Hugging Face name, which element ranges of which GGUF tensors make it,
//! in order, then a column permutation and an elementwise map. Whole rows can be reordered on
//! quantised data; columns and the maps need the values.

use std::collections::BTreeMap;

use super::container::TensorInfo;
use crate::model::config::{Family, ModelConfig};

/// An elementwise map undoing a stored transform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ValueMap {
    Identity,
    /// Stored `1 + w`: `w = stored − 1`.
    MinusOne,
    /// Stored `−exp(A_log)`: `A_log = ln(−stored)`.
    LogOfNegated,
}

/// Elements `start..start + len` (row-major, ggml order) of GGUF tensor `tensor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub tensor: usize,
    pub start: usize,
    pub len: usize,
}

/// One Hugging Face tensor as GGUF data.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Planned {
    /// The shape the Hugging Face checkpoint has.
    pub shape: Vec<usize>,
    pub spans: Vec<Span>,
    /// `out[r][c] = in[r][perm[c]]` on rows of `perm.len()` values.
    pub col_perm: Option<Vec<usize>>,
    pub map: ValueMap,
}

impl Planned {
    fn whole(t: usize, info: &TensorInfo, shape: Vec<usize>) -> Planned {
        let len = info.values() as usize;
        Planned { shape, spans: vec![Span { tensor: t, start: 0, len }], col_perm: None, map: ValueMap::Identity }
    }

    fn with_map(mut self, map: ValueMap) -> Planned {
        self.map = map;
        self
    }
}

/// The plan for a file's tensors, and the GGUF tensors it leaves unused (by name).
pub(crate) struct Plan {
    pub tensors: BTreeMap<String, Planned>,
    pub unused: Vec<String>,
}

/// The V-head geometry of the GDN layers.
struct Heads {
    key_heads: usize,
    per_key: usize,
    /// Rows (or channels) before the V part in `attn_qkv` / `ssm_conv1d`: `2 · key_dim`.
    qk: usize,
    value_dim: usize,
    reordered: bool,
}

impl Heads {
    /// Where original V head `o` (grouped: key head `o / r`, its `o % r`-th value head) sits
    /// in the converter's tiled order.
    fn stored(&self, o: usize) -> usize {
        if !self.reordered {
            return o;
        }
        let (i, j) = (o / self.per_key, o % self.per_key);
        j * self.key_heads + i
    }

    fn heads(&self) -> usize {
        self.key_heads * self.per_key
    }

    /// Spans taking `unit`-row heads (rows of `row_len` values) from tensor `t`, whose first
    /// `skip` rows are not V heads, back into grouped order.
    fn rows(&self, t: usize, skip: usize, unit: usize, row_len: usize) -> Vec<Span> {
        let mut spans = vec![];
        if skip > 0 {
            spans.push(Span { tensor: t, start: 0, len: skip * row_len });
        }
        for o in 0..self.heads() {
            let s = self.stored(o);
            spans.push(Span { tensor: t, start: (skip + s * unit) * row_len, len: unit * row_len });
        }
        merge(spans)
    }

    /// The column permutation undoing the reorder on `ssm_out`'s input (V heads of `dv`).
    fn columns(&self, dv: usize) -> Option<Vec<usize>> {
        self.reordered.then(|| (0..self.heads() * dv).map(|c| self.stored(c / dv) * dv + c % dv).collect())
    }
}

/// Adjacent spans of the same tensor joined (an identity reorder becomes one span).
fn merge(spans: Vec<Span>) -> Vec<Span> {
    let mut out: Vec<Span> = vec![];
    for s in spans {
        match out.last_mut() {
            Some(l) if l.tensor == s.tensor && l.start + l.len == s.start => l.len += s.len,
            _ => out.push(s),
        }
    }
    out
}

/// The plan for `tensors` of a model configured as `cfg`.
pub(crate) fn plan(tensors: &[TensorInfo], cfg: &ModelConfig) -> Result<Plan, String> {
    let index: BTreeMap<&str, usize> = tensors.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
    let lin = &cfg.linear;
    let heads = Heads {
        key_heads: lin.num_key_heads,
        per_key: lin.head_ratio(),
        qk: 2 * lin.key_dim(),
        value_dim: lin.value_head_dim,
        reordered: cfg.family != Family::Qwen3Next && lin.num_value_heads != lin.num_key_heads,
    };
    let mut out = Plan { tensors: BTreeMap::new(), unused: vec![] };
    for (t, info) in tensors.iter().enumerate() {
        let ggml_shape: Vec<usize> = info.dims.iter().rev().map(|&d| d as usize).collect();
        let name = info.name.as_str();
        let planned = match name {
            "token_embd.weight" => Some(("model.embed_tokens.weight".to_string(), Planned::whole(t, info, ggml_shape))),
            "output.weight" => Some(("lm_head.weight".to_string(), Planned::whole(t, info, ggml_shape))),
            "output_norm.weight" => Some((
                "model.norm.weight".to_string(),
                Planned::whole(t, info, ggml_shape).with_map(ValueMap::MinusOne),
            )),
            _ => match block(name, cfg.num_hidden_layers) {
                // `nextn.*` names are whole (`mtp.fc.weight`); the rest sit under the block.
                Some((prefix, rest)) => block_tensor(t, info, ggml_shape, rest, cfg, &heads, &index, tensors)?
                    .map(|(n, p)| if n.starts_with("mtp.") { (n, p) } else { (format!("{prefix}{n}"), p) }),
                None => None,
            },
        };
        match planned {
            Some((hf, p)) => {
                out.tensors.insert(hf, p);
            }
            None => out.unused.push(name.to_string()),
        }
    }
    Ok(out)
}

/// `blk.<b>.<rest>`: the Hugging Face prefix of block `b` (a layer, or the MTP block) and the
/// rest of the name.
fn block(name: &str, layers: usize) -> Option<(String, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (b, rest) = rest.split_once('.')?;
    let b: usize = b.parse().ok()?;
    let prefix = if b < layers { format!("model.layers.{b}.") } else { format!("mtp.layers.{}.", b - layers) };
    Some((prefix, rest))
}

/// The Hugging Face name (under the block's prefix, or a full `mtp.` name) and plan of one
/// block tensor; `None` for a tensor the model does not read.
#[allow(clippy::too_many_arguments)]
fn block_tensor(
    t: usize,
    info: &TensorInfo,
    shape: Vec<usize>,
    rest: &str,
    cfg: &ModelConfig,
    heads: &Heads,
    index: &BTreeMap<&str, usize>,
    tensors: &[TensorInfo],
) -> Result<Option<(String, Planned)>, String> {
    let whole = |n: &str| Some((n.to_string(), Planned::whole(t, info, shape.clone())));
    let norm = |n: &str| Some((n.to_string(), Planned::whole(t, info, shape.clone()).with_map(ValueMap::MinusOne)));
    let next = cfg.family == Family::Qwen3Next;
    let dv = heads.value_dim;
    let cols = info.dims.first().copied().unwrap_or(1) as usize;
    let reorder_rows = |n: &str, skip: usize, unit: usize, row_len: usize, map: ValueMap| {
        Some((
            n.to_string(),
            Planned { shape: shape.clone(), spans: heads.rows(t, skip, unit, row_len), col_perm: None, map },
        ))
    };
    Ok(match rest {
        "attn_norm.weight" => norm("input_layernorm.weight"),
        "post_attention_norm.weight" => norm("post_attention_layernorm.weight"),
        "attn_q.weight" => whole("self_attn.q_proj.weight"),
        "attn_k.weight" => whole("self_attn.k_proj.weight"),
        "attn_v.weight" => whole("self_attn.v_proj.weight"),
        "attn_output.weight" => whole("self_attn.o_proj.weight"),
        "attn_q_norm.weight" => norm("self_attn.q_norm.weight"),
        "attn_k_norm.weight" => norm("self_attn.k_norm.weight"),
        // The GDN layer.
        "attn_qkv.weight" if next => {
            let gate = tensors_named(index, &info.name.replace("attn_qkv", "attn_gate"))?;
            let (dk, r, kh) = (cfg.linear.key_head_dim, heads.per_key, heads.key_heads);
            let kd = kh * dk;
            let mut spans = vec![];
            for g in 0..kh {
                spans.push(Span { tensor: t, start: g * dk * cols, len: dk * cols });
                spans.push(Span { tensor: t, start: (kd + g * dk) * cols, len: dk * cols });
                spans.push(Span { tensor: t, start: (2 * kd + g * r * dv) * cols, len: r * dv * cols });
                spans.push(Span { tensor: gate, start: g * r * dv * cols, len: r * dv * cols });
            }
            let rows = 2 * kd + 2 * heads.heads() * dv;
            let gate_rows = tensors[gate].values() as usize / cols.max(1);
            if gate_rows != heads.heads() * dv {
                return Err(format!(
                    "tensor `{}` has {gate_rows} rows, expected {} (value heads × value head size)",
                    tensors[gate].name,
                    heads.heads() * dv
                ));
            }
            Some((
                "linear_attn.in_proj_qkvz.weight".to_string(),
                Planned { shape: vec![rows, cols], spans: merge(spans), col_perm: None, map: ValueMap::Identity },
            ))
        }
        "attn_gate.weight" if next => None,
        "ssm_ba.weight" => whole("linear_attn.in_proj_ba.weight"),
        "attn_qkv.weight" => reorder_rows("linear_attn.in_proj_qkv.weight", heads.qk, dv, cols, ValueMap::Identity),
        "attn_gate.weight" => reorder_rows("linear_attn.in_proj_z.weight", 0, dv, cols, ValueMap::Identity),
        "ssm_beta.weight" => reorder_rows("linear_attn.in_proj_b.weight", 0, 1, cols, ValueMap::Identity),
        "ssm_alpha.weight" => reorder_rows("linear_attn.in_proj_a.weight", 0, 1, cols, ValueMap::Identity),
        "ssm_a" => reorder_rows("linear_attn.A_log", 0, 1, 1, ValueMap::LogOfNegated),
        "ssm_dt.bias" => reorder_rows("linear_attn.dt_bias", 0, 1, 1, ValueMap::Identity),
        "ssm_conv1d.weight" => {
            // `{kernel, channels}`: rows are channels; transformers keeps `[channels, 1, kernel]`.
            let channels = shape.first().copied().unwrap_or(0);
            Some((
                "linear_attn.conv1d.weight".to_string(),
                Planned {
                    shape: vec![channels, 1, cols],
                    spans: heads.rows(t, heads.qk, dv, cols),
                    col_perm: None,
                    map: ValueMap::Identity,
                },
            ))
        }
        "ssm_norm.weight" => whole("linear_attn.norm.weight"),
        "ssm_out.weight" => Some((
            "linear_attn.out_proj.weight".to_string(),
            Planned { col_perm: heads.columns(dv), ..Planned::whole(t, info, shape.clone()) },
        )),
        // The feed-forward block.
        "ffn_gate.weight" => whole("mlp.gate_proj.weight"),
        "ffn_up.weight" => whole("mlp.up_proj.weight"),
        "ffn_down.weight" => whole("mlp.down_proj.weight"),
        "ffn_gate_inp.weight" => whole("mlp.gate.weight"),
        "ffn_gate_shexp.weight" => whole("mlp.shared_expert.gate_proj.weight"),
        "ffn_up_shexp.weight" => whole("mlp.shared_expert.up_proj.weight"),
        "ffn_down_shexp.weight" => whole("mlp.shared_expert.down_proj.weight"),
        "ffn_gate_inp_shexp.weight" => Some((
            "mlp.shared_expert_gate.weight".to_string(),
            Planned::whole(t, info, vec![1, info.values() as usize]),
        )),
        "ffn_gate_up_exps.weight" if !next => whole("mlp.experts.gate_up_proj"),
        "ffn_gate_exps.weight" if !next => {
            // transformers' fused `[E, 2I, H]`: each expert's gate rows, then its up rows.
            let up = tensors_named(index, &info.name.replace("ffn_gate_exps", "ffn_up_exps"))?;
            let [experts, inter, h] = shape[..] else {
                return Err(format!("tensor `{}` has {} dimensions, expected 3", info.name, shape.len()));
            };
            if tensors[up].dims != info.dims {
                return Err(format!(
                    "tensor `{}` has dims {:?}, expected {:?} like `{}`",
                    tensors[up].name, tensors[up].dims, info.dims, info.name
                ));
            }
            let n = inter * h;
            let spans = (0..experts)
                .flat_map(|e| [Span { tensor: t, start: e * n, len: n }, Span { tensor: up, start: e * n, len: n }])
                .collect();
            Some((
                "mlp.experts.gate_up_proj".to_string(),
                Planned { shape: vec![experts, 2 * inter, h], spans, col_perm: None, map: ValueMap::Identity },
            ))
        }
        "ffn_up_exps.weight" if !next => None,
        "ffn_down_exps.weight" if !next => whole("mlp.experts.down_proj"),
        // Qwen3-Next: one tensor per expert and projection.
        "ffn_gate_exps.weight" | "ffn_up_exps.weight" | "ffn_down_exps.weight" => {
            Some(per_expert(t, info, rest, &shape)?)
        }
        "nextn.eh_proj.weight" => Some(("mtp.fc.weight".to_string(), Planned::whole(t, info, shape.clone()))),
        "nextn.enorm.weight" => norm("mtp.pre_fc_norm_embedding.weight"),
        "nextn.hnorm.weight" => norm("mtp.pre_fc_norm_hidden.weight"),
        "nextn.shared_head_norm.weight" => norm("mtp.norm.weight"),
        _ => None,
    })
}

/// Qwen3-Next's experts: `ffn_{gate,up,down}_exps` `[E, rows, cols]` as one
/// `mlp.experts.<e>.<proj>.weight` per expert. Returned as one planned tensor per expert under
/// a combined name the store splits (`mlp.experts.*.gate_proj.weight`).
fn per_expert(t: usize, info: &TensorInfo, rest: &str, shape: &[usize]) -> Result<(String, Planned), String> {
    let [experts, rows, cols] = shape[..] else {
        return Err(format!("tensor `{}` has {} dimensions, expected 3", info.name, shape.len()));
    };
    let proj = match rest {
        "ffn_gate_exps.weight" => "gate_proj",
        "ffn_up_exps.weight" => "up_proj",
        _ => "down_proj",
    };
    let n = rows * cols;
    Ok((
        format!("mlp.experts.*.{proj}.weight"),
        Planned {
            shape: vec![experts, rows, cols],
            spans: (0..experts).map(|e| Span { tensor: t, start: e * n, len: n }).collect(),
            col_perm: None,
            map: ValueMap::Identity,
        },
    ))
}

fn tensors_named(index: &BTreeMap<&str, usize>, name: &str) -> Result<usize, String> {
    index.get(name).copied().ok_or_else(|| format!("tensor `{name}` is missing (its pair is in the file)"))
}

/// Splits the per-expert placeholders (`mlp.experts.*.…`) into one entry per expert.
pub(crate) fn split_experts(plan: &mut Plan) {
    let combined: Vec<String> = plan.tensors.keys().filter(|k| k.contains(".experts.*.")).cloned().collect();
    for name in combined {
        let Some(p) = plan.tensors.remove(&name) else { continue };
        let (rows, cols) = (p.shape[1], p.shape[2]);
        for (e, span) in p.spans.iter().enumerate() {
            plan.tensors.insert(
                name.replace(".experts.*.", &format!(".experts.{e}.")),
                Planned { shape: vec![rows, cols], spans: vec![*span], col_perm: None, map: ValueMap::Identity },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heads(k: usize, r: usize) -> Heads {
        Heads { key_heads: k, per_key: r, qk: 0, value_dim: 2, reordered: r > 1 }
    }

    #[test]
    fn the_inverse_reorder_undoes_the_converters_permutation() {
        // The converter: grouped [K, r, d] -> tiled [r, K, d] (`_reorder_v_heads`).
        let (k, r, d) = (3, 2, 2);
        let grouped: Vec<usize> = (0..k * r * d).collect();
        let mut tiled = vec![0; grouped.len()];
        for i in 0..k {
            for j in 0..r {
                for t in 0..d {
                    tiled[(j * k + i) * d + t] = grouped[(i * r + j) * d + t];
                }
            }
        }
        let h = heads(k, r);
        let spans = h.rows(0, 0, d, 1);
        let back: Vec<usize> = spans.iter().flat_map(|s| tiled[s.start..s.start + s.len].to_vec()).collect();
        assert_eq!(back, grouped);
        // Columns: the same permutation on the input side of `ssm_out`.
        let perm = h.columns(d).unwrap();
        let cols: Vec<usize> = perm.iter().map(|&c| tiled[c]).collect();
        assert_eq!(cols, grouped);
    }

    #[test]
    fn equal_heads_are_one_span() {
        let h = heads(4, 1);
        assert_eq!(h.rows(7, 0, 3, 5), vec![Span { tensor: 7, start: 0, len: 60 }]);
        assert_eq!(h.columns(3), None);
    }
}
