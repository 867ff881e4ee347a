//! The table's columns: their headers, widths, what they show, how rows sort
//! by them, and which go first when the terminal is too narrow.

use std::cmp::Ordering;

use super::model::{By, Figures, Quantiles};

/// A column rows can be sorted by (`--sort`, or `<` `>` in the view).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Column {
    /// The pid (by process) or the endpoint (by endpoint).
    Key,
    /// The process's name (by endpoint: the endpoint).
    Comm,
    /// Requests per second over the window.
    Rate,
    /// Requests in the window.
    Requests,
    Errors,
    Retransmits,
    Dns,
    DnsP99,
    Connect,
    ConnectP99,
    Tls,
    TlsP99,
    Ttfb,
    TtfbP99,
    Ttft,
    TtftP99,
    /// LLM calls: the median gap between content events.
    Gap,
    GapP99,
    /// LLM calls: output tokens per second after the first token.
    TokensPerSecond,
    Gpu,
}

/// The figure columns, left to right.
pub const FIGURES: [Column; 18] = [
    Column::Rate,
    Column::Requests,
    Column::Errors,
    Column::Retransmits,
    Column::Dns,
    Column::DnsP99,
    Column::Connect,
    Column::ConnectP99,
    Column::Tls,
    Column::TlsP99,
    Column::Ttfb,
    Column::TtfbP99,
    Column::Ttft,
    Column::TtftP99,
    Column::Gap,
    Column::GapP99,
    Column::TokensPerSecond,
    Column::Gpu,
];

/// The figure columns, most important first: a narrow terminal drops them
/// from the end of this list (never wraps a row).
pub const IMPORTANCE: [Column; 18] = [
    Column::Rate,
    Column::Ttfb,
    Column::Ttft,
    Column::Errors,
    Column::Requests,
    Column::TtfbP99,
    Column::Connect,
    Column::Gpu,
    Column::Dns,
    Column::Tls,
    Column::Retransmits,
    Column::TtftP99,
    Column::ConnectP99,
    Column::DnsP99,
    Column::TlsP99,
    Column::TokensPerSecond,
    Column::Gap,
    Column::GapP99,
];

/// Every sortable column in the order `<` and `>` walk through them.
pub const SORT_ORDER: [Column; 20] = [
    Column::Key,
    Column::Comm,
    Column::Rate,
    Column::Requests,
    Column::Errors,
    Column::Retransmits,
    Column::Dns,
    Column::DnsP99,
    Column::Connect,
    Column::ConnectP99,
    Column::Tls,
    Column::TlsP99,
    Column::Ttfb,
    Column::TtfbP99,
    Column::Ttft,
    Column::TtftP99,
    Column::Gap,
    Column::GapP99,
    Column::TokensPerSecond,
    Column::Gpu,
];

impl Column {
    pub fn header(self, by: By) -> &'static str {
        match self {
            Self::Key => match by {
                By::Process | By::Pool => "PID",
                By::Endpoint => "ENDPOINT",
            },
            Self::Comm => "COMM",
            Self::Rate => "REQ/S",
            Self::Requests => "REQS",
            Self::Errors => "ERR",
            Self::Retransmits => "RTX",
            Self::Dns => "DNS50",
            Self::DnsP99 => "DNS99",
            Self::Connect => "CONN50",
            Self::ConnectP99 => "CONN99",
            Self::Tls => "TLS50",
            Self::TlsP99 => "TLS99",
            Self::Ttfb => "TTFB50",
            Self::TtfbP99 => "TTFB99",
            Self::Ttft => "TTFT50",
            Self::TtftP99 => "TTFT99",
            Self::Gap => "GAP50",
            Self::GapP99 => "GAP99",
            Self::TokensPerSecond => "TOK/S",
            Self::Gpu => "GPU%",
        }
    }

    /// Width of a figure column (its values are formatted to fit).
    pub fn width(self) -> usize {
        match self {
            Self::Key | Self::Comm => 0,
            Self::Rate | Self::Requests | Self::TokensPerSecond => 6,
            Self::Errors | Self::Retransmits => 5,
            Self::Gpu => 4,
            _ => 7,
        }
    }

    fn quantile(self, f: &Figures) -> Option<u64> {
        let (q, p99): (&Quantiles, bool) = match self {
            Self::Dns => (&f.dns, false),
            Self::DnsP99 => (&f.dns, true),
            Self::Connect => (&f.connect, false),
            Self::ConnectP99 => (&f.connect, true),
            Self::Tls => (&f.tls, false),
            Self::TlsP99 => (&f.tls, true),
            Self::Ttfb => (&f.ttfb, false),
            Self::TtfbP99 => (&f.ttfb, true),
            Self::Ttft => (&f.ttft, false),
            Self::TtftP99 => (&f.ttft, true),
            Self::Gap => (&f.gap, false),
            Self::GapP99 => (&f.gap, true),
            _ => return None,
        };
        if p99 {
            q.p99
        } else {
            q.p50
        }
    }

    /// The number a row sorts by in this column (None: no value, sorted last).
    fn number(self, f: &Figures) -> Option<f64> {
        match self {
            Self::Key => f.pid.map(f64::from),
            Self::Comm => None,
            Self::Rate => Some(f.rate),
            Self::Requests => Some(f.requests as f64),
            Self::Errors => Some(f.errors as f64),
            Self::Retransmits => Some(f.retransmits as f64),
            Self::Gpu => f.gpu_pct,
            Self::TokensPerSecond => f.tokens_per_s,
            _ => self.quantile(f).map(|ns| ns as f64),
        }
    }

    /// A figure as shown, at most `width()` characters.
    pub fn text(self, f: &Figures) -> String {
        match self {
            Self::Key | Self::Comm => String::new(),
            Self::Rate => rate(f.rate),
            Self::Requests => count(f.requests, 6),
            Self::Errors => count(f.errors, 5),
            Self::Retransmits => count(f.retransmits, 5),
            Self::Gpu => f.gpu_pct.map_or("-".into(), |p| format!("{p:.0}")),
            Self::TokensPerSecond => f.tokens_per_s.map_or("-".into(), rate),
            _ => duration(self.quantile(f)),
        }
    }

    /// Order of two rows in this column, largest first for figures and
    /// alphabetical for names; rows without a value come last either way,
    /// and ties go by the row's key so rows do not jump between refreshes.
    pub fn compare(self, by: By, a: &Figures, b: &Figures, reverse: bool) -> Ordering {
        let text = |f: &Figures| -> String {
            match (self, by) {
                (Self::Comm, By::Process | By::Pool) => f.comm.clone(),
                _ => f.endpoint.clone(),
            }
        };
        let primary = match (self, by) {
            (Self::Comm, _) | (Self::Key, By::Endpoint) => {
                let o = text(a).cmp(&text(b));
                if reverse {
                    o.reverse()
                } else {
                    o
                }
            }
            (Self::Key, By::Process | By::Pool) => {
                let o = a.pid.cmp(&b.pid);
                if reverse {
                    o.reverse()
                } else {
                    o
                }
            }
            _ => match (self.number(a), self.number(b)) {
                (Some(x), Some(y)) => {
                    let o = y.total_cmp(&x);
                    if reverse {
                        o.reverse()
                    } else {
                        o
                    }
                }
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            },
        };
        primary.then_with(|| tie(a, b))
    }
}

fn tie(a: &Figures, b: &Figures) -> Ordering {
    a.pid
        .cmp(&b.pid)
        .then_with(|| a.comm.cmp(&b.comm))
        .then_with(|| a.endpoint.cmp(&b.endpoint))
        .then_with(|| a.inbound.cmp(&b.inbound))
}

/// "0.08ms", "12.3ms", "250ms", "12.5s": six characters or fewer (seven
/// at the rounding edges), "-" when the phase was not seen.
pub fn duration(ns: Option<u64>) -> String {
    let Some(ns) = ns else {
        return "-".into();
    };
    let ms = ns as f64 / 1e6;
    if ms < 10.0 {
        format!("{ms:.2}ms")
    } else if ms < 100.0 {
        format!("{ms:.1}ms")
    } else if ms < 10_000.0 {
        format!("{ms:.0}ms")
    } else if ms < 1_000_000.0 {
        format!("{:.1}s", ms / 1e3)
    } else if ms < 100_000_000.0 {
        format!("{:.0}s", ms / 1e3)
    } else {
        format!("{:.0}d", ms / 86_400e3)
    }
}

fn rate(r: f64) -> String {
    if r < 100.0 {
        format!("{r:.1}")
    } else {
        count(r.round() as u64, 6)
    }
}

/// An integer that fits `width`: 12345, then 123k, 12M...
fn count(n: u64, width: usize) -> String {
    let mut v = n;
    for suffix in ["", "k", "M", "G", "T", "P"] {
        let s = format!("{v}{suffix}");
        if s.len() <= width {
            return s;
        }
        v /= 1000;
    }
    format!("{v}E")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_fit_their_column() {
        assert_eq!(duration(None), "-");
        assert_eq!(duration(Some(80_000)), "0.08ms");
        assert_eq!(duration(Some(12_340_000)), "12.3ms");
        assert_eq!(duration(Some(250_400_000)), "250ms");
        assert_eq!(duration(Some(12_500_000_000)), "12.5s");
        for ns in [1u64, 9_999_999, 99_990_000, 9_999_000_000, u64::MAX] {
            assert!(
                duration(Some(ns)).len() <= 7,
                "{ns}: {}",
                duration(Some(ns))
            );
        }
    }

    #[test]
    fn counts_fit_their_column() {
        assert_eq!(count(42, 5), "42");
        assert_eq!(count(123_456, 5), "123k");
        assert_eq!(count(1_234_567, 5), "1234k");
        assert!(count(u64::MAX, 5).len() <= 5);
        assert_eq!(rate(2.04), "2.0");
        assert_eq!(rate(1234.0), "1234");
        assert!(rate(1e12).len() <= 6);
    }

    #[test]
    fn every_figure_column_is_ranked_and_sortable() {
        for c in FIGURES {
            assert!(IMPORTANCE.contains(&c), "{c:?}");
            assert!(SORT_ORDER.contains(&c), "{c:?}");
            assert!(c.header(By::Process).len() <= c.width(), "{c:?}");
        }
    }

    #[test]
    fn figures_sort_largest_first_and_missing_last() {
        let row = |pid, ttfb| Figures {
            pid: Some(pid),
            ttfb: Quantiles {
                p50: ttfb,
                p99: ttfb,
            },
            ..Figures::default()
        };
        let mut rows = [row(1, Some(5)), row(2, None), row(3, Some(9))];
        rows.sort_by(|a, b| Column::Ttfb.compare(By::Process, a, b, false));
        let order: Vec<_> = rows.iter().map(|r| r.pid).collect();
        assert_eq!(order, [Some(3), Some(1), Some(2)]);
        rows.sort_by(|a, b| Column::Ttfb.compare(By::Process, a, b, true));
        let order: Vec<_> = rows.iter().map(|r| r.pid).collect();
        assert_eq!(order, [Some(1), Some(3), Some(2)], "reversed, still last");
        rows.sort_by(|a, b| Column::Key.compare(By::Process, a, b, false));
        let order: Vec<_> = rows.iter().map(|r| r.pid).collect();
        assert_eq!(order, [Some(1), Some(2), Some(3)], "pids ascend");
    }
}
