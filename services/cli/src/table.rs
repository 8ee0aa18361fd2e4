//! Grid tables in the format of the benchmark seed files (`+---+` rules, `|` cells, `=` under
//! the header).

#[derive(Debug)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let rule = |ch: char| {
            let mut s = String::from("+");
            for w in &widths {
                s.extend(std::iter::repeat_n(ch, w + 2));
                s.push('+');
            }
            s.push('\n');
            s
        };
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for (i, w) in widths.iter().enumerate() {
                let c = cells.get(i).map_or("", String::as_str);
                s.push_str(&format!(" {c:<w$} |"));
            }
            s.push('\n');
            s
        };
        let mut out = rule('-');
        out.push_str(&line(&self.header));
        out.push_str(&rule('='));
        for r in &self.rows {
            out.push_str(&line(r));
            out.push_str(&rule('-'));
        }
        out
    }
}

/// Right-aligned columns separated by spaces, the layout of seed 004.
pub fn aligned(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let parts: Vec<String> = cells
            .zip(&widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect();
        parts.join(" ") + "\n"
    };
    let mut out = line(&mut header.iter().copied());
    for r in rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    out
}

/// A Markdown pipe table as pandas' `to_markdown` writes it (seed 002): text columns
/// left-aligned (`:---`), numbers right-aligned (`---:`).
pub fn markdown(header: &[&str], rows: &[Vec<String>]) -> String {
    let numeric: Vec<bool> = (0..header.len())
        .map(|i| {
            rows.iter()
                .all(|r| r.get(i).is_some_and(|c| c.parse::<f64>().is_ok()))
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let parts: Vec<String> = cells
            .zip(widths.iter().zip(&numeric))
            .map(|(c, (&w, &num))| {
                if num {
                    format!("{c:>w$}")
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        format!("| {} |\n", parts.join(" | "))
    };
    let mut out = line(&mut header.iter().copied());
    // Each rule cell spans the column and its two padding spaces.
    let rule: Vec<String> = widths
        .iter()
        .zip(&numeric)
        .map(|(&w, &num)| {
            let dashes = "-".repeat(w + 1);
            if num {
                format!("{dashes}:")
            } else {
                format!(":{dashes}")
            }
        })
        .collect();
    out.push_str(&format!("|{}|\n", rule.join("|")));
    for r in rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    out
}

/// The `p` quantile (0..=1) of ascending `sorted` values, the nearest rank; `None` if empty.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    Some(sorted[((sorted.len() as f64 - 1.0) * p).round() as usize])
}

/// Mean and population standard deviation of a table cell's runs (`± std`; 0 for one run).
pub(crate) fn mean_std(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let v: Vec<f64> = values.collect();
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_grid() {
        let mut t = Table::new(&["a", "bb"]);
        t.row(vec!["xyz".into(), "1".into()]);
        assert_eq!(
            t.render(),
            "+-----+----+\n| a   | bb |\n+=====+====+\n| xyz | 1  |\n+-----+----+\n"
        );
    }

    #[test]
    fn markdown_like_pandas() {
        let t = markdown(&["model", "ms"], &[vec!["small".into(), "1.5".into()]]);
        assert_eq!(t, "| model |  ms |\n|:------|----:|\n| small | 1.5 |\n");
    }

    #[test]
    fn aligns_like_the_seed() {
        let t = aligned(&["device", "bs"], &[vec!["cpu".into(), "16".into()]]);
        assert_eq!(t, "device bs\n   cpu 16\n");
    }
}
