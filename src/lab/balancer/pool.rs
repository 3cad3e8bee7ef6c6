//! The pool's bookkeeping, free of I/O and of the clock: every change takes the
//! instant it happens at, so rise/fall, passive marking and slow start are tested with
//! given instants.

use std::{collections::VecDeque, time::Duration};

use serde::Serialize;
use tokio::time::Instant;
use tracing::info;

use super::{
    Config, HealthCheck,
    select::{Candidate, Selector},
};

/// A backend's state as the balancer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Takes new requests.
    Up,
    /// Failed its checks or was marked failed.
    Down,
    /// Finishes what it has, takes nothing new.
    Draining,
}

/// One change of a backend's state.
#[derive(Debug, Clone, Serialize)]
pub struct Transition {
    /// Milliseconds since the balancer started.
    pub at_ms: f64,
    /// Before.
    pub from: State,
    /// After.
    pub to: State,
    /// What caused it.
    pub why: String,
}

/// One backend's standing and counts.
#[derive(Debug)]
pub struct Member {
    /// By the active checks.
    pub healthy: bool,
    passes: u32,
    fails_in_row: u32,
    /// Transport failures within the passive window.
    failures: VecDeque<Instant>,
    /// Marked failed until then.
    down_until: Option<Instant>,
    /// Told to drain.
    pub draining: bool,
    /// What the above make it.
    pub state: State,
    /// Since when it has been up: slow start ramps from here.
    up_since: Instant,
    /// Requests on it now.
    pub inflight: u64,
    /// Requests sent to it.
    pub requests: u64,
    /// Transport failures.
    pub errors: u64,
    /// Health checks made.
    pub checks: u64,
    /// The last check's result: `ok` or why it failed.
    pub last_check: Option<String>,
    /// Every state change.
    pub transitions: Vec<Transition>,
}

/// Every backend's standing, and the counts of the whole pool.
#[derive(Debug)]
pub struct Pool {
    ids: Vec<String>,
    weights: Vec<u32>,
    slow_start: Duration,
    max_fails: u32,
    fail_timeout: Duration,
    started: Instant,
    selector: Selector,
    /// In the configuration's order.
    pub members: Vec<Member>,
    /// Requests taken from clients.
    pub requests: u64,
    /// Requests that found no usable backend.
    pub no_backend: u64,
    /// Retries on another backend.
    pub retries: u64,
    /// Requests sent again because HTTP/2 said the backend never processed them
    /// (above a GOAWAY's last-stream-id, or REFUSED_STREAM).
    pub replays: u64,
    /// Idempotent requests sent again because their pooled connection closed
    /// before any answer (a backend's keep-alive timeout racing the reuse).
    pub stale_replays: u64,
}

impl Pool {
    /// Every backend up at `started`, past any slow start.
    pub fn new(config: &Config, started: Instant) -> Pool {
        let names: Vec<(&str, u32)> = config
            .backends
            .iter()
            .map(|b| (b.id.as_str(), b.weight))
            .collect();
        let rng = crate::seed::rng(config.seed, &[b"balancer"]);
        let members = config
            .backends
            .iter()
            .map(|_| Member {
                healthy: true,
                passes: 0,
                fails_in_row: 0,
                failures: VecDeque::new(),
                down_until: None,
                draining: false,
                state: State::Up,
                up_since: started.checked_sub(config.slow_start).unwrap_or(started),
                inflight: 0,
                requests: 0,
                errors: 0,
                checks: 0,
                last_check: None,
                transitions: Vec::new(),
            })
            .collect();
        Pool {
            ids: config.backends.iter().map(|b| b.id.clone()).collect(),
            weights: config.backends.iter().map(|b| b.weight).collect(),
            slow_start: config.slow_start,
            max_fails: config.max_fails,
            fail_timeout: config.fail_timeout,
            started,
            selector: Selector::new(config.strategy, &names, rng),
            members,
            requests: 0,
            no_backend: 0,
            retries: 0,
            replays: 0,
            stale_replays: 0,
        }
    }

    /// Lifts the passive marks that ran out by `now`.
    pub fn lift_expired(&mut self, now: Instant) {
        for index in 0..self.members.len() {
            self.refresh(index, now, "fail_timeout over");
        }
    }

    /// Recomputes backend `index`'s state; a change is a transition caused by `why`.
    fn refresh(&mut self, index: usize, now: Instant, why: &str) {
        let m = &mut self.members[index];
        if m.down_until.is_some_and(|until| until <= now) {
            m.down_until = None;
        }
        let state = if m.draining {
            State::Draining
        } else if !m.healthy || m.down_until.is_some() {
            State::Down
        } else {
            State::Up
        };
        if state != m.state {
            if state == State::Up && m.state == State::Down {
                m.up_since = now;
            }
            let at_ms = (now - self.started).as_secs_f64() * 1000.0;
            info!(backend = %self.ids[index], from = ?m.state, to = ?state, why, "backend state");
            m.transitions.push(Transition {
                at_ms,
                from: m.state,
                to: state,
                why: why.into(),
            });
            m.state = state;
        }
    }

    /// Puts backend `index` in drain (`true`) or back in rotation.
    pub fn set_draining(&mut self, index: usize, draining: bool, now: Instant) {
        self.members[index].draining = draining;
        let why = if draining { "drain" } else { "undrain" };
        self.refresh(index, now, why);
    }

    /// Backend `index`'s weight in thousandths, scaled down during slow start (never
    /// to nothing).
    pub fn weight(&self, index: usize, now: Instant) -> u64 {
        let full = u64::from(self.weights[index]) * 1000;
        let slow = self.slow_start;
        let since = now.saturating_duration_since(self.members[index].up_since);
        if slow.is_zero() || since >= slow {
            full
        } else {
            ((full as f64 * since.as_secs_f64() / slow.as_secs_f64()) as u64).max(1)
        }
    }

    /// Chooses a backend not in `tried` and counts the request on it.
    pub fn choose(&mut self, key: Option<&[u8]>, tried: &[bool], now: Instant) -> Option<usize> {
        self.lift_expired(now);
        let candidates: Vec<Candidate> = (0..self.members.len())
            .zip(tried)
            .map(|(index, tried)| Candidate {
                usable: self.members[index].state == State::Up && !tried,
                weight: self.weight(index, now),
                inflight: self.members[index].inflight,
            })
            .collect();
        let chosen = self.selector.pick(&candidates, key);
        if let Some(index) = chosen {
            let m = &mut self.members[index];
            m.inflight += 1;
            m.requests += 1;
        }
        chosen
    }

    /// A request to backend `index` is over.
    pub fn done(&mut self, index: usize) {
        self.members[index].inflight -= 1;
    }

    /// A request to backend `index` failed in transport at `now`: passive marking.
    pub fn failed(&mut self, index: usize, why: &str, now: Instant) {
        let (max_fails, window) = (self.max_fails, self.fail_timeout);
        let m = &mut self.members[index];
        m.errors += 1;
        if max_fails == 0 {
            return;
        }
        m.failures.push_back(now);
        while m
            .failures
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) > window)
        {
            m.failures.pop_front();
        }
        if m.failures.len() >= max_fails as usize {
            m.failures.clear();
            m.down_until = Some(now + window);
            self.refresh(index, now, &format!("{max_fails} failures: {why}"));
        }
    }

    /// One health check's result for backend `index`, at `now`.
    pub fn checked(
        &mut self,
        index: usize,
        result: Result<(), String>,
        rules: &HealthCheck,
        now: Instant,
    ) {
        let m = &mut self.members[index];
        m.checks += 1;
        let why = match &result {
            Ok(()) => {
                m.passes += 1;
                m.fails_in_row = 0;
                if !m.healthy && m.passes >= rules.rise {
                    m.healthy = true;
                }
                format!("{} checks passed", m.passes)
            }
            Err(err) => {
                m.fails_in_row += 1;
                m.passes = 0;
                if m.healthy && m.fails_in_row >= rules.fall {
                    m.healthy = false;
                }
                format!("{} checks failed, last: {err}", m.fails_in_row)
            }
        };
        m.last_check = Some(match result {
            Ok(()) => "ok".into(),
            Err(err) => err,
        });
        self.refresh(index, now, &why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::balancer::{BackendSpec, select::Strategy};

    fn config(n: usize, tune: impl FnOnce(&mut Config)) -> Config {
        let backends = (0..n)
            .map(|i| format!("b{i}=127.0.0.1:{}", 9000 + i).parse::<BackendSpec>())
            .collect::<Result<_, _>>()
            .unwrap();
        let mut config = Config::new(backends, 1);
        tune(&mut config);
        config
    }

    fn rules(rise: u32, fall: u32) -> HealthCheck {
        HealthCheck {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            rise,
            fall,
            path: "/health".into(),
            expect_body: None,
            grpc: false,
        }
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn fall_failures_in_a_row_take_a_backend_out_and_rise_passes_bring_it_back() {
        let t0 = Instant::now();
        let mut pool = Pool::new(&config(2, |_| {}), t0);
        let rules = rules(2, 3);
        let fail = || Err("status 503".to_string());
        pool.checked(0, fail(), &rules, t0 + secs(1.0));
        pool.checked(0, fail(), &rules, t0 + secs(2.0));
        // A pass in between starts the count again.
        pool.checked(0, Ok(()), &rules, t0 + secs(3.0));
        pool.checked(0, fail(), &rules, t0 + secs(4.0));
        pool.checked(0, fail(), &rules, t0 + secs(5.0));
        assert_eq!(pool.members[0].state, State::Up);
        pool.checked(0, fail(), &rules, t0 + secs(6.0));
        assert_eq!(pool.members[0].state, State::Down);
        let out = &pool.members[0].transitions[0];
        assert_eq!((out.at_ms, out.to), (6000.0, State::Down));
        assert_eq!(out.why, "3 checks failed, last: status 503");
        // Down, it takes nothing: every pick goes to b1.
        for _ in 0..4 {
            assert_eq!(pool.choose(None, &[false; 2], t0 + secs(6.5)), Some(1));
        }
        pool.checked(0, Ok(()), &rules, t0 + secs(7.0));
        assert_eq!(pool.members[0].state, State::Down);
        pool.checked(0, Ok(()), &rules, t0 + secs(8.0));
        assert_eq!(pool.members[0].state, State::Up);
        assert_eq!(pool.members[0].transitions[1].at_ms, 8000.0);
        assert_eq!(pool.members[0].checks, 8);
        assert_eq!(pool.members[0].last_check.as_deref(), Some("ok"));
    }

    #[test]
    fn passive_marking_counts_failures_within_its_window_and_lifts_after_it() {
        let t0 = Instant::now();
        let mut pool = Pool::new(
            &config(2, |c| {
                c.max_fails = 3;
                c.fail_timeout = secs(10.0);
            }),
            t0,
        );
        // Three failures, but the first falls out of the 10 s window before the third.
        pool.failed(0, "reset", t0);
        pool.failed(0, "reset", t0 + secs(5.0));
        pool.failed(0, "reset", t0 + secs(10.5));
        assert_eq!(pool.members[0].state, State::Up);
        pool.failed(0, "reset", t0 + secs(11.0));
        assert_eq!(pool.members[0].state, State::Down);
        assert_eq!(pool.members[0].errors, 4);
        // Out for fail_timeout: still out just before, back at it.
        pool.lift_expired(t0 + secs(20.9));
        assert_eq!(pool.members[0].state, State::Down);
        assert_eq!(pool.choose(None, &[false; 2], t0 + secs(21.0)), Some(0));
        assert_eq!(pool.members[0].state, State::Up);
        assert_eq!(pool.members[0].transitions[1].why, "fail_timeout over");
    }

    #[test]
    fn passive_marking_off_only_counts() {
        let t0 = Instant::now();
        let mut pool = Pool::new(&config(1, |_| {}), t0);
        for i in 0..100 {
            pool.failed(0, "reset", t0 + secs(f64::from(i) / 100.0));
        }
        assert_eq!(
            (pool.members[0].state, pool.members[0].errors),
            (State::Up, 100)
        );
    }

    #[test]
    fn slow_start_ramps_a_returning_backend_from_nothing_to_its_weight() {
        let t0 = Instant::now();
        let mut pool = Pool::new(
            &config(2, |c| {
                c.slow_start = secs(10.0);
                c.max_fails = 1;
                c.fail_timeout = secs(1.0);
            }),
            t0,
        );
        // At start every backend is past its slow start.
        assert_eq!(pool.weight(0, t0), 1000);
        pool.failed(0, "reset", t0 + secs(1.0));
        pool.lift_expired(t0 + secs(2.0));
        assert_eq!(pool.members[0].state, State::Up);
        assert_eq!(pool.weight(0, t0 + secs(2.0)), 1, "never nothing");
        assert_eq!(pool.weight(0, t0 + secs(4.5)), 250);
        assert_eq!(pool.weight(0, t0 + secs(7.0)), 500);
        assert_eq!(pool.weight(0, t0 + secs(12.0)), 1000);
        assert_eq!(pool.weight(1, t0 + secs(4.5)), 1000);
    }

    #[test]
    fn slow_start_shows_in_what_weighted_round_robin_picks() {
        let t0 = Instant::now();
        let mut pool = Pool::new(
            &config(2, |c| {
                c.strategy = Strategy::Wrr;
                c.slow_start = secs(10.0);
                c.max_fails = 1;
                c.fail_timeout = secs(1.0);
            }),
            t0,
        );
        pool.failed(0, "reset", t0);
        pool.lift_expired(t0 + secs(1.0));
        // A quarter of the way up: about a fifth of the picks (250 of 1250).
        let at = t0 + secs(3.5);
        let mut picks = [0u32; 2];
        for _ in 0..1000 {
            let i = pool.choose(None, &[false; 2], at).unwrap();
            picks[i] += 1;
            pool.done(i);
        }
        assert!((150..=250).contains(&picks[0]), "{picks:?}");
    }

    #[test]
    fn a_draining_backend_takes_nothing_new_and_keeps_its_inflight() {
        let t0 = Instant::now();
        let mut pool = Pool::new(&config(2, |_| {}), t0);
        let first = pool.choose(None, &[false; 2], t0).unwrap();
        pool.set_draining(first, true, t0 + secs(1.0));
        assert_eq!(pool.members[first].state, State::Draining);
        assert_eq!(pool.members[first].inflight, 1);
        for _ in 0..4 {
            let i = pool.choose(None, &[false; 2], t0 + secs(2.0)).unwrap();
            assert_ne!(i, first);
            pool.done(i);
        }
        pool.set_draining(first, false, t0 + secs(3.0));
        let states: Vec<_> = pool.members[first]
            .transitions
            .iter()
            .map(|t| (t.to, t.why.as_str()))
            .collect();
        assert_eq!(states, [(State::Draining, "drain"), (State::Up, "undrain")]);
    }

    #[test]
    fn a_retry_skips_what_was_tried_and_none_is_left_when_all_were() {
        let t0 = Instant::now();
        let mut pool = Pool::new(&config(2, |_| {}), t0);
        let a = pool.choose(None, &[false, false], t0).unwrap();
        let mut tried = [false; 2];
        tried[a] = true;
        let b = pool.choose(None, &tried, t0).unwrap();
        assert_ne!(a, b);
        assert_eq!(pool.choose(None, &[true, true], t0), None);
    }
}
