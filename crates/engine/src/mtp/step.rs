//! MTP speculative steps in the local loop: draft with the MTP head, verify in one target
//! pass, keep the accepted prefix and the pass's own token (settings and acceptance maths in
//! [`super::control`]).

use std::time::Instant;

use super::control::{AutoVerdict, DepthControl, prob, residual};
use crate::generator::Generator;
use crate::request::GenerateRequest;
use crate::run::{Rounds, Run, emit_stats};
use crate::sampler::{Rng, draw_with};
use crate::sequence::DecodeSequence;
use deltascope_model::Result;
use deltascope_protocol::Control;
use deltascope_protocol::{DraftKind, FinishReason, GenerationParams, MtpStats, Phase, Verdict};

/// Speculative decoding state of one generation.
pub(crate) struct Spec {
    pub control: DepthControl,
    pub stats: MtpStats,
    draft_rng: Rng,
    /// When the previous step ended, and whether it was a plain one (for `auto`'s cost probe).
    last_step: Option<(Instant, bool)>,
}

impl Spec {
    /// `carried`: where `auto` left off in the previous generation on this model (ignored for a
    /// fixed depth).
    pub(crate) fn new(p: &GenerationParams, carried: Option<AutoVerdict>) -> Self {
        let control = match carried {
            Some(v) if p.mtp.is_auto() => DepthControl::resume(v),
            _ => DepthControl::new(p.mtp),
        };
        Spec {
            stats: MtpStats::new(control.depth),
            control,
            draft_rng: Rng::new(p.sampling.seed ^ 0x6d74_705f_6472_6166),
            last_step: None,
        }
    }

    /// Milliseconds since the previous step when it was of the same kind (a plain step after a
    /// plain step, a pass after a pass): each such interval is one step's whole cost, sampling
    /// and events included.
    fn step_ms(&mut self, plain: bool) -> Option<f64> {
        let now = Instant::now();
        let ms = match self.last_step {
            Some((t, was_plain)) if was_plain == plain => Some((now - t).as_secs_f64() * 1e3),
            _ => None,
        };
        self.last_step = Some((now, plain));
        ms
    }
}

/// One verify pass's drafts, the draft distribution each was drawn from, and the target's rows
/// over `[x, d1..dk]`.
struct Pass {
    drafts: Vec<(u32, Vec<f32>)>,
    q_dists: Vec<Vec<(u32, f64)>>,
    rows: Vec<Vec<f32>>,
}

/// What judging a pass kept: drafts accepted, tokens appended, how the generation finished (if
/// it did), the next `x`, and whether it was cut where the engine must force.
#[derive(Default)]
struct Judged {
    accepted: usize,
    produced: usize,
    end: Option<FinishReason>,
    next: Option<u32>,
    /// An accepted draft after which the engine must force (a loop alarm under `--on-loop
    /// answer`): the pass is cut there, as plain decoding would stop sampling.
    cut: bool,
}

impl Generator<'_> {
    /// Speculative steps starting from `x`, a token just appended but not fed yet. Each step
    /// drafts, verifies `[x, d1..dk]`, appends the accepted drafts and the verify pass's own token
    /// (which becomes the next `x`), and keeps exactly what was appended. Drafting never crosses a
    /// point where the engine must force tokens or stop (max_tokens, the thinking or answer
    /// budget): there the depth shrinks, and at zero the token is fed plainly and control returns
    /// to the main loop.
    pub(crate) fn speculate(
        &self,
        run: &mut Run,
        source: &mut dyn DecodeSequence,
        req: &GenerateRequest,
        mut x: u32,
        control: &dyn Control,
        spec: &mut Spec,
    ) -> Result<Rounds> {
        loop {
            // Where the engine must force next (the thinking budget ran out, or a loop in
            // thinking is to be rescued, at `x` or at the token before it in its UTF-8 grace),
            // plain decoding feeds `x` and forces: so does this.
            if must_force(run) {
                return Ok(Rounds::Fed(source.feed(&[x])?));
            }
            let k = depth_here(run, spec);
            if k == 0 {
                let logits = source.feed(&[x])?;
                let ms = spec.step_ms(true);
                spec.control.observe_plain(ms);
                return Ok(Rounds::Fed(logits));
            }
            if !control.proceed() {
                return Ok(Rounds::Finished(FinishReason::Cancelled));
            }
            let mut pass = draft_and_verify(run, source, x, k, spec)?;
            let judged = self.judge(run, req, &pass);
            if judged.cut {
                // The drafts after the cut were never judged: they count as neither accepted
                // nor rejected. The pass's rows after the kept tokens are what plain decoding
                // would have computed next.
                let accepted = judged.accepted;
                close_pass(run, source, spec, (accepted, accepted, judged.produced))?;
                return Ok(Rounds::Fed(pass.rows.swap_remove(accepted)));
            }
            let judged = self.bonus_if_all_held(run, req, &pass, judged);
            close_pass(run, source, spec, (pass.drafts.len(), judged.accepted, judged.produced))?;
            if let Some(f) = judged.end {
                return Ok(Rounds::Finished(f));
            }
            x = judged.next.unwrap_or_else(|| unreachable!("a verify pass always yields a token or a finish"));
            if control.end_thinking_requested() {
                run.tally.request_end_of_thinking();
            }
        }
    }

    /// Judges the drafts in order against the target's rows: each accepted one is appended; the
    /// first rejected one is replaced by a token from the residual (greedy: the target's own)
    /// and ends the pass.
    fn judge(&self, run: &mut Run, req: &GenerateRequest, pass: &Pass) -> Judged {
        let mut j = Judged::default();
        for (i, (d, _)) in pass.drafts.iter().enumerate() {
            let target = run.sampler.distribution(&pass.rows[i]);
            let ok = if run.sampler.is_greedy() {
                target[0].0 == *d
            } else {
                run.sampler.uniform() < (prob(&target, *d) / prob(&pass.q_dists[i], *d)).min(1.0)
            };
            j.produced += 1;
            if !ok {
                let fix = if run.sampler.is_greedy() {
                    target[0].0
                } else {
                    run.sampler.draw(&residual(&target, &pass.q_dists[i]))
                };
                j.next = Some(fix);
                if let Verdict::Finish(f) = self.append(run, req, fix, false, &pass.rows[i], DraftKind::Bonus) {
                    j.end = Some(f);
                }
                break;
            }
            j.accepted += 1;
            if let Verdict::Finish(f) = self.append(run, req, *d, false, &pass.rows[i], DraftKind::Accepted) {
                j.end = Some(f);
                break;
            }
            if must_force(run) {
                j.cut = true;
                break;
            }
        }
        j
    }

    /// Every draft held (no finish, no rejection): the pass's last row gives one more token.
    fn bonus_if_all_held(&self, run: &mut Run, req: &GenerateRequest, pass: &Pass, mut j: Judged) -> Judged {
        if j.end.is_some() || j.next.is_some() {
            return j;
        }
        let row = &pass.rows[j.accepted];
        let bonus = run.sampler.sample(row);
        j.produced += 1;
        j.next = Some(bonus);
        if let Verdict::Finish(f) = self.append(run, req, bonus, false, row, DraftKind::Bonus) {
            j.end = Some(f);
        }
        j
    }
}

/// How many tokens to draft here: the depth, shrunk so that drafting never crosses max_tokens
/// or the phase's budget.
fn depth_here(run: &Run, spec: &Spec) -> usize {
    let mut k = spec.control.depth.min(run.tally.room().saturating_sub(1));
    let left = match run.tally.phase() {
        Phase::Thinking => run.tally.budget_left(),
        Phase::Answer => run.tally.answer_budget_left(),
    };
    if let Some(left) = left {
        k = k.min(left.saturating_sub(1));
    }
    k
}

/// Drafts `k` tokens after `x`, each drawn from the draft distribution q (with its own
/// generator, so draft and acceptance randomness stay independent), then verifies `[x, d1..dk]`
/// in one target pass; the time of each goes into the stats.
fn draft_and_verify(run: &Run, source: &mut dyn DecodeSequence, x: u32, k: usize, spec: &mut Spec) -> Result<Pass> {
    let t0 = Instant::now();
    let mut ds = run.sampler.clone();
    let mut q_dists = vec![];
    let rng = &mut spec.draft_rng;
    let drafts = source.draft(x, k, &mut |logits| {
        let q = ds.distribution(logits);
        let d = draw_with(&q, rng);
        ds.observe(d);
        q_dists.push(q);
        d
    })?;
    let t1 = Instant::now();
    let mut block = vec![x];
    block.extend(drafts.iter().map(|d| d.0));
    let rows = source.verify(&block)?;
    spec.stats.draft_ms += (t1 - t0).as_secs_f64() * 1e3;
    spec.stats.verify_ms += t1.elapsed().as_secs_f64() * 1e3;
    spec.stats.snapshot_bytes = source.rollback_bytes();
    Ok(Pass { drafts, q_dists, rows })
}

/// Keeps what the pass appended (`x` and the accepted drafts), records (drafted, accepted,
/// produced) and sends the MTP stats.
fn close_pass(
    run: &mut Run,
    source: &mut dyn DecodeSequence,
    spec: &mut Spec,
    (drafted, accepted, produced): (usize, usize, usize),
) -> Result<()> {
    source.accept(1 + accepted)?;
    spec.stats.record(drafted, accepted, produced);
    let ms = spec.step_ms(false);
    spec.control.observe(drafted, accepted, produced, ms);
    spec.stats.depth = spec.control.depth;
    emit_stats(run, source, Some(&spec.stats));
    Ok(())
}

/// The engine must force the end of thinking before the next sampled token (the thinking
/// budget is spent, or a loop in thinking is to be rescued).
fn must_force(run: &Run) -> bool {
    run.tally.budget_spent() || run.tally.rescue_due()
}
