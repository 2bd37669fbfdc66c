// SPDX-License-Identifier: Apache-2.0
//! A pool of aligned buffers of one size, reused from command to command.
//!
//! A fresh 2 MiB buffer costs a `mmap`, 512 page faults with the kernel zeroing every page,
//! and a `munmap` when it is freed; with several commands at once that work, not the reading,
//! caps throughput. Buffers taken from a [`BufferPool`] come back to it when dropped and
//! are handed out again as they are: not zeroed, because the media read overwrites them.
//! Memory stays bounded: what commands hold is bounded by how many run at once, and at most
//! `max_idle` buffers wait in the pool between commands; the rest are freed.

use crate::AlignedBuf;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// A shared pool of [`AlignedBuf`]s of one size. Cloning shares the pool.
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<Inner>,
}

struct Inner {
    buf_len: usize,
    max_idle: usize,
    idle: Mutex<Vec<AlignedBuf>>,
    allocations: AtomicU64,
    reuses: AtomicU64,
    in_use: AtomicUsize,
    /// Buffers allocated and not yet freed (in use or idle), and the most there ever were.
    held: AtomicUsize,
    peak_held: AtomicUsize,
}

/// What a pool has done, for reports.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Size of each buffer in bytes.
    pub buffer_bytes: usize,
    /// Buffers allocated since the pool was made.
    pub allocations: u64,
    /// Takes served by a buffer that was already allocated.
    pub reuses: u64,
    /// Buffers held by users now.
    pub in_use: usize,
    /// Buffers waiting in the pool now.
    pub idle: usize,
    /// Most buffers allocated at one time (in use and idle together).
    pub peak_buffers: usize,
    /// Most buffers kept idle between uses.
    pub max_idle: usize,
}

impl PoolStats {
    /// Most bytes the pool's buffers took at one time.
    pub fn peak_bytes(&self) -> u64 {
        (self.peak_buffers * self.buffer_bytes) as u64
    }
}

impl BufferPool {
    /// A pool of buffers of `buf_len` bytes (rounded up to the alignment) that keeps at most
    /// `max_idle` of them between uses.
    pub fn new(buf_len: usize, max_idle: usize) -> BufferPool {
        let buf_len = buf_len.max(1).next_multiple_of(crate::DIRECT_ALIGN);
        BufferPool {
            inner: Arc::new(Inner {
                buf_len,
                max_idle,
                idle: Mutex::new(Vec::new()),
                allocations: AtomicU64::new(0),
                reuses: AtomicU64::new(0),
                in_use: AtomicUsize::new(0),
                held: AtomicUsize::new(0),
                peak_held: AtomicUsize::new(0),
            }),
        }
    }

    /// Size of each buffer in bytes.
    pub fn buffer_len(&self) -> usize {
        self.inner.buf_len
    }

    /// A buffer of [`BufferPool::buffer_len`] bytes with unspecified contents: an idle one
    /// if there is one, else a new one. It returns to the pool when dropped.
    pub fn take(&self) -> PooledBuf {
        let i = &self.inner;
        let reused = i.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let buf = match reused {
            Some(b) => {
                i.reuses.fetch_add(1, Ordering::Relaxed);
                b
            }
            None => {
                i.allocations.fetch_add(1, Ordering::Relaxed);
                let held = i.held.fetch_add(1, Ordering::Relaxed) + 1;
                i.peak_held.fetch_max(held, Ordering::Relaxed);
                AlignedBuf::new(i.buf_len)
            }
        };
        i.in_use.fetch_add(1, Ordering::Relaxed);
        PooledBuf { buf: Some(buf), pool: Some(self.inner.clone()) }
    }

    /// A buffer of at least `len` bytes: from the pool when its buffers are large enough,
    /// else a one-off allocation freed when dropped.
    pub fn take_at_least(&self, len: usize) -> PooledBuf {
        if len <= self.inner.buf_len {
            self.take()
        } else {
            PooledBuf { buf: Some(AlignedBuf::new(len)), pool: None }
        }
    }

    /// Counters and current occupancy.
    pub fn stats(&self) -> PoolStats {
        let i = &self.inner;
        PoolStats {
            buffer_bytes: i.buf_len,
            allocations: i.allocations.load(Ordering::Relaxed),
            reuses: i.reuses.load(Ordering::Relaxed),
            in_use: i.in_use.load(Ordering::Relaxed),
            idle: i.idle.lock().unwrap_or_else(PoisonError::into_inner).len(),
            peak_buffers: i.peak_held.load(Ordering::Relaxed),
            max_idle: i.max_idle,
        }
    }
}

/// A buffer on loan from a [`BufferPool`]; it goes back when dropped.
pub struct PooledBuf {
    buf: Option<AlignedBuf>,
    /// `None` for a one-off buffer larger than the pool's.
    pool: Option<Arc<Inner>>,
}

impl Deref for PooledBuf {
    type Target = AlignedBuf;

    fn deref(&self) -> &AlignedBuf {
        self.buf.as_ref().expect("present until drop")
    }
}

impl DerefMut for PooledBuf {
    fn deref_mut(&mut self) -> &mut AlignedBuf {
        self.buf.as_mut().expect("present until drop")
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        let (Some(pool), Some(buf)) = (self.pool.take(), self.buf.take()) else { return };
        pool.in_use.fetch_sub(1, Ordering::Relaxed);
        let mut idle = pool.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < pool.max_idle {
            idle.push(buf);
        } else {
            drop(idle);
            pool.held.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Bytes read into a pooled buffer, where they landed: the buffer returns to its pool when
/// this is dropped. A transport sends the bytes from here without a copy.
pub struct BlockRead {
    buf: PooledBuf,
    skip: usize,
    len: usize,
}

impl BlockRead {
    /// The `len` bytes at `skip` of `buf`. Panics if they are not inside it.
    pub fn new(buf: PooledBuf, skip: usize, len: usize) -> BlockRead {
        assert!(skip + len <= buf.as_slice().len(), "{skip} + {len} bytes outside a {}-byte buffer", buf.as_slice().len());
        BlockRead { buf, skip, len }
    }
}

impl std::ops::Deref for BlockRead {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf.as_slice()[self.skip..self.skip + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_idle_ones_bounded() {
        let pool = BufferPool::new(8192, 2);
        let held: Vec<PooledBuf> = (0..5).map(|_| pool.take()).collect();
        assert!(held.iter().all(|b| b.len() == 8192 && (b.as_slice().as_ptr() as usize).is_multiple_of(crate::DIRECT_ALIGN)));
        let s = pool.stats();
        assert_eq!((s.allocations, s.reuses, s.in_use, s.idle, s.peak_buffers), (5, 0, 5, 0, 5));
        drop(held);
        let s = pool.stats();
        assert_eq!((s.in_use, s.idle), (0, 2), "only max_idle buffers stay");
        let mut a = pool.take();
        a.as_mut_slice()[0] = 42;
        let ptr = a.as_slice().as_ptr();
        drop(a);
        let b = pool.take();
        assert_eq!(b.as_slice().as_ptr(), ptr, "the buffer just returned is handed out again");
        assert_eq!(b.as_slice()[0], 42, "not zeroed on reuse");
        let s = pool.stats();
        assert_eq!((s.allocations, s.reuses, s.peak_buffers), (5, 2, 5));
        assert_eq!(s.peak_bytes(), 5 * 8192);
    }

    #[test]
    fn larger_requests_get_one_off_buffers() {
        let pool = BufferPool::new(4096, 4);
        let big = pool.take_at_least(3 * 4096);
        assert_eq!(big.len(), 3 * 4096);
        drop(big);
        let s = pool.stats();
        assert_eq!((s.allocations, s.idle, s.in_use), (0, 0, 0));
        assert_eq!(pool.take_at_least(100).len(), 4096);
    }
}
