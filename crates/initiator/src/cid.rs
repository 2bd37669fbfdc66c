// SPDX-License-Identifier: Apache-2.0
//! A pool of command identifiers: at most `depth` commands are outstanding on a queue.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Free command identifiers `0..depth`.
pub(crate) struct CidPool {
    free: Mutex<Vec<u16>>,
    cv: Condvar,
}

impl CidPool {
    /// A pool of `depth` identifiers.
    pub fn new(depth: u16) -> Self {
        CidPool { free: Mutex::new((0..depth).rev().collect()), cv: Condvar::new() }
    }

    /// A free identifier, if any.
    pub fn try_acquire(&self) -> Option<u16> {
        self.free.lock().unwrap_or_else(PoisonError::into_inner).pop()
    }

    /// A free identifier, waiting up to `timeout` for one.
    pub fn acquire(&self, timeout: Duration) -> Option<u16> {
        let deadline = Instant::now() + timeout;
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(c) = free.pop() {
                return Some(c);
            }
            let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
            free = self.cv.wait_timeout(free, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Returns an identifier to the pool.
    pub fn release(&self, cid: u16) {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        debug_assert!(!free.contains(&cid), "CID {cid} released twice");
        free.push(cid);
        drop(free);
        self.cv.notify_one();
    }

    /// Identifiers currently free.
    #[cfg(test)]
    pub fn available(&self) -> usize {
        self.free.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn hands_out_each_cid_once() {
        let p = CidPool::new(4);
        let mut got: Vec<u16> = (0..4).map(|_| p.try_acquire().unwrap()).collect();
        assert!(p.try_acquire().is_none());
        assert!(p.acquire(Duration::from_millis(20)).is_none());
        got.sort();
        assert_eq!(got, vec![0, 1, 2, 3]);
        p.release(2);
        assert_eq!(p.try_acquire(), Some(2));
    }

    #[test]
    fn never_more_than_depth_outstanding() {
        let p = Arc::new(CidPool::new(3));
        let live = Arc::new(Mutex::new(std::collections::HashSet::new()));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (p, live) = (p.clone(), live.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let c = p.acquire(Duration::from_secs(10)).unwrap();
                        {
                            let mut l = live.lock().unwrap();
                            assert!(l.insert(c), "CID {c} handed out twice");
                            assert!(l.len() <= 3);
                        }
                        std::thread::yield_now();
                        live.lock().unwrap().remove(&c);
                        p.release(c);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(p.available(), 3);
    }
}
