//! The embedded demo model, graded through the Rust engine on the committed held-out problems
//! (models/demo/heldout.jsonl, written by scripts/train_demo.py with their own seed, never drawn
//! in training): greedy accuracy per task with every miss printed, well-formed outputs, direct
//! answers with thinking off, MTP draft agreement, the cost of cutting the thinking short, the
//! README's examples, and the memory task that lives in the Gated-DeltaNet state (its heads'
//! half-lives, and what silencing them breaks).

#[path = "common/fixture_edit.rs"]
mod fixture_edit;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

use deltascope_engine::argmax;
use deltascope_engine::{GenerateRequest, Generator, ModelSequence, Outcome};
use deltascope_model::{ForwardOptions, LayerTrace, LoadOptions, LogitsRows, Model, ModelSource, demo_source};
use deltascope_protocol::{ChatTemplate, RenderOptions, TextTokenizer};
use deltascope_protocol::{DiagnosticKind, EngineEvent, FinishReason, GenerationParams};
use serde_json::{Value, json};

struct Demo {
    model: Model,
    tok: TextTokenizer,
    template: ChatTemplate,
    /// A modified copy's directory, kept while the model is used.
    _dir: Option<tempfile::TempDir>,
}

fn demo() -> Demo {
    let source = demo_source();
    let model = Model::load(&source, &LoadOptions::default()).unwrap();
    let tok = TextTokenizer::load(&source, Some(model.config().vocab_size), &model.config().eos_token_ids).unwrap();
    let template = ChatTemplate::load(&source, true).unwrap();
    Demo { model, tok, template, _dir: None }
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
        self.generate_with_margins(ids).0
    }

    /// A greedy generation and, for each token it chose, the gap to the runner-up (the top two
    /// log-probabilities; their difference is the logits' difference).
    fn generate_with_margins(&self, ids: Vec<u32>) -> (Outcome, Vec<Margin>) {
        let g = Generator::new(&self.tok, "demo");
        let params = GenerationParams { max_tokens: 400, top_logprobs: 2, ..Default::default() };
        let req = GenerateRequest { prompt_ids: ids, params };
        let mut margins = vec![];
        let mut keep = |e: EngineEvent| {
            if let EngineEvent::Token(t) = e
                && let [first, second, ..] = t.top_logprobs.as_slice()
            {
                margins.push(Margin {
                    step: t.index,
                    chosen: first.text.clone(),
                    runner_up: second.text.clone(),
                    gap: first.logprob - second.logprob,
                });
            }
        };
        let out = g.generate(&mut ModelSequence::new(&self.model), &req, &AtomicBool::new(false), &mut keep).unwrap();
        (out, margins)
    }
}

/// How far a greedy choice is ahead of the next-best token.
struct Margin {
    step: usize,
    chosen: String,
    runner_up: String,
    gap: f32,
}

/// The smallest logit gap a greedy choice must keep for a test to assert the text it leads to:
/// larger than any difference between the CPU kernels' roundings. At f32 (these tests' precision)
/// the portable, AVX2 and AVX-512 kernels add in one order (their logits are identical on the
/// README's examples, measured on the AVX2 EPYC with `DELTASCOPE_CPU_KERNEL=portable|avx2`);
/// what other arithmetic moves is f32 rounding, ~1e-4 of a logit — 0.1 is a thousand times that.
/// (At bf16 the emulated device and the CPU engine part by up to 0.28 in a gap on the same
/// examples: a bf16 test needs 1.0.)
const F32_MARGIN: f32 = 0.1;

/// Fails naming the step and the gap where a greedy choice is closer to a tie than `bound`.
fn assert_margins(what: &str, margins: &[Margin], bound: f32) {
    if let Some(m) = margins.iter().filter(|m| m.gap < bound).min_by(|a, b| a.gap.total_cmp(&b.gap)) {
        panic!(
            "{what}: step {} chose {:?} over {:?} by a logit gap of {:.3}, under the {bound} a kernel's rounding may not \
             cross: a test cannot assert this text on every CPU kernel (choose a case with a wider margin)",
            m.step, m.chosen, m.runner_up, m.gap
        );
    }
}

fn summary(by_task: &Tally) -> String {
    by_task.iter().map(|(k, (ok, n))| format!("{k} {ok}/{n}")).collect::<Vec<_>>().join(", ")
}

/// Per task: (right, asked).
type Tally = BTreeMap<String, (usize, usize)>;

fn tally(by_task: &mut Tally, task: &str, ok: bool) {
    let e = by_task.entry(task.to_string()).or_default();
    e.0 += ok as usize;
    e.1 += 1;
}

fn print_miss(p: &Problem, out: &Outcome) {
    let tail: String = {
        let t = out.thinking.trim();
        let start = t.char_indices().rev().nth(299).map_or(0, |(i, _)| i);
        t[start..].to_string()
    };
    eprintln!(
        "miss [{}] {:?}{} → answer {:?}, expected {:?}; thinking ends {:?}",
        p.task,
        p.question,
        if p.history.is_empty() { String::new() } else { format!(" (after {} turns)", p.history.len() / 2) },
        out.answer.trim(),
        p.expected,
        tail
    );
}

#[test]
fn answers_held_out_problems_with_thinking_and_drafts_well() {
    let d = demo();
    let s = &d.tok.specials;
    let (think_end, im_end) = (s.think_end.unwrap(), s.im_end.unwrap());
    let probs = heldout();
    assert!(probs.len() >= 600, "the held-out set has {} problems", probs.len());
    let second_turns = probs.iter().filter(|p| !p.history.is_empty()).count();
    assert!(second_turns >= 200, "the held-out set asks {second_turns} second questions");
    let mut by_task = Tally::new();
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
        if !ok {
            print_miss(p, &out);
        }
        correct += ok as usize;
        if !p.history.is_empty() {
            second.0 += ok as usize;
            second.1 += 1;
        }
        tally(&mut by_task, &p.task, ok);

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
        "demo, thinking on: accuracy {acc:.4} = {correct}/{} ({}; second turns {}/{}); MTP draft agreement {agreement:.3} over {drafted} drafts",
        probs.len(),
        summary(&by_task),
        second.0,
        second.1
    );
    eprintln!("loop detector on the held-out runs: {} false alarms of {}", false_alarms.len(), probs.len());
    assert!(false_alarms.is_empty(), "loop alarms on healthy runs: {false_alarms:?}");
    // The issue's bar: ≥ 99 % overall and ≥ 39 / 40 (97.5 %) a task. v5 scores 626 / 630
    // (99.4 %), every task ≥ 88 / 90; v4 (622 / 630, sorting 85 / 90) missed it, as v3 did by
    // one sort (626 / 630, sorting 87 / 90).
    assert!(acc >= 0.99, "held-out accuracy {acc} < 0.99 ({})", summary(&by_task));
    for (task, (ok, n)) in &by_task {
        assert!(*ok as f64 >= 0.975 * *n as f64, "{task}: {ok}/{n} < 97.5 % ({})", summary(&by_task));
    }
    assert!(second.0 * 100 >= 98 * second.1, "second questions: {}/{} < 98 %", second.0, second.1);
    assert!(agreement >= 0.7, "MTP draft agreement {agreement} < 0.7");
}

/// With thinking off (the template's empty think block) the model answers directly. It is then
/// often wrong on the multi-step tasks, as a real model would be; the test checks that it stops,
/// does not think, and that a stray `</think>` in the answer stays rare (v2 wrote one in 1 of its
/// 240 held-out problems; v3 in none of the 630; v5 in 2, both sorts).
#[test]
fn answers_directly_with_thinking_disabled() {
    let d = demo();
    let think_end = d.tok.specials.think_end.unwrap();
    let probs = heldout();
    let mut by_task = Tally::new();
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
        tally(&mut by_task, &p.task, out.answer.contains(&p.expected));
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

/// Every example the README's demo section shows, run as it is written there: a cell
/// `"Q" → "A"` asks Q and expects exactly A; `"Q1" · "Q2" · … → "A"` is a conversation (each
/// earlier question answered by the model itself, its answer kept in the history as a chat keeps
/// it) whose last answer is A.
#[test]
fn every_readme_example_is_right() {
    let d = demo();
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme.split("\n## The demo model").nth(1).unwrap().split("\n## ").next().unwrap();
    // Examples may wrap across lines: whitespace between and inside quotes is one space.
    let cell = regex::Regex::new(r#"((?:"[^"]+"(?:\s+·\s+)?)+)\s+→\s+"([^"]+)""#).unwrap();
    let quoted = regex::Regex::new(r#""([^"]+)""#).unwrap();
    let one_line = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut checked = 0;
    let mut wrong = vec![];
    for c in cell.captures_iter(section) {
        let turns: Vec<String> = quoted.captures_iter(&c[1]).map(|q| one_line(&q[1])).collect();
        let expected = one_line(&c[2]);
        let mut history: Vec<Value> = vec![];
        let mut last = String::new();
        for q in &turns {
            let (out, margins) = d.generate_with_margins(d.prompt_after(&history, q, true));
            assert_margins(&format!("README example {q:?}"), &margins, F32_MARGIN);
            assert_eq!(out.finish_reason, FinishReason::Stop, "{q}: {:?}", out.answer);
            last = out.answer.trim().to_string();
            history.push(json!({"role": "user", "content": q}));
            history.push(json!({"role": "assistant", "content": last}));
        }
        checked += 1;
        if last != expected {
            wrong.push(format!("{} → {last:?}, the README says {expected:?}", turns.join(" · ")));
        }
    }
    eprintln!("README examples: {checked} checked, {} wrong", wrong.len());
    assert!(checked >= 10, "found only {checked} examples in the README's demo section");
    assert!(wrong.is_empty(), "README examples the demo gets wrong:\n{}", wrong.join("\n"));
}

/// A memory problem's prompt and the token count up to the end of the code it asks about.
fn memory_prompt(d: &Demo, p: &Problem) -> (Vec<u32>, usize) {
    let code = p.expected.trim_start_matches("The code was ").trim_end_matches('.');
    let opts = RenderOptions { add_generation_prompt: true, enable_thinking: Some(true), ..Default::default() };
    let mut messages = p.history.clone();
    messages.push(json!({"role": "user", "content": p.question}));
    let text = d.template.render(&Value::Array(messages), &opts).unwrap();
    let end = text.find(code).expect("the code is in the prompt") + code.len();
    (d.tok.encode(&text).unwrap(), d.tok.encode(&text[..end]).unwrap().len())
}

/// Per GDN (layer, value head): the share of what the head held at the end of the code that it
/// still holds at the end of the prompt, exp(Σ g) over the tokens between.
fn kept_since(d: &Demo, prompt: &[u32], from: usize) -> BTreeMap<(usize, usize), f64> {
    let mut state = d.model.new_state();
    let opts = ForwardOptions { trace_state: true, ..Default::default() };
    let trace = d.model.forward(prompt, &mut state, opts).unwrap().state_trace.expect("a state trace");
    let mut kept = BTreeMap::new();
    for (layer, lt) in trace.layers.iter().enumerate() {
        if let LayerTrace::Gdn(g) = lt {
            assert_eq!(g.tokens, prompt.len());
            for h in 0..g.heads {
                let sum: f64 = (from..g.tokens).map(|t| g.g[t * g.heads + h] as f64).sum();
                kept.insert((layer, h), sum.exp());
            }
        }
    }
    kept
}

/// The memory task ("Remember the code 4821." … 100–400 tokens of other things … "What was
/// the code?") and the Gated-DeltaNet heads trained to carry it. A head's half-life over a
/// problem is measured over the tokens between the code and the question (the span × ln 2 / −ln
/// of the share of its state it kept): on every one-message problem (the code, 40–80 words, the
/// question) some head keeps half for at least 100 tokens. Silencing the heads that do (A_log
/// raised by 12: they forget within a token, as if their state were zeroed every step) breaks
/// the memory task and leaves every other task answered: the code travels in those heads' state,
/// not through attention (phases D and E of training hid everything from the code to the
/// question from the question's attention).
#[test]
fn the_memory_task_and_its_long_gdn_heads() {
    let d = demo();
    let probs = heldout();
    let memory: Vec<&Problem> = probs.iter().filter(|p| p.task == "memory").collect();
    assert!(memory.len() >= 40);
    let mut long: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    // (span, the longest half-life) per form: one message, a conversation.
    let (mut message, mut conversation) = (vec![], vec![]);
    for p in &memory {
        let (prompt, code_end) = memory_prompt(&d, p);
        let span = prompt.len() - code_end;
        let half_life = |kept: f64| span as f64 * std::f64::consts::LN_2 / -kept.ln();
        let kept = kept_since(&d, &prompt, code_end);
        let life = kept.values().map(|k| half_life(*k)).fold(0.0, f64::max);
        if p.history.is_empty() { &mut message } else { &mut conversation }.push((span, life));
        for (head, k) in kept {
            if half_life(k) >= 100.0 {
                *long.entry(head).or_default() += 1;
            }
        }
    }
    let describe = |v: &mut Vec<(usize, f64)>| {
        v.sort_by(|a, b| a.1.total_cmp(&b.1));
        let spans: Vec<usize> = v.iter().map(|x| x.0).collect();
        format!(
            "{} problems, code to question {}–{} tokens, the longest head's half-life {:.0}–{:.0} (median {:.0})",
            v.len(),
            spans.iter().min().unwrap(),
            spans.iter().max().unwrap(),
            v[0].1,
            v[v.len() - 1].1,
            v[v.len() / 2].1
        )
    };
    eprintln!("memory, one message: {}", describe(&mut message));
    eprintln!("memory, a conversation: {}", describe(&mut conversation));
    eprintln!("heads with a half-life ≥ 100 tokens over the span, (layer, head) → problems: {long:?}");
    assert!(message.len() >= 20 && conversation.len() >= 20);
    for (span, life) in &message {
        assert!(*life >= 100.0 && *span >= 100, "a one-message problem: span {span}, the longest half-life {life:.0}");
    }
    let heads: Vec<(usize, usize)> = long.iter().filter(|(_, n)| **n * 4 >= memory.len()).map(|(h, _)| *h).collect();
    assert!(!heads.is_empty());

    let silenced = silenced_demo(&heads);
    // 40 problems of each task (the held-out set has them in turn).
    let mut by_task = Tally::new();
    for p in probs.iter().take(40 * 7) {
        let out = silenced.generate(silenced.problem_prompt(p, true));
        tally(&mut by_task, &p.task, out.answer.contains(&p.expected));
    }
    eprintln!("long heads {heads:?} silenced: {}", summary(&by_task));
    for (task, (ok, n)) in &by_task {
        // Measured (v5): memory 1 / 40; the others 33–40 / 40 (addition loses most: these heads
        // help it a little, 33 / 40; v4 34 / 40). Broken means at most 10 %, kept at least 80 %.
        if task == "memory" {
            assert!(ok * 10 <= *n, "silencing {heads:?} should break the memory task: {ok}/{n} right");
        } else {
            assert!(ok * 100 >= 80 * n, "silencing {heads:?}: {task} {ok}/{n}");
        }
    }
    assert!(by_task.contains_key("memory"), "{}", summary(&by_task));
}

/// The demo model with the GDN `heads` made to forget at once (A_log + 12), loaded from a copy.
fn silenced_demo(heads: &[(usize, usize)]) -> Demo {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/demo");
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    fixture_edit::edit_tensors(&dir.path().join("model.safetensors"), |name, shape, data| {
        let mut data = data.to_vec();
        for &(layer, head) in heads {
            if name == format!("model.layers.{layer}.linear_attn.A_log") {
                let at = 2 * head; // bf16
                let v = f32::from_bits((u16::from_le_bytes([data[at], data[at + 1]]) as u32) << 16) + 12.0;
                data[at..at + 2].copy_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
            }
        }
        Some((shape.to_vec(), data))
    });
    let source = ModelSource::Dir(dir.path().to_path_buf());
    let model = Model::load(&source, &LoadOptions::default()).unwrap();
    let tok = TextTokenizer::load(&source, Some(model.config().vocab_size), &model.config().eos_token_ids).unwrap();
    let template = ChatTemplate::load(&source, true).unwrap();
    Demo { model, tok, template, _dir: Some(dir) }
}
