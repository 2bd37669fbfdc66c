// SPDX-License-Identifier: Apache-2.0
//! The buffer cache: per file, a hash table from file block number to a 4 KiB buffer (as
//! AccelFS has, to find a block without walking lists); across files, one byte budget and
//! one least-recently-used order, so that a busy file can use what idle ones do not.
//!
//! Buffers remember the device block they map to: a file block's device block never
//! changes while it is cached (growing a file appends blocks; shrinking or removing it
//! drops its buffers first).

use crate::layout::BLOCK_SIZE;
use std::collections::{BTreeMap, HashMap};
use std::io;

/// Buffer cache counters since the file system was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Block lookups found in the cache.
    pub hits: u64,
    /// Block lookups that went to the device (or, for a whole-block write, needed no read).
    pub misses: u64,
    /// Buffers dropped to make room.
    pub evictions: u64,
    /// Dirty buffers written to the device when evicted.
    pub writebacks: u64,
    /// Dirty buffers written to the device by a sync.
    pub flushed: u64,
    /// Buffers held now.
    pub resident: u64,
    /// Buffers the budget allows.
    pub capacity: u64,
}

/// How many of the least recently used buffers eviction looks through for a clean one.
const CLEAN_SCAN: usize = 8;

pub(crate) struct Buf {
    pub data: Box<[u8]>,
    pub phys: u64,
    pub dirty: bool,
    tick: u64,
}

/// A dirty buffer evicted to make room: the caller writes it to `phys`.
pub(crate) struct Victim {
    pub phys: u64,
    pub data: Box<[u8]>,
}

pub(crate) struct Cache {
    files: HashMap<u64, HashMap<u64, Buf>>,
    /// Last-use tick → (inode, file block); the first entry is the least recently used.
    lru: BTreeMap<u64, (u64, u64)>,
    tick: u64,
    pub stats: CacheStats,
}

impl Cache {
    /// A cache of `budget` bytes (at least 16 blocks).
    pub fn new(budget: usize) -> Cache {
        let capacity = (budget / BLOCK_SIZE).max(16) as u64;
        Cache { files: HashMap::new(), lru: BTreeMap::new(), tick: 0, stats: CacheStats { capacity, ..CacheStats::default() } }
    }

    /// The buffer of file block `fb` of `ino`, counted as a hit or a miss.
    pub fn get(&mut self, ino: u64, fb: u64) -> Option<&mut Buf> {
        self.tick += 1;
        let tick = self.tick;
        match self.files.get_mut(&ino).and_then(|f| f.get_mut(&fb)) {
            Some(b) => {
                self.stats.hits += 1;
                self.lru.remove(&b.tick);
                self.lru.insert(tick, (ino, fb));
                b.tick = tick;
                Some(b)
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Adds a buffer (not present), first evicting the least recently used one if the
    /// cache is full; returns that one if it was dirty, for the caller to write back.
    pub fn insert(&mut self, ino: u64, fb: u64, phys: u64, data: Box<[u8]>, dirty: bool) -> Option<Victim> {
        let victim = if self.stats.resident >= self.stats.capacity { self.evict() } else { None };
        self.tick += 1;
        self.lru.insert(self.tick, (ino, fb));
        let old = self.files.entry(ino).or_default().insert(fb, Buf { data, phys, dirty, tick: self.tick });
        debug_assert!(old.is_none(), "block {fb} of inode {ino} cached twice");
        self.stats.resident += 1;
        victim
    }

    /// Evicts the least recently used clean buffer among the oldest [`CLEAN_SCAN`] (it costs
    /// no write), or else the oldest one, dirty.
    fn evict(&mut self) -> Option<Victim> {
        let clean = self.lru.iter().take(CLEAN_SCAN).find(|(_, (ino, fb))| self.files.get(ino).and_then(|f| f.get(fb)).is_some_and(|b| !b.dirty));
        let tick = clean.map(|(t, _)| *t).or_else(|| self.lru.keys().next().copied())?;
        let (ino, fb) = self.lru.remove(&tick)?;
        let b = self.remove_buf(ino, fb)?;
        self.stats.evictions += 1;
        if b.dirty {
            self.stats.writebacks += 1;
            return Some(Victim { phys: b.phys, data: b.data });
        }
        None
    }

    fn remove_buf(&mut self, ino: u64, fb: u64) -> Option<Buf> {
        let f = self.files.get_mut(&ino)?;
        let b = f.remove(&fb)?;
        if f.is_empty() {
            self.files.remove(&ino);
        }
        self.stats.resident -= 1;
        Some(b)
    }

    /// Drops (without writing) every buffer of `ino` from file block `from` on: the blocks
    /// are no longer the file's.
    pub fn drop_from(&mut self, ino: u64, from: u64) {
        let Some(f) = self.files.get(&ino) else { return };
        let doomed: Vec<(u64, u64)> = f.iter().filter(|(fb, _)| **fb >= from).map(|(fb, b)| (*fb, b.tick)).collect();
        for (fb, tick) in doomed {
            self.lru.remove(&tick);
            self.remove_buf(ino, fb);
        }
    }

    /// Writes every dirty buffer with `write(first device block, bytes)`, runs of adjacent
    /// device blocks in one call, and marks them clean as they land.
    pub fn flush(&mut self, mut write: impl FnMut(u64, &[u8]) -> io::Result<()>) -> io::Result<()> {
        let mut dirty: Vec<(u64, u64, u64)> =
            self.files.iter().flat_map(|(ino, f)| f.iter().filter(|(_, b)| b.dirty).map(move |(fb, b)| (b.phys, *ino, *fb))).collect();
        dirty.sort_unstable();
        let mut i = 0;
        let mut run = Vec::new();
        while i < dirty.len() {
            let mut j = i;
            run.clear();
            while j < dirty.len() && dirty[j].0 == dirty[i].0 + (j - i) as u64 && j - i < 256 {
                run.extend_from_slice(&self.files[&dirty[j].1][&dirty[j].2].data);
                j += 1;
            }
            write(dirty[i].0, &run)?;
            for &(_, ino, fb) in &dirty[i..j] {
                if let Some(b) = self.files.get_mut(&ino).and_then(|f| f.get_mut(&fb)) {
                    b.dirty = false;
                }
            }
            self.stats.flushed += (j - i) as u64;
            i = j;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(v: u8) -> Box<[u8]> {
        vec![v; BLOCK_SIZE].into_boxed_slice()
    }

    #[test]
    fn lru_evicts_old_clean_blocks_first_and_returns_dirty_victims() {
        let mut c = Cache::new(0);
        for fb in 0..16 {
            assert!(c.insert(1, fb, 100 + fb, buf(fb as u8), fb < 9).is_none());
        }
        assert!(c.get(1, 0).is_some()); // 0 is now the most recent; 1..=8 (dirty) the oldest
        let v = c.insert(2, 0, 50, buf(9), false).expect("no clean block among the oldest 8: a dirty victim");
        assert_eq!((v.phys, v.data[0]), (101, 1));
        assert!(c.insert(2, 1, 51, buf(9), true).is_none()); // evicts block 9, old and clean
        assert!(c.get(1, 9).is_none());
        assert!(c.get(1, 2).is_some());
        let mut written = Vec::new();
        c.flush(|phys, b| {
            written.push((phys, b.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(written, vec![(51, 4096), (100, 4096), (102, 7 * 4096)]);
        c.drop_from(1, 5);
        assert_eq!(c.stats.resident, 6);
        assert_eq!((c.stats.evictions, c.stats.writebacks, c.stats.flushed), (2, 1, 9));
    }
}
