//! The deployment files under deploy/: the Kubernetes manifests (the kustomize
//! base and its overlays, rendered by kubectl's own kustomize) validated
//! against the Kubernetes schemas and checked for what the observer needs;
//! the config files they carry parsed and resolved by the observer's own
//! parser; the systemd unit verified by systemd-analyze. The capabilities come
//! from deploy/capabilities.txt alone, and both deployments must ask for
//! exactly that set.
//!
//! Nothing here loads eBPF, so no root is needed (the image test runs the
//! observer the way the DaemonSet does).
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

use clap::Parser as _;
use observer::{
    cli::{Cli, Command as Sub, RunArgs},
    export::config,
};
use serde_json::Value;
use tests::{kubernetes_validate_python, observer_bin, require_tool};

/// The kustomizations a user applies: the base and each overlay.
const VARIANTS: [&str; 3] = ["base", "overlays/otlp-collector", "overlays/jaeger"];

/// The Kubernetes versions validated against: the oldest one still widely
/// run and the newest the schemas know.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// deploy/capabilities.txt: one `CAP_*` name a line, `#` comments.
fn capabilities() -> BTreeSet<String> {
    let path = deploy().join("capabilities.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut set = BTreeSet::new();
    for line in text.lines() {
        let cap = line.split('#').next().unwrap().trim();
        if cap.is_empty() {
            continue;
        }
        assert!(
            cap.starts_with("CAP_") && cap.bytes().all(|b| b == b'_' || b.is_ascii_uppercase()),
            "{}: {cap:?} is not a capability name like CAP_BPF",
            path.display()
        );
        assert!(
            set.insert(cap.to_owned()),
            "{cap} twice in {}",
            path.display()
        );
    }
    assert!(!set.is_empty(), "{} names no capability", path.display());
    set
}

/// A directory of this test's own, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "observer-deploy-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `kubectl kustomize` of one variant: the YAML a user's `kubectl apply -k`
/// would send, and its objects.
fn render(variant: &str) -> (String, Vec<Value>) {
    let dir = deploy().join("kubernetes").join(variant);
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).unwrap();
    let mut objects = Vec::new();
    let mut doc = String::new();
    // kustomize separates objects with `---` lines; inside a block scalar
    // a line is indented, so the split is exact.
    for line in yaml.lines().chain(std::iter::once("---")) {
        if line == "---" {
            if !doc.trim().is_empty() {
                objects.push(serde_yaml::from_str::<Value>(&doc).unwrap());
            }
            doc.clear();
        } else {
            doc.push_str(line);
            doc.push('\n');
        }
    }
    (yaml, objects)
}

/// The one object of `kind`.
fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} expected: {found:#?}");
    found[0]
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

/// The observer container of the DaemonSet.
fn observer_container(ds: &Value) -> &Value {
    let containers = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1, "one container: {containers:#?}");
    &containers[0]
}

/// The container's command line parsed by observer's own CLI.
fn run_args(argv: &[String]) -> RunArgs {
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    match cli.command {
        Sub::Run(args) => args,
        other => panic!("{argv:?} is not `observer run`: {other:?}"),
    }
}

/// The settings `observer run` resolves from `argv`, the config file at
/// `path` and the environment `env`, through the functions its main calls.
fn resolve(args: &RunArgs, path: &Path, env: &BTreeMap<String, String>) -> config::RunSettings {
    // (The parser's errors name the file.)
    let file = config::read_file(path).unwrap_or_else(|e| panic!("{e}"));
    let flags = config::Flags {
        prometheus_listen: args.prometheus_listen.clone(),
        sample_ratio: args.sample_ratio,
        slow_threshold: args.slow_threshold,
        service_name: args.service_name.clone(),
        max_series: args.max_series,
    };
    config::resolve(&file, &|k| env.get(k).cloned(), &flags)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A container port: a number, or the name of one of the container's ports.
fn port_of(container: &Value, port: &Value) -> u64 {
    if let Some(n) = port.as_u64() {
        return n;
    }
    let name = port.as_str().unwrap();
    container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port named {name}"))
}

/// A resource quantity as a number (cores, bytes): the suffixes used here.
fn quantity(v: &Value) -> f64 {
    let s = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
    let (num, mult) = [
        ("Ki", 1024f64),
        ("Mi", 1024f64 * 1024.0),
        ("Gi", 1024f64 * 1024.0 * 1024.0),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
    ]
    .iter()
    .find_map(|(suffix, m)| s.strip_suffix(suffix).map(|n| (n, *m)))
    .unwrap_or((s.as_str(), 1.0));
    num.parse::<f64>()
        .unwrap_or_else(|_| panic!("quantity {s:?}"))
        * mult
}

/// Every file under deploy/kubernetes is one a kustomization names (a
/// resource, a patch or a generator's file), so none escapes the rendering
/// and with it the validation below.
fn every_file_is_rendered() {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, files);
            } else {
                files.push(p);
            }
        }
    }
    let root = deploy().join("kubernetes");
    let mut files = Vec::new();
    walk(&root, &mut files);
    for f in files {
        let dir = f.parent().unwrap();
        let name = f.file_name().unwrap().to_str().unwrap();
        let k = std::fs::read_to_string(dir.join("kustomization.yaml"))
            .unwrap_or_else(|_| panic!("{}: no kustomization.yaml beside it", f.display()));
        let k: Value = serde_yaml::from_str(&k).unwrap();
        let mut named = strings(&k["resources"]);
        named.extend(
            k["patches"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["path"].as_str().map(str::to_owned)),
        );
        for g in k["configMapGenerator"].as_array().into_iter().flatten() {
            // `files:` entries are PATH or KEY=PATH.
            named.extend(
                strings(&g["files"])
                    .into_iter()
                    .map(|f| f.rsplit('=').next().unwrap().to_owned()),
            );
        }
        assert!(
            name == "kustomization.yaml" || named.iter().any(|n| n == name),
            "{} is named by no kustomization, so nothing renders or validates it",
            f.display()
        );
    }
}

#[test]
fn manifests_render_and_pass_the_kubernetes_schemas() {
    let test = "manifests_render_and_pass_the_kubernetes_schemas";
    if !require_tool(test, "kubectl") {
        return;
    }
    let Some(python) = kubernetes_validate_python(test) else {
        return;
    };
    every_file_is_rendered();
    let tmp = TempDir::new("validate");
    let validate = |version: &str, files: &[PathBuf]| {
        Command::new(&python)
            .args(["-m", "kubernetes_validate", "--strict", "--no-warn"])
            .args(["-k", version])
            .args(files)
            .output()
            .unwrap()
    };
    let mut files = Vec::new();
    let mut jaeger_yaml = String::new();
    for v in VARIANTS {
        let (yaml, objects) = render(v);
        let kinds: BTreeSet<&str> = objects
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            BTreeSet::from([
                "ConfigMap",
                "DaemonSet",
                "Namespace",
                "NetworkPolicy",
                "Service",
                "ServiceAccount"
            ]),
            "{v}"
        );
        for o in &objects {
            match o["kind"].as_str().unwrap() {
                "Namespace" => assert_eq!(o["metadata"]["name"], "observer", "{v}"),
                _ => assert_eq!(o["metadata"]["namespace"], "observer", "{v}: {o:#}"),
            }
        }
        let f = tmp.0.join(format!("{}.yaml", v.replace('/', "-")));
        std::fs::write(&f, &yaml).unwrap();
        files.push(f);
        if v.ends_with("jaeger") {
            jaeger_yaml = yaml;
        }
    }
    for version in KUBERNETES_VERSIONS {
        let out = validate(version, &files);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "Kubernetes {version}: {said}");
        // Every object of every variant was checked.
        assert_eq!(
            said.matches(" passed for resource ").count(),
            6 * VARIANTS.len(),
            "{said}"
        );
    }
    // The validator is strict: a misspelled field fails it.
    let bad = jaeger_yaml.replace("readOnlyRootFilesystem", "readOnlyRootFileSystem");
    assert_ne!(bad, jaeger_yaml);
    let f = tmp.0.join("misspelled.yaml");
    std::fs::write(&f, bad).unwrap();
    let out = validate(KUBERNETES_VERSIONS[0], &[f]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success() && said.contains("readOnlyRootFileSystem"),
        "a misspelled field passed: {said}"
    );
}

#[test]
fn daemonset_runs_on_every_node_with_the_capability_file_and_no_more() {
    let test = "daemonset_runs_on_every_node_with_the_capability_file_and_no_more";
    if !require_tool(test, "kubectl") {
        return;
    }
    let caps = capabilities();
    for v in VARIANTS {
        let (_, objects) = render(v);
        let ds = one(&objects, "DaemonSet");
        let pod = &ds["spec"]["template"]["spec"];
        let c = observer_container(ds);
        let sc = &c["securityContext"];
        assert_eq!(pod["hostPID"], true, "{v}: host PID namespace");
        assert_ne!(pod["hostNetwork"], true, "{v}: no host network needed");
        assert_ne!(sc["privileged"], true, "{v}: never privileged");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{v}");
        assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{v}");
        // Kubernetes spells them without CAP_ (either is accepted here).
        let add = strings(&sc["capabilities"]["add"]);
        let added: BTreeSet<String> = add
            .iter()
            .map(|c| format!("CAP_{}", c.trim_start_matches("CAP_")))
            .collect();
        assert_eq!(added.len(), add.len(), "{v}: a capability twice: {add:?}");
        assert_eq!(
            added, caps,
            "{v}: the DaemonSet's capabilities.add differs from deploy/capabilities.txt"
        );
        if caps.contains("CAP_SYS_ADMIN") {
            assert_ne!(
                sc["allowPrivilegeEscalation"], false,
                "{v}: with SYS_ADMIN, allowPrivilegeEscalation: false promises nothing"
            );
        }
        for ps in [&pod["securityContext"], sc] {
            assert_ne!(ps["seccompProfile"]["type"], "Unconfined", "{v}");
        }
        // Every node: a toleration with no key and no effect tolerates every taint.
        assert!(
            pod["tolerations"].as_array().unwrap().iter().any(|t| {
                t["operator"] == "Exists" && t["key"].is_null() && t["effect"].is_null()
            }),
            "{v}: {:#}",
            pod["tolerations"]
        );
        // Resources: requested and capped, requests within limits.
        for r in ["cpu", "memory"] {
            let req = quantity(&c["resources"]["requests"][r]);
            let lim = quantity(&c["resources"]["limits"][r]);
            assert!(
                req > 0.0 && req <= lim,
                "{v}: {r} request {req} limit {lim}"
            );
        }
        let mem_limit = quantity(&c["resources"]["limits"]["memory"]);
        assert!(
            mem_limit >= 128.0 * 1024.0 * 1024.0,
            "{v}: 28 MiB peak RSS plus the BPF maps charged to the pod need room"
        );
        // Probes on the observer's own endpoints, on its Prometheus port.
        let metrics = port_of(c, &Value::from("metrics"));
        assert_eq!(metrics, 9464, "{v}");
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            let get = &c[probe]["httpGet"];
            assert_eq!(get["path"], path, "{v}: {probe}");
            assert_eq!(port_of(c, &get["port"]), 9464, "{v}: {probe}");
        }
        if !c["startupProbe"].is_null() {
            assert_eq!(c["startupProbe"]["httpGet"]["path"], "/healthz", "{v}");
        }
        // The node's name from the downward API.
        let node = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "K8S_NODE_NAME")
            .unwrap_or_else(|| panic!("{v}: no K8S_NODE_NAME"));
        assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
        // The Service reaches the pods' metrics port.
        let svc = one(&objects, "Service");
        for (k, val) in svc["spec"]["selector"].as_object().unwrap() {
            assert_eq!(&ds["spec"]["template"]["metadata"]["labels"][k], val, "{v}");
        }
        let sp = &svc["spec"]["ports"][0];
        assert_eq!(sp["name"], "metrics", "{v}");
        assert_eq!(sp["port"], 9464, "{v}");
        assert_eq!(port_of(c, &sp["targetPort"]), 9464, "{v}");
        // Least exposure: no port on the node, and the pods take nothing
        // but the metrics port, from Prometheus (the kubelet's probes come
        // from the node, which a NetworkPolicy always admits).
        for p in c["ports"].as_array().unwrap() {
            assert!(p["hostPort"].is_null(), "{v}: a port on the node: {p}");
        }
        let np = one(&objects, "NetworkPolicy");
        assert_eq!(
            np["spec"]["podSelector"]["matchLabels"], ds["spec"]["template"]["metadata"]["labels"],
            "{v}"
        );
        assert_eq!(strings(&np["spec"]["policyTypes"]), ["Ingress"], "{v}");
        let rules = np["spec"]["ingress"].as_array().unwrap();
        assert_eq!(rules.len(), 1, "{v}: {rules:#?}");
        let ports = rules[0]["ports"].as_array().unwrap();
        assert_eq!(ports.len(), 1, "{v}: {ports:#?}");
        assert_eq!(port_of(c, &ports[0]["port"]), 9464, "{v}");
        let from = rules[0]["from"].as_array().unwrap();
        assert!(
            !from.is_empty()
                && from
                    .iter()
                    .all(|f| f["ipBlock"].is_null() && !f["podSelector"]["matchLabels"].is_null()),
            "{v}: only labelled pods: {from:#?}"
        );
        // The DaemonSet's selector picks its own pods, under its service account.
        for (k, val) in ds["spec"]["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(&ds["spec"]["template"]["metadata"]["labels"][k], val, "{v}");
        }
        let sa = one(&objects, "ServiceAccount");
        assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"], "{v}");
        assert_eq!(c["image"], "localhost/observer:latest", "{v}");
        assert_eq!(c["imagePullPolicy"], "IfNotPresent", "{v}");
    }
}

/// What the observer container has mounted at `path`: the volume, and
/// whether the mount is read-only.
fn mount_at<'a>(ds: &'a Value, path: &Path) -> (&'a Value, bool) {
    let c = observer_container(ds);
    let m = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"].as_str().map(Path::new) == Some(path))
        .unwrap_or_else(|| panic!("nothing mounted at {}", path.display()));
    let vol = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == m["name"])
        .unwrap_or_else(|| panic!("no volume {}", m["name"]));
    (vol, m["readOnly"] == true)
}

#[test]
fn daemonset_command_mounts_and_config_parse_as_the_observer_reads_them() {
    let test = "daemonset_command_mounts_and_config_parse_as_the_observer_reads_them";
    if !require_tool(test, "kubectl") {
        return;
    }
    let tmp = TempDir::new("config");
    for v in VARIANTS {
        let (_, objects) = render(v);
        let ds = one(&objects, "DaemonSet");
        let c = observer_container(ds);
        let mut argv = strings(&c["command"]);
        argv.extend(strings(&c["args"]));
        let args = run_args(&argv);
        // The host's cgroup v2 hierarchy where --cgroup-root says.
        let root = args.watch.cgroup_root.clone().expect("--cgroup-root");
        let (vol, _) = mount_at(ds, &root);
        assert_eq!(vol["hostPath"]["path"], "/sys/fs/cgroup", "{v}");
        // tracefs, writable (uprobe_events).
        let (vol, ro) = mount_at(ds, Path::new("/sys/kernel/tracing"));
        assert_eq!(vol["hostPath"]["path"], "/sys/kernel/tracing", "{v}");
        assert!(
            !ro,
            "{v}: tracefs must be writable for the per-process TLS probes"
        );
        // The kubelet's log layout, where --pod-log-dir says, and the
        // `containers` directory beside it.
        let pods = &args.watch.pod_log_dir;
        for (dir, host) in [
            (pods.clone(), "/var/log/pods"),
            (
                pods.parent().unwrap().join("containers"),
                "/var/log/containers",
            ),
        ] {
            let (vol, ro) = mount_at(ds, &dir);
            assert_eq!(vol["hostPath"]["path"], host, "{v}");
            assert!(ro, "{v}: {host} is only read");
        }
        // The config file: the ConfigMap's key at --config's path.
        let path = args.config.clone().expect("--config");
        let (vol, _) = mount_at(ds, path.parent().unwrap());
        let cm = one(&objects, "ConfigMap");
        assert_eq!(vol["configMap"]["name"], cm["metadata"]["name"], "{v}");
        let key = path.file_name().unwrap().to_str().unwrap();
        let text = cm["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("{v}: the ConfigMap has no {key}"));
        let file = tmp.0.join(format!("{}-{key}", v.replace('/', "-")));
        std::fs::write(&file, text).unwrap();
        let env: BTreeMap<String, String> = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let name = e["name"].as_str().unwrap().to_owned();
                // Downward-API values stand in as the node's name.
                let value = e["value"].as_str().unwrap_or("node-1").to_owned();
                (name, value)
            })
            .collect();
        let s = resolve(&args, &file, &env);
        let listen = s.prometheus_listen.expect("a Prometheus endpoint");
        assert!(
            listen.ip().is_unspecified() && listen.port() == 9464,
            "{v}: the probes and the Service reach {listen}?"
        );
        let traces = s.otlp.traces.as_ref().map(|t| t.endpoint.as_str());
        let metrics = s.otlp.metrics.as_ref().map(|t| t.endpoint.as_str());
        let collector = "http://otel-collector.observability:4317";
        let jaeger = "http://jaeger-collector.observability:4317";
        let expected = match v {
            "base" => (None, None),
            "overlays/otlp-collector" => (Some(collector), Some(collector)),
            "overlays/jaeger" => {
                assert_eq!(env["OTEL_METRICS_EXPORTER"], "none");
                (Some(jaeger), None)
            }
            _ => unreachable!(),
        };
        assert_eq!(
            (traces, metrics),
            expected,
            "{v}: (traces, metrics) endpoints"
        );
    }
}

/// `systemd-analyze verify` of `unit`: its complaints about it (lines that
/// name it; systemd only warns about an unknown directive), and the
/// capability sets systemd understood (its debug dump of the unit), lower
/// case. Panics when verify fails outright.
fn verify(unit: &Path) -> (Vec<String>, BTreeSet<String>, BTreeSet<String>) {
    let name = unit.file_name().unwrap().to_str().unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(unit)
        .env_remove("SYSTEMD_LOG_LEVEL")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "systemd-analyze verify {name}: {said}"
    );
    let complaints = said
        .lines()
        .filter(|l| l.contains(name))
        .map(str::to_owned)
        .collect();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(unit)
        .env("SYSTEMD_LOG_LEVEL", "debug")
        .output()
        .unwrap();
    // The unit's dump goes to stdout, the log to stderr.
    let dump = String::from_utf8_lossy(&out.stdout).into_owned();
    let set = |key: &str| -> BTreeSet<String> {
        let lines: Vec<&str> = dump
            .lines()
            .filter_map(|l| l.trim().strip_prefix(key))
            .collect();
        assert_eq!(lines.len(), 1, "{key} in the dump of {name}: {lines:?}");
        lines[0].split_whitespace().map(str::to_owned).collect()
    };
    (
        complaints,
        set("CapabilityBoundingSet:"),
        set("AmbientCapabilities:"),
    )
}

/// The unit's `KEY=` lines.
fn directive<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect()
}

#[test]
fn systemd_unit_verifies_and_holds_exactly_the_capability_file() {
    let test = "systemd_unit_verifies_and_holds_exactly_the_capability_file";
    if !require_tool(test, "systemd-analyze") {
        return;
    }
    let caps = capabilities();
    // Each name is a capability systemd (and so the kernel) knows.
    let out = Command::new("systemd-analyze")
        .arg("capability")
        .args(&caps)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "deploy/capabilities.txt: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unit = std::fs::read_to_string(deploy().join("systemd/observer.service")).unwrap();
    for key in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        let lines = directive(&unit, key);
        assert_eq!(lines.len(), 1, "one {key}= line: {lines:?}");
        let set: BTreeSet<String> = lines[0].split_whitespace().map(str::to_owned).collect();
        assert_eq!(set, caps, "{key}= differs from deploy/capabilities.txt");
    }
    assert_eq!(directive(&unit, "Restart"), ["on-failure"]);
    assert_eq!(directive(&unit, "RestartSec").len(), 1);
    for hiding in [
        "ProtectKernelTunables",
        "ProtectControlGroups",
        "ProcSubset",
        "ProtectProc",
    ] {
        assert!(
            directive(&unit, hiding).is_empty(),
            "{hiding}= would hide tracefs, the cgroup root or other processes' /proc"
        );
    }
    // ExecStart: `observer run` with the example config, both parsed by the
    // observer's own code.
    let exec = directive(&unit, "ExecStart");
    assert_eq!(exec.len(), 1, "{exec:?}");
    let argv: Vec<String> = exec[0].split_whitespace().map(str::to_owned).collect();
    assert_eq!(argv[0], "/usr/local/bin/observer");
    let args = run_args(&argv);
    assert_eq!(
        args.config.as_deref(),
        Some(Path::new("/etc/observer/config.toml"))
    );
    let s = resolve(
        &args,
        &deploy().join("systemd/config.toml"),
        &BTreeMap::new(),
    );
    assert_eq!(
        s.prometheus_listen,
        Some("127.0.0.1:9464".parse().unwrap()),
        "the host service's example keeps metrics on loopback"
    );

    // systemd-analyze verify needs ExecStart's binary: a copy of the unit
    // that runs the observer built here.
    let tmp = TempDir::new("systemd");
    // (systemd takes only a normalized absolute path.)
    let bin = std::fs::canonicalize(observer_bin()).unwrap();
    let here = unit.replace("/usr/local/bin/observer", bin.to_str().unwrap());
    let copy = tmp.0.join("observer.service");
    std::fs::write(&copy, &here).unwrap();
    let want: BTreeSet<String> = caps.iter().map(|c| c.to_lowercase()).collect();
    let (complaints, bounding, ambient) = verify(&copy);
    assert!(
        complaints.is_empty(),
        "systemd-analyze verify: {complaints:#?}"
    );
    assert_eq!(bounding, want, "the bounding set systemd understood");
    assert_eq!(ambient, want, "the ambient set systemd understood");

    // The checks above can fail: a misspelled directive is a complaint, and a
    // misspelled capability (which systemd drops without a word) leaves
    // systemd's set short.
    let bad = here.replace("RestartSec=", "RestartSecs=");
    assert_ne!(bad, here);
    std::fs::write(&copy, &bad).unwrap();
    let (complaints, _, _) = verify(&copy);
    assert!(
        complaints.iter().any(|l| l.contains("RestartSecs")),
        "a misspelled directive passed: {complaints:#?}"
    );
    let bad: Vec<String> = here
        .lines()
        .map(|l| match l.strip_prefix("CapabilityBoundingSet=") {
            Some(set) => format!("CapabilityBoundingSet={set}X"),
            None => l.to_owned(),
        })
        .collect();
    let bad = bad.join("\n");
    std::fs::write(&copy, &bad).unwrap();
    let (_, bounding, _) = verify(&copy);
    assert_ne!(bounding, want, "a misspelled capability went unseen");
}

/// The Jaeger example stack (deploy/examples/jaeger/compose.yaml) runs the
/// observer as the DaemonSet does: the capability file's set and no more, the
/// host's PID namespace, a read-only root, and metrics not offered to Jaeger.
#[test]
fn the_jaeger_example_runs_the_observer_as_the_daemonset_does() {
    let path = deploy().join("examples/jaeger/compose.yaml");
    let compose: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let obs = &compose["services"]["observer"];
    let added: BTreeSet<String> = strings(&obs["cap_add"])
        .into_iter()
        .map(|c| format!("CAP_{}", c.trim_start_matches("CAP_")))
        .collect();
    assert_eq!(added, capabilities(), "{}: cap_add", path.display());
    assert_eq!(strings(&obs["cap_drop"]), ["ALL"]);
    assert_eq!(obs["pid"], "host");
    assert_eq!(obs["read_only"], true);
    assert_eq!(obs["environment"]["OTEL_METRICS_EXPORTER"], "none");
    assert_eq!(
        obs["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"],
        "http://jaeger:4317"
    );
    assert_eq!(
        compose["services"]["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"],
        "true"
    );
}
