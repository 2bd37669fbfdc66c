// SPDX-License-Identifier: Apache-2.0
//! Pre-allocated output files. A kernel that writes a result object needs blocks that are
//! already allocated *and written* (the target writes them behind the file system's back,
//! and an unwritten extent would keep reading as zeros). Allocating them on every call would
//! erode the gain, so each file system keeps a pool under `.insitu/pool/` at its root, and
//! requests take the best-fitting free file.
//!
//! After the target has written the result, the host drops the file's cached pages (they
//! hold the old contents), truncates the file to the result length without reading it, and
//! renames it into place.

use crate::fiemap::{fiemap, flags};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Smallest pool file; sizes are powers of two from here.
const MIN_SLOT: u64 = 1 << 20;

/// The pool of one file system.
pub struct OutputPool {
    dir: PathBuf,
}

/// A pool file taken for one command.
pub struct Slot {
    /// Path while taken.
    pub path: PathBuf,
    /// Open for reading and writing.
    pub file: File,
    /// Size in bytes (the output capacity).
    pub size: u64,
    pool_dir: PathBuf,
}

static TAKEN: AtomicU64 = AtomicU64::new(0);

impl OutputPool {
    /// The pool of the file system mounted at `root`, created if missing.
    pub fn at(root: &Path) -> io::Result<OutputPool> {
        let dir = root.join(".insitu").join("pool");
        fs::create_dir_all(&dir)?;
        Ok(OutputPool { dir })
    }

    /// Directory holding the pool files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Takes the smallest free file of at least `capacity` bytes, creating one if none fits.
    pub fn acquire(&self, capacity: u64) -> io::Result<Slot> {
        let mut free: Vec<(u64, PathBuf)> = fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let size = name.strip_prefix("free-")?.split('-').next()?.parse::<u64>().ok()?;
                (size >= capacity).then(|| (size, e.path()))
            })
            .collect();
        free.sort();
        for (size, path) in free {
            let taken = self.taken_name(size);
            // Rename is atomic: if another process took this file first, try the next.
            if fs::rename(&path, &taken).is_ok() {
                let file = OpenOptions::new().read(true).write(true).open(&taken)?;
                return Ok(Slot { path: taken, file, size, pool_dir: self.dir.clone() });
            }
        }
        self.create(capacity.max(MIN_SLOT).next_power_of_two())
    }

    fn taken_name(&self, size: u64) -> PathBuf {
        let n = TAKEN.fetch_add(1, Ordering::Relaxed);
        self.dir.join(format!("taken-{size}-{}-{n}", std::process::id()))
    }

    fn create(&self, size: u64) -> io::Result<Slot> {
        let path = self.taken_name(size);
        let mut file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        let zeros = vec![0u8; 1 << 20];
        let mut left = size;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            file.write_all(&zeros[..n])?;
            left -= n as u64;
        }
        file.sync_all()?;
        // Every byte must sit in a written extent for the target's writes to show.
        let map = fiemap(&file, size)?;
        let covered: u64 = map.iter().filter(|e| e.logical < size).map(|e| e.length).sum();
        if map.iter().any(|e| e.logical < size && e.flags & (flags::UNWRITTEN | flags::DELALLOC | flags::DATA_INLINE) != 0) || covered < size {
            let _ = fs::remove_file(&path);
            return Err(io::Error::other("the file system left a pool file partly unallocated; offload of output-producing functions is not possible on it"));
        }
        drop_cached_pages(&file)?;
        Ok(Slot { path, file, size, pool_dir: self.dir.clone() })
    }
}

impl Slot {
    /// Drops any cached pages (before the target writes and after), truncates to `len`
    /// and renames the file to `dest`.
    pub fn commit(self, len: u64, dest: &Path) -> io::Result<()> {
        drop_cached_pages(&self.file)?;
        self.file.set_len(len)?;
        self.file.sync_all()?;
        fs::rename(&self.path, dest)
    }

    /// Returns the file to the pool unused (its contents do not matter).
    pub fn release(self) -> io::Result<()> {
        drop_cached_pages(&self.file)?;
        let name = self.path.file_name().map(|n| n.to_string_lossy().replacen("taken-", "free-", 1)).unwrap_or_default();
        fs::rename(&self.path, self.pool_dir.join(name))
    }
}

/// Evicts a file's clean pages from the page cache, so the next read comes from the device.
pub fn drop_cached_pages(file: &File) -> io::Result<()> {
    file.sync_data()?;
    // SAFETY: plain syscall on an open fd; no memory is passed.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}
