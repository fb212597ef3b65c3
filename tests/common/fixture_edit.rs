//! Broken copies of the test fixtures: a fixture copied into a temporary directory, and its
//! `model.safetensors` rewritten tensor by tensor.
//!
//! Include with `#[path = "common/fixture_edit.rs"] mod fixture_edit;`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// A copy of `tests/fixtures/NAME` in a temporary directory.
pub fn fixture_copy(name: &str) -> TempDir {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    dir
}

/// Rewrites `model.safetensors` through `f(name, shape, bytes) -> Option<(shape, bytes)>`.
pub fn edit_tensors(path: &Path, f: impl Fn(&str, &[usize], &[u8]) -> Option<(Vec<usize>, Vec<u8>)>) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut kept: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = vec![];
    for (name, view) in st.tensors() {
        if let Some((shape, data)) = f(&name, view.shape(), view.data()) {
            kept.push((name, view.dtype(), shape, data));
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = kept
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// Removes the tensor `name` from `model.safetensors`, leaving every other tensor as is.
pub fn drop_tensor(path: &Path, name: &str) {
    edit_tensors(path, |n, s, b| (n != name).then(|| (s.to_vec(), b.to_vec())));
}

/// `f32` values of a little-endian F32 tensor.
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Little-endian bytes of `values`.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Sets element `index` of the F32 tensor `name` to `value`, leaving every other tensor as is.
pub fn poison(path: &Path, name: &str, index: usize, value: f32) {
    edit_tensors(path, |n, shape, data| {
        if n != name {
            return Some((shape.to_vec(), data.to_vec()));
        }
        let mut v = f32s(data);
        v[index] = value;
        Some((shape.to_vec(), f32_bytes(&v)))
    });
}

/// Sets element `index` of the BF16 tensor `name` to NaN (`0x7fc0`).
pub fn poison_bf16_nan(path: &Path, name: &str, index: usize) {
    edit_tensors(path, |n, shape, data| {
        let mut d = data.to_vec();
        if n == name {
            d[2 * index..2 * index + 2].copy_from_slice(&0x7fc0u16.to_le_bytes());
        }
        Some((shape.to_vec(), d))
    });
}
