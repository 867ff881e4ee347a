//! Which failed OTLP exports are tried again, and after how long: the OTLP
//! exporter spec's rules. Only transient failures are retried (HTTP 429,
//! 502, 503, 504; gRPC CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE,
//! UNAVAILABLE, DATA_LOSS, and RESOURCE_EXHAUSTED when the server sends
//! RetryInfo; no answer at all), with exponential back-off and jitter; a
//! server's own delay (HTTP `Retry-After`, gRPC `RetryInfo`) is waited at
//! least, up to MAX_SERVER_DELAY. Anything else is given up at once: sending
//! the same bytes again would be refused again.

use std::time::{Duration, SystemTime};

/// The first back-off; it doubles up to MAX_BACKOFF.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A server's delay longer than this is cut to it: the exporter holds one
/// batch at a time, and a batch held minutes would only make the queue
/// overflow behind it (counted, but later data is worth more).
pub const MAX_SERVER_DELAY: Duration = Duration::from_secs(30);
/// Each back-off is the nominal one times 1 ± JITTER, so observers
/// restarted together do not retry in lock-step.
pub const JITTER: f64 = 0.2;

/// What to do about a failed export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Transient: try again, no sooner than the server's delay if it gave one.
    After(Option<Duration>),
    /// Permanent: sending the same request again cannot succeed.
    No,
    /// The endpoint does not take this signal at all (gRPC Unimplemented;
    /// HTTP 404, 405, 501): stop sending it.
    Refused,
}

/// An HTTP answer's verdict; `retry_after` is its `Retry-After` header.
pub fn http(status: u16, retry_after: Option<&str>) -> Retry {
    match status {
        404 | 405 | 501 => Retry::Refused,
        429 | 502 | 503 | 504 => Retry::After(retry_after.and_then(parse_retry_after)),
        _ => Retry::No,
    }
}

/// `Retry-After`: delay-seconds or an HTTP-date (RFC 9110, 10.2.3).
fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(
        at.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// A gRPC status's verdict. A status made on this side (no answer: a
/// connection that failed, a timeout) carries its cause as source and is
/// transient whatever its code.
pub fn grpc(s: &tonic::Status) -> Retry {
    use tonic::Code;
    let delay = retry_info(s.details());
    match s.code() {
        Code::Unimplemented => Retry::Refused,
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unavailable
        | Code::DataLoss => Retry::After(delay),
        // The spec: retried only when the server says when it may succeed.
        Code::ResourceExhausted if delay.is_some() => Retry::After(delay),
        _ if std::error::Error::source(s).is_some() => Retry::After(None),
        _ => Retry::No,
    }
}

/// google.rpc.Status, as in grpc-status-details-bin.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<ProtoAny>,
}

/// google.protobuf.Any.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProtoAny {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// google.rpc.RetryInfo.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<ProtoDuration>,
}

/// google.protobuf.Duration.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProtoDuration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

pub const RETRY_INFO_TYPE: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The RetryInfo delay among a status's details, if any.
fn retry_info(details: &[u8]) -> Option<Duration> {
    use prost::Message as _;
    if details.is_empty() {
        return None;
    }
    let st = RpcStatus::decode(details).ok()?;
    let any = st.details.iter().find(|a| a.type_url == RETRY_INFO_TYPE)?;
    let d = RetryInfo::decode(&any.value[..]).ok()?.retry_delay?;
    let secs = u64::try_from(d.seconds).ok()?;
    let nanos = u32::try_from(d.nanos).ok().filter(|&n| n < 1_000_000_000)?;
    Some(Duration::new(secs, nanos))
}

/// The waits between one batch's attempts.
pub struct Backoff {
    nominal: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            nominal: FIRST_BACKOFF,
        }
    }
}

impl Backoff {
    /// The wait before the next attempt: the back-off with jitter, or the
    /// server's delay (cut to MAX_SERVER_DELAY) when that is longer.
    pub fn next(&mut self, server: Option<Duration>) -> Duration {
        let own = self
            .nominal
            .mul_f64(1.0 + JITTER * (2.0 * unit_random() - 1.0));
        self.nominal = (self.nominal * 2).min(MAX_BACKOFF);
        server.map_or(own, |s| s.min(MAX_SERVER_DELAY).max(own))
    }
}

/// A number in [0, 1) that differs between calls and processes (std's
/// randomly keyed hasher over the clock; no generator needed for jitter).
fn unit_random() -> f64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    #[test]
    fn http_statuses_follow_the_spec() {
        assert_eq!(http(503, None), Retry::After(None));
        assert_eq!(
            http(429, Some("3")),
            Retry::After(Some(Duration::from_secs(3)))
        );
        assert_eq!(http(502, Some("soon")), Retry::After(None));
        assert_eq!(http(400, Some("3")), Retry::No);
        assert_eq!(http(500, None), Retry::No);
        assert_eq!(http(404, None), Retry::Refused);
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(60));
        let Retry::After(Some(d)) = http(503, Some(&later)) else {
            panic!("an HTTP-date is a delay");
        };
        assert!(
            d > Duration::from_secs(58) && d <= Duration::from_secs(60),
            "{d:?}"
        );
    }

    fn with_retry_info(code: tonic::Code, delay: Option<Duration>) -> tonic::Status {
        let details = delay.map(|d| {
            let info = RetryInfo {
                retry_delay: Some(ProtoDuration {
                    seconds: d.as_secs() as i64,
                    nanos: d.subsec_nanos() as i32,
                }),
            };
            RpcStatus {
                code: code as i32,
                message: String::new(),
                details: vec![ProtoAny {
                    type_url: RETRY_INFO_TYPE.into(),
                    value: info.encode_to_vec(),
                }],
            }
            .encode_to_vec()
        });
        tonic::Status::with_details(code, "x", details.unwrap_or_default().into())
    }

    #[test]
    fn grpc_codes_follow_the_spec() {
        use tonic::Code;
        let d = Some(Duration::from_millis(1500));
        assert_eq!(
            grpc(&with_retry_info(Code::Unavailable, None)),
            Retry::After(None)
        );
        assert_eq!(
            grpc(&with_retry_info(Code::Unavailable, d)),
            Retry::After(d)
        );
        assert_eq!(
            grpc(&with_retry_info(Code::ResourceExhausted, d)),
            Retry::After(d)
        );
        assert_eq!(
            grpc(&with_retry_info(Code::ResourceExhausted, None)),
            Retry::No
        );
        assert_eq!(
            grpc(&with_retry_info(Code::InvalidArgument, None)),
            Retry::No
        );
        assert_eq!(
            grpc(&with_retry_info(Code::Unimplemented, None)),
            Retry::Refused
        );
        let local = tonic::Status::from_error(Box::new(std::io::Error::other("refused")));
        assert!(matches!(grpc(&local), Retry::After(None)), "{local:?}");
    }

    #[test]
    fn backoff_doubles_with_jitter_and_waits_for_the_server() {
        let mut b = Backoff::default();
        for nominal in [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0] {
            let d = b.next(None).as_secs_f64();
            assert!(
                d >= nominal * (1.0 - JITTER) && d <= nominal * (1.0 + JITTER),
                "{d} s for a nominal {nominal} s"
            );
        }
        let mut b = Backoff::default();
        assert_eq!(b.next(Some(Duration::from_secs(2))), Duration::from_secs(2));
        assert_eq!(b.next(Some(Duration::from_secs(600))), MAX_SERVER_DELAY);
        let d = b.next(Some(Duration::ZERO));
        assert!(
            d >= Duration::from_millis(640),
            "the own back-off is kept: {d:?}"
        );
    }
}
