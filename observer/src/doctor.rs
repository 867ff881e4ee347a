//! `observer doctor`: what this machine offers, and for each probe whether it
//! is available and attaches, and what is lost without it. It really loads and
//! attaches every program (then detaches), so "attached" means it works.

use std::path::Path;

use serde::Serialize;

use crate::{
    dns::DnsReport,
    ebpf::ProgramState,
    features::Features,
    gpu::{nvml::NvmlUnavailable, Gpus},
    observer::{Observer, Options},
    privileges::{CapabilityReport, Privileges},
    programs::{self, Feature, Program},
    tls::TlsReport,
    tracefs::{self, Described},
};

#[derive(Debug, Default, Serialize)]
pub struct GpuReport {
    pub nvml_lib: String,
    pub devices: Option<u32>,
    pub error: Option<String>,
}

impl GpuReport {
    /// What opening NVML from `lib` gave (the observer's own try, so NVML is
    /// opened once).
    fn of(lib: Option<&str>, gpus: &Result<Gpus, NvmlUnavailable>) -> Self {
        let nvml_lib = lib.unwrap_or(crate::gpu::nvml::DEFAULT_LIB).to_owned();
        match gpus {
            Ok(g) => GpuReport {
                nvml_lib,
                devices: Some(g.device_count()),
                error: None,
            },
            Err(e) => GpuReport {
                nvml_lib,
                devices: None,
                error: Some(e.err.clone()),
            },
        }
    }
}

/// One connection tracepoint (the `probes` rows of earlier versions).
#[derive(Debug, Serialize)]
pub struct ProbeRow {
    pub program: &'static str,
    pub tracepoint: String,
    pub required: bool,
    pub feature: &'static str,
    pub status: &'static str,
    pub reason: Option<String>,
}

/// One program of the table and what became of it.
#[derive(Debug, Serialize)]
pub struct ProgramRow {
    pub program: &'static str,
    pub hook: programs::Hook,
    pub target: String,
    pub feature: Feature,
    /// A second feature it serves.
    pub also: Option<Feature>,
    pub required: bool,
    pub gives: &'static str,
    /// attached | failed | loaded (nothing to attach it to yet) | not loaded
    pub status: &'static str,
    #[serde(flatten)]
    pub state: ProgramState,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub kernel: String,
    pub btf: bool,
    pub euid: u32,
    pub cap_bpf: bool,
    pub cap_perfmon: bool,
    pub cap_sys_admin: bool,
    pub privileged: bool,
    pub tracefs: Option<String>,
    /// How uprobes go on: "uprobe_multi" links (Linux 6.6+) or
    /// "perf_event"s (null: the object was not loaded).
    pub uprobes: Option<&'static str>,
    /// Whether uprobes carry an attach cookie (Linux 5.15+); false: one
    /// program per TLS library (and Go programs that find their executable
    /// by the task's) stand in for those that read one. Null: the object
    /// was not loaded.
    pub attach_cookies: Option<bool>,
    /// Why the eBPF object could not be loaded, if it could not.
    pub load_error: Option<String>,
    /// Socket field offsets from BTF (null: timeout/unreachable errors and RTT lost).
    pub offsets: Option<crate::btf::KernelOffsets>,
    /// Why the offsets are unknown.
    pub offsets_error: Option<String>,
    /// Records wait for tcp:tcp_destroy_sock (else they go out at CLOSE).
    pub emit_at_destroy: bool,
    /// How the packet programs learn the task sending a packet here: the
    /// task helpers this kernel lets them call (`bpf_get_current_pid_tgid`
    /// 6.10+, `bpf_get_current_comm` later) and, without them, the task's
    /// own fields (`task_struct fields (BTF)`); with neither, inbound
    /// owners, UDP query senders and TLS sessions without a descriptor are
    /// lost.
    pub packet_task: Vec<&'static str>,
    /// The connection tracepoints.
    pub probes: Vec<ProbeRow>,
    /// Every program of the object (the program table), with its state.
    pub programs: Vec<ProgramRow>,
    /// Each feature: on, degraded (why) or off (why), as `ready` says it.
    pub features: Features,
    /// TLS libraries found on this machine and in running processes, and the
    /// handshake probes attached to each (null when nothing could be tried).
    pub tls: Option<TlsReport>,
    /// GPUs through NVML: the device count, or why GPU features are off.
    pub gpu: GpuReport,
    /// The resolver probes: what was probed, or why lookups are not seen.
    pub dns: Option<DnsReport>,
    /// Other observers loaded on this host (found before this one loaded).
    pub other_observers: Vec<crate::others::OtherObserver>,
    /// True when the observer can run: the rule `watch` and `run` apply.
    pub ok: bool,
    /// Why it cannot, when it cannot.
    pub refusal: Option<String>,
    /// `ok`, `degraded` (it runs, but an expected feature is off or
    /// degraded: `why` lists them) or `unusable` (`why`: as `refusal`); the
    /// exit code follows it (0, 3, 1).
    pub verdict: crate::features::Verdict,
    /// The capabilities held, and per feature those it needs and lacks
    /// (`privileges::FEATURE_NEEDS`).
    pub capabilities: CapabilityReport,
}

fn kernel_release() -> String {
    let rel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let arch = std::env::consts::ARCH;
    format!("{} ({arch})", rel.trim())
}

/// "plain HTTP + DNS wire" for a program that serves two features.
fn feature_label(p: &ProgramRow) -> String {
    match p.also {
        Some(Feature::DnsWire) => {
            format!("{} + DNS wire", p.feature.label().replace(" requests", ""))
        }
        Some(f) => format!("{} + {}", p.feature.label(), f.label()),
        None => p.feature.label().to_string(),
    }
}

fn status(s: &ProgramState) -> &'static str {
    match (s.attached, s.failures, s.loaded) {
        (1.., _, _) => "attached",
        (0, 1.., _) => "failed",
        (0, 0, true) => "loaded",
        (0, 0, false) => "not loaded",
    }
}

fn rows(states: &[(&'static Program, ProgramState)]) -> (Vec<ProbeRow>, Vec<ProgramRow>) {
    let probes = states
        .iter()
        .filter(|(p, _)| p.feature == Feature::Connections && p.hook.attaches())
        // A stand-in is a row only where it stands in.
        .filter(|(p, s)| !(crate::programs::is_stand_in(p.name) && s.attached == 0))
        .map(|(p, s)| ProbeRow {
            program: p.name,
            tracepoint: p.hook.target(),
            required: p.required,
            feature: p.gives,
            status: if s.attached > 0 { "attached" } else { "failed" },
            reason: s.errors.first().cloned(),
        })
        .collect();
    let programs = states
        .iter()
        .map(|(p, s)| ProgramRow {
            program: p.name,
            hook: p.hook,
            target: p.hook.target(),
            feature: p.feature,
            also: p.also,
            required: p.required,
            gives: p.gives,
            status: status(s),
            state: s.clone(),
        })
        .collect();
    (probes, programs)
}

/// Rows for when nothing could be tried, each saying why.
fn untried(reason: &str) -> Vec<(&'static Program, ProgramState)> {
    programs::PROGRAMS
        .iter()
        .map(|p| {
            (
                p,
                ProgramState {
                    failures: 1,
                    errors: vec![reason.to_owned()],
                    ..ProgramState::default()
                },
            )
        })
        .collect()
}

/// Starts the observer as `watch` would (same options, same rule), reports,
/// and drops it (which detaches everything).
pub fn run(options: Options) -> Report {
    let p = Privileges::current();
    let nvml_lib = options.nvml_lib.clone();
    let lib = nvml_lib.as_deref();
    let mut report = Report {
        kernel: kernel_release(),
        btf: Path::new("/sys/kernel/btf/vmlinux").exists(),
        euid: p.euid,
        cap_bpf: p.cap_bpf,
        cap_perfmon: p.cap_perfmon,
        cap_sys_admin: p.cap_sys_admin,
        privileged: p.sufficient(),
        tracefs: tracefs::find().map(|p| p.display().to_string()),
        uprobes: None,
        attach_cookies: None,
        load_error: None,
        offsets: None,
        offsets_error: None,
        emit_at_destroy: false,
        packet_task: Vec::new(),
        probes: Vec::new(),
        programs: Vec::new(),
        features: Features::default(),
        tls: None,
        gpu: GpuReport::default(),
        dns: None,
        other_observers: crate::others::find(),
        ok: false,
        refusal: None,
        verdict: crate::features::Verdict::Unusable("not started".into()),
        capabilities: CapabilityReport::of(&p),
    };
    match Observer::start(options) {
        Err(e) => {
            let why = format!("{:#}", anyhow::Error::from(e));
            (report.probes, report.programs) = rows(&untried(&format!("not tried: {why}")));
            report.refusal = Some(why.clone());
            report.verdict = crate::features::Verdict::Unusable(why.clone());
            report.load_error = Some(why);
            // The observer did not get as far as NVML: tried here.
            report.gpu = GpuReport::of(lib, &Gpus::open(lib));
        }
        Ok(obs) => {
            report.tracefs = Some(match &obs.described {
                Described::Tracefs(p) => p.display().to_string(),
                Described::BtfOnly { why, .. } => format!("none: {why}"),
            });
            report.uprobes = Some(obs.probes.uprobe_mechanism());
            report.attach_cookies = Some(obs.probes.attach_cookies());
            report.offsets = obs.offsets.as_ref().ok().cloned();
            report.offsets_error = obs.offsets.as_ref().err().map(ToString::to_string);
            report.emit_at_destroy = obs.emit_at_destroy;
            report.packet_task = crate::ebpf::kernel_probe::packet_task_ways(obs.skb_task);
            report.gpu = GpuReport::of(lib, &obs.gpus);
            (report.probes, report.programs) = rows(&obs.probes.states());
            report.features = obs.features();
            report.tls = Some(obs.tls.report.clone());
            report.dns = Some(obs.dns_report());
            match obs.verdict() {
                Ok(()) => report.ok = true,
                Err(e) => report.refusal = Some(e.to_string()),
            }
            report.verdict = obs.overall();
        }
    }
    report
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// The report as text; `verbose` adds the verifier's logs of programs the
/// kernel refused.
pub fn print(r: &Report, verbose: bool) {
    println!("observer doctor");
    print_host(r);
    print_object(r);
    print_programs(r, verbose);
    print_features(r);
    print_tls(r.tls.as_ref());
    if let Some(d) = &r.dns {
        print_dns(d);
    }
    print_gpu(&r.gpu);
    print_verdict(r);
}

/// The machine: kernel, BTF, privileges, tracefs, other observers, uprobes.
fn print_host(r: &Report) {
    println!("  kernel       {}", r.kernel);
    println!(
        "  BTF          {}",
        if r.btf {
            "yes (/sys/kernel/btf/vmlinux)"
        } else {
            "no (not needed by the tracepoint probes)"
        }
    );
    println!(
        "  privileges   euid {} (CAP_BPF {}, CAP_PERFMON {}, CAP_SYS_ADMIN {}){}",
        r.euid,
        yes(r.cap_bpf),
        yes(r.cap_perfmon),
        yes(r.cap_sys_admin),
        if r.privileged {
            ""
        } else {
            ": observer needs root, or CAP_BPF and CAP_PERFMON"
        }
    );
    let names = |caps: &[crate::privileges::Cap]| {
        let v: Vec<&str> = caps.iter().map(|c| c.name()).collect();
        if v.is_empty() {
            "none".to_owned()
        } else {
            v.join(", ")
        }
    };
    println!(
        "  capabilities {} held; every feature needs, as root: {} (see `missing` under features)",
        names(&r.capabilities.held),
        names(r.capabilities.deploy)
    );
    println!(
        "  tracefs      {}",
        r.tracefs.as_deref().unwrap_or("not mounted")
    );
    println!(
        "  others       {}",
        crate::others::warning(&r.other_observers).map_or_else(
            || "no other observer loaded".to_owned(),
            |w| format!("WARNING: {w}")
        )
    );
    match r.uprobes {
        Some("uprobe_multi") => println!(
            "  uprobes      uprobe-multi links (each closes in one grace period, side by side)"
        ),
        Some(other) => println!(
            "  uprobes      {other}s (no uprobe-multi links before Linux 6.6: each close waits ~0.1 s under the kernel's trace-event lock)"
        ),
        None => {}
    }
    if r.attach_cookies == Some(false) {
        println!(
            "  uprobes      without attach cookies (before Linux 5.15): a TLS program per library \
             stands in for each shared one"
        );
    }
}

/// Whether the eBPF object loaded, and the socket offsets BTF gave it.
fn print_object(r: &Report) {
    if let Some(e) = &r.load_error {
        println!("  eBPF object  NOT LOADED: {e}");
        return;
    }
    println!("  eBPF object  loaded (ring buffer, connection map, counters)");
    match (&r.offsets, &r.offsets_error) {
        (Some(o), _) => print_offsets(o),
        (None, e) => println!(
            "  BTF offsets  unknown ({}): \"timeout\"/\"unreachable\" errors and srtt_us lost",
            e.as_deref().unwrap_or("?")
        ),
    }
}

fn print_offsets(o: &crate::btf::KernelOffsets) {
    println!(
        "  BTF offsets  sock.sk_err {}, tcp_sock.srtt_us {}: errors and RTT readable",
        o.sk_err, o.srtt_us
    );
    let c = &o.tcp_counters;
    println!(
        "  BTF offsets  tcp_sock.bytes_sent {}, bytes_retrans {}, bytes_received {}, \
         data_segs_out {}, data_segs_in {}, sock.sk_flags {}: bytes and segments{}",
        c.bytes_sent,
        c.bytes_retrans,
        c.bytes_received,
        c.data_segs_out,
        c.data_segs_in,
        c.sk_flags,
        if c.bytes_sent == 0 {
            " LOST"
        } else {
            " readable"
        }
    );
    println!(
        "  BTF offsets  sock.sk_lock.owned {}: {}",
        o.sk_lock_owned,
        if o.sk_lock_owned == 0 {
            "inbound owners LOST, TLS sessions without a descriptor untied"
        } else {
            "inbound owners and TLS sessions without a descriptor from their packets"
        }
    );
}

/// The program table: one row per program, its errors, and with `verbose`
/// the verifier's log.
fn print_programs(r: &Report, verbose: bool) {
    println!("programs (the whole eBPF object):");
    println!(
        "  {:<26} {:<21} {:<9} {:<10} {:>4}  TARGET / WHAT IT GIVES",
        "PROGRAM", "FEATURE", "REQUIRED", "STATUS", "AT"
    );
    for p in &r.programs {
        println!(
            "  {:<26} {:<21} {:<9} {:<10} {:>4}  {}: {}",
            p.program,
            feature_label(p),
            yes(p.required),
            p.status,
            p.state.attached,
            p.target,
            p.gives
        );
        for e in &p.state.errors {
            println!("  {:<26} -> {e}", "");
        }
        if verbose {
            if let Some(log) = &p.state.verifier_log {
                println!("  {:<26} verifier log:", "");
                for l in log.lines() {
                    println!("  {:<28}{l}", "");
                }
            }
        }
    }
}

fn print_features(r: &Report) {
    println!("features:");
    for (f, s) in &r.features.0 {
        println!("  {:<21} {:<9} {}", f.label(), s.word(), s.detail());
        print_missing(r, *f);
    }
    if r.features.0.is_empty() {
        // Nothing started: what each feature lacks is still known.
        for f in Feature::ALL {
            if !r.capabilities.missing(f).is_empty() {
                println!("  {:<21} {:<9} not started", f.label(), "off");
                print_missing(r, f);
            }
        }
    }
}

/// The resolver probes: library lookups, resolver files, and the wire.
fn print_dns(d: &DnsReport) {
    match (&d.probed, &d.error) {
        (Some(what), _) => println!("DNS lookups: {what}, for every process"),
        (None, e) => println!(
            "DNS lookups: NOT SEEN ({}): only lookups on the wire are seen",
            e.as_deref().unwrap_or("?")
        ),
    }
    for f in &d.resolver_files {
        match &f.error {
            None => println!(
                "DNS lookups: {} in {}, for every process",
                f.probed.join(", "),
                f.path
            ),
            Some(e) => println!("DNS lookups: NOT SEEN in {} ({e})", f.path),
        }
    }
    match (&d.wire_probed, &d.wire_error) {
        (Some(what), _) => println!("DNS on the wire: {what}, for every process"),
        (None, e) => println!(
            "DNS on the wire: NOT SEEN ({}): lookups by programs with their own resolver are missed, library lookups lack their server",
            e.as_deref().unwrap_or("?")
        ),
    }
}

fn print_gpu(g: &GpuReport) {
    match (&g.devices, &g.error) {
        (Some(n), _) => println!(
            "GPUs: {n} devices through NVML ({}): GPU state on records and metrics",
            g.nvml_lib
        ),
        (None, e) => println!(
            "GPUs: off, NVML not loaded from {} ({}): records carry \"gpu\": null, no GPU metrics",
            g.nvml_lib,
            e.as_deref().unwrap_or("?")
        ),
    }
}

fn print_verdict(r: &Report) {
    let attached = r.programs.iter().filter(|p| p.status == "attached").count();
    println!(
        "verdict: {}, {attached}/{} programs attached; features: {}",
        r.verdict.line(),
        r.programs.len(),
        r.features.words()
    );
}

/// "missing CAP_SYS_ADMIN (why)" under a feature, one line per capability.
fn print_missing(r: &Report, f: Feature) {
    for m in r.capabilities.missing(f) {
        println!("  {:<21} -> missing {}: {}", "", m.names(), m.why);
    }
}

fn print_tls(tls: Option<&TlsReport>) {
    let Some(t) = tls else { return };
    println!(
        "TLS libraries (uprobes on the file, in every process that maps it, from its first byte:"
    );
    println!("  handshake, server name and per-call plaintext, the latter off for a process whose call rate is high):");
    if let Some(e) = &t.programs_error {
        println!("  NOT AVAILABLE: {e}: records carry no \"tls\" object");
        return;
    }
    if t.files.is_empty() {
        println!("  none found (no libssl / libgnutls on this machine or in running processes)");
    }
    for f in &t.files {
        println!("  {:<10} {:<56} {} probes", f.library, f.path, f.probes);
        for e in &f.errors {
            println!("  {:<10} -> {e}", "");
        }
    }
    if t.files_unreadable + t.maps_unreadable > 0 {
        println!(
            "  skipped: {} files unreadable, {} /proc/PID/maps unreadable",
            t.files_unreadable, t.maps_unreadable
        );
    }
    print_go(t);
    print_rustls(t);
}

/// Rust executables of running processes that carry rustls: which got
/// probes, which not and why (stripped, functions not found).
fn print_rustls(t: &TlsReport) {
    if t.rustls_executables.is_empty() {
        return;
    }
    println!("rustls executables (probed in the executable, for all its processes):");
    for r in &t.rustls_executables {
        match &r.not_probed {
            None => println!(
                "  {:<56} rustls: {} probes ({} mangling)",
                r.path,
                r.probes,
                r.mangling.unwrap_or("-")
            ),
            Some(why) => println!("  {:<56} rustls: not probed: {why}", r.path),
        }
    }
    if t.rustls_executables_unlisted > 0 {
        println!("  and {} more", t.rustls_executables_unlisted);
    }
}

/// Go executables of running processes: which got crypto/tls probes (and
/// where their symbols and struct offsets came from), which not and why.
fn print_go(t: &TlsReport) {
    if t.go_executables.is_empty() {
        return;
    }
    println!("Go executables (crypto/tls probed in the executable, for all its processes):");
    for g in &t.go_executables {
        let version = g.version.as_deref().unwrap_or("go?");
        match &g.not_probed {
            None => println!(
                "  {:<56} {version}: {} probes (symbols: {}, offsets: {})",
                g.path,
                g.probes,
                g.symbols_from
                    .map_or("-".into(), |s| format!("{s:?}").to_lowercase()),
                g.offsets_from
                    .map_or("-".into(), |s| format!("{s:?}").to_lowercase()),
            ),
            Some(why) => println!("  {:<56} {version}: not probed: {why}", g.path),
        }
    }
    if t.go_executables_unlisted > 0 {
        println!("  and {} more", t.go_executables_unlisted);
    }
}
