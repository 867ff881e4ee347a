//! One histogram series (sixteen bucket bounds and an overflow bucket), and
//! the bounds of the series the pool records keep. A leaf: the pools keep
//! their histograms in it and the metrics exporter writes them.

/// A connection's age at close, in seconds: 10 ms to an hour.
pub const AGE_BUCKETS: [f64; 16] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 2700.0,
    3600.0,
];

/// Requests per connection: powers of two, 1 to 32768.
pub const REQUEST_BUCKETS: [f64; 16] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
    16384.0, 32768.0,
];

/// One histogram series' buckets.
#[derive(Clone, Debug, Default)]
pub struct Hist {
    /// One count per bucket, plus the overflow bucket.
    pub(crate) counts: [u64; 17],
    pub(crate) sum: f64,
    pub(crate) count: u64,
}

impl Hist {
    /// Values observed.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Adds another series' observations (same bounds).
    pub fn add(&mut self, o: &Hist) {
        for (c, n) in self.counts.iter_mut().zip(o.counts) {
            *c += n;
        }
        self.sum += o.sum;
        self.count += o.count;
    }

    pub fn observe(&mut self, bounds: &[f64; 16], v: f64) {
        let i = bounds.iter().position(|&b| v <= b).unwrap_or(bounds.len());
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }
}
