//! Each feature's state (on, degraded or off, and why) as `ready`, the
//! summary, the stats and `doctor` show it: a leaf the observer fills and
//! its readers import without importing the observer.

use serde::Serialize;

use crate::programs::Feature;

/// A feature's state, as `ready`, the summary and `doctor` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "detail", rename_all = "lowercase")]
pub enum State {
    On(String),
    /// Working in part: what is missing and why.
    Degraded(String),
    /// Not working: why (the missing capability, file or flag).
    Off(String),
}

impl State {
    pub fn word(&self) -> &'static str {
        match self {
            State::On(_) => "on",
            State::Degraded(_) => "degraded",
            State::Off(_) => "off",
        }
    }

    pub fn detail(&self) -> &str {
        match self {
            State::On(d) | State::Degraded(d) | State::Off(d) => d,
        }
    }
}

/// Every feature's state, in `Feature::ALL` order.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(transparent)]
pub struct Features(pub Vec<(Feature, State)>);

impl Features {
    pub fn get(&self, f: Feature) -> Option<&State> {
        self.0.iter().find(|(x, _)| *x == f).map(|(_, s)| s)
    }

    /// "connections: on (9/9 programs attached); TLS handshakes: ..."
    pub fn line(&self) -> String {
        self.0
            .iter()
            .map(|(f, s)| format!("{}: {} ({})", f.label(), s.word(), s.detail()))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// "connections on, TLS handshakes degraded, ..."
    pub fn words(&self) -> String {
        self.0
            .iter()
            .map(|(f, s)| format!("{} {}", f.label(), s.word()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
