//! Generation control: sampling, budgets, finish reasons, diagnostics, the loop alarm,
//! cancellation and step mode — on scripted logits (exact expectations) and on the demo model.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use deltascope_engine::{DecodeSequence, GenerateRequest, Generator, ModelSequence, Outcome};
use deltascope_model::Result;
use deltascope_model::{LoadOptions, Model, ModelSource, demo_source, read_config};
use deltascope_protocol::Memory;
use deltascope_protocol::{ChatTemplate, RenderOptions, TextTokenizer};
use deltascope_protocol::{
    Control, Diagnostic, DiagnosticKind, DoneEvent, EngineEvent, FinishReason, GenerationParams, LoopParams, MtpMode,
    OnLoop, Phase, QWEN_BUDGET_BRIDGE, SamplingParams, StepControl, Thinking,
};
use serde_json::json;

/// Logits for the next position, given every token so far.
type Script = Box<dyn FnMut(&[u32]) -> Vec<f32> + Send>;

/// Logits computed from the history by a script (the tokenizer is the fixtures').
struct Scripted {
    history: Vec<u32>,
    prompt_len: usize,
    script: Script,
}

const VOCAB: usize = 512;

impl DecodeSequence for Scripted {
    fn feed(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        if self.history.is_empty() {
            self.prompt_len = ids.len();
        }
        self.history.extend_from_slice(ids);
        let generated = self.history[self.prompt_len..].to_vec();
        Ok((self.script)(&generated))
    }
    fn position(&self) -> usize {
        self.history.len()
    }
    fn context_len(&self) -> usize {
        4096
    }
    fn memory(&self) -> Memory {
        Memory::default()
    }
}

fn onehot(id: u32) -> Vec<f32> {
    let mut l = vec![0.0; VOCAB];
    l[id as usize] = 10.0;
    l
}

fn tokenizer() -> TextTokenizer {
    let s = ModelSource::Dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3_5_vl"));
    let config = read_config(&s).unwrap();
    TextTokenizer::load(&s, Some(config.vocab_size), &config.eos_token_ids).unwrap()
}

/// Runs a script; returns the outcome and every event.
fn run(
    tok: &TextTokenizer,
    prompt: Vec<u32>,
    params: GenerationParams,
    control: &dyn Control,
    script: impl FnMut(&[u32]) -> Vec<f32> + Send + 'static,
) -> (Outcome, Vec<EngineEvent>) {
    let mut src = Scripted { history: vec![], prompt_len: 0, script: Box::new(script) };
    let g = Generator::new(tok, "scripted");
    let mut events = vec![];
    let out = g
        .generate(&mut src, &GenerateRequest { prompt_ids: prompt, params }, control, &mut |e| events.push(e))
        .unwrap();
    (out, events)
}

fn no_cancel() -> AtomicBool {
    AtomicBool::new(false)
}

/// A prompt ending inside `<think>`.
fn thinking_prompt(tok: &TextTokenizer) -> Vec<u32> {
    vec![tok.specials.im_start.unwrap(), 100, 101, tok.specials.think_start.unwrap()]
}

fn diagnostics(events: &[EngineEvent]) -> Vec<(DiagnosticKind, usize, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Diagnostic(d) => Some((d.kind, d.at_token, d.message.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn stop_token_finishes_with_stop() {
    let tok = tokenizer();
    let im_end = tok.specials.im_end.unwrap();
    let (out, events) = run(&tok, vec![5, 6], GenerationParams::default(), &no_cancel(), move |g| {
        onehot(if g.len() < 3 { 70 } else { im_end })
    });
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.tokens, vec![70, 70, 70, im_end]);
    assert!(diagnostics(&events).is_empty());
    // A requested stop id ends generation the same way.
    let params = GenerationParams { stop_token_ids: vec![71], ..Default::default() };
    let (out, _) = run(&tok, vec![5], params, &no_cancel(), |g| onehot(if g.len() < 2 { 70 } else { 71 }));
    assert_eq!((out.finish_reason, out.tokens.len()), (FinishReason::Stop, 3));
}

#[test]
fn ignore_eos_generates_past_the_end_but_stop_ids_still_stop() {
    let tok = tokenizer();
    let im_end = tok.specials.im_end.unwrap();
    let params = GenerationParams { ignore_eos: true, max_tokens: 8, ..Default::default() };
    let (out, _) = run(&tok, vec![5, 6], params.clone(), &no_cancel(), move |g| {
        onehot(if g.len() % 3 == 2 { im_end } else { 70 })
    });
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert_eq!(out.tokens, vec![70, 70, im_end, 70, 70, im_end, 70, 70]);
    let params = GenerationParams { stop_token_ids: vec![71], ..params };
    let (out, _) = run(&tok, vec![5], params, &no_cancel(), move |g| {
        onehot(match g.len() {
            1 => im_end,
            n if n < 4 => 70,
            _ => 71,
        })
    });
    assert_eq!((out.finish_reason, out.tokens.len()), (FinishReason::Stop, 5));
}

#[test]
fn length_in_the_answer_is_answer_truncated() {
    let tok = tokenizer();
    let (out, events) =
        run(&tok, vec![5], GenerationParams { max_tokens: 6, ..Default::default() }, &no_cancel(), |_| onehot(70));
    assert_eq!((out.finish_reason, out.tokens.len()), (FinishReason::Length, 6));
    let d = diagnostics(&events);
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].0, d[0].1), (DiagnosticKind::AnswerTruncated, 5));
    // The answer budget cuts too.
    let params = GenerationParams { answer_budget: Some(3), ..Default::default() };
    let (out, events) = run(&tok, vec![5], params, &no_cancel(), |_| onehot(70));
    assert_eq!((out.finish_reason, out.usage.answer_tokens), (FinishReason::Length, 3));
    assert!(diagnostics(&events)[0].2.contains("answer budget"));
}

#[test]
fn max_tokens_exhausted_inside_thinking() {
    let tok = tokenizer();
    let (out, events) = run(
        &tok,
        thinking_prompt(&tok),
        GenerationParams { max_tokens: 20, ..Default::default() },
        &no_cancel(),
        |_| onehot(70),
    );
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert_eq!((out.usage.thinking_tokens, out.usage.answer_tokens), (20, 0));
    assert!(out.answer.is_empty() && !out.thinking.is_empty());
    let d = diagnostics(&events);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].0, DiagnosticKind::ThinkingExhaustedMaxTokens);
    assert!(
        d[0].2.contains("answer is empty") && d[0].2.contains("raise max_tokens") && d[0].2.contains("thinking budget"),
        "{}",
        d[0].2
    );
}

#[test]
fn thinking_budget_forces_the_exact_close_sequence() {
    let tok = tokenizer();
    let (think_end, im_end) = (tok.specials.think_end.unwrap(), tok.specials.im_end.unwrap());
    let params = GenerationParams { thinking: Thinking::from_budget(Some(5)), ..Default::default() };
    // The script thinks forever; once `</think>` is in, it answers 3 tokens and stops.
    let (out, events) =
        run(&tok, thinking_prompt(&tok), params, &no_cancel(), move |g| match g.iter().position(|&t| t == think_end) {
            None => onehot(70),
            Some(p) if g.len() - p - 1 < 3 => onehot(80),
            Some(_) => onehot(im_end),
        });
    // The bridge and `</think>`, as llama.cpp and vLLM force them; the model writes what follows.
    let mut forced = tok.encode(QWEN_BUDGET_BRIDGE).unwrap();
    forced.push(think_end);
    assert_eq!(&out.tokens[..5], &[70; 5]);
    assert_eq!(&out.tokens[5..5 + forced.len()], &forced[..], "the forced sequence");
    assert!(out.forced[5..5 + forced.len()].iter().all(|&f| f) && !out.forced[..5].iter().any(|&f| f));
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert!(out.thinking.ends_with(QWEN_BUDGET_BRIDGE), "{:?}", out.thinking);
    assert_eq!(out.usage.forced_tokens, forced.len());
    // The forced tokens carry `forced: true` in the events, and one diagnostic says why.
    let forced_events = events.iter().filter(|e| matches!(e, EngineEvent::Token(t) if t.forced)).count();
    assert_eq!(forced_events, forced.len());
    let d = diagnostics(&events);
    assert_eq!((d[0].0, d[0].1), (DiagnosticKind::ThinkingBudgetForced, 5));

    // An empty bridge forces just `</think>`.
    let params = GenerationParams {
        thinking: Thinking::from_budget(Some(2)),
        budget_bridge: String::new(),
        ..Default::default()
    };
    let (out, _) = run(&tok, thinking_prompt(&tok), params, &no_cancel(), move |g| {
        onehot(if g.contains(&think_end) { im_end } else { 70 })
    });
    assert_eq!(out.tokens, [70, 70, think_end, im_end]);
}

#[test]
fn forced_close_never_overshoots_max_tokens() {
    let tok = tokenizer();
    let params = GenerationParams { thinking: Thinking::from_budget(Some(5)), max_tokens: 9, ..Default::default() };
    let (out, _) = run(&tok, thinking_prompt(&tok), params, &no_cancel(), |_| onehot(70));
    assert_eq!(out.tokens.len(), 9);
    assert_eq!(out.finish_reason, FinishReason::Length);
}

#[test]
fn thinking_budget_counts_across_think_blocks() {
    let tok = tokenizer();
    let (think_start, think_end, im_end) =
        (tok.specials.think_start.unwrap(), tok.specials.think_end.unwrap(), tok.specials.im_end.unwrap());
    // Thinks 3 tokens, closes, answers 1, re-opens <think>, thinks on and on.
    let script = move |g: &[u32]| {
        let n = g.len();
        let ends = g.iter().filter(|&&t| t == think_end).count();
        onehot(match (n, ends) {
            (0..=2, _) => 70,
            (3, _) => think_end,
            (4, _) => 80,
            (5, _) => think_start,
            (_, 1) => 71,
            _ => im_end,
        })
    };
    let params = GenerationParams {
        thinking: Thinking::from_budget(Some(6)),
        budget_bridge: String::new(),
        ..Default::default()
    };
    let (out, events) = run(&tok, thinking_prompt(&tok), params, &no_cancel(), script);
    // Budget 6 counts thinking content, not the <think> / </think> markers: 3 tokens in the
    // first block, 3 more after re-entry → forced close.
    let model_thinking: Vec<u32> = out.tokens.iter().zip(&out.forced).filter(|(_, f)| !**f).map(|(t, _)| *t).collect();
    assert_eq!(&model_thinking[..9], &[70, 70, 70, think_end, 80, think_start, 71, 71, 71]);
    let first_forced = out.forced.iter().position(|&f| f).unwrap();
    assert_eq!(out.tokens[first_forced], think_end);
    assert_eq!(diagnostics(&events).iter().filter(|d| d.0 == DiagnosticKind::ThinkingBudgetForced).count(), 1);
    assert_eq!(out.finish_reason, FinishReason::Stop);
}

#[test]
fn stop_strings_end_generation_and_are_cut() {
    let tok = tokenizer();
    let ids = tok.encode("The answer is 42. DONE and more").unwrap();
    let n = ids.len();
    let script = move |g: &[u32]| onehot(ids[g.len().min(n - 1)]);
    let params = GenerationParams { stop: vec!["DONE".into()], ..Default::default() };
    let (out, _) = run(&tok, vec![5], params, &no_cancel(), script);
    assert_eq!(out.finish_reason, FinishReason::StopString);
    assert_eq!(out.answer, "The answer is 42. ");
}

#[test]
fn loop_alarm_and_auto_stop() {
    let tok = tokenizer();
    let cycle = tok.encode("2 + 2 = 2.").unwrap();
    let c = cycle.clone();
    let params = GenerationParams { max_tokens: 300, ..Default::default() };
    let (out, events) = run(&tok, vec![5], params, &no_cancel(), move |g| onehot(c[g.len() % c.len()]));
    let loops: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Diagnostic(Diagnostic { kind: DiagnosticKind::DegenerateLoop, period, start, .. }) => {
                Some((*period, *start))
            }
            _ => None,
        })
        .collect();
    assert_eq!(loops.len(), 1, "reported once");
    assert_eq!(loops[0], (Some(cycle.len()), Some(0)));
    assert_eq!(out.finish_reason, FinishReason::Length, "without auto-stop generation goes on");
    let c = cycle.clone();
    let params = GenerationParams {
        max_tokens: 300,
        loop_detection: LoopParams { on_loop: OnLoop::Stop, ..Default::default() },
        ..Default::default()
    };
    let (out, _) = run(&tok, vec![5], params, &no_cancel(), move |g| onehot(c[g.len() % c.len()]));
    assert_eq!(out.finish_reason, FinishReason::Loop);
    assert!(out.tokens.len() < 80, "stopped early: {}", out.tokens.len());
}

/// A model that loops in thinking until the end of thinking is forced, then answers (or, with
/// `answer_loops`, loops in the answer too).
fn looping_thinker(tok: &TextTokenizer, answer_loops: bool) -> impl FnMut(&[u32]) -> Vec<f32> + Send + 'static {
    let cycle = tok.encode("2 + 2 = 2.").unwrap();
    let answer = tok.encode("The answer is 4.").unwrap();
    let (think_end, im_end) = (tok.specials.think_end.unwrap(), tok.specials.im_end.unwrap());
    move |g: &[u32]| match g.iter().position(|&t| t == think_end) {
        None => onehot(cycle[g.len() % cycle.len()]),
        Some(at) if answer_loops => onehot(cycle[(g.len() - at) % cycle.len()]),
        Some(at) => onehot(*answer.get(g.len() - at - 1).unwrap_or(&im_end)),
    }
}

/// `--on-loop answer`: a loop in thinking forces the end of thinking (bridge, `</think>`) and the
/// model answers; `loop_rescued` says where the loop began and how long it held. Without the
/// rescue the answer is empty (thinking ate max_tokens).
#[test]
fn a_loop_in_thinking_is_rescued_and_the_model_answers() {
    let tok = tokenizer();
    let cycle_len = tok.encode("2 + 2 = 2.").unwrap().len();
    let off = GenerationParams { max_tokens: 300, ..Default::default() };
    let (out, _) = run(&tok, thinking_prompt(&tok), off.clone(), &no_cancel(), looping_thinker(&tok, false));
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert!(out.answer.is_empty(), "without the rescue the answer is empty: {:?}", out.answer);

    let rescue = GenerationParams {
        loop_detection: LoopParams { on_loop: OnLoop::Answer, ..Default::default() },
        ..off.clone()
    };
    let (out, events) = run(&tok, thinking_prompt(&tok), rescue.clone(), &no_cancel(), looping_thinker(&tok, false));
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.answer.trim(), "The answer is 4.");
    let d = diagnostics(&events);
    let kinds: Vec<DiagnosticKind> = d.iter().map(|x| x.0).collect();
    assert_eq!(kinds, [DiagnosticKind::DegenerateLoop, DiagnosticKind::LoopRescued], "{d:?}");
    let (alarm_at, rescued_at) = (d[0].1, d[1].1);
    assert!(rescued_at == alarm_at + 1, "forced right after the alarm: {d:?}");
    let message = &d[1].2;
    let bridge = tok.encode(QWEN_BUDGET_BRIDGE).unwrap().len() + 1;
    assert!(message.contains(&format!("a {cycle_len}-token pattern repeating from token 0")), "{message}");
    assert!(message.contains(&format!("held {rescued_at} tokens of thinking")), "{message}");
    assert!(message.contains(&format!("({bridge} tokens: bridge text, </think>)")), "{message}");
    let rescued = events.iter().find_map(|e| match e {
        EngineEvent::Diagnostic(x) if x.kind == DiagnosticKind::LoopRescued => Some(x.clone()),
        _ => None,
    });
    assert_eq!(rescued.map(|x| (x.period, x.start)), Some((Some(cycle_len), Some(0))));
    // The forced tokens are counted as forced, the answer as answer.
    assert_eq!(out.usage.forced_tokens, bridge);
    assert_eq!(out.forced.iter().filter(|f| **f).count(), bridge);

    // A loop in the answer under `answer` stops, as `stop` does.
    let (out, events) = run(&tok, thinking_prompt(&tok), rescue, &no_cancel(), looping_thinker(&tok, true));
    assert_eq!(out.finish_reason, FinishReason::Loop);
    let kinds: Vec<DiagnosticKind> = diagnostics(&events).iter().map(|x| x.0).collect();
    assert_eq!(
        kinds,
        [DiagnosticKind::DegenerateLoop, DiagnosticKind::LoopRescued, DiagnosticKind::DegenerateLoop],
        "the answer's loop is detected afresh"
    );
    assert!(!out.answer.is_empty());
}

/// The user's "end thinking now" (the TUI's key) forces the end of thinking on the next token,
/// with the loop alarm's place when one fired.
#[test]
fn ending_thinking_by_hand_forces_the_bridge() {
    struct EndAt(AtomicUsize, usize, StepControl);
    impl Control for EndAt {
        fn proceed(&self) -> bool {
            if self.0.fetch_add(1, Ordering::SeqCst) == self.1 {
                self.2.end_thinking();
            }
            true
        }
        fn end_thinking_requested(&self) -> bool {
            self.2.end_thinking_requested()
        }
    }
    let tok = tokenizer();
    let params = GenerationParams { max_tokens: 300, ..Default::default() };
    // Before any loop: after 10 thinking tokens (proceed is asked before the prefill too).
    let control = EndAt(AtomicUsize::new(0), 11, StepControl::default());
    let (out, events) = run(&tok, thinking_prompt(&tok), params.clone(), &control, looping_thinker(&tok, false));
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert_eq!(out.answer.trim(), "The answer is 4.");
    let d = diagnostics(&events);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!((d[0].0, d[0].1), (DiagnosticKind::LoopRescued, 10));
    assert!(d[0].2.contains("on the user's request after 10 thinking tokens"), "{}", d[0].2);
    // After the alarm (the alarm only): the rescue names the loop.
    let control = EndAt(AtomicUsize::new(0), 120, StepControl::default());
    let (out, events) = run(&tok, thinking_prompt(&tok), params, &control, looping_thinker(&tok, false));
    assert_eq!(out.answer.trim(), "The answer is 4.");
    let d = diagnostics(&events);
    assert_eq!(
        d.iter().map(|x| x.0).collect::<Vec<_>>(),
        [DiagnosticKind::DegenerateLoop, DiagnosticKind::LoopRescued]
    );
    assert!(d[1].2.contains("loop rescued (on the user's request)"), "{}", d[1].2);
}

#[test]
fn cancellation_keeps_what_was_produced() {
    struct CancelAfter(AtomicUsize, usize);
    impl Control for CancelAfter {
        fn proceed(&self) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst) < self.1
        }
    }
    let tok = tokenizer();
    // proceed() is asked before the prefill and before each token: 1 + 4 calls allowed.
    let (out, events) =
        run(&tok, thinking_prompt(&tok), GenerationParams::default(), &CancelAfter(AtomicUsize::new(0), 5), |_| {
            onehot(70)
        });
    assert_eq!(out.finish_reason, FinishReason::Cancelled);
    assert_eq!(out.tokens, vec![70; 4]);
    assert_eq!(out.usage.thinking_tokens, 4);
    match events.last().unwrap() {
        EngineEvent::Done(DoneEvent { finish_reason, thinking, .. }) => {
            assert_eq!(*finish_reason, FinishReason::Cancelled);
            assert_eq!(thinking, &out.thinking);
            assert!(!thinking.is_empty());
        }
        e => panic!("last event {e:?}"),
    }
}

#[test]
fn step_mode_advances_one_token_per_command() {
    let tok = Arc::new(tokenizer());
    let control = Arc::new(StepControl::default());
    control.set_paused(true);
    let (tx, rx) = std::sync::mpsc::channel();
    let (t2, c2) = (tok.clone(), control.clone());
    let h = std::thread::spawn(move || {
        let mut src = Scripted { history: vec![], prompt_len: 0, script: Box::new(|_| onehot(70)) };
        let g = Generator::new(&t2, "scripted");
        g.generate(
            &mut src,
            &GenerateRequest { prompt_ids: vec![5], params: GenerationParams::default() },
            c2.as_ref(),
            &mut |e| {
                let _ = tx.send(e);
            },
        )
        .unwrap()
    });
    let tokens_seen = |rx: &std::sync::mpsc::Receiver<EngineEvent>| {
        rx.try_iter().filter(|e| matches!(e, EngineEvent::Token(_))).count()
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(tokens_seen(&rx), 0, "paused before the first token");
    control.step(1); // the prefill
    control.step(1);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(tokens_seen(&rx), 1);
    control.step(2);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(tokens_seen(&rx), 2);
    control.cancel();
    let out = h.join().unwrap();
    assert_eq!((out.finish_reason, out.tokens.len()), (FinishReason::Cancelled, 3));
}

#[test]
fn top_logprobs_come_with_each_token() {
    let tok = tokenizer();
    let mut l = vec![0.0f32; VOCAB];
    l[70] = 3.0;
    l[71] = 2.0;
    l[72] = 1.0;
    let im_end = tok.specials.im_end.unwrap();
    let params = GenerationParams { top_logprobs: 3, ..Default::default() };
    let (_, events) =
        run(&tok, vec![5], params, &no_cancel(), move |g| if g.len() < 2 { l.clone() } else { onehot(im_end) });
    let first = events.iter().find_map(|e| match e {
        EngineEvent::Token(t) => Some((t.top_logprobs.clone(), t.logprob, t.id)),
        _ => None,
    });
    let (alts, lp, id) = first.unwrap();
    let lp = lp.unwrap();
    assert_eq!(id, Some(70));
    assert_eq!(alts.iter().map(|a| a.id).collect::<Vec<_>>(), vec![Some(70), Some(71), Some(72)]);
    assert!((alts[0].logprob - lp).abs() < 1e-6 && alts[0].logprob > alts[1].logprob);
    assert_eq!(alts[0].text, tok.decode(&[70]));
}

#[test]
fn penalties_change_the_choice() {
    let tok = tokenizer();
    let im_end = tok.specials.im_end.unwrap();
    let base = move |g: &[u32]| {
        if g.len() >= 4 {
            return onehot(im_end);
        }
        let mut l = vec![0.0f32; VOCAB];
        l[70] = 2.0;
        l[71] = 1.5;
        l
    };
    let greedy = |s: SamplingParams, prompt: Vec<u32>| {
        run(&tok, prompt, GenerationParams { sampling: s, ..Default::default() }, &no_cancel(), base).0.tokens
    };
    assert_eq!(greedy(SamplingParams::default(), vec![5]), vec![70, 70, 70, 70, im_end]);
    // Presence: 70 drops to 1.0 once seen → 71, which then drops to 0.5 → back to 70.
    assert_eq!(
        greedy(SamplingParams { presence_penalty: 1.0, ..Default::default() }, vec![5]),
        vec![70, 71, 70, 70, im_end]
    );
    // Frequency grows with the count: 2.0 − 0.3n vs 1.5 − 0.3m.
    assert_eq!(
        greedy(SamplingParams { frequency_penalty: 0.3, ..Default::default() }, vec![5]),
        vec![70, 70, 71, 70, im_end]
    );
    // Repetition covers the prompt: 70 in the prompt is divided by 2 → 1.0 < 1.5.
    assert_eq!(greedy(SamplingParams { repetition_penalty: 2.0, ..Default::default() }, vec![5, 70])[0], 71);
}

// --- On the demo model -------------------------------------------------------------------

fn demo() -> (Model, TextTokenizer, ChatTemplate) {
    let s = demo_source();
    let m = Model::load(&s, &LoadOptions::default()).unwrap();
    let t = TextTokenizer::load(&s, Some(m.config().vocab_size), &m.config().eos_token_ids).unwrap();
    let c = ChatTemplate::load(&s, true).unwrap();
    (m, t, c)
}

fn demo_prompt(tok: &TextTokenizer, tpl: &ChatTemplate, q: &str, think: bool) -> Vec<u32> {
    let opts = RenderOptions { add_generation_prompt: true, enable_thinking: Some(think), ..Default::default() };
    tok.encode(&tpl.render(&json!([{"role": "user", "content": q}]), &opts).unwrap()).unwrap()
}

fn demo_run(m: &Model, tok: &TextTokenizer, prompt: Vec<u32>, params: GenerationParams) -> (Outcome, Vec<EngineEvent>) {
    let g = Generator::new(tok, "demo");
    let mut ev = vec![];
    let out = g
        .generate(&mut ModelSequence::new(m), &GenerateRequest { prompt_ids: prompt, params }, &no_cancel(), &mut |e| {
            ev.push(e)
        })
        .unwrap();
    (out, ev)
}

#[test]
fn demo_same_seed_same_tokens() {
    let (m, tok, tpl) = demo();
    let p = demo_prompt(&tok, &tpl, "Sort 31, 7, 88, 12, 5.", true);
    let params = |seed| GenerationParams {
        max_tokens: 200,
        sampling: SamplingParams { temperature: 1.5, top_k: 40, seed, ..Default::default() },
        ..Default::default()
    };
    let a = demo_run(&m, &tok, p.clone(), params(11)).0.tokens;
    let b = demo_run(&m, &tok, p.clone(), params(11)).0.tokens;
    let c = demo_run(&m, &tok, p, params(12)).0.tokens;
    assert_eq!(a, b);
    assert_ne!(a, c, "another seed should sample differently at temperature 1.5");
}

#[test]
fn demo_thinking_eats_max_tokens() {
    let (m, tok, tpl) = demo();
    let p = demo_prompt(&tok, &tpl, "Sort 93, 17, 56, 41, 8, 72.", true);
    let (out, ev) = demo_run(&m, &tok, p, GenerationParams { max_tokens: 12, ..Default::default() });
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert!(out.answer.is_empty());
    assert_eq!(out.usage.thinking_tokens, 12);
    assert!(diagnostics(&ev).iter().any(|d| d.0 == DiagnosticKind::ThinkingExhaustedMaxTokens));
}

#[test]
fn demo_budget_forcing_still_answers() {
    let (m, tok, tpl) = demo();
    let p = demo_prompt(&tok, &tpl, "What is 482 + 739?", true);
    let (out, ev) = demo_run(
        &m,
        &tok,
        p,
        GenerationParams { thinking: Thinking::from_budget(Some(6)), max_tokens: 200, ..Default::default() },
    );
    assert_eq!(out.finish_reason, FinishReason::Stop);
    assert!(out.forced.iter().any(|&f| f));
    assert!(diagnostics(&ev).iter().any(|d| d.0 == DiagnosticKind::ThinkingBudgetForced));
    assert!(!out.answer.trim().is_empty(), "an answer follows the forced close: {:?}", out);
    // Exactly the budget's worth of model thinking before the forced block.
    assert_eq!(out.forced.iter().position(|&f| f), Some(6));
    // Phases: the forced `</think>` switches to the answer.
    let phases: Vec<Phase> =
        ev.iter().filter_map(|e| if let EngineEvent::Token(t) = e { Some(t.phase) } else { None }).collect();
    assert_eq!(*phases.last().unwrap(), Phase::Answer);
}

/// The shipped `degenerate-loop` session's settings (repetition penalty 0.4, greedy,
/// max_tokens 400): the demo's thinking falls into a loop that eats max_tokens, so the answer
/// is empty. With `--on-loop answer` the loop is rescued and the model answers — with MTP
/// drafting (the session's depth 2) and without.
#[test]
fn demo_loop_is_rescued_at_the_degenerate_loop_sessions_settings() {
    let (m, tok, tpl) = demo();
    let p = demo_prompt(&tok, &tpl, "What is 482 + 739?", true);
    for mtp in [MtpMode::Off, MtpMode::fixed(2)] {
        let params = |on_loop| GenerationParams {
            max_tokens: 400,
            sampling: SamplingParams { temperature: 0.0, repetition_penalty: 0.4, ..Default::default() },
            loop_detection: LoopParams { on_loop, ..Default::default() },
            mtp,
            ..Default::default()
        };
        let (out, ev) = demo_run(&m, &tok, p.clone(), params(OnLoop::Off));
        let kinds: Vec<DiagnosticKind> = diagnostics(&ev).iter().map(|d| d.0).collect();
        assert_eq!(out.finish_reason, FinishReason::Length, "{mtp:?}");
        assert!(out.answer.trim().is_empty(), "{mtp:?}: without the rescue the loop eats the answer: {:?}", out.answer);
        assert_eq!(kinds, [DiagnosticKind::DegenerateLoop, DiagnosticKind::ThinkingExhaustedMaxTokens], "{mtp:?}");

        let (out, ev) = demo_run(&m, &tok, p.clone(), params(OnLoop::Answer));
        let d = diagnostics(&ev);
        let kinds: Vec<DiagnosticKind> = d.iter().map(|d| d.0).collect();
        // The answer is there; at a penalty that rewards repeats it may itself loop (v5's does:
        // "482 + 939 = 939 + 939 = …", stopped as a loop in the answer) or run to max_tokens, which
        // is not the rescue's to prevent.
        assert!(
            [FinishReason::Stop, FinishReason::Length, FinishReason::Loop].contains(&out.finish_reason),
            "{mtp:?}: {d:?}"
        );
        assert!(!out.answer.trim().is_empty(), "{mtp:?}: the rescued run answers: {out:?}");
        assert_eq!(kinds[..2], [DiagnosticKind::DegenerateLoop, DiagnosticKind::LoopRescued], "{mtp:?}");
        assert!(d[1].2.contains("the engine forced the end of thinking"), "{}", d[1].2);
        // Forced right after the alarm; the forced block is the bridge and `</think>`.
        assert_eq!(d[1].1, d[0].1 + 1, "{mtp:?}: {d:?}");
        let bridge = tok.encode(QWEN_BUDGET_BRIDGE).unwrap().len() + 1;
        assert_eq!(out.usage.forced_tokens, bridge, "{mtp:?}");
        eprintln!(
            "{mtp:?}: {} thinking, rescued at {}, answer {:?}",
            out.usage.thinking_tokens,
            d[1].1,
            out.answer.trim()
        );
    }
}

/// Step mode can hold a request before its prompt is read: the wait counts in TTFT (the user
/// sees it) but not in the prefill rate (the engine did nothing meanwhile).
#[test]
fn a_hold_before_the_prompt_is_not_booked_as_prefill() {
    struct HoldFirst(AtomicBool);
    impl Control for HoldFirst {
        fn proceed(&self) -> bool {
            if !self.0.swap(true, Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            true
        }
    }
    let tok = tokenizer();
    let prompt = thinking_prompt(&tok);
    let n = prompt.len() as f64;
    let params = GenerationParams { max_tokens: 4, ..Default::default() };
    let (out, _) = run(&tok, prompt, params, &HoldFirst(AtomicBool::new(false)), |_| onehot(70));
    assert!(out.timing.ttft_ms.is_some_and(|ms| ms >= 500.0), "{:?}", out.timing);
    // Reading a scripted prompt takes microseconds; booked with the hold it would be 500 ms.
    let prefill_s = n / out.timing.prefill_tok_s;
    assert!(prefill_s < 0.1, "prefill took {prefill_s} s by its rate: {:?}", out.timing);
}

/// A model that answers, re-opens `<think>` and runs into max_tokens there: the answer it gave
/// is in the summary, and the diagnostic says the answer was cut, not that it is empty.
#[test]
fn a_re_opened_think_block_cut_by_max_tokens_is_a_cut_answer() {
    let tok = tokenizer();
    let (think_start, think_end) = (tok.specials.think_start.unwrap(), tok.specials.think_end.unwrap());
    let script = move |g: &[u32]| {
        onehot(match g.len() {
            0..=2 => 70,
            3 => think_end,
            4 | 5 => 80,
            6 => think_start,
            _ => 71,
        })
    };
    let params = GenerationParams { max_tokens: 12, ..Default::default() };
    let (out, events) = run(&tok, thinking_prompt(&tok), params, &no_cancel(), script);
    assert_eq!(out.finish_reason, FinishReason::Length);
    assert_eq!(out.usage.answer_tokens, 2, "{:?}", out.usage);
    assert!(!out.answer.is_empty(), "the answer before the re-opened block: {:?}", out.answer);
    let kinds: Vec<DiagnosticKind> = diagnostics(&events).iter().map(|d| d.0).collect();
    assert_eq!(kinds, [DiagnosticKind::AnswerTruncated], "{events:?}");
    let d = events
        .iter()
        .find_map(|e| match e {
            EngineEvent::Diagnostic(d) => Some(d.clone()),
            _ => None,
        })
        .unwrap();
    assert!(d.message.contains("re-opened <think>") && d.message.contains("2 answer tokens"), "{}", d.message);
    assert_eq!(out.usage.thinking_tokens + out.usage.answer_tokens, 12);
}
