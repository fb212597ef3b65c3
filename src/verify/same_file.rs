//! "Same file": whether the server runs the very GGUF the reference reads, judged from what
//! llama.cpp says of its model (`/v1/models` `meta.size`, `meta.n_params`, `meta.ftype`) and
//! what the file's own tensors add up to. With the same bytes on both sides, quantisation
//! cannot explain a divergence: what is left is the server's kernels and graph.

use serde::Serialize;

use crate::backend::ModelIdentity;

/// The judgement, with the facts it rests on.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum SameFile {
    /// Every fact both sides state agrees (and at least one is stated).
    Same { agree: Vec<String> },
    /// A fact differs: the server runs another file (or another quantisation of it).
    Different { differ: Vec<String>, agree: Vec<String> },
    /// The server states nothing to compare.
    CannotTell { why: String },
}

impl SameFile {
    /// One line for the report.
    pub fn line(&self) -> String {
        match self {
            SameFile::Same { agree } => format!("same file: yes ({})", agree.join(", ")),
            SameFile::Different { differ, agree } => {
                let also = if agree.is_empty() { String::new() } else { format!("; agreeing: {}", agree.join(", ")) };
                format!(
                    "same file: NO — {}{also}: the reference is not the file the server runs, so quantisation and serving errors mix",
                    differ.join(", ")
                )
            }
            SameFile::CannotTell { why } => format!("same file: cannot tell ({why})"),
        }
    }
}

/// Judges `server` against the reference GGUF `file` (`None` when the reference is not a
/// GGUF: nothing to judge).
pub fn judge(file: &ModelIdentity, server: &ModelIdentity) -> Option<SameFile> {
    let (bytes, values) = (file.file_bytes?, file.file_values?);
    let (mut agree, mut differ) = (vec![], vec![]);
    let mut compare = |what: &str, ours: String, theirs: Option<String>| match theirs {
        Some(t) if t == ours => agree.push(format!("{what} {ours}")),
        Some(t) => differ.push(format!("{what}: the file {ours}, the server {t}")),
        None => {}
    };
    compare("tensor bytes", bytes.to_string(), server.file_bytes.map(|b| b.to_string()));
    // llama.cpp's `n_params` counts every tensor of the file; deltascope serve says so apart.
    compare("parameters", values.to_string(), server.file_values.or(server.params).map(|p| p.to_string()));
    if let Some(ft) = &file.file_type {
        compare("type", ft.clone(), server.file_type.as_deref().map(short_type));
    }
    if let (Some(a), Some(b)) = (file.vocab_size, server.vocab_size) {
        compare("vocabulary", a.to_string(), Some(b.to_string()));
    }
    if agree.is_empty() && differ.is_empty() {
        return Some(SameFile::CannotTell {
            why:
                "the server states neither its file's size, parameter count nor type (llama.cpp's /v1/models meta does)"
                    .into(),
        });
    }
    // The file name alone proves nothing (a copy can be renamed); it is said when it agrees.
    if server.name_is_file && base(&server.name) == base(&file.name) {
        agree.push(format!("file name {}", base(&file.name)));
    }
    Some(if differ.is_empty() { SameFile::Same { agree } } else { SameFile::Different { differ, agree } })
}

/// llama.cpp's `llama_model_ftype_name` ("Q4_K - Medium", "IQ4_XS - 4.25 bpw", "all F32",
/// "MXFP4 MoE") as the file type is named everywhere else ("Q4_K_M", "IQ4_XS", "F32",
/// "MXFP4_MOE").
fn short_type(name: &str) -> String {
    let (base, size) = name.split_once(" - ").unwrap_or((name, ""));
    let suffix = match size {
        "Small" => "_S",
        "Medium" => "_M",
        "Large" => "_L",
        _ => "",
    };
    match base {
        "all F32" => "F32".into(),
        "MXFP4 MoE" => "MXFP4_MOE".into(),
        b => format!("{b}{suffix}"),
    }
}

fn base(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> ModelIdentity {
        ModelIdentity {
            name: "/models/demo.gguf".into(),
            vocab_size: Some(512),
            file_bytes: Some(8086080),
            file_values: Some(4029072),
            file_type: Some("F16".into()),
            ..Default::default()
        }
    }

    fn llama(size: u64, params: u64, ftype: &str) -> ModelIdentity {
        ModelIdentity {
            file_bytes: Some(size),
            params: Some(params),
            file_type: Some(ftype.into()),
            vocab_size: Some(512),
            ..ModelIdentity::named("target/demo.gguf")
        }
    }

    #[test]
    fn the_same_sizes_and_type_are_the_same_file() {
        let j = judge(&file(), &llama(8086080, 4029072, "F16")).unwrap();
        assert!(matches!(&j, SameFile::Same { agree } if agree.len() == 5), "{j:?}");
        assert!(j.line().starts_with("same file: yes (tensor bytes 8086080, parameters 4029072, type F16"));
    }

    #[test]
    fn another_quantisation_of_the_same_model_is_not() {
        let j = judge(&file(), &llama(4_500_000, 4029072, "Q8_0")).unwrap();
        let SameFile::Different { differ, agree } = &j else { panic!("{j:?}") };
        assert_eq!(differ.len(), 2, "{differ:?}");
        assert!(agree.iter().any(|a| a.starts_with("parameters")));
        assert!(j.line().contains("the file F16, the server Q8_0"));
    }

    #[test]
    fn llama_cpps_type_names_read_as_the_files() {
        for (theirs, ours) in [
            ("Q4_K - Medium", "Q4_K_M"),
            ("Q5_K - Small", "Q5_K_S"),
            ("Q3_K - Large", "Q3_K_L"),
            ("IQ4_XS - 4.25 bpw", "IQ4_XS"),
            ("Q8_0", "Q8_0"),
            ("F16", "F16"),
            ("all F32", "F32"),
            ("MXFP4 MoE", "MXFP4_MOE"),
        ] {
            assert_eq!(short_type(theirs), ours);
        }
    }

    #[test]
    fn a_server_that_states_nothing_cannot_be_told_apart() {
        let j = judge(&file(), &ModelIdentity::named("qwen")).unwrap();
        assert!(matches!(j, SameFile::CannotTell { .. }));
        // A safetensors reference: nothing to judge.
        assert_eq!(judge(&ModelIdentity::default(), &llama(1, 1, "F16")), None);
    }
}
