//! Markdown tables: a generic one, and one row per result with columns picked by path.

use super::{get_str, select};
use serde_json::Value;

/// A table column: header text and the path of its value in a result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// Header.
    pub header: String,
    /// Path (JSON pointer or dotted).
    pub path: String,
}

impl Column {
    /// A column whose header is the path's last segment.
    pub fn path(path: &str) -> Column {
        let header = path
            .trim_end_matches('/')
            .rsplit(['/', '.'])
            .next()
            .unwrap_or(path)
            .to_string();
        Column {
            header,
            path: path.to_string(),
        }
    }
    /// Parses `HEADER=PATH` or a bare `PATH`.
    pub fn parse(s: &str) -> Column {
        match s.split_once('=') {
            Some((h, p)) => Column {
                header: h.to_string(),
                path: p.to_string(),
            },
            None => Column::path(s),
        }
    }
}

/// Formats a number for a table: integers as integers; otherwise 4 significant digits, with
/// k/M/G suffixes from 10^4 up (19.62M for 19 623 456.7).
pub fn fmt_num(x: f64) -> String {
    if !x.is_finite() {
        return x.to_string();
    }
    let a = x.abs();
    if x == x.trunc() && a < 1e4 {
        return format!("{}", x as i64);
    }
    let (v, suf) = if a >= 1e9 {
        (x / 1e9, "G")
    } else if a >= 1e6 {
        (x / 1e6, "M")
    } else if a >= 1e4 {
        (x / 1e3, "k")
    } else {
        (x, "")
    };
    let av = v.abs();
    let prec = if av >= 1000.0 {
        0
    } else if av >= 100.0 {
        1
    } else if av >= 10.0 {
        2
    } else if av >= 1.0 || av == 0.0 {
        3
    } else {
        // small numbers: 4 significant digits
        (4 - av.log10().floor() as i32 - 1).clamp(3, 9) as usize
    };
    format!("{v:.prec$}{suf}")
}

fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::Number(n)) => n.as_f64().map(fmt_num).unwrap_or_else(|| n.to_string()),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(other) => other.to_string(),
    }
}

/// A markdown table; columns whose cells are all numeric are right-aligned. `|` in cells is
/// escaped.
pub fn markdown_table<H: AsRef<str>>(headers: &[H], rows: &[Vec<String>]) -> String {
    let n = headers.len();
    let esc = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    let numeric: Vec<bool> = (0..n)
        .map(|c| {
            let cells: Vec<&String> = rows
                .iter()
                .filter_map(|r| r.get(c))
                .filter(|s| !s.is_empty())
                .collect();
            !cells.is_empty()
                && cells
                    .iter()
                    .all(|s| s.trim_end_matches(['k', 'M', 'G']).parse::<f64>().is_ok())
        })
        .collect();
    let mut width: Vec<usize> = headers.iter().map(|h| esc(h.as_ref()).len().max(3)).collect();
    for r in rows {
        for (c, w) in width.iter_mut().enumerate() {
            *w = (*w).max(r.get(c).map(|s| esc(s).len()).unwrap_or(0));
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>| -> String {
        let mut l = String::from("|");
        for (c, s) in cells.iter().enumerate() {
            if numeric[c] {
                l.push_str(&format!(" {:>w$} |", s, w = width[c]));
            } else {
                l.push_str(&format!(" {:<w$} |", s, w = width[c]));
            }
        }
        l.push('\n');
        l
    };
    out.push_str(&line(headers.iter().map(|h| esc(h.as_ref())).collect()));
    let mut sep = String::from("|");
    for c in 0..n {
        if numeric[c] {
            sep.push_str(&format!(" {}: |", "-".repeat(width[c] - 1)));
        } else {
            sep.push_str(&format!(" {} |", "-".repeat(width[c])));
        }
    }
    sep.push('\n');
    out.push_str(&sep);
    for r in rows {
        out.push_str(&line(
            (0..n)
                .map(|c| esc(r.get(c).map(String::as_str).unwrap_or("")))
                .collect(),
        ));
    }
    out
}

/// One row per result: its label, then one cell per column.
pub fn results_table(results: &[(String, Value)], columns: &[Column]) -> String {
    let mut headers = vec!["run".to_string()];
    headers.extend(columns.iter().map(|c| c.header.clone()));
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|(label, v)| {
            let mut r = vec![label.clone()];
            r.extend(
                columns
                    .iter()
                    .map(|c| cell(select(v, &c.path).into_iter().next())),
            );
            r
        })
        .collect();
    markdown_table(&headers, &rows)
}

/// Default columns: `kind`, every tag, then every scalar of `summary` (union over the results,
/// in first-seen order).
pub fn default_columns(results: &[(String, Value)]) -> Vec<Column> {
    let mut cols: Vec<Column> = Vec::new();
    let mut push = |c: Column| {
        if !cols.iter().any(|x| x.path == c.path) {
            cols.push(c);
        }
    };
    if results.iter().any(|(_, v)| get_str(v, "/kind").is_some()) {
        push(Column::path("/kind"));
    }
    for (_, v) in results {
        if let Some(Value::Object(t)) = v.get("tags") {
            for k in t.keys() {
                push(Column {
                    header: k.clone(),
                    path: format!("/tags/{}", k.replace('~', "~0").replace('/', "~1")),
                });
            }
        }
    }
    for (_, v) in results {
        if let Some(Value::Object(s)) = v.get("summary") {
            for (k, x) in s {
                if !x.is_object() && !x.is_array() {
                    push(Column {
                        header: k.clone(),
                        path: format!("/summary/{}", k.replace('~', "~0").replace('/', "~1")),
                    });
                }
            }
        }
    }
    cols
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn formats_numbers() {
        assert_eq!(fmt_num(3.0), "3");
        assert_eq!(fmt_num(19_623_456.7), "19.62M");
        assert_eq!(fmt_num(262_144.0), "262.1k");
        assert_eq!(fmt_num(0.99), "0.9900");
        assert_eq!(fmt_num(0.0001234), "0.0001234");
        assert_eq!(fmt_num(12.3456), "12.35");
        assert_eq!(fmt_num(1.5e9), "1.500G");
    }

    #[test]
    fn renders_tables() {
        let t = markdown_table(
            &["a", "b|c"],
            &[vec!["x".into(), "1.5".into()], vec!["yy".into(), "20".into()]],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "| a   | b\\|c |");
        assert_eq!(lines[1], "| --- | ---: |");
        assert_eq!(lines[2], "| x   |  1.5 |");
        let r = vec![(
            "r1".to_string(),
            json!({"kind":"pa","tags":{"n":"4"},"summary":{"app_throughput":0.99,"met":99}}),
        )];
        let cols = default_columns(&r);
        assert_eq!(
            cols.iter().map(|c| c.header.as_str()).collect::<Vec<_>>(),
            vec!["kind", "n", "app_throughput", "met"]
        );
        let t = results_table(&r, &cols);
        assert!(t.contains("| r1  | pa   | 4 |") || t.contains("r1"), "{t}");
        assert_eq!(
            Column::parse("p99=/summary/p99_us"),
            Column {
                header: "p99".into(),
                path: "/summary/p99_us".into()
            }
        );
        assert_eq!(Column::parse("summary.p99_us").header, "p99_us");
    }
}
