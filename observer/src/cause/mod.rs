//! Why a call was slow: the rules (`rules`) are pure functions of a call's
//! phases (`call`, built from a connection or request record) and the
//! thresholds, so `diagnose`, the span attribute and the cause count give
//! the same verdict. Beside the records they read, below every reader.

pub mod call;
pub mod rules;
pub mod thresholds;

pub use call::Call;
pub use rules::{diagnose, Cause, Diagnosis};
pub use thresholds::Thresholds;

/// The cause of a connection record with the default thresholds (the span
/// attribute `observer.diagnosis.cause` and the `observer.diagnosis` count).
pub fn cause_of_conn(r: &crate::record::ConnRecord) -> &'static str {
    r.diagnosis
        .unwrap_or_else(|| rules::cause(&Call::phases_of_conn(r), &Thresholds::default()).as_str())
}

/// The same for a request record (a connection's first request carries the
/// connection's lookup, connect and TLS).
pub fn cause_of_request(r: &crate::http::RequestRecord) -> &'static str {
    r.diagnosis.unwrap_or_else(|| {
        rules::cause(&Call::phases_of_request(r), &Thresholds::default()).as_str()
    })
}

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;
