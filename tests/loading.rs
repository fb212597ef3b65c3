//! Loading details of each config variant that the numeric comparisons do not show directly.

use std::path::PathBuf;

use std::sync::{Arc, Mutex};

use deltascope_model::{Family, LoadOptions, LoadProgress, Model, ModelSource};

fn load(name: &str, skip_mtp: bool) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    Model::load(&ModelSource::Dir(dir), &LoadOptions { skip_mtp, ..Default::default() }).unwrap()
}

#[test]
fn multimodal_qwen35_layout() {
    let m = load("qwen3_5_vl", false);
    assert_eq!(m.config().family, Family::Qwen35);
    assert!(m.config().nested);
    assert_eq!(m.lm_prefix(), "model.language_model.");
    assert!(!m.tied_embeddings());
    // Sharded, bf16, with a vision tower that is skipped and MTP tensors that are loaded.
    assert_eq!(m.stored_dtypes(), vec!["BF16".to_string()]);
    let mtp = m.mtp().expect("mtp.* tensors are loaded when present");
    assert_eq!(mtp.layers.len(), 1);
    assert_eq!(mtp.fc.in_features, 2 * m.config().hidden_size);
    assert!(load("qwen3_5_vl", true).mtp().is_none());
}

#[test]
fn text_only_tied_f32() {
    let m = load("qwen3_5_text", false);
    assert_eq!(m.lm_prefix(), "model.");
    assert!(m.tied_embeddings());
    assert_eq!(m.stored_dtypes(), vec!["F32".to_string()]);
    assert!(m.mtp().is_none());
}

#[test]
fn qwen3_next_f16_per_expert() {
    let m = load("qwen3_next", false);
    assert_eq!(m.config().family, Family::Qwen3Next);
    assert_eq!(m.stored_dtypes(), vec!["F16".to_string()]);
    assert_eq!(m.config().linear.head_ratio(), 1);
}

#[test]
fn qwen35_moe_fused_experts_and_mtp() {
    let m = load("qwen3_5_moe", false);
    assert_eq!(m.config().family, Family::Qwen35Moe);
    assert_eq!(m.config().linear.head_ratio(), 3);
    assert_eq!(m.config().gqa_groups(), 3);
    assert!(m.mtp().is_some());
}

/// Progress counts the bytes of every tensor the model reads, and ends at the total: the
/// vision tower (never read) is left out of the total, and so is MTP when it is skipped.
#[test]
fn progress_counts_the_bytes_read() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_5_vl");
    for skip_mtp in [false, true] {
        let seen = Arc::new(Mutex::new(vec![]));
        let log = seen.clone();
        let progress = LoadProgress(Arc::new(move |read, total| log.lock().unwrap().push((read, total))));
        let opts = LoadOptions { skip_mtp, progress: Some(progress), ..Default::default() };
        let m = Model::load(&ModelSource::Dir(dir.clone()), &opts).unwrap();
        let seen = seen.lock().unwrap();
        let total = seen[0].1;
        assert!(seen.iter().all(|&(_, t)| t == total), "one total throughout");
        assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "bytes only grow");
        assert_eq!(seen.last().unwrap().0, total, "ends at the total (skip_mtp {skip_mtp})");
        // Held as stored: the matrices as bf16 (2 bytes a parameter), the vectors and the conv
        // kernels (norms, A_log, dt_bias, conv1d) widened to f32, so those count twice.
        let store = deltascope_model::WeightStore::open(&ModelSource::Dir(dir.clone())).unwrap();
        let widened: u64 = store
            .names()
            .filter(|n| !(n.starts_with("model.visual.") || skip_mtp && n.starts_with("mtp.")))
            .filter(|n| store.shape(n).is_some_and(|s| s.len() != 2))
            .map(|n| store.tensor_bytes(n) as u64)
            .sum();
        assert_eq!(total + widened, m.weight_bytes() as u64, "skip_mtp {skip_mtp}");
    }
}

/// Weight matrices are views into the mapped checkpoint, not copies: every matrix the model
/// reads (2-D, and the MoE checkpoints' fused 3-D expert stacks; the depthwise conv kernel is
/// widened to f32 like the norm vectors) is counted as mapped, in every family and dtype. With
/// the bf16 reference's cast points an f32 checkpoint is rounded into new buffers instead.
#[test]
fn weight_matrices_are_read_in_place() {
    use deltascope_model::Precision;
    use deltascope_model::WeightStore;
    for name in ["qwen3_5_vl", "qwen3_5_text", "qwen3_next", "qwen3_5_moe"] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
        let m = Model::load(&ModelSource::Dir(dir.clone()), &LoadOptions::default()).unwrap();
        let store = WeightStore::open(&ModelSource::Dir(dir.clone())).unwrap();
        let matrices: usize = store
            .names()
            // The vision towers are never read.
            .filter(|n| !n.starts_with("model.visual.") && !n.contains("conv1d"))
            .filter(|n| store.shape(n).is_some_and(|s| s.len() >= 2))
            .map(|n| store.tensor_bytes(n))
            .sum();
        assert!(matrices > 0);
        assert_eq!(m.mapped_bytes(), matrices, "{name}: every matrix a view");
        assert!(m.storage_summary().contains("mapped from the checkpoint"), "{}", m.storage_summary());
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_5_text");
    let opts = LoadOptions { precision: Precision::Bf16, ..Default::default() };
    let m = Model::load(&ModelSource::Dir(dir), &opts).unwrap();
    assert_eq!(m.mapped_bytes(), 0, "f32 rounded to bf16 is a copy");
}
