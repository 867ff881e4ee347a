//! Finds the TLS libraries processes use and keeps the uprobes on them.
//!
//! Every probe, handshake and plaintext read/write alike, goes on every TLS
//! file for all processes: the kernel plants them in any process that maps
//! the file, now or later, so a process is followed from its first byte
//! (an attach made after the process starts loses the race with a local
//! handshake: it waits an RCU grace period, 13-21 ms, the handshake 2-3 ms).
//!
//! Plaintext calls cost about 5 us each in a VM, a trap that an all-process
//! probe costs every process mapping the file. Under the `auto` policy a
//! process whose call rate says they cost more than they tell is turned off
//! in the kernel at once (the probes return after one lookup), and the files
//! it maps go per process: the processes followed on them get probes of
//! their own (they are running: no race), then the all-process ones come
//! off, so the busy process traps no more. While a file is per process, a
//! process gets its probes when it starts TLS (its first TLS context or
//! session), and loses the start of a connection faster than that attach.
//! When the last busy process on it exits or execs, the file goes back to
//! all processes. A Go executable's read/write probes (`tls::go`) are
//! handled the same way: a busy Go server stops trapping, the other
//! processes running the same file keep their capture.

use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
    sync::{
        mpsc::{Receiver, RecvTimeoutError, SyncSender},
        Arc,
    },
    time::{Duration, Instant},
};

use aya::maps::{Array as BpfArray, HashMap as BpfHashMap, MapData};
use observer_common::{
    hold::{HoldEvent, HOLD_MAPPING},
    tls::{library, TlsProc, TLS_PROCS_MAP, TLS_WAKE_MAP},
};

use super::{
    command::Command,
    go::{listed, GoConsidered, GoFiles},
    hold::{resume, Holds},
    report::{Policy, Settings, TlsFileReport, TlsReport},
    rustls::{self, RustlsConsidered},
    site::{CompiledIn, ProbeSite},
    uprobe_events::{EventId, UprobeEvents},
};
use crate::{
    ebpf::{chain, uprobe_multi, Probes, UprobeLink},
    libraries::{
        discovery,
        elf::{classify, TlsImage},
        pinned::{reachable, Pinned},
        procmaps::{executable_files, FileId, Mapping},
        system_libc,
    },
    programs::{self, Feature, Library, UprobeSite},
    tables::Tables,
};

/// Where the discovery hands the C libraries it finds besides the system's
/// (musl, a container's glibc): the DNS resolver probes, set by the owner.
pub type OnCLibrary = Box<dyn FnMut(&mut Probes, &Path, &str) + Send>;

struct TlsFile {
    /// Where it was found: shown, and looked at for whether it is still on
    /// disk.
    path: PathBuf,
    /// Every probe goes on through it (see `Pinned`).
    pinned: Pinned,
    /// Its plaintext uprobes (placed for all processes or per process).
    plaintext_sites: Vec<ProbeSite>,
    /// A program's executable (Go), not a library: while it is per
    /// process, its new processes are held at exec for their probes.
    executable: bool,
    report: usize,
    /// A library's handshake probes, for all processes (a Go executable's
    /// are GoFiles').
    handshake: Vec<(&'static str, UprobeLink)>,
    /// The all-process plaintext probes (empty: the file is per process).
    all: Vec<(&'static str, UprobeLink)>,
    /// The busy processes that made it per process.
    busy: HashSet<u32>,
    /// The per-process plaintext hooks' shared uprobe events, made at the
    /// first process that needs them.
    plaintext: Option<Vec<EventId>>,
    /// A Go executable's index in the offsets map.
    go_index: Option<u32>,
}

/// A process whose plaintext calls are captured, its rate watched.
struct Followed {
    /// Its own probes on the files that are per process, one per hook
    /// (dropping them takes the probes off).
    probes: HashMap<FileId, Vec<ProcessProbe>>,
    /// The process's plaintext call count, and when it was read.
    last_calls: u64,
    last_at: Instant,
}

/// One of a process's own probes.
enum ProcessProbe {
    /// A uprobe-multi link for the process.
    #[expect(dead_code, reason = "held to be dropped")]
    Link(uprobe_multi::Link),
    /// A perf event on a shared uprobe event (kernels before 6.6).
    #[expect(dead_code, reason = "held to be dropped")]
    Event(OwnedFd),
}

pub struct TlsProbes {
    settings: Settings,
    proc_root: PathBuf,
    /// Every file looked at; None: no TLS library in it.
    files: HashMap<FileId, Option<TlsFile>>,
    /// Where each file without TLS was found (a C library's excepted: its
    /// resolver probes stay): one that no process maps and that is no
    /// longer there is forgotten, so files that come and go (programs
    /// built and run once) do not pile up.
    others: HashMap<FileId, PathBuf>,
    procs: HashMap<u32, Followed>,
    high_rate: HashSet<u32>,
    scans: Vec<(Instant, u32)>,
    procs_map: Option<BpfHashMap<MapData, u32, TlsProc>>,
    /// Set while a file is per process (see `TLS_WAKE_MAP`).
    wake_map: Option<BpfArray<MapData, u32>>,
    last_rate_check: Instant,
    last_full_scan: Instant,
    /// Shared uprobe events behind the per-process probes.
    events: UprobeEvents,
    /// The C library the DNS probes are on already.
    system_libc: Option<FileId>,
    on_c_library: OnCLibrary,
    go: GoFiles,
    /// Holding new executables at exec, while the manager runs.
    holds: Option<Holds>,
    /// Processes of a per-process executable given their probes while held
    /// at exec: their exec is handled already.
    probed_at_exec: HashSet<u32>,
    /// Where its tables' entries are shown (`/metrics`, the summary), and
    /// when they were last stored.
    tables: Option<(Arc<Tables>, Instant)>,
    pub report: TlsReport,
}

/// How often call rates are checked: a busy server (nginx at 90k requests/s
/// makes ~180k calls/s) pays ~5 us per call until its probes come off, so
/// the check is frequent; the count is one map lookup per process.
const RATE_CHECK: Duration = Duration::from_millis(200);
const FULL_SCAN: Duration = Duration::from_secs(10);
/// How often the tables' entries are stored for `/metrics`.
const SIZES_EVERY: Duration = Duration::from_secs(1);

/// Calls per second over `span`, once `span` is a whole check period (None
/// before): a process followed a few ms ago has its first request's few
/// calls behind it, which over those ms would read as hundreds a second.
fn call_rate(calls: u64, span: Duration) -> Option<f64> {
    (span >= RATE_CHECK).then(|| calls as f64 / span.as_secs_f64())
}
/// After an exec the loader maps the libraries within milliseconds, and
/// runtimes load more later; look again.
const EXEC_SCANS: [Duration; 2] = [Duration::from_millis(50), Duration::from_secs(1)];

/// The program table's name for a TLS library's kind.
fn kind(image: &TlsImage) -> Library {
    if image.library == library::GNUTLS {
        Library::GnuTls
    } else {
        Library::OpenSsl
    }
}

/// The table's uprobes of `feature` found in a TLS library's image, the
/// library's kind their cookie.
fn sites(image: &TlsImage, feature: Feature) -> Vec<ProbeSite> {
    programs::uprobe_sites(feature, kind(image))
        .into_iter()
        .filter_map(|hook: UprobeSite| {
            Some(ProbeSite {
                program: hook.program,
                symbol: hook.symbol,
                offset: image.offset(hook.symbol)?,
                cookie: u64::from(image.library),
                ret: hook.ret,
            })
        })
        .collect()
}

impl TlsProbes {
    /// Takes the process maps; `programs`: whether the TLS programs loaded
    /// (the program table's outcome), else why not. Never fails: what
    /// cannot be done is reported.
    pub fn new(
        probes: &mut Probes,
        settings: Settings,
        programs: Result<(), &str>,
        proc_root: &Path,
        tracefs: Option<&Path>,
        on_c_library: OnCLibrary,
    ) -> Self {
        let report = TlsReport {
            plaintext_policy: Some(settings.policy),
            plaintext_max_rate: settings.max_rate,
            programs_error: programs.err().map(str::to_owned),
            ..TlsReport::default()
        };
        let procs_map = probes
            .ebpf
            .take_map(TLS_PROCS_MAP)
            .and_then(|m| BpfHashMap::try_from(m).ok());
        let wake_map = probes
            .ebpf
            .take_map(TLS_WAKE_MAP)
            .and_then(|m| BpfArray::try_from(m).ok());
        let now = Instant::now();
        Self {
            go: GoFiles::new(probes),
            holds: None,
            probed_at_exec: HashSet::new(),
            tables: None,
            events: UprobeEvents::new(tracefs),
            settings,
            proc_root: proc_root.to_owned(),
            files: HashMap::new(),
            others: HashMap::new(),
            procs: HashMap::new(),
            high_rate: HashSet::new(),
            scans: Vec::new(),
            procs_map,
            wake_map,
            last_rate_check: now,
            last_full_scan: now,
            on_c_library,
            system_libc: system_libc().and_then(|p| {
                use std::os::unix::fs::MetadataExt;
                let md = std::fs::metadata(p).ok()?;
                Some((md.dev(), md.ino()))
            }),
            report,
        }
    }

    pub fn usable(&self) -> bool {
        self.report.programs_error.is_none()
    }

    /// The system's library directories and every running process's mappings.
    pub fn discover(&mut self, probes: &mut Probes) {
        for path in discovery::system_files() {
            self.consider_file(probes, &path);
        }
        self.scan_all(probes);
    }

    fn scan_all(&mut self, probes: &mut Probes) {
        let Ok(pids) = discovery::running_pids(&self.proc_root, std::process::id()) else {
            return;
        };
        let mut mapped = HashSet::new();
        for pid in pids {
            mapped.extend(self.scan_files(probes, pid).into_iter().map(|m| m.id));
        }
        self.release_unreachable(probes, &mapped);
        self.forget_gone_others(&mapped);
        // Processes whose exit we missed are not followed.
        let gone: Vec<u32> = self
            .procs
            .keys()
            .copied()
            .filter(|p| !self.proc_root.join(p.to_string()).exists())
            .collect();
        for pid in gone {
            self.forget(probes, pid);
        }
        self.last_full_scan = Instant::now();
    }

    /// A library replaced or removed on disk (a package upgrade renames a
    /// new file over the old path) stays probed while a process maps the old
    /// one; once none does (`mapped`: every process's TLS files now) and our
    /// path no longer reaches it, its probes come off, so no probe outlives
    /// its file (each also holds the deleted file's inode). A process that
    /// maps it again gets it considered afresh.
    fn release_unreachable(&mut self, probes: &mut Probes, mapped: &HashSet<FileId>) {
        let gone: Vec<FileId> = self
            .files
            .iter()
            .filter(|(id, f)| {
                f.as_ref()
                    .is_some_and(|f| !mapped.contains(*id) && !same_file(&f.path, **id))
            })
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            let Some(Some(mut file)) = self.files.remove(&id) else {
                continue;
            };
            for f in self.procs.values_mut() {
                f.probes.remove(&id);
            }
            let mut links = std::mem::take(&mut file.handshake);
            links.append(&mut file.all);
            probes.detach_uprobes_now(links);
            if let Some(index) = file.go_index {
                self.go.release(index);
            }
            // Its inode number may come back as another file's.
            if let Some(h) = &mut self.holds {
                h.forget_file(id);
            }
            if let Some(r) = self.report.files.get_mut(file.report) {
                r.released = true;
            }
            self.report.files_released += 1;
            tracing::info!(
                "TLS: {} is no longer on disk nor mapped: its probes are off",
                file.path.display()
            );
        }
    }

    /// Files without TLS that no process maps (`mapped`: every file mapped
    /// now) and that their path no longer reaches are forgotten (see
    /// `others`).
    fn forget_gone_others(&mut self, mapped: &HashSet<FileId>) {
        let gone: Vec<FileId> = self
            .others
            .iter()
            .filter(|(id, path)| !mapped.contains(*id) && !same_file(path, **id))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.others.remove(&id);
            self.files.remove(&id);
            if let Some(h) = &mut self.holds {
                h.forget_file(id);
            }
        }
    }

    /// Remembers a file without TLS (not looked at again).
    fn not_tls(&mut self, id: FileId, path: &Path) {
        self.files.insert(id, None);
        self.others.insert(id, path.to_owned());
    }

    /// Looks at the files `pid` maps (a new one gets its probes); returns
    /// its TLS files.
    fn scan(&mut self, probes: &mut Probes, pid: u32) -> Vec<Mapping> {
        let mut maps = self.scan_files(probes, pid);
        maps.retain(|m| matches!(self.files.get(&m.id), Some(Some(_))));
        maps
    }

    /// Looks at the files `pid` maps (a new one gets its probes); returns
    /// them all.
    fn scan_files(&mut self, probes: &mut Probes, pid: u32) -> Vec<Mapping> {
        let maps = match executable_files(&self.proc_root, pid) {
            Ok(m) => m,
            Err(e) => {
                // A process that just exited is not worth counting.
                if e.kind() != std::io::ErrorKind::NotFound {
                    self.report.maps_unreadable += 1;
                }
                return Vec::new();
            }
        };
        for m in &maps {
            if self.files.contains_key(&m.id) {
                continue;
            }
            let Some((pinned, via)) = reachable(&self.proc_root, pid, m) else {
                continue;
            };
            // A path in our own namespace outlives the process.
            let path = if same_file(Path::new(&m.path), m.id) {
                PathBuf::from(&m.path)
            } else {
                via
            };
            self.consider(probes, pinned, &path, &m.path);
        }
        maps
    }

    /// A file of this host's: the real one, not the symlinks to it.
    fn consider_file(&mut self, probes: &mut Probes, link: &Path) {
        if let Some((id, path)) = discovery::host_file(link) {
            if let Some(pinned) = Pinned::open_if(&path, id) {
                self.consider(probes, pinned, &path, &path.display().to_string());
            }
        }
    }

    /// Classifies a file once; a TLS one gets its all-process probes.
    /// `path`: where it was found, kept (see `TlsFile`).
    fn consider(&mut self, probes: &mut Probes, pinned: Pinned, path: &Path, shown: &str) {
        let id = pinned.id();
        if self.files.contains_key(&id) {
            return;
        }
        if let Some(h) = &mut self.holds {
            h.know_file(id);
        }
        let image = match classify(&pinned.path()) {
            Ok(img) => {
                if img.resolver && Some(id) != self.system_libc {
                    (self.on_c_library)(probes, &pinned.path(), shown);
                }
                match img.tls {
                    Some(tls) if self.usable() => tls,
                    None if self.usable() => {
                        self.consider_go(probes, pinned, path, shown);
                        if img.resolver {
                            // Its resolver probes stay: never forgotten.
                            self.others.remove(&id);
                        }
                        return;
                    }
                    // The TLS programs did not load: nothing to probe.
                    _ if img.resolver => {
                        self.files.insert(id, None);
                        return;
                    }
                    _ => {
                        self.not_tls(id, path);
                        return;
                    }
                }
            }
            Err(e) => {
                tracing::debug!("{e}");
                self.report.files_unreadable += 1;
                self.not_tls(id, path);
                return;
            }
        };
        let mut report = TlsFileReport::new(shown, image.library, id);
        if let Some(why) = probes.refusal(Feature::TlsHandshakes, kind(&image)) {
            // Its library's programs were refused: nothing of it can go on
            // (the other libraries' can).
            report.errors.push(why);
            self.report.files.push(report);
            self.files.insert(id, None);
            return;
        }
        let mut handshake = Vec::new();
        for site in sites(&image, Feature::TlsHandshakes) {
            match site.attach_all(probes, &pinned.path()) {
                Ok(link) => {
                    report.probes += 1;
                    handshake.push((site.program, link));
                }
                Err(e) => {
                    self.report.attach_errors += 1;
                    report.errors.push(chain(&e));
                }
            }
        }
        tracing::info!(
            "TLS: {} ({}) probed, {} probes",
            report.path,
            report.library,
            report.probes
        );
        self.report.files.push(report);
        let plaintext_sites = match probes.refusal(Feature::TlsPlaintext, kind(&image)) {
            None => sites(&image, Feature::TlsPlaintext),
            Some(_) => Vec::new(),
        };
        self.add_file(probes, pinned, path, plaintext_sites, false);
        if let Some(Some(file)) = self.files.get_mut(&id) {
            file.handshake = handshake;
        }
    }

    /// A TLS file whose handshake probes are placed and reported (the last
    /// report): its plaintext probes go on for all processes.
    fn add_file(
        &mut self,
        probes: &mut Probes,
        pinned: Pinned,
        path: &Path,
        plaintext_sites: Vec<ProbeSite>,
        executable: bool,
    ) {
        let id = pinned.id();
        let mut file = TlsFile {
            path: path.to_owned(),
            pinned,
            plaintext_sites,
            executable,
            report: self.report.files.len() - 1,
            handshake: Vec::new(),
            all: Vec::new(),
            busy: HashSet::new(),
            plaintext: None,
            go_index: None,
        };
        if self.settings.policy != Policy::Off {
            self.attach_all(probes, &mut file);
        }
        self.files.insert(id, Some(file));
    }

    /// A Go executable gets its crypto/tls probes, or the report says why
    /// not; its plaintext probes are kept like a library's.
    fn consider_go(&mut self, probes: &mut Probes, pinned: Pinned, path: &Path, shown: &str) {
        let Some(GoConsidered {
            report: mut go,
            compiled,
        }) = self.go.consider(probes, pinned.id(), &pinned.path(), shown)
        else {
            self.consider_rustls(probes, pinned, path, shown);
            return;
        };
        go.probes += self.add_executable(probes, pinned, path, compiled);
        if !listed(&mut self.report.go_executables, go) {
            self.report.go_executables_unlisted += 1;
        }
    }

    /// A Rust executable with rustls gets its probes, or the report says
    /// why not; its plaintext probes are kept like a Go executable's. The
    /// observer's own (it carries rustls for OTLP) is left alone.
    fn consider_rustls(&mut self, probes: &mut Probes, pinned: Pinned, path: &Path, shown: &str) {
        let id = pinned.id();
        let considered = if Some(id) == own_executable() {
            None
        } else {
            rustls::consider(probes, id, &pinned.path(), shown)
        };
        let Some(RustlsConsidered {
            report: mut found,
            compiled,
        }) = considered
        else {
            self.not_tls(id, path);
            return;
        };
        found.probes += self.add_executable(probes, pinned, path, compiled);
        if !listed(&mut self.report.rustls_executables, found) {
            self.report.rustls_executables_unlisted += 1;
        }
    }

    /// An executable whose TLS is compiled in (Go, rustls), its handshake
    /// probes placed: its file report, and its plaintext probes kept like a
    /// library's. Returns the plaintext probes placed.
    fn add_executable(
        &mut self,
        probes: &mut Probes,
        pinned: Pinned,
        path: &Path,
        compiled: CompiledIn,
    ) -> usize {
        let id = pinned.id();
        let Some(file) = compiled.file else {
            self.not_tls(id, path);
            return 0;
        };
        self.report.attach_errors += file.errors.len() as u64;
        self.report.files.push(file);
        // Its file report is the last one.
        self.add_file(probes, pinned, path, compiled.plaintext, true);
        let placed = match self.files.get_mut(&id) {
            Some(Some(f)) => {
                f.handshake = compiled.handshake;
                f.go_index = compiled.go_index;
                f.all.len()
            }
            _ => 0,
        };
        if let Some(r) = self.report.files.last_mut() {
            r.probes += placed;
        }
        placed
    }

    /// The plaintext probes on `file` for all processes.
    fn attach_all(&mut self, probes: &mut Probes, file: &mut TlsFile) {
        for site in &file.plaintext_sites {
            match site.attach_all(probes, &file.pinned.path()) {
                Ok(link) => file.all.push((site.program, link)),
                Err(e) => self.file_error(file.report, chain(&e)),
            }
        }
        if let Some(r) = self.report.files.get_mut(file.report) {
            r.per_process = false;
        }
    }

    fn file_error(&mut self, idx: usize, e: String) {
        self.report.attach_errors += 1;
        if let Some(r) = self.report.files.get_mut(idx) {
            if r.errors.len() < 8 {
                r.errors.push(e);
            }
        }
    }

    pub fn handle(&mut self, probes: &mut Probes, cmd: Command) {
        match cmd {
            Command::TlsProcess(pid) => {
                tracing::debug!("TLS: pid {pid} started TLS");
                if self.settings.policy == Policy::Auto
                    && !self.procs.contains_key(&pid)
                    && !self.high_rate.contains(&pid)
                {
                    self.follow(probes, pid);
                }
            }
            Command::Exec(pid) => {
                tracing::debug!("TLS: pid {pid} exec");
                if self.probed_at_exec.remove(&pid) {
                    return;
                }
                self.forget(probes, pid);
                // Right after exec only the executable (and the loader) are
                // mapped: one that carries its own TLS library (Node.js)
                // gets its probes now, before it runs far; runtimes load
                // more later, looked at again.
                let carried = self.scan(probes, pid);
                if !carried.is_empty() && self.settings.policy == Policy::Auto {
                    self.follow(probes, pid);
                }
                let now = Instant::now();
                self.scans
                    .extend(EXEC_SCANS.iter().map(|d| (now + *d, pid)));
            }
            Command::Exit(pid) => self.forget(probes, pid),
            Command::Held(ev) => self.on_held(probes, ev),
            Command::Busy(pid, calls) => {
                if self.procs.contains_key(&pid) {
                    tracing::info!(
                        "TLS: pid {pid} made {calls} plaintext calls within 50 ms; its TLS times come from the socket now"
                    );
                    self.fall_back(probes, pid);
                }
            }
            Command::Stop => {}
        }
    }

    /// A process stopped at exec: its executable is looked at (a Go one
    /// gets its probes) and remembered in the kernel, then it runs on. One
    /// stopped at an mmap: its files are (the new library among them).
    fn on_held(&mut self, probes: &mut Probes, ev: HoldEvent) {
        if ev.kind == HOLD_MAPPING {
            self.on_held_mapping(probes, ev);
        } else {
            self.on_held_exec(probes, ev);
        }
        resume(ev.pid);
        let held_us = crate::clock::monotonic_ns().saturating_sub(ev.ts_ns) / 1000;
        let r = &mut self.report.exec_hold;
        r.held += 1;
        r.total_us += held_us;
        r.max_us = r.max_us.max(held_us);
        tracing::debug!("hold: pid {} held {held_us} us", ev.pid);
    }

    /// A library mapped while the process runs: a TLS one gets its probes
    /// for every process, and this one's own while it is followed.
    fn on_held_mapping(&mut self, probes: &mut Probes, ev: HoldEvent) {
        self.report.exec_hold.held_mappings += 1;
        let tls = self.scan(probes, ev.pid);
        if self.procs.contains_key(&ev.pid) {
            for m in tls {
                if matches!(self.files.get(&m.id), Some(Some(f)) if f.all.is_empty()) {
                    self.attach_process(probes, ev.pid, &m);
                }
            }
        }
        // Known whatever became of it (a file that could not be read is not
        // worth a stop at every mapping).
        if let Some(h) = &mut self.holds {
            h.know(ev.exe);
        }
    }

    fn on_held_exec(&mut self, probes: &mut Probes, ev: HoldEvent) {
        let exe = self.proc_root.join(ev.pid.to_string()).join("exe");
        let mut known = true;
        if let Ok(pinned) = Pinned::open(&exe) {
            let id = pinned.id();
            if self.is_per_process(id) {
                // A busy process runs this Go executable: this one gets
                // probes of its own before it runs, and the next is held
                // too.
                known = false;
                self.forget(probes, ev.pid);
                if self.settings.policy == Policy::Auto {
                    self.follow(probes, ev.pid);
                    self.probed_at_exec.insert(ev.pid);
                }
            }
            let shown = std::fs::read_link(&exe)
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            // A path in our own namespace outlives the process.
            let path = if same_file(Path::new(&shown), id) {
                PathBuf::from(&shown)
            } else {
                exe
            };
            self.consider(probes, pinned, &path, &shown);
        }
        if let Some(h) = self.holds.as_mut().filter(|_| known) {
            h.know(ev.exe);
        }
    }

    /// Starts holding new executables at exec (they report to `tx`, the
    /// sender of the channel `run` reads), with every file looked at so far
    /// known to the kernel. Before `ready`: a program started after it is
    /// held.
    pub fn start_holds(&mut self, probes: &mut Probes, tx: SyncSender<Command>) {
        let r = &mut self.report.exec_hold;
        if !self.settings.hold_execs {
            r.off_reason = Some("--exec-hold off".into());
            return;
        }
        if self.report.programs_error.is_some() {
            r.off_reason = Some("the TLS programs did not load".into());
            return;
        }
        r.resumed_at_start = super::hold::resume_left_behind(&self.proc_root);
        match Holds::start(probes, tx) {
            Ok(mut h) => {
                for id in self.files.keys() {
                    h.know_file(*id);
                }
                h.beat();
                r.on = true;
                self.holds = Some(h);
            }
            Err(e) => {
                tracing::warn!("new executables are not held at exec: {e}");
                r.off_reason = Some(e.to_string());
            }
        }
    }

    /// Holding ends before the probes go; nobody is left stopped.
    fn stop_holds(&mut self, rx: &Receiver<Command>) {
        if let Some(h) = self.holds.take() {
            h.stop();
        }
        while let Ok(cmd) = rx.try_recv() {
            if let Command::Held(ev) = cmd {
                resume(ev.pid);
            }
        }
    }

    /// A process that exits or becomes another program starts afresh (its
    /// kernel entry goes, and with it any "off"); a file it kept per
    /// process goes back to all processes.
    fn forget(&mut self, probes: &mut Probes, pid: u32) {
        self.probed_at_exec.remove(&pid);
        if self.procs.remove(&pid).is_some() {
            self.report.plaintext_processes = self.procs.len();
        }
        if self.high_rate.remove(&pid) {
            let freed: Vec<FileId> = self
                .files
                .iter_mut()
                .filter_map(|(id, f)| {
                    let f = f.as_mut()?;
                    (f.busy.remove(&pid) && f.busy.is_empty()).then_some(*id)
                })
                .collect();
            for id in freed {
                self.make_all_processes(probes, id);
            }
        }
        if let Some(map) = &mut self.procs_map {
            let _ = map.remove(&pid);
        }
    }

    /// A file whose plaintext probes are per process now (a busy process
    /// maps it).
    fn is_per_process(&self, id: FileId) -> bool {
        matches!(self.files.get(&id), Some(Some(f)) if f.all.is_empty() && !f.busy.is_empty())
    }

    /// A process began TLS: its rate is watched from now, and on the files
    /// that are per process it gets probes of its own.
    fn follow(&mut self, probes: &mut Probes, pid: u32) {
        let last_calls = self.calls(pid);
        self.procs.insert(
            pid,
            Followed {
                probes: HashMap::new(),
                last_calls,
                last_at: Instant::now(),
            },
        );
        for m in self.scan(probes, pid) {
            if matches!(self.files.get(&m.id), Some(Some(f)) if f.all.is_empty()) {
                self.attach_process(probes, pid, &m);
            }
        }
        self.report.plaintext_attached_total += 1;
        self.report.plaintext_processes = self.procs.len();
    }

    /// A busy process's plaintext capture is turned off in the kernel
    /// (until it execs or exits), and the files it maps go per process so
    /// that it traps no more.
    fn fall_back(&mut self, probes: &mut Probes, pid: u32) {
        self.procs.remove(&pid);
        self.report.plaintext_processes = self.procs.len();
        self.high_rate.insert(pid);
        self.report.plaintext_fell_back += 1;
        if let Some(map) = &mut self.procs_map {
            let mut p = map.get(&pid, 0).unwrap_or_default();
            p.off = 1;
            if let Err(e) = map.insert(pid, p, 0) {
                tracing::warn!("TLS: pid {pid}: its capture could not be turned off: {e}");
            }
        }
        for m in self.scan(probes, pid) {
            let Some(Some(file)) = self.files.get_mut(&m.id) else {
                continue;
            };
            file.busy.insert(pid);
            if !file.all.is_empty() {
                self.make_per_process(probes, m.id);
            }
        }
    }

    /// The followed processes that map `id` get their own probes on it,
    /// then its all-process probes come off.
    fn make_per_process(&mut self, probes: &mut Probes, id: FileId) {
        let t = Instant::now();
        if !matches!(self.files.get(&id), Some(Some(_))) {
            return;
        }
        // Before the all-process probes come off: a process beginning TLS
        // from now on is read at once.
        self.set_wake(true);
        let pids: Vec<u32> = self.procs.keys().copied().collect();
        for pid in pids {
            if let Some(m) = self.scan(probes, pid).into_iter().find(|m| m.id == id) {
                self.attach_process(probes, pid, &m);
            }
        }
        let Some(Some(file)) = self.files.get_mut(&id) else {
            return;
        };
        // Off before this returns: the busy process traps at every call
        // until they are, and the closer's queue can hold seconds of other
        // files' closes (libraries flipping as busy clients come and go).
        probes.detach_uprobes_now(file.all.drain(..).collect());
        if let Some(r) = self.report.files.get_mut(file.report) {
            r.per_process = true;
        }
        if file.executable {
            if let Some(h) = &mut self.holds {
                h.forget_file(id);
            }
        }
        self.report.files_per_process_total += 1;
        tracing::info!(
            "TLS: {} per process now (a busy process maps it), in {:?}",
            file.path.display(),
            t.elapsed()
        );
    }

    /// The last busy process on `id` is gone: its plaintext probes go back
    /// on for all processes, then the per-process ones come off.
    fn make_all_processes(&mut self, probes: &mut Probes, id: FileId) {
        let Some(Some(mut file)) = self.files.remove(&id) else {
            return;
        };
        self.attach_all(probes, &mut file);
        if file.executable {
            if let Some(h) = &mut self.holds {
                h.know_file(id);
            }
        }
        self.files.insert(id, Some(file));
        for f in self.procs.values_mut() {
            f.probes.remove(&id);
        }
        let any = self.files.keys().any(|&id| self.is_per_process(id));
        self.set_wake(any);
        tracing::info!("TLS: file {id:?} back to all processes");
    }

    /// Tells the kernel whether a process beginning TLS must wake us at once:
    /// only while some file is per process (its probes come when we read it).
    fn set_wake(&mut self, on: bool) {
        if let Some(map) = &mut self.wake_map {
            if let Err(e) = map.set(0, u32::from(on), 0) {
                tracing::warn!("TLS: new processes' announcements not hastened: {e}");
            }
        }
    }

    /// `pid`'s own plaintext probes on the file of mapping `m`.
    fn attach_process(&mut self, probes: &mut Probes, pid: u32, m: &Mapping) {
        if self
            .procs
            .get(&pid)
            .is_some_and(|f| f.probes.contains_key(&m.id))
        {
            return;
        }
        let attached: usize = self.procs.values().map(|f| f.probes.len()).sum();
        if attached >= self.settings.max_processes {
            self.report.plaintext_over_cap += 1;
            return;
        }
        let Some(Some(file)) = self.files.get_mut(&m.id) else {
            return;
        };
        let mut errors = Vec::new();
        let mut held = Vec::new();
        let path = file.pinned.path();
        if probes.uprobe_mechanism() == "uprobe_multi" {
            for site in &file.plaintext_sites {
                match probes.process_uprobe(site.program, &path, site.offset, site.cookie, pid) {
                    Some(Ok(link)) => held.push(ProcessProbe::Link(link)),
                    Some(Err(e)) => errors.push(chain(&e)),
                    None => {}
                }
            }
        } else if file.plaintext.is_none() {
            let mut ids = Vec::new();
            for site in &file.plaintext_sites {
                let defined = probes
                    .uprobe_fd(site.program, site.cookie)
                    .map_err(|e| chain(&e))
                    .and_then(|(fd, cookie)| {
                        self.events
                            .define(&path, site.offset, site.ret, fd.as_fd(), cookie)
                            .map_err(|e| e.to_string())
                    })
                    .map_err(|e| format!("{} at {}: {e}", site.program, site.symbol));
                probes.note_external(site.program, defined.as_ref().map(|_| ()));
                match defined {
                    Ok(id) => ids.push(id),
                    Err(e) => errors.push(e),
                }
            }
            file.plaintext = Some(ids);
        }
        for &ev in file.plaintext.as_deref().unwrap_or_default() {
            match self.events.open_for(ev, pid) {
                Ok(fd) => held.push(ProcessProbe::Event(fd)),
                Err(e) => errors.push(format!("pid {pid}: {e}")),
            }
        }
        let idx = file.report;
        for e in errors {
            self.file_error(idx, e);
        }
        if let Some(f) = self.procs.get_mut(&pid) {
            if !held.is_empty() {
                f.probes.insert(m.id, held);
            }
        }
    }

    fn calls(&self, pid: u32) -> u64 {
        self.procs_map
            .as_ref()
            .and_then(|m| m.get(&pid, 0).ok())
            .map_or(0, |p| p.plaintext_calls)
    }

    /// Shows its tables' entries in `tables` from now on.
    pub fn show_sizes_in(&mut self, tables: Arc<Tables>) {
        self.tables = Some((tables, Instant::now()));
        self.store_sizes();
    }

    /// Its tables' entries, and the kernel's per-process map's, into
    /// `tables` (each entry of the map counted: at most `MAX_TLS_PROCS`).
    fn store_sizes(&mut self) {
        let Some((t, at)) = &mut self.tables else {
            return;
        };
        *at = Instant::now();
        Tables::set(&t.tls_processes, self.procs.len());
        Tables::set(&t.tls_busy_processes, self.high_rate.len());
        Tables::set(&t.tls_exec_scans, self.scans.len());
        Tables::set(&t.tls_files, self.files.len());
        Tables::set(&t.tls_go_executables, self.go.registered());
        if let Some(map) = &self.procs_map {
            Tables::set(&t.kernel_tls_processes, map.keys().count());
        }
    }

    /// Periodic work: exec scans due, call rates, the full rescan.
    pub fn tick(&mut self, probes: &mut Probes) {
        if let Some(h) = &mut self.holds {
            h.beat();
        }
        let now = Instant::now();
        let due: Vec<u32> = self
            .scans
            .iter()
            .filter(|(t, _)| *t <= now)
            .map(|&(_, p)| p)
            .collect();
        self.scans.retain(|(t, _)| *t > now);
        for pid in due {
            self.scan(probes, pid);
        }
        if now.duration_since(self.last_rate_check) >= RATE_CHECK {
            self.last_rate_check = now;
            let mut busy = Vec::new();
            for (&pid, att) in &mut self.procs {
                let span = now.duration_since(att.last_at);
                let calls = self
                    .procs_map
                    .as_ref()
                    .and_then(|m| m.get(&pid, 0).ok())
                    .map_or(att.last_calls, |p| p.plaintext_calls);
                let Some(rate) = call_rate(calls.saturating_sub(att.last_calls), span) else {
                    continue;
                };
                att.last_calls = calls;
                att.last_at = now;
                if rate > self.settings.max_rate as f64 {
                    busy.push((pid, rate));
                }
            }
            for (pid, rate) in busy {
                tracing::info!(
                    "TLS: pid {pid} makes {rate:.0} plaintext calls/s; its TLS times come from the socket now"
                );
                self.fall_back(probes, pid);
            }
        }
        if now.duration_since(self.last_full_scan) >= FULL_SCAN {
            self.scan_all(probes);
        }
        if self
            .tables
            .as_ref()
            .is_some_and(|(_, at)| now.duration_since(*at) >= SIZES_EVERY)
        {
            self.store_sizes();
        }
    }

    /// Runs until Stop; gives the eBPF object back for the shutdown.
    pub fn run(mut self, mut probes: Probes, rx: Receiver<Command>) -> (Probes, TlsReport) {
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(Command::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                Ok(cmd) => self.handle(&mut probes, cmd),
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.tick(&mut probes);
        }
        self.stop_holds(&rx);
        self.store_sizes();
        (probes, self.report)
    }
}

/// The observer's own executable.
fn own_executable() -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata("/proc/self/exe").ok()?;
    Some((md.dev(), md.ino()))
}

fn same_file(path: &Path, id: FileId) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).is_ok_and(|md| (md.dev(), md.ino()) == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_is_judged_over_a_whole_period_only() {
        // curl's four calls, 10 ms after it was followed: no rate yet.
        assert_eq!(call_rate(4, Duration::from_millis(10)), None);
        assert_eq!(call_rate(4, Duration::from_millis(199)), None);
        assert_eq!(call_rate(40, Duration::from_millis(200)), Some(200.0));
        assert_eq!(call_rate(4, Duration::from_millis(400)), Some(10.0));
    }
}
