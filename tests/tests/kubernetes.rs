//! Container and pod identity without the API server: a process the test
//! puts in a real cgroup laid out as the kubelet lays out a pod's
//! (`kubepods/burstable/pod<uid>/<container id>` on the host's cgroup v2
//! tree), with a kubelet-like pod log directory, gets `container` on its
//! connection, request and DNS records and the `container.id` / `k8s.*`
//! resource attributes on its spans; a process outside gets neither.
//! Needs root (loads eBPF, makes cgroups); see tests/src/lib.rs.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use tests::{otlp::*, *};

const CONTAINER_ID: &str = "5e1f0c4b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f";
const POD_UID: &str = "7c2b3d4e-5f60-4a1b-8c9d-0e1f2a3b4c5d";

/// A pod's cgroup (and its parents the test made), removed on drop.
struct PodCgroup {
    made: Vec<PathBuf>,
    leaf: PathBuf,
}

impl PodCgroup {
    fn new() -> PodCgroup {
        let root = observer::cgroup::root().expect("a cgroup v2 hierarchy");
        let mut made = Vec::new();
        let mut dir = root;
        for part in [
            "kubepods",
            "burstable",
            &format!("pod{POD_UID}"),
            CONTAINER_ID,
        ] {
            dir = dir.join(part);
            if !dir.exists() {
                std::fs::create_dir(&dir).unwrap();
                made.push(dir.clone());
            }
        }
        PodCgroup { made, leaf: dir }
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        // Deepest first; a cgroup goes once its processes have exited.
        for dir in self.made.iter().rev() {
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// A kubelet-like log layout: `pods/<namespace>_<pod>_<uid>/<container>/`.
struct PodLogs(PathBuf);

impl PodLogs {
    fn new() -> PodLogs {
        let root = std::env::temp_dir().join(format!("observer-kubelet-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join(format!("pods/llm_chat-api-6f7d_{POD_UID}/server")))
            .unwrap();
        PodLogs(root)
    }

    fn pods(&self) -> PathBuf {
        self.0.join("pods")
    }
}

impl Drop for PodLogs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A name lookup (getent: curl resolves "localhost" by itself) and curl,
/// inside `cgroup` (their shell joins it first): the shell's pid, which is
/// curl's, and getent's.
fn curl_in(cgroup: &std::path::Path, url: &str) -> (u32, u32) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs || exit 1; getent ahosts localhost > /dev/null & wait $!; echo $! $$; exec curl -s -o /dev/null {url}",
            cgroup.display()
        ))
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "in the pod cgroup: {out:?}");
    pids(&out.stdout)
}

fn curl_outside(url: &str) -> (u32, u32) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "getent ahosts localhost > /dev/null & wait $!; echo $! $$; exec curl -s -o /dev/null {url}"
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    pids(&out.stdout)
}

/// "getent's pid, curl's pid" (curl is the shell that printed them).
fn pids(stdout: &[u8]) -> (u32, u32) {
    let text = String::from_utf8(stdout.to_vec()).unwrap();
    let mut p = text.split_whitespace().map(|x| x.parse().unwrap());
    let getent = p.next().unwrap();
    (p.next().unwrap(), getent)
}

fn expected_container() -> Value {
    serde_json::json!({
        "id": CONTAINER_ID,
        "pod_uid": POD_UID,
        "pod_name": "chat-api-6f7d",
        "namespace": "llm",
        "name": "server",
        "node_name": "node-7",
    })
}

#[test]
fn pod_identity_on_records_and_spans() {
    let Some(_serial) = begin("pod_identity", &["curl", "python3"]) else {
        return;
    };
    let cgroup = PodCgroup::new();
    let logs = PodLogs::new();
    // Plain HTTP/1.1 (an OpenAI-compatible server's GET answers too).
    let server = llm_server(None, 0.0, 0.0, 1);
    let (rec, port) = grpc_receiver();
    let out_path = logs.0.join("records.jsonl");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut cmd = Command::new(observer_bin());
    cmd.args(["run", "--json", "--print", "--prometheus-listen", "none"])
        // By name, not port: DNS records have no port.
        .args(["--comm", "curl,getent"])
        .arg("--pod-log-dir")
        .arg(logs.pods())
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        )
        .env("K8S_NODE_NAME", "node-7");
    let run = Daemon::start_with_stdout(cmd, Stdio::from(out));
    // By name: the C library's lookup is a DNS record of the same process.
    let url = format!("http://localhost:{}/n/1", server.port);
    let (inside, getent_inside) = curl_in(&cgroup.leaf, &url);
    let (outside, getent_outside) = curl_outside(&url);
    std::thread::sleep(Duration::from_millis(300));
    run.stop();

    let records: Vec<Value> = std::fs::read_to_string(&out_path)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |pid: u32, kind: &str| -> Vec<&Value> {
        records
            .iter()
            .filter(|r| r["pid"] == pid && r["kind"] == kind)
            .collect()
    };
    for (kind, inside, outside) in [
        ("connection", inside, outside),
        ("request", inside, outside),
        ("dns", getent_inside, getent_outside),
    ] {
        let mine = of(inside, kind);
        assert!(
            !mine.is_empty(),
            "no {kind} record from the pod: {records:#?}"
        );
        for r in mine {
            assert_eq!(r["container"], expected_container(), "{kind}: {r:#}");
        }
        let theirs = of(outside, kind);
        assert!(
            !theirs.is_empty(),
            "no {kind} record from outside: {records:#?}"
        );
        for r in theirs {
            assert_eq!(r["container"], Value::Null, "outside the pod: {r:#}");
        }
    }

    let spans = all_spans(&rec);
    let resource_of = |pid: u32| {
        spans
            .iter()
            .find(|(res, _)| attr_int(res, "process.pid") == Some(i64::from(pid)))
            .map(|(res, _)| res.clone())
            .unwrap_or_else(|| panic!("no span of pid {pid}"))
    };
    let res = resource_of(inside);
    for (key, want) in [
        ("container.id", CONTAINER_ID),
        ("k8s.pod.uid", POD_UID),
        ("k8s.pod.name", "chat-api-6f7d"),
        ("k8s.namespace.name", "llm"),
        ("k8s.container.name", "server"),
        ("k8s.node.name", "node-7"),
    ] {
        assert_eq!(
            attr_str(&res, key).as_deref(),
            Some(want),
            "{key}: {res:#?}"
        );
    }
    let res = resource_of(outside);
    assert_eq!(attr_str(&res, "container.id"), None, "{res:#?}");
    assert_eq!(attr_str(&res, "k8s.pod.uid"), None, "{res:#?}");
}
