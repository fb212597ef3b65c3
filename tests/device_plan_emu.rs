//! The memory plan (`crates/model/src/model/placement/plan.rs`) against what the CUDA model really allocates,
//! measured on the emulated device (`--device emu`, which counts its bytes in use and their
//! peak): the verify slots it reserves are exactly the ones a verify pass allocates, and the
//! workspace it reserves bounds the activations of one prefill pass of `PREFILL_CHUNK` tokens
//! (and of the MTP pass over the same rows) without being absurdly over. A prompt longer than
//! a chunk runs in chunks, so its peak is one chunk's. The emulator needs a C++ compiler
//! (`c++`; CI installs g++).

use std::time::Instant;

use deltascope_model::cuda::PREFILL_CHUNK;
use deltascope_model::cuda::device::Device;
use deltascope_model::cuda::{CudaModel, DeviceKind, Gpu, kernels};
use deltascope_model::placement::{CONTEXT_RESERVE, DeviceBudget, DevicePlan, PlanInputs, plan_devices};
use deltascope_model::{
    DraftCache, Forward, ForwardOptions, LoadOptions, LogitsRows, Model, ModelSource, Precision, SequenceCache,
    demo_source,
};

struct Setup {
    model: CudaModel,
    plan: DevicePlan,
}

impl Setup {
    fn new(source: ModelSource) -> Setup {
        let cpu = Model::load(&source, &LoadOptions { precision: Precision::Bf16, ..Default::default() }).unwrap();
        let gpu = Gpu::open(DeviceKind::Emu, 0, kernels::FILES).unwrap();
        let (free, _) = gpu.dev.memory().unwrap();
        let budget = DeviceBudget { label: gpu.label(), free_bytes: free };
        let plan = plan_devices(cpu.config(), &[budget], PlanInputs::for_model(cpu.config()));
        assert!(plan.fits, "{plan:#?}");
        assert_eq!(plan.inputs.prefill_chunk, PREFILL_CHUNK as u64, "the plan's chunk is the model's");
        let model = CudaModel::upload(&cpu, vec![gpu], &plan).unwrap();
        Setup { model, plan }
    }

    fn dev(&self) -> &dyn Device {
        &*self.model.gpu(0).unwrap().dev
    }

    /// Bytes the plan reserves for a pass's activations on the (one) device.
    fn workspace(&self) -> u64 {
        self.plan.devices[0].workspace_bytes - CONTEXT_RESERVE
    }

    /// The most bytes `f` has allocated at once on top of what was in use when it started.
    fn peak_of<R>(&self, f: impl FnOnce() -> R) -> (R, u64) {
        self.dev().reset_peak();
        let base = self.dev().peak_bytes().expect("the emulated device counts its bytes");
        let r = f();
        (r, self.dev().peak_bytes().unwrap() - base)
    }
}

fn fixture(name: &str) -> ModelSource {
    ModelSource::Dir(std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name))
}

/// A deterministic prompt of `n` ids below `vocab`.
fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % vocab) as u32).collect()
}

/// (a) A verify pass of depth + 1 = 4 tokens leaves exactly the rollback slots the plan counts.
fn verify_slots_match_the_plan(s: &Setup) {
    let c = &s.model.config;
    assert_eq!(s.plan.inputs.mtp_depth, 3);
    let mut cache = s.model.new_cache().unwrap();
    s.model.forward_cached(&prompt(5, c.vocab_size), &mut cache, ForwardOptions::default()).unwrap();
    assert_eq!(cache.rollback_bytes(), 0);
    let draft = prompt(s.plan.inputs.mtp_depth as usize + 1, c.vocab_size);
    let opts = ForwardOptions { verify: true, logits: LogitsRows::All, ..Default::default() };
    let out = s.model.forward_cached(&draft, &mut cache, opts).unwrap();
    assert_eq!(out.logits.rows, draft.len());
    cache.accept(2).unwrap();
    let planned: u64 = s.plan.devices.iter().map(|d| d.mtp_slot_bytes).sum();
    assert_eq!(cache.rollback_bytes() as u64, planned, "the verify slots the model allocates vs the plan's");
}

/// (b) The peak of one prefill pass of PREFILL_CHUNK tokens (every row's logits: the most a
/// pass asks for) and of the MTP pass over its rows is within the plan's workspace and at
/// least half of it; with `long`, a prompt of two chunks and a bit peaks at one chunk's (the
/// emulator takes ~20–60 s over it, mostly in attention: one model runs it).
fn prefill_peak_within_the_plan(s: &Setup, name: &str, long: bool) {
    let c = &s.model.config;
    let ws = s.workspace();
    let all = ForwardOptions { logits: LogitsRows::All, ..Default::default() };

    let ids = prompt(PREFILL_CHUNK, c.vocab_size);
    let mut cache = s.model.new_cache().unwrap();
    let start = Instant::now();
    let (out, chunk_peak) = s.peak_of(|| s.model.forward_cached(&ids, &mut cache, all).unwrap());
    let prefill_time = start.elapsed();
    assert_eq!(out.logits.rows, PREFILL_CHUNK);

    // The MTP head over the same rows (what the engine runs after a prefill to draft).
    let mut draft = s.model.new_draft_cache().unwrap().expect("the model has an MTP head");
    let next: Vec<u32> = ids[1..].iter().copied().chain([ids[0]]).collect();
    let start = Instant::now();
    let (_, mtp_peak) =
        s.peak_of(|| s.model.mtp_forward_cached(&next, &out.hidden, &mut draft, LogitsRows::All).unwrap());
    let mtp_time = start.elapsed();
    assert_eq!(draft.position(), PREFILL_CHUNK);

    eprintln!(
        "{name}: {PREFILL_CHUNK}-token prefill peak {chunk_peak} B ({prefill_time:.2?}), \
         MTP pass peak {mtp_peak} B ({mtp_time:.2?}), plan workspace {ws} B (+ {CONTEXT_RESERVE} B context reserve)"
    );
    let measured = chunk_peak.max(mtp_peak);
    assert!(chunk_peak <= ws, "{name}: the prefill pass peaks at {chunk_peak} B, over the plan's {ws} B");
    assert!(mtp_peak <= ws, "{name}: the MTP pass peaks at {mtp_peak} B, over the plan's {ws} B");
    assert!(2 * measured >= ws, "{name}: the plan's {ws} B is over twice the measured peak {measured} B");
    if !long {
        return;
    }

    // Two chunks and a bit: the prefill runs in chunks, so it peaks at one chunk's.
    let long = prompt(2 * PREFILL_CHUNK + 10, c.vocab_size);
    let mut cache = s.model.new_cache().unwrap();
    let start = Instant::now();
    let (out, long_peak) = s.peak_of(|| s.model.forward_cached(&long, &mut cache, all).unwrap());
    assert_eq!(out.logits.rows, long.len());
    assert_eq!(cache.position(), long.len());
    eprintln!("{name}: {}-token prefill peak {long_peak} B ({:.2?})", long.len(), start.elapsed());
    assert!(
        long_peak <= chunk_peak,
        "{name}: {} tokens peak at {long_peak} B, one chunk at {chunk_peak} B",
        long.len()
    );
}

#[test]
fn demo_model_plan_matches_the_emulated_device() {
    let s = Setup::new(demo_source());
    verify_slots_match_the_plan(&s);
    prefill_peak_within_the_plan(&s, "demo", false);
}

#[test]
fn qwen3_5_moe_plan_matches_the_emulated_device() {
    let s = Setup::new(fixture("qwen3_5_moe"));
    verify_slots_match_the_plan(&s);
    prefill_peak_within_the_plan(&s, "qwen3_5_moe", true);
}
