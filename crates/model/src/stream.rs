// SPDX-License-Identifier: Apache-2.0
//! Streamed reads: how a sequential reader's requests reach a drive.
//!
//! A target reads an object one chunk at a time, asking for the next when the kernel wants
//! it. Booked at that moment, every chunk would pay the flash's sense latency and the gap
//! between requests, and an emulated drive would deliver only 85–92 % of its sequential
//! rate although the reader streams from a known extent list. A real reader (and a drive's
//! own read-ahead) keeps the next request in flight: a [`ReadStream`] books a read that
//! continues the previous one (starting within [`READAHEAD_WINDOW`] after its end) as a
//! reader at queue depth 2 would have issued it: once the request before the previous one
//! completed, and not before the previous one was issued. Data is never delivered before
//! the model says it arrived; a read that does not continue the stream is issued when it is
//! asked for and pays the full latency. Several readers at once (concurrent EXECs over
//! different objects) each keep a stream of their own: [`ReadStreams`] follows up to
//! [`STREAMS`] of them, recognised by where their next read starts.

/// A read starting at most this far after the end of the previous one continues the stream
/// (a lightly fragmented file keeps the drive streaming).
pub const READAHEAD_WINDOW: u64 = 1 << 20;

/// Streams followed at once by a [`ReadStreams`]; a new stream replaces the one used longest
/// ago.
pub const STREAMS: usize = 8;

/// Where one reader's stream stands, on a model's clock (ns).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReadStream {
    prev_end: Option<u64>,
    prev_issue: u64,
    prev_done: u64,
    done_before: u64,
}

impl ReadStream {
    /// When a read of `offset..` asked for at `now` is issued to the drive, and whether it
    /// continues the stream.
    pub fn issue(&self, now: u64, offset: u64) -> (u64, bool) {
        let continues = self.prev_end.is_some_and(|end| offset >= end && offset - end <= READAHEAD_WINDOW);
        let issue = if continues { self.done_before.max(self.prev_issue).min(now) } else { now };
        (issue, continues)
    }

    /// Records a read of `len` bytes at `offset`, issued at `issue` and done at `done`.
    pub fn record(&mut self, offset: u64, len: u64, issue: u64, done: u64) {
        *self = ReadStream { prev_end: Some(offset + len), prev_issue: issue, prev_done: done, done_before: self.prev_done };
    }

    /// Ends the stream: the next read pays the full latency (a write came in between).
    pub fn interrupt(&mut self) {
        self.prev_end = None;
    }
}

/// Several readers' streams: a read continues whichever stream it follows.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReadStreams {
    streams: [ReadStream; STREAMS],
    /// When each stream was last used, as a count of reads booked.
    used: [u64; STREAMS],
    reads: u64,
}

/// A read's place among the [`ReadStreams`], from [`ReadStreams::issue`] to
/// [`ReadStreams::record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSlot(usize);

impl ReadStreams {
    /// When a read of `offset..` asked for at `now` is issued to the drive, whether it
    /// continues a stream, and the stream it belongs to from now on (the one it continues,
    /// else the one used longest ago).
    pub fn issue(&self, now: u64, offset: u64) -> (u64, bool, StreamSlot) {
        let continued = self.streams.iter().enumerate().map(|(i, s)| (i, s.issue(now, offset))).find(|(_, (_, continues))| *continues);
        match continued {
            Some((i, (issue, _))) => (issue, true, StreamSlot(i)),
            None => {
                let oldest = (0..STREAMS).min_by_key(|i| self.used[*i]).unwrap_or(0);
                (now, false, StreamSlot(oldest))
            }
        }
    }

    /// Records a read of `len` bytes at `offset` in `slot`, issued at `issue`, done at
    /// `done`; a read that started a stream starts it afresh.
    pub fn record(&mut self, slot: StreamSlot, continued: bool, offset: u64, len: u64, issue: u64, done: u64) {
        let s = &mut self.streams[slot.0];
        if !continued {
            *s = ReadStream::default();
        }
        s.record(offset, len, issue, done);
        self.reads += 1;
        self.used[slot.0] = self.reads;
    }

    /// Ends every stream (a write came in between).
    pub fn interrupt(&mut self) {
        self.streams.iter_mut().for_each(ReadStream::interrupt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_readers_keep_their_own_streams() {
        let mut s = ReadStreams::default();
        let book = |s: &mut ReadStreams, now: u64, offset: u64| {
            let (issue, continued, slot) = s.issue(now, offset);
            s.record(slot, continued, offset, 4096, issue, now + 100);
            continued
        };
        // Two scans interleaved, far apart: each continues its own stream.
        assert!(!book(&mut s, 0, 0));
        assert!(!book(&mut s, 0, 1 << 30));
        for i in 1..10u64 {
            assert!(book(&mut s, i * 1000, i * 4096), "scan A, read {i}");
            assert!(book(&mut s, i * 1000, (1 << 30) + i * 4096), "scan B, read {i}");
        }
        // More readers than streams: the one used longest ago makes room.
        for r in 0..STREAMS as u64 {
            assert!(!book(&mut s, 20_000, (r + 2) << 32));
        }
        assert!(!book(&mut s, 30_000, 10 * 4096), "scan A's stream was replaced");
        s.interrupt();
        assert!(!book(&mut s, 40_000, 11 * 4096));
    }

    #[test]
    fn continuing_reads_are_issued_as_at_queue_depth_two() {
        let mut s = ReadStream::default();
        assert_eq!(s.issue(1000, 0), (1000, false), "a first read is issued when asked");
        s.record(0, 4096, 1000, 5000);
        // Asked for at 6000, right after the first: issued when the one before the
        // previous completed (0) but not before the previous was issued (1000).
        assert_eq!(s.issue(6000, 4096), (1000, true));
        s.record(4096, 4096, 1000, 9000);
        assert_eq!(s.issue(20_000, 8192), (5000, true), "issued once the read before the previous was done");
        assert_eq!(s.issue(3000, 8192), (3000, true), "never before it is asked for");
        assert!(!s.issue(20_000, 8192 + READAHEAD_WINDOW + 1).1, "a jump ends the stream");
        assert!(!s.issue(20_000, 0).1, "going back ends the stream");
        s.interrupt();
        assert_eq!(s.issue(20_000, 8192), (20_000, false));
    }
}
