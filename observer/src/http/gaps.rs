//! The gaps between a call's content events, in fixed memory: a log-linear
//! histogram (32 buckets per power of two, so a quantile is within 1.6% of
//! the true gap) beside the exact count, sum and maximum.

use std::collections::BTreeMap;

/// Buckets per power of two, as a shift.
const SUB_BITS: u32 = 5;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gaps {
    buckets: BTreeMap<u16, u32>,
    pub count: u32,
    pub sum_ns: u64,
    pub max_ns: u64,
}

fn bucket(ns: u64) -> u16 {
    if ns < 1 << SUB_BITS {
        return ns as u16;
    }
    let log = 63 - ns.leading_zeros();
    let sub = (ns >> (log - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    ((log - SUB_BITS + 1) << SUB_BITS) as u16 | sub as u16
}

/// The middle of a bucket's range.
fn middle(b: u16) -> u64 {
    let b = u64::from(b);
    if b < 1 << SUB_BITS {
        return b;
    }
    let shift = (b >> SUB_BITS) - 1;
    let low = ((1 << SUB_BITS) | (b & ((1 << SUB_BITS) - 1))) << shift;
    low + (1 << shift) / 2
}

impl Gaps {
    pub fn add(&mut self, ns: u64) {
        *self.buckets.entry(bucket(ns)).or_default() += 1;
        self.count += 1;
        self.sum_ns += ns;
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn mean_ns(&self) -> Option<u64> {
        (self.count > 0).then(|| self.sum_ns / u64::from(self.count))
    }

    /// The gap at quantile `q` (0..=1): the smallest with at least that
    /// share of gaps at or below it.
    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q * f64::from(self.count)).ceil() as u32).max(1);
        let mut seen = 0;
        for (&b, &n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return Some(middle(b).min(self.max_ns));
            }
        }
        Some(self.max_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_within_two_percent() {
        for ns in [
            0,
            1,
            31,
            32,
            33,
            1000,
            29_999_999,
            30_000_000,
            4_000_000_000,
            u64::MAX / 3,
        ] {
            let m = middle(bucket(ns));
            let err = (m as f64 - ns as f64).abs() / (ns.max(1) as f64);
            assert!(err <= 1.0 / 64.0 + 1e-9, "{ns}: {m} ({err})");
        }
        let mut last = 0;
        for ns in (0..100_000).step_by(7) {
            let b = bucket(ns);
            assert!(b >= last, "monotone at {ns}");
            last = b;
        }
    }

    #[test]
    fn quantiles() {
        let mut g = Gaps::default();
        assert_eq!(g.quantile_ns(0.5), None);
        for ms in [10u64, 20, 30, 40, 1000] {
            g.add(ms * 1_000_000);
        }
        let near = |got: Option<u64>, want: u64| {
            let got = got.expect("some") as f64;
            assert!(
                (got - want as f64).abs() <= want as f64 / 64.0,
                "{got} vs {want}"
            );
        };
        near(g.quantile_ns(0.5), 30_000_000);
        near(g.quantile_ns(0.99), 1_000_000_000);
        assert_eq!(g.max_ns, 1_000_000_000);
        assert_eq!(g.mean_ns(), Some(220_000_000));
    }
}
