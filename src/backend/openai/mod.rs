//! A remote OpenAI-compatible server (llama.cpp, vLLM, SGLang, …) as a [`Backend`]: every
//! front end works on it as on the local engine, with the fields a server cannot fill left
//! empty (token ids without logprobs, memory, per-token draft provenance).
//!
//! Streaming runs on a small tokio runtime owned by the backend; each generation is one task
//! that feeds a std channel, so front ends see the same [`Generation`] as for the local engine.

mod detect;
mod frames;
mod http;
mod logprobs;
mod metrics;
mod request;
mod spec_report;
mod stream;
mod tokenize;

use std::sync::Arc;
use std::time::Instant;

pub use detect::{ServerFacts, ServerKind};

use self::frames::{Forcing, FrameMapper, Split};
use self::http::Http;
use self::stream::{ClientBudget, PromptCount, StreamJob};
use super::local::render_chat;
use super::{
    Backend, BackendError, BackendInfo, BackendKind, BackendResult, BudgetMode, ChatRequest, DryRun, OpenProgress,
    Prompt, PromptTokens, ReasoningSplit, RemoteSpec, Support,
};
use deltascope_protocol::{ChatTemplate, TextTokenizer};
use deltascope_protocol::{
    EngineEvent, ErrorKind, Generation, OnLoop, Preset, SamplingParams, ServerLabel, StartEvent, StepControl,
};

pub struct RemoteBackend {
    runtime: tokio::runtime::Runtime,
    http: Http,
    facts: Arc<ServerFacts>,
    spec: RemoteSpec,
    /// For a client-forced end of thinking (budget, loop rescue): the chat template (from
    /// --tokenizer, or the server's).
    template: Option<ChatTemplate>,
    /// `--tokenizer DIR`'s tokenizer: counts a prompt whose usage frame never came, where the
    /// server cannot.
    local_tokenizer: Option<TextTokenizer>,
    info: BackendInfo,
}

impl RemoteBackend {
    pub fn open(spec: &RemoteSpec, progress: &dyn Fn(OpenProgress)) -> BackendResult<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("deltascope-http")
            .enable_all()
            .build()
            .map_err(|e| BackendError::new(ErrorKind::Internal, format!("cannot start the HTTP runtime: {e}")))?;
        let http = Http::new(&spec.url, spec.api_key.clone(), spec.connect_timeout)?;
        progress(OpenProgress { done: 0, total: 1, what: format!("asking {} what it serves", http.base) });
        let facts = runtime.block_on(detect::detect(&http, spec.model.as_deref()))?;
        progress(OpenProgress { done: 1, total: 1, what: format!("{} at {}", facts.kind.name(), http.base) });
        let template = client_template(spec, &facts)?;
        let local_tokenizer = spec.tokenizer.as_ref().and_then(|dir| {
            deltascope_model::gguf::source_for(dir)
                .and_then(|source| TextTokenizer::load(&source, None, &[]))
                .map_err(|e| tracing::warn!("--tokenizer {}: {e}; prompt counts come from the server", dir.display()))
                .ok()
        });
        let mut info = describe(&http, &facts);
        if template.is_some() {
            info.end_thinking = Support::Yes;
        }
        Ok(RemoteBackend { runtime, http, facts: Arc::new(facts), spec: spec.clone(), template, local_tokenizer, info })
    }

    pub fn facts(&self) -> &ServerFacts {
        &self.facts
    }

    fn label(&self) -> ServerLabel {
        ServerLabel {
            kind: self.facts.kind.name().into(),
            version: self.facts.version.clone(),
            url: self.http.base.clone(),
        }
    }

    /// What a client-forced end of thinking needs: for `--budget-mode client` with a budget,
    /// for `--on-loop answer` (the rescue of a loop in thinking), and, where the chat template is
    /// at hand, for the user's "end thinking now" key.
    fn client_budget(&self, req: &ChatRequest) -> BackendResult<Option<ClientBudget>> {
        let p = &req.params;
        let enforce_budget = self.spec.budget_mode == BudgetMode::Client && p.thinking.budget().is_some();
        let rescue = p.loop_detection.on_loop == OnLoop::Answer && p.thinking.is_on();
        let Some(template) = self.template.as_ref() else {
            if enforce_budget {
                return Err(BackendError::invalid(
                    "--budget-mode client needs the chat template: pass --tokenizer DIR (a model directory with tokenizer_config.json or chat_template.jinja)",
                ));
            }
            if rescue {
                return Err(BackendError::invalid(format!(
                    "--on-loop answer ends a looping thinking client-side and continues with /v1/completions, which needs the chat template: pass --tokenizer DIR (a model directory with tokenizer_config.json or chat_template.jinja); {} does not send its own",
                    self.facts.kind.name()
                )));
            }
            return Ok(None);
        };
        let (Prompt::Chat(messages), true) = (&req.prompt, p.thinking.is_on()) else { return Ok(None) };
        let rendered_prompt = render_chat(template, messages, true)?;
        let facts = self.facts.clone();
        let request = req.clone();
        Ok(Some(ClientBudget {
            enforce_budget,
            rendered_prompt,
            bridge: p.budget_bridge.clone(),
            max_tokens: p.max_tokens,
            continuation: Box::new(move |prompt, max| request::continuation_body(&facts, &request, prompt, max)),
        }))
    }
}

/// The template a client-forced end of thinking renders with: `--tokenizer DIR`'s, else the
/// server's own (llama.cpp's /props).
fn client_template(spec: &RemoteSpec, facts: &ServerFacts) -> BackendResult<Option<ChatTemplate>> {
    if let Some(dir) = &spec.tokenizer {
        // A model directory, or the GGUF the server runs (its template is in the metadata).
        return Ok(Some(ChatTemplate::load(&deltascope_model::gguf::source_for(dir)?, true)?));
    }
    let Some(t) = &facts.chat_template else { return Ok(None) };
    match ChatTemplate::new(t, &format!("{} /props chat_template", facts.kind.name())) {
        Ok(t) => Ok(Some(t)),
        // Needed for every request with a budget: refuse now.
        Err(e) if spec.budget_mode == BudgetMode::Client => Err(e.into()),
        // Needed only to rescue a loop (or end thinking by hand): say so when it is asked for.
        Err(e) => {
            tracing::warn!(
                "the server's chat template does not parse ({e}); ending thinking client-side needs --tokenizer DIR"
            );
            Ok(None)
        }
    }
}

fn describe(http: &Http, f: &ServerFacts) -> BackendInfo {
    // A server that does not report its sampling defaults (vLLM, SGLang) starts from the
    // model card's thinking preset, sent explicitly (serving-notes.md §5: SGLang leaves
    // presence_penalty at 0 unless the client sends it).
    let defaults = f.defaults.clone().unwrap_or_else(|| {
        let mut s = SamplingParams::default();
        Preset::ThinkingGeneral.apply(&mut s);
        s
    });
    BackendInfo {
        name: f.model.clone(),
        kind: BackendKind::Remote(ServerLabel {
            kind: f.kind.name().into(),
            version: f.version.clone(),
            url: http.base.clone(),
        }),
        device_note: None,
        config_notes: vec![],
        identity: f.identity.clone(),
        context: f.context,
        vocab_size: None,
        has_mtp: f.speculative,
        layers: None,
        file_type: None,
        weights_bytes: None,
        defaults,
        step: Support::No("servers do not pause".into()),
        // Client-side: the stream is closed and /v1/completions continues after the forced
        // bridge, rendered with the chat template (set when there is one).
        end_thinking: Support::No(format!(
            "ending thinking with a server continues from the rendered prompt, which needs the chat template: pass --tokenizer DIR ({} sent none that parses)",
            f.kind.name()
        )),
        provenance: Support::No("servers do not say which tokens came from accepted drafts".into()),
        mtp_control: Support::No("server".into()),
        // Chat completions always start a fresh assistant message.
        continuation: Support::No("a server starts every answer afresh".into()),
        state_trace: Support::No(format!("{} does not expose a model's recurrent state", f.kind.name())),
    }
}

impl RemoteBackend {
    /// How to count this request's prompt if its usage frame never comes: the server's own
    /// count of the chat, else `--tokenizer DIR`'s, else about 4 characters a token.
    fn prompt_count(&self, req: &ChatRequest) -> PromptCount {
        let thinking = req.params.thinking.is_on();
        let messages = match &req.prompt {
            Prompt::Chat(m) | Prompt::Continue { messages: m, .. } => m.as_slice(),
            Prompt::Text(_) | Prompt::Ids(_) => &[],
        };
        let local = match (&self.local_tokenizer, &self.template) {
            (Some(tok), Some(tpl)) if !messages.is_empty() => {
                render_chat(tpl, messages, thinking).ok().and_then(|text| tok.encode(&text).ok()).map(|ids| {
                    (
                        ids.len(),
                        "the local tokenizer (--tokenizer DIR) over the rendered chat (no usage frame came)"
                            .to_string(),
                    )
                })
            }
            _ => None,
        };
        let chars: usize = messages.iter().map(|m| m.content.chars().count()).sum();
        let fallback = local.unwrap_or_else(|| {
            (
                chars.div_ceil(4).max(1),
                "about 4 characters a token (no usage frame came, and neither the server nor a local tokenizer could count it)"
                    .to_string(),
            )
        });
        let messages = (!messages.is_empty()).then(|| serde_json::to_value(messages).ok()).flatten();
        PromptCount { messages, thinking, fallback }
    }
}

impl Backend for RemoteBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    /// A server does not pause; `control` carries the cancel.
    fn start_with(&self, req: ChatRequest, control: Arc<StepControl>) -> BackendResult<Generation> {
        let body = request::chat_body(&self.facts, &req, &self.spec)?;
        let client_budget = self.client_budget(&req)?;
        let split = match (self.spec.reasoning_split, self.facts.kind, self.facts.reasoning_parser) {
            (ReasoningSplit::Client, _, _) => Split::Auto,
            // llama.cpp is asked to split per request; SGLang says whether it runs a parser.
            (_, ServerKind::LlamaCpp, _) | (_, _, Some(true)) => Split::Server,
            _ => Split::Auto,
        };
        let forcing = match (req.params.thinking.budget(), self.spec.budget_mode, self.facts.kind) {
            (None, _, _) => Forcing::None,
            (_, BudgetMode::Client, _) => Forcing::Client,
            (_, _, ServerKind::LlamaCpp) => Forcing::Streamed("llama.cpp"),
            (_, _, ServerKind::Deltascope) => Forcing::Streamed("deltascope serve"),
            (_, _, ServerKind::Vllm) => Forcing::Unmarked("vLLM"),
            (_, _, ServerKind::Sglang) => Forcing::Unmarked("SGLang"),
            (_, _, ServerKind::Generic) => Forcing::Unmarked("the server"),
        };
        let started = Instant::now();
        let mapper = FrameMapper::new(&req.params, split, forcing, started);
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = tx.send(EngineEvent::Start(StartEvent {
            model: self.facts.model.clone(),
            prompt_tokens: None,
            phase: mapper.start_phase(),
            params: req.params.clone(),
            server: Some(self.label()),
            numerics: None,
        }));
        let job = StreamJob {
            http: self.http.clone(),
            facts: self.facts.clone(),
            path: "/v1/chat/completions",
            body,
            mapper,
            idle_timeout: self.spec.idle_timeout,
            first_byte_timeout: self.spec.first_byte_timeout,
            control: control.clone(),
            events: tx,
            client_budget,
            prompt_count: self.prompt_count(&req),
        };
        self.runtime.spawn(stream::run(job));
        Ok(Generation::new(rx, control))
    }

    fn dry_run(&self, req: &ChatRequest) -> BackendResult<DryRun> {
        let body = request::chat_body(&self.facts, req, &self.spec)?;
        let text = serde_json::to_string_pretty(&body).map_err(|e| BackendError::invalid(e.to_string()))?;
        Ok(DryRun { rendered_by: format!("POST {}/v1/chat/completions", self.http.base), text: Some(text), ids: None })
    }

    fn prompt_tokens(&self, req: &ChatRequest) -> BackendResult<Option<PromptTokens>> {
        let Prompt::Chat(messages) = &req.prompt else {
            return Err(BackendError::invalid("a server renders chat prompts only"));
        };
        let thinking = req.params.thinking.is_on();
        self.runtime.block_on(tokenize::chat_prompt(&self.http, &self.facts, messages, thinking))
    }

    fn text_tokens(&self, text: &str) -> BackendResult<Option<Vec<u32>>> {
        self.runtime.block_on(tokenize::text_ids(&self.http, &self.facts, text))
    }
}

#[cfg(test)]
mod tests;
