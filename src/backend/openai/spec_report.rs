//! What a server says about speculative decoding for one request, as [`MtpStats`].

use serde_json::Value;

use deltascope_protocol::MtpStats;

/// Per-request speculative-decoding counters from `/metrics`, read before and after.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MetricsDelta {
    pub drafts: f64,
    pub per_position: Vec<f64>,
    /// "llama.cpp /metrics" or "vLLM /metrics".
    pub source: String,
}

/// Speculative decoding, from whatever the server reported for this request: vLLM's
/// `metrics.speculative_decoding`, SGLang's `sglext.spec_tokens_details`, or llama.cpp's
/// `timings.draft_n` with per-position counts from `/metrics`.
pub fn server_mtp(
    vllm_metrics: Option<&Value>,
    sglext: Option<&Value>,
    timings: Option<&Value>,
    metrics: Option<MetricsDelta>,
    completion: usize,
) -> Option<MtpStats> {
    let per_position = |m: &Option<MetricsDelta>| -> Option<(usize, Vec<(usize, usize)>)> {
        let m = m.as_ref().filter(|m| m.drafts > 0.0)?;
        let steps = m.drafts.round() as usize;
        Some((steps, m.per_position.iter().map(|a| (steps, a.round() as usize)).collect()))
    };
    // vLLM: `metrics.speculative_decoding` (needs --per-request-spec-decode-metrics).
    if let Some(sd) = vllm_metrics.and_then(|m| m.get("speculative_decoding")).filter(|v| !v.is_null()) {
        let n = |k: &str| sd.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
        let depth = n("num_spec_tokens");
        let steps = n("num_spec_steps");
        let hist = histogram(sd.get("acceptance_histogram"));
        let counts = counts_from_histogram(&hist, depth, steps);
        let len = sd.get("mean_acceptance_length").and_then(Value::as_f64).unwrap_or(0.0);
        let source = "vLLM metrics.speculative_decoding (per position from its acceptance histogram)".to_string();
        return Some(MtpStats::from_server(
            depth,
            steps,
            n("num_draft_tokens"),
            n("num_accepted_draft_tokens"),
            counts,
            len,
            source,
        ));
    }
    // SGLang: `sglext.spec_tokens_details` (return_spec_tokens_details).
    if let Some(sd) = sglext {
        let n = |k: &str| sd.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
        let steps = n("spec_verify_ct");
        let drafted = n("spec_num_proposed_drafts");
        let hist = histogram(sd.get("spec_correct_drafts_histogram"));
        let depth = drafted.checked_div(steps).unwrap_or(hist.len().saturating_sub(1));
        let counts = counts_from_histogram(&hist, depth, steps);
        let len = sd.get("spec_accept_length").and_then(Value::as_f64).unwrap_or(0.0);
        let source = "SGLang sglext.spec_tokens_details (per position from its histogram)".to_string();
        return Some(MtpStats::from_server(depth, steps, drafted, n("spec_num_correct_drafts"), counts, len, source));
    }
    // llama.cpp: `timings.draft_n` / `draft_n_accepted`, positions from /metrics.
    let t = timings?;
    let drafted = t.get("draft_n").and_then(Value::as_u64)? as usize;
    let accepted = t.get("draft_n_accepted").and_then(Value::as_u64).unwrap_or(0) as usize;
    let (steps, counts, source) = match per_position(&metrics) {
        Some((steps, counts)) => {
            let from = metrics.map(|m| m.source).unwrap_or_default();
            (steps, counts, format!("llama.cpp timings.draft_n; per position from {from}"))
        }
        None => (
            0,
            vec![],
            "llama.cpp timings.draft_n (per position: /metrics was not readable; start the server with --metrics)"
                .to_string(),
        ),
    };
    let depth = if steps > 0 { drafted.div_ceil(steps) } else { 0 };
    let len = if steps > 0 { completion as f64 / steps as f64 } else { 0.0 };
    Some(MtpStats::from_server(depth, steps, drafted, accepted, counts, len, source))
}

fn histogram(v: Option<&Value>) -> Vec<usize> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().map(|x| x.as_u64().unwrap_or(0) as usize).collect())
        .unwrap_or_default()
}

/// `[drafted, accepted]` per position from a histogram of drafts accepted per verify step
/// (index j = steps that accepted exactly j drafts): position i is reached by every step and
/// accepted by those that accepted more than i.
fn counts_from_histogram(hist: &[usize], depth: usize, steps: usize) -> Vec<(usize, usize)> {
    (0..depth).map(|i| (steps, hist.iter().skip(i + 1).sum())).collect()
}
