//! Draining a proxied backend: what happens to new and open connections when a
//! backend is taken out of service, in four ways.

use std::{str::FromStr, time::Duration};

use serde::{Deserialize, Serialize};

/// How a drain treats what is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DrainMode {
    /// Open connections finish: idle HTTP/1.1 keep-alive connections close, responses
    /// in flight carry `Connection: close`, HTTP/2 connections get GOAWAY and their
    /// open streams finish. TCP connections run until their peers close them.
    Graceful,
    /// Graceful, with responses in flight paced to `rate` KB/s (HTTP mode).
    Slow,
    /// Graceful, then whatever is still open after `timeout` is reset.
    Deadline,
    /// Everything reset at once.
    Abrupt,
    /// As orchestrators drain: for `grace` ms health probes fail (HTTP 503) while
    /// data is served as before and the listeners accept, then a graceful drain
    /// (a deadline drain if `timeout` is given).
    Readiness,
}

/// What a draining proxy does with new connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NewConns {
    /// The listener closes: connects get RST (ECONNREFUSED).
    #[default]
    Refuse,
    /// The listener stays but nothing is accepted: connects queue, then time out.
    Ignore,
}

/// A drain as the CLI, fault files and the API describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drain {
    /// How open connections are treated.
    pub mode: DrainMode,
    /// `deadline`: how long open connections get, ms.
    #[serde(default)]
    pub timeout: u64,
    /// What new connections get.
    #[serde(default)]
    pub new: NewConns,
    /// `slow`: the pace of responses in flight, KB/s (K = 1000).
    #[serde(default)]
    pub rate: u64,
    /// `readiness`: how long probes fail before the drain, ms.
    #[serde(default)]
    pub grace: u64,
}

impl Drain {
    /// Checks the fields that go together.
    pub fn validate(&self) -> Result<(), String> {
        match self.mode {
            DrainMode::Deadline if self.timeout == 0 => {
                Err("a deadline drain needs timeout > 0 (ms)".into())
            }
            DrainMode::Slow if self.rate == 0 => Err("a slow drain needs rate > 0 (KB/s)".into()),
            DrainMode::Readiness if self.grace == 0 => {
                Err("a readiness drain needs grace > 0 (ms of failing probes first)".into())
            }
            _ => Ok(()),
        }
    }

    /// The deadline drain's grace period.
    pub fn deadline(&self) -> Option<Duration> {
        (self.mode == DrainMode::Deadline).then(|| Duration::from_millis(self.timeout))
    }

    /// `readiness`: how long probes fail first, and the drain that follows.
    pub fn readiness(&self) -> Option<(Duration, Drain)> {
        (self.mode == DrainMode::Readiness).then(|| {
            let mode = if self.timeout > 0 {
                DrainMode::Deadline
            } else {
                DrainMode::Graceful
            };
            (Duration::from_millis(self.grace), Drain { mode, ..*self })
        })
    }
}

/// `MODE[:key=value,...][@OFFSET]`, the CLI's `--drain`: e.g.
/// `deadline:timeout=2000,new=ignore@5s` drains 5 s into the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainAt {
    /// The drain.
    pub drain: Drain,
    /// When, from the start of the run.
    pub at: Duration,
}

impl FromStr for DrainAt {
    type Err = String;
    fn from_str(spec: &str) -> Result<DrainAt, String> {
        let (spec, at) = match spec.rsplit_once('@') {
            Some((s, at)) => (
                s,
                humantime::parse_duration(at).map_err(|e| format!("offset `{at}`: {e}"))?,
            ),
            None => (spec, Duration::ZERO),
        };
        Ok(DrainAt {
            drain: spec.parse()?,
            at,
        })
    }
}

/// `MODE[:key=value,...]`, as `snag ctl drain` takes it: e.g. `deadline:timeout=2000`.
impl FromStr for Drain {
    type Err = String;
    fn from_str(spec: &str) -> Result<Drain, String> {
        let (mode, rest) = spec.split_once(':').unwrap_or((spec, ""));
        let mode = match mode {
            "graceful" => DrainMode::Graceful,
            "slow" => DrainMode::Slow,
            "deadline" => DrainMode::Deadline,
            "abrupt" => DrainMode::Abrupt,
            "readiness" => DrainMode::Readiness,
            other => {
                return Err(format!(
                    "drain mode `{other}` is not graceful, slow, deadline, abrupt or readiness"
                ));
            }
        };
        let mut drain = Drain {
            mode,
            timeout: 0,
            new: NewConns::Refuse,
            rate: 0,
            grace: 0,
        };
        for pair in rest.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not key=value"))?;
            let number = || {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("{key} `{value}` is not a whole number"))
            };
            match key {
                "timeout" => drain.timeout = number()?,
                "rate" => drain.rate = number()?,
                "grace" => drain.grace = number()?,
                "new" => {
                    drain.new = match value {
                        "refuse" => NewConns::Refuse,
                        "ignore" => NewConns::Ignore,
                        _ => return Err(format!("new `{value}` is not refuse or ignore")),
                    }
                }
                _ => {
                    return Err(format!(
                        "unknown drain field `{key}` (timeout, new, rate, grace)"
                    ));
                }
            }
        }
        drain.validate()?;
        Ok(drain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_specs_parse_and_say_what_is_wrong() {
        let d: DrainAt = "deadline:timeout=2000,new=ignore@5s".parse().unwrap();
        assert_eq!(d.at, Duration::from_secs(5));
        assert_eq!(
            d.drain,
            Drain {
                mode: DrainMode::Deadline,
                timeout: 2000,
                new: NewConns::Ignore,
                rate: 0,
                grace: 0,
            }
        );
        let r: Drain = "readiness:grace=3000,timeout=500".parse().unwrap();
        let (grace, then) = r.readiness().unwrap();
        assert_eq!(grace, Duration::from_secs(3));
        assert_eq!((then.mode, then.timeout), (DrainMode::Deadline, 500));
        let r: Drain = "readiness:grace=3000".parse().unwrap();
        assert_eq!(r.readiness().unwrap().1.mode, DrainMode::Graceful);
        assert!(
            "readiness"
                .parse::<Drain>()
                .unwrap_err()
                .contains("grace > 0")
        );
        assert_eq!(
            "graceful".parse::<DrainAt>().unwrap().drain.mode,
            DrainMode::Graceful
        );
        assert!(
            "deadline"
                .parse::<DrainAt>()
                .unwrap_err()
                .contains("timeout > 0")
        );
        assert!("soft".parse::<DrainAt>().unwrap_err().contains("`soft`"));
        assert!(
            "graceful:new=maybe"
                .parse::<DrainAt>()
                .unwrap_err()
                .contains("refuse or ignore")
        );
    }
}
