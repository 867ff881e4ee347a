//! `observer top` in a real terminal: tmux, 80x24, keys sent with
//! `send-keys`, the screen read with `capture-pane`. Two curl processes ask
//! two local servers that wait a known time before they answer (100 ms and
//! 250 ms); their rows must show their request counts exactly and a
//! first-byte p50 between the injected wait and curl's own clock
//! (`time_starttransfer`). Then the endpoints view, sorting, the filter,
//! and `q`: exit status 0, the terminal as it was (the same `stty` settings,
//! the alternate screen left), the `ready` and summary lines printed after
//! the table, and no eBPF program of ours left loaded.
//! One test in this binary: it counts the machine's loaded programs.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tests::{
    tmux::{row_of, table, Tmux},
    *,
};

fn index_of(rows: &[HashMap<String, String>], pid: u32) -> usize {
    rows.iter()
        .position(|r| r["PID"] == pid.to_string())
        .unwrap_or_else(|| panic!("no row for pid {pid}: {rows:#?}"))
}

/// "100ms", "99.5ms", "1.25s" -> milliseconds.
fn millis(cell: &str) -> f64 {
    if let Some(ms) = cell.strip_suffix("ms") {
        return ms.parse().unwrap();
    }
    let s: f64 = cell
        .strip_suffix('s')
        .unwrap_or_else(|| panic!("not a duration: {cell}"))
        .parse()
        .unwrap();
    s * 1e3
}

/// The observer the pane's shell started (its child named `observer`).
fn observer_in(tmux: &Tmux) -> u32 {
    let shell = tmux.display("#{pane_pid}");
    for e in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": the comm may hold spaces.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let ppid = rest.split_whitespace().nth(1);
        if ppid == Some(shell.as_str()) && head.ends_with("(observer") {
            return pid;
        }
    }
    panic!("no observer under the pane's shell {shell}");
}

/// The eBPF programs a process holds: `prog_id` in its fds' fdinfo (program
/// and link fds). Other observers on the machine hold others.
fn programs_held(pid: u32) -> BTreeSet<u32> {
    let mut ids = BTreeSet::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .filter_map(Result::ok)
    {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        ids.extend(
            text.lines()
                .filter_map(|l| l.strip_prefix("prog_id:"))
                .filter_map(|v| v.trim().parse::<u32>().ok()),
        );
    }
    ids
}

/// Ids of every eBPF program loaded on the machine.
fn loaded_ids() -> BTreeSet<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .collect()
}

/// Uprobes the observer made through tracefs (group `observer_<pid>`).
fn uprobe_events_of(pid: u32) -> Vec<String> {
    let group = format!("observer_{pid}/");
    [
        "/sys/kernel/tracing/uprobe_events",
        "/sys/kernel/debug/tracing/uprobe_events",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .flat_map(|t| t.lines().map(str::to_owned).collect::<Vec<_>>())
    .filter(|l| l.contains(&group))
    .collect()
}

/// curl fetching `n` times over one kept-alive connection; its pid and
/// its own first-byte times (`time_starttransfer`, ms), in order.
fn curl(port: u16, n: usize) -> std::process::Child {
    let url = format!("http://127.0.0.1:{port}/");
    Command::new("curl")
        .args(["-s", "-w", "%{time_starttransfer}\\n"])
        // Each URL's own -o: the answers stay off curl's stdout.
        .args(std::iter::repeat_n(["-o", "/dev/null", url.as_str()], n).flatten())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

fn curl_times(child: std::process::Child) -> Vec<f64> {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "curl failed: {}", out.status);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse::<f64>().unwrap() * 1e3)
        .collect()
}

/// The nearest-rank median, as top computes it.
fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len().div_ceil(2) - 1]
}

const TITLE: &str = "observer top |";

/// The utilization the test NVML reports for the fast server's GPU.
const GPU_PCT: u32 = 73;

/// A file removed on drop.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn title_has(screen: &[String], what: &str) -> bool {
    screen
        .first()
        .is_some_and(|t| t.starts_with(TITLE) && t.contains(what))
}

#[test]
fn top_shows_the_hosts_processes_and_endpoints_live() {
    let Some(_serial) = begin("top", &["tmux", "curl", "python3"]) else {
        return;
    };
    let t0 = Instant::now();
    // Without a terminal, and with watch's --json, it refuses to start.
    let out = Command::new(observer_bin())
        .arg("top")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("observer top draws on a terminal"),
        "{out:?}"
    );
    let out = Command::new(observer_bin())
        .args(["top", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // Plain HTTP, kept alive: every GET answered after the injected wait.
    let (fast_ms, slow_ms) = (100.0, 250.0);
    let (fast_n, slow_n) = (6, 3);
    let fast = llm_server(None, fast_ms, 0.0, 1);
    let slow = llm_server(None, slow_ms, 0.0, 1);
    // The fast server holds a context on a GPU busy at 73% (the test
    // build of NVML, as tests/tests/gpu.rs uses it).
    let nvml_config =
        std::env::temp_dir().join(format!("observer-top-nvml-{}.json", std::process::id()));
    let _nvml_config = Removed(nvml_config.clone());
    std::fs::write(
        &nvml_config,
        serde_json::json!({"devices": [
            {"uuid": "GPU-00000000-7373", "name": "Stub H200", "util_gpu": GPU_PCT, "util_mem": 10,
             "mem_used": 1_048_576_000u64, "mem_total": 8_388_608_000u64,
             "processes": [{"pid": fast.pid(), "used_memory": 524_288_000u64, "sm_util": GPU_PCT}]}
        ]})
        .to_string(),
    )
    .unwrap();
    let shell = format!(
        "stty -g > stty.before; NVML_STUB_CONFIG={} {} top --window 60 --port {},{} --nvml-lib {} --gpu-interval 50; rc=$?; date +%s.%N > exited.at; echo \"top exited $rc\"; stty -g > stty.after; sleep 600",
        nvml_config.display(),
        observer_bin().display(),
        fast.port,
        slow.port,
        nvml_stub().display(),
    );
    let tmux = Tmux::start(&shell);
    assert_eq!(tmux.display("#{pane_width}x#{pane_height}"), "80x24");
    tmux.wait("the table, live (every probe attached)", 60, |s| {
        s.first()
            .is_some_and(|l| l.starts_with(TITLE) && l.ends_with("| live"))
    });
    assert_eq!(
        tmux.display("#{alternate_on}"),
        "1",
        "the table is on the alternate screen"
    );
    let observer = observer_in(&tmux);
    let held = programs_held(observer);
    // All but a stand-in (loaded only where its program cannot go).
    let used = observer::programs::PROGRAMS
        .iter()
        .filter(|p| !observer::programs::is_stand_in(p.name))
        .count();
    assert_eq!(
        held.len(),
        used,
        "every program of the table loaded: {held:?}"
    );

    let (a, b) = (curl(fast.port, fast_n), curl(slow.port, slow_n));
    let (pid_a, pid_b) = (a.id(), b.id());
    let (times_a, times_b) = (curl_times(a), curl_times(b));
    assert_eq!((times_a.len(), times_b.len()), (fast_n, slow_n));

    // Both curls, and both servers, with every request counted.
    let screen = tmux.wait("the rows of both curls and both servers", 15, |s| {
        let rows = table(s);
        let reqs = |col: &str, v: String| row_of(&rows, col, &v).map(|r| r["REQS"].clone());
        reqs("PID", pid_a.to_string()) == Some(fast_n.to_string())
            && reqs("PID", pid_b.to_string()) == Some(slow_n.to_string())
            && reqs("PID", fast.pid().to_string()) == Some(fast_n.to_string())
            && reqs("PID", slow.pid().to_string()) == Some(slow_n.to_string())
    });
    eprintln!("{}", screen.join("\n"));
    let rows = table(&screen);
    assert!(screen.iter().all(|l| l.chars().count() <= 80));
    for (pid, comm, wait, curl_ms) in [
        (pid_a, "curl", fast_ms, Some(&times_a)),
        (pid_b, "curl", slow_ms, Some(&times_b)),
        (fast.pid(), "python3", fast_ms, None),
        (slow.pid(), "python3", slow_ms, None),
    ] {
        let r = row_of(&rows, "PID", &pid.to_string()).unwrap();
        assert_eq!(r["COMM"], comm);
        assert_eq!(r["ERR"], "0", "{r:?}");
        // Only the fast server holds the GPU; its utilization is constant.
        let gpu = if pid == fast.pid() {
            GPU_PCT.to_string()
        } else {
            "-".into()
        };
        assert_eq!(r["GPU%"], gpu, "{r:?}");
        let shown = millis(&r["TTFB50"]);
        // Shown rounded to the millisecond: within 0.5 ms of the value. The
        // server waits at least the injected time after reading the
        // request; the observer's first byte lies inside curl's own.
        assert!(
            shown >= wait,
            "pid {pid}: TTFB50 {shown} ms < the injected {wait} ms"
        );
        let client = curl_ms.map_or_else(
            || {
                if wait == fast_ms {
                    p50(times_a.clone())
                } else {
                    p50(times_b.clone())
                }
            },
            |t| p50(t.clone()),
        );
        assert!(
            shown <= client + 0.5,
            "pid {pid}: TTFB50 {shown} ms > curl's own median {client:.3} ms"
        );
        eprintln!("pid {pid} {comm}: TTFB50 {shown} ms (injected {wait}, curl {client:.3})");
    }

    // Sorting: by requests per second (the default), reversed, then by
    // first-byte p50 chosen with `>`.
    assert!(
        index_of(&rows, pid_a) < index_of(&rows, pid_b),
        "6 requests above 3"
    );
    tmux.type_text("r");
    let s = tmux.wait("reversed", 5, |s| title_has(s, "sort REQ/S asc"));
    let rows = table(&s);
    assert!(
        index_of(&rows, pid_b) < index_of(&rows, pid_a),
        "reversed: {s:#?}"
    );
    tmux.type_text("r");
    let mut title = tmux.screen().first().cloned().unwrap_or_default();
    for _ in 0..17 {
        if title.contains("sort TTFB50 desc") {
            break;
        }
        tmux.type_text(">");
        let s = tmux.wait("the next sort column", 5, |s| s.first() != Some(&title));
        title = s[0].clone();
    }
    assert!(title.contains("sort TTFB50 desc"), "{title}");
    let rows = table(&tmux.screen());
    assert!(
        index_of(&rows, pid_b) < index_of(&rows, pid_a),
        "250 ms above 100 ms: {rows:#?}"
    );

    // Endpoints: each server once as the curls saw it, once as itself.
    tmux.type_text("e");
    let s = tmux.wait("the endpoints", 5, |s| {
        s.iter().any(|l| l.starts_with("ENDPOINT"))
    });
    let rows = table(&s);
    for (port, n, wait) in [(fast.port, fast_n, fast_ms), (slow.port, slow_n, slow_ms)] {
        let ep = format!("127.0.0.1:{port}");
        for dir in ["out", "in"] {
            let r = rows
                .iter()
                .find(|r| r["ENDPOINT"] == ep && r["DIR"] == dir)
                .unwrap_or_else(|| panic!("no {dir} row for {ep}: {s:#?}"));
            assert_eq!(r["REQS"], n.to_string(), "{r:?}");
            assert!(millis(&r["TTFB50"]) >= wait, "{r:?}");
        }
    }
    tmux.type_text("e");
    tmux.wait("back to processes", 5, |s| {
        s.iter().any(|l| l.trim_start().starts_with("PID"))
    });

    // The filter: the servers only, then nothing filtered again.
    tmux.type_text("/python");
    tmux.key("Enter");
    let s = tmux.wait("filtered", 5, |s| title_has(s, "| filter python |"));
    let rows = table(&s);
    assert!(rows.iter().all(|r| r["COMM"] == "python3"), "{s:#?}");
    assert!(row_of(&rows, "PID", &fast.pid().to_string()).is_some());
    assert!(row_of(&rows, "PID", &pid_a.to_string()).is_none());
    tmux.key("Escape");
    let s = tmux.wait("unfiltered", 5, |s| {
        s.first()
            .is_some_and(|t| t.starts_with(TITLE) && !t.contains("filter"))
    });
    assert!(row_of(&table(&s), "PID", &pid_a.to_string()).is_some());

    // q: the observer stops on its normal path and the terminal is back,
    // within a second (a DaemonSet's rolling update and a user both wait on
    // it). Timed from just before the key to the shell's clock at top's exit.
    let sent = std::time::SystemTime::now();
    tmux.type_text("q");
    let s = tmux.wait("top's exit", 30, |s| {
        s.iter().any(|l| l.starts_with("top exited"))
    });
    assert!(s.iter().any(|l| l == "top exited 0"), "{s:#?}");
    let exited: f64 = std::fs::read_to_string(tmux.dir.join("exited.at"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let sent = sent
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let took = exited - sent;
    eprintln!("top exited {took:.3} s after q");
    // Target 1 s (0.7 s here, as for a signal: tests/tests/detach.rs); the
    // bound leaves a slow CI machine room. It was 3-4.5 s with perf-event
    // uprobes.
    assert!(took < 3.0, "top exited {took:.3} s after q");
    assert_eq!(
        tmux.display("#{alternate_on}"),
        "0",
        "the alternate screen is left"
    );
    assert!(
        !s.iter().any(|l| l.starts_with(TITLE)),
        "no table on the normal screen: {s:#?}"
    );
    assert!(
        s.iter().any(|l| l.starts_with("ready: observer pid")),
        "{s:#?}"
    );
    let summary = s
        .iter()
        .find(|l| l.starts_with("summary:"))
        .unwrap_or_else(|| panic!("{s:#?}"));
    assert!(
        summary.contains("; 0 program attachments failed"),
        "{summary}"
    );
    let after = tmux.dir.join("stty.after");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !after.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        std::fs::read_to_string(tmux.dir.join("stty.before")).unwrap(),
        std::fs::read_to_string(&after).unwrap(),
        "the terminal's settings are back (raw mode off)"
    );
    // The kernel frees a program after an RCU grace period: allow it a moment.
    let deadline = Instant::now() + Duration::from_secs(3);
    let left = || -> BTreeSet<u32> { loaded_ids().intersection(&held).copied().collect() };
    while !left().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        left().is_empty(),
        "programs of the observer left loaded: {:?}",
        left()
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{observer}")).exists(),
        "the observer is gone"
    );
    assert_eq!(
        uprobe_events_of(observer),
        Vec::<String>::new(),
        "no uprobe left in tracefs"
    );
    drop(tmux);
    eprintln!("top test took {:?}", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
}
