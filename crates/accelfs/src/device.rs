// SPDX-License-Identifier: Apache-2.0
//! What the file system stores its blocks on: [`BlockDevice`], with [`FileDevice`] (a byte
//! range of a file or block device) and [`MemDevice`] (memory, with simulated power loss).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Byte-addressed storage with a durability barrier. The file system transfers whole,
/// block-aligned runs of 4 KiB blocks, and relies on one thing only: what was written
/// before a successful [`BlockDevice::sync`] survives a crash after it.
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    /// Fills `buf` from `offset`; an error if that reaches past [`BlockDevice::len`].
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`; an error if that reaches past [`BlockDevice::len`].
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every write that returned before this call durable.
    fn sync(&self) -> io::Result<()>;
    /// Bytes the device holds.
    fn len(&self) -> u64;
    /// Whether the device holds no byte.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The device in words, for error messages ("bytes 0..64 MiB of /x/p.img").
    fn describe(&self) -> String {
        format!("{:?}", self)
    }
}

/// A boxed device is a device, so that a caller can choose one at run time (paced or not,
/// say) and hand it to [`Fs`](crate::Fs) alike.
impl<D: BlockDevice + ?Sized> BlockDevice for Box<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        (**self).write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        (**self).sync()
    }
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
}

fn out_of_range(offset: u64, n: usize, len: u64) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("a {n}-byte transfer at offset {offset} reaches past the device's end ({len} bytes)"))
}

fn range(offset: u64, n: usize, len: u64) -> io::Result<()> {
    match offset.checked_add(n as u64) {
        Some(end) if end <= len => Ok(()),
        _ => Err(out_of_range(offset, n, len)),
    }
}

/// The byte range `[base, base + len)` of a file (or block device), through the page
/// cache with positional I/O; [`BlockDevice::sync`] is `fdatasync`.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    base: u64,
    len: u64,
    what: String,
}

impl FileDevice {
    /// The range `[base, base + len)` of `file`, which must be open for reading and
    /// writing. `what` names it in error messages (e.g. the path).
    pub fn new(file: File, base: u64, len: u64, what: impl Into<String>) -> FileDevice {
        FileDevice { file, base, len, what: what.into() }
    }

    /// All of the file at `path`, opened for reading and writing.
    pub fn open(path: impl AsRef<Path>) -> io::Result<FileDevice> {
        let path = path.as_ref();
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len();
        Ok(FileDevice::new(file, 0, len, path.display().to_string()))
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        range(offset, buf.len(), self.len)?;
        self.file.read_exact_at(buf, self.base + offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        range(offset, buf.len(), self.len)?;
        self.file.write_all_at(buf, self.base + offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn describe(&self) -> String {
        format!("bytes {}..{} of {}", self.base, self.base + self.len, self.what)
    }
}

/// What survives a simulated crash of a [`MemDevice`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Only what was synced.
    DropUnsynced,
    /// What was synced, plus each 4 KiB-aligned piece of every later write with
    /// probability ½ (applied in write order), as a disk that reorders its cache would.
    /// `seed` picks the pieces.
    KeepRandom {
        /// Seed of the piece picker.
        seed: u64,
    },
}

/// A device in memory for tests. Clones share the device, so a test can keep one while the
/// file system owns another, then [`MemDevice::crash`] it or cut its power with
/// [`MemDevice::fail_after_writes`].
#[derive(Clone)]
pub struct MemDevice {
    inner: Arc<Mutex<MemInner>>,
}

struct MemInner {
    /// What a reader sees now.
    current: Vec<u8>,
    /// What the last sync made durable.
    durable: Vec<u8>,
    /// Writes since that sync, in order.
    unsynced: Vec<(u64, Vec<u8>)>,
    /// Writes the device accepts before "losing power" (`None`: no limit).
    writes_left: Option<u64>,
    writes: u64,
}

impl std::fmt::Debug for MemDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a {}-byte memory device", self.len())
    }
}

impl MemDevice {
    /// A zeroed device of `len` bytes.
    pub fn new(len: u64) -> MemDevice {
        MemDevice::from_image(vec![0; len as usize])
    }

    /// A device holding `image`, all of it durable.
    pub fn from_image(image: Vec<u8>) -> MemDevice {
        let inner = MemInner { durable: image.clone(), current: image, unsynced: Vec::new(), writes_left: None, writes: 0 };
        MemDevice { inner: Arc::new(Mutex::new(inner)) }
    }

    fn lock(&self) -> MutexGuard<'_, MemInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What a reader sees now.
    pub fn image(&self) -> Vec<u8> {
        self.lock().current.clone()
    }

    /// Writes accepted so far.
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    /// After `n` more writes, the device fails every write and sync, as if its power were
    /// cut; `None` lifts the limit.
    pub fn fail_after_writes(&self, n: Option<u64>) {
        self.lock().writes_left = n;
    }

    /// A new, independent device holding what would survive a crash now, as `mode` says.
    /// This device goes on unchanged.
    pub fn crash(&self, mode: CrashMode) -> MemDevice {
        let g = self.lock();
        let mut image = g.durable.clone();
        if let CrashMode::KeepRandom { seed } = mode {
            let mut rng = seed ^ 0x9E37_79B9_7F4A_7C15;
            for (offset, data) in &g.unsynced {
                let mut at = 0usize;
                while at < data.len() {
                    let abs = *offset as usize + at;
                    let n = (4096 - abs % 4096).min(data.len() - at);
                    // xorshift64: enough to pick pieces, and no dependency for it.
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    if rng & 1 == 1 {
                        image[abs..abs + n].copy_from_slice(&data[at..at + n]);
                    }
                    at += n;
                }
            }
        }
        MemDevice::from_image(image)
    }

    fn power(g: &MemInner) -> io::Result<()> {
        match g.writes_left {
            Some(0) => Err(io::Error::other("simulated power loss")),
            _ => Ok(()),
        }
    }
}

impl BlockDevice for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let g = self.lock();
        range(offset, buf.len(), g.current.len() as u64)?;
        buf.copy_from_slice(&g.current[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut g = self.lock();
        range(offset, buf.len(), g.current.len() as u64)?;
        MemDevice::power(&g)?;
        if let Some(n) = &mut g.writes_left {
            *n -= 1;
        }
        g.writes += 1;
        g.current[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        g.unsynced.push((offset, buf.to_vec()));
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        let mut g = self.lock();
        MemDevice::power(&g)?;
        let MemInner { durable, unsynced, .. } = &mut *g;
        for (offset, data) in unsynced.drain(..) {
            durable[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }
    fn len(&self) -> u64 {
        self.lock().current.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_keeps_synced_writes_only() {
        let d = MemDevice::new(16384);
        d.write_at(&[1; 4096], 0).unwrap();
        d.sync().unwrap();
        d.write_at(&[2; 8192], 4096).unwrap();
        let c = d.crash(CrashMode::DropUnsynced);
        let mut b = [0u8; 4096];
        c.read_at(&mut b, 4096).unwrap();
        assert_eq!(b, [0; 4096]);
        c.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [1; 4096]);
        d.fail_after_writes(Some(1));
        d.write_at(&[3; 10], 0).unwrap();
        assert!(d.write_at(&[3; 10], 0).is_err());
        assert!(d.sync().is_err());
        assert!(d.read_at(&mut b, 16000).is_err());
    }

    #[test]
    fn file_device_is_a_window() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(3 * 4096).unwrap();
        let d = FileDevice::new(f.try_clone().unwrap(), 4096, 4096, "t");
        d.write_at(&[7; 4096], 0).unwrap();
        assert!(d.write_at(&[7; 1], 4096).is_err());
        d.sync().unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, 4096).unwrap();
        assert_eq!(b, [7]);
        assert!(d.describe().contains("4096..8192 of t"));
    }
}
