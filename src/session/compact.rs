//! The compact on-disk form of a turn's tokens (format versions 3 and 4; 4 adds `entropy`): one array per field instead
//! of one object per token, so the field names are written once per turn, not once per token.
//!
//! ```json
//! "tokens": {
//!   "t_ms": [12.5, 13.1],  "phase": "tt",  "text": ["Check", " divisors"],
//!   "id": [413, 410],  "logprob": [-0.01, -0.2],  "draft": "-a",  "forced": [],
//!   "top": [[[413, -0.01, "Check"], [373, -4.7, "Pick"]], []]
//! }
//! ```
//!
//! `phase` has one letter per token (`t` thinking, `a` answer); `draft` one per token (`-`
//! not drafted, `a` an accepted draft, `b` the verify pass's bonus token, `.` unknown); `id`
//! and `logprob` hold `null` where a server sent none; `forced` lists the positions of tokens
//! the engine injected; `top` is each token's alternatives as `[id, logprob, text]`; `index`
//! lists `[position, index]` only where a token's index is not its position. Columns that
//! would say nothing (no ids, no provenance, no alternatives) are left out. Version 1 and 2
//! files, with one object per token, still load.

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Timed;
use deltascope_protocol::{Alternative, DraftKind, Phase, TokenEvent};

/// An alternative as stored: `[id, logprob, text]`, or `null` for the token itself (the
/// sampled token is usually its own first alternative: written once, not twice).
type Alt = Option<(Option<u32>, f32, String)>;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Columns {
    t_ms: Vec<f64>,
    phase: String,
    text: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    id: Vec<Option<u32>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    logprob: Vec<Option<f32>>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    draft: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    forced: Vec<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    top: Vec<Vec<Alt>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    index: Vec<(usize, usize)>,
    /// Each token's entropy in nats (format 4; `null` where none was measured).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    entropy: Vec<Option<f32>>,
}

fn draft_letter(d: Option<DraftKind>) -> char {
    match d {
        None => '.',
        Some(DraftKind::None) => '-',
        Some(DraftKind::Accepted) => 'a',
        Some(DraftKind::Bonus) => 'b',
    }
}

fn draft_kind(c: char) -> Result<Option<DraftKind>, String> {
    Ok(match c {
        '.' => None,
        '-' => Some(DraftKind::None),
        'a' => Some(DraftKind::Accepted),
        'b' => Some(DraftKind::Bonus),
        other => return Err(format!("tokens.draft: unknown letter {other:?} (expected . - a b)")),
    })
}

impl Columns {
    fn of(tokens: &[Timed<TokenEvent>]) -> Columns {
        let mut c = Columns::default();
        for (pos, t) in tokens.iter().enumerate() {
            c.t_ms.push(t.t_ms);
            c.phase.push(if t.phase == Phase::Answer { 'a' } else { 't' });
            c.text.push(t.text.clone());
            c.id.push(t.id);
            c.logprob.push(t.logprob);
            c.entropy.push(t.entropy);
            c.draft.push(draft_letter(t.draft));
            if t.forced {
                c.forced.push(pos);
            }
            let itself = |a: &Alternative| a.id == t.id && Some(a.logprob) == t.logprob && a.text == t.text;
            c.top.push(
                t.top_logprobs
                    .iter()
                    .map(|a| if itself(a) { None } else { Some((a.id, a.logprob, a.text.clone())) })
                    .collect(),
            );
            if t.index != pos {
                c.index.push((pos, t.index));
            }
        }
        // Columns that say nothing are left out.
        if c.id.iter().all(Option::is_none) {
            c.id.clear();
        }
        if c.logprob.iter().all(Option::is_none) {
            c.logprob.clear();
        }
        if c.entropy.iter().all(Option::is_none) {
            c.entropy.clear();
        }
        if c.draft.chars().all(|d| d == '.') {
            c.draft.clear();
        }
        if c.top.iter().all(Vec::is_empty) {
            c.top.clear();
        }
        c
    }

    fn into_tokens(self) -> Result<Vec<Timed<TokenEvent>>, String> {
        let n = self.t_ms.len();
        let phases: Vec<char> = self.phase.chars().collect();
        let drafts: Vec<char> = self.draft.chars().collect();
        for (name, len, optional) in [
            ("phase", phases.len(), false),
            ("text", self.text.len(), false),
            ("id", self.id.len(), true),
            ("logprob", self.logprob.len(), true),
            ("entropy", self.entropy.len(), true),
            ("draft", drafts.len(), true),
            ("top", self.top.len(), true),
        ] {
            if len != n && !(optional && len == 0) {
                return Err(format!("tokens.{name} has {len} entries, tokens.t_ms has {n}"));
            }
        }
        if let Some(&p) = self.forced.iter().chain(self.index.iter().map(|(p, _)| p)).find(|&&p| p >= n) {
            return Err(format!("tokens: position {p} is past the {n} tokens"));
        }
        let mut top = self.top.into_iter();
        let mut out = Vec::with_capacity(n);
        for (pos, (t_ms, text)) in self.t_ms.into_iter().zip(self.text).enumerate() {
            let phase = match phases[pos] {
                't' => Phase::Thinking,
                'a' => Phase::Answer,
                other => return Err(format!("tokens.phase: unknown letter {other:?} (expected t or a)")),
            };
            let id = self.id.get(pos).copied().flatten();
            let logprob = self.logprob.get(pos).copied().flatten();
            let top_logprobs = top
                .next()
                .unwrap_or_default()
                .into_iter()
                .map(|alt| match (alt, logprob) {
                    (Some((id, logprob, text)), _) => Ok(Alternative { id, logprob, text }),
                    (None, Some(logprob)) => Ok(Alternative { id, logprob, text: text.clone() }),
                    (None, None) => {
                        Err(format!("tokens.top[{pos}]: null (the token itself) on a token without a logprob"))
                    }
                })
                .collect::<Result<_, _>>()?;
            let draft = drafts.get(pos).map_or(Ok(None), |&c| draft_kind(c))?;
            let entropy = self.entropy.get(pos).copied().flatten();
            let ev = TokenEvent { index: pos, phase, id, text, logprob, draft, forced: false, top_logprobs, entropy };
            out.push(Timed { t_ms, ev });
        }
        for p in self.forced {
            out[p].ev.forced = true;
        }
        for (p, index) in self.index {
            out[p].ev.index = index;
        }
        Ok(out)
    }
}

/// `#[serde(with = "compact::tokens")]` on a turn's token list.
pub mod tokens {
    use super::*;

    pub fn serialize<S: Serializer>(tokens: &[Timed<TokenEvent>], s: S) -> Result<S::Ok, S::Error> {
        Columns::of(tokens).serialize(s)
    }

    /// The columns (version 3), or one object per token (versions 1 and 2).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Timed<TokenEvent>>, D::Error> {
        struct Either;
        impl<'de> Visitor<'de> for Either {
            type Value = Vec<Timed<TokenEvent>>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("token columns (an object) or token records (a list)")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Deserialize::deserialize(de::value::SeqAccessDeserializer::new(seq))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                let c: Columns = Deserialize::deserialize(de::value::MapAccessDeserializer::new(map))?;
                c.into_tokens().map_err(de::Error::custom)
            }
        }
        d.deserialize_any(Either)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(index: usize, phase: Phase, id: Option<u32>, draft: Option<DraftKind>, forced: bool) -> Timed<TokenEvent> {
        Timed {
            t_ms: index as f64 * 1.5,
            ev: TokenEvent {
                index,
                phase,
                id,
                text: format!("t{index}\"\n"),
                logprob: id.map(|i| -(i as f32) / 7.0),
                draft,
                forced,
                top_logprobs: id
                    .map(|i| {
                        let itself =
                            Alternative { id: Some(i), logprob: -(i as f32) / 7.0, text: format!("t{index}\"\n") };
                        vec![itself, Alternative { id: Some(i + 1), logprob: -0.1, text: "x".into() }]
                    })
                    .unwrap_or_default(),
                entropy: id.map(|i| i as f32 / 3.0),
            },
        }
    }

    #[test]
    fn columns_round_trip_every_field() {
        let tokens = vec![
            token(0, Phase::Thinking, Some(5), Some(DraftKind::None), false),
            token(1, Phase::Thinking, Some(6), Some(DraftKind::Accepted), false),
            token(2, Phase::Answer, None, None, true),
            token(7, Phase::Answer, Some(9), Some(DraftKind::Bonus), false),
        ];
        let json = serde_json::to_string(&Columns::of(&tokens)).unwrap();
        let back = Columns::into_tokens(serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(back, tokens);
        assert!(json.contains(r#""phase":"ttaa""#) && json.contains(r#""draft":"-a.b""#), "{json}");
        assert!(json.contains(r#""forced":[2]"#) && json.contains(r#""index":[[3,7]]"#), "{json}");
        // The token's own entry among its alternatives is written as null.
        assert!(json.contains(r#""top":[[null,[6,-0.1,"x"]],"#), "{json}");
    }

    #[test]
    fn columns_that_say_nothing_are_left_out() {
        let tokens = vec![token(0, Phase::Answer, None, None, false)];
        let json = serde_json::to_string(&Columns::of(&tokens)).unwrap();
        assert_eq!(json, r#"{"t_ms":[0.0],"phase":"a","text":["t0\"\n"]}"#);
    }

    #[test]
    fn damaged_columns_are_errors_not_panics() {
        let bad = |json: &str| Columns::into_tokens(serde_json::from_str(json).unwrap()).unwrap_err();
        assert_eq!(
            bad(r#"{"t_ms":[1,2],"phase":"t","text":["a","b"]}"#),
            "tokens.phase has 1 entries, tokens.t_ms has 2"
        );
        assert_eq!(
            bad(r#"{"t_ms":[1],"phase":"x","text":["a"]}"#),
            "tokens.phase: unknown letter 'x' (expected t or a)"
        );
        assert_eq!(
            bad(r#"{"t_ms":[1],"phase":"t","text":["a"],"forced":[4]}"#),
            "tokens: position 4 is past the 1 tokens"
        );
    }
}
