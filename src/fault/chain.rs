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

/// The stages of one direction of one connection, in the order the faults were added.
#[derive(Debug, Default)]
pub struct Chain {
    slots: Vec<Slot>,
    scratch: Vec<Step>,
}

impl Chain {
    /// Whether no stage acts on this direction (the relay may take its fast path).
    pub fn is_empty(&self) -> bool {
        self.slots.iter().all(|s| s.stage.is_none())
    }

    /// Names of the faults that apply to this connection.
    pub fn applied(&self) -> impl Iterator<Item = &str> {
        self.slots
            .iter()
            .filter(|s| s.stage.is_some())
            .map(|s| s.fault.name.as_str())
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
        out: &mut Vec<Step>,
    ) {
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
            self.run(index + 1, started, out);
        }
    }

    /// Passes a chunk read from the source through every stage.
    pub fn chunk(&mut self, chunk: Chunk, out: &mut Vec<Step>) {
        self.run(0, vec![Step::Send(chunk)], out);
    }

    /// Passes the source's FIN through every stage.
    pub fn eof(&mut self, at: Instant, out: &mut Vec<Step>) {
        self.run(0, vec![Step::Finish { at }], out);
    }

    /// Runs `steps` through the stages from `from` on and appends the result to `out`.
    fn run(&mut self, from: usize, mut steps: Vec<Step>, out: &mut Vec<Step>) {
        let mut next = std::mem::take(&mut self.scratch);
        let from = from.min(self.slots.len());
        for slot in &mut self.slots[from..] {
            let Some(stage) = &mut slot.stage else {
                continue;
            };
            for step in steps.drain(..) {
                match step {
                    Step::Send(chunk) => stage.chunk(chunk, &mut next),
                    Step::Finish { at } => stage.eof(at, &mut next),
                    reset @ Step::Reset { .. } => next.push(reset),
                }
            }
            std::mem::swap(&mut steps, &mut next);
        }
        out.append(&mut steps);
        self.scratch = next;
    }
}
