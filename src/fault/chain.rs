//! The per-direction chain of stages one connection runs its faults in.

use std::sync::Arc;

use tokio::time::Instant;

use super::{
    Direction, Fault, Scope,
    stage::{Chunk, Stage, Step},
};

/// One fault in one direction of one connection: its stage, or `None` when the
/// toxicity draw left this connection alone.
#[derive(Debug)]
struct Slot {
    fault: Arc<Fault>,
    stage: Option<Box<dyn Stage>>,
}

/// What identifies a connection to its faults' RNGs.
#[derive(Debug, Clone, Copy)]
pub struct ConnId<'a> {
    /// The run's seed.
    pub seed: u64,
    /// The proxy's name.
    pub proxy: &'a str,
    /// The connection's number within its proxy, from 0.
    pub conn: u64,
    /// What the listener it came through carries: `Probe` on a probe listener,
    /// `Data` beside one, `Any` when the proxy has a single listener.
    pub class: Scope,
}

/// A step out of the chain, and the faults that acted on it on its way through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    /// What the relay is to do.
    pub step: Step,
    /// The faults that changed it (its time, its bytes, or whether it happens at
    /// all); `None` if every stage passed it on as it came.
    pub by: Option<Arc<ActedBy>>,
}

/// The names of the faults that acted on a step, in chain order.
#[derive(Debug, PartialEq, Eq)]
pub struct ActedBy {
    /// Fault names.
    pub names: Vec<String>,
}

impl ActedBy {
    /// The capture comment for a packet these faults acted on.
    pub fn note(&self) -> String {
        format!("snag: {}", self.names.join(", "))
    }
}

/// What a stage was handed, to tell whether it gave back the same: the same bytes
/// (not a copy) at the same instant, the same FIN or reset at the same instant.
enum Handed {
    Bytes(*const u8, usize, Instant),
    Fin(Instant),
    Reset(Instant),
}

impl Handed {
    fn of(step: &Step) -> Handed {
        match step {
            Step::Send(c) => Handed::Bytes(c.data.as_ptr(), c.data.len(), c.due),
            Step::Finish { at } => Handed::Fin(*at),
            Step::Reset { at } => Handed::Reset(*at),
        }
    }

    fn is(&self, step: &Step) -> bool {
        match (self, step) {
            (Handed::Bytes(ptr, len, due), Step::Send(c)) => {
                c.due == *due && c.data.as_ptr() == *ptr && c.data.len() == *len
            }
            (Handed::Fin(at), Step::Finish { at: a })
            | (Handed::Reset(at), Step::Reset { at: a }) => a == at,
            _ => false,
        }
    }
}

/// Which slots acted on a step, one bit per slot; slots past the 64th are not told.
type Mask = u64;

fn bit(slot: usize) -> Mask {
    1u64.checked_shl(slot as u32).unwrap_or(0)
}

thread_local! {
    /// The steps between two stages, and what one stage gave back for one step: kept
    /// per thread, not per chain (nor made per chunk), so an idle faulted connection
    /// holds none of them.
    static SCRATCH: std::cell::RefCell<Scratch> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// The steps into a stage and out of it, each with the stages that acted on it; what
/// one stage gave back for one step.
type Scratch = (Vec<(Step, Mask)>, Vec<(Step, Mask)>, Vec<Step>);

/// The stages of one direction of one connection, in the order the faults were added.
#[derive(Debug, Default)]
pub struct Chain {
    slots: Vec<Slot>,
    /// The names each mask stood for since the last sync: a step stream mostly
    /// repeats one set, so each set is built once.
    named: Vec<(Mask, Arc<ActedBy>)>,
}

impl Chain {
    /// Whether no stage acts on this direction (the relay may take its fast path).
    pub fn is_empty(&self) -> bool {
        self.slots.iter().all(|s| s.stage.is_none())
    }

    /// The faults that apply to this connection.
    pub fn applied(&self) -> impl Iterator<Item = &Arc<Fault>> {
        self.slots
            .iter()
            .filter(|s| s.stage.is_some())
            .map(|s| &s.fault)
    }

    /// Brings the chain in line with `faults` (the proxy's whole list) for direction
    /// `dir`. A fault that is still the same `Arc` keeps its stage and its state; a
    /// new or changed one gets a new stage and a new toxicity draw, started at `now`.
    /// Steps the new stages schedule go to `out`.
    pub fn sync(
        &mut self,
        faults: &[Arc<Fault>],
        dir: Direction,
        id: ConnId<'_>,
        now: Instant,
        out: &mut Vec<Staged>,
    ) {
        self.named.clear();
        let mut old = std::mem::take(&mut self.slots);
        // A single listener carries probes too, but a layer-4 probe sends no bytes for
        // a stage to act on: stages there act as on data.
        let class = if id.class == Scope::Any {
            Scope::Data
        } else {
            id.class
        };
        for fault in faults
            .iter()
            .filter(|f| f.stream == dir && !f.kind.is_listener() && f.scope.covers(class))
        {
            if let Some(i) = old.iter().position(|s| Arc::ptr_eq(&s.fault, fault)) {
                self.slots.push(old.swap_remove(i));
                continue;
            }
            let stage = fault.applies(id.seed, id.proxy, id.conn).then(|| {
                let rng = crate::seed::rng(
                    id.seed,
                    &[
                        id.proxy.as_bytes(),
                        &id.conn.to_le_bytes(),
                        fault.name.as_bytes(),
                    ],
                );
                fault.kind.stage(rng)
            });
            tracing::trace!(fault = %fault.name, applies = stage.is_some(), "toxicity draw");
            self.slots.push(Slot {
                fault: fault.clone(),
                stage: stage.flatten(),
            });
            let index = self.slots.len() - 1;
            let mut started = Vec::new();
            if let Some(stage) = &mut self.slots[index].stage {
                stage.start(now, &mut started);
            }
            let started = started.into_iter().map(|s| (s, bit(index)));
            self.run(index + 1, started, out);
        }
    }

    /// Passes a chunk read from the source through every stage.
    pub fn chunk(&mut self, chunk: Chunk, out: &mut Vec<Staged>) {
        self.run(0, [(Step::Send(chunk), 0)], out);
    }

    /// Passes the source's FIN through every stage.
    pub fn eof(&mut self, at: Instant, out: &mut Vec<Staged>) {
        self.run(0, [(Step::Finish { at }, 0)], out);
    }

    /// Runs `first` through the stages from `from` on and appends the result to `out`.
    fn run(
        &mut self,
        from: usize,
        first: impl IntoIterator<Item = (Step, Mask)>,
        out: &mut Vec<Staged>,
    ) {
        SCRATCH.with_borrow_mut(|(steps, next, given)| {
            steps.extend(first);
            let from = from.min(self.slots.len());
            for (index, slot) in self.slots.iter_mut().enumerate().skip(from) {
                let Some(stage) = &mut slot.stage else {
                    continue;
                };
                for (step, mask) in steps.drain(..) {
                    let handed = Handed::of(&step);
                    match step {
                        Step::Send(chunk) => stage.chunk(chunk, given),
                        Step::Finish { at } => stage.eof(at, given),
                        reset @ Step::Reset { .. } => given.push(reset),
                    }
                    let acted = !(given.len() == 1 && handed.is(&given[0]));
                    let mask = mask | if acted { bit(index) } else { 0 };
                    next.extend(given.drain(..).map(|s| (s, mask)));
                }
                std::mem::swap(steps, next);
            }
            for (step, mask) in steps.drain(..) {
                let by = (mask != 0).then(|| self.acted_by(mask));
                out.push(Staged { step, by });
            }
        });
    }

    /// The names `mask` stands for, built once per mask between syncs.
    fn acted_by(&mut self, mask: Mask) -> Arc<ActedBy> {
        if let Some((_, by)) = self.named.iter().find(|(m, _)| *m == mask) {
            return by.clone();
        }
        let names = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & bit(*i) != 0)
            .map(|(_, s)| s.fault.name.clone())
            .collect();
        let by = Arc::new(ActedBy { names });
        self.named.push((mask, by.clone()));
        by
    }
}
