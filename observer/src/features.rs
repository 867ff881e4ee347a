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

/// What `doctor` and the `ready` line conclude: the observer runs with every
/// feature a user expects on, runs without some, or cannot run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", content = "why", rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    /// It runs, but these expected features are off or degraded ("DNS wire
    /// off: why").
    Degraded(Vec<String>),
    /// A required program, the object or the privileges are missing.
    Unusable(String),
}

impl Verdict {
    /// `doctor`'s exit code: 0 ok, 1 unusable (as before degraded existed),
    /// 3 degraded (2 is the argument parser's usage error).
    pub const fn exit_code(&self) -> u8 {
        match self {
            Verdict::Ok => 0,
            Verdict::Unusable(_) => 1,
            Verdict::Degraded(_) => 3,
        }
    }

    pub const fn word(&self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Degraded(_) => "degraded",
            Verdict::Unusable(_) => "unusable",
        }
    }

    /// "degraded (DNS wire off: why; ...)", "ok", "unusable (why)".
    pub fn line(&self) -> String {
        match self {
            Verdict::Ok => "ok".into(),
            Verdict::Degraded(why) => format!("degraded ({})", why.join("; ")),
            Verdict::Unusable(why) => format!("unusable ({why})"),
        }
    }
}

impl Features {
    /// The verdict of an observer that runs: degraded when any of the
    /// features a user expects (`expected`: the defaults less what a flag
    /// turned off) is not fully on.
    pub fn verdict(&self, expected: &[Feature]) -> Verdict {
        let short: Vec<String> = self
            .0
            .iter()
            .filter(|(f, s)| expected.contains(f) && !matches!(s, State::On(_)))
            .map(|(f, s)| format!("{} {}: {}", f.label(), s.word(), s.detail()))
            .collect();
        if short.is_empty() {
            Verdict::Ok
        } else {
            Verdict::Degraded(short)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(states: &[(Feature, State)]) -> Features {
        Features(states.to_vec())
    }

    #[test]
    fn an_expected_feature_not_fully_on_degrades_the_verdict_and_says_which() {
        let f = features(&[
            (Feature::Connections, State::On("9/9".into())),
            (Feature::DnsWire, State::Off("refused".into())),
            (Feature::HttpPlain, State::Degraded("no owners".into())),
            (Feature::Gpu, State::Off("no NVML".into())),
        ]);
        let v = f.verdict(&[Feature::Connections, Feature::DnsWire, Feature::HttpPlain]);
        assert_eq!(
            v,
            Verdict::Degraded(vec![
                "DNS wire off: refused".into(),
                "plain HTTP requests degraded: no owners".into()
            ])
        );
        assert_eq!(v.exit_code(), 3);
        // What is not expected (a flag turned it off, or GPU) never counts.
        assert_eq!(f.verdict(&[Feature::Connections]), Verdict::Ok);
        assert_eq!(Verdict::Ok.exit_code(), 0);
        assert_eq!(Verdict::Unusable("x".into()).exit_code(), 1);
    }
}
