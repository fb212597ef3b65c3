//! A server's logprob entries: one per token, with its id when the server gives it.

use serde_json::Value;

use crate::generation::Alternative;

/// One token's logprob entry as servers send it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub id: Option<u32>,
    pub text: String,
    pub logprob: Option<f32>,
    pub top: Vec<Alternative>,
}

/// The logprob entries of a choice (`logprobs.content`), each with its alternatives.
pub fn logprob_entries(choice: &Value) -> Vec<Entry> {
    let Some(list) = choice.pointer("/logprobs/content").and_then(Value::as_array) else { return vec![] };
    // llama.cpp names the id `id`, deltascope `token_id`.
    let id = |v: &Value| v.get("id").or_else(|| v.get("token_id")).and_then(Value::as_u64).map(|i| i as u32);
    let text = |v: &Value| v.get("token").and_then(Value::as_str).unwrap_or("").to_string();
    let lp = |v: &Value| v.get("logprob").and_then(Value::as_f64).map(|l| l as f32);
    list.iter()
        .map(|e| Entry {
            id: id(e),
            text: text(e),
            logprob: lp(e),
            top: e
                .get("top_logprobs")
                .and_then(Value::as_array)
                .map(|alts| {
                    alts.iter()
                        .map(|a| Alternative { id: id(a), logprob: lp(a).unwrap_or(f32::NEG_INFINITY), text: text(a) })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect()
}

/// Splits a frame's entries between its reasoning and content texts (vLLM may put both in
/// one frame). Entries that do not add up to the texts are dropped rather than misassigned.
pub fn assign_entries(entries: Vec<Entry>, reasoning: &str, content: &str) -> (Vec<Entry>, Vec<Entry>) {
    let joined: String = entries.iter().map(|e| e.text.as_str()).collect();
    if entries.is_empty() {
        return (vec![], vec![]);
    }
    if joined == format!("{reasoning}{content}") {
        let mut used = 0;
        let mut r = vec![];
        let mut c = vec![];
        for e in entries {
            if used < reasoning.len() {
                used += e.text.len();
                r.push(e);
            } else {
                c.push(e);
            }
        }
        return (r, c);
    }
    // A server that re-sends the prompt's `<think>\n` lists only the generated token.
    if reasoning.is_empty() && content.ends_with(&joined) {
        return (vec![], entries);
    }
    (vec![], vec![])
}
