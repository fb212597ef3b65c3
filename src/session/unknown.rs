//! Which fields of a session file this build would drop on a rewrite: the file as read,
//! compared with the session written back. Sessions and turns keep unknown top-level fields
//! themselves (`extra`); this finds the ones deeper down (inside parameters, statistics,
//! tokens), so that such a file is not overwritten.

use serde_json::Value;

/// At most this many paths are reported (the message must stay readable).
const MAX_REPORTED: usize = 5;

/// Paths (`turns[0].params.sampling.typical_p`) of fields in `original` that `rewritten`
/// lacks. A field holding an empty value (null, false, 0, "", [], {}) is not counted: this
/// build leaves out its own fields when they hold their default, and nothing is lost there.
pub fn dropped(original: &Value, rewritten: &Value) -> Vec<String> {
    let mut out = vec![];
    walk(original, rewritten, &mut String::new(), &mut out);
    out
}

fn walk(a: &Value, b: &Value, path: &mut String, out: &mut Vec<String>) {
    if out.len() >= MAX_REPORTED {
        return;
    }
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                match b.get(k) {
                    Some(w) => walk(v, w, path, out),
                    None if !is_empty(v) && out.len() < MAX_REPORTED => out.push(path.clone()),
                    None => {}
                }
                path.truncate(len);
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                walk(v, w, path, out);
                path.truncate(len);
            }
        }
        // Different shapes are a format change this build made itself (version 2's token
        // records become version 3's columns), not fields it does not know.
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_fields_the_rewrite_lacks_but_not_empty_defaults() {
        let original = json!({"a": 1, "turns": [{"params": {"t": 0.5, "typical_p": 0.9, "gone": null}}], "x": false});
        let rewritten = json!({"a": 1, "turns": [{"params": {"t": 0.5}}]});
        assert_eq!(dropped(&original, &rewritten), ["turns[0].params.typical_p"]);
        assert!(dropped(&json!({"tokens": [{"id": 1}]}), &json!({"tokens": {"id": [1]}})).is_empty());
    }
}
