//! Attaching is one loop over the program table, each row handed to the
//! handler of its hook kind: tracepoints go on their tracepoints, the packet
//! programs on the root cgroup, and the programs the observer runs itself
//! are loaded. Uprobe programs are loaded here too; they are placed later,
//! file by file, as library discovery finds what they probe (DNS: the
//! system's C library; TLS: tls::manager, for the life of the observer).
//! What went wrong is kept per feature, for the DNS, plain HTTP and TLS
//! reports.

use std::{collections::BTreeMap, path::Path};

use crate::{
    cgroup::{Root, RootError},
    dns,
    ebpf::{chain, ProbeError, Probes},
    programs::{self, Feature, Hook, Program},
    tracefs::{Described, LayoutError},
};

/// What the handlers need besides the program.
pub struct Context<'a> {
    pub described: &'a Described,
    /// The kernel's BTF gave the socket layout the raw lifecycle program
    /// reads.
    pub sock_layout: bool,
    /// `--dns-wire`: without it the wire-only programs stay off.
    pub dns_wire: bool,
    /// `--cgroup-root`, if given.
    pub cgroup_root: Option<&'a Path>,
}

/// What attaching the table gave.
#[derive(Debug, Default)]
pub struct Attached {
    /// Per feature, the first reason one of its programs is missing.
    missing: BTreeMap<Feature, String>,
    /// The root cgroup the packet programs went on, once one was asked for
    /// (or why there is none).
    root: Option<Result<Root, String>>,
}

impl Attached {
    /// Every program of `feature` is on (or, for uprobes, loaded).
    pub fn feature(&self, feature: Feature) -> Result<(), &str> {
        match self.missing.get(&feature) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Where `feature`'s packet programs went, or why they are not on.
    pub fn on_cgroup(&self, feature: Feature) -> Result<&Path, &str> {
        self.feature(feature)?;
        match &self.root {
            Some(Ok(root)) => Ok(&root.path),
            Some(Err(e)) => Err(e),
            None => Err("no packet program asked for the cgroup"),
        }
    }

    /// Why the root cgroup could not be opened, once a packet program asked.
    pub fn root_error(&self) -> Option<&str> {
        match &self.root {
            Some(Err(e)) => Some(e),
            _ => None,
        }
    }

    /// A program's outcome counts against every feature it serves.
    /// A TLS library's uprobe counts against that library only (asked of
    /// the probes per library), so that, say, a refused rustls program
    /// leaves OpenSSL, GnuTLS and Go on.
    fn note(&mut self, p: &Program, r: Result<(), AttachError>) {
        let Err(e) = r else { return };
        if p.per_tls_library() {
            return;
        }
        let e = e.to_string();
        for f in [Some(p.feature), p.also].into_iter().flatten() {
            self.missing.entry(f).or_insert_with(|| e.clone());
        }
    }
}

/// Why a program is not on.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("{}", chain(.0))]
    Probe(#[source] Box<ProbeError>),
    #[error("the socket layout is unknown (no kernel BTF)")]
    NoSocketLayout,
    /// Neither the program nor the one that stands in for it.
    #[error("{first}; {stand_in}: {}", chain(.source))]
    NoStandIn {
        first: Box<AttachError>,
        stand_in: &'static str,
        source: Box<ProbeError>,
    },
    /// The root cgroup could not be had (the first packet program's
    /// reason, said again for each).
    #[error("{0}")]
    NoRoot(String),
}

impl AttachError {
    fn probe(e: ProbeError) -> Self {
        AttachError::Probe(Box::new(e))
    }

    /// A classic tracepoint without tracefs: said once, at start, for all.
    fn no_tracefs(&self) -> bool {
        matches!(
            self,
            AttachError::Probe(p) if matches!(
                **p,
                ProbeError::Layout {
                    source: LayoutError::NoTracefs { .. },
                    ..
                }
            )
        )
    }
}

/// Every program of the table, each by the handler of its hook kind. Never
/// fails: a program that cannot go on is recorded (the probes' states for
/// `doctor`, [`Attached`] for the features' reports) and the rest go on.
pub fn attach_table(probes: &mut Probes, cx: &Context) -> Attached {
    let mut out = Attached::default();
    if !cx.dns_wire {
        out.missing.insert(Feature::DnsWire, dns::WIRE_OFF.into());
    }
    for p in programs::PROGRAMS {
        if programs::is_stand_in(p.name) || !wanted(p, cx) {
            continue;
        }
        let r = match p.hook {
            Hook::TracePoint { .. } | Hook::RawTracePoint { .. } => on_tracepoint(probes, p, cx),
            // Placed by library discovery; loading now finds a verifier
            // error before any library is probed.
            Hook::UProbe { .. } | Hook::Run => probes.load(p.name).map_err(AttachError::probe),
            Hook::CgroupSkb { .. } | Hook::CgroupSockRelease => {
                let root = out.root.get_or_insert_with(|| {
                    Root::open(cx.cgroup_root).map_err(|e: RootError| e.to_string())
                });
                on_cgroup(probes, p, root)
            }
        };
        out.note(p, r);
    }
    out
}

/// Programs that serve only the wire lookups stay off without `--dns-wire`.
fn wanted(p: &Program, cx: &Context) -> bool {
    cx.dns_wire || !(p.feature == Feature::DnsWire && p.also.is_none())
}

/// A tracepoint program. The raw lifecycle program needs the socket layout
/// from BTF; without it, or when it fails, its classic stand-in goes on
/// instead (and the feature counts as served).
fn on_tracepoint(
    probes: &mut Probes,
    p: &'static Program,
    cx: &Context,
) -> Result<(), AttachError> {
    let reads_socket = p.name == programs::CONNECTIONS || p.name == programs::CONNECTIONS_NESTED;
    let r = if reads_socket && !cx.sock_layout {
        let e = AttachError::NoSocketLayout;
        probes.note_external(p.name, Err(&e));
        Err(e)
    } else {
        probes
            .attach_tracepoint(p.name, cx.described)
            .map_err(AttachError::probe)
    };
    let Err(e) = r else { return Ok(()) };
    let Some(other) = programs::stand_in(p.name) else {
        if !e.no_tracefs() && !matches!(e, AttachError::NoSocketLayout) {
            tracing::warn!(program = p.name, "lost: {}: {e}", p.gives);
        }
        return Err(e);
    };
    match probes.attach_tracepoint(other, cx.described) {
        Ok(()) => {
            // Without the socket layout, the BTF reader's warning has said so.
            if matches!(e, AttachError::NoSocketLayout) {
                tracing::info!(program = p.name, "{e}; {other} stands in");
            } else {
                tracing::warn!(program = p.name, "{e}; {other} stands in");
            }
            Ok(())
        }
        Err(source) => {
            let e = AttachError::NoStandIn {
                first: Box::new(e),
                stand_in: other,
                source: Box::new(source),
            };
            tracing::warn!(program = p.name, "lost: {}: {e}", p.gives);
            Err(e)
        }
    }
}

/// A packet program on the root cgroup, where it sees every socket of the
/// host's processes.
fn on_cgroup(
    probes: &mut Probes,
    p: &'static Program,
    root: &Result<Root, String>,
) -> Result<(), AttachError> {
    let root = root.as_ref().map_err(|e| AttachError::NoRoot(e.clone()))?;
    probes
        .attach_cgroup(p.name, &root.dir, &root.path)
        .map_err(AttachError::probe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_serving_two_features_counts_against_both_and_the_first_reason_stays() {
        let mut a = Attached::default();
        let packets = programs::get("packets_egress").expect("in the table");
        let release = programs::get("dns_sock_release").expect("in the table");
        a.note(release, Err(AttachError::NoRoot("first".into())));
        a.note(packets, Err(AttachError::NoRoot("second".into())));
        a.note(packets, Ok(()));
        assert_eq!(a.feature(Feature::DnsWire), Err("first"));
        assert_eq!(a.feature(Feature::HttpPlain), Err("second"));
        assert_eq!(a.feature(Feature::Connections), Ok(()));
    }

    #[test]
    fn without_dns_wire_only_the_wire_only_programs_stay_off() {
        let described = Described::Tracefs("/nonexistent".into());
        let cx = |dns_wire| Context {
            described: &described,
            sock_layout: true,
            dns_wire,
            cgroup_root: None,
        };
        let off: Vec<&str> = programs::PROGRAMS
            .iter()
            .filter(|p| !wanted(p, &cx(false)))
            .map(|p| p.name)
            .collect();
        assert_eq!(off, ["dns_sock_release"]);
        assert!(programs::PROGRAMS.iter().all(|p| wanted(p, &cx(true))));
    }

    #[test]
    fn the_cgroup_reason_is_the_roots_when_it_could_not_be_opened() {
        let a = Attached {
            missing: BTreeMap::from([(Feature::HttpPlain, "no root".to_string())]),
            root: Some(Err(RootError::NotMounted.to_string())),
        };
        assert_eq!(a.on_cgroup(Feature::HttpPlain), Err("no root"));
        assert_eq!(
            a.on_cgroup(Feature::DnsWire),
            Err("no cgroup v2 hierarchy mounted at its root")
        );
    }
}
