//! The parts a run needs when the user brings nothing: backends to relay to.

pub mod backend;
