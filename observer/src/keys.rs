//! Maps keyed by kernel-given numbers (socket addresses, pids): hashed by
//! one multiply-xorshift mix instead of SipHash, which was 2-3% of the
//! daemon's CPU under connection churn (bench/NOTES.md). The keys come from
//! the kernel, not from the traffic, so nobody outside can choose them to
//! collide.

use std::{
    collections::{HashMap, HashSet},
    hash::{BuildHasherDefault, Hasher},
};

/// A map keyed by a kernel-given number.
pub type NumMap<K, V> = HashMap<K, V, BuildHasherDefault<NumHasher>>;
/// A set of kernel-given numbers.
pub type NumSet<K> = HashSet<K, BuildHasherDefault<NumHasher>>;

/// SplitMix64's finalizer over the key's bits: socket addresses differ
/// only in their middle bits, and every output bit depends on every input
/// bit.
#[derive(Default)]
pub struct NumHasher(u64);

impl Hasher for NumHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        // Keys other than plain numbers (arrays of bytes): folded 8 at a time.
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_addresses_spread_over_the_buckets() {
        use std::hash::BuildHasher;
        let b = BuildHasherDefault::<NumHasher>::default();
        // Socket addresses 2 KiB apart: the low 11 bits never change.
        let mut low = HashSet::new();
        for i in 0..1024u64 {
            low.insert(b.hash_one(0xffff_8880_0000_0000 + i * 2048) & 1023);
        }
        assert!(low.len() > 600, "{} of 1024 buckets", low.len());
        let mut m: NumMap<u64, u64> = NumMap::default();
        for i in 0..1000 {
            m.insert(i * 4096, i);
        }
        assert_eq!(m.get(&(999 * 4096)), Some(&999));
    }
}
