// SPDX-License-Identifier: Apache-2.0
//! Writable files of the sharable namespace: files the host pre-allocated, served by the
//! target through FUSE so that a container's reads and writes go straight to the file's
//! bytes on the namespace, with the file system's metadata left alone.
//!
//! The host owns the namespace's file system and mounts it read-write; the target's own
//! mount is read-only and never writes a block of it. A container that must write results
//! into the namespace is therefore given a file whose every byte already lives in a
//! written extent ([`ExtentMap`]): writing those bytes in place changes the file's
//! content and nothing else (no allocation, no size, no time stamp), which the host's file
//! system cannot tell from a device that changed under it, exactly what a host sees after
//! an EXEC with an output object. The size is fixed: a write past the end fails with
//! EFBIG; truncating (as `>` in a shell does) zeroes the bytes from the new length on and
//! keeps the size.
//!
//! One FUSE mount serves every such file of the target, one entry per container bind,
//! named by its inode number; the container's bind mount of the entry is all it sees.
//! Entries live while their container runs ([`WritableFiles::add`], [`WritableFiles::remove`]).

use fuser::{
    FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow,
};
use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::extents::ExtentMap;
use super::RuntimeError;

/// Attributes are not cached: an entry disappears when its container stops.
const TTL: Duration = Duration::ZERO;
/// `FOPEN_DIRECT_IO`: every read and write reaches this file system (and so the media)
/// at once, and a write past the end fails at `write(2)` instead of at write-back.
const FOPEN_DIRECT_IO: u32 = 1;
const ROOT: u64 = 1;
/// Bytes zeroed per write when a truncation clears the tail.
const ZERO_CHUNK: usize = 1 << 20;

/// One writable file.
struct Entry {
    map: ExtentMap,
    /// Mode, owner and times of the file on the sharable namespace, shown unchanged.
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: SystemTime,
    ctime: SystemTime,
    atime: SystemTime,
}

type Table = Arc<Mutex<BTreeMap<u64, Arc<Entry>>>>;

/// The FUSE side: answers the kernel from the table, reading and writing the namespace.
struct FilesFs {
    media: Arc<File>,
    table: Table,
}

impl FilesFs {
    fn entry(&self, ino: u64) -> Option<Arc<Entry>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).get(&ino).cloned()
    }

    fn attr(ino: u64, e: &Entry) -> FileAttr {
        FileAttr {
            ino,
            size: e.map.size(),
            blocks: e.map.size().div_ceil(512),
            atime: e.atime,
            mtime: e.mtime,
            ctime: e.ctime,
            crtime: e.ctime,
            kind: FileType::RegularFile,
            perm: (e.mode & 0o7777) as u16,
            nlink: 1,
            uid: e.uid,
            gid: e.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn root_attr() -> FileAttr {
        let now = SystemTime::now();
        FileAttr {
            ino: ROOT,
            size: 0,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind: FileType::Directory,
            perm: 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Writes `data` at file byte `offset`; a write reaching past the end is cut there
    /// (a short write, as at a file size limit) and one starting at or after it fails.
    fn write_at(&self, e: &Entry, offset: u64, data: &[u8]) -> Result<usize, i32> {
        if data.is_empty() {
            return Ok(0);
        }
        if offset >= e.map.size() {
            return Err(libc::EFBIG);
        }
        let mut done = 0usize;
        for (at, len) in e.map.ranges(offset, data.len() as u64) {
            let len = len as usize;
            self.media.write_all_at(&data[done..done + len], at).map_err(|err| err.raw_os_error().unwrap_or(libc::EIO))?;
            done += len;
        }
        Ok(done)
    }

    fn read_at(&self, e: &Entry, offset: u64, size: u32) -> Result<Vec<u8>, i32> {
        let ranges = e.map.ranges(offset, u64::from(size));
        let mut out = vec![0u8; ranges.iter().map(|r| r.1 as usize).sum()];
        let mut done = 0usize;
        for (at, len) in ranges {
            let len = len as usize;
            self.media.read_exact_at(&mut out[done..done + len], at).map_err(|err| err.raw_os_error().unwrap_or(libc::EIO))?;
            done += len;
        }
        Ok(out)
    }

    /// Truncation to `n` bytes. The size stays: the bytes from `n` on read as zeros, as
    /// they would after a truncation and a re-extension to the pre-allocated size.
    fn truncate(&self, e: &Entry, n: u64) -> Result<(), i32> {
        if n > e.map.size() {
            return Err(libc::EFBIG);
        }
        let zeros = vec![0u8; ZERO_CHUNK];
        let mut at = n;
        while at < e.map.size() {
            let len = (e.map.size() - at).min(ZERO_CHUNK as u64) as usize;
            self.write_at(e, at, &zeros[..len])?;
            at += len as u64;
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), i32> {
        self.media.sync_data().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl Filesystem for FilesFs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let ino = std::str::from_utf8(name.as_bytes()).ok().and_then(|n| n.parse::<u64>().ok());
        match ino.filter(|_| parent == ROOT).and_then(|i| self.entry(i).map(|e| (i, e))) {
            Some((i, e)) => reply.entry(&TTL, &Self::attr(i, &e), 0),
            None => reply.error(libc::ENOENT),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        if ino == ROOT {
            return reply.attr(&TTL, &Self::root_attr());
        }
        match self.entry(ino) {
            Some(e) => reply.attr(&TTL, &Self::attr(ino, &e)),
            None => reply.error(libc::ENOENT),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let Some(e) = self.entry(ino) else { return reply.error(libc::ENOENT) };
        // Owners and modes are the host's metadata: refused rather than pretended. Times
        // are accepted and left as they are (so `touch` works), as on file systems
        // without them.
        if mode.is_some() || uid.is_some() || gid.is_some() {
            return reply.error(libc::EPERM);
        }
        if let Some(n) = size {
            if let Err(err) = self.truncate(&e, n) {
                return reply.error(err);
            }
        }
        reply.attr(&TTL, &Self::attr(ino, &e))
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        let Some(e) = self.entry(ino) else { return reply.error(libc::ENOENT) };
        // Appending writes at the end, which is fixed: always EFBIG, so say so at open.
        if flags & libc::O_APPEND != 0 {
            return reply.error(libc::EFBIG);
        }
        // The kernel passes O_TRUNC on only when it leaves truncation to the open.
        if flags & libc::O_TRUNC != 0 {
            if let Err(err) = self.truncate(&e, 0) {
                return reply.error(err);
            }
        }
        reply.opened(0, FOPEN_DIRECT_IO)
    }

    fn read(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, offset: i64, size: u32, _flags: i32, _lock: Option<u64>, reply: ReplyData) {
        let Some(e) = self.entry(ino) else { return reply.error(libc::ESTALE) };
        let Ok(offset) = u64::try_from(offset) else { return reply.error(libc::EINVAL) };
        match self.read_at(&e, offset, size) {
            Ok(d) => reply.data(&d),
            Err(err) => reply.error(err),
        }
    }

    fn write(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, offset: i64, data: &[u8], _wf: u32, _flags: i32, _lock: Option<u64>, reply: ReplyWrite) {
        let Some(e) = self.entry(ino) else { return reply.error(libc::ESTALE) };
        let Ok(offset) = u64::try_from(offset) else { return reply.error(libc::EINVAL) };
        match self.write_at(&e, offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(err) => reply.error(err),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock: u64, reply: ReplyEmpty) {
        // On every close: what a container wrote is on the media when close returns.
        match self.sync() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _datasync: bool, reply: ReplyEmpty) {
        match self.sync() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _flags: i32, _lock: Option<u64>, _flush: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn opendir(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        if ino == ROOT {
            reply.opened(0, 0)
        } else {
            reply.error(libc::ENOTDIR)
        }
    }

    fn readdir(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, offset: i64, mut reply: ReplyDirectory) {
        if ino != ROOT {
            return reply.error(libc::ENOTDIR);
        }
        let inos: Vec<u64> = self.table.lock().unwrap_or_else(|e| e.into_inner()).keys().copied().collect();
        let start = usize::try_from(offset).unwrap_or(0);
        for (i, ino) in inos.iter().enumerate().skip(start) {
            if reply.add(*ino, (i + 1) as i64, FileType::RegularFile, ino.to_string()) {
                break;
            }
        }
        reply.ok();
    }
}

/// The mounted file system of a target's writable files. Dropping it unmounts it
/// (lazily: a container that still holds a file keeps nothing of the target busy).
pub struct WritableFiles {
    dir: PathBuf,
    table: Table,
    next: AtomicU64,
    session: Option<fuser::BackgroundSession>,
}

impl WritableFiles {
    /// Mounts the file system at `dir` (created if missing), writing through to `media`,
    /// the sharable namespace's image or block device. A mount left at `dir` by a target
    /// that was killed is detached first.
    pub fn mount(dir: &Path, media: &Path) -> Result<WritableFiles, RuntimeError> {
        detach(dir);
        std::fs::create_dir_all(dir).map_err(|e| RuntimeError::io(dir, e))?;
        let media = std::fs::OpenOptions::new().read(true).write(true).open(media).map_err(|e| RuntimeError::io(media, e))?;
        let table: Table = Arc::default();
        let options = [
            MountOption::FSName("insitu-files".into()),
            MountOption::Subtype("insitu-files".into()),
            // A container's processes may run as any user; the file's own mode and owner
            // (from the sharable namespace) decide, as for any bind mount.
            MountOption::AllowOther,
            MountOption::DefaultPermissions,
            MountOption::NoExec,
            MountOption::NoDev,
            MountOption::NoSuid,
            MountOption::RW,
        ];
        let fs = FilesFs { media: Arc::new(media), table: table.clone() };
        let session = fuser::spawn_mount2(fs, dir, &options).map_err(|e| {
            RuntimeError::Setup(format!(
                "cannot mount the writable files' FUSE file system at {}: {e} (the target needs /dev/fuse: `modprobe fuse`)",
                dir.display()
            ))
        })?;
        Ok(WritableFiles { dir: dir.into(), table, next: AtomicU64::new(ROOT + 1), session: Some(session) })
    }

    /// Serves `map` as a new entry with the mode, owner and times of `meta` (the file on
    /// the sharable namespace); returns its inode number and the path to bind. Refused
    /// (409) while an entry of another container shares a sector with it.
    pub fn add(&self, map: ExtentMap, meta: &std::fs::Metadata, what: &str) -> Result<(u64, PathBuf), RuntimeError> {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.values().any(|e| e.map.overlaps(&map)) {
            return Err(RuntimeError::Conflict(format!("{what} is being written by another running container; wait for it to stop")));
        }
        let time = |s: i64, ns: i64| SystemTime::UNIX_EPOCH + Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32);
        let entry = Entry {
            map,
            mode: meta.mode(),
            uid: meta.uid(),
            gid: meta.gid(),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            atime: time(meta.atime(), meta.atime_nsec()),
        };
        let ino = self.next.fetch_add(1, Ordering::Relaxed);
        t.insert(ino, Arc::new(entry));
        Ok((ino, self.dir.join(ino.to_string())))
    }

    /// Stops serving entry `ino`: its container's reads and writes fail from now on.
    pub fn remove(&self, ino: u64) {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).remove(&ino);
    }
}

impl Drop for WritableFiles {
    fn drop(&mut self) {
        detach(&self.dir);
        drop(self.session.take());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Lazily unmounts whatever is mounted at `dir` (errors ignored: usually nothing is).
fn detach(dir: &Path) {
    if let Ok(c) = CString::new(dir.as_os_str().as_bytes()) {
        // SAFETY: umount2 reads the NUL-terminated path, which lives across the call.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::extents::RawExtent;
    use std::io::{Read, Seek, SeekFrom, Write};

    /// Through a real mount over a plain image file, as root with /dev/fuse (skipped
    /// otherwise): bytes land at the extents' places in the image and nowhere else.
    #[test]
    fn writes_reach_the_extents_and_stop_at_the_end() {
        // SAFETY: geteuid has no arguments.
        if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
            eprintln!("skipped: needs root and /dev/fuse");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("ns.img");
        std::fs::write(&image, vec![0xAAu8; 1 << 20]).unwrap();
        // File bytes 0..4096 at image byte 65536, 4096..6000 at image byte 8192.
        let raw = [RawExtent { logical: 0, physical: 65536, length: 4096, flags: 0 }, RawExtent { logical: 4096, physical: 8192, length: 4096, flags: 1 }];
        let map = ExtentMap::new(6000, &raw, 1 << 20).unwrap();
        let files = WritableFiles::mount(&dir.path().join("mnt"), &image).unwrap();
        let meta = std::fs::metadata(&image).unwrap();
        let (ino, path) = files.add(map.clone(), &meta, "f").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 6000);
        assert!(files.add(map, &meta, "f").unwrap_err().to_string().contains("another running container"));

        let mut f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        f.seek(SeekFrom::Start(4000)).unwrap();
        f.write_all(&[7u8; 200]).unwrap();
        // Past the end: a short write, then EFBIG.
        f.seek(SeekFrom::Start(5990)).unwrap();
        assert_eq!(f.write(&[9u8; 100]).unwrap(), 10);
        assert_eq!(f.write(&[9u8; 1]).unwrap_err().raw_os_error(), Some(libc::EFBIG));
        drop(f);
        let img = std::fs::read(&image).unwrap();
        assert_eq!(&img[65536 + 4000..65536 + 4096], &[7u8; 96][..]);
        assert_eq!(&img[8192..8192 + 104], &[7u8; 104][..]);
        assert_eq!(&img[8192 + 1894..8192 + 1904], &[9u8; 10][..]);
        assert_eq!(img[8192 + 1904], 0xAA, "nothing past the file's end");
        assert_eq!(img[65536 + 3999], 0xAA);
        let mut back = Vec::new();
        std::fs::File::open(&path).unwrap().read_to_end(&mut back).unwrap();
        assert_eq!(back.len(), 6000);
        assert_eq!(&back[4000..4200], &[7u8; 200][..]);

        // `>` truncates: the size stays, the old bytes read as zeros.
        std::fs::write(&path, b"result\n").unwrap();
        let back = std::fs::read(&path).unwrap();
        assert_eq!(back.len(), 6000);
        assert_eq!(&back[..7], b"result\n");
        assert!(back[7..].iter().all(|&b| b == 0));
        assert_eq!(std::fs::OpenOptions::new().append(true).open(&path).unwrap_err().raw_os_error(), Some(libc::EFBIG));
        let e = std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(7000).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFBIG));

        files.remove(ino);
        assert!(std::fs::metadata(&path).is_err(), "gone once its container stops");
        drop(files);
        assert!(!dir.path().join("mnt").exists());
    }
}
