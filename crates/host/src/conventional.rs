// SPDX-License-Identifier: Apache-2.0
//! The conventional path: the same kernel on the host, fed by ordinary reads through the
//! file system after the caches are dropped, so every byte comes from the device.

use crate::device::DeviceMap;
use crate::pool::drop_cached_pages;
use insitu_offload::{InputStream, KernelError, OutputSink};
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};

/// Bytes per read call.
const READ_CHUNK: usize = 2 << 20;

/// Makes the next read of `file` come from the device: its pages, and the loop device's
/// cached pages of the image, are evicted.
pub fn make_cold(file: &File, map: Option<&DeviceMap>) -> io::Result<()> {
    drop_cached_pages(file)?;
    if let Some(map) = map {
        if let Ok(backing) = File::open(&map.backing) {
            drop_cached_pages(&backing)?;
        }
    }
    Ok(())
}

/// Sectors read by a block device so far, from `/sys/class/block/NAME/stat`.
pub fn device_read_bytes(device: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/sys/class/block/{device}/stat")).ok()?;
    stat.split_whitespace().nth(2)?.parse::<u64>().ok().map(|s| s * 512)
}

/// A file read through the file system as an [`InputStream`].
pub struct FileInput {
    file: File,
    len: u64,
    buf: Vec<u8>,
    /// Bytes returned by `read` calls so far.
    pub read_bytes: u64,
}

impl FileInput {
    /// Streams `file`, whose length is `len`.
    pub fn new(file: File, len: u64) -> Self {
        FileInput { file, len, buf: vec![0; READ_CHUNK], read_bytes: 0 }
    }
}

impl InputStream for FileInput {
    fn len(&self) -> u64 {
        self.len
    }

    fn next_chunk(&mut self) -> io::Result<Option<&[u8]>> {
        let mut filled = 0;
        while filled < self.buf.len() {
            match self.file.read(&mut self.buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.read_bytes += filled as u64;
        Ok((filled > 0).then(|| &self.buf[..filled]))
    }
}

/// A file written through the file system as an [`OutputSink`] of unbounded capacity.
pub struct FileOutput {
    out: BufWriter<File>,
    written: u64,
}

impl FileOutput {
    /// Writes into `file` from its start.
    pub fn new(file: File) -> Self {
        FileOutput { out: BufWriter::with_capacity(1 << 20, file), written: 0 }
    }
}

impl OutputSink for FileOutput {
    fn capacity(&self) -> u64 {
        u64::MAX
    }

    fn write(&mut self, data: &[u8]) -> Result<(), KernelError> {
        self.out.write_all(data)?;
        self.written += data.len() as u64;
        Ok(())
    }

    fn finish(&mut self) -> Result<u64, KernelError> {
        self.out.flush()?;
        self.out.get_ref().sync_data()?;
        Ok(self.written)
    }
}
