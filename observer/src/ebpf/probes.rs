//! The loaded object's programs and what became of each: loaded or not,
//! attached where, and why not. Every attach of every feature goes through
//! [`Probes`], so the `ready` line, the summary and `doctor` read one ledger
//! keyed by the program table (`crate::programs`).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    error::Error as _,
    io,
    os::fd::AsFd,
    path::Path,
};

use aya::{
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
        CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, CgroupSock, ProgramError, ProgramFd,
        RawTracePoint, TracePoint, UProbe,
    },
    Ebpf,
};
use serde::Serialize;

use super::uprobe_multi;
use crate::{
    libraries::elf,
    programs::{self, Direction, Hook, Program},
    tracefs::{self, Described},
};

/// Why a program could not be loaded or attached. The source (aya's error,
/// and under it the syscall's) is kept; `{:#}` through [`chain`] shows it.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The table names a program the object lacks (a build mismatch).
    #[error("program {0} is not in the eBPF object")]
    NotInObject(&'static str),
    /// The object's program is of another kind than the table says.
    #[error("program {program} is not of the kind the table says")]
    Kind {
        program: &'static str,
        #[source]
        source: ProgramError,
    },
    /// The verifier or the kernel refused the program.
    #[error("loading {program}")]
    Load {
        program: &'static str,
        #[source]
        source: ProgramError,
    },
    /// The kernel lacks the tracepoint or lays it out otherwise.
    #[error("{program}")]
    Layout {
        program: &'static str,
        #[source]
        source: tracefs::LayoutError,
    },
    /// The hook point refused it.
    #[error("attaching {program} to {target}")]
    Attach {
        program: &'static str,
        target: String,
        #[source]
        source: ProgramError,
    },
    /// Refused on request (`OBSERVER_REFUSE_PROGRAMS`): the fault a test
    /// injects to show what a kernel's refusal of this program costs.
    #[error("loading {program}: refused on request (OBSERVER_REFUSE_PROGRAMS)")]
    Refused { program: &'static str },
    /// The kernel refused a uprobe-multi link.
    #[error("attaching {program} to {target}")]
    Link {
        program: &'static str,
        target: String,
        #[source]
        source: io::Error,
    },
    /// The kernel gives uprobes no attach cookie and no program stands in
    /// for this one with this cookie (a table mismatch).
    #[error(
        "{program} reads its attach cookie ({cookie:#x}), which this kernel does not give \
         (Linux 5.15+), and no program stands in for it"
    )]
    NoVariant { program: &'static str, cookie: u64 },
    /// The function is not in the file's symbol tables.
    #[error("attaching {program}: {symbol} not found in {path}")]
    NoSymbol {
        program: &'static str,
        symbol: String,
        path: String,
    },
}

impl ProbeError {
    /// The errno under aya's error, if a syscall failed.
    pub fn os_error(&self) -> Option<i32> {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cur {
            if let Some(io) = e.downcast_ref::<io::Error>() {
                if let Some(n) = io.raw_os_error() {
                    return Some(n);
                }
            }
            cur = e.source();
        }
        None
    }

    /// What to do about it, when we know.
    pub fn remedy(&self) -> Option<&'static str> {
        match (self, self.os_error()) {
            (
                ProbeError::Attach { .. } | ProbeError::Link { .. },
                Some(libc::EPERM | libc::EACCES),
            ) => Some(
                "the kernel refused the probe for this user: run as root, or with CAP_SYS_ADMIN",
            ),
            // The verifier refuses with EACCES too; its log then says how
            // far it got (a refusal for privileges has none).
            (ProbeError::Load { .. }, Some(libc::EACCES))
                if self.verifier_log().is_some_and(|l| l.contains("processed")) =>
            {
                Some("`observer doctor --verbose` shows the verifier's log")
            }
            (ProbeError::Load { .. }, Some(libc::EPERM | libc::EACCES)) => {
                Some("needs root, or CAP_BPF and CAP_PERFMON")
            }
            _ => None,
        }
    }

    /// The verifier's log, when the kernel refused to load the program.
    pub fn verifier_log(&self) -> Option<String> {
        match self {
            ProbeError::Load {
                source: ProgramError::LoadError { verifier_log, .. },
                ..
            } => Some(verifier_log.to_string()),
            _ => None,
        }
    }
}

/// An error and its causes on one line ("a: b: c"), with the remedy.
pub fn chain(e: &ProbeError) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        // aya's LoadError prints the whole verifier log: that is for
        // `doctor --verbose`, not for one line.
        let text = match c.downcast_ref::<ProgramError>() {
            Some(ProgramError::LoadError {
                io_error,
                verifier_log,
            }) => match verifier_reason(&verifier_log.to_string()) {
                Some(why) => format!("the verifier refused it: {why}"),
                None => format!("the BPF_PROG_LOAD syscall returned {io_error}"),
            },
            _ => c.to_string(),
        };
        if !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        if matches!(
            c.downcast_ref::<ProgramError>(),
            Some(ProgramError::LoadError { .. })
        ) {
            break;
        }
        cur = c.source();
    }
    if let Some(r) = e.remedy() {
        s.push_str(" (");
        s.push_str(r);
        s.push(')');
    }
    s
}

/// The verifier's reason, short: the instruction it stopped at and its
/// message ("insn 123: unknown func bpf_get_current_pid_tgid#14"), from the
/// log's last lines (the statistics after the message left out). None when
/// the log holds no message (a refusal for privileges).
pub fn verifier_reason(log: &str) -> Option<String> {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let stats = |l: &str| {
        l.starts_with("processed ")
            || l.starts_with("verification time")
            || l.starts_with("stack depth")
            || l.starts_with("-- END PROG LOAD LOG --")
    };
    let end = lines.iter().rposition(|l| !stats(l))?;
    let message = lines[end];
    let insn = lines[..end].iter().rev().find_map(|l| {
        let (n, rest) = l.split_once(": ")?;
        (!rest.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(n)
    });
    let lacks = helper_lacked(message).map_or(String::new(), |h| format!(" ({h})"));
    Some(match insn {
        Some(n) => format!("insn {n}: {message}{lacks}"),
        None => format!("{message}{lacks}"),
    })
}

/// The kernel feature a refusal for a helper call names, for the helpers
/// whose absence older kernels show ("invalid func unknown#174").
fn helper_lacked(message: &str) -> Option<&'static str> {
    let id: u32 = message
        .strip_prefix("invalid func unknown#")
        .or_else(|| message.strip_prefix("unknown func "))
        .or_else(|| message.strip_prefix("program of this type cannot use helper "))?
        .rsplit('#')
        .next()?
        .trim()
        .parse()
        .ok()?;
    Some(match id {
        174 => "this kernel lacks bpf_get_attach_cookie: Linux 5.15+",
        14 => "this program type may not call bpf_get_current_pid_tgid before Linux 6.10",
        16 => "this program type may not call bpf_get_current_comm on this kernel",
        _ => return None,
    })
}

/// What became of one program.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProgramState {
    pub loaded: bool,
    /// Places it is attached now or was (a tracepoint: 1; a uprobe: one per
    /// library function; per-process TLS probes count their shared event).
    pub attached: u64,
    pub failures: u64,
    /// The first errors, each with its causes and remedy.
    pub errors: Vec<String>,
    /// The verifier's log when loading failed (`doctor --verbose`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verifier_log: Option<String>,
}

const ERRORS_KEPT: usize = 4;

/// Where a uprobe goes: a function of the file at `path`, by symbol or at
/// a file offset the caller resolved, with the cookie its program reads,
/// for `scope`'s processes.
#[derive(Clone, Copy, Debug)]
pub struct UprobeAt<'a> {
    pub symbol: &'a str,
    pub offset: Option<u64>,
    pub path: &'a Path,
    pub cookie: Option<u64>,
    pub scope: UProbeScope,
}

/// A uprobe attached by [`Probes::attach_uprobe`].
#[derive(Debug, PartialEq, Eq, Hash)]
pub enum UprobeLink {
    /// A uprobe-multi link (`uprobe_multi`), closed by our own fd.
    Multi(u64),
    /// aya's perf-event uprobe, where the kernel has no uprobe-multi links;
    /// with the object's program it belongs to (a stand-in's, where the
    /// kernel gives no cookies).
    Perf(&'static str, UProbeLinkId),
}

/// The eBPF object and the ledger of its programs.
pub struct Probes {
    pub ebpf: Ebpf,
    states: BTreeMap<&'static str, ProgramState>,
    /// Whether uprobes go on as uprobe-multi links (the kernel has them).
    multi: bool,
    /// The uprobe programs loaded for uprobe-multi links.
    loaded_multi: BTreeSet<&'static str>,
    /// Whether uprobes carry an attach cookie here (Linux 5.15+); without,
    /// the programs that read one are replaced by their stand-ins, one per
    /// cookie value (`programs::VARIANTS`).
    cookies: bool,
    links: HashMap<u64, uprobe_multi::Link>,
    next_link: u64,
    /// Programs to treat as refused by the kernel (a test's fault).
    refuse: BTreeSet<String>,
}

/// Names programs the observer must treat as refused by the verifier, comma
/// separated: a test shows with it that a kernel's refusal of one program
/// costs only its own feature (tests/tests/cli.rs). Never set in service.
pub const REFUSE_ENV: &str = "OBSERVER_REFUSE_PROGRAMS";

/// Set (to anything): the observer runs as on a kernel before 5.15, whose
/// uprobes carry no attach cookie, so a test on a newer kernel covers the
/// programs that stand in there. Never set in service.
pub const NO_COOKIE_ENV: &str = "OBSERVER_NO_ATTACH_COOKIE";

fn row(name: &'static str) -> Result<&'static Program, ProbeError> {
    programs::get(name).ok_or(ProbeError::NotInObject(name))
}

/// The object's program `name` as the kind `T` the table says it is.
fn typed<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, ProbeError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(ProbeError::NotInObject(name))?
        .try_into()
        .map_err(|source| ProbeError::Kind {
            program: name,
            source,
        })
}

impl Probes {
    pub fn new(ebpf: Ebpf) -> Self {
        let multi = uprobe_multi::supported();
        let cookies =
            std::env::var_os(NO_COOKIE_ENV).is_none() && super::kernel_probe::attach_cookies();
        tracing::debug!("uprobe-multi links: {multi}; attach cookies: {cookies}");
        Self {
            ebpf,
            states: BTreeMap::new(),
            multi,
            loaded_multi: BTreeSet::new(),
            cookies,
            links: HashMap::new(),
            next_link: 0,
            refuse: std::env::var(REFUSE_ENV)
                .unwrap_or_default()
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
        }
    }

    /// How uprobes are attached: "uprobe_multi" links, or "perf_event"s
    /// where the kernel has no uprobe-multi links (before 6.6).
    pub fn uprobe_mechanism(&self) -> &'static str {
        if self.multi {
            "uprobe_multi"
        } else {
            "perf_event"
        }
    }

    /// Whether uprobes carry an attach cookie here; without, per-library
    /// programs stand in for those that read one.
    pub fn attach_cookies(&self) -> bool {
        self.cookies
    }

    /// The object's program that goes on for table program `name` with
    /// `cookie`, and the cookie to give it: the program itself where the
    /// kernel gives cookies (or it reads none), else its stand-in for that
    /// cookie, given none.
    fn object(
        &self,
        name: &'static str,
        cookie: Option<u64>,
    ) -> Result<(&'static str, Option<u64>), ProbeError> {
        if self.cookies {
            return Ok((name, cookie));
        }
        let cookie = cookie.unwrap_or(0);
        programs::without_cookie(name, cookie)
            .map(|object| (object, None))
            .ok_or(ProbeError::NoVariant {
                program: name,
                cookie,
            })
    }

    /// The object's programs that table program `name` loads as here.
    fn objects(&self, name: &'static str) -> Vec<&'static str> {
        let variants: Vec<&'static str> = programs::variants_of(name).map(|v| v.name).collect();
        if self.cookies || variants.is_empty() {
            vec![name]
        } else {
            variants
        }
    }

    /// Every uprobe-multi link closed, side by side (each close waits a
    /// grace period of its own); perf-event ones are left to `detach_all`.
    pub fn close_uprobe_links(&mut self) {
        uprobe_multi::close_all(self.links.drain().map(|(_, l)| l).collect());
    }

    /// A uprobe-multi link of `name` at `offset` of `path` for one process,
    /// owned by the caller (dropping it takes the probe off); None where
    /// uprobes are perf events (the TLS manager's shared events do it).
    pub fn process_uprobe(
        &mut self,
        name: &'static str,
        path: &Path,
        offset: u64,
        cookie: u64,
        pid: u32,
    ) -> Option<Result<uprobe_multi::Link, ProbeError>> {
        if !self.multi {
            return None;
        }
        let r = self.load(name).and_then(|()| {
            let (object, cookie) = self.object(name, Some(cookie))?;
            let (fd, ret) = self.multi_program(object)?;
            let cookie = cookie.unwrap_or(0);
            uprobe_multi::attach(fd.as_fd(), path, offset, cookie, ret, Some(pid)).map_err(
                |source| ProbeError::Link {
                    program: name,
                    target: format!("pid {pid}: {}", path.display()),
                    source,
                },
            )
        });
        Some(self.note(name, r))
    }

    /// A uprobe program's fd, and whether it is a return probe.
    fn multi_program(&mut self, name: &'static str) -> Result<(&ProgramFd, bool), ProbeError> {
        let p = typed::<UProbe>(&mut self.ebpf, name)?;
        let ret = matches!(p.kind(), aya::programs::ProbeKind::Return);
        let fd = p.fd().map_err(|source| ProbeError::Load {
            program: name,
            source,
        })?;
        Ok((fd, ret))
    }

    /// Every program of the table with what became of it (untouched ones
    /// too, as not loaded).
    pub fn states(&self) -> Vec<(&'static Program, ProgramState)> {
        programs::PROGRAMS
            .iter()
            .map(|p| (p, self.states.get(p.name).cloned().unwrap_or_default()))
            .collect()
    }

    pub fn state(&self, name: &str) -> Option<&ProgramState> {
        self.states.get(name)
    }

    fn note<T>(&mut self, name: &'static str, r: Result<T, ProbeError>) -> Result<T, ProbeError> {
        let s = self.states.entry(name).or_default();
        match &r {
            Ok(_) => {}
            Err(e) => {
                s.failures += 1;
                if s.errors.len() < ERRORS_KEPT {
                    s.errors.push(chain(e));
                }
                if s.verifier_log.is_none() {
                    s.verifier_log = e.verifier_log();
                }
                tracing::debug!("{}", chain(e));
            }
        }
        r
    }

    /// Loads a program of the table (once): itself, or where the kernel
    /// gives no attach cookies the programs that stand in for it.
    pub fn load(&mut self, name: &'static str) -> Result<(), ProbeError> {
        if self.states.get(name).is_some_and(|s| s.loaded) {
            return Ok(());
        }
        let r = self
            .objects(name)
            .into_iter()
            .try_for_each(|object| self.load_inner(name, object));
        let r = self.note(name, r);
        if r.is_ok() {
            self.states.entry(name).or_default().loaded = true;
        }
        r
    }

    /// Loads the object's program `object` for table program `name`.
    fn load_inner(&mut self, name: &'static str, object: &'static str) -> Result<(), ProbeError> {
        if self.refuse.contains(name) {
            return Err(ProbeError::Refused { program: name });
        }
        let load = |source| ProbeError::Load {
            program: object,
            source,
        };
        let ebpf = &mut self.ebpf;
        match row(name)?.hook {
            Hook::TracePoint { .. } => typed::<TracePoint>(ebpf, name)?.load().map_err(load),
            Hook::RawTracePoint { .. } | Hook::Run => {
                typed::<RawTracePoint>(ebpf, name)?.load().map_err(load)
            }
            Hook::UProbe { .. } if self.loaded_multi.contains(object) => Ok(()),
            Hook::UProbe { .. } if self.multi => {
                typed::<UProbe>(ebpf, object)?.load_multi().map_err(load)?;
                self.loaded_multi.insert(object);
                Ok(())
            }
            Hook::UProbe { .. } => {
                let p = typed::<UProbe>(ebpf, object)?;
                if p.fd().is_ok() {
                    return Ok(());
                }
                p.load().map_err(load)
            }
            Hook::CgroupSkb { .. } => typed::<CgroupSkb>(ebpf, name)?.load().map_err(load),
            Hook::CgroupSockRelease => typed::<CgroupSock>(ebpf, name)?.load().map_err(load),
        }
    }

    /// Why `lib`'s programs of `feature` cannot go on: the first of them the
    /// kernel refused ("program: reason"). None when all loaded (or were
    /// never tried).
    pub fn refusal(&self, feature: programs::Feature, lib: programs::Library) -> Option<String> {
        programs::of(feature)
            .filter(|p| p.probes_library(lib))
            .find_map(|p| {
                let s = self.states.get(p.name)?;
                (!s.loaded && !s.errors.is_empty()).then(|| s.errors[0].clone())
            })
    }

    /// Loads every program of a feature; the first error, if any.
    pub fn load_feature(&mut self, feature: programs::Feature) -> Result<(), ProbeError> {
        let mut first = Ok(());
        for p in programs::of(feature) {
            if let Err(e) = self.load(p.name) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    fn attached(&mut self, name: &'static str) {
        self.states.entry(name).or_default().attached += 1;
    }

    /// A tracepoint program: its layout checked against tracefs (or, raw
    /// and without tracefs, its prototype against BTF), loaded, attached.
    pub fn attach_tracepoint(
        &mut self,
        name: &'static str,
        described: &Described,
    ) -> Result<(), ProbeError> {
        let r = self.attach_tracepoint_inner(name, described);
        let r = self.note(name, r);
        if r.is_ok() {
            self.attached(name);
        }
        r
    }

    fn attach_tracepoint_inner(
        &mut self,
        name: &'static str,
        described: &Described,
    ) -> Result<(), ProbeError> {
        let hook = row(name)?.hook;
        let (Hook::TracePoint { layout } | Hook::RawTracePoint { layout }) = hook else {
            return Err(ProbeError::NotInObject(name));
        };
        let raw = matches!(hook, Hook::RawTracePoint { .. });
        described
            .check(&layout, raw)
            .map_err(|source| ProbeError::Layout {
                program: name,
                source,
            })?;
        self.load(name)?;
        let attach = |source| ProbeError::Attach {
            program: name,
            target: hook.target(),
            source,
        };
        match hook {
            Hook::TracePoint { .. } => {
                typed::<TracePoint>(&mut self.ebpf, name)?
                    .attach(layout.category, layout.name)
                    .map_err(attach)?;
            }
            _ => {
                typed::<RawTracePoint>(&mut self.ebpf, name)?
                    .attach(layout.name)
                    .map_err(attach)?;
            }
        }
        Ok(())
    }

    /// A uprobe program on a function of a file (see [`UprobeAt`]).
    pub fn attach_uprobe(
        &mut self,
        name: &'static str,
        at: &UprobeAt<'_>,
    ) -> Result<UprobeLink, ProbeError> {
        let r = self.load(name).and_then(|()| {
            let (object, cookie) = self.object(name, at.cookie)?;
            let at = UprobeAt { cookie, ..*at };
            if self.loaded_multi.contains(object) {
                self.link_uprobe(object, &at)
            } else {
                self.perf_uprobe(object, &at)
            }
        });
        let r = self.note(name, r);
        if r.is_ok() {
            self.attached(name);
        }
        r
    }

    fn link_uprobe(
        &mut self,
        name: &'static str,
        at: &UprobeAt<'_>,
    ) -> Result<UprobeLink, ProbeError> {
        let UprobeAt {
            symbol,
            offset,
            path,
            cookie,
            scope,
        } = *at;
        let offset = match offset {
            Some(o) => o,
            None => elf::symbol_offset(path, symbol).ok_or_else(|| ProbeError::NoSymbol {
                program: name,
                symbol: symbol.to_owned(),
                path: path.display().to_string(),
            })?,
        };
        let pid = match scope {
            UProbeScope::AllProcesses => None,
            UProbeScope::CallingProcess => Some(std::process::id()),
            UProbeScope::OneProcess(pid) => Some(pid.get()),
        };
        let (fd, ret) = self.multi_program(name)?;
        let link = uprobe_multi::attach(fd.as_fd(), path, offset, cookie.unwrap_or(0), ret, pid)
            .map_err(|source| ProbeError::Link {
                program: name,
                target: format!("{symbol} in {}", path.display()),
                source,
            })?;
        self.next_link += 1;
        self.links.insert(self.next_link, link);
        Ok(UprobeLink::Multi(self.next_link))
    }

    fn perf_uprobe(
        &mut self,
        name: &'static str,
        at: &UprobeAt<'_>,
    ) -> Result<UprobeLink, ProbeError> {
        let (symbol, path) = (at.symbol, at.path);
        let (offset, cookie, scope) = (at.offset, at.cookie, at.scope);
        let p = typed::<UProbe>(&mut self.ebpf, name)?;
        let location = match offset {
            Some(o) => UProbeAttachLocation::AbsoluteOffset(o),
            None => UProbeAttachLocation::Symbol(symbol),
        };
        p.attach(UProbeAttachPoint { location, cookie }, path, scope)
            .map(|link| UprobeLink::Perf(name, link))
            .map_err(|source| ProbeError::Attach {
                program: name,
                target: format!("{symbol} in {}", path.display()),
                source,
            })
    }

    /// Takes off uprobes attached by `attach_uprobe` before it returns: the
    /// uprobe-multi links side by side (one grace period in all, however
    /// long the closer's queue is), a perf-event one as `detach_uprobe`
    /// does. For probes a busy process traps on at every call.
    pub fn detach_uprobes_now(&mut self, links: Vec<(&'static str, UprobeLink)>) {
        let mut now = Vec::new();
        for (name, link) in links {
            match link {
                UprobeLink::Multi(id) => {
                    if let Some(l) = self.links.remove(&id) {
                        now.push(l);
                        self.one_detached(name);
                    }
                }
                perf @ UprobeLink::Perf(..) => self.detach_uprobe(name, perf),
            }
        }
        uprobe_multi::close_now(now);
    }

    /// Takes off a uprobe attached by `attach_uprobe`: a uprobe-multi link
    /// on the closer's thread (its close waits a grace period); a perf-event
    /// one here (its close waits grace periods under the kernel's
    /// trace-event lock).
    pub fn detach_uprobe(&mut self, name: &'static str, link: UprobeLink) {
        let done = match link {
            // Dropped: closed on the closer's thread.
            UprobeLink::Multi(id) => self.links.remove(&id).is_some(),
            UprobeLink::Perf(object, link) => {
                let Ok(p) = typed::<UProbe>(&mut self.ebpf, object) else {
                    return;
                };
                match p.detach(link) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::debug!("detaching {name}: {e}");
                        false
                    }
                }
            }
        };
        if done {
            self.one_detached(name);
        }
    }

    /// One link of `name` fewer in its attached count.
    fn one_detached(&mut self, name: &'static str) {
        let s = self.states.entry(name).or_default();
        s.attached = s.attached.saturating_sub(1);
    }

    /// A cgroup program of the table on the cgroup directory `dir`, once:
    /// a program that serves two features is asked for by both.
    pub fn attach_cgroup(
        &mut self,
        name: &'static str,
        dir: &std::fs::File,
        shown: &Path,
    ) -> Result<(), ProbeError> {
        if self.states.get(name).is_some_and(|s| s.attached > 0) {
            return Ok(());
        }
        let r = self.load(name).and_then(|()| {
            let hook = row(name)?.hook;
            let attach = |source| ProbeError::Attach {
                program: name,
                target: format!("{} on {}", hook.target(), shown.display()),
                source,
            };
            // aya attaches them as bpf links (kernel 5.7+), which always run
            // beside other programs on the cgroup and refuse ALLOW_MULTI.
            match hook {
                Hook::CgroupSkb { direction } => {
                    let way = match direction {
                        Direction::Egress => CgroupSkbAttachType::Egress,
                        Direction::Ingress => CgroupSkbAttachType::Ingress,
                    };
                    typed::<CgroupSkb>(&mut self.ebpf, name)?
                        .attach(dir.as_fd(), way, CgroupAttachMode::Single)
                        .map_err(attach)?;
                }
                _ => {
                    typed::<CgroupSock>(&mut self.ebpf, name)?
                        .attach(dir.as_fd(), CgroupAttachMode::Single)
                        .map_err(attach)?;
                }
            }
            Ok(())
        });
        let r = self.note(name, r);
        if r.is_ok() {
            self.attached(name);
        }
        r
    }

    /// The loaded uprobe program's fd that goes on for table program `name`
    /// with `cookie`, and the cookie to attach it with (none where the
    /// kernel gives none: a stand-in goes on), for attachments made outside
    /// aya (the TLS manager's shared uprobe events).
    pub fn uprobe_fd(
        &mut self,
        name: &'static str,
        cookie: u64,
    ) -> Result<(&ProgramFd, Option<u64>), ProbeError> {
        self.load(name)?;
        let (object, cookie) = self.object(name, Some(cookie))?;
        let fd = typed::<UProbe>(&mut self.ebpf, object)?
            .fd()
            .map_err(|source| ProbeError::Load {
                program: object,
                source,
            })?;
        Ok((fd, cookie))
    }

    /// Records the result of an attachment made outside aya. Any error
    /// type will do: the state keeps its text, which doctor prints.
    pub fn note_external(&mut self, name: &'static str, r: Result<(), impl std::fmt::Display>) {
        match r {
            Ok(()) => self.attached(name),
            Err(e) => {
                let s = self.states.entry(name).or_default();
                s.failures += 1;
                if s.errors.len() < ERRORS_KEPT {
                    s.errors.push(e.to_string());
                }
            }
        }
    }
}

impl Drop for Probes {
    /// Links closed side by side: dropped one by one, each would wait a
    /// grace period of its own.
    fn drop(&mut self) {
        self.close_uprobe_links();
    }
}

#[cfg(test)]
mod tests {
    use super::verifier_reason;

    #[test]
    fn the_verifier_reason_is_the_instruction_and_the_message() {
        // As Debian 12's 6.1 refused a packet program.
        let log = "0: R1=ctx(off=0,imm=0) R10=fp0\n\
                   ; let pid_tgid = bpf_get_current_pid_tgid();\n\
                   57: (85) call bpf_get_current_pid_tgid#14\n\
                   unknown func bpf_get_current_pid_tgid#14\n\
                   processed 57 insns (limit 1000000) max_states_per_insn 0 total_states 3\n";
        assert_eq!(
            verifier_reason(log).as_deref(),
            Some(
                "insn 57: unknown func bpf_get_current_pid_tgid#14 (this program type may not call \
                 bpf_get_current_pid_tgid before Linux 6.10)"
            )
        );
        let log = "123: (85) call bpf_probe_read_user#112\n\
                   R2 min value is negative, either use unsigned or 'var &= const'\n\
                   processed 9 insns (limit 1000000)\n\
                   verification time 12 usec\n\
                   stack depth 0\n";
        assert_eq!(
            verifier_reason(log).as_deref(),
            Some("insn 123: R2 min value is negative, either use unsigned or 'var &= const'")
        );
        assert_eq!(
            verifier_reason("2: (85) call unknown#174\ninvalid func unknown#174\n").as_deref(),
            Some("insn 2: invalid func unknown#174 (this kernel lacks bpf_get_attach_cookie: Linux 5.15+)")
        );
        assert_eq!(verifier_reason("").as_deref(), None);
        assert_eq!(verifier_reason("\n  \n").as_deref(), None);
    }
}
