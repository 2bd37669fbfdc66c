// SPDX-License-Identifier: Apache-2.0
//! [`UringScanner`]: streams a byte range of a [`Backing`] through io_uring with direct I/O,
//! several reads in flight into registered buffers, completions polled.
//!
//! The ordinary path ([`Backing::read_window`]) makes one `pread` at a time: the device
//! sits idle while the caller computes, and a reader thread that reads ahead (as EXEC's
//! streaming does) costs a hand-off per chunk. Here one thread keeps `depth` reads queued
//! on the device and gets the chunks back in file order. The buffers are registered with
//! the ring once (`IORING_REGISTER_BUFFERS`), so the kernel does not map and pin the pages
//! of every read; completions are polled from the shared ring for a short while before the
//! thread sleeps in `io_uring_enter`, so a read that finishes quickly costs no system call.

use crate::{aligned_span, AlignedBuf, Backing, ReadPurpose, DIRECT_ALIGN};
use io_uring::{opcode, types, IoUring};
use std::io;
use std::ops::ControlFlow;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Times the completion queue is polled before the thread waits in the kernel.
const SPINS: u32 = 4000;

/// A read in flight or done: which chunk of the span, and its buffer's state.
#[derive(Clone, Copy)]
struct Slot {
    /// Index of the chunk (0 = first) the buffer holds or will hold.
    chunk: u64,
    /// Bytes read, once complete.
    done: Option<usize>,
    /// When the device model would have delivered it.
    deadline: Option<Instant>,
}

/// An io_uring instance with `depth` registered, aligned buffers of `chunk` bytes.
pub struct UringScanner {
    ring: IoUring,
    bufs: Vec<AlignedBuf>,
    chunk: usize,
}

impl std::fmt::Debug for UringScanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringScanner").field("depth", &self.bufs.len()).field("chunk", &self.chunk).finish()
    }
}

impl UringScanner {
    /// A ring for `depth` reads in flight (1–64) of `chunk` bytes (a multiple of 4 KiB, at
    /// most 16 MiB), with its buffers registered. Fails where io_uring is unavailable (an
    /// old kernel, `kernel.io_uring_disabled`, a seccomp filter) or the buffers cannot be
    /// pinned (`RLIMIT_MEMLOCK`); callers then use [`Backing::read_window`].
    pub fn new(depth: usize, chunk: usize) -> io::Result<UringScanner> {
        if !(1..=64).contains(&depth) || chunk == 0 || !chunk.is_multiple_of(DIRECT_ALIGN) || chunk > 16 << 20 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("io_uring scanner: depth {depth} (1-64), chunk {chunk} (a multiple of {DIRECT_ALIGN}, at most 16 MiB)"),
            ));
        }
        let ring = IoUring::new(depth.next_power_of_two() as u32)?;
        let mut bufs: Vec<AlignedBuf> = (0..depth).map(|_| AlignedBuf::new(chunk)).collect();
        let iovecs: Vec<libc::iovec> = bufs.iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_slice().as_mut_ptr().cast(), iov_len: chunk }).collect();
        // SAFETY: the buffers live as long as the ring (both are owned by the scanner, and
        // the ring is dropped first, see the field order) and are not moved: AlignedBuf's
        // memory is a separate allocation.
        unsafe { ring.submitter().register_buffers(&iovecs)? };
        Ok(UringScanner { ring, bufs, chunk })
    }

    /// Reads in flight at once.
    pub fn depth(&self) -> usize {
        self.bufs.len()
    }

    /// Reads `[offset, offset + len)` of `media` for `purpose` and hands it to `each` in
    /// file order, in pieces of at most the chunk size, until the range ends or `each`
    /// breaks. The range need not be aligned. Media that cannot be read with direct I/O (a
    /// file in memory) is read the same way through the page cache. A device model set on
    /// the media paces each chunk as [`Backing::read_window_for`] would.
    pub fn scan(&mut self, media: &Backing, offset: u64, len: u64, purpose: ReadPurpose, mut each: impl FnMut(&[u8]) -> ControlFlow<()>) -> io::Result<()> {
        let end = offset
            .checked_add(len)
            .filter(|e| *e <= media.len())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("read of {len} bytes at {offset} is beyond the end ({})", media.len())))?;
        if len == 0 {
            return Ok(());
        }
        let (start, stop) = aligned_span(offset, end);
        let chunks = (stop - start).div_ceil(self.chunk as u64);
        let fd = types::Fd(media.direct.as_raw_fd());
        let depth = self.bufs.len();
        let mut slots: Vec<Slot> = Vec::with_capacity(depth);
        let mut next = 0u64; // next chunk to submit
        let mut deliver = 0u64; // next chunk to hand over
        let result = (|| -> io::Result<()> {
            while deliver < chunks {
                // Keep the device busy: every free buffer gets the next chunk.
                while next < chunks && slots.len() < depth {
                    let i = slots.len();
                    slots.push(Slot { chunk: next, done: None, deadline: None });
                    self.submit(media, fd, i, start, stop, next, purpose, &mut slots[i])?;
                    next += 1;
                }
                // Reuse a finished slot's buffer only after its chunk has been handed over:
                // find the slot holding the chunk to deliver, wait for it.
                let at = slots.iter().position(|s| s.chunk == deliver).expect("the chunk to deliver is in flight");
                while slots[at].done.is_none() {
                    self.complete(&mut slots)?;
                }
                if let Some(d) = slots[at].deadline {
                    media.pacing.as_ref().expect("a deadline comes from pacing").wait_until(d);
                }
                let got = slots[at].done.expect("checked");
                let chunk_start = start + deliver * self.chunk as u64;
                let want = (media.len().min(stop).min(chunk_start + self.chunk as u64) - chunk_start) as usize;
                if got < want {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("short read at {chunk_start}: {got} of {want} bytes")));
                }
                media.counters.read_bytes.fetch_add(got as u64, Ordering::Relaxed);
                // The caller's bytes within this chunk.
                let lo = offset.saturating_sub(chunk_start) as usize;
                let hi = (end.min(chunk_start + got as u64) - chunk_start) as usize;
                if each(&self.bufs[at].as_slice()[lo..hi]).is_break() {
                    return Ok(());
                }
                deliver += 1;
                if next < chunks {
                    self.submit(media, fd, at, start, stop, next, purpose, &mut slots[at])?;
                    next += 1;
                } else {
                    slots[at].chunk = u64::MAX; // drained
                }
            }
            Ok(())
        })();
        // Reads still in flight (an early stop or an error) must finish before their
        // buffers can be reused or freed.
        while slots.iter().any(|s| s.chunk != u64::MAX && s.done.is_none() && s.chunk < next) {
            if self.complete(&mut slots).is_err() {
                break;
            }
        }
        result
    }

    /// Queues the read of chunk `chunk` of `[start, stop)` into buffer `i`.
    #[allow(clippy::too_many_arguments)]
    fn submit(&mut self, media: &Backing, fd: types::Fd, i: usize, start: u64, stop: u64, chunk: u64, purpose: ReadPurpose, slot: &mut Slot) -> io::Result<()> {
        let at = start + chunk * self.chunk as u64;
        let n = (stop - at).min(self.chunk as u64) as u32;
        *slot = Slot { chunk, done: None, deadline: media.pacing.as_ref().map(|p| p.on_read(at, u64::from(n), purpose)) };
        let buf = self.bufs[i].as_mut_slice().as_mut_ptr();
        let sqe = opcode::ReadFixed::new(fd, buf, n, i as u16).offset(at).build().user_data(i as u64);
        // SAFETY: the buffer is registered at index `i` and stays untouched until this
        // read's completion has been reaped (`scan` waits for every read it queued).
        unsafe {
            self.ring.submission().push(&sqe).map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        self.ring.submit()?;
        Ok(())
    }

    /// Reaps at least one completion: polls the ring for a while, then waits in the kernel.
    fn complete(&mut self, slots: &mut [Slot]) -> io::Result<()> {
        let mut spins = 0;
        loop {
            let mut reaped = false;
            for cqe in self.ring.completion() {
                reaped = true;
                let i = cqe.user_data() as usize;
                let res = cqe.result();
                if res < 0 {
                    slots[i].done = Some(0);
                    return Err(io::Error::from_raw_os_error(-res));
                }
                slots[i].done = Some(res as usize);
            }
            if reaped {
                return Ok(());
            }
            spins += 1;
            if spins < SPINS {
                std::hint::spin_loop();
            } else {
                self.ring.submit_and_wait(1)?;
                spins = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 131 % 251) as u8).collect()
    }

    fn collect(s: &mut UringScanner, m: &Backing, off: u64, len: u64) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        s.scan(m, off, len, ReadPurpose::Offload, |b| {
            out.extend_from_slice(b);
            ControlFlow::Continue(())
        })?;
        Ok(out)
    }

    #[test]
    fn reads_any_range_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data = pattern(3 << 20 | 1234);
        std::fs::write(&path, &data).unwrap();
        let m = Backing::open(&path, true).unwrap();
        let Ok(mut s) = UringScanner::new(4, 64 << 10) else {
            eprintln!("io_uring unavailable here: nothing to test");
            return;
        };
        for (off, len) in [(0u64, data.len() as u64), (1, 100), (4095, 4097), (70_000, 1 << 20), (data.len() as u64 - 10, 10), (5, 0)] {
            let got = collect(&mut s, &m, off, len).unwrap();
            assert!(got == data[off as usize..(off + len) as usize], "range {off}+{len}");
        }
        assert!(collect(&mut s, &m, data.len() as u64 - 1, 2).is_err(), "past the end");
        // Stopping early leaves the scanner usable.
        let mut first = 0;
        s.scan(&m, 0, data.len() as u64, ReadPurpose::Host, |b| {
            first += b.len();
            ControlFlow::Break(())
        })
        .unwrap();
        assert_eq!(first, 64 << 10);
        assert!(collect(&mut s, &m, 0, 1 << 20).unwrap() == data[..1 << 20]);
    }

    #[test]
    fn refuses_bad_shapes() {
        assert!(UringScanner::new(0, 4096).is_err());
        assert!(UringScanner::new(4, 1000).is_err());
        assert!(UringScanner::new(65, 4096).is_err());
    }
}
