//! Entries in the observer's tables that grow with the host's processes
//! and connections (`observer.tables.entries`, the summary's `tables`).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Entries in the observer's tables that grow with the host's processes
/// and connections, stored by their owners as they change (the correlator
/// each second, the TLS manager each second): so that `/metrics`
/// (`observer_tables_entries{table=...}`) and the summary show that what
/// a process or connection added went with it.
#[derive(Debug, Default)]
pub struct Tables {
    /// Process details cached by pid (the correlator's).
    pub processes: AtomicU64,
    /// Cgroup v2 ids whose paths are known (containers placed by the
    /// cgroup a process exec'd in), from the last walk of the tree.
    pub cgroups: AtomicU64,
    /// Connections the correlator follows.
    pub connections: AtomicU64,
    /// HTTP conversations in progress (one per connection with HTTP).
    pub http_conversations: AtomicU64,
    /// Processes whose TLS plaintext calls are followed (the TLS manager's).
    pub tls_processes: AtomicU64,
    /// Processes whose TLS capture is off for their call rate.
    pub tls_busy_processes: AtomicU64,
    /// Looks at a new process's maps still due after its exec.
    pub tls_exec_scans: AtomicU64,
    /// Files the TLS manager has looked at (TLS or not).
    pub tls_files: AtomicU64,
    /// Go executables given an index in the kernel's offsets map (at most
    /// `MAX_GO_BINARIES`).
    pub tls_go_executables: AtomicU64,
    /// The kernel's per-process TLS map (`TLS_PROCS`).
    pub kernel_tls_processes: AtomicU64,
    /// The kernel's connection map (`CONNS`): every TCP socket of the
    /// host it follows; counted every `KERNEL_CONNS_EVERY` seconds.
    pub kernel_connections: AtomicU64,
}

/// The tables' entries as numbers, by name (summary and metric label).
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct TablesSummary {
    pub processes: u64,
    pub cgroups: u64,
    pub connections: u64,
    pub http_conversations: u64,
    pub tls_processes: u64,
    pub tls_busy_processes: u64,
    pub tls_exec_scans: u64,
    pub tls_files: u64,
    pub tls_go_executables: u64,
    pub kernel_tls_processes: u64,
    pub kernel_connections: u64,
}

impl Tables {
    pub fn set(counter: &AtomicU64, n: usize) {
        counter.store(n as u64, Ordering::Relaxed);
    }

    pub fn read(&self) -> TablesSummary {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TablesSummary {
            processes: g(&self.processes),
            cgroups: g(&self.cgroups),
            connections: g(&self.connections),
            http_conversations: g(&self.http_conversations),
            tls_processes: g(&self.tls_processes),
            tls_busy_processes: g(&self.tls_busy_processes),
            tls_exec_scans: g(&self.tls_exec_scans),
            tls_files: g(&self.tls_files),
            tls_go_executables: g(&self.tls_go_executables),
            kernel_tls_processes: g(&self.kernel_tls_processes),
            kernel_connections: g(&self.kernel_connections),
        }
    }
}

impl TablesSummary {
    /// (label, entries), for the metric.
    pub fn by_name(&self) -> [(&'static str, u64); 11] {
        [
            ("processes", self.processes),
            ("cgroups", self.cgroups),
            ("connections", self.connections),
            ("http_conversations", self.http_conversations),
            ("tls_processes", self.tls_processes),
            ("tls_busy_processes", self.tls_busy_processes),
            ("tls_exec_scans", self.tls_exec_scans),
            ("tls_files", self.tls_files),
            ("tls_go_executables", self.tls_go_executables),
            ("kernel_tls_processes", self.kernel_tls_processes),
            ("kernel_connections", self.kernel_connections),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metric_names_every_table_as_the_summary_does() {
        let t = Tables::default();
        Tables::set(&t.processes, 3);
        Tables::set(&t.kernel_connections, 9);
        let read = t.read();
        let json = serde_json::to_value(read).expect("serializes");
        let fields = json.as_object().expect("an object");
        let named = read.by_name();
        assert_eq!(named.len(), fields.len(), "{json}");
        for (name, v) in named {
            assert_eq!(fields[name], v, "{name}");
        }
        assert_eq!(read.processes, 3);
        assert_eq!(read.kernel_connections, 9);
    }
}
