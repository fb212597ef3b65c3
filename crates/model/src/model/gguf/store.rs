//! A GGUF file (or split set) read as the Hugging Face checkpoint it stands for: tensors looked
//! up by their transformers names, shape-checked, and built from the GGUF data by the plan
//! (`plan.rs`). A tensor the file stores as f32 / f16 / bf16 and the plan takes whole is a view
//! into the mapping; anything else is dequantised exactly (`dequant.rs`) and the converter's
//! transforms undone on the values.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::container::{Gguf, TensorInfo};
use super::dequant::dequantize;
use super::plan::{Plan, Planned, Span, ValueMap, plan, split_experts};
use super::types::GgmlType;
use crate::checkpoint::{FileBytes, ModelSource};
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::quant::QuantWeights;
use crate::model::storage::{Values, Weights};

struct Part {
    label: String,
    bytes: Arc<FileBytes>,
}

pub(crate) struct GgufStore {
    parts: Vec<Part>,
    /// Every tensor of every part, and the part it is in.
    tensors: Vec<(usize, TensorInfo)>,
    plan: BTreeMap<String, Planned>,
}

impl GgufStore {
    /// Maps the parts of `source` and plans its tensors for `config`.
    pub(crate) fn open(source: &ModelSource, parts: &[String], config: &ModelConfig) -> Result<GgufStore> {
        let mut store = GgufStore { parts: vec![], tensors: vec![], plan: BTreeMap::new() };
        for name in parts {
            let bytes = source.map(name)?;
            let label = source.file_label(name);
            let header =
                Gguf::parse(&bytes).map_err(|e| Error::Gguf { file: label.clone(), message: e.to_string() })?;
            let part = store.parts.len();
            store.tensors.extend(header.tensors.into_iter().map(|t| (part, t)));
            store.parts.push(Part { label, bytes: Arc::new(bytes) });
        }
        let infos: Vec<TensorInfo> = store.tensors.iter().map(|(_, t)| t.clone()).collect();
        let mut p: Plan = plan(&infos, config).map_err(|m| store.error(m))?;
        split_experts(&mut p);
        store.plan = p.tensors;
        // What the model does not read (`nextn.embed_tokens`, which repeats the embedding…).
        if !p.unused.is_empty() {
            tracing::info!(tensors = ?p.unused, "GGUF tensors the model does not read");
        }
        Ok(store)
    }

    fn error(&self, message: String) -> Error {
        let files: Vec<&str> = self.parts.iter().map(|p| p.label.as_str()).collect();
        Error::Gguf { file: files.join(", "), message }
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.plan.contains_key(name)
    }

    pub(crate) fn shape(&self, name: &str) -> Option<&[usize]> {
        self.plan.get(name).map(|p| p.shape.as_slice())
    }

    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.plan.keys().map(String::as_str)
    }

    /// The bytes of every tensor in the file(s).
    pub(crate) fn stored_bytes(&self) -> usize {
        self.tensors.iter().map(|(_, t)| t.bytes as usize).sum()
    }

    /// The stored bytes a planned tensor reads.
    pub(crate) fn tensor_bytes(&self, name: &str) -> usize {
        self.plan.get(name).map_or(0, |p| {
            p.spans
                .iter()
                .map(|s| {
                    let t = &self.tensors[s.tensor].1;
                    (t.bytes as u128 * s.len as u128 / t.values().max(1) as u128) as usize
                })
                .sum()
        })
    }

    pub(crate) fn bytes_where(&self, keep: impl Fn(&str) -> bool) -> usize {
        self.plan.keys().filter(|n| keep(n)).map(|n| self.tensor_bytes(n)).sum()
    }

    /// The ggml type names present (`F32`, `Q4_K`…).
    pub(crate) fn dtype_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.tensors.iter().map(|(_, t)| t.type_name()).collect();
        v.sort();
        v.dedup();
        v
    }

    fn label_of(&self, name: &str) -> String {
        let part = self.plan.get(name).and_then(|p| p.spans.first()).map_or(0, |s| self.tensors[s.tensor].0);
        self.parts.get(part).map_or_else(String::new, |p| p.label.clone())
    }

    /// The bytes of elements `start..start + len` of tensor `t`, checked: whole blocks, inside
    /// the tensor.
    fn span_bytes(&self, t: usize, start: usize, len: usize) -> Result<(&[u8], GgmlType)> {
        let (part, info) = &self.tensors[t];
        let ty = info.ty.filter(|ty| ty.is_supported()).ok_or_else(|| Error::TensorDtype {
            file: self.parts[*part].label.clone(),
            name: info.name.clone(),
            found: format!("{} (supported: {})", info.type_name(), supported_list()),
        })?;
        let bv = ty.block_values();
        if !start.is_multiple_of(bv) || !len.is_multiple_of(bv) || start + len > info.values() as usize {
            return Err(Error::Gguf {
                file: self.parts[*part].label.clone(),
                message: format!(
                    "tensor `{}` ({}, blocks of {bv}) cannot be cut at values {start}..{}: its rows are not whole blocks",
                    info.name,
                    ty.name(),
                    start + len
                ),
            });
        }
        let (from, n) = (start / bv * ty.block_bytes(), len / bv * ty.block_bytes());
        let at = info.offset as usize + from;
        Ok((&self.parts[*part].bytes[at..at + n], ty))
    }

    /// A tensor by its Hugging Face name, shape-checked against `expected`.
    pub(crate) fn load_weights(&self, name: &str, expected: &[usize]) -> Result<Weights> {
        let p = self.planned(name, expected)?;
        self.load_planned(name, p)
    }

    /// A matrix whose columns the file may store in another order, as stored, with the order
    /// of its input that undoes it (`x'[order[c]] = x[c]`; `None`: the stored order is the
    /// model's). Quantised columns cannot be permuted (a block spans 32 or 256 of them), so
    /// `ssm_out` stays in the converter's order and its input is permuted instead.
    pub(crate) fn load_weights_in_stored_order(
        &self,
        name: &str,
        expected: &[usize],
    ) -> Result<(Weights, Option<Vec<usize>>)> {
        let p = self.planned(name, expected)?;
        match (&p.col_perm, p.map) {
            (Some(order), ValueMap::Identity) => {
                let stored = Planned { col_perm: None, ..p.clone() };
                Ok((self.load_planned(name, &stored)?, Some(order.clone())))
            }
            _ => Ok((self.load_planned(name, p)?, None)),
        }
    }

    fn planned(&self, name: &str, expected: &[usize]) -> Result<&Planned> {
        let p = self.plan.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
            searched: self.parts.iter().map(|p| p.label.as_str()).collect::<Vec<_>>().join(", "),
        })?;
        if p.shape != expected {
            return Err(Error::TensorShape {
                file: self.label_of(name),
                name: name.to_string(),
                expected: expected.to_vec(),
                found: p.shape.clone(),
            });
        }
        Ok(p)
    }

    /// A view for float data taken whole; the blocks themselves for quantised data the plan
    /// takes in whole rows (the kernels dequantise in registers); else exact f32 values.
    fn load_planned(&self, name: &str, p: &Planned) -> Result<Weights> {
        if let Some(w) = self.view(p) {
            return Ok(w);
        }
        if let Some(w) = self.quantised(name, p)? {
            return Ok(w);
        }
        let mut values = Vec::with_capacity(p.shape.iter().product());
        for s in &p.spans {
            let (bytes, ty) = self.span_bytes(s.tensor, s.start, s.len)?;
            dequantize(ty, bytes, &mut values).map_err(|e| Error::Gguf {
                file: self.label_of(name),
                message: format!("tensor `{}`: {e}", self.tensors[s.tensor].1.name),
            })?;
        }
        if let Some(perm) = &p.col_perm {
            let row = perm.len();
            let mut out = vec![0.0f32; values.len()];
            for (o, i) in out.chunks_exact_mut(row).zip(values.chunks_exact(row)) {
                for (v, &c) in o.iter_mut().zip(perm) {
                    *v = i[c];
                }
            }
            values = out;
        }
        match p.map {
            ValueMap::Identity => {}
            ValueMap::MinusOne => values.iter_mut().for_each(|v| *v -= 1.0),
            ValueMap::LogOfNegated => values.iter_mut().for_each(|v| *v = (-*v).ln()),
        }
        self.release(name);
        Ok(Weights::f32(values))
    }

    /// A block-quantised matrix kept as its blocks: a view when the plan takes one tensor
    /// whole, else its rows gathered (a row reorder moves whole blocks).
    fn quantised(&self, name: &str, p: &Planned) -> Result<Option<Weights>> {
        let ty = |s: &Span| self.tensors[s.tensor].1.ty;
        let Some(first) = p.spans.first() else { return Ok(None) };
        let Some(t) = ty(first).filter(|t| !matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16)) else {
            return Ok(None);
        };
        let cols = p.shape.last().copied().unwrap_or(0);
        if p.map != ValueMap::Identity || p.col_perm.is_some() || p.shape.len() < 2 || cols == 0 {
            return Ok(None);
        }
        if p.spans.iter().any(|s| ty(s) != Some(t)) {
            return Ok(None);
        }
        let rows = p.shape.iter().product::<usize>() / cols;
        let (part, info) = &self.tensors[first.tensor];
        let data = match p.spans[..] {
            [s] if s.start == 0 && s.len == info.values() as usize => {
                Values::view(&self.parts[*part].bytes, info.offset as usize, info.bytes as usize)
            }
            _ => None,
        };
        let data = match data {
            Some(d) => d,
            None => {
                let mut bytes = vec![];
                for s in &p.spans {
                    bytes.extend_from_slice(self.span_bytes(s.tensor, s.start, s.len)?.0);
                }
                self.release(name);
                Values::Owned(bytes)
            }
        };
        let q = QuantWeights::new(t, data, rows, cols)
            .map_err(|m| Error::Gguf { file: self.label_of(name), message: format!("tensor `{}`: {m}", info.name) })?;
        Ok(Some(Weights::Quant(q)))
    }

    /// A view into the mapping for a float tensor the plan takes whole and unchanged.
    fn view(&self, p: &Planned) -> Option<Weights> {
        let [s] = p.spans[..] else { return None };
        let (part, info) = &self.tensors[s.tensor];
        if p.map != ValueMap::Identity || p.col_perm.is_some() || s.start != 0 || s.len != info.values() as usize {
            return None;
        }
        let file = &self.parts[*part].bytes;
        let at = info.offset as usize;
        match info.ty? {
            GgmlType::F32 => Values::view(file, at, s.len).map(Weights::F32),
            GgmlType::F16 => Values::view(file, at, s.len).map(Weights::F16),
            GgmlType::Bf16 => Values::view(file, at, s.len).map(Weights::Bf16),
            _ => None,
        }
    }

    /// Drops a tensor's pages from the resident set after it was copied out.
    pub(crate) fn release(&self, name: &str) {
        let Some(p) = self.plan.get(name) else { return };
        for s in &p.spans {
            let (part, info) = &self.tensors[s.tensor];
            self.parts[*part].bytes.release(info.offset as usize, info.bytes as usize);
        }
    }

    pub(crate) fn prefetch(&self) {
        for p in &self.parts {
            p.bytes.will_need();
        }
    }
}

/// The types this build reads, for messages.
pub(crate) fn supported_list() -> String {
    GgmlType::SUPPORTED.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
}
