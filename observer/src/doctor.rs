//! `observer doctor`: what this machine offers, and for each probe whether it
//! is available and attaches, and what is lost without it. It really loads and
//! attaches every program (then detaches), so "attached" means it works.

use std::path::Path;

use serde::Serialize;

use crate::{
    ebpf::{self, LoadOptions, ProbeReport, ProbeStatus, PROBES},
    privileges::{Privileges, NEEDS},
    tls::{Policy, Settings, TlsProbes, TlsReport},
    tracefs,
};

#[derive(Debug, Serialize)]
pub struct DnsReport {
    /// e.g. "getaddrinfo in /usr/lib/x86_64-linux-gnu/libc.so.6".
    pub probed: Option<String>,
    pub error: Option<String>,
    /// Wire lookups: e.g. "port 53 on cgroup /sys/fs/cgroup".
    pub wire_probed: Option<String>,
    pub wire_error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct GpuReport {
    pub nvml_lib: String,
    pub devices: Option<u32>,
    pub error: Option<String>,
}

fn gpu_report(lib: Option<&str>) -> GpuReport {
    let nvml_lib = lib.unwrap_or(crate::gpu::nvml::DEFAULT_LIB).to_owned();
    match crate::gpu::Gpus::open(lib) {
        Ok(g) => GpuReport {
            nvml_lib,
            devices: Some(g.device_count()),
            error: None,
        },
        Err(e) => GpuReport {
            nvml_lib,
            devices: None,
            error: Some(e.err),
        },
    }
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
    /// Why the eBPF object could not be loaded, if it could not.
    pub load_error: Option<String>,
    /// Socket field offsets from BTF (null: timeout/unreachable errors and RTT lost).
    pub offsets: Option<crate::btf::KernelOffsets>,
    /// Why the offsets are unknown.
    pub offsets_error: Option<String>,
    /// Records wait for tcp:tcp_destroy_sock (else they go out at CLOSE).
    pub emit_at_destroy: bool,
    pub probes: Vec<ProbeReport>,
    /// TLS libraries found on this machine and in running processes, and the
    /// handshake probes attached to each (null when nothing could be tried).
    pub tls: Option<TlsReport>,
    /// GPUs through NVML: the device count, or why GPU features are off.
    pub gpu: GpuReport,
    /// The resolver probes: what was probed, or why lookups are not seen.
    pub dns: Option<DnsReport>,
    /// True when the observer can run (every required probe attached).
    pub ok: bool,
}

fn kernel_release() -> String {
    let rel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let arch = std::env::consts::ARCH;
    format!("{} ({arch})", rel.trim())
}

/// Probe rows for when nothing could be tried, each saying why.
fn untried(reason: &str) -> Vec<ProbeReport> {
    PROBES
        .iter()
        .map(|s| ProbeReport {
            program: s.program,
            hook: s.hook,
            tracepoint: format!("{}:{}", s.layout.category, s.layout.name),
            required: s.required,
            feature: s.feature,
            status: ProbeStatus::Failed(reason.to_owned()),
        })
        .collect()
}

pub fn run(nvml_lib: Option<&str>) -> Report {
    let p = Privileges::current();
    let mut report = Report {
        kernel: kernel_release(),
        btf: Path::new("/sys/kernel/btf/vmlinux").exists(),
        euid: p.euid,
        cap_bpf: p.cap_bpf,
        cap_perfmon: p.cap_perfmon,
        cap_sys_admin: p.cap_sys_admin,
        privileged: p.sufficient(),
        tracefs: None,
        load_error: None,
        offsets: None,
        offsets_error: None,
        emit_at_destroy: false,
        probes: Vec::new(),
        tls: None,
        gpu: gpu_report(nvml_lib),
        dns: None,
        ok: false,
    };
    if !p.sufficient() {
        report.tracefs = tracefs::find().map(|p| p.display().to_string());
        report.load_error = Some(NEEDS.to_owned());
        report.probes = untried(&format!("not tried: {NEEDS}"));
        return report;
    }
    let tfs = match tracefs::find_or_mount() {
        Ok(t) => t,
        Err(e) => {
            report.load_error = Some(e.to_string());
            report.probes = untried("not tried: no tracefs");
            return report;
        }
    };
    report.tracefs = Some(tfs.display().to_string());
    let mut loaded = match ebpf::load(&LoadOptions::default(), &tfs) {
        Ok(l) => l,
        Err(e) => {
            report.load_error = Some(format!("{e:#}"));
            report.probes = untried("not tried: the eBPF object did not load");
            return report;
        }
    };
    // Attach each row on its own so a required failure still lists the rest.
    report.offsets = loaded.offsets.clone().ok();
    report.offsets_error = loaded.offsets.clone().err();
    report.emit_at_destroy = loaded.emit_at_destroy;
    report.probes = PROBES
        .iter()
        .map(|spec| ebpf::attach_spec(&mut loaded.ebpf, &tfs, spec))
        .collect();
    report.ok = report.probes.iter().all(|r| !r.required || r.attached());
    // Before TLS discovery, which also puts the resolver probes on the other
    // C libraries it finds.
    let dns = crate::dns::attach(&mut loaded.ebpf, true);
    // The same discovery `watch` makes at start; dropping it removes what it
    // attached.
    let mut tls = TlsProbes::new(
        &mut loaded.ebpf,
        Settings {
            policy: Policy::Auto,
            max_rate: 2000,
            max_processes: 512,
        },
        Path::new("/proc"),
        &tfs,
    );
    tls.discover(&mut loaded.ebpf);
    report.tls = Some(tls.report.clone());
    report.dns = Some(DnsReport {
        probed: dns.libc.clone().ok(),
        error: dns.libc.err(),
        wire_probed: dns.wire.clone().ok(),
        wire_error: dns.wire.err(),
    });
    report
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

pub fn print(r: &Report) {
    println!("observer doctor");
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
    println!(
        "  tracefs      {}",
        r.tracefs.as_deref().unwrap_or("not mounted")
    );
    if let Some(e) = &r.load_error {
        println!("  eBPF object  NOT LOADED: {e}");
    } else {
        println!("  eBPF object  loaded (ring buffer, connection map, counters)");
        match (&r.offsets, &r.offsets_error) {
            (Some(o), _) => println!(
                "  BTF offsets  sock.sk_err {}, tcp_sock.srtt_us {}: errors and RTT readable",
                o.sk_err, o.srtt_us
            ),
            (None, e) => println!(
                "  BTF offsets  unknown ({}): \"timeout\"/\"unreachable\" errors and srtt_us lost",
                e.as_deref().unwrap_or("?")
            ),
        }
    }
    println!("probes:");
    println!(
        "  {:<22} {:<28} {:<9} {:<11} WHAT IT GIVES (LOST WITHOUT IT)",
        "PROGRAM", "TRACEPOINT", "REQUIRED", "STATUS"
    );
    for p in &r.probes {
        let (status, reason) = match &p.status {
            ProbeStatus::Attached => ("attached", None),
            ProbeStatus::Unavailable(r) => ("missing", Some(r)),
            ProbeStatus::Failed(r) => ("failed", Some(r)),
        };
        let tp = match p.hook {
            crate::ebpf::Hook::TracePoint => p.tracepoint.clone(),
            crate::ebpf::Hook::RawTracePoint => format!("{} (raw)", p.tracepoint),
        };
        println!(
            "  {:<22} {:<28} {:<9} {:<11} {}",
            p.program,
            tp,
            yes(p.required),
            status,
            p.feature
        );
        if let Some(reason) = reason {
            println!("  {:<22} -> {reason}", "");
        }
    }
    print_tls(r.tls.as_ref());
    if let Some(d) = &r.dns {
        match (&d.probed, &d.error) {
            (Some(what), _) => println!("DNS lookups: {what}, for every process"),
            (None, e) => println!(
                "DNS lookups: NOT SEEN ({}): only lookups on the wire are seen",
                e.as_deref().unwrap_or("?")
            ),
        }
        for f in r.tls.iter().flat_map(|t| &t.resolver_files) {
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
    match (&r.gpu.devices, &r.gpu.error) {
        (Some(n), _) => println!(
            "GPUs: {n} devices through NVML ({}): GPU state on records and metrics",
            r.gpu.nvml_lib
        ),
        (None, e) => println!(
            "GPUs: off, NVML not loaded from {} ({}): records carry \"gpu\": null, no GPU metrics",
            r.gpu.nvml_lib,
            e.as_deref().unwrap_or("?")
        ),
    }
    let attached = r.probes.iter().filter(|p| p.attached()).count();
    if r.ok {
        println!("verdict: ok, {attached}/{} probes attach", r.probes.len());
    } else {
        println!(
            "verdict: NOT WORKING, {attached}/{} probes attach",
            r.probes.len()
        );
    }
}

fn print_tls(tls: Option<&TlsReport>) {
    let Some(t) = tls else { return };
    println!("TLS libraries (uprobes; handshake and server name for every process, per-call");
    println!("  plaintext probes per process from its first TLS session, while its call rate is modest):");
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
}
