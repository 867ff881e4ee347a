//! Durations, sizes and clock times as people read them ("1.23ms",
//! "4.0KiB", "12:00:01.250"): a leaf every text writer shares.

/// "1.23ms"-style durations; "-" for phases that did not happen.
pub fn fmt_ns(ns: Option<u64>) -> String {
    match ns {
        None => "-".into(),
        Some(ns) if ns < 1_000_000 => format!("{:.3}ms", ns as f64 / 1e6),
        Some(ns) if ns < 1_000_000_000 => format!("{:.1}ms", ns as f64 / 1e6),
        Some(ns) => format!("{:.2}s", ns as f64 / 1e9),
    }
}

pub fn fmt_bytes(b: u64) -> String {
    match b {
        b if b < 1024 => format!("{b}B"),
        b if b < 1024 * 1024 => format!("{:.1}KiB", b as f64 / 1024.0),
        b if b < 1024 * 1024 * 1024 => format!("{:.1}MiB", b as f64 / 1048576.0),
        b => format!("{:.2}GiB", b as f64 / 1073741824.0),
    }
}

/// HH:MM:SS.mmm (UTC) of a Unix time in nanoseconds.
pub fn fmt_time(unix_ns: u64) -> String {
    let ms = unix_ns / 1_000_000;
    let secs = ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60,
        ms % 1000
    )
}

/// "480 ms", "1.03 s", "2.5 ms", "40 µs" (loopback round trips).
pub fn dur(ns: u64) -> String {
    let ms = ns as f64 / 1e6;
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 10.0 {
        format!("{ms:.0} ms")
    } else if ms >= 1.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.0} µs", ms * 1000.0)
    }
}
