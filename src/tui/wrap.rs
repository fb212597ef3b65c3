//! Word wrapping of styled lines to a width, so the panes know their line count (to follow the
//! tail and to scroll) and render only the visible rows.

use ratatui::style::Style;
use ratatui::text::{Line, Span};
use unicode_width::UnicodeWidthChar;

/// Wraps each line to `width` columns, breaking after the last space when a word would be cut
/// (a word longer than the width is cut).
pub fn wrap(lines: &[Line<'static>], width: usize) -> Vec<Line<'static>> {
    let width = width.max(1);
    let mut out = Vec::with_capacity(lines.len());
    for line in lines {
        wrap_one(line, width, &mut out);
    }
    out
}

fn wrap_one(line: &Line<'static>, width: usize, out: &mut Vec<Line<'static>>) {
    // Cells of the line: (char, style).
    let cells: Vec<(char, Style)> = line
        .spans
        .iter()
        .flat_map(|s| {
            let st = line.style.patch(s.style);
            s.content.chars().filter(|c| *c != '\n' && *c != '\r').map(move |c| (if c == '\t' { ' ' } else { c }, st))
        })
        .collect();
    if cells.is_empty() {
        out.push(Line::default());
        return;
    }
    let mut start = 0;
    while start < cells.len() {
        let mut w = 0;
        let mut end = start;
        let mut last_space = None;
        while end < cells.len() {
            let cw = cells[end].0.width().unwrap_or(0);
            if w + cw > width {
                break;
            }
            if cells[end].0 == ' ' {
                last_space = Some(end);
            }
            w += cw;
            end += 1;
        }
        if end == start {
            // A character wider than the pane: emit it alone.
            end = start + 1;
        } else if end < cells.len()
            && cells[end].0 != ' '
            && let Some(sp) = last_space.filter(|sp| *sp > start)
        {
            end = sp + 1;
        }
        out.push(to_line(&cells[start..end]));
        // A break that fell just before a space: the space goes with the break, not to the
        // start of the next line.
        start = if end < cells.len() && cells[end].0 == ' ' && end > start { end + 1 } else { end };
    }
}

fn to_line(cells: &[(char, Style)]) -> Line<'static> {
    let mut spans: Vec<Span<'static>> = vec![];
    let mut cur = String::new();
    let mut style = cells.first().map(|c| c.1).unwrap_or_default();
    for (c, st) in cells {
        if *st != style && !cur.is_empty() {
            spans.push(Span::styled(std::mem::take(&mut cur), style));
        }
        style = *st;
        cur.push(*c);
    }
    if !cur.is_empty() {
        spans.push(Span::styled(cur, style));
    }
    Line::from(spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(v: &[Line]) -> Vec<String> {
        v.iter().map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect()).collect()
    }

    #[test]
    fn wraps_at_spaces_and_cuts_long_words() {
        let l = vec![Line::from("the quick brown fox"), Line::from(""), Line::from("abcdefghij")];
        assert_eq!(texts(&wrap(&l, 10)), ["the quick ", "brown fox", "", "abcdefghij"]);
        assert_eq!(texts(&wrap(&[Line::from("abcdefghijkl")], 5)), ["abcde", "fghij", "kl"]);
        // No wrapped line starts with the space it was broken at.
        assert_eq!(texts(&wrap(&[Line::from("abc def ghi")], 3)), ["abc", "def", "ghi"]);
        assert_eq!(texts(&wrap(&[Line::from("multiplication, counting")], 15)), ["multiplication,", "counting"]);
    }
}
