// SPDX-License-Identifier: Apache-2.0
//! The FUSE side: [`KvFs`] answers the kernel's requests with [`KvDir`]'s operations, and
//! [`KvMount`] mounts it and takes it down again.

use crate::dir::{Attr, KvDir};
use fuser::{
    FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    Request, TimeOrNow,
};
use insitu_kvstore::KvStore;
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Entries and attributes are never cached by the kernel: hosts change the store over the
/// fabric behind this file system's back, and a cached size or name would go stale.
const TTL: Duration = Duration::ZERO;
/// `FOPEN_DIRECT_IO`: no page cache either, for the same reason.
const FOPEN_DIRECT_IO: u32 = 1;
/// What `statfs` reports as the block size.
const BLOCK: u64 = 4096;

/// The FUSE file system of a store's keys.
pub struct KvFs {
    dir: KvDir,
}

impl KvFs {
    /// Serves `store`.
    pub fn new(store: Arc<KvStore>) -> KvFs {
        KvFs { dir: KvDir::new(store) }
    }
}

/// `stat` of an inode. Anyone may read and write: every process of a container on the
/// target is meant to use the store (and the mount allows other users for that).
fn file_attr(a: Attr) -> FileAttr {
    let now = SystemTime::now();
    let (kind, perm, nlink) = if a.dir { (FileType::Directory, 0o777, 2) } else { (FileType::RegularFile, 0o666, 1) };
    FileAttr {
        ino: a.ino,
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: BLOCK as u32,
        flags: 0,
    }
}

impl Filesystem for KvFs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        match self.dir.lookup(parent, name) {
            Ok(a) => reply.entry(&TTL, &file_attr(a), 0),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.dir.getattr(ino) {
            Ok(a) => reply.attr(&TTL, &file_attr(a)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        // Only the size means anything to a key; modes, owners and times are accepted and
        // ignored (so `touch` and `cp -p` work), as on file systems without them.
        let result = match size {
            Some(size) => self.dir.set_size(ino, fh, size),
            None => self.dir.getattr(ino),
        };
        match result {
            Ok(a) => reply.attr(&TTL, &file_attr(a)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        match self.dir.open(ino, flags) {
            Ok(fh) => reply.opened(fh, FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn create(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, mode: u32, _umask: u32, flags: i32, reply: ReplyCreate) {
        if mode & libc::S_IFMT != libc::S_IFREG && mode & libc::S_IFMT != 0 {
            return reply.error(libc::EPERM);
        }
        match self.dir.create(parent, name, flags) {
            Ok((a, fh)) => reply.created(&TTL, &file_attr(a), 0, fh, FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, offset: i64, size: u32, _flags: i32, _lock: Option<u64>, reply: ReplyData) {
        let Ok(offset) = u64::try_from(offset) else { return reply.error(libc::EINVAL) };
        match self.dir.read(fh, offset, size as usize) {
            Ok(d) => reply.data(d),
            Err(e) => reply.error(e),
        }
    }

    fn write(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, offset: i64, data: &[u8], _wf: u32, _flags: i32, _lock: Option<u64>, reply: ReplyWrite) {
        let Ok(offset) = u64::try_from(offset) else { return reply.error(libc::EINVAL) };
        match self.dir.write(fh, offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _lock: u64, reply: ReplyEmpty) {
        match self.dir.flush(fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _datasync: bool, reply: ReplyEmpty) {
        match self.dir.flush(fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _flags: i32, _lock: Option<u64>, _flush: bool, reply: ReplyEmpty) {
        match self.dir.release(fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        match self.dir.unlink(parent, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(&mut self, _req: &Request<'_>, _parent: u64, _name: &OsStr, _newparent: u64, _newname: &OsStr, _flags: u32, reply: ReplyEmpty) {
        // The store has no atomic rename; EXDEV makes `mv` copy and delete instead, which
        // is what a rename here could only be anyway.
        reply.error(libc::EXDEV);
    }

    fn opendir(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        match self.dir.opendir(ino) {
            Ok(fh) => reply.opened(fh, 0),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, offset: i64, mut reply: ReplyDirectory) {
        let start = usize::try_from(offset).unwrap_or(0);
        match self.dir.readdir(fh, start) {
            Ok(entries) => {
                for (i, e) in entries.iter().enumerate() {
                    let kind = if e.dir { FileType::Directory } else { FileType::RegularFile };
                    // The offset of an entry is where the next readdir resumes.
                    if reply.add(e.ino, (start + i + 1) as i64, kind, &e.name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _flags: i32, reply: ReplyEmpty) {
        self.dir.releasedir(fh);
        reply.ok();
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        // The store's capacity; what is free is not known without walking it, so `df`
        // shows the size only. Names are at most 34 bytes (`0x` and 16 bytes in hex).
        let blocks = self.dir.store().capacity() / BLOCK;
        let files = self.dir.store().len().unwrap_or(0);
        reply.statfs(blocks, 0, 0, files, 0, BLOCK as u32, 34, BLOCK as u32);
    }
}

/// Why the key directory could not be mounted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MountError {
    /// The mount point could not be made.
    #[error("cannot create the KV store's mount point {dir}: {source}")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The kernel refused the FUSE mount.
    #[error("cannot mount the KV store's FUSE file system at {dir}: {source} (the target needs root and /dev/fuse: `modprobe fuse`)")]
    Mount {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// The key directory mounted at a path, served by a background thread. Dropping it
/// unmounts (lazily: nothing that still holds it blocks the target's stop) and removes the
/// directory.
pub struct KvMount {
    dir: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

impl std::fmt::Debug for KvMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvMount").field("dir", &self.dir).finish()
    }
}

impl KvMount {
    /// Mounts `store`'s keys at `dir` (created if missing). A mount left there by a target
    /// that was killed is detached first.
    pub fn mount(store: Arc<KvStore>, dir: &Path) -> Result<KvMount, MountError> {
        detach(dir);
        std::fs::create_dir_all(dir).map_err(|source| MountError::Dir { dir: dir.into(), source })?;
        let options = [
            MountOption::FSName("insitu-kv".into()),
            MountOption::Subtype("insitu-kv".into()),
            // Container processes of any user id reach it; the mount point itself stays
            // where only the target's root can see it until a container binds it.
            MountOption::AllowOther,
            MountOption::NoExec,
            MountOption::NoDev,
            MountOption::NoSuid,
            MountOption::RW,
        ];
        let session = fuser::spawn_mount2(KvFs::new(store), dir, &options).map_err(|source| MountError::Mount { dir: dir.into(), source })?;
        Ok(KvMount { dir: dir.into(), session: Some(session) })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for KvMount {
    fn drop(&mut self) {
        detach(&self.dir);
        // The session's own unmount finds nothing mounted and stops; its thread ends when
        // the kernel closes the connection.
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
    use crate::dir::ROOT;

    #[test]
    fn attributes_let_everyone_read_and_write() {
        let f = file_attr(Attr { ino: 7, size: 1000, dir: false });
        assert_eq!((f.kind, f.perm, f.size, f.blocks), (FileType::RegularFile, 0o666, 1000, 2));
        let d = file_attr(Attr { ino: ROOT, size: 0, dir: true });
        assert_eq!((d.kind, d.nlink), (FileType::Directory, 2));
    }

    /// Through a real mount, when the test runs as root with /dev/fuse (skipped otherwise).
    #[test]
    fn mounted_directory_behaves_like_files() {
        // SAFETY: geteuid has no arguments.
        if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
            eprintln!("skipped: needs root and /dev/fuse");
            return;
        }
        use insitu_proto::kv::{Key, StoreMode};
        let store = Arc::new(KvStore::in_memory(1 << 30).unwrap().with_max_value(64));
        let base = std::env::temp_dir().join(format!("insitu-kvfs-test-{}", std::process::id()));
        let m = KvMount::mount(store.clone(), &base).unwrap();
        let p = |n: &str| m.path().join(n);
        std::fs::write(p("greeting"), b"hello").unwrap();
        assert_eq!(store.retrieve(&Key::new(b"greeting").unwrap()).unwrap(), b"hello", "stored when close returned");
        assert_eq!(std::fs::read(p("greeting")).unwrap(), b"hello");
        store.store(&Key::new(b"\x01host").unwrap(), b"v1", StoreMode::Upsert).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(m.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names, ["0x01686f7374", "greeting"]);
        assert_eq!(std::fs::read(p("0x01686f7374")).unwrap(), b"v1");
        assert_eq!(std::fs::metadata(p("greeting")).unwrap().len(), 5);
        let e = std::fs::write(p("seventeen-bytes-x"), b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG));
        let e = std::fs::write(p("big"), vec![1u8; 65]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFBIG));
        std::fs::remove_file(p("greeting")).unwrap();
        assert!(!store.exists(&Key::new(b"greeting").unwrap()).unwrap());
        assert_eq!(std::fs::read(p("greeting")).unwrap_err().kind(), std::io::ErrorKind::NotFound);
        drop(m);
        assert!(!base.exists(), "the mount point is removed");
    }
}
