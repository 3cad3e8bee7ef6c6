//! A tally as a shard writes it for a merge, and read back.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::{Kind, Second, Tally, histogram};

impl Tally {
    /// What a shard writes of its counts for a merge.
    pub(in crate::lab::load) fn save(&self) -> Saved {
        Saved {
            seconds: self
                .seconds
                .iter()
                .map(|s| SavedSecond {
                    sent: s.sent,
                    retries: s.retries,
                    ok: s.ok,
                    errors: kinds(&s.errors),
                    latency: encode(&s.latency),
                    depth: s.depth,
                    time_wait: s.time_wait,
                    in_use: s.in_use,
                })
                .collect(),
            offered: self.offered.clone(),
            latency: encode(&self.latency),
            lag: encode(&self.lag),
            errors: kinds(&self.errors),
            answers: self
                .answers
                .iter()
                .map(|((backend, instance), n)| Answer {
                    backend: backend.clone(),
                    instance: instance.clone(),
                    answers: *n,
                })
                .collect(),
            sessions: self.sessions.clone(),
            sent: self.sent,
            retries: self.retries,
            ok: self.ok,
        }
    }

    /// The counts a shard saved; `Err` says what in them cannot be read.
    pub(in crate::lab::load) fn restore(saved: &Saved) -> Result<Tally, String> {
        let mut seconds = Vec::with_capacity(saved.seconds.len());
        for (i, s) in saved.seconds.iter().enumerate() {
            let at = |e: String| format!("second {i}: {e}");
            seconds.push(Second {
                sent: s.sent,
                retries: s.retries,
                ok: s.ok,
                errors: parse_kinds(&s.errors).map_err(at)?,
                latency: decode(&s.latency).map_err(at)?,
                depth: s.depth,
                time_wait: s.time_wait,
                in_use: s.in_use,
            });
        }
        Ok(Tally {
            seconds,
            offered: saved.offered.clone(),
            latency: decode(&saved.latency).map_err(|e| format!("latency: {e}"))?,
            lag: decode(&saved.lag).map_err(|e| format!("send lag: {e}"))?,
            errors: parse_kinds(&saved.errors)?,
            answers: saved
                .answers
                .iter()
                .map(|a| ((a.backend.clone(), a.instance.clone()), a.answers))
                .collect(),
            sessions: saved.sessions.clone(),
            sent: saved.sent,
            retries: saved.retries,
            ok: saved.ok,
        })
    }
}

/// A tally as a shard's result holds it: counts as numbers, each latency histogram
/// in HdrHistogram's V2 encoding (compressed, base64), as interval logs hold them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Saved {
    pub(super) seconds: Vec<SavedSecond>,
    pub(super) offered: Vec<f64>,
    pub(super) latency: String,
    pub(super) lag: String,
    pub(super) errors: BTreeMap<String, u64>,
    pub(super) answers: Vec<Answer>,
    pub(super) sessions: BTreeMap<u64, BTreeMap<String, u64>>,
    pub(super) sent: u64,
    pub(super) retries: u64,
    pub(super) ok: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct SavedSecond {
    sent: u64,
    retries: u64,
    ok: u64,
    errors: BTreeMap<String, u64>,
    latency: String,
    depth: Option<i64>,
    time_wait: Option<usize>,
    in_use: Option<usize>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Answer {
    backend: Option<String>,
    instance: Option<String>,
    answers: u64,
}

fn kinds(errors: &BTreeMap<Kind, u64>) -> BTreeMap<String, u64> {
    errors.iter().map(|(k, n)| (k.to_string(), *n)).collect()
}

fn parse_kinds(errors: &BTreeMap<String, u64>) -> Result<BTreeMap<Kind, u64>, String> {
    errors.iter().map(|(k, n)| Ok((k.parse()?, *n))).collect()
}

fn encode(h: &Histogram<u64>) -> String {
    use base64::Engine;
    use hdrhistogram::serialization::Serializer;
    let mut bytes = Vec::new();
    hdrhistogram::serialization::V2DeflateSerializer::new()
        .serialize(h, &mut bytes)
        .expect("a histogram serialises into memory");
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn decode(text: &str) -> Result<Histogram<u64>, String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("histogram: not base64 ({e})"))?;
    let read: Histogram<u64> = hdrhistogram::serialization::Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| format!("histogram: not HdrHistogram's V2 encoding ({e:?})"))?;
    // Into the shape every tally uses, so that any two add.
    let mut h = histogram();
    h.add(&read)
        .map_err(|e| format!("histogram: values out of range ({e:?})"))?;
    Ok(h)
}
