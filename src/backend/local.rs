//! The in-process engine as a [`Backend`]: loads a checkpoint (or the embedded demo model),
//! renders prompts through its chat template, validates them against the model and queues
//! generations on the engine thread.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{
    Backend, BackendError, BackendInfo, BackendKind, BackendResult, ChatMessage, ChatRequest, DryRun, OpenProgress,
    Prompt, PromptTokens, Support,
};
use deltascope_engine::{Compute, EngineHandle, GenerateRequest};
use deltascope_model::DeviceSpec;
use deltascope_model::human_bytes;
use deltascope_model::placement::{Placement, place, upload};
use deltascope_model::{
    DtypeChoice, LayerKind, LoadOptions, LoadProgress, Model, Precision, ResolvedDtype, read_config,
};
use deltascope_model::{ModelSource, demo_source};
use deltascope_protocol::{ChatTemplate, RenderOptions, TextTokenizer};
use deltascope_protocol::{Generation, SamplingParams, StepControl};

/// Which checkpoint, at which precision.
#[derive(Debug, Clone)]
pub struct LocalSpec {
    pub source: ModelSource,
    /// `--dtype`: `auto` follows the checkpoint's config.json (set by [`LocalSpec::new`]).
    dtype: DtypeChoice,
    /// Threads the layers run on (`None`: the physical cores).
    pub threads: Option<usize>,
    /// `--device`: checked before any weight is read.
    pub device: DeviceSpec,
    /// `--kernels DIR`: the CUDA kernels' sources read from a folder instead of the embedded
    /// copies (on `--device cuda|emu`).
    pub kernels: Option<PathBuf>,
    /// `--strict-config`: a config.json key deltascope does not know is an error, not a warning.
    pub strict_config: bool,
}

impl LocalSpec {
    /// `model`: a Hugging Face directory, `None` or `demo` for the embedded demo model (write
    /// `./demo` for a directory of that name); `dtype`: `auto`, `f32` or `bf16`.
    pub fn new(model: Option<&Path>, dtype: &str) -> BackendResult<Self> {
        let source = match model {
            None => demo_source(),
            Some(p) if p == Path::new("demo") => demo_source(),
            // A GGUF file or folder opens as GGUF; anything else is a Hugging Face directory.
            Some(p) => deltascope_model::gguf::source_for(p)?,
        };
        Ok(LocalSpec {
            source,
            dtype: DtypeChoice::parse(dtype)?,
            threads: None,
            device: DeviceSpec::Auto,
            kernels: None,
            strict_config: false,
        })
    }

    /// The spec for a reference engine: `--dtype auto` becomes exact f32 (a named dtype stays).
    pub fn exact_unless_named(self) -> Self {
        match self.dtype {
            DtypeChoice::Auto => LocalSpec { dtype: DtypeChoice::Exact(Precision::F32), ..self },
            DtypeChoice::Exact(_) => self,
        }
    }
}

/// Why the CPU kernel family `DELTASCOPE_CPU_KERNEL` names cannot run here (`None`: it can, or
/// none is named): refused before anything computes.
pub fn cpu_kernel_refusal() -> Option<String> {
    deltascope_model::cpu::CpuKernel::from_env().err().map(|e| e.to_string())
}

/// A loaded model with its text side.
pub struct Loaded {
    /// The weights on the host (the CPU engine itself, or the copy the GPUs were filled from).
    model: Arc<Model>,
    /// What generates: the CPU model, or the CUDA model on the placement's GPUs.
    compute: Arc<dyn Compute>,
    tokenizer: Arc<TextTokenizer>,
    template: ChatTemplate,
    name: String,
    /// Sampling defaults from generation_config.json.
    generation_defaults: SamplingParams,
    /// Where it runs, and why not on a GPU when `--device auto` found none.
    placement: Placement,
    /// The activation precision, and why (`--dtype auto` follows the checkpoint).
    dtype: ResolvedDtype,
}

impl Loaded {
    /// The checkpoint's name, as the front ends show it.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// The weights on the host, for the developer tools and the reference scorer (front ends
    /// never touch tensors: the layering test holds the TUI and the server off this).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// What generates (the CPU model or the CUDA one), for the tools that drive it directly.
    pub fn compute(&self) -> &Arc<dyn Compute> {
        &self.compute
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    pub fn dtype(&self) -> &ResolvedDtype {
        &self.dtype
    }

    /// Loads a checkpoint, reporting the bytes of weights read and then each small file.
    pub fn load(spec: &LocalSpec, progress: &dyn Fn(OpenProgress)) -> deltascope_model::Result<Self> {
        let device = match (&spec.source, &spec.device) {
            (ModelSource::Gguf(_), DeviceSpec::Cuda(_) | DeviceSpec::Emu(_)) => {
                return Err(deltascope_model::Error::InvalidArgument(format!(
                    "--device {}: GGUF runs on the CPU engine; the CUDA engine reads safetensors",
                    spec.device
                )));
            }
            // Auto picks the CPU for a GGUF: the CUDA engine has no quantised kernels yet.
            (ModelSource::Gguf(_), _) => DeviceSpec::Cpu,
            (_, d) => d.clone(),
        };
        let mut placement = place(&device)?;
        deltascope_model::cpu::set_threads(spec.threads).map_err(deltascope_model::Error::InvalidArgument)?;
        // More threads than the OS lets this process run at once share cores: each GEMV waits on
        // the slowest, so decoding slows down rather than speeds up.
        let granted = std::thread::available_parallelism().map_or(1, |n| n.get());
        if let Some(n) = spec.threads.filter(|&n| n > granted) {
            let warning = format!(
                "warning: --threads {n} is more than the {granted} CPU{} this process may use: the extra threads share cores and slow the engine down",
                if granted == 1 { "" } else { "s" }
            );
            placement.note = Some(match placement.note.take() {
                Some(note) => format!("{note}\n{warning}"),
                None => warning,
            });
        }
        let source = &spec.source;
        let label = source.label();
        // The weight reader runs on this thread but wants a shareable callback; it forwards
        // through a channel drained below, so `progress` itself need not be `Sync`.
        let (tx, rx) = std::sync::mpsc::channel::<(u64, u64)>();
        let tx = std::sync::Mutex::new(tx);
        let weights = LoadProgress(Arc::new(move |read: u64, total: u64| {
            if let Ok(tx) = tx.lock() {
                let _ = tx.send((read, total));
            }
        }));
        // The config first: an unknown key refused under --strict-config costs no weight read.
        let config = read_config(source)?;
        if spec.strict_config {
            config.refuse_unknown_keys(&source.file_label("config.json"))?;
        }
        let dtype = if placement.gpus.is_empty() {
            spec.dtype.resolve(config.declared_dtype.as_deref())
        } else {
            // The CUDA engine runs bf16 weights and activations whatever --dtype says.
            ResolvedDtype { precision: Precision::Bf16, why: "the CUDA engine computes in bf16".into() }
        };
        tracing::info!(dtype = dtype.precision.name(), why = %dtype.why, "activation precision");
        let opts = LoadOptions { precision: dtype.precision, progress: Some(weights), ..Default::default() };
        let loading = std::thread::scope(|scope| {
            // `opts` (holding the sender) moves into the reader, so the loop below ends when
            // loading does, however it ends.
            let reader = scope.spawn(move || Model::load(source, &opts));
            for (read, total) in rx.iter() {
                let what = format!("weights of {label}: {} of {}", human_bytes(read), human_bytes(total));
                progress(OpenProgress { done: read, total, what });
            }
            reader.join()
        });
        let model = match loading {
            Ok(r) => r?,
            Err(p) => std::panic::resume_unwind(p),
        };
        let step = |what: &str| progress(OpenProgress { done: 1, total: 1, what: what.into() });
        let model = Arc::new(model);
        let compute: Arc<dyn Compute> = if placement.gpus.is_empty() {
            model.clone()
        } else {
            step("weights to the GPUs");
            let gpu = upload(&model, &spec.device, spec.kernels.as_deref(), &placement)?;
            placement.devices = gpu.device_weights.iter().map(|(d, _)| d.clone()).collect();
            Arc::new(gpu)
        };
        step("tokenizer");
        let tokenizer = TextTokenizer::load(source, Some(model.config().vocab_size), &model.config().eos_token_ids)?;
        step("chat template");
        let template = ChatTemplate::load(source, tokenizer.specials.think_start.is_some())?;
        step("generation config");
        let generation_defaults = match source.read_json("generation_config.json")? {
            Some(g) => {
                SamplingParams::from_generation_config(&g).map_err(|p| deltascope_model::Error::ConfigField {
                    file: source.file_label("generation_config.json"),
                    message: format!("{}: {}", p.value, p.must()),
                    field: p.field,
                })?
            }
            None => SamplingParams::default(),
        };
        Ok(Loaded {
            name: label,
            model,
            compute,
            tokenizer: Arc::new(tokenizer),
            template,
            generation_defaults,
            placement,
            dtype,
        })
    }

    /// What identifies this model: its sizes, parameters and the fingerprint of its embedding.
    pub fn identity(&self) -> super::ModelIdentity {
        let c = &self.model.config();
        let plan = deltascope_model::placement::memory_plan(c, 2, 2, 4);
        super::ModelIdentity {
            name: self.name.clone(),
            name_is_file: false,
            vocab_size: Some(c.vocab_size),
            hidden_size: Some(c.hidden_size),
            layers: Some(c.num_hidden_layers),
            params: Some(plan.params.total),
            params_with_mtp: self.model.mtp().map(|_| plan.params.total + plan.params.mtp),
            fingerprint: Some(self.model.embedding_fingerprint()),
            file_bytes: match self.model.source() {
                ModelSource::Gguf(g) => Some(g.tensor_bytes),
                _ => None,
            },
            file_type: match self.model.source() {
                ModelSource::Gguf(g) => g.file_type.clone(),
                _ => None,
            },
            file_values: match self.model.source() {
                ModelSource::Gguf(g) => Some(g.tensor_values),
                _ => None,
            },
        }
    }

    /// The prompt's token ids (and the text they were tokenised from).
    pub fn render(&self, req: &ChatRequest) -> BackendResult<(Option<String>, Vec<u32>)> {
        let text = match &req.prompt {
            Prompt::Ids(ids) => {
                if ids.is_empty() {
                    return Err(BackendError::invalid("the list of prompt ids is empty"));
                }
                return Ok((None, ids.clone()));
            }
            Prompt::Text(t) => t.clone(),
            Prompt::Chat(messages) => render_chat(&self.template, messages, req.params.thinking.is_on())?,
            Prompt::Continue { messages, generated } => {
                render_chat(&self.template, messages, req.params.thinking.is_on())? + generated
            }
        };
        let ids = self.tokenizer.encode(&text)?;
        if ids.is_empty() {
            return Err(BackendError::invalid("the prompt tokenises to nothing"));
        }
        Ok((Some(text), ids))
    }
}

/// Renders messages through a chat template with the generation prompt.
pub fn render_chat(template: &ChatTemplate, messages: &[ChatMessage], enable_thinking: bool) -> BackendResult<String> {
    let opts =
        RenderOptions { add_generation_prompt: true, enable_thinking: Some(enable_thinking), ..Default::default() };
    let value = serde_json::to_value(messages).map_err(|e| BackendError::invalid(format!("messages: {e}")))?;
    Ok(template.render(&value, &opts)?)
}

pub struct LocalBackend {
    loaded: Loaded,
    engine: EngineHandle,
    info: BackendInfo,
}

impl LocalBackend {
    pub fn open(spec: &LocalSpec, progress: &dyn Fn(OpenProgress)) -> BackendResult<Self> {
        let loaded = Loaded::load(spec, progress)?;
        Self::from_loaded(loaded)
    }

    pub fn from_loaded(loaded: Loaded) -> BackendResult<Self> {
        let engine = EngineHandle::spawn(loaded.compute.clone(), loaded.tokenizer.clone(), loaded.name.clone())
            .map_err(|e| {
                BackendError::new(
                    deltascope_protocol::ErrorKind::Internal,
                    format!("cannot start the engine thread: {e}"),
                )
            })?;
        let info = describe(&loaded);
        Ok(LocalBackend { loaded, engine, info })
    }

    pub fn loaded(&self) -> &Loaded {
        &self.loaded
    }
}

fn describe(l: &Loaded) -> BackendInfo {
    let c = &l.model.config();
    let gdn = c.layer_types.iter().filter(|k| matches!(k, LayerKind::LinearAttention)).count();
    BackendInfo {
        name: l.name.clone(),
        kind: BackendKind::Local { devices: l.placement.devices.clone(), dtype: l.model.precision().name().into() },
        device_note: l.placement.note.clone(),
        config_notes: {
            let source = l.model.source();
            let mut notes = c.unknown_key_warnings(&source.file_label("config.json"));
            notes.extend(source.notes().iter().cloned());
            notes
        },
        identity: l.identity(),
        context: Some(c.max_position_embeddings),
        vocab_size: Some(c.vocab_size),
        has_mtp: l.model.mtp().is_some(),
        layers: Some(format!("{} layers: {gdn} GDN + {} attention", c.layer_types.len(), c.layer_types.len() - gdn)),
        weights_bytes: Some(l.model.weight_bytes()),
        file_type: match l.model.source() {
            ModelSource::Gguf(g) => Some(g.file_type.clone().unwrap_or_else(|| "GGUF".into())),
            _ => None,
        },
        defaults: l.generation_defaults.clone(),
        step: Support::Yes,
        end_thinking: Support::Yes,
        provenance: Support::Yes,
        mtp_control: Support::Yes,
        continuation: Support::Yes,
        state_trace: match l.compute.state_trace_refusal() {
            None => Support::Yes,
            Some(why) => Support::No(why.into()),
        },
    }
}

impl Backend for LocalBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn start_with(&self, req: ChatRequest, control: Arc<StepControl>) -> BackendResult<Generation> {
        if let (true, Some(why)) = (req.params.trace_state, self.info.state_trace.reason()) {
            return Err(BackendError::invalid(format!("--trace-state: {why}")));
        }
        let (_, ids) = self.loaded.render(&req)?;
        self.loaded.compute.check(&ids, req.params.max_tokens)?;
        let vocab = self.loaded.model.config().vocab_size;
        if let Some(id) = req.params.stop_token_ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(BackendError::invalid(format!(
                "stop token id {id} (--stop-token-id) is out of the vocabulary: the model has {vocab} ids, 0–{}",
                vocab - 1
            )));
        }
        Ok(self.engine.generate_with(GenerateRequest { prompt_ids: ids, params: req.params }, control))
    }

    fn dry_run(&self, req: &ChatRequest) -> BackendResult<DryRun> {
        let (text, ids) = self.loaded.render(req)?;
        let rendered_by = match req.prompt {
            Prompt::Chat(_) | Prompt::Continue { .. } => self.loaded.template.source_name.clone(),
            Prompt::Text(_) => "raw".into(),
            Prompt::Ids(_) => "ids".into(),
        };
        Ok(DryRun { rendered_by, text, ids: Some(ids) })
    }

    fn prompt_tokens(&self, req: &ChatRequest) -> BackendResult<Option<PromptTokens>> {
        let (text, ids) = self.loaded.render(req)?;
        Ok(Some(PromptTokens { text, ids }))
    }
}
