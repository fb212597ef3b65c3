//! A server's logprob entries: one per token, with its id when the server gives it.

use serde_json::Value;

use deltascope_protocol::Alternative;

/// One token's logprob entry as servers send it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub id: Option<u32>,
    pub text: String,
    pub logprob: Option<f32>,
    pub top: Vec<Alternative>,
    /// The server named the token `token_id:N` (vLLM's `return_tokens_as_token_ids`): its
    /// text is the frame's, filled in by [`assign_entries`].
    pub placeholder: bool,
}

/// vLLM's `return_tokens_as_token_ids` names a token `token_id:N` instead of its text.
fn placeholder_id(token: &str) -> Option<u32> {
    token.strip_prefix("token_id:")?.parse().ok()
}

/// The logprob entries of a choice (`logprobs.content`), each with its alternatives.
pub fn logprob_entries(choice: &Value) -> Vec<Entry> {
    let Some(list) = choice.pointer("/logprobs/content").and_then(Value::as_array) else { return vec![] };
    // llama.cpp names the id `id`, deltascope `token_id`; vLLM asked for ids puts it in `token`.
    let token = |v: &Value| v.get("token").and_then(Value::as_str).unwrap_or("").to_string();
    let id = |v: &Value| {
        v.get("id")
            .or_else(|| v.get("token_id"))
            .and_then(Value::as_u64)
            .map(|i| i as u32)
            .or_else(|| placeholder_id(&token(v)))
    };
    let text = token;
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
            placeholder: placeholder_id(&text(e)).is_some(),
        })
        .collect()
}

/// Splits a frame's entries between its reasoning and content texts (vLLM may put both in
/// one frame). Entries that do not add up to the texts are dropped rather than misassigned.
pub fn assign_entries(mut entries: Vec<Entry>, reasoning: &str, content: &str) -> (Vec<Entry>, Vec<Entry>) {
    // Tokens named by id only: the frame's text is theirs (one token a frame, unless the server
    // drafts: then the first carries the frame's text and the others none, their ids kept).
    if !entries.is_empty() && entries.iter().all(|e| e.placeholder) {
        for (i, e) in entries.iter_mut().enumerate() {
            e.text = if i == 0 { format!("{reasoning}{content}") } else { String::new() };
        }
    }
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn vllm_token_id_placeholders_carry_the_id_and_take_the_frames_text() {
        let choice = json!({"logprobs": {"content": [{"token": "token_id:413", "logprob": -0.5,
            "top_logprobs": [{"token": "token_id:413", "logprob": -0.5}, {"token": "token_id:295", "logprob": -3.0}]}]}});
        let entries = logprob_entries(&choice);
        assert_eq!(entries[0].id, Some(413));
        assert!(entries[0].placeholder);
        assert_eq!(entries[0].top.iter().map(|a| a.id).collect::<Vec<_>>(), vec![Some(413), Some(295)]);
        let (thinking, answer) = assign_entries(entries, "Add", "");
        assert_eq!((thinking.len(), answer.len()), (1, 0));
        assert_eq!(thinking[0].text, "Add", "the frame's text");
        // A text that merely looks like one is not a placeholder.
        let plain = json!({"logprobs": {"content": [{"token": "token_id:x", "logprob": -0.1}]}});
        let e = logprob_entries(&plain);
        assert_eq!((e[0].id, e[0].placeholder, e[0].text.as_str()), (None, false, "token_id:x"));
    }
}
