//! The frame mapper on recorded bytes: real llama.cpp streams, and SGLang / vLLM streams
//! reconstructed from their sources (tests/fixtures/wire/README.md).

use std::time::Instant;

use serde_json::Value;

use super::frames::{End, Flow, Forcing, FrameMapper, MetricsDelta, Split};
use deltascope_protocol::{
    CountSource, DiagnosticKind, DoneEvent, EngineEvent, FinishReason, GenerationParams, Phase, Thinking, TokenEvent,
};

const THINKING: &str = "Check divisors up to the square root of 91.\n";
const ANSWER: &str = "No, 91 = 7 × 13, so 91 is not prime.";

fn wire(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wire").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Feeds every `data:` frame of an SSE body (skipping `[DONE]`), then finishes.
fn replay(
    sse: &str,
    mut params: GenerationParams,
    split: Split,
    thinking: bool,
    metrics: Option<MetricsDelta>,
) -> Vec<EngineEvent> {
    // The recorded budgets are llama.cpp's.
    if !thinking {
        params.thinking = Thinking::Off;
    }
    let forcing = if params.thinking.budget().is_some() { Forcing::Streamed("llama.cpp") } else { Forcing::None };
    let mut m = FrameMapper::new(&params, split, forcing, Instant::now());
    let mut out = vec![];
    let mut emit = |e: EngineEvent| out.push(e);
    for line in sse.lines() {
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(m.frame(&v, &mut emit), Flow::Continue);
    }
    m.finish(End::Complete, metrics, &mut emit);
    out
}

fn done(ev: &[EngineEvent]) -> &DoneEvent {
    match ev.last() {
        Some(EngineEvent::Done(d)) => d,
        other => panic!("last event {other:?}"),
    }
}

fn tokens(ev: &[EngineEvent]) -> Vec<&TokenEvent> {
    ev.iter().filter_map(|e| if let EngineEvent::Token(t) = e { Some(t) } else { None }).collect()
}

fn params() -> GenerationParams {
    GenerationParams { max_tokens: 256, ..Default::default() }
}

#[test]
fn llama_cpp_reasoning_stream() {
    let ev = replay(&wire("llamacpp/llamacpp-b10434-chat-stream-reasoning.sse"), params(), Split::Server, true, None);
    let d = done(&ev);
    assert_eq!(d.finish_reason, FinishReason::Stop);
    assert!(d.thinking.starts_with(THINKING) && d.thinking.ends_with("7 divides 91.\n"), "{:?}", d.thinking);
    assert_eq!(d.answer, ANSWER);
    let t = tokens(&ev);
    assert_eq!(t.len(), 91, "one token per frame");
    assert!(t.iter().all(|t| t.id.is_some() && t.logprob.is_some() && t.top_logprobs.len() == 2));
    assert_eq!(t.iter().filter(|t| t.phase == Phase::Thinking).count(), 70);
    // 94 completion tokens: `</think>` (thinking), the blank line and <|im_end|> (answer) came
    // without frames, and are counted where the engine counts them.
    let u = &d.usage;
    assert_eq!((u.prompt_tokens, u.completion_tokens, u.thinking_tokens, u.answer_tokens), (16, 94, 71, 23));
    assert_eq!(u.counted, CountSource::Logprobs);
    assert!(d.mtp.is_none() && d.memory.is_none());
    assert!(!ev.iter().any(|e| matches!(e, EngineEvent::Diagnostic(_))));
}

#[test]
fn llama_cpp_mtp_figures_and_missing_logprobs() {
    let metrics =
        MetricsDelta { drafts: 34.0, per_position: vec![34.0, 18.0, 7.0], source: "llama.cpp /metrics".into() };
    let mut p = params();
    p.top_logprobs = 2;
    let ev =
        replay(&wire("llamacpp/llamacpp-b10434-mtp-chat-stream-reasoning.sse"), p, Split::Server, true, Some(metrics));
    let d = done(&ev);
    assert_eq!(d.answer, ANSWER);
    let m = d.mtp.as_ref().unwrap();
    assert_eq!((m.drafted, m.accepted, m.steps, m.depth), (102, 59, 34, 3));
    assert_eq!(m.per_position.len(), 3);
    assert!((m.per_position[1] - 18.0 / 34.0).abs() < 1e-9);
    assert!((m.mean_accepted_length - 94.0 / 34.0).abs() < 1e-9);
    assert!(m.source.as_deref().unwrap().contains("draft_n"));
    // Accepted drafts carry no logprob: left empty, not made up.
    let t = tokens(&ev);
    assert!(t.iter().filter(|t| t.logprob.is_none()).count() > 80);
    assert_eq!(d.usage.counted, CountSource::Frames);
}

#[test]
fn llama_cpp_length_cut_inside_thinking_raises_the_banner() {
    let mut p = params();
    p.max_tokens = 12;
    let ev = replay(&wire("llamacpp/llamacpp-b10434-chat-stream-length.sse"), p, Split::Server, true, None);
    let d = done(&ev);
    assert_eq!(d.finish_reason, FinishReason::Length);
    assert!(d.answer.is_empty() && !d.thinking.is_empty());
    let diag = ev.iter().find_map(|e| if let EngineEvent::Diagnostic(x) = e { Some(x) } else { None }).unwrap();
    assert_eq!(diag.kind, DiagnosticKind::ThinkingExhaustedMaxTokens);
    assert!(diag.message.contains("max_tokens (12) ran out inside the thinking phase"), "{}", diag.message);
}

#[test]
fn llama_cpp_budget_is_recognised_as_forced() {
    let mut p = params();
    // Recorded with `reasoning_budget_tokens: 8`, which llama.cpp counts from the prompt's
    // newline: the budget deltascope now sends as 8 for a budget of 7.
    p.thinking = Thinking::from_budget(Some(7));
    for f in ["llamacpp/llamacpp-b10434-chat-stream-budget8.sse", "llamacpp/llamacpp-b11549-chat-stream-budget8.sse"] {
        let ev = replay(&wire(f), p.clone(), Split::Server, true, None);
        assert!(
            ev.iter()
                .any(|e| matches!(e, EngineEvent::Diagnostic(d) if d.kind == DiagnosticKind::ThinkingBudgetForced)),
            "{f}"
        );
        let d = done(&ev);
        assert!(!d.answer.is_empty(), "{f}");
        assert_eq!(d.usage.thinking_tokens, 7, "{f}: the model's own thinking is the budget");
        assert_eq!(d.usage.completion_tokens, d.usage.thinking_tokens + d.usage.forced_tokens + d.usage.answer_tokens);
        assert!(d.usage.forced_tokens >= 1, "{f}: at least `</think>` was forced");
    }
}

#[test]
fn no_reasoning_parser_is_split_here() {
    let ev = replay(
        &wire("llamacpp/llamacpp-b10434-chat-stream-reasoning-format-none.sse"),
        params(),
        Split::Auto,
        true,
        None,
    );
    let d = done(&ev);
    assert!(d.thinking.starts_with(THINKING), "{:?}", d.thinking);
    assert!(!d.thinking.contains("<think>") && !d.thinking.contains("</think>"));
    assert_eq!(d.answer.trim_start(), ANSWER);
    let t = tokens(&ev);
    let marker = t.iter().find(|t| t.text == "</think>").expect("the marker is a token");
    assert_eq!((marker.phase, marker.id), (Phase::Thinking, Some(505)));
}

#[test]
fn thinking_off_is_all_answer() {
    let ev = replay(&wire("llamacpp/llamacpp-b10434-chat-stream-nothink.sse"), params(), Split::Server, false, None);
    let d = done(&ev);
    assert!(d.thinking.is_empty() && !d.answer.is_empty());
    assert_eq!(d.usage.thinking_tokens, 0);
}

#[test]
fn sglang_stream_with_spec_details_and_reasoning_tokens() {
    for f in ["sglang/chat-stream-reasoning.sse", "sglang/chat-stream-reasoning-pydantic.sse"] {
        let ev = replay(&wire(f), params(), Split::Auto, true, None);
        let d = done(&ev);
        assert!(d.thinking.starts_with(THINKING), "{f}");
        assert_eq!(d.answer, ANSWER, "{f}");
        assert_eq!(d.usage.counted, CountSource::ServerUsage, "{f}");
        assert_eq!((d.usage.thinking_tokens, d.usage.completion_tokens), (71, 94), "{f}");
        if f.ends_with("reasoning.sse") {
            let m = d.mtp.as_ref().unwrap();
            assert_eq!((m.steps, m.drafted, m.accepted), (34, 102, 59));
            assert_eq!(m.per_position.len(), 3);
            assert!(m.source.as_deref().unwrap().starts_with("SGLang"));
        }
    }
}

#[test]
fn sglang_error_frame_keeps_what_arrived() {
    let ev = replay(&wire("sglang/chat-stream-error.sse"), params(), Split::Auto, true, None);
    assert!(!tokens(&ev).is_empty());
    match ev.last() {
        Some(EngineEvent::Error(e)) => assert!(e.message.contains("kept the"), "{}", e.message),
        other => panic!("{other:?}"),
    }
}

#[test]
fn vllm_stream_with_reasoning_field_and_spec_metrics() {
    for f in ["vllm/chat-stream-reasoning.sse", "vllm/chat-stream-reasoning-content.sse"] {
        let ev = replay(&wire(f), params(), Split::Auto, true, None);
        let d = done(&ev);
        assert!(d.thinking.starts_with(THINKING), "{f}");
        assert_eq!(d.answer, ANSWER, "{f}");
    }
    let ev = replay(&wire("vllm/chat-stream-reasoning.sse"), params(), Split::Auto, true, None);
    assert_eq!(done(&ev).usage.counted, CountSource::ServerUsage);
    assert_eq!(done(&ev).usage.thinking_tokens, 70);
    let m = done(&ev).mtp.clone().unwrap();
    assert_eq!((m.depth, m.steps, m.drafted, m.accepted), (3, 34, 102, 59));
    assert!(m.per_position.windows(2).all(|w| w[0] >= w[1]), "{:?}", m.per_position);
}

#[test]
fn vllm_and_sglang_length_cuts() {
    for f in ["vllm/chat-stream-length.sse", "sglang/chat-stream-length.sse"] {
        let ev = replay(&wire(f), params(), Split::Auto, true, None);
        let d = done(&ev);
        assert_eq!(d.finish_reason, FinishReason::Length, "{f}");
        assert!(d.answer.is_empty(), "{f}");
        assert!(
            ev.iter().any(
                |e| matches!(e, EngineEvent::Diagnostic(x) if x.kind == DiagnosticKind::ThinkingExhaustedMaxTokens)
            )
        );
    }
}

#[test]
fn loops_are_caught_on_token_text_without_ids() {
    let mut m = FrameMapper::new(&params(), Split::Server, Forcing::None, Instant::now());
    let mut out = vec![];
    let mut emit = |e: EngineEvent| out.push(e);
    let pattern = ["2", " +", " 2", " =", " 2", "."];
    for i in 0..120 {
        let v = serde_json::json!({"choices":[{"index":0,"delta":{"reasoning_content": pattern[i % 6]}}]});
        m.frame(&v, &mut emit);
    }
    let d = out.iter().find_map(|e| if let EngineEvent::Diagnostic(d) = e { Some(d.clone()) } else { None }).unwrap();
    assert_eq!(d.kind, DiagnosticKind::DegenerateLoop);
    assert_eq!(d.period, Some(6));
}

#[test]
fn cut_stream_is_an_error_that_keeps_the_tokens() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wire/faults/cut-mid-token.sse");
    // Cut inside a UTF-8 character: the last frame is not even text.
    let sse = String::from_utf8_lossy(&std::fs::read(p).unwrap()).to_string();
    let mut m = FrameMapper::new(&params(), Split::Server, Forcing::None, Instant::now());
    let mut out = vec![];
    let mut emit = |e: EngineEvent| out.push(e);
    for line in sse.lines() {
        if let Some(v) = line.strip_prefix("data: ").and_then(|d| serde_json::from_str::<Value>(d).ok()) {
            m.frame(&v, &mut emit);
        }
    }
    m.finish(End::Complete, None, &mut emit);
    assert!(!tokens(&out).is_empty());
    assert!(matches!(out.last(), Some(EngineEvent::Error(e)) if e.message.contains("without a finish reason")));
}

/// Resolves nothing, as getaddrinfo does for an unknown host (no resolver is contacted).
struct NoSuchHost;

impl reqwest::dns::Resolve for NoSuchHost {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let e: Box<dyn std::error::Error + Send + Sync> =
                format!("failed to lookup address information: Name or service not known ({host})").into();
            Err(e)
        })
    }
}

#[test]
fn dns_failure_is_one_line_naming_the_host() {
    let http = super::http::Http::with_resolver("http://gpu-box.example:8080/v1", std::sync::Arc::new(NoSuchHost));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let err = rt.block_on(http.get_json("/v1/models")).unwrap_err();
    assert_eq!(err.kind, deltascope_protocol::ErrorKind::Unavailable);
    assert!(
        err.message.starts_with("cannot reach http://gpu-box.example:8080/v1/models: cannot resolve the host name"),
        "{}",
        err.message
    );
    assert!(!err.message.contains('\n'));
}

#[test]
fn tokens_a_server_forces_after_the_budget_are_counted_as_forced() {
    let p = GenerationParams { thinking: Thinking::from_budget(Some(2)), ..params() };
    let mut m = FrameMapper::new(&p, Split::Server, Forcing::Streamed("llama.cpp"), Instant::now());
    let mut out = vec![];
    let mut emit = |e: EngineEvent| out.push(e);
    for (field, text) in
        [("reasoning_content", "a"), ("reasoning_content", "b"), ("reasoning_content", "\n\nOK."), ("content", "42")]
    {
        let v = serde_json::json!({"choices":[{"index":0,"delta":{field: text}}]});
        assert_eq!(m.frame(&v, &mut emit), Flow::Continue);
    }
    let end = serde_json::json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":6}});
    m.frame(&end, &mut emit);
    m.finish(End::Complete, None, &mut emit);
    let forced: Vec<bool> = tokens(&out).iter().map(|t| t.forced).collect();
    assert_eq!(forced, [false, false, true, false]);
    let d = done(&out);
    // 2 thinking, 2 forced (the bridge piece and the `</think>` the parser hid), the rest answer.
    let u = &d.usage;
    assert_eq!((u.thinking_tokens, u.forced_tokens, u.answer_tokens, u.completion_tokens), (2, 2, 2, 6));
    let diag = out.iter().find_map(|e| if let EngineEvent::Diagnostic(x) = e { Some(x) } else { None }).unwrap();
    assert_eq!((diag.kind, diag.at_token), (DiagnosticKind::ThinkingBudgetForced, 2));
}

/// A stream split here (no reasoning parser): each token keeps its logprob entry, the one
/// after the prompt's re-sent `<think>\n` (which comes without entries) and one that ends in
/// "<" (held back whole as a possible start of `</think>`) included; `</think>` is its own.
#[test]
fn tokens_split_here_keep_their_ids() {
    let mut m = FrameMapper::new(&params(), Split::Auto, Forcing::None, Instant::now());
    let mut out = vec![];
    let mut emit = |e: EngineEvent| out.push(e);
    let entry = |id: u32, text: &str| serde_json::json!({"id": id, "token": text, "logprob": -0.5, "top_logprobs": [{"id": id, "token": text, "logprob": -0.5}]});
    let frames = [
        ("<think>\nAdd", vec![entry(413, "Add")]),
        (" <", vec![entry(7, " <")]),
        ("b", vec![entry(8, "b")]),
        ("</think>", vec![entry(9, "</think>")]),
        ("\n\n42", vec![entry(10, "\n\n"), entry(11, "42")]),
        (" <", vec![entry(7, " <")]),
    ];
    for (text, entries) in frames {
        let v = serde_json::json!({"choices":[{"index":0,"delta":{"content": text},"logprobs":{"content": entries}}]});
        assert_eq!(m.frame(&v, &mut emit), Flow::Continue);
    }
    m.finish(End::Complete, None, &mut emit);
    let got: Vec<(Option<u32>, String, Phase)> = tokens(&out).iter().map(|t| (t.id, t.text.clone(), t.phase)).collect();
    let want = [
        (Some(413), "Add", Phase::Thinking),
        (Some(7), " <", Phase::Thinking),
        (Some(8), "b", Phase::Thinking),
        (Some(9), "</think>", Phase::Thinking),
        (Some(10), "\n\n", Phase::Answer),
        (Some(11), "42", Phase::Answer),
        (Some(7), " <", Phase::Answer),
    ];
    let want: Vec<(Option<u32>, String, Phase)> = want.iter().map(|(i, t, p)| (*i, t.to_string(), *p)).collect();
    assert_eq!(got, want);
    assert!(tokens(&out).iter().all(|t| t.logprob == Some(-0.5)), "every token keeps its logprob");
}
