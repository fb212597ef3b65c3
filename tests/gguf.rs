//! GGUF: deltascope's reader and dequantisers against the reference, the `gguf` Python
//! package (gguf 0.19.0 and numpy, pinned and installed by `scripts/setup-servers.sh`): the
//! tensor table of a real file as its reader reads it, and every supported type dequantised
//! bit for bit on random blocks; `inspect` on the file llama.cpp serves in the tests.

#[path = "common/llama_server.rs"]
mod llama_server;

use std::process::Command;

use deltascope_model::gguf::{GgmlType, GgufFile, dequantize};
use serde_json::Value;

/// A deterministic xorshift stream.
struct Bits(u64);

impl Bits {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A finite value of either sign, magnitude between 2^-12 and 8, as f32.
    fn value(&mut self) -> f32 {
        let r = self.next();
        let mag = 2f32.powf((r % 1500) as f32 / 100.0 - 12.0);
        if r & (1 << 40) != 0 { -mag } else { mag }
    }
}

/// `blocks` random blocks of `ty`: random bytes, with every f16 scale a finite value (a random
/// f16 could be a NaN, whose payload the two sides need not keep alike).
fn random_blocks(ty: GgmlType, blocks: usize, bits: &mut Bits) -> Vec<u8> {
    let size = ty.block_bytes();
    let mut out = Vec::with_capacity(blocks * size);
    for _ in 0..blocks {
        let mut b: Vec<u8> = (0..size).map(|_| bits.next() as u8).collect();
        let mut f16_at = |at: usize, bits: &mut Bits| {
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(bits.value()).to_bits().to_le_bytes());
        };
        match ty {
            GgmlType::F16 => f16_at(0, bits),
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Iq4Xs => f16_at(0, bits),
            GgmlType::Q4K | GgmlType::Q5K => {
                f16_at(0, bits);
                f16_at(2, bits);
            }
            GgmlType::Q6K => f16_at(208, bits),
            GgmlType::F32 => b.copy_from_slice(&bits.value().to_le_bytes()),
            GgmlType::Bf16 => b.copy_from_slice(&bits.value().to_le_bytes()[2..]),
            _ => {}
        }
        out.extend(b);
    }
    out
}

fn reference(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let setup = llama_server::setup();
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (dir.path().join("in.bin"), dir.path().join("out.f32"));
    std::fs::write(&input, bytes).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gguf_reference.py");
    let out = Command::new(&setup.xllamacpp_py)
        .arg(script)
        .arg("dequant")
        .arg(ty.name())
        .arg(&input)
        .arg(&output)
        .output()
        .unwrap();
    assert!(out.status.success(), "the reference failed on {ty}: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::read(&output).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

#[test]
fn every_supported_type_dequantises_bit_for_bit_as_the_reference_does() {
    let mut bits = Bits(0x2545_f491_4f6c_dd1d);
    for ty in GgmlType::SUPPORTED {
        // 64 blocks of a k-quant (16k values), as many values of the others.
        let blocks = 16_384 / ty.block_values();
        let bytes = random_blocks(ty, blocks, &mut bits);
        let mut ours = vec![];
        dequantize(ty, &bytes, &mut ours).unwrap();
        let theirs = reference(ty, &bytes);
        assert_eq!(ours.len(), theirs.len(), "{ty}: value count");
        let differ: Vec<usize> = (0..ours.len()).filter(|&i| ours[i].to_bits() != theirs[i].to_bits()).collect();
        assert!(
            differ.is_empty(),
            "{ty}: {} of {} values differ from the reference; the first at {}: ours {} vs {}",
            differ.len(),
            ours.len(),
            differ[0],
            ours[differ[0]],
            theirs[differ[0]]
        );
    }
}

#[test]
fn the_demo_gguf_reads_as_the_reference_reader_reads_it() {
    let setup = llama_server::setup();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gguf_reference.py");
    let out = Command::new(&setup.xllamacpp_py).arg(script).arg("header").arg(&setup.demo_gguf).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let theirs: Value = serde_json::from_slice(&out.stdout).unwrap();
    let file = GgufFile::open(&setup.demo_gguf).unwrap();
    let h = file.header();
    let tensors = theirs["tensors"].as_array().unwrap();
    assert_eq!(h.tensors.len(), tensors.len());
    assert!(h.tensors.len() > 100, "the demo has {} tensors", h.tensors.len());
    for (ours, t) in h.tensors.iter().zip(tensors) {
        assert_eq!(ours.name, t["name"].as_str().unwrap());
        assert_eq!(ours.type_name(), t["type"].as_str().unwrap(), "{}", ours.name);
        let shape: Vec<u64> = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        assert_eq!(ours.dims, shape, "{}", ours.name);
        assert_eq!(ours.offset, t["offset"].as_u64().unwrap(), "{}", ours.name);
        assert_eq!(ours.bytes, t["bytes"].as_u64().unwrap(), "{}", ours.name);
    }
    assert_eq!(
        h.metadata.len() + 3,
        theirs["keys"].as_u64().unwrap() as usize,
        "the reader counts the 3 header fields as keys"
    );
    // Every tensor of the file dequantises (F16 and F32 here) to as many values as its shape.
    for t in &h.tensors {
        let mut v = vec![];
        dequantize(t.ty.unwrap(), file.tensor_bytes(t), &mut v).unwrap();
        assert_eq!(v.len() as u64, t.values(), "{}", t.name);
    }
}

#[test]
fn inspect_prints_the_quant_mix_of_the_file_llama_cpp_serves() {
    let setup = llama_server::setup();
    let bin = env!("CARGO_BIN_EXE_deltascope");
    let out = Command::new(bin).args(["inspect", "--model"]).arg(&setup.demo_gguf).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("architecture: qwen35"), "{text}");
    assert!(text.contains("quant mix:\n  F16 ") && text.contains("\n  F32 "), "{text}");
    assert!(text.contains("stays F32: ") && text.contains("ssm_a"), "{text}");
    let out = Command::new(bin).args(["inspect", "--json", "--model"]).arg(&setup.demo_gguf).output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mix = v["quant_mix"].as_array().unwrap();
    let tensors: u64 = mix.iter().map(|m| m["tensors"].as_u64().unwrap()).sum();
    assert_eq!(tensors, v["tensors"].as_u64().unwrap());
    let share: f64 = mix.iter().map(|m| m["share"].as_f64().unwrap()).sum();
    assert!((share - 1.0).abs() < 1e-9, "{share}");
    assert_eq!(v["architecture"], "qwen35");
    assert!(v["low_bit_state_inputs"].as_array().unwrap().is_empty());
    // A file cut short is an error naming the file and the offset, not a panic.
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &std::fs::read(&setup.demo_gguf).unwrap()[..4096]).unwrap();
    let out = Command::new(bin).args(["inspect", "--model"]).arg(&cut).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cut.gguf") && err.contains("(at byte "), "{err}");
}

/// Every tensor of every test file (made by llama.cpp's converter and `llama-quantize`:
/// `tests/data/gguf/`) dequantises bit for bit as `gguf.quants.dequantize` does.
#[test]
fn every_tensor_of_the_test_files_dequantises_as_the_reference_does() {
    let setup = llama_server::setup();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gguf_reference.py");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf");
    let mut seen = std::collections::BTreeSet::new();
    for f in [
        "dense/dense-Q4_K_M.gguf",
        "dense/dense-Q5_K_M.gguf",
        "dense/dense-Q6_K.gguf",
        "dense/dense-Q8_0.gguf",
        "moe/moe-Q4_K_M.gguf",
        "next/next-Q4_K_M.gguf",
        "demo/demo-Q8_0.gguf",
    ] {
        let path = root.join(f);
        let dir = tempfile::tempdir().unwrap();
        let out_path = dir.path().join("values.f32");
        let out = Command::new(&setup.xllamacpp_py)
            .arg(script)
            .arg("dequant-file")
            .arg(&path)
            .arg(&out_path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{f}: {}", String::from_utf8_lossy(&out.stderr));
        let theirs = std::fs::read(&out_path).unwrap();
        let file = GgufFile::open(&path).unwrap();
        let mut at = 0;
        for t in &file.header().tensors {
            let mut ours = vec![];
            dequantize(t.ty.unwrap(), file.tensor_bytes(t), &mut ours).unwrap();
            let n = ours.len() * 4;
            let bits: Vec<u8> = ours.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert!(
                bits == theirs[at..at + n],
                "{f}: tensor {} ({}) differs from the reference",
                t.name,
                t.type_name()
            );
            at += n;
            seen.insert(t.type_name());
        }
        assert_eq!(at, theirs.len(), "{f}: every value compared");
    }
    // The files hold every type llama.cpp's K-quant and Q8_0 presets write for these models.
    for ty in ["F32", "Q4_K", "Q5_K", "Q6_K", "Q8_0"] {
        assert!(seen.contains(ty), "no {ty} tensor in the test files: {seen:?}");
    }
}
