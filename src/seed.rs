//! The run's seed, and the RNGs derived from it.
//!
//! Every random choice in a run (toxicity draws, jitter, slice sizes, losses) comes
//! from an RNG seeded by the run's seed and the names of what it is for, so the same
//! seed gives the same choices whatever order connections arrive or tasks run in.

use rand::{SeedableRng, rngs::SmallRng};

/// An RNG for one purpose: the run's `seed` mixed with `parts` (proxy name,
/// connection id, fault name …). Stable across runs, platforms and Rust versions.
pub fn rng(seed: u64, parts: &[&[u8]]) -> SmallRng {
    SmallRng::seed_from_u64(hash(seed, parts))
}

/// A fresh seed for a run that was given none.
pub fn fresh() -> u64 {
    rand::random()
}

/// A stable 64-bit hash of `parts` under `seed`: the same inputs give the same value
/// on every run and machine.
pub fn hash(seed: u64, parts: &[&[u8]]) -> u64 {
    // FNV-1a over the parts (with a separator so ["ab","c"] != ["a","bc"]), then
    // splitmix64's finaliser to spread the bits.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for part in parts {
        for &b in part.iter().chain(&[0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngExt;

    #[test]
    fn same_seed_and_parts_give_the_same_draws() {
        let a: u64 = rng(42, &[b"p", b"1"]).random();
        let b: u64 = rng(42, &[b"p", b"1"]).random();
        let c: u64 = rng(42, &[b"p1"]).random();
        let d: u64 = rng(43, &[b"p", b"1"]).random();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }
}
