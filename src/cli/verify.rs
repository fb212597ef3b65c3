//! `deltascope verify --server URL [--model DIR]`: is it the server or the model? The server's
//! greedy answers to a probe set, scored token by token by the reference engine (the
//! checkpoint `--model` names, or the embedded demo). `--device cuda|emu` (no `--server`)
//! checks the in-process GPU engine the same way against the CPU engine. Exit 0 when every
//! probe agrees, 3 when one drifts, diverges or renders its prompt differently, 1 on an error.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use super::common::ModelArgs;
use super::report::{self, Report};
use crate::backend::local::Loaded;
use crate::backend::{Backend, BackendKind, BackendSpec, OpenProgress, ReasoningSplit};
use crate::verify::against;
use crate::verify::judges;
use crate::verify::probes::{self, Probe};
use crate::verify::same_file::{self, SameFile};
use crate::verify::score::{Thresholds, Verdict};
use crate::verify::server::{self, ProbeReport, PromptCheck, VerifyError};
use deltascope_model::DeviceSpec;

#[derive(Args, Debug)]
// `--model` names the reference here, so it goes with `--server` (elsewhere they exclude each
// other: a command runs one model or the other).
#[command(mut_arg("model", |a| a.conflicts_with(clap::builder::Resettable::<clap::Id>::Reset)))]
pub struct VerifyArgs {
    /// The subject: `--server URL`, or the in-process GPU engine (`--device cuda|emu`, no
    /// `--server`); and the reference, on the CPU: `--model DIR` (a checkpoint of the same
    /// model; default the embedded demo), `--dtype` (the reference computes in f32 unless
    /// this names bf16), `--threads`.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Your own probes: JSON Lines, `{"prompt": "…"}` or `{"messages": […]}` a line, with
    /// optional `name`, `thinking` (default true), `max_tokens` (default 160), `ignore_eos`.
    #[arg(long, value_name = "FILE")]
    pub prompts: Option<PathBuf>,
    /// Only the short probes (no 1k / 4k / 16k-token prompts): seconds on the demo model.
    #[arg(long)]
    pub quick: bool,
    /// One JSON object with every probe and every position.
    #[arg(long)]
    pub json: bool,
    /// Compare `--server` with this second server instead of a local model (no `--model`):
    /// the same report, with this one as the yardstick — neither is known to be right.
    #[arg(long, value_name = "URL2", requires = "server", conflicts_with = "model")]
    pub against: Option<String>,
    /// Three judges: the full-precision checkpoint (bf16 or FP8 safetensors, or a wider GGUF)
    /// of the model `--model FILE.gguf` quantises. Each probe's error is then split in two:
    /// quantisation (the GGUF reference against this one, on the server's tokens) and serving
    /// (the server against the GGUF reference, on the same bytes).
    #[arg(long, value_name = "DIR|FILE", requires = "server", conflicts_with = "against")]
    pub against_full: Option<PathBuf>,
}

/// What makes the in-process GPU engine diverge from the CPU engine: its kernels (named below
/// when one differs from its twin) or the host code that chains them.
const DEVICE_CAUSES: &str = "what makes the device diverge from the CPU engine: a kernel that computes something else (each is checked against its CPU twin below; `deltascope gpu check` runs them alone), or the host code that chains them (layer wiring, caches, positions)";

/// What usually makes a server diverge from its model's reference.
const CAUSES: &str = "what usually causes a divergence: a broken Gated-DeltaNet or attention kernel (an early divergence, then \
repetition); a wrong chat template (compare the prompt check above); a wrong RoPE or context setting (long prompts \
diverge, short ones agree); a quantised model checked against a bf16 / f32 reference (drift everywhere, divergences \
at near-ties)";

pub fn run(a: VerifyArgs) -> anyhow::Result<()> {
    let gpu_subject = matches!(a.model.device, DeviceSpec::Cuda(_) | DeviceSpec::Emu(_));
    anyhow::ensure!(
        a.model.server.server.is_some() != gpu_subject,
        "verify checks one subject: a server (--server URL) or the in-process GPU engine (--device cuda|emu, no --server); --model DIR names the reference (default the demo model)"
    );
    let own: Vec<Probe> = match &a.prompts {
        Some(path) => probes::from_file(path).map_err(|e| anyhow::anyhow!("--prompts {e}"))?,
        None => vec![],
    };
    let subject = crate::backend::open(&client_split(a.model.spec()?), &|_: OpenProgress| {})?;
    super::common::print_notes(subject.info());
    let yardstick = yardstick(&a)?;
    let probes = if own.is_empty() { yardstick.builtin_probes(a.quick) } else { own };
    let thresholds = Thresholds::default();
    let who = describe(subject.as_ref());
    let reference = yardstick.describe();
    writeln!(std::io::stderr().lock(), "verify: {who} against {reference} · {} probes", probes.len())?;
    // A GGUF reference: is it the very file the server runs?
    let same_file = match &yardstick {
        Yardstick::Engine(r) => same_file::judge(&r.identity(), &subject.info().identity),
        Yardstick::Server(_) => None,
    };
    if let Some(s) = &same_file {
        writeln!(std::io::stderr().lock(), "verify: {}", s.line())?;
    }
    let full = full_reference(&a)?;
    let (reports, errors) = check_probes(subject.as_ref(), &yardstick, full.as_ref(), &probes, &thresholds, a.json)?;
    let report = VerifyReport {
        same_file,
        subject: who,
        reference,
        thresholds,
        overall: overall(&reports),
        probes: reports,
        errors,
        gpu_subject,
    };
    report::emit(&report, a.json)?;
    end_with_verdict(&a, &report, probes.len())
}

/// Every token with its logprob entry: a server is asked not to split thinking off where it can
/// (llama.cpp, SGLang, deltascope), so `</think>` comes as a token like any other; and for ids
/// where they come only on request (vLLM).
fn client_split(spec: BackendSpec) -> BackendSpec {
    match spec {
        BackendSpec::Remote(mut spec) => {
            spec.reasoning_split = ReasoningSplit::Client;
            spec.token_ids = true;
            BackendSpec::Remote(spec)
        }
        local => local,
    }
}

/// The yardstick the flags name: the second server of `--against`, or the reference engine.
fn yardstick(a: &VerifyArgs) -> anyhow::Result<Yardstick> {
    Ok(match &a.against {
        Some(url) => {
            let BackendSpec::Remote(mut spec) = a.model.spec()? else { anyhow::bail!("--against needs --server") };
            spec.url = url.clone();
            spec.model = None;
            Yardstick::Server(crate::backend::open(&client_split(BackendSpec::Remote(spec)), &|_: OpenProgress| {})?)
        }
        // The reference runs on the CPU, whatever --device names (that is the subject's), and
        // in exact f32 unless --dtype names a precision: `auto` would make a bf16 checkpoint's
        // yardstick carry bf16 rounding of its own, doubling the noise an agreeing subject shows.
        None => {
            let mut spec = a.model.local_spec()?;
            spec.device = DeviceSpec::Cpu;
            let spec = spec.exact_unless_named();
            Yardstick::Engine(Box::new(Loaded::load(&spec, &|_: OpenProgress| {})?))
        }
    })
}

/// The full-precision checkpoint of `--against-full`, on the CPU, exact f32 unless `--dtype`
/// names a precision (as the reference).
fn full_reference(a: &VerifyArgs) -> anyhow::Result<Option<Loaded>> {
    let Some(path) = &a.against_full else { return Ok(None) };
    let mut spec = crate::backend::local::LocalSpec::new(Some(path), &a.model.dtype)
        .map_err(|e| anyhow::anyhow!("--against-full: {}", e.message))?;
    spec.device = DeviceSpec::Cpu;
    let spec = spec.exact_unless_named();
    Ok(Some(Loaded::load(&spec, &|_: OpenProgress| {}).map_err(|e| anyhow::anyhow!("--against-full: {e}"))?))
}

/// Every probe checked in turn, each one's line on stderr as it finishes (not with --json): the
/// reports, and the probes that could not be run.
fn check_probes(
    subject: &dyn Backend,
    yardstick: &Yardstick,
    full: Option<&Loaded>,
    probes: &[Probe],
    thresholds: &Thresholds,
    json: bool,
) -> anyhow::Result<(Vec<ProbeReport>, Vec<String>)> {
    let mut err = std::io::stderr().lock();
    let (mut reports, mut errors) = (vec![], vec![]);
    for probe in probes {
        let checked = match yardstick {
            Yardstick::Engine(reference) => server::check(subject, reference, probe, thresholds),
            Yardstick::Server(other) => against::check_pair(subject, other.as_ref(), probe, thresholds),
        };
        // One probe's failure (a dropped connection, a refused request) does not lose the
        // others' findings: they are reported, then the run ends in an error. A server that
        // cannot be verified at all ends it at once.
        // The third judge scores the same tokens: the quantisation error.
        let checked = match (checked, yardstick, full) {
            (Ok(mut r), Yardstick::Engine(quantised), Some(full)) => {
                judges::quantisation_error(quantised, full, probe, &r, thresholds).map(|q| {
                    r.quantisation = q;
                    r
                })
            }
            (checked, _, _) => checked,
        };
        let r = match checked {
            Ok(r) => r,
            Err(e @ VerifyError::Cannot(_)) => return Err(e.into()),
            Err(e) => {
                writeln!(err, "  {:<16} error: {e}", probe.name)?;
                errors.push(format!("{}: {e}", probe.name));
                continue;
            }
        };
        if !json {
            writeln!(err, "{}", line(&r))?;
        }
        reports.push(r);
    }
    Ok((reports, errors))
}

/// What `verify` found: the subject and its yardstick, every probe's report, the probes that
/// could not be run, and the overall verdict.
#[derive(Serialize)]
struct VerifyReport {
    /// Whether the server runs the reference's GGUF (`None`: the reference is not a GGUF).
    #[serde(skip_serializing_if = "Option::is_none")]
    same_file: Option<SameFile>,
    subject: String,
    reference: String,
    thresholds: Thresholds,
    overall: &'static str,
    probes: Vec<ProbeReport>,
    errors: Vec<String>,
    /// The subject is the in-process GPU engine (not a server): the text says "the device".
    #[serde(skip)]
    gpu_subject: bool,
}

impl Report for VerifyReport {
    fn print_human(&self, out: &mut dyn Write) -> std::io::Result<()> {
        if let Some(s) = &self.same_file {
            writeln!(out, "{}", s.line())?;
        }
        for r in &self.probes {
            explain(out, r, if self.gpu_subject { "the device" } else { "the server" })?;
        }
        if self.probes.iter().any(|r| matches!(r.verdict, Some(Verdict::Diverges { .. }))) {
            writeln!(out, "{}", if self.gpu_subject { DEVICE_CAUSES } else { CAUSES })?;
        }
        match self.errors.len() {
            0 => writeln!(out, "overall: {}", self.overall),
            n => writeln!(out, "overall: incomplete ({n} probes could not be run); the others: {}", self.overall),
        }
    }

    /// One line. Through a `Value`, as it always was written: the f32 log-probabilities widened
    /// to f64 there, and scripts have read those digits.
    fn print_json(&self, out: &mut dyn Write) -> std::io::Result<()> {
        writeln!(out, "{}", serde_json::to_value(self)?)
    }
}

/// The exit the report calls for: 0 when every probe agrees, an error when a probe could not be
/// run or none fits, 3 when one drifts or diverges (for the in-process device, after naming
/// the kernel that differs).
fn end_with_verdict(a: &VerifyArgs, report: &VerifyReport, probes: usize) -> anyhow::Result<()> {
    if !report.errors.is_empty() {
        anyhow::bail!("{} of {probes} probes could not be run: {}", report.errors.len(), report.errors.join("; "));
    }
    match report.overall {
        "agrees" => Ok(()),
        "nothing run" => anyhow::bail!("no probe fits the context: nothing was checked"),
        overall if report.gpu_subject => {
            // The in-process device: the kernel that differs is named (each run on its own
            // against its CPU twin), and the run ends with an error line.
            let sentence = match crate::verify::parity::name_device_kernels(&a.model.device, a.model.kernels.as_deref())
            {
                Ok(k) => k.sentence(),
                Err(e) => format!("its kernels could not be checked one by one: {e}"),
            };
            eprintln!("error: {} {overall} from {}; {sentence}", report.subject, report.reference);
            std::process::exit(3)
        }
        _ => std::process::exit(3),
    }
}

/// What the subject is measured against.
enum Yardstick {
    /// The reference engine on the CPU.
    Engine(Box<Loaded>),
    /// Another server (`--against`).
    Server(Box<dyn Backend>),
}

impl Yardstick {
    /// The built-in probes, their lengths counted by the reference's tokenizer (a server's
    /// is not at hand: about four characters a token).
    fn builtin_probes(&self, quick: bool) -> Vec<Probe> {
        match self {
            Yardstick::Engine(r) => probes::builtin(quick, &|t| r.tokenizer().encode(t).map_or(0, |ids| ids.len())),
            Yardstick::Server(_) => probes::builtin(quick, &|t| t.len() / 4),
        }
    }

    /// "the reference demo on the CPU", or the second server's name and address.
    fn describe(&self) -> String {
        match self {
            Yardstick::Engine(r) => format!("the reference {} on the CPU", r.name()),
            Yardstick::Server(b) => {
                format!("{} as the yardstick (neither server is known to be right)", describe(b.as_ref()))
            }
        }
    }
}

/// "demo at http://…", "embedded:demo on emu:0 (bf16)".
fn describe(b: &dyn Backend) -> String {
    match &b.info().kind {
        BackendKind::Local { devices, dtype } => format!("{} on {} ({dtype})", b.info().name, devices.join(" + ")),
        BackendKind::Remote(label) => format!("{} at {}", b.info().name, label.url),
    }
}

fn overall(reports: &[ProbeReport]) -> &'static str {
    let any = |f: &dyn Fn(&ProbeReport) -> bool| reports.iter().any(f);
    if any(&|r| {
        matches!(r.prompt, PromptCheck::Differs { .. })
            || matches!(r.verdict, Some(Verdict::Diverges { .. }))
            || r.failed.is_some()
    }) {
        "diverges"
    } else if any(&|r| matches!(r.verdict, Some(Verdict::Drifts { .. })) || r.unmapped.is_some()) {
        "drifts"
    } else if reports.iter().all(|r| r.verdict.is_none()) {
        "nothing run"
    } else {
        "agrees"
    }
}

/// One line per probe, as it finishes.
fn line(r: &ProbeReport) -> String {
    let prompt = match &r.prompt {
        PromptCheck::Same { tokens } => format!("prompt same ({tokens} tokens)"),
        PromptCheck::TokenizerSame { tokens } => format!("prompt tokens same ({tokens}; template not checked)"),
        PromptCheck::Differs { at, .. } => format!("prompt DIFFERS at token {at}"),
        PromptCheck::NotChecked { .. } if r.not_run.is_some() => String::new(),
        PromptCheck::NotChecked { .. } if r.prompt_tokens == 0 => "prompt not checked".into(),
        PromptCheck::NotChecked { .. } => format!("prompt not checked ({} tokens)", r.prompt_tokens),
    };
    let w = crate::verify::score::worst(&r.positions);
    let verdict = match (&r.verdict, &r.not_run) {
        (_, Some(why)) => format!("not run: {why}"),
        (None, None) => String::new(),
        (Some(v), None) => format!(
            "{} tokens · {} (max |Δ| {:.3} · min top-k overlap {:.2} · max KL ≥ {:.4})",
            r.positions.len(),
            match (v, &r.failed) {
                (Verdict::Diverges { at }, _) => format!("DIVERGES at position {at}"),
                // The server could not go on (a NaN, a crash): the first position it did not
                // produce is where it parts from the reference.
                (v, Some((at, _))) => format!(
                    "FAILED at position {at}, the tokens before it {}",
                    if matches!(v, Verdict::Agrees) { "agree" } else { "drift" }
                ),
                (v, None) => v.name().to_string(),
            },
            w.delta,
            w.overlap,
            w.kl,
        ),
    };
    let parted = r.parted_at.map_or(String::new(), |i| format!(" · the texts part at a near-tie at position {i}"));
    let quantisation = r.quantisation.as_ref().map_or(String::new(), |q| {
        let w = crate::verify::score::worst(&q.positions);
        let v = match &q.verdict {
            Verdict::Diverges { at } => format!("DIVERGES at position {at}"),
            v => v.name().to_string(),
        };
        format!(
            "\n  {:<16} quantisation (GGUF against the full checkpoint): {v} (max |Δ| {:.3} · max KL ≥ {:.4})",
            "", w.delta, w.kl
        )
    });
    let serving = if r.quantisation.is_some() { "serving: " } else { "" };
    format!(
        "  {:<16} {prompt}{}{serving}{verdict}{parted}{quantisation}",
        r.name,
        if prompt.is_empty() { "" } else { " · " }
    )
}

/// The details of a finding: the prompt's first difference, or the divergence with its
/// context and both top-5 lists.
fn explain(out: &mut dyn Write, r: &ProbeReport, who: &str) -> std::io::Result<()> {
    if let PromptCheck::Differs { at, reference, subject, text_at } = &r.prompt {
        writeln!(
            out,
            "{}: {who}'s prompt differs from the reference's at token {at}: {subject} where the reference has {reference}",
            r.name
        )?;
        if let Some((c, ours, theirs)) = text_at {
            writeln!(out, "  rendered text, from character {c}: reference {ours:?}")?;
            writeln!(
                out,
                "                                  {:<9} {theirs:?}",
                if who == "the server" { "server" } else { "device" }
            )?;
        }
        writeln!(
            out,
            "  a different chat template or tokenizer: {who} is not given the prompt the model was trained on"
        )?;
    }
    if let Some((at, message)) = &r.failed {
        writeln!(out, "{}: {who} failed at position {at}: {message}", r.name)?;
    }
    if let Some((i, text)) = &r.unmapped {
        writeln!(
            out,
            "{}: {who}'s token {i} ({text:?}) has no id and is not one reference token: scoring stopped there",
            r.name
        )?;
    }
    if let Some(Verdict::Diverges { at }) = r.verdict {
        let p = &r.positions[at];
        let (before, token, after) = r.context(at);
        writeln!(
            out,
            "{}: diverges at position {at}: {who} chose {:?}, which the reference gives p = {:.2e} (its first choice had p = {:.2})",
            r.name,
            p.text,
            p.reference_p(),
            p.reference_top1_p()
        )?;
        writeln!(out, "  text: …{before}[{token}]{after}…")?;
        let list = |alts: &[crate::verify::score::Alt]| {
            alts.iter().map(|a| format!("{:?} {:.3}", a.text, a.logprob)).collect::<Vec<_>>().join(", ")
        };
        writeln!(out, "  reference top-5: {}", list(&p.reference_top))?;
        writeln!(
            out,
            "  {} top-5:    {}",
            if who == "the server" { "server" } else { "device" },
            if p.subject_top.is_empty() { "(none sent)".into() } else { list(&p.subject_top) }
        )?;
    }
    Ok(())
}
