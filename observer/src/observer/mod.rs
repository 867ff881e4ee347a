//! The owner of the observer's life before it runs: prepare (privileges,
//! tracefs, the object), attach (one loop over the program table: attach.rs),
//! and the one rule that says whether it can run. `watch`, `run` and
//! `doctor` all start here, so doctor's verdict is the daemon's.

use std::{
    path::Path,
    sync::{Arc, Mutex},
};

mod attach;
pub mod run;
pub mod stop;
mod summary;

use crate::{
    btf::{KernelOffsets, OffsetsError},
    dns::{self, DnsReport, ResolverFileReport},
    ebpf::{self, LoadError, LoadOptions, Probes, ProgramState},
    features::{Features, State, Verdict},
    gpu,
    privileges::Privileges,
    programs::{self, Feature, Program},
    tls::{self, TlsProbes, TlsReport},
    tracefs::Described,
};

/// What to start.
#[derive(Debug, Clone)]
pub struct Options {
    pub load: LoadOptions,
    pub tls: tls::Settings,
    pub dns_wire: bool,
    pub nvml_lib: Option<String>,
    /// `--cgroup-root`: where the packet programs go, if not where cgroup2
    /// is mounted in this mount namespace.
    pub cgroup_root: Option<std::path::PathBuf>,
}

/// The observer, prepared and attached, not yet running.
pub struct Observer {
    pub probes: Probes,
    pub tls: TlsProbes,
    pub dns: DnsReport,
    /// Plain HTTP capture: where its programs went, or why not.
    pub http_plain: Result<String, String>,
    /// C libraries the discovery handed to DNS (filled while running too).
    pub resolver_files: Arc<Mutex<Vec<ResolverFileReport>>>,
    pub gpus: Result<gpu::Gpus, gpu::nvml::NvmlUnavailable>,
    /// tracefs, or why not and what BTF says instead.
    pub described: Described,
    pub offsets: Result<KernelOffsets, OffsetsError>,
    pub emit_at_destroy: bool,
    /// The task helpers the packet programs may call on this kernel.
    pub skb_task: u32,
    pub options: Options,
}

impl Observer {
    /// Everything before running. Fails only when nothing could be tried
    /// (privileges, tracefs, the object); a program that fails is recorded
    /// and the rest still attach, so `doctor` can list them all. Whether the
    /// observer may run is [`Observer::verdict`].
    pub fn start(options: Options) -> Result<Observer, LoadError> {
        if !Privileges::current().sufficient() {
            return Err(LoadError::NotPrivileged);
        }
        let described = Described::find(&raw_tracepoints());
        let loaded = ebpf::load(&options.load, options.dns_wire, &described)?;
        let mut probes = Probes::new(loaded.ebpf);
        if let Described::BtfOnly { why, declared } = &described {
            warn_without_tracefs(why, declared, probes.uprobe_mechanism() == "uprobe_multi");
        }
        let sock_layout = loaded
            .offsets
            .as_ref()
            .is_ok_and(|o| o.sock_tuple.family != 0);
        let attached = attach::attach_table(
            &mut probes,
            &attach::Context {
                described: &described,
                sock_layout,
                dns_wire: options.dns_wire,
                cgroup_root: options.cgroup_root.as_deref(),
            },
        );
        let dns = dns::report(
            &mut probes,
            attached.feature(Feature::DnsLibrary),
            options
                .dns_wire
                .then(|| attached.on_cgroup(Feature::DnsWire)),
        );
        let http_plain = attached
            .on_cgroup(Feature::HttpPlain)
            .map(|root| format!("TCP payloads on cgroup {}", root.display()))
            .map_err(str::to_owned);
        warn_packets_off(&attached, &http_plain, &dns, options.dns_wire);
        let resolver_files = Arc::new(Mutex::new(Vec::new()));
        let found = Arc::clone(&resolver_files);
        let mut tls = TlsProbes::new(
            &mut probes,
            options.tls,
            attached
                .feature(Feature::TlsHandshakes)
                .and(attached.feature(Feature::TlsPlaintext)),
            Path::new("/proc"),
            described.tracefs(),
            Box::new(move |probes, path, shown| {
                let r = dns::attach_resolver_file(probes, path, shown);
                if let Ok(mut f) = found.lock() {
                    f.push(r);
                }
            }),
        );
        tls.discover(&mut probes);
        let gpus = gpu::Gpus::open(options.nvml_lib.as_deref());
        Ok(Observer {
            probes,
            tls,
            dns,
            http_plain,
            resolver_files,
            gpus,
            described,
            offsets: loaded.offsets,
            emit_at_destroy: loaded.emit_at_destroy,
            skb_task: loaded.skb_task,
            options,
        })
    }

    /// The one rule: every required program attached. Once records wait for
    /// tcp_destroy_sock (the kernel has it), that one is required too.
    pub fn verdict(&self) -> Result<(), LoadError> {
        verdict(&self.probes, self.emit_at_destroy)
    }

    /// The features a user expects on: every one by default, less what a
    /// flag turned off; GPU only when an NVML library was named (most hosts
    /// have no GPU).
    pub fn expected_features(&self) -> Vec<Feature> {
        let o = &self.options;
        Feature::ALL
            .into_iter()
            .filter(|f| match f {
                Feature::TlsPlaintext => o.tls.policy != tls::Policy::Off,
                Feature::DnsWire => o.dns_wire,
                Feature::Gpu => o.nvml_lib.is_some(),
                _ => true,
            })
            .collect()
    }

    /// `doctor`'s verdict and the `ready` line's: unusable without a
    /// required program, degraded while an expected feature is not on.
    pub fn overall(&self) -> Verdict {
        match self.verdict() {
            Err(e) => Verdict::Unusable(e.to_string()),
            Ok(()) => self.features().verdict(&self.expected_features()),
        }
    }

    /// Every feature's state now.
    pub fn features(&self) -> Features {
        let view = View {
            probes: &self.probes,
            tls: &self.tls.report,
            dns: &self.dns_report(),
            http_plain: &self.http_plain,
            gpus: self
                .gpus
                .as_ref()
                .map(gpu::Gpus::device_count)
                .map_err(ToString::to_string),
            options: &self.options,
            emit_at_destroy: self.emit_at_destroy,
            skb_task: self.skb_task,
        };
        view.features()
    }

    /// The DNS report with the C libraries found so far.
    pub fn dns_report(&self) -> DnsReport {
        let mut d = self.dns.clone();
        d.resolver_files = self
            .resolver_files
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        d
    }

    /// The line `watch` and `run` print once every probe is attached.
    pub fn ready_line(&self) -> String {
        format!(
            "ready: observer pid {}, tracking up to {} connections; {}; verdict: {}",
            std::process::id(),
            self.options.load.max_connections,
            self.features().line(),
            self.overall().line()
        )
    }
}

/// Why plain HTTP and wire lookups are not seen, once: without a root
/// cgroup, one line for every packet program.
fn warn_packets_off(
    attached: &attach::Attached,
    http_plain: &Result<String, String>,
    dns: &DnsReport,
    dns_wire: bool,
) {
    if let Some(e) = attached.root_error() {
        tracing::warn!(
            "{e}: plain HTTP requests{}, and connections' first bytes and inbound owners are \
             not seen",
            if dns_wire { ", wire DNS lookups" } else { "" }
        );
        return;
    }
    if let Err(e) = http_plain {
        tracing::warn!("plain HTTP requests not seen: {e}");
    }
    if let (true, Some(e)) = (dns_wire, &dns.wire_error) {
        tracing::warn!("wire lookups not seen: {e}");
    }
}

/// The tracepoints the table's raw programs go on.
fn raw_tracepoints() -> Vec<&'static str> {
    programs::PROGRAMS
        .iter()
        .filter_map(|p| match p.hook {
            programs::Hook::RawTracePoint { layout } => Some(layout.name),
            _ => None,
        })
        .collect()
}

/// Without tracefs, one line says what goes and what stays: the raw
/// tracepoints attach by name (their prototypes checked in BTF), classic
/// ones cannot, nor, without uprobe-multi links (`multi`: before 6.6),
/// per-process TLS probes (then uprobe events, defined in tracefs).
fn warn_without_tracefs(why: &str, declared: &[&str], multi: bool) {
    let raw = raw_tracepoints();
    let lost: Vec<String> = programs::PROGRAMS
        .iter()
        .filter(|p| matches!(p.hook, programs::Hook::TracePoint { .. }))
        .filter(|p| !programs::is_stand_in(p.name))
        .map(|p| format!("{} ({})", p.name, p.gives))
        .chain((!multi).then(|| {
            "per-process TLS plaintext probes (busy processes keep library-wide ones)".into()
        }))
        .collect();
    tracing::warn!(
        "{why}; without it {} of {} raw tracepoints go on, checked against the kernel's BTF, \
         and these are lost: {}",
        declared.len(),
        raw.len(),
        lost.join("; ")
    );
}

/// Is a program required under this kernel's choices?
pub fn required(p: &Program, emit_at_destroy: bool) -> bool {
    p.required || (emit_at_destroy && p.name == "tcp_destroy_sock")
}

fn verdict(probes: &Probes, emit_at_destroy: bool) -> Result<(), LoadError> {
    let attached = |name: &str| probes.state(name).is_some_and(|s| s.attached > 0);
    for (p, s) in probes.states() {
        let stood_in = programs::stand_in(p.name).is_some_and(attached);
        if required(p, emit_at_destroy) && s.attached == 0 && !stood_in {
            return Err(LoadError::Required {
                program: p.name,
                gives: p.gives,
                reason: s
                    .errors
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "not attached".into()),
            });
        }
    }
    Ok(())
}

/// What the feature states are computed from; also used for the summary,
/// after the TLS manager has given everything back.
pub struct View<'a> {
    pub probes: &'a Probes,
    pub tls: &'a TlsReport,
    pub dns: &'a DnsReport,
    pub http_plain: &'a Result<String, String>,
    /// Devices through NVML, or why not.
    pub gpus: Result<u32, String>,
    pub options: &'a Options,
    pub emit_at_destroy: bool,
    pub skb_task: u32,
}

impl View<'_> {
    pub fn features(&self) -> Features {
        Features(
            Feature::ALL
                .iter()
                .map(|&f| {
                    let s = match f {
                        Feature::Connections => self.connections(),
                        Feature::TlsHandshakes => self.tls_handshakes(),
                        Feature::TlsPlaintext => self.tls_plaintext(),
                        Feature::DnsLibrary => self.dns_library(),
                        Feature::DnsWire => match (&self.dns.wire_probed, &self.dns.wire_error) {
                            (Some(w), _) => match ebpf::kernel_probe::task_lost(self.skb_task) {
                                Some(lost) => State::Degraded(format!(
                                    "{w}; senders of queries over UDP unknown: {lost}"
                                )),
                                None => State::On(w.clone()),
                            },
                            (None, e) => State::Off(e.clone().unwrap_or_default()),
                        },
                        Feature::HttpPlain => match self.http_plain {
                            Ok(w) => State::On(w.clone()),
                            Err(e) => State::Off(e.clone()),
                        },
                        Feature::Gpu => match &self.gpus {
                            Ok(n) => State::On(format!("{n} devices through NVML")),
                            Err(e) => State::Off(e.clone()),
                        },
                    };
                    (f, s)
                })
                .collect(),
        )
    }

    fn rows(&self, f: Feature) -> Vec<(&'static Program, ProgramState)> {
        self.probes
            .states()
            .into_iter()
            .filter(|(p, _)| p.serves(f))
            .collect()
    }

    fn connections(&self) -> State {
        let mut rows = self.rows(Feature::Connections);
        let on = |name: &str| self.probes.state(name).is_some_and(|s| s.attached > 0);
        // A stand-in counts only where it stands in.
        rows.retain(|(p, _)| {
            p.hook.attaches() && !(programs::is_stand_in(p.name) && on(programs::CONNECTIONS))
        });

        let attached = rows.iter().filter(|(_, s)| s.attached > 0).count();
        let mut missing: Vec<String> = rows
            .iter()
            .filter(|(_, s)| s.attached == 0)
            .map(|(p, s)| {
                format!(
                    "{} lost: {}",
                    p.name,
                    s.errors.first().map_or("not attached", String::as_str)
                )
            })
            .collect();
        // First bytes and inbound owners come from the packet programs.
        let packets = ["packets_egress", "packets_ingress"]
            .iter()
            .all(|p| self.probes.state(p).is_some_and(|s| s.attached > 0));
        if !packets {
            missing.push(
                "first bytes and inbound owners lost: the packet programs are not attached".into(),
            );
        } else if let Some(lost) = ebpf::kernel_probe::task_lost(self.skb_task) {
            missing.push(format!("inbound owners lost: {lost}"));
        }
        let counts = format!("{attached}/{} programs attached", rows.len());
        if let Err(e) = verdict(self.probes, self.emit_at_destroy) {
            State::Off(e.to_string())
        } else if missing.is_empty() {
            State::On(counts)
        } else {
            State::Degraded(format!("{counts}; {}", missing.join("; ")))
        }
    }

    /// "rustls off: why" for each TLS library whose programs of `f` the
    /// kernel refused.
    fn libraries_refused(&self, f: Feature) -> Vec<String> {
        programs::TLS_LIBRARIES
            .iter()
            .filter_map(|&l| Some(format!("{} off: {}", l.label(), self.probes.refusal(f, l)?)))
            .collect()
    }

    fn tls_handshakes(&self) -> State {
        if let Some(e) = &self.tls.programs_error {
            return State::Off(e.clone());
        }
        let refused = self.libraries_refused(Feature::TlsHandshakes);
        if refused.len() == programs::TLS_LIBRARIES.len() {
            return State::Off(refused.join("; "));
        }
        match self.tls_handshakes_probed() {
            State::On(d) if !refused.is_empty() => {
                State::Degraded(format!("{}; {d}", refused.join("; ")))
            }
            State::Degraded(d) if !refused.is_empty() => {
                State::Degraded(format!("{}; {d}", refused.join("; ")))
            }
            // The libraries found are those refused.
            State::Off(_) if !refused.is_empty() => State::Off(refused.join("; ")),
            s => s,
        }
    }

    /// The handshake state from the files probed.
    fn tls_handshakes_probed(&self) -> State {
        let probed: Vec<String> = self
            .tls
            .files
            .iter()
            .filter(|f| f.probes > 0)
            .map(|f| format!("{} {}", f.library, f.path))
            .collect();
        let first_error = self.tls.files.iter().flat_map(|f| &f.errors).next();
        match (probed.is_empty(), first_error) {
            (true, None) => State::On(
                "no OpenSSL, BoringSSL or GnuTLS library found yet; those found later are probed"
                    .into(),
            ),
            (true, Some(e)) => State::Off(format!(
                "every probe on {} TLS libraries failed: {e}",
                self.tls.files.len()
            )),
            (false, Some(e)) => State::Degraded(format!(
                "{} attach errors ({e}); probed: {}",
                self.tls.attach_errors,
                probed.join(", ")
            )),
            (false, None) => State::On(probed.join(", ")),
        }
    }

    fn tls_plaintext(&self) -> State {
        let policy = self.options.tls.policy;
        if policy == tls::Policy::Off {
            return State::Off("--tls-plaintext-probes off".into());
        }
        match self.tls_handshakes() {
            State::Off(e) => return State::Off(format!("no TLS probes: {e}")),
            State::On(_) | State::Degraded(_) => {}
        }
        let rows = self.rows(Feature::TlsPlaintext);
        let attached: u64 = rows.iter().map(|(_, s)| s.attached).sum();
        // A program the kernel refused is said per library, below.
        let failed = rows
            .iter()
            .filter(|(_, s)| s.loaded)
            .find_map(|(_, s)| s.errors.first());
        let refused = self.libraries_refused(Feature::TlsPlaintext);
        if refused.len() == programs::TLS_LIBRARIES.len() {
            return State::Off(refused.join("; "));
        }
        let how = match policy {
            tls::Policy::All => "all processes".to_owned(),
            _ => format!(
                "auto: every process from its first byte, while under {} calls/s",
                self.options.tls.max_rate
            ),
        };
        let refused = refused.join("; ");
        match (attached, failed) {
            (0, Some(e)) => State::Off(format!("per-call probes failed: {e}")),
            (_, Some(e)) => State::Degraded(format!("{how}; some per-call probes failed: {e}")),
            (_, None) if !refused.is_empty() => State::Degraded(format!("{refused}; {how}")),
            (_, None) => State::On(how),
        }
    }

    fn dns_library(&self) -> State {
        let mut failed: Vec<String> = self
            .dns
            .resolver_files
            .iter()
            .filter_map(|f| f.error.as_ref().map(|e| format!("not in {}: {e}", f.path)))
            .collect();
        let also: Vec<String> = self
            .dns
            .resolver_files
            .iter()
            .filter(|f| f.error.is_none())
            .map(|f| format!("also {} in {}", f.probed.join(", "), f.path))
            .collect();
        match (&self.dns.probed, &self.dns.error) {
            (Some(p), _) => {
                let all = programs::uprobe_sites(Feature::DnsLibrary, programs::Library::Libc)
                    .iter()
                    .all(|s| p.contains(s.symbol));
                if !all {
                    failed.insert(0, "not every resolver function probed".into());
                }
                let mut detail = p.clone();
                for a in also {
                    detail.push_str("; ");
                    detail.push_str(&a);
                }
                if failed.is_empty() {
                    State::On(detail)
                } else {
                    State::Degraded(format!("{detail}; {}", failed.join("; ")))
                }
            }
            (None, e) => State::Off(e.clone().unwrap_or_default()),
        }
    }
}
