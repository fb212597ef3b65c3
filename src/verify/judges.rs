//! Three judges (`verify --against-full`): the server's tokens are scored by the reference on
//! the file the server runs (a GGUF: the same bytes) *and* by the full-precision checkpoint of
//! the same model. The first score is the serving error (the server against its own weights),
//! the reference's own logprobs scored by the full checkpoint on the same tokens are the
//! quantisation error (those weights against the model's). A divergence then has one cause.

use serde::Serialize;

use super::probes::Probe;
use super::score::{self, Position, SubjectToken, Thresholds, Verdict};
use super::server::{ProbeReport, VerifyError, request};
use crate::backend::local::Loaded;

/// The quantisation error of one probe: the GGUF reference's log-probabilities on the
/// server's tokens, scored by the full checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuantisationError {
    pub verdict: Verdict,
    pub positions: Vec<Position>,
}

/// Scores the positions `report` holds (the server's tokens, with the GGUF reference's
/// log-probabilities) under `full`. `Ok(None)` when the report scored nothing.
pub fn quantisation_error(
    quantised: &Loaded,
    full: &Loaded,
    probe: &Probe,
    report: &ProbeReport,
    thresholds: &Thresholds,
) -> Result<Option<QuantisationError>, VerifyError> {
    if report.positions.is_empty() {
        return Ok(None);
    }
    let req = request(probe);
    let (_, ids) = quantised.render(&req)?;
    let (_, full_ids) = full.render(&req)?;
    if ids != full_ids {
        return Err(VerifyError::Cannot(format!(
            "--against-full: the full checkpoint renders probe `{}` into other token ids than the GGUF ({} vs {} tokens): not the same model's tokenizer",
            probe.name,
            full_ids.len(),
            ids.len()
        )));
    }
    // The GGUF reference plays the subject: its log-probability and top-k at each position.
    let tokens: Vec<SubjectToken> = report
        .positions
        .iter()
        .map(|p| SubjectToken {
            id: p.id,
            text: p.text.clone(),
            logprob: Some(p.reference_logprob),
            top: p.reference_top.iter().map(|a| (a.id, a.logprob)).collect(),
            hidden: p.hidden,
        })
        .collect();
    let text = |id: u32| full.tokenizer().decode(&[id]);
    let banned = if probe.ignore_eos { full.tokenizer().specials.stop.clone() } else { vec![] };
    let positions = score::score(full.model(), &ids, &tokens, &text, &banned)?;
    let verdict = score::verdict(&positions, thresholds);
    Ok(Some(QuantisationError { verdict, positions }))
}
