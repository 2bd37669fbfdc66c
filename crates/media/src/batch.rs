// SPDX-License-Identifier: Apache-2.0
//! Many reads at once: the real side of [`crate::Backing::read_batch_for`].
//!
//! Reads made one after the other each wait for the device in turn; a drive (and the
//! virtual disk behind a VM) serves a queue of them in parallel. Here every read of a batch
//! is queued on an io_uring of the calling thread's own, kept for its later batches (a ring
//! costs system calls and mapped memory to make), and the call returns when all are done.
//! Where io_uring cannot be had (an old kernel, `kernel.io_uring_disabled`, a seccomp
//! filter) the reads are made one after the other with `pread`, as before.

use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// Reads in flight at once on a thread's ring.
const RING_DEPTH: u32 = 64;

thread_local! {
    /// This thread's ring: made at its first batch; `None` once making one failed.
    static RING: RefCell<Option<Option<IoUring>>> = const { RefCell::new(None) };
}

/// One read of a batch: `len` bytes of the file at `offset` into `buf[at..at + len]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Read {
    pub offset: u64,
    pub at: usize,
    pub len: usize,
}

/// Makes every read of `reads` (regions of `buf` that do not overlap) and returns the bytes
/// each got (fewer than asked only at the end of the file). The first error is returned
/// after every read queued has completed, so no read is left writing into `buf`. With
/// `in_memory` (a file on tmpfs) the reads are plain copies on this thread: io_uring would
/// hand each to a kernel worker thread (tmpfs cannot read without blocking), paying a
/// thread switch per read for no overlap a copy could gain.
pub(crate) fn read_all(file: &File, reads: &[Read], buf: &mut [u8], in_memory: bool) -> io::Result<Vec<usize>> {
    for r in reads {
        assert!(r.at + r.len <= buf.len(), "a batch read outside its buffer");
    }
    if reads.len() > 1 && !in_memory {
        let done = RING.with(|cell| {
            let mut slot = cell.borrow_mut();
            let ring = slot.get_or_insert_with(|| IoUring::new(RING_DEPTH).ok());
            ring.as_mut().map(|ring| on_ring(ring, file, reads, buf))
        });
        if let Some(done) = done {
            return done;
        }
    }
    reads.iter().map(|r| read_full(file, &mut buf[r.at..r.at + r.len], r.offset)).collect()
}

/// The reads through `ring`: queued while it has room, completions taken as they come.
fn on_ring(ring: &mut IoUring, file: &File, reads: &[Read], buf: &mut [u8]) -> io::Result<Vec<usize>> {
    let fd = types::Fd(file.as_raw_fd());
    let base = buf.as_mut_ptr();
    let mut got: Vec<Option<io::Result<usize>>> = (0..reads.len()).map(|_| None).collect();
    let (mut next, mut in_flight) = (0usize, 0usize);
    while next < reads.len() || in_flight > 0 {
        while next < reads.len() && in_flight < RING_DEPTH as usize {
            let r = reads[next];
            // SAFETY: the region lies in `buf` (checked by the caller), which outlives every
            // read queued here: this function returns only when none is in flight.
            let entry = opcode::Read::new(fd, unsafe { base.add(r.at) }, r.len as u32).offset(r.offset).build().user_data(next as u64);
            // SAFETY: as above; the entry's buffer stays valid until its completion.
            if unsafe { ring.submission().push(&entry) }.is_err() {
                break; // the queue is full: submit what is there first
            }
            next += 1;
            in_flight += 1;
        }
        if let Err(e) = ring.submit_and_wait(1) {
            // Interrupted, or the kernel short of resources for now: the entries stay queued
            // and go with the next try. Reads already taken must complete before `buf` may
            // be let go, so only a ring with none in flight gives up.
            let transient = e.kind() == io::ErrorKind::Interrupted || matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY));
            if !transient && in_flight == 0 {
                return Err(e);
            }
        }
        for cqe in ring.completion() {
            let i = cqe.user_data() as usize;
            in_flight -= 1;
            let res = cqe.result();
            got[i] = Some(if res < 0 { Err(io::Error::from_raw_os_error(-res)) } else { Ok(res as usize) });
        }
    }
    let mut out = Vec::with_capacity(reads.len());
    for (r, g) in reads.iter().zip(got) {
        let n = match g.expect("every read completed") {
            // A short read (a signal, or the end of the file): the rest the ordinary way.
            Ok(n) if n < r.len && n > 0 => n + read_full(file, &mut buf[r.at + n..r.at + r.len], r.offset + n as u64)?,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => read_full(file, &mut buf[r.at..r.at + r.len], r.offset)?,
            Err(e) => return Err(e),
        };
        out.push(n);
    }
    Ok(out)
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
pub(crate) fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
