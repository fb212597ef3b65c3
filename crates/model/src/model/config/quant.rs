//! `quantization_config`: the FP8 format Qwen publishes (`quant_method: "fp8"`, e4m3,
//! `weight_block_size: [128, 128]`, `activation_scheme: "dynamic"`) is read; anything else is
//! refused by name, never loaded as if it were bf16.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::model::fp8::{BLOCK, Fp8Format};

/// The keys of an FP8 `quantization_config` this reader knows.
const KNOWN: [&str; 6] =
    ["quant_method", "fmt", "weight_block_size", "activation_scheme", "modules_to_not_convert", "ignored_layers"];

/// `value` is the `quantization_config` found at `path` (`quantization_config` or
/// `text_config.quantization_config`) of `file`; `None` and `null` mean an unquantised model.
pub(super) fn fp8_format(value: Option<&Value>, path: &str, file: &str) -> Result<Option<Fp8Format>> {
    let Some(v) = value.filter(|v| !v.is_null()) else { return Ok(None) };
    let key = |k: &str| format!("{path}.{k}");
    let err = |k: &str, message: String| Error::field(file, &key(k), message);
    let Some(obj) = v.as_object() else {
        return Err(Error::field(file, path, format!("expected an object, found {v}")));
    };
    let text = |k: &str| -> Result<Option<&str>> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(err(k, format!("expected a string, found {other}"))),
        }
    };
    match text("quant_method")? {
        Some("fp8") => {}
        Some(m) => {
            return Err(err(
                "quant_method",
                format!(
                    "\"{}\" is not supported: deltascope loads bf16, f16 and f32 checkpoints, and FP8 ones as Qwen publishes them (quant_method \"fp8\")",
                    crate::error::brief(m)
                ),
            ));
        }
        None => return Err(err("quant_method", "missing: which quantisation is this checkpoint in?".into())),
    }
    match text("fmt")? {
        None | Some("e4m3") => {}
        Some(f) => {
            return Err(err(
                "fmt",
                format!("\"{}\" is not supported (Qwen's FP8 releases are \"e4m3\")", crate::error::brief(f)),
            ));
        }
    }
    match obj.get("weight_block_size") {
        Some(Value::Array(a)) if a.len() == 2 && a.iter().all(|d| d.as_u64() == Some(BLOCK as u64)) => {}
        None | Some(Value::Null) => {
            return Err(err(
                "weight_block_size",
                format!("missing: per-tensor FP8 scales are not supported, only [{BLOCK}, {BLOCK}] blocks"),
            ));
        }
        Some(other) => {
            return Err(err(
                "weight_block_size",
                format!("{other} is not supported: deltascope reads [{BLOCK}, {BLOCK}] blocks (as Qwen publishes)"),
            ));
        }
    }
    match text("activation_scheme")? {
        None | Some("dynamic") => {}
        Some(s) => {
            return Err(err(
                "activation_scheme",
                format!(
                    "\"{}\" is not supported: with \"dynamic\" no activation scales are stored, which is what deltascope reads",
                    crate::error::brief(s)
                ),
            ));
        }
    }
    let mut modules = vec![];
    for k in ["modules_to_not_convert", "ignored_layers"] {
        match obj.get(k) {
            None | Some(Value::Null) => {}
            Some(Value::Array(a)) => {
                for (i, m) in a.iter().enumerate() {
                    let Some(m) = m.as_str() else {
                        return Err(err(&format!("{k}[{i}]"), format!("expected a module name, found {m}")));
                    };
                    modules.push(m.to_string());
                }
            }
            Some(other) => return Err(err(k, format!("expected a list of module names, found {other}"))),
        }
    }
    if let Some(unknown) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(err(
            unknown,
            format!(
                "unknown key in an FP8 quantization_config (known: {}): refused rather than guessed at",
                KNOWN.join(", ")
            ),
        ));
    }
    Ok(Some(Fp8Format { modules_to_not_convert: modules }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Value) -> std::result::Result<Option<Fp8Format>, String> {
        fp8_format(Some(&v), "quantization_config", "config.json").map_err(|e| e.to_string())
    }

    /// Qwen3-Next-80B-A3B-Instruct-FP8's keys (docs/fp8-checkpoints.md §1c), list trimmed.
    #[test]
    fn qwens_published_config_is_read() {
        let q = read(json!({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head", "mtp.fc"]}))
        .unwrap()
        .unwrap();
        assert_eq!(q.modules_to_not_convert, ["lm_head", "mtp.fc"]);
        // Qwen3-8B-FP8 has no list at all.
        let q = read(json!({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [128, 128]}))
        .unwrap()
        .unwrap();
        assert!(q.modules_to_not_convert.is_empty());
        assert_eq!(fp8_format(None, "quantization_config", "c").unwrap(), None);
        assert_eq!(fp8_format(Some(&Value::Null), "quantization_config", "c").unwrap(), None);
    }

    #[test]
    fn every_other_format_is_refused_by_its_field() {
        let base = json!({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"});
        let with = |k: &str, v: Value| {
            let mut c = base.clone();
            c[k] = v;
            read(c).unwrap_err()
        };
        for (k, v, says) in [
            ("quant_method", json!("awq"), "`quantization_config.quant_method`: \"awq\" is not supported"),
            ("quant_method", json!("gptq"), "\"gptq\" is not supported"),
            ("fmt", json!("e5m2"), "`quantization_config.fmt`: \"e5m2\" is not supported"),
            ("weight_block_size", json!([64, 64]), "`quantization_config.weight_block_size`: [64,64] is not supported"),
            ("weight_block_size", json!([128, 64]), "[128,64] is not supported"),
            ("weight_block_size", Value::Null, "per-tensor FP8 scales are not supported"),
            (
                "activation_scheme",
                json!("static"),
                "`quantization_config.activation_scheme`: \"static\" is not supported",
            ),
            ("modules_to_not_convert", json!("lm_head"), "expected a list of module names"),
            ("weight_per_tensor", json!(true), "`quantization_config.weight_per_tensor`: unknown key"),
        ] {
            let e = with(k, v);
            assert!(e.contains(says), "{k}: {e}");
            assert!(e.contains("config.json"), "{e}");
        }
        let mut no_method = base.clone();
        no_method.as_object_mut().unwrap().remove("quant_method");
        assert!(read(no_method).unwrap_err().contains("quant_method`: missing"));
        assert!(read(json!([1])).unwrap_err().contains("expected an object"));
    }
}
