//! A GGUF file opened: mapped (nothing read until asked), its header parsed, and the facts
//! `inspect` and the status bar show: the file type llama.cpp names ("Q4_K_M"), the quant mix,
//! and the GDN state inputs quantised below 8 bits.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::container::{Gguf, TensorInfo, Value};
use super::types::GgmlType;
use crate::checkpoint::{FileBytes, ModelSource};
use crate::error::{Error, Result};

/// A GGUF file, mapped, with its header.
pub struct GgufFile {
    path: PathBuf,
    bytes: FileBytes,
    header: Gguf,
}

/// One type's share of a file's tensors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuantShare {
    #[serde(rename = "type")]
    pub ty: String,
    pub tensors: usize,
    pub bytes: u64,
    /// Of the tensors' bytes, 0–1.
    pub share: f64,
}

impl GgufFile {
    /// Maps `path` and parses its header; a malformed header is an error naming the file and
    /// the offset.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let (dir, name) = match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
            (Some(d), Some(n)) => (if d.as_os_str().is_empty() { Path::new(".") } else { d }, n),
            _ => return Err(Error::NotAFile { path: path.to_path_buf(), what: "not a file name".into() }),
        };
        let bytes = ModelSource::Dir(dir.to_path_buf()).map(name)?;
        let header = Gguf::parse(&bytes)
            .map_err(|e| Error::Gguf { file: path.display().to_string(), message: e.to_string() })?;
        Ok(GgufFile { path: path.to_path_buf(), bytes, header })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &Gguf {
        &self.header
    }

    /// The file's size in bytes.
    pub fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// A tensor's bytes (the header checked they lie in the file).
    pub fn tensor_bytes(&self, t: &TensorInfo) -> &[u8] {
        let start = t.offset as usize;
        &self.bytes[start..start + t.bytes as usize]
    }

    /// The file type llama.cpp wrote (`general.file_type`: "Q4_K_M", "Q8_0"), when it says.
    pub fn file_type(&self) -> Option<&'static str> {
        self.header.get("general.file_type").and_then(Value::as_u64).and_then(file_type_name)
    }

    /// Tensors, bytes and share of each type, the largest share first.
    pub fn quant_mix(&self) -> Vec<QuantShare> {
        let mut mix: Vec<QuantShare> = vec![];
        for t in &self.header.tensors {
            let name = t.type_name();
            match mix.iter_mut().find(|m| m.ty == name) {
                Some(m) => {
                    m.tensors += 1;
                    m.bytes += t.bytes;
                }
                None => mix.push(QuantShare { ty: name, tensors: 1, bytes: t.bytes, share: 0.0 }),
            }
        }
        let total: u64 = mix.iter().map(|m| m.bytes).sum();
        for m in &mut mix {
            m.share = if total == 0 { 0.0 } else { m.bytes as f64 / total as f64 };
        }
        mix.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.ty.cmp(&b.ty)));
        mix
    }

    /// Tensors of a type deltascope cannot dequantise, with their type.
    pub fn unsupported(&self) -> Vec<(&str, String)> {
        let t = &self.header.tensors;
        t.iter()
            .filter(|t| !t.ty.is_some_and(GgmlType::is_supported))
            .map(|t| (t.name.as_str(), t.type_name()))
            .collect()
    }

    /// The GDN state inputs (`ssm_alpha`, `ssm_beta`, `ssm_a`, `ssm_dt`) stored below 8 bits a
    /// value: such quantisation has been reported to collapse reasoning depth.
    pub fn low_bit_state_inputs(&self) -> Vec<(&str, GgmlType)> {
        const STATE_INPUTS: [&str; 4] = [".ssm_alpha", ".ssm_beta", ".ssm_a", ".ssm_dt"];
        self.header
            .tensors
            .iter()
            .filter(|t| STATE_INPUTS.iter().any(|s| t.name.contains(&format!("{s}.")) || t.name.ends_with(s)))
            .filter_map(|t| t.ty.filter(|ty| ty.bits_per_value() < 8.0).map(|ty| (t.name.as_str(), ty)))
            .collect()
    }
}

/// `general.file_type` (llama.cpp's `llama_ftype`) as llama.cpp names it.
fn file_type_name(id: u64) -> Option<&'static str> {
    Some(match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        39 => "NVFP4",
        40 => "Q1_0",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::super::container::tests::{file, string};
    use super::*;

    #[test]
    fn the_mix_the_file_type_and_the_low_bit_state_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let b = file(
            &[("general.architecture", 8, string("qwen35")), ("general.file_type", 4, 15u32.to_le_bytes().to_vec())],
            &[
                ("blk.0.ssm_alpha.weight", &[256, 2], 12, vec![0; 288]),
                ("blk.0.ssm_beta.weight", &[32, 2], 8, vec![0; 68]),
                ("blk.0.ssm_a", &[4], 0, vec![0; 16]),
                ("blk.0.attn_qkv.weight", &[256, 4], 13, vec![0; 704]),
            ],
        );
        std::fs::write(&path, b).unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.file_type(), Some("Q4_K_M"));
        let mix = f.quant_mix();
        assert_eq!(
            mix.iter().map(|m| (m.ty.as_str(), m.tensors, m.bytes)).collect::<Vec<_>>(),
            [("Q5_K", 1, 704), ("Q4_K", 1, 288), ("Q8_0", 1, 68), ("F32", 1, 16)]
        );
        assert!((mix.iter().map(|m| m.share).sum::<f64>() - 1.0).abs() < 1e-12);
        assert_eq!(f.low_bit_state_inputs(), [("blk.0.ssm_alpha.weight", GgmlType::Q4K)]);
        assert!(f.unsupported().is_empty());
        let t = f.header().tensor("blk.0.ssm_a").unwrap();
        assert_eq!(f.tensor_bytes(t).len(), 16);
    }

    #[test]
    fn a_bad_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.gguf");
        std::fs::write(&path, b"GGUF\x03\0\0\0").unwrap();
        let e = GgufFile::open(&path).err().unwrap().to_string();
        assert!(e.contains("bad.gguf") && e.contains("truncated"), "{e}");
    }
}
