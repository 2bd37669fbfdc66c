// SPDX-License-Identifier: Apache-2.0
//! [`KvStore`]: the key-value service's engine, redb over any [`redb::StorageBackend`].

use crate::fs_backend::FsFileBackend;
use crate::region::RegionBackend;
use crate::wire::{Key, StoreMode};
use crate::KvStoreError;
use insitu_media::Backing;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The one table: key bytes to value bytes, in byte order.
const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv");

/// Largest value by default: 1 MiB, one NVMe/TCP transfer at the default MDTS.
pub const DEFAULT_MAX_VALUE: usize = 1 << 20;

/// redb's page cache, bytes. redb would otherwise let it grow to 1 GiB; a drive's
/// controller has little DRAM, and a bound keeps the store's memory the same whatever
/// storage is under it (the benchmarks compare stacks with the same engine settings).
pub const CACHE_BYTES: usize = 16 << 20;

/// A durable key-value store. Keys are 1–16 bytes ([`Key`]), values up to
/// [`KvStore::max_value`] bytes. Every change is committed with immediate durability
/// before the call returns. `Send + Sync`: readers run concurrently, writers one at a time.
pub struct KvStore {
    db: Database,
    max_value: usize,
    capacity: u64,
    /// Set by a [`RegionBackend`] or [`FsFileBackend`] that ran out of room.
    full: Option<Arc<AtomicBool>>,
}

impl std::fmt::Debug for KvStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStore").field("max_value", &self.max_value).field("capacity", &self.capacity).finish()
    }
}

impl KvStore {
    /// Opens (or formats) the store kept in `[base, base + len)` of `media`, a region of a
    /// private namespace. Values may be up to [`DEFAULT_MAX_VALUE`] bytes.
    pub fn open_region(media: Arc<Backing>, base: u64, len: u64) -> Result<KvStore, KvStoreError> {
        let backend = RegionBackend::open(media, base, len).map_err(KvStoreError::Open)?;
        let (full, capacity) = (backend.full_flag(), backend.capacity());
        let mut s = KvStore::with_backend(backend, capacity)?;
        s.full = Some(full);
        Ok(s)
    }

    /// Opens (or creates) the store kept in the file `name` of `fs` (a file system on a
    /// private namespace), creating the file if there is none. Its capacity is the file
    /// system's; when the file system is full, changes fail with [`KvStoreError::Full`].
    pub fn open_fs(fs: &insitu_accelfs::Fs, name: &str) -> Result<KvStore, KvStoreError> {
        let backend = FsFileBackend::open(fs, name).map_err(|e| KvStoreError::Open(format!("the KV store file {name:?}: {e}")))?;
        let (full, capacity) = (backend.full_flag(), backend.capacity());
        let mut s = KvStore::with_backend(backend, capacity)?;
        s.full = Some(full);
        Ok(s)
    }

    /// Opens (or creates) a store over any redb storage backend (the pluggable storage
    /// interface: a namespace region today, a file of the target's own file system later).
    /// `capacity` is what [`KvStore::capacity`] reports.
    pub fn with_backend(backend: impl redb::StorageBackend, capacity: u64) -> Result<KvStore, KvStoreError> {
        let db = Database::builder().set_cache_size(CACHE_BYTES).create_with_backend(backend).map_err(|e| KvStoreError::Open(format!("redb: {e}")))?;
        let s = KvStore { db, max_value: DEFAULT_MAX_VALUE, capacity, full: None };
        // Create the table once so that readers always find it.
        let mut tx = s.db.begin_write().map_err(storage)?;
        tx.set_durability(Durability::Immediate).map_err(storage)?;
        tx.open_table(TABLE).map_err(storage)?;
        tx.commit().map_err(storage)?;
        Ok(s)
    }

    /// Opens (or creates) the store in the file `path` of any file system, through redb's
    /// own file backend: the same engine with the kernel's file system under it (the
    /// benchmarks' system-call and redirection baselines).
    pub fn open_file(path: &std::path::Path) -> Result<KvStore, KvStoreError> {
        let open = |e: std::io::Error| KvStoreError::Open(format!("{}: {e}", path.display()));
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(open)?;
        let backend = redb::backends::FileBackend::new(file).map_err(|e| KvStoreError::Open(format!("{}: {e}", path.display())))?;
        KvStore::with_backend(backend, u64::MAX)
    }

    /// A store in memory, for tests and examples.
    pub fn in_memory(capacity: u64) -> Result<KvStore, KvStoreError> {
        KvStore::with_backend(redb::backends::InMemoryBackend::new(), capacity)
    }

    /// Sets the largest value accepted (default [`DEFAULT_MAX_VALUE`]).
    pub fn with_max_value(mut self, bytes: usize) -> KvStore {
        self.max_value = bytes;
        self
    }

    /// The largest value accepted, in bytes.
    pub fn max_value(&self) -> usize {
        self.max_value
    }

    /// Bytes the store may occupy.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Stores `value` under `key` as `mode` allows; durable when this returns `Ok`.
    /// Errors: [`KvStoreError::ValueSize`], [`KvStoreError::KeyNotFound`] (`MustExist`),
    /// [`KvStoreError::KeyExists`] (`MustNotExist`), [`KvStoreError::Full`]; on any error
    /// nothing changed.
    pub fn store(&self, key: &Key, value: &[u8], mode: StoreMode) -> Result<(), KvStoreError> {
        if value.len() > self.max_value {
            return Err(KvStoreError::ValueSize { len: value.len(), max: self.max_value });
        }
        self.write(|t| {
            let exists = t.get(key.as_bytes())?.is_some();
            match (mode, exists) {
                (StoreMode::MustExist, false) => return Ok(Err(KvStoreError::KeyNotFound)),
                (StoreMode::MustNotExist, true) => return Ok(Err(KvStoreError::KeyExists)),
                _ => {}
            }
            t.insert(key.as_bytes(), value)?;
            Ok(Ok(()))
        })
    }

    /// Stores every pair in one durable transaction (upserts), as a bulk load does: all or
    /// nothing. Errors as [`KvStore::store`].
    pub fn store_many<'a>(&self, pairs: impl IntoIterator<Item = (&'a Key, &'a [u8])>) -> Result<(), KvStoreError> {
        self.write(|t| {
            for (key, value) in pairs {
                if value.len() > self.max_value {
                    return Ok(Err(KvStoreError::ValueSize { len: value.len(), max: self.max_value }));
                }
                t.insert(key.as_bytes(), value)?;
            }
            Ok(Ok(()))
        })
    }

    /// Up to `max` pairs in key order from `start` (that key or the next), as one
    /// consistent snapshot.
    pub fn scan(&self, start: &Key, max: usize) -> Result<Vec<(Key, Vec<u8>)>, KvStoreError> {
        let tx = self.db.begin_read().map_err(storage)?;
        let t = tx.open_table(TABLE).map_err(storage)?;
        let mut out = Vec::new();
        for entry in t.range(start.as_bytes()..).map_err(storage)?.take(max) {
            let (k, v) = entry.map_err(storage)?;
            let key = Key::new(k.value()).map_err(|e| KvStoreError::Storage(format!("stored key is invalid: {e}")))?;
            out.push((key, v.value().to_vec()));
        }
        Ok(out)
    }

    /// The value of `key`, or [`KvStoreError::KeyNotFound`].
    pub fn retrieve(&self, key: &Key) -> Result<Vec<u8>, KvStoreError> {
        let tx = self.db.begin_read().map_err(storage)?;
        let t = tx.open_table(TABLE).map_err(storage)?;
        let v = t.get(key.as_bytes()).map_err(storage)?.ok_or(KvStoreError::KeyNotFound)?;
        Ok(v.value().to_vec())
    }

    /// Deletes `key`, or [`KvStoreError::KeyNotFound`]; durable when this returns `Ok`.
    pub fn delete(&self, key: &Key) -> Result<(), KvStoreError> {
        self.write(|t| Ok(if t.remove(key.as_bytes())?.is_some() { Ok(()) } else { Err(KvStoreError::KeyNotFound) }))
    }

    /// Whether `key` has a value.
    pub fn exists(&self, key: &Key) -> Result<bool, KvStoreError> {
        let tx = self.db.begin_read().map_err(storage)?;
        let t = tx.open_table(TABLE).map_err(storage)?;
        Ok(t.get(key.as_bytes()).map_err(storage)?.is_some())
    }

    /// Up to `max` keys in byte order, from `start` (that key or the next; `None`: the
    /// first).
    pub fn list(&self, start: Option<&Key>, max: usize) -> Result<Vec<Key>, KvStoreError> {
        let tx = self.db.begin_read().map_err(storage)?;
        let t = tx.open_table(TABLE).map_err(storage)?;
        let range = match start {
            Some(k) => t.range(k.as_bytes()..).map_err(storage)?,
            None => t.range::<&[u8]>(..).map_err(storage)?,
        };
        let mut out = Vec::new();
        for entry in range.take(max) {
            let (k, _) = entry.map_err(storage)?;
            out.push(Key::new(k.value()).map_err(|e| KvStoreError::Storage(format!("stored key is invalid: {e}")))?);
        }
        Ok(out)
    }

    /// Number of keys stored.
    pub fn len(&self) -> Result<u64, KvStoreError> {
        let tx = self.db.begin_read().map_err(storage)?;
        let t = tx.open_table(TABLE).map_err(storage)?;
        t.len().map_err(storage)
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> Result<bool, KvStoreError> {
        Ok(self.len()? == 0)
    }

    /// Runs `f` in a write transaction and commits it durably when `f` returns `Ok(Ok)`;
    /// an inner `Err` aborts it. A failure for want of room is [`KvStoreError::Full`].
    fn write(&self, f: impl FnOnce(&mut redb::Table<&[u8], &[u8]>) -> Result<Result<(), KvStoreError>, redb::StorageError>) -> Result<(), KvStoreError> {
        if let Some(full) = &self.full {
            full.store(false, Ordering::Relaxed);
        }
        let result = (|| {
            let mut tx = self.db.begin_write().map_err(storage)?;
            tx.set_durability(Durability::Immediate).map_err(storage)?;
            let outcome = {
                let mut t = tx.open_table(TABLE).map_err(storage)?;
                f(&mut t).map_err(storage)?
            };
            match outcome {
                Ok(()) => tx.commit().map_err(storage),
                Err(e) => {
                    tx.abort().map_err(storage)?;
                    Err(e)
                }
            }
        })();
        match result {
            Err(KvStoreError::Storage(detail)) if self.full.as_ref().is_some_and(|f| f.load(Ordering::Relaxed)) => {
                Err(KvStoreError::Full { capacity: self.capacity, detail })
            }
            r => r,
        }
    }
}

fn storage(e: impl std::fmt::Display) -> KvStoreError {
    KvStoreError::Storage(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn k(s: &[u8]) -> Key {
        Key::new(s).unwrap()
    }

    #[test]
    fn store_retrieve_delete_exist_list() {
        let s = KvStore::in_memory(1 << 30).unwrap();
        assert!(matches!(s.retrieve(&k(b"a")), Err(KvStoreError::KeyNotFound)));
        s.store(&k(b"b"), b"2", StoreMode::Upsert).unwrap();
        s.store(&k(b"a"), b"1", StoreMode::MustNotExist).unwrap();
        assert!(matches!(s.store(&k(b"a"), b"x", StoreMode::MustNotExist), Err(KvStoreError::KeyExists)));
        assert!(matches!(s.store(&k(b"c"), b"x", StoreMode::MustExist), Err(KvStoreError::KeyNotFound)));
        s.store(&k(b"a"), b"11", StoreMode::MustExist).unwrap();
        assert_eq!(s.retrieve(&k(b"a")).unwrap(), b"11");
        assert!(s.exists(&k(b"b")).unwrap());
        assert_eq!(s.list(None, 10).unwrap(), vec![k(b"a"), k(b"b")]);
        assert_eq!(s.list(Some(&k(b"ab")), 10).unwrap(), vec![k(b"b")]);
        s.delete(&k(b"a")).unwrap();
        assert!(matches!(s.delete(&k(b"a")), Err(KvStoreError::KeyNotFound)));
        assert_eq!(s.len().unwrap(), 1);
        s.store_many([(&k(b"c"), &b"3"[..]), (&k(b"d"), &b"4"[..])]).unwrap();
        let scanned: Vec<_> = s.scan(&k(b"bb"), 5).unwrap().into_iter().map(|(key, v)| (key.as_bytes().to_vec(), v)).collect();
        assert_eq!(scanned, vec![(b"c".to_vec(), b"3".to_vec()), (b"d".to_vec(), b"4".to_vec())]);
        assert!(matches!(s.store_many([(&k(b"e"), &b"5"[..]), (&k(b"f"), &vec![0u8; DEFAULT_MAX_VALUE + 1][..])]), Err(KvStoreError::ValueSize { .. })));
        assert!(!s.exists(&k(b"e")).unwrap(), "a refused batch stores nothing");
        s.delete(&k(b"c")).unwrap();
        s.delete(&k(b"d")).unwrap();
        let big = vec![0u8; DEFAULT_MAX_VALUE + 1];
        assert!(matches!(s.store(&k(b"z"), &big, StoreMode::Upsert), Err(KvStoreError::ValueSize { .. })));
        assert!(!s.exists(&k(b"z")).unwrap());
    }

    #[test]
    fn region_store_survives_reopen_and_refuses_foreign_data() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("p.img");
        std::fs::write(&img, vec![0u8; 16 << 20]).unwrap();
        let media = || Arc::new(Backing::open(&img, false).unwrap());
        let mut model = BTreeMap::new();
        {
            let s = KvStore::open_region(media(), 8 << 20, 8 << 20).unwrap();
            for i in 0..200u32 {
                let key = format!("key{i}");
                let v = vec![i as u8; (i as usize * 37) % 3000];
                s.store(&k(key.as_bytes()), &v, StoreMode::Upsert).unwrap();
                model.insert(key.into_bytes(), v);
            }
        }
        let s = KvStore::open_region(media(), 8 << 20, 8 << 20).unwrap();
        assert_eq!(s.len().unwrap(), 200);
        for (key, v) in &model {
            assert_eq!(&s.retrieve(&k(key)).unwrap(), v);
        }
        drop(s);
        // Another size for the same region is refused, as is a region holding other data.
        assert!(KvStore::open_region(media(), 8 << 20, 4 << 20).unwrap_err().to_string().contains("--kv-store"));
        std::fs::write(&img, vec![0xA5u8; 16 << 20]).unwrap();
        assert!(KvStore::open_region(media(), 8 << 20, 8 << 20).unwrap_err().to_string().contains("other data"));
    }

    #[test]
    fn a_full_region_says_so_and_keeps_what_it_has() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("p.img");
        std::fs::write(&img, vec![0u8; 3 << 20]).unwrap();
        let s = KvStore::open_region(Arc::new(Backing::open(&img, false).unwrap()), 1 << 20, 2 << 20).unwrap();
        let v = vec![7u8; 64 << 10];
        let mut stored = 0u32;
        let err = loop {
            match s.store(&k(&stored.to_le_bytes()), &v, StoreMode::Upsert) {
                Ok(()) => stored += 1,
                Err(e) => break e,
            }
            assert!(stored < 1000, "a 2 MiB region took 64 MB");
        };
        assert!(matches!(err, KvStoreError::Full { .. }), "{err}");
        assert!(stored > 0);
        for i in 0..stored {
            assert_eq!(s.retrieve(&k(&i.to_le_bytes())).unwrap(), v);
        }
    }
}
