//! Process details (name, executable, container and pod) for the pids that
//! own connections.
//!
//! Read from /proc once per process and cached; the cache entry is dropped when
//! the kernel reports that the pid exec'd or exited, so it is never stale.

use std::{path::PathBuf, sync::Arc};

/// What we know of a process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcInfo {
    /// `/proc/PID/comm`: the process (main thread) name.
    pub comm: Option<Arc<str>>,
    /// `/proc/PID/exe` resolved. Shared by every connection of the process.
    pub exe: Option<Arc<str>>,
    /// Its container and pod, from `/proc/PID/cgroup` (None: in none).
    pub container: Option<Arc<crate::k8s::Container>>,
}

/// Caps memory if exec/exit events are lost: past this size the cache starts over.
const MAX_ENTRIES: usize = 16_384;

pub struct ProcessCache {
    root: PathBuf,
    entries: crate::keys::NumMap<u32, ProcInfo>,
    /// Pod names from the kubelet's layout (None: container ids only).
    pods: Option<crate::k8s::Pods>,
    /// /proc entries that could not be read (process gone, or hidden from us).
    pub unreadable: u64,
}

impl ProcessCache {
    /// A cache over `/proc`, or another directory laid out like it (tests).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            entries: crate::keys::NumMap::default(),
            pods: None,
            unreadable: 0,
        }
    }

    /// Also names the pods of containerized processes.
    pub fn with_pods(mut self, pods: crate::k8s::Pods) -> Self {
        self.pods = Some(pods);
        self
    }

    fn container(
        root: &std::path::Path,
        pods: &mut Option<crate::k8s::Pods>,
        pid: u32,
    ) -> Option<Arc<crate::k8s::Container>> {
        let text = std::fs::read_to_string(root.join(pid.to_string()).join("cgroup")).ok()?;
        let c = match pods {
            Some(p) => p.container(&text)?,
            None => {
                let (id, pod_uid) = crate::k8s::ids_from_cgroup(&text);
                if id.is_none() && pod_uid.is_none() {
                    return None;
                }
                crate::k8s::Container {
                    id: id.map(Arc::from),
                    pod_uid: pod_uid.map(Arc::from),
                    ..Default::default()
                }
            }
        };
        Some(Arc::new(c))
    }

    pub fn get(&mut self, pid: u32) -> &ProcInfo {
        if self.entries.len() >= MAX_ENTRIES && !self.entries.contains_key(&pid) {
            self.entries.clear();
        }
        let root = &self.root;
        let unreadable = &mut self.unreadable;
        let pods = &mut self.pods;
        self.entries.entry(pid).or_insert_with(|| {
            let dir = root.join(pid.to_string());
            let comm = std::fs::read_to_string(dir.join("comm"))
                .ok()
                .map(|s| Arc::from(s.trim_end_matches('\n')));
            let exe = std::fs::read_link(dir.join("exe"))
                .ok()
                .map(|p| Arc::from(p.to_string_lossy().as_ref()));
            if comm.is_none() || exe.is_none() {
                *unreadable += 1;
            }
            let container = Self::container(root, pods, pid);
            ProcInfo {
                comm,
                exe,
                container,
            }
        })
    }

    /// Forgets `pid` (it exited).
    pub fn forget(&mut self, pid: u32) {
        self.entries.remove(&pid);
    }

    /// `pid` exec'd `path` (as given to exec). An absolute path is resolved
    /// here, while the file surely exists, so that even a process gone before
    /// its first connection is seen has its executable; the name is the
    /// kernel's thread name until /proc is read. Anything else: read /proc later.
    /// `cgroup_id`: its cgroup v2 id at exec, which places it in its
    /// container even once it is gone from /proc.
    pub fn exec(&mut self, pid: u32, path: &str, cgroup_id: u64) {
        self.entries.remove(&pid);
        if !path.starts_with('/') {
            return;
        }
        let exe: Arc<str> = std::fs::canonicalize(path)
            .map(|p| Arc::from(p.to_string_lossy().as_ref()))
            .unwrap_or_else(|_| Arc::from(path));
        let comm = std::fs::read_to_string(self.root.join(pid.to_string()).join("comm"))
            .ok()
            .map(|s| Arc::from(s.trim_end_matches('\n')));
        let by_id = self
            .pods
            .as_mut()
            .and_then(|p| p.container_of_cgroup(cgroup_id))
            .map(Arc::new);
        let container = by_id.or_else(|| Self::container(&self.root, &mut self.pods, pid));
        self.entries.insert(
            pid,
            ProcInfo {
                comm,
                exe: Some(exe),
                container,
            },
        );
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Cgroup ids it knows the paths of (0 without pods).
    pub fn cgroups_len(&self) -> usize {
        self.pods.as_ref().map_or(0, crate::k8s::Pods::cgroups_len)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let mut cache = ProcessCache::new("/proc");
        let me = std::process::id();
        let info = cache.get(me).clone();
        let exe = std::env::current_exe().expect("current exe");
        assert_eq!(info.exe.as_deref(), exe.to_str());
        assert!(info.comm.is_some());
        assert_eq!(cache.unreadable, 0);
    }

    #[test]
    fn missing_process_is_counted_not_fatal() {
        let dir = std::env::temp_dir().join(format!("observer-proc-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("5")).expect("mkdir");
        std::fs::write(dir.join("5/comm"), "fake\n").expect("write");
        let mut cache = ProcessCache::new(&dir);
        assert_eq!(cache.get(5).comm.as_deref(), Some("fake"));
        assert_eq!(cache.get(5).exe, None);
        assert_eq!(cache.get(6), &ProcInfo::default());
        assert_eq!(cache.unreadable, 2, "each pid counted once");
        std::fs::write(dir.join("5/comm"), "renamed\n").expect("write");
        assert_eq!(cache.get(5).comm.as_deref(), Some("fake"), "cached");
        cache.forget(5);
        assert_eq!(cache.get(5).comm.as_deref(), Some("renamed"));
        // An exec'd path is resolved at once (symlinks too), /proc or not.
        cache.exec(7, "/proc/self/exe", 0);
        let me = std::env::current_exe().expect("exe");
        assert_eq!(cache.get(7).exe.as_deref(), me.to_str());
        assert_eq!(cache.get(7).comm, None, "no /proc entry for 7 here");
        cache.exec(5, "relative/path", 0);
        assert_eq!(
            cache.get(5).comm.as_deref(),
            Some("renamed"),
            "read from /proc"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
