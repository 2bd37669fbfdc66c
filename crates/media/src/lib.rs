// SPDX-License-Identifier: Apache-2.0
//! Access to the storage behind an insitu namespace: a regular file or a block device,
//! read and written with direct I/O so that what the target computes on is never stale or
//! cached twice. Reads for hosts may instead be sent from the page cache
//! ([`Backing::with_cached_reads`]), where the kernel reads ahead of streaming hosts; direct
//! writes drop the cached pages they cover, so those reads stay coherent.
//!
//! [`Backing`] opens the store with `O_DIRECT` when the file system allows it (falling back
//! to buffered I/O on file systems such as tmpfs that refuse it) and hides the alignment
//! rules: callers address any byte range, and [`Backing::read_window`] returns a slice of
//! an [`AlignedBuf`] without an extra copy. Counters record every byte moved.
//!
//! ```
//! use insitu_media::{AlignedBuf, Backing};
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("ns.img");
//! std::fs::write(&path, vec![7u8; 8192]).unwrap();
//! let media = Backing::open(&path, false).unwrap();
//! media.write_at(b"hello", 100).unwrap();
//! let mut buf = AlignedBuf::new(4096);
//! assert_eq!(media.read_window(&mut buf, 98, 8).unwrap(), b"\x07\x07hello\x07");
//! assert_eq!(media.len(), 8192);
//! ```
#![deny(missing_docs)]

mod aligned;
mod batch;
mod pool;
mod uring;

pub use aligned::{AlignedBuf, DIRECT_ALIGN};
use batch::read_full;
pub use pool::{BlockRead, BufferPool, PoolStats, PooledBuf};
pub use uring::UringScanner;

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Who a read is for. A computational drive's flash feeds two paths: its host interface
/// (a host's Read command) and its own offload engine (EXEC), which may be narrower or
/// wider; a timing model charges each read to its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadPurpose {
    /// Data for the host (Read commands).
    Host,
    /// Data for the offload engine (EXEC inputs).
    Offload,
}

/// A timing model the media obeys (a flash device, say). Told about every transfer before
/// it happens, it answers when the modelled device would finish it; after doing the real
/// transfer the media waits until then, so a transfer takes the longer of the real and the
/// modelled time. With none set, transfers run at this machine's speed and nothing sleeps.
pub trait Pacing: Send + Sync {
    /// `len` bytes at `offset` are about to be read for `purpose`; when would the device
    /// have delivered them there?
    fn on_read(&self, offset: u64, len: u64, purpose: ReadPurpose) -> Instant;
    /// As [`Pacing::on_read`], for a read that cannot be issued before `after` (it depends
    /// on data that arrives then). By default booked now and delivered no earlier than
    /// `after`; a model with queues books it at `after` instead.
    fn on_read_after(&self, offset: u64, len: u64, purpose: ReadPurpose, after: Instant) -> Instant {
        self.on_read(offset, len, purpose).max(after)
    }
    /// A batch of reads (`(offset, len)` each) issued together, after `after` when given:
    /// when would the last have arrived? By default each is asked of
    /// [`Pacing::on_read_after`] (or [`Pacing::on_read`]) in turn; a model may book them
    /// all at once. None for an empty batch.
    fn on_reads(&self, spans: &[(u64, usize)], purpose: ReadPurpose, after: Option<Instant>) -> Option<Instant> {
        spans
            .iter()
            .map(|&(offset, len)| match after {
                Some(t) => self.on_read_after(offset, len as u64, purpose, t),
                None => self.on_read(offset, len as u64, purpose),
            })
            .max()
    }
    /// `len` bytes at `offset` are about to be written; when would the device acknowledge
    /// them? (A drive with a write-back cache acknowledges before it has programmed them.)
    fn on_write(&self, offset: u64, len: u64) -> Instant;
    /// A flush is about to be made: when would every write acknowledged so far be durable
    /// on the device? Now, by default (no write-back cache).
    fn on_flush(&self) -> Instant {
        Instant::now()
    }
    /// `len` bytes at `offset` no longer hold data (hole punched); free by default.
    fn on_discard(&self, _offset: u64, _len: u64) {}
    /// Blocks until `deadline`.
    fn wait_until(&self, deadline: Instant) {
        if let Some(d) = deadline.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
}

/// Bytes moved to and from the media since it was opened.
#[derive(Debug, Default)]
pub struct MediaCounters {
    /// Bytes read from the media (including alignment padding).
    pub read_bytes: AtomicU64,
    /// Bytes written to the media.
    pub written_bytes: AtomicU64,
}

/// An open file or block device serving one or more namespaces.
pub struct Backing {
    path: PathBuf,
    /// Used for aligned transfers; the same as `buffered` when O_DIRECT is unavailable.
    direct: File,
    /// Used for transfers that are not aligned.
    buffered: File,
    is_direct: bool,
    /// The file lives in memory (tmpfs, ramfs): reading it is a copy, with no device behind.
    in_memory: bool,
    /// Reads for hosts may be sent from the page cache (see [`Backing::with_cached_reads`]).
    cached_reads: bool,
    len: u64,
    counters: MediaCounters,
    pacing: Option<Arc<dyn Pacing>>,
    /// A file in memory mapped for reading: a batch of reads is then slices of the map
    /// (see [`Backing::read_batch_deferred`]), with no system call and no copy.
    map: Option<memmap2::Mmap>,
}

impl Backing {
    /// Opens `path` for reading and writing (or reading only when `read_only`).
    pub fn open(path: &Path, read_only: bool) -> io::Result<Backing> {
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(!read_only);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        let mut buffered = open(false).map_err(|e| with_path(e, path, "open"))?;
        // Block devices report length 0 in metadata; seeking to the end works for both kinds.
        let len = buffered.seek(SeekFrom::End(0)).map_err(|e| with_path(e, path, "size"))?;
        let (direct, is_direct) = match open(true) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (buffered.try_clone()?, false),
            Err(e) => return Err(with_path(e, path, "open with O_DIRECT")),
        };
        let in_memory = in_memory(&buffered);
        let map = if in_memory { map_file(&buffered, len) } else { None };
        Ok(Backing {
            path: path.to_owned(),
            direct,
            buffered,
            is_direct,
            in_memory,
            cached_reads: in_memory,
            len,
            counters: MediaCounters::default(),
            pacing: None,
            map,
        })
    }

    /// Lets [`Backing::send_from_page_cache`] send from a disk too (`true`), so that host
    /// reads get the kernel's read-ahead and leave without a copy on this side; with
    /// `false` they are read with direct I/O. Media in memory always sends from the page
    /// cache: that is where it lives. Direct writes drop the cached pages they cover, so
    /// reads stay coherent with writes either way.
    pub fn with_cached_reads(mut self, on: bool) -> Self {
        self.cached_reads = on || self.in_memory;
        self
    }

    /// Makes every transfer obey `pacing` (see [`Pacing`]).
    pub fn with_pacing(mut self, pacing: Arc<dyn Pacing>) -> Self {
        self.pacing = Some(pacing);
        self
    }

    /// Path the media was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for an empty store.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the store lives in memory (a file on tmpfs or ramfs), so that a read is a
    /// copy with no device latency to hide.
    pub fn is_in_memory(&self) -> bool {
        self.in_memory
    }

    /// Whether a timing model paces transfers (see [`Backing::with_pacing`]).
    pub fn is_paced(&self) -> bool {
        self.pacing.is_some()
    }

    /// Whether transfers bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.is_direct
    }

    /// Byte counters.
    pub fn counters(&self) -> &MediaCounters {
        &self.counters
    }

    /// Reads `len` bytes at `offset` for the host and returns them as a slice of `buf`
    /// (see [`Backing::read_window_for`]).
    pub fn read_window<'b>(&self, buf: &'b mut AlignedBuf, offset: u64, len: usize) -> io::Result<&'b [u8]> {
        self.read_window_for(buf, offset, len, ReadPurpose::Host)
    }

    /// Reads `len` bytes at `offset` for `purpose` and returns them as a slice of `buf`.
    ///
    /// The read covers the enclosing aligned range, so `buf` must hold `len` plus up to two
    /// alignment units; it is an error otherwise. Reading past the end is an error.
    pub fn read_window_for<'b>(&self, buf: &'b mut AlignedBuf, offset: u64, len: usize, purpose: ReadPurpose) -> io::Result<&'b [u8]> {
        let (start, stop) = self.direct_span(offset, len)?;
        let span = (stop - start) as usize;
        if span > buf.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "read window larger than buffer"));
        }
        // The aligned span may reach past the end of a store whose size is not a multiple
        // of the alignment; a short read there is expected.
        let want = (self.len.min(stop) - start) as usize;
        let paced = self.pacing.as_ref().map(|p| (p, p.on_read(offset, len as u64, purpose)));
        let got = read_full(&self.direct, &mut buf.as_mut_slice()[..span], start)?;
        if let Some((p, deadline)) = paced {
            p.wait_until(deadline);
        }
        self.counters.read_bytes.fetch_add(got as u64, Ordering::Relaxed);
        whole_read(start, got, want)?;
        let skip = (offset - start) as usize;
        Ok(&buf.as_slice()[skip..skip + len])
    }

    /// The aligned range `[start, stop)` a direct read of `len` bytes at `offset` covers;
    /// an error when those bytes are not all inside the store.
    fn direct_span(&self, offset: u64, len: usize) -> io::Result<(u64, u64)> {
        let end = offset
            .checked_add(len as u64)
            .filter(|e| *e <= self.len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("read of {len} bytes at {offset} is beyond the end ({})", self.len)))?;
        Ok(aligned_span(offset, end))
    }

    /// Reads every `(offset, len)` of `spans` for `purpose` as one batch and returns their
    /// bytes, in order, as slices of `buf` (grown when too small).
    ///
    /// A drive given a queue of reads works on all of them at once, over its channels and
    /// dies; reading one page, waiting for it, then asking for the next serialises what
    /// the drive would overlap. So every span is booked on the timing model before any is
    /// read, the real reads follow, and the call waits once, for the last span to arrive.
    /// Callers merge adjacent pages into one span, which is one system call. A span past
    /// the end is an error and nothing is read.
    pub fn read_batch_for<'b>(&'b self, spans: &[(u64, usize)], buf: &'b mut AlignedBuf, purpose: ReadPurpose) -> io::Result<Vec<&'b [u8]>> {
        let (read, deadline) = self.read_batch_deferred(spans, buf, purpose, None)?;
        if let Some(deadline) = deadline {
            self.wait_until(deadline);
        }
        Ok(read)
    }

    /// [`Backing::read_batch_for`] without the wait: the data is returned at once, with
    /// the time the timing model delivers it (None when nothing paces this media), which
    /// the caller must wait for before it answers anyone with what it computed from them.
    /// The reads are issued no earlier than `after`, when what chose them is there.
    ///
    /// A request that reads in several steps (SparF reads dimension pages, then the pages
    /// they point at) then waits once, and its threads compute while the modelled drive
    /// works, as a drive's engine overlaps its compute with its reads; no thread sleeps
    /// per read, so few threads keep many reads in flight.
    pub fn read_batch_deferred<'b>(
        &'b self,
        spans: &[(u64, usize)],
        buf: &'b mut AlignedBuf,
        purpose: ReadPurpose,
        after: Option<Instant>,
    ) -> io::Result<(Vec<&'b [u8]>, Option<Instant>)> {
        let mut reads = Vec::with_capacity(spans.len());
        let mut at = 0usize;
        for &(offset, len) in spans {
            let (start, stop) = self.direct_span(offset, len)?;
            reads.push(batch::Read { offset: start, at, len: (stop - start) as usize });
            at += (stop - start) as usize;
        }
        let deadline = self.pacing.as_ref().and_then(|p| p.on_reads(spans, purpose, after));
        if let Some(map) = &self.map {
            // Every span is inside the store (checked above), and so inside the map.
            for r in &reads {
                self.counters.read_bytes.fetch_add(self.len.min(r.offset + r.len as u64) - r.offset, Ordering::Relaxed);
            }
            return Ok((spans.iter().map(|&(offset, len)| &map[offset as usize..offset as usize + len]).collect(), deadline));
        }
        if buf.len() < at {
            *buf = AlignedBuf::new(at);
        }
        let got = batch::read_all(&self.direct, &reads, buf.as_mut_slice(), self.in_memory)?;
        for (r, got) in reads.iter().zip(got) {
            self.counters.read_bytes.fetch_add(got as u64, Ordering::Relaxed);
            whole_read(r.offset, got, (self.len.min(r.offset + r.len as u64) - r.offset) as usize)?;
        }
        let places: Vec<usize> = reads.iter().zip(spans).map(|(r, &(offset, _))| r.at + (offset - r.offset) as usize).collect();
        let buf: &'b AlignedBuf = buf;
        Ok((places.into_iter().zip(spans).map(|(at, &(_, len))| &buf.as_slice()[at..at + len]).collect(), deadline))
    }

    /// Waits until `deadline` as the media's timing model waits (see [`Pacing::wait_until`]);
    /// returns at once when nothing paces it.
    pub fn wait_until(&self, deadline: Instant) {
        if let Some(p) = &self.pacing {
            p.wait_until(deadline);
        }
    }

    /// Whether [`Backing::send_from_page_cache`] sends: media in memory, or with cached
    /// reads on (see [`Backing::with_cached_reads`]).
    pub fn can_send_from_page_cache(&self) -> bool {
        self.cached_reads
    }

    /// Books a read of `len` bytes at `offset` for the host on the timing model, and returns
    /// when the modelled device delivers it (None when nothing paces this media): a caller
    /// that sends the data with [`Backing::send_from_page_cache`] must not complete the
    /// command before then.
    pub fn book_host_read(&self, offset: u64, len: usize) -> Option<Instant> {
        self.pacing.as_ref().map(|p| p.on_read(offset, len as u64, ReadPurpose::Host))
    }

    /// Sends `len` bytes at `offset` to the socket `out` straight from the page cache
    /// (`sendfile`, which reads what is not cached yet), when
    /// [`Backing::can_send_from_page_cache`]; `Ok(false)` (nothing sent) for other media,
    /// which must be read into a buffer. Paced media is not waited for here: see
    /// [`Backing::book_host_read`].
    pub fn send_from_page_cache(&self, out: std::os::fd::BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<bool> {
        if !self.can_send_from_page_cache() {
            return Ok(false);
        }
        if offset.checked_add(len as u64).is_none_or(|e| e > self.len) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("read of {len} bytes at {offset} is beyond the end ({})", self.len)));
        }
        send_file_range(out, &self.buffered, offset, len)?;
        self.counters.read_bytes.fetch_add(len as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// Reads exactly `out.len()` bytes at `offset` into an ordinary buffer.
    pub fn read_at(&self, out: &mut [u8], offset: u64) -> io::Result<()> {
        let mut buf = AlignedBuf::new(out.len() + 2 * DIRECT_ALIGN);
        out.copy_from_slice(self.read_window(&mut buf, offset, out.len())?);
        Ok(())
    }

    /// Writes `data` at `offset`. Aligned writes bypass the page cache; others go through it
    /// (a later direct read flushes them first, so readers stay coherent).
    pub fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        if offset.checked_add(data.len() as u64).is_none_or(|e| e > self.len) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("write of {} bytes at {offset} is beyond the end ({})", data.len(), self.len)));
        }
        let paced = self.pacing.as_ref().map(|p| (p, p.on_write(offset, data.len() as u64)));
        let align = DIRECT_ALIGN as u64;
        let aligned = self.is_direct && offset.is_multiple_of(align) && (data.len() as u64).is_multiple_of(align);
        if aligned && (data.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) {
            self.direct.write_all_at(data, offset)?;
        } else if aligned {
            let mut buf = AlignedBuf::new(data.len());
            buf.as_mut_slice()[..data.len()].copy_from_slice(data);
            self.direct.write_all_at(&buf.as_slice()[..data.len()], offset)?;
        } else {
            self.buffered.write_all_at(data, offset)?;
        }
        self.counters.written_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        if let Some((p, deadline)) = paced {
            p.wait_until(deadline);
        }
        Ok(())
    }

    /// Makes `len` bytes at `offset` read as zeros: a hole punched in a regular file (space
    /// returned to the file system), zeros written on anything else.
    pub fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("zeroing {len} bytes at {offset} is beyond the end ({})", self.len)));
        }
        if let Some(p) = &self.pacing {
            p.on_discard(offset, len);
        }
        if zero_file_range(&self.buffered, offset, len)? {
            self.counters.written_bytes.fetch_add(len, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Makes every completed write durable (`fdatasync`), taking as long as the timing
    /// model's flush at least.
    pub fn flush(&self) -> io::Result<()> {
        paced_flush(self.pacing.as_deref(), || self.buffered.sync_data())
    }
}

/// Runs `sync` (a real flush) under `pacing`: the modelled flush is booked first and waited
/// for after, so the flush takes the longer of the real and the modelled time.
pub fn paced_flush(pacing: Option<&dyn Pacing>, sync: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
    let deadline = pacing.map(|p| (p, p.on_flush()));
    sync()?;
    if let Some((p, d)) = deadline {
        p.wait_until(d);
    }
    Ok(())
}

/// An error unless a read at `start` got the `want` bytes the store holds there.
fn whole_read(start: u64, got: usize, want: usize) -> io::Result<()> {
    if got < want {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("short read at {start}: {got} of {want} bytes")));
    }
    Ok(())
}

/// The range `[start, stop)` a direct read of `[offset, end)` covers: widened to
/// [`DIRECT_ALIGN`] boundaries.
pub fn aligned_span(offset: u64, end: u64) -> (u64, u64) {
    let align = DIRECT_ALIGN as u64;
    (offset / align * align, end.next_multiple_of(align))
}

/// Bytes a direct read of `len` bytes at `offset` takes from a store of `store_len` bytes.
pub fn media_cost(offset: u64, len: u64, store_len: u64) -> u64 {
    let (start, stop) = aligned_span(offset, offset.saturating_add(len));
    store_len.min(stop).saturating_sub(start)
}

/// A read-only shared map of the `len` bytes of `file`, a regular file in memory; None
/// where it cannot be mapped (reads then copy through `pread`).
///
/// Reading a page through the map is the copy `pread` would make, without the system call
/// and the buffer: an engine decodes straight from the page cache. The map is shared, so it
/// sees every write through the file. Its users read only bytes no one writes meanwhile (a
/// KV store reads pages it has written and not yet freed), and the file keeps its size
/// while this backing has it open (the daemon creates images at their size and never
/// truncates an open one), so no access falls past its end.
fn map_file(file: &File, len: u64) -> Option<memmap2::Mmap> {
    if len == 0 || !file.metadata().is_ok_and(|m| m.is_file()) || usize::try_from(len).is_err() {
        return None;
    }
    // SAFETY: see above: the mapped file is not truncated while mapped, and the bytes read
    // through the map are not written at the same time.
    unsafe { memmap2::MmapOptions::new().len(len as usize).map(file) }.ok()
}

/// Whether `file` is on a memory file system (tmpfs or ramfs).
fn in_memory(file: &File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    // SAFETY: fstatfs writes one struct statfs, which lives on this stack frame.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above, on an open fd.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut s) };
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    let ty = s.f_type as i64;
    rc == 0 && (ty == TMPFS_MAGIC || ty == RAMFS_MAGIC)
}

fn with_path(e: io::Error, path: &Path, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// Sends `len` bytes of `file` at `offset` to the socket `out` with `sendfile`: the kernel
/// hands the file's cached pages to the socket, with no copy through user memory.
pub fn send_file_range(out: std::os::fd::BorrowedFd<'_>, file: &File, offset: u64, len: usize) -> io::Result<()> {
    let mut off = libc::off_t::try_from(offset).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset out of range"))?;
    let mut left = len;
    while left > 0 {
        // SAFETY: both descriptors are open for the call; `off` is a valid off_t.
        let n = unsafe { libc::sendfile(out.as_raw_fd(), file.as_raw_fd(), &raw mut off, left) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("short read at {off}: the file ended")));
        }
        left -= n as usize;
    }
    Ok(())
}

/// Makes `len` bytes of `file` at `offset` read as zeros: a punched hole, or zeros written
/// where the file system cannot punch one. Returns whether zeros were written.
pub fn zero_file_range(file: &File, offset: u64, len: u64) -> io::Result<bool> {
    let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "range too large"));
    };
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: plain syscall on an open fd; no memory is passed.
    if unsafe { libc::fallocate(file.as_raw_fd(), mode, off, n) } == 0 {
        return Ok(false);
    }
    let zeros = vec![0u8; 1 << 20];
    let mut done = 0;
    while done < len {
        let take = (len - done).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..take], offset + done)?;
        done += take as u64;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(len: usize) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ns.img");
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&path, data).unwrap();
        (dir, path)
    }

    #[test]
    fn sends_from_the_page_cache_in_memory_or_when_asked() {
        let (_dir, path) = store(300_000);
        let disk = Backing::open(&path, true).unwrap();
        if !disk.is_in_memory() {
            assert!(!disk.can_send_from_page_cache(), "a disk is read directly unless asked");
            let (out, _into) = socket_pair();
            assert!(!disk.send_from_page_cache(std::os::fd::AsFd::as_fd(&out), 0, 10).unwrap(), "and then sends nothing");
        }
        if let Some((_dir, copy)) = in_shm(&path) {
            let memory = Backing::open(&copy, true).unwrap().with_cached_reads(false);
            sends_the_file_from_the_page_cache(&memory, &std::fs::read(&path).unwrap());
        }
        sends_the_file_from_the_page_cache(&disk.with_cached_reads(true), &std::fs::read(&path).unwrap());
    }

    fn socket_pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let out = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (out, listener.accept().unwrap().0)
    }

    fn sends_the_file_from_the_page_cache(media: &Backing, data: &[u8]) {
        use std::io::Read;
        use std::os::fd::AsFd;
        let (out, mut into) = socket_pair();
        assert!(media.can_send_from_page_cache());
        assert!(media.send_from_page_cache(out.as_fd(), 4096, 200_000).unwrap());
        let mut got = vec![0u8; 200_000];
        into.read_exact(&mut got).unwrap();
        assert!(got == data[4096..204_096], "the bytes sent are the file's");
        assert_eq!(media.counters().read_bytes.load(Ordering::Relaxed), 200_000);
        let e = media.send_from_page_cache(out.as_fd(), data.len() as u64 - 10, 11).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        // Paced media sends too; the read is booked on its model apart.
        let rec = Arc::new(Recorder::default());
        let paced = Backing::open(media.path(), true).unwrap().with_cached_reads(true).with_pacing(rec.clone());
        assert!(paced.book_host_read(8192, 4096).is_some());
        assert!(paced.send_from_page_cache(out.as_fd(), 8192, 4096).unwrap());
        into.read_exact(&mut got[..4096]).unwrap();
        assert!(got[..4096] == data[8192..12_288]);
        assert_eq!(*rec.0.lock().unwrap(), [(false, 8192, 4096)], "the read is booked on the model");
    }

    #[test]
    fn unaligned_windows_return_the_right_bytes() {
        let (_d, path) = store(3 * 4096 + 100);
        let m = Backing::open(&path, true).unwrap();
        let mut buf = AlignedBuf::new(4 * 4096);
        for (off, len) in [(0u64, 1usize), (511, 2), (4095, 4098), (3 * 4096, 100), (1, 3 * 4096 + 99)] {
            let got = m.read_window(&mut buf, off, len).unwrap().to_vec();
            let want: Vec<u8> = (off as usize..off as usize + len).map(|i| (i * 31 % 251) as u8).collect();
            assert_eq!(got, want, "offset {off} len {len}");
        }
    }

    #[test]
    fn a_batch_returns_each_span_and_books_all_before_reading() {
        let (_d, path) = store(6 * 4096 + 100);
        a_batch_on(&path);
        // A file in memory is read through its map: the same bytes, bookings and counts.
        if let Some((_dir, memory)) = in_shm(&path) {
            a_batch_on(&memory);
        }
    }

    /// A copy of the file at `path` on /dev/shm, where there is one.
    fn in_shm(path: &Path) -> Option<(tempfile::TempDir, PathBuf)> {
        let shm = Path::new("/dev/shm");
        shm.is_dir().then(|| {
            let dir = tempfile::tempdir_in(shm).unwrap();
            let copy = dir.path().join("ns.img");
            std::fs::copy(path, &copy).unwrap();
            (dir, copy)
        })
    }

    fn a_batch_on(path: &Path) {
        let rec = Arc::new(Recorder::default());
        let m = Backing::open(path, true).unwrap().with_pacing(rec.clone());
        let spans = [(2 * 4096u64, 2 * 4096usize), (0, 4096), (511, 3), (5 * 4096 + 7, 4096 + 93)];
        let mut buf = AlignedBuf::new(4096); // too small: grown
        let got: Vec<Vec<u8>> = m.read_batch_for(&spans, &mut buf, ReadPurpose::Offload).unwrap().into_iter().map(<[u8]>::to_vec).collect();
        for (&(off, len), got) in spans.iter().zip(&got) {
            let want: Vec<u8> = (off as usize..off as usize + len).map(|i| (i * 31 % 251) as u8).collect();
            assert_eq!(got, &want, "offset {off} len {len}");
        }
        let booked: Vec<(bool, u64, u64)> = spans.iter().map(|&(o, l)| (false, o, l as u64)).collect();
        assert_eq!(*rec.0.lock().unwrap(), booked);
        // Whole aligned units, the last one cut at the end of the store.
        let cost: u64 = spans.iter().map(|&(o, l)| media_cost(o, l as u64, m.len())).sum();
        assert_eq!(m.counters().read_bytes.load(Ordering::Relaxed), cost);
        // One span past the end: an error, and nothing booked or read.
        rec.0.lock().unwrap().clear();
        let before = m.counters().read_bytes.load(Ordering::Relaxed);
        assert!(m.read_batch_for(&[(0, 4096), (6 * 4096, 101)], &mut buf, ReadPurpose::Host).is_err());
        assert!(rec.0.lock().unwrap().is_empty());
        assert_eq!(m.counters().read_bytes.load(Ordering::Relaxed), before);
    }

    #[test]
    fn a_batch_in_memory_sees_every_write() {
        let (_d, path) = store(4 * 4096);
        let Some((_dir, memory)) = in_shm(&path) else { return };
        let m = Backing::open(&memory, false).unwrap();
        let mut buf = AlignedBuf::new(0);
        assert_eq!(
            m.read_batch_for(&[(4096, 8)], &mut buf, ReadPurpose::Offload).unwrap()[0],
            [4096usize, 4097, 4098, 4099, 4100, 4101, 4102, 4103].map(|i| (i * 31 % 251) as u8)
        );
        m.write_at(&[7u8; 4096], 4096).unwrap();
        let got = m.read_batch_for(&[(4096, 4096), (0, 1)], &mut buf, ReadPurpose::Offload).unwrap();
        assert!(got[0].iter().all(|&b| b == 7), "a read after a write returns what was written");
        assert_eq!(got[1], [0]);
    }

    #[test]
    fn reads_past_the_end_fail() {
        let (_d, path) = store(4096);
        let m = Backing::open(&path, true).unwrap();
        let mut buf = AlignedBuf::new(8192);
        assert!(m.read_window(&mut buf, 4000, 97).is_err());
        assert!(m.read_window(&mut buf, u64::MAX, 1).is_err());
    }

    #[test]
    fn writes_of_any_alignment_are_read_back() {
        let (_d, path) = store(4 * 4096);
        let m = Backing::open(&path, false).unwrap();
        let a = vec![0xAAu8; 4096];
        m.write_at(&a, 4096).unwrap();
        m.write_at(b"xyz", 10).unwrap();
        m.flush().unwrap();
        let mut out = vec![0u8; 4096];
        m.read_at(&mut out, 4096).unwrap();
        assert_eq!(out, a);
        let mut small = [0u8; 3];
        m.read_at(&mut small, 10).unwrap();
        assert_eq!(&small, b"xyz");
        assert!(m.write_at(b"x", 4 * 4096).is_err());
        assert_eq!(m.counters().written_bytes.load(Ordering::Relaxed), 4099);
        m.zero_range(4096 + 100, 5000).unwrap();
        m.read_at(&mut out, 4096).unwrap();
        assert!(out[100..].iter().all(|b| *b == 0) && out[..100].iter().all(|b| *b == 0xAA));
        assert!(m.zero_range(4 * 4096 - 1, 2).is_err());
    }

    #[derive(Default)]
    struct Recorder(std::sync::Mutex<Vec<(bool, u64, u64)>>);

    impl Pacing for Recorder {
        fn on_read(&self, offset: u64, len: u64, _: ReadPurpose) -> Instant {
            self.0.lock().unwrap().push((false, offset, len));
            Instant::now()
        }
        fn on_write(&self, offset: u64, len: u64) -> Instant {
            self.0.lock().unwrap().push((true, offset, len));
            Instant::now()
        }
        fn on_discard(&self, offset: u64, len: u64) {
            self.0.lock().unwrap().push((true, offset, len + 1));
        }
        fn on_flush(&self) -> Instant {
            self.0.lock().unwrap().push((true, u64::MAX, 0));
            Instant::now() + std::time::Duration::from_millis(5)
        }
    }

    #[test]
    fn pacing_sees_every_transfer_as_requested() {
        let (_d, path) = store(4 * 4096);
        let rec = Arc::new(Recorder::default());
        let m = Backing::open(&path, false).unwrap().with_pacing(rec.clone());
        let mut buf = AlignedBuf::new(3 * 4096);
        m.read_window(&mut buf, 100, 5000).unwrap();
        m.write_at(b"abc", 7).unwrap();
        m.zero_range(4096, 512).unwrap();
        assert_eq!(*rec.0.lock().unwrap(), vec![(false, 100, 5000), (true, 7, 3), (true, 4096, 513)]);
        let t = Instant::now();
        m.flush().unwrap();
        assert!(t.elapsed() >= std::time::Duration::from_millis(5), "a flush lasts as long as the model's");
        assert_eq!(rec.0.lock().unwrap().last(), Some(&(true, u64::MAX, 0)));
    }

    /// Delivers every read a fixed time after it is asked for, or after `after`.
    struct Slow(std::time::Duration);

    impl Pacing for Slow {
        fn on_read(&self, _: u64, _: u64, _: ReadPurpose) -> Instant {
            Instant::now() + self.0
        }
        fn on_read_after(&self, _: u64, _: u64, _: ReadPurpose, after: Instant) -> Instant {
            after.max(Instant::now()) + self.0
        }
        fn on_write(&self, _: u64, _: u64) -> Instant {
            Instant::now()
        }
    }

    #[test]
    fn a_deferred_batch_returns_its_data_and_deadline_at_once_and_a_batch_waits() {
        let (_d, path) = store(4 * 4096);
        let m = Backing::open(&path, false).unwrap().with_pacing(Arc::new(Slow(std::time::Duration::from_secs(30))));
        m.write_at(&[7u8; 4096], 4096).unwrap();
        let mut buf = AlignedBuf::new(2 * 4096);
        let t = Instant::now();
        let (read, deadline) = m.read_batch_deferred(&[(4096, 4096)], &mut buf, ReadPurpose::Offload, None).unwrap();
        assert!(read[0].iter().all(|&b| b == 7));
        let deadline = deadline.expect("paced media gives a deadline");
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "a deferred read does not wait");
        assert!(deadline >= t + std::time::Duration::from_secs(30));
        // A read that depends on the first is delivered after it.
        let (_, next) = m.read_batch_deferred(&[(0, 4096)], &mut buf, ReadPurpose::Offload, Some(deadline)).unwrap();
        assert!(next.unwrap() >= deadline + std::time::Duration::from_secs(30));
        let m = Backing::open(&path, false).unwrap().with_pacing(Arc::new(Slow(std::time::Duration::from_millis(20))));
        let t = Instant::now();
        m.read_batch_for(&[(0, 4096), (8192, 4096)], &mut buf, ReadPurpose::Offload).unwrap();
        assert!(t.elapsed() >= std::time::Duration::from_millis(20), "a batch waits for its reads");
        let unpaced = Backing::open(&path, false).unwrap();
        assert_eq!(unpaced.read_batch_deferred(&[(0, 4096)], &mut buf, ReadPurpose::Offload, None).unwrap().1, None);
    }
}
