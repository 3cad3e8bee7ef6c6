//! One generator of several: its share of a run (`--shard I/N`).

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

/// Shard `index` of `count`, counted from 0 as Kubernetes counts a Job's
/// completion indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// This generator's index.
    pub index: u64,
    /// Generators in all.
    pub count: u64,
}

impl Shard {
    /// The whole run, on one generator.
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// This shard's part of `total`: the parts of all shards add up to it and
    /// differ by at most one.
    pub fn share(&self, total: u64) -> u64 {
        let at = |i: u64| (u128::from(total) * u128::from(i) / u128::from(self.count)) as u64;
        at(self.index + 1) - at(self.index)
    }

    /// Whether item `n` of a numbered set (sessions) is this shard's.
    pub fn owns(&self, n: u64) -> bool {
        n % self.count == self.index
    }

    /// The run-wide number of this shard's `local`-th transaction: shards number
    /// theirs apart, so transaction ids and sessions never collide.
    pub fn global(&self, local: u64) -> u64 {
        local * self.count + self.index
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// Kubernetes sets this in each pod of an Indexed Job.
pub const COMPLETION_INDEX: &str = "JOB_COMPLETION_INDEX";

impl FromStr for Shard {
    type Err = String;

    /// `I/N`, or `N` alone with the index read from `JOB_COMPLETION_INDEX`.
    fn from_str(s: &str) -> Result<Shard, String> {
        let number = |what: &str, v: &str| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| format!("{s:?}: {what} {v:?} is not a whole number"))
        };
        let (index, count) = match s.split_once('/') {
            Some((i, n)) => (number("index", i)?, number("count", n)?),
            None => {
                let count = number("count", s)?;
                let index = std::env::var(COMPLETION_INDEX).map_err(|_| {
                    format!(
                        "{s:?}: no index given (I/N) and {COMPLETION_INDEX} is not set (Kubernetes sets it in an Indexed Job)"
                    )
                })?;
                (number(COMPLETION_INDEX, &index)?, count)
            }
        };
        if count == 0 || index >= count {
            return Err(format!(
                "{s:?}: the index counts from 0 and must be below the count (0/2 and 1/2 are the two shards of 2)"
            ));
        }
        Ok(Shard { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_and_differ_by_one_at_most() {
        for (total, count) in [(10, 3), (1, 2), (7, 7), (100_000, 6), (0, 4)] {
            let parts: Vec<u64> = (0..count)
                .map(|index| Shard { index, count }.share(total))
                .collect();
            assert_eq!(parts.iter().sum::<u64>(), total, "{total}/{count}");
            let (lo, hi) = (parts.iter().min().unwrap(), parts.iter().max().unwrap());
            assert!(hi - lo <= 1, "{total}/{count}: {parts:?}");
        }
        // Numbers handed out by two shards never meet.
        let (a, b) = (Shard { index: 0, count: 2 }, Shard { index: 1, count: 2 });
        let ours: Vec<u64> = (0..5).map(|k| a.global(k)).collect();
        assert!(
            (0..5)
                .map(|k| b.global(k))
                .all(|n| !ours.contains(&n) && b.owns(n))
        );
    }

    #[test]
    fn a_shard_parses_or_says_why() {
        assert_eq!("1/3".parse::<Shard>(), Ok(Shard { index: 1, count: 3 }));
        for (bad, why) in [
            ("3/3", "below the count"),
            ("0/0", "below the count"),
            ("a/2", "index \"a\""),
            ("1/x", "count \"x\""),
        ] {
            let err = bad.parse::<Shard>().unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
