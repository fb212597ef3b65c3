//! MTP speculative decoding: greedy output identical to plain decoding (demo model and the
//! fixtures with MTP tensors; with budget forcing, stop strings, max_tokens landing mid-draft),
//! sampled output distributed as the target's (chi-square), metrics and token provenance.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use deltascope_engine::{GenerateRequest, Generator, ModelSequence, Outcome};
use deltascope_model::{ForwardOptions, LoadOptions, Model, ModelSource, demo_source};
use deltascope_protocol::{ChatTemplate, RenderOptions, TextTokenizer};
use deltascope_protocol::{
    DiagnosticKind, DraftKind, EngineEvent, FinishReason, GenerationParams, LoopParams, MtpMode, OnLoop,
    SamplingParams, StatsEvent, Thinking, TokenEvent,
};
use serde_json::json;

struct Setup {
    model: Model,
    tok: TextTokenizer,
    tpl: ChatTemplate,
}

fn load(source: ModelSource) -> Setup {
    let model = Model::load(&source, &LoadOptions::default()).unwrap();
    let tok = TextTokenizer::load(&source, Some(model.config().vocab_size), &model.config().eos_token_ids).unwrap();
    let tpl = ChatTemplate::load(&source, true).unwrap();
    Setup { model, tok, tpl }
}

fn fixture(name: &str) -> Setup {
    load(ModelSource::Dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)))
}

impl Setup {
    fn prompt(&self, q: &str) -> Vec<u32> {
        let opts = RenderOptions { add_generation_prompt: true, enable_thinking: Some(true), ..Default::default() };
        self.tok.encode(&self.tpl.render(&json!([{"role": "user", "content": q}]), &opts).unwrap()).unwrap()
    }

    fn run(&self, prompt: &[u32], params: GenerationParams) -> (Outcome, Vec<EngineEvent>) {
        let g = Generator::new(&self.tok, "t");
        let mut session =
            if params.mtp.is_on() { ModelSequence::with_mtp(&self.model) } else { ModelSequence::new(&self.model) };
        let mut ev = vec![];
        let out = g
            .generate(
                &mut session,
                &GenerateRequest { prompt_ids: prompt.to_vec(), params },
                &AtomicBool::new(false),
                &mut |e| ev.push(e),
            )
            .unwrap();
        (out, ev)
    }
}

fn with_mtp(p: &GenerationParams, depth: usize) -> GenerationParams {
    GenerationParams { mtp: MtpMode::fixed(depth), ..p.clone() }
}

/// Greedy output with every depth equals plain greedy output; returns the tokens compared.
fn assert_identical(s: &Setup, prompt: &[u32], base: GenerationParams, label: &str) -> usize {
    let (plain, _) = s.run(prompt, base.clone());
    for depth in 1..=4 {
        let (spec, ev) = s.run(prompt, with_mtp(&base, depth));
        assert_eq!(spec.tokens, plain.tokens, "{label}: --mtp {depth} differs from plain greedy");
        assert_eq!(spec.forced, plain.forced, "{label}: forced flags");
        assert_eq!(spec.finish_reason, plain.finish_reason, "{label}");
        assert_eq!((&spec.thinking, &spec.answer), (&plain.thinking, &plain.answer), "{label}");
        // Every per-token decision at the same token: the loop alarm, its rescue or stop, the
        // budget's forcing, the length diagnostics.
        assert_eq!(spec.diagnostics, plain.diagnostics, "{label}: --mtp {depth}: diagnostics differ");
        let stats = spec.mtp.expect("drafting ran");
        // Provenance: accepted drafts and the verify passes' own tokens.
        let kinds: Vec<DraftKind> =
            ev.iter().filter_map(|e| if let EngineEvent::Token(t) = e { t.draft } else { None }).collect();
        assert_eq!(kinds.iter().filter(|k| **k == DraftKind::Accepted).count(), stats.accepted, "{label}");
        assert!(kinds.iter().filter(|k| **k == DraftKind::Bonus).count() <= stats.steps);
        assert!(stats.per_position.len() <= depth, "{label}: depth {depth}: {stats:?}");
        if stats.steps == 0 {
            // The first token comes from the prefill and a draft needs room for its bonus token.
            assert!(plain.tokens.len() <= 2, "{label}: depth {depth}: no verify pass in {} tokens", plain.tokens.len());
        } else {
            assert!(stats.mean_accepted_length >= 1.0, "{label}: depth {depth}: {stats:?}");
        }
    }
    plain.tokens.len()
}

#[test]
fn greedy_speculation_equals_plain_greedy_on_the_demo() {
    let s = load(demo_source());
    let base = GenerationParams { max_tokens: 400, ..Default::default() };
    let mut total = 0;
    for q in ["Sort 93, 17, 56, 41, 8, 72.", "How many s are in mississippi?", "Is 199 prime?", "What is 987 + 654?"] {
        total += assert_identical(&s, &s.prompt(q), base.clone(), q);
    }
    // A raw prompt the model was never trained on: it babbles for the whole max_tokens.
    let raw = s.tok.encode("Sort").unwrap();
    total += assert_identical(&s, &raw, GenerationParams { max_tokens: 300, ..Default::default() }, "raw");
    assert!(total >= 256, "{total}");
}

#[test]
fn greedy_speculation_with_forcing_stops_and_odd_max_tokens() {
    let s = load(demo_source());
    let p = s.prompt("Sort 31, 7, 88, 12, 5, 64.");
    // The thinking budget lands inside a draft block for most depths.
    assert_identical(
        &s,
        &p,
        GenerationParams { thinking: Thinking::from_budget(Some(11)), max_tokens: 300, ..Default::default() },
        "budget 11",
    );
    assert_identical(
        &s,
        &p,
        GenerationParams { thinking: Thinking::from_budget(Some(1)), max_tokens: 300, ..Default::default() },
        "budget 1",
    );
    // Stop strings and max_tokens in the middle of a draft.
    assert_identical(
        &s,
        &p,
        GenerationParams { stop: vec!["12 ".into()], max_tokens: 300, ..Default::default() },
        "stop string",
    );
    for max in [1, 2, 3, 7, 29, 30] {
        assert_identical(
            &s,
            &p,
            GenerationParams { max_tokens: max, ..Default::default() },
            &format!("max_tokens {max}"),
        );
    }
    // The answer budget too.
    assert_identical(
        &s,
        &p,
        GenerationParams { answer_budget: Some(3), max_tokens: 300, ..Default::default() },
        "answer budget",
    );
    // No budget is overshot under speculation.
    let (out, _) = s.run(
        &p,
        GenerationParams {
            thinking: Thinking::from_budget(Some(11)),
            max_tokens: 300,
            mtp: MtpMode::fixed(4),
            ..Default::default()
        },
    );
    let before_forced = out.forced.iter().position(|&f| f).unwrap();
    assert_eq!(before_forced, 11);
}

/// The loop alarm and `--on-loop` act at the token where plain decoding acts, whatever the
/// draft depth: at the shipped `degenerate-loop` session's settings (greedy, repetition penalty
/// 0.4, max_tokens 400) the demo's thinking loops; `answer` rescues it (forced right after the
/// alarm, the verify pass cut there), `stop` ends it, `off` lets it eat max_tokens — each with
/// the same tokens, forced flags, diagnostics and finish at `--mtp 0` to `4`.
#[test]
fn loop_decisions_are_the_same_at_every_depth() {
    let s = load(demo_source());
    let p = s.prompt("What is 482 + 739?");
    for on_loop in [OnLoop::Answer, OnLoop::Stop, OnLoop::Off] {
        let params = GenerationParams {
            max_tokens: 400,
            sampling: SamplingParams { temperature: 0.0, repetition_penalty: 0.4, ..Default::default() },
            loop_detection: LoopParams { on_loop, ..Default::default() },
            ..Default::default()
        };
        let label = format!("--on-loop {on_loop:?}");
        assert_identical(&s, &p, params.clone(), &label);
        let (plain, _) = s.run(&p, params);
        let kinds: Vec<DiagnosticKind> = plain.diagnostics.iter().map(|d| d.0).collect();
        assert_eq!(kinds.first(), Some(&DiagnosticKind::DegenerateLoop), "{label}: the case loops: {kinds:?}");
        match on_loop {
            OnLoop::Answer => assert_eq!(kinds[1], DiagnosticKind::LoopRescued, "{label}"),
            OnLoop::Stop => assert_eq!(plain.finish_reason, FinishReason::Loop, "{label}"),
            OnLoop::Off => assert_eq!(plain.finish_reason, FinishReason::Length, "{label}"),
        }
    }
}

#[test]
fn greedy_speculation_on_random_fixtures() {
    for name in ["qwen3_5_vl", "qwen3_5_moe"] {
        let s = fixture(name);
        let ids: Vec<u32> = (0..40).map(|i| 3 + (i * 37 % 400) as u32).collect();
        let n = assert_identical(&s, &ids, GenerationParams { max_tokens: 260, ..Default::default() }, name);
        // Random weights rarely pick an end token: the whole 260-token run is compared.
        assert_eq!(n, 260, "{name}: the run stopped early");
    }
}

#[test]
fn auto_depth_runs_and_matches_greedy() {
    let s = load(demo_source());
    let p = s.prompt("How many r are in strawberry?");
    let base = GenerationParams { max_tokens: 300, ..Default::default() };
    let (plain, _) = s.run(&p, base.clone());
    let (auto, _) = s.run(&p, GenerationParams { mtp: MtpMode::Auto, ..base });
    assert_eq!(auto.tokens, plain.tokens);
    let st = auto.mtp.unwrap();
    // It drafted (16 passes are measured before any cost decision) and ended at a depth of
    // 1-4, or at 0 when plain decoding measured faster: timing-dependent, so either is right
    // here; the decision itself is tested with fixed costs in the engine crate's mtp/control.rs.
    assert!(st.steps >= 16 && st.drafted > 0, "{st:?}");
    assert!(st.depth <= 4, "{st:?}");
}

/// Speculative sampling keeps the target's distribution: over many seeds, the first token the
/// verify pass produces (accepted draft or resampled) follows p(t1, t2) = p(t1)·p(t2 | t1) from
/// the target alone. Top-k 3 keeps the table small; a chi-square test at p = 0.001.
#[test]
fn speculative_sampling_preserves_the_distribution() {
    let s = load(demo_source());
    let prompt = s.prompt("Sort 5, 2, 9, 1.");
    let sampling = |seed| SamplingParams { temperature: 1.3, top_k: 3, seed, ..Default::default() };
    // The exact joint distribution of the first two tokens.
    let dist = |logits: &[f32]| deltascope_engine::Sampler::new(sampling(0), &prompt).distribution(logits);
    let mut state = s.model.new_state();
    let l0 = s.model.forward(&prompt, &mut state, ForwardOptions::default()).unwrap().logits.data;
    let mut expected = vec![];
    for (t1, p1) in dist(&l0) {
        let mut st = state.clone();
        let l1 = s.model.forward(&[t1], &mut st, ForwardOptions::default()).unwrap().logits.data;
        let mut sm = deltascope_engine::Sampler::new(sampling(0), &prompt);
        sm.observe(t1);
        for (t2, p2) in sm.distribution(&l1) {
            expected.push(((t1, t2), p1 * p2));
        }
    }
    let n = 2000u64;
    let mut counts = std::collections::HashMap::new();
    let mut spec_tokens = 0;
    for seed in 0..n {
        let params =
            GenerationParams { max_tokens: 3, sampling: sampling(seed), mtp: MtpMode::fixed(2), ..Default::default() };
        let (out, ev) = s.run(&prompt, params);
        assert!(
            ev.iter().any(|e| matches!(
                e,
                EngineEvent::Token(TokenEvent { index: 1, draft: Some(DraftKind::Accepted | DraftKind::Bonus), .. })
            )),
            "token 2 came from a verify pass"
        );
        spec_tokens += 1;
        *counts.entry((out.tokens[0], out.tokens[1])).or_insert(0u64) += 1;
    }
    let mut chi2 = 0.0;
    for (pair, p) in &expected {
        let e = p * n as f64;
        let o = *counts.get(pair).unwrap_or(&0) as f64;
        chi2 += (o - e) * (o - e) / e;
    }
    let unexpected: u64 = counts.iter().filter(|(k, _)| !expected.iter().any(|(p, _)| p == *k)).map(|(_, v)| v).sum();
    assert_eq!(unexpected, 0, "pairs outside the target's support");
    // Critical value of chi-square at p = 0.001 for up to 8 degrees of freedom.
    let df = expected.len() - 1;
    let critical = [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12][df.clamp(1, 8) - 1];
    eprintln!("chi-square {chi2:.2} over {} cells ({spec_tokens} samples), critical {critical}", expected.len());
    assert!(chi2 < critical, "speculative sampling distorts the distribution: chi-square {chi2} ≥ {critical}");
}

#[test]
fn mtp_stats_are_reported_in_events() {
    let s = load(demo_source());
    let p = s.prompt("Sort 93, 17, 56, 41, 8, 72.");
    let (out, ev) = s.run(&p, GenerationParams { max_tokens: 300, mtp: MtpMode::fixed(3), ..Default::default() });
    let st = out.mtp.unwrap();
    assert!(st.steps > 0 && st.drafted >= st.accepted && st.acceptance_rate > 0.5, "{st:?}");
    assert_eq!(st.per_position.len(), 3);
    assert_eq!(st.history.len(), st.steps);
    assert!(st.snapshot_bytes > 0 && st.verify_ms > 0.0);
    let done = ev
        .iter()
        .find_map(|e| if let EngineEvent::Done(d) = e { Some((d.mtp.clone(), d.memory.clone())) } else { None })
        .unwrap();
    assert_eq!(done.0.unwrap().accepted, st.accepted);
    assert!(ev.iter().any(|e| matches!(e, EngineEvent::Stats(StatsEvent { mtp: Some(_), .. }))));
    let _ = FinishReason::Stop;
}

/// A model session that logs what the generator asks of it, and how many tokens had been
/// emitted at each call; `slow_verify` makes every verify pass that much slower (a machine
/// where drafting cannot pay).
struct Logged<'m> {
    inner: ModelSequence<'m>,
    log: std::sync::Arc<std::sync::Mutex<Vec<(String, usize)>>>,
    emitted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    slow_verify: std::time::Duration,
}

impl Logged<'_> {
    fn note(&self, what: String) {
        let n = self.emitted.load(std::sync::atomic::Ordering::SeqCst);
        self.log.lock().unwrap().push((what, n));
    }
}

impl deltascope_engine::DecodeSequence for Logged<'_> {
    fn feed(&mut self, ids: &[u32]) -> deltascope_model::Result<Vec<f32>> {
        self.note(format!("feed {}", ids.len()));
        self.inner.feed(ids)
    }
    fn position(&self) -> usize {
        self.inner.position()
    }
    fn context_len(&self) -> usize {
        self.inner.context_len()
    }
    fn memory(&self) -> deltascope_protocol::Memory {
        self.inner.memory()
    }
    fn can_draft(&self) -> bool {
        self.inner.can_draft()
    }
    fn catch_up_draft(&mut self) -> deltascope_model::Result<()> {
        self.note("catch up".into());
        self.inner.catch_up_draft()
    }
    fn draft(
        &mut self,
        last: u32,
        k: usize,
        choose: &mut dyn FnMut(&[f32]) -> u32,
    ) -> deltascope_model::Result<Vec<(u32, Vec<f32>)>> {
        self.note("draft".into());
        self.inner.draft(last, k, choose)
    }
    fn verify(&mut self, ids: &[u32]) -> deltascope_model::Result<Vec<Vec<f32>>> {
        std::thread::sleep(self.slow_verify);
        self.inner.verify(ids)
    }
    fn accept(&mut self, keep: usize) -> deltascope_model::Result<()> {
        self.inner.accept(keep)
    }
    fn rollback_bytes(&self) -> usize {
        self.inner.rollback_bytes()
    }
}

/// The MTP head's pass over the prompt belongs to reading the prompt: it runs right after the
/// prompt is fed, before the first token (so prefill and TTFT hold it), and the drafts during
/// decoding cover only the newest positions — and greedy output is still plain greedy's.
#[test]
fn the_mtp_head_reads_the_prompt_during_prefill() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    let s = load(demo_source());
    let prompt = s.prompt("Sort 55, 3, 87, 21, 40.");
    let params = with_mtp(&GenerationParams { max_tokens: 60, ..Default::default() }, 2);
    let (plain, _) = s.run(&prompt, GenerationParams { max_tokens: 60, ..Default::default() });
    let log = Arc::new(Mutex::new(vec![]));
    let emitted = Arc::new(AtomicUsize::new(0));
    let mut src = Logged {
        inner: ModelSequence::with_mtp(&s.model),
        log: log.clone(),
        emitted: emitted.clone(),
        slow_verify: std::time::Duration::ZERO,
    };
    let g = Generator::new(&s.tok, "t");
    let out = g
        .generate(
            &mut src,
            &GenerateRequest { prompt_ids: prompt.clone(), params },
            &AtomicBool::new(false),
            &mut |e| {
                if matches!(e, EngineEvent::Token(_)) {
                    emitted.fetch_add(1, Ordering::SeqCst);
                }
            },
        )
        .unwrap();
    assert_eq!(out.tokens, plain.tokens, "speculative greedy is plain greedy");
    let log = log.lock().unwrap().clone();
    assert_eq!(log[0], (format!("feed {}", prompt.len()), 0), "{log:?}");
    assert_eq!(log[1], ("catch up".to_string(), 0), "the head reads the prompt before any token: {log:?}");
    assert_eq!(log.iter().filter(|(w, _)| w == "catch up").count(), 1, "{log:?}");
    let first_draft = log.iter().find(|(w, _)| w == "draft").expect("drafting ran");
    assert!(first_draft.1 >= 1, "drafts come after the first token: {log:?}");
}

/// `--mtp auto` carries what it measured into the next request on the same engine: once
/// drafting has lost (here every verify pass takes 40 ms, a plain step about a millisecond),
/// the next generation starts plain and drafts nothing until the wait runs out — where a fresh
/// engine measures drafting again. Output stays plain greedy's throughout.
#[test]
fn auto_carries_its_verdict_into_the_next_request() {
    let s = load(demo_source());
    let prompt = s.prompt("Sort 55, 3, 87, 21, 40.");
    let params =
        |max_tokens| GenerationParams { max_tokens, ignore_eos: true, mtp: MtpMode::Auto, ..Default::default() };
    let run = |g: &Generator, p: GenerationParams| {
        let log = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
        let mut src = Logged {
            inner: ModelSequence::with_mtp(&s.model),
            log: log.clone(),
            emitted: Default::default(),
            slow_verify: std::time::Duration::from_millis(40),
        };
        let req = GenerateRequest { prompt_ids: prompt.clone(), params: p };
        let out = g.generate(&mut src, &req, &AtomicBool::new(false), &mut |_| {}).unwrap();
        let drafts = log.lock().unwrap().iter().filter(|(what, _)| what == "draft").count();
        (out, drafts)
    };
    let engine = Generator::new(&s.tok, "t");
    let (first, first_drafts) = run(&engine, params(200));
    let st = first.mtp.clone().unwrap();
    assert!(first_drafts >= 16 && st.steps >= 16, "the first request measures drafting: {st:?}");
    assert_eq!(st.depth, 0, "and turns it off: {st:?}");
    // Drafting is measured within at most 16 passes at depth 2 and 16 at depth 3 (a depth
    // change restarts the measurement), 112 tokens, then 8 plain ones: at least 80 of the
    // 256-token wait are spent in the first request, at most 176 left, more than the second
    // request's 100.
    let (second, second_drafts) = run(&engine, params(100));
    let st2 = second.mtp.clone().unwrap();
    assert_eq!((second_drafts, st2.steps, st2.depth), (0, 0, 0), "the next request starts plain: {st2:?}");
    let (plain, _) = s.run(&prompt, GenerationParams { max_tokens: 100, ignore_eos: true, ..Default::default() });
    assert_eq!(second.tokens, plain.tokens);
    let (_, fresh_drafts) = run(&Generator::new(&s.tok, "t"), params(100));
    assert!(fresh_drafts >= 16, "a fresh engine measures drafting again ({fresh_drafts} drafts)");
}
