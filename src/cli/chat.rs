//! `deltascope chat` (and `deltascope` with no arguments): the workbench TUI.

use std::path::PathBuf;

use clap::{Args, Parser};

use super::common::ModelArgs;
use crate::backend::ParamOverrides;
use crate::backend::local::LocalSpec;
use crate::tui::{self, TuiOptions};
use deltascope_model::DeviceSpec;

#[derive(Args, Debug, Clone)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System prompt for the conversation.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Start with thinking off (enable_thinking=false); Ctrl+T toggles it.
    #[arg(long)]
    pub no_think: bool,
    /// The sliders' starting values: the same flags as `run`.
    #[command(flatten)]
    pub generation: ParamOverrides,
    /// Colour theme: dark (default), light, high-contrast, a user theme in
    /// $XDG_CONFIG_HOME/deltascope/themes/NAME.toml, or a path to a .toml file.
    #[arg(long, value_name = "NAME|FILE")]
    pub theme: Option<String>,
    /// Resume (or start) the session in FILE; it is autosaved there.
    #[arg(long, value_name = "FILE")]
    pub session: Option<PathBuf>,
    /// Where sessions are autosaved and listed (default $XDG_DATA_HOME/deltascope/sessions).
    #[arg(long, value_name = "DIR")]
    pub sessions_dir: Option<PathBuf>,
    /// Key bindings file (default $XDG_CONFIG_HOME/deltascope/keymap.toml).
    #[arg(long, value_name = "FILE")]
    pub keymap: Option<PathBuf>,
    /// A local reference engine for reference mode: a checkpoint of the same model as the
    /// server (or `demo`), run on the CPU at f32. Alt+V re-scores the shown turn with it
    /// (`deltascope verify`'s scoring), Alt+D jumps to the first divergence.
    #[arg(long, value_name = "DIR|demo")]
    pub reference: Option<PathBuf>,
}

/// The chat flags with their defaults, for `deltascope` without a subcommand.
#[derive(Parser, Debug)]
struct Defaults {
    #[command(flatten)]
    chat: ChatArgs,
}

impl Default for ChatArgs {
    fn default() -> Self {
        // Parsing an empty command line applies clap's defaults (e.g. --max-tokens 1024),
        // which `#[derive(Default)]` would not.
        Defaults::parse_from(["deltascope"]).chat
    }
}

pub fn run(a: ChatArgs) -> anyhow::Result<()> {
    let reference = match &a.reference {
        Some(dir) => {
            anyhow::ensure!(
                dir.as_os_str() == "demo" || dir.join("config.json").is_file(),
                "--reference {}: no config.json there (a checkpoint directory of the server's model, or `demo`)",
                dir.display()
            );
            let mut spec =
                LocalSpec::new(Some(dir), "f32").map_err(|e| anyhow::anyhow!("--reference: {}", e.message))?;
            spec.threads = super::common::checked_threads(a.model.threads)?;
            spec.device = DeviceSpec::Cpu;
            Some((spec, dir.display().to_string()))
        }
        None => None,
    };
    tui::run(TuiOptions {
        reference,
        backend: a.model.spec()?,
        generation: a.generation.checked()?,
        system: a.system,
        no_think: a.no_think,
        theme: a.theme,
        session: a.session,
        sessions_dir: a.sessions_dir,
        keymap: a.keymap,
    })
}
