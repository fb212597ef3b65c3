//! Markdown for the answer pane, with syntect-highlighted code blocks, built incrementally.
//!
//! Streaming text grows at the end, so rendering works line by line: every *finished* line
//! (one followed by a newline) is rendered once and cached together with the parser state
//! after it (inside a code fence or not, and syntect's parse/highlight state); only the
//! unfinished last line is rendered again on each frame, without syntect. Re-rendering whole
//! answers per token is what made other chat TUIs slow on long answers.
//!
//! Block structure (headings, list items, quotes, fences) is recognised per line; inline
//! markup (emphasis, strong, code, links, strikethrough) is parsed by pulldown-cmark. Tables
//! are the exception to line by line: their column widths depend on every row, so a table's
//! rows are held (and drawn aligned on each frame) until the first line after it, then
//! rendered once.

use std::sync::LazyLock;

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use syntect::highlighting::{FontStyle, HighlightIterator, HighlightState, Highlighter};
use syntect::parsing::{ParseState, ScopeStack, SyntaxSet};

use super::theme::{CODE_THEMES as THEMES, Theme};

static SYNTAXES: LazyLock<SyntaxSet> = LazyLock::new(SyntaxSet::load_defaults_newlines);

/// syntect's style to ratatui's: foreground colour and font style. The background is
/// ignored so the terminal theme shows through.
pub fn syntect_to_ratatui(s: syntect::highlighting::Style) -> Style {
    let mut style = Style::new().fg(Color::Rgb(s.foreground.r, s.foreground.g, s.foreground.b));
    if s.font_style.contains(FontStyle::BOLD) {
        style = style.add_modifier(Modifier::BOLD);
    }
    if s.font_style.contains(FontStyle::ITALIC) {
        style = style.add_modifier(Modifier::ITALIC);
    }
    if s.font_style.contains(FontStyle::UNDERLINE) {
        style = style.add_modifier(Modifier::UNDERLINED);
    }
    style
}

/// An open code fence: syntect's state after the last finished line.
#[derive(Clone)]
struct Fence {
    marker: String,
    parse: ParseState,
    highlight: HighlightState,
}

/// Rendered lines of a growing markdown text.
#[derive(Clone)]
pub struct Markdown {
    /// Unique per reset: a view caching what it made of `finished()` knows when to start over.
    pub id: u64,
    /// Rendered finished lines.
    lines: Vec<Line<'static>>,
    /// Bytes of the source consumed (always just after a newline).
    consumed: usize,
    fence: Option<Fence>,
    /// Syntect theme used by `fence`.
    code_theme: String,
    /// Finished rows of a table still growing.
    table: Vec<String>,
    /// Finished lines re-highlighted so far (a test checks the incremental path).
    pub highlighted_lines: usize,
}

impl Default for Markdown {
    fn default() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Markdown {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            lines: vec![],
            consumed: 0,
            fence: None,
            code_theme: String::new(),
            table: vec![],
            highlighted_lines: 0,
        }
    }
}

impl std::fmt::Debug for Markdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Markdown").field("lines", &self.lines.len()).field("consumed", &self.consumed).finish()
    }
}

impl Markdown {
    /// Brings the cache up to `text` (which must extend the text seen before; anything else
    /// resets it). Only new finished lines are rendered.
    pub fn sync(&mut self, text: &str, theme: &Theme) {
        if text.len() < self.consumed || !text.is_char_boundary(self.consumed) || self.code_theme != theme.code_theme {
            *self = Markdown { code_theme: theme.code_theme.clone(), ..Default::default() };
        }
        while let Some(nl) = text[self.consumed..].find('\n') {
            let line = &text[self.consumed..self.consumed + nl];
            self.consumed += nl + 1;
            if self.fence.is_none() && is_table_row(line) {
                self.table.push(line.to_string());
                // A header must be followed by a delimiter row; otherwise it was just text.
                if self.table.len() == 2 && !is_delimiter_row(&self.table[1]) {
                    let first = self.table.remove(0);
                    self.lines.push(block_line(&first, theme));
                }
                continue;
            }
            if !self.table.is_empty() {
                let rows = std::mem::take(&mut self.table);
                self.lines.extend(table_lines(&rows, theme));
            }
            let rendered = self.finished_line(line, theme);
            self.lines.push(rendered);
        }
    }

    /// The rendered text: the cached finished lines plus the unfinished tail of `text`.
    pub fn lines(&self, text: &str, theme: &Theme) -> Vec<Line<'static>> {
        let mut out = self.lines.clone();
        out.extend(self.open_lines(text, theme));
        out
    }

    /// The finished lines: they only grow until the next reset (a new `id`).
    pub fn finished(&self) -> &[Line<'static>] {
        &self.lines
    }

    /// What follows the finished lines: a table still growing and the unfinished last line.
    pub fn open_lines(&self, text: &str, theme: &Theme) -> Vec<Line<'static>> {
        let mut out = vec![];
        let mut tail = text.get(self.consumed..).unwrap_or("");
        if !self.table.is_empty() {
            let mut rows = self.table.clone();
            // A row being streamed joins the table; anything else follows it.
            if !tail.is_empty() && is_table_row(tail) {
                rows.push(tail.to_string());
                tail = "";
            }
            out.extend(table_lines(&rows, theme));
        }
        if !tail.is_empty() {
            out.push(match &self.fence {
                // Unfinished code: plain, highlighted once the line is complete.
                Some(_) => Line::from(Span::styled(tail.to_string(), Style::new().fg(theme.inline_code))),
                None => block_line(tail, theme),
            });
        }
        out
    }

    fn finished_line(&mut self, line: &str, theme: &Theme) -> Line<'static> {
        let trimmed = line.trim_start();
        if let Some(fence) = &self.fence {
            if trimmed.starts_with(fence.marker.as_str()) && trimmed.trim_end().len() == fence.marker.len() {
                self.fence = None;
                return Line::from(Span::styled(line.to_string(), Style::new().fg(theme.dim)));
            }
            return self.code_line(line, theme);
        }
        if let Some(marker) = fence_marker(trimmed) {
            let lang = trimmed[marker.len()..].trim();
            let syntax = SYNTAXES.find_syntax_by_token(lang).unwrap_or_else(|| SYNTAXES.find_syntax_plain_text());
            let Some(t) = THEMES.themes.get(&theme.code_theme).or_else(|| THEMES.themes.values().next()) else {
                return Line::from(line.to_string());
            };
            let highlighter = Highlighter::new(t);
            self.fence = Some(Fence {
                marker: marker.to_string(),
                parse: ParseState::new(syntax),
                highlight: HighlightState::new(&highlighter, ScopeStack::new()),
            });
            return Line::from(Span::styled(line.to_string(), Style::new().fg(theme.dim)));
        }
        block_line(line, theme)
    }

    fn code_line(&mut self, line: &str, theme: &Theme) -> Line<'static> {
        let plain = || Line::from(Span::styled(line.to_string(), Style::new().fg(theme.inline_code)));
        let Some(t) = THEMES.themes.get(&theme.code_theme).or_else(|| THEMES.themes.values().next()) else {
            return plain();
        };
        let Some(fence) = self.fence.as_mut() else { return plain() };
        let highlighter = Highlighter::new(t);
        // The newline syntaxes expect each line to end in '\n'.
        let with_nl = format!("{line}\n");
        let Ok(ops) = fence.parse.parse_line(&with_nl, &SYNTAXES) else { return plain() };
        self.highlighted_lines += 1;
        let spans: Vec<Span<'static>> = HighlightIterator::new(&mut fence.highlight, &ops, &with_nl, &highlighter)
            .map(|(style, text)| Span::styled(text.trim_end_matches('\n').to_string(), syntect_to_ratatui(style)))
            .filter(|s| !s.content.is_empty())
            .collect();
        Line::from(spans)
    }
}

fn is_table_row(line: &str) -> bool {
    line.trim_start().starts_with('|')
}

/// `| --- | :---: | ---: |`: dashes with optional alignment colons in every cell.
fn is_delimiter_row(line: &str) -> bool {
    let cells = table_cells(line);
    !cells.is_empty()
        && cells.iter().all(|c| {
            let d = c.trim_start_matches(':').trim_end_matches(':');
            !d.is_empty() && d.chars().all(|ch| ch == '-')
        })
}

/// The cells of a table row, trimmed; `\|` is a literal bar.
fn table_cells(line: &str) -> Vec<String> {
    let inner = line.trim();
    let inner = inner.strip_prefix('|').unwrap_or(inner);
    let inner = inner.strip_suffix('|').filter(|s| !s.ends_with('\\')).unwrap_or(inner);
    let mut cells = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                if let Some(s) = cells.last_mut() {
                    s.push('|');
                }
                chars.next();
            }
            '|' => cells.push(String::new()),
            _ => {
                if let Some(s) = cells.last_mut() {
                    s.push(c);
                }
            }
        }
    }
    cells.into_iter().map(|c| c.trim().to_string()).collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Align {
    Left,
    Centre,
    Right,
}

/// A table (header, delimiter, body rows) with its columns aligned: cells separated by `│`, the
/// header bold over a `─┼─` rule. Rows without a delimiter yet are shown as they are.
fn table_lines(rows: &[String], theme: &Theme) -> Vec<Line<'static>> {
    if rows.len() < 2 || !is_delimiter_row(&rows[1]) {
        return rows.iter().map(|r| block_line(r, theme)).collect();
    }
    let aligns: Vec<Align> = table_cells(&rows[1])
        .iter()
        .map(|c| match (c.starts_with(':'), c.ends_with(':')) {
            (true, true) => Align::Centre,
            (false, true) => Align::Right,
            _ => Align::Left,
        })
        .collect();
    let n = aligns.len();
    let header = Style::new().fg(theme.heading).add_modifier(Modifier::BOLD);
    let body = Style::new().fg(theme.answer);
    // Every row's cells as spans, padded or cut to the header's column count.
    let cells: Vec<Vec<Vec<Span<'static>>>> = rows
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(i, r)| {
            let mut c: Vec<Vec<Span<'static>>> =
                table_cells(r).iter().map(|t| inline(t, if i == 0 { header } else { body }, theme)).collect();
            c.resize(n, vec![]);
            c
        })
        .collect();
    let width = |spans: &[Span]| spans.iter().map(|s| s.width()).sum::<usize>();
    let widths: Vec<usize> =
        (0..n).map(|col| cells.iter().map(|row| width(&row[col])).max().unwrap_or(0).max(1)).collect();
    let rule = Style::new().fg(theme.dim);
    let mut out = vec![];
    for (r, row) in cells.into_iter().enumerate() {
        let mut spans = vec![];
        for (col, cell) in row.into_iter().enumerate() {
            if col > 0 {
                spans.push(Span::styled(" │ ", rule));
            }
            let pad = widths[col] - width(&cell);
            let (before, after) = match aligns[col] {
                Align::Left => (0, pad),
                Align::Right => (pad, 0),
                Align::Centre => (pad / 2, pad - pad / 2),
            };
            spans.push(Span::raw(" ".repeat(before)));
            spans.extend(cell);
            spans.push(Span::raw(" ".repeat(after)));
        }
        out.push(Line::from(spans));
        if r == 0 {
            let parts: Vec<String> = widths.iter().map(|w| "─".repeat(*w)).collect();
            out.push(Line::styled(parts.join("─┼─"), rule));
        }
    }
    out
}

/// "```" or "~~~" (three or more) at the start of a line.
fn fence_marker(trimmed: &str) -> Option<&str> {
    for ch in ['`', '~'] {
        let n = trimmed.chars().take_while(|c| *c == ch).count();
        if n >= 3 {
            return Some(&trimmed[..n]);
        }
    }
    None
}

/// One line outside code: heading, list item, quote or paragraph text.
pub fn block_line(line: &str, theme: &Theme) -> Line<'static> {
    let base = Style::new().fg(theme.answer);
    let indent_len = line.len() - line.trim_start().len();
    let (indent, rest) = line.split_at(indent_len);
    let hashes = rest.chars().take_while(|c| *c == '#').count();
    if (1..=6).contains(&hashes) && rest[hashes..].starts_with(' ') {
        let style = Style::new().fg(theme.heading).add_modifier(Modifier::BOLD);
        let mut spans = vec![Span::styled(format!("{indent}{} ", "#".repeat(hashes)), style)];
        spans.extend(inline(&rest[hashes + 1..], style, theme));
        return Line::from(spans);
    }
    let bullet = ["- ", "* ", "+ "].iter().find(|b| rest.starts_with(**b));
    if let Some(b) = bullet {
        let mut spans = vec![Span::styled(format!("{indent}• "), Style::new().fg(theme.accent))];
        spans.extend(inline(&rest[b.len()..], base, theme));
        return Line::from(spans);
    }
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    if digits > 0 && (rest[digits..].starts_with(". ") || rest[digits..].starts_with(") ")) {
        let mut spans = vec![Span::styled(format!("{indent}{} ", &rest[..digits + 1]), Style::new().fg(theme.accent))];
        spans.extend(inline(&rest[digits + 2..], base, theme));
        return Line::from(spans);
    }
    if let Some(q) = rest.strip_prefix('>') {
        let mut spans = vec![Span::styled(format!("{indent}▌"), Style::new().fg(theme.dim))];
        spans.extend(inline(q.trim_start(), base.add_modifier(Modifier::ITALIC), theme));
        return Line::from(spans);
    }
    let mut spans = vec![];
    if !indent.is_empty() {
        spans.push(Span::raw(indent.to_string()));
    }
    spans.extend(inline(rest, base, theme));
    Line::from(spans)
}

/// Inline markup of one line through pulldown-cmark; anything block-level it reports is
/// flattened back to text (the line-level structure was handled by the caller).
fn inline(text: &str, base: Style, theme: &Theme) -> Vec<Span<'static>> {
    if text.is_empty() {
        return vec![];
    }
    // Fast path: nothing that could be markup.
    if !text.contains(['*', '_', '`', '~', '[', '<', '&', '\\']) {
        return vec![Span::styled(text.to_string(), base)];
    }
    let mut spans = vec![];
    let mut stack: Vec<Style> = vec![base];
    let mut opts = Options::empty();
    opts.insert(Options::ENABLE_STRIKETHROUGH);
    for ev in Parser::new_ext(text, opts) {
        let top = stack.last().copied().unwrap_or(base);
        match ev {
            Event::Start(Tag::Emphasis) => stack.push(top.add_modifier(Modifier::ITALIC)),
            Event::Start(Tag::Strong) => stack.push(top.add_modifier(Modifier::BOLD)),
            Event::Start(Tag::Strikethrough) => stack.push(top.add_modifier(Modifier::CROSSED_OUT)),
            Event::Start(Tag::Link { .. }) => stack.push(top.fg(theme.accent).add_modifier(Modifier::UNDERLINED)),
            Event::End(TagEnd::Emphasis | TagEnd::Strong | TagEnd::Strikethrough | TagEnd::Link) if stack.len() > 1 => {
                stack.pop();
            }
            Event::Text(t) => spans.push(Span::styled(t.to_string(), top)),
            Event::Code(t) => spans.push(Span::styled(t.to_string(), Style::new().fg(theme.inline_code))),
            Event::Html(t) | Event::InlineHtml(t) => spans.push(Span::styled(t.to_string(), top)),
            Event::SoftBreak | Event::HardBreak => spans.push(Span::styled(" ", top)),
            _ => {}
        }
    }
    if spans.is_empty() {
        // A line that is only markup pulldown-cmark swallowed (e.g. "***"): show it as is.
        spans.push(Span::styled(text.to_string(), base));
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(l: &Line) -> String {
        l.spans.iter().map(|s| s.content.as_ref()).collect()
    }

    #[test]
    fn headings_lists_emphasis_and_code() {
        let th = Theme::default();
        let mut md = Markdown::default();
        let src = "# Title\n- item **bold** and `code`\n1. first\nplain *it*\n```rust\nfn main() {}\n```\nafter";
        md.sync(src, &th);
        let lines = md.lines(src, &th);
        let texts: Vec<String> = lines.iter().map(text_of).collect();
        assert_eq!(
            texts,
            ["# Title", "• item bold and code", "1. first", "plain it", "```rust", "fn main() {}", "```", "after"]
        );
        assert!(lines[1].spans.iter().any(|s| s.content == "bold" && s.style.add_modifier.contains(Modifier::BOLD)));
        // The code line is split into several highlighted spans.
        assert!(lines[5].spans.len() > 1);
    }

    #[test]
    fn tables_are_aligned_once_complete_and_while_streaming() {
        let th = Theme::default();
        let src = "Compare:\n| model | layers | ok |\n|:---|---:|:-:|\n| Qwen3.5-0.8B | 24 | **yes** |\n| `27B` | 64 | no |\nafter\n";
        let mut md = Markdown::default();
        md.sync(src, &th);
        let texts: Vec<String> = md.lines(src, &th).iter().map(text_of).collect();
        assert_eq!(
            texts,
            [
                "Compare:",
                "model        │ layers │ ok ",
                "─────────────┼────────┼────",
                "Qwen3.5-0.8B │     24 │ yes",
                "27B          │     64 │ no ",
                "after",
            ]
        );
        // Streaming: the same table, fed a character at a time, ends identical; a partial row
        // is drawn inside the table while it streams.
        let mut live = Markdown::default();
        let mut partial_rows_seen = 0;
        for end in (1..=src.len()).filter(|e| src.is_char_boundary(*e)) {
            live.sync(&src[..end], &th);
            let shown = live.lines(&src[..end], &th);
            if src[..end].ends_with("| `27B` | 6") {
                assert_eq!(text_of(&shown[4]), "27B          │      6 │    ");
                partial_rows_seen += 1;
            }
        }
        assert_eq!(partial_rows_seen, 1);
        assert_eq!(live.lines(src, &th), md.lines(src, &th));
        // A line starting with a bar but not followed by a delimiter row is text.
        let src = "| not a table\nplain\n";
        let mut md = Markdown::default();
        md.sync(src, &th);
        let texts: Vec<String> = md.lines(src, &th).iter().map(text_of).collect();
        assert_eq!(texts, ["| not a table", "plain"]);
        assert_eq!(table_cells(r"| a \| b | c |"), ["a | b", "c"]);
    }

    #[test]
    fn only_new_finished_lines_are_highlighted() {
        let th = Theme::default();
        let mut md = Markdown::default();
        let mut src = String::from("```python\n");
        for i in 0..5 {
            src.push_str(&format!("x = {i}\n"));
            md.sync(&src, &th);
        }
        assert_eq!(md.highlighted_lines, 5);
        // An unfinished line is not highlighted until its newline arrives.
        src.push_str("y = ");
        md.sync(&src, &th);
        assert_eq!(md.highlighted_lines, 5);
        assert_eq!(text_of(md.lines(&src, &th).last().unwrap()), "y = ");
        src.push_str("1\n");
        md.sync(&src, &th);
        assert_eq!(md.highlighted_lines, 6);
    }
}
