//! Drawing the table: a status line, the header, the rows that fit, and a
//! help line. Columns that do not fit the width are left out, least
//! important first (`columns::IMPORTANCE`); a row is never wrapped.

use std::time::Duration;

use ratatui::{
    style::{Modifier, Style},
    text::{Line, Span},
    widgets::Paragraph,
    Frame,
};

use super::{
    columns::{Column, FIGURES, IMPORTANCE},
    model::By,
    model::Figures,
    pools::{self, PoolRow},
    ui::Ui,
};

/// What the status line says besides the view's state.
#[derive(Debug, Clone)]
pub struct Status {
    /// Every probe is attached (the observer printed `ready`).
    pub ready: bool,
    pub window: Duration,
    /// Rows before the filter.
    pub total: usize,
}

/// The rows to show: filtered, then sorted.
pub fn visible(ui: &Ui, mut rows: Vec<Figures>) -> Vec<Figures> {
    rows.retain(|r| r.matches(ui.by, &ui.filter));
    rows.sort_by(|a, b| ui.sort.compare(ui.by, a, b, ui.reverse));
    rows
}

/// Widths of the key columns and the figure columns that fit, in display order.
#[derive(Debug, PartialEq, Eq)]
struct Layout {
    /// PID, or ENDPOINT.
    key: usize,
    /// COMM, or DIR.
    second: usize,
    figures: Vec<Column>,
}

const MAX_ENDPOINT: usize = 40;

fn layout(width: usize, ui: &Ui, rows: &[Figures]) -> Layout {
    let (key, second) = match ui.by {
        By::Process | By::Pool => (
            rows.iter()
                .filter_map(|r| r.pid)
                .map(|p| p.to_string().len())
                .max()
                .unwrap_or(0)
                .max(3),
            rows.iter()
                .map(|r| r.comm.chars().count())
                .max()
                .unwrap_or(0)
                .clamp(4, 15),
        ),
        By::Endpoint => {
            // The endpoint gives way to the sort column and REQ/S.
            let room = width.saturating_sub(
                4 + Column::Rate.width() + 1 + ui.sort.width() + usize::from(ui.sort.width() > 0),
            );
            let longest = rows
                .iter()
                .map(|r| r.endpoint.chars().count())
                .max()
                .unwrap_or(0);
            (longest.clamp(8, MAX_ENDPOINT).min(room.max(8)), 3)
        }
    };
    let mut used = key + 1 + second;
    let mut chosen: Vec<Column> = Vec::new();
    // The sort column is always shown; then the most important that fit.
    let wanted = FIGURES
        .iter()
        .copied()
        .filter(|c| *c == ui.sort)
        .chain(IMPORTANCE.iter().copied().filter(|c| *c != ui.sort));
    for c in wanted {
        if used + 1 + c.width() > width {
            break;
        }
        used += 1 + c.width();
        chosen.push(c);
    }
    let figures = FIGURES
        .iter()
        .copied()
        .filter(|c| chosen.contains(c))
        .collect();
    Layout {
        key,
        second,
        figures,
    }
}

/// `s` cut to `w` characters, keeping its end (an endpoint's port).
fn fit_end(s: &str, w: usize) -> String {
    let n = s.chars().count();
    if n <= w {
        return s.to_owned();
    }
    let tail: String = s.chars().skip(n - w.saturating_sub(1)).collect();
    format!("~{tail}")
}

fn fit(s: &str, w: usize) -> String {
    s.chars().take(w).collect()
}

fn row_text(l: &Layout, by: By, r: &Figures) -> String {
    let mut line = match by {
        By::Process | By::Pool => format!(
            "{:>kw$} {:<sw$}",
            r.pid.map_or("-".into(), |p| p.to_string()),
            fit(&r.comm, l.second),
            kw = l.key,
            sw = l.second
        ),
        By::Endpoint => format!(
            "{:<kw$} {:<3}",
            fit_end(&r.endpoint, l.key),
            if r.inbound { "in" } else { "out" },
            kw = l.key
        ),
    };
    for c in &l.figures {
        line.push_str(&format!(" {:>w$}", c.text(r), w = c.width()));
    }
    line
}

fn header(l: &Layout, ui: &Ui) -> Line<'static> {
    let plain = Style::default().add_modifier(Modifier::REVERSED);
    let sorted = plain.add_modifier(Modifier::BOLD | Modifier::UNDERLINED);
    let style = |c: Column| if c == ui.sort { sorted } else { plain };
    let mut spans = Vec::new();
    let (first, second) = match ui.by {
        By::Process | By::Pool => (Column::Key, Column::Comm),
        By::Endpoint => (Column::Key, Column::Key),
    };
    let key = format!("{:>w$}", first.header(ui.by), w = l.key);
    let key = match ui.by {
        By::Process | By::Pool => key,
        By::Endpoint => format!("{:<w$}", first.header(ui.by), w = l.key),
    };
    spans.push(Span::styled(key, style(first)));
    spans.push(Span::styled(" ", plain));
    let second_text = match ui.by {
        By::Process | By::Pool => format!("{:<w$}", second.header(ui.by), w = l.second),
        By::Endpoint => "DIR".to_owned(),
    };
    let second_style = match ui.by {
        By::Process | By::Pool => style(second),
        By::Endpoint => plain,
    };
    spans.push(Span::styled(second_text, second_style));
    for c in &l.figures {
        spans.push(Span::styled(" ", plain));
        spans.push(Span::styled(
            format!("{:>w$}", c.header(ui.by), w = c.width()),
            style(*c),
        ));
    }
    Line::from(spans)
}

fn title(ui: &Ui, shown: usize, s: &Status) -> String {
    let by = match ui.by {
        By::Process => "process",
        By::Endpoint => "endpoint",
        By::Pool => "pool",
    };
    // Figures sort largest first, names and pids in order.
    let text_column = matches!(ui.sort, Column::Key | Column::Comm);
    let order = if text_column != ui.reverse {
        "asc"
    } else {
        "desc"
    };
    let filter = if ui.filter.is_empty() {
        String::new()
    } else {
        format!(" | filter {}", ui.filter)
    };
    format!(
        "observer top | by {by} | sort {} {order}{filter} | {shown}/{} rows | {}s | {}",
        ui.sort.header(ui.by),
        s.total,
        s.window.as_secs(),
        if s.ready { "live" } else { "starting" },
    )
}

fn help(ui: &Ui) -> Line<'static> {
    if ui.editing {
        return Line::from(vec![
            Span::styled(
                format!("filter: {}_", ui.filter),
                Style::default().add_modifier(Modifier::BOLD),
            ),
            Span::raw("   Enter keep  Esc clear"),
        ]);
    }
    let other = match ui.by {
        By::Process => "endpoints",
        By::Endpoint | By::Pool => "processes",
    };
    if ui.by == By::Pool {
        return Line::from(format!("q quit  e {other}  / filter  Esc clear"));
    }
    Line::from(format!(
        "q quit  e {other}  o pools  < > sort  r reverse  / filter  Esc clear"
    ))
}

/// Draws the pool view: `rows` as `pools::visible` returned them.
pub fn draw_pools(frame: &mut Frame, ui: &Ui, rows: &[PoolRow], status: &Status) {
    let area = frame.area();
    let (width, height) = (usize::from(area.width), usize::from(area.height));
    let filter = if ui.filter.is_empty() {
        String::new()
    } else {
        format!(" | filter {}", ui.filter)
    };
    let title = format!(
        "observer top | by pool | sort OPEN desc{filter} | {}/{} rows | {}s | {}",
        rows.len(),
        status.total,
        status.window.as_secs(),
        if status.ready { "live" } else { "starting" },
    );
    let mut lines = vec![Line::from(title)];
    let body = pools::lines(rows, width);
    lines.extend(body.into_iter().take(height.saturating_sub(2)));
    if height >= 3 {
        while lines.len() < height - 1 {
            lines.push(Line::default());
        }
        lines.push(help(ui));
    }
    frame.render_widget(Paragraph::new(lines), area);
}

/// Draws the whole screen. `rows`: as [`visible`] returned them.
pub fn draw(frame: &mut Frame, ui: &Ui, rows: &[Figures], status: &Status) {
    let area = frame.area();
    let width = usize::from(area.width);
    let height = usize::from(area.height);
    let l = layout(width, ui, rows);
    let mut lines = vec![Line::from(title(ui, rows.len(), status)), header(&l, ui)];
    let room = height.saturating_sub(3);
    lines.extend(
        rows.iter()
            .take(room)
            .map(|r| Line::from(row_text(&l, ui.by, r))),
    );
    if height >= 3 {
        while lines.len() < height - 1 {
            lines.push(Line::default());
        }
        lines.push(help(ui));
    }
    frame.render_widget(Paragraph::new(lines), area);
}

#[cfg(test)]
mod tests {
    use ratatui::{backend::TestBackend, Terminal};

    use super::*;
    use crate::top::model::Quantiles;

    fn screen(w: u16, h: u16, ui: &Ui, rows: Vec<Figures>) -> Vec<String> {
        let mut t = Terminal::new(TestBackend::new(w, h)).expect("a test terminal");
        let rows = visible(ui, rows);
        let status = Status {
            ready: true,
            window: Duration::from_secs(10),
            total: 3,
        };
        t.draw(|f| draw(f, ui, &rows, &status)).expect("drawn");
        let buf = t.backend().buffer().clone();
        (0..h)
            .map(|y| {
                (0..w)
                    .map(|x| buf[(x, y)].symbol().to_owned())
                    .collect::<String>()
                    .trim_end()
                    .to_owned()
            })
            .collect()
    }

    fn row(pid: u32, comm: &str, reqs: u64, ttfb_ms: u64) -> Figures {
        let q = Quantiles {
            p50: Some(ttfb_ms * 1_000_000),
            p99: Some(ttfb_ms * 2_000_000),
        };
        Figures {
            pid: Some(pid),
            comm: comm.into(),
            endpoint: format!("127.0.0.1:{}", 8000 + pid),
            rate: reqs as f64 / 10.0,
            requests: reqs,
            ttfb: q,
            connect: q,
            dns: q,
            tls: q,
            ttft: q,
            gpu_pct: Some(42.0),
            ..Figures::default()
        }
    }

    fn rows() -> Vec<Figures> {
        vec![
            row(101, "curl", 6, 100),
            row(202, "curl", 3, 250),
            row(3, "python3", 9, 99),
        ]
    }

    fn ui() -> Ui {
        Ui::new(By::Process, Column::Rate, false, String::new())
    }

    #[test]
    fn eighty_by_twenty_four_fits_without_wrapping() {
        let s = screen(80, 24, &ui(), rows());
        assert_eq!(s.len(), 24);
        assert!(
            s[0].starts_with("observer top | by process | sort REQ/S desc"),
            "{}",
            s[0]
        );
        let header: Vec<&str> = s[1].split_whitespace().collect();
        assert_eq!(
            header,
            [
                "PID", "COMM", "REQ/S", "REQS", "ERR", "DNS50", "CONN50", "TTFB50", "TTFB99",
                "TTFT50", "GPU%"
            ],
            "the least important columns dropped: {}",
            s[1]
        );
        assert_eq!(
            s[2].split_whitespace().collect::<Vec<_>>(),
            [
                "3", "python3", "0.9", "9", "0", "99.0ms", "99.0ms", "99.0ms", "198ms", "99.0ms",
                "42"
            ]
        );
        assert!(s[3].starts_with("101 curl"), "{}", s[3]);
        assert!(s[4].starts_with("202 curl"), "{}", s[4]);
        assert!(s[23].starts_with("q quit"), "{}", s[23]);
        assert!(s.iter().all(|l| l.chars().count() <= 80));
    }

    #[test]
    fn a_wide_terminal_shows_every_column() {
        let s = screen(200, 10, &ui(), rows());
        let header: Vec<&str> = s[1].split_whitespace().collect();
        assert_eq!(header.len(), 2 + FIGURES.len(), "{}", s[1]);
    }

    #[test]
    fn the_sort_column_stays_when_others_go() {
        let u = Ui::new(By::Process, Column::TlsP99, true, String::new());
        let s = screen(80, 24, &u, rows());
        assert!(s[1].contains("TLS99"), "{}", s[1]);
        assert!(s[0].contains("sort TLS99 asc"), "{}", s[0]);
        // Ascending: the smallest TLS p99 first.
        assert!(s[2].starts_with("  3 python3"), "{}", s[2]);
        let narrow = screen(40, 24, &u, rows());
        assert!(narrow[1].contains("TLS99"), "{}", narrow[1]);
        assert!(narrow.iter().all(|l| l.chars().count() <= 40));
    }

    #[test]
    fn sorting_and_filtering_change_the_rows() {
        let mut u = Ui::new(By::Process, Column::Ttfb, false, String::new());
        let s = screen(80, 24, &u, rows());
        assert!(s[2].starts_with("202 curl"), "{}", s[2]);
        u.filter = "curl".into();
        let s = screen(80, 24, &u, rows());
        assert!(s[0].contains("| filter curl | 2/3 rows"), "{}", s[0]);
        assert!(!s.iter().any(|l| l.contains("python3")));
        u.editing = true;
        let s = screen(80, 24, &u, rows());
        assert!(s[23].starts_with("filter: curl_"), "{}", s[23]);
    }

    #[test]
    fn endpoints_show_their_address_and_direction() {
        let mut r = rows();
        r[2].inbound = true;
        r[2].endpoint = "a-rather-long-server-name.example.internal.test:8443".into();
        let u = Ui::new(By::Endpoint, Column::Requests, false, String::new());
        let s = screen(80, 24, &u, r);
        assert!(s[1].starts_with("ENDPOINT"), "{}", s[1]);
        let first: Vec<&str> = s[2].split_whitespace().collect();
        assert_eq!(first[1], "in", "{}", s[2]);
        assert!(
            first[0].starts_with('~') && first[0].ends_with(":8443"),
            "{}",
            s[2]
        );
        assert!(
            s[3].starts_with("127.0.0.1:8101") && s[3].contains(" out "),
            "{}",
            s[3]
        );
        assert!(s.iter().all(|l| l.chars().count() <= 80));
    }

    #[test]
    fn tiny_terminals_do_not_panic() {
        for (w, h) in [(1, 1), (10, 2), (20, 3), (0, 0)] {
            let _ = screen(w, h, &ui(), rows());
        }
    }
}
