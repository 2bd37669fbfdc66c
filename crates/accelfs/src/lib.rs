// SPDX-License-Identifier: Apache-2.0
//! A small file system for a target's private data, after HAYAGUI's AccelFS: code running
//! beside the device (the target's KV service, logs, tables) names and caches its data
//! without a kernel file system in between. [`Fs`] holds files in a flat namespace;
//! [`File`] reads and writes them at any offset, grows and shrinks them, and syncs.
//! [`fsck`] checks a device without changing it. Blocks come from a [`BlockDevice`]:
//! [`FileDevice`] (a byte range of a file or block device, e.g. part of a private
//! namespace) or [`MemDevice`] (memory, with simulated power loss for crash tests).
//!
//! # On-disk layout
//!
//! Blocks of 4 KiB ([`BLOCK_SIZE`]), numbered from the device's start:
//!
//! ```text
//! block 0   superblock slot 0 ┐ magic INSITUAF, version, block size, block count,
//! block 1   superblock slot 1 ┘ generation, metadata length + CRC-32C + extents, CRC-32C
//! block 2…  data extents of files, the metadata blob, free extents, in any order
//! ```
//!
//! The *metadata blob* holds everything else, in one checksummed unit: the inodes (number,
//! size in bytes, extents (start block, block count) in file order), the directory (name →
//! inode) and the free list (extents). A file holds exactly the blocks its size needs. The
//! superblock names the blob by up to 64 extents; the blob's CRC-32C is in the superblock,
//! the superblock's own in its last four bytes. Blocks 0–1, the blob's extents, the files'
//! extents and the free list cover the device exactly once, which [`fsck`] checks.
//!
//! # Commit protocol
//!
//! Metadata is copy-on-write, as in LMDB and redb: the blob is never changed in place.
//! [`Fs::sync`] (or [`File::sync`]) commits:
//!
//! 1. write every dirty cached block to its place (*ordered mode*: data first);
//! 2. if metadata changed: write a new blob (generation g+1) to free blocks, taken from the
//!    end of the device; its free list counts the old blob and the blocks freed since the
//!    last commit as free;
//! 3. sync the device;
//! 4. write the superblock of generation g+1 to slot (g+1) mod 2, the slot *not* holding
//!    generation g, and sync again.
//!
//! A crash before step 4 lands leaves generation g intact (nothing it names was written);
//! a torn slot fails its checksum and the other slot wins. Blocks freed since the last
//! commit (by `set_len`, `remove`, or the old blob) are not handed out until the commit
//! that frees them is durable, so no committed block is overwritten by another file. Newly
//! allocated blocks are zeroed on the device before the commit that names them. Data
//! overwritten in place inside a file's committed extents is not journaled (as ext4's
//! `data=ordered`): a program that needs atomic updates, like redb, brings its own
//! protocol, and gets the durability barrier it asks for from [`File::sync`]. A sync with
//! no metadata change costs one device sync.
//!
//! [`Fs::open`] takes the slot with the highest generation whose superblock is valid, checks
//! the blob's checksum and every rule [`fsck`] checks, and refuses (never repairs) anything
//! else, so it never writes through damaged metadata. Every decoder bounds its reads and
//! allocations by the bytes it was given.
//!
//! # Buffer cache
//!
//! Each open file's blocks are found through a per-file hash table (file block → 4 KiB
//! buffer); one byte budget, given at open, bounds all files' buffers together. When it is
//! reached, the least recently used clean buffer among the oldest few is dropped, or else
//! the oldest buffer is written back and dropped. Dirty buffers are written on sync or
//! eviction, never by a timer. [`Fs::stats`] reports hits, misses, evictions and
//! write-backs.
//!
//! ```
//! use insitu_accelfs::{Fs, MemDevice};
//!
//! let dev = MemDevice::new(8 << 20);
//! let fs = Fs::format(dev.clone(), 1 << 20)?;
//! let f = fs.create("log")?;
//! f.write_at(b"hello", 10_000)?;
//! f.sync()?;
//! drop((f, fs));
//! let fs = Fs::open(dev, 1 << 20)?;
//! let mut b = [0u8; 5];
//! fs.open_file("log")?.read_exact_at(&mut b, 10_000)?;
//! assert_eq!(&b, b"hello");
//! assert!(fs.fsck()?.is_clean());
//! # Ok::<(), insitu_accelfs::Error>(())
//! ```
#![deny(missing_docs)]

mod alloc;
mod cache;
mod device;
mod fs;
mod fsck;
pub mod fuzzing;
mod layout;

pub use cache::CacheStats;
pub use device::{BlockDevice, CrashMode, FileDevice, MemDevice};
pub use fs::{DirEntry, File, Fs};
pub use fsck::{fsck, FsckReport};
pub use layout::{BLOCK_SIZE, MAX_NAME, MIN_BLOCKS};

/// What a file-system operation ran into.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The device failed a transfer.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The device's error.
        #[source]
        source: std::io::Error,
    },
    /// The device is too small for a file system.
    #[error("{device} holds {blocks} blocks of 4 KiB; an accelfs needs at least {min}: give it a larger device")]
    DeviceTooSmall {
        /// The device.
        device: String,
        /// Its whole blocks.
        blocks: u64,
        /// The least accepted.
        min: u64,
    },
    /// No valid superblock: the device holds no accelfs (or another format version).
    #[error("no accelfs on {device}: {detail}; format it with Fs::format (which erases it) or give the right device")]
    NotFormatted {
        /// The device.
        device: String,
        /// What the superblock slots hold.
        detail: String,
    },
    /// A valid superblock, but the committed state is damaged.
    #[error("the accelfs on {device} is damaged: {detail}; run fsck for every problem, then restore its data elsewhere or format it")]
    Corrupt {
        /// The device.
        device: String,
        /// The first problem (and how many there are).
        detail: String,
    },
    /// Not enough free blocks.
    #[error("the file system is full: {needed} blocks wanted, {free} free; remove or shrink files, or give it a larger device")]
    NoSpace {
        /// Blocks asked for.
        needed: u64,
        /// Blocks free for data (after the room kept for the next metadata commit).
        free: u64,
    },
    /// No file has that name.
    #[error("no file named {0:?}")]
    NotFound(String),
    /// A file has that name already.
    #[error("a file named {0:?} exists already; open it, or remove it first")]
    Exists(String),
    /// A name the file system does not accept.
    #[error("{name:?} is not a valid file name: {why}")]
    InvalidName {
        /// The name.
        name: String,
        /// The rule it breaks.
        why: &'static str,
    },
    /// The file behind a handle was removed.
    #[error("the file {0:?} was removed while open; open it again by name")]
    Removed(String),
    /// An access past the end of a file (exact reads) or past the largest offset.
    #[error("a {len}-byte access at offset {offset} of {name:?} reaches past its end ({size} bytes)")]
    OutOfRange {
        /// The file.
        name: String,
        /// Where the access started.
        offset: u64,
        /// Its length.
        len: u64,
        /// The file's size.
        size: u64,
    },
    /// An earlier device failure left the file system's memory out of step with the device.
    #[error("the file system stopped after a device failure ({0}); reopen it to recover the last committed state")]
    Failed(String),
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io { what: what.into(), source }
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        use std::io::ErrorKind;
        let kind = match &e {
            Error::Io { source, .. } => source.kind(),
            Error::NotFound(_) | Error::Removed(_) => ErrorKind::NotFound,
            Error::Exists(_) => ErrorKind::AlreadyExists,
            Error::InvalidName { .. } | Error::OutOfRange { .. } => ErrorKind::InvalidInput,
            Error::Corrupt { .. } | Error::NotFormatted { .. } => ErrorKind::InvalidData,
            _ => ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}
