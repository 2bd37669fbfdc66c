// SPDX-License-Identifier: Apache-2.0
//! The byte streams kernels read from and write to, and in-memory versions of both.

use crate::KernelError;
use std::io;

/// One input object's bytes, delivered in order as a sequence of chunks.
pub trait InputStream {
    /// Exact length of the object in bytes.
    fn len(&self) -> u64;
    /// True when the object is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The next non-empty chunk, or `None` after the last byte. The chunk is valid until the
    /// next call. Chunk boundaries fall anywhere, even inside a line or a CSV field.
    fn next_chunk(&mut self) -> io::Result<Option<&[u8]>>;
}

/// An output object: a byte sink of fixed capacity.
pub trait OutputSink {
    /// Capacity in bytes.
    fn capacity(&self) -> u64;
    /// Appends bytes; fails with [`KernelError::OutputTooSmall`] rather than write past the
    /// capacity.
    fn write(&mut self, data: &[u8]) -> Result<(), KernelError>;
    /// Flushes what is buffered and returns the total bytes written.
    fn finish(&mut self) -> Result<u64, KernelError>;
}

/// An [`InputStream`] over a byte slice, cut into chunks of a given size (for tests and for
/// data already in memory).
pub struct SliceInput<'a> {
    data: &'a [u8],
    chunk: usize,
    pos: usize,
}

impl<'a> SliceInput<'a> {
    /// A stream over `data` in chunks of `chunk` bytes (at least 1).
    pub fn new(data: &'a [u8], chunk: usize) -> Self {
        SliceInput { data, chunk: chunk.max(1), pos: 0 }
    }
}

impl InputStream for SliceInput<'_> {
    fn len(&self) -> u64 {
        self.data.len() as u64
    }

    fn next_chunk(&mut self) -> io::Result<Option<&[u8]>> {
        if self.pos >= self.data.len() {
            return Ok(None);
        }
        let end = (self.pos + self.chunk).min(self.data.len());
        let out = &self.data[self.pos..end];
        self.pos = end;
        Ok(Some(out))
    }
}

/// An [`OutputSink`] into a `Vec`, with a capacity.
#[derive(Debug, Default)]
pub struct VecSink {
    /// Bytes written so far.
    pub data: Vec<u8>,
    /// Capacity in bytes.
    pub capacity: u64,
    /// Index reported in [`KernelError::OutputTooSmall`].
    pub index: usize,
}

impl VecSink {
    /// An empty sink of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        VecSink { data: Vec::new(), capacity, index: 0 }
    }
}

impl OutputSink for VecSink {
    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn write(&mut self, data: &[u8]) -> Result<(), KernelError> {
        if self.data.len() as u64 + data.len() as u64 > self.capacity {
            return Err(KernelError::OutputTooSmall { index: self.index, capacity: self.capacity });
        }
        self.data.extend_from_slice(data);
        Ok(())
    }

    fn finish(&mut self) -> Result<u64, KernelError> {
        Ok(self.data.len() as u64)
    }
}

/// An [`io::Write`] adapter over an [`OutputSink`], for encoders that write through
/// `io::Write` (zstd, csv). A sink error travels inside the `io::Error` and
/// [`unwrap_io`] turns it back into the original [`KernelError`] (e.g. `OutputTooSmall`).
pub(crate) struct SinkWriter<'a> {
    sink: &'a mut dyn OutputSink,
}

impl<'a> SinkWriter<'a> {
    pub(crate) fn new(sink: &'a mut dyn OutputSink) -> Self {
        SinkWriter { sink }
    }
}

impl io::Write for SinkWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sink.write(buf).map_err(io::Error::other)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Recovers a [`KernelError`] that a [`SinkWriter`] wrapped into an `io::Error`; any other
/// I/O error becomes [`KernelError::Io`].
pub(crate) fn unwrap_io(e: io::Error) -> KernelError {
    if e.get_ref().is_some_and(|inner| inner.is::<KernelError>()) {
        if let Some(inner) = e.into_inner() {
            if let Ok(k) = inner.downcast::<KernelError>() {
                return *k;
            }
        }
        // Unreachable: `is::<KernelError>()` held just above.
        return KernelError::Failed("lost a wrapped kernel error".into());
    }
    KernelError::Io(e)
}

/// An [`io::Read`] adapter over an [`InputStream`]. The stream lends each chunk only until
/// the next call, so the adapter copies one chunk at a time into its own buffer.
pub(crate) struct ChunkReader<'a> {
    input: &'a mut dyn InputStream,
    buf: Vec<u8>,
    pos: usize,
}

impl<'a> ChunkReader<'a> {
    pub(crate) fn new(input: &'a mut dyn InputStream) -> Self {
        ChunkReader { input, buf: Vec::new(), pos: 0 }
    }
}

impl io::Read for ChunkReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
            match self.input.next_chunk()? {
                Some(chunk) => self.buf.extend_from_slice(chunk),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
