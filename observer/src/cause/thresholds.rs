//! The limits above which a phase counts as slow: defaults, settable by
//! flags, printed with every verdict so a reader knows what "slow" meant.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, schemars::JsonSchema, clap::Args)]
pub struct Thresholds {
    /// A name lookup slower than this is slow (milliseconds).
    #[arg(long = "dns-ms", value_name = "MS", default_value_t = 100.0, value_parser = parse_ms)]
    pub dns_ms: f64,
    /// A TCP connect (SYN to established) slower than this is slow.
    #[arg(long = "connect-ms", value_name = "MS", default_value_t = 100.0, value_parser = parse_ms)]
    pub connect_ms: f64,
    /// A TLS handshake (or the client's TLS setup before it) slower than this.
    #[arg(long = "tls-ms", value_name = "MS", default_value_t = 200.0, value_parser = parse_ms)]
    pub tls_ms: f64,
    /// The wait for the answer's first byte (LLM calls: first token).
    #[arg(long = "ttfb-ms", value_name = "MS", default_value_t = 1000.0, value_parser = parse_ms)]
    pub ttfb_ms: f64,
    /// A pause between two events of a stream longer than this is a stall.
    #[arg(long = "stream-gap-ms", value_name = "MS", default_value_t = 1000.0, value_parser = parse_ms)]
    pub stream_gap_ms: f64,
    /// A token stream slower than this, over at least --ttfb-ms, is slow.
    #[arg(long = "tokens-per-s", value_name = "N", default_value_t = 20.0, value_parser = parse_rate)]
    pub tokens_per_s: f64,
    /// A GPU of the process (or of the server on this host) at or above this
    /// utilization during the wait is busy (percent).
    #[arg(long = "gpu-util", value_name = "PCT", default_value_t = 90, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub gpu_util_pct: u32,
    /// More retransmitted segments than this during a call are a network fault.
    #[arg(long = "retransmits", value_name = "N", default_value_t = 0)]
    pub retransmits: u32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            dns_ms: 100.0,
            connect_ms: 100.0,
            tls_ms: 200.0,
            ttfb_ms: 1000.0,
            stream_gap_ms: 1000.0,
            tokens_per_s: 20.0,
            gpu_util_pct: 90,
            retransmits: 0,
        }
    }
}

/// Milliseconds to nanoseconds, for comparisons with the records' figures.
pub fn ns(ms: f64) -> u64 {
    (ms * 1e6) as u64
}

impl Thresholds {
    /// The line the text output starts with.
    pub fn summary(&self) -> String {
        format!(
            "thresholds: dns {} ms, connect {} ms, tls {} ms, first byte {} ms, stream gap {} ms, \
             {} tokens/s, gpu {}%, retransmits > {}",
            self.dns_ms,
            self.connect_ms,
            self.tls_ms,
            self.ttfb_ms,
            self.stream_gap_ms,
            self.tokens_per_s,
            self.gpu_util_pct,
            self.retransmits
        )
    }
}

fn parse_ms(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of milliseconds"))?;
    if !v.is_finite() || !(0.0..=3_600_000.0).contains(&v) {
        return Err(format!("`{s}` is out of range (0 to 3600000 ms)"));
    }
    Ok(v)
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("`{s}` must be 0 or more"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        t: Thresholds,
    }

    #[test]
    fn flags_default_to_the_struct_defaults_and_bad_values_are_refused() {
        let t = T::try_parse_from(["x"]).expect("parses").t;
        assert_eq!(t, Thresholds::default());
        let t = T::try_parse_from(["x", "--dns-ms", "50", "--gpu-util", "80"])
            .expect("parses")
            .t;
        assert_eq!((t.dns_ms, t.gpu_util_pct), (50.0, 80));
        for bad in [
            &["x", "--dns-ms", "-1"][..],
            &["x", "--ttfb-ms", "soon"],
            &["x", "--gpu-util", "101"],
            &["x", "--tokens-per-s", "NaN"],
        ] {
            assert!(T::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }
}
