//! Conversations as data: every turn keeps its prompt, its parameters, the thinking and the
//! answer, per-turn statistics and every token event with its arrival time. Sessions are saved
//! atomically as JSON (write a temporary file, then rename, so a crash never leaves half a
//! file), reloaded to resume, exported to Markdown, and replayed with their original timing.
//!
//! A turn stores the engine's own value types (usage, timing, memory, MTP statistics, token
//! alternatives); what it adds is arrival times, and it rebuilds [`EngineEvent`]s from them
//! for replay.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::backend::{
    ChatMessage, CountSource, Diagnostic, DiagnosticKind, DoneEvent, EngineEvent, ErrorEvent, FinishReason,
    GenerationParams, Memory, MtpParams, MtpStats, Phase, Role, ServerLabel, ServerMemory, StartEvent, StatsEvent,
    Timing, TokenEvent, Usage,
};

/// The file format this build writes. Version 1 files (before the remote backend; their
/// tokens always had ids) still load: version 2 only made fields optional.
pub const SESSION_VERSION: u32 = 2;
const OLDEST_READABLE: u32 = 1;

/// An engine event and when it arrived (milliseconds since the request was sent). Stored
/// flattened: `{"t_ms": 12.5, "phase": "thinking", "text": "…", …}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timed<T> {
    pub t_ms: f64,
    #[serde(flatten)]
    pub ev: T,
}

impl<T> std::ops::Deref for Timed<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.ev
    }
}

/// What the `done` event reported, plus timings the front end measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnStats {
    #[serde(default)]
    pub samples: Vec<Timed<StatsEvent>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<Timing>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_memory: Option<ServerMemory>,
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
    /// From `start` (local engine) or the final usage (remote server).
    #[serde(default)]
    pub prompt_tokens: usize,
    /// The server that generated this turn (`None`: the in-process engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerLabel>,
    /// The phase the prompt left the model in.
    #[serde(default)]
    pub start_phase: Phase,
    /// Final texts (from `done`; built from tokens while streaming).
    #[serde(default)]
    pub thinking: String,
    #[serde(default)]
    pub answer: String,
    #[serde(default)]
    pub tokens: Vec<Timed<TokenEvent>>,
    #[serde(default)]
    pub diagnostics: Vec<Timed<Diagnostic>>,
    #[serde(default)]
    pub stats: TurnStats,
    /// `None` while streaming (or when the program stopped mid-turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<crate::backend::ErrorKind>,
    /// This turn re-ran turn N's prompt with other settings (a comparison).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compare_of: Option<usize>,
    /// How many times the answer was continued after being cut short.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub continued: u32,
    /// While a continuation streams: what the turn held before it (events of the continuation
    /// are appended to it, not put in its place).
    #[serde(skip)]
    continuation: Option<ContinuationBase>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A turn as it was when a continuation started.
#[derive(Debug, Clone, PartialEq)]
struct ContinuationBase {
    tokens: usize,
    thinking: String,
    answer: String,
    usage: Option<Usage>,
}

impl Turn {
    pub fn new(user: impl Into<String>, enable_thinking: bool, params: GenerationParams) -> Self {
        Turn {
            user: user.into(),
            enable_thinking,
            params,
            prompt_tokens: 0,
            server: None,
            start_phase: Phase::Thinking,
            thinking: String::new(),
            answer: String::new(),
            tokens: vec![],
            diagnostics: vec![],
            stats: TurnStats::default(),
            finish_reason: None,
            error: None,
            error_kind: None,
            compare_of: None,
            continued: 0,
            continuation: None,
        }
    }

    /// Whether this turn can be continued: it stopped at `max_tokens` or was cancelled, with
    /// no error.
    pub fn can_continue(&self) -> bool {
        self.error.is_none() && matches!(self.finish_reason, Some(FinishReason::Length | FinishReason::Cancelled))
    }

    /// Everything generated so far, verbatim (thinking, `</think>`, answer): what a
    /// continuation's prompt ends with.
    pub fn generated_text(&self) -> String {
        self.tokens.iter().map(|t| t.text.as_str()).collect()
    }

    /// Prepares the turn to receive a continuation's events: they extend it. The diagnostics
    /// of the cut (empty answer, answer cut) are resolved by continuing, so they go.
    pub fn begin_continuation(&mut self) {
        self.continuation = Some(ContinuationBase {
            tokens: self.tokens.len(),
            thinking: self.thinking.clone(),
            answer: self.answer.clone(),
            usage: self.stats.usage.clone(),
        });
        self.continued += 1;
        self.finish_reason = None;
        self.diagnostics.retain(|d| {
            !matches!(d.kind, DiagnosticKind::ThinkingExhaustedMaxTokens | DiagnosticKind::AnswerTruncated)
        });
    }

    /// The arrival time of the last event so far (a continuation's times carry on from it).
    pub fn last_event_ms(&self) -> f64 {
        let last_token = self.tokens.last().map(|t| t.t_ms).unwrap_or(0.0);
        last_token.max(self.stats.done_ms.unwrap_or(0.0))
    }

    /// Records one engine event that arrived `t_ms` after the request was sent.
    pub fn apply(&mut self, ev: &EngineEvent, t_ms: f64) {
        // Microsecond resolution is plenty, and short decimals keep the JSON small.
        let t_ms = (t_ms * 1000.0).round() / 1000.0;
        match ev {
            EngineEvent::Start(st) if self.continuation.is_some() => self.server = st.server.clone(),
            EngineEvent::Start(st) => {
                self.prompt_tokens = st.prompt_tokens.unwrap_or(0);
                self.start_phase = st.phase;
                self.server = st.server.clone();
                self.stats.start_ms = Some(t_ms);
            }
            EngineEvent::Token(tok) => {
                match tok.phase {
                    Phase::Thinking => {
                        self.stats.thinking_start_ms.get_or_insert(t_ms);
                        self.thinking.push_str(&tok.text);
                    }
                    Phase::Answer => {
                        if self.stats.thinking_start_ms.is_some() {
                            self.stats.thinking_end_ms.get_or_insert(t_ms);
                        }
                        self.answer.push_str(&tok.text);
                    }
                }
                let mut tok = tok.clone();
                if let Some(base) = &self.continuation {
                    tok.index += base.tokens;
                }
                self.tokens.push(Timed { t_ms, ev: tok });
            }
            EngineEvent::Stats(s) => self.stats.samples.push(Timed { t_ms, ev: s.clone() }),
            EngineEvent::Diagnostic(d) => self.diagnostics.push(Timed { t_ms, ev: d.clone() }),
            EngineEvent::Done(d) => {
                self.finish_reason = Some(d.finish_reason);
                if self.prompt_tokens == 0 {
                    self.prompt_tokens = d.usage.prompt_tokens;
                }
                let base = self.continuation.take();
                self.stats.usage = Some(match base.as_ref().and_then(|b| b.usage.as_ref()) {
                    Some(before) => Usage {
                        prompt_tokens: before.prompt_tokens,
                        thinking_tokens: before.thinking_tokens + d.usage.thinking_tokens,
                        answer_tokens: before.answer_tokens + d.usage.answer_tokens,
                        completion_tokens: before.completion_tokens + d.usage.completion_tokens,
                        forced_tokens: before.forced_tokens + d.usage.forced_tokens,
                        counted: d.usage.counted,
                    },
                    None => d.usage.clone(),
                });
                self.stats.timing = Some(d.timing.clone());
                self.stats.mtp = d.mtp.clone();
                self.stats.memory = d.memory.clone();
                self.stats.server_memory = d.server_memory.clone();
                if self.stats.thinking_start_ms.is_some() {
                    self.stats.thinking_end_ms.get_or_insert(t_ms);
                }
                self.stats.done_ms = Some(t_ms);
                // The engine's texts are authoritative: stop strings are cut from them.
                match base {
                    Some(b) => {
                        self.thinking = b.thinking + &d.thinking;
                        self.answer = b.answer + &d.answer;
                    }
                    None => {
                        self.thinking = d.thinking.clone();
                        self.answer = d.answer.clone();
                    }
                }
            }
            EngineEvent::Error(e) => {
                self.continuation = None;
                self.error = Some(e.message.clone());
                self.error_kind = Some(e.kind);
                self.stats.done_ms.get_or_insert(t_ms);
            }
        }
    }

    /// This turn's settings, labelled, in the sliders' order (the compare view and the
    /// Markdown export show them).
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let p = &self.params;
        let s = &p.sampling;
        vec![
            ("max_tokens", p.max_tokens.to_string()),
            ("thinking budget", budget_label(self.enable_thinking, p.thinking_budget)),
            ("temperature", format!("{:.2}", s.temperature)),
            ("top-p", format!("{:.2}", s.top_p)),
            ("top-k", s.top_k.to_string()),
            ("min-p", format!("{:.2}", s.min_p)),
            ("presence", format!("{:.1}", s.presence_penalty)),
            ("frequency", format!("{:.1}", s.frequency_penalty)),
            ("repetition", format!("{:.2}", s.repetition_penalty)),
            ("MTP depth", mtp_label(&p.mtp)),
            ("seed", s.seed.to_string()),
        ]
    }

    pub fn is_finished(&self) -> bool {
        self.finish_reason.is_some() || self.error.is_some()
    }

    /// Thinking tokens: the final usage once done (a server may generate tokens it does not
    /// stream, such as `</think>`), else the token events so far.
    pub fn thinking_tokens(&self) -> usize {
        match &self.stats.usage {
            Some(u) => u.thinking_tokens,
            None => self.tokens.iter().filter(|t| t.phase == Phase::Thinking).count(),
        }
    }

    pub fn answer_tokens(&self) -> usize {
        match &self.stats.usage {
            Some(u) => u.answer_tokens,
            None => self.tokens.iter().filter(|t| t.phase == Phase::Answer).count(),
        }
    }

    /// How the thinking / answer counts were obtained (estimates are shown with "≈").
    pub fn counted(&self) -> CountSource {
        match &self.stats.usage {
            Some(u) => u.counted,
            None => self.stats.samples.last().map(|s| s.counted).unwrap_or_default(),
        }
    }

    /// How long thinking took, in ms (still running: up to the last token).
    pub fn thinking_ms(&self) -> Option<f64> {
        let start = self.stats.thinking_start_ms?;
        let end = self.stats.thinking_end_ms.or_else(|| self.tokens.last().map(|t| t.t_ms))?;
        Some((end - start).max(0.0))
    }

    /// The latest memory numbers (live sample, or the final ones); `None` from a remote server.
    pub fn memory(&self) -> Option<&Memory> {
        self.stats.memory.as_ref().or_else(|| self.stats.samples.last().and_then(|s| s.memory.as_ref()))
    }

    /// A remote server's latest KV usage, when it reports one.
    pub fn server_memory(&self) -> Option<&ServerMemory> {
        self.stats.server_memory.as_ref().or_else(|| self.stats.samples.last().and_then(|s| s.server_memory.as_ref()))
    }

    /// The latest MTP numbers (live sample, or the final ones).
    pub fn mtp(&self) -> Option<&MtpStats> {
        self.stats.mtp.as_ref().or_else(|| self.stats.samples.iter().rev().find_map(|s| s.mtp.as_ref()))
    }

    /// Rebuilds this turn's event stream with the original arrival times, for replay.
    pub fn replay_events(&self) -> Vec<(f64, EngineEvent)> {
        let mut out = vec![];
        let start_ms = self.stats.start_ms.unwrap_or(0.0);
        out.push((
            start_ms,
            EngineEvent::Start(StartEvent {
                model: String::new(),
                prompt_tokens: Some(self.prompt_tokens).filter(|&n| n > 0),
                phase: self.start_phase,
                params: self.params.clone(),
                server: self.server.clone(),
            }),
        ));
        out.extend(self.tokens.iter().map(|t| (t.t_ms, EngineEvent::Token(t.ev.clone()))));
        out.extend(self.stats.samples.iter().map(|s| (s.t_ms, EngineEvent::Stats(s.ev.clone()))));
        out.extend(self.diagnostics.iter().map(|d| (d.t_ms, EngineEvent::Diagnostic(d.ev.clone()))));
        let end_ms = self.stats.done_ms.unwrap_or_else(|| self.tokens.last().map(|t| t.t_ms).unwrap_or(start_ms));
        if let Some(reason) = self.finish_reason {
            out.push((
                end_ms,
                EngineEvent::Done(DoneEvent {
                    finish_reason: reason,
                    usage: self.stats.usage.clone().unwrap_or_default(),
                    timing: self.stats.timing.clone().unwrap_or_default(),
                    mtp: self.stats.mtp.clone(),
                    memory: self.stats.memory.clone(),
                    server_memory: self.stats.server_memory.clone(),
                    thinking: self.thinking.clone(),
                    answer: self.answer.clone(),
                }),
            ));
        } else if let Some(message) = &self.error {
            let kind = self.error_kind.unwrap_or(crate::backend::ErrorKind::Internal);
            out.push((end_ms, EngineEvent::Error(ErrorEvent { kind, message: message.clone() })));
        }
        // A stable sort keeps the engine's order for events with the same timestamp.
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

/// The thinking budget as shown: off (thinking disabled), unlimited, or a token count.
pub fn budget_label(enable_thinking: bool, budget: Option<usize>) -> String {
    match (enable_thinking, budget) {
        (false, _) => "off".into(),
        (true, None) => "unlimited".into(),
        (true, Some(b)) => b.to_string(),
    }
}

/// The MTP setting as shown: `auto`, or the draft depth (0 = off).
pub fn mtp_label(m: &MtpParams) -> String {
    if m.auto { "auto".into() } else { m.depth.to_string() }
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
    /// Continuations replaced by an edit or a delete: kept, never dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub branches: Vec<Branch>,
}

/// Turns taken out of the conversation (an earlier prompt edited and re-run, or a turn
/// deleted): they stay in the session file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Branch {
    /// The index the first of these turns had in the conversation.
    pub at: usize,
    /// Why they were set aside: "edited" or "deleted".
    pub reason: String,
    /// Seconds since the Unix epoch.
    pub created: u64,
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
    #[error("{path}: session format version {found}, this build reads versions {OLDEST_READABLE} to {SESSION_VERSION}")]
    Version { path: PathBuf, found: u32 },
}

impl Session {
    pub fn new(model: impl Into<String>, system: Option<String>) -> Self {
        let created = now_secs();
        // Seconds plus the process id keep two sessions started in the same second apart.
        let id = format!("{}-{}", format_timestamp(created), std::process::id());
        Session { version: SESSION_VERSION, id, created, model: model.into(), system, turns: vec![], branches: vec![] }
    }

    /// Sets turns `from..` aside as a branch (an earlier prompt is edited and re-run).
    /// Comparisons of the moved turns go with them.
    pub fn branch_from(&mut self, from: usize, reason: &str) {
        if from >= self.turns.len() {
            return;
        }
        let turns = self.turns.split_off(from);
        self.branches.push(Branch { at: from, reason: reason.into(), created: now_secs(), turns });
    }

    /// Takes turn `i` (and the comparisons of it) out of the conversation, keeping it as a
    /// branch. Later comparison indices are renumbered.
    pub fn delete_turn(&mut self, i: usize) {
        if i >= self.turns.len() {
            return;
        }
        let mut moved = vec![];
        let mut kept = vec![];
        for (j, t) in std::mem::take(&mut self.turns).into_iter().enumerate() {
            if j == i || t.compare_of == Some(i) { moved.push(t) } else { kept.push((j, t)) }
        }
        let new_index = |old: usize| kept.iter().position(|(j, _)| *j == old);
        let renumbered: Vec<Turn> = kept
            .iter()
            .map(|(_, t)| {
                let mut t = t.clone();
                t.compare_of = t.compare_of.and_then(new_index);
                t
            })
            .collect();
        self.turns = renumbered;
        self.branches.push(Branch { at: i, reason: "deleted".into(), created: now_secs(), turns: moved });
    }

    /// The chat messages for a new user message after the turns in `upto` (comparison turns
    /// are not part of the conversation).
    pub fn messages(&self, upto: usize, user: &str) -> Vec<ChatMessage> {
        let mut m = vec![];
        if let Some(s) = &self.system {
            m.push(ChatMessage::new(Role::System, s.clone()));
        }
        // A turn that failed (context overflow, engine error) asked nothing the model
        // answered: it is not part of the context.
        for t in self.turns.iter().take(upto).filter(|t| t.compare_of.is_none() && t.error.is_none()) {
            m.push(ChatMessage::new(Role::User, t.user.clone()));
            if t.is_finished() {
                m.push(ChatMessage {
                    role: Role::Assistant,
                    content: t.answer.clone(),
                    reasoning: Some(t.thinking.clone()),
                });
            }
        }
        m.push(ChatMessage::new(Role::User, user));
        m
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
        // Opening a session and quitting must not rewrite it (an example file, a file under
        // version control): an unchanged session leaves the file as it is.
        if std::fs::read(path).is_ok_and(|old| old == json) {
            return Ok(());
        }
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
        if !(OLDEST_READABLE..=SESSION_VERSION).contains(&s.version) {
            return Err(SessionError::Version { path: path.into(), found: s.version });
        }
        let mut s = s;
        if s.version == 1 {
            // Version 1 token records had no index: it is their position.
            for t in &mut s.turns {
                for (i, tok) in t.tokens.iter_mut().enumerate() {
                    tok.ev.index = i;
                }
            }
        }
        s.version = SESSION_VERSION;
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
            let settings = t.settings();
            let row = |cells: Vec<&str>| format!("| {} |", cells.join(" | "));
            let _ = writeln!(md, "{}", row(settings.iter().map(|(l, _)| *l).collect()));
            let _ = writeln!(md, "{}", row(vec!["---"; settings.len()]));
            let _ = writeln!(md, "{}\n", row(settings.iter().map(|(_, v)| v.as_str()).collect()));
            let finish =
                t.finish_reason.map(FinishReason::as_str).or(t.error.as_ref().map(|_| "error")).unwrap_or("unfinished");
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
                let _ = writeln!(md, "\n> **{}** at token {}: {}", d.kind.as_str(), d.at_token, d.message);
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
    /// Why the file cannot be opened (it is listed anyway, so it does not look lost).
    pub error: Option<String>,
}

/// What the picker reads of a session file: the header and each turn's prompt. serde skips
/// the rest (token events, stats) without building it, so listing stays cheap.
#[derive(Deserialize)]
struct SessionHead {
    version: u32,
    id: String,
    #[serde(default)]
    created: u64,
    #[serde(default)]
    model: String,
    #[serde(default)]
    turns: Vec<TurnHead>,
}

#[derive(Deserialize)]
struct TurnHead {
    user: String,
}

impl SessionInfo {
    fn read(path: PathBuf) -> SessionInfo {
        let name = path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        let broken = |path: PathBuf, e: SessionError| SessionInfo {
            path,
            id: name.clone(),
            created: 0,
            model: String::new(),
            turns: 0,
            first_prompt: String::new(),
            error: Some(e.to_string()),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(source) => return broken(path.clone(), SessionError::Read { path, source }),
        };
        match serde_json::from_str::<SessionHead>(&text) {
            Err(source) => broken(path.clone(), SessionError::Parse { path, source }),
            Ok(h) if !(OLDEST_READABLE..=SESSION_VERSION).contains(&h.version) => {
                broken(path.clone(), SessionError::Version { path, found: h.version })
            }
            Ok(h) => SessionInfo {
                id: h.id,
                created: h.created,
                model: h.model,
                turns: h.turns.len(),
                first_prompt: h.turns.into_iter().next().map(|t| t.user).unwrap_or_default(),
                path,
                error: None,
            },
        }
    }
}

/// The `.json` files in `dir`, newest first; files that cannot be opened come last, with the
/// reason. A missing directory is an empty list.
pub fn list_sessions(dir: &Path) -> Vec<SessionInfo> {
    let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
    let mut out: Vec<SessionInfo> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(SessionInfo::read)
        .collect();
    out.sort_by(|a, b| {
        (a.error.is_some(), std::cmp::Reverse(a.created), &a.id).cmp(&(
            b.error.is_some(),
            std::cmp::Reverse(b.created),
            &b.id,
        ))
    });
    out
}

/// `$XDG_DATA_HOME/deltascope/sessions` (or the platform's data directory).
pub fn default_sessions_dir() -> Option<PathBuf> {
    dirs::data_dir().map(|d| d.join("deltascope").join("sessions"))
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default()
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
