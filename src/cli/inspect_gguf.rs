//! `deltascope inspect --model FILE.gguf`: what a GGUF holds, from its header alone — the
//! architecture, the file type llama.cpp names, the quant mix (tensors, bytes and share per
//! type), which tensors stay F32, tensors of a type deltascope cannot dequantise, and GDN state
//! inputs quantised below 8 bits.
//! A developer tool (architecture.json): it reads the file through the model crate directly.

use std::io::{self, Write};
use std::path::Path;

use serde::Serialize;

use super::report::{Report, emit};
use deltascope_model::gguf::{GgufFile, QuantShare};
use deltascope_model::human_bytes;

/// What `inspect` reports of a GGUF file.
#[derive(Serialize)]
struct GgufReport {
    file: String,
    /// The parts of a split set (one for a single file).
    parts: usize,
    bytes: u64,
    version: u32,
    architecture: Option<String>,
    /// `general.file_type` as llama.cpp names it ("Q4_K_M").
    file_type: Option<&'static str>,
    tensors: usize,
    metadata_keys: usize,
    quant_mix: Vec<QuantShare>,
    /// The F32 tensors, by their name within a block (`attn_norm.weight`, `ssm_a`), once each.
    stays_f32: Vec<String>,
    /// Tensors of a type deltascope cannot dequantise: (tensor, type).
    unsupported: Vec<(String, String)>,
    /// GDN state inputs stored below 8 bits a value: (tensor, type).
    low_bit_state_inputs: Vec<(String, String)>,
}

pub fn run(path: &Path, json: bool) -> anyhow::Result<()> {
    let files: Vec<GgufFile> =
        deltascope_model::gguf::parts(path)?.iter().map(|p| GgufFile::open(p)).collect::<Result<_, _>>()?;
    let mut whole = report(&files[0]);
    for f in &files[1..] {
        whole.add(report(f));
    }
    emit(&whole, json)
}

impl GgufReport {
    /// Another part of the same split set: its tensors counted in (the metadata is the first
    /// part's, where llama.cpp's gguf-split keeps it).
    fn add(&mut self, part: GgufReport) {
        self.parts += 1;
        self.bytes += part.bytes;
        self.tensors += part.tensors;
        for m in part.quant_mix {
            match self.quant_mix.iter_mut().find(|q| q.ty == m.ty) {
                Some(q) => {
                    q.tensors += m.tensors;
                    q.bytes += m.bytes;
                }
                None => self.quant_mix.push(m),
            }
        }
        let total: u64 = self.quant_mix.iter().map(|q| q.bytes).sum();
        for q in &mut self.quant_mix {
            q.share = if total == 0 { 0.0 } else { q.bytes as f64 / total as f64 };
        }
        self.quant_mix.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.ty.cmp(&b.ty)));
        for f in part.stays_f32 {
            if !self.stays_f32.contains(&f) {
                self.stays_f32.push(f);
            }
        }
        self.unsupported.extend(part.unsupported);
        self.low_bit_state_inputs.extend(part.low_bit_state_inputs);
    }
}

fn report(file: &GgufFile) -> GgufReport {
    let h = file.header();
    let mut stays_f32: Vec<String> = vec![];
    for t in h.tensors.iter().filter(|t| t.type_name() == "F32") {
        let within = block_local(&t.name);
        if !stays_f32.iter().any(|s| s == within) {
            stays_f32.push(within.to_string());
        }
    }
    let pairs = |v: Vec<(&str, String)>| v.into_iter().map(|(n, t)| (n.to_string(), t)).collect();
    GgufReport {
        file: file.path().display().to_string(),
        parts: 1,
        bytes: file.len(),
        version: h.version,
        architecture: h.architecture().map(str::to_string),
        file_type: file.file_type(),
        tensors: h.tensors.len(),
        metadata_keys: h.metadata.len(),
        quant_mix: file.quant_mix(),
        stays_f32,
        unsupported: pairs(file.unsupported()),
        low_bit_state_inputs: file
            .low_bit_state_inputs()
            .into_iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect(),
    }
}

/// `blk.12.ssm_a` → `ssm_a`; a name outside the blocks stays whole.
fn block_local(name: &str) -> &str {
    match name.strip_prefix("blk.").and_then(|rest| rest.split_once('.')) {
        Some((n, within)) if n.bytes().all(|b| b.is_ascii_digit()) => within,
        _ => name,
    }
}

impl Report for GgufReport {
    fn print_human(&self, w: &mut dyn Write) -> io::Result<()> {
        let set =
            if self.parts > 1 { format!(", the first of a split set of {} parts", self.parts) } else { String::new() };
        writeln!(w, "file: {} ({}, GGUF v{}{set})", self.file, human_bytes(self.bytes), self.version)?;
        let arch = self.architecture.as_deref().unwrap_or("(no general.architecture)");
        let ftype = self.file_type.map(|t| format!(" · {t}")).unwrap_or_default();
        writeln!(w, "architecture: {arch}{ftype} · {} tensors · {} metadata keys", self.tensors, self.metadata_keys)?;
        writeln!(w, "quant mix:")?;
        for m in &self.quant_mix {
            writeln!(
                w,
                "  {:<8} {:>5} tensors  {:>10}  {:>5.1}%",
                m.ty,
                m.tensors,
                human_bytes(m.bytes),
                m.share * 100.0
            )?;
        }
        if !self.stays_f32.is_empty() {
            writeln!(w, "stays F32: {}", self.stays_f32.join(", "))?;
        }
        if let Some((first, ty)) = self.unsupported.first() {
            writeln!(
                w,
                "⚠ {} tensors of a type deltascope cannot dequantise (the first: {first}, {ty})",
                self.unsupported.len()
            )?;
        }
        if let Some((first, ty)) = self.low_bit_state_inputs.first() {
            writeln!(
                w,
                "⚠ {} GDN state inputs (ssm_alpha / ssm_beta / ssm_a / ssm_dt) are below 8 bits (the first: {first}, {ty}): such quantisation has been reported to collapse reasoning depth",
                self.low_bit_state_inputs.len()
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_local_names() {
        assert_eq!(block_local("blk.12.ssm_a"), "ssm_a");
        assert_eq!(block_local("blk.0.attn_norm.weight"), "attn_norm.weight");
        assert_eq!(block_local("output_norm.weight"), "output_norm.weight");
        assert_eq!(block_local("blk.x.y"), "blk.x.y");
    }
}
