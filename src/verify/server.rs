//! `deltascope verify`: a backend (a server, usually) checked against the reference engine,
//! probe by probe. For each probe: the subject's rendering and tokens of the prompt against
//! the reference's (a different template is the finding, before any generation); a greedy
//! generation on the subject with the most top logprobs it gives; its tokens teacher-forced
//! through the reference ([`super::score`]); a verdict.

use serde::Serialize;

use super::probes::Probe;
use super::score::{self, Position, SubjectToken, Thresholds, Verdict};
use crate::backend::local::Loaded;
use crate::backend::{Backend, BackendError, ChatRequest, Prompt, PromptTokens};
use deltascope_protocol::{EngineEvent, GenerationParams, SamplingParams, Thinking, TokenEvent};

/// Tags put back into one probe's tokens at most (a chat has one `<think>` … `</think>`; the
/// bound keeps a confused stream from re-scoring without end).
const MAX_HIDDEN_TAGS: usize = 4;

/// Top alternatives asked of the subject (OpenAI's and vLLM's limit; llama.cpp gives as many).
pub const TOP_LOGPROBS: usize = 20;

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("the reference: {0}")]
    Reference(#[from] deltascope_model::Error),
    /// The subject's answers cannot be checked (no logprobs, no ids, …).
    #[error("cannot verify: {0}")]
    Cannot(String),
}

/// How the subject's prompt compared with the reference's.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "prompt", rename_all = "snake_case")]
pub enum PromptCheck {
    /// The same token ids.
    Same { tokens: usize },
    /// The first differing token (index into the prompt), both sides', and where the rendered
    /// texts first differ when the server shows its text.
    Differs { at: usize, reference: String, subject: String, text_at: Option<(usize, String, String)> },
    /// The server renders no chat, but tokenised the reference's rendering into the same ids
    /// (SGLang): its tokenizer is checked, its chat template is not.
    TokenizerSame { tokens: usize },
    /// The subject has no way to say (why).
    NotChecked { why: String },
}

/// One probe's findings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeReport {
    pub name: String,
    pub prompt_tokens: usize,
    pub prompt: PromptCheck,
    /// `None` when the probe did not generate (see `not_run`, or a different prompt).
    pub verdict: Option<Verdict>,
    /// Why the probe was not run (it does not fit the context).
    pub not_run: Option<String>,
    /// The first token that could not be mapped to a reference id (scoring stops there).
    pub unmapped: Option<(usize, String)>,
    /// The subject's generation ended in an error after this many tokens (its message): the
    /// tokens before it are scored, and the failure is a finding of its own.
    pub failed: Option<(usize, String)>,
    /// Two servers compared (`--against`): where their texts part at a near-tie, after which
    /// nothing more is compared.
    pub parted_at: Option<usize>,
    pub positions: Vec<Position>,
    /// With `--against-full`: the quantisation error on the same tokens (the reference's
    /// weights against the full checkpoint's); `positions` is then the serving error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantisation: Option<super::judges::QuantisationError>,
}

impl ProbeReport {
    /// A report on `name` with its prompt's findings and nothing generated yet.
    pub fn new(name: &str, prompt_tokens: usize, prompt: PromptCheck) -> ProbeReport {
        ProbeReport {
            name: name.to_string(),
            prompt_tokens,
            prompt,
            verdict: None,
            not_run: None,
            unmapped: None,
            failed: None,
            parted_at: None,
            positions: vec![],
            quantisation: None,
        }
    }

    /// The text generated around position `at` (a few tokens either side).
    pub fn context(&self, at: usize) -> (String, String, String) {
        let text = |r: std::ops::Range<usize>| self.positions[r].iter().map(|p| p.text.as_str()).collect::<String>();
        let from = at.saturating_sub(8);
        let to = (at + 4).min(self.positions.len());
        (text(from..at), self.positions[at].text.clone(), text(at + 1..to))
    }
}

/// The probe's greedy request, with the most top logprobs a server gives.
pub fn request(probe: &Probe) -> ChatRequest {
    let params = GenerationParams {
        max_tokens: probe.max_tokens,
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        thinking: if probe.thinking { Thinking::Unlimited } else { Thinking::Off },
        top_logprobs: TOP_LOGPROBS,
        ignore_eos: probe.ignore_eos,
        ..Default::default()
    };
    ChatRequest { prompt: Prompt::Chat(probe.messages.clone()), params }
}

/// Runs one probe on `subject` and scores it against `reference`.
pub fn check(
    subject: &dyn Backend,
    reference: &Loaded,
    probe: &Probe,
    thresholds: &Thresholds,
) -> Result<ProbeReport, VerifyError> {
    let req = request(probe);
    let (_, prompt_ids) = reference.render(&req)?;
    let mut report = ProbeReport::new(&probe.name, prompt_ids.len(), PromptCheck::NotChecked { why: String::new() });
    let context = reference.model().config().max_position_embeddings;
    let subject_context = subject.info().context;
    let fits = |c: usize| prompt_ids.len() + probe.max_tokens <= c;
    if !fits(context) || subject_context.is_some_and(|c| !fits(c)) {
        let c = subject_context.map_or(context, |s| s.min(context));
        report.not_run = Some(format!(
            "{} prompt + {} generated tokens do not fit the context of {c}",
            prompt_ids.len(),
            probe.max_tokens
        ));
        return Ok(report);
    }
    report.prompt = compare_prompts(subject, &req, &prompt_ids, reference);
    if matches!(report.prompt, PromptCheck::Differs { .. }) {
        return Ok(report);
    }
    let (events, failed) = match generate(subject, req) {
        Err(e) => match too_long(&e) {
            Some(why) => {
                report.not_run = Some(why);
                return Ok(report);
            }
            None => return Err(e),
        },
        Ok(x) => x,
    };
    report.failed = failed.map(|m| (events.len(), m));
    let scored = score_generation(reference, &prompt_ids, &events, probe.ignore_eos, thresholds)?;
    report.unmapped = scored.unmapped;
    report.positions = scored.positions;
    report.verdict = Some(scored.verdict);
    Ok(report)
}

/// A generation's tokens scored by the reference.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub positions: Vec<Position>,
    pub verdict: Verdict,
    /// The first token that could not be mapped to a reference id (scoring stops there).
    pub unmapped: Option<(usize, String)>,
    /// Positions that are tags the server's reasoning parser took out, put back (not the
    /// subject's tokens).
    pub inserted: Vec<usize>,
}

/// The subject's tokens after `prompt_ids` teacher-forced through the reference and scored:
/// `deltascope verify`'s probes and the workbench's reference mode alike. Tokens the subject's
/// engine forced (a thinking budget's end) are forced through, not scored.
pub fn score_generation(
    reference: &Loaded,
    prompt_ids: &[u32],
    events: &[TokenEvent],
    ignore_eos: bool,
    thresholds: &Thresholds,
) -> Result<Scored, VerifyError> {
    let (mut tokens, unmapped) = subject_tokens(events, reference)?;
    let text = |id: u32| reference.tokenizer().decode(&[id]);
    let banned = if ignore_eos { reference.tokenizer().specials.stop.clone() } else { vec![] };
    let mut positions = score::score(reference.model(), prompt_ids, &tokens, &text, &banned)?;
    // A server whose reasoning parser takes `<think>` / `</think>` out of the stream (vLLM,
    // SGLang, deltascope serve) never shows them: where the reference is sure of a tag the
    // subject never sent, the tag is put back (hidden: forced through, not scored) and the
    // rest scored again; so is the whitespace the parser ate right after a `</think>` put
    // back. A server that streams its tags (llama.cpp, asked not to split) is taken at its word.
    let tags: Vec<u32> = [reference.tokenizer().specials.think_start, reference.tokenizer().specials.think_end]
        .into_iter()
        .flatten()
        .filter(|tag| !tokens.iter().any(|t| t.id == *tag))
        .collect();
    let mut inserted: Vec<usize> = vec![];
    for _ in 0..MAX_HIDDEN_TAGS {
        let missing = positions.iter().find_map(|p| {
            let best = p.reference_top.first()?;
            let after_tag = p.index > 0 && inserted.contains(&(p.index - 1)) && best.text.trim().is_empty();
            (!p.hidden && (tags.contains(&best.id) || after_tag) && best.id != p.id && best.logprob.exp() > 0.5)
                .then_some((p.index, best.id, best.text.clone()))
        });
        let Some((at, id, text_of)) = missing else { break };
        tokens.insert(at, SubjectToken { id, text: text_of, logprob: None, top: vec![], hidden: true });
        inserted.push(at);
        positions = score::score(reference.model(), prompt_ids, &tokens, &text, &banned)?;
    }
    let verdict = score::verdict(&positions, thresholds);
    Ok(Scored { positions, verdict, unmapped, inserted })
}

fn compare_prompts(subject: &dyn Backend, req: &ChatRequest, ids: &[u32], reference: &Loaded) -> PromptCheck {
    let theirs = subject.prompt_tokens(req).map_err(|e| e.message);
    let check = prompt_check(theirs, &subject.info().name, req, ids, reference);
    if !matches!(check, PromptCheck::NotChecked { .. }) {
        return check;
    }
    // A server that tokenises text but renders no chat: its tokens for the reference's text.
    let Ok((Some(text), _)) = reference.render(req) else { return check };
    match subject.text_tokens(&text) {
        Ok(Some(theirs)) => {
            match prompt_check(Ok(Some(PromptTokens { text: None, ids: theirs })), "", req, ids, reference) {
                PromptCheck::Same { tokens } => PromptCheck::TokenizerSame { tokens },
                differs => differs,
            }
        }
        Ok(None) => check,
        Err(e) => PromptCheck::NotChecked { why: format!("asking the server to tokenise failed: {}", e.message) },
    }
}

/// The subject's prompt (as its backend answered, or why it could not) against the
/// reference's `ids` for the same request.
pub fn prompt_check(
    theirs: Result<Option<PromptTokens>, String>,
    subject_name: &str,
    req: &ChatRequest,
    ids: &[u32],
    reference: &Loaded,
) -> PromptCheck {
    let theirs = match theirs {
        Ok(Some(t)) => t,
        Ok(None) => {
            return PromptCheck::NotChecked {
                why: format!("{subject_name} has no endpoint that renders and tokenises a chat"),
            };
        }
        Err(e) => return PromptCheck::NotChecked { why: format!("asking the server failed: {e}") },
    };
    let Some(at) = (0..ids.len().max(theirs.ids.len())).find(|&i| ids.get(i) != theirs.ids.get(i)) else {
        return PromptCheck::Same { tokens: ids.len() };
    };
    let name = |id: Option<&u32>| {
        id.map_or("(the end)".into(), |&id| format!("{id} {:?}", reference.tokenizer().decode(&[id])))
    };
    let ours = reference.render(req).ok().and_then(|(t, _)| t);
    let text_at = match (ours, theirs.text) {
        (Some(a), Some(b)) => {
            let at = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
            let around = |s: &str| s.chars().skip(at.saturating_sub(20)).take(40).collect::<String>();
            (a != b).then(|| (at, around(&a), around(&b)))
        }
        _ => None,
    };
    PromptCheck::Differs { at, reference: name(ids.get(at)), subject: name(theirs.ids.get(at)), text_at }
}

/// A server's refusal of a prompt too long for its context, as the probe's "not run" reason
/// (a context it did not report before).
pub fn too_long(e: &VerifyError) -> Option<String> {
    match e {
        VerifyError::Backend(b) if b.kind == deltascope_protocol::ErrorKind::ContextOverflow => {
            Some(format!("the server refused it: {}", b.message))
        }
        _ => None,
    }
}

/// The subject's tokens of one greedy generation, and the error it ended in after some
/// tokens (one before any token is the request's failure: an error).
pub(super) fn generate(
    subject: &dyn Backend,
    req: ChatRequest,
) -> Result<(Vec<TokenEvent>, Option<String>), VerifyError> {
    let mut tokens = vec![];
    let end = subject.start(req)?.for_each(|e| {
        if let EngineEvent::Token(t) = e {
            tokens.push(t.clone());
        }
    });
    match end {
        EngineEvent::Error(e) if tokens.is_empty() => Err(VerifyError::Backend(BackendError::new(e.kind, e.message))),
        EngineEvent::Error(e) => Ok((tokens, Some(e.message))),
        _ => Ok((tokens, None)),
    }
}

/// A stream with tokens and not one logprob among them: nothing to compare.
pub(super) fn sends_no_logprobs(events: &[TokenEvent]) -> bool {
    !events.is_empty() && events.iter().all(|t| t.logprob.is_none() && t.top_logprobs.is_empty())
}

/// The subject's tokens as reference ids, and the first that could not be mapped (index, text).
type Mapped = (Vec<SubjectToken>, Option<(usize, String)>);

/// The subject's tokens as reference ids: the id the server sent, else the reference
/// tokenizer's single token for the text. Scoring stops at the first token that cannot be
/// mapped.
fn subject_tokens(events: &[TokenEvent], reference: &Loaded) -> Result<Mapped, VerifyError> {
    if sends_no_logprobs(events) {
        return Err(VerifyError::Cannot("the server sends no logprobs (nothing to compare with the reference)".into()));
    }
    let tok = &reference.tokenizer();
    let single = |text: &str| match tok.encode(text) {
        Ok(ids) if ids.len() == 1 => Some(ids[0]),
        _ => None,
    };
    let mut out: Vec<SubjectToken> = vec![];
    for (i, t) in events.iter().enumerate() {
        let Some(id) = t.id.or_else(|| single(&t.text)) else {
            return Ok((out, Some((i, t.text.clone()))));
        };
        let top =
            t.top_logprobs.iter().filter_map(|a| a.id.or_else(|| single(&a.text)).map(|id| (id, a.logprob))).collect();
        // A token the server named by id alone, in a frame of several, has no text of its own.
        let text = if t.text.is_empty() && t.id.is_some() { tok.decode(&[id]) } else { t.text.clone() };
        out.push(SubjectToken { id, text, logprob: t.logprob, top, hidden: t.forced });
    }
    Ok((out, None))
}
