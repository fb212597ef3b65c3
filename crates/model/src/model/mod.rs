//! The model: pure compute over explicit state (design §3). It knows nothing of text, sampling,
//! budgets or UI.

pub(crate) mod attention;
pub(crate) mod config;
pub(crate) mod cpu;
pub(crate) mod cuda;
pub(crate) mod dtype;
pub(crate) mod finite;
pub(crate) mod forward;
pub(crate) mod fp8;
mod fp8_codes;
pub(crate) mod gdn;
pub(crate) mod gguf;
pub(crate) mod hybrid;
pub(crate) mod load;
pub(crate) mod mlp;
pub(crate) mod norm;
pub(crate) mod placement;
pub(crate) mod quant;
pub(crate) mod rope;
pub(crate) mod sizes;
pub(crate) mod state;
pub(crate) mod storage;
pub(crate) mod trace;
mod values;
pub(crate) mod weights;

pub use config::{Family, LayerKind, MlpKind, ModelConfig, read_config};
pub use cpu::tensor::{Mat, Precision};
pub use dtype::{DtypeChoice, ResolvedDtype};
pub use forward::{ComputeLabel, DraftCache, Forward, SequenceCache};
pub use hybrid::{
    ForwardOptions, ForwardOutput, HiddenStats, LoadOptions, LogitsRows, Model, MtpOutput, MtpState,
    missing_mtp_tensors,
};
pub use load::LoadProgress;
pub use state::{SequenceState, StateBytes, StateSnapshot};
pub use trace::{GdnPassTrace, LayerTrace, StateTrace};
