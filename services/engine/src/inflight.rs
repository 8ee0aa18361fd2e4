//! The step in flight under async scheduling (see the engine's `overlap` module): launched,
//! its picks not yet collected.

use std::collections::HashSet;
use std::time::Instant;

use crate::scheduler::{Schedule, SeqId};

/// A step launched and not yet collected.
#[derive(Debug)]
pub(crate) struct InFlight {
    pub schedule: Schedule,
    /// Sequences that ended (finished, aborted or failed) since the launch: their picks are
    /// dropped.
    pub retired: HashSet<SeqId>,
    pub launched: Instant,
}

impl InFlight {
    /// `id` ended: its pick in this step, if it has one, is dropped.
    pub(crate) fn retire(&mut self, id: SeqId) {
        self.retired.insert(id);
    }
}
