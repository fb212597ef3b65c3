//! Safetensors checkpoints: single file or sharded through `model.safetensors.index.json`,
//! memory-mapped, BF16 / F16 / F32 storage. Tensors are looked up by their full checkpoint name;
//! the model decides the prefixes (`model.language_model.`, `model.`, `mtp.`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use safetensors::{Dtype, SafeTensors};

use super::fp8::{BLOCK, Fp8Format, Fp8Weights};
use super::fp8_codes::is_nan_code;
use super::gguf::store::GgufStore;
use super::storage::{Plain, Values, Weights};
use crate::checkpoint::{FileBytes, ModelSource};
use crate::error::{Error, Result};

const INDEX_FILE: &str = "model.safetensors.index.json";
const SINGLE_FILE: &str = "model.safetensors";

struct Shard {
    /// File name inside the model directory.
    name: String,
    bytes: Arc<FileBytes>,
    /// Offset of the data section (after the 8-byte length and the JSON header).
    data_start: usize,
}

struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

pub struct WeightStore {
    /// A GGUF model's tensors, read by their transformers names (`None`: safetensors).
    gguf: Option<GgufStore>,
    source: ModelSource,
    shards: Vec<Shard>,
    index: HashMap<String, Entry>,
    /// config.json's FP8 `quantization_config`, once the caller has read it ([`WeightStore::expect_fp8`]).
    fp8: Option<Fp8Format>,
}

/// Bytes per element of a safetensors dtype name (`None` for names this build does not know).
fn dtype_size(name: &str) -> Option<usize> {
    Some(match name {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" => 8,
        _ => return None,
    })
}

/// Which tensor of a header the safetensors crate refused, and why: its dtype, a shape whose
/// size its offsets do not span, offsets past the data, or a gap or overlap with its
/// neighbour. `None` when the header itself cannot be read (then the file is not safetensors).
fn header_problem(bytes: &[u8]) -> Option<String> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(bytes.get(8..8usize.checked_add(n)?)?).ok()?;
    let data_len = bytes.len() - 8 - n;
    let mut spans = vec![];
    for (name, info) in header.iter().filter(|(k, _)| *k != "__metadata__") {
        let dtype = info.get("dtype").and_then(|d| d.as_str()).unwrap_or("?");
        let Some(size) = dtype_size(dtype) else {
            return Some(format!("tensor `{name}` has dtype {dtype:?}, which safetensors does not define"));
        };
        let shape: Option<Vec<usize>> = info
            .get("shape")
            .and_then(|s| s.as_array())
            .map(|a| a.iter().filter_map(|d| d.as_u64().map(|d| d as usize)).collect());
        let offsets: Option<Vec<usize>> = info
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .map(|a| a.iter().filter_map(|d| d.as_u64().map(|d| d as usize)).collect());
        let (Some(shape), Some(offsets)) = (shape, offsets) else {
            return Some(format!("tensor `{name}`: its shape or data_offsets is not a list of whole numbers"));
        };
        let [start, end] = offsets[..] else {
            return Some(format!("tensor `{name}`: data_offsets {offsets:?} is not [start, end]"));
        };
        let want = shape.iter().product::<usize>() * size;
        if end < start || end - start != want {
            return Some(format!(
                "tensor `{name}`: shape {shape:?} in {dtype} is {want} bytes, but its data_offsets [{start}, {end}] hold {}",
                end as i64 - start as i64
            ));
        }
        if end > data_len {
            return Some(format!(
                "tensor `{name}`: data_offsets [{start}, {end}] run past the {data_len} bytes of data (a truncated file?)"
            ));
        }
        spans.push((start, end, name));
    }
    spans.sort();
    let mut at = 0;
    for (start, end, name) in spans {
        if start != at {
            return Some(format!(
                "tensor `{name}` starts at byte {start} of the data, expected {at} (a gap or an overlap with the tensor before it)"
            ));
        }
        at = end;
    }
    None
}

impl WeightStore {
    pub fn open(source: &ModelSource) -> Result<Self> {
        let mut store =
            WeightStore { gguf: None, source: source.clone(), shards: vec![], index: HashMap::new(), fp8: None };
        if let ModelSource::Gguf(g) = source {
            let config = super::config::read_config(source)?;
            store.gguf = Some(GgufStore::open(source, &g.parts, &config)?);
            return Ok(store);
        }
        if source.present(INDEX_FILE) && source.present(SINGLE_FILE) {
            // Which one is stale cannot be told from here; loading either could be wrong.
            return Err(Error::Unsupported {
                file: source.dir().display().to_string(),
                message: format!(
                    "holds both {SINGLE_FILE} and {INDEX_FILE} (a single-file checkpoint and a sharded one): remove the one that does not belong"
                ),
            });
        }
        if let Some(index) = source.read_json(INDEX_FILE)? {
            let file = source.file_label(INDEX_FILE);
            let map = index
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| Error::field(&file, "weight_map", "missing or not an object"))?;
            // Open every shard the index names, in a stable order.
            let mut by_file: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for (tensor, f) in map {
                let f = f
                    .as_str()
                    .ok_or_else(|| Error::field(&file, &format!("weight_map.{tensor}"), "expected a file name"))?;
                by_file.entry(f).or_default().push(tensor);
            }
            for (fname, tensors) in by_file {
                // A shard is a file in the model directory: `../../etc/passwd` or `/x` is not.
                let inside = std::path::Path::new(fname)
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir));
                if !inside || fname.is_empty() {
                    return Err(Error::field(
                        &file,
                        &format!("weight_map.{}", tensors[0]),
                        format!("shard \"{fname}\" is not a file inside the model directory (refused)"),
                    ));
                }
                if !source.present(fname) {
                    return Err(Error::MissingFile {
                        dir: source.dir(),
                        file: fname.to_string(),
                        hint: format!("{INDEX_FILE} maps {} tensors to it", tensors.len()),
                    });
                }
                let shard = store.add_shard(fname)?;
                for t in tensors {
                    if store.index.get(t).map(|e| e.shard) != Some(shard) {
                        return Err(Error::MissingTensor {
                            name: t.to_string(),
                            searched: format!("{} (where {INDEX_FILE} says it is)", source.file_label(fname)),
                        });
                    }
                }
            }
        } else if source.present(SINGLE_FILE) {
            store.add_shard(SINGLE_FILE)?;
        } else {
            return Err(Error::MissingFile {
                dir: source.dir(),
                file: SINGLE_FILE.into(),
                hint: format!("a checkpoint needs {SINGLE_FILE}, or {INDEX_FILE} and its shards"),
            });
        }
        Ok(store)
    }

    fn add_shard(&mut self, name: &str) -> Result<usize> {
        let bytes = self.source.map(name)?;
        let label = self.source.file_label(name);
        let (header_len, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| Error::Safetensors {
            file: label.clone(),
            message: match header_problem(&bytes) {
                // The crate's message names no tensor; the header says which one is wrong.
                Some(which) => format!("{e}: {which}"),
                None => format!("{e} (is the file truncated or not a safetensors file?)"),
            },
        })?;
        let shard = self.shards.len();
        for (tname, info) in meta.tensors() {
            let (start, end) = info.data_offsets;
            self.index.insert(tname, Entry { shard, dtype: info.dtype, shape: info.shape.clone(), start, end });
        }
        self.shards.push(Shard { name: name.to_string(), bytes: Arc::new(bytes), data_start: 8 + header_len });
        Ok(shard)
    }

    /// Reads F8_E4M3 tensors as config.json's `quantization_config` describes (`None`: the
    /// checkpoint is not quantised, and an F8_E4M3 tensor in it is an error that says so).
    pub fn expect_fp8(&mut self, format: Option<Fp8Format>) {
        self.fp8 = format;
    }

    /// The first F8_E4M3 tensor, by name (for the check that config.json declares FP8).
    pub fn first_fp8_tensor(&self) -> Option<&str> {
        if self.gguf.is_some() {
            return None;
        }
        self.index.iter().filter(|(_, e)| e.dtype == Dtype::F8_E4M3).map(|(n, _)| n.as_str()).min()
    }

    pub fn contains(&self, name: &str) -> bool {
        if let Some(g) = &self.gguf {
            return g.contains(name);
        }
        self.index.contains_key(name)
    }

    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        if let Some(g) = &self.gguf {
            return g.shape(name);
        }
        self.index.get(name).map(|e| e.shape.as_slice())
    }

    pub fn names(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        match &self.gguf {
            Some(g) => Box::new(g.names()),
            None => Box::new(self.index.keys().map(String::as_str)),
        }
    }

    /// Total bytes of tensor data across the shards, and the count per storage dtype.
    pub fn stored_bytes(&self) -> usize {
        if let Some(g) = &self.gguf {
            return g.stored_bytes();
        }
        self.index.values().map(|e| e.end - e.start).sum()
    }

    /// Stored bytes of one tensor (0 when absent).
    pub fn tensor_bytes(&self, name: &str) -> usize {
        if let Some(g) = &self.gguf {
            return g.tensor_bytes(name);
        }
        self.index.get(name).map_or(0, |e| e.end - e.start)
    }

    /// Stored bytes of the tensors whose names `keep` accepts.
    pub fn bytes_where(&self, keep: impl Fn(&str) -> bool) -> usize {
        if let Some(g) = &self.gguf {
            return g.bytes_where(keep);
        }
        self.index.iter().filter(|(n, _)| keep(n)).map(|(_, e)| e.end - e.start).sum()
    }

    pub fn dtype_names(&self) -> Vec<String> {
        if let Some(g) = &self.gguf {
            return g.dtype_names();
        }
        let mut v: Vec<String> = self.index.values().map(|e| format!("{:?}", e.dtype)).collect();
        v.sort();
        v.dedup();
        v
    }

    fn searched(&self) -> String {
        let files: Vec<String> = self.shards.iter().map(|s| self.source.file_label(&s.name)).collect();
        files.join(", ")
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.index.get(name).ok_or_else(|| Error::MissingTensor { name: name.to_string(), searched: self.searched() })
    }

    /// A tensor in its stored dtype (F32, BF16 or F16), shape-checked: a view into the mapped
    /// file where its bytes are aligned for the dtype (no copy; its pages become resident as
    /// the kernels read them), else a copy (and the file's pages are released again).
    pub fn load_weights(&self, name: &str, expected: &[usize]) -> Result<Weights> {
        if let Some(g) = &self.gguf {
            return g.load_weights(name, expected);
        }
        let (e, bytes) = self.checked(name, expected)?;
        let shard = &self.shards[e.shard];
        let at = shard.data_start + e.start;
        fn values<T: Plain>(file: &Arc<FileBytes>, at: usize, bytes: &[u8], decode: fn(&[u8]) -> T) -> Values<T> {
            let n = bytes.len() / std::mem::size_of::<T>();
            Values::view(file, at, n)
                .unwrap_or_else(|| Values::Owned(bytes.chunks_exact(std::mem::size_of::<T>()).map(decode).collect()))
        }
        let half = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]);
        let w = match e.dtype {
            Dtype::F32 => {
                Weights::F32(values(&shard.bytes, at, bytes, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            }
            Dtype::BF16 => Weights::Bf16(values(&shard.bytes, at, bytes, half)),
            Dtype::F16 => Weights::F16(values(&shard.bytes, at, bytes, half)),
            Dtype::F8_E4M3 => {
                Weights::Fp8(self.fp8_weights(name, expected, values(&shard.bytes, at, bytes, |b| b[0]))?)
            }
            other => {
                return Err(Error::TensorDtype {
                    file: self.source.file_label(&self.shards[e.shard].name),
                    name: name.to_string(),
                    found: format!("{other:?}"),
                });
            }
        };
        if !w.is_mapped() {
            self.release(name);
        }
        if !matches!(w, Weights::Fp8(_)) && self.contains(&format!("{name}_scale_inv")) {
            return Err(self.fp8_error(
                name,
                format!("is stored as {:?} but has a weight_scale_inv: only F8_E4M3 weights have scales", e.dtype),
            ));
        }
        Ok(w)
    }

    /// A matrix as [`WeightStore::load_weights`] reads it, except that a GGUF's columns may
    /// stay in the order the file stores them: then the order of the matrix's input that
    /// undoes it comes with it (`x'[order[c]] = x[c]`).
    pub fn load_weights_in_stored_order(
        &self,
        name: &str,
        expected: &[usize],
    ) -> Result<(Weights, Option<Vec<usize>>)> {
        match &self.gguf {
            Some(g) => g.load_weights_in_stored_order(name, expected),
            None => Ok((self.load_weights(name, expected)?, None)),
        }
    }

    fn fp8_error(&self, name: &str, message: String) -> Error {
        let file = self
            .index
            .get(name)
            .map_or_else(|| self.searched(), |e| self.source.file_label(&self.shards[e.shard].name));
        Error::Fp8Tensor { file, name: name.to_string(), message }
    }

    /// An F8_E4M3 matrix and its block scales (`<name>_scale_inv`, `[ceil(rows / 128),
    /// ceil(cols / 128)]`, any float dtype, read as f32), checked: config.json declares FP8,
    /// the module is not one it lists as unconverted, no code is NaN, every scale is finite.
    fn fp8_weights(&self, name: &str, shape: &[usize], q: Values<u8>) -> Result<Fp8Weights> {
        let Some(format) = &self.fp8 else {
            return Err(self.fp8_error(
                name,
                "is stored as F8_E4M3, but config.json has no quantization_config (quant_method \"fp8\") to say how to read it".into(),
            ));
        };
        let module = name.strip_suffix(".weight").unwrap_or(name);
        if let Some(m) = format.modules_to_not_convert.iter().find(|m| *m == module) {
            return Err(self.fp8_error(
                name,
                format!("is F8_E4M3, but quantization_config.modules_to_not_convert lists `{m}` as unquantised"),
            ));
        }
        let &[rows, cols] = shape else {
            return Err(self.fp8_error(name, format!("has shape {shape:?}: FP8 weights are matrices [out, in]")));
        };
        let scale_name = format!("{name}_scale_inv");
        if !self.contains(&scale_name) {
            return Err(self.fp8_error(name, format!("has no `{scale_name}` (its per-block scales)")));
        }
        let grid = [rows.div_ceil(BLOCK), cols.div_ceil(BLOCK)];
        let scales = self.load_weights(&scale_name, &grid)?.into_f32();
        self.release(&scale_name);
        if let Some((i, s)) = scales.iter().enumerate().find(|(_, s)| !s.is_finite() || s.abs() > 1e30) {
            return Err(self.fp8_error(
                name,
                format!(
                    "scale of block ({}, {}) is {s}: a scale must be a finite multiplier",
                    i / grid[1],
                    i % grid[1]
                ),
            ));
        }
        // A NaN code (0x7F / 0xFF) would be read as a number by the kernels: refused here.
        if let Some(i) = find_nan_code(&q) {
            return Err(
                self.fp8_error(name, format!("weight ({}, {}) is the NaN code {:#04x}", i / cols, i % cols, q[i]))
            );
        }
        Ok(Fp8Weights { q, scales: scales.into(), cols, row0: 0 })
    }

    /// Tells the kernel this process is done with a tensor's pages in the mapped file (after
    /// copying it out): the resident set holds the weights once, not also the file's copy.
    pub fn release(&self, name: &str) {
        if let Some(g) = &self.gguf {
            return g.release(name);
        }
        if let Some(e) = self.index.get(name) {
            let shard = &self.shards[e.shard];
            shard.bytes.release(shard.data_start + e.start, e.end - e.start);
        }
    }

    /// Starts reading every shard into the page cache in the background (a cold start reads
    /// the file sequentially instead of a page at a time as the first token touches it).
    pub fn prefetch(&self) {
        if let Some(g) = &self.gguf {
            g.prefetch();
        }
        for s in &self.shards {
            s.bytes.will_need();
        }
    }

    /// A tensor's entry and bytes, its shape checked against `expected` and its byte count
    /// against its shape and dtype.
    fn checked(&self, name: &str, expected: &[usize]) -> Result<(&Entry, &[u8])> {
        let e = self.entry(name)?;
        let shard = &self.shards[e.shard];
        if e.shape != expected {
            return Err(Error::TensorShape {
                file: self.source.file_label(&shard.name),
                name: name.to_string(),
                expected: expected.to_vec(),
                found: e.shape.clone(),
            });
        }
        let bytes = &shard.bytes[shard.data_start + e.start..shard.data_start + e.end];
        let n: usize = e.shape.iter().product();
        let width = match e.dtype {
            Dtype::F32 => 4,
            Dtype::BF16 | Dtype::F16 => 2,
            Dtype::F8_E4M3 => 1,
            _ => return Ok((e, bytes)),
        };
        if bytes.len() != n * width {
            // read_metadata validated the offsets; a mismatch here means a corrupt header.
            return Err(Error::Safetensors {
                file: self.source.file_label(&shard.name),
                message: format!(
                    "tensor `{name}` holds {} bytes, which does not match its shape {:?}",
                    bytes.len(),
                    e.shape
                ),
            });
        }
        Ok((e, bytes))
    }

    /// Reads a tensor as f32 (widened from bf16 / f16, always a copy), checking its shape
    /// against `expected`.
    pub fn load_f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let v = self.load_weights(name, expected)?.into_f32();
        self.release(name);
        Ok(v)
    }
}

/// The first NaN code in `q`, searched on every thread a megabyte at a time (the scan reads
/// the weights once at load, as the first token would).
fn find_nan_code(q: &[u8]) -> Option<usize> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 20;
    q.par_chunks(CHUNK)
        .enumerate()
        .find_map_first(|(c, chunk)| chunk.iter().position(|&b| is_nan_code(b)).map(|i| c * CHUNK + i))
}
