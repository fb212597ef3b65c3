//! `$XDG_CONFIG_HOME/deltascope/config.toml`: the workbench's defaults other than keys
//! (those are in `keymap.toml`). Flags given on the command line win over it.

use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The theme when `--theme` is not given: a built-in name, a user theme or a file.
    pub theme: Option<String>,
    /// Where sessions are autosaved when `--sessions-dir` is not given.
    pub sessions_dir: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
#[error("{file}: {}", deltascope_model::brief(message))]
pub struct ConfigError {
    file: String,
    message: String,
}

impl Config {
    /// Reads `path`; a missing file is the empty configuration.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(src) => Config::parse(&src, &file),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(e) => Err(ConfigError { file, message: e.to_string() }),
        }
    }

    pub fn parse(src: &str, file: &str) -> Result<Config, ConfigError> {
        // toml's message names the key ("unknown field `them`, expected …"); the line is ours.
        toml::from_str(src).map_err(|e| ConfigError { file: file.into(), message: toml_error(&e, src) })
    }
}

/// A TOML error in one line — `line 3, column 7: unknown field `them`, expected …` — where
/// toml's own Display draws the source line and a caret under it over several lines.
pub fn toml_error(e: &toml::de::Error, src: &str) -> String {
    let message = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
    match e.span() {
        Some(span) => {
            let mut at = span.start.min(src.len());
            while !src.is_char_boundary(at) {
                at -= 1;
            }
            let before = &src[..at];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            // The line itself names the key ("theme = 3"); toml's message often does not.
            let text = src.lines().nth(line - 1).unwrap_or("").trim();
            if text.is_empty() {
                format!("line {line}, column {column}: {message}")
            } else {
                format!("line {line} `{}`, column {column}: {message}", deltascope_model::clip(text))
            }
        }
        None => message,
    }
}

pub fn default_config_path() -> Option<PathBuf> {
    dirs::config_dir().map(|d| d.join("deltascope").join("config.toml"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_known_keys() {
        let c = Config::parse("theme = \"light\"\nsessions_dir = \"/tmp/s\"\n", "config.toml").unwrap();
        assert_eq!(c, Config { theme: Some("light".into()), sessions_dir: Some("/tmp/s".into()) });
        assert_eq!(Config::parse("", "config.toml").unwrap(), Config::default());
    }

    #[test]
    fn errors_name_the_file_and_the_key() {
        let e = Config::parse("them = \"light\"\n", "/x/config.toml").unwrap_err().to_string();
        assert!(e.starts_with("/x/config.toml: ") && e.contains("unknown field `them`"), "{e}");
        let e = Config::parse("theme = 3\n", "/x/config.toml").unwrap_err().to_string();
        assert!(e.contains("theme") && e.contains("string"), "{e}");
    }

    #[test]
    fn a_missing_file_is_the_empty_configuration() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Config::load(&dir.path().join("config.toml")).unwrap(), Config::default());
    }
}
