//! Plain-text tables: a header, left-aligned text and right-aligned numbers.

pub enum Align {
    Left,
    Right,
}

/// Renders `rows` under `header`, each column as wide as its widest cell; the last column is not padded.
pub fn render(header: &[(&str, Align)], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = header
        .iter()
        .enumerate()
        .map(|(i, (h, _))| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([h.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let last = cells.len() - 1;
        let text: Vec<String> = cells
            .into_iter()
            .enumerate()
            .map(|(i, cell)| match (&header[i].1, i == last) {
                (Align::Left, true) => cell.to_owned(),
                (Align::Left, false) => format!("{cell:<w$}", w = widths[i]),
                (Align::Right, _) => format!("{cell:>w$}", w = widths[i]),
            })
            .collect();
        text.join("  ").trim_end().to_owned() + "\n"
    };
    let mut out = line(header.iter().map(|(h, _)| *h).collect());
    for row in rows {
        out += &line(row.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up() {
        let rows = vec![
            vec!["a".into(), "1".into(), "first".into()],
            vec!["longer".into(), "1000".into(), "second".into()],
        ];
        let text = render(
            &[
                ("NAME", Align::Left),
                ("N", Align::Right),
                ("WHAT", Align::Left),
            ],
            &rows,
        );
        assert_eq!(
            text,
            "NAME       N  WHAT\na          1  first\nlonger  1000  second\n"
        );
    }
}
