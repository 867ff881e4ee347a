//! The Grafana dashboard (deploy/grafana/observer.json) against real data:
//! `observer run` with its Prometheus endpoint (and the test build of NVML
//! for the GPU panels) watches real traffic, Debian's Prometheus scrapes it,
//! and every panel's query, its template variables resolved the way Grafana
//! resolves them, must return finite data from Prometheus's HTTP API.
//! Needs root (`observer run` loads eBPF) and `prometheus`; see
//! tests/src/lib.rs.
#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tests::*;

/// What Grafana's `$__rate_interval` becomes here: a window holding every
/// round of traffic the test made (scrapes are 1 s apart).
const RATE_INTERVAL: &str = "1m";
/// How long the panels may take to all have data.
const DATA_DEADLINE: Duration = Duration::from_secs(40);

fn dashboard() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/observer.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every panel, those inside collapsed rows included.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

/// One query of one panel.
#[derive(Debug)]
struct Target {
    panel: String,
    ref_id: String,
    expr: String,
    /// The legend: `{{label}}` names labels the series must have.
    legend: String,
}

fn targets(d: &Value) -> Vec<Target> {
    panels(d)
        .into_iter()
        .filter(|p| p["type"] != "row")
        .flat_map(|p| {
            p["targets"].as_array().unwrap().iter().map(|t| Target {
                panel: p["title"].as_str().unwrap().to_owned(),
                ref_id: t["refId"].as_str().unwrap().to_owned(),
                expr: t["expr"].as_str().unwrap().to_owned(),
                legend: t["legendFormat"].as_str().unwrap_or_default().to_owned(),
            })
        })
        .collect()
}

/// A template variable, as the dashboard defines it.
#[derive(Debug)]
enum Var {
    /// `label_values(SELECTOR, LABEL)`; `all`: the `allValue` (None: Grafana
    /// joins every value it found).
    Query {
        name: String,
        selector: String,
        label: String,
        all: Option<String>,
    },
    /// A fixed list of values.
    Custom { name: String, values: Vec<String> },
}

fn variables(d: &Value) -> Vec<Var> {
    let mut vars = Vec::new();
    for v in d["templating"]["list"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap().to_owned();
        match v["type"].as_str().unwrap() {
            "datasource" => {
                assert_eq!(v["query"], "prometheus", "{v}");
            }
            "query" => {
                // Grafana 10+ writes the query as an object; older ones as
                // a string.
                let q = v["query"]["query"]
                    .as_str()
                    .or(v["query"].as_str())
                    .unwrap();
                let inner = q
                    .trim()
                    .strip_prefix("label_values(")
                    .and_then(|q| q.strip_suffix(')'))
                    .unwrap_or_else(|| panic!("${name}: not label_values(...): {q}"));
                let (selector, label) = inner.rsplit_once(',').unwrap();
                assert_eq!(
                    v["includeAll"], true,
                    "${name}: All is what the test checks"
                );
                vars.push(Var::Query {
                    name,
                    selector: selector.trim().to_owned(),
                    label: label.trim().to_owned(),
                    all: v["allValue"].as_str().map(str::to_owned),
                });
            }
            "custom" => {
                let values = v["options"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| o["value"].as_str().unwrap().to_owned())
                    .collect();
                vars.push(Var::Custom { name, values });
            }
            other => panic!("${name}: a variable of type {other} is not checked here"),
        }
    }
    vars
}

/// `text` with `$name`, `${name}` and `${name:format}` replaced from `vars`;
/// a variable that is not there is an error (a typo would otherwise reach
/// Prometheus as a literal `$`).
fn substitute(text: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i + 1..];
        let (name, len) = if let Some(braced) = rest.strip_prefix('{') {
            let end = braced
                .find('}')
                .ok_or_else(|| format!("unclosed ${{ in {text}"))?;
            let name = braced[..end].split(':').next().unwrap();
            (name, end + 2)
        } else {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            (&rest[..end], end)
        };
        let value = vars
            .get(name)
            .ok_or_else(|| format!("unknown variable ${name} in {text}"))?;
        out.push_str(value);
        rest = &rest[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A value as Grafana puts a multi-value selection into a Prometheus regex
/// inside a PromQL string: regex metacharacters escaped, the backslash
/// doubled for the string.
fn regex_escape(v: &str) -> String {
    let mut out = String::new();
    for c in v.chars() {
        if "\\$^*{}[]'+?.()|".contains(c) {
            out.push_str("\\\\");
        }
        out.push(c);
    }
    out
}

/// The identifier that ends right before byte `i` of `expr`, if any.
fn ident_before(expr: &str, i: usize) -> Option<String> {
    let before = &expr[..i];
    let start = before
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .map_or(0, |s| s + 1);
    (start < i).then(|| before[start..].to_owned())
}

/// Names of the metrics a query reads: every identifier right before a `{`
/// (the dashboard selects each metric with labels).
fn metric_names(expr: &str) -> BTreeSet<String> {
    expr.match_indices('{')
        .filter_map(|(i, _)| ident_before(expr, i))
        .collect()
}

/// The labels a query's series are shown by: those of its `by (...)`
/// clauses (but `le`, which histogram_quantile consumes) and of its legend's
/// `{{label}}`s. A misspelled one would still give data, in one unlabelled
/// series.
fn shown_labels(expr: &str, legend: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    for (i, _) in expr.match_indices("by (") {
        let list = &expr[i + 4..];
        let list = &list[..list.find(')').unwrap()];
        labels.extend(list.split(',').map(|l| l.trim().to_owned()));
    }
    labels.remove("le");
    let mut rest = legend;
    while let Some(i) = rest.find("{{") {
        let end = rest[i..].find("}}").unwrap() + i;
        labels.insert(rest[i + 2..end].trim().to_owned());
        rest = &rest[end + 2..];
    }
    labels
}

/// Each `metric{...}` selector of a query with the label names its matchers
/// use. A matcher `=~".*"` on a misspelled label matches every series, so
/// the test asks separately whether the metric has that label at all.
fn matcher_labels(expr: &str) -> BTreeSet<(String, String)> {
    let mut pairs = BTreeSet::new();
    for (i, _) in expr.match_indices('{') {
        let Some(metric) = ident_before(expr, i) else {
            continue;
        };
        // The matchers up to the closing brace, quotes skipped.
        let mut in_quotes = false;
        let mut escaped = false;
        let mut name = String::new();
        let mut want_name = true;
        for c in expr[i + 1..].chars() {
            if in_quotes {
                match (escaped, c) {
                    (false, '\\') => escaped = true,
                    (false, '"') => in_quotes = false,
                    _ => escaped = false,
                }
                continue;
            }
            match c {
                '"' => in_quotes = true,
                '}' => break,
                ',' => want_name = true,
                '=' | '!' | '~' => {
                    if want_name && !name.is_empty() {
                        pairs.insert((metric.clone(), std::mem::take(&mut name)));
                    }
                    want_name = false;
                }
                c if want_name && !c.is_whitespace() => name.push(c),
                _ => {}
            }
        }
    }
    pairs
}

/// GET on Prometheus's HTTP API, its JSON answer.
fn prom_get(prom: SocketAddr, path: &str, params: &[(&str, &str)]) -> Value {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--max-time", "5", "--get"]);
    for (k, v) in params {
        cmd.args(["--data-urlencode", &format!("{k}={v}")]);
    }
    let out = cmd.arg(format!("http://{prom}{path}")).output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn instant(prom: SocketAddr, query: &str) -> Value {
    prom_get(prom, "/api/v1/query", &[("query", query)])
}

/// A panel's query against Prometheus: Ok with what it returned, or why it
/// would show no data (or wrong data) in Grafana.
fn check(prom: SocketAddr, expr: &str, labels: &BTreeSet<String>) -> Result<String, String> {
    let v = instant(prom, expr);
    if v["status"] != "success" {
        return Err(format!("Prometheus: {v}"));
    }
    let values: Vec<(Value, String)> = match v["data"]["resultType"].as_str() {
        Some("vector") => v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["metric"].clone(),
                    s["value"][1].as_str().unwrap().to_owned(),
                )
            })
            .collect(),
        Some("scalar") => vec![(
            json!({}),
            v["data"]["result"][1].as_str().unwrap().to_owned(),
        )],
        other => return Err(format!("result type {other:?}: {v}")),
    };
    if values.is_empty() {
        return Err("no series".into());
    }
    let parsed: Vec<f64> = values.iter().map(|(_, s)| s.parse().unwrap()).collect();
    if parsed.iter().any(|x| x.is_infinite()) {
        return Err(format!("an infinite value: {values:?}"));
    }
    // histogram_quantile of a group with no observations in the window is
    // NaN (0/0), and Grafana draws a gap there: fine for a group, not for
    // all of them. Nothing else in the dashboard may give NaN.
    let quantile = expr.starts_with("histogram_quantile(");
    if parsed.iter().any(|x| x.is_nan()) && !quantile {
        return Err(format!("NaN: {values:?}"));
    }
    if !parsed.iter().any(|x| x.is_finite()) {
        return Err(format!("no finite value: {values:?}"));
    }
    // Drops are zero when nothing was lost, as here; every other panel shows
    // this test's traffic.
    if !expr.contains("observer_events_dropped_total") && !parsed.iter().any(|&x| x > 0.0) {
        return Err(format!("nothing above zero: {values:?}"));
    }
    for l in labels {
        if !values.iter().any(|(m, _)| m[l.as_str()].is_string()) {
            return Err(format!("no series has the label {l}: {values:?}"));
        }
    }
    Ok(values
        .iter()
        .map(|(m, s)| format!("{m} {s}"))
        .collect::<Vec<_>>()
        .join("; "))
}

/// The shape Grafana needs to import the dashboard and this test needs to
/// read it: schema version, unique ids and refIds, each query through the
/// `$datasource` variable. Needs neither root nor Prometheus.
#[test]
fn the_dashboard_is_well_formed() {
    let d = dashboard();
    assert!(
        d["schemaVersion"].as_u64() >= Some(39),
        "{}",
        d["schemaVersion"]
    );
    assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(
        d["__inputs"].is_null(),
        "the data source is the $datasource variable, chosen on the dashboard"
    );
    let mut ids = BTreeSet::new();
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap();
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "duplicate id: {title}"
        );
        let g = &p["gridPos"];
        assert!(
            g["w"].as_u64().unwrap() + g["x"].as_u64().unwrap() <= 24,
            "{title}: {g}"
        );
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        assert!(
            p["description"].as_str().is_some_and(|s| !s.is_empty()),
            "{title}: says what it shows"
        );
        let ts = p["targets"].as_array().unwrap();
        assert!(!ts.is_empty(), "{title}: no query");
        let mut refs = BTreeSet::new();
        for t in ts {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            assert!(refs.insert(t["refId"].as_str().unwrap()), "{title}: refId");
            assert!(!t["expr"].as_str().unwrap().is_empty(), "{title}");
        }
    }
    let vars = variables(&d);
    assert!(
        d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["type"] == "datasource" && v["name"] == "datasource"),
        "a $datasource variable"
    );
    // Every variable a query uses is defined (or Grafana's own).
    let mut defined: BTreeMap<String, String> = vars
        .iter()
        .map(|v| match v {
            Var::Query { name, .. } | Var::Custom { name, .. } => (name.clone(), "x".into()),
        })
        .collect();
    defined.insert("__rate_interval".into(), RATE_INTERVAL.into());
    for t in targets(&d) {
        substitute(&t.expr, &defined).unwrap_or_else(|e| panic!("{} {}: {e}", t.panel, t.ref_id));
    }
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap();
        substitute(title, &defined).unwrap_or_else(|e| panic!("{title}: {e}"));
    }
    // The checker itself: what a misspelled variable looks like.
    assert!(substitute("up{job=~\"$jbo\"}", &defined).is_err());
    assert_eq!(
        substitute("a{x=~\"$job\"}[${__rate_interval}] ${job:text}", &defined).unwrap(),
        "a{x=~\"x\"}[1m] x"
    );
    assert_eq!(regex_escape("api.test:80"), "api\\\\.test:80");
    assert_eq!(
        shown_labels(
            "histogram_quantile(0.5, sum by (le, a, b) (rate(x{}[1m])))",
            "p50 {{c}} {{ a }}"
        ),
        BTreeSet::from(["a", "b", "c"].map(str::to_owned))
    );
    assert_eq!(
        matcher_labels("sum(rate(m_total{a=~\"x,y}\\\"\", b!=\"\"}[1m])) / up{c=\"1\"}"),
        BTreeSet::from(
            [("m_total", "a"), ("m_total", "b"), ("up", "c")]
                .map(|(m, l)| (m.to_owned(), l.to_owned()))
        )
    );
    assert_eq!(
        metric_names("sum(rate(a_total{x=\"1\"}[1m])) / up{j=\"2\"}"),
        BTreeSet::from(["a_total".to_owned(), "up".to_owned()])
    );
}

/// A file removed on drop.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Debian's Prometheus scraping `target` every second, its storage in a
/// temporary directory; killed and removed on drop.
struct Prometheus {
    child: Child,
    dir: PathBuf,
    addr: SocketAddr,
}

impl Prometheus {
    fn start(target: SocketAddr) -> Prometheus {
        let dir = std::env::temp_dir().join(format!("observer-grafana-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: observer\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Prometheus { child, dir, addr }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A process killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `ok` holds, at most `within`; false if it never did.
fn wait_for(within: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if ok() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The servers the traffic goes to.
struct Servers {
    ns: DnsNs,
    /// A listener in `ns` whose accept queue is full: a connect to it sends
    /// its SYN again, then times out.
    blackhole: u16,
    llm_tls: HelperServer,
    llm_plain: HelperServer,
    grpc: HelperServer,
    python_h2: PathBuf,
    /// A client holding one idle keep-alive connection to `backend` for the
    /// whole test (the pool panels' open and idle connections: every other
    /// client here closes its connections).
    _pooled: (HelperServer, Killed),
}

/// A keep-alive backend and a client that asks it twice over one
/// connection, then holds that connection open (tests/helpers).
fn pooled_client() -> (HelperServer, Killed) {
    let backend = HelperServer::spawn(
        Command::new("python3")
            .arg(helper("delay_backend.py"))
            .args(["--delay-ms", "0"]),
    );
    let mut client = Command::new("python3")
        .arg(helper("pool_client.py"))
        .args(["reuse", &backend.port.to_string(), "2", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(client.stdout.take().unwrap()),
        &mut said,
    )
    .unwrap();
    assert!(said.contains("\"opened\": 1"), "{said}");
    (backend, Killed(client))
}

/// One round of traffic that feeds every panel: a name lookup through a DNS
/// server and one that fails (NXDOMAIN), a SYN retransmitted and timed out,
/// a refused connection, LLM calls over TLS (one answered 500) and plain
/// HTTP, an HTTPS GET by curl, and gRPC calls (one NOT_FOUND).
fn traffic(s: &Servers) {
    let ns_name = s.ns.name.clone();
    let blackhole = s.blackhole;
    // About 3 s (one SYN retry): alongside the rest.
    let timeout = std::thread::spawn(move || {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns_name, "python3"])
            .arg(helper("connect.py"))
            .args(["127.0.0.1", &blackhole.to_string()])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    });
    // curl fails on server.py's answer (not HTTP): the lookup, the connect
    // and the first byte are what count.
    s.ns.exec(&[
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "--max-time",
        "3",
        &format!("http://api.test:{}/", s.ns.http.port),
    ]);
    let nx = s.ns.exec(&["getent", "ahosts", "nx.test"]);
    assert_eq!(nx.status.code(), Some(2), "NXDOMAIN: {nx:?}");
    let refused = std::net::TcpStream::connect(("127.0.0.1", free_port()));
    assert!(refused.is_err(), "{refused:?}");
    let tls = llm_client(s.llm_tls.port, 0, &["--model", "tiny", "--model", "fail"]);
    let statuses: Vec<&Value> = tls.iter().map(|r| &r["status"]).collect();
    assert_eq!(statuses, [&json!(200), &json!(500)], "{tls:?}");
    let plain = llm_client(s.llm_plain.port, 0, &["--plain", "--model", "tiny-plain"]);
    assert_eq!(plain[0]["status"], 200, "{plain:?}");
    let port = s.llm_tls.port;
    let curl = Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "3",
        ])
        .args(["--resolve", &format!("llm.test:{port}:127.0.0.1")])
        .arg(format!("https://llm.test:{port}/v1/models"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&curl.stdout), "200", "{curl:?}");
    let grpc = run_json_lines(
        Command::new(&s.python_h2)
            .arg(helper("grpc_pair.py"))
            .args(["client", &s.grpc.port.to_string()]),
    );
    assert_eq!(grpc[0]["fail"]["code"], "NOT_FOUND", "{grpc:?}");
    let timed_out = timeout.join().unwrap();
    assert!(timed_out.starts_with("ERR ETIMEDOUT"), "{timed_out:?}");
}

/// Template variables resolved as Grafana does with "All" selected: each
/// query variable's values from Prometheus (which must not be empty), then
/// its `allValue` or every value joined as a regex; custom variables get
/// each of their values in turn (one map per combination).
fn resolve(prom: SocketAddr, vars: &[Var]) -> Result<Vec<BTreeMap<String, String>>, String> {
    let mut fixed = BTreeMap::from([("__rate_interval".to_owned(), RATE_INTERVAL.to_owned())]);
    let mut custom: Vec<(String, Vec<String>)> = Vec::new();
    for v in vars {
        match v {
            Var::Query {
                name,
                selector,
                label,
                all,
            } => {
                let selector = substitute(selector, &fixed)?;
                let got = prom_get(
                    prom,
                    &format!("/api/v1/label/{label}/values"),
                    &[("match[]", &selector)],
                );
                let values: Vec<String> = got["data"]
                    .as_array()
                    .map(|a| a.iter().map(|x| x.as_str().unwrap().to_owned()).collect())
                    .unwrap_or_default();
                if values.is_empty() {
                    return Err(format!(
                        "${name}: no values for {label} in {selector}: {got}"
                    ));
                }
                let value = all.clone().unwrap_or_else(|| {
                    let escaped: Vec<String> = values.iter().map(|x| regex_escape(x)).collect();
                    format!("({})", escaped.join("|"))
                });
                fixed.insert(name.clone(), value);
            }
            Var::Custom { name, values } => custom.push((name.clone(), values.clone())),
        }
    }
    let mut maps = vec![fixed];
    for (name, values) in &custom {
        maps = maps
            .into_iter()
            .flat_map(move |m| {
                values.iter().map(move |v| {
                    let mut m = m.clone();
                    m.insert(name.clone(), v.clone());
                    m
                })
            })
            .collect();
    }
    Ok(maps)
}

/// Whether some series of `metric` has `label`.
fn has_label(prom: SocketAddr, metric: &str, label: &str) -> bool {
    instant(prom, &format!("count({metric}{{{label}!=\"\"}})"))["data"]["result"]
        .as_array()
        .is_some_and(|r| !r.is_empty())
}

/// Every query of the dashboard with every value of the custom variables it
/// uses: the failures (panel, query, why), and how many were checked.
fn check_all(prom: SocketAddr, vars: &[Var], targets: &[Target]) -> (Vec<String>, usize) {
    let maps = match resolve(prom, vars) {
        Ok(m) => m,
        Err(e) => return (vec![e], 0),
    };
    let mut failures = Vec::new();
    let mut checked = BTreeSet::new();
    let mut matchers = BTreeSet::new();
    for t in targets {
        for m in &maps {
            let (expr, legend) = match (substitute(&t.expr, m), substitute(&t.legend, m)) {
                (Ok(e), Ok(l)) => (e, l),
                (Err(e), _) | (_, Err(e)) => {
                    failures.push(format!("{} {}: {e}", t.panel, t.ref_id));
                    continue;
                }
            };
            matchers.extend(matcher_labels(&expr));
            if !checked.insert((expr.clone(), legend.clone())) {
                continue;
            }
            if let Err(e) = check(prom, &expr, &shown_labels(&expr, &legend)) {
                failures.push(format!("{} {}: {expr}\n    {e}", t.panel, t.ref_id));
            }
        }
    }
    for (metric, label) in matchers {
        if !has_label(prom, &metric, &label) {
            failures.push(format!("no series of {metric} has the label {label}"));
        }
    }
    (failures, checked.len())
}

/// Every panel of the dashboard has data from a real Prometheus after real
/// traffic: its queries (variables resolved from Prometheus, each value of
/// "Group latencies by") return series with finite values, above zero but
/// for the drop counters; latency quantiles may be NaN only for a group
/// with no observations in the window. The metrics the observer exported
/// here each have a panel. A misspelled metric, grouping label or matcher
/// label fails the same checks.
#[test]
fn every_panel_has_data_from_a_real_prometheus() {
    let Some(_serial) = begin(
        "grafana",
        &["prometheus", "curl", "python3", "ip", "getent", "openssl"],
    ) else {
        return;
    };
    let Some(python_h2) = h2_python("grafana") else {
        return;
    };
    let t0 = Instant::now();
    let d = dashboard();
    let vars = variables(&d);
    let targets = targets(&d);

    let ns = DnsNs::new(5.0);
    // One SYN retry: a connect that is never answered ends in about 3 s.
    let sysctl = ns.exec(&["sysctl", "-qw", "net.ipv4.tcp_syn_retries=1"]);
    assert!(sysctl.status.success(), "{sysctl:?}");
    let blackhole = free_port();
    let mut listener = Command::new("ip")
        .args(["netns", "exec", &ns.name, "python3", "-c"])
        .arg(format!(
            "import socket, sys, time\n\
             s = socket.socket(); s.bind(('127.0.0.1', {blackhole})); s.listen(0)\n\
             c = socket.create_connection(('127.0.0.1', {blackhole}))\n\
             print('READY', flush=True); time.sleep(120)"
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(listener.stdout.take().unwrap()),
        &mut ready,
    )
    .unwrap();
    let listener = Killed(listener);
    assert_eq!(ready.trim(), "READY");

    // Two devices and one NVML cannot read; this test process holds a GPU.
    let stub_cfg = TempFile(
        std::env::temp_dir().join(format!("observer-grafana-nvml-{}.json", std::process::id())),
    );
    std::fs::write(
        &stub_cfg.0,
        json!({"devices": [
            {"uuid": "GPU-00000000-aaaa", "name": "Stub H200", "util_gpu": 40, "util_mem": 10,
             "mem_used": 1_048_576_000u64, "mem_total": 8_388_608_000u64, "temp": 50,
             "power_mw": 120_500, "sm_clock": 1500,
             "processes": [{"pid": std::process::id(), "used_memory": 524_288_000u64, "sm_util": 40}]},
            {"uuid": "GPU-00000001-bbbb", "name": "Stub H200", "util_gpu": 5, "mem_total": 8_388_608_000u64},
            {"error": "gpu_lost"}
        ]})
        .to_string(),
    )
    .unwrap();

    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut cmd = Command::new(observer_bin());
    cmd.args(["run", "--prometheus-listen", &listen.to_string()])
        .args(["--gpu-interval", "100", "--nvml-lib"])
        .arg(nvml_stub())
        .env("NVML_STUB_CONFIG", &stub_cfg.0)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
    let run = Daemon::start(cmd);
    let prom = Prometheus::start(listen);
    let up = wait_for(Duration::from_secs(20), || {
        instant(prom.addr, "up{job=\"observer\"} == 1")["data"]["result"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
    });
    assert!(up, "Prometheus never scraped the observer at {listen}");
    let started = t0.elapsed();

    // The servers start after the observer, so that their TLS and HTTP/2
    // calls are seen from the first.
    let cert = Cert::new();
    let servers = Servers {
        ns,
        blackhole,
        llm_tls: llm_server(Some(&cert), 20.0, 5.0, 4),
        llm_plain: llm_server(None, 20.0, 5.0, 4),
        grpc: HelperServer::spawn(
            Command::new(&python_h2)
                .arg(helper("grpc_pair.py"))
                .arg("server"),
        ),
        python_h2,
        _pooled: pooled_client(),
    };

    // Rates need a series scraped before and after an increase: rounds of
    // traffic until every query has data (a round takes about 8 s here:
    // long enough for the failed lookups, which reach the metrics after the
    // observer's 5 s wait for a connection that uses them). Measured: two
    // rounds in each of four runs.
    let deadline = Instant::now() + DATA_DEADLINE;
    let mut rounds = 0;
    let (failures, checked) = loop {
        traffic(&servers);
        rounds += 1;
        // Two scrapes after the traffic.
        std::thread::sleep(Duration::from_millis(2500));
        let (failures, checked) = check_all(prom.addr, &vars, &targets);
        if failures.is_empty() || Instant::now() > deadline {
            break (failures, checked);
        }
    };
    let took = t0.elapsed();

    // The checker fails on a misspelled metric, grouping label or matcher
    // label (the connect panel's query shape).
    let connect = |metric: &str, by: &str| {
        let expr =
            format!("histogram_quantile(0.5, sum by (le, {by}) (rate({metric}[{RATE_INTERVAL}])))");
        check(prom.addr, &expr, &shown_labels(&expr, ""))
    };
    let connect_metric = "observer_tcp_connect_duration_seconds_bucket";
    let right = connect(connect_metric, "server_address");
    let wrong_metric = connect(
        "observer_tcp_conect_duration_seconds_bucket",
        "server_address",
    );
    let wrong_label = connect(connect_metric, "server_adress");
    let wrong_matcher = has_label(prom.addr, connect_metric, "server_adress");
    let right_matcher = has_label(prom.addr, connect_metric, "server_address");

    // Every metric this observer exported is on the dashboard.
    let (status, _, text) = http_request(listen, "GET", "/metrics").unwrap();
    assert_eq!(status, 200);
    let exported: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let used: BTreeSet<String> = targets.iter().flat_map(|t| metric_names(&t.expr)).collect();
    let missing: Vec<&str> = exported
        .iter()
        .copied()
        .filter(|&name| {
            !used.iter().any(|u| {
                u.as_str() == name
                    || u.strip_prefix(name)
                        .is_some_and(|s| matches!(s, "_bucket" | "_sum" | "_count"))
            })
        })
        .collect();
    drop(prom);
    drop(listener);
    drop(servers);
    run.stop();

    eprintln!(
        "{} queries of {} panels checked after {rounds} rounds of traffic; \
         observer and Prometheus up in {started:?}, all data in {took:?}, stopped at {:?}",
        checked,
        targets
            .iter()
            .map(|t| &t.panel)
            .collect::<BTreeSet<_>>()
            .len(),
        t0.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} panel queries without data after {rounds} rounds ({took:?}):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(right.is_ok() && right_matcher, "{right:?}");
    assert!(
        wrong_metric.is_err(),
        "a misspelled metric passed: {wrong_metric:?}"
    );
    assert!(
        wrong_label.is_err(),
        "a misspelled label passed: {wrong_label:?}"
    );
    assert!(!wrong_matcher, "a misspelled matcher label passed");
    assert!(
        missing.is_empty(),
        "metrics on /metrics that no panel shows: {missing:?}"
    );
}
