// SPDX-License-Identifier: Apache-2.0
//! A FUSE file system with one file, `disk`, whose bytes are a remote namespace: reads and
//! writes become NVMe Read and Write commands, `fsync` becomes Flush. A loop device over
//! that file gives the host an ordinary block device.
//!
//! Requests are answered from a small thread pool so the loop device can keep several in
//! flight. The file is opened with direct I/O: the kernel caches nothing here, so data the
//! target changes (EXEC outputs) is never served stale from this layer.

use insitu_initiator::Session;
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{FileAttr, FileType, Filesystem, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request};

/// Name of the one file.
pub const DISK: &str = "disk";
const ROOT: u64 = 1;
const DISK_INO: u64 = 2;
const TTL: Duration = Duration::from_secs(3600);
/// `FOPEN_DIRECT_IO`: bypass the page cache for this file.
const FOPEN_DIRECT_IO: u32 = 1;

/// The file system.
pub struct DiskFs {
    session: Arc<Session>,
    nsid: u32,
    lba: u64,
    size: u64,
    pool: crossbeam_channel::Sender<Box<dyn FnOnce() + Send>>,
}

impl DiskFs {
    /// Serves namespace `nsid` (of `size` bytes, `lba`-byte blocks) of `session`.
    pub fn new(session: Arc<Session>, nsid: u32, lba: u32, size: u64, threads: usize) -> DiskFs {
        let (tx, rx) = crossbeam_channel::unbounded::<Box<dyn FnOnce() + Send>>();
        for _ in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::spawn(move || {
                for job in rx {
                    job();
                }
            });
        }
        DiskFs { session, nsid, lba: u64::from(lba), size, pool: tx }
    }

    fn attr(&self, ino: u64) -> FileAttr {
        let now = SystemTime::now();
        let (kind, perm, size, nlink) = if ino == ROOT { (FileType::Directory, 0o755, 0, 2) } else { (FileType::RegularFile, 0o600, self.size, 1) };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
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
            blksize: self.lba as u32,
            flags: 0,
        }
    }

    fn run(&self, job: impl FnOnce() + Send + 'static) {
        let _ = self.pool.send(Box::new(job));
    }
}

/// Reads `len` bytes at byte `offset` of the namespace, whatever their alignment.
fn read_bytes(s: &Session, nsid: u32, lba: u64, offset: u64, len: usize) -> Result<Vec<u8>, libc::c_int> {
    let first = offset / lba;
    let last = (offset + len as u64).div_ceil(lba);
    let data = s.read(nsid, first, (last - first) as u32).map_err(|_| libc::EIO)?;
    let skip = (offset - first * lba) as usize;
    Ok(data[skip..skip + len].to_vec())
}

/// Writes bytes at any byte offset, reading the partial blocks at either end first.
fn write_bytes(s: &Session, nsid: u32, lba: u64, offset: u64, data: &[u8]) -> Result<(), libc::c_int> {
    let first = offset / lba;
    let last = (offset + data.len() as u64).div_ceil(lba);
    let skip = (offset - first * lba) as usize;
    if skip == 0 && (data.len() as u64).is_multiple_of(lba) {
        return s.write(nsid, first, data).map_err(|_| libc::EIO);
    }
    let mut buf = s.read(nsid, first, (last - first) as u32).map_err(|_| libc::EIO)?;
    buf[skip..skip + data.len()].copy_from_slice(data);
    s.write(nsid, first, &buf).map_err(|_| libc::EIO)
}

impl Filesystem for DiskFs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT && name == DISK {
            reply.entry(&TTL, &self.attr(DISK_INO), 0);
        } else {
            reply.error(libc::ENOENT);
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match ino {
            ROOT | DISK_INO => reply.attr(&TTL, &self.attr(ino)),
            _ => reply.error(libc::ENOENT),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        if ino == DISK_INO {
            reply.opened(0, FOPEN_DIRECT_IO);
        } else {
            reply.error(libc::EISDIR);
        }
    }

    fn read(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, offset: i64, size: u32, _flags: i32, _lock: Option<u64>, reply: ReplyData) {
        let Ok(offset) = u64::try_from(offset) else { return reply.error(libc::EINVAL) };
        if ino != DISK_INO {
            return reply.error(libc::EISDIR);
        }
        let len = (size as u64).min(self.size.saturating_sub(offset)) as usize;
        if len == 0 {
            return reply.data(&[]);
        }
        let (s, nsid, lba) = (self.session.clone(), self.nsid, self.lba);
        self.run(move || match read_bytes(&s, nsid, lba, offset, len) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        });
    }

    fn write(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, offset: i64, data: &[u8], _wf: u32, _flags: i32, _lock: Option<u64>, reply: ReplyWrite) {
        let Ok(offset) = u64::try_from(offset) else { return reply.error(libc::EINVAL) };
        if ino != DISK_INO {
            return reply.error(libc::EISDIR);
        }
        if offset.checked_add(data.len() as u64).is_none_or(|e| e > self.size) {
            return reply.error(libc::ENOSPC);
        }
        let (s, nsid, lba, data) = (self.session.clone(), self.nsid, self.lba, data.to_vec());
        self.run(move || match write_bytes(&s, nsid, lba, offset, &data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        });
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock: u64, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _datasync: bool, reply: ReplyEmpty) {
        let (s, nsid) = (self.session.clone(), self.nsid);
        self.run(move || match s.flush(nsid) {
            Ok(()) => reply.ok(),
            Err(_) => reply.error(libc::EIO),
        });
    }

    fn readdir(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, offset: i64, mut reply: ReplyDirectory) {
        if ino != ROOT {
            return reply.error(libc::ENOTDIR);
        }
        let entries = [(ROOT, FileType::Directory, "."), (ROOT, FileType::Directory, ".."), (DISK_INO, FileType::RegularFile, DISK)];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset.max(0) as usize) {
            if reply.add(*ino, (i + 1) as i64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}
