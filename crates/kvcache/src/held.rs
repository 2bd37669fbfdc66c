// SPDX-License-Identifier: Apache-2.0
//! Results of KV commands waiting for KV_RESULT, by tag.
//!
//! KV_ATTEND leaves its result under a host-chosen tag and KV_RESULT takes it: two
//! commands, as one NVMe command carries data one way only. A host need not wait for the
//! first to complete before sending the second: a KV_RESULT whose tag is being computed
//! waits for it, and one whose tag is not known yet waits a short grace period for its
//! KV_ATTEND to arrive (its data may still be on the way, or another worker may have
//! picked the two commands up in the other order). So one attention exchange costs the
//! host one round trip.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Results held at most; older ones are dropped when more arrive (a host that never
/// collects its results cannot grow the target's memory).
pub const HELD_RESULTS: usize = 64;

/// How long a KV_RESULT waits for a tag that is neither held nor being computed before it
/// answers "no result": long enough for a KV_ATTEND sent just before it to start, short
/// enough that a stray KV_RESULT does not hold a worker for long.
pub const RESULT_GRACE: Duration = Duration::from_millis(100);

/// How long a KV_RESULT waits at most for a result being computed: a bound for a worker
/// that never finishes, far above any attention's time.
const RESULT_WAIT_MAX: Duration = Duration::from_secs(120);

#[derive(Default)]
struct Held {
    results: VecDeque<(u32, Vec<u8>)>,
    /// Tags whose result is being computed, one entry per command in flight.
    pending: Vec<u32>,
}

/// Results waiting for KV_RESULT, and the tags being computed. Safe to share.
#[derive(Default)]
pub struct HeldResults {
    held: Mutex<Held>,
    changed: Condvar,
}

/// A result being computed under a tag (from [`HeldResults::begin`]). Dropped without
/// [`Pending::complete`], as when the command fails, it leaves nothing and wakes a waiting
/// KV_RESULT, which then answers "no result" at once.
pub struct Pending<'a> {
    results: &'a HeldResults,
    tag: u32,
}

impl Pending<'_> {
    /// Holds `data` as the tag's result.
    pub fn complete(self, data: Vec<u8>) {
        self.results.put(self.tag, data);
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let mut h = self.results.lock();
        if let Some(i) = h.pending.iter().position(|&t| t == self.tag) {
            h.pending.swap_remove(i);
        }
        drop(h);
        self.results.changed.notify_all();
    }
}

impl HeldResults {
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks `tag`'s result as being computed, until the returned [`Pending`] completes
    /// or drops.
    pub fn begin(&self, tag: u32) -> Pending<'_> {
        self.lock().pending.push(tag);
        Pending { results: self, tag }
    }

    /// Holds `data` under `tag`, replacing a result held there; the oldest result goes
    /// when [`HELD_RESULTS`] are held.
    pub fn put(&self, tag: u32, data: Vec<u8>) {
        let mut h = self.lock();
        h.results.retain(|(t, _)| *t != tag);
        if h.results.len() == HELD_RESULTS {
            h.results.pop_front();
        }
        h.results.push_back((tag, data));
        drop(h);
        self.changed.notify_all();
    }

    /// Takes the result held under `tag`, if any, without waiting.
    pub fn take(&self, tag: u32) -> Option<Vec<u8>> {
        Self::take_from(&mut self.lock(), tag)
    }

    /// Takes the result under `tag`: at once when held; when being computed, once it is
    /// done; when unknown, if it arrives within `grace`. None if the command computing it
    /// failed, or nothing came.
    pub fn take_wait(&self, tag: u32, grace: Duration) -> Option<Vec<u8>> {
        let start = Instant::now();
        let mut h = self.lock();
        let mut seen_pending = false;
        loop {
            if let Some(data) = Self::take_from(&mut h, tag) {
                return Some(data);
            }
            let pending = h.pending.contains(&tag);
            if !pending && seen_pending {
                return None; // computed and failed: its own completion says why
            }
            seen_pending |= pending;
            let limit = if pending { RESULT_WAIT_MAX } else { grace };
            let left = limit.checked_sub(start.elapsed())?;
            h = self.changed.wait_timeout(h, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    fn take_from(h: &mut Held, tag: u32) -> Option<Vec<u8>> {
        let i = h.results.iter().position(|(t, _)| *t == tag)?;
        h.results.remove(i).map(|(_, d)| d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_result_taken_before_it_is_computed_arrives_when_done() {
        let h = Arc::new(HeldResults::default());
        let p = h.begin(7);
        let taker = {
            let h = h.clone();
            std::thread::spawn(move || h.take_wait(7, Duration::from_millis(10)))
        };
        // Longer than the grace: a pending tag is waited for until it is done.
        std::thread::sleep(Duration::from_millis(50));
        p.complete(vec![1, 2, 3]);
        assert_eq!(taker.join().unwrap(), Some(vec![1, 2, 3]));
        assert_eq!(h.take(7), None, "a result is released once taken");
    }

    #[test]
    fn a_tag_begun_after_the_take_is_waited_for_within_the_grace() {
        let h = Arc::new(HeldResults::default());
        let taker = {
            let h = h.clone();
            std::thread::spawn(move || h.take_wait(9, Duration::from_secs(5)))
        };
        std::thread::sleep(Duration::from_millis(20));
        h.begin(9).complete(vec![4]);
        assert_eq!(taker.join().unwrap(), Some(vec![4]));
    }

    #[test]
    fn a_failed_or_unknown_tag_answers_none() {
        let h = Arc::new(HeldResults::default());
        assert_eq!(h.take_wait(1, Duration::from_millis(5)), None);
        let p = h.begin(2);
        let taker = {
            let h = h.clone();
            std::thread::spawn(move || h.take_wait(2, Duration::from_secs(5)))
        };
        std::thread::sleep(Duration::from_millis(20));
        drop(p); // the command failed: the waiting take answers at once, not after 5 s
        assert_eq!(taker.join().unwrap(), None);
    }

    #[test]
    fn at_most_the_newest_results_are_held() {
        let h = HeldResults::default();
        for t in 0..(HELD_RESULTS as u32 + 3) {
            h.put(t, vec![t as u8]);
        }
        assert_eq!(h.take(0), None);
        assert_eq!(h.take(3), Some(vec![3]));
        h.put(5, vec![9]);
        assert_eq!(h.take(5), Some(vec![9]), "a tag put again replaces its result");
    }
}
