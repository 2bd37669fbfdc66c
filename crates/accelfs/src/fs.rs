// SPDX-License-Identifier: Apache-2.0
//! [`Fs`] and [`File`]: the file system's operations, the block cache's read and write
//! paths, and the commit (see the crate docs for the protocol).

use crate::alloc::FreeList;
use crate::cache::{Cache, CacheStats, Victim};
use crate::device::BlockDevice;
use crate::fsck::{self, FsckReport, Unusable};
use crate::layout::{blocks_for, check_name, Extent, Inode, Meta, Superblock, BLOCK_SIZE, BS, MAX_META_EXTENTS, MIN_BLOCKS, SUPERBLOCKS};
use crate::Error;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Room the next commit's blob keeps for extents beyond today's. A data allocation takes
/// whole free extents, largest first, and splits at most one, so however many extents it
/// takes the blob grows by about one: the inode gains what the free list loses.
const META_SLACK_EXTENTS: usize = 64;
/// Zeroes are written in runs of this many blocks.
const ZERO_RUN: u64 = 64;

/// A file system on a [`BlockDevice`]. Cheap to clone (clones share it); `Send + Sync`, one
/// operation at a time. Dropping the last clone (and every [`File`]) commits, ignoring
/// errors: call [`Fs::sync`] to learn of them.
#[derive(Clone)]
pub struct Fs {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if s.failed.is_none() {
            let _ = s.commit();
        }
    }
}

impl std::fmt::Debug for Fs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Fs").field("device", &s.dev.describe()).field("generation", &s.generation).field("files", &s.meta.dir.len()).finish()
    }
}

/// A file's name and size, as [`Fs::list`] gives them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The name.
    pub name: String,
    /// Bytes.
    pub size: u64,
}

/// An open file. Handles to one file share its data; a handle to a removed file fails
/// with [`Error::Removed`].
#[derive(Clone)]
pub struct File {
    fs: Fs,
    ino: u64,
    name: String,
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File").field("name", &self.name).field("inode", &self.ino).finish()
    }
}

/// Everything behind the lock.
struct State {
    dev: Box<dyn BlockDevice>,
    block_count: u64,
    /// Generation of the last commit.
    generation: u64,
    /// Where that commit's blob lies (free after the next commit).
    meta_extents: Vec<Extent>,
    /// Inodes and directory as they are now; `meta.free` is filled only while encoding.
    meta: Meta,
    /// Blocks that may be handed out now.
    free: FreeList,
    /// Blocks freed since the last commit, which that commit still names.
    pending: Vec<Extent>,
    /// Whether `meta` differs from the last commit.
    dirty: bool,
    cache: Cache,
    /// The last read-ahead of a stream: blocks `first..` of inode `ino`, read past the
    /// cache (see `read_span`); dropped by any change to that file.
    ahead: Option<Ahead>,
    /// Set when a failed device write left memory and device out of step.
    failed: Option<String>,
}

/// Blocks read ahead of a streaming reader.
struct Ahead {
    ino: u64,
    first: u64,
    data: Vec<u8>,
}

/// Most blocks one device read brings in for a read that misses the cache.
const READ_RUN: u64 = 64;
/// A miss of this many contiguous blocks is a stream, read past the cache.
const STREAM_BLOCKS: u64 = 16;
/// Blocks a stream reads ahead in one device read (1 MiB): a device serves one large read
/// much faster than many small ones issued one at a time.
const AHEAD_BLOCKS: u64 = 256;

impl Fs {
    /// Makes an empty file system on `dev` (erasing what it held) and opens it, with a
    /// buffer cache of `cache_bytes` (at least 16 blocks).
    pub fn format(dev: impl BlockDevice + 'static, cache_bytes: usize) -> Result<Fs, Error> {
        let block_count = dev.len() / BS;
        if block_count < MIN_BLOCKS {
            return Err(Error::DeviceTooSmall { device: dev.describe(), blocks: block_count, min: MIN_BLOCKS });
        }
        let zero = vec![0u8; (SUPERBLOCKS * BS) as usize];
        // An older file system's superblocks must not outrank the new one.
        dev.write_at(&zero, 0).map_err(|e| Error::io(format!("erasing the superblocks of {}", dev.describe()), e))?;
        let free = FreeList::from_extents(&[Extent { start: SUPERBLOCKS, count: block_count - SUPERBLOCKS }]);
        let meta = Meta { next_ino: 1, ..Meta::default() };
        let mut s = State::new(Box::new(dev), block_count, 0, Vec::new(), meta, free, cache_bytes);
        s.dirty = true;
        s.commit()?;
        Ok(Fs { shared: Arc::new(Shared { state: Mutex::new(s) }) })
    }

    /// Opens the file system on `dev` at its last committed state, with a buffer cache of
    /// `cache_bytes`. Refuses ([`Error::NotFormatted`], [`Error::Corrupt`]) a device whose
    /// committed state fails any check of [`crate::fsck`]; writes nothing.
    pub fn open(dev: impl BlockDevice + 'static, cache_bytes: usize) -> Result<Fs, Error> {
        let l = match fsck::load(&dev)? {
            Ok(l) => l,
            Err(Unusable::NoSuperblock(detail)) => return Err(Error::NotFormatted { device: dev.describe(), detail }),
            Err(Unusable::Damaged(detail)) => return Err(Error::Corrupt { device: dev.describe(), detail }),
        };
        let problems = fsck::problems(&l.sb, &l.meta);
        if let Some(first) = problems.first() {
            let detail = if problems.len() > 1 { format!("{first} ({} problems in all)", problems.len()) } else { first.clone() };
            return Err(Error::Corrupt { device: dev.describe(), detail });
        }
        let mut meta = l.meta;
        let free = FreeList::from_extents(&std::mem::take(&mut meta.free));
        let s = State::new(Box::new(dev), l.sb.block_count, l.sb.generation, l.sb.meta, meta, free, cache_bytes);
        Ok(Fs { shared: Arc::new(Shared { state: Mutex::new(s) }) })
    }

    /// [`Fs::open`], or [`Fs::format`] if both superblock slots are blank (all zero), as
    /// on a fresh device. Anything else that does not open is an error, never erased.
    pub fn open_or_format(dev: impl BlockDevice + 'static, cache_bytes: usize) -> Result<Fs, Error> {
        let mut b = vec![0u8; (SUPERBLOCKS * BS) as usize];
        if dev.len() >= SUPERBLOCKS * BS {
            dev.read_at(&mut b, 0).map_err(|e| Error::io(format!("reading the superblocks of {}", dev.describe()), e))?;
            if b.iter().all(|x| *x == 0) {
                return Fs::format(dev, cache_bytes);
            }
        }
        Fs::open(dev, cache_bytes)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates an empty file named `name` ([`Error::Exists`] if there is one).
    pub fn create(&self, name: &str) -> Result<File, Error> {
        let mut s = self.lock();
        s.ok()?;
        check_name(name).map_err(|why| Error::InvalidName { name: name.into(), why })?;
        if s.meta.dir.contains_key(name) {
            return Err(Error::Exists(name.into()));
        }
        let ino = s.meta.next_ino;
        s.meta.next_ino += 1;
        s.meta.inodes.insert(ino, Inode::default());
        s.meta.dir.insert(name.into(), ino);
        s.dirty = true;
        Ok(File { fs: self.clone(), ino, name: name.into() })
    }

    /// Opens the file named `name` ([`Error::NotFound`] if there is none).
    pub fn open_file(&self, name: &str) -> Result<File, Error> {
        let s = self.lock();
        let ino = *s.meta.dir.get(name).ok_or_else(|| Error::NotFound(name.into()))?;
        Ok(File { fs: self.clone(), ino, name: name.into() })
    }

    /// Removes the file named `name`; its blocks are free after the next commit.
    pub fn remove(&self, name: &str) -> Result<(), Error> {
        let mut s = self.lock();
        s.ok()?;
        let ino = s.meta.dir.remove(name).ok_or_else(|| Error::NotFound(name.into()))?;
        let inode = s.meta.inodes.remove(&ino).unwrap_or_default();
        s.cache.drop_from(ino, 0);
        s.forget_ahead(ino);
        s.pending.extend(inode.extents);
        s.dirty = true;
        Ok(())
    }

    /// Every file, by name.
    pub fn list(&self) -> Vec<DirEntry> {
        let s = self.lock();
        s.meta.dir.iter().map(|(name, ino)| DirEntry { name: name.clone(), size: s.meta.inodes.get(ino).map_or(0, |i| i.size) }).collect()
    }

    /// Commits: writes dirty blocks, then the metadata if it changed, and makes both
    /// durable. When this returns `Ok`, a crash loses nothing written before it.
    pub fn sync(&self) -> Result<(), Error> {
        self.lock().commit()
    }

    /// Buffer cache counters.
    pub fn stats(&self) -> CacheStats {
        self.lock().cache.stats
    }

    /// Bytes the file system can hold in files (all blocks but the superblocks).
    pub fn capacity(&self) -> u64 {
        (self.lock().block_count - SUPERBLOCKS) * BS
    }

    /// Bytes free now (blocks freed since the last commit count once it is made).
    pub fn free_bytes(&self) -> u64 {
        self.lock().free.total() * BS
    }

    /// Generation of the last commit (1 after format, one more per commit that changed
    /// metadata).
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Runs [`crate::fsck`] on the device's committed state (what a crash now would leave;
    /// call [`Fs::sync`] first to check what is in memory).
    pub fn fsck(&self) -> Result<FsckReport, Error> {
        let s = self.lock();
        fsck::fsck(&*s.dev)
    }
}

impl File {
    /// The name the file was opened by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file's size in bytes.
    pub fn len(&self) -> Result<u64, Error> {
        let s = self.fs.lock();
        Ok(s.inode(self.ino, &self.name)?.size)
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len()? == 0)
    }

    /// Reads from `offset` into `buf`; returns the bytes read, fewer than asked only at the
    /// end of the file.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize, Error> {
        let mut s = self.fs.lock();
        s.ok()?;
        let size = s.inode(self.ino, &self.name)?.size;
        if offset >= size {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(size - offset) as usize;
        s.read_span(self.ino, offset, &mut buf[..n])?;
        Ok(n)
    }

    /// Fills `buf` from `offset`, or fails with [`Error::OutOfRange`] (reading nothing) if
    /// the file ends before.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<(), Error> {
        let mut s = self.fs.lock();
        s.ok()?;
        let size = s.inode(self.ino, &self.name)?.size;
        if offset.checked_add(buf.len() as u64).is_none_or(|end| end > size) {
            return Err(Error::OutOfRange { name: self.name.clone(), offset, len: buf.len() as u64, size });
        }
        s.read_span(self.ino, offset, buf)
    }

    /// Writes all of `buf` at `offset`, growing the file if it ends there (a gap reads as
    /// zeros). Durable after the next sync.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), Error> {
        self.write(buf, offset, false)
    }

    /// [`File::write_at`], but the blocks go to the device now (they stay cached, clean),
    /// so the device sees this file's writes in the order they were made: what a program
    /// that orders its own writes (redb's commit slots) needs if its process dies between
    /// syncs. Durable after the next sync.
    pub fn write_through_at(&self, buf: &[u8], offset: u64) -> Result<(), Error> {
        self.write(buf, offset, true)
    }

    fn write(&self, buf: &[u8], offset: u64, through: bool) -> Result<(), Error> {
        let mut s = self.fs.lock();
        s.ok()?;
        let size = s.inode(self.ino, &self.name)?.size;
        let end = offset.checked_add(buf.len() as u64).ok_or_else(|| Error::OutOfRange { name: self.name.clone(), offset, len: buf.len() as u64, size })?;
        if buf.is_empty() {
            return Ok(());
        }
        if end > size {
            s.grow(self.ino, end)?;
        }
        s.write_span(self.ino, offset, buf, through)
    }

    /// Sets the file's size: bytes past the old end read as zeros; blocks past the new end
    /// are freed (reusable after the next commit).
    pub fn set_len(&self, len: u64) -> Result<(), Error> {
        let mut s = self.fs.lock();
        s.ok()?;
        let size = s.inode(self.ino, &self.name)?.size;
        if len > size {
            s.grow(self.ino, len)
        } else {
            s.shrink(self.ino, len);
            Ok(())
        }
    }

    /// Commits the file system ([`Fs::sync`]): metadata is one unit, so this makes every
    /// file's changes durable.
    pub fn sync(&self) -> Result<(), Error> {
        let mut s = self.fs.lock();
        s.inode(self.ino, &self.name)?;
        s.commit()
    }

    /// The file system the file belongs to.
    pub fn fs(&self) -> &Fs {
        &self.fs
    }
}

impl State {
    fn new(dev: Box<dyn BlockDevice>, block_count: u64, generation: u64, meta_extents: Vec<Extent>, meta: Meta, free: FreeList, cache_bytes: usize) -> State {
        State {
            dev,
            block_count,
            generation,
            meta_extents,
            meta,
            free,
            pending: Vec::new(),
            dirty: false,
            cache: Cache::new(cache_bytes),
            ahead: None,
            failed: None,
        }
    }

    fn ok(&self) -> Result<(), Error> {
        match &self.failed {
            Some(why) => Err(Error::Failed(why.clone())),
            None => Ok(()),
        }
    }

    fn inode(&self, ino: u64, name: &str) -> Result<&Inode, Error> {
        self.meta.inodes.get(&ino).ok_or_else(|| Error::Removed(name.into()))
    }

    fn phys(&self, ino: u64, fb: u64) -> Result<u64, Error> {
        self.meta.inodes.get(&ino).and_then(|i| i.phys(fb)).ok_or_else(|| Error::Corrupt {
            device: self.dev.describe(),
            detail: format!("block {fb} of inode {ino} is within its size but not in its extents (an internal error)"),
        })
    }

    /// A device write whose failure leaves memory out of step with the device.
    fn must_write(&mut self, data: &[u8], block: u64, what: &str) -> Result<(), Error> {
        self.dev.write_at(data, block * BS).map_err(|e| {
            let err = Error::io(format!("writing {what} at block {block} of {}", self.dev.describe()), e);
            self.failed = Some(err.to_string());
            err
        })
    }

    fn write_back(&mut self, v: Option<Victim>) -> Result<(), Error> {
        match v {
            Some(v) => self.must_write(&v.data, v.phys, "an evicted cache block"),
            None => Ok(()),
        }
    }

    /// Reads `buf.len()` bytes from `offset`, all within the file, through the cache.
    /// Reads `buf.len()` bytes at `offset` of the file: cached blocks from the cache, the
    /// others in runs of physically contiguous blocks, one device read per run (at most
    /// `READ_RUN` blocks). A run of `STREAM_BLOCKS` or more is a stream: it is not cached,
    /// so that scanning a large file does not evict what is hot, and it is read up to
    /// `AHEAD_BLOCKS` ahead into `ahead`, where the next reads find it.
    fn read_span(&mut self, ino: u64, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        let last_fb = (offset + buf.len() as u64).div_ceil(BS);
        let mut run = Vec::new();
        let mut done = 0;
        while done < buf.len() {
            let pos = offset + done as u64;
            let (fb, within) = (pos / BS, (pos % BS) as usize);
            if let Some(b) = self.cache.get(ino, fb) {
                let n = (BLOCK_SIZE - within).min(buf.len() - done);
                buf[done..done + n].copy_from_slice(&b.data[within..within + n]);
                done += n;
                continue;
            }
            if let Some(a) = self.ahead.as_ref().filter(|a| a.ino == ino && fb >= a.first && fb < a.first + (a.data.len() as u64) / BS) {
                let at = ((fb - a.first) * BS) as usize + within;
                let n = (a.data.len() - at).min(buf.len() - done);
                buf[done..done + n].copy_from_slice(&a.data[at..at + n]);
                done += n;
                continue;
            }
            let phys = self.phys(ino, fb)?;
            let mut count = 1;
            while count < READ_RUN && fb + count < last_fb && self.cache.get(ino, fb + count).is_none() && self.phys(ino, fb + count)? == phys + count {
                count += 1;
            }
            if count >= STREAM_BLOCKS {
                let inode = &self.meta.inodes[&ino];
                while count < AHEAD_BLOCKS && inode.phys(fb + count) == Some(phys + count) && self.cache.get(ino, fb + count).is_none() {
                    count += 1;
                }
            }
            run.resize((count * BS) as usize, 0);
            self.dev.read_at(&mut run, phys * BS).map_err(|e| Error::io(format!("reading blocks {phys}..{} of {}", phys + count, self.dev.describe()), e))?;
            let n = (run.len() - within).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&run[within..within + n]);
            done += n;
            if count >= STREAM_BLOCKS {
                self.ahead = Some(Ahead { ino, first: fb, data: std::mem::take(&mut run) });
            } else {
                for (i, block) in run.chunks_exact(BLOCK_SIZE).enumerate() {
                    let v = self.cache.insert(ino, fb + i as u64, phys + i as u64, block.into(), false);
                    self.write_back(v)?;
                }
            }
        }
        Ok(())
    }

    /// Drops the read-ahead of `ino`: the file is changing.
    fn forget_ahead(&mut self, ino: u64) {
        if self.ahead.as_ref().is_some_and(|a| a.ino == ino) {
            self.ahead = None;
        }
    }

    /// Writes `data` at `offset` of the file through the cache; with `through`, each block
    /// also goes to the device at once and stays cached clean.
    fn write_span(&mut self, ino: u64, offset: u64, data: &[u8], through: bool) -> Result<(), Error> {
        self.forget_ahead(ino);
        let mut done = 0;
        while done < data.len() {
            let pos = offset + done as u64;
            let (fb, within) = (pos / BS, (pos % BS) as usize);
            let n = (BLOCK_SIZE - within).min(data.len() - done);
            let dev = &self.dev;
            let put = |phys: u64, block: &[u8]| dev.write_at(block, phys * BS).map_err(|e| Error::io(format!("writing block {phys} of {}", dev.describe()), e));
            if let Some(b) = self.cache.get(ino, fb) {
                b.data[within..within + n].copy_from_slice(&data[done..done + n]);
                if through {
                    put(b.phys, &b.data)?;
                }
                b.dirty = !through;
            } else {
                let phys = self.phys(ino, fb)?;
                let mut block = vec![0u8; BLOCK_SIZE].into_boxed_slice();
                if n < BLOCK_SIZE {
                    self.dev.read_at(&mut block, phys * BS).map_err(|e| Error::io(format!("reading block {phys} of {}", self.dev.describe()), e))?;
                }
                block[within..within + n].copy_from_slice(&data[done..done + n]);
                if through {
                    put(phys, &block)?;
                }
                let v = self.cache.insert(ino, fb, phys, block, !through);
                self.write_back(v)?;
            }
            done += n;
        }
        Ok(())
    }

    /// Blocks the next commit's blob may need, with room for `extra` more extents.
    fn meta_reserve(&self, extra: usize) -> u64 {
        blocks_for(self.meta.encoded_bound(self.free.len() + self.pending.len() + self.meta_extents.len() + extra + 1))
    }

    /// Makes sure `need` blocks can be taken while leaving room for the next commit; makes
    /// that commit first if it frees enough.
    fn reserve(&mut self, need: u64) -> Result<(), Error> {
        let meta = self.meta_reserve(META_SLACK_EXTENTS);
        if self.free.total() >= need + meta {
            return Ok(());
        }
        let freeable: u64 = self.pending.iter().chain(&self.meta_extents).map(|e| e.count).sum();
        if self.free.total() + freeable >= need + 2 * meta {
            self.commit()?;
            if self.free.total() >= need + self.meta_reserve(META_SLACK_EXTENTS) {
                return Ok(());
            }
        }
        Err(Error::NoSpace { needed: need, free: self.free.total().saturating_sub(meta) })
    }

    /// Grows file `ino` to `to` bytes: zeroes the rest of its last block and takes zeroed
    /// blocks for the remainder, after its last extent when that is free.
    fn grow(&mut self, ino: u64, to: u64) -> Result<(), Error> {
        let (size, held, last_end) = {
            let i = &self.meta.inodes[&ino];
            (i.size, i.blocks(), i.extents.last().map(|e| e.start + e.count))
        };
        let want = blocks_for(to);
        if want > held {
            let need = want - held;
            self.reserve(need)?;
            let new = match last_end {
                Some(end) if self.free.take_at(end, need) => vec![Extent { start: end, count: need }],
                _ => self.free.take(need, usize::MAX, false).ok_or(Error::NoSpace { needed: need, free: self.free.total() })?,
            };
            if let Err(e) = self.zero(&new) {
                new.iter().for_each(|e| self.free.insert(*e));
                return Err(e);
            }
            let exts = &mut self.meta.inodes.get_mut(&ino).expect("checked by the caller").extents;
            for e in new {
                match exts.last_mut() {
                    Some(l) if l.start + l.count == e.start => l.count += e.count,
                    _ => exts.push(e),
                }
            }
        }
        let tail_end = to.min(held * BS);
        if size < tail_end {
            self.write_span(ino, size, &vec![0u8; (tail_end - size) as usize], false)?;
        }
        self.meta.inodes.get_mut(&ino).expect("checked by the caller").size = to;
        self.dirty = true;
        Ok(())
    }

    /// Writes zeros over `extents` (new blocks, so that they read as zeros).
    fn zero(&self, extents: &[Extent]) -> Result<(), Error> {
        let zeros = vec![0u8; (ZERO_RUN * BS) as usize];
        for e in extents {
            let mut at = e.start;
            while at < e.start + e.count {
                let n = ZERO_RUN.min(e.start + e.count - at);
                self.dev
                    .write_at(&zeros[..(n * BS) as usize], at * BS)
                    .map_err(|err| Error::io(format!("zeroing block {at} of {}", self.dev.describe()), err))?;
                at += n;
            }
        }
        Ok(())
    }

    /// Shrinks file `ino` to `to` bytes; its blocks past the end go to `pending`.
    fn shrink(&mut self, ino: u64, to: u64) {
        let keep = blocks_for(to);
        self.cache.drop_from(ino, keep);
        self.forget_ahead(ino);
        let inode = self.meta.inodes.get_mut(&ino).expect("checked by the caller");
        let mut left = keep;
        let mut kept = Vec::new();
        for e in std::mem::take(&mut inode.extents) {
            if left >= e.count {
                left -= e.count;
                kept.push(e);
            } else {
                if left > 0 {
                    kept.push(Extent { start: e.start, count: left });
                }
                self.pending.push(Extent { start: e.start + left, count: e.count - left });
                left = 0;
            }
        }
        inode.extents = kept;
        if inode.size != to {
            inode.size = to;
            self.dirty = true;
        }
    }

    fn sync_dev(&mut self) -> Result<(), Error> {
        self.dev.sync().map_err(|e| Error::io(format!("syncing {}", self.dev.describe()), e))
    }

    /// The commit protocol of the crate docs.
    fn commit(&mut self) -> Result<(), Error> {
        self.ok()?;
        let dev = &self.dev;
        let flushed = self.cache.flush(|block, data| dev.write_at(data, block * BS));
        flushed.map_err(|e| Error::io(format!("writing cached blocks to {}", self.dev.describe()), e))?;
        if !self.dirty {
            return self.sync_dev();
        }
        // Taking blocks from the end of one extent or whole extents never adds a free
        // extent, and each of the inserts below adds at most one: the bound holds.
        let need = self.meta_reserve(0);
        let blob_at = self.free.take(need, MAX_META_EXTENTS, true).ok_or(Error::NoSpace { needed: need, free: self.free.total() })?;
        let mut after = self.free.clone();
        for e in self.pending.iter().chain(&self.meta_extents) {
            after.insert(*e);
        }
        let generation = self.generation + 1;
        self.meta.generation = generation;
        self.meta.free = after.extents();
        let mut blob = self.meta.encode();
        self.meta.free = Vec::new();
        let sb = Superblock { block_count: self.block_count, generation, meta_len: blob.len() as u64, meta_crc: crc32c::crc32c(&blob), meta: blob_at.clone() };
        blob.resize((blocks_for(blob.len() as u64) * BS) as usize, 0);
        let written = self.write_blob(&blob, &blob_at).and_then(|()| self.sync_dev());
        if let Err(e) = written {
            // Nothing names the new blob: its blocks are free again, the old state stands.
            blob_at.iter().for_each(|e| self.free.insert(*e));
            self.meta.generation = self.generation;
            return Err(e);
        }
        self.must_write(&sb.encode(), generation % 2, "the superblock")?;
        self.sync_dev().inspect_err(|e| self.failed = Some(e.to_string()))?;
        self.generation = generation;
        self.free = after;
        self.pending.clear();
        self.meta_extents = blob_at;
        self.dirty = false;
        Ok(())
    }

    fn write_blob(&self, blob: &[u8], at: &[Extent]) -> Result<(), Error> {
        let mut done = 0usize;
        for e in at {
            if done == blob.len() {
                break;
            }
            let n = ((e.count * BS) as usize).min(blob.len() - done);
            self.dev
                .write_at(&blob[done..done + n], e.start * BS)
                .map_err(|err| Error::io(format!("writing the metadata at block {} of {}", e.start, self.dev.describe()), err))?;
            done += n;
        }
        Ok(())
    }
}
