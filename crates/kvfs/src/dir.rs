// SPDX-License-Identifier: Apache-2.0
//! [`KvDir`]: the file operations of the key directory, as plain methods over a
//! [`KvStore`] (the FUSE layer in `fuse.rs` only translates requests and replies), so that
//! tests drive them without a mount.
//!
//! Writes collect in the open file's buffer and go to the store, as one durable Store of
//! the whole value, when the file is flushed (every `close(2)` flushes, and reports the
//! Store's error), fsynced or released. Reads are served from a snapshot taken at `open`, so
//! a value read in several pieces is never torn by a host's Store in between. Nothing is
//! cached across opens: hosts change the store over NVMe/TCP at any time.

use crate::names::{key_of, name_of};
use insitu_kvstore::{KvStore, KvStoreError};
use insitu_proto::kv::{Key, StoreMode};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::sync::Arc;

/// An errno, as the file system answers it.
pub type Errno = libc::c_int;

/// The directory's inode.
pub const ROOT: u64 = 1;

/// Keys listed per List call when a directory is read.
const LIST_PAGE: usize = 1024;

/// What `stat` says about an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Inode number ([`ROOT`] for the directory).
    pub ino: u64,
    /// Bytes of the value (0 for the directory).
    pub size: u64,
    /// Whether this is the directory.
    pub dir: bool,
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Inode number.
    pub ino: u64,
    /// Whether it is a directory (`.` and `..`).
    pub dir: bool,
    /// File name.
    pub name: OsString,
}

/// An open file.
#[derive(Debug)]
struct Handle {
    ino: u64,
    key: Key,
    /// The value as this handle sees it: the store's at open, then this handle's writes.
    data: Vec<u8>,
    /// Written since the last Store.
    dirty: bool,
    writable: bool,
    /// `O_APPEND`: every write goes to the end, whatever offset the kernel passes.
    append: bool,
}

/// The key directory over one store: inode numbers for keys, open files and directory
/// listings. Used from one thread (the FUSE session's).
pub struct KvDir {
    store: Arc<KvStore>,
    ino_of: HashMap<Key, u64>,
    key_of_ino: HashMap<u64, Key>,
    next_ino: u64,
    files: HashMap<u64, Handle>,
    listings: HashMap<u64, Vec<DirEntry>>,
    next_fh: u64,
}

impl KvDir {
    /// A directory of `store`'s keys.
    pub fn new(store: Arc<KvStore>) -> KvDir {
        KvDir { store, ino_of: HashMap::new(), key_of_ino: HashMap::new(), next_ino: ROOT + 1, files: HashMap::new(), listings: HashMap::new(), next_fh: 1 }
    }

    /// The store.
    pub fn store(&self) -> &Arc<KvStore> {
        &self.store
    }

    /// The inode of `key`, numbered on first sight. Numbers are never reused, so a stale
    /// one held by the kernel can only name its own key.
    fn ino(&mut self, key: Key) -> u64 {
        if let Some(&ino) = self.ino_of.get(&key) {
            return ino;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.ino_of.insert(key, ino);
        self.key_of_ino.insert(ino, key);
        ino
    }

    fn key(&self, ino: u64) -> Result<Key, Errno> {
        if ino == ROOT {
            return Err(libc::EISDIR);
        }
        self.key_of_ino.get(&ino).copied().ok_or(libc::ENOENT)
    }

    fn fh(&mut self) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        fh
    }

    /// The size a key's file has now: an open file's unsaved writes count, since the
    /// writer expects to see them (`ls -l`, `O_APPEND` offsets).
    fn size(&self, ino: u64, key: &Key) -> Result<Option<u64>, Errno> {
        if let Some(h) = self.files.values().find(|h| h.ino == ino && h.dirty) {
            return Ok(Some(h.data.len() as u64));
        }
        match self.store.retrieve(key) {
            Ok(v) => Ok(Some(v.len() as u64)),
            Err(KvStoreError::KeyNotFound) => Ok(None),
            Err(e) => Err(errno(&e)),
        }
    }

    /// `lookup`: the file `name` of the directory.
    pub fn lookup(&mut self, parent: u64, name: &OsStr) -> Result<Attr, Errno> {
        if parent != ROOT {
            return Err(libc::ENOTDIR);
        }
        let key = key_of(name).map_err(|e| e.errno())?;
        let ino = self.ino(key);
        let size = self.size(ino, &key)?.ok_or(libc::ENOENT)?;
        Ok(Attr { ino, size, dir: false })
    }

    /// `getattr`.
    pub fn getattr(&mut self, ino: u64) -> Result<Attr, Errno> {
        if ino == ROOT {
            return Ok(Attr { ino, size: 0, dir: true });
        }
        let key = self.key(ino)?;
        let size = self.size(ino, &key)?.ok_or(libc::ENOENT)?;
        Ok(Attr { ino, size, dir: false })
    }

    /// `truncate`/`ftruncate`: through the open file `fh` if given (saved on its flush),
    /// else at once as a Store of the cut or zero-extended value.
    pub fn set_size(&mut self, ino: u64, fh: Option<u64>, size: u64) -> Result<Attr, Errno> {
        let key = self.key(ino)?;
        let max = self.store.max_value();
        let len = usize::try_from(size).ok().filter(|&l| l <= max).ok_or(libc::EFBIG)?;
        if let Some(h) = fh.and_then(|fh| self.files.get_mut(&fh)).filter(|h| h.ino == ino) {
            if !h.writable {
                return Err(libc::EBADF);
            }
            h.data.resize(len, 0);
            h.dirty = true;
            return Ok(Attr { ino, size, dir: false });
        }
        let mut value = match self.store.retrieve(&key) {
            Ok(v) => v,
            Err(e) => return Err(errno(&e)),
        };
        value.resize(len, 0);
        self.store.store(&key, &value, StoreMode::MustExist).map_err(|e| errno(&e))?;
        Ok(Attr { ino, size, dir: false })
    }

    /// `open`: a handle on the value as it is now (empty with `O_TRUNC`).
    pub fn open(&mut self, ino: u64, flags: i32) -> Result<u64, Errno> {
        let key = self.key(ino)?;
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let truncate = writable && flags & libc::O_TRUNC != 0;
        let data = match self.store.retrieve(&key) {
            Ok(v) if !truncate => v,
            Ok(_) => Vec::new(),
            Err(e) => return Err(errno(&e)),
        };
        let fh = self.fh();
        self.files.insert(fh, Handle { ino, key, data, dirty: truncate, writable, append: flags & libc::O_APPEND != 0 });
        Ok(fh)
    }

    /// `create`: makes the key with an empty value (durably, so the name exists for
    /// everyone at once), or opens it if another process made it first.
    pub fn create(&mut self, parent: u64, name: &OsStr, flags: i32) -> Result<(Attr, u64), Errno> {
        if parent != ROOT {
            return Err(libc::ENOTDIR);
        }
        let key = key_of(name).map_err(|e| e.errno())?;
        match self.store.store(&key, &[], StoreMode::MustNotExist) {
            Ok(()) => {}
            Err(KvStoreError::KeyExists) if flags & libc::O_EXCL == 0 => {}
            Err(e) => return Err(errno(&e)),
        }
        let ino = self.ino(key);
        let fh = self.open(ino, flags)?;
        let size = self.files.get(&fh).map_or(0, |h| h.data.len() as u64);
        Ok((Attr { ino, size, dir: false }, fh))
    }

    /// `read`: from the handle's snapshot.
    pub fn read(&self, fh: u64, offset: u64, size: usize) -> Result<&[u8], Errno> {
        let h = self.files.get(&fh).ok_or(libc::EBADF)?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(h.data.len());
        let end = start.saturating_add(size).min(h.data.len());
        Ok(&h.data[start..end])
    }

    /// `write`: into the handle's buffer; EFBIG past the store's largest value.
    pub fn write(&mut self, fh: u64, offset: u64, data: &[u8]) -> Result<usize, Errno> {
        let max = self.store.max_value();
        let h = self.files.get_mut(&fh).ok_or(libc::EBADF)?;
        if !h.writable {
            return Err(libc::EBADF);
        }
        let start = if h.append { h.data.len() } else { usize::try_from(offset).map_err(|_| libc::EFBIG)? };
        let end = start.checked_add(data.len()).filter(|&e| e <= max).ok_or(libc::EFBIG)?;
        if h.data.len() < end {
            h.data.resize(end, 0);
        }
        h.data[start..end].copy_from_slice(data);
        h.dirty = true;
        Ok(data.len())
    }

    /// `flush` (every close) and `fsync`: stores the handle's value if it was written,
    /// durably, before returning. A failed Store leaves the handle dirty, so a later flush
    /// or the release tries again.
    pub fn flush(&mut self, fh: u64) -> Result<(), Errno> {
        let h = self.files.get_mut(&fh).ok_or(libc::EBADF)?;
        if !h.dirty {
            return Ok(());
        }
        self.store.store(&h.key, &h.data, StoreMode::Upsert).map_err(|e| errno(&e))?;
        h.dirty = false;
        Ok(())
    }

    /// `release`: the last reference to the open file went away; stores what a flush
    /// did not.
    pub fn release(&mut self, fh: u64) -> Result<(), Errno> {
        let result = self.flush(fh);
        self.files.remove(&fh);
        result
    }

    /// `unlink`: deletes the key.
    pub fn unlink(&mut self, parent: u64, name: &OsStr) -> Result<(), Errno> {
        if parent != ROOT {
            return Err(libc::ENOTDIR);
        }
        let key = key_of(name).map_err(|e| e.errno())?;
        self.store.delete(&key).map_err(|e| errno(&e))
    }

    /// `opendir`: lists every key now (one consistent listing per open, whatever the
    /// host changes while it is read).
    pub fn opendir(&mut self, ino: u64) -> Result<u64, Errno> {
        if ino != ROOT {
            return Err(libc::ENOTDIR);
        }
        let mut entries = vec![DirEntry { ino: ROOT, dir: true, name: ".".into() }, DirEntry { ino: ROOT, dir: true, name: "..".into() }];
        let mut start: Option<Key> = None;
        loop {
            let page = self.store.list(start.as_ref(), LIST_PAGE).map_err(|e| errno(&e))?;
            // List starts at its start key, which the previous page ended with.
            let fresh: Vec<Key> = page.iter().copied().filter(|k| Some(*k) != start).collect();
            if fresh.is_empty() {
                break;
            }
            for k in &fresh {
                let ino = self.ino(*k);
                entries.push(DirEntry { ino, dir: false, name: name_of(k.as_bytes()) });
            }
            if page.len() < LIST_PAGE {
                break;
            }
            start = fresh.last().copied();
        }
        let fh = self.fh();
        self.listings.insert(fh, entries);
        Ok(fh)
    }

    /// `readdir`: the listing of `opendir`'s handle from entry `offset` on.
    pub fn readdir(&self, fh: u64, offset: usize) -> Result<&[DirEntry], Errno> {
        let l = self.listings.get(&fh).ok_or(libc::EBADF)?;
        Ok(&l[offset.min(l.len())..])
    }

    /// `releasedir`.
    pub fn releasedir(&mut self, fh: u64) {
        self.listings.remove(&fh);
    }
}

/// The errno for a store error: the ones POSIX names for each case.
pub fn errno(e: &KvStoreError) -> Errno {
    match e {
        KvStoreError::KeyNotFound => libc::ENOENT,
        KvStoreError::KeyExists => libc::EEXIST,
        KvStoreError::ValueSize { .. } => libc::EFBIG,
        KvStoreError::Full { .. } => libc::ENOSPC,
        _ => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(max_value: usize) -> KvDir {
        KvDir::new(Arc::new(KvStore::in_memory(1 << 30).unwrap().with_max_value(max_value)))
    }

    fn k(b: &[u8]) -> Key {
        Key::new(b).unwrap()
    }

    fn names(d: &mut KvDir) -> Vec<OsString> {
        let fh = d.opendir(ROOT).unwrap();
        let out = d.readdir(fh, 2).unwrap().iter().map(|e| e.name.clone()).collect();
        d.releasedir(fh);
        out
    }

    /// `echo -n hello > /kv/greeting; cat /kv/greeting; ls /kv; rm /kv/greeting`, as the
    /// kernel turns it into requests.
    #[test]
    fn shell_redirection_stores_on_close_and_cat_reads_it() {
        let mut d = dir(1 << 20);
        assert_eq!(d.lookup(ROOT, OsStr::new("greeting")), Err(libc::ENOENT));
        let (attr, fh) = d.create(ROOT, OsStr::new("greeting"), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC).unwrap();
        assert_eq!((attr.size, attr.dir), (0, false));
        assert_eq!(d.store().retrieve(&k(b"greeting")).unwrap(), b"", "create makes the key");
        assert_eq!(d.write(fh, 0, b"hel").unwrap(), 3);
        assert_eq!(d.write(fh, 3, b"lo").unwrap(), 2);
        assert_eq!(d.getattr(attr.ino).unwrap().size, 5, "unsaved writes show in the size");
        d.flush(fh).unwrap();
        assert_eq!(d.store().retrieve(&k(b"greeting")).unwrap(), b"hello", "durable once close's flush returns");
        d.release(fh).unwrap();

        let a = d.lookup(ROOT, OsStr::new("greeting")).unwrap();
        assert_eq!((a.ino, a.size), (attr.ino, 5));
        let fh = d.open(a.ino, libc::O_RDONLY).unwrap();
        assert_eq!(d.read(fh, 0, 4096).unwrap(), b"hello");
        assert_eq!(d.read(fh, 3, 1).unwrap(), b"l");
        assert_eq!(d.read(fh, 99, 10).unwrap(), b"");
        assert_eq!(d.write(fh, 0, b"x"), Err(libc::EBADF), "read-only handle");
        d.release(fh).unwrap();

        // Keys put by a host show up, binary ones in hex.
        d.store().store(&k(b"fromhost"), b"v1", StoreMode::Upsert).unwrap();
        d.store().store(&k(b"\x00\xff"), b"bin", StoreMode::Upsert).unwrap();
        assert_eq!(names(&mut d), vec![OsString::from("0x00ff"), "fromhost".into(), "greeting".into()]);
        let bin = d.lookup(ROOT, OsStr::new("0x00ff")).unwrap();
        let fh = d.open(bin.ino, libc::O_RDONLY).unwrap();
        assert_eq!(d.read(fh, 0, 10).unwrap(), b"bin");
        d.release(fh).unwrap();

        d.unlink(ROOT, OsStr::new("greeting")).unwrap();
        assert_eq!(d.unlink(ROOT, OsStr::new("greeting")), Err(libc::ENOENT));
        assert_eq!(d.getattr(attr.ino), Err(libc::ENOENT));
        assert!(!d.store().exists(&k(b"greeting")).unwrap());
    }

    #[test]
    fn bad_names_and_big_values_store_nothing() {
        let mut d = dir(8);
        let flags = libc::O_WRONLY | libc::O_CREAT;
        assert_eq!(d.create(ROOT, OsStr::new("seventeen-bytes-x"), flags).unwrap_err(), libc::ENAMETOOLONG);
        assert_eq!(d.lookup(ROOT, OsStr::new("seventeen-bytes-x")).unwrap_err(), libc::ENAMETOOLONG);
        assert_eq!(d.create(ROOT, OsStr::new("0x"), flags).unwrap_err(), libc::EINVAL);
        assert_eq!(d.create(ROOT, OsStr::new("0xabc"), flags).unwrap_err(), libc::EINVAL);
        assert!(d.store().is_empty().unwrap());

        let (a, fh) = d.create(ROOT, OsStr::new("v"), flags).unwrap();
        assert_eq!(d.write(fh, 0, b"12345678").unwrap(), 8);
        assert_eq!(d.write(fh, 8, b"9"), Err(libc::EFBIG), "over max_value");
        assert_eq!(d.write(fh, u64::MAX, b"9"), Err(libc::EFBIG));
        assert_eq!(d.set_size(a.ino, Some(fh), 9).unwrap_err(), libc::EFBIG);
        d.release(fh).unwrap();
        assert_eq!(d.store().retrieve(&k(b"v")).unwrap(), b"12345678");
        assert_eq!(d.create(ROOT, OsStr::new("v"), flags | libc::O_EXCL).unwrap_err(), libc::EEXIST);
        assert_eq!(d.lookup(5, OsStr::new("v")), Err(libc::ENOTDIR));
    }

    #[test]
    fn truncate_append_and_rewrite_in_place() {
        let mut d = dir(1 << 20);
        d.store().store(&k(b"log"), b"one\n", StoreMode::Upsert).unwrap();
        let a = d.lookup(ROOT, OsStr::new("log")).unwrap();
        // `>>`: appends whatever offset the kernel passes.
        let fh = d.open(a.ino, libc::O_WRONLY | libc::O_APPEND).unwrap();
        d.write(fh, 0, b"two\n").unwrap();
        d.release(fh).unwrap();
        assert_eq!(d.store().retrieve(&k(b"log")).unwrap(), b"one\ntwo\n");
        // A write in the middle keeps the rest.
        let fh = d.open(a.ino, libc::O_RDWR).unwrap();
        d.write(fh, 0, b"ONE").unwrap();
        d.flush(fh).unwrap();
        d.release(fh).unwrap();
        assert_eq!(d.store().retrieve(&k(b"log")).unwrap(), b"ONE\ntwo\n");
        // truncate(2) without a handle stores at once; O_TRUNC empties the handle.
        assert_eq!(d.set_size(a.ino, None, 3).unwrap().size, 3);
        assert_eq!(d.store().retrieve(&k(b"log")).unwrap(), b"ONE");
        let fh = d.open(a.ino, libc::O_WRONLY | libc::O_TRUNC).unwrap();
        d.release(fh).unwrap();
        assert_eq!(d.store().retrieve(&k(b"log")).unwrap(), b"");
        // A handle opened only to read never stores, even if the host changed the key.
        let fh = d.open(a.ino, libc::O_RDONLY).unwrap();
        d.store().store(&k(b"log"), b"host", StoreMode::Upsert).unwrap();
        d.release(fh).unwrap();
        assert_eq!(d.store().retrieve(&k(b"log")).unwrap(), b"host");
    }

    #[test]
    fn listing_pages_through_many_keys_once_each() {
        let mut d = dir(1 << 20);
        let keys: Vec<Key> = (0..(LIST_PAGE as u32 * 2 + 7)).map(|i| k(&i.to_be_bytes())).collect();
        d.store().store_many(keys.iter().map(|k| (k, &b"x"[..]))).unwrap();
        let listed = names(&mut d);
        assert_eq!(listed.len(), keys.len());
        let want: Vec<OsString> = keys.iter().map(|k| name_of(k.as_bytes())).collect();
        assert_eq!(listed, want);
        // Inode numbers are stable per key.
        let a = d.lookup(ROOT, &want[5]).unwrap();
        assert_eq!(d.lookup(ROOT, &want[5]).unwrap().ino, a.ino);
    }

    #[test]
    fn a_full_store_is_enospc() {
        assert_eq!(errno(&KvStoreError::Full { capacity: 1, detail: String::new() }), libc::ENOSPC);
        assert_eq!(errno(&KvStoreError::ValueSize { len: 2, max: 1 }), libc::EFBIG);
        assert_eq!(errno(&KvStoreError::Storage("x".into())), libc::EIO);
    }
}
