//! `observer run` settings: defaults < config file (TOML or YAML) <
//! environment (the standard OTEL_* variables) < flags. Every error names the
//! key and the bad value.

use std::{collections::HashMap, net::SocketAddr, path::Path, time::Duration};

use serde::Deserialize;

use super::otlp::{BadSetting, OtlpConfig};

/// The config file. Unknown keys are errors (a typo must not pass silently).
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// "ADDR:PORT" or "none".
    pub prometheus_listen: Option<String>,
    pub sample_ratio: Option<f64>,
    pub slow_threshold_seconds: Option<f64>,
    pub service_name: Option<String>,
    pub max_series: Option<usize>,
    /// The NVML library (`--nvml-lib` overrides it).
    pub nvml_lib: Option<String>,
    /// OTEL_* variables by their names without the prefix, lower case
    /// (`endpoint`, `protocol`, `headers`, `traces_endpoint`, ...).
    #[serde(default)]
    pub otlp: HashMap<String, String>,
    /// OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER: "otlp" or "none".
    pub traces_exporter: Option<String>,
    pub metrics_exporter: Option<String>,
    /// OTEL_RESOURCE_ATTRIBUTES as a table.
    #[serde(default)]
    pub resource: HashMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {err}")]
    Read { path: String, err: std::io::Error },
    #[error("{path}: {err}")]
    Parse { path: String, err: String },
    #[error(transparent)]
    Bad(#[from] BadSetting),
}

/// Keys the `otlp` table may hold, and the variable each stands for.
const OTLP_KEYS: &[&str] = &[
    "endpoint",
    "protocol",
    "headers",
    "timeout",
    "compression",
    "certificate",
    "traces_certificate",
    "metrics_certificate",
    "traces_endpoint",
    "traces_protocol",
    "traces_headers",
    "traces_timeout",
    "traces_compression",
    "metrics_endpoint",
    "metrics_protocol",
    "metrics_headers",
    "metrics_timeout",
    "metrics_compression",
];

pub fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Read {
        path: shown.clone(),
        err,
    })?;
    let is_yaml = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    );
    parse(&text, is_yaml, shown)
}

/// A config file's text (YAML, else TOML); `shown`: its name in errors.
pub fn parse(text: &str, is_yaml: bool, shown: String) -> Result<FileConfig, ConfigError> {
    let cfg: FileConfig = if is_yaml {
        serde_yaml::from_str(text).map_err(|e| ConfigError::Parse {
            path: shown.clone(),
            err: e.to_string(),
        })?
    } else {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: shown.clone(),
            err: e.to_string(),
        })?
    };
    for k in cfg.otlp.keys() {
        if !OTLP_KEYS.contains(&k.as_str()) {
            return Err(ConfigError::Parse {
                path: shown,
                err: format!(
                    "unknown key `otlp.{k}`, expected one of: {}",
                    OTLP_KEYS.join(", ")
                ),
            });
        }
    }
    Ok(cfg)
}

/// What `observer run` exports, resolved.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// None: no Prometheus endpoint.
    pub prometheus_listen: Option<SocketAddr>,
    pub otlp: OtlpConfig,
    pub sample_ratio: f64,
    /// A `parentbased_` sampler: a request's `traceparent` decides.
    pub parent_based: bool,
    pub slow_threshold: Duration,
    pub service_name: Option<String>,
    pub max_series: usize,
    /// The observer's own resource attributes (OTEL_RESOURCE_ATTRIBUTES).
    pub resource: Vec<(String, String)>,
}

/// Flag values (None: not given).
#[derive(Debug, Default, Clone)]
pub struct Flags {
    pub prometheus_listen: Option<String>,
    pub sample_ratio: Option<f64>,
    pub slow_threshold: Option<Duration>,
    pub service_name: Option<String>,
    pub max_series: Option<usize>,
}

fn listen(key: &str, v: &str) -> Result<Option<SocketAddr>, BadSetting> {
    if v == "none" {
        return Ok(None);
    }
    v.parse().map(Some).map_err(|_| BadSetting {
        key: key.into(),
        value: v.into(),
        why: "expected ADDR:PORT (e.g. 127.0.0.1:9464) or none".into(),
    })
}

fn positive(key: &str) -> BadSetting {
    BadSetting {
        key: key.into(),
        value: "0".into(),
        why: "expected at least 1".into(),
    }
}

fn ratio(key: &str, v: f64) -> Result<f64, BadSetting> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(BadSetting {
            key: key.into(),
            value: v.to_string(),
            why: "expected a ratio from 0 to 1".into(),
        })
    }
}

/// `OTEL_TRACES_SAMPLER` (and `OTEL_TRACES_SAMPLER_ARG`) as the
/// OpenTelemetry SDKs read them, as the share of ordinary records exported.
/// A `parentbased_` sampler (`true` beside the ratio) follows the sampled
/// flag of a request's `traceparent` and the ratio for the rest. Failed and
/// slow records stay kept whatever the sampler (they are what the observer
/// is for); metrics are never sampled.
fn env_sampler(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<(f64, bool)>, BadSetting> {
    let Some(name) = env("OTEL_TRACES_SAMPLER") else {
        return Ok(None);
    };
    let name = name.trim().to_ascii_lowercase();
    let parent_based = name.starts_with("parentbased_");
    let ratio = root_ratio(&name, env)?;
    Ok(ratio.map(|r| (r, parent_based)))
}

/// The ratio of a sampler named `name` (lowercase) for records without a
/// sampled parent.
fn root_ratio(name: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<f64>, BadSetting> {
    match name.strip_prefix("parentbased_").unwrap_or(name) {
        "always_on" => Ok(Some(1.0)),
        "always_off" => Ok(Some(0.0)),
        // Without an argument the SDKs take 1.0.
        "traceidratio" => match env("OTEL_TRACES_SAMPLER_ARG") {
            None => Ok(Some(1.0)),
            Some(arg) => arg
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|v| (0.0..=1.0).contains(v))
                .map(Some)
                .ok_or_else(|| BadSetting {
                    key: "OTEL_TRACES_SAMPLER_ARG".into(),
                    value: arg.clone(),
                    why: "expected a ratio from 0 to 1".into(),
                }),
        },
        _ => Err(BadSetting {
            key: "OTEL_TRACES_SAMPLER".into(),
            value: name.to_owned(),
            why: "expected always_on, always_off, traceidratio, or one of them after parentbased_"
                .into(),
        }),
    }
}

pub fn resolve(
    file: &FileConfig,
    env: &dyn Fn(&str) -> Option<String>,
    flags: &Flags,
) -> Result<RunSettings, ConfigError> {
    let prometheus_listen = match (&flags.prometheus_listen, &file.prometheus_listen) {
        (Some(v), _) => listen("--prometheus-listen", v)?,
        (None, Some(v)) => listen("prometheus_listen", v)?,
        (None, None) => listen("default", super::prometheus::DEFAULT_LISTEN)?,
    };
    // The file's otlp table stands below the environment.
    let merged = |name: &str| -> Option<String> {
        env(name).or_else(|| match name {
            "OTEL_TRACES_EXPORTER" => file.traces_exporter.clone(),
            "OTEL_METRICS_EXPORTER" => file.metrics_exporter.clone(),
            _ => {
                let key = name.strip_prefix("OTEL_EXPORTER_OTLP_")?.to_lowercase();
                file.otlp.get(&key).cloned()
            }
        })
    };
    let otlp = OtlpConfig::from_vars(&merged)?;
    let sampler = env_sampler(env)?;
    let sample_ratio = match (flags.sample_ratio, sampler, file.sample_ratio) {
        (Some(v), _, _) => ratio("--sample-ratio", v)?,
        (None, Some((v, _)), _) => v,
        (None, None, Some(v)) => ratio("sample_ratio", v)?,
        (None, None, None) => 1.0,
    };
    let parent_based = flags.sample_ratio.is_none() && sampler.is_some_and(|(_, p)| p);
    let slow_threshold = match (flags.slow_threshold, file.slow_threshold_seconds) {
        (Some(d), _) => d,
        (None, Some(s)) if s.is_finite() && s >= 0.0 => Duration::from_secs_f64(s),
        (None, Some(s)) => {
            return Err(BadSetting {
                key: "slow_threshold_seconds".into(),
                value: s.to_string(),
                why: "expected seconds >= 0".into(),
            }
            .into())
        }
        (None, None) => Duration::from_secs(1),
    };
    let mut resource: Vec<(String, String)> = file
        .resource
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(v) = env("OTEL_RESOURCE_ATTRIBUTES") {
        for pair in v.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, val) = pair.split_once('=').ok_or_else(|| BadSetting {
                key: "OTEL_RESOURCE_ATTRIBUTES".into(),
                value: v.clone(),
                why: "expected key=value pairs separated by commas".into(),
            })?;
            resource.retain(|(x, _)| x != k.trim());
            resource.push((k.trim().into(), val.trim().into()));
        }
    }
    resource.sort();
    Ok(RunSettings {
        prometheus_listen,
        otlp,
        sample_ratio,
        parent_based,
        slow_threshold,
        service_name: flags
            .service_name
            .clone()
            .or_else(|| file.service_name.clone()),
        max_series: match (flags.max_series, file.max_series) {
            (Some(0), _) => return Err(positive("--max-series").into()),
            (None, Some(0)) => return Err(positive("max_series").into()),
            (f, fc) => f.or(fc).unwrap_or(2000),
        },
        resource,
    })
}

/// What `observer run` adds to `watch`: exporters.
pub struct ExportSetup {
    pub settings: RunSettings,
    /// Also print records on stdout.
    pub print: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    /// The SDKs' sampler variables, between the file and the flag.
    #[test]
    fn traces_sampler_from_the_environment() {
        let file: FileConfig = toml::from_str("sample_ratio = 0.5\n").expect("parses");
        let none = Flags::default();
        let ratio_of = |vars: &[(&str, &str)], flags: &Flags| {
            resolve(&file, &env(vars), flags).map(|s| s.sample_ratio)
        };
        let sampler = |name| [("OTEL_TRACES_SAMPLER", name)];
        assert_eq!(ratio_of(&sampler("always_on"), &none).ok(), Some(1.0));
        assert_eq!(ratio_of(&sampler("always_off"), &none).ok(), Some(0.0));
        assert_eq!(
            ratio_of(&sampler("parentbased_always_off"), &none).ok(),
            Some(0.0)
        );
        let ratio = [
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.01"),
        ];
        assert_eq!(ratio_of(&ratio, &none).ok(), Some(0.01));
        let parent_based = |vars: &[(&str, &str)], flags: &Flags| {
            resolve(&file, &env(vars), flags)
                .map(|s| s.parent_based)
                .ok()
        };
        assert_eq!(parent_based(&ratio, &none), Some(true));
        assert_eq!(parent_based(&sampler("traceidratio"), &none), Some(false));
        assert_eq!(parent_based(&[], &none), Some(false));
        // No argument: the SDKs' default.
        assert_eq!(ratio_of(&sampler("TraceIdRatio"), &none).ok(), Some(1.0));
        // The flag wins; without the variable the file does.
        let flag = Flags {
            sample_ratio: Some(0.2),
            ..Flags::default()
        };
        assert_eq!(ratio_of(&ratio, &flag).ok(), Some(0.2));
        // The flag's ratio is for every record: no parent decides.
        assert_eq!(parent_based(&ratio, &flag), Some(false));
        assert_eq!(ratio_of(&[], &none).ok(), Some(0.5));
        // Bad values are named.
        let bad_arg = [
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ];
        let e = ratio_of(&bad_arg, &none).expect_err("out of range");
        assert!(e.to_string().contains("OTEL_TRACES_SAMPLER_ARG"), "{e}");
        let e = ratio_of(&sampler("jaeger_remote"), &none).expect_err("unsupported");
        assert!(e.to_string().contains("jaeger_remote"), "{e}");
    }

    #[test]
    fn precedence_defaults_file_env_flags() {
        let file: FileConfig = toml::from_str(
            "prometheus_listen = \"127.0.0.1:9999\"\nsample_ratio = 0.5\n[otlp]\nendpoint = \"http://file:4317\"\nprotocol = \"grpc\"\n",
        )
        .expect("parses");
        let none = Flags::default();
        let s = resolve(&file, &env(&[]), &none).expect("valid");
        assert_eq!(
            s.prometheus_listen,
            Some("127.0.0.1:9999".parse().expect("addr"))
        );
        assert_eq!(s.sample_ratio, 0.5);
        assert_eq!(
            s.otlp.traces.as_ref().map(|t| t.endpoint.as_str()),
            Some("http://file:4317")
        );
        let s = resolve(
            &file,
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ]),
            &none,
        )
        .expect("valid");
        let t = s.otlp.traces.expect("traces");
        assert_eq!(t.endpoint, "http://env:4318/v1/traces");
        assert_eq!(
            s.otlp.metrics.expect("metrics").endpoint,
            "http://env:4318/v1/metrics"
        );
        let flags = Flags {
            prometheus_listen: Some("none".into()),
            sample_ratio: Some(0.1),
            ..Flags::default()
        };
        let s = resolve(&file, &env(&[]), &flags).expect("valid");
        assert_eq!((s.prometheus_listen, s.sample_ratio), (None, 0.1));
        let s = resolve(&FileConfig::default(), &env(&[]), &none).expect("valid");
        assert_eq!(
            s.prometheus_listen,
            Some("127.0.0.1:9464".parse().expect("addr"))
        );
        assert!(
            s.otlp.traces.is_none() && s.otlp.metrics.is_none(),
            "nothing without an endpoint"
        );
    }

    #[test]
    fn exporter_switches_turn_a_signal_off() {
        let file: FileConfig =
            toml::from_str("metrics_exporter = \"none\"\n[otlp]\nendpoint = \"http://j:4317\"\n")
                .expect("parses");
        let s = resolve(&file, &env(&[]), &Flags::default()).expect("valid");
        assert!(s.otlp.traces.is_some() && s.otlp.metrics.is_none());
        // The environment stands above the file.
        let s = resolve(
            &file,
            &env(&[
                ("OTEL_METRICS_EXPORTER", "otlp"),
                ("OTEL_TRACES_EXPORTER", "NONE"),
            ]),
            &Flags::default(),
        )
        .expect("valid");
        assert!(s.otlp.traces.is_none() && s.otlp.metrics.is_some());
        let bad = resolve(
            &file,
            &env(&[("OTEL_TRACES_EXPORTER", "zipkin")]),
            &Flags::default(),
        )
        .expect_err("not ours");
        let msg = bad.to_string();
        assert!(
            msg.contains("OTEL_TRACES_EXPORTER") && msg.contains("zipkin"),
            "{msg}"
        );
    }

    #[test]
    fn errors_name_the_key_and_value() {
        let e = toml::from_str::<FileConfig>("promethus_listen = \"x\"").expect_err("unknown key");
        assert!(e.to_string().contains("promethus_listen"), "{e}");
        let bad = resolve(
            &FileConfig::default(),
            &env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4317")]),
            &Flags::default(),
        )
        .expect_err("no scheme");
        let msg = bad.to_string();
        assert!(
            msg.contains("OTEL_EXPORTER_OTLP_ENDPOINT") && msg.contains("localhost:4317"),
            "{msg}"
        );
        let bad = resolve(
            &FileConfig::default(),
            &env(&[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "udp"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:1"),
            ]),
            &Flags::default(),
        )
        .expect_err("bad protocol");
        assert!(bad.to_string().contains("udp"));
        let flags = Flags {
            prometheus_listen: Some("nowhere".into()),
            ..Flags::default()
        };
        let bad = resolve(&FileConfig::default(), &env(&[]), &flags).expect_err("bad addr");
        assert!(bad.to_string().contains("--prometheus-listen"));
        let zero = Flags {
            max_series: Some(0),
            ..Flags::default()
        };
        let bad = resolve(&FileConfig::default(), &env(&[]), &zero).expect_err("no series");
        assert!(bad.to_string().contains("--max-series"), "{bad}");
        let y: FileConfig =
            serde_yaml::from_str("otlp:\n  endpoint: http://y:4317\n").expect("yaml");
        assert_eq!(
            y.otlp.get("endpoint").map(String::as_str),
            Some("http://y:4317")
        );
    }
}
