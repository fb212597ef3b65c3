//! The model: pure compute over explicit state (design §3). It knows nothing of text, sampling,
//! budgets or UI.

pub mod attention;
pub mod config;
pub mod cpu;
pub mod cuda;
pub mod dtype;
pub mod finite;
pub mod forward;
pub mod fp8;
pub mod gdn;
pub mod hybrid;
pub mod load;
pub mod mlp;
pub mod norm;
pub mod placement;
pub mod plan;
pub mod rope;
pub mod state;
pub mod storage;
pub mod trace;
pub mod weights;

pub use crate::checkpoint::demo_source;
pub use crate::checkpoint::{EmbeddedModel, ModelSource};
pub use config::{Family, LayerKind, MlpKind, ModelConfig, read_config};
pub use cpu::tensor::{Mat, Precision};
pub use dtype::{DtypeChoice, ResolvedDtype};
pub use forward::{ComputeLabel, DraftCache, Forward, SequenceCache};
pub use hybrid::{
    ForwardOptions, ForwardOutput, HiddenStats, LoadOptions, LogitsRows, Model, MtpOutput, MtpState,
    missing_mtp_tensors,
};
pub use load::LoadProgress;
pub use placement::DeviceSpec;
pub use state::{SequenceState, StateBytes, StateSnapshot};
pub use trace::{GdnPassTrace, LayerTrace, StateTrace};
