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
#[error("{file}: {message}")]
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
        // toml's message names the key and the line ("unknown field `them`, expected …").
        toml::from_str(src).map_err(|e| ConfigError { file: file.into(), message: e.to_string().trim().into() })
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
