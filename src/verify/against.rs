//! `deltascope verify --server A --against B`: two servers compared with no local model (one
//! SGLang version against another, one GPU against another). Both generate greedily with their
//! top logprobs; while their tokens agree, every position is scored with B's numbers as the
//! reference (B's log-probability of the token, its top-k, the KL bound over the entries both
//! lists share). At the first token they choose differently the comparison ends: a choice B
//! all but rules out is a divergence, a near-tie only where the texts part. Neither server is
//! known to be right: B is the yardstick, not the truth.

use super::probes::Probe;
use super::score::{Alt, Position, Thresholds};
use super::server::{ProbeReport, PromptCheck, VerifyError};
use crate::backend::{Backend, BackendError, ChatRequest};
use deltascope_protocol::{ErrorKind, TokenEvent};

/// Runs `probe` on `subject` and on `reference` and compares them.
pub fn check_pair(
    subject: &dyn Backend,
    reference: &dyn Backend,
    probe: &Probe,
    thresholds: &Thresholds,
) -> Result<ProbeReport, VerifyError> {
    let req = super::server::request(probe);
    let prompt = match (subject.prompt_tokens(&req), reference.prompt_tokens(&req)) {
        (Ok(Some(a)), Ok(Some(b))) => match (0..a.ids.len().max(b.ids.len())).find(|&i| a.ids.get(i) != b.ids.get(i)) {
            None => PromptCheck::Same { tokens: a.ids.len() },
            Some(at) => {
                let name = |id: Option<&u32>| id.map_or("(the end)".into(), |id| id.to_string());
                PromptCheck::Differs { at, reference: name(b.ids.get(at)), subject: name(a.ids.get(at)), text_at: None }
            }
        },
        _ => PromptCheck::NotChecked { why: "one of the servers cannot render and tokenise a chat".into() },
    };
    let prompt_tokens = match &prompt {
        PromptCheck::Same { tokens } => *tokens,
        _ => 0,
    };
    let mut report = ProbeReport::new(&probe.name, prompt_tokens, prompt);
    if matches!(report.prompt, PromptCheck::Differs { .. }) {
        return Ok(report);
    }
    let (a, b) = match tokens(subject, req.clone()).and_then(|a| Ok((a, tokens(reference, req)?))) {
        Err(e) => match super::server::too_long(&e) {
            Some(why) => {
                report.not_run = Some(why);
                return Ok(report);
            }
            None => return Err(e),
        },
        Ok(pair) => pair,
    };
    for (i, (s, r)) in a.iter().zip(&b).enumerate() {
        let same = match (s.id, r.id) {
            (Some(x), Some(y)) => x == y,
            _ => s.text == r.text,
        };
        let p = position(i, s, r);
        let near_tie = !same && p.reference_p() >= thresholds.diverge_below;
        report.positions.push(p);
        if !same {
            if near_tie {
                report.parted_at = Some(i);
            }
            break;
        }
    }
    report.verdict = Some(super::score::verdict(&report.positions, thresholds));
    Ok(report)
}

fn tokens(backend: &dyn Backend, req: ChatRequest) -> Result<Vec<TokenEvent>, VerifyError> {
    let who = &backend.info().name;
    let (out, failed) = super::server::generate(backend, req)?;
    if let Some(message) = failed {
        // Past the first token the two texts cannot be compared to the end: an error here.
        return Err(VerifyError::Backend(BackendError::new(ErrorKind::Unavailable, format!("{who}: {message}"))));
    }
    if super::server::sends_no_logprobs(&out) {
        return Err(VerifyError::Cannot(format!("{who} sends no logprobs (nothing to compare the other server with)")));
    }
    Ok(out)
}

/// The key two servers' alternatives are matched on: the id when sent, else the text.
fn key(id: Option<u32>, text: &str) -> String {
    id.map_or_else(|| format!("t:{text}"), |id| format!("i:{id}"))
}

/// Subject token `s` scored by reference token `r`'s numbers (the same position).
fn position(index: usize, s: &TokenEvent, r: &TokenEvent) -> Position {
    let alts = |t: &TokenEvent| -> Vec<(String, Alt)> {
        t.top_logprobs
            .iter()
            .map(|a| {
                (key(a.id, &a.text), Alt { id: a.id.unwrap_or(u32::MAX), text: a.text.clone(), logprob: a.logprob })
            })
            .collect()
    };
    let (ref_top, sub_top) = (alts(r), alts(s));
    let own = key(s.id, &s.text);
    // B's log-probability of A's token: from B's list, or at most B's last entry when A's token
    // is not in it.
    let floor = ref_top.last().map_or(f32::NEG_INFINITY, |(_, a)| a.logprob);
    let ref_lp = if key(r.id, &r.text) == own { r.logprob } else { None }
        .or_else(|| ref_top.iter().find(|(k, _)| *k == own).map(|(_, a)| a.logprob))
        .unwrap_or(floor);
    let best = ref_top.first().map_or(r.logprob.unwrap_or(0.0), |(_, a)| a.logprob);
    let rank = ref_top.iter().position(|(k, _)| *k == own).unwrap_or(ref_top.len());
    let shared: Vec<(f32, f32)> = ref_top
        .iter()
        .filter_map(|(k, a)| sub_top.iter().find(|(k2, _)| k2 == k).map(|(_, b)| (a.logprob, b.logprob)))
        .collect();
    let overlap = (!sub_top.is_empty()).then(|| shared.len() as f32 / sub_top.len() as f32);
    let kl = (!shared.is_empty()).then(|| super::score::kl_bound(shared.iter().copied()));
    Position {
        index,
        id: s.id.unwrap_or(u32::MAX),
        text: s.text.clone(),
        hidden: false,
        subject_logprob: s.logprob,
        reference_logprob: ref_lp,
        reference_rank: rank,
        reference_best_logprob: best,
        delta: s.logprob.map(|l| l - ref_lp),
        overlap,
        kl_lower_bound: kl,
        reference_top: ref_top.into_iter().take(5).map(|(_, a)| a).collect(),
        subject_top: sub_top.into_iter().take(5).map(|(_, a)| a).collect(),
    }
}
