//! `cargo xtask vmtest`: run a command as root on a stock Debian kernel in qemu.
//!
//! The guest sees this machine's own root filesystem (9p, read-only, under a
//! tmpfs overlay so it may write anywhere), so whatever is built or installed
//! here runs there unchanged; only the kernel differs. That is what a kernel
//! matrix of the observer needs: its eBPF programs meet each kernel's verifier
//! and helpers, with the very binary and tools the host tests use.
//!
//! Everything lives under target/vmtest/:
//! - apt/<suite>/: a private apt setup per Debian suite (the system's sources
//!   are left alone, so `apt-get install` elsewhere picks what it always did);
//! - debs/: the downloaded kernel packages; kernels/<name>/: each unpacked, with
//!   `package` naming what it is and the initramfs built for it (both cached:
//!   a second run needs no network; `--refresh` looks for a newer kernel);
//! - tools/bpftool/: a bpftool new enough to probe 6.12 (see `newer_bpftool`);
//! - out/<name>/: shared read-write with the guest at /vmtest-out: cmd.sh (the
//!   script), output.txt (its stdout and stderr), exit-code, console.log (the
//!   guest's serial console, for boot failures).
//!
//! Acceleration: TCG by default (a boot takes about a minute). /dev/kvm on
//! this machine kind cannot run a stock kernel (`-cpu host` aborts on an MSR,
//! other models hang), so nothing probes it; OBSERVER_VMTEST_ACCEL=kvm tries it.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::hash::{Hash as _, Hasher as _};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _, Result};

use crate::test::ensure_tools;
use crate::{run_checked, workspace_root};

/// A Debian kernel line: the newest `linux-image-<name>.*-amd64` of `suite`.
pub struct Kernel {
    pub name: &'static str,
    suite: &'static str,
}

/// The kernels the observer is tested on (Debian stable's, oldstable's, and
/// the one before, which cloud images still ship).
pub const KERNELS: &[Kernel] = &[
    Kernel {
        name: "5.10",
        suite: "bullseye",
    },
    Kernel {
        name: "6.1",
        suite: "bookworm",
    },
    Kernel {
        name: "6.12",
        suite: "trixie",
    },
];

/// Seconds a boot and its command may take before qemu is killed.
const DEFAULT_TIMEOUT_S: u64 = 20 * 60;

/// What BPF the guest's kernel offers, kept in out/<kernel>/features.txt
/// (`--probe`).
const PROBE_SCRIPT: &str = "uname -r
\"$VMTEST_BPFTOOL\" feature probe kernel > \"$VMTEST_OUT/features.txt\"
status=$?
head -n 60 \"$VMTEST_OUT/features.txt\"
echo \"... ($(wc -l < \"$VMTEST_OUT/features.txt\") lines in all, kept in features.txt)\"
exit $status
";

/// The end-to-end tests that make the kernel subset (tests/tests/).
const SUBSET_TEST: &str = "kernel_subset";

/// What the guest runs when no command is given: the kernel subset of the
/// end-to-end tests (built here first, as `xtask test` builds them), as
/// root, with the release binary; `doctor --verbose` first, into
/// out/<kernel>/doctor.txt, for what a failure needs. CI=true goes in when
/// it is set here (nothing may skip).
fn subset_script() -> Result<String> {
    ensure_tools(crate::test::TOOLS)?;
    let root = workspace_root()?;
    let exe = crate::test::built_test(SUBSET_TEST)?;
    let mut env: Vec<String> = crate::test::test_env(&root)
        .iter()
        .map(|(k, v)| format!("export {k}='{}'", v.display()))
        .collect();
    if let Ok(ci) = std::env::var("CI") {
        env.push(format!("export CI='{ci}'"));
    }
    Ok(format!(
        "{}
uname -r
./target/release/observer doctor --verbose > \"$VMTEST_OUT/doctor.txt\" 2>&1
echo \"doctor: exit $? ($(tail -n 1 \"$VMTEST_OUT/doctor.txt\"))\"
exec '{}' --test-threads=1
",
        env.join("\n"),
        exe.display()
    ))
}

#[derive(clap::Args)]
pub struct VmtestArgs {
    /// Which kernel: 5.10, 6.1, 6.12 or all.
    #[arg(long, default_value = "all")]
    kernel: String,
    /// Seconds each boot (and its command) may take.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_S)]
    timeout: u64,
    /// Look for a newer kernel package than the cached one.
    #[arg(long)]
    refresh: bool,
    /// Instead of the tests: what BPF each kernel offers (bpftool's probe,
    /// kept in target/vmtest/out/<kernel>/features.txt).
    #[arg(long)]
    probe: bool,
    /// The shell command to run in the guest (its words joined by spaces, as
    /// ssh does), from the workspace root; default: the kernel subset of the
    /// end-to-end tests (tests/tests/kernel_subset.rs).
    #[arg(last = true)]
    cmd: Vec<String>,
}

/// How a guest's command ended.
pub struct VmOutcome {
    pub exit_code: i32,
    /// Its stdout and stderr, interleaved.
    pub output: String,
    /// From qemu's start to qemu's end.
    pub elapsed: Duration,
    /// The guest's uptime when the command started: how long booting took.
    pub boot: Option<Duration>,
}

pub fn run(args: &VmtestArgs) -> Result<()> {
    let kernels: Vec<&Kernel> = match args.kernel.as_str() {
        "all" => KERNELS.iter().collect(),
        name => vec![kernel(name)?],
    };
    let script = if !args.cmd.is_empty() {
        args.cmd.join(" ")
    } else if args.probe {
        PROBE_SCRIPT.to_string()
    } else {
        subset_script()?
    };
    if args.refresh {
        for k in &kernels {
            prepare_kernel(k, true)?;
        }
    }
    run_on(&kernels, &script, Duration::from_secs(args.timeout))
}

/// The kernels the README's test command boots for the kernel subset: all.
pub const IN_TEST_RUN: [&str; 3] = ["5.10", "6.1", "6.12"];

/// The kernel subset on [`IN_TEST_RUN`]'s kernels, after the host's tests
/// (which built everything it runs).
pub fn subset_in_test_run() -> Result<()> {
    let kernels = IN_TEST_RUN
        .iter()
        .map(|k| kernel(k))
        .collect::<Result<Vec<_>>>()?;
    run_on(
        &kernels,
        &subset_script()?,
        Duration::from_secs(DEFAULT_TIMEOUT_S),
    )
}

/// `script` on each kernel, the guests side by side; fails if it failed on
/// any. A TCG guest keeps about one host CPU busy (its tests wait on each
/// other), so on this 2-CPU machine kind three guests side by side take
/// about half the time of three in turn. One guest's output is streamed as
/// it comes; several guests' are printed whole, one after the other, once
/// all have ended.
fn run_on(kernels: &[&Kernel], script: &str, timeout: Duration) -> Result<()> {
    ensure_host_tools()?;
    let bpftool = newer_bpftool()?;
    // Downloads and unpacking one at a time (apt locks its lists).
    let mut ready = Vec::new();
    for &k in kernels {
        let prepared = prepare_kernel(k, false)?;
        let initramfs = prepare_initramfs(&prepared)?;
        ready.push((k, prepared, initramfs));
    }
    let stream = ready.len() == 1;
    let bpftool = &bpftool;
    let outcomes: Vec<(&Kernel, Result<VmOutcome>)> = std::thread::scope(|s| {
        let guests: Vec<_> = ready
            .iter()
            .map(|(k, prepared, initramfs)| {
                eprintln!("vmtest: {}: booting", k.name);
                let run = Guest {
                    kernel: k,
                    prepared,
                    initramfs,
                    bpftool,
                    stream,
                };
                s.spawn(move || (*k, run.run(script, timeout)))
            })
            .collect();
        guests
            .into_iter()
            .map(|g| g.join().expect("a guest's thread panicked"))
            .collect()
    });
    let mut failed = Vec::new();
    for (k, outcome) in outcomes {
        match outcome {
            Ok(outcome) => {
                if !stream {
                    println!("===== vmtest: {}: its output =====", k.name);
                    print!("{}", outcome.output);
                }
                eprintln!(
                    "vmtest: {}: exit code {} (booted in {}, {:.0?} in all)",
                    k.name,
                    outcome.exit_code,
                    outcome
                        .boot
                        .map_or("?".to_string(), |b| format!("{:.0?}", b)),
                    outcome.elapsed,
                );
                if outcome.exit_code != 0 {
                    failed.push(format!("{}: exit code {}", k.name, outcome.exit_code));
                }
            }
            Err(e) => {
                eprintln!("vmtest: {}: {e:#}", k.name);
                failed.push(format!("{}: {e:#}", k.name));
            }
        }
    }
    ensure!(failed.is_empty(), "vmtest failed on {}", failed.join("; "));
    Ok(())
}

pub fn kernel(name: &str) -> Result<&'static Kernel> {
    KERNELS.iter().find(|k| k.name == name).with_context(|| {
        let names: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
        format!("no kernel {name:?}; known: {names:?} or all")
    })
}

/// One boot of a prepared kernel.
struct Guest<'a> {
    kernel: &'a Kernel,
    prepared: &'a PreparedKernel,
    initramfs: &'a Path,
    bpftool: &'a Path,
    /// Its output copied to stdout as it comes.
    stream: bool,
}

impl Guest<'_> {
    /// Boots the kernel, runs `script` with sh as root from the workspace
    /// root, and gives back its exit code and output (streamed to stdout as
    /// it comes with `stream`). An error means no exit code: the guest did
    /// not boot, or `timeout` passed.
    fn run(&self, script: &str, timeout: Duration) -> Result<VmOutcome> {
        let Guest {
            kernel,
            prepared,
            initramfs,
            bpftool,
            stream,
        } = *self;
        let out = vmtest_dir()?.join("out").join(kernel.name);
        let mut started = Instant::now();
        let mut output = Err(anyhow!("not booted"));
        // A TCG guest now and then hangs in early boot (seen once in ~10 boots,
        // spinning after "IP idents hash table" on 6.1), before any of ours
        // runs: such a boot is tried once more, and said so.
        for attempt in 1..=2 {
            prepare_out_dir(&out, script, bpftool)?;
            let _ = fs::remove_file(out.join("uptime-at-start"));
            started = Instant::now();
            let child = qemu_command(prepared, initramfs, &out)
                .spawn()
                .context("starting qemu-system-x86_64")?;
            output = follow_until_exit(child, &out, timeout, stream);
            match &output {
                Err(e) if e.to_string().starts_with(BOOT_HUNG) && attempt == 1 => {
                    eprintln!("vmtest: {}: {e}; booting again", kernel.name);
                }
                _ => break,
            }
        }
        let output = output.map_err(|e| {
            anyhow!(
                "{e:#} (the guest's console: {})",
                out.join("console.log").display()
            )
        })?;
        let elapsed = started.elapsed();
        let exit_code = read_exit_code(&out)?;
        let boot = fs::read_to_string(out.join("uptime-at-start"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
            .and_then(|s| Duration::try_from_secs_f64(s).ok());
        Ok(VmOutcome {
            exit_code,
            output,
            elapsed,
            boot,
        })
    }
}

fn vmtest_dir() -> Result<PathBuf> {
    Ok(workspace_root()?.join("target/vmtest"))
}

/// qemu, the static busybox the initramfs is made of, xz for 6.12's modules,
/// and bpftool for the default command.
fn ensure_host_tools() -> Result<()> {
    ensure_tools(&[
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("xz", "xz-utils"),
        ("zstd", "zstd"),
        ("bpftool", "bpftool"),
        // depmod here, and modprobe in the guest (which has this machine's
        // userland): the kernel loads modules on demand (veth, nf_tables...).
        ("depmod", "kmod"),
    ])?;
    // A dynamic busybox (package busybox) would have the same command name
    // but cannot run in an initramfs without a libc.
    if !package_installed("busybox-static") {
        run_checked(Command::new("apt-get").args(["update", "-qq"]))?;
        run_checked(
            Command::new("apt-get")
                .args([
                    "install",
                    "-y",
                    "-qq",
                    "--no-install-recommends",
                    "busybox-static",
                ])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    Ok(())
}

fn package_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// bookworm-backports' bpftool (7.5, libbpf 1.5), unpacked under
/// target/vmtest/tools/ and given to the guest's command as $VMTEST_BPFTOOL.
/// bookworm's own (7.1) misreads 6.5+ verifiers, which say "program of this
/// type cannot use helper" where older ones said "unknown func": its
/// `feature probe` then lists every helper for every program type.
fn newer_bpftool() -> Result<PathBuf> {
    let dir = vmtest_dir()?.join("tools/bpftool");
    let bpftool = dir.join("usr/sbin/bpftool");
    if bpftool.exists() {
        return Ok(bpftool);
    }
    let apt = PrivateApt::new("bookworm-backports")?;
    apt.update()?;
    let deb = apt.download("bpftool/bookworm-backports", "bpftool")?;
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    run_checked(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dir))?;
    ensure!(
        bpftool.exists(),
        "{} has no usr/sbin/bpftool",
        deb.display()
    );
    Ok(bpftool)
}

// ---------------------------------------------------------------- kernels --

/// An unpacked kernel package.
pub struct PreparedKernel {
    dir: PathBuf,
    vmlinuz: PathBuf,
    /// lib/modules/<release> (usr/lib/modules/<release> from trixie on).
    modules: PathBuf,
}

/// Unpacks `kernel` under target/vmtest/kernels/<name>/, unless it is there
/// already and `refresh` is false.
pub fn prepare_kernel(kernel: &Kernel, refresh: bool) -> Result<PreparedKernel> {
    let dir = vmtest_dir()?.join("kernels").join(kernel.name);
    if refresh || !dir.join("package").exists() {
        fetch_kernel(kernel, &dir)?;
    }
    let kernel = locate_kernel(&dir)?;
    ensure_modules_dep(&kernel)?;
    Ok(kernel)
}

fn fetch_kernel(kernel: &Kernel, dir: &Path) -> Result<()> {
    let apt = PrivateApt::new(kernel.suite)?;
    apt.update()?;
    let package = apt.kernel_package()?;
    ensure!(
        package.starts_with(&format!("linux-image-{}.", kernel.name)),
        "{}'s linux-image-amd64 is now {package}, not a {} kernel",
        kernel.suite,
        kernel.name
    );
    let deb = apt.download(&package, &package)?;
    eprintln!("vmtest: unpacking {}", deb.display());
    // (Not with_extension: "6.1" would become "6.tmp", as would "6.12".)
    let tmp = PathBuf::from(format!("{}.tmp", dir.display()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp)?;
    run_checked(
        Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(tmp.join("root")),
    )?;
    let version = command_stdout(Command::new("dpkg-deb").arg("-f").arg(&deb).arg("Version"))?;
    fs::write(
        tmp.join("package"),
        format!("{package} {}\n", version.trim()),
    )?;
    let _ = fs::remove_dir_all(dir);
    fs::rename(&tmp, dir)?;
    Ok(())
}

fn locate_kernel(dir: &Path) -> Result<PreparedKernel> {
    let root = dir.join("root");
    let vmlinuz = only_entry(&root.join("boot"), "vmlinuz-")?;
    let modules = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|m| root.join(m))
        .find(|m| m.is_dir())
        .with_context(|| format!("no lib/modules in {}", root.display()))?;
    let modules = only_entry(&modules, "")?;
    Ok(PreparedKernel {
        dir: dir.to_path_buf(),
        vmlinuz,
        modules,
    })
}

/// The package ships no modules.dep (its postinst runs depmod): without one,
/// modprobe in the guest finds nothing.
fn ensure_modules_dep(kernel: &PreparedKernel) -> Result<()> {
    if kernel.modules.join("modules.dep").exists() {
        return Ok(());
    }
    let root = kernel.dir.join("root");
    // trixie's modules are under usr/lib; this depmod (kmod 30) and the guest
    // (see STAGE1) look under lib/.
    if !root.join("lib").exists() {
        std::os::unix::fs::symlink("usr/lib", root.join("lib"))?;
    }
    let release = kernel
        .modules
        .file_name()
        .context("modules dir has no name")?;
    run_checked(Command::new("depmod").arg("-b").arg(&root).arg(release))
}

/// The one entry of `dir` whose name starts with `prefix`.
fn only_entry(dir: &Path, prefix: &str) -> Result<PathBuf> {
    let found: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!(
            "expected one {prefix}* in {}, found {found:?}",
            dir.display()
        ),
    }
}

fn command_stdout(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// apt pointed at one Debian suite through files of its own (sources, lists,
/// cache), so the system's apt setup is neither read nor changed.
struct PrivateApt {
    dir: PathBuf,
}

impl PrivateApt {
    fn new(suite: &str) -> Result<Self> {
        let dir = vmtest_dir()?.join("apt").join(suite);
        fs::create_dir_all(dir.join("lists/partial"))?;
        fs::create_dir_all(dir.join("cache/archives/partial"))?;
        // debian-archive-keyring holds the keys of oldstable and testing too.
        fs::write(
            dir.join("sources.list"),
            format!(
                "deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
                 http://deb.debian.org/debian {suite} main\n"
            ),
        )?;
        Ok(Self { dir })
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        let d = self.dir.display();
        for option in [
            format!("Dir::Etc::SourceList={d}/sources.list"),
            "Dir::Etc::SourceParts=/dev/null".to_string(),
            format!("Dir::State::Lists={d}/lists"),
            format!("Dir::Cache={d}/cache"),
            "APT::Architecture=amd64".to_string(),
            "Acquire::Languages=none".to_string(),
            // Downloads land in target/, which apt's _apt user may not write.
            "APT::Sandbox::User=root".to_string(),
        ] {
            cmd.arg("-o").arg(option);
        }
        cmd
    }

    fn update(&self) -> Result<()> {
        run_checked(self.command("apt-get").args(["update", "-qq"]))
    }

    /// The versioned image linux-image-amd64 points at, e.g. linux-image-6.1.0-42-amd64.
    fn kernel_package(&self) -> Result<String> {
        let deps = command_stdout(
            self.command("apt-cache")
                .args(["depends", "linux-image-amd64"]),
        )?;
        deps.lines()
            .filter_map(|l| l.trim().strip_prefix("Depends: "))
            .find(|p| p.starts_with("linux-image-"))
            .map(str::to_string)
            .with_context(|| format!("no linux-image-* in:\n{deps}"))
    }

    /// Downloads `request` (a package, maybe with /suite) into
    /// target/vmtest/debs/ and gives the path of `package`'s newest .deb there.
    fn download(&self, request: &str, package: &str) -> Result<PathBuf> {
        let debs = vmtest_dir()?.join("debs");
        fs::create_dir_all(&debs)?;
        run_checked(
            self.command("apt-get")
                .args(["download", "-qq", request])
                .current_dir(&debs),
        )?;
        let prefix = format!("{package}_");
        fs::read_dir(&debs)?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
            .map(|e| e.path())
            .with_context(|| format!("apt-get download left no {prefix}*.deb"))
    }
}

// -------------------------------------------------------------- initramfs --

/// Modules stage 1 needs (with what they depend on) unless built in: the PCI
/// transport, 9p over virtio, overlayfs. virtio_rng feeds the guest's entropy
/// pool, so nothing waits on getrandom on a kernel that boots without much.
const MODULES: &[(&str, bool)] = &[
    ("virtio_pci", true),
    ("9pnet_virtio", true),
    ("9p", true),
    ("overlay", true),
    ("virtio_rng", false),
];

const BUSYBOX: &str = "/bin/busybox";

/// Stage 1, the initramfs's /init (busybox): load the modules, mount the host's
/// root read-only under a tmpfs overlay and the output share, and switch into
/// that root to run stage 2 there.
const STAGE1: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() {
    echo "vmtest stage 1: $*"
    echo o > /proc/sysrq-trigger
    sleep 60
}
while read -r m; do
    insmod "/modules/$m" || fail "insmod $m failed"
done < /modules/order
# msize: bigger messages, fewer round trips (5.10 caps it at about 500 KiB).
# cache=loose on the read-only root: the host does not change under a test.
mkdir -p /lower /rw /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=loose,ro hostroot /lower \
    || fail "mounting the host's root (9p) failed"
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \
    || fail "mounting the overlay failed"
mkdir -p /newroot/vmtest-out
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 vmtestout /newroot/vmtest-out \
    || fail "mounting the output share (9p) failed"
# The unpacked kernel's config (for bpftool) and modules (for modprobe),
# where a host with that kernel installed has them.
release=$(uname -r)
kernel_root=$(cat /kernel-root)
mkdir -p /newroot/boot /newroot/lib/modules
ln -sfn "$kernel_root/boot/config-$release" "/newroot/boot/config-$release"
ln -sfn "$kernel_root/lib/modules/$release" "/newroot/lib/modules/$release"
cp /stage2 /newroot/vmtest-stage2
chmod 755 /newroot/vmtest-stage2
umount /proc /sys /dev 2>/dev/null
exec switch_root /newroot /vmtest-stage2
"#;

/// Stage 2, PID 1 in the host's root: mount what a systemd host has, run the
/// command, record its exit code, power off. (Should this shell end instead,
/// the kernel panics, and panic=-1 with -no-reboot ends qemu all the same.)
const STAGE2: &str = r#"#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/root/.cargo/bin
export HOME=/root VMTEST_OUT=/vmtest-out
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
# /tmp stays the overlay's (writes go to its tmpfs layer): a tmpfs of its
# own hid the host's /tmp, and with it a checkout there (a fresh clone in
# /tmp found no workspace to cd to).
mount -t bpf bpf /sys/fs/bpf
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
# cgroup v2 alone at /sys/fs/cgroup, as systemd mounts it: the observer
# attaches cgroup_skb programs to its root.
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
ip link set lo up
hostname vmtest
ulimit -l unlimited
cat /proc/uptime > /vmtest-out/uptime-at-start
sh /vmtest-out/cmd.sh > /vmtest-out/output.txt 2>&1 < /dev/null
echo $? > /vmtest-out/exit-code
sync
echo o > /proc/sysrq-trigger
sleep 60
"#;

/// Builds (once per kernel and stage scripts) the initramfs: busybox, the
/// modules (decompressed: busybox's insmod reads plain .ko) and both stages.
fn prepare_initramfs(kernel: &PreparedKernel) -> Result<PathBuf> {
    let kernel_root = kernel.dir.join("root");
    let key = initramfs_key(&kernel_root)?;
    let path = kernel.dir.join(format!("initramfs-{key:016x}.cpio"));
    if path.exists() {
        return Ok(path);
    }
    let mut cpio = Cpio::default();
    for dir in ["bin", "dev", "proc", "sys", "modules"] {
        cpio.dir(dir);
    }
    // The kernel opens /dev/console for init's stdio before anything mounts /dev.
    cpio.char_device("dev/console", 5, 1);
    cpio.file("bin/busybox", 0o755, &fs::read(BUSYBOX)?);
    cpio.symlink("bin/sh", "busybox");
    cpio.file("init", 0o755, STAGE1.as_bytes());
    cpio.file("stage2", 0o755, STAGE2.as_bytes());
    let kernel_root = kernel_root.to_string_lossy();
    cpio.file("kernel-root", 0o644, kernel_root.as_bytes());
    let mut order = String::new();
    for (name, file) in modules_in_load_order(&kernel.modules)? {
        let data = read_module(&file)?;
        cpio.file(&format!("modules/{name}.ko"), 0o644, &data);
        order.push_str(&format!("{name}.ko\n"));
    }
    cpio.file("modules/order", 0o644, order.as_bytes());
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, cpio.finish())?;
    fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Changes whenever what goes into an initramfs does (the kernel's own part
/// changes only with a new kernel directory, whose path is part of it).
fn initramfs_key(kernel_root: &Path) -> Result<u64> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (STAGE1, STAGE2, MODULES, kernel_root).hash(&mut hasher);
    let busybox = fs::metadata(BUSYBOX).with_context(|| format!("no {BUSYBOX}"))?;
    (busybox.len(), busybox.modified().ok()).hash(&mut hasher);
    Ok(hasher.finish())
}

/// MODULES and their dependencies (from each module's modinfo, as the package
/// ships no modules.dep), dependencies first; built-in ones left out.
fn modules_in_load_order(modules_dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let files = module_files(modules_dir)?;
    let builtin = fs::read_to_string(modules_dir.join("modules.builtin")).unwrap_or_default();
    let builtin: HashSet<String> = builtin.lines().map(module_name).collect();
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    for &(name, required) in MODULES {
        if builtin.contains(name) || (!required && !files.contains_key(name)) {
            continue;
        }
        add_with_dependencies(name, &files, &mut seen, &mut order)?;
    }
    Ok(order)
}

fn add_with_dependencies(
    name: &str,
    files: &BTreeMap<String, PathBuf>,
    seen: &mut HashSet<String>,
    order: &mut Vec<(String, PathBuf)>,
) -> Result<()> {
    if !seen.insert(name.to_string()) {
        return Ok(());
    }
    let file = files
        .get(name)
        .with_context(|| format!("module {name} is neither built in nor shipped"))?;
    for dep in module_dependencies(&read_module(file)?) {
        add_with_dependencies(&dep, files, seen, order)?;
    }
    order.push((name.to_string(), file.clone()));
    Ok(())
}

/// Every module file under `dir`, by module name.
fn module_files(dir: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().contains(".ko") {
                files.insert(module_name(&path.to_string_lossy()), path);
            }
        }
    }
    Ok(files)
}

/// "kernel/net/9p/9pnet-virtio.ko.xz" -> "9pnet_virtio" (the kernel treats - and _ alike).
fn module_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    let stem = base.split(".ko").next().unwrap_or(base);
    stem.replace('-', "_")
}

/// A module's bytes, decompressed (trixie ships .ko.xz).
fn read_module(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let decompressor = if name.ends_with(".xz") {
        "xz"
    } else if name.ends_with(".zst") {
        "zstd"
    } else {
        return fs::read(path).with_context(|| format!("reading {name}"));
    };
    let out = Command::new(decompressor)
        .arg("-dc")
        .arg(path)
        .output()
        .with_context(|| format!("starting {decompressor}"))?;
    ensure!(out.status.success(), "{decompressor} -dc {name} failed");
    Ok(out.stdout)
}

/// The "depends=a,b" entry of a module's .modinfo section (NUL-separated
/// key=value strings; searched for in the whole file, which is simpler than
/// walking the ELF sections and finds the same bytes).
fn module_dependencies(module: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"\0depends=";
    let Some(at) = module.windows(KEY.len()).position(|w| w == KEY) else {
        return Vec::new();
    };
    let value = &module[at + KEY.len()..];
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end])
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| d.replace('-', "_"))
        .collect()
}

/// A cpio archive in the "newc" format the kernel unpacks an initramfs from.
#[derive(Default)]
struct Cpio {
    bytes: Vec<u8>,
    next_inode: u32,
}

impl Cpio {
    fn dir(&mut self, path: &str) {
        self.entry(path, 0o040755, &[], (0, 0));
    }

    fn file(&mut self, path: &str, permissions: u32, data: &[u8]) {
        self.entry(path, 0o100000 | permissions, data, (0, 0));
    }

    fn symlink(&mut self, path: &str, target: &str) {
        self.entry(path, 0o120777, target.as_bytes(), (0, 0));
    }

    fn char_device(&mut self, path: &str, major: u32, minor: u32) {
        self.entry(path, 0o020600, &[], (major, minor));
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8], (rdev_major, rdev_minor): (u32, u32)) {
        self.next_inode += 1;
        let fields = [
            self.next_inode,
            mode,
            0, // uid
            0, // gid
            1, // nlink
            0, // mtime
            data.len() as u32,
            0, // dev major
            0, // dev minor
            rdev_major,
            rdev_minor,
            name.len() as u32 + 1,
            0, // check
        ];
        self.bytes.extend_from_slice(b"070701");
        for field in fields {
            self.bytes
                .extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.push(0);
        self.pad();
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[], (0, 0));
        self.bytes
    }
}

// ------------------------------------------------------------------- qemu --

/// Empties out/<kernel>/ of the last run's results and writes the script.
fn prepare_out_dir(out: &Path, script: &str, bpftool: &Path) -> Result<()> {
    fs::create_dir_all(out)?;
    for stale in ["output.txt", "exit-code", "console.log", "uptime-at-start"] {
        let _ = fs::remove_file(out.join(stale));
    }
    let root = workspace_root()?;
    let cmd = format!(
        "export VMTEST_BPFTOOL='{}'\ncd '{}' || exit 1\n{script}\n",
        bpftool.display(),
        root.display()
    );
    fs::write(out.join("cmd.sh"), cmd)?;
    Ok(())
}

fn qemu_command(kernel: &PreparedKernel, initramfs: &Path, out: &Path) -> Command {
    let mut cmd = Command::new("qemu-system-x86_64");
    match std::env::var("OBSERVER_VMTEST_ACCEL").as_deref() {
        Ok("kvm") => cmd.args(["-accel", "kvm", "-cpu", "host"]),
        _ => cmd.args(["-accel", "tcg", "-cpu", "max"]),
    };
    cmd.args(["-smp", "2", "-m", "4G", "-nodefaults", "-no-user-config"])
        .args(["-display", "none", "-no-reboot"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .args([
            "-append",
            "console=ttyS0 rdinit=/init panic=-1 random.trust_cpu=on",
        ])
        .arg("-serial")
        .arg(format!("file:{}", out.join("console.log").display()))
        .args(["-device", "virtio-rng-pci"])
        .args(nine_p_share("hostroot", Path::new("/"), true))
        .args(nine_p_share("vmtestout", out, false))
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

/// qemu arguments sharing host `path` with the guest as 9p tag `tag`.
/// multidevs=remap: the host's submounts keep inode numbers apart.
fn nine_p_share(tag: &str, path: &Path, readonly: bool) -> [String; 4] {
    let readonly = if readonly { ",readonly=on" } else { "" };
    [
        "-fsdev".to_string(),
        format!(
            "local,id={tag},path={},security_model=none,multidevs=remap{readonly}",
            path.display()
        ),
        "-device".to_string(),
        format!("virtio-9p-pci,fsdev={tag},mount_tag={tag}"),
    ]
}

/// How the error of a guest that never reached its command begins.
const BOOT_HUNG: &str = "the guest did not boot";

/// A boot takes 10-20 s under TCG; past this the guest is hung.
const BOOT_LIMIT: Duration = Duration::from_secs(180);

/// Waits for qemu to end, printing the guest command's output as it grows
/// (with `stream`); kills qemu after `timeout`. Gives back the whole output.
fn follow_until_exit(
    mut qemu: Child,
    out: &Path,
    timeout: Duration,
    stream: bool,
) -> Result<String> {
    let output = &out.join("output.txt");
    let started = Instant::now();
    let mut seen = 0u64;
    loop {
        let status = qemu.try_wait()?;
        if stream {
            seen = print_new_output(output, seen)?;
        }
        if let Some(status) = status {
            ensure!(status.success(), "qemu failed: {status}");
            break;
        }
        if started.elapsed() > timeout {
            let _ = qemu.kill();
            let _ = qemu.wait();
            bail!("timed out after {timeout:?}");
        }
        if started.elapsed() > BOOT_LIMIT && !out.join("uptime-at-start").exists() {
            let _ = qemu.kill();
            let _ = qemu.wait();
            bail!("{BOOT_HUNG} in {BOOT_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(String::from_utf8_lossy(&fs::read(output).unwrap_or_default()).into_owned())
}

/// Prints what `path` holds past offset `seen`; gives the new offset.
fn print_new_output(path: &Path, seen: u64) -> Result<u64> {
    let Ok(mut file) = fs::File::open(path) else {
        return Ok(seen);
    };
    file.seek(SeekFrom::Start(seen))?;
    let mut new = Vec::new();
    file.read_to_end(&mut new)?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&new)?;
    stdout.flush()?;
    Ok(seen + new.len() as u64)
}

fn read_exit_code(out: &Path) -> Result<i32> {
    let console = out.join("console.log");
    let Ok(code) = fs::read_to_string(out.join("exit-code")) else {
        let log = fs::read_to_string(&console).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "the guest ended without running the command; its console ({}) ends:\n{}",
            console.display(),
            tail.join("\n")
        );
    };
    code.trim()
        .parse()
        .with_context(|| format!("exit-code holds {code:?}"))
}
