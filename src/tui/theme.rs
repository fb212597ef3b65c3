//! Colour themes: `themes/*.toml` embedded at build time (dark, light, high-contrast), plus
//! user themes in `$XDG_CONFIG_HOME/deltascope/themes/NAME.toml`. A user theme may say
//! `extends = "dark"` and override single keys. Errors name the file and the key.

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use ratatui::style::{Color, Modifier, Style};
use syntect::highlighting::ThemeSet;

/// syntect's built-in code themes (a theme's `code_theme` names one; the answer pane's
/// highlighter draws with it).
pub(crate) static CODE_THEMES: LazyLock<ThemeSet> = LazyLock::new(ThemeSet::load_defaults);

/// The names a theme's `code_theme` may take (syntect's built-in themes).
pub fn code_themes() -> impl Iterator<Item = &'static str> {
    CODE_THEMES.themes.keys().map(String::as_str)
}

/// The embedded themes: (name, TOML source).
pub const BUILTIN: [(&str, &str); 3] = [
    ("dark", include_str!("../../themes/dark.toml")),
    ("light", include_str!("../../themes/light.toml")),
    ("high-contrast", include_str!("../../themes/high-contrast.toml")),
];

#[derive(Debug, Clone, PartialEq)]
pub struct Theme {
    pub name: String,
    /// A syntect theme name for code blocks.
    pub code_theme: String,
    pub text: Color,
    pub dim: Color,
    pub border: Color,
    pub border_focus: Color,
    pub title: Color,
    pub prompt: Color,
    pub thinking: Color,
    pub answer: Color,
    pub headroom: Color,
    pub budget_marker: Color,
    pub accent: Color,
    pub good: Color,
    pub warn: Color,
    pub bad: Color,
    pub forced: Color,
    pub accepted: Color,
    pub bonus: Color,
    pub loop_bg: Color,
    pub cursor_bg: Color,
    pub selection_bg: Color,
    pub heading: Color,
    pub inline_code: Color,
    pub banner_bg: Color,
    /// The State view's colour scale, low to high (`scale_0` … `scale_4`): five steps that
    /// each theme picks to read on its own background.
    pub scale: [Color; 5],
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ThemeError {
    #[error("{file}: not valid TOML: {}", deltascope_model::brief(message))]
    Toml { file: String, message: String },
    #[error(
        "{file}: [colors] {} = \"{}\": not a colour (use a name like light-blue, an index 0-255 or #rrggbb)",
        deltascope_model::brief(key),
        deltascope_model::brief(value)
    )]
    BadColor { file: String, key: String, value: String },
    #[error("{file}: unknown key `{}` (known keys: {known})", deltascope_model::brief(key))]
    UnknownKey { file: String, key: String, known: String },
    #[error("{file}: `{}` must be a string", deltascope_model::brief(key))]
    NotAString { file: String, key: String },
    #[error(
        "unknown theme `{}` (built in: dark, light, high-contrast; user themes: {dir})",
        deltascope_model::brief(name)
    )]
    Unknown { name: String, dir: String },
    #[error("{file}: theme extends itself (`extends = \"{}\"`)", deltascope_model::brief(name))]
    Cycle { file: String, name: String },
    #[error("cannot read theme {file}: {message}")]
    Read { file: String, message: String },
    #[error("{file}: code_theme = \"{}\": not a code theme (known: {known})", deltascope_model::brief(name))]
    UnknownCodeTheme { file: String, name: String, known: String },
}

const COLOR_KEYS: [&str; 28] = [
    "text",
    "dim",
    "border",
    "border_focus",
    "title",
    "prompt",
    "thinking",
    "answer",
    "headroom",
    "budget_marker",
    "accent",
    "good",
    "warn",
    "bad",
    "forced",
    "accepted",
    "bonus",
    "loop_bg",
    "cursor_bg",
    "selection_bg",
    "heading",
    "inline_code",
    "banner_bg",
    "scale_0",
    "scale_1",
    "scale_2",
    "scale_3",
    "scale_4",
];

impl Default for Theme {
    fn default() -> Self {
        // The embedded dark theme is checked by a unit test, so this cannot fail in practice;
        // the fallback keeps the program usable regardless.
        Theme::builtin("dark").unwrap_or_else(|_| Theme::plain())
    }
}

impl Theme {
    /// Terminal default colours only.
    fn plain() -> Theme {
        let c = Color::Reset;
        Theme {
            name: "plain".into(),
            code_theme: "base16-ocean.dark".into(),
            text: c,
            dim: Color::DarkGray,
            border: c,
            border_focus: Color::Yellow,
            title: c,
            prompt: Color::Blue,
            thinking: Color::Magenta,
            answer: c,
            headroom: Color::DarkGray,
            budget_marker: Color::Red,
            accent: Color::Cyan,
            good: Color::Green,
            warn: Color::Yellow,
            bad: Color::Red,
            forced: Color::Magenta,
            accepted: Color::Green,
            bonus: Color::Cyan,
            loop_bg: Color::Red,
            cursor_bg: Color::Blue,
            selection_bg: Color::DarkGray,
            heading: Color::Yellow,
            inline_code: Color::Yellow,
            banner_bg: Color::Black,
            scale: [Color::Blue, Color::Cyan, Color::Green, Color::Yellow, Color::Red],
        }
    }

    pub fn builtin(name: &str) -> Result<Theme, ThemeError> {
        let (_, src) = BUILTIN
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| ThemeError::Unknown { name: name.into(), dir: "-".into() })?;
        Theme::parse(src, &format!("themes/{name}.toml"), &|_| None)
    }

    /// Finds a theme by name: a user file in `user_dir` first (so a user may override a
    /// built-in), then the embedded ones. A path ending in `.toml` is read directly.
    pub fn load(name: &str, user_dir: Option<&Path>) -> Result<Theme, ThemeError> {
        Theme::load_depth(name, user_dir, 0)
    }

    fn load_depth(name: &str, user_dir: Option<&Path>, depth: usize) -> Result<Theme, ThemeError> {
        // `extends` chains through user files could loop (a → b → a); stop at a sane depth.
        if depth > 8 {
            return Err(ThemeError::Cycle { file: name.into(), name: name.into() });
        }
        if name.ends_with(".toml") {
            return Theme::from_file(Path::new(name), user_dir, depth);
        }
        if let Some(dir) = user_dir {
            let p = dir.join(format!("{name}.toml"));
            if p.is_file() {
                return Theme::from_file(&p, user_dir, depth);
            }
        }
        Theme::builtin(name).map_err(|_| ThemeError::Unknown {
            name: name.into(),
            dir: user_dir.map(|d| d.display().to_string()).unwrap_or_else(|| "none".into()),
        })
    }

    fn from_file(path: &Path, user_dir: Option<&Path>, depth: usize) -> Result<Theme, ThemeError> {
        let file = path.display().to_string();
        let src = std::fs::read_to_string(path)
            .map_err(|e| ThemeError::Read { file: file.clone(), message: e.to_string() })?;
        let own = path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        let base = |parent: &str| -> Option<Result<Theme, ThemeError>> {
            if parent == own {
                return Some(Err(ThemeError::Cycle { file: file.clone(), name: parent.into() }));
            }
            // Parents resolve among built-ins and other user files.
            Some(Theme::load_depth(parent, user_dir, depth + 1))
        };
        Theme::parse(&src, &file, &base)
    }

    /// Parses a theme; `parent` resolves `extends = "NAME"`.
    pub fn parse(
        src: &str,
        file: &str,
        parent: &dyn Fn(&str) -> Option<Result<Theme, ThemeError>>,
    ) -> Result<Theme, ThemeError> {
        let table: toml::Table = toml::from_str(src)
            .map_err(|e| ThemeError::Toml { file: file.into(), message: crate::tui::config::toml_error(&e, src) })?;
        let string = |key: &str| -> Result<Option<String>, ThemeError> {
            match table.get(key) {
                None => Ok(None),
                Some(toml::Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(ThemeError::NotAString { file: file.into(), key: key.into() }),
            }
        };
        for key in table.keys() {
            if !["name", "extends", "code_theme", "colors"].contains(&key.as_str()) {
                return Err(ThemeError::UnknownKey {
                    file: file.into(),
                    key: key.clone(),
                    known: "name, extends, code_theme, [colors]".into(),
                });
            }
        }
        let mut theme = match string("extends")? {
            Some(p) => match parent(&p) {
                Some(r) => r?,
                None => Theme::builtin(&p)?,
            },
            None => Theme::plain(),
        };
        if let Some(n) = string("name")? {
            theme.name = n;
        }
        if let Some(c) = string("code_theme")? {
            // An unknown name would silently highlight code with some other theme.
            if !code_themes().any(|known| known == c) {
                return Err(ThemeError::UnknownCodeTheme {
                    file: file.into(),
                    name: c,
                    known: code_themes().collect::<Vec<_>>().join(", "),
                });
            }
            theme.code_theme = c;
        }
        if let Some(colors) = table.get("colors") {
            let Some(colors) = colors.as_table() else {
                return Err(ThemeError::NotAString { file: file.into(), key: "colors".into() });
            };
            for (key, value) in colors {
                let Some(v) = value.as_str() else {
                    return Err(ThemeError::NotAString { file: file.into(), key: format!("colors.{key}") });
                };
                let color: Color = v.parse().map_err(|_| ThemeError::BadColor {
                    file: file.into(),
                    key: key.clone(),
                    value: v.into(),
                })?;
                let Some(slot) = theme.slot(key) else {
                    return Err(ThemeError::UnknownKey {
                        file: file.into(),
                        key: format!("colors.{key}"),
                        known: COLOR_KEYS.join(", "),
                    });
                };
                *slot = color;
            }
        }
        Ok(theme)
    }

    fn slot(&mut self, key: &str) -> Option<&mut Color> {
        Some(match key {
            "text" => &mut self.text,
            "dim" => &mut self.dim,
            "border" => &mut self.border,
            "border_focus" => &mut self.border_focus,
            "title" => &mut self.title,
            "prompt" => &mut self.prompt,
            "thinking" => &mut self.thinking,
            "answer" => &mut self.answer,
            "headroom" => &mut self.headroom,
            "budget_marker" => &mut self.budget_marker,
            "accent" => &mut self.accent,
            "good" => &mut self.good,
            "warn" => &mut self.warn,
            "bad" => &mut self.bad,
            "forced" => &mut self.forced,
            "accepted" => &mut self.accepted,
            "bonus" => &mut self.bonus,
            "loop_bg" => &mut self.loop_bg,
            "cursor_bg" => &mut self.cursor_bg,
            "selection_bg" => &mut self.selection_bg,
            "heading" => &mut self.heading,
            "inline_code" => &mut self.inline_code,
            "banner_bg" => &mut self.banner_bg,
            "scale_0" => &mut self.scale[0],
            "scale_1" => &mut self.scale[1],
            "scale_2" => &mut self.scale[2],
            "scale_3" => &mut self.scale[3],
            "scale_4" => &mut self.scale[4],
            _ => return None,
        })
    }

    pub fn fg(&self, c: Color) -> Style {
        Style::new().fg(c)
    }

    pub fn border(&self, focused: bool) -> Style {
        if focused {
            Style::new().fg(self.border_focus).add_modifier(Modifier::BOLD)
        } else {
            Style::new().fg(self.border)
        }
    }

    pub fn title(&self) -> Style {
        Style::new().fg(self.title).add_modifier(Modifier::BOLD)
    }
}

/// `$XDG_CONFIG_HOME/deltascope/themes`.
pub fn user_theme_dir() -> Option<PathBuf> {
    dirs::config_dir().map(|d| d.join("deltascope").join("themes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_themes_parse() {
        for (name, _) in BUILTIN {
            let t = Theme::builtin(name).unwrap();
            assert_eq!(t.name, name);
        }
    }

    /// A colour's RGB (xterm's defaults for the 16 named colours).
    fn rgb(c: Color) -> (f64, f64, f64) {
        let (r, g, b) = match c {
            Color::Rgb(r, g, b) => (r, g, b),
            Color::Black => (0, 0, 0),
            Color::Red => (205, 0, 0),
            Color::Green => (0, 205, 0),
            Color::Yellow => (205, 205, 0),
            Color::Blue => (0, 0, 238),
            Color::Magenta => (205, 0, 205),
            Color::Cyan => (0, 205, 205),
            Color::Gray => (229, 229, 229),
            Color::DarkGray => (127, 127, 127),
            Color::LightRed => (255, 0, 0),
            Color::LightGreen => (0, 255, 0),
            Color::LightYellow => (255, 255, 0),
            Color::LightBlue => (92, 92, 255),
            Color::LightMagenta => (255, 0, 255),
            Color::LightCyan => (0, 255, 255),
            Color::White => (255, 255, 255),
            other => panic!("a scale colour must be named or #rrggbb: {other:?}"),
        };
        (r as f64, g as f64, b as f64)
    }

    /// WCAG relative luminance and contrast ratio.
    fn contrast(a: Color, b: Color) -> f64 {
        let lum = |c: Color| {
            let (r, g, b) = rgb(c);
            let lin = |v: f64| {
                let v = v / 255.0;
                if v <= 0.03928 { v / 12.92 } else { ((v + 0.055) / 1.055).powf(2.4) }
            };
            0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)
        };
        let (x, y) = (lum(a), lum(b));
        (x.max(y) + 0.05) / (x.min(y) + 0.05)
    }

    #[test]
    fn every_scale_step_reads_on_its_themes_background_and_steps_differ() {
        for (name, _) in BUILTIN {
            let t = Theme::builtin(name).unwrap();
            // The light theme is for light terminals; the others for dark ones.
            let bg = if name == "light" { Color::White } else { Color::Black };
            for (i, c) in t.scale.iter().enumerate() {
                let ratio = contrast(*c, bg);
                // WCAG's 3:1 for graphical objects.
                assert!(ratio >= 3.0, "{name}: scale_{i} {c:?} has contrast {ratio:.2} on {bg:?}");
            }
            for i in 0..t.scale.len() {
                for j in i + 1..t.scale.len() {
                    assert_ne!(t.scale[i], t.scale[j], "{name}: scale_{i} and scale_{j} are the same colour");
                }
            }
        }
    }

    #[test]
    fn bad_colour_names_file_and_key() {
        let e = Theme::parse("[colors]\nthinking = \"purplish\"\n", "my.toml", &|_| None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "my.toml: [colors] thinking = \"purplish\": not a colour (use a name like light-blue, an index 0-255 or #rrggbb)"
        );
        let e = Theme::parse("[colors]\nthinkin = \"red\"\n", "my.toml", &|_| None).unwrap_err();
        assert!(e.to_string().starts_with("my.toml: unknown key `colors.thinkin`"), "{e}");
        let e = Theme::parse("name = 3\n", "my.toml", &|_| None).unwrap_err();
        assert_eq!(e.to_string(), "my.toml: `name` must be a string");
        let e = Theme::parse("[colors\n", "my.toml", &|_| None).unwrap_err();
        assert!(e.to_string().starts_with("my.toml: not valid TOML"), "{e}");
        let e = Theme::parse("code_theme = \"Solarized\"\n", "my.toml", &|_| None).unwrap_err();
        assert!(
            e.to_string().starts_with("my.toml: code_theme = \"Solarized\": not a code theme (known: ")
                && e.to_string().contains("Solarized (dark)"),
            "{e}"
        );
        assert!(Theme::parse("code_theme = \"Solarized (dark)\"\n", "my.toml", &|_| None).is_ok());
    }

    #[test]
    fn user_theme_extends_a_builtin() {
        let t = Theme::parse(
            "extends = \"light\"\nname = \"mine\"\n[colors]\nthinking = \"#010203\"\n",
            "mine.toml",
            &|_| None,
        )
        .unwrap();
        assert_eq!(t.name, "mine");
        assert_eq!(t.thinking, Color::Rgb(1, 2, 3));
        assert_eq!(t.answer, Theme::builtin("light").unwrap().answer);
    }

    #[test]
    fn user_dir_themes_are_found_and_unknown_names_fail() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ocean.toml"), "extends = \"dark\"\n[colors]\ntext = \"cyan\"\n").unwrap();
        let t = Theme::load("ocean", Some(dir.path())).unwrap();
        assert_eq!(t.text, Color::Cyan);
        assert!(matches!(Theme::load("nope", Some(dir.path())), Err(ThemeError::Unknown { .. })));
        std::fs::write(dir.path().join("loop.toml"), "extends = \"loop\"\n").unwrap();
        assert!(matches!(Theme::load("loop", Some(dir.path())), Err(ThemeError::Cycle { .. })));
        std::fs::write(dir.path().join("a.toml"), "extends = \"b\"\n").unwrap();
        std::fs::write(dir.path().join("b.toml"), "extends = \"a\"\n").unwrap();
        assert!(matches!(Theme::load("a", Some(dir.path())), Err(ThemeError::Cycle { .. })));
    }
}
