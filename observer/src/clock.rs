//! Converts the kernel's CLOCK_MONOTONIC timestamps (`bpf_ktime_get_ns`) to wall
//! clock time.

/// Offset between CLOCK_REALTIME and CLOCK_MONOTONIC, sampled at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clock {
    offset_ns: i128,
}

fn now(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; these clocks always exist.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

/// Current CLOCK_MONOTONIC in nanoseconds, the clock eBPF timestamps use.
pub fn monotonic_ns() -> u64 {
    now(libc::CLOCK_MONOTONIC) as u64
}

impl Clock {
    /// Samples both clocks; the realtime sample is bracketed by two monotonic
    /// ones and compared with their midpoint, which halves the sampling error.
    pub fn sample() -> Self {
        let m1 = now(libc::CLOCK_MONOTONIC);
        let r = now(libc::CLOCK_REALTIME);
        let m2 = now(libc::CLOCK_MONOTONIC);
        Self {
            offset_ns: r - (m1 + m2) / 2,
        }
    }

    /// A clock with a fixed offset, for tests.
    pub const fn with_offset(offset_ns: i128) -> Self {
        Self { offset_ns }
    }

    /// Wall-clock nanoseconds since the Unix epoch for a monotonic timestamp.
    pub fn to_unix_ns(&self, monotonic_ns: u64) -> u64 {
        (i128::from(monotonic_ns) + self.offset_ns).max(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_with_offset() {
        let c = Clock::with_offset(1_000);
        assert_eq!(c.to_unix_ns(5), 1_005);
        assert_eq!(Clock::with_offset(-10).to_unix_ns(5), 0);
    }

    #[test]
    fn sampled_clock_matches_system_time() {
        let c = Clock::sample();
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after epoch")
            .as_nanos() as i128;
        let ours = i128::from(c.to_unix_ns(monotonic_ns()));
        assert!((wall - ours).abs() < 5_000_000, "off by {} ns", wall - ours);
    }
}
