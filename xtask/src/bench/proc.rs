//! Reading a process's CPU time and peak memory from /proc.

use std::time::Duration;

/// Clock ticks per second for /proc/PID/stat (USER_HZ).
fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// User + system CPU seconds of process `pid` (all its threads), or 0 if gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields overall.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / ticks_per_sec()
}

/// Peak resident set size in bytes (VmHWM), or 0 if gone.
pub fn peak_rss_bytes(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:") * 1024
}

/// Current resident set size in bytes (VmRSS), or 0 if gone.
pub fn rss_bytes(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:") * 1024
}

/// Anonymous resident memory in bytes (RssAnon: the heap, stacks, maps the
/// process wrote), or 0 if gone.
pub fn rss_anon_bytes(pid: u32) -> u64 {
    status_kib(pid, "RssAnon:") * 1024
}

fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Children of `pid` (e.g. nginx's workers).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Waits until `f` is true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}
