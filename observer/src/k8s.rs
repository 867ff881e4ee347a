//! Which container and Kubernetes pod a process runs in, without asking the
//! API server: the container id and pod uid from the process's cgroup path
//! (`/proc/PID/cgroup`), the pod's namespace and name and the container's
//! name from the kubelet's node-local log layout
//! (`/var/log/pods/<namespace>_<pod>_<uid>/<container>/`, and
//! `/var/log/containers/<pod>_<namespace>_<container>-<id>.log` beside it),
//! the node's name from the downward API (`K8S_NODE_NAME`, or `NODE_NAME`).
//! A process seen exec'ing is placed by the cgroup id the kernel gave with
//! the exec (its cgroup directory's inode on the v2 tree), so a short-lived
//! one keeps its container after it is gone from /proc.
//! What cannot be read is left out, never guessed.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use serde::Serialize;

/// A process's container, as records carry it (`"container"`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Container {
    /// The runtime's id (64 hex characters), or null inside a pod whose
    /// cgroup path names none.
    pub id: Option<Arc<str>>,
    pub pod_uid: Option<Arc<str>>,
    pub pod_name: Option<Arc<str>>,
    pub namespace: Option<Arc<str>>,
    /// The container's name in its pod spec.
    pub name: Option<Arc<str>>,
    pub node_name: Option<Arc<str>>,
}

impl Container {
    /// OpenTelemetry resource attributes (semantic conventions' names).
    pub fn attributes(&self) -> Vec<(&'static str, &str)> {
        [
            ("container.id", &self.id),
            ("k8s.pod.uid", &self.pod_uid),
            ("k8s.pod.name", &self.pod_name),
            ("k8s.namespace.name", &self.namespace),
            ("k8s.container.name", &self.name),
            ("k8s.node.name", &self.node_name),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
        .collect()
    }
}

/// The container id and pod uid in a `/proc/PID/cgroup` text.
pub fn ids_from_cgroup(text: &str) -> (Option<String>, Option<String>) {
    let mut id = None;
    let mut pod = None;
    for line in text.lines() {
        // "hierarchy:controllers:path"; the path may itself hold colons.
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        for seg in path.split('/') {
            if pod.is_none() {
                pod = pod_uid(seg);
            }
            if id.is_none() {
                id = container_id(seg);
            }
        }
        if id.is_some() && pod.is_some() {
            break;
        }
    }
    (id, pod)
}

/// "cri-containerd-<id>.scope", "docker-<id>.scope", "crio-<id>.scope",
/// "libpod-<id>.scope", or the bare id (cgroupfs driver).
fn container_id(seg: &str) -> Option<String> {
    let seg = seg.strip_suffix(".scope").unwrap_or(seg);
    let id = seg.rsplit('-').next()?;
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_ascii_lowercase())
}

/// "kubepods-burstable-pod<uid with _ for ->.slice" (systemd driver) or
/// "pod<uid>" (cgroupfs driver). A uid is a UUID, or 32 hex characters for a
/// static pod (a hash of its manifest).
fn pod_uid(seg: &str) -> Option<String> {
    let seg = seg.strip_suffix(".slice").unwrap_or(seg);
    let at = seg.rfind("pod")?;
    let before = &seg[..at];
    if !(before.is_empty() || before.ends_with('-')) {
        return None;
    }
    let uid = seg[at + 3..].replace('_', "-");
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    let uuid = uid.len() == 36
        && uid.split('-').map(str::len).eq([8, 4, 4, 4, 12])
        && hex(&uid.replace('-', ""));
    (uuid || (uid.len() == 32 && hex(&uid))).then(|| uid.to_ascii_lowercase())
}

/// Cgroup v2 ids to paths under the root, from a walk of the tree; an
/// unknown id walks it again, at most once a second.
struct CgroupPaths {
    root: Option<PathBuf>,
    paths: HashMap<u64, String>,
    walked_at: Option<Instant>,
}

/// Bounds a walk on a node with very many cgroups.
const MAX_CGROUPS: usize = 100_000;
const WALK_EVERY: Duration = Duration::from_secs(1);

impl CgroupPaths {
    fn new(root: Option<PathBuf>) -> Self {
        Self {
            root,
            paths: HashMap::new(),
            walked_at: None,
        }
    }

    fn path(&mut self, id: u64) -> Option<String> {
        if let Some(p) = self.paths.get(&id) {
            return Some(p.clone());
        }
        if self.walked_at.is_some_and(|t| t.elapsed() < WALK_EVERY) {
            return None;
        }
        self.walk();
        self.paths.get(&id).cloned()
    }

    fn walk(&mut self) {
        use std::os::unix::fs::MetadataExt as _;
        self.walked_at = Some(Instant::now());
        let Some(root) = &self.root else { return };
        self.paths.clear();
        let mut stack = vec![(root.clone(), String::new())];
        while let Some((dir, rel)) = stack.pop() {
            if let Ok(m) = std::fs::metadata(&dir) {
                let shown = if rel.is_empty() {
                    "/".to_owned()
                } else {
                    rel.clone()
                };
                self.paths.insert(m.ino(), shown);
            }
            if self.paths.len() >= MAX_CGROUPS {
                break;
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let name = e.file_name().to_string_lossy().into_owned();
                    stack.push((e.path(), format!("{rel}/{name}")));
                }
            }
        }
    }
}

/// A pod's names from its log directory.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pod {
    namespace: Arc<str>,
    name: Arc<str>,
    dir: PathBuf,
}

/// How long a pod uid with no log directory yet is not looked for again.
const MISS_TTL: Duration = Duration::from_secs(5);
/// Caps memory on a node that has seen many pods.
const MAX_PODS: usize = 4096;

/// The kubelet's log layout and the node's name; caches pods by uid.
pub struct Pods {
    /// `/var/log/pods` (or `--pod-log-dir`).
    dir: PathBuf,
    node_name: Option<Arc<str>>,
    found: HashMap<String, Option<Pod>>,
    missed_at: HashMap<String, Instant>,
    cgroups: CgroupPaths,
}

impl Pods {
    /// `cgroup_root`: the v2 tree the kernel's cgroup ids refer to.
    pub fn new(
        dir: impl Into<PathBuf>,
        node_name: Option<String>,
        cgroup_root: Option<PathBuf>,
    ) -> Self {
        Self {
            dir: dir.into(),
            node_name: node_name.filter(|n| !n.is_empty()).map(Arc::from),
            found: HashMap::new(),
            missed_at: HashMap::new(),
            cgroups: CgroupPaths::new(cgroup_root),
        }
    }

    /// Cgroup ids known from the last walk of the tree.
    pub fn cgroups_len(&self) -> usize {
        self.cgroups.paths.len()
    }

    /// The container of the process in cgroup v2 `id` (as the kernel gave it);
    /// None when the id is not found or names no container.
    pub fn container_of_cgroup(&mut self, id: u64) -> Option<Container> {
        let path = self.cgroups.path(id)?;
        self.container(&format!("0::{path}\n"))
    }

    /// The node's name from the downward API variable.
    pub fn node_name_from_env() -> Option<String> {
        std::env::var("K8S_NODE_NAME")
            .or_else(|_| std::env::var("NODE_NAME"))
            .ok()
    }

    /// The container of a process whose `/proc/PID/cgroup` is `cgroup`; None
    /// for a process in no container.
    pub fn container(&mut self, cgroup: &str) -> Option<Container> {
        let (id, pod_uid) = ids_from_cgroup(cgroup);
        if id.is_none() && pod_uid.is_none() {
            return None;
        }
        let mut c = Container {
            id: id.as_deref().map(Arc::from),
            pod_uid: pod_uid.as_deref().map(Arc::from),
            node_name: self.node_name.clone(),
            ..Container::default()
        };
        if let Some(uid) = &pod_uid {
            if let Some(pod) = self.pod(uid) {
                c.namespace = Some(Arc::clone(&pod.namespace));
                c.pod_name = Some(Arc::clone(&pod.name));
                c.name = container_name(&self.dir, &pod, id.as_deref()).map(Arc::from);
            }
        }
        Some(c)
    }

    fn pod(&mut self, uid: &str) -> Option<Pod> {
        if let Some(p) = self.found.get(uid) {
            return p.clone();
        }
        if self
            .missed_at
            .get(uid)
            .is_some_and(|t| t.elapsed() < MISS_TTL)
        {
            return None;
        }
        let found = find_pod(&self.dir, uid);
        if self.found.len() >= MAX_PODS {
            self.found.clear();
            self.missed_at.clear();
        }
        match &found {
            Some(_) => {
                self.missed_at.remove(uid);
                self.found.insert(uid.to_owned(), found.clone());
            }
            None => {
                self.missed_at.insert(uid.to_owned(), Instant::now());
            }
        }
        found
    }
}

/// `<dir>/<namespace>_<pod>_<uid>`: neither a namespace nor a pod name may
/// hold an underscore, so the split is exact.
fn find_pod(dir: &Path, uid: &str) -> Option<Pod> {
    let suffix = format!("_{uid}");
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let name = e.file_name().into_string().ok()?;
        let rest = name.strip_suffix(&suffix)?;
        let (ns, pod) = rest.split_once('_')?;
        (!ns.is_empty() && !pod.is_empty() && !pod.contains('_')).then(|| Pod {
            namespace: Arc::from(ns),
            name: Arc::from(pod),
            dir: e.path(),
        })
    })
}

/// The container's directory in its pod's: the one whose
/// `containers/<pod>_<namespace>_<name>-<id>.log` link exists beside the pod
/// logs, else the only one there is.
fn container_name(dir: &Path, pod: &Pod, id: Option<&str>) -> Option<String> {
    let names: Vec<String> = std::fs::read_dir(&pod.dir)
        .ok()?
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    if let (Some(id), Some(containers)) = (id, dir.parent().map(|p| p.join("containers"))) {
        let by_link = names.iter().find(|n| {
            containers
                .join(format!("{}_{}_{n}-{id}.log", pod.name, pod.namespace))
                .symlink_metadata()
                .is_ok()
        });
        if let Some(n) = by_link {
            return Some(n.clone());
        }
    }
    match names.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

    use super::*;

    const ID: &str = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899";
    const UID: &str = "0d6a4c4e-2b1f-4c36-9d6e-1a2b3c4d5e6f";

    #[test]
    fn ids_from_the_cgroup_drivers_and_runtimes() {
        let systemd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(
            ids_from_cgroup(&systemd),
            (Some(ID.into()), Some(UID.into()))
        );
        let cgroupfs = format!("12:memory:/kubepods/besteffort/pod{UID}/{ID}\n0::/\n");
        assert_eq!(
            ids_from_cgroup(&cgroupfs),
            (Some(ID.into()), Some(UID.into()))
        );
        let docker = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(ids_from_cgroup(&docker), (Some(ID.into()), None));
        assert_eq!(
            ids_from_cgroup("0::/user.slice/user-0.slice/session-3.scope\n"),
            (None, None)
        );
        // Not a pod: "pod" inside another word, or no uid after it.
        assert_eq!(pod_uid("ipod-abc.slice"), None);
        assert_eq!(pod_uid("podman.slice"), None);
        let static_pod = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            pod_uid(&format!("pod{static_pod}")),
            Some(static_pod.into())
        );
    }

    #[test]
    fn names_from_the_kubelet_layout() {
        let root = std::env::temp_dir().join(format!("observer-k8s-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let pods = root.join("pods");
        let pod_dir = pods.join(format!("shop_checkout-7d9f_{UID}"));
        std::fs::create_dir_all(pod_dir.join("app")).unwrap();
        std::fs::create_dir_all(pod_dir.join("sidecar")).unwrap();
        std::fs::create_dir_all(root.join("containers")).unwrap();
        let cgroup = format!("0::/kubepods/pod{UID}/{ID}\n");
        let mut p = Pods::new(&pods, Some("node-a".into()), None);
        let c = p.container(&cgroup).unwrap();
        assert_eq!(c.namespace.as_deref(), Some("shop"));
        assert_eq!(c.pod_name.as_deref(), Some("checkout-7d9f"));
        assert_eq!(c.name, None, "two containers and no link: not guessed");
        assert_eq!(c.node_name.as_deref(), Some("node-a"));
        std::os::unix::fs::symlink(
            pod_dir.join("sidecar/0.log"),
            root.join(format!("containers/checkout-7d9f_shop_sidecar-{ID}.log")),
        )
        .unwrap();
        let c = p.container(&cgroup).unwrap();
        assert_eq!(c.name.as_deref(), Some("sidecar"));
        assert_eq!(
            c.attributes(),
            vec![
                ("container.id", ID),
                ("k8s.pod.uid", UID),
                ("k8s.pod.name", "checkout-7d9f"),
                ("k8s.namespace.name", "shop"),
                ("k8s.container.name", "sidecar"),
                ("k8s.node.name", "node-a"),
            ]
        );
        assert_eq!(p.container("0::/user.slice\n"), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn cgroup_ids_are_directory_inodes_under_the_root() {
        use std::os::unix::fs::MetadataExt as _;
        let root = std::env::temp_dir().join(format!("observer-cg-{}", std::process::id()));
        let leaf = root.join(format!("kubepods/pod{UID}/{ID}"));
        std::fs::create_dir_all(&leaf).unwrap();
        let id = std::fs::metadata(&leaf).unwrap().ino();
        let mut c = CgroupPaths::new(Some(root.clone()));
        assert_eq!(
            c.path(id).as_deref(),
            Some(format!("/kubepods/pod{UID}/{ID}").as_str())
        );
        assert_eq!(
            c.path(std::fs::metadata(&root).unwrap().ino()).as_deref(),
            Some("/")
        );
        assert_eq!(c.path(u64::MAX), None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
