//! The fixes a diagnostic offers (the TUI's F3 / F4, the headless suggestion, `--json`'s `fix`),
//! computed in one place so that every front end offers the same numbers, and numbers that
//! work: a thinking budget is useless unless max_tokens also holds the tokens forced to end
//! thinking (bridge text and `</think>`: 50-odd on the demo tokenizer, 20-odd on
//! Qwen's) and room for an answer after them.

use serde::{Deserialize, Serialize};

/// Room left for the answer after a forced end of thinking: a quarter of max_tokens, and never
/// less than this.
pub(crate) const ANSWER_ROOM_MIN: usize = 32;
/// The smallest thinking budget worth offering.
pub(crate) const BUDGET_MIN: usize = 8;

/// A diagnostic's one-key fixes: settings under which what was cut fits.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Fix {
    /// Raise max_tokens to this (F3); `None` when it cannot grow (the context is full) or
    /// growing it would not help.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<usize>,
    /// Cap thinking (F4), with the max_tokens the cap needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_budget: Option<BudgetFix>,
}

/// A thinking budget together with a max_tokens that holds it, the forced end of thinking and
/// an answer.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct BudgetFix {
    pub thinking_budget: usize,
    /// Unchanged when the budget fits in the current max_tokens, else raised.
    pub max_tokens: usize,
    /// Tokens forced to end thinking (bridge, `</think>`).
    pub forced_tokens: usize,
    /// Whether `forced_tokens` was counted with the tokenizer (else estimated from the text).
    pub forced_exact: bool,
    /// What is left for the answer: `max_tokens - thinking_budget - forced_tokens`.
    pub answer_room: usize,
}

/// The forced end of thinking estimated from the bridge text, when no tokenizer is at hand
/// (a server): two bytes a token (English BPE averages four; the demo's tokenizer about two),
/// plus `</think>`.
pub fn estimate_forced(bridge: &str) -> usize {
    bridge.len().div_ceil(2) + 1
}

/// A larger max_tokens (double, and at least 512 more), at most `cap`; `None` when the cap
/// leaves no room to grow.
pub(crate) fn raised_max_tokens(max_tokens: usize, cap: usize) -> Option<usize> {
    let raised = (max_tokens * 2).max(max_tokens + 512).min(cap);
    (raised > max_tokens).then_some(raised)
}

/// A thinking budget for a turn whose thinking ran into max_tokens.
///
/// Within the current max_tokens when the forced end of thinking and an answer fit next to a
/// budget of at least [`BUDGET_MIN`]; otherwise half of max_tokens as the budget, with
/// max_tokens raised to hold it. Always below `current` (a budget that was set and still
/// starved the answer is never offered again). `None` when even the smallest budget does not
/// fit in `cap`.
pub(crate) fn budget_fix(
    max_tokens: usize,
    current: Option<usize>,
    forced_tokens: usize,
    forced_exact: bool,
    cap: usize,
) -> Option<BudgetFix> {
    let room = (max_tokens / 4).max(ANSWER_ROOM_MIN);
    let below_current = |b: usize| match current {
        Some(c) if b >= c => c / 2,
        _ => b,
    };
    let within = below_current(max_tokens.saturating_sub(forced_tokens + room));
    let (budget, max) = if within >= BUDGET_MIN {
        (within, max_tokens)
    } else {
        let budget = below_current((max_tokens / 2).max(BUDGET_MIN));
        (budget, (budget + forced_tokens + room).max(max_tokens))
    };
    // A cap (the context) below what is needed shrinks the answer's room, down to one token.
    let max = max.min(cap);
    let answer_room = max.checked_sub(budget + forced_tokens).filter(|&r| r > 0)?;
    Some(BudgetFix { thinking_budget: budget, max_tokens: max, forced_tokens, forced_exact, answer_room })
}

/// The fixes and the message for `thinking_exhausted_max_tokens`.
pub fn starved(
    max_tokens: usize,
    thinking_tokens: usize,
    current_budget: Option<usize>,
    forced: (usize, bool),
    cap: usize,
) -> (Fix, String) {
    let fix = Fix {
        max_tokens: raised_max_tokens(max_tokens, cap),
        thinking_budget: budget_fix(max_tokens, current_budget, forced.0, forced.1, cap),
    };
    let mut msg = format!(
        "max_tokens ({max_tokens}) ran out inside the thinking phase after {thinking_tokens} thinking tokens, so the answer is empty"
    );
    let raise = fix.max_tokens.map(|m| format!("raise max_tokens to {m}"));
    let cap_thinking = fix.thinking_budget.map(|b| {
        let approx = if b.forced_exact { "" } else { "≈" };
        let with = if b.max_tokens > max_tokens {
            format!(
                " with max_tokens {} (no budget fits in {max_tokens}: the forced end of thinking alone is {approx}{} tokens)",
                b.max_tokens, b.forced_tokens
            )
        } else {
            String::new()
        };
        format!(
            "set a thinking budget of {}{with}: {} thinking + {approx}{} forced to end it (bridge text, </think>) + {approx}{} for the answer",
            b.thinking_budget, b.thinking_budget, b.forced_tokens, b.answer_room
        )
    });
    match (raise, cap_thinking) {
        (Some(r), Some(c)) => msg.push_str(&format!("; {r}, or {c}")),
        (Some(r), None) => msg.push_str(&format!("; {r}")),
        (None, Some(c)) => msg.push_str(&format!("; {c}")),
        (None, None) => msg.push_str("; the context has no room for more tokens: shorten the prompt or the history"),
    }
    (fix, msg)
}

/// The fix for `answer_truncated` by max_tokens (none when an answer budget cut it: raising
/// max_tokens would not change that).
pub fn truncated(max_tokens: usize, by_answer_budget: bool, cap: usize) -> Fix {
    Fix { max_tokens: if by_answer_budget { None } else { raised_max_tokens(max_tokens, cap) }, thinking_budget: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIG: usize = 1 << 20;

    #[test]
    fn a_budget_within_max_tokens_leaves_room_for_the_forced_close_and_an_answer() {
        let b = budget_fix(4096, None, 53, true, BIG).unwrap();
        assert_eq!(b.max_tokens, 4096);
        assert_eq!(b.thinking_budget, 4096 - 53 - 1024);
        assert_eq!(b.answer_room, 1024);
    }

    #[test]
    fn when_no_budget_fits_max_tokens_is_raised_with_it() {
        // The shipped starved session: max_tokens 24, a 53-token forced close.
        let b = budget_fix(24, None, 53, true, BIG).unwrap();
        assert_eq!((b.thinking_budget, b.max_tokens, b.answer_room), (12, 12 + 53 + 32, 32));
        let (fix, msg) = starved(24, 24, None, (53, true), BIG);
        assert!(msg.contains("no budget fits in 24") && msg.contains("max_tokens 97"), "{msg}");
        assert_eq!(fix.max_tokens, Some(536));
    }

    #[test]
    fn the_current_budget_is_never_offered_again() {
        // A budget of 40 in max_tokens 80 with a 53-token close: it could not fit.
        let b = budget_fix(80, Some(40), 53, true, BIG).unwrap();
        assert!(b.thinking_budget < 40, "{b:?}");
        assert!(b.thinking_budget + b.forced_tokens < b.max_tokens);
        // A budget that fits and still starved the answer (thinking re-opened): halved.
        let b = budget_fix(4096, Some(100), 53, true, BIG).unwrap();
        assert_eq!(b.thinking_budget, 50);
        for current in 1..200 {
            for max in [1, 10, 24, 64, 100, 300, 1000] {
                if let Some(b) = budget_fix(max, Some(current), 53, true, BIG) {
                    assert!(b.thinking_budget < current, "{b:?} for {current} in {max}");
                    assert_eq!(b.max_tokens, b.thinking_budget + b.forced_tokens + b.answer_room);
                }
            }
        }
    }

    #[test]
    fn the_context_caps_both_fixes() {
        assert_eq!(raised_max_tokens(1000, 1000), None);
        assert_eq!(raised_max_tokens(1000, 1200), Some(1200));
        let b = budget_fix(24, None, 53, true, 70).unwrap();
        assert_eq!((b.max_tokens, b.answer_room), (70, 5));
        assert_eq!(budget_fix(24, None, 53, true, 60), None);
        let (fix, msg) = starved(24, 24, None, (53, true), 24);
        assert_eq!(fix, Fix::default());
        assert!(msg.contains("no room"), "{msg}");
    }

    #[test]
    fn an_estimated_close_is_marked() {
        let (_, msg) = starved(24, 24, None, (estimate_forced(crate::generation::QWEN_BUDGET_BRIDGE), false), BIG);
        assert!(msg.contains("≈"), "{msg}");
    }

    #[test]
    fn an_answer_cut_by_its_own_budget_is_not_fixed_by_max_tokens() {
        assert_eq!(truncated(100, true, BIG).max_tokens, None);
        assert_eq!(truncated(100, false, BIG).max_tokens, Some(612));
    }
}
