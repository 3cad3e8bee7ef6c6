//! What the soak's clients saw, per proxy, counted without locks.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// What the clients of one proxy saw.
#[derive(Debug, Default)]
pub struct Tally {
    /// Rounds that came back whole and right.
    pub(super) ok: AtomicU64,
    /// Bytes checked at their offsets.
    pub(super) verified: AtomicU64,
    /// Received bytes that differed from those sent: never allowed.
    pub(super) corrupted: AtomicU64,
    /// Rounds a fault or a drain ended (chaos proxies; HTTP connections a drain
    /// closed under a request).
    pub(super) ended: AtomicU64,
    /// Rounds that failed where nothing allowed it.
    pub(super) failed: AtomicU64,
    /// Connects refused (a drain closes the listener).
    pub(super) refused: AtomicU64,
    /// Connections opened.
    pub(super) connections: AtomicU64,
}

impl Tally {
    pub(super) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The counts now.
    pub(super) fn counts(&self) -> Counts {
        Counts {
            ok: Tally::get(&self.ok),
            verified: Tally::get(&self.verified),
            corrupted: Tally::get(&self.corrupted),
            ended: Tally::get(&self.ended),
            failed: Tally::get(&self.failed),
            refused: Tally::get(&self.refused),
            connections: Tally::get(&self.connections),
        }
    }
}

/// A [`Tally`] read at one moment.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Counts {
    /// Rounds that came back whole and right.
    pub ok: u64,
    /// Bytes checked at their offsets.
    #[serde(rename = "verified_bytes")]
    pub verified: u64,
    /// Bytes that differed from those sent.
    pub corrupted: u64,
    /// Rounds a fault or a drain ended.
    #[serde(rename = "ended_by_fault_or_drain")]
    pub ended: u64,
    /// Rounds that failed where nothing allowed it.
    pub failed: u64,
    /// Connects refused.
    pub refused: u64,
    /// Connections opened.
    pub connections: u64,
}
