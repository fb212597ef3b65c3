//! The embedded demo model, graded through the Rust engine on the committed held-out problems
//! (models/demo/heldout.jsonl, written by scripts/train_demo.py): greedy accuracy, well-formed
//! outputs, direct answers with thinking off, MTP draft agreement, and the cost of cutting the
//! thinking short.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

use deltascope::chat::{ChatTemplate, RenderOptions, TextTokenizer};
use deltascope::engine::sampler::argmax;
use deltascope::engine::{GenerateRequest, Generator, ModelSequence, Outcome};
use deltascope::generation::{DiagnosticKind, FinishReason, GenerationParams};
use deltascope::model::{ForwardOptions, LoadOptions, LogitsRows, Model, demo_source};
use serde_json::{Value, json};

struct Demo {
    model: Model,
    tok: TextTokenizer,
    template: ChatTemplate,
}

fn demo() -> Demo {
    let source = demo_source();
    let model = Model::load(&source, &LoadOptions::default()).unwrap();
    let tok = TextTokenizer::load(&source, Some(model.config.vocab_size), &model.config.eos_token_ids).unwrap();
    let template = ChatTemplate::load(&source, true).unwrap();
    Demo { model, tok, template }
}

struct Problem {
    task: String,
    /// Earlier turns (user, assistant answer) when this is a second question of a conversation.
    history: Vec<Value>,
    question: String,
    expected: String,
}

fn heldout() -> Vec<Problem> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/models/demo/heldout.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            Problem {
                task: v["task"].as_str().unwrap().into(),
                history: v["history"].as_array().cloned().unwrap_or_default(),
                question: v["question"].as_str().unwrap().into(),
                expected: v["expected"].as_str().unwrap().into(),
            }
        })
        .collect()
}

impl Demo {
    /// The prompt of `q` asked after the earlier turns `history` (the template drops their
    /// thinking, as it does in a conversation).
    fn prompt_after(&self, history: &[Value], q: &str, think: bool) -> Vec<u32> {
        let opts = RenderOptions { add_generation_prompt: true, enable_thinking: Some(think), ..Default::default() };
        let mut messages = history.to_vec();
        messages.push(json!({"role": "user", "content": q}));
        self.tok.encode(&self.template.render(&Value::Array(messages), &opts).unwrap()).unwrap()
    }

    fn problem_prompt(&self, p: &Problem, think: bool) -> Vec<u32> {
        self.prompt_after(&p.history, &p.question, think)
    }

    fn generate(&self, ids: Vec<u32>) -> Outcome {
        let g = Generator { tokenizer: &self.tok, model_name: "demo".into() };
        let req =
            GenerateRequest { prompt_ids: ids, params: GenerationParams { max_tokens: 400, ..Default::default() } };
        g.generate(&mut ModelSequence::new(&self.model), &req, &AtomicBool::new(false), &mut |_| {}).unwrap()
    }
}

fn summary(by_task: &BTreeMap<String, (usize, usize)>) -> String {
    by_task.iter().map(|(k, (ok, n))| format!("{k} {ok}/{n}")).collect::<Vec<_>>().join(", ")
}

#[test]
fn answers_held_out_problems_with_thinking_and_drafts_well() {
    let d = demo();
    let s = &d.tok.specials;
    let (think_end, im_end) = (s.think_end.unwrap(), s.im_end.unwrap());
    let probs = heldout();
    assert_eq!(probs.len(), 240);
    let second_turns = probs.iter().filter(|p| !p.history.is_empty()).count();
    assert!(second_turns >= 70, "the held-out set asks {second_turns} second questions");
    let mut by_task: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let (mut correct, mut agree, mut drafted) = (0, 0, 0);
    // The loop detector's false positives: every held-out run is a healthy one (each ends with
    // `<|im_end|>` after a closed thinking, checked below), so any alarm is a false one.
    let mut false_alarms = vec![];
    let mut second = (0, 0);
    for p in &probs {
        let prompt = d.problem_prompt(p, true);
        let out = d.generate(prompt.clone());
        // Well-formed: thinking, `</think>`, answer, `<|im_end|>`.
        assert_eq!(out.finish_reason, FinishReason::Stop, "{}: {:?}", p.question, out.answer);
        assert_eq!(out.tokens.last(), Some(&im_end));
        assert_eq!(out.tokens.iter().filter(|&&t| t == think_end).count(), 1, "{}", p.question);
        assert!(!out.thinking.trim().is_empty() && !out.answer.trim().is_empty(), "{}: {:?}", p.question, out);
        if out.diagnostics.iter().any(|(k, _)| *k == DiagnosticKind::DegenerateLoop) {
            false_alarms.push(p.question.clone());
        }
        let ok = out.answer.contains(&p.expected);
        correct += ok as usize;
        if !p.history.is_empty() {
            second.0 += ok as usize;
            second.1 += 1;
        }
        let e = by_task.entry(p.task.clone()).or_default();
        e.0 += ok as usize;
        e.1 += 1;

        // MTP, greedy, one step: the draft at position q (from h_q and x_{q+1}) against the
        // actual token x_{q+2}, over every generated token that has a draft.
        let seq: Vec<u32> = prompt.iter().chain(&out.tokens).copied().collect();
        let mut state = d.model.new_state();
        let h = d
            .model
            .forward(&seq, &mut state, ForwardOptions { logits: LogitsRows::Last, ..Default::default() })
            .unwrap()
            .hidden;
        let mut mtp = d.model.new_mtp_state().expect("the demo model has an MTP head");
        let rows = h.gather_rows(&(0..seq.len() - 1).collect::<Vec<_>>());
        let drafts = d.model.mtp_forward(&seq[1..], &rows, &mut mtp, LogitsRows::All).unwrap().logits;
        for q in prompt.len() - 2..seq.len() - 2 {
            drafted += 1;
            agree += (argmax(drafts.row(q)) == seq[q + 2]) as usize;
        }
    }
    let acc = correct as f64 / probs.len() as f64;
    let agreement = agree as f64 / drafted as f64;
    eprintln!(
        "demo, thinking on: accuracy {acc:.3} ({}; second turns {}/{}); MTP draft agreement {agreement:.3} over {drafted} drafts",
        summary(&by_task),
        second.0,
        second.1
    );
    eprintln!("loop detector on the held-out runs: {} false alarms of {}", false_alarms.len(), probs.len());
    assert!(false_alarms.is_empty(), "loop alarms on healthy runs: {false_alarms:?}");
    assert!(acc >= 0.97, "held-out accuracy {acc} < 0.97 ({})", summary(&by_task));
    for (task, (ok, n)) in &by_task {
        assert!(*ok as f64 >= 0.9 * *n as f64, "{task}: {ok}/{n} < 90 % ({})", summary(&by_task));
    }
    assert!(second.0 as f64 >= 0.9 * second.1 as f64, "second turns: {}/{} < 90 %", second.0, second.1);
    assert!(agreement >= 0.7, "MTP draft agreement {agreement} < 0.7");
}

/// With thinking off (the template's empty think block) the model answers directly. It is then
/// often wrong on the multi-step tasks, as a real model would be; the test checks that it stops,
/// does not think, and that a stray `</think>` in the answer stays rare (this model writes one in
/// 1 of the 240 held-out problems: a 5-number sort that loops).
#[test]
fn answers_directly_with_thinking_disabled() {
    let d = demo();
    let think_end = d.tok.specials.think_end.unwrap();
    let probs = heldout();
    let mut by_task: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut stray = vec![];
    for p in &probs {
        let out = d.generate(d.problem_prompt(p, false));
        assert_eq!(out.finish_reason, FinishReason::Stop, "{}", p.question);
        assert_eq!(
            out.usage.thinking_tokens, 0,
            "{}: thought although thinking is off: {:?}",
            p.question, out.thinking
        );
        assert!(!out.answer.trim().is_empty(), "{}: an empty answer", p.question);
        if out.tokens.contains(&think_end) {
            stray.push(format!("{} → {:?}", p.question, out.answer));
        }
        let e = by_task.entry(p.task.clone()).or_default();
        e.0 += out.answer.contains(&p.expected) as usize;
        e.1 += 1;
    }
    eprintln!("demo, thinking off: {}; a stray </think> in {} answers: {stray:?}", summary(&by_task), stray.len());
    assert!(stray.len() <= 2, "a stray </think> in {} of {} answers: {stray:#?}", stray.len(), probs.len());
}

/// Greedy generation that forces `</think>` once `budget` thinking tokens are spent (the simple
/// form of budget forcing; the engine's full control is `--thinking-budget`).
fn with_budget(d: &Demo, prompt: Vec<u32>, budget: usize) -> String {
    let s = &d.tok.specials;
    let (think_end, im_end) = (s.think_end.unwrap(), s.im_end.unwrap());
    let newline = d.tok.encode("\n").unwrap();
    let blank = d.tok.encode("\n\n").unwrap();
    let mut state = d.model.new_state();
    let mut logits = d.model.forward(&prompt, &mut state, ForwardOptions::default()).unwrap().logits.data;
    let mut out = vec![];
    let mut thinking = true;
    let mut spent = 0;
    while out.len() < 400 {
        let mut next = vec![argmax(&logits)];
        if thinking && next[0] != think_end && spent >= budget {
            next = newline.iter().chain([&think_end]).chain(&blank).copied().collect();
        }
        if next.contains(&think_end) {
            thinking = false;
        } else if thinking {
            spent += 1;
        }
        if next[0] == im_end {
            break;
        }
        out.extend(&next);
        logits = d.model.forward(&next, &mut state, ForwardOptions::default()).unwrap().logits.data;
    }
    let text = d.tok.decode(&out);
    text.rsplit("</think>").next().unwrap_or("").to_string()
}

#[test]
fn cutting_thinking_short_costs_accuracy() {
    let d = demo();
    // The multi-step tasks: several lines of thinking each.
    let probs: Vec<Problem> = heldout()
        .into_iter()
        .filter(|p| ["add", "mul", "prime", "sort", "count"].contains(&p.task.as_str()))
        .take(50)
        .collect();
    let mut table = vec![];
    for budget in [0usize, 8, 16, 32, 64, 10_000] {
        let ok =
            probs.iter().filter(|p| with_budget(&d, d.problem_prompt(p, true), budget).contains(&p.expected)).count();
        table.push((budget, ok as f64 / probs.len() as f64));
    }
    eprintln!("thinking budget → accuracy on {} multi-step problems: {table:?}", probs.len());
    let full = table.last().unwrap().1;
    let (_, at8) = table[1];
    assert!(full >= 0.9, "full-thinking accuracy {full}");
    assert!(at8 <= full - 0.3, "cutting thinking to 8 tokens should cost accuracy: {table:?}");
}

/// The problems the previous demo model got wrong: a second question in the same conversation
/// (it answered about the first one), carries in addition, and sorting 4–5 numbers.
#[test]
fn answers_a_second_question_and_carries() {
    let d = demo();
    let answer = |history: &[Value], q: &str| {
        let out = d.generate(d.prompt_after(history, q, true));
        assert_eq!(out.finish_reason, FinishReason::Stop, "{q}: {:?}", out.answer);
        out.answer
    };
    let first = answer(&[], "Is 91 prime?");
    assert!(first.contains("91 = 7 × 13"), "{first}");
    let history =
        [json!({"role": "user", "content": "Is 91 prime?"}), json!({"role": "assistant", "content": first.trim()})];
    let second = answer(&history, "What is 482 + 739?");
    assert!(second.contains("482 + 739 = 1221."), "the second question is answered: {second}");
    for (q, want) in [
        ("What is 627 + 594?", "= 1221."),
        ("What is 698 + 999?", "= 1697."),
        ("Sort 42, 7, 93, 18.", "7, 18, 42, 93"),
        ("Sort 55, 3, 87, 21, 40.", "3, 21, 40, 55, 87"),
    ] {
        let a = answer(&[], q);
        assert!(a.contains(want), "{q} → {a:?}, expected {want:?}");
    }
}
