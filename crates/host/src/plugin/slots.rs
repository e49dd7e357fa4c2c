//! Call slots: a counting semaphore for blocking threads, waited for until a
//! deadline. A runtime has one set (every plugin's calls); each loaded plugin
//! (a store's) has its own, taken first.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// A counting semaphore bounding concurrent calls.
#[derive(Debug)]
pub(crate) struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    pub fn new(n: usize) -> Self {
        Self {
            free: Mutex::new(n),
            freed: Condvar::new(),
        }
    }

    /// A slot, waiting until `deadline` at most.
    pub fn acquire_until(&self, deadline: Instant) -> Option<SlotGuard<'_>> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while *free == 0 {
            let left = deadline.checked_duration_since(Instant::now())?;
            free = self
                .freed
                .wait_timeout(free, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *free -= 1;
        Some(SlotGuard(self))
    }
}

/// A held slot, given back when dropped.
pub(crate) struct SlotGuard<'a>(&'a Slots);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}
