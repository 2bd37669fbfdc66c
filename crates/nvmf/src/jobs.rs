// SPDX-License-Identifier: Apache-2.0
//! The commands of one I/O queue waiting for its worker threads.
//!
//! A mutex and a condition variable rather than a channel: an idle worker goes to sleep at
//! once. A channel's receivers spin and then yield the CPU several times before they sleep,
//! and on a few busy cores each of those yields is a context switch: measured on 2 cores,
//! they and their switches took more CPU than a small attention command itself.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

struct Queue<T> {
    /// The jobs, and whether every sender is gone.
    state: Mutex<(VecDeque<T>, bool)>,
    ready: Condvar,
}

/// Closes the queue when the last [`Sender`] goes.
struct Closer<T>(Arc<Queue<T>>);

impl<T> Drop for Closer<T> {
    fn drop(&mut self) {
        self.0.state.lock().unwrap_or_else(PoisonError::into_inner).1 = true;
        self.0.ready.notify_all();
    }
}

/// Puts jobs on the queue; cheap to clone. The workers stop once every clone is dropped
/// and the jobs already queued are done.
pub(crate) struct Sender<T>(Arc<Closer<T>>);

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Sender(self.0.clone())
    }
}

impl<T> Sender<T> {
    /// Queues `job` and wakes one idle worker.
    pub(crate) fn send(&self, job: T) {
        let q = &self.0 .0;
        q.state.lock().unwrap_or_else(PoisonError::into_inner).0.push_back(job);
        q.ready.notify_one();
    }
}

/// Takes jobs off the queue; shared by the workers.
pub(crate) struct Receiver<T>(Arc<Queue<T>>);

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        Receiver(self.0.clone())
    }
}

impl<T> Receiver<T> {
    /// The next job, waiting for one; `None` once the queue is closed and empty.
    pub(crate) fn recv(&self) -> Option<T> {
        let mut s = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(job) = s.0.pop_front() {
                return Some(job);
            }
            if s.1 {
                return None;
            }
            s = self.0.ready.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// A new, empty queue.
pub(crate) fn queue<T>() -> (Sender<T>, Receiver<T>) {
    let q = Arc::new(Queue { state: Mutex::new((VecDeque::new(), false)), ready: Condvar::new() });
    (Sender(Arc::new(Closer(q.clone()))), Receiver(q))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_get_every_job_in_order_and_stop_when_the_senders_go() {
        let (tx, rx) = queue::<u32>();
        let tx2 = tx.clone();
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let rx = rx.clone();
                std::thread::spawn(move || std::iter::from_fn(|| rx.recv()).collect::<Vec<_>>())
            })
            .collect();
        for i in 0..1000 {
            if i % 2 == 0 {
                tx.send(i)
            } else {
                tx2.send(i)
            }
        }
        drop(tx);
        drop(tx2);
        let mut got: Vec<u32> = Vec::new();
        for w in workers {
            let mine = w.join().unwrap();
            assert!(mine.windows(2).all(|p| p[0] < p[1]), "each worker takes jobs in queue order");
            got.extend(mine);
        }
        got.sort_unstable();
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
        assert_eq!(rx.recv(), None);
    }

    #[test]
    fn queued_jobs_are_still_done_after_the_senders_go() {
        let (tx, rx) = queue::<u8>();
        tx.send(7);
        drop(tx);
        assert_eq!(rx.recv(), Some(7));
        assert_eq!(rx.recv(), None);
    }
}
