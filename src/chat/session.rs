//! Conversations as data: every turn keeps its prompt, its parameters, the thinking and the
//! answer, per-turn statistics and every token event with its arrival time. Sessions are saved
//! atomically as JSON (write a temporary file, then rename, so a crash never leaves half a
//! file), reloaded to resume, exported to Markdown, and replayed with their original timing.
//!
//! The engine's event types are serialise-only (they are an output format); the records here
//! are the persistent, versioned form, converted from and back to [`EngineEvent`]s.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::{
    Alternative, DiagnosticKind, DraftKind, EngineEvent, FinishReason, GenerationParams, Memory, MtpStats, Phase,
    Timing, Usage,
};

/// Bumped when the file format changes incompatibly.
pub const SESSION_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TokPhase {
    #[default]
    Thinking,
    Answer,
}

impl From<Phase> for TokPhase {
    fn from(p: Phase) -> Self {
        match p {
            Phase::Thinking => TokPhase::Thinking,
            Phase::Answer => TokPhase::Answer,
        }
    }
}

impl From<TokPhase> for Phase {
    fn from(p: TokPhase) -> Self {
        match p {
            TokPhase::Thinking => Phase::Thinking,
            TokPhase::Answer => Phase::Answer,
        }
    }
}

/// Where a token came from under speculative decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Draft {
    Accepted,
    Bonus,
    #[default]
    None,
}

impl From<DraftKind> for Draft {
    fn from(d: DraftKind) -> Self {
        match d {
            DraftKind::Accepted => Draft::Accepted,
            DraftKind::Bonus => Draft::Bonus,
            DraftKind::None => Draft::None,
        }
    }
}

impl From<Draft> for DraftKind {
    fn from(d: Draft) -> Self {
        match d {
            Draft::Accepted => DraftKind::Accepted,
            Draft::Bonus => DraftKind::Bonus,
            Draft::None => DraftKind::None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AltRecord {
    pub id: u32,
    pub logprob: f32,
    pub text: String,
}

/// One generated token and when it arrived (milliseconds since the request was sent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub t_ms: f64,
    pub id: u32,
    pub text: String,
    pub phase: TokPhase,
    pub logprob: f32,
    #[serde(default)]
    pub draft: Draft,
    #[serde(default)]
    pub forced: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<AltRecord>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiagnosticRecord {
    pub t_ms: f64,
    /// The engine's snake_case kind (`degenerate_loop`, …).
    pub kind: String,
    pub at_token: usize,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<usize>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryRecord {
    pub weights_bytes: usize,
    pub kv_bytes: usize,
    pub recurrent_bytes: usize,
    pub snapshot_bytes: usize,
}

impl From<&Memory> for MemoryRecord {
    fn from(m: &Memory) -> Self {
        MemoryRecord {
            weights_bytes: m.weights_bytes,
            kv_bytes: m.kv_bytes,
            recurrent_bytes: m.recurrent_bytes,
            snapshot_bytes: m.snapshot_bytes,
        }
    }
}

impl From<&MemoryRecord> for Memory {
    fn from(m: &MemoryRecord) -> Self {
        Memory {
            weights_bytes: m.weights_bytes,
            kv_bytes: m.kv_bytes,
            recurrent_bytes: m.recurrent_bytes,
            snapshot_bytes: m.snapshot_bytes,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MtpRecord {
    pub depth: usize,
    pub steps: usize,
    pub drafted: usize,
    pub accepted: usize,
    pub acceptance_rate: f64,
    pub per_position: Vec<f64>,
    pub mean_accepted_length: f64,
    /// Tokens produced per verify pass (accepted drafts + bonus), pass by pass.
    pub history: Vec<usize>,
    pub draft_ms: f64,
    pub verify_ms: f64,
    pub snapshot_bytes: usize,
}

impl From<&MtpStats> for MtpRecord {
    fn from(m: &MtpStats) -> Self {
        MtpRecord {
            depth: m.depth,
            steps: m.steps,
            drafted: m.drafted,
            accepted: m.accepted,
            acceptance_rate: m.acceptance_rate,
            per_position: m.per_position.clone(),
            mean_accepted_length: m.mean_accepted_length,
            history: m.history.clone(),
            draft_ms: m.draft_ms,
            verify_ms: m.verify_ms,
            snapshot_bytes: m.snapshot_bytes,
        }
    }
}

impl MtpRecord {
    fn to_stats(&self) -> MtpStats {
        // MtpStats has a private accumulator, so it is built field by field from its default.
        let mut s = MtpStats::default();
        s.depth = self.depth;
        s.steps = self.steps;
        s.drafted = self.drafted;
        s.accepted = self.accepted;
        s.acceptance_rate = self.acceptance_rate;
        s.per_position = self.per_position.clone();
        s.mean_accepted_length = self.mean_accepted_length;
        s.history = self.history.clone();
        s.draft_ms = self.draft_ms;
        s.verify_ms = self.verify_ms;
        s.snapshot_bytes = self.snapshot_bytes;
        s
    }
}

/// One `stats` event, as it arrived.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsSample {
    pub t_ms: f64,
    pub generated: usize,
    pub thinking_tokens: usize,
    pub answer_tokens: usize,
    pub tok_s: f64,
    pub memory: MemoryRecord,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpRecord>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageRecord {
    pub prompt_tokens: usize,
    pub thinking_tokens: usize,
    pub answer_tokens: usize,
    pub completion_tokens: usize,
    #[serde(default)]
    pub forced_tokens: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TimingRecord {
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub total_ms: f64,
}

/// What the `done` event reported, plus timings the front end measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnStats {
    #[serde(default)]
    pub samples: Vec<StatsSample>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<TimingRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryRecord>,
    /// When the `start` event arrived (prefill begins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ms: Option<f64>,
    /// When the first thinking token arrived, and when thinking ended (first answer token or
    /// the end of generation): the thinking pane's duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_start_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_end_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_ms: Option<f64>,
}

/// One user message and the model's reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    pub user: String,
    /// Whether the template rendered thinking on.
    pub enable_thinking: bool,
    pub params: GenerationParams,
    #[serde(default)]
    pub prompt_tokens: usize,
    /// The phase the prompt left the model in.
    #[serde(default)]
    pub start_phase: TokPhase,
    /// Final texts (from `done`; built from tokens while streaming).
    #[serde(default)]
    pub thinking: String,
    #[serde(default)]
    pub answer: String,
    #[serde(default)]
    pub tokens: Vec<TokenRecord>,
    #[serde(default)]
    pub diagnostics: Vec<DiagnosticRecord>,
    #[serde(default)]
    pub stats: TurnStats,
    /// `None` while streaming (or when the program stopped mid-turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// This turn re-ran turn N's prompt with other settings (a comparison).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compare_of: Option<usize>,
}

impl Turn {
    pub fn new(user: impl Into<String>, enable_thinking: bool, params: GenerationParams) -> Self {
        Turn {
            user: user.into(),
            enable_thinking,
            params,
            prompt_tokens: 0,
            start_phase: TokPhase::Thinking,
            thinking: String::new(),
            answer: String::new(),
            tokens: vec![],
            diagnostics: vec![],
            stats: TurnStats::default(),
            finish_reason: None,
            error: None,
            compare_of: None,
        }
    }

    /// Records one engine event that arrived `t_ms` after the request was sent.
    pub fn apply(&mut self, ev: &EngineEvent, t_ms: f64) {
        // Microsecond resolution is plenty, and short decimals keep the JSON small.
        let t_ms = (t_ms * 1000.0).round() / 1000.0;
        match ev {
            EngineEvent::Start { prompt_tokens, phase, .. } => {
                self.prompt_tokens = *prompt_tokens;
                self.start_phase = (*phase).into();
                self.stats.start_ms = Some(t_ms);
            }
            EngineEvent::Token { phase, id, text, logprob, draft, forced, top_logprobs, .. } => {
                let phase = TokPhase::from(*phase);
                match phase {
                    TokPhase::Thinking => {
                        self.stats.thinking_start_ms.get_or_insert(t_ms);
                        self.thinking.push_str(text);
                    }
                    TokPhase::Answer => {
                        if self.stats.thinking_start_ms.is_some() {
                            self.stats.thinking_end_ms.get_or_insert(t_ms);
                        }
                        self.answer.push_str(text);
                    }
                }
                self.tokens.push(TokenRecord {
                    t_ms,
                    id: *id,
                    text: text.clone(),
                    phase,
                    logprob: *logprob,
                    draft: (*draft).into(),
                    forced: *forced,
                    top: top_logprobs
                        .iter()
                        .map(|a| AltRecord { id: a.id, logprob: a.logprob, text: a.text.clone() })
                        .collect(),
                });
            }
            EngineEvent::Stats { generated, thinking_tokens, answer_tokens, tok_s, memory, mtp } => {
                self.stats.samples.push(StatsSample {
                    t_ms,
                    generated: *generated,
                    thinking_tokens: *thinking_tokens,
                    answer_tokens: *answer_tokens,
                    tok_s: *tok_s,
                    memory: memory.into(),
                    mtp: mtp.as_ref().map(MtpRecord::from),
                });
            }
            EngineEvent::Diagnostic { kind, at_token, message, period, start } => {
                self.diagnostics.push(DiagnosticRecord {
                    t_ms,
                    kind: diagnostic_name(*kind).to_string(),
                    at_token: *at_token,
                    message: message.clone(),
                    period: *period,
                    start: *start,
                });
            }
            EngineEvent::Done { finish_reason, usage, timing, mtp, memory, thinking, answer } => {
                self.finish_reason = Some(finish_reason.as_str().to_string());
                self.stats.usage = Some(UsageRecord {
                    prompt_tokens: usage.prompt_tokens,
                    thinking_tokens: usage.thinking_tokens,
                    answer_tokens: usage.answer_tokens,
                    completion_tokens: usage.completion_tokens,
                    forced_tokens: usage.forced_tokens,
                });
                self.stats.timing = Some(TimingRecord {
                    ttft_ms: timing.ttft_ms,
                    prefill_tok_s: timing.prefill_tok_s,
                    decode_tok_s: timing.decode_tok_s,
                    total_ms: timing.total_ms,
                });
                self.stats.mtp = mtp.as_ref().map(MtpRecord::from);
                self.stats.memory = Some(memory.into());
                if self.stats.thinking_start_ms.is_some() {
                    self.stats.thinking_end_ms.get_or_insert(t_ms);
                }
                self.stats.done_ms = Some(t_ms);
                // The engine's texts are authoritative: stop strings are cut from them.
                self.thinking = thinking.clone();
                self.answer = answer.clone();
            }
            EngineEvent::Error { message } => {
                self.error = Some(message.clone());
                self.stats.done_ms.get_or_insert(t_ms);
            }
        }
    }

    pub fn is_finished(&self) -> bool {
        self.finish_reason.is_some() || self.error.is_some()
    }

    pub fn thinking_tokens(&self) -> usize {
        self.tokens.iter().filter(|t| t.phase == TokPhase::Thinking).count()
    }

    pub fn answer_tokens(&self) -> usize {
        self.tokens.iter().filter(|t| t.phase == TokPhase::Answer).count()
    }

    /// How long thinking took, in ms (still running: up to the last token).
    pub fn thinking_ms(&self) -> Option<f64> {
        let start = self.stats.thinking_start_ms?;
        let end = self.stats.thinking_end_ms.or_else(|| self.tokens.last().map(|t| t.t_ms))?;
        Some((end - start).max(0.0))
    }

    /// The latest memory numbers (live sample, or the final ones).
    pub fn memory(&self) -> Option<&MemoryRecord> {
        self.stats.memory.as_ref().or_else(|| self.stats.samples.last().map(|s| &s.memory))
    }

    /// The latest MTP numbers (live sample, or the final ones).
    pub fn mtp(&self) -> Option<&MtpRecord> {
        self.stats.mtp.as_ref().or_else(|| self.stats.samples.iter().rev().find_map(|s| s.mtp.as_ref()))
    }

    /// Rebuilds this turn's event stream with the original arrival times, for replay.
    pub fn replay_events(&self) -> Vec<(f64, EngineEvent)> {
        let mut out = vec![];
        let start_ms = self.stats.start_ms.unwrap_or(0.0);
        out.push((
            start_ms,
            EngineEvent::Start {
                model: String::new(),
                prompt_tokens: self.prompt_tokens,
                phase: self.start_phase.into(),
                params: self.params.clone(),
            },
        ));
        for (index, t) in self.tokens.iter().enumerate() {
            out.push((
                t.t_ms,
                EngineEvent::Token {
                    index,
                    phase: t.phase.into(),
                    id: t.id,
                    text: t.text.clone(),
                    logprob: t.logprob,
                    draft: t.draft.into(),
                    forced: t.forced,
                    top_logprobs: t
                        .top
                        .iter()
                        .map(|a| Alternative { id: a.id, logprob: a.logprob, text: a.text.clone() })
                        .collect(),
                },
            ));
        }
        for s in &self.stats.samples {
            out.push((
                s.t_ms,
                EngineEvent::Stats {
                    generated: s.generated,
                    thinking_tokens: s.thinking_tokens,
                    answer_tokens: s.answer_tokens,
                    tok_s: s.tok_s,
                    memory: (&s.memory).into(),
                    mtp: s.mtp.as_ref().map(MtpRecord::to_stats),
                },
            ));
        }
        for d in &self.diagnostics {
            if let Some(kind) = parse_diagnostic(&d.kind) {
                out.push((
                    d.t_ms,
                    EngineEvent::Diagnostic {
                        kind,
                        at_token: d.at_token,
                        message: d.message.clone(),
                        period: d.period,
                        start: d.start,
                    },
                ));
            }
        }
        let end_ms = self.stats.done_ms.unwrap_or_else(|| self.tokens.last().map(|t| t.t_ms).unwrap_or(start_ms));
        if let Some(reason) = self.finish_reason.as_deref().and_then(parse_finish) {
            let u = self.stats.usage.clone().unwrap_or_default();
            let t = self.stats.timing.clone().unwrap_or_default();
            out.push((
                end_ms,
                EngineEvent::Done {
                    finish_reason: reason,
                    usage: Usage {
                        prompt_tokens: u.prompt_tokens,
                        thinking_tokens: u.thinking_tokens,
                        answer_tokens: u.answer_tokens,
                        completion_tokens: u.completion_tokens,
                        forced_tokens: u.forced_tokens,
                    },
                    timing: Timing {
                        ttft_ms: t.ttft_ms,
                        prefill_tok_s: t.prefill_tok_s,
                        decode_tok_s: t.decode_tok_s,
                        total_ms: t.total_ms,
                    },
                    mtp: self.stats.mtp.as_ref().map(MtpRecord::to_stats),
                    memory: self.stats.memory.as_ref().map(Memory::from).unwrap_or_default(),
                    thinking: self.thinking.clone(),
                    answer: self.answer.clone(),
                },
            ));
        } else if let Some(message) = &self.error {
            out.push((end_ms, EngineEvent::Error { message: message.clone() }));
        }
        // A stable sort keeps the engine's order for events with the same timestamp.
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

pub fn diagnostic_name(kind: DiagnosticKind) -> &'static str {
    match kind {
        DiagnosticKind::ThinkingExhaustedMaxTokens => "thinking_exhausted_max_tokens",
        DiagnosticKind::ThinkingBudgetForced => "thinking_budget_forced",
        DiagnosticKind::DegenerateLoop => "degenerate_loop",
        DiagnosticKind::AnswerTruncated => "answer_truncated",
    }
}

pub fn parse_diagnostic(s: &str) -> Option<DiagnosticKind> {
    Some(match s {
        "thinking_exhausted_max_tokens" => DiagnosticKind::ThinkingExhaustedMaxTokens,
        "thinking_budget_forced" => DiagnosticKind::ThinkingBudgetForced,
        "degenerate_loop" => DiagnosticKind::DegenerateLoop,
        "answer_truncated" => DiagnosticKind::AnswerTruncated,
        _ => return None,
    })
}

pub fn parse_finish(s: &str) -> Option<FinishReason> {
    Some(match s {
        "stop" => FinishReason::Stop,
        "length" => FinishReason::Length,
        "stop_string" => FinishReason::StopString,
        "cancelled" => FinishReason::Cancelled,
        "loop" => FinishReason::Loop,
        _ => return None,
    })
}

/// A whole conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    pub version: u32,
    /// File stem; also shown in the picker.
    pub id: String,
    /// Seconds since the Unix epoch.
    pub created: u64,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    #[serde(default)]
    pub turns: Vec<Turn>,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("cannot read session {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write session {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a deltascope session: {source}")]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("{path}: session format version {found}, this build reads version {SESSION_VERSION}")]
    Version { path: PathBuf, found: u32 },
}

impl Session {
    pub fn new(model: impl Into<String>, system: Option<String>) -> Self {
        let created =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
        // Seconds plus the process id keep two sessions started in the same second apart.
        let id = format!("{}-{}", format_timestamp(created), std::process::id());
        Session { version: SESSION_VERSION, id, created, model: model.into(), system, turns: vec![] }
    }

    /// The chat-template messages for a new user message after the turns in `upto`
    /// (comparison turns are not part of the conversation).
    pub fn messages(&self, upto: usize, user: &str) -> serde_json::Value {
        let mut m = vec![];
        if let Some(s) = &self.system {
            m.push(serde_json::json!({"role": "system", "content": s}));
        }
        for t in self.turns.iter().take(upto).filter(|t| t.compare_of.is_none()) {
            m.push(serde_json::json!({"role": "user", "content": t.user}));
            if t.is_finished() && t.error.is_none() {
                m.push(serde_json::json!({"role": "assistant", "content": t.answer, "reasoning_content": t.thinking}));
            }
        }
        m.push(serde_json::json!({"role": "user", "content": user}));
        serde_json::Value::Array(m)
    }

    pub fn file_name(&self) -> String {
        format!("{}.json", self.id)
    }

    /// Writes the session to `path` atomically: a temporary file in the same directory, then
    /// a rename over the target (atomic on POSIX file systems).
    pub fn save_atomic(&self, path: &Path) -> Result<(), SessionError> {
        let err = |source| SessionError::Write { path: path.to_path_buf(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let json = serde_json::to_vec(self).map_err(|e| err(std::io::Error::other(e)))?;
        let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
        std::fs::write(&tmp, json).map_err(err)?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(e)
        })
    }

    pub fn load(path: &Path) -> Result<Session, SessionError> {
        let text = std::fs::read_to_string(path).map_err(|source| SessionError::Read { path: path.into(), source })?;
        let s: Session =
            serde_json::from_str(&text).map_err(|source| SessionError::Parse { path: path.into(), source })?;
        if s.version != SESSION_VERSION {
            return Err(SessionError::Version { path: path.into(), found: s.version });
        }
        Ok(s)
    }

    /// A readable transcript: prompts, thinking (quoted), answers, parameters and statistics.
    pub fn to_markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(md, "# deltascope session {}\n", self.id);
        let _ = writeln!(md, "- model: `{}`", self.model);
        let _ = writeln!(md, "- created: {} UTC", format_timestamp(self.created));
        if let Some(s) = &self.system {
            let _ = writeln!(md, "- system prompt: {s}");
        }
        for (i, t) in self.turns.iter().enumerate() {
            let _ = writeln!(md);
            match t.compare_of {
                Some(of) => {
                    let _ = writeln!(md, "## Turn {} (comparison with turn {})\n", i + 1, of + 1);
                }
                None => {
                    let _ = writeln!(md, "## Turn {}\n", i + 1);
                }
            }
            let _ = writeln!(md, "**User:** {}\n", t.user);
            if !t.thinking.is_empty() {
                let _ = writeln!(md, "<details><summary>Thinking ({} tokens)</summary>\n", t.thinking_tokens());
                for line in t.thinking.lines() {
                    let _ = writeln!(md, "> {line}");
                }
                let _ = writeln!(md, "\n</details>\n");
            }
            let _ = writeln!(md, "**Answer:**\n\n{}\n", t.answer);
            let p = &t.params;
            let s = &p.sampling;
            let budget = match (t.enable_thinking, p.thinking_budget) {
                (false, _) => "off".to_string(),
                (true, None) => "unlimited".to_string(),
                (true, Some(b)) => b.to_string(),
            };
            let _ = writeln!(
                md,
                "| max_tokens | thinking budget | temperature | top-p | top-k | min-p | presence | repetition | MTP | seed |\n|---|---|---|---|---|---|---|---|---|---|\n| {} | {budget} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                p.max_tokens,
                s.temperature,
                s.top_p,
                s.top_k,
                s.min_p,
                s.presence_penalty,
                s.repetition_penalty,
                p.mtp.depth,
                s.seed
            );
            let finish = t.finish_reason.as_deref().or(t.error.as_deref().map(|_| "error")).unwrap_or("unfinished");
            let _ = write!(
                md,
                "finish: **{finish}** · thinking {} · answer {} tokens",
                t.thinking_tokens(),
                t.answer_tokens()
            );
            if let Some(tm) = &t.stats.timing {
                let _ = write!(
                    md,
                    " · TTFT {:.0} ms · prefill {:.1} tok/s · decode {:.1} tok/s",
                    tm.ttft_ms, tm.prefill_tok_s, tm.decode_tok_s
                );
            }
            if let Some(m) = t.mtp() {
                let _ = write!(
                    md,
                    " · MTP acceptance {:.0}%, mean length {:.2}",
                    m.acceptance_rate * 100.0,
                    m.mean_accepted_length
                );
            }
            let _ = writeln!(md);
            for d in &t.diagnostics {
                let _ = writeln!(md, "\n> **{}** at token {}: {}", d.kind, d.at_token, d.message);
            }
            if let Some(e) = &t.error {
                let _ = writeln!(md, "\n> **error:** {e}");
            }
        }
        md
    }
}

/// One row of the session picker.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    pub path: PathBuf,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub turns: usize,
    pub first_prompt: String,
}

/// The sessions in `dir`, newest first. Unreadable files are skipped (the picker lists what
/// it can open); a missing directory is an empty list.
pub fn list_sessions(dir: &Path) -> Vec<SessionInfo> {
    let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
    let mut out: Vec<SessionInfo> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| {
            let s = Session::load(&p).ok()?;
            Some(SessionInfo {
                id: s.id.clone(),
                created: s.created,
                model: s.model.clone(),
                turns: s.turns.len(),
                first_prompt: s.turns.first().map(|t| t.user.clone()).unwrap_or_default(),
                path: p,
            })
        })
        .collect();
    out.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| a.id.cmp(&b.id)));
    out
}

/// `$XDG_DATA_HOME/deltascope/sessions` (or the platform's data directory).
pub fn default_sessions_dir() -> Option<PathBuf> {
    dirs::data_dir().map(|d| d.join("deltascope").join("sessions"))
}

/// `YYYY-MM-DDTHH-MM-SS` (UTC) without a date library: days-from-civil inverted.
pub fn format_timestamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if mo <= 2 { y + 1 } else { y };
    format!("{y:04}-{mo:02}-{d:02}T{h:02}-{m:02}-{s:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_civil_dates() {
        assert_eq!(format_timestamp(0), "1970-01-01T00-00-00");
        assert_eq!(format_timestamp(1_700_000_000), "2023-11-14T22-13-20");
    }
}
