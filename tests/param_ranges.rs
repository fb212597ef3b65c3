//! One range table, every front end: the command line (flags → `ParamOverrides::resolve`), the
//! server's request parser, the TUI's slider setter and a session file's params must accept and
//! refuse exactly the values `GenerationParams::check` accepts and refuses. A front end that
//! grows a range of its own (or loses one) fails here.

use clap::Parser;
use deltascope::backend::ParamOverrides;
use deltascope::backend::{BackendInfo, BackendKind, Support};
use deltascope::session::Session;
use deltascope::tui::sliders::{Settings, Slider};
use deltascope_protocol::{GenerationParams, MtpMode, RANGES, SamplingParams, Thinking, range};

/// A context long enough that only the table (not the context bound) judges.
const CONTEXT: usize = 1 << 20;

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    gen_args: ParamOverrides,
}

/// The fields under test: (JSON path in `GenerationParams`, the flag, the server's field, the
/// slider). `None` where a front end does not set that field.
struct Field {
    path: &'static str,
    flag: &'static str,
    body: &'static str,
    slider: Option<Slider>,
}

const FIELDS: &[Field] = &[
    Field { path: "max_tokens", flag: "--max-tokens", body: "max_tokens", slider: Some(Slider::MaxTokens) },
    Field {
        path: "thinking_budget",
        flag: "--thinking-budget",
        body: "thinking_budget",
        slider: Some(Slider::ThinkingBudget),
    },
    Field { path: "answer_budget", flag: "--answer-budget", body: "", slider: None },
    Field {
        path: "sampling.temperature",
        flag: "--temperature",
        body: "temperature",
        slider: Some(Slider::Temperature),
    },
    Field { path: "sampling.top_p", flag: "--top-p", body: "top_p", slider: Some(Slider::TopP) },
    Field { path: "sampling.top_k", flag: "--top-k", body: "top_k", slider: Some(Slider::TopK) },
    Field { path: "sampling.min_p", flag: "--min-p", body: "min_p", slider: Some(Slider::MinP) },
    Field {
        path: "sampling.presence_penalty",
        flag: "--presence-penalty",
        body: "presence_penalty",
        slider: Some(Slider::PresencePenalty),
    },
    Field {
        path: "sampling.frequency_penalty",
        flag: "--frequency-penalty",
        body: "frequency_penalty",
        slider: Some(Slider::FrequencyPenalty),
    },
    Field {
        path: "sampling.repetition_penalty",
        flag: "--repetition-penalty",
        body: "repetition_penalty",
        slider: Some(Slider::RepetitionPenalty),
    },
    Field { path: "top_logprobs", flag: "--top-logprobs", body: "top_logprobs", slider: None },
    Field { path: "loop_detection.min_repeats", flag: "--loop-min-repeats", body: "", slider: None },
    Field { path: "loop_detection.min_span", flag: "--loop-min-span", body: "", slider: None },
    Field { path: "mtp.depth", flag: "--mtp", body: "", slider: Some(Slider::MtpDepth) },
];

fn field(path: &str) -> &'static Field {
    FIELDS.iter().find(|f| f.path == path).unwrap_or_else(|| panic!("no field {path}"))
}

/// Values at and around each boundary, as a person types them.
const CASES: &[(&str, &str)] = &[
    ("max_tokens", "-1"),
    ("max_tokens", "0"),
    ("max_tokens", "1"),
    ("max_tokens", "4096"),
    ("max_tokens", "1.5"),
    ("thinking_budget", "-2"),
    ("thinking_budget", "-1"),
    ("thinking_budget", "0"),
    ("thinking_budget", "8"),
    ("answer_budget", "0"),
    ("answer_budget", "1"),
    ("sampling.temperature", "-0.1"),
    ("sampling.temperature", "0"),
    ("sampling.temperature", "2"),
    ("sampling.temperature", "3"),
    ("sampling.temperature", "100"),
    ("sampling.temperature", "100.5"),
    ("sampling.temperature", "150"),
    ("sampling.temperature", "NaN"),
    ("sampling.temperature", "inf"),
    ("sampling.top_p", "0"),
    ("sampling.top_p", "0.01"),
    ("sampling.top_p", "1"),
    ("sampling.top_p", "1.1"),
    ("sampling.top_k", "0"),
    ("sampling.top_k", "40"),
    ("sampling.top_k", "1048576"),
    ("sampling.top_k", "1048577"),
    ("sampling.min_p", "-0.01"),
    ("sampling.min_p", "0"),
    ("sampling.min_p", "1"),
    ("sampling.min_p", "1.01"),
    ("sampling.presence_penalty", "-2.5"),
    ("sampling.presence_penalty", "-2"),
    ("sampling.presence_penalty", "2"),
    ("sampling.presence_penalty", "2.5"),
    ("sampling.frequency_penalty", "-2.01"),
    ("sampling.frequency_penalty", "1.5"),
    ("sampling.frequency_penalty", "3"),
    ("sampling.repetition_penalty", "0"),
    ("sampling.repetition_penalty", "0.01"),
    ("sampling.repetition_penalty", "1"),
    ("sampling.repetition_penalty", "100"),
    ("sampling.repetition_penalty", "150"),
    ("top_logprobs", "0"),
    ("top_logprobs", "20"),
    ("top_logprobs", "21"),
    ("loop_detection.min_repeats", "1"),
    ("loop_detection.min_repeats", "2"),
    ("loop_detection.min_span", "0"),
    ("loop_detection.min_span", "1"),
    ("mtp.depth", "0"),
    ("mtp.depth", "4"),
    ("mtp.depth", "5"),
];

/// The judge: the value written into default params (`None` when the field's type cannot hold
/// it: a negative or fractional count), then `GenerationParams::check`.
fn reference(path: &str, text: &str) -> bool {
    let x: f64 = text.parse().unwrap();
    let count = || (x >= 0.0 && x.fract() == 0.0).then_some(x as usize);
    let mut p = GenerationParams::default();
    let q = &mut p.sampling;
    let settable = match path {
        "max_tokens" => count().map(|n| p.max_tokens = n).is_some(),
        // -1 is every front end's spelling of unlimited.
        "thinking_budget" if x == -1.0 => {
            p.thinking = Thinking::Unlimited;
            true
        }
        "thinking_budget" => count().map(|n| p.thinking = Thinking::from_budget(Some(n))).is_some(),
        "answer_budget" => count().map(|n| p.answer_budget = Some(n)).is_some(),
        "sampling.temperature" => {
            q.temperature = x as f32;
            true
        }
        "sampling.top_p" => {
            q.top_p = x as f32;
            true
        }
        "sampling.top_k" => count().map(|n| q.top_k = n).is_some(),
        "sampling.min_p" => {
            q.min_p = x as f32;
            true
        }
        "sampling.presence_penalty" => {
            q.presence_penalty = x as f32;
            true
        }
        "sampling.frequency_penalty" => {
            q.frequency_penalty = x as f32;
            true
        }
        "sampling.repetition_penalty" => {
            q.repetition_penalty = x as f32;
            true
        }
        "top_logprobs" => count().map(|n| p.top_logprobs = n).is_some(),
        "loop_detection.min_repeats" => count().map(|n| p.loop_detection.min_repeats = n).is_some(),
        "loop_detection.min_span" => count().map(|n| p.loop_detection.min_span = n).is_some(),
        "mtp.depth" => count().map(|n| p.mtp = MtpMode::fixed(n)).is_some(),
        other => panic!("no reference for {other}"),
    };
    settable && p.check().is_ok()
}

fn info() -> BackendInfo {
    BackendInfo {
        name: "test".into(),
        kind: BackendKind::Local { devices: vec!["cpu".into()], dtype: "f32".into() },
        device_note: None,
        config_notes: vec![],
        identity: Default::default(),
        context: Some(CONTEXT),
        vocab_size: None,
        has_mtp: true,
        layers: None,
        file_type: None,
        weights_bytes: None,
        defaults: SamplingParams::default(),
        step: Support::Yes,
        end_thinking: Support::Yes,
        provenance: Support::Yes,
        mtp_control: Support::Yes,
        continuation: Support::Yes,
        state_trace: Support::Yes,
    }
}

/// (a) The command line: the flag parsed as the binary parses it, then resolved.
fn cli(f: &Field, text: &str) -> bool {
    let arg = format!("{}={text}", f.flag);
    match Flags::try_parse_from(["deltascope", arg.as_str()]) {
        Ok(flags) => flags.gen_args.checked().is_ok_and(|o| o.resolve(&info()).is_ok()),
        Err(_) => false,
    }
}

/// (b) The server's request parser, on a chat body carrying the field.
fn server(f: &Field, text: &str) -> Option<bool> {
    if f.body.is_empty() {
        return None;
    }
    let extra = if f.body == "top_logprobs" { r#", "logprobs": true"# } else { "" };
    let body = format!(r#"{{"messages": [{{"role": "user", "content": "hi"}}], "{}": {text}{extra}}}"#, f.body);
    let verdict = deltascope::server::request::object(body.as_bytes())
        .and_then(|o| deltascope::server::request::chat(&o, CONTEXT, &SamplingParams::default()));
    Some(verdict.is_ok())
}

fn settings() -> Settings {
    Settings {
        params: GenerationParams::default(),
        resume_thinking: Thinking::Unlimited,
        preset: None,
        mtp: Support::Yes,
        context: Some(CONTEXT),
    }
}

/// (c) The TUI: the value typed into the slider.
fn tui(f: &Field, text: &str) -> Option<bool> {
    f.slider.map(|s| s.set(&mut settings(), text).is_ok())
}

/// (d) A session file whose turn has the value in its params (unlimited is `null` there).
fn session(f: &Field, text: &str, dir: &std::path::Path) -> bool {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sessions-v2/healthy.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let value: serde_json::Value = match (f.path, text) {
        ("thinking_budget", "-1") => serde_json::Value::Null,
        // JSON has no NaN or infinity: a file cannot hold them, so they are refused as values.
        (_, "NaN" | "inf") => return false,
        _ => serde_json::from_str(text).unwrap(),
    };
    let mut at = &mut v["turns"][0]["params"];
    for part in f.path.split('.') {
        at = &mut at[part];
    }
    *at = value;
    let path = dir.join("s.json");
    std::fs::write(&path, v.to_string()).unwrap();
    Session::load(&path).is_ok()
}

#[test]
fn every_front_end_agrees_with_the_one_table() {
    let dir = tempfile::tempdir().unwrap();
    let mut disagreements = vec![];
    for &(path, text) in CASES {
        let f = field(path);
        let want = reference(path, text);
        let mut verdicts = vec![("cli", Some(cli(f, text))), ("session", Some(session(f, text, dir.path())))];
        verdicts.push(("server", server(f, text)));
        verdicts.push(("tui", tui(f, text)));
        for (who, got) in verdicts {
            if let Some(got) = got
                && got != want
            {
                disagreements.push(format!(
                    "{path} = {text}: check() {} it, {who} {}",
                    if want { "accepts" } else { "refuses" },
                    if got { "accepts" } else { "refuses" }
                ));
            }
        }
    }
    assert!(
        disagreements.is_empty(),
        "front ends disagree with GenerationParams::check:\n{}",
        disagreements.join("\n")
    );
}

#[test]
fn the_cases_cover_both_sides_of_every_bound_they_test() {
    // Each field under test has a value accepted and one refused, so a verdict that is always
    // "yes" or always "no" cannot pass the test above by accident.
    for f in FIELDS {
        let verdicts: Vec<bool> = CASES.iter().filter(|(p, _)| *p == f.path).map(|(p, t)| reference(p, t)).collect();
        assert!(verdicts.contains(&true) && verdicts.contains(&false), "{}: {verdicts:?}", f.path);
        assert!(range(f.path).is_some(), "{} is in the range table", f.path);
    }
    assert!(RANGES.iter().all(|r| r.expected.len() > 3));
}

#[test]
fn refusals_name_the_field_in_every_front_end() {
    let err = Flags::try_parse_from(["deltascope", "--temperature=150"])
        .unwrap()
        .gen_args
        .checked()
        .unwrap()
        .resolve(&info())
        .unwrap_err()
        .to_string();
    assert!(err.contains("--temperature 150: must be in [0, 100]"), "{err}");
    let body = br#"{"messages": [{"role": "user", "content": "hi"}], "temperature": 150}"#;
    let e = deltascope::server::request::object(body)
        .and_then(|o| deltascope::server::request::chat(&o, CONTEXT, &SamplingParams::default()))
        .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("temperature"));
    assert_eq!(e.message, "temperature is 150: must be in [0, 100] (0 is greedy)");
    let body = br#"{"messages": [{"role": "user", "content": "hi"}], "reasoning_budget_tokens": 99999}"#;
    let e = deltascope::server::request::object(body)
        .and_then(|o| deltascope::server::request::chat(&o, 4096, &SamplingParams::default()))
        .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("reasoning_budget_tokens"), "{}", e.message);
    let err = Slider::Temperature.set(&mut settings(), "150").unwrap_err();
    assert_eq!(err, "temperature 150: must be in [0, 100] (0 is greedy)");
    // A value out of range that no flag set is blamed on where it came from: the server's own
    // defaults (llama.cpp's /props), the model's generation_config.json; a flag overrides it.
    let mut served = info();
    served.kind = BackendKind::Remote(deltascope_protocol::ServerLabel {
        kind: "llama.cpp".into(),
        version: None,
        url: "http://127.0.0.1:8080".into(),
    });
    served.defaults.top_p = 1.5;
    let flags = Flags::try_parse_from(["deltascope"]).unwrap().gen_args.checked().unwrap();
    let err = flags.resolve(&served).unwrap_err().to_string();
    assert!(
        err.contains("the server's own defaults (llama.cpp /props) of test: top_p = 1.5: must be in (0, 1]"),
        "{err}"
    );
    let mut local = info();
    local.defaults.top_k = 9_000_000;
    let err = flags.resolve(&local).unwrap_err().to_string();
    assert!(err.starts_with("the model's generation_config.json of test: top_k = 9000000"), "{err}");
    let fixed = Flags::try_parse_from(["deltascope", "--top-p=0.9"]).unwrap().gen_args.checked().unwrap();
    assert!(fixed.resolve(&served).is_ok(), "the flag's value replaces the server's");
}

/// Session files written before the one table still load: an unlimited budget is `null`, a
/// turn with thinking off records `enable_thinking: false` (whatever budget it kept: the turn
/// reads as thinking off), and MTP is `{depth, auto}`.
#[test]
fn old_session_files_load() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sessions-v2/healthy.json");
    let s = Session::load(std::path::Path::new(fixture)).unwrap();
    assert_eq!(s.turns[0].params.thinking, Thinking::Unlimited);
    assert_eq!(s.turns[0].params.mtp, MtpMode::fixed(2));
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    v["turns"][0]["enable_thinking"] = false.into();
    v["turns"][0]["params"]["thinking_budget"] = 8.into();
    let path = dir.path().join("off.json");
    std::fs::write(&path, v.to_string()).unwrap();
    let s = Session::load(&path).unwrap();
    assert_eq!(s.turns[0].params.thinking, Thinking::Off);
    // Saved again, the file says off in both places.
    let again = dir.path().join("again.json");
    s.save_atomic(&again).unwrap();
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&again).unwrap()).unwrap();
    assert_eq!(written["turns"][0]["enable_thinking"], false);
    assert_eq!(written["turns"][0]["params"]["thinking_budget"], 0);
    // A bad value names the file and the field.
    v["turns"][0]["params"]["sampling"]["temperature"] = 150.into();
    std::fs::write(&path, v.to_string()).unwrap();
    let err = Session::load(&path).unwrap_err().to_string();
    assert!(err.contains("off.json") && err.contains("turns[0].params.sampling.temperature"), "{err}");
}

/// MTP settings keep the `{"depth", "auto"}` form sessions and events have always had.
#[test]
fn mtp_mode_keeps_its_stored_form() {
    let wire = |m: MtpMode| serde_json::to_value(m).unwrap();
    assert_eq!(wire(MtpMode::Off), serde_json::json!({"depth": 0, "auto": false}));
    assert_eq!(wire(MtpMode::fixed(3)), serde_json::json!({"depth": 3, "auto": false}));
    assert_eq!(wire(MtpMode::Auto), serde_json::json!({"depth": 2, "auto": true}));
    let read = |v: serde_json::Value| serde_json::from_value::<MtpMode>(v).unwrap();
    // The TUI wrote auto as depth 0, the flags as depth 2: both are Auto.
    assert_eq!(read(serde_json::json!({"depth": 0, "auto": true})), MtpMode::Auto);
    assert_eq!(read(serde_json::json!({"depth": 2, "auto": true})), MtpMode::Auto);
    assert_eq!(read(serde_json::json!({"depth": 0, "auto": false})), MtpMode::Off);
    for (text, m) in [("auto", MtpMode::Auto), ("off", MtpMode::Off), ("0", MtpMode::Off), ("3", MtpMode::fixed(3))] {
        assert_eq!(text.parse::<MtpMode>().unwrap(), m, "{text}");
    }
    assert_eq!(MtpMode::fixed(3).to_string(), "3");
}

/// The README's ranges table says what the one table says: every bounded interval of `RANGES`
/// (as its error messages write it, `[0, 100]`, `(0, 1]`) is in the README's row for that field.
#[test]
fn the_readme_ranges_table_says_what_the_one_table_says() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md");
    let section = readme.split("#### Ranges").nth(1).expect("the README has a Ranges section");
    let rows: Vec<Vec<&str>> = section
        .lines()
        .skip_while(|l| !l.starts_with("| setting"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.trim().trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    assert!(rows.len() >= 10, "the ranges table has {} rows", rows.len());
    let mut checked = 0;
    for r in RANGES.iter() {
        let Some(interval) = r.expected.strip_prefix("in ") else { continue };
        let end = interval.find([']', ')']).expect("an interval closes") + 1;
        let interval = &interval[..end];
        let name = r.field.rsplit('.').next().unwrap_or(r.field);
        let row = rows
            .iter()
            .find(|cells| cells[0].contains(&format!("`{name}`")))
            .unwrap_or_else(|| panic!("the README's ranges table has no row for `{name}`"));
        assert!(row[1].contains(interval), "README says `{}` for {name}; the table says {interval}", row[1]);
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} bounded ranges checked");
}
