//! deltascope's model floor: checkpoint files, the library error, units, the devices a run asked
//! for, and the model itself (pure compute on the CPU, CUDA or the emulated device).
//!
//! The modules are private; this is the face the floors above use. At the root: load a
//! checkpoint, forward a batch of ids, read and trace the recurrent state. Beside it, one
//! namespace per audience: [`placement`] (which devices hold what, and the memory plan),
//! [`cpu`] (the kernel families and threads), [`cuda`] (the device side, for the backend and
//! the GPU tools), [`fp8`] (the FP8 checkpoint format), [`layers`] (single layers on the CPU:
//! the kernels' twins and the trace's replay).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![warn(unreachable_pub)]

mod checkpoint;
mod devices;
mod error;
mod hash;
mod model;
mod units;

pub use checkpoint::{EmbeddedModel, ModelSource, demo_source};
pub use devices::DeviceSpec;
pub use error::{Error, Result, brief, clip, panic_message};
pub use hash::fnv1a;
pub use model::config::RopeConfig;
pub use model::finite::{SUSPICIOUS_ABS, TensorHealth, scan_weights};
pub use model::state::LayerState;
pub use model::storage::Weights;
pub use model::trace::head_state_norms;
pub use model::weights::WeightStore;
pub use model::{
    ComputeLabel, DraftCache, DtypeChoice, Family, Forward, ForwardOptions, ForwardOutput, GdnPassTrace, HiddenStats,
    LayerKind, LayerTrace, LoadOptions, LoadProgress, LogitsRows, Mat, MlpKind, Model, ModelConfig, MtpOutput,
    MtpState, Precision, ResolvedDtype, SequenceCache, SequenceState, StateBytes, StateSnapshot, StateTrace,
    missing_mtp_tensors, read_config,
};
pub use units::{duration_ms, human_bytes, short_bytes, sig4};

/// Where the model runs: the devices a run may use, what each holds, and the memory plan.
pub mod placement {
    pub use crate::model::placement::plan::{
        CONTEXT_RESERVE, DeviceBudget, DevicePlan, DeviceShare, PlanInputs, plan_devices, plan_fewest,
    };
    pub use crate::model::placement::{Placement, place, upload};
    pub use crate::model::sizes::{fp8_weight_bytes, memory_plan};
}

/// The CPU side: which kernel family runs, on how many threads, and the kernels themselves for
/// the probes and the twins.
pub mod cpu {
    pub use crate::model::cpu::gemv::{
        Fp8Rows, PairKernel, PairRows, WeightRow, fp8_pairs_available, fp8_pairs_rows, fp8_rows, gemv_rows, pairs_rows,
    };
    pub use crate::model::cpu::math::exp;
    pub use crate::model::cpu::simd::Simd;
    pub use crate::model::cpu::tensor::{Linear, sigmoid, silu, softplus};
    pub use crate::model::cpu::{CpuInfo, CpuKernel, set_threads};
}

/// The device side: the CUDA model, the GPUs (or the emulated one), and the kernels' sources,
/// compiler, launches and resources, for the backend and the GPU tools.
pub mod cuda {
    pub use crate::model::cuda::model::PREFILL_CHUNK;
    pub use crate::model::cuda::{CudaModel, DeviceKind, Gpu};
    pub use crate::model::cuda::{device, emu, kernels, nvrtc, ops, probe, resources, runtime};
}

/// FP8 checkpoints: the block-scaled format, and quantising to it (`synth`, `quantize`, the
/// device parity of the FP8 kernels).
pub mod fp8 {
    pub use crate::model::fp8::{
        BLOCK, Fp8Stack, Fp8Weights, quantised_in_fp8, quantization_config, quantize, quantize_par, unconverted_modules,
    };
}

/// GGUF, the file llama.cpp runs: the container, the ggml types, exact dequantisation, and a
/// GGUF model opened as a [`ModelSource`].
pub mod gguf {
    pub use crate::model::gguf::{
        DequantError, GgmlType, Gguf, GgufError, GgufFile, QuantShare, TensorInfo, Value, VocabError, dequantize,
        generation_config_json, is_gguf, parts, source_for, tokenizer_config_json, tokenizer_json,
    };
}

/// Single layers on the CPU, one step at a time: the reference the device kernels are checked
/// against, and what the state trace replays.
pub mod layers {
    pub use crate::model::attention::attend_decode;
    pub use crate::model::gdn::{
        HeadInputs, chunked_head, conv_stage, gated_norm_stage, gates_stage, recurrent_head, replay_head,
    };
    pub use crate::model::norm::RmsNorm;
    pub use crate::model::rope::Rope;
}
