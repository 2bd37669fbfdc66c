// SPDX-License-Identifier: Apache-2.0
//! [`FsFileBackend`]: redb's storage interface over a file of the target's own file system
//! ([`insitu_accelfs`]), in place of a fixed namespace region.
//!
//! The file's size is at least redb's length: growing allocates zeroed blocks (committed at
//! once), and a shrink only lowers the length in memory, so the file never gets shorter
//! than a commit slot on the device may name. Writes go through to the device in order.
//! redb's `sync_data` is the file's sync, which commits the file system: redb's own
//! checksummed commit slots then sit on data the file system made durable, in order. The
//! file system holds the length, so no header is needed here.

use insitu_accelfs::{Error as FsError, File, Fs};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A file of an accelfs that redb uses as its file.
#[derive(Debug)]
pub struct FsFileBackend {
    file: File,
    /// redb's length: at most the file's size (shrinks are kept in memory only, see
    /// `set_len`).
    len: AtomicU64,
    capacity: u64,
    full: Arc<AtomicBool>,
}

impl FsFileBackend {
    /// Opens the file `name` of `fs`, creating it (empty) if there is none.
    pub fn open(fs: &Fs, name: &str) -> Result<FsFileBackend, FsError> {
        let file = match fs.open_file(name) {
            Ok(f) => f,
            Err(FsError::NotFound(_)) => fs.create(name)?,
            Err(e) => return Err(e),
        };
        let len = AtomicU64::new(file.len()?);
        Ok(FsFileBackend { file, len, capacity: fs.capacity(), full: Arc::new(AtomicBool::new(false)) })
    }

    /// Bytes the store may grow to: the file system's capacity (shared with its other files).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Set when redb asked for more room than the file system has (until cleared by the
    /// store).
    pub(crate) fn full_flag(&self) -> Arc<AtomicBool> {
        self.full.clone()
    }
}

/// Writes zeros over `[from, to)` of `file`, a MiB at a time.
fn zero(file: &File, from: u64, to: u64) -> Result<(), io::Error> {
    let zeros = vec![0u8; 1 << 20];
    let mut at = from;
    while at < to {
        let n = (to - at).min(zeros.len() as u64) as usize;
        file.write_through_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

impl redb::StorageBackend for FsFileBackend {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.len.load(Ordering::Acquire))
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        Ok(self.file.read_exact_at(out, offset)?)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let (old, size) = (self.len.load(Ordering::Acquire), self.file.len()?);
        if len <= size {
            // The file keeps its size: after a kill, the previous commit slot redb falls
            // back to may name pages past a shorter length (seen: restarts refused with
            // accesses past the end). Space inside the file redb gave back reads as zeros
            // when it takes it again, as after a truncate.
            if len > old {
                zero(&self.file, old, len)?;
            }
            self.len.store(len, Ordering::Release);
            return Ok(());
        }
        if size > old {
            zero(&self.file, old, size)?;
        }
        match self.file.set_len(len) {
            Err(e @ FsError::NoSpace { .. }) => {
                self.full.store(true, Ordering::Relaxed);
                Err(io::Error::other(format!("the KV store file {:?} cannot grow to {len} bytes: {e}", self.file.name())))
            }
            // A grown size is committed at once, and writes go through to the device
            // (below): the device then holds what redb wrote, in the order it wrote it, as
            // a kernel file system's page cache would when the process dies.
            Ok(()) => {
                self.file.sync()?;
                self.len.store(len, Ordering::Release);
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        Ok(self.file.sync()?)
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        // redb writes only within the length it set; a write past it is a bug, not growth.
        let len = self.len.load(Ordering::Acquire);
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > len) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("KV store write of {} bytes at {offset} is past its length {len}", data.len())));
        }
        Ok(self.file.write_through_at(data, offset)?)
    }
}

#[cfg(test)]
mod tests {
    use crate::wire::{Key, StoreMode};
    use crate::{KvStore, KvStoreError};
    use insitu_accelfs::{CrashMode, FileDevice, Fs, MemDevice};
    use std::collections::BTreeMap;

    fn k(i: u32) -> Key {
        Key::new(format!("key{i}").as_bytes()).unwrap()
    }

    fn value(i: u32) -> Vec<u8> {
        vec![i as u8; (i as usize * 37) % 3000 + 1]
    }

    #[test]
    fn fs_store_survives_reopen_beside_other_files() {
        let img = tempfile::NamedTempFile::new().unwrap();
        img.as_file().set_len(32 << 20).unwrap();
        let dev = || FileDevice::new(img.reopen().unwrap(), 0, 32 << 20, img.path().display().to_string());
        {
            let fs = Fs::format(dev(), 1 << 20).unwrap();
            fs.create("other").unwrap().write_at(&[5; 100_000], 0).unwrap();
            let s = KvStore::open_fs(&fs, "kv").unwrap();
            for i in 0..2000 {
                s.store(&k(i), &value(i), StoreMode::Upsert).unwrap();
            }
            for i in (0..2000).step_by(3) {
                s.delete(&k(i)).unwrap();
            }
            assert!(fs.stats().hits > 0);
        }
        let fs = Fs::open(dev(), 1 << 20).unwrap();
        assert!(fs.fsck().unwrap().is_clean());
        let s = KvStore::open_fs(&fs, "kv").unwrap();
        assert_eq!(s.len().unwrap(), 2000 - 667);
        for i in 0..2000 {
            match i % 3 {
                0 => assert!(matches!(s.retrieve(&k(i)), Err(KvStoreError::KeyNotFound))),
                _ => assert_eq!(s.retrieve(&k(i)).unwrap(), value(i)),
            }
        }
        let mut b = vec![0u8; 100_000];
        fs.open_file("other").unwrap().read_exact_at(&mut b, 0).unwrap();
        assert!(b.iter().all(|x| *x == 5));
    }

    /// Power fails after a random number of device writes; every store acknowledged before
    /// is there after recovery, and the file system is clean.
    #[test]
    fn acknowledged_stores_survive_power_loss() {
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for round in 0..30u64 {
            let dev = MemDevice::new(16 << 20);
            let fs = Fs::format(dev.clone(), 256 << 10).unwrap();
            let s = KvStore::open_fs(&fs, "kv").unwrap();
            let budget = 1 + next(3000);
            dev.fail_after_writes(Some(budget));
            let mut acked = BTreeMap::new();
            let mut in_flight = None;
            for i in 0..1_000_000u32 {
                let v = vec![(i + round as u32) as u8; 1 + next(6000) as usize];
                match s.store(&k(i % 700), &v, StoreMode::Upsert) {
                    Ok(()) => acked.insert(i % 700, v),
                    Err(_) => {
                        in_flight = Some((i % 700, v));
                        break;
                    }
                };
            }
            let mode = if round % 2 == 0 { CrashMode::DropUnsynced } else { CrashMode::KeepRandom { seed: round } };
            let after = dev.crash(mode);
            drop((s, fs));
            let fs = Fs::open(after, 256 << 10).unwrap_or_else(|e| panic!("round {round} ({budget} writes, {mode:?}): {e}"));
            let report = fs.fsck().unwrap();
            assert!(report.is_clean(), "round {round}: {:?}", report.problems);
            let s = KvStore::open_fs(&fs, "kv").unwrap_or_else(|e| panic!("round {round} ({budget} writes, {mode:?}): {e}"));
            for (i, v) in &acked {
                // The store in flight may have landed, replacing an acknowledged value.
                let got = s.retrieve(&k(*i)).unwrap_or_else(|e| panic!("round {round}: acknowledged key{i} lost: {e}"));
                let landed = in_flight.as_ref().is_some_and(|(j, w)| j == i && got == *w);
                assert!(got == *v || landed, "round {round}: key{i} holds neither its acknowledged value nor the in-flight one");
            }
            // The recovered store takes more work.
            s.store(&k(9999), b"after", StoreMode::Upsert).unwrap();
        }
    }

    #[test]
    fn a_full_fs_says_full_and_keeps_what_it_has() {
        let fs = Fs::format(MemDevice::new(3 << 20), 1 << 20).unwrap();
        let s = KvStore::open_fs(&fs, "kv").unwrap();
        let v = vec![7u8; 64 << 10];
        let mut stored = 0u32;
        let err = loop {
            match s.store(&Key::new(&stored.to_le_bytes()).unwrap(), &v, StoreMode::Upsert) {
                Ok(()) => stored += 1,
                Err(e) => break e,
            }
            assert!(stored < 1000, "a 3 MiB file system took 64 MB");
        };
        assert!(matches!(err, KvStoreError::Full { .. }), "{err}");
        assert!(stored > 0);
        for i in 0..stored {
            assert_eq!(s.retrieve(&Key::new(&i.to_le_bytes()).unwrap()).unwrap(), v);
        }
        assert!(fs.fsck().unwrap().is_clean());
    }
}
