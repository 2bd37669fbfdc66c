// SPDX-License-Identifier: Apache-2.0
//! Streams over virtual objects on a namespace: a read-ahead feed for input objects and a
//! buffered writer for output objects.
//!
//! One I/O thread reads every input object in descriptor order, chunk by chunk, while the
//! kernel computes on the previous chunk; buffers are recycled so memory stays at
//! `DEPTH` chunks whatever the object size. Kernels read inputs in order; asking for a later
//! input skips what is left of earlier ones, and going back yields nothing.

use crate::namespace::Namespace;
use crate::ComputeBudget;
use crossbeam_channel::{bounded, Receiver, Sender};
use insitu_media::{media_cost, PooledBuf, ReadPurpose, UringScanner};
use insitu_offload::{InputStream, KernelError, OutputSink};
use insitu_proto::{ExtentKind, VirtualObject, SECTOR};
use std::cell::RefCell;
use std::io;
use std::ops::ControlFlow;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes per media read by a command's reader thread.
pub const CHUNK: usize = 2 << 20;
/// Bytes per read when the kernel reads page-cache media itself: small enough that a chunk
/// is still in the core's cache when the kernel gets to it.
pub(crate) const INLINE_CHUNK: usize = 256 << 10;
/// Chunks in flight between the I/O thread and the kernel, and reads queued on the device
/// by an io_uring reader.
const DEPTH: usize = 4;
/// io_uring readers a namespace keeps between EXECs (each pins `DEPTH` chunks of memory).
const IDLE_SCANNERS: usize = 4;

/// A run of an object's bytes: at a media byte offset, or zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) media_offset: Option<u64>,
    pub(crate) len: u64,
}

/// Translates an object's extents to media segments, from its offset and cut to its length.
pub(crate) fn segments(ns: &Namespace, obj: &VirtualObject) -> Vec<Segment> {
    let mut left = obj.length;
    let mut skip = u64::from(obj.offset);
    let mut out: Vec<Segment> = Vec::new();
    for e in &obj.extents {
        if left == 0 {
            break;
        }
        let skipped = skip.min(e.bytes());
        skip -= skipped;
        let len = (e.bytes() - skipped).min(left);
        if len == 0 {
            continue;
        }
        left -= len;
        let media_offset = match e.kind {
            ExtentKind::Data => Some(ns.offset + e.start_sector * SECTOR + skipped),
            ExtentKind::Zero => None,
        };
        // Merge runs that continue each other on the media, so fragmented lists read in
        // large requests.
        match out.last_mut() {
            Some(last) if last.media_offset.is_none() && media_offset.is_none() => last.len += len,
            Some(last) if matches!((last.media_offset, media_offset), (Some(a), Some(b)) if a + last.len == b) => last.len += len,
            _ => out.push(Segment { media_offset, len }),
        }
    }
    out
}

pub(crate) enum Msg {
    Chunk { input: usize, buf: PooledBuf, skip: usize, len: usize },
    End { input: usize },
    Failed { input: usize, error: io::Error },
}

/// Reads every input in order, one chunk per call: the messages a kernel's inputs consume.
pub(crate) struct Reader<'a> {
    ns: &'a Namespace,
    inputs: &'a [Vec<Segment>],
    chunk: usize,
    input: usize,
    seg: usize,
    pos: u64,
    /// Set after a failed read: nothing more is read.
    stopped: bool,
    media_bytes: &'a AtomicU64,
}

impl<'a> Reader<'a> {
    /// A reader of `inputs` in requests of at most `chunk` bytes; adds the bytes read from
    /// the media to `media_bytes`.
    pub(crate) fn new(ns: &'a Namespace, inputs: &'a [Vec<Segment>], chunk: usize, media_bytes: &'a AtomicU64) -> Self {
        Reader { ns, inputs, chunk, input: 0, seg: 0, pos: 0, stopped: false, media_bytes }
    }

    /// The next message, read into a buffer from `take_buf` when it is a chunk; `None`
    /// after the last input, after a failure, or when `take_buf` has none.
    fn next(&mut self, take_buf: &mut dyn FnMut() -> Option<PooledBuf>) -> Option<Msg> {
        while !self.stopped {
            let segs = self.inputs.get(self.input)?;
            let Some(seg) = segs.get(self.seg) else {
                let input = self.input;
                (self.input, self.seg, self.pos) = (input + 1, 0, 0);
                return Some(Msg::End { input });
            };
            if self.pos >= seg.len {
                (self.seg, self.pos) = (self.seg + 1, 0);
                continue;
            }
            let (input, len) = (self.input, (seg.len - self.pos).min(self.chunk as u64) as usize);
            let mut buf = take_buf()?;
            let msg = match seg.media_offset {
                Some(base) => match self.ns.media.read_window_for(&mut buf, base + self.pos, len, ReadPurpose::Offload) {
                    Ok(slice) => {
                        self.media_bytes.fetch_add(media_cost(base + self.pos, len as u64, self.ns.media.len()), Ordering::Relaxed);
                        let skip = slice.as_ptr() as usize - buf.as_slice().as_ptr() as usize;
                        Msg::Chunk { input, buf, skip, len }
                    }
                    Err(error) => {
                        self.stopped = true;
                        Msg::Failed { input, error }
                    }
                },
                None => {
                    buf.as_mut_slice()[..len].fill(0);
                    Msg::Chunk { input, buf, skip: 0, len }
                }
            };
            self.pos += len as u64;
            return Some(msg);
        }
        None
    }
}

/// Runs a reader on its own thread, sending chunks ahead of the kernel; stops early when
/// the consumer hangs up. Media read with direct I/O is read through io_uring with
/// `DEPTH` reads in flight (see [`produce_uring`]); elsewhere, or where io_uring is not
/// available, one `pread` at a time.
pub(crate) fn produce(mut reader: Reader<'_>, tx: Sender<Msg>, recycle: Receiver<PooledBuf>) {
    // The first DEPTH + 1 buffers come from the namespace's pool; then the consumer's
    // returns keep the command at that many, whatever the object size.
    let pool = reader.ns.pool.clone();
    let mut fresh = DEPTH + 1;
    let mut take_buf = || -> Option<PooledBuf> {
        if fresh > 0 {
            fresh -= 1;
            return Some(pool.take());
        }
        recycle.recv().ok()
    };
    if reader.ns.media.is_direct() && !reader.ns.media.is_in_memory() {
        let ns = reader.ns;
        let spare = ns.scanners.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some(mut scanner) = spare.or_else(|| UringScanner::new(DEPTH, reader.chunk).ok()) {
            produce_uring(&mut reader, &mut scanner, &tx, &mut take_buf);
            let mut idle = ns.scanners.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < IDLE_SCANNERS {
                idle.push(scanner);
            }
            return;
        }
    }
    while let Some(msg) = reader.next(&mut take_buf) {
        let failed = matches!(msg, Msg::Failed { .. });
        if tx.send(msg).is_err() || failed {
            return;
        }
    }
}

/// [`produce`] through io_uring: each media segment is streamed by `scanner` (several
/// reads in flight on the device while the kernel computes) and its pieces copied into
/// pooled buffers for the kernel; zero segments and the ends of inputs as [`Reader::next`]
/// makes them. The copy costs far less than the device time the queued reads save.
fn produce_uring(reader: &mut Reader<'_>, scanner: &mut UringScanner, tx: &Sender<Msg>, take_buf: &mut dyn FnMut() -> Option<PooledBuf>) {
    let media = &reader.ns.media;
    for (input, segs) in reader.inputs.iter().enumerate() {
        for seg in segs {
            let Some(base) = seg.media_offset else {
                let mut left = seg.len;
                while left > 0 {
                    let len = left.min(reader.chunk as u64) as usize;
                    let Some(mut buf) = take_buf() else { return };
                    buf.as_mut_slice()[..len].fill(0);
                    if tx.send(Msg::Chunk { input, buf, skip: 0, len }).is_err() {
                        return;
                    }
                    left -= len as u64;
                }
                continue;
            };
            let mut hung_up = false;
            let scanned = scanner.scan(media, base, seg.len, ReadPurpose::Offload, |piece| {
                let Some(mut buf) = take_buf() else {
                    hung_up = true;
                    return ControlFlow::Break(());
                };
                buf.as_mut_slice()[..piece.len()].copy_from_slice(piece);
                if tx.send(Msg::Chunk { input, buf, skip: 0, len: piece.len() }).is_err() {
                    hung_up = true;
                    return ControlFlow::Break(());
                }
                ControlFlow::Continue(())
            });
            if let Err(error) = scanned {
                let _ = tx.send(Msg::Failed { input, error });
                return;
            }
            if hung_up {
                return;
            }
            reader.media_bytes.fetch_add(media_cost(base, seg.len, media.len()), Ordering::Relaxed);
        }
        if tx.send(Msg::End { input }).is_err() {
            return;
        }
    }
}

/// Where a command's chunks come from.
enum Source<'a> {
    /// A reader thread that reads ahead while the kernel computes ([`produce`]).
    Thread { rx: Receiver<Msg>, recycle: Sender<PooledBuf> },
    /// The kernel's own thread, when asked, reusing one buffer.
    Inline { reader: Reader<'a>, spare: Option<PooledBuf> },
}

/// The consumer side shared by all input streams of one command.
pub(crate) struct Feed<'a> {
    source: Source<'a>,
    pending: Option<Msg>,
}

impl<'a> Feed<'a> {
    /// Chunks from a thread running [`produce`] on the other ends of these channels.
    pub(crate) fn threaded(rx: Receiver<Msg>, recycle: Sender<PooledBuf>) -> Rc<RefCell<Feed<'a>>> {
        Rc::new(RefCell::new(Feed { source: Source::Thread { rx, recycle }, pending: None }))
    }

    /// Chunks read on the kernel's thread when it asks for them.
    pub(crate) fn inline(reader: Reader<'a>) -> Rc<RefCell<Feed<'a>>> {
        Rc::new(RefCell::new(Feed { source: Source::Inline { reader, spare: None }, pending: None }))
    }

    fn recv(&mut self) -> Option<Msg> {
        if let Some(m) = self.pending.take() {
            return Some(m);
        }
        match &mut self.source {
            Source::Thread { rx, .. } => rx.recv().ok(),
            Source::Inline { reader, spare } => {
                let pool = reader.ns.pool.clone();
                reader.next(&mut || Some(spare.take().unwrap_or_else(|| pool.take())))
            }
        }
    }

    fn recycle(&mut self, buf: PooledBuf) {
        match &mut self.source {
            Source::Thread { recycle, .. } => {
                let _ = recycle.send(buf);
            }
            Source::Inline { spare, .. } => *spare = Some(buf),
        }
    }
}

/// Creates the channels between [`produce`] and a threaded [`Feed`].
pub(crate) fn channels() -> (Sender<Msg>, Receiver<Msg>, Sender<PooledBuf>, Receiver<PooledBuf>) {
    let (tx, rx) = bounded(DEPTH);
    let (rtx, rrx) = bounded(DEPTH + 1);
    (tx, rx, rtx, rrx)
}

/// One input object as an [`InputStream`].
pub(crate) struct ObjectInput<'a> {
    index: usize,
    len: u64,
    feed: Rc<RefCell<Feed<'a>>>,
    current: Option<(PooledBuf, usize, usize)>,
    done: bool,
    /// The CPU budget, and the kernel thread's CPU time when it was last charged (shared by
    /// every input of the command): the time between two requests is the kernel computing.
    compute: Option<Meter>,
}

/// Charges a kernel's thread CPU time to a budget, from one stamp per command.
#[derive(Clone)]
pub(crate) struct Meter {
    budget: Arc<dyn ComputeBudget>,
    stamp: Rc<std::cell::Cell<u64>>,
}

impl Meter {
    /// Starts metering the calling thread.
    pub(crate) fn start(budget: Arc<dyn ComputeBudget>) -> Meter {
        Meter { budget, stamp: Rc::new(std::cell::Cell::new(crate::thread_cpu_ns())) }
    }

    /// Charges what the thread computed since the last charge. The stall is not compute.
    pub(crate) fn charge(&self) {
        let now = crate::thread_cpu_ns();
        self.budget.charge(now.saturating_sub(self.stamp.get()));
        self.stamp.set(crate::thread_cpu_ns());
    }
}

impl<'a> ObjectInput<'a> {
    pub(crate) fn new(index: usize, len: u64, feed: Rc<RefCell<Feed<'a>>>, compute: Option<Meter>) -> Self {
        ObjectInput { index, len, feed, current: None, done: false, compute }
    }
}

impl InputStream for ObjectInput<'_> {
    fn len(&self) -> u64 {
        self.len
    }

    fn next_chunk(&mut self) -> io::Result<Option<&[u8]>> {
        if let Some(meter) = &self.compute {
            meter.charge();
        }
        let mut feed = self.feed.borrow_mut();
        if let Some((buf, _, _)) = self.current.take() {
            feed.recycle(buf);
        }
        while !self.done {
            let Some(msg) = feed.recv() else {
                return Err(io::Error::other("media reader stopped"));
            };
            match msg {
                Msg::Chunk { input, buf, .. } if input < self.index => {
                    feed.recycle(buf);
                }
                Msg::End { input } | Msg::Failed { input, .. } if input < self.index => {}
                Msg::Chunk { input, buf, skip, len } if input == self.index => {
                    self.current = Some((buf, skip, len));
                    break;
                }
                Msg::End { .. } => self.done = true,
                Msg::Failed { input, error } if input == self.index => {
                    self.done = true;
                    return Err(error);
                }
                later => {
                    // This input was skipped or already finished: leave the message for
                    // the stream it belongs to.
                    feed.pending = Some(later);
                    self.done = true;
                }
            }
        }
        drop(feed);
        Ok(self.current.as_ref().map(|(buf, skip, len)| &buf.as_slice()[*skip..*skip + *len]))
    }
}

/// One output object as an [`OutputSink`]: buffers a chunk, then writes it across the
/// object's extents. The last partial sector is padded with zeros.
pub(crate) struct ObjectOutput<'n> {
    ns: &'n Namespace,
    index: usize,
    segments: Vec<Segment>,
    capacity: u64,
    buf: PooledBuf,
    filled: usize,
    written: u64,
    seg: usize,
    seg_pos: u64,
    /// Bytes written to the media, sector padding included.
    pub(crate) media_bytes: u64,
}

impl<'n> ObjectOutput<'n> {
    pub(crate) fn new(ns: &'n Namespace, index: usize, obj: &VirtualObject) -> Self {
        ObjectOutput {
            ns,
            index,
            segments: segments(ns, obj),
            capacity: obj.length,
            buf: ns.pool.take(),
            filled: 0,
            written: 0,
            seg: 0,
            seg_pos: 0,
            media_bytes: 0,
        }
    }

    fn drain(&mut self, pad: bool) -> io::Result<()> {
        let mut n = self.filled;
        if pad {
            let padded = n.next_multiple_of(SECTOR as usize);
            self.buf.as_mut_slice()[n..padded].fill(0);
            n = padded;
        }
        let mut done = 0;
        while done < n {
            let Some(seg) = self.segments.get(self.seg) else {
                // Padding may run past the capacity only within the last sector.
                break;
            };
            let room = seg.len.next_multiple_of(SECTOR) - self.seg_pos;
            let take = (room as usize).min(n - done);
            let off = seg.media_offset.expect("outputs have only data extents") + self.seg_pos;
            self.ns.media.write_at(&self.buf.as_slice()[done..done + take], off)?;
            self.media_bytes += take as u64;
            done += take;
            self.seg_pos += take as u64;
            if self.seg_pos >= seg.len {
                self.seg += 1;
                self.seg_pos = 0;
            }
        }
        self.filled = 0;
        Ok(())
    }
}

impl OutputSink for ObjectOutput<'_> {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn write(&mut self, mut data: &[u8]) -> Result<(), KernelError> {
        if self.written + data.len() as u64 > self.capacity {
            return Err(KernelError::OutputTooSmall { index: self.index, capacity: self.capacity });
        }
        self.written += data.len() as u64;
        while !data.is_empty() {
            let take = (CHUNK - self.filled).min(data.len());
            self.buf.as_mut_slice()[self.filled..self.filled + take].copy_from_slice(&data[..take]);
            self.filled += take;
            data = &data[take..];
            if self.filled == CHUNK {
                self.drain(false)?;
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<u64, KernelError> {
        self.drain(true)?;
        Ok(self.written)
    }
}
