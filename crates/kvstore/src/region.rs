// SPDX-License-Identifier: Apache-2.0
//! [`RegionBackend`]: redb's storage interface over a byte range of a namespace's media.
//!
//! The region starts with a 4 KiB header that records the store's logical length (redb
//! grows its "file" with `set_len`; a namespace region has a fixed size). redb's own
//! commit protocol (checksummed, double-buffered commit slots, then one sync) keeps the
//! data crash-consistent; the header only needs to be at least as long as any committed
//! data, which holds because it is written before the data that needs it and synced with
//! it.
//!
//! Layout of the header: bytes 0–7 magic `INSITUKV`, 8–11 version (1), 16–23 logical
//! length, 24–31 region length, 32–35 CRC-32C of bytes 0–31; the rest zero.
//!
//! Every transfer of the region goes through the page cache, on a file handle of its own,
//! and is made durable with `fdatasync`. The namespace's media mixes direct I/O (aligned
//! transfers) with buffered I/O (the rest); redb writes its small header and commit slots
//! unaligned and its pages aligned, and a page written both ways can be overwritten with
//! stale contents by the kernel's writeback racing a direct write. A SIGKILL of the target
//! under load showed it: on restart redb's header described a layout larger than the region
//! it had recorded.

use insitu_media::Backing;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Bytes at the start of a region before the store's data.
pub const HEADER_BYTES: u64 = 4096;
const MAGIC: &[u8; 8] = b"INSITUKV";
const VERSION: u32 = 1;

/// A region of `media` that redb uses as its file. See the module docs for the layout.
pub struct RegionBackend {
    media: Arc<Backing>,
    /// The media's file, opened again without `O_DIRECT`: the only handle the store uses.
    file: File,
    base: u64,
    region: u64,
    len: Mutex<u64>,
    full: Arc<AtomicBool>,
}

impl std::fmt::Debug for RegionBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionBackend").field("path", &self.media.path()).field("base", &self.base).field("region", &self.region).finish()
    }
}

impl RegionBackend {
    /// Opens the region `[base, base + region)` of `media`: recovers the store a previous
    /// run left there, or formats a blank (all-zero header) region. Refuses a region whose
    /// header is neither, since that data belongs to something else.
    pub fn open(media: Arc<Backing>, base: u64, region: u64) -> Result<RegionBackend, String> {
        let place = format!("{} bytes at offset {base} of {}", region, media.path().display());
        let where_ = || place.clone();
        if region < HEADER_BYTES + (1 << 20) {
            return Err(format!("the KV store region ({}) is too small: give it at least {} bytes", where_(), HEADER_BYTES + (1 << 20)));
        }
        if base.checked_add(region).is_none_or(|e| e > media.len()) {
            return Err(format!("the KV store region ({}) extends past the end of the media ({} bytes)", where_(), media.len()));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(media.path())
            .map_err(|e| format!("opening {} for the KV store: {e}", media.path().display()))?;
        let mut h = [0u8; 36];
        file.read_exact_at(&mut h, base).map_err(|e| format!("reading the KV store header ({}): {e}", where_()))?;
        let len = if h.iter().all(|b| *b == 0) {
            0
        } else {
            let crc = u32::from_le_bytes(h[32..36].try_into().expect("4 bytes"));
            if &h[..8] != MAGIC || crc != crc32c::crc32c(&h[..32]) {
                return Err(format!(
                    "the KV store region ({}) holds other data (no insitu KV store header): it may belong to the KV cache of a run without --kv-store; use a blank image or zero that region",
                    where_()
                ));
            }
            let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
            let recorded = u64::from_le_bytes(h[24..32].try_into().expect("8 bytes"));
            if version != VERSION || recorded != region {
                return Err(format!("the KV store at offset {base} of {} was made (version {version}) for a {recorded}-byte region; this run gives it {region} bytes: start the target with the same --kv-store size", media.path().display()));
            }
            u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"))
        };
        let b = RegionBackend { media, file, base, region, len: Mutex::new(len), full: Arc::new(AtomicBool::new(false)) };
        if len == 0 {
            b.write_header(0).map_err(|e| format!("formatting the KV store ({}): {e}", where_()))?;
        }
        Ok(b)
    }

    /// Bytes the store may grow to.
    pub fn capacity(&self) -> u64 {
        self.region - HEADER_BYTES
    }

    /// Set when redb asked for more room than the region has (until cleared by the store).
    pub(crate) fn full_flag(&self) -> Arc<AtomicBool> {
        self.full.clone()
    }

    fn write_header(&self, len: u64) -> io::Result<()> {
        let mut h = [0u8; 36];
        h[..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[16..24].copy_from_slice(&len.to_le_bytes());
        h[24..32].copy_from_slice(&self.region.to_le_bytes());
        let crc = crc32c::crc32c(&h[..32]);
        h[32..36].copy_from_slice(&crc.to_le_bytes());
        self.file.write_all_at(&h, self.base)
    }

    fn check(&self, offset: u64, n: usize) -> io::Result<u64> {
        let len = *self.len.lock().unwrap_or_else(PoisonError::into_inner);
        match offset.checked_add(n as u64) {
            Some(end) if end <= len => Ok(self.base + HEADER_BYTES + offset),
            _ => Err(io::Error::new(io::ErrorKind::InvalidInput, format!("KV store access of {n} bytes at {offset} is past its length {len}"))),
        }
    }
}

impl redb::StorageBackend for RegionBackend {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(*self.len.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let at = self.check(offset, out.len())?;
        self.file.read_exact_at(out, at)
    }

    fn set_len(&self, new: u64) -> Result<(), io::Error> {
        let mut len = self.len.lock().unwrap_or_else(PoisonError::into_inner);
        if new > self.capacity() {
            self.full.store(true, Ordering::Relaxed);
            return Err(io::Error::other(format!("the KV store region is full: {new} bytes needed, {} available", self.capacity())));
        }
        if new > *len {
            // New positions must read as zeros; the region may hold older data.
            insitu_media::zero_file_range(&self.file, self.base + HEADER_BYTES + *len, new - *len)?;
        }
        self.write_header(new)?;
        *len = new;
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let at = self.check(offset, data.len())?;
        self.file.write_all_at(data, at)
    }
}
