//! Starting the exporters (metrics, the Prometheus endpoint, the OTLP
//! exporter behind its queue) and, at stop, their last flush.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::task::JoinHandle;

use super::{
    attrs,
    config::ExportSetup,
    metrics::Metrics,
    otlp::Exporter,
    prometheus,
    queue::{trace_queue, Origin, TraceQueue},
    sampling::Sampling,
};
use crate::stats::{ExportStats, Stats};

/// How long the exporter may take for its last export at stop.
const EXPORT_FLUSH: Duration = Duration::from_secs(10);

/// The exporters while they run.
pub struct Exporting {
    /// The trace queue, for the correlator (taken: the exporter ends when its
    /// senders are gone).
    pub queue: Option<TraceQueue>,
    pub metrics: Arc<Mutex<Metrics>>,
    exporter: Option<JoinHandle<()>>,
    stats: Arc<ExportStats>,
    prometheus: Option<JoinHandle<()>>,
}

impl Exporting {
    /// After the correlator dropped the queue: the exporter's last export
    /// (bounded by EXPORT_FLUSH), the Prometheus endpoint closed.
    pub async fn finish(self) -> Arc<ExportStats> {
        if let Some(task) = self.exporter {
            if tokio::time::timeout(EXPORT_FLUSH, task).await.is_err() {
                tracing::warn!("OTLP: the last export did not finish within {EXPORT_FLUSH:?}");
            }
        }
        if let Some(p) = self.prometheus {
            p.abort();
        }
        self.stats
    }
}

/// Metrics, the Prometheus endpoint (bound before `ready`, so a taken port is
/// an error at once) and the OTLP exporter task.
pub async fn start(
    e: ExportSetup,
    probes_attached: u64,
    pipeline_stats: Arc<Stats>,
) -> anyhow::Result<Exporting> {
    let s = e.settings;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let metrics = Arc::new(Mutex::new(Metrics::new(s.max_series, now)));
    if let Ok(mut m) = metrics.lock() {
        m.set_gauge(super::metrics::PROBES, Vec::new(), probes_attached as f64);
    }
    let prometheus = match s.prometheus_listen {
        Some(addr) => {
            let l = prometheus::bind(addr).await?;
            Some(tokio::spawn(prometheus::serve(
                l,
                Arc::clone(&metrics),
                pipeline_stats,
            )))
        }
        None => None,
    };
    let stats = Arc::new(ExportStats::default());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    let mut resource = vec![
        attrs::s("service.name", "observer"),
        attrs::s("host.name", host.clone()),
    ];
    if let Some(node) = crate::k8s::Pods::node_name_from_env().filter(|n| !n.is_empty()) {
        resource.push(attrs::s("k8s.node.name", node));
    }
    for (k, v) in &s.resource {
        resource.retain(|a| &a.key != k);
        resource.push(attrs::s(k, v.clone()));
    }
    let (tx, task) = if s.otlp.traces.is_some() || s.otlp.metrics.is_some() {
        let sampling = Sampling {
            ratio: s.sample_ratio,
            slow: s.slow_threshold,
            parent_based: s.parent_based,
        };
        let origin = Origin {
            host,
            service_name: s.service_name.clone(),
        };
        let (tx, rx) = trace_queue(
            sampling,
            s.otlp.traces.is_some(),
            origin,
            Arc::clone(&stats),
        );
        let exporter = Exporter {
            config: s.otlp.clone(),
            resource,
            metrics: Arc::clone(&metrics),
            stats: Arc::clone(&stats),
        };
        (Some(tx), Some(tokio::spawn(exporter.run(rx))))
    } else {
        (None, None)
    };
    Ok(Exporting {
        queue: tx,
        metrics,
        exporter: task,
        stats,
        prometheus,
    })
}
