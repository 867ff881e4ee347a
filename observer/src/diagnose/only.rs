//! Which records `diagnose` keeps: its own file, since both the calls'
//! collector and the pools' read it.

use crate::cause::call::Call;

/// Which records to keep (`--pid`, `--comm`, `--host`): applied here too, so
/// that `--from FILE` filters as the live pipeline does.
#[derive(Debug, Clone, Default)]
pub struct Only {
    pub pids: Vec<u32>,
    pub comms: Vec<String>,
    pub host: Option<String>,
}

impl Only {
    pub(super) fn keeps(&self, c: &Call) -> bool {
        (self.pids.is_empty() || c.pid.is_some_and(|p| self.pids.contains(&p)))
            && (self.comms.is_empty() || c.comm.as_ref().is_some_and(|n| self.comms.contains(n)))
            && self
                .host
                .as_ref()
                .is_none_or(|h| c.host.as_deref() == Some(h.as_str()) || c.remote_addr == *h)
    }
}
