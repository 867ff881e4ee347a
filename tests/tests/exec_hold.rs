//! Holding a new executable's first process at exec (`--exec-hold`): every
//! held process runs on, with its exit status; `off` holds nobody; a process
//! a killed observer left stopped at exec is resumed by the next one.
//! (That the hold puts a new Go program's probes on before its first
//! connection is tls_go.rs's fresh-client tests.)
//! Needs root (loads eBPF); see tests/src/lib.rs.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tests::*;

/// Fresh executables run while the observer watches.
const FRESH: usize = 20;

/// `FRESH` copies of /bin/true and of /bin/false (files no process ran),
/// each run once: each held, each resumed with its own exit status.
fn run_fresh_copies(dir: &std::path::Path) -> Vec<(PathBuf, bool, Duration)> {
    let mut runs = Vec::new();
    for i in 0..FRESH {
        for (name, ok) in [("true", true), ("false", false)] {
            let d = dir.join(format!("{name}{i}"));
            std::fs::create_dir_all(&d).unwrap();
            let bin = d.join(name);
            std::fs::copy(format!("/bin/{name}"), &bin).unwrap();
            let t = Instant::now();
            let status = Command::new(&bin).status().unwrap();
            assert_eq!(status.success(), ok, "{}: {status}", bin.display());
            runs.push((bin, ok, t.elapsed()));
        }
    }
    runs
}

/// A fresh directory for this test's copies.
fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("observer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn new_executables_are_held_and_resumed() {
    let Some(_serial) = begin("exec_hold_on", &[]) else {
        return;
    };
    let dir = tempdir("exec-hold");
    let w = Watch::start(&[]);
    let runs = run_fresh_copies(&dir);
    let out = w.stop();
    let hold = &out.summary()["tls"]["exec_hold"];
    assert_eq!(hold["on"], true, "{hold:#}");
    let held = hold["held"].as_u64().unwrap();
    assert!(
        held >= runs.len() as u64,
        "{} new executables, {held} held: {hold:#}",
        runs.len()
    );
    // A hold is the file's look (no TLS in these) and a signal each way.
    let slowest = runs.iter().map(|r| r.2).max().unwrap();
    assert!(slowest < Duration::from_secs(1), "{slowest:?}: {hold:#}");
    assert_eq!(out.summary()["dropped"]["kernel_ring"], 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn exec_hold_off_holds_nobody() {
    let Some(_serial) = begin("exec_hold_off", &[]) else {
        return;
    };
    let dir = tempdir("exec-hold-off");
    let w = Watch::start(&["--exec-hold", "off"]);
    run_fresh_copies(&dir);
    let out = w.stop();
    let hold = &out.summary()["tls"]["exec_hold"];
    assert_eq!(hold["on"], false, "{hold:#}");
    assert_eq!(hold["held"], 0, "{hold:#}");
    assert_eq!(hold["off_reason"], "--exec-hold off", "{hold:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// State letter of /proc/PID/stat.
fn state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

#[test]
fn a_process_left_stopped_at_exec_is_resumed_at_start() {
    let Some(_serial) = begin("exec_hold_left_behind", &["python3"]) else {
        return;
    };
    left_stopped_is_resumed_at_start("stopped_at_exec.py");
}

/// A multi-threaded process held at an mmap of a worker thread, its main
/// thread in another call (as rustc's were, left stopped for good while
/// only the main thread's call was looked at).
#[test]
fn a_process_left_stopped_in_a_threads_mmap_is_resumed_at_start() {
    let Some(_serial) = begin("exec_hold_left_behind_mmap", &["python3"]) else {
        return;
    };
    left_stopped_is_resumed_at_start("stopped_in_mmap.py");
}

/// The process `helper` leaves stopped where a hold stops one runs again
/// once an observer has started.
fn left_stopped_is_resumed_at_start(helper_name: &str) {
    let out = Command::new("python3")
        .arg(helper(helper_name))
        .arg("30")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let pid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(state(pid), Some('T'), "pid {pid} stopped at exec");
    let w = Watch::start(&[]);
    let deadline = Instant::now() + Duration::from_secs(2);
    while state(pid) == Some('T') && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let now = state(pid);
    // SAFETY: kill(2) on the sleep this test made.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let out = w.stop();
    // Running again: R or S, or D while the resumed exec reads its file.
    assert!(
        matches!(now, Some('R' | 'S' | 'D')),
        "pid {pid}: state {now:?} after the observer started (T: still stopped)"
    );
    let hold = &out.summary()["tls"]["exec_hold"];
    assert!(hold["resumed_at_start"].as_u64() >= Some(1), "{hold:#}");
}
