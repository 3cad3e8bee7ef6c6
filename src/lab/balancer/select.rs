//! Choosing a backend: the strategies of seeds/000 and seeds/003, with nginx's
//! algorithms where nginx has one. Pure: no I/O, no clock; the caller says which
//! backends are usable and how much weight each has now.

use std::{fmt, str::FromStr};

use rand::{RngExt, rngs::SmallRng};

/// How a backend is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Each usable backend in turn, weights ignored.
    Rr,
    /// Smooth weighted round robin, nginx's: weights 5,1,1 give a a b a c a a.
    Wrr,
    /// Fewest requests in flight relative to weight; ties in turn.
    Least,
    /// A hash of the client's address (all of it: on loopback nginx's /24 would put
    /// every client on one backend).
    IpHash,
    /// nginx's `hash`: 15 bits of the key's CRC-32 modulo the total weight,
    /// rehashed past unusable backends as nginx does.
    Hash,
    /// A ring with 160 points per unit of weight: removing a backend moves only its
    /// keys.
    Consistent,
    /// Two usable backends at random, the one with fewer in flight.
    Random2,
}

impl Strategy {
    /// Every strategy, by its flag name.
    pub const ALL: [(&'static str, Strategy); 7] = [
        ("rr", Strategy::Rr),
        ("wrr", Strategy::Wrr),
        ("least", Strategy::Least),
        ("ip-hash", Strategy::IpHash),
        ("hash", Strategy::Hash),
        ("consistent", Strategy::Consistent),
        ("random2", Strategy::Random2),
    ];

    /// Whether it needs a key per request.
    pub fn keyed(self) -> bool {
        matches!(
            self,
            Strategy::IpHash | Strategy::Hash | Strategy::Consistent
        )
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Strategy, String> {
        Strategy::ALL
            .iter()
            .find(|(name, _)| *name == s)
            .map(|(_, strategy)| *strategy)
            .ok_or_else(|| {
                let names: Vec<_> = Strategy::ALL.iter().map(|(n, _)| *n).collect();
                format!("unknown strategy {s:?}; one of {}", names.join(", "))
            })
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Strategy::ALL
            .iter()
            .find(|(_, s)| s == self)
            .map(|(n, _)| *n)
            .expect("every strategy is in ALL");
        f.write_str(name)
    }
}

/// One backend as the selector sees it for one choice.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    /// Whether it may take the request (up, not draining, not already tried).
    pub usable: bool,
    /// Its weight now, in thousandths (slow start scales it down).
    pub weight: u64,
    /// Requests in flight.
    pub inflight: u64,
}

/// The state a strategy keeps between choices.
#[derive(Debug)]
pub struct Selector {
    strategy: Strategy,
    current: Vec<i64>,
    next: usize,
    ring: Vec<(u64, usize)>,
    weights: Vec<u32>,
    rng: SmallRng,
}

/// Points on the consistent-hash ring per unit of weight (ketama's figure).
const POINTS: u32 = 160;
/// Rehashes before `hash`/`ip-hash` fall back to weighted round robin (nginx: 20).
const REHASHES: u32 = 20;

impl Selector {
    /// A selector over backends with these configured weights (≥ 1) and names.
    pub fn new(strategy: Strategy, backends: &[(&str, u32)], rng: SmallRng) -> Selector {
        let mut ring = Vec::new();
        if strategy == Strategy::Consistent {
            for (index, (name, weight)) in backends.iter().enumerate() {
                for point in 0..POINTS * weight.max(&1) {
                    ring.push((hash(format!("{name}-{point}").as_bytes()), index));
                }
            }
            ring.sort_unstable();
        }
        Selector {
            strategy,
            current: vec![0; backends.len()],
            next: 0,
            ring,
            weights: backends.iter().map(|(_, w)| (*w).max(1)).collect(),
            rng,
        }
    }

    /// The backend for one request, or `None` when no candidate is usable. `key`
    /// feeds the hashing strategies; without one they use weighted round robin.
    pub fn pick(&mut self, candidates: &[Candidate], key: Option<&[u8]>) -> Option<usize> {
        match (self.strategy, key) {
            (Strategy::Rr, _) => {
                let equal: Vec<_> = candidates
                    .iter()
                    .map(|c| Candidate {
                        weight: if c.weight > 0 { 1000 } else { 0 },
                        ..*c
                    })
                    .collect();
                self.smooth(&equal)
            }
            (Strategy::Wrr, _) => self.smooth(candidates),
            (Strategy::Least, _) => self.least(candidates),
            (Strategy::Random2, _) => self.random2(candidates),
            (Strategy::IpHash | Strategy::Hash, Some(key)) => {
                // nginx's `hash` (ngx_http_upstream_hash_module): 15 bits of the
                // key's CRC-32, modulo the total configured weight, walked through
                // the backends by weight; on an unusable one, the CRC of the attempt
                // number and the key is added and the walk starts again.
                let total: u64 = self.weights.iter().map(|&w| u64::from(w)).sum();
                let bits = |crc: u32| u64::from((crc >> 16) & 0x7fff);
                let mut h = bits(crc32(key, 0));
                for attempt in 0..REHASHES {
                    let mut w = h % total.max(1);
                    let index = self
                        .weights
                        .iter()
                        .position(|&weight| {
                            let hit = w < u64::from(weight);
                            w = w.saturating_sub(u64::from(weight));
                            hit
                        })
                        .unwrap_or(0);
                    if candidates[index].usable {
                        return Some(index);
                    }
                    let again = crc32(key, crc32((attempt + 1).to_string().as_bytes(), 0));
                    h += bits(again);
                }
                self.smooth(candidates)
            }
            (Strategy::Consistent, Some(key)) => {
                let h = hash(key);
                let start = self.ring.partition_point(|(point, _)| *point < h);
                (0..self.ring.len())
                    .map(|i| self.ring[(start + i) % self.ring.len()].1)
                    .find(|&index| candidates[index].usable)
            }
            (_, None) => self.smooth(candidates),
        }
    }

    /// nginx's smooth weighted round robin over the usable candidates.
    fn smooth(&mut self, candidates: &[Candidate]) -> Option<usize> {
        let mut total = 0i64;
        let mut best: Option<usize> = None;
        for (index, c) in candidates.iter().enumerate() {
            if !c.usable || c.weight == 0 {
                continue;
            }
            let weight = c.weight as i64;
            self.current[index] += weight;
            total += weight;
            if best.is_none_or(|b| self.current[index] > self.current[b]) {
                best = Some(index);
            }
        }
        let best = best?;
        self.current[best] -= total;
        Some(best)
    }

    /// Fewest in flight per unit of weight; among equals, the first after the last
    /// choice, so ties rotate.
    fn least(&mut self, candidates: &[Candidate]) -> Option<usize> {
        let n = candidates.len();
        let mut best: Option<(usize, u128)> = None;
        for offset in 0..n {
            let index = (self.next + offset) % n;
            let c = candidates[index];
            if !c.usable || c.weight == 0 {
                continue;
            }
            // inflight / weight compared without division: scaled by the weights'
            // common range.
            let load = (u128::from(c.inflight) << 32) / u128::from(c.weight);
            if best.is_none_or(|(_, l)| load < l) {
                best = Some((index, load));
            }
        }
        let (index, _) = best?;
        self.next = (index + 1) % n;
        Some(index)
    }

    fn random2(&mut self, candidates: &[Candidate]) -> Option<usize> {
        let usable: Vec<usize> = (0..candidates.len())
            .filter(|&i| candidates[i].usable && candidates[i].weight > 0)
            .collect();
        match usable.len() {
            0 => None,
            1 => Some(usable[0]),
            n => {
                let a = self.rng.random_range(0..n);
                let mut b = self.rng.random_range(0..n - 1);
                if b >= a {
                    b += 1;
                }
                let (a, b) = (usable[a], usable[b]);
                Some(if candidates[b].inflight < candidates[a].inflight {
                    b
                } else {
                    a
                })
            }
        }
    }
}

/// Where a key falls: stable across runs, so a case's key→backend map is too.
fn hash(key: &[u8]) -> u64 {
    crate::seed::hash(0, &[key])
}

/// CRC-32 (IEEE, as zlib and nginx's `ngx_crc32_long`) of `bytes`, continuing from
/// `crc` (0 to start).
fn crc32(bytes: &[u8], crc: u32) -> u32 {
    let mut crc = !crc;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn selector(strategy: Strategy, weights: &[u32]) -> Selector {
        let names: Vec<String> = (0..weights.len()).map(|i| format!("b{i}")).collect();
        let backends: Vec<(&str, u32)> = names
            .iter()
            .zip(weights)
            .map(|(n, w)| (n.as_str(), *w))
            .collect();
        Selector::new(strategy, &backends, SmallRng::seed_from_u64(1))
    }

    fn up(weights: &[u32]) -> Vec<Candidate> {
        weights
            .iter()
            .map(|&w| Candidate {
                usable: true,
                weight: u64::from(w) * 1000,
                inflight: 0,
            })
            .collect()
    }

    #[test]
    fn smooth_wrr_gives_nginx_sequence() {
        let mut s = selector(Strategy::Wrr, &[5, 1, 1]);
        let c = up(&[5, 1, 1]);
        let seq: Vec<_> = (0..7).map(|_| s.pick(&c, None).unwrap()).collect();
        assert_eq!(seq, [0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn rr_is_exactly_even_and_skips_unusable() {
        let mut s = selector(Strategy::Rr, &[3, 1, 1]);
        let mut c = up(&[3, 1, 1]);
        let seq: Vec<_> = (0..6).map(|_| s.pick(&c, None).unwrap()).collect();
        assert_eq!(seq, [0, 1, 2, 0, 1, 2]);
        c[1].usable = false;
        let seq: Vec<_> = (0..4).map(|_| s.pick(&c, None).unwrap()).collect();
        assert!(seq.iter().all(|&i| i != 1));
        assert_eq!(seq.iter().filter(|&&i| i == 0).count(), 2);
    }

    #[test]
    fn least_prefers_fewest_in_flight_and_rotates_ties() {
        let mut s = selector(Strategy::Least, &[1, 1, 1]);
        let mut c = up(&[1, 1, 1]);
        c[0].inflight = 3;
        c[1].inflight = 1;
        c[2].inflight = 1;
        assert_eq!(s.pick(&c, None), Some(1));
        assert_eq!(s.pick(&c, None), Some(2));
        assert_eq!(s.pick(&c, None), Some(1));
    }

    #[test]
    fn consistent_hash_moves_only_the_removed_backends_keys() {
        let mut s = selector(Strategy::Consistent, &[1, 1, 1, 1]);
        let mut c = up(&[1, 1, 1, 1]);
        let keys: Vec<String> = (0..2000).map(|i| format!("session-{i}")).collect();
        let before: Vec<_> = keys
            .iter()
            .map(|k| s.pick(&c, Some(k.as_bytes())).unwrap())
            .collect();
        for b in 0..4 {
            let share = before.iter().filter(|&&i| i == b).count();
            assert!(
                (300..700).contains(&share),
                "backend {b} got {share} of 2000"
            );
        }
        c[3].usable = false;
        for (key, was) in keys.iter().zip(&before) {
            let now = s.pick(&c, Some(key.as_bytes())).unwrap();
            if *was == 3 {
                assert_ne!(now, 3);
            } else {
                assert_eq!(now, *was, "{key} moved off a live backend");
            }
        }
    }

    #[test]
    fn hash_is_stable_per_key_and_rehashes_past_unusable() {
        let mut s = selector(Strategy::Hash, &[1, 1, 1]);
        let mut c = up(&[1, 1, 1]);
        let first = s.pick(&c, Some(b"k")).unwrap();
        assert!((0..50).all(|_| s.pick(&c, Some(b"k")) == Some(first)));
        c[first].usable = false;
        let second = s.pick(&c, Some(b"k")).unwrap();
        assert_ne!(second, first);
    }

    #[test]
    fn crc32_matches_zlib() {
        assert_eq!(crc32(b"123456789", 0), 0xCBF4_3926);
        assert_eq!(crc32(b"6789", crc32(b"12345", 0)), 0xCBF4_3926);
    }

    #[test]
    fn hash_walks_the_weights_like_nginx() {
        // ((zlib.crc32(b"s0") >> 16) & 0x7fff) % 4 … for s0..s3 is 2, 1, 0, 3: with
        // weights 2, 1, 1 (slots 0-1 → a, 2 → b, 3 → c) that is b, a, a, c — what
        // nginx 1.22's `hash $http_x_session` picks.
        let mut s = selector(Strategy::Hash, &[2, 1, 1]);
        let c = up(&[2, 1, 1]);
        let picks: Vec<_> = ["s0", "s1", "s2", "s3"]
            .iter()
            .map(|k| s.pick(&c, Some(k.as_bytes())).unwrap())
            .collect();
        assert_eq!(picks, [1, 0, 0, 2]);
    }

    #[test]
    fn nothing_usable_picks_nothing() {
        for (_, strategy) in Strategy::ALL {
            let mut s = selector(strategy, &[1, 1]);
            let mut c = up(&[1, 1]);
            c.iter_mut().for_each(|c| c.usable = false);
            assert_eq!(s.pick(&c, Some(b"k")), None, "{strategy}");
        }
    }

    #[test]
    fn random2_takes_the_less_loaded_of_two() {
        let mut s = selector(Strategy::Random2, &[1, 1]);
        let mut c = up(&[1, 1]);
        c[0].inflight = 10;
        assert!((0..50).all(|_| s.pick(&c, None) == Some(1)));
    }
}
