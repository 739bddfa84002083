//! Prometheus's text exposition format, written the same way by every `/metrics`: a series'
//! `HELP` and `TYPE`, label values escaped, histograms as cumulative buckets, a sum and a count.

use std::fmt::Write;

/// `# HELP` and `# TYPE` of a series.
pub fn head(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value as the format wants it (backslash, quote and newline escaped).
pub fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One histogram's lines: `buckets` are (upper bound, cumulative count), the last bound
/// infinite (written `+Inf`); `labels` are the series' own (`a="x",b="y"`, or empty).
pub fn histogram(o: &mut String, name: &str, labels: &str, buckets: impl IntoIterator<Item = (f64, u64)>, sum: f64, count: u64) {
    let sep = if labels.is_empty() { "" } else { "," };
    for (b, c) in buckets {
        let le = if b.is_finite() { b.to_string() } else { "+Inf".into() };
        let _ = writeln!(o, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {c}");
    }
    let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
    let _ = writeln!(o, "{name}_sum{braces} {sum}\n{name}_count{braces} {count}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_and_a_label_as_the_format_wants_them() {
        let mut o = String::new();
        head(&mut o, "x_seconds", "histogram", "Time.");
        histogram(&mut o, "x_seconds", &format!("l=\"{}\"", esc("a\"b")), [(0.5, 1), (f64::INFINITY, 3)], 2.5, 3);
        histogram(&mut o, "y", "", [(1.0, 0), (f64::INFINITY, 0)], 0.0, 0);
        assert_eq!(
            o,
            "# HELP x_seconds Time.\n# TYPE x_seconds histogram\n\
             x_seconds_bucket{l=\"a\\\"b\",le=\"0.5\"} 1\nx_seconds_bucket{l=\"a\\\"b\",le=\"+Inf\"} 3\nx_seconds_sum{l=\"a\\\"b\"} 2.5\nx_seconds_count{l=\"a\\\"b\"} 3\n\
             y_bucket{le=\"1\"} 0\ny_bucket{le=\"+Inf\"} 0\ny_sum 0\ny_count 0\n"
        );
    }
}
