//! The model: pure compute over explicit state (design §3). It knows nothing of text, sampling,
//! budgets or UI.

pub mod attention;
pub mod config;
pub mod cpu;
pub mod cuda;
pub mod finite;
pub mod forward;
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
pub use config::{Family, LayerKind, MlpKind, ModelConfig};
pub use cpu::tensor::{Mat, Precision};
pub use forward::{DraftCache, Forward, SequenceCache};
pub use hybrid::{
    ForwardOptions, ForwardOutput, HiddenStats, LoadOptions, LogitsRows, Model, MtpOutput, MtpState,
    missing_mtp_tensors,
};
pub use load::LoadProgress;
pub use placement::DeviceSpec;
pub use state::{SequenceState, StateBytes, StateSnapshot};
pub use trace::{GdnPassTrace, LayerTrace, StateTrace};

use crate::error::{Error, Result};

/// Reads and parses the model's `config.json`.
pub fn read_config(source: &ModelSource) -> Result<ModelConfig> {
    source.check_dir()?;
    let text = source.read_string("config.json")?.ok_or_else(|| Error::MissingFile {
        dir: source.dir(),
        file: "config.json".into(),
        hint: "a Hugging Face model directory holds config.json, *.safetensors and tokenizer.json".into(),
    })?;
    ModelConfig::from_json_str(&text, &source.file_label("config.json"))
}
