//! Prometheus `/metrics` text: the speculative-decoding counters read before and after a request
//! (per-position acceptance, which no server reports per request over the chat API) and the
//! server's KV-cache usage gauge.

use deltascope_protocol::ServerMemory;

/// One sample: metric name, its labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// Parses the text exposition format (comments and malformed lines are skipped).
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let (head, value) = match line.find('{') {
        Some(_) => {
            let close = line.rfind('}')?;
            (&line[..close + 1], line[close + 1..].trim())
        }
        None => {
            let mut it = line.splitn(2, char::is_whitespace);
            (it.next()?, it.next()?.trim())
        }
    };
    let value: f64 = value.split_whitespace().next()?.parse().ok()?;
    let (name, labels) = match head.find('{') {
        Some(open) => {
            let inner = &head[open + 1..head.len() - 1];
            let labels = inner
                .split(',')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k.trim().to_string(), v.trim().trim_matches('"').to_string()))
                })
                .collect();
            (head[..open].to_string(), labels)
        }
        None => (head.to_string(), vec![]),
    };
    Some(Sample { name, labels, value })
}

fn sum(samples: &[Sample], name: &str) -> Option<f64> {
    let v: Vec<f64> = samples.iter().filter(|s| s.name == name).map(|s| s.value).collect();
    if v.is_empty() { None } else { Some(v.iter().sum()) }
}

/// The speculative-decoding counters of one server flavour (vLLM's names; llama.cpp copies them
/// with its own prefix).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SpecCounters {
    pub drafts: f64,
    pub draft_tokens: f64,
    pub accepted: f64,
    /// Accepted tokens at draft position 0, 1, …
    pub per_position: Vec<f64>,
}

/// Reads the counters under `prefix` (`vllm:` or `llamacpp:`); `None` when the server has none.
pub fn spec_counters(samples: &[Sample], prefix: &str) -> Option<SpecCounters> {
    let name = |n: &str| format!("{prefix}spec_decode_{n}");
    let drafts = sum(samples, &name("num_drafts_total"))?;
    let mut per_position: Vec<(usize, f64)> = vec![];
    for s in samples.iter().filter(|s| s.name == name("num_accepted_tokens_per_pos_total")) {
        if let Some(pos) = s.labels.iter().find(|(k, _)| k == "position").and_then(|(_, v)| v.parse::<usize>().ok()) {
            match per_position.iter_mut().find(|(p, _)| *p == pos) {
                Some((_, v)) => *v += s.value,
                None => per_position.push((pos, s.value)),
            }
        }
    }
    per_position.sort_by_key(|(p, _)| *p);
    Some(SpecCounters {
        drafts,
        draft_tokens: sum(samples, &name("num_draft_tokens_total")).unwrap_or(0.0),
        accepted: sum(samples, &name("num_accepted_tokens_total")).unwrap_or(0.0),
        per_position: per_position.into_iter().map(|(_, v)| v).collect(),
    })
}

impl SpecCounters {
    /// What happened between two readings.
    pub fn since(&self, before: &SpecCounters) -> SpecCounters {
        SpecCounters {
            drafts: self.drafts - before.drafts,
            draft_tokens: self.draft_tokens - before.draft_tokens,
            accepted: self.accepted - before.accepted,
            per_position: self
                .per_position
                .iter()
                .enumerate()
                .map(|(i, v)| v - before.per_position.get(i).copied().unwrap_or(0.0))
                .collect(),
        }
    }
}

/// The share of the server's KV cache in use, from whichever gauge it exposes.
pub fn kv_usage(samples: &[Sample]) -> Option<ServerMemory> {
    // vLLM (new, then old name) and SGLang; each a 0–1 fraction.
    for metric in
        ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage", "llamacpp:kv_cache_usage_ratio"]
    {
        let values: Vec<f64> = samples.iter().filter(|s| s.name == metric).map(|s| s.value).collect();
        if let Some(max) = values.iter().copied().reduce(f64::max) {
            return Some(ServerMemory { kv_used_fraction: max.clamp(0.0, 1.0), metric: metric.to_string() });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_llama_cpp_counters_and_labels() {
        let text = "# HELP x\nllamacpp:spec_decode_num_drafts_total 34\nllamacpp:spec_decode_num_draft_tokens_total 102\nllamacpp:spec_decode_num_accepted_tokens_total 59\nllamacpp:spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 18\nllamacpp:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 34\n";
        let c = spec_counters(&parse(text), "llamacpp:").unwrap();
        assert_eq!((c.drafts, c.draft_tokens, c.accepted), (34.0, 102.0, 59.0));
        assert_eq!(c.per_position, vec![34.0, 18.0]);
        assert!(spec_counters(&parse(text), "vllm:").is_none());
        let before = SpecCounters { drafts: 4.0, draft_tokens: 12.0, accepted: 9.0, per_position: vec![4.0, 3.0] };
        assert_eq!(c.since(&before).per_position, vec![30.0, 15.0]);
    }

    #[test]
    fn kv_gauges_of_each_server() {
        let s = parse("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n");
        assert_eq!(kv_usage(&s).unwrap().kv_used_fraction, 0.25);
        assert!(kv_usage(&parse("llamacpp:requests_processing 0\n")).is_none());
    }
}
