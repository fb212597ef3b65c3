//! `GET /metrics`, Prometheus text, with the peers' names where one exists (vLLM's
//! `prompt_tokens_total`, `request_success_total{finished_reason}`, the TTFT and inter-token
//! latency histograms, `spec_decode_num_drafts_total` … `num_accepted_tokens_per_pos_total`),
//! under the `deltascope_` prefix, and deltascope's own: thinking tokens, forced budget ends,
//! loop alarms, the queue, the engine's memory.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use deltascope_protocol::{DiagnosticKind, DoneEvent, Memory};

type Labels = Vec<(String, String)>;

pub struct Metrics {
    registry: Registry,
    pub prompt_tokens: Counter,
    pub generation_tokens: Counter,
    pub thinking_tokens: Counter,
    pub requests: Family<Labels, Counter>,
    pub rejected: Counter,
    pub left_queue: Counter,
    pub ttft: Histogram,
    pub inter_token: Histogram,
    pub e2e: Histogram,
    pub drafts: Counter,
    pub draft_tokens: Counter,
    pub accepted_tokens: Counter,
    pub accepted_per_pos: Family<Labels, Counter>,
    pub forced_budget_ends: Counter,
    pub loop_alarms: Counter,
    pub loop_rescues: Counter,
    pub waiting: Gauge,
    pub running: Gauge,
    pub weights_bytes: Gauge,
    pub kv_bytes: Gauge,
    pub recurrent_bytes: Gauge,
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("deltascope");
        macro_rules! reg {
            ($name:literal, $help:literal, $m:expr) => {{
                let m = $m;
                r.register($name, $help, m.clone());
                m
            }};
        }
        let secs = || Histogram::new(exponential_buckets(0.001, 2.0, 18));
        Metrics {
            prompt_tokens: reg!("prompt_tokens", "Prompt tokens read", Counter::default()),
            generation_tokens: reg!("generation_tokens", "Tokens generated (thinking + answer)", Counter::default()),
            thinking_tokens: reg!("thinking_tokens", "Of the generated tokens, thinking", Counter::default()),
            requests: reg!(
                "request_success",
                "Finished requests by finish reason",
                Family::<Labels, Counter>::default()
            ),
            rejected: reg!("requests_rejected", "Requests refused with 503 (queue full)", Counter::default()),
            left_queue: reg!(
                "requests_left_queue",
                "Requests whose client went away while they waited for the engine (never run)",
                Counter::default()
            ),
            ttft: reg!("time_to_first_token_seconds", "Request start (after the queue) to the first token", secs()),
            inter_token: reg!("inter_token_latency_seconds", "Time between generated tokens", secs()),
            e2e: reg!("e2e_request_latency_seconds", "Request arrival to its end, queue included", secs()),
            drafts: reg!("spec_decode_num_drafts", "MTP verify passes", Counter::default()),
            draft_tokens: reg!("spec_decode_num_draft_tokens", "MTP draft tokens proposed", Counter::default()),
            accepted_tokens: reg!("spec_decode_num_accepted_tokens", "MTP draft tokens accepted", Counter::default()),
            accepted_per_pos: reg!(
                "spec_decode_num_accepted_tokens_per_pos",
                "MTP draft tokens accepted at each draft position (0 = the first draft)",
                Family::<Labels, Counter>::default()
            ),
            forced_budget_ends: reg!("forced_budget_ends", "Thinking ended by the thinking budget", Counter::default()),
            loop_alarms: reg!("loop_alarms", "Degenerate-loop alarms", Counter::default()),
            loop_rescues: reg!(
                "loop_rescues",
                "Loops in thinking rescued by a forced end of thinking (on_loop answer)",
                Counter::default()
            ),
            waiting: reg!("num_requests_waiting", "Requests queued for the engine", Gauge::default()),
            running: reg!(
                "num_requests_running",
                "Requests generating (0 or 1: one sequence at a time)",
                Gauge::default()
            ),
            weights_bytes: reg!("weights_bytes", "Bytes of weights the engine holds", Gauge::default()),
            kv_bytes: reg!("kv_cache_bytes", "KV cache bytes of the last request", Gauge::default()),
            recurrent_bytes: reg!(
                "recurrent_state_bytes",
                "Recurrent (GDN) state bytes of the last request",
                Gauge::default()
            ),
            registry: r,
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// A finished generation's counts.
    pub fn finished(&self, reason: &str, done: Option<&DoneEvent>, diagnostics: &[DiagnosticKind]) {
        self.requests.get_or_create(&vec![("finished_reason".into(), reason.into())]).inc();
        // Prompt and generated tokens are counted as they are read and made (a request cut
        // short has used them too): at the start and per token.
        let Some(d) = done else { return };
        if let Some(m) = &d.mtp {
            self.drafts.inc_by(m.steps as u64);
            self.draft_tokens.inc_by(m.drafted as u64);
            self.accepted_tokens.inc_by(m.accepted as u64);
            for (i, (_, a)) in m.position_counts().iter().enumerate() {
                self.accepted_per_pos.get_or_create(&vec![("position".into(), i.to_string())]).inc_by(*a as u64);
            }
        }
        self.forced_budget_ends
            .inc_by(diagnostics.iter().filter(|k| **k == DiagnosticKind::ThinkingBudgetForced).count() as u64);
        self.loop_alarms.inc_by(diagnostics.iter().filter(|k| **k == DiagnosticKind::DegenerateLoop).count() as u64);
        self.loop_rescues.inc_by(diagnostics.iter().filter(|k| **k == DiagnosticKind::LoopRescued).count() as u64);
        if let Some(m) = &d.memory {
            self.memory(m);
        }
    }

    pub fn memory(&self, m: &Memory) {
        if m.weights_bytes > 0 {
            self.weights_bytes.set(m.weights_bytes as i64);
        }
        self.kv_bytes.set(m.kv_bytes as i64);
        self.recurrent_bytes.set(m.recurrent_bytes as i64);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
